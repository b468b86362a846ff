/*
 * How much device memory a module image can take at most, read from the
 * image itself before the driver loads it (hooks_measure.c): a CUDA ELF
 * (cubin) by its allocated sections, a fatbinary by the largest cubin in
 * it. Pure: no driver, unit-tested and fuzzed alone. The image is outside
 * input: every offset and size in it is checked against the extent given
 * and against KGPU_MODIMAGE_MAX.
 */
#ifndef KGPU_SHIM_MODIMAGE_H
#define KGPU_SHIM_MODIMAGE_H

#include <stddef.h>
#include <stdint.h>

#define KGPU_MODIMAGE_MAX      (1ULL << 30) /* an image or part claimed larger is not read */
#define KGPU_MODIMAGE_PAGE     (2ULL << 20) /* an estimate is rounded up to this */
#define KGPU_MODIMAGE_ENTRIES  4096         /* fatbinary entries read at most */
#define KGPU_MODIMAGE_EM_CUDA  190
#define KGPU_MODIMAGE_FATBIN   0xBA55ED50u

/*
 * An upper-bound estimate of the device memory the driver takes to load
 * `image`, whose extent is `len` bytes (SIZE_MAX where only the image's
 * own headers say: what the driver is given). For a 64-bit little-endian
 * CUDA ELF: its SHF_ALLOC sections (code, constants, and the NOBITS
 * __device__ globals), each at its alignment, rounded up to
 * KGPU_MODIMAGE_PAGE. For a fatbinary: the largest such estimate of the
 * uncompressed cubins in it (the driver loads one). Returns 1 and *bytes,
 * or 0 where it cannot tell (PTX, compressed or damaged images, other
 * formats).
 */
int kgpu_modimage_estimate(const void *image, size_t len, uint64_t *bytes);

#endif
