/*
 * GPU-seconds per namespace, queue, GPU model and capacity type: the
 * counters behind kgpu_namespace_gpu_seconds_total and the cost of a team's
 * GPUs (docs/autoscaling.md "Cost per team"). Caller holds st->mu.
 *
 * Each held pod adds its GPU fraction to the entries of its key when it
 * starts holding and takes it off when it stops; integration multiplies
 * what each entry holds by the time since the last one. A pod remembers the
 * entries it added to (entries live until the state is destroyed), so what
 * it takes off is exactly what it put on, whatever changed meanwhile.
 *
 * Every part of the key comes from what kgpu or the operator decided: the
 * pod's namespace, its resolved queue (never the raw label: "" while queues
 * are off, when nothing resolves it), the model of
 * the GPUs kgpu gave it, its node's capacity-type labels. The table is
 * bounded all the same (EXT_USAGE_MAX): past it, new keys fold into
 * namespace EXT_USAGE_OVERFLOW_NS, one entry per model and capacity type.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capacity.h"
#include "state_impl.h"

void ext_state_integrate_usage(ext_state *st)
{
    double now = ext_now(), dt = now - st->usage_at;
    st->usage_at = now;
    if (dt <= 0)
        return;
    const char *k;
    void *v;
    size_t i = 0;
    while (kgpu_strmap_next(&st->usage, &i, &k, &v)) {
        ext_usage *u = v;
        u->gpu_seconds += u->gpus * dt;
    }
}

/* The entry of the key, created when new (folded into the overflow past the bound); NULL: no memory. */
static ext_usage *entry(ext_state *st, const char *ns, const char *queue, const char *model,
                        bool spot)
{
    char key[sizeof(((ext_usage *)0)->ns) + sizeof(((ext_usage *)0)->queue) + KGPU_MODEL_NAME_MAX +
             8];
    /* \x1f cannot be in a namespace or a queue name (DNS labels), so keys never collide. */
    snprintf(key, sizeof(key), "%s\x1f%s\x1f%s\x1f%d", ns, queue, model, spot);
    ext_usage *u = kgpu_strmap_get(&st->usage, key);
    if (u != NULL)
        return u;
    if (st->usage.len >= EXT_USAGE_MAX && strcmp(ns, EXT_USAGE_OVERFLOW_NS) != 0) {
        if (!st->usage_full)
            ext_log(EXT_WARN,
                    "GPU usage: %d series of namespace, queue, model and capacity type; "
                    "namespace %s and any new one counted as namespace %s from now on",
                    EXT_USAGE_MAX, ns, EXT_USAGE_OVERFLOW_NS);
        st->usage_full = true;
        return entry(st, EXT_USAGE_OVERFLOW_NS, "", model, spot);
    }
    u = calloc(1, sizeof(*u));
    if (u == NULL || !kgpu_strmap_put(&st->usage, key, u, NULL)) {
        free(u);
        return NULL;
    }
    snprintf(u->ns, sizeof(u->ns), "%s", ns);
    snprintf(u->queue, sizeof(u->queue), "%s", queue);
    snprintf(u->model, sizeof(u->model), "%s", model);
    u->spot = spot;
    return u;
}

/* The fraction of GPU g that assignment a holds: compute or memory, whichever is larger. */
static double gpu_share(const kgpu_gpu *g, const kgpu_assignment *a)
{
    double f = a->exclusive ? 1.0 : a->gpu_milli / 1000.0;
    if (!a->exclusive && g->memory_mib > 0) {
        double m = (double)a->gpu_memory_mib / (double)g->memory_mib;
        if (m > f)
            f = m;
    }
    return f;
}

/*
 * The queue p's GPU time counts in: its resolved queue while queues are on.
 * With queues off p->queue is its label as written (nothing checks it
 * against a tree), so a tenant could mint series with it: "" then.
 */
static const char *usage_queue(const ext_state *st, const ext_pod *p)
{
    return st->queues != NULL ? p->queue : "";
}

/* Adds `gpus` to p's contribution to entry u (a new slot when u is not among them yet). */
static void contribute(ext_pod *p, ext_usage *u, double gpus)
{
    for (int i = 0; i < p->nusage; i++)
        if (p->usage[i] == u) {
            p->usage_gpus[i] += gpus;
            u->gpus += gpus;
            return;
        }
    /* More models on one node than slots: the rest goes to the last slot's model. */
    if (p->nusage == EXT_POD_USAGE_MAX) {
        p->usage_gpus[p->nusage - 1] += gpus;
        p->usage[p->nusage - 1]->gpus += gpus;
        return;
    }
    p->usage[p->nusage] = u;
    p->usage_gpus[p->nusage++] = gpus;
    u->gpus += gpus;
}

void ext__usage_hold(ext_state *st, ext_pod *p)
{
    ext_state_integrate_usage(st);
    const kgpu_node *n =
        kgpu_cluster_node(st->cluster, kgpu_cluster_find_node(st->cluster, p->node));
    bool spot = kgpu_strmap_get(&st->spot_nodes, p->node) != NULL;
    p->gpus = 0;
    p->nusage = 0;
    for (int i = 0; i < p->nparts && n != NULL; i++) {
        const kgpu_assignment *a = &p->part[i].a;
        for (int g = 0; g < a->ngpus; g++) {
            const kgpu_gpu *gpu = &n->gpus[a->gpus[g]];
            double f = gpu_share(gpu, a);
            p->gpus += f;
            ext_usage *u = entry(st, p->ns, usage_queue(st, p),
                                 kgpu_cluster_model_name(st->cluster, gpu->model), spot);
            if (u != NULL)
                contribute(p, u, f);
        }
    }
}

void ext__usage_unhold(ext_state *st, ext_pod *p)
{
    ext_state_integrate_usage(st);
    for (int i = 0; i < p->nusage; i++) {
        ext_usage *u = p->usage[i];
        u->gpus -= p->usage_gpus[i];
        if (u->gpus < 1e-9)
            u->gpus = 0;
    }
    p->nusage = 0;
}

void ext__usage_requeue(ext_state *st, ext_pod *p)
{
    bool moved = false;
    for (int i = 0; i < p->nusage && !moved; i++)
        moved = strcmp(p->usage[i]->queue, usage_queue(st, p)) != 0 &&
                strcmp(p->usage[i]->ns, EXT_USAGE_OVERFLOW_NS) != 0;
    if (!moved)
        return;
    ext_state_integrate_usage(st); /* the seconds so far stay with the queue they were in */
    ext_usage *was[EXT_POD_USAGE_MAX];
    double gpus[EXT_POD_USAGE_MAX];
    int n = p->nusage;
    memcpy(was, p->usage, sizeof(was[0]) * (size_t)n);
    memcpy(gpus, p->usage_gpus, sizeof(gpus[0]) * (size_t)n);
    ext__usage_unhold(st, p);
    for (int i = 0; i < n; i++) {
        ext_usage *u = entry(st, p->ns, usage_queue(st, p), was[i]->model, was[i]->spot);
        if (u != NULL)
            contribute(p, u, gpus[i]);
    }
}

void ext_state_node_spot(ext_state *st, const char *node, bool spot)
{
    if (!spot) {
        kgpu_strmap_del(&st->spot_nodes, node);
        return;
    }
    /* The value is a marker, not owned: out of memory, the node counts as on-demand. */
    kgpu_strmap_put(&st->spot_nodes, node, (void *)KGPU_CAPACITY_SPOT, NULL);
}

bool ext_usage_rows(ext_state *st, ext_usage **rows, size_t *n)
{
    ext_state_integrate_usage(st);
    *n = 0;
    *rows = malloc((st->usage.len + 1) * sizeof(**rows));
    if (*rows == NULL)
        return false;
    const char *k;
    void *v;
    size_t it = 0;
    while (kgpu_strmap_next(&st->usage, &it, &k, &v) && *n < st->usage.len)
        (*rows)[(*n)++] = *(const ext_usage *)v;
    return true;
}
