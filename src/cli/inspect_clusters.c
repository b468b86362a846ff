/*
 * `kgpu inspect --clusters FILE`: every worker cluster of kgpu-dispatcher's
 * clusters file at a glance, from each one's kgpu-extender /inspect: per
 * GPU model the GPUs, the compute allocated, the GPUs wholly free and the
 * pods. A cluster that does not answer gets a row saying why; the others
 * are still shown (docs/multicluster.md "kgpu inspect --clusters").
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "clusterfile.h"
#include "k8s.h"

#define MODELS_MAX 32

typedef struct model_row {
    char model[64];
    int64_t gpus, milli, whole_free, pods;
} model_row;

static int64_t num(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* Per model from an /inspect document; the number of rows. */
static int by_model(const json_t *doc, model_row *rows, int *nodes)
{
    int n = 0;
    size_t i, k;
    json_t *node, *g;
    *nodes = (int)json_array_size(json_object_get(doc, "nodes"));
    json_array_foreach(json_object_get(doc, "nodes"), i, node) {
        json_array_foreach(json_object_get(node, "gpus"), k, g) {
            const char *m = json_string_value(json_object_get(g, "model"));
            if (m == NULL)
                continue;
            int r = 0;
            while (r < n && strcmp(rows[r].model, m) != 0)
                r++;
            if (r == n && n == MODELS_MAX)
                continue;
            if (r == n) {
                memset(&rows[n], 0, sizeof(rows[n]));
                snprintf(rows[n++].model, sizeof(rows[0].model), "%s", m);
            }
            int64_t milli = num(g, "milli_allocated");
            rows[r].gpus++;
            rows[r].milli += milli;
            rows[r].whole_free += milli == 0 && num(g, "memory_allocated_mib") == 0 &&
                                  !json_is_false(json_object_get(g, "healthy"));
            rows[r].pods += (int64_t)json_array_size(json_object_get(g, "pods"));
        }
    }
    return n;
}

/* The cluster's /inspect, or NULL with why[] set. */
static json_t *fetch(const kgpu_cluster_entry *e, char *why, size_t len)
{
    kgpu_k8s_config cfg = {.timeout_ms = 5000};
    snprintf(cfg.server, sizeof(cfg.server), "%s", e->extender);
    snprintf(cfg.ca_file, sizeof(cfg.ca_file), "%s", e->ca);
    snprintf(cfg.cert_file, sizeof(cfg.cert_file), "%s", e->cert);
    snprintf(cfg.key_file, sizeof(cfg.key_file), "%s", e->key);
    kgpu_error err;
    kgpu_error_clear(&err);
    kgpu_k8s *k = kgpu_k8s_new(&cfg, &err);
    if (k == NULL) {
        snprintf(why, len, "%s", err.msg);
        return NULL;
    }
    kgpu_http_resp resp = {0};
    int rc = kgpu_k8s_request(k, "GET", "/inspect", NULL, NULL, &resp, &err);
    kgpu_k8s_free(k);
    json_t *doc = NULL;
    if (rc != 0)
        snprintf(why, len, "%s", err.msg);
    else if (resp.status != 200)
        snprintf(why, len, "/inspect answered %ld: %.200s", resp.status,
                 resp.body ? resp.body : "");
    else if ((doc = json_loads(resp.body, 0, NULL)) == NULL || !json_is_object(doc))
        snprintf(why, len, "/inspect's answer is not a JSON object");
    free(resp.body);
    if (doc != NULL && !json_is_object(doc)) {
        json_decref(doc);
        doc = NULL;
    }
    return doc;
}

int kgpu_inspect_clusters(const char *path, bool json)
{
    kgpu_clusters *cl = malloc(sizeof(*cl));
    kgpu_error err;
    kgpu_error_clear(&err);
    if (cl == NULL || kgpu_clusters_load_file(path, cl, &err) != 0) {
        fprintf(stderr, "kgpu inspect: %s\n", cl ? err.msg : "out of memory");
        free(cl);
        return cl ? 2 : 1;
    }
    json_t *out = json_array();
    int answered = 0;
    if (!json)
        printf("%-20s %-24s %6s %12s %10s %6s\n", "CLUSTER", "MODEL", "GPUS", "ALLOCATED",
               "WHOLE FREE", "PODS");
    for (int i = 0; i < cl->n; i++) {
        const kgpu_cluster_entry *e = &cl->v[i];
        char why[KGPU_ERROR_MSG_MAX + 64] = "";
        json_t *doc = fetch(e, why, sizeof(why));
        if (doc == NULL) {
            if (json)
                json_array_append_new(out, json_pack("{s:s,s:b,s:s}", "cluster", e->name,
                                                     "reachable", 0, "error", why));
            else
                printf("%-20s unreachable: %s\n", e->name, why);
            continue;
        }
        answered++;
        model_row rows[MODELS_MAX];
        int nodes = 0, n = by_model(doc, rows, &nodes);
        json_t *models = json_array();
        for (int r = 0; r < n; r++) {
            if (json) {
                json_array_append_new(models,
                                      json_pack("{s:s,s:I,s:f,s:I,s:I}", "model", rows[r].model,
                                                "gpus", (json_int_t)rows[r].gpus,
                                                "allocated_gpus", rows[r].milli / 1000.0,
                                                "whole_free", (json_int_t)rows[r].whole_free,
                                                "pods", (json_int_t)rows[r].pods));
                continue;
            }
            char alloc[32];
            snprintf(alloc, sizeof(alloc), "%.2f (%.0f%%)", rows[r].milli / 1000.0,
                     rows[r].gpus ? 100.0 * (double)rows[r].milli / (double)(rows[r].gpus * 1000)
                                  : 0.0);
            printf("%-20s %-24s %6" PRId64 " %12s %10" PRId64 " %6" PRId64 "\n",
                   r == 0 ? e->name : "", rows[r].model, rows[r].gpus, alloc,
                   rows[r].whole_free, rows[r].pods);
        }
        if (json)
            json_array_append_new(out, json_pack("{s:s,s:b,s:i,s:o}", "cluster", e->name,
                                                 "reachable", 1, "nodes", nodes, "models",
                                                 models));
        else {
            json_decref(models);
            if (n == 0)
                printf("%-20s (no GPU nodes)\n", e->name);
        }
        json_decref(doc);
    }
    if (json) {
        json_dumpf(out, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
    }
    json_decref(out);
    int total = cl->n;
    free(cl);
    return answered > 0 || total == 0 ? 0 : 1;
}
