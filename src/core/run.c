/*
 * What both simulators start a run from (sim.c, churn.c): the FGD study's
 * workload volume drawn from the trace's pods, and the run's policy, fixed
 * or learning the workload online. Below both, so that neither calls the
 * other.
 */
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
