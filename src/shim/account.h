/*
 * The accounting layer of libkgpu-limit.so, above driver.h and below the
 * hooks: charges against the container's region and what keeps them
 * (charge.c), the footprints the driver reports brought back into them
 * (refresh.c), and the compute-share gate every launch passes (compute.c).
 */
#ifndef KGPU_SHIM_ACCOUNT_H
#define KGPU_SHIM_ACCOUNT_H

#include "driver.h"

/* ---- giving back (inline: one call into the region) ---- */

/* Gives back `bytes` on li. */
static inline void kgpu__uncharge(int li, uint64_t bytes)
{
    kgpu_shim_region_release(kgpu__shim.region, li, bytes);
}

/* Records `bytes` the driver already holds, whatever the limit (a pool grew past its estimate). */
static inline void kgpu__charge_anyway(int li, uint64_t bytes)
{
    if (bytes != 0 && li >= 0)
        kgpu_shim_region_reserve(kgpu__shim.region, li, bytes, UINT64_MAX);
}

/* Gives back what a vmm call freed. */
static inline void kgpu__uncharge_freed(const kgpu_vmm_freed *f)
{
    for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++)
        if (f->bytes[d] != 0)
            kgpu__uncharge(d, f->bytes[d]);
}

/* ---- refresh.c: what the driver reports ---- */

/* A pool's attribute (CU_MEMPOOL_ATTR_*): 0, or -1 where the driver cannot tell. */
int kgpu__pool_attr(CUmemoryPool pool, int attr, uint64_t *v);

/* Device dev's graph memory attribute (CU_GRAPH_MEM_ATTR_*): 0, or -1 where it cannot tell. */
int kgpu__graph_attr(CUdevice dev, int attr, uint64_t *v);

/*
 * Gives back what pools let go since they were last asked (they shrink to
 * their release threshold at synchronisations). Never raises a charge:
 * growth is charged where it happens, at allocations.
 */
void kgpu__pools_refresh(void);

/*
 * What the driver holds that the shim charged by its own report and that
 * may have shrunk since (pools, graph memory) or been let go (closed
 * exports): charges brought down to the driver's figures. Only gives
 * back, so kgpu__charge calls it when a reservation would fail.
 */
void kgpu__mem_refresh(void);

/* ---- charge.c ---- */

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

/* After the driver answered a counted call charged `bytes` at w: keep (recorded) or give back. */
CUresult kgpu__settle(CUresult r, int kind, uint64_t key, uint64_t bytes, const kgpu_where *w);

/* After the driver answered a free of `rec` (had: it was recorded): back if the memory went. */
CUresult kgpu__settle_free(CUresult r, int had, const kgpu_track_rec *rec);

/* Gives back everything recorded under a context that no longer exists. */
void kgpu__drop_ctx(CUcontext ctx);

/* A (mipmapped) array was destroyed: the handles its sparse tiles mapped may be freed. */
void kgpu__array_gone(uint64_t array);

/* ---- compute.c ---- */

/* The slow path of kgpu__compute_gate: some device has a compute share. */
void kgpu__compute_wait(void);

/*
 * The gate of limits index li, whatever the current context (a launch
 * that reaches several devices passes each one's, in ascending order).
 */
void kgpu__compute_wait_li(int li);

/*
 * Before a launch or graph launch on the current context's device: waits
 * for this container's turn when the device has a compute share (no cost
 * otherwise beyond one load, inline here since every launch passes it).
 */
static inline void kgpu__compute_gate(void)
{
    if (atomic_load_explicit(&kgpu__shim.compute_limited, memory_order_relaxed))
        kgpu__compute_wait();
}

/* Whether `stream` (the per-thread default one for NULL with per_thread) is capturing. */
int kgpu__compute_capturing(CUstream stream, int per_thread);

/*
 * The gate of a launch into `stream`: none where the stream is capturing,
 * since the launch then records work into a graph and runs nothing (the
 * graph's launch passes the gate). The driver is asked only while some
 * capture of this process is under way.
 */
static inline void kgpu__compute_gate_on(CUstream stream, int per_thread)
{
    if (atomic_load_explicit(&kgpu__shim.compute_limited, memory_order_relaxed) &&
        (atomic_load_explicit(&kgpu__shim.captures, memory_order_relaxed) == 0 ||
         !kgpu__compute_capturing(stream, per_thread)))
        kgpu__compute_wait();
}

/*
 * Around a synchronisation (the current context's device, or the
 * stream's): marks this container busy on that GPU while it runs, and
 * settles its turn after (compute.c). NULL, and nothing to end, where no
 * device has a compute share.
 */
kgpu_sched *kgpu__compute_sync_current(void);
kgpu_sched *kgpu__compute_sync_stream(CUstream stream);
void kgpu__compute_sync_end(kgpu_sched *s);

static inline kgpu_sched *kgpu__compute_sync(int by_stream, CUstream stream)
{
    if (!atomic_load_explicit(&kgpu__shim.compute_limited, memory_order_relaxed))
        return NULL;
    return by_stream ? kgpu__compute_sync_stream(stream) : kgpu__compute_sync_current();
}

#endif
