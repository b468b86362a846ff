/*
 * DRA nodes' inventory: a node labelled kgpu.io/gpu-allocator=dra takes its
 * GPUs from kgpu-dra-plugin's pool for it, so a slice that comes, changes
 * or goes rebuilds that node (or, on a relist, every DRA node) in the
 * inventory. A pool may span slices (counter sets must be in slices of
 * their own, and a slice holds at most 64 devices that consume counters):
 * the slices are kept by name (st->dra_parts), and each node's pool
 * (st->dra_slices) is made again from those of the newest generation
 * whenever one of them changes. Above inventory.c, which it calls;
 * dra_claims.c holds the nodes' and claims' records. Caller holds st->mu.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state_impl.h"

/* A DRA node's inventory after its slice changed (one node: an upsert). */
static void refresh_node(ext_state *st, const char *node)
{
    const ext_dra_node *n = kgpu_strmap_get(&st->dra_nodes, node);
    if (n == NULL)
        return; /* not labelled (yet): the slice waits for the node */
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    kgpu_node_spec spec = {.name = node, .cpu_milli = n->cpu_milli, .memory_mib = n->memory_mib};
    ext_dra_gpus_from_slice(st, &spec, gpus);
    kgpu_error err;
    kgpu_error_clear(&err);
    if (ext_state_upsert_node(st, &spec, &err) != 0)
        ext_log(EXT_ERROR, "DRA node %s not updated: %s", node, err.msg);
}

/* Every DRA node's inventory again, in one rebuild (a slice relist). */
static void rebuild_all(ext_state *st)
{
    int n = kgpu_cluster_node_count(st->cluster), m = 0;
    size_t total = (size_t)n + st->dra_nodes.len + 1;
    kgpu_node_spec *specs = calloc(total, sizeof(*specs));
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc(total, sizeof(*gpus));
    if (specs == NULL || gpus == NULL) {
        ext_log(EXT_ERROR, "DRA nodes not updated: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const kgpu_node *node = kgpu_cluster_node(st->cluster, i);
        if (!ext_dra_is_node(st, node->name)) {
            ext_state_node_spec(st, i, &specs[m], gpus[m]);
            m++;
        }
    }
    size_t it = 0;
    const char *name;
    void *v;
    while (kgpu_strmap_next(&st->dra_nodes, &it, &name, &v)) {
        const ext_dra_node *dn = v;
        specs[m] = (kgpu_node_spec){
            .name = name, .cpu_milli = dn->cpu_milli, .memory_mib = dn->memory_mib};
        ext_dra_gpus_from_slice(st, &specs[m], gpus[m]);
        m += specs[m].ngpus > 0;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    if (ext_state_set_nodes(st, specs, m, &err) != 0)
        ext_log(EXT_ERROR, "DRA nodes not updated: %s", err.msg);
out:
    free(specs);
    free(gpus);
}

/* Says which devices of a pool kgpu does not read (a newer driver's MIG profiles, ...). */
static void said_skipped(const ext_dra_slice *s)
{
    if (s->skipped > 0)
        ext_log(EXT_WARN, "DRA pool %s: %d devices not read (the first: %s)", s->node,
                s->skipped, s->skip_why);
}

/* A copy of s of the bytes it uses (ext_dra_slice_size); NULL when out of memory. */
static ext_dra_slice *dup_slice(const ext_dra_slice *s)
{
    size_t n = ext_dra_slice_size(s);
    ext_dra_slice *c = malloc(n);
    if (c != NULL)
        memcpy(c, s, n);
    return c;
}

static int by_node_name(const void *a, const void *b)
{
    const ext_dra_slice *x = *(const ext_dra_slice *const *)a;
    const ext_dra_slice *y = *(const ext_dra_slice *const *)b;
    int c = strcmp(x->node, y->node);
    return c != 0 ? c : strcmp(x->name, y->name);
}

/*
 * The pool of one node from its slices parts[0..n) (sorted by name): those
 * of the newest generation, in name order. A copy (dup_slice), or NULL.
 */
static ext_dra_slice *make_pool(ext_dra_slice *const *parts, int n)
{
    ext_dra_slice *pool = malloc(sizeof(*pool)), *copy = NULL;
    if (pool == NULL)
        return NULL;
    int64_t gen = parts[0]->generation;
    for (int i = 1; i < n; i++)
        gen = parts[i]->generation > gen ? parts[i]->generation : gen;
    ext_dra_pool_init(pool, parts[0]->node, gen);
    for (int i = 0; i < n; i++)
        if (parts[i]->generation == gen)
            ext_dra_pool_add(pool, parts[i]);
    ext_dra_pool_resolve(pool);
    copy = dup_slice(pool);
    free(pool);
    return copy;
}

/* Puts node's pool (NULL: it has none) and says what it skips, when it changed. */
static bool put_pool(ext_state *st, const char *node, ext_dra_slice *pool)
{
    ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, node);
    if (pool == NULL) {
        free(kgpu_strmap_del(&st->dra_slices, node));
        return old != NULL;
    }
    if (old != NULL && ext_dra_slice_size(old) == ext_dra_slice_size(pool) &&
        memcmp(old, pool, ext_dra_slice_size(pool)) == 0) {
        free(pool);
        return false;
    }
    bool say = old == NULL || old->skipped != pool->skipped;
    void *prev = NULL;
    if (!kgpu_strmap_put(&st->dra_slices, node, pool, &prev)) {
        ext_log(EXT_ERROR, "DRA pool %s: out of memory", node);
        free(pool);
        return false;
    }
    free(prev);
    if (say)
        said_skipped(pool);
    return true;
}

/* The slices of `node` kept, sorted by name, into *out (malloc'd); how many, or -1. */
static int parts_of(ext_state *st, const char *node, ext_dra_slice ***out)
{
    size_t it = 0, n = 0;
    const char *k;
    void *v;
    ext_dra_slice **parts = calloc(st->dra_parts.len + 1, sizeof(*parts));
    *out = parts;
    if (parts == NULL)
        return -1;
    while (kgpu_strmap_next(&st->dra_parts, &it, &k, &v))
        if (strcmp(((ext_dra_slice *)v)->node, node) == 0)
            parts[n++] = v;
    qsort(parts, n, sizeof(*parts), by_node_name);
    return (int)n;
}

/* Node's pool made again from its slices; its inventory refreshed when it changed. */
static void pool_changed(ext_state *st, const char *node)
{
    ext_dra_slice **parts;
    int n = parts_of(st, node, &parts);
    ext_dra_slice *pool = n > 0 ? make_pool(parts, n) : NULL;
    free(parts);
    if (n < 0 || (n > 0 && pool == NULL)) {
        ext_log(EXT_ERROR, "DRA pool %s not updated: out of memory", node);
        return;
    }
    if (put_pool(st, node, pool)) {
        refresh_node(st, node);
        ext_dra_retry(st); /* results naming devices the pool did not have before */
    }
}

void ext_dra_slice_put(ext_state *st, const ext_dra_slice *s)
{
    ext_dra_slice *old = kgpu_strmap_get(&st->dra_parts, s->name), *copy;
    if (old != NULL && ext_dra_slice_size(old) == ext_dra_slice_size(s) &&
        memcmp(old, s, ext_dra_slice_size(s)) == 0)
        return;
    void *prev = NULL;
    if ((copy = dup_slice(s)) == NULL || !kgpu_strmap_put(&st->dra_parts, s->name, copy, &prev)) {
        free(copy);
        ext_log(EXT_ERROR, "ResourceSlice %s: out of memory", s->name);
        return;
    }
    char was[KGPU_NAME_MAX + 1] = "";
    if (old != NULL && strcmp(old->node, s->node) != 0)
        snprintf(was, sizeof(was), "%s", old->node); /* spec.nodeName is immutable; yet */
    free(prev);
    if (was[0] != '\0')
        pool_changed(st, was);
    pool_changed(st, s->node);
}

void ext_dra_slice_gone(ext_state *st, const char *name, const char *node)
{
    ext_dra_slice *old = kgpu_strmap_del(&st->dra_parts, name);
    (void)node; /* the one it had when kept */
    if (old == NULL)
        return;
    char was[KGPU_NAME_MAX + 1];
    snprintf(was, sizeof(was), "%s", old->node);
    free(old);
    pool_changed(st, was);
}

void ext_dra_slices_reset(ext_state *st, const ext_dra_slice *s, int n)
{
    kgpu_strmap_clear_free(&st->dra_parts);
    kgpu_strmap_clear_free(&st->dra_slices);
    for (int i = 0; i < n; i++) {
        ext_dra_slice *copy = dup_slice(&s[i]);
        void *prev = NULL;
        if (copy == NULL || !kgpu_strmap_put(&st->dra_parts, s[i].name, copy, &prev))
            free(copy);
        free(prev); /* a list names each slice once; a duplicate replaces */
    }
    /* Every pool in one pass: the slices sorted by node, then name. */
    size_t it = 0, m = 0;
    const char *k;
    void *v;
    ext_dra_slice **parts = calloc(st->dra_parts.len + 1, sizeof(*parts));
    while (parts != NULL && kgpu_strmap_next(&st->dra_parts, &it, &k, &v))
        parts[m++] = v;
    if (parts != NULL)
        qsort(parts, m, sizeof(*parts), by_node_name);
    for (size_t i = 0, j; parts != NULL && i < m; i = j) {
        for (j = i + 1; j < m && strcmp(parts[j]->node, parts[i]->node) == 0; j++)
            ;
        ext_dra_slice *pool = make_pool(parts + i, (int)(j - i));
        if (pool == NULL || !put_pool(st, parts[i]->node, pool))
            ext_log(EXT_ERROR, "DRA pool %s not read: out of memory", parts[i]->node);
    }
    if (parts == NULL)
        ext_log(EXT_ERROR, "DRA pools not read: out of memory");
    free(parts);
    rebuild_all(st);
}
