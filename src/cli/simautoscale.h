/*
 * `kgpu simulate --autoscale`: the trace on autoscaled node groups, per
 * expander and seed, medians printed as a table or JSON (docs/autoscaling.md).
 */
#ifndef KGPU_SIMAUTOSCALE_H
#define KGPU_SIMAUTOSCALE_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/autoscale.h"

typedef struct kgpu_as_opts {
    const char *nodes_path, *pods_path, *prices_path;
    const char *expanders; /* comma list of kgpu, least-waste, price, random, fixed */
    const char *spot_qos;  /* comma list of qos values whose pods tolerate spot */
    const uint64_t *seeds;
    int nseeds, threads;
    kgpu_autoscale_config base; /* times, threshold, spot rate, speedup, inflate */
    bool json, timing;
} kgpu_as_opts;

/* The whole run; returns the exit status (0, 1 failure, 2 usage). */
int kgpu_simulate_autoscale(const kgpu_as_opts *o);

#endif
