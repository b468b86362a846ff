/*
 * What a cluster could take (include/kgpu/estimate.h): copies of a shape
 * placed one after another by the policy on the cluster itself, measured,
 * and taken back exactly. Fragmentation is kept up to date per copy from the
 * one node that changed, so an estimate costs one pass over the nodes (the
 * starting fragmentation) plus one selection per copy.
 *
 * And the dispatcher's rule: which clusters can place a workload, best
 * first. Pure: no I/O, no clock.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/estimate.h"

#define RESERVE_COPIES_MAX 4096 /* reserved copies over all reserved shapes */

static double node_frag(const kgpu_cluster *c, const kgpu_workload *w, int node)
{
    return w != NULL ? kgpu_node_frag(kgpu_cluster_node(c, node), w, NULL, -1) : 0.0;
}

/*
 * Selects and applies one copy of req; KGPU_ENOFIT when none fits. *delta:
 * frag change; *score (may be NULL): the policy's score of the place.
 */
static int place_one(kgpu_cluster *c, kgpu_policy *p, const kgpu_workload *w,
                     const kgpu_request *req, kgpu_rng *rng, kgpu_assignment *a, double *delta,
                     int64_t *score, kgpu_error *err)
{
    int node, gpus[KGPU_MAX_GPUS_PER_NODE];
    int rc = kgpu_policy_select(p, c, req, NULL, 0, rng, &node, gpus, err);
    if (rc != 0)
        return rc;
    if (score != NULL)
        *score = kgpu_policy_score(p, c, node, req);
    double before = node_frag(c, w, node);
    if ((rc = kgpu_cluster_apply(c, req, node, gpus, a, err)) != 0)
        return rc;
    *delta = node_frag(c, w, node) - before;
    return 0;
}

int kgpu_estimate_shape(kgpu_cluster *c, kgpu_policy *p, const kgpu_workload *w,
                        const kgpu_shape_count *reserve, int nreserve, const kgpu_request *req,
                        int max, kgpu_rng *rng, kgpu_estimate *out, kgpu_error *err)
{
    if (max < 1 || max > KGPU_ESTIMATE_MAX)
        return kgpu_error_set(err, KGPU_EINVAL, "copies to count: %d, not 1..%d", max,
                              KGPU_ESTIMATE_MAX);
    if (nreserve < 0 || nreserve > KGPU_ESTIMATE_RESERVE || (nreserve > 0 && reserve == NULL))
        return kgpu_error_set(err, KGPU_EINVAL, "reserved shapes: %d, not 0..%d", nreserve,
                              KGPU_ESTIMATE_RESERVE);
    long copies = 0;
    for (int i = 0; i < nreserve; i++) {
        if (reserve[i].count < 0 || reserve[i].req == NULL)
            return kgpu_error_set(err, KGPU_EINVAL, "reserved shape %d: count %d", i,
                                  reserve[i].count);
        copies += reserve[i].count;
    }
    if (copies > RESERVE_COPIES_MAX)
        return kgpu_error_set(err, KGPU_EINVAL, "%ld reserved copies, more than %d", copies,
                              RESERVE_COPIES_MAX);
    kgpu_assignment *placed = malloc(sizeof(*placed) * (size_t)(copies + max));
    if (placed == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    memset(out, 0, sizeof(*out));
    out->first_node = out->first_model = -1;
    int n = 0, rc = 0;
    double delta;
    for (int i = 0; i < nreserve && rc == 0; i++) {
        for (int k = 0; k < reserve[i].count && rc == 0; k++) {
            rc = place_one(c, p, w, reserve[i].req, rng, &placed[n], &delta, NULL, err);
            if (rc == 0) {
                n++;
                out->reserved++;
            } else if (rc == KGPU_ENOFIT) {
                /* The cluster only fills from here: the rest of this shape misses too. */
                out->reserved_missed += reserve[i].count - k;
                rc = 0;
                break;
            }
        }
    }
    if (rc == 0) {
        double idle = 0;
        out->frag_before = w != NULL ? kgpu_cluster_frag(c, w, &idle) : 0.0;
        if (w == NULL)
            for (int i = 0; i < kgpu_cluster_node_count(c); i++)
                idle += kgpu__node_free_milli(kgpu_cluster_node(c, i));
        out->idle_milli = idle;
        double frag = out->frag_before;
        out->frag_first = frag;
        while (out->fit < max && rc == 0) {
            int64_t score = 0;
            rc = place_one(c, p, w, req, rng, &placed[n], &delta, &score, err);
            if (rc != 0)
                break;
            const kgpu_assignment *a = &placed[n++];
            frag += delta;
            int model = a->ngpus > 0 ? kgpu_cluster_node(c, a->node)->gpus[a->gpus[0]].model : -1;
            if (out->fit == 0) {
                out->first_node = a->node;
                out->first_model = model;
                out->frag_first = frag;
                out->score = score;
            }
            if (model >= 0 && model < KGPU_MAX_MODELS)
                out->by_model[model]++;
            out->fit++;
        }
        if (rc == KGPU_ENOFIT)
            rc = 0;
        out->frag_after = frag;
    }
    /* Everything placed leaves again, last first: the cluster is as it was. */
    kgpu_error local;
    while (n-- > 0) {
        int urc = kgpu_cluster_release(c, &placed[n], &local);
        if (urc != 0 && rc == 0) {
            rc = urc;
            *err = local;
        }
    }
    free(placed);
    return rc;
}

int kgpu_estimate_empty_node(const kgpu_node_spec *tmpl, const kgpu_request *req, int max,
                             kgpu_error *err)
{
    if (max < 1 || max > KGPU_ESTIMATE_MAX)
        return kgpu_error_set(err, KGPU_EINVAL, "copies to count: %d, not 1..%d", max,
                              KGPU_ESTIMATE_MAX);
    if (tmpl->ngpus < 0 || tmpl->ngpus > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_EINVAL, "template %s: %d GPUs", tmpl->name, tmpl->ngpus);
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < tmpl->ngpus; i++) {
        gpus[i] = tmpl->gpus[i];
        gpus[i].healthy = true; /* a new node's GPUs */
    }
    kgpu_node_spec spec = *tmpl;
    spec.gpus = gpus;
    kgpu_cluster *c = kgpu_cluster_new();
    if (c == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    kgpu_request r = *req;
    r.cpu_milli = r.memory_mib = 0; /* a template's CPU is the node group's to size */
    r.shape = -1;
    int rc = kgpu_cluster_add_node(c, &spec, err);
    if (rc == 0)
        rc = kgpu_request_compile(c, &r, err);
    kgpu_policy *p = rc == 0 ? kgpu_policy_new("bestfit", c, NULL, err) : NULL;
    if (rc == 0 && p == NULL)
        rc = err->code != 0 ? err->code : KGPU_ENOMEM;
    int count = 0;
    if (rc == 0) {
        kgpu_policy_set_fit_cpu(p, false);
        kgpu_rng rng;
        kgpu_rng_seed(&rng, 29, 1);
        int node, g[KGPU_MAX_GPUS_PER_NODE];
        kgpu_assignment a;
        while (count < max && rc == 0) {
            rc = kgpu_policy_select(p, c, &r, NULL, 0, &rng, &node, g, err);
            if (rc == 0 && (rc = kgpu_cluster_apply(c, &r, node, g, &a, err)) == 0)
                count++;
        }
        if (rc == KGPU_ENOFIT)
            rc = 0;
    }
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
    return rc == 0 ? count : rc;
}

/* ---- the dispatcher's order ---- */

/* -1 sorts after every listed preference. */
static int pref_key(int pref)
{
    return pref < 0 ? 1 << 30 : pref;
}

/* <0 when a goes before b. */
static int cmp_cand(const kgpu_dispatch_candidate *a, const kgpu_dispatch_candidate *b)
{
    if (pref_key(a->pref) != pref_key(b->pref))
        return pref_key(a->pref) < pref_key(b->pref) ? -1 : 1;
    bool ka = a->perf_per_cost > 0, kb = b->perf_per_cost > 0;
    if (ka != kb)
        return ka ? -1 : 1;
    if (ka && a->perf_per_cost != b->perf_per_cost)
        return a->perf_per_cost > b->perf_per_cost ? -1 : 1;
    if (a->scored && b->scored && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->frag_added != b->frag_added)
        return a->frag_added < b->frag_added ? -1 : 1;
    ka = a->price > 0;
    kb = b->price > 0;
    if (ka != kb)
        return ka ? -1 : 1;
    if (ka && a->price != b->price)
        return a->price < b->price ? -1 : 1;
    if (a->fit != b->fit)
        return a->fit > b->fit ? -1 : 1;
    return strcmp(a->name ? a->name : "", b->name ? b->name : "");
}

int kgpu_dispatch_rank(const kgpu_dispatch_candidate *cand, int n, int need, int *order)
{
    if (n <= 0 || need < 1)
        return 0;
    bool any_now = false;
    for (int i = 0; i < n; i++)
        any_now |= cand[i].reachable && cand[i].fit >= need;
    int k = 0;
    for (int i = 0; i < n; i++) {
        const kgpu_dispatch_candidate *c = &cand[i];
        if (c->reachable && (any_now ? c->fit >= need : (long)c->fit + (long)c->grow >= need))
            order[k++] = i;
    }
    /* Insertion sort: a handful of clusters, stable, and no allocation that could fail. */
    for (int i = 1; i < k; i++) {
        int v = order[i], j = i;
        while (j > 0 && cmp_cand(&cand[v], &cand[order[j - 1]]) < 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    return k;
}
