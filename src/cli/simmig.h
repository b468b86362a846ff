/*
 * `kgpu simulate --mig MODELS`: the trace's GPUs as MIG GPUs of each model
 * and its GPU requests as MIG instances, placed by first fit in NVML's
 * order, by kgpu's slice order, by kgpu's slice order with the extender's
 * node scores, and by free best fit, against what an offline packing could
 * place (include/kgpu/migsim.h); medians over seeds as a table per model
 * or JSON (docs/policy.md "MIG"). With --churn, the file's pods at their
 * times instead, each lost when it fits nowhere.
 */
#ifndef KGPU_SIMMIG_H
#define KGPU_SIMMIG_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/churn.h"
#include "kgpu/sim.h"

typedef struct kgpu_mig_opts {
    const kgpu_sim_input *in;   /* the traces, loaded (kgpu_load_input) */
    const kgpu_churn_input *ch; /* with --churn: the pods' times; NULL: arrivals only */
    double speedup;             /* with ch */
    const char *pods_path;
    const char *models; /* comma list of kgpu_mig_model names */
    const uint64_t *seeds;
    int nseeds, threads;
    double inflate;
    bool json, timing;
} kgpu_mig_opts;

/* The whole run; returns the exit status (0, 1 failure, 2 usage). */
int kgpu_simulate_mig(const kgpu_mig_opts *o);

#endif
