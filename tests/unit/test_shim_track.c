/*
 * The allocation table of libkgpu-limit.so (sizes by pointer, handle or
 * context) and the sizes it charges for CUDA arrays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "track.h"

static void put(kgpu_track *t, int kind, uint64_t key, uint64_t bytes, int dev, uintptr_t ctx)
{
    kgpu_track_rec rec = {
        .key = key, .bytes = bytes, .ctx = ctx, .dev = (int16_t)dev, .kind = kind};
    assert_int_equal(kgpu_track_put(t, &rec), 0);
}

static void put_take_by_kind(void **state)
{
    kgpu_track t = KGPU_TRACK_INIT;
    kgpu_track_rec rec;
    assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_MEM, 1, &rec), 0); /* empty table */
    put(&t, KGPU_TRACK_MEM, 0x1000, 64, 0, 7);
    put(&t, KGPU_TRACK_HANDLE, 0x1000, 128, 1, 0); /* same key, another kind */
    assert_int_equal(kgpu_track_count(&t), 2);
    assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_ARRAY, 0x1000, &rec), 0);
    assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_HANDLE, 0x1000, &rec), 1);
    assert_int_equal(rec.bytes, 128);
    assert_int_equal(rec.dev, 1);
    assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_HANDLE, 0x1000, &rec), 0);
    assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_MEM, 0x1000, &rec), 1);
    assert_int_equal(rec.bytes, 64);
    assert_int_equal(rec.ctx, 7);
    assert_int_equal(kgpu_track_count(&t), 0);
    kgpu_track_clear(&t);
}

static void many_and_reused(void **state)
{
    kgpu_track t = KGPU_TRACK_INIT;
    kgpu_track_rec rec;
    /* Grow well past the first table, with removals in between (tombstones). */
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 20000; i++)
            put(&t, KGPU_TRACK_MEM, 0x7f0000000000ULL + i * 512, i + 1, (int)(i % 4),
                (uintptr_t)(1 + i % 3));
        for (uint64_t i = 0; i < 20000; i += 2) {
            assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_MEM, 0x7f0000000000ULL + i * 512, &rec),
                             1);
            assert_int_equal(rec.bytes, i + 1);
        }
        assert_int_equal(kgpu_track_count(&t), 10000);
        for (uint64_t i = 1; i < 20000; i += 2)
            assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_MEM, 0x7f0000000000ULL + i * 512, &rec),
                             1);
        assert_int_equal(kgpu_track_count(&t), 0);
    }
    kgpu_track_clear(&t);
}

/* Random puts and takes against a plain array: removals that shift clusters lose nothing. */
static void agrees_with_a_model(void **state)
{
    enum { KEYS = 3000, OPS = 200000 };
    static uint64_t model[2 * KEYS]; /* per (kind, key): bytes + 1 when present, 0 when absent */
    kgpu_track t = KGPU_TRACK_INIT;
    kgpu_track_rec rec;
    uint64_t x = 42;
    size_t live = 0;
    memset(model, 0, sizeof(model));
    for (int op = 0; op < OPS; op++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        uint64_t k = (x >> 33) % KEYS;
        int kind = 1 + (int)((x >> 20) % 2);
        size_t m = (size_t)k + (kind == KGPU_TRACK_HANDLE ? KEYS : 0);
        uint64_t key = k * 4096; /* the same keys under both kinds */
        if ((x >> 40) % 2) {
            live += model[m] == 0;
            model[m] = op + 1;
            put(&t, kind, key, (uint64_t)op, 0, (uintptr_t)(k % 5));
        } else {
            int had = kgpu_track_take(&t, kind, key, &rec);
            assert_int_equal(had, model[m] != 0);
            if (had) {
                assert_int_equal(rec.bytes, model[m] - 1);
                model[m] = 0;
                live--;
            }
        }
    }
    assert_int_equal(kgpu_track_count(&t), live);
    kgpu_track_clear(&t);
}

static void a_context_takes_its_memory_along(void **state)
{
    kgpu_track t = KGPU_TRACK_INIT;
    kgpu_track_rec rec;
    put(&t, KGPU_TRACK_MEM, 1, 100, 0, 0xc1);
    put(&t, KGPU_TRACK_ARRAY, 2, 50, 1, 0xc1);
    put(&t, KGPU_TRACK_MEM, 3, 7, 0, 0xc2);
    put(&t, KGPU_TRACK_HANDLE, 4, 1000, 0, 0); /* tied to no context */
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES] = {0};
    assert_int_equal(kgpu_track_take_ctx(&t, 0xc1, bytes), 2);
    assert_int_equal(bytes[0], 100);
    assert_int_equal(bytes[1], 50);
    assert_int_equal(kgpu_track_take_ctx(&t, 0, bytes), 0);
    assert_int_equal(kgpu_track_count(&t), 2);
    assert_int_equal(kgpu_track_take(&t, KGPU_TRACK_MEM, 3, &rec), 1);
    kgpu_track_forked(&t);
    assert_int_equal(kgpu_track_count(&t), 0);
    kgpu_track_clear(&t);
}

static void array_sizes(void **state)
{
    /* FLOAT x 4 channels, 1024 x 768. */
    assert_int_equal(kgpu_track_array_bytes(1024, 768, 0, 0x20, 4, 0, 1), 1024ULL * 768 * 16);
    /* A 1D array: height 0 counts as 1. UNSIGNED_INT8, 1 channel. */
    assert_int_equal(kgpu_track_array_bytes(4096, 0, 0, 0x01, 1, 0, 1), 4096);
    /* HALF, 3D. */
    assert_int_equal(kgpu_track_array_bytes(64, 64, 64, 0x10, 1, 0, 1), 64ULL * 64 * 64 * 2);
    /* Mipmaps: 8x8x8 + 4x4x4 + 2x2x2 + 1 with 4-byte elements; more levels stop at 1x1x1. */
    assert_int_equal(kgpu_track_array_bytes(8, 8, 8, 0x03, 1, 0, 10), (512 + 64 + 8 + 1) * 4);
    /* Layered: the layer count is not halved. 16x16, 6 layers, 2 levels. */
    assert_int_equal(kgpu_track_array_bytes(16, 16, 6, 0x01, 1, 0x01, 2), 16 * 16 * 6 + 8 * 8 * 6);
    /* Unknown formats are charged generously. */
    assert_int_equal(kgpu_track_array_bytes(10, 1, 1, 0x91, 1, 0, 1), 160);
    /* Overflow is UINT64_MAX, never a small number. */
    assert_int_equal(kgpu_track_array_bytes(SIZE_MAX, SIZE_MAX, 2, 0x20, 4, 0, 1), UINT64_MAX);
}

/* Listing the keys of one kind on one device (the drain's contexts), however many there are. */
static void keys_of_a_kind_on_a_device(void **state)
{
    kgpu_track t = KGPU_TRACK_INIT;
    uint64_t keys[4] = {0};
    assert_int_equal(kgpu_track_keys(&t, KGPU_TRACK_CTX, 0, keys, 4), 0); /* empty table */
    put(&t, KGPU_TRACK_CTX, 0xc1, 300, 0, 0);
    put(&t, KGPU_TRACK_CTX, 0xc2, 300, 1, 0);     /* another device */
    put(&t, KGPU_TRACK_MEM, 0xc3, 64, 0, 0xc1);   /* another kind */
    put(&t, KGPU_TRACK_CTX, 0xc4, 300, 0, 0);
    assert_int_equal(kgpu_track_keys(&t, KGPU_TRACK_CTX, 0, keys, 4), 2);
    assert_true((keys[0] == 0xc1 && keys[1] == 0xc4) || (keys[0] == 0xc4 && keys[1] == 0xc1));
    for (uint64_t k = 0x100; k < 0x140; k++)
        put(&t, KGPU_TRACK_CTX, k, 1, 0, 0);
    memset(keys, 0, sizeof(keys));
    assert_int_equal(kgpu_track_keys(&t, KGPU_TRACK_CTX, 0, keys, 4), 66); /* all counted */
    for (int i = 0; i < 4; i++)
        assert_true(keys[i] != 0); /* only max written */
    kgpu_track_clear(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(put_take_by_kind),    cmocka_unit_test(many_and_reused),
        cmocka_unit_test(agrees_with_a_model), cmocka_unit_test(a_context_takes_its_memory_along),
        cmocka_unit_test(array_sizes),
        cmocka_unit_test(keys_of_a_kind_on_a_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
