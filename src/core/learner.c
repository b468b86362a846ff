/*
 * Online learning of the target workload: the shape mix of the pods seen so
 * far, never the future. A policy that plans for "the pods to come" (fgd,
 * kgpu) can only know them from the past in a real cluster; this module is
 * what the simulator's online mode and the placement policies learn from.
 *
 * Counting is O(1) per pod (an open-addressing table of shape counts); the
 * workload is rebuilt each time the count has grown by a tenth, so a run of
 * N pods rebuilds O(log N) times and caches keyed on the workload stay warm.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define LEARN_GROWTH  0.10 /* rebuild when the count grew by this fraction since the last one */
#define LEARN_MIN_CAP 64

/*
 * Until the first pod is seen and when the operator gives no prior: a
 * generic mix of whole GPUs and shares (the extender's start-up guess).
 */
static const kgpu_shape generic_prior[] = {
    {.gpu_milli = 1000, .gpu_count = 1, .models = ~0ULL, .p = 0.35},
    {.gpu_milli = 500, .gpu_count = 1, .models = ~0ULL, .p = 0.25},
    {.gpu_milli = 250, .gpu_count = 1, .models = ~0ULL, .p = 0.15},
    {.gpu_milli = 1000, .gpu_count = 2, .models = ~0ULL, .p = 0.15},
    {.gpu_milli = 1000, .gpu_count = 4, .models = ~0ULL, .p = 0.10},
};

typedef struct learn_slot {
    kgpu_shape s; /* s.p holds the count */
    bool used;
} learn_slot;

struct kgpu_learner {
    double coverage;
    kgpu_shape *prior; /* owned copy; p = probability */
    int nprior;
    double prior_pods;
    learn_slot *slots; /* cap entries, a power of two */
    size_t cap, used;
    long observed, at_build;
    kgpu_workload w; /* what policies borrow: the struct's address never changes */
};

static uint64_t shape_hash(const kgpu_shape *s)
{
    uint64_t h = (uint64_t)s->cpu_milli * 0x9E3779B97F4A7C15ULL;
    h ^= ((uint64_t)(unsigned)s->gpu_milli << 32 | (uint64_t)(unsigned)s->gpu_count) +
         0x632BE59BD9B4E019ULL + (h << 6) + (h >> 2);
    h ^= s->models + 0x8CB92BA72F3D8DD7ULL + (h << 6) + (h >> 2);
    return h ^ (h >> 29);
}

static bool same_key(const kgpu_shape *a, const kgpu_shape *b)
{
    return a->cpu_milli == b->cpu_milli && a->gpu_milli == b->gpu_milli &&
           a->gpu_count == b->gpu_count && a->models == b->models;
}

/* The slot of key s: its own, or the empty one where it belongs. */
static learn_slot *find_slot(learn_slot *slots, size_t cap, const kgpu_shape *s)
{
    size_t i = (size_t)shape_hash(s) & (cap - 1);
    while (slots[i].used && !same_key(&slots[i].s, s))
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

static int grow(kgpu_learner *l)
{
    size_t cap = l->cap ? l->cap * 2 : LEARN_MIN_CAP;
    learn_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return KGPU_ENOMEM;
    for (size_t i = 0; i < l->cap; i++)
        if (l->slots[i].used)
            *find_slot(slots, cap, &l->slots[i].s) = l->slots[i];
    free(l->slots);
    l->slots = slots;
    l->cap = cap;
    return 0;
}

const kgpu_shape *kgpu_generic_prior(int *n)
{
    *n = (int)(sizeof(generic_prior) / sizeof(generic_prior[0]));
    return generic_prior;
}

/* Rebuilds l->w from the counts and the prior's pseudo-counts. */
static int rebuild(kgpu_learner *l)
{
    const kgpu_shape *prior = l->prior ? l->prior : generic_prior;
    int nprior = l->prior ? l->nprior : (int)(sizeof(generic_prior) / sizeof(generic_prior[0]));
    /* The generic guess only stands in while nothing is known; an operator's prior keeps its
     * weight. */
    double pw = l->prior ? l->prior_pods : (l->observed == 0 ? 1.0 : 0.0);
    kgpu_shape *groups = malloc((l->used + (size_t)nprior + 1) * sizeof(*groups));
    if (groups == NULL)
        return KGPU_ENOMEM;
    size_t ng = 0;
    for (size_t i = 0; i < l->cap; i++)
        if (l->slots[i].used)
            groups[ng++] = l->slots[i].s;
    for (int k = 0; k < nprior && pw > 0; k++) {
        size_t j = 0;
        while (j < ng && !same_key(&groups[j], &prior[k]))
            j++;
        if (j == ng)
            groups[ng++] = (kgpu_shape){.cpu_milli = prior[k].cpu_milli,
                                        .gpu_milli = prior[k].gpu_milli,
                                        .gpu_count = prior[k].gpu_count,
                                        .models = prior[k].models};
        groups[j].p += prior[k].p * pw;
    }
    kgpu_workload w;
    int rc = kgpu__workload_from_weights(groups, ng, l->coverage, &w);
    free(groups);
    if (rc != 0)
        return rc;
    if (w.n == 0) {
        kgpu_workload_free(&w);
        return 0; /* nothing to learn from yet: keep what there is */
    }
    kgpu_workload_free(&l->w);
    l->w = w;
    l->at_build = l->observed;
    return 0;
}

kgpu_learner *kgpu_learner_new(double coverage, const kgpu_workload *prior, double prior_pods,
                               kgpu_error *err)
{
    if (!(coverage > 0 && coverage <= 1)) {
        kgpu_error_set(err, KGPU_EINVAL, "coverage %.3f outside (0, 1]", coverage);
        return NULL;
    }
    if (prior != NULL && prior->n > 0 && !(prior_pods > 0)) {
        kgpu_error_set(err, KGPU_EINVAL, "a prior needs a positive weight in pods, not %g",
                       prior_pods);
        return NULL;
    }
    kgpu_learner *l = calloc(1, sizeof(*l));
    if (l == NULL)
        goto oom;
    l->coverage = coverage;
    l->prior_pods = prior_pods;
    if (prior != NULL && prior->n > 0) {
        if ((l->prior = malloc((size_t)prior->n * sizeof(*l->prior))) == NULL)
            goto oom;
        memcpy(l->prior, prior->shapes, (size_t)prior->n * sizeof(*l->prior));
        l->nprior = prior->n;
    }
    if (grow(l) != 0 || rebuild(l) != 0)
        goto oom;
    return l;
oom:
    kgpu_learner_free(l);
    kgpu_error_set(err, KGPU_ENOMEM, "out of memory for the workload learner");
    return NULL;
}

void kgpu_learner_free(kgpu_learner *l)
{
    if (l == NULL)
        return;
    free(l->prior);
    free(l->slots);
    kgpu_workload_free(&l->w);
    free(l);
}

int kgpu_learner_observe(kgpu_learner *l, const kgpu_request *req)
{
    if (2 * (l->used + 1) > l->cap && grow(l) != 0)
        return KGPU_ENOMEM;
    kgpu_shape s = kgpu__shape_of(req);
    learn_slot *slot = find_slot(l->slots, l->cap, &s);
    if (!slot->used) {
        slot->used = true;
        slot->s = s;
        slot->s.p = 0;
        l->used++;
    }
    slot->s.p += 1;
    l->observed++;
    if ((double)(l->observed - l->at_build) < LEARN_GROWTH * (double)l->at_build && l->at_build > 0)
        return 0;
    int rc = rebuild(l);
    return rc != 0 ? rc : 1;
}

const kgpu_workload *kgpu_learner_workload(const kgpu_learner *l)
{
    return &l->w;
}

long kgpu_learner_count(const kgpu_learner *l)
{
    return l->observed;
}
