/*
 * kubelet's unary calls on the device plugin's sockets: GetPreferredAllocation
 * steers to the GPUs the extender assigned (devices.c's dp_prefer), and
 * Allocate finds the pod and container (match.c), checks its GPUs against
 * the inventory, writes the contract's files, marks the pod and answers with
 * the contract's env and mounts (src/contract, respond.c).
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deviceplugin.pb-c.h"
#include "log.h"
#include "plugin.h"
#include "podspec.h"

static void set_status(node_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_status(node_status *st, int code, const char *fmt, ...)
{
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof(st->message), fmt, ap);
    va_end(ap);
}

/* gRPC status codes used here (grpc/status.h). */
enum {
    ST_INVALID = 3,
    ST_NOT_FOUND = 5,
    ST_FAILED_PRECONDITION = 9,
    ST_ABORTED = 10,
    ST_UNIMPLEMENTED = 12,
    ST_INTERNAL = 13,
    ST_UNAVAILABLE = 14
};

static int status_of(int code)
{
    switch (code) {
    case KGPU_ENOENT:
        return ST_NOT_FOUND;
    case KGPU_EAMBIG:
        return ST_ABORTED;
    case KGPU_EPARSE:
    case KGPU_EINVAL:
        return ST_FAILED_PRECONDITION;
    case KGPU_EIO:
        return ST_UNAVAILABLE;
    default:
        return ST_INTERNAL;
    }
}

/* Checks that every ID is a current device of r; the first stranger is named. */
static bool known_ids(plugin *p, dp_res r, char **ids, size_t n, node_status *st)
{
    pthread_mutex_lock(&p->inv_mu);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++)
        if (dp_device_gpu(&p->inv, r, ids[i]) < 0) {
            set_status(st, ST_INVALID, "unknown %s device ID '%.200s' (not one this plugin lists)",
                       dp_res_name(r), ids[i]);
            ok = false;
        }
    for (size_t i = 0; i < n && ok; i++)
        for (size_t j = i + 1; j < n && ok; j++)
            if (strcmp(ids[i], ids[j]) == 0) {
                set_status(st, ST_INVALID, "%s device ID '%.200s' requested twice", dp_res_name(r),
                           ids[i]);
                ok = false;
            }
    pthread_mutex_unlock(&p->inv_mu);
    return ok;
}

/*
 * The container's GPUs must be GPUs of this node: NVIDIA_VISIBLE_DEVICES with
 * a UUID the node lacks (an assignment made from an older inventory, or
 * written by hand) makes the container fail at start with a runtime error
 * that names neither kgpu nor the pod; an assignment without GPUs would mark
 * the pod allocated while giving it nothing.
 */
static int check_assigned_gpus(const plugin *p, const dp_match *m, const contract_inventory *inv,
                               dp_res r, char **ids, size_t nids, kgpu_error *err)
{
    if (m->t.ngpus == 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s gives container %s no GPU", m->t.ns,
                              m->t.name, KGPU_ANN_ASSIGNMENT, m->t.container);
    for (int i = 0; i < m->t.ngpus; i++) {
        int found = contract_inventory_find(inv, m->t.gpus[i].uuid);
        /*
         * A GPU that turned unhealthy after the pod was bound: refusing makes
         * kubelet reject the pod, so its controller recreates it and the
         * extender places it on a healthy GPU; handing out the broken GPU
         * would start a container that cannot work.
         */
        if (found >= 0 && !inv->gpus[found].healthy)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "pod %s/%s: container %s was assigned GPU %d (%s), which turned "
                                  "unhealthy after the pod was bound",
                                  m->t.ns, m->t.name, m->t.container, inv->gpus[found].index,
                                  m->t.gpus[i].uuid);
        if (found < 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "pod %s/%s: annotation %s gives container %s GPU %s, which node "
                                  "%s does not have (did its GPUs change after the pod was "
                                  "bound?)",
                                  m->t.ns, m->t.name, KGPU_ANN_ASSIGNMENT, m->t.container,
                                  m->t.gpus[i].uuid, p->cfg->node.node_name);
    }
    /*
     * The GPUs kubelet counted for the container are those of the devices it
     * sent. For whole GPUs that is kubelet's own exclusive accounting: an
     * assignment naming others (written by hand on a pod created with
     * spec.nodeName) would hand out a GPU kubelet believes free, so it is
     * refused. A share's devices are units that only count capacity: kubelet
     * takes them on another GPU when it did not ask for, or could not follow,
     * the preferred allocation (a GPU healthy again in the extender's view
     * before kubelet's, e2e node suite test_08), and refusing would fail a
     * pod kgpu placed. The share's size is bounded by the request anyway
     * (within_request) and the assignment written by kgpu alone (admission
     * policy kgpu-pod-bookkeeping): logged, not refused.
     */
    int miss = dp_ids_uncovered(inv, r, (const char *const *)ids, nids, &m->t);
    if (miss >= 0 && r != DP_RES_WHOLE) {
        kgpu_log(KGPU_LOG_WARN,
                 "pod %s/%s: container %s is assigned GPU %d (%s), but kubelet counted its %s "
                 "devices on another GPU; served as assigned (kubelet's count of that GPU is off "
                 "until the pod ends)",
                 m->t.ns, m->t.name, m->t.container, m->t.gpus[miss].index, m->t.gpus[miss].uuid,
                 dp_res_name(r));
        miss = -1;
    }
    if (miss >= 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s gives container %s GPU %d (%s), but "
                              "kubelet allocated it no %s device there: refusing GPUs kubelet "
                              "did not allocate",
                              m->t.ns, m->t.name, KGPU_ANN_ASSIGNMENT, m->t.container,
                              m->t.gpus[miss].index, m->t.gpus[miss].uuid, dp_res_name(r));
    return 0;
}

static const char no_api_msg[] =
    "kgpu-device-plugin runs without an API server (no in-cluster service account and no "
    "--kubeconfig), so it cannot tell which pod this allocation is for; it hands out no GPU "
    "without knowing";

/* The shim's host file must exist, or the container's mount of it fails to start it. */
static bool shim_present(const plugin *p, node_status *st)
{
    if (p->paths.shim_lib == NULL || access(p->paths.shim_lib, R_OK) == 0)
        return true;
    set_status(st, ST_FAILED_PRECONDITION,
               "the interception library %s is missing on this node, so the container's "
               "memory limit could not be enforced; install it or run the plugin with "
               "--shim-lib none",
               p->paths.shim_lib);
    return false;
}

/* ---- MIG devices (--mig-strategy) ---- */

/* The name of a slot's resource ("kgpu.io/gpu-mem", "nvidia.com/mig-1g.5gb") into buf. */
static const char *slot_resource(const plugin *p, int slot, char *buf, size_t cap)
{
    return dp_slot_resource(slot, slot >= DP_NRES ? p->mig_profile[slot - DP_NRES] : NULL, buf,
                            cap);
}

/*
 * The target of one container kubelet gave MIG devices `ids`: each must be
 * an advertised MIG device of this slot's resource (any under single's
 * nvidia.com/gpu, its profile's under mixed), named once, on a healthy GPU.
 */
static int mig_container(plugin *p, int slot, char **ids, size_t n, contract_target *t,
                         kgpu_error *err)
{
    char res[80];
    slot_resource(p, slot, res, sizeof(res));
    if (n == 0 || n > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_EINVAL, "%zu %s devices in one container request", n,
                              res);
    int pos[KGPU_MAX_GPUS_PER_NODE];
    int rc = 0;
    pthread_mutex_lock(&p->inv_mu);
    for (size_t i = 0; i < n && rc == 0; i++) {
        int k = dp_mig_find(&p->mig, ids[i]);
        const dp_mig_dev *d = k >= 0 ? &p->mig.dev[k] : NULL;
        if (d == NULL || (slot >= DP_NRES && strcmp(d->profile, p->mig_profile[slot - DP_NRES])))
            rc = kgpu_error_set(err, KGPU_EINVAL,
                                "unknown %s device ID '%.200s' (not a MIG device this plugin "
                                "lists; was the instance destroyed?)",
                                res, ids[i]);
        else if (!d->healthy)
            rc = kgpu_error_set(err, KGPU_EINVAL, "MIG device %s is on GPU %d (%s), which is "
                                                  "unhealthy",
                                d->uuid, d->gpu_index, d->gpu_uuid);
        for (size_t j = 0; j < i && rc == 0; j++)
            if (strcmp(ids[i], ids[j]) == 0)
                rc = kgpu_error_set(err, KGPU_EINVAL, "%s device ID '%.200s' requested twice",
                                    res, ids[i]);
        pos[i] = k;
    }
    if (rc == 0)
        dp_mig_target(&p->mig, pos, (int)n, t);
    pthread_mutex_unlock(&p->inv_mu);
    return rc;
}

/*
 * Allocate of MIG devices: kubelet's device IDs are the whole answer, as
 * with NVIDIA's plugin. kubelet accounts MIG devices exclusively and the
 * extender assigns none, so no pod is looked up and no API server is
 * needed; the container gets exactly its instances (NVIDIA_VISIBLE_DEVICES,
 * CDI devices by UUID: an index names the parent GPU) and the contract's
 * files with each instance's whole memory. Never MPS: the instance is
 * already the hardware's partition.
 */
static void allocate_mig(plugin *p, int slot, V1beta1__AllocateRequest *req, uint8_t **out,
                         size_t *outlen, node_status *st)
{
    size_t n = req->n_container_requests;
    contract_response *resp = calloc(n + 1, sizeof(*resp));
    contract_inventory *none = calloc(1, sizeof(*none));
    contract_paths paths = p->paths;
    paths.mps_pipe_dir = NULL;
    dp_cdi cdi = {p->cdi.kind, false};
    char res[80];
    slot_resource(p, slot, res, sizeof(res));
    if (resp == NULL || none == NULL) {
        set_status(st, ST_INTERNAL, "out of memory");
        goto out;
    }
    none->unit_mib = p->cfg->node.unit_mib;
    if (!shim_present(p, st))
        goto out;
    pthread_mutex_lock(&p->alloc_mu);
    for (size_t i = 0; i < n && st->code == 0; i++) {
        V1beta1__ContainerAllocateRequest *c = req->container_requests[i];
        kgpu_error e = {0};
        dp_match m = {.primary = true};
        int rc = mig_container(p, slot, c->devices_ids, c->n_devices_ids, &m.t, &e);
        if (rc == 0)
            rc = contract_write_files(&m.t, &paths, &e);
        if (rc != 0) {
            set_status(st, status_of(rc), "Allocate %zu %s: %s", c->n_devices_ids, res, e.msg);
            break;
        }
        dp_response_of(&m, none, &paths, cdi.kind != NULL ? &cdi : NULL, &resp[i]);
        kgpu_log(KGPU_LOG_INFO, "Allocate %zu %s: MIG device %s%s (GPU %d)", c->n_devices_ids,
                 res, m.t.gpus[0].uuid, c->n_devices_ids > 1 ? " and more" : "",
                 m.t.gpus[0].index);
    }
    pthread_mutex_unlock(&p->alloc_mu);
    if (st->code == 0 && dp_allocate_encode(resp, (int)n, out, outlen) != 0)
        set_status(st, ST_INTERNAL, "out of memory encoding the response");
out:
    if (st->code != 0)
        kgpu_log(KGPU_LOG_WARN, "%s", st->message);
    free(resp);
    free(none);
}

/* Whether an Allocate on nvidia.com/gpu names MIG devices (single strategy). */
static bool names_mig(plugin *p, const V1beta1__AllocateRequest *req)
{
    if (p->cfg->mig_strategy != DP_MIG_SINGLE || req->n_container_requests == 0 ||
        req->container_requests[0]->n_devices_ids == 0)
        return false;
    pthread_mutex_lock(&p->inv_mu);
    bool mig = dp_mig_find(&p->mig, req->container_requests[0]->devices_ids[0]) >= 0;
    pthread_mutex_unlock(&p->inv_mu);
    return mig;
}

static void allocate(plugin *p, dp_res r, int slot, const uint8_t *in, size_t len, uint8_t **out,
                     size_t *outlen, node_status *st)
{
    V1beta1__AllocateRequest *req = v1beta1__allocate_request__unpack(NULL, len, in);
    if (req == NULL) {
        set_status(st, ST_INVALID, "Allocate: request is not a valid AllocateRequest");
        return;
    }
    if (slot >= DP_NRES || (r == DP_RES_WHOLE && names_mig(p, req))) {
        allocate_mig(p, slot, req, out, outlen, st);
        v1beta1__allocate_request__free_unpacked(req, NULL);
        return;
    }
    size_t n = req->n_container_requests;
    contract_response *resp = calloc(n + 1, sizeof(*resp));
    if (resp == NULL) {
        set_status(st, ST_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (!known_ids(p, r, req->container_requests[i]->devices_ids,
                       req->container_requests[i]->n_devices_ids, st))
            goto out;
    if (p->k8s == NULL) {
        set_status(st, ST_FAILED_PRECONDITION, "%s", no_api_msg);
        goto out;
    }
    if (!shim_present(p, st))
        goto out;
    pthread_mutex_lock(&p->alloc_mu);
    for (size_t i = 0; i < n && st->code == 0; i++) {
        kgpu_error e = {0};
        size_t count = req->container_requests[i]->n_devices_ids;
        json_t *list = dp_list_node_pods(p, &e);
        dp_match m;
        contract_inventory inv;
        pthread_mutex_lock(&p->inv_mu);
        inv = p->inv;
        pthread_mutex_unlock(&p->inv_mu);
        int rc = list == NULL ? (e.code ? e.code : KGPU_EIO)
                              : dp_match_find(list, p->cfg->node.node_name, r, (int64_t)count,
                                              p->registered, inv.unit_mib, &m, &e);
        json_decref(list);
        if (rc == 0)
            rc = check_assigned_gpus(p, &m, &inv, r, req->container_requests[i]->devices_ids,
                                     count, &e);
        if (rc == 0 && m.primary)
            rc = contract_write_files(&m.t, &p->paths, &e);
        if (rc == 0)
            rc = dp_mark_pod(p, &m, &e);
        if (rc != 0) {
            set_status(st, status_of(rc), "Allocate %zu %s: %s", count, dp_res_name(r), e.msg);
            break;
        }
        dp_response_of(&m, &inv, &p->paths, &p->cdi, &resp[i]);
        kgpu_log(KGPU_LOG_INFO, "Allocate %zu %s: pod %s/%s %scontainer %s%s", count,
                 dp_res_name(r), m.t.ns, m.t.name, m.init ? "init " : "", m.t.container,
                 m.complete ? " (pod fully allocated)" : "");
    }
    pthread_mutex_unlock(&p->alloc_mu);
    if (st->code == 0 && dp_allocate_encode(resp, (int)n, out, outlen) != 0)
        set_status(st, ST_INTERNAL, "out of memory encoding the response");
out:
    if (st->code != 0)
        kgpu_log(KGPU_LOG_WARN, "%s", st->message);
    free(resp);
    v1beta1__allocate_request__free_unpacked(req, NULL);
}

/* The GPUs and device counts the matched container should get for resource r. */
static void want_of(const dp_match *m, const contract_inventory *inv, dp_want *w)
{
    w->n = 0;
    for (int i = 0; i < m->t.ngpus; i++) {
        int g = contract_inventory_find(inv, m->t.gpus[i].uuid);
        if (g < 0)
            continue;
        int64_t share = m->count / m->t.ngpus + (i < m->count % m->t.ngpus ? 1 : 0);
        w->gpu[w->n] = g;
        w->count[w->n++] = share;
    }
}

static void preferred(plugin *p, dp_res r, int slot, const uint8_t *in, size_t len,
                      uint8_t **out, size_t *outlen, node_status *st)
{
    V1beta1__PreferredAllocationRequest *req =
        v1beta1__preferred_allocation_request__unpack(NULL, len, in);
    if (req == NULL) {
        set_status(st, ST_INVALID, "GetPreferredAllocation: not a valid request");
        return;
    }
    size_t n = req->n_container_requests;
    V1beta1__ContainerPreferredAllocationResponse *cr = calloc(n + 1, sizeof(*cr));
    V1beta1__ContainerPreferredAllocationResponse **crp = calloc(n + 1, sizeof(*crp));
    char ***ids = calloc(n + 1, sizeof(*ids));
    int **chosen = calloc(n + 1, sizeof(*chosen));
    if (cr == NULL || crp == NULL || ids == NULL || chosen == NULL) {
        set_status(st, ST_INTERNAL, "out of memory");
        goto out;
    }
    contract_inventory inv;
    pthread_mutex_lock(&p->inv_mu);
    inv = p->inv;
    pthread_mutex_unlock(&p->inv_mu);
    for (size_t i = 0; i < n; i++) {
        V1beta1__ContainerPreferredAllocationRequest *c = req->container_requests[i];
        int size = c->allocation_size;
        if (size < 0 || (size_t)size > c->n_available_deviceids) {
            set_status(st, ST_INVALID, "allocation_size %d with %zu devices available", size,
                       c->n_available_deviceids);
            goto out;
        }
        dp_want want = {0};
        /* MIG devices are not assigned by the extender: packed in kubelet's order. */
        if (p->k8s != NULL && slot < DP_NRES) {
            /* Steer to the extender's GPUs when the pod can be told; else just pack. */
            kgpu_error e = {0};
            dp_match m;
            pthread_mutex_lock(&p->alloc_mu);
            json_t *list = dp_list_node_pods(p, &e);
            if (list != NULL && dp_match_find(list, p->cfg->node.node_name, r, size, p->registered,
                                              inv.unit_mib, &m, &e) == 0)
                want_of(&m, &inv, &want);
            else
                kgpu_log(KGPU_LOG_DEBUG, "GetPreferredAllocation: packing (%s)", e.msg);
            pthread_mutex_unlock(&p->alloc_mu);
            json_decref(list);
        }
        chosen[i] = calloc((size_t)size + 1, sizeof(int));
        ids[i] = calloc((size_t)size + 1, sizeof(char *));
        if (chosen[i] == NULL || ids[i] == NULL) {
            set_status(st, ST_INTERNAL, "out of memory");
            goto out;
        }
        int k =
            dp_prefer(&inv, r, (const char *const *)c->available_deviceids,
                      (int)c->n_available_deviceids, (const char *const *)c->must_include_deviceids,
                      (int)c->n_must_include_deviceids, size, &want, chosen[i]);
        for (int j = 0; j < k; j++)
            ids[i][j] = c->available_deviceids[chosen[i][j]];
        v1beta1__container_preferred_allocation_response__init(&cr[i]);
        cr[i].n_deviceids = (size_t)k;
        cr[i].deviceids = ids[i];
        crp[i] = &cr[i];
    }
    V1beta1__PreferredAllocationResponse msg = V1BETA1__PREFERRED_ALLOCATION_RESPONSE__INIT;
    msg.n_container_responses = n;
    msg.container_responses = crp;
    size_t size = v1beta1__preferred_allocation_response__get_packed_size(&msg);
    *out = malloc(size ? size : 1);
    if (*out == NULL)
        set_status(st, ST_INTERNAL, "out of memory");
    else
        *outlen = v1beta1__preferred_allocation_response__pack(&msg, *out);
out:
    for (size_t i = 0; ids != NULL && chosen != NULL && i < n; i++) {
        free(ids[i]);
        free(chosen[i]);
    }
    free(ids);
    free(chosen);
    free(cr);
    free(crp);
    v1beta1__preferred_allocation_request__free_unpacked(req, NULL);
}

void dp_plugin_unary(void *ctx, const char *method, const uint8_t *in, size_t len, uint8_t **out,
                     size_t *outlen, node_status *st)
{
    plugin *p = ((res_ctx *)ctx)->p;
    dp_res r = ((res_ctx *)ctx)->r;
    int slot = ((res_ctx *)ctx)->slot;
    const char *prefix = "/v1beta1.DevicePlugin/";
    const char *m = strncmp(method, prefix, strlen(prefix)) == 0 ? method + strlen(prefix) : "";
    if (strcmp(m, "GetDevicePluginOptions") == 0) {
        V1beta1__DevicePluginOptions o = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;
        o.pre_start_required = 0;
        o.get_preferred_allocation_available = 1;
        *out = malloc(16);
        if (*out != NULL)
            *outlen = v1beta1__device_plugin_options__pack(&o, *out);
    } else if (strcmp(m, "PreStartContainer") == 0) {
        *out = malloc(1); /* PreStartContainerResponse is empty */
        *outlen = 0;
    } else if (strcmp(m, "GetPreferredAllocation") == 0) {
        preferred(p, r, slot, in, len, out, outlen, st);
    } else if (strcmp(m, "Allocate") == 0) {
        allocate(p, r, slot, in, len, out, outlen, st);
    } else {
        set_status(st, ST_UNIMPLEMENTED, "method %.200s is not served", method);
    }
}
