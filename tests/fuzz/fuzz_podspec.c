/*
 * Fuzz target for the pod reader: a v1 Pod is JSON from kube-scheduler, so
 * any shape may arrive. Whatever kgpu_pod_from_json accepts must be requests
 * the core accepts too, and whatever it refuses must come with a reason.
 * The pod cut down by kgpu_pod_json_trim (as the extender keeps listed pods)
 * must read exactly as the whole one: same answer, same error message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kgpu/model.h"
#include "podspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool requests_equal(const kgpu_request *a, const kgpu_request *b)
{
    return a->cpu_milli == b->cpu_milli && a->memory_mib == b->memory_mib &&
           a->gpu_count == b->gpu_count && a->gpu_milli == b->gpu_milli &&
           a->gpu_memory_mib == b->gpu_memory_mib && a->exclusive == b->exclusive &&
           a->nallow == b->nallow && a->nexclude == b->nexclude && a->shape == b->shape &&
           a->models == b->models;
}

/* Field by field: the pods' pointers point into themselves, so no memcmp. */
static bool pods_equal(const kgpu_pod *a, const kgpu_pod *b)
{
    if (strcmp(a->ns, b->ns) != 0 || strcmp(a->name, b->name) != 0 || strcmp(a->uid, b->uid) != 0 ||
        strcmp(a->node, b->node) != 0 || strcmp(a->phase, b->phase) != 0 ||
        a->cpu_milli != b->cpu_milli || a->memory_mib != b->memory_mib || a->nparts != b->nparts ||
        a->nallow != b->nallow || a->nexclude != b->nexclude || strcmp(a->policy, b->policy) != 0 ||
        a->has_assignment != b->has_assignment || a->terminal != b->terminal)
        return false;
    for (int i = 0; i < a->nparts; i++)
        if (strcmp(a->parts[i].container, b->parts[i].container) != 0 ||
            a->parts[i].init != b->parts[i].init ||
            !requests_equal(&a->parts[i].req, &b->parts[i].req))
            return false;
    for (int i = 0; i < a->nallow; i++)
        if (strcmp(a->allow[i], b->allow[i]) != 0)
            return false;
    for (int i = 0; i < a->nexclude; i++)
        if (strcmp(a->exclude[i], b->exclude[i]) != 0)
            return false;
    return true;
}

/* The trimmed copy of v must read as v did (rc, message, pod). */
static void check_trim(const json_t *v, int rc, const kgpu_error *err, const kgpu_pod *pod)
{
    static kgpu_pod again;
    json_t *t = json_deep_copy(v);
    if (t == NULL)
        return;
    kgpu_pod_json_trim(t);
    kgpu_error e2;
    kgpu_error_clear(&e2);
    int rc2 = kgpu_pod_from_json(t, 1024, &again, &e2);
    json_decref(t);
    if (rc2 != rc || strcmp(e2.msg, err->msg) != 0 || (rc == KGPU_OK && !pods_equal(pod, &again)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    json_t *v =
        json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (v == NULL)
        return 0;
    static kgpu_pod pod; /* large; one fuzzing thread */
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = kgpu_pod_from_json(v, 1024, &pod, &err);
    check_trim(v, rc, &err, &pod);
    json_decref(v);
    if (rc != KGPU_OK) {
        if (err.code != rc || err.msg[0] == '\0')
            abort(); /* a refusal without a reason */
        return 0;
    }
    if (pod.nparts < 0 || pod.nparts > KGPU_MAX_PARTS || pod.cpu_milli < 0 || pod.memory_mib < 0)
        abort();
    for (int i = 0; i < pod.nparts; i++) {
        const kgpu_request *req = &pod.parts[i].req;
        /* The parser promised valid requests, each with GPU demand. */
        if (kgpu_request_validate(req, &err) != KGPU_OK || req->gpu_count <= 0)
            abort();
        if (req->allow != pod.allow || req->nallow != pod.nallow || req->exclude != pod.exclude ||
            req->nexclude != pod.nexclude)
            abort();
        if (i > 0 && (req->cpu_milli != 0 || req->memory_mib != 0))
            abort();
    }
    if (pod.nparts > 0 && (pod.parts[0].req.cpu_milli != pod.cpu_milli ||
                           pod.parts[0].req.memory_mib != pod.memory_mib))
        abort();
    return 0;
}
