/*
 * packing: the study's GpuPacking baseline. In order of preference: a GPU
 * already shared (the fuller the better), then fully free GPUs on a node
 * already in use (fewer of them the better), then an empty node (smaller
 * nodes first). CPU-only pods are placed anywhere they fit.
 */
#include "core.h"

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t packing_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    if (req->gpu_count <= 0)
        return 0;
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int fully_free = 0;
    for (int i = 0; i < n->ngpus; i++)
        fully_free += n->gpus[i].free_milli == KGPU_MILLI;
    /*
     * An empty node: smaller first. The study writes max(33 - k, k), which is
     * 33 - k for its nodes (k <= 16 GPUs) but would rise again beyond 16.
     */
    if (fully_free == n->ngpus)
        return max64(100 / 3 - fully_free, 1);
    /* Which GPUs a tightest-first fill would use, and how many of them are fully free. */
    int gpus[KGPU_MAX_GPUS_PER_NODE];
    if (kgpu__pick_best_fit(n, req, gpus) != 0)
        return 0;
    int free_used = 0;
    int64_t free_pct = 0;
    for (int k = 0; k < req->gpu_count; k++) {
        int left = n->gpus[gpus[k]].free_milli;
        free_used += left == KGPU_MILLI;
        free_pct += left * 100 / KGPU_MILLI;
    }
    if (free_used > 0)
        return max64(100 / 2 - free_used, 100 / 3);
    return max64(100 - free_pct / 10, 100 / 2);
}

const kgpu_policy_ops kgpu__policy_packing = {
    .name = "packing",
    .summary = "shared GPUs first, then free GPUs on busy nodes, then empty nodes",
    .score = packing_score,
    .pick_gpus = kgpu__pick_gpus_best_fit,
};
