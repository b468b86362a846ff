/* The fake GPU inventory: a file in the cluster file's `gpus:` form. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "kgpu/model.h"
#include "yamljson.h"

static int field_error(kgpu_error *err, const char *path, size_t i, const char *field,
                       const char *what)
{
    return kgpu_error_set(err, KGPU_EPARSE, "%s: gpus[%zu].%s: %s", path, i, field, what);
}

/* Validates `doc` (borrowed) into *gpus; `path` names the source in errors. */
static int from_doc(json_t *doc, const char *path, kgpu_gpu_info **gpus, int *ngpus,
                    kgpu_error *err)
{
    int rc = KGPU_OK;
    json_t *list = json_object_get(doc, "gpus");
    if (!json_is_array(list)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: needs a top-level `gpus:` list", path);
        goto out;
    }
    size_t n = json_array_size(list);
    if (n < 1 || n > KGPU_MAX_GPUS_PER_NODE) {
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s: %zu GPUs listed; 1 to %d wanted", path, n,
                            KGPU_MAX_GPUS_PER_NODE);
        goto out;
    }
    kgpu_gpu_info *out = calloc(n, sizeof(*out));
    if (out == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n && rc == KGPU_OK; i++) {
        json_t *g = json_array_get(list, i);
        kgpu_gpu_info *o = &out[i];
        json_t *v;
        const char *s;
        if (!json_is_object(g)) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s: gpus[%zu]: not a mapping", path, i);
        } else if (v = json_object_get(g, "index"), !json_is_integer(v) ||
                                                        json_integer_value(v) < 0 ||
                                                        json_integer_value(v) > 1023) {
            rc = field_error(err, path, i, "index", "needs an integer 0..1023");
        } else if (s = json_string_value(json_object_get(g, "uuid")),
                   s == NULL || !*s || strlen(s) >= KGPU_UUID_MAX) {
            rc = field_error(err, path, i, "uuid", "needs a non-empty string (< 80 bytes)");
        } else if (snprintf(o->uuid, sizeof(o->uuid), "%s", s),
                   s = json_string_value(json_object_get(g, "model")),
                   s == NULL || !*s || strlen(s) >= KGPU_MODEL_NAME_MAX) {
            rc = field_error(err, path, i, "model", "needs a non-empty string (< 64 bytes)");
        } else {
            o->index = (int)json_integer_value(json_object_get(g, "index"));
            snprintf(o->model, sizeof(o->model), "%s", s);
            v = json_object_get(g, "memory_mib");
            if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
                json_integer_value(v) > (INT64_C(1) << 30)) {
                rc = field_error(err, path, i, "memory_mib", "needs a positive integer");
                break;
            }
            o->memory_mib = json_integer_value(v);
            v = json_object_get(g, "numa");
            o->numa = -1;
            if (v != NULL && (!json_is_integer(v) || json_integer_value(v) < -1 ||
                              json_integer_value(v) > 1023)) {
                rc = field_error(err, path, i, "numa", "needs an integer -1..1023");
                break;
            }
            if (v != NULL)
                o->numa = (int)json_integer_value(v);
            v = json_object_get(g, "healthy");
            if (v != NULL && !json_is_boolean(v)) {
                rc = field_error(err, path, i, "healthy", "needs true or false");
                break;
            }
            o->healthy = v == NULL || json_is_true(v);
            for (size_t j = 0; j < i; j++)
                if (out[j].index == o->index || strcmp(out[j].uuid, o->uuid) == 0) {
                    rc = kgpu_error_set(err, KGPU_EPARSE,
                                        "%s: gpus[%zu] repeats the index or uuid of gpus[%zu]",
                                        path, i, j);
                    break;
                }
        }
    }
    if (rc != KGPU_OK) {
        free(out);
        goto out;
    }
    *gpus = out;
    *ngpus = (int)n;
out:
    return rc;
}

int kgpu_fake_gpus_parse(const char *buf, size_t len, const char *name, kgpu_gpu_info **gpus,
                         int *ngpus, kgpu_error *err)
{
    *gpus = NULL;
    *ngpus = 0;
    json_t *doc = kgpu_yaml_load(buf, len, name, err);
    if (doc == NULL)
        return err ? err->code : KGPU_EPARSE;
    int rc = from_doc(doc, name, gpus, ngpus, err);
    json_decref(doc);
    return rc;
}

int kgpu_fake_gpus_load(const char *path, kgpu_gpu_info **gpus, int *ngpus, kgpu_error *err)
{
    *gpus = NULL;
    *ngpus = 0;
    json_t *doc = kgpu_yaml_load_file(path, err);
    if (doc == NULL)
        return err ? err->code : KGPU_EPARSE;
    int rc = from_doc(doc, path, gpus, ngpus, err);
    json_decref(doc);
    return rc;
}
