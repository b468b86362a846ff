/*
 * The bind verb: GPUs reserved under the lock within the search filter
 * asked, the Binding with the assignment annotations posted without it,
 * then the reservation confirmed or released.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "request.h"

static void bind_result(ext_response *r, const char *error)
{
    ext_reply_json(r, 200, json_pack("{s:s}", "Error", error));
}

static void bind_failed(ext_ctx *d, ext_response *r, enum ext_bind_fail why, const char *msg)
{
    atomic_fetch_add(&d->metrics->bind_failures[why], 1);
    ext_log(EXT_WARN, "bind failed (%s): %s", ext_bind_fail_name(why), msg);
    bind_result(r, msg);
}

/*
 * The pod for a bind, and its asks: remembered from filter, else asked of the
 * API server. NULL with msg and *fail saying why.
 */
static kgpu_pod *bind_pod(ext_ctx *d, const char *ns, const char *name, const char *uid,
                          ext_asks *asks, char *qlabel, size_t qlen, int *priority, char *msg,
                          size_t len, enum ext_bind_fail *fail)
{
    qlabel[0] = '\0';
    *priority = 0;
    *fail = BIND_FAIL_UNKNOWN_POD;
    kgpu_pod *pod = malloc(sizeof(*pod));
    if (pod == NULL)
        return NULL;
    pthread_mutex_lock(&d->state->mu);
    const ext_filtered *known = ext_state_recall(d->state, uid);
    if (known != NULL) {
        ext_pod_copy(pod, &known->pod);
        *asks = known->asks;
        snprintf(qlabel, qlen, "%s", known->queue_label);
        *priority = known->priority;
    }
    pthread_mutex_unlock(&d->state->mu);
    if (known != NULL && (strcmp(pod->ns, ns) != 0 || strcmp(pod->name, name) != 0)) {
        /* A uid names one pod for its life: kube-scheduler binds the pod it filtered. */
        *fail = BIND_FAIL_BAD_REQUEST;
        char as[KGPU_NAME_MAX + 70];
        ext_pod_for_viewer(pod->ns, pod->name, ns, "pod ", as, sizeof(as));
        snprintf(msg, len,
                 "pod %s/%s (uid %s): that uid was filtered as %s; refused to bind it under "
                 "another name",
                 ns, name, uid, as);
        free(pod);
        return NULL;
    }
    if (known != NULL)
        return pod;
    if (d->k8s != NULL) {
        kgpu_error err;
        kgpu_error_clear(&err);
        long status = 0;
        json_t *j = kgpu_k8s_get_pod(d->k8s, ns, name, &status, &err);
        if (status == 200) {
            int rc = j ? kgpu_pod_from_json(j, d->cfg->memory_unit_mib, pod, &err) : -1;
            const char *juid =
                json_string_value(json_object_get(json_object_get(j, "metadata"), "uid"));
            bool same = juid != NULL && strcmp(juid, uid) == 0;
            ext_asks_from_json(j, asks);
            ext_pod_queue_fields(j, qlabel, qlen, priority);
            json_decref(j);
            if (rc == 0 && strcmp(pod->uid, uid) == 0)
                return pod;
            if (rc != 0 && same) { /* the pod, but a request kgpu cannot honour */
                *fail = BIND_FAIL_BAD_REQUEST;
                snprintf(msg, len, "pod %s/%s: kgpu: %s", ns, name, err.msg);
            } else {
                snprintf(msg, len,
                         "pod %s/%s: the API server has another pod of that name (uid %s)", ns,
                         name, rc == 0 ? pod->uid : "unreadable");
            }
            free(pod);
            return NULL;
        }
        json_decref(j);
        if (status == 404)
            snprintf(msg, len,
                     "pod %s/%s (uid %s) is unknown to kgpu: the API server has no such pod", ns,
                     name, uid);
        else if (status > 0)
            snprintf(msg, len,
                     "pod %s/%s (uid %s) is unknown to kgpu, and the API server answered "
                     "%ld when asked for it",
                     ns, name, uid, status);
        else
            snprintf(msg, len,
                     "pod %s/%s (uid %s) is unknown to kgpu, and the API server could "
                     "not be asked for it: %s",
                     ns, name, uid, err.msg);
        free(pod);
        return NULL;
    }
    snprintf(msg, len,
             "pod %s/%s (uid %s) is unknown to kgpu: kube-scheduler calls filter before bind, "
             "and without an API server to ask kgpu knows only the last %d pods filtered; was "
             "the extender restarted, or were more pods filtered, in between?",
             ns, name, uid, d->cfg->pending_pods_max);
    free(pod);
    return NULL;
}

/*
 * POSTs the Binding (with `ann`, or none for a pod without GPUs). Returns
 * BIND_FAIL_COUNT when the API server accepted it, else the reason, with
 * msg saying what the API server answered.
 */
static enum ext_bind_fail post_binding(ext_ctx *d, const char *ns, const char *name,
                                       const char *uid, const char *node, json_t *ann, char *msg,
                                       size_t len, bool *maybe_applied)
{
    kgpu_error err;
    kgpu_http_resp resp = {0};
    enum ext_bind_fail why = BIND_FAIL_COUNT;
    *maybe_applied = false;
    if (kgpu_k8s_bind(d->k8s, ns, name, uid, node, ann, &resp, &err) != 0) {
        why = BIND_FAIL_API_UNREACHABLE;
        *maybe_applied = !resp.unsent; /* a timeout or a broken connection, after it went out */
        snprintf(msg, len, "binding %s/%s to %s: %s", ns, name, node, err.msg);
    } else if (resp.status != 200 && resp.status != 201) {
        /* A 5xx says nothing of whether the handler went on (a 504 of the timeout filter). */
        *maybe_applied = resp.status >= 500;
        why = resp.status == 409 ? BIND_FAIL_API_CONFLICT : BIND_FAIL_API_ERROR;
        json_t *st = resp.body ? json_loads(resp.body, 0, NULL) : NULL;
        const char *m = json_string_value(json_object_get(st, "message"));
        snprintf(msg, len, "binding %s/%s to %s: API server answered %ld: %.600s", ns, name, node,
                 resp.status, m ? m : (resp.body ? resp.body : ""));
        json_decref(st);
    }
    free(resp.body);
    return why;
}

/* What the API server shows of a Binding whose answer was lost. */
enum landing {
    LAND_NOT_ASKED,
    LAND_APPLIED,   /* the pod is bound to the node with the assignment sent */
    LAND_NOT_YET,   /* the pod is not bound (or could not be read): it may still be */
    LAND_ELSEWHERE, /* gone, replaced, being deleted, or bound by another Binding */
};

/* GETs the pod: was the Binding to `node` with `assignment` applied? */
static enum landing find_binding(ext_ctx *d, const char *ns, const char *name, const char *uid,
                                 const char *node, const char *assignment)
{
    kgpu_error err;
    long status = 0;
    json_t *j = kgpu_k8s_get_pod(d->k8s, ns, name, &status, &err);
    if (status == 404)
        return LAND_ELSEWHERE;
    json_t *meta = json_object_get(j, "metadata");
    const char *juid = json_string_value(json_object_get(meta, "uid"));
    const char *on =
        json_string_value(json_object_get(json_object_get(j, "spec"), "nodeName"));
    const char *ann = json_string_value(
        json_object_get(json_object_get(meta, "annotations"), KGPU_ANN_ASSIGNMENT));
    enum landing l;
    if (j == NULL) /* not read: it may still be */
        l = LAND_NOT_YET;
    else if (juid == NULL || strcmp(juid, uid) != 0 ||
             json_object_get(meta, "deletionTimestamp") != NULL)
        l = LAND_ELSEWHERE;
    else if (on == NULL || on[0] == '\0')
        l = LAND_NOT_YET;
    else if (strcmp(on, node) == 0 && ann != NULL && strcmp(ann, assignment) == 0)
        l = LAND_APPLIED;
    else
        l = LAND_ELSEWHERE;
    json_decref(j);
    return l;
}

/*
 * Whether s is a DNS subdomain (RFC 1123: lowercase letters, digits, '-'
 * and '.', alphanumeric at both ends), as every pod name and namespace is.
 * Bind puts them in API paths: nothing else may get there.
 */
static bool dns_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > KGPU_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && ((c != '-' && c != '.') || i == 0 || i == n - 1))
            return false;
    }
    return true;
}

/*
 * Whether binding `pod` to `node` would take room a reclaim freed for
 * another pod (reclaim_state.c "Holds"), asked before its reservation, or
 * `after` it (the holds must still fit with what it was given):
 * KGPU_ENOFIT with the reason in err, or 0. Caller holds st->mu.
 */
static int held_for_another(ext_state *st, const kgpu_pod *pod, const char *node, bool after,
                            kgpu_error *err)
{
    if (!after)
        ext_reclaims_refresh(st);
    int idx = st->reclaims.len > 0 ? kgpu_cluster_find_node(st->cluster, node) : -1;
    if (idx < 0)
        return 0;
    kgpu_request fitreq[KGPU_MAX_PARTS];
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    ext_fit_requests(pod, fitreq, reqs);
    const ext_reclaim *h = ext_reclaim_hold_taken(st, idx, pod->uid, reqs, after ? 0 : pod->nparts);
    if (h == NULL)
        return 0;
    char why[REASON_MAX];
    ext_reclaim_hold_reason(h, pod->ns, why, sizeof(why));
    return kgpu_error_set(err, KGPU_ENOFIT, "%s", why);
}

void ext_verb_bind(ext_ctx *d, json_t *args, ext_response *r)
{
    const char *name = json_string_value(json_object_get(args, "PodName"));
    const char *ns = json_string_value(json_object_get(args, "PodNamespace"));
    const char *uid = json_string_value(json_object_get(args, "PodUID"));
    const char *node = json_string_value(json_object_get(args, "Node"));
    char msg[1024];
    if (name == NULL || ns == NULL || uid == NULL || node == NULL || !name[0] || !uid[0] ||
        !node[0] || strlen(name) > KGPU_NAME_MAX || strlen(ns) > KGPU_NAME_MAX ||
        strlen(node) > KGPU_NAME_MAX || strlen(uid) >= 64) {
        atomic_fetch_add(&d->metrics->bind_failures[BIND_FAIL_BAD_REQUEST], 1);
        ext_bad_request(d, r, VERB_BIND,
                    "ExtenderBindingArgs needs string fields PodName, PodNamespace, PodUID and "
                    "Node");
        return;
    }
    if (!dns_name(name) || !dns_name(ns)) {
        atomic_fetch_add(&d->metrics->bind_failures[BIND_FAIL_BAD_REQUEST], 1);
        ext_bad_request(d, r, VERB_BIND,
                    "PodName and PodNamespace must be DNS names (lowercase letters, digits, "
                    "'-' and '.'), as every pod's are");
        return;
    }
    if (!ext_ctx_leads(d)) {
        atomic_fetch_add(&d->metrics->bind_failures[BIND_FAIL_STANDBY], 1);
        snprintf(msg, sizeof(msg),
                 "this kgpu-extender replica (%s) is a standby: only the holder of lease %s/%s "
                 "binds; kube-scheduler should reach it through the Service",
                 d->identity, d->cfg->lease_ns, d->cfg->lease_name);
        bind_result(r, msg);
        return;
    }
    ext_asks asks;
    enum ext_bind_fail fail;
    char qlabel[KGPU_QUEUE_NAME_MAX + 1], qname[KGPU_QUEUE_NAME_MAX + 1], qwhy[REASON_MAX];
    int priority;
    kgpu_pod *pod = bind_pod(d, ns, name, uid, &asks, qlabel, sizeof(qlabel), &priority, msg,
                             sizeof(msg), &fail);
    if (pod == NULL) {
        if (fail == BIND_FAIL_BAD_REQUEST)
            atomic_fetch_add(&d->metrics->invalid_pods[VERB_BIND], 1);
        bind_failed(d, r, fail, msg);
        return;
    }
    if (pod->nparts == 0) { /* asks for no GPU (e.g. kgpu.io/gpu-mem: 0): bind, hold nothing */
        free(pod);
        bool maybe;
        enum ext_bind_fail why = d->k8s ? post_binding(d, ns, name, uid, node, NULL, msg,
                                                       sizeof(msg), &maybe)
                                        : BIND_FAIL_COUNT;
        if (why != BIND_FAIL_COUNT)
            bind_failed(d, r, why, msg);
        else
            bind_result(r, "");
        return;
    }
    const ext_pod *held = NULL;
    char held_node[KGPU_NAME_MAX + 1] = "", held_ns[64] = "", held_name[KGPU_NAME_MAX + 1] = "";
    bool held_bound = false;
    kgpu_error err;
    kgpu_error_clear(&err);
    char *assignment = NULL;
    char waiting[REASON_MAX] = "", indoubt[REASON_MAX] = "";
    unsigned long long gen = 0;
    double retry_of = 0; /* > 0: this bind retries a Binding in doubt (doubt.c) that ran until then */
    pthread_mutex_lock(&d->state->mu);
    int rc = ext_state_compile(d->state, pod, &err);
    ext_doubts_expire(d->state);
    ext_pod *doubt = rc == 0 ? ext_state_doubt_of(d->state, uid) : NULL;
    if (doubt != NULL && strcmp(doubt->node, node) != 0) {
        ext_doubt_reason(d->state, doubt, indoubt, sizeof(indoubt));
        rc = kgpu_error_set(&err, KGPU_ESTATE, "%s", indoubt);
    } else if (doubt != NULL) { /* on its node: this Binding carries the same GPUs */
        retry_of = doubt->doubt_until;
        ext_state_doubt_end(d->state, doubt, EXT_DOUBT_RETRIED);
        held = doubt;
    }
    if (rc == 0 && retry_of == 0 && kgpu_strmap_get(&d->state->pods, uid) == NULL &&
        d->state->awaiting.len > 0) {
        /* Filter let it through, but another bind of the same size may have come first. */
        ext_await_expire(d->state);
        ext_ask same;
        const ext_await *w = ext_await_clash(d->state, node, uid, &asks, &same);
        if (w != NULL) {
            ext_await_reason(w, &same, ns, waiting, sizeof(waiting));
            rc = kgpu_error_set(&err, KGPU_ESTATE, "%s", waiting);
        }
    }
    if (rc == 0 && retry_of == 0 &&
        ext_queues_resolve(d->state, ns, qlabel, qname, sizeof(qname), qwhy, sizeof(qwhy)) == -2)
        rc = kgpu_error_set(&err, KGPU_ENOFIT, "%s", qwhy);
    bool fresh = rc == 0 && retry_of == 0 && kgpu_strmap_get(&d->state->pods, uid) == NULL;
    const char *leaving = fresh ? ext_node_closed(d->state, node) : NULL;
    if (leaving != NULL) /* it started to leave after filter let the pod through */
        rc = kgpu_error_set(&err, KGPU_ENOFIT,
                            "node %s is leaving (%s): kgpu places no new GPU pod there", node,
                            leaving);
    else if (fresh)
        rc = held_for_another(d->state, pod, node, false, &err);
    if (rc == 0 && retry_of == 0)
        rc = ext_state_reserve(d->state, pod, node, qlabel, priority, &held, &err);
    if (rc == 0 && fresh && held_for_another(d->state, pod, node, true, &err) != 0) {
        /* The GPUs the policy chose were the ones held: the room stays the waiting pod's. */
        ext_state_release(d->state, uid);
        held = NULL;
        rc = KGPU_ENOFIT;
    }
    if (rc == 0) {
        ext_filtered *f = kgpu_strmap_get(&d->state->pending, uid);
        if (f != NULL)
            f->waiting = EXT_WAIT_NONE;
    }
    if (held != NULL) { /* copied while the lock makes it safe to read */
        snprintf(held_node, sizeof(held_node), "%s", held->node);
        snprintf(held_ns, sizeof(held_ns), "%s", held->ns);
        snprintf(held_name, sizeof(held_name), "%s", held->name);
        held_bound = held->status == POD_BOUND;
        gen = held->gen;
    }
    if (rc == 0) {
        const kgpu_node *n =
            kgpu_cluster_node(d->state->cluster, kgpu_cluster_find_node(d->state->cluster, node));
        kgpu_assignment a[KGPU_MAX_PARTS];
        for (int i = 0; i < held->nparts && i < KGPU_MAX_PARTS; i++)
            a[i] = held->part[i].a;
        assignment = kgpu_assignment_format(n, pod->parts, a, held->nparts);
        if (assignment == NULL) {
            ext_state_release(d->state, uid);
            rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
        } else {
            /* From now on, same-size pods stay off this node until kubelet allocates this one. */
            ext_await_record(d->state, uid, ns, name, node, &asks, 0);
        }
    }
    pthread_mutex_unlock(&d->state->mu);
    if (indoubt[0] != '\0') {
        free(pod);
        snprintf(msg, sizeof(msg), "binding %s/%s to %s: %s", ns, name, node, indoubt);
        bind_failed(d, r, BIND_FAIL_IN_DOUBT, msg);
        return;
    }
    if (waiting[0] != '\0') {
        free(pod);
        snprintf(msg, sizeof(msg), "binding %s/%s to %s: %s", ns, name, node, waiting);
        bind_failed(d, r, BIND_FAIL_AWAITING, msg);
        return;
    }
    if (rc == KGPU_EEXIST) {
        free(pod);
        if (strcmp(held_ns, ns) != 0 || strcmp(held_name, name) != 0) {
            char as[KGPU_NAME_MAX + 70];
            ext_pod_for_viewer(held_ns, held_name, ns, "pod ", as, sizeof(as));
            snprintf(msg, sizeof(msg),
                     "pod %s/%s (uid %s): that uid holds GPUs as %s; refused to bind it under "
                     "another name",
                     ns, name, uid, as);
            bind_failed(d, r, BIND_FAIL_BAD_REQUEST, msg);
            return;
        }
        if (strcmp(held_node, node) == 0 && held_bound) {
            bind_result(r, ""); /* a retry of a bind that went through */
            return;
        }
        snprintf(msg, sizeof(msg), "pod %s/%s: %s%s", ns, name, err.msg,
                 held_bound ? "" : " (a bind is in flight)");
        bind_failed(d, r, BIND_FAIL_API_CONFLICT, msg);
        return;
    }
    if (rc != 0) {
        free(pod);
        snprintf(msg, sizeof(msg), "binding %s/%s to %s: %s", ns, name, node, err.msg);
        bind_failed(d, r,
                    rc == KGPU_ENOENT   ? BIND_FAIL_UNKNOWN_NODE
                    : rc == KGPU_EINVAL ? BIND_FAIL_BAD_REQUEST
                                        : BIND_FAIL_NO_FIT,
                    msg);
        return;
    }
    if (d->k8s == NULL) { /* cluster-file mode: the binding lives in memory */
        pthread_mutex_lock(&d->state->mu);
        ext_state_confirm(d->state, uid);
        pthread_mutex_unlock(&d->state->mu);
        ext_log(EXT_INFO, "bound %s/%s to %s: %s", ns, name, node, assignment);
        free(assignment);
        free(pod);
        bind_result(r, "");
        return;
    }
    char when[64];
    kgpu_rfc3339_now(when, sizeof(when));
    json_t *ann = json_pack("{s:s,s:s,s:s}", KGPU_ANN_ASSIGNMENT, assignment, KGPU_ANN_NODE, node,
                            KGPU_ANN_BIND_TIME, when);
    bool maybe_applied;
    enum ext_bind_fail why =
        post_binding(d, ns, name, uid, node, ann, msg, sizeof(msg), &maybe_applied);
    json_decref(ann);
    /*
     * No usable answer, or a conflict when an earlier Binding of ours is in
     * doubt: ask the API server what became of it before the GPUs go.
     */
    enum landing land = LAND_NOT_ASKED;
    if (why != BIND_FAIL_COUNT &&
        (maybe_applied || (why == BIND_FAIL_API_CONFLICT && retry_of > 0)))
        land = find_binding(d, ns, name, uid, node, assignment);
    char kept[REASON_MAX] = "";
    pthread_mutex_lock(&d->state->mu);
    /* Only our own reservation: the watch may have settled it meanwhile (pods.c). */
    ext_pod *mine = ext_state_own(d->state, uid, gen);
    double now = ext_now();
    /* The watch showed the pod bound with these very GPUs (pods.c): our Binding was applied. */
    if (why != BIND_FAIL_COUNT && mine != NULL && mine->status == POD_BOUND)
        land = LAND_APPLIED;
    if (why == BIND_FAIL_COUNT || land == LAND_APPLIED) {
        if (mine != NULL)
            ext_state_confirm(d->state, uid);
        if (land == LAND_APPLIED)
            atomic_fetch_add(&d->metrics->doubts_ended[EXT_DOUBT_LANDED], 1);
        else if (retry_of > 0) /* the earlier Binding cannot be applied after this one */
            atomic_fetch_add(&d->metrics->doubts_ended[EXT_DOUBT_RELEASED], 1);
    } else if (mine != NULL && land != LAND_ELSEWHERE &&
               ((maybe_applied && land == LAND_NOT_YET) || retry_of > now)) {
        /* This Binding, or the earlier one it retried, may still be applied: keep the GPUs. */
        double until = maybe_applied ? now + d->cfg->bind_doubt_s : retry_of;
        until = until > retry_of ? until : retry_of;
        ext_state_doubt(d->state, mine, until);
        snprintf(kept, sizeof(kept),
                 "the API server may still apply it: its GPUs stay held on %s until the API "
                 "server shows the pod, for at most %.0f s (--bind-doubt)",
                 node, until - now);
    } else if (mine != NULL) {
        if (retry_of > 0) /* its doubt ended at the retry; count how it really ended */
            atomic_fetch_add(&d->metrics->doubts_ended[land == LAND_ELSEWHERE
                                                           ? EXT_DOUBT_RELEASED
                                                           : EXT_DOUBT_EXPIRED],
                             1);
        ext_state_release(d->state, uid); /* nothing leaks when the API server says no */
    }
    pthread_mutex_unlock(&d->state->mu);
    free(pod);
    if (why != BIND_FAIL_COUNT && land != LAND_APPLIED) {
        free(assignment);
        if (kept[0] != '\0') {
            char full[sizeof(msg)];
            snprintf(full, sizeof(full), "%.600s; %s", msg, kept);
            snprintf(msg, sizeof(msg), "%s", full);
        }
        bind_failed(d, r, why, msg);
        return;
    }
    if (land == LAND_APPLIED)
        ext_log(EXT_WARN,
                "bound %s/%s to %s: %s (the API server applied the Binding though its answer "
                "was lost: %s)",
                ns, name, node, assignment, msg);
    else
        ext_log(EXT_INFO, "bound %s/%s to %s: %s", ns, name, node, assignment);
    free(assignment);
    bind_result(r, "");
}
