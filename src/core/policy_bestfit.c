/*
 * bestfit: the study's BestFit baseline. The node with the least resources
 * left after placing the pod, CPU and GPU weighed half each and normalised by
 * the largest node spec (128 cores, 8 GPUs).
 */
#include "core.h"

#define MAX_SPEC_CPU 128000.0
#define MAX_SPEC_GPU 8000.0

static int64_t bestfit_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    const kgpu_node *n = kgpu_cluster_node(c, node);
    double left = 0.5 * (double)(n->cpu_free - req->cpu_milli) / MAX_SPEC_CPU +
                  0.5 * (double)(kgpu__node_free_milli(n) - kgpu__gpu_demand(req)) / MAX_SPEC_GPU;
    return (int64_t)((1.0 - left) * 100.0);
}

const kgpu_policy_ops kgpu__policy_bestfit = {
    .name = "bestfit",
    .summary = "least CPU and GPU left over after placement",
    .score = bestfit_score,
    .pick_gpus = kgpu__pick_gpus_best_fit,
};
