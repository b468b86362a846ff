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
 *   probe ctxcharge prints what the primary and a created context were
 *                   charged and what is left charged after each goes
 *   probe info      prints what cuInit, an allocation and cuMemGetInfo say
 *   probe nvml      NVML's memory figures show the share
 *   probe tamper    raising the limit in the region changes nothing
 *   probe fork      a forked child accounts for itself
 *   probe hold      allocates PROBE_HOLD_MIB and waits to be killed
 *   probe race      processes allocate and free at random against one
 *                   limit; some are killed; their memory comes back
 *   probe vmm       released-but-mapped, retained, exported and imported
 *                   (here and in a child: vmm-import) physical memory
 *   probe sparse    handles mapped into tiles of a sparse array
 *   probe pool      pools keep what they reserve; frees run at a sync
 *   probe hold-pool / pool-beside   two processes with pools, one limit
 *   probe graph     graph memory nodes, explicit and captured
 *   probe limits    cuCtxSetLimit: heap, stack, measured
 *   probe modules   module and library loads
 *   probe v1        the pre-3.2 entry points
 *   probe quiet-fork  children made by _Fork() and clone()
 *   probe ipc       a consumer (ipc-open, a child) opens the producer's
 *                   allocation: charged from the open, refused over the
 *                   share, kept after the producer freed it, closed
 *   probe export-dup  an export kept open by a dup of its descriptor
 *   probe multicast memory bound into a multicast object stays charged
 *                   until unbound or the object is gone
 *   probe graph-upload  instantiation with the upload flag: charged and
 *                   refused before the driver uploads
 *   probe outlive   allocates PROBE_HOLD_MIB, forks a worker that waits to
 *                   be killed, prints "worker <pid>" and exits first
 *   probe loader / deepbind / dlmopen   the loader's routes
 *   probe launch    every launch path reaches the library, then the driver
 *   probe share     keeps the fake GPU busy; prints the GPU time it got
 *   probe step      the same with training steps: 25 kernels, then a
 *                   cuStreamSynchronize (or one graph per step)
 *   probe capture   records graphs in global capture mode while taking turns
 *   probe launch-old / multidev   the pre-4.0 and multi-device launches
 *   probe lmem      local memory grown at launch
 *   probe libunload-missing   a library load a driver cannot undo
 *   probe modimage  module images estimated before the load
 *   probe modimage-jit  the same for PTX (bare, from a file, in a
 *                   fatbinary) and compressed fatbinary entries: refused
 *                   before the driver, with no moment past the share
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadecl.h"
#include "region.h"

#ifdef KGPU_MODIMAGE_DECODE
#include <lz4.h>
#include <zstd.h>
#endif

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
    X(cuCtxSynchronize, "cuCtxSynchronize", (void))                                                \
    X(cuStreamSynchronize, "cuStreamSynchronize", (stream_t))                                      \
    X(cuStreamCreate, "cuStreamCreate", (stream_t *, unsigned int))                                \
    X(cuMemAddressReserve, "cuMemAddressReserve",                                                  \
      (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                            \
    X(cuMemMap, "cuMemMap",                                                                        \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))             \
    X(cuMemUnmap, "cuMemUnmap", (CUdeviceptr, size_t))                                             \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle",                                  \
      (CUmemGenericAllocationHandle *, void *))                                                    \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle",                                \
      (void *, CUmemGenericAllocationHandle, int, unsigned long long))                             \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle",                            \
      (CUmemGenericAllocationHandle *, void *, int))                                               \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", (pool_t, int, void *))                       \
    X(cuMemPoolCreate, "cuMemPoolCreate", (pool_t *, const CUmemPoolProps *))                      \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", (pool_t, size_t))                                        \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", (pool_t))                                              \
    X(cuGraphCreate, "cuGraphCreate", (CUgraph *, unsigned int))                                   \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode",                                            \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *))         \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags",                                  \
      (CUgraphExec *, CUgraph, unsigned long long))                                                \
    X(cuGraphLaunch, "cuGraphLaunch", (CUgraphExec, stream_t))                                     \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", (CUgraphExec))                                     \
    X(cuGraphDestroy, "cuGraphDestroy", (CUgraph))                                                 \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", (CUdevice))                                    \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", (stream_t, int))                            \
    X(cuStreamEndCapture, "cuStreamEndCapture", (stream_t, CUgraph *))                             \
    X(cuCtxSetLimit, "cuCtxSetLimit", (int, size_t))                                               \
    X(cuCtxGetLimit, "cuCtxGetLimit", (size_t *, int))                                             \
    X(cuModuleLoad, "cuModuleLoad", (CUmodule *, const char *))                                    \
    X(cuModuleLoadData, "cuModuleLoadData", (CUmodule *, const void *))                            \
    X(cuModuleUnload, "cuModuleUnload", (CUmodule))                                                \
    X(cuLibraryLoadData, "cuLibraryLoadData",                                                      \
      (CUlibrary *, const void *, int *, void **, unsigned, int *, void **, unsigned))             \
    X(cuLibraryUnload, "cuLibraryUnload", (CUlibrary))                                             \
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
/* Done when the stream gets there: a synchronisation, after which the pool lets it go. */
static CUresult async_free(uint64_t h)
{
    CUresult r = A.cuMemFreeAsync(h, NULL);
    return r != CUDA_SUCCESS ? r : A.cuCtxSynchronize();
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
    /* The fake freed what the context held, its own footprint too. */
    EXPECT_EQ(pool(), p0 - env_mib("FAKE_CUDA_CTX_MIB", 0));
    return failures != 0;
}

static int cmd_ctxcharge(void)
{
    CUcontext prim, made;
    if (setup(&prim) != 0 || open_region() != 0)
        return 1;
    uint64_t primary = used();
    EXPECT_RC(A.cuCtxCreate_v2(&made, 0, 0), CUDA_SUCCESS);
    uint64_t created = used() - primary;
    EXPECT_RC(A.cuCtxDestroy_v2(made), CUDA_SUCCESS);
    uint64_t destroyed = used();
    A.cuCtxSetCurrent(prim);
    EXPECT_RC(A.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    printf("primary=%llu created=%llu destroyed=%llu released=%llu\n",
           (unsigned long long)(primary / MIB), (unsigned long long)(created / MIB),
           (unsigned long long)(destroyed / MIB), (unsigned long long)(used() / MIB));
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
    /*
     * All stopped first: a victim still running when another dies takes the
     * dead one's slot back at its next refused allocation (as it should), and
     * on a loaded machine the slots looked at below would be gone.
     */
    for (int i = 1; i <= nvictims; i++)
        kill(pids[i], SIGSTOP);
    for (int i = 1; i <= nvictims; i++)
        waitpid(pids[i], NULL, WUNTRACED);
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

/* ---- routes whose footprint the arguments do not give ---- */

static CUresult make_handle(uint64_t bytes, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp prop = {.type = 1,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    return A.cuMemCreate(h, bytes, &prop, 0);
}

/* Whether `bytes` more can be allocated now (allocated and freed again if so). */
static int fits(uint64_t bytes)
{
    CUdeviceptr p;
    CUresult r = A.cuMemAlloc_v2(&p, bytes);
    if (r == CUDA_SUCCESS)
        A.cuMemFree_v2(p);
    else if (r != CUDA_ERROR_OUT_OF_MEMORY)
        fail("cuMemAlloc_v2 of %llu MiB returned %d", (unsigned long long)(bytes / MIB), r);
    return r == CUDA_SUCCESS;
}

/*
 * Virtual memory management: physical memory lives while a handle, a
 * mapping or an export of it does, and stays charged as long.
 */
static int cmd_vmm(void)
{
    CUcontext ctx;
    CUmemGenericAllocationHandle h, h2, h3;
    CUdeviceptr va;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    /* Released while mapped: still memory, still charged, until the last unmap. */
    EXPECT_RC(make_handle(400 * MIB, &h), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAddressReserve(&va, 400 * MIB, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemMap(va, 200 * MIB, 0, h, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemMap(va + 200 * MIB, 200 * MIB, 200 * MIB, h, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 400 * MIB);
    EXPECT_EQ(pool(), p0 + 400 * MIB); /* the driver still holds it */
    if (fits(avail - 400 * MIB + MIB))
        fail("released but mapped memory was given back to the share");
    /* NCCL's query: retain by address, release; the memory stays mapped and charged. */
    EXPECT_RC(A.cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 4096)), CUDA_SUCCESS);
    EXPECT_EQ(h2, h);
    EXPECT_RC(A.cuMemRelease(h2), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 400 * MIB);
    EXPECT_RC(A.cuMemUnmap(va, 200 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 400 * MIB); /* half of it is still mapped */
    EXPECT_RC(A.cuMemUnmap(va + 200 * MIB, 200 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);

    /* Exported, released, imported again: the same memory, charged once, kept by the export. */
    int fd = -1;
    EXPECT_RC(make_handle(300 * MIB, &h), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 300 * MIB);
    EXPECT_EQ(pool(), p0 + 300 * MIB);
    EXPECT_RC(A.cuMemImportFromShareableHandle(&h3, (void *)(intptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    EXPECT_RC(A.cuMemMap(va, 300 * MIB, 0, h3, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 300 * MIB); /* not a second charge */
    EXPECT_RC(A.cuMemRelease(h3), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemUnmap(va, 300 * MIB), CUDA_SUCCESS);
    if (fits(avail - 300 * MIB + MIB))
        fail("memory kept alive by an open export was given back to the share");
    /* Once the export is closed, the memory is gone and so is the charge. */
    close(fd);
    if (!fits(avail))
        fail("the charge of a closed export did not come back (%llu bytes counted)",
             (unsigned long long)used());
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);

    /* Another process imports an export: it is charged what it maps of it, there. */
    EXPECT_RC(make_handle(100 * MIB, &h), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    int inherit = dup(fd); /* without FD_CLOEXEC */
    pid_t pid = fork();
    if (pid == 0) {
        char num[16], self[4096];
        snprintf(num, sizeof(num), "%d", inherit);
        setenv("PROBE_IMPORT_FD", num, 1);
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0)
            _exit(126);
        self[n] = '\0';
        char *argv[] = {self, "vmm-import", NULL};
        execv(self, argv);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the importing process failed (status %d)", status);
    close(inherit);
    close(fd);
    if (!fits(avail))
        fail("the charge of a closed export did not come back (%llu bytes counted)",
             (unsigned long long)used());
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/* The child of cmd_vmm: maps a foreign export of 100 MiB; its slot holds what it mapped. */
static int cmd_vmm_import(void)
{
    CUcontext ctx;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    const char *v = getenv("PROBE_IMPORT_FD");
    if (v == NULL || setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t u0 = used(); /* the parent's context and export, and this context */
    EXPECT_EQ(u0, 2 * ctx_bytes + 100 * MIB);
    EXPECT_RC(A.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)atoi(v),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    EXPECT_EQ(used(), u0); /* nothing mapped yet */
    EXPECT_RC(A.cuMemAddressReserve(&va, 100 * MIB, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemMap(va, 60 * MIB, 0, h, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 60 * MIB);
    EXPECT_RC(A.cuMemMap(va + 60 * MIB, 40 * MIB, 60 * MIB, h, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 100 * MIB);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 100 * MIB); /* mapped */
    EXPECT_RC(A.cuMemUnmap(va, 100 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0);
    return failures != 0;
}

static int set_threshold(pool_t p, uint64_t bytes)
{
    cuuint64_t v = bytes;
    return A.cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
}

/* Stream-ordered pools: what a pool keeps is charged, and a free is a free once it has run. */
static int cmd_pool(void)
{
    CUcontext ctx;
    CUdeviceptr a, b;
    pool_t dflt;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    EXPECT_RC(A.cuDeviceGetDefaultMemPool(&dflt, 0), CUDA_SUCCESS);
    /* A framework's pool: release threshold raised, pre-filled, freed back into the pool. */
    EXPECT_RC(set_threshold(dflt, UINT64_MAX), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAllocAsync(&a, 600 * MIB, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 600 * MIB);
    EXPECT_RC(A.cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 600 * MIB); /* queued, not done */
    EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 600 * MIB); /* done, and the pool keeps it */
    EXPECT_EQ(pool(), p0 + 600 * MIB);
    if (fits(avail - 600 * MIB + MIB))
        fail("what the pool keeps was given back to the share");
    /* Served from what the pool keeps: no more memory, no more charge, even near the limit. */
    EXPECT_RC(A.cuMemAllocAsync(&a, 500 * MIB, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 600 * MIB);
    EXPECT_RC(A.cuMemAllocAsync(&b, 300 * MIB, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* 200 more */
    EXPECT_EQ(pool(), p0 + 600 * MIB);
    EXPECT_RC(A.cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    /* The threshold lowered: the next synchronisation lets the memory go, and the charge. */
    EXPECT_RC(set_threshold(dflt, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);

    /* A queued free gives nothing back until its stream has run it. */
    EXPECT_RC(A.cuMemAllocAsync(&a, 600 * MIB, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    if (fits(200 * MIB))
        fail("a free still queued on its stream gave its memory back");
    EXPECT_RC(A.cuStreamSynchronize(NULL), CUDA_SUCCESS);
    if (!fits(avail))
        fail("the share did not come back once the free ran (%llu bytes counted)",
             (unsigned long long)used());

    /* So does cuMemFreeAsync of memory from cuMemAlloc. */
    EXPECT_RC(A.cuMemAlloc_v2(&a, 500 * MIB), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);

    /* A pool of one's own: charged what it reserves; trimmed, destroyed, given back. */
    pool_t mine;
    CUmemPoolProps props = {.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE}};
    EXPECT_RC(A.cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
    EXPECT_RC(set_threshold(mine, UINT64_MAX), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAllocFromPoolAsync(&a, 300 * MIB, mine, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAllocFromPoolAsync(&b, avail - 300 * MIB + MIB, mine, NULL),
              CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(A.cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 300 * MIB);
    EXPECT_RC(A.cuMemPoolTrimTo(mine, 100 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 100 * MIB);
    EXPECT_RC(A.cuMemPoolDestroy(mine), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/* Fills the default pool (release threshold raised) with PROBE_HOLD_MIB, frees it, and waits. */
static int cmd_hold_pool(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    pool_t dflt;
    if (setup(&ctx) != 0)
        return 1;
    EXPECT_RC(A.cuDeviceGetDefaultMemPool(&dflt, 0), CUDA_SUCCESS);
    EXPECT_RC(set_threshold(dflt, UINT64_MAX), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAllocAsync(&p, env_mib("PROBE_HOLD_MIB", 100), NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemFreeAsync(p, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
    printf("holding\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* Next to a process whose pool holds PROBE_HOLD_MIB: the share left is what it does not hold. */
static int cmd_pool_beside(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t left = limit_bytes - 2 * ctx_bytes - env_mib("PROBE_HOLD_MIB", 100);
    EXPECT_EQ(used(), limit_bytes - left);
    EXPECT_RC(A.cuMemAllocAsync(&p, left + MIB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(A.cuMemAllocAsync(&p, left, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), limit_bytes);
    return failures != 0;
}

static CUresult graph_with(uint64_t bytes, CUgraph *g, CUgraphExec *e, CUdeviceptr *dptr)
{
    CUDA_MEM_ALLOC_NODE_PARAMS params;
    CUgraphNode node;
    memset(&params, 0, sizeof(params));
    params.poolProps.allocType = 1;
    params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params.bytesize = bytes;
    CUresult r = A.cuGraphCreate(g, 0);
    if (r == CUDA_SUCCESS)
        r = A.cuGraphAddMemAllocNode(&node, *g, NULL, 0, &params);
    if (r == CUDA_SUCCESS)
        r = A.cuGraphInstantiateWithFlags(e, *g, 0);
    *dptr = params.dptr;
    return r;
}

/* Graph memory: charged when the graph runs, from the device's graph memory, until trimmed. */
static int cmd_graph(void)
{
    CUcontext ctx;
    CUgraph g1, g2, g3;
    CUgraphExec e1, e2, e3;
    CUdeviceptr d1, d2, a;
    stream_t s;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    /* Since CUDA 12.0, cuGetProcAddress("cuGraphInstantiate") means ...WithFlags. */
    if (getenv("PROBE_ROUTE") != NULL && strcmp(getenv("PROBE_ROUTE"), "proc") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        CUresult (*gpa)(const char *, void **, int, cuuint64_t) = NULL;
        *(void **)&gpa = h != NULL ? dlsym(h, "cuGetProcAddress") : NULL;
        if (gpa == NULL ||
            gpa("cuGraphInstantiate", (void **)&A.cuGraphInstantiateWithFlags, 12040, 0) != 0)
            fail("cuGetProcAddress has no cuGraphInstantiate");
    }
    EXPECT_RC(graph_with(500 * MIB, &g1, &e1, &d1), CUDA_SUCCESS);
    EXPECT_RC(graph_with(300 * MIB, &g2, &e2, &d2), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes); /* nothing until it runs */
    EXPECT_RC(A.cuGraphLaunch(e1, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_EQ(pool(), p0 + 500 * MIB);
    EXPECT_RC(A.cuGraphLaunch(e2, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* 800 > 724 */
    EXPECT_EQ(pool(), p0 + 500 * MIB);
    /* Freed, the graph memory keeps its reservation (charged) until trimmed. */
    EXPECT_RC(A.cuMemFreeAsync(d1, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_RC(A.cuGraphLaunch(e2, NULL), CUDA_SUCCESS); /* fits in what is reserved */
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_RC(A.cuMemFreeAsync(d2, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    A.cuGraphExecDestroy(e1);
    A.cuGraphExecDestroy(e2);
    A.cuGraphDestroy(g1);
    A.cuGraphDestroy(g2);

    /* cudaMallocAsync captured into a graph: nothing while captured, its size when it runs. */
    EXPECT_RC(A.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAllocAsync(&a, avail - 100 * MIB, s), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemFreeAsync(a, s), CUDA_SUCCESS);
    EXPECT_RC(A.cuStreamEndCapture(s, &g3), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_RC(A.cuGraphInstantiateWithFlags(&e3, g3, 0), CUDA_SUCCESS);
    if (!fits(avail))
        fail("a captured allocation was charged before its graph ran");
    EXPECT_RC(A.cuGraphLaunch(e3, s), CUDA_SUCCESS);
    EXPECT_EQ(used(), limit_bytes - 100 * MIB);
    if (fits(100 * MIB + MIB))
        fail("graph memory of a captured allocation was not charged");
    EXPECT_RC(A.cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/* Context limits: the heap, the stack and what only the driver's figures show. */
static int cmd_limits(void)
{
    CUcontext ctx;
    size_t v = 0;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t p0 = pool();
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 600 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 592 * MIB); /* 8 MiB are the context's own */
    EXPECT_EQ(pool(), p0 + 592 * MIB);
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 800 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(A.cuCtxGetLimit(&v, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
    EXPECT_EQ(v, 600 * MIB);
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    /* 16 KiB of stack for each of 4 x 2048 resident threads: 128 MiB, 8 of them the context's. */
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 16384), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 120 * MIB);
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    /* No formula for pending launches: what the driver's free memory drops by. */
    EXPECT_RC(A.cuCtxSetLimit(4 /* DEV_RUNTIME_PENDING_LAUNCH_COUNT */, 102400 + 2048),
              CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 100 * MIB);
    EXPECT_EQ(pool(), p0 + 100 * MIB);
    /* Everything raised dies with the context. */
    EXPECT_RC(A.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT_EQ(used(), 0);
    return failures != 0;
}

/* Modules and libraries: what loading them takes, as the driver's free memory shows it. */
static int cmd_modules(void)
{
    CUcontext ctx;
    CUmodule m, m2;
    CUlibrary l;
    char path[] = "/tmp/kgpu-probe-module-XXXXXX";
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t p0 = pool();
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, "KGPUFAKEMOD 300", 15) != 15) {
        fail("cannot write %s", path);
        return 1;
    }
    close(fd);
    EXPECT_RC(A.cuModuleLoad(&m, path), CUDA_SUCCESS);
    unlink(path);
    EXPECT_EQ(used(), ctx_bytes + 300 * MIB);
    EXPECT_RC(A.cuModuleLoadData(&m2, "KGPUFAKEMOD 500"), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(used(), ctx_bytes + 300 * MIB);
    EXPECT_EQ(pool(), p0 + 300 * MIB); /* loaded, measured, unloaded again */
    EXPECT_RC(A.cuModuleUnload(m), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    if (A.cuLibraryLoadData != NULL) {
        EXPECT_RC(A.cuLibraryLoadData(&l, "KGPUFAKEMOD 200", NULL, NULL, 0, NULL, NULL, 0),
                  CUDA_SUCCESS);
        EXPECT_EQ(used(), ctx_bytes + 200 * MIB);
        EXPECT_RC(A.cuLibraryUnload(l), CUDA_SUCCESS);
        EXPECT_EQ(used(), ctx_bytes);
    }
    /* A module dies with its context. */
    EXPECT_RC(A.cuModuleLoadData(&m, "KGPUFAKEMOD 100"), CUDA_SUCCESS);
    EXPECT_RC(A.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT_EQ(used(), 0);
    return failures != 0;
}

/* The entry points from before CUDA 3.2, as dlsym and cuGetProcAddress (version 3000) give them. */
static int cmd_v1(void)
{
    CUcontext ctx, c2;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*alloc)(CUdeviceptr_v1 *, unsigned int) = NULL;
    CUresult (*release)(CUdeviceptr_v1) = NULL;
    CUresult (*info)(unsigned int *, unsigned int *) = NULL;
    CUresult (*create)(CUcontext *, unsigned int, CUdevice) = NULL;
    CUresult (*destroy)(CUcontext) = NULL;
    if (h == NULL || setup(&ctx) != 0 || open_region() != 0)
        return 1;
    if (getenv("PROBE_ROUTE") != NULL && strcmp(getenv("PROBE_ROUTE"), "proc") == 0) {
        CUresult (*gpa)(const char *, void **, int, cuuint64_t) = NULL;
        *(void **)&gpa = dlsym(h, "cuGetProcAddress");
        if (gpa == NULL || gpa("cuMemAlloc", (void **)&alloc, 3000, 0) != CUDA_SUCCESS ||
            gpa("cuMemFree", (void **)&release, 3000, 0) != CUDA_SUCCESS ||
            gpa("cuMemGetInfo", (void **)&info, 3000, 0) != CUDA_SUCCESS ||
            gpa("cuCtxCreate", (void **)&create, 3000, 0) != CUDA_SUCCESS ||
            gpa("cuCtxDestroy", (void **)&destroy, 3000, 0) != CUDA_SUCCESS)
            fail("cuGetProcAddress lacks a pre-3.2 entry point");
    } else {
        *(void **)&alloc = dlsym(h, "cuMemAlloc");
        *(void **)&release = dlsym(h, "cuMemFree");
        *(void **)&info = dlsym(h, "cuMemGetInfo");
        *(void **)&create = dlsym(h, "cuCtxCreate");
        *(void **)&destroy = dlsym(h, "cuCtxDestroy");
    }
    if (alloc == NULL || release == NULL || info == NULL || create == NULL || destroy == NULL) {
        fail("a pre-3.2 entry point is missing");
        return 1;
    }
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    unsigned int f = 0, t = 0;
    CUdeviceptr_v1 p = 0;
    EXPECT_RC(info(&f, &t), CUDA_SUCCESS);
    EXPECT_EQ(t, limit_bytes);
    EXPECT_EQ(f, avail);
    EXPECT_RC(alloc(&p, (unsigned int)(avail + MIB)), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(pool(), p0);
    EXPECT_RC(alloc(&p, (unsigned int)avail), CUDA_SUCCESS);
    EXPECT_EQ(used(), limit_bytes);
    EXPECT_RC(release(p), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_RC(create(&c2, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(), 2 * ctx_bytes);
    EXPECT_RC(destroy(c2), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/*
 * Children made without fork's handlers (_Fork, a raw clone): exiting
 * normally, they must leave their parent's slot alone; allocating, they
 * take slots of their own.
 */
static int cmd_quiet_fork(void)
{
    CUcontext ctx;
    CUdeviceptr p, q;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    EXPECT_RC(A.cuMemAlloc_v2(&p, 100 * MIB), CUDA_SUCCESS);
    pid_t (*fork_quietly)(void) = NULL;
    *(void **)&fork_quietly = dlsym(RTLD_DEFAULT, "_Fork"); /* glibc 2.34 */
    for (int how = 0; how < 2; how++) {
        if (how == 0 && fork_quietly == NULL) {
            printf("skip _Fork: not in this C library\n");
            continue;
        }
        pid_t pid = how == 0 ? fork_quietly() : (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) {
            /* A child that allocates gets a slot of its own... */
            CUcontext c2;
            int bad = getenv("PROBE_CHILD_ALLOCATES") != NULL &&
                      (setup(&c2) != 0 || A.cuMemAlloc_v2(&q, 50 * MIB) != CUDA_SUCCESS ||
                       used() != 2 * ctx_bytes + 150 * MIB);
            exit(bad); /* ...and exit() runs the library's destructor */
        }
        int status;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail("child %d ended with status %d", how, status);
        EXPECT_EQ(used(), ctx_bytes + 100 * MIB); /* the child's own slot went with it */
        int mine = 0;
        for (int s = 0; s < KGPU_REGION_SLOTS; s++)
            mine += region->slot[s].pid == getpid();
        EXPECT_EQ(mine, 1);
        printf("ok child made by %s\n", how == 0 ? "_Fork" : "clone");
    }
    EXPECT_RC(A.cuMemFree_v2(p), CUDA_SUCCESS);
    return failures != 0;
}

/* ---- memory kept alive past its process (issue 25) ---- */

/*
 * A forked worker outliving its parent, as PyTorch DataLoader workers can:
 * the worker inherits the driver's descriptors, so the parent's device
 * memory lives on after the parent exits (normally, destructors run).
 */
static int cmd_outlive(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0)
        return 1;
    EXPECT_RC(A.cuMemAlloc_v2(&p, env_mib("PROBE_HOLD_MIB", 100)), CUDA_SUCCESS);
    pid_t pid = fork();
    if (pid == 0) {
        for (;;)
            pause();
    }
    if (pid < 0)
        fail("fork: %s", strerror(errno));
    printf("worker %d\n", (int)pid);
    return failures != 0;
}

/* A driver function by dlsym (the library's hook where it has one): issue 25's routes. */
static void *driver_sym(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *f = h != NULL ? dlsym(h, name) : NULL;
    if (f == NULL)
        fail("the driver has no %s", name);
    return f;
}

/* Runs this probe as `cmd` in a child that inherits the descriptors; returns its pid. */
static pid_t spawn_self(const char *cmd)
{
    pid_t pid = fork();
    if (pid == 0) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0)
            _exit(126);
        self[n] = '\0';
        char *argv[] = {self, (char *)cmd, NULL};
        execv(self, argv);
        _exit(127);
    }
    return pid;
}

/*
 * The producer: 600 MiB, its IPC handle to a consumer process, freed once
 * the consumer has opened it (the consumer keeps it alive).
 */
static int cmd_ipc(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    CUipcMemHandle h;
    CUresult (*get)(CUipcMemHandle *, CUdeviceptr) = NULL;
    *(void **)&get = driver_sym("cuIpcGetMemHandle");
    int opened[2], freed[2];
    if (get == NULL || setup(&ctx) != 0 || open_region() != 0 || pipe(opened) != 0 ||
        pipe(freed) != 0)
        return 1;
    EXPECT_RC(A.cuMemAlloc_v2(&p, 600 * MIB), CUDA_SUCCESS);
    EXPECT_RC(get(&h, p), CUDA_SUCCESS);
    char hex[129], num[32];
    for (int i = 0; i < 64; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
    setenv("PROBE_IPC_HANDLE", hex, 1);
    snprintf(num, sizeof(num), "%d %d", opened[1], freed[0]);
    setenv("PROBE_IPC_PIPES", num, 1);
    pid_t pid = spawn_self("ipc-open");
    close(opened[1]);
    close(freed[0]);
    char c;
    if (read(opened[0], &c, 1) != 1)
        fail("the consumer did not open the handle");
    EXPECT_RC(A.cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT_EQ(used(), 2 * ctx_bytes + 600 * MIB); /* the consumer's charge stays */
    if (write(freed[1], "f", 1) != 1)
        fail("write: %s", strerror(errno));
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the consumer failed (status %d)", status);
    return failures != 0;
}

/* The consumer of cmd_ipc. */
static int cmd_ipc_open(void)
{
    CUcontext ctx;
    CUdeviceptr q, filler;
    CUipcMemHandle h;
    int opened, freed;
    const char *hex = getenv("PROBE_IPC_HANDLE"), *pipes = getenv("PROBE_IPC_PIPES");
    CUresult (*open_)(CUdeviceptr *, CUipcMemHandle, unsigned int) = NULL;
    CUresult (*close_)(CUdeviceptr) = NULL;
    *(void **)&open_ = driver_sym("cuIpcOpenMemHandle_v2");
    *(void **)&close_ = driver_sym("cuIpcCloseMemHandle");
    if (hex == NULL || strlen(hex) != 128 || pipes == NULL ||
        sscanf(pipes, "%d %d", &opened, &freed) != 2 || open_ == NULL || close_ == NULL ||
        setup(&ctx) != 0 || open_region() != 0)
        return 1;
    for (int i = 0; i < 64; i++) {
        unsigned b;
        sscanf(hex + 2 * i, "%2x", &b);
        h.reserved[i] = (char)b;
    }
    uint64_t u0 = used(); /* both contexts and the producer's 600 MiB */
    EXPECT_EQ(u0, 2 * ctx_bytes + 600 * MIB);
    /* Over the share: refused, and closed again. */
    unsigned long long p0 = pool();
    EXPECT_RC(A.cuMemAlloc_v2(&filler, limit_bytes - u0 - 599 * MIB), CUDA_SUCCESS);
    unsigned long long p1 = pool();
    EXPECT_RC(open_(&q, h, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(pool(), p1);
    EXPECT_RC(A.cuMemFree_v2(filler), CUDA_SUCCESS);
    EXPECT_EQ(pool(), p0);
    /* Within it: charged what it opened. */
    EXPECT_RC(open_(&q, h, 1), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 600 * MIB);
    char c;
    if (write(opened, "o", 1) != 1 || read(freed, &c, 1) != 1)
        fail("the producer went away");
    EXPECT_EQ(used(), 2 * ctx_bytes + 600 * MIB); /* freed there, alive here */
    EXPECT_RC(close_(q), CUDA_SUCCESS);
    EXPECT_EQ(used(), 2 * ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/*
 * An exported descriptor keeps its memory by its open file description: a
 * dup() of it keeps the memory alive after the original is closed, however
 * often that is done; the charge goes only with the last descriptor.
 */
static int cmd_export_dup(void)
{
    CUcontext ctx;
    CUmemGenericAllocationHandle h;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    int keep[4];
    for (int i = 0; i < 4; i++) {
        int fd;
        EXPECT_RC(make_handle(200 * MIB, &h), CUDA_SUCCESS);
        EXPECT_RC(A.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                 0),
                  CUDA_SUCCESS);
        EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
        keep[i] = dup(fd);
        close(fd);
        EXPECT_EQ(pool(), p0 + (uint64_t)(i + 1) * 200 * MIB); /* the driver still holds it */
        if (fits(avail - (uint64_t)(i + 1) * 200 * MIB + MIB))
            fail("memory kept by a dup of its export was given back to the share (%d)", i);
        EXPECT_EQ(used(), ctx_bytes + (uint64_t)(i + 1) * 200 * MIB);
    }
    for (int i = 0; i < 4; i++)
        close(keep[i]);
    if (!fits(avail))
        fail("the charge of closed exports did not come back (%llu bytes counted)",
             (unsigned long long)used());
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/*
 * A multicast binding keeps the bound memory alive: released handles (and
 * an unmapped one bound by address) stay charged until unbound, or until
 * the multicast object itself is released.
 */
static int cmd_multicast(void)
{
    CUcontext ctx;
    CUmemGenericAllocationHandle mc, h;
    CUdeviceptr va;
    CUresult (*create)(CUmemGenericAllocationHandle *, const CUmulticastObjectProp *) = NULL;
    CUresult (*add)(CUmemGenericAllocationHandle, CUdevice) = NULL;
    CUresult (*bind)(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t,
                     size_t, unsigned long long) = NULL;
    CUresult (*bind_addr)(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t,
                          unsigned long long) = NULL;
    CUresult (*unbind)(CUmemGenericAllocationHandle, CUdevice, size_t, size_t) = NULL;
    *(void **)&create = driver_sym("cuMulticastCreate");
    *(void **)&add = driver_sym("cuMulticastAddDevice");
    *(void **)&bind = driver_sym("cuMulticastBindMem");
    *(void **)&bind_addr = driver_sym("cuMulticastBindAddr");
    *(void **)&unbind = driver_sym("cuMulticastUnbind");
    if (create == NULL || add == NULL || bind == NULL || bind_addr == NULL || unbind == NULL ||
        setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    CUmulticastObjectProp prop = {.numDevices = 1, .size = 1000 * MIB};
    EXPECT_RC(create(&mc, &prop), CUDA_SUCCESS);
    EXPECT_RC(add(mc, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes); /* the object itself is not charged */
    /* Bound, then released: four times, each kept by its binding. */
    for (int i = 0; i < 4; i++) {
        EXPECT_RC(make_handle(200 * MIB, &h), CUDA_SUCCESS);
        EXPECT_RC(bind(mc, (size_t)i * 200 * MIB, h, 0, 200 * MIB, 0), CUDA_SUCCESS);
        EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
        EXPECT_EQ(pool(), p0 + (uint64_t)(i + 1) * 200 * MIB); /* the driver still holds it */
        EXPECT_EQ(used(), ctx_bytes + (uint64_t)(i + 1) * 200 * MIB);
    }
    if (fits(avail - 800 * MIB + MIB))
        fail("memory kept by multicast bindings was given back to the share");
    /* Bound by address, released and unmapped: kept too. */
    EXPECT_RC(make_handle(100 * MIB, &h), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemAddressReserve(&va, 100 * MIB, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemMap(va, 100 * MIB, 0, h, 0), CUDA_SUCCESS);
    EXPECT_RC(bind_addr(mc, 800 * MIB, va, 100 * MIB, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemUnmap(va, 100 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 900 * MIB);
    EXPECT_EQ(pool(), p0 + 900 * MIB);
    /* Unbound: that memory goes. */
    EXPECT_RC(unbind(mc, 0, 0, 200 * MIB), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 700 * MIB);
    EXPECT_EQ(pool(), p0 + 700 * MIB);
    /* The object released: every binding goes with it. */
    EXPECT_RC(A.cuMemRelease(mc), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    if (!fits(avail))
        fail("the charge of unbound memory did not come back");
    return failures != 0;
}

/* A graph of one memory allocation node of `bytes`, instantiated with `params`. */
static CUresult graph_params(uint64_t bytes, CUgraph *g, CUgraphExec *e,
                             CUDA_GRAPH_INSTANTIATE_PARAMS *ip)
{
    CUresult (*inst)(CUgraphExec *, CUgraph, void *) = NULL;
    *(void **)&inst = driver_sym("cuGraphInstantiateWithParams");
    CUDA_MEM_ALLOC_NODE_PARAMS params;
    CUgraphNode node;
    memset(&params, 0, sizeof(params));
    params.poolProps.allocType = 1;
    params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params.bytesize = bytes;
    CUresult r = inst == NULL ? CUDA_ERROR_NOT_FOUND : A.cuGraphCreate(g, 0);
    if (r == CUDA_SUCCESS)
        r = A.cuGraphAddMemAllocNode(&node, *g, NULL, 0, &params);
    if (r == CUDA_SUCCESS)
        r = inst(e, *g, ip);
    return r;
}

/*
 * cuGraphInstantiateWithParams with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD maps
 * the graph's memory at once: charged then, and refused over the share
 * before the driver uploads anything.
 */
static int cmd_graph_upload(void)
{
    CUcontext ctx;
    CUgraph g1, g2, g3;
    CUgraphExec e1, e2, e3;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t p0 = pool();
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD};
    EXPECT_RC(graph_params(500 * MIB, &g1, &e1, &ip), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_EQ(pool(), p0 + 500 * MIB);
    /* 800 MiB of graph memory do not fit 724: refused, nothing uploaded. */
    EXPECT_RC(graph_params(800 * MIB, &g2, &e2, &ip), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_EQ(pool(), p0 + 500 * MIB);
    /* Without the flag nothing is mapped at instantiation. */
    ip.flags = 0;
    EXPECT_RC(graph_params(800 * MIB, &g3, &e3, &ip), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 500 * MIB);
    EXPECT_RC(A.cuGraphLaunch(e3, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(A.cuGraphExecDestroy(e1), CUDA_SUCCESS);
    EXPECT_RC(A.cuGraphExecDestroy(e3), CUDA_SUCCESS);
    EXPECT_RC(A.cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/* dlvsym, and glibc's own dlsym and dlvsym however they are fetched: the library's. */
static int cmd_loader(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL || setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    typedef void *(*dlsym_fn)(void *, const char *);
    typedef void *(*dlvsym_fn)(void *, const char *, const char *);
    alloc_fn alloc;
    /* The driver's symbols are unversioned, which dlvsym does not match; were they, the hook. */
    *(void **)&alloc = dlvsym(h, "cuMemAlloc_v2", "GLIBC_2.2.5");
    if (alloc != NULL)
        EXPECT_RC(alloc(&p, avail + MIB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(pool(), p0);
    const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    int found = 0;
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        dlsym_fn s = NULL;
        dlvsym_fn v = NULL;
        *(void **)&s = dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
        *(void **)&v = dlvsym(libc, "dlvsym", versions[i]);
        if (s != NULL && (void *)s != (void *)dlsym)
            fail("dlvsym(\"dlsym\", %s) is glibc's own dlsym", versions[i]);
        if (v != NULL && (void *)v != (void *)dlvsym)
            fail("dlvsym(\"dlvsym\", %s) is glibc's own dlvsym", versions[i]);
        if (s != NULL) {
            *(void **)&alloc = s(h, "cuMemAlloc_v2");
            if (alloc == NULL)
                fail("glibc's dlsym as dlvsym gave it found no cuMemAlloc_v2");
            else
                EXPECT_RC(alloc(&p, avail + MIB), CUDA_ERROR_OUT_OF_MEMORY);
            found++;
        }
    }
    if (found == 0)
        fail("dlvsym found glibc's dlsym under no version");
    if (libc == NULL || dlsym(libc, "dlsym") != (void *)dlsym)
        fail("dlsym of libc.so.6's dlsym is glibc's own");
    /* RTLD_NEXT still means after the caller. */
    if (dlvsym(RTLD_NEXT, "getpid", "GLIBC_2.2.5") != dlsym(RTLD_DEFAULT, "getpid"))
        fail("dlvsym(RTLD_NEXT, \"getpid\") is not libc's");
    EXPECT_EQ(pool(), p0);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/*
 * A plugin opened with RTLD_DEEPBIND binds its own references first: to the
 * driver it links, and to glibc's dlsym. The library rewrites them.
 */
typedef int (*plugin_alloc_fn)(size_t, CUdeviceptr *);
typedef int (*plugin_free_fn)(CUdeviceptr);

static int cmd_deepbind(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    /* By bare name: only the probe's RUNPATH finds it, so glibc must see the probe as caller. */
    void *plain = dlopen("libkgpu-test-plugin.so", RTLD_NOW | RTLD_LOCAL);
    if (plain == NULL)
        fail("a plain dlopen by the caller's RUNPATH failed: %s", dlerror());
    void *h = dlopen("libkgpu-test-plugin-linked.so", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == NULL) {
        fail("dlopen with RTLD_DEEPBIND failed: %s", dlerror());
        return 1;
    }
    plugin_alloc_fn by_dlsym, linked;
    plugin_free_fn free_linked;
    *(void **)&by_dlsym = dlsym(h, "plugin_alloc_dlsym");
    *(void **)&linked = dlsym(h, "plugin_alloc_linked");
    *(void **)&free_linked = dlsym(h, "plugin_free_linked");
    if (by_dlsym == NULL || linked == NULL || free_linked == NULL) {
        fail("the plugin lacks a function");
        return 1;
    }
    EXPECT_RC(by_dlsym(avail + MIB, &p), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(linked(avail + MIB, &p), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(pool(), p0);
    EXPECT_RC(linked(avail, &p), CUDA_SUCCESS);
    EXPECT_EQ(used(), limit_bytes);
    EXPECT_RC(free_linked(p), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/* A dlmopen namespace would get a driver of its own, past the library: refused there. */
static int cmd_dlmopen(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    if (dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW) != NULL)
        fail("dlmopen of the driver into a new namespace was not refused");
    if (dlmopen(LM_ID_NEWLM, "libkgpu-test-plugin-linked.so", RTLD_NOW) != NULL)
        fail("dlmopen of a library linking the driver was not refused");
    void *h = dlmopen(LM_ID_NEWLM, "libkgpu-test-plugin.so", RTLD_NOW);
    if (h == NULL) {
        fail("dlmopen of a library without the driver failed: %s", dlerror());
        return 1;
    }
    plugin_alloc_fn by_dlsym;
    int (*open_global)(const char *) = NULL;
    *(void **)&by_dlsym = dlsym(h, "plugin_alloc_dlsym");
    *(void **)&open_global = dlsym(h, "plugin_open_global");
    if (by_dlsym == NULL || open_global == NULL) {
        fail("the plugin lacks a function");
        return 1;
    }
    EXPECT_EQ(by_dlsym(limit_bytes, &p), (unsigned long long)-1); /* its dlopen: refused */
    /*
     * RTLD_GLOBAL inside the namespace stays glibc's own dlopen, the driver
     * refused by name first. (What glibc then does is its own: 2.36 crashes
     * adding to a dlmopen namespace's global scope, with or without this
     * library, so nothing else is opened that way here.)
     */
    EXPECT_EQ(open_global("libcuda.so.1"), 0);
    EXPECT_EQ(used(), ctx_bytes);
    return failures != 0;
}

/* The name of the object that defines the function at `f`. */
static const char *owner_of(void *f)
{
    Dl_info info;
    return f != NULL && dladdr(f, &info) && info.dli_fname != NULL ? info.dli_fname : "";
}

/*
 * Every launch path reaches the library (where compute shares will be
 * enforced) and goes on to the driver with its arguments unchanged.
 */
static int cmd_launch(void)
{
    CUcontext ctx;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL || setup(&ctx) != 0)
        return 1;
    CUresult (*counted)(unsigned long long *, unsigned int *) = NULL;
    *(void **)&counted = dlsym(h, "fakeCudaLaunches");
    const char *route = getenv("PROBE_ROUTE") ? getenv("PROBE_ROUTE") : "dlsym";
    CUresult (*gpa)(const char *, void **, int, cuuint64_t) = NULL;
    *(void **)&gpa = dlsym(h, "cuGetProcAddress");
    static const char *const names[] = {"cuLaunchKernel", "cuLaunchKernelEx",
                                        "cuLaunchCooperativeKernel"};
    for (int ptsz = 0; ptsz < 2; ptsz++)
        for (int k = 0; k < 3; k++) {
            void *f = NULL;
            if (strcmp(route, "proc") == 0)
                gpa(names[k], &f, 12040, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
            else if (ptsz == 0)
                f = dlsym(h, names[k]);
            else
                continue;
            if (f == NULL) {
                fail("no %s by %s", names[k], route);
                continue;
            }
            if (strstr(owner_of(f), "libkgpu-limit") == NULL)
                fail("%s by %s is %s's, not the library's", names[k], route, owner_of(f));
            unsigned long long before = 0, after = 0;
            unsigned int grid = 0, x = 100 + (unsigned)k;
            counted(&before, &grid);
            if (k == 0) {
                CUresult (*l)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, void *, void **, void **) = NULL;
                *(void **)&l = f;
                EXPECT_RC(l(NULL, x, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
            } else if (k == 1) {
                CUresult (*l)(const unsigned *, void *, void **, void **) = NULL;
                unsigned config[16] = {x, 1, 1, 32, 1, 1};
                *(void **)&l = f;
                EXPECT_RC(l(config, NULL, NULL, NULL), CUDA_SUCCESS);
            } else {
                CUresult (*l)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, void *, void **) = NULL;
                *(void **)&l = f;
                EXPECT_RC(l(NULL, x, 1, 1, 32, 1, 1, 0, NULL, NULL), CUDA_SUCCESS);
            }
            counted(&after, &grid);
            EXPECT_EQ(after, before + 1);
            EXPECT_EQ(grid, x);
        }
    return failures != 0;
}

static unsigned long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* Waits for the CLOCK_MONOTONIC time written in the file `go`, then until it; 0 if none came. */
static unsigned long long await_go(const char *go)
{
    unsigned long long t0 = 0;
    for (int i = 0; i < 20000 && t0 == 0; i++) {
        FILE *f = fopen(go, "r");
        if (f == NULL || fscanf(f, "%llu", &t0) != 1)
            t0 = 0;
        if (f != NULL)
            fclose(f);
        if (t0 == 0)
            usleep(500);
    }
    unsigned long long now = mono_ns();
    if (t0 > now)
        usleep((useconds_t)((t0 - now) / 1000));
    return t0;
}

/*
 * Keeps the GPU busy with kernels of PROBE_KERNEL_US microseconds (the fake
 * driver's FAKE_CUDA_GPU_FILE timeline), PROBE_BATCH at a time and then a
 * synchronisation (with PROBE_GRAPH, one graph of PROBE_BATCH kernel nodes
 * instead), from the CLOCK_MONOTONIC time written in the file PROBE_GO for
 * PROBE_SECONDS; prints the GPU time its kernels got in that window.
 */
static int cmd_share(void)
{
    CUcontext ctx;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL || setup(&ctx) != 0)
        return 1;
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void *, void **, void **) = NULL;
    CUresult (*add_kernel)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                           const void *) = NULL;
    CUresult (*gpu_time)(unsigned long long, unsigned long long, unsigned long long *) = NULL;
    *(void **)&launch = dlsym(h, "cuLaunchKernel");
    *(void **)&add_kernel = dlsym(h, "cuGraphAddKernelNode");
    *(void **)&gpu_time = dlsym(h, "fakeCudaGpuTime");
    const char *go = getenv("PROBE_GO");
    unsigned us = (unsigned)(env_mib("PROBE_KERNEL_US", 1000) / MIB);
    int batch = (int)(env_mib("PROBE_BATCH", 8) / MIB);
    uint64_t seconds = env_mib("PROBE_SECONDS", 2) / MIB;
    if (launch == NULL || add_kernel == NULL || gpu_time == NULL || go == NULL) {
        fail("the fake driver's timed kernels are missing, or PROBE_GO");
        return 1;
    }
    CUgraph g = NULL;
    CUgraphExec e = NULL;
    if (getenv("PROBE_GRAPH") != NULL) {
        struct {
            void *func;
            unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
            void **params, **extra;
        } kp = {NULL, us, 1, 1, 32, 1, 1, 0, NULL, NULL};
        CUgraphNode node;
        EXPECT_RC(A.cuGraphCreate(&g, 0), CUDA_SUCCESS);
        for (int i = 0; i < batch; i++)
            EXPECT_RC(add_kernel(&node, g, NULL, 0, &kp), CUDA_SUCCESS);
        EXPECT_RC(A.cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    }
    printf("ready\n");
    fflush(stdout);
    unsigned long long t0 = await_go(go), t1 = t0 + seconds * 1000000000ULL, now = mono_ns();
    while (now < t1) {
        if (e != NULL)
            EXPECT_RC(A.cuGraphLaunch(e, NULL), CUDA_SUCCESS);
        else
            for (int i = 0; i < batch; i++)
                EXPECT_RC(launch(NULL, us, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
        A.cuCtxSynchronize();
        now = mono_ns();
    }
    unsigned long long ns = 0;
    gpu_time(t0, t1, &ns);
    printf("gpu_ns=%llu\n", ns);
    return failures != 0;
}

/* Sparse arrays: no memory of their own; a handle mapped into a tile lives while it is mapped. */
static int cmd_sparse(void)
{
    CUcontext ctx;
    CUmemGenericAllocationHandle h;
    CUarray arr;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*map_array)(CUarrayMapInfo *, unsigned int, CUstream) = NULL;
    if (lib == NULL || setup(&ctx) != 0 || open_region() != 0)
        return 1;
    *(void **)&map_array = dlsym(lib, "cuMemMapArrayAsync");
    if (map_array == NULL) {
        fail("no cuMemMapArrayAsync");
        return 1;
    }
    uint64_t avail = limit_bytes - ctx_bytes, p0 = pool();
    /* 16384 x 16384 x 4 channels of float: 4 GiB by its dimensions, nothing of its own. */
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 16384,
                                 .Height = 16384,
                                 .Format = 0x20,
                                 .NumChannels = 4,
                                 .Flags = CUDA_ARRAY3D_SPARSE};
    EXPECT_RC(A.cuArray3DCreate_v2(&arr, &d), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_RC(make_handle(400 * MIB, &h), CUDA_SUCCESS);
    CUarrayMapInfo m;
    memset(&m, 0, sizeof(m));
    m.resource.array = arr;
    m.subresourceType = 0;
    m.subresource.sparseLevel.offsetX = 64; /* some tile */
    m.subresource.sparseLevel.extentWidth = 64;
    m.memOperationType = 1;
    m.memHandleType = 0;
    m.memHandle = h;
    EXPECT_RC(map_array(&m, 1, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 400 * MIB); /* the tile keeps it */
    EXPECT_EQ(pool(), p0 + 400 * MIB);
    if (fits(avail - 400 * MIB + MIB))
        fail("memory mapped into a sparse array was given back to the share");
    m.memOperationType = 2; /* unmap that tile */
    m.memHandle = 0;
    EXPECT_RC(map_array(&m, 1, NULL), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    /* Mapped again and released; destroying the array lets it go. */
    EXPECT_RC(make_handle(200 * MIB, &h), CUDA_SUCCESS);
    m.memOperationType = 1;
    m.memHandle = h;
    EXPECT_RC(map_array(&m, 1, NULL), CUDA_SUCCESS);
    EXPECT_RC(A.cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 200 * MIB);
    EXPECT_RC(A.cuArrayDestroy(arr), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/* ==== launches and modules (issue 25): local memory, old launches, drains, images ==== */

/* A driver function looked up the way PROBE_ROUTE says (dlsym, or cuGetProcAddress at 12040). */
static void *fn_by_route(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *f = NULL;
    const char *route = getenv("PROBE_ROUTE") ? getenv("PROBE_ROUTE") : "dlsym";
    CUresult (*gpa)(const char *, void **, int, cuuint64_t) = NULL;
    if (h == NULL)
        return NULL;
    if (strcmp(route, "proc") != 0)
        return dlsym(h, name);
    *(void **)&gpa = dlsym(h, "cuGetProcAddress");
    if (gpa == NULL || gpa(name, &f, 12040, 0) != CUDA_SUCCESS)
        return NULL;
    return f;
}

/* A not-driver function of the fake driver. */
static void *fake_fn(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h != NULL ? dlsym(h, name) : NULL;
}

typedef CUresult (*get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

static unsigned long long launches_now(void)
{
    CUresult (*counted)(unsigned long long *, unsigned int *) = NULL;
    unsigned long long n = 0;
    unsigned int grid;
    *(void **)&counted = fake_fn("fakeCudaLaunches");
    if (counted != NULL)
        counted(&n, &grid);
    return n;
}

/*
 * The launches from before CUDA 4.0 and the multi-device cooperative one
 * reach the library by dlsym and cuGetProcAddress, and the driver with
 * their grid.
 */
static int cmd_launch_old(void)
{
    CUcontext ctx;
    CUmodule m;
    CUfunction f;
    if (setup(&ctx) != 0)
        return 1;
    static const char *const names[] = {"cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync",
                                        "cuLaunchCooperativeKernelMultiDevice"};
    for (int k = 0; k < 4; k++) {
        void *fn = fn_by_route(names[k]);
        if (fn == NULL || strstr(owner_of(fn), "libkgpu-limit") == NULL)
            fail("%s is %s's, not the library's", names[k], fn ? owner_of(fn) : "nobody");
    }
    get_function_fn get = (get_function_fn)fn_by_route("cuModuleGetFunction");
    CUresult (*shape)(CUfunction, int, int, int) = NULL;
    CUresult (*l0)(CUfunction) = NULL;
    CUresult (*l1)(CUfunction, int, int) = NULL;
    CUresult (*l2)(CUfunction, int, int, CUstream) = NULL;
    *(void **)&shape = fn_by_route("cuFuncSetBlockShape");
    *(void **)&l0 = fn_by_route("cuLaunch");
    *(void **)&l1 = fn_by_route("cuLaunchGrid");
    *(void **)&l2 = fn_by_route("cuLaunchGridAsync");
    if (get == NULL || shape == NULL || l0 == NULL || l1 == NULL || l2 == NULL) {
        fail("the old launch functions are missing");
        return 1;
    }
    EXPECT_RC(A.cuModuleLoadData(&m, "KGPUFAKEMOD 2"), CUDA_SUCCESS);
    EXPECT_RC(get(&f, m, "k"), CUDA_SUCCESS);
    EXPECT_RC(l0(f), CUDA_ERROR_INVALID_VALUE); /* no block shape yet: the driver says so */
    EXPECT_RC(shape(f, 32, 1, 1), CUDA_SUCCESS);
    unsigned long long n = launches_now();
    EXPECT_RC(l0(f), CUDA_SUCCESS);
    EXPECT_RC(l1(f, 7, 1), CUDA_SUCCESS);
    EXPECT_RC(l2(f, 9, 1, NULL), CUDA_SUCCESS);
    EXPECT_EQ(launches_now(), n + 3);
    return failures != 0;
}

/*
 * A multi-device cooperative launch made while device 0's context is
 * current, with a part on device 1 (FAKE_CUDA_DEVICES=2): prints "ok" once
 * launched; test_shim checks that device 1's schedule was joined.
 */
static int cmd_multidev(void)
{
    CUcontext c0, c1;
    stream_t s0, s1;
    CUresult (*multi)(void *, unsigned, unsigned) = NULL;
    CUresult (*push)(CUcontext) = NULL, (*pop)(CUcontext *) = NULL;
    if (setup(&c0) != 0)
        return 1;
    *(void **)&multi = fn_by_route("cuLaunchCooperativeKernelMultiDevice");
    *(void **)&push = fn_by_route("cuCtxPushCurrent_v2");
    *(void **)&pop = fn_by_route("cuCtxPopCurrent_v2");
    if (multi == NULL || push == NULL || pop == NULL) {
        fail("no cuLaunchCooperativeKernelMultiDevice");
        return 1;
    }
    EXPECT_RC(A.cuStreamCreate(&s0, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuCtxCreate_v2(&c1, 0, 1), CUDA_SUCCESS); /* current now */
    EXPECT_RC(A.cuStreamCreate(&s1, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuCtxSetCurrent(c0), CUDA_SUCCESS);
    CUDA_LAUNCH_PARAMS p[2];
    memset(p, 0, sizeof(p));
    p[0].gridDimX = p[1].gridDimX = 10;
    p[0].blockDimX = p[1].blockDimX = 32;
    p[0].hStream = (CUstream)s0;
    p[1].hStream = (CUstream)s1;
    unsigned long long n = launches_now();
    EXPECT_RC(multi(p, 2, 0), CUDA_SUCCESS);
    EXPECT_EQ(launches_now(), n + 2);
    printf("ok\n");
    return failures != 0;
}

/*
 * Local memory grown at launch: a function needing 9216 bytes per thread
 * grows the stack reservation from 1024 by 8192 x 8192 resident threads
 * (64 MiB) on the fake driver; charged before the launch, refused past the
 * share, given back when cuCtxSetLimit resizes it or the context goes.
 */
static int cmd_lmem(void)
{
    CUcontext ctx, made;
    CUmodule m;
    CUfunction big, small, huge;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    get_function_fn get = (get_function_fn)fn_by_route("cuModuleGetFunction");
    launch_fn launch = (launch_fn)fn_by_route("cuLaunchKernel");
    if (get == NULL || launch == NULL) {
        fail("no cuModuleGetFunction or cuLaunchKernel");
        return 1;
    }
    EXPECT_RC(A.cuModuleLoadData(&m, "KGPUFAKEMOD 2"), CUDA_SUCCESS);
    uint64_t u0 = used(), p0 = pool();
    EXPECT_RC(get(&big, m, "kgpufake_local_9216"), CUDA_SUCCESS);
    EXPECT_RC(get(&small, m, "kgpufake_local_4096"), CUDA_SUCCESS);
    EXPECT_RC(get(&huge, m, "kgpufake_local_103424"), CUDA_SUCCESS); /* +800 MiB */
#define LAUNCH(fn) launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 64 * MIB);
    EXPECT_EQ(pool(), p0 + 64 * MIB);
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS); /* reserved already */
    EXPECT_RC(LAUNCH(small), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 64 * MIB);
    unsigned long long n = launches_now();
    EXPECT_RC(LAUNCH(huge), CUDA_ERROR_OUT_OF_MEMORY); /* past the share: never launched */
    EXPECT_EQ(launches_now(), n);
    EXPECT_EQ(used(), u0 + 64 * MIB);
    EXPECT_EQ(pool(), p0 + 64 * MIB);
    /* The stack limit is the same reservation: setting it resizes what launches grew. */
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0);
    EXPECT_EQ(pool(), p0);
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 5120), CUDA_SUCCESS); /* +32 MiB */
    EXPECT_EQ(used(), u0 + 32 * MIB);
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS); /* grows on from there */
    EXPECT_EQ(used(), u0 + 64 * MIB);
    EXPECT_EQ(pool(), p0 + 64 * MIB);
    /* Another context grows its own, and gives it back when it goes. */
    EXPECT_RC(A.cuCtxCreate_v2(&made, 0, 0), CUDA_SUCCESS);
    uint64_t u1 = used();
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS);
    EXPECT_EQ(used(), u1 + 64 * MIB);
    EXPECT_RC(A.cuCtxDestroy_v2(made), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 64 * MIB);
    EXPECT_EQ(pool(), p0 + 64 * MIB);
    /*
     * A context made again under the same handle (the fake driver reuses
     * the slot, as a driver may reuse an address) holds no local memory:
     * its launch is charged again, whatever the thread saw before.
     */
    CUcontext again;
    EXPECT_RC(A.cuCtxCreate_v2(&again, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(again == made, 1);
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS);
    EXPECT_EQ(used(), u1 + 64 * MIB);
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS); /* held now: nothing more */
    EXPECT_EQ(used(), u1 + 64 * MIB);
    EXPECT_RC(A.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024), CUDA_SUCCESS); /* shrunk: grown again */
    EXPECT_EQ(used(), u1);
    EXPECT_RC(LAUNCH(big), CUDA_SUCCESS);
    EXPECT_EQ(used(), u1 + 64 * MIB);
    EXPECT_RC(A.cuCtxDestroy_v2(again), CUDA_SUCCESS);
    EXPECT_EQ(used(), u0 + 64 * MIB);
#undef LAUNCH
    return failures != 0;
}

/* A driver without cuLibraryUnload (fake_cuda_nolibunload): a library past the share is kept. */
static int cmd_libunload_missing(void)
{
    CUcontext ctx;
    CUlibrary l;
    CUdeviceptr p;
    if (setup(&ctx) != 0 || open_region() != 0)
        return 1;
    if (A.cuLibraryLoadData == NULL || A.cuLibraryUnload != NULL) {
        fail("expected a driver with cuLibraryLoadData and without cuLibraryUnload");
        return 1;
    }
    uint64_t p0 = pool();
    /* 900 MiB where 724 are left: cannot be undone, so it is charged as held. */
    EXPECT_RC(A.cuLibraryLoadData(&l, "KGPUFAKEMOD 900", NULL, NULL, 0, NULL, NULL, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 900 * MIB);
    EXPECT_EQ(pool(), p0 + 900 * MIB);
    EXPECT_RC(A.cuMemAlloc_v2(&p, MIB), CUDA_ERROR_OUT_OF_MEMORY);
    return failures != 0;
}

/* A CUDA ELF of `text` bytes of code and `globals` bytes of NOBITS __device__ data, in buf. */
static size_t make_cubin(unsigned char *buf, size_t text, uint64_t globals)
{
    size_t shoff = 64 + text;
    memset(buf, 0, shoff + 3 * 64);
    memcpy(buf, "\x7f" "ELF", 4);
    buf[4] = 2; /* 64-bit */
    buf[5] = 1; /* little-endian */
    buf[6] = 1;
    uint16_t type = 2, machine = 190, ehsize = 64, shentsize = 64, shnum = 3;
    uint64_t off = shoff;
    memcpy(buf + 16, &type, 2);
    memcpy(buf + 18, &machine, 2);
    memcpy(buf + 40, &off, 8);
    memcpy(buf + 52, &ehsize, 2);
    memcpy(buf + 58, &shentsize, 2);
    memcpy(buf + 60, &shnum, 2);
    /* [0] null, [1] .text: PROGBITS, alloc + exec, [2] .nv.global: NOBITS, alloc + write */
    unsigned char *s1 = buf + shoff + 64, *s2 = buf + shoff + 128;
    uint32_t progbits = 1, nobits = 8;
    uint64_t f1 = 0x6, f2 = 0x3, o1 = 64, sz1 = text, al1 = 128, al2 = 16;
    memcpy(s1 + 4, &progbits, 4);
    memcpy(s1 + 8, &f1, 8);
    memcpy(s1 + 24, &o1, 8);
    memcpy(s1 + 32, &sz1, 8);
    memcpy(s1 + 48, &al1, 8);
    memcpy(s2 + 4, &nobits, 4);
    memcpy(s2 + 8, &f2, 8);
    memcpy(s2 + 24, &off, 8);
    memcpy(s2 + 32, &globals, 8);
    memcpy(s2 + 48, &al2, 8);
    return shoff + 3 * 64;
}

/*
 * Module images the library can read are charged their estimate before the
 * driver is called, so one that cannot fit never reaches the driver (no
 * moment past the share); one that fits is settled to what the driver took.
 */
static int cmd_modimage(void)
{
    CUcontext ctx;
    CUmodule m;
    static unsigned char img[64 + 65536 + 3 * 64], fat[16 + 16 + sizeof(img)];
    char path[] = "/tmp/kgpu-probe-cubin-XXXXXX";
    CUresult (*loads)(unsigned long long *) = NULL;
    *(void **)&loads = fake_fn("fakeCudaModuleLoads");
    if (setup(&ctx) != 0 || open_region() != 0 || loads == NULL)
        return 1;
    unsigned long long n0 = 0, n1 = 0;
    uint64_t p0 = pool();
    /* 64 KiB of code and 100 MiB of globals: the fake driver takes them in 64 KiB pages. */
    size_t len = make_cubin(img, 65536, 100 * MIB);
    EXPECT_RC(A.cuModuleLoadData(&m, img), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 100 * MIB + 65536); /* settled to the measured drop */
    EXPECT_EQ(pool(), p0 + 100 * MIB + 65536);
    EXPECT_RC(A.cuModuleUnload(m), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    /* 800 MiB of globals where 724 MiB are left: refused before the driver sees it. */
    make_cubin(img, 65536, 800 * MIB);
    loads(&n0);
    EXPECT_RC(A.cuModuleLoadData(&m, img), CUDA_ERROR_OUT_OF_MEMORY);
    loads(&n1);
    EXPECT_EQ(n1, n0);
    EXPECT_EQ(used(), ctx_bytes);
    /* The same from a file. */
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, img, len) != (ssize_t)len) {
        fail("cannot write %s", path);
        return 1;
    }
    close(fd);
    EXPECT_RC(A.cuModuleLoad(&m, path), CUDA_ERROR_OUT_OF_MEMORY);
    unlink(path);
    /* And inside a fatbinary (one cubin entry). */
    uint32_t magic = 0xBA55ED50u, ehsize = 16;
    uint16_t version = 1, hsize = 16, entry_kind = 2;
    uint64_t fsize = 16 + len, psize = len;
    memcpy(fat, &magic, 4);
    memcpy(fat + 4, &version, 2);
    memcpy(fat + 6, &hsize, 2);
    memcpy(fat + 8, &fsize, 8);
    memcpy(fat + 16, &entry_kind, 2);
    memcpy(fat + 20, &ehsize, 4);
    memcpy(fat + 24, &psize, 8);
    memcpy(fat + 32, img, len);
    EXPECT_RC(A.cuModuleLoadData(&m, fat), CUDA_ERROR_OUT_OF_MEMORY);
    loads(&n1);
    EXPECT_EQ(n1, n0);
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/* An entry of a fatbinary as nvcc writes it (64-byte header); usize != 0: compressed. */
typedef struct fat_entry {
    uint16_t kind; /* 1 PTX, 2 cubin */
    uint32_t arch; /* 80 for sm_80 */
    uint64_t flags, usize;
    const void *data;
    size_t len;
} fat_entry;

/* A fatbinary of n entries in buf; returns its size. */
static size_t make_fatbin(unsigned char *buf, const fat_entry *e, int n)
{
    size_t at = 16;
    for (int i = 0; i < n; i++) {
        uint64_t padded = (e[i].len + 7) / 8 * 8, flags = e[i].flags | 0x11; /* 64-bit, Linux */
        uint32_t ehsize = 64, csize = e[i].usize != 0 ? (uint32_t)e[i].len : 0;
        uint16_t version = 0x0101;
        memset(buf + at, 0, 64 + padded);
        memcpy(buf + at, &e[i].kind, 2);
        memcpy(buf + at + 2, &version, 2);
        memcpy(buf + at + 4, &ehsize, 4);
        memcpy(buf + at + 8, &padded, 8);
        memcpy(buf + at + 16, &csize, 4);
        memcpy(buf + at + 28, &e[i].arch, 4);
        memcpy(buf + at + 40, &flags, 8);
        memcpy(buf + at + 56, &e[i].usize, 8);
        memcpy(buf + at + 64, e[i].data, e[i].len);
        at += 64 + padded;
    }
    uint32_t magic = 0xBA55ED50u;
    uint16_t version = 1, hsize = 16;
    uint64_t fsize = at - 16;
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &version, 2);
    memcpy(buf + 6, &hsize, 2);
    memcpy(buf + 8, &fsize, 8);
    return at;
}

/* PTX as nvcc writes it: `globals` bytes of a __device__ array and one kernel. */
static const char *make_ptx(char *buf, size_t cap, uint64_t globals)
{
    snprintf(buf, cap,
             "//\n// Generated by a compiler\n//\n\n.version 8.0\n.target sm_80\n"
             ".address_size 64\n\n.visible .global .align 16 .b8 table[%llu];\n\n"
             ".visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\tret;\n\n}\n",
             (unsigned long long)globals);
    return buf;
}

static unsigned long long loads_now(void)
{
    CUresult (*loads)(unsigned long long *) = NULL;
    unsigned long long n = 0;
    *(void **)&loads = fake_fn("fakeCudaModuleLoads");
    if (loads != NULL)
        loads(&n);
    return n;
}

/* The most the fake device gave out since the previous call (it keeps the peak). */
static unsigned long long peak_now(void)
{
    CUresult (*peak)(int, unsigned long long *) = NULL;
    unsigned long long p = 0;
    *(void **)&peak = fake_fn("fakeCudaPoolPeak");
    if (peak != NULL)
        peak(0, &p);
    return p;
}

/*
 * `call` is refused before the driver sees the image: no load reached the
 * fake driver, and its memory never went past what it was, not even for
 * the moment a measurement after the load would have taken.
 */
#define EXPECT_REFUSED(call)                                                                       \
    do {                                                                                           \
        unsigned long long loads_ = loads_now(), pool_ = pool();                                   \
        peak_now();                                                                                \
        EXPECT_RC(call, CUDA_ERROR_OUT_OF_MEMORY);                                                 \
        EXPECT_EQ(loads_now(), loads_);                                                            \
        EXPECT_EQ(peak_now(), pool_);                                                              \
        EXPECT_EQ(used(), ctx_bytes);                                                              \
    } while (0)

/*
 * PTX and compressed fatbinary entries are estimated before the load
 * too (issue 25), with a share of 1024 MiB: 724 are left after the
 * context. What fits is loaded and settled to what the driver took; what
 * cannot fit never reaches it.
 */
static int cmd_modimage_jit(void)
{
    CUcontext ctx;
    CUmodule m;
    CUlibrary l;
    static char text[1024];
    static unsigned char img[64 + 65536 + 3 * 64], fat[2 * sizeof(img) + 2048];
    char path[] = "/tmp/kgpu-probe-ptx-XXXXXX";
    if (setup(&ctx) != 0 || open_region() != 0 || fake_fn("fakeCudaPoolPeak") == NULL ||
        fake_fn("fakeCudaModuleLoads") == NULL)
        return 1;
    uint64_t p0 = pool();
    /* PTX with 100 MiB of globals: compiled and loaded, charged what the driver took. */
    EXPECT_RC(A.cuModuleLoadData(&m, make_ptx(text, sizeof(text), 100 * MIB)), CUDA_SUCCESS);
    EXPECT_EQ(pool() > p0 + 100 * MIB, 1);
    EXPECT_EQ(used(), ctx_bytes + (pool() - p0));
    EXPECT_RC(A.cuModuleUnload(m), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
    /* 800 MiB of globals: refused before the driver compiles it, as a module or a library. */
    make_ptx(text, sizeof(text), 800 * MIB);
    EXPECT_REFUSED(A.cuModuleLoadData(&m, text));
    if (A.cuLibraryLoadData != NULL)
        EXPECT_REFUSED(A.cuLibraryLoadData(&l, text, NULL, NULL, 0, NULL, NULL, 0));
    /* The same from a file. */
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        fail("cannot write %s", path);
        return 1;
    }
    close(fd);
    EXPECT_REFUSED(A.cuModuleLoad(&m, path));
    unlink(path);
    /* As a fatbinary's PTX entry. */
    fat_entry e[2] = {{.kind = 1, .arch = 80, .data = text, .len = strlen(text) + 1}};
    make_fatbin(fat, e, 1);
    EXPECT_REFUSED(A.cuModuleLoadData(&m, fat));
    /* Beside a cubin built for the device (8.0) the driver compiles no PTX: the cubin counts. */
    size_t len = make_cubin(img, 65536, 100 * MIB);
    e[1] = e[0];
    e[0] = (fat_entry){.kind = 2, .arch = 80, .data = img, .len = len};
    make_fatbin(fat, e, 2);
    EXPECT_RC(A.cuModuleLoadData(&m, fat), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 100 * MIB + 65536);
    EXPECT_RC(A.cuModuleUnload(m), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes);
#ifdef KGPU_MODIMAGE_DECODE
    /* Compressed cubins (Zstandard, and LZ4 as older nvcc wrote) of 800 MiB of globals. */
    static unsigned char z[sizeof(img) + 1024];
    len = make_cubin(img, 65536, 800 * MIB);
    size_t zlen = ZSTD_compress(z, sizeof(z), img, len, 3);
    if (ZSTD_isError(zlen)) {
        fail("ZSTD_compress: %s", ZSTD_getErrorName(zlen));
        return 1;
    }
    e[0] = (fat_entry){
        .kind = 2, .arch = 80, .flags = 0x8000, .usize = len, .data = z, .len = zlen};
    make_fatbin(fat, e, 1);
    EXPECT_REFUSED(A.cuModuleLoadData(&m, fat));
    int llen = LZ4_compress_default((const char *)img, (char *)z, (int)len, (int)sizeof(z));
    e[0] = (fat_entry){
        .kind = 2, .arch = 80, .flags = 0x2000, .usize = len, .data = z, .len = (size_t)llen};
    make_fatbin(fat, e, 1);
    EXPECT_REFUSED(A.cuModuleLoadData(&m, fat));
    /* One of 100 MiB fits: loaded, and settled to what the driver took. */
    len = make_cubin(img, 65536, 100 * MIB);
    zlen = ZSTD_compress(z, sizeof(z), img, len, 3);
    e[0] = (fat_entry){
        .kind = 2, .arch = 80, .flags = 0x8000, .usize = len, .data = z, .len = zlen};
    make_fatbin(fat, e, 1);
    EXPECT_RC(A.cuModuleLoadData(&m, fat), CUDA_SUCCESS);
    EXPECT_EQ(used(), ctx_bytes + 100 * MIB + 65536);
    EXPECT_RC(A.cuModuleUnload(m), CUDA_SUCCESS);
#endif
    EXPECT_EQ(used(), ctx_bytes);
    EXPECT_EQ(pool(), p0);
    return failures != 0;
}

/* ==== end of the launches and modules block ==== */

/* ---- compute shares: a training step (probe step) ---- */

/*
 * An ordinary training step, over and over: PROBE_BATCH (25) kernels of
 * PROBE_KERNEL_US (2000) microseconds queued on a stream, then
 * cuStreamSynchronize on it; with PROBE_GRAPH, the step is one graph of
 * those kernels launched on the stream. With FAKE_CUDA_QUEUE_MS past the
 * step, the whole step is queued at once and the process then waits in the
 * synchronisation, as with a real launch queue. With PROBE_TWO_CTX, the
 * step's kernels run in a second context of the process while the thread
 * goes on in its first (see below). From the time in PROBE_GO for
 * PROBE_SECONDS; prints the GPU time its kernels got.
 */
static int cmd_step(void)
{
    CUcontext ctx;
    stream_t st = NULL;
    if (setup(&ctx) != 0)
        return 1;
    launch_fn launch = (launch_fn)fn_by_route("cuLaunchKernel");
    CUresult (*add_kernel)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                           const void *) = NULL;
    CUresult (*gpu_time)(unsigned long long, unsigned long long, unsigned long long *) = NULL;
    *(void **)&add_kernel = fn_by_route("cuGraphAddKernelNode");
    *(void **)&gpu_time = fake_fn("fakeCudaGpuTime");
    const char *go = getenv("PROBE_GO");
    unsigned us = (unsigned)(env_mib("PROBE_KERNEL_US", 2000) / MIB);
    int batch = (int)(env_mib("PROBE_BATCH", 25) / MIB);
    uint64_t seconds = env_mib("PROBE_SECONDS", 2) / MIB;
    if (launch == NULL || add_kernel == NULL || gpu_time == NULL || go == NULL) {
        fail("the fake driver's timed kernels are missing, or PROBE_GO");
        return 1;
    }
    EXPECT_RC(A.cuStreamCreate(&st, 0), CUDA_SUCCESS);
    CUgraph g = NULL;
    CUgraphExec e = NULL;
    if (getenv("PROBE_GRAPH") != NULL) {
        struct {
            void *func;
            unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
            void **params, **extra;
        } kp = {NULL, us, 1, 1, 32, 1, 1, 0, NULL, NULL};
        CUgraphNode node;
        EXPECT_RC(A.cuGraphCreate(&g, 0), CUDA_SUCCESS);
        for (int i = 0; i < batch; i++)
            EXPECT_RC(add_kernel(&node, g, NULL, 0, &kp), CUDA_SUCCESS);
        EXPECT_RC(A.cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    }
    CUcontext work = NULL;
    if (getenv("PROBE_TWO_CTX") != NULL) {
        EXPECT_RC(A.cuCtxCreate_v2(&work, 0, 0), CUDA_SUCCESS);
        EXPECT_RC(A.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    }
    printf("ready\n");
    fflush(stdout);
    unsigned long long t0 = await_go(go), t1 = t0 + seconds * 1000000000ULL;
    while (work != NULL && mono_ns() < t1) {
        /*
         * The step's kernels go to context `work`; the thread then goes on
         * in its own context with launches that take no GPU time (a
         * library's bookkeeping kernels, say) while they run, and waits
         * for them at the step's end. Its turn ends at one of those
         * launches, where the current context has nothing queued.
         */
        EXPECT_RC(A.cuCtxSetCurrent(work), CUDA_SUCCESS);
        for (int i = 0; i < batch; i++)
            EXPECT_RC(launch(NULL, us, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
        EXPECT_RC(A.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        unsigned long long step_end = mono_ns() + (unsigned long long)batch * us * 1000ULL;
        while (mono_ns() < step_end) {
            EXPECT_RC(launch(NULL, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
            usleep(500);
        }
        EXPECT_RC(A.cuCtxSetCurrent(work), CUDA_SUCCESS);
        EXPECT_RC(A.cuCtxSynchronize(), CUDA_SUCCESS);
        EXPECT_RC(A.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    }
    while (work == NULL && mono_ns() < t1) {
        if (e != NULL)
            EXPECT_RC(A.cuGraphLaunch(e, st), CUDA_SUCCESS);
        else
            for (int i = 0; i < batch; i++)
                EXPECT_RC(launch(NULL, us, 1, 1, 32, 1, 1, 0, (CUstream)st, NULL, NULL), CUDA_SUCCESS);
        EXPECT_RC(A.cuStreamSynchronize(st), CUDA_SUCCESS);
    }
    unsigned long long ns = 0;
    gpu_time(t0, t1, &ns);
    printf("gpu_ns=%llu\n", ns);
    return failures != 0;
}

/*
 * A training loop that records its step as a CUDA graph, in the default
 * (global) capture mode, while its container takes turns. Each round
 * captures PROBE_BATCH (20) kernels of 1 ms, a millisecond apart (longer
 * than a 30 % slice), and meanwhile launches as many kernels of 1 ms into
 * a second stream, which run and pass the gate: when a turn ends there,
 * the library's drain must not break the capture. Then it instantiates and
 * runs the graph. With PROBE_CAPTURE_ONLY it only captures (no second
 * stream, the graphs never run): nothing it launches runs, so it never has
 * to wait for a turn; PROBE_CAPTURE_BESIDE too puts the second stream's
 * kernels back, which run while a capture is always under way. Prints how
 * many captures ended and how many the driver invalidated.
 */
static int cmd_capture(void)
{
    CUcontext ctx;
    stream_t st = NULL;
    if (setup(&ctx) != 0)
        return 1;
    launch_fn launch = (launch_fn)fn_by_route("cuLaunchKernel");
    const char *go = getenv("PROBE_GO");
    int batch = (int)(env_mib("PROBE_BATCH", 20) / MIB);
    uint64_t seconds = env_mib("PROBE_SECONDS", 2) / MIB;
    if (launch == NULL || go == NULL) {
        fail("no cuLaunchKernel, or PROBE_GO");
        return 1;
    }
    int only = getenv("PROBE_CAPTURE_ONLY") != NULL;
    int beside_too = !only || getenv("PROBE_CAPTURE_BESIDE") != NULL;
    stream_t beside = NULL;
    EXPECT_RC(A.cuStreamCreate(&st, 0), CUDA_SUCCESS);
    EXPECT_RC(A.cuStreamCreate(&beside, 0), CUDA_SUCCESS);
    printf("ready\n");
    fflush(stdout);
    unsigned long long t1 = await_go(go) + seconds * 1000000000ULL;
    int ended = 0, invalidated = 0;
    while (mono_ns() < t1) {
        CUgraph g = NULL;
        CUgraphExec e = NULL;
        EXPECT_RC(A.cuStreamBeginCapture_v2(st, 0), CUDA_SUCCESS);
        for (int i = 0; i < batch; i++) {
            EXPECT_RC(launch(NULL, 1000, 1, 1, 32, 1, 1, 0, (CUstream)st, NULL, NULL), CUDA_SUCCESS);
            if (beside_too)
                EXPECT_RC(launch(NULL, 1000, 1, 1, 32, 1, 1, 0, (CUstream)beside, NULL, NULL),
                          CUDA_SUCCESS);
            usleep(1000);
        }
        CUresult r = A.cuStreamEndCapture(st, &g);
        ended++;
        if (r != CUDA_SUCCESS) {
            invalidated++;
            continue;
        }
        if (only) {
            A.cuGraphDestroy(g);
            continue;
        }
        EXPECT_RC(A.cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
        EXPECT_RC(A.cuGraphLaunch(e, st), CUDA_SUCCESS);
        EXPECT_RC(A.cuStreamSynchronize(st), CUDA_SUCCESS);
        A.cuGraphExecDestroy(e);
        A.cuGraphDestroy(g);
    }
    printf("captures=%d invalidated=%d\n", ended, invalidated);
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
             : strcmp(cmd, "ctxcharge") == 0 ? cmd_ctxcharge()
             : strcmp(cmd, "info") == 0   ? cmd_info()
             : strcmp(cmd, "nvml") == 0   ? cmd_nvml()
             : strcmp(cmd, "tamper") == 0 ? cmd_tamper()
             : strcmp(cmd, "fork") == 0   ? cmd_fork()
             : strcmp(cmd, "hold") == 0   ? cmd_hold()
             : strcmp(cmd, "race") == 0   ? cmd_race()
             : strcmp(cmd, "vmm") == 0    ? cmd_vmm()
             : strcmp(cmd, "vmm-import") == 0 ? cmd_vmm_import()
             : strcmp(cmd, "pool") == 0       ? cmd_pool()
             : strcmp(cmd, "hold-pool") == 0  ? cmd_hold_pool()
             : strcmp(cmd, "pool-beside") == 0 ? cmd_pool_beside()
             : strcmp(cmd, "graph") == 0      ? cmd_graph()
             : strcmp(cmd, "limits") == 0     ? cmd_limits()
             : strcmp(cmd, "modules") == 0    ? cmd_modules()
             : strcmp(cmd, "v1") == 0         ? cmd_v1()
             : strcmp(cmd, "quiet-fork") == 0 ? cmd_quiet_fork()
             : strcmp(cmd, "loader") == 0     ? cmd_loader()
             : strcmp(cmd, "deepbind") == 0   ? cmd_deepbind()
             : strcmp(cmd, "dlmopen") == 0    ? cmd_dlmopen()
             : strcmp(cmd, "launch") == 0     ? cmd_launch()
             : strcmp(cmd, "share") == 0      ? cmd_share()
             : strcmp(cmd, "step") == 0       ? cmd_step()
             : strcmp(cmd, "capture") == 0    ? cmd_capture()
             : strcmp(cmd, "sparse") == 0     ? cmd_sparse()
             : strcmp(cmd, "launch-old") == 0 ? cmd_launch_old()
             : strcmp(cmd, "multidev") == 0   ? cmd_multidev()
             : strcmp(cmd, "lmem") == 0       ? cmd_lmem()
             : strcmp(cmd, "libunload-missing") == 0 ? cmd_libunload_missing()
             : strcmp(cmd, "modimage") == 0   ? cmd_modimage()
             : strcmp(cmd, "modimage-jit") == 0 ? cmd_modimage_jit()
             : strcmp(cmd, "outlive") == 0    ? cmd_outlive()
             : strcmp(cmd, "graph-upload") == 0 ? cmd_graph_upload()
             : strcmp(cmd, "multicast") == 0  ? cmd_multicast()
             : strcmp(cmd, "export-dup") == 0 ? cmd_export_dup()
             : strcmp(cmd, "ipc") == 0        ? cmd_ipc()
             : strcmp(cmd, "ipc-open") == 0   ? cmd_ipc_open()
                                              : 2;
    return rc;
}
