/*
 * The extender's cluster state: GPU inventory (a core kgpu_cluster), the pods
 * holding GPUs (reserved by a bind in flight, or bound), pods remembered from
 * filter for their bind, the workload mix fgd optimises for, and GPU-hours per
 * namespace. Every function here expects st->mu held by the caller (see ext.h):
 * all of it is in-memory work, no I/O.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ext.h"

#define TARGET_REBUILD_MIN 32 /* observations between rebuilds of fgd's target workload */
#define MAX_SHAPES         4096
/* Pod uids remembered as observed: a pod is counted once unless this many newer pods came since. */
#define OBSERVED_MAX 16384
/* Observations replayed into a policy created afresh (after a node rebuild), in proportion. */
#define REPLAY_MAX 4096

double ext_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef ext_shape_info shape_info;

static void free_policies(ext_state *st)
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
static int set_prior(ext_state *st)
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

int ext_state_init(ext_state *st, const ext_config *cfg, ext_metrics *m, kgpu_error *err)
{
    memset(st, 0, sizeof(*st));
    st->cfg = cfg;
    st->metrics = m;
    pthread_mutex_init(&st->mu, NULL);
    kgpu_strmap_init(&st->shapes);
    kgpu_strmap_init(&st->pods);
    kgpu_strmap_init(&st->orphans);
    kgpu_strmap_init(&st->cpu_pods);
    kgpu_strmap_init(&st->pending);
    kgpu_strmap_init(&st->awaiting);
    kgpu_strmap_init(&st->ns_usage);
    kgpu_strmap_init(&st->observed);
    kgpu_strmap_init(&st->ns_queue);
    kgpu_strmap_init(&st->reclaims);
    kgpu_strmap_init(&st->refused);
    kgpu_strmap_init(&st->unsched);
    kgpu_strmap_init(&st->dra_nodes);
    kgpu_strmap_init(&st->dra_slices);
    kgpu_strmap_init(&st->dra_claims);
    st->observed_order = calloc(OBSERVED_MAX, sizeof(char *));
    st->cluster = kgpu_cluster_new();
    if (st->cluster == NULL || st->observed_order == NULL || set_prior(st) != 0) {
        ext_state_destroy(st);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    kgpu_rng_seed(&st->rng, (uint64_t)time(NULL), 7);
    st->usage_at = ext_now();
    return 0;
}

void ext_state_destroy(ext_state *st)
{
    free_policies(st);
    kgpu_cluster_free(st->cluster);
    kgpu_workload_free(&st->target);
    const char *k;
    void *v;
    size_t i = 0;
    while (kgpu_strmap_next(&st->pods, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->pending, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->ns_usage, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->orphans, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->awaiting, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->cpu_pods, &i, &k, &v))
        free(v);
    kgpu_strmap *owning[] = {&st->ns_queue,  &st->reclaims,   &st->refused,
                             &st->dra_nodes, &st->dra_slices, &st->dra_claims};
    for (size_t m = 0; m < sizeof(owning) / sizeof(owning[0]); m++)
        kgpu_strmap_clear_free(owning[m]);
    ext_unsched_clear(st);
    kgpu_queues_free(st->queues);
    kgpu_queues_free(st->queues_spec);
    json_decref(st->gpuqueues);
    free(st->queue_evictions);
    kgpu_strmap_clear(&st->cpu_pods);
    kgpu_strmap_clear(&st->awaiting);
    kgpu_strmap_clear(&st->orphans);
    kgpu_strmap_clear(&st->pods);
    kgpu_strmap_clear(&st->pending);
    kgpu_strmap_clear(&st->ns_usage);
    kgpu_strmap_clear(&st->shapes);
    kgpu_strmap_clear(&st->observed);
    for (int j = 0; st->observed_order != NULL && j < OBSERVED_MAX; j++)
        free(st->observed_order[j]);
    free(st->observed_order);
    free(st->shape_info);
    pthread_mutex_destroy(&st->mu);
    memset(st, 0, sizeof(*st));
}

/* ---- GPU-hours per namespace ---- */

void ext_state_integrate_usage(ext_state *st)
{
    double now = ext_now(), dt = now - st->usage_at;
    st->usage_at = now;
    if (dt <= 0)
        return;
    const char *k;
    void *v;
    size_t i = 0;
    while (kgpu_strmap_next(&st->ns_usage, &i, &k, &v)) {
        ext_ns_usage *u = v;
        u->gpu_seconds += u->gpus * dt;
    }
}

static void usage_add(ext_state *st, const char *ns, double gpus)
{
    ext_state_integrate_usage(st);
    ext_ns_usage *u = kgpu_strmap_get(&st->ns_usage, ns);
    if (u == NULL) {
        u = calloc(1, sizeof(*u));
        if (u == NULL || !kgpu_strmap_put(&st->ns_usage, ns, u, NULL)) {
            free(u);
            return;
        }
    }
    u->gpus += gpus;
    if (u->gpus < 1e-9)
        u->gpus = 0;
}

/* The GPU fraction an assignment holds: compute or memory, whichever is larger, per GPU. */
static double held_gpus(const kgpu_node *n, const kgpu_assignment *a)
{
    double sum = 0;
    for (int i = 0; i < a->ngpus; i++) {
        const kgpu_gpu *g = &n->gpus[a->gpus[i]];
        double f = a->exclusive ? 1.0 : a->gpu_milli / 1000.0;
        if (!a->exclusive && g->memory_mib > 0) {
            double m = (double)a->gpu_memory_mib / (double)g->memory_mib;
            if (m > f)
                f = m;
        }
        sum += f;
    }
    return sum;
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
static void shapes_forget_models(ext_state *st, uint64_t gone)
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
 * oldest of OBSERVED_MAX). A pod reaches observe() from its first filter and,
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

static void observe(ext_state *st, const kgpu_pod *pod)
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

void ext_fit_requests(const kgpu_pod *pod, kgpu_request *tmp, const kgpu_request **out)
{
    for (int i = 0; i < pod->nparts; i++) {
        tmp[i] = pod->parts[i].req;
        tmp[i].cpu_milli = 0;
        tmp[i].memory_mib = 0;
        out[i] = &tmp[i];
    }
}

_Static_assert(KGPU_MAX_PARTS <= KGPU_PLACE_MAX_REQS,
               "a pod's GPU containers must fit in one placement search");

/* Applies req with its CPU and memory clamped to what node idx has free (see ext_fit_requests). */
static int apply_clamped(kgpu_cluster *c, const kgpu_request *req, int idx, const int *gpus,
                         kgpu_assignment *out, kgpu_error *err)
{
    const kgpu_node *n = kgpu_cluster_node(c, idx);
    kgpu_request r = *req;
    if (n != NULL) {
        int64_t cpu = n->cpu_free > 0 ? n->cpu_free : 0,
                mem = n->memory_free > 0 ? n->memory_free : 0;
        r.cpu_milli = r.cpu_milli < cpu ? r.cpu_milli : cpu;
        r.memory_mib = r.memory_mib < mem ? r.memory_mib : mem;
    }
    return kgpu_cluster_apply(c, &r, idx, gpus, out, err);
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

/* ---- pods remembered from filter ---- */

void ext_pod_copy(kgpu_pod *dst, const kgpu_pod *src)
{
    *dst = *src;
    for (int i = 0; i < KGPU_MAX_GLOBS; i++) {
        dst->allow[i] = dst->allow_buf[i];
        dst->exclude[i] = dst->exclude_buf[i];
    }
    for (int i = 0; i < dst->nparts; i++) {
        dst->parts[i].req.allow = dst->allow;
        dst->parts[i].req.exclude = dst->exclude;
    }
}

/* Takes f out of the recency list. */
static void pending_unlink(ext_state *st, ext_filtered *f)
{
    if (f->older != NULL)
        f->older->newer = f->newer;
    else
        st->pending_oldest = f->newer;
    if (f->newer != NULL)
        f->newer->older = f->older;
    else
        st->pending_newest = f->older;
    f->older = f->newer = NULL;
}

static void forget(ext_state *st, const char *uid)
{
    ext_filtered *f = kgpu_strmap_del(&st->pending, uid);
    if (f == NULL)
        return;
    pending_unlink(st, f);
    free(f);
}

/* Puts f at the recent end of the recency list. */
static void pending_push(ext_state *st, ext_filtered *f)
{
    f->newer = NULL;
    f->older = st->pending_newest;
    if (st->pending_newest != NULL)
        st->pending_newest->newer = f;
    else
        st->pending_oldest = f;
    st->pending_newest = f;
}

/*
 * Eviction is by when a pod was last filtered, not first: kube-scheduler
 * filters a pod again on every retry, right before its bind, so a pod it is
 * about to bind is among the newest whatever else was filtered before. A
 * flood of filter calls can still push a pod out between its filter and its
 * bind; with an API server its bind then fetches the pod (bind_pod), so the
 * flood costs a GET, not the bind.
 */
ext_filtered *ext_state_remember(ext_state *st, const kgpu_pod *pod, const ext_asks *asks)
{
    ext_filtered *old = kgpu_strmap_get(&st->pending, pod->uid);
    if (old != NULL) {
        ext_pod_copy(&old->pod, pod); /* a filter retry: newer spec wins, and it is the newest */
        old->asks = *asks;
        pending_unlink(st, old);
        pending_push(st, old);
        return old;
    }
    ext_filtered *copy = calloc(1, sizeof(*copy));
    if (copy == NULL)
        return NULL;
    ext_pod_copy(&copy->pod, pod);
    copy->asks = *asks;
    if (st->pending.len >= (size_t)st->cfg->pending_pods_max && st->pending_oldest != NULL)
        forget(st, st->pending_oldest->pod.uid);
    if (!kgpu_strmap_put(&st->pending, pod->uid, copy, NULL)) {
        free(copy);
        return NULL;
    }
    pending_push(st, copy);
    if (kgpu_strmap_get(&st->pods, pod->uid) == NULL)
        observe(st, &copy->pod);
    return copy;
}

const ext_filtered *ext_state_recall(ext_state *st, const char *uid)
{
    return kgpu_strmap_get(&st->pending, uid);
}

/* ---- holding and releasing GPUs ---- */

static void hold(ext_state *st, ext_pod *p)
{
    p->since = ext_now();
    const kgpu_node *n =
        kgpu_cluster_node(st->cluster, kgpu_cluster_find_node(st->cluster, p->node));
    p->gpus = 0;
    for (int i = 0; i < p->nparts && n != NULL; i++)
        p->gpus += held_gpus(n, &p->part[i].a);
    usage_add(st, p->ns, p->gpus);
}

static void unhold(ext_state *st, ext_pod *p)
{
    for (int i = p->nparts - 1; i >= 0; i--) {
        kgpu_error err;
        if (kgpu_cluster_release(st->cluster, &p->part[i].a, &err) != 0)
            ext_log(EXT_ERROR, "release of %s/%s failed: %s", p->ns, p->name, err.msg);
    }
    ext_queues_uncharge(st, p);
    usage_add(st, p->ns, -p->gpus);
}

static ext_pod *new_pod(int nparts)
{
    return calloc(1, sizeof(ext_pod) + (size_t)(nparts > 0 ? nparts : 1) * sizeof(ext_pod_part));
}

int ext_state_reserve(ext_state *st, const kgpu_pod *pod, const char *node,
                      const char *queue_label, int priority, const ext_pod **out,
                      kgpu_error *err)
{
    ext_pod *held = kgpu_strmap_get(&st->pods, pod->uid);
    if (held != NULL) {
        *out = held;
        return kgpu_error_set(err, KGPU_EEXIST, "pod %s/%s already holds GPUs on %s", pod->ns,
                              pod->name, held->node);
    }
    int idx = kgpu_cluster_find_node(st->cluster, node);
    if (idx < 0)
        return kgpu_error_set(err, KGPU_ENOENT, "node %s has no GPU inventory known to kgpu", node);
    if (ext_dra_is_node(st, node))
        return kgpu_error_set(err, KGPU_ENOENT, "node %s is %s", node, EXT_DRA_NODE_REASON);
    kgpu_policy *pol = ext_state_policy(st, pod, err);
    if (pol == NULL)
        return err ? err->code : KGPU_EINVAL;
    ext_pod *p = new_pod(pod->nparts);
    if (p == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    snprintf(p->uid, sizeof(p->uid), "%s", pod->uid);
    snprintf(p->ns, sizeof(p->ns), "%.63s", pod->ns);
    snprintf(p->name, sizeof(p->name), "%s", pod->name);
    snprintf(p->node, sizeof(p->node), "%s", node);
    snprintf(p->queue_label, sizeof(p->queue_label), "%s", queue_label ? queue_label : "");
    ext_queues_name_pod(st, p);
    p->priority = priority;
    p->status = POD_RESERVED;
    /* The one placement search decides, as it did for filter; the policy picks within it. */
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    kgpu_assignment a[KGPU_MAX_PARTS];
    for (int i = 0; i < pod->nparts; i++)
        reqs[i] = &pod->parts[i].req;
    kgpu_error why;
    kgpu_error_clear(&why);
    int rc = kgpu_policy_place(pol, st->cluster, idx, reqs, pod->nparts, &st->rng, a, &why);
    if (rc == KGPU_ENOFIT && pod->nparts == 1)
        kgpu_error_set(err, rc, "container %s does not fit node %s: %s", pod->parts[0].container,
                       node, why.msg);
    else if (rc == KGPU_ENOFIT)
        kgpu_error_set(err, rc, "the pod's %d GPU containers do not fit node %s together: %s",
                       pod->nparts, node, why.msg);
    else if (rc != 0)
        kgpu_error_set(err, rc, "%s", why.msg);
    for (int i = 0; i < pod->nparts && rc == 0; i++) {
        p->part[i].a = a[i];
        snprintf(p->part[i].container, sizeof(p->part[i].container), "%.63s",
                 pod->parts[i].container);
        p->nparts = i + 1;
    }
    /* Its queue's limits hold for the GPUs actually chosen (filter checked the node's). */
    if (rc == 0 && (rc = ext_queues_charge(st, p, false, &why)) != 0)
        kgpu_error_set(err, rc, "%s", why.msg);
    if (rc != 0 || !kgpu_strmap_put(&st->pods, p->uid, p, NULL)) {
        ext_queues_uncharge(st, p);
        for (int i = p->nparts - 1; i >= 0; i--) /* the parts applied so far */
            kgpu_cluster_release(st->cluster, &p->part[i].a, NULL);
        free(p);
        return rc != 0 ? rc : kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    hold(st, p);
    *out = p;
    return 0;
}

void ext_state_confirm(ext_state *st, const char *uid)
{
    ext_pod *p = kgpu_strmap_get(&st->pods, uid);
    if (p != NULL)
        p->status = POD_BOUND;
}

void ext_state_release(ext_state *st, const char *uid)
{
    ext_await_drop(st, uid); /* a bind refused, or a pod gone: kubelet will not allocate it */
    ext_pod *p = kgpu_strmap_del(&st->pods, uid);
    if (p == NULL)
        return;
    unhold(st, p);
    free(p);
}

/* ---- pods without kgpu GPUs: their CPU and memory ---- */

/* Takes p's CPU and memory from its node in c (clamped to what is free). false: no such node. */
static bool cpu_take(kgpu_cluster *c, ext_cpu_pod *p)
{
    int idx = kgpu_cluster_find_node(c, p->node);
    if (idx < 0)
        return false;
    kgpu_request r;
    memset(&r, 0, sizeof(r));
    r.cpu_milli = p->cpu_milli;
    r.memory_mib = p->memory_mib;
    r.models = ~0ULL;
    r.shape = -1;
    return apply_clamped(c, &r, idx, NULL, &p->a, NULL) == 0;
}

/*
 * A bound pod with no kgpu assignment. Counted once, with the requests it had
 * when first seen bound; only on nodes of the inventory (a pod on a node that
 * joins the inventory later is counted at the next relist).
 */
static void cpu_pod_seen(ext_state *st, const kgpu_pod *pod)
{
    if (kgpu_strmap_get(&st->cpu_pods, pod->uid) != NULL ||
        (pod->cpu_milli <= 0 && pod->memory_mib <= 0) ||
        kgpu_cluster_find_node(st->cluster, pod->node) < 0)
        return;
    ext_cpu_pod *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return;
    snprintf(p->node, sizeof(p->node), "%s", pod->node);
    p->cpu_milli = pod->cpu_milli;
    p->memory_mib = pod->memory_mib;
    if (!cpu_take(st->cluster, p) || !kgpu_strmap_put(&st->cpu_pods, pod->uid, p, NULL)) {
        free(p);
        return;
    }
}

static void cpu_pod_gone(ext_state *st, const char *uid)
{
    ext_cpu_pod *p = kgpu_strmap_del(&st->cpu_pods, uid);
    if (p == NULL)
        return;
    kgpu_error err;
    if (kgpu_cluster_release(st->cluster, &p->a, &err) != 0)
        ext_log(EXT_ERROR, "release of the CPU of pod %s failed: %s", uid, err.msg);
    free(p);
}

/* ---- what the API server says ---- */

/* Position of GPU `index` (or `uuid`) on node n, or -1. */
static int gpu_position(const kgpu_node *n, int index, const char *uuid)
{
    if (uuid != NULL && uuid[0] != '\0')
        for (int i = 0; i < n->ngpus; i++)
            if (strcmp(n->gpus[i].uuid, uuid) == 0)
                return i;
    for (int i = 0; i < n->ngpus; i++)
        if (n->gpus[i].index == index)
            return i;
    return -1;
}

static void drop_orphan(ext_state *st, const char *uid)
{
    free(kgpu_strmap_del(&st->orphans, uid));
}

/* Remembers a bound pod whose assignment cannot be applied now; `why` is logged once. */
static void keep_orphan(ext_state *st, const char *uid, const char *ns, const char *name,
                        const char *node, const kgpu_assigned_part *parts, int n, int64_t cpu_milli,
                        int64_t memory_mib, const char *queue_label, int priority,
                        const char *why)
{
    if (kgpu_strmap_get(&st->orphans, uid) != NULL)
        return;
    ext_orphan *o = calloc(1, sizeof(*o) + (size_t)(n > 0 ? n : 1) * sizeof(*parts));
    if (o == NULL)
        return;
    snprintf(o->uid, sizeof(o->uid), "%s", uid);
    snprintf(o->ns, sizeof(o->ns), "%.63s", ns);
    snprintf(o->name, sizeof(o->name), "%s", name);
    snprintf(o->node, sizeof(o->node), "%s", node);
    o->since = ext_now();
    o->cpu_milli = cpu_milli;
    o->memory_mib = memory_mib;
    snprintf(o->queue_label, sizeof(o->queue_label), "%s", queue_label);
    o->priority = priority;
    o->n = n;
    memcpy(o->parts, parts, (size_t)n * sizeof(*parts));
    if (!kgpu_strmap_put(&st->orphans, uid, o, NULL)) {
        free(o);
        return;
    }
    ext_log(EXT_WARN,
            "pod %s/%s: its GPUs on %s cannot be counted now (%s); kept, retried when "
            "the inventory changes",
            ns, name, node, why);
}

/*
 * Applies a bound pod's recorded assignment exactly. Returns NULL on success,
 * else why not (nothing is then held): the node or a GPU is not in the
 * inventory, or the GPUs are taken (`*conflict`).
 */
static const char *try_adopt(ext_state *st, const char *uid, const char *ns, const char *name,
                             const char *nodename, const kgpu_assigned_part *parts, int n,
                             int64_t cpu_milli, int64_t memory_mib, const char *queue_label,
                             int priority, bool *conflict)
{
    static __thread char problem[300];
    *conflict = false;
    int idx = kgpu_cluster_find_node(st->cluster, nodename);
    if (idx < 0)
        return "the node is not in kgpu's inventory";
    const kgpu_node *node = kgpu_cluster_node(st->cluster, idx);
    ext_pod *p = new_pod(n);
    if (p == NULL)
        return "out of memory";
    snprintf(p->uid, sizeof(p->uid), "%s", uid);
    snprintf(p->ns, sizeof(p->ns), "%.63s", ns);
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->node, sizeof(p->node), "%s", nodename);
    snprintf(p->queue_label, sizeof(p->queue_label), "%s", queue_label);
    ext_queues_name_pod(st, p);
    p->priority = priority;
    p->status = POD_BOUND;
    const char *why = NULL;
    kgpu_error err;
    kgpu_error_clear(&err);
    for (int i = 0; i < n && why == NULL; i++) {
        const kgpu_assigned_part *ap = &parts[i];
        kgpu_request r;
        memset(&r, 0, sizeof(r));
        r.gpu_count = ap->ngpus;
        r.exclusive = ap->exclusive;
        r.gpu_milli = ap->exclusive ? KGPU_MILLI : (ap->ngpus > 0 ? ap->gpus[0].milli : 0);
        r.gpu_memory_mib = ap->exclusive || ap->ngpus == 0 ? 0 : ap->gpus[0].memory_mib;
        r.models = ~0ULL;
        r.shape = -1;
        int pos[KGPU_MAX_GPUS_PER_NODE];
        for (int g = 0; g < ap->ngpus && why == NULL; g++) {
            pos[g] = gpu_position(node, ap->gpus[g].index, ap->gpus[g].uuid);
            if (pos[g] < 0)
                why = "it names a GPU the node does not have";
            else if (!ap->exclusive && (ap->gpus[g].milli != r.gpu_milli ||
                                        ap->gpus[g].memory_mib != r.gpu_memory_mib))
                why = "it gives its GPUs unequal amounts";
        }
        if (i == 0) { /* the pod's CPU and memory, for the scores (clamped: not ours to check) */
            r.cpu_milli = cpu_milli;
            r.memory_mib = memory_mib;
        }
        if (why == NULL && apply_clamped(st->cluster, &r, idx, pos, &p->part[i].a, &err) != 0) {
            snprintf(problem, sizeof(problem), "%.290s", err.msg);
            why = problem;
            *conflict = true;
        }
        if (why == NULL) {
            snprintf(p->part[i].container, sizeof(p->part[i].container), "%.63s", ap->container);
            p->nparts = i + 1;
        }
    }
    if (why == NULL && !kgpu_strmap_put(&st->pods, p->uid, p, NULL))
        why = "out of memory";
    if (why != NULL) {
        for (int i = p->nparts - 1; i >= 0; i--)
            kgpu_cluster_release(st->cluster, &p->part[i].a, NULL);
        free(p);
        return why;
    }
    hold(st, p);
    ext_queues_charge(st, p, true, NULL); /* running already: never refused */
    return NULL;
}

/* Tries every orphan again: after inventory changes and after pods leave. */
static void retry_orphans(ext_state *st)
{
    if (st->orphans.len == 0)
        return;
    size_t it = 0, ndone = 0;
    const char *k;
    void *v;
    char(*done)[64] = calloc(st->orphans.len, sizeof(*done));
    while (done != NULL && kgpu_strmap_next(&st->orphans, &it, &k, &v)) {
        ext_orphan *o = v;
        bool conflict;
        if (try_adopt(st, o->uid, o->ns, o->name, o->node, o->parts, o->n, o->cpu_milli,
                      o->memory_mib, o->queue_label, o->priority, &conflict) == NULL) {
            ext_log(EXT_INFO, "pod %s/%s: its GPUs on %s are counted again", o->ns, o->name,
                    o->node);
            snprintf(done[ndone++], sizeof(done[0]), "%s", o->uid);
        }
    }
    for (size_t i = 0; i < ndone; i++)
        drop_orphan(st, done[i]);
    free(done);
}

void ext_state_pod_seen(ext_state *st, const json_t *json)
{
    kgpu_pod pod;
    kgpu_error err;
    if (kgpu_pod_from_json(json, st->cfg->memory_unit_mib, &pod, &err) != 0) {
        ext_log(EXT_DEBUG, "ignoring a pod kgpu cannot read: %s", err.msg);
        return;
    }
    ext_await_seen(st, json, &pod);
    ext_unsched_seen(st, json, &pod);
    ext_pod *held = kgpu_strmap_get(&st->pods, pod.uid);
    if (pod.terminal) {
        ext_state_pod_gone(st, pod.uid);
        return;
    }
    if (pod.node[0] != '\0' && !pod.has_assignment && held == NULL) {
        cpu_pod_seen(st, &pod); /* bound without kgpu: its CPU still counts on the node */
        return;
    }
    if (pod.node[0] == '\0' || !pod.has_assignment)
        return; /* not bound, or a reservation in flight: it stays as it is */
    if (held != NULL) {
        if (held->status == POD_RESERVED && strcmp(held->node, pod.node) == 0)
            held->status = POD_BOUND; /* our bind, confirmed by the watch */
        return;
    }
    const json_t *ann = json_object_get(json_object_get(json, "metadata"), "annotations");
    const char *text = json_string_value(json_object_get(ann, KGPU_ANN_ASSIGNMENT));
    const char *anode = json_string_value(json_object_get(ann, KGPU_ANN_NODE));
    if (text == NULL)
        return;
    if (anode != NULL && strcmp(anode, pod.node) != 0) {
        ext_log(EXT_WARN, "pod %s/%s: assignment is for node %s but the pod runs on %s; ignored",
                pod.ns, pod.name, anode, pod.node);
        return;
    }
    kgpu_assigned_part *parts = calloc(KGPU_MAX_PARTS, sizeof(*parts));
    int n = 0;
    if (parts == NULL)
        return;
    if (kgpu_assignment_parse(text, parts, KGPU_MAX_PARTS, &n, &err) != 0) {
        atomic_fetch_add(&st->metrics->assignment_conflicts, 1);
        ext_log(EXT_ERROR, "pod %s/%s: malformed %s annotation: %s", pod.ns, pod.name,
                KGPU_ANN_ASSIGNMENT, err.msg);
        free(parts);
        return;
    }
    if (kgpu_strmap_get(&st->pending, pod.uid) == NULL &&
        kgpu_strmap_get(&st->orphans, pod.uid) == NULL) {
        ext_state_compile(st, &pod, &err);
        observe(st, &pod);
    }
    if (kgpu_strmap_get(&st->orphans, pod.uid) == NULL) {
        bool conflict;
        char label[KGPU_QUEUE_NAME_MAX + 1];
        int priority;
        ext_pod_queue_fields(json, label, sizeof(label), &priority);
        const char *why = try_adopt(st, pod.uid, pod.ns, pod.name, pod.node, parts, n,
                                    pod.cpu_milli, pod.memory_mib, label, priority, &conflict);
        if (why != NULL) {
            if (conflict)
                atomic_fetch_add(&st->metrics->assignment_conflicts, 1);
            keep_orphan(st, pod.uid, pod.ns, pod.name, pod.node, parts, n, pod.cpu_milli,
                        pod.memory_mib, label, priority, why);
        }
    }
    free(parts);
}

void ext_state_pod_gone(ext_state *st, const char *uid)
{
    bool held = kgpu_strmap_get(&st->pods, uid) != NULL;
    ext_filtered *f = kgpu_strmap_get(&st->pending, uid);
    if (f != NULL)
        f->waiting = EXT_WAIT_NONE; /* it waits for nothing any more */
    free(kgpu_strmap_del(&st->reclaims, uid));
    free(kgpu_strmap_del(&st->refused, uid));
    ext_unsched_drop(st, uid);
    cpu_pod_gone(st, uid);
    ext_state_release(st, uid);
    drop_orphan(st, uid);
    ext_await_drop(st, uid);
    if (held)
        retry_orphans(st); /* what this pod held may be what an orphan was waiting for */
}

/* Appends an owned string to a growing list; on failure the string is freed. */
static void push_owned(char ***list, size_t *n, char *str)
{
    if (str == NULL)
        return;
    char **g = realloc(*list, (*n + 1) * sizeof(**list));
    if (g == NULL) {
        free(str);
        return;
    }
    *list = g;
    g[(*n)++] = str;
}

/* Appends "ns/name/uid" to a suspects list. */
static void suspect(char ***list, size_t *n, const char *ns, const char *name, const char *uid)
{
    char *key;
    if (asprintf(&key, "%s/%s/%s", ns, name, uid) >= 0)
        push_owned(list, n, key);
}

void ext_state_pods_reset(ext_state *st, json_t *items, char ***suspects, size_t *nsuspects)
{
    *suspects = NULL;
    *nsuspects = 0;
    /* Bound pods the list no longer has are gone; reservations in flight stay. */
    kgpu_strmap present;
    kgpu_strmap_init(&present);
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item)
    {
        const char *uid =
            json_string_value(json_object_get(json_object_get(item, "metadata"), "uid"));
        if (uid != NULL)
            kgpu_strmap_put(&present, uid, (void *)1, NULL);
    }
    const char *k;
    void *v;
    size_t it = 0;
    char **gone = NULL;
    size_t ngone = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v)) {
        const ext_pod *p = v;
        if (p->status != POD_BOUND || kgpu_strmap_get(&present, k) != NULL)
            continue;
        if (p->since >= st->relist_started) {
            /* Bound after the relist was asked for: the snapshot may predate the binding. */
            suspect(suspects, nsuspects, p->ns, p->name, p->uid);
            continue;
        }
        push_owned(&gone, &ngone, strdup(k));
    }
    it = 0;
    while (kgpu_strmap_next(&st->cpu_pods, &it, &k, &v))
        if (kgpu_strmap_get(&present, k) == NULL)
            push_owned(&gone, &ngone, strdup(k));
    it = 0;
    while (kgpu_strmap_next(&st->orphans, &it, &k, &v)) {
        const ext_orphan *o = v;
        if (kgpu_strmap_get(&present, k) != NULL)
            continue;
        if (o->since >= st->relist_started) {
            suspect(suspects, nsuspects, o->ns, o->name, o->uid);
            continue;
        }
        push_owned(&gone, &ngone, strdup(k));
    }
    for (size_t j = 0; j < ngone; j++) {
        cpu_pod_gone(st, gone[j]);
        ext_state_release(st, gone[j]);
        drop_orphan(st, gone[j]);
        free(gone[j]);
    }
    free(gone);
    if (ngone > 0)
        retry_orphans(st);
    ext_await_relisted(st, &present);
    kgpu_strmap_clear(&present);
    ext_unsched_clear(st); /* the list shows those still waiting */
    json_array_foreach(items, i, item) ext_state_pod_seen(st, item);
}

/* ---- nodes ---- */

/* The spec of an existing node, pointing into the cluster (valid until it changes). */
static void spec_of(const kgpu_cluster *c, const kgpu_node *n, kgpu_node_spec *spec,
                    kgpu_gpu_spec *gpus)
{
    memset(spec, 0, sizeof(*spec));
    spec->name = n->name;
    spec->cpu_milli = n->cpu_milli;
    spec->memory_mib = n->memory_mib;
    spec->labels = n->labels;
    spec->nlabels = n->nlabels;
    for (int i = 0; i < n->ngpus; i++) {
        gpus[i] = (kgpu_gpu_spec){.index = n->gpus[i].index,
                                  .uuid = n->gpus[i].uuid,
                                  .model = kgpu_cluster_model_name(c, n->gpus[i].model),
                                  .memory_mib = n->gpus[i].memory_mib,
                                  .numa = n->gpus[i].numa,
                                  .healthy = n->gpus[i].healthy};
    }
    spec->gpus = gpus;
    spec->ngpus = n->ngpus;
}

void ext_state_node_spec(const ext_state *st, int i, kgpu_node_spec *spec, kgpu_gpu_spec *gpus)
{
    spec_of(st->cluster, kgpu_cluster_node(st->cluster, i), spec, gpus);
}

/* Device indexes (not positions) of a held assignment, to survive a rebuild. */
typedef struct held_ref {
    ext_pod *p;
    int index[KGPU_MAX_PARTS][KGPU_MAX_GPUS_PER_NODE];
} held_ref;

int ext_state_set_nodes(ext_state *st, const kgpu_node_spec *specs, int n, kgpu_error *err)
{
    kgpu_cluster *c = kgpu_cluster_new();
    if (c == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    /*
     * Model ids stay what they were for the models some node still has:
     * learned shapes, remembered pods and the policies' replay hold model
     * masks. The ids of models no node has any more are reclaimed (`gone`:
     * holes the next new models take) and forgotten by the learned shapes
     * below, so that the 64-entry table holds what the inventory has, not
     * every name it ever had.
     */
    kgpu_strmap names; /* the models of the new inventory */
    kgpu_strmap_init(&names);
    bool oom = false;
    for (int i = 0; i < n && !oom; i++)
        for (int g = 0; g < specs[i].ngpus && !oom; g++)
            oom = specs[i].gpus[g].model != NULL &&
                  !kgpu_strmap_put(&names, specs[i].gpus[g].model, (void *)1, NULL);
    uint64_t gone = 0;
    for (int i = 0; i < kgpu_cluster_model_count(st->cluster) && !oom; i++) {
        const char *m = kgpu_cluster_model_name(st->cluster, i);
        if (kgpu_cluster_model_id(st->cluster, m, false) != i)
            continue; /* a hole */
        if (kgpu_strmap_get(&names, m) == NULL)
            gone |= 1ULL << i;
        else
            oom = kgpu_cluster_model_put(c, i, m) != 0;
    }
    kgpu_strmap_clear(&names);
    if (oom) {
        kgpu_cluster_free(c);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        kgpu_error why;
        kgpu_error_clear(&why);
        int rc = kgpu_cluster_add_node(c, &specs[i], &why);
        if (rc == KGPU_ERANGE) {
            /* One node's models must not keep every other node out of the inventory. */
            ext_log(EXT_ERROR, "%s; the node is left out of the inventory", why.msg);
            continue;
        }
        if (rc < 0) {
            kgpu_cluster_free(c);
            if (err != NULL)
                *err = why;
            return rc;
        }
    }
    /* Carry every held pod over by GPU device index. */
    size_t npods = st->pods.len, k = 0, it = 0;
    held_ref *refs = calloc(npods ? npods : 1, sizeof(*refs));
    if (refs == NULL) {
        kgpu_cluster_free(c);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    const char *key;
    void *v;
    while (kgpu_strmap_next(&st->pods, &it, &key, &v) && k < npods) {
        ext_pod *p = v;
        const kgpu_node *old = kgpu_cluster_node(st->cluster, p->part[0].a.node);
        refs[k].p = p;
        for (int i = 0; i < p->nparts && old != NULL; i++)
            for (int g = 0; g < p->part[i].a.ngpus; g++)
                refs[k].index[i][g] = old->gpus[p->part[i].a.gpus[g]].index;
        k++;
    }
    ext_state_integrate_usage(st);
    kgpu_cluster *old = st->cluster;
    st->cluster = c;
    free_policies(st); /* their caches are keyed by node positions of the old cluster */
    if (gone != 0) {
        char list[512] = "";
        size_t off = 0;
        for (int i = 0; i < KGPU_MAX_MODELS && off < sizeof(list); i++)
            if ((gone >> i) & 1)
                off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", off ? ", " : "",
                                        kgpu_cluster_model_name(old, i));
        ext_log(EXT_INFO, "GPU models no node has any more are forgotten: %s", list);
        shapes_forget_models(st, gone);
    }
    for (size_t j = 0; j < k; j++) {
        ext_pod *p = refs[j].p;
        int idx = kgpu_cluster_find_node(c, p->node);
        const kgpu_node *node = kgpu_cluster_node(c, idx);
        bool ok = node != NULL;
        int applied = 0;
        for (int i = 0; i < p->nparts && ok; i++) {
            kgpu_request r;
            memset(&r, 0, sizeof(r));
            r.gpu_count = p->part[i].a.ngpus;
            r.exclusive = p->part[i].a.exclusive;
            r.gpu_milli = p->part[i].a.gpu_milli;
            r.gpu_memory_mib = p->part[i].a.exclusive ? 0 : p->part[i].a.gpu_memory_mib;
            r.models = ~0ULL;
            r.shape = -1;
            r.cpu_milli = p->part[i].a.cpu_milli;
            r.memory_mib = p->part[i].a.memory_mib;
            int pos[KGPU_MAX_GPUS_PER_NODE];
            for (int g = 0; g < r.gpu_count && ok; g++)
                ok = (pos[g] = gpu_position(node, refs[j].index[i][g], NULL)) >= 0;
            ok = ok && apply_clamped(c, &r, idx, pos, &p->part[i].a, NULL) == 0;
            applied += ok;
        }
        if (!ok) {
            /* Not lost: kept as an orphan, counted again if the GPUs come back. */
            kgpu_assigned_part *parts = calloc((size_t)p->nparts + 1, sizeof(*parts));
            const kgpu_node *was = kgpu_cluster_node(old, kgpu_cluster_find_node(old, p->node));
            for (int i = 0; parts != NULL && i < p->nparts; i++) {
                kgpu_assigned_part *ap = &parts[i];
                snprintf(ap->container, sizeof(ap->container), "%s", p->part[i].container);
                ap->exclusive = p->part[i].a.exclusive;
                ap->ngpus = p->part[i].a.ngpus;
                for (int g = 0; g < ap->ngpus; g++) {
                    int pos = was ? gpu_position(was, refs[j].index[i][g], NULL) : -1;
                    ap->gpus[g].index = refs[j].index[i][g];
                    if (pos >= 0)
                        snprintf(ap->gpus[g].uuid, sizeof(ap->gpus[g].uuid), "%s",
                                 was->gpus[pos].uuid);
                    ap->gpus[g].milli = p->part[i].a.gpu_milli;
                    ap->gpus[g].memory_mib = p->part[i].a.gpu_memory_mib;
                }
            }
            for (int i = applied - 1; i >= 0; i--)
                kgpu_cluster_release(c, &p->part[i].a, NULL);
            usage_add(st, p->ns, -p->gpus);
            kgpu_strmap_del(&st->pods, p->uid);
            if (parts != NULL)
                keep_orphan(st, p->uid, p->ns, p->name, p->node, parts, p->nparts,
                            p->part[0].a.cpu_milli, p->part[0].a.memory_mib, p->queue_label,
                            p->priority, "its GPUs left the node's inventory");
            free(parts);
            free(p);
        }
    }
    free(refs);
    /* Pods without kgpu GPUs: taken again by node name, dropped with their node. */
    char **dropped = NULL;
    size_t ndropped = 0;
    it = 0;
    while (kgpu_strmap_next(&st->cpu_pods, &it, &key, &v))
        if (!cpu_take(c, v))
            push_owned(&dropped, &ndropped, strdup(key));
    for (size_t j = 0; j < ndropped; j++) {
        free(kgpu_strmap_del(&st->cpu_pods, dropped[j]));
        free(dropped[j]);
    }
    free(dropped);
    kgpu_cluster_free(old);
    ext_dra_cluster_rebuilt(st); /* DRA claims: charged again on the new cluster */
    ext_queues_recharge(st);     /* from the GPUs each pod holds in the new cluster */
    retry_orphans(st); /* GPUs that came back, or a node that reappeared */
    return 0;
}

/* Rebuilds with every current node, `spec` replacing (or joining) its namesake, `drop` left out. */
static int rebuild_with(ext_state *st, const kgpu_node_spec *spec, const char *drop,
                        kgpu_error *err)
{
    int n = kgpu_cluster_node_count(st->cluster);
    kgpu_node_spec *specs = calloc((size_t)n + 1, sizeof(*specs));
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc((size_t)n + 1, sizeof(*gpus));
    if (specs == NULL || gpus == NULL) {
        free(specs);
        free(gpus);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int m = 0;
    bool replaced = false;
    for (int i = 0; i < n; i++) {
        const kgpu_node *node = kgpu_cluster_node(st->cluster, i);
        if (drop != NULL && strcmp(node->name, drop) == 0)
            continue;
        if (spec != NULL && strcmp(node->name, spec->name) == 0) {
            specs[m++] = *spec;
            replaced = true;
            continue;
        }
        spec_of(st->cluster, node, &specs[m], gpus[m]);
        m++;
    }
    if (spec != NULL && !replaced)
        specs[m++] = *spec;
    /* The specs point into the old cluster, which ext_state_set_nodes frees last. */
    int rc = ext_state_set_nodes(st, specs, m, err);
    free(specs);
    free(gpus);
    return rc;
}

static bool same_inventory(const kgpu_cluster *c, const kgpu_node *n, const kgpu_node_spec *s)
{
    if (n->ngpus != s->ngpus || n->cpu_milli != s->cpu_milli || n->memory_mib != s->memory_mib)
        return false;
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        const kgpu_gpu_spec *t = &s->gpus[i];
        if (g->index != t->index || g->memory_mib != t->memory_mib || g->numa != t->numa ||
            strcmp(g->uuid, t->uuid ? t->uuid : "") != 0 ||
            strcmp(kgpu_cluster_model_name(c, g->model), t->model) != 0)
            return false;
    }
    return true;
}

int ext_state_upsert_node(ext_state *st, const kgpu_node_spec *spec, kgpu_error *err)
{
    int idx = kgpu_cluster_find_node(st->cluster, spec->name);
    if (idx < 0) {
        if (spec->ngpus == 0)
            return 0; /* not a GPU node: nothing for kgpu to track */
        int rc = kgpu_cluster_add_node(st->cluster, spec, err);
        if (rc >= 0 && st->queues_spec != NULL)
            ext_queues_recharge(st); /* its models may be new: per-model entries bind to them */
        if (rc >= 0) {
            retry_orphans(st);
            ext_dra_retry(st); /* claims on a DRA node that had no GPUs known */
        }
        return rc < 0 ? rc : 0;
    }
    const kgpu_node *n = kgpu_cluster_node(st->cluster, idx);
    if (same_inventory(st->cluster, n, spec)) {
        for (int i = 0; i < n->ngpus; i++)
            if (n->gpus[i].healthy != spec->gpus[i].healthy)
                kgpu_cluster_set_gpu_health(st->cluster, idx, i, spec->gpus[i].healthy, NULL);
        return 0;
    }
    if (spec->ngpus == 0)
        return ext_state_remove_node(st, spec->name);
    return rebuild_with(st, spec, NULL, err);
}

int ext_state_remove_node(ext_state *st, const char *name)
{
    if (kgpu_cluster_find_node(st->cluster, name) < 0)
        return 0;
    return rebuild_with(st, NULL, name, NULL);
}
