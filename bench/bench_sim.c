/*
 * Simulator speed and memory on the Alibaba trace: one FGD run (seed 42),
 * one kgpu run, the FGD run with its per-node score cache disabled (the
 * baseline that rescans every node), and the full study of 6 policies x 10 seeds.
 * Prints medians of several repetitions; asserts nothing.
 *
 *   bench_sim [TRACE_DIR] [REPEATS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "bench_util.h"

static void report(const char *what, double *t, int n, const char *unit_note)
{
    qsort(t, (size_t)n, sizeof(*t), bench_cmp_double);
    printf("%-44s median %8.3f s   min %8.3f   max %8.3f   (n=%d)%s\n", what, t[n / 2], t[0],
           t[n - 1], n, unit_note);
}

static double one_run(const kgpu_sim_input *in, const char *policy, double *alloc)
{
    kgpu_sim_config cfg = {.policy = policy, .seed = 42, .inflate = 1.3};
    kgpu_sim_result r;
    kgpu_error err;
    double t0 = kgpu_now();
    if (kgpu_sim_run(in, &cfg, &r, &err) != 0) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        exit(1);
    }
    *alloc = r.alloc_pct_final;
    return kgpu_now() - t0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : KGPU_TRACE_DIR;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 100)
        reps = 5;
    char nodes[4200], pods[4200];
    snprintf(nodes, sizeof(nodes), "%s/openb_node_list_gpu_node.csv", dir);
    snprintf(pods, sizeof(pods), "%s/openb_pod_list_default.csv", dir);
    if (access(pods, R_OK) != 0) {
        printf("bench_sim: SKIP, no Alibaba trace in %s\n", dir);
        return 0;
    }
    kgpu_error err;
    kgpu_sim_input in;
    double t0 = kgpu_now();
    if (kgpu_load_input(nodes, pods, &in, &err) != 0) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        return 1;
    }
    double load = kgpu_now() - t0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("trace: %s (1213 nodes, 6212 GPUs, 8152 pods), %ld CPUs, load+prepare %.3f s\n", dir,
           cpus, load);

    double t[100], alloc = 0, alloc_nocache = 0;
    for (int i = 0; i < reps; i++)
        t[i] = one_run(&in, "fgd", &alloc);
    report("fgd, one run (seed 42)", t, reps, "");
    double fgd_median = t[reps / 2];

    /* kgpu learns online: its caches are dropped at each snapshot of what it has seen. */
    double alloc_kgpu = 0;
    for (int i = 0; i < reps; i++)
        t[i] = one_run(&in, "kgpu", &alloc_kgpu);
    report("kgpu, one run (seed 42)", t, reps, "");
    printf("  kgpu %.2f%% vs fgd %.2f%%; %.1f us per placement decision over 1213 nodes\n",
           alloc_kgpu, alloc, t[reps / 2] * 1e6 / 10800.0);

    /* Baseline: no shape ids, so FGD rescores every node for every pod. */
    kgpu_sim_input nocache = in;
    nocache.requests = malloc(in.nrequests * sizeof(*in.requests));
    memcpy(nocache.requests, in.requests, in.nrequests * sizeof(*in.requests));
    for (size_t i = 0; i < in.nrequests; i++)
        nocache.requests[i].shape = -1;
    int breps = reps < 3 ? reps : 3;
    for (int i = 0; i < breps; i++)
        t[i] = one_run(&nocache, "fgd", &alloc_nocache);
    report("fgd, one run, score cache off (baseline)", t, breps, "");
    printf("  cache speed-up %.1fx; same result: %s (%.2f%% vs %.2f%%)\n",
           t[breps / 2] / fgd_median, alloc == alloc_nocache ? "yes" : "NO", alloc, alloc_nocache);
    printf("  per pod: %.1f us for one placement decision over 1213 nodes (fgd, cached)\n",
           fgd_median * 1e6 / 10800.0);
    free(nocache.requests);

    const char *policies[] = {"random", "dotprod", "clustering", "packing", "bestfit", "fgd"};
    uint64_t seeds[10];
    for (int i = 0; i < 10; i++)
        seeds[i] = 42 + (uint64_t)i;
    int sreps = reps < 3 ? reps : 3;
    for (int i = 0; i < sreps; i++) {
        kgpu_study s;
        if (kgpu_study_init(&s, &in, policies, 6, seeds, 10, 1.3, &err) != 0 ||
            kgpu_study_run(&s, &err) != 0) {
            fprintf(stderr, "bench_sim: %s\n", err.msg);
            return 1;
        }
        t[i] = s.elapsed_s;
        kgpu_study_free(&s);
    }
    report("full study: 6 policies x 10 seeds", t, sreps, "");
    printf("  vs the study's Go simulator, 65 min for one FGD run on this kind of machine: "
           "%.0fx faster per FGD run\n",
           65.0 * 60.0 / fgd_median);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak resident memory: %.1f MB\n", (double)ru.ru_maxrss / 1024.0);
    kgpu_sim_input_free(&in);
    return 0;
}
