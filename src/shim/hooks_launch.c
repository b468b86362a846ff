/*
 * The launch paths: cuLaunchKernel, cuLaunchKernelEx, the cooperative
 * launches and their per-thread-default-stream (_ptsz) variants; graph
 * launches and uploads (hooks_mem.c) take the same gate. Where a device has
 * a compute share (core_pct below 100), a launch waits for its container's
 * turn on the GPU (gpusched.c; docs/shim.md, "Compute shares"); elsewhere it
 * goes straight to the driver, and what these hooks cost then is what any
 * launch pays (bench/bench_shim.c).
 */
#include "shim.h"

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
                              &s, &err) == KGPU_OK)
            atomic_store_explicit(&kgpu__shim.sched[li], s, memory_order_release);
        kgpu__shim.sched_tried[li] = 1;
    }
    s = atomic_load(&kgpu__shim.sched[li]);
    pthread_mutex_unlock(&kgpu__shim.sched_mu);
    return s;
}

void kgpu__compute_gate(void)
{
    if (!atomic_load_explicit(&kgpu__shim.compute_limited, memory_order_relaxed))
        return;
    kgpu_where w;
    if (kgpu__where_current(&w) != CUDA_SUCCESS || w.li < 0 ||
        w.li >= kgpu__shim.limits.ndevices) /* the launch fails in the driver, or is not ours */
        return;
    int pct = kgpu__shim.limits.dev[w.li].core_pct;
    kgpu_sched *s = pct >= 0 && pct < 100 ? sched_for(w.li) : NULL;
    if (s != NULL)
        kgpu_sched_gate(s, drain);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernel, (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                sharedMemBytes, hStream, kernelParams, extra));
    kgpu__compute_gate();
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes,
                             CUstream hStream, void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernel_ptsz, (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                     blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
    kgpu__compute_gate();
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernelEx, (config, f, kernelParams, extra));
    kgpu__compute_gate();
    return real_(config, f, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const void *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    KGPU_ENTER(cuLaunchKernelEx_ptsz, (config, f, kernelParams, extra));
    kgpu__compute_gate();
    return real_(config, f, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    KGPU_ENTER(cuLaunchCooperativeKernel, (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                           blockDimZ, sharedMemBytes, hStream, kernelParams));
    kgpu__compute_gate();
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    KGPU_ENTER(cuLaunchCooperativeKernel_ptsz,
               (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                hStream, kernelParams));
    kgpu__compute_gate();
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams);
}

CUresult cuLaunchCooperativeKernelMultiDevice(void *launchParamsList, unsigned int numDevices,
                                              unsigned int flags)
{
    KGPU_ENTER(cuLaunchCooperativeKernelMultiDevice, (launchParamsList, numDevices, flags));
    kgpu__compute_gate();
    return real_(launchParamsList, numDevices, flags);
}
