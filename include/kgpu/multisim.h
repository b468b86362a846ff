/*
 * Many clusters in the FGD study's method: the trace's nodes split into
 * clusters, the same arrival sequence dispatched among them by one of
 * several dispatchers, each pod then placed within its cluster by the
 * policy, once, or failed (docs/multicluster.md "Measured").
 *
 *   ONE          every node as one cluster: the baseline.
 *   KGPU         kgpu-dispatcher's rule: each cluster's estimate for the pod
 *                (does it fit, the fragmentation its first copy adds, its
 *                price), ranked by kgpu_dispatch_rank; the best places it.
 *   ALL_AT_ONCE  MultiKueue's default: a copy to every cluster; the first
 *                whose Kueue has quota left admits it (a uniform draw among
 *                them: which answers first is a race). Quota is a cluster's
 *                GPU capacity (or each model's, quota_per_model), admission
 *                is blind to fit: a pod admitted where it does not fit
 *                waits there for good (stuck), holding the quota.
 *   INCREMENTAL  MultiKueue's incremental dispatcher: the same among the
 *                first three clusters by name, then the next three, ...
 *   STATIC       the users' static table: each pod class (its GPU model
 *                constraint when it has one, else whole GPUs by count or a
 *                share) goes to one GPU model, the one with the most GPUs
 *                that can run it, in the cluster holding most of that model.
 */
#ifndef KGPU_MULTISIM_H
#define KGPU_MULTISIM_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_MULTISIM_CLUSTERS 16

typedef enum kgpu_dispatcher {
    KGPU_DISPATCH_ONE = 0,
    KGPU_DISPATCH_KGPU,
    KGPU_DISPATCH_ALL_AT_ONCE,
    KGPU_DISPATCH_INCREMENTAL,
    KGPU_DISPATCH_STATIC,
    /*
     * KGPU with each cluster its own kgpu, as deployed: its own cluster
     * object, policy and learnt workload (only the pods sent to it), and
     * the estimate by kgpu_estimate_shape, so the policies' scores are
     * ranked across clusters as kgpu-dispatcher ranks them.
     */
    KGPU_DISPATCH_KGPU_SEPARATE,
    KGPU_DISPATCH_COUNT
} kgpu_dispatcher;

/* "one", "kgpu", "all-at-once", "incremental", "static", "kgpu-separate". */
const char *kgpu_dispatcher_name(kgpu_dispatcher d);
/* The dispatcher of that name, or -1. */
int kgpu_dispatcher_find(const char *name);

typedef struct kgpu_multisim_split {
    int nclusters;                               /* 1..KGPU_MULTISIM_CLUSTERS */
    char names[KGPU_MULTISIM_CLUSTERS][64];      /* sorted by name (incremental's order) */
    const int *cluster_of;                       /* per node of the input's cluster; -1: none */
} kgpu_multisim_split;

typedef struct kgpu_multisim_config {
    kgpu_dispatcher dispatcher;
    const char *policy; /* placement within a cluster (and the kgpu estimate's) */
    uint64_t seed;
    double inflate;
    /* Price per GPU-hour per model id of the input's cluster (on-demand); NULL: no cost. */
    const double *price;
    /*
     * MultiKueue's Kueues (ALL_AT_ONCE, INCREMENTAL): false, one flavor per
     * cluster covering every GPU model (what a pod pinned by kgpu's
     * kgpu.io/gpu-type annotation, which Kueue does not read, meets); true,
     * a flavor per GPU model (ResourceFlavors with node labels, for pods
     * pinned by node affinity): a pod is admitted only against the quota of
     * a model it allows, the first with room, and then runs on that model.
     */
    bool quota_per_model;
} kgpu_multisim_config;

typedef struct kgpu_multisim_result {
    double alloc_pct_100;   /* allocation % of every cluster's GPUs when arrival reached 100 % */
    double alloc_pct_final; /* ... after the last arrival */
    long pods, pods_failed, gpu_pods_failed;
    long stuck;             /* admitted by quota where they did not fit (MultiKueue's) */
    double cost_per_hour;   /* GPUs held at the end x their model's price */
    double allocated_gpus;  /* GPU compute held at the end, in GPUs */
    long per_cluster[KGPU_MULTISIM_CLUSTERS]; /* pods placed in each */
} kgpu_multisim_result;

/*
 * One run: the arrival sequence of (in, seed, inflate) that kgpu_sim_run
 * replays, dispatched by cfg->dispatcher among split's clusters. Nodes with
 * cluster_of -1 take no pod (and their GPUs count in no capacity).
 * Deterministic for its inputs; thread-safe on a shared input.
 */
int kgpu_multisim_run(const kgpu_sim_input *in, const kgpu_multisim_split *split,
                      const kgpu_multisim_config *cfg, kgpu_multisim_result *out,
                      kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
