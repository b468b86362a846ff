/*
 * The launch paths: cuLaunchKernel, cuLaunchKernelEx, the cooperative
 * launches and their per-thread-default-stream (_ptsz) variants; graph
 * launches are in hooks_mem.c. This is where a container's share of GPU
 * time (core_pct) is to be enforced; docs/shim.md ("Compute shares") says
 * which mechanism and why, and that enforcement is not in place yet: every
 * launch goes to the driver unchanged. What these hooks cost on their own
 * is what any launch pays when no limit applies (bench/bench_shim.c).
 */
#include "shim.h"

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernel, (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                sharedMemBytes, hStream, kernelParams, extra));
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
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **kernelParams, void **extra)
{
    KGPU_ENTER(cuLaunchKernelEx, (config, f, kernelParams, extra));
    return real_(config, f, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const void *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    KGPU_ENTER(cuLaunchKernelEx_ptsz, (config, f, kernelParams, extra));
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
    return real_(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                 hStream, kernelParams);
}

CUresult cuLaunchCooperativeKernelMultiDevice(void *launchParamsList, unsigned int numDevices,
                                              unsigned int flags)
{
    KGPU_ENTER(cuLaunchCooperativeKernelMultiDevice, (launchParamsList, numDevices, flags));
    return real_(launchParamsList, numDevices, flags);
}
