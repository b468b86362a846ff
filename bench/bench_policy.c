/*
 * One placement decision on a synthetic 5,000-node cluster (the Alibaba
 * trace's node mix, 60 % allocated), for kgpu with fgd as the baseline in the
 * same run. Three figures per policy, medians of several repetitions:
 *   cold:   every cache dropped (the first pod after a workload change);
 *   steady: a stream of arrivals, each observed, selected and applied (the
 *           extender's steady state: only changed nodes are rescored);
 *   scores: kgpu_policy_node_scores of the same share over all nodes, caches
 *           warm (the extender's prioritize).
 * Asserts nothing.
 *
 *   bench_policy [NODES] [REPEATS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kgpu/policy.h"
#include "bench_util.h"

/* The node mix of the Alibaba GPU cluster: model, GPUs, CPU cores, memory GiB, share of nodes. */
static const struct {
    const char *model;
    int gpus, cores, mem_gib;
    double share;
} node_mix[] = {
    {"G2", 8, 96, 384, 0.45},   {"T4", 2, 104, 384, 0.32},     {"P100", 2, 16, 128, 0.09},
    {"G3", 8, 128, 768, 0.04},  {"V100M16", 4, 32, 128, 0.04}, {"V100M32", 8, 96, 768, 0.03},
    {"A10", 1, 128, 512, 0.03},
};

/* The most frequent pod shapes of the default pod list: CPU milli, GPUs, milli per GPU, weight. */
static const struct {
    int cpu, count, milli;
    double w;
} pod_mix[] = {
    {3152, 1, 810, 1047}, {11300, 1, 1000, 874}, {11400, 1, 1000, 599}, {3152, 1, 1000, 470},
    {11908, 1, 470, 388}, {12500, 0, 0, 366},    {8000, 1, 470, 360},   {12000, 1, 1000, 326},
    {32000, 0, 0, 290},   {18708, 1, 1000, 255}, {11908, 1, 650, 237},  {4000, 1, 320, 232},
    {8000, 0, 0, 185},    {4000, 1, 230, 122},   {6000, 1, 460, 120},   {88000, 8, 1000, 18},
    {46000, 4, 1000, 14}, {24000, 2, 1000, 20},  {4000, 1, 160, 54},
};
#define NSHAPES ((int)(sizeof(pod_mix) / sizeof(pod_mix[0])))

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(*t), bench_cmp_double);
    return t[n / 2];
}

static double pct(double *t, int n, double p)
{
    qsort(t, (size_t)n, sizeof(*t), bench_cmp_double);
    int i = (int)(p * (n - 1));
    return t[i];
}

static kgpu_cluster *make_cluster(int nodes, kgpu_rng *rng)
{
    kgpu_cluster *c = kgpu_cluster_new();
    kgpu_error err;
    for (int i = 0; i < nodes; i++) {
        double u = (double)kgpu_rng_below(rng, 1000000) / 1e6, acc = 0;
        int k = 0;
        while (k < (int)(sizeof(node_mix) / sizeof(node_mix[0])) - 1 &&
               u > (acc += node_mix[k].share))
            k++;
        kgpu_gpu_spec g[8];
        for (int j = 0; j < node_mix[k].gpus; j++)
            g[j] = (kgpu_gpu_spec){.index = j,
                                   .model = node_mix[k].model,
                                   .memory_mib = 32768,
                                   .numa = -1,
                                   .healthy = true};
        char name[32];
        snprintf(name, sizeof(name), "node-%05d", i);
        kgpu_node_spec s = {.name = name,
                            .cpu_milli = node_mix[k].cores * 1000,
                            .memory_mib = (int64_t)node_mix[k].mem_gib * 1024,
                            .gpus = g,
                            .ngpus = node_mix[k].gpus};
        if (kgpu_cluster_add_node(c, &s, &err) < 0) {
            fprintf(stderr, "bench_policy: %s\n", err.msg);
            exit(1);
        }
    }
    return c;
}

static kgpu_request draw_pod(const kgpu_cluster *c, kgpu_rng *rng)
{
    double total = 0;
    for (int i = 0; i < NSHAPES; i++)
        total += pod_mix[i].w;
    double u = (double)kgpu_rng_below(rng, 1000000) / 1e6 * total, acc = 0;
    int k = 0;
    while (k < NSHAPES - 1 && u > (acc += pod_mix[k].w))
        k++;
    kgpu_request r = {.cpu_milli = pod_mix[k].cpu,
                      .memory_mib = 8192,
                      .gpu_count = pod_mix[k].count,
                      .gpu_milli = pod_mix[k].count ? pod_mix[k].milli : 0,
                      .exclusive = pod_mix[k].count > 0 && pod_mix[k].milli == KGPU_MILLI,
                      .shape = k};
    kgpu_error err;
    if (kgpu_request_compile(c, &r, &err) != 0) {
        fprintf(stderr, "bench_policy: %s\n", err.msg);
        exit(1);
    }
    return r;
}

typedef struct figures {
    int fitting;
    double cold_ms, steady_us, steady_p99_us, scores_ms;
} figures;

/*
 * One policy on its own copy of the filled cluster: cold and steady decisions
 * and node scores. The learner is fed the same pods for both policies.
 */
static figures measure(const char *policy, const kgpu_cluster *filled, const kgpu_learner *seen_src,
                       int reps, uint64_t seed)
{
    (void)seen_src;
    figures f = {0};
    kgpu_error err;
    kgpu_cluster *c = kgpu_cluster_clone(filled);
    kgpu_learner *l = kgpu_learner_new(0.95, NULL, 0, &err);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, seed, 3);
    kgpu_policy *p = kgpu_policy_new(policy, c, kgpu_learner_workload(l), &err);
    if (p == NULL) {
        fprintf(stderr, "bench_policy: %s\n", err.msg);
        exit(1);
    }
    /* Both have seen as many pods as filled the cluster: a cluster that has been running. */
    for (int i = 0; i < 20000; i++) {
        kgpu_request r = draw_pod(c, &rng);
        if (kgpu_learner_observe(l, &r) == 1)
            kgpu_policy_invalidate(p);
        kgpu_policy_observe(p, c, &r);
    }
    int n = kgpu_cluster_node_count(c);
    int *all = malloc((size_t)n * sizeof(*all)), *scores = malloc((size_t)n * sizeof(*scores));
    for (int i = 0; i < n; i++)
        all[i] = i;
    double t[64];
    /* The costliest kind of pod: a GPU share, which tries each GPU of each node. */
    kgpu_request share = {
        .cpu_milli = 1000, .memory_mib = 1024, .gpu_count = 1, .gpu_milli = 470, .shape = NSHAPES};
    kgpu_request_compile(c, &share, &err);
    for (int i = 0; i < n; i++)
        f.fitting += kgpu_fit(c, i, &share, NULL, 0);
    for (int k = 0; k < reps; k++) {
        kgpu_policy_invalidate(p);
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        double t0 = kgpu_now();
        kgpu_policy_select(p, c, &share, NULL, 0, &rng, &node, gpus, &err);
        t[k] = kgpu_now() - t0;
    }
    f.cold_ms = median(t, reps) * 1e3;

    /* Steady state: warm the caches once per shape, then a stream of arrivals. */
    enum { STREAM = 2000 };
    static double s[STREAM];
    for (int i = 0; i < NSHAPES * 4; i++) {
        kgpu_request r = draw_pod(c, &rng);
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        kgpu_policy_select(p, c, &r, NULL, 0, &rng, &node, gpus, &err);
    }
    for (int i = 0; i < STREAM; i++) {
        kgpu_request r = draw_pod(c, &rng);
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        double t0 = kgpu_now();
        kgpu_policy_observe(p, c, &r);
        int rc = kgpu_policy_select(p, c, &r, NULL, 0, &rng, &node, gpus, &err);
        s[i] = kgpu_now() - t0;
        if (rc == 0)
            kgpu_cluster_apply(c, &r, node, gpus, NULL, &err);
    }
    f.steady_us = median(s, STREAM) * 1e6;
    f.steady_p99_us = pct(s, STREAM, 0.99) * 1e6;

    /* The extender's prioritize for the share over every node; the first call warms the cache. */
    kgpu_policy_node_scores(p, c, &share, all, n, scores, &err);
    for (int k = 0; k < reps; k++) {
        double t0 = kgpu_now();
        kgpu_policy_node_scores(p, c, &share, all, n, scores, &err);
        t[k] = kgpu_now() - t0;
    }
    f.scores_ms = median(t, reps) * 1e3;
    free(all);
    free(scores);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
    return f;
}

int main(int argc, char **argv)
{
    int nodes = argc > 1 ? atoi(argv[1]) : 5000;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    if (nodes < 10 || nodes > 100000)
        nodes = 5000;
    if (reps < 1 || reps > 64)
        reps = 9;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 42, 1);
    kgpu_cluster *c = make_cluster(nodes, &rng);
    int gpus = kgpu_cluster_gpu_count(c);
    /* Fill to 60 % of the GPU capacity with random placements of the same mix: most nodes stay
     * candidates. */
    kgpu_policy *filler = kgpu_policy_new("random", c, NULL, NULL);
    kgpu_error err;
    while ((double)kgpu_cluster_gpu_milli_allocated(c) < 0.6 * gpus * KGPU_MILLI) {
        kgpu_request r = draw_pod(c, &rng);
        int node, g[KGPU_MAX_GPUS_PER_NODE];
        if (kgpu_policy_select(filler, c, &r, NULL, 0, &rng, &node, g, &err) == 0)
            kgpu_cluster_apply(c, &r, node, g, NULL, &err);
    }
    kgpu_policy_free(filler);
    printf("cluster: %d nodes, %d GPUs, %.0f%% allocated; %d pod shapes; medians of %d\n", nodes,
           gpus, 100.0 * (double)kgpu_cluster_gpu_milli_allocated(c) / (gpus * (double)KGPU_MILLI),
           NSHAPES, reps);
    printf("%-8s %8s %14s %14s %14s %16s\n", "policy", "fitting", "cold ms", "steady us",
           "steady p99 us", "node_scores ms");
    const char *policies[] = {"fgd", "kgpu"};
    for (int i = 0; i < 2; i++) {
        figures f = measure(policies[i], c, NULL, reps, 7);
        printf("%-8s %8d %14.3f %14.1f %14.1f %16.3f\n", policies[i], f.fitting, f.cold_ms,
               f.steady_us, f.steady_p99_us, f.scores_ms);
    }
    printf("cold: one GPU share (470 milli, 1 core), every cache dropped; steady: observe + select "
           "per arriving pod, caches warm;\n"
           "node_scores: prioritize over all nodes, caches warm.\n");
    kgpu_cluster_free(c);
    return 0;
}
