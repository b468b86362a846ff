/*
 * kubelet's device manager checkpoint (<plugin-dir>/kubelet_internal_checkpoint),
 * read by the API thread (apithread.c) to know which pods kubelet still
 * counts as running: a gone pod's folder is removed only once kubelet no
 * longer lists the pod, that is once its containers are stopped.
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

#endif
