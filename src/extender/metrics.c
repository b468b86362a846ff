/*
 * Prometheus text exposition (format 0.0.4) of the extender: request counts
 * and latency histograms per verb, bind failures by reason, watch restarts,
 * and from the state, per-GPU allocation and GPU-hours and their cost per
 * namespace, queue, GPU model and capacity type.
 * Counters are atomics updated lock-free; the state part is read under the
 * state lock and written out after it is released.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capacity.h"
#include "kgpu/autoscale.h"
#include "serve.h"

typedef struct buf {
    char *s;
    size_t len, cap;
    bool oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = b->oom ? -1 : vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *s = realloc(b->s, cap);
        if (s == NULL) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* Label values escaped as the exposition format wants (\\, \", \n). */
static const char *esc(const char *in, char *out, size_t len)
{
    size_t o = 0;
    for (; *in && o + 2 < len; in++) {
        if (*in == '\\' || *in == '"') {
            out[o++] = '\\';
            out[o++] = *in;
        } else if (*in == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *in;
        }
    }
    out[o] = '\0';
    return out;
}

static void render_requests(buf *b, ext_metrics *m)
{
    put(b, "# HELP kgpu_extender_requests_total Extender calls by verb.\n"
           "# TYPE kgpu_extender_requests_total counter\n");
    for (int v = 0; v < VERB_COUNT - 1; v++)
        put(b, "kgpu_extender_requests_total{verb=\"%s\"} %llu\n", ext_verb_name(v),
            atomic_load(&m->requests[v]));
    put(b, "# HELP kgpu_extender_bad_requests_total Calls refused as malformed, by verb.\n"
           "# TYPE kgpu_extender_bad_requests_total counter\n");
    for (int v = 0; v < VERB_COUNT - 1; v++)
        put(b, "kgpu_extender_bad_requests_total{verb=\"%s\"} %llu\n", ext_verb_name(v),
            atomic_load(&m->bad_requests[v]));
    put(b, "# HELP kgpu_extender_invalid_pods_total Calls for pods whose GPU request kgpu cannot "
           "honour (answered with the reason), by verb.\n"
           "# TYPE kgpu_extender_invalid_pods_total counter\n");
    for (int v = 0; v < VERB_COUNT - 1; v++)
        put(b, "kgpu_extender_invalid_pods_total{verb=\"%s\"} %llu\n", ext_verb_name(v),
            atomic_load(&m->invalid_pods[v]));
    put(b, "# HELP kgpu_extender_request_duration_seconds Time to answer an extender call.\n"
           "# TYPE kgpu_extender_request_duration_seconds histogram\n");
    for (int v = 0; v < VERB_COUNT - 1; v++) {
        ext_hist *h = &m->latency[v];
        unsigned long long cum = 0;
        for (int i = 0; i <= EXT_HIST_BUCKETS; i++) {
            cum += atomic_load(&h->bucket[i]);
            if (i < EXT_HIST_BUCKETS)
                put(b,
                    "kgpu_extender_request_duration_seconds_bucket{verb=\"%s\",le=\"%g\"} %llu\n",
                    ext_verb_name(v), ext_hist_bounds[i], cum);
            else
                put(b,
                    "kgpu_extender_request_duration_seconds_bucket{verb=\"%s\",le=\"+Inf\"} %llu\n",
                    ext_verb_name(v), cum);
        }
        put(b, "kgpu_extender_request_duration_seconds_sum{verb=\"%s\"} %.9f\n", ext_verb_name(v),
            (double)atomic_load(&h->sum_ns) / 1e9);
        put(b, "kgpu_extender_request_duration_seconds_count{verb=\"%s\"} %llu\n", ext_verb_name(v),
            cum);
    }
    put(b, "# HELP kgpu_extender_bind_failures_total Binds that failed, by reason.\n"
           "# TYPE kgpu_extender_bind_failures_total counter\n");
    for (int f = 0; f < BIND_FAIL_COUNT; f++)
        put(b, "kgpu_extender_bind_failures_total{reason=\"%s\"} %llu\n", ext_bind_fail_name(f),
            atomic_load(&m->bind_failures[f]));
    put(b, "# HELP kgpu_extender_watch_restarts_total Relists of the API server watch.\n"
           "# TYPE kgpu_extender_watch_restarts_total counter\n");
    put(b, "kgpu_extender_watch_restarts_total{resource=\"nodes\"} %llu\n",
        atomic_load(&m->watch_restarts[0]));
    put(b, "kgpu_extender_watch_restarts_total{resource=\"pods\"} %llu\n",
        atomic_load(&m->watch_restarts[1]));
    put(b, "# HELP kgpu_extender_assignment_conflicts_total Recorded GPU assignments that could "
           "not be honoured (they would overbook a GPU, or name a GPU that is not there).\n"
           "# TYPE kgpu_extender_assignment_conflicts_total counter\n");
    put(b, "kgpu_extender_assignment_conflicts_total %llu\n",
        atomic_load(&m->assignment_conflicts));
    put(b, "# HELP kgpu_extender_consolidations_total Pods given room by moving restartable "
           "pods (--consolidate): plans whose evictions were sent.\n"
           "# TYPE kgpu_extender_consolidations_total counter\n"
           "kgpu_extender_consolidations_total %llu\n",
        atomic_load(&m->consolidations));
    put(b, "# HELP kgpu_extender_consolidation_moves_total Restartable pods evicted to be placed "
           "again elsewhere (--consolidate), as the API server accepted.\n"
           "# TYPE kgpu_extender_consolidation_moves_total counter\n"
           "kgpu_extender_consolidation_moves_total %llu\n",
        atomic_load(&m->consolidation_moves));
    put(b, "# HELP kgpu_extender_nodes_scale_down_guarded GPU nodes the scale-down guard's last "
           "round found must stay: their GPU pods could not all run on the other nodes.\n"
           "# TYPE kgpu_extender_nodes_scale_down_guarded gauge\n"
           "kgpu_extender_nodes_scale_down_guarded %d\n",
        atomic_load(&m->guard_nodes));
    put(b, "# HELP kgpu_extender_nodes_emptied_total Nodes --consolidate-nodes started to empty "
           "(every GPU pod restartable and able to run elsewhere) for an autoscaler to remove.\n"
           "# TYPE kgpu_extender_nodes_emptied_total counter\n"
           "kgpu_extender_nodes_emptied_total %llu\n",
        atomic_load(&m->nodes_emptied));
    put(b, "# HELP kgpu_extender_assignments_refused_total Recorded GPU assignments not counted "
           "because they give more than the pod asks for (forged by whoever wrote the pod).\n"
           "# TYPE kgpu_extender_assignments_refused_total counter\n");
    put(b, "kgpu_extender_assignments_refused_total %llu\n",
        atomic_load(&m->assignments_refused));
    static const char *doubt_ends[3] = {"landed", "released", "expired"};
    put(b, "# HELP kgpu_extender_bind_doubts_total Binds whose Binding got no usable answer (a "
           "timeout, a 5xx) and kept their GPUs, by how that ended: the Binding shown applied, "
           "shown not to be (released), or --bind-doubt passed (expired).\n"
           "# TYPE kgpu_extender_bind_doubts_total counter\n");
    for (int i = 0; i < 3; i++)
        put(b, "kgpu_extender_bind_doubts_total{outcome=\"%s\"} %llu\n", doubt_ends[i],
            atomic_load(&m->doubts_ended[i]));
    static const char *refused[EXT_HTTP_REFUSED_COUNT] = {"too_large", "busy", "bad_framing",
                                                          "unauthenticated"};
    put(b, "# HELP kgpu_extender_http_refused_total Requests answered before their body was "
           "read, by reason.\n"
           "# TYPE kgpu_extender_http_refused_total counter\n");
    for (int i = 0; i < EXT_HTTP_REFUSED_COUNT; i++)
        put(b, "kgpu_extender_http_refused_total{reason=\"%s\"} %llu\n", refused[i],
            atomic_load(&m->http_refused[i]));
    put(b, "# HELP kgpu_extender_http_deadline_closes_total Connections closed for not sending "
           "a whole request (or taking its answer) within requestTimeoutSeconds.\n"
           "# TYPE kgpu_extender_http_deadline_closes_total counter\n");
    put(b, "kgpu_extender_http_deadline_closes_total %llu\n",
        atomic_load(&m->http_deadline_closes));
    put(b, "# HELP kgpu_extender_http_connections Connections open on the scheduling port.\n"
           "# TYPE kgpu_extender_http_connections gauge\n");
    put(b, "kgpu_extender_http_connections %lld\n", atomic_load(&m->http_connections));
    put(b, "# HELP kgpu_extender_http_connections_total Connections accepted on the scheduling "
           "port (each a TLS handshake with HTTPS): many per scheduled pod means clients do not "
           "keep their connections.\n"
           "# TYPE kgpu_extender_http_connections_total counter\n");
    put(b, "kgpu_extender_http_connections_total %llu\n", atomic_load(&m->http_accepted));
    put(b, "# HELP kgpu_extender_http_buffered_bytes Bytes of request bodies held now, counted "
           "against maxBufferedBytes.\n"
           "# TYPE kgpu_extender_http_buffered_bytes gauge\n");
    put(b, "kgpu_extender_http_buffered_bytes %lld\n", atomic_load(&m->http_buffered));
    put(b, "# HELP kgpu_extender_http_buffered_bytes_peak The most bytes of request bodies "
           "ever held at once.\n"
           "# TYPE kgpu_extender_http_buffered_bytes_peak gauge\n");
    put(b, "kgpu_extender_http_buffered_bytes_peak %lld\n", atomic_load(&m->http_buffered_peak));
}

/* Per-GPU figures copied under the state lock, formatted after it is released. */
typedef struct gpu_row {
    const char *node, *model; /* into the snapshot's arenas */
    char uuid[KGPU_UUID_MAX];
    int index, milli_alloc, placements;
    long long mem, mem_alloc;
} gpu_row;

typedef struct snapshot {
    gpu_row *rows;
    int n;
    char *names; /* node names, NUL-separated */
    char models[KGPU_MAX_MODELS][KGPU_MODEL_NAME_MAX];
} snapshot;

static bool take_snapshot(const kgpu_cluster *c, snapshot *s)
{
    int nn = kgpu_cluster_node_count(c);
    size_t names = 0;
    for (int i = 0; i < nn; i++)
        names += strlen(kgpu_cluster_node(c, i)->name) + 1;
    s->rows = malloc((size_t)kgpu_cluster_gpu_count(c) * sizeof(*s->rows) + 1);
    s->names = malloc(names + 1);
    if (s->rows == NULL || s->names == NULL)
        return false;
    for (int m = 0; m < kgpu_cluster_model_count(c) && m < KGPU_MAX_MODELS; m++)
        snprintf(s->models[m], sizeof(s->models[m]), "%s", kgpu_cluster_model_name(c, m));
    char *at = s->names;
    s->n = 0;
    for (int i = 0; i < nn; i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        size_t len = strlen(n->name) + 1;
        memcpy(at, n->name, len);
        for (int g = 0; g < n->ngpus; g++) {
            const kgpu_gpu *x = &n->gpus[g];
            gpu_row *r = &s->rows[s->n++];
            r->node = at;
            r->model = s->models[x->model];
            memcpy(r->uuid, x->uuid, sizeof(r->uuid));
            r->index = x->index;
            r->milli_alloc = KGPU_MILLI - x->free_milli;
            r->placements = x->placements;
            r->mem = x->memory_mib;
            r->mem_alloc = x->memory_mib - x->free_memory_mib;
        }
        at += len;
    }
    return true;
}

/* The per-GPU gauge families, in the order they are written. */
static const struct {
    const char *name, *help;
} gpu_families[] = {
    {"kgpu_gpu_memory_allocated_mib", "GPU memory allocated to pods, MiB."},
    {"kgpu_gpu_memory_capacity_mib", "GPU memory, MiB."},
    {"kgpu_gpu_compute_allocated_milli",
     "GPU compute allocated to pods, milli-GPU (1000 = the whole GPU)."},
    {"kgpu_gpu_compute_capacity_milli", "GPU compute, milli-GPU."},
    {"kgpu_gpu_pods", "Pods holding a share of the GPU."},
};
#define GPU_FAMILIES ((int)(sizeof(gpu_families) / sizeof(gpu_families[0])))
#define GPU_LINE_MAX 1400 /* a sample line: three escaped labels of at most 600, 200, 200 */

/* Family f's HELP and TYPE lines (row -1) or its sample for snapshot row `row`, into out. */
static int gpu_line(char *out, size_t len, const snapshot *s, int f, int row)
{
    const char *name = gpu_families[f].name;
    if (row < 0)
        return snprintf(out, len, "# HELP %s %s\n# TYPE %s gauge\n", name, gpu_families[f].help,
                        name);
    const gpu_row *r = &s->rows[row];
    long long v = f == 0   ? r->mem_alloc
                  : f == 1 ? r->mem
                  : f == 2 ? r->milli_alloc
                  : f == 3 ? KGPU_MILLI
                           : r->placements;
    char n1[600], u1[200], m1[200];
    return snprintf(out, len, "%s{node=\"%s\",gpu=\"%d\",uuid=\"%s\",model=\"%s\"} %lld\n",
                    name, esc(r->node, n1, sizeof(n1)), r->index, esc(r->uuid, u1, sizeof(u1)),
                    esc(r->model, m1, sizeof(m1)), v);
}

/* The per-queue families (at most KGPU_QUEUE_MAX queues: ~100 bytes a queue and family). */
static void render_queues(buf *b, const ext_queue_row *q, int n)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kgpu_queue_guarantee_gpus", "gauge", "GPU compute guaranteed to the queue, in GPUs."},
        {"kgpu_queue_limit_gpus", "gauge", "GPU compute the queue may never pass, in GPUs."},
        {"kgpu_queue_guarantee_memory_bytes", "gauge", "GPU memory guaranteed to the queue."},
        {"kgpu_queue_limit_memory_bytes", "gauge", "GPU memory the queue may never pass."},
        {"kgpu_queue_used_gpus", "gauge",
         "GPU compute held by pods of the queue and the queues under it, in GPUs."},
        {"kgpu_queue_used_memory_bytes", "gauge",
         "GPU memory held by pods of the queue and the queues under it."},
        {"kgpu_queue_borrowed_gpus", "gauge",
         "GPU compute the queue uses above its guarantee, in GPUs."},
        {"kgpu_queue_pods", "gauge", "Pods charged to the queue and the queues under it."},
        {"kgpu_queue_pending_pods", "gauge",
         "Pods of the queue (and under it) whose last filter waited for quota or reclaim."},
        {"kgpu_queue_evictions_total", "counter",
         "Pods of the queue evicted by reclaim for pods of other queues."},
    };
    char e[200];
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        put(b, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help, fam[f].name,
            fam[f].type);
        for (int i = 0; i < n; i++) {
            const ext_queue_row *x = &q[i];
            int64_t v;
            switch (f) {
            case 0: v = x->guarantee.milli; break;
            case 1: v = x->limit.milli; break;
            case 2: v = x->guarantee.mem_mib; break;
            case 3: v = x->limit.mem_mib; break;
            case 4: v = x->used.milli; break;
            case 5: v = x->used.mem_mib; break;
            case 6: v = x->borrowed_milli; break;
            case 7: v = x->pods; break;
            case 8: v = x->pending; break;
            default: v = (int64_t)x->evictions; break;
            }
            if (v == KGPU_QUEUE_UNSET && f <= 3)
                continue; /* not set: no sample rather than a made-up number */
            esc(x->name, e, sizeof(e));
            if (f == 0 || f == 1 || f == 4 || f == 6)
                put(b, "%s{queue=\"%s\"} %.3f\n", fam[f].name, e, (double)v / 1000.0);
            else if (f == 2 || f == 3 || f == 5)
                put(b, "%s{queue=\"%s\"} %lld\n", fam[f].name, e, (long long)v << 20);
            else
                put(b, "%s{queue=\"%s\"} %lld\n", fam[f].name, e, (long long)v);
        }
    }
}

static int cmp_usage(const void *pa, const void *pb)
{
    const ext_usage *a = pa, *b = pb;
    int c = strcmp(a->ns, b->ns);
    if (c == 0)
        c = strcmp(a->queue, b->queue);
    if (c == 0)
        c = strcmp(a->model, b->model);
    return c != 0 ? c : (int)a->spot - (int)b->spot;
}

static const char *capacity(bool spot)
{
    return spot ? KGPU_CAPACITY_SPOT : KGPU_CAPACITY_ON_DEMAND;
}

/*
 * The usage families (usage.c; docs/install-extender.md "Metrics"): per
 * namespace, queue, model and capacity type the GPU-seconds and GPUs held,
 * and with a price table the cost, the prices, and the GPU-seconds of
 * models it has no price for. rows are sorted here.
 */
static void render_usage(buf *b, ext_usage *rows, size_t n, const kgpu_prices *prices)
{
    qsort(rows, n, sizeof(*rows), cmp_usage);
    char ens[200], eq[200], em[200], ec[64];
#define USAGE_LABELS "namespace=\"%s\",queue=\"%s\",model=\"%s\",capacity_type=\"%s\""
#define USAGE_ARGS(u)                                                                          \
    esc((u)->ns, ens, sizeof(ens)), esc((u)->queue, eq, sizeof(eq)),                           \
        esc((u)->model, em, sizeof(em)), capacity((u)->spot)
    put(b, "# HELP kgpu_namespace_gpu_seconds_total GPU time allocated to pods of the namespace, "
           "in GPU-seconds (divide by 3600 for GPU-hours; a share counts as its fraction of the "
           "GPU, compute or memory whichever is larger), by queue, GPU model and capacity type.\n"
           "# TYPE kgpu_namespace_gpu_seconds_total counter\n");
    for (size_t i = 0; i < n; i++)
        put(b, "kgpu_namespace_gpu_seconds_total{" USAGE_LABELS "} %.6f\n", USAGE_ARGS(&rows[i]),
            rows[i].gpu_seconds);
    put(b, "# HELP kgpu_namespace_gpus_allocated GPUs allocated to pods of the namespace now, by "
           "queue, GPU model and capacity type.\n"
           "# TYPE kgpu_namespace_gpus_allocated gauge\n");
    for (size_t i = 0; i < n; i++)
        put(b, "kgpu_namespace_gpus_allocated{" USAGE_LABELS "} %.6f\n", USAGE_ARGS(&rows[i]),
            rows[i].gpus);
    if (prices == NULL)
        return;
    esc(prices->currency, ec, sizeof(ec));
    put(b, "# HELP kgpu_namespace_gpu_cost_total What the namespace's GPU time cost, in the "
           "currency's units: GPU-seconds / 3600 x the model's price per GPU-hour for the "
           "capacity type (the extender's prices file).\n"
           "# TYPE kgpu_namespace_gpu_cost_total counter\n");
    for (size_t i = 0; i < n; i++) {
        const kgpu_price *p = kgpu_prices_gpu(prices, rows[i].model);
        if (p != NULL)
            put(b, "kgpu_namespace_gpu_cost_total{" USAGE_LABELS ",currency=\"%s\"} %.9g\n",
                USAGE_ARGS(&rows[i]), ec,
                rows[i].gpu_seconds / 3600.0 * (rows[i].spot ? p->spot : p->on_demand));
    }
    put(b, "# HELP kgpu_gpu_price_per_hour The price of a GPU-hour by model and capacity type "
           "(the extender's prices file).\n"
           "# TYPE kgpu_gpu_price_per_hour gauge\n");
    for (int m = 0; m < prices->nmodels; m++)
        for (int spot = 0; spot < 2; spot++)
            put(b, "kgpu_gpu_price_per_hour{model=\"%s\",capacity_type=\"%s\",currency=\"%s\"} "
                   "%.6f\n",
                esc(prices->model[m], em, sizeof(em)), capacity(spot), ec,
                spot ? prices->gpu[m].spot : prices->gpu[m].on_demand);
    put(b, "# HELP kgpu_unpriced_gpu_seconds_total GPU-seconds of models the prices file has no "
           "price for: time no cost series counts.\n"
           "# TYPE kgpu_unpriced_gpu_seconds_total counter\n");
    /* Sum per model and capacity type: rows are sorted by namespace first, so look back. */
    for (size_t i = 0; i < n; i++) {
        if (kgpu_prices_gpu(prices, rows[i].model) != NULL)
            continue;
        bool first = true;
        for (size_t j = 0; j < i && first; j++)
            first = !(rows[j].spot == rows[i].spot && strcmp(rows[j].model, rows[i].model) == 0);
        if (!first)
            continue;
        double sum = 0;
        for (size_t j = i; j < n; j++)
            if (rows[j].spot == rows[i].spot && strcmp(rows[j].model, rows[i].model) == 0)
                sum += rows[j].gpu_seconds;
        put(b, "kgpu_unpriced_gpu_seconds_total{model=\"%s\",capacity_type=\"%s\"} %.6f\n",
            esc(rows[i].model, em, sizeof(em)), capacity(rows[i].spot), sum);
    }
#undef USAGE_LABELS
#undef USAGE_ARGS
}

/*
 * Every family but the per-GPU ones into b (which has a buffer), taking the
 * GPU snapshot they are written from into *snap (the caller frees it). False
 * when out of memory.
 */
static bool render_into(ext_metrics *m, ext_state *st, bool ready, buf *b, snapshot *snap)
{
    render_requests(b, m);
    memset(snap, 0, sizeof(*snap));
    pthread_mutex_lock(&st->mu);
    ext_doubts_expire(st);
    long doubts = (long)st->doubts;
    long leaving = (long)st->leaving.len;
    ext_state_integrate_usage(st);
    bool ok = take_snapshot(st->cluster, snap);
    ext_usage *usage = NULL;
    size_t nusage = 0;
    if (!ext_usage_rows(st, &usage, &nusage))
        ok = false;
    long pods = (long)st->pods.len;
    ext_await_expire(st);
    long awaiting = (long)st->awaiting.len;
    long cpu_pods = (long)st->cpu_pods.len;
    long observed = st->observations;
    ext_queue_row *queues = NULL;
    int nqueues = 0, nev = 0;
    ext_eviction *ev = malloc(EXT_EVICTIONS_KEPT * sizeof(*ev));
    if (ev == NULL || !ext_queues_rows(st, &queues, &nqueues, ev, &nev))
        ok = false;
    free(ev);
    pthread_mutex_unlock(&st->mu);
    render_queues(b, queues, nqueues);
    free(queues);
    render_usage(b, usage, nusage, st->cfg->prices);
    free(usage);
    put(b,
        "# HELP kgpu_extender_pods Pods holding GPUs.\n# TYPE kgpu_extender_pods gauge\n"
        "kgpu_extender_pods %ld\n",
        pods);
    put(b,
        "# HELP kgpu_extender_cpu_pods Pods bound to GPU nodes without kgpu GPUs, whose CPU "
        "and memory the policies count on their node.\n"
        "# TYPE kgpu_extender_cpu_pods gauge\nkgpu_extender_cpu_pods %ld\n",
        cpu_pods);
    put(b,
        "# HELP kgpu_extender_pods_learned_total Pods the placement policies have learned the "
        "workload from, each once: GPU pods when first filtered or seen bound, pods without "
        "a GPU at their first prioritize-gpuless.\n"
        "# TYPE kgpu_extender_pods_learned_total counter\nkgpu_extender_pods_learned_total %ld\n",
        observed);
    put(b,
        "# HELP kgpu_pods_awaiting_allocation Pods bound by kgpu whose devices kubelet has not "
        "asked for yet; each keeps pods of the same size off its node until then.\n"
        "# TYPE kgpu_pods_awaiting_allocation gauge\nkgpu_pods_awaiting_allocation %ld\n",
        awaiting);
    put(b,
        "# HELP kgpu_extender_binds_in_doubt Binds whose Binding got no usable answer and may "
        "still be applied: their GPUs stay held (--bind-doubt).\n"
        "# TYPE kgpu_extender_binds_in_doubt gauge\nkgpu_extender_binds_in_doubt %ld\n",
        doubts);
    put(b,
        "# HELP kgpu_extender_nodes_leaving GPU nodes kgpu places no new pod on because they are "
        "going away: deleted, cordoned, or tainted by an autoscaler or a spot interruption "
        "handler.\n"
        "# TYPE kgpu_extender_nodes_leaving gauge\nkgpu_extender_nodes_leaving %ld\n",
        leaving);
    put(b,
        "# HELP kgpu_extender_ready Whether inventory and pods are loaded.\n"
        "# TYPE kgpu_extender_ready gauge\nkgpu_extender_ready %d\n",
        ready ? 1 : 0);
    return ok && !b->oom;
}

static bool buf_init(buf *b)
{
    *b = (buf){.cap = 1 << 16};
    b->s = malloc(b->cap);
    if (b->s != NULL)
        b->s[0] = '\0';
    return b->s != NULL;
}

/* A /metrics answer being sent: the rendered families, then the GPU lines. */
typedef struct metrics_stream {
    ext_metrics *m;
    buf text;
    size_t text_off;
    snapshot snap; /* its rows point into itself: taken here, never copied */
    int family, row;
    char line[GPU_LINE_MAX];
    size_t line_len, line_off; /* the part of line not sent yet */
} metrics_stream;

static long metrics_read(void *ctx, char *out, size_t max)
{
    metrics_stream *ms = ctx;
    size_t n = 0;
    while (n < max) {
        const char *src = NULL;
        size_t *off = NULL, have = 0;
        if (ms->line_off < ms->line_len) {
            src = ms->line, off = &ms->line_off, have = ms->line_len;
        } else if (ms->text_off < ms->text.len) {
            src = ms->text.s, off = &ms->text_off, have = ms->text.len;
        } else if (ms->family >= GPU_FAMILIES) {
            break;
        } else if (ms->row >= ms->snap.n) {
            ms->family++;
            ms->row = -1;
            continue;
        } else {
            int len = gpu_line(ms->line, sizeof(ms->line), &ms->snap, ms->family, ms->row++);
            ms->line_len = len > 0 ? (size_t)len : 0;
            if (ms->line_len >= sizeof(ms->line))
                ms->line_len = sizeof(ms->line) - 1; /* cannot happen: the labels are bounded */
            ms->line_off = 0;
            continue;
        }
        size_t k = have - *off < max - n ? have - *off : max - n;
        memcpy(out + n, src + *off, k);
        *off += k;
        n += k;
    }
    return (long)n;
}

static void metrics_free(void *ctx)
{
    metrics_stream *ms = ctx;
    atomic_fetch_sub(&ms->m->metrics_streams, 1);
    free(ms->text.s);
    free(ms->snap.rows);
    free(ms->snap.names);
    free(ms);
}

bool ext_metrics_stream(ext_metrics *m, ext_state *st, bool ready, ext_stream *out, bool *busy)
{
    *busy = false;
    if (atomic_fetch_add(&m->metrics_streams, 1) >= EXT_METRICS_STREAMS) {
        atomic_fetch_sub(&m->metrics_streams, 1);
        *busy = true;
        return false;
    }
    metrics_stream *ms = calloc(1, sizeof(*ms));
    if (ms == NULL || !buf_init(&ms->text)) {
        free(ms);
        atomic_fetch_sub(&m->metrics_streams, 1);
        return false;
    }
    ms->m = m;
    ms->row = -1;
    if (!render_into(m, st, ready, &ms->text, &ms->snap)) {
        metrics_free(ms);
        return false;
    }
    *out = (ext_stream){metrics_read, metrics_free, ms};
    return true;
}
