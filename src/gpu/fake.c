/* The fake GPU inventory: a file in the cluster file's `gpus:` form. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "kgpu/model.h"
#include "podspec.h"
#include "yamljson.h"

/* One item of the list; `i` is its position, for errors. */
static int gpu_from_json(json_t *g, const char *path, size_t i, kgpu_gpu_info *o, kgpu_error *err)
{
    char where[1200], uuid[KGPU_UUID_MAX], model[KGPU_MODEL_NAME_MAX];
    snprintf(where, sizeof(where), "%s: gpus[%zu]", path, i);
    kgpu_gpu_spec spec;
    int rc = kgpu_gpu_item_parse(g, where, (int)i, true, true, &spec, uuid, model, err);
    if (rc != 0)
        return rc;
    memset(o, 0, sizeof(*o));
    o->index = spec.index;
    snprintf(o->uuid, sizeof(o->uuid), "%s", uuid);
    snprintf(o->model, sizeof(o->model), "%s", model);
    o->memory_mib = spec.memory_mib;
    o->numa = spec.numa;
    o->healthy = spec.healthy;
    o->mig_mode = -1; /* the fake inventory says nothing of MIG */
    /* Optional, and only read for the DRA slice: a value that is no version is passed over. */
    const char *cc = json_string_value(json_object_get(g, "compute_capability"));
    bool cc_ok = cc != NULL && strlen(cc) < KGPU_GPU_CC_MAX - 4;
    for (const char *p = cc; cc_ok && *p; p++)
        cc_ok = (*p >= '0' && *p <= '9') || *p == '.';
    if (cc_ok)
        snprintf(o->compute_capability, sizeof(o->compute_capability), "%s", cc);
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
