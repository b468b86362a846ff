/*
 * Making room by moving pods, for a caller that keeps its own pods: the
 * planner of `kgpu simulate --consolidate` (src/core/consolidate.c) behind
 * one call, so that kgpu-extender's consolidating controller decides as the
 * simulator measured. Pure: the caller's cluster is the only state touched.
 */
#ifndef KGPU_CONSOLIDATE_H
#define KGPU_CONSOLIDATE_H

#include <stdbool.h>
#include <stddef.h>

#include "kgpu/model.h"
#include "kgpu/policy.h"
#include "kgpu/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_MAX_MOVES 3 /* pods one plan may move */

/* A pod placed on the cluster, as the planner may see it. */
typedef struct kgpu_placed_pod {
    /*
     * What the pod asks, compiled against the cluster (models set): where
     * it may go if moved. Keep CPU and memory at 0 unless the policy checks
     * them (kgpu_policy_set_fit_cpu).
     */
    kgpu_request req;
    kgpu_assignment a; /* where it is: applied to the cluster */
    bool movable;      /* restartable: may be moved */
} kgpu_placed_pod;

/* A plan: where the waiting pod goes, and which pods move where. */
typedef struct kgpu_moves {
    kgpu_assignment placed;         /* the waiting pod's placement */
    int n;                          /* pods moved, 1..KGPU_MAX_MOVES */
    size_t pod[KGPU_MAX_MOVES];     /* indices into the pods given */
    kgpu_assignment to[KGPU_MAX_MOVES]; /* their new places */
} kgpu_moves;

/*
 * For req, which fits no node of c as it stands: moves at most max_moves
 * (<= KGPU_MAX_MOVES) movable pods of one node elsewhere (another node, or
 * other GPUs of the same node beside req), the fewest, then
 * the least GPU compute moved; the policy p (made for c) picks req's GPUs
 * and each moved pod's new place. pods[0..n) are the placed pods the
 * planner may consider (others on c stay where they are); `hosts` (one
 * flag per node of c; NULL: every node) are the nodes req may be placed
 * on (moved pods may go to any node of c). On 0, c holds
 * the plan applied (req placed, pods moved) and *out says it; KGPU_ENOFIT
 * when no such plan exists (c unchanged); other errors: out of memory, or
 * pods that disagree with c.
 */
int kgpu_plan_moves(kgpu_cluster *c, kgpu_policy *p, const kgpu_placed_pod *pods, size_t n,
                    const kgpu_request *req, int max_moves, const bool *hosts, kgpu_rng *rng,
                    kgpu_moves *out, kgpu_error *err);

/*
 * Whether the pods pods[0..n) of node `node` (applied to c) could all run
 * elsewhere: each placed again by the policy p (made for c) on the other
 * nodes, largest GPU demand first, none on `node` nor on nodes flagged in
 * `skip` (per node of c; NULL: none). What removing the node would need.
 * 0: yes; KGPU_ENOFIT: no, *stuck the index of a pod that found no room
 * (when stuck is not NULL); another error: out of memory, or pods that
 * disagree with c. c is left exactly as it was, in every case but a bug.
 */
int kgpu_can_drain(kgpu_cluster *c, kgpu_policy *p, const kgpu_placed_pod *pods, size_t n,
                   int node, const bool *skip, kgpu_rng *rng, size_t *stuck, kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
