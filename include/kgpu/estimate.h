/*
 * What a cluster could take, and where a workload runs best among clusters.
 *
 * kgpu_estimate answers, for one pod shape, how many copies of it the
 * cluster's kgpu placement would fit now, placed one after another by the
 * policy exactly as kgpu-extender would place them, on which GPU models, and
 * how much fragmentation the first copy and all of them leave. Copies of
 * other shapes may be placed first ("reserved"): the dispatches still in
 * flight to that cluster, so a burst does not count the same room twice.
 * The cluster is left exactly as it was.
 *
 * kgpu_dispatch_rank orders clusters for one workload from their estimates:
 * never one that cannot place it; then the workload's GPU model preference,
 * then measured throughput per cost, then the placement policy's own score
 * of the best place (fragmentation avoided, for kgpu's), then the
 * fragmentation added, then the price, then the most room. One rule, used
 * by kgpu-dispatcher (MultiKueue's external dispatcher) and by the
 * many-cluster simulation that measures it.
 */
#ifndef KGPU_ESTIMATE_H
#define KGPU_ESTIMATE_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/model.h"
#include "kgpu/policy.h"
#include "kgpu/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_ESTIMATE_MAX     1024 /* copies counted per shape at most */
#define KGPU_ESTIMATE_RESERVE 256  /* reserved shapes per estimate at most */

/* One shape and how many copies of it. */
typedef struct kgpu_shape_count {
    const kgpu_request *req; /* compiled against the cluster */
    int count;
} kgpu_shape_count;

typedef struct kgpu_estimate {
    int fit;                          /* copies that fit now, one after another (<= max) */
    int first_node;                   /* where the first copy goes; -1 when none fits */
    int first_model;                  /* its GPU model id; -1 when none fits */
    int by_model[KGPU_MAX_MODELS];    /* copies placed per GPU model id */
    double frag_before;               /* cluster fragmentation (milli-GPU) against w, now */
    double frag_first;                /* ... after the first copy (= before when none fits) */
    double frag_after;                /* ... after all `fit` copies */
    int64_t score;                    /* the policy's score of the first copy's place */
    double idle_milli;                /* GPU compute free now on healthy GPUs (after reserves) */
    int reserved;                     /* reserved copies that found room */
    int reserved_missed;              /* reserved copies that did not */
} kgpu_estimate;

/*
 * Places reserve[0..nreserve) (each `count` copies, in order; a copy that
 * finds no room is counted in reserved_missed and skipped), then copies of
 * req one after another until `max` (1..KGPU_ESTIMATE_MAX) or no room,
 * every copy where policy p (made for c) selects, over every node. w is
 * the workload fragmentation is measured against (the policy's target).
 * Then releases everything: c is left as it was. 0 with *out filled;
 * KGPU_EINVAL for a bad max or too many reserves; KGPU_ENOMEM.
 */
int kgpu_estimate_shape(kgpu_cluster *c, kgpu_policy *p, const kgpu_workload *w,
                        const kgpu_shape_count *reserve, int nreserve, const kgpu_request *req,
                        int max, kgpu_rng *rng, kgpu_estimate *out, kgpu_error *err);

/*
 * Copies of req that one empty node made from `tmpl` would hold, at most
 * max (1..KGPU_ESTIMATE_MAX): what one more node of a node group adds,
 * also a group scaled to zero. req need not be compiled (its model globs
 * are matched against tmpl's GPUs here). Returns the count (0 when req
 * cannot run there at all) or a negative error.
 */
int kgpu_estimate_empty_node(const kgpu_node_spec *tmpl, const kgpu_request *req, int max,
                             kgpu_error *err);

/* A cluster as the dispatcher sees it for one workload. */
typedef struct kgpu_dispatch_candidate {
    const char *name;     /* the cluster's name (MultiKueueCluster) */
    bool reachable;       /* its estimate was answered */
    int fit;              /* copies of the workload's pod that fit now (in-flight reserved) */
    int grow;             /* copies its node groups could add */
    int pref;             /* rank of the GPU model it would land on in the workload's
                             preference list: 0 best; -1 the workload has none or the
                             model is not in it (after every listed one) */
    double perf_per_cost; /* measured throughput per price unit on that model; 0 unknown */
    bool scored;          /* score is known */
    double score;         /* the policy's score of the first copy's place (higher better) */
    double frag_added;    /* fragmentation the first copy adds (milli-GPU) */
    double price;         /* price per hour of the GPUs the first copy takes; 0 unknown */
} kgpu_dispatch_candidate;

/*
 * Orders cand[0..n) for a workload of `need` pods: order[0..k) receives the
 * indices of the k clusters that can place it, best first; returns k (0:
 * none can, nominate nothing). A cluster can place it when it is reachable
 * and fit >= need, or (when no cluster has fit >= need) fit + grow >= need.
 * Then, in order: pref (0, 1, ... then -1), perf_per_cost (higher first;
 * unknown after known, and compared only when both are known), the
 * placement policy's score of its best place (higher; compared only when
 * both are scored: what the policy would choose among the clusters' nodes
 * were they one cluster), frag_added (lower), price (lower; unknown after
 * known), fit (higher), name.
 */
int kgpu_dispatch_rank(const kgpu_dispatch_candidate *cand, int n, int need, int *order);

#ifdef __cplusplus
}
#endif

#endif
