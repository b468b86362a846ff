/*
 * POST /estimate: what this cluster could take, for kgpu-dispatcher and
 * anyone choosing among clusters (docs/multicluster.md).
 *
 * The request names pods as kube-scheduler would send them (a Pod or a
 * pod template: metadata.annotations and spec.containers are read, by the
 * same parser as filter's), each with how many copies to count, and the
 * pods still in flight to this cluster ("reserve"), placed first. For each
 * pod the answer is how many copies kgpu's placement fits now, one after
 * another, on which GPU models, the fragmentation they leave, and the price
 * of the GPUs the first copy takes (--prices, the node's capacity type).
 *
 * Under the state lock only a copy is taken (the cluster, the target
 * workload, which nodes take no new pods and which are spot); the placing
 * runs on the copy after the lock is released, on the observers' queue, so
 * estimates never hold filter or bind. Nothing of the state changes: the
 * learned workload does not count these pods, no GPU is held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decide.h"
#include "kgpu/autoscale.h"
#include "kgpu/estimate.h"
#include "moves.h"
#include "nodegroups.h"

#define EST_PODS_MAX 32 /* pods asked about in one request */

typedef struct est_item {
    kgpu_pod pod;
    kgpu_request req; /* compiled against the copy */
    int count;
    char invalid[sizeof(((kgpu_error *)0)->msg)]; /* why it is not estimated; "" when it is */
} est_item;

typedef struct est_copy {
    kgpu_cluster *c;
    kgpu_workload target;
    bool *spot;       /* per node */
    int *group_nodes; /* per node group of --node-groups: its nodes here, by their labels */
} est_copy;

static void copy_free(est_copy *x)
{
    kgpu_cluster_free(x->c);
    free(x->target.shapes);
    free(x->spot);
    free(x->group_nodes);
}

/*
 * Takes the copy under the lock, then counts each node group's nodes on it
 * (once a request, whatever its pods); false when out of memory.
 */
static bool take_copy(ext_state *st, const kgpu_node_groups *groups, est_copy *x)
{
    memset(x, 0, sizeof(*x));
    pthread_mutex_lock(&st->mu);
    x->c = kgpu_cluster_clone(st->cluster);
    int nn = x->c != NULL ? kgpu_cluster_node_count(x->c) : 0;
    x->spot = calloc((size_t)nn + 1, sizeof(*x->spot));
    x->target.n = st->target.n;
    x->target.shapes = malloc(sizeof(kgpu_shape) * ((size_t)st->target.n + 1));
    bool ok = x->c != NULL && x->spot != NULL && x->target.shapes != NULL;
    if (ok) {
        memcpy(x->target.shapes, st->target.shapes, sizeof(kgpu_shape) * (size_t)st->target.n);
        kgpu_error err;
        for (int i = 0; i < nn; i++) {
            const kgpu_node *n = kgpu_cluster_node(x->c, i);
            x->spot[i] = kgpu_strmap_get(&st->spot_nodes, n->name) != NULL;
            if (ext_node_closed(st, n->name) != NULL || ext_dra_is_node(st, n->name))
                for (int g = 0; g < n->ngpus; g++) /* leaving, or DRA's: no new pod goes there */
                    kgpu_cluster_set_gpu_health(x->c, i, g, false, &err);
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (ok && groups != NULL)
        ok = (x->group_nodes = calloc((size_t)groups->n + 1, sizeof(int))) != NULL;
    for (int g = 0; ok && groups != NULL && g < groups->n; g++)
        for (int i = 0; i < kgpu_cluster_node_count(x->c); i++)
            x->group_nodes[g] += kgpu_node_group_member(&groups->v[g], kgpu_cluster_node(x->c, i));
    if (!ok)
        copy_free(x);
    return ok;
}

/* Reads {"pod": {...}, "count": N} at `where`; false with *msg set on a malformed entry. */
static bool read_item(const ext_config *cfg, json_t *e, const char *where, int min_count,
                      est_item *it, char *msg, size_t len)
{
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        if (strcmp(key, "pod") != 0 && strcmp(key, "count") != 0) {
            snprintf(msg, len, "%s: unknown field %.64s (pod, count)", where, key);
            return false;
        }
    }
    json_t *pod = json_object_get(e, "pod"), *count = json_object_get(e, "count");
    if (!json_is_object(pod)) {
        snprintf(msg, len, "%s.pod: expected a Pod or a pod template object", where);
        return false;
    }
    it->count = 1;
    if (count != NULL) {
        if (!json_is_integer(count) || json_integer_value(count) < min_count ||
            json_integer_value(count) > KGPU_ESTIMATE_MAX) {
            snprintf(msg, len, "%s.count: expected an integer %d..%d", where, min_count,
                     KGPU_ESTIMATE_MAX);
            return false;
        }
        it->count = (int)json_integer_value(count);
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    it->invalid[0] = '\0';
    if (kgpu_pod_from_template(pod, cfg->memory_unit_mib, &it->pod, &err) != 0)
        snprintf(it->invalid, sizeof(it->invalid), "%s", err.msg);
    else if (it->pod.nparts == 0)
        snprintf(it->invalid, sizeof(it->invalid), "the pod asks for no GPU");
    else if (it->pod.nparts > 1)
        snprintf(it->invalid, sizeof(it->invalid),
                 "a pod of %d GPU containers: only pods of one GPU container are estimated",
                 it->pod.nparts);
    else if (it->pod.policy[0] && kgpu_policy_find(it->pod.policy) == NULL)
        snprintf(it->invalid, sizeof(it->invalid), "unknown policy %s", it->pod.policy);
    return true;
}

/* Reads the array `name` of root into items; -1 with *msg on a malformed request. */
static int read_items(const ext_config *cfg, json_t *root, const char *name, int max,
                      int min_count, est_item **out, char *msg, size_t len)
{
    json_t *a = json_object_get(root, name);
    *out = NULL;
    if (a == NULL)
        return 0;
    if (!json_is_array(a) || json_array_size(a) > (size_t)max) {
        snprintf(msg, len, "%s: expected an array of at most %d entries", name, max);
        return -1;
    }
    size_t n = json_array_size(a);
    if (n == 0)
        return 0;
    if ((*out = calloc(n, sizeof(**out))) == NULL) {
        snprintf(msg, len, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char where[48];
        snprintf(where, sizeof(where), "%s[%zu]", name, i);
        json_t *e = json_array_get(a, i);
        if (!json_is_object(e)) {
            snprintf(msg, len, "%s: expected an object", where);
            return -1;
        }
        if (!read_item(cfg, e, where, min_count, &(*out)[i], msg, len))
            return -1;
    }
    return (int)n;
}

/* The request's pod, compiled against the copy without CPU and memory (kube-scheduler's). */
static void compile(est_copy *x, est_item *it)
{
    if (it->invalid[0])
        return;
    it->req = it->pod.parts[0].req;
    it->req.cpu_milli = it->req.memory_mib = 0;
    it->req.shape = -1;
    kgpu_error err;
    kgpu_error_clear(&err);
    if (kgpu_request_compile(x->c, &it->req, &err) != 0)
        snprintf(it->invalid, sizeof(it->invalid), "%s", err.msg);
}

/* Price per hour of what copy `a` of req takes on node `node`; 0 when unpriced. */
static double first_price(const ext_config *cfg, const est_copy *x, const kgpu_request *req,
                          int node, int model)
{
    if (cfg->prices == NULL || node < 0 || model < 0)
        return 0;
    const kgpu_price *p = kgpu_prices_gpu(cfg->prices, kgpu_cluster_model_name(x->c, model));
    if (p == NULL)
        return 0;
    double gpus = req->exclusive ? req->gpu_count : req->gpu_count * req->gpu_milli / 1000.0;
    return gpus * (x->spot[node] ? p->spot : p->on_demand);
}

/*
 * Per model: GPUs, those healthy, their free compute and those wholly free;
 * *free_milli gets the free compute of every healthy GPU.
 */
static json_t *models_json(const kgpu_cluster *c, double *free_milli)
{
    long gpus[KGPU_MAX_MODELS] = {0}, usable[KGPU_MAX_MODELS] = {0};
    long freem[KGPU_MAX_MODELS] = {0}, whole[KGPU_MAX_MODELS] = {0};
    *free_milli = 0;
    for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        for (int g = 0; g < n->ngpus; g++) {
            const kgpu_gpu *x = &n->gpus[g];
            gpus[x->model]++;
            if (!x->healthy)
                continue;
            usable[x->model]++;
            freem[x->model] += x->free_milli;
            whole[x->model] += x->placements == 0 && x->free_milli == KGPU_MILLI;
            *free_milli += x->free_milli;
        }
    }
    json_t *o = json_object();
    for (int m = 0; o != NULL && m < KGPU_MAX_MODELS; m++)
        if (gpus[m] > 0)
            json_object_set_new(o, kgpu_cluster_model_name(c, m),
                                json_pack("{s:I,s:I,s:I,s:I}", "gpus", (json_int_t)gpus[m],
                                          "usable", (json_int_t)usable[m], "freeMilli",
                                          (json_int_t)freem[m], "wholeFree",
                                          (json_int_t)whole[m]));
    return o;
}

/*
 * Copies the node groups could add: per group, the nodes it may still add
 * (maxNodes less its nodes here, by their labels) times the copies one new
 * node holds. Fills *by (group -> copies) and returns the sum, at most the
 * copies asked for.
 */
static int grow(const ext_config *cfg, const est_copy *x, const est_item *it, json_t *by)
{
    const kgpu_node_groups *gs = cfg->node_groups;
    long total = 0;
    for (int i = 0; gs != NULL && i < gs->n && total < it->count; i++) {
        const kgpu_node_group *g = &gs->v[i];
        int have = x->group_nodes[i];
        if (have >= g->max_nodes)
            continue;
        kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
        for (int k = 0; k < g->gpu_count; k++)
            gpus[k] = (kgpu_gpu_spec){.index = k, .model = g->gpu_model,
                                      .memory_mib = g->gpu_memory_mib, .numa = -1,
                                      .healthy = true};
        kgpu_node_spec tmpl = {.name = g->name, .gpus = gpus, .ngpus = g->gpu_count};
        kgpu_error err;
        int per = kgpu_estimate_empty_node(&tmpl, &it->pod.parts[0].req, it->count, &err);
        if (per <= 0)
            continue;
        long add = (long)per * (g->max_nodes - have);
        if (add > it->count - total)
            add = it->count - total;
        total += add;
        json_object_set_new(by, g->name, json_integer(add));
    }
    return (int)total;
}

static json_t *estimate_one(const ext_config *cfg, est_copy *x, const kgpu_shape_count *res,
                            int nres, est_item *it, kgpu_rng *rng)
{
    if (it->invalid[0])
        return json_pack("{s:i,s:s}", "fit", 0, "error", it->invalid);
    kgpu_error err;
    kgpu_error_clear(&err);
    const char *name = it->pod.policy[0] ? it->pod.policy : cfg->policy;
    kgpu_policy *p = kgpu_policy_new(name, x->c, &x->target, &err);
    if (p == NULL)
        return json_pack("{s:i,s:s}", "fit", 0, "error", err.msg);
    kgpu_policy_set_fit_cpu(p, false);
    kgpu_estimate e;
    int rc = kgpu_estimate_shape(x->c, p, &x->target, res, nres, &it->req, it->count, rng, &e,
                                 &err);
    kgpu_policy_free(p);
    if (rc != 0)
        return json_pack("{s:i,s:s}", "fit", 0, "error", err.msg);
    json_t *by = json_object(), *groups = json_object();
    for (int m = 0; by != NULL && m < KGPU_MAX_MODELS; m++)
        if (e.by_model[m] > 0)
            json_object_set_new(by, kgpu_cluster_model_name(x->c, m), json_integer(e.by_model[m]));
    int more = groups != NULL ? grow(cfg, x, it, groups) : 0;
    json_t *doc = json_pack("{s:i,s:o,s:i,s:o,s:s?,s:f,s:f,s:f,s:f,s:i,s:i}", "fit", e.fit,
                     "byModel", by, "grow", more, "growByGroup", groups,
                     "firstModel",
                     e.first_model >= 0 ? kgpu_cluster_model_name(x->c, e.first_model) : NULL,
                     "fragBefore", e.frag_before, "fragFirst", e.frag_first, "fragAfter",
                     e.frag_after, "pricePerHour",
                     first_price(cfg, x, &it->req, e.first_node, e.first_model), "reserved",
                     e.reserved, "reservedMissed", e.reserved_missed);
    if (doc != NULL && e.fit > 0)
        json_object_set_new(doc, "score", json_integer((json_int_t)e.score));
    return doc;
}

void ext_estimate(ext_ctx *d, const char *body, size_t len, ext_response *r)
{
    char msg[sizeof(((kgpu_error *)0)->msg) + 64] = "";
    if (ext_json_depth(body, len, d->cfg->max_json_depth) > d->cfg->max_json_depth) {
        ext_reply_json(r, 400, json_pack("{s:s}", "Error", "request JSON nested too deep"));
        return;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(root)) {
        if (root != NULL)
            snprintf(msg, sizeof(msg), "the body is not a JSON object");
        else
            snprintf(msg, sizeof(msg), "malformed JSON at line %d column %d: %s", jerr.line,
                     jerr.column, jerr.text);
        json_decref(root);
        ext_reply_json(r, 400, json_pack("{s:s}", "Error", msg));
        return;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "pods") != 0 && strcmp(key, "reserve") != 0 && msg[0] == '\0')
            snprintf(msg, sizeof(msg), "unknown field %.64s (pods, reserve)", key);
    }
    est_item *pods = NULL, *res = NULL;
    int np = msg[0] ? -1 : read_items(d->cfg, root, "pods", EST_PODS_MAX, 1, &pods, msg,
                                      sizeof(msg));
    int nr = np < 0 ? -1
                    : read_items(d->cfg, root, "reserve", KGPU_ESTIMATE_RESERVE, 0, &res, msg,
                                 sizeof(msg));
    json_decref(root);
    if (np == 0 && nr >= 0)
        snprintf(msg, sizeof(msg), "pods: at least one pod to estimate");
    for (int i = 0; i < nr && msg[0] == '\0'; i++)
        if (res[i].invalid[0])
            snprintf(msg, sizeof(msg), "reserve[%d]: %s", i, res[i].invalid);
    if (msg[0]) {
        free(pods);
        free(res);
        ext_reply_json(r, 400, json_pack("{s:s}", "Error", msg));
        return;
    }
    est_copy x;
    if (!take_copy(d->state, d->cfg->node_groups, &x)) {
        free(pods);
        free(res);
        ext_reply_json(r, 503, json_pack("{s:s}", "Error", "out of memory; retry"));
        return;
    }
    kgpu_shape_count *sc = calloc((size_t)nr + 1, sizeof(*sc));
    int nsc = 0;
    for (int i = 0; sc != NULL && i < nr; i++) {
        compile(&x, &res[i]);
        if (res[i].invalid[0] == '\0') /* a reserved model this cluster has not: takes nothing */
            sc[nsc++] = (kgpu_shape_count){&res[i].req, res[i].count};
    }
    json_t *out = json_array();
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 29, 2); /* the same state, the same answer */
    for (int i = 0; out != NULL && sc != NULL && i < np; i++) {
        compile(&x, &pods[i]);
        json_array_append_new(out, estimate_one(d->cfg, &x, sc, nsc, &pods[i], &rng));
    }
    double idle = 0;
    json_t *models = models_json(x.c, &idle);
    json_t *doc = out != NULL && sc != NULL
                      ? json_pack("{s:s,s:s,s:s?,s:o,s:f,s:o}", "component", "kgpu-extender",
                                  "policy", d->cfg->policy, "cluster",
                                  d->cfg->cluster_name[0] ? d->cfg->cluster_name : NULL,
                                  "models", models, "freeMilli", idle, "pods", out)
                      : NULL;
    if (doc == NULL && (out == NULL || sc == NULL)) { /* json_pack never took them */
        json_decref(out);
        json_decref(models);
    }
    copy_free(&x);
    free(sc);
    free(pods);
    free(res);
    if (doc == NULL)
        ext_reply_json(r, 503, json_pack("{s:s}", "Error", "out of memory; retry"));
    else
        ext_reply_json(r, 200, doc);
}
