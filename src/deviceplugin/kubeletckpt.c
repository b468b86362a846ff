/*
 * kubelet's device manager checkpoint (kubeletckpt.h): the pods kubelet
 * still counts as holding devices. kubelet drops a pod from it only once
 * the pod's containers are stopped (its device manager keeps the entries of
 * active pods), so an entry means "a container may still run". Pure: the
 * caller reads the file.
 */
#include <string.h>

#include "kubeletckpt.h"

#define UID_MAX 128 /* a pod UID is 36 characters; a longer string is not one */

int dp_kubelet_ckpt_parse(const char *buf, size_t len, const char *name, json_t **pods,
                          kgpu_error *err)
{
    *pods = NULL;
    json_error_t je;
    json_t *doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (doc == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: line %d: %s", name, je.line, je.text);
    int rc = 0;
    const json_t *data = json_object_get(doc, "Data");
    const json_t *entries = json_object_get(data, "PodDeviceEntries");
    json_t *out = json_object();
    if (!json_is_object(doc) || !json_is_object(data)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: no \"Data\" object: not kubelet's checkpoint",
                            name);
    } else if (entries != NULL && !json_is_null(entries) && !json_is_array(entries)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: Data.PodDeviceEntries: expected a list", name);
    } else if (out == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory reading %s", name);
    }
    for (size_t i = 0; rc == 0 && i < json_array_size(entries); i++) {
        const json_t *uid = json_object_get(json_array_get(entries, i), "PodUID");
        const char *s = json_string_value(uid);
        size_t n = s != NULL ? strnlen(s, UID_MAX + 1) : 0;
        /* A UID with a NUL inside would match a shorter folder name. */
        if (s == NULL || n == 0 || n > UID_MAX || n != json_string_length(uid))
            rc = kgpu_error_set(err, KGPU_EPARSE,
                                "%s: Data.PodDeviceEntries[%zu].PodUID: expected a pod UID", name,
                                i);
        else if (json_object_set(out, s, json_true()) != 0)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory reading %s", name);
    }
    json_decref(doc);
    if (rc != 0) {
        json_decref(out);
        return rc;
    }
    *pods = out;
    return 0;
}
