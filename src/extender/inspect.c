/*
 * The /inspect document: every node with its GPUs, the pods holding each
 * GPU, and the pods awaiting kubelet's Allocate. Observers never slow the
 * hot path: under the state lock only a snapshot is taken (the numbers and
 * names of each node, GPU, held pod and waiting pod copied into flat
 * arrays: O(state) copying, a few milliseconds for 5,000 nodes), and the
 * JSON, which takes a hundred times longer, is built after the lock is
 * released. Built under the lock, a 5,000-node document held filter up to
 * 2.9 s (bench/bench_inspect_contention measures both).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "serve.h"

/* Strings are kept in one arena and named by their offset in it. */
typedef size_t str_at;

typedef struct snap_node {
    str_at name;
    int64_t cpu_milli, cpu_free;
    int first_gpu, ngpus; /* into snapshot.gpus */
} snap_node;

typedef struct snap_pod {
    int gpu; /* into snapshot.gpus */
    str_at name, ns, container;
    int milli;
    int64_t memory_mib; /* -1: the whole GPU */
    bool bound;
    bool doubt; /* reserved by a Binding without a usable answer (doubt.c) */
} snap_pod;

typedef struct snap_wait {
    str_at name, ns, node;
    double seconds_left;
    ext_asks asks;
} snap_wait;

typedef struct snapshot {
    snap_node *nodes;
    int nnodes;
    kgpu_gpu *gpus;
    int ngpus;
    snap_pod *pods;
    size_t npods, pods_cap;
    snap_wait *waits;
    size_t nwaits;
    char models[KGPU_MAX_MODELS][KGPU_MODEL_NAME_MAX];
    char *text; /* the arena */
    size_t text_len, text_cap;
    bool oom;
    long total_pods, total_awaiting;
    /* The whole document only: the GPU queues and the recent evictions for reclaim. */
    ext_queue_row *queues; /* NULL: queues off */
    int nqueues;
    ext_eviction *evictions; /* EXT_EVICTIONS_KEPT of room */
    int nevictions;
} snapshot;

static str_at keep(snapshot *s, const char *str)
{
    size_t len = strlen(str) + 1;
    if (s->text_len + len > s->text_cap) {
        size_t cap = (s->text_cap + len) * 2;
        char *t = realloc(s->text, cap);
        if (t == NULL) {
            s->oom = true;
            return 0; /* offset 0 is "" (see snap_take) */
        }
        s->text = t;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, str, len);
    s->text_len += len;
    return s->text_len - len;
}

static const char *text(const snapshot *s, str_at at)
{
    return s->text + at;
}

static void add_pod(snapshot *s, const snap_pod *p)
{
    if (s->npods == s->pods_cap) {
        size_t cap = s->pods_cap ? s->pods_cap * 2 : 256;
        snap_pod *g = realloc(s->pods, cap * sizeof(*g));
        if (g == NULL) {
            s->oom = true;
            return;
        }
        s->pods = g;
        s->pods_cap = cap;
    }
    s->pods[s->npods++] = *p;
}

/*
 * Copies what /inspect shows of every node (or of node `only`) under the
 * state lock, which the caller holds. false: out of memory or no such node
 * (*found says which).
 */
static bool snap_take(ext_state *st, const char *only, snapshot *s, bool *found)
{
    const kgpu_cluster *c = st->cluster;
    int nn = kgpu_cluster_node_count(c), first = 0, last = nn;
    *found = true;
    if (only != NULL) {
        first = kgpu_cluster_find_node(c, only);
        if (first < 0) {
            *found = false;
            return false;
        }
        last = first + 1;
    }
    s->text_cap = (size_t)(last - first) * 32 + st->pods.len * 96 + 64;
    s->text = malloc(s->text_cap);
    s->nodes = calloc((size_t)(last - first) + 1, sizeof(*s->nodes));
    /* Node index in the cluster -> its first GPU in the snapshot, for the pods' rows. */
    int *gpu_base = malloc(((size_t)nn + 1) * sizeof(*gpu_base));
    int gpus = only != NULL ? kgpu_cluster_node(c, first)->ngpus : kgpu_cluster_gpu_count(c);
    s->gpus = malloc(((size_t)gpus + 1) * sizeof(*s->gpus));
    if (s->text == NULL || s->nodes == NULL || gpu_base == NULL || s->gpus == NULL) {
        free(gpu_base);
        return false;
    }
    s->text[0] = '\0';
    s->text_len = 1;
    for (int m = 0; m < kgpu_cluster_model_count(c) && m < KGPU_MAX_MODELS; m++)
        snprintf(s->models[m], sizeof(s->models[m]), "%s", kgpu_cluster_model_name(c, m));
    for (int i = first; i < last; i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        snap_node *sn = &s->nodes[s->nnodes++];
        sn->name = keep(s, n->name);
        sn->cpu_milli = n->cpu_milli;
        sn->cpu_free = n->cpu_free;
        sn->first_gpu = gpu_base[i] = s->ngpus;
        sn->ngpus = n->ngpus;
        if (n->ngpus > 0)
            memcpy(&s->gpus[s->ngpus], n->gpus, (size_t)n->ngpus * sizeof(*n->gpus));
        s->ngpus += n->ngpus;
    }
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->pods, &it, &k, &v)) {
        const ext_pod *p = v;
        s->total_pods++;
        for (int i = 0; i < p->nparts; i++) {
            const kgpu_assignment *a = &p->part[i].a;
            if (a->node < first || a->node >= last || a->ngpus == 0)
                continue;
            snap_pod row = {.name = keep(s, p->name),
                            .ns = keep(s, p->ns),
                            .container = keep(s, p->part[i].container),
                            .milli = a->gpu_milli,
                            .memory_mib = a->exclusive ? -1 : a->gpu_memory_mib,
                            .bound = p->status == POD_BOUND,
                            .doubt = p->doubt_until > 0};
            for (int g = 0; g < a->ngpus; g++) {
                row.gpu = gpu_base[a->node] + a->gpus[g];
                add_pod(s, &row);
            }
        }
    }
    free(gpu_base);
    s->total_awaiting = (long)st->awaiting.len;
    s->waits = calloc(st->awaiting.len + 1, sizeof(*s->waits));
    if (s->waits == NULL)
        return false;
    double now = ext_now();
    it = 0;
    while (kgpu_strmap_next(&st->awaiting, &it, &k, &v)) {
        const ext_await *w = v;
        if (only != NULL && strcmp(w->node, only) != 0)
            continue;
        snap_wait *sw = &s->waits[s->nwaits++];
        sw->name = keep(s, w->name);
        sw->ns = keep(s, w->ns);
        sw->node = keep(s, w->node);
        sw->seconds_left = w->until - now;
        sw->asks = w->asks;
    }
    if (only == NULL && ((s->evictions = malloc(EXT_EVICTIONS_KEPT * sizeof(*s->evictions))) ==
                             NULL ||
                         !ext_queues_rows(st, &s->queues, &s->nqueues, s->evictions,
                                          &s->nevictions)))
        return false;
    return !s->oom;
}

static void snap_free(snapshot *s)
{
    free(s->nodes);
    free(s->gpus);
    free(s->pods);
    free(s->waits);
    free(s->text);
    free(s->queues);
    free(s->evictions);
}

/* A guarantee, limit or use: {gpu_milli, memory_mib}, null where a dimension is unset. */
static json_t *amount_json(kgpu_qamount a)
{
    return json_pack("{s:o,s:o}", "gpu_milli",
                     a.milli == KGPU_QUEUE_UNSET ? json_null() : json_integer(a.milli),
                     "memory_mib",
                     a.mem_mib == KGPU_QUEUE_UNSET ? json_null() : json_integer(a.mem_mib));
}

/*
 * The rows depth first: each root, then the queues below it (each parent
 * before its children, siblings in definition order), whatever order the
 * file or the GPUQueue objects gave them in. into[0..n); false: no memory.
 */
static bool tree_order(const ext_queue_row *rows, int n, int *into)
{
    size_t bytes = ((size_t)n + 1) * sizeof(int);
    int *first = malloc(bytes), *next = malloc(bytes), *stack = malloc(bytes);
    bool ok = first != NULL && next != NULL && stack != NULL;
    int k = 0, top = 0;
    for (int i = 0; ok && i <= n; i++)
        first[i] = -1; /* first[n]: the roots */
    for (int i = n - 1; ok && i >= 0; i--) { /* prepended backwards: definition order */
        int p = rows[i].parent_row >= 0 && rows[i].parent_row < n ? rows[i].parent_row : n;
        next[i] = first[p];
        first[p] = i;
    }
    for (int r = ok ? first[n] : -1; r >= 0; r = next[r]) {
        stack[top++] = r;
        while (top > 0 && k < n) {
            int q = stack[--top];
            into[k++] = q;
            /* Children pushed last first, so the first is taken next. */
            int c[KGPU_QUEUE_MAX], nc = 0;
            for (int x = first[q]; x >= 0 && nc < KGPU_QUEUE_MAX; x = next[x])
                c[nc++] = x;
            while (nc > 0 && top < n)
                stack[top++] = c[--nc];
        }
    }
    free(first);
    free(next);
    free(stack);
    return ok && k == n;
}

/* The queues section: the tree (depth first, parents before children) and recent evictions. */
static void render_queues(const snapshot *s, json_t *doc)
{
    json_t *queues = json_array();
    int *order = malloc(((size_t)s->nqueues + 1) * sizeof(int));
    bool tree = order != NULL && tree_order(s->queues, s->nqueues, order);
    for (int i = 0; i < s->nqueues; i++) {
        const ext_queue_row *q = &s->queues[tree ? order[i] : i];
        json_array_append_new(
            queues,
            json_pack("{s:s,s:o,s:i,s:i,s:o,s:o,s:o,s:{s:I},s:i,s:i,s:I}", "name", q->name,
                      "parent", q->parent[0] ? json_string(q->parent) : json_null(), "depth",
                      q->depth, "weight", q->weight, "guarantee", amount_json(q->guarantee),
                      "limit", amount_json(q->limit), "used", amount_json(q->used), "borrowed",
                      "gpu_milli", (json_int_t)q->borrowed_milli, "pods", q->pods, "pending",
                      q->pending, "evictions", (json_int_t)q->evictions));
    }
    json_t *ev = json_array();
    for (int i = 0; i < s->nevictions; i++) {
        const ext_eviction *e = &s->evictions[i];
        static const char *outcomes[] = {"applied", "evicted", "blocked", "gone", "failed"};
        char when[64];
        kgpu_rfc3339(e->at, 0, when, sizeof(when));
        json_array_append_new(
            ev, json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:s}", "time", when, "pod",
                          e->name, "namespace", e->ns, "queue", e->queue, "node", e->node,
                          "for_pod", e->for_name, "for_namespace", e->for_ns, "for_queue",
                          e->for_queue, "gpu_milli_freed", (json_int_t)e->freed_milli,
                          "outcome",
                          e->outcome >= 0 && e->outcome <= EXT_EVICT_FAILED ? outcomes[e->outcome]
                                                                            : "?"));
    }
    json_object_set_new(doc, "queues_enabled", json_boolean(s->queues != NULL));
    json_object_set_new(doc, "queues", queues);
    json_object_set_new(doc, "queue_evictions", ev);
    free(order);
}

/* The document from a snapshot; no lock held. */
static json_t *render(const snapshot *s, bool one)
{
    /* The pods of each GPU in the order they were copied: a stable counting sort. */
    size_t *start = calloc((size_t)s->ngpus + 2, sizeof(*start));
    const snap_pod **by_gpu = malloc((s->npods + 1) * sizeof(*by_gpu));
    kgpu_strmap awaiting; /* node -> json array of the pods awaiting allocation there */
    kgpu_strmap_init(&awaiting);
    json_t *nodes = json_array();
    if (start == NULL || by_gpu == NULL || nodes == NULL) {
        free(start);
        free(by_gpu);
        json_decref(nodes);
        return NULL;
    }
    for (size_t i = 0; i < s->npods; i++)
        start[s->pods[i].gpu + 1]++;
    for (int g = 0; g < s->ngpus; g++)
        start[g + 1] += start[g];
    for (size_t i = 0; i < s->npods; i++)
        by_gpu[start[s->pods[i].gpu]++] = &s->pods[i];
    /* start[g] is now the end of GPU g's pods, which is where GPU g+1's begin. */
    for (size_t i = 0; i < s->nwaits; i++) {
        const snap_wait *w = &s->waits[i];
        json_t *list = kgpu_strmap_get(&awaiting, text(s, w->node));
        if (list == NULL && (list = json_array()) != NULL &&
            !kgpu_strmap_put(&awaiting, text(s, w->node), list, NULL)) {
            json_decref(list);
            list = NULL;
        }
        json_t *asks = json_array();
        for (int a = 0; a < w->asks.n; a++)
            json_array_append_new(asks,
                                  json_pack("{s:s,s:I}", "resource", ext_res_name(w->asks.a[a].res),
                                            "amount", (json_int_t)w->asks.a[a].amount));
        json_array_append_new(list, json_pack("{s:s,s:s,s:o,s:f}", "pod", text(s, w->name),
                                              "namespace", text(s, w->ns), "asks", asks,
                                              "seconds_left", w->seconds_left));
    }
    int64_t t_gpus = 0, t_mem = 0, t_mem_alloc = 0, t_milli_alloc = 0;
    for (int i = 0; i < s->nnodes; i++) {
        const snap_node *n = &s->nodes[i];
        json_t *gpus = json_array();
        int64_t mem = 0, mem_alloc = 0, milli_alloc = 0;
        for (int g = 0; g < n->ngpus; g++) {
            int at = n->first_gpu + g;
            const kgpu_gpu *x = &s->gpus[at];
            json_t *pods = json_array();
            for (size_t k = at > 0 ? start[at - 1] : 0; k < start[at]; k++) {
                const snap_pod *p = by_gpu[k];
                json_array_append_new(
                    pods, json_pack("{s:s,s:s,s:s,s:i,s:I,s:s}", "pod", text(s, p->name),
                                    "namespace", text(s, p->ns), "container", text(s, p->container),
                                    "milli", p->milli, "memory_mib", (json_int_t)p->memory_mib,
                                    "status",
                                    p->bound   ? "bound"
                                    : p->doubt ? "in-doubt"
                                               : "reserved"));
            }
            int64_t ma = x->memory_mib - x->free_memory_mib;
            mem += x->memory_mib;
            mem_alloc += ma;
            milli_alloc += KGPU_MILLI - x->free_milli;
            const char *model =
                x->model >= 0 && x->model < KGPU_MAX_MODELS ? s->models[x->model] : "?";
            json_array_append_new(gpus, json_pack("{s:i,s:s,s:s,s:I,s:I,s:i,s:i,s:b,s:i,s:o}",
                                                  "index", x->index, "uuid", x->uuid, "model",
                                                  model, "memory_mib", (json_int_t)x->memory_mib,
                                                  "memory_allocated_mib", (json_int_t)ma,
                                                  "milli_allocated", KGPU_MILLI - x->free_milli,
                                                  "numa", x->numa, "healthy", x->healthy,
                                                  "pods_sharing", x->placements, "pods", pods));
        }
        t_gpus += n->ngpus;
        t_mem += mem;
        t_mem_alloc += mem_alloc;
        t_milli_alloc += milli_alloc;
        json_t *waiting = kgpu_strmap_del(&awaiting, text(s, n->name));
        json_array_append_new(
            nodes, json_pack("{s:s,s:i,s:I,s:I,s:I,s:I,s:I,s:o,s:o}", "name", text(s, n->name),
                             "gpus_total", n->ngpus, "memory_mib", (json_int_t)mem,
                             "memory_allocated_mib", (json_int_t)mem_alloc, "milli_allocated",
                             (json_int_t)milli_alloc, "cpu_milli", (json_int_t)n->cpu_milli,
                             "cpu_free_milli", (json_int_t)n->cpu_free, "gpus", gpus,
                             "awaiting_allocation", waiting != NULL ? waiting : json_array()));
    }
    const char *wk;
    void *wv;
    size_t wi = 0;
    while (kgpu_strmap_next(&awaiting, &wi, &wk, &wv)) /* nodes not in the inventory (any more) */
        json_decref(wv);
    kgpu_strmap_clear(&awaiting);
    free(start);
    free(by_gpu);
    if (one) {
        json_t *node = json_incref(json_array_get(nodes, 0));
        json_decref(nodes);
        return node;
    }
    json_t *doc =
        json_pack("{s:o,s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I}}", "nodes", nodes, "totals", "nodes",
                  (json_int_t)json_array_size(nodes), "gpus", (json_int_t)t_gpus, "memory_mib",
                  (json_int_t)t_mem, "memory_allocated_mib", (json_int_t)t_mem_alloc,
                  "milli_allocated", (json_int_t)t_milli_alloc, "pods", (json_int_t)s->total_pods,
                  "pods_awaiting_allocation", (json_int_t)s->total_awaiting);
    if (doc != NULL)
        render_queues(s, doc);
    return doc;
}

json_t *ext_inspect_json(ext_state *st, const char *only)
{
    snapshot s;
    memset(&s, 0, sizeof(s));
    bool found;
    pthread_mutex_lock(&st->mu);
    ext_await_expire(st);
    ext_doubts_expire(st);
    bool ok = snap_take(st, only, &s, &found);
    pthread_mutex_unlock(&st->mu);
    json_t *doc = ok ? render(&s, only != NULL) : NULL;
    snap_free(&s);
    if (!found)
        return NULL;
    return doc;
}
