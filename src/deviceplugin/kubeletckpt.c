/*
 * kubelet's device manager checkpoint (kubeletckpt.h): the pods kubelet
 * still counts as holding devices. kubelet drops a pod from it only once
 * the pod's containers are stopped (its device manager keeps the entries of
 * active pods), so an entry means "a container may still run". Pure: the
 * caller reads the file.
 */
#include <stdbool.h>
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

/* Copies a JSON string into out when it fits whole (and holds no NUL); false otherwise. */
static bool copy_str(const json_t *v, char *out, size_t cap)
{
    const char *s = json_string_value(v);
    if (s == NULL || json_string_length(v) >= cap || strlen(s) != json_string_length(v))
        return false;
    memcpy(out, s, json_string_length(v) + 1);
    return true;
}

/* Adds the IDs of `ids` (an array) with the prefix as held by (uid, container). */
static int add_ids(const json_t *ids, const char *prefix, const dp_ckpt_holder *who,
                   dp_ckpt_holder *out, int cap, int *n)
{
    for (size_t k = 0; k < json_array_size(ids); k++) {
        const char *id = json_string_value(json_array_get(ids, k));
        if (id == NULL || strncmp(id, prefix, strlen(prefix)) != 0)
            continue;
        if (*n >= cap)
            return KGPU_ERANGE;
        out[*n] = *who;
        if (!copy_str(json_array_get(ids, k), out[*n].device, sizeof(out[*n].device)))
            continue; /* too long to be a device kgpu lists */
        (*n)++;
    }
    return 0;
}

int dp_kubelet_ckpt_holders(const char *buf, size_t len, const char *name, const char *prefix,
                            dp_ckpt_holder *out, int cap, int *n, kgpu_error *err)
{
    *n = 0;
    json_t *pods = NULL;
    int rc = dp_kubelet_ckpt_parse(buf, len, name, &pods, err);
    json_decref(pods);
    if (rc != 0)
        return rc;
    json_t *doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL);
    const json_t *entries = json_object_get(json_object_get(doc, "Data"), "PodDeviceEntries");
    for (size_t i = 0; rc == 0 && i < json_array_size(entries); i++) {
        const json_t *e = json_array_get(entries, i);
        const json_t *ids = json_object_get(e, "DeviceIDs");
        dp_ckpt_holder who = {0};
        if (!json_is_object(e) || !copy_str(json_object_get(e, "PodUID"), who.pod_uid,
                                            sizeof(who.pod_uid)) ||
            !copy_str(json_object_get(e, "ContainerName"), who.container, sizeof(who.container)) ||
            !(json_is_object(ids) || json_is_array(ids))) {
            rc = kgpu_error_set(err, KGPU_EPARSE,
                                "%s: Data.PodDeviceEntries[%zu]: expected PodUID, ContainerName "
                                "and DeviceIDs",
                                name, i);
            break;
        }
        if (json_is_array(ids)) {
            rc = add_ids(ids, prefix, &who, out, cap, n);
        } else {
            const char *numa;
            const json_t *list;
            json_object_foreach((json_t *)ids, numa, list)
            {
                if (rc == 0 && !json_is_array(list))
                    rc = kgpu_error_set(err, KGPU_EPARSE,
                                        "%s: Data.PodDeviceEntries[%zu].DeviceIDs[%.16s]: "
                                        "expected a list",
                                        name, i, numa);
                else if (rc == 0)
                    rc = add_ids(list, prefix, &who, out, cap, n);
            }
        }
        if (rc == KGPU_ERANGE)
            rc = kgpu_error_set(err, KGPU_ERANGE, "%s: more than %d %s devices held", name, cap,
                                prefix);
    }
    json_decref(doc);
    if (rc != 0)
        *n = 0;
    return rc;
}
