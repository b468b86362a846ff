/*
 * The hooks of stream-ordered pools (cuMemAllocAsync and its kin): a pool
 * holds what it reserved, frees included, until the driver lets it go, so
 * each pool is charged what the driver says it reserves. An allocation is
 * charged first what the pool must grow by (so the limit is checked before
 * the driver allocates), then the pool's charge is brought to its
 * reservation; the synchronisations where pools shrink give back
 * (refresh.c). Memory charged by size comes back when its stream reaches
 * the free, not when the free is queued.
 */
#include <stdlib.h>

#include "compat.h"
#include "hooks.h"

/* ---- stream-ordered pools ---- */

/* The entry of `pool`, registered at (li, dev) on first sight; pool_mu held. NULL out of memory. */
static struct kgpu_shim_pool *pool_entry(CUmemoryPool pool, int li, CUdevice dev)
{
    for (size_t i = 0; i < kgpu__shim.npools; i++)
        if (kgpu__shim.pools[i].pool == pool)
            return &kgpu__shim.pools[i];
    if (kgpu__shim.npools == kgpu__shim.cap_pools) {
        size_t cap = kgpu__shim.cap_pools ? kgpu__shim.cap_pools * 2 : 8;
        void *p = realloc(kgpu__shim.pools, cap * sizeof(*kgpu__shim.pools));
        if (p == NULL)
            return NULL;
        kgpu__shim.pools = p;
        kgpu__shim.cap_pools = cap;
    }
    struct kgpu_shim_pool *e = &kgpu__shim.pools[kgpu__shim.npools++];
    *e = (struct kgpu_shim_pool){.pool = pool, .li = li, .dev = dev, .charged = 0};
    return e;
}

/*
 * Where `pool` lives: as registered (cuMemPoolCreate, or seen before); a
 * device's default or current pool; else the device of `w` (the stream's).
 */
static void pool_home(CUmemoryPool pool, kgpu_where *w)
{
    pthread_mutex_lock(&kgpu__shim.pool_mu);
    for (size_t i = 0; i < kgpu__shim.npools; i++)
        if (kgpu__shim.pools[i].pool == pool) {
            w->li = kgpu__shim.pools[i].li;
            w->dev = kgpu__shim.pools[i].dev;
            pthread_mutex_unlock(&kgpu__shim.pool_mu);
            return;
        }
    pthread_mutex_unlock(&kgpu__shim.pool_mu);
    int count = 0;
    kgpu__pfn_cuDeviceGetDefaultMemPool dflt = KGPU_REAL(cuDeviceGetDefaultMemPool);
    kgpu__pfn_cuDeviceGetMemPool cur = KGPU_REAL(cuDeviceGetMemPool);
    if (KGPU_REAL(cuDeviceGetCount)(&count) != CUDA_SUCCESS)
        return;
    for (CUdevice d = 0; d < count && d < KGPU_SHIM_MAX_CUDA_DEVICES; d++) {
        CUmemoryPool p = NULL, q = NULL;
        if ((dflt != NULL && dflt(&p, d) == CUDA_SUCCESS && p == pool) ||
            (cur != NULL && cur(&q, d) == CUDA_SUCCESS && q == pool)) {
            w->li = kgpu__dev_index(d);
            w->dev = d;
            return;
        }
    }
}

/*
 * Brings the charge of `pool` to what the driver says it reserves now, as
 * far as `expected` (already charged by the caller) does not cover it:
 * returns how much more than `expected` the pool took (0 if it took no
 * more), having charged that much past the limit if need be, and gives
 * back what it took less. -1: the driver cannot tell.
 */
static int64_t pool_settle(CUmemoryPool pool, int li, CUdevice dev, uint64_t expected)
{
    uint64_t reserved;
    if (kgpu__pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0)
        return -1;
    pthread_mutex_lock(&kgpu__shim.pool_mu);
    struct kgpu_shim_pool *e = pool_entry(pool, li, dev);
    int64_t delta = 0;
    if (e != NULL) {
        delta = (int64_t)(reserved - e->charged);
        e->charged = reserved;
        li = e->li;
    }
    pthread_mutex_unlock(&kgpu__shim.pool_mu);
    int64_t over = delta - (int64_t)expected;
    if (over > 0) {
        if (kgpu__charge(li, (uint64_t)over) == CUDA_SUCCESS)
            return 0;
        kgpu__charge_anyway(li, (uint64_t)over); /* the pool holds it: count it */
        return over;
    }
    kgpu__uncharge(li, (uint64_t)-over);
    return 0;
}

/*
 * An allocation from `pool` on `stream` through `call`: charged only what
 * the pool must grow by (what it has free costs nothing more), settled to
 * the pool's reservation afterwards. When the pool grew past the limit,
 * the allocation is freed again and CUDA_ERROR_OUT_OF_MEMORY returned.
 */
typedef CUresult (*pool_call)(void *args);

static CUresult pooled(CUmemoryPool pool, kgpu_where *w, size_t bytesize, CUdeviceptr *dptr,
                       CUstream stream, pool_call call, void *args)
{
    uint64_t reserved, used;
    if (kgpu__pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 ||
        kgpu__pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0) {
        /* A driver that cannot report its pools: the size asked, back when freed. */
        CHARGE_OR_RETURN(w->li, bytesize);
        CUresult r = call(args);
        return kgpu__settle(r, KGPU_TRACK_MEM, r == CUDA_SUCCESS ? *dptr : 0, bytesize, w);
    }
    uint64_t spare = reserved > used ? reserved - used : 0;
    uint64_t need = bytesize > spare ? bytesize - spare : 0;
    CHARGE_OR_RETURN(w->li, need);
    CUresult r = call(args);
    if (pool_settle(pool, w->li, w->dev, need) > 0 && r == CUDA_SUCCESS) {
        kgpu__pfn_cuMemFreeAsync free_async = KGPU_REAL(cuMemFreeAsync);
        if (free_async != NULL)
            free_async(*dptr, stream);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

typedef struct async_args {
    kgpu__pfn_cuMemAllocAsync real;
    CUdeviceptr *dptr;
    size_t bytesize;
    CUstream stream;
} async_args;

static CUresult call_async(void *a)
{
    async_args *x = a;
    return x->real(x->dptr, x->bytesize, x->stream);
}

/* From the current pool of the stream's device. */
static CUresult alloc_async(kgpu__pfn_cuMemAllocAsync real, CUdeviceptr *dptr, size_t bytesize,
                            CUstream stream)
{
    kgpu_where w;
    CUresult r = kgpu__where_stream(stream, &w);
    if (r != CUDA_SUCCESS || bytesize == 0 || dptr == NULL)
        return r != CUDA_SUCCESS ? r : real(dptr, bytesize, stream);
    CUmemoryPool pool = NULL;
    kgpu__pfn_cuDeviceGetMemPool cur = KGPU_REAL(cuDeviceGetMemPool);
    if (cur != NULL && cur(&pool, w.dev) != CUDA_SUCCESS)
        pool = NULL;
    async_args a = {real, dptr, bytesize, stream};
    return pooled(pool, &w, bytesize, dptr, stream, call_async, &a);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    KGPU_ENTER(cuMemAllocAsync, (dptr, bytesize, hStream));
    return alloc_async(real_, dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    KGPU_ENTER(cuMemAllocAsync_ptsz, (dptr, bytesize, hStream));
    return alloc_async(real_, dptr, bytesize, hStream);
}

typedef struct from_pool_args {
    kgpu__pfn_cuMemAllocFromPoolAsync real;
    CUdeviceptr *dptr;
    size_t bytesize;
    CUmemoryPool pool;
    CUstream stream;
} from_pool_args;

static CUresult call_from_pool(void *a)
{
    from_pool_args *x = a;
    return x->real(x->dptr, x->bytesize, x->pool, x->stream);
}

static CUresult alloc_from_pool(kgpu__pfn_cuMemAllocFromPoolAsync real, CUdeviceptr *dptr,
                                size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    kgpu_where w;
    CUresult r = kgpu__where_stream(stream, &w);
    if (r != CUDA_SUCCESS || bytesize == 0 || dptr == NULL || pool == NULL)
        return r != CUDA_SUCCESS ? r : real(dptr, bytesize, pool, stream);
    pool_home(pool, &w);
    from_pool_args a = {real, dptr, bytesize, pool, stream};
    return pooled(pool, &w, bytesize, dptr, stream, call_from_pool, &a);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    KGPU_ENTER(cuMemAllocFromPoolAsync, (dptr, bytesize, pool, hStream));
    return alloc_from_pool(real_, dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    KGPU_ENTER(cuMemAllocFromPoolAsync_ptsz, (dptr, bytesize, pool, hStream));
    return alloc_from_pool(real_, dptr, bytesize, pool, hStream);
}

/* A charge given back by the stream itself, once it has done the free queued before it. */
typedef struct pending_free {
    int li;
    uint64_t bytes;
} pending_free;

static void free_done(void *data)
{
    pending_free *p = data;
    kgpu__uncharge(p->li, p->bytes);
    free(p);
}

/*
 * Memory from a pool stays charged to the pool (what it reserves), so its
 * free changes nothing here. Memory charged by size (cuMemAlloc, or a
 * driver without pool figures) comes back when the stream reaches the
 * free, not when it is queued: a host function queued behind it gives the
 * charge back. Captured into a graph, the free happens whenever that graph
 * runs, so the charge stays until the context goes.
 */
static CUresult free_async(kgpu__pfn_cuMemFreeAsync real, CUdeviceptr dptr, CUstream stream)
{
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MEM, dptr, &rec);
    CUresult r = real(dptr, stream);
    if (!had)
        return r;
    int capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    kgpu__pfn_cuStreamIsCapturing is_capturing = KGPU_REAL(cuStreamIsCapturing);
    if (r == CUDA_SUCCESS && is_capturing != NULL &&
        is_capturing(stream, &capturing) != CUDA_SUCCESS)
        capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    if (r != CUDA_SUCCESS || capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
        kgpu_track_put(&kgpu__shim.track, &rec); /* not freed, or not until the graph runs */
        return r;
    }
    pending_free *p = malloc(sizeof(*p));
    kgpu__pfn_cuLaunchHostFunc later = KGPU_REAL(cuLaunchHostFunc);
    if (p != NULL && later != NULL) {
        *p = (pending_free){.li = rec.dev, .bytes = rec.bytes};
        if (later(stream, free_done, p) == CUDA_SUCCESS)
            return r;
    }
    free(p);
    kgpu__uncharge(rec.dev, rec.bytes); /* no way to wait for it: back now */
    return r;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    KGPU_ENTER(cuMemFreeAsync, (dptr, hStream));
    return free_async(real_, dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    KGPU_ENTER(cuMemFreeAsync_ptsz, (dptr, hStream));
    return free_async(real_, dptr, hStream);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    KGPU_ENTER(cuMemPoolCreate, (pool, poolProps));
    CUresult r = real_(pool, poolProps);
    if (r == CUDA_SUCCESS && pool != NULL && poolProps != NULL &&
        poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        pool_entry(*pool, kgpu__dev_index(poolProps->location.id), poolProps->location.id);
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
    }
    return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    KGPU_ENTER(cuMemPoolTrimTo, (pool, minBytesToKeep));
    CUresult r = real_(pool, minBytesToKeep);
    kgpu_where w = {.li = -1, .dev = 0};
    pool_home(pool, &w);
    if (r == CUDA_SUCCESS && w.li >= 0)
        pool_settle(pool, w.li, w.dev, 0);
    return r;
}

/*
 * A pool destroyed with nothing allocated from it lets its memory go; one
 * with allocations outstanding lives on, untracked, until they are freed:
 * its charge stays until the process ends.
 */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    KGPU_ENTER(cuMemPoolDestroy, (pool));
    uint64_t used = 1;
    if (kgpu__pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0)
        used = 1;
    CUresult r = real_(pool);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&kgpu__shim.pool_mu);
    for (size_t i = 0; i < kgpu__shim.npools; i++)
        if (kgpu__shim.pools[i].pool == pool) {
            struct kgpu_shim_pool e = kgpu__shim.pools[i];
            kgpu__shim.pools[i] = kgpu__shim.pools[--kgpu__shim.npools];
            pthread_mutex_unlock(&kgpu__shim.pool_mu);
            if (used == 0)
                kgpu__uncharge(e.li, e.charged);
            return r;
        }
    pthread_mutex_unlock(&kgpu__shim.pool_mu);
    return r;
}

/*
 * The synchronisations: pools shrink there (refresh.c), and a container
 * taking turns is busy there, its queued work running (compute.c).
 */
static int any_pool(void)
{
    return __atomic_load_n(&kgpu__shim.npools, __ATOMIC_RELAXED) != 0;
}

CUresult cuCtxSynchronize(void)
{
    KGPU_ENTER(cuCtxSynchronize, ());
    kgpu_sched *busy = kgpu__compute_sync(0, NULL);
    CUresult r = real_();
    kgpu__compute_sync_end(busy);
    if (any_pool())
        kgpu__pools_refresh();
    return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    KGPU_ENTER(cuStreamSynchronize, (hStream));
    kgpu_sched *busy = kgpu__compute_sync(1, hStream);
    CUresult r = real_(hStream);
    kgpu__compute_sync_end(busy);
    if (any_pool())
        kgpu__pools_refresh();
    return r;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    KGPU_ENTER(cuStreamSynchronize_ptsz, (hStream));
    kgpu_sched *busy = kgpu__compute_sync(1, hStream);
    CUresult r = real_(hStream);
    kgpu__compute_sync_end(busy);
    if (any_pool())
        kgpu__pools_refresh();
    return r;
}

CUresult cuEventSynchronize(void *hEvent)
{
    KGPU_ENTER(cuEventSynchronize, (hEvent));
    kgpu_sched *busy = kgpu__compute_sync(0, NULL);
    CUresult r = real_(hEvent);
    kgpu__compute_sync_end(busy);
    if (any_pool())
        kgpu__pools_refresh();
    return r;
}
