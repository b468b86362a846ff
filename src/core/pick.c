/*
 * The common ways of choosing GPUs on a node for a request that fits it:
 * tightest first (best fit), emptiest first, or at random. The placement
 * search (place.c) and the policies both choose with these: they sit below
 * the cluster and know only the node.
 */
#include <stdbool.h>

#include "core.h"

/*
 * Picks req->gpu_count usable GPUs of n among those allowed by `only`
 * (a NUMA node id, or INT32_MIN for any): whole GPUs in index order, shares
 * tightest (or, with `loosest`, emptiest) first. Returns the total free milli
 * of the chosen GPUs through *free_sum, or KGPU_ENOFIT.
 */
static int pick_in(const kgpu_node *n, const kgpu_request *req, int only, bool loosest, int *gpus,
                   long *free_sum)
{
    bool used[KGPU_MAX_GPUS_PER_NODE] = {false};
    *free_sum = 0;
    for (int k = 0; k < req->gpu_count; k++) {
        int best = -1;
        for (int i = 0; i < n->ngpus; i++) {
            const kgpu_gpu *g = &n->gpus[i];
            if (used[i] || (only != INT32_MIN && g->numa != only) || !kgpu_gpu_usable(n, g, req))
                continue;
            if (best < 0) {
                best = i;
                if (req->exclusive)
                    break; /* whole GPUs: first untouched in index order */
                continue;
            }
            const kgpu_gpu *b = &n->gpus[best];
            bool better =
                loosest
                    ? g->free_milli > b->free_milli || (g->free_milli == b->free_milli &&
                                                        g->free_memory_mib > b->free_memory_mib)
                    : g->free_milli < b->free_milli || (g->free_milli == b->free_milli &&
                                                        g->free_memory_mib < b->free_memory_mib);
            if (better)
                best = i;
        }
        if (best < 0)
            return KGPU_ENOFIT;
        used[best] = true;
        gpus[k] = best;
        *free_sum += n->gpus[best].free_milli;
    }
    return 0;
}

/*
 * A request for several GPUs prefers GPUs of one NUMA node: among the NUMA
 * nodes that alone can serve it, the one its fill leaves tightest (loosest
 * for spread). Without NUMA information, or when no single NUMA node
 * suffices, any GPUs of the node.
 */
static int pick(const kgpu_node *n, const kgpu_request *req, bool loosest, int *gpus)
{
    if (req->gpu_count > 1) {
        int best_numa = INT32_MIN;
        long best_sum = 0;
        int tried[KGPU_MAX_GPUS_PER_NODE], ntried = 0;
        for (int i = 0; i < n->ngpus; i++) {
            int numa = n->gpus[i].numa;
            bool seen = numa < 0;
            for (int j = 0; j < ntried && !seen; j++)
                seen = tried[j] == numa;
            if (seen)
                continue;
            tried[ntried++] = numa;
            int cand[KGPU_MAX_GPUS_PER_NODE];
            long sum;
            if (pick_in(n, req, numa, loosest, cand, &sum) != 0)
                continue;
            if (best_numa == INT32_MIN || (loosest ? sum > best_sum : sum < best_sum)) {
                best_numa = numa;
                best_sum = sum;
            }
        }
        if (best_numa != INT32_MIN)
            return pick_in(n, req, best_numa, loosest, gpus, &best_sum);
    }
    long sum;
    return pick_in(n, req, INT32_MIN, loosest, gpus, &sum);
}

int kgpu__pick_best_fit(const kgpu_node *n, const kgpu_request *req, int *gpus)
{
    return pick(n, req, false, gpus);
}

int kgpu__pick_loosest(const kgpu_node *n, const kgpu_request *req, int *gpus)
{
    return pick(n, req, true, gpus);
}

int kgpu__share_candidates(const kgpu_node *n, const kgpu_request *req, int *cand)
{
    /*
     * Without branches: which GPUs qualify follows no pattern a predictor
     * learns. Each GPU against those before it, from compact copies.
     */
    int ng = n->ngpus, m = 0;
    int ok[KGPU_MAX_GPUS_PER_NODE], milli[KGPU_MAX_GPUS_PER_NODE], model[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ng; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        ok[i] = kgpu__share_usable(g, req);
        milli[i] = g->free_milli;
        model[i] = g->model;
    }
    for (int i = 0; i < ng; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= ok[j] & (milli[j] == milli[i]) & (model[j] == model[i]);
        cand[m] = i;
        m += ok[i] & !seen;
    }
    return m;
}

int kgpu__pick_random(const kgpu_node *n, const kgpu_request *req, kgpu_rng *rng, int *gpus)
{
    if (req->exclusive)
        return kgpu__pick_best_fit(n, req, gpus);
    int cand[KGPU_MAX_GPUS_PER_NODE], nc = 0;
    for (int i = 0; i < n->ngpus; i++)
        if (kgpu_gpu_usable(n, &n->gpus[i], req))
            cand[nc++] = i;
    if (nc < req->gpu_count)
        return KGPU_ENOFIT;
    /* Partial Fisher-Yates: a uniform random subset, in random order. */
    for (int k = 0; k < req->gpu_count; k++) {
        int j = k + (int)kgpu_rng_below(rng, (uint64_t)(nc - k));
        int t = cand[k];
        cand[k] = cand[j];
        cand[j] = t;
        gpus[k] = cand[k];
    }
    return 0;
}
