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
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dra.h"
#include "dra_v1.pb-c.h"
#include "k8s.h"
#include "node.h"
#include "pluginregistration.pb-c.h"

#define LOOP_MS      200
/* After kubelet registers the driver, the slice is checked every DRA_RECHECK_S for this long. */
#define DRA_AFTER_REGISTRATION_S 90
#define DRA_RECHECK_S            2
#define DISCOVER_S   10 /* NVML re-read: a GPU lost leaves the slice within seconds */
#define GRPC_INVALID 3
#define GRPC_UNIMPL  12
#define GRPC_INTERN  13

typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodePrepareResourcesRequest prep_req;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodeUnprepareResourcesRequest unprep_req;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__Claim claim_ref;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__Device pb_device;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodePrepareResourceResponse prep_one;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodePrepareResourcesResponse__ClaimsEntry prep_entry;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodePrepareResourcesResponse prep_resp;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodeUnprepareResourceResponse unprep_one;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodeUnprepareResourcesResponse__ClaimsEntry
    unprep_entry;
typedef K8s__Io__Kubelet__Pkg__Apis__Dra__V1__NodeUnprepareResourcesResponse unprep_resp;

typedef struct driver {
    const dra_config *cfg;
    kgpu_k8s *k8s;
    kgpu_nvml *nvml;
    /* The inventory: written by the main thread under inv_mu, read by the others. */
    pthread_mutex_t inv_mu;
    dp_inventory inv;
    uint64_t inv_gen;
    struct stat fake_st;
    time_t rediscover_at;
    /* Prepared claims and their files. */
    pthread_mutex_t claim_mu;
    dra_ckpt ck;
    char ckpt_path[1100];
    dp_paths paths;
    char shim[1100];
    /* Servers. dp_server wants a ListAndWatch snapshot; DRA has no stream, it stays empty. */
    dp_snapshot nosnap;
    dp_server *reg, *dra;
    char reg_sock[1200], dra_sock[1200];
    /* Publisher. */
    pthread_t pub;
    bool pub_started;
    atomic_bool *stop;
    char node_uid[DRA_UID_MAX]; /* publisher thread only */
    bool strays_checked;        /* publisher thread only */
    /*
     * When kubelet last said it registered the driver (0: never). kubelet
     * deletes the node's ResourceSlices when it starts, before or after
     * registering the drivers again, so for a while after each registration
     * the publisher checks the slice every few seconds instead of every
     * --resync: a restarted kubelet must not leave the node without devices
     * for minutes.
     */
    atomic_llong registered_at;
    char conflicts[256];        /* publisher thread only: dra_node_gpu_conflicts' list */
} driver;

static time_t now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
}

/* ---- inventory ---- */

static void set_inventory(driver *d, const kgpu_gpu_info *g, int n)
{
    if (n > KGPU_MAX_GPUS_PER_NODE)
        n = KGPU_MAX_GPUS_PER_NODE;
    pthread_mutex_lock(&d->inv_mu);
    bool same = dp_same_gpus(&d->inv, g, n);
    if (!same) {
        d->inv.ngpus = n;
        memcpy(d->inv.gpus, g, (size_t)n * sizeof(*g));
        d->inv_gen++;
    }
    pthread_mutex_unlock(&d->inv_mu);
    if (!same)
        dp_log(DP_INFO, "inventory: %d GPUs", n);
}

static int take_fake(void *d, const kgpu_gpu_info *gpus, int n, kgpu_error *err)
{
    (void)err;
    set_inventory(d, gpus, n);
    return 0;
}

/* Re-reads the fake inventory when its file changed (dp_fake_poll). */
static int poll_fake(driver *d, bool first, kgpu_error *err)
{
    return dp_fake_poll(d->cfg->node.fake_gpus, &d->fake_st, first, take_fake, d, err);
}

static int poll_nvml(driver *d, kgpu_error *err)
{
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    kgpu_error e = {0};
    int rc = kgpu_nvml_discover(d->nvml, &gpus, &n, &e);
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            gpus[i].healthy = gpus[i].healthy && kgpu_nvml_alive(d->nvml, gpus[i].index);
        set_inventory(d, gpus, n);
    } else if (err != NULL) {
        *err = e;
    } else {
        dp_log(DP_ERROR, "%s (keeping the previous inventory)", e.msg);
    }
    free(gpus);
    return rc;
}

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
            dp_log(DP_ERROR,
                   "node %s also serves GPUs through device plugins (allocatable %s): publishing "
                   "no devices until they are gone, so no GPU is handed out twice; label the "
                   "node for one path only (docs/install-dra.md)",
                   d->cfg->node.node_name, conflicts);
        else if (d->conflicts[0] != '\0')
            dp_log(DP_INFO, "node %s: no device plugin serves GPUs any more: publishing them",
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

/* Deletes this node's slices of the driver under other names (an older layout, a renamed node). */
static void delete_strays(driver *d, const char *keep)
{
    char query[600];
    snprintf(query, sizeof(query), "fieldSelector=spec.nodeName%%3D%s%%2Cspec.driver%%3D%s",
             d->cfg->node.node_name, DRA_DRIVER);
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_error e = {0};
    if (kgpu_k8s_list(d->k8s, SLICES, query, NULL, &items, rv, sizeof(rv), NULL, &e) != 0) {
        dp_log(DP_WARN, "listing this node's ResourceSlices: %s", e.msg);
        return;
    }
    size_t i;
    json_t *s;
    json_array_foreach(items, i, s)
    {
        const char *name = json_string_value(json_object_get(json_object_get(s, "metadata"), "name"));
        if (name == NULL || strcmp(name, keep) == 0)
            continue;
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", SLICES, name);
        kgpu_http_resp resp = {0};
        if (kgpu_k8s_request(d->k8s, "DELETE", path, NULL, NULL, &resp, &e) == 0)
            dp_log(DP_INFO, "deleted stray ResourceSlice %s: HTTP %ld", name, resp.status);
        free(resp.body);
    }
    json_decref(items);
}

/* Makes the API server's slice say what the inventory says. 0 when it does. */
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
    char name[300], path[700];
    dra_slice_name(d->cfg->node.node_name, name, sizeof(name));
    snprintf(path, sizeof(path), "%s/%s", SLICES, name);
    long status = 0;
    kgpu_error ge = {0};
    json_t *have = kgpu_k8s_get_json(d->k8s, path, &status, &ge);
    if (have == NULL && status != 404)
        return status ? kgpu_error_set(err, KGPU_EIO, "GET %s: HTTP %ld", path, status)
                      : kgpu_error_set(err, KGPU_EIO, "%s", ge.msg);
    dra_slice_input in = {.node = d->cfg->node.node_name,
                          .node_uid = d->node_uid,
                          .gpus = gpus,
                          .ngpus = d->conflicts[0] != '\0' ? 0 : n,
                          .compute_capability = ccp,
                          .generation = 1};
    if (have != NULL) {
        json_int_t g = json_integer_value(
            json_object_get(json_object_get(json_object_get(have, "spec"), "pool"), "generation"));
        in.generation = g > 0 ? g : 1;
    }
    json_t *want = dra_slice_build(&in);
    if (have != NULL && dra_slice_same(have, want)) {
        rc = 0;
    } else if (have != NULL) {
        /* A changed pool is a new generation: the scheduler ignores older ones. */
        in.generation++;
        json_decref(want);
        want = dra_slice_build(&in);
        const char *rv =
            json_string_value(json_object_get(json_object_get(have, "metadata"), "resourceVersion"));
        if (rv != NULL)
            json_object_set_new(json_object_get(want, "metadata"), "resourceVersion",
                                json_string(rv));
        rc = send_json(d, "PUT", path, want, &status, err);
        if (rc == 0)
            dp_log(DP_INFO, "updated ResourceSlice %s: %d GPUs, generation %" PRId64, name, n,
                   in.generation);
    } else {
        rc = send_json(d, "POST", SLICES, want, &status, err);
        if (rc == 0)
            dp_log(DP_INFO, "created ResourceSlice %s: %d GPUs", name, n);
    }
    json_decref(want);
    json_decref(have);
    if (rc == 0 && !d->strays_checked) {
        /* Strays come from an older name or layout: once per start is enough. */
        delete_strays(d, name);
        d->strays_checked = true;
    }
    if (rc == 0)
        *gen_done = gen;
    return rc;
}

static void *publisher(void *arg)
{
    driver *d = arg;
    uint64_t done = UINT64_MAX; /* the inventory generation the server has; none yet */
    time_t checked_at = 0, retry_at = 0;
    int backoff = 1;
    while (!atomic_load(d->stop)) {
        pthread_mutex_lock(&d->inv_mu);
        uint64_t gen = d->inv_gen;
        pthread_mutex_unlock(&d->inv_mu);
        time_t now = now_s();
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
                dp_log(DP_WARN, "publishing the ResourceSlice: %s (again in %d s)", e.msg,
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

/* ---- claims ---- */

/* A namespace or name fit for a URL path: a DNS subdomain. */
static bool dns_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 253)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-' || *s == '.'))
            return false;
    return true;
}

/* Prepares one claim into *out (the checkpoint's copy). Caller holds claim_mu. */
static int prepare_one(driver *d, const claim_ref *ref, dra_claim *out, kgpu_error *err)
{
    if (!dra_safe_name(ref->uid) || !dns_name(ref->namespace_) || !dns_name(ref->name))
        return kgpu_error_set(err, KGPU_EINVAL, "claim '%.64s/%.64s' (UID '%.64s') is malformed",
                              ref->namespace_, ref->name, ref->uid);
    dp_inventory inv; /* a copy: the main thread may change the inventory meanwhile */
    pthread_mutex_lock(&d->inv_mu);
    inv = d->inv;
    pthread_mutex_unlock(&d->inv_mu);
    dra_claim *have = dra_ckpt_find(&d->ck, ref->uid);
    if (have != NULL) {
        /* Prepared before (a retry, or kubelet after a reboot emptied /var/run/cdi). */
        *out = *have;
        return dra_claim_files_write(out, &inv, &d->paths, d->cfg->cdi_dir, err);
    }
    if (d->k8s == NULL)
        return kgpu_error_set(err, KGPU_ESTATE, "no API server to read ResourceClaim %s/%s from",
                              ref->namespace_, ref->name);
    char path[700];
    snprintf(path, sizeof(path), "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims/%s",
             ref->namespace_, ref->name);
    long status = 0;
    kgpu_error ge = {0};
    json_t *claim = kgpu_k8s_get_json(d->k8s, path, &status, &ge);
    if (claim == NULL) {
        if (status == 404)
            return kgpu_error_set(err, KGPU_ENOENT,
                                  "the API server has no ResourceClaim %s/%s (deleted?)",
                                  ref->namespace_, ref->name);
        if (status != 0)
            return kgpu_error_set(err, KGPU_EIO, "GET ResourceClaim %s/%s: HTTP %ld",
                                  ref->namespace_, ref->name, status);
        return kgpu_error_set(err, KGPU_EIO, "GET ResourceClaim %s/%s: %s", ref->namespace_,
                              ref->name, ge.msg);
    }
    dra_node_view view = {.pool = d->cfg->node.node_name, .gpus = inv.gpus, .ngpus = inv.ngpus};
    int rc = dra_claim_read(claim, ref->uid, &view, out, err);
    json_decref(claim);
    if (rc == 0)
        rc = dra_claim_files_write(out, &inv, &d->paths, d->cfg->cdi_dir, err);
    if (rc == 0 && (rc = dra_ckpt_put(&d->ck, out, err)) == 0 &&
        (rc = dra_ckpt_save(d->ckpt_path, &d->ck, err)) != 0)
        dra_ckpt_drop(&d->ck, out->uid);
    if (rc != 0)
        (void)dra_claim_files_remove(ref->uid, &d->paths, d->cfg->cdi_dir, NULL);
    else
        dp_log(DP_INFO, "prepared ResourceClaim %s/%s (%s): %d devices", out->ns, out->name,
               out->uid, out->nallocs);
    return rc;
}

static int unprepare_one(driver *d, const claim_ref *ref, kgpu_error *err)
{
    if (!dra_safe_name(ref->uid))
        return kgpu_error_set(err, KGPU_EINVAL, "claim UID '%.64s' is malformed", ref->uid);
    int rc = dra_claim_files_remove(ref->uid, &d->paths, d->cfg->cdi_dir, err);
    if (rc == 0 && dra_ckpt_find(&d->ck, ref->uid) != NULL) {
        dra_claim keep = *dra_ckpt_find(&d->ck, ref->uid);
        dra_ckpt_drop(&d->ck, ref->uid);
        if ((rc = dra_ckpt_save(d->ckpt_path, &d->ck, err)) != 0)
            (void)dra_ckpt_put(&d->ck, &keep, NULL);
        else
            dp_log(DP_INFO, "unprepared ResourceClaim %s/%s (%s)", ref->namespace_, ref->name,
                   ref->uid);
    }
    return rc;
}

/* The answer's devices for a prepared claim; arrays malloc'd into *store (one block). */
static int claim_devices(const driver *d, const dra_claim *c, bool v1, prep_one *one,
                         void **store)
{
    size_t n = (size_t)c->nallocs;
    size_t ids = (size_t)c->nreqs;
    size_t idlen = DRA_UID_MAX + DRA_REQ_MAX + 16;
    char *block = calloc(1, n * (sizeof(pb_device) + sizeof(pb_device *) + 2 * sizeof(char *)) +
                                ids * idlen + 1);
    if (block == NULL)
        return -1;
    *store = block;
    pb_device *devs = (pb_device *)block;
    pb_device **ptrs = (pb_device **)(devs + n);
    char **names = (char **)(ptrs + n);   /* request_names: one each */
    char **cdis = names + n;              /* cdi_device_ids: one each, or none */
    char *idtext = (char *)(cdis + n);
    bool served[DRA_MAX_REQUESTS] = {false};
    for (int r = 0; r < c->nreqs; r++)
        dra_cdi_id(c, r, idtext + (size_t)r * idlen, idlen);
    for (size_t i = 0; i < n; i++) {
        const dra_alloc *a = &c->allocs[i];
        k8s__io__kubelet__pkg__apis__dra__v1__device__init(&devs[i]);
        names[i] = (char *)c->reqs[a->req];
        devs[i].n_request_names = 1;
        devs[i].request_names = &names[i];
        devs[i].pool_name = (char *)d->cfg->node.node_name;
        devs[i].device_name = (char *)a->device;
        /*
         * One CDI device per request, named on its first device only: kubelet
         * gives a container the IDs of every device of the requests it uses,
         * and the same ID twice would mount everything twice.
         */
        if (!served[a->req]) {
            served[a->req] = true;
            cdis[i] = idtext + (size_t)a->req * idlen;
            devs[i].n_cdi_device_ids = 1;
            devs[i].cdi_device_ids = &cdis[i];
        }
        if (v1 && a->share_id[0] != '\0')
            devs[i].share_id = (char *)a->share_id;
        ptrs[i] = &devs[i];
    }
    one->n_devices = n;
    one->devices = ptrs;
    return 0;
}

static void handle_prepare(driver *d, bool v1, const uint8_t *in, size_t len, uint8_t **out,
                           size_t *outlen, dp_status *st)
{
    prep_req *req = k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resources_request__unpack(
        NULL, len, in);
    if (req == NULL || req->n_claims > DRA_MAX_CALL) {
        st->code = GRPC_INVALID;
        snprintf(st->message, sizeof(st->message),
                 req == NULL ? "NodePrepareResourcesRequest does not decode"
                             : "more than %d claims in one NodePrepareResources call",
                 DRA_MAX_CALL);
        k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resources_request__free_unpacked(req,
                                                                                             NULL);
        return;
    }
    size_t n = req->n_claims;
    prep_one *ones = calloc(n + 1, sizeof(*ones));
    prep_entry *entries = calloc(n + 1, sizeof(*entries));
    prep_entry **eptrs = calloc(n + 1, sizeof(*eptrs));
    dra_claim *claims = calloc(n + 1, sizeof(*claims));
    char(*msgs)[KGPU_ERROR_MSG_MAX] = calloc(n + 1, sizeof(*msgs));
    void **stores = calloc(n + 1, sizeof(*stores));
    if (ones == NULL || entries == NULL || eptrs == NULL || claims == NULL || msgs == NULL ||
        stores == NULL) {
        st->code = GRPC_INTERN;
        snprintf(st->message, sizeof(st->message), "out of memory");
        goto out;
    }
    pthread_mutex_lock(&d->claim_mu);
    for (size_t i = 0; i < n; i++) {
        k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resource_response__init(&ones[i]);
        k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resources_response__claims_entry__init(
            &entries[i]);
        entries[i].key = req->claims[i]->uid;
        entries[i].value = &ones[i];
        eptrs[i] = &entries[i];
        kgpu_error e = {0};
        if (prepare_one(d, req->claims[i], &claims[i], &e) != 0 ||
            claim_devices(d, &claims[i], v1, &ones[i], &stores[i]) != 0) {
            snprintf(msgs[i], sizeof(msgs[i]), "%s", e.msg[0] ? e.msg : "out of memory");
            ones[i].error = msgs[i];
            ones[i].n_devices = 0;
            dp_log(DP_WARN, "NodePrepareResources: %s", msgs[i]);
        }
    }
    pthread_mutex_unlock(&d->claim_mu);
    prep_resp resp = K8S__IO__KUBELET__PKG__APIS__DRA__V1__NODE_PREPARE_RESOURCES_RESPONSE__INIT;
    resp.n_claims = n;
    resp.claims = eptrs;
    size_t size = k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resources_response__get_packed_size(
        &resp);
    *out = malloc(size ? size : 1);
    if (*out == NULL) {
        st->code = GRPC_INTERN;
        snprintf(st->message, sizeof(st->message), "out of memory");
    } else {
        *outlen = k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resources_response__pack(
            &resp, *out);
    }
out:
    for (size_t i = 0; stores != NULL && i < n; i++)
        free(stores[i]);
    free(stores);
    free(msgs);
    free(claims);
    free(eptrs);
    free(entries);
    free(ones);
    k8s__io__kubelet__pkg__apis__dra__v1__node_prepare_resources_request__free_unpacked(req, NULL);
}

static void handle_unprepare(driver *d, const uint8_t *in, size_t len, uint8_t **out,
                             size_t *outlen, dp_status *st)
{
    unprep_req *req =
        k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resources_request__unpack(NULL, len,
                                                                                       in);
    if (req == NULL || req->n_claims > DRA_MAX_CALL) {
        st->code = GRPC_INVALID;
        snprintf(st->message, sizeof(st->message),
                 req == NULL ? "NodeUnprepareResourcesRequest does not decode"
                             : "more than %d claims in one NodeUnprepareResources call",
                 DRA_MAX_CALL);
        k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resources_request__free_unpacked(
            req, NULL);
        return;
    }
    size_t n = req->n_claims;
    unprep_one *ones = calloc(n + 1, sizeof(*ones));
    unprep_entry *entries = calloc(n + 1, sizeof(*entries));
    unprep_entry **eptrs = calloc(n + 1, sizeof(*eptrs));
    char(*msgs)[KGPU_ERROR_MSG_MAX] = calloc(n + 1, sizeof(*msgs));
    if (ones == NULL || entries == NULL || eptrs == NULL || msgs == NULL) {
        st->code = GRPC_INTERN;
        snprintf(st->message, sizeof(st->message), "out of memory");
        goto out;
    }
    pthread_mutex_lock(&d->claim_mu);
    for (size_t i = 0; i < n; i++) {
        k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resource_response__init(&ones[i]);
        k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resources_response__claims_entry__init(
            &entries[i]);
        entries[i].key = req->claims[i]->uid;
        entries[i].value = &ones[i];
        eptrs[i] = &entries[i];
        kgpu_error e = {0};
        if (unprepare_one(d, req->claims[i], &e) != 0) {
            snprintf(msgs[i], sizeof(msgs[i]), "%s", e.msg);
            ones[i].error = msgs[i];
            dp_log(DP_WARN, "NodeUnprepareResources: %s", msgs[i]);
        }
    }
    pthread_mutex_unlock(&d->claim_mu);
    unprep_resp resp =
        K8S__IO__KUBELET__PKG__APIS__DRA__V1__NODE_UNPREPARE_RESOURCES_RESPONSE__INIT;
    resp.n_claims = n;
    resp.claims = eptrs;
    size_t size =
        k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resources_response__get_packed_size(
            &resp);
    *out = malloc(size ? size : 1);
    if (*out == NULL) {
        st->code = GRPC_INTERN;
        snprintf(st->message, sizeof(st->message), "out of memory");
    } else {
        *outlen = k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resources_response__pack(
            &resp, *out);
    }
out:
    free(msgs);
    free(eptrs);
    free(entries);
    free(ones);
    k8s__io__kubelet__pkg__apis__dra__v1__node_unprepare_resources_request__free_unpacked(req,
                                                                                           NULL);
}

static void handle_info(driver *d, uint8_t **out, size_t *outlen, dp_status *st)
{
    static char *versions[] = {DRA_SERVICE_V1, DRA_SERVICE_V1BETA1};
    Pluginregistration__PluginInfo info = PLUGINREGISTRATION__PLUGIN_INFO__INIT;
    info.type = "DRAPlugin";
    info.name = DRA_DRIVER;
    info.endpoint = d->dra_sock;
    info.n_supported_versions = 2;
    info.supported_versions = versions;
    size_t size = pluginregistration__plugin_info__get_packed_size(&info);
    *out = malloc(size ? size : 1);
    if (*out == NULL) {
        st->code = GRPC_INTERN;
        snprintf(st->message, sizeof(st->message), "out of memory");
        return;
    }
    *outlen = pluginregistration__plugin_info__pack(&info, *out);
}

static void handle_status(driver *d, const uint8_t *in, size_t len, uint8_t **out,
                          size_t *outlen, dp_status *st)
{
    Pluginregistration__RegistrationStatus *s =
        pluginregistration__registration_status__unpack(NULL, len, in);
    if (s == NULL) {
        st->code = GRPC_INVALID;
        snprintf(st->message, sizeof(st->message), "RegistrationStatus does not decode");
        return;
    }
    if (s->plugin_registered) {
        dp_log(DP_INFO, "kubelet registered %s", DRA_DRIVER);
        atomic_store(&d->registered_at, (long long)now_s());
    }
    else
        dp_log(DP_ERROR, "kubelet refused to register %s: %.400s", DRA_DRIVER, s->error);
    pluginregistration__registration_status__free_unpacked(s, NULL);
    *out = malloc(1);
    *outlen = 0;
    if (*out == NULL) {
        st->code = GRPC_INTERN;
        snprintf(st->message, sizeof(st->message), "out of memory");
    }
}

static bool is(const char *method, const char *prefix, const char *name)
{
    size_t n = strlen(prefix);
    return strncmp(method, prefix, n) == 0 && strcmp(method + n, name) == 0;
}

static void on_call(void *ctx, const char *method, const uint8_t *in, size_t len, uint8_t **out,
                    size_t *outlen, dp_status *st)
{
    driver *d = ctx;
    if (is(method, DRA_METHOD_REG, "GetInfo")) {
        handle_info(d, out, outlen, st);
    } else if (is(method, DRA_METHOD_REG, "NotifyRegistrationStatus")) {
        handle_status(d, in, len, out, outlen, st);
    } else if (is(method, DRA_METHOD_V1, "NodePrepareResources")) {
        handle_prepare(d, true, in, len, out, outlen, st);
    } else if (is(method, DRA_METHOD_V1BETA1, "NodePrepareResources")) {
        /* v1beta1's messages are v1's without Device.share_id: same decoder, no share IDs. */
        handle_prepare(d, false, in, len, out, outlen, st);
    } else if (is(method, DRA_METHOD_V1, "NodeUnprepareResources") ||
               is(method, DRA_METHOD_V1BETA1, "NodeUnprepareResources")) {
        handle_unprepare(d, in, len, out, outlen, st);
    } else {
        st->code = GRPC_UNIMPL;
        snprintf(st->message, sizeof(st->message), "%s: not served by %s", method, DRA_DRIVER);
    }
}

/* ---- life cycle ---- */

/* The driver needs the API server (claims are read from it): no account is an error. */
static int connect_api(driver *d, kgpu_error *err)
{
    bool no_cluster;
    return dp_k8s_connect(d->cfg->node.kubeconfig, &d->k8s, &no_cluster, err);
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
    if (d->dra == NULL && (d->dra = dp_server_start(d->dra_sock, DRA_DRIVER " DRA", &d->nosnap,
                                                    on_call, d, err)) == NULL)
        return err->code ? err->code : KGPU_EIO;
    /* Registration last: kubelet dials the DRA socket as soon as it has registered us. */
    if (d->reg == NULL && (d->reg = dp_server_start(d->reg_sock, DRA_DRIVER " registration",
                                                    &d->nosnap, on_call, d, err)) == NULL)
        return err->code ? err->code : KGPU_EIO;
    return 0;
}

/* The registration socket is gone (someone emptied kubelet's folder): serve it again. */
static void watch_socket(driver *d)
{
    struct stat st;
    if (d->reg == NULL || stat(d->reg_sock, &st) == 0)
        return;
    dp_log(DP_WARN, "%s disappeared: serving it again for kubelet's plugin watcher", d->reg_sock);
    dp_server_stop(d->reg);
    d->reg = NULL;
    kgpu_error e = {0};
    if (start_servers(d, &e) != 0)
        dp_log(DP_ERROR, "%s", e.msg);
}

/* Rewrites the files of every checkpointed claim: /var/run/cdi is lost on a reboot. */
static void restore_claims(driver *d)
{
    pthread_mutex_lock(&d->claim_mu);
    for (int i = 0; i < d->ck.n; i++) {
        kgpu_error e = {0};
        if (dra_claim_files_write(&d->ck.claims[i], &d->inv, &d->paths, d->cfg->cdi_dir, &e) != 0)
            dp_log(DP_WARN, "restoring claim %s: %s", d->ck.claims[i].uid, e.msg);
    }
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
    if (cfg->node.sharing == DP_SHARING_MPS &&
        (rc = dp_mps_check(cfg->node.mps_pipe_dir, err)) != 0)
        return rc;
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s/%s", cfg->plugin_dir, DRA_DRIVER);
    snprintf(d->dra_sock, sizeof(d->dra_sock), "%s/%s/dra.sock", cfg->plugin_dir, DRA_DRIVER);
    snprintf(d->reg_sock, sizeof(d->reg_sock), "%s/%s-reg.sock", cfg->registry_dir, DRA_DRIVER);
    snprintf(d->ckpt_path, sizeof(d->ckpt_path), "%s/checkpoint.json", cfg->node.state_dir);
    if ((rc = make_dirs(cfg->node.state_dir, 0755, err)) != 0 ||
        (rc = make_dirs(dir, 0750, err)) != 0 ||
        (rc = make_dirs(cfg->registry_dir, 0750, err)) != 0 ||
        (rc = dp_write_preload(&d->paths, err)) != 0)
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
        d->rediscover_at = now_s() + DISCOVER_S;
    }
    if (rc != 0)
        return rc;
    restore_claims(d);
    if (pthread_create(&d->pub, NULL, publisher, d) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the publisher thread");
    d->pub_started = true;
    if ((rc = start_servers(d, err)) != 0)
        return rc;
    dp_log(DP_INFO,
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
    pthread_mutex_init(&d->nosnap.mu, NULL);
    dp_node_paths(&cfg->node, d->shim, sizeof(d->shim), &d->paths);
    int rc = start(d, err);
    while (rc == 0 && !atomic_load(stop)) {
        if (cfg->node.fake_gpus[0] != '\0') {
            (void)poll_fake(d, false, NULL);
        } else if (now_s() >= d->rediscover_at) {
            (void)poll_nvml(d, NULL);
            d->rediscover_at = now_s() + DISCOVER_S;
        }
        watch_socket(d);
        struct timespec ts = {0, LOOP_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(stop, true);
    /* Registration first, so kubelet stops sending work before the DRA socket goes. */
    dp_server_stop(d->reg);
    dp_server_stop(d->dra);
    if (d->pub_started)
        pthread_join(d->pub, NULL);
    if (d->nvml != NULL)
        kgpu_nvml_close(d->nvml);
    kgpu_k8s_free(d->k8s);
    dra_ckpt_free(&d->ck);
    pthread_mutex_destroy(&d->nosnap.mu);
    pthread_mutex_destroy(&d->claim_mu);
    pthread_mutex_destroy(&d->inv_mu);
    free(d);
    if (rc == 0)
        dp_log(DP_INFO, "stopped");
    return rc;
}
