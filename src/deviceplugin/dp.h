/*
 * kgpu-device-plugin: kubelet's device plugin API v1beta1 for the node's GPUs.
 *
 * Modules:
 *   devices.c  device IDs per resource, the ListAndWatch message, preferred
 *              allocations (pure)
 *   match.c    which pod and container an Allocate belongs to, from a fresh
 *              list of the node's pods (pure)
 *   respond.c  the container's environment, mounts and limits file (pure
 *              text; files written by dp_write_pod_files)
 *   grpcsrv.c  gRPC core servers, one per resource, and the Register client
 *   plugin.c   the daemon: inventory and health, sockets, API server calls
 *   node.c     what the DRA driver (src/dra) shares with it (node.h): the
 *              common flags, main(), the contract's host paths, the API
 *              server connection, the fake inventory's polling
 *   watcher.c, watchparse.c, metricsrv.c
 *              the node's watcher and its /metrics (watcher.h): real GPU use
 *              per container against its share, with --watch-config
 *
 * Threads and ownership:
 *   - The main thread (dp_run) owns the inventory, health and the servers'
 *     life cycle (start, restart on a kubelet restart, stop). It publishes
 *     each resource's device list as an encoded ListAndWatch message in a
 *     dp_snapshot (mutex; generation counter).
 *   - With an API server, one API thread publishes the node's annotation and
 *     labels whenever the inventory's generation moves on (with backoff) and
 *     removes gone pods' directories every minute, so a slow API server
 *     never delays the main loop.
 *   - Each resource's server has one completion-queue thread that accepts
 *     calls and streams ListAndWatch: it polls the snapshot generation at
 *     least every 100 ms and sends the newest message to every stream.
 *   - With --watch-config, the watcher thread owns the watcher's state and
 *     libmicrohttpd's thread serves /metrics from its published text
 *     (watcher.h says how); neither touches the plugin's state.
 *   - Each unary call (options, preferred allocation, Allocate) runs on a
 *     short-lived worker thread so a slow API server never delays health
 *     updates. Allocate workers serialise on the plugin's allocate mutex:
 *     kubelet admits one pod at a time anyway, and the list-match-annotate
 *     sequence must not interleave.
 */
#ifndef KGPU_DP_H
#define KGPU_DP_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu.h"
#include "kgpu/error.h"
#include "kgpu/model.h"

/* The resources the plugin can register; each has its own socket. */
typedef enum dp_res {
    DP_RES_MEM,   /* kgpu.io/gpu-mem: one device per memory unit per GPU */
    DP_RES_CORE,  /* kgpu.io/gpu-core: one device per percent per GPU */
    DP_RES_WHOLE, /* nvidia.com/gpu: one device per GPU (optional) */
    DP_RES_ALIAS, /* aliyun.com/gpu-mem: as gpu-mem, for gpushare manifests (optional) */
    DP_NRES
} dp_res;

const char *dp_res_name(dp_res r);   /* "kgpu.io/gpu-mem" */
const char *dp_res_socket(dp_res r); /* "kgpu-gpu-mem.sock" */
/* The resource with this name, or -1. */
int dp_res_from_name(const char *name);

/* kubelet's gRPC messages are limited to 4 MiB; ListAndWatch stays under a quarter. */
#define DP_MAX_LIST_BYTES (1u << 20)
#define DP_CORE_DEVICES   100 /* kgpu.io/gpu-core devices per GPU */

/* Container paths of what Allocate mounts. */
#define DP_LIMITS_PATH  "/etc/kgpu/limits"
#define DP_SHARED_PATH  "/var/run/kgpu"
#define DP_SHIM_PATH    "/usr/lib/kgpu/libkgpu-limit.so"
#define DP_PRELOAD_PATH "/etc/ld.so.preload"
/* The node-wide GPU schedules (src/shim/gpusched.h): <dir>/<uuid>.sched, one per GPU. */
#define DP_SCHED_PATH "/var/run/kgpu-gpu"
/* MPS mode: the MPS control daemon's pipe directory, in the container (NVIDIA's default). */
#define DP_MPS_PIPE_PATH "/tmp/nvidia-mps"

/* Annotation with the (container, resource) pairs served so far. */
#define DP_ANN_ALLOCATING "kgpu.io/allocating"

/* ---- devices.c ---- */

/* The node's GPUs and the size of one memory unit. */
typedef struct dp_inventory {
    int ngpus;
    kgpu_gpu_info gpus[KGPU_MAX_GPUS_PER_NODE];
    int64_t unit_mib;
} dp_inventory;

/* Devices GPU `g` contributes to resource r. */
int64_t dp_devices_per_gpu(const dp_inventory *inv, int g, dp_res r);

/* Writes device ID k of GPU g for resource r into buf. */
void dp_device_id(const dp_inventory *inv, int g, dp_res r, int64_t k, char *buf, size_t cap);

/*
 * The GPU (position in inv) a device ID of resource r belongs to, or -1 when
 * the ID is not one of the current devices.
 */
int dp_device_gpu(const dp_inventory *inv, dp_res r, const char *id);

/*
 * Encodes the ListAndWatchResponse for resource r (every device with its
 * GPU's health and NUMA node). *out is malloc'd. Fails (KGPU_ERANGE) when the
 * message would exceed DP_MAX_LIST_BYTES, naming the unit to use instead.
 */
int dp_list_encode(const dp_inventory *inv, dp_res r, uint8_t **out, size_t *len, kgpu_error *err);

/* What a matched container should get on each GPU, for steering. */
typedef struct dp_want {
    int n;                                 /* GPUs; 0 = no target, pack */
    int gpu[KGPU_MAX_GPUS_PER_NODE];       /* positions in the inventory */
    int64_t count[KGPU_MAX_GPUS_PER_NODE]; /* devices wanted on each */
} dp_want;

/*
 * Chooses `size` devices: every must-include ID first, then IDs on the
 * wanted GPUs up to their counts, then the rest packed GPU by GPU (the GPU
 * with the fewest available devices first, so whole GPUs stay free).
 * `chosen` receives indices into avail; returns how many (≤ size).
 */
int dp_prefer(const dp_inventory *inv, dp_res r, const char *const *avail, int navail,
              const char *const *must, int nmust, int size, const dp_want *want, int *chosen);

/* ---- match.c ---- */

/* One GPU of a matched container. */
typedef struct dp_gpu_share {
    int index; /* host index */
    char uuid[KGPU_GPU_UUID_MAX]; /* as discovery's: a GPU's UUID is never cut */
    int milli;
    int64_t memory_mib;
} dp_gpu_share;

/* The pod and container an Allocate (or preferred allocation) belongs to. */
typedef struct dp_match {
    char ns[KGPU_NAME_MAX + 1];
    char name[KGPU_NAME_MAX + 1];
    char uid[64];
    char container[64];
    bool init;
    bool exclusive;
    int ngpus;
    dp_gpu_share gpus[KGPU_MAX_GPUS_PER_NODE];
    int64_t count;       /* devices kubelet hands out for this resource */
    int64_t pod_units;   /* the pod's kgpu.io/gpu-mem units over all app containers */
    bool primary;        /* this resource carries the container's env and mounts */
    bool complete;       /* after this one, every (container, resource) is served */
    char progress[1024]; /* the new kgpu.io/allocating value */
} dp_match;

/*
 * Finds the unique pod on `node` in `items` (the items of a pod list) that
 * awaits kubelet's allocation of `count` devices of resource r: the pod has
 * kgpu.io/assignment (for this node), no kgpu.io/allocated, is not
 * terminal, and its next container in kubelet's order (init containers,
 * then app containers) that asks for r and has not been served r asks
 * exactly `count`. `registered` is a mask of (1 << dp_res) the plugin
 * serves. Zero or several candidates is an error naming them (KGPU_ENOENT,
 * KGPU_EAMBIG); a malformed annotation of a candidate is KGPU_EPARSE.
 */
int dp_match_find(const json_t *items, const char *node, dp_res r, int64_t count,
                  unsigned registered, int64_t unit_mib, dp_match *out, kgpu_error *err);

/* ---- respond.c ---- */

typedef struct dp_kv {
    char key[48];
    char value[512];
} dp_kv;

typedef struct dp_mount {
    char container_path[256];
    char host_path[1024];
    bool read_only;
} dp_mount;

/*
 * Mounts a container can get: limits, accounting, library, preload, and one
 * schedule per GPU or the MPS pipe directory.
 */
#define DP_MAX_MOUNTS (5 + KGPU_MAX_GPUS_PER_NODE)
#define DP_MAX_ENV    16

/* How containers sharing a GPU are held to their compute shares. */
typedef enum dp_sharing {
    DP_SHARING_SCHED = 0, /* the library's turns through each GPU's schedule file */
    DP_SHARING_MPS,       /* NVIDIA MPS: active-thread percentage and pinned memory per client */
} dp_sharing;

/* "sched" or "mps" -> *out; -1 for anything else. */
int dp_sharing_parse(const char *s, dp_sharing *out);

/* What one container gets. */
typedef struct dp_response {
    int nenv;
    dp_kv env[DP_MAX_ENV];
    int nmounts;
    dp_mount mounts[DP_MAX_MOUNTS];
} dp_response;

typedef struct dp_paths {
    const char *state_dir;    /* host: pods/<uid>/..., ld.so.preload */
    const char *shim_lib;     /* host path of libkgpu-limit.so, NULL = no interception */
    const char *mps_pipe_dir; /* host: MPS mode's pipe directory; NULL = schedule-file mode */
} dp_paths;

/*
 * MPS mode needs the node's MPS control daemon: 0 when `dir` holds its
 * control pipe (a FIFO named "control"), else KGPU_ENOENT saying what to do.
 */
int dp_mps_check(const char *dir, kgpu_error *err);

/* The limits file text (`# kgpu limits v1` and one line per visible GPU); malloc'd. */
char *dp_limits_text(const dp_match *m);

/* Env and mounts for a matched container (empty unless m->primary). */
void dp_response_build(const dp_match *m, const dp_inventory *inv, const dp_paths *paths,
                       dp_response *out);

/*
 * Creates <state>/pods/<uid>/shared, writes <state>/pods/<uid>/<container>.limits
 * and, for each GPU on which the container has a compute share, makes sure
 * of <state>/sched/<uuid>.sched (dp_sched_shared).
 */
int dp_write_pod_files(const dp_match *m, const dp_paths *paths, kgpu_error *err);

/*
 * Whether the container's share of GPU i is a compute share, which the
 * library enforces through that GPU's schedule, mounted read-write.
 */
bool dp_sched_shared(const dp_match *m, int i);

/* Encodes a response as an AllocateResponse holding `n` containers. */
int dp_allocate_encode(const dp_response *resp, int n, uint8_t **out, size_t *len);

/* ---- grpcsrv.c ---- */

/* The current ListAndWatch message of one resource. */
typedef struct dp_snapshot {
    pthread_mutex_t mu;
    uint64_t gen; /* bumped on every change */
    uint8_t *buf;
    size_t len;
} dp_snapshot;

/* A gRPC status and message for a failed call. */
typedef struct dp_status {
    int code; /* grpc_status_code; 0 = OK */
    char message[1024];
} dp_status;

/*
 * A unary method: `in` is the request's bytes; on success *out (malloc'd)
 * holds the response's. Runs on a worker thread; `ctx` is the server's.
 */
typedef void (*dp_unary_fn)(void *ctx, const char *method, const uint8_t *in, size_t len,
                            uint8_t **out, size_t *outlen, dp_status *st);

typedef struct dp_server dp_server;

/*
 * Serves the unix socket `path` (removed first if stale). `name` (copied)
 * begins the server's log lines: the resource it serves ("kgpu.io/gpu-mem"),
 * or for a server that is no device plugin what else it is.
 */
dp_server *dp_server_start(const char *path, const char *name, dp_snapshot *snap,
                           dp_unary_fn unary, void *ctx, kgpu_error *err);
/* Cancels every call, waits for workers and removes the socket. */
void dp_server_stop(dp_server *s);

/* Calls kubelet's Registration/Register on `kubelet_sock`. */
int dp_register(const char *kubelet_sock, const char *endpoint, dp_res r, bool preferred,
                unsigned timeout_ms, kgpu_error *err);

void dp_grpc_init(void);
void dp_grpc_shutdown(void);

/* ---- plugin.c ---- */

/* The flags both node daemons take, with the same meaning (node.h). */
typedef struct dp_node_config {
    char node_name[KGPU_NAME_MAX + 1];
    char kubeconfig[1024];
    char fake_gpus[1024];
    char nvml_lib[1024];
    char sysfs[1024];
    char state_dir[1024];
    char shim_lib[1024]; /* "" = <state_dir>/lib/libkgpu-limit.so; "none" = off */
    int64_t unit_mib;    /* the device plugin's memory unit, gpushare's env unit */
    dp_sharing sharing;  /* compute shares: schedule files or NVIDIA MPS */
    char mps_pipe_dir[1024]; /* host: with DP_SHARING_MPS */
} dp_node_config;

typedef struct dp_config {
    dp_node_config node;
    char plugin_dir[1024];
    bool whole_gpus;
    bool gpushare_alias;
    bool no_api; /* never talk to an API server (tests) */
    char watch_config[1024]; /* the watcher's config file (watcher.h); "" = no watcher */
} dp_config;

/* Runs the daemon until *stop; 0 on a clean stop. */
int dp_run(const dp_config *cfg, atomic_bool *stop, kgpu_error *err);

/* Logging shared by the modules. */
typedef enum dp_level { DP_DEBUG, DP_INFO, DP_WARN, DP_ERROR } dp_level;
extern dp_level dp_log_level;
void dp_log(dp_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
