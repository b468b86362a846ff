/*
 * spread: the opposite of binpack. The node with the most free GPU compute
 * after the pod lands, and on it the emptiest GPU: least contention between
 * sharing pods, at the price of fragmentation.
 */
#include "core.h"

static int64_t spread_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int64_t gpu_left = kgpu__node_free_milli(n) - kgpu__gpu_demand(req);
    int64_t cpu_left = n->cpu_free - req->cpu_milli;
    return gpu_left * ((int64_t)1 << 40) + cpu_left;
}

static int spread_pick(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                       kgpu_rng *rng, int *gpus)
{
    return kgpu__pick_loosest(kgpu_cluster_node(c, node), req, gpus);
}

const kgpu_policy_ops kgpu__policy_spread = {
    .name = "spread",
    .summary = "most free GPU first: least contention between sharing pods",
    .score = spread_score,
    .pick_gpus = spread_pick,
};
