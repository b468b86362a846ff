/*
 * Unit tests of consolidation (src/core/consolidate.c): the fewest moves and
 * then the least GPU compute moved, only restartable pods, nothing changed
 * when no move exists, an exact undo when two victims want the same hole,
 * and the simulators' use of it (deterministic, counted, refused where it is
 * not simulated).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"
#include "kgpu/churn.h"
#include "kgpu/rng.h"
#include "sim_fixture.h"

/* A cluster of one-GPU nodes; pods placed as listed, node by node. */
typedef struct world {
    kgpu_cluster *c;
    kgpu_policy *p;
    kgpu__pods t;
    kgpu_request req[16];
    int nreq;
    kgpu_rng rng;
} world;

static void world_init(world *w, int nodes)
{
    memset(w, 0, sizeof(*w));
    w->c = kgpu_cluster_new();
    assert_non_null(w->c);
    kgpu_error err;
    for (int i = 0; i < nodes; i++) {
        char name[16];
        snprintf(name, sizeof(name), "n%d", i);
        kgpu_gpu_spec g = {.index = 0, .model = "T4", .memory_mib = 16384, .numa = -1,
                           .healthy = true};
        kgpu_node_spec n = {.name = name, .cpu_milli = 64000, .memory_mib = 262144, .gpus = &g,
                            .ngpus = 1};
        assert_int_equal(kgpu_cluster_add_node(w->c, &n, &err), i);
    }
    w->p = kgpu_policy_new("bestfit", w->c, NULL, &err);
    assert_non_null(w->p);
    assert_int_equal(kgpu__pods_init(&w->t, nodes), 0);
    kgpu_rng_seed(&w->rng, 42, 2);
}

static void world_free(world *w)
{
    kgpu__pods_free(&w->t);
    kgpu_policy_free(w->p);
    kgpu_cluster_free(w->c);
}

/* A share request of `milli`, its own shape id. */
static const kgpu_request *share(world *w, int milli)
{
    kgpu_request *r = &w->req[w->nreq];
    *r = (kgpu_request){.cpu_milli = 1000, .memory_mib = 1024, .gpu_count = 1,
                        .gpu_milli = milli, .shape = w->nreq};
    w->nreq++;
    kgpu_error err;
    assert_int_equal(kgpu_request_compile(w->c, r, &err), 0);
    return r;
}

/* Places a share of `milli` on node `node`; returns its pod id. */
static int put(world *w, int node, int milli, bool movable)
{
    const kgpu_request *r = share(w, milli);
    int gpus[1] = {0}, id = -1;
    kgpu_assignment a;
    kgpu_error err;
    assert_int_equal(kgpu_cluster_apply(w->c, r, node, gpus, &a, &err), 0);
    assert_int_equal(kgpu__pods_add(&w->t, r, &a, movable, (size_t)w->t.n, &id), 0);
    return id;
}

static int free_milli(const world *w, int node)
{
    return kgpu_cluster_node(w->c, node)->gpus[0].free_milli;
}

static bool fits_anywhere(const world *w, const kgpu_request *r)
{
    for (int i = 0; i < kgpu_cluster_node_count(w->c); i++)
        if (kgpu_fit(w->c, i, r, NULL, 0))
            return true;
    return false;
}

/* Node 0: 250 + 300 (450 free); node 1: 600 (400 free). A 700 fits after one move. */
static void test_one_move_least_compute(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2);
    int a1 = put(&w, 0, 250, true);
    put(&w, 0, 300, true);
    put(&w, 1, 600, true);
    const kgpu_request *r = share(&w, 700);
    assert_false(fits_anywhere(&w, r));
    kgpu_assignment placed;
    int moved[KGPU__MAX_MOVES], nmoved = -1;
    kgpu_error err;
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 1, NULL, &w.rng, &placed, moved, &nmoved, &err), 0);
    assert_int_equal(nmoved, 1);
    assert_int_equal(moved[0], a1); /* 250 moved rather than 300 */
    assert_int_equal(placed.node, 0);
    assert_int_equal(w.t.pod[a1].a.node, 1);
    assert_int_equal(w.t.pod[a1].moves, 1);
    assert_int_equal(free_milli(&w, 0), 0);   /* 300 + 700 */
    assert_int_equal(free_milli(&w, 1), 150); /* 600 + 250 */
    assert_int_equal(w.t.on[0].n, 1);
    assert_int_equal(w.t.on[1].n, 2);
    world_free(&w);
}

/* Only restartable pods move: with the 250 pinned, the 300 goes. */
static void test_only_restartable_move(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2);
    put(&w, 0, 250, false);
    int a2 = put(&w, 0, 300, true);
    put(&w, 1, 600, false);
    const kgpu_request *r = share(&w, 700);
    kgpu_assignment placed;
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    kgpu_error err;
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 1, NULL, &w.rng, &placed, moved, &nmoved, &err), 0);
    assert_int_equal(nmoved, 1);
    assert_int_equal(moved[0], a2);
    assert_int_equal(w.t.pod[a2].a.node, 1);
    world_free(&w);
}

/* Nothing movable, or no room anywhere for what would move: refused, nothing changed. */
static void test_no_move_changes_nothing(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2);
    put(&w, 0, 250, false);
    put(&w, 0, 300, false);
    put(&w, 1, 600, true);
    const kgpu_request *r = share(&w, 700);
    int64_t before = kgpu_cluster_gpu_milli_allocated(w.c);
    kgpu_assignment placed;
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    kgpu_error err;
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 3, NULL, &w.rng, &placed, moved, &nmoved, &err),
        KGPU_ENOFIT);
    assert_int_equal(nmoved, 0);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(w.c), before);
    assert_int_equal(free_milli(&w, 0), 450);
    assert_int_equal(free_milli(&w, 1), 400);
    world_free(&w);
}

/*
 * Node 0: 200 + 200 + 300 (300 free); nodes 1 and 2: 750 each (250 free).
 * A 700 needs two of node 0's pods gone: one move is not enough, two are,
 * each to its own node.
 */
static void test_two_moves_when_one_is_not_enough(void **state)
{
    (void)state;
    world w;
    world_init(&w, 3);
    int a1 = put(&w, 0, 200, true);
    int a2 = put(&w, 0, 200, true);
    put(&w, 0, 300, true);
    put(&w, 1, 750, true);
    put(&w, 2, 750, true);
    const kgpu_request *r = share(&w, 700);
    kgpu_assignment placed;
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    kgpu_error err;
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 1, NULL, &w.rng, &placed, moved, &nmoved, &err),
        KGPU_ENOFIT);
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 2, NULL, &w.rng, &placed, moved, &nmoved, &err), 0);
    assert_int_equal(nmoved, 2);
    assert_int_equal(placed.node, 0);
    int n1 = w.t.pod[a1].a.node, n2 = w.t.pod[a2].a.node;
    assert_true(n1 != 0 && n2 != 0 && n1 != n2);
    assert_int_equal(free_milli(&w, 0), 0);
    assert_int_equal(free_milli(&w, 1), 50);
    assert_int_equal(free_milli(&w, 2), 50);
    world_free(&w);
}

/*
 * As above with node 2 full: each of the two 200s fits node 1 alone, not
 * both. The commit finds out, undoes every step exactly and refuses.
 */
static void test_competing_victims_undone_exactly(void **state)
{
    (void)state;
    world w;
    world_init(&w, 3);
    int ids[5];
    ids[0] = put(&w, 0, 200, true);
    ids[1] = put(&w, 0, 200, true);
    ids[2] = put(&w, 0, 300, true);
    ids[3] = put(&w, 1, 750, false);
    ids[4] = put(&w, 2, 1000 - 1, false);
    const kgpu_request *r = share(&w, 700);
    int64_t before = kgpu_cluster_gpu_milli_allocated(w.c);
    kgpu_assignment placed;
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    kgpu_error err;
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 2, NULL, &w.rng, &placed, moved, &nmoved, &err),
        KGPU_ENOFIT);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(w.c), before);
    assert_int_equal(free_milli(&w, 0), 300);
    assert_int_equal(free_milli(&w, 1), 250);
    assert_int_equal(free_milli(&w, 2), 1);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(w.t.pod[ids[k]].a.node, 0);
        assert_int_equal(w.t.pod[ids[k]].moves, 0);
    }
    assert_int_equal(w.t.on[0].n, 3);
    /* The records still match the cluster: releasing each succeeds and empties node 0. */
    for (int k = 0; k < 3; k++)
        assert_int_equal(kgpu_cluster_release(w.c, &w.t.pod[ids[k]].a, &err), 0);
    assert_int_equal(free_milli(&w, 0), 1000);
    world_free(&w);
}

/* A departure gives its room back to searches a shape failed before. */
static void test_removal_reopens_a_failed_shape(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2);
    put(&w, 0, 250, true);
    put(&w, 0, 300, true);
    int b = put(&w, 1, 800, false);
    const kgpu_request *r = share(&w, 700);
    kgpu_assignment placed;
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    kgpu_error err;
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r, 1, NULL, &w.rng, &placed, moved, &nmoved, &err),
        KGPU_ENOFIT);
    /* Node 1's 800 leaves: node 1 now takes the 700 directly, and a 750 needs a move. */
    assert_int_equal(kgpu_cluster_release(w.c, &w.t.pod[b].a, &err), 0);
    kgpu__pods_remove(&w.t, w.c, b);
    put(&w, 1, 400, false);
    const kgpu_request *r2 = share(&w, 750);
    assert_false(fits_anywhere(&w, r2));
    assert_int_equal(
        kgpu__consolidate(&w.t, w.c, w.p, r2, 1, NULL, &w.rng, &placed, moved, &nmoved, &err), 0);
    assert_int_equal(placed.node, 0);
    world_free(&w);
}

/*
 * One node of two GPUs: 600 on GPU 0, a restartable 300 on GPU 1. A whole
 * GPU fits after the 300 moves to GPU 0 of the same node: there is no
 * other node, and the move frees GPU 1 whole.
 */
static void test_a_move_within_the_node(void **state)
{
    (void)state;
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    kgpu_error err;
    kgpu_gpu_spec g[2] = {{.index = 0, .model = "T4", .memory_mib = 16384, .numa = -1,
                           .healthy = true},
                          {.index = 1, .model = "T4", .memory_mib = 16384, .numa = -1,
                           .healthy = true}};
    kgpu_node_spec n = {.name = "n0", .cpu_milli = 64000, .memory_mib = 262144, .gpus = g,
                        .ngpus = 2};
    assert_int_equal(kgpu_cluster_add_node(c, &n, &err), 0);
    kgpu_policy *p = kgpu_policy_new("bestfit", c, NULL, &err);
    assert_non_null(p);
    kgpu_placed_pod pods[2];
    const int milli[2] = {600, 300};
    for (int i = 0; i < 2; i++) {
        pods[i].req = (kgpu_request){.gpu_count = 1, .gpu_milli = milli[i], .shape = -1};
        assert_int_equal(kgpu_request_compile(c, &pods[i].req, &err), 0);
        int gpus[1] = {i};
        assert_int_equal(kgpu_cluster_apply(c, &pods[i].req, 0, gpus, &pods[i].a, &err), 0);
        pods[i].movable = i == 1;
    }
    kgpu_request whole = {.gpu_count = 1, .gpu_milli = 1000, .exclusive = true, .shape = -1};
    assert_int_equal(kgpu_request_compile(c, &whole, &err), 0);
    assert_false(kgpu_fit(c, 0, &whole, NULL, 0));
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 42, 2);
    kgpu_moves mv;
    assert_int_equal(kgpu_plan_moves(c, p, pods, 2, &whole, 1, NULL, &rng, &mv, &err), 0);
    assert_int_equal(mv.n, 1);
    assert_int_equal(mv.pod[0], 1);
    assert_int_equal(mv.placed.gpus[0], 1);
    assert_int_equal(mv.to[0].node, 0);
    assert_int_equal(mv.to[0].gpus[0], 0);
    assert_int_equal(kgpu_cluster_node(c, 0)->gpus[0].free_milli, 100);
    /* A 500 would not fit beside the 600: no plan, nothing changed. */
    kgpu_cluster *c2 = kgpu_cluster_new();
    assert_int_equal(kgpu_cluster_add_node(c2, &n, &err), 0);
    kgpu_policy *p2 = kgpu_policy_new("bestfit", c2, NULL, &err);
    const int milli2[2] = {600, 500};
    for (int i = 0; i < 2; i++) {
        pods[i].req = (kgpu_request){.gpu_count = 1, .gpu_milli = milli2[i], .shape = -1};
        assert_int_equal(kgpu_request_compile(c2, &pods[i].req, &err), 0);
        int gpus[1] = {i};
        assert_int_equal(kgpu_cluster_apply(c2, &pods[i].req, 0, gpus, &pods[i].a, &err), 0);
        pods[i].movable = i == 1;
    }
    assert_int_equal(kgpu_plan_moves(c2, p2, pods, 2, &whole, 1, NULL, &rng, &mv, &err),
                     KGPU_ENOFIT);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(c2), 1100);
    kgpu_policy_free(p2);
    kgpu_cluster_free(c2);
    kgpu_policy_free(p);
    kgpu_cluster_free(c);
}

/* Applies a share of `milli` on one-GPU node `node` as a kgpu_placed_pod. */
static void placed(world *w, kgpu_placed_pod *pp, int node, int milli)
{
    pp->req = *share(w, milli);
    pp->req.shape = -1;
    int gpus[1] = {0};
    kgpu_error err;
    assert_int_equal(kgpu_cluster_apply(w->c, &pp->req, node, gpus, &pp->a, &err), 0);
    pp->movable = true;
}

/*
 * Whether a node's pods could all run elsewhere (the scale-down guard's
 * question). n0: 500 + 300; n1: 400 (600 free); n2: 700 (300 free): the 500
 * goes to n1, the 300 to n2. Without n2, or with n1 fuller, the node must stay.
 */
static void test_can_drain(void **state)
{
    (void)state;
    world w;
    world_init(&w, 3);
    kgpu_placed_pod on0[2], other[2];
    placed(&w, &on0[0], 0, 500);
    placed(&w, &on0[1], 0, 300);
    placed(&w, &other[0], 1, 400);
    placed(&w, &other[1], 2, 700);
    kgpu_error err;
    size_t stuck = 99;
    int before[3];
    for (int i = 0; i < 3; i++)
        before[i] = free_milli(&w, i);
    assert_int_equal(kgpu_can_drain(w.c, w.p, on0, 2, 0, NULL, &w.rng, &stuck, &err), 0);
    assert_int_equal(stuck, 99);
    for (int i = 0; i < 3; i++) /* left exactly as it was */
        assert_int_equal(free_milli(&w, i), before[i]);
    bool skip[3] = {false, false, true};
    assert_int_equal(kgpu_can_drain(w.c, w.p, on0, 2, 0, skip, &w.rng, &stuck, &err),
                     KGPU_ENOFIT);
    assert_int_equal(stuck, 1); /* the 300: the 500 took n1 first */
    for (int i = 0; i < 3; i++)
        assert_int_equal(free_milli(&w, i), before[i]);
    /* n1 fuller: the 500 fits nowhere. */
    kgpu_placed_pod more;
    placed(&w, &more, 1, 200);
    assert_int_equal(kgpu_can_drain(w.c, w.p, on0, 2, 0, NULL, &w.rng, &stuck, &err),
                     KGPU_ENOFIT);
    assert_int_equal(stuck, 0);
    assert_int_equal(free_milli(&w, 0), 200);
    /* A pod that is not on the node is refused, and nothing changes. */
    assert_int_equal(kgpu_can_drain(w.c, w.p, other, 1, 0, NULL, &w.rng, &stuck, &err),
                     KGPU_EINVAL);
    assert_int_equal(free_milli(&w, 0), 200);
    assert_int_equal(free_milli(&w, 1), 400);
    /* An empty node can always go. */
    assert_int_equal(kgpu_can_drain(w.c, w.p, NULL, 0, 2, NULL, &w.rng, &stuck, &err), 0);
    world_free(&w);
}

/*
 * Memory decides too: n0 holds a 12 GiB share (little compute), n1's GPU has
 * 10 GiB free and n2's 14 GiB, each with most of its compute free. The share
 * fits n2 alone; without n2 it fits nowhere, though n1's compute would take it.
 */
static void test_can_drain_by_memory(void **state)
{
    (void)state;
    world w;
    world_init(&w, 3); /* one T4 of 16 GiB per node */
    kgpu_placed_pod pods[3];
    const int at[3] = {0, 1, 2};
    const int64_t mib[3] = {12288, 6144, 2048};
    kgpu_error err;
    for (int i = 0; i < 3; i++) {
        kgpu_request *r = &w.req[w.nreq++];
        *r = (kgpu_request){.gpu_count = 1, .gpu_milli = 100, .gpu_memory_mib = mib[i],
                            .shape = -1};
        assert_int_equal(kgpu_request_compile(w.c, r, &err), 0);
        int gpus[1] = {0};
        assert_int_equal(kgpu_cluster_apply(w.c, r, at[i], gpus, &pods[i].a, &err), 0);
        pods[i].req = *r;
        pods[i].movable = true;
    }
    size_t stuck = 99;
    assert_int_equal(kgpu_can_drain(w.c, w.p, pods, 1, 0, NULL, &w.rng, &stuck, &err), 0);
    bool skip[3] = {false, false, true};
    assert_int_equal(kgpu_can_drain(w.c, w.p, pods, 1, 0, skip, &w.rng, &stuck, &err),
                     KGPU_ENOFIT);
    assert_int_equal(stuck, 0);
    /* Left as it was: the share is back on n0's GPU with its memory. */
    assert_int_equal(kgpu_cluster_node(w.c, 0)->gpus[0].free_memory_mib, 16384 - 12288);
    assert_int_equal(kgpu_cluster_node(w.c, 2)->gpus[0].healthy, true);
    world_free(&w);
}

/*
 * The public planner (kgpu/consolidate.h), as the extender calls it: the
 * caller's pods by index, only the movable ones, and the hosts it may use.
 * Node 0: 250 + 300 (450 free); node 1: 600 (400 free); node 2: 500 (500 free).
 */
static void test_plan_moves_by_index_and_hosts(void **state)
{
    (void)state;
    world w;
    world_init(&w, 3);
    kgpu_placed_pod pods[4];
    const int at[4] = {0, 0, 1, 2}, milli[4] = {250, 300, 600, 500};
    for (int i = 0; i < 4; i++) {
        const kgpu_request *r = share(&w, milli[i]);
        int gpus[1] = {0};
        kgpu_error err;
        assert_int_equal(kgpu_cluster_apply(w.c, r, at[i], gpus, &pods[i].a, &err), 0);
        pods[i].req = *r;
        pods[i].req.shape = -1;
        pods[i].movable = true;
    }
    const kgpu_request *r = share(&w, 700);
    assert_false(fits_anywhere(&w, r));
    kgpu_moves mv;
    kgpu_error err;
    /* Only node 1 may host it: its 600 would have to go, and fits nowhere else (450 and
     * 500 free): no plan, nothing changed. */
    bool hosts[3] = {false, true, false};
    int64_t before = kgpu_cluster_gpu_milli_allocated(w.c);
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 4, r, 1, hosts, &w.rng, &mv, &err),
                     KGPU_ENOFIT);
    assert_int_equal(kgpu_cluster_gpu_milli_allocated(w.c), before);
    /* Node 2 too: its 500 would have to go, and fits nowhere else either. */
    hosts[2] = true;
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 4, r, 1, hosts, &w.rng, &mv, &err),
                     KGPU_ENOFIT);
    /* Node 0: moving its 250 (the least compute) makes 700 free. */
    hosts[0] = true;
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 4, r, 1, hosts, &w.rng, &mv, &err), 0);
    assert_int_equal(mv.n, 1);
    assert_int_equal(mv.pod[0], 0); /* the caller's index of the 250 */
    assert_int_equal(mv.placed.node, 0);
    assert_int_not_equal(mv.to[0].node, 0);
    assert_int_equal(free_milli(&w, 0), 0);
    world_free(&w);
}

/* Pinned pods are not moved, and a pod on a node the cluster lacks is an error. */
static void test_plan_moves_refuses_bad_input(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2);
    kgpu_placed_pod pods[2];
    const int at[2] = {0, 1}, milli[2] = {400, 600};
    for (int i = 0; i < 2; i++) {
        const kgpu_request *r = share(&w, milli[i]);
        int gpus[1] = {0};
        kgpu_error err;
        assert_int_equal(kgpu_cluster_apply(w.c, r, at[i], gpus, &pods[i].a, &err), 0);
        pods[i].req = *r;
        pods[i].movable = false;
    }
    const kgpu_request *r = share(&w, 700);
    kgpu_moves mv;
    kgpu_error err;
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 2, r, 1, NULL, &w.rng, &mv, &err),
                     KGPU_ENOFIT);
    pods[0].movable = true; /* the 400 fits beside the 600 */
    pods[1].a.node = 7;
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 2, r, 1, NULL, &w.rng, &mv, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "node 7"));
    pods[1].a.node = 1;
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 2, r, KGPU_MAX_MOVES + 1, NULL, &w.rng,
                                     &mv, &err),
                     KGPU_EINVAL);
    assert_int_equal(kgpu_plan_moves(w.c, w.p, pods, 2, r, 1, NULL, &w.rng, &mv, &err), 0);
    assert_int_equal(mv.n, 1);
    assert_int_equal(mv.pod[0], 0);
    assert_int_equal(mv.to[0].node, 1);
    world_free(&w);
}

static void test_sim_consolidation_counted_and_deterministic(void **state)
{
    fixture *f = *state;
    kgpu_sim_config cfg = {.policy = "kgpu", .seed = 7, .inflate = 2.0, .consolidate = 2};
    kgpu_sim_result a, b, plain;
    kgpu_error err;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &a, &err), 0);
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &b, &err), 0);
    assert_memory_equal(&a, &b, sizeof(a));
    assert_true(a.moves >= a.consolidated && a.moves <= 2 * a.consolidated);
    cfg.consolidate = 0;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &plain, &err), 0);
    assert_int_equal(plain.moves, 0);
    assert_int_equal(plain.consolidated, 0);
    assert_int_equal(a.pods, plain.pods); /* the same arrivals */
}

static void test_sim_consolidation_refused_where_not_simulated(void **state)
{
    fixture *f = *state;
    kgpu_sim_result out;
    kgpu_error err;
    kgpu_sim_config cfg = {.policy = "kgpu", .seed = 7, .inflate = 1.3, .consolidate = 4};
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &out, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "consolidate 4"));
    cfg.consolidate = 1;
    cfg.extender_scores = 1;
    assert_int_equal(kgpu_sim_run(&f->in, &cfg, &out, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "policy's own choice"));
}

static void test_churn_consolidation(void **state)
{
    fixture *f = *state;
    kgpu_churn_input ch;
    kgpu_error err;
    assert_int_equal(kgpu_churn_prepare(&f->in, &f->pods, "p.csv", &ch, &err), 0);
    kgpu_churn_config cfg = {.policy = "kgpu", .seed = 3, .speedup = 1, .inflate = 3.0,
                             .consolidate = 2};
    kgpu_churn_result a, b;
    assert_int_equal(kgpu_churn_run(&ch, &cfg, &a, &err), 0);
    assert_int_equal(kgpu_churn_run(&ch, &cfg, &b, &err), 0);
    assert_memory_equal(&a, &b, sizeof(a));
    assert_true(a.moves >= a.consolidated && a.moves <= 2 * a.consolidated);
    assert_true(a.placed >= a.pods - a.never_placed);
    assert_int_equal(a.never_placed, 0);
    /* Only moved pods lose work here (no queues, no reclaim). */
    if (a.moves == 0)
        assert_true(a.lost_gpu_s == 0);
    cfg.consolidate = 5;
    assert_int_equal(kgpu_churn_run(&ch, &cfg, &a, &err), KGPU_EINVAL);
    kgpu_churn_input_free(&ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_move_least_compute),
        cmocka_unit_test(test_only_restartable_move),
        cmocka_unit_test(test_no_move_changes_nothing),
        cmocka_unit_test(test_two_moves_when_one_is_not_enough),
        cmocka_unit_test(test_competing_victims_undone_exactly),
        cmocka_unit_test(test_removal_reopens_a_failed_shape),
        cmocka_unit_test(test_a_move_within_the_node),
        cmocka_unit_test(test_can_drain),
        cmocka_unit_test(test_can_drain_by_memory),
        cmocka_unit_test(test_plan_moves_by_index_and_hosts),
        cmocka_unit_test(test_plan_moves_refuses_bad_input),
        cmocka_unit_test(test_sim_consolidation_counted_and_deterministic),
        cmocka_unit_test(test_sim_consolidation_refused_where_not_simulated),
        cmocka_unit_test(test_churn_consolidation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
