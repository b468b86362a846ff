/*
 * The node's watcher (issue 14, part 3): what every GPU process on the node
 * really uses, from NVML, against the share the plugin handed its container
 * at Allocate. The interception library inside a container can be bypassed
 * by hostile code (static binaries, direct ioctls); the driver's own
 * per-process figures cannot. docs/install-device-plugin.md, "The watcher",
 * is the operator's page.
 *
 *   watchparse.c  the two parsers of outside input: the watcher's config
 *                 file and a process's /proc/<pid>/cgroup (pure, fuzzed)
 *   watchmap.c    which container a GPU process belongs to, and its share
 *   watchmetrics.c  the metrics text the watcher publishes
 *   watchact.c    Events and kills for a container over its share
 *   watcher.c     the watcher thread: life cycle, NVML, the scan
 *                 (the four share watchstate.h, internal)
 *   metricsrv.c   /metrics over HTTP (libmicrohttpd)
 *
 * On a GPU in MIG mode the unit is the MIG device: NVML lists each process
 * with its GPU and compute instance, and the container kubelet gave that
 * device (its checkpoint, which kubelet alone writes) has the instance's
 * whole memory as its share; any other pod's process there is over a share
 * of zero, as on a GPU kgpu did not give it.
 *
 * Mapping a GPU process to its container: the kernel's record of the
 * process's cgroup names the pod UID and the container runtime's container
 * ID (a container cannot move itself out of its cgroup, and the file is the
 * kernel's, not the container's). The pod's directory under the state
 * directory holds one limits file per container, written by Allocate: that
 * is the share. The container's name (which the limits file is named by)
 * comes from the pod's status.containerStatuses[].containerID, listed from
 * the API server; kubelet's pod-resources API was not used because it names
 * containers and devices but not container IDs or processes, so it cannot
 * join a PID to a container, and the limits files already say which GPUs
 * each container got.
 *
 * Threads and ownership: one watcher thread owns everything in a
 * dp_watcher except `pub` (its NVML handle, the container table, the pod
 * cache, counters). After each scan it renders the whole metrics text and
 * swaps it into `pub` under pub_mu; /metrics readers (libmicrohttpd's
 * threads) only copy that text under the same mutex, so a reader never sees
 * half a scan and never waits for one (the mutex is held for a pointer swap
 * or a memcpy of a few kilobytes). Without dp_watcher_start the caller's
 * thread is the owner (tests call dp_watcher_scan themselves).
 */
#ifndef KGPU_DP_WATCHER_H
#define KGPU_DP_WATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"

/* ---- configuration (watchparse.c) ---- */

typedef enum dp_enforce {
    DP_ENFORCE_NONE, /* metrics and Events only */
    DP_ENFORCE_KILL, /* also SIGKILL the GPU processes of a container over its memory share */
} dp_enforce;

#define DP_WATCH_LISTEN_MAX 128
#define DP_WATCH_PATH_MAX   512
#define DP_WATCH_EXEMPT_MAX 16

/* The watcher's config file (YAML or JSON); see dp_watch_config_parse. */
typedef struct dp_watch_config {
    double interval_s;        /* intervalSeconds: between scans, 0.1..3600 (default 5) */
    dp_enforce enforce;       /* enforce: none | kill (default none) */
    int64_t memory_slack_mib; /* memorySlackMiB: tolerated above the memory share (default 0) */
    int core_slack_pct;       /* coreSlackPercent: points tolerated above the core share (10) */
    int core_grace_scans;     /* coreGraceScans: scans in a row over before it counts (3) */
    bool events;              /* events: post Kubernetes Events (default true) */
    char listen[DP_WATCH_LISTEN_MAX];  /* metricsListen: "ADDR:PORT", "" = no /metrics */
    char proc_root[DP_WATCH_PATH_MAX]; /* procRoot: the host's /proc (default /proc) */
    /*
     * exemptNamespaces: namespaces whose pods may use GPUs kgpu did not
     * allocate them (the GPU Operator's validators, say); every other pod's
     * GPU process without a share is over a share of zero.
     */
    int nexempt;
    char exempt[DP_WATCH_EXEMPT_MAX][64];
} dp_watch_config;

void dp_watch_config_defaults(dp_watch_config *c);

/*
 * Parses a config document (every key optional, unknown keys refused: a
 * misspelt `enforce` must not silently mean none). `name` labels errors
 * ("watch.yaml: enforce: expected none or kill, not 'kil'"). On error *c
 * holds the defaults.
 */
int dp_watch_config_parse(const char *buf, size_t len, const char *name, dp_watch_config *c,
                          kgpu_error *err);
int dp_watch_config_load(const char *path, dp_watch_config *c, kgpu_error *err);

/* ---- /proc/<pid>/cgroup (watchparse.c) ---- */

#define DP_POD_UID_MAX      37 /* 36 characters and the NUL */
#define DP_CONTAINER_ID_MAX 65 /* 64 hex digits and the NUL */

typedef struct dp_cgroup_id {
    char pod_uid[DP_POD_UID_MAX];           /* lower case, dashes: "0f3c...-..." */
    char container_id[DP_CONTAINER_ID_MAX]; /* the runtime's ID, 64 lower-case hex digits */
} dp_cgroup_id;

/*
 * Finds the pod UID and container ID in the text of /proc/<pid>/cgroup
 * (cgroup v1 or v2; kubelet's cgroupfs or systemd driver; containerd, CRI-O
 * or Docker scopes; paths relative to a cgroup namespace, "/../.."
 * included). KGPU_OK with *out filled; KGPU_ENOENT when the process is not
 * in a pod's container (a host process, a runtime's conmon); KGPU_EPARSE
 * when the text is not a cgroup file or names two different containers.
 */
int dp_cgroup_parse(const char *text, size_t len, dp_cgroup_id *out, kgpu_error *err);

/* ---- the watcher (watcher.c) ---- */

struct kgpu_k8s;
typedef struct dp_watcher dp_watcher;

/* Where the watcher's inputs come from; strings are copied. */
typedef struct dp_watch_sources {
    struct kgpu_k8s *k8s;  /* borrowed, thread-safe; NULL: no names, no Events */
    const char *node_name; /* this node ("" without an API server) */
    const char *state_dir; /* the plugin's state directory: pods/<uid>/<container>.limits */
    const char *nvml_lib;  /* NULL or "": libnvidia-ml.so.1 */
    /*
     * kubelet's device manager checkpoint (kubeletckpt.h): which container
     * kubelet gave each MIG device. NULL or "": MIG devices' processes are
     * not judged (no share known).
     */
    const char *kubelet_ckpt;
} dp_watch_sources;

/*
 * A watcher with its own NVML handle (opened at the first scan, and again
 * after a failure: a driver being reinstalled is not fatal). Returns NULL
 * only when out of memory.
 */
dp_watcher *dp_watcher_new(const dp_watch_config *cfg, const dp_watch_sources *src,
                           kgpu_error *err);

/* Starts the watcher thread, which scans every interval until dp_watcher_free. */
int dp_watcher_start(dp_watcher *w, kgpu_error *err);

/* One scan, on the owner's thread (only without dp_watcher_start). */
int dp_watcher_scan(dp_watcher *w, kgpu_error *err);

/*
 * The newest metrics text (Prometheus text format 0.0.4), a malloc'd copy
 * the caller frees; *len its length. Any thread, any time.
 */
char *dp_watcher_metrics(dp_watcher *w, size_t *len);

/* Stops the thread (if started), closes NVML, frees everything. NULL is fine. */
void dp_watcher_free(dp_watcher *w);

/* ---- /metrics (metricsrv.c) ---- */

typedef struct dp_metrics_server dp_metrics_server;

/*
 * Serves GET /metrics (the watcher's text) and GET /healthz on `listen`
 * ("0.0.0.0:9402", "[::]:9402", "127.0.0.1:0" for any free port) from
 * libmicrohttpd's own thread, at most 16 connections, 10 s each.
 */
dp_metrics_server *dp_metrics_server_start(const char *listen, dp_watcher *w, kgpu_error *err);
/* The port it listens on (useful with port 0). */
int dp_metrics_server_port(const dp_metrics_server *s);
void dp_metrics_server_stop(dp_metrics_server *s);

#endif
