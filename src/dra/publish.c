/*
 * The node's ResourceSlice, kept by the publisher thread (driver.h): built
 * from the inventory (slice.c), written to the API server when it differs,
 * and not published while device plugins also serve the node's GPUs.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver.h"
#include "log.h"

/* After kubelet registers the driver, the slice is checked every DRA_RECHECK_S for this long. */
#define DRA_AFTER_REGISTRATION_S 90
#define DRA_RECHECK_S            2

/* ---- the ResourceSlice ---- */

static const char *SLICES = "/apis/resource.k8s.io/v1/resourceslices";

/*
 * The Node, read at every publish for two things. Its UID: a Node deleted
 * and made again under the same name has a new one, and a slice owned by the
 * old UID would be garbage-collected as often as it is made. And whether
 * device plugins serve its GPUs too (dra_node_gpu_conflicts).
 */
static int read_node(driver *d, kgpu_error *err)
{
    char path[512];
    snprintf(path, sizeof(path), "/api/v1/nodes/%s", d->cfg->node.node_name);
    long status = 0;
    json_t *node = kgpu_k8s_get_json(d->k8s, path, &status, err);
    if (node == NULL)
        return status ? kgpu_error_set(err, KGPU_EIO, "GET %s: HTTP %ld", path, status)
                      : (err && err->code ? err->code : KGPU_EIO);
    const char *uid = json_string_value(json_object_get(json_object_get(node, "metadata"), "uid"));
    if (uid != NULL && strlen(uid) < sizeof(d->node_uid))
        snprintf(d->node_uid, sizeof(d->node_uid), "%s", uid);
    else
        d->node_uid[0] = '\0';
    char conflicts[sizeof(d->conflicts)];
    dra_node_gpu_conflicts(node, conflicts, sizeof(conflicts));
    if (strcmp(conflicts, d->conflicts) != 0) {
        if (conflicts[0] != '\0')
            kgpu_log(KGPU_LOG_ERROR,
                     "node %s also serves GPUs through device plugins (allocatable %s): publishing "
                     "no devices until they are gone, so no GPU is handed out twice; label the "
                     "node for one path only (docs/install-dra.md)",
                     d->cfg->node.node_name, conflicts);
        else if (d->conflicts[0] != '\0')
            kgpu_log(KGPU_LOG_INFO,
                     "node %s: no device plugin serves GPUs any more: publishing them",
                     d->cfg->node.node_name);
        snprintf(d->conflicts, sizeof(d->conflicts), "%s", conflicts);
    }
    json_decref(node);
    return 0;
}

static int send_json(driver *d, const char *method, const char *path, json_t *body, long *status,
                     kgpu_error *err)
{
    char *text = json_dumps(body, JSON_COMPACT);
    if (text == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    kgpu_http_resp resp = {0};
    int rc = kgpu_k8s_request(d->k8s, method, path, "application/json", text, &resp, err);
    free(text);
    *status = resp.status;
    if (rc == 0 && (resp.status < 200 || resp.status > 299))
        rc = kgpu_error_set(err, KGPU_EIO, "%s %s: HTTP %ld: %.300s", method, path, resp.status,
                            resp.body != NULL ? resp.body : "");
    free(resp.body);
    return rc;
}

/* The slice in `items` named `name`, or NULL. */
static json_t *named(json_t *items, const char *name)
{
    size_t i;
    json_t *s;
    json_array_foreach(items, i, s)
    {
        const char *n = json_string_value(json_object_get(json_object_get(s, "metadata"), "name"));
        if (n != NULL && strcmp(n, name) == 0)
            return s;
    }
    return NULL;
}

static const char *slice_name(const json_t *s)
{
    return json_string_value(json_object_get(json_object_get(s, "metadata"), "name"));
}

static json_int_t slice_generation(const json_t *s)
{
    return json_integer_value(
        json_object_get(json_object_get(json_object_get(s, "spec"), "pool"), "generation"));
}

/*
 * Whether the server's slices (`have`, this node's of this driver) are `want`:
 * the same names, each the same (dra_slice_same), all of one generation (the
 * scheduler takes a pool only whole, from its newest generation).
 */
static bool all_same(json_t *have, const json_t *want)
{
    if (json_array_size(have) != json_array_size(want))
        return false;
    size_t i;
    json_t *w;
    json_array_foreach(want, i, w)
    {
        json_t *h = named(have, slice_name(w));
        if (h == NULL || !dra_slice_same(h, w) ||
            slice_generation(h) != slice_generation(json_array_get(have, 0)))
            return false;
    }
    return true;
}

/*
 * Makes the API server's slices of this node say what the inventory says. 0
 * when they do. A change rewrites every slice with the next generation, and
 * deletes this node's slices of the driver that are no longer wanted (fewer
 * GPUs in MIG mode, an older name or layout).
 */
static int publish(driver *d, uint64_t *gen_done, kgpu_error *err)
{
    int rc = read_node(d, err);
    if (rc != 0)
        return rc;
    kgpu_gpu_info gpus[KGPU_MAX_GPUS_PER_NODE];
    const char *ccp[KGPU_MAX_GPUS_PER_NODE];
    pthread_mutex_lock(&d->inv_mu);
    int n = d->inv.ngpus;
    memcpy(gpus, d->inv.gpus, sizeof(gpus));
    uint64_t gen = d->inv_gen;
    pthread_mutex_unlock(&d->inv_mu);
    for (int i = 0; i < KGPU_MAX_GPUS_PER_NODE; i++)
        ccp[i] = gpus[i].compute_capability;
    char query[600];
    snprintf(query, sizeof(query), "fieldSelector=spec.nodeName%%3D%s%%2Cspec.driver%%3D%s",
             d->cfg->node.node_name, DRA_DRIVER);
    json_t *have = NULL;
    char rv[KGPU_K8S_RV_MAX];
    if ((rc = kgpu_k8s_list(d->k8s, SLICES, query, NULL, &have, rv, sizeof(rv), NULL, err)) != 0)
        return rc;
    dra_slice_input in = {.node = d->cfg->node.node_name,
                          .node_uid = d->node_uid,
                          .gpus = gpus,
                          .ngpus = d->conflicts[0] != '\0' ? 0 : n,
                          .compute_capability = ccp,
                          .generation = 1,
                          .mig = d->nvml != NULL};
    size_t i;
    json_t *s;
    json_array_foreach(have, i, s)
    {
        if (slice_generation(s) > in.generation)
            in.generation = slice_generation(s);
    }
    json_t *want = dra_slices_build(&in);
    if (want == NULL) {
        json_decref(have);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory building the ResourceSlices");
    }
    if (!all_same(have, want)) {
        /* A changed pool is a new generation: the scheduler ignores older ones. */
        if (json_array_size(have) > 0) {
            in.generation++;
            json_decref(want);
            want = dra_slices_build(&in);
        }
        long status = 0;
        json_array_foreach(want, i, s)
        {
            char path[700];
            json_t *h = named(have, slice_name(s));
            const char *hrv = json_string_value(
                json_object_get(json_object_get(h, "metadata"), "resourceVersion"));
            snprintf(path, sizeof(path), "%s/%s", SLICES, slice_name(s));
            if (hrv != NULL)
                json_object_set_new(json_object_get(s, "metadata"), "resourceVersion",
                                    json_string(hrv));
            rc = h != NULL ? send_json(d, "PUT", path, s, &status, err)
                           : send_json(d, "POST", SLICES, s, &status, err);
            if (rc != 0)
                break;
        }
        json_array_foreach(have, i, s)
        {
            if (rc != 0 || named(want, slice_name(s)) != NULL)
                continue;
            char path[700];
            snprintf(path, sizeof(path), "%s/%s", SLICES, slice_name(s));
            kgpu_http_resp resp = {0};
            kgpu_error e = {0};
            if (kgpu_k8s_request(d->k8s, "DELETE", path, NULL, NULL, &resp, &e) == 0)
                kgpu_log(KGPU_LOG_INFO, "deleted ResourceSlice %s: HTTP %ld", slice_name(s),
                         resp.status);
            free(resp.body);
        }
        if (rc == 0)
            kgpu_log(KGPU_LOG_INFO,
                     "wrote the ResourceSlices of node %s: %zu slices, %d GPUs, generation "
                     "%" PRId64,
                     d->cfg->node.node_name, json_array_size(want), in.ngpus, in.generation);
    }
    json_decref(want);
    json_decref(have);
    if (rc == 0)
        *gen_done = gen;
    return rc;
}

void *dra_publisher(void *arg)
{
    driver *d = arg;
    uint64_t done = UINT64_MAX; /* the inventory generation the server has; none yet */
    time_t checked_at = 0, retry_at = 0;
    int backoff = 1;
    while (!atomic_load(d->stop)) {
        pthread_mutex_lock(&d->inv_mu);
        uint64_t gen = d->inv_gen;
        pthread_mutex_unlock(&d->inv_mu);
        time_t now = dra_now_s();
        long long reg = atomic_load(&d->registered_at);
        int period = d->cfg->resync_s;
        if (reg != 0 && now - reg <= DRA_AFTER_REGISTRATION_S && period > DRA_RECHECK_S)
            period = DRA_RECHECK_S;
        if (now >= retry_at && (gen != done || now >= checked_at + period)) {
            kgpu_error e = {0};
            if (publish(d, &done, &e) == 0) {
                backoff = 1;
                checked_at = now;
            } else {
                kgpu_log(KGPU_LOG_WARN, "publishing the ResourceSlice: %s (again in %d s)", e.msg,
                         backoff);
                retry_at = now + backoff;
                backoff = backoff < 30 ? backoff * 2 : 30;
            }
        }
        struct timespec ts = {0, LOOP_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}
