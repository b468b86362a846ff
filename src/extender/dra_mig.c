/*
 * MIG instances that DRA claims hold: a claim's result naming a MIG device
 * of a slice (dra_objects.c) takes that profile's placement on its GPU in
 * the node's records (state.h ext_dra_node), and while a GPU has any
 * instance the cluster holds it whole, so that whole-GPU and share requests
 * do not fit there, as the driver's shared counters allow one kind of use
 * of a GPU at a time. The result's own assignment is the instance's part
 * of the GPU (compute slices of 7, the profile's memory) and is what its
 * GPU queue is charged (queues.c); it is never applied to the cluster.
 * Caller holds st->mu.
 */
#include <stdio.h>
#include <string.h>

#include "state_impl.h"

/* The slice's MIG device named `device`, or NULL. */
static const ext_dra_mig *mig_device(const ext_dra_slice *s, const char *device)
{
    uint64_t h = ext_dra_name_hash(device);
    for (int i = 0; i < s->nmig; i++)
        if (s->migs[i].name_hash == h)
            return &s->migs[i];
    return NULL;
}

bool ext__dra_is_mig(const ext_dra_slice *s, const char *device)
{
    return mig_device(s, device) != NULL;
}

const char *ext__dra_mig_charge(ext_state *st, ext_dra_result *r, const ext_dra_slice *s, int idx,
                                kgpu_error *err)
{
    ext_dra_node *n = kgpu_strmap_get(&st->dra_nodes, r->pool);
    const ext_dra_mig *md = mig_device(s, r->device);
    if (n == NULL || md == NULL)
        return "the node's slice has no such device";
    const ext_dra_device *gd = &s->devices[md->gpu];
    const kgpu_node *node = kgpu_cluster_node(st->cluster, idx);
    int pos = -1;
    for (int i = 0; i < node->ngpus; i++)
        if (node->gpus[i].index == gd->index)
            pos = i;
    if (pos < 0 || gd->mig_model <= 0)
        return "the MIG device's GPU is not in kgpu's inventory";
    const kgpu_mig_model *m = kgpu_mig_model_at(gd->mig_model - 1);
    const kgpu_gpu *g = &node->gpus[pos];
    if (n->mig_users[pos] == 0) {
        if (g->free_milli != KGPU_MILLI || g->free_memory_mib != g->memory_mib)
            return "its GPU is in use whole or in shares";
        memset(&n->mig[pos], 0, sizeof(n->mig[pos]));
    } else if (n->mig_model[pos] != gd->mig_model - 1) {
        return "its GPU's MIG model changed";
    }
    if (!kgpu_mig_fits(m, &n->mig[pos], md->profile, md->start))
        return "its placement overlaps an instance charged already";
    if (n->mig_users[pos] == 0) {
        kgpu_request hold;
        ext_dra_mig_hold(&hold);
        if (kgpu_cluster_apply(st->cluster, &hold, idx, &pos, &n->hold[pos], err) != 0)
            return err->msg;
        n->mig_model[pos] = gd->mig_model - 1;
    }
    kgpu_mig_take(m, &n->mig[pos], md->profile, md->start);
    n->mig_users[pos]++;
    const kgpu_mig_profile *p = &m->profiles[md->profile];
    r->mig = true;
    r->mig_profile = md->profile;
    r->mig_start = md->start;
    memset(&r->a, 0, sizeof(r->a));
    r->a.node = idx;
    r->a.ngpus = 1;
    r->a.gpus[0] = pos;
    r->a.gpu_milli = p->compute * KGPU_MILLI / KGPU_MIG_COMPUTE_SLICES;
    r->a.gpu_memory_mib = p->memory_mib < g->memory_mib ? p->memory_mib : g->memory_mib;
    r->a.klass = -1;
    r->applied = true;
    return NULL;
}

void ext__dra_mig_uncharge(ext_state *st, ext_dra_result *r)
{
    ext_dra_node *n = kgpu_strmap_get(&st->dra_nodes, r->pool);
    int pos = r->a.gpus[0];
    r->applied = false;
    r->mig = false;
    if (n == NULL || pos < 0 || pos >= KGPU_MAX_GPUS_PER_NODE || n->mig_users[pos] <= 0)
        return; /* the node's records went with it (its cluster was rebuilt since) */
    kgpu_mig_give(kgpu_mig_model_at(n->mig_model[pos]), &n->mig[pos], r->mig_profile,
                  r->mig_start);
    if (--n->mig_users[pos] > 0)
        return;
    kgpu_error err;
    if (kgpu_cluster_release(st->cluster, &n->hold[pos], &err) != 0)
        ext_log(EXT_ERROR, "DRA node %s: MIG hold of GPU %d not released: %s", r->pool, pos,
                err.msg);
}

void ext__dra_mig_forget(ext_state *st)
{
    size_t it = 0;
    const char *k;
    void *v;
    while (kgpu_strmap_next(&st->dra_nodes, &it, &k, &v)) {
        ext_dra_node *n = v;
        memset(n->mig, 0, sizeof(n->mig));
        memset(n->mig_users, 0, sizeof(n->mig_users));
    }
}
