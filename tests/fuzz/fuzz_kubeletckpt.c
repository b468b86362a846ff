/*
 * Fuzz target for kubelet's device manager checkpoint as the device plugin
 * reads it before removing a gone pod's folder (dp_kubelet_ckpt_parse).
 * Whatever it accepts is an object of pod UIDs, each 1..128 bytes with no
 * NUL and occurring in the input; whatever it refuses gives no object and a
 * reason. The watcher's reading of the same file (dp_kubelet_ckpt_holders,
 * which MIG device each container holds) accepts only what the first does,
 * and each holder it gives is a prefixed device of a named container.
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
    dp_ckpt_holder held[8];
    int nheld = -1;
    kgpu_error herr = {0};
    int hrc =
        dp_kubelet_ckpt_holders((const char *)data, size, "fuzz", "MIG-", held, 8, &nheld, &herr);
    if (nheld < 0 || nheld > 8 || (hrc != 0 && (nheld != 0 || herr.msg[0] == '\0')) ||
        (rc != 0 && hrc == 0))
        abort();
    for (int i = 0; i < nheld; i++)
        if (strncmp(held[i].device, "MIG-", 4) != 0 || held[i].pod_uid[0] == '\0' ||
            strnlen(held[i].container, sizeof(held[i].container)) == sizeof(held[i].container))
            abort();
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
