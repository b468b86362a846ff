/*
 * prioritize-gpuless without the state lock. kube-scheduler sends every
 * pod to that verb inside its one-pod-at-a-time cycle, so a pod without a
 * GPU must not wait for whoever holds st->mu (a sweep slice, a relist, a
 * bind). Whoever holds the lock publishes an immutable per-node summary
 * (ext_gpuless_publish, when the cluster changed since the last one); the
 * verb, when the lock is busy, scores from the summary without it.
 *
 * Who owns what: a snapshot is built and published (st->gpuless.cur,
 * atomic exchange) only by a thread holding st->mu; the snapshot it
 * replaces is kept in st->gpuless.retired (touched under st->mu only) and
 * freed by a later publisher that finds st->gpuless.readers at 0 after its
 * exchange. A reader counts itself in readers before it loads cur and out
 * after its last use: with sequentially consistent atomics, a reader that
 * entered after the exchange loads the new snapshot, and one that entered
 * before it is counted, so a snapshot freed has no reader. Past
 * EXT_GPULESS_RETIRED_MAX retired snapshots (readers never at 0), no new
 * one is published until they are freed: memory stays bounded, the
 * summary a little older.
 */
#include <stdlib.h>
#include <string.h>

#include "state_impl.h"

static void snap_free(ext_gpuless_snap *s)
{
    if (s == NULL)
        return;
    free(s->node);
    free(s->version);
    free(s->names);
    free(s);
}

static int cmp_node(const void *a, const void *b)
{
    return strcmp(((const ext_gpuless_node *)a)->name, ((const ext_gpuless_node *)b)->name);
}

/* Whether s still shows the cluster as it is. */
static bool fresh(const ext_gpuless_snap *s, const kgpu_cluster *c)
{
    int n = kgpu_cluster_node_count(c);
    if (s == NULL || s->cluster != (const void *)c || s->n != n)
        return false;
    for (int i = 0; i < n; i++)
        if (kgpu_cluster_node(c, i)->version != s->version[i])
            return false;
    return true;
}

static ext_gpuless_snap *snap_build(const kgpu_cluster *c)
{
    int n = kgpu_cluster_node_count(c);
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += strlen(kgpu_cluster_node(c, i)->name) + 1;
    ext_gpuless_snap *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->node = calloc((size_t)n + 1, sizeof(*s->node));
    s->version = calloc((size_t)n + 1, sizeof(*s->version));
    s->names = malloc(bytes + 1);
    if (s->node == NULL || s->version == NULL || s->names == NULL) {
        snap_free(s);
        return NULL;
    }
    s->cluster = c;
    s->n = n;
    char *at = s->names;
    for (int i = 0; i < n; i++) {
        const kgpu_node *k = kgpu_cluster_node(c, i);
        ext_gpuless_node *x = &s->node[i];
        size_t len = strlen(k->name) + 1;
        memcpy(at, k->name, len);
        x->name = at;
        at += len;
        x->cpu_milli = k->cpu_milli;
        x->cpu_free = k->cpu_free;
        x->memory_free = k->memory_free;
        for (int g = 0; g < k->ngpus; g++) {
            if (!k->gpus[g].healthy)
                continue;
            x->ngpus++;
            x->free_milli += k->gpus[g].free_milli;
        }
        s->version[i] = k->version;
    }
    qsort(s->node, (size_t)n, sizeof(*s->node), cmp_node);
    return s;
}

void ext_gpuless_publish(ext_state *st)
{
    ext_gpuless_snaps *g = &st->gpuless;
    if (st->cluster == NULL || fresh(atomic_load(&g->cur), st->cluster))
        return;
    if (g->nretired > 0 && atomic_load(&g->readers) == 0) {
        for (int i = 0; i < g->nretired; i++)
            snap_free(g->retired[i]);
        g->nretired = 0;
    }
    if (g->nretired == EXT_GPULESS_RETIRED_MAX)
        return; /* readers never left: the old summary serves a while longer */
    ext_gpuless_snap *s = snap_build(st->cluster);
    if (s == NULL)
        return;
    ext_gpuless_snap *old = atomic_exchange(&g->cur, s);
    atomic_fetch_add(&g->published, 1);
    if (old == NULL)
        return;
    if (atomic_load(&g->readers) == 0)
        snap_free(old); /* a reader entering from now on loads s */
    else
        g->retired[g->nretired++] = old;
}

void ext_gpuless_free_all(ext_state *st)
{
    ext_gpuless_snaps *g = &st->gpuless;
    snap_free(atomic_exchange(&g->cur, NULL));
    for (int i = 0; i < g->nretired; i++)
        snap_free(g->retired[i]);
    g->nretired = 0;
}

/* GPU compute (milli) on the node that `cpu_free` CPU leaves without its share of the node's CPU. */
static int64_t stranded(const ext_gpuless_node *x, int64_t cpu_free)
{
    if (x->ngpus == 0 || x->cpu_milli <= 0)
        return 0;
    int64_t per_gpu = x->cpu_milli / x->ngpus; /* the CPU a GPU comes with */
    if (per_gpu <= 0)
        return 0;
    int64_t fed = (cpu_free > 0 ? cpu_free : 0) / per_gpu * KGPU_MILLI;
    return x->free_milli > fed ? x->free_milli - fed : 0;
}

bool ext_gpuless_scores(ext_state *st, int64_t cpu_milli, int64_t memory_mib,
                        const char *const *names, int n, int *scores)
{
    ext_gpuless_snaps *g = &st->gpuless;
    atomic_fetch_add(&g->readers, 1);
    const ext_gpuless_snap *s = atomic_load(&g->cur);
    if (s == NULL) {
        atomic_fetch_sub(&g->readers, 1);
        return false;
    }
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    int64_t *raw = malloc((size_t)(n > 0 ? n : 1) * sizeof(*raw));
    for (int i = 0; i < n && raw != NULL; i++) {
        ext_gpuless_node key = {.name = names[i]};
        const ext_gpuless_node *x = bsearch(&key, s->node, (size_t)s->n, sizeof(*s->node),
                                            cmp_node);
        raw[i] = INT64_MIN;
        if (x == NULL || x->cpu_free < cpu_milli || x->memory_free < memory_mib)
            continue;
        /* Less GPU compute newly short of CPU is better. */
        raw[i] = -(stranded(x, x->cpu_free - cpu_milli) - stranded(x, x->cpu_free));
        lo = raw[i] < lo ? raw[i] : lo;
        hi = raw[i] > hi ? raw[i] : hi;
    }
    atomic_fetch_sub(&g->readers, 1); /* s is not used past here */
    for (int i = 0; i < n; i++) {
        if (raw == NULL || raw[i] == INT64_MIN)
            scores[i] = 0;
        else if (hi == lo)
            scores[i] = 10;
        else
            scores[i] = (int)(((double)(raw[i] - lo) * 10.0) / (double)(hi - lo) + 0.5);
    }
    free(raw);
    atomic_fetch_add(&g->stale_answers, 1);
    return true;
}
