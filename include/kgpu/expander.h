/*
 * Choosing which node group a cluster autoscaler grows: Cluster Autoscaler's
 * own expanders (least-waste, price, random) and kgpu's. One pure function,
 * kgpu_expander_choose, so that the simulator (kgpu simulate --autoscale)
 * and a gRPC expander service in the extender decide the same way.
 *
 * The options are what Cluster Autoscaler's estimator built: per node group,
 * how many new nodes and which pending pods it expects them to take. It
 * judges fit by node sums (GPUs, GPU compute and GPU memory summed over the
 * node), so an option may hold pods no GPU of that node can really take.
 * CA's expanders take the options as they are; kgpu's places the option's
 * pods on template nodes with the per-GPU fit (kgpu_fit) and scores only
 * what really fits. Pure, reentrant, no globals; allocates scratch per call.
 */
#ifndef KGPU_EXPANDER_H
#define KGPU_EXPANDER_H

#include <stdbool.h>

#include "kgpu/model.h"
#include "kgpu/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kgpu_expander_kind {
    KGPU_EXPANDER_KGPU = 0,    /* really placed pods, cost per worth placed */
    KGPU_EXPANDER_LEAST_WASTE, /* CA: least idle CPU + memory share of the new nodes */
    KGPU_EXPANDER_PRICE,       /* CA: least node price per price of the pods helped */
    KGPU_EXPANDER_RANDOM,      /* CA: any option */
    KGPU_EXPANDER_COUNT
} kgpu_expander_kind;

/* "kgpu", "least-waste", "price", "random"; NULL for an unknown kind. */
const char *kgpu_expander_name(kgpu_expander_kind kind);
/* The kind of a name above, or -1. */
int kgpu_expander_parse(const char *name);

/* A node group as an expander sees it. Borrowed. */
typedef struct kgpu_expander_group {
    const kgpu_node *node; /* a node of the group's shape: its capacity (its state is ignored) */
    double price_hour;     /* one node for an hour */
    bool spot;
} kgpu_expander_group;

/* One option of Cluster Autoscaler's estimator. Borrowed. */
typedef struct kgpu_expander_option {
    int group;      /* index into kgpu_expander_ctx.groups */
    int node_count; /* nodes it would add (what is bought whichever expander picks it) */
    const kgpu_request *const *pods; /* the pending pods it expects the new nodes to take */
    int npods;
} kgpu_expander_option;

typedef struct kgpu_expander_ctx {
    const kgpu_cluster *models; /* whose model table the templates and the requests' masks use */
    const kgpu_expander_group *groups;
    int ngroups;
    /*
     * What a pod's requests are worth per hour: GPU demand (in GPUs) x
     * pod_gpu_price + cores x pod_core_price. CA's price expander divides the
     * nodes' price by it; kgpu's divides the cost by the worth it really places.
     */
    double pod_gpu_price, pod_core_price;
} kgpu_expander_ctx;

/* How an expander saw one option. */
typedef struct kgpu_expander_eval {
    int placed;        /* pods counted (kgpu: that really fit the new nodes; CA: all of them) */
    double worth_hour; /* what those pods are worth per hour */
    double cost_hour;  /* node_count x the group's price */
    double score;      /* lower is better; INFINITY: not a candidate */
} kgpu_expander_eval;

/*
 * Chooses one of opts[0..nopts): *choice is its index, or -1 when there is
 * none to take (no options; kgpu: no option really places a pod). CA's
 * expanders break ties uniformly at random with rng (CA ends its expander
 * chain with random); kgpu breaks them by more pods placed, then the lower
 * cost, then the lower index, and draws nothing. evals (NULL, or nopts
 * entries) gets each option's figures. 0, or KGPU_EINVAL / KGPU_ENOMEM.
 */
int kgpu_expander_choose(const kgpu_expander_ctx *ctx, kgpu_expander_kind kind,
                         const kgpu_expander_option *opts, int nopts, kgpu_rng *rng,
                         kgpu_expander_eval *evals, int *choice, kgpu_error *err);

/*
 * kgpu's look at one option: places its pods (most GPU first, then most
 * CPU) first-fit on node_count empty nodes of the group's shape, each on
 * the tightest GPUs that fit, and counts those that fit. *worth_hour (may
 * be NULL) gets their worth. Returns the count, or a negative error.
 */
int kgpu_expander_real_fit(const kgpu_expander_ctx *ctx, const kgpu_expander_option *opt,
                           double *worth_hour, kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
