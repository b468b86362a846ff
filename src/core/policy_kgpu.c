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
 * - scarcity: for each GPU milli taken from model M, the fraction of M the
 *   pods that can only run on M (and models like it) have been asking for.
 *   Unconstrained pods then leave scarce models to the pods that need them.
 * - packing: a small preference (at most KG_PACK_MILLI) for fuller nodes, so
 *   that equal placements go to nodes already in use and whole nodes stay
 *   free for multi-GPU pods, whatever order ties are broken in.
 *
 * Speed: as fgd, a node's current value is cached against the node's version
 * and so is each (node, pod shape) score; a placement rescans one node. The
 * learned quantities change only at snapshots (each time the count of pods
 * seen grows by a tenth), which drop the caches.
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
/* Snapshot the learned demand when the count of pods seen has grown by this fraction. */
#define KG_SNAPSHOT_GROWTH 0.10
/* Shapes of the target considered (the heaviest; a longer tail weighs next to nothing). */
#define KG_MAX_SHAPES 512
/* Scores are kept in micro-GPU: fine enough that only truly equal placements tie. */
#define KG_SCALE 1000.0

typedef struct kg_slot {
    uint64_t version; /* node version + 1; 0 = empty */
    int shape;
    int gpu; /* chosen GPU for a single share, -1 otherwise */
    int64_t score;
} kg_slot;

typedef struct kg_node {
    uint64_t version; /* + 1; 0 = not computed */
    double value;     /* frag + stranded of the node as it is */
} kg_node;

typedef struct kg_state {
    const kgpu_workload *target; /* borrowed: learned online by the caller */
    int slots;                   /* cache entries per node, a power of two */
    int cap;                     /* nodes the caches have room for */
    kg_node *nodes;
    kg_slot *cache; /* cap x slots */
    /* Learned at the last snapshot. */
    double cpu_per_milli;               /* CPU milli asked per GPU milli (0: unknown) */
    double scarcity[KGPU_MAX_MODELS];   /* see the file comment */
    /* Counted at every arrival. */
    uint64_t present;                   /* models in the cluster */
    double supply[KGPU_MAX_MODELS];     /* GPUs per model */
    double supply_total;
    double demand[KGPU_MAX_MODELS];     /* GPU milli of constrained pods, spread over their models */
    double demand_total;                /* GPU milli of all pods seen */
    long pods, pods_at_snapshot;
    int lost[KG_MAX_SHAPES], usable[KG_MAX_SHAPES]; /* scratch of kg_base_of */
} kg_state;

static int kg_grow(kg_state *st, int need)
{
    if (need <= st->cap)
        return 0;
    int cap = st->cap ? st->cap : 64;
    while (cap < need)
        cap *= 2;
    kg_node *nodes = realloc(st->nodes, (size_t)cap * sizeof(*nodes));
    if (nodes == NULL)
        return KGPU_ENOMEM;
    st->nodes = nodes;
    kg_slot *cache = realloc(st->cache, (size_t)cap * (size_t)st->slots * sizeof(*cache));
    if (cache == NULL)
        return KGPU_ENOMEM;
    st->cache = cache;
    memset(st->nodes + st->cap, 0, (size_t)(cap - st->cap) * sizeof(*nodes));
    memset(st->cache + (size_t)st->cap * (size_t)st->slots, 0,
           (size_t)(cap - st->cap) * (size_t)st->slots * sizeof(*cache));
    st->cap = cap;
    return 0;
}

/* Takes what the scores depend on from the current workload and counts. */
static void kg_snapshot(kg_state *st)
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
    for (int m = 0; m < KGPU_MAX_MODELS; m++)
        st->scarcity[m] = st->demand_total > 0 && st->supply[m] > 0
                              ? st->demand[m] / st->demand_total * st->supply_total / st->supply[m]
                              : 0;
    st->pods_at_snapshot = st->pods;
}

static void kg_invalidate(void *state)
{
    kg_state *st = state;
    if (st->cap > 0) {
        memset(st->nodes, 0, (size_t)st->cap * sizeof(*st->nodes));
        memset(st->cache, 0, (size_t)st->cap * (size_t)st->slots * sizeof(*st->cache));
    }
    kg_snapshot(st);
}

static int kg_init(void *state, const kgpu_cluster *c, const kgpu_workload *target, kgpu_error *err)
{
    kg_state *st = state;
    if (target == NULL || target->n == 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "kgpu needs a target workload (learned online, or a prior)");
    st->target = target;
    int nodes = kgpu_cluster_node_count(c);
    st->slots = KG_SLOTS_MAX;
    while (st->slots > 16 && (long)st->slots * nodes > KG_CACHE_SLOTS)
        st->slots /= 2;
    if (kg_grow(st, nodes) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory for kgpu caches");
    for (int i = 0; i < nodes; i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        for (int g = 0; g < n->ngpus; g++) {
            st->supply[n->gpus[g].model] += 1;
            st->supply_total += 1;
            st->present |= 1ULL << n->gpus[g].model;
        }
    }
    kg_snapshot(st);
    return 0;
}

static void kg_fini(void *state)
{
    kg_state *st = state;
    free(st->nodes);
    free(st->cache);
}

/*
 * Counts the pod's GPU demand; a pod that allows only some of the cluster's
 * models spreads its demand over them by their supply.
 */
static void kg_observe(void *state, const kgpu_cluster *c, const kgpu_request *req)
{
    kg_state *st = state;
    (void)c;
    st->pods++;
    if (req->gpu_count > 0) {
        double d = (double)kgpu__gpu_demand(req);
        st->demand_total += d;
        uint64_t allowed = req->models & st->present;
        if (allowed != st->present && allowed != 0) {
            double supply = 0;
            for (int m = 0; m < KGPU_MAX_MODELS; m++)
                if ((allowed >> m) & 1)
                    supply += st->supply[m];
            for (int m = 0; m < KGPU_MAX_MODELS; m++)
                if ((allowed >> m) & 1)
                    st->demand[m] += d * st->supply[m] / supply;
        }
    }
    if ((double)(st->pods - st->pods_at_snapshot) >= KG_SNAPSHOT_GROWTH * (double)st->pods_at_snapshot)
        kg_invalidate(st);
}

/*
 * The node as it is, per shape of the target: free milli on GPUs the shape
 * cannot use (lost) and GPUs it can (usable), as kgpu_node_frag counts them.
 * A placement changes one or a few GPUs, so its value follows from these in
 * O(shapes) instead of O(shapes x GPUs) per GPU tried.
 */
typedef struct kg_base {
    int total; /* free milli on healthy GPUs */
} kg_base;

static int kg_shapes(const kg_state *st)
{
    return st->target->n < KG_MAX_SHAPES ? st->target->n : KG_MAX_SHAPES;
}

static void kg_base_of(kg_state *st, const kgpu_node *n, kg_base *b)
{
    const kgpu_workload *w = st->target;
    b->total = 0;
    for (int i = 0; i < n->ngpus; i++)
        b->total += n->gpus[i].healthy ? n->gpus[i].free_milli : 0;
    for (int s = 0; s < kg_shapes(st); s++) {
        const kgpu_shape *sh = &w->shapes[s];
        int lost = 0, usable = 0;
        if (sh->gpu_milli > 0) {
            for (int i = 0; i < n->ngpus; i++) {
                const kgpu_gpu *g = &n->gpus[i];
                int fm = g->healthy ? g->free_milli : 0;
                if (fm >= sh->gpu_milli && ((sh->models >> g->model) & 1))
                    usable++;
                else
                    lost += fm;
            }
        }
        st->lost[s] = lost;
        st->usable[s] = usable;
    }
}

/*
 * Fragmentation plus stranded GPU milli of node n after taking take[k] milli
 * from GPU gpus[k] (k < nchg) and leaving cpu_after CPU: the same figure as
 * kgpu_node_frag on the changed node, plus the stranded term.
 */
static double kg_after(const kg_state *st, const kgpu_node *n, const kg_base *b, const int *gpus,
                       const int *take, int nchg, int64_t cpu_after)
{
    int total = b->total;
    for (int k = 0; k < nchg; k++)
        total -= take[k];
    if (total == 0)
        return 0; /* no idle GPU: nothing fragmented, nothing stranded */
    const kgpu_workload *w = st->target;
    double frag = 0;
    for (int s = 0; s < kg_shapes(st); s++) {
        const kgpu_shape *sh = &w->shapes[s];
        if (sh->gpu_milli == 0 || cpu_after < sh->cpu_milli) {
            frag += sh->p * total; /* CPU-only shape, or the shape cannot run here at all */
            continue;
        }
        int lost = st->lost[s], usable = st->usable[s];
        for (int k = 0; k < nchg; k++) {
            const kgpu_gpu *g = &n->gpus[gpus[k]];
            bool model = (sh->models >> g->model) & 1;
            int was = g->free_milli, now = was - take[k];
            if (model && was >= sh->gpu_milli)
                usable--;
            else
                lost -= was;
            if (model && now >= sh->gpu_milli)
                usable++;
            else
                lost += now;
        }
        frag += sh->p * (usable < sh->gpu_count ? total : lost);
    }
    if (st->cpu_per_milli > 0) {
        double served = (double)cpu_after / st->cpu_per_milli;
        if (served < total)
            frag += KG_STRAND_WEIGHT * ((double)total - served);
    }
    return frag;
}

static double current_value(kg_state *st, const kgpu_node *n, int node, const kg_base *b)
{
    kg_node *kn = node < st->cap ? &st->nodes[node] : NULL; /* no cache when growth failed */
    if (kn != NULL && kn->version == n->version + 1)
        return kn->value;
    double v = kg_after(st, n, b, NULL, NULL, 0, n->cpu_free);
    if (kn != NULL) {
        kn->version = n->version + 1;
        kn->value = v;
    }
    return v;
}

/* How used the node is after the placement, 0..1: GPU and CPU half each (CPU alone without GPUs). */
static double used_after(const kgpu_node *n, int idle_after, int64_t cpu_after)
{
    double cu = n->cpu_milli > 0 ? 1.0 - (double)cpu_after / (double)n->cpu_milli : 1.0;
    if (n->ngpus == 0)
        return cu;
    return 0.5 * (1.0 - (double)idle_after / ((double)n->ngpus * KGPU_MILLI)) + 0.5 * cu;
}

static int64_t kg_placement(const kg_state *st, const kgpu_node *n, const kg_base *b,
                            double before, const int *gpus, const int *take, int nchg,
                            int64_t cpu_after)
{
    double after = kg_after(st, n, b, gpus, take, nchg, cpu_after);
    double scarce = 0;
    int idle_after = b->total;
    for (int k = 0; k < nchg; k++) {
        scarce += st->scarcity[n->gpus[gpus[k]].model] * (double)take[k];
        idle_after -= take[k];
    }
    double s = before - after - scarce + KG_PACK_MILLI * used_after(n, idle_after, cpu_after);
    return (int64_t)llround(s * KG_SCALE);
}

/*
 * Score of req on node n, and for a single GPU share the GPU that earns it
 * (first of the best): a share tries every GPU with room, several or whole
 * GPUs take the tightest that suffice, CPU-only pods just CPU.
 */
static int64_t kg_eval(kg_state *st, const kgpu_node *n, int node, const kgpu_request *req,
                       int *gpu_out)
{
    kg_base b;
    kg_base_of(st, n, &b);
    double before = current_value(st, n, node, &b);
    int64_t cpu_after = n->cpu_free - req->cpu_milli;
    *gpu_out = -1;
    if (req->gpu_count <= 0)
        return kg_placement(st, n, &b, before, NULL, NULL, 0, cpu_after);
    if (req->gpu_count == 1 && !req->exclusive) {
        int64_t best = 0;
        for (int i = 0; i < n->ngpus; i++) {
            if (!kgpu_gpu_usable(n, &n->gpus[i], req))
                continue;
            /* GPUs of one model with equal free compute score the same: try each value once. */
            bool seen = false;
            for (int j = 0; j < i && !seen; j++)
                seen = n->gpus[j].free_milli == n->gpus[i].free_milli &&
                       n->gpus[j].model == n->gpus[i].model && kgpu_gpu_usable(n, &n->gpus[j], req);
            if (seen)
                continue;
            int64_t s = kg_placement(st, n, &b, before, &i, &req->gpu_milli, 1, cpu_after);
            if (*gpu_out < 0 || s > best) {
                best = s;
                *gpu_out = i;
            }
        }
        return best;
    }
    int gpus[KGPU_MAX_GPUS_PER_NODE], take[KGPU_MAX_GPUS_PER_NODE];
    if (kgpu__pick_best_fit(n, req, gpus) != 0)
        return INT64_MIN / 2;
    for (int k = 0; k < req->gpu_count; k++)
        take[k] = req->exclusive ? KGPU_MILLI : req->gpu_milli;
    return kg_placement(st, n, &b, before, gpus, take, req->gpu_count, cpu_after);
}

static int64_t kg_cached(kg_state *st, const kgpu_cluster *c, int node, const kgpu_request *req,
                         int *gpu_out)
{
    const kgpu_node *n = kgpu_cluster_node(c, node);
    if (node >= st->cap && kg_grow(st, kgpu_cluster_node_count(c)) != 0)
        return kg_eval(st, n, node, req, gpu_out); /* no room to cache: still correct */
    if (req->shape < 0)
        return kg_eval(st, n, node, req, gpu_out);
    kg_slot *slot = &st->cache[(size_t)node * (size_t)st->slots +
                               ((size_t)req->shape & (size_t)(st->slots - 1))];
    if (slot->version == n->version + 1 && slot->shape == req->shape) {
        *gpu_out = slot->gpu;
        return slot->score;
    }
    int64_t s = kg_eval(st, n, node, req, gpu_out);
    slot->version = n->version + 1;
    slot->shape = req->shape;
    slot->gpu = *gpu_out;
    slot->score = s;
    return s;
}

static int64_t kg_score(void *state, const kgpu_cluster *c, int node, const kgpu_request *req)
{
    int gpu;
    return kg_cached(state, c, node, req, &gpu);
}

static int kg_pick(void *state, const kgpu_cluster *c, int node, const kgpu_request *req,
                   kgpu_rng *rng, int *gpus)
{
    (void)rng;
    const kgpu_node *n = kgpu_cluster_node(c, node);
    if (req->gpu_count == 1 && !req->exclusive) {
        int gpu;
        kg_cached(state, c, node, req, &gpu);
        if (gpu < 0)
            return KGPU_ENOFIT;
        gpus[0] = gpu;
        return 0;
    }
    return kgpu__pick_best_fit(n, req, gpus);
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
};
