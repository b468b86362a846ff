/*
 * The compute-share gate: where a device has a compute share (core_pct
 * below 100), a launch there waits for its container's turn on the GPU
 * (gpusched.c; docs/shim.md, "Compute shares"), in the GPU's schedule,
 * joined at the first launch. Elsewhere kgpu__compute_gate (account.h)
 * costs one load and never comes here.
 */
#include "compat.h"
#include "account.h"

/*
 * The limits index whose turn the calling thread is giving up, where it is
 * not the current context's (kgpu__compute_wait_li): the gate's drain
 * takes no argument.
 */
static _Thread_local int drain_li = -1;

/* Synchronizes context ctx, made current for the while (push, sync, pop). */
static void drain_ctx(CUcontext ctx)
{
    kgpu__pfn_cuCtxSynchronize sync = KGPU_REAL(cuCtxSynchronize);
    kgpu__pfn_cuCtxPushCurrent_v2 push = KGPU_REAL(cuCtxPushCurrent_v2);
    kgpu__pfn_cuCtxPopCurrent_v2 pop = KGPU_REAL(cuCtxPopCurrent_v2);
    CUcontext popped;
    if (ctx == NULL || push == NULL || pop == NULL || push(ctx) != CUDA_SUCCESS)
        return;
    sync();
    pop(&popped);
}

/*
 * Gives the GPU up cleanly: the work queued by every context this process
 * has on that GPU has run, not only the calling thread's current one (a
 * process may hold several: contexts it made, the primary one it retained).
 * They are the contexts the library charges a footprint for: those made
 * (the allocation table's KGPU_TRACK_CTX records, by limits index) and the
 * retained primary contexts of the CUDA devices on this limits line.
 */
static void drain_all(void)
{
    kgpu__pfn_cuCtxSynchronize sync = KGPU_REAL(cuCtxSynchronize);
    kgpu_where w = {.li = -1, .ctx = NULL};
    if (sync == NULL)
        return;
    sync(); /* the current context first, whatever the table knows */
    if (kgpu__where_current(&w) != CUDA_SUCCESS)
        w.ctx = NULL;
    int li = drain_li >= 0 ? drain_li : w.li;
    CUcontext cur = w.ctx;
    if (li < 0)
        return;
    uint64_t made[64];
    size_t n = kgpu_track_keys(&kgpu__shim.track, KGPU_TRACK_CTX, li, made, 64);
    for (size_t i = 0; i < n && i < 64; i++)
        if ((CUcontext)(uintptr_t)made[i] != cur)
            drain_ctx((CUcontext)(uintptr_t)made[i]);
    int np = atomic_load_explicit(&kgpu__shim.nprimary, memory_order_acquire);
    for (int d = 0; d < np; d++) {
        CUcontext p = atomic_load_explicit(&kgpu__shim.primary[d].ctx, memory_order_relaxed);
        if (p != NULL && p != cur && kgpu__shim.devmap[d] == li)
            drain_ctx(p);
    }
}

/*
 * The drain is the library's synchronisation, not the application's: it
 * must not break a stream capture under way. In the default (global)
 * capture mode the driver refuses cuCtxSynchronize to a thread that is
 * capturing, or while any thread captures globally, and invalidates that
 * capture (a training loop recording a CUDA graph would see
 * cuStreamEndCapture fail). So the drain runs in the relaxed mode, which
 * allows it, and the thread's own mode is put back after.
 */
static void drain(void)
{
    kgpu__pfn_cuThreadExchangeStreamCaptureMode xchg = KGPU_REAL(cuThreadExchangeStreamCaptureMode);
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    int swapped = xchg != NULL && xchg(&mode) == CUDA_SUCCESS;
    drain_all();
    if (swapped)
        xchg(&mode);
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

/* ---- the gate of a given device (multi-device launches) ---- */

void kgpu__compute_wait_li(int li)
{
    if (li < 0 || li >= kgpu__shim.limits.ndevices)
        return;
    int pct = kgpu__shim.limits.dev[li].core_pct;
    kgpu_sched *s = pct >= 0 && pct < 100 ? sched_for(li) : NULL;
    if (s != NULL) {
        drain_li = li;
        kgpu_sched_gate(s, drain);
        drain_li = -1;
    }
}

int kgpu__compute_capturing(CUstream stream, int per_thread)
{
    kgpu__pfn_cuStreamIsCapturing is_capturing = KGPU_REAL(cuStreamIsCapturing);
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (stream == NULL && per_thread)
        stream = KGPU_CU_STREAM_PER_THREAD;
    /* An error (the legacy stream beside a capture): not capturing; the launch meets the driver's. */
    return is_capturing != NULL && is_capturing(stream, &status) == CUDA_SUCCESS &&
           status != CU_STREAM_CAPTURE_STATUS_NONE;
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
