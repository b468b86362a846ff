/*
 * The module image reader of libkgpu-limit.so (src/shim/modimage.c): what
 * a cubin, PTX text and a fatbinary (plain, or with LZ4 and Zstandard
 * entries) are estimated to take before the driver loads them, and that a
 * damaged or unparsable image has no estimate. Sizes are chosen at page
 * boundaries so that a byte more or less shows in the rounded estimate.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifdef KGPU_MODIMAGE_DECODE
#include <lz4.h>
#include <zstd.h>
#endif

#include "modimage.h"

#define MIB  (1ULL << 20)
#define PAGE KGPU_MODIMAGE_PAGE

/* The estimate of `text` read as the driver reads an image (to its NUL); 0 where none. */
static uint64_t ptx(const char *text)
{
    uint64_t b = 0;
    return kgpu_modimage_estimate(text, SIZE_MAX, 0, &b) ? b : 0;
}

/* The same with `decl` after a PTX header and a pad of `pad` bytes of .global storage. */
static uint64_t padded(uint64_t pad, const char *decl)
{
    static char text[1 << 18];
    snprintf(text, sizeof(text), "//\n// Generated\n//\n\n.version 8.0\n.target sm_80\n"
             ".address_size 64\n\n.global .b8 pad[%llu];\n%s\n", (unsigned long long)pad, decl);
    return ptx(text);
}

static void ptx_variables_are_summed_at_their_sizes(void **state)
{
    (void)state;
    /* .b8 name[N]: N bytes; 2 MiB fills the page, one byte more takes another. */
    assert_int_equal(padded(2 * MIB, ""), PAGE);
    assert_int_equal(padded(2 * MIB - 4, ".global .u32 x;"), PAGE);
    assert_int_equal(padded(2 * MIB - 3, ".global .u32 x;"), 2 * PAGE);
    /* .f64 a[4][8]: 256 bytes. */
    assert_int_equal(padded(2 * MIB - 256, ".global .f64 a[4][8];"), PAGE);
    assert_int_equal(padded(2 * MIB - 255, ".global .f64 a[4][8];"), 2 * PAGE);
    /* .const, vectors (16-byte elements, so 64 bytes), several names, hex sizes. */
    assert_int_equal(padded(2 * MIB - 64, ".const .v4 .f32 v[2], w[2];"), PAGE);
    assert_int_equal(padded(2 * MIB - 48, ".const .v4 .f32 v[2], w[2];"), 2 * PAGE);
    assert_int_equal(padded(2 * MIB - 0x100, ".visible .global .align 4 .b8 h[0x100];"), PAGE);
    /* An unsized array takes its initializer's elements; a sized one its size. */
    assert_int_equal(padded(2 * MIB - 12, ".global .u32 t[] = {1, 2, 3};"), PAGE);
    assert_int_equal(padded(2 * MIB - 12, ".global .u32 t[] = {1, 2, 3, 4};"), 2 * PAGE);
    assert_int_equal(padded(2 * MIB - 16, ".global .u32 t[4] = {1};"), PAGE);
    assert_int_equal(padded(2 * MIB - 16, ".global .u64 p[2] = {generic(t)+4, 0};"), PAGE);
    assert_int_equal(padded(2 * MIB - 16, ".global .u64 q[][2] = {{1, 2}};"), PAGE);
    assert_int_equal(padded(2 * MIB - 16, ".global .u64 q[][2] = {{1, 2}, {3, 4}};"), 2 * PAGE);
    /* Alignment: the pad ends a byte short of the page; an aligned byte starts on it. */
    assert_int_equal(padded(2 * MIB - 1, ".global .b8 y[1];"), PAGE);
    assert_int_equal(padded(2 * MIB - 1, ".global .align 8 .b8 y[1];"), 2 * PAGE);
    assert_int_equal(padded(2 * MIB - 1, ".global .u16 y;"), 2 * PAGE);
    /* Managed variables are device memory too. */
    assert_int_equal(padded(2 * MIB, ".global .attribute(.managed) .u32 m;"), 2 * PAGE);
}

static void ptx_without_storage_is_not_counted(void **state)
{
    (void)state;
    /* .extern names storage defined elsewhere; comments and strings hold no declarations. */
    assert_int_equal(padded(2 * MIB, ".extern .global .b8 big[1073741824];\n"
                                     ".extern .global .b8 open[];"),
                     PAGE);
    assert_int_equal(padded(2 * MIB, "// .global .b8 c1[1000000];\n"
                                     "/* .global .b8 c2[1000000];\n}}} */\n"
                                     ".file 1 \"dir/{x}/.global; /*.cu\"\n"
                                     ".pragma \"nounroll\";"),
                     PAGE);
    /* Shared, local and register declarations are not device memory of the module. */
    assert_int_equal(padded(2 * MIB, ".shared .align 4 .b8 s[49152];"), PAGE);
    /* A debug section's contents are no variables. */
    assert_int_equal(padded(2 * MIB, ".section .debug_str\n{\n$L__str0:\n.b8 95,90,0\n}"), PAGE);
}

static void ptx_functions_are_bounded_by_their_text(void **state)
{
    (void)state;
    /* One function of body "{ ret; }" (8 bytes) with a 32,000-byte parameter. */
    const char *entry = ".visible .entry k(\n .param .align 8 .b8 k_param_0[32000]\n)\n"
                        ".maxntid 256, 1, 1\n{ ret; }";
    uint64_t fn = KGPU_MODIMAGE_PTX_FN + 32000 + 8 * KGPU_MODIMAGE_PTX_CODE;
    assert_int_equal(padded(2 * MIB - fn, entry), PAGE);
    assert_int_equal(padded(2 * MIB - fn + 1, entry), 2 * PAGE);
    /* Pointer parameters with their attributes; a .func and its prototype. */
    const char *two = ".entry e(.param .u64 .ptr.global.align 16 a, .param .u32 n)\n{ ret; }\n"
                      ".func (.param .b32 r) f(.param .b32 x);\n"
                      ".func (.param .b32 r) f(.param .b32 x)\n{ ret; }";
    fn = 2 * KGPU_MODIMAGE_PTX_FN + 12 + 2 * 8 * KGPU_MODIMAGE_PTX_CODE;
    assert_int_equal(padded(2 * MIB - fn, two), PAGE);
    assert_int_equal(padded(2 * MIB - fn + 1, two), 2 * PAGE);
    /* The code bound follows the body's length, nested blocks and all: 64 KiB make 1 MiB. */
    static char big[80000];
    static const char head[] = ".entry g\n", nested[] = "\n{ .reg .b32 t; }\n";
    size_t h = sizeof(head) - 1, body = 65536;
    memcpy(big, head, h);
    memset(big + h, ' ', body);
    big[h] = '{';
    memcpy(big + h + 1, nested, sizeof(nested) - 1);
    big[h + body - 1] = '}';
    big[h + body] = '\0';
    uint64_t code = body * KGPU_MODIMAGE_PTX_CODE;
    assert_int_equal(padded(2 * MIB - KGPU_MODIMAGE_PTX_FN - code, big), PAGE);
    assert_int_equal(padded(2 * MIB - KGPU_MODIMAGE_PTX_FN - code + 1, big), 2 * PAGE);
}

static void ptx_past_the_cap_is_charged_the_cap(void **state)
{
    (void)state;
    assert_int_equal(padded(0, ".global .b8 huge[4294967296];"), KGPU_MODIMAGE_MAX);
    assert_int_equal(padded(0, ".global .b8 huge[99999999999999999999999999];"),
                     KGPU_MODIMAGE_MAX);
    assert_int_equal(padded(0, ".global .f64 huge[65536][65536][65536];"), KGPU_MODIMAGE_MAX);
}

static void unparsable_ptx_has_no_estimate(void **state)
{
    (void)state;
    const char *bad[] = {
        ".global .b8 x[;",
        ".global .b8 x[];", /* storage of no size */
        ".global .q32 x;",  /* no such type */
        ".global .b8 x[4] = {1, 2",
        ".global .align 3 .b8 x[4];",
        ".global .b8;",
        "/* never closed",
        ".file 1 \"never closed",
        ".entry k(.param .u32) { ret; }",
        ".entry k { ret; ",
        "}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (padded(0, bad[i]) != 0)
            fail_msg("estimated: %s", bad[i]);
    }
    /* Not PTX: no .version first. */
    assert_int_equal(ptx(".target sm_80\n.global .b8 x[4];"), 0);
    assert_int_equal(ptx("KGPUFAKEMOD 100"), 0);
    assert_int_equal(ptx("// only a comment"), 0);
}

static void ptx_is_read_to_its_nul(void **state)
{
    (void)state;
    static const char text[] = ".version 8.0\n.global .b8 x[16];\0.global .b8 y[1073741824];";
    uint64_t b = 0;
    assert_int_equal(kgpu_modimage_estimate(text, sizeof(text), 0, &b), 1);
    assert_int_equal(b, PAGE);
    /* Within an extent that ends before any NUL (a file, a fatbinary entry): all of it. */
    static const char file[] = ".version 8.0\n.global .b8 x[4194304];";
    assert_int_equal(kgpu_modimage_estimate(file, sizeof(file) - 1, 0, &b), 1);
    assert_int_equal(b, 2 * PAGE);
    assert_int_equal(kgpu_modimage_estimate(file, sizeof(file) - 3, 0, &b), 0); /* cut short */
}

static void other_images_are_not_read_on(void **state)
{
    (void)state;
    /* Four bytes of no known format and no NUL: nothing past them is read (ASan would see it). */
    unsigned char *p = malloc(4);
    assert_non_null(p);
    memcpy(p, "KGPU", 4);
    uint64_t b = 0;
    assert_int_equal(kgpu_modimage_estimate(p, SIZE_MAX, 80, &b), 0);
    memcpy(p, "  //", 4); /* a comment that never ends: read to the extent only */
    assert_int_equal(kgpu_modimage_estimate(p, 4, 80, &b), 0);
    free(p);
}

/* ---- binary images ---- */

static void put(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A CUDA ELF with 64 KiB of code and `globals` bytes of NOBITS data; returns its size. */
static size_t cubin(unsigned char *buf, uint64_t globals)
{
    size_t text = 65536, shoff = 64 + text;
    memset(buf, 0, shoff + 3 * 64);
    memcpy(buf, "\x7f" "ELF", 4);
    buf[4] = 2;
    buf[5] = 1;
    buf[6] = 1;
    put(buf + 16, 2, 2);
    put(buf + 18, KGPU_MODIMAGE_EM_CUDA, 2);
    put(buf + 40, shoff, 8);
    put(buf + 52, 64, 2);
    put(buf + 58, 64, 2);
    put(buf + 60, 3, 2);
    unsigned char *s1 = buf + shoff + 64, *s2 = buf + shoff + 128;
    put(s1 + 4, 1, 4);        /* PROGBITS */
    put(s1 + 8, 0x6, 8);      /* alloc, exec */
    put(s1 + 24, 64, 8);
    put(s1 + 32, text, 8);
    put(s1 + 48, 128, 8);
    put(s2 + 4, 8, 4);        /* NOBITS */
    put(s2 + 8, 0x3, 8);      /* alloc, write */
    put(s2 + 24, shoff, 8);
    put(s2 + 32, globals, 8);
    put(s2 + 48, 16, 8);
    return shoff + 3 * 64;
}

#define CUBIN_BYTES (64 + 65536 + 3 * 64)

typedef struct entry {
    int kind;
    unsigned arch;
    uint64_t flags, usize;
    const unsigned char *data;
    size_t len;
} entry;

/* A fatbinary of entries with 64-byte headers, in buf; returns its size. */
static size_t fatbin(unsigned char *buf, const entry *e, int n)
{
    size_t at = 16;
    for (int i = 0; i < n; i++) {
        size_t padded_len = (e[i].len + 7) / 8 * 8;
        unsigned char *h = buf + at;
        memset(h, 0, 64 + padded_len);
        put(h, (uint64_t)e[i].kind, 2);
        put(h + 2, 0x0101, 2);
        put(h + 4, 64, 4);
        put(h + 8, padded_len, 8);
        put(h + 16, e[i].usize != 0 ? e[i].len : 0, 4);
        put(h + 28, e[i].arch, 4);
        put(h + 40, e[i].flags | 0x11, 8); /* 64-bit, Linux */
        put(h + 56, e[i].usize, 8);
        memcpy(h + 64, e[i].data, e[i].len);
        at += 64 + padded_len;
    }
    put(buf, KGPU_MODIMAGE_FATBIN, 4);
    put(buf + 4, 1, 2);
    put(buf + 6, 16, 2);
    put(buf + 8, at - 16, 8);
    return at;
}

static uint64_t estimate(const unsigned char *p, size_t len, unsigned sm)
{
    uint64_t b = 0;
    return kgpu_modimage_estimate(p, len, sm, &b) ? b : 0;
}

static void cubins_past_the_cap_are_charged_the_cap(void **state)
{
    (void)state;
    static unsigned char img[CUBIN_BYTES];
    size_t len = cubin(img, 100 * MIB);
    assert_int_equal(estimate(img, len, 0), 102 * MIB); /* 100 MiB + 64 KiB, in pages */
    cubin(img, 4ULL << 30);
    assert_int_equal(estimate(img, len, 0), KGPU_MODIMAGE_MAX);
}

static void fatbinaries_are_estimated_by_what_the_driver_loads(void **state)
{
    (void)state;
    static unsigned char img[CUBIN_BYTES], fat[4 * CUBIN_BYTES];
    static const char text[] = ".version 8.0\n.target sm_80\n.global .b8 g[524288000];\n";
    size_t len = cubin(img, 100 * MIB);
    entry e[] = {
        {.kind = 2, .arch = 80, .data = img, .len = len},
        {.kind = 1, .arch = 80, .data = (const unsigned char *)text, .len = sizeof(text)},
    };
    size_t n = fatbin(fat, e, 2);
    /* A device the cubin runs on (same major, minor at least 0): the cubin, never the PTX. */
    assert_int_equal(estimate(fat, n, 80), 102 * MIB);
    assert_int_equal(estimate(fat, n, 86), 102 * MIB);
    /* Another major, or older than the cubin: the driver compiles the PTX; unknown: either. */
    assert_int_equal(estimate(fat, n, 90), 500 * MIB);
    assert_int_equal(estimate(fat, n, 75), 500 * MIB);
    assert_int_equal(estimate(fat, n, 0), 500 * MIB);
    /* PTX alone, as the only entry. */
    n = fatbin(fat, e + 1, 1);
    assert_int_equal(estimate(fat, n, 80), 500 * MIB);
    /* A damaged entry header: none. */
    put(fat + 16 + 4, 8, 4);
    assert_int_equal(estimate(fat, n, 80), 0);
}

#ifdef KGPU_MODIMAGE_DECODE
static void compressed_entries_are_decompressed_first(void **state)
{
    (void)state;
    assert_int_equal(kgpu_modimage_decodes(), 1);
    static unsigned char img[CUBIN_BYTES], z[2 * CUBIN_BYTES], l[2 * CUBIN_BYTES],
        fat[4 * CUBIN_BYTES];
    size_t len = cubin(img, 800 * MIB);
    size_t zlen = ZSTD_compress(z, sizeof(z), img, len, 19);
    int llen = LZ4_compress_default((const char *)img, (char *)l, (int)len, (int)sizeof(l));
    assert_false(ZSTD_isError(zlen));
    assert_true(llen > 0);
    assert_true(zlen < len / 4 && (size_t)llen < len / 4); /* compressed indeed */
    entry e = {.kind = 2,
               .arch = 80,
               .flags = KGPU_MODIMAGE_FLAG_ZSTD,
               .usize = len,
               .data = z,
               .len = zlen};
    size_t n = fatbin(fat, &e, 1);
    assert_int_equal(estimate(fat, n, 80), 802 * MIB);
    /* A stated size the frame contradicts, or a truncated frame: none. */
    put(fat + 16 + 56, len + 1, 8);
    assert_int_equal(estimate(fat, n, 80), 0);
    put(fat + 16 + 56, len, 8);
    put(fat + 16 + 16, zlen - 9, 4);
    assert_int_equal(estimate(fat, n, 80), 0);
    /* The older LZ4 blocks. */
    e = (entry){.kind = 2,
                .arch = 80,
                .flags = KGPU_MODIMAGE_FLAG_LZ4,
                .usize = len,
                .data = l,
                .len = (size_t)llen};
    n = fatbin(fat, &e, 1);
    assert_int_equal(estimate(fat, n, 80), 802 * MIB);
    /* Stating more than the block can hold, or past the cap: none, before any allocation. */
    put(fat + 16 + 56, (uint64_t)llen * 256, 8);
    assert_int_equal(estimate(fat, n, 80), 0);
    put(fat + 16 + 56, KGPU_MODIMAGE_MAX + 1, 8);
    assert_int_equal(estimate(fat, n, 80), 0);
    /* A compressed size past the payload: none. */
    put(fat + 16 + 56, len, 8);
    put(fat + 16 + 16, (uint64_t)llen + 8, 4);
    assert_int_equal(estimate(fat, n, 80), 0);
    /* Compressed PTX. */
    static const char text[] = ".version 8.0\n.target sm_80\n.global .b8 g[524288000];\n";
    zlen = ZSTD_compress(z, sizeof(z), text, sizeof(text), 3);
    e = (entry){.kind = 1,
                .arch = 80,
                .flags = KGPU_MODIMAGE_FLAG_ZSTD,
                .usize = sizeof(text),
                .data = z,
                .len = zlen};
    n = fatbin(fat, &e, 1);
    assert_int_equal(estimate(fat, n, 80), 500 * MIB);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ptx_variables_are_summed_at_their_sizes),
        cmocka_unit_test(ptx_without_storage_is_not_counted),
        cmocka_unit_test(ptx_functions_are_bounded_by_their_text),
        cmocka_unit_test(ptx_past_the_cap_is_charged_the_cap),
        cmocka_unit_test(unparsable_ptx_has_no_estimate),
        cmocka_unit_test(ptx_is_read_to_its_nul),
        cmocka_unit_test(other_images_are_not_read_on),
        cmocka_unit_test(cubins_past_the_cap_are_charged_the_cap),
        cmocka_unit_test(fatbinaries_are_estimated_by_what_the_driver_loads),
#ifdef KGPU_MODIMAGE_DECODE
        cmocka_unit_test(compressed_entries_are_decompressed_first),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
