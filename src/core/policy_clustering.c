/*
 * clustering: the study's GpuClustering baseline. GPU pods go where pods of
 * their own class already run (GPU shares together, k-GPU pods with k-GPU
 * pods): nodes holding only that class first, then nodes holding it among
 * others, then empty nodes, then the rest; within a band, fuller nodes win.
 * CPU-only pods are placed anywhere they fit.
 */
#include "core.h"

#define MAX_SPEC_GPU 8000

static int64_t clustering_score(void *state, const kgpu_cluster *c, int node,
                                const kgpu_request *req)
{
    if (req->gpu_count <= 0)
        return 0;
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int klass = kgpu_request_class(req);
    int classes = 0; /* distinct GPU classes on the node (CPU-only pods don't count) */
    for (int k = KGPU_CLASS_SHARE; k < KGPU_CLASS_MAX; k++)
        classes += n->class_count[k] > 0;
    int64_t used = MAX_SPEC_GPU - kgpu__node_free_milli(n);
    if (used < 0)
        used = 0;
    int64_t fill = 25 * used / MAX_SPEC_GPU; /* 0..25 within a band */
    int64_t band;
    if (n->class_count[klass] > 0)
        band = classes == 1 ? 75 : 50;
    else
        band = classes == 0 ? 25 : 0;
    return band + fill;
}

const kgpu_policy_ops kgpu__policy_clustering = {
    .name = "clustering",
    .summary = "place GPU pods next to pods of the same class (share, 1-GPU, 2-GPU, ...)",
    .score = clustering_score,
    .pick_gpus = kgpu__pick_gpus_best_fit,
};
