/*
 * Which container a GPU process belongs to, for the watcher (watchstate.h):
 * the pod UID and container ID from the kernel's cgroup record, the names
 * from the API server's pod list (or the pod's single limits file), and the
 * container's share from its limits file.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fileio.h"
#include "log.h"
#include "shimlimits.h"
#include "watcher.h"
#include "watchstate.h"

/* ---- which container a process belongs to ---- */

/* 0 with *id filled, or the parser's code (KGPU_ENOENT: not a pod's container). */
int dp_watch_process_container(const dp_watcher *w, unsigned pid, dp_cgroup_id *id)
{
    char path[DP_WATCH_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/%u/cgroup", w->cfg.proc_root, pid);
    char *buf = NULL;
    size_t len = 0;
    kgpu_error e = {0};
    if (kgpu_read_file_max(path, CGROUP_FILE_MAX, &buf, &len, &e) != KGPU_OK)
        return KGPU_EIO; /* gone already, or not ours to read */
    int rc = dp_cgroup_parse(buf, len, id, &e);
    free(buf);
    return rc;
}

bool dp_watch_is_kgpu_pod(const dp_watcher *w, const char *uid)
{
    char path[1200];
    struct stat st;
    snprintf(path, sizeof(path), "%s/pods/%s", w->state_dir, uid);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

wentry *dp_watch_entry_for(dp_watcher *w, const dp_cgroup_id *id, int gpu)
{
    for (int i = 0; i < w->nentries; i++) {
        wentry *e = &w->entries[i];
        if (e->gpu == gpu && strcmp(e->id.container_id, id->container_id) == 0 &&
            strcmp(e->id.pod_uid, id->pod_uid) == 0)
            return e;
    }
    if (w->nentries >= ENTRIES_MAX)
        return NULL;
    wentry *e = &w->entries[w->nentries++];
    memset(e, 0, sizeof(*e));
    e->id = *id;
    e->gpu = gpu;
    e->share = -1;
    e->core_share = -1;
    return e;
}

/* The pod list's containerID is "<runtime>://<id>". */
static const char *bare_container_id(const char *s)
{
    const char *p = s != NULL ? strstr(s, "://") : NULL;
    return p != NULL ? p + 3 : s;
}

static void pod_from_json(json_t *item, wpod *p)
{
    memset(p, 0, sizeof(*p));
    json_t *meta = json_object_get(item, "metadata");
    snprintf(p->uid, sizeof(p->uid), "%s", json_string_value(json_object_get(meta, "uid")) ?: "");
    snprintf(p->ns, sizeof(p->ns), "%s",
             json_string_value(json_object_get(meta, "namespace")) ?: "");
    snprintf(p->name, sizeof(p->name), "%s",
             json_string_value(json_object_get(meta, "name")) ?: "");
    static const char *const lists[] = {"initContainerStatuses", "containerStatuses",
                                        "ephemeralContainerStatuses"};
    json_t *status = json_object_get(item, "status");
    for (size_t l = 0; l < 3; l++) {
        json_t *arr = json_object_get(status, lists[l]);
        for (size_t i = 0; i < json_array_size(arr) && p->ncont < POD_CONTAINERS_MAX; i++) {
            json_t *c = json_array_get(arr, i);
            const char *id =
                bare_container_id(json_string_value(json_object_get(c, "containerID")));
            const char *name = json_string_value(json_object_get(c, "name"));
            if (id == NULL || name == NULL || strlen(id) >= DP_CONTAINER_ID_MAX)
                continue;
            snprintf(p->cont[p->ncont].id, sizeof(p->cont[0].id), "%s", id);
            snprintf(p->cont[p->ncont].name, sizeof(p->cont[0].name), "%s", name);
            p->ncont++;
        }
    }
}

/* Replaces the pod cache with a fresh list of this node's pods. */
void dp_watch_list_pods(dp_watcher *w)
{
    w->listed_at = dp_watch_mono_s();
    char query[KGPU_K8S_PATH_MAX];
    snprintf(query, sizeof(query), "fieldSelector=spec.nodeName%%3D%s", w->node);
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_error e = {0};
    if (kgpu_k8s_list(w->k8s, "/api/v1/pods", query, NULL, &items, rv, sizeof(rv), NULL, &e) !=
        0) {
        kgpu_log(KGPU_LOG_WARN, "watcher: listing the node's pods: %s", e.msg);
        return;
    }
    size_t n = json_array_size(items);
    wpod *pods = calloc(n ? n : 1, sizeof(*pods));
    if (pods == NULL) {
        json_decref(items);
        return;
    }
    for (size_t i = 0; i < n; i++)
        pod_from_json(json_array_get(items, i), &pods[i]);
    json_decref(items);
    free(w->pods);
    w->pods = pods;
    w->npods = (int)n;
}

/* Fills the entry's names from the cache; false when the cache does not know it. */
bool dp_watch_resolve_from_cache(const dp_watcher *w, wentry *e)
{
    for (int i = 0; i < w->npods; i++) {
        const wpod *p = &w->pods[i];
        if (strcmp(p->uid, e->id.pod_uid) != 0)
            continue;
        snprintf(e->ns, sizeof(e->ns), "%s", p->ns);
        snprintf(e->pod, sizeof(e->pod), "%s", p->name);
        for (int c = 0; c < p->ncont; c++)
            if (strcmp(p->cont[c].id, e->id.container_id) == 0) {
                snprintf(e->name, sizeof(e->name), "%s", p->cont[c].name);
                return true;
            }
        return false;
    }
    return false;
}

/*
 * Without the container's name from the API server: a pod whose directory
 * holds exactly one limits file has one GPU container, so it is that one.
 */
void dp_watch_resolve_single(const dp_watcher *w, wentry *e)
{
    char dir[1200];
    snprintf(dir, sizeof(dir), "%s/pods/%s", w->state_dir, e->id.pod_uid);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    int found = 0;
    char name[64] = "";
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t n = strlen(de->d_name);
        if (n > 7 && strcmp(de->d_name + n - 7, ".limits") == 0 && n - 7 < sizeof(name)) {
            found++;
            snprintf(name, sizeof(name), "%.*s", (int)(n - 7), de->d_name);
        }
    }
    closedir(d);
    if (found == 1)
        snprintf(e->name, sizeof(e->name), "%s", name);
}

/* The share of the entry's container on its GPU, from the limits file Allocate wrote. */
static bool exempt(const dp_watcher *w, const wentry *e)
{
    for (int i = 0; i < w->cfg.nexempt; i++)
        if (e->ns[0] != '\0' && strcmp(w->cfg.exempt[i], e->ns) == 0)
            return true;
    return false;
}

const dp_ckpt_holder *dp_watch_holder(const dp_watcher *w, const char *device)
{
    for (int i = 0; i < w->nheld; i++)
        if (strcmp(w->held[i].device, device) == 0)
            return &w->held[i];
    return NULL;
}

/*
 * A MIG device's share: the whole instance for the container kubelet gave
 * it (by pod, and by name once the API server has named the entry), zero
 * for any other pod's; unknown while kubelet's checkpoint cannot be read.
 */
static void read_mig_share(const dp_watcher *w, wentry *e)
{
    e->unallocated = false;
    if (!w->held_known)
        return;
    const dp_ckpt_holder *h = dp_watch_holder(w, w->gpus[e->gpu].uuid);
    if (h != NULL && strcmp(h->pod_uid, e->id.pod_uid) == 0 &&
        (e->name[0] == '\0' || strcmp(h->container, e->name) == 0)) {
        e->share = w->gpus[e->gpu].memory_mib * MIB;
        e->core_share = 100;
        return;
    }
    e->share = exempt(w, e) ? -1 : 0;
    e->core_share = e->share;
    e->unallocated = e->share == 0;
}

void dp_watch_read_share(const dp_watcher *w, wentry *e)
{
    e->share = -1;
    e->core_share = -1;
    if (e->gpu >= w->nphys) {
        read_mig_share(w, e);
        return;
    }
    if (e->unallocated && !dp_watch_is_kgpu_pod(w, e->id.pod_uid)) {
        /* A pod kgpu never allocated a GPU: none of any GPU is its. */
        e->share = exempt(w, e) ? -1 : 0;
        e->core_share = e->share;
        e->unallocated = e->share == 0;
        return;
    }
    e->unallocated = false;
    if (e->name[0] == '\0' || strchr(e->name, '/') != NULL)
        return;
    char path[1400];
    snprintf(path, sizeof(path), "%s/pods/%s/%s.limits", w->state_dir, e->id.pod_uid, e->name);
    char *buf = NULL;
    size_t len = 0;
    kgpu_error err = {0};
    if (kgpu_read_file_max(path, 64 * 1024, &buf, &len, &err) != KGPU_OK) {
        /*
         * A container of a kgpu pod that Allocate gave nothing (a sidecar
         * asking no GPU), using one anyway: its share is zero. The limits
         * file is written before kubelet creates the container, so a
         * container that has processes has its file if it ever will.
         */
        struct stat st;
        if (stat(path, &st) != 0 && errno == ENOENT && !exempt(w, e)) {
            e->share = 0;
            e->core_share = 0;
            e->unallocated = true;
        }
        return;
    }
    kgpu_shim_limits lim;
    int rc = kgpu_shim_limits_parse(buf, len, path, &lim, &err);
    free(buf);
    if (rc != KGPU_OK) {
        kgpu_log(KGPU_LOG_WARN, "watcher: %s", err.msg);
        return;
    }
    int k = kgpu_shim_limits_find(&lim, w->gpus[e->gpu].uuid);
    if (k < 0) {
        /* A GPU the container was not given: its share there is nothing. */
        e->share = 0;
        e->core_share = 0;
        return;
    }
    e->share = (int64_t)lim.dev[k].memory_mib * MIB;
    e->core_share = lim.dev[k].core_pct < 0 ? 100 : lim.dev[k].core_pct;
}
