/*
 * Parallel runner for policy x seed simulations (see study.h for the
 * threading contract), on the studies' pool (jobs.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jobs.h"
#include "study.h"

int kgpu_study_init(kgpu_study *s, const kgpu_sim_input *in, const char *const *policies,
                    int npolicies, const uint64_t *seeds, int nseeds, double inflate,
                    kgpu_error *err)
{
    memset(s, 0, sizeof(*s));
    if (npolicies <= 0 || nseeds <= 0)
        return kgpu_error_set(err, KGPU_EINVAL, "a study needs at least one policy and one seed");
    for (int i = 0; i < npolicies; i++)
        if (kgpu_policy_find(policies[i]) == NULL)
            return kgpu_error_set(err, KGPU_ENOENT, "unknown policy '%s'", policies[i]);
    s->in = in;
    s->inflate = inflate;
    s->seeds = seeds;
    s->nseeds = nseeds;
    s->rows = calloc((size_t)npolicies, sizeof(*s->rows));
    if (s->rows == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    s->nrows = npolicies;
    for (int i = 0; i < npolicies; i++) {
        s->rows[i].policy = policies[i];
        s->rows[i].runs = calloc((size_t)nseeds, sizeof(*s->rows[i].runs));
        s->rows[i].wall_s = calloc((size_t)nseeds, sizeof(*s->rows[i].wall_s));
        if (s->rows[i].runs == NULL || s->rows[i].wall_s == NULL) {
            kgpu_study_free(s);
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        }
    }
    return 0;
}

void kgpu_study_free(kgpu_study *s)
{
    for (int i = 0; i < s->nrows; i++) {
        free(s->rows[i].runs);
        free(s->rows[i].wall_s);
    }
    free(s->rows);
    memset(s, 0, sizeof(*s));
}

/* Job j: row j / nseeds, seed j % nseeds (jobs.h). */
static int study_job(void *ctx, int j, kgpu_error *err)
{
    kgpu_study *s = ctx;
    kgpu_study_row *row = &s->rows[j / s->nseeds];
    int k = j % s->nseeds;
    kgpu_sim_config cfg = {.policy = row->policy,
                           .seed = s->seeds[k],
                           .inflate = s->inflate,
                           .random_ties = s->random_ties,
                           .online = s->online,
                           .extender_scores = s->extender_scores,
                           .k8s = s->k8s,
                           .allocator = s->allocator,
                           .consolidate = s->consolidate,
                           .restartable = s->restartable};
    double t0 = kgpu_now();
    int rc = kgpu_sim_run(s->in, &cfg, &row->runs[k], err);
    row->wall_s[k] = kgpu_now() - t0;
    return rc;
}

static void average(kgpu_study *s)
{
    for (int r = 0; r < s->nrows; r++) {
        kgpu_study_row *row = &s->rows[r];
        double n = s->nseeds;
        row->alloc_pct_100 = row->alloc_pct_130 = row->unallocated_gpus = 0;
        row->frag_ratio_pct_90 = row->pods_failed = row->pods = row->wall_s_total = 0;
        row->constrained_pods = row->constrained_failed = 0;
        row->share_compute_gpus = row->share_gpus = row->share_gpus_bound = 0;
        row->share_pods = row->share_pods_failed = 0;
        row->share_gpus_bfd = 0;
        row->moves = row->consolidated = 0;
        memset(row->curve, 0, sizeof(row->curve));
        for (int k = 0; k < s->nseeds; k++) {
            const kgpu_sim_result *x = &row->runs[k];
            row->alloc_pct_100 += x->alloc_pct_100 / n;
            row->alloc_pct_130 += x->alloc_pct_final / n;
            row->unallocated_gpus += x->unallocated_gpus / n;
            row->frag_ratio_pct_90 += x->frag_ratio_pct_90 / n;
            row->pods_failed += (double)x->pods_failed / n;
            row->pods += (double)x->pods / n;
            row->constrained_pods += (double)x->constrained_pods / n;
            row->constrained_failed += (double)x->constrained_failed / n;
            row->share_pods += (double)x->share_pods / n;
            row->share_pods_failed += (double)x->share_pods_failed / n;
            row->share_compute_gpus += x->share_compute_gpus / n;
            row->share_gpus += (double)x->share_gpus / n;
            row->share_gpus_bound += (double)x->share_gpus_bound / n;
            row->share_gpus_bfd += (double)x->share_gpus_bfd / n;
            row->moves += (double)x->moves / n;
            row->consolidated += (double)x->consolidated / n;
            row->wall_s_total += row->wall_s[k];
            for (int i = 0; i <= KGPU_SIM_CURVE_MAX; i++)
                row->curve[i] += x->curve[i] / n;
        }
    }
}

int kgpu_study_run(kgpu_study *s, kgpu_error *err)
{
    double t0 = kgpu_now();
    int rc = kgpu_jobs_run(s->nrows * s->nseeds, s->threads, s->progress, study_job, s, err);
    s->elapsed_s = kgpu_now() - t0;
    if (rc != 0)
        return rc;
    average(s);
    return 0;
}
