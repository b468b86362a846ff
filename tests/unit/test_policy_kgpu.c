/*
 * Unit tests of the kgpu policy (src/core/policy_kgpu.c) and the online
 * workload learner (src/core/learner.c): hand-built clusters where kgpu must
 * choose a given node or GPU and why (CPU stranding, packing, scarce models),
 * learning only from the past, its caches against uncached and reference
 * arithmetic, and determinism of a simulated run for a seed.
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
#include "kgpu/sim.h"
#include "policy_fixtures.h"

#define V100 "V100"
#define T4   "T4"

/* ---- helpers ------------------------------------------------------------------------------ */

static kgpu_request share_req(const kgpu_cluster *c, int64_t cpu, int milli)
{
    kgpu_request r = {.cpu_milli = cpu, .gpu_count = 1, .gpu_milli = milli, .shape = -1};
    compile(c, &r);
    return r;
}

static kgpu_learner *learner_new(void)
{
    kgpu_error e;
    kgpu_learner *l = kgpu_learner_new(0.95, NULL, 0, &e);
    if (l == NULL)
        fail_msg("learner: %s", e.msg);
    return l;
}

/*
 * A kgpu policy that has seen `past` (n pods) arrive, as the simulator and
 * the extender drive it: each pod counted by the learner (invalidating the
 * policy when the target is rebuilt) and observed by the policy.
 */
static kgpu_policy *kgpu_after(const kgpu_cluster *c, kgpu_learner *l, const kgpu_request *past,
                               int n)
{
    kgpu_error e;
    kgpu_policy *p = kgpu_policy_new("kgpu", c, kgpu_learner_workload(l), &e);
    if (p == NULL)
        fail_msg("kgpu: %s", e.msg);
    for (int i = 0; i < n; i++) {
        if (kgpu_learner_observe(l, &past[i]) == 1)
            kgpu_policy_invalidate(p);
        kgpu_policy_observe(p, c, &past[i]);
    }
    return p;
}

/* The node chosen for r with uniformly random ties (kube-scheduler's way), seeded. */
static int choose(kgpu_policy *p, const kgpu_cluster *c, const kgpu_request *r, uint64_t seed,
                  int *gpus)
{
    kgpu_rng rng;
    kgpu_rng_seed(&rng, seed, 0);
    int node = -1, dummy[KGPU_MAX_GPUS_PER_NODE];
    kgpu_error e;
    if (kgpu_policy_select(p, c, r, NULL, 0, &rng, &node, gpus ? gpus : dummy, &e) != 0)
        fail_msg("select: %s", e.msg);
    return node;
}

/* ---- the learner -------------------------------------------------------------------------- */

static void test_learner(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "n", 64000, 4, V100);
    kgpu_learner *l = learner_new();
    /* Before any pod: a generic guess, never empty. */
    const kgpu_workload *w = kgpu_learner_workload(l);
    assert_true(w->n > 0);
    assert_int_equal(kgpu_learner_count(l), 0);

    kgpu_request half = share_req(c, 2000, 500), whole = whole_req(c, 8000, 1);
    /* The first pod replaces the guess: the workload is what was seen, nothing else. */
    assert_int_equal(kgpu_learner_observe(l, &half), 1);
    assert_ptr_equal(kgpu_learner_workload(l), w); /* same address, new contents */
    assert_int_equal(w->n, 1);
    assert_int_equal(w->shapes[0].gpu_milli, 500);
    assert_int_equal(w->shapes[0].cpu_milli, 2000);
    assert_float_equal(w->shapes[0].p, 1.0, 1e-12);

    /* Rebuilt each time the count grew by a tenth: about log(N)/log(1.1) times. */
    int rebuilds = 0;
    for (int i = 1; i < 1000; i++)
        rebuilds += kgpu_learner_observe(l, i % 4 ? &half : &whole);
    assert_int_equal(kgpu_learner_count(l), 1000);
    assert_true(rebuilds > 40 && rebuilds < 90);
    assert_int_equal(w->n, 2);
    assert_float_equal(w->shapes[0].p, 750.0 / 1000, 0.002);
    assert_int_equal(w->shapes[1].gpu_milli, KGPU_MILLI);
    kgpu_learner_free(l);

    /* An operator's prior counts as prior_pods pods and keeps its weight. */
    kgpu_shape ps[] = {
        {.cpu_milli = 4000, .gpu_milli = 250, .gpu_count = 1, .models = ~0ULL, .p = 1.0}};
    kgpu_workload prior = {ps, 1};
    kgpu_error e;
    l = kgpu_learner_new(1.0, &prior, 100, &e);
    assert_non_null(l);
    w = kgpu_learner_workload(l);
    assert_int_equal(w->n, 1);
    assert_int_equal(w->shapes[0].gpu_milli, 250);
    for (int i = 0; i < 100; i++)
        kgpu_learner_observe(l, &half);
    /* The last rebuild saw 92 to 100 pods: the prior weighs 100 / (100 + that). */
    assert_int_equal(w->n, 2);
    for (int s = 0; s < w->n; s++) {
        double prior_p = w->shapes[s].gpu_milli == 250 ? w->shapes[s].p : 1.0 - w->shapes[s].p;
        assert_true(prior_p >= 0.499 && prior_p <= 0.522);
    }
    kgpu_learner_free(l);
    kgpu_learner_free(NULL);

    assert_null(kgpu_learner_new(0, NULL, 0, &e));
    assert_int_equal(e.code, KGPU_EINVAL);
    assert_null(kgpu_learner_new(0.95, &prior, 0, &e));
    assert_int_equal(e.code, KGPU_EINVAL);
    kgpu_cluster_free(c);
}

/* ---- learning only from the past ---------------------------------------------------------- */

/*
 * So far only one-GPU pods have come; later, two-GPU pods will dominate. A
 * one-GPU pod between node A (2 free GPUs) and B (3 free GPUs): for the past,
 * both keep every shape placeable, and packing picks A; a policy that knew the
 * future would keep A's pair for a two-GPU pod and pick B. kgpu, fed arrivals
 * as they come, must pick A: it cannot know what has not arrived.
 */
static void test_learns_only_the_past(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int a = add_node(c, "a", 64000, 2, V100);
    int b = add_node(c, "b", 64000, 3, V100);
    kgpu_request one = whole_req(c, 4000, 1), two = whole_req(c, 8000, 2);
    kgpu_request past[50], all[250];
    for (int i = 0; i < 50; i++)
        past[i] = all[i] = one;
    for (int i = 50; i < 250; i++)
        all[i] = two; /* the future, heavy with two-GPU pods */

    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_after(c, l, past, 50);
    for (uint64_t seed = 0; seed < 20; seed++)
        assert_int_equal(choose(p, c, &one, seed, NULL), a);
    kgpu_policy_free(p);
    kgpu_learner_free(l);

    /* The test can tell: with the future known, the choice is B. */
    l = learner_new();
    p = kgpu_after(c, l, all, 250);
    for (uint64_t seed = 0; seed < 20; seed++)
        assert_int_equal(choose(p, c, &one, seed, NULL), b);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

/* ---- CPU stranding ------------------------------------------------------------------------ */

/*
 * Node G has 8 GPUs and 96 cores, 12 per GPU, just what the GPU pods seen so
 * far ask for; node T has 2 GPUs and 104 cores. A 16-core CPU-only pod on G
 * would leave 80 cores for 8 GPUs: more than one GPU's worth of pods could
 * no longer get CPU. On T it strands nothing. FGD's measure sees no
 * difference (every shape still fits on both), so fgd leaves it to the
 * tie-break; kgpu must choose T every time.
 */
static void test_cpu_pod_goes_where_cpu_is_spare(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int g = add_node(c, "g", 96000, 8, V100);
    int t = add_node(c, "t", 104000, 2, T4);
    kgpu_request gpu_pod = whole_req(c, 12000, 1), cpu_pod = cpu_req(c, 16000);
    kgpu_request past[40];
    for (int i = 0; i < 40; i++)
        past[i] = i % 8 ? gpu_pod : cpu_pod;
    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_after(c, l, past, 40);
    for (uint64_t seed = 0; seed < 20; seed++)
        assert_int_equal(choose(p, c, &cpu_pod, seed, NULL), t);

    /* fgd, against the same workload, scores both nodes alike: a tie. */
    kgpu_error e;
    kgpu_policy *f = kgpu_policy_new("fgd", c, kgpu_learner_workload(l), &e);
    assert_non_null(f);
    int scores[2];
    assert_int_equal(kgpu_policy_node_scores(f, c, &cpu_pod, (int[]){g, t}, 2, scores, &e), 0);
    assert_int_equal(scores[0], scores[1]);
    int seen[2] = {0};
    for (uint64_t seed = 0; seed < 40; seed++)
        seen[choose(f, c, &cpu_pod, seed, NULL)]++;
    assert_true(seen[g] > 0 && seen[t] > 0);
    kgpu_policy_free(f);

    /*
     * Once T's spare CPU is used up (24 cores left for its 2 GPUs), another
     * CPU pod would strand 1.3 GPUs on either node, and on T no GPU pod seen
     * so far would fit at all: G.
     */
    for (int i = 0; i < 5; i++)
        apply_ok(c, &cpu_pod, t, NULL);
    for (uint64_t seed = 0; seed < 20; seed++)
        assert_int_equal(choose(p, c, &cpu_pod, seed, NULL), g);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

/* ---- packing ------------------------------------------------------------------------------ */

/*
 * Four identical nodes, one of them already running a pod. Equal in FGD's
 * eyes (a quarter GPU on a fresh GPU anywhere), but kgpu prefers the node in
 * use, so the other three stay whole for pods that need a whole node. With
 * random ties, every seed.
 */
static void test_packs_onto_nodes_in_use(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        add_node(c, name, 64000, 4, V100);
    }
    kgpu_request quarter = share_req(c, 2000, 250), whole = whole_req(c, 8000, 1);
    kgpu_request past[40];
    for (int i = 0; i < 40; i++)
        past[i] = i % 2 ? quarter : whole;
    apply_ok(c, &whole, 2, (int[]){0});
    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_after(c, l, past, 40);
    for (uint64_t seed = 0; seed < 20; seed++) {
        assert_int_equal(choose(p, c, &quarter, seed, NULL), 2);
        assert_int_equal(choose(p, c, &whole, seed, NULL), 2);
    }
    /* Identical nodes tie exactly, so the tie-break (here the study's order) decides among them. */
    kgpu_cluster *fresh = kgpu_cluster_new();
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "m%d", i);
        add_node(fresh, name, 64000, 4, V100);
    }
    kgpu_learner *lq = learner_new();
    kgpu_policy *q = kgpu_after(fresh, lq, NULL, 0);
    int scores[3];
    kgpu_error e;
    kgpu_request fq = share_req(fresh, 2000, 250);
    assert_int_equal(kgpu_policy_node_scores(q, fresh, &fq, (int[]){0, 1, 2}, 3, scores, &e), 0);
    assert_int_equal(scores[0], 10);
    assert_int_equal(scores[1], 10);
    assert_int_equal(scores[2], 10);
    kgpu_policy_free(q);
    kgpu_learner_free(lq);
    kgpu_cluster_free(fresh);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

/*
 * The extender's 0-10 scores for kgpu are ranks: the best node 10, the next
 * distinct raw score 9... (linear when forced). With the fit check's CPU off
 * (the extender: kube-scheduler checks CPU), a node short of CPU is still
 * scored and selectable, only worse.
 */
static void test_rank_scores_and_fit_without_cpu(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        add_node(c, name, 64000, 4, V100);
    }
    kgpu_request whole = whole_req(c, 1000, 1), hog = cpu_req(c, 60000);
    apply_ok(c, &whole, 1, (int[]){0});
    apply_ok(c, &whole, 2, (int[]){0});
    apply_ok(c, &whole, 2, (int[]){1});
    apply_ok(c, &hog, 3, NULL);
    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_after(c, l, NULL, 0);
    kgpu_request r = share_req(c, 8000, 250);
    int all[4] = {0, 1, 2, 3}, sc[4];
    kgpu_error e;
    assert_int_equal(kgpu_policy_node_scores(p, c, &r, all, 4, sc, &e), 0);
    assert_int_equal(sc[3], 0); /* 4000 CPU free of 8000 asked: does not fit */
    int sorted[3] = {sc[0], sc[1], sc[2]};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (sorted[j] > sorted[i]) {
                int t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    assert_int_equal(sorted[0], 10);
    assert_int_equal(sorted[1], 9);
    assert_int_equal(sorted[2], 8);
    kgpu_policy_set_linear_scores(p, true);
    assert_int_equal(kgpu_policy_node_scores(p, c, &r, all, 3, sc, &e), 0);
    assert_true(sc[0] == 10 || sc[1] == 10 || sc[2] == 10);
    assert_true(sc[0] == 0 || sc[1] == 0 || sc[2] == 0); /* the worst is 0 when scaled */
    kgpu_policy_set_linear_scores(p, false);

    int node, gpus[KGPU_MAX_GPUS_PER_NODE];
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 1, 0);
    assert_int_equal(kgpu_policy_select(p, c, &r, (int[]){3}, 1, &rng, &node, gpus, &e),
                     KGPU_ENOFIT);
    kgpu_policy_set_fit_cpu(p, false);
    assert_int_equal(kgpu_policy_node_scores(p, c, &r, all, 4, sc, &e), 0);
    assert_true(sc[3] > 0 && sc[3] < 10); /* scored, and worse than the best */
    assert_int_equal(kgpu_policy_select(p, c, &r, (int[]){3}, 1, &rng, &node, gpus, &e), 0);
    assert_int_equal(node, 3);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

/*
 * On one node, a half-GPU share goes to the GPU it completes (500 free of a
 * half already taken), not to a fresh GPU that whole-GPU pods could use.
 */
static void test_share_completes_a_gpu(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int n = add_node(c, "n", 64000, 4, V100);
    kgpu_request half = share_req(c, 2000, 500), whole = whole_req(c, 8000, 1);
    kgpu_request past[40];
    for (int i = 0; i < 40; i++)
        past[i] = i % 2 ? half : whole;
    apply_ok(c, &half, n, (int[]){2});
    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_after(c, l, past, 40);
    int gpus[1];
    assert_int_equal(choose(p, c, &half, 3, gpus), n);
    assert_int_equal(gpus[0], 2);
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

/* ---- scarce models ------------------------------------------------------------------------ */

/*
 * A T4 node and a V100 node, alike otherwise. Before any constrained pod,
 * an unconstrained pod may go to either. Then 5 % of the pods seen can run
 * only on T4, each of a different size, so that none is frequent enough to
 * enter FGD's target workload (95 % coverage): FGD's measure cannot see that
 * demand, kgpu's scarcity does, and an unconstrained pod leaves the T4 alone.
 */
static void test_spares_scarce_models(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int t4 = add_node(c, "t4", 64000, 4, T4);
    int v100 = add_node(c, "v100", 64000, 4, V100);
    const char *only_t4[] = {T4};
    kgpu_request any = whole_req(c, 8000, 1);
    kgpu_request past[200];
    for (int i = 0; i < 200; i++)
        past[i] = any;
    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_after(c, l, past, 200);
    int seen[2] = {0};
    for (uint64_t seed = 0; seed < 40; seed++)
        seen[choose(p, c, &any, seed, NULL)]++;
    assert_true(seen[t4] > 0 && seen[v100] > 0); /* nothing to tell them apart */
    kgpu_policy_free(p);
    kgpu_learner_free(l);

    kgpu_request t4_pod;
    for (int i = 0; i < 10; i++) {
        t4_pod = (kgpu_request){.cpu_milli = 1000 * (i + 1),
                                .gpu_count = 1,
                                .gpu_milli = KGPU_MILLI,
                                .exclusive = true,
                                .allow = only_t4,
                                .nallow = 1,
                                .shape = -1};
        compile(c, &t4_pod);
        past[20 * i + 7] = t4_pod;
    }
    l = learner_new();
    p = kgpu_after(c, l, past, 200);
    const kgpu_workload *w = kgpu_learner_workload(l);
    for (int s = 0; s < w->n; s++)
        assert_int_equal(w->shapes[s].models, any.models); /* the T4 pods are not in the target */
    for (uint64_t seed = 0; seed < 20; seed++) {
        assert_int_equal(choose(p, c, &any, seed, NULL), v100);
        assert_int_equal(choose(p, c, &t4_pod, seed, NULL), t4); /* and they still get it */
    }
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

/* ---- caches and arithmetic ---------------------------------------------------------------- */

/* CPU milli the workload asks per GPU milli, as kgpu learns it. */
static double cpu_per_milli(const kgpu_workload *w)
{
    double cpu = 0, gpu = 0;
    for (int s = 0; s < w->n; s++)
        if (w->shapes[s].gpu_milli > 0) {
            cpu += w->shapes[s].p * (double)w->shapes[s].cpu_milli;
            gpu += w->shapes[s].p * w->shapes[s].gpu_milli * w->shapes[s].gpu_count;
        }
    return gpu > 0 ? cpu / gpu : 0;
}

/* The documented value of a node state: FGD's fragmentation plus stranded GPU milli. */
static double ref_value(const kgpu_node *n, const kgpu_workload *w, const int *fm, int64_t cpu)
{
    double v = kgpu_node_frag(n, w, fm, cpu), idle = 0, rho = cpu_per_milli(w);
    for (int i = 0; i < n->ngpus; i++)
        idle += n->gpus[i].healthy ? fm[i] : 0;
    if (idle > 0 && rho > 0 && (double)cpu / rho < idle)
        v += idle - (double)cpu / rho;
    return v;
}

/* The documented score of taking take[i] milli from each GPU i and cpu CPU (no scarcity known). */
static int64_t ref_score(const kgpu_node *n, const kgpu_workload *w, const int *take, int64_t cpu)
{
    int before[KGPU_MAX_GPUS_PER_NODE], after[KGPU_MAX_GPUS_PER_NODE];
    double idle = 0;
    for (int i = 0; i < n->ngpus; i++) {
        before[i] = n->gpus[i].free_milli;
        after[i] = before[i] - take[i];
        idle += n->gpus[i].healthy ? after[i] : 0;
    }
    int64_t cpu_after = n->cpu_free - cpu;
    double used = 1.0 - (double)cpu_after / (double)n->cpu_milli;
    if (n->ngpus > 0)
        used = 0.5 * (1.0 - idle / (n->ngpus * 1000.0)) + 0.5 * used;
    double s =
        ref_value(n, w, before, n->cpu_free) - ref_value(n, w, after, cpu_after) + 20.0 * used;
    return (int64_t)llround(s * 1000.0);
}

static void test_cache_matches_uncached_and_reference(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "v4", 32000, 4, V100);
    add_node(c, "t2", 16000, 2, T4);
    const char *mixed[] = {V100, T4, V100};
    kgpu_gpu_spec gs[3];
    for (int i = 0; i < 3; i++)
        gs[i] = (kgpu_gpu_spec){
            .index = i, .model = mixed[i], .memory_mib = 32768, .numa = -1, .healthy = true};
    kgpu_node_spec ms = {
        .name = "mix3", .cpu_milli = 24000, .memory_mib = 1 << 20, .gpus = gs, .ngpus = 3};
    assert_true(kgpu_cluster_add_node(c, &ms, NULL) >= 0);
    add_node(c, "v8", 64000, 8, V100);
    const char *v100[] = {V100};

    kgpu_request kinds[] = {
        share_req(c, 1000, 500),
        whole_req(c, 2000, 1),
        share_req(c, 1000, 250),
        whole_req(c, 4000, 2),
        cpu_req(c, 3000),
        share_req(c, 3000, 750),
        whole_req(c, 8000, 4),
        {.cpu_milli = 1000, .gpu_count = 1, .gpu_milli = 400, .allow = v100, .nallow = 1},
    };
    enum { NK = sizeof(kinds) / sizeof(kinds[0]) };
    compile(c, &kinds[NK - 1]);
    kgpu_request shaped[NK], plain[NK];
    for (int k = 0; k < NK; k++) {
        shaped[k] = plain[k] = kinds[k];
        shaped[k].shape = k == 2 ? 130 : k; /* 2 and 130 share a cache slot */
        plain[k].shape = -1;
    }
    kgpu_request wreqs[40];
    for (int i = 0; i < 40; i++)
        wreqs[i] = kinds[i % 7 == 6 ? 1 : i % 5];
    kgpu_workload w;
    kgpu_error e;
    assert_int_equal(kgpu_workload_build(wreqs, 40, 0.95, &w, &e), 0);

    state_handle cached = state_open("kgpu", c, &w), warm = state_open("kgpu", c, &w);
    kgpu_assignment held[256];
    int nheld = 0, compared = 0;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 77, 0);
    for (int step = 0; step < 300; step++) {
        state_handle fresh = state_open("kgpu", c, &w);
        for (int k = 0; k < NK; k++) {
            for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
                const kgpu_node *n = kgpu_cluster_node(c, i);
                if (!kgpu__fit(n, &plain[k]))
                    continue;
                int64_t s1 = cached.ops->score(cached.state, c, i, &shaped[k]);
                int64_t s2 = warm.ops->score(warm.state, c, i, &plain[k]);
                int64_t s3 = fresh.ops->score(fresh.state, c, i, &plain[k]);
                if (s1 != s2 || s1 != s3)
                    fail_msg("step %d kind %d node %d: cached %lld, uncached %lld, fresh %lld",
                             step, k, i, (long long)s1, (long long)s2, (long long)s3);
                int take[KGPU_MAX_GPUS_PER_NODE] = {0};
                if (kinds[k].gpu_count > 0) {
                    int g1[KGPU_MAX_GPUS_PER_NODE], g2[KGPU_MAX_GPUS_PER_NODE];
                    assert_int_equal(
                        cached.ops->pick_gpus(cached.state, c, i, &shaped[k], &rng, g1), 0);
                    assert_int_equal(fresh.ops->pick_gpus(fresh.state, c, i, &plain[k], &rng, g2),
                                     0);
                    assert_memory_equal(g1, g2, sizeof(int) * (size_t)kinds[k].gpu_count);
                    for (int g = 0; g < kinds[k].gpu_count; g++)
                        take[g1[g]] = kinds[k].exclusive ? KGPU_MILLI : kinds[k].gpu_milli;
                }
                /* The incremental arithmetic gives the documented figure... */
                int64_t want = ref_score(n, &w, take, kinds[k].cpu_milli);
                if (s1 != want)
                    fail_msg("step %d kind %d node %d: score %lld, reference %lld", step, k, i,
                             (long long)s1, (long long)want);
                /* ...and a share's GPU is the best of the node's. */
                if (kinds[k].gpu_count == 1 && !kinds[k].exclusive)
                    for (int g = 0; g < n->ngpus; g++) {
                        if (!kgpu_gpu_usable(n, &n->gpus[g], &plain[k]))
                            continue;
                        int t2[KGPU_MAX_GPUS_PER_NODE] = {0};
                        t2[g] = kinds[k].gpu_milli;
                        assert_true(ref_score(n, &w, t2, kinds[k].cpu_milli) <= s1);
                    }
                compared++;
            }
        }
        state_close(&fresh);

        int k = (int)kgpu_rng_below(&rng, NK);
        uint64_t op = kgpu_rng_below(&rng, 10);
        int nodes = kgpu_cluster_node_count(c);
        int node = (int)kgpu_rng_below(&rng, (uint64_t)nodes);
        int gpus[KGPU_MAX_GPUS_PER_NODE];
        if (op < 6 && nheld < 256 && kgpu__fit(kgpu_cluster_node(c, node), &plain[k]) &&
            (plain[k].gpu_count == 0 ||
             kgpu__pick_best_fit(kgpu_cluster_node(c, node), &plain[k], gpus) == 0)) {
            held[nheld++] = apply_ok(c, &plain[k], node, gpus);
        } else if (op < 9 && nheld > 0) {
            int j = (int)kgpu_rng_below(&rng, (uint64_t)nheld);
            assert_int_equal(kgpu_cluster_release(c, &held[j], NULL), 0);
            held[j] = held[--nheld];
        } else {
            const kgpu_node *n = kgpu_cluster_node(c, node);
            int g = (int)kgpu_rng_below(&rng, (uint64_t)n->ngpus);
            kgpu_cluster_set_gpu_health(c, node, g, !n->gpus[g].healthy, NULL);
        }
    }
    assert_true(compared > 3000);
    state_close(&cached);
    state_close(&warm);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/*
 * Scarcity changes without any node changing: the cache must not serve stale
 * scores. Cached (shape ids) and uncached states see the same arrivals,
 * constrained ones among them, and must agree on every node, mixed-model
 * nodes included; the T4 node's scores must drop once T4-only pods are seen.
 */
static void test_scarcity_bypasses_the_cache(void **state)
{
    kgpu_cluster *c = kgpu_cluster_new();
    int t4 = add_node(c, "t4", 64000, 4, T4);
    add_node(c, "v100", 64000, 4, V100);
    const char *mixed[] = {V100, T4};
    kgpu_gpu_spec gs[2];
    for (int i = 0; i < 2; i++)
        gs[i] = (kgpu_gpu_spec){
            .index = i, .model = mixed[i], .memory_mib = 32768, .numa = -1, .healthy = true};
    kgpu_node_spec ms = {
        .name = "mix", .cpu_milli = 64000, .memory_mib = 1 << 20, .gpus = gs, .ngpus = 2};
    assert_true(kgpu_cluster_add_node(c, &ms, NULL) >= 0);
    const char *only_t4[] = {T4};
    kgpu_request kinds[] = {share_req(c, 2000, 500), whole_req(c, 8000, 1), cpu_req(c, 4000)};
    enum { NK = sizeof(kinds) / sizeof(kinds[0]) };
    kgpu_request t4_pod = {.cpu_milli = 8000,
                           .gpu_count = 1,
                           .gpu_milli = KGPU_MILLI,
                           .exclusive = true,
                           .allow = only_t4,
                           .nallow = 1,
                           .shape = -1};
    compile(c, &t4_pod);
    kgpu_workload w;
    kgpu_error e;
    assert_int_equal(kgpu_workload_build(kinds, NK, 1.0, &w, &e), 0);
    state_handle cached = state_open("kgpu", c, &w), plain = state_open("kgpu", c, &w);
    int64_t before[NK];
    for (int round = 0; round < 200; round++) {
        for (int k = 0; k < NK; k++) {
            kgpu_request shaped = kinds[k];
            shaped.shape = k;
            for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
                if (!kgpu__fit(kgpu_cluster_node(c, i), &kinds[k]))
                    continue;
                int64_t s1 = cached.ops->score(cached.state, c, i, &shaped);
                int64_t s2 = plain.ops->score(plain.state, c, i, &kinds[k]);
                if (s1 != s2)
                    fail_msg("round %d kind %d node %d: cached %lld, uncached %lld", round, k, i,
                             (long long)s1, (long long)s2);
                if (round == 0 && i == t4)
                    before[k] = s1;
                if (round == 199 && i == t4 && kinds[k].gpu_count > 0)
                    assert_true(s1 < before[k]); /* T4 got dearer for unconstrained pods */
                if (round == 199 && i == t4 && kinds[k].gpu_count == 0)
                    assert_true(s1 == before[k]); /* CPU takes no GPU model */
            }
        }
        const kgpu_request *arrived = round % 5 == 4 ? &t4_pod : &kinds[round % NK];
        cached.ops->observe(cached.state, c, arrived);
        plain.ops->observe(plain.state, c, arrived);
    }
    state_close(&cached);
    state_close(&plain);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/*
 * kgpu recounts free compute per model from the cluster's journal, only the
 * nodes changed since its last count. A state that follows c must score as
 * one that counts every node at every count (it sees a fresh clone of c each
 * time, with no journal it could follow), through arrivals of constrained
 * pods (which start the counts, one per 64 pods), placements, releases and
 * GPU health changes; fewer changes between counts than nodes, so the
 * journal is followed, not given up.
 */
static void test_free_count_follows_the_journal(void **state)
{
    (void)state;
    kgpu_cluster *c = kgpu_cluster_new();
    const char *mixed[] = {V100, T4};
    kgpu_gpu_spec gs[2];
    for (int i = 0; i < 2; i++)
        gs[i] = (kgpu_gpu_spec){
            .index = i, .model = mixed[i], .memory_mib = 32768, .numa = -1, .healthy = true};
    for (int i = 0; i < 120; i++) {
        char name[16];
        snprintf(name, sizeof(name), "n%d", i);
        if (i % 3 == 2) {
            kgpu_node_spec ms = {
                .name = name, .cpu_milli = 64000, .memory_mib = 1 << 20, .gpus = gs, .ngpus = 2};
            assert_true(kgpu_cluster_add_node(c, &ms, NULL) >= 0);
        } else {
            add_node(c, name, 64000, i % 3 == 0 ? 4 : 8, i % 3 == 0 ? T4 : V100);
        }
    }
    const char *only_t4[] = {T4};
    kgpu_request t4_pod = {.cpu_milli = 4000,
                           .gpu_count = 1,
                           .gpu_milli = 600,
                           .allow = only_t4,
                           .nallow = 1,
                           .shape = -1};
    compile(c, &t4_pod);
    kgpu_request kinds[] = {share_req(c, 2000, 500), whole_req(c, 8000, 1), cpu_req(c, 4000),
                            t4_pod};
    enum { NK = sizeof(kinds) / sizeof(kinds[0]), ROUNDS = 400 };
    kgpu_workload w;
    kgpu_error e;
    assert_int_equal(kgpu_workload_build(kinds, NK, 1.0, &w, &e), 0);
    state_handle follows = state_open("kgpu", c, &w), counts = state_open("kgpu", c, &w);
    kgpu_cluster *clones[ROUNDS];
    kgpu_assignment held[ROUNDS];
    int nheld = 0;
    long compared = 0;
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 5, 0);
    for (int round = 0; round < ROUNDS; round++) {
        int k = (int)kgpu_rng_below(&rng, NK);
        int node = (int)kgpu_rng_below(&rng, (uint64_t)kgpu_cluster_node_count(c));
        uint64_t op = kgpu_rng_below(&rng, 10);
        int gpus[KGPU_MAX_GPUS_PER_NODE];
        const kgpu_node *n = kgpu_cluster_node(c, node);
        if (op < 6 && kgpu__fit(n, &kinds[k]) &&
            (kinds[k].gpu_count == 0 || kgpu__pick_best_fit(n, &kinds[k], gpus) == 0)) {
            held[nheld++] = apply_ok(c, &kinds[k], node, gpus);
        } else if (op < 9 && nheld > 0) {
            int j = (int)kgpu_rng_below(&rng, (uint64_t)nheld);
            assert_int_equal(kgpu_cluster_release(c, &held[j], NULL), 0);
            held[j] = held[--nheld];
        } else {
            int g = (int)kgpu_rng_below(&rng, (uint64_t)n->ngpus);
            kgpu_cluster_set_gpu_health(c, node, g, !n->gpus[g].healthy, NULL);
        }
        clones[round] = kgpu_cluster_clone(c);
        assert_non_null(clones[round]);
        const kgpu_request *arrived = round % 3 == 0 ? &t4_pod : &kinds[round % NK];
        follows.ops->observe(follows.state, c, arrived);
        counts.ops->observe(counts.state, clones[round], arrived);
        for (int q = 0; q < NK; q++)
            for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
                if (!kgpu__fit(kgpu_cluster_node(c, i), &kinds[q]))
                    continue;
                int64_t s1 = follows.ops->score(follows.state, c, i, &kinds[q]);
                int64_t s2 = counts.ops->score(counts.state, clones[round], i, &kinds[q]);
                if (s1 != s2)
                    fail_msg("round %d kind %d node %d: journal %lld, full count %lld", round, q,
                             i, (long long)s1, (long long)s2);
                compared++;
            }
    }
    assert_true(compared > 50000);
    for (int round = 0; round < ROUNDS; round++)
        kgpu_cluster_free(clones[round]);
    state_close(&follows);
    state_close(&counts);
    kgpu_workload_free(&w);
    kgpu_cluster_free(c);
}

/* ---- the registry and the simulator ------------------------------------------------------- */

static void test_registered_online_only(void **state)
{
    const kgpu_policy_ops *ops = kgpu_policy_find("kgpu");
    assert_non_null(ops);
    assert_true(ops->online_only);
    assert_non_null(ops->observe);
    assert_false(ops->random_ties);
    kgpu_cluster *c = kgpu_cluster_new();
    add_node(c, "n", 8000, 2, V100);
    kgpu_error e;
    kgpu_error_clear(&e);
    assert_null(kgpu_policy_new("kgpu", c, NULL, &e));
    assert_int_equal(e.code, KGPU_EINVAL);
    kgpu_learner *l = learner_new();
    kgpu_policy *p = kgpu_policy_new("kgpu", c, kgpu_learner_workload(l), &e);
    assert_non_null(p);
    assert_true(kgpu_policy_online_only(p));
    kgpu_policy_free(p);
    p = kgpu_policy_new("fgd", c, kgpu_learner_workload(l), &e);
    assert_false(kgpu_policy_online_only(p));
    kgpu_policy_free(p);
    kgpu_learner_free(l);
    kgpu_cluster_free(c);
}

static const char nodes_csv[] = "sn,cpu_milli,memory_mib,gpu,model\n"
                                "n0,104000,262144,2,T4\n"
                                "n1,104000,262144,2,T4\n"
                                "n2,96000,786432,8,V100M32\n"
                                "n3,96000,786432,8,V100M32\n"
                                "n4,32000,131072,4,P100\n";

static const char pods_csv[] =
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_"
    "time,scheduled_time\n"
    "p0,4000,8192,1,500,,LS,Running,0,10,0\n"
    "p1,12000,16384,1,1000,,LS,Running,1,10,1\n"
    "p2,2000,4096,1,250,,BE,Running,2,10,2\n"
    "p3,24000,32768,2,1000,,LS,Running,3,10,3\n"
    "p4,12000,16384,0,0,,BE,Running,4,10,4\n"
    "p5,6000,8192,1,700,V100M32,LS,Running,5,10,5\n"
    "p6,3152,8192,1,810,,LS,Running,6,10,6\n"
    "p7,3000,8192,1,300,T4|P100,BE,Running,7,10,7\n";

/* Same seed, same bytes: in the study's tie order and with random ties; and it ran online. */
static void test_simulated_run_is_deterministic(void **state)
{
    kgpu_trace nodes, pods;
    kgpu_sim_input in;
    kgpu_error e;
    assert_int_equal(kgpu_trace_parse_nodes(nodes_csv, strlen(nodes_csv), "n.csv", &nodes, &e), 0);
    if (kgpu_trace_parse_pods(pods_csv, strlen(pods_csv), "p.csv", &pods, &e) != 0)
        fail_msg("%s", e.msg);
    assert_int_equal(kgpu_sim_prepare(&nodes, &pods, &in, &e), 0);
    for (int ties = 0; ties < 2; ties++) {
        kgpu_sim_config cfg = {.policy = "kgpu", .seed = 11, .inflate = 1.3, .random_ties = ties};
        kgpu_sim_result a, b;
        assert_int_equal(kgpu_sim_run(&in, &cfg, &a, &e), 0);
        assert_int_equal(kgpu_sim_run(&in, &cfg, &b, &e), 0);
        assert_memory_equal(&a, &b, sizeof(a));
        assert_true(a.online); /* whatever cfg.online says */
        assert_true(a.alloc_pct_final > 50);
    }
    /* Choosing by 0-10 scores as kube-scheduler does (ranks, or linear): deterministic too. */
    for (int mode = 1; mode <= 2; mode++) {
        kgpu_sim_config cfg = {
            .policy = "kgpu", .seed = 11, .inflate = 1.3, .extender_scores = mode};
        kgpu_sim_result a, b;
        assert_int_equal(kgpu_sim_run(&in, &cfg, &a, &e), 0);
        assert_int_equal(kgpu_sim_run(&in, &cfg, &b, &e), 0);
        assert_memory_equal(&a, &b, sizeof(a));
        assert_true(a.alloc_pct_final > 50);
    }
    /* fgd runs online only when asked. */
    kgpu_sim_config cfg = {.policy = "fgd", .seed = 11, .inflate = 1.3};
    kgpu_sim_result r;
    assert_int_equal(kgpu_sim_run(&in, &cfg, &r, &e), 0);
    assert_false(r.online);
    cfg.online = true;
    assert_int_equal(kgpu_sim_run(&in, &cfg, &r, &e), 0);
    assert_true(r.online);
    kgpu_sim_input_free(&in);
    kgpu_trace_free(&nodes);
    kgpu_trace_free(&pods);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learner),
        cmocka_unit_test(test_learns_only_the_past),
        cmocka_unit_test(test_cpu_pod_goes_where_cpu_is_spare),
        cmocka_unit_test(test_packs_onto_nodes_in_use),
        cmocka_unit_test(test_rank_scores_and_fit_without_cpu),
        cmocka_unit_test(test_share_completes_a_gpu),
        cmocka_unit_test(test_spares_scarce_models),
        cmocka_unit_test(test_cache_matches_uncached_and_reference),
        cmocka_unit_test(test_scarcity_bypasses_the_cache),
        cmocka_unit_test(test_free_count_follows_the_journal),
        cmocka_unit_test(test_registered_online_only),
        cmocka_unit_test(test_simulated_run_is_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
