/*
 * The DRA objects the extender reads: kgpu-dra-plugin's ResourceSlices
 * (gpu.kgpu.io: one per node, each GPU a device) and the ResourceClaims
 * that name its class or driver, parsed into fixed-size records and cut as
 * their list pages arrive. Pure: no state, no lock (fuzz_extdra).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kgpu/mig.h"
#include "sources.h"

#define MIB (1024 * 1024)
#define STR_(x) #x
#define STR(x)  STR_(x) /* a number macro as text */

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

uint64_t ext_dra_name_hash(const char *name)
{
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return h;
}

/* A whole GPU's device into d; 0, or an error naming slice and device. */
static int read_gpu(const char *name, size_t i, const json_t *dev, ext_dra_device *d,
                    kgpu_error *err)
{
    const char *dname = str_at(dev, "name");
    const json_t *index = attr(dev, "index", "int"), *numa = attr(dev, "numaNode", "int");
    const char *uuid = json_string_value(attr(dev, "uuid", "string"));
    const char *model = json_string_value(attr(dev, "productName", "string"));
    if (model == NULL)
        model = json_string_value(attr(dev, "model", "string"));
    if (dname == NULL || strlen(dname) >= sizeof(d->name))
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: devices[%zu] has no name", name,
                              i);
    if (!json_is_integer(index) || json_integer_value(index) < 0 ||
        json_integer_value(index) > 1023)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "ResourceSlice %s: device %s: attribute index is not 0..1023", name,
                              dname);
    if (model == NULL || model[0] == '\0' || strlen(model) >= sizeof(d->model))
        return kgpu_error_set(err, KGPU_EPARSE,
                              "ResourceSlice %s: device %s: no productName or model", name, dname);
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
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: device %s: no memory capacity",
                              name, dname);
    snprintf(d->name, sizeof(d->name), "%s", dname);
    d->index = (int)json_integer_value(index);
    snprintf(d->uuid, sizeof(d->uuid), "%s", uuid ? uuid : "");
    snprintf(d->model, sizeof(d->model), "%s", model);
    size_t t;
    const json_t *taint;
    json_array_foreach(json_object_get(dev, "taints"), t, taint)
    {
        const char *effect = str_at(taint, "effect");
        d->tainted = d->tainted || (effect != NULL && (strcmp(effect, "NoSchedule") == 0 ||
                                                       strcmp(effect, "NoExecute") == 0));
    }
    const char *cc = json_string_value(attr(dev, "computeCapability", "version"));
    unsigned maj, min, patch;
    d->cc = cc != NULL && sscanf(cc, "%4u.%4u.%4u", &maj, &min, &patch) == 3 && maj <= 1023 &&
                    min <= 1023 && patch <= 1023
                ? EXT_CEL_SEMVER(maj, min, patch)
                : -1;
    d->numa = json_is_integer(numa) && json_integer_value(numa) >= 0 &&
                      json_integer_value(numa) <= 1023
                  ? (int)json_integer_value(numa)
                  : -1;
    return 0;
}

int ext_dra_profile_id(const char *name)
{
    for (int m = 0; name != NULL && m < kgpu_mig_model_count(); m++) {
        const kgpu_mig_profile *p = kgpu_mig_profile_find(kgpu_mig_model_at(m), name);
        if (p != NULL)
            return m * KGPU_MIG_MAX_PROFILES + (int)(p - kgpu_mig_model_at(m)->profiles);
    }
    return -1;
}

static const char *profile_name(int id)
{
    return kgpu_mig_model_at(id / KGPU_MIG_MAX_PROFILES)->profiles[id % KGPU_MIG_MAX_PROFILES].name;
}

/* Counts a device not kept, with the first reason. */
static void skip(ext_dra_slice *s, const char *why)
{
    if (s->skipped++ == 0)
        snprintf(s->skip_why, sizeof(s->skip_why), "%s", why);
}

/*
 * A MIG device (attribute mig true) into out->migs as its attributes say,
 * when it names a profile kgpu's tables know; else counted in skipped: a
 * driver newer than the extender may offer what kgpu does not know, and
 * the node's GPUs stay usable. Its GPU is found in the pool.
 */
static void read_mig(ext_dra_slice *out, const json_t *dev)
{
    const char *dname = str_at(dev, "name");
    const json_t *index = attr(dev, "parentIndex", "int"), *start = attr(dev, "migStart", "int");
    const json_t *size = attr(dev, "migSize", "int");
    const char *profile = json_string_value(attr(dev, "profile", "string"));
    if (index == NULL)
        index = attr(dev, "index", "int"); /* the GPU's own, which a partition carries too */
    char why[sizeof(out->skip_why)] = "";
    int id = ext_dra_profile_id(profile);
    if (dname == NULL || strlen(dname) >= EXT_DRA_DEVICE_MAX)
        snprintf(why, sizeof(why), "a MIG device without a name");
    else if (!json_is_integer(index) || json_integer_value(index) < 0 ||
             json_integer_value(index) > 1023)
        snprintf(why, sizeof(why), "%.40s: attribute parentIndex is not 0..1023", dname);
    else if (id < 0)
        snprintf(why, sizeof(why), "%.40s: profile %.24s is of no MIG model kgpu knows", dname,
                 profile ? profile : "(none)");
    else if (!json_is_integer(start) || json_integer_value(start) < 0 ||
             json_integer_value(start) >= KGPU_MIG_MEM_SLICES ||
             (size != NULL && (!json_is_integer(size) || json_integer_value(size) < 1 ||
                               json_integer_value(size) > KGPU_MIG_MEM_SLICES)))
        snprintf(why, sizeof(why), "%.40s: migStart or migSize out of range", dname);
    else if (out->nmig == EXT_DRA_MIG_MAX)
        snprintf(why, sizeof(why), "more than %d MIG devices", EXT_DRA_MIG_MAX);
    if (why[0] != '\0') {
        skip(out, why);
        return;
    }
    out->migs[out->nmig++] =
        (ext_dra_mig){.name_hash = ext_dra_name_hash(dname),
                      .index = (uint16_t)json_integer_value(index),
                      .pname = (uint8_t)id,
                      .start = (uint8_t)json_integer_value(start),
                      .size = (uint8_t)(size != NULL ? json_integer_value(size) : 0)};
}

size_t ext_dra_slice_size(const ext_dra_slice *s)
{
    return offsetof(ext_dra_slice, migs) + (size_t)s->nmig * sizeof(ext_dra_mig);
}

void ext_dra_pool_init(ext_dra_slice *pool, const char *node, int64_t generation)
{
    memset(pool, 0, offsetof(ext_dra_slice, migs));
    snprintf(pool->name, sizeof(pool->name), "%s", node);
    snprintf(pool->node, sizeof(pool->node), "%s", node);
    pool->generation = generation;
}

void ext_dra_pool_add(ext_dra_slice *pool, const ext_dra_slice *part)
{
    char why[sizeof(pool->skip_why)];
    for (int i = 0; i < part->ndevices; i++) {
        const ext_dra_device *d = &part->devices[i];
        bool dup = false;
        for (int k = 0; k < pool->ndevices; k++)
            dup = dup || pool->devices[k].index == d->index ||
                  strcmp(pool->devices[k].name, d->name) == 0;
        if (dup || pool->ndevices == KGPU_MAX_GPUS_PER_NODE) {
            snprintf(why, sizeof(why), "%.40s of %.30s: %s", d->name, part->name,
                     dup ? "another slice has its index or name" : "more than 32 GPUs");
            skip(pool, why);
            continue;
        }
        pool->devices[pool->ndevices++] = *d;
    }
    pool->skipped += part->skipped;
    if (pool->skip_why[0] == '\0')
        snprintf(pool->skip_why, sizeof(pool->skip_why), "%s", part->skip_why);
    for (int i = 0; i < part->nmig; i++) {
        if (pool->nmig == EXT_DRA_MIG_MAX) {
            skip(pool, "more than " STR(EXT_DRA_MIG_MAX) " MIG devices");
            continue;
        }
        pool->migs[pool->nmig++] = part->migs[i];
    }
}

/* Whether MIG device i's name is a GPU's or an earlier MIG device's of the pool. */
static bool name_taken(const ext_dra_slice *pool, int i)
{
    uint64_t h = pool->migs[i].name_hash;
    for (int k = 0; k < pool->ndevices; k++)
        if (ext_dra_name_hash(pool->devices[k].name) == h)
            return true;
    for (int k = 0; k < i; k++)
        if (pool->migs[k].name_hash == h)
            return true;
    return false;
}

void ext_dra_pool_resolve(ext_dra_slice *pool)
{
    int kept = 0;
    char why[sizeof(pool->skip_why)];
    for (int k = 0; k < pool->ndevices; k++) {
        ext_dra_device *g = &pool->devices[k];
        const kgpu_mig_model *m = kgpu_mig_model_find(g->model, g->memory_mib);
        g->mig_model = 0;
        for (int i = 0; m != NULL && i < kgpu_mig_model_count(); i++)
            if (kgpu_mig_model_at(i) == m)
                g->mig_model = i + 1;
    }
    for (int i = 0; i < pool->nmig; i++) {
        ext_dra_mig md = pool->migs[i];
        const char *pname = profile_name(md.pname);
        int gpu = -1;
        for (int k = 0; k < pool->ndevices; k++)
            if (pool->devices[k].index == md.index)
                gpu = k;
        const kgpu_mig_model *m =
            gpu >= 0 && pool->devices[gpu].mig_model > 0
                ? kgpu_mig_model_at(pool->devices[gpu].mig_model - 1)
                : NULL;
        const kgpu_mig_profile *p = kgpu_mig_profile_find(m, pname);
        bool allowed = false;
        for (int k = 0; p != NULL && k < p->nstarts; k++)
            allowed = allowed || p->starts[k] == md.start;
        why[0] = '\0';
        if (gpu < 0)
            snprintf(why, sizeof(why), "a MIG device of GPU index %d, which the pool has not",
                     md.index);
        else if (m == NULL)
            snprintf(why, sizeof(why), "a MIG device of %.40s, of no MIG model kgpu knows",
                     pool->devices[gpu].name);
        else if (p == NULL)
            snprintf(why, sizeof(why), "profile %s is not %s's", pname, m->name);
        else if (!allowed || (md.size != 0 && md.size != p->size))
            snprintf(why, sizeof(why), "%s at %d is no placement of %s", pname, md.start,
                     m->name);
        else if (name_taken(pool, i))
            snprintf(why, sizeof(why), "two devices of one name (or hash)");
        if (why[0] != '\0') {
            skip(pool, why);
            continue;
        }
        md.gpu = (uint8_t)gpu;
        md.profile = (uint8_t)(p - m->profiles);
        /* Where kube-scheduler meets it on its GPU: scores need it, at every call. */
        int order[KGPU_MIG_MAX_STARTS], n = kgpu_mig_slice_order(m, md.profile, order);
        md.order = 0;
        while (md.order < n && order[md.order] != md.start)
            md.order++;
        pool->migs[kept++] = md;
    }
    pool->nmig = kept;
}

static bool is_mig(const json_t *dev)
{
    return json_is_true(attr(dev, "mig", "bool"));
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
    if (json_array_size(devs) > KGPU_MAX_GPUS_PER_NODE + EXT_DRA_MIG_MAX)
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: %zu devices, at most %d", name,
                              json_array_size(devs), KGPU_MAX_GPUS_PER_NODE + EXT_DRA_MIG_MAX);
    size_t i;
    const json_t *dev;
    json_array_foreach(devs, i, dev)
    {
        if (is_mig(dev))
            continue; /* once their GPUs are read */
        if (out->ndevices == KGPU_MAX_GPUS_PER_NODE)
            return kgpu_error_set(err, KGPU_EPARSE, "ResourceSlice %s: more than %d GPUs", name,
                                  KGPU_MAX_GPUS_PER_NODE);
        ext_dra_device *d = &out->devices[out->ndevices];
        int rc = read_gpu(name, i, dev, d, err);
        if (rc != 0)
            return rc;
        for (int k = 0; k < out->ndevices; k++)
            if (out->devices[k].index == d->index || strcmp(out->devices[k].name, d->name) == 0)
                return kgpu_error_set(err, KGPU_EPARSE,
                                      "ResourceSlice %s: devices %s and %s have one index or name",
                                      name, out->devices[k].name, d->name);
        out->ndevices++;
    }
    json_array_foreach(devs, i, dev)
    {
        if (is_mig(dev))
            read_mig(out, dev);
    }
    return 0;
}

/* Whether cls is one of kgpu's classes: gpu.kgpu.io, mig.gpu.kgpu.io. */
static bool our_class(const char *cls)
{
    return cls != NULL && (strcmp(cls, EXT_DRA_CLASS) == 0 || strcmp(cls, EXT_DRA_MIG_CLASS) == 0);
}

/* Whether a request (or one of its firstAvailable subrequests) names one of kgpu's classes. */
static bool names_class(const json_t *r)
{
    if (our_class(str_at(json_object_get(r, "exactly"), "deviceClassName")))
        return true;
    size_t i;
    const json_t *sub;
    json_array_foreach(json_object_get(r, "firstAvailable"), i, sub)
    {
        if (our_class(str_at(sub, "deviceClassName")))
            return true;
    }
    return false;
}

static bool ours_result(const json_t *res)
{
    const char *driver = str_at(res, "driver");
    return driver != NULL && strcmp(driver, EXT_DRA_DRIVER) == 0;
}

/* The bytes a request's selectors take in a claim's text, joined: (e1) && (e2). */
static size_t selectors_bytes(const json_t *sels)
{
    size_t n = 0, i;
    const json_t *v;
    json_array_foreach(sels, i, v)
    {
        const char *e = str_at(json_object_get(v, "cel"), "expression");
        n += (e != NULL ? strlen(e) : 0) + 6;
    }
    return n + 1;
}

/*
 * A request's CEL selectors into the claim's text (cap bytes in all), as
 * one expression; q->cel says where, or that they were not kept and why
 * (dra_cel.c reads them when the pod is scored; a tenant writes them).
 */
static void read_selectors(ext_dra_claim *c, const json_t *sels, ext_dra_request *q,
                           size_t *used, size_t cap)
{
    q->cel = EXT_DRA_CEL_NONE;
    if (json_array_size(sels) == 0)
        return;
    size_t i;
    const json_t *v;
    const char *why = NULL;
    size_t n = 0;
    json_array_foreach(sels, i, v)
    {
        const char *e = str_at(json_object_get(v, "cel"), "expression");
        if (e == NULL)
            why = "a selector other than cel.expression";
        else if (strnlen(e, EXT_CEL_LEN_MAX + 1) > EXT_CEL_LEN_MAX)
            why = "a selector longer than " STR(EXT_CEL_LEN_MAX) " bytes";
        else
            n += strlen(e) + 6;
    }
    if (why == NULL && n > EXT_CEL_LEN_MAX)
        why = "selectors longer than " STR(EXT_CEL_LEN_MAX) " bytes together";
    if (why == NULL && *used + n + 1 > cap)
        why = "the claim's selectors pass " STR(EXT_DRA_CEL_MAX) " bytes";
    if (why != NULL) {
        q->cel = EXT_DRA_CEL_UNREAD;
        snprintf(q->cel_why, sizeof(q->cel_why), "%s", why);
        return;
    }
    q->cel = (int)*used;
    char *out = c->cel + *used;
    out[0] = '\0';
    json_array_foreach(sels, i, v)
    {
        size_t at = strlen(out);
        snprintf(out + at, n + 1 - at, "%s(%s)", i > 0 ? " && " : "",
                 str_at(json_object_get(v, "cel"), "expression"));
    }
    *used += strlen(out) + 1;
}

/* Reads one request under `exactly`; false with c->error set. */
static bool read_request(ext_dra_claim *c, const json_t *r, ext_dra_request *q, size_t *used,
                         size_t cap)
{
    const json_t *ex = json_object_get(r, "exactly");
    const char *rname = str_at(r, "name");
    rname = rname ? rname : "?";
    memset(q, 0, sizeof(*q));
    q->count = 1;
    q->cel = EXT_DRA_CEL_NONE;
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
    read_selectors(c, json_object_get(ex, "selectors"), q, used, cap);
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

/*
 * The first pod status.reservedFor names (resource "pods" of the core
 * group): the pod that consumes the claim, whose queue it is charged to.
 */
static const json_t *first_consumer(const json_t *obj)
{
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(json_object_get(obj, "status"), "reservedFor"), i, v)
    {
        const char *res = str_at(v, "resource"), *group = str_at(v, "apiGroup");
        const char *uid = str_at(v, "uid");
        if (res != NULL && strcmp(res, "pods") == 0 && (group == NULL || group[0] == '\0') &&
            uid != NULL && uid[0] != '\0' && strlen(uid) < sizeof(((ext_dra_claim *)0)->consumer))
            return v;
    }
    return NULL;
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
    size_t cap = 0, used = 0;
    json_array_foreach(reqs, i, v) cap += selectors_bytes(
        json_object_get(json_object_get(v, "exactly"), "selectors"));
    cap = cap < EXT_DRA_CEL_MAX ? cap : EXT_DRA_CEL_MAX;
    ext_dra_claim *c = calloc(1, sizeof(*c) + nres * sizeof(ext_dra_result) + cap + 1);
    if (c == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    c->cel = (char *)&c->res[nres];
    snprintf(c->ns, sizeof(c->ns), "%s", ns);
    snprintf(c->name, sizeof(c->name), "%s", name);
    snprintf(c->uid, sizeof(c->uid), "%.63s", uid ? uid : "");
    const json_t *consumer = first_consumer(obj);
    snprintf(c->consumer, sizeof(c->consumer), "%s",
             consumer != NULL ? str_at(consumer, "uid") : "");
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
        if (!ok || !our_class(cls))
            continue; /* firstAvailable: the DRA plugin's Score ranks those */
        if (c->nreq == EXT_DRA_REQUESTS) {
            snprintf(c->error, sizeof(c->error), "more than %d requests of kgpu's classes",
                     EXT_DRA_REQUESTS);
            ok = false;
            break;
        }
        ok = read_request(c, v, &c->req[c->nreq], &used, cap);
        c->req[c->nreq].mig = strcmp(cls, EXT_DRA_MIG_CLASS) == 0;
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

/* Listed objects are cut as their page arrives: what is not ours, to nothing. */
void ext_dra_slice_trim(void *ctx, json_t *obj)
{
    (void)ctx;
    const char *driver = str_at(json_object_get(obj, "spec"), "driver");
    if (driver == NULL || strcmp(driver, EXT_DRA_DRIVER) != 0)
        json_object_clear(obj);
    else
        json_object_del(json_object_get(obj, "metadata"), "managedFields");
}

void ext_dra_claim_trim(void *ctx, json_t *obj)
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
    /* Up to 256 pods: the first pod is all ext_dra_claim_parse reads. */
    json_t *consumer = json_incref((json_t *)first_consumer(obj));
    json_object_del(status, "reservedFor");
    if (consumer != NULL && json_is_object(status))
        json_object_set_new(status, "reservedFor", json_pack("[o]", consumer));
    else
        json_decref(consumer);
    json_object_del(status, "devices");
}
