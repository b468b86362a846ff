/*
 * A study: several policies x several seeds of the trace simulator, run in
 * parallel on a small worker pool, averaged per policy.
 *
 * Threads: the caller's thread owns the study and prints progress; each
 * worker runs whole (policy, seed) jobs taken from an atomic counter and
 * writes only that job's result slot. The prepared input is shared read-only.
 */
#ifndef KGPU_STUDY_H
#define KGPU_STUDY_H

#include <stdbool.h>
#include <stdint.h>

#include "jobs.h" /* kgpu_now */
#include "kgpu/sim.h"

typedef struct kgpu_study_row {
    const char *policy;    /* borrowed */
    kgpu_sim_result *runs; /* one per seed */
    double *wall_s;        /* per seed */
    double alloc_pct_100, alloc_pct_130, unallocated_gpus, frag_ratio_pct_90, pods_failed, pods;
    double constrained_pods, constrained_failed;
    double share_pods, share_pods_failed, share_compute_gpus, share_gpus, share_gpus_bound,
        share_gpus_bfd; /* see kgpu_sim_result */
    double curve[KGPU_SIM_CURVE_MAX + 1];
    double moves, consolidated; /* see kgpu_sim_result */
    double wall_s_total; /* sum over seeds of the run times */
} kgpu_study_row;

typedef struct kgpu_study {
    const kgpu_sim_input *in; /* borrowed */
    double inflate;
    const uint64_t *seeds; /* borrowed */
    int nseeds;
    kgpu_study_row *rows; /* owned; one per policy */
    int nrows;
    int threads;      /* workers; <= 0 means one per online CPU */
    bool progress;    /* draw a progress line on stderr */
    bool random_ties; /* see kgpu_sim_config */
    bool online;      /* see kgpu_sim_config */
    int extender_scores; /* see kgpu_sim_config */
    const kgpu_sim_k8s *k8s; /* see kgpu_sim_config; borrowed */
    kgpu_sim_allocator allocator; /* see kgpu_sim_config */
    int consolidate;              /* see kgpu_sim_config */
    const bool *restartable;      /* see kgpu_sim_config; borrowed */
    double elapsed_s; /* wall time of the whole study */
} kgpu_study;

/* Sets up rows for `policies` (borrowed strings). Free with kgpu_study_free. */
int kgpu_study_init(kgpu_study *s, const kgpu_sim_input *in, const char *const *policies,
                    int npolicies, const uint64_t *seeds, int nseeds, double inflate,
                    kgpu_error *err);

/* Runs every job and fills the means. The first failing job's error is returned. */
int kgpu_study_run(kgpu_study *s, kgpu_error *err);

void kgpu_study_free(kgpu_study *s);

#endif
