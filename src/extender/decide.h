/*
 * kgpu-extender, decisions layer: kube-scheduler's verbs (filter,
 * prioritize, bind, preempt) and reclaim for GPU queues, as functions over
 * the state. Each takes the verb's JSON body and answers an ext_response:
 * no HTTP, so tests and benchmarks call them directly.
 *
 * Threads: any number of verbs run at once, each on its caller's thread.
 * JSON is parsed and written outside the state lock; the lock covers only
 * in-memory work (fit, score, reserve, release). A bind reserves under the
 * lock, calls the API server without it, then confirms or releases under
 * the lock: binds proceed in parallel.
 */
#ifndef KGPU_EXT_DECIDE_H
#define KGPU_EXT_DECIDE_H

#include "moves.h"
#include "state.h"

/* What a verb works with; borrowed from its owner (the daemon) for the call. */
typedef struct ext_ctx {
    const ext_config *cfg;
    ext_metrics *metrics;
    ext_state *state;
    kgpu_k8s *k8s;            /* NULL in --cluster-file mode */
    const atomic_bool *leads; /* NULL without leader election: this replica always leads */
    const char *identity;     /* the instance named in Events ("" none) */
} ext_ctx;

/* Whether this replica may reserve GPUs now. */
static inline bool ext_ctx_leads(const ext_ctx *c)
{
    return c->leads == NULL || atomic_load(c->leads);
}

/*
 * One call of verb v (filter, prioritize, prioritize-gpuless, bind,
 * preempt) with its JSON body: decided and answered in *r (200, or 400 for
 * a request kube-scheduler would not send; 500 out of memory). Counted in
 * the metrics with its latency.
 */
void ext_decide(ext_ctx *c, enum ext_verb v, const char *body, size_t len, ext_response *r);

/*
 * Evicts reclaim's victims through the Eviction API (policy/v1), so that
 * PodDisruptionBudgets hold; the state learns each outcome. Takes the state lock.
 */
void ext_evict_victims(ext_ctx *c, const ext_reclaim *r);

/*
 * The leader's sweep over pods kube-scheduler found no node for, once:
 * reclaims started, their victims evicted and Events posted (acts has room
 * for EXT_SWEEP_PODS; `stop` cuts the work short). Takes the state lock.
 */
void ext_sweep_once(ext_ctx *c, ext_sweep_act *acts, const atomic_bool *stop);

/*
 * The scale-down guard, once (guard.c; docs/autoscaling.md "Scale-down that
 * shares survive"): a GPU node whose GPU pods could not all run on the
 * other nodes gets Cluster Autoscaler's and Karpenter's do-not-remove
 * annotations and kgpu's mark; a marked node that no longer needs them
 * loses all three. Decided on a copy taken under the state lock, patched
 * without it. `written` (node -> what was last patched, owned by the
 * caller's thread) keeps one node from being patched again and again
 * before the watch shows the change. Returns the nodes that need the guard.
 */
int ext_guard_once(ext_ctx *c, kgpu_strmap *written, const atomic_bool *stop);

/*
 * POST /estimate (estimates.c): how many copies of each pod asked about
 * this cluster's placement fits now, after the pods in flight to it, on
 * which GPU models, the fragmentation left and the price of the first
 * copy's GPUs. Placed on a copy taken under the lock; the state is not
 * changed. docs/multicluster.md has the format.
 */
void ext_estimate(ext_ctx *d, const char *body, size_t len, ext_response *r);

#endif
