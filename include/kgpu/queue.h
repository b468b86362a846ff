/*
 * GPU queues: a tree of teams, each with a guaranteed share of the cluster's
 * GPU compute and memory, a limit it may never pass, and a weight for
 * dividing what nobody is guaranteed. Pods above their queue's guarantee
 * borrow idle capacity; when a queue below its guarantee has a pod that does
 * not fit, borrowing pods are reclaimed, chosen so that the GPUs they free
 * let that pod fit with the least left over (docs/queues.md).
 *
 * Pure computation like the rest of the core: no I/O, no clock, no globals.
 * A kgpu_queues is owned by one thread at a time.
 */
#ifndef KGPU_QUEUE_H
#define KGPU_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"
#include "kgpu/model.h"
#include "kgpu/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_QUEUE_MAX        1024 /* queues in one tree */
#define KGPU_QUEUE_MAX_DEPTH  16   /* levels from a root to a leaf */
#define KGPU_QUEUE_NAME_MAX   63   /* a Kubernetes label value */
#define KGPU_QUEUE_MAX_MODELS 16   /* per-model entries of one queue */
#define KGPU_QUEUE_UNSET      (-1) /* a dimension nobody set: not checked */
#define KGPU_QUEUE_DEFAULT    "default"
#define KGPU_QUEUE_MAX_NAMESPACES 256 /* namespaces one queue lists */
#define KGPU_QUEUE_MAX_SELECTOR   32  /* requirements of one namespace selector */
#define KGPU_QUEUE_MAX_SEL_VALUES 64  /* values of one requirement */
#define KGPU_QUEUE_LABEL_KEY_MAX  317 /* a label key: a 253-character prefix, '/', 63 */
/* Where a pod names its queue (label), or its namespace does (annotation). */
#define KGPU_QUEUE_LABEL "kgpu.io/queue"

/*
 * An amount of GPU: compute in milli-GPU (1000 = one GPU) and memory in MiB.
 * In a guarantee or a limit a dimension may be KGPU_QUEUE_UNSET: a limit
 * unset does not limit; a guarantee unset guarantees nothing in that
 * dimension and does not hold the other one back.
 */
typedef struct kgpu_qamount {
    int64_t milli;
    int64_t mem_mib;
} kgpu_qamount;

/* A guarantee and a limit on the GPUs of one model only. Borrowed strings. */
typedef struct kgpu_queue_model_spec {
    const char *model; /* exact model name, as in the cluster's model table */
    kgpu_qamount guarantee, limit;
} kgpu_queue_model_spec;

/* A requirement of a namespace selector, as Kubernetes' matchExpressions read. */
typedef enum kgpu_qsel_op {
    KGPU_QSEL_IN = 1,     /* the label is set to one of values */
    KGPU_QSEL_NOT_IN,     /* the label is unset, or set to none of values */
    KGPU_QSEL_EXISTS,     /* the label is set (no values) */
    KGPU_QSEL_NOT_EXISTS, /* the label is unset (no values) */
} kgpu_qsel_op;

typedef struct kgpu_queue_selreq {
    const char *key;
    kgpu_qsel_op op;
    const char *const *values;
    int nvalues;
} kgpu_queue_selreq;

/* What a caller passes to build a tree. Strings and arrays are borrowed (copied by _new). */
typedef struct kgpu_queue_spec {
    const char *name;   /* [a-z0-9.-], 1..63 characters, unique */
    const char *parent; /* NULL or "": a root */
    kgpu_qamount guarantee, limit;
    int weight; /* 1..1000; 0 means 1 */
    const kgpu_queue_model_spec *models;
    int nmodels;
    /*
     * Which namespaces' pods may name this queue, or a queue below it, in
     * their kgpu.io/queue label (kgpu_queues_pick): those listed, and those
     * the selector selects. Nothing set admits no namespace by label.
     */
    const char *const *namespaces; /* namespace names (DNS labels) */
    int nnamespaces;
    bool has_selector; /* a selector with no requirement selects every namespace */
    const kgpu_queue_selreq *selector; /* all must hold */
    int nselector;
} kgpu_queue_spec;

typedef struct kgpu_queues kgpu_queues;

/*
 * Builds a tree from specs[0..n). Checks: names valid and unique, parents
 * exist, no cycle, depth, guarantee <= limit in each set dimension, the
 * guarantees of a queue's children sum to no more than its own (where it
 * sets one), every guarantee can be honoured: what a queue and the queues
 * below it are guaranteed (its own guarantee where it sets one, else the
 * sum of its children's) stays within its limit and, per model, within
 * its per-model limit and its total limit, so that no ancestor's limit
 * keeps a queue below its guarantee; per-model entries name distinct
 * models; namespace names and selectors are well formed. A queue named
 * `default` is added as a root (nothing guaranteed, no limit, weight 1)
 * when the specs have none. Errors name the queue and the field, e.g.
 * "queue team-a: guarantee.gpu 5 above limit.gpu 4". 0 or a negative code;
 * free *out with kgpu_queues_free.
 */
int kgpu_queues_new(const kgpu_queue_spec *specs, int n, kgpu_queues **out, kgpu_error *err);
void kgpu_queues_free(kgpu_queues *qs);
/* Deep copy, usage included; NULL when out of memory. */
kgpu_queues *kgpu_queues_clone(const kgpu_queues *qs);

/*
 * Static caps, as Kubernetes' ResourceQuota gives: every queue's limit
 * becomes its guarantee (a dimension it guarantees nothing in: 0), so no
 * queue borrows. For comparisons; usage is kept.
 */
void kgpu_queues_cap_at_guarantee(kgpu_queues *qs);

/*
 * Resolves the per-model entries' names against a cluster's model table
 * (entries whose model no GPU of the cluster has keep no id and never
 * apply). Call again when the model table changes. 0 or KGPU_EINVAL.
 */
int kgpu_queues_bind_models(kgpu_queues *qs, const kgpu_cluster *c, kgpu_error *err);

int kgpu_queues_count(const kgpu_queues *qs);
/* Id of the queue named `name`, or -1. */
int kgpu_queues_find(const kgpu_queues *qs, const char *name);

/* A queue as callers read it. Borrowed; valid until the tree is freed. */
typedef struct kgpu_queue_info {
    const char *name;
    int parent; /* -1 for a root */
    int depth;  /* 0 for a root */
    int weight;
    kgpu_qamount guarantee, limit;
    kgpu_qamount used; /* by its own pods and its descendants' */
    int pods;          /* charged to it or its descendants */
    bool leaf;
} kgpu_queue_info;

int kgpu_queues_info(const kgpu_queues *qs, int q, kgpu_queue_info *out);

/*
 * The queue a pod names: its `kgpu.io/queue` label when set and non-empty,
 * else its namespace's `kgpu.io/queue` annotation, else `default`. Either
 * argument may be NULL. Returns one of them or the static "default".
 * Whether the pod may use it is kgpu_queues_pick's to say.
 */
const char *kgpu_queue_name_for(const char *pod_label, const char *namespace_annotation);

/*
 * Whether s is a namespace name as Kubernetes allows one (a DNS label:
 * 1..63 of [a-z0-9-], not starting or ending with '-'). For every list of
 * namespaces an administrator writes (a queue's namespaces, the node
 * watcher's exemptNamespaces).
 */
bool kgpu_namespace_name_valid(const char *s);

/* A namespace as queue selection reads it. Borrowed. */
typedef struct kgpu_queue_ns {
    const char *name;
    const char *queue; /* its kgpu.io/queue annotation (NULL or "": none, `default`) */
    const kgpu_label *labels; /* kubernetes.io/metadata.name, when absent, reads as name */
    int nlabels;
} kgpu_queue_ns;

/*
 * The queue of a pod of namespace ns with label `pod_label` (NULL or "":
 * none), as its namespace is allowed (docs/queues.md "Which queue"):
 * without a label, the namespace's queue (its annotation, else `default`);
 * with one, the queue it names if that is the namespace's queue or below
 * it, or a queue that admits ns (kgpu_queue_spec.namespaces, .selector)
 * or is below one that does. Namespaces are cluster-scoped: only a
 * cluster administrator writes the annotation and the labels. Returns the
 * queue's id, or -1 with `why` (may be NULL) naming the namespace and the
 * queue given and nothing of any other: a label naming a queue that does
 * not exist reads the same as one naming a queue ns may not use.
 */
int kgpu_queues_pick(const kgpu_queues *qs, const kgpu_queue_ns *ns, const char *pod_label,
                     char *why, size_t whylen);

/*
 * What a pod takes from its queue: totals, and per GPU which model it is
 * on. nparts 0 when the GPUs are not chosen yet (per-model entries then do
 * not apply to the check).
 */
typedef struct kgpu_qdemand {
    int64_t milli, mem_mib;
    int nparts;
    struct {
        int model;
        int milli;
        int64_t mem_mib;
    } part[KGPU_MAX_GPUS_PER_NODE];
} kgpu_qdemand;

/* Totals of a request (whole GPUs count 1000 milli and their memory as asked), no parts. */
void kgpu_qdemand_of_request(const kgpu_request *req, kgpu_qdemand *d);
/*
 * The demand of a placement: totals and one part per GPU, on the GPUs' models.
 * Whole GPUs count 1000 milli and the GPU's whole memory.
 */
void kgpu_qdemand_of_assignment(const kgpu_cluster *c, const kgpu_assignment *a, kgpu_qdemand *d);
/* The same before applying: request `req` on `gpus` of node `node`. */
void kgpu_qdemand_of_placement(const kgpu_cluster *c, const kgpu_request *req, int node,
                               const int *gpus, kgpu_qdemand *d);

/* kgpu_queues_check's answers. */
enum {
    KGPU_QUEUE_WITHIN = 0, /* within the queue's guarantee, and every limit on its path holds */
    KGPU_QUEUE_BORROWS = 1, /* above its guarantee, every limit holds: it borrows */
    KGPU_QUEUE_OVER = 2,    /* some queue on its path would pass its limit */
    /*
     * Within the queue's guarantee, but an ancestor's limit is taken by
     * others borrowing: admissible once they are reclaimed (never refused).
     */
    KGPU_QUEUE_RECLAIM = 3,
};

/*
 * Admission: may queue q take d now? Pure. For KGPU_QUEUE_OVER and
 * _RECLAIM, `why` (may be NULL) says which queue and limit, in the words of
 * the fit reasons: "queue team-a would use 4.5 GPUs of its limit 4".
 */
int kgpu_queues_check(const kgpu_queues *qs, int q, const kgpu_qdemand *d, char *why,
                      size_t whylen);

/*
 * Charges d to q and its ancestors. Refuses (KGPU_ENOFIT, nothing changed,
 * err says which limit) what would take any of them over a limit: no
 * sequence of charges and uncharges leaves a queue over its limit.
 */
int kgpu_queues_charge(kgpu_queues *qs, int q, const kgpu_qdemand *d, kgpu_error *err);
/*
 * Charges a pod that already runs (found bound when the extender starts,
 * or counted again after the tree or the inventory changed): never
 * refused, so a queue whose limit was lowered may end above it;
 * kgpu_queues_check then refuses its new pods until enough of them end.
 * KGPU_ENOENT (no such queue) or 0.
 */
int kgpu_queues_charge_running(kgpu_queues *qs, int q, const kgpu_qdemand *d, kgpu_error *err);
/* Undoes a charge exactly. KGPU_ESTATE (nothing changed) if it was never charged. */
int kgpu_queues_uncharge(kgpu_queues *qs, int q, const kgpu_qdemand *d, kgpu_error *err);

/* What q uses above its guarantee, in milli (0 when within it or when it guarantees no compute). */
int64_t kgpu_queues_borrowed_milli(const kgpu_queues *qs, int q);
/* Whether q is below its guarantee in some set dimension. */
bool kgpu_queues_below_guarantee(const kgpu_queues *qs, int q);

/* A running pod, as reclaim sees it. Caller-owned. */
typedef struct kgpu_qpod {
    int queue;
    int priority;      /* higher is more important */
    int64_t admitted;  /* when it started, any unit (larger = newer): reclaim weighs work lost */
    kgpu_assignment a; /* where it runs */
    kgpu_qdemand d;    /* what it is charged (kgpu_qdemand_of_assignment) */
} kgpu_qpod;

/* How reclaim chooses victims. */
typedef enum kgpu_reclaim_mode {
    /*
     * Lowest priority first, newest first among equals, across the cluster,
     * until the waiting pod fits some node: what a quota system that does
     * not see GPUs (Kueue's reclaim) evicts.
     */
    KGPU_RECLAIM_PRIORITY_AGE = 1,
    /*
     * Per node, the fewest borrowing pods of the lowest priority whose
     * GPUs let the waiting pod fit; among nodes, the lowest highest
     * priority evicted, then the least freed GPU the pod does not use, then
     * the least fragmentation left, then the fewest evictions.
     */
    KGPU_RECLAIM_FRAG = 2,
} kgpu_reclaim_mode;

/* Reclaim's answer. victims is caller-provided (capacity: the number of running pods). */
typedef struct kgpu_reclaim {
    size_t *victims; /* indices into the running array */
    size_t nvictims;
    int node;            /* the node the pod fits after the evictions */
    int gpus[KGPU_MAX_GPUS_PER_NODE]; /* KGPU_RECLAIM_FRAG: the GPUs (positions) it fits on */
    int ngpus;                        /* req->gpu_count for KGPU_RECLAIM_FRAG, else 0 */
    int64_t freed_milli;              /* GPU compute the victims free */
} kgpu_reclaim;

/*
 * Chooses the pods to evict so that a pod of queue `q` asking `req` (which
 * kgpu_queues_check finds within q's guarantee) can run. Candidates are
 * the running pods of other queues that borrow: evicting one never takes
 * its queue, or any ancestor that is not also q's, below its guarantee.
 * Pure: neither c nor qs changes. `target` (may be NULL) weighs the
 * fragmentation of KGPU_RECLAIM_FRAG's tie-break. Returns 0 with the
 * victims in out, KGPU_ENOFIT when no set of candidates makes room (out
 * empty), or another code.
 */
int kgpu_queues_reclaim(const kgpu_cluster *c, const kgpu_queues *qs, const kgpu_qpod *running,
                        size_t nrunning, int q, const kgpu_request *req, kgpu_reclaim_mode mode,
                        const kgpu_workload *target, kgpu_reclaim *out, kgpu_error *err);

/*
 * Writes an amount of compute as GPUs, the way reasons print it: "4", "4.5",
 * "0.25". Returns buf.
 */
const char *kgpu_queue_gpus_str(int64_t milli, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
