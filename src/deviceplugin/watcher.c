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

#include "fileio.h"
#include "log.h"
#include "migprocs.h"
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
    snprintf(w->ckpt_path, sizeof(w->ckpt_path), "%s",
             src->kubelet_ckpt ? src->kubelet_ckpt : "");
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
    /* Room for the MIG devices after the GPUs. */
    kgpu_gpu_info *units = realloc(gpus, WATCH_UNITS_MAX * sizeof(*units));
    if (units == NULL) {
        free(gpus);
        kgpu_nvml_close(nv);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    w->nv = nv;
    free(w->gpus);
    w->gpus = units;
    w->ngpus = w->nphys = n;
    return KGPU_OK;
}

/* ---- MIG devices ---- */

/*
 * Lists the MIG devices of the GPUs in MIG mode again (they come and go
 * with the operator's layout) and moves each entry to its device's new
 * place; an entry whose device is gone is left unseen, so the scan drops it.
 */
static void list_mig_units(dp_watcher *w)
{
    char was[WATCH_UNITS_MAX][KGPU_GPU_UUID_MAX];
    for (int u = w->nphys; u < w->ngpus; u++)
        snprintf(was[u], sizeof(was[u]), "%s", w->gpus[u].uuid);
    int n = w->nphys;
    for (int g = 0; g < w->nphys; g++) {
        if (w->gpus[g].mig_mode != 1)
            continue;
        kgpu_nvml_mig ms[KGPU_NVML_MIG_MAX];
        int k = 0;
        kgpu_error e = {0};
        if (kgpu_nvml_mig_list(w->nv, w->gpus[g].index, ms, KGPU_NVML_MIG_MAX, &k, &e) != 0) {
            kgpu_log(KGPU_LOG_DEBUG, "watcher: %s", e.msg);
            continue;
        }
        for (int j = 0; j < k && n < WATCH_UNITS_MAX; j++) {
            if (ms[j].uuid[0] == '\0')
                continue; /* a GPU instance without a compute instance runs nothing */
            kgpu_gpu_info *d = &w->gpus[n];
            *d = w->gpus[g];
            snprintf(d->uuid, sizeof(d->uuid), "%s", ms[j].uuid);
            d->memory_mib = ms[j].memory_mib;
            d->mig_mode = -1;
            w->mig[n - w->nphys].parent = g;
            w->mig[n - w->nphys].gi = ms[j].gi_id;
            w->mig[n - w->nphys].ci = ms[j].ci_id;
            n++;
        }
    }
    for (int i = 0; i < w->nentries; i++) {
        wentry *e = &w->entries[i];
        if (e->gpu < w->nphys)
            continue;
        int to = -1;
        for (int u = w->nphys; u < n && to < 0; u++)
            if (strcmp(w->gpus[u].uuid, was[e->gpu]) == 0)
                to = u;
        e->gpu = to; /* -1: matches no process, so it goes at the end of the scan */
    }
    w->ngpus = n;
}

/* Reads who holds each MIG device from kubelet's checkpoint (held_known false when unknown). */
static void read_holders(dp_watcher *w)
{
    w->nheld = 0;
    w->held_known = false;
    if (w->ckpt_path[0] == '\0' || w->ngpus == w->nphys)
        return;
    char *buf = NULL;
    size_t len = 0;
    kgpu_error e = {0};
    int rc = kgpu_read_file_max(w->ckpt_path, DP_KUBELET_CKPT_MAX, &buf, &len, &e);
    if (rc == KGPU_OK)
        rc = dp_kubelet_ckpt_holders(buf, len, w->ckpt_path, "MIG-", w->held, WATCH_MIG_MAX,
                                     &w->nheld, &e);
    free(buf);
    w->held_known = rc == KGPU_OK;
    if (rc != KGPU_OK && strcmp(e.msg, w->held_error) != 0)
        kgpu_log(KGPU_LOG_WARN, "watcher: %s: MIG devices' shares unknown until it reads", e.msg);
    snprintf(w->held_error, sizeof(w->held_error), "%s", rc == KGPU_OK ? "" : e.msg);
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

/* Adds one process of unit g (a GPU or a MIG device) to its container's entry. */
static void add_proc(dp_watcher *w, int g, const dp_cgroup_id *id, int kind, unsigned pid,
                     int64_t used, int sm)
{
    wentry *e = dp_watch_entry_for(w, id, g);
    if (e == NULL) {
        w->dropped++;
        return;
    }
    if (!e->seen) {
        e->seen = true;
        e->used = 0;
        e->sm = 0;
        e->npids = 0;
        e->nprocs = 0;
    }
    e->unallocated = kind == K_OTHER_POD;
    if (used < 0 || e->used < 0)
        e->used = -1;
    else
        e->used += used;
    e->sm = e->sm + sm > 100 ? 100 : e->sm + sm;
    e->nprocs++;
    if (e->npids < ENTRY_PIDS_MAX)
        e->pids[e->npids++] = pid;
}

/* The kind of a process from its cgroup record: a kgpu pod's container, another pod's, ... */
static int kind_of(const dp_watcher *w, unsigned pid, dp_cgroup_id *id)
{
    int pc = dp_watch_process_container(w, pid, id);
    return pc == KGPU_OK ? (dp_watch_is_kgpu_pod(w, id->pod_uid) ? K_CONTAINER : K_OTHER_POD)
           : pc == KGPU_ENOENT ? K_HOST
                               : K_UNREADABLE;
}

/* Adds GPU g's processes to the entries; KGPU_OK or NVML's error. */
static int scan_gpu(dp_watcher *w, int g, kgpu_gpu_proc *procs, kgpu_error *err)
{
    int n = 0;
    int rc = kgpu_nvml_processes(w->nv, w->gpus[g].index, procs, KGPU_GPU_PROCS_MAX, &n, NULL, err);
    if (rc != KGPU_OK)
        return rc;
    for (int i = 0; i < n; i++) {
        dp_cgroup_id id;
        int kind = kind_of(w, procs[i].pid, &id);
        w->kinds[g][kind]++;
        /* Another pod's process on a GPU: kgpu gave it no share, so it is judged as over one. */
        if (kind != K_CONTAINER && kind != K_OTHER_POD)
            continue;
        add_proc(w, g, &id, kind, procs[i].pid, procs[i].used_bytes, procs[i].sm_pct);
    }
    return KGPU_OK;
}

/*
 * Adds the processes of GPU g, in MIG mode, to the entries of their MIG
 * devices: a process in the pod kubelet gave the device is a container's,
 * any other pod's is over a share of zero there (dp_watch_read_share).
 */
static int scan_mig_gpu(dp_watcher *w, int g, kgpu_gpu_mig_proc *procs, kgpu_error *err)
{
    int n = 0;
    int rc = kgpu_nvml_mig_processes(w->nv, w->gpus[g].index, procs, KGPU_GPU_PROCS_MAX, &n, err);
    if (rc != KGPU_OK)
        return rc;
    for (int i = 0; i < n; i++) {
        int u = -1;
        for (int k = w->nphys; k < w->ngpus && u < 0; k++)
            if (w->mig[k - w->nphys].parent == g && w->mig[k - w->nphys].gi == procs[i].gi_id &&
                w->mig[k - w->nphys].ci == procs[i].ci_id)
                u = k;
        dp_cgroup_id id;
        int kind = kind_of(w, procs[i].pid, &id);
        if (kind == K_CONTAINER || kind == K_OTHER_POD) {
            const dp_ckpt_holder *h = u >= 0 ? dp_watch_holder(w, w->gpus[u].uuid) : NULL;
            kind = h != NULL && strcmp(h->pod_uid, id.pod_uid) == 0 ? K_CONTAINER : K_OTHER_POD;
        }
        /* An instance made since the listing: counted on its GPU, judged next scan. */
        w->kinds[u >= 0 ? u : g][u >= 0 ? kind : K_UNREADABLE]++;
        if (u >= 0 && (kind == K_CONTAINER || kind == K_OTHER_POD))
            add_proc(w, u, &id, kind, procs[i].pid, procs[i].used_bytes, 0);
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
    kgpu_gpu_mig_proc *mprocs =
        rc == KGPU_OK ? calloc(KGPU_GPU_PROCS_MAX, sizeof(*mprocs)) : NULL;
    if (rc == KGPU_OK && (procs == NULL || mprocs == NULL))
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    if (rc == KGPU_OK) {
        list_mig_units(w);
        read_holders(w);
    }
    for (int g = 0; g < w->nphys && rc == KGPU_OK; g++)
        rc = w->gpus[g].mig_mode == 1 ? scan_mig_gpu(w, g, mprocs, err)
                                      : scan_gpu(w, g, procs, err);
    free(procs);
    free(mprocs);
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

