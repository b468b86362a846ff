/*
 * The FGD study's simulation method (see kgpu/sim.h): build the inflated,
 * shuffled workload from the seed, replay arrivals through one policy, and
 * record allocation against arrival. Pure and reentrant: a prepared input is
 * shared read-only by concurrent runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/sim.h"

typedef struct shape_ref {
    const kgpu_request *r;
    size_t i;
} shape_ref;

static int req_shape_cmp(const void *x, const void *y)
{
    const kgpu_request *a = ((const shape_ref *)x)->r, *b = ((const shape_ref *)y)->r;
#define CMP(f)                                                                                     \
    if (a->f != b->f)                                                                              \
        return a->f < b->f ? -1 : 1;
    CMP(cpu_milli)
    CMP(gpu_count)
    CMP(gpu_milli)
    CMP(gpu_memory_mib)
    CMP(exclusive)
    CMP(models)
#undef CMP
    size_t ia = ((const shape_ref *)x)->i, ib = ((const shape_ref *)y)->i;
    return ia < ib ? -1 : ia > ib;
}

/* Gives requests that policies cannot tell apart the same shape id (memory may differ). */
static int assign_shapes(kgpu_request *reqs, size_t n)
{
    shape_ref *refs = malloc(n * sizeof(*refs));
    if (refs == NULL)
        return KGPU_ENOMEM;
    for (size_t i = 0; i < n; i++)
        refs[i] = (shape_ref){&reqs[i], i};
    qsort(refs, n, sizeof(*refs), req_shape_cmp);
    int id = -1;
    for (size_t k = 0; k < n; k++) {
        const kgpu_request *a = refs[k].r, *b = k ? refs[k - 1].r : NULL;
        if (b == NULL || a->cpu_milli != b->cpu_milli || a->gpu_count != b->gpu_count ||
            a->gpu_milli != b->gpu_milli || a->gpu_memory_mib != b->gpu_memory_mib ||
            a->exclusive != b->exclusive || a->models != b->models)
            id++;
        reqs[refs[k].i].shape = id;
    }
    free(refs);
    return 0;
}

int kgpu_sim_prepare(const kgpu_trace *nodes, const kgpu_trace *pods, kgpu_sim_input *in,
                     kgpu_error *err)
{
    memset(in, 0, sizeof(*in));
    int rc;
    if (pods->npods == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "the pod list has no pods");
    if ((in->cluster = kgpu_cluster_new()) == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    if ((rc = kgpu_trace_build_cluster(nodes, in->cluster, err)) != 0)
        goto fail;
    in->gpus = kgpu_cluster_gpu_count(in->cluster);
    in->capacity_milli = (int64_t)in->gpus * KGPU_MILLI;
    if (in->gpus == 0) {
        rc = kgpu_error_set(err, KGPU_EINVAL, "the node list has no GPUs");
        goto fail;
    }
    in->nrequests = pods->npods;
    in->requests = calloc(pods->npods, sizeof(*in->requests));
    if (in->requests == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < pods->npods; i++) {
        kgpu_trace_pod_request(&pods->pods[i], &in->requests[i]);
        if ((rc = kgpu_request_compile(in->cluster, &in->requests[i], err)) != 0)
            goto fail;
        /* The model globs point into the trace; the mask is all a run needs. */
        in->requests[i].allow = NULL;
        in->requests[i].nallow = 0;
    }
    if ((rc = assign_shapes(in->requests, in->nrequests)) != 0) {
        kgpu_error_set(err, rc, "out of memory");
        goto fail;
    }
    if ((rc = kgpu_workload_build(in->requests, in->nrequests, 0.95, &in->target, err)) != 0)
        goto fail;
    return 0;
fail:
    kgpu_sim_input_free(in);
    return rc;
}

void kgpu_sim_input_free(kgpu_sim_input *in)
{
    kgpu_cluster_free(in->cluster);
    free(in->requests);
    kgpu_workload_free(&in->target);
    memset(in, 0, sizeof(*in));
}

/* The arrival sequence: indices into in->requests, shuffled. Caller frees *order. */
static int build_workload(const kgpu_sim_input *in, double inflate, kgpu_rng *rng, size_t **order,
                          size_t *len, kgpu_error *err)
{
    size_t *o, k;
    int rc = kgpu__workload_draw(in->requests, in->nrequests, in->capacity_milli, inflate, rng, &o,
                                 &k, err);
    if (rc != 0)
        return rc;
    for (size_t i = k; i > 1; i--) { /* Fisher-Yates */
        size_t j = (size_t)kgpu_rng_below(rng, i);
        size_t t = o[i - 1];
        o[i - 1] = o[j];
        o[j] = t;
    }
    *order = o;
    *len = k;
    return 0;
}

/* The study's tie order from the workload stream, where the workload left it. */
static void draw_tie_order(kgpu_rng *wrng, uint32_t *rank, int nn)
{
    for (int i = 0; i < nn; i++)
        rank[i] = (uint32_t)i;
    for (int i = nn; i > 1; i--) {
        int j = (int)kgpu_rng_below(wrng, (uint64_t)i);
        uint32_t t = rank[i - 1];
        rank[i - 1] = rank[j];
        rank[j] = t;
    }
}

int kgpu_sim_tie_order(const kgpu_sim_input *in, uint64_t seed, double inflate, uint32_t *rank,
                       kgpu_error *err)
{
    if (!(inflate > 0 && inflate <= 100))
        return kgpu_error_set(err, KGPU_EINVAL, "inflate %.3f outside (0, 100]", inflate);
    kgpu_rng wrng; /* as kgpu_sim_run: the order follows the workload's draws */
    kgpu_rng_seed(&wrng, seed, 1);
    size_t *order, len;
    int rc = build_workload(in, inflate, &wrng, &order, &len, err);
    if (rc != 0)
        return rc;
    free(order);
    draw_tie_order(&wrng, rank, kgpu_cluster_node_count(in->cluster));
    return 0;
}

int kgpu_sim_workload(const kgpu_sim_input *in, uint64_t seed, double inflate, size_t **order,
                      size_t *len, kgpu_error *err)
{
    if (!(inflate > 0 && inflate <= 100))
        return kgpu_error_set(err, KGPU_EINVAL, "inflate %.3f outside (0, 100]", inflate);
    kgpu_rng wrng; /* seeded as kgpu_sim_run seeds its workload stream */
    kgpu_rng_seed(&wrng, seed, 1);
    return build_workload(in, inflate, &wrng, order, len, err);
}

/*
 * kube-scheduler's choice with the extender as the only scorer: the highest
 * 0-10 score over the fitting nodes, ties uniformly at random (selectHost),
 * then the policy's GPUs on that node.
 */
static int extender_select(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                           const int *all, int *scores, int nn, kgpu_rng *rng, int *node_out,
                           int *gpus, kgpu_error *err)
{
    int rc = kgpu_policy_node_scores(p, c, req, all, nn, scores, err);
    if (rc != 0)
        return rc;
    int best = -1, chosen = -1;
    uint64_t ties = 0;
    for (int i = 0; i < nn; i++) {
        if (!kgpu_fit(c, i, req, NULL, 0))
            continue;
        if (scores[i] > best) {
            best = scores[i];
            chosen = i;
            ties = 1;
        } else if (scores[i] == best && kgpu_rng_below(rng, ++ties) == 0) {
            chosen = i;
        }
    }
    if (chosen < 0)
        return kgpu_error_set(err, KGPU_ENOFIT, "no node fits");
    return kgpu_policy_select(p, c, req, &chosen, 1, rng, node_out, gpus, err);
}

/*
 * kube-scheduler's node sample (numFeasibleNodesToFind): every node under 100,
 * else pct % of them (adaptive when 0: 50 - nodes/125, at least 5), at least 100.
 */
static int k8s_nodes_to_find(int nn, int pct)
{
    if (nn < 100)
        return nn;
    if (pct <= 0) {
        pct = 50 - nn / 125;
        if (pct < 5)
            pct = 5;
    }
    if (pct >= 100)
        return nn;
    int k = (int)((int64_t)nn * pct / 100);
    return k < 100 ? 100 : k;
}

/* One resource of NodeResourcesFit's score, 0-100, as kube-scheduler computes it. */
static int64_t k8s_fit_score(int64_t requested, int64_t capacity, bool most)
{
    if (capacity <= 0 || requested > capacity)
        return 0;
    return most ? requested * 100 / capacity : (capacity - requested) * 100 / capacity;
}

/* kube-scheduler's default plugin scores for req on node i: NodeResourcesFit + Balanced. */
static int64_t k8s_plugin_score(const kgpu_cluster *c, int i, const kgpu_request *req,
                                const kgpu_sim_k8s *k)
{
    const kgpu_node *n = kgpu_cluster_node(c, i);
    int64_t cpu = n->cpu_milli - n->cpu_free + req->cpu_milli;
    int64_t mem = n->memory_mib - n->memory_free + req->memory_mib;
    int64_t total = 0;
    if (k->fit_weight > 0)
        total += k->fit_weight * ((k8s_fit_score(cpu, n->cpu_milli, k->most_allocated) +
                                   k8s_fit_score(mem, n->memory_mib, k->most_allocated)) /
                                  2);
    if (k->balanced_weight > 0 && n->cpu_milli > 0 && n->memory_mib > 0) {
        double fc = (double)cpu / (double)n->cpu_milli, fm = (double)mem / (double)n->memory_mib;
        fc = fc > 1 ? 1 : fc;
        fm = fm > 1 ? 1 : fm;
        double sd = fabs(fc - fm) / 2;
        total += k->balanced_weight * (int64_t)((1 - sd) * 100);
    }
    return total;
}

/*
 * kube-scheduler's node choice (kgpu_sim_k8s): filter from the rotating start
 * until the sample is full, the extender's 0-10 scores (for pods that ask for
 * a GPU, or all with all_pods; never with weight 0 or without a policy) times
 * weight x 10 plus the default score plugins, the highest total wins, ties at
 * random. `feasible` and `scores` have room for every node; *start is
 * nextStartNodeIndex. p may be NULL (no extender).
 */
static int k8s_node(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                    const kgpu_sim_k8s *k, int *feasible, int *scores, int nn, int *start,
                    kgpu_rng *rng, int *node_out, kgpu_error *err)
{
    int want = k8s_nodes_to_find(nn, k->nodes_to_score), nf = 0, processed = 0;
    for (int j = 0; j < nn && nf < want; j++) {
        int i = (*start + j) % nn;
        processed++;
        if (kgpu_fit(c, i, req, NULL, 0))
            feasible[nf++] = i;
    }
    *start = (*start + processed) % nn;
    if (nf == 0)
        return kgpu_error_set(err, KGPU_ENOFIT, "no node fits");
    /* Weight 0 adds nothing to any node: skipping the call changes no choice. */
    bool managed = p != NULL && k->extender_weight > 0 && (req->gpu_count > 0 || k->all_pods);
    if (managed) {
        int rc = kgpu_policy_node_scores(p, c, req, feasible, nf, scores, err);
        if (rc != 0)
            return rc;
    }
    int64_t best = -1;
    int chosen = -1;
    uint64_t ties = 0;
    for (int j = 0; j < nf; j++) {
        int64_t t = k8s_plugin_score(c, feasible[j], req, k);
        if (managed)
            t += (int64_t)scores[j] * k->extender_weight * 10;
        if (t > best) {
            best = t;
            chosen = feasible[j];
            ties = 1;
        } else if (t == best && kgpu_rng_below(rng, ++ties) == 0) {
            chosen = feasible[j];
        }
    }
    *node_out = chosen;
    return 0;
}

/*
 * kube-scheduler's DRA allocator on node `node` (v1.37.2, structured
 * parameters): devices in the ResourceSlice's order, which kgpu's driver
 * publishes as gpu-0, gpu-1, ...; each request takes the first gpu_count
 * distinct devices that match its selectors and still have the consumable
 * capacity asked for (kgpu_gpu_usable: model, health, compute, memory, and
 * untouched for a whole GPU). No scoring among devices. The caller has
 * checked that the node fits; finding too few devices then means the fit
 * check and this walk disagree, which is a bug, not a failed pod.
 */
static int dra_first_fit(const kgpu_cluster *c, int node, const kgpu_request *req, int *gpus,
                         kgpu_error *err)
{
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int order[KGPU_MAX_GPUS_PER_NODE], k = 0;
    /* Slice order is device index order; positions in n->gpus need not be (trace nodes are). */
    for (int i = 0; i < n->ngpus; i++) {
        int j = i;
        for (; j > 0 && n->gpus[order[j - 1]].index > n->gpus[i].index; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (int i = 0; i < n->ngpus && k < req->gpu_count; i++)
        if (kgpu_gpu_usable(n, &n->gpus[order[i]], req))
            gpus[k++] = order[i];
    if (k < req->gpu_count)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "node %s fits a %d-GPU request but first fit found %d devices",
                              n->name, req->gpu_count, k);
    return 0;
}

/* A GPU share: under 1000 milli of each GPU it takes (what share_packing measures). */
static bool is_share(const kgpu_request *req)
{
    return req->gpu_count > 0 && !req->exclusive && req->gpu_milli > 0 &&
           req->gpu_milli < KGPU_MILLI;
}

int kgpu_sim_run(const kgpu_sim_input *in, const kgpu_sim_config *cfg, kgpu_sim_result *out,
                 kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!(cfg->inflate > 0 && cfg->inflate <= 100))
        return kgpu_error_set(err, KGPU_EINVAL, "inflate %.3f outside (0, 100]", cfg->inflate);
    if (cfg->allocator != KGPU_SIM_ALLOC_POLICY && cfg->allocator != KGPU_SIM_ALLOC_DRA)
        return kgpu_error_set(err, KGPU_EINVAL, "allocator %d unknown", (int)cfg->allocator);
    if (cfg->consolidate < 0 || cfg->consolidate > KGPU__MAX_MOVES)
        return kgpu_error_set(err, KGPU_EINVAL, "consolidate %d outside 0..%d", cfg->consolidate,
                              KGPU__MAX_MOVES);
    if (cfg->consolidate > 0 && (cfg->extender_scores != 0 || cfg->allocator != 0))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "consolidation is simulated under the policy's own choice only");
    static const kgpu_sim_k8s k8s_default = KGPU_SIM_K8S_DEFAULT;
    bool dra = cfg->allocator == KGPU_SIM_ALLOC_DRA;
    const kgpu_sim_k8s *k8s = cfg->k8s != NULL ? cfg->k8s : dra ? &k8s_default : NULL;
    bool choose = cfg->extender_scores != 0 || dra; /* kube-scheduler chooses the node */
    /*
     * DRA with no extender's prioritize leaves no extender at all: the policy
     * is never opened, shown a pod or asked, so the run cannot depend on it.
     */
    bool no_policy = dra && k8s->extender_weight <= 0;
    if (no_policy && cfg->policy != NULL && kgpu_policy_find(cfg->policy) == NULL)
        return kgpu_error_set(err, KGPU_ENOENT, "unknown policy '%s'", cfg->policy);
    kgpu_rng wrng, srng;
    kgpu_rng_seed(&wrng, cfg->seed, 1);
    kgpu_rng_seed(&srng, cfg->seed, 2);
    size_t *order = NULL, len = 0;
    int rc = build_workload(in, cfg->inflate, &wrng, &order, &len, err);
    if (rc != 0)
        return rc;
    kgpu_cluster *c = kgpu_cluster_clone(in->cluster);
    kgpu_policy *p = NULL;
    kgpu_learner *learner = NULL;
    uint32_t *rank = NULL;
    int *all = NULL, *scores = NULL; /* extender_scores: every node, and its 0-10 score */
    long *shares = out->share_sizes; /* placed shares by milli */
    long whole_gpus = 0;             /* GPUs taken whole */
    kgpu__pods placed = {0};         /* with consolidate: where each placed pod is */
    if (c == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto done;
    }
    if (!no_policy && (rc = kgpu__policy_open(cfg->policy, cfg->online, c, &in->target, &p,
                                              &learner, &out->online, err)) != 0)
        goto done;
    /* The study's tie order: a random node permutation per seed. */
    int nn = kgpu_cluster_node_count(c);
    rank = malloc((size_t)(nn > 0 ? nn : 1) * sizeof(*rank));
    if (rank == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto done;
    }
    draw_tie_order(&wrng, rank, nn);
    if (!cfg->random_ties && p != NULL)
        kgpu_policy_set_tie_order(p, rank, nn);
    uint64_t present = 0;
    for (int i = 0; i < nn; i++)
        present |= kgpu_cluster_node(c, i)->model_mask;
    if (cfg->consolidate > 0 && kgpu__pods_init(&placed, nn) != 0) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto done;
    }
    int k8s_start = 0; /* kube-scheduler's nextStartNodeIndex */
    if (choose) {
        all = malloc((size_t)(nn > 0 ? nn : 1) * 2 * sizeof(*all)); /* and k8s_node's sample */
        scores = malloc((size_t)(nn > 0 ? nn : 1) * sizeof(*scores));
        if (all == NULL || scores == NULL) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < nn; i++)
            all[i] = i;
        if (p != NULL)
            kgpu_policy_set_linear_scores(p, cfg->extender_scores == 2);
    }
    double cap = (double)in->capacity_milli;
    int64_t arrived = 0;
    int next = 1; /* next curve point to fill */
    bool at90 = false, at100 = false;
    out->curve[0] = 0;
    for (size_t k = 0; k < len; k++) {
        const kgpu_request *req = &in->requests[order[k]];
        arrived += kgpu__gpu_demand(req);
        bool constrained = req->gpu_count > 0 && (req->models & present) != present;
        out->constrained_pods += constrained;
        /*
         * Under kube-scheduler the extender sees a pod without a GPU only
         * through its prioritize entry for them (all_pods), which a weight of
         * 0 takes away.
         */
        bool shown =
            k8s == NULL || req->gpu_count > 0 || (k8s->all_pods && k8s->extender_weight > 0);
        if (p != NULL && shown && (rc = kgpu__policy_learn(p, learner, c, req, err)) != 0)
            goto done;
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        if (choose && k8s != NULL) {
            int chosen = -1;
            rc = k8s_node(p, c, req, k8s, all + nn, scores, nn, &k8s_start, &srng, &chosen, err);
            if (rc == 0 && dra) {
                node = chosen;
                if (req->gpu_count > 0)
                    rc = dra_first_fit(c, chosen, req, gpus, err);
            } else if (rc == 0) {
                rc = kgpu_policy_select(p, c, req, &chosen, 1, &srng, &node, gpus, err);
            }
        } else if (all != NULL)
            rc = extender_select(p, c, req, all, scores, nn, &srng, &node, gpus, err);
        else
            rc = kgpu_policy_select(p, c, req, NULL, 0, &srng, &node, gpus, err);
        kgpu_assignment a;
        bool applied = false;
        if (rc == 0) {
            rc = kgpu_cluster_apply(c, req, node, gpus, &a, err);
            if (rc != 0)
                goto done; /* a policy chose something that does not fit: a bug */
            applied = true;
        } else if (rc == KGPU_ENOFIT && cfg->consolidate > 0) {
            int moved[KGPU__MAX_MOVES], nmoved = 0;
            rc = kgpu__consolidate(&placed, c, p, req, cfg->consolidate, NULL, &srng, &a, moved,
                                   &nmoved, err);
            if (rc == 0) {
                applied = true;
                out->moves += nmoved;
                out->consolidated++;
            }
        }
        if (applied && cfg->consolidate > 0 &&
            kgpu__pods_add(&placed, req, &a,
                           cfg->restartable == NULL || cfg->restartable[order[k]], k, NULL) != 0) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
            goto done;
        }
        if (applied) {
            if (is_share(req)) {
                shares[req->gpu_milli] += req->gpu_count;
                out->share_pods++;
            } else if (req->gpu_count > 0 && (req->exclusive || req->gpu_milli == KGPU_MILLI)) {
                whole_gpus += req->gpu_count;
            }
        } else if (rc == KGPU_ENOFIT) {
            out->pods_failed++;
            out->gpu_pods_failed += req->gpu_count > 0;
            out->constrained_failed += constrained;
            out->share_pods_failed += is_share(req);
            rc = 0;
        } else {
            goto done;
        }
        double arrival = (double)arrived * 100.0 / cap;
        double alloc = (double)kgpu_cluster_gpu_milli_allocated(c) * 100.0 / cap;
        while (next <= KGPU_SIM_CURVE_MAX && arrival >= next)
            out->curve[next++] = alloc;
        if (!at90 && arrival >= 90) {
            double idle;
            double frag = kgpu_cluster_frag(c, &in->target, &idle);
            out->frag_ratio_pct_90 = idle > 0 ? frag * 100.0 / idle : 0;
            at90 = true;
        }
        if (!at100 && arrival >= 100) {
            out->alloc_pct_100 = alloc;
            at100 = true;
        }
    }
    double alloc = (double)kgpu_cluster_gpu_milli_allocated(c) * 100.0 / cap;
    while (next <= KGPU_SIM_CURVE_MAX)
        out->curve[next++] = alloc; /* arrival ended below this point: the final state holds */
    if (!at100)
        out->alloc_pct_100 = alloc;
    out->alloc_pct_final = alloc;
    out->arrival_pct_final = (double)arrived * 100.0 / cap;
    out->unallocated_gpus = (cap - (double)kgpu_cluster_gpu_milli_allocated(c)) / KGPU_MILLI;
    out->pods = (long)len;
    long used = 0;
    int64_t share_milli = 0;
    for (int i = 0; i < nn; i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        for (int g = 0; g < n->ngpus; g++)
            used += n->gpus[g].placements > 0;
    }
    for (int m = 1; m < KGPU_MILLI; m++)
        share_milli += (int64_t)m * shares[m];
    out->share_compute_gpus = (double)share_milli / KGPU_MILLI;
    out->share_gpus = used - whole_gpus;
    out->share_gpus_bound = kgpu__share_lower_bound(shares);
    out->share_gpus_bfd = kgpu__share_bfd(shares);
done:
    kgpu__pods_free(&placed);
    free(all);
    free(scores);
    free(rank);
    kgpu_policy_free(p);
    kgpu_learner_free(learner);
    kgpu_cluster_free(c);
    free(order);
    return rc;
}
