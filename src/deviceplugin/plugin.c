/*
 * The device plugin daemon: discovers the GPUs, keeps their health, serves
 * and registers one gRPC server per resource, answers kubelet's calls and
 * publishes the node's inventory. Threads: see dp.h; besides those, one API
 * thread publishes the node and cleans up pod directories, so that the main
 * loop never waits on the API server.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "deviceplugin.pb-c.h"
#include "dp.h"
#include "k8s.h"
#include "node.h"
#include "podspec.h"
#include "watcher.h"

#define LOOP_MS       200
#define REGISTER_MS   3000
#define GC_EVERY_S    60
#define PUBLISH_MAX_S 30

dp_level dp_log_level = DP_INFO;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void dp_log(dp_level lvl, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (lvl < dp_log_level)
        return;
    char when[64];
    kgpu_rfc3339_now(when, sizeof(when));
    pthread_mutex_lock(&log_mu);
    fprintf(stderr, "%s %-5s ", when, names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&log_mu);
}

typedef struct plugin plugin;

/* What one resource's server hands its unary calls: the plugin and the resource. */
typedef struct res_ctx {
    plugin *p;
    dp_res r;
} res_ctx;

struct plugin {
    const dp_config *cfg;
    /* The inventory: written by the main thread under inv_mu, read by workers. */
    pthread_mutex_t inv_mu;
    dp_inventory inv;
    dp_snapshot snap[DP_NRES];
    unsigned registered;
    dp_server *srv[DP_NRES];
    res_ctx srv_ctx[DP_NRES];
    bool need_register[DP_NRES];
    ino_t sock_ino[DP_NRES];
    ino_t kubelet_ino;
    double next_register;
    kgpu_k8s *k8s;            /* NULL: no API server */
    pthread_mutex_t alloc_mu; /* one list-match-annotate sequence at a time */
    kgpu_nvml *nvml;
    bool xid_bad[KGPU_MAX_GPUS_PER_NODE];
    struct stat fake_st;
    /*
     * The API thread (node publication, pod directory clean-up) works at the
     * API server's pace, never the main loop's: a slow or unreachable server
     * must not hold back health, socket watching or registration. It wakes
     * on api_cv (with inv_mu) when inv_gen moves on or api_stop is set.
     */
    pthread_t api_thread;
    bool api_started;
    pthread_cond_t api_cv;
    uint64_t inv_gen; /* under inv_mu: bumped on every inventory change */
    bool api_stop;    /* under inv_mu */
    char shim[1100];
    dp_paths paths;
    /* The watcher and its /metrics (watcher.h): their own threads; NULL without --watch-config. */
    dp_watcher *watcher;
    dp_metrics_server *metrics;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sock_path(const plugin *p, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", p->cfg->plugin_dir, name);
}

/* ---- inventory and health ---- */

/* Encodes every registered resource's list; on failure nothing changes. */
static int publish_lists(plugin *p, const dp_inventory *inv, kgpu_error *err)
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
        dp_snapshot *s = &p->snap[r];
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
    if (dp_same_gpus(&p->inv, gpus, n))
        return 0;
    dp_inventory next = {.ngpus = n, .unit_mib = p->cfg->node.unit_mib};
    memcpy(next.gpus, gpus, (size_t)n * sizeof(*gpus));
    for (int i = 0; i < n; i++)
        if (i >= p->inv.ngpus || p->inv.gpus[i].healthy != gpus[i].healthy ||
            strcmp(p->inv.gpus[i].uuid, gpus[i].uuid) != 0)
            dp_log(gpus[i].healthy ? DP_INFO : DP_WARN,
                   "GPU %d %s %s, %" PRId64 " MiB, NUMA %d: %s", gpus[i].index, gpus[i].uuid,
                   gpus[i].model, gpus[i].memory_mib, gpus[i].numa,
                   gpus[i].healthy ? "healthy" : "UNHEALTHY");
    return publish_lists(p, &next, err);
}

static int take_fake(void *p, const kgpu_gpu_info *gpus, int n, kgpu_error *err)
{
    return update_inventory(p, gpus, n, err);
}

/* Re-reads the fake inventory when its file changed (dp_fake_poll). */
static int poll_fake(plugin *p, bool first, kgpu_error *err_first)
{
    return dp_fake_poll(p->cfg->node.fake_gpus, &p->fake_st, first, take_fake, p, err_first);
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
                dp_log(DP_WARN, "%s", e.msg);
            break;
        }
        if (idx >= 0 && idx < KGPU_MAX_GPUS_PER_NODE && !p->xid_bad[idx]) {
            dp_log(DP_WARN, "GPU %d: XID %llu: marking it unhealthy until the plugin restarts", idx,
                   xid);
            p->xid_bad[idx] = true;
        }
    }
    kgpu_gpu_info gpus[KGPU_MAX_GPUS_PER_NODE];
    int n = p->inv.ngpus;
    memcpy(gpus, p->inv.gpus, (size_t)n * sizeof(gpus[0]));
    for (int i = 0; i < n; i++)
        gpus[i].healthy = !p->xid_bad[gpus[i].index] && kgpu_nvml_alive(p->nvml, gpus[i].index);
    if (update_inventory(p, gpus, n, &e) != 0)
        dp_log(DP_ERROR, "%s", e.msg);
}

/* ---- the node's annotation and labels ---- */

/* A label value from a model name: [A-Za-z0-9._-], alphanumeric at both ends, ≤ 63. */
static void label_value(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in && n + 1 < cap && n < 63; in++) {
        char c = *in;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok && n > 0 && out[n - 1] == '-')
            continue;
        if (!ok && n == 0)
            continue;
        out[n++] = ok ? c : '-';
    }
    while (n > 0 &&
           !((out[n - 1] >= 'a' && out[n - 1] <= 'z') || (out[n - 1] >= 'A' && out[n - 1] <= 'Z') ||
             (out[n - 1] >= '0' && out[n - 1] <= '9')))
        n--;
    out[n] = '\0';
}

/* The merge patch for the node: kgpu.io/gpus and the two labels. */
static char *node_patch(const dp_inventory *inv)
{
    kgpu_gpu_spec spec[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < inv->ngpus; i++) {
        const kgpu_gpu_info *g = &inv->gpus[i];
        spec[i] = (kgpu_gpu_spec){g->index, g->uuid, g->model, g->memory_mib, g->numa, g->healthy};
    }
    char *gpus = kgpu_gpus_annotation_format(spec, inv->ngpus);
    if (gpus == NULL)
        return NULL;
    char model[64] = "";
    for (int i = 0; i < inv->ngpus; i++)
        if (i == 0)
            label_value(inv->gpus[0].model, model, sizeof(model));
        else if (strcmp(inv->gpus[i].model, inv->gpus[0].model) != 0)
            snprintf(model, sizeof(model), "mixed");
    char count[16];
    snprintf(count, sizeof(count), "%d", inv->ngpus);
    json_t *patch = json_pack("{s:{s:{s:s},s:{s:s,s:s}}}", "metadata", "annotations", KGPU_ANN_GPUS,
                              gpus, "labels", KGPU_LABEL_MODEL, model, KGPU_LABEL_COUNT, count);
    free(gpus);
    if (patch == NULL)
        return NULL;
    char *text = json_dumps(patch, JSON_COMPACT);
    json_decref(patch);
    return text;
}

/* PATCHes the node with `inv` (a copy: runs on the API thread); 0 when it took. */
static int publish_node(plugin *p, const dp_inventory *inv, double backoff)
{
    char *body = node_patch(inv);
    char path[KGPU_K8S_PATH_MAX];
    snprintf(path, sizeof(path), "/api/v1/nodes/%s", p->cfg->node.node_name);
    kgpu_http_resp resp = {0};
    kgpu_error e = {0};
    int rc = body == NULL ? kgpu_error_set(&e, KGPU_ENOMEM, "out of memory")
                          : kgpu_k8s_request(p->k8s, "PATCH", path, "application/merge-patch+json",
                                             body, &resp, &e);
    if (rc == 0 && resp.status == 200) {
        dp_log(DP_INFO, "node %s: published %d GPUs", p->cfg->node.node_name, inv->ngpus);
    } else {
        dp_log(DP_WARN, "node %s: publishing the GPU inventory failed (%s); again in %.0f s",
               p->cfg->node.node_name,
               rc != 0 ? e.msg : (resp.body != NULL ? resp.body : "no answer"), backoff);
        rc = rc != 0 ? rc : KGPU_EIO;
    }
    free(resp.body);
    free(body);
    return rc;
}

/* ---- Allocate and GetPreferredAllocation ---- */

/* The node's pods (a new array; NULL on error), in pages like every list. */
static json_t *list_node_pods(plugin *p, kgpu_error *err)
{
    char query[KGPU_K8S_PATH_MAX];
    snprintf(query, sizeof(query), "fieldSelector=spec.nodeName%%3D%s", p->cfg->node.node_name);
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_error e;
    if (kgpu_k8s_list(p->k8s, "/api/v1/pods", query, NULL, &items, rv, sizeof(rv), NULL, &e) != 0)
        kgpu_error_set(err, e.code, "listing the pods of node %s: %s", p->cfg->node.node_name,
                       e.msg);
    return items;
}

/* Records progress (or completion) in the pod; the uid guards against a namesake. */
static int mark_pod(plugin *p, const dp_match *m, kgpu_error *err)
{
    char when[64];
    kgpu_rfc3339_now(when, sizeof(when));
    json_t *ann = m->complete ? json_pack("{s:s,s:n}", KGPU_ANN_ALLOCATED, when, DP_ANN_ALLOCATING)
                              : json_pack("{s:s}", DP_ANN_ALLOCATING, m->progress);
    json_t *patch = json_pack("{s:{s:s,s:o}}", "metadata", "uid", m->uid, "annotations", ann);
    char *body = patch != NULL ? json_dumps(patch, JSON_COMPACT) : NULL;
    json_decref(patch);
    if (body == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    char path[KGPU_K8S_PATH_MAX];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", m->ns, m->name);
    kgpu_http_resp resp = {0};
    int rc =
        kgpu_k8s_request(p->k8s, "PATCH", path, "application/merge-patch+json", body, &resp, err);
    if (rc == 0 && resp.status != 200)
        rc = kgpu_error_set(err, KGPU_EIO, "marking pod %s/%s: HTTP %ld: %.200s", m->ns, m->name,
                            resp.status, resp.body != NULL ? resp.body : "");
    free(resp.body);
    free(body);
    return rc;
}

static void set_status(dp_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_status(dp_status *st, int code, const char *fmt, ...)
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
static bool known_ids(plugin *p, dp_res r, char **ids, size_t n, dp_status *st)
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
static int check_assigned_gpus(const plugin *p, const dp_match *m, const dp_inventory *inv,
                               kgpu_error *err)
{
    if (m->ngpus == 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s gives container %s no GPU", m->ns, m->name,
                              KGPU_ANN_ASSIGNMENT, m->container);
    for (int i = 0; i < m->ngpus; i++) {
        int found = -1;
        for (int g = 0; g < inv->ngpus && found < 0; g++)
            if (strcmp(inv->gpus[g].uuid, m->gpus[i].uuid) == 0)
                found = g;
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
                                  m->ns, m->name, m->container, inv->gpus[found].index,
                                  m->gpus[i].uuid);
        if (found < 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "pod %s/%s: annotation %s gives container %s GPU %s, which node "
                                  "%s does not have (did its GPUs change after the pod was "
                                  "bound?)",
                                  m->ns, m->name, KGPU_ANN_ASSIGNMENT, m->container,
                                  m->gpus[i].uuid, p->cfg->node.node_name);
    }
    return 0;
}

static const char no_api_msg[] =
    "kgpu-device-plugin runs without an API server (no in-cluster service account and no "
    "--kubeconfig), so it cannot tell which pod this allocation is for; it hands out no GPU "
    "without knowing";

static void allocate(plugin *p, dp_res r, const uint8_t *in, size_t len, uint8_t **out,
                     size_t *outlen, dp_status *st)
{
    V1beta1__AllocateRequest *req = v1beta1__allocate_request__unpack(NULL, len, in);
    if (req == NULL) {
        set_status(st, ST_INVALID, "Allocate: request is not a valid AllocateRequest");
        return;
    }
    size_t n = req->n_container_requests;
    dp_response *resp = calloc(n + 1, sizeof(*resp));
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
    if (p->paths.shim_lib != NULL && access(p->paths.shim_lib, R_OK) != 0) {
        set_status(st, ST_FAILED_PRECONDITION,
                   "the interception library %s is missing on this node, so the container's "
                   "memory limit could not be enforced; install it or run the plugin with "
                   "--shim-lib none",
                   p->paths.shim_lib);
        goto out;
    }
    pthread_mutex_lock(&p->alloc_mu);
    for (size_t i = 0; i < n && st->code == 0; i++) {
        kgpu_error e = {0};
        size_t count = req->container_requests[i]->n_devices_ids;
        json_t *list = list_node_pods(p, &e);
        dp_match m;
        dp_inventory inv;
        pthread_mutex_lock(&p->inv_mu);
        inv = p->inv;
        pthread_mutex_unlock(&p->inv_mu);
        int rc = list == NULL ? (e.code ? e.code : KGPU_EIO)
                              : dp_match_find(list, p->cfg->node.node_name, r, (int64_t)count,
                                              p->registered, inv.unit_mib, &m, &e);
        json_decref(list);
        if (rc == 0)
            rc = check_assigned_gpus(p, &m, &inv, &e);
        if (rc == 0 && m.primary)
            rc = dp_write_pod_files(&m, &p->paths, &e);
        if (rc == 0)
            rc = mark_pod(p, &m, &e);
        if (rc != 0) {
            set_status(st, status_of(rc), "Allocate %zu %s: %s", count, dp_res_name(r), e.msg);
            break;
        }
        dp_response_build(&m, &inv, &p->paths, &resp[i]);
        dp_log(DP_INFO, "Allocate %zu %s: pod %s/%s %scontainer %s%s", count, dp_res_name(r), m.ns,
               m.name, m.init ? "init " : "", m.container,
               m.complete ? " (pod fully allocated)" : "");
    }
    pthread_mutex_unlock(&p->alloc_mu);
    if (st->code == 0 && dp_allocate_encode(resp, (int)n, out, outlen) != 0)
        set_status(st, ST_INTERNAL, "out of memory encoding the response");
out:
    if (st->code != 0)
        dp_log(DP_WARN, "%s", st->message);
    free(resp);
    v1beta1__allocate_request__free_unpacked(req, NULL);
}

/* The GPUs and device counts the matched container should get for resource r. */
static void want_of(const dp_match *m, const dp_inventory *inv, dp_want *w)
{
    w->n = 0;
    for (int i = 0; i < m->ngpus; i++) {
        int g = -1;
        for (int j = 0; j < inv->ngpus; j++)
            if (strcmp(inv->gpus[j].uuid, m->gpus[i].uuid) == 0)
                g = j;
        if (g < 0)
            continue;
        int64_t share = m->count / m->ngpus + (i < m->count % m->ngpus ? 1 : 0);
        w->gpu[w->n] = g;
        w->count[w->n++] = share;
    }
}

static void preferred(plugin *p, dp_res r, const uint8_t *in, size_t len, uint8_t **out,
                      size_t *outlen, dp_status *st)
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
    dp_inventory inv;
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
        if (p->k8s != NULL) {
            /* Steer to the extender's GPUs when the pod can be told; else just pack. */
            kgpu_error e = {0};
            dp_match m;
            pthread_mutex_lock(&p->alloc_mu);
            json_t *list = list_node_pods(p, &e);
            if (list != NULL && dp_match_find(list, p->cfg->node.node_name, r, size, p->registered,
                                              inv.unit_mib, &m, &e) == 0)
                want_of(&m, &inv, &want);
            else
                dp_log(DP_DEBUG, "GetPreferredAllocation: packing (%s)", e.msg);
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

static void unary(void *ctx, const char *method, const uint8_t *in, size_t len, uint8_t **out,
                  size_t *outlen, dp_status *st)
{
    plugin *p = ((res_ctx *)ctx)->p;
    dp_res r = ((res_ctx *)ctx)->r;
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
        preferred(p, r, in, len, out, outlen, st);
    } else if (strcmp(m, "Allocate") == 0) {
        allocate(p, r, in, len, out, outlen, st);
    } else {
        set_status(st, ST_UNIMPLEMENTED, "method %.200s is not served", method);
    }
}

/* ---- sockets and registration ---- */

static int start_server(plugin *p, dp_res r, kgpu_error *err)
{
    char path[1100];
    sock_path(p, dp_res_socket(r), path, sizeof(path));
    p->srv_ctx[r] = (res_ctx){p, r};
    p->srv[r] = dp_server_start(path, dp_res_name(r), &p->snap[r], unary, &p->srv_ctx[r], err);
    if (p->srv[r] == NULL)
        return err->code ? err->code : KGPU_EIO;
    struct stat st;
    p->sock_ino[r] = stat(path, &st) == 0 ? st.st_ino : 0;
    p->need_register[r] = true;
    dp_log(DP_INFO, "serving %s on %s", dp_res_name(r), path);
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
        dp_log(DP_WARN, "%s: socket %s is gone (kubelet restarted?); serving it again",
               dp_res_name((dp_res)r), path);
        dp_server_stop(p->srv[r]);
        p->srv[r] = NULL;
        kgpu_error e = {0};
        if (start_server(p, (dp_res)r, &e) != 0)
            dp_log(DP_ERROR, "%s", e.msg);
    }
    sock_path(p, "kubelet.sock", path, sizeof(path));
    ino_t ino = stat(path, &st) == 0 ? st.st_ino : 0;
    if (ino != p->kubelet_ino) {
        if (ino != 0)
            dp_log(DP_INFO, "kubelet socket %s appeared; registering", path);
        p->kubelet_ino = ino;
        for (int r = 0; r < DP_NRES; r++)
            p->need_register[r] = (p->registered & (1u << r)) != 0;
        p->next_register = 0;
    }
    if (ino == 0 || now_s() < p->next_register)
        return;
    for (int r = 0; r < DP_NRES; r++) {
        if (!p->need_register[r] || p->srv[r] == NULL)
            continue;
        kgpu_error e = {0};
        if (dp_register(path, dp_res_socket((dp_res)r), (dp_res)r, true, REGISTER_MS, &e) == 0) {
            p->need_register[r] = false;
            dp_log(DP_INFO, "registered %s with kubelet", dp_res_name((dp_res)r));
        } else {
            dp_log(DP_WARN, "%s; retrying", e.msg);
            p->next_register = now_s() + 1;
        }
    }
}

/* ---- removing the directories of pods that are gone ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (remove(path) != 0 && flag != FTW_DNR)
        dp_log(DP_WARN, "removing %s: %s", path, strerror(errno));
    return 0;
}

static void gc_pods(plugin *p)
{
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s/pods", p->cfg->node.state_dir);
    pthread_mutex_lock(&p->alloc_mu);
    kgpu_error e = {0};
    json_t *list = list_node_pods(p, &e);
    if (list == NULL) {
        pthread_mutex_unlock(&p->alloc_mu);
        dp_log(DP_DEBUG, "pod directory cleanup skipped: %s", e.msg);
        return;
    }
    char cmd_dir[1400];
    DIR *d = opendir(dir);
    for (struct dirent *de; d != NULL && (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.')
            continue;
        bool live = false;
        const json_t *items = list;
        for (size_t i = 0; i < json_array_size(items) && !live; i++) {
            const char *uid = json_string_value(
                json_object_get(json_object_get(json_array_get(items, i), "metadata"), "uid"));
            live = uid != NULL && strcmp(uid, de->d_name) == 0;
        }
        if (live)
            continue;
        snprintf(cmd_dir, sizeof(cmd_dir), "%s/%s", dir, de->d_name);
        dp_log(DP_INFO, "removing %s: its pod is gone", cmd_dir);
        nftw(cmd_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    }
    if (d != NULL)
        closedir(d);
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
        double now = now_s();
        bool publish = p->inv_gen != published && now >= retry_at;
        bool gc = now >= gc_at;
        if (!publish && !gc) {
            api_wait_until(p, p->inv_gen != published && retry_at < gc_at ? retry_at : gc_at);
            continue;
        }
        dp_inventory inv = p->inv;
        uint64_t gen = p->inv_gen;
        pthread_mutex_unlock(&p->inv_mu);
        if (publish) {
            double next = backoff == 0 ? 1 : backoff * 2;
            if (next > PUBLISH_MAX_S)
                next = PUBLISH_MAX_S;
            if (publish_node(p, &inv, next) == 0) {
                published = gen;
                backoff = 0;
            } else {
                backoff = next;
                retry_at = now_s() + backoff;
            }
        }
        if (gc) {
            gc_at = now_s() + GC_EVERY_S;
            gc_pods(p);
        }
        pthread_mutex_lock(&p->inv_mu);
    }
    pthread_mutex_unlock(&p->inv_mu);
    return NULL;
}

static int start_api_thread(plugin *p, kgpu_error *err)
{
    if (p->k8s == NULL)
        return 0;
    if (pthread_create(&p->api_thread, NULL, api_loop, p) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the API server thread");
    p->api_started = true;
    return 0;
}

static void stop_api_thread(plugin *p)
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

/* ---- the daemon ---- */

static int connect_api(plugin *p, kgpu_error *err)
{
    if (p->cfg->no_api)
        return 0;
    bool no_cluster;
    int rc = dp_k8s_connect(p->cfg->node.kubeconfig, &p->k8s, &no_cluster, err);
    if (no_cluster) {
        dp_log(DP_WARN, "no in-cluster credentials and no --kubeconfig: running without an "
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
    dp_log(DP_INFO, "watcher: every %.1f s, enforce %s, /metrics %s%s", wc.interval_s,
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
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* api_wait_until's deadlines are now_s() */
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
    dp_node_paths(&cfg->node, p->shim, sizeof(p->shim), &p->paths);
    /* Refused at start: without the daemon, containers would get MPS limits nobody enforces. */
    int rc = cfg->node.sharing == DP_SHARING_MPS ? dp_mps_check(cfg->node.mps_pipe_dir, err) : 0;
    if (rc == 0 && mkdir(cfg->node.state_dir, 0755) != 0 && errno != EEXIST)
        rc = kgpu_error_set(err, KGPU_EIO, "state directory %s: %s", cfg->node.state_dir,
                            strerror(errno));
    if (rc == 0)
        rc = dp_write_preload(&p->paths, err);
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
            dp_log(DP_WARN, "%d of %d GPUs do not answer and are not advertised (%s)",
                   kgpu_nvml_device_count(p->nvml) - n, kgpu_nvml_device_count(p->nvml),
                   kgpu_nvml_skipped(p->nvml));
        if (rc == 0 && !kgpu_nvml_has_events(p->nvml))
            dp_log(DP_WARN, "this driver's NVML has no event functions: XID errors go unseen; "
                            "lost GPUs are still noticed");
    }
    if (rc == 0 && p->inv.ngpus == 0)
        dp_log(DP_WARN, "no GPUs found: registering empty device lists");
    if (rc == 0 && p->snap[DP_RES_MEM].buf == NULL) {
        /* No GPUs: still publish (empty) lists so kubelet sees zero capacity. */
        dp_inventory empty = {.ngpus = 0, .unit_mib = cfg->node.unit_mib};
        rc = publish_lists(p, &empty, err);
    }
    for (int r = 0; r < DP_NRES && rc == 0; r++)
        if (p->registered & (1u << r))
            rc = start_server(p, (dp_res)r, err);
    if (rc == 0)
        rc = start_api_thread(p, err);
    if (rc == 0)
        rc = start_watcher(p, err);
    if (rc == 0)
        dp_log(DP_INFO,
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
    stop_api_thread(p);
    for (int r = 0; r < DP_NRES; r++)
        dp_server_stop(p->srv[r]);
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
        dp_log(DP_INFO, "stopped");
    return rc;
}
