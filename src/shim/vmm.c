/*
 * The virtual memory table (vmm.h). Handles and mappings are kept in arrays
 * sorted by handle value and by address, found by binary search; an
 * allocation is a cell in a third array, reused once it dies. VMM calls are
 * rare next to cuMemAlloc (frameworks map large segments), so insertion by
 * memmove is cheap enough and keeps the structure easy to check.
 */
#include <stdlib.h>
#include <string.h>

#include "compat.h"
#include "vmm.h"

/* Grows *arr (of *cap elements of `size`) to hold n. 0, or -1 out of memory. */
static int reserve(void **arr, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < n)
        c *= 2;
    void *p = realloc(*arr, c * size);
    if (p == NULL)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

/* Index of the first handle >= h. */
static size_t handle_lb(const kgpu_vmm *v, uint64_t h)
{
    size_t lo = 0, hi = v->nhandles;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->handles[mid].handle < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static kgpu_vmm_handle *find_handle(kgpu_vmm *v, uint64_t h)
{
    size_t i = handle_lb(v, h);
    return i < v->nhandles && v->handles[i].handle == h ? &v->handles[i] : NULL;
}

/* Adds `refs` references of handle h to allocation a (creating the handle record). */
static int add_handle(kgpu_vmm *v, uint64_t h, uint32_t a, int refs)
{
    kgpu_vmm_handle *e = find_handle(v, h);
    if (e != NULL) {
        e->refs += refs;
        v->allocs[e->alloc].refs += refs;
        return 0;
    }
    if (reserve((void **)&v->handles, &v->cap_handles, v->nhandles + 1, sizeof(*v->handles)) != 0)
        return -1;
    size_t i = handle_lb(v, h);
    memmove(&v->handles[i + 1], &v->handles[i], (v->nhandles - i) * sizeof(*v->handles));
    v->handles[i] = (kgpu_vmm_handle){.handle = h, .alloc = a, .refs = refs};
    v->nhandles++;
    v->allocs[a].refs += refs;
    return 0;
}

/* A free allocation cell (index into *out). 0, or -1 out of memory. */
static int new_alloc(kgpu_vmm *v, uint32_t *out)
{
    for (size_t i = 0; i < v->nallocs; i++)
        if (!v->allocs[i].used) {
            *out = (uint32_t)i;
            return 0;
        }
    if (reserve((void **)&v->allocs, &v->cap_allocs, v->nallocs + 1, sizeof(*v->allocs)) != 0)
        return -1;
    *out = (uint32_t)v->nallocs++;
    return 0;
}

/* Drops the exports of a that are closed now. */
static void prune_exports(kgpu_vmm *v, kgpu_vmm_alloc *a)
{
    int k = 0;
    for (int i = 0; i < a->nexports; i++)
        if (v->is_open != NULL && v->is_open(&a->exports[i]))
            a->exports[k++] = a->exports[i];
    a->nexports = k;
}

static int maybe_free(kgpu_vmm *v, uint32_t a, kgpu_vmm_freed *freed);

/* Drops binding i (the bound memory may die). */
static void unbind_at(kgpu_vmm *v, size_t i, kgpu_vmm_freed *freed)
{
    uint32_t a = v->binds[i].alloc;
    v->binds[i] = v->binds[--v->nbinds];
    v->allocs[a].maps--;
    maybe_free(v, a, freed);
}

/* Frees allocation a if nothing keeps it any more; its bytes into *freed. 1 if it died. */
static int maybe_free(kgpu_vmm *v, uint32_t a, kgpu_vmm_freed *freed)
{
    kgpu_vmm_alloc *al = &v->allocs[a];
    if (!al->used || al->refs > 0 || al->maps > 0 || al->sticky)
        return 0;
    prune_exports(v, al);
    if (al->nexports > 0)
        return 0;
    if (al->mcast) /* a multicast object gone: what it bound is no longer kept */
        for (size_t i = 0; i < v->nbinds;) {
            if (v->binds[i].mc == a)
                unbind_at(v, i, freed);
            else
                i++;
        }
    if (al->dev >= 0 && al->dev < KGPU_SHIM_MAX_DEVICES)
        freed->bytes[al->dev] += al->bytes;
    memset(al, 0, sizeof(*al));
    return 1;
}

int kgpu_vmm_created(kgpu_vmm *v, uint64_t handle, uint64_t bytes, int dev)
{
    int rc = -1;
    uint32_t a;
    pthread_mutex_lock(&v->mu);
    if (new_alloc(v, &a) == 0) {
        v->allocs[a] = (kgpu_vmm_alloc){.bytes = bytes, .dev = (int16_t)dev, .used = 1};
        rc = add_handle(v, handle, a, 1);
        if (rc != 0)
            v->allocs[a].used = 0;
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

/* Index of the first mapping starting at or after va. */
static size_t map_lb(const kgpu_vmm *v, uint64_t va)
{
    size_t lo = 0, hi = v->nmaps;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->maps[mid].va < va)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the mapping containing addr, or -1. */
static ptrdiff_t map_at(const kgpu_vmm *v, uint64_t addr)
{
    size_t lo = 0, hi = v->nmaps;
    while (lo < hi) { /* the last mapping starting at or before addr */
        size_t mid = lo + (hi - lo) / 2;
        if (v->maps[mid].va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const kgpu_vmm_map *m = &v->maps[lo - 1];
    return addr - m->va < m->size ? (ptrdiff_t)(lo - 1) : -1;
}

int kgpu_vmm_retained(kgpu_vmm *v, uint64_t handle, uint64_t addr)
{
    int known = 0;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *e = find_handle(v, handle);
    if (e != NULL) {
        known = add_handle(v, handle, e->alloc, 1) == 0;
    } else {
        /* Every reference was released, yet the mapping keeps the handle valid. */
        ptrdiff_t m = map_at(v, addr);
        if (m >= 0 && v->maps[m].handle == handle)
            known = add_handle(v, handle, v->maps[m].alloc, 1) == 0;
    }
    pthread_mutex_unlock(&v->mu);
    return known;
}

int kgpu_vmm_knows(kgpu_vmm *v, uint64_t handle)
{
    pthread_mutex_lock(&v->mu);
    int known = find_handle(v, handle) != NULL;
    pthread_mutex_unlock(&v->mu);
    return known;
}

void kgpu_vmm_released(kgpu_vmm *v, uint64_t handle, kgpu_vmm_freed *freed)
{
    pthread_mutex_lock(&v->mu);
    size_t i = handle_lb(v, handle);
    if (i < v->nhandles && v->handles[i].handle == handle) {
        uint32_t a = v->handles[i].alloc;
        v->allocs[a].refs--;
        if (--v->handles[i].refs <= 0) {
            memmove(&v->handles[i], &v->handles[i + 1],
                    (v->nhandles - i - 1) * sizeof(*v->handles));
            v->nhandles--;
        }
        maybe_free(v, a, freed);
    }
    pthread_mutex_unlock(&v->mu);
}

int kgpu_vmm_map_cost(kgpu_vmm *v, uint64_t handle, uint64_t offset, uint64_t size,
                      uint64_t *more, int *dev)
{
    *more = 0;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *e = find_handle(v, handle);
    if (e != NULL) {
        const kgpu_vmm_alloc *a = &v->allocs[e->alloc];
        uint64_t end = offset + size < offset ? UINT64_MAX : offset + size;
        if (a->imported && end > a->bytes)
            *more = end - a->bytes;
        *dev = a->dev;
    }
    pthread_mutex_unlock(&v->mu);
    return e != NULL;
}

int64_t kgpu_vmm_mapped(kgpu_vmm *v, uint64_t va, uint64_t size, uint64_t offset,
                        uint64_t handle, uint64_t charged)
{
    int64_t excess = (int64_t)charged;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *e = find_handle(v, handle);
    if (e == NULL)
        goto out; /* released meanwhile by another thread: nothing to keep */
    if (reserve((void **)&v->maps, &v->cap_maps, v->nmaps + 1, sizeof(*v->maps)) != 0) {
        excess = -1;
        goto out;
    }
    kgpu_vmm_alloc *a = &v->allocs[e->alloc];
    if (a->imported) {
        uint64_t end = offset + size < offset ? UINT64_MAX : offset + size;
        uint64_t grow = end > a->bytes ? end - a->bytes : 0;
        if (grow > charged)
            grow = charged; /* never record more than was charged */
        a->bytes += grow;
        excess = (int64_t)(charged - grow);
    }
    size_t lo = map_lb(v, va);
    memmove(&v->maps[lo + 1], &v->maps[lo], (v->nmaps - lo) * sizeof(*v->maps));
    v->maps[lo] = (kgpu_vmm_map){.va = va, .size = size, .handle = handle, .alloc = e->alloc};
    v->nmaps++;
    a->maps++;
out:
    pthread_mutex_unlock(&v->mu);
    return excess;
}

void kgpu_vmm_unmapped(kgpu_vmm *v, uint64_t va, uint64_t size, kgpu_vmm_freed *freed)
{
    uint64_t end = va + size < va ? UINT64_MAX : va + size;
    pthread_mutex_lock(&v->mu);
    size_t lo = map_lb(v, va);
    size_t k = lo;
    while (k < v->nmaps && v->maps[k].va < end)
        k++;
    for (size_t i = lo; i < k; i++) {
        uint32_t a = v->maps[i].alloc;
        v->allocs[a].maps--;
        maybe_free(v, a, freed);
    }
    memmove(&v->maps[lo], &v->maps[k], (v->nmaps - k) * sizeof(*v->maps));
    v->nmaps -= k - lo;
    pthread_mutex_unlock(&v->mu);
}

int kgpu_vmm_tile_mapped(kgpu_vmm *v, uint64_t array, uint64_t where, uint64_t handle)
{
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *h = find_handle(v, handle);
    if (h != NULL) {
        if (reserve((void **)&v->tiles, &v->cap_tiles, v->ntiles + 1, sizeof(*v->tiles)) != 0) {
            rc = -1;
        } else {
            v->tiles[v->ntiles++] =
                (kgpu_vmm_tile){.array = array, .where = where, .alloc = h->alloc};
            v->allocs[h->alloc].maps++;
            rc = 1;
        }
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

void kgpu_vmm_tile_unmapped(kgpu_vmm *v, uint64_t array, uint64_t where, kgpu_vmm_freed *freed)
{
    pthread_mutex_lock(&v->mu);
    for (size_t i = 0; i < v->ntiles;) {
        kgpu_vmm_tile t = v->tiles[i];
        if (t.array == array && (where == UINT64_MAX || t.where == where)) {
            v->tiles[i] = v->tiles[--v->ntiles];
            v->allocs[t.alloc].maps--;
            maybe_free(v, t.alloc, freed);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&v->mu);
}

void kgpu_vmm_exported(kgpu_vmm *v, uint64_t handle, const kgpu_vmm_export *e)
{
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *h = find_handle(v, handle);
    if (h != NULL) {
        kgpu_vmm_alloc *a = &v->allocs[h->alloc];
        prune_exports(v, a);
        if (e != NULL && a->nexports < KGPU_VMM_EXPORTS)
            a->exports[a->nexports++] = *e;
        else
            a->sticky = 1;
    }
    pthread_mutex_unlock(&v->mu);
}

int kgpu_vmm_imported(kgpu_vmm *v, uint64_t handle, const kgpu_vmm_export *e, int dev)
{
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *h = find_handle(v, handle);
    if (h != NULL) { /* the driver handed out a handle this process already has */
        rc = add_handle(v, handle, h->alloc, 1);
        goto out;
    }
    for (size_t i = 0; e != NULL && i < v->nallocs; i++) {
        kgpu_vmm_alloc *a = &v->allocs[i];
        for (int k = 0; a->used && k < a->nexports; k++)
            if (a->exports[k].dev == e->dev && a->exports[k].ino == e->ino) {
                rc = add_handle(v, handle, (uint32_t)i, 1); /* our own export, back again */
                goto out;
            }
    }
    uint32_t a;
    if ((rc = new_alloc(v, &a)) == 0) {
        v->allocs[a] = (kgpu_vmm_alloc){.dev = (int16_t)dev, .used = 1, .imported = 1};
        rc = add_handle(v, handle, a, 1);
        if (rc != 0)
            v->allocs[a].used = 0;
    }
out:
    pthread_mutex_unlock(&v->mu);
    return rc;
}

size_t kgpu_vmm_sweep(kgpu_vmm *v, kgpu_vmm_freed *freed)
{
    size_t n = 0;
    pthread_mutex_lock(&v->mu);
    for (size_t i = 0; i < v->nallocs; i++)
        if (v->allocs[i].used && v->allocs[i].nexports > 0)
            n += (size_t)maybe_free(v, (uint32_t)i, freed);
    pthread_mutex_unlock(&v->mu);
    return n;
}

int kgpu_vmm_mcast_created(kgpu_vmm *v, uint64_t handle)
{
    int rc = -1;
    uint32_t a;
    pthread_mutex_lock(&v->mu);
    if (new_alloc(v, &a) == 0) {
        v->allocs[a] = (kgpu_vmm_alloc){.dev = -1, .used = 1, .mcast = 1};
        rc = add_handle(v, handle, a, 1);
        if (rc != 0)
            v->allocs[a].used = 0;
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

int kgpu_vmm_mcast_bound(kgpu_vmm *v, uint64_t mc, uint64_t off, uint64_t size,
                         uint64_t mem_handle, uint64_t addr)
{
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *m = find_handle(v, mc);
    ptrdiff_t mem = -1;
    if (mem_handle != 0) {
        kgpu_vmm_handle *h = find_handle(v, mem_handle);
        mem = h != NULL ? (ptrdiff_t)h->alloc : -1;
    } else {
        ptrdiff_t at = map_at(v, addr);
        mem = at >= 0 ? (ptrdiff_t)v->maps[at].alloc : -1;
    }
    if (m != NULL && v->allocs[m->alloc].mcast && mem >= 0) {
        if (reserve((void **)&v->binds, &v->cap_binds, v->nbinds + 1, sizeof(*v->binds)) != 0) {
            rc = -1;
        } else {
            v->binds[v->nbinds++] = (kgpu_vmm_bind){.mc = m->alloc, .alloc = (uint32_t)mem,
                                                    .dev = v->allocs[mem].dev, .off = off,
                                                    .size = size};
            v->allocs[mem].maps++;
            rc = 1;
        }
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

void kgpu_vmm_mcast_unbound(kgpu_vmm *v, uint64_t mc, int li, uint64_t off, uint64_t size,
                            kgpu_vmm_freed *freed)
{
    uint64_t end = off + size < off ? UINT64_MAX : off + size;
    pthread_mutex_lock(&v->mu);
    kgpu_vmm_handle *m = find_handle(v, mc);
    ptrdiff_t cell = -1;
    if (m != NULL) {
        cell = m->alloc;
    } else { /* released, alive by a mapping: found through its bindings' cells */
        for (size_t i = 0; i < v->nmaps && cell < 0; i++)
            if (v->maps[i].handle == mc && v->allocs[v->maps[i].alloc].mcast)
                cell = v->maps[i].alloc;
    }
    for (size_t i = 0; cell >= 0 && i < v->nbinds;) {
        const kgpu_vmm_bind *b = &v->binds[i];
        if (b->mc == (uint32_t)cell && b->dev == li && b->off >= off && b->off < end)
            unbind_at(v, i, freed);
        else
            i++;
    }
    pthread_mutex_unlock(&v->mu);
}

void kgpu_vmm_counts(kgpu_vmm *v, size_t *allocs, size_t *handles, size_t *maps)
{
    pthread_mutex_lock(&v->mu);
    size_t n = 0;
    for (size_t i = 0; i < v->nallocs; i++)
        n += v->allocs[i].used;
    *allocs = n;
    *handles = v->nhandles;
    *maps = v->nmaps;
    pthread_mutex_unlock(&v->mu);
}

static void drop_all(kgpu_vmm *v)
{
    free(v->allocs);
    free(v->handles);
    free(v->maps);
    free(v->tiles);
    free(v->binds);
    v->binds = NULL;
    v->nbinds = v->cap_binds = 0;
    v->allocs = NULL;
    v->handles = NULL;
    v->maps = NULL;
    v->tiles = NULL;
    v->nallocs = v->cap_allocs = v->nhandles = v->cap_handles = v->nmaps = v->cap_maps = 0;
    v->ntiles = v->cap_tiles = 0;
}

void kgpu_vmm_forked(kgpu_vmm *v)
{
    pthread_mutex_init(&v->mu, NULL);
    drop_all(v);
}

void kgpu_vmm_clear(kgpu_vmm *v)
{
    pthread_mutex_lock(&v->mu);
    drop_all(v);
    pthread_mutex_unlock(&v->mu);
}
