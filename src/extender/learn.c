/*
 * What the extender learns from the pods it sees: the request shapes and
 * how often each arrives (fgd's target workload, a prior until pods come),
 * and the policies, created on first use and taught the arrivals so far.
 * Caller holds st->mu.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "state_impl.h"

#define TARGET_REBUILD_MIN 32 /* observations between rebuilds of fgd's target workload */
#define MAX_SHAPES         4096
/* Observations replayed into a policy created afresh (after a node rebuild), in proportion. */
#define REPLAY_MAX 4096

typedef ext_shape_info shape_info;

void ext__free_policies(ext_state *st)
{
    for (size_t i = 0; i < sizeof(st->policies) / sizeof(st->policies[0]); i++) {
        kgpu_policy_free(st->policies[i]);
        st->policies[i] = NULL;
    }
}

/*
 * Until pods have been seen, fgd assumes the learner's generic mix of whole
 * GPUs and shares; from then on, the shapes actually requested (online: only
 * what has arrived, never the future).
 */
int ext__set_prior(ext_state *st)
{
    int n;
    const kgpu_shape *prior = kgpu_generic_prior(&n);
    kgpu_shape *s = malloc((size_t)n * sizeof(*s));
    if (s == NULL)
        return KGPU_ENOMEM;
    memcpy(s, prior, (size_t)n * sizeof(*s));
    kgpu_workload_free(&st->target);
    st->target.shapes = s;
    st->target.n = n;
    return 0;
}

/* ---- the workload fgd optimises for ---- */

/* What tells shapes apart, as a key of st->shapes. */
static void shape_key(const shape_info *si, char *key, size_t len)
{
    snprintf(key, len, "%d/%d/%d/%" PRId64 "/%" PRIx64 "/%d/%" PRId64, si->exclusive,
             si->s.gpu_count, si->milli, si->memory_mib, si->s.models, si->open, si->s.cpu_milli);
}

static int shape_id(ext_state *st, const kgpu_request *r)
{
    char key[160];
    shape_info si = {.s = {.cpu_milli = r->cpu_milli,
                           .gpu_milli = r->exclusive ? KGPU_MILLI : r->gpu_milli,
                           .gpu_count = r->gpu_count,
                           .models = r->models},
                     .exclusive = r->exclusive,
                     .milli = r->gpu_milli,
                     .memory_mib = r->gpu_memory_mib,
                     .open = r->nallow == 0};
    shape_key(&si, key, sizeof(key));
    void *v = kgpu_strmap_get(&st->shapes, key);
    if (v != NULL)
        return (int)(intptr_t)v - 1;
    if (st->nshapes >= MAX_SHAPES)
        return -1; /* no caching for the long tail */
    if (st->nshapes == st->shape_cap) {
        int cap = st->shape_cap ? st->shape_cap * 2 : 64;
        shape_info *grown = realloc(st->shape_info, (size_t)cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        st->shape_info = grown;
        st->shape_cap = cap;
    }
    int id = st->nshapes;
    if (!kgpu_strmap_put(&st->shapes, key, (void *)(intptr_t)(id + 1), NULL))
        return -1;
    st->shape_info[id] = si;
    st->nshapes++;
    return id;
}

static int cmp_count_desc(const void *x, const void *y)
{
    const shape_info *a = x, *b = y;
    return a->count < b->count ? 1 : a->count > b->count ? -1 : 0;
}

/* Rebuilds fgd's target from the shapes observed: the most frequent covering 95 %. */
static void rebuild_target(ext_state *st)
{
    if (st->observations == 0)
        return;
    shape_info *tmp = malloc((size_t)st->nshapes * sizeof(*tmp));
    kgpu_shape *out = malloc((size_t)st->nshapes * sizeof(*out));
    if (tmp == NULL || out == NULL) {
        free(tmp);
        free(out);
        return;
    }
    long total = 0;
    for (int i = 0; i < st->nshapes; i++) {
        tmp[i] = st->shape_info[i];
        total += tmp[i].count;
    }
    qsort(tmp, (size_t)st->nshapes, sizeof(*tmp), cmp_count_desc);
    long cum = 0;
    int n = 0;
    while (n < st->nshapes && tmp[n].count > 0 && (double)cum < 0.95 * (double)total)
        cum += tmp[n++].count;
    for (int i = 0; i < n; i++) {
        out[i] = tmp[i].s;
        out[i].p = (double)tmp[i].count / (double)cum;
    }
    free(tmp);
    kgpu_workload_free(&st->target);
    st->target.shapes = out;
    st->target.n = n;
    st->observations_at_build = st->observations;
    for (size_t i = 0; i < sizeof(st->policies) / sizeof(st->policies[0]); i++)
        if (st->policies[i] != NULL)
            kgpu_policy_invalidate(st->policies[i]);
}

/*
 * The model ids in `gone` were reclaimed: no node has those models any
 * more, and the next new models may take the ids. Each learned shape's bit
 * for them becomes what compiling it would give for a model it never saw
 * (allowed when the shape had no allow list), so what was learned about
 * the old model is not laid on a new one. The keys are rebuilt; shapes
 * that now coincide are merged into the first (the other keeps a count of
 * 0, which rebuild_target skips).
 */
void ext__shapes_forget_models(ext_state *st, uint64_t gone)
{
    kgpu_strmap_clear(&st->shapes);
    kgpu_strmap_init(&st->shapes);
    for (int i = 0; i < st->nshapes; i++) {
        shape_info *si = &st->shape_info[i];
        si->s.models = si->open ? si->s.models | gone : si->s.models & ~gone;
        char key[160];
        shape_key(si, key, sizeof(key));
        void *v = kgpu_strmap_get(&st->shapes, key);
        if (v != NULL) {
            st->shape_info[(int)(intptr_t)v - 1].count += si->count;
            si->count = 0;
        } else {
            /* Out of memory: the shape is not found again, and a later one takes its place. */
            kgpu_strmap_put(&st->shapes, key, (void *)(intptr_t)(i + 1), NULL);
        }
    }
    if (st->observations > 0)
        rebuild_target(st); /* fgd's target holds the shapes' masks */
}

/*
 * Whether uid was observed already; if not, remembers it (forgetting the
 * oldest of OBSERVED_MAX). A pod reaches ext__observe() from its first filter and,
 * when bound before this extender started (or by another replica), from the
 * pod list or watch: the set keeps it from being counted on both paths, or
 * again when it falls out of the pending pods and is filtered once more.
 */
static bool observed_before(ext_state *st, const char *uid)
{
    if (uid[0] == '\0' || kgpu_strmap_get(&st->observed, uid) != NULL)
        return uid[0] != '\0';
    char *copy = strdup(uid);
    if (copy == NULL)
        return false;
    int slot = (st->observed_head + st->observed_len) % OBSERVED_MAX;
    if (st->observed_len == OBSERVED_MAX) {
        slot = st->observed_head;
        kgpu_strmap_del(&st->observed, st->observed_order[slot]);
        free(st->observed_order[slot]);
        st->observed_head = (st->observed_head + 1) % OBSERVED_MAX;
        st->observed_len--;
    }
    if (!kgpu_strmap_put(&st->observed, copy, (void *)1, NULL)) {
        free(copy);
        st->observed_order[slot] = NULL;
        return false;
    }
    st->observed_order[slot] = copy;
    st->observed_len++;
    return false;
}

/*
 * Counts an arrived pod, once per uid: its shapes into fgd's target (the
 * online learner) and its requests into every policy that learns from
 * arrivals (kgpu's scarcity: kgpu_policy_observe).
 */
static void observe_requests(ext_state *st, const char *uid, const kgpu_request *const *reqs,
                             int n)
{
    if (observed_before(st, uid))
        return;
    for (int i = 0; i < n; i++) {
        if (reqs[i]->shape >= 0)
            st->shape_info[reqs[i]->shape].count++;
        for (size_t k = 0; k < sizeof(st->policies) / sizeof(st->policies[0]); k++)
            if (st->policies[k] != NULL)
                kgpu_policy_observe(st->policies[k], st->cluster, reqs[i]);
    }
    st->observations++;
    long since = st->observations - st->observations_at_build;
    if (since >= TARGET_REBUILD_MIN && since * 10 >= st->observations_at_build)
        rebuild_target(st);
}

void ext__observe(ext_state *st, const kgpu_pod *pod)
{
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    for (int i = 0; i < pod->nparts; i++)
        reqs[i] = &pod->parts[i].req;
    observe_requests(st, pod->uid, reqs, pod->nparts);
}

int ext_state_compile_gpuless(ext_state *st, const kgpu_pod *pod, kgpu_request *req,
                              kgpu_error *err)
{
    memset(req, 0, sizeof(*req));
    req->cpu_milli = pod->cpu_milli;
    req->memory_mib = pod->memory_mib;
    int rc = kgpu_request_compile(st->cluster, req, err);
    if (rc != 0)
        return rc;
    req->shape = shape_id(st, req);
    const kgpu_request *reqs[1] = {req};
    observe_requests(st, pod->uid, reqs, 1);
    return 0;
}

int ext_state_compile_request(ext_state *st, const char *uid, kgpu_request *req, kgpu_error *err)
{
    int rc = kgpu_request_compile(st->cluster, req, err);
    if (rc != 0)
        return rc;
    req->shape = shape_id(st, req);
    const kgpu_request *reqs[1] = {req};
    observe_requests(st, uid, reqs, 1);
    return 0;
}

int ext_state_compile(ext_state *st, kgpu_pod *pod, kgpu_error *err)
{
    for (int i = 0; i < pod->nparts; i++) {
        kgpu_request *r = &pod->parts[i].req;
        /* CPU and memory stay (on the first part: the pod's): scores use them, fit does not. */
        int rc = kgpu_request_compile(st->cluster, r, err);
        if (rc != 0)
            return rc;
        r->shape = shape_id(st, r);
    }
    return 0;
}
/*
 * A policy created afresh (first use, or after a node rebuild dropped the
 * old one) learns the arrivals seen so far from the shape counts: each
 * shape's count, scaled down to REPLAY_MAX observations in all, keeps the
 * proportions that scarcity is made of at a bounded cost.
 */
static void replay(ext_state *st, kgpu_policy *p)
{
    long total = 0;
    for (int i = 0; i < st->nshapes; i++)
        total += st->shape_info[i].count;
    if (total == 0)
        return;
    double scale = total > REPLAY_MAX ? (double)REPLAY_MAX / (double)total : 1.0;
    for (int i = 0; i < st->nshapes; i++) {
        const kgpu_shape *sh = &st->shape_info[i].s;
        long times = (long)((double)st->shape_info[i].count * scale + 0.5);
        kgpu_request r;
        memset(&r, 0, sizeof(r));
        r.cpu_milli = sh->cpu_milli;
        r.gpu_count = sh->gpu_count;
        r.gpu_milli = sh->gpu_milli;
        r.exclusive = sh->gpu_milli >= KGPU_MILLI;
        r.models = sh->models;
        r.shape = -1;
        for (long k = 0; k < times; k++)
            kgpu_policy_observe(p, st->cluster, &r);
    }
}

kgpu_policy *ext_state_policy(ext_state *st, const kgpu_pod *pod, kgpu_error *err)
{
    const char *name = pod->policy[0] ? pod->policy : st->cfg->policy;
    const kgpu_policy_ops *const *list = kgpu_policy_list();
    for (int i = 0; list[i] != NULL && i < (int)(sizeof(st->policies) / sizeof(st->policies[0]));
         i++) {
        if (strcmp(list[i]->name, name) != 0)
            continue;
        if (st->policies[i] == NULL &&
            (st->policies[i] = kgpu_policy_new(name, st->cluster, &st->target, err)) != NULL) {
            kgpu_policy_set_fit_cpu(st->policies[i], false); /* kube-scheduler's to check */
            replay(st, st->policies[i]);
        }
        return st->policies[i];
    }
    kgpu_error_set(err, KGPU_EINVAL, "unknown policy '%s' (annotation %s)", name, KGPU_ANN_POLICY);
    return NULL;
}
