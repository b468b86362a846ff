/*
 * The sink (sources.h) through which the sources put what they read into
 * the state: each function takes st->mu for in-memory work only, what it
 * was handed having been parsed on the source's thread before. Also the
 * GPU queue tree of cluster mode, rebuilt from the GPUQueue objects.
 *
 * GPU queues in cluster mode (docs/queues.md "Cluster mode"): the tree
 * comes from GPUQueue objects (kgpu.io/v1alpha1, cluster-scoped, the
 * queue's name being the object's), namespaces' queues from their
 * kgpu.io/queue annotation. The objects are kept cut down to what the tree
 * is made of; every change of a spec rebuilds the whole tree with the
 * file's reader (kgpu_queues_from_json), so the CRD and the file accept
 * exactly the same things. An invalid set leaves the last valid tree in force.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capacity.h"
#include "queuefile.h"
#include "state.h"

#define GPUQUEUES "/apis/kgpu.io/v1alpha1/gpuqueues"

/* ---- nodes and pods ---- */

/*
 * Records whether node `name` is leaving ("" = it stays), saying so when
 * `before` (the map as it was) did not have it so. Caller holds st->mu.
 */
static void set_leaving(ext_state *st, const kgpu_strmap *before, const char *name,
                        const char *why)
{
    const char *old = kgpu_strmap_get(before, name);
    if (why == NULL || why[0] == '\0') {
        if (old != NULL)
            ext_log(EXT_INFO, "node %s stays: GPU pods may go there again", name);
        free(kgpu_strmap_del(&st->leaving, name));
        return;
    }
    bool changed = old == NULL || strcmp(old, why) != 0;
    if (before == &st->leaving && !changed)
        return;
    char *copy = strdup(why);
    void *prev = NULL;
    if (copy == NULL || !kgpu_strmap_put(&st->leaving, name, copy, &prev)) {
        free(copy); /* out of memory: the node is treated as staying */
        return;
    }
    free(prev); /* `old` too, when before is st->leaving */
    if (changed)
        ext_log(EXT_INFO, "node %s is leaving (%s): no new GPU pod goes there", name, why);
}

static int nodes_listed(void *ctx, kgpu_node_spec *specs, const bool *dra,
                        const char (*leaving)[EXT_LEAVING_MAX], const bool *spot, size_t m,
                        kgpu_error *err)
{
    ext_state *st = ctx;
    size_t ndra = 0;
    for (size_t i = 0; i < m; i++)
        ndra += dra[i];
    /* DRA nodes' GPUs, borrowed from their slices while the lock is held. */
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc(ndra + 1, sizeof(*gpus));
    if (gpus == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    pthread_mutex_lock(&st->mu);
    ext_dra_nodes_clear(st);
    kgpu_strmap before = st->leaving; /* the list replaces it: nodes not in it go */
    kgpu_strmap_init(&st->leaving);
    kgpu_strmap_clear(&st->spot_nodes); /* its values are markers, not owned */
    kgpu_strmap_clear(&st->guard_marked); /* the source marks the list's nodes again */
    kgpu_strmap_init(&st->guard_marked);
    size_t k = 0, kept = 0;
    for (size_t i = 0; i < m; i++) {
        set_leaving(st, &before, specs[i].name, leaving[i]);
        ext_state_node_spot(st, specs[i].name, spot[i]);
        if (dra[i])
            ext_dra_node_seen(st, &specs[i], true, gpus[k++]);
        if (specs[i].ngpus > 0)
            specs[kept++] = specs[i]; /* a DRA node without a slice yet waits for it */
    }
    int rc = ext_state_set_nodes(st, specs, (int)kept, err);
    if (rc == 0)
        st->nodes_synced = true;
    pthread_mutex_unlock(&st->mu);
    kgpu_strmap_clear_free(&before);
    free(gpus);
    return rc;
}

static int node_seen(void *ctx, kgpu_node_spec *spec, bool dra, const char *leaving, bool spot,
                     kgpu_error *err)
{
    ext_state *st = ctx;
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    pthread_mutex_lock(&st->mu);
    ext_state_node_spot(st, spec->name, spot);
    /* Only GPU nodes count: a node kgpu does not track has nothing to refuse. */
    set_leaving(st, &st->leaving, spec->name, spec->ngpus > 0 || dra ? leaving : "");
    /* A DRA node's GPUs are its slice's; one that is not (any more) keeps its own. */
    ext_dra_node_seen(st, spec, dra, gpus);
    int rc = ext_state_upsert_node(st, spec, err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void node_gone(void *ctx, const char *name)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_dra_node_gone(st, name);
    free(kgpu_strmap_del(&st->leaving, name));
    ext_state_node_spot(st, name, false);
    kgpu_strmap_del(&st->guard_marked, name);
    ext_state_remove_node(st, name);
    pthread_mutex_unlock(&st->mu);
}

static void node_marked(void *ctx, const char *name, int marks)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    if (marks == 0)
        kgpu_strmap_del(&st->guard_marked, name);
    else if (kgpu_strmap_get(&st->guard_marked, name) != NULL ||
             st->guard_marked.len < EXT_GUARD_NODES_MAX)
        kgpu_strmap_put(&st->guard_marked, name, (void *)(intptr_t)marks, NULL);
    pthread_mutex_unlock(&st->mu);
}

static bool nodes_known(void *ctx)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    bool known = st->nodes_synced;
    pthread_mutex_unlock(&st->mu);
    return known;
}

static int file_nodes(void *ctx, const kgpu_node_spec *specs, int n, kgpu_error *err)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    kgpu_strmap_clear(&st->spot_nodes);
    for (int i = 0; i < n; i++) {
        /* The file's labels as the API server's would be: the same table decides. */
        json_t *labels = json_object();
        for (int l = 0; labels != NULL && l < specs[i].nlabels; l++)
            json_object_set_new(labels, specs[i].labels[l].key,
                                json_string(specs[i].labels[l].value));
        ext_state_node_spot(st, specs[i].name, kgpu_capacity_spot(labels));
        json_decref(labels);
    }
    int rc = ext_state_set_nodes(st, specs, n, err);
    st->nodes_synced = st->pods_synced = rc == 0;
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void pods_listed(void *ctx, json_t *items, char ***suspects, size_t *nsuspects)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_queues_pod_labels_reset(st, items); /* for the DRA claims reserved for them */
    ext_state_pods_reset(st, items, suspects, nsuspects);
    st->pods_synced = true;
    pthread_mutex_unlock(&st->mu);
}

static long pods_held(void *ctx)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    long held = (long)st->pods.len;
    pthread_mutex_unlock(&st->mu);
    return held;
}

static void pod_seen(void *ctx, const json_t *pod)
{
    ext_state *st = ctx;
    char label[KGPU_QUEUE_NAME_MAX + 1];
    int priority;
    ext_pod_queue_fields(pod, label, sizeof(label), &priority);
    const char *uid = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
    pthread_mutex_lock(&st->mu);
    if (uid != NULL)
        ext_queues_pod_label(st, uid, label); /* for the DRA claims reserved for it */
    ext_state_pod_seen(st, pod);
    pthread_mutex_unlock(&st->mu);
}

static void pod_gone(void *ctx, const char *uid)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_queues_pod_label_gone(st, uid);
    ext_state_pod_gone(st, uid);
    pthread_mutex_unlock(&st->mu);
}

static void pods_relisting(void *ctx)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    st->relist_started = ext_now(); /* pods bound from now on may miss the coming list */
    pthread_mutex_unlock(&st->mu);
}

/* ---- ResourceSlices and ResourceClaims ---- */

/* The resource is served (again): said when it was absent. */
static void served(ext_state *st, enum ext_dra_kind which)
{
    if (st->dra_absent[which])
        ext_log(EXT_INFO, "DRA: resource.k8s.io/v1 %s are served now",
                which == EXT_DRA_SLICES ? "ResourceSlices" : "ResourceClaims");
    st->dra_absent[which] = false;
}

static void slices_listed(void *ctx, const ext_dra_slice *s, int n)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    served(st, EXT_DRA_SLICES);
    ext_dra_slices_reset(st, s, n);
    pthread_mutex_unlock(&st->mu);
}

static void slice_seen(void *ctx, const ext_dra_slice *s)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_dra_slice_put(st, s);
    pthread_mutex_unlock(&st->mu);
}

static void slice_gone(void *ctx, const char *name, const char *node)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_dra_slice_gone(st, name, node);
    pthread_mutex_unlock(&st->mu);
}

static int claims_listed(void *ctx, ext_dra_claim **c, int n)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    served(st, EXT_DRA_CLAIMS);
    ext_dra_claims_reset(st, c, n);
    int waiting = st->dra_unapplied;
    pthread_mutex_unlock(&st->mu);
    return waiting;
}

static void claim_seen(void *ctx, ext_dra_claim *c)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_dra_claim_put(st, c);
    pthread_mutex_unlock(&st->mu);
}

static void claim_gone(void *ctx, const char *ns, const char *name)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    ext_dra_claim_gone(st, ns, name);
    pthread_mutex_unlock(&st->mu);
}

/*
 * 404 for resource.k8s.io/v1 means a server without DRA (older than 1.34,
 * or the API group off): DRA support is off, said once; the reflector's
 * relist at its backoff (up to 30 s) is the check for it coming back.
 */
static void dra_restart(void *ctx, enum ext_dra_kind which, const char *why)
{
    static const char *const what[] = {"ResourceSlice", "ResourceClaim"};
    static const char *const path[] = {"/apis/resource.k8s.io/v1/resourceslices",
                                       "/apis/resource.k8s.io/v1/resourceclaims"};
    ext_state *st = ctx;
    bool absent = strstr(why, "HTTP 404") != NULL;
    pthread_mutex_lock(&st->mu);
    if (absent && !st->dra_absent[which]) {
        ext_log(EXT_WARN,
                "DRA: the API server has no %s resource (%s is 404: no resource.k8s.io/v1); "
                "DRA support is off until it has (checked again at most every 30 s)",
                what[which], path[which]);
        if (which == EXT_DRA_SLICES && st->dra_slices.len > 0)
            ext_dra_slices_reset(st, NULL, 0);
        if (which == EXT_DRA_CLAIMS && st->dra_claims.len > 0)
            ext_dra_claims_reset(st, NULL, 0);
    } else if (!absent) {
        ext_log(EXT_WARN, "%s watch restarts: %s", what[which], why);
    }
    st->dra_absent[which] = st->dra_absent[which] || absent;
    pthread_mutex_unlock(&st->mu);
}

/* ---- GPUQueue objects ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * Builds the tree from st->gpuqueues and puts it in force, or keeps the
 * last valid one and says why in st->queues_error. No objects: queues off.
 * Caller holds st->mu.
 */
static void rebuild(ext_state *st)
{
    size_t n = json_object_size(st->gpuqueues), k = 0;
    if (n == 0) {
        if (st->queues_spec != NULL)
            ext_log(EXT_INFO, "queues: no GPUQueue objects: every pod is in queue default");
        st->queues_error[0] = '\0';
        ext_queues_set(st, NULL);
        return;
    }
    /* By name, so that the same objects always give the same tree and the same errors. */
    const char **names = calloc(n, sizeof(*names));
    json_t *list = json_array();
    const char *key;
    json_t *obj;
    json_object_foreach(st->gpuqueues, key, obj)
    {
        if (names != NULL && k < n)
            names[k++] = key;
    }
    if (names != NULL)
        qsort(names, k, sizeof(*names), cmp_str);
    for (size_t i = 0; names != NULL && list != NULL && i < k; i++) {
        json_t *spec = json_object_get(json_object_get(st->gpuqueues, names[i]), "spec");
        json_t *entry = json_is_object(spec) ? json_deep_copy(spec) : json_object();
        json_object_set_new(entry, "name", json_string(names[i]));
        json_array_append_new(list, entry);
    }
    json_t *doc = json_pack("{s:o}", "queues", list);
    free(names);
    kgpu_queues *tree = NULL;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = doc != NULL ? kgpu_queues_from_json(doc, "GPUQueue objects", &tree, &err)
                         : kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    json_decref(doc);
    if (rc != 0) {
        if (strcmp(st->queues_error, err.msg) != 0)
            ext_log(EXT_WARN, "queues: %s; the last valid set of queues (%d) stays in force",
                    err.msg, st->queues != NULL ? kgpu_queues_count(st->queues) : 0);
        snprintf(st->queues_error, sizeof(st->queues_error), "%s", err.msg);
        return;
    }
    if (st->queues_error[0] != '\0')
        ext_log(EXT_INFO, "queues: the GPUQueue objects are valid again");
    st->queues_error[0] = '\0';
    ext_log(EXT_INFO, "queues: %zu GPUQueue objects in force (%d queues with default)", k,
            kgpu_queues_count(tree));
    ext_queues_set(st, tree);
}

/* Takes one object in (or out: obj NULL); true when the tree must be rebuilt. */
static bool gpuqueue_put(ext_state *st, const char *name, json_t *obj)
{
    json_t *old = json_object_get(st->gpuqueues, name);
    if (obj == NULL) {
        json_object_del(st->gpuqueues, name);
        return old != NULL;
    }
    /* Status patches (our own) come back as MODIFIED: only a new spec changes the tree. */
    bool same =
        old != NULL && json_equal(json_object_get(old, "spec"), json_object_get(obj, "spec"));
    json_object_set(st->gpuqueues, name, obj);
    return !same;
}

/* The GPUQueue objects kept (by name), made on first use. */
static bool gpuqueues_kept(ext_state *st)
{
    if (st->gpuqueues == NULL)
        st->gpuqueues = json_object();
    return st->gpuqueues != NULL;
}

static void gpuqueues_listed(void *ctx, json_t *items)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    if (st->gpuqueue_crd_absent)
        ext_log(EXT_INFO, "queues: the GPUQueue resource is served now");
    st->gpuqueue_crd_absent = false;
    if (gpuqueues_kept(st)) {
        json_object_clear(st->gpuqueues);
        size_t i;
        json_t *obj;
        json_array_foreach(items, i, obj)
        {
            const char *name = ext_obj_name(obj);
            if (name != NULL)
                json_object_set(st->gpuqueues, name, obj);
        }
        rebuild(st);
    }
    pthread_mutex_unlock(&st->mu);
}

static void gpuqueue_seen(void *ctx, const char *name, json_t *obj)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    if (gpuqueues_kept(st) && gpuqueue_put(st, name, obj))
        rebuild(st);
    pthread_mutex_unlock(&st->mu);
}

/*
 * The reflector relists after every failure, backing off to 30 s: while
 * the CRD is not installed (404) that is the periodic check. Queues are
 * off meanwhile, said once.
 */
static void gpuqueues_restart(void *ctx, const char *why)
{
    ext_state *st = ctx;
    bool absent = strstr(why, "HTTP 404") != NULL;
    pthread_mutex_lock(&st->mu);
    if (absent && !st->gpuqueue_crd_absent) {
        ext_log(EXT_WARN,
                "queues: the API server has no GPUQueue resource (%s is 404: the CRD "
                "gpuqueues.kgpu.io is not installed); queues are off, every pod is in queue "
                "default, until it is (checked again at most every 30 s)",
                GPUQUEUES);
        if (gpuqueues_kept(st)) {
            json_object_clear(st->gpuqueues);
            rebuild(st);
        }
    } else if (!absent) {
        ext_log(EXT_WARN, "GPUQueue watch restarts: %s", why);
    }
    st->gpuqueue_crd_absent = st->gpuqueue_crd_absent || absent;
    pthread_mutex_unlock(&st->mu);
}

/* ---- namespaces ---- */

static void namespaces_listed(void *ctx, json_t *items)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    kgpu_strmap_clear_free(&st->ns_queue);
    size_t i;
    json_t *ns;
    json_array_foreach(items, i, ns)
    {
        const char *name = ext_obj_name(ns);
        if (name != NULL)
            ext_queues_set_namespace(st, name, ext_namespace_queue(ns), ext_namespace_labels(ns));
    }
    if (st->queues_spec != NULL)
        ext_queues_recharge(st); /* pods counted before the namespaces were known */
    pthread_mutex_unlock(&st->mu);
}

static void namespace_seen(void *ctx, const char *name, const json_t *ns)
{
    ext_state *st = ctx;
    pthread_mutex_lock(&st->mu);
    bool changed = ext_queues_set_namespace(st, name, ext_namespace_queue(ns),
                                            ext_namespace_labels(ns));
    if (changed && st->queues_spec != NULL)
        ext_queues_recharge(st); /* its pods move to the queue it names, or may use, now */
    pthread_mutex_unlock(&st->mu);
}

/* ---- the sink ---- */

void ext_state_sink(ext_state *st, ext_sink *out)
{
    *out = (ext_sink){
        .ctx = st,
        .nodes_listed = nodes_listed,
        .node_seen = node_seen,
        .node_gone = node_gone,
        .node_marked = node_marked,
        .nodes_known = nodes_known,
        .file_nodes = file_nodes,
        .pods_listed = pods_listed,
        .pods_held = pods_held,
        .pod_seen = pod_seen,
        .pod_gone = pod_gone,
        .pods_relisting = pods_relisting,
        .slices_listed = slices_listed,
        .slice_seen = slice_seen,
        .slice_gone = slice_gone,
        .claims_listed = claims_listed,
        .claim_seen = claim_seen,
        .claim_gone = claim_gone,
        .dra_restart = dra_restart,
        .gpuqueues_listed = gpuqueues_listed,
        .gpuqueue_seen = gpuqueue_seen,
        .gpuqueues_restart = gpuqueues_restart,
        .namespaces_listed = namespaces_listed,
        .namespace_seen = namespace_seen,
    };
}

bool ext_state_synced(ext_state *st)
{
    pthread_mutex_lock(&st->mu);
    bool synced = st->nodes_synced && st->pods_synced;
    pthread_mutex_unlock(&st->mu);
    return synced;
}
