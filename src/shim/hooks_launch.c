/*
 * The launch paths: cuLaunchKernel, cuLaunchKernelEx, the cooperative
 * launches, their per-thread-default-stream (_ptsz) variants, and the
 * launches from before CUDA 4.0 (cuLaunch, cuLaunchGrid,
 * cuLaunchGridAsync); graph launches and uploads (hooks_graph.c) take the
 * same gate. Where a device has a compute share (core_pct below 100), a
 * launch waits for its container's turn on the GPU (compute.c); elsewhere
 * it goes straight to the driver; a launch into a capturing stream, which
 * records and runs nothing, does not wait. Before either, the local memory the
 * launch makes the context grow is charged (hooks_measure.c): for a
 * function seen before without local memory, a hash and a load. What
 * these hooks cost is what any launch pays (bench/bench_shim.c).
 */
#include "compat.h"
#include "hooks.h"

/* The local memory f needs in the current context, charged; over the limit the launch is refused. */
#define LMEM_OR_RETURN(f)                                                                          \
    do {                                                                                           \
        CUresult lmem_ = kgpu__lmem_launch(f);                                                     \
        if (lmem_ != CUDA_SUCCESS)                                                                 \
            return lmem_;                                                                          \
    } while (0)

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernel, (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                sharedMemBytes, hStream, kernelParams, extra));
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(hStream, 0);
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
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(hStream, 1);
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernelEx, (config, f, kernelParams, extra));
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(config != NULL ? ((const CUlaunchConfig *)config)->hStream : NULL, 0);
    return real_(config, f, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const void *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    KGPU_ENTER(cuLaunchKernelEx_ptsz, (config, f, kernelParams, extra));
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(config != NULL ? ((const CUlaunchConfig *)config)->hStream : NULL, 1);
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
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(hStream, 0);
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
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(hStream, 1);
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams);
}

/*
 * One launch on several devices, each entry in its stream's context: the
 * local memory of each entry's function is charged in that context, and
 * the gate of every device the list reaches is passed, each once, in
 * ascending order of limits index (so two processes never wait for each
 * other's devices in opposite orders).
 */
CUresult cuLaunchCooperativeKernelMultiDevice(void *launchParamsList, unsigned int numDevices,
                                              unsigned int flags)
{
    KGPU_ENTER(cuLaunchCooperativeKernelMultiDevice, (launchParamsList, numDevices, flags));
    const CUDA_LAUNCH_PARAMS *p = launchParamsList;
    kgpu__pfn_cuStreamGetCtx get = KGPU_REAL(cuStreamGetCtx);
    kgpu__pfn_cuCtxPushCurrent_v2 push = KGPU_REAL(cuCtxPushCurrent_v2);
    kgpu__pfn_cuCtxPopCurrent_v2 pop = KGPU_REAL(cuCtxPopCurrent_v2);
    _Static_assert(KGPU_SHIM_MAX_DEVICES <= 32, "a device set fits a 32-bit mask");
    uint32_t reached = 0;
    /* More entries than devices can exist is the driver's error to report. */
    for (unsigned int i = 0; p != NULL && i < numDevices && i < KGPU_SHIM_MAX_CUDA_DEVICES; i++) {
        kgpu_where w;
        CUcontext ctx = NULL, popped;
        if (kgpu__where_stream(p[i].hStream, &w) == CUDA_SUCCESS && w.li >= 0 &&
            w.li < KGPU_SHIM_MAX_DEVICES)
            reached |= 1u << w.li;
        CUresult r = CUDA_SUCCESS;
        if (get != NULL && push != NULL && pop != NULL &&
            get(p[i].hStream, &ctx) == CUDA_SUCCESS && ctx != NULL &&
            push(ctx) == CUDA_SUCCESS) {
            r = kgpu__lmem_launch(p[i].function);
            pop(&popped);
        } else {
            r = kgpu__lmem_launch(p[i].function);
        }
        if (r != CUDA_SUCCESS)
            return r;
    }
    if (reached == 0) /* no entry's device known: the current context's, as any launch */
        kgpu__compute_gate();
    else if (atomic_load_explicit(&kgpu__shim.compute_limited, memory_order_relaxed))
        for (int li = 0; li < KGPU_SHIM_MAX_DEVICES; li++)
            if (reached & (1u << li))
                kgpu__compute_wait_li(li);
    return real_(launchParamsList, numDevices, flags);
}

/* ---- the launches from before CUDA 4.0 ---- */

CUresult cuLaunch(CUfunction f)
{
    KGPU_ENTER(cuLaunch, (f));
    LMEM_OR_RETURN(f);
    kgpu__compute_gate();
    return real_(f);
}

CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    KGPU_ENTER(cuLaunchGrid, (f, grid_width, grid_height));
    LMEM_OR_RETURN(f);
    kgpu__compute_gate();
    return real_(f, grid_width, grid_height);
}

CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    KGPU_ENTER(cuLaunchGridAsync, (f, grid_width, grid_height, hStream));
    LMEM_OR_RETURN(f);
    kgpu__compute_gate_on(hStream, 0);
    return real_(f, grid_width, grid_height, hStream);
}
