/*
 * DRA nodes' inventory: a node labelled kgpu.io/gpu-allocator=dra takes its
 * GPUs from kgpu-dra-plugin's ResourceSlice for it, so a slice that comes,
 * changes or goes rebuilds that node (or, on a relist, every DRA node) in
 * the inventory. Above inventory.c, which it calls; dra_claims.c holds the
 * nodes' and claims' records. Caller holds st->mu.
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

/* Says which MIG devices of a slice kgpu does not read (a newer driver's profiles, ...). */
static void said_skipped(const ext_dra_slice *s)
{
    if (s->mig_skipped > 0)
        ext_log(EXT_WARN, "ResourceSlice %s: %d MIG devices not read (the first: %s)", s->name,
                s->mig_skipped, s->mig_why);
}

void ext_dra_slice_put(ext_state *st, const ext_dra_slice *s)
{
    ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, s->node);
    if (old != NULL && strcmp(old->name, s->name) != 0 && old->generation > s->generation) {
        ext_log(EXT_WARN, "ResourceSlice %s of node %s ignored: %s is newer", s->name, s->node,
                old->name);
        return;
    }
    if (old != NULL && memcmp(old, s, sizeof(*s)) == 0)
        return;
    if (old == NULL) {
        if ((old = malloc(sizeof(*old))) == NULL ||
            !kgpu_strmap_put(&st->dra_slices, s->node, old, NULL)) {
            free(old);
            ext_log(EXT_ERROR, "ResourceSlice %s: out of memory", s->name);
            return;
        }
    }
    *old = *s;
    said_skipped(s);
    refresh_node(st, s->node);
    ext_dra_retry(st); /* results naming devices the slice did not have before */
}

void ext_dra_slice_gone(ext_state *st, const char *name, const char *node)
{
    ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, node);
    if (old == NULL || strcmp(old->name, name) != 0)
        return; /* another slice of the node's is in force */
    free(kgpu_strmap_del(&st->dra_slices, node));
    refresh_node(st, node);
}

void ext_dra_slices_reset(ext_state *st, const ext_dra_slice *s, int n)
{
    kgpu_strmap_clear_free(&st->dra_slices);
    for (int i = 0; i < n; i++) {
        said_skipped(&s[i]);
        ext_dra_slice *old = kgpu_strmap_get(&st->dra_slices, s[i].node), *copy;
        if (old != NULL && old->generation >= s[i].generation)
            continue;
        if (old != NULL) {
            *old = s[i];
        } else if ((copy = malloc(sizeof(*copy))) != NULL) {
            *copy = s[i];
            if (!kgpu_strmap_put(&st->dra_slices, s[i].node, copy, NULL))
                free(copy);
        }
    }
    rebuild_all(st);
}
