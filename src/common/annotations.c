/*
 * The annotations kgpu writes and reads back: the pod's GPU assignment (the
 * extender's decision, read by the device plugin) and the node's GPU inventory
 * (written by the device plugin, read by the extender), plus reading a v1 Node.
 * Parsers are strict: another component wrote the text, so anything unexpected
 * is a bug or tampering, and the error says where it is.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "podspec.h"

#define MIB           (1024 * 1024)
#define MAX_GPU_INDEX 1023
#define MAX_NUMA      1023
#define SHOWN_MAX     40
#define DUMP_FLAGS    (JSON_COMPACT | JSON_PRESERVE_ORDER)

static const json_t *member(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* A string member without NUL bytes, or NULL. */
static const char *string_member(const json_t *o, const char *key)
{
    const json_t *v = member(o, key);
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return NULL;
    return json_string_value(v);
}

/* Serialises v into a malloc'd string (not jansson's allocator, so callers can free()). */
static char *dump(const json_t *v)
{
    size_t size = json_dumpb(v, NULL, 0, DUMP_FLAGS);
    if (size == 0)
        return NULL;
    char *s = malloc(size + 1);
    if (s == NULL)
        return NULL;
    if (json_dumpb(v, s, size, DUMP_FLAGS) != size) {
        free(s);
        return NULL;
    }
    s[size] = '\0';
    return s;
}

/* Loads text as JSON into *out; errors are prefixed with `what`. */
static int load(const char *text, const char *what, json_t **out, kgpu_error *err)
{
    *out = NULL;
    if (text == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: no text", what);
    json_error_t jerr;
    *out = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (*out == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: invalid JSON at line %d column %d: %s", what,
                              jerr.line, jerr.column, jerr.text);
    return 0;
}

/* An integer member within lo..hi into *out. */
static int int_member(const json_t *o, const char *key, json_int_t lo, json_int_t hi,
                      const char *where, json_int_t *out, kgpu_error *err)
{
    const json_t *v = member(o, key);
    if (!json_is_integer(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s missing or not an integer", where, key);
    *out = json_integer_value(v);
    if (*out < lo || *out > hi)
        return kgpu_error_set(err, KGPU_ERANGE,
                              "%s: %s %" JSON_INTEGER_FORMAT " outside %" JSON_INTEGER_FORMAT
                              "..%" JSON_INTEGER_FORMAT,
                              where, key, *out, lo, hi);
    return 0;
}

/* A string member shorter than cap (and non-empty when `nonempty`) copied into buf. */
static int str_member(const json_t *o, const char *key, size_t cap, bool nonempty,
                      const char *where, char *buf, kgpu_error *err)
{
    const char *s = string_member(o, key);
    if (s == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s missing or not a string", where, key);
    size_t len = strlen(s);
    if (nonempty && len == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: %s is empty", where, key);
    if (len >= cap)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: %s '%.*s...' is longer than %zu characters",
                              where, key, SHOWN_MAX, s, cap - 1);
    memcpy(buf, s, len + 1);
    return 0;
}

static int bool_member(const json_t *o, const char *key, const char *where, bool *out,
                       kgpu_error *err)
{
    const json_t *v = member(o, key);
    if (!json_is_boolean(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s missing or not a boolean", where, key);
    *out = json_is_true(v);
    return 0;
}

/* ---- kgpu.io/assignment ---- */

static json_t *assigned_gpu_json(const kgpu_gpu *g, int milli, int64_t memory_mib)
{
    json_t *o = json_object();
    if (o == NULL || json_object_set_new(o, "index", json_integer(g->index)) != 0 ||
        json_object_set_new(o, "uuid", json_string(g->uuid)) != 0 ||
        json_object_set_new(o, "milli", json_integer(milli)) != 0 ||
        json_object_set_new(o, "memory_mib", json_integer(memory_mib)) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *assigned_part_json(const kgpu_node *node, const kgpu_part *part,
                                  const kgpu_assignment *a)
{
    if (a->ngpus < 0 || a->ngpus > KGPU_MAX_GPUS_PER_NODE)
        return NULL;
    json_t *o = json_object(), *gpus = json_array();
    if (o == NULL || gpus == NULL ||
        json_object_set_new(o, "container", json_string(part->container)) != 0) {
        json_decref(o);
        json_decref(gpus);
        return NULL;
    }
    if (json_object_set_new(o, "gpus", gpus) != 0) {
        json_decref(o);
        return NULL;
    }
    for (int j = 0; j < a->ngpus; j++) {
        int pos = a->gpus[j];
        if (pos < 0 || pos >= node->ngpus) {
            json_decref(o);
            return NULL;
        }
        const kgpu_gpu *g = &node->gpus[pos];
        if (json_array_append_new(
                gpus, assigned_gpu_json(g, a->gpu_milli,
                                        a->exclusive ? g->memory_mib : a->gpu_memory_mib)) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    if (json_object_set_new(o, "exclusive", json_boolean(a->exclusive)) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *kgpu_assignment_format(const kgpu_node *node, const kgpu_part *parts,
                             const kgpu_assignment *assigned, int n)
{
    if (node == NULL || n < 0 || (n > 0 && (parts == NULL || assigned == NULL)))
        return NULL;
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        if (json_array_append_new(arr, assigned_part_json(node, &parts[i], &assigned[i])) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    char *s = dump(arr);
    json_decref(arr);
    return s;
}

static int parse_assigned_gpu(const json_t *v, const char *where, kgpu_assigned_gpu *g,
                              kgpu_error *err)
{
    if (!json_is_object(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: not an object", where);
    json_int_t index = 0, milli = 0, mem = 0;
    int rc;
    if ((rc = int_member(v, "index", 0, MAX_GPU_INDEX, where, &index, err)) != 0 ||
        (rc = str_member(v, "uuid", sizeof(g->uuid), false, where, g->uuid, err)) != 0 ||
        (rc = int_member(v, "milli", 0, KGPU_MILLI, where, &milli, err)) != 0 ||
        (rc = int_member(v, "memory_mib", 0, INT64_MAX, where, &mem, err)) != 0)
        return rc;
    g->index = (int)index;
    g->milli = (int)milli;
    g->memory_mib = mem;
    return 0;
}

static int parse_assigned_part(const json_t *v, size_t i, kgpu_assigned_part *p, kgpu_error *err)
{
    char where[96];
    snprintf(where, sizeof(where), "assignment[%zu]", i);
    if (!json_is_object(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: not an object", where);
    memset(p, 0, sizeof(*p));
    int rc;
    if ((rc = str_member(v, "container", sizeof(p->container), true, where, p->container, err)) !=
            0 ||
        (rc = bool_member(v, "exclusive", where, &p->exclusive, err)) != 0)
        return rc;
    const json_t *gpus = member(v, "gpus");
    if (!json_is_array(gpus))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: gpus missing or not an array", where);
    if (json_array_size(gpus) > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %zu GPUs, at most %d", where,
                              json_array_size(gpus), KGPU_MAX_GPUS_PER_NODE);
    for (size_t j = 0; j < json_array_size(gpus); j++) {
        char gwhere[128];
        snprintf(gwhere, sizeof(gwhere), "%s.gpus[%zu]", where, j);
        if ((rc = parse_assigned_gpu(json_array_get(gpus, j), gwhere, &p->gpus[j], err)) != 0)
            return rc;
        for (size_t k = 0; k < j; k++)
            if (p->gpus[k].index == p->gpus[j].index)
                return kgpu_error_set(err, KGPU_EINVAL, "%s: index %d listed twice", gwhere,
                                      p->gpus[j].index);
        p->ngpus = (int)j + 1;
    }
    return 0;
}

int kgpu_assignment_parse(const char *text, kgpu_assigned_part *parts, int max, int *n,
                          kgpu_error *err)
{
    *n = 0;
    json_t *root;
    int rc = load(text, "assignment", &root, err);
    if (rc != 0)
        return rc;
    if (!json_is_array(root)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "assignment: not a JSON array");
    } else if (json_array_size(root) > (size_t)(max > 0 ? max : 0)) {
        rc = kgpu_error_set(err, KGPU_ERANGE, "assignment: %zu parts, at most %d",
                            json_array_size(root), max > 0 ? max : 0);
    } else {
        for (size_t i = 0; i < json_array_size(root) && rc == 0; i++)
            rc = parse_assigned_part(json_array_get(root, i), i, &parts[i], err);
        if (rc == 0)
            *n = (int)json_array_size(root);
    }
    json_decref(root);
    return rc;
}

int kgpu_assignment_within(const kgpu_pod *pod, const kgpu_assigned_part *parts, int n,
                           kgpu_error *err)
{
    bool used[KGPU_MAX_PARTS] = {false};
    for (int i = 0; i < n; i++) {
        const kgpu_assigned_part *a = &parts[i];
        int k = -1;
        for (int j = 0; j < pod->nparts && k < 0; j++)
            if (strcmp(pod->parts[j].container, a->container) == 0)
                k = j;
        if (k < 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "assignment[%d] (container %.63s): the pod asks for no GPU "
                                  "for this container",
                                  i, a->container);
        if (used[k])
            return kgpu_error_set(err, KGPU_EINVAL, "assignment[%d] (container %.63s): listed twice",
                                  i, a->container);
        used[k] = true;
        const kgpu_request *r = &pod->parts[k].req;
        if (a->ngpus > r->gpu_count)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "assignment[%d] (container %.63s): %d GPUs, the pod asks for %d",
                                  i, a->container, a->ngpus, r->gpu_count);
        if (a->exclusive && !r->exclusive)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "assignment[%d] (container %.63s): whole GPUs, the pod asks "
                                  "for a share",
                                  i, a->container);
        if (a->exclusive)
            continue;
        for (int g = 0; g < a->ngpus; g++) {
            const kgpu_assigned_gpu *x = &a->gpus[g];
            int milli = r->exclusive ? KGPU_MILLI : r->gpu_milli;
            if (x->milli > milli)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "assignment[%d] (container %.63s): GPU %d gets %d/1000 of "
                                      "its compute, the pod asks for %d",
                                      i, a->container, x->index, x->milli, milli);
            if (!r->exclusive && x->memory_mib > r->gpu_memory_mib)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "assignment[%d] (container %.63s): GPU %d gets %" PRId64
                                      " MiB, the pod asks for %" PRId64,
                                      i, a->container, x->index, x->memory_mib,
                                      r->gpu_memory_mib);
        }
    }
    return 0;
}

/* ---- kgpu.io/gpus ---- */

char *kgpu_gpus_annotation_format(const kgpu_gpu_spec *gpus, int n)
{
    if (n < 0 || (n > 0 && gpus == NULL))
        return NULL;
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        const kgpu_gpu_spec *g = &gpus[i];
        json_t *o = json_object();
        if (o == NULL || json_array_append_new(arr, o) != 0 ||
            json_object_set_new(o, "index", json_integer(g->index)) != 0 ||
            json_object_set_new(o, "uuid", json_string(g->uuid ? g->uuid : "")) != 0 ||
            json_object_set_new(o, "model", json_string(g->model ? g->model : "")) != 0 ||
            json_object_set_new(o, "memory_mib", json_integer(g->memory_mib)) != 0 ||
            json_object_set_new(o, "numa", json_integer(g->numa)) != 0 ||
            json_object_set_new(o, "healthy", json_boolean(g->healthy)) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    char *s = dump(arr);
    json_decref(arr);
    return s;
}

static int parse_gpu_spec(const json_t *v, size_t i, kgpu_node_store *store, kgpu_error *err)
{
    char where[64];
    snprintf(where, sizeof(where), "%s[%zu]", KGPU_ANN_GPUS, i);
    if (!json_is_object(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: not an object", where);
    json_int_t index = 0, mem = 0, numa = 0;
    bool healthy = false;
    int rc;
    if ((rc = int_member(v, "index", 0, MAX_GPU_INDEX, where, &index, err)) != 0 ||
        (rc = str_member(v, "uuid", KGPU_UUID_MAX, false, where, store->uuid[i], err)) != 0 ||
        (rc = str_member(v, "model", KGPU_MODEL_NAME_MAX, true, where, store->model[i], err)) !=
            0 ||
        (rc = int_member(v, "memory_mib", 0, INT64_MAX, where, &mem, err)) != 0 ||
        (rc = int_member(v, "numa", -1, MAX_NUMA, where, &numa, err)) != 0 ||
        (rc = bool_member(v, "healthy", where, &healthy, err)) != 0)
        return rc;
    for (size_t k = 0; k < i; k++)
        if (store->gpus[k].index == index)
            return kgpu_error_set(err, KGPU_EINVAL, "%s: index %d listed twice", where, (int)index);
    kgpu_gpu_spec *g = &store->gpus[i];
    g->index = (int)index;
    g->uuid = store->uuid[i];
    g->model = store->model[i];
    g->memory_mib = mem;
    g->numa = (int)numa;
    g->healthy = healthy;
    return 0;
}

static int item_error(kgpu_error *err, const char *where, const char *field, const char *what)
{
    return kgpu_error_set(err, KGPU_EPARSE, "%s.%s: %s", where, field, what);
}

int kgpu_gpu_item_parse(const json_t *v, const char *where, int position, bool index_required,
                        bool uuid_required, kgpu_gpu_spec *g, char *uuid, char *model,
                        kgpu_error *err)
{
    if (!json_is_object(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: not a mapping", where);
    const json_t *x = json_object_get(v, "index");
    if (x == NULL && !index_required) {
        g->index = position;
    } else if (!json_is_integer(x) || json_integer_value(x) < 0 ||
               json_integer_value(x) > MAX_GPU_INDEX) {
        return item_error(err, where, "index", "needs an integer 0..1023");
    } else {
        g->index = (int)json_integer_value(x);
    }
    const char *s = json_string_value(json_object_get(v, "uuid"));
    if ((s == NULL && uuid_required) || (s != NULL && uuid_required && *s == '\0') ||
        (s != NULL && strlen(s) >= KGPU_UUID_MAX) ||
        (json_object_get(v, "uuid") != NULL && s == NULL))
        return item_error(err, where, "uuid", "needs a non-empty string (< 80 bytes)");
    snprintf(uuid, KGPU_UUID_MAX, "%s", s != NULL ? s : "");
    s = json_string_value(json_object_get(v, "model"));
    if (s == NULL || *s == '\0' || strlen(s) >= KGPU_MODEL_NAME_MAX)
        return item_error(err, where, "model", "needs a non-empty string (< 64 bytes)");
    snprintf(model, KGPU_MODEL_NAME_MAX, "%s", s);
    x = json_object_get(v, "memory_mib");
    if (!json_is_integer(x) || json_integer_value(x) <= 0 ||
        json_integer_value(x) > (INT64_C(1) << 30))
        return item_error(err, where, "memory_mib", "needs a positive integer");
    g->memory_mib = json_integer_value(x);
    x = json_object_get(v, "numa");
    if (x != NULL &&
        (!json_is_integer(x) || json_integer_value(x) < -1 || json_integer_value(x) > MAX_NUMA))
        return item_error(err, where, "numa", "needs an integer -1..1023");
    g->numa = x != NULL ? (int)json_integer_value(x) : -1;
    x = json_object_get(v, "healthy");
    if (x != NULL && !json_is_boolean(x))
        return item_error(err, where, "healthy", "needs true or false");
    g->healthy = x == NULL || json_is_true(x);
    g->uuid = uuid;
    g->model = model;
    return 0;
}

int kgpu_gpus_annotation_parse(const char *text, kgpu_node_store *store, int *n, kgpu_error *err)
{
    *n = 0;
    json_t *root;
    int rc = load(text, KGPU_ANN_GPUS, &root, err);
    if (rc != 0)
        return rc;
    size_t count = json_array_size(root);
    if (!json_is_array(root))
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: not a JSON array", KGPU_ANN_GPUS);
    else if (count < 1 || count > KGPU_MAX_GPUS_PER_NODE)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s: %zu GPUs, expected 1..%d", KGPU_ANN_GPUS, count,
                            KGPU_MAX_GPUS_PER_NODE);
    for (size_t i = 0; rc == 0 && i < count; i++)
        rc = parse_gpu_spec(json_array_get(root, i), i, store, err);
    if (rc == 0)
        *n = (int)count;
    json_decref(root);
    return rc;
}

/* ---- v1 Node ---- */

/* A quantity member of `o` (absent: 0) in milli or whole units; errors name node and path. */
static int node_quantity(const json_t *o, const char *key, const char *who, const char *path,
                         bool milli, int64_t *out, kgpu_error *err)
{
    *out = 0;
    const json_t *v = member(o, key);
    if (v == NULL)
        return 0;
    char num[32];
    const char *text;
    if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        text = num;
    } else if ((text = string_member(o, key)) == NULL) {
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s is not a string", who, path);
    }
    kgpu_error qe;
    kgpu_error_clear(&qe);
    int rc = milli ? kgpu_quantity_milli(text, out, &qe) : kgpu_quantity_value(text, out, &qe);
    if (rc != 0)
        return kgpu_error_set(err, rc, "%s: %s: %s", who, path, qe.msg);
    return 0;
}

/* GPUs from allocatable nvidia.com/gpu and the feature-discovery labels. */
static int node_gpus_from_labels(const json_t *metadata, const json_t *alloc, const char *who,
                                 kgpu_node_spec *spec, kgpu_node_store *store, kgpu_error *err)
{
    int64_t milli;
    int rc = node_quantity(alloc, KGPU_RES_WHOLE, who, "status.allocatable." KGPU_RES_WHOLE, true,
                           &milli, err);
    if (rc != 0)
        return rc;
    if (milli % KGPU_MILLI != 0)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: allocatable %s is not a whole number", who,
                              KGPU_RES_WHOLE);
    int64_t count = milli / KGPU_MILLI;
    if (count > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %" PRId64 " GPUs (at most %d per node)", who,
                              count, KGPU_MAX_GPUS_PER_NODE);
    if (count == 0)
        return 0;

    const json_t *labels = member(metadata, "labels");
    if (labels != NULL && !json_is_object(labels))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: metadata.labels is not an object", who);
    const char *model = "unknown";
    int64_t memory = 0;
    if (member(labels, KGPU_LABEL_PRODUCT) != NULL) {
        const char *p = string_member(labels, KGPU_LABEL_PRODUCT);
        if (p == NULL)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: label %s is not a string", who,
                                  KGPU_LABEL_PRODUCT);
        if (strlen(p) >= KGPU_MODEL_NAME_MAX)
            return kgpu_error_set(err, KGPU_EINVAL, "%s: label %s is longer than %d characters",
                                  who, KGPU_LABEL_PRODUCT, KGPU_MODEL_NAME_MAX - 1);
        if (p[0] != '\0')
            model = p;
    }
    if ((rc = node_quantity(labels, KGPU_LABEL_MEMORY, who, "label " KGPU_LABEL_MEMORY, false,
                            &memory, err)) != 0)
        return rc;
    for (int i = 0; i < (int)count; i++) {
        char suffix[16];
        int slen = snprintf(suffix, sizeof(suffix), "-gpu%d", i);
        /* Cut a long node name rather than the suffix: uuids stay distinct within the node. */
        int keep = KGPU_UUID_MAX - 1 - slen;
        snprintf(store->uuid[i], KGPU_UUID_MAX, "%.*s%s", keep, store->name, suffix);
        snprintf(store->model[i], KGPU_MODEL_NAME_MAX, "%s", model);
        store->gpus[i] = (kgpu_gpu_spec){.index = i,
                                         .uuid = store->uuid[i],
                                         .model = store->model[i],
                                         .memory_mib = memory,
                                         .numa = -1,
                                         .healthy = true};
    }
    spec->ngpus = (int)count;
    return 0;
}

int kgpu_node_from_json(const json_t *node, kgpu_node_spec *spec, kgpu_node_store *store,
                        kgpu_error *err)
{
    memset(spec, 0, sizeof(*spec));
    store->name[0] = '\0';
    spec->name = store->name;
    spec->gpus = store->gpus;
    if (!json_is_object(node))
        return kgpu_error_set(err, KGPU_EPARSE, "node: not a JSON object");
    const json_t *metadata = member(node, "metadata");
    if (!json_is_object(metadata))
        return kgpu_error_set(err, KGPU_EPARSE, "node: metadata missing or not an object");
    int rc = str_member(metadata, "name", sizeof(store->name), true, "node", store->name, err);
    if (rc != 0)
        return rc;
    char who[KGPU_NAME_MAX + 8];
    snprintf(who, sizeof(who), "node %s", store->name);

    const json_t *status = member(node, "status"), *alloc = NULL;
    if (status != NULL && !json_is_object(status))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: status is not an object", who);
    alloc = member(status, "allocatable");
    if (alloc != NULL && !json_is_object(alloc))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: status.allocatable is not an object", who);
    int64_t mem;
    if ((rc = node_quantity(alloc, "cpu", who, "status.allocatable.cpu", true, &spec->cpu_milli,
                            err)) != 0 ||
        (rc = node_quantity(alloc, "memory", who, "status.allocatable.memory", false, &mem, err)) !=
            0)
        return rc;
    spec->memory_mib = mem / MIB;

    const json_t *ann = member(metadata, "annotations");
    if (ann != NULL && !json_is_object(ann))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: metadata.annotations is not an object", who);
    if (member(ann, KGPU_ANN_GPUS) == NULL)
        return node_gpus_from_labels(metadata, alloc, who, spec, store, err);
    const char *text = string_member(ann, KGPU_ANN_GPUS);
    if (text == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: annotation %s is not a string", who,
                              KGPU_ANN_GPUS);
    kgpu_error ge;
    kgpu_error_clear(&ge);
    if ((rc = kgpu_gpus_annotation_parse(text, store, &spec->ngpus, &ge)) != 0)
        return kgpu_error_set(err, rc, "%s: %s", who, ge.msg);
    return 0;
}

/* Appends s (NULL stays NULL) at *at, returning where it went. */
static const char *pack_str(const char *s, char **at)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = memcpy(*at, s, n);
    *at += n;
    return d;
}

void *kgpu_node_spec_pack(const kgpu_node_spec *in, kgpu_node_spec *out)
{
    size_t size = (size_t)in->ngpus * sizeof(kgpu_gpu_spec) + strlen(in->name) + 1;
    for (int i = 0; i < in->ngpus; i++)
        size += (in->gpus[i].uuid ? strlen(in->gpus[i].uuid) + 1 : 0) +
                (in->gpus[i].model ? strlen(in->gpus[i].model) + 1 : 0);
    kgpu_gpu_spec *gpus = malloc(size);
    if (gpus == NULL)
        return NULL;
    char *at = (char *)(gpus + in->ngpus);
    *out = *in;
    out->gpus = gpus;
    out->name = pack_str(in->name, &at);
    for (int i = 0; i < in->ngpus; i++) {
        gpus[i] = in->gpus[i];
        gpus[i].uuid = pack_str(in->gpus[i].uuid, &at);
        gpus[i].model = pack_str(in->gpus[i].model, &at);
    }
    return gpus;
}
