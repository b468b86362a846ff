/*
 * Consolidation (--consolidate N; docs/autoscaling.md "Moving pods to make
 * room"): a pod that fits none of the nodes kube-scheduler offered gets
 * room by moving at most N kgpu.io/restartable pods of one of those nodes
 * elsewhere. The plan is kgpu_plan_moves's, the planner `kgpu simulate
 * --consolidate` measures; the victims go through the Eviction API
 * (PodDisruptionBudgets hold) from the decisions layer, and come back
 * through their controllers, placed by kube-scheduler like any pod. The
 * room freed is held for the waiting pod as a reclaim's is
 * (reclaim_state.c). Caller holds st->mu.
 *
 * What bounds it: one consolidation (or reclaim) under way at a time,
 * cluster-wide, and EXT_CONSOLIDATE_GAP_S between two; only pods that
 * opted in, of no higher priority than the waiting pod, may move; nodes
 * that are leaving and DRA nodes neither host nor receive.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moves.h"
#include "state_impl.h"

const char *ext_node_closed(ext_state *st, const char *name)
{
    const char *why = kgpu_strmap_get(&st->leaving, name);
    if (why != NULL || st->emptying.len == 0)
        return why;
    double *until = kgpu_strmap_get(&st->emptying, name);
    if (until == NULL)
        return NULL;
    if (*until > ext_now())
        return "kgpu is emptying it so that it can be scaled down";
    free(kgpu_strmap_del(&st->emptying, name));
    return NULL;
}

bool ext_emptying_start(ext_state *st, const char *name, ext_reclaim *r)
{
    double now = ext_now();
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->emptying, &it, &k, &v))
        if (*(double *)v > now)
            return false; /* one at a time */
    kgpu_strmap_clear_free(&st->emptying);
    kgpu_strmap_init(&st->emptying);
    for (int i = 0; i < r->nvictims; i++) {
        const ext_pod *p = kgpu_strmap_get(&st->pods, r->v[i].uid);
        if (p == NULL || p->evicting || strcmp(p->node, name) != 0)
            return false; /* changed since the copy: next round */
    }
    double *until = malloc(sizeof(*until));
    if (until == NULL || !kgpu_strmap_put(&st->emptying, name, until, NULL)) {
        free(until);
        return false;
    }
    *until = now + EXT_EMPTYING_S;
    for (int i = 0; i < r->nvictims; i++)
        ((ext_pod *)kgpu_strmap_get(&st->pods, r->v[i].uid))->evicting = true;
    return true;
}

/* Whether node `name` takes no pod a plan places: closed, or a DRA node (no device-plugin pods). */
static bool excluded(ext_state *st, const char *name)
{
    return ext_node_closed(st, name) != NULL || ext_dra_is_node(st, name);
}

/*
 * What p's GPUs ask, to place it again: the same size, on GPUs of the model
 * it has now. Its own model globs are not kept, so the plan only counts on
 * GPUs it is known to accept (a narrower choice than kube-scheduler's).
 */
static void request_of(const kgpu_cluster *c, const ext_pod *p, kgpu_request *r)
{
    const kgpu_assignment *a = &p->part[0].a;
    const kgpu_node *n = kgpu_cluster_node(c, a->node);
    memset(r, 0, sizeof(*r));
    r->gpu_count = a->ngpus;
    r->exclusive = a->exclusive;
    r->gpu_milli = a->exclusive ? KGPU_MILLI : a->gpu_milli;
    r->gpu_memory_mib = a->exclusive ? 0 : a->gpu_memory_mib;
    r->shape = -1;
    r->models = n != NULL && a->ngpus > 0 ? 1ULL << n->gpus[a->gpus[0]].model : 0;
}

/* Another reclaim or consolidation whose time is not up: one at a time. */
static bool another_under_way(ext_state *st, const char *uid, double now)
{
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->reclaims, &it, &k, &v)) {
        const ext_reclaim *r = v;
        if (r->until > now && strcmp(r->for_uid, uid) != 0)
            return true;
    }
    return false;
}

/* The plan for pod on scratch copy c, into *out; 0, KGPU_ENOFIT or an error (msg says). */
static int plan(ext_state *st, kgpu_cluster *c, const kgpu_pod *pod, int priority,
                const bool *offered, kgpu_moves *mv, const ext_pod ***who_out, char *msg,
                size_t len)
{
    int nn = kgpu_cluster_node_count(c);
    size_t cap = st->pods.len + 1, n = 0;
    kgpu_placed_pod *pods = malloc(cap * sizeof(*pods));
    const ext_pod **who = malloc(cap * sizeof(*who));
    bool *hosts = calloc((size_t)nn + 1, sizeof(*hosts));
    kgpu_policy *p = NULL;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = KGPU_ENOMEM;
    if (pods == NULL || who == NULL || hosts == NULL)
        goto out;
    double now = ext_now();
    for (int i = 0; i < nn; i++) {
        const kgpu_node *node = kgpu_cluster_node(c, i);
        if (excluded(st, node->name)) {
            for (int g = 0; g < node->ngpus; g++)
                kgpu_cluster_set_gpu_health(c, i, g, false, &err); /* nothing goes there */
            continue;
        }
        hosts[i] = offered[i];
    }
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v) && n < cap) {
        const ext_pod *e = v;
        if (e->nparts != 1 || e->status != POD_BOUND || e->part[0].a.ngpus == 0)
            continue; /* a pod of several GPU containers, or in flight: stays where it is */
        int idx = e->part[0].a.node;
        const kgpu_node *node = kgpu_cluster_node(c, idx);
        if (node == NULL || strcmp(node->name, e->node) != 0 || excluded(st, e->node))
            continue;
        if (!e->restartable || e->evicting || e->priority > priority ||
            ext__refused_lately(st, e->uid, now))
            continue; /* the others stay where they are: the planner need not know them */
        pods[n].a = e->part[0].a;
        request_of(c, e, &pods[n].req);
        pods[n].movable = true;
        who[n++] = e;
    }
    kgpu_policy *base = ext_state_policy(st, pod, &err);
    p = base != NULL ? kgpu_policy_new(kgpu_policy_name(base), c, &st->target, &err) : NULL;
    if (p == NULL) {
        snprintf(msg, len, "%s", err.msg);
        rc = err.code != 0 ? err.code : KGPU_ENOMEM;
        goto out;
    }
    kgpu_policy_set_fit_cpu(p, false); /* CPU and memory are kube-scheduler's */
    kgpu_request tmp[KGPU_MAX_PARTS];
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    ext_fit_requests(pod, tmp, reqs);
    rc = kgpu_plan_moves(c, p, pods, n, reqs[0], st->cfg->consolidate_moves, hosts, &st->rng, mv,
                         &err);
    if (rc != 0 && rc != KGPU_ENOFIT)
        snprintf(msg, len, "%s", err.msg);
out:
    if (rc == KGPU_ENOMEM && msg[0] == '\0')
        snprintf(msg, len, "out of memory");
    kgpu_policy_free(p);
    free(pods);
    free(hosts);
    if (rc == 0)
        *who_out = who;
    else
        free(who);
    return rc;
}

int ext_consolidate(ext_state *st, const kgpu_pod *pod, int priority, const bool *offered,
                    bool apply, ext_reclaim *out, char *msg, size_t len)
{
    msg[0] = '\0';
    int max = st->cfg->consolidate_moves;
    if (max <= 0 || pod->nparts != 1)
        return EXT_RECLAIM_NONE;
    double now = ext_now();
    ext_reclaims_refresh(st);
    ext_reclaim *mine = kgpu_strmap_get(&st->reclaims, pod->uid);
    char list[200];
    if (mine != NULL && !mine->freed) {
        ext__victims_text(mine, pod->ns, list, sizeof(list));
        snprintf(msg, len, "waits for %s: moving %s", mine->move ? "consolidation" : "reclaim",
                 list);
        return EXT_RECLAIM_INFLIGHT;
    }
    if (mine != NULL) /* its room was held, yet it fits nowhere: choose again */
        free(kgpu_strmap_del(&st->reclaims, pod->uid));
    if (another_under_way(st, pod->uid, now) ||
        (st->consolidated_at > 0 && now - st->consolidated_at < EXT_CONSOLIDATE_GAP_S))
        return EXT_RECLAIM_NONE; /* one at a time: the capacity reasons say the rest */
    kgpu_cluster *c = kgpu_cluster_clone(st->cluster);
    if (c == NULL) {
        snprintf(msg, len, "out of memory");
        return EXT_RECLAIM_NONE;
    }
    kgpu_moves mv;
    const ext_pod **who = NULL;
    int rc = plan(st, c, pod, priority, offered, &mv, &who, msg, len);
    if (rc != 0) {
        if (rc != KGPU_ENOFIT)
            ext_log(EXT_WARN, "consolidation for %s/%s: %s", pod->ns, pod->name, msg);
        msg[0] = '\0';
        kgpu_cluster_free(c);
        return EXT_RECLAIM_NONE;
    }
    memset(out, 0, sizeof(*out));
    out->move = true;
    out->until = now + EXT_RECLAIM_WAIT_S;
    snprintf(out->for_uid, sizeof(out->for_uid), "%s", pod->uid);
    snprintf(out->for_ns, sizeof(out->for_ns), "%.63s", pod->ns);
    snprintf(out->for_name, sizeof(out->for_name), "%s", pod->name);
    const kgpu_node *at = kgpu_cluster_node(c, mv.placed.node);
    snprintf(out->node, sizeof(out->node), "%s", at != NULL ? at->name : "");
    out->ngpus = mv.placed.ngpus;
    memcpy(out->gpus, mv.placed.gpus, sizeof(out->gpus));
    kgpu_request tmp[KGPU_MAX_PARTS];
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    ext_fit_requests(pod, tmp, reqs);
    out->req = *reqs[0];
    out->req.allow = out->req.exclude = NULL; /* borrowed from the pod: `models` says it */
    out->req.nallow = out->req.nexclude = 0;
    out->req.shape = -1;
    kgpu_qdemand_of_placement(c, &out->req, mv.placed.node, mv.placed.gpus, &out->demand);
    for (int i = 0; i < mv.n; i++) {
        kgpu_qdemand d;
        ext__pod_demand(st->cluster, who[mv.pod[i]], &d);
        ext__victim_add(out, who[mv.pod[i]], d.milli);
    }
    free(who);
    kgpu_cluster_free(c);
    st->consolidated_at = now;
    atomic_fetch_add(&st->metrics->consolidations, 1);
    ext__victims_text(out, pod->ns, list, sizeof(list));
    if (apply) {
        for (int i = 0; i < out->nvictims; i++)
            ext_queues_evicted(st, out, &out->v[i], EXT_EVICT_APPLIED);
        snprintf(msg, len, "consolidated: moved %s", list);
        return EXT_RECLAIM_APPLIED;
    }
    ext__reclaim_remember(st, out, now);
    snprintf(msg, len, "waits for consolidation: moving %s off node %s", list, out->node);
    return EXT_RECLAIM_STARTED;
}

/* ---- the scale-down guard's snapshot ---- */

/* Index of cluster node idx in out->nodes (at[idx], -1: none yet), added when new; -1 when full. */
static int guard_node(ext_guard_snap *out, int *at, int idx, int *cap)
{
    if (at[idx] >= 0)
        return at[idx];
    if (out->nnodes >= EXT_GUARD_NODES_MAX)
        return -1;
    if (out->nnodes == *cap) {
        int ncap = *cap ? 2 * *cap : 64;
        ext_guard_node *n = realloc(out->nodes, (size_t)ncap * sizeof(*n));
        if (n == NULL)
            return -1;
        out->nodes = n;
        *cap = ncap;
    }
    ext_guard_node *g = &out->nodes[out->nnodes];
    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "%s", kgpu_cluster_node(out->c, idx)->name);
    g->idx = idx;
    return at[idx] = out->nnodes++;
}

static __thread const kgpu_placed_pod *sort_pods; /* what by_node's indices point into */

/* Indices into sort_pods, by node, then in order (a stable result). */
static int by_node(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int x = sort_pods[i].a.node, y = sort_pods[j].a.node;
    if (x != y)
        return (x > y) - (x < y);
    return (i > j) - (i < j);
}

bool ext_guard_snapshot(ext_state *st, ext_guard_snap *out)
{
    memset(out, 0, sizeof(*out));
    int nn = kgpu_cluster_node_count(st->cluster), cap = 0;
    out->c = kgpu_cluster_clone(st->cluster);
    out->skip = calloc((size_t)nn + 1, sizeof(*out->skip));
    out->pods = malloc((st->pods.len + 1) * sizeof(*out->pods));
    out->who = malloc((st->pods.len + 1) * sizeof(*out->who));
    bool *unsure = calloc((size_t)nn + 1, sizeof(*unsure));
    int *at = malloc(((size_t)nn + 1) * sizeof(*at));
    if (out->c == NULL || out->skip == NULL || out->pods == NULL || out->who == NULL ||
        unsure == NULL || at == NULL) {
        free(unsure);
        free(at);
        ext_guard_snap_free(out);
        return false;
    }
    for (int i = 0; i < nn; i++) {
        out->skip[i] = excluded(st, kgpu_cluster_node(out->c, i)->name);
        at[i] = -1;
    }
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v)) {
        const ext_pod *e = v;
        for (int j = 0; j < e->nparts; j++) {
            const kgpu_assignment *a = &e->part[j].a;
            const kgpu_node *node = kgpu_cluster_node(out->c, a->node);
            if (a->ngpus == 0 || node == NULL || strcmp(node->name, e->node) != 0)
                continue;
            if (e->nparts > 1) {
                unsure[a->node] = true; /* its containers go together: not checked alone */
                continue;
            }
            if (out->npods >= st->pods.len)
                break;
            kgpu_placed_pod *pp = &out->pods[out->npods];
            pp->a = *a;
            request_of(out->c, e, &pp->req);
            pp->movable = e->restartable && !e->evicting;
            kgpu_qdemand d;
            ext__pod_demand(st->cluster, e, &d);
            ext__victim_fill(&out->who[out->npods++], e, d.milli);
        }
    }
    /* By node, pods and their victims' records together. */
    size_t *order = malloc((out->npods + 1) * sizeof(*order));
    kgpu_placed_pod *pods = malloc((out->npods + 1) * sizeof(*pods));
    ext_victim *who = malloc((out->npods + 1) * sizeof(*who));
    if (order == NULL || pods == NULL || who == NULL) {
        free(order);
        free(pods);
        free(who);
        free(unsure);
        free(at);
        ext_guard_snap_free(out);
        return false;
    }
    sort_pods = out->pods;
    for (size_t i = 0; i < out->npods; i++)
        order[i] = i;
    qsort(order, out->npods, sizeof(*order), by_node);
    for (size_t i = 0; i < out->npods; i++) {
        pods[i] = out->pods[order[i]];
        who[i] = out->who[order[i]];
    }
    free(out->pods);
    free(out->who);
    free(order);
    out->pods = pods;
    out->who = who;
    for (size_t i = 0; i < out->npods; i++) {
        int idx = out->pods[i].a.node;
        int g = guard_node(out, at, idx, &cap);
        if (g < 0)
            break;
        if (out->nodes[g].n++ == 0)
            out->nodes[g].first = i;
    }
    for (int i = 0; i < nn; i++) {
        const char *name = kgpu_cluster_node(out->c, i)->name;
        bool marked = kgpu_strmap_get(&st->guard_marked, name) != NULL;
        if (!unsure[i] && !marked) /* neither kgpu pods of several containers nor annotations */
            continue;
        int g = guard_node(out, at, i, &cap);
        if (g < 0)
            break;
        out->nodes[g].unsure |= unsure[i];
    }
    for (int i = 0; i < out->nnodes; i++) {
        intptr_t m = (intptr_t)kgpu_strmap_get(&st->guard_marked, out->nodes[i].name);
        out->nodes[i].marked = (m & EXT_GUARD_HAS_MARK) != 0;
        out->nodes[i].foreign = m == EXT_GUARD_HAS_OTHER;
    }
    free(unsure);
    free(at);
    return true;
}

void ext_guard_snap_free(ext_guard_snap *s)
{
    kgpu_cluster_free(s->c);
    free(s->skip);
    free(s->pods);
    free(s->who);
    free(s->nodes);
    memset(s, 0, sizeof(*s));
}
