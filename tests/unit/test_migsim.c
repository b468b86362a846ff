/*
 * Unit tests of MIG placement in the simulator (src/core/migsim.c): the
 * facts of the tables the simulator relies on (instance limits never bind
 * first; each profile's placements lie inside the next one's), the
 * mapping of trace requests to profiles, hand-made arrivals where first
 * fit in NVML's order fragments and kgpu's slice order and node scores do
 * not, the layouts and the LP, and the offline bound against every
 * strategy and against a brute-force optimum on tiny instances.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/migsim.h"
#include "kgpu/rng.h"

static const kgpu_mig_model *a100(void)
{
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    assert_non_null(m);
    return m;
}

static int pidx(const kgpu_mig_model *m, const char *name)
{
    const kgpu_mig_profile *p = kgpu_mig_profile_find(m, name);
    assert_non_null(p);
    return (int)(p - m->profiles);
}

/* The cache by (memory mask, compute) is exact only if instance limits never bind first. */
static void instance_limits_never_bind(void **state)
{
    (void)state;
    for (int i = 0; i < kgpu_mig_model_count(); i++) {
        const kgpu_mig_model *m = kgpu_mig_model_at(i);
        for (int pi = 0; pi < m->nprofiles; pi++)
            if (!m->profiles[pi].media)
                assert_true(m->profiles[pi].instances >= m->profiles[pi].nstarts);
    }
}

/* The bound's premise: every placement of a bigger profile holds one of the next smaller. */
static void profiles_form_a_chain(void **state)
{
    (void)state;
    for (int i = 0; i < kgpu_mig_model_count(); i++) {
        const kgpu_mig_model *m = kgpu_mig_model_at(i);
        int prev = -1;
        for (int pi = 0; pi < m->nprofiles; pi++) {
            if (m->profiles[pi].media)
                continue;
            if (prev >= 0) {
                const kgpu_mig_profile *a = &m->profiles[prev], *b = &m->profiles[pi];
                assert_true(a->compute <= b->compute);
                for (int sb = 0; sb < b->nstarts; sb++) {
                    uint8_t mb = kgpu_mig_mask(b->starts[sb], b->size);
                    bool inside = false;
                    for (int sa = 0; sa < a->nstarts; sa++) {
                        uint8_t ma = kgpu_mig_mask(a->starts[sa], a->size);
                        inside = inside || (ma & mb) == ma;
                    }
                    assert_true(inside);
                }
            }
            prev = pi;
        }
    }
}

static void requests_map_to_the_nearest_profile(void **state)
{
    (void)state;
    const kgpu_mig_model *m = a100();
    kgpu_request r = {.gpu_count = 1, .gpu_milli = 100};
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "1g.5gb")); /* 0.7 of 7 */
    r.gpu_milli = 250;                                                   /* 1.75 */
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "2g.10gb"));
    r.gpu_milli = 420; /* 2.94 */
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "3g.20gb"));
    r.gpu_milli = 430; /* 3.01 */
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "4g.20gb"));
    r.gpu_milli = 600; /* 4.2: no 5g or 6g */
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "7g.40gb"));
    r.gpu_milli = 100;
    r.gpu_memory_mib = 8000; /* over 1g.5gb's 4864 MiB */
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "1g.10gb"));
    r.gpu_memory_mib = 50000; /* over the whole GPU */
    assert_int_equal(kgpu_migsim_profile_of(m, &r), -1);
    r = (kgpu_request){.gpu_count = 2, .gpu_milli = 1000, .exclusive = true};
    assert_int_equal(kgpu_migsim_profile_of(m, &r), pidx(m, "7g.40gb"));
    r = (kgpu_request){.cpu_milli = 4000};
    assert_int_equal(kgpu_migsim_profile_of(m, &r), -1);
}

/* An input of n single-GPU nodes, CPU plenty, one request per profile name given. */
static void small_input(int nodes, int gpus, const char *const *names, int n,
                        kgpu_migsim_input *in)
{
    const kgpu_mig_model *m = a100();
    kgpu_migsim_node nd[8];
    kgpu_migsim_request rq[16];
    for (int i = 0; i < nodes; i++)
        nd[i] = (kgpu_migsim_node){gpus, 64000, 256000};
    for (int i = 0; i < n; i++)
        rq[i] = (kgpu_migsim_request){pidx(m, names[i]), 1, 1000, 1000};
    kgpu_error err;
    assert_int_equal(kgpu_migsim_input_init(m, nd, nodes, rq, (size_t)n, &in[0], &err), 0);
}

/* Requests placed by strategy s for arrivals 0..n-1 in order. */
static long placed(const kgpu_migsim_input *in, kgpu_migsim_strategy s, size_t n, long *slices)
{
    size_t order[16];
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    kgpu_migsim_result r;
    kgpu_error err;
    assert_int_equal(kgpu_migsim_run(in, s, order, n, &r, &err), 0);
    assert_int_equal(r.requests, (long)n);
    if (slices != NULL)
        *slices = r.slices;
    return r.placed;
}

/* On one GPU: NVML's first start for the small profile blocks the 4g; kgpu's slice order not. */
static void slice_order_keeps_the_big_start(void **state)
{
    (void)state;
    kgpu_migsim_input in;
    const char *a[] = {"3g.20gb", "4g.20gb"};
    small_input(1, 1, a, 2, &in);
    assert_int_equal(placed(&in, KGPU_MIGSIM_FIRST_FIT, 2, NULL), 1); /* 3g at 0 */
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU_ORDER, 2, NULL), 2);
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU, 2, NULL), 2);
    assert_int_equal(placed(&in, KGPU_MIGSIM_BEST_FIT, 2, NULL), 2);
    kgpu_migsim_input_free(&in);

    const char *b[] = {"1g.5gb", "4g.20gb", "1g.5gb"};
    small_input(1, 1, b, 3, &in);
    assert_int_equal(placed(&in, KGPU_MIGSIM_FIRST_FIT, 3, NULL), 2); /* 1g at 0 */
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU_ORDER, 3, NULL), 3);
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU, 3, NULL), 3);
    kgpu_migsim_input_free(&in);
}

/*
 * Two single-GPU nodes. In node order the second 3g completes the first
 * GPU (3g + 3g, a slice stranded) and the 4g's then find one start 0 for
 * two of them; kgpu's node score puts the second 3g on the other GPU,
 * where both 4g's pair with a 3g: every GPU full.
 */
static void node_scores_pair_profiles(void **state)
{
    (void)state;
    kgpu_migsim_input in;
    const char *a[] = {"3g.20gb", "3g.20gb", "4g.20gb", "4g.20gb"};
    small_input(2, 1, a, 4, &in);
    long s_ff, s_order, s_kgpu;
    assert_int_equal(placed(&in, KGPU_MIGSIM_FIRST_FIT, 4, &s_ff), 3);
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU_ORDER, 4, &s_order), 3);
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU, 4, &s_kgpu), 4);
    assert_int_equal(s_ff, 10);
    assert_int_equal(s_order, 10);
    assert_int_equal(s_kgpu, 14); /* both GPUs' 7 slices */
    kgpu_migsim_input_free(&in);

    const char *b[] = {"3g.20gb", "3g.20gb", "2g.10gb", "2g.10gb", "4g.20gb"};
    small_input(2, 1, b, 5, &in);
    assert_int_equal(placed(&in, KGPU_MIGSIM_FIRST_FIT, 5, NULL), 4);
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU_ORDER, 5, NULL), 4);
    assert_int_equal(placed(&in, KGPU_MIGSIM_KGPU, 5, NULL), 5);
    assert_int_equal(placed(&in, KGPU_MIGSIM_BEST_FIT, 5, NULL), 5);
    kgpu_migsim_input_free(&in);
}

/* Whole GPUs of one request go to one node; CPU and memory bound a node. */
static void multi_gpu_requests_and_cpu(void **state)
{
    (void)state;
    const kgpu_mig_model *m = a100();
    kgpu_migsim_node nd[2] = {{2, 8000, 64000}, {4, 64000, 256000}};
    int p7 = pidx(m, "7g.40gb"), p1 = pidx(m, "1g.5gb");
    kgpu_migsim_request rq[] = {
        {p7, 3, 1000, 1000}, /* only node 1 has 3 GPUs */
        {p1, 1, 9000, 1000}, /* node 0's CPU is too small: node 1's last GPU */
        {p7, 2, 1000, 1000}, /* node 0's two */
        {p1, 1, 1000, 1000}, /* node 1's GPU with the 1g */
        {p7, 1, 1000, 1000}, /* nothing whole is left */
        {-1, 0, 1000, 1000}, /* no GPU: not a GPU request */
    };
    kgpu_migsim_input in;
    kgpu_error err;
    assert_int_equal(kgpu_migsim_input_init(m, nd, 2, rq, 6, &in, &err), 0);
    for (int s = 0; s < KGPU_MIGSIM_STRATEGIES; s++) {
        size_t order[] = {0, 1, 2, 3, 4, 5};
        kgpu_migsim_result r;
        assert_int_equal(kgpu_migsim_run(&in, (kgpu_migsim_strategy)s, order, 6, &r, &err), 0);
        assert_int_equal(r.requests, 5);
        assert_int_equal(r.placed, 4);
        assert_int_equal(r.instances, 7);
        assert_int_equal(r.gpus_used, 6);
        assert_int_equal(r.slices, 5 * 7 + 2);
    }
    kgpu_migsim_bound b;
    size_t order[] = {0, 1, 2, 3, 4, 5};
    assert_int_equal(kgpu_migsim_offline(&in, order, 6, &b, &err), 0);
    assert_int_equal(b.requests, 5);
    assert_int_equal(b.possible, 5);
    assert_true(b.upper >= b.packed && b.packed >= 4);
    kgpu_migsim_input_free(&in);
}

static void bad_input_is_refused(void **state)
{
    (void)state;
    const kgpu_mig_model *m = a100();
    kgpu_migsim_node nd = {33, 1, 1};
    kgpu_migsim_request rq = {pidx(m, "1g.5gb+me"), 1, 0, 0};
    kgpu_migsim_input in;
    kgpu_error err;
    assert_int_not_equal(kgpu_migsim_input_init(m, &nd, 1, NULL, 0, &in, &err), 0);
    nd.gpus = 1;
    assert_int_not_equal(kgpu_migsim_input_init(m, &nd, 1, &rq, 1, &in, &err), 0);
    rq.profile = 0;
    assert_int_equal(kgpu_migsim_input_init(m, &nd, 1, &rq, 1, &in, &err), 0);
    size_t order[] = {1};
    kgpu_migsim_result r;
    assert_int_not_equal(kgpu_migsim_run(&in, KGPU_MIGSIM_KGPU, order, 1, &r, &err), 0);
    assert_int_not_equal(kgpu_migsim_run(&in, KGPU_MIGSIM_STRATEGIES, order, 0, &r, &err), 0);
    kgpu_migsim_input_free(&in);
    assert_int_equal(kgpu_migsim_strategy_find("kgpu"), KGPU_MIGSIM_KGPU);
    assert_int_equal(kgpu_migsim_strategy_find("nope"), -1);
    assert_string_equal(kgpu_migsim_strategy_name(KGPU_MIGSIM_FIRST_FIT), "first-fit");
}

/* With time: a departure frees its instances; one at an arrival's instant goes first. */
static void departures_free_instances(void **state)
{
    (void)state;
    kgpu_migsim_input in;
    const char *a[] = {"7g.40gb", "7g.40gb", "7g.40gb"};
    small_input(1, 1, a, 3, &in);
    size_t order[] = {0, 1, 2};
    double at[] = {0, 5, 10}, life[] = {10, 10, 10};
    kgpu_migsim_result r;
    kgpu_error err;
    assert_int_equal(
        kgpu_migsim_run_times(&in, KGPU_MIGSIM_KGPU, order, at, life, 3, &r, &err), 0);
    assert_int_equal(r.requests, 3);
    assert_int_equal(r.placed, 2);
    assert_int_equal((long)r.first_fail_pct, 100);
    assert_true(r.mean_in_use > 6.9 && r.mean_in_use < 7.1); /* one 7g held all along */
    double back[] = {0, 10, 5};
    assert_int_not_equal(
        kgpu_migsim_run_times(&in, KGPU_MIGSIM_KGPU, order, back, life, 3, &r, &err), 0);
    kgpu_migsim_input_free(&in);
}

static void layouts_of_a_gpu(void **state)
{
    (void)state;
    const kgpu_mig_model *m = a100();
    int lay[KGPU_MIGSIM_MAX_LAYOUTS][KGPU_MIG_MAX_PROFILES];
    int n = kgpu_migsim_layouts(m, lay, KGPU_MIGSIM_MAX_LAYOUTS);
    assert_true(n > 5);
    int p1 = pidx(m, "1g.5gb"), p3 = pidx(m, "3g.20gb"), p4 = pidx(m, "4g.20gb");
    int p7 = pidx(m, "7g.40gb");
    bool whole = false, pair = false, sevens = false;
    for (int i = 0; i < n; i++) {
        int compute = 0;
        for (int pi = 0; pi < m->nprofiles; pi++) {
            compute += lay[i][pi] * m->profiles[pi].compute;
            assert_true(!m->profiles[pi].media || lay[i][pi] == 0);
        }
        assert_true(compute <= KGPU_MIG_COMPUTE_SLICES);
        whole = whole || (lay[i][p7] == 1 && compute == 7);
        pair = pair || (lay[i][p4] == 1 && lay[i][p3] == 1);
        sevens = sevens || lay[i][p1] == 7;
        for (int j = 0; j < i; j++)
            assert_memory_not_equal(lay[i], lay[j], sizeof(lay[i]));
    }
    assert_true(whole && pair && sevens);
    assert_int_equal(kgpu_migsim_layouts(m, lay, 2), -1);
}

static void lp_values(void **state)
{
    (void)state;
    const kgpu_mig_model *m = a100();
    long d[KGPU_MIG_MAX_PROFILES] = {0};
    assert_true(kgpu_migsim_lp(m, d) == 0);
    d[pidx(m, "7g.40gb")] = 3;
    assert_true(kgpu_migsim_lp(m, d) > 2.999 && kgpu_migsim_lp(m, d) < 3.001);
    memset(d, 0, sizeof(d));
    d[pidx(m, "3g.20gb")] = 3; /* two to a GPU */
    assert_true(kgpu_migsim_lp(m, d) > 1.499 && kgpu_migsim_lp(m, d) < 1.501);
    d[pidx(m, "4g.20gb")] = 1; /* 4g + 3g, and 3g + 3g */
    assert_true(kgpu_migsim_lp(m, d) > 1.999 && kgpu_migsim_lp(m, d) < 2.001);
    memset(d, 0, sizeof(d));
    d[pidx(m, "1g.5gb")] = 8; /* seven compute slices a GPU */
    assert_true(kgpu_migsim_lp(m, d) > 8.0 / 7 - 1e-6 && kgpu_migsim_lp(m, d) < 8.0 / 7 + 1e-6);
    d[pidx(m, "1g.5gb+me")] = 1;
    assert_true(kgpu_migsim_lp(m, d) < 0);
}

/* The most of requests[0..n) that single-GPU nodes can hold, by trying every placement. */
static void brute(const kgpu_mig_model *m, kgpu_mig_gpu *g, int ngpus, const int *prof, int n,
                  int at, int placed, int *best)
{
    if (placed > *best)
        *best = placed;
    if (at == n || placed + (n - at) <= *best)
        return;
    const kgpu_mig_profile *p = &m->profiles[prof[at]];
    for (int i = 0; i < ngpus; i++)
        for (int s = 0; s < p->nstarts; s++)
            if (kgpu_mig_fits(m, &g[i], prof[at], p->starts[s])) {
                kgpu_mig_take(m, &g[i], prof[at], p->starts[s]);
                brute(m, g, ngpus, prof, n, at + 1, placed + 1, best);
                kgpu_mig_give(m, &g[i], prof[at], p->starts[s]);
            }
    brute(m, g, ngpus, prof, n, at + 1, placed, best);
}

static int random_profile(const kgpu_mig_model *m, kgpu_rng *rng)
{
    for (;;) {
        int pi = (int)kgpu_rng_below(rng, (uint64_t)m->nprofiles);
        if (!m->profiles[pi].media)
            return pi;
    }
}

/* Tiny instances without CPU limits: the LP bound is the optimum, and the packing at most it. */
static void bound_is_the_brute_force_optimum(void **state)
{
    (void)state;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 7, 1);
    for (int mi = 0; mi < kgpu_mig_model_count(); mi += 2) {
        const kgpu_mig_model *m = kgpu_mig_model_at(mi);
        for (int trial = 0; trial < 60; trial++) {
            int ngpus = 1 + (int)kgpu_rng_below(&rng, 3);
            int n = 1 + (int)kgpu_rng_below(&rng, ngpus == 1 ? 7 : 6);
            kgpu_migsim_node nd[3];
            kgpu_migsim_request rq[8];
            int prof[8];
            size_t order[8];
            for (int i = 0; i < ngpus; i++)
                nd[i] = (kgpu_migsim_node){1, 1000, 1000};
            for (int i = 0; i < n; i++) {
                prof[i] = random_profile(m, &rng);
                rq[i] = (kgpu_migsim_request){prof[i], 1, 0, 0};
                order[i] = (size_t)i;
            }
            kgpu_migsim_input in;
            kgpu_error err;
            assert_int_equal(kgpu_migsim_input_init(m, nd, ngpus, rq, (size_t)n, &in, &err), 0);
            kgpu_migsim_bound b;
            assert_int_equal(kgpu_migsim_offline(&in, order, (size_t)n, &b, &err), 0);
            kgpu_mig_gpu g[3];
            memset(g, 0, sizeof(g));
            int best = 0;
            brute(m, g, ngpus, prof, n, 0, 0, &best);
            if (b.upper != best)
                fail_msg("%s, %d GPUs, %d requests: bound %ld, optimum %d", m->name, ngpus, n,
                         b.upper, best);
            assert_true(b.packed <= best);
            for (int s = 0; s < KGPU_MIGSIM_STRATEGIES; s++) {
                kgpu_migsim_result r;
                assert_int_equal(
                    kgpu_migsim_run(&in, (kgpu_migsim_strategy)s, order, (size_t)n, &r, &err),
                    0);
                assert_true(r.placed <= best);
            }
            kgpu_migsim_input_free(&in);
        }
    }
}

/* Random small clusters with CPU and multi-GPU requests: bound >= everything placed. */
static void bound_holds_on_random_instances(void **state)
{
    (void)state;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 11, 1);
    const kgpu_mig_model *m = kgpu_mig_model_named("H100-80GB");
    int p7 = pidx(m, "7g.80gb");
    for (int trial = 0; trial < 40; trial++) {
        int nn = 1 + (int)kgpu_rng_below(&rng, 4), n = 10 + (int)kgpu_rng_below(&rng, 30);
        kgpu_migsim_node nd[4];
        kgpu_migsim_request rq[40];
        size_t order[40];
        for (int i = 0; i < nn; i++)
            nd[i] = (kgpu_migsim_node){1 + (int)kgpu_rng_below(&rng, 4),
                                       4000 + 4000 * (int64_t)kgpu_rng_below(&rng, 4), 64000};
        for (int i = 0; i < n; i++) {
            bool multi = kgpu_rng_below(&rng, 8) == 0;
            rq[i] = (kgpu_migsim_request){multi ? p7 : random_profile(m, &rng),
                                          multi ? 2 : 1,
                                          1000 * (int64_t)kgpu_rng_below(&rng, 6), 1000};
            order[i] = (size_t)i;
        }
        kgpu_migsim_input in;
        kgpu_error err;
        assert_int_equal(kgpu_migsim_input_init(m, nd, nn, rq, (size_t)n, &in, &err), 0);
        kgpu_migsim_bound b;
        assert_int_equal(kgpu_migsim_offline(&in, order, (size_t)n, &b, &err), 0);
        assert_true(b.packed <= b.upper);
        assert_true(b.upper <= b.possible && b.possible <= b.requests);
        assert_true(b.lp_gpus <= in.gpus + 1e-6);
        for (int s = 0; s < KGPU_MIGSIM_STRATEGIES; s++) {
            kgpu_migsim_result r;
            assert_int_equal(
                kgpu_migsim_run(&in, (kgpu_migsim_strategy)s, order, (size_t)n, &r, &err), 0);
            if (r.placed > b.upper)
                fail_msg("trial %d: %s placed %ld > bound %ld", trial,
                         kgpu_migsim_strategy_name((kgpu_migsim_strategy)s), r.placed, b.upper);
        }
        kgpu_migsim_input_free(&in);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(instance_limits_never_bind),
        cmocka_unit_test(profiles_form_a_chain),
        cmocka_unit_test(requests_map_to_the_nearest_profile),
        cmocka_unit_test(slice_order_keeps_the_big_start),
        cmocka_unit_test(node_scores_pair_profiles),
        cmocka_unit_test(multi_gpu_requests_and_cpu),
        cmocka_unit_test(bad_input_is_refused),
        cmocka_unit_test(departures_free_instances),
        cmocka_unit_test(layouts_of_a_gpu),
        cmocka_unit_test(lp_values),
        cmocka_unit_test(bound_is_the_brute_force_optimum),
        cmocka_unit_test(bound_holds_on_random_instances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
