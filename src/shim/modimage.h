/*
 * How much device memory a module image can take at most, read from the
 * image itself before the driver loads it (hooks_measure.c): a CUDA ELF
 * (cubin) by its allocated sections, PTX by its variables and the code its
 * text can become, a fatbinary by the entries the driver may load, each
 * decompressed first where nvcc compressed it. Pure: no driver, no I/O,
 * unit-tested and fuzzed alone. The image is outside input: every offset
 * and size in it is checked against the extent given and against
 * KGPU_MODIMAGE_MAX.
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
 * PTX: bytes of device code one byte of a function body's text may become
 * (one 16-byte SASS instruction per byte), and what each function takes
 * besides its code and an entry's parameters (code alignment, the
 * driver's part of constant bank 0). See modimage.c for why.
 */
#define KGPU_MODIMAGE_PTX_CODE 16u
#define KGPU_MODIMAGE_PTX_FN   1024u

/* Fatbinary entry flags: the payload is compressed, LZ4 block (older nvcc) or a Zstandard frame. */
#define KGPU_MODIMAGE_FLAG_LZ4  0x2000u
#define KGPU_MODIMAGE_FLAG_ZSTD 0x8000u

/*
 * An upper-bound estimate of the device memory the driver takes to load
 * `image`, whose extent is `len` bytes (SIZE_MAX where only the image
 * itself says: what the driver is given), on a device of compute
 * capability `sm` (10 * major + minor, 86 for 8.6; 0 where unknown).
 * Rounded up to KGPU_MODIMAGE_PAGE, at most KGPU_MODIMAGE_MAX (a larger
 * footprint is charged that much before the load and the rest after it).
 *
 * - A 64-bit little-endian CUDA ELF: its SHF_ALLOC sections (code,
 *   constants, the NOBITS __device__ globals), each at its alignment.
 * - PTX (text up to its NUL, starting with `.version` after any comments):
 *   its .global and .const variables, each entry's parameters and
 *   KGPU_MODIMAGE_PTX_FN per function, and KGPU_MODIMAGE_PTX_CODE bytes per
 *   byte of function bodies for the code the JIT makes of it.
 * - A fatbinary: the driver loads one entry, a cubin built for the device
 *   where there is one (same major version, minor at most the device's),
 *   else it compiles PTX; so the largest estimate of those cubins, else
 *   (or with `sm` 0) of every entry. LZ4 and Zstandard entries are
 *   decompressed first (up to their stated size and KGPU_MODIMAGE_MAX)
 *   where the library was built with the decoders.
 *
 * Returns 1 and *bytes, or 0 where it cannot tell: damaged or unparsable
 * images, 32-bit ELF and other formats, and compressed entries without
 * the decoders. The caller then measures the load instead.
 */
int kgpu_modimage_estimate(const void *image, size_t len, unsigned sm, uint64_t *bytes);

/* 1 where compressed fatbinary entries are decoded (built with liblz4 and libzstd). */
int kgpu_modimage_decodes(void);

#endif
