/*
 * The extender's routes: kube-scheduler's verbs (POST, any urlPrefix) to
 * the decisions layer, and the operator endpoints (inspect, estimate, metrics,
 * health, readiness, version, and DELETE /pods in --cluster-file mode);
 * plus the serving layer started with this router as its handler.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "mutate.h"

bool ext_daemon_leads(ext_daemon *d)
{
    return !d->cfg.leader_elect || atomic_load(&d->leader.leads);
}

ext_ctx ext_daemon_ctx(ext_daemon *d)
{
    return (ext_ctx){.cfg = &d->cfg,
                     .metrics = &d->metrics,
                     .state = &d->state,
                     .k8s = d->k8s,
                     .leads = d->cfg.leader_elect ? &d->leader.leads : NULL,
                     .identity = d->leader.identity};
}

bool ext_daemon_ready(ext_daemon *d)
{
    return ext_state_synced(&d->state) && ext_daemon_leads(d);
}

/*
 * DELETE /pods/NAMESPACE/NAME: in --cluster-file mode, where no watch says
 * that a pod ended, whoever drives the extender says so; its GPUs and its
 * queue's charge are released. With an API server pods leave by its watch.
 */
static void handle_pod_delete(ext_daemon *d, const char *path, ext_response *r)
{
    if (d->k8s != NULL) {
        ext_reply_json(r, 405,
                   json_pack("{s:s}", "Error",
                             "pods leave through the API server's watch; DELETE /pods/NS/NAME "
                             "is for --cluster-file mode"));
        return;
    }
    char ns[64], name[KGPU_NAME_MAX + 1];
    const char *slash = strchr(path, '/');
    if (slash == NULL || slash == path || (size_t)(slash - path) >= sizeof(ns) ||
        strlen(slash + 1) >= sizeof(name) || slash[1] == '\0') {
        ext_reply_text(r, 400, "DELETE /pods/NAMESPACE/NAME\n");
        return;
    }
    snprintf(ns, sizeof(ns), "%.*s", (int)(slash - path), path);
    snprintf(name, sizeof(name), "%s", slash + 1);
    char uid[64] = "";
    pthread_mutex_lock(&d->state.mu);
    const char *k;
    void *v;
    size_t it = 0;
    while (uid[0] == '\0' && kgpu_strmap_next(&d->state.pods, &it, &k, &v)) {
        const ext_pod *p = v;
        if (strcmp(p->ns, ns) == 0 && strcmp(p->name, name) == 0)
            snprintf(uid, sizeof(uid), "%s", p->uid);
    }
    if (uid[0] != '\0')
        ext_state_pod_gone(&d->state, uid);
    pthread_mutex_unlock(&d->state.mu);
    if (uid[0] == '\0') {
        ext_reply_json(r, 404, json_pack("{s:s}", "Error", "no pod of that name holds GPUs"));
        return;
    }
    ext_log(EXT_INFO, "pod %s/%s (uid %s) left: its GPUs are released", ns, name, uid);
    ext_reply_json(r, 200, json_pack("{s:s,s:s,s:s}", "namespace", ns, "name", name, "uid", uid));
}

/* POST /mutate/pods: the API server's AdmissionReview of a pod being created (mutate.c). */
static void handle_mutate(ext_daemon *d, const char *body, size_t len, ext_response *r)
{
    json_t *answer = NULL;
    bool routed = false;
    char why[200];
    int status = ext_mutate_review(d->cfg.route_pods_to, d->cfg.max_json_depth, body, len,
                                   &answer, &routed, why, sizeof(why));
    if (status != 200) {
        ext_log(EXT_WARN, "mutate/pods: %s", why);
        ext_reply_json(r, status, json_pack("{s:s}", "Error", why));
        return;
    }
    if (routed)
        ext_log(EXT_DEBUG, "mutate/pods: a GPU pod is given schedulerName %s",
                d->cfg.route_pods_to);
    ext_reply_json(r, 200, answer);
}

/* The last path segment for POST verbs, so any urlPrefix kube-scheduler uses works. */
static const char *last_segment(const char *url)
{
    const char *s = strrchr(url, '/');
    return s ? s + 1 : url;
}

void ext_handle(ext_daemon *d, const char *method, const char *url, const char *body, size_t len,
                ext_response *r)
{
    memset(r, 0, sizeof(*r));
    if (strcmp(method, "POST") == 0 && strcmp(url, "/mutate/pods") == 0) {
        handle_mutate(d, body, len, r);
        return;
    }
    if (strcmp(method, "POST") == 0 && strcmp(url, "/estimate") == 0) {
        ext_ctx c = ext_daemon_ctx(d);
        ext_estimate(&c, body, len, r); /* estimates.c */
        return;
    }
    if (strcmp(method, "POST") == 0) {
        const char *verb = last_segment(url);
        enum ext_verb v = VERB_OTHER;
        for (int i = 0; i < VERB_OTHER; i++)
            if (strcmp(verb, ext_verb_name((enum ext_verb)i)) == 0)
                v = (enum ext_verb)i;
        if (v == VERB_OTHER) {
            ext_reply_json(r, 404,
                       json_pack("{s:s}", "Error",
                                 "unknown verb; POST filter, prioritize, "
                                 "filter-gpuless, prioritize-gpuless, bind or preempt"));
            return;
        }
        ext_ctx c = ext_daemon_ctx(d);
        ext_decide(&c, v, body, len, r);
        return;
    }
    if (strcmp(method, "DELETE") == 0 && strncmp(url, "/pods/", 6) == 0) {
        handle_pod_delete(d, url + 6, r);
        return;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        ext_reply_text(r, 405, "method not allowed\n");
        return;
    }
    if (strcmp(url, "/healthz") == 0) {
        ext_reply_text(r, 200, "ok\n");
    } else if (strcmp(url, "/readyz") == 0) {
        bool ready = ext_daemon_ready(d);
        const char *why = ready                 ? "ok\n"
                          : ext_daemon_leads(d) ? "not ready: nodes or pods not listed from the "
                                                  "API server yet\n"
                                                : "standby: another replica holds the lease\n";
        ext_reply_text(r, ready ? 200 : 503, why);
    } else if (strcmp(url, "/version") == 0) {
        ext_reply_json(r, 200,
                   json_pack("{s:s,s:s}", "version", KGPU_VERSION, "component", "kgpu-extender"));
    } else if (strcmp(url, "/metrics") == 0) {
        bool busy;
        if (ext_metrics_stream(&d->metrics, &d->state, ext_daemon_ready(d), &r->stream, &busy)) {
            r->status = 200;
            r->content_type = "text/plain; version=0.0.4; charset=utf-8";
        } else if (busy) {
            ext_reply_text(r, 503,
                       "too many /metrics answers being sent at once; retry when one is done\n");
        } /* else out of memory: no body, the serving layer answers 500 */
    } else if (strcmp(url, "/inspect") == 0) {
        ext_reply_json(r, 200, ext_inspect_json(&d->state, NULL));
    } else if (strncmp(url, "/inspect/", 9) == 0 && url[9] != '\0') {
        /* The path arrives percent-decoded: %ff is a byte no node name has (nor JSON takes). */
        bool name_ok = strlen(url + 9) <= KGPU_NAME_MAX;
        for (const char *c = url + 9; name_ok && *c; c++)
            name_ok = *c > ' ' && *c < 0x7f;
        json_t *one = name_ok ? ext_inspect_json(&d->state, url + 9) : NULL;
        if (!name_ok)
            ext_reply_text(r, 400, "not a node name: /inspect/NODE takes a node name\n");
        else if (one == NULL)
            ext_reply_json(r, 404,
                       json_pack("{s:s,s:s}", "Error", "no such GPU node", "node", url + 9));
        else
            ext_reply_json(r, 200, one);
    } else {
        ext_reply_text(r, 404, "not found\n");
    }
}

static void handle(void *ctx, const char *method, const char *url, const char *body, size_t len,
                   ext_response *r)
{
    ext_handle(ctx, method, url, body, len, r);
}

int ext_http_start(ext_daemon *d, kgpu_error *err)
{
    int rc = ext_http_serve(&d->cfg, &d->metrics, handle, d, &d->http, err);
    d->port = ext_http_port(d->http);
    d->probe_port = ext_http_probe_port(d->http);
    return rc;
}

void ext_http_stop(ext_daemon *d)
{
    ext_http_close(d->http);
    d->http = NULL;
}
