/*
 * Unit tests of the fragmentation measure by parts (src/core/frag.c,
 * kgpu__frag_node_of and kgpu__frag_after) and of kgpu__share_candidates
 * (src/core/pick.c), the cold path of the fgd and kgpu policies. By parts
 * must give kgpu_node_frag's figure to the last bit, or the policies' choices
 * would drift from the measure they claim to minimise; checked on random
 * nodes (one or several models, unhealthy GPUs, up to 32 GPUs) and random
 * workloads (CPU-only, multi-GPU and model-constrained shapes, CPU figures
 * past an int), for no change, one GPU and several GPUs taken.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"
#include "kgpu/rng.h"

#define MAX_SHAPES 300

static kgpu_rng rng;

static int below(int n)
{
    return n > 0 ? (int)kgpu_rng_below(&rng, (uint64_t)n) : 0;
}

static void random_workload(kgpu_shape *sh, int n)
{
    static const int milli[] = {0, 1000, 500, 470, 810, 250, 160, 1, 999, 320};
    for (int s = 0; s < n; s++) {
        int count = below(5);
        sh[s] = (kgpu_shape){.cpu_milli = below(4) == 0 ? 0 : below(48000),
                             .gpu_milli = count == 0 ? 0 : milli[below(10)],
                             .gpu_count = count,
                             .models = below(3) == 0 ? ~0ULL : kgpu_rng_next(&rng) & 0xF,
                             .p = (1.0 + below(1000)) / 997.0};
        if (below(40) == 0)
            sh[s].cpu_milli = (int64_t)1 << 40; /* past an int: the shape-by-shape path */
    }
}

static int random_node(kgpu_node *n, kgpu_gpu *gpus)
{
    static const int free_milli[] = {0, 1000, 530, 190, 840, 500, 30};
    int ng = below(8) == 0 ? below(33) : below(9);
    bool several = below(4) == 0;
    int m0 = below(4);
    memset(n, 0, sizeof(*n));
    for (int i = 0; i < ng; i++) {
        memset(&gpus[i], 0, sizeof(gpus[i]));
        gpus[i].index = i;
        gpus[i].model = several ? below(4) : m0;
        gpus[i].healthy = below(10) != 0;
        gpus[i].free_milli = below(3) ? free_milli[below(7)] : below(1001);
        gpus[i].memory_mib = 32768;
        gpus[i].free_memory_mib = below(32769);
        n->model_mask |= 1ULL << gpus[i].model;
    }
    n->ngpus = ng;
    n->gpus = gpus;
    n->cpu_milli = 96000;
    n->cpu_free = below(96001);
    return ng;
}

static void assert_same_bits(double want, double got)
{
    if (memcmp(&want, &got, sizeof(want)) != 0)
        fail_msg("by parts %.17g, kgpu_node_frag %.17g", got, want);
}

static void test_by_parts_equals_the_measure(void **state)
{
    (void)state;
    static int ints[KGPU__FRAG_TABLE_INTS(MAX_SHAPES)];
    static kgpu_shape shapes[MAX_SHAPES];
    kgpu_rng_seed(&rng, 11, 0);
    long checks = 0;
    for (int round = 0; round < 6000; round++) {
        int ns = 1 + below(round % 10 == 0 ? MAX_SHAPES : 24);
        random_workload(shapes, ns);
        kgpu_workload w = {.shapes = shapes, .n = ns};
        kgpu_gpu gpus[KGPU_MAX_GPUS_PER_NODE];
        kgpu_node n;
        int ng = random_node(&n, gpus);
        kgpu__frag_table t;
        kgpu__frag_table_load(&t, &w, ns, ints);
        assert_true(kgpu__frag_table_fresh(&t, &w, ns));
        kgpu__frag_node b;
        kgpu__frag_node_of(&n, &t, &b);
        /* The node's CPU, any, exactly a shape's (the edge of "CPU short"), past an int. */
        int64_t cpus[] = {n.cpu_free, below(48000), shapes[below(ns)].cpu_milli, (int64_t)1 << 40};
        for (int ci = 0; ci < 4; ci++) {
            int64_t cpu = cpus[ci];
            assert_same_bits(kgpu_node_frag(&n, &w, NULL, cpu),
                             kgpu__frag_after(&b, NULL, NULL, 0, cpu, NULL));
            checks++;
            int free_after[KGPU_MAX_GPUS_PER_NODE];
            for (int g = 0; g < ng; g++) { /* one GPU */
                if (!gpus[g].healthy)
                    continue;
                int take = below(gpus[g].free_milli + 1), total = -1;
                for (int i = 0; i < ng; i++)
                    free_after[i] = gpus[i].free_milli;
                free_after[g] -= take;
                assert_same_bits(kgpu_node_frag(&n, &w, free_after, cpu),
                                 kgpu__frag_after(&b, &g, &take, 1, cpu, &total));
                assert_int_equal(total, b.total - take);
                checks++;
            }
            if (ng >= 2) { /* several GPUs, as a multi-GPU pod takes them */
                int chosen[KGPU_MAX_GPUS_PER_NODE], take[KGPU_MAX_GPUS_PER_NODE], k = 0;
                for (int i = 0; i < ng; i++)
                    free_after[i] = gpus[i].free_milli;
                for (int g = 0; g < ng; g++) {
                    if (!gpus[g].healthy || below(2))
                        continue;
                    chosen[k] = g;
                    take[k] = below(gpus[g].free_milli + 1);
                    free_after[g] -= take[k++];
                }
                assert_same_bits(kgpu_node_frag(&n, &w, free_after, cpu),
                                 kgpu__frag_after(&b, chosen, take, k, cpu, NULL));
                checks++;
            }
        }
    }
    assert_true(checks > 50000);
}

/* A table of the first n shapes answers for those only, as kgpu's cap on shapes asks. */
static void test_a_prefix_of_the_workload(void **state)
{
    (void)state;
    static int ints[KGPU__FRAG_TABLE_INTS(MAX_SHAPES)];
    kgpu_shape shapes[40];
    kgpu_rng_seed(&rng, 12, 0);
    for (int round = 0; round < 500; round++) {
        random_workload(shapes, 40);
        kgpu_workload w = {.shapes = shapes, .n = 40}, prefix = {.shapes = shapes, .n = 25};
        kgpu_gpu gpus[KGPU_MAX_GPUS_PER_NODE];
        kgpu_node n;
        random_node(&n, gpus);
        kgpu__frag_table t;
        kgpu__frag_table_load(&t, &w, 25, ints);
        assert_false(kgpu__frag_table_fresh(&t, &w, 40));
        kgpu__frag_node b;
        kgpu__frag_node_of(&n, &t, &b);
        assert_same_bits(kgpu_node_frag(&n, &prefix, NULL, n.cpu_free),
                         kgpu__frag_after(&b, NULL, NULL, 0, n.cpu_free, NULL));
    }
}

/* Each kind of usable GPU once, the first of its kind, in index order. */
static void test_share_candidates(void **state)
{
    (void)state;
    kgpu_rng_seed(&rng, 13, 0);
    for (int round = 0; round < 3000; round++) {
        kgpu_gpu gpus[KGPU_MAX_GPUS_PER_NODE];
        kgpu_node n;
        int ng = random_node(&n, gpus);
        kgpu_request req;
        memset(&req, 0, sizeof(req));
        req.gpu_count = 1;
        req.gpu_milli = 1 + below(1000);
        req.gpu_memory_mib = below(3) ? 0 : below(32769);
        req.models = below(2) ? ~0ULL : kgpu_rng_next(&rng) & 0xF;
        req.shape = -1;
        int cand[KGPU_MAX_GPUS_PER_NODE], want[KGPU_MAX_GPUS_PER_NODE], m = 0;
        for (int i = 0; i < ng; i++) {
            const kgpu_gpu *g = &gpus[i];
            if (!g->healthy || !((req.models >> g->model) & 1) || g->free_milli < req.gpu_milli ||
                g->free_memory_mib < req.gpu_memory_mib)
                continue;
            bool seen = false;
            for (int j = 0; j < m; j++)
                seen |=
                    gpus[want[j]].free_milli == g->free_milli && gpus[want[j]].model == g->model;
            if (!seen)
                want[m++] = i;
        }
        int got = kgpu__share_candidates(&n, &req, cand);
        assert_int_equal(got, m);
        for (int i = 0; i < m; i++)
            assert_int_equal(cand[i], want[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_by_parts_equals_the_measure),
        cmocka_unit_test(test_a_prefix_of_the_workload),
        cmocka_unit_test(test_share_candidates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
