/*
 * Internals of libkgpu-limit.so shared by shim.c (state, symbol resolution,
 * the dlsym and cuGetProcAddress routes) and hooks.c (the hooks' bodies).
 * The function types, exported prototypes and table indices are generated
 * from hooks.def.
 *
 * The state is one process-wide object: the hooks' signatures are fixed by
 * CUDA and NVML, so a static is the only way they can reach it.
 */
#ifndef KGPU_SHIM_H
#define KGPU_SHIM_H

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

/* Generated: the exported prototypes of the hooks (CALL entries are not exported). */
#define KGPU__IF_HOOK(...) __VA_ARGS__
#define KGPU__IF_CALL(...)
#define X(lib, name, use, need, since, ret, params) KGPU__IF_##use(KGPU_EXPORT ret name params;)
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
    void *_Atomic real[KGPU_FN_COUNT]; /* the driver's functions, NULL where missing */

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
    char sched_dir[4096], sched_id[64];
    pthread_mutex_t sched_mu;
    kgpu_sched *_Atomic sched[KGPU_SHIM_MAX_DEVICES];
    _Atomic uint8_t sched_tried[KGPU_SHIM_MAX_DEVICES];
} kgpu_shim_state;

extern kgpu_shim_state kgpu__shim;

/* Decides the mode (reads the limits file, attaches the region) once; returns it. */
int kgpu__config(void);

/* kgpu__config, then the real CUDA functions resolved once; returns the mode. */
int kgpu__cuda(void);

/* kgpu__config, then the real NVML functions resolved once; returns the mode. */
int kgpu__nvml(void);

/* The real function of entry i (NULL when the driver lacks it). */
static inline void *kgpu__real(int i)
{
    return atomic_load_explicit(&kgpu__shim.real[i], memory_order_relaxed);
}

#define KGPU_REAL(name) ((kgpu__pfn_##name)kgpu__real(KGPU_FN_##name))

/* Tells why CUDA is disabled (once per process) and returns CUDA_ERROR_NOT_INITIALIZED. */
CUresult kgpu__refuse(void);

/* Maps CUDA ordinals to limits entries if not done yet (needs cuInit to have succeeded). */
void kgpu__map_devices(void);

/*
 * Limits index of CUDA device `dev`; -1: on no line, nothing may be
 * allocated there; -2: not known before cuInit has succeeded.
 */
int kgpu__dev_index(CUdevice dev);

/* Limit of limits index li in bytes (0 for -1). */
static inline uint64_t kgpu__limit(int li)
{
    return li >= 0 && li < KGPU_SHIM_MAX_DEVICES ? kgpu__shim.limit_bytes[li] : 0;
}

/* Limits index whose uuid matches `uuid` ("GPU-..."/"MIG-..." or bare), or -1. */
int kgpu__uuid_index(const char *uuid);

/*
 * What cuGetProcAddress(symbol, version, flags) should hand out instead of
 * `fn`, the driver's answer (see shim.c).
 */
void *kgpu__proc_substitute(const char *symbol, void *fn, int version, cuuint64_t flags);

/* The hook for entry i, or NULL (CALL entries). */
void *kgpu__hook(int i);

/* The hook called `name` (without dlsym's lookup of the driver), or NULL. */
void *kgpu__hook_named(const char *name);

/* glibc's dlvsym itself (found in the C library's symbol table: never this library's). */
void *kgpu__real_dlvsym(void *handle, const char *name, const char *version);

/* What a dlsym/dlvsym of `name` that found `p` hands out (see loader.c). */
void *kgpu__lookup_result(const char *name, void *p);

/* In a child made without fork's handlers: what fork_child would have done. */
void kgpu__forked_quietly(void);

/* ---- shared by the hooks (hooks.c, hooks_mem.c) ---- */

/*
 * Resolves the driver once, then: pass-through without limits, refusal
 * with unusable ones, CUDA_ERROR_NOT_FOUND when the driver lacks the
 * function. Leaves `real_` set to the driver's function.
 */
#define KGPU_ENTER(name, args)                                                                     \
    int mode_ = kgpu__cuda();                                                                      \
    kgpu__pfn_##name real_ = KGPU_REAL(name);                                                      \
    if (mode_ == KGPU_MODE_PASS)                                                                   \
        return real_ != NULL ? real_ args : CUDA_ERROR_NOT_FOUND;                                  \
    if (mode_ != KGPU_MODE_ACTIVE)                                                                 \
        return kgpu__refuse();                                                                     \
    if (real_ == NULL)                                                                             \
    return CUDA_ERROR_NOT_FOUND

#define STREAM_LEGACY     ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)

/* Where an allocation lands: limits index charged, CUDA ordinal, the context it dies with. */
typedef struct kgpu_where {
    int li;
    CUdevice dev;
    CUcontext ctx;
} kgpu_where;

/* After the driver answered a counted call charged `bytes` at w: keep (recorded) or give back. */
CUresult kgpu__settle(CUresult r, int kind, uint64_t key, uint64_t bytes, const kgpu_where *w);

/* After the driver answered a free of `rec` (had: it was recorded): back if the memory went. */
CUresult kgpu__settle_free(CUresult r, int had, const kgpu_track_rec *rec);

/* The current context's device (li -2 before cuInit). */
CUresult kgpu__where_current(kgpu_where *w);

/* The device of a stream's context. */
CUresult kgpu__where_stream(CUstream s, kgpu_where *w);

/*
 * Reserves `bytes` on limits index li: CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY
 * over the limit (after giving back what dead processes, closed exports and
 * shrunken pools no longer hold), or CUDA_ERROR_NOT_INITIALIZED for li -2.
 */
CUresult kgpu__charge(int li, uint64_t bytes);

/* kgpu__charge, returning its error from the calling hook when it fails. */
#define CHARGE_OR_RETURN(li, bytes)                                                                \
    do {                                                                                           \
        CUresult charged_ = kgpu__charge(li, bytes);                                               \
        if (charged_ != CUDA_SUCCESS)                                                              \
            return charged_;                                                                       \
    } while (0)

/* Records `bytes` the driver already holds, whatever the limit (a pool grew past its estimate). */
void kgpu__charge_anyway(int li, uint64_t bytes);

/* Gives back `bytes` on li. */
void kgpu__uncharge(int li, uint64_t bytes);

/* Gives back what a vmm call freed. */
void kgpu__uncharge_freed(const kgpu_vmm_freed *f);

/* A (mipmapped) array was destroyed: the handles its sparse tiles mapped may be freed. */
void kgpu__array_gone(uint64_t array);

/* Gives back everything recorded under a context that no longer exists. */
void kgpu__drop_ctx(CUcontext ctx);

/*
 * What the driver holds that the shim charged by its own report and that
 * may have shrunk since (pools, graph memory) or been let go (closed
 * exports): charges brought down to the driver's figures. Called when a
 * reservation would fail.
 */
void kgpu__mem_refresh(void);

/* Whether an exported descriptor is still open in this process (vmm.h's is_open). */
int kgpu__export_open(const kgpu_vmm_export *e);

/*
 * Before a launch or graph launch on the current context's device: waits
 * for this container's turn when the device has a compute share (no cost
 * otherwise beyond one load).
 */
void kgpu__compute_gate(void);

/*
 * What a context just made on CUDA device dev (limits index li) is charged:
 * measured across its creation where the driver lets it be (see hooks.c),
 * else the configured figure. Filled by kgpu__ctx_before, read by
 * kgpu__ctx_footprint.
 */
typedef struct kgpu_ctx_probe {
    int how; /* 0: not measurable; 1: NVML's free memory; 2: cuMemGetInfo in a context */
    uint64_t free;
    nvmlDevice_t nvml;
} kgpu_ctx_probe;

void kgpu__ctx_before(CUdevice dev, int li, kgpu_ctx_probe *p);

/* The charge for `made`, measured by the same means as p (measured: set when it was). */
uint64_t kgpu__ctx_footprint(const kgpu_ctx_probe *p, CUcontext made, int *measured);

/* The CUDA ordinal of limits index li (first match), or -1. */
CUdevice kgpu__cuda_dev(int li);

#endif
