/*
 * Unit tests of the share-packing measures (src/core/sharepack.c): the lower
 * bound is never above the optimum and the best-fit decreasing packing never
 * below it, checked against exhaustive search on small random instances, and
 * each classical bound on an instance where it is the one that binds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"
#include "kgpu/rng.h"

static long hist[KGPU_MILLI];

static void put(int milli, long n)
{
    hist[milli] += n;
}

/* Fewest bins for items[0..n) by exhaustive search: each item into an open bin or a new one. */
static int opt_rec(const int *items, int n, int k, int *free, int bins, int best)
{
    if (bins >= best)
        return best;
    if (k == n)
        return bins;
    for (int b = 0; b < bins; b++) {
        if (free[b] >= items[k]) {
            free[b] -= items[k];
            best = opt_rec(items, n, k + 1, free, bins, best);
            free[b] += items[k];
        }
    }
    free[bins] = KGPU_MILLI - items[k];
    best = opt_rec(items, n, k + 1, free, bins + 1, best);
    return best;
}

static void test_against_exhaustive_search(void **state)
{
    (void)state;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 7, 0);
    for (int round = 0; round < 400; round++) {
        memset(hist, 0, sizeof(hist));
        int items[9], n = 1 + (int)kgpu_rng_below(&rng, 9);
        for (int i = 0; i < n; i++) {
            /* Sizes the trace uses often, and any size. */
            static const int common[] = {810, 470, 320, 650, 230, 160, 500, 340, 260};
            items[i] = kgpu_rng_below(&rng, 2) ? common[kgpu_rng_below(&rng, 9)]
                                               : 1 + (int)kgpu_rng_below(&rng, 999);
            put(items[i], 1);
        }
        int free[9];
        int opt = opt_rec(items, n, 0, free, 0, n + 1);
        long lb = kgpu__share_lower_bound(hist), bfd = kgpu__share_bfd(hist);
        assert_true(lb <= opt);
        assert_true(bfd >= opt);
        int64_t total = 0;
        for (int i = 0; i < n; i++)
            total += items[i];
        assert_true(lb >= (total + KGPU_MILLI - 1) / KGPU_MILLI); /* at least L1 */
    }
}

static void test_each_bound_binds(void **state)
{
    (void)state;
    /* L1: the total size. */
    memset(hist, 0, sizeof(hist));
    put(500, 4);
    put(250, 4);
    assert_int_equal(kgpu__share_lower_bound(hist), 3);
    assert_int_equal(kgpu__share_bfd(hist), 3);
    /* L2: four items over half a GPU need four GPUs though they total 2.4. */
    memset(hist, 0, sizeof(hist));
    put(600, 4);
    assert_int_equal(kgpu__share_lower_bound(hist), 4);
    /* ... and the medium items that fit beside them cost nothing more, the rest does. */
    put(400, 4);
    assert_int_equal(kgpu__share_lower_bound(hist), 4);
    put(300, 2);
    assert_int_equal(kgpu__share_lower_bound(hist), 5);
    /* A dual feasible function: seven 260s total 1.82 GPUs, but only three fit one GPU. */
    memset(hist, 0, sizeof(hist));
    put(260, 7);
    assert_int_equal(kgpu__share_lower_bound(hist), 3);
    assert_int_equal(kgpu__share_bfd(hist), 3);
    /*
     * The trace's 810s leave 190 beside them, room for one 100 each: the
     * optimum is 100 + 50 / 10 = 105 GPUs. L2 sees only the fluid 190s
     * (100); u^(9) rounds 0.81 to 8/9 and keeps 0.1: ceil(88.9 + 15) = 104.
     */
    memset(hist, 0, sizeof(hist));
    put(810, 100);
    put(100, 150);
    assert_int_equal(kgpu__share_lower_bound(hist), 104);
    assert_int_equal(kgpu__share_bfd(hist), 105);
    /* Nothing placed: no GPU. */
    memset(hist, 0, sizeof(hist));
    assert_int_equal(kgpu__share_lower_bound(hist), 0);
    assert_int_equal(kgpu__share_bfd(hist), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_exhaustive_search),
        cmocka_unit_test(test_each_bound_binds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
