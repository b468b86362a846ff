/*
 * One node and one request: whether the request fits the node's free CPU,
 * memory and GPUs, and taking it from them or giving it back. The cluster
 * (model.c), the GPU choice (pick.c) and the placement search (place.c) all
 * rest on these; nothing here knows of a cluster.
 */
#include <string.h>

#include "core.h"

int kgpu_request_class(const kgpu_request *req)
{
    if (req->gpu_count <= 0)
        return KGPU_CLASS_CPU;
    if (!req->exclusive)
        return KGPU_CLASS_SHARE;
    return 1 + req->gpu_count;
}

bool kgpu_gpu_usable(const kgpu_node *n, const kgpu_gpu *g, const kgpu_request *req)
{
    (void)n;
    if (!g->healthy || !((req->models >> g->model) & 1))
        return false;
    if (req->exclusive)
        return g->placements == 0 && g->free_milli == KGPU_MILLI &&
               g->free_memory_mib == g->memory_mib;
    return g->free_milli >= req->gpu_milli && g->free_memory_mib >= req->gpu_memory_mib;
}

int kgpu__usable_gpus(const kgpu_node *n, const kgpu_request *req)
{
    int k = 0;
    for (int i = 0; i < n->ngpus; i++)
        k += kgpu_gpu_usable(n, &n->gpus[i], req);
    return k;
}

int kgpu__node_free_milli(const kgpu_node *n)
{
    int s = 0;
    for (int i = 0; i < n->ngpus; i++)
        if (n->gpus[i].healthy)
            s += n->gpus[i].free_milli;
    return s;
}

bool kgpu__fit(const kgpu_node *n, const kgpu_request *req)
{
    if (n->cpu_free < req->cpu_milli || n->memory_free < req->memory_mib)
        return false;
    if (req->gpu_count <= 0)
        return true;
    if (req->gpu_count > n->ngpus || !(n->model_mask & req->models))
        return false;
    int k = 0;
    for (int i = 0; i < n->ngpus; i++) {
        if (kgpu_gpu_usable(n, &n->gpus[i], req) && ++k >= req->gpu_count)
            return true;
    }
    return false;
}

/* Checks that `gpus` names req->gpu_count distinct GPUs of n that can each hold req. */
int kgpu__node_check_gpus(const kgpu_node *n, const kgpu_request *req, const int *gpus,
                          kgpu_error *err)
{
    int k = req->gpu_count > 0 ? req->gpu_count : 0;
    if (k > 0 && gpus == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "node %s: no GPUs chosen", n->name);
    for (int i = 0; i < k; i++) {
        if (gpus[i] < 0 || gpus[i] >= n->ngpus)
            return kgpu_error_set(err, KGPU_EINVAL, "node %s has no GPU at position %d", n->name,
                                  gpus[i]);
        for (int j = 0; j < i; j++)
            if (gpus[j] == gpus[i])
                return kgpu_error_set(err, KGPU_EINVAL, "node %s: GPU %d chosen twice", n->name,
                                      n->gpus[gpus[i]].index);
        if (!kgpu_gpu_usable(n, &n->gpus[gpus[i]], req))
            return kgpu_error_set(err, KGPU_ENOFIT, "node %s: GPU %d cannot hold this request",
                                  n->name, n->gpus[gpus[i]].index);
    }
    return 0;
}

/* Takes req from n on `gpus` (already checked) and describes it in *a. */
void kgpu__node_take(kgpu_node *n, int node, const kgpu_request *req, const int *gpus,
                     kgpu_assignment *a)
{
    int k = req->gpu_count > 0 ? req->gpu_count : 0;
    memset(a, 0, sizeof(*a));
    a->node = node;
    a->ngpus = k;
    a->gpu_milli = req->exclusive ? KGPU_MILLI : req->gpu_milli;
    a->gpu_memory_mib = req->gpu_memory_mib;
    a->exclusive = req->exclusive;
    a->cpu_milli = req->cpu_milli;
    a->memory_mib = req->memory_mib;
    a->klass = kgpu_request_class(req);
    n->cpu_free -= req->cpu_milli;
    n->memory_free -= req->memory_mib;
    for (int i = 0; i < k; i++) {
        kgpu_gpu *g = &n->gpus[gpus[i]];
        a->gpus[i] = gpus[i];
        g->free_milli -= a->gpu_milli;
        g->free_memory_mib -= a->exclusive ? g->memory_mib : a->gpu_memory_mib;
        g->placements++;
    }
    n->placements++;
    n->class_count[a->klass]++;
    n->version++;
}

/* Checks that giving a back to n stays within capacity. */
int kgpu__node_check_release(const kgpu_node *n, const kgpu_assignment *a, kgpu_error *err)
{
    if (a->klass < 0 || a->klass >= KGPU_CLASS_MAX || n->class_count[a->klass] <= 0 ||
        n->placements <= 0 || a->ngpus < 0 || a->ngpus > n->ngpus ||
        n->cpu_free + a->cpu_milli > n->cpu_milli || n->memory_free + a->memory_mib > n->memory_mib)
        return kgpu_error_set(err, KGPU_ESTATE, "node %s: release of a placement not held here",
                              n->name);
    for (int i = 0; i < a->ngpus; i++) {
        if (a->gpus[i] < 0 || a->gpus[i] >= n->ngpus)
            return kgpu_error_set(err, KGPU_ESTATE, "node %s: no GPU at position %d", n->name,
                                  a->gpus[i]);
        for (int j = 0; j < i; j++)
            if (a->gpus[j] == a->gpus[i]) /* checked one by one, a repeat would escape the bound */
                return kgpu_error_set(err, KGPU_ESTATE, "node %s: GPU %d listed twice in a release",
                                      n->name, n->gpus[a->gpus[i]].index);
        const kgpu_gpu *g = &n->gpus[a->gpus[i]];
        int64_t mem = a->exclusive ? g->memory_mib : a->gpu_memory_mib;
        if (g->placements <= 0 || g->free_milli + a->gpu_milli > KGPU_MILLI ||
            g->free_memory_mib + mem > g->memory_mib)
            return kgpu_error_set(err, KGPU_ESTATE,
                                  "node %s: GPU %d would exceed its capacity on release", n->name,
                                  g->index);
    }
    return 0;
}

void kgpu__node_give(kgpu_node *n, const kgpu_assignment *a)
{
    n->cpu_free += a->cpu_milli;
    n->memory_free += a->memory_mib;
    for (int i = 0; i < a->ngpus; i++) {
        kgpu_gpu *g = &n->gpus[a->gpus[i]];
        g->free_milli += a->gpu_milli;
        g->free_memory_mib += a->exclusive ? g->memory_mib : a->gpu_memory_mib;
        g->placements--;
    }
    n->placements--;
    n->class_count[a->klass]--;
    n->version++;
}
