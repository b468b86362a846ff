/*
 * The hooks for memory whose footprint the call's arguments do not give,
 * or whose end the free call does not mark: virtual memory management
 * (physical memory lives while a handle, a mapping or an export does;
 * vmm.c keeps count), stream-ordered pools (a pool holds what it reserved,
 * frees included, until the driver releases it), graph memory (allocated
 * when a graph is launched or uploaded), context limits, and module and
 * library loads. Where the driver can report the footprint, that report is
 * what is charged: a pool's and the graph memory's RESERVED_MEM_CURRENT,
 * the drop in free memory across a load. docs/shim.md lists, per route,
 * how it is counted and where that can be wrong.
 *
 * The pattern where the footprint is known only afterwards: charge an
 * estimate first (so the limit is checked before the driver allocates),
 * call the driver, then bring the charge to what the driver reports.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compat.h"
#include "shim.h"

/* ---- virtual memory management ---- */

int kgpu__export_open(const kgpu_vmm_export *e)
{
    struct stat st;
    return fcntl(e->fd, F_GETFD) != -1 && kgpu_shim_fstat(e->fd, &st) == 0 &&
           (uint64_t)st.st_dev == e->dev && (uint64_t)st.st_ino == e->ino;
}

static int export_of(int fd, kgpu_vmm_export *e)
{
    struct stat st;
    if (fd < 0 || kgpu_shim_fstat(fd, &st) != 0)
        return -1;
    *e = (kgpu_vmm_export){.fd = fd, .dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino};
    return 0;
}

/* Physical memory: device memory only, tied to no context. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    KGPU_ENTER(cuMemCreate, (handle, size, prop, flags));
    if (handle == NULL || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        size == 0)
        return real_(handle, size, prop, flags);
    int li = kgpu__dev_index(prop->location.id);
    CHARGE_OR_RETURN(li, size);
    CUresult r = real_(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        kgpu__uncharge(li, size);
        return r;
    }
    if (kgpu_vmm_created(&kgpu__shim.vmm, *handle, size, li) != 0) {
        KGPU_REAL(cuMemRelease)(*handle);
        kgpu__uncharge(li, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* The charge goes back only when the last handle, mapping and export are gone. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    KGPU_ENTER(cuMemRelease, (handle));
    int known = kgpu_vmm_knows(&kgpu__shim.vmm, handle);
    CUresult r = real_(handle);
    if (r == CUDA_SUCCESS && known) {
        kgpu_vmm_freed f = {0};
        kgpu_vmm_released(&kgpu__shim.vmm, handle, &f);
        kgpu__uncharge_freed(&f);
    }
    return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    KGPU_ENTER(cuMemMap, (ptr, size, offset, handle, flags));
    uint64_t more = 0;
    int li = -1;
    int known = kgpu_vmm_map_cost(&kgpu__shim.vmm, handle, offset, size, &more, &li);
    if (known && more > 0)
        CHARGE_OR_RETURN(li, more); /* an import: charged as far as it is mapped */
    CUresult r = real_(ptr, size, offset, handle, flags);
    if (r != CUDA_SUCCESS) {
        kgpu__uncharge(li, more);
        return r;
    }
    if (!known)
        return r;
    int64_t excess = kgpu_vmm_mapped(&kgpu__shim.vmm, ptr, size, offset, handle, more);
    if (excess < 0) {
        KGPU_REAL(cuMemUnmap)(ptr, size);
        kgpu__uncharge(li, more);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    kgpu__uncharge(li, (uint64_t)excess);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    KGPU_ENTER(cuMemUnmap, (ptr, size));
    CUresult r = real_(ptr, size);
    if (r == CUDA_SUCCESS) {
        kgpu_vmm_freed f = {0};
        kgpu_vmm_unmapped(&kgpu__shim.vmm, ptr, size, &f);
        kgpu__uncharge_freed(&f);
    }
    return r;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    KGPU_ENTER(cuMemRetainAllocationHandle, (handle, addr));
    CUresult r = real_(handle, addr);
    if (r == CUDA_SUCCESS && handle != NULL)
        kgpu_vmm_retained(&kgpu__shim.vmm, *handle, (uint64_t)(uintptr_t)addr);
    return r;
}

/* Which subresource a CUarrayMapInfo names, from its defined fields only (not its padding). */
static uint64_t tile_of(const CUarrayMapInfo *m)
{
    uint64_t h = 1469598103934665603ULL, f[8] = {0};
    int n = 0;
    if (m->subresourceType == 0) {
        f[0] = m->subresource.sparseLevel.level;
        f[1] = m->subresource.sparseLevel.layer;
        f[2] = m->subresource.sparseLevel.offsetX;
        f[3] = m->subresource.sparseLevel.offsetY;
        f[4] = m->subresource.sparseLevel.offsetZ;
        n = 5;
    } else {
        f[0] = 1ULL << 32 | m->subresource.miptail.layer;
        f[1] = m->subresource.miptail.offset;
        n = 2;
    }
    for (int i = 0; i < n; i++)
        h = (h ^ f[i]) * 1099511628211ULL;
    return h == UINT64_MAX ? h - 1 : h;
}

/*
 * Tiles of sparse arrays mapped from handles: the handle's memory lives
 * while a tile maps it, like a virtual mapping. (The driver performs the
 * operations in stream order; they are recorded when queued.)
 */
static CUresult map_array(kgpu__pfn_cuMemMapArrayAsync real, CUarrayMapInfo *infos,
                          unsigned int count, CUstream stream)
{
    CUresult r = real(infos, count, stream);
    for (unsigned int i = 0; r == CUDA_SUCCESS && infos != NULL && i < count; i++) {
        const CUarrayMapInfo *m = &infos[i];
        uint64_t array = (uint64_t)(uintptr_t)m->resource.array, where = tile_of(m);
        kgpu_vmm_freed f = {0};
        kgpu_vmm_tile_unmapped(&kgpu__shim.vmm, array, where, &f); /* what was mapped there */
        if (m->memOperationType == 1 && m->memHandleType == 0)
            kgpu_vmm_tile_mapped(&kgpu__shim.vmm, array, where, m->memHandle);
        kgpu__uncharge_freed(&f);
    }
    return r;
}

CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream)
{
    KGPU_ENTER(cuMemMapArrayAsync, (mapInfoList, count, hStream));
    return map_array(real_, mapInfoList, count, hStream);
}

CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count,
                                 CUstream hStream)
{
    KGPU_ENTER(cuMemMapArrayAsync_ptsz, (mapInfoList, count, hStream));
    return map_array(real_, mapInfoList, count, hStream);
}

/* A sparse array destroyed: what its tiles kept alive may go. */
void kgpu__array_gone(uint64_t array)
{
    kgpu_vmm_freed f = {0};
    kgpu_vmm_tile_unmapped(&kgpu__shim.vmm, array, UINT64_MAX, &f);
    kgpu__uncharge_freed(&f);
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      int handleType, unsigned long long flags)
{
    KGPU_ENTER(cuMemExportToShareableHandle, (shareableHandle, handle, handleType, flags));
    CUresult r = real_(shareableHandle, handle, handleType, flags);
    if (r != CUDA_SUCCESS || shareableHandle == NULL)
        return r;
    kgpu_vmm_export e;
    /* A descriptor can be watched; a fabric handle cannot: it keeps the charge for good. */
    int watched = handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
                  export_of(*(int *)shareableHandle, &e) == 0;
    kgpu_vmm_exported(&kgpu__shim.vmm, handle, watched ? &e : NULL);
    return r;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        int shHandleType)
{
    KGPU_ENTER(cuMemImportFromShareableHandle, (handle, osHandle, shHandleType));
    CUresult r = real_(handle, osHandle, shHandleType);
    if (r != CUDA_SUCCESS || handle == NULL)
        return r;
    kgpu_vmm_export e;
    int fd = shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                 ? (int)(intptr_t)osHandle
                 : -1;
    /* Its device: where the properties say it lives, else the current context's. */
    int li = -1;
    union {
        CUmemAllocationProp prop;
        unsigned char room[256]; /* the driver writes the whole, larger, structure */
    } p;
    memset(&p, 0, sizeof(p));
    kgpu__pfn_cuMemGetAllocationPropertiesFromHandle props =
        KGPU_REAL(cuMemGetAllocationPropertiesFromHandle);
    kgpu_where w;
    if (props != NULL && props(&p.prop, *handle) == CUDA_SUCCESS &&
        p.prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        li = kgpu__dev_index(p.prop.location.id);
    else if (kgpu__where_current(&w) == CUDA_SUCCESS)
        li = w.li;
    if (kgpu_vmm_imported(&kgpu__shim.vmm, *handle, export_of(fd, &e) == 0 ? &e : NULL, li) !=
        0) {
        KGPU_REAL(cuMemRelease)(*handle);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

/* ---- stream-ordered pools ---- */

static int pool_attr(CUmemoryPool pool, int attr, uint64_t *v)
{
    kgpu__pfn_cuMemPoolGetAttribute get = KGPU_REAL(cuMemPoolGetAttribute);
    cuuint64_t x = 0;
    if (get == NULL || pool == NULL || get(pool, attr, &x) != CUDA_SUCCESS)
        return -1;
    *v = x;
    return 0;
}

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
    if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0)
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
    if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 ||
        pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0) {
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
    if (pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0)
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
 * Gives back what pools let go since they were last asked (they shrink to
 * their release threshold at synchronisations). Never raises a charge:
 * growth is charged where it happens, at allocations.
 */
static void pools_refresh(void)
{
    for (size_t i = 0;; i++) {
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        if (i >= kgpu__shim.npools) {
            pthread_mutex_unlock(&kgpu__shim.pool_mu);
            break;
        }
        struct kgpu_shim_pool e = kgpu__shim.pools[i];
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
        uint64_t reserved;
        if (pool_attr(e.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 ||
            reserved >= e.charged)
            continue;
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        uint64_t back = 0;
        if (i < kgpu__shim.npools && kgpu__shim.pools[i].pool == e.pool &&
            kgpu__shim.pools[i].charged > reserved) {
            back = kgpu__shim.pools[i].charged - reserved;
            kgpu__shim.pools[i].charged = reserved;
        }
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
        kgpu__uncharge(e.li, back);
    }
}

/* Whether any pool is charged (read without the lock: a hint for the synchronisations). */
static int any_pool(void)
{
    return __atomic_load_n(&kgpu__shim.npools, __ATOMIC_RELAXED) != 0;
}

CUresult cuCtxSynchronize(void)
{
    KGPU_ENTER(cuCtxSynchronize, ());
    CUresult r = real_();
    if (any_pool())
        pools_refresh();
    return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    KGPU_ENTER(cuStreamSynchronize, (hStream));
    CUresult r = real_(hStream);
    if (any_pool())
        pools_refresh();
    return r;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    KGPU_ENTER(cuStreamSynchronize_ptsz, (hStream));
    CUresult r = real_(hStream);
    if (any_pool())
        pools_refresh();
    return r;
}

CUresult cuEventSynchronize(void *hEvent)
{
    KGPU_ENTER(cuEventSynchronize, (hEvent));
    CUresult r = real_(hEvent);
    if (any_pool())
        pools_refresh();
    return r;
}

/* ---- graph memory ---- */

#define GRAPH_KEY(exec, li) ((uint64_t)(uintptr_t)(exec) ^ ((uint64_t)(li) << 58))

static _Atomic int graphs_with_memory; /* execs recorded: launches skip the lookups while 0 */

static int graph_attr(CUdevice dev, int attr, uint64_t *v)
{
    kgpu__pfn_cuDeviceGetGraphMemAttribute get = KGPU_REAL(cuDeviceGetGraphMemAttribute);
    cuuint64_t x = 0;
    if (get == NULL || get(dev, attr, &x) != CUDA_SUCCESS)
        return -1;
    *v = x;
    return 0;
}

/* Like pool_settle, for device dev's graph memory. */
static void graph_settle(CUdevice dev, int li, uint64_t expected)
{
    uint64_t reserved;
    if (dev < 0 || dev >= KGPU_SHIM_MAX_CUDA_DEVICES ||
        graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0) {
        kgpu__uncharge(li, expected);
        return;
    }
    pthread_mutex_lock(&kgpu__shim.pool_mu);
    int64_t over = (int64_t)(reserved - kgpu__shim.graph_charged[dev]) - (int64_t)expected;
    kgpu__shim.graph_charged[dev] = reserved;
    pthread_mutex_unlock(&kgpu__shim.pool_mu);
    if (over > 0)
        kgpu__charge_anyway(li, (uint64_t)over); /* launched already: it cannot be refused now */
    else
        kgpu__uncharge(li, (uint64_t)-over);
}

/* Adds the bytes of g's memory allocation nodes (child graphs included) per limits index. */
static void graph_bytes(CUgraph g, uint64_t bytes[KGPU_SHIM_MAX_DEVICES], int depth)
{
    kgpu__pfn_cuGraphGetNodes get_nodes = KGPU_REAL(cuGraphGetNodes);
    kgpu__pfn_cuGraphNodeGetType get_type = KGPU_REAL(cuGraphNodeGetType);
    kgpu__pfn_cuGraphMemAllocNodeGetParams get_params = KGPU_REAL(cuGraphMemAllocNodeGetParams);
    kgpu__pfn_cuGraphChildGraphNodeGetGraph get_child = KGPU_REAL(cuGraphChildGraphNodeGetGraph);
    size_t n = 0;
    if (depth > 8 || get_nodes == NULL || get_type == NULL || get_params == NULL ||
        get_nodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return;
    CUgraphNode *nodes = calloc(n, sizeof(*nodes));
    if (nodes == NULL || get_nodes(g, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int type = -1;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        CUgraph child;
        if (get_type(nodes[i], &type) != CUDA_SUCCESS)
            continue;
        if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && get_params(nodes[i], &p) == CUDA_SUCCESS &&
            p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
            int li = kgpu__dev_index(p.poolProps.location.id);
            if (li >= 0 && li < KGPU_SHIM_MAX_DEVICES)
                bytes[li] += p.bytesize;
        } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && get_child != NULL &&
                   get_child(nodes[i], &child) == CUDA_SUCCESS) {
            graph_bytes(child, bytes, depth + 1);
        }
    }
    free(nodes);
}

/* After an instantiation: what the executable graph's memory nodes will need, per device. */
static CUresult instantiated(CUresult r, CUgraphExec *exec, CUgraph graph)
{
    if (r != CUDA_SUCCESS || exec == NULL)
        return r;
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES] = {0};
    graph_bytes(graph, bytes, 0);
    for (int li = 0; li < KGPU_SHIM_MAX_DEVICES; li++) {
        if (bytes[li] == 0)
            continue;
        kgpu_track_rec rec = {.key = GRAPH_KEY(*exec, li),
                              .bytes = bytes[li],
                              .dev = -1, /* nothing charged by the record itself */
                              .kind = KGPU_TRACK_GRAPHEXEC};
        kgpu_track_put(&kgpu__shim.track, &rec);
        atomic_fetch_add(&graphs_with_memory, 1);
    }
    return r;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize)
{
    KGPU_ENTER(cuGraphInstantiate, (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
    return instantiated(real_(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    KGPU_ENTER(cuGraphInstantiate_v2, (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
    return instantiated(real_(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    KGPU_ENTER(cuGraphInstantiateWithFlags, (phGraphExec, hGraph, flags));
    return instantiated(real_(phGraphExec, hGraph, flags), phGraphExec, hGraph);
}

/*
 * With instantiate parameters an upload may happen right away (on the
 * upload stream): the graph memory is settled afterwards, past the limit
 * if need be, as after a launch.
 */
CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      void *instantiateParams)
{
    KGPU_ENTER(cuGraphInstantiateWithParams, (phGraphExec, hGraph, instantiateParams));
    CUresult r = instantiated(real_(phGraphExec, hGraph, instantiateParams), phGraphExec, hGraph);
    for (int li = 0; r == CUDA_SUCCESS && li < kgpu__shim.limits.ndevices; li++)
        graph_settle(kgpu__cuda_dev(li), li, 0);
    return r;
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           void *instantiateParams)
{
    KGPU_ENTER(cuGraphInstantiateWithParams_ptsz, (phGraphExec, hGraph, instantiateParams));
    CUresult r = instantiated(real_(phGraphExec, hGraph, instantiateParams), phGraphExec, hGraph);
    for (int li = 0; r == CUDA_SUCCESS && li < kgpu__shim.limits.ndevices; li++)
        graph_settle(kgpu__cuda_dev(li), li, 0);
    return r;
}

/*
 * A launch or upload maps the graph's memory: charged, before the driver
 * is called, what the device's graph memory must grow by to hold the
 * graph's allocations; then settled to what it reserves.
 */
typedef CUresult (*graph_call)(CUgraphExec exec, CUstream stream);

static CUresult graph_run(graph_call real, CUgraphExec exec, CUstream stream)
{
    kgpu__compute_gate(); /* a graph's kernels run in its container's turn like any others */
    if (atomic_load_explicit(&graphs_with_memory, memory_order_relaxed) == 0)
        return real(exec, stream);
    uint64_t need[KGPU_SHIM_MAX_DEVICES] = {0};
    int any = 0;
    for (int li = 0; li < kgpu__shim.limits.ndevices; li++) {
        kgpu_track_rec rec;
        if (!kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_GRAPHEXEC, GRAPH_KEY(exec, li), &rec))
            continue;
        uint64_t reserved = 0, used = 0;
        CUdevice dev = kgpu__cuda_dev(li);
        if (graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0 &&
            graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) == 0 && reserved > used)
            need[li] = rec.bytes > reserved - used ? rec.bytes - (reserved - used) : 0;
        else
            need[li] = rec.bytes;
        CUresult c = kgpu__charge(li, need[li]);
        if (c != CUDA_SUCCESS) {
            for (int k = 0; k < li; k++)
                kgpu__uncharge(k, need[k]);
            return c;
        }
        any = 1;
    }
    CUresult r = real(exec, stream);
    for (int li = 0; any && li < kgpu__shim.limits.ndevices; li++)
        if (need[li] != 0 || r == CUDA_SUCCESS)
            graph_settle(kgpu__cuda_dev(li), li, need[li]);
    return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphLaunch, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphLaunch_ptsz, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream);
}

CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphUpload, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream);
}

CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphUpload_ptsz, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    KGPU_ENTER(cuGraphExecDestroy, (hGraphExec));
    CUresult r = real_(hGraphExec);
    if (r != CUDA_SUCCESS)
        return r;
    for (int li = 0; li < KGPU_SHIM_MAX_DEVICES; li++) {
        kgpu_track_rec rec;
        if (kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_GRAPHEXEC, GRAPH_KEY(hGraphExec, li),
                            &rec)) {
            atomic_fetch_sub(&graphs_with_memory, 1);
            graph_settle(kgpu__cuda_dev(li), li, 0);
        }
    }
    return r;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    KGPU_ENTER(cuDeviceGraphMemTrim, (device));
    CUresult r = real_(device);
    int li = kgpu__dev_index(device);
    if (r == CUDA_SUCCESS && li >= 0)
        graph_settle(device, li, 0);
    return r;
}

/* ---- what the driver reports, brought back into the charges ---- */

void kgpu__mem_refresh(void)
{
    kgpu_vmm_freed f = {0};
    if (kgpu_vmm_sweep(&kgpu__shim.vmm, &f) > 0)
        kgpu__uncharge_freed(&f);
    pools_refresh();
    for (int li = 0; li < kgpu__shim.limits.ndevices; li++) {
        CUdevice dev = kgpu__cuda_dev(li);
        uint64_t reserved;
        if (dev < 0 || graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0)
            continue;
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        uint64_t back = 0;
        if (kgpu__shim.graph_charged[dev] > reserved) {
            back = kgpu__shim.graph_charged[dev] - reserved;
            kgpu__shim.graph_charged[dev] = reserved;
        }
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
        kgpu__uncharge(li, back);
    }
}

/* ---- context limits ---- */

/* Bytes of device memory a limit of `value` takes on device dev, as far as it can be computed. */
static uint64_t limit_footprint(int limit, size_t value, CUdevice dev)
{
    if (limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE)
        return value;
    if (limit != CU_LIMIT_STACK_SIZE)
        return 0; /* measured only */
    /* The stack is reserved for every thread the device can hold at once. */
    int sms = 0, threads = 0;
    kgpu__pfn_cuDeviceGetAttribute attr = KGPU_REAL(cuDeviceGetAttribute);
    if (attr == NULL ||
        attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        attr(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
        sms <= 0 || threads <= 0)
        return 0;
    uint64_t per = (uint64_t)sms * (uint64_t)threads;
    return value > UINT64_MAX / per ? UINT64_MAX : (uint64_t)value * per;
}

static int free_now(size_t *f)
{
    size_t total;
    return KGPU_REAL(cuMemGetInfo_v2)(f, &total) == CUDA_SUCCESS ? 0 : -1;
}

/*
 * Raising a limit of the current context is charged what the new value
 * takes beyond the value the context had before it was first raised
 * (that much is in the context's footprint): computed where it can be
 * (heap, printf FIFO, stack x resident threads), and never less than the
 * driver's free memory drops across the call. Lowering it gives back.
 */
CUresult cuCtxSetLimit(int limit, size_t value)
{
    KGPU_ENTER(cuCtxSetLimit, (limit, value));
    kgpu_where w;
    size_t old = 0, before = 0, after = 0;
    kgpu__pfn_cuCtxGetLimit get = KGPU_REAL(cuCtxGetLimit);
    if (kgpu__where_current(&w) != CUDA_SUCCESS || w.ctx == NULL || get == NULL ||
        get(&old, limit) != CUDA_SUCCESS)
        return real_(limit, value); /* the driver says what is wrong */
    uint64_t key = (uint64_t)(uintptr_t)w.ctx ^ ((uint64_t)(limit & 0xff) << 56);
    kgpu_track_rec base, prev = {0};
    if (!kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_LIMITBASE, key, &base)) {
        base = (kgpu_track_rec){.key = key,
                                .bytes = old,
                                .ctx = (uintptr_t)w.ctx,
                                .dev = -1,
                                .kind = KGPU_TRACK_LIMITBASE};
        if (kgpu_track_put(&kgpu__shim.track, &base) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_LIMIT, key, &prev);
    uint64_t fp_new = limit_footprint(limit, value, w.dev),
             fp_base = limit_footprint(limit, (size_t)base.bytes, w.dev);
    uint64_t target = fp_new > fp_base ? fp_new - fp_base : 0, charged = had ? prev.bytes : 0;
    uint64_t more = target > charged ? target - charged : 0;
    int measured = free_now(&before) == 0;
    CUresult r = kgpu__charge(w.li, more);
    if (r == CUDA_SUCCESS && (r = real_(limit, value)) != CUDA_SUCCESS)
        kgpu__uncharge(w.li, more);
    /* What the driver took beyond the computed part (a limit with no formula, or a bigger one). */
    if (r == CUDA_SUCCESS && measured && free_now(&after) == 0 && before > after &&
        before - after > more) {
        uint64_t extra = before - after - more;
        if (kgpu__charge(w.li, extra) == CUDA_SUCCESS) {
            more += extra;
        } else {
            real_(limit, old);
            kgpu__uncharge(w.li, more);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r != CUDA_SUCCESS) {
        if (had)
            kgpu_track_put(&kgpu__shim.track, &prev);
        return r;
    }
    uint64_t now = charged + more;
    if (more == 0 && target < charged) { /* lowered: what it took above the new value comes back */
        kgpu__uncharge(w.li, charged - target);
        now = target;
    }
    kgpu_track_rec rec = {.key = key,
                          .bytes = now,
                          .ctx = (uintptr_t)w.ctx,
                          .dev = (int16_t)w.li,
                          .kind = KGPU_TRACK_LIMIT};
    if (now != 0 && kgpu_track_put(&kgpu__shim.track, &rec) != 0)
        kgpu__uncharge(w.li, now);
    return r;
}

/* ---- modules and libraries: measured across the load ---- */

/*
 * After a load that succeeded: charges what the driver's free memory
 * dropped by across it; over the limit, the load is undone with `unload`
 * and CUDA_ERROR_OUT_OF_MEMORY returned.
 */
static CUresult loaded(CUresult r, int measured, size_t before, const kgpu_where *w, int kind,
                       uint64_t key, CUcontext ctx, CUresult (*unload)(uint64_t key))
{
    size_t after = 0;
    if (r != CUDA_SUCCESS || !measured || free_now(&after) != 0 || after >= before)
        return r;
    uint64_t bytes = before - after;
    if (kgpu__charge(w->li, bytes) != CUDA_SUCCESS) {
        unload(key);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    kgpu_track_rec rec = {
        .key = key, .bytes = bytes, .ctx = (uintptr_t)ctx, .dev = (int16_t)w->li, .kind = kind};
    if (kgpu_track_put(&kgpu__shim.track, &rec) != 0) {
        unload(key);
        kgpu__uncharge(w->li, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

static CUresult unload_module(uint64_t key)
{
    return KGPU_REAL(cuModuleUnload)((CUmodule)(uintptr_t)key);
}

static CUresult unload_library(uint64_t key)
{
    return KGPU_REAL(cuLibraryUnload)((CUlibrary)(uintptr_t)key);
}

/* Before a load: where it lands and the free memory then (0: cannot be measured). */
static int before_load(kgpu_where *w, size_t *before)
{
    return kgpu__where_current(w) == CUDA_SUCCESS && w->ctx != NULL && w->li >= 0 &&
           free_now(before) == 0;
}

#define MODULE_LOAD(call, pmod)                                                                    \
    kgpu_where w;                                                                                  \
    size_t before = 0;                                                                             \
    int measured = before_load(&w, &before);                                                       \
    CUresult r = call;                                                                             \
    return loaded(r, measured, before, &w, KGPU_TRACK_MODULE,                                      \
                  r == CUDA_SUCCESS && (pmod) != NULL ? (uint64_t)(uintptr_t)*(pmod) : 0, w.ctx,   \
                  unload_module)

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    KGPU_ENTER(cuModuleLoad, (module, fname));
    MODULE_LOAD(real_(module, fname), module);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    KGPU_ENTER(cuModuleLoadData, (module, image));
    MODULE_LOAD(real_(module, image), module);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            int *options, void **optionValues)
{
    KGPU_ENTER(cuModuleLoadDataEx, (module, image, numOptions, options, optionValues));
    MODULE_LOAD(real_(module, image, numOptions, options, optionValues), module);
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    KGPU_ENTER(cuModuleLoadFatBinary, (module, fatCubin));
    MODULE_LOAD(real_(module, fatCubin), module);
}

CUresult cuModuleUnload(CUmodule hmod)
{
    KGPU_ENTER(cuModuleUnload, (hmod));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MODULE, (uintptr_t)hmod, &rec);
    return kgpu__settle_free(real_(hmod), had, &rec);
}

/* A library is not tied to the context it was measured in: it goes when it is unloaded. */
#define LIBRARY_LOAD(call, plib)                                                                   \
    kgpu_where w;                                                                                  \
    size_t before = 0;                                                                             \
    int measured = before_load(&w, &before);                                                       \
    CUresult r = call;                                                                             \
    return loaded(r, measured, before, &w, KGPU_TRACK_LIBRARY,                                     \
                  r == CUDA_SUCCESS && (plib) != NULL ? (uint64_t)(uintptr_t)*(plib) : 0, NULL,    \
                  unload_library)

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           int *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions)
{
    KGPU_ENTER(cuLibraryLoadData, (library, code, jitOptions, jitOptionsValues, numJitOptions,
                                   libraryOptions, libraryOptionValues, numLibraryOptions));
    LIBRARY_LOAD(real_(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                       libraryOptionValues, numLibraryOptions),
                 library);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, int *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               int *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions)
{
    KGPU_ENTER(cuLibraryLoadFromFile, (library, fileName, jitOptions, jitOptionsValues,
                                       numJitOptions, libraryOptions, libraryOptionValues,
                                       numLibraryOptions));
    LIBRARY_LOAD(real_(library, fileName, jitOptions, jitOptionsValues, numJitOptions,
                       libraryOptions, libraryOptionValues, numLibraryOptions),
                 library);
}

CUresult cuLibraryUnload(CUlibrary library)
{
    KGPU_ENTER(cuLibraryUnload, (library));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_LIBRARY, (uintptr_t)library, &rec);
    return kgpu__settle_free(real_(library), had, &rec);
}
