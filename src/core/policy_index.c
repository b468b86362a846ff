/*
 * The index behind kgpu_policy_select over a whole cluster: a decision whose
 * cost does not grow with the cluster the way a scan of every node does.
 *
 * A node's fit and score for a request change only when the node changes,
 * or when the policy changes its mind about every node at once (a new
 * target workload: an epoch). So per request key (every field fit and score
 * read) the index keeps each node's score, "base" (the score plus the
 * offset of the node's group, see kgpu_policy_ops.group), and for each
 * block of IX_BLOCK nodes the best of them. A decision brings the key up to
 * date from the cluster's change journal (one score per node changed since
 * the key was last asked, one block summary per block touched) and then
 * reads the block summaries: about nodes / IX_BLOCK steps. Scoring every
 * node (a key's first decision, the first after an epoch) scores one node
 * of each class of nodes in the same state, classes kept from the journal
 * too: early in a run, when a learner rebuilds its target most often,
 * most nodes are still alike.
 *
 * Exactness: the answer is the one the scan in policy.c gives, because it is
 * made from the same scores (those of nodes unchanged since are unchanged by
 * the policy's contract) compared the same way:
 * - a fixed tie order (the study's): the highest score, then the lowest
 *   rank, then the lowest index, which is order-free, so nodes are grouped
 *   by their policy group and each group's offset applies to all of it;
 * - random ties: the scan's reservoir draws one number per tie met while a
 *   score is the best so far, so the blocks are walked in index order: a
 *   block below the best so far is skipped, a block whose best equals it
 *   draws its count of numbers (and only then is looked into, for the node
 *   drawn), a block above it is walked node by node as the scan would.
 *   This needs one offset for every group (no offsets, or all equal, as for
 *   kgpu until a pod constrained to some models arrives); otherwise, and for
 *   scores the scan treats specially (INT64_MIN), the caller scans.
 * The index's memory is bounded (IX_BUDGET): past it the keys least recently
 * asked about are dropped and rebuilt when asked again (one scan's worth).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define IX_BLOCK  64          /* nodes per block summary */
#define IX_BUDGET (512 << 20) /* bytes of scores and summaries over all keys */
#define IX_UNFIT  INT64_MIN   /* a stored base of a node that does not fit */

typedef struct ix_room {
    int64_t cpu, mem;  /* free CPU and memory */
    int64_t gpu_mem;   /* the most free memory of a healthy GPU */
    int gpu_milli;     /* the most free compute of a healthy GPU */
    int healthy;       /* healthy GPUs */
    int untouched;     /* healthy GPUs nothing holds (whole GPUs take only those) */
    uint64_t models;   /* GPU models present */
} ix_room;

typedef struct ix_block {
    int64_t best; /* highest base of a fitting node (count > 0) */
    uint32_t rank; /* fixed order: the least rank among those */
    int node;      /* fixed order: that node (the lowest index among equal ranks) */
    int count;     /* fitting nodes whose base is best; 0: none fits */
} ix_block;

/* A request as far as fit and score can tell. */
typedef struct ix_key {
    int64_t cpu, mem, gpu_mem;
    uint64_t models;
    int gpu_count, gpu_milli, shape;
    bool exclusive;
} ix_key;

typedef struct ix_entry {
    ix_key key;
    bool used;       /* the hash slot holds a key */
    bool degenerate; /* a fitting node's base is not representable: scan */
    uint64_t epoch;  /* kgpu__index.epoch the scores were taken in */
    uint64_t seq;    /* the cluster change they are current up to */
    uint64_t last;   /* decision count when last asked: eviction order */
    int64_t *base;   /* per position of the layout; NULL: not held */
    ix_block *blocks;
} ix_entry;

struct kgpu__index {
    const kgpu_cluster *c; /* the cluster the layout is of */
    int nodes;             /* its node count then */
    bool fixed;            /* fixed tie order (layout by group) or random (index order) */
    const uint32_t *rank;
    int nrank;
    uint64_t epoch;
    uint64_t tick;
    /* The layout: positions of nodes, blocks of consecutive positions of one group. */
    int *order, *pos, *blk; /* position -> node, node -> position, node -> block */
    int *gid;               /* node -> group */
    int *groups, ngl;       /* the groups >= 0 some node is in */
    int nblocks;
    int *bstart, *bgroup; /* per block: first position (bstart[nblocks] = the end), group */
    int *vol, nvol;       /* nodes of group -1, scored afresh (fixed order only) */
    uint32_t *mark;       /* per block: the refresh that last recomputed it */
    uint32_t *nmark;      /* per node: the refresh that last rescored it */
    uint32_t marks;
    int *dirty;
    /*
     * Classes of nodes in the same state (same_state), kept up to date from
     * the journal: a full rescoring scores one node of each class. Per node:
     * its class and its neighbours in the class's member list; per class
     * (ids 0..nodes-1, a free list of unused ones): its state hash, one
     * member, the first member (-1: unused) and the base the last full
     * rescoring gave it; an open-addressing table on the hash (-1 empty,
     * -2 gone). Per position: the class of the node there.
     */
    int *cls, *cnext, *cprev, *cpos;
    int chi; /* class ids below this may be in use (ids come from the free list) */
    uint64_t *chash;
    int *crep, *chead, *cfree, nfree;
    int64_t *cval;
    int *ctab;
    size_t ctab_cap, ctab_used; /* used: live and gone slots */
    uint64_t cseq;              /* the cluster change the classes are current to */
    uint32_t *cmark, cmarks;    /* per node: the class update that last moved it */
    int *moved;                 /* the nodes it moves */
    /*
     * What a node has free, at most, for the fit check (per node and, the
     * largest of its nodes', per block): a block none of whose nodes can
     * have room for a request is not looked into when rescoring every node.
     */
    ix_room *room, *broom;
    ix_room *croom; /* per class: its nodes' room, in class order for the full rescoring */
    ix_entry *tab; /* open addressing on the key */
    size_t cap, used;
    size_t bytes; /* held by entries' scores and summaries */
};

kgpu__index *kgpu__index_new(void)
{
    return calloc(1, sizeof(kgpu__index));
}

static void drop_layout(kgpu__index *ix)
{
    for (size_t i = 0; i < ix->cap; i++) {
        free(ix->tab[i].base);
        free(ix->tab[i].blocks);
    }
    free(ix->tab);
    free(ix->order);
    free(ix->gid);
    free(ix->groups);
    free(ix->pos);
    free(ix->blk);
    free(ix->bstart);
    free(ix->bgroup);
    free(ix->vol);
    free(ix->mark);
    free(ix->nmark);
    free(ix->dirty);
    free(ix->cls);
    free(ix->cpos);
    free(ix->cnext);
    free(ix->cprev);
    free(ix->chash);
    free(ix->crep);
    free(ix->chead);
    free(ix->cfree);
    free(ix->cval);
    free(ix->ctab);
    free(ix->cmark);
    free(ix->moved);
    free(ix->room);
    free(ix->croom);
    free(ix->broom);
    uint64_t epoch = ix->epoch, tick = ix->tick;
    memset(ix, 0, sizeof(*ix));
    ix->epoch = epoch;
    ix->tick = tick;
}

void kgpu__index_free(kgpu__index *ix)
{
    if (ix == NULL)
        return;
    drop_layout(ix);
    free(ix);
}

void kgpu__index_reset(kgpu__index *ix)
{
    if (ix != NULL)
        drop_layout(ix);
}

void kgpu__index_bump(kgpu__index *ix)
{
    if (ix != NULL)
        ix->epoch++;
}

static int node_group(const kgpu_policy_ops *ops, void *state, const kgpu_node *n)
{
    return ops->group != NULL ? ops->group(state, n) : 0;
}

static int cmp_pair(const void *x, const void *y)
{
    const int *a = x, *b = y;
    if (a[0] != b[0])
        return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

static void classes_all(kgpu__index *ix);
static void summarise(const kgpu__index *ix, ix_entry *e, int b);

/* Lays the cluster's nodes out in blocks: by group for a fixed order, in index order otherwise. */
static int build_layout(kgpu__index *ix, const kgpu_policy_ops *ops, void *state,
                        const kgpu_cluster *c, const uint32_t *rank, int nrank)
{
    drop_layout(ix);
    int nn = kgpu_cluster_node_count(c);
    size_t n1 = (size_t)(nn > 0 ? nn : 1);
    ix->c = c;
    ix->nodes = nn;
    ix->fixed = rank != NULL;
    ix->rank = rank;
    ix->nrank = nrank;
    ix->order = malloc(n1 * sizeof(int));
    ix->pos = malloc(n1 * sizeof(int));
    ix->blk = malloc(n1 * sizeof(int));
    ix->gid = malloc(n1 * sizeof(int));
    ix->groups = malloc(n1 * sizeof(int));
    ix->vol = malloc(n1 * sizeof(int));
    int *keyed = malloc(n1 * 2 * sizeof(int)); /* (group, node) pairs, sorted */
    /* At most one partial block per group beyond nn / IX_BLOCK: bounded by the node count. */
    ix->bstart = malloc((n1 + 1) * sizeof(int));
    ix->bgroup = malloc(n1 * sizeof(int));
    if (ix->order == NULL || ix->pos == NULL || ix->blk == NULL || ix->vol == NULL ||
        ix->gid == NULL || ix->groups == NULL ||
        keyed == NULL || ix->bstart == NULL || ix->bgroup == NULL) {
        free(keyed);
        drop_layout(ix);
        return KGPU_ENOMEM;
    }
    int m = 0;
    for (int i = 0; i < nn; i++) {
        int g = node_group(ops, state, kgpu_cluster_node(c, i));
        ix->gid[i] = g;
        bool seen = g < 0;
        for (int k = 0; k < ix->ngl && !seen; k++)
            seen = ix->groups[k] == g;
        if (!seen)
            ix->groups[ix->ngl++] = g;
        if (g < 0) {
            ix->vol[ix->nvol++] = i;
            ix->pos[i] = -1;
            ix->blk[i] = -1;
            continue;
        }
        keyed[2 * m] = ix->fixed ? g : 0;
        keyed[2 * m + 1] = i;
        m++;
    }
    if (ix->fixed) /* by group, then node index */
        qsort(keyed, (size_t)m, 2 * sizeof(int), cmp_pair);
    int nb = 0;
    for (int k = 0; k < m; k++) {
        int g = keyed[2 * k], i = keyed[2 * k + 1];
        if (k == 0 || g != keyed[2 * (k - 1)] || k - ix->bstart[nb - 1] == IX_BLOCK) {
            ix->bstart[nb] = k;
            ix->bgroup[nb] = g;
            nb++;
        }
        ix->order[k] = i;
        ix->pos[i] = k;
        ix->blk[i] = nb - 1;
    }
    ix->bstart[nb] = m;
    ix->nblocks = nb;
    free(keyed);
    ix->mark = calloc((size_t)(nb > 0 ? nb : 1), sizeof(*ix->mark));
    ix->nmark = calloc(n1, sizeof(*ix->nmark));
    ix->dirty = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(*ix->dirty));
    ix->cap = 64;
    ix->tab = calloc(ix->cap, sizeof(*ix->tab));
    ix->ctab_cap = 64;
    while (ix->ctab_cap < 4 * n1)
        ix->ctab_cap *= 2;
    ix->cls = malloc(n1 * sizeof(int));
    ix->cpos = malloc(n1 * sizeof(int));
    ix->cnext = malloc(n1 * sizeof(int));
    ix->cprev = malloc(n1 * sizeof(int));
    ix->chash = malloc(n1 * sizeof(uint64_t));
    ix->crep = malloc(n1 * sizeof(int));
    ix->chead = malloc(n1 * sizeof(int));
    ix->cfree = malloc(n1 * sizeof(int));
    ix->cval = malloc(n1 * sizeof(int64_t));
    ix->ctab = malloc(ix->ctab_cap * sizeof(int));
    ix->cmark = calloc(n1, sizeof(uint32_t));
    ix->moved = malloc(n1 * sizeof(int));
    ix->room = malloc(n1 * sizeof(*ix->room));
    ix->croom = malloc(n1 * sizeof(*ix->croom));
    ix->broom = malloc(n1 * sizeof(*ix->broom));
    if (ix->mark == NULL || ix->nmark == NULL || ix->dirty == NULL || ix->tab == NULL ||
        ix->cls == NULL || ix->cpos == NULL || ix->cnext == NULL || ix->cprev == NULL ||
        ix->chash == NULL || ix->crep == NULL || ix->chead == NULL || ix->cfree == NULL ||
        ix->cval == NULL || ix->ctab == NULL || ix->cmark == NULL || ix->moved == NULL ||
        ix->room == NULL || ix->croom == NULL || ix->broom == NULL) {
        drop_layout(ix);
        return KGPU_ENOMEM;
    }
    classes_all(ix);
    return 0;
}

static ix_key key_of(const kgpu_request *req)
{
    return (ix_key){.cpu = req->cpu_milli,
                    .mem = req->memory_mib,
                    .gpu_mem = req->gpu_memory_mib,
                    .models = req->models,
                    .gpu_count = req->gpu_count,
                    .gpu_milli = req->gpu_milli,
                    .shape = req->shape,
                    .exclusive = req->exclusive};
}

static bool key_eq(const ix_key *a, const ix_key *b)
{
    return a->cpu == b->cpu && a->mem == b->mem && a->gpu_mem == b->gpu_mem &&
           a->models == b->models && a->gpu_count == b->gpu_count &&
           a->gpu_milli == b->gpu_milli && a->shape == b->shape && a->exclusive == b->exclusive;
}

static uint64_t key_hash(const ix_key *k)
{
    uint64_t v[] = {(uint64_t)k->cpu,
                    (uint64_t)k->mem,
                    (uint64_t)k->gpu_mem,
                    k->models,
                    (uint64_t)(uint32_t)k->gpu_count << 32 | (uint32_t)k->gpu_milli,
                    (uint64_t)(uint32_t)k->shape << 1 | k->exclusive};
    uint64_t h = 0x243F6A8885A308D3ULL;
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        h ^= v[i] + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
        h *= 0xFF51AFD7ED558CCDULL;
    }
    return h ^ (h >> 32);
}

/* The slot of key k: its own, or the empty one where it belongs. */
static ix_entry *find(ix_entry *tab, size_t cap, const ix_key *k)
{
    size_t i = (size_t)key_hash(k) & (cap - 1);
    while (tab[i].used && !key_eq(&tab[i].key, k))
        i = (i + 1) & (cap - 1);
    return &tab[i];
}

static ix_entry *lookup(kgpu__index *ix, const ix_key *k)
{
    if (2 * (ix->used + 1) > ix->cap) {
        size_t cap = ix->cap * 2;
        ix_entry *tab = calloc(cap, sizeof(*tab));
        if (tab == NULL)
            return NULL;
        for (size_t i = 0; i < ix->cap; i++)
            if (ix->tab[i].used)
                *find(tab, cap, &ix->tab[i].key) = ix->tab[i];
        free(ix->tab);
        ix->tab = tab;
        ix->cap = cap;
    }
    ix_entry *e = find(ix->tab, ix->cap, k);
    if (!e->used) {
        memset(e, 0, sizeof(*e));
        e->key = *k;
        e->used = true;
        ix->used++;
    }
    return e;
}

static size_t entry_bytes(const kgpu__index *ix)
{
    return (size_t)ix->nodes * sizeof(int64_t) + (size_t)ix->nblocks * sizeof(ix_block);
}

static void release_entry(kgpu__index *ix, ix_entry *e)
{
    if (e->base == NULL)
        return;
    free(e->base);
    free(e->blocks);
    e->base = NULL;
    e->blocks = NULL;
    ix->bytes -= entry_bytes(ix);
}

/* Room for e's scores: within the budget, dropping the keys least recently asked about. */
static int hold(kgpu__index *ix, ix_entry *e)
{
    size_t need = entry_bytes(ix);
    while (ix->bytes + need > IX_BUDGET && ix->bytes > 0) {
        ix_entry *old = NULL;
        for (size_t i = 0; i < ix->cap; i++) {
            ix_entry *t = &ix->tab[i];
            if (t->used && t->base != NULL && t != e && (old == NULL || t->last < old->last))
                old = t;
        }
        if (old == NULL)
            break;
        release_entry(ix, old);
    }
    e->base = malloc((size_t)(ix->nodes > 0 ? ix->nodes : 1) * sizeof(*e->base));
    e->blocks = malloc((size_t)(ix->nblocks > 0 ? ix->nblocks : 1) * sizeof(*e->blocks));
    if (e->base == NULL || e->blocks == NULL) {
        free(e->base);
        free(e->blocks);
        e->base = NULL;
        e->blocks = NULL;
        return KGPU_ENOMEM;
    }
    ix->bytes += need;
    return 0;
}

static uint32_t rank_of(const kgpu__index *ix, int i)
{
    return i < ix->nrank ? ix->rank[i] : UINT32_MAX;
}

static bool room_may_fit(const ix_room *r, const kgpu_request *f);

/*
 * Node i's base for req, the room test passed (IX_UNFIT: it does not fit);
 * a base not representable marks e.
 */
static int64_t score_roomy(kgpu__index *ix, ix_entry *e, const kgpu_policy_ops *ops, void *state,
                           const kgpu_request *req, const kgpu_request *fit, int i)
{
    int64_t base = IX_UNFIT;
    if (kgpu__fit(kgpu_cluster_node(ix->c, i), fit)) {
        int64_t s = ops->score(state, ix->c, i, req);
        int64_t off = ops->group_offset != NULL ? ops->group_offset(state, ix->gid[i], req) : 0;
        if (__builtin_add_overflow(s, off, &base) || base == IX_UNFIT)
            e->degenerate = true;
    }
    return base;
}

/* Node i's base for req, into its position of e. */
static void score_node(kgpu__index *ix, ix_entry *e, const kgpu_policy_ops *ops, void *state,
                       const kgpu_request *req, const kgpu_request *fit, int i)
{
    e->base[ix->pos[i]] = room_may_fit(&ix->room[i], fit)
                              ? score_roomy(ix, e, ops, state, req, fit, i)
                              : IX_UNFIT;
}

/*
 * Everything of a node a policy may read to score it: all but its name,
 * labels, version and the names of its GPUs (kgpu_policy_ops.score).
 */
static bool same_state(const kgpu_node *a, const kgpu_node *b)
{
    if (a->cpu_milli != b->cpu_milli || a->memory_mib != b->memory_mib ||
        a->cpu_free != b->cpu_free || a->memory_free != b->memory_free || a->ngpus != b->ngpus ||
        a->model_mask != b->model_mask || a->placements != b->placements ||
        memcmp(a->class_count, b->class_count, sizeof(a->class_count)) != 0)
        return false;
    for (int g = 0; g < a->ngpus; g++) {
        const kgpu_gpu *x = &a->gpus[g], *y = &b->gpus[g];
        if (x->model != y->model || x->numa != y->numa || x->healthy != y->healthy ||
            x->memory_mib != y->memory_mib || x->free_milli != y->free_milli ||
            x->free_memory_mib != y->free_memory_mib || x->placements != y->placements)
            return false;
    }
    return true;
}

static uint64_t state_hash(const kgpu_node *n)
{
    uint64_t h = (uint64_t)n->cpu_free * 0x9E3779B97F4A7C15ULL ^ (uint64_t)n->memory_free;
    h = (h ^ (h >> 29)) * 0xBF58476D1CE4E5B9ULL ^ (uint64_t)n->cpu_milli ^ n->model_mask;
    for (int g = 0; g < n->ngpus; g++) {
        const kgpu_gpu *x = &n->gpus[g];
        h ^= (uint64_t)x->free_milli << 40 ^ (uint64_t)x->free_memory_mib ^
             (uint64_t)x->placements << 56;
        h = (h ^ (h >> 31)) * 0x94D049BB133111EBULL;
    }
    return h ^ (h >> 32);
}

static void room_of(kgpu__index *ix, int i)
{
    const kgpu_node *n = kgpu_cluster_node(ix->c, i);
    ix_room r = {.cpu = n->cpu_free, .mem = n->memory_free, .models = n->model_mask};
    for (int g = 0; g < n->ngpus; g++) {
        const kgpu_gpu *x = &n->gpus[g];
        if (!x->healthy)
            continue;
        r.healthy++;
        r.untouched += x->placements == 0 && x->free_milli == KGPU_MILLI &&
                       x->free_memory_mib == x->memory_mib;
        r.gpu_milli = x->free_milli > r.gpu_milli ? x->free_milli : r.gpu_milli;
        r.gpu_mem = x->free_memory_mib > r.gpu_mem ? x->free_memory_mib : r.gpu_mem;
    }
    ix->room[i] = r;
}

#define IX_MAX(f) b.f = r->f > b.f ? r->f : b.f
static void block_room(kgpu__index *ix, int blk)
{
    ix_room b = {.cpu = INT64_MIN, .mem = INT64_MIN};
    for (int k = ix->bstart[blk]; k < ix->bstart[blk + 1]; k++) {
        const ix_room *r = &ix->room[ix->order[k]];
        IX_MAX(cpu);
        IX_MAX(mem);
        IX_MAX(gpu_mem);
        IX_MAX(gpu_milli);
        IX_MAX(healthy);
        IX_MAX(untouched);
        b.models |= r->models;
    }
    ix->broom[blk] = b;
}
#undef IX_MAX

/*
 * False when nothing with room r can fit f: kgpu__fit's conditions against
 * what r has free at most (of a node, or the most of a block's nodes).
 */
static bool room_may_fit(const ix_room *r, const kgpu_request *f)
{
    if (f->cpu_milli > r->cpu || f->memory_mib > r->mem)
        return false;
    if (f->gpu_count <= 0)
        return true;
    if (!(f->models & r->models) || f->gpu_count > r->healthy)
        return false;
    if (f->exclusive)
        return f->gpu_count <= r->untouched;
    return f->gpu_milli <= r->gpu_milli && f->gpu_memory_mib <= r->gpu_mem;
}

/* Node i joins the class of its state, making one when there is none; room[i] is current. */
static void class_join(kgpu__index *ix, int i)
{
    const kgpu_node *n = kgpu_cluster_node(ix->c, i);
    uint64_t h = state_hash(n);
    size_t mask = ix->ctab_cap - 1, slot = (size_t)h & mask, hole = SIZE_MAX;
    int c = -1;
    for (; ix->ctab[slot] != -1; slot = (slot + 1) & mask) {
        int t = ix->ctab[slot];
        if (t == -2) {
            hole = hole == SIZE_MAX ? slot : hole;
        } else if (ix->chash[t] == h && same_state(kgpu_cluster_node(ix->c, ix->crep[t]), n)) {
            c = t;
            break;
        }
    }
    if (c < 0) { /* there are never more classes than nodes: the free list has one */
        c = ix->cfree[--ix->nfree];
        ix->chash[c] = h;
        ix->crep[c] = i;
        ix->chead[c] = -1;
        ix->croom[c] = ix->room[i];
        ix->chi = c >= ix->chi ? c + 1 : ix->chi;
        if (hole == SIZE_MAX)
            ix->ctab_used++;
        ix->ctab[hole != SIZE_MAX ? hole : slot] = c;
    }
    ix->cls[i] = c;
    if (ix->pos[i] >= 0)
        ix->cpos[ix->pos[i]] = c;
    ix->cprev[i] = -1;
    ix->cnext[i] = ix->chead[c];
    if (ix->chead[c] >= 0)
        ix->cprev[ix->chead[c]] = i;
    ix->chead[c] = i;
}

/* Node i leaves its class; a class left empty is gone. */
static void class_leave(kgpu__index *ix, int i)
{
    int c = ix->cls[i];
    if (ix->cprev[i] >= 0)
        ix->cnext[ix->cprev[i]] = ix->cnext[i];
    else
        ix->chead[c] = ix->cnext[i];
    if (ix->cnext[i] >= 0)
        ix->cprev[ix->cnext[i]] = ix->cprev[i];
    if (ix->chead[c] >= 0) {
        ix->crep[c] = ix->chead[c];
        return;
    }
    size_t mask = ix->ctab_cap - 1, slot = (size_t)ix->chash[c] & mask;
    while (ix->ctab[slot] != c)
        slot = (slot + 1) & mask;
    ix->ctab[slot] = -2;
    ix->cfree[ix->nfree++] = c;
}

/* Every node's class afresh. */
static void classes_all(kgpu__index *ix)
{
    for (size_t k = 0; k < ix->ctab_cap; k++)
        ix->ctab[k] = -1;
    ix->ctab_used = 0;
    ix->nfree = 0;
    ix->chi = 0;
    for (int c = ix->nodes - 1; c >= 0; c--) {
        ix->cfree[ix->nfree++] = c;
        ix->chead[c] = -1;
    }
    for (int i = 0; i < ix->nodes; i++) {
        room_of(ix, i);
        class_join(ix, i);
    }
    for (int b = 0; b < ix->nblocks; b++)
        block_room(ix, b);
    ix->cseq = kgpu__cluster_seq(ix->c);
}

/* The classes brought up to date with the cluster's changes. */
static void classes_update(kgpu__index *ix)
{
    uint64_t now = kgpu__cluster_seq(ix->c);
    if (ix->cseq == now)
        return;
    if (ix->cseq > now || now - ix->cseq > (uint64_t)ix->nodes ||
        ix->ctab_used > ix->ctab_cap / 2) {
        classes_all(ix); /* cheaper, or the table is full of gone slots */
        return;
    }
    if (++ix->cmarks == 0) {
        memset(ix->cmark, 0, (size_t)ix->nodes * sizeof(*ix->cmark));
        ix->cmarks = 1;
    }
    /*
     * All the changed nodes leave first: a class's member compared with
     * must be in the class's state, which a changed node no longer is.
     */
    int nmoved = 0;
    for (uint64_t k = ix->cseq + 1; k <= now; k++) {
        int i = kgpu__cluster_changed(ix->c, k);
        if (i < 0 || i >= ix->nodes) {
            classes_all(ix);
            return;
        }
        if (ix->cmark[i] != ix->cmarks) {
            ix->cmark[i] = ix->cmarks;
            class_leave(ix, i);
            ix->moved[nmoved++] = i;
        }
    }
    for (int k = 0; k < nmoved; k++) {
        int i = ix->moved[k];
        room_of(ix, i);
        class_join(ix, i);
        if (ix->blk[i] >= 0)
            block_room(ix, ix->blk[i]); /* a block changed twice is recounted twice: cheap */
    }
    ix->cseq = now;
}

/*
 * Every node's base afresh: one node of each class scored (most nodes are
 * alike early on), then each block filled from its nodes' classes and
 * summarised while it is in cache. A block none of whose nodes can have room
 * is not looked into: nothing in it fits, and no class of its nodes can
 * pass the room test either, so none is scored on its account.
 */
static void rescore_all(kgpu__index *ix, ix_entry *e, const kgpu_policy_ops *ops, void *state,
                        const kgpu_request *req, const kgpu_request *fit)
{
    for (int c = 0; c < ix->chi; c++) {
        int i = ix->chead[c];
        if (i < 0)
            continue; /* no such class */
        if (!room_may_fit(&ix->croom[c], fit))
            ix->cval[c] = IX_UNFIT;
        else if (ix->pos[i] >= 0) /* not of the nodes scored afresh (a class is of one group) */
            ix->cval[c] = score_roomy(ix, e, ops, state, req, fit, i);
    }
    for (int b = 0; b < ix->nblocks; b++) {
        int k = ix->bstart[b], end = ix->bstart[b + 1];
        if (!room_may_fit(&ix->broom[b], fit)) {
            for (; k < end; k++)
                e->base[k] = IX_UNFIT;
            e->blocks[b] = (ix_block){.count = 0, .node = -1, .rank = UINT32_MAX};
            continue;
        }
        for (; k < end; k++)
            e->base[k] = ix->cval[ix->cpos[k]];
        summarise(ix, e, b);
    }
}

static void summarise(const kgpu__index *ix, ix_entry *e, int b)
{
    /* The best first, without branches (IX_UNFIT is below every base), then its ties. */
    int start = ix->bstart[b], end = ix->bstart[b + 1];
    const int64_t *base = e->base;
    int64_t best = IX_UNFIT;
    for (int k = start; k < end; k++)
        best = base[k] > best ? base[k] : best;
    ix_block sum = {.count = 0, .node = -1, .rank = UINT32_MAX};
    if (best != IX_UNFIT) {
        sum.best = best;
        for (int k = start; k < end; k++) {
            if (base[k] != best)
                continue;
            int i = ix->order[k];
            uint32_t r = ix->fixed ? rank_of(ix, i) : 0;
            sum.count++;
            if (sum.node < 0 || r < sum.rank) { /* positions ascend by index in a block */
                sum.rank = r;
                sum.node = i;
            }
        }
    }
    e->blocks[b] = sum;
}

/*
 * Block b's summary after node i's base went from `was` to what e holds,
 * where that needs no look at the rest of the block; false when it does
 * (the node was among the block's best).
 */
static bool update_block(const kgpu__index *ix, ix_entry *e, int b, int i, int64_t was)
{
    ix_block *s = &e->blocks[b];
    int64_t v = e->base[ix->pos[i]];
    if (s->count > 0 && was != IX_UNFIT && was == s->best) {
        if (v != IX_UNFIT && v >= s->best) {
            if (v > s->best) /* it alone is the best now */
                *s = (ix_block){.best = v, .rank = ix->fixed ? rank_of(ix, i) : 0, .node = i,
                                .count = 1};
            return true; /* still among the best, with its rank */
        }
        if (s->count > 1 && s->node != i) {
            s->count--; /* the best others, the first of them, are unchanged */
            return true;
        }
        return false; /* the block's best must be found again */
    }
    if (v == IX_UNFIT || (s->count > 0 && v < s->best))
        return true; /* neither was nor is among the best */
    uint32_t r = ix->fixed ? rank_of(ix, i) : 0;
    if (s->count == 0 || v > s->best) {
        *s = (ix_block){.best = v, .rank = r, .node = i, .count = 1};
    } else {
        s->count++;
        if (r < s->rank || (r == s->rank && i < s->node)) {
            s->rank = r;
            s->node = i;
        }
    }
    return true;
}

/* Brings e up to date with the cluster and the policy; 0 or KGPU_ENOMEM. */
static int refresh(kgpu__index *ix, ix_entry *e, const kgpu_policy_ops *ops, void *state,
                   const kgpu_request *req, const kgpu_request *fit)
{
    uint64_t now = kgpu__cluster_seq(ix->c);
    bool all = e->base == NULL || e->epoch != ix->epoch || e->seq > now ||
               now - e->seq > (uint64_t)ix->nodes;
    int ndirty = 0;
    if (!all) {
        if (++ix->marks == 0) { /* wrapped: no block may look marked by this refresh */
            memset(ix->mark, 0, (size_t)ix->nblocks * sizeof(*ix->mark));
            memset(ix->nmark, 0, (size_t)ix->nodes * sizeof(*ix->nmark));
            ix->marks = 1;
        }
        for (uint64_t k = e->seq + 1; k <= now && !all; k++) {
            int i = kgpu__cluster_changed(ix->c, k);
            if (i < 0 || i >= ix->nodes) {
                all = true;
            } else if (ix->pos[i] >= 0 && ix->nmark[i] != ix->marks) {
                ix->nmark[i] = ix->marks; /* a node changed twice is scored once */
                int64_t was = e->base[ix->pos[i]];
                score_node(ix, e, ops, state, req, fit, i);
                int b = ix->blk[i];
                if (ix->mark[b] != ix->marks && !update_block(ix, e, b, i, was)) {
                    ix->mark[b] = ix->marks;
                    ix->dirty[ndirty++] = b;
                }
            }
        }
    }
    if (all) {
        if (e->base == NULL && hold(ix, e) != 0)
            return KGPU_ENOMEM;
        e->degenerate = false;
        rescore_all(ix, e, ops, state, req, fit);
    } else {
        for (int d = 0; d < ndirty; d++)
            summarise(ix, e, ix->dirty[d]);
    }
    e->epoch = ix->epoch;
    e->seq = now;
    return 0;
}

/* The fixed tie order: highest value, then least rank, then least index. */
static bool beats(int64_t v, uint32_t r, int i, int64_t bv, uint32_t br, int bi)
{
    return bi < 0 || v > bv || (v == bv && (r < br || (r == br && i < bi)));
}

static int select_fixed(const kgpu__index *ix, const ix_entry *e, const kgpu_policy_ops *ops,
                        void *state, const kgpu_request *req, const kgpu_request *fit,
                        int *node_out)
{
    int64_t bv = 0, o = 0;
    uint32_t br = UINT32_MAX;
    int bi = -1, last_group = -1;
    for (int b = 0; b < ix->nblocks; b++) {
        const ix_block *s = &e->blocks[b];
        if (s->count == 0)
            continue;
        int g = ix->bgroup[b];
        if (g != last_group) { /* blocks come by group: one offset per group */
            last_group = g;
            o = ops->group_offset != NULL ? ops->group_offset(state, g, req) : 0;
        }
        int64_t v = s->best - o;
        if (beats(v, s->rank, s->node, bv, br, bi)) {
            bv = v;
            br = s->rank;
            bi = s->node;
        }
    }
    for (int k = 0; k < ix->nvol; k++) {
        int i = ix->vol[k];
        if (!kgpu__fit(kgpu_cluster_node(ix->c, i), fit))
            continue;
        int64_t v = ops->score(state, ix->c, i, req);
        uint32_t r = rank_of(ix, i);
        if (beats(v, r, i, bv, br, bi)) {
            bv = v;
            br = r;
            bi = i;
        }
    }
    if (bi < 0)
        return KGPU_ENOFIT;
    *node_out = bi;
    return 0;
}

/*
 * Random ties, as the scan draws them (see the file comment). 1 when this
 * cannot be answered exactly here: before any number was drawn.
 */
static int select_random(const kgpu__index *ix, const ix_entry *e, const kgpu_policy_ops *ops,
                         void *state, const kgpu_request *req, kgpu_rng *rng, int *node_out)
{
    if (ix->nvol > 0)
        return 1;
    int64_t o = 0;
    if (ops->group_offset != NULL)
        for (int k = 0; k < ix->ngl; k++) {
            int64_t ok = ops->group_offset(state, ix->groups[k], req);
            if (k > 0 && ok != o)
                return 1; /* values would not be base minus one offset */
            o = ok;
        }
    int64_t best = 0;
    int chosen = -1;
    uint64_t ties = 0;
    for (int b = 0; b < ix->nblocks; b++) {
        const ix_block *s = &e->blocks[b];
        if (s->count == 0)
            continue;
        int64_t m = s->best - o;
        if (chosen >= 0 && m < best)
            continue;
        if (chosen >= 0 && m == best) {
            int hit = 0;
            for (int t = 1; t <= s->count; t++)
                if (kgpu_rng_below(rng, ++ties) == 0)
                    hit = t;
            for (int k = ix->bstart[b]; hit > 0; k++)
                if (e->base[k] != IX_UNFIT && e->base[k] - o == best && --hit == 0)
                    chosen = ix->order[k];
            continue;
        }
        for (int k = ix->bstart[b]; k < ix->bstart[b + 1]; k++) {
            if (e->base[k] == IX_UNFIT)
                continue;
            int64_t v = e->base[k] - o;
            if (chosen < 0 && v == INT64_MIN)
                return 1; /* the scan's first such node draws nothing: leave it to the scan */
            if (chosen < 0 || v > best) {
                best = v;
                chosen = ix->order[k];
                ties = 1;
            } else if (v == best && kgpu_rng_below(rng, ++ties) == 0) {
                chosen = ix->order[k];
            }
        }
    }
    if (chosen < 0)
        return KGPU_ENOFIT;
    *node_out = chosen;
    return 0;
}

int kgpu__index_select(kgpu__index *ix, const kgpu_policy_ops *ops, void *state,
                       const kgpu_cluster *c, const kgpu_request *req, const kgpu_request *fit,
                       const uint32_t *rank, int nrank, kgpu_rng *rng, int *node_out)
{
    if (ix->c != c || ix->nodes != kgpu_cluster_node_count(c) || ix->fixed != (rank != NULL) ||
        ix->rank != rank || ix->nrank != nrank || ix->tab == NULL) {
        if (build_layout(ix, ops, state, c, rank, nrank) != 0)
            return 1;
    }
    ix->tick++;
    classes_update(ix);
    ix_key k = key_of(req);
    ix_entry *e = lookup(ix, &k);
    if (e == NULL || refresh(ix, e, ops, state, req, fit) != 0)
        return 1;
    e->last = ix->tick;
    if (e->degenerate)
        return 1;
    if (ix->fixed)
        return select_fixed(ix, e, ops, state, req, fit, node_out);
    return select_random(ix, e, ops, state, req, rng, node_out);
}
