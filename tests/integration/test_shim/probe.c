/*
 * The program the shim tests run with libkgpu-limit.so preloaded, against
 * the fake libcuda.so.1. It links nothing CUDA (unless built with
 * PROBE_LINKED, the direct-symbol route): it dlopens libcuda.so.1 from
 * LD_LIBRARY_PATH like a runtime does, fetches the driver functions the
 * way PROBE_ROUTE says, and checks what the application sees. Built
 * without sanitizers, since it runs preloaded.
 *
 *   probe enforce   every counted call: within the share succeeds, one MiB
 *                   over fails with CUDA_ERROR_OUT_OF_MEMORY and leaves the
 *                   pool as it was; cuMemGetInfo/cuDeviceTotalMem show the
 *                   share; frees give it back
 *   probe ctx       context footprints, and memory dying with its context
 *   probe info      prints what cuInit, an allocation and cuMemGetInfo say
 *   probe nvml      NVML's memory figures show the share
 *   probe tamper    raising the limit in the region changes nothing
 *   probe fork      a forked child accounts for itself
 *   probe hold      allocates PROBE_HOLD_MIB and waits to be killed
 *   probe race      processes allocate and free at random against one
 *                   limit; some are killed; their memory comes back
 *
 * Environment: PROBE_ROUTE (dlsym | proc | proc2 | direct), PROBE_LIMIT_MIB
 * (the limit of device 0), PROBE_CTX_MIB (the charge per context, 300),
 * KGPU_SHARED_DIR and KGPU_CONTAINER (to find the region). Prints "FAIL:"
 * lines and exits 1 when something is not as expected, 0 otherwise.
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadecl.h"
#include "region.h"

#define MIB (1024ULL * 1024ULL)

typedef struct pool_st *pool_t;
typedef struct stream_st *stream_t;

/* X(name, base name for cuGetProcAddress, params) */
#define PROBE_API(X)                                                                               \
    X(cuInit, "cuInit", (unsigned int))                                                            \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))               \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", (CUdevice))                          \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                             \
    X(cuCtxCreate_v2, "cuCtxCreate", (CUcontext *, unsigned int, CUdevice))                        \
    X(cuCtxDestroy_v2, "cuCtxDestroy", (CUcontext))                                                \
    X(cuMemGetInfo_v2, "cuMemGetInfo", (size_t *, size_t *))                                       \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", (size_t *, CUdevice))                               \
    X(cuMemAlloc_v2, "cuMemAlloc", (CUdeviceptr *, size_t))                                        \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch",                                                       \
      (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                                     \
    X(cuMemAllocManaged, "cuMemAllocManaged", (CUdeviceptr *, size_t, unsigned int))               \
    X(cuMemAllocAsync, "cuMemAllocAsync", (CUdeviceptr *, size_t, stream_t))                       \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync",                                          \
      (CUdeviceptr *, size_t, pool_t, stream_t))                                                   \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", (pool_t *, CUdevice))                \
    X(cuMemFree_v2, "cuMemFree", (CUdeviceptr))                                                    \
    X(cuMemFreeAsync, "cuMemFreeAsync", (CUdeviceptr, stream_t))                                   \
    X(cuMemCreate, "cuMemCreate",                                                                  \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))   \
    X(cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle))                                \
    X(cuArrayCreate_v2, "cuArrayCreate", (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))               \
    X(cuArray3DCreate_v2, "cuArray3DCreate", (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))         \
    X(cuArrayDestroy, "cuArrayDestroy", (CUarray))                                                 \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate",                                            \
      (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))                         \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", (CUmipmappedArray))                      \
    X(fakeCudaPoolUsed, "", (int, unsigned long long *))

typedef struct api {
#define X(name, base, params) CUresult(*name) params;
    PROBE_API(X)
#undef X
} api;

#ifdef PROBE_LINKED
#define X(name, base, params) CUresult name params;
PROBE_API(X)
#undef X
#endif

static api A;
static int failures;
static uint64_t limit_bytes, ctx_bytes;
static const kgpu_region_file *region;

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "FAIL: ");
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, "\n");
    fflush(stdout);
    va_end(ap);
    failures++;
}

#define EXPECT_RC(call, want)                                                                      \
    do {                                                                                           \
        CUresult got_ = (call);                                                                    \
        if (got_ != (want))                                                                        \
            fail("%s:%d: %s returned %d, expected %d", __FILE__, __LINE__, #call, got_, (want));   \
    } while (0)

#define EXPECT_EQ(a, b)                                                                            \
    do {                                                                                           \
        unsigned long long a_ = (a), b_ = (b);                                                     \
        if (a_ != b_)                                                                              \
            fail("%s:%d: %s is %llu, expected %llu", __FILE__, __LINE__, #a, a_, b_);              \
    } while (0)

static uint64_t env_mib(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return (v != NULL && *v ? strtoull(v, NULL, 10) : dflt) * MIB;
}

/* Fills A by the route PROBE_ROUTE names. */
static int load(void)
{
    const char *route = getenv("PROBE_ROUTE") ? getenv("PROBE_ROUTE") : "dlsym";
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fail("dlopen libcuda.so.1: %s", dlerror());
        return -1;
    }
    if (strcmp(route, "direct") == 0) {
#ifdef PROBE_LINKED
#define X(name, base, params) A.name = name;
        PROBE_API(X)
#undef X
        return 0;
#else
        fail("this probe is not linked against libcuda: no direct route");
        return -1;
#endif
    }
#define X(name, base, params) *(void **)&A.name = dlsym(h, #name);
    PROBE_API(X)
#undef X
    if (strcmp(route, "dlsym") == 0)
        return 0;

    /* cuGetProcAddress: base names plus a CUDA version, as the runtime asks. */
    int v2 = strcmp(route, "proc2") == 0;
    CUresult (*gpa)(const char *, void **, int, cuuint64_t) = NULL;
    CUresult (*gpa2)(const char *, void **, int, cuuint64_t, int *) = NULL;
    *(void **)&gpa = dlsym(h, "cuGetProcAddress");
    *(void **)&gpa2 = dlsym(h, "cuGetProcAddress_v2");
    if ((v2 ? (void *)gpa2 : (void *)gpa) == NULL) {
        fail("the driver has no cuGetProcAddress%s", v2 ? "_v2" : "");
        return -1;
    }
#define X(name, base, params)                                                                      \
    if (base[0] != '\0') {                                                                         \
        void *f = NULL;                                                                            \
        int status = 0;                                                                            \
        CUresult r = v2 ? gpa2(base, &f, 12040, 0, &status) : gpa(base, &f, 12040, 0);             \
        *(void **)&A.name = r == CUDA_SUCCESS ? f : NULL;                                          \
    }
    PROBE_API(X)
#undef X
    return 0;
}

/* The region device observed: PROBE_REGION_DEV, the limits line CUDA device 0 maps to. */
static int region_dev;

static uint64_t used(void)
{
    return region != NULL ? atomic_load(&((kgpu_region_file *)region)->dev[region_dev].used) : 0;
}

static unsigned long long pool(void)
{
    unsigned long long u = 0;
    if (A.fakeCudaPoolUsed != NULL)
        A.fakeCudaPoolUsed(0, &u);
    return u;
}

/* The region: PROBE_REGION, or where KGPU_SHARED_DIR and KGPU_CONTAINER put it. */
static int open_region(void)
{
    char path[4096];
    const char *dir = getenv("KGPU_SHARED_DIR"), *name = getenv("KGPU_CONTAINER");
    snprintf(path, sizeof(path), "%s/%s.acct", dir ? dir : "/var/run/kgpu",
             name ? name : "default");
    if (getenv("PROBE_REGION") != NULL)
        snprintf(path, sizeof(path), "%s", getenv("PROBE_REGION"));
    kgpu_error err;
    if (kgpu_shim_region_view(path, &region, &err) != KGPU_OK) {
        fail("observer: %s", err.msg);
        return -1;
    }
    return 0;
}

/* cuInit, the primary context of device 0, made current. */
static int setup(CUcontext *ctx)
{
    CUresult r = A.cuInit(0);
    if (r != CUDA_SUCCESS) {
        fail("cuInit returned %d", r);
        return -1;
    }
    if ((r = A.cuDevicePrimaryCtxRetain(ctx, 0)) != CUDA_SUCCESS) {
        fail("cuDevicePrimaryCtxRetain returned %d", r);
        return -1;
    }
    A.cuCtxSetCurrent(*ctx);
    return 0;
}

/* ---- one counted call per kind: allocate `bytes` (a multiple of 1 MiB), free it ---- */

typedef struct kind {
    const char *name;
    int (*present)(void);
    CUresult (*alloc)(uint64_t bytes, uint64_t *handle);
    CUresult (*release)(uint64_t handle);
} kind;

static int has_mem(void)
{
    return A.cuMemAlloc_v2 != NULL && A.cuMemFree_v2 != NULL;
}
static CUresult mem_alloc(uint64_t b, uint64_t *h)
{
    return A.cuMemAlloc_v2((CUdeviceptr *)h, b);
}
static CUresult mem_free(uint64_t h)
{
    return A.cuMemFree_v2(h);
}

static int has_pitch(void)
{
    return A.cuMemAllocPitch_v2 != NULL;
}
static CUresult pitch_alloc(uint64_t b, uint64_t *h)
{
    size_t pitch = 0;
    CUresult r = A.cuMemAllocPitch_v2((CUdeviceptr *)h, &pitch, MIB, b / MIB, 4);
    if (r == CUDA_SUCCESS && pitch != MIB)
        fail("pitch %zu, expected %llu", pitch, MIB);
    return r;
}

static int has_managed(void)
{
    return A.cuMemAllocManaged != NULL;
}
static CUresult managed_alloc(uint64_t b, uint64_t *h)
{
    return A.cuMemAllocManaged((CUdeviceptr *)h, b, 1 /* CU_MEM_ATTACH_GLOBAL */);
}

static int has_async(void)
{
    return A.cuMemAllocAsync != NULL && A.cuMemFreeAsync != NULL;
}
static CUresult async_alloc(uint64_t b, uint64_t *h)
{
    return A.cuMemAllocAsync((CUdeviceptr *)h, b, NULL);
}
static CUresult async_free(uint64_t h)
{
    return A.cuMemFreeAsync(h, NULL);
}

static int has_pool(void)
{
    return A.cuMemAllocFromPoolAsync != NULL && A.cuDeviceGetDefaultMemPool != NULL &&
           A.cuMemFreeAsync != NULL;
}
static CUresult pool_alloc(uint64_t b, uint64_t *h)
{
    pool_t p;
    CUresult r = A.cuDeviceGetDefaultMemPool(&p, 0);
    return r != CUDA_SUCCESS ? r : A.cuMemAllocFromPoolAsync((CUdeviceptr *)h, b, p, NULL);
}

static int has_create(void)
{
    return A.cuMemCreate != NULL && A.cuMemRelease != NULL;
}
static CUresult create_alloc(uint64_t b, uint64_t *h)
{
    CUmemAllocationProp prop = {.type = 1,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    return A.cuMemCreate((CUmemGenericAllocationHandle *)h, b, &prop, 0);
}
static CUresult create_free(uint64_t h)
{
    return A.cuMemRelease(h);
}

static int has_array(void)
{
    return A.cuArrayCreate_v2 != NULL && A.cuArrayDestroy != NULL;
}
static CUresult array_alloc(uint64_t b, uint64_t *h)
{
    /* FLOAT (4 bytes), 2 channels, 256 rows. */
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = b / 8 / 256, .Height = 256, .Format = 0x20, .NumChannels = 2};
    CUarray a = NULL;
    CUresult r = A.cuArrayCreate_v2(&a, &d);
    *h = (uintptr_t)a;
    return r;
}
static CUresult array_free(uint64_t h)
{
    return A.cuArrayDestroy((CUarray)(uintptr_t)h);
}

static int has_array3d(void)
{
    return A.cuArray3DCreate_v2 != NULL && A.cuArrayDestroy != NULL;
}
static CUresult array3d_alloc(uint64_t b, uint64_t *h)
{
    /* UNSIGNED_INT16, one channel, 64 x 16 planes. */
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = b / 2 / (64 * 16), .Height = 64, .Depth = 16, .Format = 0x02, .NumChannels = 1};
    CUarray a = NULL;
    CUresult r = A.cuArray3DCreate_v2(&a, &d);
    *h = (uintptr_t)a;
    return r;
}

static int has_mipmap(void)
{
    return A.cuMipmappedArrayCreate != NULL && A.cuMipmappedArrayDestroy != NULL;
}
static CUresult mipmap_alloc(uint64_t b, uint64_t *h)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = b / 4 / (32 * 8), .Height = 32, .Depth = 8, .Format = 0x20, .NumChannels = 1};
    CUmipmappedArray a = NULL;
    CUresult r = A.cuMipmappedArrayCreate(&a, &d, 1);
    *h = (uintptr_t)a;
    return r;
}
static CUresult mipmap_free(uint64_t h)
{
    return A.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h);
}

static const kind kinds[] = {
    {"cuMemAlloc_v2", has_mem, mem_alloc, mem_free},
    {"cuMemAllocPitch_v2", has_pitch, pitch_alloc, mem_free},
    {"cuMemAllocManaged", has_managed, managed_alloc, mem_free},
    {"cuMemAllocAsync", has_async, async_alloc, async_free},
    {"cuMemAllocFromPoolAsync", has_pool, pool_alloc, async_free},
    {"cuMemCreate", has_create, create_alloc, create_free},
    {"cuArrayCreate_v2", has_array, array_alloc, array_free},
    {"cuArray3DCreate_v2", has_array3d, array3d_alloc, array_free},
    {"cuMipmappedArrayCreate", has_mipmap, mipmap_alloc, mipmap_free},
};

static void check_info(uint64_t want_used)
{
    size_t free_b = 0, total = 0;
    EXPECT_RC(A.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    EXPECT_EQ(total, limit_bytes);
    EXPECT_EQ(free_b, limit_bytes - want_used);
}

static int cmd_enforce(void)
{
    CUcontext ctx;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    size_t total = 0;
    EXPECT_RC(A.cuDeviceTotalMem_v2(&total, 0), CUDA_SUCCESS);
    EXPECT_EQ(total, limit_bytes);
    EXPECT_EQ(used(), ctx_bytes);
    check_info(ctx_bytes);
    uint64_t avail = limit_bytes - ctx_bytes;
    int tested = 0;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        const kind *K = &kinds[k];
        if (!K->present()) {
            printf("skip %s: not in this driver\n", K->name);
            continue;
        }
        tested++;
        uint64_t u0 = used(), p0 = pool(), h = 0, h2 = 0;
        CUresult r;
        if ((r = K->alloc(avail + MIB, &h)) != CUDA_ERROR_OUT_OF_MEMORY)
            fail("%s: %llu MiB over a share of %llu MiB returned %d, expected 2", K->name,
                 (unsigned long long)((avail + MIB) / MIB), (unsigned long long)(avail / MIB), r);
        EXPECT_EQ(used(), u0);
        EXPECT_EQ(pool(), p0);
        if ((r = K->alloc(avail, &h)) != CUDA_SUCCESS) {
            fail("%s: the whole share (%llu MiB) returned %d", K->name,
                 (unsigned long long)(avail / MIB), r);
            continue;
        }
        EXPECT_EQ(used(), limit_bytes);
        check_info(limit_bytes);
        if ((r = K->alloc(MIB, &h2)) != CUDA_ERROR_OUT_OF_MEMORY)
            fail("%s: 1 MiB past a full share returned %d, expected 2", K->name, r);
        EXPECT_RC(K->release(h), CUDA_SUCCESS);
        EXPECT_EQ(used(), u0);
        EXPECT_EQ(pool(), p0);
        check_info(ctx_bytes);
        printf("ok %s\n", K->name);
    }
    if (tested == 0)
        fail("no counted call could be tested");
    /*
     * dlsym(RTLD_NEXT) still means "after the caller": from here the next
     * dlsym is the preloaded library's own, not libc's (what the library
     * would find if it answered relative to itself).
     */
    void *next = dlsym(RTLD_NEXT, "dlsym"), *dflt = dlsym(RTLD_DEFAULT, "dlsym");
    if (next == NULL || next != dflt)
        fail("dlsym(RTLD_NEXT, \"dlsym\") is %p, expected the first one after the program, %p",
             next, dflt);
    if (dlsym(RTLD_NEXT, "getpid") != dlsym(RTLD_DEFAULT, "getpid") ||
        dlsym(RTLD_NEXT, "getpid") == NULL)
        fail("dlsym(RTLD_NEXT, \"getpid\") is not libc's");
    if (dlsym(RTLD_NEXT, "kgpu_no_such_symbol") != NULL)
        fail("dlsym(RTLD_NEXT) found a symbol nobody defines");
    /* A free of something never allocated reaches the driver and changes nothing here. */
    EXPECT_RC(A.cuMemFree_v2(0x1234), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

static int cmd_ctx(void)
{
    CUcontext prim, c2, c3;
    CUdeviceptr p;
    if (setup(&prim) != 0 || open_region() != 0)
        return 1;
    uint64_t p0 = pool();
    EXPECT_RC(A.cuMemAlloc_v2(&p, 10 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 10 * MIB);
    /* A created context costs its footprint, and its memory dies with it. */
    EXPECT_RC(A.cuCtxCreate_v2(&c2, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(), 2 * ctx_bytes + 10 * MIB);
    EXPECT_RC(A.cuMemAlloc_v2(&p, 100 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), 2 * ctx_bytes + 110 * MIB);
    EXPECT_RC(A.cuCtxDestroy_v2(c2), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 10 * MIB);
    A.cuCtxSetCurrent(prim);
    /* Contexts count against the share like allocations. */
    uint64_t room = limit_bytes - ctx_bytes - 10 * MIB;
    int fit = (int)(room / ctx_bytes);
    CUcontext made[16];
    int n = 0;
    while (n < 16 && A.cuCtxCreate_v2(&made[n], 0, 0) == CUDA_SUCCESS)
        n++;
    EXPECT_EQ(n, fit);
    EXPECT_RC(A.cuCtxCreate_v2(&c3, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < n; i++)
        EXPECT_RC(A.cuCtxDestroy_v2(made[i]), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 10 * MIB);
    /* The last release of the primary context gives back it and what was allocated in it. */
    EXPECT_RC(A.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT_EQ(used(), 0);
    EXPECT_EQ(pool(), p0); /* the fake freed what the context held */
    return failures != 0;
}

/* Prints what an application would see ("missing": the route gave no function); the caller judges.
 */
static void show(const char *what, int present, int rc)
{
    if (!present)
        printf("%s=missing\n", what);
    else
        printf("%s=%d\n", what, rc);
}

#define SHOW(what, fn, args) show(what, A.fn != NULL, A.fn != NULL ? A.fn args : 0)

static int cmd_info(void)
{
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    size_t free_b = 0, total = 0;
    if (getenv("PROBE_SKIP_INIT") == NULL)
        SHOW("cuInit", cuInit, (0));
    SHOW("retain", cuDevicePrimaryCtxRetain, (&ctx, 0));
    if (ctx != NULL)
        A.cuCtxSetCurrent(ctx);
    SHOW("alloc", cuMemAlloc_v2, (&p, 64 * MIB));
    SHOW("meminfo", cuMemGetInfo_v2, (&free_b, &total));
    printf("total_mib=%llu\nfree_mib=%llu\n", (unsigned long long)(total / MIB),
           (unsigned long long)(free_b / MIB));
    uint64_t big = env_mib("PROBE_BIG_MIB", 0);
    if (big != 0)
        SHOW("big", cuMemAlloc_v2, (&p, big));
    fflush(stdout);
    return 0;
}

static int cmd_nvml(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    EXPECT_RC(A.cuMemAlloc_v2(&p, 100 * MIB), CUDA_SUCCESS);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fail("dlopen libnvidia-ml.so.1: %s", dlerror());
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*by_index)(unsigned, nvmlDevice_t *) =
        (int (*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(nvmlDevice_t, nvmlMemory_t *) =
        (int (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*info2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (int (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t dev;
    if (init == NULL || by_index == NULL || info == NULL || info2 == NULL) {
        fail("fake NVML lacks a function");
        return 1;
    }
    EXPECT_RC(init(), 0);
    EXPECT_RC(by_index(0, &dev), 0);
    nvmlMemory_t m;
    EXPECT_RC(info(dev, &m), 0);
    EXPECT_EQ(m.total, limit_bytes);
    EXPECT_EQ(m.used, ctx_bytes + 100 * MIB);
    EXPECT_EQ(m.free, limit_bytes - ctx_bytes - 100 * MIB);
    nvmlMemory_v2_t m2 = {.version = (unsigned)(sizeof(m2) | 2u << 24)};
    EXPECT_RC(info2(dev, &m2), 0);
    EXPECT_EQ(m2.total, limit_bytes);
    EXPECT_EQ(m2.used, ctx_bytes + 100 * MIB);
    EXPECT_EQ(m2.free, limit_bytes - ctx_bytes - 100 * MIB);
    return failures != 0;
}

/* Whoever can write the region still cannot raise the limit: it comes from the limits file. */
static int cmd_tamper(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.acct", getenv("KGPU_SHARED_DIR"), getenv("KGPU_CONTAINER"));
    FILE *f = fopen(path, "r+b");
    if (f == NULL) {
        fail("open %s: %s", path, strerror(errno));
        return 1;
    }
    uint64_t huge = 1ULL << 50;
    fseek(f, (long)offsetof(kgpu_region_file, dev[0].limit), SEEK_SET);
    fwrite(&huge, sizeof(huge), 1, f);
    fclose(f);
    EXPECT_EQ(atomic_load(&((kgpu_region_file *)region)->dev[0].limit), huge);
    EXPECT_RC(A.cuMemAlloc_v2(&p, limit_bytes - ctx_bytes + MIB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t free_b, total;
    EXPECT_RC(A.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    EXPECT_EQ(total, limit_bytes);
    return failures != 0;
}

/* A child after fork() is a process of its own: its own context, slot and allocations. */
static int cmd_fork(void)
{
    CUcontext ctx;
    CUdeviceptr p, q;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    EXPECT_RC(A.cuMemAlloc_v2(&p, 100 * MIB), CUDA_SUCCESS);
    pid_t pid = fork();
    if (pid == 0) {
        CUcontext c2;
        if (setup(&c2) != 0)
            exit(1);
        EXPECT_RC(A.cuMemAlloc_v2(&q, 50 * MIB), CUDA_SUCCESS);
        EXPECT_EQ(used(), 2 * ctx_bytes + 150 * MIB);
        /* The parent's allocation is not the child's to give back. */
        A.cuMemFree_v2(p);
        EXPECT_EQ(used(), 2 * ctx_bytes + 150 * MIB);
        exit(failures != 0); /* leaves its slot: context and 50 MiB */
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed (status %d)", status);
    EXPECT_EQ(used(), ctx_bytes + 100 * MIB);
    EXPECT_RC(A.cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/* Holds PROBE_HOLD_MIB until killed, for tests that need another process's use. */
static int cmd_hold(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0)
        return 1;
    EXPECT_RC(A.cuMemAlloc_v2(&p, env_mib("PROBE_HOLD_MIB", 100)), CUDA_SUCCESS);
    printf("holding\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* ---- the race ---- */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define HOLD 4

/* One process: random allocations and frees; after each success the total must be within the limit.
 */
static void worker(int id, int iters, int wfd, int go_fd, int set_fd, int start_fd)
{
    CUcontext ctx;
    CUdeviceptr held[HOLD];
    int n = 0;
    long ok = 0, oom = 0;
    uint64_t seed = 0x5eed0000ULL + (uint64_t)id;
    char c;
    /* Every worker gets its context before any allocates: contexts count against the limit too. */
    if (setup(&ctx) != 0 || open_region() != 0 || write(set_fd, "s", 1) != 1 ||
        read(start_fd, &c, 1) != 1)
        exit(1);
    for (int i = 0; iters < 0 || i < iters; i++) {
        uint64_t r = splitmix(&seed);
        if (n < HOLD && (n == 0 || r % 3 != 0)) {
            size_t size = (size_t)(1 + (r >> 8) % 512) * MIB;
            CUresult rc = A.cuMemAlloc_v2(&held[n], size);
            if (rc == CUDA_SUCCESS) {
                n++;
                ok++;
                uint64_t u = used();
                if (u > limit_bytes)
                    fail("worker %d: %llu bytes in use with a limit of %llu", id,
                         (unsigned long long)u, (unsigned long long)limit_bytes);
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                oom++;
            } else {
                fail("worker %d: cuMemAlloc_v2 returned %d", id, rc);
            }
        } else {
            int k = (int)((r >> 16) % (uint64_t)n);
            EXPECT_RC(A.cuMemFree_v2(held[k]), CUDA_SUCCESS);
            held[k] = held[--n];
        }
        if (i == 50 && wfd >= 0 && go_fd < 0) {
            /* Tell the parent this one now holds memory (victims are killed after this). */
            ssize_t w = write(wfd, "r", 1);
            (void)w;
        }
    }
    if (go_fd >= 0) {
        /* The survivor: once the others are dead, the whole share must be ours again. */
        for (int k = 0; k < n; k++)
            A.cuMemFree_v2(held[k]);
        n = 0;
        /* Idle now, so the victims' slots are still there when the parent looks. */
        if (write(wfd, "i", 1) != 1 || read(go_fd, &c, 1) != 1)
            fail("survivor: no go");
        CUresult rc = A.cuMemAlloc_v2(&held[0], limit_bytes - ctx_bytes);
        if (rc != CUDA_SUCCESS)
            fail("survivor: the share left by killed processes did not come back (%d); "
                 "%llu bytes still counted",
                 rc, (unsigned long long)used());
        else
            A.cuMemFree_v2(held[0]);
    }
    for (int k = 0; k < n; k++)
        A.cuMemFree_v2(held[k]);
    printf("worker %d ok=%ld oom=%ld\n", id, ok, oom);
    fflush(stdout);
    exit(failures != 0); /* exit, not _exit: the library gives back this process's slot */
}

static int cmd_race(void)
{
    int nworkers = (int)(env_mib("PROBE_WORKERS", 8) / MIB);
    int iters = (int)(env_mib("PROBE_ITERS", 3000) / MIB);
    int nvictims = (int)(env_mib("PROBE_VICTIMS", 3) / MIB);
    if (nworkers < nvictims + 2 || nworkers > 64) {
        fail("need more workers than victims + 1");
        return 1;
    }
    pid_t pids[64];
    int ready[2], go[2], set[2], start[2];
    if (pipe(ready) != 0 || pipe(go) != 0 || pipe(set) != 0 || pipe(start) != 0)
        return 1;
    /* Worker 0 survives the kills; 1..nvictims are killed mid-run; the rest finish. */
    for (int i = 0; i < nworkers; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            int victim = i >= 1 && i <= nvictims;
            worker(i, victim ? -1 : iters, victim || i == 0 ? ready[1] : -1, i == 0 ? go[0] : -1,
                   set[1], start[0]);
        }
        if (pids[i] < 0) {
            fail("fork: %s", strerror(errno));
            return 1;
        }
    }
    if (open_region() != 0)
        return 1;
    char c;
    for (int i = 0; i < nworkers; i++)
        if (read(set[0], &c, 1) != 1)
            fail("a worker did not start");
    for (int i = 0; i < nworkers; i++)
        if (write(start[1], "g", 1) != 1)
            fail("cannot start the workers");
    /* Watch the total while they run. */
    int finished = 0;
    for (int i = nvictims + 1; i < nworkers; i++) {
        int status;
        while (waitpid(pids[i], &status, WNOHANG) == 0) {
            if (used() > limit_bytes)
                fail("parent saw %llu bytes in use with a limit of %llu",
                     (unsigned long long)used(), (unsigned long long)limit_bytes);
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail("worker %d ended with status %d", i, status);
        finished++;
    }
    /* Victims hold memory (their context at least) when they die; the survivor waits idle. */
    for (int i = 0; i < nvictims + 1; i++)
        if (read(ready[0], &c, 1) != 1)
            fail("a victim never got going, or the survivor never finished");
    uint64_t held_by_victims = 0;
    for (int i = 1; i <= nvictims; i++) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
    for (int s = 0; s < KGPU_REGION_SLOTS; s++)
        for (int i = 1; i <= nvictims; i++)
            if (region->slot[s].pid == pids[i])
                held_by_victims += atomic_load(&((kgpu_region_file *)region)->slot[s].bytes[0]);
    printf("killed %d workers holding %llu MiB\n", nvictims,
           (unsigned long long)(held_by_victims / MIB));
    if (held_by_victims < (uint64_t)nvictims * ctx_bytes)
        fail("killed workers held only %llu bytes", (unsigned long long)held_by_victims);
    /* The survivor now needs the whole share: only reclaiming the dead slots makes it fit. */
    if (write(go[1], "g", 1) != 1)
        fail("cannot wake the survivor");
    int status;
    waitpid(pids[0], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the survivor ended with status %d", status);
    EXPECT_EQ(used(), 0);
    for (int s = 0; s < KGPU_REGION_SLOTS; s++)
        if (region->slot[s].pid != 0)
            fail("slot %d still held by pid %d", s, region->slot[s].pid);
    printf("race: %d finished, %d killed, survivor ok\n", finished, nvictims);
    return failures != 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: probe enforce|ctx|info|nvml|tamper|fork|hold|race\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    limit_bytes = env_mib("PROBE_LIMIT_MIB", 1024);
    ctx_bytes = env_mib("PROBE_CTX_MIB", 300);
    region_dev = (int)(env_mib("PROBE_REGION_DEV", 0) / MIB);
    if (load() != 0)
        return 1;
    const char *cmd = argv[1];
    int rc = strcmp(cmd, "enforce") == 0  ? cmd_enforce()
             : strcmp(cmd, "ctx") == 0    ? cmd_ctx()
             : strcmp(cmd, "info") == 0   ? cmd_info()
             : strcmp(cmd, "nvml") == 0   ? cmd_nvml()
             : strcmp(cmd, "tamper") == 0 ? cmd_tamper()
             : strcmp(cmd, "fork") == 0   ? cmd_fork()
             : strcmp(cmd, "hold") == 0   ? cmd_hold()
             : strcmp(cmd, "race") == 0   ? cmd_race()
                                          : 2;
    return rc;
}
