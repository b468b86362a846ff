/*
 * fgd: Fragmentation Gradient Descent (ATC '23). Place each pod where the
 * node's fragmentation against the target workload grows least; a GPU share
 * tries each GPU of the node. Scores are quantised exactly as the study's
 * scheduler plugin does (100 x sigmoid(-growth / 1000), truncated), which
 * turns small differences into ties that are then broken at random.
 *
 * Speed: a node's current fragmentation is cached with the node's version,
 * and so is each (node, request shape) score, so a placement rescans only
 * the node it changed. A node is evaluated by parts (kgpu__frag_node_of):
 * each GPU tried costs O(shapes), not O(shapes x GPUs).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/*
 * Score cache entries per node, indexed by shape id modulo the count: 128 for
 * clusters up to 2,048 nodes (no collisions for the trace's shapes), fewer
 * beyond so a 5,000-node cluster's cache stays near 4 MB.
 */
#define FGD_SLOTS_MAX   128
#define FGD_CACHE_SLOTS (1 << 18) /* total slots aimed at for large clusters */

typedef struct fgd_slot {
    uint64_t version; /* node version + 1; 0 = empty */
    int shape;
    int16_t gpu;  /* chosen GPU for a single share, -1 otherwise */
    uint16_t gen; /* fgd_state.gen when filled: older ones are stale */
    int64_t score;
} fgd_slot;

typedef struct fgd_node {
    uint64_t version; /* + 1; 0 = not computed */
    uint16_t gen;     /* fgd_state.gen when computed */
    double frag;
} fgd_node;

typedef struct fgd_state {
    const kgpu_workload *target;
    int slots; /* per node, a power of two */
    int cap;
    uint32_t gen; /* cache generation, at most UINT16_MAX: slots stamp 16 bits to stay 24 bytes */
    fgd_node *nodes;
    fgd_slot *cache;        /* cap x slots */
    kgpu__frag_table table; /* the target's shapes for kgpu__frag_node_of; stale: w NULL */
    int *table_ints;        /* its storage, table_cap shapes' worth */
    int table_cap;
} fgd_state;

static int fgd_grow(fgd_state *st, int need)
{
    void *nodes = st->nodes, *cache = st->cache;
    int rc = kgpu__grow_node_cache(&nodes, sizeof(*st->nodes), &cache, sizeof(*st->cache),
                                   st->slots, &st->cap, need);
    st->nodes = nodes;
    st->cache = cache;
    return rc;
}

static int fgd_init(void *state, const kgpu_cluster *c, const kgpu_workload *target,
                    kgpu_error *err)
{
    fgd_state *st = state;
    if (target == NULL || target->n == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "fgd needs a target workload");
    st->target = target;
    st->gen = 1; /* zeroed entries (gen 0) are empty */
    int nodes = kgpu_cluster_node_count(c);
    st->slots = FGD_SLOTS_MAX;
    while (st->slots > 16 && (long)st->slots * nodes > FGD_CACHE_SLOTS)
        st->slots /= 2;
    if (fgd_grow(st, nodes) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory for fgd caches");
    return 0;
}

static void fgd_fini(void *state)
{
    fgd_state *st = state;
    free(st->nodes);
    free(st->cache);
    free(st->table_ints);
}

static void fgd_invalidate(void *state)
{
    fgd_state *st = state;
    kgpu__cache_new_generation(&st->gen, UINT16_MAX, st->nodes,
                               (size_t)st->cap * sizeof(*st->nodes), st->cache,
                               (size_t)st->cap * (size_t)st->slots * sizeof(*st->cache));
    st->table.w = NULL; /* the target changed in place: read it again */
}

/* The target's shapes in st->table, read again when stale; false when out of memory. */
static bool fgd_table(fgd_state *st)
{
    int n = st->target->n;
    if (kgpu__frag_table_fresh(&st->table, st->target, n))
        return true;
    if (n > st->table_cap) {
        int *ints = realloc(st->table_ints, KGPU__FRAG_TABLE_INTS(n) * sizeof(*ints));
        if (ints == NULL)
            return false;
        st->table_ints = ints;
        st->table_cap = n;
    }
    kgpu__frag_table_load(&st->table, st->target, n, st->table_ints);
    return true;
}

/* The study's score: 100 x sigmoid((before - after) / 1000), truncated to an integer. */
static int64_t quantise(double before, double after)
{
    double x = (before - after) / 1000.0;
    return (int64_t)(100.0 / (1.0 + exp(-x)));
}

/*
 * kgpu_node_frag of n after taking `take` milli from GPU gpus[k] (k < nchg)
 * and leaving cpu_after CPU: by parts through b, or afresh when there is no
 * b (no memory for the shape table). The same figure either way.
 */
static double fgd_after(const fgd_state *st, const kgpu_node *n, const kgpu__frag_node *b,
                        const int *gpus, int take, int nchg, int64_t cpu_after)
{
    if (b != NULL) { /* kgpu_node_frag reads a negative CPU figure as the node's own */
        int takes[KGPU_MAX_GPUS_PER_NODE];
        for (int k = 0; k < nchg; k++)
            takes[k] = take;
        return kgpu__frag_after(b, gpus, nchg > 0 ? takes : NULL, nchg,
                                cpu_after < 0 ? n->cpu_free : cpu_after, NULL);
    }
    int free_after[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < n->ngpus; i++)
        free_after[i] = n->gpus[i].free_milli;
    for (int k = 0; k < nchg; k++)
        free_after[gpus[k]] -= take;
    return kgpu_node_frag(n, st->target, free_after, cpu_after);
}

static double current_frag(fgd_state *st, const kgpu_node *n, int node, const kgpu__frag_node *b)
{
    fgd_node *fn = node < st->cap ? &st->nodes[node] : NULL; /* no cache when growth failed */
    if (fn != NULL && fn->version == n->version + 1 && fn->gen == st->gen)
        return fn->frag;
    double f = fgd_after(st, n, b, NULL, 0, 0, n->cpu_free);
    if (fn != NULL) {
        fn->version = n->version + 1;
        fn->gen = st->gen;
        fn->frag = f;
    }
    return f;
}

/*
 * Score of req on node n, and for a single GPU share the GPU that earns it
 * (first of the best). Mirrors the study: a share tries every GPU with room;
 * anything else takes the least-free GPUs that suffice, CPU-only pods just CPU.
 */
static int64_t fgd_eval(fgd_state *st, const kgpu_node *n, int node, const kgpu_request *req,
                        int *gpu_out)
{
    kgpu__frag_node parts, *b = NULL;
    if (fgd_table(st)) {
        kgpu__frag_node_of(n, &st->table, &parts);
        b = &parts;
    }
    double before = current_frag(st, n, node, b);
    int64_t cpu_after = n->cpu_free - req->cpu_milli;
    *gpu_out = -1;
    if (req->gpu_count <= 0)
        return quantise(before, fgd_after(st, n, b, NULL, 0, 0, cpu_after));
    if (req->gpu_count == 1 && !req->exclusive) {
        /* GPUs with equal free compute give equal scores: evaluate each value once. */
        int cand[KGPU_MAX_GPUS_PER_NODE], m = kgpu__share_candidates(n, req, cand);
        int64_t best = 0;
        for (int j = 0; j < m; j++) {
            int64_t s =
                quantise(before, fgd_after(st, n, b, &cand[j], req->gpu_milli, 1, cpu_after));
            if (*gpu_out < 0 || s > best) {
                best = s;
                *gpu_out = cand[j];
            }
        }
        return best;
    }
    int gpus[KGPU_MAX_GPUS_PER_NODE];
    if (kgpu__pick_best_fit(n, req, gpus) != 0)
        return INT64_MIN / 2;
    int take = req->exclusive ? KGPU_MILLI : req->gpu_milli;
    return quantise(before, fgd_after(st, n, b, gpus, take, req->gpu_count, cpu_after));
}

static int64_t fgd_cached(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                          int *gpu_out)
{
    fgd_state *st = state;
    const kgpu_node *n = kgpu_cluster_node(c, node);
    if (node >= st->cap && fgd_grow(st, kgpu_cluster_node_count(c)) != 0)
        return fgd_eval(st, n, node, req, gpu_out); /* no room to cache: still correct */
    if (req->shape < 0)
        return fgd_eval(st, n, node, req, gpu_out);
    fgd_slot *slot = &st->cache[(size_t)node * (size_t)st->slots +
                                ((size_t)req->shape & (size_t)(st->slots - 1))];
    if (slot->version == n->version + 1 && slot->shape == req->shape && slot->gen == st->gen) {
        *gpu_out = slot->gpu;
        return slot->score;
    }
    int64_t s = fgd_eval(st, n, node, req, gpu_out);
    slot->version = n->version + 1;
    slot->shape = req->shape;
    slot->gen = st->gen;
    slot->gpu = (int16_t)*gpu_out;
    slot->score = s;
    return s;
}

static int64_t fgd_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    int gpu;
    return fgd_cached(state, c, node, req, &gpu);
}

static int fgd_pick(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                    kgpu_rng *rng, int *gpus)
{
    return kgpu__pick_scored(state, c, node, req, fgd_cached, gpus);
}

const kgpu_policy_ops kgpu__policy_fgd = {
    .name = "fgd",
    .summary = "fragmentation gradient descent: least growth of expected GPU fragmentation",
    .state_size = sizeof(fgd_state),
    .init = fgd_init,
    .fini = fgd_fini,
    .invalidate = fgd_invalidate,
    .score = fgd_score,
    .pick_gpus = fgd_pick,
};
