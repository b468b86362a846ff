/*
 * kgpu-device-plugin: kubelet's device plugin API v1beta1 for the node's GPUs.
 * What a container gets (env, mounts, limits file) is the container contract
 * (src/contract); the flags, main(), the gRPC servers and the API server
 * connection are the node agents' (src/nodeagent), shared with the DRA driver.
 *
 * Modules, bottom first:
 *   devices.c   device IDs per resource, the ListAndWatch message, preferred
 *               allocations (pure)
 *   migdev.c    static MIG (--mig-strategy): which existing instances are
 *               advertised, under which resource, and what Allocate answers (pure)
 *   match.c     which pod and container an Allocate belongs to, from a fresh
 *               list of the node's pods (pure)
 *   respond.c   the AllocateResponse carrying the contract to kubelet (pure)
 *   register.c  the Register call to kubelet
 *   watchparse.c, watchmap.c, watchmetrics.c, watchact.c, watcher.c,
 *   metricsrv.c the node's watcher and its /metrics (watcher.h): real GPU use
 *               per container against its share, with --watch-config
 *   kubeapi.c, allocate.c, apithread.c, plugin.c
 *               the daemon (plugin.h): API server calls, kubelet's unary
 *               calls, the API thread, and the main loop that owns them
 *
 * Threads and ownership:
 *   - The main thread (dp_run) owns the inventory, health and the servers'
 *     life cycle (start, restart on a kubelet restart, stop). It publishes
 *     each resource's device list as an encoded ListAndWatch message in a
 *     node_snapshot (mutex; generation counter).
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

#include "contract.h"
#include "gpu.h"
#include "kgpu/error.h"
#include "kgpu/mig.h"
#include "kgpu/model.h"
#include "nodeagent.h"

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
/* The streamed method: kubelet's device list, sent again on every change. */
#define DP_LIST_AND_WATCH "/v1beta1.DevicePlugin/ListAndWatch"

/* Annotation with the (container, resource) pairs served so far. */
#define DP_ANN_ALLOCATING "kgpu.io/allocating"

/* ---- devices.c ---- */

/* Devices GPU `g` contributes to resource r. */
int64_t dp_devices_per_gpu(const contract_inventory *inv, int g, dp_res r);

/* Writes device ID k of GPU g for resource r into buf. */
void dp_device_id(const contract_inventory *inv, int g, dp_res r, int64_t k, char *buf, size_t cap);

/*
 * The GPU (position in inv) a device ID of resource r belongs to, or -1 when
 * the ID is not one of the current devices.
 */
int dp_device_gpu(const contract_inventory *inv, dp_res r, const char *id);

/*
 * Whether kubelet's devices `ids` (of resource r, for one container) cover
 * the GPUs t was assigned: each of t's GPUs must hold one of them (all but
 * ngpus - n when there are fewer devices than GPUs). -1 when they do, else
 * the position in t->gpus of the first GPU kubelet gave no device of: an
 * assignment naming GPUs kubelet did not allocate to the container.
 */
int dp_ids_uncovered(const contract_inventory *inv, dp_res r, const char *const *ids, size_t n,
                     const contract_target *t);

/*
 * Encodes the ListAndWatchResponse for resource r (every device with its
 * GPU's health and NUMA node). *out is malloc'd. Fails (KGPU_ERANGE) when the
 * message would exceed DP_MAX_LIST_BYTES, naming the unit to use instead.
 */
int dp_list_encode(const contract_inventory *inv, dp_res r, uint8_t **out, size_t *len,
                   kgpu_error *err);

struct dp_mig_set;
/*
 * The same with MIG devices (migdev.c): with `profile` NULL, r's devices
 * and, for DP_RES_WHOLE, every device of `mig` (the single strategy); with
 * a profile, only mig's devices of that profile (a mixed-strategy resource,
 * r unused). `mig` may be NULL (no MIG).
 */
int dp_list_encode_mig(const contract_inventory *inv, dp_res r, const struct dp_mig_set *mig,
                       const char *profile, uint8_t **out, size_t *len, kgpu_error *err);

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
int dp_prefer(const contract_inventory *inv, dp_res r, const char *const *avail, int navail,
              const char *const *must, int nmust, int size, const dp_want *want, int *chosen);

/* ---- migdev.c ---- */

/*
 * Static MIG (--mig-strategy, as NVIDIA's device plugin names them): GPUs
 * already partitioned by the operator are advertised per MIG device; kgpu
 * never creates or destroys instances on this path (the DRA driver does).
 *   none    MIG devices are not advertised
 *   single  every MIG device is one nvidia.com/gpu, when all of the node's
 *           MIG devices have one profile and no whole GPU is listed beside
 *           them; otherwise none is (logged)
 *   mixed   one resource per profile, nvidia.com/mig-<profile>
 * A MIG-enabled GPU is never offered whole or as kgpu.io shares: CUDA cannot
 * use it without an instance, and its instances are the hardware's shares.
 */
typedef enum dp_mig_strategy { DP_MIG_NONE = 0, DP_MIG_SINGLE, DP_MIG_MIXED } dp_mig_strategy;

/* "none", "single" or "mixed" -> *out; -1 for anything else. */
int dp_mig_strategy_parse(const char *s, dp_mig_strategy *out);

#define DP_MIG_DEVS_MAX   (KGPU_MAX_GPUS_PER_NODE * 7) /* 7 instances per GPU at most */
#define DP_MIG_RES_MAX    16 /* profile resources per node (mixed) */
#define DP_MIG_RES_PREFIX "nvidia.com/mig-"
#define DP_MIG_WHY_MAX    320

/* One MIG device (a GPU instance and its compute instance) that exists now. */
typedef struct dp_mig_dev {
    int gpu_index;                    /* the parent's NVML index */
    char gpu_uuid[KGPU_GPU_UUID_MAX]; /* the parent's UUID */
    char uuid[KGPU_GPU_UUID_MAX];     /* "MIG-...": the device ID and what the runtime is told */
    char profile[KGPU_MIG_NAME_MAX];  /* "1g.5gb"; "" when kgpu's tables lack the GPU */
    int64_t memory_mib;
    unsigned gi_id, ci_id;
    int numa; /* the parent's */
    bool healthy; /* the parent's */
} dp_mig_dev;

typedef struct dp_mig_set {
    int n;
    dp_mig_dev dev[DP_MIG_DEVS_MAX];
} dp_mig_set;

/*
 * The profile name ("1g.5gb") of NVML GI profile `nvml_profile` on GPU g,
 * from kgpu's tables (kgpu_mig_model_find by g's model and memory); false
 * with out "" when the model or the profile is unknown.
 */
bool dp_mig_profile_name(const kgpu_gpu_info *g, int nvml_profile, char *out, size_t cap);

/*
 * A MIG device record from NVML's view of one instance on GPU g (the name
 * from dp_mig_profile_name, health and NUMA node from g).
 */
void dp_mig_dev_of(const kgpu_gpu_info *g, const kgpu_nvml_mig *m, dp_mig_dev *out);

/*
 * What strategy s advertises of the instances `found` (n of them) on a node
 * that also lists `nwhole` GPUs whole on nvidia.com/gpu: *out gets the
 * advertised devices (every device with a profile name and a UUID; under
 * single all or none). Returns 0, or -1 with `why` saying what was left out
 * and why (a mismatched single layout, devices of unknown GPUs, instances
 * without a compute instance); *out then holds what is still advertised.
 */
int dp_mig_plan(dp_mig_strategy s, const dp_mig_dev *found, int n, int nwhole, dp_mig_set *out,
                char *why, size_t cap);

/* The position in s of the device with this UUID, or -1. */
int dp_mig_find(const dp_mig_set *s, const char *uuid);

/* "nvidia.com/mig-<profile>" into buf; false when it does not fit a resource name. */
bool dp_mig_resource(const char *profile, char *buf, size_t cap);

/*
 * The name of the plugin's resource `slot` into buf: dp_res_name below
 * DP_NRES, else the mixed strategy's resource of `profile` ("?" if none).
 */
const char *dp_slot_resource(int slot, const char *profile, char *buf, size_t cap);

/*
 * The contract's target for a container kubelet gave MIG devices `ids`
 * (positions in s): the devices as its GPUs, each with the instance's whole
 * memory and no compute share (the hardware isolates both). kubelet's
 * accounting of MIG devices is exclusive and the extender assigns none, so
 * the target is the first device rather than a pod: uid is its UUID (host
 * files in <state>/pods/<MIG-uuid>/, reused by the next container given it)
 * and the container "mig".
 */
void dp_mig_target(const dp_mig_set *s, const int *ids, int n, contract_target *t);

/* ---- match.c ---- */

/* The pod and container an Allocate (or preferred allocation) belongs to. */
typedef struct dp_match {
    /*
     * The contract's part: the pod (ns, name, uid), the container, its GPUs
     * and shares, and pod_units (the pod's kgpu.io/gpu-mem units over all app
     * containers).
     */
    contract_target t;
    bool init;
    bool exclusive;
    int64_t count;       /* devices kubelet hands out for this resource */
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

/* How the answer names the GPUs as CDI devices (--cdi-kind, --device-id-strategy). */
typedef struct dp_cdi {
    const char *kind; /* "nvidia.com/gpu" */
    bool by_index;
} dp_cdi;

/*
 * The container's answer for this resource: the contract's env and mounts,
 * and its GPUs as CDI devices unless cdi is NULL, when m->primary; else
 * empty (kubelet merges a container's answers, and one resource carries
 * them).
 */
void dp_response_of(const dp_match *m, const contract_inventory *inv, const contract_paths *paths,
                    const dp_cdi *cdi, contract_response *out);

/* Encodes a response as an AllocateResponse holding `n` containers. */
int dp_allocate_encode(const contract_response *resp, int n, uint8_t **out, size_t *len);

/* ---- register.c ---- */

/* Calls kubelet's Registration/Register of `resource` ("kgpu.io/gpu-mem") on `kubelet_sock`. */
int dp_register(const char *kubelet_sock, const char *endpoint, const char *resource,
                bool preferred, unsigned timeout_ms, kgpu_error *err);

/* ---- plugin.c ---- */

/* How Allocate hands a container its GPUs (--device-list-strategy). */
typedef enum dp_device_list {
    DP_LIST_CDI = 0, /* CDI devices (cdi_devices) and NVIDIA_VISIBLE_DEVICES */
    DP_LIST_ENVVAR,  /* NVIDIA_VISIBLE_DEVICES alone: runtimes without a CDI spec of the GPUs */
} dp_device_list;

#define DP_CDI_KIND_DEFAULT CONTRACT_CDI_KIND_NVIDIA

typedef struct dp_config {
    node_config node; /* the flags both node agents take (nodeagent.h) */
    dp_device_list device_list;
    bool cdi_by_index;  /* --device-id-strategy index: "<kind>=<index>" */
    char cdi_kind[128]; /* --cdi-kind, "" = DP_CDI_KIND_DEFAULT */
    char plugin_dir[1024];
    bool whole_gpus;
    bool gpushare_alias;
    bool no_api; /* never talk to an API server (tests) */
    char watch_config[1024]; /* the watcher's config file (watcher.h); "" = no watcher */
    dp_mig_strategy mig_strategy; /* --mig-strategy; single also registers nvidia.com/gpu */
} dp_config;

/* Runs the daemon until *stop; 0 on a clean stop. */
int dp_run(const dp_config *cfg, atomic_bool *stop, kgpu_error *err);

#endif
