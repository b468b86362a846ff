/*
 * Reclaim's bookkeeping in the state: for a pod within its queue's
 * guarantee that fits nowhere, the borrowers to evict (chosen and recorded
 * under one hold of the lock, so that two calls never pick the same
 * victims), each eviction's outcome, victims a PodDisruptionBudget
 * protected, and the sweep over pods kube-scheduler found no node for.
 * Above pods.c (an eviction applied in --cluster-file mode ends the pod).
 * The evictions themselves go out from the decisions layer (reclaim.c).
 * Caller holds st->mu.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "state_impl.h"

/* ---- reclaim ---- */

/* A victim whose eviction a PodDisruptionBudget refused: skipped by reclaim until `until`. */
typedef struct refusal {
    double until; /* first: see expire() */
    char ns[64], name[KGPU_NAME_MAX + 1];
} refusal;

/* Victim uid's refusal if it was refused lately; forgets old ones. */
static const refusal *refused_lately(ext_state *st, const char *uid, double now)
{
    refusal *r = kgpu_strmap_get(&st->refused, uid);
    if (r == NULL || r->until > now)
        return r;
    free(kgpu_strmap_del(&st->refused, uid));
    return NULL;
}

/*
 * Drops the entries of m whose time is up: its values are malloc'd
 * structs that start with `double until` (ext_reclaim, refusal), keys are
 * uids. With m holding `max` or more after that, the one ending first too,
 * so that one more fits.
 */
static void expire(kgpu_strmap *m, double now, size_t max)
{
    const char *k, *first = NULL;
    void *v;
    size_t it = 0, nd = 0;
    double first_until = 0;
    char(*drop)[64] = calloc(m->len + 1, sizeof(*drop));
    while (drop != NULL && kgpu_strmap_next(m, &it, &k, &v)) {
        double until = *(const double *)v;
        if (until <= now)
            snprintf(drop[nd++], sizeof(drop[0]), "%s", k);
        else if (first == NULL || until < first_until)
            first = k, first_until = until;
    }
    if (drop != NULL && m->len - nd >= max && first != NULL)
        snprintf(drop[nd++], sizeof(drop[0]), "%s", first);
    for (size_t i = 0; i < nd; i++)
        free(kgpu_strmap_del(m, drop[i]));
    free(drop);
}

/* Whether every victim of r is gone from the state. */
static bool victims_gone(ext_state *st, const ext_reclaim *r)
{
    for (int i = 0; i < r->nvictims; i++)
        if (kgpu_strmap_get(&st->pods, r->v[i].uid) != NULL)
            return false;
    return true;
}

/*
 * The victims as the waiting pod's owner (namespace `viewer`) may read
 * them: a pod of its own namespace by name and queue, the others only
 * counted (docs/security.md: tenants learn nothing of each other's pods).
 */
void ext__victims_text(const ext_reclaim *r, const char *viewer, char *out, size_t len)
{
    size_t off = 0;
    int others = 0;
    out[0] = '\0';
    for (int i = 0; i < r->nvictims; i++) {
        if (strcmp(r->v[i].ns, viewer) != 0) {
            others++;
            continue;
        }
        if (off < len)
            off += (size_t)snprintf(out + off, len - off, "%s%s/%s (queue %s)", off ? ", " : "",
                                    r->v[i].ns, r->v[i].name, r->v[i].queue);
    }
    if (others > 0 && off < len)
        snprintf(out + off, len - off, "%s%s", off ? ", " : "",
                 others == 1 ? "a pod of another namespace" : "pods of other namespaces");
}

void ext_reclaims_refresh(ext_state *st)
{
    if (st->reclaims.len == 0)
        return;
    double now = ext_now();
    const char *k;
    void *v;
    size_t it = 0, nd = 0;
    char(*drop)[64] = calloc(st->reclaims.len + 1, sizeof(*drop));
    while (kgpu_strmap_next(&st->reclaims, &it, &k, &v)) {
        ext_reclaim *r = v;
        if (kgpu_strmap_get(&st->pods, r->for_uid) != NULL) {
            if (drop != NULL)
                snprintf(drop[nd++], sizeof(drop[0]), "%s", k); /* placed: it holds GPUs now */
            continue;
        }
        if (!r->freed && victims_gone(st, r)) {
            r->freed = true;
            r->until = now + EXT_RECLAIM_HOLD_S;
        }
    }
    for (size_t i = 0; i < nd; i++)
        free(kgpu_strmap_del(&st->reclaims, drop[i]));
    free(drop);
    expire(&st->reclaims, now, (size_t)-1);
}

/* ---- holds: the room a reclaim frees is its pod's until it is placed ---- */

#define HOLD_RELEASES 64 /* victims' placements on one node a hold check undoes */

/*
 * Appends to rel (nrel of HOLD_RELEASES used) what r's victims still hold on
 * node idx: until they are gone, the room they will free. Returns the count.
 */
static int victims_held_on(ext_state *st, const ext_reclaim *r, int idx, kgpu_assignment *rel,
                           int nrel)
{
    for (int i = 0; i < r->nvictims && !r->freed; i++) {
        const ext_pod *p = kgpu_strmap_get(&st->pods, r->v[i].uid);
        for (int j = 0; p != NULL && j < p->nparts; j++)
            if (p->part[j].a.node == idx && nrel < HOLD_RELEASES)
                rel[nrel++] = p->part[j].a;
    }
    return nrel;
}

const ext_reclaim *ext_reclaim_hold_taken(ext_state *st, int idx, const char *uid,
                                          const kgpu_request *const *reqs, int nreqs)
{
    const kgpu_node *n = st->reclaims.len > 0 ? kgpu_cluster_node(st->cluster, idx) : NULL;
    if (n == NULL)
        return NULL;
    double now = ext_now();
    const kgpu_request *all[KGPU_PLACE_MAX_REQS];
    kgpu_assignment rel[HOLD_RELEASES];
    int nall = 0, nrel = 0;
    bool crowded = false;
    const ext_reclaim *first = NULL;
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->reclaims, &it, &k, &v)) {
        const ext_reclaim *r = v;
        if (r->until <= now || strcmp(r->node, n->name) != 0 ||
            (uid != NULL && strcmp(r->for_uid, uid) == 0))
            continue;
        if (first == NULL)
            first = r;
        if (nall == KGPU_PLACE_MAX_REQS) {
            crowded = true;
            continue;
        }
        all[nall++] = &r->req;
        nrel = victims_held_on(st, r, idx, rel, nrel);
    }
    if (first == NULL)
        return NULL;
    if (crowded || nall + nreqs > KGPU_PLACE_MAX_REQS)
        return first; /* more than one search can weigh: held */
    for (int i = 0; i < nreqs; i++)
        all[nall++] = reqs[i];
    return kgpu_place_all(st->cluster, idx, rel, nrel, all, nall, 0, 0, NULL, NULL, 0) ==
                   KGPU_PLACE_FOUND
               ? NULL
               : first;
}

void ext_reclaim_hold_reason(const ext_reclaim *h, const char *viewer, char *buf, size_t len)
{
    char who[KGPU_NAME_MAX * 2 + 40];
    snprintf(buf, len, "GPUs here are held for %s, for which reclaim freed them; retry shortly",
             ext_pod_for_viewer(h->for_ns, h->for_name, viewer, "pod ", who, sizeof(who)));
}

/*
 * A copy of the cluster as the other reclaims under way will leave it: on
 * each one's node its victims there gone and its pod placed. NULL in *out
 * when there are none (the cluster itself serves). false: out of memory.
 */
static bool cluster_with_holds(ext_state *st, const char *uid, double now, kgpu_cluster **out)
{
    *out = NULL;
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->reclaims, &it, &k, &v)) {
        const ext_reclaim *r = v;
        if (r->until <= now || strcmp(r->for_uid, uid) == 0 || r->node[0] == '\0')
            continue;
        if (*out == NULL && (*out = kgpu_cluster_clone(st->cluster)) == NULL)
            return false;
        int idx = kgpu_cluster_find_node(*out, r->node);
        if (idx < 0)
            continue;
        kgpu_assignment rel[HOLD_RELEASES];
        int nrel = victims_held_on(st, r, idx, rel, 0);
        const kgpu_request *reqs[1] = {&r->req};
        kgpu_placement pl;
        if (kgpu_place_all(*out, idx, rel, nrel, reqs, 1, 0, 0, &pl, NULL, 0) != KGPU_PLACE_FOUND)
            continue; /* it no longer fits there: nothing to keep */
        kgpu_error err;
        kgpu_assignment a;
        for (int i = 0; i < nrel; i++)
            kgpu_cluster_release(*out, &rel[i], &err);
        ext__apply_clamped(*out, &r->req, idx, pl.gpus[0], &a, &err);
    }
    return true;
}

/*
 * The queues as they will be: what pods being evicted hold uncharged, and
 * what the pods of other reclaims under way will take charged, so that a
 * queue's guarantee is reclaimed for once and a victim's queue is never
 * counted on twice. Returns how many reclaims of q's own were counted.
 */
static int queues_as_they_will_be(ext_state *st, kgpu_queues *qs, int q, const char *uid,
                                  double now)
{
    const char *k;
    void *v;
    size_t it = 0;
    kgpu_error err;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v)) {
        const ext_pod *p = v;
        int pq = p->evicting && p->charged ? kgpu_queues_find(qs, p->queue) : -1;
        if (pq < 0)
            continue;
        kgpu_qdemand d;
        ext__pod_demand(st->cluster, p, &d);
        kgpu_queues_uncharge(qs, pq, &d, &err);
    }
    int mine = 0;
    it = 0;
    while (kgpu_strmap_next(&st->reclaims, &it, &k, &v)) {
        const ext_reclaim *r = v;
        int rq = r->until > now && strcmp(r->for_uid, uid) != 0
                     ? kgpu_queues_find(qs, r->for_queue)
                     : -1;
        if (rq >= 0 && kgpu_queues_charge_running(qs, rq, &r->demand, &err) == 0 && rq == q)
            mine++;
    }
    return mine;
}

/* Uncharges (sign -1) or charges back (+1) running[v[0..n)] in qs; what failed is marked in ok. */
static void take_away(kgpu_queues *qs, const kgpu_qpod *running, const size_t *v, size_t n,
                      bool *ok, int sign)
{
    kgpu_error err;
    for (size_t i = 0; i < n; i++) {
        const kgpu_qpod *p = &running[v[i]];
        if (sign < 0)
            ok[i] = kgpu_queues_uncharge(qs, p->queue, &p->d, &err) == 0;
        else if (ok[i])
            kgpu_queues_charge_running(qs, p->queue, &p->d, &err);
    }
}

/*
 * Could a placement of req on node idx pass q's limits, once every
 * candidate is gone (qs is then so)? False only when on GPUs of one model,
 * each allowed model in turn, it could not: a mix of models is judged on
 * the placement reclaim chooses.
 */
static bool node_may_serve(const kgpu_cluster *c, int idx, const kgpu_queues *qs, int q,
                           const kgpu_request *req)
{
    const kgpu_node *n = kgpu_cluster_node(c, idx);
    uint64_t tried = 0;
    for (int g = 0; g < n->ngpus; g++) {
        int m = n->gpus[g].model;
        if (m < 0 || m >= KGPU_MAX_MODELS || !((req->models >> m) & 1) || ((tried >> m) & 1))
            continue;
        tried |= 1ULL << m;
        int gpus[KGPU_MAX_GPUS_PER_NODE], k = 0;
        for (int h = 0; h < n->ngpus && k < req->gpu_count; h++)
            if (n->gpus[h].model == m)
                gpus[k++] = h;
        if (k < req->gpu_count)
            return true;
        kgpu_qdemand d;
        kgpu_qdemand_of_placement(c, req, idx, gpus, &d);
        if (kgpu_queues_check(qs, q, &d, NULL, 0) == KGPU_QUEUE_WITHIN)
            return true;
    }
    return tried == 0; /* no allowed model: the placement search passes it by anyway */
}

/* Drops the candidates on node idx; how many. */
static size_t drop_node(kgpu_qpod *running, const ext_pod **who, size_t *n, int idx)
{
    size_t k = 0, was = *n;
    for (size_t i = 0; i < was; i++)
        if (running[i].a.node != idx) {
            running[k] = running[i];
            who[k++] = who[i];
        }
    *n = k;
    return was - k;
}

#define RECLAIM_TRIES 4 /* placements a queue's limits refused before reclaim gives up */

int ext_queues_reclaim(ext_state *st, const kgpu_pod *pod, int q, bool apply, ext_reclaim *out,
                       char *msg, size_t len)
{
    double now = ext_now();
    msg[0] = '\0';
    ext_reclaims_refresh(st);
    ext_reclaim *inflight = kgpu_strmap_get(&st->reclaims, pod->uid);
    if (inflight != NULL && !inflight->freed) {
        char list[200];
        ext__victims_text(inflight, pod->ns, list, sizeof(list));
        snprintf(msg, len, "waits for %s: evicting %s",
                 inflight->move ? "consolidation" : "reclaim", list);
        return EXT_RECLAIM_INFLIGHT;
    }
    if (inflight != NULL) /* its room was held, yet it fits nowhere: choose again */
        free(kgpu_strmap_del(&st->reclaims, pod->uid));
    if (pod->nparts != 1) {
        snprintf(msg, len, "reclaim places pods of one GPU container only");
        return EXT_RECLAIM_NONE;
    }
    /* The candidates: held pods of one container, charged, not leaving already. */
    size_t cap = st->pods.len + 1, n = 0;
    kgpu_qpod *running = malloc(cap * sizeof(*running));
    const ext_pod **who = malloc(cap * sizeof(*who));
    size_t *victims = malloc(cap * sizeof(*victims));
    bool *ok = malloc(cap * sizeof(*ok));
    size_t *all = malloc(cap * sizeof(*all));
    kgpu_queues *qs = kgpu_queues_clone(st->queues);
    kgpu_cluster *future = NULL;
    char refused_ns[64] = "", refused_name[KGPU_NAME_MAX + 1] = ""; /* a candidate skipped */
    int rc = EXT_RECLAIM_NONE;
    if (running == NULL || who == NULL || victims == NULL || ok == NULL || all == NULL ||
        qs == NULL || !cluster_with_holds(st, pod->uid, now, &future)) {
        snprintf(msg, len, "out of memory");
        goto out;
    }
    const kgpu_cluster *c = future != NULL ? future : st->cluster;
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v) && n < cap) {
        const ext_pod *p = v;
        if (p->nparts != 1 || !p->charged || p->evicting || p->status != POD_BOUND)
            continue;
        const refusal *no = refused_lately(st, p->uid, now);
        if (no != NULL) {
            snprintf(refused_ns, sizeof(refused_ns), "%s", no->ns);
            snprintf(refused_name, sizeof(refused_name), "%s", no->name);
            continue;
        }
        kgpu_qpod *r = &running[n];
        r->queue = kgpu_queues_find(st->queues, p->queue);
        if (r->queue < 0)
            continue;
        r->priority = p->priority;
        r->admitted = (int64_t)(p->since * 1000);
        r->a = p->part[0].a;
        ext__pod_demand(st->cluster, p, &r->d);
        who[n++] = p;
    }
    kgpu_queue_info qi;
    kgpu_queues_info(st->queues, q, &qi);
    kgpu_request req = pod->parts[0].req;
    req.cpu_milli = 0; /* kube-scheduler's to check */
    req.memory_mib = 0;
    int mine = queues_as_they_will_be(st, qs, q, pod->uid, now);
    kgpu_qdemand asked;
    kgpu_qdemand_of_request(&req, &asked);
    int was = kgpu_queues_check(qs, q, &asked, NULL, 0);
    if (was != KGPU_QUEUE_WITHIN && was != KGPU_QUEUE_RECLAIM) {
        snprintf(msg, len,
                 "queue %s's guarantee is taken by the reclaims under way for %d other pod%s of "
                 "it; waits for room",
                 qi.name, mine, mine == 1 ? "" : "s");
        rc = mine > 0 ? EXT_RECLAIM_SPOKEN : EXT_RECLAIM_NONE;
        goto out;
    }
    /*
     * Nodes where the pod could take no GPUs its queue's limits allow (per
     * model, memory), even with every candidate gone: freeing room there
     * is an eviction for nothing.
     */
    int nn = kgpu_cluster_node_count(c), refused_nodes = 0;
    bool *serves = calloc((size_t)nn + 1, sizeof(*serves));
    if (serves == NULL) {
        snprintf(msg, len, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        all[i] = i;
    take_away(qs, running, all, n, ok, -1);
    for (int i = 0; i < nn; i++)
        serves[i] = node_may_serve(c, i, qs, q, &req);
    take_away(qs, running, all, n, ok, +1);
    for (int i = 0; i < nn; i++)
        if (!serves[i] && drop_node(running, who, &n, i) > 0)
            refused_nodes++;
    free(serves);
    char limit_why[256] = "";
    kgpu_reclaim res = {.victims = victims};
    kgpu_error err;
    kgpu_error_clear(&err);
    int x = KGPU_ENOFIT;
    for (int tries = 0; tries < RECLAIM_TRIES; tries++) {
        x = kgpu_queues_reclaim(c, qs, running, n, q, &req, KGPU_RECLAIM_FRAG, &st->target, &res,
                                &err);
        if (x != 0)
            break;
        /* The placement it frees room for, judged with its victims gone. */
        kgpu_qdemand d = asked;
        if (res.ngpus == req.gpu_count && res.node >= 0)
            kgpu_qdemand_of_placement(c, &req, res.node, res.gpus, &d);
        take_away(qs, running, res.victims, res.nvictims, ok, -1);
        int after = kgpu_queues_check(qs, q, &d, limit_why, sizeof(limit_why));
        take_away(qs, running, res.victims, res.nvictims, ok, +1);
        if (after == KGPU_QUEUE_WITHIN)
            break;
        if (after == KGPU_QUEUE_BORROWS)
            snprintf(limit_why, sizeof(limit_why),
                     "there the pod would be above queue %s's guarantee", qi.name);
        refused_nodes++;
        x = KGPU_ENOFIT;
        if (drop_node(running, who, &n, res.node) == 0)
            break;
        kgpu_error_clear(&err);
    }
    if (x != 0) {
        if (refused_ns[0] != '\0') {
            char whom[KGPU_NAME_MAX + 100];
            if (strcmp(refused_ns, pod->ns) == 0)
                snprintf(whom, sizeof(whom), "%s/%s", refused_ns, refused_name);
            else
                snprintf(whom, sizeof(whom), "a pod of another namespace");
            snprintf(msg, len,
                     "reclaim is blocked by a PodDisruptionBudget: the eviction of %s was "
                     "refused, and no other pod that borrows would make room",
                     whom);
        } else if (refused_nodes > 0 && x == KGPU_ENOFIT) {
            snprintf(msg, len,
                     "queue %s: evicting the pods that borrow would free no GPUs its limits let "
                     "the pod use%s%.150s",
                     qi.name, limit_why[0] ? " (" : "", limit_why);
            if (limit_why[0] && strlen(msg) + 2 < len)
                strcat(msg, ")");
        } else {
            snprintf(msg, len, "%s", err.msg);
        }
        goto out;
    }
    if (res.nvictims > EXT_RECLAIM_VICTIMS_MAX) {
        snprintf(msg, len, "reclaim would evict %zu pods, more than %d at once", res.nvictims,
                 EXT_RECLAIM_VICTIMS_MAX);
        goto out;
    }
    if (res.nvictims == 0) {
        /* The room is there once pods being evicted for other reclaims are gone. */
        snprintf(msg, len, "waits for pods being evicted to leave");
        rc = EXT_RECLAIM_SPOKEN;
        goto out;
    }
    memset(out, 0, sizeof(*out));
    out->until = now + EXT_RECLAIM_WAIT_S;
    snprintf(out->for_uid, sizeof(out->for_uid), "%s", pod->uid);
    snprintf(out->for_ns, sizeof(out->for_ns), "%.63s", pod->ns);
    snprintf(out->for_name, sizeof(out->for_name), "%s", pod->name);
    snprintf(out->for_queue, sizeof(out->for_queue), "%s", qi.name);
    const kgpu_node *at = kgpu_cluster_node(c, res.node);
    snprintf(out->node, sizeof(out->node), "%s", at != NULL ? at->name : "");
    out->ngpus = res.ngpus;
    memcpy(out->gpus, res.gpus, sizeof(out->gpus));
    out->req = req;
    out->req.allow = out->req.exclude = NULL; /* borrowed from the pod: `models` says it */
    out->req.nallow = out->req.nexclude = 0;
    out->req.shape = -1;
    out->demand = asked;
    if (res.ngpus == req.gpu_count && res.node >= 0)
        kgpu_qdemand_of_placement(c, &req, res.node, res.gpus, &out->demand);
    for (size_t i = 0; i < res.nvictims; i++)
        ext__victim_add(out, who[res.victims[i]], running[res.victims[i]].d.milli);
    char list[200];
    ext__victims_text(out, pod->ns, list, sizeof(list));
    if (apply) {
        for (int i = 0; i < out->nvictims; i++)
            ext_queues_evicted(st, out, &out->v[i], EXT_EVICT_APPLIED);
        snprintf(msg, len, "reclaimed: evicted %s", list);
        rc = EXT_RECLAIM_APPLIED;
        goto out;
    }
    ext__reclaim_remember(st, out, now);
    snprintf(msg, len, "waits for reclaim: evicting %s", list);
    rc = EXT_RECLAIM_STARTED;
out:
    free(running);
    free(who);
    free(victims);
    free(ok);
    free(all);
    kgpu_queues_free(qs);
    kgpu_cluster_free(future);
    return rc;
}

void ext__victim_add(ext_reclaim *r, const ext_pod *p, int64_t freed_milli)
{
    ext__victim_fill(&r->v[r->nvictims++], p, freed_milli);
}

void ext__victim_fill(ext_victim *vv, const ext_pod *p, int64_t freed_milli)
{
    snprintf(vv->uid, sizeof(vv->uid), "%s", p->uid);
    snprintf(vv->ns, sizeof(vv->ns), "%s", p->ns);
    snprintf(vv->name, sizeof(vv->name), "%s", p->name);
    snprintf(vv->node, sizeof(vv->node), "%s", p->node);
    snprintf(vv->queue, sizeof(vv->queue), "%s", p->queue);
    vv->freed_milli = freed_milli;
}

void ext__reclaim_remember(ext_state *st, const ext_reclaim *r, double now)
{
    expire(&st->reclaims, now, EXT_RECLAIMS_MAX);
    ext_reclaim *keep = malloc(sizeof(*keep));
    if (keep != NULL) {
        *keep = *r;
        if (!kgpu_strmap_put(&st->reclaims, r->for_uid, keep, NULL))
            free(keep);
    }
    /* Being evicted: no other reclaim counts on them; still charged until they are gone. */
    for (int i = 0; i < r->nvictims; i++) {
        ext_pod *p = kgpu_strmap_get(&st->pods, r->v[i].uid);
        if (p != NULL)
            p->evicting = true;
    }
}

bool ext__refused_lately(ext_state *st, const char *uid, double now)
{
    return refused_lately(st, uid, now) != NULL;
}

static const char *outcome_name(int outcome)
{
    static const char *names[] = {"applied", "evicted", "blocked by a PodDisruptionBudget",
                                  "gone already", "failed"};
    return outcome >= 0 && outcome <= EXT_EVICT_FAILED ? names[outcome] : "?";
}

void ext_queues_evicted(ext_state *st, const ext_reclaim *r, const ext_victim *v, int outcome)
{
    char freed[32];
    kgpu_queue_gpus_str(v->freed_milli, freed, sizeof(freed));
    ext_log(outcome == EXT_EVICT_FAILED ? EXT_WARN : EXT_INFO,
            "%s: %s/%s (queue %s, %s GPUs on %s) for %s/%s (queue %s): %s",
            r->move ? "consolidation" : "reclaim", v->ns, v->name, v->queue, freed, v->node,
            r->for_ns, r->for_name, r->for_queue, outcome_name(outcome));
    ext_eviction *e = &st->evictions[st->evictions_next];
    st->evictions_next = (st->evictions_next + 1) % EXT_EVICTIONS_KEPT;
    if (st->nevictions < EXT_EVICTIONS_KEPT)
        st->nevictions++;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(e, 0, sizeof(*e));
    e->at = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    snprintf(e->ns, sizeof(e->ns), "%s", v->ns);
    snprintf(e->name, sizeof(e->name), "%s", v->name);
    snprintf(e->uid, sizeof(e->uid), "%s", v->uid);
    snprintf(e->node, sizeof(e->node), "%s", v->node);
    snprintf(e->queue, sizeof(e->queue), "%s", v->queue);
    snprintf(e->for_ns, sizeof(e->for_ns), "%s", r->for_ns);
    snprintf(e->for_name, sizeof(e->for_name), "%s", r->for_name);
    snprintf(e->for_queue, sizeof(e->for_queue), "%s", r->for_queue);
    e->freed_milli = v->freed_milli;
    e->outcome = outcome;
    int q = st->queues != NULL ? kgpu_queues_find(st->queues, v->queue) : -1;
    bool done = outcome == EXT_EVICT_APPLIED || outcome == EXT_EVICT_EVICTED;
    if (done && r->move)
        atomic_fetch_add(&st->metrics->consolidation_moves, 1);
    else if (done && q >= 0 && st->queue_evictions != NULL)
        st->queue_evictions[q]++; /* a queue's evictions are its borrowers', reclaimed */
    ext_pod *p = kgpu_strmap_get(&st->pods, v->uid);
    switch (outcome) {
    case EXT_EVICT_APPLIED:
    case EXT_EVICT_GONE:
        ext_state_pod_gone(st, v->uid);
        break;
    case EXT_EVICT_EVICTED:
        break; /* charged until its pod is deleted or ends */
    case EXT_EVICT_BLOCKED: {
        /* Choose again at the pod's next filter, without this one for a while. */
        if (p != NULL)
            p->evicting = false;
        if (r->move)
            st->consolidated_at = 0; /* nothing moved: the next try need not wait */
        free(kgpu_strmap_del(&st->reclaims, r->for_uid));
        refusal *no = kgpu_strmap_get(&st->refused, v->uid);
        if (no == NULL && st->refused.len >= EXT_REFUSED_MAX)
            expire(&st->refused, ext_now(), EXT_REFUSED_MAX);
        if (no == NULL && st->refused.len < EXT_REFUSED_MAX &&
            (no = calloc(1, sizeof(*no))) != NULL &&
            !kgpu_strmap_put(&st->refused, v->uid, no, NULL)) {
            free(no);
            no = NULL;
        }
        if (no != NULL) {
            no->until = ext_now() + EXT_REFUSED_S;
            snprintf(no->ns, sizeof(no->ns), "%s", v->ns);
            snprintf(no->name, sizeof(no->name), "%s", v->name);
        }
        break;
    }
    default:
        if (p != NULL)
            p->evicting = false;
        free(kgpu_strmap_del(&st->reclaims, r->for_uid));
        break;
    }
}

/* Highest priority first, then the longest waiting. Copied: entries may go between slices. */
typedef struct sweep_cand {
    char uid[64];
    int priority;
    double since;
} sweep_cand;

static int cmp_cand(const void *a, const void *b)
{
    const sweep_cand *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    return (x->since > y->since) - (x->since < y->since);
}

bool ext__fits_somewhere(ext_state *st, const kgpu_pod *pod)
{
    kgpu_request fitreq[KGPU_MAX_PARTS];
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    ext_fit_requests(pod, fitreq, reqs);
    int n = kgpu_cluster_node_count(st->cluster);
    for (int i = 0; i < n; i++)
        if (!ext_dra_is_node(st, kgpu_cluster_node(st->cluster, i)->name) &&
            kgpu_fit(st->cluster, i, reqs[0], NULL, 0) &&
            ext_reclaim_hold_taken(st, i, pod->uid, reqs, 1) == NULL)
            return true; /* a DRA node serves no device-plugin pod */
    return false;
}

/*
 * Ends a slice once it has held st->mu for st->sweep_slice_s: releases it
 * for EXT_SWEEP_YIELD_US (a waiter woken by the release gets it) and takes
 * it again. The start of a slice publishes what prioritize-gpuless scores
 * from, the cluster being as it will stay until the slice ends.
 */
static void sweep_slice(ext_state *st, double *started)
{
    double now = ext_now();
    if (now - *started < st->sweep_slice_s)
        return;
    pthread_mutex_unlock(&st->mu);
    struct timespec ts = {0, EXT_SWEEP_YIELD_US * 1000L};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&st->mu);
    *started = ext_now();
    st->sweep_slices++;
    ext_gpuless_publish(st);
}

int ext_unsched_sweep(ext_state *st, ext_sweep_act *acts, int max)
{
    if (st->queues == NULL || st->unsched.len == 0 || max <= 0)
        return 0;
    size_t n = 0, cap = st->unsched.len;
    sweep_cand *c = malloc(cap * sizeof(*c));
    kgpu_pod *pod = malloc(sizeof(*pod));
    if (c == NULL || pod == NULL) {
        free(c);
        free(pod);
        return 0;
    }
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->unsched, &it, &k, &v) && n < cap) {
        const ext_unsched *u = v;
        snprintf(c[n].uid, sizeof(c[n].uid), "%s", u->uid);
        c[n].priority = u->priority;
        c[n].since = u->since;
        n++;
    }
    qsort(c, n, sizeof(*c), cmp_cand);
    double now = ext_now(), started = now;
    st->sweep_slices++;
    ext_gpuless_publish(st);
    int nact = 0;
    for (size_t i = 0; i < n && nact < max; i++) {
        if (i > 0)
            sweep_slice(st, &started);
        ext_unsched *u = kgpu_strmap_get(&st->unsched, c[i].uid);
        if (st->queues == NULL)
            break; /* turned off meanwhile */
        if (u == NULL)
            continue; /* bound or gone meanwhile */
        kgpu_error err;
        kgpu_error_clear(&err);
        char qname[KGPU_QUEUE_NAME_MAX + 1], why[256], msg[200];
        ext_unsched_pod(u, pod);
        if (pod->nparts != 1 || ext_state_compile(st, pod, &err) != 0)
            continue; /* reclaim places pods of one GPU container only */
        int q = ext_queues_resolve(st, pod->ns, u->label, qname, sizeof(qname), why,
                                   sizeof(why));
        if (q < 0)
            continue;
        int qs = ext_queues_check(st, q, pod, -1, NULL, 0);
        if ((qs != KGPU_QUEUE_WITHIN && qs != KGPU_QUEUE_RECLAIM) || ext__fits_somewhere(st, pod))
            continue; /* above its guarantee, or waiting for something GPUs do not decide */
        ext_sweep_act *a = &acts[nact];
        memset(a, 0, sizeof(*a));
        int how = ext_queues_reclaim(st, pod, q, false, &a->rec, msg, sizeof(msg));
        if (how == EXT_RECLAIM_STARTED) {
            a->evict = true;
            a->type = "Normal";
            a->reason = "GPUQueueReclaim";
        } else if (how == EXT_RECLAIM_NONE && strstr(msg, "PodDisruptionBudget") != NULL) {
            a->type = "Warning";
            a->reason = "GPUQueueReclaimBlocked";
        } else {
            continue; /* under way already, or nothing that borrows would make room */
        }
        snprintf(a->message, sizeof(a->message), "queue %.63s is within its guarantee; %.160s", qname,
                 msg);
        snprintf(a->ns, sizeof(a->ns), "%s", u->ns);
        snprintf(a->name, sizeof(a->name), "%s", u->name);
        snprintf(a->uid, sizeof(a->uid), "%s", u->uid);
        if (strcmp(u->event, a->message) == 0 && now - u->event_at < EXT_EVENT_REPEAT_S) {
            a->reason = NULL; /* said lately */
        } else {
            snprintf(u->event, sizeof(u->event), "%s", a->message);
            u->event_at = now;
        }
        if (a->evict || a->reason != NULL)
            nact++;
    }
    free(c);
    free(pod);
    return nact;
}
