/*
 * The compute-share gate: where a device has a compute share (core_pct
 * below 100), a launch there waits for its container's turn on the GPU
 * (gpusched.c; docs/shim.md, "Compute shares"), in the GPU's schedule,
 * joined at the first launch. Elsewhere kgpu__compute_gate (account.h)
 * costs one load and never comes here.
 */
#include "compat.h"
#include "account.h"

/* Gives the GPU up cleanly: the work this context queued has run. */
static void drain(void)
{
    kgpu__pfn_cuCtxSynchronize sync = KGPU_REAL(cuCtxSynchronize);
    if (sync != NULL)
        sync();
}

/* The schedule of limits index li, joined on first use; NULL where there is none to join. */
static kgpu_sched *sched_for(int li)
{
    kgpu_sched *s = atomic_load_explicit(&kgpu__shim.sched[li], memory_order_acquire);
    if (s != NULL || kgpu__shim.sched_tried[li])
        return s;
    pthread_mutex_lock(&kgpu__shim.sched_mu);
    if (!kgpu__shim.sched_tried[li]) {
        kgpu_error err = {0};
        const kgpu_shim_device_limit *d = &kgpu__shim.limits.dev[li];
        /*
         * No schedule directory (the node does not provide one): shares are
         * not enforced, and the library says nothing (docs/shim.md).
         */
        if (kgpu_sched_attach(kgpu__shim.sched_dir, d->uuid, kgpu__shim.sched_id, d->core_pct,
                              d->core_limit_pct, &s, &err) == KGPU_OK)
            atomic_store_explicit(&kgpu__shim.sched[li], s, memory_order_release);
        kgpu__shim.sched_tried[li] = 1;
    }
    s = atomic_load(&kgpu__shim.sched[li]);
    pthread_mutex_unlock(&kgpu__shim.sched_mu);
    return s;
}

void kgpu__compute_wait(void)
{
    kgpu_where w;
    if (kgpu__where_current(&w) != CUDA_SUCCESS || w.li < 0 ||
        w.li >= kgpu__shim.limits.ndevices) /* the launch fails in the driver, or is not ours */
        return;
    int pct = kgpu__shim.limits.dev[w.li].core_pct;
    kgpu_sched *s = pct >= 0 && pct < 100 ? sched_for(w.li) : NULL;
    if (s != NULL)
        kgpu_sched_gate(s, drain);
}

/* The schedule of the device at w, where it has a compute share; else NULL. */
static kgpu_sched *sched_at(const kgpu_where *w)
{
    if (w->li < 0 || w->li >= kgpu__shim.limits.ndevices)
        return NULL;
    int pct = kgpu__shim.limits.dev[w->li].core_pct;
    return pct >= 0 && pct < 100 ? sched_for(w->li) : NULL;
}

/*
 * A synchronisation is where queued work is seen to finish: while one
 * runs, the container is busy on that device's GPU, not idle (gpusched.h).
 */
kgpu_sched *kgpu__compute_sync_current(void)
{
    kgpu_where w;
    kgpu_sched *s = kgpu__where_current(&w) == CUDA_SUCCESS ? sched_at(&w) : NULL;
    if (s != NULL)
        kgpu_sched_sync_begin(s);
    return s;
}

kgpu_sched *kgpu__compute_sync_stream(CUstream stream)
{
    kgpu_where w;
    kgpu_sched *s = kgpu__where_stream(stream, &w) == CUDA_SUCCESS ? sched_at(&w) : NULL;
    if (s != NULL)
        kgpu_sched_sync_begin(s);
    return s;
}

void kgpu__compute_sync_end(kgpu_sched *s)
{
    if (s != NULL)
        kgpu_sched_sync_end(s);
}
