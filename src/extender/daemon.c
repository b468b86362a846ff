/*
 * The kgpu-extender process: the layers wired. The state gets its facts
 * from a cluster file or from the API server's reflectors (sources, through
 * the state's sink); the serving layer hands requests to routes.c; the
 * leader writes GPUQueue status, sweeps unschedulable pods for reclaim and
 * guards nodes of shares from scale-down on three threads of its own here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"

static void sleep_ms(ext_daemon *d, long ms)
{
    for (long t = 0; t < ms && !atomic_load(&d->stop); t += 100)
        usleep(100 * 1000);
}

/* The leader keeps each GPUQueue's status current (serving layer, status.c). */
static void *write_statuses(void *arg)
{
    ext_daemon *d = arg;
    kgpu_strmap written; /* name -> the status last written (JSON text, owned) */
    kgpu_strmap_init(&written);
    while (!atomic_load(&d->stop)) {
        sleep_ms(d, EXT_STATUS_INTERVAL_MS);
        if (!ext_daemon_leads(d)) {
            kgpu_strmap_clear_free(&written); /* another replica writes meanwhile */
            continue;
        }
        ext_status_write(&d->state, d->k8s, &written);
    }
    kgpu_strmap_clear_free(&written);
    kgpu_strmap_clear(&written);
    return NULL;
}

/* The leader's reclaim for pods kube-scheduler found no node for (decisions, reclaim.c). */
static void *sweep_unschedulable(void *arg)
{
    ext_daemon *d = arg;
    ext_sweep_act *acts = calloc(EXT_SWEEP_PODS, sizeof(*acts));
    if (acts == NULL) {
        ext_log(EXT_ERROR, "queues: out of memory; unschedulable pods are not swept");
        return NULL;
    }
    while (!atomic_load(&d->stop)) {
        sleep_ms(d, EXT_SWEEP_MS);
        if (!ext_daemon_leads(d))
            continue;
        ext_ctx c = ext_daemon_ctx(d);
        ext_sweep_once(&c, acts, &d->stop);
    }
    free(acts);
    return NULL;
}

/*
 * The leader's scale-down guard (decisions, guard.c), every
 * scaleDownGuardSeconds; this thread owns `written`.
 */
static void *guard_scale_down(void *arg)
{
    ext_daemon *d = arg;
    kgpu_strmap written;
    kgpu_strmap_init(&written);
    while (!atomic_load(&d->stop)) {
        sleep_ms(d, (long)d->cfg.scale_down_guard_s * 1000);
        if (!ext_daemon_leads(d)) {
            kgpu_strmap_clear_free(&written); /* another replica writes meanwhile */
            continue;
        }
        ext_ctx c = ext_daemon_ctx(d);
        int n = ext_guard_once(&c, &written, &d->stop);
        atomic_store(&d->metrics.guard_nodes, n);
    }
    kgpu_strmap_clear_free(&written);
    kgpu_strmap_clear(&written);
    return NULL;
}

/* Cluster mode: the API client, the reflectors, the leader's threads, the election. */
static int start_cluster_mode(ext_daemon *d, kgpu_error *err)
{
    kgpu_k8s_config kc;
    memset(&kc, 0, sizeof(kc));
    int rc = d->cfg.kubeconfig[0]
                 ? kgpu_k8s_config_kubeconfig(d->cfg.kubeconfig, &kc, err)
                 : kgpu_k8s_config_in_cluster(d->cfg.sa_dir[0] ? d->cfg.sa_dir : NULL, &kc, err);
    /*
     * With leader election no API call may outlive the gap between the
     * leader giving up (80 % of the lease) and a standby taking over
     * (100 %): a Binding still in flight then could race the new leader.
     */
    if (rc == 0 && d->cfg.leader_elect) {
        long gap_ms = (long)d->cfg.lease_duration_s * 200;
        if (kc.timeout_ms <= 0 || kc.timeout_ms > gap_ms)
            kc.timeout_ms = gap_ms;
    }
    if (rc == 0 && (d->k8s = kgpu_k8s_new(&kc, err)) == NULL)
        rc = err ? err->code : KGPU_EINVAL;
    kgpu_k8s_config_clear(&kc);
    if (rc != 0) {
        if (err)
            kgpu_error_set(err, rc, "%.400s (use --cluster-file to run without an API server)",
                           err->msg);
        return rc;
    }
    d->sources = (ext_sources){
        .k8s = d->k8s, .metrics = &d->metrics, .sink = &d->sink, .stop = &d->stop,
        .groups = d->cfg.node_groups};
    if ((rc = ext_sources_start(&d->sources, d->watch_threads, &d->nwatch, err)) != 0)
        return rc;
    void *(*const leader_work[])(void *) = {write_statuses, sweep_unschedulable,
                                             guard_scale_down};
    for (size_t i = 0; i < sizeof(leader_work) / sizeof(leader_work[0]); i++) {
        if (leader_work[i] == guard_scale_down && d->cfg.scale_down_guard_s == 0)
            continue; /* turned off */
        if (pthread_create(&d->watch_threads[d->nwatch], NULL, leader_work[i], d) != 0)
            return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the GPU queue threads");
        d->nwatch++;
    }
    if (d->cfg.leader_elect) {
        d->leader.cfg = &d->cfg;
        d->leader.k8s = d->k8s;
        d->leader.stop = &d->stop;
        if ((rc = ext_leader_start(&d->leader, err)) != 0)
            return rc;
    }
    return 0;
}

/* --cluster-file mode: the file's nodes, and the configuration's queues. */
static int start_file_mode(ext_daemon *d, kgpu_error *err)
{
    int rc = ext_cluster_file_load(d->cfg.cluster_file, &d->sink, err);
    if (rc != 0)
        return rc;
    ext_log(EXT_INFO, "cluster file %s: %d nodes, %d GPUs; binds are kept in memory",
            d->cfg.cluster_file, kgpu_cluster_node_count(d->state.cluster),
            kgpu_cluster_gpu_count(d->state.cluster));
    /* The configuration's queues, and namespaceQueues for the namespaces' annotations. */
    pthread_mutex_lock(&d->state.mu);
    const char *ns;
    json_t *q;
    json_object_foreach(d->cfg.namespace_queues, ns, q)
        ext_queues_set_namespace(&d->state, ns, json_string_value(q), NULL);
    if (d->cfg.queues != NULL) {
        ext_queues_set(&d->state, d->cfg.queues);
        d->cfg.queues = NULL;
        ext_log(EXT_INFO, "queues: %d from %s; pods leave with DELETE /pods/NAMESPACE/NAME",
                kgpu_queues_count(d->state.queues), d->cfg.config_file);
    }
    pthread_mutex_unlock(&d->state.mu);
    return 0;
}

int ext_daemon_start(ext_daemon *d, kgpu_error *err)
{
    ext_log_set_level(d->cfg.log_level);
    int rc = ext_state_init(&d->state, &d->cfg, &d->metrics, err);
    if (rc != 0)
        return rc;
    atomic_init(&d->stop, false);
    ext_state_sink(&d->state, &d->sink);
    rc = d->cfg.cluster_file[0] ? start_file_mode(d, err) : start_cluster_mode(d, err);
    if (rc != 0)
        return rc;
    return ext_http_start(d, err);
}

void ext_daemon_stop(ext_daemon *d)
{
    atomic_store(&d->stop, true);
    ext_http_stop(d);
    ext_leader_stop(&d->leader); /* a leader hands the lease back on its way out */
    for (int i = 0; i < d->nwatch; i++)
        pthread_join(d->watch_threads[i], NULL);
    d->nwatch = 0;
    kgpu_k8s_free(d->k8s);
    d->k8s = NULL;
    ext_state_destroy(&d->state);
    ext_config_free(&d->cfg);
}
