/*
 * The launch paths: cuLaunchKernel, cuLaunchKernelEx, the cooperative
 * launches and their per-thread-default-stream (_ptsz) variants; graph
 * launches and uploads (hooks_graph.c) take the same gate. Where a device
 * has a compute share (core_pct below 100), a launch waits for its
 * container's turn on the GPU (compute.c); elsewhere it goes straight to
 * the driver, and what these hooks cost then is what any launch pays
 * (bench/bench_shim.c).
 */
#include "compat.h"
#include "hooks.h"

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
