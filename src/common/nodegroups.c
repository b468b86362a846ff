/* The node groups file (nodegroups.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "nodegroups.h"
#include "yamljson.h"

#define NODE_GROUPS_FILE_MAX (1 << 20)

static int str_field(char *dst, size_t cap, json_t *v, const char *file, int i, const char *key,
                     kgpu_error *err)
{
    const char *s = json_string_value(v);
    if (s == NULL || *s == '\0' || strlen(s) >= cap)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: nodeGroups[%d].%s: expected a string of 1..%zu bytes", file, i,
                              key, cap - 1);
    snprintf(dst, cap, "%s", s);
    return 0;
}

static int int_field(json_t *v, long lo, long hi, const char *file, int i, const char *key,
                     long *out, kgpu_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d].%s: expected an integer "
                              "%ld..%ld", file, i, key, lo, hi);
    *out = (long)json_integer_value(v);
    return 0;
}

static int read_gpus(json_t *o, const char *file, int i, kgpu_node_group *g, kgpu_error *err)
{
    if (!json_is_object(o))
        return kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d].gpus: expected a mapping "
                              "{model, count, memoryMiB}", file, i);
    const char *k;
    json_t *v;
    long x = 0; /* set by int_field on success; 0 keeps -O2's maybe-uninitialized quiet */
    int rc = 0;
    json_object_foreach(o, k, v) {
        if (rc != 0)
            break;
        if (strcmp(k, "model") == 0)
            rc = str_field(g->gpu_model, sizeof(g->gpu_model), v, file, i, "gpus.model", err);
        else if (strcmp(k, "count") == 0) {
            if ((rc = int_field(v, 1, KGPU_MAX_GPUS_PER_NODE, file, i, "gpus.count", &x, err)) == 0)
                g->gpu_count = (int)x;
        } else if (strcmp(k, "memoryMiB") == 0) {
            if ((rc = int_field(v, 1, 1L << 24, file, i, "gpus.memoryMiB", &x, err)) == 0)
                g->gpu_memory_mib = x;
        } else
            rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d].gpus: unknown key %.64s "
                                "(model, count, memoryMiB)", file, i, k);
    }
    if (rc == 0 && (!g->gpu_model[0] || g->gpu_count == 0 || g->gpu_memory_mib == 0))
        rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d].gpus: model, count and "
                            "memoryMiB are all required", file, i);
    return rc;
}

static int read_group(json_t *e, const char *file, int i, kgpu_node_group *g, kgpu_error *err)
{
    if (!json_is_object(e))
        return kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d]: expected a mapping", file, i);
    memset(g, 0, sizeof(*g));
    g->max_nodes = -1;
    const char *k;
    json_t *v;
    long x = 0; /* set by int_field on success; 0 keeps -O2's maybe-uninitialized quiet */
    int rc = 0;
    json_object_foreach(e, k, v) {
        if (rc != 0)
            break;
        if (strcmp(k, "name") == 0)
            rc = str_field(g->name, sizeof(g->name), v, file, i, k, err);
        else if (strcmp(k, "maxNodes") == 0) {
            if ((rc = int_field(v, 0, 10000, file, i, k, &x, err)) == 0)
                g->max_nodes = (int)x;
        } else if (strcmp(k, "gpus") == 0)
            rc = read_gpus(v, file, i, g, err);
        else if (strcmp(k, "nodeLabels") == 0) {
            if (!json_is_object(v) || json_object_size(v) < 1 ||
                json_object_size(v) > KGPU_NODE_GROUP_LABELS_MAX)
                rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d].nodeLabels: expected a "
                                    "mapping of 1..%d labels", file, i, KGPU_NODE_GROUP_LABELS_MAX);
            const char *lk;
            json_t *lv;
            json_object_foreach(v, lk, lv) {
                if (rc != 0)
                    break;
                const char *s = json_string_value(lv);
                if (strlen(lk) == 0 || strlen(lk) >= sizeof(g->label_key[0]) || s == NULL ||
                    strlen(s) >= sizeof(g->label_value[0]))
                    rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d].nodeLabels.%.64s: "
                                        "expected a label value (a string of < 64 bytes)",
                                        file, i, lk);
                else {
                    snprintf(g->label_key[g->nlabels], sizeof(g->label_key[0]), "%s", lk);
                    snprintf(g->label_value[g->nlabels++], sizeof(g->label_value[0]), "%s", s);
                }
            }
        } else
            rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d]: unknown key %.64s (name, "
                                "maxNodes, nodeLabels, gpus)", file, i, k);
    }
    if (rc == 0 && (!g->name[0] || g->max_nodes < 0 || g->nlabels == 0 || g->gpu_count == 0))
        rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%d]: name, maxNodes, nodeLabels "
                            "and gpus are all required", file, i);
    return rc;
}

int kgpu_node_groups_load(const char *buf, size_t len, const char *file, kgpu_node_groups *out,
                          kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    json_t *root = kgpu_yaml_load(buf, len, file, err);
    if (root == NULL)
        return err->code != 0 ? err->code : KGPU_EPARSE;
    json_t *list = json_object_get(root, "nodeGroups");
    int rc = 0;
    if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_array(list) ||
        json_array_size(list) > KGPU_NODE_GROUPS_MAX)
        rc = kgpu_error_set(err, KGPU_EINVAL, "%s: expected one key, nodeGroups: a list of at "
                            "most %d groups", file, KGPU_NODE_GROUPS_MAX);
    for (size_t i = 0; rc == 0 && i < json_array_size(list); i++) {
        rc = read_group(json_array_get(list, i), file, (int)i, &out->v[i], err);
        for (size_t k = 0; rc == 0 && k < i; k++)
            if (strcmp(out->v[k].name, out->v[i].name) == 0)
                rc = kgpu_error_set(err, KGPU_EINVAL, "%s: nodeGroups[%zu].name: %s twice", file,
                                    i, out->v[i].name);
        if (rc == 0)
            out->n++;
    }
    json_decref(root);
    if (rc != 0)
        out->n = 0;
    return rc;
}

int kgpu_node_groups_load_file(const char *path, kgpu_node_groups *out, kgpu_error *err)
{
    char *buf;
    size_t len;
    int rc = kgpu_read_file_max(path, NODE_GROUPS_FILE_MAX, &buf, &len, err);
    if (rc != 0)
        return rc;
    rc = kgpu_node_groups_load(buf, len, path, out, err);
    free(buf);
    return rc;
}

bool kgpu_node_group_member(const kgpu_node_group *g, const kgpu_node *n)
{
    for (int i = 0; i < g->nlabels; i++) {
        bool found = false;
        for (int k = 0; k < n->nlabels && !found; k++)
            found = strcmp(n->labels[k].key, g->label_key[i]) == 0 &&
                    strcmp(n->labels[k].value, g->label_value[i]) == 0;
        if (!found)
            return false;
    }
    return true;
}
