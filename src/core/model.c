/*
 * Cluster state: nodes, GPUs, the model table, the fit check with its
 * reasons, and apply/release. Everything a placement changes goes through
 * kgpu_cluster_apply and is undone exactly by kgpu_cluster_release; each
 * change bumps the node's version so policies can cache per-node results
 * safely. The work on one node is node.c's; the placement search, place.c's.
 */
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

struct kgpu_cluster {
    kgpu_node *nodes;
    int nnodes, cap;
    char *models[KGPU_MAX_MODELS];
    int nmodels;
    int *index; /* open addressing on node names: node index or -1 */
    size_t index_cap;
    int gpus;
    int64_t allocated_milli;
    /*
     * The change journal: the index of the node each apply, release or health
     * change touched, change number k (1-based) at ring[k % KGPU__JOURNAL],
     * so that a policy that last looked at change `seq` can update what it
     * keeps for those nodes alone (kgpu__cluster_changed). Allocated at the
     * first change; without it, every lookup says "unknown" and callers redo
     * everything, as they would after an overrun.
     */
    uint64_t seq;
    int *ring;
};

static void journal(kgpu_cluster *c, int node)
{
    c->seq++;
    if (c->ring == NULL)
        c->ring = malloc(KGPU__JOURNAL * sizeof(*c->ring));
    if (c->ring != NULL)
        c->ring[c->seq % KGPU__JOURNAL] = node;
}

uint64_t kgpu__cluster_seq(const kgpu_cluster *c)
{
    return c->seq;
}

int kgpu__cluster_changed(const kgpu_cluster *c, uint64_t k)
{
    if (c->ring == NULL || k == 0 || k > c->seq || c->seq - k >= KGPU__JOURNAL)
        return -1;
    return c->ring[k % KGPU__JOURNAL];
}

/* FNV-1a: node names are short; this only needs to spread them. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static int index_rebuild(kgpu_cluster *c, size_t cap)
{
    int *idx = malloc(cap * sizeof(*idx));
    if (idx == NULL)
        return KGPU_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        idx[i] = -1;
    for (int i = 0; i < c->nnodes; i++) {
        size_t h = name_hash(c->nodes[i].name) & (cap - 1);
        while (idx[h] >= 0)
            h = (h + 1) & (cap - 1);
        idx[h] = i;
    }
    free(c->index);
    c->index = idx;
    c->index_cap = cap;
    return 0;
}

kgpu_cluster *kgpu_cluster_new(void)
{
    kgpu_cluster *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    if (index_rebuild(c, 64) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

static void node_free(kgpu_node *n)
{
    free(n->name);
    for (int i = 0; i < n->nlabels; i++) {
        free(n->labels[i].key);
        free(n->labels[i].value);
    }
    free(n->labels);
    free(n->gpus);
}

void kgpu_cluster_free(kgpu_cluster *c)
{
    if (c == NULL)
        return;
    for (int i = 0; i < c->nnodes; i++)
        node_free(&c->nodes[i]);
    free(c->nodes);
    for (int i = 0; i < c->nmodels; i++)
        free(c->models[i]);
    free(c->index);
    free(c->ring);
    free(c);
}

/* Deep-copies src into dst (dst uninitialised). On failure dst holds nothing to free. */
static int node_copy(kgpu_node *dst, const kgpu_node *src)
{
    *dst = *src;
    dst->name = NULL;
    dst->labels = NULL;
    dst->gpus = NULL;
    dst->nlabels = 0;
    if ((dst->name = strdup(src->name)) == NULL)
        goto fail;
    if (src->ngpus > 0) {
        dst->gpus = malloc((size_t)src->ngpus * sizeof(*dst->gpus));
        if (dst->gpus == NULL)
            goto fail;
        memcpy(dst->gpus, src->gpus, (size_t)src->ngpus * sizeof(*dst->gpus));
    }
    if (src->nlabels > 0) {
        dst->labels = calloc((size_t)src->nlabels, sizeof(*dst->labels));
        if (dst->labels == NULL)
            goto fail;
        for (int i = 0; i < src->nlabels; i++) {
            dst->nlabels = i + 1;
            dst->labels[i].key = strdup(src->labels[i].key);
            dst->labels[i].value = strdup(src->labels[i].value);
            if (dst->labels[i].key == NULL || dst->labels[i].value == NULL)
                goto fail;
        }
    }
    return 0;
fail:
    node_free(dst);
    return KGPU_ENOMEM;
}

kgpu_cluster *kgpu_cluster_clone(const kgpu_cluster *src)
{
    kgpu_cluster *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->gpus = src->gpus;
    c->allocated_milli = src->allocated_milli;
    for (int i = 0; i < src->nmodels; i++) {
        if (src->models[i] != NULL && (c->models[i] = strdup(src->models[i])) == NULL)
            goto fail;
        c->nmodels = i + 1;
    }
    if (src->nnodes > 0) {
        c->nodes = malloc((size_t)src->nnodes * sizeof(*c->nodes));
        if (c->nodes == NULL)
            goto fail;
        c->cap = src->nnodes;
        for (int i = 0; i < src->nnodes; i++) {
            if (node_copy(&c->nodes[i], &src->nodes[i]) != 0)
                goto fail;
            c->nnodes = i + 1;
        }
    }
    if (index_rebuild(c, src->index_cap) != 0)
        goto fail;
    return c;
fail:
    kgpu_cluster_free(c);
    return NULL;
}

/*
 * The model table may have holes: ids below nmodels whose name is NULL. A
 * caller rebuilding a cluster keeps each surviving model's id
 * (kgpu_cluster_model_put) and leaves the ids of models gone as holes, since
 * ids are bits of masks that outlive one cluster (a learned shape's allowed
 * models). A new model takes the lowest hole, else the next id.
 */
int kgpu_cluster_model_id(kgpu_cluster *c, const char *name, bool add)
{
    int hole = -1;
    for (int i = 0; i < c->nmodels; i++) {
        if (c->models[i] == NULL) {
            if (hole < 0)
                hole = i;
        } else if (strcmp(c->models[i], name) == 0) {
            return i;
        }
    }
    if (!add)
        return -1;
    int id = hole >= 0 ? hole : c->nmodels;
    if (id >= KGPU_MAX_MODELS || (c->models[id] = strdup(name)) == NULL)
        return -1;
    if (id == c->nmodels)
        c->nmodels++;
    return id;
}

int kgpu_cluster_model_put(kgpu_cluster *c, int id, const char *name)
{
    if (id < 0 || id >= KGPU_MAX_MODELS || name == NULL || name[0] == '\0' ||
        strlen(name) >= KGPU_MODEL_NAME_MAX)
        return KGPU_EINVAL;
    if (id < c->nmodels && c->models[id] != NULL)
        return strcmp(c->models[id], name) == 0 ? 0 : KGPU_EEXIST;
    if (kgpu_cluster_model_id(c, name, false) >= 0)
        return KGPU_EEXIST; /* the name has another id */
    if ((c->models[id] = strdup(name)) == NULL)
        return KGPU_ENOMEM;
    if (id >= c->nmodels)
        c->nmodels = id + 1;
    return 0;
}

/* Names in the table (holes not counted). */
static int models_named(const kgpu_cluster *c)
{
    int n = 0;
    for (int i = 0; i < c->nmodels; i++)
        n += c->models[i] != NULL;
    return n;
}

uint64_t kgpu_cluster_models_present(const kgpu_cluster *c)
{
    uint64_t mask = 0;
    for (int i = 0; i < c->nnodes; i++)
        mask |= c->nodes[i].model_mask;
    return mask;
}

const char *kgpu_cluster_model_name(const kgpu_cluster *c, int id)
{
    if (id < 0 || id >= c->nmodels || c->models[id] == NULL)
        return "?";
    return c->models[id];
}

int kgpu_cluster_model_count(const kgpu_cluster *c)
{
    return c->nmodels;
}

int kgpu_cluster_find_node(const kgpu_cluster *c, const char *name)
{
    size_t h = name_hash(name) & (c->index_cap - 1);
    while (c->index[h] >= 0) {
        if (strcmp(c->nodes[c->index[h]].name, name) == 0)
            return c->index[h];
        h = (h + 1) & (c->index_cap - 1);
    }
    return -1;
}

static int spec_check(const kgpu_node_spec *spec, kgpu_error *err)
{
    if (spec->name == NULL || spec->name[0] == '\0')
        return kgpu_error_set(err, KGPU_EINVAL, "node without a name");
    if (strlen(spec->name) > KGPU_NAME_MAX)
        return kgpu_error_set(err, KGPU_EINVAL, "node name longer than %d characters",
                              KGPU_NAME_MAX);
    if (spec->cpu_milli < 0 || spec->memory_mib < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "node %s: negative CPU or memory", spec->name);
    if (spec->ngpus < 0 || spec->ngpus > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "node %s: %d GPUs (at most %d per node)",
                              spec->name, spec->ngpus, KGPU_MAX_GPUS_PER_NODE);
    for (int i = 0; i < spec->ngpus; i++) {
        const kgpu_gpu_spec *g = &spec->gpus[i];
        if (g->model == NULL || g->model[0] == '\0')
            return kgpu_error_set(err, KGPU_EINVAL, "node %s: GPU %d has no model", spec->name,
                                  g->index);
        if (strlen(g->model) >= KGPU_MODEL_NAME_MAX)
            return kgpu_error_set(err, KGPU_EINVAL, "node %s: GPU %d model name too long",
                                  spec->name, g->index);
        if (g->uuid != NULL && strlen(g->uuid) >= KGPU_UUID_MAX)
            return kgpu_error_set(err, KGPU_EINVAL, "node %s: GPU %d uuid too long", spec->name,
                                  g->index);
        if (g->memory_mib < 0)
            return kgpu_error_set(err, KGPU_EINVAL, "node %s: GPU %d has negative memory",
                                  spec->name, g->index);
        for (int j = 0; j < i; j++)
            if (spec->gpus[j].index == g->index)
                return kgpu_error_set(err, KGPU_EEXIST, "node %s: GPU index %d listed twice",
                                      spec->name, g->index);
    }
    return 0;
}

int kgpu_cluster_add_node(kgpu_cluster *c, const kgpu_node_spec *spec, kgpu_error *err)
{
    int rc = spec_check(spec, err);
    if (rc != 0)
        return rc;
    if (kgpu_cluster_find_node(c, spec->name) >= 0)
        return kgpu_error_set(err, KGPU_EEXIST, "node %s already exists", spec->name);
    /* A node whose models would overflow the table is refused before it adds any of them. */
    const char *fresh[KGPU_MAX_GPUS_PER_NODE];
    int nfresh = 0;
    for (int i = 0; i < spec->ngpus; i++) {
        bool known = kgpu_cluster_model_id(c, spec->gpus[i].model, false) >= 0;
        for (int k = 0; k < nfresh && !known; k++)
            known = strcmp(fresh[k], spec->gpus[i].model) == 0;
        if (!known)
            fresh[nfresh++] = spec->gpus[i].model;
    }
    if (models_named(c) + nfresh > KGPU_MAX_MODELS)
        return kgpu_error_set(err, KGPU_ERANGE,
                              "node %s: more than %d distinct GPU models in the cluster",
                              spec->name, KGPU_MAX_MODELS);
    int models[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < spec->ngpus; i++) {
        models[i] = kgpu_cluster_model_id(c, spec->gpus[i].model, true);
        if (models[i] < 0)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory adding node %s", spec->name);
    }
    if (c->nnodes == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        kgpu_node *nodes = realloc(c->nodes, (size_t)cap * sizeof(*nodes));
        if (nodes == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory adding node %s", spec->name);
        c->nodes = nodes;
        c->cap = cap;
    }
    kgpu_node n;
    memset(&n, 0, sizeof(n));
    n.cpu_milli = n.cpu_free = spec->cpu_milli;
    n.memory_mib = n.memory_free = spec->memory_mib;
    n.ngpus = spec->ngpus;
    n.name = strdup(spec->name);
    if (n.name == NULL)
        goto oom;
    if (spec->ngpus > 0) {
        n.gpus = calloc((size_t)spec->ngpus, sizeof(*n.gpus));
        if (n.gpus == NULL)
            goto oom;
    }
    for (int i = 0; i < spec->ngpus; i++) {
        const kgpu_gpu_spec *g = &spec->gpus[i];
        kgpu_gpu *d = &n.gpus[i];
        d->index = g->index;
        if (g->uuid != NULL)
            snprintf(d->uuid, sizeof(d->uuid), "%s", g->uuid);
        d->model = models[i];
        d->numa = g->numa;
        d->healthy = g->healthy;
        d->memory_mib = d->free_memory_mib = g->memory_mib;
        d->free_milli = KGPU_MILLI;
        n.model_mask |= 1ULL << models[i];
    }
    if (spec->nlabels > 0) {
        n.labels = calloc((size_t)spec->nlabels, sizeof(*n.labels));
        if (n.labels == NULL)
            goto oom;
        for (int i = 0; i < spec->nlabels; i++) {
            n.nlabels = i + 1;
            n.labels[i].key = strdup(spec->labels[i].key ? spec->labels[i].key : "");
            n.labels[i].value = strdup(spec->labels[i].value ? spec->labels[i].value : "");
            if (n.labels[i].key == NULL || n.labels[i].value == NULL)
                goto oom;
        }
    }
    c->nodes[c->nnodes] = n;
    c->nnodes++;
    c->gpus += spec->ngpus;
    /* Keep the name index under half full. */
    if ((size_t)c->nnodes * 2 > c->index_cap) {
        if (index_rebuild(c, c->index_cap * 2) != 0) {
            c->nnodes--;
            c->gpus -= spec->ngpus;
            node_free(&c->nodes[c->nnodes]);
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory adding node %s", spec->name);
        }
    } else {
        size_t h = name_hash(n.name) & (c->index_cap - 1);
        while (c->index[h] >= 0)
            h = (h + 1) & (c->index_cap - 1);
        c->index[h] = c->nnodes - 1;
    }
    return c->nnodes - 1;
oom:
    node_free(&n);
    return kgpu_error_set(err, KGPU_ENOMEM, "out of memory adding node %s", spec->name);
}

int kgpu_cluster_node_count(const kgpu_cluster *c)
{
    return c->nnodes;
}

const kgpu_node *kgpu_cluster_node(const kgpu_cluster *c, int i)
{
    if (i < 0 || i >= c->nnodes)
        return NULL;
    return &c->nodes[i];
}

kgpu_node *kgpu__cluster_node_mut(kgpu_cluster *c, int i)
{
    return &c->nodes[i];
}

int kgpu_cluster_gpu_count(const kgpu_cluster *c)
{
    return c->gpus;
}

int64_t kgpu_cluster_gpu_milli_allocated(const kgpu_cluster *c)
{
    return c->allocated_milli;
}

static bool glob_any(const char *const *globs, int n, const char *model)
{
    for (int i = 0; i < n; i++)
        if (globs[i] != NULL && fnmatch(globs[i], model, 0) == 0)
            return true;
    return false;
}

int kgpu_request_compile(const kgpu_cluster *c, kgpu_request *req, kgpu_error *err)
{
    int rc = kgpu_request_validate(req, err);
    if (rc != 0)
        return rc;
    /* No allow list means any model, including models that appear later. */
    uint64_t mask = req->nallow > 0 ? 0 : ~0ULL;
    for (int i = 0; i < c->nmodels; i++) {
        if (c->models[i] == NULL)
            continue; /* a hole: as for an id no model has had yet */
        if (req->nallow > 0 && glob_any(req->allow, req->nallow, c->models[i]))
            mask |= 1ULL << i;
        if (req->nexclude > 0 && glob_any(req->exclude, req->nexclude, c->models[i]))
            mask &= ~(1ULL << i);
    }
    req->models = mask;
    return 0;
}

int kgpu_request_validate(const kgpu_request *req, kgpu_error *err)
{
    if (req->cpu_milli < 0 || req->memory_mib < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "negative CPU or memory request");
    if (req->gpu_count < 0 || req->gpu_count > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "GPU count %d out of range 0..%d", req->gpu_count,
                              KGPU_MAX_GPUS_PER_NODE);
    if (req->gpu_count == 0)
        return 0;
    if (req->gpu_milli < 0 || req->gpu_milli > KGPU_MILLI)
        return kgpu_error_set(err, KGPU_ERANGE, "GPU share %d milli out of range 0..1000",
                              req->gpu_milli);
    if (req->gpu_memory_mib < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "negative GPU memory request");
    if (req->exclusive && (req->gpu_milli != KGPU_MILLI || req->gpu_memory_mib != 0))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "a whole-GPU request takes 1000 milli and no memory share");
    if (!req->exclusive && req->gpu_milli == 0 && req->gpu_memory_mib == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "a GPU share asks for neither compute nor memory");
    return 0;
}

/* Appends the model names of `mask` present in the cluster to buf. */
static void models_text(const kgpu_cluster *c, uint64_t mask, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->nmodels && off < len; i++) {
        if (((mask >> i) & 1) && c->models[i] != NULL) {
            int w = snprintf(buf + off, len - off, "%s%s", off ? "," : "", c->models[i]);
            if (w < 0)
                break;
            off += (size_t)w;
        }
    }
    if (off == 0)
        snprintf(buf, len, "none");
}

/* Writes why the GPU part of req cannot be served by n's allowed, healthy GPUs. */
static void gpu_reason(const kgpu_node *n, const kgpu_request *req, char *why, size_t len)
{
    int allowed = 0, healthy = 0, untouched = 0, enough_milli = 0, enough_mem = 0;
    int best_milli = -1;
    int64_t best_mem = -1, largest = 0;
    for (int i = 0; i < n->ngpus; i++) {
        const kgpu_gpu *g = &n->gpus[i];
        if (!((req->models >> g->model) & 1))
            continue;
        allowed++;
        if (g->memory_mib > largest)
            largest = g->memory_mib;
        if (!g->healthy)
            continue;
        healthy++;
        untouched += g->placements == 0 && g->free_milli == KGPU_MILLI &&
                     g->free_memory_mib == g->memory_mib;
        enough_milli += g->free_milli >= req->gpu_milli;
        enough_mem += g->free_memory_mib >= req->gpu_memory_mib;
        if (g->free_milli > best_milli)
            best_milli = g->free_milli;
        if (g->free_memory_mib > best_mem)
            best_mem = g->free_memory_mib;
    }
    const char *each = req->gpu_count > 1 ? " each" : "";
    if (allowed < req->gpu_count) {
        snprintf(why, len, "needs %d GPU%s of an allowed model, node has %d", req->gpu_count,
                 req->gpu_count == 1 ? "" : "s", allowed);
    } else if (req->gpu_memory_mib > largest) {
        snprintf(why, len,
                 "asks %" PRId64 " MiB of GPU memory%s, largest GPU here has %" PRId64 " MiB",
                 req->gpu_memory_mib, each, largest);
    } else if (healthy < req->gpu_count) {
        snprintf(why, len, "needs %d GPU%s, only %d of %d are healthy", req->gpu_count,
                 req->gpu_count == 1 ? "" : "s", healthy, allowed);
    } else if (req->exclusive) {
        snprintf(why, len, "needs %d whole GPU%s, %d %s fully free", req->gpu_count,
                 req->gpu_count > 1 ? "s" : "", untouched, untouched == 1 ? "is" : "are");
    } else if (enough_milli < req->gpu_count) {
        if (req->gpu_count == 1)
            snprintf(why, len, "no single GPU has %d milli free; best has %d", req->gpu_milli,
                     best_milli);
        else
            snprintf(why, len, "needs %d GPUs with %d milli free each, %d have it", req->gpu_count,
                     req->gpu_milli, enough_milli);
    } else if (enough_mem < req->gpu_count) {
        if (req->gpu_count == 1)
            snprintf(why, len, "no single GPU has %" PRId64 " MiB memory free; best has %" PRId64,
                     req->gpu_memory_mib, best_mem);
        else
            snprintf(why, len, "needs %d GPUs with %" PRId64 " MiB memory free each, %d have it",
                     req->gpu_count, req->gpu_memory_mib, enough_mem);
    } else {
        snprintf(why, len,
                 "needs %d GPUs with %d milli and %" PRId64 " MiB free each; none has both",
                 req->gpu_count, req->gpu_milli, req->gpu_memory_mib);
    }
}

void kgpu__fit_reason(const kgpu_cluster *c, const kgpu_node *n, const kgpu_request *req,
                      char *why, size_t whylen)
{
    char models[256], want[256];
    if (req->gpu_count > n->ngpus) {
        snprintf(why, whylen, "needs %d GPU%s, node has %d", req->gpu_count,
                 req->gpu_count == 1 ? "" : "s", n->ngpus);
    } else if (req->gpu_count > 0 && !(n->model_mask & req->models)) {
        models_text(c, n->model_mask, models, sizeof(models));
        if (req->nallow > 0) { /* the pod's own words: its globs may match no model at all */
            size_t off = 0;
            want[0] = '\0';
            for (int i = 0; i < req->nallow && off < sizeof(want); i++) {
                int w = snprintf(want + off, sizeof(want) - off, "%s%s", i ? "," : "",
                                 req->allow[i] ? req->allow[i] : "");
                if (w < 0)
                    break;
                off += (size_t)w;
            }
        } else {
            models_text(c, req->models, want, sizeof(want));
        }
        snprintf(why, whylen, "GPU model %s not allowed (the pod allows: %s%s)", models, want,
                 req->nexclude > 0 ? ", with exclusions" : "");
    } else if (n->cpu_free < req->cpu_milli) {
        snprintf(why, whylen,
                 "insufficient CPU: requests %" PRId64 "m, %" PRId64 "m free of %" PRId64 "m",
                 req->cpu_milli, n->cpu_free, n->cpu_milli);
    } else if (n->memory_free < req->memory_mib) {
        snprintf(why, whylen,
                 "insufficient memory: requests %" PRId64 " MiB, %" PRId64 " MiB free of %" PRId64
                 " MiB",
                 req->memory_mib, n->memory_free, n->memory_mib);
    } else {
        gpu_reason(n, req, why, whylen);
    }
}

bool kgpu_fit(const kgpu_cluster *c, int node, const kgpu_request *req, char *why, size_t whylen)
{
    if (node < 0 || node >= c->nnodes) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "no node with index %d", node);
        return false;
    }
    const kgpu_node *n = &c->nodes[node];
    if (kgpu__fit(n, req))
        return true;
    if (why != NULL && whylen > 0)
        kgpu__fit_reason(c, n, req, why, whylen);
    return false;
}

int kgpu_cluster_apply(kgpu_cluster *c, const kgpu_request *req, int node, const int *gpus,
                       kgpu_assignment *out, kgpu_error *err)
{
    if (node < 0 || node >= c->nnodes)
        return kgpu_error_set(err, KGPU_EINVAL, "no node with index %d", node);
    kgpu_node *n = &c->nodes[node];
    char why[256];
    if (!kgpu_fit(c, node, req, why, sizeof(why)))
        return kgpu_error_set(err, KGPU_ENOFIT, "node %s: %s", n->name, why);
    int rc = kgpu__node_check_gpus(n, req, gpus, err);
    if (rc != 0)
        return rc;
    kgpu_assignment a;
    kgpu__node_take(n, node, req, gpus, &a);
    journal(c, node);
    c->allocated_milli += (int64_t)a.ngpus * a.gpu_milli;
    if (out != NULL)
        *out = a;
    return 0;
}

int kgpu_cluster_release(kgpu_cluster *c, const kgpu_assignment *a, kgpu_error *err)
{
    if (a->node < 0 || a->node >= c->nnodes)
        return kgpu_error_set(err, KGPU_EINVAL, "no node with index %d", a->node);
    kgpu_node *n = &c->nodes[a->node];
    int rc = kgpu__node_check_release(n, a, err);
    if (rc != 0)
        return rc;
    kgpu__node_give(n, a);
    journal(c, a->node);
    c->allocated_milli -= (int64_t)a->ngpus * a->gpu_milli;
    return 0;
}

int kgpu_cluster_set_gpu_health(kgpu_cluster *c, int node, int gpu, bool healthy, kgpu_error *err)
{
    if (node < 0 || node >= c->nnodes)
        return kgpu_error_set(err, KGPU_EINVAL, "no node with index %d", node);
    kgpu_node *n = &c->nodes[node];
    if (gpu < 0 || gpu >= n->ngpus)
        return kgpu_error_set(err, KGPU_EINVAL, "node %s has no GPU at position %d", n->name, gpu);
    n->gpus[gpu].healthy = healthy;
    n->version++;
    journal(c, node);
    return 0;
}
