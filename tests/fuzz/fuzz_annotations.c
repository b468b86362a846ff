/*
 * Fuzz target for the annotation parsers. The first byte picks the parser
 * (byte % 3: 0 the pod's kgpu.io/assignment, 1 the node's kgpu.io/gpus,
 * 2 a whole v1 Node); the rest is its input. Whatever parses must format
 * again and parse back to the same thing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kgpu/model.h"
#include "podspec.h"

#define MAX_PARTS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool gpu_specs_equal(const kgpu_gpu_spec *a, const kgpu_gpu_spec *b)
{
    return a->index == b->index && strcmp(a->uuid, b->uuid) == 0 &&
           strcmp(a->model, b->model) == 0 && a->memory_mib == b->memory_mib &&
           a->numa == b->numa && a->healthy == b->healthy;
}

/* Formats n GPU specs and parses them back; aborts unless they come back equal. */
static void gpus_round_trip(const kgpu_gpu_spec *gpus, int n)
{
    static kgpu_node_store again;
    char *text = kgpu_gpus_annotation_format(gpus, n);
    if (text == NULL)
        abort();
    int m;
    kgpu_error err;
    if (kgpu_gpus_annotation_parse(text, &again, &m, &err) != KGPU_OK || m != n)
        abort();
    for (int i = 0; i < n; i++)
        if (!gpu_specs_equal(&gpus[i], &again.gpus[i]))
            abort();
    free(text);
}

/*
 * Rebuilds a node, parts and assignments that format to `in`. Returns false
 * when no such inputs exist (one GPU index with two uuids or two exclusive
 * memory sizes; a part whose GPUs differ in milli or shared memory): the
 * annotation can say more than the core's assignment holds.
 */
static bool rebuild(const kgpu_assigned_part *in, int n, kgpu_node *node, kgpu_gpu *gpus,
                    kgpu_part *parts, kgpu_assignment *assigned)
{
    bool memory_set[MAX_PARTS * KGPU_MAX_GPUS_PER_NODE];
    memset(node, 0, sizeof(*node));
    node->gpus = gpus;
    for (int i = 0; i < n; i++) {
        const kgpu_assigned_part *p = &in[i];
        memset(&parts[i], 0, sizeof(parts[i]));
        memset(&assigned[i], 0, sizeof(assigned[i]));
        strcpy(parts[i].container, p->container);
        assigned[i].exclusive = p->exclusive;
        assigned[i].ngpus = p->ngpus;
        for (int j = 0; j < p->ngpus; j++) {
            const kgpu_assigned_gpu *g = &p->gpus[j];
            if (g->milli != p->gpus[0].milli ||
                (!p->exclusive && g->memory_mib != p->gpus[0].memory_mib))
                return false;
            int pos = 0;
            while (pos < node->ngpus && gpus[pos].index != g->index)
                pos++;
            if (pos == node->ngpus) {
                memset(&gpus[pos], 0, sizeof(gpus[pos]));
                gpus[pos].index = g->index;
                strcpy(gpus[pos].uuid, g->uuid);
                memory_set[pos] = false;
                node->ngpus++;
            } else if (strcmp(gpus[pos].uuid, g->uuid) != 0) {
                return false;
            }
            if (p->exclusive) {
                if (memory_set[pos] && gpus[pos].memory_mib != g->memory_mib)
                    return false;
                gpus[pos].memory_mib = g->memory_mib;
                memory_set[pos] = true;
            }
            assigned[i].gpus[j] = pos;
        }
        if (p->ngpus > 0) {
            assigned[i].gpu_milli = p->gpus[0].milli;
            assigned[i].gpu_memory_mib = p->exclusive ? 0 : p->gpus[0].memory_mib;
        }
    }
    return true;
}

static bool assigned_equal(const kgpu_assigned_part *a, const kgpu_assigned_part *b)
{
    if (strcmp(a->container, b->container) != 0 || a->exclusive != b->exclusive ||
        a->ngpus != b->ngpus)
        return false;
    for (int j = 0; j < a->ngpus; j++)
        if (a->gpus[j].index != b->gpus[j].index || strcmp(a->gpus[j].uuid, b->gpus[j].uuid) != 0 ||
            a->gpus[j].milli != b->gpus[j].milli || a->gpus[j].memory_mib != b->gpus[j].memory_mib)
            return false;
    return true;
}

static void fuzz_assignment(const char *text)
{
    static kgpu_assigned_part parsed[MAX_PARTS], again[MAX_PARTS];
    static kgpu_gpu gpus[MAX_PARTS * KGPU_MAX_GPUS_PER_NODE];
    static kgpu_part parts[MAX_PARTS];
    static kgpu_assignment assigned[MAX_PARTS];
    int n, m;
    kgpu_error err;
    if (kgpu_assignment_parse(text, parsed, MAX_PARTS, &n, &err) != KGPU_OK)
        return;
    if (n < 0 || n > MAX_PARTS)
        abort();
    kgpu_node node;
    if (!rebuild(parsed, n, &node, gpus, parts, assigned))
        return;
    char *out = kgpu_assignment_format(&node, parts, assigned, n);
    if (out == NULL || kgpu_assignment_parse(out, again, MAX_PARTS, &m, &err) != KGPU_OK || m != n)
        abort();
    for (int i = 0; i < n; i++)
        if (!assigned_equal(&parsed[i], &again[i]))
            abort();
    free(out);
}

static void fuzz_gpus(const char *text)
{
    static kgpu_node_store store;
    int n;
    kgpu_error err;
    if (kgpu_gpus_annotation_parse(text, &store, &n, &err) != KGPU_OK)
        return;
    if (n < 1 || n > KGPU_MAX_GPUS_PER_NODE)
        abort();
    gpus_round_trip(store.gpus, n);
}

static void fuzz_node(const char *buf, size_t size)
{
    static kgpu_node_store store;
    json_error_t jerr;
    json_t *v = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &jerr);
    if (v == NULL)
        return;
    kgpu_node_spec spec;
    kgpu_error err;
    int rc = kgpu_node_from_json(v, &spec, &store, &err);
    json_decref(v);
    if (rc != KGPU_OK)
        return;
    if (spec.ngpus > 0)
        gpus_round_trip(spec.gpus, spec.ngpus);
    /* What the reader accepts is a node the core accepts. */
    kgpu_cluster *c = kgpu_cluster_new();
    if (c == NULL)
        return;
    rc = kgpu_cluster_add_node(c, &spec, &err);
    if (rc < 0 && rc != KGPU_ENOMEM)
        abort();
    kgpu_cluster_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int which = data[0] % 3;
    data++;
    size--;
    if (which == 2) {
        fuzz_node((const char *)data, size);
        return 0;
    }
    /* Annotation values are C strings: stop at the first NUL like a reader would. */
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    if (which == 0)
        fuzz_assignment(text);
    else
        fuzz_gpus(text);
    free(text);
    return 0;
}
