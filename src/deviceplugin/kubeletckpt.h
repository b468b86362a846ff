/*
 * kubelet's device manager checkpoint (<plugin-dir>/kubelet_internal_checkpoint),
 * read by the API thread (apithread.c) to know which pods kubelet still
 * counts as running: a gone pod's folder is removed only once kubelet no
 * longer lists the pod, that is once its containers are stopped; and by the
 * watcher, to know which container kubelet gave a MIG device (the extender
 * assigns none, so no pod annotation says).
 */
#ifndef KGPU_DP_KUBELETCKPT_H
#define KGPU_DP_KUBELETCKPT_H

#include <jansson.h>
#include <stddef.h>

#include "kgpu/error.h"

/* The checkpoint's name in kubelet's device-plugin folder. */
#define DP_KUBELET_CKPT_NAME "kubelet_internal_checkpoint"
/* Larger is refused: 110 pods of a few containers take well under 1 MiB. */
#define DP_KUBELET_CKPT_MAX (16u << 20)

/*
 * Parses the checkpoint's JSON ({"Data": {"PodDeviceEntries": [{"PodUID":
 * ...}, ...], ...}, "Checksum": ...}, as kubelet has written it since 1.20;
 * older lists of DeviceIDs are read the same, only PodUID matters) into
 * *pods: a new JSON object (caller decrefs) whose keys are the listed pod
 * UIDs. Anything else is KGPU_EPARSE with a reason naming `name`; then
 * *pods is NULL, and the caller removes nothing.
 */
int dp_kubelet_ckpt_parse(const char *buf, size_t len, const char *name, json_t **pods,
                          kgpu_error *err);

/* One device kubelet's checkpoint says a container holds. */
typedef struct dp_ckpt_holder {
    char device[96];  /* the device ID ("MIG-...") */
    char pod_uid[64]; /* "" never: entries without one are refused */
    char container[64];
} dp_ckpt_holder;

/*
 * The holders of the device IDs that start with `prefix` ("MIG-"), from the
 * same checkpoint: each entry's PodUID, ContainerName and DeviceIDs (a map
 * of NUMA node to IDs since kubelet 1.20, a plain list before). Other
 * devices, and IDs too long to be ours, are passed over. *n <= cap; more is
 * KGPU_ERANGE. A malformed entry is KGPU_EPARSE naming `name` and the
 * entry; then *n is 0.
 */
int dp_kubelet_ckpt_holders(const char *buf, size_t len, const char *name, const char *prefix,
                            dp_ckpt_holder *out, int cap, int *n, kgpu_error *err);

#endif
