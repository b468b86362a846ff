/*
 * The --cluster-file source: a YAML (or JSON) file standing for the API
 * server's nodes, for running the extender without one. Parsed whole, every
 * error naming the file and the entry, then handed to the sink at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sources.h"
#include "yamljson.h"

static int int_field(json_t *obj, const char *key, const char *where, int64_t *out, bool required,
                     kgpu_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        if (required)
            return kgpu_error_set(err, KGPU_EPARSE, "%s.%s is missing", where, key);
        return 0;
    }
    /* numa alone may be -1 (unknown) */
    int64_t min = strcmp(key, "numa") == 0 ? -1 : 0;
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return kgpu_error_set(err, KGPU_EPARSE, "%s.%s is not %s integer", where, key,
                              min < 0 ? "-1 or a non-negative" : "a non-negative");
    *out = json_integer_value(v);
    return 0;
}

int ext_cluster_file_load(const char *path, const ext_sink *sink, kgpu_error *err)
{
    json_t *root = kgpu_yaml_load_file(path, err);
    if (root == NULL)
        return err ? err->code : KGPU_EPARSE;
    json_t *nodes = json_object_get(root, "nodes");
    int rc = 0;
    size_t n = json_array_size(nodes);
    kgpu_node_spec *specs = calloc(n + 1, sizeof(*specs));
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc(n + 1, sizeof(*gpus));
    kgpu_label(*labels)[32] = calloc(n + 1, sizeof(*labels));
    /* The GPUs' strings, copied by kgpu_gpu_item_parse (ext_state_set_nodes copies them again). */
    struct gpu_strings {
        char uuid[KGPU_UUID_MAX];
        char model[KGPU_MODEL_NAME_MAX];
    }(*strings)[KGPU_MAX_GPUS_PER_NODE] = calloc(n + 1, sizeof(*strings));
    if (specs == NULL || gpus == NULL || labels == NULL || strings == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    if (!json_is_array(nodes) || n == 0) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: expected a non-empty list under 'nodes'", path);
        goto out;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *node = json_array_get(nodes, i);
        char where[1200];
        snprintf(where, sizeof(where), "%s: nodes[%zu]", path, i);
        const char *name = json_string_value(json_object_get(node, "name"));
        if (!json_is_object(node) || name == NULL || name[0] == '\0') {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s needs a name", where);
            break;
        }
        kgpu_node_spec *s = &specs[i];
        s->name = name;
        s->cpu_milli = 64000; /* CPU and memory are kube-scheduler's to check */
        s->memory_mib = 262144;
        if ((rc = int_field(node, "cpu_milli", where, &s->cpu_milli, false, err)) != 0 ||
            (rc = int_field(node, "memory_mib", where, &s->memory_mib, false, err)) != 0)
            break;
        json_t *lab = json_object_get(node, "labels");
        const char *lk;
        json_t *lv;
        json_object_foreach(lab, lk, lv)
        {
            if (s->nlabels == 32 || !json_is_string(lv)) {
                rc = kgpu_error_set(err, KGPU_EPARSE, "%s.labels: at most 32 string values", where);
                break;
            }
            labels[i][s->nlabels++] = (kgpu_label){(char *)lk, (char *)json_string_value(lv)};
        }
        s->labels = labels[i];
        json_t *gl = json_object_get(node, "gpus");
        if (!json_is_array(gl) || json_array_size(gl) > KGPU_MAX_GPUS_PER_NODE) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s.gpus: expected a list of at most %d GPUs",
                                where, KGPU_MAX_GPUS_PER_NODE);
            break;
        }
        s->ngpus = (int)json_array_size(gl);
        s->gpus = gpus[i];
        for (int g = 0; g < s->ngpus && rc == 0; g++) {
            char gw[1300];
            snprintf(gw, sizeof(gw), "%s.gpus[%d]", where, g);
            rc = kgpu_gpu_item_parse(json_array_get(gl, (size_t)g), gw, g, false, false,
                                     &gpus[i][g], strings[i][g].uuid, strings[i][g].model, err);
        }
    }
    if (rc == 0) {
        rc = sink->file_nodes(sink->ctx, specs, (int)n, err);
        if (rc != 0 && err)
            kgpu_error_set(err, err->code, "%s: %.400s", path, err->msg);
    }
out:
    free(specs);
    free(gpus);
    free(labels);
    free(strings);
    json_decref(root);
    /* The parsed file was many small blocks; give that memory back to the system. */
    ext_malloc_trim();
    return rc;
}
