/*
 * MIG placement in the trace simulator (include/kgpu/migsim.h): the trace
 * mapped to MIG instances, five online strategies, and the offline bound.
 *
 * Every decision asks mig.c (fits, first fit, slice order, choose, room);
 * the answers depend on a GPU's memory slices and compute only, so they are
 * cached per (mask, compute) key once per input, and a run over the trace's
 * 6,212 GPUs costs table lookups. "Room lost" is the cost every kgpu rule
 * minimises: room before less room after (kgpu_mig_room), the capacity for
 * later profiles that a placement takes away.
 *
 * The offline bound is a linear program over the layouts of one GPU, with
 * the structure MIG gives: each profile's placements lie inside the next
 * bigger one's, so instances can be matched to places of their own size or
 * bigger exactly when, for every size t, the places of size >= t are at
 * least the instances of size >= t (Hall's condition on a chain). Its dual
 * has one variable per size and one constraint per layout, with the slack
 * basis feasible, so a plain simplex with Bland's rule solves it.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/migsim.h"

static const char *const NAMES[KGPU_MIGSIM_STRATEGIES] = {"first-fit", "kgpu-order", "kgpu",
                                                          "best-fit", "most-room"};

const char *kgpu_migsim_strategy_name(kgpu_migsim_strategy s)
{
    return s >= 0 && s < KGPU_MIGSIM_STRATEGIES ? NAMES[s] : "?";
}

int kgpu_migsim_strategy_find(const char *name)
{
    for (int i = 0; name != NULL && i < KGPU_MIGSIM_STRATEGIES; i++)
        if (strcmp(NAMES[i], name) == 0)
            return i;
    return -1;
}

static int key_of(const kgpu_mig_gpu *g)
{
    return g->compute * 256 + g->mem;
}

/* The key after profile pi is taken at start on a GPU whose key is k. */
static int key_after(const kgpu_mig_model *m, int k, int pi, int start)
{
    const kgpu_mig_profile *p = &m->profiles[pi];
    return (k / 256 + p->compute) * 256 + ((k % 256) | kgpu_mig_mask(start, p->size));
}

int kgpu_migsim_profile_of(const kgpu_mig_model *m, const kgpu_request *r)
{
    const kgpu_mig_profile *p;
    if (r->gpu_count <= 0)
        return -1;
    if (r->exclusive || r->gpu_milli >= KGPU_MILLI) {
        p = kgpu_mig_profile_whole(m);
        if (p != NULL && r->gpu_memory_mib > p->memory_mib)
            p = NULL;
    } else {
        /* The compute slices the share asks for, rounded up: 460 milli is 3.22 of 7, so 4. */
        int compute = (r->gpu_milli * KGPU_MIG_COMPUTE_SLICES + KGPU_MILLI - 1) / KGPU_MILLI;
        p = kgpu_mig_profile_fit(m, compute > 0 ? compute : 1, r->gpu_memory_mib);
    }
    return p != NULL ? (int)(p - m->profiles) : -1;
}

static void fill_tables(kgpu_migsim_input *in)
{
    const kgpu_mig_model *m = in->model;
    int order[KGPU_MIG_MAX_PROFILES][KGPU_MIG_MAX_STARTS], norder[KGPU_MIG_MAX_PROFILES];
    for (int pi = 0; pi < m->nprofiles; pi++)
        norder[pi] = kgpu_mig_slice_order(m, pi, order[pi]);
    for (int k = 0; k < KGPU_MIGSIM_KEYS; k++) {
        kgpu_mig_gpu g;
        memset(&g, 0, sizeof(g));
        g.mem = (uint8_t)(k % 256);
        g.compute = k / 256;
        in->room[k] = (int16_t)kgpu_mig_room(m, &g);
        in->stranded[k] = (int8_t)kgpu_mig_stranded(m, &g);
        for (int pi = 0; pi < KGPU_MIG_MAX_PROFILES; pi++) {
            in->first_fit[k][pi] = in->slice[k][pi] = in->choose[k][pi] = -1;
            if (pi >= m->nprofiles || m->profiles[pi].media)
                continue;
            in->first_fit[k][pi] = (int8_t)kgpu_mig_first_fit(m, &g, pi);
            in->choose[k][pi] = (int8_t)kgpu_mig_choose(m, &g, pi, NULL);
            in->slice[k][pi] = (int8_t)kgpu_mig_slice_first(m, &g, pi, order[pi], norder[pi]);
        }
    }
}

int kgpu_migsim_input_init(const kgpu_mig_model *m, const kgpu_migsim_node *nodes, int nnodes,
                           const kgpu_migsim_request *requests, size_t nrequests,
                           kgpu_migsim_input *in, kgpu_error *err)
{
    memset(in, 0, sizeof(*in));
    if (m == NULL || nnodes < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "no MIG model or nodes");
    in->model = m;
    in->nodes = malloc(sizeof(*in->nodes) * (size_t)(nnodes > 0 ? nnodes : 1));
    in->requests = malloc(sizeof(*in->requests) * (nrequests > 0 ? nrequests : 1));
    if (in->nodes == NULL || in->requests == NULL) {
        kgpu_migsim_input_free(in);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (int i = 0; i < nnodes; i++) {
        if (nodes[i].gpus < 0 || nodes[i].gpus > KGPU_MAX_GPUS_PER_NODE) {
            kgpu_migsim_input_free(in);
            return kgpu_error_set(err, KGPU_EINVAL, "node %d: %d GPUs", i, nodes[i].gpus);
        }
        in->nodes[i] = nodes[i];
        in->gpus += nodes[i].gpus;
    }
    in->nnodes = nnodes;
    for (size_t i = 0; i < nrequests; i++) {
        const kgpu_migsim_request *r = &requests[i];
        bool ok = r->count >= 0 && r->count <= KGPU_MAX_GPUS_PER_NODE &&
                  r->profile < m->nprofiles && (r->profile < 0 || !m->profiles[r->profile].media);
        if (!ok) {
            kgpu_migsim_input_free(in);
            return kgpu_error_set(err, KGPU_EINVAL, "request %zu: profile %d x %d", i,
                                  r->profile, r->count);
        }
        in->requests[i] = *r;
    }
    in->nrequests = nrequests;
    fill_tables(in);
    return 0;
}

int kgpu_migsim_prepare(const kgpu_sim_input *sim, const kgpu_mig_model *m,
                        kgpu_migsim_input *in, kgpu_error *err)
{
    int nn = kgpu_cluster_node_count(sim->cluster);
    kgpu_migsim_node *nodes = malloc(sizeof(*nodes) * (size_t)(nn > 0 ? nn : 1));
    kgpu_migsim_request *reqs = malloc(sizeof(*reqs) * (sim->nrequests ? sim->nrequests : 1));
    int rc = 0;
    if (nodes == NULL || reqs == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < nn; i++) {
        const kgpu_node *n = kgpu_cluster_node(sim->cluster, i);
        nodes[i] = (kgpu_migsim_node){n->ngpus, n->cpu_milli, n->memory_mib};
    }
    for (size_t i = 0; rc == 0 && i < sim->nrequests; i++) {
        const kgpu_request *r = &sim->requests[i];
        reqs[i] = (kgpu_migsim_request){.profile = kgpu_migsim_profile_of(m, r),
                                        .count = r->gpu_count > 0 ? r->gpu_count : 0,
                                        .cpu_milli = r->cpu_milli,
                                        .memory_mib = r->memory_mib};
    }
    if (rc == 0)
        rc = kgpu_migsim_input_init(m, nodes, nn, reqs, sim->nrequests, in, err);
    free(nodes);
    free(reqs);
    return rc;
}

void kgpu_migsim_input_free(kgpu_migsim_input *in)
{
    free(in->nodes);
    free(in->requests);
    memset(in, 0, sizeof(*in));
}

/* ---- the online strategies ---- */

/*
 * kgpu's cost of a placement (KGPU, BEST_FIT) is kgpu_mig_cost's (mig.c):
 * room lost times KGPU_MIG_STRANDED_SCALE plus the compute slices stranded,
 * the rule the extender scores nodes by, taken here from per-key tables of
 * kgpu_mig_room and kgpu_mig_stranded (fill_tables), which is what makes a
 * study fast.
 */

typedef struct memo {
    long bstamp[KGPU_MIGSIM_KEYS];
    int64_t bcost[KGPU_MIGSIM_KEYS];
    int8_t bstart[KGPU_MIGSIM_KEYS];
} memo;

typedef struct run {
    const kgpu_migsim_input *in;
    kgpu_migsim_strategy s;
    kgpu_mig_gpu *g;    /* every GPU, node by node */
    int *first;         /* first[i]: node i's first GPU in g */
    int64_t *cpu, *mem; /* free per node */
    int *room;          /* per node: the sum of its GPUs' room */
    long stamp;         /* which arrival the memo's entries hold for */
    memo *m;            /* per GPU key: the best start for this arrival's profile */
} run;

static void run_free(run *r)
{
    free(r->g);
    free(r->first);
    free(r->cpu);
    free(r->mem);
    free(r->room);
    free(r->m);
}

static int run_init(run *r, const kgpu_migsim_input *in, kgpu_migsim_strategy s, kgpu_error *err)
{
    memset(r, 0, sizeof(*r));
    r->in = in;
    r->s = s;
    size_t nn = (size_t)in->nnodes + 1;
    r->g = calloc((size_t)in->gpus + 1, sizeof(*r->g));
    r->first = calloc(nn, sizeof(*r->first));
    r->cpu = calloc(nn, sizeof(*r->cpu));
    r->mem = calloc(nn, sizeof(*r->mem));
    r->room = calloc(nn, sizeof(*r->room));
    r->m = calloc(1, sizeof(*r->m));
    if (r->g == NULL || r->first == NULL || r->cpu == NULL || r->mem == NULL || r->room == NULL ||
        r->m == NULL) {
        run_free(r);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (int k = 0; k < KGPU_MIGSIM_KEYS; k++)
        r->m->bstamp[k] = -1;
    for (int i = 0, at = 0; i < in->nnodes; i++) {
        r->first[i] = at;
        at += in->nodes[i].gpus;
        r->cpu[i] = in->nodes[i].cpu_milli;
        r->mem[i] = in->nodes[i].memory_mib;
        r->room[i] = in->nodes[i].gpus * in->room[0];
    }
    return 0;
}

/* Where a request goes: node, and per instance the GPU (index in r->g) and start. */
typedef struct pick {
    int node, n;
    int gpu[KGPU_MAX_GPUS_PER_NODE], start[KGPU_MAX_GPUS_PER_NODE];
    int64_t cost; /* summed over the instances */
} pick;

static bool node_fits(const run *r, int i, const kgpu_migsim_request *q)
{
    return r->in->nodes[i].gpus >= q->count && r->cpu[i] >= q->cpu_milli &&
           r->mem[i] >= q->memory_mib;
}

static bool uses_stranded(kgpu_migsim_strategy s)
{
    return s == KGPU_MIGSIM_KGPU || s == KGPU_MIGSIM_BEST_FIT;
}

/* The cost of profile pi at start on a GPU of key k: room lost, or kgpu's (above). */
static int64_t cost_at(const run *r, int k, int pi, int start)
{
    int ka = key_after(r->in->model, k, pi, start);
    int64_t loss = r->in->room[k] - r->in->room[ka];
    if (!uses_stranded(r->s))
        return loss;
    return loss * KGPU_MIG_STRANDED_SCALE + r->in->stranded[ka];
}

/* The start of profile pi costing least on a GPU of key k (ties: the higher), or -1. */
static int best_start(run *r, int k, int pi, int64_t *cost)
{
    if (r->m->bstamp[k] != r->stamp) {
        const kgpu_mig_profile *p = &r->in->model->profiles[pi];
        kgpu_mig_gpu g;
        memset(&g, 0, sizeof(g));
        g.mem = (uint8_t)(k % 256);
        g.compute = k / 256;
        r->m->bstart[k] = -1;
        for (int si = p->nstarts - 1; si >= 0; si--) {
            if (!kgpu_mig_fits(r->in->model, &g, pi, p->starts[si]))
                continue;
            int64_t c = cost_at(r, k, pi, p->starts[si]);
            if (r->m->bstart[k] < 0 || c < r->m->bcost[k]) {
                r->m->bstart[k] = (int8_t)p->starts[si];
                r->m->bcost[k] = c;
            }
        }
        r->m->bstamp[k] = r->stamp;
    }
    *cost = r->m->bcost[k];
    return r->m->bstart[k];
}

/*
 * The allocator on one node: the first `count` GPUs, by index, where the
 * table gives a start (NVML's first fit or kgpu's slice order).
 */
static bool node_in_order(run *r, int i, const kgpu_migsim_request *q,
                          const int8_t (*tbl)[KGPU_MIG_MAX_PROFILES], pick *out)
{
    const kgpu_migsim_input *in = r->in;
    out->node = i;
    out->n = 0;
    out->cost = 0;
    for (int j = 0; j < in->nodes[i].gpus && out->n < q->count; j++) {
        int gi = r->first[i] + j, k = key_of(&r->g[gi]), s = tbl[k][q->profile];
        if (s < 0)
            continue;
        out->gpu[out->n] = gi;
        out->start[out->n++] = s;
        out->cost += cost_at(r, k, q->profile, s);
    }
    return out->n == q->count;
}

/*
 * Best fit on one node: each instance on the GPU where its best start costs
 * least, ties to the GPU with the least room (the fullest), then the lower
 * index. *room: the room of the GPUs taken.
 */
static bool node_best(run *r, int i, const kgpu_migsim_request *q, pick *out, int *room)
{
    const kgpu_migsim_input *in = r->in;
    int64_t cost[KGPU_MAX_GPUS_PER_NODE];
    int rb[KGPU_MAX_GPUS_PER_NODE], idx[KGPU_MAX_GPUS_PER_NODE], st[KGPU_MAX_GPUS_PER_NODE];
    int c = 0;
    for (int j = 0; j < in->nodes[i].gpus; j++) {
        int gi = r->first[i] + j, k = key_of(&r->g[gi]);
        int64_t l;
        int s = best_start(r, k, q->profile, &l);
        if (s < 0)
            continue;
        /* Insertion by (cost, room before): a node has at most 32 GPUs. */
        int b = in->room[k], at = c++;
        for (; at > 0 && (cost[at - 1] > l || (cost[at - 1] == l && rb[at - 1] > b)); at--) {
            cost[at] = cost[at - 1];
            rb[at] = rb[at - 1];
            idx[at] = idx[at - 1];
            st[at] = st[at - 1];
        }
        cost[at] = l;
        rb[at] = b;
        idx[at] = gi;
        st[at] = s;
    }
    if (c < q->count)
        return false;
    out->node = i;
    out->n = q->count;
    out->cost = 0;
    *room = 0;
    for (int t = 0; t < q->count; t++) {
        out->gpu[t] = idx[t];
        out->start[t] = st[t];
        out->cost += cost[t];
        *room += rb[t];
    }
    return true;
}

/* Whether (cost, gpu room, node room) a is better than b: lower first. */
static bool better(int64_t ca, int ga, int na, int64_t cb, int gb, int nb)
{
    if (ca != cb)
        return ca < cb;
    if (ga != gb)
        return ga < gb;
    return na < nb;
}

static bool choose_pick(run *r, const kgpu_migsim_request *q, pick *best)
{
    const kgpu_migsim_input *in = r->in;
    bool found = false;
    int best_g = 0;
    pick p;
    for (int i = 0; i < in->nnodes; i++) {
        if (!node_fits(r, i, q))
            continue;
        switch (r->s) {
        case KGPU_MIGSIM_FIRST_FIT:
        case KGPU_MIGSIM_KGPU_ORDER:
            if (node_in_order(r, i, q,
                              r->s == KGPU_MIGSIM_FIRST_FIT ? in->first_fit : in->slice, best))
                return true;
            break;
        case KGPU_MIGSIM_KGPU:
            /* The extender predicts the allocator's pick on each node and scores its cost. */
            if (node_in_order(r, i, q, in->slice, &p) &&
                (!found || better(p.cost, 0, r->room[i], best->cost, 0, r->room[best->node]))) {
                *best = p;
                found = true;
            }
            break;
        case KGPU_MIGSIM_BEST_FIT: {
            int gr;
            if (node_best(r, i, q, &p, &gr) &&
                (!found ||
                 better(p.cost, gr, r->room[i], best->cost, best_g, r->room[best->node]))) {
                *best = p;
                best_g = gr;
                found = true;
            }
            break;
        }
        case KGPU_MIGSIM_MOST_ROOM:
            if (node_in_order(r, i, q, in->slice, &p) &&
                (!found || r->room[i] - p.cost > r->room[best->node] - best->cost)) {
                *best = p;
                found = true;
            }
            break;
        default:
            return false;
        }
    }
    return found;
}

static void apply_pick(run *r, const kgpu_migsim_request *q, const pick *p)
{
    const kgpu_mig_model *m = r->in->model;
    r->cpu[p->node] -= q->cpu_milli;
    r->mem[p->node] -= q->memory_mib;
    for (int t = 0; t < p->n; t++) {
        kgpu_mig_gpu *g = &r->g[p->gpu[t]];
        r->room[p->node] -= r->in->room[key_of(g)];
        kgpu_mig_take(m, g, q->profile, p->start[t]);
        r->room[p->node] += r->in->room[key_of(g)];
    }
}

static void release_pick(run *r, const kgpu_migsim_request *q, const pick *p)
{
    const kgpu_mig_model *m = r->in->model;
    r->cpu[p->node] += q->cpu_milli;
    r->mem[p->node] += q->memory_mib;
    for (int t = 0; t < p->n; t++) {
        kgpu_mig_gpu *g = &r->g[p->gpu[t]];
        r->room[p->node] -= r->in->room[key_of(g)];
        kgpu_mig_give(m, g, q->profile, p->start[t]);
        r->room[p->node] += r->in->room[key_of(g)];
    }
}

/* One GPU request arrives: placed if the strategy finds room. */
static bool arrive(run *r, const kgpu_migsim_request *q, pick *p)
{
    if (q->profile < 0)
        return false;
    r->stamp++;
    if (!choose_pick(r, q, p))
        return false;
    apply_pick(r, q, p);
    return true;
}

static long slices_of(const kgpu_migsim_input *in, const kgpu_migsim_request *q)
{
    return q->profile >= 0 ? (long)q->count * in->model->profiles[q->profile].compute : 0;
}

int kgpu_migsim_run(const kgpu_migsim_input *in, kgpu_migsim_strategy s, const size_t *order,
                    size_t n, kgpu_migsim_result *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (s < 0 || s >= KGPU_MIGSIM_STRATEGIES)
        return kgpu_error_set(err, KGPU_EINVAL, "unknown MIG strategy %d", (int)s);
    run r;
    int rc = run_init(&r, in, s, err);
    if (rc != 0)
        return rc;
    long asked = 0, total = (long)in->gpus * KGPU_MIG_COMPUTE_SLICES;
    out->first_fail_pct = -1;
    for (size_t a = 0; a < n; a++) {
        if (order[a] >= in->nrequests) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "arrival %zu: no request %zu", a, order[a]);
            break;
        }
        const kgpu_migsim_request *q = &in->requests[order[a]];
        if (q->count == 0)
            continue;
        out->requests++;
        asked += slices_of(in, q);
        out->asked = asked;
        pick p;
        if (arrive(&r, q, &p)) {
            out->placed++;
            out->instances += q->count;
            out->slices += slices_of(in, q);
        } else if (q->profile >= 0) {
            out->failed_by_full += asked <= total;
            if (out->first_fail_pct < 0)
                out->first_fail_pct = total > 0 ? (double)asked * 100.0 / (double)total : 0;
        }
        if (asked <= total)
            out->slices_at_full = out->slices;
    }
    for (int i = 0; i < in->gpus; i++)
        out->gpus_used += r.g[i].mem != 0;
    run_free(&r);
    return rc;
}

int kgpu_migsim_run_times(const kgpu_migsim_input *in, kgpu_migsim_strategy s,
                          const size_t *order, const double *arrive_t, const double *life,
                          size_t n, kgpu_migsim_result *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    out->first_fail_pct = -1;
    if (s < 0 || s >= KGPU_MIGSIM_STRATEGIES)
        return kgpu_error_set(err, KGPU_EINVAL, "unknown MIG strategy %d", (int)s);
    run r;
    int rc = run_init(&r, in, s, err);
    if (rc != 0)
        return rc;
    pick *held = malloc(sizeof(*held) * (n > 0 ? n : 1));
    kgpu__dep_heap h = {0};
    long slices = 0, total = (long)in->gpus * KGPU_MIG_COMPUTE_SLICES;
    double area = 0, t_prev = n > 0 ? arrive_t[0] : 0;
    if (held == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t a = 0; rc == 0 && a < n; a++) {
        if (order[a] >= in->nrequests || (a > 0 && arrive_t[a] < arrive_t[a - 1]) ||
            !(life[a] >= 0)) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "arrival %zu: bad request, time or lifetime",
                                a);
            break;
        }
        /* Departures up to this instant first. */
        while (h.n > 0 && h.v[0].t <= arrive_t[a]) {
            kgpu__departure d = kgpu__dep_pop(&h);
            const kgpu_migsim_request *q = &in->requests[order[d.pod]];
            area += (double)slices * (d.t - t_prev);
            t_prev = d.t;
            release_pick(&r, q, &held[d.pod]);
            slices -= slices_of(in, q);
        }
        area += (double)slices * (arrive_t[a] - t_prev);
        t_prev = arrive_t[a];
        const kgpu_migsim_request *q = &in->requests[order[a]];
        if (q->count == 0)
            continue;
        out->requests++;
        out->asked += slices_of(in, q);
        if (!arrive(&r, q, &held[a])) {
            if (q->profile >= 0 && out->first_fail_pct < 0)
                out->first_fail_pct = total > 0 ? (double)slices * 100.0 / (double)total : 0;
            continue;
        }
        out->placed++;
        out->instances += q->count;
        out->slices += slices_of(in, q);
        slices += slices_of(in, q);
        if (!kgpu__dep_push(&h, (kgpu__departure){arrive_t[a] + life[a], a, 0}))
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    double span = n > 0 ? arrive_t[n - 1] - arrive_t[0] : 0;
    out->mean_in_use = span > 0 ? area / span : (double)slices;
    for (int i = 0; i < in->gpus; i++)
        out->gpus_used += r.g[i].mem != 0;
    free(h.v);
    free(held);
    run_free(&r);
    return rc;
}

/* ---- the layouts of one GPU and the linear program ---- */

typedef struct layouts {
    int (*v)[KGPU_MIG_MAX_PROFILES];
    int n, max;
    bool overflow;
} layouts;

static bool maximal(const kgpu_mig_model *m, const kgpu_mig_gpu *g)
{
    for (int pi = 0; pi < m->nprofiles; pi++)
        for (int s = 0; !m->profiles[pi].media && s < m->profiles[pi].nstarts; s++)
            if (kgpu_mig_fits(m, g, pi, m->profiles[pi].starts[s]))
                return false;
    return true;
}

/* Every set of placements, each added in (profile, start) order after the last one. */
static void enumerate(const kgpu_mig_model *m, kgpu_mig_gpu *g, int from, layouts *out)
{
    if (maximal(m, g)) {
        for (int i = 0; i < out->n; i++)
            if (memcmp(out->v[i], g->count, sizeof(g->count)) == 0)
                return;
        if (out->n == out->max) {
            out->overflow = true;
            return;
        }
        memcpy(out->v[out->n++], g->count, sizeof(g->count));
        return;
    }
    for (int slot = from; slot < m->nprofiles * KGPU_MIG_MAX_STARTS; slot++) {
        int pi = slot / KGPU_MIG_MAX_STARTS, si = slot % KGPU_MIG_MAX_STARTS;
        const kgpu_mig_profile *p = &m->profiles[pi];
        if (p->media || si >= p->nstarts || !kgpu_mig_fits(m, g, pi, p->starts[si]))
            continue;
        kgpu_mig_take(m, g, pi, p->starts[si]);
        enumerate(m, g, slot + 1, out);
        kgpu_mig_give(m, g, pi, p->starts[si]);
    }
}

int kgpu_migsim_layouts(const kgpu_mig_model *m, int (*out)[KGPU_MIG_MAX_PROFILES], int max)
{
    if (m == NULL)
        return -1;
    kgpu_mig_gpu g;
    memset(&g, 0, sizeof(g));
    layouts l = {.v = out, .n = 0, .max = max};
    enumerate(m, &g, 0, &l);
    return l.overflow ? -1 : l.n;
}

#define LP_EPS 1e-9

/*
 * max D.y subject to C y <= 1, y >= 0 (rows: layouts; columns: sizes), by
 * the tableau simplex from the slack basis, Bland's rule against cycling.
 * Returns the optimum, or -1 when unbounded (a demanded size no layout has).
 */
static double dual_simplex(int rows, int cols, const double *c, const double *d)
{
    int w = cols + rows + 1; /* y, slacks, right-hand side */
    double *t = calloc((size_t)(rows + 1) * (size_t)w, sizeof(double));
    int *basis = calloc((size_t)rows + 1, sizeof(int));
    if (t == NULL || basis == NULL) {
        free(t);
        free(basis);
        return -1;
    }
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++)
            t[i * w + j] = c[i * cols + j];
        t[i * w + cols + i] = 1;
        t[i * w + w - 1] = 1;
        basis[i] = cols + i;
    }
    double *z = &t[rows * w]; /* reduced costs of the maximisation, negated */
    for (int j = 0; j < cols; j++)
        z[j] = -d[j];
    double value = -1;
    for (int iter = 0; iter < 10000; iter++) {
        int e = -1;
        for (int j = 0; j < w - 1 && e < 0; j++)
            if (z[j] < -LP_EPS)
                e = j;
        if (e < 0) {
            value = z[w - 1];
            break;
        }
        int lv = -1;
        double best = 0;
        for (int i = 0; i < rows; i++) {
            double a = t[i * w + e];
            if (a <= LP_EPS)
                continue;
            double ratio = t[i * w + w - 1] / a;
            if (lv < 0 || ratio < best - LP_EPS ||
                (ratio <= best + LP_EPS && basis[i] < basis[lv])) {
                lv = i;
                best = ratio;
            }
        }
        if (lv < 0)
            break; /* unbounded */
        double piv = t[lv * w + e];
        for (int j = 0; j < w; j++)
            t[lv * w + j] /= piv;
        for (int i = 0; i <= rows; i++) {
            double f = t[i * w + e];
            if (i == lv || f == 0)
                continue;
            for (int j = 0; j < w; j++)
                t[i * w + j] -= f * t[lv * w + j];
        }
        basis[lv] = e;
    }
    free(t);
    free(basis);
    return value;
}

/* The LP of kgpu_migsim_lp over the given layouts. */
static double lp_over(const kgpu_mig_model *m, int (*lay)[KGPU_MIG_MAX_PROFILES], int nl,
                      const long *demand)
{
    int size[KGPU_MIG_MAX_PROFILES], ns = 0; /* the non-"+me" profiles, smallest first */
    for (int pi = 0; pi < m->nprofiles; pi++)
        if (!m->profiles[pi].media)
            size[ns++] = pi;
    double d[KGPU_MIG_MAX_PROFILES];
    double *c = calloc((size_t)(nl > 0 ? nl : 1) * (size_t)ns, sizeof(double));
    if (c == NULL)
        return -1;
    bool any = false;
    for (int t = 0; t < ns; t++) {
        d[t] = 0;
        for (int u = t; u < ns; u++)
            d[t] += (double)demand[size[u]];
        any = any || d[t] > 0;
        for (int l = 0; l < nl; l++)
            for (int u = t; u < ns; u++)
                c[l * ns + t] += lay[l][size[u]];
    }
    double v = any ? dual_simplex(nl, ns, c, d) : 0;
    free(c);
    return v;
}

double kgpu_migsim_lp(const kgpu_mig_model *m, const long demand[KGPU_MIG_MAX_PROFILES])
{
    int lay[KGPU_MIGSIM_MAX_LAYOUTS][KGPU_MIG_MAX_PROFILES];
    int nl = kgpu_migsim_layouts(m, lay, KGPU_MIGSIM_MAX_LAYOUTS);
    if (nl < 0)
        return -1;
    for (int pi = 0; pi < m->nprofiles; pi++)
        if (demand[pi] < 0 || (demand[pi] > 0 && m->profiles[pi].media))
            return -1;
    return lp_over(m, lay, nl, demand);
}

/* ---- the offline bound ---- */

typedef struct offline {
    const kgpu_migsim_input *in;
    const kgpu_migsim_request **q; /* the possible requests, smallest first */
    long n;
    int (*lay)[KGPU_MIG_MAX_PROFILES];
    int nl;
} offline;

static int cmp_req(const void *x, const void *y)
{
    const kgpu_migsim_request *a = *(const kgpu_migsim_request *const *)x;
    const kgpu_migsim_request *b = *(const kgpu_migsim_request *const *)y;
#define CMP(f)                                                                                     \
    if (a->f != b->f)                                                                              \
        return a->f < b->f ? -1 : 1;
    CMP(count)
    CMP(profile)
    CMP(cpu_milli)
    CMP(memory_mib)
#undef CMP
    return a < b ? -1 : a > b; /* pointers into one array: file order */
}

/* Whether an empty node could take q. */
static bool ever_fits(const kgpu_migsim_input *in, const kgpu_migsim_request *q)
{
    for (int i = 0; q->profile >= 0 && i < in->nnodes; i++)
        if (in->nodes[i].gpus >= q->count && in->nodes[i].cpu_milli >= q->cpu_milli &&
            in->nodes[i].memory_mib >= q->memory_mib)
            return true;
    return false;
}

static double lp_of_prefix(const offline *o, long k)
{
    long demand[KGPU_MIG_MAX_PROFILES] = {0};
    for (long i = 0; i < k; i++)
        demand[o->q[i]->profile] += o->q[i]->count;
    return lp_over(o->in->model, o->lay, o->nl, demand);
}

/*
 * Places the k smallest, largest first, with every constraint: first fit
 * over nodes and GPUs in order, the start by kgpu_mig_choose. A cursor per
 * profile skips GPUs where it no longer fits (a GPU only fills up).
 * Returns 1 when all k are placed, 0 when not, or an error.
 */
static int pack_prefix(const offline *o, long k, kgpu_error *err)
{
    const kgpu_migsim_input *in = o->in;
    run r;
    int rc = run_init(&r, in, KGPU_MIGSIM_FIRST_FIT, err);
    if (rc != 0)
        return rc;
    int *node_of = malloc(sizeof(int) * (size_t)(in->gpus + 1));
    if (node_of == NULL) {
        run_free(&r);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (int i = 0; i < in->nnodes; i++)
        for (int j = 0; j < in->nodes[i].gpus; j++)
            node_of[r.first[i] + j] = i;
    int cursor = 0, cursor_profile = -1;
    bool all = true;
    for (long a = k - 1; a >= 0 && all; a--) {
        const kgpu_migsim_request *q = o->q[a];
        pick p;
        bool ok = false;
        if (q->count > 1) {
            for (int i = 0; i < in->nnodes && !ok; i++)
                ok = node_fits(&r, i, q) && node_in_order(&r, i, q, in->choose, &p);
        } else {
            if (q->profile != cursor_profile) {
                cursor = 0;
                cursor_profile = q->profile;
            }
            for (int gi = cursor; gi < in->gpus && !ok; gi++) {
                int s = in->choose[key_of(&r.g[gi])][q->profile];
                if (s < 0) {
                    if (gi == cursor)
                        cursor++;
                    continue;
                }
                int i = node_of[gi];
                if (!node_fits(&r, i, q))
                    continue;
                p = (pick){.node = i, .n = 1, .gpu = {gi}, .start = {s}};
                ok = true;
            }
        }
        if (ok)
            apply_pick(&r, q, &p);
        all = ok;
    }
    free(node_of);
    run_free(&r);
    return all ? 1 : 0;
}

int kgpu_migsim_offline(const kgpu_migsim_input *in, const size_t *order, size_t n,
                        kgpu_migsim_bound *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    int lay[KGPU_MIGSIM_MAX_LAYOUTS][KGPU_MIG_MAX_PROFILES];
    int nl = kgpu_migsim_layouts(in->model, lay, KGPU_MIGSIM_MAX_LAYOUTS);
    if (nl < 0)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: more than %d MIG layouts", in->model->name,
                              KGPU_MIGSIM_MAX_LAYOUTS);
    offline o = {.in = in, .lay = lay, .nl = nl};
    o.q = malloc(sizeof(*o.q) * (n > 0 ? n : 1));
    if (o.q == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t a = 0; a < n && rc == 0; a++) {
        if (order[a] >= in->nrequests) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "arrival %zu: no request %zu", a, order[a]);
            break;
        }
        const kgpu_migsim_request *q = &in->requests[order[a]];
        if (q->count == 0)
            continue;
        out->requests++;
        if (ever_fits(in, q))
            o.q[o.n++] = q;
    }
    out->possible = o.n;
    if (rc == 0)
        qsort(o.q, (size_t)o.n, sizeof(*o.q), cmp_req);
    /* The LP's value grows with k: the largest k within the GPUs, by bisection. */
    long lo = 0, hi = o.n;
    while (rc == 0 && lo < hi) {
        long mid = lo + (hi - lo + 1) / 2;
        double v = lp_of_prefix(&o, mid);
        if (v < 0)
            rc = kgpu_error_set(err, KGPU_ESTATE, "the MIG bound's LP found no optimum (out of "
                                "memory, or no pivot left after 10,000)");
        else if (v <= in->gpus + 1e-6)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (rc == 0) {
        out->upper = lo;
        out->lp_gpus = lp_of_prefix(&o, lo);
    }
    /* The packing: bisection too (a k placed is a lower bound whether or not k+1 would be). */
    lo = 0;
    hi = out->upper;
    while (rc == 0 && lo < hi) {
        long mid = lo + (hi - lo + 1) / 2;
        int ok = pack_prefix(&o, mid, err);
        if (ok < 0 || ok > 1)
            rc = ok;
        else if (ok == 1)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (rc == 0)
        out->packed = lo;
    free(o.q);
    return rc;
}
