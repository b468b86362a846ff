/*
 * The node groups file of kgpu-extender (--node-groups): the groups an
 * autoscaler can grow in this cluster, each with the GPUs of its nodes,
 * the labels that mark its nodes and its largest size, so that POST
 * /estimate can say how many more copies of a pod the cluster could take
 * by growing (docs/multicluster.md). The operator's file, read as outside
 * input: bounded, unknown keys refused, errors name the file and the field.
 */
#ifndef KGPU_NODEGROUPS_H
#define KGPU_NODEGROUPS_H

#include <stddef.h>

#include "kgpu/error.h"
#include "kgpu/model.h"

#define KGPU_NODE_GROUPS_MAX 128
#define KGPU_NODE_GROUP_LABELS_MAX 4

typedef struct kgpu_node_group {
    char name[64];
    int max_nodes;                                   /* 0..10000 */
    char label_key[KGPU_NODE_GROUP_LABELS_MAX][254]; /* all of these mark its nodes */
    char label_value[KGPU_NODE_GROUP_LABELS_MAX][64];
    int nlabels;
    char gpu_model[KGPU_MODEL_NAME_MAX];
    int gpu_count;         /* 1..KGPU_MAX_GPUS_PER_NODE */
    int64_t gpu_memory_mib; /* per GPU */
} kgpu_node_group;

typedef struct kgpu_node_groups {
    kgpu_node_group v[KGPU_NODE_GROUPS_MAX];
    int n;
} kgpu_node_groups;

/*
 *   nodeGroups:
 *     - name: a100-spot
 *       maxNodes: 8
 *       nodeLabels: {cloud.google.com/gke-nodepool: a100-spot}
 *       gpus: {model: NVIDIA A100-SXM4-80GB, count: 8, memoryMiB: 81920}
 */
int kgpu_node_groups_load(const char *buf, size_t len, const char *file, kgpu_node_groups *out,
                          kgpu_error *err);
int kgpu_node_groups_load_file(const char *path, kgpu_node_groups *out, kgpu_error *err);

/* Whether node n carries every label of group g. */
bool kgpu_node_group_member(const kgpu_node_group *g, const kgpu_node *n);

#endif
