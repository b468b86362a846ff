/*
 * The fragmentation measure of the FGD study (ATC '23): how much of a node's
 * free GPU compute the expected workload could not use. It is the yardstick
 * of placement quality and the objective of the fgd policy.
 */
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
