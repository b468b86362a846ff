/*
 * BestOptions (caexp.h). Each node group's template node becomes a node of a
 * scratch cluster, each option's pods kgpu requests compiled against it,
 * and kgpu_expander_choose (kgpu/expander.h) picks the option that really
 * places the most pending pods for the least cost, or none. Pure: all
 * state lives in the call.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "caexp.h"
#include "capacity.h"
#include "kgpu/expander.h"
#include "podspec.h"

bool caexp_template_spot(const json_t *node)
{
    return kgpu_capacity_spot(json_object_get(json_object_get(node, "metadata"), "labels"));
}

/* Puts "<where>: " before err's message; returns its code. */
static int prefix(kgpu_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int prefix(kgpu_error *err, const char *fmt, ...)
{
    char msg[2 * KGPU_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, 300, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= 300)
        n = 299;
    snprintf(msg + n, sizeof(msg) - (size_t)n, ": %s", err->msg);
    snprintf(err->msg, sizeof(err->msg), "%.*s", (int)sizeof(err->msg) - 1, msg);
    return err->code != 0 ? err->code : KGPU_EINVAL;
}

/* Everything one call allocates. */
typedef struct call {
    Kgpu__Caexp__BestOptionsRequest *req;
    kgpu_cluster *c;
    kgpu_expander_group *groups;
    char **group_ids;
    int ngroups;
    kgpu_pod *scratch; /* one pod read at a time */
    kgpu_request *reqs; /* one per distinct pod (by its bytes) */
    const ProtobufCBinaryData **seen; /* their bytes, in the request */
    uint64_t *hash;                   /* of those bytes */
    size_t npods;
    int *table; /* open addressing on hash: index into reqs, or -1 */
    size_t table_cap;
    const kgpu_request **req_ptrs; /* per pod entry of every option */
    size_t nentries;
    kgpu_expander_option *opts;
    int *opt_index; /* per option given to the expander: its index in the request */
    int nopts;
} call;

static void call_free(call *k)
{
    if (k->req != NULL)
        kgpu__caexp__best_options_request__free_unpacked(k->req, NULL);
    kgpu_cluster_free(k->c);
    for (int i = 0; k->group_ids != NULL && i < k->ngroups; i++)
        free(k->group_ids[i]);
    free(k->group_ids);
    free(k->groups);
    free(k->scratch);
    free(k->reqs);
    free(k->seen);
    free(k->hash);
    free(k->table);
    free(k->req_ptrs);
    free(k->opts);
    free(k->opt_index);
}

/* The template nodes, one per node group, as nodes of k->c. */
static int add_groups(call *k, const caexp_config *cfg, kgpu_error *err)
{
    size_t n = k->req->n_nodebytesmap;
    if (n > CAEXP_MAX_GROUPS)
        return kgpu_error_set(err, KGPU_ERANGE, "%zu node groups (at most %d)", n,
                              CAEXP_MAX_GROUPS);
    k->groups = calloc(n + 1, sizeof(*k->groups));
    k->group_ids = calloc(n + 1, sizeof(*k->group_ids));
    if (k->groups == NULL || k->group_ids == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry *e = k->req->nodebytesmap[i];
        const char *id = e->key != NULL ? e->key : "";
        json_t *node = caexp_node_json(e->value.data, e->value.len, err);
        if (node == NULL)
            return prefix(err, "node group %s", id);
        kgpu_node_spec spec;
        kgpu_node_store store;
        int rc = kgpu_node_from_json(node, &spec, &store, err);
        bool spot = caexp_template_spot(node);
        json_decref(node);
        if (rc != 0)
            return prefix(err, "node group %s", id);
        spec.name = id; /* the group, not the template's own (often generated) name */
        spec.labels = NULL;
        spec.nlabels = 0;
        if ((k->group_ids[k->ngroups] = strdup(id)) == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        int idx = kgpu_cluster_add_node(k->c, &spec, err);
        if (idx < 0) {
            free(k->group_ids[k->ngroups]);
            return prefix(err, "node group %s", id);
        }
        /* A model without a price: -1, settled below once every group is in. */
        double price = cfg->prices != NULL
                           ? kgpu_prices_node(cfg->prices, k->c, kgpu_cluster_node(k->c, idx), spot)
                           : -1;
        k->groups[k->ngroups] = (kgpu_expander_group){.node = NULL, .price_hour = price,
                                                      .spot = spot};
        k->ngroups++;
    }
    /*
     * A group without a price costs 1 % more than the dearest priced group
     * of the call: after every known one, still chosen when it is the only
     * one that places the pods. None priced: all cost nothing, and the
     * option that places the most wins.
     */
    double dearest = 0;
    for (int g = 0; g < k->ngroups; g++)
        dearest = k->groups[g].price_hour > dearest ? k->groups[g].price_hour : dearest;
    for (int g = 0; g < k->ngroups; g++) {
        if (k->groups[g].price_hour < 0)
            k->groups[g].price_hour = dearest * 1.01;
        /* Nodes are read once all are in: adding one may move the others. */
        k->groups[g].node = kgpu_cluster_node(k->c, g);
    }
    return 0;
}

static int group_of(const call *k, const char *id)
{
    for (int g = 0; id != NULL && g < k->ngroups; g++)
        if (strcmp(k->group_ids[g], id) == 0)
            return g;
    return -1;
}

/*
 * A pending pod as one request: its GPU container's, with the pod's CPU and
 * memory (kgpu_pod puts them on parts[0]); a pod with several GPU
 * containers counts by the largest (kgpu/expander.h places one request per
 * pod); a pod without GPUs by its CPU and memory alone. Model globs are
 * compiled into the mask, which is all the fit reads afterwards.
 */
static int pod_request(call *k, const caexp_config *cfg, const uint8_t *b, size_t len,
                       kgpu_request *out, kgpu_error *err)
{
    json_t *pod = caexp_pod_json(b, len, err);
    if (pod == NULL)
        return KGPU_EPARSE;
    int rc = kgpu_pod_from_json(pod, cfg->memory_unit_mib, k->scratch, err);
    json_decref(pod);
    if (rc != 0)
        return rc;
    const kgpu_pod *p = k->scratch;
    kgpu_request r = {.cpu_milli = p->cpu_milli, .memory_mib = p->memory_mib};
    int best = -1;
    int64_t most = -1;
    for (int j = 0; j < p->nparts; j++) {
        const kgpu_request *q = &p->parts[j].req;
        int64_t d = (int64_t)q->gpu_count * (q->exclusive ? 1000 : q->gpu_milli) * 1000000 +
                    q->gpu_memory_mib * q->gpu_count;
        if (d > most) {
            most = d;
            best = j;
        }
    }
    if (best >= 0) {
        r = p->parts[best].req;
        r.cpu_milli = p->cpu_milli;
        r.memory_mib = p->memory_mib;
    }
    r.shape = -1;
    if ((rc = kgpu_request_compile(k->c, &r, err)) != 0)
        return rc;
    r.allow = r.exclude = NULL; /* they point into the scratch pod */
    r.nallow = r.nexclude = 0;
    *out = r;
    return 0;
}

static uint64_t fnv1a(const uint8_t *b, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/*
 * The request of a pod entry: Cluster Autoscaler lists the same pending pod
 * in every option that could take it, so each distinct pod (by its bytes)
 * is read once. NULL with err when it cannot be read, or when there are
 * more than CAEXP_MAX_PODS distinct pods.
 */
static const kgpu_request *request_of(call *k, const caexp_config *cfg,
                                      const ProtobufCBinaryData *b, kgpu_error *err)
{
    uint64_t h = fnv1a(b->data, b->len);
    size_t i = (size_t)h & (k->table_cap - 1);
    for (; k->table[i] >= 0; i = (i + 1) & (k->table_cap - 1)) {
        int u = k->table[i];
        if (k->hash[u] == h && k->seen[u]->len == b->len &&
            memcmp(k->seen[u]->data, b->data, b->len) == 0)
            return &k->reqs[u];
    }
    if (k->npods == CAEXP_MAX_PODS) {
        kgpu_error_set(err, KGPU_ERANGE, "more than %d distinct pods", CAEXP_MAX_PODS);
        return NULL;
    }
    size_t u = k->npods;
    if (pod_request(k, cfg, b->data, b->len, &k->reqs[u], err) != 0)
        return NULL;
    k->seen[u] = b;
    k->hash[u] = h;
    k->table[i] = (int)u;
    k->npods++;
    return &k->reqs[u];
}

static int add_options(call *k, const caexp_config *cfg, kgpu_error *err)
{
    size_t n = k->req->n_options, total = 0;
    for (size_t i = 0; i < n; i++)
        total += k->req->options[i]->n_podbytes;
    if (total > CAEXP_MAX_ENTRIES)
        return kgpu_error_set(err, KGPU_ERANGE, "%zu pod entries in the options (at most %d)",
                              total, CAEXP_MAX_ENTRIES);
    size_t distinct = total < CAEXP_MAX_PODS ? total : CAEXP_MAX_PODS;
    k->table_cap = 16;
    while (k->table_cap < 2 * distinct)
        k->table_cap *= 2;
    k->scratch = malloc(sizeof(*k->scratch));
    k->reqs = calloc(distinct + 1, sizeof(*k->reqs));
    k->seen = calloc(distinct + 1, sizeof(*k->seen));
    k->hash = calloc(distinct + 1, sizeof(*k->hash));
    k->table = malloc(k->table_cap * sizeof(*k->table));
    k->req_ptrs = calloc(total + 1, sizeof(*k->req_ptrs));
    k->opts = calloc(n + 1, sizeof(*k->opts));
    k->opt_index = calloc(n + 1, sizeof(*k->opt_index));
    if (k->scratch == NULL || k->reqs == NULL || k->seen == NULL || k->hash == NULL ||
        k->table == NULL || k->req_ptrs == NULL || k->opts == NULL || k->opt_index == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    memset(k->table, 0xff, k->table_cap * sizeof(*k->table)); /* all -1 */
    for (size_t i = 0; i < n; i++) {
        const Kgpu__Caexp__Option *o = k->req->options[i];
        const char *id = o->nodegroupid != NULL ? o->nodegroupid : "";
        int g = group_of(k, id);
        if (g < 0)
            continue; /* no template to judge it by: not kgpu's to offer */
        size_t first = k->nentries;
        for (size_t j = 0; j < o->n_podbytes; j++) {
            const kgpu_request *r = request_of(k, cfg, &o->podbytes[j], err);
            if (r == NULL)
                return prefix(err, "option %zu (group %s): pod %zu", i, id, j);
            k->req_ptrs[k->nentries++] = r;
        }
        k->opts[k->nopts] = (kgpu_expander_option){.group = g,
                                                   .node_count = o->has_nodecount ? o->nodecount
                                                                                  : 1,
                                                   .pods = &k->req_ptrs[first],
                                                   .npods = (int)(k->nentries - first)};
        if (k->opts[k->nopts].node_count < 1 ||
            k->opts[k->nopts].node_count > CAEXP_MAX_NEW_NODES)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "option %zu (group %s): nodeCount %d outside 1..%d", i, id,
                                  o->nodecount, CAEXP_MAX_NEW_NODES);
        k->opt_index[k->nopts++] = (int)i;
    }
    return 0;
}

int caexp_best_options(const caexp_config *cfg, const uint8_t *in, size_t len, uint8_t **out,
                       size_t *outlen, caexp_decision *d, kgpu_error *err)
{
    memset(d, 0, sizeof(*d));
    d->chosen = -1;
    *out = NULL;
    *outlen = 0;
    call k = {0};
    int rc = 0;
    k.req = kgpu__caexp__best_options_request__unpack(NULL, len, in);
    if (k.req == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "not a BestOptionsRequest");
    d->options = (int)k.req->n_options;
    if ((k.c = kgpu_cluster_new()) == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    if (rc == 0)
        rc = add_groups(&k, cfg, err);
    if (rc == 0)
        rc = add_options(&k, cfg, err);
    kgpu_expander_eval *evals = NULL;
    int choice = -1;
    if (rc == 0 && k.nopts > 0) {
        evals = calloc((size_t)k.nopts, sizeof(*evals));
        kgpu_expander_ctx ctx = {.models = k.c,
                                 .groups = k.groups,
                                 .ngroups = k.ngroups,
                                 .pod_gpu_price = cfg->pod_gpu_price,
                                 .pod_core_price = cfg->pod_core_price};
        rc = evals == NULL ? kgpu_error_set(err, KGPU_ENOMEM, "out of memory")
                           : kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, k.opts, k.nopts, NULL,
                                                  evals, &choice, err);
    }
    Kgpu__Caexp__BestOptionsResponse resp = KGPU__CAEXP__BEST_OPTIONS_RESPONSE__INIT;
    Kgpu__Caexp__Option opt = KGPU__CAEXP__OPTION__INIT, *opts[1] = {&opt};
    char debug[200];
    if (rc == 0 && choice >= 0) {
        const Kgpu__Caexp__Option *o = k.req->options[k.opt_index[choice]];
        d->chosen = k.opt_index[choice];
        d->placed = evals[choice].placed;
        d->offered = k.opts[choice].npods;
        snprintf(d->group, sizeof(d->group), "%s", o->nodegroupid ? o->nodegroupid : "");
        snprintf(debug, sizeof(debug), "kgpu: %d of %d pending pods fit %d new node(s)",
                 d->placed, d->offered, k.opts[choice].node_count);
        opt.nodegroupid = o->nodegroupid;
        opt.has_nodecount = o->has_nodecount;
        opt.nodecount = o->nodecount;
        opt.debug = debug;
        resp.n_options = 1;
        resp.options = opts;
    }
    if (rc == 0) {
        *outlen = kgpu__caexp__best_options_response__get_packed_size(&resp);
        *out = malloc(*outlen ? *outlen : 1);
        if (*out == NULL)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        else
            kgpu__caexp__best_options_response__pack(&resp, *out);
    }
    free(evals);
    call_free(&k);
    return rc;
}
