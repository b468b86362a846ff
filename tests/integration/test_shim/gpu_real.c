/*
 * libkgpu-limit.so in front of a real NVIDIA driver, as real CUDA programs
 * use it (scripts/gpu-check.sh; docs/shim.md, "On a real GPU"). No CUDA
 * compiler is needed: the kernels are PTX (gpu_kernels.h), which the driver
 * compiles when the module is loaded. Compute shares are gpu_share.c's.
 *
 *   shim_gpu_real                  everything, as the orchestrator: reads
 *                                  GPU 0's UUID, writes limits files, runs
 *                                  each check below in a child with the
 *                                  library preloaded; prints figures and
 *                                  FAIL lines; exits 0, 1 (failures) or 77
 *                                  (no driver or GPU)
 *   shim_gpu_real memory|pool|vmm  one memory route (library preloaded)
 *   shim_gpu_real hold MIB SECONDS [spin]
 *                                  allocates MIB and holds it, busy or idle
 *                                  (for shim_gpu_watch)
 *
 * The share for the memory routes is KGPU_GPU_CHECK_MIB (default 2048);
 * KGPU_GPU_CHECK_LIB names the library where the build folder was moved.
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadecl.h"
#include "gpu_kernels.h"

#define MIB ((size_t)1024 * 1024)

typedef struct CUevent_st *CUevent;

/* The driver API's structures in full: the driver reads every field. */
typedef struct {
    int type; /* CU_MEM_ALLOCATION_TYPE_PINNED */
    int requested_handle_types;
    struct {
        int type, id;
    } location;
    void *win32_handle_meta_data;
    struct {
        unsigned char compression_type, gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
} mem_prop;

typedef struct {
    struct {
        int type, id;
    } location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
} mem_access;

#define ALLOCATION_TYPE_PINNED 1
#define ACCESS_READWRITE       3
#define GRANULARITY_MINIMUM    0


/* The driver functions used, found as a program that dlopens the driver finds them. */
typedef struct api {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*attribute)(int *, int, CUdevice);
    CUresult (*uuid)(CUuuid *, CUdevice);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*sync)(void);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_sync)(CUstream);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_sync)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*pool_set)(CUmemoryPool, int, void *);
    CUresult (*pool_get)(CUmemoryPool, int, void *);
    CUresult (*pool_trim)(CUmemoryPool, size_t);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*granularity)(size_t *, const mem_prop *, int);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const mem_prop *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const mem_access *, size_t);
} api;

static api A;
static CUdevice dev;
static CUfunction fill_fn, spin_fn;
static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* -1: no driver; -2: a driver without a function used here (said on stdout). */
static int load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    static const struct {
        const char *name;
        size_t off;
    } syms[] = {
#define S(field, name) {name, offsetof(api, field)}
        S(init, "cuInit"),
        S(device_get, "cuDeviceGet"),
        S(attribute, "cuDeviceGetAttribute"),
        S(uuid, "cuDeviceGetUuid"),
        S(retain, "cuDevicePrimaryCtxRetain"),
        S(set_current, "cuCtxSetCurrent"),
        S(sync, "cuCtxSynchronize"),
        S(info, "cuMemGetInfo_v2"),
        S(alloc, "cuMemAlloc_v2"),
        S(free, "cuMemFree_v2"),
        S(dtoh, "cuMemcpyDtoH_v2"),
        S(module_load, "cuModuleLoadData"),
        S(get_function, "cuModuleGetFunction"),
        S(launch, "cuLaunchKernel"),
        S(stream_create, "cuStreamCreate"),
        S(stream_sync, "cuStreamSynchronize"),
        S(event_create, "cuEventCreate"),
        S(event_record, "cuEventRecord"),
        S(event_sync, "cuEventSynchronize"),
        S(event_elapsed, "cuEventElapsedTime"),
        S(default_pool, "cuDeviceGetDefaultMemPool"),
        S(pool_set, "cuMemPoolSetAttribute"),
        S(pool_get, "cuMemPoolGetAttribute"),
        S(pool_trim, "cuMemPoolTrimTo"),
        S(alloc_async, "cuMemAllocAsync"),
        S(free_async, "cuMemFreeAsync"),
        S(granularity, "cuMemGetAllocationGranularity"),
        S(create, "cuMemCreate"),
        S(release, "cuMemRelease"),
        S(reserve, "cuMemAddressReserve"),
        S(address_free, "cuMemAddressFree"),
        S(map, "cuMemMap"),
        S(unmap, "cuMemUnmap"),
        S(set_access, "cuMemSetAccess"),
#undef S
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *p = dlsym(h, syms[i].name);
        if (p == NULL) {
            printf("FAIL: the driver lacks %s (CUDA 11.2 or newer is needed)\n", syms[i].name);
            return -2;
        }
        memcpy((char *)&A + syms[i].off, &p, sizeof(p));
    }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Driver, context and the PTX module; 0 when all worked. */
static int setup(void)
{
    CUcontext ctx;
    CUmodule mod;
    CUresult r;
    if (load() != 0)
        return -1;
    if ((r = A.init(0)) != CUDA_SUCCESS || (r = A.device_get(&dev, 0)) != CUDA_SUCCESS ||
        (r = A.retain(&ctx, dev)) != CUDA_SUCCESS || (r = A.set_current(ctx)) != CUDA_SUCCESS) {
        printf("FAIL: the driver's context: %d\n", r);
        return -1;
    }
    if ((r = A.module_load(&mod, kgpu_gpu_ptx)) != CUDA_SUCCESS ||
        (r = A.get_function(&fill_fn, mod, "kgpu_fill")) != CUDA_SUCCESS ||
        (r = A.get_function(&spin_fn, mod, "kgpu_spin")) != CUDA_SUCCESS) {
        printf("FAIL: loading the PTX kernels: %d\n", r);
        return -1;
    }
    return 0;
}

static size_t free_mib(void)
{
    size_t f = 0, t = 0;
    A.info(&f, &t);
    return f / MIB;
}

/* Fills the last GiB (at most) of [p, p + bytes): the end of the block is what was granted. */
static CUresult fill(CUdeviceptr p, size_t bytes, unsigned value, CUstream s)
{
    size_t chunk = bytes < 1024 * MIB ? bytes : 1024 * MIB;
    CUdeviceptr at = p + bytes - chunk;
    unsigned n = (unsigned)(chunk / 4);
    void *args[] = {&at, &n, &value};
    return A.launch(fill_fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL);
}

/* Whether the last word of [p, p + bytes) holds value (the kernel reached the end). */
static int filled(CUdeviceptr p, size_t bytes, unsigned value)
{
    unsigned got = 0;
    return A.sync() == CUDA_SUCCESS && A.dtoh(&got, p + bytes - 4, 4) == CUDA_SUCCESS &&
           got == value;
}

/* ---- the memory routes, each in a process of its own with the library preloaded ---- */

static int cmd_memory(void)
{
    size_t share = 0, f = 0;
    A.info(&f, &share);
    printf("memory: share shown %zu MiB, free %zu MiB after the context and the module\n",
           share / MIB, f / MIB);
    size_t within = f - 64 * MIB;
    CUdeviceptr p = 0, q = 0;
    CUresult r = A.alloc(&p, within);
    CHECK(r == CUDA_SUCCESS, "cuMemAlloc of %zu MiB within the share: %d", within / MIB, r);
    if (r == CUDA_SUCCESS) {
        CHECK(fill(p, within, 0x6b677075, NULL) == CUDA_SUCCESS, "the fill kernel's launch");
        CHECK(filled(p, within, 0x6b677075), "the fill kernel did not write the whole block");
        printf("memory: a kernel wrote to the end of the %zu MiB within the share\n",
               within / MIB);
    }
    r = A.alloc(&q, 128 * MIB);
    printf("memory: cuMemAlloc 128 MiB past the share = %d\n", r);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc past the share returned %d", r);
    CUstream s;
    A.stream_create(&s, 0);
    r = A.alloc_async(&q, 128 * MIB, s);
    printf("memory: cuMemAllocAsync 128 MiB past the share = %d\n", r);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocAsync past the share returned %d", r);
    if (r == CUDA_SUCCESS)
        A.free_async(q, s);
    if (p != 0)
        CHECK(A.free(p) == CUDA_SUCCESS, "cuMemFree");
    CHECK(free_mib() + 64 >= f / MIB, "the free gave back %zu of %zu MiB", free_mib(), f / MIB);
    return failures != 0;
}

static int cmd_pool(void)
{
    CUmemoryPool pool;
    CUstream s;
    cuuint64_t keep = UINT64_MAX, reserved = 0;
    CUresult r = A.default_pool(&pool, dev);
    CHECK(r == CUDA_SUCCESS, "cuDeviceGetDefaultMemPool: %d", r);
    if (r != CUDA_SUCCESS)
        return 1;
    A.stream_create(&s, 0);
    /* As PyTorch's cudaMallocAsync backend does: the pool keeps what is freed. */
    CHECK(A.pool_set(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) == CUDA_SUCCESS,
          "raising the release threshold");
    size_t before = free_mib(), half = before / 2;
    CUdeviceptr p = 0, q = 0;
    r = A.alloc_async(&p, half * MIB, s);
    CHECK(r == CUDA_SUCCESS, "cuMemAllocAsync %zu MiB within the share: %d", half, r);
    if (r == CUDA_SUCCESS) {
        fill(p, half * MIB, 7, s);
        A.free_async(p, s);
    }
    A.stream_sync(s);
    A.pool_get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    size_t kept = free_mib();
    printf("pool: free %zu MiB, then %zu MiB after a %zu MiB pool allocation was freed "
           "(the pool reserves %llu MiB)\n",
           before, kept, half, (unsigned long long)reserved / MIB);
    CHECK(before - kept + 8 >= half, "memory the pool keeps is not counted (%zu -> %zu MiB)",
          before, kept);
    r = A.alloc(&q, (kept + 64) * MIB);
    printf("pool: cuMemAlloc %zu MiB, past what the pool leaves = %d\n", kept + 64, r);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "past what the pool leaves: %d", r);
    if (r == CUDA_SUCCESS)
        A.free(q);
    A.pool_trim(pool, 0);
    size_t trimmed = free_mib();
    printf("pool: free %zu MiB after cuMemPoolTrimTo(0)\n", trimmed);
    CHECK(trimmed + 64 >= before, "trimming gave back only %zu of %zu MiB", trimmed, before);
    return failures != 0;
}

static int cmd_vmm(void)
{
    mem_prop prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CUresult r = A.granularity(&gran, &prop, GRANULARITY_MINIMUM);
    CHECK(r == CUDA_SUCCESS && gran > 0, "cuMemGetAllocationGranularity: %d", r);
    if (r != CUDA_SUCCESS || gran == 0)
        return 1;
    size_t before = free_mib(), size = (before / 2) * MIB / gran * gran;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr va = 0;
    r = A.create(&h, size, &prop, 0);
    CHECK(r == CUDA_SUCCESS, "cuMemCreate %zu MiB: %d", size / MIB, r);
    if (r != CUDA_SUCCESS)
        return 1;
    mem_access acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, ACCESS_READWRITE};
    CHECK((r = A.reserve(&va, size, 0, 0, 0)) == CUDA_SUCCESS, "cuMemAddressReserve: %d", r);
    CHECK((r = A.map(va, size, 0, h, 0)) == CUDA_SUCCESS, "cuMemMap: %d", r);
    CHECK((r = A.set_access(va, size, &acc, 1)) == CUDA_SUCCESS, "cuMemSetAccess: %d", r);
    /* Released while mapped: the driver keeps the memory, so the share must too. */
    CHECK(A.release(h) == CUDA_SUCCESS, "cuMemRelease");
    size_t released = free_mib();
    CHECK(fill(va, size, 9, NULL) == CUDA_SUCCESS && filled(va, size, 9),
          "the released, still mapped memory is not usable");
    printf("vmm: free %zu MiB, then %zu MiB with %zu MiB mapped after cuMemRelease\n", before,
           released, size / MIB);
    CHECK(before - released + 8 >= size / MIB, "released but mapped memory is not counted");
    r = A.create(&h2, (released + 64) * MIB / gran * gran + gran, &prop, 0);
    printf("vmm: cuMemCreate past what is left = %d\n", r);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate past the share: %d", r);
    if (r == CUDA_SUCCESS)
        A.release(h2);
    CHECK(A.unmap(va, size) == CUDA_SUCCESS, "cuMemUnmap");
    A.address_free(va, size);
    size_t after = free_mib();
    printf("vmm: free %zu MiB after cuMemUnmap\n", after);
    CHECK(after + 8 >= before, "the unmap gave back only %zu of %zu MiB", after, before);
    return failures != 0;
}

/* ---- a process that holds memory, busy or idle (for shim_gpu_watch) ---- */

#define SPIN_BLOCKS_PER_SM 4
#define SPIN_THREADS       256

static int grid_of(void)
{
    int sms = 0;
    A.attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    return (sms > 0 ? sms : 1) * SPIN_BLOCKS_PER_SM;
}

static int cmd_hold(size_t mib, int seconds, int spin)
{
    CUdeviceptr p = 0, out = 0;
    CUresult r = A.alloc(&p, mib * MIB);
    printf("hold: cuMemAlloc %zu MiB = %d\n", mib, r);
    if (r != CUDA_SUCCESS)
        return 1;
    fill(p, mib * MIB, 1, NULL);
    A.sync();
    printf("holding\n");
    fflush(stdout);
    unsigned iters = 20000, grid = (unsigned)grid_of();
    A.alloc(&out, (size_t)grid * SPIN_THREADS * 4);
    void *args[] = {&out, &iters};
    uint64_t end = now_ns() + (uint64_t)seconds * 1000000000ULL;
    while (now_ns() < end) {
        if (spin) {
            A.launch(spin_fn, grid, 1, 1, SPIN_THREADS, 1, 1, 0, NULL, args, NULL);
            A.sync();
        } else {
            usleep(100000);
        }
    }
    return 0;
}

/* ---- the orchestrator ---- */

static char tmpdir[] = "/tmp/kgpu-gpu-real-XXXXXX";
static char uuid[64];

static int write_limits(const char *name, unsigned long long mib, int core)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.limits", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "# kgpu limits v1\ndevice 0 uuid=%s memory_mib=%llu core_pct=%d\n", uuid, mib,
            core);
    return fclose(f);
}

/*
 * Runs this program with `args` as container `name` (its limits file, the
 * shared accounting and schedule directories), the library preloaded unless
 * `name` is NULL; its output goes to `out` (a file). Returns the pid.
 */
static pid_t start(const char *self, const char *name, const char *out, char *const args[])
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    char path[256];
    if (name != NULL) {
        snprintf(path, sizeof(path), "%s/%s.limits", tmpdir, name);
        setenv("KGPU_LIMITS_FILE", path, 1);
        snprintf(path, sizeof(path), "%s/shared", tmpdir);
        setenv("KGPU_SHARED_DIR", path, 1);
        snprintf(path, sizeof(path), "%s/sched", tmpdir);
        setenv("KGPU_SCHED_DIR", path, 1);
        setenv("KGPU_CONTAINER", name, 1);
        /* KGPU_GPU_CHECK_LIB: the library where a build folder was moved (gpu-check.sh). */
        const char *lib = getenv("KGPU_GPU_CHECK_LIB");
        setenv("LD_PRELOAD", lib != NULL ? lib : KGPU_SHIM_LIB, 1);
    }
    if (out != NULL && freopen(out, "w", stdout) == NULL)
        _exit(127);
    char *argv[8] = {(char *)self};
    for (int i = 0; args[i] != NULL && i < 6; i++)
        argv[i + 1] = args[i];
    execv(self, argv);
    _exit(127);
}

static int finish(pid_t pid)
{
    int st;
    if (waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* One memory route in a child; its lines are printed as they are. */
static void route(const char *self, const char *cmd, unsigned long long mib)
{
    char name[32];
    snprintf(name, sizeof(name), "mem-%s", cmd);
    write_limits(name, mib, 100);
    char *args[] = {(char *)cmd, NULL};
    int rc = finish(start(self, name, NULL, args));
    printf("%s: %s\n", cmd, rc == 0 ? "ok" : "FAILED");
    failures += rc != 0;
}

static int orchestrate(const char *self)
{
    int loaded = load();
    if (loaded == -2)
        return 1;
    if (loaded != 0) {
        printf("skipped: no CUDA driver or GPU here\n");
        return 77;
    }
    int first = kgpu_gpu_first(A.init, A.device_get, A.uuid, &dev, uuid, sizeof(uuid));
    if (first != 0)
        return first;
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    char path[300];
    snprintf(path, sizeof(path), "%s/shared", tmpdir);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/sched", tmpdir);
    mkdir(path, 0700);
    const char *m = getenv("KGPU_GPU_CHECK_MIB");
    unsigned long long mib = m != NULL ? strtoull(m, NULL, 10) : 2048;
    if (mib < 1024)
        mib = 1024; /* the context, the module and something to allocate */
    printf("GPU 0: %s; memory share %llu MiB\n", uuid, mib);

    route(self, "memory", mib);
    route(self, "pool", mib);
    route(self, "vmm", mib);

    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return orchestrate("/proc/self/exe");
    if (setup() != 0)
        return 1;
    if (strcmp(argv[1], "memory") == 0)
        return cmd_memory();
    if (strcmp(argv[1], "pool") == 0)
        return cmd_pool();
    if (strcmp(argv[1], "vmm") == 0)
        return cmd_vmm();
    if (strcmp(argv[1], "hold") == 0 && argc >= 4)
        return cmd_hold(strtoull(argv[2], NULL, 10), atoi(argv[3]),
                        argc >= 5 && strcmp(argv[4], "spin") == 0);
    fprintf(stderr,
            "usage: shim_gpu_real [memory|pool|vmm|hold MIB SECONDS [spin]]\n");
    return 2;
}
