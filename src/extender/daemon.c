/*
 * The kgpu-extender process: inventory from a cluster file or from the API
 * server (list + watch on two reflector threads, and DRA's two in dra.c); the HTTP(S) serving layer
 * that hands each complete, size-checked request to ext_handle is http.c.
 */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ext.h"
#include "fileio.h"
#include "yamljson.h"

/* ---- cluster file ---- */


/*
 * malloc_trim(0) for the reflectors' large transient lists, one call at a
 * time. glibc's malloc_trim initialises its arena lazily, and two threads
 * making the first call at once can walk bins not yet set up: under
 * AddressSanitizer, whose allocator leaves glibc's untouched until then, the
 * node and the DRA claim reflectors' first lists crashed the extender so.
 */
void ext_malloc_trim(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    malloc_trim(0);
    pthread_mutex_unlock(&mu);
}

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
    ext_malloc_trim();
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
    /*
     * The queue label and the priority, which GPU queues read, survive the
     * cut; so does the PodScheduled condition of an unbound pod, which says
     * kube-scheduler found no node for it (the reclaim sweep's cue).
     */
    char label[KGPU_QUEUE_NAME_MAX + 1];
    int priority;
    ext_pod_queue_fields(pod, label, sizeof(label), &priority);
    json_t *scheduled = NULL;
    size_t i;
    json_t *c;
    const char *node = json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    json_t *conds = node == NULL || node[0] == '\0'
                        ? json_object_get(json_object_get(pod, "status"), "conditions")
                        : NULL;
    json_array_foreach(conds, i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        if (type != NULL && strcmp(type, "PodScheduled") == 0) {
            scheduled = json_pack("{s:s,s:O?,s:O?}", "type", type, "status",
                                  json_object_get(c, "status"), "reason",
                                  json_object_get(c, "reason"));
            break;
        }
    }
    kgpu_pod_json_trim(pod);
    json_t *status = json_object_get(pod, "status");
    if (scheduled != NULL && json_is_object(status))
        json_object_set_new(status, "conditions", json_pack("[o]", scheduled));
    else
        json_decref(scheduled);
    json_t *meta = json_object_get(pod, "metadata");
    if (label[0] != '\0' && json_is_object(meta))
        json_object_set_new(meta, "labels", json_pack("{s:s}", KGPU_QUEUE_LABEL, label));
    json_t *spec = json_object_get(pod, "spec");
    if (priority != 0 && json_is_object(spec))
        json_object_set_new(spec, "priority", json_integer(priority));
}

/*
 * A Node's inventory as kgpu_node_from_json reads it, and whether it is
 * labelled for DRA. A DRA node's GPUs are its slice's: a kgpu.io/gpus
 * annotation on it (a device plugin that ran there before, or an empty one)
 * is not read, so it can neither fail the node nor add GPUs to it.
 */
static int node_parse(const json_t *item, kgpu_node_spec *spec, kgpu_node_store *store, bool *dra,
                      kgpu_error *err)
{
    *dra = ext_dra_node_labelled(item);
    const json_t *ann = json_object_get(json_object_get(item, "metadata"), "annotations");
    if (!*dra || json_object_get(ann, KGPU_ANN_GPUS) == NULL)
        return kgpu_node_from_json(item, spec, store, err);
    json_t *node = json_copy((json_t *)item);
    json_t *meta = node ? json_copy(json_object_get(node, "metadata")) : NULL;
    json_t *ann2 = meta ? json_copy(json_object_get(meta, "annotations")) : NULL;
    int rc;
    if (ann2 == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    } else {
        json_object_del(ann2, KGPU_ANN_GPUS);
        json_object_set_new(meta, "annotations", ann2);
        json_object_set_new(node, "metadata", meta);
        meta = NULL;
        rc = kgpu_node_from_json(node, spec, store, err);
    }
    json_decref(meta);
    json_decref(node);
    return rc;
}

static void nodes_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
    size_t n = json_array_size(items), m = 0;
    /* One store to parse into, each GPU node packed (~1 KiB instead of 6). */
    kgpu_node_spec *specs = calloc(n + 1, sizeof(*specs));
    void **packed = calloc(n + 1, sizeof(*packed));
    bool *dra = calloc(n + 1, sizeof(*dra)); /* labelled for DRA: GPUs from its slice */
    kgpu_node_store *store = malloc(sizeof(*store));
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = specs == NULL || packed == NULL || dra == NULL || store == NULL
                 ? kgpu_error_set(&err, KGPU_ENOMEM, "out of memory")
                 : 0;
    size_t ndra = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        kgpu_node_spec spec;
        json_t *item = json_array_get(items, i);
        if (node_parse(item, &spec, store, &dra[m], &err) != 0) {
            ext_log(EXT_WARN, "node inventory ignored: %s", err.msg);
            continue;
        }
        if (spec.ngpus == 0 && !dra[m])
            continue;
        if ((packed[m] = kgpu_node_spec_pack(&spec, &specs[m])) == NULL)
            rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
        else
            ndra += dra[m++];
    }
    /* DRA nodes' GPUs, borrowed from their slices while the lock is held. */
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc(ndra + 1, sizeof(*gpus));
    if (rc == 0 && gpus == NULL)
        rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    pthread_mutex_lock(&d->state.mu);
    if (rc == 0) {
        ext_dra_nodes_clear(&d->state);
        size_t k = 0, kept = 0;
        for (size_t i = 0; i < m; i++) {
            if (dra[i])
                ext_dra_node_seen(&d->state, &specs[i], true, gpus[k++]);
            if (specs[i].ngpus > 0)
                specs[kept++] = specs[i]; /* a DRA node without a slice yet waits for it */
        }
        rc = ext_state_set_nodes(&d->state, specs, (int)kept, &err);
    }
    if (rc == 0)
        d->state.nodes_synced = true;
    pthread_mutex_unlock(&d->state.mu);
    if (rc != 0)
        ext_log(EXT_ERROR, "node list not applied: %s", err.msg);
    else
        ext_log(EXT_INFO, "inventory: %zu GPU nodes (%zu of them DRA nodes)", m, ndra);
    for (size_t i = 0; i < m; i++)
        free(packed[i]);
    free(packed);
    free(specs);
    free(dra);
    free(gpus);
    free(store);
    ext_malloc_trim(); /* the list was a large transient tree */
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
        ext_dra_node_gone(&d->state, name);
        ext_state_remove_node(&d->state, name);
        pthread_mutex_unlock(&d->state.mu);
        return;
    }
    kgpu_node_spec spec;
    kgpu_node_store *store = malloc(sizeof(*store));
    if (store == NULL)
        return;
    bool dra;
    if (node_parse(obj, &spec, store, &dra, &err) != 0) {
        ext_log(EXT_WARN, "node inventory ignored: %s", err.msg);
    } else {
        kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
        pthread_mutex_lock(&d->state.mu);
        /* A DRA node's GPUs are its slice's; one that is not (any more) keeps its own. */
        ext_dra_node_seen(&d->state, &spec, dra, gpus);
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
    ext_malloc_trim();
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
        /* The configuration's queues, and namespaceQueues for the namespaces' annotations. */
        pthread_mutex_lock(&d->state.mu);
        const char *ns;
        json_t *q;
        json_object_foreach(d->cfg.namespace_queues, ns, q)
            ext_queues_set_namespace(&d->state, ns, json_string_value(q));
        if (d->cfg.queues != NULL) {
            ext_queues_set(&d->state, d->cfg.queues);
            d->cfg.queues = NULL;
            ext_log(EXT_INFO, "queues: %d from %s; pods leave with DELETE /pods/NAMESPACE/NAME",
                    kgpu_queues_count(d->state.queues), d->cfg.config_file);
        }
        pthread_mutex_unlock(&d->state.mu);
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
        if ((rc = ext_gpuqueues_start(d, err)) != 0 || (rc = ext_dra_start(d, err)) != 0)
            return rc;
        if (d->cfg.leader_elect && (rc = ext_leader_start(d, err)) != 0)
            return rc;
    }
    return ext_http_start(d, err);
}

void ext_daemon_stop(ext_daemon *d)
{
    atomic_store(&d->stop, true);
    ext_http_stop(d);
    ext_leader_stop(d); /* a leader hands the lease back on its way out */
    for (int i = 0; i < d->nwatch; i++)
        pthread_join(d->watch_threads[i], NULL);
    d->nwatch = 0;
    kgpu_k8s_free(d->k8s);
    d->k8s = NULL;
    ext_state_destroy(&d->state);
    ext_config_free(&d->cfg);
    free(d->tls_cert_pem);
    free(d->tls_key_pem);
    free(d->tls_ca_pem);
    d->tls_cert_pem = d->tls_key_pem = d->tls_ca_pem = NULL;
}
