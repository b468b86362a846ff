/*
 * The trace replayed on an autoscaled cluster (kgpu simulate --autoscale):
 * node groups per node shape and capacity type start empty, a Cluster
 * Autoscaler-like loop grows them for pending pods with one expander
 * (kgpu/expander.h) and shrinks them when nodes are unneeded, spot nodes are
 * interrupted, and what is reported is what the capacity cost and how long
 * pods waited for it. docs/autoscaling.md tells the model and its sources.
 *
 * Built on a prepared churn input (the same pods, times and workload draws
 * as --churn). kgpu_autoscale_run is pure and thread-safe on a shared
 * prepared input, like kgpu_churn_run.
 */
#ifndef KGPU_AUTOSCALE_H
#define KGPU_AUTOSCALE_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/churn.h"
#include "kgpu/expander.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_AS_MAX_GROUPS 128 /* node groups: distinct node shapes x {on-demand, spot} */

/* Prices per hour, in one currency: per GPU of each model and per CPU core. */
typedef struct kgpu_price {
    double on_demand, spot;
} kgpu_price;

typedef struct kgpu_prices {
    char currency[16];
    int nmodels;
    char model[KGPU_MAX_MODELS][KGPU_MODEL_NAME_MAX];
    kgpu_price gpu[KGPU_MAX_MODELS]; /* per GPU-hour, for model[i] */
    kgpu_price cpu_core;             /* per core-hour; 0 when not priced */
} kgpu_prices;

/* The price of model `name`, or NULL when the table has none. */
const kgpu_price *kgpu_prices_gpu(const kgpu_prices *p, const char *name);

/*
 * Node n of cluster c for an hour, spot or on-demand: its GPUs at their
 * model's price plus its cores at cpu_core's; -1 when a GPU model of it has
 * no price. The simulator's node groups and kgpu-expander's templates.
 */
double kgpu_prices_node(const kgpu_prices *p, const kgpu_cluster *c, const kgpu_node *n,
                        bool spot);

/* One node group: a node shape of the node list and a capacity type. */
typedef struct kgpu_as_group {
    int tmpl;  /* a node of sim->cluster with that shape */
    bool spot; /* spot capacity: tainted, only pods that tolerate it go there */
    int max;   /* nodes of that shape in the node list: the quota */
} kgpu_as_group;

typedef struct kgpu_autoscale_input {
    const kgpu_churn_input *churn; /* borrowed; must outlive this input */
    const bool *tolerates_spot;    /* per sim->requests entry; borrowed */
    kgpu_as_group groups[KGPU_AS_MAX_GROUPS];
    int ngroups; /* on-demand group 2s, spot group 2s + 1, for shape s */
} kgpu_autoscale_input;

/* Who grows the cluster in a run. */
typedef enum kgpu_as_mode {
    KGPU_AS_EXPANDER = 0, /* the autoscaler with cfg.expander */
    KGPU_AS_FIXED,        /* no autoscaler: cfg.fixed_nodes on-demand nodes, all ready from the start */
} kgpu_as_mode;

typedef struct kgpu_autoscale_config {
    kgpu_as_mode mode;
    kgpu_expander_kind expander;
    const int *fixed_nodes; /* KGPU_AS_FIXED: nodes per group (ngroups entries); borrowed */
    uint64_t seed;          /* the inflated workload, the expanders' ties, the interruptions */
    double speedup, inflate; /* as kgpu_churn_config */
    const kgpu_prices *prices; /* borrowed; every model of the node list must be priced */
    double scan_interval_s;    /* CA --scan-interval (10 s) */
    double provision_delay_s;  /* scale-up to node ready (120 s) */
    double unneeded_s;         /* CA --scale-down-unneeded-time (600 s) */
    double delay_after_add_s;  /* CA --scale-down-delay-after-add (600 s) */
    double utilization;        /* CA --scale-down-utilization-threshold (0.5) */
    double spot_rate;          /* interruptions per spot node-hour (Poisson) */
} kgpu_autoscale_config;

/* CA's defaults and ours, as a kgpu_autoscale_config initialiser (set prices, seed, speedup). */
#define KGPU_AUTOSCALE_DEFAULTS                                                                    \
    {.mode = KGPU_AS_EXPANDER,                                                                     \
     .expander = KGPU_EXPANDER_KGPU,                                                               \
     .speedup = 1,                                                                                 \
     .scan_interval_s = 10,                                                                        \
     .provision_delay_s = 120,                                                                     \
     .unneeded_s = 600,                                                                            \
     .delay_after_add_s = 600,                                                                     \
     .utilization = 0.5,                                                                           \
     .spot_rate = 0.05}

typedef struct kgpu_autoscale_result {
    double t_first, t_end; /* the costed span: 5 % of arrivals to the last departure, simulated s */
    double gpu_hours_bought; /* GPUs of the nodes held in the span, from scale-up to removal */
    double cost;             /* their price over the span */
    double gpu_hours_used;   /* GPU allocated, integrated over the span */
    /*
     * The same over the arrival span alone (5 % of arrivals to the last
     * arrival): trace pods live up to months, so the span to the last
     * departure is mostly a few long pods' tail.
     */
    double t_last, arrival_gpu_hours_bought, arrival_cost;
    double wait_mean_s, wait_p50_s, wait_p99_s; /* per placed pod: all its time pending */
    long pods, never_placed;
    long scale_ups;      /* scale-up decisions */
    long nodes_added;    /* nodes those bought */
    long useless_nodes;  /* nodes added that never held a pod */
    long nodes_removed;  /* by scale-down */
    long interruptions;  /* spot nodes interrupted */
    long restarted;      /* pods sent back to pending: interruptions and scale-down drains */
    double lost_gpu_hours; /* work those pods had done, lost */
    long pods_on_spot;   /* placements on spot nodes */
    int peak_nodes;      /* nodes held at once, at most */
    int peak[KGPU_AS_MAX_GROUPS]; /* per group */
    int peak_shape[KGPU_AS_MAX_GROUPS / 2]; /* per node shape, both capacity types together */
} kgpu_autoscale_result;

/*
 * Node groups from the churn input's cluster: one per distinct shape (CPU,
 * memory, GPU count, model and GPU memory) in node order, on-demand and
 * spot, each as many at most as the node list has. tolerates_spot:
 * per request, borrowed. Free with kgpu_autoscale_input_free (nothing
 * allocated today; call it anyway).
 */
int kgpu_autoscale_prepare(const kgpu_churn_input *churn, const bool *tolerates_spot,
                           kgpu_autoscale_input *in, kgpu_error *err);
void kgpu_autoscale_input_free(kgpu_autoscale_input *in);

/* Node-hour price of group g (GPUs x GPU price + cores x core price); <0 when unpriced. */
double kgpu_autoscale_group_price(const kgpu_autoscale_input *in, int g, const kgpu_prices *p);

/*
 * One run. Deterministic for (input, config). Fails with the model's name
 * when a GPU model of the node list has no price.
 */
int kgpu_autoscale_run(const kgpu_autoscale_input *in, const kgpu_autoscale_config *cfg,
                       kgpu_autoscale_result *out, kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
