/*
 * Virtual memory management as the driver counts it: physical memory made
 * by cuMemCreate (or imported) lives while any handle to it is unreleased,
 * any mapping of it remains, or a shareable handle exported from it is still
 * open. The shim charges an allocation when it is made and gives the charge
 * back only when this table says the last of those is gone.
 *
 * Four kinds of record: allocations (bytes, device, references), handles
 * (a handle value, the allocation it names, how often it was handed out:
 * cuMemCreate, cuMemRetainAllocationHandle, an import), mappings (virtual
 * address range -> allocation), and tiles of sparse arrays mapped to an
 * allocation (cuMemMapArrayAsync). Pure bookkeeping, no driver calls,
 * so it is unit-tested on its own. All functions are thread-safe (one mutex).
 */
#ifndef KGPU_SHIM_VMM_H
#define KGPU_SHIM_VMM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "shimlimits.h"

/* An exported POSIX file descriptor, told from a later one of the same number by its inode. */
typedef struct kgpu_vmm_export {
    int fd;
    uint64_t dev, ino;
} kgpu_vmm_export;

#define KGPU_VMM_EXPORTS 4 /* remembered per allocation; more exports make it sticky */

typedef struct kgpu_vmm_alloc {
    uint64_t bytes; /* charged */
    int16_t dev;    /* limits index charged */
    uint8_t used;   /* 0: a free cell */
    uint8_t sticky; /* exported in a way that cannot be watched: charged until the process ends */
    uint8_t imported; /* charged by what is mapped of it, not made here */
    uint8_t mcast;    /* a multicast object: charged nothing, its bindings keep memory alive */
    int refs;       /* unreleased handles */
    int maps;       /* mappings */
    int nexports;
    kgpu_vmm_export exports[KGPU_VMM_EXPORTS];
} kgpu_vmm_alloc;

typedef struct kgpu_vmm_handle {
    uint64_t handle;
    uint32_t alloc; /* index into allocs */
    int refs;
} kgpu_vmm_handle;

typedef struct kgpu_vmm_map {
    uint64_t va, size;
    uint64_t handle; /* the handle it was mapped with (what cuMemRetainAllocationHandle returns) */
    uint32_t alloc;
} kgpu_vmm_map;

/* A subresource of a sparse array (or mipmapped array) mapped to an allocation. */
typedef struct kgpu_vmm_tile {
    uint64_t array; /* the CUarray or CUmipmappedArray */
    uint64_t where; /* which subresource: a digest of its description */
    uint32_t alloc;
} kgpu_vmm_tile;

/* Memory bound into a multicast object (cuMulticastBindMem/BindAddr) at [off, off+size). */
typedef struct kgpu_vmm_bind {
    uint32_t mc;    /* the multicast object's allocation cell */
    uint32_t alloc; /* the memory bound */
    int16_t dev;    /* limits index of the bound memory (unbinding is per device) */
    uint64_t off, size;
} kgpu_vmm_bind;

/*
 * Whether export `e` is still open in this process (the caller decides how
 * to look; tests pass their own). NULL: exports are never open.
 */
typedef int (*kgpu_vmm_open_fn)(const kgpu_vmm_export *e);

typedef struct kgpu_vmm {
    pthread_mutex_t mu;
    kgpu_vmm_alloc *allocs;
    size_t nallocs, cap_allocs;
    kgpu_vmm_handle *handles; /* sorted by handle */
    size_t nhandles, cap_handles;
    kgpu_vmm_map *maps; /* sorted by va */
    size_t nmaps, cap_maps;
    kgpu_vmm_open_fn is_open;
    kgpu_vmm_tile *tiles; /* unordered: sparse arrays are few */
    size_t ntiles, cap_tiles;
    kgpu_vmm_bind *binds; /* multicast bindings, unordered: few */
    size_t nbinds, cap_binds;
} kgpu_vmm;

#define KGPU_VMM_INIT(open_fn)                                                                     \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, NULL, 0, 0, NULL, 0, 0, open_fn, NULL, 0, 0, NULL,  \
            0, 0                                                                                   \
    }

/* What a call gave back: bytes per limits index, to be uncharged by the caller. */
typedef struct kgpu_vmm_freed {
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES];
} kgpu_vmm_freed;

/* cuMemCreate made `handle`, charged `bytes` on `dev`. 0, or -1 out of memory. */
int kgpu_vmm_created(kgpu_vmm *v, uint64_t handle, uint64_t bytes, int dev);

/*
 * cuMemRetainAllocationHandle returned `handle` for an address in
 * [addr, addr+1): one more reference. 1 if the allocation is known, else 0.
 */
int kgpu_vmm_retained(kgpu_vmm *v, uint64_t handle, uint64_t addr);

/*
 * Whether cuMemRelease(handle) is ours to account: 1 known, 0 unknown.
 * Call before the driver; kgpu_vmm_released after it succeeded.
 */
int kgpu_vmm_knows(kgpu_vmm *v, uint64_t handle);

/* cuMemRelease(handle) succeeded: drops a reference; what died goes into *freed. */
void kgpu_vmm_released(kgpu_vmm *v, uint64_t handle, kgpu_vmm_freed *freed);

/*
 * Before cuMemMap(va, size, offset, handle): how many more bytes mapping it
 * adds to the charge (an imported allocation is charged by the extent
 * mapped of it; 0 for one made here) and on which device (*dev). Returns 1
 * if the handle is known, else 0.
 */
int kgpu_vmm_map_cost(kgpu_vmm *v, uint64_t handle, uint64_t offset, uint64_t size,
                      uint64_t *more, int *dev);

/*
 * cuMemMap succeeded after `charged` more bytes were charged for it (from
 * kgpu_vmm_map_cost): records the mapping. Returns bytes charged twice by
 * threads mapping the same import at once, to be given back. -1 out of memory
 * (nothing recorded).
 */
int64_t kgpu_vmm_mapped(kgpu_vmm *v, uint64_t va, uint64_t size, uint64_t offset,
                        uint64_t handle, uint64_t charged);

/* cuMemUnmap(va, size) succeeded: mappings starting in the range go; what died into *freed. */
void kgpu_vmm_unmapped(kgpu_vmm *v, uint64_t va, uint64_t size, kgpu_vmm_freed *freed);

/*
 * cuMemExportToShareableHandle(handle) gave out `e` (a POSIX file
 * descriptor), or, with e NULL, something that cannot be watched: the
 * allocation then stays charged until the process ends.
 */
void kgpu_vmm_exported(kgpu_vmm *v, uint64_t handle, const kgpu_vmm_export *e);

/*
 * cuMemImportFromShareableHandle returned `handle` for `e` (NULL: not a
 * file descriptor). An export of this process's own is the same allocation
 * again; anything else is a new imported allocation on `dev`, charged as it
 * is mapped. 0, or -1 out of memory.
 */
int kgpu_vmm_imported(kgpu_vmm *v, uint64_t handle, const kgpu_vmm_export *e, int dev);

/*
 * Gives back allocations kept only by exports that have since been closed.
 * Returns how many died; their bytes go into *freed.
 */
size_t kgpu_vmm_sweep(kgpu_vmm *v, kgpu_vmm_freed *freed);

/*
 * cuMemMapArrayAsync mapped `handle` at subresource `where` of `array`: the
 * allocation lives while it stays mapped there. 1 if the handle is known,
 * 0 if not, -1 out of memory.
 */
int kgpu_vmm_tile_mapped(kgpu_vmm *v, uint64_t array, uint64_t where, uint64_t handle);

/* That subresource was unmapped (or the array destroyed: where UINT64_MAX, all of it). */
void kgpu_vmm_tile_unmapped(kgpu_vmm *v, uint64_t array, uint64_t where, kgpu_vmm_freed *freed);

/*
 * Multicast objects (issue 25). cuMulticastCreate made `handle`: a
 * reference like any handle's, charged nothing; mapped and released like
 * one. 0, or -1 out of memory.
 */
int kgpu_vmm_mcast_created(kgpu_vmm *v, uint64_t handle);

/*
 * Memory bound into multicast object `mc` at [off, off+size): by handle
 * (cuMulticastBindMem) or, mem_handle 0, by the mapping at `addr`
 * (cuMulticastBindAddr). The bound allocation lives while the binding
 * does: until unbound, or the object is gone (last reference released and
 * unmapped). 1 recorded, 0 unknown object or memory, -1 out of memory.
 */
int kgpu_vmm_mcast_bound(kgpu_vmm *v, uint64_t mc, uint64_t off, uint64_t size,
                         uint64_t mem_handle, uint64_t addr);

/* cuMulticastUnbind(mc, device li, off, size): bindings starting in the range go. */
void kgpu_vmm_mcast_unbound(kgpu_vmm *v, uint64_t mc, int li, uint64_t off, uint64_t size,
                            kgpu_vmm_freed *freed);

/* Live allocations, handles and mappings (for tests). */
void kgpu_vmm_counts(kgpu_vmm *v, size_t *allocs, size_t *handles, size_t *maps);

/* In a child after fork(): empty, with a new mutex. */
void kgpu_vmm_forked(kgpu_vmm *v);

/* Frees everything; `v` is empty and usable again. */
void kgpu_vmm_clear(kgpu_vmm *v);

#endif
