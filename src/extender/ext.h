/*
 * kgpu-extender internals: configuration, the cluster state kube-scheduler's
 * calls read and change, metrics, the HTTP handlers and server.
 *
 * Threads and ownership:
 * - HTTP requests run on libmicrohttpd's threads (one per connection). They
 *   parse and serialise JSON without any lock, and take the state mutex only
 *   for in-memory work (fit, score, reserve, release): microseconds, never
 *   across I/O. A bind reserves under the lock, calls the API server without
 *   it, then confirms or releases under the lock: binds proceed in parallel.
 * - In API-server mode two reflector threads (nodes, pods) feed watch events
 *   into the state under the same mutex.
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
} ext_config;

/* Defaults, then the YAML file (if --config), then flags, as the last word. */
void ext_config_defaults(ext_config *cfg);
int ext_config_load_file(ext_config *cfg, const char *path, kgpu_error *err);
/* Parses argv; returns 0, or 1 after printing help, or a negative error. */
int ext_config_parse_args(ext_config *cfg, int argc, char **argv, kgpu_error *err);

/* Logging to stderr, one line per call, at or below cfg's level. Thread-safe. */
void ext_log_set_level(int level);
void ext_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define EXT_ERROR 0
#define EXT_WARN  1
#define EXT_INFO  2
#define EXT_DEBUG 3

/* ---- metrics ---- */

enum ext_verb { VERB_FILTER, VERB_PRIORITIZE, VERB_BIND, VERB_PREEMPT, VERB_OTHER, VERB_COUNT };
enum ext_bind_fail {
    BIND_FAIL_BAD_REQUEST,
    BIND_FAIL_UNKNOWN_POD,
    BIND_FAIL_UNKNOWN_NODE,
    BIND_FAIL_NO_FIT,
    BIND_FAIL_API_CONFLICT,
    BIND_FAIL_API_ERROR,
    BIND_FAIL_API_UNREACHABLE,
    BIND_FAIL_STANDBY,
    BIND_FAIL_COUNT
};
#define EXT_HIST_BUCKETS 15

typedef struct ext_hist {
    atomic_ullong bucket[EXT_HIST_BUCKETS + 1]; /* last = +Inf */
    atomic_ullong count;
    atomic_ullong sum_ns;
} ext_hist;

typedef struct ext_metrics {
    atomic_ullong requests[VERB_COUNT];
    atomic_ullong bad_requests[VERB_COUNT];
    ext_hist latency[VERB_COUNT];
    atomic_ullong bind_failures[BIND_FAIL_COUNT];
    atomic_ullong watch_restarts[2];    /* nodes, pods */
    atomic_ullong assignment_conflicts; /* annotations that would overbook a GPU */
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
    int n;
    kgpu_assigned_part parts[];
} ext_orphan;

/* Per-namespace GPU-hours, integrated over time. */
typedef struct ext_ns_usage {
    double gpus; /* held now */
    double gpu_seconds;
} ext_ns_usage;

typedef struct ext_shape_info {
    kgpu_shape s;
    long count; /* observations */
} ext_shape_info;

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
    double relist_started; /* when the pod relist in progress was asked for (0: first list) */
    kgpu_strmap pending;   /* uid -> kgpu_pod*, from filter, for bind */
    char **pending_order;  /* FIFO of pending uids, for eviction */
    int pending_head, pending_len;
    kgpu_strmap ns_usage; /* namespace -> ext_ns_usage* */
    double usage_at;      /* monotonic seconds of the last integration */
    kgpu_rng rng;
    bool nodes_synced, pods_synced;
} ext_state;

int ext_state_init(ext_state *st, const ext_config *cfg, ext_metrics *m, kgpu_error *err);
void ext_state_destroy(ext_state *st);

/* Monotonic seconds. */
double ext_now(void);

/*
 * Replaces the node inventory (cluster-file load, node relist, a node's
 * inventory changing): rebuilds the cluster and re-applies every held pod
 * whose node still exists. Caller holds st->mu.
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

/* Compiles the pod's requests against the cluster and gives them shape ids. Caller holds st->mu. */
int ext_state_compile(ext_state *st, kgpu_pod *pod, kgpu_error *err);

/* The policy for a pod: its kgpu.io/policy annotation, else the configured default. */
kgpu_policy *ext_state_policy(ext_state *st, const kgpu_pod *pod, kgpu_error *err);

/*
 * Copies a kgpu_pod: its request and pattern pointers point into the struct
 * itself, so a plain assignment would leave them pointing into the source.
 */
void ext_pod_copy(kgpu_pod *dst, const kgpu_pod *src);

/* Remembers a pod from filter (copied) for its bind. Caller holds st->mu. */
void ext_state_remember(ext_state *st, const kgpu_pod *pod);
/* The remembered pod, or NULL. Borrowed; valid while st->mu is held. */
const kgpu_pod *ext_state_recall(ext_state *st, const char *uid);

/*
 * Reserves GPUs for `pod` on `node` with its policy. *out points at what the
 * pod now holds (borrowed: valid while st->mu is held). Returns KGPU_EEXIST
 * when the uid already holds GPUs (then *out is what it holds). Caller holds st->mu.
 */
int ext_state_reserve(ext_state *st, const kgpu_pod *pod, const char *node, const ext_pod **out,
                      kgpu_error *err);
/* The bind went through: the reservation becomes a binding. */
void ext_state_confirm(ext_state *st, const char *uid);
/* Drops whatever uid holds. */
void ext_state_release(ext_state *st, const char *uid);

/* Brings per-namespace GPU-seconds up to now. Caller holds st->mu. */
void ext_state_integrate_usage(ext_state *st);

/* ---- the daemon ---- */

typedef struct ext_daemon {
    ext_config cfg;
    ext_metrics metrics;
    ext_state state;
    kgpu_k8s *k8s; /* NULL in cluster-file mode */
    atomic_bool stop;
    pthread_t watch_threads[2];
    int nwatch;
    struct MHD_Daemon *mhd;
    int port;           /* the port actually bound */
    atomic_bool leader; /* with leader election: this replica holds the lease */
    char identity[256];
    pthread_t leader_thread;
    bool leader_running;
    char *tls_cert_pem, *tls_key_pem, *tls_ca_pem;
} ext_daemon;

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

typedef struct ext_response {
    int status;
    const char *content_type;
    char *body; /* malloc'd */
} ext_response;

void ext_handle(ext_daemon *d, const char *method, const char *url, const char *body, size_t len,
                ext_response *r);

/* Depth of JSON nesting in text (outside strings); stops counting past limit. */
int ext_json_depth(const char *text, size_t len, int limit);

/* Prometheus text exposition of everything the extender measures. */
char *ext_metrics_render(ext_daemon *d);

/* The /inspect document: every node (or one: name non-NULL) with GPUs and pods. NULL if unknown. */
json_t *ext_inspect_json(ext_daemon *d, const char *node);

#endif
