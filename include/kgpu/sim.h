/*
 * The trace simulator of the FGD study: replay a pod list against a cluster
 * with one policy and measure how much of the GPU capacity gets allocated.
 *
 * Method (ATC '23 "Beware of Fragmentation"): the pods of the file, plus pods
 * sampled from it with replacement until the GPU demand would pass
 * `inflate` x capacity, in an order shuffled with the seed (files already over
 * it lose random pods instead); pods only arrive, each is placed once or fails
 * for good; CPU, memory, GPU and GPU model must fit.
 *
 * kgpu_sim_prepare does the per-trace work once (cluster, requests, target
 * workload); kgpu_sim_run is then pure and thread-safe on a shared prepared
 * input, so runs of several seeds and policies can go in parallel.
 */
#ifndef KGPU_SIM_H
#define KGPU_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/policy.h"
#include "kgpu/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_SIM_CURVE_MAX 130 /* curve points 0..130 % arrival */

typedef struct kgpu_sim_input {
    kgpu_cluster *cluster;  /* empty template; each run works on a clone */
    kgpu_request *requests; /* one per trace pod, compiled against cluster */
    size_t nrequests;
    kgpu_workload target;   /* the study's target workload (95 % of the pod file) */
    int64_t capacity_milli; /* GPU capacity */
    int gpus;
} kgpu_sim_input;

/* Who picks the GPUs within the chosen node (kgpu_sim_config.allocator). */
typedef enum kgpu_sim_allocator {
    KGPU_SIM_ALLOC_POLICY = 0, /* the policy (kgpu_policy_select on that node) */
    KGPU_SIM_ALLOC_DRA,        /* kube-scheduler's DRA allocator: first fit in slice order */
} kgpu_sim_allocator;

typedef struct kgpu_sim_config {
    const char *policy;
    uint64_t seed;
    double inflate; /* 1.3 in the study */
    /*
     * false (the study): ties between equally scored nodes go to the first node
     * of a random node order drawn once per seed; true: uniformly at random per
     * pod, as kube-scheduler does. The random policy is random either way.
     */
    bool random_ties;
    /*
     * false (the study): the policy's target workload is the shape mix of the
     * whole pod file, known in advance. true: learned from the pods arrived so
     * far (kgpu_learner), as a real cluster has to. Policies marked
     * online_only (kgpu) always run online.
     */
    bool online;
    /*
     * 0 (the study): each pod goes to the policy's best node. 1: as under
     * kube-scheduler with the extender: the policy's 0-10 prioritize scores
     * (kgpu_policy_node_scores) over every node, the highest wins, ties at
     * random. 2: the same with linear 0-10 scores for every policy (what the
     * extender did before rank_scores), to measure what the mapping costs.
     */
    int extender_scores;
    /*
     * With extender_scores 1, kube-scheduler's own part of the choice too
     * (kgpu_sim_k8s): nodes sampled as percentageOfNodesToScore does, its
     * default score plugins added to the extender's weighted score, pods
     * without a GPU placed by those plugins alone and never shown to the
     * policy. NULL: the extender's score alone over every node.
     */
    const struct kgpu_sim_k8s *k8s;
    /*
     * Who picks the GPUs on the chosen node. KGPU_SIM_ALLOC_POLICY (0, the
     * default): the policy. KGPU_SIM_ALLOC_DRA: kube-scheduler's DRA allocator
     * (v1.37), the first devices in the ResourceSlice's order (GPU index order)
     * that match the model and still have the compute and memory asked for;
     * the node is always kube-scheduler's choice then (k8s, or
     * KGPU_SIM_K8S_DEFAULT when NULL; extender_scores 0 counts as 1).
     */
    kgpu_sim_allocator allocator;
    /*
     * 0 (the study): a pod that fits no node fails. 1..3: before it fails,
     * up to that many restartable pods of one node are moved elsewhere to
     * make room for it, if such a move exists (the fewest moves, then the
     * least GPU compute moved; kgpu_sim_result.moves counts them). Under the
     * policy's own choice only (not with extender_scores or DRA).
     */
    int consolidate;
    /*
     * Which pods are restartable (may be moved): one flag per in->requests
     * entry; NULL: every pod.
     */
    const bool *restartable;
} kgpu_sim_config;

/* kube-scheduler's side of a placement (kubescheduler.config.k8s.io/v1 defaults shown). */
typedef struct kgpu_sim_k8s {
    /*
     * extenders[].weight (5 shipped); the score counts x weight x 10. 0: no
     * prioritize at all (kube-scheduler refuses a prioritizeVerb without a
     * positive weight), so the policy is never asked to score; the plugins
     * alone choose the node. Under KGPU_SIM_ALLOC_DRA that leaves no extender:
     * the policy is not consulted at all. Under KGPU_SIM_ALLOC_POLICY the
     * extender still binds, so it picks the GPUs and learns the GPU pods.
     */
    int extender_weight;
    int nodes_to_score;    /* percentageOfNodesToScore: 0 adaptive (50 - nodes/125, >= 5) */
    int fit_weight;        /* NodeResourcesFit score weight (1; 0 = off) */
    bool most_allocated;   /* NodeResourcesFit strategy MostAllocated (default LeastAllocated) */
    int balanced_weight;   /* NodeResourcesBalancedAllocation weight (1; 0 = off) */
    /*
     * Pods without a GPU go through the extender's prioritize too (an extender
     * entry without managedResources), so the policy sees and scores them.
     */
    bool all_pods;
} kgpu_sim_k8s;

/* The shipped configuration on kube-scheduler's defaults, as a kgpu_sim_k8s initialiser. */
#define KGPU_SIM_K8S_DEFAULT                                                                       \
    {.extender_weight = 5,                                                                         \
     .nodes_to_score = 0,                                                                          \
     .fit_weight = 1,                                                                              \
     .most_allocated = false,                                                                      \
     .balanced_weight = 1,                                                                         \
     .all_pods = true}

typedef struct kgpu_sim_result {
    double alloc_pct_100;   /* allocation % when arrival reached 100 % */
    double alloc_pct_final; /* allocation % after the last arrival (the "130 %" headline) */
    double arrival_pct_final;
    double unallocated_gpus;  /* capacity - allocated, in GPUs, at the end */
    double frag_ratio_pct_90; /* fragmented share of idle GPU milli when arrival reached 90 % */
    double curve[KGPU_SIM_CURVE_MAX + 1]; /* allocation % at each arrival % */
    long pods;                            /* arrivals */
    long moves;                           /* pods moved to make room (consolidate) */
    long consolidated;                    /* pods placed thanks to such moves */
    long pods_failed;
    long gpu_pods_failed;
    long constrained_pods;   /* arrivals allowed on only some of the cluster's GPU models */
    long constrained_failed; /* of which failed */
    bool online;             /* the policy's target was learned online */
    /*
     * How the GPU shares (pods taking under 1000 milli of a GPU) were packed,
     * at the end: GPUs holding shares; the fewest GPUs that any placement of
     * the same shares could use (a proven lower bound: nodes, CPU and models
     * ignored); and what offline best-fit decreasing of them uses. Idle GPU
     * inside share GPUs is share_gpus - share_compute_gpus.
     */
    long share_pods, share_pods_failed; /* placed, and failed for want of room */
    double share_compute_gpus;
    long share_gpus, share_gpus_bound, share_gpus_bfd;
    long share_sizes[KGPU_MILLI]; /* shares placed, by milli (1..999) */
} kgpu_sim_result;

/* Builds a prepared input from a parsed node list and pod list. Free with kgpu_sim_input_free. */
int kgpu_sim_prepare(const kgpu_trace *nodes, const kgpu_trace *pods, kgpu_sim_input *in,
                     kgpu_error *err);
void kgpu_sim_input_free(kgpu_sim_input *in);

/*
 * The arrival sequence kgpu_sim_run replays for (input, seed, inflate): *len
 * indices into in->requests (which are in pod-file order), the seeded draws and
 * the shuffle included, byte for byte what a run of that seed uses. For tools
 * that replay the same workload elsewhere (bench/e2e_trace.sh through a real
 * kube-scheduler). The caller frees *order.
 */
int kgpu_sim_workload(const kgpu_sim_input *in, uint64_t seed, double inflate, size_t **order,
                      size_t *len, kgpu_error *err);

/*
 * The study's tie order kgpu_sim_run uses for (input, seed, inflate): rank[i]
 * for each node i of in->cluster (the caller's array, one entry per node),
 * lowest rank first among equal scores (kgpu_policy_set_tie_order).
 */
int kgpu_sim_tie_order(const kgpu_sim_input *in, uint64_t seed, double inflate, uint32_t *rank,
                       kgpu_error *err);

/* One run. Deterministic for (input, policy, seed, inflate). */
int kgpu_sim_run(const kgpu_sim_input *in, const kgpu_sim_config *cfg, kgpu_sim_result *out,
                 kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
