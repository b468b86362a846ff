/*
 * Unit tests of the simulator's DRA allocator (kgpu_sim_config.allocator,
 * src/core/sim.c): devices first fit in slice order on kube-scheduler's node,
 * weight 0 as no extender at all, and the default allocator left as it was.
 * Small clusters are built by hand so that the arrival order, found by seed
 * through kgpu_sim_workload, makes first fit and the policies disagree.
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

/* One GPU of a hand-built node: its device index, model; listed in this order. */
typedef struct gpu_def {
    int index;
    const char *model;
} gpu_def;

/* A pod: count x milli (1000 = a whole GPU, exclusive), on `model` only when not NULL. */
typedef struct pod_def {
    int count, milli;
    const char *model;
} pod_def;

/*
 * A prepared input of one node with the GPUs as listed and the pods in file
 * order (each its own shape). The caller frees it with kgpu_sim_input_free.
 */
static void build_input(const gpu_def *gpus, int ngpus, const pod_def *pods, size_t npods,
                        kgpu_sim_input *in)
{
    memset(in, 0, sizeof(*in));
    kgpu_error err;
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){.index = gpus[i].index,
                               .model = gpus[i].model,
                               .memory_mib = 16384,
                               .numa = -1,
                               .healthy = true};
    kgpu_node_spec spec = {
        .name = "n0", .cpu_milli = 64000, .memory_mib = 262144, .gpus = g, .ngpus = ngpus};
    in->cluster = kgpu_cluster_new();
    assert_non_null(in->cluster);
    assert_int_equal(kgpu_cluster_add_node(in->cluster, &spec, &err), 0);
    in->requests = calloc(npods, sizeof(*in->requests));
    assert_non_null(in->requests);
    in->nrequests = npods;
    for (size_t i = 0; i < npods; i++) {
        kgpu_request *r = &in->requests[i];
        const char *allow[1] = {pods[i].model};
        *r = (kgpu_request){.cpu_milli = 1000,
                            .memory_mib = 1024,
                            .gpu_count = pods[i].count,
                            .gpu_milli = pods[i].milli,
                            .exclusive = pods[i].milli == KGPU_MILLI,
                            .allow = pods[i].model ? allow : NULL,
                            .nallow = pods[i].model ? 1 : 0,
                            .shape = (int)i};
        assert_int_equal(kgpu_request_compile(in->cluster, r, &err), 0);
        r->allow = NULL; /* as kgpu_sim_prepare: the mask is all a run needs */
        r->nallow = 0;
    }
    assert_int_equal(kgpu_workload_build(in->requests, npods, 0.95, &in->target, &err), 0);
    in->gpus = kgpu_cluster_gpu_count(in->cluster);
    in->capacity_milli = (int64_t)in->gpus * KGPU_MILLI;
}

/* The first seed whose arrival sequence is exactly the pods in file order, no draws added. */
static uint64_t seed_in_file_order(const kgpu_sim_input *in, double inflate)
{
    for (uint64_t seed = 1; seed < 100000; seed++) {
        size_t *order = NULL, len = 0;
        assert_int_equal(kgpu_sim_workload(in, seed, inflate, &order, &len, NULL), 0);
        bool same = len == in->nrequests;
        for (size_t k = 0; same && k < len; k++)
            same = order[k] == k;
        free(order);
        if (same)
            return seed;
    }
    fail_msg("no seed replays the file in order");
    return 0;
}

static const kgpu_sim_k8s k8s_default = KGPU_SIM_K8S_DEFAULT;
static const kgpu_sim_k8s k8s_alone = {.extender_weight = 0, .fit_weight = 1, .balanced_weight = 1};

static kgpu_sim_result run_ok(const kgpu_sim_input *in, const char *policy, uint64_t seed,
                              double inflate, kgpu_sim_allocator allocator, const kgpu_sim_k8s *k)
{
    kgpu_sim_config cfg = {.policy = policy,
                           .seed = seed,
                           .inflate = inflate,
                           .extender_scores = 1,
                           .k8s = k,
                           .allocator = allocator};
    kgpu_sim_result r;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = kgpu_sim_run(in, &cfg, &r, &err);
    if (rc != 0)
        fail_msg("kgpu_sim_run %s: %s", policy, err.msg);
    return r;
}

/*
 * gpu-0 with 600 free, gpu-1 with 300: a 300-milli share goes to gpu-0 under
 * DRA (first that fits) and to gpu-1 under best fit (tightest). The 600 that
 * follows then fits only where best fit left gpu-0 whole enough.
 */
static void test_share_first_fit(void **state)
{
    (void)state;
    static const gpu_def gpus[] = {{0, "T4"}, {1, "T4"}};
    static const pod_def pods[] = {{1, 400, NULL}, {1, 700, NULL}, {1, 300, NULL}, {1, 600, NULL}};
    kgpu_sim_input in;
    build_input(gpus, 2, pods, 4, &in);
    uint64_t seed = seed_in_file_order(&in, 1.0);

    kgpu_sim_result dra = run_ok(&in, "bestfit", seed, 1.0, KGPU_SIM_ALLOC_DRA, &k8s_alone);
    assert_int_equal(dra.pods, 4);
    assert_int_equal(dra.gpu_pods_failed, 1); /* the 600: 300 free on each GPU */
    assert_int_equal(dra.share_pods, 3);
    assert_int_equal(dra.share_gpus, 2);
    assert_float_equal(dra.alloc_pct_final, 70.0, 1e-9);

    kgpu_sim_result bf = run_ok(&in, "bestfit", seed, 1.0, KGPU_SIM_ALLOC_POLICY, &k8s_default);
    assert_int_equal(bf.gpu_pods_failed, 0);
    assert_int_equal(bf.share_pods, 4);
    assert_float_equal(bf.alloc_pct_final, 100.0, 1e-9);

    /* With the extender's scores the node is the same (one node) and so are the devices. */
    kgpu_sim_result dra5 = run_ok(&in, "bestfit", seed, 1.0, KGPU_SIM_ALLOC_DRA, &k8s_default);
    assert_int_equal(dra5.gpu_pods_failed, 1);
    kgpu_sim_input_free(&in);
}

/*
 * A request for two GPUs takes the first two that fit in slice order (gpu-0
 * with 600 free, gpu-1 with 350), not the two tightest (gpu-2 with 300,
 * gpu-1); the 600 after it then needs the untouched gpu-3, and the whole GPU
 * that comes last finds none.
 */
static void test_multi_gpu_first_n(void **state)
{
    (void)state;
    static const gpu_def gpus[] = {{0, "T4"}, {1, "T4"}, {2, "T4"}, {3, "T4"}};
    static const pod_def pods[] = {{1, 400, NULL}, {1, 650, NULL}, {1, 700, NULL},
                                   {2, 300, NULL}, {1, 600, NULL}, {1, 1000, NULL}};
    kgpu_sim_input in;
    build_input(gpus, 4, pods, 6, &in);
    uint64_t seed = seed_in_file_order(&in, 1.0);

    kgpu_sim_result dra = run_ok(&in, "bestfit", seed, 1.0, KGPU_SIM_ALLOC_DRA, &k8s_alone);
    assert_int_equal(dra.pods, 6);
    assert_int_equal(dra.gpu_pods_failed, 1);
    assert_int_equal(dra.share_pods_failed, 0); /* the whole GPU failed, not a share */
    assert_int_equal(dra.share_gpus, 4);
    assert_float_equal(dra.alloc_pct_final, 2950.0 / 40, 1e-9);

    kgpu_sim_result bf = run_ok(&in, "bestfit", seed, 1.0, KGPU_SIM_ALLOC_POLICY, &k8s_default);
    assert_int_equal(bf.gpu_pods_failed, 0);
    assert_int_equal(bf.share_gpus, 3);
    assert_float_equal(bf.alloc_pct_final, 3950.0 / 40, 1e-9);
    kgpu_sim_input_free(&in);
}

/*
 * Slice order is device index order, not the order the node listed its GPUs
 * in, and a device of another model is passed over. The node lists the V100
 * (index 1) before the T4 (index 0): a share of any model goes to the T4, so
 * the whole V100 asked for next is still there.
 */
static void test_index_order_and_models(void **state)
{
    (void)state;
    static const gpu_def listed[] = {{1, "V100"}, {0, "T4"}};
    static const pod_def pods[] = {{1, 500, NULL}, {1, 1000, "V100"}};
    kgpu_sim_input in;
    build_input(listed, 2, pods, 2, &in);
    uint64_t seed = seed_in_file_order(&in, 0.75);
    kgpu_sim_result r = run_ok(&in, "bestfit", seed, 0.75, KGPU_SIM_ALLOC_DRA, &k8s_alone);
    assert_int_equal(r.pods, 2);
    assert_int_equal(r.gpu_pods_failed, 0);
    assert_int_equal(r.constrained_pods, 1);
    kgpu_sim_input_free(&in);

    /* In index order: a V100-only share skips the untouched T4 that comes first. */
    static const gpu_def ordered[] = {{0, "T4"}, {1, "V100"}};
    static const pod_def pods2[] = {{1, 300, "V100"}, {1, 1000, NULL}, {1, 700, "V100"}};
    build_input(ordered, 2, pods2, 3, &in);
    seed = seed_in_file_order(&in, 1.0);
    r = run_ok(&in, "bestfit", seed, 1.0, KGPU_SIM_ALLOC_DRA, &k8s_alone);
    assert_int_equal(r.pods, 3);
    assert_int_equal(r.gpu_pods_failed, 0);
    assert_float_equal(r.alloc_pct_final, 100.0, 1e-9);
    kgpu_sim_input_free(&in);
}

/*
 * Weight 0: no extender. Every policy gives the same run, byte for byte, and
 * none is opened: kgpu, which always learns online, reports offline. With
 * weight 5 the policy's scores choose the node, and runs differ.
 */
static void test_weight_zero_no_policy(void **state)
{
    fixture *f = *state;
    bool differ = false;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        kgpu_sim_result a = run_ok(&f->in, "random", seed, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_alone);
        kgpu_sim_result b = run_ok(&f->in, "kgpu", seed, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_alone);
        kgpu_sim_result c = run_ok(&f->in, "fgd", seed, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_alone);
        assert_memory_equal(&a, &b, sizeof(a));
        assert_memory_equal(&a, &c, sizeof(a));
        assert_false(b.online);
        assert_true(a.alloc_pct_final > 0);
        kgpu_sim_result x = run_ok(&f->in, "random", seed, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_default);
        kgpu_sim_result y = run_ok(&f->in, "kgpu", seed, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_default);
        assert_true(y.online);
        differ |= memcmp(&x.curve, &y.curve, sizeof(x.curve)) != 0 ||
                  x.pods_failed != y.pods_failed || x.share_gpus != y.share_gpus;
    }
    assert_true(differ);

    /* No policy is opened, but a name that is none is still an error. */
    kgpu_sim_config bad = {.policy = "nope",
                           .seed = 1,
                           .inflate = 1.3,
                           .k8s = &k8s_alone,
                           .allocator = KGPU_SIM_ALLOC_DRA};
    kgpu_sim_result r;
    kgpu_error err;
    assert_int_equal(kgpu_sim_run(&f->in, &bad, &r, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "nope"));
    kgpu_sim_config odd = {
        .policy = "kgpu", .seed = 1, .inflate = 1.3, .allocator = (kgpu_sim_allocator)7};
    assert_int_equal(kgpu_sim_run(&f->in, &odd, &r, &err), KGPU_EINVAL);
}

/* Deterministic per seed; k8s NULL and extender_scores 0 mean the shipped kube-scheduler. */
static void test_dra_determinism(void **state)
{
    fixture *f = *state;
    kgpu_sim_result a = run_ok(&f->in, "kgpu", 5, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_default);
    kgpu_sim_result b = run_ok(&f->in, "kgpu", 5, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_default);
    assert_memory_equal(&a, &b, sizeof(a));
    kgpu_sim_config cfg = {
        .policy = "kgpu", .seed = 5, .inflate = 1.3, .allocator = KGPU_SIM_ALLOC_DRA};
    kgpu_sim_result c;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &c, NULL), 0);
    assert_memory_equal(&a, &c, sizeof(a));
    bool differ = false;
    for (uint64_t seed = 6; seed < 20 && !differ; seed++) {
        kgpu_sim_result d = run_ok(&f->in, "kgpu", seed, 1.3, KGPU_SIM_ALLOC_DRA, &k8s_default);
        differ = memcmp(&a, &d, sizeof(a)) != 0;
    }
    assert_true(differ);
}

/*
 * The default allocator is what it was before the DRA one existed: figures
 * of `kgpu simulate --nodes n.csv --pods p.csv --seeds 5 --json --no-timing`
 * from the build before it (commit 63a4b4b), in the study's method and
 * through kube-scheduler.
 */
static void test_policy_allocator_unchanged(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *policy;
        bool k8s;
        double alloc_100, alloc_final, frag_90;
        long failed, share_gpus;
    } want[] = {
        {"kgpu", false, 93.125, 95.20833333, 88.63636364, 8, 8},
        {"kgpu", true, 93.125, 95.20833333, 88.63636364, 8, 8},
        {"fgd", false, 88.95833333, 93.125, 87.02830189, 8, 9},
        {"fgd", true, 88.95833333, 93.125, 87.02830189, 8, 9},
        {"bestfit", false, 91.875, 93.95833333, 88.78205128, 9, 8},
        {"bestfit", true, 91.875, 93.95833333, 88.78205128, 9, 8},
        {"random", false, 84.79166667, 93.54166667, 75, 6, 10},
        {"random", true, 80.625, 91.45833333, 60.84070796, 4, 10},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        kgpu_sim_config cfg = {.policy = want[i].policy,
                               .seed = 5,
                               .inflate = 1.3,
                               .extender_scores = want[i].k8s,
                               .k8s = want[i].k8s ? &k8s_default : NULL};
        kgpu_sim_result r;
        assert_int_equal(kgpu_sim_run(&f->in, &cfg, &r, NULL), 0);
        assert_float_equal(r.alloc_pct_100, want[i].alloc_100, 1e-6);
        assert_float_equal(r.alloc_pct_final, want[i].alloc_final, 1e-6);
        assert_float_equal(r.frag_ratio_pct_90, want[i].frag_90, 1e-6);
        assert_int_equal(r.pods_failed, want[i].failed);
        assert_int_equal(r.share_gpus, want[i].share_gpus);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share_first_fit),
        cmocka_unit_test(test_multi_gpu_first_n),
        cmocka_unit_test(test_index_order_and_models),
        cmocka_unit_test(test_weight_zero_no_policy),
        cmocka_unit_test(test_dra_determinism),
        cmocka_unit_test(test_policy_allocator_unchanged),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
