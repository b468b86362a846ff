/*
 * GPU queues in cluster mode (docs/queues.md "Cluster mode"): the tree
 * comes from GPUQueue objects (kgpu.io/v1alpha1, cluster-scoped, the
 * queue's name being the object's), namespaces' queues from their
 * kgpu.io/queue annotation, both listed and watched with the reflector;
 * and the leader writes each GPUQueue's status (use, borrowing, pods,
 * pending, a Valid condition) through the /status subresource.
 *
 * The objects are kept cut down to what the tree is made of; every change
 * of a spec rebuilds the whole tree with the file's reader
 * (kgpu_queues_from_json), so the CRD and the file accept exactly the same
 * things. An invalid set leaves the last valid tree in force. Status is
 * written only when it differs from what the object holds, at most once
 * per STATUS_INTERVAL_MS per queue.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "ext.h"
#include "queuefile.h"

#define GPUQUEUES          "/apis/kgpu.io/v1alpha1/gpuqueues"
#define STATUS_INTERVAL_MS 2000
#define STATUS_MAX         (2 * KGPU_QUEUE_MAX) /* statuses remembered as written */

/* ---- GPUQueue objects ---- */

static const char *obj_name(const json_t *obj)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
}

/* What is kept of a GPUQueue: metadata.name and .generation, spec, status. */
static void gpuqueue_trim(void *ctx, json_t *obj)
{
    (void)ctx;
    const char *key;
    void *tmp;
    json_t *v;
    json_object_foreach_safe(obj, tmp, key, v)
    {
        if (strcmp(key, "metadata") != 0 && strcmp(key, "spec") != 0 &&
            strcmp(key, "status") != 0)
            json_object_del(obj, key);
    }
    json_t *meta = json_object_get(obj, "metadata");
    json_object_foreach_safe(meta, tmp, key, v)
    {
        if (strcmp(key, "name") != 0 && strcmp(key, "generation") != 0)
            json_object_del(meta, key);
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * Builds the tree from st->gpuqueues and puts it in force, or keeps the
 * last valid one and says why in st->queues_error. No objects: queues off.
 * Caller holds st->mu.
 */
static void rebuild(ext_state *st)
{
    size_t n = json_object_size(st->gpuqueues), k = 0;
    if (n == 0) {
        if (st->queues_spec != NULL)
            ext_log(EXT_INFO, "queues: no GPUQueue objects: every pod is in queue default");
        st->queues_error[0] = '\0';
        ext_queues_set(st, NULL);
        return;
    }
    /* By name, so that the same objects always give the same tree and the same errors. */
    const char **names = calloc(n, sizeof(*names));
    json_t *list = json_array();
    const char *key;
    json_t *obj;
    json_object_foreach(st->gpuqueues, key, obj)
    {
        if (names != NULL && k < n)
            names[k++] = key;
    }
    if (names != NULL)
        qsort(names, k, sizeof(*names), cmp_str);
    for (size_t i = 0; names != NULL && list != NULL && i < k; i++) {
        json_t *spec = json_object_get(json_object_get(st->gpuqueues, names[i]), "spec");
        json_t *entry = json_is_object(spec) ? json_deep_copy(spec) : json_object();
        json_object_set_new(entry, "name", json_string(names[i]));
        json_array_append_new(list, entry);
    }
    json_t *doc = json_pack("{s:o}", "queues", list);
    free(names);
    kgpu_queues *tree = NULL;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = doc != NULL ? kgpu_queues_from_json(doc, "GPUQueue objects", &tree, &err)
                         : kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    json_decref(doc);
    if (rc != 0) {
        if (strcmp(st->queues_error, err.msg) != 0)
            ext_log(EXT_WARN, "queues: %s; the last valid set of queues (%d) stays in force",
                    err.msg, st->queues != NULL ? kgpu_queues_count(st->queues) : 0);
        snprintf(st->queues_error, sizeof(st->queues_error), "%s", err.msg);
        return;
    }
    if (st->queues_error[0] != '\0')
        ext_log(EXT_INFO, "queues: the GPUQueue objects are valid again");
    st->queues_error[0] = '\0';
    ext_log(EXT_INFO, "queues: %zu GPUQueue objects in force (%d queues with default)", k,
            kgpu_queues_count(tree));
    ext_queues_set(st, tree);
}

/* Takes one object in (or out: obj NULL); true when the tree must be rebuilt. */
static bool gpuqueue_put(ext_state *st, const char *name, json_t *obj)
{
    json_t *old = json_object_get(st->gpuqueues, name);
    if (obj == NULL) {
        json_object_del(st->gpuqueues, name);
        return old != NULL;
    }
    /* Status patches (our own) come back as MODIFIED: only a new spec changes the tree. */
    bool same =
        old != NULL && json_equal(json_object_get(old, "spec"), json_object_get(obj, "spec"));
    json_object_set(st->gpuqueues, name, obj);
    return !same;
}

static void gpuqueues_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
    ext_state *st = &d->state;
    pthread_mutex_lock(&st->mu);
    if (st->gpuqueue_crd_absent)
        ext_log(EXT_INFO, "queues: the GPUQueue resource is served now");
    st->gpuqueue_crd_absent = false;
    json_object_clear(st->gpuqueues);
    size_t i;
    json_t *obj;
    json_array_foreach(items, i, obj)
    {
        const char *name = obj_name(obj);
        if (name != NULL)
            json_object_set(st->gpuqueues, name, obj);
    }
    rebuild(st);
    pthread_mutex_unlock(&st->mu);
}

static void gpuqueues_event(void *ctx, const char *type, json_t *obj)
{
    ext_daemon *d = ctx;
    ext_state *st = &d->state;
    const char *name = obj_name(obj);
    if (name == NULL)
        return;
    gpuqueue_trim(NULL, obj);
    pthread_mutex_lock(&st->mu);
    if (gpuqueue_put(st, name, strcmp(type, "DELETED") == 0 ? NULL : obj))
        rebuild(st);
    pthread_mutex_unlock(&st->mu);
}

/*
 * The reflector relists after every failure, backing off to 30 s: while
 * the CRD is not installed (404) that is the periodic check. Queues are
 * off meanwhile, said once.
 */
static void gpuqueues_restart(void *ctx, const char *why)
{
    ext_daemon *d = ctx;
    ext_state *st = &d->state;
    bool absent = strstr(why, "HTTP 404") != NULL;
    pthread_mutex_lock(&st->mu);
    if (absent && !st->gpuqueue_crd_absent) {
        ext_log(EXT_WARN,
                "queues: the API server has no GPUQueue resource (%s is 404: the CRD "
                "gpuqueues.kgpu.io is not installed); queues are off, every pod is in queue "
                "default, until it is (checked again at most every 30 s)",
                GPUQUEUES);
        json_object_clear(st->gpuqueues);
        rebuild(st);
    } else if (!absent) {
        ext_log(EXT_WARN, "GPUQueue watch restarts: %s", why);
    }
    st->gpuqueue_crd_absent = st->gpuqueue_crd_absent || absent;
    pthread_mutex_unlock(&st->mu);
}

static void *watch_gpuqueues(void *arg)
{
    ext_daemon *d = arg;
    static const kgpu_reflector_ops ops = {gpuqueues_reset, gpuqueues_event, gpuqueues_restart,
                                           gpuqueue_trim};
    kgpu_reflector_run(d->k8s, GPUQUEUES, NULL, &ops, d, &d->stop);
    return NULL;
}

/* ---- namespaces ---- */

static const char *ns_queue_of(const json_t *ns)
{
    return json_string_value(json_object_get(
        json_object_get(json_object_get(ns, "metadata"), "annotations"), KGPU_QUEUE_LABEL));
}

/* A namespace is its name and its kgpu.io/queue annotation. */
static void namespace_trim(void *ctx, json_t *ns)
{
    (void)ctx;
    json_t *meta = json_object_get(ns, "metadata");
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *queue = ns_queue_of(ns);
    json_t *keep = json_pack("{s:s?,s:{s:s?}}", "name", name, "annotations", KGPU_QUEUE_LABEL,
                             queue);
    json_object_clear(ns);
    if (keep != NULL)
        json_object_set_new(ns, "metadata", keep);
}

static void namespaces_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
    ext_state *st = &d->state;
    pthread_mutex_lock(&st->mu);
    kgpu_strmap_clear_free(&st->ns_queue);
    size_t i;
    json_t *ns;
    json_array_foreach(items, i, ns)
    {
        const char *name = obj_name(ns);
        if (name != NULL)
            ext_queues_set_namespace(st, name, ns_queue_of(ns));
    }
    if (st->queues_spec != NULL)
        ext_queues_recharge(st); /* pods counted before the namespaces were known */
    pthread_mutex_unlock(&st->mu);
}

static void namespaces_event(void *ctx, const char *type, json_t *ns)
{
    ext_daemon *d = ctx;
    ext_state *st = &d->state;
    const char *name = obj_name(ns);
    if (name == NULL)
        return;
    const char *queue = strcmp(type, "DELETED") == 0 ? NULL : ns_queue_of(ns);
    pthread_mutex_lock(&st->mu);
    const char *was = kgpu_strmap_get(&st->ns_queue, name);
    bool changed = (was == NULL) != (queue == NULL || queue[0] == '\0') ||
                   (was != NULL && queue != NULL && strcmp(was, queue) != 0);
    ext_queues_set_namespace(st, name, queue);
    if (changed && st->queues_spec != NULL)
        ext_queues_recharge(st); /* its pods move to the queue it names now */
    pthread_mutex_unlock(&st->mu);
}

static void *watch_namespaces(void *arg)
{
    ext_daemon *d = arg;
    static const kgpu_reflector_ops ops = {namespaces_reset, namespaces_event, NULL,
                                           namespace_trim};
    kgpu_reflector_run(d->k8s, "/api/v1/namespaces", NULL, &ops, d, &d->stop);
    return NULL;
}

/* ---- status ---- */

/* GPU memory as a quantity: "40Gi", "1536Mi", "0". */
static void mem_quantity(int64_t mib, char *buf, size_t len)
{
    if (mib <= 0)
        snprintf(buf, len, "0");
    else if (mib % 1024 == 0)
        snprintf(buf, len, "%lldGi", (long long)(mib / 1024));
    else
        snprintf(buf, len, "%lldMi", (long long)mib);
}

json_t *ext_gpuqueue_status(const ext_queue_row *row, long long generation, const char *error,
                            const json_t *old_status, const char *now)
{
    char used[32], borrowed[32], mem[32];
    ext_queue_row zero;
    memset(&zero, 0, sizeof(zero));
    if (row == NULL)
        row = &zero; /* not in the tree in force (the set is invalid): nothing charged to it */
    kgpu_queue_gpus_str(row->used.milli, used, sizeof(used));
    kgpu_queue_gpus_str(row->borrowed_milli, borrowed, sizeof(borrowed));
    mem_quantity(row->used.mem_mib, mem, sizeof(mem));
    bool valid = error == NULL || error[0] == '\0';
    char message[KGPU_ERROR_MSG_MAX + 96];
    if (valid)
        snprintf(message, sizeof(message), "enforced by kgpu-extender");
    else
        snprintf(message, sizeof(message),
                 "%s; kgpu-extender keeps enforcing the last valid set of queues", error);
    /* The transition time moves only when the condition's status does. */
    const char *since = now;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(old_status, "conditions"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *s = json_string_value(json_object_get(c, "status"));
        const char *at = json_string_value(json_object_get(c, "lastTransitionTime"));
        if (t != NULL && strcmp(t, "Valid") == 0 && s != NULL && at != NULL &&
            strcmp(s, valid ? "True" : "False") == 0)
            since = at;
    }
    return json_pack("{s:I,s:{s:s,s:s},s:{s:s},s:i,s:i,s:[{s:s,s:s,s:s,s:s,s:s}]}",
                     "observedGeneration", (json_int_t)generation, "used", "gpu", used, "memory",
                     mem, "borrowed", "gpu", borrowed, "pods", row->pods, "pending", row->pending,
                     "conditions", "type", "Valid", "status", valid ? "True" : "False", "reason",
                     valid ? "Valid" : "InvalidQueues", "message", message,
                     "lastTransitionTime", since);
}

/* One queue to write: copied under the lock, written after it. */
typedef struct status_job {
    char name[KGPU_QUEUE_NAME_MAX + 1];
    json_t *status; /* what to write */
} status_job;

static void sleep_ms(ext_daemon *d, long ms)
{
    for (long t = 0; t < ms && !atomic_load(&d->stop); t += 100)
        usleep(100 * 1000);
}

/* The statuses that differ from what the objects hold (and from what was written). */
static size_t status_jobs(ext_daemon *d, kgpu_strmap *written, status_job **out)
{
    ext_state *st = &d->state;
    char now[64];
    kgpu_rfc3339_now(now, sizeof(now));
    ext_eviction *ev = malloc(EXT_EVICTIONS_KEPT * sizeof(*ev));
    ext_queue_row *rows = NULL;
    int nrows = 0, nev = 0;
    size_t n = 0;
    pthread_mutex_lock(&st->mu);
    size_t nobj = json_object_size(st->gpuqueues);
    status_job *jobs = calloc(nobj + 1, sizeof(*jobs));
    if (ev == NULL || jobs == NULL || !ext_queues_rows(st, &rows, &nrows, ev, &nev)) {
        pthread_mutex_unlock(&st->mu);
        free(ev);
        free(jobs);
        *out = NULL;
        return 0;
    }
    const char *name;
    json_t *obj;
    json_object_foreach(st->gpuqueues, name, obj)
    {
        const ext_queue_row *row = NULL;
        for (int i = 0; i < nrows && row == NULL; i++)
            if (strcmp(rows[i].name, name) == 0)
                row = &rows[i];
        json_t *meta = json_object_get(obj, "metadata");
        json_t *old = json_object_get(obj, "status");
        json_t *want = ext_gpuqueue_status(
            row, (long long)json_integer_value(json_object_get(meta, "generation")),
            st->queues_error, old, now);
        const char *last = kgpu_strmap_get(written, name);
        char *text = want != NULL ? json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        bool same = json_equal(want, old) || (last != NULL && text != NULL &&
                                               strcmp(last, text) == 0);
        free(text);
        if (same || want == NULL || n >= nobj || strlen(name) > KGPU_QUEUE_NAME_MAX) {
            json_decref(want);
            continue;
        }
        snprintf(jobs[n].name, sizeof(jobs[n].name), "%s", name);
        jobs[n++].status = want;
    }
    pthread_mutex_unlock(&st->mu);
    free(rows);
    free(ev);
    *out = jobs;
    return n;
}

static void remember_written(kgpu_strmap *written, const char *name, const json_t *status)
{
    char *text = json_dumps(status, JSON_COMPACT | JSON_SORT_KEYS);
    void *old = NULL;
    if (text == NULL)
        return;
    if (written->len >= STATUS_MAX && kgpu_strmap_get(written, name) == NULL) {
        free(text); /* more queues than a tree holds: the next round compares with the object */
        return;
    }
    if (!kgpu_strmap_put(written, name, text, &old))
        free(text);
    free(old);
}

static void *write_statuses(void *arg)
{
    ext_daemon *d = arg;
    kgpu_strmap written; /* name -> the status last written (JSON text, owned) */
    kgpu_strmap_init(&written);
    while (!atomic_load(&d->stop)) {
        sleep_ms(d, STATUS_INTERVAL_MS);
        if (!ext_is_leader(d)) {
            kgpu_strmap_clear_free(&written); /* another replica writes meanwhile */
            continue;
        }
        status_job *jobs;
        size_t n = status_jobs(d, &written, &jobs);
        for (size_t i = 0; i < n; i++) {
            char path[KGPU_K8S_PATH_MAX];
            snprintf(path, sizeof(path), "%s/%s/status", GPUQUEUES, jobs[i].name);
            json_t *patch = json_pack("{s:O}", "status", jobs[i].status);
            char *body = patch != NULL ? json_dumps(patch, JSON_COMPACT) : NULL;
            json_decref(patch);
            kgpu_http_resp resp = {0};
            kgpu_error err;
            kgpu_error_clear(&err);
            if (body != NULL && kgpu_k8s_request(d->k8s, "PATCH", path,
                                                 "application/merge-patch+json", body, &resp,
                                                 &err) == 0 &&
                resp.status == 200) {
                remember_written(&written, jobs[i].name, jobs[i].status);
            } else if (body != NULL) {
                ext_log(EXT_WARN, "GPUQueue %s: status not written: %s%.300s", jobs[i].name,
                        resp.status ? "" : err.msg, resp.status ? resp.body : "");
            }
            free(body);
            free(resp.body);
            json_decref(jobs[i].status);
        }
        free(jobs);
    }
    kgpu_strmap_clear_free(&written);
    kgpu_strmap_clear(&written);
    return NULL;
}

/*
 * The leader's reclaim for pods kube-scheduler found no node for: its own
 * filters may refuse every node ("Insufficient nvidia.com/gpu") before
 * kgpu's filter is called, so nothing else would start a reclaim for them.
 * Evictions and Events are sent after st->mu is released; the evicted pods'
 * deletion is what makes kube-scheduler try the waiting pod again.
 */
static void *sweep_unschedulable(void *arg)
{
    ext_daemon *d = arg;
    ext_sweep_act *acts = calloc(EXT_SWEEP_PODS, sizeof(*acts));
    if (acts == NULL) {
        ext_log(EXT_ERROR, "queues: out of memory; unschedulable pods are not swept");
        return NULL;
    }
    while (!atomic_load(&d->stop)) {
        sleep_ms(d, EXT_SWEEP_MS);
        if (!ext_is_leader(d))
            continue;
        pthread_mutex_lock(&d->state.mu);
        int n = ext_unsched_sweep(&d->state, acts, EXT_SWEEP_PODS);
        pthread_mutex_unlock(&d->state.mu);
        for (int i = 0; i < n && !atomic_load(&d->stop); i++) {
            const ext_sweep_act *a = &acts[i];
            if (a->evict)
                ext_evict_victims(d, &a->rec);
            if (a->reason == NULL)
                continue;
            ext_log(EXT_INFO, "pod %s/%s: %s", a->ns, a->name, a->message);
            kgpu_k8s_pod_event ev = {.ns = a->ns,
                                     .pod = a->name,
                                     .uid = a->uid,
                                     .type = a->type,
                                     .reason = a->reason,
                                     .message = a->message,
                                     .component = "kgpu-extender",
                                     .instance = d->identity};
            kgpu_error err;
            kgpu_error_clear(&err);
            if (kgpu_k8s_post_pod_event(d->k8s, &ev, &err) != 0)
                ext_log(EXT_WARN, "%s", err.msg);
        }
    }
    free(acts);
    return NULL;
}

int ext_gpuqueues_start(ext_daemon *d, kgpu_error *err)
{
    pthread_mutex_lock(&d->state.mu);
    if (d->state.gpuqueues == NULL)
        d->state.gpuqueues = json_object();
    bool ok = d->state.gpuqueues != NULL;
    pthread_mutex_unlock(&d->state.mu);
    if (!ok)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    void *(*const threads[])(void *) = {watch_gpuqueues, watch_namespaces, write_statuses,
                                        sweep_unschedulable};
    for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
        if (pthread_create(&d->watch_threads[d->nwatch], NULL, threads[i], d) != 0)
            return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the GPU queue threads");
        d->nwatch++;
    }
    return 0;
}
