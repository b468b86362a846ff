/*
 * What the real-GPU programs (gpu_real.c, gpu_share.c) share: their PTX
 * kernels (no CUDA compiler is needed, the driver compiles them at
 * cuModuleLoadData; the text is the module image) and how they find GPU 0.
 * Included by one .c file each.
 */
#ifndef KGPU_TEST_SHIM_GPU_KERNELS_H
#define KGPU_TEST_SHIM_GPU_KERNELS_H

#include <stdio.h>
#include <sys/stat.h>

#include "cudadecl.h"

/*
 * GPU 0 through the driver's own functions, and its UUID as nvidia-smi
 * writes it (GPU-xxxxxxxx-...). 0; 77, said on stdout, where the check
 * cannot run here (no driver or GPU, or a /etc/kgpu/limits that would
 * shadow KGPU_LIMITS_FILE); 1 when the driver fails.
 */
static int kgpu_gpu_first(CUresult (*init)(unsigned), CUresult (*device_get)(CUdevice *, int),
                          CUresult (*get_uuid)(CUuuid *, CUdevice), CUdevice *dev, char *uuid,
                          size_t size)
{
    CUuuid u;
    struct stat st;
    if (init(0) != CUDA_SUCCESS || device_get(dev, 0) != CUDA_SUCCESS) {
        printf("skipped: no CUDA driver or GPU here\n");
        return 77;
    }
    if (lstat("/etc/kgpu/limits", &st) == 0) {
        printf("skipped: /etc/kgpu/limits exists, so KGPU_LIMITS_FILE would be ignored\n");
        return 77;
    }
    if (get_uuid(&u, *dev) != CUDA_SUCCESS) {
        printf("FAIL: cuDeviceGetUuid\n");
        return 1;
    }
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(uuid, size,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return 0;
}

/*
 * fill(buf, n, value): buf[i] = value for i < n.
 * spin(out, iters): a chain of iters dependent multiply-adds per thread, its
 * result stored so that the compiler keeps it: fixed work per kernel.
 */
static const char kgpu_gpu_ptx[] =
    ".version 6.4\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry kgpu_fill(.param .u64 p_buf, .param .u32 p_n, .param .u32 p_val)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    ld.param.u64 %rd1, [p_buf];\n"
    "    ld.param.u32 %r1, [p_n];\n"
    "    ld.param.u32 %r2, [p_val];\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %ntid.x;\n"
    "    mov.u32 %r5, %tid.x;\n"
    "    mad.lo.u32 %r6, %r3, %r4, %r5;\n"
    "    setp.ge.u32 %p1, %r6, %r1;\n"
    "    @%p1 bra DONE;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r6, 4;\n"
    "    add.s64 %rd4, %rd2, %rd3;\n"
    "    st.global.u32 [%rd4], %r2;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry kgpu_spin(.param .u64 p_out, .param .u32 p_iters)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .f32 %f<3>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    ld.param.u64 %rd1, [p_out];\n"
    "    ld.param.u32 %r1, [p_iters];\n"
    "    mov.u32 %r2, %tid.x;\n"
    "    cvt.rn.f32.u32 %f1, %r2;\n"
    "    mov.f32 %f2, 0f3F800000;\n"
    "    mov.u32 %r3, 0;\n"
    "LOOP:\n"
    "    fma.rn.f32 %f1, %f1, 0f3F7FF972, %f2;\n"
    "    add.u32 %r3, %r3, 1;\n"
    "    setp.lt.u32 %p1, %r3, %r1;\n"
    "    @%p1 bra LOOP;\n"
    "    mov.u32 %r4, %ctaid.x;\n"
    "    mov.u32 %r5, %ntid.x;\n"
    "    mad.lo.u32 %r6, %r4, %r5, %r2;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r6, 4;\n"
    "    add.s64 %rd4, %rd2, %rd3;\n"
    "    st.global.f32 [%rd4], %f1;\n"
    "    ret;\n"
    "}\n";

#endif
