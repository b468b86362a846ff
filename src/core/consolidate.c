/*
 * Making room by moving pods (core.h, "consolidate.c"): when a pod fits no
 * node, find the node where moving the fewest restartable pods elsewhere
 * lets it in, and do it. The simulator measures with it what moves are
 * worth; the same planner is what a consolidating controller has to answer.
 *
 * The search, for a pod `req` that fits nowhere:
 *   1. Per node, the movable pods on it. A node where req does not fit even
 *      with all of them gone is skipped (one placement search).
 *   2. Victim sets by size, 1 first, over every node: a set is a candidate
 *      when req fits the node with the set gone (kgpu_fit_all with the set
 *      released) and each victim's shape fits some other node as the
 *      cluster stands (first fitting node kept per shape and cluster change)
 *      or, all such victims together, the same node beside req: a move to
 *      other GPUs of the node, which frees a whole GPU as well.
 *      Among candidates of one size the one that moves the least GPU
 *      compute wins (the least disruption), then the lowest node index.
 *   3. Commit: the victims leave, req takes the node (the policy picks its
 *      GPUs), then each victim is placed again by the policy over the whole
 *      cluster, in the order it was found. If one finds no room (two
 *      victims wanted the same hole) everything is undone exactly and the
 *      next candidate is tried, a few at most.
 * A shape for which a search found nothing is not searched again until the
 * cluster gains room (a release, a move): pods only arrive in between, which
 * can only take room.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define COMMIT_TRIES 8 /* candidates committed and undone before giving up on a pod */

int kgpu__pods_init(kgpu__pods *t, int nnodes)
{
    memset(t, 0, sizeof(*t));
    t->nnodes = nnodes;
    t->on = calloc((size_t)(nnodes > 0 ? nnodes : 1), sizeof(*t->on));
    if (t->on == NULL)
        return KGPU_ENOMEM;
    return 0;
}

void kgpu__pods_free(kgpu__pods *t)
{
    if (t->on != NULL)
        for (int i = 0; i < t->nnodes; i++)
            free(t->on[i].ids);
    free(t->on);
    free(t->pod);
    free(t->fit_first);
    free(t->fit_second);
    free(t->fit_seq);
    free(t->failed_seq);
    free(t->failed_max);
    memset(t, 0, sizeof(*t));
}

static int node_list_add(kgpu__pods *t, int node, int id)
{
    kgpu__pods_node *l = &t->on[node];
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        int *ids = realloc(l->ids, (size_t)cap * sizeof(*ids));
        if (ids == NULL)
            return KGPU_ENOMEM;
        l->ids = ids;
        l->cap = cap;
    }
    l->ids[l->n++] = id;
    return 0;
}

static void node_list_remove(kgpu__pods *t, int node, int id)
{
    kgpu__pods_node *l = &t->on[node];
    for (int k = 0; k < l->n; k++)
        if (l->ids[k] == id) {
            memmove(&l->ids[k], &l->ids[k + 1], (size_t)(l->n - k - 1) * sizeof(*l->ids));
            l->n--;
            return;
        }
}

int kgpu__pods_add(kgpu__pods *t, const kgpu_request *req, const kgpu_assignment *a, bool movable,
                   size_t tag, int *id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        kgpu__pod *p = realloc(t->pod, cap * sizeof(*p));
        if (p == NULL)
            return KGPU_ENOMEM;
        t->pod = p;
        t->cap = cap;
    }
    if (node_list_add(t, a->node, (int)t->n) != 0)
        return KGPU_ENOMEM;
    if (id != NULL)
        *id = (int)t->n;
    t->pod[t->n++] = (kgpu__pod){.req = req, .a = *a, .movable = movable, .tag = tag};
    return 0;
}

void kgpu__pods_remove(kgpu__pods *t, const kgpu_cluster *c, int id)
{
    node_list_remove(t, t->pod[id].a.node, id);
    t->pod[id].req = NULL;
    t->pod[id].movable = false;
    t->room_seq = kgpu__cluster_seq(c);
}

/* Per-shape memory, sized on first use by the highest shape id seen. */
static int shape_slots(kgpu__pods *t, int shape)
{
    if (shape < t->nshapes)
        return 0;
    int n = shape + 1 > 2 * t->nshapes ? shape + 1 : 2 * t->nshapes;
    int *a = realloc(t->fit_first, (size_t)n * sizeof(*a));
    if (a != NULL)
        t->fit_first = a;
    int *b = realloc(t->fit_second, (size_t)n * sizeof(*b));
    if (b != NULL)
        t->fit_second = b;
    uint64_t *s = realloc(t->fit_seq, (size_t)n * sizeof(*s));
    if (s != NULL)
        t->fit_seq = s;
    uint64_t *f = realloc(t->failed_seq, (size_t)n * sizeof(*f));
    if (f != NULL)
        t->failed_seq = f;
    int *m = realloc(t->failed_max, (size_t)n * sizeof(*m));
    if (m != NULL)
        t->failed_max = m;
    if (a == NULL || b == NULL || s == NULL || f == NULL || m == NULL)
        return KGPU_ENOMEM;
    for (int i = t->nshapes; i < n; i++) {
        t->fit_seq[i] = UINT64_MAX;
        t->failed_seq[i] = UINT64_MAX;
        t->failed_max[i] = 0;
    }
    t->nshapes = n;
    return 0;
}

/*
 * Whether a pod of this request fits some node other than `away`, as the
 * cluster stands. The first two fitting nodes are kept per shape until the
 * cluster changes.
 */
static bool fits_elsewhere(kgpu__pods *t, const kgpu_cluster *c, const kgpu_request *req, int away)
{
    int nn = kgpu_cluster_node_count(c);
    uint64_t seq = kgpu__cluster_seq(c);
    int s = req->shape;
    if (s < 0 || shape_slots(t, s) != 0) {
        for (int j = 0; j < nn; j++)
            if (j != away && kgpu__fit(kgpu_cluster_node(c, j), req))
                return true;
        return false;
    }
    if (t->fit_seq[s] != seq) {
        int first = -1, second = -1;
        for (int j = 0; j < nn && second < 0; j++)
            if (kgpu__fit(kgpu_cluster_node(c, j), req)) {
                if (first < 0)
                    first = j;
                else
                    second = j;
            }
        t->fit_first[s] = first;
        t->fit_second[s] = second;
        t->fit_seq[s] = seq;
    }
    return (t->fit_first[s] >= 0 && t->fit_first[s] != away) ||
           (t->fit_second[s] >= 0 && t->fit_second[s] != away);
}

/* A victim set: pod ids on one node. */
typedef struct candidate {
    int node;
    int n;
    int ids[KGPU__MAX_MOVES];
    int64_t moved_milli;
} candidate;

static int64_t moved_milli(const kgpu__pods *t, const int *ids, int n)
{
    int64_t m = 0;
    for (int k = 0; k < n; k++)
        m += kgpu__gpu_demand(t->pod[ids[k]].req);
    return m;
}

static bool better(const candidate *a, const candidate *b)
{
    if (b->node < 0)
        return true;
    if (a->moved_milli != b->moved_milli)
        return a->moved_milli < b->moved_milli;
    return a->node < b->node;
}

/*
 * Victim sets of exactly `size` movable pods of node i that make room for
 * req, each victim able to go elsewhere: the best, and how many were found.
 * `skip` lists candidates already tried and undone (by node and ids).
 */
static void scan_node(kgpu__pods *t, const kgpu_cluster *c, int i, const kgpu_request *req,
                      const int *movable, int nm, int size, const candidate *skip, int nskip,
                      candidate *best)
{
    int pick[KGPU__MAX_MOVES];
    for (int k = 0; k < size; k++)
        pick[k] = k;
    const kgpu_request *reqs[1] = {req};
    while (true) {
        kgpu_assignment rel[KGPU__MAX_MOVES];
        int ids[KGPU__MAX_MOVES];
        for (int k = 0; k < size; k++) {
            ids[k] = movable[pick[k]];
            rel[k] = t->pod[ids[k]].a;
        }
        bool tried = false;
        for (int s = 0; s < nskip && !tried; s++)
            tried = skip[s].node == i && skip[s].n == size &&
                    memcmp(skip[s].ids, ids, (size_t)size * sizeof(*ids)) == 0;
        candidate cand = {.node = i, .n = size, .moved_milli = moved_milli(t, ids, size)};
        memcpy(cand.ids, ids, (size_t)size * sizeof(*ids));
        if (!tried && better(&cand, best) && kgpu_fit_all(c, i, rel, size, reqs, 1, NULL, 0)) {
            /*
             * Each victim goes to another node, or stays on this one on other
             * GPUs: those that stay must fit beside req together.
             */
            const kgpu_request *stay[1 + KGPU__MAX_MOVES] = {req};
            int nstay = 1;
            int64_t want = kgpu__gpu_demand(req), room = kgpu__node_free_milli(
                                                           kgpu_cluster_node(c, i));
            for (int k = 0; k < size; k++) {
                const kgpu_assignment *a = &t->pod[ids[k]].a;
                room += (int64_t)a->ngpus * (a->exclusive ? KGPU_MILLI : a->gpu_milli);
                if (!fits_elsewhere(t, c, t->pod[ids[k]].req, i)) {
                    stay[nstay++] = t->pod[ids[k]].req;
                    want += kgpu__gpu_demand(t->pod[ids[k]].req);
                }
            }
            /* The compute summed over the node first: the search only when it can fit. */
            if (nstay == 1 ||
                (want <= room && kgpu_fit_all(c, i, rel, size, stay, nstay, NULL, 0)))
                *best = cand;
        }
        /* Next combination of `size` out of nm, in lexicographic order. */
        int k = size - 1;
        while (k >= 0 && pick[k] == nm - size + k)
            k--;
        if (k < 0)
            return;
        pick[k]++;
        for (int j = k + 1; j < size; j++)
            pick[j] = pick[j - 1] + 1;
    }
}

/*
 * Commits a candidate: victims off, req on, victims placed again. On success
 * *placed holds req's placement and the victims' records are updated; on
 * KGPU_ENOFIT everything is as it was.
 */
static int commit(kgpu__pods *t, kgpu_cluster *c, kgpu_policy *p, const kgpu_request *req,
                  const candidate *cand, kgpu_rng *rng, kgpu_assignment *placed, kgpu_error *err)
{
    int rc, n = cand->n, moved = 0;
    kgpu_assignment old[KGPU__MAX_MOVES], now[KGPU__MAX_MOVES];
    bool req_on = false;
    for (int k = 0; k < n; k++) {
        old[k] = t->pod[cand->ids[k]].a;
        if ((rc = kgpu_cluster_release(c, &old[k], err)) != 0)
            return rc; /* the records and the cluster disagree: a bug */
    }
    int node, gpus[KGPU_MAX_GPUS_PER_NODE];
    rc = kgpu_policy_select(p, c, req, &cand->node, 1, rng, &node, gpus, err);
    if (rc == 0)
        rc = kgpu_cluster_apply(c, req, node, gpus, placed, err);
    if (rc != 0)
        goto undo; /* cannot be: the search said req fits with these gone */
    req_on = true;
    for (; moved < n; moved++) {
        const kgpu_request *v = t->pod[cand->ids[moved]].req;
        rc = kgpu_policy_select(p, c, v, NULL, 0, rng, &node, gpus, err);
        if (rc == 0)
            rc = kgpu_cluster_apply(c, v, node, gpus, &now[moved], err);
        if (rc != 0)
            goto undo;
    }
    for (int k = 0; k < n; k++) {
        int id = cand->ids[k];
        node_list_remove(t, old[k].node, id);
        if ((rc = node_list_add(t, now[k].node, id)) != 0)
            return kgpu_error_set(err, rc, "out of memory");
        t->pod[id].a = now[k];
        t->pod[id].moves++;
    }
    return 0;
undo:
    if (rc != KGPU_ENOFIT)
        return rc;
    kgpu_error local;
    while (moved-- > 0)
        if (kgpu_cluster_release(c, &now[moved], &local) != 0)
            return kgpu_error_set(err, KGPU_ESTATE, "undoing a move: %s", local.msg);
    if (req_on && kgpu_cluster_release(c, placed, &local) != 0)
        return kgpu_error_set(err, KGPU_ESTATE, "undoing a move: %s", local.msg);
    for (int k = 0; k < n; k++)
        if (kgpu_cluster_apply(c, t->pod[cand->ids[k]].req, old[k].node, old[k].gpus, NULL,
                               &local) != 0)
            return kgpu_error_set(err, KGPU_ESTATE, "undoing a move: %s", local.msg);
    return KGPU_ENOFIT;
}

int kgpu__consolidate(kgpu__pods *t, kgpu_cluster *c, kgpu_policy *p, const kgpu_request *req,
                      int max_moves, const bool *hosts, kgpu_rng *rng, kgpu_assignment *placed,
                      int *moved, int *nmoved, kgpu_error *err)
{
    *nmoved = 0;
    if (max_moves > KGPU__MAX_MOVES)
        max_moves = KGPU__MAX_MOVES;
    int nn = kgpu_cluster_node_count(c);
    uint64_t seq = kgpu__cluster_seq(c);
    int s = req->shape;
    bool memo = s >= 0 && hosts == NULL && shape_slots(t, s) == 0;
    /*
     * Nothing freed room since this shape last found no move with as many
     * moves allowed: it would find none again.
     */
    if (memo && t->failed_seq[s] != UINT64_MAX && t->room_seq <= t->failed_seq[s] &&
        t->failed_max[s] >= max_moves)
        return KGPU_ENOFIT;
    const kgpu_request *reqs[1] = {req};
    int *movable = NULL, *cand_nodes = NULL, ncand = 0, rc = KGPU_ENOFIT;
    candidate skip[COMMIT_TRIES];
    int nskip = 0;
    cand_nodes = malloc((size_t)(nn > 0 ? nn : 1) * sizeof(*cand_nodes));
    if (cand_nodes == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    /* 1. Nodes where req would fit with every movable pod gone. */
    for (int i = 0; i < nn; i++) {
        const kgpu__pods_node *l = &t->on[i];
        if (l->n == 0 || (hosts != NULL && !hosts[i]) ||
            (req->models & kgpu_cluster_node(c, i)->model_mask) == 0)
            continue;
        kgpu_assignment all[64];
        int na = 0;
        for (int k = 0; k < l->n && na < 64; k++)
            if (t->pod[l->ids[k]].movable)
                all[na++] = t->pod[l->ids[k]].a;
        if (na > 0 && kgpu_fit_all(c, i, all, na, reqs, 1, NULL, 0))
            cand_nodes[ncand++] = i;
    }
    int cap = 0;
    for (int j = 0; j < ncand; j++)
        cap = t->on[cand_nodes[j]].n > cap ? t->on[cand_nodes[j]].n : cap;
    movable = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(*movable));
    if (movable == NULL) {
        free(cand_nodes);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    /* 2 and 3. Smallest sets first; commit the best, the next best if it fails. */
    for (int size = 1; size <= max_moves && rc == KGPU_ENOFIT; size++) {
        while (nskip < COMMIT_TRIES) {
            candidate best = {.node = -1};
            for (int j = 0; j < ncand; j++) {
                const kgpu__pods_node *l = &t->on[cand_nodes[j]];
                int nm = 0;
                for (int k = 0; k < l->n; k++)
                    if (t->pod[l->ids[k]].movable)
                        movable[nm++] = l->ids[k];
                if (nm >= size)
                    scan_node(t, c, cand_nodes[j], req, movable, nm, size, skip, nskip, &best);
            }
            if (best.node < 0)
                break;
            rc = commit(t, c, p, req, &best, rng, placed, err);
            if (rc == 0) {
                *nmoved = best.n;
                memcpy(moved, best.ids, (size_t)best.n * sizeof(*moved));
            }
            if (rc != KGPU_ENOFIT)
                break;
            skip[nskip++] = best;
        }
    }
    if (rc == 0)
        t->room_seq = kgpu__cluster_seq(c);
    else if (rc == KGPU_ENOFIT && memo) {
        t->failed_seq[s] = seq;
        t->failed_max[s] = max_moves;
    }
    free(movable);
    free(cand_nodes);
    return rc;
}

int kgpu_plan_moves(kgpu_cluster *c, kgpu_policy *p, const kgpu_placed_pod *pods, size_t n,
                    const kgpu_request *req, int max_moves, const bool *hosts, kgpu_rng *rng,
                    kgpu_moves *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (max_moves < 1 || max_moves > KGPU_MAX_MOVES)
        return kgpu_error_set(err, KGPU_EINVAL, "moves: %d, not 1..%d", max_moves,
                              KGPU_MAX_MOVES);
    int nn = kgpu_cluster_node_count(c);
    kgpu__pods t;
    if (kgpu__pods_init(&t, nn) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (pods[i].a.node < 0 || pods[i].a.node >= nn)
            rc = kgpu_error_set(err, KGPU_EINVAL, "pod %zu: node %d is not in the cluster", i,
                                pods[i].a.node);
        else if (kgpu__pods_add(&t, &pods[i].req, &pods[i].a, pods[i].movable, i, NULL) != 0)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    if (rc == 0)
        rc = kgpu__consolidate(&t, c, p, req, max_moves, hosts, rng, &out->placed, moved,
                               &nmoved, err);
    if (rc == 0) {
        out->n = nmoved;
        for (int k = 0; k < nmoved; k++) {
            out->pod[k] = t.pod[moved[k]].tag;
            out->to[k] = t.pod[moved[k]].a;
        }
    }
    kgpu__pods_free(&t);
    return rc;
}

/* Largest GPU demand first, then the caller's order. */
typedef struct drain_order {
    int64_t demand;
    size_t i;
} drain_order;

static int by_demand(const void *a, const void *b)
{
    const drain_order *x = a, *y = b;
    if (x->demand != y->demand)
        return x->demand > y->demand ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Marks node i's GPUs unhealthy (saving their health in was[]) or gives it back. */
static int set_off(kgpu_cluster *c, int i, bool off, bool *was, kgpu_error *err)
{
    const kgpu_node *n = kgpu_cluster_node(c, i);
    for (int g = 0; g < n->ngpus; g++) {
        if (off)
            was[g] = n->gpus[g].healthy;
        int rc = kgpu_cluster_set_gpu_health(c, i, g, off ? false : was[g], err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kgpu_can_drain(kgpu_cluster *c, kgpu_policy *p, const kgpu_placed_pod *pods, size_t n,
                   int node, const bool *skip, kgpu_rng *rng, size_t *stuck, kgpu_error *err)
{
    int nn = kgpu_cluster_node_count(c);
    if (node < 0 || node >= nn)
        return kgpu_error_set(err, KGPU_EINVAL, "node %d is not in the cluster", node);
    drain_order *order = malloc((n + 1) * sizeof(*order));
    kgpu_assignment *now = malloc((n + 1) * sizeof(*now));
    int *off = malloc(((size_t)nn + 1) * sizeof(*off));
    bool(*was)[KGPU_MAX_GPUS_PER_NODE] = malloc(((size_t)nn + 1) * sizeof(*was));
    if (order == NULL || now == NULL || off == NULL || was == NULL) {
        free(order);
        free(now);
        free(off);
        free(was);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int rc = 0, noff = 0;
    size_t released = 0, placed = 0;
    while (released < n && rc == 0) {
        if (pods[released].a.node != node)
            rc = kgpu_error_set(err, KGPU_EINVAL, "pod %zu is on node %d, not %d", released,
                                pods[released].a.node, node);
        else
            rc = kgpu_cluster_release(c, &pods[released].a, err);
        if (rc == 0) {
            order[released] = (drain_order){kgpu__gpu_demand(&pods[released].req), released};
            released++;
        }
    }
    /* The node and the skipped ones take nothing: their GPUs off while the pods are placed. */
    for (int i = 0; i < nn && rc == 0; i++)
        if (i == node || (skip != NULL && skip[i])) {
            rc = set_off(c, i, true, was[noff], err);
            off[noff++] = i; /* given back below even when set_off stopped midway */
        }
    if (rc == 0)
        qsort(order, n, sizeof(*order), by_demand);
    while (placed < n && rc == 0) {
        const kgpu_request *req = &pods[order[placed].i].req;
        int at, gpus[KGPU_MAX_GPUS_PER_NODE];
        rc = kgpu_policy_select(p, c, req, NULL, 0, rng, &at, gpus, err);
        if (rc == 0)
            rc = kgpu_cluster_apply(c, req, at, gpus, &now[placed], err);
        if (rc == 0)
            placed++;
        else if (rc == KGPU_ENOFIT && stuck != NULL)
            *stuck = order[placed].i;
    }
    /* Undo: what was placed leaves, the GPUs come back on, what was released returns. */
    kgpu_error local;
    int undo = 0;
    while (placed-- > 0 && undo == 0)
        undo = kgpu_cluster_release(c, &now[placed], &local);
    while (noff-- > 0 && undo == 0)
        undo = set_off(c, off[noff], false, was[noff], &local);
    while (released-- > 0 && undo == 0)
        undo = kgpu_cluster_apply(c, &pods[released].req, node, pods[released].a.gpus, NULL,
                                  &local);
    free(order);
    free(now);
    free(off);
    free(was);
    if (undo != 0)
        return kgpu_error_set(err, KGPU_ESTATE, "undoing a drain check: %s", local.msg);
    return rc;
}
