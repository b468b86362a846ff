/*
 * Parallel runner for policy x seed simulations (see study.h for the
 * threading contract). Workers share nothing mutable but two atomic counters.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "study.h"

double kgpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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

typedef struct study_shared {
    kgpu_study *s;
    atomic_int next; /* next job to take */
    atomic_int done; /* jobs finished */
    atomic_int failed;
    kgpu_error first_err; /* written once, by the worker that sets `failed` 0 -> 1 */
} study_shared;

static void *worker(void *arg)
{
    study_shared *sh = arg;
    kgpu_study *s = sh->s;
    int jobs = s->nrows * s->nseeds;
    for (;;) {
        int j = atomic_fetch_add(&sh->next, 1);
        if (j >= jobs || atomic_load(&sh->failed))
            break;
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
        kgpu_error err;
        kgpu_error_clear(&err);
        double t0 = kgpu_now();
        int rc = kgpu_sim_run(s->in, &cfg, &row->runs[k], &err);
        row->wall_s[k] = kgpu_now() - t0;
        if (rc != 0) {
            int expected = 0;
            if (atomic_compare_exchange_strong(&sh->failed, &expected, 1))
                sh->first_err = err;
        }
        atomic_fetch_add(&sh->done, 1);
    }
    return NULL;
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
    int jobs = s->nrows * s->nseeds;
    int threads = s->threads;
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus > 0 ? (int)cpus : 1;
    }
    if (threads > jobs)
        threads = jobs;
    study_shared sh;
    memset(&sh, 0, sizeof(sh));
    sh.s = s;
    atomic_init(&sh.next, 0);
    atomic_init(&sh.done, 0);
    atomic_init(&sh.failed, 0);
    pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
    if (tids == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    double t0 = kgpu_now();
    int started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, worker, &sh) != 0)
            break;
    if (started == 0) {
        worker(&sh); /* no threads to be had: do the work here */
    } else if (s->progress) {
        /* Only after a second, and only redrawing while something changed. */
        int shown = -1;
        while (atomic_load(&sh.done) < jobs && !atomic_load(&sh.failed)) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            int d = atomic_load(&sh.done);
            if (kgpu_now() - t0 < 1.0 || d == shown)
                continue;
            shown = d;
            int width = 30, fill = jobs ? d * width / jobs : width;
            fprintf(stderr, "\r[%.*s%*s] %d/%d runs, %.0f s", fill,
                    "##############################", width - fill, "", d, jobs, kgpu_now() - t0);
            fflush(stderr);
        }
        if (shown >= 0)
            fprintf(stderr, "\r%*s\r", 60, "");
    }
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    s->elapsed_s = kgpu_now() - t0;
    if (atomic_load(&sh.failed)) {
        if (err != NULL)
            *err = sh.first_err;
        return sh.first_err.code ? sh.first_err.code : KGPU_EINVAL;
    }
    average(s);
    return 0;
}
