/*
 * libkgpu-limit.so in front of the real driver, on a machine with an
 * NVIDIA GPU (CTest label "gpu"). First, without the library, it reads
 * GPU 0's UUID and writes a limits file giving that GPU KGPU_GPU_CHECK_MIB
 * MiB (default 1024); then it runs itself again with the library preloaded
 * and checks that cuMemGetInfo shows the share, that an allocation within
 * it succeeds and one past it fails with CUDA_ERROR_OUT_OF_MEMORY, through
 * dlsym and through cuGetProcAddress, and that a free gives it back. It
 * prints what the library charged for the context (measured across its
 * creation) next to what NVML counts for this process, with the context
 * alone and with the share full: NVML must not count more than the share
 * (plus 64 MiB of rounding), or the node's watcher would take a container
 * using its whole share for one over it.
 * Exits 77 (skipped) without a driver or a GPU.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadecl.h"

#define MIB (1024ULL * 1024ULL)

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct api {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*uuid)(CUuuid *, CUdevice);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*proc)(const char *, void **, int, cuuint64_t);
} api;

static int load(api *a)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    *(void **)&a->init = dlsym(h, "cuInit");
    *(void **)&a->device_get = dlsym(h, "cuDeviceGet");
    *(void **)&a->uuid = dlsym(h, "cuDeviceGetUuid");
    *(void **)&a->retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&a->set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&a->info = dlsym(h, "cuMemGetInfo_v2");
    *(void **)&a->alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&a->free = dlsym(h, "cuMemFree_v2");
    *(void **)&a->proc = dlsym(h, "cuGetProcAddress");
    return a->init && a->device_get && a->uuid && a->retain && a->set_current && a->info &&
                   a->alloc && a->free
               ? 0
               : -1;
}

static int phase1(const char *self, unsigned long long mib)
{
    api a;
    CUdevice dev;
    CUuuid u;
    if (load(&a) != 0 || a.init(0) != CUDA_SUCCESS || a.device_get(&dev, 0) != CUDA_SUCCESS) {
        printf("skipped: no CUDA driver or GPU here\n");
        return 77;
    }
    struct stat st;
    if (lstat("/etc/kgpu/limits", &st) == 0) {
        printf("skipped: /etc/kgpu/limits exists, so KGPU_LIMITS_FILE would be ignored\n");
        return 77;
    }
    if (a.uuid(&u, dev) != CUDA_SUCCESS) {
        printf("FAIL: cuDeviceGetUuid\n");
        return 1;
    }
    char dir[] = "/tmp/kgpu-gpu-check-XXXXXX", path[128], shared[128];
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(path, sizeof(path), "%s/limits", dir);
    snprintf(shared, sizeof(shared), "%s/shared", dir);
    mkdir(shared, 0700);
    const unsigned char *b = (const unsigned char *)u.bytes;
    FILE *f = fopen(path, "w");
    fprintf(f,
            "# kgpu limits v1\ndevice 0 uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x memory_mib=%llu core_pct=100\n",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
            b[14], b[15], mib);
    fclose(f);
    printf("limit: GPU 0 gets %llu MiB\n", mib);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* KGPU_GPU_CHECK_LIB: the library where a build folder was moved (gpu-check.sh). */
        const char *lib = getenv("KGPU_GPU_CHECK_LIB");
        setenv("LD_PRELOAD", lib != NULL ? lib : KGPU_SHIM_LIB, 1);
        setenv("KGPU_LIMITS_FILE", path, 1);
        setenv("KGPU_SHARED_DIR", shared, 1);
        setenv("KGPU_CONTAINER", "gpu-check", 1);
        setenv("KGPU_GPU_CHECK_PHASE", "2", 1);
        execl(self, self, (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    char acct[160];
    snprintf(acct, sizeof(acct), "%s/gpu-check.acct", shared);
    unlink(acct);
    rmdir(shared);
    unlink(path);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/*
 * What NVML counts for this process on GPU `uuid` in bytes; -1 when NVML
 * is not there or does not list this process (another PID namespace).
 */
static long long nvml_own_usage(const char *uuid)
{
    typedef struct {
        unsigned int pid;
        unsigned long long used;
        unsigned int gi, ci;
    } proc_v3;
    static void *h;
    static int (*by_uuid)(const char *, void **);
    static int (*procs)(void *, unsigned int *, proc_v3 *);
    if (h == NULL) {
        int (*init)(void);
        if ((h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) == NULL)
            return -1;
        *(void **)&init = dlsym(h, "nvmlInit_v2");
        *(void **)&by_uuid = dlsym(h, "nvmlDeviceGetHandleByUUID");
        *(void **)&procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
        if (init == NULL || by_uuid == NULL || procs == NULL || init() != 0) {
            procs = NULL;
            return -1;
        }
    }
    void *dev;
    proc_v3 list[256];
    unsigned int n = 256;
    if (procs == NULL || by_uuid(uuid, &dev) != 0 || procs(dev, &n, list) != 0)
        return -1;
    for (unsigned int i = 0; i < n; i++)
        if (list[i].pid == (unsigned int)getpid())
            return (long long)list[i].used;
    return -1;
}

static void show_nvml(const char *when, const char *uuid, unsigned long long charged,
                      unsigned long long limit)
{
    long long used = nvml_own_usage(uuid);
    if (used < 0) {
        printf("%s: NVML lists no process of this PID namespace: not compared\n", when);
        return;
    }
    printf("%s: the library charges %llu MiB, NVML counts %llu MiB for this process\n", when,
           charged / MIB, (unsigned long long)used / MIB);
    CHECK((unsigned long long)used <= limit + 64 * MIB,
          "%s: NVML counts %llu MiB, over the %llu MiB share: the watcher would report it", when,
          (unsigned long long)used / MIB, limit / MIB);
}

static int phase2(unsigned long long mib)
{
    api a;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p, q;
    size_t free_b = 0, total = 0;
    const unsigned long long limit = mib * MIB;
    unsigned long long ctx_charge;
    CUuuid u;
    char uuid[48] = "";
    if (load(&a) != 0) {
        printf("FAIL: cannot load the driver with the library preloaded\n");
        return 1;
    }
    CHECK(a.init(0) == CUDA_SUCCESS, "cuInit");
    CHECK(a.device_get(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
    CHECK(a.retain(&ctx, dev) == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    CHECK(a.set_current(ctx) == CUDA_SUCCESS, "cuCtxSetCurrent");
    CHECK(a.info(&free_b, &total) == CUDA_SUCCESS, "cuMemGetInfo_v2");
    printf("cuMemGetInfo: total %llu MiB, free %llu MiB\n", (unsigned long long)total / MIB,
           (unsigned long long)free_b / MIB);
    CHECK(total == limit, "total %zu, expected %llu", total, limit);
    /* Nothing is allocated yet: what the share lacks is the context's charge. */
    ctx_charge = limit - free_b;
    printf("context: charged %llu MiB (measured across its creation; 300 when it cannot be)\n",
           ctx_charge / MIB);
    CHECK(ctx_charge >= 32 * MIB && ctx_charge + 128 * MIB < limit, "context charge %llu MiB",
          ctx_charge / MIB);
    if (a.uuid(&u, dev) == CUDA_SUCCESS) {
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(uuid, sizeof(uuid),
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
        show_nvml("context alone", uuid, ctx_charge, limit);
    }

    CUresult r = a.alloc(&p, limit - ctx_charge - 64 * MIB);
    printf("cuMemAlloc_v2(%llu MiB) = %d\n", (limit - ctx_charge - 64 * MIB) / MIB, r);
    CHECK(r == CUDA_SUCCESS, "allocation within the share failed: %d", r);
    if (r == CUDA_SUCCESS && uuid[0] != '\0')
        show_nvml("share nearly full", uuid, limit - 64 * MIB, limit);
    r = a.alloc(&q, 128 * MIB);
    printf("cuMemAlloc_v2(128 MiB) past the share = %d\n", r);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "allocation past the share returned %d", r);
    if (a.proc != NULL) {
        CUresult (*alloc2)(CUdeviceptr *, size_t) = NULL;
        CHECK(a.proc("cuMemAlloc", (void **)&alloc2, 12000, 0) == CUDA_SUCCESS,
              "cuGetProcAddress(cuMemAlloc)");
        if (alloc2 != NULL) {
            r = alloc2(&q, 128 * MIB);
            printf("cuGetProcAddress route: cuMemAlloc(128 MiB) past the share = %d\n", r);
            CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "through cuGetProcAddress: %d", r);
        }
    }
    CHECK(a.free(p) == CUDA_SUCCESS, "cuMemFree_v2");
    r = a.alloc(&q, 128 * MIB);
    CHECK(r == CUDA_SUCCESS, "after the free, 128 MiB failed: %d", r);
    if (r == CUDA_SUCCESS)
        a.free(q);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}

int main(int argc, char **argv)
{
    const char *m = getenv("KGPU_GPU_CHECK_MIB");
    unsigned long long mib = m != NULL ? strtoull(m, NULL, 10) : 1024;
    if (mib < 512)
        mib = 512; /* room for the context's charge and a test allocation */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("KGPU_GPU_CHECK_PHASE") != NULL)
        return phase2(mib);
    return phase1("/proc/self/exe", mib);
}
