/*
 * The simulators' studies run one job per (row, seed) on a pool of
 * threads: each job once, the first failure stopping new ones. Jobs share
 * nothing mutable but what the caller's job function writes into its own
 * slot (the threading contract of kgpu_sim_run, kgpu_churn_run and
 * kgpu_autoscale_run: each run owns its cluster).
 */
#ifndef KGPU_CLI_JOBS_H
#define KGPU_CLI_JOBS_H

#include <jansson.h>
#include <stdbool.h>

#include "kgpu/error.h"

/* Monotonic seconds. */
double kgpu_now(void);

/* Runs job j of the study ctx; 0 or an error (err filled). */
typedef int (*kgpu_job_fn)(void *ctx, int j, kgpu_error *err);

/*
 * Runs fn(ctx, j) for j in 0..n on `threads` threads (<= 0: one per CPU;
 * never more than n). With `progress` the calling thread draws a bar on
 * stderr after the first second instead of running jobs. Returns 0, or
 * the first failure's code with its error in *err (jobs not yet started
 * are then skipped).
 */
int kgpu_jobs_run(int n, int threads, bool progress, kgpu_job_fn fn, void *ctx,
                  kgpu_error *err);

/* A study's --json document on stdout, as every simulator writes it (consumes root). */
void kgpu_study_print_json(json_t *root);

/* Flushes stdout: 0, or KGPU_EIO with "cannot write the results" in err. */
int kgpu_study_flush(kgpu_error *err);

#endif
