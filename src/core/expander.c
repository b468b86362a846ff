/*
 * The expanders (kgpu/expander.h). CA's three follow its documented
 * definitions: least-waste scores an option by the idle share of the new
 * nodes' CPU plus that of their memory once the option's pods are on them
 * (GPUs do not enter), price by the nodes' price per hour over the pods'
 * worth per hour, random by nothing; ties go uniformly at random. kgpu's
 * first places the option's pods on template nodes with the real per-GPU
 * fit, drops options that place none (CA's sums promised a pod a node whose
 * GPUs cannot take it: a scale-up that buys an empty node), and scores the
 * rest by cost per worth really placed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/expander.h"

static const char *const names[KGPU_EXPANDER_COUNT] = {"kgpu", "least-waste", "price", "random"};

const char *kgpu_expander_name(kgpu_expander_kind kind)
{
    return kind >= 0 && kind < KGPU_EXPANDER_COUNT ? names[kind] : NULL;
}

int kgpu_expander_parse(const char *name)
{
    for (int k = 0; k < KGPU_EXPANDER_COUNT; k++)
        if (strcmp(name, names[k]) == 0)
            return k;
    return -1;
}

static double pod_worth(const kgpu_expander_ctx *ctx, const kgpu_request *r)
{
    return (double)kgpu__gpu_demand(r) / KGPU_MILLI * ctx->pod_gpu_price +
           (double)r->cpu_milli / 1000.0 * ctx->pod_core_price;
}

/* Most GPU demand first, then most CPU, then the caller's order: the biggest go first. */
typedef struct sized {
    const kgpu_request *r;
    int i;
} sized;

static int bigger_first(const void *x, const void *y)
{
    const sized *a = x, *b = y;
    int64_t ga = kgpu__gpu_demand(a->r), gb = kgpu__gpu_demand(b->r);
    if (ga != gb)
        return ga > gb ? -1 : 1;
    if (a->r->cpu_milli != b->r->cpu_milli)
        return a->r->cpu_milli > b->r->cpu_milli ? -1 : 1;
    return a->i - b->i;
}

int kgpu_expander_real_fit(const kgpu_expander_ctx *ctx, const kgpu_expander_option *opt,
                           double *worth_hour, kgpu_error *err)
{
    if (worth_hour != NULL)
        *worth_hour = 0;
    if (opt->group < 0 || opt->group >= ctx->ngroups || opt->node_count < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "option for group %d of %d, %d nodes", opt->group,
                              ctx->ngroups, opt->node_count);
    if (opt->node_count == 0 || opt->npods == 0)
        return 0;
    const kgpu_node *t = ctx->groups[opt->group].node;
    kgpu_cluster *c = kgpu_cluster_new();
    sized *order = malloc((size_t)opt->npods * sizeof(*order));
    int placed = 0, rc = 0;
    if (c == NULL || order == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    /* The same model ids as the requests were compiled against. */
    for (int id = 0; id < kgpu_cluster_model_count(ctx->models); id++) {
        const char *m = kgpu_cluster_model_name(ctx->models, id);
        if (strcmp(m, "?") != 0 && (rc = kgpu_cluster_model_put(c, id, m)) != 0) {
            kgpu_error_set(err, rc, "model table: %s", m);
            goto out;
        }
    }
    kgpu_gpu_spec gs[KGPU_MAX_GPUS_PER_NODE];
    for (int g = 0; g < t->ngpus; g++)
        gs[g] = (kgpu_gpu_spec){.index = t->gpus[g].index,
                                .model = kgpu_cluster_model_name(ctx->models, t->gpus[g].model),
                                .memory_mib = t->gpus[g].memory_mib,
                                .numa = t->gpus[g].numa,
                                .healthy = true};
    for (int k = 0; k < opt->node_count; k++) {
        char name[32];
        snprintf(name, sizeof(name), "new-%d", k);
        kgpu_node_spec ns = {.name = name,
                             .cpu_milli = t->cpu_milli,
                             .memory_mib = t->memory_mib,
                             .gpus = gs,
                             .ngpus = t->ngpus};
        if ((rc = kgpu_cluster_add_node(c, &ns, err)) < 0)
            goto out;
        rc = 0;
    }
    for (int i = 0; i < opt->npods; i++)
        order[i] = (sized){opt->pods[i], i};
    qsort(order, (size_t)opt->npods, sizeof(*order), bigger_first);
    for (int i = 0; i < opt->npods; i++) {
        const kgpu_request *r = order[i].r;
        for (int k = 0; k < opt->node_count; k++) {
            if (!kgpu_fit(c, k, r, NULL, 0))
                continue;
            int gpus[KGPU_MAX_GPUS_PER_NODE];
            kgpu_assignment a;
            if (r->gpu_count > 0 && kgpu__pick_best_fit(kgpu_cluster_node(c, k), r, gpus) != 0)
                continue;
            if ((rc = kgpu_cluster_apply(c, r, k, gpus, &a, err)) != 0)
                goto out;
            placed++;
            if (worth_hour != NULL)
                *worth_hour += pod_worth(ctx, r);
            break;
        }
    }
out:
    free(order);
    kgpu_cluster_free(c);
    return rc != 0 ? rc : placed;
}

/* CA's least-waste: idle CPU share plus idle memory share of the new nodes, after the pods. */
static double least_waste(const kgpu_expander_ctx *ctx, const kgpu_expander_option *o)
{
    const kgpu_node *t = ctx->groups[o->group].node;
    double cpu = (double)t->cpu_milli * o->node_count, mem = (double)t->memory_mib * o->node_count;
    double rcpu = 0, rmem = 0;
    for (int i = 0; i < o->npods; i++) {
        rcpu += (double)o->pods[i]->cpu_milli;
        rmem += (double)o->pods[i]->memory_mib;
    }
    double wc = cpu > 0 ? (cpu - rcpu) / cpu : 0, wm = mem > 0 ? (mem - rmem) / mem : 0;
    return wc + wm;
}

int kgpu_expander_choose(const kgpu_expander_ctx *ctx, kgpu_expander_kind kind,
                         const kgpu_expander_option *opts, int nopts, kgpu_rng *rng,
                         kgpu_expander_eval *evals, int *choice, kgpu_error *err)
{
    *choice = -1;
    if (kind < 0 || kind >= KGPU_EXPANDER_COUNT)
        return kgpu_error_set(err, KGPU_EINVAL, "unknown expander %d", (int)kind);
    if (nopts <= 0)
        return 0;
    kgpu_expander_eval *ev = evals ? evals : malloc((size_t)nopts * sizeof(*ev));
    int *best = malloc((size_t)nopts * sizeof(*best));
    int rc = 0, nbest = 0;
    if (ev == NULL || best == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < nopts; i++) {
        const kgpu_expander_option *o = &opts[i];
        if (o->group < 0 || o->group >= ctx->ngroups) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "option %d: group %d of %d", i, o->group,
                                ctx->ngroups);
            goto out;
        }
        kgpu_expander_eval *e = &ev[i];
        e->cost_hour = ctx->groups[o->group].price_hour * o->node_count;
        e->placed = o->npods;
        e->worth_hour = 0;
        for (int p = 0; p < o->npods; p++)
            e->worth_hour += pod_worth(ctx, o->pods[p]);
        switch (kind) {
        case KGPU_EXPANDER_LEAST_WASTE:
            e->score = least_waste(ctx, o);
            break;
        case KGPU_EXPANDER_PRICE:
            e->score = e->worth_hour > 0 ? e->cost_hour / e->worth_hour : INFINITY;
            break;
        case KGPU_EXPANDER_RANDOM:
            e->score = 0;
            break;
        default: {
            int n = kgpu_expander_real_fit(ctx, o, &e->worth_hour, err);
            if (n < 0) {
                rc = n;
                goto out;
            }
            e->placed = n;
            /*
             * Pods that ask for nothing priced are still worth placing: a
             * floor keeps their options finite and ranks them by cost.
             */
            e->score = n == 0 ? INFINITY : e->cost_hour / fmax(e->worth_hour, 1e-9);
            break;
        }
        }
    }
    for (int i = 0; i < nopts; i++) {
        if (isinf(ev[i].score))
            continue;
        if (nbest == 0) {
            best[nbest++] = i;
            continue;
        }
        const kgpu_expander_eval *a = &ev[i], *b = &ev[best[0]];
        /* Relative tolerance: the same figures summed in another order stay tied. */
        double tol = 1e-9 * fmax(fabs(a->score), fabs(b->score));
        int cmp = a->score < b->score - tol ? -1 : a->score > b->score + tol ? 1 : 0;
        if (cmp == 0 && kind == KGPU_EXPANDER_KGPU) {
            cmp = a->placed != b->placed ? (a->placed > b->placed ? -1 : 1)
                  : a->cost_hour != b->cost_hour ? (a->cost_hour < b->cost_hour ? -1 : 1)
                                                  : 1; /* the lower index stays */
        }
        if (cmp < 0)
            nbest = 0;
        if (cmp <= 0)
            best[nbest++] = i;
    }
    if (nbest > 0)
        *choice = nbest == 1 ? best[0] : best[kgpu_rng_below(rng, (uint64_t)nbest)];
out:
    if (ev != evals)
        free(ev);
    free(best);
    return rc;
}
