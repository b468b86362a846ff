/* The studies' thread pool (jobs.h). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jobs.h"

#define MAX_THREADS 256

typedef struct pool {
    int n;
    kgpu_job_fn fn;
    void *ctx;
    atomic_int next;   /* next job to take */
    atomic_int done;   /* jobs finished */
    atomic_int failed; /* 0 -> 1 once, by the worker that writes first_err */
    kgpu_error first_err;
} pool;

double kgpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        int j = atomic_fetch_add(&p->next, 1);
        if (j >= p->n || atomic_load(&p->failed))
            break;
        kgpu_error err;
        kgpu_error_clear(&err);
        int rc = p->fn(p->ctx, j, &err);
        int expected = 0;
        if (rc != 0 && atomic_compare_exchange_strong(&p->failed, &expected, 1)) {
            if (err.code == 0)
                err.code = rc;
            p->first_err = err;
        }
        atomic_fetch_add(&p->done, 1);
    }
    return NULL;
}

/* Only after a second, and only redrawing while something changed. */
static void draw_progress(pool *p, double t0)
{
    int shown = -1;
    while (atomic_load(&p->done) < p->n && !atomic_load(&p->failed)) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        int d = atomic_load(&p->done);
        if (kgpu_now() - t0 < 1.0 || d == shown)
            continue;
        shown = d;
        int width = 30, fill = p->n ? d * width / p->n : width;
        fprintf(stderr, "\r[%.*s%*s] %d/%d runs, %.0f s", fill, "##############################",
                width - fill, "", d, p->n, kgpu_now() - t0);
        fflush(stderr);
    }
    if (shown >= 0)
        fprintf(stderr, "\r%*s\r", 60, "");
}

int kgpu_jobs_run(int n, int threads, bool progress, kgpu_job_fn fn, void *ctx, kgpu_error *err)
{
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus > 0 ? (int)cpus : 1;
    }
    if (threads > n)
        threads = n > 0 ? n : 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    pool p = {.n = n, .fn = fn, .ctx = ctx};
    atomic_init(&p.next, 0);
    atomic_init(&p.done, 0);
    atomic_init(&p.failed, 0);
    pthread_t tid[MAX_THREADS];
    double t0 = kgpu_now();
    /* Without a bar the calling thread is one of the workers. */
    int spawn = progress ? threads : threads - 1, started = 0;
    for (; started < spawn; started++)
        if (pthread_create(&tid[started], NULL, worker, &p) != 0)
            break; /* fewer workers: the calling thread runs every job left */
    if (progress && started > 0)
        draw_progress(&p, t0);
    else
        worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    if (atomic_load(&p.failed)) {
        if (err != NULL)
            *err = p.first_err;
        return p.first_err.code;
    }
    return 0;
}

void kgpu_study_print_json(json_t *root)
{
    json_dumpf(root, stdout, JSON_PRESERVE_ORDER | JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    fputc('\n', stdout);
    json_decref(root);
}

int kgpu_study_flush(kgpu_error *err)
{
    if (fflush(stdout) != 0)
        return kgpu_error_set(err, KGPU_EIO, "cannot write the results: %s", strerror(errno));
    return 0;
}
