/*
 * A node's capacity type, spot (preemptible) or on-demand, from the labels
 * the clouds' and autoscalers' node pools put on their nodes. One table,
 * read by kgpu-expander (a node group's template) and kgpu-extender (the
 * cost of GPU-seconds on a node). Pure: no I/O.
 */
#ifndef KGPU_CAPACITY_H
#define KGPU_CAPACITY_H

#include <jansson.h>
#include <stdbool.h>

#define KGPU_CAPACITY_SPOT      "spot"
#define KGPU_CAPACITY_ON_DEMAND "on-demand"

/*
 * Whether `labels` (a node's metadata.labels object; NULL or not an object
 * counts as none) say spot capacity: one of kgpu.io/capacity-type=spot,
 * karpenter.sh/capacity-type=spot, eks.amazonaws.com/capacityType=SPOT,
 * cloud.google.com/gke-spot=true, cloud.google.com/gke-preemptible=true,
 * kubernetes.azure.com/scalesetpriority=spot. These labels are written by
 * the node's provisioner or the operator, never by a tenant.
 */
bool kgpu_capacity_spot(const json_t *labels);

/* KGPU_CAPACITY_SPOT or KGPU_CAPACITY_ON_DEMAND for `labels`, as above (static strings). */
const char *kgpu_capacity_type(const json_t *labels);

#endif
