/*
 * The cluster model of the scheduling core: nodes, their GPUs, what a pod
 * asks for, whether it fits (and in words, why not), and applying or
 * releasing a placement. Pure computation: no I/O, no clock, no globals.
 *
 * Thread safety: a kgpu_cluster is owned by one thread at a time; distinct
 * clusters may be used from different threads concurrently.
 */
#ifndef KGPU_MODEL_H
#define KGPU_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_MILLI             1000 /* one whole GPU's compute, in milli-GPU */
#define KGPU_MAX_GPUS_PER_NODE 32
#define KGPU_MAX_MODELS        64 /* distinct GPU model names per cluster (bitmask width) */
#define KGPU_NAME_MAX          254
#define KGPU_UUID_MAX          80
#define KGPU_MODEL_NAME_MAX    64
/* Pod classes counted per node: 0 CPU-only, 1 GPU share, 1+k for k whole GPUs. */
#define KGPU_CLASS_CPU   0
#define KGPU_CLASS_SHARE 1
#define KGPU_CLASS_MAX   (2 + KGPU_MAX_GPUS_PER_NODE)

typedef struct kgpu_gpu {
    int index;                /* device index on its node */
    char uuid[KGPU_UUID_MAX]; /* may be empty (trace nodes have none) */
    int model;                /* id in the cluster's model table */
    int numa;                 /* NUMA node, -1 when unknown */
    bool healthy;
    int64_t memory_mib;      /* capacity */
    int free_milli;          /* compute left, 0..1000 */
    int64_t free_memory_mib; /* memory left */
    int placements;          /* pods currently holding a share of this GPU */
} kgpu_gpu;

typedef struct kgpu_label {
    char *key;
    char *value;
} kgpu_label;

/* A node as the core sees it. Read-only for callers: change it through the cluster API. */
typedef struct kgpu_node {
    char *name;
    int64_t cpu_milli, memory_mib; /* allocatable */
    int64_t cpu_free, memory_free;
    kgpu_label *labels;
    int nlabels;
    int ngpus;
    kgpu_gpu *gpus;
    uint64_t model_mask; /* models present on this node */
    uint64_t version;    /* bumped on every apply/release: a cache key for policies */
    int placements;      /* pods placed here */
    int class_count[KGPU_CLASS_MAX];
} kgpu_node;

/* What a caller passes to describe a GPU or a node when building a cluster. Borrowed. */
typedef struct kgpu_gpu_spec {
    int index;
    const char *uuid;  /* NULL or "" when unknown */
    const char *model; /* required */
    int64_t memory_mib;
    int numa; /* -1 when unknown */
    bool healthy;
} kgpu_gpu_spec;

typedef struct kgpu_node_spec {
    const char *name;
    int64_t cpu_milli, memory_mib;
    const kgpu_label *labels;
    int nlabels;
    const kgpu_gpu_spec *gpus;
    int ngpus;
} kgpu_node_spec;

/*
 * A pod's demand. GPU demand is `gpu_count` GPUs with `gpu_milli` compute and
 * `gpu_memory_mib` memory on each: whole GPUs set `exclusive` (gpu_milli is
 * then 1000 and the GPUs must be untouched); a share sets gpu_milli < 1000
 * and/or gpu_memory_mib and may spread over gpu_count GPUs of one node.
 * Model globs (fnmatch) are borrowed; call kgpu_request_compile before use.
 */
typedef struct kgpu_request {
    int64_t cpu_milli, memory_mib;
    int gpu_count;
    int gpu_milli;
    int64_t gpu_memory_mib;
    bool exclusive;
    const char *const *allow; /* allowed model globs; none = any */
    int nallow;
    const char *const *exclude; /* excluded model globs */
    int nexclude;
    int shape;       /* caller's id of this request's shape for policy caches, -1 = none */
    uint64_t models; /* filled by kgpu_request_compile: allowed model ids */
} kgpu_request;

/* A placement: which node and which GPUs, and what was taken, so release restores it exactly. */
typedef struct kgpu_assignment {
    int node;
    int ngpus;
    int gpus[KGPU_MAX_GPUS_PER_NODE];
    int gpu_milli;
    int64_t gpu_memory_mib;
    bool exclusive;
    int64_t cpu_milli, memory_mib;
    int klass;
} kgpu_assignment;

typedef struct kgpu_cluster kgpu_cluster;

/* Returns a new empty cluster, or NULL when out of memory. Free with kgpu_cluster_free. */
kgpu_cluster *kgpu_cluster_new(void);
void kgpu_cluster_free(kgpu_cluster *c);

/* Deep copy (state included); NULL when out of memory. */
kgpu_cluster *kgpu_cluster_clone(const kgpu_cluster *c);

/* Adds a node; returns its index (>= 0) or a negative error. Names must be unique. */
int kgpu_cluster_add_node(kgpu_cluster *c, const kgpu_node_spec *spec, kgpu_error *err);

int kgpu_cluster_node_count(const kgpu_cluster *c);
/* Borrowed pointer, valid until the next add_node or free. */
const kgpu_node *kgpu_cluster_node(const kgpu_cluster *c, int i);
/* Index of the node with that name, or -1. */
int kgpu_cluster_find_node(const kgpu_cluster *c, const char *name);

/*
 * Model table: id of `name` (adding it when `add`: the lowest free id), or -1
 * (absent, or table full). Ids are bits of model masks (kgpu_request.models,
 * kgpu_shape.models), which may outlive the cluster they were compiled for.
 */
int kgpu_cluster_model_id(kgpu_cluster *c, const char *name, bool add);
/*
 * Gives `name` the id `id`, which must be free (or already be name's): for
 * a caller rebuilding a cluster that keeps the ids of the models that
 * remain, so that masks compiled before stay true. Ids left free below the
 * highest are holes: kgpu_cluster_model_name says "?" for them, no request
 * compiles to them, and the next new model takes the lowest.
 * Returns 0, KGPU_EEXIST (id taken by another name, or name has another id),
 * KGPU_EINVAL or KGPU_ENOMEM.
 */
int kgpu_cluster_model_put(kgpu_cluster *c, int id, const char *name);
/* "?" for an id no model has. */
const char *kgpu_cluster_model_name(const kgpu_cluster *c, int id);
/* One past the highest id in use (holes below it included). */
int kgpu_cluster_model_count(const kgpu_cluster *c);
/* The ids of the models some node's GPU has. */
uint64_t kgpu_cluster_models_present(const kgpu_cluster *c);

/* Totals over healthy and unhealthy GPUs alike. */
int kgpu_cluster_gpu_count(const kgpu_cluster *c);
int64_t kgpu_cluster_gpu_milli_allocated(const kgpu_cluster *c);

/* Resolves the request's model globs against the cluster's models into req->models. */
int kgpu_request_compile(const kgpu_cluster *c, kgpu_request *req, kgpu_error *err);

/* Checks a request's own consistency (ranges, whole vs share). */
int kgpu_request_validate(const kgpu_request *req, kgpu_error *err);

/* Class of a request for per-node counts: KGPU_CLASS_CPU, _SHARE or 1 + whole GPUs. */
int kgpu_request_class(const kgpu_request *req);

/* Whether GPU g of node n can hold one of the request's per-GPU parts right now. */
bool kgpu_gpu_usable(const kgpu_node *n, const kgpu_gpu *g, const kgpu_request *req);

/*
 * Does the request fit node i? When it does not and `why` is given, writes a
 * reason an operator can act on, e.g. "no single GPU has 810 milli free; best has 500".
 */
bool kgpu_fit(const kgpu_cluster *c, int node, const kgpu_request *req, char *why, size_t whylen);

/*
 * The placement search: where do all of `reqs` (the GPU containers of one
 * pod) go on node i together? One search serves every question about a
 * multi-container pod: filter (does it fit?), bind (where, exactly?),
 * preemption (would undoing these placements make room?) and "could it ever
 * fit here?". It is complete: when some assignment of the node's GPUs to the
 * requests exists, it finds one (within its budget, below).
 *
 * First greedy placement in the caller's order (each request on the tightest
 * GPUs that suffice, as placing containers one at a time always did): where
 * it finds room, that is the answer, on the same GPUs. Where it does not, an
 * exact search: requests hardest first, GPUs (and requests) in the same
 * state tried once, dead ends cut by capacity bounds, at most `budget` steps
 * (KGPU_PLACE_BUDGET when budget <= 0; a step is one set of GPUs considered
 * for one request). Past the budget it stops: KGPU_PLACE_UNKNOWN, out->cut
 * set, and the reason says so. Model.c tells how the search works.
 */
#define KGPU_PLACE_MAX_REQS 16    /* requests in one search (GPU containers of one pod) */
#define KGPU_PLACE_BUDGET   20000 /* default search steps; see kgpu_place_all */

/* kgpu_place_all's answers. */
enum {
    KGPU_PLACE_NONE = 0,    /* proven: no placement exists */
    KGPU_PLACE_FOUND = 1,   /* a placement, in out->gpus */
    KGPU_PLACE_UNKNOWN = 2, /* the budget ran out before either was found */
};

/* kgpu_place_all's flags. */
#define KGPU_PLACE_EMPTY 1u /* search node i as if every GPU were free and healthy */

/* A placement found by kgpu_place_all, and what finding it cost. Caller-owned. */
typedef struct kgpu_placement {
    /* GPU positions on the node of each request, in the caller's order (gpu_count of each). */
    int gpus[KGPU_PLACE_MAX_REQS][KGPU_MAX_GPUS_PER_NODE];
    long steps; /* search steps taken (0: greedy placement found room) */
    bool cut;   /* the budget ran out before the search ended */
} kgpu_placement;

/*
 * Searches node i for room for all of `reqs` (nreqs <= KGPU_PLACE_MAX_REQS)
 * together, after the placements in `release` (all on that node) were undone,
 * or on the node as if empty (flags KGPU_PLACE_EMPTY; release is then
 * ignored). Pure: the cluster is not changed; deterministic. `out` may be
 * NULL. Returns KGPU_PLACE_FOUND, _NONE or _UNKNOWN; on the latter two `why`
 * (may be NULL) says why, e.g. "container 2 of 3: needs 1 whole GPU, 0 are
 * fully free", naming the first request greedy placement in the caller's
 * order cannot place, and that the search was cut when it was.
 */
int kgpu_place_all(const kgpu_cluster *c, int node, const kgpu_assignment *release, int nrelease,
                   const kgpu_request *const *reqs, int nreqs, long budget, unsigned flags,
                   kgpu_placement *out, char *why, size_t whylen);

/*
 * Would all of `reqs` fit node i together, after the placements in `release`
 * were undone? kgpu_place_all found a placement; one request and nothing to
 * release is kgpu_fit, unchanged.
 */
bool kgpu_fit_all(const kgpu_cluster *c, int node, const kgpu_assignment *release, int nrelease,
                  const kgpu_request *const *reqs, int nreqs, char *why, size_t whylen);

/*
 * Could these ever fit node i, with every GPU free and healthy? False only
 * when the search proved they cannot (a cut search is no proof: true).
 */
bool kgpu_fit_all_empty(const kgpu_cluster *c, int node, const kgpu_request *const *reqs,
                        int nreqs);

/*
 * Applies a placement of `req` on node `node` using the GPUs listed in `gpus`
 * (exactly req->gpu_count entries; ignored when the request has no GPU part).
 * Validates everything first: on error nothing changed. Fills *out for release.
 */
int kgpu_cluster_apply(kgpu_cluster *c, const kgpu_request *req, int node, const int *gpus,
                       kgpu_assignment *out, kgpu_error *err);

/* Undoes an apply exactly. Fails (and changes nothing) if it would exceed capacity. */
int kgpu_cluster_release(kgpu_cluster *c, const kgpu_assignment *a, kgpu_error *err);

/* Marks a GPU healthy or not (bumps the node version). */
int kgpu_cluster_set_gpu_health(kgpu_cluster *c, int node, int gpu, bool healthy, kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
