/*
 * kgpu: place each pod where the GPU compute that later pods cannot use grows
 * least, judged only from the pods seen so far (see docs/policy.md).
 *
 * The score of a placement, in milli-GPU (higher is better), is
 *
 *     - Δ(frag + stranded) - scarcity + packing
 *
 * - frag: FGD's fragmentation (kgpu_node_frag) against the workload learned
 *   online, not quantised, so that small differences are not collapsed into
 *   ties that a random tie-break would then scatter.
 * - stranded: free GPU compute the node's free CPU cannot serve, at the CPU
 *   per GPU milli the learned workload asks for. FGD sees CPU only as a cliff
 *   (a shape fits or not); this term sees it coming, and sends CPU-only pods
 *   to nodes with CPU to spare instead of to nodes whose GPUs need it.
 * - scarcity: for each GPU milli taken from model M, the share of the GPU
 *   demand seen that only M (and models like it) can serve, divided by M's
 *   share of the cluster's free GPU compute. Unconstrained pods then leave a
 *   model to the pods that need it, the more so the faster it runs out.
 * - packing: a small preference (at most KG_PACK_MILLI) for fuller nodes, so
 *   that equal placements go to nodes already in use and whole nodes stay
 *   free for multi-GPU pods, whatever order ties are broken in.
 *
 * Speed: as fgd, a node's current value is cached against the node's version
 * and so is each (node, pod shape) score without its scarcity term; a
 * placement rescans one node. Scarcity is a per-model rate applied to the
 * cached figure (nodes with several models are not cached), so refreshing it
 * drops nothing; only a new target workload (kgpu_policy_invalidate) does,
 * in O(1) (a new cache generation). The rescan of every node that follows
 * takes fragmentation by parts (kgpu__frag_node_of): O(shapes) per GPU tried.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define KG_SLOTS_MAX   128       /* score cache entries per node (fewer on large clusters) */
#define KG_CACHE_SLOTS (1 << 18) /* total cache entries aimed at for large clusters */
/* One stranded milli is as lost as one fragmented milli. */
#define KG_STRAND_WEIGHT 1.0
/* Packing only breaks near-ties: worth at most this many milli-GPU of fragmentation. */
#define KG_PACK_MILLI 20.0
/* Free GPU compute per model is recounted every this many pods (once constrained pods are seen). */
#define KG_SCARCITY_EVERY 64
/* Shapes of the target considered (the heaviest; a longer tail weighs next to nothing). */
#define KG_MAX_SHAPES 512
/* Nodes whose fragmentation by parts is kept (2 KB each at KG_MAX_SHAPES): at most 32 MB. */
#define KG_PARTS_SLOTS (1 << 14)
/* Scores are kept in micro-GPU: fine enough that only truly equal placements tie. */
#define KG_SCALE 1000.0

typedef struct kg_slot {
    uint64_t version; /* node version + 1; 0 = empty */
    int shape;
    uint32_t gen;  /* kg_state.gen when filled: older ones are stale */
    int gpu;       /* chosen GPU for a single share, -1 otherwise */
    int take;      /* GPU milli the placement takes (of the node's one model) */
    int64_t score; /* without the scarcity term */
} kg_slot;

typedef struct kg_node {
    uint64_t version; /* + 1; 0 = not computed */
    uint32_t gen;     /* kg_state.gen when computed */
    double value;     /* frag + stranded of the node as it is */
} kg_node;

/* A node's fragmentation by parts as kept: valid for node, at version - 1, of table load `load`. */
typedef struct kg_parts_tag {
    uint64_t version; /* node version + 1; 0 = empty */
    uint64_t load;
    int node;
} kg_parts_tag;

typedef struct kg_state {
    const kgpu_workload *target; /* borrowed: learned online by the caller */
    int slots;                   /* cache entries per node, a power of two */
    uint32_t gen;                /* cache generation: entries of another are stale; 0 never valid */
    int cap;                     /* nodes the caches have room for */
    kg_node *nodes;
    kg_slot *cache;                   /* cap x slots */
    double cpu_per_milli;             /* CPU milli the target asks per GPU milli (0: unknown) */
    double scarcity[KGPU_MAX_MODELS]; /* see the file comment; per GPU milli taken */
    uint64_t present;                 /* models in the cluster */
    double free[KGPU_MAX_MODELS];     /* free GPU milli per model at the last count */
    double free_total;
    double demand[KGPU_MAX_MODELS]; /* GPU milli of constrained pods, spread over their models */
    double demand_total;            /* GPU milli of all pods seen */
    bool constrained_seen;
    long pods, pods_at_count;
    /*
     * The free count, kept up to date from the cluster's change journal
     * (kg_count): each node's share of it as last counted, per GPU (free
     * milli if healthy, else 0) at gfree[gstart[i]..gstart[i + 1]), and the
     * sums in integers. Of cluster counted_c with counted_nodes nodes, as of
     * change counted_seq; counted_c NULL: count every node again.
     */
    const kgpu_cluster *counted_c;
    int counted_nodes;
    uint64_t counted_seq;
    int *gstart, *gfree;
    int64_t free_milli[KGPU_MAX_MODELS], free_milli_total;
    kgpu__frag_table table; /* the target's shapes for kgpu__frag_node_of; stale: w NULL */
    int table_ints[KGPU__FRAG_TABLE_INTS(KG_MAX_SHAPES)];
    uint64_t loads; /* times the table was loaded */
    /*
     * Fragmentation by parts of recently scored nodes, direct-mapped by node
     * index (pslots, a power of two; parts NULL: none kept): after a new
     * target, every request shape's first decision rescores the same nodes,
     * and all but the first take the parts from here.
     */
    int pslots;
    kg_parts_tag *ptags;
    int16_t *parts; /* pslots x KGPU__FRAG_SAVED_INTS(KG_MAX_SHAPES) */
} kg_state;

static int kg_grow(kg_state *st, int need)
{
    void *nodes = st->nodes, *cache = st->cache;
    int rc = kgpu__grow_node_cache(&nodes, sizeof(*st->nodes), &cache, sizeof(*st->cache),
                                   st->slots, &st->cap, need);
    st->nodes = nodes;
    st->cache = cache;
    return rc;
}

/* CPU asked per GPU milli by the target workload: what the stranded term measures against. */
static void kg_learn(kg_state *st)
{
    double cpu = 0, gpu = 0;
    for (int s = 0; s < st->target->n; s++) {
        const kgpu_shape *sh = &st->target->shapes[s];
        if (sh->gpu_milli == 0)
            continue;
        cpu += sh->p * (double)sh->cpu_milli;
        gpu += sh->p * (double)sh->gpu_milli * sh->gpu_count;
    }
    st->cpu_per_milli = gpu > 0 ? cpu / gpu : 0;
}

/* Node i's healthy free milli into the integer sums, with sign +1 or -1 (as last counted). */
static void kg_count_node(kg_state *st, const kgpu_node *n, int i, int sign)
{
    for (int g = 0, k = st->gstart[i]; g < n->ngpus; g++, k++) {
        st->free_milli[n->gpus[g].model] += sign * st->gfree[k];
        st->free_milli_total += sign * st->gfree[k];
    }
}

static void kg_note_node(kg_state *st, const kgpu_node *n, int i)
{
    for (int g = 0, k = st->gstart[i]; g < n->ngpus; g++, k++)
        st->gfree[k] = n->gpus[g].healthy ? n->gpus[g].free_milli : 0;
}

/*
 * The integer sums of every node's healthy free milli, from scratch, noting
 * each node's share (when there is room to; otherwise the next count is from
 * scratch again).
 */
static void kg_count_all(kg_state *st, const kgpu_cluster *c)
{
    int nn = kgpu_cluster_node_count(c);
    memset(st->free_milli, 0, sizeof(st->free_milli));
    st->free_milli_total = 0;
    free(st->gstart);
    free(st->gfree);
    st->gstart = malloc(((size_t)nn + 1) * sizeof(*st->gstart));
    size_t gpus = 0;
    for (int i = 0; i < nn; i++)
        gpus += (size_t)kgpu_cluster_node(c, i)->ngpus;
    st->gfree = malloc((gpus > 0 ? gpus : 1) * sizeof(*st->gfree));
    if (st->gstart == NULL || st->gfree == NULL) {
        free(st->gstart);
        free(st->gfree);
        st->gstart = st->gfree = NULL;
        st->counted_c = NULL;
        for (int i = 0; i < nn; i++) {
            const kgpu_node *n = kgpu_cluster_node(c, i);
            for (int g = 0; g < n->ngpus; g++)
                if (n->gpus[g].healthy) {
                    st->free_milli[n->gpus[g].model] += n->gpus[g].free_milli;
                    st->free_milli_total += n->gpus[g].free_milli;
                }
        }
        return;
    }
    st->gstart[0] = 0;
    for (int i = 0; i < nn; i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        st->gstart[i + 1] = st->gstart[i] + n->ngpus;
        kg_note_node(st, n, i);
        kg_count_node(st, n, i, +1);
    }
    st->counted_c = c;
    st->counted_nodes = nn;
    st->counted_seq = kgpu__cluster_seq(c);
}

/*
 * Counts free GPU compute per model and derives each model's scarcity from
 * it. The count follows the cluster's journal: only the nodes changed since
 * the last count are counted again, O(changes) instead of O(GPUs). The sums
 * are integers (far below 2^53), so the doubles are those of adding each
 * GPU's free milli in turn, to the last bit.
 */
static void kg_count(kg_state *st, const kgpu_cluster *c)
{
    int nn = kgpu_cluster_node_count(c);
    uint64_t now = kgpu__cluster_seq(c);
    bool all = st->counted_c != c || st->counted_nodes != nn || st->counted_seq > now ||
               now - st->counted_seq > (uint64_t)nn;
    for (uint64_t k = st->counted_seq + 1; !all && k <= now; k++) {
        int i = kgpu__cluster_changed(c, k);
        if (i < 0 || i >= nn) {
            all = true;
            break;
        }
        const kgpu_node *n = kgpu_cluster_node(c, i);
        kg_count_node(st, n, i, -1);
        kg_note_node(st, n, i);
        kg_count_node(st, n, i, +1);
    }
    if (all)
        kg_count_all(st, c);
    st->counted_seq = now;
    st->free_total = (double)st->free_milli_total;
    for (int m = 0; m < KGPU_MAX_MODELS; m++)
        st->free[m] = (double)st->free_milli[m];
    for (int m = 0; m < KGPU_MAX_MODELS; m++)
        st->scarcity[m] = st->demand_total > 0 && st->free[m] > 0
                              ? st->demand[m] / st->demand_total * st->free_total / st->free[m]
                              : 0;
    st->pods_at_count = st->pods;
}

static void kg_invalidate(void *state)
{
    kg_state *st = state;
    kgpu__cache_new_generation(&st->gen, UINT32_MAX, st->nodes,
                               (size_t)st->cap * sizeof(*st->nodes), st->cache,
                               (size_t)st->cap * (size_t)st->slots * sizeof(*st->cache));
    st->table.w = NULL; /* the target changed in place: read it again */
    kg_learn(st);
}

static int kg_init(void *state, const kgpu_cluster *c, const kgpu_workload *target, kgpu_error *err)
{
    kg_state *st = state;
    if (target == NULL || target->n == 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "kgpu needs a target workload (learned online, or a prior)");
    st->target = target;
    st->gen = 1; /* zeroed entries (gen 0) are empty */
    int nodes = kgpu_cluster_node_count(c);
    st->slots = KG_SLOTS_MAX;
    while (st->slots > 16 && (long)st->slots * nodes > KG_CACHE_SLOTS)
        st->slots /= 2;
    if (kg_grow(st, nodes) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory for kgpu caches");
    st->pslots = 1;
    while (st->pslots < nodes && st->pslots < KG_PARTS_SLOTS)
        st->pslots *= 2;
    st->ptags = calloc((size_t)st->pslots, sizeof(*st->ptags));
    st->parts = malloc((size_t)st->pslots * KGPU__FRAG_SAVED_INTS(KG_MAX_SHAPES) *
                       sizeof(*st->parts));
    if (st->ptags == NULL || st->parts == NULL) { /* a speed-up only: do without */
        free(st->ptags);
        free(st->parts);
        st->ptags = NULL;
        st->parts = NULL;
    }
    for (int i = 0; i < nodes; i++)
        st->present |= kgpu_cluster_node(c, i)->model_mask;
    kg_learn(st);
    kg_count(st, c);
    return 0;
}

static void kg_fini(void *state)
{
    kg_state *st = state;
    free(st->nodes);
    free(st->cache);
    free(st->gstart);
    free(st->gfree);
    free(st->ptags);
    free(st->parts);
}

/*
 * Counts the pod's GPU demand; a pod that allows only some of the cluster's
 * models spreads its demand over them by their free compute. Once such pods
 * have been seen, free compute per model is recounted every
 * KG_SCARCITY_EVERY pods: O(nodes changed since), and no cache is dropped.
 */
static void kg_observe(void *state, const kgpu_cluster *c, const kgpu_request *req)
{
    kg_state *st = state;
    bool first = false;
    st->pods++;
    if (req->gpu_count > 0) {
        double d = (double)kgpu__gpu_demand(req);
        st->demand_total += d;
        uint64_t allowed = req->models & st->present;
        if (allowed != st->present && allowed != 0) {
            double free = 0;
            for (int m = 0; m < KGPU_MAX_MODELS; m++)
                if ((allowed >> m) & 1)
                    free += st->free[m];
            for (int m = 0; m < KGPU_MAX_MODELS; m++)
                if ((allowed >> m) & 1)
                    st->demand[m] +=
                        free > 0 ? d * st->free[m] / free : d / __builtin_popcountll(allowed);
            first = !st->constrained_seen;
            st->constrained_seen = true;
        }
    }
    if (first || (st->constrained_seen && st->pods - st->pods_at_count >= KG_SCARCITY_EVERY))
        kg_count(st, c);
}

static int kg_shapes(const kg_state *st)
{
    return st->target->n < KG_MAX_SHAPES ? st->target->n : KG_MAX_SHAPES;
}

/* frag of a node left with `total` free GPU milli and cpu_after CPU, plus its stranded term. */
static double kg_strand(const kg_state *st, int total, int64_t cpu_after, double frag)
{
    if (total == 0)
        return 0; /* no idle GPU: nothing fragmented, nothing stranded */
    if (st->cpu_per_milli > 0) {
        double served = (double)cpu_after / st->cpu_per_milli;
        double stranded = frag + KG_STRAND_WEIGHT * ((double)total - served);
        frag = served < total ? stranded : frag; /* a select: no branch to mispredict */
    }
    return frag;
}

/*
 * Fragmentation plus stranded GPU milli of the node of b after taking
 * take[k] milli from GPU gpus[k] (k < nchg) and leaving cpu_after CPU: the
 * same figure as kgpu_node_frag on the changed node, plus the stranded term.
 */
static double kg_after(const kg_state *st, const kgpu__frag_node *b, const int *gpus,
                       const int *take, int nchg, int64_t cpu_after)
{
    int total;
    double frag = kgpu__frag_after(b, gpus, take, nchg, cpu_after, &total);
    return kg_strand(st, total, cpu_after, frag);
}

static double current_value(kg_state *st, const kgpu_node *n, int node, const kgpu__frag_node *b)
{
    kg_node *kn = node < st->cap ? &st->nodes[node] : NULL; /* no cache when growth failed */
    if (kn != NULL && kn->version == n->version + 1 && kn->gen == st->gen)
        return kn->value;
    double v = kg_after(st, b, NULL, NULL, 0, n->cpu_free);
    if (kn != NULL) {
        kn->version = n->version + 1;
        kn->gen = st->gen;
        kn->value = v;
    }
    return v;
}

/* How used the node is after the placement, 0..1: GPU and CPU half each (CPU alone without GPUs).
 */
static double used_after(const kgpu_node *n, int idle_after, int64_t cpu_after)
{
    double cu = n->cpu_milli > 0 ? 1.0 - (double)cpu_after / (double)n->cpu_milli : 1.0;
    if (n->ngpus == 0)
        return cu;
    return 0.5 * (1.0 - (double)idle_after / ((double)n->ngpus * KGPU_MILLI)) + 0.5 * cu;
}

/* The scarcity term of taking take[k] milli from GPU gpus[k], in micro-GPU. */
static int64_t kg_scarce(const kg_state *st, const kgpu_node *n, const int *gpus, const int *take,
                         int nchg)
{
    if (nchg == 0)
        return 0;
    if ((n->model_mask & (n->model_mask - 1)) == 0) { /* one model: exactly as kg_cached adds it */
        int total = 0;
        for (int k = 0; k < nchg; k++)
            total += take[k];
        int model = __builtin_ctzll(n->model_mask);
        return (int64_t)llround(st->scarcity[model] * (double)total * KG_SCALE);
    }
    double scarce = 0;
    for (int k = 0; k < nchg; k++)
        scarce += st->scarcity[n->gpus[gpus[k]].model] * (double)take[k];
    return (int64_t)llround(scarce * KG_SCALE);
}

/* The score of a placement without its scarcity term, in micro-GPU. */
static int64_t kg_placement(const kg_state *st, const kgpu_node *n, const kgpu__frag_node *b,
                            double before, const int *gpus, const int *take, int nchg,
                            int64_t cpu_after)
{
    double after = kg_after(st, b, gpus, take, nchg, cpu_after);
    int idle_after = b->total;
    for (int k = 0; k < nchg; k++)
        idle_after -= take[k];
    double s = before - after + KG_PACK_MILLI * used_after(n, idle_after, cpu_after);
    return (int64_t)llround(s * KG_SCALE);
}

/* Node n's fragmentation by parts into *b: kept from an earlier score when it can be. */
static void kg_parts(kg_state *st, const kgpu_node *n, int node, kgpu__frag_node *b)
{
    if (st->parts == NULL) {
        kgpu__frag_node_of(n, &st->table, b);
        return;
    }
    size_t slot = (size_t)node & (size_t)(st->pslots - 1);
    kg_parts_tag *tag = &st->ptags[slot];
    int16_t *saved = st->parts + slot * KGPU__FRAG_SAVED_INTS(KG_MAX_SHAPES);
    if (tag->node == node && tag->version == n->version + 1 && tag->load == st->loads) {
        kgpu__frag_node_restore(n, &st->table, b, saved);
        return;
    }
    kgpu__frag_node_of(n, &st->table, b);
    bool kept = kgpu__frag_node_save(b, saved);
    tag->node = node;
    tag->version = kept ? n->version + 1 : 0;
    tag->load = st->loads;
}

/*
 * Score of req on node n, and for a single GPU share the GPU that earns it
 * (first of the best): a share tries every GPU with room, several or whole
 * GPUs take the tightest that suffice, CPU-only pods just CPU. Also returns
 * the score without scarcity and the GPU milli taken, for the cache.
 */
static int64_t kg_eval(kg_state *st, const kgpu_node *n, int node, const kgpu_request *req,
                       int *gpu_out, int64_t *base_out, int *take_out)
{
    if (!kgpu__frag_table_fresh(&st->table, st->target, kg_shapes(st))) {
        kgpu__frag_table_load(&st->table, st->target, kg_shapes(st), st->table_ints);
        st->loads++; /* the parts kept were of the table before */
    }
    kgpu__frag_node b;
    kg_parts(st, n, node, &b);
    double before = current_value(st, n, node, &b);
    int64_t cpu_after = n->cpu_free - req->cpu_milli;
    *gpu_out = -1;
    *take_out = 0;
    if (req->gpu_count <= 0) {
        *base_out = kg_placement(st, n, &b, before, NULL, NULL, 0, cpu_after);
        return *base_out;
    }
    if (req->gpu_count == 1 && !req->exclusive) {
        /* GPUs of one model with equal free compute score the same: try each value once. */
        int cand[KGPU_MAX_GPUS_PER_NODE], m = kgpu__share_candidates(n, req, cand);
        int idle_after = b.total - req->gpu_milli;
        double packing = KG_PACK_MILLI * used_after(n, idle_after, cpu_after);
        int64_t best = 0, best_base = 0;
        int best_gpu = -1;
        for (int j = 0; j < m; j++) {
            double after = kg_after(st, &b, &cand[j], &req->gpu_milli, 1, cpu_after);
            int64_t base = (int64_t)llround((before - after + packing) * KG_SCALE);
            int64_t s = base - kg_scarce(st, n, &cand[j], &req->gpu_milli, 1);
            bool better = (j == 0) | (s > best); /* the first of the best */
            best = better ? s : best;
            best_base = better ? base : best_base;
            best_gpu = better ? cand[j] : best_gpu;
        }
        if (m > 0) {
            *gpu_out = best_gpu;
            *base_out = best_base;
        }
        *take_out = req->gpu_milli;
        return best;
    }
    int gpus[KGPU_MAX_GPUS_PER_NODE], take[KGPU_MAX_GPUS_PER_NODE];
    if (kgpu__pick_best_fit(n, req, gpus) != 0) {
        *base_out = INT64_MIN / 2;
        return INT64_MIN / 2;
    }
    for (int k = 0; k < req->gpu_count; k++)
        take[k] = req->exclusive ? KGPU_MILLI : req->gpu_milli;
    *base_out = kg_placement(st, n, &b, before, gpus, take, req->gpu_count, cpu_after);
    *take_out = take[0] * req->gpu_count;
    return *base_out - kg_scarce(st, n, gpus, take, req->gpu_count);
}

/*
 * kg_eval through the (node, shape) cache. The cache holds the score without
 * scarcity, which changes without the node changing; a node of one model
 * adds it back from the milli taken. Nodes of several models, where scarcity
 * can change which GPU is best, are evaluated afresh each time.
 */
static int64_t kg_cached(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                         int *gpu_out)
{
    kg_state *st = state;
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int64_t base;
    int take;
    bool one_model = (n->model_mask & (n->model_mask - 1)) == 0;
    if (node >= st->cap && kg_grow(st, kgpu_cluster_node_count(c)) != 0)
        return kg_eval(st, n, node, req, gpu_out, &base, &take); /* no room to cache */
    if (req->shape < 0 || !one_model)
        return kg_eval(st, n, node, req, gpu_out, &base, &take);
    kg_slot *slot = &st->cache[(size_t)node * (size_t)st->slots +
                               ((size_t)req->shape & (size_t)(st->slots - 1))];
    if (slot->version != n->version + 1 || slot->shape != req->shape || slot->gen != st->gen) {
        kg_eval(st, n, node, req, gpu_out, &base, &take);
        slot->version = n->version + 1;
        slot->shape = req->shape;
        slot->gen = st->gen;
        slot->gpu = *gpu_out;
        slot->take = take;
        slot->score = base;
    }
    *gpu_out = slot->gpu;
    if (slot->take == 0 || slot->score == INT64_MIN / 2)
        return slot->score;
    int model = __builtin_ctzll(n->model_mask);
    return slot->score - (int64_t)llround(st->scarcity[model] * (double)slot->take * KG_SCALE);
}

/*
 * For kgpu_policy_select's index: a node of one model M scores its cached
 * figure minus scarcity[M] x the milli taken (kg_cached, and kg_eval alike),
 * so its group is M and the offset that term; a node without GPUs only ever
 * holds CPU-only pods (no term). A node of several models is scored afresh.
 */
static int kg_group(void *state, const kgpu_node *n)
{
    if (n->model_mask == 0)
        return KGPU_MAX_MODELS;
    return (n->model_mask & (n->model_mask - 1)) == 0 ? __builtin_ctzll(n->model_mask) : -1;
}

static int64_t kg_offset(void *state, int group, const kgpu_request *req)
{
    const kg_state *st = state;
    if (group < 0 || group >= KGPU_MAX_MODELS || req->gpu_count <= 0)
        return 0;
    int take = (req->exclusive ? KGPU_MILLI : req->gpu_milli) * req->gpu_count;
    return (int64_t)llround(st->scarcity[group] * (double)take * KG_SCALE);
}

static int64_t kg_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    int gpu;
    return kg_cached(state, c, node, req, &gpu);
}

static int kg_pick(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                   kgpu_rng *rng, int *gpus)
{
    return kgpu__pick_scored(state, c, node, req, kg_cached, gpus);
}

const kgpu_policy_ops kgpu__policy_kgpu = {
    .name = "kgpu",
    .summary = "least growth of fragmented and CPU-stranded GPU, learned online; spares scarce "
               "models; packs",
    .state_size = sizeof(kg_state),
    .init = kg_init,
    .fini = kg_fini,
    .invalidate = kg_invalidate,
    .score = kg_score,
    .pick_gpus = kg_pick,
    .observe = kg_observe,
    .online_only = true,
    .rank_scores = true,
    .group = kg_group,
    .group_offset = kg_offset,
};
