/*
 * Many clusters in the study's method (include/kgpu/multisim.h). The
 * clusters are node sets of one cluster object: every dispatcher places
 * with the same policy, only over the nodes of the cluster it chose
 * (kgpu_policy_select takes the node set), so what differs between them is
 * the dispatching alone.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/estimate.h"
#include "kgpu/multisim.h"

static const char *const names[KGPU_DISPATCH_COUNT] = {
    "one", "kgpu", "all-at-once", "incremental", "static", "kgpu-separate"};

const char *kgpu_dispatcher_name(kgpu_dispatcher d)
{
    return d >= 0 && d < KGPU_DISPATCH_COUNT ? names[d] : "?";
}

int kgpu_dispatcher_find(const char *name)
{
    for (int i = 0; i < KGPU_DISPATCH_COUNT; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

#define INCREMENTAL_ROUND 3 /* clusters MultiKueue's incremental dispatcher adds per round */
/* The static table's workload classes: CPU only, shares by tenths of a GPU, 1..32 whole GPUs. */
#define TABLE_CLASSES (11 + KGPU_MAX_GPUS_PER_NODE)

typedef struct run {
    const kgpu_sim_input *in;
    const kgpu_multisim_split *split;
    const kgpu_multisim_config *cfg;
    kgpu_cluster *c;
    kgpu_policy *p;
    int *nodes[KGPU_MULTISIM_CLUSTERS]; /* node indices of each cluster */
    int nnodes[KGPU_MULTISIM_CLUSTERS];
    int *all; /* every node of some cluster */
    int nall;
    int64_t quota[KGPU_MULTISIM_CLUSTERS], used[KGPU_MULTISIM_CLUSTERS];
    /* With quota_per_model: each cluster's quota and use per GPU model (a flavor each). */
    int64_t mquota[KGPU_MULTISIM_CLUSTERS][KGPU_MAX_MODELS];
    int64_t mused[KGPU_MULTISIM_CLUSTERS][KGPU_MAX_MODELS];
    /* The static table: per request class (table_class), the model and the cluster. */
    int table_model[TABLE_CLASSES], table_cluster[TABLE_CLASSES];
    int64_t model_gpus[KGPU_MAX_MODELS]; /* GPUs of each model over every cluster */
    int most_of[KGPU_MAX_MODELS];        /* the cluster holding most GPUs of each model */
    kgpu_rng srng, drng;
} run;

/*
 * The static table's class of a request: -1 when its own model constraint
 * decides; 0 CPU only; 1..10 shares by tenths of a GPU; 10 + n, n whole GPUs.
 */
static int table_class(const kgpu_request *req, uint64_t present)
{
    if (req->gpu_count <= 0)
        return 0;
    if ((req->models & present) != present)
        return -1;
    if (!req->exclusive && req->gpu_milli < KGPU_MILLI)
        return 1 + req->gpu_milli * 10 / KGPU_MILLI;
    return req->gpu_count <= KGPU_MAX_GPUS_PER_NODE ? 10 + req->gpu_count : 0;
}

/* The model with the most GPUs in `left` among `models`; -1 when none. */
static int most_gpus_model(uint64_t models, const int64_t *left)
{
    int best = -1;
    for (int m = 0; m < KGPU_MAX_MODELS; m++)
        if (((models >> m) & 1) && left[m] > 0 && (best < 0 || left[m] > left[best]))
            best = m;
    return best;
}

/* Per model, its GPUs and the cluster holding most of them. */
static void count_models(run *r)
{
    long per[KGPU_MULTISIM_CLUSTERS][KGPU_MAX_MODELS];
    memset(per, 0, sizeof(per));
    for (int k = 0; k < r->split->nclusters; k++)
        for (int i = 0; i < r->nnodes[k]; i++) {
            const kgpu_node *node = kgpu_cluster_node(r->c, r->nodes[k][i]);
            for (int g = 0; g < node->ngpus; g++)
                per[k][node->gpus[g].model]++;
        }
    for (int m = 0; m < KGPU_MAX_MODELS; m++) {
        r->most_of[m] = -1;
        r->model_gpus[m] = 0;
        for (int k = 0; k < r->split->nclusters; k++) {
            r->model_gpus[m] += per[k][m] * KGPU_MILLI;
            if (per[k][m] > 0 && (r->most_of[m] < 0 || per[k][m] > per[r->most_of[m]][m]))
                r->most_of[m] = k;
        }
    }
}

/*
 * The users' table, made as well as a static table can be: each workload
 * class, largest total demand in the pod file first, to the GPU pool (one
 * model in one cluster) with the most compute not yet given to a class.
 */
static void build_table(run *r, uint64_t present)
{
    int64_t demand[TABLE_CLASSES] = {0};
    int64_t left[KGPU_MULTISIM_CLUSTERS][KGPU_MAX_MODELS];
    memset(left, 0, sizeof(left));
    for (size_t i = 0; i < r->in->nrequests; i++) {
        int cl = table_class(&r->in->requests[i], present);
        if (cl > 0)
            demand[cl] += kgpu__gpu_demand(&r->in->requests[i]);
    }
    for (int k = 0; k < r->split->nclusters; k++)
        for (int i = 0; i < r->nnodes[k]; i++) {
            const kgpu_node *node = kgpu_cluster_node(r->c, r->nodes[k][i]);
            for (int g = 0; g < node->ngpus; g++)
                left[k][node->gpus[g].model] += KGPU_MILLI;
        }
    bool done[TABLE_CLASSES] = {false};
    for (int cl = 0; cl < TABLE_CLASSES; cl++)
        r->table_model[cl] = r->table_cluster[cl] = -1;
    for (;;) {
        int cl = -1;
        for (int k = 1; k < TABLE_CLASSES; k++)
            if (!done[k] && demand[k] > 0 && (cl < 0 || demand[k] > demand[cl]))
                cl = k;
        if (cl < 0)
            break;
        done[cl] = true;
        int bk = -1, bm = -1;
        for (int k = 0; k < r->split->nclusters; k++)
            for (int m = 0; m < KGPU_MAX_MODELS; m++)
                if (((present >> m) & 1) && (bk < 0 || left[k][m] > left[bk][bm])) {
                    bk = k;
                    bm = m;
                }
        if (bk < 0)
            continue;
        r->table_model[cl] = bm;
        r->table_cluster[cl] = bk;
        left[bk][bm] -= demand[cl];
    }
}

/* Places req on cluster k (all clusters: k < 0) with the policy; 0 or KGPU_ENOFIT. */
static int place_in(run *r, const kgpu_request *req, int k, kgpu_assignment *a, kgpu_error *err)
{
    int node, gpus[KGPU_MAX_GPUS_PER_NODE];
    const int *set = k < 0 ? r->all : r->nodes[k];
    int n = k < 0 ? r->nall : r->nnodes[k];
    if (n == 0)
        return KGPU_ENOFIT;
    int rc = kgpu_policy_select(r->p, r->c, req, set, n, &r->srng, &node, gpus, err);
    return rc == 0 ? kgpu_cluster_apply(r->c, req, node, gpus, a, err) : rc;
}

/* Price per hour of what a (on c) takes: its GPUs, shares by their fraction, at their model's. */
static double placement_price(const kgpu_cluster *c, const double *price,
                              const kgpu_request *req, const kgpu_assignment *a)
{
    if (price == NULL || a->ngpus == 0)
        return 0;
    const kgpu_node *n = kgpu_cluster_node(c, a->node);
    double per = req->exclusive ? 1.0 : req->gpu_milli / (double)KGPU_MILLI;
    double sum = 0;
    for (int i = 0; i < a->ngpus; i++)
        sum += per * price[n->gpus[a->gpus[i]].model];
    return sum;
}

/* What a run counts of its arrivals, whichever way they were dispatched. */
typedef struct tally {
    int64_t capacity, arrived, allocated; /* GPU milli */
    bool at100;                           /* arrivals have reached the capacity */
} tally;

/* One arrival, placed or failed: counted, and the allocation when 100 % had arrived. */
static void tally_arrival(tally *t, kgpu_multisim_result *out, const kgpu_request *req,
                          bool placed)
{
    int64_t demand = kgpu__gpu_demand(req);
    out->pods++;
    t->arrived += demand;
    if (placed) {
        t->allocated += demand;
    } else {
        out->pods_failed++;
        out->gpu_pods_failed += req->gpu_count > 0;
    }
    if (!t->at100 && t->arrived >= t->capacity) {
        out->alloc_pct_100 =
            t->capacity > 0 ? 100.0 * (double)t->allocated / (double)t->capacity : 0;
        t->at100 = true;
    }
}

/* After the last arrival. */
static void tally_finish(const tally *t, kgpu_multisim_result *out)
{
    out->alloc_pct_final = t->capacity > 0 ? 100.0 * (double)t->allocated / (double)t->capacity : 0;
    out->allocated_gpus = (double)t->allocated / KGPU_MILLI;
    if (!t->at100)
        out->alloc_pct_100 = out->alloc_pct_final;
}

/*
 * kgpu-dispatcher's choice into *k: each cluster's estimate of one copy (its
 * best place, the policy's score of it, the fragmentation and price of
 * taking it), ranked by kgpu_dispatch_rank.
 */
static int dispatch_kgpu(run *r, const kgpu_request *req, int *k_out, kgpu_error *err)
{
    kgpu_dispatch_candidate cand[KGPU_MULTISIM_CLUSTERS];
    int ncl = r->split->nclusters;
    for (int k = 0; k < ncl; k++) {
        cand[k] = (kgpu_dispatch_candidate){.name = r->split->names[k], .reachable = true,
                                            .pref = -1};
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        if (r->nnodes[k] == 0)
            continue;
        int rc = kgpu_policy_select(r->p, r->c, req, r->nodes[k], r->nnodes[k], &r->srng, &node,
                                    gpus, err);
        if (rc == KGPU_ENOFIT)
            continue;
        if (rc != 0)
            return rc;
        cand[k].scored = true;
        cand[k].score = (double)kgpu_policy_score(r->p, r->c, node, req);
        const kgpu_node *n = kgpu_cluster_node(r->c, node);
        double before = kgpu_node_frag(n, &r->in->target, NULL, -1);
        kgpu_assignment a;
        if ((rc = kgpu_cluster_apply(r->c, req, node, gpus, &a, err)) != 0)
            return rc;
        cand[k].frag_added = kgpu_node_frag(n, &r->in->target, NULL, -1) - before;
        cand[k].price = placement_price(r->c, r->cfg->price, req, &a);
        if ((rc = kgpu_cluster_release(r->c, &a, err)) != 0)
            return rc;
        cand[k].fit = 1;
    }
    int order[KGPU_MULTISIM_CLUSTERS];
    if (kgpu_dispatch_rank(cand, ncl, 1, order) == 0)
        return KGPU_ENOFIT;
    *k_out = order[0];
    return 0;
}

/*
 * The flavor cluster k's Kueue would admit req against: one flavor for every
 * model (-1, when the quota has room), or with a flavor per model the first
 * model req allows that has room (its id). -2: no room.
 */
static int admitting_flavor(const run *r, int k, const kgpu_request *req, int64_t need)
{
    if (r->nnodes[k] == 0)
        return -2;
    if (!r->cfg->quota_per_model || req->gpu_count <= 0)
        return r->used[k] + need <= r->quota[k] ? -1 : -2;
    for (int m = 0; m < KGPU_MAX_MODELS; m++)
        if (((req->models >> m) & 1) && r->mquota[k][m] > 0 &&
            r->mused[k][m] + need <= r->mquota[k][m])
            return m;
    return -2;
}

/*
 * MultiKueue's choice into *k (and the flavor admitting it into *m): a
 * uniform draw among the clusters of the first window (of `window`
 * clusters by name) that has one whose Kueue admits it.
 */
static int dispatch_quota(run *r, const kgpu_request *req, int window, int *k_out, int *m_out)
{
    int64_t need = kgpu__gpu_demand(req);
    int ncl = r->split->nclusters;
    for (int from = 0; from < ncl; from += window) {
        int ok[KGPU_MULTISIM_CLUSTERS], fl[KGPU_MULTISIM_CLUSTERS], n = 0;
        for (int k = from; k < ncl && k < from + window; k++) {
            int m = admitting_flavor(r, k, req, need);
            if (m >= -1) {
                fl[n] = m;
                ok[n++] = k;
            }
        }
        if (n > 0) {
            int pick = (int)kgpu_rng_below(&r->drng, (uint64_t)n);
            *k_out = ok[pick];
            *m_out = fl[pick];
            return 0;
        }
    }
    return KGPU_ENOFIT;
}

static void run_free(run *r)
{
    for (int k = 0; k < KGPU_MULTISIM_CLUSTERS; k++)
        free(r->nodes[k]);
    free(r->all);
    kgpu_policy_free(r->p);
    kgpu_cluster_free(r->c);
}

/*
 * KGPU_DISPATCH_KGPU_SEPARATE: every cluster a cluster object of its own
 * (model ids kept, so the requests' masks stay true), with its own policy
 * and learner that see only the pods sent to it, as separately deployed
 * kgpus do; the candidates come from kgpu_estimate_shape, as the extender's
 * /estimate computes them, and are ranked by kgpu_dispatch_rank.
 */
typedef struct sep {
    kgpu_cluster *c[KGPU_MULTISIM_CLUSTERS];
    kgpu_policy *p[KGPU_MULTISIM_CLUSTERS];
    kgpu_learner *l[KGPU_MULTISIM_CLUSTERS];
    uint32_t *rank[KGPU_MULTISIM_CLUSTERS];
} sep;

static void sep_free(sep *s, int n)
{
    for (int k = 0; k < n; k++) {
        kgpu_policy_free(s->p[k]);
        kgpu_learner_free(s->l[k]);
        kgpu_cluster_free(s->c[k]);
        free(s->rank[k]);
    }
}

/* Cluster k of s: the nodes of `full` in cluster k, ties in rank's order. */
static int sep_build(sep *s, int k, const kgpu_sim_input *in, const kgpu_multisim_split *split,
                     const char *policy, const uint32_t *rank, kgpu_error *err)
{
    const kgpu_cluster *full = in->cluster;
    int nn = kgpu_cluster_node_count(full), rc = 0, j = 0;
    if ((s->c[k] = kgpu_cluster_new()) == NULL ||
        (s->rank[k] = malloc(sizeof(uint32_t) * (size_t)(nn + 1))) == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int m = 0; m < kgpu_cluster_model_count(full); m++) {
        const char *name = kgpu_cluster_model_name(full, m);
        if (strcmp(name, "?") != 0 && (rc = kgpu_cluster_model_put(s->c[k], m, name)) != 0)
            return kgpu_error_set(err, rc, "model table: %s", name);
    }
    for (int i = 0; i < nn && rc == 0; i++) {
        if (split->cluster_of[i] != k)
            continue;
        const kgpu_node *n = kgpu_cluster_node(full, i);
        kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
        for (int q = 0; q < n->ngpus; q++)
            g[q] = (kgpu_gpu_spec){.index = n->gpus[q].index,
                                   .uuid = n->gpus[q].uuid,
                                   .model = kgpu_cluster_model_name(full, n->gpus[q].model),
                                   .memory_mib = n->gpus[q].memory_mib,
                                   .numa = n->gpus[q].numa,
                                   .healthy = n->gpus[q].healthy};
        kgpu_node_spec spec = {.name = n->name,
                               .cpu_milli = n->cpu_milli,
                               .memory_mib = n->memory_mib,
                               .labels = n->labels,
                               .nlabels = n->nlabels,
                               .gpus = g,
                               .ngpus = n->ngpus};
        int added = kgpu_cluster_add_node(s->c[k], &spec, err); /* the node's index, or < 0 */
        rc = added < 0 ? added : 0;
        s->rank[k][j++] = rank[i];
    }
    bool online = false;
    if (rc == 0 && (rc = kgpu__policy_open(policy, false, s->c[k], &in->target, &s->p[k],
                                           &s->l[k], &online, err)) == 0)
        kgpu_policy_set_tie_order(s->p[k], s->rank[k], j);
    return rc;
}

static int run_separate(const kgpu_sim_input *in, const kgpu_multisim_split *split,
                        const kgpu_multisim_config *cfg, kgpu_multisim_result *out,
                        kgpu_error *err)
{
    sep s;
    memset(&s, 0, sizeof(s));
    size_t *order = NULL, len = 0;
    int ncl = split->nclusters, nn = kgpu_cluster_node_count(in->cluster);
    uint32_t *rank = malloc(sizeof(*rank) * (size_t)(nn + 1));
    int rc = rank == NULL ? kgpu_error_set(err, KGPU_ENOMEM, "out of memory") : 0;
    if (rc == 0)
        rc = kgpu_sim_workload(in, cfg->seed, cfg->inflate, &order, &len, err);
    if (rc == 0)
        rc = kgpu_sim_tie_order(in, cfg->seed, cfg->inflate, rank, err);
    for (int k = 0; k < ncl && rc == 0; k++)
        rc = sep_build(&s, k, in, split, cfg->policy, rank, err);
    tally t = {0};
    for (int k = 0; k < ncl && rc == 0; k++)
        t.capacity += (int64_t)kgpu_cluster_gpu_count(s.c[k]) * KGPU_MILLI;
    kgpu_rng srng, erng;
    kgpu_rng_seed(&srng, cfg->seed, 2);
    kgpu_rng_seed(&erng, cfg->seed, 4);
    for (size_t i = 0; i < len && rc == 0; i++) {
        const kgpu_request *req = &in->requests[order[i]];
        int64_t demand = kgpu__gpu_demand(req);
        kgpu_dispatch_candidate cand[KGPU_MULTISIM_CLUSTERS];
        int rk[KGPU_MULTISIM_CLUSTERS];
        for (int k = 0; k < ncl && rc == 0; k++) {
            kgpu_estimate e;
            memset(&e, 0, sizeof(e)); /* read below even when the estimate failed */
            const kgpu_workload *w = s.l[k] ? kgpu_learner_workload(s.l[k]) : &in->target;
            rc = kgpu_estimate_shape(s.c[k], s.p[k], w, NULL, 0, req, 1, &erng, &e, err);
            double price = 0;
            if (rc == 0 && cfg->price != NULL && e.first_model >= 0 && req->gpu_count > 0)
                price = (double)demand / KGPU_MILLI * cfg->price[e.first_model];
            cand[k] = (kgpu_dispatch_candidate){.name = split->names[k],
                                                .reachable = true,
                                                .fit = rc == 0 ? e.fit : 0,
                                                .pref = -1,
                                                .scored = rc == 0 && e.fit > 0,
                                                .score = rc == 0 ? (double)e.score : 0,
                                                .frag_added = e.frag_first - e.frag_before,
                                                .price = price};
        }
        if (rc != 0)
            break;
        int k = kgpu_dispatch_rank(cand, ncl, 1, rk) > 0 ? rk[0] : -1;
        int prc = KGPU_ENOFIT;
        kgpu_assignment a;
        if (k >= 0 && (rc = kgpu__policy_learn(s.p[k], s.l[k], s.c[k], req, err)) == 0) {
            int node, gpus[KGPU_MAX_GPUS_PER_NODE];
            prc = kgpu_policy_select(s.p[k], s.c[k], req, NULL, 0, &srng, &node, gpus, err);
            if (prc == 0)
                prc = kgpu_cluster_apply(s.c[k], req, node, gpus, &a, err);
        }
        if (rc != 0)
            break;
        if (prc != 0 && prc != KGPU_ENOFIT) {
            rc = prc;
            break;
        }
        if (prc == 0) {
            out->per_cluster[k]++;
            out->cost_per_hour += placement_price(s.c[k], cfg->price, req, &a);
        }
        tally_arrival(&t, out, req, prc == 0);
    }
    if (rc == 0)
        tally_finish(&t, out);
    sep_free(&s, ncl);
    free(order);
    free(rank);
    return rc;
}

int kgpu_multisim_run(const kgpu_sim_input *in, const kgpu_multisim_split *split,
                      const kgpu_multisim_config *cfg, kgpu_multisim_result *out,
                      kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (split->nclusters < 1 || split->nclusters > KGPU_MULTISIM_CLUSTERS)
        return kgpu_error_set(err, KGPU_EINVAL, "%d clusters, not 1..%d", split->nclusters,
                              KGPU_MULTISIM_CLUSTERS);
    if (cfg->dispatcher < 0 || cfg->dispatcher >= KGPU_DISPATCH_COUNT)
        return kgpu_error_set(err, KGPU_EINVAL, "dispatcher %d unknown", (int)cfg->dispatcher);
    if (cfg->dispatcher == KGPU_DISPATCH_KGPU_SEPARATE)
        return run_separate(in, split, cfg, out, err);
    run r = {.in = in, .split = split, .cfg = cfg};
    size_t *order = NULL, len = 0;
    uint32_t *rank = NULL;
    kgpu_learner *learner = NULL;
    int rc = kgpu_sim_workload(in, cfg->seed, cfg->inflate, &order, &len, err);
    if (rc != 0)
        return rc;
    r.c = kgpu_cluster_clone(in->cluster);
    int nn = r.c != NULL ? kgpu_cluster_node_count(r.c) : 0;
    rank = malloc(sizeof(*rank) * (size_t)(nn + 1));
    r.all = malloc(sizeof(int) * (size_t)(nn + 1));
    for (int k = 0; k < split->nclusters; k++)
        r.nodes[k] = malloc(sizeof(int) * (size_t)(nn + 1));
    bool oom = r.c == NULL || rank == NULL || r.all == NULL;
    for (int k = 0; k < split->nclusters; k++)
        oom |= r.nodes[k] == NULL;
    if (oom) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto done;
    }
    tally t = {0};
    uint64_t present = 0;
    for (int i = 0; i < nn; i++) {
        int k = split->cluster_of[i];
        if (k < 0)
            continue;
        if (k >= split->nclusters) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "node %d in cluster %d of %d", i, k,
                                split->nclusters);
            goto done;
        }
        const kgpu_node *node = kgpu_cluster_node(r.c, i);
        r.nodes[k][r.nnodes[k]++] = i;
        r.all[r.nall++] = i;
        r.quota[k] += (int64_t)node->ngpus * KGPU_MILLI;
        for (int g = 0; g < node->ngpus; g++)
            r.mquota[k][node->gpus[g].model] += KGPU_MILLI;
        t.capacity += (int64_t)node->ngpus * KGPU_MILLI;
        present |= node->model_mask;
    }
    bool online = false;
    if ((rc = kgpu__policy_open(cfg->policy, false, r.c, &in->target, &r.p, &learner, &online,
                                err)) != 0 ||
        (rc = kgpu_sim_tie_order(in, cfg->seed, cfg->inflate, rank, err)) != 0)
        goto done;
    kgpu_policy_set_tie_order(r.p, rank, nn);
    kgpu_rng_seed(&r.srng, cfg->seed, 2);
    kgpu_rng_seed(&r.drng, cfg->seed, 3);
    count_models(&r);
    if (cfg->dispatcher == KGPU_DISPATCH_STATIC)
        build_table(&r, present);
    for (size_t i = 0; i < len && rc == 0; i++) {
        const kgpu_request *req = &in->requests[order[i]];
        int64_t demand = kgpu__gpu_demand(req);
        if ((rc = kgpu__policy_learn(r.p, learner, r.c, req, err)) != 0)
            break;
        kgpu_request narrowed = *req;
        const kgpu_request *use = req;
        int k = -1, drc = 0; /* k -1: every cluster (ONE) */
        bool by_quota = false;
        switch (cfg->dispatcher) {
        case KGPU_DISPATCH_ONE:
            break;
        case KGPU_DISPATCH_KGPU:
            drc = dispatch_kgpu(&r, req, &k, err);
            break;
        case KGPU_DISPATCH_ALL_AT_ONCE:
        case KGPU_DISPATCH_INCREMENTAL: {
            int fm = -1;
            drc = dispatch_quota(&r, req,
                                 cfg->dispatcher == KGPU_DISPATCH_INCREMENTAL ? INCREMENTAL_ROUND
                                                                              : split->nclusters,
                                 &k, &fm);
            if (drc == 0 && fm >= 0) {
                r.mused[k][fm] += demand; /* its flavor's nodes: that model alone */
                narrowed.models = req->models & (UINT64_C(1) << fm);
                use = &narrowed;
            } else if (drc == 0) {
                r.used[k] += demand; /* admitted by quota, whether it fits or not */
            }
            by_quota = drc == 0;
            break;
        }
        default: { /* static */
            int cl = table_class(req, present);
            int m = cl > 0 ? r.table_model[cl] : cl < 0 ? most_gpus_model(req->models,
                                                                           r.model_gpus) : -1;
            k = m >= 0 ? (cl > 0 ? r.table_cluster[cl] : r.most_of[m]) : cl == 0 ? -1 : -2;
            drc = k >= -1 ? 0 : KGPU_ENOFIT; /* CPU only: anywhere */
            if (m >= 0 && req->gpu_count > 0) {
                narrowed.models = req->models & (UINT64_C(1) << m);
                use = &narrowed;
            }
            break;
        }
        }
        if (drc != 0 && drc != KGPU_ENOFIT) {
            rc = drc;
            break;
        }
        kgpu_assignment a;
        int prc = drc == KGPU_ENOFIT ? KGPU_ENOFIT : place_in(&r, use, k, &a, err);
        if (prc != 0 && prc != KGPU_ENOFIT) {
            rc = prc;
            break;
        }
        if (prc == 0) {
            out->cost_per_hour += placement_price(r.c, cfg->price, req, &a);
            out->per_cluster[split->cluster_of[a.node]]++;
        } else {
            out->stuck += by_quota;
        }
        tally_arrival(&t, out, req, prc == 0);
    }
    if (rc == 0)
        tally_finish(&t, out);
done:
    kgpu_learner_free(learner);
    run_free(&r);
    free(rank);
    free(order);
    return rc;
}
