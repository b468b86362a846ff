/*
 * prioritize for a DRA pod: the node scores of every request of class
 * gpu.kgpu.io of all of its claims together (dra_claims.c ext_dra_pod_asks).
 *
 * Why it is built this way: kube-scheduler's allocator gives a claim the
 * first devices that fit, in slice order, on the node kube-scheduler chose;
 * kgpu's only lever on that choice is the score. A node scores above 0 only
 * where all of the pod's requests fit together, placed one after another
 * as the policy places the containers of a multi-GPU pod, and among those
 * the policy (or, for MIG, the room the placement keeps) ranks them.
 *
 * Terms: a request's class picks the kind of devices it may get: class
 * gpu.kgpu.io whole GPUs (a whole-GPU or share request), mig.gpu.kgpu.io
 * MIG partitions (a MIG request), as their DeviceClasses select. Its CEL
 * selectors (dra_cel.c), evaluated on the scored nodes' devices, narrow a
 * whole-GPU or share request to the models of the GPUs they match, and a
 * MIG request to the partitions they match; it takes one on a GPU whose
 * instances leave room (no whole or share use there). A selector kgpu does
 * not read is not guessed: the request is scored as any device of its
 * class, and the note says so; kube-scheduler's own CEL decides what fits.
 *
 * MIG scores: per node, each MIG request is placed where kube-scheduler's
 * allocator will place it there, the first matching free partition in
 * slice order (the driver lists placements in kgpu_mig_slice_order), and
 * the node is charged that placement's kgpu_mig_cost: the room it takes
 * away (kgpu_mig_room: what profiles could still be placed), then the
 * compute slices it strands. Nodes rank by the cost, least first, so a 3g
 * that completes a GPU holding a 4g beats opening an empty GPU; of nodes
 * that cost as much, the fullest (least room kept) ranks first, keeping
 * empty GPUs for the big profiles. This is the rule `kgpu simulate --mig`
 * measures as `kgpu` (docs/policy.md, MIG). Scores are ranks, 10 the best,
 * as the kgpu policy's, at least 1 where the pod fits. A pod with both
 * kinds is scored by the policy, on the nodes where both fit.
 *
 * Cost: the selectors are evaluated once per scored node and device; the
 * placements are applied to the state's cluster and released before the
 * lock is given back. Caller holds st->mu.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

#define ASKS_MAX KGPU_PLACE_MAX_REQS
#define ROOM_MAX (1 << 20) /* more than a node's kgpu_mig_room over its GPUs */
/*
 * Selector terms evaluated in one call, at most: selectors are evaluated on
 * every device of every node scored, under the state's lock, and a tenant
 * writes them. Past it, the costliest are not read (the note says so).
 */
#define EVAL_BUDGET 2000000

/* A device of a slice as a selector sees it: a whole GPU, or a MIG device (p set) on one. */
typedef struct view {
    const ext_dra_device *g;
    const kgpu_mig_profile *p;
    const ext_dra_mig *m;
} view;

static bool view_get(const void *ctx, bool cap, const char *name, ext_cel_value *out)
{
    const view *v = ctx;
    int64_t mem = v->p != NULL ? v->p->memory_mib : v->g->memory_mib;
    memset(out, 0, sizeof(*out));
    if (cap) {
        if (strcmp(name, "memory") == 0)
            *out = (ext_cel_value){.type = EXT_CEL_QTY, .i = mem * 1024 * 1024};
        else if (strcmp(name, "cores") == 0 && v->p == NULL)
            *out = (ext_cel_value){.type = EXT_CEL_QTY, .i = 100};
        return out->type != 0;
    }
    static const char *const ints[] = {"index",   "numaNode", "memoryMiB",
                                       "migStart", "migSize",  "multiprocessors"};
    int64_t iv[] = {v->g->index, v->g->numa, mem, v->m ? v->m->start : -1,
                    v->p ? v->p->size : -1, v->p ? v->p->multiprocessors : -1};
    for (int k = 0; k < 6; k++)
        if (strcmp(name, ints[k]) == 0 && iv[k] >= 0) {
            *out = (ext_cel_value){.type = EXT_CEL_INT, .i = iv[k]};
            return true;
        }
    const char *s = NULL;
    if (strcmp(name, "productName") == 0 || strcmp(name, "model") == 0)
        s = v->g->model;
    else if (strcmp(name, "uuid") == 0 && v->p == NULL && v->g->uuid[0] != '\0')
        s = v->g->uuid;
    else if (strcmp(name, "profile") == 0 && v->p != NULL)
        s = v->p->name;
    if (s != NULL)
        *out = (ext_cel_value){.type = EXT_CEL_STR, .s = s};
    if (strcmp(name, "computeCapability") == 0 && v->g->cc >= 0)
        *out = (ext_cel_value){.type = EXT_CEL_VER, .i = v->g->cc};
    if (strcmp(name, "parentUUID") == 0 && v->p != NULL && v->g->uuid[0] != '\0')
        *out = (ext_cel_value){.type = EXT_CEL_STR, .s = v->g->uuid};
    if (strcmp(name, "parentIndex") == 0 && v->p != NULL)
        *out = (ext_cel_value){.type = EXT_CEL_INT, .i = v->g->index};
    if (strcmp(name, "mig") == 0 && v->p != NULL) /* a partition's alone */
        *out = (ext_cel_value){.type = EXT_CEL_BOOL, .b = true};
    return out->type != 0;
}

/* Whether the selector (NULL: none) takes device v. */
static bool matches(const ext_cel *cel, const view *v)
{
    ext_cel_device d = {.driver = EXT_DRA_DRIVER, .get = view_get, .ctx = v};
    return cel == NULL || ext_cel_eval(cel, &d) == 1;
}

static view mig_view(const ext_dra_slice *s, const ext_dra_mig *m)
{
    const ext_dra_device *g = &s->devices[m->gpu];
    const kgpu_mig_model *mm = g->mig_model > 0 ? kgpu_mig_model_at(g->mig_model - 1) : NULL;
    return (view){.g = g, .p = mm != NULL ? &mm->profiles[m->profile] : NULL, .m = m};
}

/* One ask as scored: its selector, its kind, and for whole/share its request. */
typedef struct ask {
    const ext_dra_ask *a;
    ext_cel *cel;
    bool mig;
    uint64_t models; /* whole GPUs' model ids its selector matched */
    kgpu_request req;
} ask;

/* What one call scores with; one block. */
typedef struct scoring {
    ext_state *st;
    ask asks[ASKS_MAX];
    int nasks, nwhole, nmig;
    const kgpu_request *reqs[ASKS_MAX]; /* the whole/share ones, in order */
    kgpu_assignment *held;              /* applied for scoring; released at the end */
    int nheld, held_cap;
    int64_t spent;         /* selector terms budgeted so far (EVAL_BUDGET) */
    char fail[REASON_MAX]; /* the first node's reason for 0 */
    int failed;
} scoring;

static const char *ask_name(const ask *k, char *buf, size_t len)
{
    snprintf(buf, len, "ResourceClaim %.63s/%.100s request #%d", k->a->claim->ns,
             k->a->claim->name, k->a->k + 1);
    return buf;
}

/* Node `node` scores 0 for `reason`; the first node's is kept for the log. */
static void node_fails(scoring *sc, const char *node, const char *reason)
{
    if (sc->failed++ == 0)
        snprintf(sc->fail, sizeof(sc->fail), "node %.63s: %.200s", node, reason);
}

static bool keep_held(scoring *sc, const kgpu_assignment *a)
{
    if (sc->nheld == sc->held_cap) {
        int cap = sc->held_cap * 2 + 16;
        kgpu_assignment *h = realloc(sc->held, (size_t)cap * sizeof(*h));
        if (h == NULL)
            return false;
        sc->held = h;
        sc->held_cap = cap;
    }
    sc->held[sc->nheld++] = *a;
    return true;
}

/*
 * Compiles the asks' selectors and decides each one's kind from what they
 * match on the scored nodes; a note on what was not trusted. -1 with why
 * when a request matches no device of any of them.
 */
static int read_selectors(scoring *sc, const int *idx, int n, char *note, size_t nlen, char *why,
                          size_t len)
{
    ext_state *st = sc->st;
    int devices = 0; /* on the nodes scored, whole and MIG */
    for (int i = 0; i < n; i++) {
        const kgpu_node *node = idx[i] >= 0 ? kgpu_cluster_node(st->cluster, idx[i]) : NULL;
        const ext_dra_slice *s = node != NULL ? kgpu_strmap_get(&st->dra_slices, node->name) : NULL;
        devices += s != NULL ? s->ndevices + s->nmig : 0;
    }
    for (int k = 0; k < sc->nasks; k++) {
        ask *q = &sc->asks[k];
        const ext_dra_request *r = q->a->req;
        char cwhy[REASON_MAX] = "", name[REASON_MAX];
        if (r->cel == EXT_DRA_CEL_UNREAD)
            snprintf(cwhy, sizeof(cwhy), "%s", r->cel_why);
        else if (r->cel >= 0 && (q->cel = ext_cel_compile(q->a->claim->cel + r->cel, cwhy,
                                                          sizeof(cwhy))) == NULL &&
                 strcmp(cwhy, "out of memory") == 0)
            return KGPU_ENOMEM;
        if (cwhy[0] != '\0' && note[0] == '\0')
            snprintf(note, nlen,
                     "%s: selector not read (%s): scored as any device of its class; "
                     "kube-scheduler's CEL decides what fits",
                     ask_name(q, name, sizeof(name)), cwhy);
        if (q->cel != NULL) {
            /* Twice over the devices at most: to tell its kind, then to place it. */
            int64_t cost = 2 * (int64_t)ext_cel_terms(q->cel) * devices;
            if (sc->spent + cost > EVAL_BUDGET) {
                ext_cel_free(q->cel);
                q->cel = NULL;
                if (note[0] == '\0')
                    snprintf(note, nlen,
                             "%s: selector not read (%" PRId64 " terms on %d devices pass the "
                             "%d evaluated a call): scored as any device of its class",
                             ask_name(q, name, sizeof(name)), cost / 2 / (devices ? devices : 1),
                             devices, EVAL_BUDGET);
            } else {
                sc->spent += cost;
            }
        }
        q->mig = r->mig;
        if (q->cel == NULL) {
            q->models = q->mig ? 0 : ~0ULL;
            continue;
        }
        /* Its class's devices: MIG partitions (mig.gpu.kgpu.io) or the rest (gpu.kgpu.io). */
        bool mig = false;
        int nodes = 0;
        for (int i = 0; i < n; i++) {
            nodes += idx[i] >= 0;
            const kgpu_node *node = idx[i] >= 0 ? kgpu_cluster_node(st->cluster, idx[i]) : NULL;
            const ext_dra_slice *s =
                node != NULL ? kgpu_strmap_get(&st->dra_slices, node->name) : NULL;
            for (int j = 0; !q->mig && s != NULL && j < s->ndevices; j++) {
                view v = {.g = &s->devices[j]};
                for (int g = 0; g < node->ngpus; g++)
                    if (node->gpus[g].index == s->devices[j].index && matches(q->cel, &v))
                        q->models |= 1ULL << node->gpus[g].model;
            }
            for (int j = 0; q->mig && s != NULL && j < s->nmig && !mig; j++) {
                view v = mig_view(s, &s->migs[j]);
                mig = v.p != NULL && matches(q->cel, &v);
            }
        }
        if (q->models == 0 && !mig) {
            snprintf(why, len, "%s: no device of the %d DRA nodes scored matches its selectors",
                     ask_name(q, name, sizeof(name)), nodes);
            return -1;
        }
    }
    return 0;
}

/* The pod's whole/share requests, compiled (the first learned as the pod's arrival). */
static int compile_requests(scoring *sc, const kgpu_pod *pod, kgpu_error *err)
{
    for (int k = 0; k < sc->nasks; k++) {
        ask *q = &sc->asks[k];
        if (q->mig)
            continue;
        ext_dra_request_of(q->a->req, &q->req);
        int rc = sc->nwhole == 0
                     ? ext_state_compile_request(sc->st, pod->uid, &q->req, err)
                     : kgpu_request_compile(sc->st->cluster, &q->req, err);
        if (rc != 0)
            return rc;
        if (q->models != ~0ULL) { /* its selector's models: no shape a policy caches */
            q->req.models &= q->models;
            q->req.shape = -1;
        }
        sc->reqs[sc->nwhole++] = &q->req;
    }
    /* The pod's CPU and memory go with the request scored: the last one. */
    if (sc->nwhole > 0) {
        kgpu_request *last = (kgpu_request *)sc->reqs[sc->nwhole - 1];
        last->cpu_milli = pod->cpu_milli;
        last->memory_mib = pod->memory_mib;
    }
    return 0;
}

/*
 * Places the MIG asks on node ci (its slice s) on a copy of its GPUs'
 * instances: true and *value (the room kept, <= 0), and the GPUs that had
 * none before and have some now in *opened (a bit per position); false
 * with the node's reason.
 */
static bool place_mig(scoring *sc, int ci, const ext_dra_slice *s, int64_t *value,
                      uint32_t *opened)
{
    ext_state *st = sc->st;
    const kgpu_node *node = kgpu_cluster_node(st->cluster, ci);
    const ext_dra_node *dn = kgpu_strmap_get(&st->dra_nodes, node->name);
    kgpu_mig_gpu mg[KGPU_MAX_GPUS_PER_NODE];
    bool avail[KGPU_MAX_GPUS_PER_NODE] = {false};
    int pos_of[KGPU_MAX_GPUS_PER_NODE]; /* slice device -> cluster position */
    memset(mg, 0, sizeof(mg));
    *opened = 0;
    for (int j = 0; j < s->ndevices; j++) {
        pos_of[j] = -1;
        for (int g = 0; g < node->ngpus; g++)
            if (node->gpus[g].index == s->devices[j].index)
                pos_of[j] = g;
        int g = pos_of[j];
        if (g < 0 || dn == NULL || s->devices[j].mig_model <= 0 || !node->gpus[g].healthy)
            continue;
        if (dn->mig_users[g] > 0) {
            avail[g] = dn->mig_model[g] == s->devices[j].mig_model - 1;
            mg[g] = dn->mig[g];
        } else {
            avail[g] = node->gpus[g].free_milli == KGPU_MILLI &&
                       node->gpus[g].free_memory_mib == node->gpus[g].memory_mib;
        }
    }
    int64_t lost = 0;
    char name[REASON_MAX];
    for (int k = 0; k < sc->nasks; k++) {
        const ask *q = &sc->asks[k];
        bool match[EXT_DRA_MIG_MAX]; /* once per device, whatever its count */
        for (int j = 0; q->mig && j < s->nmig; j++) {
            view v = mig_view(s, &s->migs[j]);
            match[j] = v.p != NULL && matches(q->cel, &v);
        }
        for (int c = 0; q->mig && c < q->a->req->count; c++) {
            /*
             * The partition kube-scheduler's allocator will take on this node: the first
             * free one it selects in slice order, which the driver lists GPU by GPU,
             * profiles smallest first, each profile's starts in kgpu_mig_slice_order.
             */
            int best = -1;
            int64_t best_loss = INT64_MAX, best_rank = INT64_MAX;
            for (int j = 0; j < s->nmig; j++) {
                int g = pos_of[s->migs[j].gpu];
                if (!match[j] || g < 0 || !avail[g])
                    continue;
                const kgpu_mig_model *m =
                    kgpu_mig_model_at(s->devices[s->migs[j].gpu].mig_model - 1);
                int64_t cost = kgpu_mig_cost(m, &mg[g], s->migs[j].profile, s->migs[j].start);
                if (cost < 0)
                    continue;
                int64_t rank = ((int64_t)s->devices[s->migs[j].gpu].index * KGPU_MIG_MAX_PROFILES +
                                s->migs[j].profile) * KGPU_MIG_MAX_STARTS + s->migs[j].order;
                if (rank < best_rank) {
                    best_rank = rank;
                    best_loss = cost;
                    best = j;
                }
            }
            if (best < 0) {
                char reason[REASON_MAX];
                snprintf(reason, sizeof(reason), "%.200s: no MIG device it selects is free there",
                         ask_name(q, name, sizeof(name)));
                node_fails(sc, node->name, reason);
                return false;
            }
            const ext_dra_mig *md = &s->migs[best];
            int g = pos_of[md->gpu];
            const kgpu_mig_model *m = kgpu_mig_model_at(s->devices[md->gpu].mig_model - 1);
            kgpu_mig_take(m, &mg[g], md->profile, md->start);
            lost += best_loss;
            if (dn->mig_users[g] == 0)
                *opened |= 1u << g;
        }
    }
    /* The least cost first (kgpu_mig_cost); of those, the fullest node: the least room kept. */
    int64_t kept = 0;
    for (int j = 0; j < s->ndevices; j++)
        if (pos_of[j] >= 0 && avail[pos_of[j]])
            kept += kgpu_mig_room(kgpu_mig_model_at(s->devices[j].mig_model - 1), &mg[pos_of[j]]);
    *value = -kept - lost * ROOM_MAX;
    return true;
}

/* Holds GPUs `opened` of node ci whole for the rest of the call (MIG instances go there). */
static int hold_opened(scoring *sc, int ci, uint32_t opened, kgpu_error *err)
{
    for (int g = 0; g < KGPU_MAX_GPUS_PER_NODE; g++) {
        if (!(opened & (1u << g)))
            continue;
        kgpu_request hold;
        ext_dra_mig_hold(&hold);
        kgpu_assignment a;
        if (kgpu_cluster_apply(sc->st->cluster, &hold, ci, &g, &a, err) != 0)
            return err->code;
        if (!keep_held(sc, &a)) {
            kgpu_cluster_release(sc->st->cluster, &a, NULL);
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        }
    }
    return 0;
}

/*
 * Node ci: whether all the asks fit there together; its MIG value; the
 * placements of all whole/share requests but the last left applied (held)
 * for the policy to score the last one after them. <0: an error.
 */
static int score_node(scoring *sc, kgpu_policy *p, int ci, int64_t *value, kgpu_error *err)
{
    ext_state *st = sc->st;
    const kgpu_node *node = kgpu_cluster_node(st->cluster, ci);
    const ext_dra_slice *s = kgpu_strmap_get(&st->dra_slices, node->name);
    uint32_t opened = 0;
    *value = 0;
    if (s == NULL) {
        node_fails(sc, node->name, "no ResourceSlice of " EXT_DRA_DRIVER);
        return 0;
    }
    if (sc->nmig > 0 && !place_mig(sc, ci, s, value, &opened))
        return 0;
    if (sc->nwhole == 0)
        return 1;
    if (sc->nwhole == 1 && opened == 0) { /* one request: the policy scores it as it is */
        char fwhy[REASON_MAX];
        if (kgpu_fit_all(st->cluster, ci, NULL, 0, sc->reqs, 1, fwhy, sizeof(fwhy)))
            return 1;
        node_fails(sc, node->name, fwhy);
        return 0;
    }
    int mark = sc->nheld, rc = hold_opened(sc, ci, opened, err);
    if (rc != 0)
        return rc;
    kgpu_assignment out[ASKS_MAX];
    kgpu_error perr;
    kgpu_error_clear(&perr);
    rc = kgpu_policy_place(p, st->cluster, ci, sc->reqs, sc->nwhole, &st->rng, out, &perr);
    if (rc == KGPU_ENOFIT) {
        node_fails(sc, node->name, perr.msg);
        for (int i = sc->nheld - 1; i >= mark; i--) /* the node's MIG holds: not scored */
            kgpu_cluster_release(st->cluster, &sc->held[i], NULL);
        sc->nheld = mark;
        return 0;
    }
    if (rc != 0) {
        *err = perr;
        return rc;
    }
    /* The last one is what the policy scores, with the others in place. */
    kgpu_cluster_release(st->cluster, &out[sc->nwhole - 1], NULL);
    for (int i = 0; i < sc->nwhole - 1; i++) {
        if (!keep_held(sc, &out[i])) {
            for (int j = sc->nwhole - 2; j >= i; j--)
                kgpu_cluster_release(st->cluster, &out[j], NULL);
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        }
    }
    return 1;
}

/*
 * 1..10 by rank of value, as the kgpu policy ranks: 10 less the number of
 * distinct better values, at least 1 (it fits). O(n log n).
 */
static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

static int rank_values(const int64_t *values, const int *fit, int n, int *scores)
{
    int64_t *sorted = calloc((size_t)n + 1, sizeof(*sorted));
    if (sorted == NULL)
        return KGPU_ENOMEM;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (fit[i])
            sorted[m++] = values[i];
    qsort(sorted, (size_t)m, sizeof(*sorted), cmp_desc);
    int distinct = 0; /* sorted[0..distinct): the distinct values, best first */
    for (int i = 0; i < m; i++)
        if (distinct == 0 || sorted[distinct - 1] != sorted[i])
            sorted[distinct++] = sorted[i];
    for (int i = 0; i < n; i++) {
        if (!fit[i]) {
            scores[i] = 0;
            continue;
        }
        int lo = 0, hi = distinct; /* the first not better than values[i] */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (sorted[mid] > values[i])
                lo = mid + 1;
            else
                hi = mid;
        }
        scores[i] = 10 - lo > 1 ? 10 - lo : 1;
    }
    free(sorted);
    return 0;
}

int ext_dra_score(ext_state *st, const kgpu_pod *pod, const json_t *pj, const int *idx, int n,
                  int *scores, char *why, size_t len, char *note, size_t nlen, kgpu_error *err)
{
    ext_dra_ask asks[ASKS_MAX];
    why[0] = note[0] = '\0';
    memset(scores, 0, (size_t)n * sizeof(*scores));
    int na = ext_dra_pod_asks(st, pj, asks, ASKS_MAX, why, len);
    if (na <= 0)
        return 0;
    scoring *sc = calloc(1, sizeof(*sc));
    int64_t *values = calloc((size_t)n + 1, sizeof(*values));
    int *fit = calloc((size_t)n + 1, sizeof(*fit)), *known = calloc((size_t)n + 1, sizeof(*known));
    int *ks = calloc((size_t)n + 1, sizeof(*ks));
    int rc = 0;
    kgpu_policy *p = NULL;
    if (sc == NULL || values == NULL || fit == NULL || known == NULL || ks == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    sc->st = st;
    sc->nasks = na;
    for (int k = 0; k < na; k++)
        sc->asks[k].a = &asks[k];
    rc = read_selectors(sc, idx, n, note, nlen, why, len);
    if (rc != 0) {
        rc = rc == KGPU_ENOMEM ? kgpu_error_set(err, rc, "out of memory") : 0;
        goto out;
    }
    for (int k = 0; k < na; k++)
        sc->nmig += sc->asks[k].mig;
    if ((rc = compile_requests(sc, pod, err)) != 0 ||
        (p = ext_state_policy(st, pod, err)) == NULL) {
        if (err->code != KGPU_ENOMEM) {
            snprintf(why, len, "pod %.63s/%.100s: %.200s", pod->ns, pod->name, err->msg);
            rc = 0;
        } else {
            rc = err->code;
        }
        goto out;
    }
    int m = 0, nodes = 0;
    for (int i = 0; i < n; i++) {
        if (idx[i] < 0)
            continue;
        nodes++;
        rc = score_node(sc, p, idx[i], &values[i], err);
        if (rc < 0)
            goto out;
        fit[i] = rc;
        rc = 0;
        if (fit[i])
            known[m++] = idx[i];
    }
    if (m == 0) {
        snprintf(why, len, "pod %.63s/%.100s: its %d requests of class %s fit none of the %d DRA "
                 "nodes scored; %s", pod->ns, pod->name, na, EXT_DRA_CLASS, nodes,
                 sc->fail[0] ? sc->fail : "no DRA node among them");
    } else if (sc->nwhole == 0) {
        if (rank_values(values, fit, n, scores) != 0)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    } else {
        rc = kgpu_policy_node_scores(p, st->cluster, sc->reqs[sc->nwhole - 1], known, m, ks, err);
        for (int i = 0, j = 0; i < n && rc == 0; i++)
            scores[i] = fit[i] ? ks[j++] : 0;
    }
    if (m > 0 && sc->failed > 0 && note[0] == '\0')
        snprintf(note, nlen, "pod %.63s/%.100s scores 0 on %d of %d DRA nodes; %s", pod->ns,
                 pod->name, sc->failed, nodes, sc->fail);
out:
    for (int i = sc != NULL ? sc->nheld - 1 : -1; i >= 0; i--) {
        kgpu_error rerr;
        if (kgpu_cluster_release(st->cluster, &sc->held[i], &rerr) != 0)
            ext_log(EXT_ERROR, "DRA scoring: release failed: %s", rerr.msg);
    }
    for (int k = 0; sc != NULL && k < sc->nasks; k++)
        ext_cel_free(sc->asks[k].cel);
    if (sc != NULL)
        free(sc->held);
    free(sc);
    free(values);
    free(fit);
    free(known);
    free(ks);
    return rc;
}
