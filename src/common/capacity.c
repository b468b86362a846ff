/*
 * The capacity-type labels (capacity.h): each provider names spot capacity
 * its own way, so the table lists them all and the first match wins.
 */
#include <stddef.h>
#include <string.h>

#include "capacity.h"

bool kgpu_capacity_spot(const json_t *labels)
{
    static const struct {
        const char *key, *value;
    } spot[] = {
        {"kgpu.io/capacity-type", "spot"},
        {"karpenter.sh/capacity-type", "spot"},
        {"eks.amazonaws.com/capacityType", "SPOT"},
        {"cloud.google.com/gke-spot", "true"},
        {"cloud.google.com/gke-preemptible", "true"},
        {"kubernetes.azure.com/scalesetpriority", "spot"},
    };
    if (!json_is_object(labels))
        return false;
    for (size_t i = 0; i < sizeof(spot) / sizeof(spot[0]); i++) {
        const char *v = json_string_value(json_object_get(labels, spot[i].key));
        if (v != NULL && strcmp(v, spot[i].value) == 0)
            return true;
    }
    return false;
}

const char *kgpu_capacity_type(const json_t *labels)
{
    return kgpu_capacity_spot(labels) ? KGPU_CAPACITY_SPOT : KGPU_CAPACITY_ON_DEMAND;
}
