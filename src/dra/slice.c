/*
 * The node's ResourceSlice (resource.k8s.io/v1): one pool per node, named
 * after it, in one slice; every healthy GPU a device that allows multiple
 * allocations, so kube-scheduler itself places several claims on one GPU by
 * consumable capacity (KEP-5075), with no extender.
 *
 * Capacity, and why these request policies:
 *   memory  bytes. Default: the whole GPU, so a claim that asks for no
 *           capacity gets the GPU alone, as a classic whole-GPU request
 *           does. Valid: 1 MiB upwards in steps of 1 MiB, the unit the
 *           interception library counts in.
 *   cores   percent of the GPU's compute. Default 0: a claim that asks for
 *           memory only is not limited in compute and takes none of it, as a
 *           kgpu.io/gpu-mem share on the device plugin path. Valid: 0..100,
 *           steps of 1.
 * Whole, exclusive GPUs therefore need nothing special: the default memory
 * is all of it, and no other claim fits beside.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dra.h"
#include "podspec.h"

void dra_device_name(int index, char *buf, size_t cap)
{
    snprintf(buf, cap, "gpu-%d", index);
}

void dra_slice_name(const char *node, char *buf, size_t cap)
{
    /* A node name is a DNS subdomain of at most 253; keep the driver suffix whole. */
    const char *suffix = "-" DRA_DRIVER;
    int room = 253 - (int)strlen(suffix);
    snprintf(buf, cap, "%.*s%s", room, node, suffix);
}

/* A byte count as the API server writes it back: the largest binary suffix that divides it. */
static json_t *bytes_quantity(int64_t b)
{
    static const char *const sfx[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi"};
    int s = 0;
    while (s < 5 && b != 0 && b % 1024 == 0) {
        b /= 1024;
        s++;
    }
    char buf[48];
    snprintf(buf, sizeof(buf), "%" PRId64 "%s", b, sfx[s]);
    return json_string(buf);
}

static json_t *int_quantity(int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return json_string(buf);
}

static json_t *device(const kgpu_gpu_info *g, const char *cc)
{
    char name[DRA_DEVICE_MAX];
    dra_device_name(g->index, name, sizeof(name));
    json_t *attrs = json_object();
    json_object_set_new(attrs, "index", json_pack("{s:I}", "int", (json_int_t)g->index));
    json_object_set_new(attrs, "uuid", json_pack("{s:s}", "string", g->uuid));
    json_object_set_new(attrs, "model", json_pack("{s:s}", "string", g->model));
    /* NVIDIA's own DRA driver calls the model productName; selectors written for it work. */
    json_object_set_new(attrs, "productName", json_pack("{s:s}", "string", g->model));
    json_object_set_new(attrs, "memoryMiB",
                        json_pack("{s:I}", "int", (json_int_t)g->memory_mib));
    if (g->numa >= 0)
        json_object_set_new(attrs, "numaNode", json_pack("{s:I}", "int", (json_int_t)g->numa));
    if (g->pci_bus_id[0] != '\0')
        json_object_set_new(attrs, "pciBusID", json_pack("{s:s}", "string", g->pci_bus_id));
    if (cc != NULL && cc[0] != '\0') {
        /* A semantic version, so CEL can compare: "8.0" becomes 8.0.0. */
        char v[32];
        snprintf(v, sizeof(v), "%s%s", cc, strchr(cc, '.') != NULL ? ".0" : ".0.0");
        json_object_set_new(attrs, "computeCapability", json_pack("{s:s}", "version", v));
    }
    int64_t bytes = g->memory_mib * 1024 * 1024;
    json_t *mem = json_pack("{s:o, s:{s:o, s:{s:o, s:o}}}", "value", bytes_quantity(bytes),
                            "requestPolicy", "default", bytes_quantity(bytes), "validRange",
                            "min", bytes_quantity(1024 * 1024), "step",
                            bytes_quantity(1024 * 1024));
    json_t *cores = json_pack("{s:o, s:{s:o, s:{s:o, s:o, s:o}}}", "value", int_quantity(100),
                              "requestPolicy", "default", int_quantity(0), "validRange", "min",
                              int_quantity(0), "max", int_quantity(100), "step", int_quantity(1));
    return json_pack("{s:s, s:b, s:o, s:{s:o, s:o}}", "name", name, "allowMultipleAllocations", 1,
                     "attributes", attrs, "capacity", DRA_CAP_MEMORY, mem, DRA_CAP_CORES, cores);
}

json_t *dra_slice_build(const dra_slice_input *in)
{
    char name[256];
    dra_slice_name(in->node, name, sizeof(name));
    json_t *devices = json_array();
    for (int i = 0; i < in->ngpus; i++) {
        if (!in->gpus[i].healthy)
            continue;
        const char *cc = in->compute_capability != NULL ? in->compute_capability[i] : NULL;
        json_array_append_new(devices, device(&in->gpus[i], cc));
    }
    json_t *meta = json_pack("{s:s, s:{s:s}}", "name", name, "labels", "app.kubernetes.io/part-of",
                             "kgpu");
    if (in->node_uid != NULL && in->node_uid[0] != '\0')
        /* Deleting the Node deletes its slice (garbage collector). */
        json_object_set_new(meta, "ownerReferences",
                            json_pack("[{s:s, s:s, s:s, s:s, s:b}]", "apiVersion", "v1", "kind",
                                      "Node", "name", in->node, "uid", in->node_uid, "controller",
                                      1));
    return json_pack("{s:s, s:s, s:o, s:{s:s, s:s, s:{s:s, s:I, s:I}, s:o}}", "apiVersion",
                     "resource.k8s.io/v1", "kind", "ResourceSlice", "metadata", meta, "spec",
                     "driver", DRA_DRIVER, "nodeName", in->node, "pool", "name", in->node,
                     "generation", (json_int_t)in->generation, "resourceSliceCount",
                     (json_int_t)1, "devices", devices);
}

int dra_node_gpu_conflicts(const json_t *node, char *buf, size_t cap)
{
    static const char *const names[] = {"kgpu.io/gpu-mem", "kgpu.io/gpu-core", "nvidia.com/gpu",
                                        "aliyun.com/gpu-mem"};
    const json_t *alloc = json_object_get(json_object_get(node, "status"), "allocatable");
    int n = 0;
    size_t len = 0;
    if (cap > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *q = json_string_value(json_object_get(alloc, names[i]));
        int64_t v;
        if (q == NULL || kgpu_quantity_value(q, &v, NULL) != 0 || v <= 0)
            continue;
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s=%.20s", n ? ", " : "", names[i],
                                    q);
        n++;
    }
    return n;
}

/*
 * A copy of `v` in which every string that reads as a quantity under
 * `capacity` is its value: the server may write 40960Mi back as 40Gi.
 */
static json_t *normalize(const json_t *v, bool in_capacity)
{
    if (json_is_string(v) && in_capacity) {
        int64_t q;
        if (kgpu_quantity_value(json_string_value(v), &q, NULL) == 0)
            return json_integer(q);
        return json_deep_copy(v);
    }
    if (json_is_object(v)) {
        json_t *out = json_object();
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            json_object_set_new(out, k, normalize(x, in_capacity || strcmp(k, "capacity") == 0));
        }
        return out;
    }
    if (json_is_array(v)) {
        json_t *out = json_array();
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) json_array_append_new(out, normalize(x, in_capacity));
        return out;
    }
    return json_deep_copy(v);
}

static bool same_at(const json_t *a, const json_t *b, const char *path)
{
    const json_t *x = a, *y = b;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k != NULL;
         k = strtok_r(NULL, ".", &save)) {
        x = json_object_get(x, k);
        y = json_object_get(y, k);
    }
    if (x == NULL || y == NULL)
        return x == y;
    json_t *nx = normalize(x, false), *ny = normalize(y, false);
    bool same = json_equal(nx, ny);
    json_decref(nx);
    json_decref(ny);
    return same;
}

static bool same_owner(const json_t *have, const json_t *want)
{
    const json_t *w = json_object_get(json_object_get(want, "metadata"), "ownerReferences");
    if (w == NULL)
        return true; /* no Node UID known yet: whatever is there stays */
    const json_t *h = json_object_get(json_object_get(have, "metadata"), "ownerReferences");
    const char *uid = json_string_value(json_object_get(json_array_get(w, 0), "uid"));
    size_t i;
    json_t *o;
    json_array_foreach(h, i, o)
    {
        const char *u = json_string_value(json_object_get(o, "uid"));
        if (u != NULL && uid != NULL && strcmp(u, uid) == 0)
            return true;
    }
    return false;
}

bool dra_slice_same(const json_t *have, const json_t *want)
{
    return same_at(have, want, "spec.driver") && same_at(have, want, "spec.nodeName") &&
           same_at(have, want, "spec.pool.name") &&
           same_at(have, want, "spec.pool.resourceSliceCount") &&
           same_at(have, want, "spec.devices") && same_owner(have, want);
}
