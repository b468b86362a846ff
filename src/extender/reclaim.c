/*
 * Reclaim's side effects: evicting the victims a reclaim chose, through the
 * Eviction API so that PodDisruptionBudgets hold, and the leader's sweep
 * over pods kube-scheduler found no node for. The choice itself is the
 * state's (ext_queues_reclaim, ext_unsched_sweep): it must be made and
 * recorded under one hold of the lock. Evictions and Events go out after it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decide.h"

void ext_evict_victims(ext_ctx *d, const ext_reclaim *r)
{
    for (int i = 0; i < r->nvictims; i++) {
        const ext_victim *v = &r->v[i];
        char path[KGPU_K8S_PATH_MAX];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s/eviction", v->ns, v->name);
        json_t *body = json_pack("{s:s,s:s,s:{s:s,s:s}}", "apiVersion", "policy/v1", "kind",
                                 "Eviction", "metadata", "name", v->name, "namespace", v->ns);
        char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        kgpu_http_resp resp = {0};
        kgpu_error err;
        kgpu_error_clear(&err);
        int outcome = EXT_EVICT_FAILED;
        if (text != NULL &&
            kgpu_k8s_request(d->k8s, "POST", path, "application/json", text, &resp, &err) == 0) {
            outcome = resp.status == 200 || resp.status == 201 ? EXT_EVICT_EVICTED
                      : resp.status == 429                     ? EXT_EVICT_BLOCKED
                      : resp.status == 404                     ? EXT_EVICT_GONE
                                                               : EXT_EVICT_FAILED;
            if (outcome == EXT_EVICT_FAILED)
                ext_log(EXT_WARN, "eviction of %s/%s: API server answered %ld: %.300s", v->ns,
                        v->name, resp.status, resp.body ? resp.body : "");
        } else {
            ext_log(EXT_WARN, "eviction of %s/%s: %s", v->ns, v->name,
                    text ? err.msg : "out of memory");
        }
        free(text);
        free(resp.body);
        pthread_mutex_lock(&d->state->mu);
        ext_queues_evicted(d->state, r, v, outcome);
        pthread_mutex_unlock(&d->state->mu);
    }
}

/*
 * The leader's reclaim for pods kube-scheduler found no node for: its own
 * filters may refuse every node ("Insufficient nvidia.com/gpu") before
 * kgpu's filter is called, so nothing else would start a reclaim for them.
 * Evictions and Events are sent after st->mu is released; the evicted pods'
 * deletion is what makes kube-scheduler try the waiting pod again.
 */
void ext_sweep_once(ext_ctx *d, ext_sweep_act *acts, const atomic_bool *stop)
{
    pthread_mutex_lock(&d->state->mu);
    ext_reclaims_refresh(d->state); /* holds start as their victims leave, not at the next filter */
    int n = ext_unsched_sweep(d->state, acts, EXT_SWEEP_PODS);
    pthread_mutex_unlock(&d->state->mu);
    for (int i = 0; i < n && !atomic_load(stop); i++) {
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
