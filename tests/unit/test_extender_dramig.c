/*
 * Unit tests of the extender's MIG records of DRA nodes (dra_mig.c through
 * dra_claims.c): what claims' MIG results take on a GPU, the hold that
 * keeps whole and share use off it, overlaps refused, and all of it given
 * back exactly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ext.h"

typedef struct world {
    ext_config cfg;
    ext_metrics metrics;
    ext_state st;
    ext_dra_slice *slice; /* n1's, as the state was given it */
} world;

/* Node n1 (DRA) with one A100-SXM4-40GB offering every MIG placement as gpu-0-PROFILE-START. */
static world *world_new(void)
{
    world *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    ext_config_defaults(&w->cfg);
    w->cfg.log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    if (ext_state_init(&w->st, &w->cfg, &w->metrics, &err) != 0)
        fail_msg("state: %s", err.msg);
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    kgpu_node_spec n1 = {.name = "n1", .cpu_milli = 64000, .memory_mib = 1 << 18};
    ext_dra_node_seen(&w->st, &n1, true, gpus);
    ext_dra_slice *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    strcpy(s->name, "n1-gpu.kgpu.io");
    strcpy(s->node, "n1");
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    int mi = 0;
    while (kgpu_mig_model_at(mi) != m)
        mi++;
    s->ndevices = 1;
    s->devices[0] =
        (ext_dra_device){"gpu-0", 0, "GPU-0", "A100-SXM4-40GB", 40960, 0, mi + 1, -1, false};
    for (int p = 0; p < m->nprofiles; p++)
        for (int k = 0; k < m->profiles[p].nstarts; k++) {
            char name[64];
            snprintf(name, sizeof(name), "gpu-0-%s-%d", m->profiles[p].name,
                     m->profiles[p].starts[k]);
            s->migs[s->nmig++] = (ext_dra_mig){
                .name_hash = ext_dra_name_hash(name),
                .pname = (uint8_t)ext_dra_profile_id(m->profiles[p].name),
                .start = (uint8_t)m->profiles[p].starts[k]};
        }
    ext_dra_slice_put(&w->st, s);
    w->slice = s;
    assert_int_equal(kgpu_cluster_gpu_count(w->st.cluster), 1);
    return w;
}

static void world_free(world *w)
{
    ext_state_destroy(&w->st);
    ext_config_free(&w->cfg);
    free(w->slice);
    free(w);
}

/* A claim `name` allocated `device` of n1 (memory_mib < 0: no consumedCapacity). */
static void allocate(world *w, const char *name, const char *device, int64_t memory_mib)
{
    ext_dra_claim *c = calloc(1, sizeof(*c) + sizeof(ext_dra_result) + 1);
    assert_non_null(c);
    strcpy(c->ns, "default");
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->cel = (char *)&c->res[1];
    c->nres = 1;
    strcpy(c->res[0].pool, "n1");
    snprintf(c->res[0].device, sizeof(c->res[0].device), "%s", device);
    c->res[0].memory_mib = memory_mib;
    c->res[0].cores = memory_mib > 0 ? 10 : 0;
    ext_dra_claim_put(&w->st, c);
}

static const kgpu_gpu *gpu0(world *w)
{
    return &kgpu_cluster_node(w->st.cluster, 0)->gpus[0];
}

static const ext_dra_node *node1(world *w)
{
    return kgpu_strmap_get(&w->st.dra_nodes, "n1");
}

static void test_instances_hold_the_gpu_and_give_it_back(void **state)
{
    (void)state;
    world *w = world_new();
    allocate(w, "a", "gpu-0-3g.20gb-4", -1);
    allocate(w, "b", "gpu-0-1g.5gb-0", -1);
    assert_int_equal(w->st.dra_unapplied, 0);
    assert_int_equal(node1(w)->mig_users[0], 2);
    assert_int_equal(node1(w)->mig[0].mem, 0xF1); /* slices 4-7 and 0 */
    assert_int_equal(gpu0(w)->free_milli, 0);     /* held whole */
    /* An overlapping placement is not charged (retried when things change). */
    allocate(w, "c", "gpu-0-4g.20gb-0", -1);
    assert_int_equal(w->st.dra_unapplied, 1);
    assert_int_equal(node1(w)->mig_users[0], 2);
    ext_dra_claim_gone(&w->st, "default", "b");
    assert_int_equal(node1(w)->mig_users[0], 2); /* c charged now: 0-3 free with b gone */
    assert_int_equal(w->st.dra_unapplied, 0);
    ext_dra_claim_gone(&w->st, "default", "a");
    ext_dra_claim_gone(&w->st, "default", "c");
    assert_int_equal(node1(w)->mig_users[0], 0);
    assert_int_equal(gpu0(w)->free_milli, KGPU_MILLI);
    assert_int_equal(gpu0(w)->free_memory_mib, 40960);
    world_free(w);
}

static void test_one_kind_of_use(void **state)
{
    (void)state;
    world *w = world_new();
    allocate(w, "share", "gpu-0", 4096);
    allocate(w, "inst", "gpu-0-1g.5gb-6", -1);
    assert_int_equal(w->st.dra_unapplied, 1); /* the GPU is in a share: no instance */
    assert_int_equal(node1(w)->mig_users[0], 0);
    ext_dra_claim_gone(&w->st, "default", "share");
    assert_int_equal(node1(w)->mig_users[0], 1); /* retried once the share went */
    allocate(w, "whole", "gpu-0", -1);
    assert_int_equal(w->st.dra_unapplied, 1); /* and no whole GPU beside the instance */
    /* A rebuilt cluster charges everything again, once: one of the two holds the GPU. */
    ext_dra_slices_reset(&w->st, w->slice, 1); /* a relist: the inventory rebuilt */
    assert_int_equal(w->st.dra_unapplied, 1);
    assert_int_equal(gpu0(w)->free_milli, 0);
    assert_true(node1(w)->mig_users[0] <= 1);
    ext_dra_claims_reset(&w->st, NULL, 0);
    assert_int_equal(node1(w)->mig_users[0], 0);
    assert_int_equal(gpu0(w)->free_milli, KGPU_MILLI);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_instances_hold_the_gpu_and_give_it_back),
        cmocka_unit_test(test_one_kind_of_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
