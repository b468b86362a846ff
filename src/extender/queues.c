/*
 * GPU queues in the extender (docs/queues.md): which queue a pod is in,
 * charging what it holds at bind and releasing it when it ends, admission
 * answers for filter, and reclaim for a pod within its guarantee that fits
 * nowhere. The arithmetic is the core's (kgpu/queue.h); this file keeps the
 * tree in step with the pods the state holds.
 *
 * The tree with usage is never patched after a change of tree or of
 * inventory: it is cloned again from the tree as defined and every held pod
 * is charged to it from the GPUs it actually holds, so what is charged is
 * always what is held. Every function expects st->mu held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ext.h"

void ext_pod_queue_fields(const json_t *pod, char *label, size_t len, int *priority)
{
    const json_t *labels = json_object_get(json_object_get(pod, "metadata"), "labels");
    const char *l = json_string_value(json_object_get(labels, KGPU_QUEUE_LABEL));
    snprintf(label, len, "%s", l != NULL && strlen(l) <= KGPU_QUEUE_NAME_MAX ? l : "");
    const json_t *pr = json_object_get(json_object_get(pod, "spec"), "priority");
    json_int_t v = json_is_integer(pr) ? json_integer_value(pr) : 0;
    /* Kubernetes priorities are int32: anything else is not from the API server. */
    *priority = v < -2147483647 ? -2147483647 : v > 2147483647 ? 2147483647 : (int)v;
}

/* Adds one GPU's share to d; past KGPU_MAX_GPUS_PER_NODE parts, onto a part of the same model. */
static void qd_add(kgpu_qdemand *d, int model, int milli, int64_t mem)
{
    d->milli += milli;
    d->mem_mib += mem;
    int at = d->nparts;
    if (at == KGPU_MAX_GPUS_PER_NODE) {
        for (at = 0; at < d->nparts && d->part[at].model != model; at++)
            ;
        if (at == d->nparts)
            at = d->nparts - 1; /* more models than parts: cannot happen with 32 GPUs a node */
    } else {
        d->nparts++;
        d->part[at].model = model;
        d->part[at].milli = 0;
        d->part[at].mem_mib = 0;
    }
    d->part[at].milli += milli;
    d->part[at].mem_mib += mem;
}

/* What p holds, over all its containers, on its GPUs' models. */
static void pod_demand(const kgpu_cluster *c, const ext_pod *p, kgpu_qdemand *d)
{
    memset(d, 0, sizeof(*d));
    for (int i = 0; i < p->nparts; i++) {
        kgpu_qdemand one;
        kgpu_qdemand_of_assignment(c, &p->part[i].a, &one);
        for (int k = 0; k < one.nparts; k++)
            qd_add(d, one.part[k].model, one.part[k].milli, one.part[k].mem_mib);
    }
}

/* Evictions counted per queue survive a new tree by name. */
static void carry_evictions(ext_state *st, const kgpu_queues *old_tree,
                            const unsigned long long *old)
{
    free(st->queue_evictions);
    st->queue_evictions = NULL;
    if (st->queues == NULL)
        return;
    int n = kgpu_queues_count(st->queues);
    st->queue_evictions = calloc((size_t)n + 1, sizeof(*st->queue_evictions));
    for (int i = 0; old_tree != NULL && old != NULL && st->queue_evictions != NULL &&
                    i < kgpu_queues_count(old_tree);
         i++) {
        kgpu_queue_info qi;
        if (kgpu_queues_info(old_tree, i, &qi) != 0)
            continue;
        int j = kgpu_queues_find(st->queues, qi.name);
        if (j >= 0)
            st->queue_evictions[j] = old[i];
    }
}

void ext_queues_recharge(ext_state *st)
{
    kgpu_queues *old = st->queues;
    unsigned long long *old_ev = st->queue_evictions;
    st->queue_evictions = NULL;
    st->queues = NULL;
    if (st->queues_spec != NULL) {
        kgpu_error err;
        st->queues = kgpu_queues_clone(st->queues_spec);
        if (st->queues == NULL)
            ext_log(EXT_ERROR, "queues: out of memory; queues are off until the next change");
        else if (kgpu_queues_bind_models(st->queues, st->cluster, &err) != 0)
            ext_log(EXT_WARN, "queues: per-model entries not applied: %s", err.msg);
    }
    carry_evictions(st, old, old_ev);
    kgpu_queues_free(old);
    free(old_ev);
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v)) {
        ext_pod *p = v;
        p->charged = false;
        ext_queues_name_pod(st, p);
        ext_queues_charge(st, p, true, NULL);
    }
}

void ext_queues_name_pod(ext_state *st, ext_pod *p)
{
    const char *q = kgpu_queue_name_for(p->queue_label, kgpu_strmap_get(&st->ns_queue, p->ns));
    snprintf(p->queue, sizeof(p->queue), "%s", q);
}

void ext_queues_set(ext_state *st, kgpu_queues *spec)
{
    kgpu_queues_free(st->queues_spec);
    st->queues_spec = spec;
    ext_queues_recharge(st);
}

void ext_queues_set_namespace(ext_state *st, const char *ns, const char *queue)
{
    if (queue == NULL || queue[0] == '\0' || strlen(queue) > KGPU_QUEUE_NAME_MAX) {
        free(kgpu_strmap_del(&st->ns_queue, ns));
        return;
    }
    char *copy = strdup(queue);
    void *old = NULL;
    if (copy == NULL || !kgpu_strmap_put(&st->ns_queue, ns, copy, &old)) {
        free(copy);
        return;
    }
    free(old);
}

int ext_queues_resolve(ext_state *st, const char *ns, const char *label, char *name, size_t len,
                       char *why, size_t whylen)
{
    const char *ann = kgpu_strmap_get(&st->ns_queue, ns);
    const char *q = kgpu_queue_name_for(label, ann);
    snprintf(name, len, "%s", q);
    if (st->queues == NULL)
        return -1;
    int id = kgpu_queues_find(st->queues, q);
    if (id >= 0)
        return id;
    snprintf(why, whylen, "kgpu: queue %.63s does not exist (named by %s)", q,
             label != NULL && label[0] ? "the pod's kgpu.io/queue label"
                                       : "its namespace's kgpu.io/queue annotation");
    return -2;
}

int ext_queues_charge(ext_state *st, ext_pod *p, bool running, kgpu_error *err)
{
    if (st->queues == NULL || p->charged)
        return 0;
    int q = kgpu_queues_find(st->queues, p->queue);
    if (q < 0)
        return 0;
    kgpu_qdemand d;
    pod_demand(st->cluster, p, &d);
    kgpu_error why;
    int rc = running ? kgpu_queues_charge_running(st->queues, q, &d, &why)
                     : kgpu_queues_charge(st->queues, q, &d, &why);
    if (rc != 0)
        return kgpu_error_set(err, rc, "%s", why.msg);
    p->charged = true;
    return 0;
}

void ext_queues_uncharge(ext_state *st, ext_pod *p)
{
    if (!p->charged || st->queues == NULL)
        return;
    p->charged = false;
    kgpu_error err;
    int q = kgpu_queues_find(st->queues, p->queue);
    kgpu_qdemand d;
    pod_demand(st->cluster, p, &d); /* the cluster is the one it was charged on */
    if (q >= 0 && kgpu_queues_uncharge(st->queues, q, &d, &err) != 0)
        ext_log(EXT_ERROR, "pod %s/%s: %s", p->ns, p->name, err.msg);
}

int ext_queues_check(ext_state *st, int q, const kgpu_pod *pod, int idx, char *why, size_t len)
{
    kgpu_qdemand d;
    memset(&d, 0, sizeof(d));
    const kgpu_node *n = idx >= 0 ? kgpu_cluster_node(st->cluster, idx) : NULL;
    for (int i = 0; i < pod->nparts; i++) {
        const kgpu_request *r = &pod->parts[i].req;
        if (n == NULL) {
            kgpu_qdemand one;
            kgpu_qdemand_of_request(r, &one);
            d.milli += one.milli;
            d.mem_mib += one.mem_mib;
            continue;
        }
        /* The node's first GPUs of an allowed model stand for the ones bind will choose. */
        int taken = 0;
        for (int g = 0; g < n->ngpus && taken < r->gpu_count; g++) {
            const kgpu_gpu *x = &n->gpus[g];
            if (!((r->models >> x->model) & 1))
                continue;
            qd_add(&d, x->model, r->exclusive ? KGPU_MILLI : r->gpu_milli,
                   r->exclusive ? x->memory_mib : r->gpu_memory_mib);
            taken++;
        }
    }
    return kgpu_queues_check(st->queues, q, &d, why, len);
}

/* ---- reclaim ---- */

/* A victim whose eviction a PodDisruptionBudget refused: skipped by reclaim until `until`. */
typedef struct refusal {
    double until; /* first: see expire() */
    char who[KGPU_NAME_MAX + 66]; /* ns/name */
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

static void victims_text(const ext_reclaim *r, char *out, size_t len)
{
    size_t off = 0;
    out[0] = '\0';
    for (int i = 0; i < r->nvictims && off < len; i++)
        off += (size_t)snprintf(out + off, len - off, "%s%s/%s (queue %s)", i ? ", " : "",
                                r->v[i].ns, r->v[i].name, r->v[i].queue);
}

int ext_queues_reclaim(ext_state *st, const kgpu_pod *pod, int q, bool apply, ext_reclaim *out,
                       char *msg, size_t len)
{
    double now = ext_now();
    msg[0] = '\0';
    expire(&st->reclaims, now, (size_t)-1);
    ext_reclaim *inflight = kgpu_strmap_get(&st->reclaims, pod->uid);
    if (inflight != NULL && !victims_gone(st, inflight)) {
        char list[200];
        victims_text(inflight, list, sizeof(list));
        snprintf(msg, len, "waits for reclaim: evicting %s", list);
        return EXT_RECLAIM_INFLIGHT;
    }
    if (inflight != NULL)
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
    char refused_pod[KGPU_NAME_MAX + 66] = ""; /* a candidate skipped: its eviction was refused */
    int rc = EXT_RECLAIM_NONE;
    if (running == NULL || who == NULL || victims == NULL) {
        snprintf(msg, len, "out of memory");
        goto out;
    }
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v) && n < cap) {
        const ext_pod *p = v;
        if (p->nparts != 1 || !p->charged || p->evicting || p->status != POD_BOUND)
            continue;
        const refusal *no = refused_lately(st, p->uid, now);
        if (no != NULL) {
            snprintf(refused_pod, sizeof(refused_pod), "%s", no->who);
            continue;
        }
        kgpu_qpod *r = &running[n];
        r->queue = kgpu_queues_find(st->queues, p->queue);
        if (r->queue < 0)
            continue;
        r->priority = p->priority;
        r->admitted = (int64_t)(p->since * 1000);
        r->a = p->part[0].a;
        pod_demand(st->cluster, p, &r->d);
        who[n++] = p;
    }
    kgpu_request req = pod->parts[0].req;
    req.cpu_milli = 0; /* kube-scheduler's to check */
    req.memory_mib = 0;
    kgpu_reclaim res = {.victims = victims};
    kgpu_error err;
    kgpu_error_clear(&err);
    int x = kgpu_queues_reclaim(st->cluster, st->queues, running, n, q, &req, KGPU_RECLAIM_FRAG,
                                &st->target, &res, &err);
    if (x != 0) {
        if (refused_pod[0] != '\0')
            snprintf(msg, len,
                     "reclaim is blocked by a PodDisruptionBudget: the eviction of %s was "
                     "refused, and no other pod that borrows would make room",
                     refused_pod);
        else
            snprintf(msg, len, "%s", err.msg);
        goto out;
    }
    if (res.nvictims > EXT_RECLAIM_VICTIMS_MAX) {
        snprintf(msg, len, "reclaim would evict %zu pods, more than %d at once", res.nvictims,
                 EXT_RECLAIM_VICTIMS_MAX);
        goto out;
    }
    memset(out, 0, sizeof(*out));
    out->until = now + EXT_RECLAIM_WAIT_S;
    snprintf(out->for_uid, sizeof(out->for_uid), "%s", pod->uid);
    snprintf(out->for_ns, sizeof(out->for_ns), "%.63s", pod->ns);
    snprintf(out->for_name, sizeof(out->for_name), "%s", pod->name);
    kgpu_queue_info qi;
    kgpu_queues_info(st->queues, q, &qi);
    snprintf(out->for_queue, sizeof(out->for_queue), "%s", qi.name);
    for (size_t i = 0; i < res.nvictims; i++) {
        const ext_pod *p = who[res.victims[i]];
        ext_victim *vv = &out->v[out->nvictims++];
        snprintf(vv->uid, sizeof(vv->uid), "%s", p->uid);
        snprintf(vv->ns, sizeof(vv->ns), "%s", p->ns);
        snprintf(vv->name, sizeof(vv->name), "%s", p->name);
        snprintf(vv->node, sizeof(vv->node), "%s", p->node);
        snprintf(vv->queue, sizeof(vv->queue), "%s", p->queue);
        vv->freed_milli = running[res.victims[i]].d.milli;
    }
    char list[200];
    victims_text(out, list, sizeof(list));
    if (apply) {
        for (int i = 0; i < out->nvictims; i++)
            ext_queues_evicted(st, out, &out->v[i], EXT_EVICT_APPLIED);
        snprintf(msg, len, "reclaimed: evicted %s", list);
        rc = EXT_RECLAIM_APPLIED;
        goto out;
    }
    expire(&st->reclaims, now, EXT_RECLAIMS_MAX);
    ext_reclaim *keep = malloc(sizeof(*keep));
    if (keep != NULL) {
        *keep = *out;
        if (!kgpu_strmap_put(&st->reclaims, pod->uid, keep, NULL))
            free(keep);
    }
    /* Being evicted: no other reclaim counts on them; still charged until they are gone. */
    for (int i = 0; i < out->nvictims; i++) {
        ext_pod *p = kgpu_strmap_get(&st->pods, out->v[i].uid);
        if (p != NULL)
            p->evicting = true;
    }
    snprintf(msg, len, "waits for reclaim: evicting %s", list);
    rc = EXT_RECLAIM_STARTED;
out:
    free(running);
    free(who);
    free(victims);
    return rc;
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
            "reclaim: %s/%s (queue %s, %s GPUs on %s) for %s/%s (queue %s): %s", v->ns, v->name,
            v->queue, freed, v->node, r->for_ns, r->for_name, r->for_queue, outcome_name(outcome));
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
    if ((outcome == EXT_EVICT_APPLIED || outcome == EXT_EVICT_EVICTED) && q >= 0 &&
        st->queue_evictions != NULL)
        st->queue_evictions[q]++;
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
            snprintf(no->who, sizeof(no->who), "%s/%s", v->ns, v->name);
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

/* Counts one pending pod in queue q (none when q < 0) and every ancestor. */
static void pending_on_path(ext_state *st, ext_queue_row *r, int q)
{
    while (q >= 0) {
        r[q].pending++;
        kgpu_queue_info qi;
        kgpu_queues_info(st->queues, q, &qi);
        q = qi.parent;
    }
}

bool ext_queues_rows(ext_state *st, ext_queue_row **rows, int *n, ext_eviction *ev, int *nev)
{
    *rows = NULL;
    *n = 0;
    *nev = 0;
    for (int i = 0; i < st->nevictions; i++) {
        int at = (st->evictions_next - 1 - i + 2 * EXT_EVICTIONS_KEPT) % EXT_EVICTIONS_KEPT;
        ev[(*nev)++] = st->evictions[at];
    }
    if (st->queues == NULL)
        return true;
    int count = kgpu_queues_count(st->queues);
    ext_queue_row *r = calloc((size_t)count + 1, sizeof(*r));
    if (r == NULL)
        return false;
    for (int q = 0; q < count; q++) {
        kgpu_queue_info qi;
        kgpu_queues_info(st->queues, q, &qi);
        ext_queue_row *x = &r[q];
        snprintf(x->name, sizeof(x->name), "%s", qi.name);
        if (qi.parent >= 0) {
            kgpu_queue_info pi;
            kgpu_queues_info(st->queues, qi.parent, &pi);
            snprintf(x->parent, sizeof(x->parent), "%s", pi.name);
        }
        x->depth = qi.depth;
        x->weight = qi.weight;
        x->guarantee = qi.guarantee;
        x->limit = qi.limit;
        x->used = qi.used;
        x->borrowed_milli = kgpu_queues_borrowed_milli(st->queues, q);
        x->pods = qi.pods;
        x->evictions = st->queue_evictions != NULL ? st->queue_evictions[q] : 0;
    }
    /*
     * Pending, on their queue's path: pods whose last filter waited for quota
     * or reclaim, and pods kube-scheduler found no node for (its own filters
     * may refuse every node before kgpu's is called).
     */
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pending, &it, &k, &v)) {
        const ext_filtered *f = v;
        if (f->waiting != EXT_WAIT_NONE)
            pending_on_path(st, r, kgpu_queues_find(st->queues, f->queue));
    }
    it = 0;
    while (kgpu_strmap_next(&st->unsched, &it, &k, &v)) {
        const ext_unsched *u = v;
        const ext_filtered *f = kgpu_strmap_get(&st->pending, u->uid);
        if (f != NULL && f->waiting != EXT_WAIT_NONE)
            continue; /* counted above */
        char label[KGPU_QUEUE_NAME_MAX + 1], name[KGPU_QUEUE_NAME_MAX + 1], why[256];
        int priority;
        ext_pod_queue_fields(u->pod, label, sizeof(label), &priority);
        pending_on_path(st, r,
                        ext_queues_resolve(st, u->ns, label, name, sizeof(name), why, sizeof(why)));
    }
    *rows = r;
    *n = count;
    return true;
}

/* ---- unschedulable pods: reclaim without a filter call ---- */

/* Whether kube-scheduler found no node for the pod: PodScheduled False, Unschedulable. */
static bool pod_unschedulable(const json_t *obj)
{
    const json_t *conds = json_object_get(json_object_get(obj, "status"), "conditions");
    size_t i;
    const json_t *c;
    json_array_foreach(conds, i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        if (type == NULL || strcmp(type, "PodScheduled") != 0)
            continue;
        const char *status = json_string_value(json_object_get(c, "status"));
        const char *reason = json_string_value(json_object_get(c, "reason"));
        return status != NULL && strcmp(status, "False") == 0 && reason != NULL &&
               strcmp(reason, "Unschedulable") == 0;
    }
    return false;
}

void ext_unsched_drop(ext_state *st, const char *uid)
{
    ext_unsched *u = kgpu_strmap_del(&st->unsched, uid);
    if (u != NULL) {
        json_decref(u->pod);
        free(u);
    }
}

void ext_unsched_clear(ext_state *st)
{
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->unsched, &it, &k, &v)) {
        ext_unsched *u = v;
        json_decref(u->pod);
        free(u);
    }
    kgpu_strmap_clear(&st->unsched);
    kgpu_strmap_init(&st->unsched);
}

void ext_unsched_seen(ext_state *st, const json_t *obj, const kgpu_pod *pod)
{
    const json_t *meta = json_object_get(obj, "metadata");
    bool waits = pod->node[0] == '\0' && !pod->terminal && pod->nparts > 0 &&
                 json_object_get(meta, "deletionTimestamp") == NULL && pod_unschedulable(obj);
    if (!waits) {
        ext_unsched_drop(st, pod->uid);
        return;
    }
    json_t *copy = json_deep_copy(obj); /* the watch's object is borrowed */
    if (copy == NULL)
        return;
    ext_unsched *u = kgpu_strmap_get(&st->unsched, pod->uid);
    if (u != NULL) {
        json_decref(u->pod);
        u->pod = copy;
        return;
    }
    if (st->unsched.len >= EXT_UNSCHED_MAX || strlen(pod->uid) >= sizeof(u->uid) ||
        (u = calloc(1, sizeof(*u))) == NULL) {
        json_decref(copy);
        return; /* bounded: its filter calls still reclaim for it, if any come */
    }
    u->since = ext_now();
    snprintf(u->uid, sizeof(u->uid), "%s", pod->uid);
    snprintf(u->ns, sizeof(u->ns), "%.63s", pod->ns);
    snprintf(u->name, sizeof(u->name), "%s", pod->name);
    u->pod = copy;
    if (!kgpu_strmap_put(&st->unsched, u->uid, u, NULL)) {
        json_decref(copy);
        free(u);
    }
}

typedef struct sweep_cand {
    ext_unsched *u;
    int priority;
    char label[KGPU_QUEUE_NAME_MAX + 1]; /* its kgpu.io/queue label, "" without one */
} sweep_cand;

/* Highest priority first, then the longest waiting. */
static int cmp_cand(const void *a, const void *b)
{
    const sweep_cand *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    return (x->u->since > y->u->since) - (x->u->since < y->u->since);
}

/* Whether the pod's one GPU request fits some node as it is now. */
static bool fits_somewhere(ext_state *st, const kgpu_pod *pod)
{
    kgpu_request fitreq[KGPU_MAX_PARTS];
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    ext_fit_requests(pod, fitreq, reqs);
    int n = kgpu_cluster_node_count(st->cluster);
    for (int i = 0; i < n; i++)
        if (!ext_dra_is_node(st, kgpu_cluster_node(st->cluster, i)->name) &&
            kgpu_fit(st->cluster, i, reqs[0], NULL, 0))
            return true; /* a DRA node serves no device-plugin pod */
    return false;
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
        c[n].u = v;
        ext_pod_queue_fields(c[n].u->pod, c[n].label, sizeof(c[n].label), &c[n].priority);
        n++;
    }
    qsort(c, n, sizeof(*c), cmp_cand);
    double now = ext_now();
    int nact = 0;
    for (size_t i = 0; i < n && nact < max; i++) {
        ext_unsched *u = c[i].u;
        kgpu_error err;
        kgpu_error_clear(&err);
        char qname[KGPU_QUEUE_NAME_MAX + 1], why[256], msg[200];
        if (kgpu_pod_from_json(u->pod, st->cfg->memory_unit_mib, pod, &err) != 0 ||
            pod->nparts != 1 || ext_state_compile(st, pod, &err) != 0)
            continue; /* reclaim places pods of one GPU container only */
        int q = ext_queues_resolve(st, pod->ns, c[i].label, qname, sizeof(qname), why,
                                   sizeof(why));
        if (q < 0)
            continue;
        int qs = ext_queues_check(st, q, pod, -1, NULL, 0);
        if ((qs != KGPU_QUEUE_WITHIN && qs != KGPU_QUEUE_RECLAIM) || fits_somewhere(st, pod))
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
