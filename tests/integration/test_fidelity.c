/*
 * Fidelity to the FGD study (ATC '23): on the public Alibaba trace, seeds
 * 42-51, inflate 1.3, each policy's mean allocation at 130 % arrival must be
 * within 0.6 points of the published figure, and FGD's fragmentation ratio at
 * 90 % arrival within 3 points of 50 %. Skipped (exit 77) without the trace.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"

static const struct {
    const char *policy;
    double published;
} reference[] = {
    {"random", 87.47},  {"dotprod", 90.85}, {"clustering", 91.88},
    {"packing", 92.00}, {"bestfit", 93.08}, {"fgd", 95.39},
};

static char trace_dir[4096];

static void test_default_trace(void **state)
{
    char nodes[4200], pods[4200];
    snprintf(nodes, sizeof(nodes), "%s/openb_node_list_gpu_node.csv", trace_dir);
    snprintf(pods, sizeof(pods), "%s/openb_pod_list_default.csv", trace_dir);
    kgpu_sim_input in;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = kgpu_load_input(nodes, pods, &in, &err);
    if (rc != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(kgpu_cluster_node_count(in.cluster), 1213);
    assert_int_equal(in.gpus, 6212);

    const char *policies[6];
    for (int i = 0; i < 6; i++)
        policies[i] = reference[i].policy;
    uint64_t seeds[10];
    for (int i = 0; i < 10; i++)
        seeds[i] = 42 + (uint64_t)i;
    kgpu_study s;
    assert_int_equal(kgpu_study_init(&s, &in, policies, 6, seeds, 10, 1.3, &err), 0);
    assert_int_equal(kgpu_study_run(&s, &err), 0);

    printf("%-12s %10s %10s %8s\n", "policy", "published", "kgpu", "delta");
    int bad = 0;
    for (int i = 0; i < 6; i++) {
        double got = s.rows[i].alloc_pct_130, want = reference[i].published;
        printf("%-12s %10.2f %10.2f %+8.2f\n", policies[i], want, got, got - want);
        bad += got < want - 0.6 || got > want + 0.6;
    }
    const kgpu_study_row *fgd = &s.rows[5];
    printf("fgd: %.1f GPUs unallocated (published 286), fragmentation at 90%% arrival %.1f%% "
           "(published 50.0)\n",
           fgd->unallocated_gpus, fgd->frag_ratio_pct_90);
    assert_int_equal(bad, 0);
    assert_true(fgd->frag_ratio_pct_90 >= 47.0 && fgd->frag_ratio_pct_90 <= 53.0);
    /* The study's ordering of policies holds as well. */
    for (int i = 1; i < 6; i++)
        assert_true(s.rows[i].alloc_pct_130 > s.rows[0].alloc_pct_130);
    assert_true(fgd->alloc_pct_130 > s.rows[4].alloc_pct_130 + 1.5);
    kgpu_study_free(&s);
    kgpu_sim_input_free(&in);
}

int main(void)
{
    const char *dir = getenv("KGPU_TRACE_DIR");
    snprintf(trace_dir, sizeof(trace_dir), "%s", dir && *dir ? dir : KGPU_TRACE_DIR);
    char probe[4200];
    snprintf(probe, sizeof(probe), "%s/openb_pod_list_default.csv", trace_dir);
    if (access(probe, R_OK) != 0) {
        printf("SKIP: Alibaba trace not found in %s (set KGPU_TRACE_DIR)\n", trace_dir);
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_default_trace)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
