/*
 * GPU queues (kgpu/queue.h): the tree, quota arithmetic, admission and
 * reclaim. Usage is kept per queue for the queue and everything under it,
 * so admission walks one path from the pod's queue to its root; per-model
 * usage is kept beside the totals, by the cluster's model ids.
 *
 * Reclaim is where kgpu differs from quota systems that do not see GPUs:
 * they free quota, and the pod may still not fit, because what they freed
 * is scattered over GPUs it cannot combine. Here each node is asked which
 * borrowing pods would have to leave for the waiting pod to fit there
 * (the same placement search filter and bind use), and the node whose
 * victims are of the lowest priority and free the least the pod cannot use
 * wins. Evicting a pod never takes its queue (or an ancestor the waiting
 * pod does not share) below its guarantee.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kgpu/queue.h"

typedef struct qmodel {
    char name[KGPU_MODEL_NAME_MAX];
    int id; /* in the bound cluster's model table, -1 when none has it */
    kgpu_qamount g, l;
} qmodel;

typedef struct queue {
    char name[KGPU_QUEUE_NAME_MAX + 1];
    int parent, depth, weight;
    bool leaf;
    kgpu_qamount g, l;
    kgpu_qamount used;
    int pods;
    int nmodels;
    qmodel models[KGPU_QUEUE_MAX_MODELS];
    kgpu_qamount used_model[KGPU_MAX_MODELS];
} queue;

struct kgpu_queues {
    int n;
    queue *q;
    kgpu__qns *ns; /* which namespaces may name which queue (queue_ns.c), shared by clones */
};

const char *kgpu_queue_gpus_str(int64_t milli, char *buf, size_t len)
{
    const char *sign = milli < 0 ? "-" : "";
    uint64_t m = milli < 0 ? (uint64_t)(-(milli + 1)) + 1 : (uint64_t)milli;
    uint64_t whole = m / KGPU_MILLI, frac = m % KGPU_MILLI;
    if (frac == 0) {
        snprintf(buf, len, "%s%" PRIu64, sign, whole);
    } else {
        char f[8];
        snprintf(f, sizeof(f), "%03" PRIu64, frac);
        for (int i = 2; i > 0 && f[i] == '0'; i--)
            f[i] = '\0';
        snprintf(buf, len, "%s%" PRIu64 ".%s", sign, whole, f);
    }
    return buf;
}

static bool valid_name(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > KGPU_QUEUE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.'))
            return false;
    }
    return true;
}

static bool amount_valid(kgpu_qamount a)
{
    return (a.milli >= 0 || a.milli == KGPU_QUEUE_UNSET) &&
           (a.mem_mib >= 0 || a.mem_mib == KGPU_QUEUE_UNSET);
}

/* guarantee <= limit in every dimension both set; writes the failing field. */
static int check_g_le_l(const char *qname, const char *prefix, kgpu_qamount g, kgpu_qamount l,
                        kgpu_error *err)
{
    char a[32], b[32];
    if (g.milli != KGPU_QUEUE_UNSET && l.milli != KGPU_QUEUE_UNSET && g.milli > l.milli)
        return kgpu_error_set(err, KGPU_EINVAL, "queue %s: %sguarantee.gpu %s above limit.gpu %s",
                              qname, prefix, kgpu_queue_gpus_str(g.milli, a, sizeof(a)),
                              kgpu_queue_gpus_str(l.milli, b, sizeof(b)));
    if (g.mem_mib != KGPU_QUEUE_UNSET && l.mem_mib != KGPU_QUEUE_UNSET && g.mem_mib > l.mem_mib)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "queue %s: %sguarantee.memory %" PRId64
                              " MiB above limit.memory %" PRId64 " MiB",
                              qname, prefix, g.mem_mib, l.mem_mib);
    return 0;
}

static int find(const kgpu_queues *qs, const char *name)
{
    for (int i = 0; i < qs->n; i++)
        if (strcmp(qs->q[i].name, name) == 0)
            return i;
    return -1;
}

int kgpu_queues_find(const kgpu_queues *qs, const char *name)
{
    return name ? find(qs, name) : -1;
}

int kgpu_queues_count(const kgpu_queues *qs)
{
    return qs->n;
}

void kgpu_queues_free(kgpu_queues *qs)
{
    if (qs == NULL)
        return;
    kgpu__qns_free(qs->ns);
    free(qs->q);
    free(qs);
}

kgpu_queues *kgpu_queues_clone(const kgpu_queues *qs)
{
    kgpu_queues *c = malloc(sizeof(*c));
    if (c == NULL)
        return NULL;
    c->n = qs->n;
    c->q = malloc((size_t)qs->n * sizeof(*c->q));
    if (c->q == NULL) {
        free(c);
        return NULL;
    }
    memcpy(c->q, qs->q, (size_t)qs->n * sizeof(*c->q));
    c->ns = kgpu__qns_ref(qs->ns);
    return c;
}

/*
 * Every guarantee can be honoured. What the queues below a queue A are
 * guaranteed together is the sum of the guarantees of the highest queues
 * under A that set one (a queue that sets one answers for those below it,
 * which must fit in it). That sum must fit A's own guarantee where A sets
 * one, and A's limit: a limit below it would keep some queue under A below
 * its guarantee for good, its pods waiting for a reclaim that can never
 * make room (reclaim never takes a queue below its guarantee). The same
 * holds per model (key: a model name), against the model's limit and the
 * queue's total limit. Sums of siblings count, not only one child: two
 * children guaranteed 3 GPUs each under a limit of 4 cannot both have
 * theirs at once.
 */
typedef struct gacc {
    int64_t v[2]; /* milli, MiB */
    int nsrc[2];  /* guarantees summed */
    int src[2];   /* the queue of the last one */
} gacc;

static const qmodel *model_of(const queue *x, const char *model)
{
    for (int m = 0; model != NULL && m < x->nmodels; m++)
        if (strcmp(x->models[m].name, model) == 0)
            return &x->models[m];
    return NULL;
}

/* Dimension d of a guarantee or limit of queue x for key `model` (NULL: totals), or UNSET. */
static int64_t dim_of(const queue *x, const char *model, bool limit, int d)
{
    const qmodel *qm = model_of(x, model);
    kgpu_qamount a = model == NULL ? (limit ? x->l : x->g)
                     : qm != NULL ? (limit ? qm->l : qm->g)
                                  : (kgpu_qamount){KGPU_QUEUE_UNSET, KGPU_QUEUE_UNSET};
    return d == 0 ? a.milli : a.mem_mib;
}

/* "4.5" (GPUs) or "40960 MiB". */
static void amount_str(int d, int64_t v, char *buf, size_t len)
{
    if (d == 0)
        kgpu_queue_gpus_str(v, buf, len);
    else
        snprintf(buf, len, "%" PRId64 " MiB", v);
}

/* Sum s (in acc of A, key `model`, dimension d) against limit l of A, named `field`. */
static int honour_fail(const kgpu_queues *qs, int a, const gacc *acc, const char *model, int d,
                       int64_t sum, int64_t l, const char *field, kgpu_error *err)
{
    static const char *const dim[2] = {"gpu", "memory"};
    char mp[KGPU_MODEL_NAME_MAX + 16] = "", s1[32], s2[32];
    if (model != NULL)
        snprintf(mp, sizeof(mp), "models.%s.", model);
    amount_str(d, sum, s1, sizeof(s1));
    amount_str(d, l, s2, sizeof(s2));
    const char *an = qs->q[a].name;
    if (dim_of(&qs->q[a], model, false, d) != KGPU_QUEUE_UNSET)
        return kgpu_error_set(err, KGPU_EINVAL, "queue %s: %sguarantee.%s %s above %s %s", an, mp,
                              dim[d], s1, field, s2);
    if (acc->nsrc[d] == 1)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "queue %s: %sguarantee.%s %s cannot be honoured: queue %s above it "
                              "has %s %s",
                              qs->q[acc->src[d]].name, mp, dim[d], s1, an, field, s2);
    return kgpu_error_set(err, KGPU_EINVAL,
                          "queue %s: the queues below it are guaranteed %s%s%s%s together, more "
                          "than its %s %s: they cannot all have their guarantee at once",
                          an, s1, d == 0 ? " GPUs" : "", model ? " of " : "", model ? model : "",
                          field, s2);
}

static int check_key(const kgpu_queues *qs, const char *model, gacc *acc, kgpu_error *err)
{
    static const char *const dim[2] = {"gpu", "memory"};
    memset(acc, 0, (size_t)qs->n * sizeof(*acc));
    for (int s = 0; s < qs->n; s++)
        for (int d = 0; d < 2; d++) {
            int64_t g = dim_of(&qs->q[s], model, false, d);
            for (int a = qs->q[s].parent; g > 0 && a >= 0; a = qs->q[a].parent) {
                acc[a].v[d] += g;
                acc[a].nsrc[d]++;
                acc[a].src[d] = s;
                if (dim_of(&qs->q[a], model, false, d) != KGPU_QUEUE_UNSET)
                    break; /* it answers for s to the queues above it */
            }
        }
    for (int a = 0; a < qs->n; a++)
        for (int d = 0; d < 2; d++) {
            const queue *x = &qs->q[a];
            int64_t own = dim_of(x, model, false, d), sum = acc[a].v[d];
            char field[KGPU_MODEL_NAME_MAX + 32], s1[32], s2[32];
            if (own != KGPU_QUEUE_UNSET && sum > own) {
                amount_str(d, sum, s1, sizeof(s1));
                amount_str(d, own, s2, sizeof(s2));
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "queue %s: its children are guaranteed %s%s, more than its "
                                      "own %s%s%sguarantee.%s %s",
                                      x->name, s1, d == 0 ? " GPUs" : "", model ? "models." : "",
                                      model ? model : "", model ? "." : "", dim[d], s2);
            }
            int64_t g = own != KGPU_QUEUE_UNSET ? own : sum;
            int64_t ml = dim_of(x, model, true, d), tl = dim_of(x, NULL, true, d);
            snprintf(field, sizeof(field), "models.%s.limit.%s", model ? model : "", dim[d]);
            if (model != NULL && ml != KGPU_QUEUE_UNSET && g > ml && own == KGPU_QUEUE_UNSET)
                return honour_fail(qs, a, &acc[a], model, d, g, ml, field, err);
            snprintf(field, sizeof(field), "limit.%s", dim[d]);
            if (tl != KGPU_QUEUE_UNSET && g > tl && (model != NULL || own == KGPU_QUEUE_UNSET))
                return honour_fail(qs, a, &acc[a], model, d, g, tl, field, err);
        }
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_honoured(const kgpu_queues *qs, kgpu_error *err)
{
    gacc *acc = calloc((size_t)qs->n + 1, sizeof(*acc));
    const char **names = calloc((size_t)qs->n * KGPU_QUEUE_MAX_MODELS + 1, sizeof(*names));
    int rc = 0;
    size_t nn = 0;
    if (acc == NULL || names == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = check_key(qs, NULL, acc, err)) != 0)
        goto out;
    for (int i = 0; i < qs->n; i++)
        for (int m = 0; m < qs->q[i].nmodels; m++)
            names[nn++] = qs->q[i].models[m].name;
    qsort(names, nn, sizeof(*names), cmp_name);
    for (size_t k = 0; k < nn && rc == 0; k++)
        if (k == 0 || strcmp(names[k], names[k - 1]) != 0)
            rc = check_key(qs, names[k], acc, err);
out:
    free(acc);
    free(names);
    return rc;
}

int kgpu_queues_new(const kgpu_queue_spec *specs, int n, kgpu_queues **out, kgpu_error *err)
{
    *out = NULL;
    if (n < 0 || n > KGPU_QUEUE_MAX - 1 || (n > 0 && specs == NULL))
        return kgpu_error_set(err, KGPU_EINVAL, "%d queues: at most %d", n, KGPU_QUEUE_MAX - 1);
    kgpu_queues *qs = calloc(1, sizeof(*qs));
    if (qs == NULL || (qs->q = calloc((size_t)n + 1, sizeof(*qs->q))) == NULL) {
        free(qs);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const kgpu_queue_spec *s = &specs[i];
        queue *q = &qs->q[i];
        if (!valid_name(s->name)) {
            rc = kgpu_error_set(err, KGPU_EINVAL,
                                "queue %d: name '%.80s': 1 to %d characters of a-z, 0-9, '-' "
                                "and '.'",
                                i + 1, s->name ? s->name : "", KGPU_QUEUE_NAME_MAX);
            goto fail;
        }
        if (find(qs, s->name) >= 0) {
            rc = kgpu_error_set(err, KGPU_EEXIST, "queue %s: defined twice", s->name);
            goto fail;
        }
        snprintf(q->name, sizeof(q->name), "%s", s->name);
        qs->n = i + 1;
        if (!amount_valid(s->guarantee) || !amount_valid(s->limit)) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "queue %s: negative guarantee or limit", s->name);
            goto fail;
        }
        if (s->weight < 0 || s->weight > 1000) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "queue %s: weight %d outside 1..1000", s->name,
                                s->weight);
            goto fail;
        }
        q->g = s->guarantee;
        q->l = s->limit;
        q->weight = s->weight ? s->weight : 1;
        q->parent = -1;
        if ((rc = check_g_le_l(q->name, "", q->g, q->l, err)) != 0)
            goto fail;
        if (s->nmodels < 0 || s->nmodels > KGPU_QUEUE_MAX_MODELS || (s->nmodels && !s->models)) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "queue %s: %d model entries, at most %d", s->name,
                                s->nmodels, KGPU_QUEUE_MAX_MODELS);
            goto fail;
        }
        for (int m = 0; m < s->nmodels; m++) {
            const kgpu_queue_model_spec *ms = &s->models[m];
            if (ms->model == NULL || ms->model[0] == '\0' ||
                strlen(ms->model) >= KGPU_MODEL_NAME_MAX) {
                rc = kgpu_error_set(err, KGPU_EINVAL, "queue %s: models[%d]: model name 1 to %d "
                                    "characters", s->name, m, KGPU_MODEL_NAME_MAX - 1);
                goto fail;
            }
            for (int k = 0; k < m; k++)
                if (strcmp(q->models[k].name, ms->model) == 0) {
                    rc = kgpu_error_set(err, KGPU_EEXIST, "queue %s: model %s listed twice",
                                        s->name, ms->model);
                    goto fail;
                }
            if (!amount_valid(ms->guarantee) || !amount_valid(ms->limit)) {
                rc = kgpu_error_set(err, KGPU_EINVAL, "queue %s: model %s: negative amount",
                                    s->name, ms->model);
                goto fail;
            }
            char prefix[KGPU_MODEL_NAME_MAX + 16];
            snprintf(prefix, sizeof(prefix), "models.%s.", ms->model);
            if ((rc = check_g_le_l(q->name, prefix, ms->guarantee, ms->limit, err)) != 0)
                goto fail;
            qmodel *qm = &q->models[q->nmodels++];
            snprintf(qm->name, sizeof(qm->name), "%s", ms->model);
            qm->id = -1;
            qm->g = ms->guarantee;
            qm->l = ms->limit;
        }
    }
    /* Parents, after every name is known (a parent may come after its child). */
    for (int i = 0; i < n; i++) {
        const char *p = specs[i].parent;
        if (p == NULL || p[0] == '\0')
            continue;
        int pi = find(qs, p);
        if (pi < 0) {
            rc = kgpu_error_set(err, KGPU_ENOENT, "queue %s: parent %.80s is not defined",
                                qs->q[i].name, p);
            goto fail;
        }
        if (pi == i) {
            rc = kgpu_error_set(err, KGPU_EINVAL, "queue %s: its own parent", qs->q[i].name);
            goto fail;
        }
        qs->q[i].parent = pi;
    }
    if (find(qs, KGPU_QUEUE_DEFAULT) < 0) {
        queue *d = &qs->q[qs->n++];
        snprintf(d->name, sizeof(d->name), "%s", KGPU_QUEUE_DEFAULT);
        d->parent = -1;
        d->weight = 1;
        d->g = (kgpu_qamount){0, 0};
        d->l = (kgpu_qamount){KGPU_QUEUE_UNSET, KGPU_QUEUE_UNSET};
    }
    for (int i = 0; i < qs->n; i++) {
        int depth = 0, p = qs->q[i].parent;
        while (p >= 0) {
            /* depth counts parents: a root is level 1, so depth + 1 levels. */
            if (++depth >= KGPU_QUEUE_MAX_DEPTH) {
                rc = kgpu_error_set(err, KGPU_EINVAL,
                                    "queue %s: parents form a cycle or nest more than %d levels",
                                    qs->q[i].name, KGPU_QUEUE_MAX_DEPTH);
                goto fail;
            }
            p = qs->q[p].parent;
        }
        qs->q[i].depth = depth;
        qs->q[i].leaf = true;
    }
    for (int i = 0; i < qs->n; i++)
        if (qs->q[i].parent >= 0)
            qs->q[qs->q[i].parent].leaf = false;
    if ((rc = check_honoured(qs, err)) != 0 || (rc = kgpu__qns_new(specs, n, &qs->ns, err)) != 0)
        goto fail;
    *out = qs;
    return 0;
fail:
    kgpu_queues_free(qs);
    return rc;
}

void kgpu_queues_cap_at_guarantee(kgpu_queues *qs)
{
    for (int i = 0; i < qs->n; i++) {
        queue *x = &qs->q[i];
        bool any = x->g.milli != KGPU_QUEUE_UNSET || x->g.mem_mib != KGPU_QUEUE_UNSET;
        if (!any && !x->leaf)
            continue; /* a parent that guarantees nothing: its children's caps hold */
        x->l.milli = x->g.milli != KGPU_QUEUE_UNSET ? x->g.milli : 0;
        /* Memory nobody guaranteed stays unlimited when compute is guaranteed. */
        x->l.mem_mib = x->g.mem_mib != KGPU_QUEUE_UNSET ? x->g.mem_mib
                       : any                          ? KGPU_QUEUE_UNSET
                                                      : 0;
        for (int m = 0; m < x->nmodels; m++)
            x->models[m].l = x->models[m].g;
    }
}

int kgpu_queues_bind_models(kgpu_queues *qs, const kgpu_cluster *c, kgpu_error *err)
{
    (void)err;
    uint64_t present = kgpu_cluster_models_present(c);
    for (int i = 0; i < qs->n; i++)
        for (int m = 0; m < qs->q[i].nmodels; m++) {
            qmodel *qm = &qs->q[i].models[m];
            qm->id = -1;
            for (int id = 0; id < kgpu_cluster_model_count(c) && id < KGPU_MAX_MODELS; id++)
                if (((present >> id) & 1) && strcmp(kgpu_cluster_model_name(c, id), qm->name) == 0)
                    qm->id = id;
        }
    return 0;
}

int kgpu_queues_info(const kgpu_queues *qs, int q, kgpu_queue_info *out)
{
    if (q < 0 || q >= qs->n)
        return KGPU_ENOENT;
    const queue *x = &qs->q[q];
    *out = (kgpu_queue_info){.name = x->name,
                             .parent = x->parent,
                             .depth = x->depth,
                             .weight = x->weight,
                             .guarantee = x->g,
                             .limit = x->l,
                             .used = x->used,
                             .pods = x->pods,
                             .leaf = x->leaf};
    return 0;
}

const char *kgpu_queue_name_for(const char *pod_label, const char *namespace_annotation)
{
    if (pod_label != NULL && pod_label[0] != '\0')
        return pod_label;
    if (namespace_annotation != NULL && namespace_annotation[0] != '\0')
        return namespace_annotation;
    return KGPU_QUEUE_DEFAULT;
}

int kgpu_queues_pick(const kgpu_queues *qs, const kgpu_queue_ns *ns, const char *pod_label,
                     char *why, size_t whylen)
{
    const char *nsname = ns != NULL && ns->name != NULL ? ns->name : "";
    const char *own = kgpu_queue_name_for(NULL, ns != NULL ? ns->queue : NULL);
    int home = find(qs, own);
    if (pod_label == NULL || pod_label[0] == '\0') {
        if (home < 0 && why != NULL)
            snprintf(why, whylen,
                     "queue %.63s does not exist (named by namespace %.63s's kgpu.io/queue "
                     "annotation)",
                     own, nsname);
        return home;
    }
    int q = find(qs, pod_label);
    for (int a = q; a >= 0; a = qs->q[a].parent)
        if (a == home || kgpu__qns_admits(qs->ns, a, ns))
            return q;
    /* The same words whether it exists or not: no tenant learns other tenants' queues. */
    if (why != NULL)
        snprintf(why, whylen,
                 "queue %.63s (the pod's kgpu.io/queue label) does not exist or is not open to "
                 "namespace %.63s: a namespace uses its own queue (%.63s), the queues below it, "
                 "and the queues whose GPUQueue admits it (docs/queues.md)",
                 pod_label, nsname, own);
    return -1;
}

void kgpu_qdemand_of_request(const kgpu_request *req, kgpu_qdemand *d)
{
    memset(d, 0, sizeof(*d));
    d->milli = kgpu__gpu_demand(req);
    if (req->gpu_count > 0)
        d->mem_mib = (int64_t)req->gpu_count * req->gpu_memory_mib;
}

static void add_part(kgpu_qdemand *d, int model, int milli, int64_t mem)
{
    d->milli += milli;
    d->mem_mib += mem;
    if (d->nparts < KGPU_MAX_GPUS_PER_NODE) {
        d->part[d->nparts].model = model;
        d->part[d->nparts].milli = milli;
        d->part[d->nparts].mem_mib = mem;
        d->nparts++;
    }
}

void kgpu_qdemand_of_assignment(const kgpu_cluster *c, const kgpu_assignment *a, kgpu_qdemand *d)
{
    memset(d, 0, sizeof(*d));
    const kgpu_node *n = kgpu_cluster_node(c, a->node);
    for (int i = 0; i < a->ngpus && n != NULL; i++) {
        const kgpu_gpu *g = &n->gpus[a->gpus[i]];
        add_part(d, g->model, a->exclusive ? KGPU_MILLI : a->gpu_milli,
                 a->exclusive ? g->memory_mib : a->gpu_memory_mib);
    }
}

void kgpu_qdemand_of_placement(const kgpu_cluster *c, const kgpu_request *req, int node,
                               const int *gpus, kgpu_qdemand *d)
{
    memset(d, 0, sizeof(*d));
    const kgpu_node *n = kgpu_cluster_node(c, node);
    for (int i = 0; i < req->gpu_count && n != NULL; i++) {
        const kgpu_gpu *g = &n->gpus[gpus[i]];
        add_part(d, g->model, req->exclusive ? KGPU_MILLI : req->gpu_milli,
                 req->exclusive ? g->memory_mib : req->gpu_memory_mib);
    }
}

/* Per-model sums of d's parts: into pm[model] (callers zero it); returns the model mask. */
static uint64_t parts_by_model(const kgpu_qdemand *d, kgpu_qamount *pm)
{
    uint64_t mask = 0;
    for (int i = 0; i < d->nparts; i++) {
        int m = d->part[i].model;
        if (m < 0 || m >= KGPU_MAX_MODELS)
            continue;
        if (!((mask >> m) & 1))
            pm[m] = (kgpu_qamount){0, 0};
        mask |= 1ULL << m;
        pm[m].milli += d->part[i].milli;
        pm[m].mem_mib += d->part[i].mem_mib;
    }
    return mask;
}

/* Would used + add pass limit l? Writes the reason when it would. */
static bool over(const char *qname, const char *what, kgpu_qamount used, kgpu_qamount add,
                 kgpu_qamount l, char *why, size_t whylen)
{
    char a[32], b[32];
    if (l.milli != KGPU_QUEUE_UNSET && add.milli > 0 && used.milli + add.milli > l.milli) {
        if (why)
            snprintf(why, whylen, "queue %s would use %s %sGPUs of its limit %s", qname,
                     kgpu_queue_gpus_str(used.milli + add.milli, a, sizeof(a)), what,
                     kgpu_queue_gpus_str(l.milli, b, sizeof(b)));
        return true;
    }
    if (l.mem_mib != KGPU_QUEUE_UNSET && add.mem_mib > 0 &&
        used.mem_mib + add.mem_mib > l.mem_mib) {
        if (why)
            snprintf(why, whylen,
                     "queue %s would use %" PRId64 " MiB of %sGPU memory of its limit %" PRId64
                     " MiB",
                     qname, used.mem_mib + add.mem_mib, what, l.mem_mib);
        return true;
    }
    return false;
}

/* used + add within guarantee g (dimensions g sets; nothing set: nothing is within). */
static bool within(kgpu_qamount used, kgpu_qamount add, kgpu_qamount g)
{
    if (g.milli == KGPU_QUEUE_UNSET && g.mem_mib == KGPU_QUEUE_UNSET)
        return false;
    if (g.milli != KGPU_QUEUE_UNSET && used.milli + add.milli > g.milli)
        return false;
    if (g.mem_mib != KGPU_QUEUE_UNSET && used.mem_mib + add.mem_mib > g.mem_mib)
        return false;
    return true;
}

/* The first limit on q's path (q first) that d would pass, or -1. */
static int first_over(const kgpu_queues *qs, int q, const kgpu_qdemand *d, char *why, size_t whylen)
{
    kgpu_qamount pm[KGPU_MAX_MODELS];
    uint64_t mask = parts_by_model(d, pm);
    kgpu_qamount tot = {d->milli, d->mem_mib};
    for (int a = q; a >= 0; a = qs->q[a].parent) {
        const queue *x = &qs->q[a];
        if (over(x->name, "", x->used, tot, x->l, why, whylen))
            return a;
        for (int m = 0; m < x->nmodels; m++) {
            int id = x->models[m].id;
            if (id < 0 || !((mask >> id) & 1))
                continue;
            char what[KGPU_MODEL_NAME_MAX + 2];
            snprintf(what, sizeof(what), "%s ", x->models[m].name);
            if (over(x->name, what, x->used_model[id], pm[id], x->models[m].l, why, whylen))
                return a;
        }
    }
    return -1;
}

static bool within_guarantee(const kgpu_queues *qs, int q, const kgpu_qdemand *d)
{
    const queue *x = &qs->q[q];
    if (!within(x->used, (kgpu_qamount){d->milli, d->mem_mib}, x->g))
        return false;
    kgpu_qamount pm[KGPU_MAX_MODELS];
    uint64_t mask = parts_by_model(d, pm);
    for (int m = 0; m < x->nmodels; m++) {
        int id = x->models[m].id;
        const kgpu_qamount mg = x->models[m].g;
        if (id < 0 || !((mask >> id) & 1))
            continue;
        if ((mg.milli != KGPU_QUEUE_UNSET || mg.mem_mib != KGPU_QUEUE_UNSET) &&
            !within(x->used_model[id], pm[id], mg))
            return false;
    }
    return true;
}

int kgpu_queues_check(const kgpu_queues *qs, int q, const kgpu_qdemand *d, char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
    if (q < 0 || q >= qs->n) {
        if (why)
            snprintf(why, whylen, "no such queue");
        return KGPU_QUEUE_OVER;
    }
    bool in = within_guarantee(qs, q, d);
    int a = first_over(qs, q, d, why, whylen);
    if (a < 0)
        return in ? KGPU_QUEUE_WITHIN : KGPU_QUEUE_BORROWS;
    /* Its own limit is at least its guarantee: only an ancestor can block a pod within it. */
    return in && a != q ? KGPU_QUEUE_RECLAIM : KGPU_QUEUE_OVER;
}

static void apply(kgpu_queues *qs, int q, const kgpu_qdemand *d, int sign)
{
    kgpu_qamount pm[KGPU_MAX_MODELS];
    uint64_t mask = parts_by_model(d, pm);
    for (int a = q; a >= 0; a = qs->q[a].parent) {
        queue *x = &qs->q[a];
        x->used.milli += sign * d->milli;
        x->used.mem_mib += sign * d->mem_mib;
        x->pods += sign;
        for (int m = 0; m < KGPU_MAX_MODELS; m++)
            if ((mask >> m) & 1) {
                x->used_model[m].milli += sign * pm[m].milli;
                x->used_model[m].mem_mib += sign * pm[m].mem_mib;
            }
    }
}

int kgpu_queues_charge(kgpu_queues *qs, int q, const kgpu_qdemand *d, kgpu_error *err)
{
    if (q < 0 || q >= qs->n)
        return kgpu_error_set(err, KGPU_ENOENT, "queue %d does not exist", q);
    if (d->milli < 0 || d->mem_mib < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "negative demand");
    char why[256];
    if (first_over(qs, q, d, why, sizeof(why)) >= 0)
        return kgpu_error_set(err, KGPU_ENOFIT, "%s", why);
    apply(qs, q, d, 1);
    return 0;
}

int kgpu_queues_charge_running(kgpu_queues *qs, int q, const kgpu_qdemand *d, kgpu_error *err)
{
    if (q < 0 || q >= qs->n)
        return kgpu_error_set(err, KGPU_ENOENT, "queue %d does not exist", q);
    if (d->milli < 0 || d->mem_mib < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "negative demand");
    apply(qs, q, d, 1);
    return 0;
}

int kgpu_queues_uncharge(kgpu_queues *qs, int q, const kgpu_qdemand *d, kgpu_error *err)
{
    if (q < 0 || q >= qs->n)
        return kgpu_error_set(err, KGPU_ENOENT, "queue %d does not exist", q);
    kgpu_qamount pm[KGPU_MAX_MODELS];
    uint64_t mask = parts_by_model(d, pm);
    for (int a = q; a >= 0; a = qs->q[a].parent) {
        const queue *x = &qs->q[a];
        bool bad = x->pods < 1 || x->used.milli < d->milli || x->used.mem_mib < d->mem_mib;
        for (int m = 0; m < KGPU_MAX_MODELS && !bad; m++)
            bad = ((mask >> m) & 1) && (x->used_model[m].milli < pm[m].milli ||
                                         x->used_model[m].mem_mib < pm[m].mem_mib);
        if (bad)
            return kgpu_error_set(err, KGPU_ESTATE, "queue %s: uncharging more than was charged",
                                  x->name);
    }
    apply(qs, q, d, -1);
    return 0;
}

int64_t kgpu_queues_borrowed_milli(const kgpu_queues *qs, int q)
{
    const queue *x = &qs->q[q];
    int64_t g = x->g.milli == KGPU_QUEUE_UNSET ? 0 : x->g.milli;
    return x->used.milli > g ? x->used.milli - g : 0;
}

bool kgpu_queues_below_guarantee(const kgpu_queues *qs, int q)
{
    const queue *x = &qs->q[q];
    return (x->g.milli != KGPU_QUEUE_UNSET && x->used.milli < x->g.milli) ||
           (x->g.mem_mib != KGPU_QUEUE_UNSET && x->used.mem_mib < x->g.mem_mib);
}

/* ---- Reclaim ---------------------------------------------------------------------------- */

/* Whether a is q or an ancestor of q. */
static bool on_path(const kgpu_queues *qs, int a, int q)
{
    for (; q >= 0; q = qs->q[q].parent)
        if (q == a)
            return true;
    return false;
}

/* A reclaim in progress: what has been taken from each queue so far. */
typedef struct rstate {
    const kgpu_queues *qs;
    int q;                 /* the waiting pod's queue */
    kgpu_qamount *removed; /* per queue */
} rstate;

/*
 * May pod p leave too? Every queue on its path that is not also on the
 * waiting pod's path must stay at or above its guarantee.
 */
static bool may_take(const rstate *s, const kgpu_qpod *p)
{
    const kgpu_queues *qs = s->qs;
    if (p->queue < 0 || p->queue >= qs->n || on_path(qs, p->queue, s->q) ||
        on_path(qs, s->q, p->queue))
        return false;
    for (int a = p->queue; a >= 0; a = qs->q[a].parent) {
        if (on_path(qs, a, s->q))
            break; /* a common ancestor: the waiting pod takes back what leaves */
        const queue *x = &qs->q[a];
        if (x->g.milli != KGPU_QUEUE_UNSET &&
            x->used.milli - s->removed[a].milli - p->d.milli < x->g.milli)
            return false;
        if (x->g.mem_mib != KGPU_QUEUE_UNSET &&
            x->used.mem_mib - s->removed[a].mem_mib - p->d.mem_mib < x->g.mem_mib)
            return false;
    }
    return true;
}

static void take(rstate *s, const kgpu_qpod *p, int sign)
{
    for (int a = p->queue; a >= 0; a = s->qs->q[a].parent) {
        s->removed[a].milli += sign * p->d.milli;
        s->removed[a].mem_mib += sign * p->d.mem_mib;
    }
}

/* Would the waiting pod pass every limit once these pods left? (Per-model usage: see below.) */
static bool quota_ok(const kgpu_queues *qs, kgpu_queues *scratch, const kgpu_qpod *running,
                     const size_t *v, size_t nv, int q, const kgpu_qdemand *d)
{
    memcpy(scratch->q, qs->q, (size_t)qs->n * sizeof(*qs->q));
    for (size_t i = 0; i < nv; i++)
        apply(scratch, running[v[i]].queue, &running[v[i]].d, -1);
    return first_over(scratch, q, d, NULL, 0) < 0;
}

/* Lower priority first, then newer first. */
static int cand_cmp(const kgpu_qpod *a, const kgpu_qpod *b)
{
    if (a->priority != b->priority)
        return a->priority < b->priority ? -1 : 1;
    if (a->admitted != b->admitted)
        return a->admitted > b->admitted ? -1 : 1;
    return 0;
}

static int cand_qsort(const void *x, const void *y, void *ctx)
{
    const kgpu_qpod *running = ctx;
    size_t a = *(const size_t *)x, b = *(const size_t *)y;
    int c = cand_cmp(&running[a], &running[b]);
    return c ? c : (a < b ? -1 : a > b);
}

static void sort_cands(const kgpu_qpod *running, size_t *v, size_t n)
{
    qsort_r(v, n, sizeof(*v), cand_qsort, (void *)running);
}

/* The victims' assignments on node n, for the placement search. */
static int releases_on(const kgpu_qpod *running, const size_t *v, size_t nv, int node,
                       kgpu_assignment *rel, int cap)
{
    int k = 0;
    for (size_t i = 0; i < nv && k < cap; i++)
        if (running[v[i]].a.node == node)
            rel[k++] = running[v[i]].a;
    return k;
}

#define RECLAIM_NODE_MAX 64 /* victims on one node that the placement search takes */

/* A candidate node's outcome in KGPU_RECLAIM_FRAG. */
typedef struct node_pick {
    int node;
    int max_prio;
    int64_t waste; /* freed milli on GPUs the pod does not take */
    size_t nv;
    double lost; /* Σ milli x (newest start - start): the work the victims have done */
    double frag;
    int ngpus;
    int gpus[KGPU_MAX_GPUS_PER_NODE]; /* where the search placed the pod */
} node_pick;

static bool pick_better(const node_pick *a, const node_pick *b)
{
    if (a->max_prio != b->max_prio)
        return a->max_prio < b->max_prio;
    if (a->waste != b->waste)
        return a->waste < b->waste;
    if (a->lost != b->lost)
        return a->lost < b->lost;
    if (a->nv != b->nv)
        return a->nv < b->nv;
    if (a->frag != b->frag)
        return a->frag < b->frag;
    return a->node < b->node;
}

/* Freed milli the pod would not use, and the node's fragmentation after, for victims v on node. */
static void judge(const kgpu_cluster *c, const kgpu_qpod *running, const size_t *v, size_t nv,
                  int node, const kgpu_request *req, const kgpu_workload *target, node_pick *out)
{
    kgpu_assignment rel[RECLAIM_NODE_MAX];
    int nrel = releases_on(running, v, nv, node, rel, RECLAIM_NODE_MAX);
    kgpu_placement pl;
    const kgpu_request *reqs[1] = {req};
    const kgpu_node *n = kgpu_cluster_node(c, node);
    int free_milli[KGPU_MAX_GPUS_PER_NODE];
    int freed[KGPU_MAX_GPUS_PER_NODE] = {0};
    for (int g = 0; g < n->ngpus; g++)
        free_milli[g] = n->gpus[g].free_milli;
    int64_t cpu = n->cpu_free;
    for (int i = 0; i < nrel; i++) {
        cpu += rel[i].cpu_milli;
        for (int g = 0; g < rel[i].ngpus; g++) {
            int m = rel[i].exclusive ? KGPU_MILLI : rel[i].gpu_milli;
            free_milli[rel[i].gpus[g]] += m;
            freed[rel[i].gpus[g]] += m;
        }
    }
    out->waste = 0;
    bool used[KGPU_MAX_GPUS_PER_NODE] = {false};
    out->ngpus = 0;
    if (kgpu_place_all(c, node, rel, nrel, reqs, 1, 0, 0, &pl, NULL, 0) == KGPU_PLACE_FOUND) {
        out->ngpus = req->gpu_count;
        for (int g = 0; g < req->gpu_count; g++) {
            out->gpus[g] = pl.gpus[0][g];
            used[pl.gpus[0][g]] = true;
            free_milli[pl.gpus[0][g]] -= req->exclusive ? KGPU_MILLI : req->gpu_milli;
        }
        cpu -= req->cpu_milli;
    }
    for (int g = 0; g < n->ngpus; g++)
        if (!used[g])
            out->waste += freed[g];
    out->frag = target ? kgpu_node_frag(n, target, free_milli, cpu) : 0;
}

static bool fits_after(const kgpu_cluster *c, const kgpu_qpod *running, const size_t *v, size_t nv,
                       int node, const kgpu_request *req)
{
    kgpu_assignment rel[RECLAIM_NODE_MAX];
    int nrel = releases_on(running, v, nv, node, rel, RECLAIM_NODE_MAX);
    const kgpu_request *reqs[1] = {req};
    return kgpu_fit_all(c, node, rel, nrel, reqs, 1, NULL, 0);
}

typedef struct rwork {
    rstate s;
    kgpu_queues *scratch; /* NULL when quota does not block the pod */
    size_t *cands;        /* eligible pods, lowest priority and newest first */
    size_t ncands;
    size_t *v; /* victims being built */
    size_t *best;
    size_t *node_start, *by_node; /* candidates grouped by node */
} rwork;

static void rwork_free(rwork *w)
{
    free(w->s.removed);
    kgpu_queues_free(w->scratch);
    free(w->cands);
    free(w->v);
    free(w->best);
    free(w->node_start);
    free(w->by_node);
}

/* Lowest priority, newest first, anywhere: until quota and some node let the pod in. */
static int reclaim_priority_age(const kgpu_cluster *c, const kgpu_qpod *running, int q,
                                const kgpu_request *req, const kgpu_qdemand *d, rwork *w,
                                kgpu_reclaim *out)
{
    size_t nv = 0;
    int nn = kgpu_cluster_node_count(c);
    bool quota = w->scratch == NULL;
    for (size_t i = 0; i <= w->ncands; i++) {
        if (!quota && (quota = quota_ok(w->s.qs, w->scratch, running, w->v, nv, q, d))) {
            for (int n = 0; n < nn; n++)
                if (fits_after(c, running, w->v, nv, n, req)) {
                    out->node = n;
                    goto found;
                }
        } else if (quota && nv > 0 &&
                   fits_after(c, running, w->v, nv, running[w->v[nv - 1]].a.node, req)) {
            out->node = running[w->v[nv - 1]].a.node;
            goto found;
        }
        if (i == w->ncands)
            break;
        const kgpu_qpod *p = &running[w->cands[i]];
        if (!may_take(&w->s, p))
            continue;
        take(&w->s, p, 1);
        w->v[nv++] = w->cands[i];
    }
    return KGPU_ENOFIT;
found:
    memcpy(out->victims, w->v, nv * sizeof(*w->v));
    out->nvictims = nv;
    return 0;
}

static int reclaim_frag(const kgpu_cluster *c, const kgpu_qpod *running, size_t nrunning, int q,
                        const kgpu_request *req, const kgpu_qdemand *d, const kgpu_workload *target,
                        rwork *w, kgpu_reclaim *out)
{
    int nn = kgpu_cluster_node_count(c);
    const kgpu_queues *qs = w->s.qs;
    /* Quota first, where an ancestor's limit blocks: lowest priority, newest, under it. */
    size_t nq = 0;
    if (w->scratch != NULL) {
        for (size_t i = 0; i < w->ncands; i++) {
            if (quota_ok(qs, w->scratch, running, w->v, nq, q, d))
                break;
            const kgpu_qpod *p = &running[w->cands[i]];
            if (!may_take(&w->s, p))
                continue;
            take(&w->s, p, 1);
            w->v[nq++] = w->cands[i];
        }
        if (!quota_ok(qs, w->scratch, running, w->v, nq, q, d))
            return KGPU_ENOFIT;
    }
    /* Candidates by node, in candidate order. */
    w->node_start = calloc((size_t)nn + 1, sizeof(*w->node_start));
    w->by_node = malloc((w->ncands ? w->ncands : 1) * sizeof(*w->by_node));
    if (w->node_start == NULL || w->by_node == NULL)
        return KGPU_ENOMEM;
    for (size_t i = 0; i < w->ncands; i++)
        w->node_start[running[w->cands[i]].a.node + 1]++;
    for (int n = 0; n < nn; n++)
        w->node_start[n + 1] += w->node_start[n];
    {
        size_t *fill = calloc((size_t)nn + 1, sizeof(*fill));
        if (fill == NULL)
            return KGPU_ENOMEM;
        for (size_t i = 0; i < w->ncands; i++) {
            int n = running[w->cands[i]].a.node;
            w->by_node[w->node_start[n] + fill[n]++] = w->cands[i];
        }
        free(fill);
    }
    kgpu_qamount *saved = malloc((size_t)qs->n * sizeof(*saved));
    if (saved == NULL)
        return KGPU_ENOMEM;
    memcpy(saved, w->s.removed, (size_t)qs->n * sizeof(*saved));
    const kgpu_request *reqs[1] = {req};
    node_pick best = {.node = -1};
    int64_t newest = INT64_MIN;
    for (size_t i = 0; i < nrunning; i++)
        if (running[i].admitted > newest)
            newest = running[i].admitted;
    size_t nbest = 0;
    for (int n = 0; n < nn; n++) {
        size_t lo = w->node_start[n], hi = w->node_start[n + 1];
        bool have = hi > lo;
        if (!have && !(nq > 0))
            continue; /* nothing to free here, and the pod did not fit before */
        if (!kgpu_fit_all_empty(c, n, reqs, 1))
            continue;
        memcpy(w->s.removed, saved, (size_t)qs->n * sizeof(*saved));
        size_t nv = nq;
        int max_prio = -2147483647 - 1;
        bool used[RECLAIM_NODE_MAX] = {false};
        size_t span = hi - lo < RECLAIM_NODE_MAX ? hi - lo : RECLAIM_NODE_MAX;
        /* Greedy: lowest priority first; among equals one that lets the pod fit, then larger. */
        while (!fits_after(c, running, w->v, nv, n, req)) {
            int pick = -1;
            bool pick_fits = false;
            for (size_t k = 0; k < span; k++) {
                if (used[k])
                    continue;
                const kgpu_qpod *p = &running[w->by_node[lo + k]];
                if (!may_take(&w->s, p))
                    continue;
                if (pick >= 0) {
                    const kgpu_qpod *b = &running[w->by_node[lo + (size_t)pick]];
                    if (p->priority > b->priority)
                        continue;
                    if (p->priority == b->priority && pick_fits)
                        continue;
                }
                w->v[nv] = w->by_node[lo + k];
                bool f = fits_after(c, running, w->v, nv + 1, n, req);
                if (pick >= 0) {
                    const kgpu_qpod *b = &running[w->by_node[lo + (size_t)pick]];
                    if (p->priority == b->priority && f == pick_fits &&
                        (p->d.milli < b->d.milli ||
                         (p->d.milli == b->d.milli && p->admitted <= b->admitted)))
                        continue; /* among equals: the larger, then the newer */
                    if (p->priority == b->priority && !f && pick_fits)
                        continue;
                }
                pick = (int)k;
                pick_fits = f;
            }
            if (pick < 0)
                break;
            used[pick] = true;
            const kgpu_qpod *p = &running[w->by_node[lo + (size_t)pick]];
            take(&w->s, p, 1);
            w->v[nv++] = w->by_node[lo + (size_t)pick];
        }
        if (!fits_after(c, running, w->v, nv, n, req))
            continue;
        /* Drop any node victim the pod does not need, the most important first. */
        for (;;) {
            size_t drop = nv;
            for (size_t i = nq; i < nv; i++) {
                size_t keep = w->v[i];
                w->v[i] = w->v[nv - 1];
                bool f = fits_after(c, running, w->v, nv - 1, n, req);
                w->v[i] = keep;
                if (f && (drop == nv || running[keep].priority > running[w->v[drop]].priority))
                    drop = i;
            }
            if (drop == nv)
                break;
            w->v[drop] = w->v[nv - 1];
            nv--;
        }
        node_pick np = {.node = n, .nv = nv};
        for (size_t i = 0; i < nv; i++) {
            const kgpu_qpod *p = &running[w->v[i]];
            if (p->priority > max_prio)
                max_prio = p->priority;
            np.lost += (double)p->d.milli * (double)(newest - p->admitted);
        }
        np.max_prio = max_prio; /* the lowest possible when nothing is evicted */
        judge(c, running, w->v, nv, n, req, target, &np);
        if (best.node < 0 || pick_better(&np, &best)) {
            best = np;
            memcpy(w->best, w->v, nv * sizeof(*w->v));
            nbest = nv;
        }
    }
    free(saved);
    if (best.node < 0)
        return KGPU_ENOFIT;
    memcpy(out->victims, w->best, nbest * sizeof(*w->best));
    out->nvictims = nbest;
    out->node = best.node;
    out->ngpus = best.ngpus;
    memcpy(out->gpus, best.gpus, sizeof(out->gpus));
    return 0;
}

int kgpu_queues_reclaim(const kgpu_cluster *c, const kgpu_queues *qs, const kgpu_qpod *running,
                        size_t nrunning, int q, const kgpu_request *req, kgpu_reclaim_mode mode,
                        const kgpu_workload *target, kgpu_reclaim *out, kgpu_error *err)
{
    out->nvictims = 0;
    out->node = -1;
    out->ngpus = 0;
    out->freed_milli = 0;
    if (q < 0 || q >= qs->n)
        return kgpu_error_set(err, KGPU_ENOENT, "queue %d does not exist", q);
    if (mode != KGPU_RECLAIM_PRIORITY_AGE && mode != KGPU_RECLAIM_FRAG)
        return kgpu_error_set(err, KGPU_EINVAL, "unknown reclaim mode %d", (int)mode);
    kgpu_qdemand d;
    kgpu_qdemand_of_request(req, &d);
    if (d.milli == 0 && d.mem_mib == 0)
        return kgpu_error_set(err, KGPU_ENOFIT,
                              "the pod asks for no GPU: queues reclaim GPUs only");
    int st = kgpu_queues_check(qs, q, &d, NULL, 0);
    if (st != KGPU_QUEUE_WITHIN && st != KGPU_QUEUE_RECLAIM)
        return kgpu_error_set(err, KGPU_ENOFIT,
                              "queue %s: the pod is not within its guarantee, so it reclaims "
                              "nothing",
                              qs->q[q].name);
    rwork w;
    memset(&w, 0, sizeof(w));
    w.s.qs = qs;
    w.s.q = q;
    size_t cap = nrunning ? nrunning : 1;
    w.s.removed = calloc((size_t)qs->n, sizeof(*w.s.removed));
    w.cands = malloc(cap * sizeof(*w.cands));
    w.v = malloc(cap * sizeof(*w.v));
    w.best = malloc(cap * sizeof(*w.best));
    if (st == KGPU_QUEUE_RECLAIM)
        w.scratch = kgpu_queues_clone(qs);
    int rc;
    if (w.s.removed == NULL || w.cands == NULL || w.v == NULL || w.best == NULL ||
        (st == KGPU_QUEUE_RECLAIM && w.scratch == NULL)) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nrunning; i++) {
        const kgpu_qpod *p = &running[i];
        if (p->a.node >= 0 && p->a.node < kgpu_cluster_node_count(c) && may_take(&w.s, p))
            w.cands[w.ncands++] = i;
    }
    sort_cands(running, w.cands, w.ncands);
    rc = mode == KGPU_RECLAIM_FRAG
             ? reclaim_frag(c, running, nrunning, q, req, &d, target, &w, out)
             : reclaim_priority_age(c, running, q, req, &d, &w, out);
    if (rc == KGPU_ENOFIT)
        rc = kgpu_error_set(err, KGPU_ENOFIT,
                            "queue %s: evicting the pods that borrow would not make room",
                            qs->q[q].name);
    else if (rc == KGPU_ENOMEM)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < out->nvictims; i++)
        out->freed_milli += running[out->victims[i]].d.milli;
out:
    rwork_free(&w);
    return rc;
}
