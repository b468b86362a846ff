/*
 * DRA in the extender: nodes whose GPUs kgpu-dra-plugin serves (labelled
 * kgpu.io/gpu-allocator=dra) take their GPUs from the driver's
 * ResourceSlice instead of the device plugin's annotation, and the
 * ResourceClaims kube-scheduler's allocator filled in charge the devices
 * they got, so that the configured policy scores DRA nodes from the same
 * model, with the same kgpu_policy_node_scores, as device-plugin nodes.
 *
 * Why it is built this way: kube-scheduler's DRA allocator picks devices
 * first-fit on whatever node kube-scheduler chose; the only lever kgpu has
 * on that choice is prioritize, so a DRA pod (one with resourceClaims, and
 * no extended resource: it reaches the prioritize-gpuless entry) is scored
 * by its claim's request. Nothing here ever refuses a pod: the DRA plugin
 * is the authority on fit.
 *
 * Terms: a slice's pool is named after its node; a claim's allocation
 * result names pool and device; a device is charged as a whole GPU when it
 * consumes all of the GPU's memory (or names no consumedCapacity, as
 * without consumable capacity), else as a share of cores x 10 milli and its
 * memory. Charges are kept per result, so release is exact, and a relist
 * of claims or a rebuild of the inventory charges every claim again from
 * nothing: no double charge. Only claims that name class or driver
 * gpu.kgpu.io are kept.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ext.h"

#define SLICES "/apis/resource.k8s.io/v1/resourceslices"
#define CLAIMS "/apis/resource.k8s.io/v1/resourceclaims"
#define MIB    (1024 * 1024)
/* "namespace/name" of a claim: a DNS label, '/', a name. */
#define EXT_DRA_KEY_MAX (64 + KGPU_NAME_MAX + 2)

/* ---- parsers of outside input ---- */

static const char *str_at(const json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

/* A quantity member: 0 and *out, 1 when absent, -1 when not a quantity. */
static int quantity_at(const json_t *obj, const char *key, int64_t *out)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v))
        return 1;
    if (json_is_integer(v)) { /* the API server writes strings; a hand-made object may not */
        *out = json_integer_value(v);
        return *out < 0 ? -1 : 0;
    }
    if (!json_is_string(v) || kgpu_quantity_value(json_string_value(v), out, NULL) != 0 || *out < 0)
        return -1;
    return 0;
}

/* A device attribute's value: {"int": n}, {"string": s}. */
static const json_t *attr(const json_t *dev, const char *name, const char *type)
{
    return json_object_get(json_object_get(json_object_get(dev, "attributes"), name), type);
}

int ext_dra_slice_parse(const json_t *obj, ext_dra_slice *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    const json_t *meta = json_object_get(obj, "metadata"), *spec = json_object_get(obj, "spec");
    const char *name = str_at(meta, "name"), *driver = str_at(spec, "driver");
    if (!json_is_object(obj) || name == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice without metadata.name");
    if (driver == NULL || strcmp(driver, EXT_DRA_DRIVER) != 0)
        return kgpu_error_set(err, KGPU_ENOENT, "ResourceSlice %.200s is another driver's", name);
    if (strlen(name) > KGPU_NAME_MAX)
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %.200s...: name too long", name);
    snprintf(out->name, sizeof(out->name), "%s", name);
    const json_t *pool = json_object_get(spec, "pool");
    const char *node = str_at(spec, "nodeName"), *pname = str_at(pool, "name");
    if (node == NULL || node[0] == '\0' || strlen(node) > KGPU_NAME_MAX)
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: spec.nodeName missing", name);
    if (pname == NULL || strcmp(pname, node) != 0)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "ResourceSlice %s: pool %.200s is not named after node %s", name,
                              pname ? pname : "(none)", node);
    snprintf(out->node, sizeof(out->node), "%s", node);
    const json_t *gen = json_object_get(pool, "generation");
    out->generation = json_is_integer(gen) ? json_integer_value(gen) : 0;
    const json_t *devs = json_object_get(spec, "devices");
    if (devs != NULL && !json_is_array(devs))
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: spec.devices is not a list",
                              name);
    if (json_array_size(devs) > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: %zu devices, at most %d", name,
                              json_array_size(devs), KGPU_MAX_GPUS_PER_NODE);
    size_t i;
    const json_t *dev;
    json_array_foreach(devs, i, dev)
    {
        ext_dra_device *d = &out->devices[out->ndevices];
        const char *dname = str_at(dev, "name");
        const json_t *index = attr(dev, "index", "int"), *numa = attr(dev, "numaNode", "int");
        const char *uuid = json_string_value(attr(dev, "uuid", "string"));
        const char *model = json_string_value(attr(dev, "productName", "string"));
        if (model == NULL)
            model = json_string_value(attr(dev, "model", "string"));
        if (dname == NULL || strlen(dname) >= sizeof(d->name))
            return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: devices[%zu] has no name",
                                  name, i);
        if (!json_is_integer(index) || json_integer_value(index) < 0 ||
            json_integer_value(index) > 1023)
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "ResourceSlice %s: device %s: attribute index is not 0..1023",
                                  name, dname);
        if (model == NULL || model[0] == '\0' || strlen(model) >= sizeof(d->model))
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "ResourceSlice %s: device %s: no productName or model", name,
                                  dname);
        int64_t bytes = 0;
        int q = quantity_at(json_object_get(json_object_get(dev, "capacity"), "memory"), "value",
                            &bytes);
        const json_t *mib = attr(dev, "memoryMiB", "int");
        if (q < 0)
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "ResourceSlice %s: device %s: capacity memory is not a quantity",
                                  name, dname);
        d->memory_mib = q == 0 ? bytes / MIB : json_is_integer(mib) ? json_integer_value(mib) : 0;
        if (d->memory_mib <= 0 || d->memory_mib > ((int64_t)1 << 40))
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "ResourceSlice %s: device %s: no memory capacity", name, dname);
        snprintf(d->name, sizeof(d->name), "%s", dname);
        d->index = (int)json_integer_value(index);
        snprintf(d->uuid, sizeof(d->uuid), "%s", uuid ? uuid : "");
        snprintf(d->model, sizeof(d->model), "%s", model);
        d->numa = json_is_integer(numa) && json_integer_value(numa) >= 0 &&
                          json_integer_value(numa) <= 1023
                      ? (int)json_integer_value(numa)
                      : -1;
        for (int k = 0; k < out->ndevices; k++)
            if (out->devices[k].index == d->index || strcmp(out->devices[k].name, d->name) == 0)
                return kgpu_error_set(err, KGPU_EPARSE,
                                      "ResourceSlice %s: devices %s and %s have one index or name",
                                      name, out->devices[k].name, d->name);
        out->ndevices++;
    }
    return 0;
}

/* Whether a request (or one of its firstAvailable subrequests) names class gpu.kgpu.io. */
static bool names_class(const json_t *r)
{
    const char *cls = str_at(json_object_get(r, "exactly"), "deviceClassName");
    if (cls != NULL && strcmp(cls, EXT_DRA_CLASS) == 0)
        return true;
    size_t i;
    const json_t *sub;
    json_array_foreach(json_object_get(r, "firstAvailable"), i, sub)
    {
        cls = str_at(sub, "deviceClassName");
        if (cls != NULL && strcmp(cls, EXT_DRA_CLASS) == 0)
            return true;
    }
    return false;
}

static bool ours_result(const json_t *res)
{
    const char *driver = str_at(res, "driver");
    return driver != NULL && strcmp(driver, EXT_DRA_DRIVER) == 0;
}

/* Reads one request under `exactly`; false with c->error set. */
static bool read_request(ext_dra_claim *c, const json_t *r, ext_dra_request *q)
{
    const json_t *ex = json_object_get(r, "exactly");
    const char *rname = str_at(r, "name");
    rname = rname ? rname : "?";
    memset(q, 0, sizeof(*q));
    q->count = 1;
    const char *mode = str_at(ex, "allocationMode");
    const json_t *count = json_object_get(ex, "count");
    if (mode != NULL && strcmp(mode, "All") == 0) {
        q->all = true;
    } else if (mode != NULL && strcmp(mode, "ExactCount") != 0) {
        snprintf(c->error, sizeof(c->error), "request %.40s: allocationMode %.40s", rname, mode);
        return false;
    }
    if (count != NULL && (!json_is_integer(count) || json_integer_value(count) < 1 ||
                          json_integer_value(count) > KGPU_MAX_GPUS_PER_NODE)) {
        snprintf(c->error, sizeof(c->error), "request %.40s: count is not 1..%d", rname,
                 KGPU_MAX_GPUS_PER_NODE);
        return false;
    }
    if (count != NULL)
        q->count = (int)json_integer_value(count);
    const json_t *reqs = json_object_get(json_object_get(ex, "capacity"), "requests");
    int64_t mem = 0, cores = 0;
    int qm = quantity_at(reqs, "memory", &mem), qc = quantity_at(reqs, "cores", &cores);
    if (qm < 0 || qc < 0 || (qc == 0 && cores > 100)) {
        snprintf(c->error, sizeof(c->error),
                 "request %.40s: capacity.requests memory or cores is not a quantity in range",
                 rname);
        return false;
    }
    q->memory_mib = qm == 0 ? (mem + MIB - 1) / MIB : 0;
    q->cores = qc == 0 ? (int)cores : 0;
    return true;
}

/* Reads one allocation result of gpu.kgpu.io; false with c->error set. */
static bool read_result(ext_dra_claim *c, const json_t *res, ext_dra_result *out)
{
    const char *pool = str_at(res, "pool"), *dev = str_at(res, "device");
    memset(out, 0, sizeof(*out));
    if (pool == NULL || dev == NULL || pool[0] == '\0' || strlen(pool) > KGPU_NAME_MAX ||
        strlen(dev) >= sizeof(out->device)) {
        snprintf(c->error, sizeof(c->error), "an allocation result without pool or device");
        return false;
    }
    snprintf(out->pool, sizeof(out->pool), "%s", pool);
    snprintf(out->device, sizeof(out->device), "%s", dev);
    const json_t *cc = json_object_get(res, "consumedCapacity");
    int64_t mem = 0, cores = 0;
    int qm = quantity_at(cc, "memory", &mem), qc = quantity_at(cc, "cores", &cores);
    if ((cc != NULL && !json_is_object(cc) && !json_is_null(cc)) || qm < 0 || qc < 0 ||
        (qm == 0 && mem < MIB) || (qc == 0 && cores > 100)) {
        snprintf(c->error, sizeof(c->error),
                 "device %.60s of pool %.60s: consumedCapacity out of range", dev, pool);
        return false;
    }
    out->memory_mib = qm == 0 ? (mem + MIB - 1) / MIB : -1;
    out->cores = qc == 0 ? (int)cores : 0;
    return true;
}

/* A claim's namespace and name, when it has both and they fit; else false. */
static bool claim_named(const json_t *obj, const char **ns, const char **name)
{
    const json_t *meta = json_object_get(obj, "metadata");
    *ns = str_at(meta, "namespace");
    *name = str_at(meta, "name");
    return json_is_object(obj) && *ns != NULL && *name != NULL && (*ns)[0] != '\0' &&
           (*name)[0] != '\0' && strlen(*ns) < sizeof(((ext_dra_claim *)0)->ns) &&
           strlen(*name) <= KGPU_NAME_MAX;
}

/*
 * A claim's requests and allocation results, and whether it is kgpu's: a
 * request names class gpu.kgpu.io or a result driver gpu.kgpu.io (*nres:
 * how many results do).
 */
static bool claim_ours(const json_t *obj, const json_t **reqs, const json_t **results, size_t *nres)
{
    *reqs = json_object_get(json_object_get(json_object_get(obj, "spec"), "devices"), "requests");
    *results = json_object_get(
        json_object_get(json_object_get(json_object_get(obj, "status"), "allocation"), "devices"),
        "results");
    size_t i;
    bool ours = false;
    const json_t *v;
    *nres = 0;
    json_array_foreach(*reqs, i, v) ours = ours || names_class(v);
    json_array_foreach(*results, i, v) *nres += ours_result(v);
    return ours || *nres > 0;
}

int ext_dra_claim_parse(const json_t *obj, ext_dra_claim **out, kgpu_error *err)
{
    *out = NULL;
    const char *ns, *name;
    if (!claim_named(obj, &ns, &name))
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceClaim without namespace and name");
    const char *uid = str_at(json_object_get(obj, "metadata"), "uid");
    const json_t *reqs, *results;
    size_t i, nres;
    const json_t *v;
    if (!claim_ours(obj, &reqs, &results, &nres))
        return 0;
    bool too_many = nres > EXT_DRA_RESULTS;
    if (too_many)
        nres = 0;
    ext_dra_claim *c = calloc(1, sizeof(*c) + nres * sizeof(ext_dra_result));
    if (c == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    snprintf(c->ns, sizeof(c->ns), "%s", ns);
    snprintf(c->name, sizeof(c->name), "%s", name);
    snprintf(c->uid, sizeof(c->uid), "%.63s", uid ? uid : "");
    *out = c;
    if (too_many) {
        snprintf(c->error, sizeof(c->error), "more than %d devices of %s allocated",
                 EXT_DRA_RESULTS, EXT_DRA_DRIVER);
        return 0;
    }
    bool ok = true;
    json_array_foreach(reqs, i, v)
    {
        const char *cls = str_at(json_object_get(v, "exactly"), "deviceClassName");
        if (!ok || cls == NULL || strcmp(cls, EXT_DRA_CLASS) != 0)
            continue; /* firstAvailable: the DRA plugin's Score ranks those */
        if (c->nreq == EXT_DRA_REQUESTS) {
            snprintf(c->error, sizeof(c->error), "more than %d requests of class %s",
                     EXT_DRA_REQUESTS, EXT_DRA_CLASS);
            ok = false;
            break;
        }
        ok = read_request(c, v, &c->req[c->nreq]);
        c->nreq += ok;
    }
    json_array_foreach(results, i, v)
    {
        if (!ok || !ours_result(v))
            continue;
        ok = read_result(c, v, &c->res[c->nres]);
        c->nres += ok;
    }
    if (!ok)
        c->nreq = c->nres = 0; /* read nothing of a claim read in part */
    return 0;
}

bool ext_dra_node_labelled(const json_t *node)
{
    const char *v =
        str_at(json_object_get(json_object_get(node, "metadata"), "labels"), EXT_DRA_LABEL);
    return v != NULL && strcmp(v, EXT_DRA_LABEL_VALUE) == 0;
}

/* ---- the inventory: DRA nodes' GPUs from their slices ---- */

bool ext_dra_is_node(const ext_state *st, const char *name)
{
    return kgpu_strmap_get(&st->dra_nodes, name) != NULL;
}

/* spec's GPUs from node's slice into gpus (none without a slice). */
static void gpus_from_slice(ext_state *st, kgpu_node_spec *spec, kgpu_gpu_spec *gpus)
{
    const ext_dra_slice *s = kgpu_strmap_get(&st->dra_slices, spec->name);
    spec->gpus = gpus;
    spec->ngpus = s != NULL ? s->ndevices : 0;
    for (int i = 0; i < spec->ngpus; i++) {
        const ext_dra_device *d = &s->devices[i];
        gpus[i] = (kgpu_gpu_spec){.index = d->index,
                                  .uuid = d->uuid,
                                  .model = d->model,
                                  .memory_mib = d->memory_mib,
                                  .numa = d->numa,
                                  .healthy = true}; /* the driver publishes healthy GPUs only */
    }
}

void ext_dra_node_seen(ext_state *st, kgpu_node_spec *spec, bool dra, kgpu_gpu_spec *gpus)
{
    if (!dra) {
        free(kgpu_strmap_del(&st->dra_nodes, spec->name));
        return;
    }
    ext_dra_node *n = kgpu_strmap_get(&st->dra_nodes, spec->name);
    if (n == NULL) {
        if ((n = calloc(1, sizeof(*n))) == NULL ||
            !kgpu_strmap_put(&st->dra_nodes, spec->name, n, NULL)) {
            free(n);
            ext_log(EXT_ERROR, "DRA node %s: out of memory", spec->name);
            spec->ngpus = 0;
            return;
        }
        ext_log(EXT_INFO, "node %s is a DRA node: its GPUs come from its ResourceSlice",
                spec->name);
    }
    n->cpu_milli = spec->cpu_milli;
    n->memory_mib = spec->memory_mib;
    gpus_from_slice(st, spec, gpus);
}

void ext_dra_node_gone(ext_state *st, const char *name)
{
    free(kgpu_strmap_del(&st->dra_nodes, name));
}

void ext_dra_nodes_clear(ext_state *st)
{
    kgpu_strmap_clear_free(&st->dra_nodes);
}

/* A DRA node's inventory after its slice changed (one node: an upsert). */
static void refresh_node(ext_state *st, const char *node)
{
    const ext_dra_node *n = kgpu_strmap_get(&st->dra_nodes, node);
    if (n == NULL)
        return; /* not labelled (yet): the slice waits for the node */
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    kgpu_node_spec spec = {.name = node, .cpu_milli = n->cpu_milli, .memory_mib = n->memory_mib};
    gpus_from_slice(st, &spec, gpus);
    kgpu_error err;
    kgpu_error_clear(&err);
    if (ext_state_upsert_node(st, &spec, &err) != 0)
        ext_log(EXT_ERROR, "DRA node %s not updated: %s", node, err.msg);
}

/* Every DRA node's inventory again, in one rebuild (a slice relist). */
static void rebuild_all(ext_state *st)
{
    int n = kgpu_cluster_node_count(st->cluster), m = 0;
    size_t total = (size_t)n + st->dra_nodes.len + 1;
    kgpu_node_spec *specs = calloc(total, sizeof(*specs));
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc(total, sizeof(*gpus));
    if (specs == NULL || gpus == NULL) {
        ext_log(EXT_ERROR, "DRA nodes not updated: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const kgpu_node *node = kgpu_cluster_node(st->cluster, i);
        if (!ext_dra_is_node(st, node->name)) {
            ext_state_node_spec(st, i, &specs[m], gpus[m]);
            m++;
        }
    }
    size_t it = 0;
    const char *name;
    void *v;
    while (kgpu_strmap_next(&st->dra_nodes, &it, &name, &v)) {
        const ext_dra_node *dn = v;
        specs[m] = (kgpu_node_spec){
            .name = name, .cpu_milli = dn->cpu_milli, .memory_mib = dn->memory_mib};
        gpus_from_slice(st, &specs[m], gpus[m]);
        m += specs[m].ngpus > 0;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    if (ext_state_set_nodes(st, specs, m, &err) != 0)
        ext_log(EXT_ERROR, "DRA nodes not updated: %s", err.msg);
out:
    free(specs);
    free(gpus);
}

void ext_dra_slice_put(ext_state *st, const ext_dra_slice *s)
{
    ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, s->node);
    if (old != NULL && strcmp(old->name, s->name) != 0 && old->generation > s->generation) {
        ext_log(EXT_WARN, "ResourceSlice %s of node %s ignored: %s is newer", s->name, s->node,
                old->name);
        return;
    }
    if (old != NULL && memcmp(old, s, sizeof(*s)) == 0)
        return;
    if (old == NULL) {
        if ((old = malloc(sizeof(*old))) == NULL ||
            !kgpu_strmap_put(&st->dra_slices, s->node, old, NULL)) {
            free(old);
            ext_log(EXT_ERROR, "ResourceSlice %s: out of memory", s->name);
            return;
        }
    }
    *old = *s;
    refresh_node(st, s->node);
}

void ext_dra_slice_gone(ext_state *st, const char *name, const char *node)
{
    ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, node);
    if (old == NULL || strcmp(old->name, name) != 0)
        return; /* another slice of the node's is in force */
    free(kgpu_strmap_del(&st->dra_slices, node));
    refresh_node(st, node);
}

void ext_dra_slices_reset(ext_state *st, const ext_dra_slice *s, int n)
{
    kgpu_strmap_clear_free(&st->dra_slices);
    for (int i = 0; i < n; i++) {
        ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, s[i].node), *copy;
        if (old != NULL && old->generation >= s[i].generation)
            continue;
        if (old != NULL) {
            *old = s[i];
        } else if ((copy = malloc(sizeof(*copy))) != NULL) {
            *copy = s[i];
            if (!kgpu_strmap_put(&st->dra_slices, s[i].node, copy, NULL))
                free(copy);
        }
    }
    rebuild_all(st);
}

/* ---- claims: charging what the allocator gave out ---- */

static int unapplied(const ext_dra_claim *c)
{
    int n = 0;
    for (int i = 0; i < c->nres; i++)
        n += !c->res[i].applied;
    return n;
}

/* Charges one result; NULL, or why not (nothing charged then). */
static const char *charge_result(ext_state *st, ext_dra_result *r, kgpu_error *err)
{
    int idx = kgpu_cluster_find_node(st->cluster, r->pool);
    const ext_dra_slice *s = kgpu_strmap_get(&st->dra_slices, r->pool);
    if (!ext_dra_is_node(st, r->pool))
        return "its node is not labelled " EXT_DRA_LABEL "=" EXT_DRA_LABEL_VALUE;
    if (idx < 0 || s == NULL)
        return "its node has no GPUs in kgpu's inventory";
    int index = -1;
    for (int i = 0; i < s->ndevices; i++)
        if (strcmp(s->devices[i].name, r->device) == 0)
            index = s->devices[i].index;
    const kgpu_node *node = kgpu_cluster_node(st->cluster, idx);
    int pos = -1;
    for (int i = 0; i < node->ngpus && index >= 0; i++)
        if (node->gpus[i].index == index)
            pos = i;
    if (pos < 0)
        return "the node's slice has no such device";
    kgpu_request req;
    memset(&req, 0, sizeof(req));
    req.gpu_count = 1;
    req.models = ~0ULL;
    req.shape = -1;
    if (r->memory_mib < 0 || r->memory_mib >= node->gpus[pos].memory_mib) {
        req.exclusive = true; /* all of its memory: nothing else fits beside it */
        req.gpu_milli = KGPU_MILLI;
    } else {
        req.gpu_milli = r->cores * (KGPU_MILLI / 100);
        req.gpu_memory_mib = r->memory_mib;
    }
    if (kgpu_cluster_apply(st->cluster, &req, idx, &pos, &r->a, err) != 0)
        return err->msg;
    r->applied = true;
    return NULL;
}

/* Charges c's results that are not charged; logs the first failure once per claim. */
static void charge(ext_state *st, ext_dra_claim *c)
{
    for (int i = 0; i < c->nres; i++) {
        if (c->res[i].applied)
            continue;
        kgpu_error err;
        kgpu_error_clear(&err);
        const char *why = charge_result(st, &c->res[i], &err);
        if (why != NULL && !c->warned) {
            c->warned = true;
            ext_log(why == err.msg ? EXT_WARN : EXT_DEBUG,
                    "ResourceClaim %s/%s: device %s of pool %s cannot be counted now (%s); "
                    "retried when the inventory or the claims change",
                    c->ns, c->name, c->res[i].device, c->res[i].pool, why);
        }
    }
}

/* Releases what c holds, newest first. */
static void uncharge(ext_state *st, ext_dra_claim *c)
{
    for (int i = c->nres - 1; i >= 0; i--) {
        if (!c->res[i].applied)
            continue;
        kgpu_error err;
        if (kgpu_cluster_release(st->cluster, &c->res[i].a, &err) != 0)
            ext_log(EXT_ERROR, "ResourceClaim %s/%s: release failed: %s", c->ns, c->name, err.msg);
        c->res[i].applied = false;
    }
}

/* The key of claim ns/name in st->dra_claims (buf: EXT_DRA_KEY_MAX bytes). */
static void claim_key(char *buf, const char *ns, const char *name)
{
    snprintf(buf, EXT_DRA_KEY_MAX, "%.63s/%s", ns, name);
}

/* Forgets a held claim: released, out of the map, freed. Returns whether it held anything. */
static bool drop_claim(ext_state *st, const char *key)
{
    ext_dra_claim *c = kgpu_strmap_del(&st->dra_claims, key);
    if (c == NULL)
        return false;
    bool held = unapplied(c) < c->nres;
    st->dra_unapplied -= unapplied(c);
    uncharge(st, c);
    free(c);
    return held;
}

void ext_dra_claim_put(ext_state *st, ext_dra_claim *c)
{
    char key[EXT_DRA_KEY_MAX];
    claim_key(key, c->ns, c->name);
    bool released = drop_claim(st, key);
    if (st->dra_claims.len >= EXT_DRA_CLAIMS_MAX) {
        ext_log(EXT_ERROR, "ResourceClaim %s ignored: kgpu holds %d claims already", key,
                EXT_DRA_CLAIMS_MAX);
        free(c);
    } else if (!kgpu_strmap_put(&st->dra_claims, key, c, NULL)) {
        ext_log(EXT_ERROR, "ResourceClaim %s ignored: out of memory", key);
        free(c);
    } else {
        if (c->error[0] != '\0')
            ext_log(EXT_WARN, "ResourceClaim %s cannot be read: %s", key, c->error);
        charge(st, c);
        st->dra_unapplied += unapplied(c);
    }
    if (released)
        ext_dra_retry(st); /* what it held may be what another claim waits for */
}

void ext_dra_claim_gone(ext_state *st, const char *ns, const char *name)
{
    char key[EXT_DRA_KEY_MAX];
    claim_key(key, ns, name);
    if (drop_claim(st, key))
        ext_dra_retry(st);
}

void ext_dra_claims_reset(ext_state *st, ext_dra_claim **c, int n)
{
    size_t it = 0;
    const char *k;
    void *v;
    while (kgpu_strmap_next(&st->dra_claims, &it, &k, &v))
        uncharge(st, v);
    kgpu_strmap_clear_free(&st->dra_claims);
    st->dra_unapplied = 0;
    for (int i = 0; i < n; i++) {
        char key[EXT_DRA_KEY_MAX];
        claim_key(key, c[i]->ns, c[i]->name);
        void *old = NULL;
        if (st->dra_claims.len >= EXT_DRA_CLAIMS_MAX ||
            !kgpu_strmap_put(&st->dra_claims, key, c[i], &old)) {
            ext_log(EXT_ERROR, "ResourceClaim %s ignored: kgpu holds %zu claims", key,
                    st->dra_claims.len);
            free(c[i]);
            continue;
        }
        free(old); /* a list names each claim once; a duplicate replaces */
        if (c[i]->error[0] != '\0')
            ext_log(EXT_WARN, "ResourceClaim %s cannot be read: %s", key, c[i]->error);
    }
    ext_dra_cluster_rebuilt(st);
}

/* Charges every result not charged now, and counts those that still cannot be. */
static void charge_all(ext_state *st)
{
    size_t it = 0;
    const char *k;
    void *v;
    st->dra_unapplied = 0;
    while (kgpu_strmap_next(&st->dra_claims, &it, &k, &v)) {
        ext_dra_claim *c = v;
        charge(st, c);
        st->dra_unapplied += unapplied(c);
    }
}

void ext_dra_cluster_rebuilt(ext_state *st)
{
    size_t it = 0;
    const char *k;
    void *v;
    /* The cluster holds none of the old charges: every result is charged afresh. */
    while (kgpu_strmap_next(&st->dra_claims, &it, &k, &v)) {
        ext_dra_claim *c = v;
        for (int i = 0; i < c->nres; i++)
            c->res[i].applied = false;
    }
    charge_all(st);
}

void ext_dra_retry(ext_state *st)
{
    if (st->dra_unapplied > 0)
        charge_all(st);
}

/* ---- prioritize: a DRA pod's request ---- */

/* The request of claim request q: a whole GPU unless it names its memory (DRA's default is all). */
static void request_of(const ext_dra_request *q, kgpu_request *req)
{
    memset(req, 0, sizeof(*req));
    req->gpu_count = q->count;
    req->shape = -1;
    if (q->memory_mib == 0) {
        req->exclusive = true;
        req->gpu_milli = KGPU_MILLI;
    } else {
        req->gpu_milli = q->cores * (KGPU_MILLI / 100);
        req->gpu_memory_mib = q->memory_mib;
    }
}

int ext_dra_pod_request(ext_state *st, const json_t *pod, kgpu_request *req, char *why, size_t len)
{
    const json_t *meta = json_object_get(pod, "metadata");
    const json_t *claims = json_object_get(json_object_get(pod, "spec"), "resourceClaims");
    const json_t *statuses =
        json_object_get(json_object_get(pod, "status"), "resourceClaimStatuses");
    const char *ns = str_at(meta, "namespace"), *pname = str_at(meta, "name");
    ns = ns != NULL ? ns : "default";
    pname = pname != NULL ? pname : "?";
    why[0] = '\0';
    if (json_array_size(claims) == 0)
        return 0;
    size_t i, j;
    const json_t *rc, *s;
    json_array_foreach(claims, i, rc)
    {
        const char *entry = str_at(rc, "name"), *claim = str_at(rc, "resourceClaimName");
        const char *tmpl = str_at(rc, "resourceClaimTemplateName");
        entry = entry ? entry : "?";
        if (claim == NULL && tmpl != NULL) {
            json_array_foreach(statuses, j, s)
            {
                const char *sn = str_at(s, "name");
                if (sn != NULL && strcmp(sn, entry) == 0)
                    claim = str_at(s, "resourceClaimName");
            }
            if (claim == NULL) {
                if (why[0] == '\0')
                    snprintf(why, len,
                             "pod %s/%s: claim %.60s (template %.60s) has no ResourceClaim in "
                             "status.resourceClaimStatuses yet",
                             ns, pname, entry, tmpl);
                continue;
            }
        }
        if (claim == NULL) {
            if (why[0] == '\0')
                snprintf(why, len, "pod %s/%s: claim %.60s names no ResourceClaim", ns, pname,
                         entry);
            continue;
        }
        char key[EXT_DRA_KEY_MAX];
        claim_key(key, ns, claim);
        const ext_dra_claim *c = kgpu_strmap_get(&st->dra_claims, key);
        if (c == NULL) {
            if (why[0] == '\0')
                snprintf(why, len,
                         "pod %s/%s: ResourceClaim %s is not known to kgpu (not of class %s, or "
                         "not seen yet)",
                         ns, pname, key, EXT_DRA_CLASS);
            continue;
        }
        if (c->error[0] != '\0') {
            if (why[0] == '\0')
                snprintf(why, len, "pod %s/%s: ResourceClaim %s cannot be read: %s", ns, pname, key,
                         c->error);
            continue;
        }
        for (int k = 0; k < c->nreq; k++) {
            if (c->req[k].all) {
                if (why[0] == '\0')
                    snprintf(why, len,
                             "pod %s/%s: ResourceClaim %s asks for all devices "
                             "(allocationMode All): not scored",
                             ns, pname, key);
                continue;
            }
            request_of(&c->req[k], req);
            return 1;
        }
    }
    if (why[0] == '\0')
        snprintf(why, len, "pod %s/%s: none of its ResourceClaims asks for class %s", ns, pname,
                 EXT_DRA_CLASS);
    return -1;
}

/* ---- reflectors ---- */

/*
 * 404 for resource.k8s.io/v1 means a server without DRA (older than 1.34,
 * or the API group off): DRA support is off, said once; the reflector's
 * relist at its backoff (up to 30 s) is the check for it coming back.
 */
static void absent_or_restart(ext_daemon *d, int which, const char *why)
{
    static const char *const what[] = {"ResourceSlice", "ResourceClaim"};
    bool absent = strstr(why, "HTTP 404") != NULL;
    ext_state *st = &d->state;
    pthread_mutex_lock(&st->mu);
    if (absent && !st->dra_absent[which]) {
        ext_log(EXT_WARN,
                "DRA: the API server has no %s resource (%s is 404: no resource.k8s.io/v1); "
                "DRA support is off until it has (checked again at most every 30 s)",
                what[which], which == 0 ? SLICES : CLAIMS);
        if (which == 0 && st->dra_slices.len > 0)
            ext_dra_slices_reset(st, NULL, 0);
        if (which == 1 && st->dra_claims.len > 0)
            ext_dra_claims_reset(st, NULL, 0);
    } else if (!absent) {
        ext_log(EXT_WARN, "%s watch restarts: %s", what[which], why);
    }
    st->dra_absent[which] = st->dra_absent[which] || absent;
    pthread_mutex_unlock(&st->mu);
}

static void served(ext_state *st, int which)
{
    if (st->dra_absent[which])
        ext_log(EXT_INFO, "DRA: resource.k8s.io/v1 %s are served now",
                which == 0 ? "ResourceSlices" : "ResourceClaims");
    st->dra_absent[which] = false;
}

/* Listed objects are cut as their page arrives: what is not ours, to nothing. */
static void slices_trim(void *ctx, json_t *obj)
{
    (void)ctx;
    const char *driver = str_at(json_object_get(obj, "spec"), "driver");
    if (driver == NULL || strcmp(driver, EXT_DRA_DRIVER) != 0)
        json_object_clear(obj);
    else
        json_object_del(json_object_get(obj, "metadata"), "managedFields");
}

static void claims_trim(void *ctx, json_t *obj)
{
    (void)ctx;
    const char *ns, *name;
    const json_t *reqs, *results;
    size_t nres;
    /* What ext_dra_claim_parse would refuse or find not ours, without reading the rest. */
    if (!claim_named(obj, &ns, &name) || !claim_ours(obj, &reqs, &results, &nres)) {
        json_object_clear(obj);
        return;
    }
    json_t *meta = json_object_get(obj, "metadata");
    json_object_del(meta, "managedFields");
    json_object_del(meta, "annotations");
    json_t *status = json_object_get(obj, "status");
    json_object_del(status, "reservedFor"); /* up to 256 pods */
    json_object_del(status, "devices");
}

static void slices_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
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
    pthread_mutex_lock(&d->state.mu);
    served(&d->state, 0);
    ext_dra_slices_reset(&d->state, s, (int)m);
    pthread_mutex_unlock(&d->state.mu);
    ext_log(EXT_INFO, "DRA: %zu ResourceSlices of %s", m, EXT_DRA_DRIVER);
    free(s);
}

static void slices_event(void *ctx, const char *type, json_t *obj)
{
    ext_daemon *d = ctx;
    ext_dra_slice *s = malloc(sizeof(*s));
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = s != NULL ? ext_dra_slice_parse(obj, s, &err) : KGPU_ENOMEM;
    if (rc == 0) {
        pthread_mutex_lock(&d->state.mu);
        if (strcmp(type, "DELETED") == 0)
            ext_dra_slice_gone(&d->state, s->name, s->node);
        else
            ext_dra_slice_put(&d->state, s);
        pthread_mutex_unlock(&d->state.mu);
    } else if (rc != KGPU_ENOENT) {
        ext_log(EXT_WARN, "%s; ignored", rc == KGPU_ENOMEM ? "out of memory" : err.msg);
    }
    free(s);
}

static void slices_restart(void *ctx, const char *why)
{
    absent_or_restart(ctx, 0, why);
}

static void claims_reset(void *ctx, json_t *items)
{
    ext_daemon *d = ctx;
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
    pthread_mutex_lock(&d->state.mu);
    served(&d->state, 1);
    ext_dra_claims_reset(&d->state, c, (int)m);
    int waiting = d->state.dra_unapplied;
    pthread_mutex_unlock(&d->state.mu);
    ext_log(EXT_INFO, "DRA: %zu ResourceClaims of %s (%zu listed); %d devices not counted now", m,
            EXT_DRA_CLASS, n, waiting);
    free(c);
    ext_malloc_trim();
}

static void claims_event(void *ctx, const char *type, json_t *obj)
{
    ext_daemon *d = ctx;
    const json_t *meta = json_object_get(obj, "metadata");
    const char *ns = str_at(meta, "namespace"), *name = str_at(meta, "name");
    if (ns == NULL || name == NULL)
        return;
    ext_dra_claim *c = NULL;
    kgpu_error err;
    kgpu_error_clear(&err);
    if (strcmp(type, "DELETED") != 0 && ext_dra_claim_parse(obj, &c, &err) != 0) {
        ext_log(EXT_WARN, "%s; ignored", err.msg);
        return;
    }
    pthread_mutex_lock(&d->state.mu);
    if (c != NULL)
        ext_dra_claim_put(&d->state, c);
    else /* deleted, or no longer ours */
        ext_dra_claim_gone(&d->state, ns, name);
    pthread_mutex_unlock(&d->state.mu);
}

static void claims_restart(void *ctx, const char *why)
{
    absent_or_restart(ctx, 1, why);
}

static void *watch_slices(void *arg)
{
    ext_daemon *d = arg;
    static const kgpu_reflector_ops ops = {slices_reset, slices_event, slices_restart, slices_trim};
    /* spec.driver is a field selector of ResourceSlices; the parser checks it again. */
    kgpu_reflector_run(d->k8s, SLICES, "fieldSelector=spec.driver%3D" EXT_DRA_DRIVER, &ops, d,
                       &d->stop);
    return NULL;
}

static void *watch_claims(void *arg)
{
    ext_daemon *d = arg;
    static const kgpu_reflector_ops ops = {claims_reset, claims_event, claims_restart, claims_trim};
    kgpu_reflector_run(d->k8s, CLAIMS, NULL, &ops, d, &d->stop);
    return NULL;
}

int ext_dra_start(ext_daemon *d, kgpu_error *err)
{
    void *(*const threads[])(void *) = {watch_slices, watch_claims};
    for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
        if (pthread_create(&d->watch_threads[d->nwatch], NULL, threads[i], d) != 0)
            return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the DRA threads");
        d->nwatch++;
    }
    return 0;
}
