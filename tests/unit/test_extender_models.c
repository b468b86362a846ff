/*
 * Unit tests of the extender's GPU model table across inventory rebuilds
 * (src/extender/inventory.c ext_state_set_nodes): models that no node has any
 * more are reclaimed, so the 64 ids hold what the inventory has; the models
 * that remain keep their ids; and what was learned about the models that
 * left (the shapes' model masks fgd and kgpu learn from) is not laid on the
 * new models that take their ids.
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

#define A100 "A100-SXM4-80GB"
#define T4   "T4"

static void state_init(ext_config *cfg, ext_metrics *m, ext_state *st)
{
    memset(m, 0, sizeof(*m));
    ext_config_defaults(cfg);
    cfg->log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    if (ext_state_init(st, cfg, m, &err) != 0)
        fail_msg("state: %s", err.msg);
}

/* A node spec of `n` GPUs; GPU i's model is models[i % nmodels]. Names live in `names`. */
typedef struct node_buf {
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    char models[KGPU_MAX_GPUS_PER_NODE][32];
    kgpu_node_spec spec;
} node_buf;

static const kgpu_node_spec *node(node_buf *b, const char *name, const char *model, int n,
                                  bool distinct, int first)
{
    for (int i = 0; i < n; i++) {
        if (distinct)
            snprintf(b->models[i], sizeof(b->models[i]), "%s-%d", model, first + i);
        else
            snprintf(b->models[i], sizeof(b->models[i]), "%s", model);
        b->g[i] = (kgpu_gpu_spec){
            .index = i, .model = b->models[i], .memory_mib = 16384, .numa = -1, .healthy = true};
    }
    b->spec = (kgpu_node_spec){
        .name = name, .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = b->g, .ngpus = n};
    return &b->spec;
}

static void set_nodes(ext_state *st, const kgpu_node_spec *const *specs, int n)
{
    kgpu_node_spec copy[8];
    for (int i = 0; i < n; i++)
        copy[i] = *specs[i];
    kgpu_error err;
    if (ext_state_set_nodes(st, copy, n, &err) != 0)
        fail_msg("set_nodes: %s", err.msg);
}

/* Filters a pod of one 4 GiB share, allowing `allow` and excluding `exclude` (NULL: none). */
static void filtered(ext_state *st, const char *uid, const char *allow, const char *exclude)
{
    json_t *ann = json_object();
    if (allow != NULL)
        json_object_set_new(ann, "kgpu.io/gpu-type", json_string(allow));
    if (exclude != NULL)
        json_object_set_new(ann, "kgpu.io/gpu-type-exclude", json_string(exclude));
    json_t *j =
        json_pack("{s:{s:s,s:s,s:s,s:o},s:{s:[{s:s,s:{s:{s:s}}}]}}", "metadata", "name", uid,
                  "namespace", "default", "uid", uid, "annotations", ann, "spec", "containers",
                  "name", "main", "resources", "limits", "kgpu.io/gpu-mem", "4");
    kgpu_pod *pod = malloc(sizeof(*pod));
    kgpu_error err;
    assert_non_null(pod);
    if (kgpu_pod_from_json(j, 1024, pod, &err) != 0 || ext_state_compile(st, pod, &err) != 0)
        fail_msg("pod %s: %s", uid, err.msg);
    ext_asks asks = {0};
    ext_state_remember(st, pod, &asks);
    json_decref(j);
    free(pod);
}

/* The mask and count of the learned shape whose mask is not `~0`-open or equals `want`. */
static const ext_shape_info *shape_with(const ext_state *st, bool open, uint64_t models)
{
    for (int i = 0; i < st->nshapes; i++)
        if (st->shape_info[i].open == open && st->shape_info[i].s.models == models &&
            st->shape_info[i].count > 0)
            return &st->shape_info[i];
    return NULL;
}

static void test_models_gone_are_forgotten(void **state)
{
    (void)state;
    ext_config cfg;
    ext_metrics m;
    ext_state st;
    state_init(&cfg, &m, &st);
    node_buf t4, a100, h100;
    const kgpu_node_spec *both[] = {node(&t4, "t4", T4, 2, false, 0),
                                    node(&a100, "a100", A100, 2, false, 0)};
    set_nodes(&st, both, 2);
    int t4_id = kgpu_cluster_model_id(st.cluster, T4, false);
    int a100_id = kgpu_cluster_model_id(st.cluster, A100, false);
    uint64_t a100_bit = 1ULL << a100_id, t4_bit = 1ULL << t4_id;
    /* Three shapes: A100 only, anything but A100, anything. */
    filtered(&st, "only-a100", "A100*", NULL);
    filtered(&st, "not-a100", NULL, "A100*");
    filtered(&st, "any", NULL, NULL);
    assert_non_null(shape_with(&st, false, a100_bit));
    assert_non_null(shape_with(&st, true, ~a100_bit));
    assert_non_null(shape_with(&st, true, ~0ULL));

    /* The A100 node leaves: its id is reclaimed, T4 keeps its own. */
    const kgpu_node_spec *t4_only[] = {both[0]};
    set_nodes(&st, t4_only, 1);
    assert_int_equal(kgpu_cluster_model_id(st.cluster, T4, false), t4_id);
    assert_int_equal(kgpu_cluster_model_id(st.cluster, A100, false), -1);
    assert_int_equal(kgpu_cluster_models_present(st.cluster), t4_bit);
    /* The shapes forget it: "A100 only" allows no model now, "not A100" is "anything"... */
    assert_null(shape_with(&st, false, a100_bit));
    assert_non_null(shape_with(&st, false, 0));
    const ext_shape_info *any = shape_with(&st, true, ~0ULL);
    assert_non_null(any);
    /* ...merged with the other "anything": one shape, both observations. */
    assert_int_equal(any->count, 2);
    assert_int_equal(st.shapes.len, 2);
    assert_null(shape_with(&st, true, ~a100_bit));

    /* A new model takes the reclaimed id; the A100-only shape does not allow it. */
    kgpu_error err;
    assert_int_equal(ext_state_upsert_node(&st, node(&h100, "h100", "H100", 2, false, 0), &err), 0);
    assert_int_equal(kgpu_cluster_model_id(st.cluster, "H100", false), a100_id);
    assert_non_null(shape_with(&st, false, 0));
    /* The same pod filtered again compiles to the shape merged before. */
    filtered(&st, "any-2", NULL, NULL);
    assert_int_equal(shape_with(&st, true, ~0ULL)->count, 3);
    ext_state_destroy(&st);
}

static void test_full_table_is_repaired(void **state)
{
    (void)state;
    ext_config cfg;
    ext_metrics m;
    ext_state st;
    state_init(&cfg, &m, &st);
    node_buf j0, j1, real, h100, more;
    /* 64 junk models (a broken device plugin): the table is full. */
    const kgpu_node_spec *junk[] = {node(&j0, "junk-0", "junk", 32, true, 0),
                                    node(&j1, "junk-1", "junk", 31, true, 32),
                                    node(&real, "real", T4, 1, false, 0)};
    set_nodes(&st, junk, 3);
    assert_int_equal(kgpu_cluster_model_count(st.cluster), KGPU_MAX_MODELS);
    kgpu_error err;
    assert_int_equal(ext_state_upsert_node(&st, node(&h100, "h100", "H100", 2, false, 0), &err),
                     KGPU_ERANGE);
    /* A relist without the junk: the table holds T4 alone, and H100 joins. */
    const kgpu_node_spec *fixed[] = {junk[2]};
    set_nodes(&st, fixed, 1);
    assert_int_equal(kgpu_cluster_node_count(st.cluster), 1);
    assert_int_equal(ext_state_upsert_node(&st, node(&h100, "h100", "H100", 2, false, 0), &err), 0);
    assert_int_equal(kgpu_cluster_node_count(st.cluster), 2);
    /* A relist where one node would overflow the table leaves that node out, not the rest. */
    const kgpu_node_spec *mixed[] = {node(&j0, "junk-0", "junk", 32, true, 0),
                                     node(&more, "junk-2", "more", 32, true, 0), junk[2]};
    set_nodes(&st, mixed, 3);
    assert_int_equal(kgpu_cluster_node_count(st.cluster), 2);
    assert_true(kgpu_cluster_find_node(st.cluster, "junk-2") < 0);
    assert_true(kgpu_cluster_find_node(st.cluster, "real") >= 0);
    ext_state_destroy(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_gone_are_forgotten),
        cmocka_unit_test(test_full_table_is_repaired),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
