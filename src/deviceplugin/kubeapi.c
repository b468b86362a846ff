/*
 * The device plugin's calls to the API server: the node's GPU annotation and
 * labels, the node's pods (for Allocate's match and the clean-up), and the
 * pod's allocation progress.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "plugin.h"
#include "podspec.h"

/* ---- the node's annotation and labels ---- */

/* A label value from a model name: [A-Za-z0-9._-], alphanumeric at both ends, ≤ 63. */
static void label_value(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in && n + 1 < cap && n < 63; in++) {
        char c = *in;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok && n > 0 && out[n - 1] == '-')
            continue;
        if (!ok && n == 0)
            continue;
        out[n++] = ok ? c : '-';
    }
    while (n > 0 &&
           !((out[n - 1] >= 'a' && out[n - 1] <= 'z') || (out[n - 1] >= 'A' && out[n - 1] <= 'Z') ||
             (out[n - 1] >= '0' && out[n - 1] <= '9')))
        n--;
    out[n] = '\0';
}

/* The merge patch for the node: kgpu.io/gpus and the two labels. */
static char *node_patch(const contract_inventory *inv)
{
    kgpu_gpu_spec spec[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < inv->ngpus; i++) {
        const kgpu_gpu_info *g = &inv->gpus[i];
        spec[i] = (kgpu_gpu_spec){g->index, g->uuid, g->model, g->memory_mib, g->numa, g->healthy};
    }
    char *gpus = kgpu_gpus_annotation_format(spec, inv->ngpus);
    if (gpus == NULL)
        return NULL;
    char model[64] = "";
    for (int i = 0; i < inv->ngpus; i++)
        if (i == 0)
            label_value(inv->gpus[0].model, model, sizeof(model));
        else if (strcmp(inv->gpus[i].model, inv->gpus[0].model) != 0)
            snprintf(model, sizeof(model), "mixed");
    char count[16];
    snprintf(count, sizeof(count), "%d", inv->ngpus);
    json_t *patch = json_pack("{s:{s:{s:s},s:{s:s,s:s}}}", "metadata", "annotations", KGPU_ANN_GPUS,
                              gpus, "labels", KGPU_LABEL_MODEL, model, KGPU_LABEL_COUNT, count);
    free(gpus);
    if (patch == NULL)
        return NULL;
    char *text = json_dumps(patch, JSON_COMPACT);
    json_decref(patch);
    return text;
}

/* PATCHes the node with `inv` (a copy: runs on the API thread); 0 when it took. */
int dp_publish_node(plugin *p, const contract_inventory *inv, double backoff)
{
    char *body = node_patch(inv);
    char path[KGPU_K8S_PATH_MAX];
    snprintf(path, sizeof(path), "/api/v1/nodes/%s", p->cfg->node.node_name);
    kgpu_http_resp resp = {0};
    kgpu_error e = {0};
    int rc = body == NULL ? kgpu_error_set(&e, KGPU_ENOMEM, "out of memory")
                          : kgpu_k8s_request(p->k8s, "PATCH", path, "application/merge-patch+json",
                                             body, &resp, &e);
    if (rc == 0 && resp.status == 200) {
        kgpu_log(KGPU_LOG_INFO, "node %s: published %d GPUs", p->cfg->node.node_name, inv->ngpus);
    } else {
        kgpu_log(KGPU_LOG_WARN,
                 "node %s: publishing the GPU inventory failed (%s); again in %.0f s",
                 p->cfg->node.node_name,
                 rc != 0 ? e.msg : (resp.body != NULL ? resp.body : "no answer"), backoff);
        rc = rc != 0 ? rc : KGPU_EIO;
    }
    free(resp.body);
    free(body);
    return rc;
}

/* ---- the node's pods ---- */

json_t *dp_list_node_pods(plugin *p, kgpu_error *err)
{
    char query[KGPU_K8S_PATH_MAX];
    snprintf(query, sizeof(query), "fieldSelector=spec.nodeName%%3D%s", p->cfg->node.node_name);
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_error e;
    if (kgpu_k8s_list(p->k8s, "/api/v1/pods", query, NULL, &items, rv, sizeof(rv), NULL, &e) != 0)
        kgpu_error_set(err, e.code, "listing the pods of node %s: %s", p->cfg->node.node_name,
                       e.msg);
    return items;
}

/* Records progress (or completion) in the pod; the uid guards against a namesake. */
int dp_mark_pod(plugin *p, const dp_match *m, kgpu_error *err)
{
    char when[64];
    kgpu_rfc3339_now(when, sizeof(when));
    json_t *ann = m->complete ? json_pack("{s:s,s:n}", KGPU_ANN_ALLOCATED, when, DP_ANN_ALLOCATING)
                              : json_pack("{s:s}", DP_ANN_ALLOCATING, m->progress);
    json_t *patch = json_pack("{s:{s:s,s:o}}", "metadata", "uid", m->t.uid, "annotations", ann);
    char *body = patch != NULL ? json_dumps(patch, JSON_COMPACT) : NULL;
    json_decref(patch);
    if (body == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    char path[KGPU_K8S_PATH_MAX];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", m->t.ns, m->t.name);
    kgpu_http_resp resp = {0};
    int rc =
        kgpu_k8s_request(p->k8s, "PATCH", path, "application/merge-patch+json", body, &resp, err);
    if (rc == 0 && resp.status != 200)
        rc = kgpu_error_set(err, KGPU_EIO, "marking pod %s/%s: HTTP %ld: %.200s", m->t.ns,
                            m->t.name, resp.status, resp.body != NULL ? resp.body : "");
    free(resp.body);
    free(body);
    return rc;
}
