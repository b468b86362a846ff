/*
 * kgpu-extender, base layer: what every layer above uses and nothing below
 * it needs: the configuration, logging, the clock, the metrics counters, and
 * the shape of a reply. Depends only on the core and src/common.
 *
 * Layers, bottom first (docs/architecture.md "The extender's layers"):
 *   base.h -> sources.h -> state.h -> decide.h -> serve.h -> daemon.h
 * Each file of a layer includes its layer's header; a call never goes up.
 * Metrics counters are atomics, written by any thread without a lock.
 */
#ifndef KGPU_EXT_BASE_H
#define KGPU_EXT_BASE_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"
#include "kgpu/queue.h"

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
    int bind_doubt_s;     /* a Binding without a usable answer keeps its GPUs this long; 60 */
    /*
     * Consolidation: for a pod that fits nowhere, the leader may evict up to
     * this many kgpu.io/restartable pods of one node so that it fits, the
     * moved pods fitting elsewhere (consolidate.c); 0 (the default) off.
     */
    int consolidate_moves;
    /*
     * The scale-down guard (guard.c): seconds between two checks of which
     * GPU nodes must not be removed; 0 off. 30.
     */
    int scale_down_guard_s;
    /*
     * Consolidation to fewer nodes (guard.c): the guard's round may evict
     * every GPU pod of one node whose pods are all kgpu.io/restartable and
     * could all run on the other nodes, so that an autoscaler removes it.
     */
    bool consolidate_nodes;
    /* POST /mutate/pods gives GPU pods this schedulerName (kgpu's own scheduler); "" off. */
    char route_pods_to[64];
    /* This cluster's name in POST /estimate's answer (the MultiKueueCluster's); "" none. */
    char cluster_name[64];
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
    /*
     * Prices per GPU-hour by model and capacity type (--prices, `prices:`;
     * the format of docs/autoscaling.md): read once the flags are parsed
     * (owned; NULL: no cost series, GPU-seconds only).
     */
    char prices_file[EXT_PATH_MAX];
    struct kgpu_prices *prices;
    /*
     * The node groups an autoscaler can grow here (--node-groups,
     * `nodeGroups:` a path; nodegroups.h): POST /estimate's `grow`. Read
     * once the flags are parsed (owned; NULL: none, no growth reported).
     */
    char node_groups_file[EXT_PATH_MAX];
    struct kgpu_node_groups *node_groups;
} ext_config;

/* Defaults, then the YAML file (if --config), then flags, as the last word. */
void ext_config_defaults(ext_config *cfg);
int ext_config_load_file(ext_config *cfg, const char *path, kgpu_error *err);
/* Frees what the configuration owns (queues, namespaceQueues, prices). */
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

/* malloc_trim(0), serialised (log.c): for threads that just dropped a large parse tree. */
void ext_malloc_trim(void);

/* ---- metrics ---- */

/*
 * VERB_PRIORITIZE_GPULESS: prioritize for the pods that ask for no GPU
 * (prioritize.c); VERB_FILTER_GPULESS: filter for them, which holds DRA
 * pods to their GPU queue (verbs.c).
 */
enum ext_verb {
    VERB_FILTER,
    VERB_PRIORITIZE,
    VERB_BIND,
    VERB_PREEMPT,
    VERB_PRIORITIZE_GPULESS,
    VERB_FILTER_GPULESS,
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
    BIND_FAIL_IN_DOUBT, /* an earlier Binding of the pod to another node may still be applied */
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
    atomic_ullong assignments_refused;  /* annotations giving more than the pod asks */
    atomic_ullong consolidations;       /* consolidations started (evictions asked) */
    atomic_ullong consolidation_moves;  /* their evictions the API server accepted */
    atomic_int guard_nodes;             /* nodes the scale-down guard's last round kept */
    atomic_ullong nodes_emptied;        /* nodes --consolidate-nodes started to empty */
    atomic_ullong doubts_ended[3];      /* binds in doubt, by how they ended (enum ext_doubt_end) */
    /* The serving layer (http.c). */
    atomic_ullong http_refused[EXT_HTTP_REFUSED_COUNT]; /* answered before the body was read */
    atomic_int metrics_streams;                          /* /metrics answers being sent */
    atomic_ullong http_deadline_closes; /* connections shut at requestTimeoutSeconds */
    atomic_llong http_connections;      /* open on the scheduling listener */
    atomic_ullong http_accepted;        /* connections accepted there, ever (TLS handshakes) */
    atomic_llong http_buffered;         /* bytes of request bodies charged now */
    atomic_llong http_buffered_peak;    /* the most ever charged at once */
} ext_metrics;

/* Upper bounds (seconds) of the latency histogram's buckets; the last bucket is +Inf. */
extern const double ext_hist_bounds[EXT_HIST_BUCKETS];
void ext_metrics_observe(ext_metrics *m, enum ext_verb v, double seconds);
const char *ext_verb_name(enum ext_verb v);
const char *ext_bind_fail_name(enum ext_bind_fail f);

/* Monotonic seconds. */
double ext_now(void);

/* ---- replies (reply.c): what a request handler answers ---- */

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
/* r answers `status` with the JSON text body (malloc'd, taken over); NULL: 500, out of memory. */
void ext_reply_json_text(ext_response *r, int status, char *body);
/* r answers `status` with v as JSON (v is taken over); 500 when out of memory. */
void ext_reply_json(ext_response *r, int status, json_t *v);
/* r answers `status` with text/plain. */
void ext_reply_text(ext_response *r, int status, const char *text);
/* Depth of JSON nesting in text (outside strings); stops counting past limit. */
int ext_json_depth(const char *text, size_t len, int limit);
/*
 * A pod as a message posted on a pod of namespace `viewer` may name it:
 * same_prefix then "NS/NAME" when the namespaces are the same, else "a pod
 * of another namespace" (also for a NULL viewer): tenants learn nothing of
 * each other's pods. Returns buf.
 */
const char *ext_pod_for_viewer(const char *ns, const char *name, const char *viewer,
                               const char *same_prefix, char *buf, size_t len);

/* ---- CEL selectors of DRA requests (dra_cel.c; docs/install-dra.md) ---- */

#define EXT_CEL_LEN_MAX   1024 /* bytes of one expression kgpu reads; a longer one is not read */
#define EXT_CEL_DEPTH_MAX 12   /* nesting of parentheses and negations */
#define EXT_CEL_NODES_MAX 96   /* operators, operands and list items of one expression */

enum ext_cel_type {
    EXT_CEL_BOOL = 1,
    EXT_CEL_INT,
    EXT_CEL_STR,
    EXT_CEL_QTY,
    EXT_CEL_VER, /* a semantic version (semver) */
    EXT_CEL_LIST,
};
/* A semantic version as an EXT_CEL_VER's i: major, minor, patch of 0..1023 each. */
#define EXT_CEL_SEMVER(maj, min, patch)                                                            \
    (((int64_t)(maj) << 20) | ((int64_t)(min) << 10) | (int64_t)(patch))

/* A value a selector reads or computes. */
typedef struct ext_cel_value {
    int type;      /* enum ext_cel_type */
    bool b;        /* BOOL */
    int64_t i;     /* INT; QTY in whole units (memory: bytes); VER as EXT_CEL_SEMVER */
    const char *s; /* STR, borrowed */
} ext_cel_value;

/*
 * A device as a selector sees it: its driver, and get() for an attribute
 * (cap false) or a capacity of domain gpu.kgpu.io by name: true and *out
 * (of the type dra_cel.c's table gives the name), false when the device has
 * none. Borrowed for the call.
 */
typedef struct ext_cel_device {
    const char *driver;
    bool (*get)(const void *ctx, bool cap, const char *name, ext_cel_value *out);
    const void *ctx;
} ext_cel_device;

/* A compiled selector. Owned by its caller (ext_cel_free); read-only, so thread-safe to share. */
typedef struct ext_cel ext_cel;

/*
 * Compiles the subset of CEL that GPU selectors are written in (dra_cel.c's
 * opening comment): the expression or NULL, with why it is not understood
 * (or "out of memory") in why. Never guesses: anything outside the subset
 * is refused. Pure; fuzz_cel.
 */
ext_cel *ext_cel_compile(const char *expr, char *why, size_t len);
void ext_cel_free(ext_cel *e);
/* Its terms: what one evaluation costs at most, in steps. */
int ext_cel_terms(const ext_cel *e);
/* 1 the device matches, 0 not, -1 CEL would fail (an attribute the device has not). */
int ext_cel_eval(const ext_cel *e, const ext_cel_device *d);

#endif
