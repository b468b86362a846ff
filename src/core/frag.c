/*
 * The fragmentation measure of the FGD study (ATC '23): how much of a node's
 * free GPU compute the expected workload could not use. It is the yardstick
 * of placement quality and the objective of the fgd policy. The policies
 * that try placements node by node take it by parts (kgpu__frag_node_of,
 * see core.h): the cold path of a decision over every node.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static int shape_key_cmp(const kgpu_shape *a, const kgpu_shape *b)
{
    if (a->cpu_milli != b->cpu_milli)
        return a->cpu_milli < b->cpu_milli ? -1 : 1;
    if (a->gpu_milli != b->gpu_milli)
        return a->gpu_milli < b->gpu_milli ? -1 : 1;
    if (a->gpu_count != b->gpu_count)
        return a->gpu_count < b->gpu_count ? -1 : 1;
    if (a->models != b->models)
        return a->models < b->models ? -1 : 1;
    return 0;
}

static int cmp_key(const void *x, const void *y)
{
    return shape_key_cmp(x, y);
}

/* Heaviest first; equal weights in decreasing key order (as the study's reverse sort). */
static int cmp_weight_desc(const void *x, const void *y)
{
    const kgpu_shape *a = x, *b = y;
    if (a->p != b->p)
        return a->p > b->p ? -1 : 1;
    return -shape_key_cmp(a, b);
}

kgpu_shape kgpu__shape_of(const kgpu_request *r)
{
    bool gpu = r->gpu_count > 0;
    return (kgpu_shape){
        .cpu_milli = r->cpu_milli,
        .gpu_milli = gpu ? (r->exclusive ? KGPU_MILLI : r->gpu_milli) : 0,
        .gpu_count = gpu ? r->gpu_count : 0,
        .models = gpu ? r->models : ~0ULL,
    };
}

int kgpu__workload_from_weights(kgpu_shape *groups, size_t ng, double coverage, kgpu_workload *out)
{
    memset(out, 0, sizeof(*out));
    qsort(groups, ng, sizeof(*groups), cmp_weight_desc);
    double total = 0;
    for (size_t i = 0; i < ng; i++)
        total += groups[i].p;
    double want = coverage * total, cum = 0;
    size_t take = 0;
    while (take < ng && groups[take].p > 0 && cum < want)
        cum += groups[take++].p;
    if (take == 0)
        return 0;
    out->shapes = malloc(take * sizeof(*out->shapes));
    if (out->shapes == NULL)
        return KGPU_ENOMEM;
    for (size_t i = 0; i < take; i++) {
        out->shapes[i] = groups[i];
        out->shapes[i].p = groups[i].p / cum;
    }
    out->n = (int)take;
    return 0;
}

int kgpu_workload_build(const kgpu_request *reqs, size_t n, double coverage, kgpu_workload *out,
                        kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "empty workload");
    if (!(coverage > 0 && coverage <= 1))
        return kgpu_error_set(err, KGPU_EINVAL, "coverage %.3f outside (0, 1]", coverage);
    kgpu_shape *keys = malloc(n * sizeof(*keys));
    if (keys == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory building the target workload");
    for (size_t i = 0; i < n; i++)
        keys[i] = kgpu__shape_of(&reqs[i]);
    qsort(keys, n, sizeof(*keys), cmp_key);
    /* Group equal keys in place; a group's weight (in p) is its count, exact in a double. */
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        if (ng > 0 && shape_key_cmp(&keys[ng - 1], &keys[i]) == 0) {
            keys[ng - 1].p += 1;
        } else {
            keys[ng] = keys[i];
            keys[ng].p = 1;
            ng++;
        }
    }
    int rc = kgpu__workload_from_weights(keys, ng, coverage, out);
    free(keys);
    if (rc != 0)
        return kgpu_error_set(err, rc, "out of memory building the target workload");
    return 0;
}

void kgpu_workload_free(kgpu_workload *w)
{
    if (w == NULL)
        return;
    free(w->shapes);
    w->shapes = NULL;
    w->n = 0;
}

double kgpu_node_frag(const kgpu_node *n, const kgpu_workload *w, const int *free_milli,
                      int64_t cpu_free)
{
    int fm[KGPU_MAX_GPUS_PER_NODE];
    int total = 0;
    /* Unhealthy GPUs are neither idle capacity nor fragments: nothing can use them. */
    for (int i = 0; i < n->ngpus; i++) {
        fm[i] = n->gpus[i].healthy ? (free_milli ? free_milli[i] : n->gpus[i].free_milli) : 0;
        total += fm[i];
    }
    if (total == 0)
        return 0;
    if (cpu_free < 0)
        cpu_free = n->cpu_free;
    double frag = 0;
    for (int s = 0; s < w->n; s++) {
        const kgpu_shape *sh = &w->shapes[s];
        if (sh->gpu_milli == 0 || cpu_free < sh->cpu_milli) {
            frag += sh->p * total; /* CPU-only shape, or the shape cannot run here at all */
            continue;
        }
        int usable = 0, lost = 0;
        for (int i = 0; i < n->ngpus; i++) {
            if (fm[i] >= sh->gpu_milli && ((sh->models >> n->gpus[i].model) & 1))
                usable++;
            else
                lost += fm[i];
        }
        frag += sh->p * (usable < sh->gpu_count ? total : lost);
    }
    return frag;
}

void kgpu__frag_table_load(kgpu__frag_table *t, const kgpu_workload *w, int n, int *ints)
{
    size_t len = (size_t)n;
    t->w = w;
    t->shapes = w->shapes;
    t->n = n;
    t->gm = ints;
    t->count = ints + len;
    t->cpu = ints + 2 * len;
    t->ok = ints + 3 * len;
    t->lost = ints + 4 * len;
    t->usable = ints + 5 * len;
    t->counted = ints + 6 * len;
    t->cpu_int = true;
    t->ok_model = -1;
    for (int s = 0; s < n; s++) {
        const kgpu_shape *sh = &w->shapes[s];
        t->gm[s] = sh->gpu_milli;
        t->count[s] = sh->gpu_count;
        t->cpu_int &= sh->cpu_milli >= INT_MIN && sh->cpu_milli <= INT_MAX;
        t->cpu[s] = t->cpu_int ? (int)sh->cpu_milli : 0;
    }
}

/* t->ok for a node of the one model m0 (as it is when the last such node was of m0). */
static void frag_ok(kgpu__frag_table *t, int m0)
{
    if (t->ok_model == m0)
        return;
    for (int s = 0; s < t->n; s++)
        t->ok[s] = -(int)((t->shapes[s].models >> m0) & 1);
    t->ok_model = m0;
}

/* The node's GPUs into b: what kgpu__frag_node_of and kgpu__frag_node_restore share. */
static void frag_node_gpus(const kgpu_node *n, kgpu__frag_table *t, kgpu__frag_node *b)
{
    int ng = n->ngpus, total = 0;
    for (int i = 0; i < ng; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        b->fm[i] = g->healthy ? g->free_milli : 0;
        b->model[i] = g->model;
        total += b->fm[i];
    }
    b->t = t;
    b->total = total;
    b->ngpus = ng;
    b->one_model = (n->model_mask & (n->model_mask - 1)) == 0;
}

void kgpu__frag_node_of(const kgpu_node *n, kgpu__frag_table *t, kgpu__frag_node *b)
{
    frag_node_gpus(n, t, b);
    int ng = b->ngpus, total = b->total;
    if (total == 0)
        return; /* kgpu__frag_after returns 0 before it reads a shape */
    /*
     * The cold path of the fragmentation policies: every node, every shape.
     * Without branches (which GPUs a shape can use follows no pattern a
     * predictor learns), over the table's columns: vector code.
     */
    if (b->one_model)
        frag_ok(t, b->model[0]); /* before the restrict pointers below: it writes ok */
    int ns = t->n;
    const kgpu_shape *shapes = t->shapes;
    const int *restrict gm = t->gm;
    int *restrict ok = t->ok, *restrict lost = t->lost, *restrict usable = t->usable;
    for (int s = 0; s < ns; s++) {
        lost[s] = 0;
        usable[s] = 0;
    }
    if (b->one_model) { /* most nodes: the model test once per shape */
        for (int i = 0; i < ng; i++) {
            int fm = b->fm[i];
            for (int s = 0; s < ns; s++) {
                int fits = -(fm >= gm[s]); /* all ones or zero */
                usable[s] -= fits;
                lost[s] += fm & ~fits;
            }
        }
        /* A shape that cannot use the model loses all. */
        for (int s = 0; s < ns; s++) {
            lost[s] = (lost[s] & ok[s]) | (total & ~ok[s]);
            usable[s] &= ok[s];
        }
        return;
    }
    for (int i = 0; i < ng; i++) {
        int fm = b->fm[i], model = b->model[i];
        for (int s = 0; s < ns; s++) {
            int fits = -((fm >= gm[s]) & (int)((shapes[s].models >> model) & 1));
            usable[s] -= fits;
            lost[s] += fm & ~fits;
        }
    }
}

bool kgpu__frag_node_save(const kgpu__frag_node *b, int16_t *saved)
{
    const kgpu__frag_table *t = b->t;
    int ns = t->n;
    if (b->total > INT16_MAX) /* a lost figure is at most total, usable at most the GPUs */
        return false;
    if (b->total == 0)
        return true;
    for (int s = 0; s < ns; s++) {
        saved[s] = (int16_t)t->lost[s];
        saved[ns + s] = (int16_t)t->usable[s];
    }
    return true;
}

void kgpu__frag_node_restore(const kgpu_node *n, kgpu__frag_table *t, kgpu__frag_node *b,
                             const int16_t *saved)
{
    frag_node_gpus(n, t, b);
    if (b->total == 0)
        return;
    if (b->one_model) /* ok[] as kgpu__frag_node_of leaves it, for frag_counts */
        frag_ok(t, b->model[0]);
    int ns = t->n;
    int *restrict lost = t->lost, *restrict usable = t->usable;
    for (int s = 0; s < ns; s++) {
        lost[s] = saved[s];
        usable[s] = saved[ns + s];
    }
}

/*
 * The milli each shape counts as lost after taking `take` from GPU gpu
 * (-1: nothing) with cpu CPU left, into counted[]: the integer half of
 * kgpu__frag_after, for a node of one model and a table of int CPU figures,
 * over all shapes at a time in vector code. A CPU figure outside the ints
 * compares with every shape's as its nearest int does.
 */
static void frag_counts(const kgpu__frag_node *b, int gpu, int take, int64_t cpu_after, int total,
                        int *restrict counted)
{
    const kgpu__frag_table *t = b->t;
    int was = gpu >= 0 ? b->fm[gpu] : 0, now = gpu >= 0 ? was - take : 0; /* 0 to 0: no change */
    int cpu = cpu_after < INT_MIN ? INT_MIN : cpu_after > INT_MAX ? INT_MAX : (int)cpu_after;
    const int *restrict gm = t->gm, *restrict count = t->count, *restrict cpus = t->cpu;
    const int *restrict ok = t->ok, *restrict lost = t->lost, *restrict usable = t->usable;
    for (int s = 0; s < t->n; s++) {
        int was_ok = ok[s] & -(was >= gm[s]), now_ok = ok[s] & -(now >= gm[s]);
        int u = usable[s] + was_ok - now_ok;
        int l = lost[s] + (now & ~now_ok) - (was & ~was_ok);
        /* CPU-only shape, or the shape cannot run here at all: all of it is lost. */
        int none = -((gm[s] == 0) | (cpu < cpus[s]) | (u < count[s]));
        counted[s] = (total & none) | (l & ~none);
    }
}

/* Whether frag_counts serves b. */
static bool frag_vector(const kgpu__frag_node *b)
{
    return b->one_model && b->t->cpu_int;
}

double kgpu__frag_after(const kgpu__frag_node *b, const int *gpus, const int *take, int nchg,
                        int64_t cpu_after, int *total_after)
{
    int total = b->total;
    for (int k = 0; k < nchg; k++)
        total -= take[k];
    if (total_after != NULL)
        *total_after = total;
    if (total == 0)
        return 0;
    const kgpu__frag_table *t = b->t;
    int ns = t->n;
    const kgpu_shape *shapes = t->shapes;
    double frag = 0;
    /*
     * p times the count chosen is the product kgpu_node_frag takes in
     * whichever of its branches applies, and the sum runs in the same order:
     * the same figure to the last bit.
     */
    if (nchg <= 1 && frag_vector(b)) {
        frag_counts(b, nchg ? gpus[0] : -1, nchg ? take[0] : 0, cpu_after, total, t->counted);
        for (int s = 0; s < ns; s++)
            frag += shapes[s].p * t->counted[s];
        return frag;
    }
    /* Several GPUs, several models or CPU beyond an int: shape by shape, still without branches. */
    for (int s = 0; s < ns; s++) {
        const kgpu_shape *sh = &shapes[s];
        int gm = sh->gpu_milli, lost = t->lost[s], usable = t->usable[s];
        for (int k = 0; k < nchg; k++) {
            int g = gpus[k], was = b->fm[g], now = was - take[k];
            int model = (int)((sh->models >> b->model[g]) & 1);
            int was_ok = -(model & (was >= gm)), now_ok = -(model & (now >= gm));
            usable += was_ok - now_ok;
            lost += (now & ~now_ok) - (was & ~was_ok);
        }
        int none = -((gm == 0) | (cpu_after < sh->cpu_milli) | (usable < sh->gpu_count));
        frag += sh->p * ((total & none) | (lost & ~none));
    }
    return frag;
}

double kgpu_cluster_frag(const kgpu_cluster *c, const kgpu_workload *w, double *idle_milli)
{
    double frag = 0, idle = 0;
    for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        frag += kgpu_node_frag(n, w, NULL, -1);
        idle += kgpu__node_free_milli(n);
    }
    if (idle_milli != NULL)
        *idle_milli = idle;
    return frag;
}
