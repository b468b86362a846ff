/*
 * Fuzz target for the pod reader: a v1 Pod is JSON from kube-scheduler, so
 * any shape may arrive. Whatever kgpu_pod_from_json accepts must be requests
 * the core accepts too, and whatever it refuses must come with a reason.
 */
#include <stdint.h>
#include <stdlib.h>

#include "kgpu/model.h"
#include "podspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
