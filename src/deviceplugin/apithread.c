/*
 * The device plugin's API thread (plugin.h): publishes the node's inventory
 * at the API server's pace, with backoff, and removes the directories of
 * pods that are gone, so the main loop never waits on the API server.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fileio.h"
#include "kubeletckpt.h"
#include "log.h"
#include "plugin.h"

#define GC_EVERY_S    60
#define PUBLISH_MAX_S 30

/* ---- removing the directories of pods that are gone ---- */

/*
 * The pods kubelet's device manager still lists (a new object keyed by pod
 * UID), or NULL when that cannot be known (logged): then nothing is removed.
 * No checkpoint at all means kubelet has allocated nothing: an empty object.
 */
static json_t *kubelet_pods(const plugin *p)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/%s", p->cfg->plugin_dir, DP_KUBELET_CKPT_NAME);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return json_object();
    char *buf = NULL;
    size_t len = 0;
    json_t *pods = NULL;
    kgpu_error e = {0};
    if (kgpu_read_file_max(path, DP_KUBELET_CKPT_MAX, &buf, &len, &e) == 0)
        (void)dp_kubelet_ckpt_parse(buf, len, path, &pods, &e);
    free(buf);
    if (pods == NULL)
        kgpu_log(KGPU_LOG_WARN,
                 "pod directory cleanup skipped: %s (which pods' containers still run is unknown)",
                 e.msg);
    return pods;
}

/* Whether the API server's list of the node's pods has one with this UID. */
static bool listed(const json_t *items, const char *uid)
{
    for (size_t i = 0; i < json_array_size(items); i++) {
        const char *u = json_string_value(
            json_object_get(json_object_get(json_array_get(items, i), "metadata"), "uid"));
        if (u != NULL && strcmp(u, uid) == 0)
            return true;
    }
    return false;
}

/*
 * A MIG device's folder (allocate.c: named by its UUID, not a pod's) stays
 * while the device is advertised: the next container given it reuses it.
 */
static bool mig_kept(plugin *p, const char *name)
{
    if (strncmp(name, "MIG-", 4) != 0)
        return false;
    pthread_mutex_lock(&p->inv_mu);
    bool kept = dp_mig_find(&p->mig, name) >= 0;
    pthread_mutex_unlock(&p->inv_mu);
    return kept;
}

/*
 * A pod's folder goes once the pod is gone from the API server AND kubelet
 * no longer lists it: a pod deleted with --grace-period=0 --force leaves
 * the API server at once while its containers still run (and write into
 * the folder) until kubelet has stopped them; kubelet's device manager
 * keeps a pod's entry until then.
 */
static void gc_pods(plugin *p)
{
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s/pods", p->cfg->node.state_dir);
    pthread_mutex_lock(&p->alloc_mu);
    kgpu_error e = {0};
    json_t *list = dp_list_node_pods(p, &e);
    if (list == NULL) {
        pthread_mutex_unlock(&p->alloc_mu);
        kgpu_log(KGPU_LOG_DEBUG, "pod directory cleanup skipped: %s", e.msg);
        return;
    }
    /* Read after the list: a pod that left the list has left it before kubelet's entry is read. */
    json_t *running = kubelet_pods(p);
    char cmd_dir[1400];
    DIR *d = running != NULL ? opendir(dir) : NULL;
    for (struct dirent *de; d != NULL && (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.' || listed(list, de->d_name) || mig_kept(p, de->d_name))
            continue;
        snprintf(cmd_dir, sizeof(cmd_dir), "%s/%s", dir, de->d_name);
        if (json_object_get(running, de->d_name) != NULL) {
            kgpu_log(KGPU_LOG_DEBUG, "keeping %s: its pod is gone but kubelet still runs it",
                     cmd_dir);
            continue;
        }
        kgpu_log(KGPU_LOG_INFO, "removing %s: its pod and its containers are gone", cmd_dir);
        /* Root removing what a container may still write: never through its symlinks. */
        kgpu_error rm = {0};
        if (kgpu_remove_tree(cmd_dir, &rm) != 0)
            kgpu_log(KGPU_LOG_WARN, "%s", rm.msg);
    }
    if (d != NULL)
        closedir(d);
    json_decref(running);
    json_decref(list);
    pthread_mutex_unlock(&p->alloc_mu);
}

/* ---- the API thread ---- */

/* Waits on api_cv (inv_mu held) until `at` on the monotonic clock, or a signal. */
static void api_wait_until(plugin *p, double at)
{
    struct timespec ts;
    double whole = (double)(long long)at;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((at - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_nsec = 999999999L;
    pthread_cond_timedwait(&p->api_cv, &p->inv_mu, &ts);
}

/*
 * Publishes the newest inventory whenever it changed (retrying with backoff
 * up to PUBLISH_MAX_S) and removes the directories of gone pods every
 * GC_EVERY_S, first at start.
 */
static void *api_loop(void *arg)
{
    plugin *p = arg;
    uint64_t published = 0;
    double retry_at = 0, backoff = 0, gc_at = 0;
    pthread_mutex_lock(&p->inv_mu);
    while (!p->api_stop) {
        double now = dp_now_s();
        bool publish = p->inv_gen != published && now >= retry_at;
        bool gc = now >= gc_at;
        if (!publish && !gc) {
            api_wait_until(p, p->inv_gen != published && retry_at < gc_at ? retry_at : gc_at);
            continue;
        }
        contract_inventory inv = p->inv;
        uint64_t gen = p->inv_gen;
        pthread_mutex_unlock(&p->inv_mu);
        if (publish) {
            double next = backoff == 0 ? 1 : backoff * 2;
            if (next > PUBLISH_MAX_S)
                next = PUBLISH_MAX_S;
            if (dp_publish_node(p, &inv, next) == 0) {
                published = gen;
                backoff = 0;
            } else {
                backoff = next;
                retry_at = dp_now_s() + backoff;
            }
        }
        if (gc) {
            gc_at = dp_now_s() + GC_EVERY_S;
            gc_pods(p);
        }
        pthread_mutex_lock(&p->inv_mu);
    }
    pthread_mutex_unlock(&p->inv_mu);
    return NULL;
}

int dp_api_start(plugin *p, kgpu_error *err)
{
    if (p->k8s == NULL)
        return 0;
    if (pthread_create(&p->api_thread, NULL, api_loop, p) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the API server thread");
    p->api_started = true;
    return 0;
}

void dp_api_stop(plugin *p)
{
    if (!p->api_started)
        return;
    pthread_mutex_lock(&p->inv_mu);
    p->api_stop = true;
    pthread_cond_signal(&p->api_cv);
    pthread_mutex_unlock(&p->inv_mu);
    pthread_join(p->api_thread, NULL);
    p->api_started = false;
}
