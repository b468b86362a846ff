/*
 * The reflectors of cluster mode: nodes, pods, GPUQueues, namespaces,
 * ResourceSlices of gpu.kgpu.io and ResourceClaims, each listed and watched
 * on its own thread (src/k8s reflector.c). Each parses what it reads
 * outside any lock and hands the result to its sink (sources.h); the state
 * behind the sink is never touched here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capacity.h"
#include "nodegroups.h"
#include "sources.h"

#define SLICES    "/apis/resource.k8s.io/v1/resourceslices"
#define CLAIMS    "/apis/resource.k8s.io/v1/resourceclaims"
#define GPUQUEUES "/apis/kgpu.io/v1alpha1/gpuqueues"

/* ---- nodes ---- */

/* A node's metadata.labels (NULL: none), for its capacity type. */
static const json_t *node_labels(const json_t *node)
{
    return json_object_get(json_object_get(node, "metadata"), "labels");
}

#define KEPT_LABELS 8

/*
 * The node's labels that node groups name, into out (room for KEPT_LABELS;
 * strings borrowed from item); their count.
 */
static int kept_labels(const ext_sources *s, const json_t *item, kgpu_label *out)
{
    const json_t *labels = node_labels(item);
    int n = 0;
    for (int g = 0; s->groups != NULL && g < s->groups->n; g++)
        for (int k = 0; k < s->groups->v[g].nlabels && n < KEPT_LABELS; k++) {
            const char *key = s->groups->v[g].label_key[k];
            const char *v = json_string_value(json_object_get(labels, key));
            bool dup = false;
            for (int i = 0; i < n && !dup; i++)
                dup = strcmp(out[i].key, key) == 0;
            if (v != NULL && !dup)
                out[n++] = (kgpu_label){(char *)key, (char *)v};
        }
    return n;
}

static void nodes_reset(void *ctx, json_t *items)
{
    ext_sources *s = ctx;
    size_t n = json_array_size(items), m = 0;
    /* One store to parse into, each GPU node packed (~1 KiB instead of 6). */
    kgpu_node_spec *specs = calloc(n + 1, sizeof(*specs));
    void **packed = calloc(n + 1, sizeof(*packed));
    bool *dra = calloc(n + 1, sizeof(*dra)); /* labelled for DRA: GPUs from its slice */
    char(*leaving)[EXT_LEAVING_MAX] = calloc(n + 1, sizeof(*leaving));
    bool *spot = calloc(n + 1, sizeof(*spot));
    kgpu_label(*kept)[KEPT_LABELS] = calloc(n + 1, sizeof(*kept)); /* borrowed by specs */
    int *marked = calloc(n + 1, sizeof(*marked)); /* scale-down annotations on it */
    const char **names = calloc(n + 1, sizeof(*names)); /* nodes_listed reorders specs */
    kgpu_node_store *store = malloc(sizeof(*store));
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = specs == NULL || packed == NULL || dra == NULL || leaving == NULL || spot == NULL ||
                     kept == NULL ||
                     marked == NULL || names == NULL || store == NULL
                 ? kgpu_error_set(&err, KGPU_ENOMEM, "out of memory")
                 : 0;
    size_t ndra = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        kgpu_node_spec spec;
        json_t *item = json_array_get(items, i);
        if (ext_node_parse(item, &spec, store, &dra[m], &err) != 0) {
            ext_log(EXT_WARN, "node inventory ignored: %s", err.msg);
            continue;
        }
        if (spec.ngpus == 0 && !dra[m])
            continue;
        ext_node_leaving(item, leaving[m], sizeof(leaving[m]));
        spot[m] = kgpu_capacity_spot(node_labels(item));
        spec.nlabels = kept_labels(s, item, kept[m]);
        spec.labels = kept[m];
        marked[m] = ext_node_guard_marks(item);
        if ((packed[m] = kgpu_node_spec_pack(&spec, &specs[m])) == NULL) {
            rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
        } else {
            names[m] = specs[m].name; /* in packed[m] */
            ndra += dra[m++];
        }
    }
    if (rc == 0)
        rc = s->sink->nodes_listed(s->sink->ctx, specs, dra,
                                   (const char(*)[EXT_LEAVING_MAX])leaving, spot, m, &err);
    for (size_t i = 0; i < m && rc == 0; i++)
        if (marked[i])
            s->sink->node_marked(s->sink->ctx, names[i], marked[i]);
    if (rc != 0)
        ext_log(EXT_ERROR, "node list not applied: %s", err.msg);
    else
        ext_log(EXT_INFO, "inventory: %zu GPU nodes (%zu of them DRA nodes)", m, ndra);
    for (size_t i = 0; i < m; i++)
        free(packed[i]);
    free(packed);
    free(specs);
    free(dra);
    free(leaving);
    free(spot);
    free(kept);
    free(marked);
    free(names);
    free(store);
    ext_malloc_trim(); /* the list was a large transient tree */
}

static void nodes_event(void *ctx, const char *type, json_t *obj)
{
    ext_sources *s = ctx;
    kgpu_error err;
    if (strcmp(type, "DELETED") == 0) {
        const char *name = ext_obj_name(obj);
        if (name != NULL)
            s->sink->node_gone(s->sink->ctx, name);
        return;
    }
    kgpu_node_spec spec;
    kgpu_node_store *store = malloc(sizeof(*store));
    if (store == NULL)
        return;
    bool dra;
    char leaving[EXT_LEAVING_MAX];
    ext_node_leaving(obj, leaving, sizeof(leaving));
    kgpu_label kept[KEPT_LABELS];
    if (ext_node_parse(obj, &spec, store, &dra, &err) != 0) {
        ext_log(EXT_WARN, "node inventory ignored: %s", err.msg);
        free(store);
        return;
    }
    spec.nlabels = kept_labels(s, obj, kept);
    spec.labels = kept;
    if (s->sink->node_seen(s->sink->ctx, &spec, dra, leaving,
                           kgpu_capacity_spot(node_labels(obj)), &err) != 0)
        ext_log(EXT_ERROR, "node %s not updated: %s", spec.name, err.msg);
    else
        s->sink->node_marked(s->sink->ctx, spec.name, ext_node_guard_marks(obj));
    free(store);
}

static void nodes_restart(void *ctx, const char *why)
{
    ext_sources *s = ctx;
    atomic_fetch_add(&s->metrics->watch_restarts[0], 1);
    ext_log(EXT_WARN, "node watch restarts: %s", why);
}

static void *watch_nodes(void *arg)
{
    ext_sources *s = arg;
    static const kgpu_reflector_ops ops = {nodes_reset, nodes_event, nodes_restart,
                                           ext_node_trim};
    kgpu_reflector_run(s->k8s, "/api/v1/nodes", NULL, &ops, s, s->stop);
    return NULL;
}

/* ---- pods ---- */

/* Is the pod ns/name/uid gone from the API server (deleted, replaced, or finished)? */
static bool pod_gone(kgpu_k8s *k8s, const char *triple)
{
    char ns[128], name[KGPU_NAME_MAX + 1], uid[128];
    if (sscanf(triple, "%127[^/]/%254[^/]/%127s", ns, name, uid) != 3)
        return false;
    kgpu_error err;
    long status;
    json_t *pod = kgpu_k8s_get_pod(k8s, ns, name, &status, &err);
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
    ext_sources *s = ctx;
    char **suspects;
    size_t nsuspects;
    s->sink->pods_listed(s->sink->ctx, items, &suspects, &nsuspects);
    /* Pods the list did not show but that were bound while it was made: ask one by one. */
    for (size_t i = 0; i < nsuspects; i++) {
        if (pod_gone(s->k8s, suspects[i]))
            s->sink->pod_gone(s->sink->ctx, strrchr(suspects[i], '/') + 1);
        free(suspects[i]);
    }
    free(suspects);
    ext_log(EXT_INFO, "pods: %zu listed, %ld hold GPUs", json_array_size(items),
            s->sink->pods_held(s->sink->ctx));
    ext_malloc_trim();
}

static void pods_event(void *ctx, const char *type, json_t *obj)
{
    ext_sources *s = ctx;
    if (strcmp(type, "DELETED") == 0) {
        const char *uid =
            json_string_value(json_object_get(json_object_get(obj, "metadata"), "uid"));
        if (uid != NULL)
            s->sink->pod_gone(s->sink->ctx, uid);
    } else {
        s->sink->pod_seen(s->sink->ctx, obj);
    }
}

static void pods_restart(void *ctx, const char *why)
{
    ext_sources *s = ctx;
    s->sink->pods_relisting(s->sink->ctx);
    atomic_fetch_add(&s->metrics->watch_restarts[1], 1);
    ext_log(EXT_WARN, "pod watch restarts: %s", why);
}

static void *watch_pods(void *arg)
{
    ext_sources *s = arg;
    /* Pods name their nodes: know the nodes first. */
    while (!s->sink->nodes_known(s->sink->ctx) && !atomic_load(s->stop))
        usleep(50 * 1000);
    static const kgpu_reflector_ops ops = {pods_reset, pods_event, pods_restart, ext_pod_trim};
    kgpu_reflector_run(s->k8s, "/api/v1/pods",
                       "fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed", &ops,
                       s, s->stop);
    return NULL;
}

/* ---- GPUQueues and namespaces ---- */

static void gpuqueues_reset(void *ctx, json_t *items)
{
    ext_sources *s = ctx;
    s->sink->gpuqueues_listed(s->sink->ctx, items);
}

static void gpuqueues_event(void *ctx, const char *type, json_t *obj)
{
    ext_sources *s = ctx;
    const char *name = ext_obj_name(obj);
    if (name == NULL)
        return;
    ext_gpuqueue_trim(NULL, obj);
    s->sink->gpuqueue_seen(s->sink->ctx, name, strcmp(type, "DELETED") == 0 ? NULL : obj);
}

static void gpuqueues_restart(void *ctx, const char *why)
{
    ext_sources *s = ctx;
    s->sink->gpuqueues_restart(s->sink->ctx, why);
}

static void *watch_gpuqueues(void *arg)
{
    ext_sources *s = arg;
    static const kgpu_reflector_ops ops = {gpuqueues_reset, gpuqueues_event, gpuqueues_restart,
                                           ext_gpuqueue_trim};
    kgpu_reflector_run(s->k8s, GPUQUEUES, NULL, &ops, s, s->stop);
    return NULL;
}

static void namespaces_reset(void *ctx, json_t *items)
{
    ext_sources *s = ctx;
    s->sink->namespaces_listed(s->sink->ctx, items);
}

static void namespaces_event(void *ctx, const char *type, json_t *ns)
{
    ext_sources *s = ctx;
    const char *name = ext_obj_name(ns);
    if (name == NULL)
        return;
    s->sink->namespace_seen(s->sink->ctx, name, strcmp(type, "DELETED") == 0 ? NULL : ns);
}

static void *watch_namespaces(void *arg)
{
    ext_sources *s = arg;
    static const kgpu_reflector_ops ops = {namespaces_reset, namespaces_event, NULL,
                                           ext_namespace_trim};
    kgpu_reflector_run(s->k8s, "/api/v1/namespaces", NULL, &ops, s, s->stop);
    return NULL;
}

/* ---- ResourceSlices and ResourceClaims ---- */

static void slices_reset(void *ctx, json_t *items)
{
    ext_sources *src = ctx;
    size_t n = json_array_size(items), m = 0;
    ext_dra_slice *s = calloc(n + 1, sizeof(*s));
    if (s == NULL) {
        ext_log(EXT_ERROR, "ResourceSlice list not applied: out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        kgpu_error err;
        kgpu_error_clear(&err);
        json_t *obj = json_array_get(items, i);
        if (json_object_size(obj) == 0)
            continue; /* another driver's, trimmed */
        int rc = ext_dra_slice_parse(obj, &s[m], &err);
        if (rc == 0)
            m++;
        else if (rc != KGPU_ENOENT)
            ext_log(EXT_WARN, "%s; ignored", err.msg);
    }
    src->sink->slices_listed(src->sink->ctx, s, (int)m);
    ext_log(EXT_INFO, "DRA: %zu ResourceSlices of %s", m, EXT_DRA_DRIVER);
    free(s);
}

static void slices_event(void *ctx, const char *type, json_t *obj)
{
    ext_sources *src = ctx;
    ext_dra_slice *s = malloc(sizeof(*s));
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = s != NULL ? ext_dra_slice_parse(obj, s, &err) : KGPU_ENOMEM;
    if (rc == 0) {
        if (strcmp(type, "DELETED") == 0)
            src->sink->slice_gone(src->sink->ctx, s->name, s->node);
        else
            src->sink->slice_seen(src->sink->ctx, s);
    } else if (rc != KGPU_ENOENT) {
        ext_log(EXT_WARN, "%s; ignored", rc == KGPU_ENOMEM ? "out of memory" : err.msg);
    }
    free(s);
}

static void slices_restart(void *ctx, const char *why)
{
    ext_sources *s = ctx;
    s->sink->dra_restart(s->sink->ctx, EXT_DRA_SLICES, why);
}

static void claims_reset(void *ctx, json_t *items)
{
    ext_sources *s = ctx;
    size_t n = json_array_size(items), m = 0;
    ext_dra_claim **c = calloc(n + 1, sizeof(*c));
    if (c == NULL) {
        ext_log(EXT_ERROR, "ResourceClaim list not applied: out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        kgpu_error err;
        kgpu_error_clear(&err);
        json_t *obj = json_array_get(items, i);
        if (json_object_size(obj) == 0)
            continue; /* not ours, trimmed */
        if (ext_dra_claim_parse(obj, &c[m], &err) != 0)
            ext_log(EXT_WARN, "%s; ignored", err.msg);
        else if (c[m] != NULL)
            m++;
    }
    int waiting = s->sink->claims_listed(s->sink->ctx, c, (int)m);
    ext_log(EXT_INFO, "DRA: %zu ResourceClaims of %s (%zu listed); %d devices not counted now", m,
            EXT_DRA_CLASS, n, waiting);
    free(c);
    ext_malloc_trim();
}

static void claims_event(void *ctx, const char *type, json_t *obj)
{
    ext_sources *s = ctx;
    const json_t *meta = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    const char *name = json_string_value(json_object_get(meta, "name"));
    if (ns == NULL || name == NULL)
        return;
    ext_dra_claim *c = NULL;
    kgpu_error err;
    kgpu_error_clear(&err);
    if (strcmp(type, "DELETED") != 0 && ext_dra_claim_parse(obj, &c, &err) != 0) {
        ext_log(EXT_WARN, "%s; ignored", err.msg);
        return;
    }
    if (c != NULL)
        s->sink->claim_seen(s->sink->ctx, c);
    else /* deleted, or no longer ours */
        s->sink->claim_gone(s->sink->ctx, ns, name);
}

static void claims_restart(void *ctx, const char *why)
{
    ext_sources *s = ctx;
    s->sink->dra_restart(s->sink->ctx, EXT_DRA_CLAIMS, why);
}

static void *watch_slices(void *arg)
{
    ext_sources *s = arg;
    static const kgpu_reflector_ops ops = {slices_reset, slices_event, slices_restart,
                                           ext_dra_slice_trim};
    /* spec.driver is a field selector of ResourceSlices; the parser checks it again. */
    kgpu_reflector_run(s->k8s, SLICES, "fieldSelector=spec.driver%3D" EXT_DRA_DRIVER, &ops, s,
                       s->stop);
    return NULL;
}

static void *watch_claims(void *arg)
{
    ext_sources *s = arg;
    static const kgpu_reflector_ops ops = {claims_reset, claims_event, claims_restart,
                                           ext_dra_claim_trim};
    kgpu_reflector_run(s->k8s, CLAIMS, NULL, &ops, s, s->stop);
    return NULL;
}

int ext_sources_start(ext_sources *s, pthread_t *threads, int *n, kgpu_error *err)
{
    void *(*const run[EXT_SOURCES_THREADS])(void *) = {
        watch_nodes, watch_pods, watch_gpuqueues, watch_namespaces, watch_slices, watch_claims};
    for (int i = 0; i < EXT_SOURCES_THREADS; i++) {
        if (pthread_create(&threads[*n], NULL, run[i], s) != 0)
            return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the watch threads");
        (*n)++;
    }
    return 0;
}
