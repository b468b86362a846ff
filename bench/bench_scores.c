/*
 * What the extender's 0-10 prioritize scores cost a policy: one simulator run
 * per seed (inflate 1.3) choosing each node as the policy does, as
 * kube-scheduler does from the policy's own 0-10 scores (rank-based for kgpu),
 * and from linear min-max 0-10 scores. Prints allocation % and unallocated GPUs.
 *
 *   bench_scores [TRACE_DIR] [POD_FILE] [SEEDS] [POLICY...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : KGPU_TRACE_DIR;
    const char *file = argc > 2 ? argv[2] : "openb_pod_list_default.csv";
    int nseeds = argc > 3 ? atoi(argv[3]) : 1;
    if (nseeds < 1 || nseeds > 100)
        nseeds = 1;
    const char *deflt[] = {"kgpu", "fgd"};
    const char *const *policies = argc > 4 ? (const char *const *)argv + 4 : deflt;
    int npol = argc > 4 ? argc - 4 : 2;
    char nodes[4200], pods[4200];
    snprintf(nodes, sizeof(nodes), "%s/openb_node_list_gpu_node.csv", dir);
    snprintf(pods, sizeof(pods), "%s/%s", dir, file);
    if (access(pods, R_OK) != 0) {
        printf("bench_scores: SKIP, no %s\n", pods);
        return 0;
    }
    kgpu_error err;
    kgpu_sim_input in;
    if (kgpu_load_input(nodes, pods, &in, &err) != 0) {
        fprintf(stderr, "bench_scores: %s\n", err.msg);
        return 1;
    }
    const char *modes[] = {"policy's best node", "0-10 scores (policy's own)",
                           "0-10 scores (linear)"};
    printf("%s, seeds 42..%d, inflate 1.3: mean allocation %% at the end (unallocated GPUs)\n",
           file, 41 + nseeds);
    for (int pi = 0; pi < npol; pi++) {
        for (int m = 0; m < 3; m++) {
            double alloc = 0, left = 0;
            for (int s = 0; s < nseeds; s++) {
                kgpu_sim_config cfg = {.policy = policies[pi],
                                       .seed = 42 + (uint64_t)s,
                                       .inflate = 1.3,
                                       .extender_scores = m};
                kgpu_sim_result r;
                if (kgpu_sim_run(&in, &cfg, &r, &err) != 0) {
                    fprintf(stderr, "bench_scores: %s\n", err.msg);
                    return 1;
                }
                alloc += r.alloc_pct_final;
                left += r.unallocated_gpus;
            }
            printf("  %-8s %-28s %6.2f %%  (%.0f GPUs)\n", policies[pi], modes[m], alloc / nseeds,
                   left / nseeds);
            fflush(stdout);
        }
    }
    return 0;
}
