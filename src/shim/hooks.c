/*
 * The hooks of libkgpu-limit.so for what every CUDA program does (listed in
 * hooks.def): cuInit, the share as the application sees it, contexts,
 * counted allocations and frees, their pre-3.2 entry points, and NVML's
 * memory figures. Each counted call is charged before the driver is called
 * and settled after (charge.c); over the limit it returns
 * CUDA_ERROR_OUT_OF_MEMORY and nothing else happens. Destroying a context
 * gives back everything that died with it.
 *
 * Every hook starts with KGPU_ENTER: without limits it calls the driver and
 * nothing more; with unusable limits it refuses.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "compat.h"
#include "hooks.h"

/* ---- initialisation ---- */

CUresult cuInit(unsigned int flags)
{
    KGPU_ENTER(cuInit, (flags));
    CUresult r = real_(flags);
    if (r == CUDA_SUCCESS) {
        kgpu__map_devices();
        /* The driver's descriptors are open: children forked from now on hold them too. */
        kgpu_shim_region_client(kgpu__shim.region);
    }
    return r;
}

/* ---- the share as the application sees it ---- */

static uint64_t used_on(int li)
{
    uint64_t lim = kgpu__limit(li),
             used = li >= 0 ? kgpu_shim_region_used(kgpu__shim.region, li) : 0;
    return used < lim ? used : lim;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    KGPU_ENTER(cuMemGetInfo_v2, (free, total));
    kgpu_where w;
    CUresult r = real_(free, total);
    if (r != CUDA_SUCCESS || (r = kgpu__where_current(&w)) != CUDA_SUCCESS)
        return r;
    uint64_t lim = kgpu__limit(w.li), avail = lim - used_on(w.li);
    /* Never more than the card really has free: other tenants may be using it. */
    if (free != NULL && avail < *free)
        *free = (size_t)avail;
    if (total != NULL && lim < *total)
        *total = (size_t)lim;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    KGPU_ENTER(cuDeviceTotalMem_v2, (bytes, dev));
    CUresult r = real_(bytes, dev);
    uint64_t lim = kgpu__limit(kgpu__dev_index(dev));
    if (r == CUDA_SUCCESS && bytes != NULL && lim < *bytes)
        *bytes = (size_t)lim;
    return r;
}

/* ---- contexts: charged what the driver reports they take ---- */

/*
 * A context's footprint (its code, stacks, heaps, the driver's own
 * reservations) shows in no argument, and differs by GPU, driver and
 * settings (about 300 MiB to over 500 on current ones). So it is measured:
 * the device's free memory just before and just after the driver makes the
 * context, by one source for both ends — NVML's device memory figures
 * where libnvidia-ml.so.1 is there (the only way before a process has a
 * context, since cuMemGetInfo needs one), else cuMemGetInfo in a context
 * already current on that device. Before the driver is called the context
 * is charged the configured figure, so the limit is checked first; after,
 * the charge becomes what was measured. A measurement outside
 * [KGPU_SHIM_CONTEXT_MIN_MIB, KGPU_SHIM_CONTEXT_MAX_MIB] (a neighbour
 * allocating or freeing on the GPU at that moment) is not believed: the
 * configured figure stays. KGPU_CONTEXT_MIB is a floor for both.
 */

/* How a context's footprint is measured: filled by ctx_before, read by ctx_footprint. */
typedef struct ctx_probe {
    int how; /* 0: by a twin (below); 1: NVML's free memory; 2: cuMemGetInfo in a context */
    uint64_t free;
    nvmlDevice_t nvml;
    CUdevice dev;
} ctx_probe;

static pthread_once_t ctx_nvml_once = PTHREAD_ONCE_INIT;
static _Atomic int ctx_nvml_ok;

/*
 * NVML as the measurement uses it: the copy in the driver's own folder,
 * beside the libcuda.so.1 loaded, never one found along the search path
 * (a tenant's own libnvidia-ml.so.1 first on LD_LIBRARY_PATH could report
 * any figures it liked, and so buy memory). The application's NVML calls
 * still go to whichever copy it loaded (kgpu__shim.nvml_lib): its device
 * handles belong to that copy.
 */
static struct {
    kgpu__pfn_nvmlInit_v2 init;
    kgpu__pfn_nvmlDeviceGetHandleByUUID by_uuid;
    kgpu__pfn_nvmlDeviceGetMemoryInfo meminfo;
} ctx_nvml;

/* The driver's folder's libnvidia-ml.so.1, or NULL. */
static void *driver_folder_nvml(void)
{
    struct link_map *lm = NULL;
    char path[4096];
    if (kgpu__shim.cuda_lib == NULL || dlinfo(kgpu__shim.cuda_lib, RTLD_DI_LINKMAP, &lm) != 0 ||
        lm == NULL || lm->l_name == NULL)
        return NULL;
    const char *slash = strrchr(lm->l_name, '/');
    if (slash == NULL)
        return NULL; /* no folder known: not measured by NVML */
    int n = snprintf(path, sizeof(path), "%.*s/libnvidia-ml.so.1", (int)(slash - lm->l_name),
                     lm->l_name);
    if (n < 0 || (size_t)n >= sizeof(path))
        return NULL;
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void ctx_nvml_init(void)
{
    void *h = driver_folder_nvml();
    kgpu__dlsym_fn sym = kgpu__real_dlsym();
    if (h == NULL || sym == NULL)
        return;
    *(void **)&ctx_nvml.init = sym(h, "nvmlInit_v2");
    *(void **)&ctx_nvml.by_uuid = sym(h, "nvmlDeviceGetHandleByUUID");
    *(void **)&ctx_nvml.meminfo = sym(h, "nvmlDeviceGetMemoryInfo");
    /* Initialised once and never shut down: NVML counts its users, the application's stay even. */
    atomic_store(&ctx_nvml_ok, ctx_nvml.init != NULL && ctx_nvml.by_uuid != NULL &&
                                   ctx_nvml.meminfo != NULL && ctx_nvml.init() == NVML_SUCCESS);
}

static int nvml_free(nvmlDevice_t h, uint64_t *free)
{
    nvmlMemory_t m;
    if (ctx_nvml.meminfo(h, &m) != NVML_SUCCESS)
        return -1;
    *free = m.free;
    return 0;
}

/* Free memory of ctx's device by cuMemGetInfo, ctx made current for the call. */
static int cuda_free(CUcontext ctx, uint64_t *free)
{
    kgpu__pfn_cuCtxPushCurrent_v2 push = KGPU_REAL(cuCtxPushCurrent_v2);
    kgpu__pfn_cuCtxPopCurrent_v2 pop = KGPU_REAL(cuCtxPopCurrent_v2);
    CUcontext popped;
    size_t f = 0, total = 0;
    if (push == NULL || pop == NULL || push(ctx) != CUDA_SUCCESS)
        return -1;
    CUresult r = KGPU_REAL(cuMemGetInfo_v2)(&f, &total);
    pop(&popped);
    *free = f;
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* Before a context is made on dev (limits index li): the free memory, and by what means. */
static void ctx_before(CUdevice dev, int li, ctx_probe *p)
{
    p->how = 0;
    p->dev = dev;
    if (li >= 0 && li < kgpu__shim.limits.ndevices) {
        pthread_once(&ctx_nvml_once, ctx_nvml_init);
        const char *u = kgpu__shim.limits.dev[li].uuid;
        char uuid[KGPU_SHIM_UUID_MAX + 8];
        /* NVML wants the prefix, which a limits file may leave out. */
        snprintf(uuid, sizeof(uuid), "%s%s",
                 strncmp(u, "GPU-", 4) == 0 || strncmp(u, "MIG-", 4) == 0 ? "" : "GPU-", u);
        if (atomic_load(&ctx_nvml_ok) &&
            ctx_nvml.by_uuid(uuid, &p->nvml) == NVML_SUCCESS &&
            nvml_free(p->nvml, &p->free) == 0) {
            p->how = 1;
            return;
        }
    }
    kgpu_where w;
    if (kgpu__where_current(&w) == CUDA_SUCCESS && w.ctx != NULL && w.dev == dev &&
        cuda_free(w.ctx, &p->free) == 0)
        p->how = 2;
}

/*
 * Without NVML, a first context on its device has nothing to measure it
 * with before it exists (cuMemGetInfo needs a context). Once it exists, a
 * throwaway twin on the same device is measured instead: the free memory
 * in `made`, then in the twin just made, which is destroyed again. The
 * twin's footprint stands for the first's. 0 measured (*took set), or -1.
 */
static int twin_footprint(CUcontext made, CUdevice dev, uint64_t *took)
{
    kgpu__pfn_cuCtxCreate_v2 create = KGPU_REAL(cuCtxCreate_v2);
    kgpu__pfn_cuCtxDestroy_v2 destroy = KGPU_REAL(cuCtxDestroy_v2);
    kgpu__pfn_cuCtxPopCurrent_v2 pop = KGPU_REAL(cuCtxPopCurrent_v2);
    uint64_t before, after;
    CUcontext twin = NULL, popped;
    size_t f = 0, total = 0;
    if (create == NULL || destroy == NULL || pop == NULL || cuda_free(made, &before) != 0 ||
        create(&twin, 0, dev) != CUDA_SUCCESS)
        return -1;
    CUresult r = KGPU_REAL(cuMemGetInfo_v2)(&f, &total); /* the twin is current */
    pop(&popped); /* as it was before; destroying a current context would pop it too */
    destroy(twin);
    after = f;
    if (r != CUDA_SUCCESS || after >= before)
        return -1;
    *took = before - after;
    return 0;
}

/* The charge for `made`, measured by the same means as p (measured: set when it was). */
static uint64_t ctx_footprint(const ctx_probe *p, CUcontext made, int *measured)
{
    uint64_t after = 0, took = 0, floor = kgpu__shim.context_floor;
    int ok = p->how == 1 ? nvml_free(p->nvml, &after) == 0
             : p->how == 2 ? cuda_free(made, &after) == 0
                           : 0;
    if (ok && after < p->free)
        took = p->free - after;
    if (p->how == 0 && twin_footprint(made, p->dev, &took) != 0)
        took = 0;
    *measured = took >= (uint64_t)KGPU_SHIM_CONTEXT_MIN_MIB << 20 &&
                took <= (uint64_t)KGPU_SHIM_CONTEXT_MAX_MIB << 20;
    if (!*measured)
        return kgpu__shim.context_bytes;
    return took > floor ? took : floor;
}

/*
 * A context was made under a charge of `est` on li: the charge becomes
 * `fp`. CUDA_ERROR_OUT_OF_MEMORY when the difference does not fit the
 * limit; then nothing stays charged and the caller undoes the context.
 */
static CUresult recharge(int li, uint64_t est, uint64_t fp)
{
    if (fp < est) {
        kgpu__uncharge(li, est - fp);
    } else if (kgpu__charge(li, fp - est) != CUDA_SUCCESS) {
        kgpu__uncharge(li, est);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* After the driver answered a context creation charged context_bytes, measured from p. */
static CUresult ctx_created(CUresult r, CUcontext *pctx, int li, const ctx_probe *p)
{
    /* The footprint dies with the context: recorded by its key, under no context. */
    kgpu_where w = {.li = li, .ctx = NULL};
    uint64_t est = kgpu__shim.context_bytes, fp = est;
    int measured;
    if (r == CUDA_SUCCESS) {
        fp = ctx_footprint(p, *pctx, &measured);
        if (recharge(li, est, fp) != CUDA_SUCCESS) {
            KGPU_REAL(cuCtxDestroy_v2)(*pctx);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    return kgpu__settle(r, KGPU_TRACK_CTX, r == CUDA_SUCCESS ? (uintptr_t)*pctx : 0, fp, &w);
}

/* The body of every cuCtxCreate hook: `call` makes the context. */
#define CTX_CREATE(call)                                                                           \
    int li = kgpu__dev_index(dev);                                                                 \
    ctx_probe probe_;                                                                         \
    CHARGE_OR_RETURN(li, kgpu__shim.context_bytes);                                                \
    ctx_before(dev, li, &probe_);                                                            \
    return ctx_created(call, pctx, li, &probe_)

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    KGPU_ENTER(cuCtxCreate_v2, (pctx, flags, dev));
    CTX_CREATE(real_(pctx, flags, dev));
}

CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    KGPU_ENTER(cuCtxCreate_v3, (pctx, paramsArray, numParams, flags, dev));
    CTX_CREATE(real_(pctx, paramsArray, numParams, flags, dev));
}

CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    KGPU_ENTER(cuCtxCreate_v4, (pctx, ctxCreateParams, flags, dev));
    CTX_CREATE(real_(pctx, ctxCreateParams, flags, dev));
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    KGPU_ENTER(cuCtxDestroy_v2, (ctx));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_CTX, (uintptr_t)ctx, &rec);
    CUresult r = kgpu__settle_free(real_(ctx), had, &rec);
    if (r == CUDA_SUCCESS)
        kgpu__drop_ctx(ctx);
    return r;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    KGPU_ENTER(cuDevicePrimaryCtxRetain, (pctx, dev));
    if (dev < 0 || dev >= KGPU_SHIM_MAX_CUDA_DEVICES)
        return real_(pctx, dev); /* the driver says what is wrong with it */
    int li = kgpu__dev_index(dev);
    uint64_t est = kgpu__shim.context_bytes;
    ctx_probe probe;
    pthread_mutex_lock(&kgpu__shim.prim_mu);
    int first = kgpu__shim.primary[dev].refs == 0;
    CUresult r = first ? kgpu__charge(li, est) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        if (first)
            ctx_before(dev, li, &probe);
        r = real_(pctx, dev);
        if (r == CUDA_SUCCESS && first) {
            int measured;
            uint64_t fp = ctx_footprint(&probe, *pctx, &measured);
            if (recharge(li, est, fp) == CUDA_SUCCESS) {
                kgpu__shim.primary[dev].bytes = fp;
            } else {
                /* Undone: the release this retain would have needed. */
                if (KGPU_REAL(cuDevicePrimaryCtxRelease_v2) != NULL)
                    KGPU_REAL(cuDevicePrimaryCtxRelease_v2)(dev);
                else if (KGPU_REAL(cuDevicePrimaryCtxRelease) != NULL)
                    KGPU_REAL(cuDevicePrimaryCtxRelease)(dev);
                r = CUDA_ERROR_OUT_OF_MEMORY;
                first = 0; /* nothing left charged */
            }
        }
        if (r == CUDA_SUCCESS) {
            kgpu__shim.primary[dev].refs++;
            atomic_store(&kgpu__shim.primary[dev].ctx, *pctx);
            if (atomic_load(&kgpu__shim.nprimary) <= dev)
                atomic_store(&kgpu__shim.nprimary, dev + 1);
        } else if (first) {
            kgpu__uncharge(li, est);
        }
    }
    pthread_mutex_unlock(&kgpu__shim.prim_mu);
    return r;
}

static CUresult primary_release(kgpu__pfn_cuDevicePrimaryCtxRelease real, CUdevice dev)
{
    if (dev < 0 || dev >= KGPU_SHIM_MAX_CUDA_DEVICES)
        return real(dev);
    pthread_mutex_lock(&kgpu__shim.prim_mu);
    int last = kgpu__shim.primary[dev].refs == 1;
    CUcontext ctx = atomic_load(&kgpu__shim.primary[dev].ctx);
    if (last) /* forgotten before it is gone: no allocation is charged through a stale pointer */
        atomic_store(&kgpu__shim.primary[dev].ctx, NULL);
    CUresult r = real(dev);
    if (r != CUDA_SUCCESS && last)
        atomic_store(&kgpu__shim.primary[dev].ctx, ctx);
    if (r == CUDA_SUCCESS && kgpu__shim.primary[dev].refs > 0 &&
        --kgpu__shim.primary[dev].refs == 0) {
        /* The last release destroys the context and everything allocated in it. */
        kgpu__uncharge(kgpu__dev_index(dev), kgpu__shim.primary[dev].bytes);
        kgpu__drop_ctx(ctx);
    }
    pthread_mutex_unlock(&kgpu__shim.prim_mu);
    return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    KGPU_ENTER(cuDevicePrimaryCtxRelease, (dev));
    return primary_release(real_, dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    KGPU_ENTER(cuDevicePrimaryCtxRelease_v2, (dev));
    return primary_release(real_, dev);
}

static CUresult primary_reset(kgpu__pfn_cuDevicePrimaryCtxReset real, CUdevice dev)
{
    if (dev < 0 || dev >= KGPU_SHIM_MAX_CUDA_DEVICES)
        return real(dev);
    pthread_mutex_lock(&kgpu__shim.prim_mu);
    CUresult r = real(dev);
    CUcontext ctx = atomic_load(&kgpu__shim.primary[dev].ctx);
    if (r == CUDA_SUCCESS && ctx != NULL)
        kgpu__drop_ctx(ctx); /* its allocations are gone; it stays retained */
    pthread_mutex_unlock(&kgpu__shim.prim_mu);
    return r;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    KGPU_ENTER(cuDevicePrimaryCtxReset, (dev));
    return primary_reset(real_, dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    KGPU_ENTER(cuDevicePrimaryCtxReset_v2, (dev));
    return primary_reset(real_, dev);
}

/* ---- counted allocations ---- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    KGPU_ENTER(cuMemAlloc_v2, (dptr, bytesize));
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || bytesize == 0 || dptr == NULL)
        return r != CUDA_SUCCESS ? r : real_(dptr, bytesize);
    CHARGE_OR_RETURN(w.li, bytesize);
    r = real_(dptr, bytesize);
    return kgpu__settle(r, KGPU_TRACK_MEM, r == CUDA_SUCCESS ? *dptr : 0, bytesize, &w);
}

#define PITCH_ALIGN 512 /* the pitch most GPUs choose; corrected from the real one afterwards */

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    KGPU_ENTER(cuMemAllocPitch_v2, (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || WidthInBytes == 0 || Height == 0 || dptr == NULL || pPitch == NULL)
        return r != CUDA_SUCCESS ? r : real_(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t pitch = ((uint64_t)WidthInBytes + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (pitch < WidthInBytes || pitch > UINT64_MAX / Height)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t est = pitch * Height;
    CHARGE_OR_RETURN(w.li, est);
    r = real_(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS)
        return kgpu__settle(r, KGPU_TRACK_MEM, 0, est, &w);
    uint64_t bytes = *pPitch <= UINT64_MAX / Height ? (uint64_t)*pPitch * Height : est;
    if (bytes > est && kgpu__charge(w.li, bytes - est) != CUDA_SUCCESS) {
        KGPU_REAL(cuMemFree_v2)(*dptr);
        kgpu__uncharge(w.li, est);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (bytes < est)
        kgpu__uncharge(w.li, est - bytes);
    return kgpu__settle(CUDA_SUCCESS, KGPU_TRACK_MEM, *dptr, bytes, &w);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    KGPU_ENTER(cuMemAllocManaged, (dptr, bytesize, flags));
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || bytesize == 0 || dptr == NULL)
        return r != CUDA_SUCCESS ? r : real_(dptr, bytesize, flags);
    CHARGE_OR_RETURN(w.li, bytesize);
    r = real_(dptr, bytesize, flags);
    return kgpu__settle(r, KGPU_TRACK_MEM, r == CUDA_SUCCESS ? *dptr : 0, bytesize, &w);
}

/*
 * cuArrayCreate and cuArray3DCreate, in their current (_v2) and pre-3.2
 * forms: the descriptors differ only in the width of their fields. DEPTH
 * and FLAGS read the descriptor `d` (1 and 0 for a 2D array). A sparse
 * array has no memory of its own: its tiles map handles (hooks_vmm.c).
 */
#define ARRAY_CREATE_HOOK(fn, desc_t, DEPTH, FLAGS)                                              \
    CUresult fn(CUarray *pHandle, const desc_t *pAllocateArray)                                  \
    {                                                                                            \
        KGPU_ENTER(fn, (pHandle, pAllocateArray));                                               \
        kgpu_where w;                                                                            \
        CUresult r = kgpu__where_current(&w);                                                    \
        if (r != CUDA_SUCCESS || pHandle == NULL || pAllocateArray == NULL)                      \
            return r != CUDA_SUCCESS ? r : real_(pHandle, pAllocateArray);                       \
        const desc_t *d = pAllocateArray;                                                        \
        uint64_t bytes = (FLAGS) & CUDA_ARRAY3D_SPARSE                                           \
                             ? 0                                                                 \
                             : kgpu_track_array_bytes(d->Width, d->Height, DEPTH, d->Format,     \
                                                      d->NumChannels, FLAGS, 1);                 \
        CHARGE_OR_RETURN(w.li, bytes);                                                           \
        r = real_(pHandle, pAllocateArray);                                                      \
        return kgpu__settle(r, KGPU_TRACK_ARRAY, r == CUDA_SUCCESS ? (uintptr_t)*pHandle : 0,   \
                            bytes, &w);                                                          \
    }

ARRAY_CREATE_HOOK(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, 1, 0)
ARRAY_CREATE_HOOK(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR, d->Depth, d->Flags)

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels)
{
    KGPU_ENTER(cuMipmappedArrayCreate, (pHandle, pMipmappedArrayDesc, numMipmapLevels));
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || pHandle == NULL || pMipmappedArrayDesc == NULL)
        return r != CUDA_SUCCESS ? r : real_(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    uint64_t bytes = d->Flags & CUDA_ARRAY3D_SPARSE
                         ? 0
                         : kgpu_track_array_bytes(d->Width, d->Height, d->Depth, d->Format,
                                                  d->NumChannels, d->Flags, numMipmapLevels);
    CHARGE_OR_RETURN(w.li, bytes);
    r = real_(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    return kgpu__settle(r, KGPU_TRACK_MIPMAP, r == CUDA_SUCCESS ? (uintptr_t)*pHandle : 0, bytes,
                        &w);
}

/* ---- what gives memory back ---- */

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    KGPU_ENTER(cuMemFree_v2, (dptr));
    kgpu_track_rec rec;
    /* Forget first: once the driver frees it, another thread may get the same address. */
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MEM, dptr, &rec);
    return kgpu__settle_free(real_(dptr), had, &rec);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    KGPU_ENTER(cuArrayDestroy, (hArray));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_ARRAY, (uintptr_t)hArray, &rec);
    CUresult r = kgpu__settle_free(real_(hArray), had, &rec);
    if (r == CUDA_SUCCESS)
        kgpu__array_gone((uintptr_t)hArray);
    return r;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    KGPU_ENTER(cuMipmappedArrayDestroy, (hMipmappedArray));
    kgpu_track_rec rec;
    int had =
        kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MIPMAP, (uintptr_t)hMipmappedArray, &rec);
    CUresult r = kgpu__settle_free(real_(hMipmappedArray), had, &rec);
    if (r == CUDA_SUCCESS)
        kgpu__array_gone((uintptr_t)hMipmappedArray);
    return r;
}

/* ---- the entry points from before CUDA 3.2: 32-bit pointers and sizes ---- */

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    KGPU_ENTER(cuMemGetInfo, (free, total));
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t); /* the share, from the same figures */
    if (r != CUDA_SUCCESS || (r = real_(free, total)) != CUDA_SUCCESS)
        return r;
    if (free != NULL && f < *free)
        *free = (unsigned int)f;
    if (total != NULL && t < *total)
        *total = (unsigned int)t;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    KGPU_ENTER(cuDeviceTotalMem, (bytes, dev));
    CUresult r = real_(bytes, dev);
    uint64_t lim = kgpu__limit(kgpu__dev_index(dev));
    if (r == CUDA_SUCCESS && bytes != NULL && lim < *bytes)
        *bytes = (unsigned int)lim;
    return r;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    KGPU_ENTER(cuMemAlloc, (dptr, bytesize));
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || bytesize == 0 || dptr == NULL)
        return r != CUDA_SUCCESS ? r : real_(dptr, bytesize);
    CHARGE_OR_RETURN(w.li, bytesize);
    r = real_(dptr, bytesize);
    /* Recorded under the zero-extended address, so cuMemFree_v2 of it finds it too. */
    return kgpu__settle(r, KGPU_TRACK_MEM, r == CUDA_SUCCESS ? (CUdeviceptr)*dptr : 0, bytesize,
                        &w);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    KGPU_ENTER(cuMemAllocPitch, (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || WidthInBytes == 0 || Height == 0 || dptr == NULL || pPitch == NULL)
        return r != CUDA_SUCCESS ? r : real_(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t pitch = ((uint64_t)WidthInBytes + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    uint64_t est = pitch * Height; /* both below 2^32: no overflow */
    CHARGE_OR_RETURN(w.li, est);
    r = real_(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS)
        return kgpu__settle(r, KGPU_TRACK_MEM, 0, est, &w);
    uint64_t bytes = (uint64_t)*pPitch * Height;
    if (bytes > est && kgpu__charge(w.li, bytes - est) != CUDA_SUCCESS) {
        KGPU_REAL(cuMemFree_v2)((CUdeviceptr)*dptr);
        kgpu__uncharge(w.li, est);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (bytes < est)
        kgpu__uncharge(w.li, est - bytes);
    return kgpu__settle(CUDA_SUCCESS, KGPU_TRACK_MEM, (CUdeviceptr)*dptr, bytes, &w);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    KGPU_ENTER(cuMemFree, (dptr));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MEM, (CUdeviceptr)dptr, &rec);
    return kgpu__settle_free(real_(dptr), had, &rec);
}

ARRAY_CREATE_HOOK(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR_v1, 1, 0)
ARRAY_CREATE_HOOK(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR_v1, d->Depth, d->Flags)

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    KGPU_ENTER(cuCtxCreate, (pctx, flags, dev));
    CTX_CREATE(real_(pctx, flags, dev));
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    KGPU_ENTER(cuCtxDestroy, (ctx));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_CTX, (uintptr_t)ctx, &rec);
    CUresult r = kgpu__settle_free(real_(ctx), had, &rec);
    if (r == CUDA_SUCCESS)
        kgpu__drop_ctx(ctx);
    return r;
}

/* ---- NVML ---- */

/* Replaces the real figures of `device` by the container's share of it. */
static nvmlReturn_t nvml_share(nvmlDevice_t device, unsigned long long *total,
                               unsigned long long *free, unsigned long long *used)
{
    char uuid[96];
    kgpu__pfn_nvmlDeviceGetUUID get = KGPU_REAL(nvmlDeviceGetUUID);
    nvmlReturn_t r = get(device, uuid, sizeof(uuid));
    if (r != NVML_SUCCESS)
        return r;
    int li = kgpu__uuid_index(uuid);
    uint64_t lim = kgpu__limit(li), u = used_on(li), avail = lim - u;
    *total = lim < *total ? lim : *total;
    *free = avail < *free ? avail : *free;
    *used = u;
    return NVML_SUCCESS;
}

#define KGPU_ENTER_NVML(name, args)                                                                \
    int mode_ = kgpu__nvml();                                                                      \
    kgpu__pfn_##name real_ = KGPU_REAL(name);                                                      \
    if (mode_ == KGPU_MODE_PASS)                                                                   \
        return real_ != NULL ? real_ args : NVML_ERROR_FUNCTION_NOT_FOUND;                         \
    if (mode_ != KGPU_MODE_ACTIVE) {                                                               \
        kgpu__refuse();                                                                            \
        return NVML_ERROR_UNINITIALIZED;                                                           \
    }                                                                                              \
    if (real_ == NULL || KGPU_REAL(nvmlDeviceGetUUID) == NULL)                                     \
    return NVML_ERROR_FUNCTION_NOT_FOUND

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    KGPU_ENTER_NVML(nvmlDeviceGetMemoryInfo, (device, memory));
    nvmlReturn_t r = real_(device, memory);
    if (r == NVML_SUCCESS && memory != NULL)
        r = nvml_share(device, &memory->total, &memory->free, &memory->used);
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    KGPU_ENTER_NVML(nvmlDeviceGetMemoryInfo_v2, (device, memory));
    nvmlReturn_t r = real_(device, memory);
    if (r == NVML_SUCCESS && memory != NULL) {
        r = nvml_share(device, &memory->total, &memory->free, &memory->used);
        memory->reserved = 0; /* the driver's reservation is outside the share */
    }
    return r;
}
