/*
 * Unit tests of the placement policies and the fragmentation measure
 * (src/core/policy*.c, frag.c): each policy on small clusters whose right answer
 * is worked out by hand, the shared selection loop, tie-breaking, the extender's
 * 0-10 scores, GPU choice, and fgd's caches against uncached evaluation.
 */
#include <math.h>
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
#include "kgpu/policy.h"
#include "kgpu/rng.h"
#include "policy_fixtures.h"

#define V100 "V100-SXM2-32GB"
#define A100 "A100-SXM4-80GB"
#define T4   "T4"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Adds a node whose GPU i has model models[i]. */
static int add_node_mixed(kgpu_cluster *c, const char *name, int64_t cpu, int ngpus,
                          const char *const *models)
{
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = models[i], .memory_mib = 32768, .numa = -1, .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = cpu, .memory_mib = 1 << 20, .gpus = g, .ngpus = ngpus};
    kgpu_error e;
    int rc = kgpu_cluster_add_node(c, &s, &e);
    if (rc < 0)
        fail_msg("add_node %s: %s", name, e.msg);
    return rc;
}

static kgpu_request share_req(const kgpu_cluster *c, int64_t cpu, int count, int milli)
{
    kgpu_request r = {.cpu_milli = cpu, .gpu_count = count, .gpu_milli = milli, .shape = -1};
    compile(c, &r);
    return r;
}

static kgpu_policy *policy_new(const char *name, const kgpu_cluster *c, const kgpu_workload *w)
{
    kgpu_error e;
    kgpu_policy *p = kgpu_policy_new(name, c, w, &e);
    if (p == NULL)
        fail_msg("policy %s: %s", name, e.msg);
    return p;
}

/* Runs a selection with a fresh generator for `seed`; returns the node, fills gpus. */
static int select_node(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *r,
                       const int *nodes, int n, uint64_t seed, int *gpus)
{
    kgpu_rng rng;
    kgpu_rng_seed(&rng, seed, 0);
    int node = -1, dummy[KGPU_MAX_GPUS_PER_NODE];
    kgpu_error e;
    int rc = kgpu_policy_select(p, c, r, nodes, n, &rng, &node, gpus ? gpus : dummy, &e);
    if (rc != 0)
        fail_msg("%s select: %s", kgpu_policy_name(p), e.msg);
    return node;
}

static void node_scores(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *r,
                        const int *nodes, int n, int *scores)
{
    kgpu_error e;
    if (kgpu_policy_node_scores(p, c, r, nodes, n, scores, &e) != 0)
        fail_msg("%s node_scores: %s", kgpu_policy_name(p), e.msg);
}

/*
 * The fgd study's target workload on c: 60 % one whole GPU, 30 % half a GPU,
 * 10 % two whole GPUs, all with 1000m CPU.
 */
static void study_workload(const kgpu_cluster *c, kgpu_workload *w)
{
    kgpu_request reqs[100];
    for (int i = 0; i < 100; i++)
        reqs[i] = i < 60   ? whole_req(c, 1000, 1)
                  : i < 90 ? share_req(c, 1000, 1, 500)
                           : whole_req(c, 1000, 2);
    kgpu_error e;
    if (kgpu_workload_build(reqs, 100, 0.95, w, &e) != 0)
        fail_msg("workload: %s", e.msg);
    assert_int_equal(w->n, 3);
}

static const char *const policy_names[] = {"random", "dotprod", "clustering", "packing", "bestfit",
                                           "fgd",    "binpack", "spread",     "kgpu"};
#define NPOLICIES ((int)(sizeof(policy_names) / sizeof(policy_names[0])))

/* ---- what the extender adds: several requests at once, NUMA, binpack/spread ------------- */

/* kgpu_fit_all: a pod's GPU containers together, optionally after undoing placements. */
static void test_fit_all(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 64000, 2, A100);
    kgpu_request half = share_req(c, 0, 1, 500), whole = whole_req(c, 0, 1);
    const kgpu_request *two_halves[] = {&half, &half};
    const kgpu_request *half_and_whole[] = {&half, &whole};
    const kgpu_request *three[] = {&whole, &whole, &half};
    char why[256];
    assert_true(kgpu_fit_all(c, n, NULL, 0, two_halves, 2, why, sizeof(why)));
    assert_true(kgpu_fit_all(c, n, NULL, 0, half_and_whole, 2, why, sizeof(why)));
    assert_false(kgpu_fit_all(c, n, NULL, 0, three, 3, why, sizeof(why)));
    assert_non_null(strstr(why, "container 3 of 3"));
    /* The cluster is untouched by the check. */
    const kgpu_node *node = kgpu_cluster_node(c, n);
    assert_int_equal(node->gpus[0].free_milli + node->gpus[1].free_milli, 2000);
    assert_int_equal(node->version, 0);
    /* A whole GPU taken: a half and a whole no longer fit, unless that placement is undone. */
    int g0[] = {0};
    kgpu_assignment held = apply_ok(c, &whole, n, g0);
    assert_false(kgpu_fit_all(c, n, NULL, 0, half_and_whole, 2, why, sizeof(why)));
    assert_true(kgpu_fit_all(c, n, &held, 1, half_and_whole, 2, why, sizeof(why)));
    assert_int_equal(kgpu_cluster_node(c, n)->gpus[0].free_milli, 0); /* still held */
    /* Undoing something not held on that node is refused, with a reason. */
    kgpu_assignment bogus = held;
    bogus.gpus[0] = 1;
    assert_false(kgpu_fit_all(c, n, &bogus, 1, half_and_whole, 2, why, sizeof(why)));
    assert_non_null(strstr(why, "not held"));
    kgpu_cluster_free(c);
}

/* A node of GPUs with `gmem` MiB each, NUMA node i / 2. */
static int add_node_gmem(kgpu_cluster *c, const char *name, int ngpus, const int64_t *gmem)
{
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){.index = i,
                               .model = gmem[i] == 15360 ? T4 : V100,
                               .memory_mib = gmem[i],
                               .numa = i / 2,
                               .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = 64000, .memory_mib = 1 << 20, .gpus = g, .ngpus = ngpus};
    int rc = kgpu_cluster_add_node(c, &s, NULL);
    assert_true(rc >= 0);
    return rc;
}

static kgpu_request mem_req(const kgpu_cluster *c, int count, int milli, int64_t mem)
{
    kgpu_request r = {.gpu_count = count, .gpu_milli = milli, .gpu_memory_mib = mem, .shape = -1};
    compile(c, &r);
    return r;
}

/* Whether the GPUs, CPU and placements of node n are the same in both clusters. */
static bool same_node_state(const kgpu_cluster *a, const kgpu_cluster *b, int n)
{
    const kgpu_node *x = kgpu_cluster_node(a, n), *y = kgpu_cluster_node(b, n);
    if (x->cpu_free != y->cpu_free || x->memory_free != y->memory_free ||
        x->placements != y->placements)
        return false;
    for (int g = 0; g < x->ngpus; g++)
        if (x->gpus[g].free_milli != y->gpus[g].free_milli ||
            x->gpus[g].free_memory_mib != y->gpus[g].free_memory_mib ||
            x->gpus[g].placements != y->gpus[g].placements)
            return false;
    return true;
}

/*
 * What bind did before the one search: each container on its own, with the
 * policy's GPUs, in order. Whether that placed them all (on a copy of c).
 */
static bool one_by_one(const char *policy, const kgpu_cluster *c, const kgpu_workload *w, int n,
                       const kgpu_request *const *reqs, int nreqs, uint64_t seed)
{
    kgpu_cluster *copy = kgpu_cluster_clone(c);
    kgpu_policy *p = policy_new(policy, copy, w);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, seed, 5);
    bool ok = true;
    for (int i = 0; i < nreqs && ok; i++) {
        int node, gpus[KGPU_MAX_GPUS_PER_NODE];
        ok = kgpu_policy_select(p, copy, reqs[i], &n, 1, &rng, &node, gpus, NULL) == 0 &&
             kgpu_cluster_apply(copy, reqs[i], n, gpus, NULL, NULL) == 0;
    }
    kgpu_policy_free(p);
    kgpu_cluster_free(copy);
    return ok;
}

/*
 * Filter passed, bind refused: on two V100-16GB GPUs holding 8 GiB and 4 GiB,
 * [mem 2, mem 11] fits (11 beside the 4, 2 beside the 8), but spread put
 * mem 2 on the emptier GPU, and mem 11 then fit nowhere. kgpu_policy_place
 * places whatever kgpu_fit_all passes, under every policy.
 */
static void test_place_keeps_later_containers_placeable(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node_gmem(c, "v100", 2, (const int64_t[]){16384, 16384});
    kgpu_request held8 = mem_req(c, 1, 0, 8192), held4 = mem_req(c, 1, 0, 4096);
    apply_ok(c, &held8, n, (int[]){0});
    apply_ok(c, &held4, n, (int[]){1});
    kgpu_request m2 = mem_req(c, 1, 0, 2048), m11 = mem_req(c, 1, 0, 11264);
    const kgpu_request *pod[] = {&m2, &m11};
    assert_true(kgpu_fit_all(c, n, NULL, 0, pod, 2, NULL, 0));
    kgpu_workload w;
    study_workload(c, &w);
    assert_false(one_by_one("spread", c, &w, n, pod, 2, 1));
    for (const kgpu_policy_ops *const *ops = kgpu_policy_list(); *ops != NULL; ops++) {
        kgpu_cluster *copy = kgpu_cluster_clone(c);
        kgpu_policy *p = policy_new((*ops)->name, copy, &w);
        kgpu_rng rng;
        kgpu_rng_seed(&rng, 1, 0);
        kgpu_assignment out[2];
        kgpu_error e;
        if (kgpu_policy_place(p, copy, n, pod, 2, &rng, out, &e) != 0)
            fail_msg("%s: %s", (*ops)->name, e.msg);
        assert_int_equal(out[0].gpus[0], 0); /* mem 2 beside the 8 GiB */
        assert_int_equal(out[1].gpus[0], 1); /* mem 11 beside the 4 GiB */
        kgpu_policy_free(p);
        kgpu_cluster_free(copy);
    }
    /* One more GiB and they do not fit: refused with the search's reason, nothing held. */
    kgpu_request m12 = mem_req(c, 1, 0, 12288);
    const kgpu_request *too_big[] = {&m12, &m12};
    kgpu_policy *p = policy_new("spread", c, &w);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 1, 0);
    kgpu_assignment out[2];
    kgpu_error e;
    assert_int_equal(kgpu_policy_place(p, c, n, too_big, 2, &rng, out, &e), KGPU_ENOFIT);
    assert_string_equal(e.msg, "container 2 of 2: no single GPU has 12288 MiB memory free; best "
                               "has 8192");
    assert_int_equal(kgpu_cluster_node(c, n)->placements, 2);
    kgpu_policy_free(p);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* A random GPU request for a node of `ngpus` GPUs (a quarter whole GPUs). */
static kgpu_request random_part(const kgpu_cluster *c, kgpu_rng *rng, int ngpus)
{
    if (kgpu_rng_below(rng, 4) == 0)
        return whole_req(c, 0, 1 + (int)kgpu_rng_below(rng, 2));
    int count = 1 + (int)kgpu_rng_below(rng, (uint64_t)(ngpus < 3 ? ngpus : 3));
    int milli = 100 * (int)kgpu_rng_below(rng, 7);
    int64_t mem = 1024 * (int64_t)kgpu_rng_below(rng, 12);
    return mem_req(c, count, milli, milli == 0 && mem == 0 ? 1024 : mem);
}

/*
 * For every policy, random multi-container pods on random partly filled
 * nodes: kgpu_policy_place places exactly what kgpu_fit_all passes, applies
 * all of it or nothing, and gives back exactly what it took. The run must
 * meet pods that placing containers one at a time with the policy strands.
 */
static void test_place_property(void **state)
{
    int stranded = 0;
    for (const kgpu_policy_ops *const *ops = kgpu_policy_list(); *ops != NULL; ops++) {
        kgpu_rng rng;
        kgpu_rng_seed(&rng, 99, 1);
        int placed = 0, refused = 0;
        for (int trial = 0; trial < 200; trial++) {
            kgpu_cluster *c = kgpu_cluster_new();
            int ngpus = 2 + (int)kgpu_rng_below(&rng, 5);
            int64_t gmem[KGPU_MAX_GPUS_PER_NODE];
            for (int i = 0; i < ngpus; i++)
                gmem[i] = kgpu_rng_below(&rng, 4) == 0 ? 15360 : 16384;
            int n = add_node_gmem(c, "n", ngpus, gmem);
            for (int k = (int)kgpu_rng_below(&rng, 5); k > 0; k--) {
                kgpu_request r = random_part(c, &rng, ngpus);
                int gpus[KGPU_MAX_GPUS_PER_NODE];
                if (kgpu__fit(kgpu_cluster_node(c, n), &r) &&
                    kgpu__pick_random(kgpu_cluster_node(c, n), &r, &rng, gpus) == 0)
                    apply_ok(c, &r, n, gpus);
            }
            kgpu_request parts[4];
            const kgpu_request *reqs[4];
            int nreqs = 2 + (int)kgpu_rng_below(&rng, 3);
            for (int i = 0; i < nreqs; i++) {
                parts[i] = random_part(c, &rng, ngpus);
                reqs[i] = &parts[i];
            }
            parts[0].cpu_milli = 2000; /* the pod's CPU rides on its first container */
            kgpu_workload w;
            study_workload(c, &w);
            bool fits = kgpu_fit_all(c, n, NULL, 0, reqs, nreqs, NULL, 0);
            kgpu_cluster *before = kgpu_cluster_clone(c);
            kgpu_policy *p = policy_new((*ops)->name, c, &w);
            kgpu_assignment out[4];
            kgpu_error e;
            int rc = kgpu_policy_place(p, c, n, reqs, nreqs, &rng, out, &e);
            if ((rc == 0) != fits)
                fail_msg("%s trial %d: fit_all says %d, place answers %d: %s", (*ops)->name, trial,
                         fits, rc, rc ? e.msg : "");
            if (rc == 0) {
                placed++;
                for (int i = 0; i < nreqs; i++)
                    assert_int_equal(out[i].ngpus, reqs[i]->gpu_count);
                stranded += !one_by_one((*ops)->name, before, &w, n, reqs, nreqs, trial);
                for (int i = nreqs - 1; i >= 0; i--)
                    if (kgpu_cluster_release(c, &out[i], &e) != 0)
                        fail_msg("%s trial %d: release: %s", (*ops)->name, trial, e.msg);
            } else {
                refused++;
            }
            assert_true(same_node_state(c, before, n));
            kgpu_policy_free(p);
            kgpu_workload_free(&w);
            kgpu_cluster_free(before);
            kgpu_cluster_free(c);
        }
        if (placed < 40 || refused < 40)
            fail_msg("%s: weak run: placed %d refused %d", (*ops)->name, placed, refused);
    }
    if (stranded < 10)
        fail_msg("weak run: one container at a time stranded only %d pods", stranded);
}

/* Several GPUs for one request come from one NUMA node when one can serve them. */
static void test_numa_local(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    kgpu_gpu_spec g[8];
    for (int i = 0; i < 8; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = A100, .memory_mib = 32768, .numa = i / 4, .healthy = true};
    kgpu_node_spec spec = {
        .name = "numa", .cpu_milli = 64000, .memory_mib = 1 << 20, .gpus = g, .ngpus = 8};
    int n = kgpu_cluster_add_node(c, &spec, NULL);
    assert_true(n >= 0);
    kgpu_request one = whole_req(c, 0, 1), two = whole_req(c, 0, 2), four = whole_req(c, 0, 4);
    /* Take GPUs 0 and 4: each NUMA node keeps three free. */
    int a[] = {0}, b[] = {4};
    apply_ok(c, &one, n, a);
    apply_ok(c, &one, n, b);
    const kgpu_node *node = kgpu_cluster_node(c, n);
    int got[4];
    assert_int_equal(kgpu__pick_best_fit(node, &two, got), 0);
    assert_int_equal(node->gpus[got[0]].numa, node->gpus[got[1]].numa);
    /* Four GPUs fit in no single NUMA node now: any four free ones. */
    assert_int_equal(kgpu__pick_best_fit(node, &four, got), 0);
    int numa0 = 0;
    for (int i = 0; i < 4; i++) {
        assert_true(got[i] != 0 && got[i] != 4);
        numa0 += node->gpus[got[i]].numa == 0;
    }
    assert_true(numa0 > 0 && numa0 < 4);
    /* Shares spread over two GPUs stay within one NUMA node too. */
    kgpu_request spread2 = share_req(c, 0, 2, 300);
    assert_int_equal(kgpu__pick_best_fit(node, &spread2, got), 0);
    assert_int_equal(node->gpus[got[0]].numa, node->gpus[got[1]].numa);
    assert_int_equal(kgpu__pick_loosest(node, &spread2, got), 0);
    assert_int_equal(node->gpus[got[0]].numa, node->gpus[got[1]].numa);
    kgpu_cluster_free(c);
}

/* binpack fills the fuller node and GPU; spread the emptier. */
static void test_binpack_spread(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int busy = add_node(c, "busy", 64000, 2, A100);
    int idle = add_node(c, "idle", 64000, 2, A100);
    kgpu_request quarter = share_req(c, 0, 1, 250);
    int g0[] = {0};
    apply_ok(c, &quarter, busy, g0);
    kgpu_policy *bp = policy_new("binpack", c, NULL), *sp = policy_new("spread", c, NULL);
    int got[1];
    assert_int_equal(select_node(bp, c, &quarter, NULL, 0, 1, got), busy);
    assert_int_equal(got[0], 0); /* onto the GPU already shared */
    assert_int_equal(select_node(sp, c, &quarter, NULL, 0, 1, got), idle);
    int only_busy[] = {busy};
    assert_int_equal(select_node(sp, c, &quarter, only_busy, 1, 1, got), busy);
    assert_int_equal(got[0], 1); /* the empty GPU of the busy node */
    int scores[2], both[] = {busy, idle};
    node_scores(bp, c, &quarter, both, 2, scores);
    assert_true(scores[0] == 10 && scores[1] == 0);
    node_scores(sp, c, &quarter, both, 2, scores);
    assert_true(scores[0] == 0 && scores[1] == 10);
    kgpu_policy_free(bp);
    kgpu_policy_free(sp);
    kgpu_cluster_free(c);
}

/* After the target workload changes in place, fgd must not answer from stale caches. */
static void test_fgd_invalidate(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int a = add_node(c, "a", 64000, 1, A100);
    int b = add_node(c, "b", 64000, 1, A100);
    kgpu_request quarter = share_req(c, 0, 1, 250);
    quarter.shape = 0;
    int g0[] = {0};
    apply_ok(c, &quarter, a, g0); /* a: 750 free; b: 1000 free */
    /* Target: whole GPUs only. A quarter on b would break b's whole GPU: a is better. */
    kgpu_shape whole_only[] = {{.gpu_milli = 1000, .gpu_count = 1, .models = ~0ULL, .p = 1}};
    kgpu_shape quarters[] = {{.gpu_milli = 250, .gpu_count = 1, .models = ~0ULL, .p = 1}};
    kgpu_shape shapes[1];
    kgpu_workload w = {shapes, 1};
    shapes[0] = whole_only[0];
    kgpu_policy *p = policy_new("fgd", c, &w);
    int both[] = {a, b}, sc[2];
    node_scores(p, c, &quarter, both, 2, sc);
    assert_true(sc[0] > sc[1]);
    /* Target: quarters. Either node serves quarters equally well afterwards: a tie. */
    shapes[0] = quarters[0];
    kgpu_policy_invalidate(p);
    node_scores(p, c, &quarter, both, 2, sc);
    assert_int_equal(sc[0], sc[1]);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

/* ---- registry ----------------------------------------------------------------------------- */

static void test_registry(void **state)
{
    const kgpu_policy_ops *const *list = kgpu_policy_list();
    int n = 0;
    while (list[n] != NULL)
        n++;
    assert_int_equal(n, NPOLICIES);
    for (int i = 0; i < NPOLICIES; i++) {
        const kgpu_policy_ops *ops = kgpu_policy_find(policy_names[i]);
        assert_non_null(ops);
        assert_string_equal(ops->name, policy_names[i]);
        assert_true(ops->summary != NULL && ops->summary[0] != '\0');
        assert_non_null(ops->score);
        assert_non_null(ops->pick_gpus);
        assert_int_equal(ops->random_ties, strcmp(policy_names[i], "random") == 0);
        bool listed = false;
        for (int k = 0; k < n; k++)
            listed |= list[k] == ops;
        assert_true(listed);
    }
    assert_null(kgpu_policy_find("nope"));
    assert_null(kgpu_policy_find(""));
    assert_null(kgpu_policy_find("FGD"));

    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "n", 8000, 2, V100);
    kgpu_error e;
    kgpu_error_clear(&e);
    assert_null(kgpu_policy_new("nope", c, NULL, &e));
    assert_int_equal(e.code, KGPU_ENOENT);
    assert_true(strncmp(e.msg, "unknown policy 'nope' (known: ", 30) == 0);
    for (int i = 0; i < NPOLICIES; i++)
        assert_non_null(strstr(e.msg, policy_names[i]));
    assert_null(kgpu_policy_new("nope", c, NULL, NULL)); /* NULL error is fine */

    kgpu_error_clear(&e);
    assert_null(kgpu_policy_new("fgd", c, NULL, &e));
    assert_int_equal(e.code, KGPU_EINVAL);
    assert_string_equal(e.msg, "fgd needs a target workload");
    kgpu_workload empty = {NULL, 0};
    assert_null(kgpu_policy_new("fgd", c, &empty, &e));
    assert_int_equal(e.code, KGPU_EINVAL);

    kgpu_workload w;
    study_workload(c, &w);
    for (int i = 0; i < NPOLICIES; i++) {
        bool needs_target = !strcmp(policy_names[i], "fgd") || !strcmp(policy_names[i], "kgpu");
        kgpu_policy *p = policy_new(policy_names[i], c, needs_target ? &w : NULL);
        assert_string_equal(kgpu_policy_name(p), policy_names[i]);
        kgpu_policy_free(p);
    }
    kgpu_policy_free(NULL);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* ---- each policy on a cluster with an obvious answer -------------------------------------- */

static void test_bestfit(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int empty = add_node(c, "empty", 64000, 8, V100);
    int full = add_node(c, "nearly-full", 64000, 8, V100);
    kgpu_request w7 = whole_req(c, 56000, 7);
    apply_ok(c, &w7, full, (int[]){0, 1, 2, 3, 4, 5, 6});
    kgpu_policy *p = policy_new("bestfit", c, NULL);

    /* Left over (CPU/128 cores + GPU/8 GPUs, half each): empty 0.67 (32), nearly full 0.02 (98). */
    kgpu_request w1 = whole_req(c, 4000, 1);
    int gpus[1];
    for (uint64_t s = 0; s < 20; s++) {
        assert_int_equal(select_node(p, c, &w1, NULL, 0, s, gpus), full);
        assert_int_equal(gpus[0], 7);
    }
    int sc[2];
    node_scores(p, c, &w1, (int[]){empty, full}, 2, sc);
    assert_int_equal(sc[0], 0);
    assert_int_equal(sc[1], 10);

    /* CPU counts too: same GPUs, less CPU free wins (77 vs 83). */
    int cpu32 = add_node(c, "cpu32", 32000, 2, V100);
    int cpu16 = add_node(c, "cpu16", 16000, 2, V100);
    kgpu_request s300 = share_req(c, 1000, 1, 300);
    for (uint64_t s = 0; s < 20; s++)
        assert_int_equal(select_node(p, c, &s300, (int[]){cpu32, cpu16, empty}, 3, s, NULL), cpu16);
    /* Over everything the nearly full node still leaves least (one GPU, 8 cores). */
    assert_int_equal(select_node(p, c, &s300, NULL, 0, 1, NULL), full);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

static void test_packing(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int empty = add_node(c, "empty", 32000, 2, V100);
    int shared = add_node(c, "shared-500", 32000, 2, V100);
    int used = add_node(c, "used", 32000, 2, V100);
    int shared8 = add_node(c, "shared-800", 32000, 2, V100);
    int small = add_node(c, "small-empty", 32000, 1, V100);
    kgpu_request s500 = share_req(c, 0, 1, 500), s200 = share_req(c, 0, 1, 200);
    kgpu_request w1 = whole_req(c, 0, 1);
    apply_ok(c, &s500, shared, (int[]){1});
    apply_ok(c, &w1, used, (int[]){0});
    apply_ok(c, &s200, shared8, (int[]){0});
    kgpu_policy *p = policy_new("packing", c, NULL);
    kgpu_request r = share_req(c, 1000, 1, 300);
    int gpus[1];

    /* A shared GPU with room first, the fuller the better (95 vs 92). */
    assert_int_equal(select_node(p, c, &r, NULL, 0, 1, gpus), shared);
    assert_int_equal(gpus[0], 1);
    assert_int_equal(select_node(p, c, &r, (int[]){empty, used, shared8}, 3, 1, gpus), shared8);
    assert_int_equal(gpus[0], 0);
    /* Then a free GPU on a node already in use (49) over an empty node (31). */
    assert_int_equal(select_node(p, c, &r, (int[]){empty, used}, 2, 1, gpus), used);
    assert_int_equal(gpus[0], 1);
    assert_int_equal(select_node(p, c, &r, (int[]){used, empty}, 2, 2, gpus), used);
    /* Among empty nodes, the smaller (32 vs 31). */
    assert_int_equal(select_node(p, c, &r, (int[]){empty, small}, 2, 1, gpus), small);
    assert_int_equal(select_node(p, c, &r, (int[]){empty}, 1, 1, gpus), empty);
    assert_int_equal(gpus[0], 0);

    /* Raw 31, 95, 49, 92, 32 scaled to 0-10. */
    int sc[5];
    node_scores(p, c, &r, (int[]){empty, shared, used, shared8, small}, 5, sc);
    const int want[] = {0, 10, 3, 10, 0};
    for (int k = 0; k < 5; k++)
        assert_int_equal(sc[k], want[k]);

    /* A whole GPU never opens an empty node while a used one has a free GPU. */
    for (uint64_t s = 0; s < 60; s++) {
        int node = select_node(p, c, &w1, NULL, 0, s, gpus);
        assert_true(node == shared || node == used || node == shared8);
    }
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

static void test_clustering(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int shares = add_node(c, "shares", 64000, 4, V100);
    int twos = add_node(c, "two-gpu-pods", 64000, 4, V100);
    int empty = add_node(c, "empty", 64000, 4, V100);
    int both = add_node(c, "both", 64000, 4, V100);
    kgpu_request s300 = share_req(c, 0, 1, 300), w2 = whole_req(c, 0, 2);
    apply_ok(c, &s300, shares, (int[]){0});
    apply_ok(c, &w2, twos, (int[]){0, 1});
    apply_ok(c, &w2, both, (int[]){0, 1});
    apply_ok(c, &s300, both, (int[]){2});
    kgpu_policy *p = policy_new("clustering", c, NULL);
    int gpus[2];

    /* A share: with shares only (88), with shares among others (69), empty (37), else (18). */
    kgpu_request s = share_req(c, 1000, 1, 200);
    for (uint64_t seed = 0; seed < 10; seed++)
        assert_int_equal(select_node(p, c, &s, NULL, 0, seed, gpus), shares);
    assert_int_equal(gpus[0], 0); /* tightest GPU: the one already shared */
    assert_int_equal(select_node(p, c, &s, (int[]){twos, empty, both}, 3, 1, gpus), both);
    assert_int_equal(select_node(p, c, &s, (int[]){twos, empty}, 2, 1, gpus), empty);
    assert_int_equal(select_node(p, c, &s, (int[]){twos}, 1, 1, gpus), twos);

    /* A 2-GPU pod goes next to 2-GPU pods, not onto the node hosting shares ("both" is full). */
    kgpu_request w = whole_req(c, 1000, 2);
    for (uint64_t seed = 0; seed < 10; seed++)
        assert_int_equal(select_node(p, c, &w, NULL, 0, seed, gpus), twos);
    assert_int_equal(gpus[0], 2);
    assert_int_equal(gpus[1], 3);
    assert_int_equal(select_node(p, c, &w, (int[]){shares, empty}, 2, 1, gpus), empty);
    /* A 1-GPU pod has no peers anywhere: the empty node's band wins. */
    kgpu_request w1 = whole_req(c, 1000, 1);
    assert_int_equal(select_node(p, c, &w1, NULL, 0, 1, gpus), empty);

    /* CPU-only pods score the same everywhere. */
    kgpu_request cp = cpu_req(c, 1000);
    int sc[4];
    node_scores(p, c, &cp, (int[]){0, 1, 2, 3}, 4, sc);
    for (int i = 0; i < 4; i++)
        assert_int_equal(sc[i], 10);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

static void test_dotprod(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int a = add_node(c, "a", 64000, 8, V100);
    int b = add_node(c, "b", 32000, 2, V100);
    int cc = add_node(c, "c", 128000, 4, V100);
    kgpu_policy *p = policy_new("dotprod", c, NULL);

    /*
     * 8 cores and one GPU; free and request normalised by 128000m and 8000m:
     * a: 0.5*0.0625 + 1.0*0.125 = 0.15625  -> 100*(1 - 0.078125)  = 92
     * b: 0.25*0.0625 + 0.25*0.125 = 0.046875 -> 100*(1 - 0.0234375) = 97
     * c: 1.0*0.0625 + 0.5*0.125 = 0.125    -> 100*(1 - 0.0625)    = 93
     * so b wins, and scaled to 0-10: a 0, b 10, c (93-92)*10/5 = 2.
     */
    kgpu_request r = whole_req(c, 8000, 1);
    int gpus[4];
    for (uint64_t s = 0; s < 10; s++)
        assert_int_equal(select_node(p, c, &r, NULL, 0, s, gpus), b);
    assert_int_equal(gpus[0], 0);
    int sc[3];
    node_scores(p, c, &r, (int[]){a, b, cc}, 3, sc);
    assert_int_equal(sc[0], 0);
    assert_int_equal(sc[1], 10);
    assert_int_equal(sc[2], 2);

    /* Four GPUs, no CPU: a 1.0*0.5 -> 75, c 0.5*0.5 -> 87, b does not fit. */
    kgpu_request r4 = whole_req(c, 0, 4);
    assert_int_equal(select_node(p, c, &r4, NULL, 0, 1, gpus), cc);
    for (int k = 0; k < 4; k++)
        assert_int_equal(gpus[k], k);
    node_scores(p, c, &r4, (int[]){a, b, cc}, 3, sc);
    assert_int_equal(sc[0], 0);
    assert_int_equal(sc[1], 0);
    assert_int_equal(sc[2], 10);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

static void test_random_uniform(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n0 = add_node(c, "fit0", 32000, 4, V100);
    add_node(c, "no-cpu", 2000, 4, V100);
    int n2 = add_node(c, "fit2", 16000, 1, V100);
    add_node(c, "t4-only", 32000, 4, T4);
    int n4 = add_node(c, "fit4", 64000, 8, V100);
    kgpu_request w1 = whole_req(c, 0, 1);
    apply_ok(c, &w1, n0, (int[]){1});
    kgpu_policy *p = policy_new("random", c, NULL);
    const char *v100[] = {"V100*"};
    kgpu_request r = {.cpu_milli = 4000,
                      .gpu_count = 1,
                      .gpu_milli = 300,
                      .allow = v100,
                      .nallow = 1,
                      .shape = -1};
    compile(c, &r);

    enum { DRAWS = 3000 };
    int count[5] = {0}, gcount[4] = {0};
    int gpus[1];
    for (uint64_t s = 0; s < DRAWS; s++) {
        int node = select_node(p, c, &r, NULL, 0, s, gpus);
        count[node]++;
        if (node == n0)
            gcount[gpus[0]]++;
    }
    assert_int_equal(count[1], 0);
    assert_int_equal(count[3], 0);
    double chi2 = 0, want = DRAWS / 3.0;
    for (int i = 0; i < 5; i += 2)
        chi2 += (count[i] - want) * (count[i] - want) / want;
    if (chi2 > 20) /* 2 degrees of freedom: p < 5e-5 */
        fail_msg("node counts %d %d %d, chi2 %.1f", count[0], count[2], count[4], chi2);
    /* On fit0, GPU 1 is taken whole; the others share the draws. */
    assert_int_equal(gcount[1], 0);
    double gw = count[n0] / 3.0, gchi = 0;
    for (int g = 0; g < 4; g += 1 + (g == 0))
        gchi += (gcount[g] - gw) * (gcount[g] - gw) / gw;
    if (gchi > 20)
        fail_msg("GPU counts %d %d %d, chi2 %.1f", gcount[0], gcount[2], gcount[3], gchi);
    assert_true(count[n2] > 0 && count[n4] > 0);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

static void test_fgd_share_onto_half_gpu(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int x = add_node(c, "x", 32000, 2, V100);
    int y = add_node(c, "y", 32000, 2, V100);
    kgpu_request half = share_req(c, 1000, 1, 500);
    apply_ok(c, &half, x, (int[]){0});
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_policy *p = policy_new("fgd", c, &w);

    /*
     * Fragmentation (p = .6 whole, .3 half, .1 two whole):
     * x [500,1000] = .6*500 + .1*1500 = 450; x after GPU 0 [0,1000] = .1*1000 = 100 (score 58);
     * x after GPU 1 [500,500] = .6*1000 + .1*1000 = 700 (43); y [1000,1000] = 0 -> 450 (38).
     */
    assert_float_equal(kgpu_node_frag(kgpu_cluster_node(c, x), &w, NULL, -1), 450, 1e-6);
    assert_float_equal(kgpu_node_frag(kgpu_cluster_node(c, x), &w, (int[]){0, 1000}, -1), 100,
                       1e-6);
    assert_float_equal(kgpu_node_frag(kgpu_cluster_node(c, y), &w, NULL, -1), 0, 1e-6);
    int gpus[1];
    for (uint64_t s = 0; s < 20; s++) {
        assert_int_equal(select_node(p, c, &half, NULL, 0, s, gpus), x);
        assert_int_equal(gpus[0], 0);
    }
    /* Cached: a shape id gives the same answer, twice. */
    kgpu_request shaped = half;
    shaped.shape = 1;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(select_node(p, c, &shaped, NULL, 0, 3, gpus), x);
        assert_int_equal(gpus[0], 0);
    }
    int sc[2];
    node_scores(p, c, &half, (int[]){x, y}, 2, sc);
    assert_int_equal(sc[0], 10);
    assert_int_equal(sc[1], 0);
    kgpu_policy_free(p);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

static void test_fgd_whole_gpu_keeps_fresh_node(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int fresh = add_node(c, "fresh", 32000, 2, V100);
    int used = add_node(c, "used", 32000, 2, V100);
    kgpu_request w1 = whole_req(c, 1000, 1);
    apply_ok(c, &w1, used, (int[]){0});
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_policy *p = policy_new("fgd", c, &w);

    /*
     * used [0,1000]: .1*1000 = 100 -> [0,0]: 0 (score 52);
     * fresh [1000,1000]: 0 -> [0,1000]: 100 (47): breaking a fresh node loses 2-GPU room.
     */
    int gpus[1];
    for (uint64_t s = 0; s < 20; s++) {
        assert_int_equal(select_node(p, c, &w1, NULL, 0, s, gpus), used);
        assert_int_equal(gpus[0], 1);
    }
    int sc[2];
    node_scores(p, c, &w1, (int[]){fresh, used}, 2, sc);
    assert_int_equal(sc[0], 0);
    assert_int_equal(sc[1], 10);
    /* Once "used" is full, the fresh node is the only place left. */
    apply_ok(c, &w1, used, (int[]){1});
    assert_int_equal(select_node(p, c, &w1, NULL, 0, 1, gpus), fresh);
    kgpu_policy_free(p);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* ---- GPU choice --------------------------------------------------------------------------- */

/* Six GPUs with free compute 1000, 300, 600, 300, 700, 0 (GPU 3's share also holds memory). */
static int choice_node(kgpu_cluster *c, int64_t gpu3_mem)
{
    int n = add_node(c, "choice", 64000, 6, V100);
    const int taken[] = {0, 700, 400, 700, 300};
    for (int g = 1; g < 5; g++) {
        kgpu_request s = share_req(c, 0, 1, taken[g]);
        s.gpu_memory_mib = g == 3 ? gpu3_mem : 0;
        apply_ok(c, &s, n, (int[]){g});
    }
    kgpu_request w = whole_req(c, 0, 1);
    apply_ok(c, &w, n, (int[]){5});
    return n;
}

static void assert_pick(const kgpu_node *n, const kgpu_request *r, int rc_want, const int *want)
{
    int gpus[KGPU_MAX_GPUS_PER_NODE];
    int rc = kgpu__pick_best_fit(n, r, gpus);
    assert_int_equal(rc, rc_want);
    for (int k = 0; rc == 0 && k < r->gpu_count; k++)
        if (gpus[k] != want[k])
            fail_msg("pick %d of %d milli x%d: GPU %d, want %d", k, r->gpu_milli, r->gpu_count,
                     gpus[k], want[k]);
}

static void test_pick_best_fit(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    const kgpu_node *n = kgpu_cluster_node(c, choice_node(c, 0));
    kgpu_request r;
    r = share_req(c, 0, 1, 250);
    assert_pick(n, &r, 0, (int[]){1}); /* 300 on GPUs 1 and 3: lowest index */
    r = share_req(c, 0, 2, 250);
    assert_pick(n, &r, 0, (int[]){1, 3});
    r = share_req(c, 0, 1, 300);
    assert_pick(n, &r, 0, (int[]){1});
    r = share_req(c, 0, 1, 500);
    assert_pick(n, &r, 0, (int[]){2});
    r = share_req(c, 0, 1, 650);
    assert_pick(n, &r, 0, (int[]){4});
    r = share_req(c, 0, 2, 650);
    assert_pick(n, &r, 0, (int[]){4, 0});
    r = share_req(c, 0, 1, 800);
    assert_pick(n, &r, 0, (int[]){0});
    r = share_req(c, 0, 3, 650);
    assert_pick(n, &r, KGPU_ENOFIT, NULL);
    r = share_req(c, 0, 5, 200);
    assert_pick(n, &r, 0, (int[]){1, 3, 2, 4, 0});
    /* Whole GPUs: the first untouched ones in index order. */
    r = whole_req(c, 0, 1);
    assert_pick(n, &r, 0, (int[]){0});
    r = whole_req(c, 0, 2);
    assert_pick(n, &r, KGPU_ENOFIT, NULL);

    /* Equal compute: the GPU with less memory free is the tighter fit. */
    kgpu_cluster *c2 = kgpu_cluster_new();
    const kgpu_node *n2 = kgpu_cluster_node(c2, choice_node(c2, 8192));
    r = share_req(c2, 0, 1, 250);
    assert_pick(n2, &r, 0, (int[]){3});

    /* Exclusive on a node with a share in the middle, and model constraints. */
    kgpu_cluster *c3 = kgpu_cluster_new();
    int m = add_node_mixed(c3, "mixed", 64000, 5, (const char *[]){T4, A100, A100, T4, A100});
    kgpu_request s100 = share_req(c3, 0, 1, 100);
    apply_ok(c3, &s100, m, (int[]){1});
    const kgpu_node *n3 = kgpu_cluster_node(c3, m);
    r = whole_req(c3, 0, 2);
    assert_pick(n3, &r, 0, (int[]){0, 2});
    r = whole_req(c3, 0, 4);
    assert_pick(n3, &r, 0, (int[]){0, 2, 3, 4});
    r = whole_req(c3, 0, 5);
    assert_pick(n3, &r, KGPU_ENOFIT, NULL);
    const char *a100[] = {"A100*"}, *t4[] = {"T4"};
    kgpu_request ra = {
        .gpu_count = 2, .gpu_milli = 1000, .exclusive = true, .allow = a100, .nallow = 1};
    compile(c3, &ra);
    assert_pick(n3, &ra, 0, (int[]){2, 4});
    kgpu_request rt = {.gpu_count = 1, .gpu_milli = 50, .allow = t4, .nallow = 1};
    compile(c3, &rt);
    assert_pick(n3, &rt, 0, (int[]){0});
    kgpu_request ra1 = {.gpu_count = 1, .gpu_milli = 50, .allow = a100, .nallow = 1};
    compile(c3, &ra1);
    assert_pick(n3, &ra1, 0, (int[]){1});
    kgpu_cluster_free(c);
    kgpu_cluster_free(c2);
    kgpu_cluster_free(c3);
}

static void test_pick_random(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    const kgpu_node *n = kgpu_cluster_node(c, choice_node(c, 0));
    /* 500 milli: usable are GPU 0 (1000), 2 (600), 4 (700). */
    kgpu_request r = share_req(c, 0, 2, 500);
    int seen[6] = {0}, first[6] = {0};
    for (uint64_t s = 0; s < 300; s++) {
        kgpu_rng rng;
        kgpu_rng_seed(&rng, s, 3);
        int gpus[2] = {-1, -1};
        assert_int_equal(kgpu__pick_random(n, &r, &rng, gpus), 0);
        assert_int_not_equal(gpus[0], gpus[1]);
        for (int k = 0; k < 2; k++) {
            assert_true(gpus[k] >= 0 && gpus[k] < 6);
            assert_true(kgpu_gpu_usable(n, &n->gpus[gpus[k]], &r));
            seen[gpus[k]]++;
        }
        first[gpus[0]]++;
    }
    assert_int_equal(seen[1] + seen[3] + seen[5], 0);
    assert_true(seen[0] > 100 && seen[2] > 100 && seen[4] > 100); /* 200 each expected */
    assert_true(first[0] > 50 && first[2] > 50 && first[4] > 50); /* random order too */

    kgpu_rng rng;
    kgpu_rng_seed(&rng, 9, 0);
    int gpus[4];
    r = share_req(c, 0, 4, 500);
    assert_int_equal(kgpu__pick_random(n, &r, &rng, gpus), KGPU_ENOFIT);
    /* Whole GPUs are taken in index order, as best fit does. */
    r = whole_req(c, 0, 1);
    assert_int_equal(kgpu__pick_random(n, &r, &rng, gpus), 0);
    assert_int_equal(gpus[0], 0);
    kgpu_cluster_free(c);
}

/* Every policy's GPU choice is usable; the best-fit ones choose exactly what best fit does. */
static void test_policy_gpu_choice(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int node = choice_node(c, 0);
    const kgpu_node *n = kgpu_cluster_node(c, node);
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_request reqs[] = {share_req(c, 0, 1, 250), share_req(c, 0, 2, 250),
                           share_req(c, 0, 1, 650), whole_req(c, 0, 1)};
    for (int i = 0; i < NPOLICIES; i++) {
        kgpu_policy *p = policy_new(policy_names[i], c, &w);
        bool spread = strcmp(policy_names[i], "spread") == 0;
        bool bestfit_pick = strcmp(policy_names[i], "random") != 0 &&
                            strcmp(policy_names[i], "fgd") != 0 &&
                            strcmp(policy_names[i], "kgpu") != 0 && !spread;
        for (size_t k = 0; k < sizeof(reqs) / sizeof(reqs[0]); k++) {
            int got[KGPU_MAX_GPUS_PER_NODE], want[KGPU_MAX_GPUS_PER_NODE];
            assert_int_equal(select_node(p, c, &reqs[k], NULL, 0, k, got), node);
            /* spread takes the emptiest GPUs that suffice, the others the tightest. */
            assert_int_equal(spread ? kgpu__pick_loosest(n, &reqs[k], want)
                                    : kgpu__pick_best_fit(n, &reqs[k], want),
                             0);
            bestfit_pick = bestfit_pick || spread;
            for (int g = 0; g < reqs[k].gpu_count; g++) {
                assert_true(kgpu_gpu_usable(n, &n->gpus[got[g]], &reqs[k]));
                if (bestfit_pick && got[g] != want[g])
                    fail_msg("%s request %zu: GPU %d, want %d", policy_names[i], k, got[g],
                             want[g]);
            }
            if (reqs[k].gpu_count == 2)
                assert_int_not_equal(got[0], got[1]);
        }
        kgpu_policy_free(p);
    }
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* ---- the selection loop ------------------------------------------------------------------- */

static void test_select_errors_and_subsets(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int busy = add_node(c, "busy", 16000, 2, V100);
    int idle = add_node(c, "idle", 64000, 2, V100);
    kgpu_request w1 = whole_req(c, 8000, 1);
    apply_ok(c, &w1, busy, (int[]){0});
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_request none = whole_req(c, 0, 3), cpu_big = cpu_req(c, 100000);
    kgpu_request s = share_req(c, 1000, 1, 200), cp = cpu_req(c, 1000);
    for (int i = 0; i < NPOLICIES; i++) {
        kgpu_policy *p = policy_new(policy_names[i], c, &w);
        kgpu_rng rng;
        kgpu_rng_seed(&rng, 1, 0);
        int node = -7, gpus[4] = {-7, -7, -7, -7};
        kgpu_error e;
        kgpu_error_clear(&e);
        assert_int_equal(kgpu_policy_select(p, c, &none, NULL, 0, &rng, &node, gpus, &e),
                         KGPU_ENOFIT);
        assert_int_equal(e.code, KGPU_ENOFIT);
        assert_string_equal(e.msg, "no node fits");
        assert_int_equal(node, -7);
        assert_int_equal(kgpu_policy_select(p, c, &cpu_big, NULL, 0, &rng, &node, gpus, &e),
                         KGPU_ENOFIT);
        /* A subset: only what it names is considered, even when another node would do. */
        for (uint64_t seed = 0; seed < 5; seed++) {
            assert_int_equal(select_node(p, c, &s, (int[]){busy}, 1, seed, gpus), busy);
            assert_int_equal(gpus[0], 1); /* GPU 0 of "busy" is taken whole */
            assert_int_equal(select_node(p, c, &s, (int[]){idle}, 1, seed, gpus), idle);
        }
        assert_int_equal(
            kgpu_policy_select(p, c, &s, (int[]){busy, idle}, 0, &rng, &node, gpus, &e),
            KGPU_ENOFIT);
        assert_int_equal(kgpu_policy_select(p, c, &s, (int[]){idle, 5}, 2, &rng, &node, gpus, &e),
                         KGPU_EINVAL);
        assert_string_equal(e.msg, "no node with index 5");
        assert_int_equal(kgpu_policy_select(p, c, &s, (int[]){-1}, 1, &rng, &node, gpus, &e),
                         KGPU_EINVAL);
        /* Only non-fitting nodes named. */
        kgpu_request w2 = whole_req(c, 0, 2);
        assert_int_equal(kgpu_policy_select(p, c, &w2, (int[]){busy}, 1, &rng, &node, gpus, &e),
                         KGPU_ENOFIT);
        /* CPU-only: no GPUs written. */
        gpus[0] = -7;
        assert_int_equal(kgpu_policy_select(p, c, &cp, NULL, 0, &rng, &node, gpus, &e), 0);
        assert_true(node == busy || node == idle);
        assert_int_equal(gpus[0], -7);
        kgpu_policy_free(p);
    }
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

static void test_tie_order(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        add_node(c, name, 32000, 2, V100);
    }
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_request r = share_req(c, 1000, 1, 300);
    const uint32_t rank[] = {3, 1, 0, 2}, rank2[] = {0, 9, 9, 9}, short_rank[] = {5, 4};
    for (int i = 0; i < NPOLICIES; i++) {
        kgpu_policy *p = policy_new(policy_names[i], c, &w);
        bool random = strcmp(policy_names[i], "random") == 0;
        int count[4] = {0};
        kgpu_policy_set_tie_order(p, rank, 4);
        for (uint64_t s = 0; s < 200; s++)
            count[select_node(p, c, &r, NULL, 0, s, NULL)]++;
        if (random) { /* ignores the order: every node, none dominating */
            for (int k = 0; k < 4; k++)
                if (count[k] < 20 || count[k] > 100)
                    fail_msg("random with a tie order: counts %d %d %d %d", count[0], count[1],
                             count[2], count[3]);
            kgpu_policy_free(p);
            continue;
        }
        if (count[2] != 200)
            fail_msg("%s: lowest rank won %d of 200", policy_names[i], count[2]);
        /* In a subset, the lowest rank among the named nodes. */
        assert_int_equal(select_node(p, c, &r, (int[]){3, 1, 0}, 3, 1, NULL), 1);
        kgpu_policy_set_tie_order(p, rank2, 4);
        assert_int_equal(select_node(p, c, &r, NULL, 0, 1, NULL), 0);
        /* Nodes beyond the rank table come last. */
        kgpu_policy_set_tie_order(p, short_rank, 2);
        for (uint64_t s = 0; s < 20; s++)
            assert_int_equal(select_node(p, c, &r, NULL, 0, s, NULL), 1);
        /* Back to random ties: every node gets its turn. */
        kgpu_policy_set_tie_order(p, NULL, 0);
        memset(count, 0, sizeof(count));
        for (uint64_t s = 0; s < 200; s++)
            count[select_node(p, c, &r, NULL, 0, s, NULL)]++;
        for (int k = 0; k < 4; k++)
            if (count[k] < 20)
                fail_msg("%s random ties: counts %d %d %d %d", policy_names[i], count[0], count[1],
                         count[2], count[3]);
        kgpu_policy_free(p);
    }
    /* The order only breaks ties: a better score wins whatever its rank. */
    kgpu_request w1 = whole_req(c, 0, 1);
    apply_ok(c, &w1, 3, (int[]){0});
    kgpu_policy *p = policy_new("bestfit", c, NULL);
    kgpu_policy_set_tie_order(p, rank, 4);
    assert_int_equal(select_node(p, c, &r, NULL, 0, 1, NULL), 3);
    kgpu_policy_free(p);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

static void test_node_scores(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int empty8 = add_node(c, "empty8", 64000, 8, V100);
    int full = add_node(c, "nearly-full", 64000, 8, V100);
    int empty4 = add_node(c, "empty4", 64000, 4, V100);
    int nocpu = add_node(c, "no-cpu", 2000, 2, V100);
    int half8 = add_node(c, "half8", 64000, 8, V100);
    kgpu_request w7 = whole_req(c, 56000, 7), w4 = whole_req(c, 0, 4);
    apply_ok(c, &w7, full, (int[]){0, 1, 2, 3, 4, 5, 6});
    apply_ok(c, &w4, half8, (int[]){0, 1, 2, 3});
    kgpu_policy *p = policy_new("bestfit", c, NULL);

    /* bestfit raw: empty8 32, nearly-full 98, empty4 57, half8 57; no-cpu does not fit. */
    kgpu_request r = whole_req(c, 4000, 1);
    int nodes[] = {nocpu, full, half8, empty8, empty4}, sc[5];
    memset(sc, 0x7f, sizeof(sc));
    node_scores(p, c, &r, nodes, 5, sc);
    assert_int_equal(sc[0], 0);  /* does not fit */
    assert_int_equal(sc[1], 10); /* best */
    assert_int_equal(sc[2], 4);  /* (57-32)*10/66 = 3.8 */
    assert_int_equal(sc[3], 0);  /* worst fitting */
    assert_int_equal(sc[4], 4);

    /* One fitting node, or all equal: 10. */
    node_scores(p, c, &r, (int[]){nocpu, empty4}, 2, sc);
    assert_int_equal(sc[0], 0);
    assert_int_equal(sc[1], 10);
    kgpu_policy *rnd = policy_new("random", c, NULL);
    node_scores(rnd, c, &r, nodes, 5, sc);
    assert_int_equal(sc[0], 0);
    for (int k = 1; k < 5; k++)
        assert_int_equal(sc[k], 10);
    /* Nothing fits: all 0. */
    kgpu_request huge = cpu_req(c, 1000000);
    node_scores(p, c, &huge, nodes, 5, sc);
    for (int k = 0; k < 5; k++)
        assert_int_equal(sc[k], 0);
    /* Every score is within 0..10 for every policy and request. */
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_request reqs[] = {r, share_req(c, 0, 1, 300), share_req(c, 1000, 2, 700), cpu_req(c, 8000),
                           whole_req(c, 0, 4)};
    for (int i = 0; i < NPOLICIES; i++) {
        kgpu_policy *q = policy_new(policy_names[i], c, &w);
        for (size_t k = 0; k < sizeof(reqs) / sizeof(reqs[0]); k++) {
            node_scores(q, c, &reqs[k], nodes, 5, sc);
            bool ten = false;
            for (int j = 0; j < 5; j++) {
                assert_true(sc[j] >= 0 && sc[j] <= 10);
                ten |= sc[j] == 10;
                if (!kgpu__fit(kgpu_cluster_node(c, nodes[j]), &reqs[k]))
                    assert_int_equal(sc[j], 0);
            }
            assert_true(ten); /* something fits each of these */
        }
        kgpu_policy_free(q);
    }
    kgpu_error e;
    assert_int_equal(kgpu_policy_node_scores(p, c, &r, (int[]){0, 9}, 2, sc, &e), KGPU_EINVAL);
    assert_string_equal(e.msg, "no node with index 9");
    assert_int_equal(kgpu_policy_node_scores(p, c, &r, NULL, 0, sc, &e), 0);
    kgpu_policy_free(p);
    kgpu_policy_free(rnd);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* ---- fragmentation ------------------------------------------------------------------------ */

static double frag1(const kgpu_node *n, kgpu_shape s, const int *free_milli, int64_t cpu_free)
{
    s.p = 1;
    kgpu_workload w = {&s, 1};
    return kgpu_node_frag(n, &w, free_milli, cpu_free);
}

static void test_node_frag(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int i = add_node(c, "n", 32000, 4, V100);
    int mixed = add_node_mixed(c, "mixed", 32000, 2, (const char *[]){V100, T4});
    kgpu_request s500 = share_req(c, 0, 1, 500), s800 = share_req(c, 0, 1, 800);
    kgpu_request w1 = whole_req(c, 0, 1);
    apply_ok(c, &s500, i, (int[]){1});
    apply_ok(c, &s800, i, (int[]){2});
    apply_ok(c, &w1, i, (int[]){3});
    const kgpu_node *n = kgpu_cluster_node(c, i); /* free 1000, 500, 200, 0: 1700 */
    const uint64_t any = ~0ULL, v100 = 1ULL << 0, t4 = 1ULL << 1;

    kgpu_shape cpu_only = {.cpu_milli = 1000, .models = any};
    kgpu_shape one600 = {.cpu_milli = 1000, .gpu_milli = 600, .gpu_count = 1, .models = any};
    kgpu_shape two600 = {.cpu_milli = 1000, .gpu_milli = 600, .gpu_count = 2, .models = any};
    kgpu_shape one200 = {.cpu_milli = 1000, .gpu_milli = 200, .gpu_count = 1, .models = any};
    kgpu_shape big_cpu = one600;
    big_cpu.cpu_milli = 64000;
    kgpu_shape t4_only = one600;
    t4_only.models = t4;

    assert_float_equal(frag1(n, cpu_only, NULL, -1), 1700, 1e-9);
    assert_float_equal(frag1(n, one600, NULL, -1), 700, 1e-9); /* 500 + 200 + 0 too small */
    assert_float_equal(frag1(n, two600, NULL, -1), 1700, 1e-9);
    assert_float_equal(frag1(n, one200, NULL, -1), 0, 1e-9);
    assert_float_equal(frag1(n, big_cpu, NULL, -1), 1700, 1e-9);
    assert_float_equal(frag1(n, t4_only, NULL, -1), 1700, 1e-9);

    kgpu_shape mix[2] = {cpu_only, one600};
    mix[0].p = 0.25;
    mix[1].p = 0.75;
    kgpu_workload w = {mix, 2};
    assert_float_equal(kgpu_node_frag(n, &w, NULL, -1), 0.25 * 1700 + 0.75 * 700, 1e-9);

    /* Overrides: per-GPU free compute and free CPU. */
    assert_float_equal(frag1(n, one600, (int[]){1000, 1000, 1000, 1000}, -1), 0, 1e-9);
    assert_float_equal(frag1(n, one600, (int[]){100, 100, 100, 100}, -1), 400, 1e-9);
    assert_float_equal(frag1(n, one600, NULL, 999), 1700, 1e-9);
    assert_float_equal(frag1(n, one600, NULL, 1000), 700, 1e-9);

    /* Mixed models: GPUs of a model the shape may not use are lost even when free. */
    const kgpu_node *m = kgpu_cluster_node(c, mixed);
    kgpu_shape v100_only = one600;
    v100_only.models = v100;
    assert_float_equal(frag1(m, v100_only, NULL, -1), 1000, 1e-9);
    assert_float_equal(frag1(m, one600, NULL, -1), 0, 1e-9);

    /* Unhealthy GPUs are neither idle nor fragments. */
    kgpu_cluster_set_gpu_health(c, i, 1, false, NULL);
    assert_float_equal(frag1(n, cpu_only, NULL, -1), 1200, 1e-9);
    assert_float_equal(frag1(n, one600, NULL, -1), 200, 1e-9);
    kgpu_cluster_set_gpu_health(c, i, 0, false, NULL);
    assert_float_equal(frag1(n, one600, NULL, -1), 200, 1e-9); /* no GPU takes 600: all of it */
    assert_float_equal(frag1(n, one200, NULL, -1), 0, 1e-9);
    kgpu_cluster_set_gpu_health(c, i, 2, false, NULL);
    assert_float_equal(frag1(n, cpu_only, NULL, -1), 0, 1e-9);

    /* Cluster: the sum over nodes, and the idle milli of healthy GPUs. */
    kgpu_cluster_set_gpu_health(c, i, 0, true, NULL);
    kgpu_cluster_set_gpu_health(c, i, 2, true, NULL);
    kgpu_shape cpu1 = cpu_only;
    cpu1.p = 1;
    kgpu_workload wc = {&cpu1, 1};
    double idle = -1;
    assert_float_equal(kgpu_cluster_frag(c, &wc, &idle), 1200 + 2000, 1e-9);
    assert_float_equal(idle, 3200, 1e-9);
    kgpu_shape s1 = one600;
    s1.p = 1;
    kgpu_workload ws = {&s1, 1};
    assert_float_equal(kgpu_cluster_frag(c, &ws, NULL), 200 + 0, 1e-9);
    kgpu_cluster_free(c);
}

static void test_workload_build(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "n", 64000, 8, V100);
    add_node(c, "t", 64000, 8, T4);
    kgpu_request reqs[100];
    int k = 0;
    for (int i = 0; i < 50; i++)
        reqs[k++] = whole_req(c, 2000, 1);
    for (int i = 0; i < 30; i++)
        reqs[k++] = share_req(c, 1000, 1, 500);
    for (int i = 0; i < 15; i++)
        reqs[k++] = cpu_req(c, 4000);
    for (int i = 0; i < 3; i++)
        reqs[k++] = whole_req(c, 8000, 2);
    for (int i = 0; i < 2; i++)
        reqs[k++] = share_req(c, 1000, 1, 250);
    /* Shuffle so grouping does not depend on input order. */
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 5, 0);
    for (int i = 99; i > 0; i--) {
        int j = (int)kgpu_rng_below(&rng, (uint64_t)i + 1);
        kgpu_request t = reqs[i];
        reqs[i] = reqs[j];
        reqs[j] = t;
    }
    kgpu_workload w;
    kgpu_error e;
    assert_int_equal(kgpu_workload_build(reqs, 100, 0.95, &w, &e), 0);
    assert_int_equal(w.n, 3); /* 50 + 30 + 15 = 95 covers 95 % */
    assert_int_equal(w.shapes[0].cpu_milli, 2000);
    assert_int_equal(w.shapes[0].gpu_milli, 1000);
    assert_int_equal(w.shapes[0].gpu_count, 1);
    assert_int_equal(w.shapes[0].models, ~0ULL);
    assert_float_equal(w.shapes[0].p, 50.0 / 95, 1e-12);
    assert_int_equal(w.shapes[1].gpu_milli, 500);
    assert_int_equal(w.shapes[1].cpu_milli, 1000);
    assert_float_equal(w.shapes[1].p, 30.0 / 95, 1e-12);
    assert_int_equal(w.shapes[2].gpu_milli, 0);
    assert_int_equal(w.shapes[2].gpu_count, 0);
    assert_int_equal(w.shapes[2].cpu_milli, 4000);
    assert_float_equal(w.shapes[2].p, 15.0 / 95, 1e-12);
    double sum = 0;
    for (int i = 0; i < w.n; i++)
        sum += w.shapes[i].p;
    assert_float_equal(sum, 1.0, 1e-12);
    kgpu_workload_free(&w);
    assert_null(w.shapes);
    assert_int_equal(w.n, 0);
    kgpu_workload_free(&w); /* twice is fine */
    kgpu_workload_free(NULL);

    assert_int_equal(kgpu_workload_build(reqs, 100, 1.0, &w, &e), 0);
    assert_int_equal(w.n, 5);
    const int counts[] = {50, 30, 15, 3, 2};
    sum = 0;
    for (int i = 0; i < 5; i++) {
        assert_float_equal(w.shapes[i].p, counts[i] / 100.0, 1e-12);
        sum += w.shapes[i].p;
    }
    assert_float_equal(sum, 1.0, 1e-12);
    assert_int_equal(w.shapes[3].gpu_count, 2);
    assert_int_equal(w.shapes[4].gpu_milli, 250);
    kgpu_workload_free(&w);

    assert_int_equal(kgpu_workload_build(reqs, 100, 0.8, &w, &e), 0);
    assert_int_equal(w.n, 2);
    assert_float_equal(w.shapes[0].p, 50.0 / 80, 1e-12);
    kgpu_workload_free(&w);
    assert_int_equal(kgpu_workload_build(reqs, 100, 0.5, &w, &e), 0);
    assert_int_equal(w.n, 1);
    assert_float_equal(w.shapes[0].p, 1.0, 1e-12);
    kgpu_workload_free(&w);

    /* Equal counts: decreasing key order; model lists make distinct shapes. */
    const char *t4[] = {"T4"};
    kgpu_request eq[6];
    for (int i = 0; i < 2; i++) {
        eq[i] = share_req(c, 1000, 1, 300);
        eq[2 + i] = share_req(c, 2000, 1, 300);
        eq[4 + i] = (kgpu_request){
            .cpu_milli = 1000, .gpu_count = 1, .gpu_milli = 300, .allow = t4, .nallow = 1};
        compile(c, &eq[4 + i]);
    }
    assert_int_equal(kgpu_workload_build(eq, 6, 1.0, &w, &e), 0);
    assert_int_equal(w.n, 3);
    assert_int_equal(w.shapes[0].cpu_milli, 2000);
    assert_int_equal(w.shapes[1].models, ~0ULL); /* ~0 > the T4 bit */
    assert_int_equal(w.shapes[2].models, 1ULL << 1);
    kgpu_workload_free(&w);

    /* Errors leave *out empty. */
    const double bad[] = {0, -0.1, 1.01, NAN};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&w, 0x55, sizeof(w));
        kgpu_error_clear(&e);
        assert_int_equal(kgpu_workload_build(reqs, 100, bad[i], &w, &e), KGPU_EINVAL);
        assert_non_null(strstr(e.msg, "coverage"));
        assert_null(w.shapes);
        assert_int_equal(w.n, 0);
    }
    memset(&w, 0x55, sizeof(w));
    assert_int_equal(kgpu_workload_build(reqs, 0, 0.95, &w, &e), KGPU_EINVAL);
    assert_string_equal(e.msg, "empty workload");
    assert_null(w.shapes);
    kgpu_cluster_free(c);
}

/* ---- fgd caches --------------------------------------------------------------------------- */

static void test_fgd_cache_matches_uncached(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "v4", 32000, 4, V100);
    add_node(c, "t2", 16000, 2, T4);
    add_node_mixed(c, "mix3", 24000, 3, (const char *[]){V100, T4, V100});
    add_node(c, "v8", 64000, 8, V100);
    const char *v100[] = {"V100*"};

    /* Request kinds; shape ids 2 and 130 share a cache slot (130 % 128). */
    kgpu_request kinds[] = {
        share_req(c, 1000, 1, 500),
        whole_req(c, 2000, 1),
        share_req(c, 1000, 1, 250),
        whole_req(c, 4000, 2),
        share_req(c, 500, 2, 300),
        cpu_req(c, 3000),
        share_req(c, 1000, 1, 750),
        whole_req(c, 8000, 4),
        {.cpu_milli = 1000, .gpu_count = 1, .gpu_milli = 400, .allow = v100, .nallow = 1},
    };
    const int ids[] = {0, 1, 2, 3, 4, 5, 130, 7, 8};
    enum { NK = sizeof(kinds) / sizeof(kinds[0]) };
    compile(c, &kinds[8]);
    kgpu_request shaped[NK], plain[NK];
    for (int k = 0; k < NK; k++) {
        shaped[k] = plain[k] = kinds[k];
        shaped[k].shape = ids[k];
        plain[k].shape = -1;
    }
    kgpu_request wreqs[40];
    for (int i = 0; i < 40; i++)
        wreqs[i] = kinds[i % 7 == 6 ? 1 : i % 4];
    kgpu_workload w;
    kgpu_error e;
    assert_int_equal(kgpu_workload_build(wreqs, 40, 0.95, &w, &e), 0);

    state_handle cached = state_open("fgd", c, &w), warm = state_open("fgd", c, &w);
    kgpu_policy *pc = policy_new("fgd", c, &w), *pu = policy_new("fgd", c, &w);
    kgpu_assignment held[256];
    int nheld = 0, compared = 0;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 77, 0);
    for (int step = 0; step < 400; step++) {
        /* Scores and GPU picks: cached (shape ids), warm uncached, and from a fresh state. */
        state_handle fresh = state_open("fgd", c, &w);
        for (int k = 0; k < NK; k++) {
            for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
                if (!kgpu__fit(kgpu_cluster_node(c, i), &plain[k]))
                    continue;
                int64_t s1 = cached.ops->score(cached.state, c, i, &shaped[k]);
                int64_t s2 = warm.ops->score(warm.state, c, i, &plain[k]);
                int64_t s3 = fresh.ops->score(fresh.state, c, i, &plain[k]);
                if (s1 != s2 || s1 != s3)
                    fail_msg("step %d kind %d node %d: cached %lld, uncached %lld, fresh %lld",
                             step, k, i, (long long)s1, (long long)s2, (long long)s3);
                assert_true(s1 >= 0 && s1 <= 100);
                if (kinds[k].gpu_count > 0) {
                    int g1[KGPU_MAX_GPUS_PER_NODE], g2[KGPU_MAX_GPUS_PER_NODE];
                    assert_int_equal(
                        cached.ops->pick_gpus(cached.state, c, i, &shaped[k], &rng, g1), 0);
                    assert_int_equal(fresh.ops->pick_gpus(fresh.state, c, i, &plain[k], &rng, g2),
                                     0);
                    assert_memory_equal(g1, g2, sizeof(int) * (size_t)kinds[k].gpu_count);
                }
                compared++;
            }
        }
        state_close(&fresh);

        /* Whole selections agree too (same seed, same ties). */
        int k = (int)kgpu_rng_below(&rng, NK);
        int n1 = -1, n2 = -1, g1[KGPU_MAX_GPUS_PER_NODE], g2[KGPU_MAX_GPUS_PER_NODE];
        kgpu_rng r1, r2;
        kgpu_rng_seed(&r1, (uint64_t)step, 1);
        kgpu_rng_seed(&r2, (uint64_t)step, 1);
        int rc1 = kgpu_policy_select(pc, c, &shaped[k], NULL, 0, &r1, &n1, g1, NULL);
        int rc2 = kgpu_policy_select(pu, c, &plain[k], NULL, 0, &r2, &n2, g2, NULL);
        assert_int_equal(rc1, rc2);
        uint64_t op = kgpu_rng_below(&rng, 10);
        if (rc1 == 0) {
            assert_int_equal(n1, n2);
            assert_memory_equal(g1, g2, sizeof(int) * (size_t)kinds[k].gpu_count);
        }
        if (rc1 == 0 && op < 6 && nheld < 256) {
            held[nheld++] = apply_ok(c, &plain[k], n1, g1);
        } else if (op < 9 && nheld > 0) {
            int j = (int)kgpu_rng_below(&rng, (uint64_t)nheld);
            assert_int_equal(kgpu_cluster_release(c, &held[j], NULL), 0);
            held[j] = held[--nheld];
        } else {
            int node = (int)kgpu_rng_below(&rng, 4);
            const kgpu_node *n = kgpu_cluster_node(c, node);
            int g = (int)kgpu_rng_below(&rng, (uint64_t)n->ngpus);
            kgpu_cluster_set_gpu_health(c, node, g, !n->gpus[g].healthy, NULL);
        }
    }
    assert_true(compared > 5000);
    state_close(&cached);
    state_close(&warm);
    kgpu_policy_free(pc);
    kgpu_policy_free(pu);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* Nodes added after the policy was made get cache room too (the first table holds 64). */
static void test_fgd_grows_with_cluster(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "n0", 32000, 2, V100);
    kgpu_workload w;
    study_workload(c, &w);
    kgpu_policy *p = policy_new("fgd", c, &w);
    kgpu_request half = share_req(c, 1000, 1, 500);
    half.shape = 3;
    char name[16];
    for (int i = 1; i < 150; i++) {
        snprintf(name, sizeof(name), "n%d", i);
        add_node(c, name, 32000, 2, V100);
    }
    /* Only the last node holds a half-used GPU: it is the one place without new fragments. */
    apply_ok(c, &half, 149, (int[]){1});
    int gpus[1];
    for (int k = 0; k < 3; k++) {
        assert_int_equal(select_node(p, c, &half, NULL, 0, (uint64_t)k, gpus), 149);
        assert_int_equal(gpus[0], 1);
    }
    int sc[3];
    node_scores(p, c, &half, (int[]){0, 149, 100}, 3, sc);
    assert_int_equal(sc[0], 0);
    assert_int_equal(sc[1], 10);
    assert_int_equal(sc[2], 0);
    kgpu_policy_free(p);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

static int cmp_i64_desc(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? 1 : a > b ? -1 : 0;
}

/*
 * 0-10 scores against a plain reference: ranks from the sorted distinct raw
 * scores, linear from min and max. Few distinct values (ties), many, huge
 * ones, nodes that do not fit.
 */
static void test_zero_to_ten(void **state)
{
    (void)state;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 21, 0);
    for (int round = 0; round < 3000; round++) {
        int n = (int)kgpu_rng_below(&rng, 60);
        int64_t raw[60], sorted[60];
        int spread = 1 + (int)kgpu_rng_below(&rng, round % 3 == 0 ? 5 : 100000);
        int nfit = 0;
        for (int k = 0; k < n; k++) {
            if (kgpu_rng_below(&rng, 6) == 0) {
                raw[k] = INT64_MIN;
                continue;
            }
            raw[k] = (int64_t)kgpu_rng_below(&rng, (uint64_t)spread) - spread / 2;
            if (kgpu_rng_below(&rng, 50) == 0)
                raw[k] = INT64_MIN + 1 + (int64_t)kgpu_rng_below(&rng, 3);
            sorted[nfit++] = raw[k];
        }
        qsort(sorted, (size_t)nfit, sizeof(*sorted), cmp_i64_desc);
        int64_t distinct[60];
        int nd = 0;
        for (int k = 0; k < nfit; k++)
            if (nd == 0 || sorted[k] != distinct[nd - 1])
                distinct[nd++] = sorted[k];
        int ranked[60], linear[60];
        kgpu__zero_to_ten(raw, n, true, ranked);
        kgpu__zero_to_ten(raw, n, false, linear);
        for (int k = 0; k < n; k++) {
            int want = 0;
            for (int d = 0; raw[k] != INT64_MIN && d < nd && d < 10; d++)
                if (distinct[d] == raw[k])
                    want = 10 - d;
            assert_int_equal(ranked[k], want);
            if (raw[k] == INT64_MIN) {
                assert_int_equal(linear[k], 0);
            } else if (nd == 1) {
                assert_int_equal(linear[k], 10);
            } else {
                double lo = (double)distinct[nd - 1], hi = (double)distinct[0];
                assert_int_equal(linear[k], (int)(((double)raw[k] - lo) * 10.0 / (hi - lo) + 0.5));
            }
        }
    }
}

/* Cache generations: O(1) until the stamp's width runs out, then a real clear. */
static void test_cache_generation(void **state)
{
    (void)state;
    uint16_t nodes[4] = {1, 2, 3, 4}, cache[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    uint32_t gen = 1;
    for (uint32_t want = 2; want <= UINT16_MAX; want++) {
        kgpu__cache_new_generation(&gen, UINT16_MAX, nodes, sizeof(nodes), cache, sizeof(cache));
        assert_int_equal(gen, want);
    }
    assert_int_equal(nodes[3], 4); /* untouched so far */
    kgpu__cache_new_generation(&gen, UINT16_MAX, nodes, sizeof(nodes), cache, sizeof(cache));
    assert_int_equal(gen, 1); /* never 0: zeroed entries stay empty */
    for (int i = 0; i < 4; i++)
        assert_int_equal(nodes[i], 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(cache[i], 0);
    gen = UINT32_MAX;
    kgpu__cache_new_generation(&gen, UINT32_MAX, NULL, 0, NULL, 0); /* no arrays yet */
    assert_int_equal(gen, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_bestfit),
        cmocka_unit_test(test_packing),
        cmocka_unit_test(test_clustering),
        cmocka_unit_test(test_dotprod),
        cmocka_unit_test(test_random_uniform),
        cmocka_unit_test(test_fgd_share_onto_half_gpu),
        cmocka_unit_test(test_fgd_whole_gpu_keeps_fresh_node),
        cmocka_unit_test(test_pick_best_fit),
        cmocka_unit_test(test_pick_random),
        cmocka_unit_test(test_policy_gpu_choice),
        cmocka_unit_test(test_select_errors_and_subsets),
        cmocka_unit_test(test_tie_order),
        cmocka_unit_test(test_node_scores),
        cmocka_unit_test(test_zero_to_ten),
        cmocka_unit_test(test_cache_generation),
        cmocka_unit_test(test_node_frag),
        cmocka_unit_test(test_workload_build),
        cmocka_unit_test(test_fit_all),
        cmocka_unit_test(test_place_keeps_later_containers_placeable),
        cmocka_unit_test(test_place_property),
        cmocka_unit_test(test_numa_local),
        cmocka_unit_test(test_binpack_spread),
        cmocka_unit_test(test_fgd_invalidate),
        cmocka_unit_test(test_fgd_cache_matches_uncached),
        cmocka_unit_test(test_fgd_grows_with_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
