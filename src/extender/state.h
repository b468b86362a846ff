/*
 * kgpu-extender, state layer: the cluster's GPU state and its lock. Only
 * this layer writes it; sources hand it facts through ext_sink, decisions
 * change it through the functions here.
 *
 * Files, bottom first: awaiting.c (pods awaiting kubelet's Allocate),
 * dra_claims.c (what DRA claims hold), queues.c and reclaim_state.c (the
 * GPU queue tree, unschedulable pods, reclaims in flight), learn.c (shapes
 * and policies), pods.c (pods holding GPUs), inventory.c (the node
 * inventory), dra_nodes.c (DRA nodes' GPUs from their slices), state.c
 * (life cycle and the sink).
 *
 * Threads: every function expects st->mu held unless it says otherwise;
 * the sink's functions take it themselves. Work under the lock is in-memory
 * only (microseconds), never I/O.
 */
#ifndef KGPU_EXT_STATE_H
#define KGPU_EXT_STATE_H

#include "kgpu/mig.h"
#include "sources.h"

/*
 * GPU time of one namespace, queue, GPU model and capacity type (usage.c):
 * one series of kgpu_namespace_gpu_seconds_total.
 */
typedef struct ext_usage {
    char ns[64];                         /* namespaces are DNS labels */
    char queue[KGPU_QUEUE_NAME_MAX + 1]; /* the pod's resolved queue; "" queues off */
    char model[KGPU_MODEL_NAME_MAX];     /* of the GPUs held */
    bool spot;                           /* its node's capacity type (capacity.h) */
    double gpus;                         /* held now */
    double gpu_seconds;                  /* ever */
} ext_usage;

/*
 * Series kept at most: namespaces x queues x models x 2 of a large cluster
 * fit many times over. Past it, new keys count under namespace
 * EXT_USAGE_OVERFLOW_NS (queue "", per model and capacity type), logged once.
 */
#define EXT_USAGE_MAX         16384
#define EXT_USAGE_OVERFLOW_NS "_overflow" /* no namespace: names start with a letter or digit */
#define EXT_POD_USAGE_MAX     4           /* GPU models one pod's GPUs are counted by */

/* ---- state ---- */

enum ext_pod_status { POD_RESERVED, POD_BOUND };

/* One GPU container of a pod holding GPUs. */
typedef struct ext_pod_part {
    char container[64]; /* container names are DNS labels: at most 63 characters */
    kgpu_assignment a;
} ext_pod_part;

/* A pod holding GPUs: reserved by a bind in flight, or bound. Sized to its parts. */
typedef struct ext_pod {
    char uid[64];
    char ns[64]; /* namespaces are DNS labels */
    char name[KGPU_NAME_MAX + 1], node[KGPU_NAME_MAX + 1];
    enum ext_pod_status status;
    double gpus;  /* GPU fraction held, for GPU-hours */
    double since; /* monotonic time it started holding: a relist may not drop younger pods */
    /*
     * > 0: its Binding got no answer the bind could act on (a timeout, a
     * broken connection, a 5xx), and the API server may still apply it, so
     * its GPUs stay held until then (monotonic seconds, doubt.c) unless the
     * API server says first. Status POD_RESERVED meanwhile.
     */
    double doubt_until;
    unsigned long long gen; /* which reservation this is: a bind settles only its own */
    /*
     * Its GPU queue (queues.c): its kgpu.io/queue label ("" none), and the
     * queue that and its namespace's annotation name, resolved again
     * whenever the queues or the namespaces change.
     */
    char queue_label[KGPU_QUEUE_NAME_MAX + 1];
    char queue[KGPU_QUEUE_NAME_MAX + 1];
    int priority;     /* spec.priority: reclaim evicts the lowest first */
    /*
     * Charged to the queue tree: what its GPUs are (kgpu_qdemand_of_assignment
     * on the cluster now; every change of the cluster charges all again).
     */
    bool charged;
    bool evicting; /* an eviction went through; charged until the pod is gone */
    bool restartable; /* kgpu.io/restartable: "true" (consolidation may move it) */
    bool queue_refused; /* its label names a queue its namespace may not use (said once) */
    /*
     * What it adds to st->usage (usage.c), per entry: set when it starts
     * holding, taken off when it stops. Entries are borrowed: they live as
     * long as the state.
     */
    int nusage;
    ext_usage *usage[EXT_POD_USAGE_MAX];
    double usage_gpus[EXT_POD_USAGE_MAX];
    int nparts;
    ext_pod_part part[];
} ext_pod;

/*
 * A pod the API server says is bound with a GPU assignment that cannot be
 * honoured right now: its node or GPUs are not in the inventory (yet, or
 * any more), or they are held by another pod. Kept and retried whenever the
 * inventory changes or pods leave, so a GPU that comes back is not handed out twice.
 */
typedef struct ext_orphan {
    char uid[64], ns[64];
    char name[KGPU_NAME_MAX + 1], node[KGPU_NAME_MAX + 1];
    double since;
    int64_t cpu_milli, memory_mib; /* the pod's requests, counted once it is adopted */
    char queue_label[KGPU_QUEUE_NAME_MAX + 1];
    int priority;
    int n;
    kgpu_assigned_part parts[];
} ext_orphan;

/*
 * A pod bound to an inventory node without a kgpu assignment (CPU-only, or
 * placed without kgpu): its CPU and memory, taken from its node so that the
 * policies' scores see the node's free CPU as kube-scheduler does.
 */
typedef struct ext_cpu_pod {
    char node[KGPU_NAME_MAX + 1];
    int64_t cpu_milli, memory_mib; /* the pod's requests */
    kgpu_assignment a;             /* what was taken: clamped to what the node had free */
} ext_cpu_pod;

typedef struct ext_shape_info {
    kgpu_shape s;
    long count; /* observations */
    /* The rest of the shape's key (learn.c shape_key) besides s's fields. */
    bool exclusive;
    int milli; /* the request's gpu_milli (s.gpu_milli is 1000 for a whole GPU) */
    int64_t memory_mib;
    bool open; /* no allow list: a model the mask has no bit for yet counts as allowed */
} ext_shape_info;

/*
 * A pod bound to a node whose devices kubelet has not asked for yet (no
 * kgpu.io/allocated): until it has them, or ends, or `until` passes, no
 * pod with a clashing ask may be placed on that node.
 */
typedef struct ext_await {
    char uid[64], ns[64];
    char name[KGPU_NAME_MAX + 1], node[KGPU_NAME_MAX + 1];
    double until;    /* monotonic: the bind time plus allocate_wait */
    double recorded; /* monotonic: when recorded; a relist spares entries younger than it */
    ext_asks asks;
} ext_await;

/* Why a pod's last filter passed no node, as far as queues are concerned. */
enum ext_wait { EXT_WAIT_NONE, EXT_WAIT_QUOTA, EXT_WAIT_RECLAIM };

/* How an eviction for reclaim went. */
enum ext_evict_outcome {
    EXT_EVICT_APPLIED, /* --cluster-file: applied to the in-memory state */
    EXT_EVICT_EVICTED, /* the Eviction API accepted it: charged until the pod is gone */
    EXT_EVICT_BLOCKED, /* 429: a PodDisruptionBudget refused it */
    EXT_EVICT_GONE,    /* 404: the pod was gone already */
    EXT_EVICT_FAILED,  /* another answer, or the API server could not be reached */
};

/* One eviction for reclaim, kept in a ring of the most recent for /inspect. */
typedef struct ext_eviction {
    double at; /* realtime seconds */
    char ns[64], name[KGPU_NAME_MAX + 1], uid[64], node[KGPU_NAME_MAX + 1];
    char queue[KGPU_QUEUE_NAME_MAX + 1];
    char for_ns[64], for_name[KGPU_NAME_MAX + 1]; /* the waiting pod */
    char for_queue[KGPU_QUEUE_NAME_MAX + 1];
    int64_t freed_milli;
    int outcome; /* enum ext_evict_outcome */
} ext_eviction;

#define EXT_EVICTIONS_KEPT 64  /* recent evictions /inspect shows */
#define EXT_RECLAIMS_MAX   256 /* reclaims in flight (cluster mode) remembered at once */
#define EXT_REFUSED_MAX    256 /* victims a PodDisruptionBudget protected, remembered at once */
/*
 * A reclaim in flight, its victims still there, is not repeated for its
 * pod, and counts against its queue's guarantee, until they are gone or
 * this long: Kubernetes' default grace period (30 s) many times over, yet
 * bounded, as a victim with a long grace period or a stuck finalizer is
 * its owner's choice.
 */
#define EXT_RECLAIM_WAIT_S 300
/*
 * Once its victims are gone, the room they freed is held for the waiting
 * pod this long, or until it is bound or deleted: kube-scheduler tries it
 * again on the victims' deletion, after at most its 10 s backoff.
 */
#define EXT_RECLAIM_HOLD_S 30
#define EXT_REFUSED_S      30  /* a victim whose eviction was refused is skipped this long */

/*
 * A pod kube-scheduler found no node for (its PodScheduled condition False,
 * Unschedulable), seen through the pod watch in cluster mode. Its own
 * filters (NodeResourcesFit: "Insufficient nvidia.com/gpu") may have
 * refused every node before kgpu's filter is called, so reclaim for it
 * cannot wait for a filter call: the leader's sweep (reclaim_state.c, reclaim.c) runs it.
 */
typedef struct ext_unsched {
    double since; /* monotonic: first seen unschedulable; first (reclaim_state.c expire) */
    char uid[64], ns[64], name[KGPU_NAME_MAX + 1];
    /*
     * Only what the sweep reads, copied out of the pod: never its JSON, so
     * an entry is this size (plus its model globs) whatever the pod's size.
     */
    char label[KGPU_QUEUE_NAME_MAX + 1]; /* its kgpu.io/queue label, "" without one */
    int priority;                        /* spec.priority */
    char policy[32];                     /* kgpu.io/policy, "" when unset */
    int nparts;                          /* GPU containers: the sweep reclaims for one only */
    kgpu_request req; /* the first part's, with the pod's CPU and memory; uncompiled, no globs */
    int nallow, nexclude;
    char (*globs)[KGPU_GLOB_MAX]; /* allowed then excluded model globs; NULL when none; owned */
    double event_at;  /* monotonic: when the last Event was posted about it (0: none) */
    char event[256];  /* that Event's message: the same one is not posted again soon */
} ext_unsched;

#define EXT_UNSCHED_MAX     4096 /* unschedulable pods followed at once; more are not swept */
#define EXT_UNSCHED_NS_MAX  256  /* of which from one namespace: one tenant cannot fill the table */
#define EXT_SWEEP_MS        2000 /* how often the leader looks at them */
#define EXT_SWEEP_PODS      16   /* reclaims started per sweep, highest priority first */
#define EXT_SWEEP_SLICE_MS  5    /* the sweep holds st->mu at most about this long at a time */
#define EXT_SWEEP_YIELD_US  500  /* and then lets others take it for this long */
#define EXT_EVENT_REPEAT_S  60   /* the same Event about a pod, at most this often */

/* A pod remembered from filter for its bind. */
typedef struct ext_filtered {
    kgpu_pod pod;
    ext_asks asks;
    char queue_label[KGPU_QUEUE_NAME_MAX + 1]; /* its kgpu.io/queue label, "" without one */
    int priority;                              /* spec.priority */
    int waiting; /* enum ext_wait: why its last filter passed no node, for queues' pending */
    char queue[KGPU_QUEUE_NAME_MAX + 1]; /* the queue it waits in */
    struct ext_filtered *older, *newer; /* by when last filtered: evicted oldest first */
} ext_filtered;

/*
 * What prioritize-gpuless scores pods without a GPU from when st->mu is
 * busy (snapshot.c): per node, its CPU and memory free and its free GPU
 * compute, as of the last publication. Immutable once published.
 */
typedef struct ext_gpuless_node {
    const char *name; /* into the snapshot's own copy */
    int64_t cpu_milli, cpu_free, memory_free;
    int ngpus;      /* healthy GPUs */
    int free_milli; /* compute free over them */
} ext_gpuless_node;

typedef struct ext_gpuless_snap {
    const void *cluster; /* the cluster it was taken of: compared, never dereferenced */
    int n;
    ext_gpuless_node *node; /* sorted by name */
    uint64_t *version;      /* node versions in cluster order: whether it is stale */
    char *names;
} ext_gpuless_snap;

#define EXT_GPULESS_RETIRED_MAX 8 /* old snapshots awaiting their readers; more: not republished */

/*
 * Threads (snapshot.c): `cur` is written only by a thread holding st->mu
 * (ext_gpuless_publish), read by any thread without it between
 * ext_gpuless_enter and ext_gpuless_leave, which count `readers`. A
 * snapshot replaced goes to `retired` (st->mu's) and is freed by the next
 * publisher that sees no reader: one that entered after the swap reads the
 * new one, so none can still hold an old one.
 */
typedef struct ext_gpuless_snaps {
    _Atomic(ext_gpuless_snap *) cur;
    atomic_int readers;
    ext_gpuless_snap *retired[EXT_GPULESS_RETIRED_MAX];
    int nretired;
    atomic_ulong published, stale_answers; /* counted for tests and the benchmark */
    bool always_lock; /* benchmarks only: prioritize-gpuless waits for st->mu, as before snapshots */
} ext_gpuless_snaps;

typedef struct ext_state {
    pthread_mutex_t mu;
    const ext_config *cfg;
    ext_metrics *metrics;
    kgpu_cluster *cluster;
    kgpu_policy *policies[16]; /* by registry position, created on first use */
    kgpu_workload target;      /* fgd's target: shapes seen so far, or a prior */
    kgpu_strmap shapes;        /* shape key -> (intptr) id+1 */
    int nshapes;
    ext_shape_info *shape_info; /* by shape id */
    int shape_cap;
    long observations, observations_at_build;
    kgpu_strmap pods;      /* uid -> ext_pod* */
    kgpu_strmap orphans;   /* uid -> ext_orphan* */
    kgpu_strmap cpu_pods;  /* uid -> ext_cpu_pod*: bound pods without kgpu GPUs */
    double relist_started; /* when the pod relist in progress was asked for (0: first list) */
    size_t doubts;                /* pods in `pods` with doubt_until > 0 */
    double doubt_next;            /* no doubt_until is earlier (ext_doubts_expire scans then) */
    unsigned long long next_gen;  /* the gen of the next ext_pod */
    kgpu_strmap pending; /* uid -> ext_filtered*, from filter, for bind; at most pending_pods_max */
    ext_filtered *pending_oldest, *pending_newest; /* least and most recently filtered */
    kgpu_strmap awaiting;  /* uid -> ext_await*: pods kubelet has yet to allocate devices for */
    kgpu_strmap observed;  /* uids counted by observe(), at most OBSERVED_MAX (state_impl.h) */
    char **observed_order; /* FIFO of observed uids (owned; the map's keys are copies) */
    int observed_head, observed_len;
    kgpu_strmap usage;    /* namespace, queue, model, spot -> ext_usage*; at most EXT_USAGE_MAX (+ overflow) */
    bool usage_full;      /* it reached EXT_USAGE_MAX (said once) */
    kgpu_strmap spot_nodes; /* node -> a marker (not owned): nodes whose labels say spot capacity */
    double usage_at;      /* monotonic seconds of the last integration */
    kgpu_rng rng;
    bool nodes_synced, pods_synced;
    /* GPU queues (queues.c); queues NULL: off, every pod in `default`, nothing refused. */
    kgpu_queues *queues;      /* the tree with usage */
    kgpu_queues *queues_spec; /* the same tree without usage, rebuilt from on every change */
    unsigned long long *queue_evictions; /* by queue id: evictions of its pods, ever */
    kgpu_strmap ns_queue;     /* namespace -> its annotation and labels (queues.c, one block, free()) */
    ext_eviction evictions[EXT_EVICTIONS_KEPT]; /* ring of the most recent */
    int evictions_next, nevictions;
    kgpu_strmap reclaims; /* waiting pod uid -> ext_reclaim* (reclaim_state.c), at most EXT_RECLAIMS_MAX */
    kgpu_strmap refused;  /* victim uid -> its refusal (reclaim_state.c), at most EXT_REFUSED_MAX */
    kgpu_strmap unsched;  /* uid -> ext_unsched*: unschedulable GPU pods, at most EXT_UNSCHED_MAX */
    kgpu_strmap unsched_ns; /* namespace -> (intptr) its entries in unsched, at most EXT_UNSCHED_NS_MAX */
    double consolidated_at; /* monotonic: when the last consolidation started (moves.c) */
    double sweep_slice_s;   /* EXT_SWEEP_SLICE_MS; tests and benchmarks change it */
    unsigned long sweep_slices; /* holds of the lock the sweeps took, ever (tests) */
    ext_gpuless_snaps gpuless; /* what prioritize-gpuless scores from without st->mu (snapshot.c) */
    char queues_error[KGPU_ERROR_MSG_MAX]; /* why the last tree given was refused; "" */
    /* Cluster mode (sink.c): GPUQueues by name, cut to name, generation, spec, status. */
    json_t *gpuqueues;
    bool gpuqueue_crd_absent; /* the API server answered 404 for GPUQueues */
    /* DRA (dra_claims.c, dra_nodes.c): nodes served by kgpu-dra-plugin, their slices, and the claims on them. */
    kgpu_strmap dra_nodes;  /* node -> ext_dra_node*: labelled kgpu.io/gpu-allocator=dra */
    kgpu_strmap dra_slices; /* node -> its pool of driver gpu.kgpu.io (ext_dra_slice*) */
    kgpu_strmap dra_parts;  /* slice name -> ext_dra_slice* as parsed: the pools' slices */
    kgpu_strmap dra_claims; /* "ns/name" -> ext_dra_claim*: claims of gpu.kgpu.io only */
    kgpu_strmap pod_qlabels; /* pod uid -> its kgpu.io/queue label (char*), pods with one only */
    /* Nodes going away (ext_node_leaving): name -> its reason (char*); no new GPU pod there. */
    kgpu_strmap leaving;
    /* GPU nodes carrying scale-down annotations, as the API server says (sources.h). */
    kgpu_strmap guard_marked; /* name -> (void *)(intptr_t) EXT_GUARD_HAS_*, at most EXT_GUARD_NODES_MAX */
    kgpu_strmap emptying;     /* node -> double* (monotonic end): being emptied (moves.c) */
    int dra_unapplied;      /* allocation results not charged now (node or GPU unknown, full) */
    bool dra_absent[2];     /* the API server answered 404 for resourceslices, resourceclaims */
} ext_state;

int ext_state_init(ext_state *st, const ext_config *cfg, ext_metrics *m, kgpu_error *err);
void ext_state_destroy(ext_state *st);

/*
 * Replaces the node inventory (cluster-file load, node relist, a node's
 * inventory changing): rebuilds the cluster and re-applies every held pod
 * whose node still exists. Models no node has any more are forgotten (their
 * ids reclaimed); a node whose models would take the table past
 * KGPU_MAX_MODELS is left out, logged. Caller holds st->mu.
 */
int ext_state_set_nodes(ext_state *st, const kgpu_node_spec *specs, int n, kgpu_error *err);

/* Adds or replaces one node (watch events). Caller holds st->mu. */
int ext_state_upsert_node(ext_state *st, const kgpu_node_spec *spec, kgpu_error *err);
int ext_state_remove_node(ext_state *st, const char *name);

/*
 * A pod seen in the API server (list or watch). Holds its GPUs from its
 * assignment annotation when it is bound and not terminal, releases them
 * when it ends. Caller holds st->mu.
 */
void ext_state_pod_seen(ext_state *st, const json_t *pod);
void ext_state_pod_gone(ext_state *st, const char *uid);
/*
 * A full pod relist: drops bound pods not in `items` that were bound before
 * st->relist_started, then sees each. Younger pods missing from the list may
 * have been bound after its snapshot, or deleted before it: they come back in
 * *suspects ("ns/name/uid", malloc'd, caller frees) for the caller to look up
 * in the API server (outside the lock) and drop with ext_state_pod_gone if
 * gone. Caller holds st->mu.
 */
void ext_state_pods_reset(ext_state *st, json_t *items, char ***suspects, size_t *nsuspects);

/*
 * Compiles the pod's requests against the cluster and gives them shape ids.
 * The first part keeps the pod's CPU and memory requests: the policies score
 * with them (kgpu's stranded GPU), but kube-scheduler is the authority on
 * CPU and memory, so fit checks take ext_fit_requests and placements are
 * applied with CPU and memory clamped to what the node has free. Caller holds st->mu.
 */
int ext_state_compile(ext_state *st, kgpu_pod *pod, kgpu_error *err);

/*
 * For a pod that asks for no GPU (nparts 0): *req becomes its CPU and memory
 * as a request of no GPU, compiled and given a shape id, and the pod counts
 * as arrived (once per uid), so the policies learn the CPU that pods without
 * a GPU take from nodes. Caller holds st->mu.
 */
int ext_state_compile_gpuless(ext_state *st, const kgpu_pod *pod, kgpu_request *req,
                              kgpu_error *err);
/*
 * The same for a request built elsewhere (a DRA pod's, dra_claims.c): compiled,
 * given a shape id, and counted as the arrival of pod `uid`. Caller holds st->mu.
 */
int ext_state_compile_request(ext_state *st, const char *uid, kgpu_request *req, kgpu_error *err);
/*
 * The spec of inventory node i as it stands (gpus: KGPU_MAX_GPUS_PER_NODE
 * entries), pointing into the cluster: valid until it changes. For
 * rebuilding the inventory with some nodes replaced. Caller holds st->mu.
 */
void ext_state_node_spec(const ext_state *st, int i, kgpu_node_spec *spec, kgpu_gpu_spec *gpus);

/* The policy for a pod: its kgpu.io/policy annotation, else the configured default. */
kgpu_policy *ext_state_policy(ext_state *st, const kgpu_pod *pod, kgpu_error *err);


/*
 * Remembers a pod from filter (copied, with its asks) for its bind, as the
 * most recently filtered; past pending_pods_max the least recently filtered
 * is forgotten (its bind then asks the API server for the pod, see
 * bind.c bind_pod). Returns the entry (borrowed, NULL when out of
 * memory) for the caller to fill in the queue fields. Caller holds st->mu.
 */
ext_filtered *ext_state_remember(ext_state *st, const kgpu_pod *pod, const ext_asks *asks);
/* The remembered pod, or NULL. Borrowed; valid while st->mu is held. */
const ext_filtered *ext_state_recall(ext_state *st, const char *uid);

/*
 * Reserves GPUs for `pod` on `node` with its policy, within the placement
 * search filter asked (kgpu_policy_place): a pod filter passed on a node
 * that has not changed since is placed there. *out points at what the
 * pod now holds (borrowed: valid while st->mu is held). Returns KGPU_EEXIST
 * when the uid already holds GPUs (then *out is what it holds). The pod is
 * charged to the queue its label `queue_label` ("" or NULL: none) and its
 * namespace name, on the GPUs chosen: KGPU_ENOFIT, with the queue's reason,
 * when that would pass a limit. Caller holds st->mu.
 */
int ext_state_reserve(ext_state *st, const kgpu_pod *pod, const char *node,
                      const char *queue_label, int priority, const ext_pod **out,
                      kgpu_error *err);
/* The bind went through: the reservation becomes a binding. */
void ext_state_confirm(ext_state *st, const char *uid);
/* Drops whatever uid holds. */
void ext_state_release(ext_state *st, const char *uid);
/* What uid holds when it is still reservation `gen` (a bind's own), else NULL. */
ext_pod *ext_state_own(ext_state *st, const char *uid, unsigned long long gen);

/* ---- binds in doubt (doubt.c) ---- */

enum ext_doubt_end {
    EXT_DOUBT_LANDED,   /* the API server showed the Binding applied */
    EXT_DOUBT_RELEASED, /* it cannot land any more: the pod is gone, or bound by another Binding */
    EXT_DOUBT_EXPIRED,  /* --bind-doubt passed without a word from the API server */
    EXT_DOUBT_RETRIED,  /* a bind of the pod to the same node takes its GPUs over */
    EXT_DOUBT_ENDS
};
/* Puts reservation p in doubt until `until` (monotonic seconds). */
void ext_state_doubt(ext_state *st, ext_pod *p, double until);
/* Ends p's doubt, counting how (EXT_DOUBT_RETRIED: not counted, its bind settles it). */
void ext_state_doubt_end(ext_state *st, ext_pod *p, enum ext_doubt_end how);
/* The pod uid's reservation in doubt, or NULL. */
ext_pod *ext_state_doubt_of(ext_state *st, const char *uid);
/* Releases every reservation whose doubt has run out. */
void ext_doubts_expire(ext_state *st);
/* Why a pod in doubt on p->node binds nowhere else yet, for filter and bind. */
void ext_doubt_reason(const ext_state *st, const ext_pod *p, char *out, size_t len);

/* ---- GPU-seconds per namespace, queue, model and capacity type (usage.c). Caller holds st->mu. ---- */

/* Brings every entry's GPU-seconds up to now. */
void ext_state_integrate_usage(ext_state *st);
/* Whether node `node`'s labels say spot capacity (kgpu_capacity_spot): for pods held from now on. */
void ext_state_node_spot(ext_state *st, const char *node, bool spot);
/*
 * Copies every entry, up to now, into *rows (malloc'd, caller frees), *n of
 * them; false when out of memory.
 */
bool ext_usage_rows(ext_state *st, ext_usage **rows, size_t *n);

/*
 * The sink (sources.h) that puts what sources read into st, each call under
 * st->mu. st outlives every source using it.
 */
void ext_state_sink(ext_state *st, ext_sink *out);
/* Whether inventory and pods are known (readyz). Takes st->mu. */
bool ext_state_synced(ext_state *st);

/* ---- GPU queues (queues.c, reclaim_state.c; docs/queues.md). Caller holds st->mu. ---- */

/*
 * Replaces the tree by `spec` (a tree without usage, owned from now on;
 * NULL turns queues off) and charges every held pod to it again, running
 * pods being never refused (a queue may then be above its limit: its new
 * pods wait until enough of its pods end). Evictions counted are kept by
 * queue name.
 */
void ext_queues_set(ext_state *st, kgpu_queues *spec);
/*
 * Charges every held pod again from its GPUs, to the queue its label and
 * namespace name now: after the inventory, the queues or a namespace's
 * annotation changed.
 */
void ext_queues_recharge(ext_state *st);
/*
 * p->queue from its label and its namespace (kgpu_queues_pick): a label
 * naming a queue the namespace may not use is not followed: the pod is
 * charged to its namespace's queue, and that is logged once.
 */
void ext_queues_name_pod(ext_state *st, ext_pod *p);
/*
 * A namespace's kgpu.io/queue annotation (NULL or "": none) and labels (a
 * JSON object, or NULL), for queue selection; both NULL forget it. At most
 * EXT_NS_LABELS_MAX labels are kept. Whether anything changed.
 */
#define EXT_NS_LABELS_MAX 64
bool ext_queues_set_namespace(ext_state *st, const char *ns, const char *queue,
                              const json_t *labels);
/*
 * The queue of a pod of namespace ns with label `label` (kgpu_queues_pick):
 * its name into name, and its id; -1 when queues are off; -2 when no queue
 * has that name or the namespace may not use it, with a reason for the
 * pod's event in why.
 */
int ext_queues_resolve(ext_state *st, const char *ns, const char *label, char *name, size_t len,
                       char *why, size_t whylen);
/*
 * Charges what p holds to p->queue (and its ancestors). A new bind
 * (running false) is refused past a limit: KGPU_ENOFIT, err in the words
 * of the fit reasons. A pod already running is never refused. No queue of
 * that name, or queues off: 0, nothing charged.
 */
int ext_queues_charge(ext_state *st, ext_pod *p, bool running, kgpu_error *err);
void ext_queues_uncharge(ext_state *st, ext_pod *p);
/*
 * kgpu_queues_check for the pod on node idx (its GPUs taken as the node's
 * first of an allowed model, so per-model limits apply; bind charges the
 * GPUs actually chosen), or with idx -1 for its request alone.
 */
int ext_queues_check(ext_state *st, int q, const kgpu_pod *pod, int idx, char *why, size_t len);

/*
 * DRA claims in queues (docs/queues.md "ResourceClaims"): an allocated
 * claim of gpu.kgpu.io is charged, as running, to the queue of the pod
 * it is reserved for (that pod's label, as ext_queues_resolve reads it),
 * else to its namespace's queue, with what its charged results hold.
 * Charge again (uncharging first) whenever its results change; uncharge
 * before it is released or freed.
 */
void ext_queues_charge_claim(ext_state *st, ext_dra_claim *c);
void ext_queues_uncharge_claim(ext_state *st, ext_dra_claim *c);
/*
 * The kgpu.io/queue label of a pod seen by the pod watch ("" none), kept
 * for the claims reserved for it (at most EXT_POD_QLABELS_MAX pods); a
 * change charges those claims again. _gone forgets the pod; _reset a
 * relist's items (a JSON array of pods) replace what was kept.
 */
#define EXT_POD_QLABELS_MAX 200000
void ext_queues_pod_label(ext_state *st, const char *uid, const char *label);
void ext_queues_pod_label_gone(ext_state *st, const char *uid);
void ext_queues_pod_labels_reset(ext_state *st, const json_t *items);

/* A pod reclaim evicts. */
typedef struct ext_victim {
    char uid[64], ns[64], name[KGPU_NAME_MAX + 1], node[KGPU_NAME_MAX + 1];
    char queue[KGPU_QUEUE_NAME_MAX + 1];
    int64_t freed_milli;
} ext_victim;

#define EXT_RECLAIM_VICTIMS_MAX 32 /* evictions one reclaim may ask for */

/*
 * A reclaim chosen for a waiting pod: its victims, and the room it frees,
 * held for that pod (reclaim_state.c "Holds").
 */
typedef struct ext_reclaim {
    double until; /* monotonic: when the entry ends; first (reclaim_state.c expire) */
    char for_uid[64], for_ns[64], for_name[KGPU_NAME_MAX + 1], for_queue[KGPU_QUEUE_NAME_MAX + 1];
    int nvictims;
    ext_victim v[EXT_RECLAIM_VICTIMS_MAX];
    bool freed; /* its victims are gone: the room is held until `until` (EXT_RECLAIM_HOLD_S) */
    char node[KGPU_NAME_MAX + 1];     /* where the waiting pod fits once they are gone */
    int ngpus;                        /* and on which GPUs (positions on that node) */
    int gpus[KGPU_MAX_GPUS_PER_NODE];
    kgpu_request req; /* its GPU request, compiled (no model globs: `models` holds them) */
    kgpu_qdemand demand; /* what it will take from its queue there: counted as in flight */
    bool move; /* a consolidation (consolidate.c): the victims are restartable, to run elsewhere */
} ext_reclaim;

enum ext_reclaim_result {
    EXT_RECLAIM_NONE,     /* nothing to evict makes room: msg says why */
    EXT_RECLAIM_APPLIED,  /* --cluster-file: victims gone from the state; place the pod again */
    EXT_RECLAIM_STARTED,  /* victims in *out, to evict through the API after the lock */
    EXT_RECLAIM_INFLIGHT, /* a reclaim for this pod is under way: msg says which */
    EXT_RECLAIM_SPOKEN,   /* reclaims under way for its queue's other pods take its guarantee */
};

/*
 * For a pod of queue q within its guarantee that fits no node (one GPU
 * container: reclaim places one request): chooses borrowing pods to evict
 * (kgpu_queues_reclaim, KGPU_RECLAIM_FRAG) among the held pods not being
 * evicted already nor protected by a PodDisruptionBudget lately. The
 * queues are judged as they will be: pods being evicted gone, and the
 * pods other reclaims under way are for charged where they will run, so a
 * guarantee is reclaimed for once (EXT_RECLAIM_SPOKEN otherwise). Only a
 * placement every limit on the pod's path lets it take (per model and
 * memory too, on the GPUs chosen) is reclaimed for. `apply`
 * (--cluster-file): releases them now, recorded as evictions. Otherwise
 * remembers the reclaim for the pod (EXT_RECLAIM_WAIT_S, then the hold)
 * and gives its victims in *out. msg: what the pod's filter answer says,
 * in words for the pod's owner: pods of other namespaces are not named.
 */
int ext_queues_reclaim(ext_state *st, const kgpu_pod *pod, int q, bool apply, ext_reclaim *out,
                       char *msg, size_t len);
/* Records one eviction's outcome: log, counters, the ring; 429 remembers the victim as refused. */
void ext_queues_evicted(ext_state *st, const ext_reclaim *r, const ext_victim *v, int outcome);
/*
 * Brings the reclaims remembered up to now: one whose victims are gone
 * starts holding its room (EXT_RECLAIM_HOLD_S); one whose pod holds GPUs
 * now, or whose time is up, ends. Verbs call it once before asking
 * ext_reclaim_hold_taken.
 */
void ext_reclaims_refresh(ext_state *st);

/*
 * Whether `reqs` (nreqs GPU requests of pod `uid`; 0 asks whether the
 * holds still fit as things are) would take room node idx holds for
 * another pod's reclaim: the held requests and these must fit together
 * once the held reclaims' victims there are gone. The hold taken
 * (borrowed), or NULL.
 */
const ext_reclaim *ext_reclaim_hold_taken(ext_state *st, int idx, const char *uid,
                                          const kgpu_request *const *reqs, int nreqs);
/* "waiting pod ns/name" for a pod of namespace `viewer`, else "a pod of another namespace". */
void ext_reclaim_hold_reason(const ext_reclaim *h, const char *viewer, char *buf, size_t len);

/*
 * A pod from the watch (trimmed, with its PodScheduled condition kept):
 * follows it while it is unbound, asks for GPUs and is unschedulable;
 * forgets it otherwise. Keeps the fields the sweep reads (ext_unsched), at
 * most EXT_UNSCHED_NS_MAX per namespace; a full table makes room from the
 * namespace with the most entries. Nothing while queues are known off.
 * Caller holds st->mu.
 */
void ext_unsched_seen(ext_state *st, const json_t *obj, const kgpu_pod *pod);
/* Forgets the pod (gone or bound). Caller holds st->mu. */
void ext_unsched_drop(ext_state *st, const char *uid);
/* Forgets every pod (a relist is about to show them again). Caller holds st->mu. */
void ext_unsched_clear(ext_state *st);
/* The pod an entry stands for, as the sweep reads it: one GPU part (none when it had several). */
void ext_unsched_pod(const ext_unsched *u, kgpu_pod *pod);

/* What one sweep decided for one pod, to carry out once st->mu is released. */
typedef struct ext_sweep_act {
    bool evict;         /* rec holds victims to evict */
    ext_reclaim rec;
    char ns[64], name[KGPU_NAME_MAX + 1], uid[64];
    const char *type, *reason; /* an Event to post about the pod, reason NULL: none */
    char message[256];
} ext_sweep_act;

/*
 * The leader's sweep over unschedulable pods: for each (highest priority,
 * then longest waiting, first; at most `max`) whose queue is within its
 * guarantee and whose GPU request fits no node, starts a reclaim as filter
 * would (ext_queues_reclaim). Fills acts[0..return) with the evictions and
 * Events to carry out. Caller holds st->mu; the sweep releases it for
 * EXT_SWEEP_YIELD_US whenever it has held it for st->sweep_slice_s, so
 * that no verb waits for a whole sweep (state may change between slices:
 * each pod is decided under one hold).
 */
int ext_unsched_sweep(ext_state *st, ext_sweep_act *acts, int max);

/* One queue as /inspect and /metrics show it. */
typedef struct ext_queue_row {
    char name[KGPU_QUEUE_NAME_MAX + 1], parent[KGPU_QUEUE_NAME_MAX + 1];
    int parent_row; /* the parent's index among the rows, -1 for a root */
    int depth, weight;
    kgpu_qamount guarantee, limit, used;
    int64_t borrowed_milli;
    int pods, pending;
    unsigned long long evictions;
} ext_queue_row;

/*
 * Copies every queue (in definition order; malloc'd, caller frees) and the recent
 * evictions (newest first; up to EXT_EVICTIONS_KEPT into ev). *rows NULL
 * and *n 0 when queues are off. false: out of memory.
 */
bool ext_queues_rows(ext_state *st, ext_queue_row **rows, int *n, ext_eviction *ev, int *nev);

/* ---- prioritize-gpuless without the lock (snapshot.c) ---- */

/*
 * Publishes a new snapshot of the cluster when the published one is stale
 * (another cluster, or a node changed since). Caller holds st->mu.
 */
void ext_gpuless_publish(ext_state *st);
/*
 * Without st->mu: 0-10 scores of nodes `names` (n) for a pod without a GPU
 * asking cpu_milli and memory_mib, from the published snapshot: nodes where
 * its CPU leaves their free GPUs short of CPU the least first. A node the
 * snapshot lacks, or that has not the CPU or memory, scores 0. false when
 * nothing was published yet (scores untouched).
 */
bool ext_gpuless_scores(ext_state *st, int64_t cpu_milli, int64_t memory_mib,
                        const char *const *names, int n, int *scores);
/* Frees every snapshot: no reader may be left. Caller holds st->mu (or is the last user). */
void ext_gpuless_free_all(ext_state *st);

/* ---- pods awaiting kubelet's Allocate (awaiting.c) ---- */

/* Whether the rule is on: allocate_wait > 0 and an API server (a cluster file has no kubelet). */
bool ext_await_enabled(const ext_state *st);
/*
 * Records a pod awaiting allocation on `node`, bound `age` seconds ago; for
 * a pod already recorded, only its node is refreshed (asks may then be NULL).
 * Caller holds st->mu, as for every ext_await_ call.
 */
void ext_await_record(ext_state *st, const char *uid, const char *ns, const char *name,
                      const char *node, const ext_asks *asks, double age);
void ext_await_drop(ext_state *st, const char *uid);
/* A pod from the API server (list or watch): starts, keeps or ends its wait. */
void ext_await_seen(ext_state *st, const json_t *json, const kgpu_pod *pod);
/* Ends the waits past allocate_wait, with a warning for each. */
void ext_await_expire(ext_state *st);
/* A pod other than `uid` awaiting allocation on `node` whose asks clash with `asks`, or NULL. */
const ext_await *ext_await_clash(ext_state *st, const char *node, const char *uid,
                                 const ext_asks *asks, ext_ask *same);
/* The same for every node at once: node name -> const ext_await* (borrowed) into `out`. */
void ext_await_clashing_nodes(ext_state *st, const char *uid, const ext_asks *asks,
                              kgpu_strmap *out);
/*
 * "waiting for kubelet to allocate NS/NAME (same RES: N); retry shortly" to a
 * pod of namespace `viewer` NS; to others "a pod of another namespace".
 */
void ext_await_reason(const ext_await *w, const ext_ask *same, const char *viewer, char *buf,
                      size_t len);
/* A relist: drops entries of pods not in it recorded before it was asked for. */
void ext_await_relisted(ext_state *st, const kgpu_strmap *present);

/* ---- DRA nodes and claims (dra_claims.c, dra_nodes.c) ---- */

/* A DRA node: its CPU and memory, which the slice has not, and by GPU position the MIG
 * instances its claims hold (dra_mig.c) and the hold keeping whole and shares off. */
typedef struct ext_dra_node {
    int64_t cpu_milli, memory_mib;
    kgpu_mig_gpu mig[KGPU_MAX_GPUS_PER_NODE];
    int mig_model[KGPU_MAX_GPUS_PER_NODE]; /* kgpu_mig_model_at index while mig_users > 0 */
    int mig_users[KGPU_MAX_GPUS_PER_NODE]; /* results charged on the GPU */
    kgpu_assignment hold[KGPU_MAX_GPUS_PER_NODE]; /* applied while mig_users > 0 */
} ext_dra_node;

/*
 * Caller holds st->mu for the rest. A node seen by the node reflector:
 * `dra` says whether it is labelled; a DRA node's spec gets its GPUs from
 * its slice into `gpus` (KGPU_MAX_GPUS_PER_NODE entries, pointing into
 * the state until the slice changes), a node that is not keeps its own.
 */
void ext_dra_node_seen(ext_state *st, kgpu_node_spec *spec, bool dra, kgpu_gpu_spec *gpus);
void ext_dra_node_gone(ext_state *st, const char *name);
/* A node relist: forgets every DRA node; the list's are seen again right after. */
void ext_dra_nodes_clear(ext_state *st);
/* Whether `name` is a DRA node (labelled). */
bool ext_dra_is_node(const ext_state *st, const char *name);

/* Slices: one seen (copied), one gone, a relist (n slices, copied). */
void ext_dra_slice_put(ext_state *st, const ext_dra_slice *s);
void ext_dra_slice_gone(ext_state *st, const char *name, const char *node);
void ext_dra_slices_reset(ext_state *st, const ext_dra_slice *s, int n);

/* Claims: one seen (taken over), one gone, a relist (n taken over: the set is replaced). */
void ext_dra_claim_put(ext_state *st, ext_dra_claim *c);
void ext_dra_claim_gone(ext_state *st, const char *ns, const char *name);
void ext_dra_claims_reset(ext_state *st, ext_dra_claim **c, int n);

/* The cluster was rebuilt (ext_state_set_nodes): charges every claim again. */
void ext_dra_cluster_rebuilt(ext_state *st);
/* Charges the results not charged yet (a node joined, GPUs were released). */
void ext_dra_retry(ext_state *st);

/* One request of class gpu.kgpu.io of a pod's claims: what prioritize scores (dra_score.c). */
typedef struct ext_dra_ask {
    const ext_dra_claim *claim; /* borrowed from st->dra_claims: valid while st->mu is held */
    const ext_dra_request *req; /* one of claim->req */
    int k;                      /* its place among them, for reasons */
} ext_dra_ask;

/*
 * For prioritize: every request of class gpu.kgpu.io of the claims of a pod
 * with spec.resourceClaims (resolved through the claims held; claims
 * allocated already are charged and left out): n > 0 asks (at most max);
 * 0 when the pod has no resourceClaims; -1 when it has some but none gives
 * a request kgpu can score, or one that kgpu does not score (allocationMode
 * All, more than max), `why` naming the pod and the claim.
 */
int ext_dra_pod_asks(ext_state *st, const json_t *pod, ext_dra_ask *asks, int max, char *why,
                     size_t len);
/* The kgpu request of claim request q (uncompiled): a whole GPU unless it names its memory. */
void ext_dra_request_of(const ext_dra_request *q, kgpu_request *req);
/*
 * For filter-gpuless: what the pod's claims of class gpu.kgpu.io that are
 * not allocated yet will take from its queue (their requests' totals; a
 * request of allocationMode All as the most GPUs a DRA node has). 1 and *d
 * when there is such a claim, else 0 (no claim of kgpu's, or every one
 * allocated, hence charged already); `why` names a claim not resolved.
 */
int ext_dra_pod_demand(ext_state *st, const json_t *pod, kgpu_qdemand *d, char *why, size_t len);

#endif
