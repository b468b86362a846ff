/*
 * A ResourceClaim's allocation, read for this driver: which of the node's
 * GPUs each request got and how much of each (consumable capacity). The
 * claim comes from the API server, which kube-scheduler wrote; it is still
 * outside input here, so everything is checked against the node's own
 * inventory before a file is written from it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dra.h"
#include "podspec.h"

bool dra_safe_name(const char *s)
{
    if (s == NULL || *s == '\0' || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 ||
        strlen(s) >= DRA_UID_MAX)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '.' || *s == '_'))
            return false;
    return true;
}

static const char *str(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* Index of the request called `base` in out->reqs, added when new; -1 when full. */
static int request_slot(dra_claim *out, const char *base, size_t len)
{
    for (int r = 0; r < out->nreqs; r++)
        if (strlen(out->reqs[r]) == len && strncmp(out->reqs[r], base, len) == 0)
            return r;
    if (out->nreqs >= DRA_MAX_REQUESTS)
        return -1;
    snprintf(out->reqs[out->nreqs], DRA_REQ_MAX, "%.*s", (int)len, base);
    return out->nreqs++;
}

/* Reads one result of this driver into a new dra_alloc. */
static int read_result(const json_t *res, const dra_node_view *node, const char *who,
                       dra_claim *out, kgpu_error *err)
{
    const char *request = str(res, "request"), *pool = str(res, "pool"),
               *dev = str(res, "device");
    if (request == NULL || pool == NULL || dev == NULL)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: an allocation result of %s lacks request, pool or device", who,
                              DRA_DRIVER);
    if (strcmp(pool, node->pool) != 0)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "%s: request %.64s was allocated device %.64s of pool %.253s, not "
                              "of this node's pool %s",
                              who, request, dev, pool, node->pool);
    dra_device_ref ref;
    if (!dra_device_find(node->gpus, node->ngpus, node->mig, dev, &ref))
        return kgpu_error_set(err, KGPU_ENOENT,
                              "%s: request %.64s was allocated device %.64s, which node %s does "
                              "not have",
                              who, request, dev, node->pool);
    const kgpu_gpu_info *gpu = &node->gpus[ref.gpu];
    /* What the device is: a partition, a MIG GPU's whole instance, or a GPU. */
    const kgpu_mig_profile *prof =
        ref.model == NULL ? NULL
        : ref.profile >= 0 ? &ref.model->profiles[ref.profile]
                            : kgpu_mig_profile_whole(ref.model);
    int64_t dev_mib = prof != NULL ? prof->memory_mib : gpu->memory_mib;
    if (!gpu->healthy)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "%s: request %.64s was allocated %s (%s), which turned unhealthy",
                              who, request, dev, gpu->uuid);
    /* A subrequest ("req/sub", firstAvailable) is served under its request's name. */
    const char *slash = strchr(request, '/');
    size_t blen = slash != NULL ? (size_t)(slash - request) : strlen(request);
    char base[DRA_REQ_MAX];
    snprintf(base, sizeof(base), "%.*s", (int)(blen < DRA_REQ_MAX ? blen : DRA_REQ_MAX - 1),
             request);
    if (blen == 0 || blen >= DRA_REQ_MAX || !dra_safe_name(base))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: request name '%.64s' is not a DNS label", who,
                              request);
    if (out->nallocs >= KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: more than %d devices of %s", who,
                              KGPU_MAX_GPUS_PER_NODE, DRA_DRIVER);
    const json_t *share = json_object_get(res, "shareID");
    if (share != NULL && (!json_is_string(share) || !dra_safe_name(json_string_value(share))))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: device %s: shareID is not a UID", who, dev);
    if (share != NULL && ref.profile >= 0)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: device %s is a MIG instance, which allows no shares, yet has "
                              "a shareID",
                              who, dev);
    /*
     * A device that allows multiple allocations may serve one request twice,
     * as two shares (two shareIDs): the container gets the GPU once, with both
     * shares (dra_claim_target adds them up). The same share twice is an error.
     */
    for (int i = 0; i < out->nallocs; i++) {
        const dra_alloc *o = &out->allocs[i];
        if (strcmp(o->device, dev) == 0 && strcmp(out->reqs[o->req], base) == 0 &&
            (share == NULL || o->share_id[0] == '\0' ||
             strcmp(o->share_id, json_string_value(share)) == 0))
            return kgpu_error_set(err, KGPU_EPARSE, "%s: request %s got device %s twice", who,
                                  base, dev);
    }
    int r = request_slot(out, base, blen);
    if (r < 0)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: more than %d requests with devices of %s",
                              who, DRA_MAX_REQUESTS, DRA_DRIVER);
    dra_alloc *a = &out->allocs[out->nallocs];
    memset(a, 0, sizeof(*a));
    a->req = r;
    snprintf(a->device, sizeof(a->device), "%s", dev);
    snprintf(a->uuid, sizeof(a->uuid), "%s", gpu->uuid);
    a->index = gpu->index;
    a->memory_mib = dev_mib;
    a->milli = 0;
    if (prof != NULL) {
        snprintf(a->profile, sizeof(a->profile), "%s", prof->name);
        a->nvml_profile = prof->nvml_profile;
        a->mig_start = ref.profile >= 0 ? ref.start : 0;
        a->mig_size = prof->size;
        a->mig_shared = ref.profile < 0;
    }
    if (share != NULL)
        snprintf(a->share_id, sizeof(a->share_id), "%s", json_string_value(share));
    const json_t *cc = json_object_get(res, "consumedCapacity");
    if (cc != NULL && !json_is_object(cc))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: device %s: consumedCapacity is not an object",
                              who, dev);
    const char *key;
    json_t *q;
    json_object_foreach((json_t *)cc, key, q)
    {
        int64_t v;
        kgpu_error qe = {0};
        if (!json_is_string(q))
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "%s: device %s: consumedCapacity %.64s is not a quantity", who,
                                  dev, key);
        if (strcmp(key, DRA_CAP_MEMORY) == 0) {
            if (kgpu_quantity_value(json_string_value(q), &v, &qe) != 0)
                return kgpu_error_set(err, KGPU_EPARSE, "%s: device %s: memory: %s", who, dev,
                                      qe.msg);
            int64_t mib = v / (1024 * 1024); /* never more than was allocated */
            if (mib < 1 || mib > dev_mib)
                return kgpu_error_set(err, KGPU_ERANGE,
                                      "%s: device %s: consumed memory %.32s is outside 1 MiB .. "
                                      "the %s %" PRId64 " MiB",
                                      who, dev, json_string_value(q),
                                      prof != NULL ? "instance's" : "GPU's", dev_mib);
            if (ref.profile < 0) /* an instance is all of its memory */
                a->memory_mib = mib;
        } else if (strcmp(key, DRA_CAP_CORES) == 0) {
            if (kgpu_quantity_milli(json_string_value(q), &v, &qe) != 0)
                return kgpu_error_set(err, KGPU_EPARSE, "%s: device %s: cores: %s", who, dev,
                                      qe.msg);
            if (v > 100 * 1000)
                return kgpu_error_set(err, KGPU_ERANGE,
                                      "%s: device %s: consumed cores %.32s exceed the GPU's 100",
                                      who, dev, json_string_value(q));
            if (ref.profile < 0) /* percent in milli-units → thousandths of the GPU */
                a->milli = (int)(v / 100);
        }
        /* Other capacities are not kgpu's: a newer slice may carry more. */
    }
    out->nallocs++;
    return 0;
}

/*
 * One opaque configuration of this driver (status.allocation.devices.config,
 * copied there from the claim or its class at allocation): parameters
 * {"apiVersion", "kind", "coreLimit": N}, N a whole percent 1..100, the
 * burst ceiling of the requests it names (all, when it names none). The
 * claim's author writes it, and it only lowers what its own containers may
 * take of an idle GPU; any other parameter is refused by name, so a typo
 * is not silently a share without its ceiling.
 */
static int read_config(const json_t *cfg, size_t i, const char *who, dra_claim *out,
                       kgpu_error *err)
{
    const json_t *opaque = json_object_get(cfg, "opaque");
    if (!json_is_object(cfg) || (opaque != NULL && !json_is_object(opaque)))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: allocation config %zu is not an object", who,
                              i);
    const char *driver = str(opaque, "driver");
    if (opaque == NULL || driver == NULL || strcmp(driver, DRA_DRIVER) != 0)
        return 0; /* another driver's, or not opaque */
    const json_t *params = json_object_get(opaque, "parameters");
    const json_t *reqs = json_object_get(cfg, "requests");
    if (!json_is_object(params) || (reqs != NULL && !json_is_array(reqs)))
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: config %zu of %s: parameters is not an object or requests not "
                              "a list",
                              who, i, DRA_DRIVER);
    int pct = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)params, key, v)
    {
        if (strcmp(key, "apiVersion") == 0 || strcmp(key, "kind") == 0)
            continue;
        if (strcmp(key, "coreLimit") != 0)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: config %zu of %s: unknown parameter %.64s",
                                  who, i, DRA_DRIVER, key);
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 100)
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "%s: config %zu of %s: coreLimit is not a whole percent 1..100",
                                  who, i, DRA_DRIVER);
        pct = (int)json_integer_value(v);
    }
    for (int k = 0; k < out->nallocs && pct > 0; k++) {
        const char *base = out->reqs[out->allocs[k].req];
        bool named = reqs == NULL || json_array_size(reqs) == 0;
        size_t j;
        json_t *r;
        json_array_foreach(reqs, j, r)
        {
            const char *n = json_string_value(r);
            size_t blen = strlen(base);
            /* "req" names all of it; "req/sub" the subrequest, whose base is req. */
            named |= n != NULL && strncmp(n, base, blen) == 0 &&
                     (n[blen] == '\0' || n[blen] == '/');
        }
        if (named)
            out->allocs[k].limit_pct = pct;
    }
    return 0;
}

int dra_claim_read(const json_t *claim, const char *want_uid, const dra_node_view *node,
                   dra_claim *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    const json_t *meta = json_object_get(claim, "metadata");
    const char *ns = str(meta, "namespace"), *name = str(meta, "name"), *uid = str(meta, "uid");
    if (!json_is_object(claim) || ns == NULL || name == NULL || uid == NULL)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "ResourceClaim: metadata.namespace, name or uid missing");
    char who[2 * KGPU_NAME_MAX + 32];
    snprintf(who, sizeof(who), "ResourceClaim %.253s/%.253s", ns, name);
    if (strlen(ns) > KGPU_NAME_MAX || strlen(name) > KGPU_NAME_MAX || !dra_safe_name(uid))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: name, namespace or uid malformed", who);
    if (want_uid != NULL && strcmp(uid, want_uid) != 0)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "%s has UID %s, not %.64s: it was deleted and made again", who, uid,
                              want_uid);
    snprintf(out->ns, sizeof(out->ns), "%s", ns);
    snprintf(out->name, sizeof(out->name), "%s", name);
    snprintf(out->uid, sizeof(out->uid), "%s", uid);
    const json_t *alloc = json_object_get(json_object_get(claim, "status"), "allocation");
    if (alloc == NULL)
        return kgpu_error_set(err, KGPU_ESTATE, "%s is not allocated", who);
    const json_t *results = json_object_get(json_object_get(alloc, "devices"), "results");
    if (results != NULL && !json_is_array(results))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: status.allocation.devices.results is not a list",
                              who);
    size_t i;
    json_t *res;
    json_array_foreach(results, i, res)
    {
        const char *driver = str(res, "driver");
        if (!json_is_object(res) || driver == NULL)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: allocation result %zu has no driver", who,
                                  i);
        if (strcmp(driver, DRA_DRIVER) != 0)
            continue;
        int rc = read_result(res, node, who, out, err);
        if (rc != 0)
            return rc;
    }
    if (out->nallocs == 0)
        return kgpu_error_set(err, KGPU_ENOENT, "%s has no device of %s allocated", who,
                              DRA_DRIVER);
    const json_t *configs = json_object_get(json_object_get(alloc, "devices"), "config");
    if (configs != NULL && !json_is_array(configs))
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: status.allocation.devices.config is not a list", who);
    json_t *cfg;
    json_array_foreach(configs, i, cfg)
    {
        int rc = read_config(cfg, i, who, out, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int dra_claim_read_text(const char *buf, size_t len, const char *want_uid,
                        const dra_node_view *node, dra_claim *out, kgpu_error *err)
{
    if (len > DRA_CLAIM_MAX_JSON)
        return kgpu_error_set(err, KGPU_ERANGE, "ResourceClaim of %zu bytes (at most %u)", len,
                              DRA_CLAIM_MAX_JSON);
    json_error_t je;
    json_t *claim = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (claim == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "ResourceClaim: %s at %d:%d", je.text, je.line,
                              je.column);
    int rc = dra_claim_read(claim, want_uid, node, out, err);
    json_decref(claim);
    return rc;
}
