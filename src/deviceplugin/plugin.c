/*
 * The device plugin daemon's main loop (dp_run): discovers the GPUs, keeps
 * their health, publishes each resource's device list, and serves and
 * registers one gRPC server per resource, whose unary calls allocate.c
 * answers; the API thread (apithread.c) publishes the node and cleans up pod
 * directories, so that the main loop never waits on the API server.
 * Threads: see dp.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"
#include "plugin.h"
#include "watcher.h"

#define LOOP_MS     200
#define REGISTER_MS 3000

static void sock_path(const plugin *p, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", p->cfg->plugin_dir, name);
}

/* ---- inventory and health ---- */

/* Encodes every registered resource's list; on failure nothing changes. */
static int publish_lists(plugin *p, const contract_inventory *inv, kgpu_error *err)
{
    uint8_t *buf[DP_NRES] = {0};
    size_t len[DP_NRES] = {0};
    int rc = 0;
    for (int r = 0; r < DP_NRES && rc == 0; r++)
        if (p->registered & (1u << r))
            rc = dp_list_encode(inv, (dp_res)r, &buf[r], &len[r], err);
    if (rc != 0) {
        for (int r = 0; r < DP_NRES; r++)
            free(buf[r]);
        return rc;
    }
    pthread_mutex_lock(&p->inv_mu);
    p->inv = *inv;
    p->inv_gen++;
    pthread_cond_signal(&p->api_cv);
    pthread_mutex_unlock(&p->inv_mu);
    for (int r = 0; r < DP_NRES; r++) {
        if (!(p->registered & (1u << r)))
            continue;
        node_snapshot *s = &p->snap[r];
        pthread_mutex_lock(&s->mu);
        free(s->buf);
        s->buf = buf[r];
        s->len = len[r];
        s->gen++;
        pthread_mutex_unlock(&s->mu);
    }
    return 0;
}

/* Takes a new set of GPUs (and health) when it differs from the current one. */
static int update_inventory(plugin *p, const kgpu_gpu_info *gpus, int n, kgpu_error *err)
{
    if (n > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "%d GPUs: at most %d per node", n,
                              KGPU_MAX_GPUS_PER_NODE);
    if (node_same_gpus(&p->inv, gpus, n))
        return 0;
    contract_inventory next = {.ngpus = n, .unit_mib = p->cfg->node.unit_mib};
    memcpy(next.gpus, gpus, (size_t)n * sizeof(*gpus));
    for (int i = 0; i < n; i++)
        if (i >= p->inv.ngpus || p->inv.gpus[i].healthy != gpus[i].healthy ||
            strcmp(p->inv.gpus[i].uuid, gpus[i].uuid) != 0)
            kgpu_log(gpus[i].healthy ? KGPU_LOG_INFO : KGPU_LOG_WARN,
                     "GPU %d %s %s, %" PRId64 " MiB, NUMA %d: %s", gpus[i].index, gpus[i].uuid,
                     gpus[i].model, gpus[i].memory_mib, gpus[i].numa,
                     gpus[i].healthy ? "healthy" : "UNHEALTHY");
    return publish_lists(p, &next, err);
}

static int take_fake(void *p, const kgpu_gpu_info *gpus, int n, kgpu_error *err)
{
    return update_inventory(p, gpus, n, err);
}

/* Re-reads the fake inventory when its file changed (node_fake_poll). */
static int poll_fake(plugin *p, bool first, kgpu_error *err_first)
{
    return node_fake_poll(p->cfg->node.fake_gpus, &p->fake_st, first, take_fake, p, err_first);
}

static void poll_nvml(plugin *p)
{
    int idx;
    unsigned long long xid;
    kgpu_error e = {0};
    /* Drain pending events without waiting: the main loop paces itself. */
    for (int i = 0; i < 64; i++) {
        int rc = kgpu_nvml_wait_xid(p->nvml, 0, &idx, &xid, &e);
        if (rc <= 0) {
            if (rc < 0)
                kgpu_log(KGPU_LOG_WARN, "%s", e.msg);
            break;
        }
        if (idx >= 0 && idx < KGPU_MAX_GPUS_PER_NODE && !p->xid_bad[idx]) {
            kgpu_log(KGPU_LOG_WARN,
                     "GPU %d: XID %llu: marking it unhealthy until the plugin restarts", idx, xid);
            p->xid_bad[idx] = true;
        }
    }
    kgpu_gpu_info gpus[KGPU_MAX_GPUS_PER_NODE];
    int n = p->inv.ngpus;
    memcpy(gpus, p->inv.gpus, (size_t)n * sizeof(gpus[0]));
    for (int i = 0; i < n; i++)
        gpus[i].healthy = !p->xid_bad[gpus[i].index] && kgpu_nvml_alive(p->nvml, gpus[i].index);
    if (update_inventory(p, gpus, n, &e) != 0)
        kgpu_log(KGPU_LOG_ERROR, "%s", e.msg);
}

/* ---- sockets and registration ---- */

static int start_server(plugin *p, dp_res r, kgpu_error *err)
{
    char path[1100];
    sock_path(p, dp_res_socket(r), path, sizeof(path));
    p->srv_ctx[r] = (res_ctx){p, r};
    p->srv[r] = node_server_start(path, dp_res_name(r), DP_LIST_AND_WATCH, &p->snap[r],
                                  dp_plugin_unary, &p->srv_ctx[r], err);
    if (p->srv[r] == NULL)
        return err->code ? err->code : KGPU_EIO;
    struct stat st;
    p->sock_ino[r] = stat(path, &st) == 0 ? st.st_ino : 0;
    p->need_register[r] = true;
    kgpu_log(KGPU_LOG_INFO, "serving %s on %s", dp_res_name(r), path);
    return 0;
}

/* Restarts servers whose socket vanished (kubelet removes them when it restarts). */
static void watch_sockets(plugin *p)
{
    char path[1100];
    struct stat st;
    for (int r = 0; r < DP_NRES; r++) {
        if (!(p->registered & (1u << r)))
            continue;
        sock_path(p, dp_res_socket((dp_res)r), path, sizeof(path));
        if (p->srv[r] != NULL && stat(path, &st) == 0 && st.st_ino == p->sock_ino[r])
            continue;
        kgpu_log(KGPU_LOG_WARN, "%s: socket %s is gone (kubelet restarted?); serving it again",
                 dp_res_name((dp_res)r), path);
        node_server_stop(p->srv[r]);
        p->srv[r] = NULL;
        kgpu_error e = {0};
        if (start_server(p, (dp_res)r, &e) != 0)
            kgpu_log(KGPU_LOG_ERROR, "%s", e.msg);
    }
    sock_path(p, "kubelet.sock", path, sizeof(path));
    ino_t ino = stat(path, &st) == 0 ? st.st_ino : 0;
    if (ino != p->kubelet_ino) {
        if (ino != 0)
            kgpu_log(KGPU_LOG_INFO, "kubelet socket %s appeared; registering", path);
        p->kubelet_ino = ino;
        for (int r = 0; r < DP_NRES; r++)
            p->need_register[r] = (p->registered & (1u << r)) != 0;
        p->next_register = 0;
    }
    if (ino == 0 || dp_now_s() < p->next_register)
        return;
    for (int r = 0; r < DP_NRES; r++) {
        if (!p->need_register[r] || p->srv[r] == NULL)
            continue;
        kgpu_error e = {0};
        if (dp_register(path, dp_res_socket((dp_res)r), (dp_res)r, true, REGISTER_MS, &e) == 0) {
            p->need_register[r] = false;
            kgpu_log(KGPU_LOG_INFO, "registered %s with kubelet", dp_res_name((dp_res)r));
        } else {
            kgpu_log(KGPU_LOG_WARN, "%s; retrying", e.msg);
            p->next_register = dp_now_s() + 1;
        }
    }
}

/* ---- the daemon ---- */

static int connect_api(plugin *p, kgpu_error *err)
{
    if (p->cfg->no_api)
        return 0;
    bool no_cluster;
    int rc = node_k8s_connect(p->cfg->node.kubeconfig, &p->k8s, &no_cluster, err);
    if (no_cluster) {
        kgpu_log(KGPU_LOG_WARN, "no in-cluster credentials and no --kubeconfig: running without an "
                        "API server (devices are listed; Allocate will refuse)");
        /* Not an error: callers must not find the in-cluster lookup's message in err. */
        kgpu_error_clear(err);
        return 0;
    }
    if (rc == 0 && p->cfg->node.node_name[0] == '\0')
        rc = kgpu_error_set(err, KGPU_EINVAL,
                            "the node's name is unknown: set --node-name or NODE_NAME");
    return rc;
}

/* Starts the watcher and its /metrics when --watch-config names a file. */
static int start_watcher(plugin *p, kgpu_error *err)
{
    if (p->cfg->watch_config[0] == '\0')
        return 0;
    dp_watch_config wc;
    int rc = dp_watch_config_load(p->cfg->watch_config, &wc, err);
    if (rc != 0)
        return rc;
    dp_watch_sources src = {.k8s = p->k8s,
                            .node_name = p->cfg->node.node_name,
                            .state_dir = p->cfg->node.state_dir,
                            .nvml_lib = p->cfg->node.nvml_lib};
    p->watcher = dp_watcher_new(&wc, &src, err);
    if (p->watcher == NULL)
        return err->code ? err->code : KGPU_ENOMEM;
    if (wc.listen[0] != '\0' &&
        (p->metrics = dp_metrics_server_start(wc.listen, p->watcher, err)) == NULL)
        return err->code ? err->code : KGPU_EIO;
    if ((rc = dp_watcher_start(p->watcher, err)) != 0)
        return rc;
    kgpu_log(KGPU_LOG_INFO, "watcher: every %.1f s, enforce %s, /metrics %s%s", wc.interval_s,
             wc.enforce == DP_ENFORCE_KILL ? "kill" : "none", wc.listen[0] ? "on " : "off",
             wc.listen);
    return 0;
}

int dp_run(const dp_config *cfg, atomic_bool *stop, kgpu_error *err)
{
    plugin *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    p->cfg = cfg;
    pthread_mutex_init(&p->inv_mu, NULL);
    pthread_mutex_init(&p->alloc_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* api_wait_until's deadlines are dp_now_s() */
    pthread_cond_init(&p->api_cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int r = 0; r < DP_NRES; r++)
        pthread_mutex_init(&p->snap[r].mu, NULL);
    p->inv.unit_mib = cfg->node.unit_mib;
    p->registered = 1u << DP_RES_MEM | 1u << DP_RES_CORE;
    if (cfg->whole_gpus)
        p->registered |= 1u << DP_RES_WHOLE;
    if (cfg->gpushare_alias)
        p->registered |= 1u << DP_RES_ALIAS;
    node_contract_paths(&cfg->node, p->shim, sizeof(p->shim), &p->paths);
    if (cfg->device_list == DP_LIST_CDI) {
        p->cdi.kind = cfg->cdi_kind[0] != '\0' ? cfg->cdi_kind : DP_CDI_KIND_DEFAULT;
        p->cdi.by_index = cfg->cdi_by_index;
    }
    /* Refused at start: without the daemon, containers would get MPS limits nobody enforces. */
    int rc = cfg->node.sharing == CONTRACT_SHARING_MPS
                 ? contract_mps_check(cfg->node.mps_pipe_dir, err)
                 : 0;
    if (rc == 0 && mkdir(cfg->node.state_dir, 0755) != 0 && errno != EEXIST)
        rc = kgpu_error_set(err, KGPU_EIO, "state directory %s: %s", cfg->node.state_dir,
                            strerror(errno));
    if (rc == 0)
        rc = contract_write_preload(&p->paths, err);
    if (rc == 0)
        rc = connect_api(p, err);
    if (rc == 0 && cfg->node.fake_gpus[0] != '\0') {
        rc = poll_fake(p, true, err);
    } else if (rc == 0) {
        rc = kgpu_nvml_open(cfg->node.nvml_lib[0] ? cfg->node.nvml_lib : NULL,
                            cfg->node.sysfs[0] ? cfg->node.sysfs : NULL, &p->nvml, err);
        kgpu_gpu_info *gpus = NULL;
        int n = 0;
        if (rc == 0 && (rc = kgpu_nvml_discover(p->nvml, &gpus, &n, err)) == 0)
            rc = update_inventory(p, gpus, n, err);
        free(gpus);
        if (rc == 0 && n < kgpu_nvml_device_count(p->nvml))
            kgpu_log(KGPU_LOG_WARN, "%d of %d GPUs do not answer and are not advertised (%s)",
                     kgpu_nvml_device_count(p->nvml) - n, kgpu_nvml_device_count(p->nvml),
                     kgpu_nvml_skipped(p->nvml));
        if (rc == 0 && !kgpu_nvml_has_events(p->nvml))
            kgpu_log(KGPU_LOG_WARN, "this driver's NVML has no event functions: XID errors go "
                                    "unseen; lost GPUs are still noticed");
    }
    if (rc == 0 && p->inv.ngpus == 0)
        kgpu_log(KGPU_LOG_WARN, "no GPUs found: registering empty device lists");
    if (rc == 0 && p->snap[DP_RES_MEM].buf == NULL) {
        /* No GPUs: still publish (empty) lists so kubelet sees zero capacity. */
        contract_inventory empty = {.ngpus = 0, .unit_mib = cfg->node.unit_mib};
        rc = publish_lists(p, &empty, err);
    }
    for (int r = 0; r < DP_NRES && rc == 0; r++)
        if (p->registered & (1u << r))
            rc = start_server(p, (dp_res)r, err);
    if (rc == 0)
        rc = dp_api_start(p, err);
    if (rc == 0)
        rc = start_watcher(p, err);
    if (rc == 0)
        kgpu_log(KGPU_LOG_INFO,
                 "kgpu-device-plugin %s on node %s: %d GPUs, memory unit %" PRId64 " MiB, %s",
                 KGPU_VERSION, cfg->node.node_name[0] ? cfg->node.node_name : "(unnamed)",
                 p->inv.ngpus, cfg->node.unit_mib,
                 p->k8s != NULL ? "API server connected" : "no API server");
    while (rc == 0 && !atomic_load(stop)) {
        if (cfg->node.fake_gpus[0] != '\0')
            (void)poll_fake(p, false, NULL);
        else
            poll_nvml(p);
        watch_sockets(p);
        struct timespec ts = {0, LOOP_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    dp_metrics_server_stop(p->metrics);
    dp_watcher_free(p->watcher);
    dp_api_stop(p);
    for (int r = 0; r < DP_NRES; r++)
        node_server_stop(p->srv[r]);
    for (int r = 0; r < DP_NRES; r++) {
        free(p->snap[r].buf);
        pthread_mutex_destroy(&p->snap[r].mu);
    }
    if (p->nvml != NULL)
        kgpu_nvml_close(p->nvml);
    kgpu_k8s_free(p->k8s);
    pthread_cond_destroy(&p->api_cv);
    pthread_mutex_destroy(&p->inv_mu);
    pthread_mutex_destroy(&p->alloc_mu);
    free(p);
    if (rc == 0)
        kgpu_log(KGPU_LOG_INFO, "stopped");
    return rc;
}

