/*
 * Unit tests of the cluster model (src/core/model.c): building clusters, the model
 * table and name index, request compilation, the fit check and its operator-facing
 * reasons, apply/release, and a seeded property test that random placements and
 * releases keep every resource accounted for and undo exactly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"
#include "kgpu/model.h"
#include "kgpu/rng.h"

#define A100 "A100-SXM4-80GB"
#define V100 "V100-SXM2-32GB"
#define T4   "T4"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Adds a node with `ngpus` healthy GPUs of one model; fails the test on error. */
static int add_node(kgpu_cluster *c, const char *name, int64_t cpu, int64_t mem, int ngpus,
                    const char *model, int64_t gmem)
{
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = model, .memory_mib = gmem, .numa = -1, .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = cpu, .memory_mib = mem, .gpus = g, .ngpus = ngpus};
    kgpu_error e;
    kgpu_error_clear(&e);
    int rc = kgpu_cluster_add_node(c, &s, &e);
    if (rc < 0)
        fail_msg("add_node %s: %s", name, e.msg);
    return rc;
}

/* Adds a node whose GPU i has model models[i] and gmem[i] MiB. */
static int add_node_mixed(kgpu_cluster *c, const char *name, int64_t cpu, int64_t mem, int ngpus,
                          const char *const *models, const int64_t *gmem)
{
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = models[i], .memory_mib = gmem[i], .numa = -1, .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = cpu, .memory_mib = mem, .gpus = g, .ngpus = ngpus};
    kgpu_error e;
    kgpu_error_clear(&e);
    int rc = kgpu_cluster_add_node(c, &s, &e);
    if (rc < 0)
        fail_msg("add_node %s: %s", name, e.msg);
    return rc;
}

static void compile(const kgpu_cluster *c, kgpu_request *r)
{
    kgpu_error e;
    kgpu_error_clear(&e);
    if (kgpu_request_compile(c, r, &e) != 0)
        fail_msg("compile: %s", e.msg);
}

static kgpu_request cpu_req(const kgpu_cluster *c, int64_t cpu, int64_t mem)
{
    kgpu_request r = {.cpu_milli = cpu, .memory_mib = mem, .shape = -1};
    compile(c, &r);
    return r;
}

static kgpu_request share_req(const kgpu_cluster *c, int64_t cpu, int count, int milli,
                              int64_t gmem)
{
    kgpu_request r = {.cpu_milli = cpu,
                      .gpu_count = count,
                      .gpu_milli = milli,
                      .gpu_memory_mib = gmem,
                      .shape = -1};
    compile(c, &r);
    return r;
}

static kgpu_request whole_req(const kgpu_cluster *c, int64_t cpu, int count)
{
    kgpu_request r = {.cpu_milli = cpu,
                      .gpu_count = count,
                      .gpu_milli = KGPU_MILLI,
                      .exclusive = true,
                      .shape = -1};
    compile(c, &r);
    return r;
}

/* Applies and fails the test unless it succeeds. */
static kgpu_assignment apply_ok(kgpu_cluster *c, const kgpu_request *r, int node, const int *gpus)
{
    kgpu_assignment a;
    kgpu_error e;
    kgpu_error_clear(&e);
    if (kgpu_cluster_apply(c, r, node, gpus, &a, &e) != 0)
        fail_msg("apply on node %d: %s", node, e.msg);
    return a;
}

static void release_ok(kgpu_cluster *c, const kgpu_assignment *a)
{
    kgpu_error e;
    kgpu_error_clear(&e);
    if (kgpu_cluster_release(c, a, &e) != 0)
        fail_msg("release on node %d: %s", a->node, e.msg);
}

/* Asserts kgpu_fit refuses with exactly `want` (and agrees with kgpu__fit). */
static void assert_reason(const kgpu_cluster *c, int node, const kgpu_request *r, const char *want)
{
    char why[256];
    memset(why, 0, sizeof(why));
    bool fit = kgpu_fit(c, node, r, why, sizeof(why));
    if (fit || strcmp(why, want) != 0)
        fail_msg("node %d: fit=%d reason \"%s\", want \"%s\"", node, fit, why, want);
    if (node >= 0 && node < kgpu_cluster_node_count(c))
        assert_false(kgpu__fit(kgpu_cluster_node(c, node), r));
}

/*
 * Asserts two clusters hold the same nodes, GPUs and state field by field;
 * node versions are compared only when `versions`.
 */
static void assert_same_state(const kgpu_cluster *a, const kgpu_cluster *b, bool versions)
{
    assert_int_equal(kgpu_cluster_node_count(a), kgpu_cluster_node_count(b));
    assert_int_equal(kgpu_cluster_gpu_count(a), kgpu_cluster_gpu_count(b));
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(a), kgpu_cluster_gpu_milli_allocated(b));
    assert_int_equal(kgpu_cluster_model_count(a), kgpu_cluster_model_count(b));
    for (int m = 0; m < kgpu_cluster_model_count(a); m++)
        assert_string_equal(kgpu_cluster_model_name(a, m), kgpu_cluster_model_name(b, m));
    for (int i = 0; i < kgpu_cluster_node_count(a); i++) {
        const kgpu_node *x = kgpu_cluster_node(a, i), *y = kgpu_cluster_node(b, i);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->cpu_milli, y->cpu_milli);
        assert_int_equal(x->memory_mib, y->memory_mib);
        assert_int_equal(x->cpu_free, y->cpu_free);
        assert_int_equal(x->memory_free, y->memory_free);
        assert_int_equal(x->ngpus, y->ngpus);
        assert_int_equal(x->model_mask, y->model_mask);
        assert_int_equal(x->placements, y->placements);
        assert_memory_equal(x->class_count, y->class_count, sizeof(x->class_count));
        if (versions)
            assert_int_equal(x->version, y->version);
        assert_int_equal(x->nlabels, y->nlabels);
        for (int l = 0; l < x->nlabels; l++) {
            assert_string_equal(x->labels[l].key, y->labels[l].key);
            assert_string_equal(x->labels[l].value, y->labels[l].value);
        }
        for (int g = 0; g < x->ngpus; g++) {
            const kgpu_gpu *p = &x->gpus[g], *q = &y->gpus[g];
            assert_int_equal(p->index, q->index);
            assert_string_equal(p->uuid, q->uuid);
            assert_int_equal(p->model, q->model);
            assert_int_equal(p->numa, q->numa);
            assert_int_equal(p->healthy, q->healthy);
            assert_int_equal(p->memory_mib, q->memory_mib);
            assert_int_equal(p->free_milli, q->free_milli);
            assert_int_equal(p->free_memory_mib, q->free_memory_mib);
            assert_int_equal(p->placements, q->placements);
        }
    }
}

/* ---- building clusters -------------------------------------------------------------------- */

static void test_add_node_errors(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE + 1];
    for (int i = 0; i <= KGPU_MAX_GPUS_PER_NODE; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = A100, .memory_mib = 81920, .numa = -1, .healthy = true};
    kgpu_error e;
    kgpu_node_spec s = {.name = "n0", .cpu_milli = 8000, .memory_mib = 1024, .gpus = g, .ngpus = 2};
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), 0);

    s.name = "";
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    assert_int_equal(e.code, KGPU_EINVAL);
    assert_string_equal(e.msg, "node without a name");
    s.name = NULL;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);

    char longname[KGPU_NAME_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    s.name = longname;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    longname[KGPU_NAME_MAX] = '\0'; /* exactly the limit is fine */
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), 1);

    s.name = "n0";
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EEXIST);
    assert_string_equal(e.msg, "node n0 already exists");

    s.name = "dup-gpu";
    g[1].index = 0;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EEXIST);
    assert_string_equal(e.msg, "node dup-gpu: GPU index 0 listed twice");
    g[1].index = 1;

    s.name = "too-many";
    s.ngpus = KGPU_MAX_GPUS_PER_NODE + 1;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_ERANGE);
    assert_int_equal(e.code, KGPU_ERANGE);
    assert_non_null(strstr(e.msg, "33 GPUs"));
    s.ngpus = -1;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_ERANGE);
    s.name = "max-gpus";
    s.ngpus = KGPU_MAX_GPUS_PER_NODE; /* exactly the limit is fine */
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), 2);
    s.ngpus = 2;

    s.name = "neg-cpu";
    s.cpu_milli = -1;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    assert_string_equal(e.msg, "node neg-cpu: negative CPU or memory");
    s.cpu_milli = 8000;
    s.memory_mib = -5;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    s.memory_mib = 1024;

    s.name = "no-model";
    g[1].model = "";
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    g[1].model = NULL;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    g[1].model = A100;
    g[1].memory_mib = -1;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_EINVAL);
    g[1].memory_mib = 81920;

    /* None of the refused nodes left a trace. */
    assert_int_equal(kgpu_cluster_node_count(c), 3);
    assert_int_equal(kgpu_cluster_gpu_count(c), 2 + 2 + KGPU_MAX_GPUS_PER_NODE);
    assert_int_equal(kgpu_cluster_find_node(c, "neg-cpu"), -1);
    assert_int_equal(kgpu_cluster_find_node(c, "dup-gpu"), -1);
    assert_int_equal(kgpu_cluster_find_node(c, "too-many"), -1);
    kgpu_cluster_free(c);
}

static void test_add_node_fields(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    char key[16] = "zone", value[16] = "eu-1";
    kgpu_label labels[] = {{key, value}, {"rack", "r7"}};
    kgpu_gpu_spec g[] = {
        {.index = 4,
         .uuid = "GPU-aaaa",
         .model = V100,
         .memory_mib = 32768,
         .numa = 1,
         .healthy = true},
        {.index = 7, .uuid = NULL, .model = T4, .memory_mib = 15360, .numa = -1, .healthy = false},
        {.index = 2, .uuid = "", .model = V100, .memory_mib = 16384, .numa = 0, .healthy = true},
    };
    kgpu_node_spec s = {.name = "gpu-7",
                        .cpu_milli = 64000,
                        .memory_mib = 262144,
                        .labels = labels,
                        .nlabels = 2,
                        .gpus = g,
                        .ngpus = 3};
    kgpu_error e;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), 0);
    /* The spec is borrowed: changing it afterwards must not reach the node. */
    strcpy(key, "XXXX");
    strcpy(value, "YYYY");

    assert_int_equal(kgpu_cluster_model_count(c), 2);
    assert_int_equal(kgpu_cluster_model_id(c, V100, false), 0);
    assert_int_equal(kgpu_cluster_model_id(c, T4, false), 1);
    assert_int_equal(kgpu_cluster_model_id(c, A100, false), -1);
    assert_int_equal(kgpu_cluster_model_count(c), 2);
    assert_string_equal(kgpu_cluster_model_name(c, 1), T4);
    assert_string_equal(kgpu_cluster_model_name(c, 2), "?");
    assert_string_equal(kgpu_cluster_model_name(c, -1), "?");

    const kgpu_node *n = kgpu_cluster_node(c, 0);
    assert_string_equal(n->name, "gpu-7");
    assert_int_equal(n->cpu_milli, 64000);
    assert_int_equal(n->cpu_free, 64000);
    assert_int_equal(n->memory_mib, 262144);
    assert_int_equal(n->memory_free, 262144);
    assert_int_equal(n->ngpus, 3);
    assert_int_equal(n->model_mask, 0x3);
    assert_int_equal(n->placements, 0);
    assert_int_equal(n->nlabels, 2);
    assert_string_equal(n->labels[0].key, "zone");
    assert_string_equal(n->labels[0].value, "eu-1");
    assert_string_equal(n->labels[1].key, "rack");
    assert_string_equal(n->labels[1].value, "r7");
    assert_ptr_not_equal(n->labels[0].key, key);

    assert_int_equal(n->gpus[0].index, 4);
    assert_string_equal(n->gpus[0].uuid, "GPU-aaaa");
    assert_int_equal(n->gpus[0].model, 0);
    assert_int_equal(n->gpus[0].numa, 1);
    assert_true(n->gpus[0].healthy);
    assert_int_equal(n->gpus[0].memory_mib, 32768);
    assert_int_equal(n->gpus[0].free_memory_mib, 32768);
    assert_int_equal(n->gpus[0].free_milli, KGPU_MILLI);
    assert_int_equal(n->gpus[1].index, 7);
    assert_string_equal(n->gpus[1].uuid, "");
    assert_int_equal(n->gpus[1].model, 1);
    assert_false(n->gpus[1].healthy);
    assert_int_equal(n->gpus[2].model, 0);
    assert_int_equal(n->gpus[2].memory_mib, 16384);

    /* A second node reuses known ids and extends the table. */
    int i = add_node_mixed(c, "gpu-8", 1000, 1000, 2, (const char *[]){A100, T4},
                           (const int64_t[]){81920, 15360});
    assert_int_equal(i, 1);
    n = kgpu_cluster_node(c, 1);
    assert_int_equal(n->gpus[0].model, 2);
    assert_int_equal(n->gpus[1].model, 1);
    assert_int_equal(n->model_mask, (1u << 2) | (1u << 1));
    assert_int_equal(kgpu_cluster_gpu_count(c), 5);
    assert_null(kgpu_cluster_node(c, 2));
    assert_null(kgpu_cluster_node(c, -1));

    /* model_id with add: idempotent for a known name, new id for a new one. */
    assert_int_equal(kgpu_cluster_model_id(c, T4, true), 1);
    assert_int_equal(kgpu_cluster_model_id(c, "H100", true), 3);
    assert_int_equal(kgpu_cluster_model_count(c), 4);
    kgpu_cluster_free(c);
}

static void test_model_table_full(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    char name[32];
    for (int i = 0; i < KGPU_MAX_MODELS; i++) {
        snprintf(name, sizeof(name), "M%d", i);
        assert_int_equal(kgpu_cluster_model_id(c, name, true), i);
    }
    assert_int_equal(kgpu_cluster_model_id(c, "one-too-many", true), -1);
    assert_int_equal(kgpu_cluster_model_count(c), KGPU_MAX_MODELS);
    /* A node bringing a 65th model is refused. */
    kgpu_gpu_spec g = {.index = 0, .model = "one-too-many", .memory_mib = 1, .healthy = true};
    kgpu_node_spec s = {.name = "n", .cpu_milli = 1, .memory_mib = 1, .gpus = &g, .ngpus = 1};
    kgpu_error e;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_ERANGE);
    assert_int_equal(kgpu_cluster_node_count(c), 0);
    /* The last model id (63) is usable as a mask bit. */
    g.model = "M63";
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), 0);
    assert_int_equal(kgpu_cluster_node(c, 0)->model_mask, 1ULL << 63);
    kgpu_request r = share_req(c, 0, 1, 100, 0);
    assert_true(kgpu_fit(c, 0, &r, NULL, 0));
    kgpu_cluster_free(c);
}

static void test_find_node_many(void **state)
{
    enum { N = 700 };
    kgpu_cluster *c = kgpu_cluster_new();
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "node-%03d.rack%d", i, i % 7);
        assert_int_equal(add_node(c, name, 1000, 1000, i % 3, T4, 15360), i);
        /* Every earlier node stays findable across the index's rebuilds. */
        if (i % 97 == 0)
            for (int j = 0; j <= i; j++) {
                snprintf(name, sizeof(name), "node-%03d.rack%d", j, j % 7);
                assert_int_equal(kgpu_cluster_find_node(c, name), j);
            }
    }
    assert_int_equal(kgpu_cluster_node_count(c), N);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "node-%03d.rack%d", i, i % 7);
        assert_int_equal(kgpu_cluster_find_node(c, name), i);
        assert_string_equal(kgpu_cluster_node(c, i)->name, name);
        snprintf(name, sizeof(name), "node-%03d.rack%d", i, (i + 1) % 7);
        assert_int_equal(kgpu_cluster_find_node(c, name), -1);
    }
    assert_int_equal(kgpu_cluster_find_node(c, ""), -1);
    assert_int_equal(kgpu_cluster_find_node(c, "node-000"), -1);

    kgpu_cluster *d = kgpu_cluster_clone(c);
    assert_non_null(d);
    for (int i = 0; i < N; i += 13) {
        snprintf(name, sizeof(name), "node-%03d.rack%d", i, i % 7);
        assert_int_equal(kgpu_cluster_find_node(d, name), i);
    }
    kgpu_cluster_free(c);
    kgpu_cluster_free(d);
}

static void test_clone_deep(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    kgpu_label l = {"pool", "train"};
    kgpu_gpu_spec g[2] = {
        {.index = 0, .uuid = "GPU-0", .model = A100, .memory_mib = 81920, .healthy = true},
        {.index = 1, .uuid = "GPU-1", .model = A100, .memory_mib = 81920, .healthy = true},
    };
    kgpu_node_spec s = {.name = "a",
                        .cpu_milli = 32000,
                        .memory_mib = 65536,
                        .labels = &l,
                        .nlabels = 1,
                        .gpus = g,
                        .ngpus = 2};
    assert_int_equal(kgpu_cluster_add_node(c, &s, NULL), 0);
    add_node(c, "b", 16000, 32768, 1, T4, 15360);
    kgpu_request share = share_req(c, 1000, 1, 400, 1024);
    kgpu_assignment a = apply_ok(c, &share, 0, (int[]){1});
    kgpu_cluster_set_gpu_health(c, 1, 0, false, NULL);

    kgpu_cluster *d = kgpu_cluster_clone(c);
    assert_non_null(d);
    assert_same_state(c, d, true);
    assert_int_equal(kgpu_cluster_node(d, 0)->version, 1);
    assert_int_equal(kgpu_cluster_node(d, 1)->version, 1);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(d), 400);
    assert_ptr_not_equal(kgpu_cluster_node(d, 0)->gpus, kgpu_cluster_node(c, 0)->gpus);
    assert_ptr_not_equal(kgpu_cluster_node(d, 0)->labels, kgpu_cluster_node(c, 0)->labels);
    assert_ptr_not_equal(kgpu_cluster_node(d, 0)->name, kgpu_cluster_node(c, 0)->name);
    assert_ptr_not_equal(kgpu_cluster_model_name(d, 0), kgpu_cluster_model_name(c, 0));

    /* Mutating the clone leaves the original alone. */
    kgpu_cluster *snap = kgpu_cluster_clone(c);
    kgpu_request whole = whole_req(d, 2000, 1);
    apply_ok(d, &whole, 0, (int[]){0});
    release_ok(d, &a);
    kgpu_cluster_set_gpu_health(d, 1, 0, true, NULL);
    add_node(d, "c", 1000, 1000, 1, "H100", 81920);
    assert_same_state(c, snap, true);
    assert_int_equal(kgpu_cluster_node_count(c), 2);
    assert_int_equal(kgpu_cluster_find_node(c, "c"), -1);
    assert_int_equal(kgpu_cluster_find_node(d, "c"), 2);
    assert_int_equal(kgpu_cluster_model_count(c), 2);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(d), 1000);
    assert_int_equal(kgpu_cluster_node(d, 0)->gpus[1].free_milli, KGPU_MILLI);
    assert_int_equal(kgpu_cluster_node(c, 0)->gpus[1].free_milli, 600);

    /* The clone outlives the original (no shared pointers: ASan would see them). */
    kgpu_cluster_free(c);
    kgpu_cluster_free(snap);
    assert_string_equal(kgpu_cluster_node(d, 0)->labels[0].value, "train");
    assert_string_equal(kgpu_cluster_node(d, 0)->gpus[1].uuid, "GPU-1");
    assert_int_equal(kgpu_cluster_find_node(d, "b"), 1);

    /* An empty cluster clones too, and the clone can grow. */
    kgpu_cluster *empty = kgpu_cluster_new();
    kgpu_cluster *e2 = kgpu_cluster_clone(empty);
    assert_non_null(e2);
    for (int i = 0; i < 40; i++) {
        char name[16];
        snprintf(name, sizeof(name), "e%d", i);
        assert_int_equal(add_node(e2, name, 1, 1, 0, NULL, 0), i);
    }
    assert_int_equal(kgpu_cluster_find_node(e2, "e39"), 39);
    assert_int_equal(kgpu_cluster_node_count(empty), 0);
    kgpu_cluster_free(empty);
    kgpu_cluster_free(e2);
    kgpu_cluster_free(d);
}

/* ---- requests ----------------------------------------------------------------------------- */

/* Models 0..4: A100-SXM4-80GB, A100-PCIE-40GB, V100-SXM2-32GB, T4, V100-PCIE-16GB. */
static kgpu_cluster *glob_cluster(void)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "a", 1000, 1000, 1, A100, 81920);
    add_node(c, "b", 1000, 1000, 1, "A100-PCIE-40GB", 40960);
    add_node(c, "c", 1000, 1000, 1, V100, 32768);
    add_node(c, "d", 1000, 1000, 1, T4, 15360);
    add_node(c, "e", 1000, 1000, 1, "V100-PCIE-16GB", 16384);
    return c;
}

static uint64_t compiled_mask(const kgpu_cluster *c, const char *const *allow, int nallow,
                              const char *const *exclude, int nexclude)
{
    kgpu_request r = {.gpu_count = 1,
                      .gpu_milli = 500,
                      .allow = allow,
                      .nallow = nallow,
                      .exclude = exclude,
                      .nexclude = nexclude,
                      .shape = -1};
    compile(c, &r);
    return r.models;
}

static void test_compile_globs(void **state)
{
    kgpu_cluster *c = glob_cluster();
    const char *a100[] = {"A100*"}, *v100[] = {"V100*"}, *both[] = {"A100*", "V100*"};
    const char *pcie[] = {"*PCIE*"}, *t4[] = {"T4"}, *none[] = {"H100*"};
    const char *with_null[] = {NULL, "T4"};

    assert_int_equal(compiled_mask(c, a100, 1, NULL, 0), 0x03);
    assert_int_equal(compiled_mask(c, v100, 1, NULL, 0), 0x14);
    assert_int_equal(compiled_mask(c, both, 2, NULL, 0), 0x17);
    assert_int_equal(compiled_mask(c, t4, 1, NULL, 0), 0x08);
    assert_int_equal(compiled_mask(c, none, 1, NULL, 0), 0);
    assert_int_equal(compiled_mask(c, with_null, 2, NULL, 0), 0x08);
    /* Exclusion applies after inclusion. */
    assert_int_equal(compiled_mask(c, both, 2, pcie, 1), 0x05);
    assert_int_equal(compiled_mask(c, a100, 1, a100, 1), 0);
    /* No allow list: every model, including ids not yet in the table, minus exclusions. */
    assert_int_equal(compiled_mask(c, NULL, 0, NULL, 0), ~0ULL);
    assert_int_equal(compiled_mask(c, NULL, 0, t4, 1), ~0ULL & ~0x08ULL);
    assert_int_equal(compiled_mask(c, NULL, 0, pcie, 1), ~0ULL & ~0x12ULL);

    kgpu_request any = share_req(c, 0, 1, 500, 0);
    kgpu_request a_only = {.gpu_count = 1, .gpu_milli = 500, .allow = a100, .nallow = 1};
    compile(c, &a_only);
    /* A model first seen after compiling is allowed by "any", not by a glob list. */
    int h = add_node(c, "h", 1000, 1000, 1, "H100", 81920);
    assert_true(kgpu_fit(c, h, &any, NULL, 0));
    assert_false(kgpu_fit(c, h, &a_only, NULL, 0));
    assert_true(kgpu_fit(c, 0, &a_only, NULL, 0));
    assert_true(kgpu_fit(c, 1, &a_only, NULL, 0));
    assert_false(kgpu_fit(c, 2, &a_only, NULL, 0));
    kgpu_cluster_free(c);
}

/*
 * A rebuilt cluster keeps the ids of the models that remain and leaves the
 * others as holes (kgpu_cluster_model_put): no request compiles to a hole
 * from an allow list, an open request allows it as a model to come, and the
 * next new model takes the lowest hole.
 */
static void test_model_holes(void **state)
{
    (void)state;
    kgpu_cluster *c = kgpu_cluster_new();
    assert_int_equal(kgpu_cluster_model_put(c, 2, V100), 0);
    assert_int_equal(kgpu_cluster_model_put(c, 0, T4), 0);
    assert_int_equal(kgpu_cluster_model_count(c), 3);
    assert_string_equal(kgpu_cluster_model_name(c, 1), "?");
    assert_int_equal(kgpu_cluster_model_id(c, "?", false), -1);
    assert_int_equal(kgpu_cluster_model_id(c, V100, false), 2);
    /* Refusals: an id taken by another name, a name with another id, out of range. */
    assert_int_equal(kgpu_cluster_model_put(c, 0, T4), 0);
    assert_int_equal(kgpu_cluster_model_put(c, 0, A100), KGPU_EEXIST);
    assert_int_equal(kgpu_cluster_model_put(c, 1, T4), KGPU_EEXIST);
    assert_int_equal(kgpu_cluster_model_put(c, KGPU_MAX_MODELS, A100), KGPU_EINVAL);
    assert_int_equal(kgpu_cluster_model_put(c, -1, A100), KGPU_EINVAL);
    assert_int_equal(kgpu_cluster_model_put(c, 1, ""), KGPU_EINVAL);
    /* Globs see the models only; exclusions keep the hole allowed for an open request. */
    const char *any[] = {"*"}, *t4[] = {"T4"};
    assert_int_equal(compiled_mask(c, any, 1, NULL, 0), 0x05);
    assert_int_equal(compiled_mask(c, NULL, 0, any, 1), ~0ULL & ~0x05ULL);
    assert_int_equal(compiled_mask(c, NULL, 0, t4, 1), ~0ULL & ~0x01ULL);
    /* Nodes name models by name: a V100 node gets id 2. */
    int v = add_node(c, "v", 1000, 1000, 1, V100, 32768);
    assert_int_equal(kgpu_cluster_node(c, v)->gpus[0].model, 2);
    assert_int_equal(kgpu_cluster_models_present(c), 0x04);
    /* A clone keeps the holes. */
    kgpu_cluster *d = kgpu_cluster_clone(c);
    assert_non_null(d);
    assert_string_equal(kgpu_cluster_model_name(d, 1), "?");
    assert_string_equal(kgpu_cluster_model_name(d, 2), V100);
    kgpu_cluster_free(d);
    /* The next new model takes the hole, the one after it the next id. */
    int a = add_node(c, "a", 1000, 1000, 1, A100, 81920);
    assert_int_equal(kgpu_cluster_node(c, a)->gpus[0].model, 1);
    assert_int_equal(kgpu_cluster_model_id(c, "H100", true), 3);
    assert_int_equal(kgpu_cluster_model_count(c), 4);
    assert_int_equal(kgpu_cluster_models_present(c), 0x06);
    kgpu_cluster_free(c);
}

/* A node whose models would overflow the table adds none of them. */
static void test_model_table_full_adds_nothing(void **state)
{
    (void)state;
    kgpu_cluster *c = kgpu_cluster_new();
    char name[32];
    for (int i = 0; i < KGPU_MAX_MODELS - 1; i++) {
        snprintf(name, sizeof(name), "M%d", i);
        assert_int_equal(kgpu_cluster_model_id(c, name, true), i);
    }
    const char *two[] = {"new-a", "new-b"};
    const int64_t gmem[] = {1024, 1024};
    kgpu_gpu_spec g[2];
    for (int i = 0; i < 2; i++)
        g[i] = (kgpu_gpu_spec){.index = i, .model = two[i], .memory_mib = gmem[i], .healthy = true};
    kgpu_node_spec s = {.name = "n", .cpu_milli = 1, .memory_mib = 1, .gpus = g, .ngpus = 2};
    kgpu_error e;
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), KGPU_ERANGE);
    assert_int_equal(kgpu_cluster_model_count(c), KGPU_MAX_MODELS - 1);
    assert_int_equal(kgpu_cluster_model_id(c, "new-a", false), -1);
    /* Two GPUs of one new model need one id: that fits. */
    g[1].model = "new-a";
    assert_int_equal(kgpu_cluster_add_node(c, &s, &e), 0);
    assert_int_equal(kgpu_cluster_model_count(c), KGPU_MAX_MODELS);
    kgpu_cluster_free(c);
}

static void test_validate_errors(void **state)
{
    kgpu_cluster *c = glob_cluster();
    kgpu_error e;
    struct {
        kgpu_request r;
        int code;
        const char *msg;
    } cases[] = {
        {{.gpu_count = 1, .gpu_milli = 500, .exclusive = true},
         KGPU_EINVAL,
         "a whole-GPU request takes 1000 milli and no memory share"},
        {{.gpu_count = 1, .gpu_milli = 1000, .gpu_memory_mib = 10, .exclusive = true},
         KGPU_EINVAL,
         "a whole-GPU request takes 1000 milli and no memory share"},
        {{.gpu_count = 2}, KGPU_EINVAL, "a GPU share asks for neither compute nor memory"},
        {{.gpu_count = 33, .gpu_milli = 1000, .exclusive = true},
         KGPU_ERANGE,
         "GPU count 33 out of range 0..32"},
        {{.gpu_count = -1}, KGPU_ERANGE, "GPU count -1 out of range 0..32"},
        {{.gpu_count = 1, .gpu_milli = 1001},
         KGPU_ERANGE,
         "GPU share 1001 milli out of range 0..1000"},
        {{.gpu_count = 1, .gpu_milli = -5}, KGPU_ERANGE, "GPU share -5 milli out of range 0..1000"},
        {{.gpu_count = 1, .gpu_memory_mib = -1, .gpu_milli = 10},
         KGPU_EINVAL,
         "negative GPU memory request"},
        {{.cpu_milli = -1}, KGPU_EINVAL, "negative CPU or memory request"},
        {{.memory_mib = -1}, KGPU_EINVAL, "negative CPU or memory request"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kgpu_error_clear(&e);
        assert_int_equal(kgpu_request_validate(&cases[i].r, &e), cases[i].code);
        assert_int_equal(e.code, cases[i].code);
        if (strcmp(e.msg, cases[i].msg) != 0)
            fail_msg("case %zu: \"%s\", want \"%s\"", i, e.msg, cases[i].msg);
        /* compile validates first and leaves models alone on error. */
        cases[i].r.models = 0x5a;
        assert_int_equal(kgpu_request_compile(c, &cases[i].r, &e), cases[i].code);
        assert_int_equal(cases[i].r.models, 0x5a);
    }
    /* The edges that are valid. */
    kgpu_request ok[] = {
        {.cpu_milli = 0},
        {.gpu_count = 0, .gpu_milli = 5000, .exclusive = true}, /* no GPU part: ignored */
        {.gpu_count = 32, .gpu_milli = 1000, .exclusive = true},
        {.gpu_count = 1, .gpu_milli = 1000},
        {.gpu_count = 1, .gpu_memory_mib = 1},
        {.gpu_count = 4, .gpu_milli = 1},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (kgpu_request_validate(&ok[i], &e) != 0)
            fail_msg("valid case %zu refused: %s", i, e.msg);
    kgpu_cluster_free(c);
}

static void test_request_class(void **state)
{
    kgpu_request cpu = {.cpu_milli = 10}, share = {.gpu_count = 3, .gpu_milli = 200};
    kgpu_request w1 = {.gpu_count = 1, .gpu_milli = 1000, .exclusive = true};
    kgpu_request w8 = {.gpu_count = 8, .gpu_milli = 1000, .exclusive = true};
    kgpu_request w32 = {.gpu_count = 32, .gpu_milli = 1000, .exclusive = true};
    assert_int_equal(kgpu_request_class(&cpu), KGPU_CLASS_CPU);
    assert_int_equal(kgpu_request_class(&share), KGPU_CLASS_SHARE);
    assert_int_equal(kgpu_request_class(&w1), 2);
    assert_int_equal(kgpu_request_class(&w8), 9);
    assert_int_equal(kgpu_request_class(&w32), KGPU_CLASS_MAX - 1);
}

/* ---- fit and its reasons ------------------------------------------------------------------ */

static void test_fit_reasons(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n_half = add_node(c, "half", 64000, 262144, 2, A100, 81920);
    int n_cpu = add_node(c, "cpu", 64000, 262144, 2, A100, 81920);
    int n_t4 = add_node(c, "t4", 64000, 262144, 2, T4, 15360);
    int n_mix = add_node_mixed(c, "mix", 64000, 262144, 2, (const char *[]){A100, T4},
                               (const int64_t[]){81920, 15360});
    int n_v = add_node(c, "v100", 64000, 262144, 2, V100, 32768);
    int n_one = add_node(c, "one", 64000, 262144, 1, V100, 32768);

    /* "half": GPU 0 has 500 free, GPU 1 has 400 free. */
    kgpu_request s500 = share_req(c, 0, 1, 500, 0), s600 = share_req(c, 0, 1, 600, 0);
    apply_ok(c, &s500, n_half, (int[]){0});
    apply_ok(c, &s600, n_half, (int[]){1});
    kgpu_request s810 = share_req(c, 1000, 1, 810, 0);
    assert_reason(c, n_half, &s810, "no single GPU has 810 milli free; best has 500");
    kgpu_request s2x600 = share_req(c, 0, 2, 600, 0);
    assert_reason(c, n_half, &s2x600, "needs 2 GPUs with 600 milli free each, 0 have it");
    kgpu_request s2x450 = share_req(c, 0, 2, 450, 0);
    assert_reason(c, n_half, &s2x450, "needs 2 GPUs with 450 milli free each, 1 have it");
    kgpu_request s2x400 = share_req(c, 0, 2, 400, 0);
    assert_true(kgpu_fit(c, n_half, &s2x400, NULL, 0));

    /* Whole GPUs: one GPU of "v100" holds a small share. */
    kgpu_request s100 = share_req(c, 0, 1, 100, 0);
    apply_ok(c, &s100, n_v, (int[]){1});
    kgpu_request w2 = whole_req(c, 0, 2), w1 = whole_req(c, 0, 1);
    assert_reason(c, n_v, &w2, "needs 2 whole GPUs, 1 is fully free");
    assert_true(kgpu_fit(c, n_v, &w1, NULL, 0));
    assert_reason(c, n_half, &w1, "needs 1 whole GPU, 0 are fully free");
    assert_reason(c, n_half, &w2, "needs 2 whole GPUs, 0 are fully free");

    /* CPU and memory. */
    kgpu_request cpu60 = cpu_req(c, 60000, 0);
    apply_ok(c, &cpu60, n_cpu, NULL);
    kgpu_request cpu8 = cpu_req(c, 8000, 0);
    assert_reason(c, n_cpu, &cpu8, "insufficient CPU: requests 8000m, 4000m free of 64000m");
    kgpu_request cpu4 = cpu_req(c, 4000, 0);
    assert_true(kgpu_fit(c, n_cpu, &cpu4, NULL, 0));
    kgpu_request gpu_cpu8 = whole_req(c, 8000, 1);
    assert_reason(c, n_cpu, &gpu_cpu8, "insufficient CPU: requests 8000m, 4000m free of 64000m");
    kgpu_request mem = cpu_req(c, 0, 300000);
    assert_reason(c, n_cpu, &mem,
                  "insufficient memory: requests 300000 MiB, 262144 MiB free of 262144 MiB");

    /* Models: the node's models are listed, then the allowed ones. */
    const char *a100[] = {"A100*"};
    kgpu_request only_a100 = {
        .cpu_milli = 1000, .gpu_count = 1, .gpu_milli = 300, .allow = a100, .nallow = 1};
    compile(c, &only_a100);
    char why[256];
    assert_false(kgpu_fit(c, n_t4, &only_a100, why, sizeof(why)));
    assert_true(strncmp(why, "GPU model T4 not allowed", strlen("GPU model T4 not allowed")) == 0);
    assert_string_equal(why, "GPU model T4 not allowed (the pod allows: A100*)");
    /* The model is reported before CPU. */
    only_a100.cpu_milli = 1000000;
    assert_false(kgpu_fit(c, n_t4, &only_a100, why, sizeof(why)));
    assert_true(strncmp(why, "GPU model T4 not allowed", strlen("GPU model T4 not allowed")) == 0);
    only_a100.cpu_milli = 1000;
    /* On a mixed node the count of allowed GPUs is what falls short. */
    only_a100.gpu_count = 2;
    assert_reason(c, n_mix, &only_a100, "needs 2 GPUs of an allowed model, node has 1");
    only_a100.gpu_count = 1;
    assert_true(kgpu_fit(c, n_mix, &only_a100, NULL, 0));

    /* More GPUs than the node has. */
    kgpu_request w4 = whole_req(c, 0, 4);
    assert_reason(c, n_v, &w4, "needs 4 GPUs, node has 2");
    kgpu_request s3 = share_req(c, 0, 3, 100, 0);
    assert_reason(c, n_one, &s3, "needs 3 GPUs, node has 1");

    /* GPU memory larger than any GPU here. */
    kgpu_request m40 = share_req(c, 0, 1, 100, 40000);
    assert_reason(c, n_v, &m40, "asks 40000 MiB of GPU memory, largest GPU here has 32768 MiB");
    kgpu_request m40x2 = share_req(c, 0, 2, 100, 40000);
    assert_reason(c, n_t4, &m40x2,
                  "asks 40000 MiB of GPU memory each, largest GPU here has 15360 MiB");
    assert_true(kgpu_fit(c, n_half, &m40, NULL, 0));

    /* GPU memory free: one GPU with 16000 MiB left. */
    kgpu_request mshare = share_req(c, 0, 1, 100, 16768);
    apply_ok(c, &mshare, n_one, (int[]){0});
    kgpu_request m20 = share_req(c, 0, 1, 100, 20000);
    assert_reason(c, n_one, &m20, "no single GPU has 20000 MiB memory free; best has 16000");
    kgpu_request m20x2 = share_req(c, 0, 2, 100, 20000);
    assert_true(kgpu_fit(c, n_v, &m20x2, NULL, 0));
    kgpu_request mem_only = share_req(c, 0, 1, 0, 30000);
    apply_ok(c, &mem_only, n_v, (int[]){0}); /* GPU 0: 1000 milli, 2768 MiB; GPU 1: 900, 32768 */
    assert_reason(c, n_v, &m20x2, "needs 2 GPUs with 20000 MiB memory free each, 1 have it");

    /* Compute on one GPU, memory on another, both on none. */
    kgpu_request both = share_req(c, 0, 1, 950, 20000);
    assert_false(kgpu_fit(c, n_v, &both, why, sizeof(why)));
    assert_non_null(strstr(why, "950 milli and 20000 MiB free each; none has both"));

    /* Unhealthy GPUs. */
    kgpu_cluster_set_gpu_health(c, n_t4, 1, false, NULL);
    kgpu_request s2x100 = share_req(c, 0, 2, 100, 0);
    assert_reason(c, n_t4, &s2x100, "needs 2 GPUs, only 1 of 2 are healthy");

    /* Out of range node; a fitting request leaves `why` alone; a short buffer is terminated. */
    assert_reason(c, 99, &cpu4, "no node with index 99");
    assert_reason(c, -1, &cpu4, "no node with index -1");
    strcpy(why, "untouched");
    assert_true(kgpu_fit(c, n_mix, &cpu4, why, sizeof(why)));
    assert_string_equal(why, "untouched");
    char small[12];
    assert_false(kgpu_fit(c, n_cpu, &cpu8, small, sizeof(small)));
    assert_string_equal(small, "insufficien");
    assert_false(kgpu_fit(c, n_cpu, &cpu8, NULL, 0));
    kgpu_cluster_free(c);
}

/* ---- apply / release ---------------------------------------------------------------------- */

static void test_apply_release_exact(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "other", 8000, 8192, 2, V100, 32768);
    int n = add_node(c, "n", 64000, 131072, 4, V100, 32768);
    kgpu_cluster *pristine = kgpu_cluster_clone(c);
    const kgpu_node *nd = kgpu_cluster_node(c, n);

    /* A share spread over GPUs 2 and 0 (order kept). */
    kgpu_request sh = share_req(c, 4000, 2, 300, 4096);
    sh.memory_mib = 8192;
    kgpu_assignment a;
    memset(&a, 0xab, sizeof(a));
    assert_int_equal(kgpu_cluster_apply(c, &sh, n, (int[]){2, 0}, &a, NULL), 0);
    assert_int_equal(a.node, n);
    assert_int_equal(a.ngpus, 2);
    assert_int_equal(a.gpus[0], 2);
    assert_int_equal(a.gpus[1], 0);
    assert_int_equal(a.gpu_milli, 300);
    assert_int_equal(a.gpu_memory_mib, 4096);
    assert_false(a.exclusive);
    assert_int_equal(a.cpu_milli, 4000);
    assert_int_equal(a.memory_mib, 8192);
    assert_int_equal(a.klass, KGPU_CLASS_SHARE);
    assert_int_equal(nd->cpu_free, 60000);
    assert_int_equal(nd->memory_free, 131072 - 8192);
    for (int g = 0; g < 4; g++) {
        bool used = g == 0 || g == 2;
        assert_int_equal(nd->gpus[g].free_milli, used ? 700 : 1000);
        assert_int_equal(nd->gpus[g].free_memory_mib, used ? 32768 - 4096 : 32768);
        assert_int_equal(nd->gpus[g].placements, used ? 1 : 0);
    }
    assert_int_equal(nd->placements, 1);
    assert_int_equal(nd->class_count[KGPU_CLASS_SHARE], 1);
    assert_int_equal(nd->class_count[KGPU_CLASS_CPU], 0);
    assert_int_equal(nd->version, 1);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(c), 600);
    assert_int_equal(kgpu_cluster_node(c, 0)->version, 0);

    /* Two whole GPUs: all their memory goes, class 3. */
    kgpu_request w = whole_req(c, 1000, 2);
    kgpu_assignment b = apply_ok(c, &w, n, (int[]){3, 1});
    assert_true(b.exclusive);
    assert_int_equal(b.gpu_milli, 1000);
    assert_int_equal(b.klass, 3);
    assert_int_equal(nd->gpus[1].free_milli, 0);
    assert_int_equal(nd->gpus[1].free_memory_mib, 0);
    assert_int_equal(nd->gpus[3].free_memory_mib, 0);
    assert_int_equal(nd->class_count[3], 1);
    assert_int_equal(nd->placements, 2);
    assert_int_equal(nd->cpu_free, 59000);
    assert_int_equal(nd->version, 2);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(c), 2600);

    /* CPU only: no GPUs needed (NULL accepted), class 0; `out` may be NULL. */
    kgpu_request cp = cpu_req(c, 500, 100);
    kgpu_assignment d = apply_ok(c, &cp, n, NULL);
    assert_int_equal(d.ngpus, 0);
    assert_int_equal(d.klass, KGPU_CLASS_CPU);
    assert_int_equal(kgpu_cluster_apply(c, &cp, n, NULL, NULL, NULL), 0);
    assert_int_equal(nd->class_count[KGPU_CLASS_CPU], 2);
    assert_int_equal(nd->cpu_free, 58000);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(c), 2600);

    /* A memory-only share counts as a placement without compute. */
    kgpu_request mo = share_req(c, 0, 1, 0, 1000);
    kgpu_assignment e = apply_ok(c, &mo, n, (int[]){0});
    assert_int_equal(nd->gpus[0].placements, 2);
    assert_int_equal(nd->gpus[0].free_milli, 700);
    assert_int_equal(nd->gpus[0].free_memory_mib, 32768 - 5096);

    /* Release in another order: each undoes exactly its part. */
    release_ok(c, &b);
    assert_int_equal(nd->gpus[1].free_milli, 1000);
    assert_int_equal(nd->gpus[1].free_memory_mib, 32768);
    assert_int_equal(nd->class_count[3], 0);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(c), 600);
    release_ok(c, &a);
    release_ok(c, &e);
    release_ok(c, &d);
    release_ok(c, &d); /* the same shape twice: both CPU pods */
    assert_same_state(c, pristine, false);
    assert_int_equal(nd->version, 10);
    kgpu_cluster_free(c);
    kgpu_cluster_free(pristine);
}

/* Asserts apply fails with `code` and changes neither the cluster nor *out. */
static void assert_apply_refused(kgpu_cluster *c, const kgpu_request *r, int node, const int *gpus,
                                 int code, const char *msg)
{
    kgpu_cluster *snap = kgpu_cluster_clone(c);
    kgpu_assignment out, sentinel;
    memset(&out, 0x5c, sizeof(out));
    memset(&sentinel, 0x5c, sizeof(sentinel));
    kgpu_error e;
    kgpu_error_clear(&e);
    int rc = kgpu_cluster_apply(c, r, node, gpus, &out, &e);
    if (rc != code || (msg != NULL && strcmp(e.msg, msg) != 0))
        fail_msg("apply: rc %d \"%s\", want %d \"%s\"", rc, e.msg, code, msg ? msg : "");
    assert_int_equal(e.code, code);
    assert_memory_equal(&out, &sentinel, sizeof(out));
    assert_same_state(c, snap, true);
    kgpu_cluster_free(snap);
}

static void test_apply_refusals(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 16000, 65536, 3, V100, 32768);
    kgpu_request s700 = share_req(c, 1000, 1, 700, 0);
    apply_ok(c, &s700, n, (int[]){1});

    kgpu_request sh2 = share_req(c, 1000, 2, 200, 0);
    assert_apply_refused(c, &sh2, n, (int[]){0, 0}, KGPU_EINVAL, "node n: GPU 0 chosen twice");
    assert_apply_refused(c, &sh2, n, (int[]){0, 3}, KGPU_EINVAL, "node n has no GPU at position 3");
    assert_apply_refused(c, &sh2, n, (int[]){-1, 0}, KGPU_EINVAL,
                         "node n has no GPU at position -1");
    assert_apply_refused(c, &sh2, n, NULL, KGPU_EINVAL, "node n: no GPUs chosen");
    kgpu_request s400 = share_req(c, 1000, 1, 400, 0);
    assert_apply_refused(c, &s400, n, (int[]){1}, KGPU_ENOFIT,
                         "node n: GPU 1 cannot hold this request");
    kgpu_request w1 = whole_req(c, 0, 1);
    assert_apply_refused(c, &w1, n, (int[]){1}, KGPU_ENOFIT,
                         "node n: GPU 1 cannot hold this request");
    kgpu_request m = share_req(c, 0, 1, 100, 40000);
    assert_apply_refused(c, &m, n, (int[]){0}, KGPU_ENOFIT,
                         "node n: asks 40000 MiB of GPU memory, largest GPU here has 32768 MiB");
    kgpu_request big = cpu_req(c, 16000, 0);
    assert_apply_refused(c, &big, n, NULL, KGPU_ENOFIT,
                         "node n: insufficient CPU: requests 16000m, 15000m free of 16000m");
    kgpu_request w3 = whole_req(c, 0, 3);
    assert_apply_refused(c, &w3, n, (int[]){0, 1, 2}, KGPU_ENOFIT, NULL);
    assert_apply_refused(c, &s400, 1, (int[]){0}, KGPU_EINVAL, "no node with index 1");
    assert_apply_refused(c, &s400, -1, (int[]){0}, KGPU_EINVAL, "no node with index -1");
    /* An uncompiled request (no models) fits nowhere. */
    kgpu_request raw = {.gpu_count = 1, .gpu_milli = 100};
    assert_apply_refused(c, &raw, n, (int[]){0}, KGPU_ENOFIT, NULL);
    /* And the refusals really were refusals: the right GPUs still take it. */
    apply_ok(c, &sh2, n, (int[]){2, 0});
    kgpu_cluster_free(c);
}

/* Asserts release fails with `code` and changes nothing. */
static void assert_release_refused(kgpu_cluster *c, const kgpu_assignment *a, int code)
{
    kgpu_cluster *snap = kgpu_cluster_clone(c);
    kgpu_error e;
    kgpu_error_clear(&e);
    int rc = kgpu_cluster_release(c, a, &e);
    if (rc != code)
        fail_msg("release: rc %d \"%s\", want %s", rc, e.msg, kgpu_err_name(code));
    assert_int_equal(e.code, code);
    assert_true(e.msg[0] != '\0');
    assert_same_state(c, snap, true);
    kgpu_cluster_free(snap);
}

static void test_release_bogus(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 16000, 65536, 3, V100, 32768);
    kgpu_request s600 = share_req(c, 2000, 1, 600, 1000);
    kgpu_assignment a = apply_ok(c, &s600, n, (int[]){0});
    kgpu_request w = whole_req(c, 1000, 1);
    kgpu_assignment wa = apply_ok(c, &w, n, (int[]){1});

    kgpu_assignment b = a;
    b.klass = 5; /* no 4-GPU pod here */
    assert_release_refused(c, &b, KGPU_ESTATE);
    b.klass = KGPU_CLASS_MAX;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b.klass = -1;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.cpu_milli = 15000; /* more CPU back than was taken */
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.memory_mib = 70000;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.gpus[0] = 3;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b.gpus[0] = -2;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.gpus[0] = 2; /* a GPU nobody holds */
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.gpu_milli = 700; /* more compute back than GPU 0 has taken */
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.gpu_memory_mib = 2000;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.ngpus = 4;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.ngpus = -1;
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.exclusive = true; /* the share's GPU never gave all its memory */
    assert_release_refused(c, &b, KGPU_ESTATE);
    b = a;
    b.node = 1;
    assert_release_refused(c, &b, KGPU_EINVAL);

    /* Released once is fine; the whole GPU cannot be released twice. */
    release_ok(c, &wa);
    assert_release_refused(c, &wa, KGPU_ESTATE);
    release_ok(c, &a);
    assert_release_refused(c, &a, KGPU_ESTATE);
    kgpu_assignment none = {.node = n, .klass = KGPU_CLASS_CPU};
    assert_release_refused(c, &none, KGPU_ESTATE);
    kgpu_cluster_free(c);
}

/*
 * A bogus assignment naming one GPU twice must be refused: releasing it would
 * give that GPU back more than its capacity. Fails until kgpu_cluster_release
 * checks each GPU against the total it gives back, not entry by entry.
 */
static void test_release_duplicate_gpu(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 16000, 65536, 2, V100, 32768);
    kgpu_request s600 = share_req(c, 0, 1, 600, 0);
    kgpu_assignment a = apply_ok(c, &s600, n, (int[]){0});
    kgpu_assignment b = a;
    b.ngpus = 2;
    b.gpus[0] = 0;
    b.gpus[1] = 0;
    b.gpu_milli = 400; /* 400 + 400 back onto GPU 0, which has 400 free: 1200 > 1000 */
    kgpu_error e;
    kgpu_error_clear(&e);
    int rc = kgpu_cluster_release(c, &b, &e);
    const kgpu_gpu *g = &kgpu_cluster_node(c, n)->gpus[0];
    int free_milli = g->free_milli, placements = g->placements;
    int64_t allocated = kgpu_cluster_gpu_milli_allocated(c);
    kgpu_cluster_free(c); /* before asserting, so a failure reports only itself */
    if (rc != KGPU_ESTATE || free_milli != 400 || placements != 1 || allocated != 600)
        fail_msg("release naming GPU 0 twice: rc %d (want ESTATE); GPU 0 now %d milli free "
                 "(want 400, capacity 1000), %d placements (want 1), %lld milli allocated "
                 "(want 600)",
                 rc, free_milli, placements, (long long)allocated);
}

/* ---- health ------------------------------------------------------------------------------- */

static void test_gpu_health(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 16000, 65536, 2, V100, 32768);
    const kgpu_node *nd = kgpu_cluster_node(c, n);
    kgpu_request s = share_req(c, 0, 1, 300, 0), w2 = whole_req(c, 0, 2);
    kgpu_error e;

    assert_int_equal(kgpu_cluster_set_gpu_health(c, n, 0, false, &e), 0);
    assert_int_equal(nd->version, 1);
    assert_false(nd->gpus[0].healthy);
    assert_false(kgpu_gpu_usable(nd, &nd->gpus[0], &s));
    assert_true(kgpu_gpu_usable(nd, &nd->gpus[1], &s));
    assert_int_equal(kgpu__usable_gpus(nd, &s), 1);
    assert_int_equal(kgpu__node_free_milli(nd), 1000);
    assert_int_equal(kgpu_cluster_gpu_count(c), 2); /* still counted */
    char why[256];
    assert_false(kgpu_fit(c, n, &w2, why, sizeof(why)));
    assert_non_null(strstr(why, "healthy"));
    assert_string_equal(why, "needs 2 GPUs, only 1 of 2 are healthy");
    /* The apply path agrees: GPU 0 is refused. */
    assert_apply_refused(c, &s, n, (int[]){0}, KGPU_ENOFIT,
                         "node n: GPU 0 cannot hold this request");
    int gpus[1];
    assert_int_equal(kgpu__pick_best_fit(nd, &s, gpus), 0);
    assert_int_equal(gpus[0], 1);

    assert_int_equal(kgpu_cluster_set_gpu_health(c, n, 1, false, &e), 0);
    assert_false(kgpu_fit(c, n, &s, why, sizeof(why)));
    assert_non_null(strstr(why, "healthy"));
    assert_int_equal(nd->version, 2);

    assert_int_equal(kgpu_cluster_set_gpu_health(c, n, 0, true, &e), 0);
    assert_int_equal(kgpu_cluster_set_gpu_health(c, n, 1, true, &e), 0);
    assert_int_equal(nd->version, 4);
    assert_true(kgpu_fit(c, n, &w2, NULL, 0));

    assert_int_equal(kgpu_cluster_set_gpu_health(c, n, 2, false, &e), KGPU_EINVAL);
    assert_int_equal(kgpu_cluster_set_gpu_health(c, n, -1, false, &e), KGPU_EINVAL);
    assert_int_equal(kgpu_cluster_set_gpu_health(c, 1, 0, false, &e), KGPU_EINVAL);
    assert_int_equal(nd->version, 4);

    /* A GPU that goes bad while held can still be released. */
    kgpu_assignment a = apply_ok(c, &s, n, (int[]){0});
    kgpu_cluster_set_gpu_health(c, n, 0, false, NULL);
    release_ok(c, &a);
    assert_int_equal(nd->gpus[0].free_milli, 1000);
    assert_int_equal(nd->gpus[0].placements, 0);
    kgpu_cluster_free(c);
}

/* ---- property test ------------------------------------------------------------------------ */

#define PROP_MAX_HELD 400

typedef struct prop {
    uint64_t seed;
    int step;
    kgpu_rng rng;
    kgpu_cluster *c;
    kgpu_assignment held[PROP_MAX_HELD];
    int nheld;
    int placed, released, nofit, refused, toggled, peak;
} prop;

#define PROP_CHECK(p, cond)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg("seed %llu step %d: %s", (unsigned long long)(p)->seed, (p)->step, #cond);    \
    } while (0)

/* Six nodes, 1-8 GPUs, three models, varied GPU memory. */
static kgpu_cluster *prop_cluster(void)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "a100x8", 96000, 524288, 8, A100, 81920);
    add_node(c, "v100x4", 64000, 262144, 4, V100, 32768);
    add_node(c, "t4x2", 32000, 131072, 2, T4, 15360);
    add_node_mixed(c, "mixed4", 48000, 196608, 4, (const char *[]){V100, V100, T4, T4},
                   (const int64_t[]){32768, 16384, 15360, 15360});
    add_node(c, "a100x1", 16000, 65536, 1, A100, 40960);
    add_node_mixed(c, "mixed8", 128000, 1048576, 8,
                   (const char *[]){A100, A100, A100, A100, V100, V100, V100, V100},
                   (const int64_t[]){81920, 81920, 40960, 40960, 16384, 16384, 32768, 32768});
    return c;
}

static const char *const prop_a100[] = {"A100*"}, *const prop_v100[] = {"V100*"};
static const char *const prop_t4[] = {"T4"}, *const prop_a_t4[] = {"A100*", "T4"};

static kgpu_request prop_request(prop *p)
{
    kgpu_rng *g = &p->rng;
    kgpu_request r = {.shape = -1};
    r.cpu_milli = 500 * (int64_t)kgpu_rng_below(g, 17);
    r.memory_mib = 1024 * (int64_t)kgpu_rng_below(g, 33);
    switch (kgpu_rng_below(g, 5)) {
    case 0: /* CPU only */
        break;
    case 1: /* one share: compute and/or memory */
        r.gpu_count = 1;
        r.gpu_milli = 100 * (int)kgpu_rng_below(g, 10);
        r.gpu_memory_mib = kgpu_rng_below(g, 2) ? 1024 * (int64_t)kgpu_rng_below(g, 20) : 0;
        if (r.gpu_milli == 0 && r.gpu_memory_mib == 0)
            r.gpu_milli = 500;
        break;
    case 2: /* a share spread over 2-4 GPUs */
        r.gpu_count = 2 + (int)kgpu_rng_below(g, 3);
        r.gpu_milli = 100 + 100 * (int)kgpu_rng_below(g, 6);
        r.gpu_memory_mib = kgpu_rng_below(g, 3) == 0 ? 2048 : 0;
        break;
    case 3: /* whole GPUs */
        r.gpu_count = kgpu_rng_below(g, 8) == 0 ? 8 : 1 + (int)kgpu_rng_below(g, 4);
        r.gpu_milli = KGPU_MILLI;
        r.exclusive = true;
        break;
    default: /* memory only */
        r.gpu_count = 1 + (int)kgpu_rng_below(g, 2);
        r.gpu_memory_mib = 2048 * (1 + (int64_t)kgpu_rng_below(g, 8));
        break;
    }
    switch (kgpu_rng_below(g, 8)) {
    case 0:
        r.allow = prop_a100, r.nallow = 1;
        break;
    case 1:
        r.allow = prop_v100, r.nallow = 1;
        break;
    case 2:
        r.exclude = prop_t4, r.nexclude = 1;
        break;
    case 3:
        r.allow = prop_a_t4, r.nallow = 2;
        break;
    default:
        break;
    }
    kgpu_error e;
    if (kgpu_request_compile(p->c, &r, &e) != 0)
        fail_msg("seed %llu step %d: compile: %s", (unsigned long long)p->seed, p->step, e.msg);
    return r;
}

/* An independent statement of "fits": enough CPU, memory and usable GPUs. */
static bool ref_gpu_ok(const kgpu_gpu *g, const kgpu_request *r)
{
    if (!g->healthy || ((r->models >> g->model) & 1) == 0)
        return false;
    if (r->exclusive)
        return g->placements == 0;
    return g->free_milli >= r->gpu_milli && g->free_memory_mib >= r->gpu_memory_mib;
}

static bool ref_fit(const kgpu_node *n, const kgpu_request *r)
{
    if (r->cpu_milli > n->cpu_free || r->memory_mib > n->memory_free)
        return false;
    int ok = 0;
    for (int i = 0; i < n->ngpus; i++)
        ok += ref_gpu_ok(&n->gpus[i], r);
    return r->gpu_count == 0 || ok >= r->gpu_count;
}

/* Every resource is within bounds and equals capacity minus what the held assignments took. */
static void prop_invariants(prop *p)
{
    const kgpu_cluster *c = p->c;
    int64_t alloc = 0;
    for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        int64_t cpu = 0, mem = 0, gmilli[KGPU_MAX_GPUS_PER_NODE] = {0};
        int64_t gmem[KGPU_MAX_GPUS_PER_NODE] = {0};
        int gplace[KGPU_MAX_GPUS_PER_NODE] = {0}, gexcl[KGPU_MAX_GPUS_PER_NODE] = {0};
        int placements = 0, cls[KGPU_CLASS_MAX] = {0};
        for (int k = 0; k < p->nheld; k++) {
            const kgpu_assignment *a = &p->held[k];
            if (a->node != i)
                continue;
            cpu += a->cpu_milli;
            mem += a->memory_mib;
            placements++;
            cls[a->klass]++;
            for (int j = 0; j < a->ngpus; j++) {
                int g = a->gpus[j];
                gmilli[g] += a->gpu_milli;
                gmem[g] += a->exclusive ? n->gpus[g].memory_mib : a->gpu_memory_mib;
                gplace[g]++;
                gexcl[g] += a->exclusive;
                alloc += a->gpu_milli;
            }
        }
        PROP_CHECK(p, n->cpu_free >= 0 && n->cpu_free <= n->cpu_milli);
        PROP_CHECK(p, n->memory_free >= 0 && n->memory_free <= n->memory_mib);
        PROP_CHECK(p, n->cpu_free == n->cpu_milli - cpu);
        PROP_CHECK(p, n->memory_free == n->memory_mib - mem);
        PROP_CHECK(p, n->placements == placements);
        PROP_CHECK(p, memcmp(n->class_count, cls, sizeof(cls)) == 0);
        for (int g = 0; g < n->ngpus; g++) {
            const kgpu_gpu *gpu = &n->gpus[g];
            PROP_CHECK(p, gpu->free_milli >= 0 && gpu->free_milli <= KGPU_MILLI);
            PROP_CHECK(p, gpu->free_memory_mib >= 0 && gpu->free_memory_mib <= gpu->memory_mib);
            PROP_CHECK(p, gpu->free_milli == KGPU_MILLI - gmilli[g]);
            PROP_CHECK(p, gpu->free_memory_mib == gpu->memory_mib - gmem[g]);
            PROP_CHECK(p, gpu->placements == gplace[g]);
            PROP_CHECK(p, gexcl[g] == 0 || gplace[g] == 1); /* a whole GPU is never shared */
        }
    }
    PROP_CHECK(p, kgpu_cluster_gpu_milli_allocated(c) == alloc);
}

/* Checks the GPUs a helper chose: distinct, usable, and for best fit the tightest. */
static void prop_check_pick(prop *p, const kgpu_node *n, const kgpu_request *r, const int *gpus,
                            bool best)
{
    bool chosen[KGPU_MAX_GPUS_PER_NODE] = {false};
    int worst = -1;
    for (int k = 0; k < r->gpu_count; k++) {
        PROP_CHECK(p, gpus[k] >= 0 && gpus[k] < n->ngpus);
        PROP_CHECK(p, !chosen[gpus[k]]);
        chosen[gpus[k]] = true;
        PROP_CHECK(p, ref_gpu_ok(&n->gpus[gpus[k]], r));
        if (n->gpus[gpus[k]].free_milli > worst)
            worst = n->gpus[gpus[k]].free_milli;
    }
    if (!best)
        return;
    for (int i = 0; i < n->ngpus; i++) {
        if (chosen[i] || !ref_gpu_ok(&n->gpus[i], r))
            continue;
        if (r->exclusive) /* the first untouched GPUs in index order */
            PROP_CHECK(p, i > gpus[r->gpu_count - 1]);
        else /* no GPU left out has less free compute than one taken */
            PROP_CHECK(p, n->gpus[i].free_milli >= worst);
    }
}

static void prop_place(prop *p)
{
    kgpu_request r = prop_request(p);
    int fit[16], nfit = 0;
    char why[256];
    for (int i = 0; i < kgpu_cluster_node_count(p->c); i++) {
        const kgpu_node *n = kgpu_cluster_node(p->c, i);
        why[0] = '\0';
        bool f = kgpu_fit(p->c, i, &r, why, sizeof(why));
        PROP_CHECK(p, f == kgpu__fit(n, &r));
        PROP_CHECK(p, f == ref_fit(n, &r));
        PROP_CHECK(p, f || why[0] != '\0');
        if (f)
            fit[nfit++] = i;
    }
    if (nfit == 0) {
        /* Nowhere fits: apply must refuse and change nothing. */
        int node = (int)kgpu_rng_below(&p->rng, (uint64_t)kgpu_cluster_node_count(p->c));
        int gpus[KGPU_MAX_GPUS_PER_NODE] = {0};
        for (int k = 0; k < KGPU_MAX_GPUS_PER_NODE; k++)
            gpus[k] = k % kgpu_cluster_node(p->c, node)->ngpus;
        kgpu_cluster *snap = kgpu_cluster_clone(p->c);
        PROP_CHECK(p, kgpu_cluster_apply(p->c, &r, node, gpus, NULL, NULL) == KGPU_ENOFIT);
        assert_same_state(p->c, snap, true);
        kgpu_cluster_free(snap);
        p->nofit++;
        return;
    }
    int node = fit[kgpu_rng_below(&p->rng, (uint64_t)nfit)];
    const kgpu_node *n = kgpu_cluster_node(p->c, node);
    int gpus[KGPU_MAX_GPUS_PER_NODE];
    bool best = kgpu_rng_below(&p->rng, 2) == 0;
    if (r.gpu_count > 0) {
        int rc = best ? kgpu__pick_best_fit(n, &r, gpus) : kgpu__pick_random(n, &r, &p->rng, gpus);
        PROP_CHECK(p, rc == 0);
        prop_check_pick(p, n, &r, gpus, best || r.exclusive);
    }
    kgpu_node before = *n;
    kgpu_assignment a;
    kgpu_error e;
    if (kgpu_cluster_apply(p->c, &r, node, gpus, &a, &e) != 0)
        fail_msg("seed %llu step %d: apply: %s", (unsigned long long)p->seed, p->step, e.msg);
    PROP_CHECK(p, a.node == node && a.ngpus == r.gpu_count);
    PROP_CHECK(p, a.cpu_milli == r.cpu_milli && a.memory_mib == r.memory_mib);
    PROP_CHECK(p, a.exclusive == r.exclusive && a.klass == kgpu_request_class(&r));
    PROP_CHECK(p, a.gpu_milli == (r.exclusive ? KGPU_MILLI : r.gpu_milli));
    PROP_CHECK(p, r.gpu_count == 0 || memcmp(a.gpus, gpus, sizeof(int) * r.gpu_count) == 0);
    PROP_CHECK(p, n->version == before.version + 1);
    PROP_CHECK(p, p->nheld < PROP_MAX_HELD);
    p->held[p->nheld++] = a;
    if (p->nheld > p->peak)
        p->peak = p->nheld;
    p->placed++;
}

static void prop_release(prop *p)
{
    int k = (int)kgpu_rng_below(&p->rng, (uint64_t)p->nheld);
    kgpu_assignment a = p->held[k];
    uint64_t v = kgpu_cluster_node(p->c, a.node)->version;
    kgpu_error e;
    if (kgpu_cluster_release(p->c, &a, &e) != 0)
        fail_msg("seed %llu step %d: release: %s", (unsigned long long)p->seed, p->step, e.msg);
    PROP_CHECK(p, kgpu_cluster_node(p->c, a.node)->version == v + 1);
    p->held[k] = p->held[--p->nheld];
    p->released++;
    /* A whole GPU just given back cannot be given back again. */
    if (a.exclusive) {
        kgpu_cluster *snap = kgpu_cluster_clone(p->c);
        PROP_CHECK(p, kgpu_cluster_release(p->c, &a, NULL) == KGPU_ESTATE);
        assert_same_state(p->c, snap, true);
        kgpu_cluster_free(snap);
        p->refused++;
    }
}

/* Flips a GPU's health, or tries to take a held whole GPU a second time. */
static void prop_disturb(prop *p)
{
    if (kgpu_rng_below(&p->rng, 2) == 0) {
        int node = (int)kgpu_rng_below(&p->rng, (uint64_t)kgpu_cluster_node_count(p->c));
        const kgpu_node *n = kgpu_cluster_node(p->c, node);
        int g = (int)kgpu_rng_below(&p->rng, (uint64_t)n->ngpus);
        PROP_CHECK(p, kgpu_cluster_set_gpu_health(p->c, node, g, !n->gpus[g].healthy, NULL) == 0);
        p->toggled++;
        return;
    }
    for (int k = 0; k < p->nheld; k++) {
        const kgpu_assignment *a = &p->held[k];
        if (a->ngpus == 0)
            continue;
        kgpu_request w = {.gpu_count = 1, .gpu_milli = KGPU_MILLI, .exclusive = true, .shape = -1};
        compile(p->c, &w);
        kgpu_cluster *snap = kgpu_cluster_clone(p->c);
        PROP_CHECK(p,
                   kgpu_cluster_apply(p->c, &w, a->node, &a->gpus[0], NULL, NULL) == KGPU_ENOFIT);
        assert_same_state(p->c, snap, true);
        kgpu_cluster_free(snap);
        p->refused++;
        return;
    }
}

static void run_property(uint64_t seed, int steps)
{
    prop *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    p->seed = seed;
    p->c = prop_cluster();
    kgpu_cluster *pristine = kgpu_cluster_clone(p->c);
    kgpu_rng_seed(&p->rng, seed, 11);
    for (p->step = 0; p->step < steps; p->step++) {
        uint64_t op = kgpu_rng_below(&p->rng, 20);
        if (op < 11 || p->nheld == 0)
            prop_place(p);
        else if (op < 19)
            prop_release(p);
        else
            prop_disturb(p);
        prop_invariants(p);
    }
    /* Give everything back in random order and heal every GPU: pristine again. */
    while (p->nheld > 0) {
        prop_release(p);
        prop_invariants(p);
    }
    for (int i = 0; i < kgpu_cluster_node_count(p->c); i++)
        for (int g = 0; g < kgpu_cluster_node(p->c, i)->ngpus; g++)
            kgpu_cluster_set_gpu_health(p->c, i, g, true, NULL);
    assert_same_state(p->c, pristine, false);
    /* The run exercised what it claims to. */
    if (p->placed < steps / 4 || p->nofit < 10 || p->peak < 15 || p->toggled < 5 || p->refused < 10)
        fail_msg("seed %llu: weak run: placed %d nofit %d peak %d toggled %d refused %d",
                 (unsigned long long)seed, p->placed, p->nofit, p->peak, p->toggled, p->refused);
    kgpu_cluster_free(pristine);
    kgpu_cluster_free(p->c);
    free(p);
}

static void test_property_apply_release(void **state)
{
    const uint64_t seeds[] = {1, 2, 42, 2023, 0xdeadbeef};
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
        run_property(seeds[i], 3000);
}

/* ---- the placement search (kgpu_place_all) ------------------------------------------------ */

/* A T4 node as the extender sees one: 15360 MiB per GPU, NUMA 0, 0, 1, 1. */
static int add_t4_node(kgpu_cluster *c, const char *name)
{
    kgpu_gpu_spec g[4];
    for (int i = 0; i < 4; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = T4, .memory_mib = 15360, .numa = i / 2, .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = g, .ngpus = 4};
    int rc = kgpu_cluster_add_node(c, &s, NULL);
    assert_true(rc >= 0);
    return rc;
}

/* Applies every request at the GPUs the search chose, on a copy: the placement is real. */
static void assert_placement_applies(const kgpu_cluster *c, int node,
                                     const kgpu_request *const *reqs, int n,
                                     const kgpu_placement *pl)
{
    kgpu_cluster *copy = kgpu_cluster_clone(c);
    assert_non_null(copy);
    for (int i = 0; i < n; i++) {
        kgpu_error e;
        kgpu_error_clear(&e);
        if (kgpu_cluster_apply(copy, reqs[i], node, pl->gpus[i], NULL, &e) != 0)
            fail_msg("request %d of %d at the search's GPUs: %s", i + 1, n, e.msg);
    }
    kgpu_cluster_free(copy);
}

/*
 * The cases kube-scheduler's real extender client found: containers placed
 * one at a time on their tightest GPUs refused nodes that hold them.
 */
static void test_place_finds_what_greedy_missed(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_t4_node(c, "t4");
    /* GPU 0 held whole, GPU 1 holds a 4 GiB share. */
    kgpu_request whole = whole_req(c, 0, 1), held4 = share_req(c, 0, 1, 0, 4096);
    apply_ok(c, &whole, n, (int[]){0});
    apply_ok(c, &held4, n, (int[]){1});
    /* [kgpu.io/gpu-mem 2 over kgpu.io/gpu-count 2, nvidia.com/gpu 1] and the reverse. */
    kgpu_request mem2x2 = share_req(c, 0, 2, 0, 1024);
    const kgpu_request *pod[] = {&mem2x2, &whole}, *rev[] = {&whole, &mem2x2};
    char why[256] = "";
    kgpu_placement pl;
    assert_true(kgpu_fit_all(c, n, NULL, 0, pod, 2, why, sizeof(why)));
    assert_int_equal(kgpu_place_all(c, n, NULL, 0, pod, 2, 0, 0, &pl, why, sizeof(why)),
                     KGPU_PLACE_FOUND);
    assert_false(pl.cut);
    assert_placement_applies(c, n, pod, 2, &pl);
    assert_true(kgpu_fit_all(c, n, NULL, 0, rev, 2, why, sizeof(why)));
    /* Another whole GPU on top no longer fits: refused with greedy's reason, not cut. */
    const kgpu_request *three[] = {&mem2x2, &whole, &whole};
    assert_int_equal(kgpu_place_all(c, n, NULL, 0, three, 3, 0, 0, &pl, why, sizeof(why)),
                     KGPU_PLACE_NONE);
    assert_false(pl.cut);
    assert_string_equal(why, "container 2 of 3: needs 1 whole GPU, 0 are fully free");

    /* An empty node: [mem 8, mem 8 over 2 GPUs, mem 16 over 4 GPUs] fits; it is no lost cause. */
    int e = add_t4_node(c, "t4-empty");
    kgpu_request m8 = share_req(c, 0, 1, 0, 8192), m4x2 = share_req(c, 0, 2, 0, 4096),
                 m4x4 = share_req(c, 0, 4, 0, 4096);
    const kgpu_request *mixed[] = {&m8, &m4x2, &m4x4};
    assert_true(kgpu_fit_all(c, e, NULL, 0, mixed, 3, why, sizeof(why)));
    assert_true(kgpu_fit_all_empty(c, n, mixed, 3));
    assert_int_equal(kgpu_place_all(c, e, NULL, 0, mixed, 3, 0, 0, &pl, NULL, 0), KGPU_PLACE_FOUND);
    assert_placement_applies(c, e, mixed, 3, &pl);
    /* With one more 8 GiB, they never fit, empty or not. */
    const kgpu_request *too_much[] = {&m8, &m8, &m8, &m4x2, &m4x4};
    assert_false(kgpu_fit_all_empty(c, e, too_much, 5));
    /* The cluster is untouched by all of it. */
    assert_int_equal(kgpu_cluster_node(c, e)->version, 0);
    assert_int_equal(kgpu_cluster_node(c, e)->gpus[0].free_memory_mib, 15360);
    kgpu_cluster_free(c);
}

/* CPU and memory are the node's whatever GPUs are chosen; bad arguments are refused. */
static void test_place_cpu_and_arguments(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 4000, 8192, 2, A100, 81920);
    kgpu_request a = share_req(c, 3000, 1, 100, 0), b = share_req(c, 2000, 1, 100, 0);
    const kgpu_request *both[] = {&a, &b};
    char why[256];
    assert_int_equal(kgpu_place_all(c, n, NULL, 0, both, 2, 0, 0, NULL, why, sizeof(why)),
                     KGPU_PLACE_NONE);
    assert_string_equal(why, "container 2 of 2: insufficient CPU: requests 2000m, 1000m free of "
                             "4000m");
    assert_true(kgpu_fit_all_empty(c, n, (const kgpu_request *[]){&a}, 1));
    assert_false(kgpu_fit_all_empty(c, n, both, 2));
    const kgpu_request *many[KGPU_PLACE_MAX_REQS + 1];
    for (int i = 0; i <= KGPU_PLACE_MAX_REQS; i++)
        many[i] = &b;
    assert_int_equal(
        kgpu_place_all(c, n, NULL, 0, many, KGPU_PLACE_MAX_REQS + 1, 0, 0, NULL, why, sizeof(why)),
        KGPU_PLACE_NONE);
    assert_non_null(strstr(why, "at most 16"));
    assert_int_equal(kgpu_place_all(c, 7, NULL, 0, both, 2, 0, 0, NULL, why, sizeof(why)),
                     KGPU_PLACE_NONE);
    assert_string_equal(why, "no node with index 7");
    assert_int_equal(kgpu_place_all(c, n, NULL, 0, both, 0, 0, 0, NULL, NULL, 0), KGPU_PLACE_FOUND);
    kgpu_cluster_free(c);
}

/* A node of 8 GPUs (NUMA 0-3, 4-7) of `gmem` MiB each, GPU i holding fill[i] MiB already. */
static int add_filled_node(kgpu_cluster *c, const char *name, const int64_t *gmem,
                           const int64_t *fill)
{
    kgpu_gpu_spec g[8];
    for (int i = 0; i < 8; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = V100, .memory_mib = gmem[i], .numa = i / 4, .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = 64000, .memory_mib = 1 << 20, .gpus = g, .ngpus = 8};
    int n = kgpu_cluster_add_node(c, &s, NULL);
    assert_true(n >= 0);
    for (int i = 0; i < 8; i++)
        if (fill[i] > 0) {
            kgpu_request r = share_req(c, 0, 1, 0, fill[i]);
            apply_ok(c, &r, n, (int[]){i});
        }
    return n;
}

/*
 * The search's bound: past its budget it stops, refuses as greedy placement
 * did, says so in the reason, and proves nothing (no "never fits").
 */
static void test_place_budget(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    /* The first case of test_place_finds_what_greedy_missed, with a budget of one step. */
    int t4 = add_t4_node(c, "t4");
    kgpu_request whole = whole_req(c, 0, 1), held4 = share_req(c, 0, 1, 0, 4096);
    apply_ok(c, &whole, t4, (int[]){0});
    apply_ok(c, &held4, t4, (int[]){1});
    kgpu_request mem2x2 = share_req(c, 0, 2, 0, 1024);
    const kgpu_request *pod[] = {&mem2x2, &whole};
    kgpu_placement pl;
    char why[512];
    assert_int_equal(kgpu_place_all(c, t4, NULL, 0, pod, 2, 1, 0, &pl, why, sizeof(why)),
                     KGPU_PLACE_UNKNOWN);
    assert_true(pl.cut);
    assert_int_equal(pl.steps, 1);
    assert_string_equal(why, "container 2 of 2: needs 1 whole GPU, 0 are fully free (kgpu stopped "
                             "searching for another arrangement of the containers after 1 step)");
    assert_int_equal(kgpu_place_all(c, t4, NULL, 0, pod, 2, 0, 0, &pl, NULL, 0), KGPU_PLACE_FOUND);
    assert_false(pl.cut);

    /*
     * Sixteen containers of different sizes on eight GPUs with different room
     * left, two to a GPU at most: greedy placement fails and the search has
     * more ways to try than its default budget allows.
     */
    static const int64_t v100[8] = {16384, 16384, 16384, 16384, 16384, 16384, 16384, 16384};
    static const int64_t fill[8] = {6176, 6199, 6615, 4113, 4627, 6941, 6979, 6371};
    static const int64_t sizes[16] = {4056, 4151, 4708, 5276, 5764, 4651, 5577, 4547,
                                      4547, 4911, 5006, 4562, 4268, 5200, 5424, 4755};
    int n = add_filled_node(c, "busy", v100, fill);
    kgpu_request parts[16];
    const kgpu_request *reqs[16];
    for (int i = 0; i < 16; i++) {
        parts[i] = share_req(c, 0, 1, 0, sizes[i]);
        reqs[i] = &parts[i];
    }
    assert_int_equal(kgpu_place_all(c, n, NULL, 0, reqs, 16, 0, 0, &pl, why, sizeof(why)),
                     KGPU_PLACE_UNKNOWN);
    assert_true(pl.cut);
    assert_int_equal(pl.steps, KGPU_PLACE_BUDGET);
    assert_non_null(strstr(why, "container 16 of 16: "));
    assert_non_null(strstr(why, "after 20000 steps)"));
    assert_false(kgpu_fit_all(c, n, NULL, 0, reqs, 16, why, sizeof(why)));
    assert_non_null(strstr(why, "stopped searching"));

    /* On an empty node the same: a cut search is no proof that they never fit. */
    static const int64_t mixed[8] = {15150, 17769, 17366, 15999, 15465, 15762, 15572, 15209};
    static const int64_t none[8] = {0};
    static const int64_t big[16] = {7882, 8130, 7971, 7546, 8191, 8825, 8334, 8709,
                                    8776, 7783, 6664, 6200, 8312, 7890, 8611, 6210};
    int e = add_filled_node(c, "mixed", mixed, none);
    for (int i = 0; i < 16; i++)
        parts[i] = share_req(c, 0, 1, 0, big[i]);
    assert_int_equal(
        kgpu_place_all(c, e, NULL, 0, reqs, 16, 0, KGPU_PLACE_EMPTY, &pl, why, sizeof(why)),
        KGPU_PLACE_UNKNOWN);
    assert_true(pl.cut);
    assert_int_equal(pl.steps, KGPU_PLACE_BUDGET);
    assert_true(kgpu_fit_all_empty(c, e, reqs, 16));
    /* A search that ends within its budget does prove it: no GPU there holds two of 9000 MiB. */
    kgpu_request large = share_req(c, 0, 1, 0, 9000);
    const kgpu_request *sixteen[] = {&large, &large, &large, &large, &large, &large,
                                     &large, &large, &large, &large, &large, &large,
                                     &large, &large, &large, &large};
    assert_false(kgpu_fit_all_empty(c, e, sixteen, 16));
    kgpu_cluster_free(c);
}

/* ---- an independent statement of "some placement exists": every assignment, tried --------- */

typedef struct ref_gpu {
    bool healthy;
    int model, placements, free_milli;
    int64_t memory_mib, free_mem;
} ref_gpu;

static bool ref_try(ref_gpu *g, int ng, const kgpu_request *const *reqs, int n, int64_t cpu_left)
{
    if (n == 0)
        return true;
    const kgpu_request *r = reqs[0];
    if (r->cpu_milli > cpu_left)
        return false;
    if (r->gpu_count <= 0)
        return ref_try(g, ng, reqs + 1, n - 1, cpu_left - r->cpu_milli);
    for (unsigned set = 0; set < 1u << ng; set++) {
        if (__builtin_popcount(set) != r->gpu_count)
            continue;
        bool ok = true;
        for (int i = 0; i < ng && ok; i++) {
            if (!((set >> i) & 1))
                continue;
            ok = g[i].healthy && ((r->models >> g[i].model) & 1) &&
                 (r->exclusive
                      ? g[i].placements == 0 && g[i].free_milli == KGPU_MILLI &&
                            g[i].free_mem == g[i].memory_mib
                      : g[i].free_milli >= r->gpu_milli && g[i].free_mem >= r->gpu_memory_mib);
        }
        if (!ok)
            continue;
        ref_gpu saved[KGPU_MAX_GPUS_PER_NODE];
        memcpy(saved, g, sizeof(*g) * (size_t)ng);
        for (int i = 0; i < ng; i++) {
            if (!((set >> i) & 1))
                continue;
            g[i].placements++;
            g[i].free_milli -= r->exclusive ? KGPU_MILLI : r->gpu_milli;
            g[i].free_mem -= r->exclusive ? g[i].memory_mib : r->gpu_memory_mib;
        }
        bool found = ref_try(g, ng, reqs + 1, n - 1, cpu_left - r->cpu_milli);
        memcpy(g, saved, sizeof(*g) * (size_t)ng);
        if (found)
            return true;
    }
    return false;
}

static bool ref_exists(const kgpu_node *n, bool empty, const kgpu_request *const *reqs, int nreqs)
{
    ref_gpu g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_gpu *x = &n->gpus[i];
        g[i] = (ref_gpu){.healthy = empty || x->healthy,
                         .model = x->model,
                         .placements = empty ? 0 : x->placements,
                         .free_milli = empty ? KGPU_MILLI : x->free_milli,
                         .memory_mib = x->memory_mib,
                         .free_mem = empty ? x->memory_mib : x->free_memory_mib};
    }
    return ref_try(g, n->ngpus, reqs, nreqs, empty ? n->cpu_milli : n->cpu_free);
}

/* A random share or whole-GPU request for a node of at most `ngpus` GPUs. */
static kgpu_request random_part(const kgpu_cluster *c, kgpu_rng *rng, int ngpus,
                                const char *const *only)
{
    kgpu_request r = {.shape = -1};
    if (kgpu_rng_below(rng, 4) == 0) {
        r.exclusive = true;
        r.gpu_milli = KGPU_MILLI;
        r.gpu_count = 1 + (int)kgpu_rng_below(rng, 2);
    } else {
        r.gpu_count = 1 + (int)kgpu_rng_below(rng, (uint64_t)(ngpus < 3 ? ngpus : 3));
        r.gpu_milli = 100 * (int)kgpu_rng_below(rng, 7);
        r.gpu_memory_mib = 1024 * (int64_t)kgpu_rng_below(rng, 11);
        if (r.gpu_milli == 0 && r.gpu_memory_mib == 0)
            r.gpu_memory_mib = 1024;
    }
    if (kgpu_rng_below(rng, 6) == 0) {
        r.allow = only;
        r.nallow = 1;
    }
    r.cpu_milli = 500 * (int64_t)kgpu_rng_below(rng, 3);
    compile(c, &r);
    return r;
}

/*
 * Against every assignment tried one by one, on random small nodes partly
 * filled: the search finds a placement exactly when one exists, the
 * placement it gives is real, and "never fits" holds exactly when no
 * placement exists on the empty node. Also after undoing placements.
 */
static void test_place_complete(void **state)
{
    static const char *const only_t4[] = {T4};
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 7, 3);
    int found = 0, none = 0, never = 0, greedy_missed = 0;
    for (int trial = 0; trial < 4000; trial++) {
        kgpu_cluster *c = kgpu_cluster_new();
        int ngpus = 2 + (int)kgpu_rng_below(&rng, 5);
        const char *models[KGPU_MAX_GPUS_PER_NODE];
        int64_t gmem[KGPU_MAX_GPUS_PER_NODE];
        bool one_model = kgpu_rng_below(&rng, 2) == 0; /* identical GPUs: symmetric classes */
        for (int i = 0; i < ngpus; i++) {
            bool t4 = !one_model && kgpu_rng_below(&rng, 3) == 0;
            models[i] = t4 ? T4 : V100;
            gmem[i] = t4 ? 15360 : 16384;
        }
        int n = add_node_mixed(c, "n", 4000, 1 << 16, ngpus, models, gmem);
        /* Partly filled: random requests on random usable GPUs. */
        kgpu_assignment held[6];
        int nheld = 0;
        for (int k = (int)kgpu_rng_below(&rng, 6); k > 0; k--) {
            kgpu_request r = random_part(c, &rng, ngpus, only_t4);
            r.cpu_milli = 0;
            int gpus[KGPU_MAX_GPUS_PER_NODE];
            if (kgpu__fit(kgpu_cluster_node(c, n), &r) &&
                kgpu__pick_random(kgpu_cluster_node(c, n), &r, &rng, gpus) == 0)
                held[nheld++] = apply_ok(c, &r, n, gpus);
        }
        if (kgpu_rng_below(&rng, 8) == 0)
            kgpu_cluster_set_gpu_health(c, n, (int)kgpu_rng_below(&rng, (uint64_t)ngpus), false,
                                        NULL);
        kgpu_request parts[4];
        const kgpu_request *reqs[4];
        int nreqs = 2 + (int)kgpu_rng_below(&rng, 3);
        for (int i = 0; i < nreqs; i++) { /* a third the same as one before: symmetric runs */
            if (i > 0 && kgpu_rng_below(&rng, 3) == 0)
                parts[i] = parts[kgpu_rng_below(&rng, (uint64_t)i)];
            else
                parts[i] = random_part(c, &rng, ngpus, only_t4);
            reqs[i] = &parts[i];
        }
        int nrelease = nheld > 0 ? (int)kgpu_rng_below(&rng, (uint64_t)nheld + 1) : 0;
        /* The reference sees the node with those placements undone for real. */
        kgpu_cluster *after = kgpu_cluster_clone(c);
        for (int i = 0; i < nrelease; i++)
            release_ok(after, &held[i]);
        const kgpu_node *node = kgpu_cluster_node(after, n);
        bool exists = ref_exists(node, false, reqs, nreqs);
        kgpu_placement pl;
        char why[256] = "";
        int rc = kgpu_place_all(c, n, held, nrelease, reqs, nreqs, 0, 0, &pl, why, sizeof(why));
        if (rc != (exists ? KGPU_PLACE_FOUND : KGPU_PLACE_NONE))
            fail_msg("trial %d: search says %d, a placement %s (%s)", trial, rc,
                     exists ? "exists" : "does not exist", why);
        assert_false(pl.cut);
        if (exists) {
            assert_placement_applies(after, n, reqs, nreqs, &pl);
            found++;
            /* Would placing them one at a time, in order, tightest first, have found it? */
            kgpu_cluster *g = kgpu_cluster_clone(after);
            bool ok = true;
            for (int i = 0; i < nreqs && ok; i++) {
                int gpus[KGPU_MAX_GPUS_PER_NODE];
                ok = kgpu__fit(kgpu_cluster_node(g, n), reqs[i]) &&
                     kgpu__pick_best_fit(kgpu_cluster_node(g, n), reqs[i], gpus) == 0 &&
                     kgpu_cluster_apply(g, reqs[i], n, gpus, NULL, NULL) == 0;
            }
            greedy_missed += !ok;
            kgpu_cluster_free(g);
        } else {
            assert_true(why[0] != '\0');
            none++;
        }
        bool ever = ref_exists(node, true, reqs, nreqs);
        assert_int_equal(kgpu_fit_all_empty(c, n, reqs, nreqs), ever);
        never += !ever;
        kgpu_cluster_free(after);
        kgpu_cluster_free(c);
    }
    /* The run covered both answers, and cases greedy placement gets wrong. */
    if (found < 300 || none < 300 || never < 50 || greedy_missed < 10)
        fail_msg("weak run: found %d none %d never %d greedy missed %d", found, none, never,
                 greedy_missed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_node_errors),
        cmocka_unit_test(test_add_node_fields),
        cmocka_unit_test(test_model_table_full),
        cmocka_unit_test(test_find_node_many),
        cmocka_unit_test(test_clone_deep),
        cmocka_unit_test(test_compile_globs),
        cmocka_unit_test(test_model_holes),
        cmocka_unit_test(test_model_table_full_adds_nothing),
        cmocka_unit_test(test_validate_errors),
        cmocka_unit_test(test_request_class),
        cmocka_unit_test(test_fit_reasons),
        cmocka_unit_test(test_apply_release_exact),
        cmocka_unit_test(test_apply_refusals),
        cmocka_unit_test(test_release_bogus),
        cmocka_unit_test(test_release_duplicate_gpu),
        cmocka_unit_test(test_gpu_health),
        cmocka_unit_test(test_property_apply_release),
        cmocka_unit_test(test_place_finds_what_greedy_missed),
        cmocka_unit_test(test_place_cpu_and_arguments),
        cmocka_unit_test(test_place_budget),
        cmocka_unit_test(test_place_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
