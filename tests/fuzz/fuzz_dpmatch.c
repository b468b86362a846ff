/*
 * Fuzz target for what the device plugin reads from the API server at each
 * Allocate. The first byte picks the input (byte % 3): 0 a pod's
 * kgpu.io/assignment annotation, 1 its kgpu.io/allocating progress, 2 a
 * whole pod list (JSON array of pods, or a single pod). The matcher then
 * runs for every resource and a few counts; whatever it accepts must make a
 * sane container answer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define UUID0 "GPU-aaaaaaaa-0000-4000-8000-000000000000"

static const char pod_template[] =
    "{\"metadata\":{\"name\":\"p\",\"namespace\":\"ns\",\"uid\":\"u-1\",\"annotations\":{"
    "\"kgpu.io/node\":\"n\",\"kgpu.io/assignment\":\"[{\\\"container\\\":\\\"main\\\","
    "\\\"gpus\\\":[{\\\"index\\\":0,\\\"uuid\\\":\\\"" UUID0 "\\\",\\\"milli\\\":300,"
    "\\\"memory_mib\\\":2048}],\\\"exclusive\\\":false}]\"}},"
    "\"spec\":{\"nodeName\":\"n\",\"initContainers\":[{\"name\":\"init\",\"resources\":{"
    "\"limits\":{\"kgpu.io/gpu-mem\":\"1\"}}}],\"containers\":[{\"name\":\"main\","
    "\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"2\",\"kgpu.io/gpu-core\":\"30\"}}}]}}";

static void check(const json_t *items)
{
    contract_inventory inv;
    memset(&inv, 0, sizeof(inv));
    inv.ngpus = 1;
    inv.unit_mib = 1024;
    strcpy(inv.gpus[0].uuid, UUID0);
    strcpy(inv.gpus[0].model, "T4");
    inv.gpus[0].memory_mib = 15360;
    inv.gpus[0].healthy = true;
    unsigned all = (1u << DP_NRES) - 1;
    for (int r = 0; r < DP_NRES; r++)
        for (int64_t count = 1; count <= 4; count++) {
            dp_match m;
            kgpu_error err = {0};
            if (dp_match_find(items, "n", (dp_res)r, count, all, 1024, &m, &err) != 0) {
                if (err.msg[0] == '\0')
                    abort(); /* every refusal says why */
                continue;
            }
            if (m.t.container[0] == '\0' || m.t.ngpus < 0 || m.t.ngpus > KGPU_MAX_GPUS_PER_NODE ||
                m.count != count || strstr(m.progress, m.t.container) == NULL)
                abort();
            char *text = contract_limits_text(&m.t);
            if (text == NULL || strncmp(text, "# kgpu limits v1\n", 17) != 0)
                abort();
            free(text);
            contract_paths paths = {"/nonexistent", NULL, NULL};
            contract_response resp;
            dp_cdi cdi = {"nvidia.com/gpu", count % 2 == 0};
            dp_response_of(&m, &inv, &paths, &cdi, &resp);
            if (resp.ncdi != (m.primary ? m.t.ngpus : 0))
                abort(); /* one CDI device per GPU, on the resource that carries the answer */
            /* Limits and accounting, and each GPU's schedule where the share is of compute. */
            int scheds = 0;
            for (int i = 0; i < m.t.ngpus; i++)
                scheds += contract_sched_shared(&m.t, i);
            if (m.primary && m.t.ngpus > 0 && resp.nmounts != 2 + scheds)
                abort();
            for (int i = 2; i < resp.nmounts; i++)
                if (resp.mounts[i].read_only ||
                    strncmp(resp.mounts[i].container_path, CONTRACT_SCHED_PATH "/",
                            sizeof(CONTRACT_SCHED_PATH)) != 0)
                    abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int mode = data[0] % 3;
    char *text = malloc(size);
    if (text == NULL)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    json_t *items = NULL;
    if (mode == 2) {
        json_error_t je;
        json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
        if (json_is_object(v)) {
            items = json_array();
            json_array_append_new(items, v);
        } else {
            items = v;
        }
    } else {
        json_error_t je;
        json_t *pod = json_loads(pod_template, 0, &je);
        if (pod == NULL)
            abort();
        json_t *ann = json_object_get(json_object_get(pod, "metadata"), "annotations");
        json_object_set_new(ann, mode == 0 ? "kgpu.io/assignment" : "kgpu.io/allocating",
                            json_string(text));
        items = json_array();
        json_array_append_new(items, pod);
    }
    check(items);
    json_decref(items);
    free(text);
    return 0;
}
