/*
 * The watcher thread: every interval it asks NVML which processes use each
 * GPU and how much, maps each process to its pod's container through the
 * kernel's cgroup record, compares the container's total with the share in
 * its limits file, and acts: metrics always, a Kubernetes Event when a
 * container goes over, SIGKILL to that container's GPU processes when the
 * operator chose `enforce: kill` and it is memory that is over.
 *
 * This file: the life cycle, NVML, the scan and the thread; the parts are
 * watchmap.c, watchact.c and watchmetrics.c (watchstate.h). Ownership: see
 * watcher.h.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "watcher.h"
#include "watchstate.h"

/* ---- life cycle ---- */

dp_watcher *dp_watcher_new(const dp_watch_config *cfg, const dp_watch_sources *src,
                           kgpu_error *err)
{
    dp_watcher *w = calloc(1, sizeof(*w));
    if (w != NULL)
        w->entries = calloc(ENTRIES_MAX, sizeof(*w->entries));
    if (w == NULL || w->entries == NULL) {
        free(w);
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    w->cfg = *cfg;
    w->k8s = src->k8s;
    snprintf(w->node, sizeof(w->node), "%s", src->node_name ? src->node_name : "");
    snprintf(w->state_dir, sizeof(w->state_dir), "%s", src->state_dir ? src->state_dir : "");
    snprintf(w->nvml_lib, sizeof(w->nvml_lib), "%s", src->nvml_lib ? src->nvml_lib : "");
    pthread_mutex_init(&w->pub_mu, NULL);
    pthread_mutex_init(&w->stop_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->stop_cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(w->last_error, sizeof(w->last_error), "no scan yet");
    dp_watch_render(w); /* /metrics answers from the start, with kgpu_watcher_up 0 */
    return w;
}

/* ---- NVML ---- */

static int ensure_nvml(dp_watcher *w, kgpu_error *err)
{
    if (w->nv != NULL)
        return KGPU_OK;
    kgpu_nvml *nv = NULL;
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    int rc = kgpu_nvml_open(w->nvml_lib[0] ? w->nvml_lib : NULL, NULL, &nv, err);
    if (rc == KGPU_OK)
        rc = kgpu_nvml_discover(nv, &gpus, &n, err);
    if (rc != KGPU_OK) {
        kgpu_nvml_close(nv);
        return rc;
    }
    if (n > KGPU_MAX_GPUS_PER_NODE)
        n = KGPU_MAX_GPUS_PER_NODE;
    w->nv = nv;
    free(w->gpus);
    w->gpus = gpus;
    w->ngpus = n;
    return KGPU_OK;
}

char *dp_watcher_metrics(dp_watcher *w, size_t *len)
{
    pthread_mutex_lock(&w->pub_mu);
    size_t n = w->pub != NULL ? w->pub_len : 0;
    char *copy = malloc(n + 1);
    if (copy != NULL) {
        if (n > 0)
            memcpy(copy, w->pub, n);
        copy[n] = '\0';
    }
    pthread_mutex_unlock(&w->pub_mu);
    *len = copy != NULL ? n : 0;
    return copy;
}

/* ---- the scan ---- */

/* Adds GPU g's processes to the entries; KGPU_OK or NVML's error. */
static int scan_gpu(dp_watcher *w, int g, kgpu_gpu_proc *procs, kgpu_error *err)
{
    int n = 0;
    int rc = kgpu_nvml_processes(w->nv, w->gpus[g].index, procs, KGPU_GPU_PROCS_MAX, &n, NULL, err);
    if (rc != KGPU_OK)
        return rc;
    for (int i = 0; i < n; i++) {
        dp_cgroup_id id;
        int pc = dp_watch_process_container(w, procs[i].pid, &id);
        int kind = pc == KGPU_OK ? (dp_watch_is_kgpu_pod(w, id.pod_uid) ? K_CONTAINER : K_OTHER_POD)
                   : pc == KGPU_ENOENT ? K_HOST
                                       : K_UNREADABLE;
        w->kinds[g][kind]++;
        /* Another pod's process on a GPU: kgpu gave it no share, so it is judged as over one. */
        if (kind != K_CONTAINER && kind != K_OTHER_POD)
            continue;
        wentry *e = dp_watch_entry_for(w, &id, g);
        if (e == NULL) {
            w->dropped++;
            continue;
        }
        if (!e->seen) {
            e->seen = true;
            e->used = 0;
            e->sm = 0;
            e->npids = 0;
            e->nprocs = 0;
        }
        e->unallocated = kind == K_OTHER_POD;
        if (procs[i].used_bytes < 0 || e->used < 0)
            e->used = -1;
        else
            e->used += procs[i].used_bytes;
        e->sm = e->sm + procs[i].sm_pct > 100 ? 100 : e->sm + procs[i].sm_pct;
        e->nprocs++;
        if (e->npids < ENTRY_PIDS_MAX)
            e->pids[e->npids++] = procs[i].pid;
    }
    return KGPU_OK;
}

int dp_watcher_scan(dp_watcher *w, kgpu_error *err)
{
    double t0 = dp_watch_mono_s();
    w->scans++;
    memset(w->kinds, 0, sizeof(w->kinds));
    for (int i = 0; i < w->nentries; i++)
        w->entries[i].seen = false;
    int rc = ensure_nvml(w, err);
    kgpu_gpu_proc *procs = rc == KGPU_OK ? calloc(KGPU_GPU_PROCS_MAX, sizeof(*procs)) : NULL;
    if (rc == KGPU_OK && procs == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int g = 0; g < w->ngpus && rc == KGPU_OK; g++)
        rc = scan_gpu(w, g, procs, err);
    free(procs);
    if (rc != KGPU_OK) {
        /* A GPU that stopped answering, a driver going away: start afresh next time. */
        w->scan_errors++;
        w->up = false;
        snprintf(w->last_error, sizeof(w->last_error), "%s", err != NULL ? err->msg : "");
        kgpu_nvml_close(w->nv);
        w->nv = NULL;
        for (int i = 0; i < w->nentries; i++)
            w->entries[i].seen = false;
    } else {
        w->up = true;
        w->last_error[0] = '\0';
    }
    /* Entries this scan did not see are gone: their container stopped using the GPU. */
    int k = 0;
    for (int i = 0; i < w->nentries; i++)
        if (w->entries[i].seen)
            w->entries[k++] = w->entries[i];
    w->nentries = k;

    bool unknown = false;
    for (int i = 0; i < w->nentries; i++)
        unknown |= !dp_watch_resolve_from_cache(w, &w->entries[i]);
    bool may_list = w->listed_at == 0 || dp_watch_mono_s() - w->listed_at >= LIST_EVERY_S;
    if (unknown && w->k8s != NULL && may_list) {
        dp_watch_list_pods(w);
        for (int i = 0; i < w->nentries; i++)
            dp_watch_resolve_from_cache(w, &w->entries[i]);
    }
    for (int i = 0; i < w->nentries; i++) {
        wentry *e = &w->entries[i];
        if (e->name[0] == '\0')
            dp_watch_resolve_single(w, e);
        dp_watch_read_share(w, e);
        dp_watch_judge(w, e);
    }
    w->last_scan_unix = dp_watch_unix_s();
    w->last_scan_s = dp_watch_mono_s() - t0;
    dp_watch_render(w);
    return rc;
}

/* ---- the thread ---- */

static void *watch_loop(void *arg)
{
    dp_watcher *w = arg;
    pthread_mutex_lock(&w->stop_mu);
    while (!w->stop) {
        pthread_mutex_unlock(&w->stop_mu);
        kgpu_error e = {0};
        bool was_up = w->up;
        if (dp_watcher_scan(w, &e) != KGPU_OK && (was_up || w->scan_errors == 1))
            kgpu_log(KGPU_LOG_WARN, "watcher: %s (retrying every %.1f s)", e.msg,
                     w->cfg.interval_s);
        double at = dp_watch_mono_s() + w->cfg.interval_s;
        struct timespec ts;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
        pthread_mutex_lock(&w->stop_mu);
        while (!w->stop && pthread_cond_timedwait(&w->stop_cv, &w->stop_mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&w->stop_mu);
    return NULL;
}

int dp_watcher_start(dp_watcher *w, kgpu_error *err)
{
    if (pthread_create(&w->thread, NULL, watch_loop, w) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the watcher thread");
    w->started = true;
    return KGPU_OK;
}

void dp_watcher_free(dp_watcher *w)
{
    if (w == NULL)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->stop_mu);
        w->stop = true;
        pthread_cond_signal(&w->stop_cv);
        pthread_mutex_unlock(&w->stop_mu);
        pthread_join(w->thread, NULL);
    }
    kgpu_nvml_close(w->nv);
    free(w->gpus);
    free(w->entries);
    free(w->pods);
    free(w->pub);
    pthread_mutex_destroy(&w->pub_mu);
    pthread_mutex_destroy(&w->stop_mu);
    pthread_cond_destroy(&w->stop_cv);
    free(w);
}

