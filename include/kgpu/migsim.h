/*
 * MIG placement in the trace simulator: every GPU of the trace's nodes is a
 * MIG GPU of one model (include/kgpu/mig.h), every GPU request of the trace
 * becomes MIG instances (a share: the smallest profile with the compute and
 * memory it asks for; k whole GPUs: k whole-GPU instances on k GPUs of one
 * node), and the arrivals are placed, each once or never, by one of the
 * strategies below. Beside them, what an offline packing could place: an
 * upper bound by linear programming over per-GPU layouts, and a packing that
 * achieves a lower one (docs/policy.md "MIG").
 *
 * Pods without a GPU are left out: they take no instance, and the question
 * is how many MIG requests fit. Node CPU and memory still bound the GPU
 * requests a node takes; GPU models (gpu_spec) are ignored, every GPU being
 * the one model.
 *
 * Pure computation; a prepared kgpu_migsim_input is read-only and shared by
 * concurrent runs, each run owns its state.
 */
#ifndef KGPU_MIGSIM_H
#define KGPU_MIGSIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"
#include "kgpu/mig.h"
#include "kgpu/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * FIRST_FIT   natural order: nodes in trace order, GPUs by index, the lowest
 *             start that fits (kgpu_mig_first_fit): kube-scheduler's DRA
 *             allocator over a slice that lists placements in NVML's order.
 * KGPU_ORDER  the same node and GPU order, the start by kgpu's slice order
 *             (kgpu_mig_slice_order): kgpu's slice without the extender.
 * KGPU        kgpu's slice and the extender's node scores: on each node
 *             the allocator would take the first GPU and start in slice
 *             order; the node where that costs the least room
 *             (kgpu_mig_room), then strands the fewest compute slices
 *             (free on a GPU where nothing fits any more), wins; ties to
 *             the node with the least room (keeping empty GPUs and nodes
 *             for big requests).
 * BEST_FIT    no slice order: any GPU and start of any node at kgpu's cost,
 *             ties to the fullest GPU, then the fullest node. What kgpu
 *             would do could it pick the device too.
 * MOST_ROOM   kgpu's slice order, the node left with the most room after
 *             the allocator's placement (ties to the first): node scores
 *             that spread, measured to show why the others pack.
 */
typedef enum kgpu_migsim_strategy {
    KGPU_MIGSIM_FIRST_FIT = 0,
    KGPU_MIGSIM_KGPU_ORDER,
    KGPU_MIGSIM_KGPU,
    KGPU_MIGSIM_BEST_FIT,
    KGPU_MIGSIM_MOST_ROOM,
    KGPU_MIGSIM_STRATEGIES
} kgpu_migsim_strategy;

/* "first-fit", "kgpu-order", "kgpu", "best-fit", "most-room". */
const char *kgpu_migsim_strategy_name(kgpu_migsim_strategy s);
/* The strategy called `name`, or -1. */
int kgpu_migsim_strategy_find(const char *name);

/* One pod as MIG: `count` instances of profile `profile` on `count` GPUs of one node. */
typedef struct kgpu_migsim_request {
    int profile;   /* index into the model's profiles; -1: no GPU, or no profile is big enough */
    int count;     /* instances (GPUs); 0 without a GPU */
    int64_t cpu_milli, memory_mib;
} kgpu_migsim_request;

/* A node: its GPUs (all of the model) and what it can give pods. */
typedef struct kgpu_migsim_node {
    int gpus;
    int64_t cpu_milli, memory_mib;
} kgpu_migsim_node;

#define KGPU_MIGSIM_KEYS (256 * (KGPU_MIG_COMPUTE_SLICES + 1)) /* (memory mask, compute) */

/*
 * The prepared input. Owns every array; free with kgpu_migsim_input_free.
 * The tables cache mig.c's answers by a GPU's (memory slices, compute) key:
 * a profile's instance limit never binds before its placements run out
 * (instances >= starts, tested in test_migsim.c), so those two decide.
 */
typedef struct kgpu_migsim_input {
    const kgpu_mig_model *model;
    kgpu_migsim_node *nodes;
    int nnodes, gpus;
    kgpu_migsim_request *requests; /* one per pod of the trace, in file order */
    size_t nrequests;
    int16_t room[KGPU_MIGSIM_KEYS];                           /* kgpu_mig_room */
    int8_t stranded[KGPU_MIGSIM_KEYS];                        /* kgpu_mig_stranded */
    int8_t first_fit[KGPU_MIGSIM_KEYS][KGPU_MIG_MAX_PROFILES]; /* start, -1 */
    int8_t slice[KGPU_MIGSIM_KEYS][KGPU_MIG_MAX_PROFILES];     /* first start in slice order */
    int8_t choose[KGPU_MIGSIM_KEYS][KGPU_MIG_MAX_PROFILES];    /* kgpu_mig_choose */
} kgpu_migsim_input;

/* The profile of a trace request, as kgpu_migsim_prepare maps it: index, or -1 (none fits). */
int kgpu_migsim_profile_of(const kgpu_mig_model *m, const kgpu_request *r);

/*
 * An input over nodes[0..nnodes) and requests[0..nrequests) (copied), for
 * tests and other front ends; kgpu_migsim_prepare builds one from a trace.
 */
int kgpu_migsim_input_init(const kgpu_mig_model *m, const kgpu_migsim_node *nodes, int nnodes,
                           const kgpu_migsim_request *requests, size_t nrequests,
                           kgpu_migsim_input *in, kgpu_error *err);
/* The trace's nodes and pods (a prepared simulator input) on GPUs of model m. */
int kgpu_migsim_prepare(const kgpu_sim_input *sim, const kgpu_mig_model *m,
                        kgpu_migsim_input *in, kgpu_error *err);
void kgpu_migsim_input_free(kgpu_migsim_input *in);

typedef struct kgpu_migsim_result {
    long requests;  /* GPU requests that arrived */
    long placed;    /* of them, placed */
    long instances; /* MIG instances placed */
    long slices;    /* compute slices of those instances */
    long asked;     /* compute slices of the requests that arrived (those with a profile) */
    long gpus_used; /* GPUs holding an instance at the end */
    /*
     * Up to the arrival at which the compute slices asked for (count x the
     * profile's, requests that fit no profile left out) reach the GPUs'
     * total (7 each): requests failed, where a perfect packing could fail
     * none. first_fail_pct: the slices asked for, % of the total, when the
     * first request failed (-1: none failed).
     */
    long failed_by_full;
    long slices_at_full; /* compute slices placed at that arrival */
    double first_fail_pct;
    double mean_in_use; /* kgpu_migsim_run_times: compute slices in use, time-weighted mean */
} kgpu_migsim_result;

/*
 * Replays the arrivals order[0..n) (indices into in->requests; pods without
 * a GPU are skipped) with strategy s.
 */
int kgpu_migsim_run(const kgpu_migsim_input *in, kgpu_migsim_strategy s, const size_t *order,
                    size_t n, kgpu_migsim_result *out, kgpu_error *err);

/*
 * The same with time: arrival a at arrive[a] (ascending), a request placed
 * then holds its instances for life[a], one that fits nowhere is lost (no
 * queue: the share lost is what fragmentation costs). Departures at an
 * arrival's instant go first. mean_in_use is over arrive[0]..arrive[n-1];
 * first_fail_pct: the slices in use, % of the total, at the first loss;
 * failed_by_full and slices_at_full are 0.
 */
int kgpu_migsim_run_times(const kgpu_migsim_input *in, kgpu_migsim_strategy s,
                          const size_t *order, const double *arrive, const double *life, size_t n,
                          kgpu_migsim_result *out, kgpu_error *err);

typedef struct kgpu_migsim_bound {
    long requests; /* GPU requests that arrived */
    long possible; /* of them, ones some empty node could take (the others never can) */
    long upper;    /* no placement of the arrivals places more (the LP bound) */
    long packed;   /* a placement found offline places this many (a lower bound) */
    double lp_gpus; /* fractional GPUs the LP needs for `upper` requests */
} kgpu_migsim_bound;

/*
 * What placing the arrivals order[0..n) offline, knowing all, could do.
 * A smaller profile can take a bigger one's place (1g.5gb, 1g.10gb, 2g, 3g,
 * 4g, 7g: each one's placements lie inside the next one's), so the most
 * requests are placed by placing the smallest: `upper` is the largest k
 * such that the k smallest requests pass the LP below, with nodes, CPU and
 * the one-node rule of multi-GPU requests relaxed; `packed` the largest k
 * for which placing the k smallest largest first (first fit over nodes,
 * the start by kgpu_mig_choose) succeeds with every constraint kept.
 */
int kgpu_migsim_offline(const kgpu_migsim_input *in, const size_t *order, size_t n,
                        kgpu_migsim_bound *out, kgpu_error *err);

/* ---- the linear program, exposed for tests ---- */

#define KGPU_MIGSIM_MAX_LAYOUTS 128

/*
 * The maximal layouts of one GPU of model m (no further instance of a
 * profile without "+me" fits), as counts per profile index, duplicates
 * removed: writes up to max into out and returns how many (-1: more).
 */
int kgpu_migsim_layouts(const kgpu_mig_model *m, int (*out)[KGPU_MIG_MAX_PROFILES], int max);

/*
 * The fewest GPUs, fractional, that hold demand[pi] instances of each
 * profile pi, a bigger instance's place standing in for a smaller one:
 * min sum x_L over the maximal layouts L, with, for every profile t
 * (non-"+me", by size), sum_L x_L * (instances of L of size >= t) >=
 * (demand of size >= t), x >= 0. Solved as its dual by the simplex
 * method. Returns the value, or -1 when some demand can never be met.
 */
double kgpu_migsim_lp(const kgpu_mig_model *m, const long demand[KGPU_MIG_MAX_PROFILES]);

#ifdef __cplusplus
}
#endif

#endif
