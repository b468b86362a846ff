/*
 * Fuzz target for the DRA driver's reading of a ResourceClaim (dra_claim_read):
 * whatever it accepts must be something the driver can prepare: safe names,
 * every device one of the node's GPUs, shares within the GPU, and a CDI spec
 * and checkpoint entry that read back the same. GPU 0 is an A100-40GB in MIG
 * mode: a MIG device accepted is one the slices publish (its name maps back
 * to the same profile and start, allowed for the profile), the whole
 * instance's memory, no share; and no claim's devices overlap one another
 * unnoticed (dra_ckpt_conflict agrees with the masks).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dra.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kgpu_gpu_info gpus[2] = {
    {.index = 0, .uuid = "GPU-0", .model = "A100", .memory_mib = 40960, .numa = 0, .healthy = true,
     .mig_mode = 1},
    {.index = 3, .uuid = "GPU-3", .model = "T4", .memory_mib = 15360, .numa = -1, .healthy = true,
     .mig_mode = -1},
};

/* A MIG allocation is what its device name says, and what the table allows. */
static void check_mig(const dra_alloc *a)
{
    dra_device_ref ref;
    if (!dra_device_find(gpus, 2, true, a->device, &ref) || gpus[ref.gpu].index != a->index)
        abort();
    if (ref.model == NULL) {
        if (a->profile[0] != '\0')
            abort();
        return;
    }
    const kgpu_mig_profile *p =
        ref.profile >= 0 ? &ref.model->profiles[ref.profile] : kgpu_mig_profile_whole(ref.model);
    if (strcmp(a->profile, p->name) != 0 || a->nvml_profile != p->nvml_profile ||
        a->mig_size != p->size || a->mig_shared != (ref.profile < 0) || a->mig_uuid[0] != '\0' ||
        a->mig_start != (ref.profile >= 0 ? ref.start : 0) || p->media ||
        kgpu_mig_mask(a->mig_start, a->mig_size) == 0)
        abort();
    if (ref.profile >= 0 && (a->memory_mib != p->memory_mib || a->milli != 0 ||
                             a->share_id[0] != '\0'))
        abort();
    if (ref.profile < 0 && a->memory_mib > p->memory_mib)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dra_node_view node = {.pool = "n1", .gpus = gpus, .ngpus = 2, .mig = true};
    static dra_claim c;
    kgpu_error err = {0};
    if (dra_claim_read_text((const char *)data, size, NULL, &node, &c, &err) != 0) {
        if (err.msg[0] == '\0')
            abort(); /* a refusal says why */
        return 0;
    }
    if (!dra_safe_name(c.uid) || c.nallocs < 1 || c.nallocs > KGPU_MAX_GPUS_PER_NODE ||
        c.nreqs < 1 || c.nreqs > DRA_MAX_REQUESTS)
        abort();
    for (int i = 0; i < c.nallocs; i++) {
        const dra_alloc *a = &c.allocs[i];
        const kgpu_gpu_info *g = a->index == 0 ? &gpus[0] : a->index == 3 ? &gpus[1] : NULL;
        if (g == NULL || strcmp(g->uuid, a->uuid) != 0 || a->memory_mib < 1 ||
            a->memory_mib > g->memory_mib || a->milli < 0 || a->milli > 1000 ||
            a->limit_pct < 0 || a->limit_pct > 100 || a->req < 0 || a->req >= c.nreqs ||
            !dra_safe_name(c.reqs[a->req]))
            abort();
        check_mig(a);
    }
    /* Overlapping partitions within the claim: the driver's own check sees them. */
    bool overlap = false;
    for (int i = 0; i < c.nallocs; i++)
        for (int j = i + 1; j < c.nallocs; j++) {
            const dra_alloc *x = &c.allocs[i], *y = &c.allocs[j];
            if (x->profile[0] != '\0' && y->profile[0] != '\0' && x->index == y->index &&
                (x->mig_shared != y->mig_shared ||
                 (!x->mig_shared &&
                  (kgpu_mig_mask(x->mig_start, x->mig_size) &
                   kgpu_mig_mask(y->mig_start, y->mig_size)) != 0)))
                overlap = true;
        }
    dra_ckpt none = {0};
    if ((dra_ckpt_conflict(&none, &c, &err) != 0) != overlap)
        abort();
    contract_inventory inv = {.ngpus = 2, .unit_mib = 1024};
    memcpy(inv.gpus, gpus, sizeof(gpus));
    contract_paths paths = {.state_dir = "/s", .shim_lib = "/s/lib.so"};
    json_t *spec = dra_cdi_spec(&c, &inv, &paths);
    if (spec == NULL || json_array_size(json_object_get(spec, "devices")) != (size_t)c.nreqs)
        abort();
    json_decref(spec);
    /* Its checkpoint entry reads back as the claim. */
    dra_ckpt ck = {0}, back = {0};
    if (dra_ckpt_put(&ck, &c, &err) != 0)
        abort();
    char *text = dra_ckpt_encode(&ck);
    if (text == NULL || dra_ckpt_parse(text, strlen(text), "ck", &back, &err) != 0 || back.n != 1 ||
        back.claims[0].nallocs != c.nallocs || back.claims[0].nreqs != c.nreqs ||
        memcmp(back.claims[0].allocs, c.allocs, sizeof(c.allocs[0]) * (size_t)c.nallocs) != 0)
        abort();
    free(text);
    dra_ckpt_free(&ck);
    dra_ckpt_free(&back);
    return 0;
}
