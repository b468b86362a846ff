/*
 * binpack: fill GPUs before opening new ones. The node whose GPUs keep the
 * least free compute (then CPU) after the pod lands, and on it the tightest
 * GPU. The usual choice for dense GPU sharing when fragmentation is no
 * concern; fgd is the better packer when the workload mix is known.
 */
#include "core.h"

static int64_t binpack_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int64_t gpu_left = kgpu__node_free_milli(n) - kgpu__gpu_demand(req);
    int64_t cpu_left = n->cpu_free - req->cpu_milli;
    /* GPU first; CPU only orders nodes with equal GPU left (cpu < 2^40 milli). */
    return -(gpu_left * ((int64_t)1 << 40) + cpu_left);
}

const kgpu_policy_ops kgpu__policy_binpack = {
    .name = "binpack",
    .summary = "fill GPUs and nodes already in use before empty ones",
    .score = binpack_score,
    .pick_gpus = kgpu__pick_gpus_best_fit,
};
