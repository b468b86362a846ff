/*
 * Fuzz target for kubelet's device manager checkpoint as the device plugin
 * reads it before removing a gone pod's folder (dp_kubelet_ckpt_parse).
 * Whatever it accepts is an object of pod UIDs, each 1..128 bytes with no
 * NUL and occurring in the input; whatever it refuses gives no object and a
 * reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kubeletckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *pods = (json_t *)data; /* must be overwritten */
    kgpu_error err = {0};
    int rc = dp_kubelet_ckpt_parse((const char *)data, size, "fuzz", &pods, &err);
    if (rc != 0) {
        if (pods != NULL || err.msg[0] == '\0')
            abort();
        return 0;
    }
    if (!json_is_object(pods))
        abort();
    const char *uid;
    json_t *v;
    json_object_foreach(pods, uid, v)
    {
        size_t n = strlen(uid);
        if (n == 0 || n > 128 || !json_is_true(v))
            abort();
    }
    json_decref(pods);
    return 0;
}
