/*
 * The placement search: whether and on which GPUs all of a pod's GPU
 * containers go on one node (kgpu_place_all), the one decision filter, bind,
 * preempt and queue reclaim share. It works on a scratch copy of the node
 * and never changes the cluster.
 */
#include <stdio.h>
#include <string.h>

#include "core.h"

/*
 * ---- The placement search (kgpu_place_all) ----
 *
 * Placing a pod's containers one at a time, each on its tightest GPUs, is
 * not complete: a container placed early can take the only GPU a later one
 * could use (a share on the one untouched GPU that a whole-GPU container
 * needed), so a node that can hold the pod is refused, or even called
 * unresolvable. Where that greedy placement fails, the search below looks
 * further, exactly, and cheaply at this size (at most KGPU_MAX_GPUS_PER_NODE
 * GPUs, a handful of requests):
 *
 * - Requests hardest first (whole GPUs, then more GPUs, then more memory and
 *   compute per GPU), so dead ends show up near the root.
 * - At each request, first the GPUs greedy placement would take (tightest,
 *   one NUMA node when one suffices): most pods fit on that first path, and
 *   its placement is the one a caller gets. Then every other set of GPUs.
 * - Symmetry: GPUs in the same state (health, model, capacity, free compute
 *   and memory, untouched or not) are interchangeable for every request
 *   still to place, so a set takes the first j members of such a class,
 *   never another j of them. NUMA is a preference, not a constraint: it does
 *   not split classes. Identical requests (a run of them, adjacent in the
 *   search order) are interchangeable too: their sets are taken in
 *   non-decreasing order of how many GPUs of each class (of the state where
 *   the run began) they hold, and within the run a class also keeps apart
 *   GPUs that were in different classes when it began, so that the two
 *   rules never exclude every placement.
 * - Bounds that every placement of the requests left must meet, checked
 *   before each step: each has enough usable GPUs; the whole ones, enough
 *   untouched GPUs; the shares, enough free memory and compute in all once
 *   the whole ones took theirs, and, for each share size, room on enough
 *   GPUs for the parts at least that large (a GPU with 12 GiB free holds one
 *   part of 8 GiB, not two). A node too full for the pod is refused there.
 * - A budget of steps (a set of GPUs considered for a request is one step)
 *   bounds the worst case, which grows with the number of ways to choose
 *   GPUs. Past it the search stops: the node is refused as greedy placement
 *   refused it, never worse than placing containers one at a time, and the
 *   reason says the search was cut. Such a refusal is no proof that the pod
 *   cannot fit: callers must not call the node unresolvable for it.
 */

enum { SEARCH_NONE, SEARCH_FOUND, SEARCH_CUT };

typedef struct place_search {
    kgpu_node *n; /* scratch copy of the node: requests are taken from and given back to it */
    int node;
    int nreq;
    const kgpu_request *req[KGPU_PLACE_MAX_REQS]; /* in search order: hardest first */
    int run[KGPU_PLACE_MAX_REQS]; /* first level of the run of identical requests of each level */
    /* At the first level of a run: each GPU's class then (the lowest position in its state). */
    int run_class[KGPU_PLACE_MAX_REQS][KGPU_MAX_GPUS_PER_NODE];
    int pick[KGPU_PLACE_MAX_REQS][KGPU_MAX_GPUS_PER_NODE]; /* req[i]'s GPUs on the current path */
    long steps, budget;
} place_search;

/* Whether a should be placed before b: the harder request first; identical ones tie. */
static bool harder(const kgpu_request *a, const kgpu_request *b)
{
    int ka = a->gpu_count > 0 ? a->gpu_count : 0, kb = b->gpu_count > 0 ? b->gpu_count : 0;
    if ((ka > 0) != (kb > 0))
        return ka > 0;
    if (a->exclusive != b->exclusive)
        return a->exclusive;
    if (ka != kb)
        return ka > kb;
    if (a->gpu_memory_mib != b->gpu_memory_mib)
        return a->gpu_memory_mib > b->gpu_memory_mib;
    if (a->gpu_milli != b->gpu_milli)
        return a->gpu_milli > b->gpu_milli;
    /* Fewer allowed models: fewer GPUs to choose from. Then any fixed order, to keep runs. */
    int ma = __builtin_popcountll(a->models), mb = __builtin_popcountll(b->models);
    return ma != mb ? ma < mb : a->models < b->models;
}

/* Identical GPU demand: interchangeable in any placement. */
static bool same_request(const kgpu_request *a, const kgpu_request *b)
{
    return a->gpu_count > 0 && a->gpu_count == b->gpu_count && a->exclusive == b->exclusive &&
           a->gpu_milli == b->gpu_milli && a->gpu_memory_mib == b->gpu_memory_mib &&
           a->models == b->models;
}

/* Whether GPUs a and b are interchangeable for any request. */
static bool same_state(const kgpu_gpu *a, const kgpu_gpu *b)
{
    return a->healthy == b->healthy && a->model == b->model && a->memory_mib == b->memory_mib &&
           a->free_milli == b->free_milli && a->free_memory_mib == b->free_memory_mib &&
           (a->placements == 0) == (b->placements == 0);
}

static bool untouched(const kgpu_gpu *g)
{
    return g->healthy && g->placements == 0 && g->free_milli == KGPU_MILLI &&
           g->free_memory_mib == g->memory_mib;
}

/* The sum of the k smallest of v[0..n) (k <= n), reordering v. k is small: selection. */
static int64_t smallest_sum(int64_t *v, int n, int k)
{
    int64_t sum = 0;
    for (int i = 0; i < k; i++) {
        int m = i;
        for (int j = i + 1; j < n; j++)
            m = v[j] < v[m] ? j : m;
        int64_t t = v[i];
        v[i] = v[m];
        v[m] = t;
        sum += v[i];
    }
    return sum;
}

/*
 * For each share size in the search order (largest memory first, then each
 * largest compute): the parts of at least that size must find room, at most
 * free / size of them on each GPU they may use. `mem` picks the dimension.
 */
static bool room_for_large_parts(const place_search *s, int level, bool mem)
{
    const kgpu_node *n = s->n;
    for (int i = level; i < s->nreq; i++) {
        const kgpu_request *r = s->req[i];
        int64_t size = mem ? r->gpu_memory_mib : r->gpu_milli;
        if (r->gpu_count <= 0 || r->exclusive || size <= 0)
            continue;
        long parts = 0, room = 0;
        uint64_t models = 0;
        for (int j = level; j < s->nreq; j++) {
            const kgpu_request *q = s->req[j];
            if (q->gpu_count > 0 && !q->exclusive &&
                (mem ? q->gpu_memory_mib : q->gpu_milli) >= size) {
                parts += q->gpu_count;
                models |= q->models;
            }
        }
        for (int g = 0; g < n->ngpus; g++) {
            const kgpu_gpu *x = &n->gpus[g];
            if (x->healthy && ((models >> x->model) & 1))
                room += (long)((mem ? x->free_memory_mib : x->free_milli) / size);
        }
        if (parts > room)
            return false;
    }
    return true;
}

/* Necessary conditions for req[level..] to fit what the scratch node has left. */
static bool bounds_hold(const place_search *s, int level)
{
    const kgpu_node *n = s->n;
    int whole = 0;
    int64_t share_mem = 0, share_milli = 0;
    uint64_t whole_models = 0, share_models = 0;
    for (int i = level; i < s->nreq; i++) {
        const kgpu_request *r = s->req[i];
        if (r->gpu_count <= 0)
            continue;
        if (i == level || !same_request(r, s->req[i - 1])) {
            if (kgpu__usable_gpus(n, r) < r->gpu_count)
                return false;
        }
        if (r->exclusive) {
            whole += r->gpu_count;
            whole_models |= r->models;
        } else {
            share_mem += (int64_t)r->gpu_count * r->gpu_memory_mib;
            share_milli += (int64_t)r->gpu_count * r->gpu_milli;
            share_models |= r->models;
        }
    }
    /*
     * The whole GPUs will take `whole` of the untouched GPUs they may use;
     * what the shares lose with them is at least the smallest such loss.
     */
    int64_t lost_mem[KGPU_MAX_GPUS_PER_NODE], lost_milli[KGPU_MAX_GPUS_PER_NODE];
    int nuntouched = 0;
    int64_t free_mem = 0, free_milli = 0;
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        bool for_shares = g->healthy && ((share_models >> g->model) & 1);
        if (for_shares) {
            free_mem += g->free_memory_mib;
            free_milli += g->free_milli;
        }
        if (untouched(g) && ((whole_models >> g->model) & 1)) {
            lost_mem[nuntouched] = for_shares ? g->memory_mib : 0;
            lost_milli[nuntouched++] = for_shares ? KGPU_MILLI : 0;
        }
    }
    if (whole > nuntouched)
        return false;
    if (share_mem == 0 && share_milli == 0)
        return true;
    free_mem -= smallest_sum(lost_mem, nuntouched, whole);
    free_milli -= smallest_sum(lost_milli, nuntouched, whole);
    return share_mem <= free_mem && share_milli <= free_milli &&
           room_for_large_parts(s, level, true) && room_for_large_parts(s, level, false);
}

static int search_level(place_search *s, int level);

/* Places req[level] on the k GPUs of s->pick[level], searches on, gives them back. */
static int search_try(place_search *s, int level)
{
    kgpu_assignment a;
    kgpu__node_take(s->n, s->node, s->req[level], s->pick[level], &a);
    int rc = search_level(s, level + 1);
    kgpu__node_give(s->n, &a);
    return rc;
}

/*
 * Whether the set `gpus` may follow the set of the previous level in its
 * run: no fewer GPUs of the run's first class, or as many and then no fewer
 * of the next, and so on (how many of each class: the order sets are taken in).
 */
static bool run_order_holds(const place_search *s, int level, const int *gpus)
{
    const int *cls = s->run_class[s->run[level]];
    int k = s->req[level]->gpu_count, count[KGPU_MAX_GPUS_PER_NODE] = {0};
    for (int j = 0; j < k; j++) {
        count[cls[gpus[j]]]++;
        count[cls[s->pick[level - 1][j]]]--;
    }
    for (int c = 0; c < s->n->ngpus; c++)
        if (count[c] != 0)
            return count[c] < 0; /* fewer of an earlier class: a later set in the order */
    return true;
}

/*
 * Every set of k GPUs among cand[i..nc), added to s->pick[level][0..nchosen),
 * where each class contributes a prefix of its members: a member whose class
 * had one skipped (bit in `skipped`) is not taken. `tried` is a set already
 * searched (as a mask of GPU positions), not searched again.
 */
static int search_sets(place_search *s, int level, const int *cand, const int *cls, int nc, int i,
                       int nchosen, uint64_t skipped, uint64_t tried)
{
    int k = s->req[level]->gpu_count, *chosen = s->pick[level];
    if (nchosen == k) {
        if (++s->steps > s->budget)
            return SEARCH_CUT;
        uint64_t mask = 0;
        for (int j = 0; j < k; j++)
            mask |= 1ULL << chosen[j];
        if (mask == tried || (s->run[level] < level && !run_order_holds(s, level, chosen)))
            return SEARCH_NONE;
        return search_try(s, level);
    }
    if (nc - i < k - nchosen)
        return SEARCH_NONE;
    if (!((skipped >> cls[i]) & 1)) {
        chosen[nchosen] = cand[i];
        int rc = search_sets(s, level, cand, cls, nc, i + 1, nchosen + 1, skipped, tried);
        if (rc != SEARCH_NONE)
            return rc;
    }
    return search_sets(s, level, cand, cls, nc, i + 1, nchosen, skipped | 1ULL << cls[i], tried);
}

static int search_level(place_search *s, int level)
{
    if (level == s->nreq)
        return SEARCH_FOUND;
    const kgpu_request *r = s->req[level];
    if (r->gpu_count <= 0)
        return search_level(s, level + 1); /* CPU was checked for all requests at once */
    if (++s->steps > s->budget)
        return SEARCH_CUT;
    if (!bounds_hold(s, level))
        return SEARCH_NONE;
    const kgpu_node *n = s->n;
    int run = s->run[level];
    if (run == level && level + 1 < s->nreq && s->run[level + 1] == level) {
        for (int g = 0; g < n->ngpus; g++) { /* a run begins: its classes */
            int j = 0;
            while (!same_state(&n->gpus[j], &n->gpus[g]))
                j++;
            s->run_class[level][g] = j;
        }
    }
    /* The usable GPUs, tightest first; each with the first candidate of its class. */
    int cand[KGPU_MAX_GPUS_PER_NODE], cls[KGPU_MAX_GPUS_PER_NODE], nc = 0;
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        if (!kgpu_gpu_usable(n, g, r))
            continue;
        int j = nc++;
        for (; j > 0; j--) {
            const kgpu_gpu *h = &n->gpus[cand[j - 1]];
            if (h->free_milli < g->free_milli ||
                (h->free_milli == g->free_milli && h->free_memory_mib <= g->free_memory_mib))
                break;
            cand[j] = cand[j - 1];
        }
        cand[j] = i;
    }
    if (nc < r->gpu_count)
        return SEARCH_NONE;
    for (int i = 0; i < nc; i++) {
        cls[i] = i;
        for (int j = 0; j < i; j++)
            if (same_state(&n->gpus[cand[j]], &n->gpus[cand[i]]) &&
                (run == level || s->run_class[run][cand[j]] == s->run_class[run][cand[i]])) {
                cls[i] = cls[j];
                break;
            }
    }
    /* Greedy's choice first; the same set of classes is not searched again below. */
    uint64_t tried = 0;
    if (kgpu__pick_best_fit(n, r, s->pick[level]) == 0) {
        int rc = search_try(s, level);
        if (rc != SEARCH_NONE)
            return rc;
        /* Its class-equivalent in canonical form: per class, as many of its first members. */
        int count[KGPU_MAX_GPUS_PER_NODE] = {0};
        for (int k = 0; k < r->gpu_count; k++)
            for (int i = 0; i < nc; i++)
                if (cand[i] == s->pick[level][k])
                    count[cls[i]]++;
        for (int i = 0; i < nc; i++)
            if (count[cls[i]] > 0) {
                count[cls[i]]--;
                tried |= 1ULL << cand[i];
            }
    }
    return search_sets(s, level, cand, cls, nc, 0, 0, 0, tried);
}

/*
 * Greedy placement of reqs on the scratch node n, in the caller's order,
 * each on its tightest GPUs: into gpus, true when all were placed. Otherwise
 * `why` names the first request that could not be placed. n is restored.
 */
static bool place_greedy(const kgpu_cluster *c, kgpu_node *n, int node,
                         const kgpu_request *const *reqs, int nreqs,
                         int (*gpus)[KGPU_MAX_GPUS_PER_NODE], char *why, size_t whylen)
{
    kgpu_assignment a[KGPU_PLACE_MAX_REQS];
    int placed = 0;
    bool ok = true;
    for (; placed < nreqs; placed++) {
        const kgpu_request *r = reqs[placed];
        if (!kgpu__fit(n, r) ||
            (r->gpu_count > 0 && kgpu__pick_best_fit(n, r, gpus[placed]) != 0)) {
            if (why != NULL && whylen > 0) {
                char reason[200];
                kgpu__fit_reason(c, n, r, reason, sizeof(reason));
                if (nreqs > 1)
                    snprintf(why, whylen, "container %d of %d: %s", placed + 1, nreqs, reason);
                else
                    snprintf(why, whylen, "%s", reason);
            }
            ok = false;
            break;
        }
        kgpu__node_take(n, node, r, gpus[placed], &a[placed]);
    }
    while (placed-- > 0)
        kgpu__node_give(n, &a[placed]);
    return ok;
}

int kgpu_place_all(const kgpu_cluster *c, int node, const kgpu_assignment *release, int nrelease,
                   const kgpu_request *const *reqs, int nreqs, long budget, unsigned flags,
                   kgpu_placement *out, char *why, size_t whylen)
{
    kgpu_placement local;
    if (out == NULL)
        out = &local;
    out->steps = 0;
    out->cut = false;
    if (why != NULL && whylen > 0)
        why[0] = '\0';
    if (node < 0 || node >= kgpu_cluster_node_count(c)) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "no node with index %d", node);
        return KGPU_PLACE_NONE;
    }
    if (nreqs < 0 || nreqs > KGPU_PLACE_MAX_REQS) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "%d GPU requests in one pod (at most %d)", nreqs,
                     KGPU_PLACE_MAX_REQS);
        return KGPU_PLACE_NONE;
    }
    /* A scratch copy of the node: the cluster itself is never touched. */
    kgpu_node tmp = *kgpu_cluster_node(c, node);
    kgpu_gpu gpus[KGPU_MAX_GPUS_PER_NODE];
    if (tmp.ngpus > 0)
        memcpy(gpus, tmp.gpus, (size_t)tmp.ngpus * sizeof(*gpus));
    tmp.gpus = gpus;
    if (flags & KGPU_PLACE_EMPTY) {
        for (int i = 0; i < tmp.ngpus; i++) {
            gpus[i].free_milli = KGPU_MILLI;
            gpus[i].free_memory_mib = gpus[i].memory_mib;
            gpus[i].placements = 0;
            gpus[i].healthy = true;
        }
        tmp.cpu_free = tmp.cpu_milli;
        tmp.memory_free = tmp.memory_mib;
        tmp.placements = 0;
        memset(tmp.class_count, 0, sizeof(tmp.class_count));
        nrelease = 0;
    }
    for (int i = 0; i < nrelease; i++) {
        if (release[i].node != node || kgpu__node_check_release(&tmp, &release[i], NULL) != 0) {
            if (why != NULL && whylen > 0)
                snprintf(why, whylen, "a placement to undo is not held on node %s", tmp.name);
            return KGPU_PLACE_NONE;
        }
        kgpu__node_give(&tmp, &release[i]);
    }
    /*
     * Greedy placement in the caller's order first: what placing containers
     * one at a time always found, it still finds, on the same GPUs. The
     * search runs only where that fails.
     */
    if (place_greedy(c, &tmp, node, reqs, nreqs, out->gpus, why, whylen))
        return KGPU_PLACE_FOUND;
    /* CPU and memory are the node's, whatever GPUs are chosen: all requests at once. */
    int64_t cpu = 0, mem = 0;
    for (int i = 0; i < nreqs; i++) {
        cpu += reqs[i]->cpu_milli;
        mem += reqs[i]->memory_mib;
    }
    if (cpu > tmp.cpu_free || mem > tmp.memory_free)
        return KGPU_PLACE_NONE;
    place_search s = {.n = &tmp, .node = node, .nreq = nreqs};
    int order[KGPU_PLACE_MAX_REQS];
    for (int i = 0; i < nreqs; i++) { /* insertion sort: stable, nreqs is small */
        int j = i;
        for (; j > 0 && harder(reqs[i], reqs[order[j - 1]]); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (int i = 0; i < nreqs; i++) {
        s.req[i] = reqs[order[i]];
        s.run[i] = i > 0 && same_request(s.req[i], s.req[i - 1]) ? s.run[i - 1] : i;
    }
    s.budget = budget > 0 ? budget : KGPU_PLACE_BUDGET;
    int rc = search_level(&s, 0);
    out->steps = s.steps < s.budget ? s.steps : s.budget;
    if (rc == SEARCH_FOUND) {
        for (int i = 0; i < nreqs; i++)
            if (s.req[i]->gpu_count > 0)
                memcpy(out->gpus[order[i]], s.pick[i], (size_t)s.req[i]->gpu_count * sizeof(int));
        if (why != NULL && whylen > 0)
            why[0] = '\0';
        return KGPU_PLACE_FOUND;
    }
    if (rc == SEARCH_NONE)
        return KGPU_PLACE_NONE; /* `why` has greedy's reason: as good as any */
    out->cut = true;
    if (why != NULL && whylen > 0) {
        size_t len = strlen(why);
        snprintf(why + len, whylen - len,
                 " (kgpu stopped searching for another arrangement of the containers after %ld "
                 "step%s)",
                 s.budget, s.budget == 1 ? "" : "s");
    }
    return KGPU_PLACE_UNKNOWN;
}

bool kgpu_fit_all(const kgpu_cluster *c, int node, const kgpu_assignment *release, int nrelease,
                  const kgpu_request *const *reqs, int nreqs, char *why, size_t whylen)
{
    if (nrelease == 0 && nreqs == 1) /* the common case: no search, no scratch copy */
        return kgpu_fit(c, node, reqs[0], why, whylen);
    return kgpu_place_all(c, node, release, nrelease, reqs, nreqs, 0, 0, NULL, why, whylen) ==
           KGPU_PLACE_FOUND;
}

bool kgpu_fit_all_empty(const kgpu_cluster *c, int node, const kgpu_request *const *reqs, int nreqs)
{
    return kgpu_place_all(c, node, NULL, 0, reqs, nreqs, 0, KGPU_PLACE_EMPTY, NULL, NULL, 0) !=
           KGPU_PLACE_NONE;
}
