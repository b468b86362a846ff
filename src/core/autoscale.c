/*
 * The autoscaled replay (kgpu/autoscale.h): an event loop over arrivals,
 * departures, nodes becoming ready, spot interruptions and the autoscaler's
 * scans, on a cluster that starts empty. Pure and reentrant, like churn.c.
 *
 * Two views of a node live side by side. The scheduler (kgpu's policy)
 * places pods by the real per-GPU fit. Cluster Autoscaler simulates by
 * sums: per node, the CPU and memory free, and the extended resources as
 * counters — whole GPUs (nvidia.com/gpu) apart from shares' compute and
 * memory (kgpu.io/gpu-core, kgpu.io/gpu-mem), each summed over the node's
 * GPUs — and without the pods' GPU-model annotations, which are no
 * scheduler predicate. Its estimator, its count of the nodes still coming
 * up and (for its own expanders) its scale-down use the sums; kgpu's
 * expander re-places each option for real, and kgpu's scale-down keeps a
 * node whose pods would not really fit elsewhere.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/autoscale.h"

const kgpu_price *kgpu_prices_gpu(const kgpu_prices *p, const char *name)
{
    for (int i = 0; i < p->nmodels; i++)
        if (strcmp(p->model[i], name) == 0)
            return &p->gpu[i];
    return NULL;
}

static bool same_shape(const kgpu_node *a, const kgpu_node *b)
{
    if (a->cpu_milli != b->cpu_milli || a->memory_mib != b->memory_mib || a->ngpus != b->ngpus)
        return false;
    for (int g = 0; g < a->ngpus; g++)
        if (a->gpus[g].model != b->gpus[g].model || a->gpus[g].memory_mib != b->gpus[g].memory_mib)
            return false;
    return true;
}

int kgpu_autoscale_prepare(const kgpu_churn_input *churn, const bool *tolerates_spot,
                           kgpu_autoscale_input *in, kgpu_error *err)
{
    memset(in, 0, sizeof(*in));
    in->churn = churn;
    in->tolerates_spot = tolerates_spot;
    const kgpu_cluster *c = churn->sim->cluster;
    int nn = kgpu_cluster_node_count(c);
    for (int i = 0; i < nn; i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        int g = 0;
        for (; g < in->ngroups; g += 2)
            if (same_shape(kgpu_cluster_node(c, in->groups[g].tmpl), n))
                break;
        if (g == in->ngroups) {
            if (in->ngroups + 2 > KGPU_AS_MAX_GROUPS)
                return kgpu_error_set(err, KGPU_ERANGE,
                                      "more than %d node shapes: at most %d node groups",
                                      KGPU_AS_MAX_GROUPS / 2, KGPU_AS_MAX_GROUPS);
            in->groups[g] = (kgpu_as_group){.tmpl = i, .spot = false};
            in->groups[g + 1] = (kgpu_as_group){.tmpl = i, .spot = true};
            in->ngroups += 2;
        }
        in->groups[g].max++;
        in->groups[g + 1].max++;
    }
    return 0;
}

void kgpu_autoscale_input_free(kgpu_autoscale_input *in)
{
    memset(in, 0, sizeof(*in));
}

double kgpu_prices_node(const kgpu_prices *p, const kgpu_cluster *c, const kgpu_node *n,
                        bool spot)
{
    double price = (double)n->cpu_milli / 1000.0 *
                   (spot ? p->cpu_core.spot : p->cpu_core.on_demand);
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_price *gp = kgpu_prices_gpu(p, kgpu_cluster_model_name(c, n->gpus[i].model));
        if (gp == NULL)
            return -1;
        price += spot ? gp->spot : gp->on_demand;
    }
    return price;
}

double kgpu_autoscale_group_price(const kgpu_autoscale_input *in, int g, const kgpu_prices *p)
{
    const kgpu_cluster *c = in->churn->sim->cluster;
    return kgpu_prices_node(p, c, kgpu_cluster_node(c, in->groups[g].tmpl), in->groups[g].spot);
}

/*
 * Departures (core.h, depheap.c): `gen` tells a pod's current run from one
 * that ended early (evicted, moved, interrupted), whose departure stays in
 * the heap and is skipped when it comes up.
 */
typedef kgpu__departure departure;
typedef kgpu__dep_heap heap;

/* ---- CA's view of a node: free amounts by sums ---- */

typedef struct sums {
    int64_t cpu, mem;   /* free CPU milli and memory MiB */
    int64_t whole;      /* nvidia.com/gpu free: GPUs no whole-GPU pod holds */
    int64_t milli, gmem; /* share compute and GPU memory free, summed over the node */
} sums;

static bool sums_fit(const sums *s, const kgpu_request *r)
{
    if (r->cpu_milli > s->cpu || r->memory_mib > s->mem)
        return false;
    if (r->gpu_count <= 0)
        return true;
    if (r->exclusive)
        return r->gpu_count <= s->whole;
    return (int64_t)r->gpu_count * r->gpu_milli <= s->milli &&
           (int64_t)r->gpu_count * r->gpu_memory_mib <= s->gmem;
}

/* Takes r from s (sign 1) or gives it back (-1). */
static void sums_take(sums *s, const kgpu_request *r, int sign)
{
    s->cpu -= sign * r->cpu_milli;
    s->mem -= sign * r->memory_mib;
    if (r->gpu_count <= 0)
        return;
    if (r->exclusive) {
        s->whole -= sign * r->gpu_count;
    } else {
        s->milli -= sign * (int64_t)r->gpu_count * r->gpu_milli;
        s->gmem -= sign * (int64_t)r->gpu_count * r->gpu_memory_mib;
    }
}

static sums sums_empty(const kgpu_node *n)
{
    sums s = {n->cpu_milli, n->memory_mib, n->ngpus, (int64_t)n->ngpus * KGPU_MILLI, 0};
    for (int g = 0; g < n->ngpus; g++)
        s.gmem += n->gpus[g].memory_mib;
    return s;
}

/* ---- the run ---- */

enum { N_FREE = 0, N_PROVISIONING, N_READY };
enum { P_NOT_YET = 0, P_PENDING, P_RUNNING, P_DONE };
#define NONE SIZE_MAX

typedef struct asnode {
    int group, state;
    double created, ready_at, interrupt_at, unneeded_since; /* unneeded_since < 0: needed */
    bool held_pod;
    sums ca;     /* what CA thinks is free */
    size_t head; /* first pod on it (slot), or NONE */
    int pods;
} asnode;

/* A node's life, for the bill. */
typedef struct life {
    int group;
    double from, to;
} life;

typedef struct run {
    const kgpu_autoscale_input *in;
    const kgpu_autoscale_config *cfg;
    const kgpu_sim_input *sim;
    kgpu_autoscale_result *out;
    kgpu_cluster *c;
    kgpu_policy *p;
    kgpu_learner *learner;
    kgpu_rng prng, xrng, srng; /* the policy's ties, the expanders' ties, interruptions */
    bool kgpu_view;            /* scale-down by the real fit (kgpu's expander) */
    double price[KGPU_AS_MAX_GROUPS];
    kgpu_expander_group eg[KGPU_AS_MAX_GROUPS];
    int live[KGPU_AS_MAX_GROUPS]; /* nodes provisioning or ready, per group */
    int nlive;
    /* Nodes: one per cluster node; a removed node's slot is FREE and reused by its group. */
    asnode *nodes;
    int nnodes, capnodes;
    int *ready_all, *ready_od; /* ready nodes; ready on-demand nodes */
    int *freed, *od;           /* scratch, one per node */
    int nready_all, nready_od;
    /* Pods, per arrival k in time order. */
    size_t n, *slot;
    double *arrive, *pend_since, *waited, *started;
    int *status;
    uint32_t *gen;
    bool *ever;
    size_t *next_on, *prev_on;
    kgpu_assignment *placed;
    size_t *pending;
    size_t npending;
    heap deps;
    life *lives;
    size_t nlives, caplives;
    double last_scale_up, last_t, used_area; /* used_area: GPU milli x s over the span */
    uint64_t sd_seq; /* the cluster's change count when scale-down last looked */
    int sd_nodes;    /* and its node count then */
    /* Scratch. */
    sums *tmp, *tmp2;
    sums *newn; /* the estimator's new nodes: as many as the largest quota */
    bool *excluded;
    const kgpu_request **opt_pods;
    kgpu_expander_option *opts;
    size_t *cand;
    double *key;
} run;

static bool tolerates(const run *r, size_t k)
{
    return r->in->tolerates_spot != NULL && r->in->tolerates_spot[r->slot[k]];
}

static const kgpu_request *req_of(const run *r, size_t k)
{
    return &r->sim->requests[r->slot[k]];
}

static void rebuild_ready(run *r)
{
    r->nready_all = r->nready_od = 0;
    for (int i = 0; i < r->nnodes; i++) {
        if (r->nodes[i].state != N_READY)
            continue;
        r->ready_all[r->nready_all++] = i;
        if (!r->in->groups[r->nodes[i].group].spot)
            r->ready_od[r->nready_od++] = i;
    }
}

/* GPU allocated integrated over the costed span's start onwards (its end comes later). */
static void advance(run *r, double t)
{
    if (t > r->last_t) {
        double from = r->last_t > r->out->t_first ? r->last_t : r->out->t_first;
        if (t > from)
            r->used_area += (double)kgpu_cluster_gpu_milli_allocated(r->c) * (t - from);
        r->last_t = t;
    }
}

static int add_life(run *r, int group, double from, double to, kgpu_error *err)
{
    if (r->nlives == r->caplives) {
        size_t cap = r->caplives ? 2 * r->caplives : 64;
        life *v = realloc(r->lives, cap * sizeof(*v));
        if (v == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        r->lives = v;
        r->caplives = cap;
    }
    r->lives[r->nlives++] = (life){group, from, to};
    return 0;
}

static void link_pod(run *r, size_t k, int node)
{
    asnode *nd = &r->nodes[node];
    r->prev_on[k] = NONE;
    r->next_on[k] = nd->head;
    if (nd->head != NONE)
        r->prev_on[nd->head] = k;
    nd->head = k;
    nd->pods++;
    nd->held_pod = true;
}

static void unlink_pod(run *r, size_t k, int node)
{
    asnode *nd = &r->nodes[node];
    if (r->prev_on[k] != NONE)
        r->next_on[r->prev_on[k]] = r->next_on[k];
    else
        nd->head = r->next_on[k];
    if (r->next_on[k] != NONE)
        r->prev_on[r->next_on[k]] = r->prev_on[k];
    nd->pods--;
}

/* Places pod k among nodes[0..nn) (the scheduler: kgpu's policy). 1 placed, 0 no fit, <0 error. */
static int place(run *r, size_t k, const int *nodes, int nn, double t, kgpu_error *err)
{
    if (nn == 0)
        return 0;
    const kgpu_request *req = req_of(r, k);
    int node, gpus[KGPU_MAX_GPUS_PER_NODE];
    int rc = kgpu_policy_select(r->p, r->c, req, nodes, nn, &r->prng, &node, gpus, err);
    if (rc == KGPU_ENOFIT)
        return 0;
    if (rc != 0)
        return rc;
    if ((rc = kgpu_cluster_apply(r->c, req, node, gpus, &r->placed[k], err)) != 0)
        return rc;
    sums_take(&r->nodes[node].ca, req, 1);
    link_pod(r, k, node);
    if (r->in->groups[r->nodes[node].group].spot)
        r->out->pods_on_spot++;
    if (r->status[k] == P_PENDING)
        r->waited[k] += t - r->pend_since[k];
    r->status[k] = P_RUNNING;
    r->ever[k] = true;
    r->started[k] = t;
    if (!kgpu__dep_push(&r->deps, (departure){t + r->in->churn->lifetime[r->slot[k]], k, r->gen[k]}))
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    return 1;
}

/* Pod k arrives or is sent back: placed now where it fits, else pending. */
static int place_or_pend(run *r, size_t k, double t, kgpu_error *err)
{
    int pl = tolerates(r, k) ? place(r, k, r->ready_all, r->nready_all, t, err)
                             : place(r, k, r->ready_od, r->nready_od, t, err);
    if (pl < 0)
        return pl;
    if (pl == 0) {
        r->status[k] = P_PENDING;
        r->pend_since[k] = t;
        r->pending[r->npending++] = k;
    }
    return 0;
}

/* Pod k leaves node its node: done, or (restart) back to pending with its work lost. */
static int unplace(run *r, size_t k, double t, bool restart, kgpu_error *err)
{
    const kgpu_request *req = req_of(r, k);
    int node = r->placed[k].node;
    int rc = kgpu_cluster_release(r->c, &r->placed[k], err);
    if (rc != 0)
        return rc;
    sums_take(&r->nodes[node].ca, req, -1);
    unlink_pod(r, k, node);
    r->gen[k]++;
    if (!restart) {
        r->status[k] = P_DONE;
        return 0;
    }
    r->out->restarted++;
    r->out->lost_gpu_hours += (double)kgpu__gpu_demand(req) / KGPU_MILLI * (t - r->started[k]) /
                              3600.0;
    r->status[k] = P_NOT_YET; /* place_or_pend decides */
    return 0;
}

/* Pending pods tried on nodes[0..nn) (room appeared there), in their order. */
static int retry(run *r, const int *nodes, int nn, double t, kgpu_error *err)
{
    int *od = r->od;
    size_t keep = 0;
    for (size_t i = 0; i < r->npending; i++) {
        size_t k = r->pending[i];
        const kgpu_request *req = req_of(r, k);
        const int *use = nodes;
        int nu = nn;
        if (!tolerates(r, k)) {
            /* Spot nodes are tainted: only the on-demand ones. */
            nu = 0;
            for (int j = 0; j < nn; j++)
                if (!r->in->groups[r->nodes[nodes[j]].group].spot)
                    od[nu++] = nodes[j];
            use = od;
        }
        bool fits = false;
        for (int j = 0; j < nu && !fits; j++)
            fits = kgpu__fit(kgpu_cluster_node(r->c, use[j]), req);
        int pl = fits ? place(r, k, use, nu, t, err) : 0;
        if (pl < 0)
            return pl;
        if (pl == 0)
            r->pending[keep++] = k;
    }
    r->npending = keep;
    return 0;
}

static int grow_nodes(run *r, kgpu_error *err)
{
    if (r->nnodes < r->capnodes)
        return 0;
    int cap = r->capnodes ? 2 * r->capnodes : 64;
    asnode *nv = realloc(r->nodes, (size_t)cap * sizeof(*nv));
    if (nv != NULL)
        r->nodes = nv;
    int *a = nv ? realloc(r->ready_all, (size_t)cap * sizeof(*a)) : NULL;
    if (a != NULL)
        r->ready_all = a;
    int *b = a ? realloc(r->ready_od, (size_t)cap * sizeof(*b)) : NULL;
    if (b != NULL)
        r->ready_od = b;
    sums *s = b ? realloc(r->tmp, (size_t)cap * sizeof(*s)) : NULL;
    if (s != NULL)
        r->tmp = s;
    sums *s2 = s ? realloc(r->tmp2, (size_t)cap * sizeof(*s2)) : NULL;
    if (s2 != NULL)
        r->tmp2 = s2;
    int *f = s2 ? realloc(r->freed, (size_t)cap * sizeof(*f)) : NULL;
    if (f != NULL)
        r->freed = f;
    int *o = f ? realloc(r->od, (size_t)cap * sizeof(*o)) : NULL;
    if (o != NULL)
        r->od = o;
    bool *x = o ? realloc(r->excluded, (size_t)cap * sizeof(*x)) : NULL;
    if (x != NULL)
        r->excluded = x;
    if (x == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    r->capnodes = cap;
    return 0;
}

/* A node of group g comes up at t (ready at t + delay, or at once when `ready`). Its index. */
static int add_node(run *r, int g, double t, bool ready, kgpu_error *err)
{
    int i = 0;
    for (; i < r->nnodes; i++)
        if (r->nodes[i].state == N_FREE && r->nodes[i].group == g)
            break;
    if (i == r->nnodes) {
        int rc = grow_nodes(r, err);
        if (rc != 0)
            return rc;
        const kgpu_cluster *tc = r->sim->cluster;
        const kgpu_node *tn = kgpu_cluster_node(tc, r->in->groups[g].tmpl);
        kgpu_gpu_spec gs[KGPU_MAX_GPUS_PER_NODE];
        for (int j = 0; j < tn->ngpus; j++)
            gs[j] = (kgpu_gpu_spec){.index = tn->gpus[j].index,
                                    .model = kgpu_cluster_model_name(tc, tn->gpus[j].model),
                                    .memory_mib = tn->gpus[j].memory_mib,
                                    .numa = tn->gpus[j].numa,
                                    .healthy = true};
        char name[48];
        snprintf(name, sizeof(name), "g%d%s-%d", g / 2, r->in->groups[g].spot ? "-spot" : "", i);
        kgpu_node_spec ns = {.name = name,
                             .cpu_milli = tn->cpu_milli,
                             .memory_mib = tn->memory_mib,
                             .gpus = gs,
                             .ngpus = tn->ngpus};
        if ((rc = kgpu_cluster_add_node(r->c, &ns, err)) < 0)
            return rc;
        if (rc != i)
            return kgpu_error_set(err, KGPU_ESTATE, "node %d added as %d", i, rc);
        r->nnodes++;
    }
    asnode *nd = &r->nodes[i];
    *nd = (asnode){.group = g,
                   .state = ready ? N_READY : N_PROVISIONING,
                   .created = t,
                   .ready_at = ready ? t : t + r->cfg->provision_delay_s,
                   .interrupt_at = INFINITY,
                   .unneeded_since = -1,
                   .ca = sums_empty(kgpu_cluster_node(r->c, i)),
                   .head = NONE};
    if (r->in->groups[g].spot && r->cfg->spot_rate > 0) {
        double u = kgpu_rng_double(&r->srng);
        nd->interrupt_at = t - log1p(-u) * 3600.0 / r->cfg->spot_rate;
    }
    r->live[g]++;
    r->nlive++;
    if (r->live[g & ~1] + r->live[g | 1] > r->out->peak_shape[g / 2])
        r->out->peak_shape[g / 2] = r->live[g & ~1] + r->live[g | 1];
    if (r->live[g] > r->out->peak[g])
        r->out->peak[g] = r->live[g];
    if (r->nlive > r->out->peak_nodes)
        r->out->peak_nodes = r->nlive;
    r->out->nodes_added++;
    return i;
}

/* Node i goes (scale-down or interruption): its pods restart, elsewhere or pending. */
static int remove_node(run *r, int i, double t, kgpu_error *err)
{
    asnode *nd = &r->nodes[i];
    int rc;
    if (!nd->held_pod)
        r->out->useless_nodes++;
    if ((rc = add_life(r, nd->group, nd->created, t, err)) != 0)
        return rc;
    r->live[nd->group]--;
    r->nlive--;
    nd->state = N_FREE; /* first: its pods must not come back to it */
    rebuild_ready(r);
    while (nd->head != NONE) {
        size_t k = nd->head;
        if ((rc = unplace(r, k, t, true, err)) != 0 || (rc = place_or_pend(r, k, t, err)) != 0)
            return rc;
    }
    return 0;
}

static sums live_sums(const run *r, int i)
{
    return r->nodes[i].ca;
}

/* CA's score of a pod for its estimator's order: CPU share plus memory share of the template. */
static int ca_bigger_first(const void *x, const void *y, void *ctx)
{
    const run *r = ctx;
    size_t a = *(const size_t *)x, b = *(const size_t *)y;
    if (r->key[a] != r->key[b])
        return r->key[a] > r->key[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/*
 * Scale-up, as Cluster Autoscaler does it: the pending pods that the nodes
 * still coming up will not take (by sums), then per node group the
 * estimator's option (by sums: first fit on new template nodes, biggest
 * pods first, within the group's quota), and the expander picks one.
 */
static int scale_up(run *r, double t, kgpu_error *err)
{
    for (int i = 0; i < r->nnodes; i++)
        if (r->nodes[i].state == N_PROVISIONING)
            r->tmp[i] = live_sums(r, i);
    size_t nc = 0;
    for (size_t q = 0; q < r->npending; q++) {
        size_t k = r->pending[q];
        const kgpu_request *req = req_of(r, k);
        bool taken = false;
        for (int i = 0; i < r->nnodes && !taken; i++) {
            if (r->nodes[i].state != N_PROVISIONING ||
                (r->in->groups[r->nodes[i].group].spot && !tolerates(r, k)))
                continue;
            if (sums_fit(&r->tmp[i], req)) {
                sums_take(&r->tmp[i], req, 1);
                taken = true;
            }
        }
        if (!taken)
            r->cand[nc++] = k;
    }
    if (nc == 0)
        return 0;
    int nopts = 0;
    size_t used = 0;
    size_t *mine = r->cand + r->n; /* second half: this group's pods, ordered */
    sums *newn = r->newn;
    for (int g = 0; g < r->in->ngroups; g++) {
        int room = r->in->groups[g].max - r->live[g];
        if (room <= 0)
            continue;
        const kgpu_node *t0 = kgpu_cluster_node(r->sim->cluster, r->in->groups[g].tmpl);
        sums empty = sums_empty(t0);
        size_t nm = 0;
        for (size_t j = 0; j < nc; j++) {
            size_t k = r->cand[j];
            const kgpu_request *req = req_of(r, k);
            if ((r->in->groups[g].spot && !tolerates(r, k)) || !sums_fit(&empty, req))
                continue;
            r->key[k] = (t0->cpu_milli > 0 ? (double)req->cpu_milli / (double)t0->cpu_milli : 0) +
                        (t0->memory_mib > 0 ? (double)req->memory_mib / (double)t0->memory_mib : 0);
            mine[nm++] = k;
        }
        if (nm == 0)
            continue;
        qsort_r(mine, nm, sizeof(*mine), ca_bigger_first, r);
        int count = 0;
        size_t first = used;
        for (size_t j = 0; j < nm; j++) {
            const kgpu_request *req = req_of(r, mine[j]);
            int at = -1;
            for (int b = 0; b < count && at < 0; b++)
                if (sums_fit(&newn[b], req))
                    at = b;
            if (at < 0 && count < room) {
                newn[count] = empty;
                at = count++;
            }
            if (at < 0)
                continue;
            sums_take(&newn[at], req, 1);
            r->opt_pods[used++] = req;
        }
        if (count == 0)
            continue;
        r->opts[nopts++] = (kgpu_expander_option){.group = g,
                                                  .node_count = count,
                                                  .pods = &r->opt_pods[first],
                                                  .npods = (int)(used - first)};
    }
    if (nopts == 0)
        return 0;
    double gp = 0, cp = r->cfg->prices->cpu_core.on_demand;
    int np = 0;
    for (int m = 0; m < r->cfg->prices->nmodels; m++, np++)
        gp += r->cfg->prices->gpu[m].on_demand;
    kgpu_expander_ctx ctx = {.models = r->c,
                             .groups = r->eg,
                             .ngroups = r->in->ngroups,
                             .pod_gpu_price = np ? gp / np : 0,
                             .pod_core_price = cp};
    int choice;
    int rc = kgpu_expander_choose(&ctx, r->cfg->expander, r->opts, nopts, &r->xrng, NULL, &choice,
                                  err);
    if (rc != 0 || choice < 0)
        return rc;
    const kgpu_expander_option *o = &r->opts[choice];
    for (int j = 0; j < o->node_count; j++) {
        int i = add_node(r, o->group, t, false, err);
        if (i < 0)
            return i;
    }
    r->out->scale_ups++;
    r->last_scale_up = t;
    return 0;
}

/*
 * Could every pod of node i go elsewhere (ready nodes not excluded)? By
 * sums on r->tmp (CA's view), or by the real fit with the moves applied to
 * the cluster and recorded in `undo` (kgpu's): either way the moves stay,
 * so the next candidate sees them, as CA's removal simulation does. On
 * false the moves for node i are taken back.
 */
static bool drainable(run *r, int i, kgpu_assignment *undo, size_t *nundo)
{
    size_t mark = *nundo;
    for (size_t k = r->nodes[i].head; k != NONE; k = r->next_on[k]) {
        const kgpu_request *req = req_of(r, k);
        bool ok = false;
        for (int j = 0; j < r->nready_all && !ok; j++) {
            int d = r->ready_all[j];
            if (d == i || r->excluded[d] ||
                (r->in->groups[r->nodes[d].group].spot && !tolerates(r, k)))
                continue;
            if (!r->kgpu_view) {
                if ((ok = sums_fit(&r->tmp[d], req)))
                    sums_take(&r->tmp[d], req, 1);
                continue;
            }
            int gpus[KGPU_MAX_GPUS_PER_NODE];
            if (!kgpu__fit(kgpu_cluster_node(r->c, d), req) ||
                (req->gpu_count > 0 &&
                 kgpu__pick_best_fit(kgpu_cluster_node(r->c, d), req, gpus) != 0))
                continue;
            ok = kgpu_cluster_apply(r->c, req, d, gpus, &undo[*nundo], NULL) == 0;
            if (ok)
                (*nundo)++;
        }
        if (!ok) {
            /* Take back this node's moves (sums: the caller restores its copy). */
            while (r->kgpu_view && *nundo > mark)
                kgpu_cluster_release(r->c, &undo[--*nundo], NULL);
            return false;
        }
    }
    return true;
}

/*
 * Scale-down, as Cluster Autoscaler does it: a ready node whose use is
 * under the threshold and whose pods could all go elsewhere is unneeded;
 * once unneeded for unneeded_s, and no scale-up for delay_after_add_s,
 * empty ones go (up to 10 at once) and one with pods (drained: its pods
 * restart elsewhere or wait).
 */
static int scale_down(run *r, double t, kgpu_error *err)
{
    uint64_t seq = kgpu__cluster_seq(r->c);
    if (seq != r->sd_seq || r->nnodes != r->sd_nodes) {
        kgpu_assignment *undo = NULL;
        size_t nundo = 0;
        size_t running = 0;
        for (int j = 0; j < r->nready_all; j++)
            running += (size_t)r->nodes[r->ready_all[j]].pods;
        if (r->kgpu_view && running > 0 &&
            (undo = malloc(running * sizeof(*undo))) == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        for (int i = 0; i < r->nnodes; i++) {
            r->excluded[i] = false;
            if (r->nodes[i].state == N_READY)
                r->tmp[i] = live_sums(r, i);
        }
        for (int j = 0; j < r->nready_all; j++) {
            int i = r->ready_all[j];
            asnode *nd = &r->nodes[i];
            const kgpu_node *kn = kgpu_cluster_node(r->c, i);
            double util;
            if (kn->ngpus > 0) {
                /* CA judges a GPU node by its GPUs alone. */
                util = (double)(kn->ngpus * KGPU_MILLI - kgpu__node_free_milli(kn)) /
                       (double)(kn->ngpus * KGPU_MILLI);
            } else {
                util = fmax((double)(kn->cpu_milli - kn->cpu_free) / (double)kn->cpu_milli,
                            (double)(kn->memory_mib - kn->memory_free) / (double)kn->memory_mib);
            }
            bool unneeded = nd->pods == 0;
            if (!unneeded && util < r->cfg->utilization) {
                /* Sums: tried on a copy, kept only when every pod found room. */
                if (!r->kgpu_view)
                    memcpy(r->tmp2, r->tmp, (size_t)r->nnodes * sizeof(*r->tmp));
                unneeded = drainable(r, i, undo, &nundo);
                if (!unneeded && !r->kgpu_view)
                    memcpy(r->tmp, r->tmp2, (size_t)r->nnodes * sizeof(*r->tmp));
            }
            if (unneeded) {
                r->excluded[i] = true; /* no destination for the others' pods */
                if (nd->unneeded_since < 0)
                    nd->unneeded_since = t;
            } else {
                nd->unneeded_since = -1;
            }
        }
        while (nundo > 0)
            kgpu_cluster_release(r->c, &undo[--nundo], NULL);
        free(undo);
        r->sd_seq = kgpu__cluster_seq(r->c);
        r->sd_nodes = r->nnodes;
    }
    if (t - r->last_scale_up < r->cfg->delay_after_add_s)
        return 0;
    int empty_gone = 0;
    bool drained = false;
    for (int j = 0; j < r->nready_all; j++) {
        int i = r->ready_all[j];
        asnode *nd = &r->nodes[i];
        if (nd->state != N_READY || nd->unneeded_since < 0 ||
            t - nd->unneeded_since < r->cfg->unneeded_s)
            continue;
        if (nd->pods == 0 ? empty_gone >= 10 : drained)
            continue;
        if (nd->pods == 0)
            empty_gone++;
        else
            drained = true;
        int rc = remove_node(r, i, t, err);
        if (rc != 0)
            return rc;
        r->out->nodes_removed++;
        r->sd_nodes = -1; /* look again next scan */
        j = -1;           /* the ready list was rebuilt */
    }
    return 0;
}

static int check_config(const kgpu_autoscale_input *in, const kgpu_autoscale_config *cfg,
                        kgpu_error *err)
{
    if (!(cfg->speedup > 0 && cfg->speedup <= 1e6))
        return kgpu_error_set(err, KGPU_EINVAL, "speedup %g outside (0, 1e6]", cfg->speedup);
    if (!(cfg->inflate >= 0 && cfg->inflate <= 100))
        return kgpu_error_set(err, KGPU_EINVAL, "inflate %g outside [0, 100]", cfg->inflate);
    if (!(cfg->scan_interval_s > 0 && cfg->scan_interval_s <= 86400))
        return kgpu_error_set(err, KGPU_EINVAL, "scan interval %g s outside (0, 86400]",
                              cfg->scan_interval_s);
    if (!(cfg->provision_delay_s >= 0 && cfg->provision_delay_s <= 86400) ||
        !(cfg->unneeded_s >= 0 && cfg->unneeded_s <= 86400 * 7) ||
        !(cfg->delay_after_add_s >= 0 && cfg->delay_after_add_s <= 86400 * 7))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "provision delay, unneeded time and delay after add must be "
                              "0..86400, 0..604800 and 0..604800 s");
    if (!(cfg->utilization >= 0 && cfg->utilization <= 1))
        return kgpu_error_set(err, KGPU_EINVAL, "utilization threshold %g outside [0, 1]",
                              cfg->utilization);
    if (!(cfg->spot_rate >= 0 && cfg->spot_rate <= 100))
        return kgpu_error_set(err, KGPU_EINVAL, "spot interruption rate %g outside [0, 100] per node-hour",
                              cfg->spot_rate);
    if (cfg->prices == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "no prices");
    if (cfg->mode == KGPU_AS_FIXED && cfg->fixed_nodes == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "a fixed cluster needs its node counts");
    if (cfg->mode == KGPU_AS_EXPANDER && kgpu_expander_name(cfg->expander) == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "unknown expander %d", (int)cfg->expander);
    const kgpu_cluster *c = in->churn->sim->cluster;
    for (int g = 0; g < in->ngroups; g++) {
        if (kgpu_autoscale_group_price(in, g, cfg->prices) >= 0)
            continue;
        const kgpu_node *n = kgpu_cluster_node(c, in->groups[g].tmpl);
        for (int i = 0; i < n->ngpus; i++) {
            const char *m = kgpu_cluster_model_name(c, n->gpus[i].model);
            if (kgpu_prices_gpu(cfg->prices, m) == NULL)
                return kgpu_error_set(err, KGPU_ENOENT,
                                      "no price for GPU model %s (node %s of the node list)", m,
                                      n->name);
        }
    }
    return 0;
}

static void free_run(run *r)
{
    free(r->slot);
    free(r->arrive);
    free(r->pend_since);
    free(r->waited);
    free(r->started);
    free(r->status);
    free(r->gen);
    free(r->ever);
    free(r->next_on);
    free(r->prev_on);
    free(r->placed);
    free(r->pending);
    free(r->deps.v);
    free(r->lives);
    free(r->nodes);
    free(r->ready_all);
    free(r->ready_od);
    free(r->freed);
    free(r->od);
    free(r->tmp);
    free(r->tmp2);
    free(r->newn);
    free(r->excluded);
    free(r->opt_pods);
    free(r->opts);
    free(r->cand);
    free(r->key);
    kgpu_policy_free(r->p);
    kgpu_learner_free(r->learner);
    kgpu_cluster_free(r->c);
}

/* What happens next, in this order at equal times. */
enum { EV_DEPART, EV_INTERRUPT, EV_READY, EV_ARRIVE, EV_SCAN, EV_NONE };

int kgpu_autoscale_run(const kgpu_autoscale_input *in, const kgpu_autoscale_config *cfg,
                       kgpu_autoscale_result *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    int rc = check_config(in, cfg, err);
    if (rc != 0)
        return rc;
    run r;
    memset(&r, 0, sizeof(r));
    r.in = in;
    r.cfg = cfg;
    r.sim = in->churn->sim;
    r.out = out;
    r.kgpu_view = cfg->mode == KGPU_AS_EXPANDER && cfg->expander == KGPU_EXPANDER_KGPU;
    r.last_scale_up = -INFINITY;
    r.sd_nodes = -1;
    kgpu_rng wrng;
    kgpu_rng_seed(&wrng, cfg->seed, 1);
    kgpu_rng_seed(&r.prng, cfg->seed, 2);
    kgpu_rng_seed(&r.xrng, cfg->seed, 4);
    kgpu_rng_seed(&r.srng, cfg->seed, 5);
    size_t n = 0;
    if ((rc = kgpu__arrivals(in->churn, cfg->inflate, &wrng, &r.slot, &n, err)) != 0)
        return rc;
    r.n = n;
    size_t n1 = n ? n : 1;
    int maxq = 1;
    for (int g = 0; g < in->ngroups; g++) {
        r.price[g] = kgpu_autoscale_group_price(in, g, cfg->prices);
        r.eg[g] = (kgpu_expander_group){
            .node = kgpu_cluster_node(r.sim->cluster, in->groups[g].tmpl),
            .price_hour = r.price[g],
            .spot = in->groups[g].spot};
        if (in->groups[g].max > maxq)
            maxq = in->groups[g].max;
    }
    r.c = kgpu_cluster_new();
    r.arrive = calloc(n1, sizeof(*r.arrive));
    r.pend_since = calloc(n1, sizeof(*r.pend_since));
    r.waited = calloc(n1, sizeof(*r.waited));
    r.started = calloc(n1, sizeof(*r.started));
    r.status = calloc(n1, sizeof(*r.status));
    r.gen = calloc(n1, sizeof(*r.gen));
    r.ever = calloc(n1, sizeof(*r.ever));
    r.next_on = calloc(n1, sizeof(*r.next_on));
    r.prev_on = calloc(n1, sizeof(*r.prev_on));
    r.placed = calloc(n1, sizeof(*r.placed));
    r.pending = calloc(n1, sizeof(*r.pending));
    r.cand = calloc(2 * n1, sizeof(*r.cand));
    r.key = calloc(n1, sizeof(*r.key));
    r.opt_pods = calloc(n1 * (size_t)(in->ngroups ? in->ngroups : 1), sizeof(*r.opt_pods));
    r.opts = calloc(KGPU_AS_MAX_GROUPS, sizeof(*r.opts));
    r.newn = calloc((size_t)maxq, sizeof(*r.newn));
    if (r.c == NULL || r.arrive == NULL || r.pend_since == NULL || r.waited == NULL ||
        r.started == NULL || r.status == NULL || r.gen == NULL || r.ever == NULL ||
        r.next_on == NULL || r.prev_on == NULL || r.placed == NULL || r.pending == NULL ||
        r.cand == NULL || r.key == NULL || r.opt_pods == NULL || r.opts == NULL ||
        r.newn == NULL || (rc = grow_nodes(&r, err)) != 0) {
        rc = rc ? rc : kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto done;
    }
    /* The run's cluster keeps the model ids the requests were compiled against. */
    for (int id = 0; id < kgpu_cluster_model_count(r.sim->cluster); id++) {
        const char *m = kgpu_cluster_model_name(r.sim->cluster, id);
        if (strcmp(m, "?") != 0 && (rc = kgpu_cluster_model_put(r.c, id, m)) != 0) {
            kgpu_error_set(err, rc, "model table: %s", m);
            goto done;
        }
    }
    bool online;
    if ((rc = kgpu__policy_open("kgpu", false, r.c, &r.sim->target, &r.p, &r.learner, &online,
                                err)) != 0)
        goto done;
    for (size_t k = 0; k < n; k++)
        r.arrive[k] = in->churn->creation[r.slot[k]] / cfg->speedup;
    out->pods = (long)n;
    /* The costed span opens at 5 % of arrivals, as churn's measured span: see churn.h. */
    out->t_first = n ? r.arrive[n / 20] : 0;
    out->t_last = n ? r.arrive[n - 1] : 0;
    r.last_t = n ? r.arrive[0] : 0;
    if (cfg->mode == KGPU_AS_FIXED) {
        for (int g = 0; g < in->ngroups; g++)
            for (int j = 0; j < cfg->fixed_nodes[g] && j < in->groups[g].max; j++)
                if ((rc = add_node(&r, g, -INFINITY, true, err)) < 0)
                    goto done;
        rc = 0;
        rebuild_ready(&r);
    }
    bool autoscale = cfg->mode == KGPU_AS_EXPANDER;
    double next_scan = n ? (floor(r.arrive[0] / cfg->scan_interval_s) + 1) * cfg->scan_interval_s
                         : 0;
    bool idle_scan = false; /* the last scan, with nothing else left to happen, bought nothing */
    size_t k = 0;
    for (;;) {
        double te[EV_NONE];
        int who[EV_NONE] = {-1, -1, -1, -1, -1};
        te[EV_DEPART] = r.deps.n > 0 ? r.deps.v[0].t : INFINITY;
        te[EV_ARRIVE] = k < n ? r.arrive[k] : INFINITY;
        te[EV_INTERRUPT] = te[EV_READY] = INFINITY;
        bool provisioning = false;
        for (int i = 0; i < r.nnodes; i++) {
            const asnode *nd = &r.nodes[i];
            if (nd->state == N_FREE)
                continue;
            if (nd->interrupt_at < te[EV_INTERRUPT]) {
                te[EV_INTERRUPT] = nd->interrupt_at;
                who[EV_INTERRUPT] = i;
            }
            if (nd->state == N_PROVISIONING) {
                provisioning = true;
                if (nd->ready_at < te[EV_READY]) {
                    te[EV_READY] = nd->ready_at;
                    who[EV_READY] = i;
                }
            }
        }
        bool work = k < n || r.deps.n > 0 || provisioning;
        if (!work && (r.npending == 0 || idle_scan || !autoscale))
            break;
        /* Interruptions matter only while something else can still happen. */
        if (!work)
            te[EV_INTERRUPT] = INFINITY;
        te[EV_SCAN] = autoscale ? next_scan : INFINITY;
        int ev = EV_NONE;
        double t = INFINITY;
        for (int e = 0; e < EV_NONE; e++)
            if (te[e] < t) {
                t = te[e];
                ev = e;
            }
        if (ev == EV_NONE)
            break;
        advance(&r, t);
        switch (ev) {
        case EV_DEPART: {
            int *freed = r.freed, nf = 0;
            while (r.deps.n > 0 && r.deps.v[0].t == t) {
                departure d = kgpu__dep_pop(&r.deps);
                if (d.gen != r.gen[d.pod] || r.status[d.pod] != P_RUNNING)
                    continue;
                int node = r.placed[d.pod].node;
                if ((rc = unplace(&r, d.pod, t, false, err)) != 0)
                    goto done;
                bool seen = false;
                for (int j = 0; j < nf && !seen; j++)
                    seen = freed[j] == node;
                if (!seen)
                    freed[nf++] = node;
                out->t_end = t;
            }
            if ((rc = retry(&r, freed, nf, t, err)) != 0)
                goto done;
            break;
        }
        case EV_INTERRUPT:
            out->interruptions++;
            if ((rc = remove_node(&r, who[ev], t, err)) != 0)
                goto done;
            break;
        case EV_READY:
            r.nodes[who[ev]].state = N_READY;
            rebuild_ready(&r);
            if ((rc = retry(&r, &who[ev], 1, t, err)) != 0)
                goto done;
            break;
        case EV_ARRIVE:
            if ((rc = kgpu__policy_learn(r.p, r.learner, r.c, req_of(&r, k), err)) != 0 ||
                (rc = place_or_pend(&r, k, t, err)) != 0)
                goto done;
            k++;
            break;
        default: {
            long before = out->scale_ups;
            if (r.npending > 0 && (rc = scale_up(&r, t, err)) != 0)
                goto done;
            if ((rc = scale_down(&r, t, err)) != 0)
                goto done;
            idle_scan = !work && out->scale_ups == before;
            next_scan = t + cfg->scan_interval_s;
            break;
        }
        }
        if (ev != EV_SCAN)
            idle_scan = false;
    }
    if (out->t_end < out->t_first)
        out->t_end = out->t_first;
    /* The bill: every node's life clipped to the costed span. */
    for (int i = 0; i < r.nnodes; i++)
        if (r.nodes[i].state != N_FREE) {
            if (!r.nodes[i].held_pod)
                out->useless_nodes++;
            if ((rc = add_life(&r, r.nodes[i].group, r.nodes[i].created, INFINITY, err)) != 0)
                goto done;
        }
    for (size_t i = 0; i < r.nlives; i++) {
        const life *l = &r.lives[i];
        double from = fmax(l->from, out->t_first), to = fmin(l->to, out->t_end);
        if (to <= from)
            continue;
        const kgpu_node *tn = r.eg[l->group].node;
        out->gpu_hours_bought += tn->ngpus * (to - from) / 3600.0;
        out->cost += r.price[l->group] * (to - from) / 3600.0;
        double ato = fmin(to, out->t_last);
        if (ato > from) {
            out->arrival_gpu_hours_bought += tn->ngpus * (ato - from) / 3600.0;
            out->arrival_cost += r.price[l->group] * (ato - from) / 3600.0;
        }
    }
    out->gpu_hours_used = r.used_area / KGPU_MILLI / 3600.0;
    {
        size_t nw = 0;
        double sum = 0;
        for (size_t j = 0; j < n; j++) {
            if (r.status[j] == P_PENDING)
                out->never_placed++;
            else if (r.ever[j]) {
                r.key[nw++] = r.waited[j];
                sum += r.waited[j];
            }
        }
        qsort(r.key, nw, sizeof(*r.key), kgpu__cmp_double);
        out->wait_mean_s = nw ? sum / (double)nw : 0;
        out->wait_p50_s = kgpu__quantile(r.key, nw, 0.5);
        out->wait_p99_s = kgpu__quantile(r.key, nw, 0.99);
    }
done:
    free_run(&r);
    return rc < 0 ? rc : 0;
}
