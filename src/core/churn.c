/*
 * The simulator with time (see kgpu/churn.h): an event loop over arrivals in
 * creation order and departures from a min-heap, with a FIFO queue of pods
 * that fit nowhere. Pure and reentrant, like sim.c.
 *
 * Retrying the queue is what could make this slow, so it rests on one
 * invariant: a queued pod fit no node when it was last tried, and since then
 * nodes only lost room except those that departures freed. So after a batch
 * of departures (all those at one instant) a queued pod can only fit one of
 * the freed nodes; each queued pod is checked against those nodes alone, in
 * arrival order (no head-of-line blocking: a big pod at the head does not stop
 * a small one behind it), and the policy is asked to choose among them. A
 * shape that failed in a batch fails for every later pod of that shape in the
 * same batch with as much memory, so the scan costs little per queued pod.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/churn.h"

int kgpu_churn_prepare(const kgpu_sim_input *sim, const kgpu_trace *pods, const char *file,
                       kgpu_churn_input *in, kgpu_error *err)
{
    memset(in, 0, sizeof(*in));
    if (pods->npods != sim->nrequests)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: %zu pods, but the input was prepared from %zu",
                              file, pods->npods, sim->nrequests);
    if (pods->columns < 11)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: no creation or deletion times (the %d-column layout); time "
                              "replay needs the 11-column layout",
                              file, pods->columns);
    size_t n = pods->npods;
    in->sim = sim;
    in->creation = malloc(n * sizeof(*in->creation));
    in->lifetime = malloc(n * sizeof(*in->lifetime));
    in->order = malloc(n * sizeof(*in->order));
    if (in->creation == NULL || in->lifetime == NULL || in->order == NULL) {
        kgpu_churn_input_free(in);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const kgpu_trace_pod *p = &pods->pods[i];
        if (p->creation < 0 || p->deletion < 0) {
            kgpu_churn_input_free(in);
            return kgpu_error_set(err, KGPU_EPARSE, "%s:%d: %s is empty; time replay needs both",
                                  file, p->line,
                                  p->creation < 0 ? "creation_time" : "deletion_time");
        }
        if (p->deletion < p->creation) {
            kgpu_churn_input_free(in);
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "%s:%d: deletion_time %lld before creation_time %lld", file,
                                  p->line, (long long)p->deletion, (long long)p->creation);
        }
        in->creation[i] = (double)p->creation;
        in->lifetime[i] = (double)(p->deletion - p->creation);
        in->order[i] = i;
    }
    /* Insertion sort by creation, stable: trace files are already in order, so this is linear. */
    for (size_t i = 1; i < n; i++) {
        size_t v = in->order[i], j = i;
        while (j > 0 && in->creation[in->order[j - 1]] > in->creation[v]) {
            in->order[j] = in->order[j - 1];
            j--;
        }
        in->order[j] = v;
    }
    return 0;
}

void kgpu_churn_input_free(kgpu_churn_input *in)
{
    free(in->creation);
    free(in->lifetime);
    free(in->order);
    memset(in, 0, sizeof(*in));
}

/*
 * Departures (core.h, depheap.c): `gen` tells a pod's current run from one
 * that ended early (evicted, moved, interrupted), whose departure stays in
 * the heap and is skipped when it comes up.
 */
typedef kgpu__departure departure;
typedef kgpu__dep_heap heap;

/* The state of one run. */
typedef struct run {
    const kgpu_churn_input *in;
    const kgpu_churn_config *cfg;
    kgpu_churn_result *out;
    kgpu_cluster *c;
    kgpu_policy *p;
    kgpu_rng rng;
    double cap;
    size_t *slot;            /* per arrival k (in time order): its request index */
    kgpu_assignment *placed; /* per arrival: where it runs */
    double *arrive;          /* per slot: simulated arrival time */
    double *waits;           /* per placed pod */
    size_t nwaits;
    size_t *queue; /* slots waiting, in arrival order */
    size_t nqueue;
    heap deps;
    /* Sampling. */
    int next_sample;
    double last_t, area;
    /* Retry memo, per departure batch. */
    uint32_t *memo_batch;
    int64_t *memo_mem; /* smallest memory that failed for the shape in this batch */
    int nshapes;
    uint32_t batch;
    /* Queues (cfg->queues with a mode other than OFF), else qs is NULL. */
    kgpu_queues *qs;
    int nq;
    const int *qof, *prio; /* per request */
    kgpu_qpod *running;    /* pods running, in no order */
    size_t nrunning;
    size_t *run_pos;  /* per slot: its index in running, or SIZE_MAX */
    size_t *run_slot; /* per running index: its slot */
    uint32_t *gen;    /* per slot: bumped when evicted */
    bool *quota_blocked, *ever_placed; /* per slot */
    size_t *victims, *vslots;
    double *sort_key; /* per slot: retry order among queued pods */
    double *started;  /* per slot: when its current run began (queues or consolidation) */
    /* Consolidation (cfg->consolidate > 0), else pods.on is NULL. */
    kgpu__pods pods;
    int *pod_id; /* per slot: its id in pods while it runs */
    /* Per queue, from the last round. */
    bool starving[KGPU_CHURN_MAX_QUEUES], starving_recl[KGPU_CHURN_MAX_QUEUES];
    long pending[KGPU_CHURN_MAX_QUEUES], rounds_run[KGPU_CHURN_MAX_QUEUES];
    double jain_sum;
} run;

static double alloc_pct(const run *r)
{
    return (double)kgpu_cluster_gpu_milli_allocated(r->c) * 100.0 / r->cap;
}

/* Time moves to t: samples before t take the current state; the mean integrates it. */
/* Jain's index of borrowed/weight over queues that borrow with pods waiting; -1 under two. */
static double jain_now(const run *r)
{
    double sum = 0, sq = 0;
    int n = 0;
    for (int q = 0; q < r->nq; q++) {
        int64_t b = kgpu_queues_borrowed_milli(r->qs, q);
        kgpu_queue_info qi;
        kgpu_queues_info(r->qs, q, &qi);
        if (b <= 0 || r->pending[q] == 0 || !qi.leaf)
            continue;
        double x = (double)b / qi.weight;
        sum += x;
        sq += x * x;
        n++;
    }
    return n >= 2 ? sum * sum / (n * sq) : -1;
}

static void advance(run *r, double t)
{
    kgpu_churn_result *o = r->out;
    double a = alloc_pct(r);
    while (r->next_sample < KGPU_CHURN_SAMPLES && o->sample_t[r->next_sample] < t) {
        o->alloc_pct[r->next_sample++] = a;
        double j = r->qs ? jain_now(r) : -1;
        if (j >= 0) {
            r->jain_sum += j;
            o->jain_samples++;
        }
    }
    double from = r->last_t > o->t_first ? r->last_t : o->t_first;
    double to = t < o->t_last ? t : o->t_last;
    if (to > from) {
        r->area += a * (to - from);
        for (int q = 0; r->qs && q < r->nq; q++) {
            kgpu_queue_info qi;
            kgpu_queues_info(r->qs, q, &qi);
            kgpu_churn_queue_result *qr = &o->queue[q];
            qr->used_mean_gpus += (double)qi.used.milli / KGPU_MILLI * (to - from);
            qr->borrowed_mean_gpus +=
                (double)kgpu_queues_borrowed_milli(r->qs, q) / KGPU_MILLI * (to - from);
            if (r->starving[q])
                qr->starved_s += to - from;
            if (r->starving_recl[q])
                qr->starved_reclaimable_s += to - from;
        }
    }
    if (t > r->last_t)
        r->last_t = t;
}

/* The end of a scheduling round (an event instant): which queues wait below their guarantee. */
static void queue_round(run *r)
{
    if (r->qs == NULL)
        return;
    int64_t min_d[KGPU_CHURN_MAX_QUEUES];
    size_t min_k[KGPU_CHURN_MAX_QUEUES] = {0};
    for (int q = 0; q < r->nq; q++) {
        r->starving[q] = false;
        r->pending[q] = 0;
        min_d[q] = INT64_MAX;
    }
    for (size_t i = 0; i < r->nqueue; i++) {
        size_t k = r->queue[i];
        const kgpu_request *req = &r->in->sim->requests[r->slot[k]];
        int q = r->qof[r->slot[k]];
        r->pending[q]++;
        kgpu_qdemand d;
        kgpu_qdemand_of_request(req, &d);
        int st = kgpu_queues_check(r->qs, q, &d, NULL, 0);
        if (d.milli > 0 && (st == KGPU_QUEUE_WITHIN || st == KGPU_QUEUE_RECLAIM)) {
            r->starving[q] = true;
            if (d.milli < min_d[q]) {
                min_d[q] = d.milli;
                min_k[q] = k;
            }
        }
    }
    /*
     * Reclaimable: kgpu's reclaim search finds pods whose eviction would let
     * the smallest such pod run (asked whatever the mode, as an oracle; a
     * pure call). Static caps lend nothing, so nothing is reclaimable there.
     */
    int64_t borrowed = 0;
    for (int q = 0; q < r->nq; q++) {
        kgpu_queue_info qi;
        kgpu_queues_info(r->qs, q, &qi);
        if (qi.leaf)
            borrowed += kgpu_queues_borrowed_milli(r->qs, q);
    }
    for (int q = 0; q < r->nq; q++) {
        r->starving_recl[q] = false;
        if (r->starving[q] && r->cfg->queue_mode != KGPU_CHURN_QUEUES_STATIC &&
            borrowed - kgpu_queues_borrowed_milli(r->qs, q) >= min_d[q]) {
            kgpu_reclaim rec = {.victims = r->victims};
            const kgpu_request *req = &r->in->sim->requests[r->slot[min_k[q]]];
            r->starving_recl[q] = kgpu_queues_reclaim(r->c, r->qs, r->running, r->nrunning, q, req,
                                                      KGPU_RECLAIM_FRAG, NULL, &rec, NULL) == 0;
        }
        r->rounds_run[q] = r->starving_recl[q] ? r->rounds_run[q] + 1 : 0;
        if (r->rounds_run[q] > r->out->queue[q].starved_reclaimable_rounds_max)
            r->out->queue[q].starved_reclaimable_rounds_max = r->rounds_run[q];
    }
}

/* Does slot k's queue let it in now (within its guarantee, or borrowing within every limit)? */
static bool quota_admits(run *r, size_t k)
{
    kgpu_qdemand d;
    kgpu_qdemand_of_request(&r->in->sim->requests[r->slot[k]], &d);
    int st = kgpu_queues_check(r->qs, r->qof[r->slot[k]], &d, NULL, 0);
    return st == KGPU_QUEUE_WITHIN || st == KGPU_QUEUE_BORROWS;
}

static int placed_now(run *r, size_t k, double t, kgpu_error *err);

/*
 * Places slot k chosen among nodes (NULL = all) at time t; with `force`, on
 * nodes[0] and those GPUs (reclaim's choice), without asking the policy.
 * 1 placed, 0 no fit, <0 error.
 */
static int try_place_on(run *r, size_t k, const int *nodes, int nn, const int *force, double t,
                        kgpu_error *err)
{
    const kgpu_request *req = &r->in->sim->requests[r->slot[k]];
    if (r->qs != NULL) {
        if (!quota_admits(r, k)) {
            if (!r->quota_blocked[k])
                r->out->quota_refused++;
            r->quota_blocked[k] = true;
            return 0;
        }
        r->quota_blocked[k] = false;
    }
    int node, gpus[KGPU_MAX_GPUS_PER_NODE];
    int rc = 0;
    if (force != NULL) {
        node = nodes[0];
        memcpy(gpus, force, sizeof(gpus));
    } else {
        rc = kgpu_policy_select(r->p, r->c, req, nodes, nn, &r->rng, &node, gpus, err);
    }
    if (rc == KGPU_ENOFIT)
        return 0;
    if (rc != 0)
        return rc;
    if ((rc = kgpu_cluster_apply(r->c, req, node, gpus, &r->placed[k], err)) != 0)
        return rc; /* a policy chose something that does not fit: a bug */
    if (r->qs != NULL) {
        kgpu_qpod *p = &r->running[r->nrunning];
        p->queue = r->qof[r->slot[k]];
        p->priority = r->prio[r->slot[k]];
        p->admitted = (int64_t)(t * 1000.0); /* ms: reclaim weighs the work victims lose */
        p->a = r->placed[k];
        kgpu_qdemand_of_assignment(r->c, &p->a, &p->d);
        kgpu_error e;
        if (kgpu_queues_charge(r->qs, p->queue, &p->d, &e) != 0) {
            /* A per-model limit on the GPUs chosen: undo, and wait like a quota refusal. */
            if ((rc = kgpu_cluster_release(r->c, &r->placed[k], err)) != 0)
                return rc;
            if (!r->quota_blocked[k])
                r->out->quota_refused++;
            r->quota_blocked[k] = true;
            return 0;
        }
        r->run_pos[k] = r->nrunning;
        r->run_slot[r->nrunning++] = k;
        r->started[k] = t;
    }
    return placed_now(r, k, t, err);
}

/* Slot k now runs from t at r->placed[k]: its records, its departure, the peak. 1 or <0. */
static int placed_now(run *r, size_t k, double t, kgpu_error *err)
{
    if (r->pods.on != NULL) {
        const kgpu_request *req = &r->in->sim->requests[r->slot[k]];
        bool movable = r->cfg->restartable == NULL || r->cfg->restartable[r->slot[k]];
        if (kgpu__pods_add(&r->pods, req, &r->placed[k], movable, k, &r->pod_id[k]) != 0)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        r->started[k] = t;
    }
    r->out->placed++;
    if (!r->ever_placed[k]) {
        r->ever_placed[k] = true;
        r->waits[r->nwaits++] = t - r->arrive[k];
    }
    if (!kgpu__dep_push(&r->deps, (departure){t + r->in->lifetime[r->slot[k]], k, r->gen[k]}))
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    double a = alloc_pct(r);
    if (a > r->out->alloc_peak_pct)
        r->out->alloc_peak_pct = a;
    return 1;
}

static int try_place(run *r, size_t k, const int *nodes, int nn, double t, kgpu_error *err)
{
    return try_place_on(r, k, nodes, nn, NULL, t, err);
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return a < b ? -1 : a > b;
}

/* A running pod leaves (departure or eviction): its queue gets its charge back. */
static int remove_running(run *r, size_t k, kgpu_error *err)
{
    size_t pos = r->run_pos[k], last = r->nrunning - 1;
    int rc = kgpu_queues_uncharge(r->qs, r->running[pos].queue, &r->running[pos].d, err);
    if (rc != 0)
        return rc;
    r->running[pos] = r->running[last];
    r->run_slot[pos] = r->run_slot[last];
    r->run_pos[r->run_slot[pos]] = pos;
    r->nrunning--;
    r->run_pos[k] = SIZE_MAX;
    return 0;
}

static bool reclaiming(const run *r)
{
    return r->qs != NULL && (r->cfg->queue_mode == KGPU_CHURN_QUEUES_PRIORITY_AGE ||
                             r->cfg->queue_mode == KGPU_CHURN_QUEUES_FRAG);
}

/*
 * Slot k waits within its queue's guarantee: evict the borrowing pods the
 * mode chooses, then place k (on the node reclaim chose, for FRAG). The
 * evicted wait again from the back of the queue and will run their whole
 * lifetime when placed again. 1 placed, 0 not, <0 error.
 */
static int try_reclaim(run *r, size_t k, double t, kgpu_error *err)
{
    const kgpu_request *req = &r->in->sim->requests[r->slot[k]];
    int q = r->qof[r->slot[k]];
    kgpu_qdemand d;
    kgpu_qdemand_of_request(req, &d);
    if (d.milli == 0)
        return 0; /* queues divide GPUs: a pod without one reclaims nothing */
    int st = kgpu_queues_check(r->qs, q, &d, NULL, 0);
    if (st != KGPU_QUEUE_WITHIN && st != KGPU_QUEUE_RECLAIM)
        return 0;
    int64_t borrowed = 0;
    for (int i = 0; i < r->nq; i++) {
        kgpu_queue_info qi;
        kgpu_queues_info(r->qs, i, &qi);
        if (qi.leaf && i != q)
            borrowed += kgpu_queues_borrowed_milli(r->qs, i);
    }
    if (borrowed < d.milli)
        return 0; /* nothing to reclaim that could be enough */
    kgpu_reclaim rec = {.victims = r->victims};
    kgpu_reclaim_mode mode = r->cfg->queue_mode == KGPU_CHURN_QUEUES_FRAG
                                 ? KGPU_RECLAIM_FRAG
                                 : KGPU_RECLAIM_PRIORITY_AGE;
    kgpu_error e;
    int rc = kgpu_queues_reclaim(r->c, r->qs, r->running, r->nrunning, q, req, mode,
                                 &r->in->sim->target, &rec, &e);
    if (rc == KGPU_ENOFIT) {
        r->out->reclaim_failed++;
        return 0;
    }
    if (rc != 0)
        return kgpu_error_set(err, rc, "%s", e.msg);
    /* What each victim frees, by (node, GPU), before the running array moves. */
    typedef struct freed_gpu {
        int node, gpu, milli;
    } freed_gpu;
    size_t nfreed = 0, cap = 0;
    for (size_t i = 0; i < rec.nvictims; i++) {
        r->vslots[i] = r->run_slot[rec.victims[i]];
        cap += (size_t)r->placed[r->vslots[i]].ngpus;
    }
    freed_gpu *fg = malloc((cap ? cap : 1) * sizeof(*fg));
    if (fg == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t i = 0; i < rec.nvictims; i++) {
        size_t v = r->vslots[i];
        const kgpu_assignment *a = &r->placed[v];
        for (int g = 0; g < a->ngpus; g++)
            fg[nfreed++] =
                (freed_gpu){a->node, a->gpus[g], a->exclusive ? KGPU_MILLI : a->gpu_milli};
        int vq = r->qof[r->slot[v]];
        if ((rc = kgpu_cluster_release(r->c, a, err)) != 0 ||
            (rc = remove_running(r, v, err)) != 0) {
            free(fg);
            return rc;
        }
        r->gen[v]++;
        r->out->evictions++;
        r->out->lost_gpu_s += (t - r->started[v]) * (double)kgpu__gpu_demand(
                                                        &r->in->sim->requests[r->slot[v]]) /
                              KGPU_MILLI;
        if (vq < KGPU_CHURN_MAX_QUEUES)
            r->out->queue[vq].evicted++;
        r->queue[r->nqueue++] = v;
        if ((long)r->nqueue > r->out->max_queue)
            r->out->max_queue = (long)r->nqueue;
    }
    r->out->reclaims++;
    r->out->freed_gpus += (double)rec.freed_milli / KGPU_MILLI;
    /* kgpu's reclaim chose the GPUs too; priority and age leave the choice to the policy. */
    int placed = rec.ngpus > 0 ? try_place_on(r, k, &rec.node, 1, rec.gpus, t, err)
                 : mode == KGPU_RECLAIM_FRAG ? try_place(r, k, &rec.node, 1, t, err)
                                             : try_place(r, k, NULL, 0, t, err);
    if (placed < 0) {
        free(fg);
        return placed;
    }
    int64_t unused = 0;
    for (size_t i = 0; i < nfreed; i++) {
        bool took = false;
        for (int g = 0; placed && g < r->placed[k].ngpus; g++)
            took |= r->placed[k].node == fg[i].node && r->placed[k].gpus[g] == fg[i].gpu;
        if (!took)
            unused += fg[i].milli;
    }
    free(fg);
    r->out->freed_unused_gpus += (double)unused / KGPU_MILLI;
    return placed;
}

/* Every queued pod within its guarantee, in queue order, tries reclaim. */
static int reclaim_pass(run *r, double t, kgpu_error *err)
{
    if (!reclaiming(r))
        return 0;
    size_t i = 0;
    while (i < r->nqueue) {
        size_t k = r->queue[i];
        int rc = try_reclaim(r, k, t, err);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            memmove(&r->queue[i], &r->queue[i + 1], (r->nqueue - i - 1) * sizeof(*r->queue));
            r->nqueue--;
            r->out->waited++;
            continue;
        }
        i++;
    }
    return 0;
}

/*
 * Retry order with queues: pods within their queue's guarantee first, then
 * borrowers of the queue that borrows least per weight, then arrival order.
 */
static int retry_cmp(const void *x, const void *y, void *ctx)
{
    const run *r = ctx;
    size_t a = *(const size_t *)x, b = *(const size_t *)y;
    if (r->sort_key[a] != r->sort_key[b])
        return r->sort_key[a] < r->sort_key[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void order_retries(run *r)
{
    for (size_t i = 0; i < r->nqueue; i++) {
        size_t k = r->queue[i];
        int q = r->qof[r->slot[k]];
        kgpu_qdemand d;
        kgpu_qdemand_of_request(&r->in->sim->requests[r->slot[k]], &d);
        int st = kgpu_queues_check(r->qs, q, &d, NULL, 0);
        kgpu_queue_info qi;
        kgpu_queues_info(r->qs, q, &qi);
        r->sort_key[k] = st == KGPU_QUEUE_WITHIN || st == KGPU_QUEUE_RECLAIM
                             ? -1.0
                             : (double)kgpu_queues_borrowed_milli(r->qs, q) / qi.weight;
    }
    qsort_r(r->queue, r->nqueue, sizeof(*r->queue), retry_cmp, r);
}

/*
 * Slot k fits nowhere: place it by moving restartable pods (cfg->consolidate).
 * The moved pods start over where the policy put them. 1 placed, 0 not, <0 error.
 */
static int try_consolidate(run *r, size_t k, double t, kgpu_error *err)
{
    const kgpu_request *req = &r->in->sim->requests[r->slot[k]];
    int moved[KGPU__MAX_MOVES], nmoved = 0;
    int rc = kgpu__consolidate(&r->pods, r->c, r->p, req, r->cfg->consolidate, NULL, &r->rng,
                               &r->placed[k], moved, &nmoved, err);
    if (rc == KGPU_ENOFIT)
        return 0;
    if (rc != 0)
        return rc;
    for (int m = 0; m < nmoved; m++) {
        kgpu__pod *pod = &r->pods.pod[moved[m]];
        size_t v = pod->tag;
        r->out->lost_gpu_s += (double)kgpu__gpu_demand(pod->req) / KGPU_MILLI * (t - r->started[v]);
        r->placed[v] = pod->a;
        r->started[v] = t;
        r->gen[v]++; /* its old departure is void: it starts over */
        if (!kgpu__dep_push(&r->deps, (departure){t + r->in->lifetime[r->slot[v]], v, r->gen[v]}))
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    r->out->moves += nmoved;
    r->out->consolidated++;
    return placed_now(r, k, t, err);
}

/* After a batch: consolidation for the oldest waiting pods, a few a batch. */
#define CONSOLIDATE_PER_BATCH 4

static int consolidate_pass(run *r, double t, kgpu_error *err)
{
    size_t keep = 0;
    int tried = 0;
    for (size_t q = 0; q < r->nqueue; q++) {
        size_t k = r->queue[q];
        int placed = 0;
        if (tried < CONSOLIDATE_PER_BATCH) {
            tried++;
            if ((placed = try_consolidate(r, k, t, err)) < 0)
                return placed;
        }
        if (placed)
            r->out->waited++;
        else
            r->queue[keep++] = k;
    }
    r->nqueue = keep;
    return 0;
}

/* Every departure at the heap's earliest time, then the queue against the freed nodes. */
static int depart_batch(run *r, int *freed, bool *is_freed, kgpu_error *err)
{
    double t = r->deps.v[0].t;
    advance(r, t);
    int nf = 0;
    while (r->deps.n > 0 && r->deps.v[0].t == t) {
        departure d = kgpu__dep_pop(&r->deps);
        if (d.gen != r->gen[d.pod])
            continue; /* evicted since: not running this lifetime */
        int rc = kgpu_cluster_release(r->c, &r->placed[d.pod], err);
        if (rc != 0)
            return rc;
        if (r->qs != NULL && (rc = remove_running(r, d.pod, err)) != 0)
            return rc;
        if (r->pods.on != NULL)
            kgpu__pods_remove(&r->pods, r->c, r->pod_id[d.pod]);
        int node = r->placed[d.pod].node;
        if (!is_freed[node]) {
            is_freed[node] = true;
            freed[nf++] = node;
        }
    }
    /* In node order, as a choice among all nodes would see them (the random policy's draws). */
    qsort(freed, (size_t)nf, sizeof(*freed), cmp_int);
    r->batch++;
    if (r->qs != NULL)
        order_retries(r);
    size_t keep = 0;
    for (size_t q = 0; q < r->nqueue; q++) {
        size_t k = r->queue[q];
        const kgpu_request *req = &r->in->sim->requests[r->slot[k]];
        if (r->qs != NULL && r->quota_blocked[k]) {
            /* Refused by its queue, not for room: any node may do once the queue lets it in. */
            int placed = quota_admits(r, k) ? try_place(r, k, NULL, 0, t, err) : 0;
            if (placed < 0)
                return placed;
            if (placed) {
                r->out->retries++;
                r->out->waited++;
            } else {
                r->queue[keep++] = k;
            }
            continue;
        }
        int s = req->shape;
        bool known_fail = s >= 0 && s < r->nshapes && r->memo_batch[s] == r->batch &&
                          req->memory_mib >= r->memo_mem[s];
        bool fits = false;
        for (int i = 0; !known_fail && !fits && i < nf; i++)
            fits = kgpu__fit(kgpu_cluster_node(r->c, freed[i]), req);
        int placed = 0;
        if (fits) {
            r->out->retries++;
            if ((placed = try_place(r, k, freed, nf, t, err)) < 0)
                return placed;
        }
        if (placed) {
            r->out->waited++;
            continue;
        }
        if (s >= 0 && s < r->nshapes &&
            (r->memo_batch[s] != r->batch || req->memory_mib < r->memo_mem[s])) {
            r->memo_batch[s] = r->batch;
            r->memo_mem[s] = req->memory_mib;
        }
        r->queue[keep++] = k;
    }
    r->nqueue = keep;
    for (int i = 0; i < nf; i++)
        is_freed[freed[i]] = false;
    int rc = r->pods.on != NULL ? consolidate_pass(r, t, err) : 0;
    if (rc == 0)
        rc = reclaim_pass(r, t, err);
    queue_round(r);
    return rc;
}

int kgpu_churn_run(const kgpu_churn_input *in, const kgpu_churn_config *cfg, kgpu_churn_result *out,
                   kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!(cfg->speedup > 0 && cfg->speedup <= 1e6))
        return kgpu_error_set(err, KGPU_EINVAL, "speedup %g outside (0, 1e6]", cfg->speedup);
    if (!(cfg->inflate >= 0 && cfg->inflate <= 100))
        return kgpu_error_set(err, KGPU_EINVAL, "inflate %g outside [0, 100]", cfg->inflate);
    const kgpu_sim_input *sim = in->sim;
    size_t n = 0;
    run r;
    memset(&r, 0, sizeof(r));
    r.in = in;
    r.cfg = cfg;
    r.out = out;
    r.cap = (double)sim->capacity_milli;
    int rc = 0;
    kgpu_learner *learner = NULL;
    uint32_t *rank = NULL;
    int *freed = NULL;
    bool *is_freed = NULL;
    kgpu_rng trng, wrng;
    kgpu_rng_seed(&r.rng, cfg->seed, 2);
    kgpu_rng_seed(&trng, cfg->seed, 3);
    kgpu_rng_seed(&wrng, cfg->seed, 1);
    if ((rc = kgpu__arrivals(in, cfg->inflate, &wrng, &r.slot, &n, err)) != 0)
        return rc;
    r.c = kgpu_cluster_clone(sim->cluster);
    int nn = r.c ? kgpu_cluster_node_count(r.c) : 0;
    for (size_t i = 0; i < sim->nrequests; i++)
        if (sim->requests[i].shape >= r.nshapes)
            r.nshapes = sim->requests[i].shape + 1;
    r.placed = calloc(n ? n : 1, sizeof(*r.placed));
    r.arrive = calloc(n ? n : 1, sizeof(*r.arrive));
    r.waits = calloc(n ? n : 1, sizeof(*r.waits));
    r.queue = calloc(n ? n : 1, sizeof(*r.queue));
    r.deps.v = calloc(n ? n : 1, sizeof(*r.deps.v));
    r.deps.cap = n ? n : 1;
    r.gen = calloc(n ? n : 1, sizeof(*r.gen));
    r.ever_placed = calloc(n ? n : 1, sizeof(*r.ever_placed));
    if (r.c != NULL && cfg->queues != NULL && cfg->queue_mode != KGPU_CHURN_QUEUES_OFF) {
        if (cfg->queue_mode < KGPU_CHURN_QUEUES_STATIC ||
            cfg->queue_mode > KGPU_CHURN_QUEUES_FRAG) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "unknown queue mode %d", (int)cfg->queue_mode);
            goto done;
        }
        r.qs = kgpu_queues_clone(cfg->queues->tree);
        if (r.qs == NULL) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
            goto done;
        }
        r.nq = kgpu_queues_count(r.qs);
        if (r.nq > KGPU_CHURN_MAX_QUEUES) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "%d queues: a churn run reports on at most %d",
                                r.nq, KGPU_CHURN_MAX_QUEUES);
            goto done;
        }
        if (cfg->queue_mode == KGPU_CHURN_QUEUES_STATIC)
            kgpu_queues_cap_at_guarantee(r.qs);
        if ((rc = kgpu_queues_bind_models(r.qs, r.c, err)) != 0)
            goto done;
        out->nqueues = r.nq;
        r.qof = cfg->queues->queue;
        r.prio = cfg->queues->priority;
        for (size_t i = 0; i < sim->nrequests; i++)
            if (r.qof[i] < 0 || r.qof[i] >= r.nq) {
                rc = kgpu_error_set(err, KGPU_EINVAL, "pod %zu: queue %d does not exist", i,
                                    r.qof[i]);
                goto done;
            }
        r.running = malloc((n ? n : 1) * sizeof(*r.running));
        r.run_pos = malloc((n ? n : 1) * sizeof(*r.run_pos));
        r.run_slot = malloc((n ? n : 1) * sizeof(*r.run_slot));
        r.quota_blocked = calloc(n ? n : 1, sizeof(*r.quota_blocked));
        r.victims = malloc((n ? n : 1) * sizeof(*r.victims));
        r.vslots = malloc((n ? n : 1) * sizeof(*r.vslots));
        r.sort_key = calloc(n ? n : 1, sizeof(*r.sort_key));
        r.started = calloc(n ? n : 1, sizeof(*r.started));
        if (r.running == NULL || r.run_pos == NULL || r.run_slot == NULL ||
            r.quota_blocked == NULL || r.victims == NULL || r.vslots == NULL ||
            r.sort_key == NULL || r.started == NULL) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < n; i++)
            r.run_pos[i] = SIZE_MAX;
    }
    if (cfg->consolidate < 0 || cfg->consolidate > KGPU__MAX_MOVES) {
        rc = kgpu_error_set(err, KGPU_EINVAL, "consolidate %d outside 0..%d", cfg->consolidate,
                            KGPU__MAX_MOVES);
        goto done;
    }
    if (cfg->consolidate > 0 && r.qs != NULL) {
        rc = kgpu_error_set(err, KGPU_EINVAL, "consolidation is not simulated with queues yet");
        goto done;
    }
    if (r.c != NULL && cfg->consolidate > 0) {
        r.pod_id = malloc((n ? n : 1) * sizeof(*r.pod_id));
        r.started = calloc(n ? n : 1, sizeof(*r.started));
        if (r.pod_id == NULL || r.started == NULL || kgpu__pods_init(&r.pods, nn) != 0) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
            goto done;
        }
    }
    r.memo_batch = calloc((size_t)r.nshapes + 1, sizeof(*r.memo_batch));
    r.memo_mem = calloc((size_t)r.nshapes + 1, sizeof(*r.memo_mem));
    rank = malloc((size_t)(nn > 0 ? nn : 1) * sizeof(*rank));
    freed = malloc((size_t)(nn > 0 ? nn : 1) * sizeof(*freed));
    is_freed = calloc((size_t)(nn > 0 ? nn : 1), sizeof(*is_freed));
    if (r.c == NULL || r.placed == NULL || r.arrive == NULL || r.waits == NULL || r.queue == NULL ||
        r.deps.v == NULL || r.gen == NULL || r.ever_placed == NULL || r.memo_batch == NULL ||
        r.memo_mem == NULL || rank == NULL || freed == NULL || is_freed == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = kgpu__policy_open(cfg->policy, cfg->online, r.c, &sim->target, &r.p, &learner,
                                &out->online, err)) != 0)
        goto done;
    for (int i = 0; i < nn; i++)
        rank[i] = (uint32_t)i;
    for (int i = nn; i > 1; i--) { /* the study's per-seed tie order */
        int j = (int)kgpu_rng_below(&trng, (uint64_t)i);
        uint32_t t = rank[i - 1];
        rank[i - 1] = rank[j];
        rank[j] = t;
    }
    if (!cfg->random_ties)
        kgpu_policy_set_tie_order(r.p, rank, nn);

    /* Times and the sampling grid. */
    for (size_t k = 0; k < n; k++)
        r.arrive[k] = in->creation[r.slot[k]] / cfg->speedup;
    out->pods = (long)n;
    /*
     * The measured span starts when 5 % of the pods have arrived: trace files
     * open with a few long-lived pods spread over months before the bulk
     * arrives (the default trace: 33 pods over 77 % of its time), and a mean
     * over that lead-in says nothing about placement.
     */
    out->t_first = n ? r.arrive[n / 20] : 0;
    out->t_last = n ? r.arrive[n - 1] : 0;
    double span = out->t_last - out->t_first;
    /* Demand present in the arrival span if every pod ran at once: what the cluster is offered. */
    double demand_time = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = r.slot[k];
        double end = r.arrive[k] + in->lifetime[i];
        double from = r.arrive[k] > out->t_first ? r.arrive[k] : out->t_first;
        double overlap = (end < out->t_last ? end : out->t_last) - from;
        if (overlap > 0)
            demand_time += (double)kgpu__gpu_demand(&sim->requests[i]) * overlap;
    }
    for (int s = 0; s < KGPU_CHURN_SAMPLES; s++)
        out->sample_t[s] = out->t_first + 1.25 * span * s / (KGPU_CHURN_SAMPLES - 1);
    out->offered_load_pct = span > 0 ? demand_time * 100.0 / (span * r.cap) : 0;
    r.last_t = n ? r.arrive[0] : 0;

    size_t k = 0;
    while (k < n || r.deps.n > 0) {
        if (r.deps.n > 0 && (k == n || r.deps.v[0].t <= r.arrive[k])) {
            /* Departures first at equal times: they make room for the arrival. */
            if ((rc = depart_batch(&r, freed, is_freed, err)) != 0)
                goto done;
            continue;
        }
        double t = r.arrive[k];
        advance(&r, t);
        const kgpu_request *req = &sim->requests[r.slot[k]];
        if ((rc = kgpu__policy_learn(r.p, learner, r.c, req, err)) != 0)
            goto done;
        if (cfg->on_observe != NULL)
            cfg->on_observe(cfg->ctx, r.slot[k], t);
        int placed = try_place(&r, k, NULL, 0, t, err);
        if (placed == 0 && reclaiming(&r))
            placed = try_reclaim(&r, k, t, err);
        if (placed == 0 && r.pods.on != NULL)
            placed = try_consolidate(&r, k, t, err);
        if (placed < 0) {
            rc = placed;
            goto done;
        }
        if (placed) {
            out->placed_at_once++;
        } else {
            r.queue[r.nqueue++] = k;
            if ((long)r.nqueue > out->max_queue)
                out->max_queue = (long)r.nqueue;
        }
        k++;
        /* What arrived may have borrowed what another queue's waiting pod can now reclaim. */
        if ((rc = reclaim_pass(&r, t, err)) != 0)
            goto done;
        queue_round(&r);
    }
    out->t_end = r.last_t;
    advance(&r, INFINITY);
    out->alloc_mean_pct = span > 0 ? r.area / span : out->alloc_peak_pct;
    out->never_placed = (long)r.nqueue;
    qsort(r.waits, r.nwaits, sizeof(*r.waits), kgpu__cmp_double);
    double sum = 0;
    for (size_t i = 0; i < r.nwaits; i++)
        sum += r.waits[i];
    out->wait_mean_s = r.nwaits ? sum / (double)r.nwaits : 0;
    out->wait_median_s = kgpu__quantile(r.waits, r.nwaits, 0.5);
    out->wait_p99_s = kgpu__quantile(r.waits, r.nwaits, 0.99);
    out->jain_borrowers = out->jain_samples > 0 ? r.jain_sum / (double)out->jain_samples : 1.0;
    for (int q = 0; q < r.nq && span > 0; q++) {
        out->queue[q].used_mean_gpus /= span;
        out->queue[q].borrowed_mean_gpus /= span;
    }
done:
    free(rank);
    free(freed);
    free(is_freed);
    free(r.slot);
    free(r.placed);
    free(r.arrive);
    free(r.waits);
    free(r.queue);
    free(r.deps.v);
    free(r.memo_batch);
    free(r.memo_mem);
    free(r.gen);
    free(r.ever_placed);
    free(r.running);
    free(r.run_pos);
    free(r.run_slot);
    free(r.quota_blocked);
    free(r.victims);
    free(r.vslots);
    free(r.sort_key);
    free(r.started);
    free(r.pod_id);
    kgpu__pods_free(&r.pods);
    kgpu_queues_free(r.qs);
    kgpu_policy_free(r.p);
    kgpu_learner_free(learner);
    kgpu_cluster_free(r.c);
    return rc;
}
