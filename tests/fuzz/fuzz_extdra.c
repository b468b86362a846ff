/*
 * Fuzz target for the extender's DRA parsers (dra_objects.c): every input is read
 * as a ResourceSlice, a ResourceClaim and a Pod with resourceClaims, and
 * what is accepted goes into a small state with one DRA node. Whatever
 * comes in, the GPUs stay within capacity, a claim gone gives back exactly
 * what it took, and a pod's request is one kgpu can score.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ext.h"
#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * The n1 slice every input starts from: two GPUs, the second of 15 GiB,
 * the first an A100-40GB offering every MIG placement as gpu-0-mig-PROFILE-START.
 */
static void base_slice(ext_dra_slice *s)
{
    memset(s, 0, sizeof(*s));
    strcpy(s->name, "n1-gpu.kgpu.io");
    strcpy(s->node, "n1");
    s->ndevices = 2;
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    int mi = 0;
    while (kgpu_mig_model_at(mi) != m)
        mi++;
    s->devices[0] = (ext_dra_device){"gpu-0", 0, "GPU-0", "A100-SXM4-40GB", 40960, 0, mi + 1,
                                     EXT_CEL_SEMVER(8, 0, 0), false};
    s->devices[1] = (ext_dra_device){"gpu-1", 1, "GPU-1", "T4", 15360, -1, 0, -1, false};
    for (int p = 0; p < m->nprofiles; p++)
        for (int k = 0; k < m->profiles[p].nstarts; k++) {
            char name[64];
            snprintf(name, sizeof(name), "gpu-0-mig-%s-%d", m->profiles[p].name,
                     m->profiles[p].starts[k]);
            s->migs[s->nmig++] = (ext_dra_mig){
                .name_hash = ext_dra_name_hash(name),
                .pname = (uint8_t)ext_dra_profile_id(m->profiles[p].name),
                .start = (uint8_t)m->profiles[p].starts[k]};
        }
}

static void check_capacity(const ext_state *st)
{
    for (int i = 0; i < kgpu_cluster_node_count(st->cluster); i++) {
        const kgpu_node *n = kgpu_cluster_node(st->cluster, i);
        for (int g = 0; g < n->ngpus; g++)
            if (n->gpus[g].free_milli < 0 || n->gpus[g].free_milli > KGPU_MILLI ||
                n->gpus[g].free_memory_mib < 0 ||
                n->gpus[g].free_memory_mib > n->gpus[g].memory_mib)
                abort();
    }
}

static bool all_free(const ext_state *st)
{
    for (int i = 0; i < kgpu_cluster_node_count(st->cluster); i++) {
        const kgpu_node *n = kgpu_cluster_node(st->cluster, i);
        for (int g = 0; g < n->ngpus; g++)
            if (n->gpus[g].free_milli != KGPU_MILLI ||
                n->gpus[g].free_memory_mib != n->gpus[g].memory_mib || n->gpus[g].placements != 0)
                return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    if (root == NULL)
        return 0;
    static ext_config cfg;
    static ext_metrics metrics;
    static ext_state st;
    ext_config_defaults(&cfg);
    cfg.log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    kgpu_error_clear(&err);
    if (ext_state_init(&st, &cfg, &metrics, &err) != 0)
        abort();
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    kgpu_node_spec n1 = {.name = "n1", .cpu_milli = 64000, .memory_mib = 1 << 18};
    ext_dra_node_seen(&st, &n1, true, gpus);
    ext_dra_slice base;
    base_slice(&base);
    ext_dra_slice_put(&st, &base);
    if (kgpu_cluster_gpu_count(st.cluster) != 2)
        abort();

    /* As a slice: accepted ones are the driver's, with sane devices. */
    ext_dra_slice *s = malloc(sizeof(*s));
    if (s == NULL)
        abort();
    int rc = ext_dra_slice_parse(root, s, &err);
    if (rc != 0 && err.msg[0] == '\0')
        abort(); /* a refusal says why */
    if (rc == 0) {
        if (s->ndevices < 0 || s->ndevices > KGPU_MAX_GPUS_PER_NODE || s->node[0] == '\0')
            abort();
        for (int i = 0; i < s->ndevices; i++)
            if (s->devices[i].memory_mib <= 0 || s->devices[i].model[0] == '\0')
                abort();
        ext_dra_slice_put(&st, s);
        check_capacity(&st);
    }
    free(s);

    /* As a claim: charged within capacity; gone, everything is given back. */
    ext_dra_claim *c = NULL;
    kgpu_error_clear(&err);
    rc = ext_dra_claim_parse(root, &c, &err);
    if (rc != 0 && (c != NULL || err.msg[0] == '\0'))
        abort();
    if (c != NULL) {
        if (c->nreq < 0 || c->nreq > EXT_DRA_REQUESTS || c->nres < 0 || c->nres > EXT_DRA_RESULTS ||
            (c->error[0] != '\0' && (c->nreq | c->nres) != 0))
            abort();
        char ns[64], name[KGPU_NAME_MAX + 1];
        strcpy(ns, c->ns);
        strcpy(name, c->name);
        ext_dra_claim_put(&st, c); /* taken over */
        check_capacity(&st);
        ext_dra_claims_reset(&st, NULL, 0); /* a relist without it */
        if (!all_free(&st) || st.dra_claims.len != 0 || st.dra_unapplied != 0)
            abort();
        ext_dra_claim_gone(&st, ns, name); /* gone twice: nothing happens */
    }

    /* As a pod: a request of its claim (the input itself, if it is one) that validates. */
    c = NULL;
    if (ext_dra_claim_parse(root, &c, NULL) == 0 && c != NULL)
        ext_dra_claim_put(&st, c);
    ext_dra_ask asks[KGPU_PLACE_MAX_REQS];
    char why[600], note[600];
    rc = ext_dra_pod_asks(&st, root, asks, KGPU_PLACE_MAX_REQS, why, sizeof(why));
    for (int k = 0; k < rc; k++) {
        kgpu_request req;
        ext_dra_request_of(asks[k].req, &req);
        req.models = ~0ULL;
        if (kgpu_request_validate(&req, NULL) != 0)
            abort();
    }
    if (rc == -1 && why[0] == '\0')
        abort();
    /* Scored on n1: 0..10, and the cluster as it was (what scoring held is released). */
    if (rc > 0) {
        kgpu_pod pod;
        memset(&pod, 0, sizeof(pod));
        strcpy(pod.ns, "default");
        strcpy(pod.name, "fuzz");
        int idx = kgpu_cluster_find_node(st.cluster, "n1"), score = -1;
        int64_t before[KGPU_MAX_GPUS_PER_NODE][2];
        const kgpu_node *n = kgpu_cluster_node(st.cluster, idx);
        for (int g = 0; g < n->ngpus; g++) {
            before[g][0] = n->gpus[g].free_milli;
            before[g][1] = n->gpus[g].free_memory_mib;
        }
        if (ext_dra_score(&st, &pod, root, &idx, 1, &score, why, sizeof(why), note, sizeof(note),
                          &err) != 0 || score < 0 || score > 10)
            abort();
        n = kgpu_cluster_node(st.cluster, idx);
        for (int g = 0; g < n->ngpus; g++)
            if (before[g][0] != n->gpus[g].free_milli || before[g][1] != n->gpus[g].free_memory_mib)
                abort();
    }
    ext_state_destroy(&st);
    json_decref(root);
    return 0;
}
