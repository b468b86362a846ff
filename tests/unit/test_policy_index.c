/*
 * Unit tests of the index behind kgpu_policy_select (src/core/policy_index.c)
 * and the cluster's change journal it follows (model.c): for every policy,
 * in both tie modes, online and offline, a long random run of placements,
 * releases, GPU health changes and workload rebuilds decides exactly as the
 * scan of every node does: the same node, the same GPUs, the same random
 * numbers drawn.
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
#include "kgpu/policy.h"
#include "kgpu/rng.h"
#include "policy_fixtures.h"

static const char *const models[] = {"T4", "V100M32", "A10"};

/* Nodes of one model mostly; some of two (kgpu scores those afresh), some without GPUs. */
static void build_cluster(kgpu_cluster *c, int nodes, kgpu_rng *rng)
{
    for (int i = 0; i < nodes; i++) {
        char name[32];
        snprintf(name, sizeof(name), "n%03d", i);
        int kind = (int)kgpu_rng_below(rng, 20);
        int ngpus = kind == 0 ? 0 : (int)(1 + kgpu_rng_below(rng, 2)) * (kind < 8 ? 2 : 4);
        kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
        int m = (int)kgpu_rng_below(rng, 3);
        for (int k = 0; k < ngpus; k++)
            g[k] = (kgpu_gpu_spec){.index = k,
                                   .model = models[kind == 1 && k % 2 ? (m + 1) % 3 : m],
                                   .memory_mib = 32768,
                                   .numa = k < ngpus / 2 ? 0 : 1,
                                   .healthy = true};
        kgpu_node_spec s = {.name = name,
                            .cpu_milli = kind % 3 == 0 ? 32000 : 96000,
                            .memory_mib = 262144,
                            .gpus = g,
                            .ngpus = ngpus};
        kgpu_error e;
        if (kgpu_cluster_add_node(c, &s, &e) < 0)
            fail_msg("add_node: %s", e.msg);
    }
}

/* A request from a small set of shapes (so they repeat), some constrained to a model. */
static kgpu_request random_request(const kgpu_cluster *c, kgpu_rng *rng, const char **allow)
{
    static const int milli[] = {100, 250, 470, 500, 810};
    int k = (int)kgpu_rng_below(rng, 12);
    kgpu_request r = {.cpu_milli = 2000 * (int64_t)(1 + kgpu_rng_below(rng, 4)),
                      .memory_mib = 4096 * (int64_t)(1 + kgpu_rng_below(rng, 2)),
                      .shape = -1};
    if (k < 6) {
        r.gpu_count = 1;
        r.gpu_milli = milli[kgpu_rng_below(rng, 5)];
    } else if (k < 9) {
        r.gpu_count = 1 + (int)kgpu_rng_below(rng, 2);
        r.gpu_milli = KGPU_MILLI;
        r.exclusive = true;
    } else if (k < 10) {
        r.gpu_count = 2;
        r.gpu_milli = 500;
    }
    if (r.gpu_count > 0 && kgpu_rng_below(rng, 8) == 0) {
        *allow = models[kgpu_rng_below(rng, 3)];
        r.allow = allow;
        r.nallow = 1;
    }
    compile(c, &r);
    r.allow = NULL;
    r.nallow = 0;
    /* A shape id as the simulator gives one: equal for requests policies cannot tell apart. */
    if (kgpu_rng_below(rng, 4) != 0)
        r.shape = (int)((r.cpu_milli / 2000) * 1000 + r.gpu_count * 100 + r.gpu_milli / 10 +
                        (r.exclusive ? 50000 : 0) + (int64_t)(r.models & 7) * 100000);
    return r;
}

typedef struct side {
    kgpu_cluster *c;
    kgpu_policy *p;
    kgpu_learner *l;
    kgpu_rng rng;
    kgpu_assignment held[4096];
    int nheld;
} side;

static void side_open(side *s, const kgpu_cluster *tmpl, const char *policy, bool online,
                      const kgpu_workload *w, bool fixed, const uint32_t *rank, bool indexed)
{
    memset(s, 0, sizeof(*s));
    s->c = kgpu_cluster_clone(tmpl);
    assert_non_null(s->c);
    bool on = false;
    kgpu_error e;
    if (kgpu__policy_open(policy, online, s->c, w, &s->p, &s->l, &on, &e) != 0)
        fail_msg("policy %s: %s", policy, e.msg);
    if (fixed)
        kgpu_policy_set_tie_order(s->p, rank, kgpu_cluster_node_count(s->c));
    kgpu_policy_set_indexed(s->p, indexed);
    kgpu_rng_seed(&s->rng, 7, 3);
}

static void side_close(side *s)
{
    kgpu_policy_free(s->p);
    kgpu_learner_free(s->l);
    kgpu_cluster_free(s->c);
}

/* One decision on both sides: the same answer and the same numbers drawn. */
static void decide_both(side *a, side *b, const kgpu_request *r, const char *what, int step)
{
    kgpu_error ea, eb;
    assert_int_equal(kgpu__policy_learn(a->p, a->l, a->c, r, &ea), 0);
    assert_int_equal(kgpu__policy_learn(b->p, b->l, b->c, r, &eb), 0);
    int na = -1, nb = -1, ga[KGPU_MAX_GPUS_PER_NODE] = {0}, gb[KGPU_MAX_GPUS_PER_NODE] = {0};
    int ra = kgpu_policy_select(a->p, a->c, r, NULL, 0, &a->rng, &na, ga, &ea);
    int rb = kgpu_policy_select(b->p, b->c, r, NULL, 0, &b->rng, &nb, gb, &eb);
    if (ra != rb || na != nb || memcmp(ga, gb, sizeof(ga)) != 0 ||
        memcmp(&a->rng, &b->rng, sizeof(a->rng)) != 0)
        fail_msg("%s step %d: indexed chose %d (rc %d), scan %d (rc %d)", what, step, na, ra, nb,
                 rb);
    if (ra != 0 || a->nheld == 4096)
        return;
    /* Fitting by GPUs alone, the node's CPU may be short: applied clamped, as the extender does. */
    kgpu_request t = *r;
    const kgpu_node *n = kgpu_cluster_node(a->c, na);
    t.cpu_milli = t.cpu_milli < n->cpu_free ? t.cpu_milli : n->cpu_free;
    t.memory_mib = t.memory_mib < n->memory_free ? t.memory_mib : n->memory_free;
    if (kgpu_cluster_apply(a->c, &t, na, ga, &a->held[a->nheld], &ea) != 0 ||
        kgpu_cluster_apply(b->c, &t, nb, gb, &b->held[b->nheld], &eb) != 0)
        fail_msg("%s step %d: apply: %s / %s", what, step, ea.msg, eb.msg);
    a->nheld++;
    b->nheld++;
}

static void run_pair(const char *policy, bool online, bool fixed, uint64_t seed)
{
    kgpu_rng rng;
    kgpu_rng_seed(&rng, seed, 1);
    kgpu_cluster *tmpl = kgpu_cluster_new();
    assert_non_null(tmpl);
    build_cluster(tmpl, 150, &rng);
    int nn = kgpu_cluster_node_count(tmpl);
    uint32_t *rank = malloc((size_t)nn * sizeof(*rank));
    assert_non_null(rank);
    for (int i = 0; i < nn; i++)
        rank[i] = (uint32_t)i;
    for (int i = nn; i > 1; i--) {
        int j = (int)kgpu_rng_below(&rng, (uint64_t)i);
        uint32_t t = rank[i - 1];
        rank[i - 1] = rank[j];
        rank[j] = t;
    }
    /* A fixed target for the offline runs: the mix of 200 requests of the same kind. */
    kgpu_request reqs[200];
    const char *allow[200];
    for (int i = 0; i < 200; i++)
        reqs[i] = random_request(tmpl, &rng, &allow[i]);
    kgpu_workload w;
    kgpu_error e;
    if (kgpu_workload_build(reqs, 200, 0.95, &w, &e) != 0)
        fail_msg("workload: %s", e.msg);
    side *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
    assert_non_null(a);
    assert_non_null(b);
    side_open(a, tmpl, policy, online, &w, fixed, rank, true);
    side_open(b, tmpl, policy, online, &w, fixed, rank, false);
    char what[96];
    snprintf(what, sizeof(what), "%s%s, %s ties, seed %llu", policy, online ? " online" : "",
             fixed ? "fixed" : "random", (unsigned long long)seed);
    for (int step = 0; step < 1500; step++) {
        const char *al;
        kgpu_request r = random_request(a->c, &rng, &al);
        decide_both(a, b, &r, what, step);
        uint64_t ev = kgpu_rng_below(&rng, 100);
        if (ev < 15 && a->nheld > 0) { /* a pod leaves */
            int k = (int)kgpu_rng_below(&rng, (uint64_t)a->nheld);
            assert_int_equal(kgpu_cluster_release(a->c, &a->held[k], NULL), 0);
            assert_int_equal(kgpu_cluster_release(b->c, &b->held[k], NULL), 0);
            a->held[k] = a->held[--a->nheld];
            b->held[k] = b->held[--b->nheld];
        } else if (ev < 17) { /* a GPU fails or comes back */
            int n = (int)kgpu_rng_below(&rng, (uint64_t)nn);
            const kgpu_node *node = kgpu_cluster_node(a->c, n);
            if (node->ngpus > 0) {
                int g = (int)kgpu_rng_below(&rng, (uint64_t)node->ngpus);
                bool h = !node->gpus[g].healthy;
                assert_int_equal(kgpu_cluster_set_gpu_health(a->c, n, g, h, NULL), 0);
                assert_int_equal(kgpu_cluster_set_gpu_health(b->c, n, g, h, NULL), 0);
            }
        } else if (ev < 18) { /* the target changed in place, as a learner's does */
            kgpu_policy_invalidate(a->p);
            kgpu_policy_invalidate(b->p);
        } else if (ev < 19 && step > 700 && step < 720) { /* fit by GPUs alone, as the extender */
            kgpu_policy_set_fit_cpu(a->p, false);
            kgpu_policy_set_fit_cpu(b->p, false);
        } else if (ev < 19 && step >= 720) {
            kgpu_policy_set_fit_cpu(a->p, true);
            kgpu_policy_set_fit_cpu(b->p, true);
        }
    }
    side_close(a);
    side_close(b);
    free(a);
    free(b);
    kgpu_workload_free(&w);
    free(rank);
    kgpu_cluster_free(tmpl);
}

static void test_every_policy_decides_as_the_scan(void **state)
{
    (void)state;
    const kgpu_policy_ops *const *ops = kgpu_policy_list();
    for (int i = 0; ops[i] != NULL; i++)
        for (int fixed = 0; fixed < 2; fixed++) {
            run_pair(ops[i]->name, false, fixed, 11 + (uint64_t)i);
            if (strcmp(ops[i]->name, "fgd") == 0)
                run_pair(ops[i]->name, true, fixed, 31 + (uint64_t)i);
        }
}

/* The journal names the node of each change while it holds it, and says when it no longer does. */
static void test_journal(void **state)
{
    (void)state;
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    add_node(c, "a", 64000, 2, "T4");
    add_node(c, "b", 64000, 2, "T4");
    assert_int_equal(kgpu__cluster_seq(c), 0);
    assert_int_equal(kgpu__cluster_changed(c, 1), -1);
    kgpu_request r = cpu_req(c, 1);
    kgpu_assignment as[2];
    apply_ok(c, &r, 1, NULL);
    as[0] = apply_ok(c, &r, 0, NULL);
    (void)as;
    assert_int_equal(kgpu__cluster_seq(c), 2);
    assert_int_equal(kgpu__cluster_changed(c, 1), 1);
    assert_int_equal(kgpu__cluster_changed(c, 2), 0);
    assert_int_equal(kgpu__cluster_changed(c, 3), -1);
    assert_int_equal(kgpu_cluster_set_gpu_health(c, 1, 0, false, NULL), 0);
    assert_int_equal(kgpu__cluster_changed(c, 3), 1);
    for (int i = 0; i < KGPU__JOURNAL; i++) {
        kgpu_assignment a = apply_ok(c, &r, 0, NULL);
        assert_int_equal(kgpu_cluster_release(c, &a, NULL), 0);
    }
    assert_int_equal(kgpu__cluster_changed(c, 3), -1); /* overrun: the caller looks at all */
    assert_int_equal(kgpu__cluster_changed(c, kgpu__cluster_seq(c)), 0);
    kgpu_cluster_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_policy_decides_as_the_scan),
        cmocka_unit_test(test_journal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
