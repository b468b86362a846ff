/*
 * The Kubernetes objects the extender reads, as it reads them: a pod's asks
 * for device-plugin resources, its queue label and priority; a node's GPU
 * inventory; a GPUQueue and a namespace cut to what queues need. Pure: no
 * state, no lock, no I/O. The trims cut a listed object as its page
 * arrives, so that what the extender keeps of a 20,000-pod list until its
 * reset fits its memory limit.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sources.h"

/* ---- pods ---- */

static const char *const res_names[] = {KGPU_RES_WHOLE, KGPU_RES_MEM, KGPU_RES_CORE};

const char *ext_res_name(int res)
{
    return res >= 0 && res < (int)(sizeof(res_names) / sizeof(res_names[0])) ? res_names[res] : "?";
}

/* ---- asks ---- */

/* A count resource of a container: limits first, then requests, as podspec.c reads them. */
static int64_t count_of(const json_t *limits, const json_t *requests, const char *key)
{
    const json_t *v = json_object_get(limits, key);
    if (v == NULL || json_is_null(v))
        v = json_object_get(requests, key);
    if (json_is_integer(v))
        return json_integer_value(v) > 0 ? json_integer_value(v) : 0;
    int64_t milli;
    if (!json_is_string(v) || kgpu_quantity_milli(json_string_value(v), &milli, NULL) != 0 ||
        milli <= 0 || milli % KGPU_MILLI != 0)
        return 0;
    return milli / KGPU_MILLI;
}

static int cmp_ask(const ext_ask *x, const ext_ask *y)
{
    if (x->res != y->res)
        return x->res < y->res ? -1 : 1;
    return x->amount < y->amount ? -1 : x->amount > y->amount ? 1 : 0;
}

/* Inserts in order, once. */
static void add_ask(ext_asks *s, int res, int64_t amount)
{
    if (amount <= 0)
        return;
    ext_ask a = {res, amount};
    int i = 0;
    while (i < s->n && cmp_ask(&s->a[i], &a) < 0)
        i++;
    if (i < s->n && cmp_ask(&s->a[i], &a) == 0)
        return;
    if (s->n == EXT_ASKS_MAX) {
        s->overflow = true;
        return;
    }
    memmove(&s->a[i + 1], &s->a[i], (size_t)(s->n - i) * sizeof(s->a[0]));
    s->a[i] = a;
    s->n++;
}

static void add_list(ext_asks *s, const json_t *list)
{
    size_t i;
    const json_t *c;
    json_array_foreach(list, i, c)
    {
        const json_t *res = json_object_get(c, "resources");
        const json_t *limits = json_object_get(res, "limits");
        const json_t *requests = json_object_get(res, "requests");
        int64_t mem = count_of(limits, requests, KGPU_RES_MEM);
        if (mem == 0)
            mem = count_of(limits, requests, KGPU_RES_MEM_ALIAS);
        add_ask(s, EXT_RES_WHOLE, count_of(limits, requests, KGPU_RES_WHOLE));
        add_ask(s, EXT_RES_MEM, mem);
        add_ask(s, EXT_RES_CORE, count_of(limits, requests, KGPU_RES_CORE));
    }
}

void ext_asks_from_json(const json_t *pod, ext_asks *out)
{
    memset(out, 0, sizeof(*out));
    const json_t *spec = json_object_get(pod, "spec");
    /* kubelet allocates init containers' devices too, before the app containers'. */
    add_list(out, json_object_get(spec, "initContainers"));
    add_list(out, json_object_get(spec, "containers"));
}

bool ext_asks_clash(const ext_asks *x, const ext_asks *y, ext_ask *same)
{
    if ((x->overflow && (y->n > 0 || y->overflow)) || (y->overflow && x->n > 0)) {
        if (same != NULL)
            *same = x->overflow && y->n > 0 ? y->a[0] : x->a[0];
        return true;
    }
    int i = 0, j = 0;
    while (i < x->n && j < y->n) {
        int c = cmp_ask(&x->a[i], &y->a[j]);
        if (c == 0) {
            if (same != NULL)
                *same = x->a[i];
            return true;
        }
        if (c < 0)
            i++;
        else
            j++;
    }
    return false;
}

void ext_pod_queue_fields(const json_t *pod, char *label, size_t len, int *priority)
{
    const json_t *labels = json_object_get(json_object_get(pod, "metadata"), "labels");
    const char *l = json_string_value(json_object_get(labels, KGPU_QUEUE_LABEL));
    snprintf(label, len, "%s", l != NULL && strlen(l) <= KGPU_QUEUE_NAME_MAX ? l : "");
    const json_t *pr = json_object_get(json_object_get(pod, "spec"), "priority");
    json_int_t v = json_is_integer(pr) ? json_integer_value(pr) : 0;
    /* Kubernetes priorities are int32: anything else is not from the API server. */
    *priority = v < -2147483647 ? -2147483647 : v > 2147483647 ? 2147483647 : (int)v;
}

void ext_fit_requests(const kgpu_pod *pod, kgpu_request *tmp, const kgpu_request **out)
{
    for (int i = 0; i < pod->nparts; i++) {
        tmp[i] = pod->parts[i].req;
        tmp[i].cpu_milli = 0;
        tmp[i].memory_mib = 0;
        out[i] = &tmp[i];
    }
}

void ext_pod_copy(kgpu_pod *dst, const kgpu_pod *src)
{
    *dst = *src;
    for (int i = 0; i < KGPU_MAX_GLOBS; i++) {
        dst->allow[i] = dst->allow_buf[i];
        dst->exclude[i] = dst->exclude_buf[i];
    }
    for (int i = 0; i < dst->nparts; i++) {
        dst->parts[i].req.allow = dst->allow;
        dst->parts[i].req.exclude = dst->exclude;
    }
}

/* ---- nodes ---- */

/*
 * Listed objects are cut down as their page arrives, so that what the extender
 * keeps of a 20,000-pod list until its reset fits its memory limit: a pod to
 * what kgpu_pod_from_json and the state read (kgpu_pod_json_trim); a node
 * loses managedFields, kubectl's copy of the whole object and every status
 * member but allocatable and capacity (status.images is most of a node).
 */
void ext_node_trim(void *ctx, json_t *node)
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

void ext_pod_trim(void *ctx, json_t *pod)
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
int ext_node_parse(const json_t *item, kgpu_node_spec *spec, kgpu_node_store *store, bool *dra,
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

/*
 * Taints put on a node that is about to go: kgpu places no new GPU pod
 * there, even for a pod that tolerates them (a blanket toleration passes
 * kube-scheduler's own TaintToleration).
 */
static const char *const leaving_taints[] = {
    "ToBeDeletedByClusterAutoscaler",                          /* Cluster Autoscaler */
    "karpenter.sh/disrupted",                                  /* Karpenter v1 */
    "karpenter.sh/disruption",                                 /* Karpenter before v1 */
    "cloud.google.com/impending-node-termination",             /* GKE preemption */
    "aws-node-termination-handler/spot-itn",                   /* AWS spot interruption */
    "aws-node-termination-handler/rebalance-recommendation",   /* AWS spot at risk */
    "aws-node-termination-handler/scheduled-maintenance",      /* AWS maintenance */
    "aws-node-termination-handler/asg-lifecycle-termination", /* AWS scale-in */
    "node.kubernetes.io/out-of-service",                       /* Kubernetes: node shut down */
    "kgpu.io/leaving",                                         /* any other handler */
};

bool ext_node_leaving(const json_t *node, char *why, size_t len)
{
    why[0] = '\0';
    const json_t *meta = json_object_get(node, "metadata");
    const json_t *spec = json_object_get(node, "spec");
    if (json_object_get(meta, "deletionTimestamp") != NULL) {
        snprintf(why, len, "it is being deleted");
        return true;
    }
    if (json_is_true(json_object_get(spec, "unschedulable"))) {
        snprintf(why, len, "it is cordoned");
        return true;
    }
    size_t i;
    const json_t *t;
    json_array_foreach(json_object_get(spec, "taints"), i, t)
    {
        const char *key = json_string_value(json_object_get(t, "key"));
        const char *effect = json_string_value(json_object_get(t, "effect"));
        if (key == NULL)
            continue;
        for (size_t k = 0; k < sizeof(leaving_taints) / sizeof(leaving_taints[0]); k++)
            if (strcmp(key, leaving_taints[k]) == 0) {
                snprintf(why, len, "taint %s%s%s", key, effect ? ":" : "", effect ? effect : "");
                return true;
            }
    }
    return false;
}

int ext_node_guard_marks(const json_t *node)
{
    const json_t *ann = json_object_get(json_object_get(node, "metadata"), "annotations");
    return (json_object_get(ann, EXT_GUARD_MARK) != NULL ? EXT_GUARD_HAS_MARK : 0) |
           (json_object_get(ann, EXT_GUARD_CA) != NULL ||
                    json_object_get(ann, EXT_GUARD_KARPENTER) != NULL
                ? EXT_GUARD_HAS_OTHER
                : 0);
}

/* ---- GPUQueues and namespaces ---- */

const char *ext_obj_name(const json_t *obj)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
}

/* What is kept of a GPUQueue: metadata.name and .generation, spec, status. */
void ext_gpuqueue_trim(void *ctx, json_t *obj)
{
    (void)ctx;
    const char *key;
    void *tmp;
    json_t *v;
    json_object_foreach_safe(obj, tmp, key, v)
    {
        if (strcmp(key, "metadata") != 0 && strcmp(key, "spec") != 0 &&
            strcmp(key, "status") != 0)
            json_object_del(obj, key);
    }
    json_t *meta = json_object_get(obj, "metadata");
    json_object_foreach_safe(meta, tmp, key, v)
    {
        if (strcmp(key, "name") != 0 && strcmp(key, "generation") != 0)
            json_object_del(meta, key);
    }
}

const char *ext_namespace_queue(const json_t *ns)
{
    return json_string_value(json_object_get(
        json_object_get(json_object_get(ns, "metadata"), "annotations"), KGPU_QUEUE_LABEL));
}

const json_t *ext_namespace_labels(const json_t *ns)
{
    const json_t *l = json_object_get(json_object_get(ns, "metadata"), "labels");
    return json_is_object(l) ? l : NULL;
}

/*
 * A namespace is its name, its kgpu.io/queue annotation and its labels
 * (GPUQueue namespace selectors read them; the state keeps a bounded few).
 */
void ext_namespace_trim(void *ctx, json_t *ns)
{
    (void)ctx;
    json_t *meta = json_object_get(ns, "metadata");
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *queue = ext_namespace_queue(ns);
    json_t *labels = (json_t *)ext_namespace_labels(ns);
    json_t *keep = json_pack("{s:s?,s:{s:s?},s:O?}", "name", name, "annotations", KGPU_QUEUE_LABEL,
                             queue, "labels", labels);
    json_object_clear(ns);
    if (keep != NULL)
        json_object_set_new(ns, "metadata", keep);
}
