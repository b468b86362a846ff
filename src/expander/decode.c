/*
 * Cluster Autoscaler's v1.Node and v1.Pod protobuf bytes as the JSON kgpu's
 * parsers read (caexp.h). protobuf-c does the decoding, bounds-checked, from
 * proto/ca_expander.proto, which keeps the upstream field numbers of what
 * kgpu reads and nothing else; every other field is skipped on the wire.
 * The JSON then goes through the same kgpu_node_from_json and
 * kgpu_pod_from_json as a watched object, so a template node and a pending
 * pod mean here what they mean to the extender.
 */
#include <stdio.h>
#include <string.h>

#include "caexp.h"

/*
 * protoc-c gives every map field its own entry type, all of the same shape
 * (key, value): these walk any of them. STRING_MAP: map<string, string> as
 * an object; QUANTITY_MAP: map<string, Quantity> as {"name": "quantity"}.
 * Both leave NULL for an empty map (the key is then left out).
 */
#define STRING_MAP(out, e, n)                                                                      \
    do {                                                                                           \
        (out) = (n) > 0 ? json_object() : NULL;                                                    \
        for (size_t i_ = 0; (out) != NULL && i_ < (n); i_++)                                       \
            if ((e)[i_]->key != NULL && (e)[i_]->value != NULL)                                    \
                json_object_set_new((out), (e)[i_]->key, json_string((e)[i_]->value));             \
    } while (0)
#define QUANTITY_MAP(out, e, n)                                                                    \
    do {                                                                                           \
        (out) = (n) > 0 ? json_object() : NULL;                                                    \
        for (size_t i_ = 0; (out) != NULL && i_ < (n); i_++)                                       \
            if ((e)[i_]->key != NULL && (e)[i_]->value != NULL &&                                  \
                (e)[i_]->value->string != NULL)                                                    \
                json_object_set_new((out), (e)[i_]->key, json_string((e)[i_]->value->string));     \
    } while (0)

/* Sets key to v when v is not NULL (taking it over). */
static void put(json_t *o, const char *key, json_t *v)
{
    if (v != NULL)
        json_object_set_new(o, key, v);
}

static json_t *meta_json(const Kgpu__Caexp__ObjectMeta *m)
{
    json_t *o = json_object();
    if (o == NULL || m == NULL)
        return o;
    if (m->name != NULL)
        put(o, "name", json_string(m->name));
    if (m->namespace_ != NULL)
        put(o, "namespace", json_string(m->namespace_));
    if (m->uid != NULL)
        put(o, "uid", json_string(m->uid));
    json_t *labels, *annotations;
    STRING_MAP(labels, m->labels, m->n_labels);
    STRING_MAP(annotations, m->annotations, m->n_annotations);
    put(o, "labels", labels);
    put(o, "annotations", annotations);
    return o;
}

json_t *caexp_node_json(const uint8_t *b, size_t n, kgpu_error *err)
{
    Kgpu__Caexp__Node *node = kgpu__caexp__node__unpack(NULL, n, b);
    if (node == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "not a v1.Node in protobuf encoding"), NULL;
    json_t *o = json_object();
    put(o, "metadata", meta_json(node->metadata));
    json_t *spec = json_object();
    if (node->spec != NULL) {
        if (node->spec->has_unschedulable)
            put(spec, "unschedulable", json_boolean(node->spec->unschedulable));
        json_t *taints = json_array();
        for (size_t i = 0; taints != NULL && i < node->spec->n_taints; i++) {
            const Kgpu__Caexp__Taint *t = node->spec->taints[i];
            json_array_append_new(taints, json_pack("{s:s?,s:s?,s:s?}", "key", t->key, "value",
                                                    t->value, "effect", t->effect));
        }
        put(spec, "taints", taints);
    }
    put(o, "spec", spec);
    json_t *status = json_object();
    if (node->status != NULL) {
        json_t *cap, *alloc;
        QUANTITY_MAP(cap, node->status->capacity, node->status->n_capacity);
        QUANTITY_MAP(alloc, node->status->allocatable, node->status->n_allocatable);
        put(status, "capacity", cap);
        put(status, "allocatable", alloc);
    }
    put(o, "status", status);
    kgpu__caexp__node__free_unpacked(node, NULL);
    if (o == NULL || spec == NULL || status == NULL) {
        json_decref(o);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory"), NULL;
    }
    return o;
}

static json_t *containers_json(Kgpu__Caexp__Container *const *c, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++) {
        json_t *r = json_object();
        if (c[i]->resources != NULL) {
            const Kgpu__Caexp__ResourceRequirements *rr = c[i]->resources;
            json_t *limits, *requests;
            QUANTITY_MAP(limits, rr->limits, rr->n_limits);
            QUANTITY_MAP(requests, rr->requests, rr->n_requests);
            put(r, "limits", limits);
            put(r, "requests", requests);
        }
        json_array_append_new(a, json_pack("{s:s?,s:o}", "name", c[i]->name, "resources", r));
    }
    return a;
}

json_t *caexp_pod_json(const uint8_t *b, size_t n, kgpu_error *err)
{
    Kgpu__Caexp__Pod *pod = kgpu__caexp__pod__unpack(NULL, n, b);
    if (pod == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "not a v1.Pod in protobuf encoding"), NULL;
    json_t *o = json_object();
    put(o, "metadata", meta_json(pod->metadata));
    json_t *spec = json_object();
    if (pod->spec != NULL) {
        const Kgpu__Caexp__PodSpec *s = pod->spec;
        put(spec, "containers", containers_json(s->containers, s->n_containers));
        if (s->n_initcontainers > 0)
            put(spec, "initContainers", containers_json(s->initcontainers, s->n_initcontainers));
        json_t *selector;
        STRING_MAP(selector, s->nodeselector, s->n_nodeselector);
        put(spec, "nodeSelector", selector);
        json_t *tol = json_array();
        for (size_t i = 0; tol != NULL && i < s->n_tolerations; i++) {
            const Kgpu__Caexp__Toleration *t = s->tolerations[i];
            json_array_append_new(tol, json_pack("{s:s?,s:s?,s:s?,s:s?}", "key", t->key,
                                                 "operator", t->operator_, "value", t->value,
                                                 "effect", t->effect));
        }
        put(spec, "tolerations", tol);
        if (s->has_priority)
            put(spec, "priority", json_integer(s->priority));
    }
    put(o, "spec", spec);
    kgpu__caexp__pod__free_unpacked(pod, NULL);
    if (o == NULL || spec == NULL) {
        json_decref(o);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory"), NULL;
    }
    return o;
}
