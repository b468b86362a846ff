/*
 * kgpu-extender, state layer: moving pods and keeping nodes (moves.c), on
 * top of the state (state.h): consolidation's plans for a pod that fits
 * nowhere, and the copy the scale-down guard (guard.c) decides on.
 */
#ifndef KGPU_EXT_MOVES_H
#define KGPU_EXT_MOVES_H

#include "kgpu/consolidate.h"
#include "state.h"

/* ---- the scale-down guard (moves.c, guard.c; docs/autoscaling.md). ---- */

/* What the guard checks, copied out under st->mu and then owned by the guard's thread. */
typedef struct ext_guard_node {
    char name[KGPU_NAME_MAX + 1];
    int idx;           /* in snap->c */
    size_t first, n;   /* its pods: snap->pods[first .. first + n) */
    bool unsure;       /* a pod kgpu cannot place again alone (several GPU containers) */
    bool marked;       /* carries EXT_GUARD_MARK now */
    bool foreign;      /* carries CA's or Karpenter's annotation without kgpu's mark: not kgpu's */
} ext_guard_node;

typedef struct ext_guard_snap {
    kgpu_cluster *c;       /* a copy of the cluster */
    bool *skip;            /* per node of c: leaving or DRA, takes nothing */
    kgpu_placed_pod *pods; /* by node, see ext_guard_node; movable: kgpu.io/restartable */
    ext_victim *who;       /* pods[i]'s pod, to evict it when its node is emptied */
    size_t npods;
    ext_guard_node *nodes; /* nodes holding kgpu pods, and marked nodes */
    int nnodes;
} ext_guard_snap;

/*
 * Copies what the guard needs into *out (caller holds st->mu; the guard
 * frees it with ext_guard_snap_free). false: out of memory.
 */
bool ext_guard_snapshot(ext_state *st, ext_guard_snap *out);
void ext_guard_snap_free(ext_guard_snap *s);

/*
 * Emptying a node for scale-down (--consolidate-nodes): while a node is
 * being emptied no GPU pod is placed there (as if it were leaving), for
 * EXT_EMPTYING_S at most.
 */
#define EXT_EMPTYING_S 600

/* Why node `name` takes no new GPU pod: leaving (st->leaving) or being emptied; NULL: it takes. */
const char *ext_node_closed(ext_state *st, const char *name);
/*
 * Starts emptying node `name`: no other emptying under way (false then),
 * the node closed for EXT_EMPTYING_S, r's victims (all its GPU pods, still
 * there and not being evicted) marked as being evicted. Caller holds st->mu.
 */
bool ext_emptying_start(ext_state *st, const char *name, ext_reclaim *r);

/* ---- consolidation (moves.c; docs/autoscaling.md). Caller holds st->mu. ---- */

#define EXT_CONSOLIDATE_GAP_S 10 /* seconds between two consolidations started */

/*
 * For a pod of one GPU container (priority `priority`) that fits no node:
 * with --consolidate N, plans to evict at most N kgpu.io/restartable pods
 * of one node among `offered` (a flag per node of the cluster: those
 * kube-scheduler offered), of no higher priority, not being evicted nor lately
 * protected by a PodDisruptionBudget, so that the pod fits there and each
 * of them fits elsewhere (kgpu_plan_moves, leaving and DRA nodes left
 * out). One consolidation at a time cluster-wide, none while a reclaim is
 * under way, and at least EXT_CONSOLIDATE_GAP_S apart. Results as
 * ext_queues_reclaim's: STARTED remembers it as a reclaim (its room held
 * for the pod once the victims are gone) with the victims in *out; `apply`
 * (--cluster-file) releases them now. msg names no pod of another namespace.
 */
int ext_consolidate(ext_state *st, const kgpu_pod *pod, int priority, const bool *offered,
                    bool apply, ext_reclaim *out, char *msg, size_t len);

#endif
