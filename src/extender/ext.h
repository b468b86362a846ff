/*
 * kgpu-extender internals: configuration, the cluster state kube-scheduler's
 * calls read and change, metrics, the HTTP handlers and server.
 *
 * Threads and ownership:
 * - HTTP requests run on http.c's handler threads (libmicrohttpd's epoll
 *   threads only read and write the sockets). They
 *   parse and serialise JSON without any lock, and take the state mutex only
 *   for in-memory work (fit, score, reserve, release): microseconds, never
 *   across I/O. A bind reserves under the lock, calls the API server without
 *   it, then confirms or releases under the lock: binds proceed in parallel.
 * - In API-server mode two reflector threads (nodes, pods) feed watch events
 *   into the state under the same mutex; so do two more for DRA (dra.c):
 *   ResourceSlices of driver gpu.kgpu.io (the DRA nodes' GPUs) and
 *   ResourceClaims (what kube-scheduler's allocator gave out on them). Each
 *   parses its objects outside the lock and takes it only to put the result in.
 * - Metrics counters are atomics, written by any thread without the lock.
 */
#ifndef KGPU_EXT_H
#define KGPU_EXT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "k8s.h"
#include "kgpu/policy.h"
#include "kgpu/queue.h"
#include "podspec.h"
#include "strmap.h"

#define EXT_PATH_MAX 1024

typedef struct ext_config {
    char listen[256]; /* ADDR:PORT; default 0.0.0.0:12346 */
    char config_file[EXT_PATH_MAX];
    char cluster_file[EXT_PATH_MAX];
    char kubeconfig[EXT_PATH_MAX];
    char policy[32];         /* default policy; "fgd" */
    int64_t memory_unit_mib; /* one kgpu.io/gpu-mem unit; 1024 */
    char tls_cert[EXT_PATH_MAX], tls_key[EXT_PATH_MAX], tls_client_ca[EXT_PATH_MAX];
    int log_level;                /* 0 error, 1 warn, 2 info, 3 debug */
    long max_body_bytes;          /* request bodies; 16 MiB (a 5,000-node NodeList is ~10 MiB) */
    int max_json_depth;           /* 64 */
    int max_connections;          /* 1024 */
    int pending_pods_max;         /* pods remembered from filter for their bind; 1024 */
    char sa_dir[EXT_PATH_MAX];    /* service account folder (tests); "" = standard */
    char port_file[EXT_PATH_MAX]; /* write the bound port here once serving (tests, --listen :0) */
    bool leader_elect;            /* run as one of several replicas, the leader serving binds */
    char lease_ns[64], lease_name[64];
    int lease_duration_s; /* 15 */
    int allocate_wait_s;  /* a bound pod holds back same-size pods on its node this long; 0 off */
    /* The serving layer (http.c); docs/install-extender.md "Limits" has the memory sums. */
    char probe_listen[256];         /* ADDR:PORT of /healthz and /readyz; "" none; :12347 */
    bool probe_listen_given;        /* set by the file or a flag, not the default */
    int max_connections_per_client; /* connections from one IP address; 256 */
    int request_timeout_s;          /* a whole request, read, within this of its start; 30 */
    long max_buffered_bytes;        /* request bodies held across all connections; 64 MiB */
    int max_node_names;             /* NodeNames or Nodes.items per call; 20000 */
    int serve_threads;              /* epoll I/O threads; 0: one thread per connection; 2 */
    int handler_threads;            /* threads running the handlers (one more for large bodies); 16 */
    /*
     * GPU queues of --cluster-file mode, from the file's `queues:` (owned;
     * moved into the state by ext_daemon_start; NULL: queues off), and
     * `namespaceQueues:` ({namespace: queue}, owned, or NULL), standing for
     * the namespaces' kgpu.io/queue annotations. In cluster mode both keys
     * are errors: queues come from GPUQueue objects there.
     */
    kgpu_queues *queues;
    json_t *namespace_queues;
} ext_config;

/* Defaults, then the YAML file (if --config), then flags, as the last word. */
void ext_config_defaults(ext_config *cfg);
int ext_config_load_file(ext_config *cfg, const char *path, kgpu_error *err);
/* Frees what the configuration owns (queues, namespaceQueues). */
void ext_config_free(ext_config *cfg);
/* Parses argv; returns 0, or 1 after printing help, or a negative error. */
int ext_config_parse_args(ext_config *cfg, int argc, char **argv, kgpu_error *err);

/* Logging to stderr, one line per call, at or below cfg's level. Thread-safe. */
void ext_log_set_level(int level);
void ext_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define EXT_ERROR 0
#define EXT_WARN  1
#define EXT_INFO  2
#define EXT_DEBUG 3

/* malloc_trim(0), serialised (daemon.c): for the reflectors' threads. */
void ext_malloc_trim(void);

/* ---- metrics ---- */

/* VERB_PRIORITIZE_GPULESS: prioritize for the pods that ask for no GPU (handlers.c). */
enum ext_verb {
    VERB_FILTER,
    VERB_PRIORITIZE,
    VERB_BIND,
    VERB_PREEMPT,
    VERB_PRIORITIZE_GPULESS,
    VERB_OTHER,
    VERB_COUNT
};
enum ext_bind_fail {
    BIND_FAIL_BAD_REQUEST,
    BIND_FAIL_UNKNOWN_POD,
    BIND_FAIL_UNKNOWN_NODE,
    BIND_FAIL_NO_FIT,
    BIND_FAIL_API_CONFLICT,
    BIND_FAIL_API_ERROR,
    BIND_FAIL_API_UNREACHABLE,
    BIND_FAIL_STANDBY,
    BIND_FAIL_AWAITING, /* a same-size pod on the node still waits for kubelet's Allocate */
    BIND_FAIL_COUNT
};
enum ext_http_refused {
    EXT_HTTP_REFUSED_TOO_LARGE,       /* 413: over maxBodyBytes */
    EXT_HTTP_REFUSED_BUSY,            /* 503: over maxBufferedBytes */
    EXT_HTTP_REFUSED_BAD_FRAMING,     /* 400: bad Content-Length, or one with Transfer-Encoding */
    EXT_HTTP_REFUSED_UNAUTHENTICATED, /* 403: no client certificate */
    EXT_HTTP_REFUSED_COUNT
};
#define EXT_HIST_BUCKETS 15

typedef struct ext_hist {
    atomic_ullong bucket[EXT_HIST_BUCKETS + 1]; /* last = +Inf */
    atomic_ullong count;
    atomic_ullong sum_ns;
} ext_hist;

typedef struct ext_metrics {
    atomic_ullong requests[VERB_COUNT];
    atomic_ullong bad_requests[VERB_COUNT]; /* requests kube-scheduler would not send: 400 */
    atomic_ullong invalid_pods[VERB_COUNT]; /* pods whose GPU request kgpu cannot honour */
    ext_hist latency[VERB_COUNT];
    atomic_ullong bind_failures[BIND_FAIL_COUNT];
    atomic_ullong watch_restarts[2];    /* nodes, pods */
    atomic_ullong assignment_conflicts; /* annotations that would overbook a GPU */
    /* The serving layer (http.c). */
    atomic_ullong http_refused[EXT_HTTP_REFUSED_COUNT]; /* answered before the body was read */
    atomic_int metrics_streams;                          /* /metrics answers being sent */
    atomic_ullong http_deadline_closes; /* connections shut at requestTimeoutSeconds */
    atomic_llong http_connections;      /* open on the scheduling listener */
    atomic_llong http_buffered;         /* bytes of request bodies charged now */
    atomic_llong http_buffered_peak;    /* the most ever charged at once */
} ext_metrics;

void ext_metrics_observe(ext_metrics *m, enum ext_verb v, double seconds);
const char *ext_verb_name(enum ext_verb v);
const char *ext_bind_fail_name(enum ext_bind_fail f);

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

/* Per-namespace GPU-hours, integrated over time. */
typedef struct ext_ns_usage {
    double gpus; /* held now */
    double gpu_seconds;
} ext_ns_usage;

typedef struct ext_shape_info {
    kgpu_shape s;
    long count; /* observations */
    /* The rest of the shape's key (state.c shape_key) besides s's fields. */
    bool exclusive;
    int milli; /* the request's gpu_milli (s.gpu_milli is 1000 for a whole GPU) */
    int64_t memory_mib;
    bool open; /* no allow list: a model the mask has no bit for yet counts as allowed */
} ext_shape_info;

/*
 * What kubelet's device plugin Allocate calls for a pod will carry: for each
 * device-plugin resource, the count of devices one container asks for.
 * kubelet names devices, never the pod, so the device plugin tells pods
 * apart by these counts alone (see awaiting.c).
 */
enum ext_res { EXT_RES_WHOLE, EXT_RES_MEM, EXT_RES_CORE };

typedef struct ext_ask {
    int res;        /* enum ext_res; aliyun.com/gpu-mem counts as kgpu.io/gpu-mem */
    int64_t amount; /* whole GPUs, memory units or compute percent; never 0 */
} ext_ask;

#define EXT_ASKS_MAX 32

/* A pod's asks over all its containers, init containers included: a small sorted set. */
typedef struct ext_asks {
    int n;
    bool overflow;           /* more distinct asks than fit: clashes with any pod asking one */
    ext_ask a[EXT_ASKS_MAX]; /* sorted by (res, amount), distinct */
} ext_asks;

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
#define EXT_RECLAIM_WAIT_S 60  /* a reclaim in flight is not repeated for its pod this long */
#define EXT_REFUSED_S      30  /* a victim whose eviction was refused is skipped this long */

/*
 * A pod kube-scheduler found no node for (its PodScheduled condition False,
 * Unschedulable), seen through the pod watch in cluster mode. Its own
 * filters (NodeResourcesFit: "Insufficient nvidia.com/gpu") may have
 * refused every node before kgpu's filter is called, so reclaim for it
 * cannot wait for a filter call: the leader's sweep (gpuqueues.c) runs it.
 */
typedef struct ext_unsched {
    double since; /* monotonic: first seen unschedulable; first (queues.c expire) */
    char uid[64], ns[64], name[KGPU_NAME_MAX + 1];
    json_t *pod;      /* the trimmed object, owned */
    double event_at;  /* monotonic: when the last Event was posted about it (0: none) */
    char event[256];  /* that Event's message: the same one is not posted again soon */
} ext_unsched;

#define EXT_UNSCHED_MAX     4096 /* unschedulable pods followed at once; more are not swept */
#define EXT_SWEEP_MS        2000 /* how often the leader looks at them */
#define EXT_SWEEP_PODS      16   /* reclaims started per sweep, highest priority first */
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
    kgpu_strmap pending; /* uid -> ext_filtered*, from filter, for bind; at most pending_pods_max */
    ext_filtered *pending_oldest, *pending_newest; /* least and most recently filtered */
    kgpu_strmap awaiting;  /* uid -> ext_await*: pods kubelet has yet to allocate devices for */
    kgpu_strmap observed;  /* uids counted by observe(), at most OBSERVED_MAX (state.c) */
    char **observed_order; /* FIFO of observed uids (owned; the map's keys are copies) */
    int observed_head, observed_len;
    kgpu_strmap ns_usage; /* namespace -> ext_ns_usage* */
    double usage_at;      /* monotonic seconds of the last integration */
    kgpu_rng rng;
    bool nodes_synced, pods_synced;
    /* GPU queues (queues.c); queues NULL: off, every pod in `default`, nothing refused. */
    kgpu_queues *queues;      /* the tree with usage */
    kgpu_queues *queues_spec; /* the same tree without usage, rebuilt from on every change */
    unsigned long long *queue_evictions; /* by queue id: evictions of its pods, ever */
    kgpu_strmap ns_queue;     /* namespace -> its kgpu.io/queue (char *, owned) */
    ext_eviction evictions[EXT_EVICTIONS_KEPT]; /* ring of the most recent */
    int evictions_next, nevictions;
    kgpu_strmap reclaims; /* waiting pod uid -> ext_reclaim* (queues.c), at most EXT_RECLAIMS_MAX */
    kgpu_strmap refused;  /* victim uid -> its refusal (queues.c), at most EXT_REFUSED_MAX */
    kgpu_strmap unsched;  /* uid -> ext_unsched*: unschedulable GPU pods, at most EXT_UNSCHED_MAX */
    char queues_error[KGPU_ERROR_MSG_MAX]; /* why the last tree given was refused; "" */
    /* Cluster mode (gpuqueues.c): GPUQueues by name, cut to name, generation, spec, status. */
    json_t *gpuqueues;
    bool gpuqueue_crd_absent; /* the API server answered 404 for GPUQueues */
    /* DRA (dra.c): nodes served by kgpu-dra-plugin, their slices, and the claims on them. */
    kgpu_strmap dra_nodes;  /* node -> ext_dra_node*: labelled kgpu.io/gpu-allocator=dra */
    kgpu_strmap dra_slices; /* node (the pool) -> ext_dra_slice* of driver gpu.kgpu.io */
    kgpu_strmap dra_claims; /* "ns/name" -> ext_dra_claim*: claims of gpu.kgpu.io only */
    int dra_unapplied;      /* allocation results not charged now (node or GPU unknown, full) */
    bool dra_absent[2];     /* the API server answered 404 for resourceslices, resourceclaims */
} ext_state;

int ext_state_init(ext_state *st, const ext_config *cfg, ext_metrics *m, kgpu_error *err);
void ext_state_destroy(ext_state *st);

/* Monotonic seconds. */
double ext_now(void);

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
 * The same for a request built elsewhere (a DRA pod's, dra.c): compiled,
 * given a shape id, and counted as the arrival of pod `uid`. Caller holds st->mu.
 */
int ext_state_compile_request(ext_state *st, const char *uid, kgpu_request *req, kgpu_error *err);
/*
 * The spec of inventory node i as it stands (gpus: KGPU_MAX_GPUS_PER_NODE
 * entries), pointing into the cluster: valid until it changes. For
 * rebuilding the inventory with some nodes replaced. Caller holds st->mu.
 */
void ext_state_node_spec(const ext_state *st, int i, kgpu_node_spec *spec, kgpu_gpu_spec *gpus);

/* The pod's requests without CPU and memory, for fit checks: tmp and out have pod->nparts room. */
void ext_fit_requests(const kgpu_pod *pod, kgpu_request *tmp, const kgpu_request **out);

/* The policy for a pod: its kgpu.io/policy annotation, else the configured default. */
kgpu_policy *ext_state_policy(ext_state *st, const kgpu_pod *pod, kgpu_error *err);

/*
 * Copies a kgpu_pod: its request and pattern pointers point into the struct
 * itself, so a plain assignment would leave them pointing into the source.
 */
void ext_pod_copy(kgpu_pod *dst, const kgpu_pod *src);

/*
 * Remembers a pod from filter (copied, with its asks) for its bind, as the
 * most recently filtered; past pending_pods_max the least recently filtered
 * is forgotten (its bind then asks the API server for the pod, see
 * handlers.c bind_pod). Returns the entry (borrowed, NULL when out of
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

/* Brings per-namespace GPU-seconds up to now. Caller holds st->mu. */
void ext_state_integrate_usage(ext_state *st);

/* ---- GPU queues (queues.c; docs/queues.md). Caller holds st->mu unless said. ---- */

/* A v1 Pod's kgpu.io/queue label into label ("" without one) and its spec.priority (0). */
void ext_pod_queue_fields(const json_t *pod, char *label, size_t len, int *priority);
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
/* p->queue from its label and its namespace's annotation (kgpu_queue_name_for). */
void ext_queues_name_pod(ext_state *st, ext_pod *p);
/* A namespace's kgpu.io/queue annotation; NULL or "" clears it. */
void ext_queues_set_namespace(ext_state *st, const char *ns, const char *queue);
/*
 * The queue of a pod of namespace ns with label `label` (kgpu_queue_name_for):
 * its name into name, and its id; -1 when queues are off; -2 when no queue
 * has that name, with a reason for the pod's event in why.
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

/* A pod reclaim evicts. */
typedef struct ext_victim {
    char uid[64], ns[64], name[KGPU_NAME_MAX + 1], node[KGPU_NAME_MAX + 1];
    char queue[KGPU_QUEUE_NAME_MAX + 1];
    int64_t freed_milli;
} ext_victim;

#define EXT_RECLAIM_VICTIMS_MAX 32 /* evictions one reclaim may ask for */

/* A reclaim chosen for a waiting pod. */
typedef struct ext_reclaim {
    double until; /* monotonic: not repeated for the pod before; first (queues.c expire) */
    char for_uid[64], for_ns[64], for_name[KGPU_NAME_MAX + 1], for_queue[KGPU_QUEUE_NAME_MAX + 1];
    int nvictims;
    ext_victim v[EXT_RECLAIM_VICTIMS_MAX];
} ext_reclaim;

enum ext_reclaim_result {
    EXT_RECLAIM_NONE,     /* nothing to evict makes room: msg says why */
    EXT_RECLAIM_APPLIED,  /* --cluster-file: victims gone from the state; place the pod again */
    EXT_RECLAIM_STARTED,  /* victims in *out, to evict through the API after the lock */
    EXT_RECLAIM_INFLIGHT, /* a reclaim for this pod is under way: msg says which */
};

/*
 * For a pod of queue q within its guarantee that fits no node (one GPU
 * container: reclaim places one request): chooses borrowing pods to evict
 * (kgpu_queues_reclaim, KGPU_RECLAIM_FRAG) among the held pods not being
 * evicted already nor protected by a PodDisruptionBudget lately. `apply`
 * (--cluster-file): releases them now, recorded as evictions. Otherwise
 * remembers the reclaim for the pod (EXT_RECLAIM_WAIT_S) and gives its
 * victims in *out. msg: what the pod's filter answer says.
 */
int ext_queues_reclaim(ext_state *st, const kgpu_pod *pod, int q, bool apply, ext_reclaim *out,
                       char *msg, size_t len);
/* Records one eviction's outcome: log, counters, the ring; 429 remembers the victim as refused. */
void ext_queues_evicted(ext_state *st, const ext_reclaim *r, const ext_victim *v, int outcome);

/*
 * A pod from the watch (trimmed, with its PodScheduled condition kept):
 * follows it while it is unbound, asks for GPUs and is unschedulable;
 * forgets it otherwise. Caller holds st->mu.
 */
void ext_unsched_seen(ext_state *st, const json_t *obj, const kgpu_pod *pod);
/* Forgets the pod (gone or bound). Caller holds st->mu. */
void ext_unsched_drop(ext_state *st, const char *uid);
/* Forgets every pod (a relist is about to show them again). Caller holds st->mu. */
void ext_unsched_clear(ext_state *st);

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
 * Events to carry out. Caller holds st->mu.
 */
int ext_unsched_sweep(ext_state *st, ext_sweep_act *acts, int max);

/* One queue as /inspect and /metrics show it. */
typedef struct ext_queue_row {
    char name[KGPU_QUEUE_NAME_MAX + 1], parent[KGPU_QUEUE_NAME_MAX + 1];
    int depth, weight;
    kgpu_qamount guarantee, limit, used;
    int64_t borrowed_milli;
    int pods, pending;
    unsigned long long evictions;
} ext_queue_row;

/*
 * Copies every queue (tree order; malloc'd, caller frees) and the recent
 * evictions (newest first; up to EXT_EVICTIONS_KEPT into ev). *rows NULL
 * and *n 0 when queues are off. false: out of memory.
 */
bool ext_queues_rows(ext_state *st, ext_queue_row **rows, int *n, ext_eviction *ev, int *nev);

/* ---- pods awaiting kubelet's Allocate (awaiting.c) ---- */

/* The asks of a v1 Pod's containers. Reads what it can: the pod was validated elsewhere. */
void ext_asks_from_json(const json_t *pod, ext_asks *out);
/* Whether x and y share an ask (resource and amount); *same (may be NULL) gets the first. */
bool ext_asks_clash(const ext_asks *x, const ext_asks *y, ext_ask *same);
/* "kgpu.io/gpu-mem" and the like. */
const char *ext_res_name(int res);

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
/* "waiting for kubelet to allocate NS/NAME (same RES: N); retry shortly" */
void ext_await_reason(const ext_await *w, const ext_ask *same, char *buf, size_t len);
/* A relist: drops entries of pods not in it recorded before it was asked for. */
void ext_await_relisted(ext_state *st, const kgpu_strmap *present);

/* ---- DRA nodes and claims (dra.c; docs/install-dra.md "kgpu's scores on DRA nodes") ---- */

#define EXT_DRA_DRIVER      "gpu.kgpu.io" /* kgpu-dra-plugin's driver name */
#define EXT_DRA_CLASS       "gpu.kgpu.io" /* the DeviceClass kgpu's claims name */
#define EXT_DRA_LABEL       "kgpu.io/gpu-allocator"
#define EXT_DRA_LABEL_VALUE "dra"
/* Why a DRA node serves no device-plugin pod (filter's reason, bind's error). */
#define EXT_DRA_NODE_REASON                                                                        \
    "a DRA node (" EXT_DRA_LABEL "=" EXT_DRA_LABEL_VALUE "): its GPUs are given out through "      \
    "ResourceClaims of class " EXT_DRA_CLASS ", not as kgpu.io/gpu-mem or nvidia.com/gpu"
#define EXT_DRA_DEVICE_MAX  64     /* a device name is a DNS label */
#define EXT_DRA_REQUESTS    8      /* requests of one claim kept (the driver's own bound) */
#define EXT_DRA_RESULTS     32     /* allocation results of one claim (the driver's own bound) */
#define EXT_DRA_CLAIMS_MAX  200000 /* claims held at once; more are ignored, logged */

/* A node labelled for DRA: its CPU and memory, which the slice has not. */
typedef struct ext_dra_node {
    int64_t cpu_milli, memory_mib;
} ext_dra_node;

/* One device of a slice of gpu.kgpu.io. */
typedef struct ext_dra_device {
    char name[EXT_DRA_DEVICE_MAX]; /* gpu-<index> */
    int index;                     /* attribute index */
    char uuid[KGPU_UUID_MAX];
    char model[KGPU_MODEL_NAME_MAX]; /* productName (else model) */
    int64_t memory_mib;              /* capacity memory (else attribute memoryMiB) */
    int numa;                        /* attribute numaNode, -1 without */
} ext_dra_device;

/* A ResourceSlice of gpu.kgpu.io: one node's pool. */
typedef struct ext_dra_slice {
    char name[KGPU_NAME_MAX + 1]; /* the object's */
    char node[KGPU_NAME_MAX + 1]; /* spec.nodeName, which is the pool's name too */
    int64_t generation;           /* spec.pool.generation: the newest of two slices wins */
    int ndevices;
    ext_dra_device devices[KGPU_MAX_GPUS_PER_NODE];
} ext_dra_slice;

/* A request of a claim of class gpu.kgpu.io (spec.devices.requests[].exactly). */
typedef struct ext_dra_request {
    int count;          /* exactly.count, 1 by default */
    bool all;           /* allocationMode All */
    int64_t memory_mib; /* capacity.requests.memory, rounded up; 0: none (the whole GPU's) */
    int cores;          /* capacity.requests.cores, percent; 0 by default */
} ext_dra_request;

/* A device of gpu.kgpu.io allocated to a claim (status.allocation.devices.results[]). */
typedef struct ext_dra_result {
    char pool[KGPU_NAME_MAX + 1];
    char device[EXT_DRA_DEVICE_MAX];
    int64_t memory_mib; /* consumedCapacity.memory, rounded up; -1: none given (the whole GPU) */
    int cores;          /* consumedCapacity.cores, percent; 0 without */
    bool applied;       /* charged to the cluster now, as `a` */
    kgpu_assignment a;
} ext_dra_result;

/* A ResourceClaim that names gpu.kgpu.io, cut to what kgpu reads. One block: free() it. */
typedef struct ext_dra_claim {
    char ns[64], name[KGPU_NAME_MAX + 1], uid[64];
    char error[200]; /* why it cannot be read (then nreq and nres are 0); "" */
    int nreq;        /* requests of class gpu.kgpu.io under `exactly` */
    int nres;        /* results of driver gpu.kgpu.io */
    bool warned;     /* a result that could not be charged was logged */
    ext_dra_request req[EXT_DRA_REQUESTS];
    ext_dra_result res[]; /* nres */
} ext_dra_claim;

/*
 * Parsers of outside input (fuzz_extdra). A ResourceSlice: 0 and *out
 * filled when it is gpu.kgpu.io's; KGPU_ENOENT for another driver's;
 * KGPU_EPARSE with err naming the slice and the field when malformed.
 */
int ext_dra_slice_parse(const json_t *obj, ext_dra_slice *out, kgpu_error *err);
/*
 * A ResourceClaim: *out (malloc'd, caller frees) when it names class or
 * driver gpu.kgpu.io, with (*out)->error set when the rest cannot be read;
 * *out NULL for anyone else's claim. KGPU_EPARSE without a namespace and a
 * name, KGPU_ENOMEM. Pure: no state, no lock.
 */
int ext_dra_claim_parse(const json_t *obj, ext_dra_claim **out, kgpu_error *err);

/* Whether a v1 Node is labelled kgpu.io/gpu-allocator=dra. */
bool ext_dra_node_labelled(const json_t *node);

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

/*
 * For prioritize: the kgpu request of a pod with spec.resourceClaims (its
 * first request of class gpu.kgpu.io, resolved through the claims held):
 * 1 and *req (uncompiled, the pod's CPU and memory not set) when there is
 * one; 0 when the pod has no resourceClaims; -1 when it has some but none
 * gives a request kgpu can score, `why` naming the pod and the claim.
 */
int ext_dra_pod_request(ext_state *st, const json_t *pod, kgpu_request *req, char *why,
                        size_t len);

/* ---- the daemon ---- */

typedef struct ext_daemon {
    ext_config cfg;
    ext_metrics metrics;
    ext_state state;
    kgpu_k8s *k8s; /* NULL in cluster-file mode */
    atomic_bool stop;
    pthread_t watch_threads[8]; /* nodes, pods; in cluster mode GPUQueues, namespaces, status,
                                   sweep, ResourceSlices, ResourceClaims */
    int nwatch;
    struct ext_http *http; /* the serving layer (http.c) */
    int port;              /* the port actually bound */
    int probe_port;        /* the probe listener's, 0 without one */
    atomic_bool leader; /* with leader election: this replica holds the lease */
    char identity[256];
    pthread_t leader_thread;
    bool leader_running;
    char *tls_cert_pem, *tls_key_pem, *tls_ca_pem;
} ext_daemon;

/*
 * The serving layer (http.c): both listeners, their threads and limits.
 * Start after the configuration is final; stop answers what is queued.
 */
int ext_http_start(ext_daemon *d, kgpu_error *err);
void ext_http_stop(ext_daemon *d);

/*
 * Cluster mode's GPU queues (gpuqueues.c): threads that list and watch
 * GPUQueue objects and namespaces, one that keeps the GPUQueues' status
 * current and one that sweeps unschedulable pods for reclaim (the leader
 * only). Started by ext_daemon_start with an
 * API server; they end with d->stop.
 */
int ext_gpuqueues_start(ext_daemon *d, kgpu_error *err);
/*
 * Cluster mode's DRA reflectors (dra.c): ResourceSlices of gpu.kgpu.io and
 * ResourceClaims, listed and watched; without resource.k8s.io/v1 (404) DRA
 * is off, said once, and looked for again at the reflector's backoff. They end with d->stop.
 */
int ext_dra_start(ext_daemon *d, kgpu_error *err);
/* A GPUQueue's status as the extender would write it now (tests and the status writer). */
json_t *ext_gpuqueue_status(const ext_queue_row *row, long long generation, const char *error,
                            const json_t *old_status, const char *now);

/* Evicts r's victims through the Eviction API, recording each outcome (takes d->state.mu). */
void ext_evict_victims(ext_daemon *d, const ext_reclaim *r);

/* Loads inventory (cluster file) or starts watching (API server), then serves. */
int ext_daemon_start(ext_daemon *d, kgpu_error *err);
void ext_daemon_stop(ext_daemon *d);

/* True once inventory and pods are known and, with leader election, this replica leads (readyz). */
bool ext_daemon_ready(ext_daemon *d);

/* Leader election on a Lease (leader.c); needs the API server. */
int ext_leader_start(ext_daemon *d, kgpu_error *err);
void ext_leader_stop(ext_daemon *d);
/* Whether this replica may reserve GPUs now. */
static inline bool ext_is_leader(ext_daemon *d)
{
    return !d->cfg.leader_elect || atomic_load(&d->leader);
}

/* ---- handlers: JSON in, JSON out. Return the HTTP status; *out is a new string. ---- */

/*
 * A body made piece by piece while it is sent, instead of whole beforehand
 * (/metrics of 40,000 GPUs is ~25 MB of text). read() fills up to max bytes
 * and returns how many, 0 at the end or -1 on error; it runs on the HTTP
 * layer's thread, one call at a time, and owns ctx until free(ctx).
 */
typedef struct ext_stream {
    long (*read)(void *ctx, char *buf, size_t max);
    void (*free)(void *ctx);
    void *ctx;
} ext_stream;

typedef struct ext_response {
    int status;
    const char *content_type;
    char *body;        /* malloc'd */
    ext_stream stream; /* read non-NULL: the body, instead of `body` */
} ext_response;

/* Drops what r holds (body or stream) unsent. */
void ext_response_discard(ext_response *r);

void ext_handle(ext_daemon *d, const char *method, const char *url, const char *body, size_t len,
                ext_response *r);

/* Depth of JSON nesting in text (outside strings); stops counting past limit. */
int ext_json_depth(const char *text, size_t len, int limit);

/*
 * The Prometheus text exposition of everything the extender measures, as a
 * stream: every family but the per-GPU ones rendered
 * now, the per-GPU ones written line by line from a snapshot of the GPUs
 * (~130 bytes a GPU) as the client reads, so a scrape costs the snapshot, not
 * the text. At most EXT_METRICS_STREAMS at once (each holds a snapshot
 * until its client has read it): false when that many are open or out of
 * memory, with *busy saying which.
 */
#define EXT_METRICS_STREAMS 4
bool ext_metrics_stream(ext_daemon *d, ext_stream *out, bool *busy);

/* The /inspect document: every node (or one: name non-NULL) with GPUs and pods. NULL if unknown. */
json_t *ext_inspect_json(ext_daemon *d, const char *node);

#endif
