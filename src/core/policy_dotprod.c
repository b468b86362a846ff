/*
 * dotprod: the study's DotProduct baseline (Tetris-style alignment). The
 * node's free (CPU, GPU) and the request are normalised by the largest node
 * spec (128 cores, 8 GPUs); the reference implementation scores
 * 100 x (1 - dot/2), so among fitting nodes it prefers the one whose free
 * resources align least with the request, which packs busy nodes first.
 * We follow the reference because it produced the published figures.
 */
#include "core.h"

#define MAX_SPEC_CPU 128000.0
#define MAX_SPEC_GPU 8000.0

static int64_t dotprod_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    const kgpu_node *n = kgpu_cluster_node(c, node);
    double dot = ((double)n->cpu_free / MAX_SPEC_CPU) * ((double)req->cpu_milli / MAX_SPEC_CPU) +
                 ((double)kgpu__node_free_milli(n) / MAX_SPEC_GPU) *
                     ((double)kgpu__gpu_demand(req) / MAX_SPEC_GPU);
    return (int64_t)(100.0 * (1.0 - dot / 2.0));
}

const kgpu_policy_ops kgpu__policy_dotprod = {
    .name = "dotprod",
    .summary = "dot product of free resources and request (Tetris), as the FGD study's baseline",
    .score = dotprod_score,
    .pick_gpus = kgpu__pick_gpus_best_fit,
};
