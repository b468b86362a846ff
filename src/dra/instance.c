/*
 * The MIG instances prepared claims hold (dra.h, dra_mig_ops): made at
 * Prepare, found again or made again after a driver restart or a node
 * reboot, destroyed at Unprepare. NVML sits behind a table of three calls
 * so the rules here are tested without a GPU.
 *
 * Two kinds of holding: a MIG device ("gpu-0-mig-3g-20gb-4") is one GPU
 * instance of its profile at its placement, held by its claim alone; the
 * whole-GPU device of a GPU in MIG mode is the full-size instance at 0
 * (CUDA sees no GPU in MIG mode without one), made by the first claim that
 * needs it, shared by every claim holding a share of that GPU, and
 * destroyed with the last: the checkpoint's claims are its reference count.
 *
 * An instance is known by its GPU, GI ID and placement together: after a
 * reboot NVML hands out GI IDs afresh, and an ID alone could name another
 * claim's instance.
 */
#include <stdio.h>
#include <string.h>

#include "dra.h"

bool dra_claim_has_mig(const dra_claim *c)
{
    for (int i = 0; i < c->nallocs; i++)
        if (c->allocs[i].profile[0] != '\0')
            return true;
    return false;
}

/* What NVML lists on one GPU, read once per call. */
typedef struct gpu_list {
    int index; /* -1: not read */
    int n;
    kgpu_nvml_mig mig[KGPU_NVML_MIG_MAX];
} gpu_list;

static int list_of(const dra_mig_ops *ops, gpu_list *lists, int *nlists, int index,
                   gpu_list **out, kgpu_error *err)
{
    for (int i = 0; i < *nlists; i++)
        if (lists[i].index == index) {
            *out = &lists[i];
            return 0;
        }
    if (*nlists >= KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "more than %d GPUs in one claim",
                              KGPU_MAX_GPUS_PER_NODE);
    gpu_list *l = &lists[*nlists];
    l->index = index;
    l->n = 0;
    int rc = ops->list(ops->ctx, index, l->mig, KGPU_NVML_MIG_MAX, &l->n, err);
    if (rc != 0)
        return rc;
    (*nlists)++;
    *out = l;
    return 0;
}

/* The listed instance that is a's, or NULL: same GI ID, profile and placement. */
static const kgpu_nvml_mig *live(const gpu_list *l, const dra_alloc *a)
{
    for (int i = 0; i < l->n; i++) {
        const kgpu_nvml_mig *m = &l->mig[i];
        if (m->gi_id == a->gi_id && m->nvml_profile == a->nvml_profile &&
            m->start == a->mig_start && m->uuid[0] != '\0')
            return m;
    }
    return NULL;
}

static void record(dra_alloc *a, const kgpu_nvml_mig *m, bool *changed)
{
    if (a->gi_id != m->gi_id || a->ci_id != m->ci_id || strcmp(a->mig_uuid, m->uuid) != 0)
        *changed = true;
    a->gi_id = m->gi_id;
    a->ci_id = m->ci_id;
    snprintf(a->mig_uuid, sizeof(a->mig_uuid), "%s", m->uuid);
}

/* A live shared whole instance on a's GPU that another claim in ck records, or NULL. */
static const kgpu_nvml_mig *shared_elsewhere(const dra_ckpt *ck, const dra_claim *c,
                                             const gpu_list *l, const dra_alloc *a)
{
    for (int k = 0; ck != NULL && k < ck->n; k++) {
        const dra_claim *o = &ck->claims[k];
        if (strcmp(o->uid, c->uid) == 0)
            continue;
        for (int j = 0; j < o->nallocs; j++) {
            const dra_alloc *b = &o->allocs[j];
            const kgpu_nvml_mig *m;
            if (b->mig_shared && b->index == a->index && strcmp(b->uuid, a->uuid) == 0 &&
                (m = live(l, b)) != NULL)
                return m;
        }
    }
    return NULL;
}

int dra_instances_ensure(const dra_mig_ops *ops, const dra_ckpt *ck, dra_claim *c,
                         bool *changed, kgpu_error *err)
{
    bool ch = false, made[KGPU_MAX_GPUS_PER_NODE] = {false};
    gpu_list lists[KGPU_MAX_GPUS_PER_NODE];
    int nlists = 0, rc = 0;
    if (!dra_claim_has_mig(c))
        goto out;
    if (ops == NULL || ops->list == NULL || ops->create == NULL || ops->destroy == NULL) {
        rc = kgpu_error_set(err, KGPU_ESTATE,
                            "ResourceClaim %s/%s holds a MIG device, and MIG instances are made "
                            "through NVML only (not with --fake-gpus)",
                            c->ns, c->name);
        goto out;
    }
    for (int i = 0; i < c->nallocs && rc == 0; i++) {
        dra_alloc *a = &c->allocs[i];
        if (a->profile[0] == '\0')
            continue;
        gpu_list *l;
        if ((rc = list_of(ops, lists, &nlists, a->index, &l, err)) != 0)
            break;
        const kgpu_nvml_mig *m = a->mig_uuid[0] != '\0' ? live(l, a) : NULL;
        if (m == NULL && a->mig_shared) {
            /* Another claim's, or an earlier share of the same GPU in this claim. */
            m = shared_elsewhere(ck, c, l, a);
            for (int j = 0; j < i && m == NULL; j++)
                if (c->allocs[j].mig_shared && c->allocs[j].index == a->index)
                    m = live(l, &c->allocs[j]);
        }
        if (m != NULL) {
            record(a, m, &ch);
            continue;
        }
        kgpu_nvml_mig fresh;
        memset(&fresh, 0, sizeof(fresh));
        kgpu_error ce = {0};
        if (ops->create(ops->ctx, a->index, a->nvml_profile, a->mig_start, &fresh, &ce) != 0) {
            rc = kgpu_error_set(err, ce.code ? ce.code : KGPU_EIO,
                                "ResourceClaim %s/%s: making MIG instance %s (%s at memory slice "
                                "%d of GPU %d): %s",
                                c->ns, c->name, a->device, a->profile, a->mig_start, a->index,
                                ce.msg);
            break;
        }
        made[i] = true;
        record(a, &fresh, &ch);
        /* Later allocations on this GPU must see it: list it as made. */
        if (l->n < KGPU_NVML_MIG_MAX)
            l->mig[l->n++] = fresh;
    }
    if (rc != 0) {
        /* Nothing half-made stays behind: what this call made goes again. */
        for (int i = 0; i < c->nallocs; i++) {
            if (!made[i])
                continue;
            kgpu_error de = {0};
            (void)ops->destroy(ops->ctx, c->allocs[i].index, c->allocs[i].gi_id, &de);
            c->allocs[i].mig_uuid[0] = '\0';
            c->allocs[i].gi_id = c->allocs[i].ci_id = 0;
        }
    }
out:
    if (changed != NULL)
        *changed = ch;
    return rc;
}

int dra_instances_release(const dra_mig_ops *ops, const dra_ckpt *ck, const dra_claim *c,
                          kgpu_error *err)
{
    if (!dra_claim_has_mig(c))
        return 0;
    if (ops == NULL || ops->list == NULL || ops->destroy == NULL)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "ResourceClaim %s/%s holds MIG instances and NVML is not open",
                              c->ns, c->name);
    gpu_list lists[KGPU_MAX_GPUS_PER_NODE];
    int nlists = 0;
    for (int i = 0; i < c->nallocs; i++) {
        const dra_alloc *a = &c->allocs[i];
        if (a->profile[0] == '\0' || a->mig_uuid[0] == '\0')
            continue;
        gpu_list *l;
        int rc = list_of(ops, lists, &nlists, a->index, &l, err);
        if (rc != 0)
            return rc;
        if (live(l, a) == NULL)
            continue; /* gone already (a reboot, or an earlier try) */
        if (a->mig_shared && shared_elsewhere(ck, c, l, a) != NULL)
            continue; /* another claim still shares the whole instance */
        bool done = false;
        for (int j = 0; j < i && !done; j++)
            done = c->allocs[j].mig_shared && a->mig_shared && c->allocs[j].index == a->index &&
                   c->allocs[j].gi_id == a->gi_id;
        if (done)
            continue;
        kgpu_error de = {0};
        if (ops->destroy(ops->ctx, a->index, a->gi_id, &de) != 0)
            return kgpu_error_set(err, de.code ? de.code : KGPU_EIO,
                                  "ResourceClaim %s/%s: destroying MIG instance %s (GI %u on GPU "
                                  "%d): %s",
                                  c->ns, c->name, a->device, a->gi_id, a->index, de.msg);
    }
    return 0;
}
