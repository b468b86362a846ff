/*
 * The policy registry and the decisions made once for every policy: the
 * selection loop with uniform random tie-breaking (as kube-scheduler breaks
 * ties), placing a pod's containers, and the 0-10 node scores for the
 * extender. It sits above the policies it lists; what they share is below
 * them, in policy_common.c.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

extern const kgpu_policy_ops kgpu__policy_random;
extern const kgpu_policy_ops kgpu__policy_dotprod;
extern const kgpu_policy_ops kgpu__policy_clustering;
extern const kgpu_policy_ops kgpu__policy_packing;
extern const kgpu_policy_ops kgpu__policy_bestfit;
extern const kgpu_policy_ops kgpu__policy_fgd;
extern const kgpu_policy_ops kgpu__policy_binpack;
extern const kgpu_policy_ops kgpu__policy_spread;
extern const kgpu_policy_ops kgpu__policy_kgpu;

/* The registry: one line per policy. */
static const kgpu_policy_ops *const policies[] = {
    &kgpu__policy_random,     &kgpu__policy_dotprod,
    &kgpu__policy_clustering, &kgpu__policy_packing,
    &kgpu__policy_bestfit,    &kgpu__policy_fgd,
    &kgpu__policy_binpack,    &kgpu__policy_spread,
    &kgpu__policy_kgpu,       NULL,
};

struct kgpu_policy {
    const kgpu_policy_ops *ops;
    void *state;
    const uint32_t *rank; /* tie order, or NULL for random ties */
    int nrank;
    bool no_fit_cpu; /* fit by GPUs alone (kgpu_policy_set_fit_cpu) */
    bool linear;     /* linear 0-10 scores even for rank_scores policies */
    bool scan;       /* kgpu_policy_set_indexed(false): score every node every time */
    kgpu__index *ix; /* created at the first decision over every node */
};

const kgpu_policy_ops *const *kgpu_policy_list(void)
{
    return policies;
}

const kgpu_policy_ops *kgpu_policy_find(const char *name)
{
    for (int i = 0; policies[i] != NULL; i++)
        if (strcmp(policies[i]->name, name) == 0)
            return policies[i];
    return NULL;
}

kgpu_policy *kgpu_policy_new(const char *name, const kgpu_cluster *c, const kgpu_workload *target,
                             kgpu_error *err)
{
    const kgpu_policy_ops *ops = kgpu_policy_find(name);
    if (ops == NULL) {
        char known[256] = "";
        for (int i = 0; policies[i] != NULL; i++) {
            strncat(known, i ? ", " : "", sizeof(known) - strlen(known) - 1);
            strncat(known, policies[i]->name, sizeof(known) - strlen(known) - 1);
        }
        kgpu_error_set(err, KGPU_ENOENT, "unknown policy '%s' (known: %s)", name, known);
        return NULL;
    }
    kgpu_policy *p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto oom;
    p->ops = ops;
    if (ops->state_size > 0 && (p->state = calloc(1, ops->state_size)) == NULL)
        goto oom;
    if (ops->init != NULL && ops->init(p->state, c, target, err) != 0) {
        free(p->state);
        free(p);
        return NULL;
    }
    return p;
oom:
    free(p);
    kgpu_error_set(err, KGPU_ENOMEM, "out of memory creating policy %s", name);
    return NULL;
}

void kgpu_policy_free(kgpu_policy *p)
{
    if (p == NULL)
        return;
    if (p->ops->fini != NULL)
        p->ops->fini(p->state);
    kgpu__index_free(p->ix);
    free(p->state);
    free(p);
}

void kgpu_policy_invalidate(kgpu_policy *p)
{
    if (p->ops->invalidate != NULL)
        p->ops->invalidate(p->state);
    kgpu__index_bump(p->ix);
}

void kgpu_policy_observe(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req)
{
    if (p->ops->observe != NULL) {
        p->ops->observe(p->state, c, req);
        if (p->ops->group == NULL) /* what it learnt may move any score */
            kgpu__index_bump(p->ix);
    }
}

bool kgpu_policy_online_only(const kgpu_policy *p)
{
    return p->ops->online_only;
}

void kgpu_policy_set_tie_order(kgpu_policy *p, const uint32_t *rank, int n)
{
    p->rank = rank;
    p->nrank = rank ? n : 0;
}

void kgpu_policy_set_fit_cpu(kgpu_policy *p, bool check)
{
    if (p->no_fit_cpu != !check)
        kgpu__index_reset(p->ix); /* fits it holds were taken the other way */
    p->no_fit_cpu = !check;
}

void kgpu_policy_set_indexed(kgpu_policy *p, bool on)
{
    p->scan = !on;
}

void kgpu_policy_set_linear_scores(kgpu_policy *p, bool linear)
{
    p->linear = linear;
}

/* The request the fit checks see: without CPU and memory when those are not ours to check. */
static const kgpu_request *fit_request(const kgpu_policy *p, const kgpu_request *req,
                                       kgpu_request *tmp)
{
    if (!p->no_fit_cpu || (req->cpu_milli == 0 && req->memory_mib == 0))
        return req;
    *tmp = *req;
    tmp->cpu_milli = 0;
    tmp->memory_mib = 0;
    return tmp;
}

const char *kgpu_policy_name(const kgpu_policy *p)
{
    return p->ops->name;
}

/*
 * The decision by scoring each of `nodes` (NULL: every node): the highest
 * score, ties by rank or drawn at random (reservoir sampling). The index
 * (policy_index.c) gives the same answer without scoring every node.
 */
static int select_scan(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                       const kgpu_request *fit, const uint32_t *rank, const int *nodes, int n,
                       kgpu_rng *rng, int *node_out, kgpu_error *err)
{
    int total = kgpu_cluster_node_count(c);
    if (nodes == NULL)
        n = total;
    int64_t best = INT64_MIN;
    int chosen = -1;
    uint64_t ties = 0;
    for (int k = 0; k < n; k++) {
        int i = nodes ? nodes[k] : k;
        if (i < 0 || i >= total)
            return kgpu_error_set(err, KGPU_EINVAL, "no node with index %d", i);
        const kgpu_node *node = kgpu_cluster_node(c, i);
        if (!kgpu__fit(node, fit))
            continue;
        int64_t s = p->ops->score(p->state, c, i, req);
        if (s > best) {
            best = s;
            chosen = i;
            ties = 1;
        } else if (s == best) {
            if (chosen < 0) {
                chosen = i; /* only possible for a score of INT64_MIN */
            } else if (rank != NULL) {
                uint32_t ri = i < p->nrank ? rank[i] : UINT32_MAX;
                uint32_t rc = chosen < p->nrank ? rank[chosen] : UINT32_MAX;
                if (ri < rc)
                    chosen = i;
            } else if (kgpu_rng_below(rng, ++ties) == 0) {
                chosen = i; /* reservoir sampling: each tied node equally likely */
            }
        }
    }
    if (chosen < 0)
        return kgpu_error_set(err, KGPU_ENOFIT, "no node fits");
    *node_out = chosen;
    return 0;
}

int kgpu_policy_select(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                       const int *nodes, int n, kgpu_rng *rng, int *node_out, int *gpus,
                       kgpu_error *err)
{
    const uint32_t *rank = p->ops->random_ties ? NULL : p->rank;
    kgpu_request tmp;
    const kgpu_request *fit = fit_request(p, req, &tmp);
    int rc = 1, chosen = -1;
    if (nodes == NULL && !p->scan && (p->ix != NULL || (p->ix = kgpu__index_new()) != NULL))
        rc = kgpu__index_select(p->ix, p->ops, p->state, c, req, fit, rank,
                                rank != NULL ? p->nrank : 0, rng, &chosen);
    if (rc == KGPU_ENOFIT)
        return kgpu_error_set(err, KGPU_ENOFIT, "no node fits");
    if (rc == 1)
        rc = select_scan(p, c, req, fit, rank, nodes, n, rng, &chosen, err);
    if (rc != 0)
        return rc;
    *node_out = chosen;
    if (req->gpu_count > 0) {
        rc = p->ops->pick_gpus(p->state, c, chosen, req, rng, gpus);
        if (rc != 0)
            return kgpu_error_set(err, rc, "policy %s found no GPUs on node %s", p->ops->name,
                                  kgpu_cluster_node(c, chosen)->name);
    }
    return 0;
}

/* Applies req on `gpus`, with CPU and memory clamped to what is free when they are not checked. */
static int place_apply(const kgpu_policy *p, kgpu_cluster *c, const kgpu_request *req, int node,
                       const int *gpus, kgpu_assignment *out, kgpu_error *err)
{
    kgpu_request r = *req;
    if (p->no_fit_cpu) {
        const kgpu_node *n = kgpu_cluster_node(c, node);
        int64_t cpu = n->cpu_free > 0 ? n->cpu_free : 0,
                mem = n->memory_free > 0 ? n->memory_free : 0;
        r.cpu_milli = r.cpu_milli < cpu ? r.cpu_milli : cpu;
        r.memory_mib = r.memory_mib < mem ? r.memory_mib : mem;
    }
    return kgpu_cluster_apply(c, &r, node, gpus, out, err);
}

int kgpu_policy_place(kgpu_policy *p, kgpu_cluster *c, int node, const kgpu_request *const *reqs,
                      int nreqs, kgpu_rng *rng, kgpu_assignment *out, kgpu_error *err)
{
    if (node < 0 || node >= kgpu_cluster_node_count(c))
        return kgpu_error_set(err, KGPU_EINVAL, "no node with index %d", node);
    if (nreqs < 0 || nreqs > KGPU_PLACE_MAX_REQS)
        return kgpu_error_set(err, KGPU_EINVAL, "%d GPU requests in one pod (at most %d)", nreqs,
                              KGPU_PLACE_MAX_REQS);
    char why[256];
    kgpu_request tmp[KGPU_PLACE_MAX_REQS];
    const kgpu_request *fit[KGPU_PLACE_MAX_REQS];
    for (int i = 0; i < nreqs; i++)
        fit[i] = fit_request(p, reqs[i], &tmp[i]);
    /*
     * plan: a placement of requests i.. on the node as it is before request
     * i is applied. The policy's choice for request i replaces plan's only
     * when the search still places the requests after it.
     */
    kgpu_placement plan, rest;
    if (nreqs > 1 && kgpu_place_all(c, node, NULL, 0, fit, nreqs, 0, 0, &plan, why, sizeof(why)) !=
                         KGPU_PLACE_FOUND)
        return kgpu_error_set(err, KGPU_ENOFIT, "%s", why);
    /* The look-ahead searches share one budget: past it the plan's GPUs are taken. */
    long left = KGPU_PLACE_BUDGET;
    int rc = 0, done = 0;
    for (; done < nreqs && rc == 0; done++) {
        const kgpu_request *r = reqs[done];
        int chosen, gpus[KGPU_MAX_GPUS_PER_NODE];
        kgpu_error perr;
        rc = kgpu_policy_select(p, c, r, &node, 1, rng, &chosen, gpus, &perr);
        if (rc == 0)
            rc = place_apply(p, c, r, node, gpus, &out[done], &perr);
        if (nreqs == 1) {
            if (rc == KGPU_ENOFIT) {
                kgpu_fit(c, node, fit[0], why, sizeof(why));
                kgpu_error_set(err, rc, "%s", why);
            } else if (rc != 0) {
                kgpu_error_set(err, rc, "%s", perr.msg);
            }
            return rc;
        }
        if (rc == 0 && done + 1 < nreqs) {
            int found = kgpu_place_all(c, node, NULL, 0, fit + done + 1, nreqs - done - 1,
                                       left > 0 ? left : 1, 0, &rest, NULL, 0);
            left -= rest.steps;
            if (found == KGPU_PLACE_FOUND) {
                memcpy(plan.gpus[done + 1], rest.gpus,
                       (size_t)(nreqs - done - 1) * sizeof(plan.gpus[0]));
                continue;
            }
            kgpu_cluster_release(c, &out[done], NULL); /* it would strand a later request */
            rc = KGPU_ENOFIT;
        }
        if (rc == 0)
            continue;
        /* The search's own GPUs for this request: with them, the rest of the plan still holds. */
        rc = place_apply(p, c, r, node, plan.gpus[done], &out[done], err);
    }
    if (rc != 0) {
        for (int i = done - 2; i >= 0; i--) /* done - 1 failed and holds nothing */
            kgpu_cluster_release(c, &out[i], NULL);
    }
    return rc;
}

/* Keeps top[0..*ntop) the (at most 10) best distinct values seen, best first. */
static void keep_top(int64_t *top, int *ntop, int64_t v)
{
    int k = *ntop;
    if (k == 10 && v <= top[9])
        return; /* the usual case once ten are held: one comparison */
    while (k > 0 && top[k - 1] < v)
        k--;
    if (k > 0 && top[k - 1] == v)
        return; /* already held */
    int last = *ntop < 10 ? *ntop : 9;
    for (int j = last; j > k; j--)
        top[j] = top[j - 1];
    top[k] = v;
    if (*ntop < 10)
        (*ntop)++;
}

void kgpu__zero_to_ten(const int64_t *raw, int n, bool ranked, int *scores)
{
    int64_t lo = INT64_MAX, hi = INT64_MIN, top[10];
    int ntop = 0;
    for (int k = 0; k < n; k++) {
        if (raw[k] == INT64_MIN)
            continue;
        if (ranked)
            keep_top(top, &ntop, raw[k]);
        lo = raw[k] < lo ? raw[k] : lo;
        hi = raw[k] > hi ? raw[k] : hi;
    }
    for (int k = 0; k < n; k++) {
        if (raw[k] == INT64_MIN) {
            scores[k] = 0;
        } else if (ranked) {
            scores[k] = 0;
            for (int t = 0; t < ntop; t++)
                if (raw[k] == top[t]) {
                    scores[k] = 10 - t;
                    break;
                }
        } else if (hi == lo) {
            scores[k] = 10;
        } else {
            /* In doubles: exact for any realistic score, no overflow near INT64_MIN. */
            scores[k] =
                (int)(((double)raw[k] - (double)lo) * 10.0 / ((double)hi - (double)lo) + 0.5);
        }
    }
}

int kgpu_policy_node_scores(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *req,
                            const int *nodes, int n, int *scores, kgpu_error *err)
{
    int total = kgpu_cluster_node_count(c);
    int64_t *raw = malloc((size_t)(n > 0 ? n : 1) * sizeof(*raw));
    if (raw == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory scoring %d nodes", n);
    kgpu_request tmp;
    const kgpu_request *fit = fit_request(p, req, &tmp);
    for (int k = 0; k < n; k++) {
        int i = nodes[k];
        if (i < 0 || i >= total) {
            free(raw);
            return kgpu_error_set(err, KGPU_EINVAL, "no node with index %d", i);
        }
        if (!kgpu__fit(kgpu_cluster_node(c, i), fit)) {
            raw[k] = INT64_MIN;
            continue;
        }
        raw[k] = p->ops->score(p->state, c, i, req);
        if (raw[k] == INT64_MIN)
            raw[k] = INT64_MIN + 1; /* fits: keep it apart from the nodes that do not */
    }
    kgpu__zero_to_ten(raw, n, p->ops->rank_scores && !p->linear, scores);
    free(raw);
    return 0;
}

int64_t kgpu_policy_score(kgpu_policy *p, const kgpu_cluster *c, int node,
                          const kgpu_request *req)
{
    return p->ops->score(p->state, c, node, req);
}
