/*
 * What one reclaim decision costs (kgpu_queues_reclaim), the figure that says
 * whether the extender can run it inside a filter call. A synthetic cluster
 * of 8-GPU nodes, filled with shares and whole GPUs of queue b to 97 % of its
 * GPU compute at random, then each GPU's remainder as one more share, so b
 * borrows nearly all of it and nothing is free; queue a, guaranteed half
 * the cluster, waits with a pod of each shape below. For each shape and both
 * modes: median and p99 of the decision time, and how many pods it evicts.
 * Asserts nothing.
 *
 *   bench_queue_reclaim [NODES] [REPEATS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kgpu/queue.h"
#include "kgpu/rng.h"
#include "bench_util.h"

static kgpu_request request(const kgpu_cluster *c, int count, int milli)
{
    kgpu_request r = {.cpu_milli = 4000 * count,
                      .memory_mib = 16384,
                      .gpu_count = count,
                      .gpu_milli = milli,
                      .exclusive = milli == 1000,
                      .shape = -1};
    kgpu_request_compile(c, &r, NULL);
    return r;
}

int main(int argc, char **argv)
{
    int nodes = argc > 1 ? atoi(argv[1]) : 1213;
    int repeats = argc > 2 ? atoi(argv[2]) : 21;
    if (nodes < 1 || repeats < 1) {
        fprintf(stderr, "usage: bench_queue_reclaim [NODES] [REPEATS]\n");
        return 2;
    }
    kgpu_cluster *c = kgpu_cluster_new();
    for (int n = 0; n < nodes; n++) {
        kgpu_gpu_spec g[8];
        for (int i = 0; i < 8; i++)
            g[i] = (kgpu_gpu_spec){
                .index = i, .model = "V100M32", .memory_mib = 32768, .numa = -1, .healthy = true};
        char name[32];
        snprintf(name, sizeof(name), "node-%05d", n);
        kgpu_node_spec s = {
            .name = name, .cpu_milli = 96000, .memory_mib = 786432, .gpus = g, .ngpus = 8};
        kgpu_cluster_add_node(c, &s, NULL);
    }
    int64_t cap = (int64_t)nodes * 8 * 1000;
    kgpu_queue_spec qs_spec[] = {
        {.name = "a", .guarantee = {cap / 2, KGPU_QUEUE_UNSET}, .limit = {-1, -1}},
        {.name = "b", .guarantee = {cap / 10, KGPU_QUEUE_UNSET}, .limit = {-1, -1}},
    };
    kgpu_queues *qs;
    kgpu_error err;
    if (kgpu_queues_new(qs_spec, 2, &qs, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int qb = kgpu_queues_find(qs, "b");
    /* Fill: shares of 250..750 and whole GPUs, first fit on a random node, to 97 %. */
    size_t maxpods = (size_t)nodes * 32;
    kgpu_qpod *running = calloc(maxpods, sizeof(*running));
    size_t *victims = malloc(maxpods * sizeof(*victims));
    size_t n = 0;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 42, 1);
    static const int milli_mix[] = {250, 500, 750, 1000, 1000};
    int64_t used = 0;
    for (long tries = 0; used < cap * 97 / 100 && tries < (long)maxpods * 4 && n < maxpods;
         tries++) {
        int milli = milli_mix[kgpu_rng_below(&rng, 5)];
        kgpu_request r = request(c, 1, milli);
        int node = (int)kgpu_rng_below(&rng, (uint64_t)nodes);
        const kgpu_node *nd = kgpu_cluster_node(c, node);
        int gpu = -1;
        for (int g = 0; g < nd->ngpus && gpu < 0; g++)
            if (kgpu_gpu_usable(nd, &nd->gpus[g], &r))
                gpu = g;
        if (gpu < 0 || !kgpu_fit(c, node, &r, NULL, 0))
            continue;
        kgpu_qpod *p = &running[n];
        if (kgpu_cluster_apply(c, &r, node, &gpu, &p->a, NULL) != 0)
            continue;
        p->queue = qb;
        p->priority = (int)kgpu_rng_below(&rng, 3);
        p->admitted = (int64_t)n;
        kgpu_qdemand_of_assignment(c, &p->a, &p->d);
        if (kgpu_queues_charge(qs, qb, &p->d, NULL) != 0) {
            kgpu_cluster_release(c, &p->a, NULL);
            continue;
        }
        used += p->d.milli;
        n++;
    }
    /* Then every GPU's remainder as one share: nothing a pod of a needs is free. */
    for (int node = 0; node < nodes; node++)
        for (int g = 0; g < 8 && n < maxpods; g++) {
            int left = kgpu_cluster_node(c, node)->gpus[g].free_milli;
            if (left <= 0)
                continue;
            kgpu_request r = request(c, 1, left);
            r.cpu_milli = 0;
            r.memory_mib = 0;
            kgpu_qpod *p = &running[n];
            if (kgpu_cluster_apply(c, &r, node, &g, &p->a, NULL) != 0)
                continue;
            p->queue = qb;
            p->priority = (int)kgpu_rng_below(&rng, 3);
            p->admitted = (int64_t)n;
            kgpu_qdemand_of_assignment(c, &p->a, &p->d);
            if (kgpu_queues_charge(qs, qb, &p->d, NULL) != 0) {
                kgpu_cluster_release(c, &p->a, NULL);
                continue;
            }
            used += p->d.milli;
            n++;
        }
    printf("cluster: %d nodes, %d GPUs, %zu pods of queue b holding %.1f %% of the GPU compute\n",
           nodes, nodes * 8, n, 100.0 * (double)used / (double)cap);
    printf("%-22s %-13s %10s %10s %9s %12s\n", "waiting pod of a", "mode", "median us", "p99 us",
           "victims", "freed GPUs");
    static const struct {
        const char *name;
        int count, milli;
    } shapes[] = {
        {"0.5 GPU", 1, 500}, {"1 GPU", 1, 1000}, {"4 GPUs", 4, 1000}, {"8 GPUs", 8, 1000}};
    int qa = kgpu_queues_find(qs, "a");
    double *t = malloc((size_t)repeats * sizeof(*t));
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        kgpu_request r = request(c, shapes[s].count, shapes[s].milli);
        for (int mode = KGPU_RECLAIM_PRIORITY_AGE; mode <= KGPU_RECLAIM_FRAG; mode++) {
            kgpu_reclaim rec = {.victims = victims};
            int rc = 0;
            for (int i = 0; i < repeats; i++) {
                double t0 = bench_now_s();
                rc = kgpu_queues_reclaim(c, qs, running, n, qa, &r, (kgpu_reclaim_mode)mode, NULL,
                                         &rec, &err);
                t[i] = (bench_now_s() - t0) * 1e6;
            }
            qsort(t, (size_t)repeats, sizeof(*t), bench_cmp_double);
            printf("%-22s %-13s %10.0f %10.0f %9zu %12.2f%s\n", shapes[s].name,
                   mode == KGPU_RECLAIM_FRAG ? "frag" : "priority-age", t[repeats / 2],
                   t[(int)(0.99 * (repeats - 1))], rc == 0 ? rec.nvictims : 0,
                   rc == 0 ? (double)rec.freed_milli / 1000 : 0.0, rc == 0 ? "" : " (no room)");
        }
    }
    free(t);
    free(victims);
    free(running);
    kgpu_queues_free(qs);
    kgpu_cluster_free(c);
    return 0;
}
