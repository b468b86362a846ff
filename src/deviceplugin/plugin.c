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

#include "kubeletckpt.h"
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

/* The name of a slot's resource ("kgpu.io/gpu-mem", "nvidia.com/mig-1g.5gb") into buf. */
static const char *slot_name(const plugin *p, int slot, char *buf, size_t cap)
{
    return dp_slot_resource(slot, slot >= DP_NRES ? p->mig_profile[slot - DP_NRES] : NULL, buf,
                            cap);
}

/* The socket file of a slot ("kgpu-mig-1g.5gb.sock") into buf. */
static const char *slot_socket(const plugin *p, int slot, char *buf, size_t cap)
{
    if (slot < DP_NRES)
        snprintf(buf, cap, "%s", dp_res_socket((dp_res)slot));
    else
        snprintf(buf, cap, "kgpu-mig-%s.sock", p->mig_profile[slot - DP_NRES]);
    return buf;
}

/* Encodes every registered resource's list; on failure nothing changes. */
static int publish_lists(plugin *p, const contract_inventory *inv, const dp_mig_set *mig,
                         kgpu_error *err)
{
    uint8_t *buf[DP_SLOTS] = {0};
    size_t len[DP_SLOTS] = {0};
    int rc = 0;
    bool single = p->cfg->mig_strategy == DP_MIG_SINGLE;
    for (int s = 0; s < DP_SLOTS && rc == 0; s++) {
        if (!(p->registered & (1u << s)))
            continue;
        if (s < DP_NRES)
            rc = dp_list_encode_mig(inv, (dp_res)s, single ? mig : NULL, NULL, &buf[s], &len[s],
                                    err);
        else
            rc = dp_list_encode_mig(inv, DP_RES_WHOLE, mig, p->mig_profile[s - DP_NRES], &buf[s],
                                    &len[s], err);
    }
    if (rc != 0) {
        for (int s = 0; s < DP_SLOTS; s++)
            free(buf[s]);
        return rc;
    }
    pthread_mutex_lock(&p->inv_mu);
    p->inv = *inv;
    p->mig = *mig;
    p->inv_gen++;
    pthread_cond_signal(&p->api_cv);
    pthread_mutex_unlock(&p->inv_mu);
    for (int s = 0; s < DP_SLOTS; s++) {
        if (!(p->registered & (1u << s)))
            continue;
        node_snapshot *sn = &p->snap[s];
        pthread_mutex_lock(&sn->mu);
        free(sn->buf);
        sn->buf = buf[s];
        sn->len = len[s];
        sn->gen++;
        pthread_mutex_unlock(&sn->mu);
    }
    return 0;
}

static int start_server(plugin *p, int slot, kgpu_error *err);

/*
 * The instances on the MIG-enabled GPUs among gpus, listed through NVML at
 * most once a second (the fake inventory has no MIG); errors are logged
 * when they change and leave that GPU's instances out.
 */
static void list_mig(plugin *p, const kgpu_gpu_info *gpus, int n)
{
    if (p->cfg->mig_strategy == DP_MIG_NONE || p->nvml == NULL || dp_now_s() < p->next_mig_list)
        return;
    p->next_mig_list = dp_now_s() + 1;
    int nf = 0;
    char err_now[sizeof(p->mig_err)] = "";
    for (int i = 0; i < n; i++) {
        if (gpus[i].mig_mode != 1)
            continue;
        kgpu_nvml_mig ms[KGPU_NVML_MIG_MAX];
        int k = 0;
        kgpu_error e = {0};
        if (kgpu_nvml_mig_list(p->nvml, gpus[i].index, ms, KGPU_NVML_MIG_MAX, &k, &e) != 0) {
            snprintf(err_now, sizeof(err_now), "%s", e.msg);
            continue;
        }
        for (int j = 0; j < k && nf < DP_MIG_DEVS_MAX; j++)
            dp_mig_dev_of(&gpus[i], &ms[j], &p->mig_found[nf++]);
    }
    p->nmig_found = nf;
    if (strcmp(err_now, p->mig_err) != 0 && err_now[0] != '\0')
        kgpu_log(KGPU_LOG_WARN, "listing MIG instances: %s", err_now);
    snprintf(p->mig_err, sizeof(p->mig_err), "%s", err_now);
}

/* Gives each profile of mig a slot (mixed); devices of profiles past DP_MIG_RES_MAX go. */
static void add_profile_slots(plugin *p, dp_mig_set *mig)
{
    for (int i = 0; i < mig->n; i++) {
        const char *prof = mig->dev[i].profile;
        int k = 0;
        while (k < p->nmig_res && strcmp(p->mig_profile[k], prof) != 0)
            k++;
        char res[80];
        if (k < p->nmig_res)
            continue;
        if (k >= DP_MIG_RES_MAX || !dp_mig_resource(prof, res, sizeof(res))) {
            if (!p->mig_full_said)
                kgpu_log(KGPU_LOG_WARN, "MIG profile %s: no resource for it (at most %d "
                                        "profiles per node); its devices are not advertised",
                         prof, DP_MIG_RES_MAX);
            p->mig_full_said = true;
            mig->dev[i--] = mig->dev[--mig->n];
            continue;
        }
        size_t len = strnlen(prof, sizeof(p->mig_profile[k]) - 1);
        memcpy(p->mig_profile[k], prof, len); /* prof lies in p->mig_next: not snprintf */
        p->mig_profile[k][len] = '\0';
        p->nmig_res = k + 1;
        p->registered |= 1u << (DP_NRES + k);
        kgpu_log(KGPU_LOG_INFO, "MIG profile %s: registering %s", prof, res);
    }
}

/* Logs the MIG devices that came and went between two advertised sets. */
static void log_mig_changes(const dp_mig_set *was, const dp_mig_set *now, dp_mig_strategy s)
{
    for (int i = 0; i < now->n; i++) {
        const dp_mig_dev *d = &now->dev[i];
        char res[80];
        if (dp_mig_find(was, d->uuid) < 0)
            kgpu_log(KGPU_LOG_INFO, "MIG device %s (%s, %" PRId64 " MiB, GPU %d %s): advertised "
                                    "as %s",
                     d->uuid, d->profile, d->memory_mib, d->gpu_index, d->gpu_uuid,
                     s == DP_MIG_SINGLE ? dp_res_name(DP_RES_WHOLE)
                     : dp_mig_resource(d->profile, res, sizeof(res)) ? res
                                                                     : "?");
    }
    for (int i = 0; i < was->n; i++)
        if (dp_mig_find(now, was->dev[i].uuid) < 0)
            kgpu_log(KGPU_LOG_INFO, "MIG device %s (%s, GPU %d): gone, no longer advertised",
                     was->dev[i].uuid, was->dev[i].profile, was->dev[i].gpu_index);
}

/*
 * Takes a new set of GPUs (and health) and of MIG instances when either
 * differs from the current one. GPUs in MIG mode are left out of the
 * inventory (no whole GPU, no shares: CUDA cannot use them without an
 * instance); their instances are advertised as --mig-strategy says.
 */
static int update_inventory(plugin *p, const kgpu_gpu_info *gpus, int n, kgpu_error *err)
{
    if (n > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "%d GPUs: at most %d per node", n,
                              KGPU_MAX_GPUS_PER_NODE);
    memcpy(p->all, gpus, (size_t)n * sizeof(*gpus));
    p->nall = n;
    contract_inventory next = {.ngpus = 0, .unit_mib = p->cfg->node.unit_mib};
    for (int i = 0; i < n; i++) {
        if (gpus[i].mig_mode != 1) {
            next.gpus[next.ngpus++] = gpus[i];
            continue;
        }
        if (!p->mig_said[i])
            kgpu_log(KGPU_LOG_INFO,
                     "GPU %d %s is in MIG mode: not offered whole or as kgpu.io shares (CUDA "
                     "cannot use it without an instance); %s",
                     gpus[i].index, gpus[i].uuid,
                     p->cfg->mig_strategy == DP_MIG_NONE
                         ? "its instances are not advertised (--mig-strategy none)"
                         : "its existing instances are advertised (--mig-strategy)");
        p->mig_said[i] = true;
    }
    /* Health comes from the parent, which the listing does not reread. */
    for (int i = 0; i < p->nmig_found; i++)
        for (int g = 0; g < n; g++)
            if (p->mig_found[i].gpu_index == gpus[g].index)
                p->mig_found[i].healthy = gpus[g].healthy;
    list_mig(p, gpus, n);
    dp_mig_set *mig = &p->mig_next;
    char why[DP_MIG_WHY_MAX];
    int nwhole = p->cfg->mig_strategy == DP_MIG_SINGLE ? next.ngpus : 0;
    if (dp_mig_plan(p->cfg->mig_strategy, p->mig_found, p->nmig_found, nwhole, mig, why,
                    sizeof(why)) != 0 &&
        strcmp(why, p->mig_why) != 0)
        kgpu_log(KGPU_LOG_WARN, "MIG: %s", why);
    snprintf(p->mig_why, sizeof(p->mig_why), "%s", why);
    if (p->cfg->mig_strategy == DP_MIG_MIXED)
        add_profile_slots(p, mig);
    bool same_mig = mig->n == p->mig.n &&
                    memcmp(mig->dev, p->mig.dev, (size_t)mig->n * sizeof(mig->dev[0])) == 0;
    if (node_same_gpus(&p->inv, next.gpus, next.ngpus) && same_mig)
        return 0;
    for (int i = 0; i < next.ngpus; i++) {
        const kgpu_gpu_info *g = &next.gpus[i];
        int was = contract_inventory_find(&p->inv, g->uuid);
        if (was < 0 || p->inv.gpus[was].healthy != g->healthy)
            kgpu_log(g->healthy ? KGPU_LOG_INFO : KGPU_LOG_WARN,
                     "GPU %d %s %s, %" PRId64 " MiB, NUMA %d: %s", g->index, g->uuid, g->model,
                     g->memory_mib, g->numa, g->healthy ? "healthy" : "UNHEALTHY");
    }
    log_mig_changes(&p->mig, mig, p->cfg->mig_strategy);
    int rc = publish_lists(p, &next, mig, err);
    /* A profile that appeared after the servers started gets its own now. */
    for (int s = DP_NRES; rc == 0 && p->serving && s < DP_NRES + p->nmig_res; s++)
        if (p->srv[s] == NULL && (rc = start_server(p, s, err)) != 0)
            break;
    return rc;
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
    kgpu_error e = {0};
    (void)node_drain_xids(p->nvml, p->xid_bad, "marking it unhealthy until the plugin restarts");
    kgpu_gpu_info gpus[KGPU_MAX_GPUS_PER_NODE];
    int n = p->nall;
    memcpy(gpus, p->all, (size_t)n * sizeof(gpus[0]));
    for (int i = 0; i < n; i++)
        gpus[i].healthy = !p->xid_bad[gpus[i].index] && kgpu_nvml_alive(p->nvml, gpus[i].index);
    if (update_inventory(p, gpus, n, &e) != 0)
        kgpu_log(KGPU_LOG_ERROR, "%s", e.msg);
}

/* ---- sockets and registration ---- */

static int start_server(plugin *p, int slot, kgpu_error *err)
{
    char path[1200], name[80], sock[80];
    slot_name(p, slot, name, sizeof(name));
    sock_path(p, slot_socket(p, slot, sock, sizeof(sock)), path, sizeof(path));
    p->srv_ctx[slot] = (res_ctx){p, slot < DP_NRES ? (dp_res)slot : DP_RES_WHOLE, slot};
    p->srv[slot] = node_server_start(path, name, DP_LIST_AND_WATCH, &p->snap[slot],
                                     dp_plugin_unary, &p->srv_ctx[slot], err);
    if (p->srv[slot] == NULL)
        return err->code ? err->code : KGPU_EIO;
    struct stat st;
    p->sock_ino[slot] = stat(path, &st) == 0 ? st.st_ino : 0;
    p->need_register[slot] = true;
    kgpu_log(KGPU_LOG_INFO, "serving %s on %s", name, path);
    return 0;
}

/* Restarts servers whose socket vanished (kubelet removes them when it restarts). */
static void watch_sockets(plugin *p)
{
    char path[1200], name[80], sock[80];
    struct stat st;
    for (int s = 0; s < DP_SLOTS; s++) {
        if (!(p->registered & (1u << s)))
            continue;
        sock_path(p, slot_socket(p, s, sock, sizeof(sock)), path, sizeof(path));
        if (p->srv[s] != NULL && stat(path, &st) == 0 && st.st_ino == p->sock_ino[s])
            continue;
        kgpu_log(KGPU_LOG_WARN, "%s: socket %s is gone (kubelet restarted?); serving it again",
                 slot_name(p, s, name, sizeof(name)), path);
        node_server_stop(p->srv[s]);
        p->srv[s] = NULL;
        kgpu_error e = {0};
        if (start_server(p, s, &e) != 0)
            kgpu_log(KGPU_LOG_ERROR, "%s", e.msg);
    }
    sock_path(p, "kubelet.sock", path, sizeof(path));
    ino_t ino = stat(path, &st) == 0 ? st.st_ino : 0;
    if (ino != p->kubelet_ino) {
        if (ino != 0)
            kgpu_log(KGPU_LOG_INFO, "kubelet socket %s appeared; registering", path);
        p->kubelet_ino = ino;
        for (int s = 0; s < DP_SLOTS; s++)
            p->need_register[s] = (p->registered & (1u << s)) != 0;
        p->next_register = 0;
    }
    if (ino == 0 || dp_now_s() < p->next_register)
        return;
    for (int s = 0; s < DP_SLOTS; s++) {
        if (!p->need_register[s] || p->srv[s] == NULL)
            continue;
        kgpu_error e = {0};
        slot_name(p, s, name, sizeof(name));
        if (dp_register(path, slot_socket(p, s, sock, sizeof(sock)), name, true, REGISTER_MS,
                        &e) == 0) {
            p->need_register[s] = false;
            kgpu_log(KGPU_LOG_INFO, "registered %s with kubelet", name);
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
    char ckpt[1200];
    snprintf(ckpt, sizeof(ckpt), "%s/%s", p->cfg->plugin_dir, DP_KUBELET_CKPT_NAME);
    dp_watch_sources src = {.k8s = p->k8s,
                            .node_name = p->cfg->node.node_name,
                            .state_dir = p->cfg->node.state_dir,
                            .nvml_lib = p->cfg->node.nvml_lib,
                            .kubelet_ckpt = ckpt};
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
    for (int s = 0; s < DP_SLOTS; s++)
        pthread_mutex_init(&p->snap[s].mu, NULL);
    p->inv.unit_mib = cfg->node.unit_mib;
    p->registered = 1u << DP_RES_MEM | 1u << DP_RES_CORE;
    /* NVIDIA's single strategy: every MIG device is an nvidia.com/gpu. */
    if (cfg->whole_gpus || cfg->mig_strategy == DP_MIG_SINGLE)
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
        rc = publish_lists(p, &empty, &p->mig, err);
    }
    for (int s = 0; s < DP_SLOTS && rc == 0; s++)
        if (p->registered & (1u << s))
            rc = start_server(p, s, err);
    p->serving = rc == 0;
    if (rc == 0)
        rc = dp_api_start(p, err);
    if (rc == 0)
        rc = start_watcher(p, err);
    if (rc == 0)
        kgpu_log(KGPU_LOG_INFO,
                 "kgpu-device-plugin %s on node %s: %d GPUs, %d MIG devices, memory unit "
                 "%" PRId64 " MiB, %s",
                 KGPU_VERSION, cfg->node.node_name[0] ? cfg->node.node_name : "(unnamed)",
                 p->inv.ngpus, p->mig.n, cfg->node.unit_mib,
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
    for (int s = 0; s < DP_SLOTS; s++)
        node_server_stop(p->srv[s]);
    for (int s = 0; s < DP_SLOTS; s++) {
        free(p->snap[s].buf);
        pthread_mutex_destroy(&p->snap[s].mu);
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

