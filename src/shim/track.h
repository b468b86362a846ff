/*
 * What this process has allocated through the hooks: for each device
 * pointer, memory handle, array or context, its size, the region device it
 * was charged to, and the context it dies with. Frees look their size up
 * here; destroying a context gives back everything recorded under it.
 *
 * An open-addressing hash table behind one mutex; all functions are
 * thread-safe. Records are small values, copied in and out.
 */
#ifndef KGPU_SHIM_TRACK_H
#define KGPU_SHIM_TRACK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cudadecl.h"
#include "shimlimits.h"

enum kgpu_track_kind {
    KGPU_TRACK_MEM = 1, /* CUdeviceptr from the cuMemAlloc* family */
    KGPU_TRACK_HANDLE,  /* CUmemGenericAllocationHandle from cuMemCreate */
    KGPU_TRACK_ARRAY,   /* CUarray */
    KGPU_TRACK_MIPMAP,  /* CUmipmappedArray */
    KGPU_TRACK_CTX,     /* CUcontext from cuCtxCreate: its footprint */
    KGPU_TRACK_GRAPHEXEC, /* CUgraphExec ^ (limits index << 58): its memory nodes' bytes there */
    KGPU_TRACK_LIMIT,     /* context ^ (CUlimit << 56): what raising that limit was charged */
    KGPU_TRACK_LIMITBASE, /* same key: the limit's value before it was first raised (in bytes) */
    KGPU_TRACK_MODULE,    /* CUmodule: its footprint as measured when it loaded */
    KGPU_TRACK_LIBRARY,   /* CUlibrary: likewise */
    KGPU_TRACK_LMEM,      /* CUcontext: its local memory per thread as grown at launches (dev -1) */
};

typedef struct kgpu_track_rec {
    uint64_t key;
    uint64_t bytes;
    uintptr_t ctx; /* the context whose destruction frees it; 0: none */
    int16_t dev;   /* region device (limits index) charged */
    uint8_t kind;  /* enum kgpu_track_kind; 0 in an empty cell */
} kgpu_track_rec;

typedef struct kgpu_track {
    pthread_mutex_t mu;
    kgpu_track_rec *cells; /* cap cells, cap a power of two; NULL until the first put */
    size_t cap, filled;    /* cells, and records in them */
} kgpu_track;

#define KGPU_TRACK_INIT                                                                            \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0                                                      \
    }

/* Records `rec` (replacing a record of the same kind and key). 0, or -1 when out of memory. */
int kgpu_track_put(kgpu_track *t, const kgpu_track_rec *rec);

/* Copies the record of (kind, key) into *out, leaving it; 1 if there is one, else 0. */
int kgpu_track_get(kgpu_track *t, int kind, uint64_t key, kgpu_track_rec *out);

/* Removes the record of (kind, key) into *out; 1 if there was one, else 0. */
int kgpu_track_take(kgpu_track *t, int kind, uint64_t key, kgpu_track_rec *out);

/*
 * Removes every record whose ctx is `ctx` and adds their bytes per device
 * into bytes[] (KGPU_SHIM_MAX_DEVICES entries). Returns how many.
 */
size_t kgpu_track_take_ctx(kgpu_track *t, uintptr_t ctx, uint64_t bytes[KGPU_SHIM_MAX_DEVICES]);

/*
 * The keys of the records of `kind` charged to limits index `dev`: the
 * first `max` into out[]. Returns how many there are (possibly more than max).
 */
size_t kgpu_track_keys(kgpu_track *t, int kind, int dev, uint64_t *out, size_t max);

/* Live records (for tests). */
size_t kgpu_track_count(kgpu_track *t);

/* Frees the table; `t` is empty and usable again. */
void kgpu_track_clear(kgpu_track *t);

/*
 * In a child after fork(): makes `t` empty and its mutex new, whatever state
 * the parent's other threads left it in.
 */
void kgpu_track_forked(kgpu_track *t);

/*
 * Bytes an array of these dimensions takes, as the shim charges it: width x
 * height x depth (0 counts as 1) x channels x bytes per channel of the
 * format, summed over `levels` mipmap levels (each halving every dimension
 * down to 1, except the depth of layered and cubemap arrays, per `flags`
 * as in CUDA_ARRAY3D_DESCRIPTOR); formats it does not know count 16 bytes
 * per channel. UINT64_MAX on overflow.
 */
uint64_t kgpu_track_array_bytes(size_t width, size_t height, size_t depth, int format,
                                unsigned channels, unsigned flags, unsigned levels);

#endif
