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

#include "state_impl.h"

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

/* Adds what assignment a holds, on its GPUs' models, to d. */
static void qd_add_assignment(const kgpu_cluster *c, const kgpu_assignment *a, kgpu_qdemand *d)
{
    kgpu_qdemand one;
    kgpu_qdemand_of_assignment(c, a, &one);
    for (int k = 0; k < one.nparts; k++)
        qd_add(d, one.part[k].model, one.part[k].milli, one.part[k].mem_mib);
}

/* What p holds, over all its containers, on its GPUs' models. */
void ext__pod_demand(const kgpu_cluster *c, const ext_pod *p, kgpu_qdemand *d)
{
    memset(d, 0, sizeof(*d));
    for (int i = 0; i < p->nparts; i++)
        qd_add_assignment(c, &p->part[i].a, d);
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
    it = 0;
    while (kgpu_strmap_next(&st->dra_claims, &it, &k, &v)) {
        ext_dra_claim *c = v;
        c->qcharged = false; /* the old tree, and its charges, are gone */
        ext_queues_charge_claim(st, c);
    }
}

/*
 * A namespace as queue selection reads it: one block, freed with free():
 * the kgpu_queue_ns, its labels sorted by key, then the strings.
 */
typedef struct ext_ns {
    kgpu_queue_ns q;
    kgpu_label labels[];
} ext_ns;

/* ns as kept, or a namespace nobody annotated or labelled. */
static kgpu_queue_ns ns_of(ext_state *st, const char *ns)
{
    const ext_ns *x = kgpu_strmap_get(&st->ns_queue, ns);
    kgpu_queue_ns q = x != NULL ? x->q : (kgpu_queue_ns){0};
    q.name = ns;
    return q;
}

/*
 * The queue what runs in namespace ns with queue label `label` (NULL or ""
 * for none) is charged to: the label's when the namespace may use it, else
 * the namespace's own (never the label's), with *refused set and why said.
 */
static const char *charged_queue(ext_state *st, const char *ns, const char *label, char *why,
                                 size_t len, bool *refused)
{
    kgpu_queue_ns n = ns_of(st, ns);
    *refused = st->queues != NULL && label != NULL && label[0] != '\0' &&
               kgpu_queues_pick(st->queues, &n, label, why, len) < 0;
    return kgpu_queue_name_for(*refused ? NULL : label, n.queue);
}

void ext_queues_name_pod(ext_state *st, ext_pod *p)
{
    char why[512];
    bool refused;
    const char *q = charged_queue(st, p->ns, p->queue_label, why, sizeof(why), &refused);
    if (refused && !p->queue_refused)
        ext_log(EXT_WARN, "pod %s/%s: %s; charged to queue %s", p->ns, p->name, why, q);
    p->queue_refused = refused;
    snprintf(p->queue, sizeof(p->queue), "%s", q);
    ext__usage_requeue(st, p); /* a pod holding GPUs counts in its new queue from now on */
}

void ext_queues_set(ext_state *st, kgpu_queues *spec)
{
    kgpu_queues_free(st->queues_spec);
    st->queues_spec = spec;
    ext_queues_recharge(st);
}

static int cmp_label(const void *a, const void *b)
{
    return strcmp(((const kgpu_label *)a)->key, ((const kgpu_label *)b)->key);
}

/* The block for (queue, labels), or NULL when there is nothing to keep or no memory. */
static ext_ns *ns_block(const char *queue, const json_t *labels)
{
    if (queue != NULL && (queue[0] == '\0' || strlen(queue) > KGPU_QUEUE_NAME_MAX))
        queue = NULL;
    size_t bytes = queue != NULL ? strlen(queue) + 1 : 0;
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)labels, k, v)
    {
        const char *val = json_string_value(v);
        /* Sizes the API server allows; its own name label reads as the name anyway. */
        if (n < EXT_NS_LABELS_MAX && val != NULL && strlen(k) <= KGPU_QUEUE_LABEL_KEY_MAX &&
            strlen(val) <= 63 && strcmp(k, "kubernetes.io/metadata.name") != 0) {
            bytes += strlen(k) + strlen(val) + 2;
            n++;
        }
    }
    if (queue == NULL && n == 0)
        return NULL;
    ext_ns *x = calloc(1, sizeof(*x) + (size_t)n * sizeof(kgpu_label) + bytes);
    if (x == NULL)
        return NULL;
    char *at = (char *)&x->labels[n];
    if (queue != NULL) {
        x->q.queue = strcpy(at, queue);
        at += strlen(queue) + 1;
    }
    x->q.labels = x->labels;
    json_object_foreach((json_t *)labels, k, v)
    {
        const char *val = json_string_value(v);
        if (x->q.nlabels < n && val != NULL && strlen(k) <= KGPU_QUEUE_LABEL_KEY_MAX &&
            strlen(val) <= 63 && strcmp(k, "kubernetes.io/metadata.name") != 0) {
            kgpu_label *l = &x->labels[x->q.nlabels++];
            l->key = strcpy(at, k);
            at += strlen(k) + 1;
            l->value = strcpy(at, val);
            at += strlen(val) + 1;
        }
    }
    qsort(x->labels, (size_t)x->q.nlabels, sizeof(kgpu_label), cmp_label);
    return x;
}

static bool ns_same(const ext_ns *a, const ext_ns *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    if ((a->q.queue == NULL) != (b->q.queue == NULL) ||
        (a->q.queue != NULL && strcmp(a->q.queue, b->q.queue) != 0) ||
        a->q.nlabels != b->q.nlabels)
        return false;
    for (int i = 0; i < a->q.nlabels; i++)
        if (strcmp(a->labels[i].key, b->labels[i].key) != 0 ||
            strcmp(a->labels[i].value, b->labels[i].value) != 0)
            return false;
    return true;
}

bool ext_queues_set_namespace(ext_state *st, const char *ns, const char *queue,
                              const json_t *labels)
{
    ext_ns *x = ns_block(queue, labels);
    const ext_ns *was = kgpu_strmap_get(&st->ns_queue, ns);
    bool changed = !ns_same(was, x);
    void *old = NULL;
    if (x == NULL || !kgpu_strmap_put(&st->ns_queue, ns, x, &old)) {
        /* Nothing to keep (or no memory: the namespace reads as unannotated, unlabelled). */
        free(x);
        free(kgpu_strmap_del(&st->ns_queue, ns));
        return changed;
    }
    free(old);
    return changed;
}

int ext_queues_resolve(ext_state *st, const char *ns, const char *label, char *name, size_t len,
                       char *why, size_t whylen)
{
    kgpu_queue_ns n = ns_of(st, ns);
    snprintf(name, len, "%s", kgpu_queue_name_for(label, n.queue));
    if (st->queues == NULL)
        return -1;
    char w[512];
    int id = kgpu_queues_pick(st->queues, &n, label, w, sizeof(w));
    if (id >= 0)
        return id;
    snprintf(why, whylen, "kgpu: %s", w);
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
    ext__pod_demand(st->cluster, p, &d);
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
    ext__pod_demand(st->cluster, p, &d); /* the cluster is the one it was charged on */
    if (q >= 0 && kgpu_queues_uncharge(st->queues, q, &d, &err) != 0)
        ext_log(EXT_ERROR, "pod %s/%s: %s", p->ns, p->name, err.msg);
}

/* ---- DRA claims: charged at allocation ---- */

void ext_queues_charge_claim(ext_state *st, ext_dra_claim *c)
{
    if (st->queues == NULL || c->qcharged)
        return;
    kgpu_qdemand d;
    memset(&d, 0, sizeof(d));
    for (int i = 0; i < c->nres; i++)
        if (c->res[i].applied) /* else not on kgpu's inventory now: charged once it is */
            qd_add_assignment(st->cluster, &c->res[i].a, &d);
    if (d.milli == 0 && d.mem_mib == 0)
        return;
    /* The pod it is reserved for picks among its namespace's queues, as a GPU pod's label does. */
    const char *label = c->consumer[0] != '\0' ? kgpu_strmap_get(&st->pod_qlabels, c->consumer)
                                               : NULL;
    char why[512];
    bool refused;
    const char *q = charged_queue(st, c->ns, label, why, sizeof(why), &refused);
    int id = kgpu_queues_find(st->queues, q);
    kgpu_error err;
    if (id < 0 || kgpu_queues_charge_running(st->queues, id, &d, &err) != 0)
        return;
    snprintf(c->queue, sizeof(c->queue), "%s", q);
    c->qd = d;
    c->qcharged = true;
}

void ext_queues_uncharge_claim(ext_state *st, ext_dra_claim *c)
{
    if (!c->qcharged || st->queues == NULL)
        return;
    c->qcharged = false;
    kgpu_error err;
    int q = kgpu_queues_find(st->queues, c->queue);
    if (q >= 0 && kgpu_queues_uncharge(st->queues, q, &c->qd, &err) != 0)
        ext_log(EXT_ERROR, "ResourceClaim %s/%s: %s", c->ns, c->name, err.msg);
}

/* Charges the claims reserved for pod uid again: its label may pick another queue now. */
static void recharge_consumer(ext_state *st, const char *uid)
{
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->dra_claims, &it, &k, &v)) {
        ext_dra_claim *c = v;
        if (c->qcharged && strcmp(c->consumer, uid) == 0) {
            ext_queues_uncharge_claim(st, c);
            ext_queues_charge_claim(st, c);
        }
    }
}

void ext_queues_pod_label(ext_state *st, const char *uid, const char *label)
{
    const char *was = kgpu_strmap_get(&st->pod_qlabels, uid);
    if (was != NULL && strcmp(was, label) == 0)
        return;
    if (label[0] == '\0') {
        free(kgpu_strmap_del(&st->pod_qlabels, uid));
    } else {
        char *copy = strdup(label);
        void *old = NULL;
        if (copy == NULL || (was == NULL && st->pod_qlabels.len >= EXT_POD_QLABELS_MAX) ||
            !kgpu_strmap_put(&st->pod_qlabels, uid, copy, &old)) {
            free(copy); /* bounded: its claims go to its namespace's queue */
            free(kgpu_strmap_del(&st->pod_qlabels, uid));
        } else {
            free(old);
        }
    }
    if (st->dra_claims.len > 0)
        recharge_consumer(st, uid);
}

void ext_queues_pod_label_gone(ext_state *st, const char *uid)
{
    free(kgpu_strmap_del(&st->pod_qlabels, uid));
}

void ext_queues_pod_labels_reset(ext_state *st, const json_t *items)
{
    kgpu_strmap_clear_free(&st->pod_qlabels);
    size_t i;
    const json_t *pod;
    json_array_foreach(items, i, pod)
    {
        const char *uid =
            json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
        char label[KGPU_QUEUE_NAME_MAX + 1];
        int priority;
        ext_pod_queue_fields(pod, label, sizeof(label), &priority);
        char *copy = NULL;
        if (uid == NULL || label[0] == '\0' || st->pod_qlabels.len >= EXT_POD_QLABELS_MAX ||
            (copy = strdup(label)) == NULL)
            continue;
        void *old = NULL;
        if (!kgpu_strmap_put(&st->pod_qlabels, uid, copy, &old))
            free(copy);
        free(old);
    }
    ext_queues_recharge(st); /* claims listed before their pods pick their queues now */
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
        x->parent_row = qi.parent;
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
        char name[KGPU_QUEUE_NAME_MAX + 1], why[256];
        pending_on_path(st, r,
                        ext_queues_resolve(st, u->ns, u->label, name, sizeof(name), why, sizeof(why)));
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

/* Entries of namespace ns in the table. */
static intptr_t ns_count(ext_state *st, const char *ns)
{
    return (intptr_t)kgpu_strmap_get(&st->unsched_ns, ns);
}

static void ns_add(ext_state *st, const char *ns, intptr_t d)
{
    intptr_t n = ns_count(st, ns) + d;
    if (n <= 0)
        kgpu_strmap_del(&st->unsched_ns, ns);
    else
        kgpu_strmap_put(&st->unsched_ns, ns, (void *)n, NULL);
}

static void unsched_free(ext_unsched *u)
{
    free(u->globs);
    free(u);
}

void ext_unsched_drop(ext_state *st, const char *uid)
{
    ext_unsched *u = kgpu_strmap_del(&st->unsched, uid);
    if (u != NULL) {
        ns_add(st, u->ns, -1);
        unsched_free(u);
    }
}

void ext_unsched_clear(ext_state *st)
{
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->unsched, &it, &k, &v))
        unsched_free(v);
    kgpu_strmap_clear(&st->unsched);
    kgpu_strmap_init(&st->unsched);
    kgpu_strmap_clear(&st->unsched_ns);
    kgpu_strmap_init(&st->unsched_ns);
}

/*
 * The table is full and a pod of namespace ns is new: the namespace with
 * the most entries gives up its lowest-priority, most recent one, unless
 * ns would then have as many. So one tenant's flood (at most
 * EXT_UNSCHED_NS_MAX, and however many namespaces it has) shrinks toward
 * an equal share and never keeps another namespace's pods out. Whether room was made.
 */
static bool make_room(ext_state *st, const char *ns)
{
    const char *k, *big = NULL;
    void *v;
    size_t it = 0;
    intptr_t most = 0;
    while (kgpu_strmap_next(&st->unsched_ns, &it, &k, &v))
        if ((intptr_t)v > most)
            most = (intptr_t)v, big = k;
    if (big == NULL || ns_count(st, ns) + 1 >= most)
        return false;
    const ext_unsched *out = NULL;
    it = 0;
    while (kgpu_strmap_next(&st->unsched, &it, &k, &v)) {
        const ext_unsched *u = v;
        if (strcmp(u->ns, big) == 0 &&
            (out == NULL || u->priority < out->priority ||
             (u->priority == out->priority && u->since > out->since)))
            out = u;
    }
    if (out == NULL)
        return false;
    char uid[sizeof(out->uid)];
    snprintf(uid, sizeof(uid), "%s", out->uid);
    ext_unsched_drop(st, uid);
    return true;
}

/* u's fields from the pod: what the sweep reads, nothing else. false: out of memory. */
static bool unsched_fill(ext_unsched *u, const json_t *obj, const kgpu_pod *pod)
{
    ext_pod_queue_fields(obj, u->label, sizeof(u->label), &u->priority);
    snprintf(u->policy, sizeof(u->policy), "%s", pod->policy);
    u->nparts = pod->nparts;
    u->req = pod->parts[0].req;
    u->req.allow = u->req.exclude = NULL;
    u->req.nallow = u->req.nexclude = 0;
    free(u->globs);
    u->globs = NULL;
    u->nallow = pod->nallow;
    u->nexclude = pod->nexclude;
    int n = pod->nallow + pod->nexclude;
    if (n == 0)
        return true;
    if ((u->globs = calloc((size_t)n, sizeof(*u->globs))) == NULL)
        return false;
    for (int i = 0; i < n; i++)
        snprintf(u->globs[i], sizeof(u->globs[i]), "%s",
                 i < pod->nallow ? pod->allow[i] : pod->exclude[i - pod->nallow]);
    return true;
}

void ext_unsched_pod(const ext_unsched *u, kgpu_pod *pod)
{
    memset(pod, 0, sizeof(*pod));
    snprintf(pod->uid, sizeof(pod->uid), "%s", u->uid);
    snprintf(pod->ns, sizeof(pod->ns), "%s", u->ns);
    snprintf(pod->name, sizeof(pod->name), "%s", u->name);
    snprintf(pod->policy, sizeof(pod->policy), "%s", u->policy);
    pod->cpu_milli = u->req.cpu_milli;
    pod->memory_mib = u->req.memory_mib;
    pod->nallow = u->nallow;
    pod->nexclude = u->nexclude;
    for (int i = 0; i < u->nallow + u->nexclude; i++) {
        char *buf = i < u->nallow ? pod->allow_buf[i] : pod->exclude_buf[i - u->nallow];
        snprintf(buf, KGPU_GLOB_MAX, "%s", u->globs[i]);
        if (i < u->nallow)
            pod->allow[i] = buf;
        else
            pod->exclude[i - u->nallow] = buf;
    }
    pod->nparts = u->nparts > 0 ? 1 : 0; /* the sweep passes over the others */
    snprintf(pod->parts[0].container, sizeof(pod->parts[0].container), "main");
    pod->parts[0].req = u->req;
    pod->parts[0].req.allow = pod->allow;
    pod->parts[0].req.nallow = pod->nallow;
    pod->parts[0].req.exclude = pod->exclude;
    pod->parts[0].req.nexclude = pod->nexclude;
}

/*
 * Queues known to be off (GPUQueues listed, none in force): the sweep has
 * nothing to do, so nothing is kept. Before the first list the table
 * fills, so that pods seen first are not missed when queues come.
 */
static bool queues_off(const ext_state *st)
{
    return st->queues == NULL && (st->gpuqueues != NULL || st->gpuqueue_crd_absent);
}

void ext_unsched_seen(ext_state *st, const json_t *obj, const kgpu_pod *pod)
{
    const json_t *meta = json_object_get(obj, "metadata");
    bool waits = pod->node[0] == '\0' && !pod->terminal && pod->nparts > 0 &&
                 json_object_get(meta, "deletionTimestamp") == NULL && pod_unschedulable(obj);
    if (!waits || queues_off(st)) {
        ext_unsched_drop(st, pod->uid);
        return;
    }
    char ns[64];
    snprintf(ns, sizeof(ns), "%.63s", pod->ns);
    ext_unsched *u = kgpu_strmap_get(&st->unsched, pod->uid);
    if (u != NULL) {
        if (!unsched_fill(u, obj, pod))
            ext_unsched_drop(st, pod->uid);
        return;
    }
    /* Bounded: a pod left out still has its filter calls reclaim for it, if any come. */
    if (strlen(pod->uid) >= sizeof(u->uid) || ns_count(st, ns) >= EXT_UNSCHED_NS_MAX ||
        (st->unsched.len >= EXT_UNSCHED_MAX && !make_room(st, ns)) ||
        (u = calloc(1, sizeof(*u))) == NULL)
        return;
    u->since = ext_now();
    snprintf(u->uid, sizeof(u->uid), "%s", pod->uid);
    snprintf(u->ns, sizeof(u->ns), "%s", ns);
    snprintf(u->name, sizeof(u->name), "%s", pod->name);
    if (!unsched_fill(u, obj, pod) || !kgpu_strmap_put(&st->unsched, u->uid, u, NULL)) {
        unsched_free(u);
        return;
    }
    ns_add(st, u->ns, 1);
}
