/*
 * The DRA driver daemon: discovers the GPUs (src/gpu, as the device plugin
 * does), publishes the node's ResourceSlice, registers with kubelet's plugin
 * watcher and answers the DRA node service.
 *
 * kubelet's side, as v1.37 does it (pkg/kubelet/cm/dra, pluginmanager):
 *   - its plugin watcher finds <registry>/gpu.kgpu.io-reg.sock, calls
 *     GetInfo, and accepts a plugin of type "DRAPlugin" whose
 *     supported_versions names gRPC services it speaks ("v1.DRAPlugin",
 *     "v1beta1.DRAPlugin"): it takes the first of the plugin's list that it
 *     knows, so v1 is listed first. The health service (DRAResourceHealth)
 *     is optional: kubelet calls it only when advertised, and kgpu does not
 *     advertise it yet.
 *   - NodePrepareResources carries each claim's namespace, UID and name,
 *     nothing of the allocation: the driver reads the ResourceClaim. The
 *     answer needs an entry for every claim (a missing one fails the pod);
 *     an entry's error fails that claim, and kubelet retries.
 *   - kubelet deletes the node's slices of a driver whose plugin stayed
 *     unregistered for a while (wipingDelay), so the driver never deletes
 *     its own slice: a driver upgrade does not make the devices vanish.
 *
 * Prepare and Unprepare run one at a time (claim mutex): the checkpoint and
 * the files are changed together.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"
#include "log.h"

#define DISCOVER_S 10 /* NVML re-read: a GPU lost leaves the slice within seconds */

/* ---- inventory ---- */

static void set_inventory(driver *d, const kgpu_gpu_info *g, int n)
{
    if (n > KGPU_MAX_GPUS_PER_NODE)
        n = KGPU_MAX_GPUS_PER_NODE;
    pthread_mutex_lock(&d->inv_mu);
    bool same = node_same_gpus(&d->inv, g, n);
    if (!same) {
        d->inv.ngpus = n;
        memcpy(d->inv.gpus, g, (size_t)n * sizeof(*g));
        d->inv_gen++;
    }
    pthread_mutex_unlock(&d->inv_mu);
    if (!same)
        kgpu_log(KGPU_LOG_INFO, "inventory: %d GPUs", n);
}

static int take_fake(void *d, const kgpu_gpu_info *gpus, int n, kgpu_error *err)
{
    (void)err;
    set_inventory(d, gpus, n);
    return 0;
}

/* Re-reads the fake inventory when its file changed (node_fake_poll). */
static int poll_fake(driver *d, bool first, kgpu_error *err)
{
    return node_fake_poll(d->cfg->node.fake_gpus, &d->fake_st, first, take_fake, d, err);
}

/*
 * Health on the NVML path, as the device plugin judges it: a GPU that
 * reported a critical XID stays unhealthy until the driver restarts, and a
 * GPU that stops answering (lost, fallen off the bus) is kept in the
 * inventory as unhealthy instead of vanishing from it. Either way its
 * devices stay published with the unhealthy taint (slice.c), so the
 * scheduler allocates them to no new claim while the claims prepared on it
 * still name devices the slice has.
 */
static void judge_health(driver *d, kgpu_gpu_info *gpus, int *n)
{
    for (int i = 0; i < *n; i++) {
        int x = gpus[i].index;
        gpus[i].healthy = gpus[i].healthy && kgpu_nvml_alive(d->nvml, x) &&
                          !(x >= 0 && x < KGPU_MAX_GPUS_PER_NODE && d->xid_bad[x]);
    }
    pthread_mutex_lock(&d->inv_mu);
    for (int k = 0; k < d->inv.ngpus && *n < KGPU_MAX_GPUS_PER_NODE; k++) {
        const kgpu_gpu_info *old = &d->inv.gpus[k];
        bool here = false;
        for (int i = 0; i < *n && !here; i++)
            here = strcmp(gpus[i].uuid, old->uuid) == 0 || gpus[i].index == old->index;
        if (!here) {
            if (old->healthy)
                kgpu_log(KGPU_LOG_WARN, "GPU %d (%s) stopped answering NVML: tainting its "
                         "devices", old->index, old->uuid);
            gpus[*n] = *old;
            gpus[(*n)++].healthy = false;
        }
    }
    pthread_mutex_unlock(&d->inv_mu);
}

static int poll_nvml(driver *d, kgpu_error *err)
{
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    kgpu_error e = {0};
    int rc = kgpu_nvml_discover(d->nvml, &gpus, &n, &e);
    kgpu_gpu_info *all = rc == 0 ? calloc(KGPU_MAX_GPUS_PER_NODE, sizeof(*all)) : NULL;
    if (rc == 0 && all == NULL)
        rc = kgpu_error_set(&e, KGPU_ENOMEM, "out of memory");
    if (rc == 0) {
        /* discover answers at most KGPU_MAX_GPUS_PER_NODE; room for the lost ones. */
        memcpy(all, gpus, (size_t)n * sizeof(*all));
        judge_health(d, all, &n);
        set_inventory(d, all, n);
    } else if (err != NULL) {
        *err = e;
    } else {
        kgpu_log(KGPU_LOG_ERROR, "%s (keeping the previous inventory)", e.msg);
    }
    free(all);
    free(gpus);
    return rc;
}

/* ---- MIG instances through NVML (dra_mig_ops; ctx: the kgpu_nvml handle) ---- */

static int mig_list(void *ctx, int index, kgpu_nvml_mig *out, int cap, int *n, kgpu_error *err)
{
    return kgpu_nvml_mig_list(ctx, index, out, cap, n, err);
}

static int mig_create(void *ctx, int index, int nvml_profile, int start, kgpu_nvml_mig *out,
                      kgpu_error *err)
{
    return kgpu_nvml_mig_create(ctx, index, nvml_profile, start, out, err);
}

static int mig_destroy(void *ctx, int index, unsigned gi_id, kgpu_error *err)
{
    return kgpu_nvml_mig_destroy(ctx, index, gi_id, err);
}

/* ---- life cycle ---- */

/* The driver needs the API server (claims are read from it): no account is an error. */
static int connect_api(driver *d, kgpu_error *err)
{
    bool no_cluster;
    return node_k8s_connect(d->cfg->node.kubeconfig, &d->k8s, &no_cluster, err);
}

static int make_dirs(const char *path, mode_t mode, kgpu_error *err)
{
    char buf[1100];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return kgpu_error_set(err, KGPU_EIO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return kgpu_error_set(err, KGPU_EIO, "mkdir %s: %s", buf, strerror(errno));
    return 0;
}

static int start_servers(driver *d, kgpu_error *err)
{
    /* The names begin the servers' log lines. */
    if (d->dra == NULL && (d->dra = node_server_start(d->dra_sock, DRA_DRIVER " DRA", NULL, NULL,
                                                      dra_on_call, d, err)) == NULL)
        return err->code ? err->code : KGPU_EIO;
    /* Registration last: kubelet dials the DRA socket as soon as it has registered us. */
    if (d->reg == NULL && (d->reg = node_server_start(d->reg_sock, DRA_DRIVER " registration",
                                                      NULL, NULL, dra_on_call, d, err)) == NULL)
        return err->code ? err->code : KGPU_EIO;
    return 0;
}

/* The registration socket is gone (someone emptied kubelet's folder): serve it again. */
static void watch_socket(driver *d)
{
    struct stat st;
    if (d->reg == NULL || stat(d->reg_sock, &st) == 0)
        return;
    kgpu_log(KGPU_LOG_WARN, "%s disappeared: serving it again for kubelet's plugin watcher",
             d->reg_sock);
    node_server_stop(d->reg);
    d->reg = NULL;
    kgpu_error e = {0};
    if (start_servers(d, &e) != 0)
        kgpu_log(KGPU_LOG_ERROR, "%s", e.msg);
}

/*
 * Rewrites the files of every checkpointed claim: /var/run/cdi is lost on a
 * reboot, and so are MIG instances. An instance NVML still lists is kept; one
 * that is gone is made again at the same placement, and the CDI spec then
 * names its new UUID. One that cannot be made is logged: kubelet's Prepare
 * of that claim tries again and answers the error.
 */
static void restore_claims(driver *d)
{
    pthread_mutex_lock(&d->claim_mu);
    bool save = false;
    for (int i = 0; i < d->ck.n; i++) {
        dra_claim *c = &d->ck.claims[i];
        kgpu_error e = {0};
        bool changed = false;
        if (dra_instances_ensure(&d->mig, &d->ck, c, &changed, &e) != 0) {
            /* No spec naming the parent GPU in the instance's place: none at all. */
            kgpu_log(KGPU_LOG_WARN, "restoring claim %s: %s", c->uid, e.msg);
            char path[1200];
            dra_cdi_path(d->cfg->cdi_dir, c->uid, path, sizeof(path));
            (void)unlink(path);
            save |= changed;
            continue;
        }
        if (changed)
            kgpu_log(KGPU_LOG_INFO, "claim %s/%s (%s): MIG instances made again", c->ns,
                     c->name, c->uid);
        save |= changed;
        if (dra_claim_files_write(c, &d->inv, &d->paths, d->cfg->cdi_dir, &e) != 0)
            kgpu_log(KGPU_LOG_WARN, "restoring claim %s: %s", c->uid, e.msg);
    }
    kgpu_error e = {0};
    if (save && dra_ckpt_save(d->ckpt_path, &d->ck, &e) != 0)
        kgpu_log(KGPU_LOG_ERROR, "%s", e.msg);
    pthread_mutex_unlock(&d->claim_mu);
}

static int start(driver *d, kgpu_error *err)
{
    const dra_config *cfg = d->cfg;
    if (cfg->node.node_name[0] == '\0')
        return kgpu_error_set(err, KGPU_EINVAL, "the node's name is unknown: set --node-name or "
                                                "NODE_NAME");
    /* As the device plugin: no claim prepared with MPS limits that no daemon enforces. */
    int rc;
    if (cfg->node.sharing == CONTRACT_SHARING_MPS &&
        (rc = contract_mps_check(cfg->node.mps_pipe_dir, err)) != 0)
        return rc;
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s/%s", cfg->plugin_dir, DRA_DRIVER);
    snprintf(d->dra_sock, sizeof(d->dra_sock), "%s/%s/dra.sock", cfg->plugin_dir, DRA_DRIVER);
    snprintf(d->reg_sock, sizeof(d->reg_sock), "%s/%s-reg.sock", cfg->registry_dir, DRA_DRIVER);
    snprintf(d->ckpt_path, sizeof(d->ckpt_path), "%s/checkpoint.json", cfg->node.state_dir);
    if ((rc = make_dirs(cfg->node.state_dir, 0755, err)) != 0 ||
        (rc = make_dirs(dir, 0750, err)) != 0 ||
        (rc = make_dirs(cfg->registry_dir, 0750, err)) != 0 ||
        (rc = contract_write_preload(&d->paths, err)) != 0)
        return rc;
    if ((rc = dra_ckpt_load(d->ckpt_path, &d->ck, err)) != 0)
        return rc;
    if ((rc = connect_api(d, err)) != 0)
        return rc;
    if (cfg->node.fake_gpus[0] != '\0') {
        rc = poll_fake(d, true, err);
    } else {
        rc = kgpu_nvml_open(cfg->node.nvml_lib[0] ? cfg->node.nvml_lib : NULL,
                            cfg->node.sysfs[0] ? cfg->node.sysfs : NULL, &d->nvml, err);
        if (rc == 0)
            rc = poll_nvml(d, err);
        d->mig = (dra_mig_ops){.ctx = d->nvml,
                               .list = mig_list,
                               .create = mig_create,
                               .destroy = mig_destroy};
        d->rediscover_at = dra_now_s() + DISCOVER_S;
    }
    if (rc != 0)
        return rc;
    restore_claims(d);
    if (pthread_create(&d->pub, NULL, dra_publisher, d) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the publisher thread");
    d->pub_started = true;
    if ((rc = start_servers(d, err)) != 0)
        return rc;
    kgpu_log(KGPU_LOG_INFO,
             "kgpu-dra-plugin %s on node %s: %d GPUs, %d prepared claims, DRA socket %s, "
             "registration %s",
             KGPU_VERSION, cfg->node.node_name, d->inv.ngpus, d->ck.n, d->dra_sock, d->reg_sock);
    return 0;
}

int dra_run(const dra_config *cfg, atomic_bool *stop, kgpu_error *err)
{
    driver *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    d->cfg = cfg;
    d->stop = stop;
    d->inv.unit_mib = cfg->node.unit_mib;
    pthread_mutex_init(&d->inv_mu, NULL);
    pthread_mutex_init(&d->claim_mu, NULL);
    node_contract_paths(&cfg->node, d->shim, sizeof(d->shim), &d->paths);
    int rc = start(d, err);
    while (rc == 0 && !atomic_load(stop)) {
        if (cfg->node.fake_gpus[0] != '\0') {
            (void)poll_fake(d, false, NULL);
        } else if (node_drain_xids(d->nvml, d->xid_bad,
                                   "tainting its devices until the driver restarts") > 0 ||
                   dra_now_s() >= d->rediscover_at) {
            (void)poll_nvml(d, NULL);
            d->rediscover_at = dra_now_s() + DISCOVER_S;
        }
        watch_socket(d);
        struct timespec ts = {0, LOOP_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(stop, true);
    /* Registration first, so kubelet stops sending work before the DRA socket goes. */
    node_server_stop(d->reg);
    node_server_stop(d->dra);
    if (d->pub_started)
        pthread_join(d->pub, NULL);
    if (d->nvml != NULL)
        kgpu_nvml_close(d->nvml);
    kgpu_k8s_free(d->k8s);
    dra_ckpt_free(&d->ck);
    pthread_mutex_destroy(&d->claim_mu);
    pthread_mutex_destroy(&d->inv_mu);
    free(d);
    if (rc == 0)
        kgpu_log(KGPU_LOG_INFO, "stopped");
    return rc;
}
