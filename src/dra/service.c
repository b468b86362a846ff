/*
 * The DRA node service and plugin registration (driver.h): kubelet's calls
 * on the driver's two sockets. NodePrepareResources reads each claim from
 * the API server, writes its files (cdi.c) and checkpoints it; Unprepare
 * undoes that. Both run one at a time under the claim mutex.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dra_v1.pb-c.h"
#include "driver.h"
#include "log.h"
#include "pluginregistration.pb-c.h"

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
    contract_inventory inv; /* a copy: the main thread may change the inventory meanwhile */
    pthread_mutex_lock(&d->inv_mu);
    inv = d->inv;
    pthread_mutex_unlock(&d->inv_mu);
    dra_claim *have = dra_ckpt_find(&d->ck, ref->uid);
    if (have != NULL) {
        /*
         * Prepared before (a retry, or kubelet after a reboot emptied
         * /var/run/cdi): its MIG instances are made again if they are gone.
         */
        *out = *have;
        bool changed = false;
        int rc = dra_instances_ensure(&d->mig, &d->ck, out, &changed, err);
        if (rc == 0 && changed) {
            dra_claim keep = *have;
            *have = *out;
            if ((rc = dra_ckpt_save(d->ckpt_path, &d->ck, err)) != 0)
                *have = keep;
        }
        return rc != 0 ? rc : dra_claim_files_write(out, &inv, &d->paths, d->cfg->cdi_dir, err);
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
    dra_node_view view = {.pool = d->cfg->node.node_name,
                          .gpus = inv.gpus,
                          .ngpus = inv.ngpus,
                          .mig = d->nvml != NULL};
    int rc = dra_claim_read(claim, ref->uid, &view, out, err);
    json_decref(claim);
    /* kube-scheduler's counters keep partitions apart; this is the check behind them. */
    if (rc == 0)
        rc = dra_ckpt_conflict(&d->ck, out, err);
    bool made = false;
    if (rc == 0 && (rc = dra_instances_ensure(&d->mig, &d->ck, out, NULL, err)) == 0)
        made = dra_claim_has_mig(out);
    if (rc == 0)
        rc = dra_claim_files_write(out, &inv, &d->paths, d->cfg->cdi_dir, err);
    if (rc == 0 && (rc = dra_ckpt_put(&d->ck, out, err)) == 0 &&
        (rc = dra_ckpt_save(d->ckpt_path, &d->ck, err)) != 0)
        dra_ckpt_drop(&d->ck, out->uid);
    if (rc != 0) {
        (void)dra_claim_files_remove(ref->uid, &d->paths, d->cfg->cdi_dir, NULL);
        /* Nothing checkpointed, so no instance of it may stay: kubelet retries afresh. */
        kgpu_error re = {0};
        if (made && dra_instances_release(&d->mig, &d->ck, out, &re) != 0)
            kgpu_log(KGPU_LOG_ERROR, "%s", re.msg);
    }
    else
        kgpu_log(KGPU_LOG_INFO, "prepared ResourceClaim %s/%s (%s): %d devices", out->ns, out->name,
                 out->uid, out->nallocs);
    return rc;
}

static int unprepare_one(driver *d, const claim_ref *ref, kgpu_error *err)
{
    if (!dra_safe_name(ref->uid))
        return kgpu_error_set(err, KGPU_EINVAL, "claim UID '%.64s' is malformed", ref->uid);
    /* The spec first (no new container gets the claim), then its instances, then the entry. */
    int rc = dra_claim_files_remove(ref->uid, &d->paths, d->cfg->cdi_dir, err);
    if (rc == 0 && dra_ckpt_find(&d->ck, ref->uid) != NULL)
        /* A failure keeps the entry: kubelet calls again, and destroying is idempotent. */
        rc = dra_instances_release(&d->mig, &d->ck, dra_ckpt_find(&d->ck, ref->uid), err);
    if (rc == 0 && dra_ckpt_find(&d->ck, ref->uid) != NULL) {
        dra_claim keep = *dra_ckpt_find(&d->ck, ref->uid);
        dra_ckpt_drop(&d->ck, ref->uid);
        if ((rc = dra_ckpt_save(d->ckpt_path, &d->ck, err)) != 0)
            (void)dra_ckpt_put(&d->ck, &keep, NULL);
        else
            kgpu_log(KGPU_LOG_INFO, "unprepared ResourceClaim %s/%s (%s)", ref->namespace_,
                     ref->name, ref->uid);
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
    const char *gkind = d->cfg->gpu_cdi_kind;
    size_t gpulen = sizeof(d->cfg->gpu_cdi_kind) + KGPU_GPU_UUID_MAX + 2;
    char *block = calloc(1, n * (sizeof(pb_device) + sizeof(pb_device *) + 3 * sizeof(char *) +
                                 gpulen) +
                                ids * idlen + 1);
    if (block == NULL)
        return -1;
    *store = block;
    pb_device *devs = (pb_device *)block;
    pb_device **ptrs = (pb_device **)(devs + n);
    char **names = (char **)(ptrs + n);   /* request_names: one each */
    char **cdis = names + n;              /* cdi_device_ids: two each at most */
    char *idtext = (char *)(cdis + 2 * n);
    char *gputext = idtext + ids * idlen; /* "<gpu kind>=<uuid>", one each */
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
        char **mine = &cdis[2 * i];
        size_t nmine = 0;
        if (!served[a->req]) {
            served[a->req] = true;
            mine[nmine++] = idtext + (size_t)a->req * idlen;
        }
        /* The GPU itself in NVIDIA's spec: device nodes and driver libraries
         * that the runtime adds whatever the container's environment says. */
        if (gkind[0] != '\0') {
            char *g = gputext + i * gpulen;
            snprintf(g, gpulen, "%s=%s", gkind, dra_alloc_visible_uuid(a));
            mine[nmine++] = g;
        }
        if (nmine > 0) {
            devs[i].n_cdi_device_ids = nmine;
            devs[i].cdi_device_ids = mine;
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
                           size_t *outlen, node_status *st)
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
            kgpu_log(KGPU_LOG_WARN, "NodePrepareResources: %s", msgs[i]);
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
                             size_t *outlen, node_status *st)
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
            kgpu_log(KGPU_LOG_WARN, "NodeUnprepareResources: %s", msgs[i]);
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

static void handle_info(driver *d, uint8_t **out, size_t *outlen, node_status *st)
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
                          size_t *outlen, node_status *st)
{
    Pluginregistration__RegistrationStatus *s =
        pluginregistration__registration_status__unpack(NULL, len, in);
    if (s == NULL) {
        st->code = GRPC_INVALID;
        snprintf(st->message, sizeof(st->message), "RegistrationStatus does not decode");
        return;
    }
    if (s->plugin_registered) {
        kgpu_log(KGPU_LOG_INFO, "kubelet registered %s", DRA_DRIVER);
        atomic_store(&d->registered_at, (long long)dra_now_s());
    }
    else
        kgpu_log(KGPU_LOG_ERROR, "kubelet refused to register %s: %.400s", DRA_DRIVER, s->error);
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

void dra_on_call(void *ctx, const char *method, const uint8_t *in, size_t len, uint8_t **out,
                 size_t *outlen, node_status *st)
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
