/*
 * The pods holding GPUs: reserved by a bind in flight, or bound (as the API
 * server says); pods remembered from filter for their bind; bound pods kgpu
 * cannot honour yet (orphans), kept and retried; pods without kgpu GPUs,
 * for their CPU. Caller holds st->mu.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "state_impl.h"

_Static_assert(KGPU_MAX_PARTS <= KGPU_PLACE_MAX_REQS,
               "a pod's GPU containers must fit in one placement search");

/* Applies req with its CPU and memory clamped to what node idx has free (see ext_fit_requests). */
int ext__apply_clamped(kgpu_cluster *c, const kgpu_request *req, int idx, const int *gpus,
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

/* ---- pods remembered from filter ---- */

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
        ext__observe(st, &copy->pod);
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
    ext__usage_hold(st, p);
}

static void unhold(ext_state *st, ext_pod *p)
{
    for (int i = p->nparts - 1; i >= 0; i--) {
        kgpu_error err;
        if (kgpu_cluster_release(st->cluster, &p->part[i].a, &err) != 0)
            ext_log(EXT_ERROR, "release of %s/%s failed: %s", p->ns, p->name, err.msg);
    }
    ext_queues_uncharge(st, p);
    ext__usage_unhold(st, p);
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
    p->gen = ++st->next_gen;
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
    ext_state_doubt_end(st, p, EXT_DOUBT_RELEASED); /* whatever ends it now, it cannot land */
    unhold(st, p);
    free(p);
}

/* Binds in doubt (doubt.c) whose time ran out: their GPUs are free again. */
void ext_doubts_expire(ext_state *st)
{
    double now = ext_now();
    if (st->doubts == 0 || now < st->doubt_next)
        return; /* filter and bind call this: no scan of every pod before a doubt is due */
    size_t it = 0, n = 0;
    const char *k;
    void *v;
    char(*late)[64] = calloc(st->doubts, sizeof(*late));
    double next = HUGE_VAL;
    while (late != NULL && kgpu_strmap_next(&st->pods, &it, &k, &v)) {
        const ext_pod *p = v;
        if (p->doubt_until > 0 && now >= p->doubt_until && n < st->doubts)
            snprintf(late[n++], sizeof(late[0]), "%s", p->uid);
        else if (p->doubt_until > 0 && p->doubt_until < next)
            next = p->doubt_until;
    }
    if (late != NULL)
        st->doubt_next = next;
    for (size_t i = 0; i < n; i++) {
        ext_pod *p = kgpu_strmap_get(&st->pods, late[i]);
        ext_log(EXT_WARN,
                "pod %s/%s: its Binding to %s got no answer, and the API server has not shown "
                "it applied in %d s (--bind-doubt): its GPUs there are free again",
                p->ns, p->name, p->node, st->cfg->bind_doubt_s);
        ext_state_doubt_end(st, p, EXT_DOUBT_EXPIRED);
        ext_state_release(st, late[i]);
    }
    free(late);
}

ext_pod *ext_state_own(ext_state *st, const char *uid, unsigned long long gen)
{
    ext_pod *p = kgpu_strmap_get(&st->pods, uid);
    return p != NULL && p->gen == gen ? p : NULL;
}

/* ---- pods without kgpu GPUs: their CPU and memory ---- */

/* Takes p's CPU and memory from its node in c (clamped to what is free). false: no such node. */
bool ext__cpu_take(kgpu_cluster *c, ext_cpu_pod *p)
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
    return ext__apply_clamped(c, &r, idx, NULL, &p->a, NULL) == 0;
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
    if (!ext__cpu_take(st->cluster, p) || !kgpu_strmap_put(&st->cpu_pods, pod->uid, p, NULL)) {
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
int ext__gpu_position(const kgpu_node *n, int index, const char *uuid)
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
void ext__keep_orphan(ext_state *st, const char *uid, const char *ns, const char *name,
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
    p->gen = ++st->next_gen;
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
            pos[g] = ext__gpu_position(node, ap->gpus[g].index, ap->gpus[g].uuid);
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
        if (why == NULL && ext__apply_clamped(st->cluster, &r, idx, pos, &p->part[i].a, &err) != 0) {
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

/*
 * Whether reservation p is what a bound pod's assignment records: the same
 * node, and part by part the same GPUs with the same amounts (a Binding of
 * kgpu's carries the assignment it reserved).
 */
static bool held_as_recorded(const ext_state *st, const ext_pod *p, const char *nodename,
                             const kgpu_assigned_part *parts, int n)
{
    if (strcmp(p->node, nodename) != 0 || p->nparts != n)
        return false;
    const kgpu_node *node =
        kgpu_cluster_node(st->cluster, kgpu_cluster_find_node(st->cluster, nodename));
    if (node == NULL)
        return false;
    for (int i = 0; i < n; i++) {
        const kgpu_assignment *a = &p->part[i].a;
        const kgpu_assigned_part *ap = &parts[i];
        if (a->ngpus != ap->ngpus || a->exclusive != ap->exclusive)
            return false;
        for (int g = 0; g < ap->ngpus; g++) {
            if (ext__gpu_position(node, ap->gpus[g].index, ap->gpus[g].uuid) != a->gpus[g])
                return false;
            if (!a->exclusive && (ap->gpus[g].milli != a->gpu_milli ||
                                  ap->gpus[g].memory_mib != a->gpu_memory_mib))
                return false;
        }
    }
    return true;
}

/* Tries every orphan again: after inventory changes and after pods leave. */
void ext__retry_orphans(ext_state *st)
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
    if (held != NULL)
        held->restartable = pod.restartable; /* its owner may change its mind */
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
    if (held != NULL && held->status == POD_BOUND)
        return;
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
    if (held != NULL) { /* reserved: a bind in flight, or in doubt */
        if (held_as_recorded(st, held, pod.node, parts, n)) {
            ext_state_doubt_end(st, held, EXT_DOUBT_LANDED);
            held->status = POD_BOUND; /* our Binding, applied */
            free(parts);
            return;
        }
        /* Bound by another Binding: the one these GPUs were held for cannot be applied now. */
        ext_log(EXT_WARN,
                "pod %s/%s: bound to %s by another Binding than kgpu's; the GPUs kgpu held "
                "for it on %s are released",
                pod.ns, pod.name, pod.node, held->node);
        ext_state_release(st, pod.uid);
        held = NULL;
    }
    if (kgpu_assignment_within(&pod, parts, n, &err) != 0) {
        /* Not written by kgpu's bind (the admission policy keeps tenants from writing it):
         * counting it as written would give the pod GPUs it never asked for, and charge
         * them to whatever queue it names. Its CPU still counts; the device plugin
         * refuses the same assignment at Allocate. */
        atomic_fetch_add(&st->metrics->assignments_refused, 1);
        ext_log(EXT_ERROR, "pod %s/%s: %s annotation refused: %s", pod.ns, pod.name,
                KGPU_ANN_ASSIGNMENT, err.msg);
        free(parts);
        cpu_pod_seen(st, &pod);
        return;
    }
    if (kgpu_strmap_get(&st->pending, pod.uid) == NULL &&
        kgpu_strmap_get(&st->orphans, pod.uid) == NULL) {
        ext_state_compile(st, &pod, &err);
        ext__observe(st, &pod);
    }
    if (kgpu_strmap_get(&st->orphans, pod.uid) == NULL) {
        bool conflict;
        char label[KGPU_QUEUE_NAME_MAX + 1];
        int priority;
        ext_pod_queue_fields(json, label, sizeof(label), &priority);
        const char *why = try_adopt(st, pod.uid, pod.ns, pod.name, pod.node, parts, n,
                                    pod.cpu_milli, pod.memory_mib, label, priority, &conflict);
        ext_pod *adopted = why == NULL ? kgpu_strmap_get(&st->pods, pod.uid) : NULL;
        if (adopted != NULL)
            adopted->restartable = pod.restartable;
        if (why != NULL) {
            if (conflict)
                atomic_fetch_add(&st->metrics->assignment_conflicts, 1);
            ext__keep_orphan(st, pod.uid, pod.ns, pod.name, pod.node, parts, n, pod.cpu_milli,
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
        ext__retry_orphans(st); /* what this pod held may be what an orphan was waiting for */
}

/* Appends an owned string to a growing list; on failure the string is freed. */
void ext__push_owned(char ***list, size_t *n, char *str)
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
        ext__push_owned(list, n, key);
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
        /* In doubt: gone like a bound pod (its Binding cannot land on a deleted pod). */
        if ((p->status != POD_BOUND && p->doubt_until <= 0) || kgpu_strmap_get(&present, k) != NULL)
            continue;
        if (p->since >= st->relist_started) {
            /* Bound after the relist was asked for: the snapshot may predate the binding. */
            suspect(suspects, nsuspects, p->ns, p->name, p->uid);
            continue;
        }
        ext__push_owned(&gone, &ngone, strdup(k));
    }
    it = 0;
    while (kgpu_strmap_next(&st->cpu_pods, &it, &k, &v))
        if (kgpu_strmap_get(&present, k) == NULL)
            ext__push_owned(&gone, &ngone, strdup(k));
    it = 0;
    while (kgpu_strmap_next(&st->orphans, &it, &k, &v)) {
        const ext_orphan *o = v;
        if (kgpu_strmap_get(&present, k) != NULL)
            continue;
        if (o->since >= st->relist_started) {
            suspect(suspects, nsuspects, o->ns, o->name, o->uid);
            continue;
        }
        ext__push_owned(&gone, &ngone, strdup(k));
    }
    for (size_t j = 0; j < ngone; j++) {
        cpu_pod_gone(st, gone[j]);
        ext_state_release(st, gone[j]);
        drop_orphan(st, gone[j]);
        free(gone[j]);
    }
    free(gone);
    if (ngone > 0)
        ext__retry_orphans(st);
    ext_await_relisted(st, &present);
    kgpu_strmap_clear(&present);
    ext_unsched_clear(st); /* the list shows those still waiting */
    json_array_foreach(items, i, item) ext_state_pod_seen(st, item);
}
