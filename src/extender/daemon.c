/*
 * The kgpu-extender process: inventory from a cluster file or from the API
 * server (list + watch on two reflector threads), and the HTTP(S) server
 * (libmicrohttpd, one thread per connection) that hands each complete,
 * size-checked request to ext_handle.
 */
#include <errno.h>
#include <malloc.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ext.h"
#include "fileio.h"
#include "yamljson.h"

/* ---- cluster file ---- */

static int int_field(json_t *obj, const char *key, const char *where, int64_t *out, bool required,
                     kgpu_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        if (required)
            return kgpu_error_set(err, KGPU_EPARSE, "%s.%s is missing", where, key);
        return 0;
    }
    /* numa alone may be -1 (unknown) */
    int64_t min = strcmp(key, "numa") == 0 ? -1 : 0;
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return kgpu_error_set(err, KGPU_EPARSE, "%s.%s is not %s integer", where, key,
                              min < 0 ? "-1 or a non-negative" : "a non-negative");
    *out = json_integer_value(v);
    return 0;
}

/* The --cluster-file form: nodes: [{name, cpu_milli?, memory_mib?, labels?, gpus: [...]}]. */
static int load_cluster_file(ext_daemon *d, kgpu_error *err)
{
    const char *path = d->cfg.cluster_file;
    json_t *root = kgpu_yaml_load_file(path, err);
    if (root == NULL)
        return err ? err->code : KGPU_EPARSE;
    json_t *nodes = json_object_get(root, "nodes");
    int rc = 0;
    size_t n = json_array_size(nodes);
    kgpu_node_spec *specs = calloc(n + 1, sizeof(*specs));
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc(n + 1, sizeof(*gpus));
    kgpu_label(*labels)[32] = calloc(n + 1, sizeof(*labels));
    /* The GPUs' strings, copied by kgpu_gpu_item_parse (ext_state_set_nodes copies them again). */
    struct gpu_strings {
        char uuid[KGPU_UUID_MAX];
        char model[KGPU_MODEL_NAME_MAX];
    }(*strings)[KGPU_MAX_GPUS_PER_NODE] = calloc(n + 1, sizeof(*strings));
    if (specs == NULL || gpus == NULL || labels == NULL || strings == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    if (!json_is_array(nodes) || n == 0) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: expected a non-empty list under 'nodes'", path);
        goto out;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *node = json_array_get(nodes, i);
        char where[1200];
        snprintf(where, sizeof(where), "%s: nodes[%zu]", path, i);
        const char *name = json_string_value(json_object_get(node, "name"));
        if (!json_is_object(node) || name == NULL || name[0] == '\0') {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s needs a name", where);
            break;
        }
        kgpu_node_spec *s = &specs[i];
        s->name = name;
        s->cpu_milli = 64000; /* CPU and memory are kube-scheduler's to check */
        s->memory_mib = 262144;
        if ((rc = int_field(node, "cpu_milli", where, &s->cpu_milli, false, err)) != 0 ||
            (rc = int_field(node, "memory_mib", where, &s->memory_mib, false, err)) != 0)
            break;
        json_t *lab = json_object_get(node, "labels");
        const char *lk;
        json_t *lv;
        json_object_foreach(lab, lk, lv)
        {
            if (s->nlabels == 32 || !json_is_string(lv)) {
                rc = kgpu_error_set(err, KGPU_EPARSE, "%s.labels: at most 32 string values", where);
                break;
            }
            labels[i][s->nlabels++] = (kgpu_label){(char *)lk, (char *)json_string_value(lv)};
        }
        s->labels = labels[i];
        json_t *gl = json_object_get(node, "gpus");
        if (!json_is_array(gl) || json_array_size(gl) > KGPU_MAX_GPUS_PER_NODE) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s.gpus: expected a list of at most %d GPUs",
                                where, KGPU_MAX_GPUS_PER_NODE);
            break;
        }
        s->ngpus = (int)json_array_size(gl);
        s->gpus = gpus[i];
        for (int g = 0; g < s->ngpus && rc == 0; g++) {
            char gw[1300];
            snprintf(gw, sizeof(gw), "%s.gpus[%d]", where, g);
            rc = kgpu_gpu_item_parse(json_array_get(gl, (size_t)g), gw, g, false, false,
                                     &gpus[i][g], strings[i][g].uuid, strings[i][g].model, err);
        }
    }
    if (rc == 0) {
        pthread_mutex_lock(&d->state.mu);
        rc = ext_state_set_nodes(&d->state, specs, (int)n, err);
        d->state.nodes_synced = d->state.pods_synced = rc == 0;
        pthread_mutex_unlock(&d->state.mu);
        if (rc != 0 && err)
            kgpu_error_set(err, err->code, "%s: %.400s", path, err->msg);
    }
out:
    free(specs);
    free(gpus);
    free(labels);
    free(strings);
    json_decref(root);
    /* The parsed file was many small blocks; give that memory back to the system. */
    malloc_trim(0);
    return rc;
}

/* ---- API server watches ---- */

/*
 * Listed objects are cut down as their page arrives, so that what the extender
 * keeps of a 20,000-pod list until its reset fits its memory limit: a pod to
 * what kgpu_pod_from_json and the state read (kgpu_pod_json_trim); a node
 * loses managedFields, kubectl's copy of the whole object and every status
 * member but allocatable and capacity (status.images is most of a node).
 */
static void nodes_trim(void *ctx, json_t *node)
{
    json_t *meta = json_object_get(node, "metadata");
    json_object_del(meta, "managedFields");
    json_object_del(json_object_get(meta, "annotations"),
                    "kubectl.kubernetes.io/last-applied-configuration");
    json_t *status = json_object_get(node, "status");
    const char *key;
    void *tmp;
    json_t *v;
    json_object_foreach_safe(status, tmp, key, v)
    {
        if (strcmp(key, "allocatable") != 0 && strcmp(key, "capacity") != 0)
            json_object_del(status, key);
    }
}

static void pods_trim(void *ctx, json_t *pod)
{
    kgpu_pod_json_trim(pod);
}

static void nodes_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
    size_t n = json_array_size(items), m = 0;
    kgpu_node_spec *specs = calloc(n + 1, sizeof(*specs));
    kgpu_node_store *stores = calloc(n + 1, sizeof(*stores));
    if (specs == NULL || stores == NULL) {
        free(specs);
        free(stores);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        kgpu_error err;
        if (kgpu_node_from_json(json_array_get(items, i), &specs[m], &stores[m], &err) != 0) {
            ext_log(EXT_WARN, "node inventory ignored: %s", err.msg);
            continue;
        }
        if (specs[m].ngpus > 0)
            m++;
    }
    kgpu_error err;
    pthread_mutex_lock(&d->state.mu);
    int rc = ext_state_set_nodes(&d->state, specs, (int)m, &err);
    if (rc == 0)
        d->state.nodes_synced = true;
    pthread_mutex_unlock(&d->state.mu);
    if (rc != 0)
        ext_log(EXT_ERROR, "node list not applied: %s", err.msg);
    else
        ext_log(EXT_INFO, "inventory: %zu GPU nodes", m);
    free(specs);
    free(stores);
    malloc_trim(0); /* the list was a large transient tree */
}

static void nodes_event(void *ctx, const char *type, json_t *obj)
{
    ext_daemon *d = ctx;
    kgpu_error err;
    if (strcmp(type, "DELETED") == 0) {
        const char *name =
            json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
        if (name == NULL)
            return;
        pthread_mutex_lock(&d->state.mu);
        ext_state_remove_node(&d->state, name);
        pthread_mutex_unlock(&d->state.mu);
        return;
    }
    kgpu_node_spec spec;
    kgpu_node_store *store = malloc(sizeof(*store));
    if (store == NULL)
        return;
    if (kgpu_node_from_json(obj, &spec, store, &err) != 0) {
        ext_log(EXT_WARN, "node inventory ignored: %s", err.msg);
    } else {
        pthread_mutex_lock(&d->state.mu);
        int rc = ext_state_upsert_node(&d->state, &spec, &err);
        pthread_mutex_unlock(&d->state.mu);
        if (rc != 0)
            ext_log(EXT_ERROR, "node %s not updated: %s", spec.name, err.msg);
    }
    free(store);
}

static void nodes_restart(void *ctx, const char *why)
{
    ext_daemon *d = ctx;
    atomic_fetch_add(&d->metrics.watch_restarts[0], 1);
    ext_log(EXT_WARN, "node watch restarts: %s", why);
}

/* Is the pod ns/name/uid gone from the API server (deleted, replaced, or finished)? */
static bool pod_gone(ext_daemon *d, const char *triple)
{
    char ns[128], name[KGPU_NAME_MAX + 1], uid[128];
    if (sscanf(triple, "%127[^/]/%254[^/]/%127s", ns, name, uid) != 3)
        return false;
    char path[KGPU_K8S_PATH_MAX];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", ns, name);
    kgpu_error err;
    long status;
    json_t *pod = kgpu_k8s_get_json(d->k8s, path, &status, &err);
    if (status == 404)
        return true;
    json_t *meta = json_object_get(pod, "metadata");
    const char *u = json_string_value(json_object_get(meta, "uid"));
    const char *phase = json_string_value(json_object_get(json_object_get(pod, "status"), "phase"));
    bool gone =
        pod != NULL &&
        ((u != NULL && strcmp(u, uid) != 0) || json_object_get(meta, "deletionTimestamp") != NULL ||
         (phase != NULL && (strcmp(phase, "Succeeded") == 0 || strcmp(phase, "Failed") == 0)));
    json_decref(pod);
    return gone;
}

static void pods_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
    char **suspects;
    size_t nsuspects;
    pthread_mutex_lock(&d->state.mu);
    ext_state_pods_reset(&d->state, items, &suspects, &nsuspects);
    d->state.pods_synced = true;
    pthread_mutex_unlock(&d->state.mu);
    /* Pods the list did not show but that were bound while it was made: ask one by one. */
    for (size_t i = 0; i < nsuspects; i++) {
        if (pod_gone(d, suspects[i])) {
            const char *uid = strrchr(suspects[i], '/') + 1;
            pthread_mutex_lock(&d->state.mu);
            ext_state_pod_gone(&d->state, uid);
            pthread_mutex_unlock(&d->state.mu);
        }
        free(suspects[i]);
    }
    free(suspects);
    pthread_mutex_lock(&d->state.mu);
    long held = (long)d->state.pods.len;
    pthread_mutex_unlock(&d->state.mu);
    ext_log(EXT_INFO, "pods: %zu listed, %ld hold GPUs", json_array_size(items), held);
    malloc_trim(0);
}

static void pods_event(void *ctx, const char *type, json_t *obj)
{
    ext_daemon *d = ctx;
    pthread_mutex_lock(&d->state.mu);
    if (strcmp(type, "DELETED") == 0) {
        const char *uid =
            json_string_value(json_object_get(json_object_get(obj, "metadata"), "uid"));
        if (uid != NULL)
            ext_state_pod_gone(&d->state, uid);
    } else {
        ext_state_pod_seen(&d->state, obj);
    }
    pthread_mutex_unlock(&d->state.mu);
}

static void pods_restart(void *ctx, const char *why)
{
    ext_daemon *d = ctx;
    pthread_mutex_lock(&d->state.mu);
    d->state.relist_started = ext_now(); /* pods bound from now on may miss the coming list */
    pthread_mutex_unlock(&d->state.mu);
    atomic_fetch_add(&d->metrics.watch_restarts[1], 1);
    ext_log(EXT_WARN, "pod watch restarts: %s", why);
}

static void *watch_nodes(void *arg)
{
    ext_daemon *d = arg;
    static const kgpu_reflector_ops ops = {nodes_reset, nodes_event, nodes_restart, nodes_trim};
    kgpu_reflector_run(d->k8s, "/api/v1/nodes", NULL, &ops, d, &d->stop);
    return NULL;
}

static void *watch_pods(void *arg)
{
    ext_daemon *d = arg;
    /* Pods name their nodes: know the nodes first. */
    for (;;) {
        pthread_mutex_lock(&d->state.mu);
        bool ready = d->state.nodes_synced;
        pthread_mutex_unlock(&d->state.mu);
        if (ready || atomic_load(&d->stop))
            break;
        usleep(50 * 1000);
    }
    static const kgpu_reflector_ops ops = {pods_reset, pods_event, pods_restart, pods_trim};
    kgpu_reflector_run(d->k8s, "/api/v1/pods",
                       "fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed", &ops,
                       d, &d->stop);
    return NULL;
}

bool ext_daemon_ready(ext_daemon *d)
{
    pthread_mutex_lock(&d->state.mu);
    bool ready = d->state.nodes_synced && d->state.pods_synced;
    pthread_mutex_unlock(&d->state.mu);
    return ready && ext_is_leader(d);
}

/* ---- HTTP ---- */

typedef struct request {
    char *body;
    size_t len, cap;
    bool too_big, refused;
} request;

/* With a client CA configured, only peers whose certificate it signed get in. */
static bool client_allowed(ext_daemon *d, struct MHD_Connection *conn)
{
    if (d->tls_ca_pem == NULL)
        return true;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (ci == NULL || ci->tls_session == NULL)
        return false;
    gnutls_session_t tls = (gnutls_session_t)ci->tls_session;
    unsigned int n = 0, status = 0;
    if (gnutls_certificate_get_peers(tls, &n) == NULL || n == 0)
        return false;
    return gnutls_certificate_verify_peers2(tls, &status) == 0 && status == 0;
}

static enum MHD_Result send_reply(struct MHD_Connection *conn, int status, const char *type,
                                  char *body)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(body ? strlen(body) : 0, body ? body : (void *)"",
                                        body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result r = MHD_queue_response(conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    ext_daemon *d = cls;
    request *rq = *con_cls;
    if (rq == NULL) {
        rq = calloc(1, sizeof(*rq));
        if (rq == NULL)
            return MHD_NO;
        *con_cls = rq;
        /* Probes carry no client certificate: health and version reveal nothing. */
        bool probe = strcmp(method, "GET") == 0 &&
                     (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0 ||
                      strcmp(url, "/version") == 0);
        if (!probe && !client_allowed(d, conn))
            rq->refused = true;
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl != NULL && strtoll(cl, NULL, 10) > d->cfg.max_body_bytes)
            rq->too_big = true;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (rq->too_big || rq->refused)
            return MHD_YES; /* drain and drop */
        if (rq->len + n > (size_t)d->cfg.max_body_bytes) {
            rq->too_big = true;
            free(rq->body);
            rq->body = NULL;
            rq->len = rq->cap = 0;
            return MHD_YES;
        }
        if (rq->len + n + 1 > rq->cap) {
            size_t cap = rq->cap ? rq->cap : 4096;
            while (cap < rq->len + n + 1)
                cap *= 2;
            char *b = realloc(rq->body, cap);
            if (b == NULL)
                return MHD_NO;
            rq->body = b;
            rq->cap = cap;
        }
        memcpy(rq->body + rq->len, upload_data, n);
        rq->len += n;
        rq->body[rq->len] = '\0';
        return MHD_YES;
    }
    if (rq->refused)
        return send_reply(conn, 403, "text/plain", strdup("client certificate required\n"));
    if (rq->too_big) {
        char msg[160];
        snprintf(msg, sizeof(msg), "{\"Error\":\"request body larger than %ld bytes\"}",
                 d->cfg.max_body_bytes);
        return send_reply(conn, 413, "application/json", strdup(msg));
    }
    ext_response r;
    ext_handle(d, method, url, rq->body ? rq->body : "", rq->len, &r);
    if (r.body == NULL)
        return send_reply(conn, 500, "text/plain", strdup("out of memory\n"));
    return send_reply(conn, r.status, r.content_type, r.body);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    request *rq = *con_cls;
    if (rq != NULL) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
}

static char *read_pem(const char *path, kgpu_error *err)
{
    char *buf;
    size_t n;
    if (kgpu_read_file_max(path, 1 << 20, &buf, &n, err) != 0)
        return NULL;
    return buf;
}

/* "ADDR:PORT", "[V6]:PORT" or ":PORT" -> a socket address. */
static int parse_listen(const char *text, struct sockaddr_storage *ss, kgpu_error *err)
{
    char host[256], port[16];
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) >= sizeof(port))
        return kgpu_error_set(err, KGPU_EINVAL, "--listen '%s': expected ADDR:PORT", text);
    size_t hl = (size_t)(colon - text);
    if (hl >= sizeof(host))
        return kgpu_error_set(err, KGPU_EINVAL, "--listen '%s': address too long", text);
    memcpy(host, text, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    snprintf(port, sizeof(port), "%s", colon + 1);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (rc != 0 || ai == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "--listen '%s': %s", text, gai_strerror(rc));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return 0;
}

int ext_daemon_start(ext_daemon *d, kgpu_error *err)
{
    ext_log_set_level(d->cfg.log_level);
    int rc = ext_state_init(&d->state, &d->cfg, &d->metrics, err);
    if (rc != 0)
        return rc;
    atomic_init(&d->stop, false);
    if (d->cfg.cluster_file[0]) {
        if ((rc = load_cluster_file(d, err)) != 0)
            return rc;
        ext_log(EXT_INFO, "cluster file %s: %d nodes, %d GPUs; binds are kept in memory",
                d->cfg.cluster_file, kgpu_cluster_node_count(d->state.cluster),
                kgpu_cluster_gpu_count(d->state.cluster));
    } else {
        kgpu_k8s_config kc;
        memset(&kc, 0, sizeof(kc));
        rc = d->cfg.kubeconfig[0]
                 ? kgpu_k8s_config_kubeconfig(d->cfg.kubeconfig, &kc, err)
                 : kgpu_k8s_config_in_cluster(d->cfg.sa_dir[0] ? d->cfg.sa_dir : NULL, &kc, err);
        /*
         * With leader election no API call may outlive the gap between the
         * leader giving up (80 % of the lease) and a standby taking over
         * (100 %): a Binding still in flight then could race the new leader.
         */
        if (rc == 0 && d->cfg.leader_elect) {
            long gap_ms = (long)d->cfg.lease_duration_s * 200;
            if (kc.timeout_ms <= 0 || kc.timeout_ms > gap_ms)
                kc.timeout_ms = gap_ms;
        }
        if (rc == 0 && (d->k8s = kgpu_k8s_new(&kc, err)) == NULL)
            rc = err ? err->code : KGPU_EINVAL;
        kgpu_k8s_config_clear(&kc);
        if (rc != 0) {
            if (err)
                kgpu_error_set(err, rc, "%.400s (use --cluster-file to run without an API server)",
                               err->msg);
            return rc;
        }
        if (pthread_create(&d->watch_threads[0], NULL, watch_nodes, d) == 0)
            d->nwatch = 1;
        if (pthread_create(&d->watch_threads[1], NULL, watch_pods, d) == 0)
            d->nwatch = 2;
        if (d->nwatch != 2)
            return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the watch threads");
        if (d->cfg.leader_elect && (rc = ext_leader_start(d, err)) != 0)
            return rc;
    }
    struct sockaddr_storage ss;
    if ((rc = parse_listen(d->cfg.listen, &ss, err)) != 0)
        return rc;
    unsigned int flags =
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    if (d->cfg.tls_cert[0]) {
        d->tls_cert_pem = read_pem(d->cfg.tls_cert, err);
        d->tls_key_pem = d->tls_cert_pem ? read_pem(d->cfg.tls_key, err) : NULL;
        if (d->tls_key_pem == NULL)
            return err ? err->code : KGPU_EIO;
        if (d->cfg.tls_client_ca[0] &&
            (d->tls_ca_pem = read_pem(d->cfg.tls_client_ca, err)) == NULL)
            return err ? err->code : KGPU_EIO;
        flags |= MHD_USE_TLS;
    }
    struct MHD_OptionItem tls_opts[] = {
        {d->tls_cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, d->tls_cert_pem},
        {d->tls_key_pem ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, d->tls_key_pem},
        {d->tls_ca_pem ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, 0, d->tls_ca_pem},
        {MHD_OPTION_END, 0, NULL},
    };
    /* Compact the option list: MHD stops at the first END. */
    struct MHD_OptionItem opts[4];
    int no = 0;
    for (int i = 0; i < 3; i++)
        if (tls_opts[i].option != MHD_OPTION_END)
            opts[no++] = tls_opts[i];
    opts[no] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    d->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, d, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, d, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)d->cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)60,
        /* Bounds the request line and headers; bodies stream through in pieces. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_ARRAY, opts,
        MHD_OPTION_END);
    if (d->mhd == NULL)
        return kgpu_error_set(
            err, KGPU_EIO, "cannot serve on %s (address in use, or bad TLS files?)", d->cfg.listen);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_BIND_PORT);
    d->port = info ? info->port : 0;
    ext_log(EXT_INFO, "kgpu-extender %s serving %s on port %d, policy %s", KGPU_VERSION,
            d->tls_cert_pem ? "HTTPS" : "HTTP", d->port, d->cfg.policy);
    return 0;
}

void ext_daemon_stop(ext_daemon *d)
{
    atomic_store(&d->stop, true);
    if (d->mhd != NULL)
        MHD_stop_daemon(d->mhd);
    d->mhd = NULL;
    ext_leader_stop(d); /* a leader hands the lease back on its way out */
    for (int i = 0; i < d->nwatch; i++)
        pthread_join(d->watch_threads[i], NULL);
    d->nwatch = 0;
    kgpu_k8s_free(d->k8s);
    d->k8s = NULL;
    ext_state_destroy(&d->state);
    free(d->tls_cert_pem);
    free(d->tls_key_pem);
    free(d->tls_ca_pem);
    d->tls_cert_pem = d->tls_key_pem = d->tls_ca_pem = NULL;
}
