/*
 * Unit tests of the simulator (src/core/sim.c) on small clusters written in
 * the trace format: workload inflation, determinism, curves and errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/sim.h"

#include "sim_fixture.h"

static void test_prepare(void **state)
{
    fixture *f = *state;
    assert_int_equal(f->in.gpus, 24);
    assert_int_equal(f->in.capacity_milli, 24000);
    assert_int_equal((int)f->in.nrequests, 8);
    /* Eight distinct shapes: the target keeps the most frequent up to 95 %, here all. */
    assert_int_equal(f->in.target.n, 8);
    double sum = 0;
    for (int i = 0; i < f->in.target.n; i++)
        sum += f->in.target.shapes[i].p;
    assert_float_equal(sum, 1.0, 1e-9);
    /* Requests with different shapes get different shape ids. */
    for (size_t i = 0; i < f->in.nrequests; i++)
        for (size_t j = i + 1; j < f->in.nrequests; j++)
            assert_int_not_equal(f->in.requests[i].shape, f->in.requests[j].shape);
}

static void test_run_basic(void **state)
{
    fixture *f = *state;
    const kgpu_policy_ops *const *ops = kgpu_policy_list();
    for (int k = 0; ops[k]; k++) {
        kgpu_sim_config cfg = {.policy = ops[k]->name, .seed = 42, .inflate = 1.3};
        kgpu_sim_result r;
        kgpu_error err;
        assert_int_equal(kgpu_sim_run(&f->in, &cfg, &r, &err), 0);
        /* Arrival stops before passing 130 %, and no pod asks for more than 4 GPUs (16.7 %). */
        assert_true(r.arrival_pct_final <= 130.0 + 1e-9);
        assert_true(r.arrival_pct_final > 130.0 - 4000.0 * 100 / 24000 - 1e-9);
        assert_true(r.alloc_pct_final > 0 && r.alloc_pct_final <= 100.0);
        assert_true(r.alloc_pct_final <= r.arrival_pct_final + 1e-9);
        assert_true(r.pods > 8);
        assert_true(r.pods_failed >= 0 && r.pods_failed < r.pods);
        assert_float_equal(r.unallocated_gpus, 24.0 * (100.0 - r.alloc_pct_final) / 100.0, 1e-6);
        assert_true(r.frag_ratio_pct_90 >= 0 && r.frag_ratio_pct_90 <= 100.0);
        /* Pods only arrive: allocation never decreases along the curve. */
        assert_float_equal(r.curve[0], 0.0, 0);
        for (int i = 1; i <= KGPU_SIM_CURVE_MAX; i++)
            assert_true(r.curve[i] >= r.curve[i - 1]);
        assert_float_equal(r.curve[KGPU_SIM_CURVE_MAX], r.alloc_pct_final, 1e-12);
        /* Share packing: the file's shares are 250, 300, 500 and 700 milli. */
        long placed = 0, milli = 0;
        for (int m = 1; m < KGPU_MILLI; m++) {
            if (m != 250 && m != 300 && m != 500 && m != 700)
                assert_int_equal(r.share_sizes[m], 0);
            placed += r.share_sizes[m];
            milli += m * r.share_sizes[m];
        }
        assert_true(placed > 0);
        assert_int_equal(placed, r.share_pods);
        assert_float_equal(r.share_compute_gpus, milli / 1000.0, 1e-9);
        assert_true(r.share_compute_gpus <= (double)r.share_gpus_bound);
        assert_true(r.share_gpus_bound <= r.share_gpus && r.share_gpus_bound <= r.share_gpus_bfd);
        /* The idle compute inside share GPUs is part of the unallocated GPUs. */
        assert_true((double)r.share_gpus - r.share_compute_gpus <= r.unallocated_gpus + 1e-9);
        assert_true(r.share_pods_failed >= 0 && r.share_pods_failed <= r.pods_failed);
    }
}

static void test_determinism(void **state)
{
    fixture *f = *state;
    kgpu_sim_config cfg = {.policy = "fgd", .seed = 7, .inflate = 1.3};
    kgpu_sim_result a, b, c;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &a, NULL), 0);
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &b, NULL), 0);
    assert_memory_equal(&a, &b, sizeof(a));
    /* Another seed draws another workload. */
    int differ = 0;
    for (uint64_t seed = 8; seed < 20 && !differ; seed++) {
        cfg.seed = seed;
        assert_int_equal(kgpu_sim_run(&f->in, &cfg, &c, NULL), 0);
        differ = memcmp(&a, &c, sizeof(a)) != 0;
    }
    assert_true(differ);
}

static void test_random_ties_option(void **state)
{
    fixture *f = *state;
    kgpu_sim_config cfg = {.policy = "packing", .seed = 3, .inflate = 1.3, .random_ties = true};
    kgpu_sim_result a, b;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &a, NULL), 0);
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &b, NULL), 0);
    assert_memory_equal(&a, &b, sizeof(a)); /* still deterministic for the seed */
}

static void test_deflate(void **state)
{
    fixture *f = *state;
    /* The file asks for 12.7 GPUs = 52.9 % of capacity; at 0.3x pods must be dropped. */
    kgpu_sim_config cfg = {.policy = "bestfit", .seed = 1, .inflate = 0.3};
    kgpu_sim_result r;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &r, NULL), 0);
    assert_true(r.arrival_pct_final <= 30.0 + 1e-9);
    assert_true(r.pods < 8);
}

static void test_errors(void **state)
{
    fixture *f = *state;
    kgpu_sim_result r;
    kgpu_error err;
    kgpu_sim_config bad = {.policy = "nope", .seed = 1, .inflate = 1.3};
    assert_int_equal(kgpu_sim_run(&f->in, &bad, &r, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "unknown policy 'nope'"));
    kgpu_sim_config zero = {.policy = "fgd", .seed = 1, .inflate = 0};
    assert_int_equal(kgpu_sim_run(&f->in, &zero, &r, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "inflate"));

    /* A cluster without GPUs cannot host the study. */
    static const char cpu_nodes[] = "sn,cpu_milli,memory_mib,gpu,model\nc0,64000,1024,0,\n";
    kgpu_trace nodes;
    kgpu_sim_input in;
    assert_int_equal(kgpu_trace_parse_nodes(cpu_nodes, strlen(cpu_nodes), "c.csv", &nodes, &err),
                     0);
    assert_int_equal(kgpu_sim_prepare(&nodes, &f->pods, &in, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "no GPUs"));
    kgpu_trace_free(&nodes);
}

static void test_cpu_only_workload(void **state)
{
    fixture *f = *state;
    /* A pod list with no GPU demand: nothing to inflate, every pod arrives once. */
    static const char cpu_pods[] = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                   "a,1000,1024,0,0\n"
                                   "b,2000,1024,0,0\n";
    kgpu_trace pods;
    kgpu_sim_input in;
    kgpu_error err;
    assert_int_equal(kgpu_trace_parse_pods(cpu_pods, strlen(cpu_pods), "c.csv", &pods, &err), 0);
    assert_int_equal(kgpu_sim_prepare(&f->nodes, &pods, &in, &err), 0);
    kgpu_sim_config cfg = {.policy = "fgd", .seed = 1, .inflate = 1.3};
    kgpu_sim_result r;
    assert_int_equal(kgpu_sim_run(&in, &cfg, &r, &err), 0);
    assert_int_equal(r.pods, 2);
    assert_int_equal(r.pods_failed, 0);
    assert_float_equal(r.alloc_pct_final, 0.0, 0);
    kgpu_sim_input_free(&in);
    kgpu_trace_free(&pods);
}

/* kgpu_sim_workload is the sequence a run replays: same length, demand to the target. */
static void test_workload_export(void **state)
{
    fixture *f = *state;
    for (uint64_t seed = 40; seed < 44; seed++) {
        size_t *order = NULL, len = 0;
        kgpu_error err;
        assert_int_equal(kgpu_sim_workload(&f->in, seed, 1.3, &order, &len, &err), 0);
        kgpu_sim_config cfg = {.policy = "fgd", .seed = seed, .inflate = 1.3};
        kgpu_sim_result r;
        assert_int_equal(kgpu_sim_run(&f->in, &cfg, &r, &err), 0);
        assert_int_equal((long)len, r.pods);
        long demand = 0;
        for (size_t k = 0; k < len; k++) {
            assert_true(order[k] < f->in.nrequests);
            const kgpu_request *q = &f->in.requests[order[k]];
            demand += (long)q->gpu_count * q->gpu_milli;
        }
        assert_float_equal(demand * 100.0 / 24000, r.arrival_pct_final, 1e-9);
        /* The same seed gives the same sequence. */
        size_t *again = NULL, len2 = 0;
        assert_int_equal(kgpu_sim_workload(&f->in, seed, 1.3, &again, &len2, &err), 0);
        assert_int_equal(len, len2);
        assert_memory_equal(order, again, len * sizeof(*order));
        free(again);
        free(order);
    }
    size_t *order = NULL, len = 0;
    kgpu_error err;
    assert_int_equal(kgpu_sim_workload(&f->in, 1, 0, &order, &len, &err), KGPU_EINVAL);
}

/* The kube-scheduler model: deterministic, every mode valid, all-pods shows CPU pods to kgpu. */
static void test_kube_scheduler_model(void **state)
{
    fixture *f = *state;
    kgpu_sim_k8s modes[] = {
        {.extender_weight = 5, .fit_weight = 1, .balanced_weight = 1},
        {.extender_weight = 5, .nodes_to_score = 100, .fit_weight = 1, .most_allocated = true},
        {.extender_weight = 50, .all_pods = true},
    };
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        kgpu_sim_config cfg = {
            .policy = "kgpu", .seed = 5, .inflate = 1.3, .extender_scores = 1, .k8s = &modes[m]};
        kgpu_sim_result a, b;
        kgpu_error err;
        assert_int_equal(kgpu_sim_run(&f->in, &cfg, &a, &err), 0);
        assert_int_equal(kgpu_sim_run(&f->in, &cfg, &b, &err), 0);
        assert_memory_equal(&a, &b, sizeof(a));
        assert_true(a.alloc_pct_final > 0 && a.alloc_pct_final <= a.arrival_pct_final + 1e-9);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare),           cmocka_unit_test(test_run_basic),
        cmocka_unit_test(test_determinism),       cmocka_unit_test(test_random_ties_option),
        cmocka_unit_test(test_deflate),           cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cpu_only_workload),
        cmocka_unit_test(test_workload_export),   cmocka_unit_test(test_kube_scheduler_model),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
