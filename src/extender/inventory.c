/*
 * The node inventory: replaced whole (a cluster file, a node relist) or a
 * node at a time (watch events), every held pod carried over to the new
 * cluster by GPU device index, or kept as an orphan when its GPUs left.
 * Models no node has any more give their ids back. Caller holds st->mu.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "state_impl.h"

/* ---- nodes ---- */

/* The spec of an existing node, pointing into the cluster (valid until it changes). */
static void spec_of(const kgpu_cluster *c, const kgpu_node *n, kgpu_node_spec *spec,
                    kgpu_gpu_spec *gpus)
{
    memset(spec, 0, sizeof(*spec));
    spec->name = n->name;
    spec->cpu_milli = n->cpu_milli;
    spec->memory_mib = n->memory_mib;
    spec->labels = n->labels;
    spec->nlabels = n->nlabels;
    for (int i = 0; i < n->ngpus; i++) {
        gpus[i] = (kgpu_gpu_spec){.index = n->gpus[i].index,
                                  .uuid = n->gpus[i].uuid,
                                  .model = kgpu_cluster_model_name(c, n->gpus[i].model),
                                  .memory_mib = n->gpus[i].memory_mib,
                                  .numa = n->gpus[i].numa,
                                  .healthy = n->gpus[i].healthy};
    }
    spec->gpus = gpus;
    spec->ngpus = n->ngpus;
}

void ext_state_node_spec(const ext_state *st, int i, kgpu_node_spec *spec, kgpu_gpu_spec *gpus)
{
    spec_of(st->cluster, kgpu_cluster_node(st->cluster, i), spec, gpus);
}

/* Device indexes (not positions) of a held assignment, to survive a rebuild. */
typedef struct held_ref {
    ext_pod *p;
    int index[KGPU_MAX_PARTS][KGPU_MAX_GPUS_PER_NODE];
} held_ref;

int ext_state_set_nodes(ext_state *st, const kgpu_node_spec *specs, int n, kgpu_error *err)
{
    kgpu_cluster *c = kgpu_cluster_new();
    if (c == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    /*
     * Model ids stay what they were for the models some node still has:
     * learned shapes, remembered pods and the policies' replay hold model
     * masks. The ids of models no node has any more are reclaimed (`gone`:
     * holes the next new models take) and forgotten by the learned shapes
     * below, so that the 64-entry table holds what the inventory has, not
     * every name it ever had.
     */
    kgpu_strmap names; /* the models of the new inventory */
    kgpu_strmap_init(&names);
    bool oom = false;
    for (int i = 0; i < n && !oom; i++)
        for (int g = 0; g < specs[i].ngpus && !oom; g++)
            oom = specs[i].gpus[g].model != NULL &&
                  !kgpu_strmap_put(&names, specs[i].gpus[g].model, (void *)1, NULL);
    uint64_t gone = 0;
    for (int i = 0; i < kgpu_cluster_model_count(st->cluster) && !oom; i++) {
        const char *m = kgpu_cluster_model_name(st->cluster, i);
        if (kgpu_cluster_model_id(st->cluster, m, false) != i)
            continue; /* a hole */
        if (kgpu_strmap_get(&names, m) == NULL)
            gone |= 1ULL << i;
        else
            oom = kgpu_cluster_model_put(c, i, m) != 0;
    }
    kgpu_strmap_clear(&names);
    if (oom) {
        kgpu_cluster_free(c);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        kgpu_error why;
        kgpu_error_clear(&why);
        int rc = kgpu_cluster_add_node(c, &specs[i], &why);
        if (rc == KGPU_ERANGE) {
            /* One node's models must not keep every other node out of the inventory. */
            ext_log(EXT_ERROR, "%s; the node is left out of the inventory", why.msg);
            continue;
        }
        if (rc < 0) {
            kgpu_cluster_free(c);
            if (err != NULL)
                *err = why;
            return rc;
        }
    }
    /* Carry every held pod over by GPU device index. */
    size_t npods = st->pods.len, k = 0, it = 0;
    held_ref *refs = calloc(npods ? npods : 1, sizeof(*refs));
    if (refs == NULL) {
        kgpu_cluster_free(c);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    const char *key;
    void *v;
    while (kgpu_strmap_next(&st->pods, &it, &key, &v) && k < npods) {
        ext_pod *p = v;
        const kgpu_node *old = kgpu_cluster_node(st->cluster, p->part[0].a.node);
        refs[k].p = p;
        for (int i = 0; i < p->nparts && old != NULL; i++)
            for (int g = 0; g < p->part[i].a.ngpus; g++)
                refs[k].index[i][g] = old->gpus[p->part[i].a.gpus[g]].index;
        k++;
    }
    ext_state_integrate_usage(st);
    kgpu_cluster *old = st->cluster;
    st->cluster = c;
    ext__free_policies(st); /* their caches are keyed by node positions of the old cluster */
    if (gone != 0) {
        char list[512] = "";
        size_t off = 0;
        for (int i = 0; i < KGPU_MAX_MODELS && off < sizeof(list); i++)
            if ((gone >> i) & 1)
                off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", off ? ", " : "",
                                        kgpu_cluster_model_name(old, i));
        ext_log(EXT_INFO, "GPU models no node has any more are forgotten: %s", list);
        ext__shapes_forget_models(st, gone);
    }
    for (size_t j = 0; j < k; j++) {
        ext_pod *p = refs[j].p;
        int idx = kgpu_cluster_find_node(c, p->node);
        const kgpu_node *node = kgpu_cluster_node(c, idx);
        bool ok = node != NULL;
        int applied = 0;
        for (int i = 0; i < p->nparts && ok; i++) {
            kgpu_request r;
            memset(&r, 0, sizeof(r));
            r.gpu_count = p->part[i].a.ngpus;
            r.exclusive = p->part[i].a.exclusive;
            r.gpu_milli = p->part[i].a.gpu_milli;
            r.gpu_memory_mib = p->part[i].a.exclusive ? 0 : p->part[i].a.gpu_memory_mib;
            r.models = ~0ULL;
            r.shape = -1;
            r.cpu_milli = p->part[i].a.cpu_milli;
            r.memory_mib = p->part[i].a.memory_mib;
            int pos[KGPU_MAX_GPUS_PER_NODE];
            for (int g = 0; g < r.gpu_count && ok; g++)
                ok = (pos[g] = ext__gpu_position(node, refs[j].index[i][g], NULL)) >= 0;
            ok = ok && ext__apply_clamped(c, &r, idx, pos, &p->part[i].a, NULL) == 0;
            applied += ok;
        }
        if (!ok) {
            /* Not lost: kept as an orphan, counted again if the GPUs come back. */
            kgpu_assigned_part *parts = calloc((size_t)p->nparts + 1, sizeof(*parts));
            const kgpu_node *was = kgpu_cluster_node(old, kgpu_cluster_find_node(old, p->node));
            for (int i = 0; parts != NULL && i < p->nparts; i++) {
                kgpu_assigned_part *ap = &parts[i];
                snprintf(ap->container, sizeof(ap->container), "%s", p->part[i].container);
                ap->exclusive = p->part[i].a.exclusive;
                ap->ngpus = p->part[i].a.ngpus;
                for (int g = 0; g < ap->ngpus; g++) {
                    int pos = was ? ext__gpu_position(was, refs[j].index[i][g], NULL) : -1;
                    ap->gpus[g].index = refs[j].index[i][g];
                    if (pos >= 0)
                        snprintf(ap->gpus[g].uuid, sizeof(ap->gpus[g].uuid), "%s",
                                 was->gpus[pos].uuid);
                    ap->gpus[g].milli = p->part[i].a.gpu_milli;
                    ap->gpus[g].memory_mib = p->part[i].a.gpu_memory_mib;
                }
            }
            for (int i = applied - 1; i >= 0; i--)
                kgpu_cluster_release(c, &p->part[i].a, NULL);
            ext__usage_unhold(st, p);
            ext_state_doubt_end(st, p, EXT_DOUBT_RELEASED); /* nothing is held for it now */
            kgpu_strmap_del(&st->pods, p->uid);
            if (parts != NULL)
                ext__keep_orphan(st, p->uid, p->ns, p->name, p->node, parts, p->nparts,
                            p->part[0].a.cpu_milli, p->part[0].a.memory_mib, p->queue_label,
                            p->priority, "its GPUs left the node's inventory");
            free(parts);
            free(p);
        }
    }
    free(refs);
    /* Pods without kgpu GPUs: taken again by node name, dropped with their node. */
    char **dropped = NULL;
    size_t ndropped = 0;
    it = 0;
    while (kgpu_strmap_next(&st->cpu_pods, &it, &key, &v))
        if (!ext__cpu_take(c, v))
            ext__push_owned(&dropped, &ndropped, strdup(key));
    for (size_t j = 0; j < ndropped; j++) {
        free(kgpu_strmap_del(&st->cpu_pods, dropped[j]));
        free(dropped[j]);
    }
    free(dropped);
    kgpu_cluster_free(old);
    ext_dra_cluster_rebuilt(st); /* DRA claims: charged again on the new cluster */
    ext_queues_recharge(st);     /* from the GPUs each pod holds in the new cluster */
    ext__retry_orphans(st); /* GPUs that came back, or a node that reappeared */
    return 0;
}

/* Rebuilds with every current node, `spec` replacing (or joining) its namesake, `drop` left out. */
static int rebuild_with(ext_state *st, const kgpu_node_spec *spec, const char *drop,
                        kgpu_error *err)
{
    int n = kgpu_cluster_node_count(st->cluster);
    kgpu_node_spec *specs = calloc((size_t)n + 1, sizeof(*specs));
    kgpu_gpu_spec(*gpus)[KGPU_MAX_GPUS_PER_NODE] = calloc((size_t)n + 1, sizeof(*gpus));
    if (specs == NULL || gpus == NULL) {
        free(specs);
        free(gpus);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int m = 0;
    bool replaced = false;
    for (int i = 0; i < n; i++) {
        const kgpu_node *node = kgpu_cluster_node(st->cluster, i);
        if (drop != NULL && strcmp(node->name, drop) == 0)
            continue;
        if (spec != NULL && strcmp(node->name, spec->name) == 0) {
            specs[m++] = *spec;
            replaced = true;
            continue;
        }
        spec_of(st->cluster, node, &specs[m], gpus[m]);
        m++;
    }
    if (spec != NULL && !replaced)
        specs[m++] = *spec;
    /* The specs point into the old cluster, which ext_state_set_nodes frees last. */
    int rc = ext_state_set_nodes(st, specs, m, err);
    free(specs);
    free(gpus);
    return rc;
}

static bool same_inventory(const kgpu_cluster *c, const kgpu_node *n, const kgpu_node_spec *s)
{
    if (n->ngpus != s->ngpus || n->cpu_milli != s->cpu_milli || n->memory_mib != s->memory_mib)
        return false;
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        const kgpu_gpu_spec *t = &s->gpus[i];
        if (g->index != t->index || g->memory_mib != t->memory_mib || g->numa != t->numa ||
            strcmp(g->uuid, t->uuid ? t->uuid : "") != 0 ||
            strcmp(kgpu_cluster_model_name(c, g->model), t->model) != 0)
            return false;
    }
    return true;
}

int ext_state_upsert_node(ext_state *st, const kgpu_node_spec *spec, kgpu_error *err)
{
    int idx = kgpu_cluster_find_node(st->cluster, spec->name);
    if (idx < 0) {
        if (spec->ngpus == 0)
            return 0; /* not a GPU node: nothing for kgpu to track */
        int rc = kgpu_cluster_add_node(st->cluster, spec, err);
        if (rc >= 0 && st->queues_spec != NULL)
            ext_queues_recharge(st); /* its models may be new: per-model entries bind to them */
        if (rc >= 0) {
            ext__retry_orphans(st);
            ext_dra_retry(st); /* claims on a DRA node that had no GPUs known */
        }
        return rc < 0 ? rc : 0;
    }
    const kgpu_node *n = kgpu_cluster_node(st->cluster, idx);
    if (same_inventory(st->cluster, n, spec)) {
        for (int i = 0; i < n->ngpus; i++)
            if (n->gpus[i].healthy != spec->gpus[i].healthy)
                kgpu_cluster_set_gpu_health(st->cluster, idx, i, spec->gpus[i].healthy, NULL);
        return 0;
    }
    if (spec->ngpus == 0)
        return ext_state_remove_node(st, spec->name);
    return rebuild_with(st, spec, NULL, err);
}

int ext_state_remove_node(ext_state *st, const char *name)
{
    if (kgpu_cluster_find_node(st->cluster, name) < 0)
        return 0;
    return rebuild_with(st, NULL, name, NULL);
}
