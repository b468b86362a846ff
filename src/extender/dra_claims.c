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
 * nothing: no double charge. What a claim's charged results hold is
 * charged to a GPU queue too (queues.c ext_queues_charge_claim), so a
 * tenant cannot take past its queue's limit through claims. Only claims
 * that name class or driver gpu.kgpu.io are kept.
 *
 * This file: the DRA nodes' and claims' records and what the claims
 * charge; dra_nodes.c rebuilds the DRA nodes' inventory. Caller holds st->mu.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state_impl.h"

/* "namespace/name" of a claim: a DNS label, '/', a name. */
#define EXT_DRA_KEY_MAX (64 + KGPU_NAME_MAX + 2)

static const char *str_at(const json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

/* ---- the inventory: DRA nodes' GPUs from their slices ---- */

bool ext_dra_is_node(const ext_state *st, const char *name)
{
    return kgpu_strmap_get(&st->dra_nodes, name) != NULL;
}

/* spec's GPUs from node's slice into gpus (none without a slice). */
void ext_dra_gpus_from_slice(ext_state *st, kgpu_node_spec *spec, kgpu_gpu_spec *gpus)
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
                                  .healthy = !d->tainted}; /* the driver taints a sick one */
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
    ext_dra_gpus_from_slice(st, spec, gpus);
}

void ext_dra_node_gone(ext_state *st, const char *name)
{
    free(kgpu_strmap_del(&st->dra_nodes, name));
}

void ext_dra_nodes_clear(ext_state *st)
{
    kgpu_strmap_clear_free(&st->dra_nodes);
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
    if (index < 0 && ext__dra_is_mig(s, r->device))
        return ext__dra_mig_charge(st, r, s, idx, err);
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

/*
 * Charges c's results that are not charged, logging the first failure once
 * per claim, and charges what they hold to its GPU queue (queues.c).
 */
static void charge(ext_state *st, ext_dra_claim *c)
{
    if (unapplied(c) > 0)
        ext_queues_uncharge_claim(st, c); /* charged again below with what it holds then */
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
    ext_queues_charge_claim(st, c);
}

/* Releases what c holds, newest first, and uncharges its queue. */
static void uncharge(ext_state *st, ext_dra_claim *c)
{
    ext_queues_uncharge_claim(st, c);
    for (int i = c->nres - 1; i >= 0; i--) {
        if (!c->res[i].applied)
            continue;
        if (c->res[i].mig) {
            ext__dra_mig_uncharge(st, &c->res[i]);
            continue;
        }
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
            c->res[i].applied = c->res[i].mig = false;
    }
    ext__dra_mig_forget(st);
    charge_all(st);
}

void ext_dra_retry(ext_state *st)
{
    if (st->dra_unapplied > 0)
        charge_all(st);
}

/* ---- prioritize: a DRA pod's request ---- */

void ext_dra_request_of(const ext_dra_request *q, kgpu_request *req)
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

/*
 * The claim held for entry rc of the pod's spec.resourceClaims (a claim
 * made from a template through status.resourceClaimStatuses), or NULL with
 * the first reason into why (left as it is when it says something already).
 */
static const ext_dra_claim *pod_claim(ext_state *st, const char *ns, const char *pname,
                                      const json_t *rc, const json_t *statuses, char *why,
                                      size_t len)
{
    const char *entry = str_at(rc, "name"), *claim = str_at(rc, "resourceClaimName");
    const char *tmpl = str_at(rc, "resourceClaimTemplateName");
    entry = entry ? entry : "?";
    size_t j;
    const json_t *s;
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
            return NULL;
        }
    }
    if (claim == NULL) {
        if (why[0] == '\0')
            snprintf(why, len, "pod %s/%s: claim %.60s names no ResourceClaim", ns, pname, entry);
        return NULL;
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
        return NULL;
    }
    if (c->error[0] != '\0') {
        if (why[0] == '\0')
            snprintf(why, len, "pod %s/%s: ResourceClaim %s cannot be read: %s", ns, pname, key,
                     c->error);
        return NULL;
    }
    return c;
}

/* The pod's namespace and name, for reasons. */
static void pod_names(const json_t *pod, const char **ns, const char **name)
{
    const json_t *meta = json_object_get(pod, "metadata");
    *ns = str_at(meta, "namespace");
    *name = str_at(meta, "name");
    *ns = *ns != NULL ? *ns : "default";
    *name = *name != NULL ? *name : "?";
}

int ext_dra_pod_asks(ext_state *st, const json_t *pod, ext_dra_ask *asks, int max, char *why,
                     size_t len)
{
    const json_t *claims = json_object_get(json_object_get(pod, "spec"), "resourceClaims");
    const json_t *statuses =
        json_object_get(json_object_get(pod, "status"), "resourceClaimStatuses");
    const char *ns, *pname;
    pod_names(pod, &ns, &pname);
    why[0] = '\0';
    if (json_array_size(claims) == 0)
        return 0;
    int n = 0, allocated = 0;
    size_t i;
    const json_t *rc;
    json_array_foreach(claims, i, rc)
    {
        const ext_dra_claim *c = pod_claim(st, ns, pname, rc, statuses, why, len);
        if (c != NULL && c->nres > 0) {
            allocated++; /* its devices are charged already, on the node it binds the pod to */
            continue;
        }
        for (int k = 0; c != NULL && k < c->nreq; k++) {
            if (c->req[k].all) {
                snprintf(why, len,
                         "pod %s/%s: ResourceClaim %s/%s: request #%d asks for all devices "
                         "(allocationMode All), which kgpu does not score",
                         ns, pname, c->ns, c->name, k + 1);
                return -1;
            }
            if (n == max) {
                snprintf(why, len, "pod %s/%s: more than %d requests of class %s in its claims",
                         ns, pname, max, EXT_DRA_CLASS);
                return -1;
            }
            asks[n++] = (ext_dra_ask){.claim = c, .req = &c->req[k], .k = k};
        }
    }
    if (n > 0)
        return n;
    if (why[0] == '\0' && allocated > 0)
        snprintf(why, len, "pod %s/%s: its ResourceClaims of class %s are allocated already", ns,
                 pname, EXT_DRA_CLASS);
    if (why[0] == '\0')
        snprintf(why, len, "pod %s/%s: none of its ResourceClaims asks for class %s", ns, pname,
                 EXT_DRA_CLASS);
    return -1;
}

/* ---- filter-gpuless: what a DRA pod's claims will take from its queue ---- */

/* The most GPUs one DRA node's slice has: what a request of allocationMode All may take. */
static int most_devices(ext_state *st)
{
    size_t it = 0;
    const char *k;
    void *v;
    int most = 1;
    while (kgpu_strmap_next(&st->dra_slices, &it, &k, &v)) {
        const ext_dra_slice *s = v;
        most = s->ndevices > most ? s->ndevices : most;
    }
    return most;
}

int ext_dra_pod_demand(ext_state *st, const json_t *pod, kgpu_qdemand *d, char *why, size_t len)
{
    const json_t *claims = json_object_get(json_object_get(pod, "spec"), "resourceClaims");
    const json_t *statuses =
        json_object_get(json_object_get(pod, "status"), "resourceClaimStatuses");
    const char *ns, *pname;
    pod_names(pod, &ns, &pname);
    memset(d, 0, sizeof(*d));
    why[0] = '\0';
    int counted = 0;
    size_t i;
    const json_t *rc;
    json_array_foreach(claims, i, rc)
    {
        const ext_dra_claim *c = pod_claim(st, ns, pname, rc, statuses, why, len);
        if (c == NULL || c->nres > 0)
            continue; /* another driver's, not seen yet, or allocated: charged already */
        for (int k = 0; k < c->nreq; k++) {
            kgpu_request req;
            ext_dra_request_of(&c->req[k], &req);
            if (c->req[k].all)
                req.gpu_count = most_devices(st);
            kgpu_qdemand one;
            kgpu_qdemand_of_request(&req, &one);
            d->milli += one.milli;
            d->mem_mib += one.mem_mib;
            counted++;
        }
    }
    return counted > 0;
}
