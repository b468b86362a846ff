/*
 * The time of one placement decision (kgpu_policy_select over every node),
 * decision by decision, through a run of the study's method: the pods of
 * one seed's workload arrive, each is decided and placed. Prints the
 * decisions' total, p50, p99, p99.9 and max, in CPU time of the thread (a
 * shared machine's other work does not count), and the process's peak RSS;
 * asserts nothing. --scan scores every node at every decision (the index
 * off), for the same figures the way a decision was made before it.
 *
 *   bench_decide NODES.csv PODS.csv POLICY [SEED] [--scan]
 *
 * kgpu (online_only) learns its target from the pods arrived; other
 * policies get the pod file's. Ties go to the study's per-seed node order
 * (kgpu_sim_tie_order): the choices are those of `kgpu simulate` for the
 * seed, so its pods_failed is failed here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "bench_util.h"

/* This thread's CPU time: a decision's own cost, whatever else the machine runs. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const kgpu_error *err)
{
    fprintf(stderr, "bench_decide: %s: %s\n", what, err->msg);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_decide NODES.csv PODS.csv POLICY [SEED] [--scan]\n");
        return 2;
    }
    const char *policy = argv[3];
    uint64_t seed = argc > 4 && strcmp(argv[4], "--scan") != 0 ? strtoull(argv[4], NULL, 10) : 42;
    bool scan = strcmp(argv[argc - 1], "--scan") == 0;
    kgpu_error err;
    char *nb = NULL, *pb = NULL;
    size_t nl = 0, pl = 0;
    kgpu_trace nodes, pods;
    memset(&nodes, 0, sizeof(nodes));
    memset(&pods, 0, sizeof(pods));
    kgpu_sim_input in;
    if (kgpu_read_file(argv[1], &nb, &nl, &err) != 0 ||
        kgpu_read_file(argv[2], &pb, &pl, &err) != 0 ||
        kgpu_trace_parse_nodes(nb, nl, argv[1], &nodes, &err) != 0 ||
        kgpu_trace_parse_pods(pb, pl, argv[2], &pods, &err) != 0 ||
        kgpu_sim_prepare(&nodes, &pods, &in, &err) != 0)
        die("loading", &err);
    kgpu_trace_free(&nodes);
    kgpu_trace_free(&pods);
    free(nb);
    free(pb);
    size_t *order, len;
    if (kgpu_sim_workload(&in, seed, 1.3, &order, &len, &err) != 0)
        die("workload", &err);
    kgpu_cluster *c = kgpu_cluster_clone(in.cluster);
    const kgpu_policy_ops *ops = kgpu_policy_find(policy);
    kgpu_learner *l = NULL;
    if (ops != NULL && ops->online_only && (l = kgpu_learner_new(0.95, NULL, 0, &err)) == NULL)
        die("learner", &err);
    kgpu_policy *p = kgpu_policy_new(policy, c, l ? kgpu_learner_workload(l) : &in.target, &err);
    if (c == NULL || p == NULL)
        die("policy", &err);
    int nn = kgpu_cluster_node_count(c);
    uint32_t *rank = malloc((size_t)nn * sizeof(*rank));
    double *t = malloc((len > 0 ? len : 1) * sizeof(*t));
    if (rank == NULL || t == NULL)
        return 1;
    kgpu_rng rng; /* seeded as kgpu_sim_run seeds its stream for ties and GPUs */
    kgpu_rng_seed(&rng, seed, 2);
    if (kgpu_sim_tie_order(&in, seed, 1.3, rank, &err) != 0)
        die("tie order", &err);
    kgpu_policy_set_tie_order(p, rank, nn);
    kgpu_policy_set_indexed(p, !scan);
    long failed = 0;
    double total = 0;
    for (size_t k = 0; k < len; k++) {
        const kgpu_request *req = &in.requests[order[k]];
        if (l != NULL && kgpu_learner_observe(l, req) == 1)
            kgpu_policy_invalidate(p);
        kgpu_policy_observe(p, c, req);
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        double t0 = cpu_now();
        int rc = kgpu_policy_select(p, c, req, NULL, 0, &rng, &node, gpus, &err);
        t[k] = cpu_now() - t0;
        total += t[k];
        if (rc == 0 && kgpu_cluster_apply(c, req, node, gpus, NULL, &err) != 0)
            die("apply", &err);
        failed += rc != 0;
    }
    qsort(t, len, sizeof(*t), bench_cmp_double);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%s%s nodes=%d decisions=%zu failed=%ld total_s=%.3f p50_us=%.1f p99_us=%.1f "
           "p999_us=%.1f max_us=%.1f peak_rss_mb=%.0f\n",
           policy, scan ? " (scan)" : "", nn, len, failed, total, t[len / 2] * 1e6,
           t[(size_t)((double)len * 0.99)] * 1e6, t[(size_t)((double)len * 0.999)] * 1e6,
           t[len - 1] * 1e6, (double)ru.ru_maxrss / 1024.0);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
    kgpu_sim_input_free(&in);
    free(order);
    free(rank);
    free(t);
    return 0;
}
