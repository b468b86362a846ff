/*
 * Unit tests of the expanders (src/core/expander.c): Cluster Autoscaler's
 * least-waste, price and random as documented, and kgpu's, which judges an
 * option by what really fits the template's GPUs, drops options that place
 * nothing, and prefers the lowest cost per worth placed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/expander.h"

typedef struct fx {
    kgpu_cluster *c;
    kgpu_expander_group groups[3];
    kgpu_request share12, whole, small;
} fx;

/* Group 0: 2 x 8 GiB GPUs, 16 cores; group 1: 2 x 16 GiB, 32 cores; group 2: 4 x 16 GiB, 64 cores. */
static int setup(void **state)
{
    static fx f;
    memset(&f, 0, sizeof(f));
    f.c = kgpu_cluster_new();
    kgpu_error err;
    struct {
        const char *name, *model;
        int gpus;
        int64_t mib, cpu;
        double price;
    } g[3] = {{"p4", "P4", 2, 8192, 16000, 1.0},
              {"t4", "T4", 2, 16384, 32000, 1.5},
              {"v100", "V100", 4, 16384, 64000, 6.0}};
    for (int i = 0; i < 3; i++) {
        kgpu_gpu_spec gs[4];
        for (int k = 0; k < g[i].gpus; k++)
            gs[k] = (kgpu_gpu_spec){.index = k, .model = g[i].model, .memory_mib = g[i].mib,
                                    .numa = -1, .healthy = true};
        kgpu_node_spec ns = {.name = g[i].name, .cpu_milli = g[i].cpu, .memory_mib = 131072,
                             .gpus = gs, .ngpus = g[i].gpus};
        assert_int_equal(kgpu_cluster_add_node(f.c, &ns, &err), i);
    }
    for (int i = 0; i < 3; i++)
        f.groups[i] = (kgpu_expander_group){.node = kgpu_cluster_node(f.c, i),
                                            .price_hour = g[i].price};
    f.share12 = (kgpu_request){.cpu_milli = 2000, .memory_mib = 4096, .gpu_count = 1,
                               .gpu_milli = 300, .gpu_memory_mib = 12288, .shape = -1};
    f.whole = (kgpu_request){.cpu_milli = 4000, .memory_mib = 8192, .gpu_count = 1,
                             .gpu_milli = 1000, .exclusive = true, .shape = -1};
    f.small = (kgpu_request){.cpu_milli = 1000, .memory_mib = 2048, .gpu_count = 1,
                             .gpu_milli = 100, .gpu_memory_mib = 2048, .shape = -1};
    assert_int_equal(kgpu_request_compile(f.c, &f.share12, &err), 0);
    assert_int_equal(kgpu_request_compile(f.c, &f.whole, &err), 0);
    assert_int_equal(kgpu_request_compile(f.c, &f.small, &err), 0);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    kgpu_cluster_free(f->c);
    return 0;
}

static kgpu_expander_ctx ctx_of(fx *f)
{
    return (kgpu_expander_ctx){.models = f->c, .groups = f->groups, .ngroups = 3,
                               .pod_gpu_price = 2.0, .pod_core_price = 0.05};
}

/* The 12 GiB share fits no GPU of the P4 group, whatever its 16 GiB sum. */
static void test_kgpu_drops_what_does_not_fit(void **state)
{
    fx *f = *state;
    kgpu_expander_ctx ctx = ctx_of(f);
    const kgpu_request *pods[1] = {&f->share12};
    kgpu_expander_option opts[2] = {{.group = 0, .node_count = 1, .pods = pods, .npods = 1},
                                    {.group = 1, .node_count = 1, .pods = pods, .npods = 1}};
    kgpu_expander_eval ev[2];
    int choice;
    kgpu_error err;
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, opts, 2, NULL, ev, &choice,
                                          &err),
                     0);
    assert_int_equal(choice, 1);
    assert_int_equal(ev[0].placed, 0);
    assert_true(ev[0].score == INFINITY);
    assert_int_equal(ev[1].placed, 1);
    /* The cheaper P4 group wins for CA's price expander: it counts the pod as placed. */
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 1, 1);
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_PRICE, opts, 2, &rng, ev, &choice,
                                          &err),
                     0);
    assert_int_equal(choice, 0);
    assert_int_equal(ev[0].placed, 1);
    /* Only the P4 option: kgpu takes none. */
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, opts, 1, NULL, ev, &choice,
                                          &err),
                     0);
    assert_int_equal(choice, -1);
}

/*
 * Three whole GPUs. One T4 node (1.5/h) places two, two T4 nodes (3.0/h) or
 * one V100 node (6.0/h) all three: kgpu takes the least cost per worth
 * placed, the single T4 node; the third pod is pending at Cluster
 * Autoscaler's next loop, and gets a node of its own then.
 */
static void test_kgpu_cost_per_worth_placed(void **state)
{
    fx *f = *state;
    kgpu_expander_ctx ctx = ctx_of(f);
    const kgpu_request *pods[3] = {&f->whole, &f->whole, &f->whole};
    kgpu_expander_option opts[3] = {{.group = 1, .node_count = 1, .pods = pods, .npods = 3},
                                    {.group = 2, .node_count = 1, .pods = pods, .npods = 3},
                                    {.group = 1, .node_count = 2, .pods = pods, .npods = 3}};
    kgpu_expander_eval ev[3];
    int choice;
    kgpu_error err;
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, opts, 3, NULL, ev, &choice,
                                          &err),
                     0);
    assert_int_equal(ev[0].placed, 2);
    assert_int_equal(ev[1].placed, 3);
    assert_int_equal(ev[2].placed, 3);
    assert_int_equal(choice, 0);
    assert_true(ev[0].score < ev[2].score && ev[2].score < ev[1].score);
    /* Without the single node, 2 x T4 at 3.0/h beats 1 x V100 at 6.0/h for the same pods. */
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, opts + 1, 2, NULL, ev,
                                          &choice, &err),
                     0);
    assert_int_equal(choice, 1);
}

/* CA's least-waste: least idle CPU and memory share after the pods, GPUs ignored. */
static void test_least_waste_by_cpu_and_memory(void **state)
{
    fx *f = *state;
    kgpu_expander_ctx ctx = ctx_of(f);
    const kgpu_request *pods[2] = {&f->small, &f->small};
    kgpu_expander_option opts[3] = {{.group = 2, .node_count = 1, .pods = pods, .npods = 2},
                                    {.group = 0, .node_count = 1, .pods = pods, .npods = 2},
                                    {.group = 1, .node_count = 1, .pods = pods, .npods = 2}};
    kgpu_expander_eval ev[3];
    int choice;
    kgpu_error err;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 2, 1);
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_LEAST_WASTE, opts, 3, &rng, ev,
                                          &choice, &err),
                     0);
    assert_int_equal(choice, 1); /* the 16-core node wastes least */
    assert_true(ev[1].score < ev[2].score && ev[2].score < ev[0].score);
}

/* Random: every candidate chosen some time, deterministically per seed. */
static void test_random_is_seeded(void **state)
{
    fx *f = *state;
    kgpu_expander_ctx ctx = ctx_of(f);
    const kgpu_request *pods[1] = {&f->small};
    kgpu_expander_option opts[3] = {{.group = 0, .node_count = 1, .pods = pods, .npods = 1},
                                    {.group = 1, .node_count = 1, .pods = pods, .npods = 1},
                                    {.group = 2, .node_count = 1, .pods = pods, .npods = 1}};
    int seen[3] = {0}, first[8];
    kgpu_error err;
    for (int run = 0; run < 2; run++) {
        kgpu_rng rng;
        kgpu_rng_seed(&rng, 9, 1);
        for (int i = 0; i < 8; i++) {
            int choice;
            assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_RANDOM, opts, 3, &rng, NULL,
                                                  &choice, &err),
                             0);
            assert_true(choice >= 0 && choice < 3);
            seen[choice]++;
            if (run == 0)
                first[i] = choice;
            else
                assert_int_equal(choice, first[i]);
        }
    }
    assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
}

static void test_names_and_errors(void **state)
{
    fx *f = *state;
    assert_string_equal(kgpu_expander_name(KGPU_EXPANDER_LEAST_WASTE), "least-waste");
    assert_int_equal(kgpu_expander_parse("price"), KGPU_EXPANDER_PRICE);
    assert_int_equal(kgpu_expander_parse("priority"), -1);
    kgpu_expander_ctx ctx = ctx_of(f);
    kgpu_expander_option bad = {.group = 7, .node_count = 1};
    int choice;
    kgpu_error err;
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, &bad, 1, NULL, NULL, &choice,
                                          &err),
                     KGPU_EINVAL);
    assert_int_equal(choice, -1);
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, NULL, 0, NULL, NULL, &choice,
                                          &err),
                     0);
    assert_int_equal(choice, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kgpu_drops_what_does_not_fit),
        cmocka_unit_test(test_kgpu_cost_per_worth_placed),
        cmocka_unit_test(test_least_waste_by_cpu_and_memory),
        cmocka_unit_test(test_random_is_seeded),
        cmocka_unit_test(test_names_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
