/*
 * Unit tests of the estimate and the dispatcher's order (src/core/estimate.c):
 * copies counted as the policy places them, per model, reserves taken first,
 * fragmentation kept per copy equal to a full recount, the cluster left
 * exactly as it was; an empty node of a group; and the ranking rule, key by
 * key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"
#include "kgpu/estimate.h"

/* Node i: `gpus[i]` GPUs of model `models[i]`. */
static kgpu_cluster *cluster_of(int n, const int *gpus, const char *const *models)
{
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    kgpu_error err;
    for (int i = 0; i < n; i++) {
        kgpu_gpu_spec g[8];
        for (int k = 0; k < gpus[i]; k++)
            g[k] = (kgpu_gpu_spec){.index = k, .model = models[i], .memory_mib = 16384,
                                   .numa = -1, .healthy = true};
        char name[16];
        snprintf(name, sizeof(name), "n%d", i);
        kgpu_node_spec s = {.name = name, .cpu_milli = 64000, .memory_mib = 262144, .gpus = g,
                            .ngpus = gpus[i]};
        assert_int_equal(kgpu_cluster_add_node(c, &s, &err), i);
    }
    return c;
}

static kgpu_request share(kgpu_cluster *c, int milli, const char *const *allow, int nallow)
{
    kgpu_request r = {.gpu_count = 1, .gpu_milli = milli, .allow = allow, .nallow = nallow,
                      .shape = -1};
    kgpu_error err;
    assert_int_equal(kgpu_request_compile(c, &r, &err), 0);
    return r;
}

static kgpu_request whole(kgpu_cluster *c, int count)
{
    kgpu_request r = {.gpu_count = count, .gpu_milli = KGPU_MILLI, .exclusive = true,
                      .shape = -1};
    kgpu_error err;
    assert_int_equal(kgpu_request_compile(c, &r, &err), 0);
    return r;
}

/* Free milli per GPU of every node, to compare before and after. */
static void free_of(const kgpu_cluster *c, int *out)
{
    int k = 0;
    for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        for (int g = 0; g < n->ngpus; g++)
            out[k++] = n->gpus[g].free_milli;
    }
}

static void test_counts_copies_and_models(void **state)
{
    (void)state;
    const char *models[] = {"A100", "T4", "T4"};
    int gpus[] = {2, 4, 1};
    kgpu_cluster *c = cluster_of(3, gpus, models);
    kgpu_error err;
    kgpu_policy *p = kgpu_policy_new("bestfit", c, NULL, &err);
    assert_non_null(p);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 1, 1);
    int before[16], after[16];
    free_of(c, before);

    kgpu_request w1 = whole(c, 1);
    kgpu_estimate e;
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, NULL, 0, &w1, 100, &rng, &e, &err), 0);
    assert_int_equal(e.fit, 7); /* every GPU once */
    int a100 = kgpu_cluster_model_id(c, "A100", false), t4 = kgpu_cluster_model_id(c, "T4", false);
    assert_int_equal(e.by_model[a100], 2);
    assert_int_equal(e.by_model[t4], 5);
    assert_true(e.first_node >= 0);
    assert_int_equal(e.idle_milli, 7 * KGPU_MILLI);

    /* max caps the count. */
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, NULL, 0, &w1, 3, &rng, &e, &err), 0);
    assert_int_equal(e.fit, 3);

    /* A model restriction: only the T4s count. */
    const char *only_a100[] = {"A1*"};
    kgpu_request s = share(c, 300, only_a100, 1);
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, NULL, 0, &s, 100, &rng, &e, &err), 0);
    assert_int_equal(e.fit, 6); /* three 300-milli shares per A100 */
    assert_int_equal(e.first_model, a100);
    assert_int_equal(e.by_model[t4], 0);

    /* Four whole GPUs together: only node n1 holds them. */
    kgpu_request w4 = whole(c, 4);
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, NULL, 0, &w4, 10, &rng, &e, &err), 0);
    assert_int_equal(e.fit, 1);
    assert_int_equal(e.first_node, 1);

    free_of(c, after);
    assert_memory_equal(before, after, sizeof(int) * 7);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

static void test_reserves_come_first(void **state)
{
    (void)state;
    const char *models[] = {"T4", "T4"};
    int gpus[] = {4, 4};
    kgpu_cluster *c = cluster_of(2, gpus, models);
    kgpu_error err;
    kgpu_policy *p = kgpu_policy_new("bestfit", c, NULL, &err);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 1, 1);
    kgpu_request w4 = whole(c, 4), w1 = whole(c, 1);
    kgpu_estimate e;
    /* One 4-GPU dispatch in flight: one more 4-GPU copy fits, not two. */
    kgpu_shape_count res[] = {{&w4, 1}};
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, res, 1, &w4, 10, &rng, &e, &err), 0);
    assert_int_equal(e.fit, 1);
    assert_int_equal(e.reserved, 1);
    assert_int_equal(e.reserved_missed, 0);
    assert_int_equal(e.idle_milli, 4 * KGPU_MILLI);
    /* Three in flight: two find room, one misses, and nothing is left. */
    res[0].count = 3;
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, res, 1, &w1, 10, &rng, &e, &err), 0);
    assert_int_equal(e.reserved, 2);
    assert_int_equal(e.reserved_missed, 1);
    assert_int_equal(e.fit, 0);
    assert_int_equal(e.first_node, -1);
    assert_int_equal(e.first_model, -1);
    /* The cluster is as it was. */
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(c), 0);
    /* Bad arguments change nothing and say why. */
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, res, 1, &w1, 0, &rng, &e, &err),
                     KGPU_EINVAL);
    res[0].count = -1;
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, res, 1, &w1, 1, &rng, &e, &err),
                     KGPU_EINVAL);
    res[0].count = 5000;
    assert_int_equal(kgpu_estimate_shape(c, p, NULL, res, 1, &w1, 1, &rng, &e, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "reserved copies"));
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

/* The fragmentation kept per copy equals a full recount after placing the same copies. */
static void test_frag_matches_recount(void **state)
{
    (void)state;
    const char *models[] = {"T4", "T4", "A100"};
    int gpus[] = {2, 1, 4};
    kgpu_cluster *c = cluster_of(3, gpus, models);
    kgpu_error err;
    kgpu_request reqs[2] = {share(c, 500, NULL, 0), whole(c, 1)};
    kgpu_workload w;
    assert_int_equal(kgpu_workload_build(reqs, 2, 1.0, &w, &err), 0);
    kgpu_policy *p = kgpu_policy_new("bestfit", c, &w, &err);
    assert_non_null(p);
    kgpu_request s = share(c, 700, NULL, 0);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 7, 1);
    kgpu_estimate e;
    double frag0 = kgpu_cluster_frag(c, &w, NULL);
    assert_int_equal(kgpu_estimate_shape(c, p, &w, NULL, 0, &s, 3, &rng, &e, &err), 0);
    assert_int_equal(e.fit, 3);
    assert_float_equal(e.frag_before, frag0, 1e-6);
    /* Same seed, same choices: place the three for real and recount. */
    kgpu_rng_seed(&rng, 7, 1);
    kgpu_assignment a[3];
    double first = 0;
    for (int i = 0; i < 3; i++) {
        int node, g[8];
        assert_int_equal(kgpu_policy_select(p, c, &s, NULL, 0, &rng, &node, g, &err), 0);
        assert_int_equal(kgpu_cluster_apply(c, &s, node, g, &a[i], &err), 0);
        if (i == 0)
            first = kgpu_cluster_frag(c, &w, NULL);
    }
    assert_float_equal(e.frag_first, first, 1e-6);
    assert_float_equal(e.frag_after, kgpu_cluster_frag(c, &w, NULL), 1e-6);
    assert_true(e.frag_after != e.frag_before);
    for (int i = 2; i >= 0; i--)
        assert_int_equal(kgpu_cluster_release(c, &a[i], &err), 0);
    kgpu_policy_free(p);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

static void test_empty_node(void **state)
{
    (void)state;
    kgpu_gpu_spec g[8];
    for (int k = 0; k < 8; k++)
        g[k] = (kgpu_gpu_spec){.index = k, .model = "NVIDIA A100-SXM4-80GB",
                               .memory_mib = 81920, .numa = -1, .healthy = false};
    kgpu_node_spec t = {.name = "template", .gpus = g, .ngpus = 8};
    kgpu_error err;
    kgpu_request w2 = {.gpu_count = 2, .gpu_milli = KGPU_MILLI, .exclusive = true};
    assert_int_equal(kgpu_estimate_empty_node(&t, &w2, 100, &err), 4);
    kgpu_request s = {.gpu_count = 1, .gpu_milli = 250, .gpu_memory_mib = 10240,
                      .cpu_milli = 999999};
    assert_int_equal(kgpu_estimate_empty_node(&t, &s, 100, &err), 32); /* 4 per GPU, CPU aside */
    assert_int_equal(kgpu_estimate_empty_node(&t, &s, 5, &err), 5);
    const char *t4[] = {"*T4*"};
    kgpu_request other = {.gpu_count = 1, .gpu_milli = 500, .allow = t4, .nallow = 1};
    assert_int_equal(kgpu_estimate_empty_node(&t, &other, 100, &err), 0);
    kgpu_request mem = {.gpu_count = 1, .gpu_milli = 100, .gpu_memory_mib = 90000};
    assert_int_equal(kgpu_estimate_empty_node(&t, &mem, 100, &err), 0);
    assert_int_equal(kgpu_estimate_empty_node(&t, &mem, 0, &err), KGPU_EINVAL);
}

static kgpu_dispatch_candidate cand(const char *name, int fit)
{
    return (kgpu_dispatch_candidate){.name = name, .reachable = true, .fit = fit, .pref = -1};
}

static void test_rank_rules(void **state)
{
    (void)state;
    kgpu_dispatch_candidate c[4] = {cand("a", 5), cand("b", 5), cand("c", 0), cand("d", 9)};
    int order[4];
    /* Never one that cannot place it; the unreachable neither. */
    c[3].reachable = false;
    c[0].frag_added = 30;
    c[1].frag_added = 10;
    assert_int_equal(kgpu_dispatch_rank(c, 4, 1, order), 2);
    assert_int_equal(order[0], 1); /* less fragmentation added */
    assert_int_equal(order[1], 0);
    /* need 6: nobody fits now; growth counts then. */
    assert_int_equal(kgpu_dispatch_rank(c, 4, 6, order), 0);
    c[2].grow = 8;
    assert_int_equal(kgpu_dispatch_rank(c, 4, 6, order), 1);
    assert_int_equal(order[0], 2);
    /* ...but growth never outranks room now. */
    assert_int_equal(kgpu_dispatch_rank(c, 4, 5, order), 2);
    /* Preference first: listed ones by rank, unlisted last. */
    c[0].pref = 1;
    c[1].pref = -1;
    assert_int_equal(kgpu_dispatch_rank(c, 4, 1, order), 2);
    assert_int_equal(order[0], 0);
    c[1].pref = 0;
    assert_int_equal(kgpu_dispatch_rank(c, 4, 1, order), 2);
    assert_int_equal(order[0], 1);
    /* Same preference: measured throughput per cost beats fragmentation; unknown last. */
    c[0].scored = c[1].scored = true;
    c[0].score = -1;
    c[1].score = -1000000; /* and beats the policy's score */
    c[0].pref = c[1].pref = 0;
    c[0].perf_per_cost = 2.0;
    assert_int_equal(kgpu_dispatch_rank(c, 4, 1, order), 2);
    assert_int_equal(order[0], 0);
    c[1].perf_per_cost = 3.0;
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 1);
    /* The policy's score, when both clusters have one, before fragmentation added. */
    c[0].perf_per_cost = c[1].perf_per_cost = 0;
    c[0].frag_added = 5;
    c[1].frag_added = 50;
    c[0].scored = c[1].scored = true;
    c[0].score = -900;
    c[1].score = -100;
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 1);
    c[1].scored = false; /* one unscored: fragmentation decides */
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 0);
    c[0].scored = false;
    /* All equal but price: the cheaper, unknown after known. */
    c[0].perf_per_cost = c[1].perf_per_cost = 0;
    c[0].frag_added = c[1].frag_added = 0;
    c[1].price = 3.0;
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 1);
    c[0].price = 1.0;
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 0);
    /* Then more room, then the name. */
    c[0].price = c[1].price = 0;
    c[1].fit = 6;
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 1);
    c[1].fit = 5;
    kgpu_dispatch_rank(c, 4, 1, order);
    assert_int_equal(order[0], 0);
    assert_int_equal(kgpu_dispatch_rank(c, 0, 1, order), 0);
    assert_int_equal(kgpu_dispatch_rank(c, 4, 0, order), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_copies_and_models),
        cmocka_unit_test(test_reserves_come_first),
        cmocka_unit_test(test_frag_matches_recount),
        cmocka_unit_test(test_empty_node),
        cmocka_unit_test(test_rank_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
