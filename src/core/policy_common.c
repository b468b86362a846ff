/*
 * What the policies share, below every policy_<name>.c: pick_gpus in the
 * shape of kgpu_policy_ops for the policies that take the tightest GPUs or
 * the one their score named, and the per-node score caches (growth, and
 * generations that empty them in O(1)) of the fragmentation policies.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"

int kgpu__pick_gpus_best_fit(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                             kgpu_rng *rng, int *gpus)
{
    return kgpu__pick_best_fit(kgpu_cluster_node(c, node), req, gpus);
}

void kgpu__cache_new_generation(uint32_t *gen, uint32_t max, void *nodes, size_t node_bytes,
                                void *cache, size_t cache_bytes)
{
    if (*gen < max) {
        ++*gen;
        return;
    }
    if (nodes != NULL)
        memset(nodes, 0, node_bytes);
    if (cache != NULL)
        memset(cache, 0, cache_bytes);
    *gen = 1;
}

int kgpu__grow_node_cache(void **nodes, size_t node_size, void **cache, size_t slot_size, int slots,
                          int *cap, int need)
{
    if (need <= *cap)
        return 0;
    int old = *cap, grown = old ? old : 64;
    while (grown < need)
        grown *= 2;
    void *n = realloc(*nodes, (size_t)grown * node_size);
    if (n == NULL)
        return KGPU_ENOMEM;
    *nodes = n;
    void *c = realloc(*cache, (size_t)grown * (size_t)slots * slot_size);
    if (c == NULL)
        return KGPU_ENOMEM;
    *cache = c;
    memset((char *)n + (size_t)old * node_size, 0, (size_t)(grown - old) * node_size);
    memset((char *)c + (size_t)old * (size_t)slots * slot_size, 0,
           (size_t)(grown - old) * (size_t)slots * slot_size);
    *cap = grown;
    return 0;
}

int kgpu__pick_scored(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                      kgpu__scored_fn scored, int *gpus)
{
    if (req->gpu_count == 1 && !req->exclusive) {
        int gpu;
        scored(state, c, node, req, &gpu);
        if (gpu < 0)
            return KGPU_ENOFIT;
        gpus[0] = gpu;
        return 0;
    }
    return kgpu__pick_best_fit(kgpu_cluster_node(c, node), req, gpus);
}
