/*
 * Internals shared by the files of the scheduling core (not installed).
 * Double-underscore names are private to libkgpu. The sections follow the
 * core's layers in src/layers.conf, bottom first, each naming the file that
 * offers it: a file uses only the sections of its own layer and below.
 */
#ifndef KGPU_CORE_INTERNAL_H
#define KGPU_CORE_INTERNAL_H

#include <stdint.h>

#include "kgpu/churn.h"
#include "kgpu/consolidate.h"
#include "kgpu/model.h"
#include "kgpu/policy.h"
#include "kgpu/queue.h"

/* ---- sharepack.c (layer base): how well a run packed its shares ---- */

/*
 * GPU shares as a histogram h[1..KGPU_MILLI-1] of items by milli: a lower
 * bound on the GPUs that any packing of them needs (nodes, CPU and models
 * ignored), and the GPUs best-fit decreasing packs them into (sharepack.c).
 */
long kgpu__share_lower_bound(const long *h);
long kgpu__share_bfd(const long *h);

/* ---- depheap.c (layer base): the simulators' departures, earliest first ---- */

/* A running pod's end: when, which pod (the caller's index), and which of its runs. */
typedef struct kgpu__departure {
    double t;
    size_t pod;
    uint32_t gen; /* the pod's run it ends: a departure of an earlier run is stale */
} kgpu__departure;

/* A min-heap of departures by time, ties by pod index; zero-initialised is empty. */
typedef struct kgpu__dep_heap {
    kgpu__departure *v;
    size_t n, cap;
} kgpu__dep_heap;

/* Adds d; false when out of memory (the heap is unchanged). */
bool kgpu__dep_push(kgpu__dep_heap *h, kgpu__departure d);
/* Removes and returns the earliest; h->n must be > 0. */
kgpu__departure kgpu__dep_pop(kgpu__dep_heap *h);

/* ---- node.c (layer node): one node and one request ---- */

/* The fit check without the reason text: the hot path of every policy. */
bool kgpu__fit(const kgpu_node *n, const kgpu_request *req);

/*
 * kgpu_gpu_usable for a request that is not exclusive, without branches: the
 * policies' loops over a node's GPUs, where which GPUs qualify follows no
 * pattern a branch predictor could learn.
 */
static inline bool kgpu__share_usable(const kgpu_gpu *g, const kgpu_request *req)
{
    return (int)g->healthy & (int)((req->models >> g->model) & 1) &
           (g->free_milli >= req->gpu_milli) & (g->free_memory_mib >= req->gpu_memory_mib);
}

/* Number of GPUs of n usable by req right now. */
int kgpu__usable_gpus(const kgpu_node *n, const kgpu_request *req);

/* Total free milli over the node's healthy GPUs. */
int kgpu__node_free_milli(const kgpu_node *n);

/* Demand of a request in milli-GPU (whole GPUs count 1000 each). */
static inline int64_t kgpu__gpu_demand(const kgpu_request *req)
{
    if (req->gpu_count <= 0)
        return 0;
    return (int64_t)req->gpu_count * (req->exclusive ? KGPU_MILLI : req->gpu_milli);
}

/*
 * Taking a request from a node and giving it back (node.c), for the cluster's
 * apply/release and the placement search's scratch node. _check_gpus: that
 * `gpus` names req->gpu_count distinct GPUs of n that can each hold req (0,
 * or KGPU_EINVAL/KGPU_ENOFIT with err filled). _take: takes req from n on
 * those GPUs (already checked), bumps n's version and describes the
 * placement in *a (node index `node`). _check_release: that giving a back to
 * n stays within its capacity (0 or KGPU_ESTATE). _give: undoes a _take
 * exactly (already checked).
 */
int kgpu__node_check_gpus(const kgpu_node *n, const kgpu_request *req, const int *gpus,
                          kgpu_error *err);
void kgpu__node_take(kgpu_node *n, int node, const kgpu_request *req, const int *gpus,
                     kgpu_assignment *a);
int kgpu__node_check_release(const kgpu_node *n, const kgpu_assignment *a, kgpu_error *err);
void kgpu__node_give(kgpu_node *n, const kgpu_assignment *a);

/* ---- pick.c (layer pick): choosing GPUs on one node ---- */

/*
 * GPU choice shared by the placement search and several policies: tightest
 * fit (least free that suffices, lowest index); whole GPUs the first
 * untouched; several GPUs within one NUMA node when one can serve them.
 */
int kgpu__pick_best_fit(const kgpu_node *n, const kgpu_request *req, int *gpus);

/* The opposite: the emptiest GPUs that suffice (same NUMA rule). */
int kgpu__pick_loosest(const kgpu_node *n, const kgpu_request *req, int *gpus);

/*
 * The GPUs a one-GPU share could take on n, one of each kind: the usable
 * GPUs, the first of each (free compute, model), which score alike for the
 * fragmentation policies. Into cand in index order; returns how many.
 */
int kgpu__share_candidates(const kgpu_node *n, const kgpu_request *req, int *cand);

/* GPU choice: uniformly random among usable GPUs. */
int kgpu__pick_random(const kgpu_node *n, const kgpu_request *req, kgpu_rng *rng, int *gpus);

/* ---- model.c (layer cluster): the cluster ---- */

/*
 * The cluster's change journal: kgpu__cluster_seq counts the changes made
 * to its nodes (apply, release, health); kgpu__cluster_changed(c, k) is the
 * node change number k (1..seq) touched, or -1 once the last KGPU__JOURNAL
 * changes no longer include it (the caller must then look at every node).
 * Adding a node is not a change here: it changes the node count.
 */
#define KGPU__JOURNAL 65536
uint64_t kgpu__cluster_seq(const kgpu_cluster *c);
int kgpu__cluster_changed(const kgpu_cluster *c, uint64_t k);

/* Mutable node access for the core (policies never mutate; apply/release do). */
kgpu_node *kgpu__cluster_node_mut(kgpu_cluster *c, int i);

/*
 * Why req does not fit n, a node of c that it does not fit, into why (whylen
 * > 0): the most fundamental reason first, as kgpu_fit words it.
 */
void kgpu__fit_reason(const kgpu_cluster *c, const kgpu_node *n, const kgpu_request *req,
                      char *why, size_t whylen);

/* ---- frag.c (layer measure): fragmentation and the target workload ---- */

/* The workload shape of a request (whole GPUs as 1000 milli each; CPU-only: no GPU, any model). */
kgpu_shape kgpu__shape_of(const kgpu_request *r);

/*
 * A workload from weighted shapes (weight in .p, distinct keys): heaviest
 * first until `coverage` of the total weight is covered, renormalised.
 * Sorts `groups` in place. Fills *out (empty when no weight); 0 or KGPU_ENOMEM.
 */
int kgpu__workload_from_weights(kgpu_shape *groups, size_t ng, double coverage, kgpu_workload *out);

/*
 * kgpu_node_frag by parts, for policies that try several placements on one
 * node: the node as it is, per shape of the workload (free milli the shape
 * cannot use, GPUs it can), from which the measure after taking from a few
 * GPUs follows in O(shapes) per placement instead of O(shapes x GPUs). The
 * figures are kgpu_node_frag's, bit for bit: the same integers, and the same
 * products summed in the same order.
 *
 * The workload's shapes are read once into a table of per-shape columns, so
 * that the integer work runs over several shapes at a time in vector code;
 * only the floating-point sum, whose order fixes its rounding, goes shape by
 * shape. The table also holds the scratch of the node being evaluated: one
 * node at a time per table.
 */
typedef struct kgpu__frag_table {
    const kgpu_workload *w;   /* borrowed */
    const kgpu_shape *shapes; /* w->shapes when loaded: a rebuilt workload has new ones */
    int n;                    /* shapes considered: the first n of w */
    bool cpu_int;             /* every shape's CPU fits an int: the vector path may run */
    int *gm, *count, *cpu;    /* per shape: GPU milli, GPUs, CPU milli (when cpu_int) */
    int *ok, *lost, *usable;  /* per shape, of the node: model allowed (-1/0), and as above */
    int ok_model;             /* the model ok holds (of the last node of one model); -1 none */
    int *counted;             /* per shape, of a placement: the milli it counts as lost */
} kgpu__frag_table;

/* Ints of storage a table of n shapes needs. */
#define KGPU__FRAG_TABLE_INTS(n) (7 * (size_t)(n))

/*
 * Reads the first n shapes of w into t, in `ints` (KGPU__FRAG_TABLE_INTS(n),
 * borrowed by t). Again whenever the workload changes.
 */
void kgpu__frag_table_load(kgpu__frag_table *t, const kgpu_workload *w, int n, int *ints);

/* Whether t still holds the first n shapes of w (by address: see kgpu__frag_table.shapes). */
static inline bool kgpu__frag_table_fresh(const kgpu__frag_table *t, const kgpu_workload *w, int n)
{
    return t->w == w && t->shapes == w->shapes && t->n == n;
}

typedef struct kgpu__frag_node {
    kgpu__frag_table *t; /* whose scratch holds the per-shape figures */
    int total;           /* free milli on healthy GPUs */
    int ngpus;
    bool one_model;
    int fm[KGPU_MAX_GPUS_PER_NODE];    /* free milli, 0 on an unhealthy GPU */
    int model[KGPU_MAX_GPUS_PER_NODE]; /* model id of each GPU */
} kgpu__frag_node;

/* Fills *b for node n against the shapes of t (into t's scratch: valid until the next call). */
void kgpu__frag_node_of(const kgpu_node *n, kgpu__frag_table *t, kgpu__frag_node *b);

/*
 * The per-shape figures of b (from kgpu__frag_node_of, still in its table's
 * scratch) into saved[0 .. 2 x t->n), as int16: true, or false (nothing
 * saved) when the node's free milli passes INT16_MAX (its lost figures
 * could; never with KGPU_MILLI a GPU). kgpu__frag_node_restore fills *b and
 * the scratch again from them, for the node in the same state and the same
 * table: what kgpu__frag_node_of would, without its O(shapes x GPUs).
 */
#define KGPU__FRAG_SAVED_INTS(n) (2 * (size_t)(n))
bool kgpu__frag_node_save(const kgpu__frag_node *b, int16_t *saved);
void kgpu__frag_node_restore(const kgpu_node *n, kgpu__frag_table *t, kgpu__frag_node *b,
                             const int16_t *saved);

/*
 * Fragmentation of the node of b after taking take[k] milli from GPU gpus[k]
 * (k < nchg; usable, hence healthy, GPUs) with cpu_after CPU left (taken as
 * is, unlike kgpu_node_frag's negative): kgpu_node_frag of the changed node
 * over the table's shapes. *total_after (may be NULL) gets the free milli left.
 */
double kgpu__frag_after(const kgpu__frag_node *b, const int *gpus, const int *take, int nchg,
                        int64_t cpu_after, int *total_after);

/* ---- policy_common.c (layer shared): what every policy shares ---- */

/* kgpu__pick_best_fit in the shape of kgpu_policy_ops.pick_gpus, for policies that use it as is. */
int kgpu__pick_gpus_best_fit(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                             kgpu_rng *rng, int *gpus);

/* A policy's score that also names the GPU it would take for the request (-1: none). */
typedef int64_t (*kgpu__scored_fn)(void *state, const kgpu_cluster *c, int node,
                                   const kgpu_request *req, int *gpu_out);

/*
 * pick_gpus of a policy whose score chooses the GPU of a one-GPU share (FGD,
 * kgpu): that GPU, from the policy's cache, or KGPU_ENOFIT when there is none;
 * best fit for whole GPUs and several GPUs.
 */
int kgpu__pick_scored(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                      kgpu__scored_fn scored, int *gpus);

/*
 * Per-node score caches of the fragmentation policies (FGD, kgpu): grow
 * *nodes (node_size bytes each) and *cache (slots x slot_size bytes per node)
 * to at least `need` nodes, doubling from 64; the new part is zeroed. *cap is
 * raised only on success. 0 or KGPU_ENOMEM (either array may have moved).
 */
int kgpu__grow_node_cache(void **nodes, size_t node_size, void **cache, size_t slot_size, int slots,
                          int *cap, int need);

/*
 * Drops every entry of those caches by starting a new generation in *gen:
 * entries carry the generation they were filled in, so this is O(1) instead
 * of clearing megabytes in the arrival that rebuilt the workload (which also
 * evicted the cluster from the CPU caches just before the rescan that
 * follows). Past `max` (the widest stamp the entries hold) the counter wraps
 * to 1 and the arrays (node_bytes and cache_bytes long) are cleared; 0 is
 * never a valid generation, so zeroed entries are empty.
 */
void kgpu__cache_new_generation(uint32_t *gen, uint32_t max, void *nodes, size_t node_bytes,
                                void *cache, size_t cache_bytes);

/* ---- policy_index.c (layer index): selection over a whole cluster ---- */

/*
 * The index of kgpu_policy_select over a whole cluster (policy_index.c).
 * One per policy; _reset drops everything it holds, _bump marks every score
 * it holds as stale (the policy changed its mind about every node).
 * kgpu__index_select answers as the scan of every node would, drawing the
 * same numbers from rng: 0 with *node_out, KGPU_ENOFIT when no node fits,
 * or 1 when it cannot answer exactly (nothing drawn): the caller scans.
 */
typedef struct kgpu__index kgpu__index;
kgpu__index *kgpu__index_new(void);
void kgpu__index_free(kgpu__index *ix);
void kgpu__index_reset(kgpu__index *ix);
void kgpu__index_bump(kgpu__index *ix);
int kgpu__index_select(kgpu__index *ix, const kgpu_policy_ops *ops, void *state,
                       const kgpu_cluster *c, const kgpu_request *req, const kgpu_request *fit,
                       const uint32_t *rank, int nrank, kgpu_rng *rng, int *node_out);

/* ---- policy.c (layer registry): the registry and selection ---- */

/*
 * The extender's 0-10 scores from raw policy scores (INT64_MIN: the node does
 * not fit, 0). Linear: min-max scaled and rounded. Ranked: the best distinct
 * raw score 10, the next 9, ... the tenth 1, equal raw scores equal, the rest 0.
 */
void kgpu__zero_to_ten(const int64_t *raw, int n, bool ranked, int *scores);

/* ---- run.c (layer run): what both simulators start a run from ---- */

/*
 * The FGD study's volume, shared by kgpu_sim_run and kgpu_churn_run: indices
 * into reqs[0..n), the file's order first. inflate 0: the pods as given.
 * Otherwise random pods dropped (seeded) while GPU demand is over inflate x
 * capacity_milli, or pods drawn with replacement until the next would pass
 * it. The caller orders the result. Caller frees *order; 0, KGPU_ENOMEM, or
 * KGPU_ERANGE when the workload grows past its bound first.
 */
int kgpu__workload_draw(const kgpu_request *reqs, size_t n, int64_t capacity_milli, double inflate,
                        kgpu_rng *rng, size_t **order, size_t *len, kgpu_error *err);

/*
 * The timed simulators' arrivals (kgpu_churn_run, kgpu_autoscale_run): the
 * volume above for inflate (0: the file's pods as recorded), in time order;
 * equal times keep the file's order, a drawn copy after its original, at the
 * same time and as long-lived. Caller frees *slots.
 */
int kgpu__arrivals(const kgpu_churn_input *in, double inflate, kgpu_rng *rng, size_t **slots,
                   size_t *len, kgpu_error *err);
/* qsort's order of doubles, and the nearest-rank quantile q of sorted v[0..n) (0 when empty). */
int kgpu__cmp_double(const void *x, const void *y);
double kgpu__quantile(const double *v, size_t n, double q);

/*
 * A run's policy, shared by kgpu_sim_run and kgpu_churn_run: online when asked
 * or when the policy is online_only (*online_out), with a fresh learner's
 * target (*learner), else `fixed`. On failure *p or *learner may still be set:
 * the caller frees both. 0 or the error's code.
 */
int kgpu__policy_open(const char *policy, bool online, const kgpu_cluster *c,
                      const kgpu_workload *fixed, kgpu_policy **p, kgpu_learner **learner,
                      bool *online_out, kgpu_error *err);

/* An arrival seen by the run's learner (NULL: offline) and then by p. 0 or KGPU_ENOMEM. */
int kgpu__policy_learn(kgpu_policy *p, kgpu_learner *learner, const kgpu_cluster *c,
                       const kgpu_request *req, kgpu_error *err);

/* ---- queue_ns.c (layer queuens): which namespaces a queue admits ---- */

/*
 * The namespace rules of a tree's queues (kgpu_queue_spec.namespaces and
 * .selector), by queue id; immutable once made, shared by a tree's clones.
 */
typedef struct kgpu__qns kgpu__qns;

/*
 * Copies the rules of specs[0..n) (queue i: id i), checking them: names of
 * namespaces, keys, operators and values, within the KGPU_QUEUE_MAX_* counts.
 * *out NULL (and 0) when no queue has a rule. Errors name the queue.
 */
int kgpu__qns_new(const kgpu_queue_spec *specs, int n, kgpu__qns **out, kgpu_error *err);
/* Another holder of r (r may be NULL); each holder calls kgpu__qns_free. */
kgpu__qns *kgpu__qns_ref(kgpu__qns *r);
void kgpu__qns_free(kgpu__qns *r);
/* Whether queue q's rules admit namespace ns (false for no rules). */
bool kgpu__qns_admits(const kgpu__qns *r, int q, const kgpu_queue_ns *ns);

/* ---- consolidate.c (layer consolidate): making room by moving restartable pods ---- */

#define KGPU__MAX_MOVES KGPU_MAX_MOVES /* pods one consolidation may move */

/* A placed pod as the planner tracks it. */
typedef struct kgpu__pod {
    const kgpu_request *req; /* borrowed */
    kgpu_assignment a;       /* where it is now */
    bool movable;            /* restartable: may be moved to make room */
    int moves;               /* times it was moved */
    size_t tag;              /* the caller's name for it */
} kgpu__pod;

typedef struct kgpu__pods_node {
    int *ids; /* pods on the node, in placement order */
    int n, cap;
} kgpu__pods_node;

/*
 * The placed pods of one cluster, by node, for moves; ids are indices into
 * pod[] in the order they were added. Owned by the thread that owns the
 * cluster. The per-shape arrays are the planner's memory (consolidate.c).
 */
typedef struct kgpu__pods {
    kgpu__pod *pod;
    size_t n, cap;
    kgpu__pods_node *on; /* per node */
    int nnodes;
    int nshapes;
    int *fit_first, *fit_second; /* per shape: first two nodes it fits, at fit_seq */
    uint64_t *fit_seq;
    uint64_t *failed_seq; /* per shape: cluster change when a search last found nothing */
    int *failed_max;      /* ... and with how many moves allowed */
    uint64_t room_seq;    /* cluster change when room was last freed */
} kgpu__pods;

int kgpu__pods_init(kgpu__pods *t, int nnodes);
void kgpu__pods_free(kgpu__pods *t);
/* Records a placement (a->node) as pod *id (may be NULL). 0 or KGPU_ENOMEM. */
int kgpu__pods_add(kgpu__pods *t, const kgpu_request *req, const kgpu_assignment *a, bool movable,
                   size_t tag, int *id);
/* Pod id left (the caller released it from c first): its room is free for searches again. */
void kgpu__pods_remove(kgpu__pods *t, const kgpu_cluster *c, int id);

/*
 * Places req, which fits no node as the cluster stands, by moving at most
 * max_moves (<= KGPU__MAX_MOVES) movable pods of one node elsewhere (to
 * another node, or to other GPUs of the same one): the
 * fewest moves, then the least GPU compute moved. The policy picks req's
 * GPUs on that node and every moved pod's new place; `hosts` (per node,
 * NULL: any) are the nodes req may take. On 0, req is applied
 * (*placed; the caller records it) and the *nmoved pods moved[] (ids, room
 * for KGPU__MAX_MOVES) are in their new places (t->pod[id].a); KGPU_ENOFIT
 * when no such move exists (the cluster is unchanged); other errors are
 * bugs or out of memory.
 */
int kgpu__consolidate(kgpu__pods *t, kgpu_cluster *c, kgpu_policy *p, const kgpu_request *req,
                      int max_moves, const bool *hosts, kgpu_rng *rng, kgpu_assignment *placed,
                      int *moved, int *nmoved, kgpu_error *err);

#endif
