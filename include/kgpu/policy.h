/*
 * Placement policies and the fragmentation measure of the FGD study.
 *
 * One interface (kgpu_policy_ops) serves every policy: score a node that is
 * known to fit, choose the GPUs on the chosen node. The selection loop,
 * tie-breaking and the extender's 0-10 scores are written once, here, for all
 * of them. Adding a policy: one file in src/core/ plus a line in policy.c.
 */
#ifndef KGPU_POLICY_H
#define KGPU_POLICY_H

#include <stdint.h>

#include "kgpu/model.h"
#include "kgpu/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One shape of the target workload: per-GPU milli, GPU count, CPU, allowed models, probability. */
typedef struct kgpu_shape {
    int64_t cpu_milli;
    int gpu_milli; /* per GPU; 0 for CPU-only */
    int gpu_count;
    uint64_t models; /* allowed model ids */
    double p;
} kgpu_shape;

/* The workload a fragmentation measure is taken against. Owns `shapes`. */
typedef struct kgpu_workload {
    kgpu_shape *shapes;
    int n;
} kgpu_workload;

/*
 * Builds the target workload of the FGD study from `reqs` (compiled against
 * the cluster): shapes by decreasing frequency until `coverage` (0.95 in the
 * study) of the requests are covered, renormalised. Fills *out (free with
 * kgpu_workload_free).
 */
int kgpu_workload_build(const kgpu_request *reqs, size_t n, double coverage, kgpu_workload *out,
                        kgpu_error *err);
void kgpu_workload_free(kgpu_workload *w);

/*
 * Fragmentation of one node, in milli-GPU, against workload w: for each shape
 * the free milli the shape could not use there (all of it when the shape is
 * CPU-only or cannot run on the node), weighted by its probability.
 * `free_milli` overrides the node's per-GPU free compute (NULL = current),
 * `cpu_free` overrides its free CPU (< 0 = current).
 */
double kgpu_node_frag(const kgpu_node *n, const kgpu_workload *w, const int *free_milli,
                      int64_t cpu_free);

/* Cluster fragmentation: sum of node fragmentation, and the idle milli it is part of. */
double kgpu_cluster_frag(const kgpu_cluster *c, const kgpu_workload *w, double *idle_milli);

/*
 * Online learning of a target workload from the pods seen so far (never the
 * future): shapes are counted as pods arrive, and the workload (most frequent
 * shapes covering `coverage`, as kgpu_workload_build) is rebuilt each time the
 * count has grown by a tenth. `prior` (copied; NULL = none) is an operator's
 * guess that counts as `prior_pods` pods; without one, a generic mix of whole
 * GPUs and shares stands in until the first pod is seen. Not thread-safe:
 * one owner at a time.
 */
typedef struct kgpu_learner kgpu_learner;

/* The generic mix used before any pod is seen (static storage; *n shapes). */
const kgpu_shape *kgpu_generic_prior(int *n);

kgpu_learner *kgpu_learner_new(double coverage, const kgpu_workload *prior, double prior_pods,
                               kgpu_error *err);
void kgpu_learner_free(kgpu_learner *l);

/*
 * Counts one arrived pod. Returns 1 when the workload was rebuilt (policies
 * borrowing it must be told: kgpu_policy_invalidate), 0 when not, or KGPU_ENOMEM.
 */
int kgpu_learner_observe(kgpu_learner *l, const kgpu_request *req);

/* The current workload, never empty. Borrowed; its address is fixed for the learner's life. */
const kgpu_workload *kgpu_learner_workload(const kgpu_learner *l);

/* Pods observed so far. */
long kgpu_learner_count(const kgpu_learner *l);

typedef struct kgpu_policy_ops {
    const char *name;
    const char *summary;
    size_t state_size;
    /* Optional: set up state (zeroed, state_size bytes). */
    int (*init)(void *state, const kgpu_cluster *c, const kgpu_workload *target, kgpu_error *err);
    /* Optional: release what init allocated. */
    void (*fini)(void *state);
    /*
     * Score of placing req on node (which fits); higher is better. Ties are
     * broken at random. A function of the node's state (all of kgpu_node but
     * its name, labels, version and the names of its GPUs), the request and
     * the policy's own state: kgpu_policy_select's index relies on it.
     */
    int64_t (*score)(void *state, const kgpu_cluster *c, int node, const kgpu_request *req);
    /* Chooses req->gpu_count GPU indices on node into gpus[]; returns 0 or a negative error. */
    int (*pick_gpus)(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                     kgpu_rng *rng, int *gpus);
    /* Ties are always broken uniformly at random, whatever kgpu_policy_set_tie_order says. */
    bool random_ties;
    /* Optional: forget cached results (the target workload changed in place). */
    void (*invalidate)(void *state);
    /* Optional: a pod arrived (called once per pod, before its placement is chosen). */
    void (*observe)(void *state, const kgpu_cluster *c, const kgpu_request *req);
    /*
     * The policy plans only from what it has seen: callers must give it a
     * target learned online (kgpu_learner) or an operator's prior, never the
     * shape mix of a whole trace, and pass each arriving pod to kgpu_policy_observe.
     */
    bool online_only;
    /*
     * kgpu_policy_node_scores ranks instead of scaling: the best node gets 10,
     * the next distinct score 9 and so on (see there). For policies whose raw
     * scores differ by little between good nodes, so that linear scaling would
     * round the best few into one 10 and kube-scheduler would pick among them
     * at random.
     */
    bool rank_scores;
    /*
     * Optional, for the index kgpu_policy_select keeps over the cluster
     * (docs/policy.md, "Deciding at scale"): the group of node n, such that
     * for every request, the node's score plus group_offset(group, req)
     * changes only when the node changes (its version) or the policy is
     * invalidated; -1 when the node's score may change at any time (it is
     * then scored afresh at every decision). A node's group must stay the
     * same while the cluster's node count does. Without `group`, every node
     * is in group 0 with offset 0: the score itself changes only then.
     */
    int (*group)(void *state, const kgpu_node *n);
    int64_t (*group_offset)(void *state, int group, const kgpu_request *req);
} kgpu_policy_ops;

typedef struct kgpu_policy kgpu_policy;

/* The registry: NULL-terminated list, and lookup by name. */
const kgpu_policy_ops *const *kgpu_policy_list(void);
const kgpu_policy_ops *kgpu_policy_find(const char *name);

/*
 * Creates policy `name` for cluster c. `target` is the workload the policy
 * may assume (only fgd uses it; borrowed, must outlive the policy; NULL
 * allowed for the others). NULL on error, with err filled.
 */
kgpu_policy *kgpu_policy_new(const char *name, const kgpu_cluster *c, const kgpu_workload *target,
                             kgpu_error *err);
void kgpu_policy_free(kgpu_policy *p);
const char *kgpu_policy_name(const kgpu_policy *p);

/* Drops any cached scores, e.g. after the target workload was rebuilt in place. */
void kgpu_policy_invalidate(kgpu_policy *p);

/*
 * Tells the policy a pod arrived, once per pod and before kgpu_policy_select
 * for it; policies that learn from arrivals (kgpu) need it, others ignore it.
 */
void kgpu_policy_observe(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req);

/* Whether the policy must be run online (see kgpu_policy_ops.online_only). */
bool kgpu_policy_online_only(const kgpu_policy *p);

/*
 * How ties between equally scored nodes are broken. NULL (the default):
 * uniformly at random, as kube-scheduler does. Otherwise `rank` (borrowed,
 * one entry per node, must outlive its use) is a fixed priority: the tied node
 * with the lowest rank wins. The FGD study's simulator breaks ties in a fixed,
 * per-seed random node order; its figures depend on that.
 */
void kgpu_policy_set_tie_order(kgpu_policy *p, const uint32_t *rank, int n);

/*
 * Whether kgpu_policy_select and kgpu_policy_node_scores require the node's
 * free CPU and memory to cover the request's (the default, as the
 * simulator needs). Off, only GPUs decide whether a node fits, and the
 * request's CPU and memory serve the scores alone: the extender's case,
 * where kube-scheduler is the authority on CPU and memory and the node's
 * free CPU may even be short of the request. Apply such a placement with the
 * CPU clamped to what is free (kgpu_cluster_apply checks it).
 */
void kgpu_policy_set_fit_cpu(kgpu_policy *p, bool check);

/*
 * Whether kgpu_policy_select, asked about every node (nodes NULL), answers
 * from its index (the default): per request shape, each node's fit and score
 * kept and brought up to date only for the nodes changed since it was last
 * asked, and the best of each block of nodes, so that a decision costs about
 * (nodes / 64) instead of one score per node. The choice, the GPUs and the
 * random numbers drawn are the same either way; off, every node is scored
 * at every decision (for tests and measurements that compare the two).
 * The index holds at most about 512 MB; past that the shapes least recently
 * asked about lose theirs. A policy serves one cluster: the index follows
 * its changes through the cluster's own change journal.
 */
void kgpu_policy_set_indexed(kgpu_policy *p, bool on);

/*
 * Chooses where req goes: among `nodes` (n indices; NULL = every node) the
 * fitting node with the highest score, ties broken as set above, and its
 * GPUs. Fills *node_out and gpus (req->gpu_count entries).
 * Returns 0, KGPU_ENOFIT when no node fits, or another negative error.
 */
int kgpu_policy_select(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                       const int *nodes, int n, kgpu_rng *rng, int *node_out, int *gpus,
                       kgpu_error *err);

/*
 * The policy's raw score of placing req on `node`, which must fit (higher
 * is better; kgpu's is in micro-GPU of fragmentation avoided): what
 * kgpu_policy_select compares, for comparing the best nodes of several
 * clusters placed by one policy (kgpu_estimate_shape).
 */
int64_t kgpu_policy_score(kgpu_policy *p, const kgpu_cluster *c, int node,
                          const kgpu_request *req);

/*
 * Places a pod's GPU requests (one per container, nreqs <= KGPU_PLACE_MAX_REQS)
 * on `node` together, and applies them to c, in order, into out[0..nreqs)
 * (release them in reverse order). One request: kgpu_policy_select on that
 * node. Several: the same placement search as kgpu_fit_all decides whether
 * they fit, and each request takes the GPUs the policy chooses for it where,
 * with those taken, the requests after it still fit (kgpu_place_all), else
 * the GPUs of the search's own placement (also once the look-ahead searches
 * together spent KGPU_PLACE_BUDGET steps). So whatever kgpu_fit_all passes,
 * this places, under every policy. CPU and memory as kgpu_policy_select
 * checks them (kgpu_policy_set_fit_cpu); when they are not checked, each
 * request is applied with them clamped to what the node has free.
 * All or nothing: 0, or KGPU_ENOFIT (err says why, as kgpu_fit_all would)
 * or another negative error with c unchanged.
 */
int kgpu_policy_place(kgpu_policy *p, kgpu_cluster *c, int node, const kgpu_request *const *reqs,
                      int nreqs, kgpu_rng *rng, kgpu_assignment *out, kgpu_error *err);

/*
 * Node-level scores 0-10 for the extender's prioritize; nodes that do not fit
 * get 0. By default the raw scores of the fitting nodes are scaled linearly so
 * the best is 10 and the worst 0 (all 10 when equal). Policies with
 * rank_scores (kgpu) rank instead: 10 minus the number of distinct better raw
 * scores, at least 0, so the best node alone (or the nodes tied with it) gets
 * 10 however close the runner-up is. kgpu_policy_set_linear_scores forces
 * linear scaling (for measuring the difference).
 */
int kgpu_policy_node_scores(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                            const int *nodes, int n, int *scores, kgpu_error *err);
void kgpu_policy_set_linear_scores(kgpu_policy *p, bool linear);

#ifdef __cplusplus
}
#endif

#endif
