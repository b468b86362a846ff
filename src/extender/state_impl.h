/*
 * What the files of the state layer share among themselves and with no one
 * else (state.h is what the layers above see). Bottom first, as the files
 * call each other: usage.c, learn.c, pods.c, inventory.c. Caller holds st->mu.
 */
#ifndef KGPU_EXT_STATE_IMPL_H
#define KGPU_EXT_STATE_IMPL_H

#include "state.h"

/* Pod uids remembered as observed: a pod is counted once unless this many newer pods came since. */
#define OBSERVED_MAX 16384

/* ---- dra_mig.c ---- */

/* Whether `device` is one of slice s's MIG devices. */
bool ext__dra_is_mig(const ext_dra_slice *s, const char *device);
/*
 * Charges result r, a MIG device of slice s on cluster node idx: NULL, or
 * why not (nothing charged then; err's text when the cluster refused).
 */
const char *ext__dra_mig_charge(ext_state *st, ext_dra_result *r, const ext_dra_slice *s, int idx,
                                kgpu_error *err);
/* Gives back what r's MIG device took (r->applied and r->mig then false). */
void ext__dra_mig_uncharge(ext_state *st, ext_dra_result *r);
/* The cluster was rebuilt: no GPU holds an instance, nothing is to be released. */
void ext__dra_mig_forget(ext_state *st);

/* ---- dra_claims.c ---- */

/* spec's GPUs from its node's slice into gpus (KGPU_MAX_GPUS_PER_NODE; none without a slice). */
void ext_dra_gpus_from_slice(ext_state *st, kgpu_node_spec *spec, kgpu_gpu_spec *gpus);

/* ---- queues.c ---- */

/* What p holds, as queue demand on cluster c (the one it was charged on). */
void ext__pod_demand(const kgpu_cluster *c, const ext_pod *p, kgpu_qdemand *d);

/* ---- learn.c ---- */

/* Drops every policy (their caches are keyed by node positions of the cluster). */
void ext__free_policies(ext_state *st);
/* fgd's target before any pod is seen: the learner's generic mix. */
int ext__set_prior(ext_state *st);
/* Forgets the learned shapes' bits of models no node has any more (`gone`, a mask). */
void ext__shapes_forget_models(ext_state *st, uint64_t gone);
/* Counts the pod's requests as an arrival, once per uid. */
void ext__observe(ext_state *st, const kgpu_pod *pod);

/* ---- usage.c ---- */

/*
 * p starts holding its GPUs (p->node's, its parts' assignments): sets
 * p->gpus and adds them to the usage of its namespace, queue, models and
 * capacity type. _unhold takes off what _hold added; _requeue moves it to
 * p->queue when that changed (the seconds so far stay where they were).
 */
void ext__usage_hold(ext_state *st, ext_pod *p);
void ext__usage_unhold(ext_state *st, ext_pod *p);
void ext__usage_requeue(ext_state *st, ext_pod *p);

/* ---- pods.c ---- */

/* Applies req with its CPU and memory clamped to what node idx has free (see ext_fit_requests). */
int ext__apply_clamped(kgpu_cluster *c, const kgpu_request *req, int idx, const int *gpus,
                       kgpu_assignment *out, kgpu_error *err);
/* The position on n of the GPU with device index `index` (and uuid, when given), or -1. */
int ext__gpu_position(const kgpu_node *n, int index, const char *uuid);
/* Keeps a bound pod whose GPUs cannot be honoured now (parts copied), to retry later. */
void ext__keep_orphan(ext_state *st, const char *uid, const char *ns, const char *name,
                      const char *node, const kgpu_assigned_part *parts, int n, int64_t cpu_milli,
                      int64_t memory_mib, const char *queue_label, int priority, const char *why);
/* Adopts the orphans whose GPUs can be honoured now. */
void ext__retry_orphans(ext_state *st);
/* Takes a GPU-less pod's CPU and memory from its node in c; false when the node is gone. */
bool ext__cpu_take(kgpu_cluster *c, ext_cpu_pod *p);
/* Appends str (owned) to *list of *n. */
void ext__push_owned(char ***list, size_t *n, char *str);

/* ---- reclaim_state.c ---- */

/*
 * The victims as the waiting pod's owner (namespace `viewer`) may read
 * them: a pod of its own namespace by name and queue, the others only
 * counted (docs/security.md: tenants learn nothing of each other's pods).
 */
void ext__victims_text(const ext_reclaim *r, const char *viewer, char *out, size_t len);
/* Appends pod p to r's victims (room for it checked by the caller), freeing freed_milli. */
void ext__victim_add(ext_reclaim *r, const ext_pod *p, int64_t freed_milli);
/* Pod p as a victim record. */
void ext__victim_fill(ext_victim *vv, const ext_pod *p, int64_t freed_milli);
/* Remembers reclaim r for its pod (bounded by EXT_RECLAIMS_MAX); its victims are being evicted. */
void ext__reclaim_remember(ext_state *st, const ext_reclaim *r, double now);
/* Whether victim uid's eviction was refused by a PodDisruptionBudget lately (EXT_REFUSED_S). */
bool ext__refused_lately(ext_state *st, const char *uid, double now);
/* Whether the pod's one GPU request fits some node as it is now, room held for others aside. */
bool ext__fits_somewhere(ext_state *st, const kgpu_pod *pod);

#endif
