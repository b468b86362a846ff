/*
 * The bottom layer of libkgpu-limit.so above its pure modules: the one
 * process-wide state (state.c) and glibc's own dl functions, reached past
 * this library's interposers (glibc.c). Every layer above includes this.
 * The function types and table indices are generated from hooks.def.
 *
 * The state is one process-wide object: the hooks' signatures are fixed by
 * CUDA and NVML, so a static is the only way they can reach it.
 */
#ifndef KGPU_SHIM_STATE_H
#define KGPU_SHIM_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cudadecl.h"
#include "shimlimits.h"
#include "region.h"
#include "gpusched.h"
#include "track.h"
#include "vmm.h"

#define KGPU_EXPORT __attribute__((visibility("default")))

/* Generated: a function pointer type per entry, kgpu__pfn_<name>. */
#define X(lib, name, use, need, since, ret, params) typedef ret(*kgpu__pfn_##name) params;
#include "hooks.def"
#undef X

/* Generated: KGPU_FN_<name>, each entry's index in the tables. */
enum {
#define X(lib, name, use, need, since, ret, params) KGPU_FN_##name,
#include "hooks.def"
#undef X
    KGPU_FN_COUNT
};

enum kgpu_shim_mode {
    KGPU_MODE_UNKNOWN = 0, /* not decided yet: no hook has run */
    KGPU_MODE_PASS,        /* no limits: pure pass-through */
    KGPU_MODE_ACTIVE,      /* limits enforced */
    KGPU_MODE_FAILED,      /* limits present but unusable: every hooked call fails */
};

#define KGPU_SHIM_MAX_CUDA_DEVICES 64
#define KGPU_SHIM_CONTEXT_MIB      300 /* charged per context when it cannot be measured */
#define KGPU_SHIM_CONTEXT_MIN_MIB  32   /* a measured context below this is not believed */
#define KGPU_SHIM_CONTEXT_MAX_MIB  4096 /* nor one above this */

typedef struct kgpu_shim_state {
    _Atomic int mode; /* enum kgpu_shim_mode */
    _Atomic int cuda_ready, nvml_ready;
    pthread_once_t config_once, cuda_once, nvml_once;
    char reason[600];   /* why FAILED, one line */
    _Atomic int told;   /* the reason went to stderr */
    _Atomic int warned; /* an unlisted device was reported */

    kgpu_shim_limits limits;
    uint64_t limit_bytes[KGPU_SHIM_MAX_DEVICES];
    uint64_t context_bytes; /* charged before a context is made, and when it cannot be measured */
    uint64_t context_floor; /* KGPU_CONTEXT_MIB: never less is charged per context (0: unset) */
    kgpu_shim_region *region;

    void *cuda_lib, *nvml_lib;
    void *_Atomic real[KGPU_FN_COUNT]; /* the driver's functions, NULL where missing (real.c) */

    /* CUDA device ordinal -> limits index (-1: none), once cuInit succeeded. */
    pthread_mutex_t dev_mu;
    _Atomic int dev_mapped;
    int16_t devmap[KGPU_SHIM_MAX_CUDA_DEVICES];

    /*
     * Primary contexts this process retains: charged on the first retain,
     * given back on the last release. ctx is written under prim_mu and read
     * without it by allocations, to learn the device of the current context
     * without asking the driver; nprimary bounds that search.
     */
    pthread_mutex_t prim_mu;
    struct {
        int refs;
        _Atomic(CUcontext) ctx;
        uint64_t bytes; /* what its footprint was charged */
    } primary[KGPU_SHIM_MAX_CUDA_DEVICES];
    _Atomic int nprimary;

    kgpu_track track;
    kgpu_vmm vmm;

    /*
     * Stream-ordered pools seen in this process, each charged what the
     * driver says it reserves; and each device's graph memory, likewise.
     * Under pool_mu.
     */
    pthread_mutex_t pool_mu;
    struct kgpu_shim_pool {
        CUmemoryPool pool;
        int li;         /* limits index charged */
        CUdevice dev;   /* CUDA ordinal */
        uint64_t charged;
    } *pools;
    size_t npools, cap_pools;
    uint64_t graph_charged[KGPU_SHIM_MAX_CUDA_DEVICES];

    /*
     * A MADV_WIPEONFORK page: 0 in a child made without fork's handlers
     * (_Fork, clone), whose inherited state is then dropped at its next
     * hooked call as fork_child drops it. NULL where the kernel cannot.
     */
    volatile uint8_t *fork_mark;

    /*
     * Compute shares: set when a device has core_pct below 100; the GPU's
     * schedule per limits index, joined at the first launch there (gpusched.h).
     */
    _Atomic int compute_limited;
    /*
     * Stream captures begun and not yet ended, by this process's threads
     * (hooks_graph.c). Where none is, a launch does not ask the driver
     * whether its stream captures. A thread that dies mid-capture leaves it
     * above zero: launches then ask, which costs a driver call, not a turn.
     */
    _Atomic int captures;

    /*
     * Bumped whenever a context's local memory reservation may have shrunk
     * or its handle may name another context: a stack limit set, a
     * context gone, a fork. A thread's cache of "this context already
     * holds this much local memory" (hooks_measure.c) is good only for
     * the generation it was filled in.
     */
    _Atomic uint64_t lmem_gen;
    char sched_dir[4096], sched_id[64];
    pthread_mutex_t sched_mu;
    kgpu_sched *_Atomic sched[KGPU_SHIM_MAX_DEVICES];
    _Atomic uint8_t sched_tried[KGPU_SHIM_MAX_DEVICES];
} kgpu_shim_state;

extern kgpu_shim_state kgpu__shim;

/* ---- state.c ---- */

/* Decides the mode (reads the limits file, attaches the region) once; returns it. */
int kgpu__config(void);

/* Records why limits cannot be enforced (one line) and turns the mode to FAILED. */
__attribute__((format(printf, 1, 2))) void kgpu__set_failed(const char *fmt, ...);

/* Writes "kgpu-limit: <line>" to stderr in one write(2): no stdio state is touched. */
void kgpu__say(const char *line);

/* Tells why CUDA is disabled (once per process) and returns CUDA_ERROR_NOT_INITIALIZED. */
CUresult kgpu__refuse(void);

/* In a child made without fork's handlers: what fork_child would have done. */
void kgpu__forked_quietly(void);

/* Limit of limits index li in bytes (0 for -1). */
static inline uint64_t kgpu__limit(int li)
{
    return li >= 0 && li < KGPU_SHIM_MAX_DEVICES ? kgpu__shim.limit_bytes[li] : 0;
}

/* ---- glibc.c: glibc's own functions, never this library's interposers ---- */

/* glibc's dlvsym itself (found in the C library's symbol table: never this library's). */
void *kgpu__real_dlvsym(void *handle, const char *name, const char *version);

typedef void *(*kgpu__dlsym_fn)(void *, const char *);
typedef void *(*kgpu__dlopen_fn)(const char *, int);
typedef void *(*kgpu__dlmopen_fn)(long /* Lmid_t */, const char *, int);

/* glibc's dlsym, dlopen and dlmopen, found once with glibc's dlvsym; NULL where it has none. */
kgpu__dlsym_fn kgpu__real_dlsym(void);
kgpu__dlopen_fn kgpu__real_dlopen(void);
kgpu__dlmopen_fn kgpu__real_dlmopen(void);

#endif
