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

/* One item of the list; `i` is its position, for errors. */
static int gpu_from_json(json_t *g, const char *path, size_t i, kgpu_gpu_info *o, kgpu_error *err)
{
    if (!json_is_object(g))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: gpus[%zu]: not a mapping", path, i);
    json_t *v = json_object_get(g, "index");
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1023)
        return field_error(err, path, i, "index", "needs an integer 0..1023");
    o->index = (int)json_integer_value(v);
    const char *s = json_string_value(json_object_get(g, "uuid"));
    if (s == NULL || !*s || strlen(s) >= KGPU_UUID_MAX)
        return field_error(err, path, i, "uuid", "needs a non-empty string (< 80 bytes)");
    snprintf(o->uuid, sizeof(o->uuid), "%s", s);
    s = json_string_value(json_object_get(g, "model"));
    if (s == NULL || !*s || strlen(s) >= KGPU_MODEL_NAME_MAX)
        return field_error(err, path, i, "model", "needs a non-empty string (< 64 bytes)");
    snprintf(o->model, sizeof(o->model), "%s", s);
    v = json_object_get(g, "memory_mib");
    if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
        json_integer_value(v) > (INT64_C(1) << 30))
        return field_error(err, path, i, "memory_mib", "needs a positive integer");
    o->memory_mib = json_integer_value(v);
    v = json_object_get(g, "numa");
    if (v != NULL &&
        (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > 1023))
        return field_error(err, path, i, "numa", "needs an integer -1..1023");
    o->numa = v != NULL ? (int)json_integer_value(v) : -1;
    v = json_object_get(g, "healthy");
    if (v != NULL && !json_is_boolean(v))
        return field_error(err, path, i, "healthy", "needs true or false");
    o->healthy = v == NULL || json_is_true(v);
    return KGPU_OK;
}

/* Validates `doc` into *gpus and drops it; `path` names the source in errors. */
static int from_doc(json_t *doc, const char *path, kgpu_gpu_info **gpus, int *ngpus,
                    kgpu_error *err)
{
    *gpus = NULL;
    *ngpus = 0;
    if (doc == NULL)
        return err ? err->code : KGPU_EPARSE;
    json_t *list = json_object_get(doc, "gpus");
    size_t n = json_array_size(list);
    kgpu_gpu_info *out = NULL;
    int rc = KGPU_OK;
    if (!json_is_array(list))
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: needs a top-level `gpus:` list", path);
    else if (n < 1 || n > KGPU_MAX_GPUS_PER_NODE)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s: %zu GPUs listed; 1 to %d wanted", path, n,
                            KGPU_MAX_GPUS_PER_NODE);
    else if ((out = calloc(n, sizeof(*out))) == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == KGPU_OK; i++) {
        rc = gpu_from_json(json_array_get(list, i), path, i, &out[i], err);
        for (size_t j = 0; j < i && rc == KGPU_OK; j++)
            if (out[j].index == out[i].index || strcmp(out[j].uuid, out[i].uuid) == 0)
                rc = kgpu_error_set(err, KGPU_EPARSE,
                                    "%s: gpus[%zu] repeats the index or uuid of gpus[%zu]", path, i,
                                    j);
    }
    json_decref(doc);
    if (rc != KGPU_OK) {
        free(out);
        return rc;
    }
    *gpus = out;
    *ngpus = (int)n;
    return KGPU_OK;
}

int kgpu_fake_gpus_parse(const char *buf, size_t len, const char *name, kgpu_gpu_info **gpus,
                         int *ngpus, kgpu_error *err)
{
    return from_doc(kgpu_yaml_load(buf, len, name, err), name, gpus, ngpus, err);
}

int kgpu_fake_gpus_load(const char *path, kgpu_gpu_info **gpus, int *ngpus, kgpu_error *err)
{
    return from_doc(kgpu_yaml_load_file(path, err), path, gpus, ngpus, err);
}
