/*
 * GPUQueue status (docs/queues.md "Cluster mode"): the leader writes each
 * GPUQueue's use, borrowing, pods, pending and a Valid condition through
 * the /status subresource, copied from the state under its lock and sent
 * after it. Status is written only when it differs from what the object
 * holds and from what was last written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "serve.h"

#define GPUQUEUES  "/apis/kgpu.io/v1alpha1/gpuqueues"
#define STATUS_MAX (2 * KGPU_QUEUE_MAX) /* statuses remembered as written */

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

/* The statuses that differ from what the objects hold (and from what was written). */
static size_t status_jobs(ext_state *st, kgpu_strmap *written, status_job **out)
{
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

void ext_status_write(ext_state *st, kgpu_k8s *k8s, kgpu_strmap *written)
{
    status_job *jobs;
    size_t n = status_jobs(st, written, &jobs);
    for (size_t i = 0; i < n; i++) {
        char path[KGPU_K8S_PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s/status", GPUQUEUES, jobs[i].name);
        json_t *patch = json_pack("{s:O}", "status", jobs[i].status);
        char *body = patch != NULL ? json_dumps(patch, JSON_COMPACT) : NULL;
        json_decref(patch);
        kgpu_http_resp resp = {0};
        kgpu_error err;
        kgpu_error_clear(&err);
        if (body != NULL &&
            kgpu_k8s_request(k8s, "PATCH", path, "application/merge-patch+json", body, &resp,
                             &err) == 0 &&
            resp.status == 200) {
            remember_written(written, jobs[i].name, jobs[i].status);
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
