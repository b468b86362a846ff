/*
 * The simulator's GPU queues (`kgpu simulate --churn --queues FILE`): which
 * queue and priority each trace pod gets, and the names of the ways of
 * dividing the cluster that a run compares (docs/queues.md).
 */
#ifndef KGPU_CLI_SIMQUEUES_H
#define KGPU_CLI_SIMQUEUES_H

#include "kgpu/churn.h"
#include "kgpu/queue.h"
#include "kgpu/trace.h"

/*
 * A trace pod's queue: the leaf queue whose name, followed by '-', begins
 * the pod's name (the longest such); otherwise a leaf other than `default`
 * drawn by the FNV-1a hash of the pod's name, each leaf's chance in
 * proportion to its guaranteed GPU compute (to its weight when no leaf
 * guarantees any); `default` when there is no other leaf.
 */
int kgpu_simq_queue_of(const kgpu_queues *qs, const char *pod_name);

/* A trace pod's priority from its qos: Guaranteed 3, LS 2, Burstable 1, anything else 0. */
int kgpu_simq_priority_of(const char *qos);

/*
 * Both, for every pod of the list: a pod file with a `queue` column (the
 * 12-column layout) names each pod's queue there, and an empty cell falls
 * back on the rule above; a queue the tree does not have is an error naming
 * `file` and the line. Caller frees *queue_of and *priority_of.
 */
int kgpu_simq_assign(const kgpu_queues *qs, const kgpu_trace *pods, const char *file,
                     int **queue_of, int **priority_of, kgpu_error *err);

/* "none", "static", "priority-age", "frag". */
const char *kgpu_simq_mode_name(kgpu_churn_queue_mode m);

/* A comma list of mode names into modes[0..*n), at most max. */
int kgpu_simq_parse_modes(const char *text, kgpu_churn_queue_mode *modes, int max, int *n,
                          kgpu_error *err);

#endif
