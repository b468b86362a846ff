/*
 * random: any node that fits, uniformly (the study's Random baseline).
 * Every node scores the same, so the shared selection loop's uniform
 * tie-break is the random choice; shared GPUs are picked at random too.
 */
#include "core.h"

static int64_t random_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    return 0;
}

static int random_pick(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                       kgpu_rng *rng, int *gpus)
{
    return kgpu__pick_random(kgpu_cluster_node(c, node), req, rng, gpus);
}

const kgpu_policy_ops kgpu__policy_random = {
    .name = "random",
    .summary = "any node that fits, uniformly at random",
    .score = random_score,
    .pick_gpus = random_pick,
    .random_ties = true,
};
