/*
 * Module images read for their footprint (modimage.h). Every read goes
 * through in(), which checks it against the extent; sizes are summed with
 * overflow checks and capped at KGPU_MODIMAGE_MAX.
 */
#include <string.h>

#include "modimage.h"

#define SHF_ALLOC_   0x2u
#define ELF_EHDR     64u
#define ELF_SHDR     64u
#define FATBIN_HDR   16u
#define FATBIN_ENTRY 16u /* kind, version, header size, payload size: what is read of one */

/* The extent [off, off + n) lies within len and below the cap. */
static int in(size_t len, uint64_t off, uint64_t n)
{
    uint64_t cap = len < KGPU_MODIMAGE_MAX ? (uint64_t)len : KGPU_MODIMAGE_MAX;
    return off <= cap && n <= cap - off;
}

static uint64_t le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* a + b, or UINT64_MAX past the cap. */
static uint64_t add(uint64_t a, uint64_t b)
{
    return a > KGPU_MODIMAGE_MAX || b > KGPU_MODIMAGE_MAX - a ? UINT64_MAX : a + b;
}

static int elf_estimate(const unsigned char *p, size_t len, uint64_t *bytes)
{
    if (!in(len, 0, ELF_EHDR) || memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2 /* 64-bit */ ||
        p[5] != 1 /* little-endian */ || le(p + 18, 2) != KGPU_MODIMAGE_EM_CUDA)
        return 0;
    uint64_t shoff = le(p + 40, 8), shentsize = le(p + 58, 2), shnum = le(p + 60, 2);
    if (shnum == 0 || shentsize != ELF_SHDR || !in(len, shoff, shnum * ELF_SHDR))
        return 0; /* no sections, or extended numbering: not read */
    uint64_t total = 0;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *s = p + shoff + i * ELF_SHDR;
        uint64_t type = le(s + 4, 4), flags = le(s + 8, 8), off = le(s + 24, 8),
                 size = le(s + 32, 8), align = le(s + 48, 8);
        if (!(flags & SHF_ALLOC_))
            continue;
        if (type != 8 /* SHT_NOBITS */ && !in(len, off, size))
            return 0; /* contents past the image */
        if (size > KGPU_MODIMAGE_MAX)
            return 0;
        if (align > 1 && (align & (align - 1)) == 0 && align <= KGPU_MODIMAGE_PAGE)
            total = add(total, (align - total % align) % align);
        total = add(total, size);
        if (total == UINT64_MAX)
            return 0;
    }
    *bytes = (total + KGPU_MODIMAGE_PAGE - 1) / KGPU_MODIMAGE_PAGE * KGPU_MODIMAGE_PAGE;
    if (*bytes == 0)
        *bytes = KGPU_MODIMAGE_PAGE; /* a module takes a page, however small */
    return 1;
}

static int fatbin_estimate(const unsigned char *p, size_t len, uint64_t *bytes)
{
    if (!in(len, 0, FATBIN_HDR) || le(p, 4) != KGPU_MODIMAGE_FATBIN)
        return 0;
    uint64_t hsize = le(p + 6, 2), fsize = le(p + 8, 8);
    if (hsize < FATBIN_HDR || !in(len, hsize, fsize))
        return 0;
    uint64_t end = hsize + fsize, at = hsize, best = 0;
    int found = 0;
    for (int n = 0; n < KGPU_MODIMAGE_ENTRIES && at < end; n++) {
        if (!in((size_t)end, at, FATBIN_ENTRY))
            return 0;
        const unsigned char *e = p + at;
        uint64_t kind = le(e, 2), ehsize = le(e + 4, 4), psize = le(e + 8, 8), b = 0;
        if (ehsize < FATBIN_ENTRY || !in((size_t)end, at, ehsize) ||
            !in((size_t)end, at + ehsize, psize))
            return 0;
        /* A cubin stored as is; PTX (kind 1) and compressed cubins are not estimated. */
        if (kind == 2 && elf_estimate(e + ehsize, (size_t)psize, &b)) {
            found = 1;
            best = b > best ? b : best;
        }
        at += ehsize + psize;
    }
    if (!found)
        return 0;
    *bytes = best;
    return 1;
}

int kgpu_modimage_estimate(const void *image, size_t len, uint64_t *bytes)
{
    const unsigned char *p = image;
    if (p == NULL || bytes == NULL || len < 4)
        return 0;
    if (memcmp(p, "\x7f" "ELF", 4) == 0)
        return elf_estimate(p, len, bytes);
    if (le(p, 4) == KGPU_MODIMAGE_FATBIN)
        return fatbin_estimate(p, len, bytes);
    return 0;
}
