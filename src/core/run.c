/*
 * What the simulators start a run from (sim.c, churn.c, autoscale.c): the
 * FGD study's workload volume drawn from the trace's pods, in arrival order
 * for the timed ones, the run's policy, fixed or learning the workload
 * online, and the quantiles they report. Below both, so that neither calls the
 * other.
 */
#include <math.h>
#include <stdlib.h>

#include "core.h"

#define SIM_MAX_PODS 20000000 /* guards against a workload that never reaches its target */

int kgpu__workload_draw(const kgpu_request *reqs, size_t n, int64_t capacity_milli, double inflate,
                        kgpu_rng *rng, size_t **order, size_t *len, kgpu_error *err)
{
    size_t cap = n + n / 2 + 16, k = n;
    size_t *o = malloc(cap * sizeof(*o));
    if (o == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory building the workload");
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        o[i] = i;
        total += kgpu__gpu_demand(&reqs[i]);
    }
    double target = inflate * (double)capacity_milli;
    if (inflate > 0 && (double)total > target) {
        /* Over the target already: drop random pods until it fits. */
        while (k > 0 && (double)total > target) {
            size_t j = (size_t)kgpu_rng_below(rng, k);
            total -= kgpu__gpu_demand(&reqs[o[j]]);
            o[j] = o[--k];
        }
    } else if (inflate > 0 && total > 0) {
        /* Sample with replacement until the next pod would pass the target. */
        for (;;) {
            size_t j = (size_t)kgpu_rng_below(rng, n);
            int64_t d = kgpu__gpu_demand(&reqs[j]);
            if ((double)(total + d) > target)
                break;
            if (k == cap) {
                if (cap >= SIM_MAX_PODS) {
                    free(o);
                    return kgpu_error_set(err, KGPU_ERANGE,
                                          "workload passes %d pods before reaching %.2fx capacity",
                                          SIM_MAX_PODS, inflate);
                }
                cap *= 2;
                size_t *g = realloc(o, cap * sizeof(*o));
                if (g == NULL) {
                    free(o);
                    return kgpu_error_set(err, KGPU_ENOMEM, "out of memory building the workload");
                }
                o = g;
            }
            o[k++] = j;
            total += d;
        }
    }
    *order = o;
    *len = k;
    return 0;
}

int kgpu__policy_open(const char *policy, bool online, const kgpu_cluster *c,
                      const kgpu_workload *fixed, kgpu_policy **p, kgpu_learner **learner,
                      bool *online_out, kgpu_error *err)
{
    const kgpu_policy_ops *ops = kgpu_policy_find(policy);
    *online_out = online || (ops != NULL && ops->online_only);
    if (*online_out && (*learner = kgpu_learner_new(0.95, NULL, 0, err)) == NULL)
        return err ? err->code : KGPU_ENOMEM;
    const kgpu_workload *target = *learner ? kgpu_learner_workload(*learner) : fixed;
    if ((*p = kgpu_policy_new(policy, c, target, err)) == NULL)
        return err ? err->code : KGPU_EINVAL;
    return 0;
}

int kgpu__policy_learn(kgpu_policy *p, kgpu_learner *learner, const kgpu_cluster *c,
                       const kgpu_request *req, kgpu_error *err)
{
    if (learner != NULL) {
        int lr = kgpu_learner_observe(learner, req);
        if (lr < 0)
            return kgpu_error_set(err, lr, "out of memory learning the workload");
        if (lr == 1)
            kgpu_policy_invalidate(p);
    }
    kgpu_policy_observe(p, c, req);
    return 0;
}

int kgpu__cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

double kgpu__quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)ceil(q * (double)n);
    return v[i > 0 ? i - 1 : 0];
}

/* Arrival k of a run in time order; equal times keep the file's order, copies after their original. */
typedef struct slot_key {
    double t;
    size_t req, k;
} slot_key;

static int slot_cmp(const void *x, const void *y)
{
    const slot_key *a = x, *b = y;
    if (a->t != b->t)
        return a->t < b->t ? -1 : 1;
    if (a->req != b->req)
        return a->req < b->req ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

int kgpu__arrivals(const kgpu_churn_input *in, double inflate, kgpu_rng *rng, size_t **slots,
                   size_t *len, kgpu_error *err)
{
    const kgpu_sim_input *sim = in->sim;
    size_t *o, k;
    int rc = kgpu__workload_draw(sim->requests, sim->nrequests, sim->capacity_milli, inflate, rng,
                                 &o, &k, err);
    if (rc != 0)
        return rc;
    slot_key *keys = malloc((k ? k : 1) * sizeof(*keys));
    if (keys == NULL) {
        free(o);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory building the workload");
    }
    for (size_t i = 0; i < k; i++)
        keys[i] = (slot_key){in->creation[o[i]], o[i], i};
    qsort(keys, k, sizeof(*keys), slot_cmp);
    for (size_t i = 0; i < k; i++)
        o[i] = keys[i].req;
    free(keys);
    *slots = o;
    *len = k;
    return 0;
}
