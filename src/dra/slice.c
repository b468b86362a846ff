/*
 * The node's ResourceSlices (resource.k8s.io/v1): one pool per node, named
 * after it; every GPU a device that allows multiple allocations, so
 * kube-scheduler itself places several claims on one GPU by consumable
 * capacity (KEP-5075), with no extender. A GPU in MIG mode also offers each
 * MIG profile at each allowed placement as a device consuming shared
 * counters (KEP-4815): kube-scheduler then never allocates two partitions
 * that overlap, nor a partition beside the whole GPU (dra.h, dra_slices_build).
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

void dra_mig_device_name(int index, const char *profile, int start, char *buf, size_t cap)
{
    /* "1g.5gb" -> "1g-5gb": device names are DNS labels, no dots. */
    char p[KGPU_MIG_NAME_MAX];
    snprintf(p, sizeof(p), "%s", profile);
    for (char *c = p; *c; c++)
        if (*c == '.' || *c == '+')
            *c = '-';
    snprintf(buf, cap, "gpu-%d-mig-%s-%d", index, p, start);
}

const kgpu_mig_model *dra_mig_model(const kgpu_gpu_info *g, bool mig)
{
    return mig && g->mig_mode == 1 ? kgpu_mig_model_find(g->model, g->memory_mib) : NULL;
}

bool dra_device_find(const kgpu_gpu_info *gpus, int ngpus, bool mig, const char *name,
                     dra_device_ref *out)
{
    char buf[DRA_DEVICE_MAX];
    for (int i = 0; name != NULL && i < ngpus; i++) {
        const kgpu_mig_model *m = dra_mig_model(&gpus[i], mig);
        dra_device_name(gpus[i].index, buf, sizeof(buf));
        if (strcmp(buf, name) == 0) {
            *out = (dra_device_ref){.gpu = i, .model = m, .profile = -1, .start = 0};
            return true;
        }
        for (int pi = 0; m != NULL && pi < m->nprofiles; pi++) {
            const kgpu_mig_profile *p = &m->profiles[pi];
            for (int s = 0; !p->media && s < p->nstarts; s++) {
                dra_mig_device_name(gpus[i].index, p->name, p->starts[s], buf, sizeof(buf));
                if (strcmp(buf, name) == 0) {
                    *out = (dra_device_ref){.gpu = i, .model = m, .profile = pi,
                                            .start = p->starts[s]};
                    return true;
                }
            }
        }
    }
    return false;
}

void dra_slice_name_at(const char *node, int k, char *buf, size_t cap)
{
    /* A node name is a DNS subdomain of at most 253; keep the driver suffix whole. */
    char suffix[32];
    snprintf(suffix, sizeof(suffix), "-%s", DRA_DRIVER);
    if (k > 0) /* two digits: kube-scheduler reads a pool's slices in name order */
        snprintf(suffix + strlen(suffix), sizeof(suffix) - strlen(suffix), "-%02d", k);
    int room = 253 - (int)strlen(suffix);
    snprintf(buf, cap, "%.*s%s", room, node, suffix);
}

void dra_slice_name(const char *node, char *buf, size_t cap)
{
    dra_slice_name_at(node, 0, buf, cap);
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

static void attr(json_t *attrs, const char *name, const char *type, json_t *v)
{
    json_object_set_new(attrs, name, json_pack("{s:o}", type, v));
}

/* What every device of GPU g says of it. */
static json_t *gpu_attributes(const kgpu_gpu_info *g, const char *cc)
{
    json_t *attrs = json_object();
    attr(attrs, "index", "int", json_integer(g->index));
    attr(attrs, "uuid", "string", json_string(g->uuid));
    attr(attrs, "model", "string", json_string(g->model));
    /* NVIDIA's own DRA driver calls the model productName; selectors written for it work. */
    attr(attrs, "productName", "string", json_string(g->model));
    attr(attrs, "memoryMiB", "int", json_integer(g->memory_mib));
    if (g->numa >= 0)
        attr(attrs, "numaNode", "int", json_integer(g->numa));
    if (g->pci_bus_id[0] != '\0')
        attr(attrs, "pciBusID", "string", json_string(g->pci_bus_id));
    if (cc != NULL && cc[0] != '\0') {
        /* A semantic version, so CEL can compare: "8.0" becomes 8.0.0. */
        char v[32];
        snprintf(v, sizeof(v), "%s%s", cc, strchr(cc, '.') != NULL ? ".0" : ".0.0");
        attr(attrs, "computeCapability", "version", json_string(v));
    }
    return attrs;
}

/*
 * An unhealthy GPU's devices stay published, tainted NoSchedule: no new claim
 * is allocated them, and the pods already running keep running, as on the
 * device-plugin path where kubelet only stops handing out an unhealthy
 * device. NoExecute would evict them on every flap of NVML's health; an
 * operator who wants that adds a DeviceTaintRule.
 */
static void taint(json_t *dev, const kgpu_gpu_info *g)
{
    if (!g->healthy)
        json_object_set_new(dev, "taints", json_pack("[{s:s, s:s}]", "key", DRA_TAINT_UNHEALTHY,
                                                     "effect", "NoSchedule"));
}

static void counter_set_name(int index, char *buf, size_t cap)
{
    snprintf(buf, cap, "gpu-%d-slices", index);
}

/*
 * The counters of a placement: memory slices [start, start + size) and
 * `compute` compute slices, as consumed from (or offered by) GPU g's set.
 */
static json_t *counters(int start, int size, int compute)
{
    json_t *c = json_object();
    for (int s = start; s < start + size && s < KGPU_MIG_MEM_SLICES; s++) {
        char name[32];
        snprintf(name, sizeof(name), "memory-slice-%d", s);
        json_object_set_new(c, name, json_pack("{s:o}", "value", int_quantity(1)));
    }
    json_object_set_new(c, "compute-slices", json_pack("{s:o}", "value", int_quantity(compute)));
    return c;
}

static json_t *consumes(int index, int start, int size, int compute)
{
    char set[48];
    counter_set_name(index, set, sizeof(set));
    return json_pack("[{s:s, s:o}]", "counterSet", set, "counters",
                     counters(start, size, compute));
}

/* The whole GPU, shareable; on a MIG GPU (m) its memory is the full-size instance's. */
static json_t *device(const kgpu_gpu_info *g, const char *cc, const kgpu_mig_model *m)
{
    char name[DRA_DEVICE_MAX];
    dra_device_name(g->index, name, sizeof(name));
    const kgpu_mig_profile *whole = kgpu_mig_profile_whole(m);
    int64_t bytes = (whole != NULL ? whole->memory_mib : g->memory_mib) * 1024 * 1024;
    json_t *mem = json_pack("{s:o, s:{s:o, s:{s:o, s:o}}}", "value", bytes_quantity(bytes),
                            "requestPolicy", "default", bytes_quantity(bytes), "validRange",
                            "min", bytes_quantity(1024 * 1024), "step",
                            bytes_quantity(1024 * 1024));
    json_t *cores = json_pack("{s:o, s:{s:o, s:{s:o, s:o, s:o}}}", "value", int_quantity(100),
                              "requestPolicy", "default", int_quantity(0), "validRange", "min",
                              int_quantity(0), "max", int_quantity(100), "step", int_quantity(1));
    json_t *dev = json_pack("{s:s, s:b, s:o, s:{s:o, s:o}}", "name", name,
                            "allowMultipleAllocations", 1, "attributes", gpu_attributes(g, cc),
                            "capacity", DRA_CAP_MEMORY, mem, DRA_CAP_CORES, cores);
    if (whole != NULL)
        /* All of the GPU's counters: charged once while any share of it is allocated. */
        json_object_set_new(dev, "consumesCounters",
                            consumes(g->index, 0, KGPU_MIG_MEM_SLICES, KGPU_MIG_COMPUTE_SLICES));
    taint(dev, g);
    return dev;
}

/* Profile p of GPU g at `start`: one instance, not shareable. */
static json_t *mig_device(const kgpu_gpu_info *g, const char *cc, const kgpu_mig_profile *p,
                          int start)
{
    char name[DRA_DEVICE_MAX];
    dra_mig_device_name(g->index, p->name, start, name, sizeof(name));
    json_t *attrs = gpu_attributes(g, cc);
    /*
     * index and uuid stay the parent GPU's (the instance's UUID is made at
     * Prepare): a selector written for whole GPUs must not fail on a
     * partition for want of the attribute (CEL: "no such key").
     */
    attr(attrs, "mig", "bool", json_true());
    attr(attrs, "profile", "string", json_string(p->name));
    attr(attrs, "migStart", "int", json_integer(start));
    attr(attrs, "migSize", "int", json_integer(p->size));
    attr(attrs, "parentIndex", "int", json_integer(g->index));
    attr(attrs, "parentUUID", "string", json_string(g->uuid));
    attr(attrs, "memoryMiB", "int", json_integer(p->memory_mib));
    attr(attrs, "multiprocessors", "int", json_integer(p->multiprocessors));
    json_t *dev = json_pack("{s:s, s:o, s:{s:{s:o}}, s:o}", "name", name, "attributes", attrs,
                            "capacity", DRA_CAP_MEMORY, "value",
                            bytes_quantity(p->memory_mib * 1024 * 1024), "consumesCounters",
                            consumes(g->index, start, p->size, p->compute));
    taint(dev, g);
    return dev;
}

/* GPU g's devices, in the order kube-scheduler should try them. */
static json_t *gpu_devices(const kgpu_gpu_info *g, const char *cc, const kgpu_mig_model *m)
{
    /* gpu-N first: a claim that names no profile gets a whole GPU or a share, as before. */
    json_t *devs = json_pack("[o]", device(g, cc, m));
    for (int pi = 0; m != NULL && pi < m->nprofiles; pi++) {
        const kgpu_mig_profile *p = &m->profiles[pi];
        if (p->media)
            continue; /* "+me" takes the GPU's one media engine set: not offered */
        int starts[KGPU_MIG_MAX_STARTS];
        int n = kgpu_mig_slice_order(m, pi, starts);
        for (int s = 0; s < n; s++)
            json_array_append_new(devs, mig_device(g, cc, p, starts[s]));
    }
    return devs;
}

static json_t *slice_object(const dra_slice_input *in, int k, int nslices, const char *what,
                            json_t *list)
{
    char name[256];
    dra_slice_name_at(in->node, k, name, sizeof(name));
    json_t *meta = json_pack("{s:s, s:{s:s}}", "name", name, "labels", "app.kubernetes.io/part-of",
                             "kgpu");
    if (in->node_uid != NULL && in->node_uid[0] != '\0')
        /* Deleting the Node deletes its slices (garbage collector). */
        json_object_set_new(meta, "ownerReferences",
                            json_pack("[{s:s, s:s, s:s, s:s, s:b}]", "apiVersion", "v1", "kind",
                                      "Node", "name", in->node, "uid", in->node_uid, "controller",
                                      1));
    return json_pack("{s:s, s:s, s:o, s:{s:s, s:s, s:{s:s, s:I, s:I}, s:o}}", "apiVersion",
                     "resource.k8s.io/v1", "kind", "ResourceSlice", "metadata", meta, "spec",
                     "driver", DRA_DRIVER, "nodeName", in->node, "pool", "name", in->node,
                     "generation", (json_int_t)in->generation, "resourceSliceCount",
                     (json_int_t)nslices, what, list);
}

json_t *dra_slices_build(const dra_slice_input *in)
{
    /* Device lists, whole GPUs to a list; then counter sets, DRA_SLICE_MAX_SETS to a list. */
    json_t *dev_lists = json_pack("[[]]"), *set_lists = json_array();
    for (int i = 0; i < in->ngpus; i++) {
        const kgpu_gpu_info *g = &in->gpus[i];
        const char *cc = in->compute_capability != NULL ? in->compute_capability[i] : NULL;
        const kgpu_mig_model *m = dra_mig_model(g, in->mig);
        json_t *devs = gpu_devices(g, cc, m);
        json_t *last = json_array_get(dev_lists, json_array_size(dev_lists) - 1);
        if (json_array_size(last) > 0 &&
            json_array_size(last) + json_array_size(devs) > DRA_SLICE_MAX_DEVICES) {
            last = json_array();
            json_array_append_new(dev_lists, last);
        }
        json_array_extend(last, devs);
        json_decref(devs);
        if (m == NULL)
            continue;
        char set[48];
        counter_set_name(g->index, set, sizeof(set));
        json_t *sets = json_array_get(set_lists, json_array_size(set_lists) - 1);
        if (sets == NULL || json_array_size(sets) >= DRA_SLICE_MAX_SETS) {
            sets = json_array();
            json_array_append_new(set_lists, sets);
        }
        json_array_append_new(sets, json_pack("{s:s, s:o}", "name", set, "counters",
                                              counters(0, KGPU_MIG_MEM_SLICES,
                                                       KGPU_MIG_COMPUTE_SLICES)));
    }
    int nd = (int)json_array_size(dev_lists), nslices = nd + (int)json_array_size(set_lists);
    json_t *out = json_array();
    size_t k;
    json_t *list;
    json_array_foreach(dev_lists, k, list) json_array_append_new(
        out, slice_object(in, (int)k, nslices, "devices", json_incref(list)));
    json_array_foreach(set_lists, k, list) json_array_append_new(
        out, slice_object(in, nd + (int)k, nslices, "sharedCounters", json_incref(list)));
    json_decref(dev_lists);
    json_decref(set_lists);
    return out;
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
 * `capacity` or `counters` is its value: the server may write 40960Mi back
 * as 40Gi. A taint's timeAdded, which the server adds, is left out.
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
            if (strcmp(k, "timeAdded") == 0)
                continue; /* the server stamps a taint's time */
            json_object_set_new(out, k,
                                normalize(x, in_capacity || strcmp(k, "capacity") == 0 ||
                                                 strcmp(k, "counters") == 0));
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
           same_at(have, want, "spec.devices") && same_at(have, want, "spec.sharedCounters") &&
           same_owner(have, want);
}
