/*
 * kgpu-dra-plugin: kgpu's Dynamic Resource Allocation driver (gpu.kgpu.io)
 * for kubelet (DRA plugin API v1 and v1beta1) and the API server
 * (resource.k8s.io/v1).
 *
 * Modules:
 *   slice.c       the node's ResourceSlice: one device per GPU with attributes
 *                 and consumable capacity (pure)
 *   claim.c       a ResourceClaim's allocation for this driver, read into the
 *                 GPUs and shares it gives (pure)
 *   cdi.c         a prepared claim's CDI spec: the container contract
 *                 (src/contract: env, mounts and limits file) as CDI
 *                 container edits; and the files on the host
 *   checkpoint.c  the prepared claims, saved by write-and-rename
 *   publish.c     the ResourceSlice publisher thread (driver.h)
 *   service.c     the DRA node service and plugin registration: kubelet's
 *                 calls (driver.h)
 *   driver.c      the daemon: discovery, the servers' life cycle, dra_run
 *
 * The flags, main(), the gRPC servers and the API server connection are the
 * node agents' (src/nodeagent), and the container's env, mounts and limits
 * file are the container contract (src/contract), both shared with the
 * device plugin: one contract on both paths, so isolation is the same
 * whichever path a container came by.
 *
 * Threads: the main thread owns discovery and the servers' life cycle; one
 * publisher thread owns the ResourceSlice; the gRPC servers' workers run
 * Prepare and Unprepare one at a time under the driver's claim mutex, which
 * also guards the checkpoint.
 */
#ifndef KGPU_DRA_H
#define KGPU_DRA_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "contract.h"
#include "gpu.h"
#include "kgpu/error.h"
#include "kgpu/model.h"
#include "nodeagent.h"

#define DRA_DRIVER   "gpu.kgpu.io"
#define DRA_CDI_KIND "kgpu.io/gpu" /* CDI device IDs are kgpu.io/gpu=<name> */
/* What kubelet's plugin manager asks for, newest first (dra_plugin.go, v1.37). */
#define DRA_SERVICE_V1      "v1.DRAPlugin"
#define DRA_SERVICE_V1BETA1 "v1beta1.DRAPlugin"
#define DRA_METHOD_V1       "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
#define DRA_METHOD_V1BETA1  "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/"
#define DRA_METHOD_REG      "/pluginregistration.Registration/"

/* Capacity names in the slice and in claims' consumedCapacity. */
#define DRA_CAP_MEMORY "memory" /* bytes */
#define DRA_CAP_CORES  "cores"  /* percent of the GPU's compute, 0..100 */

#define DRA_UID_MAX        64 /* Kubernetes UIDs are 36 characters */
#define DRA_REQ_MAX        64 /* request names are DNS labels (63) */
#define DRA_DEVICE_MAX     64
#define DRA_MAX_REQUESTS   8    /* of one claim, with devices of this driver */
#define DRA_MAX_CLAIMS     1024 /* prepared at once on one node (kubelet's max-pods is 110) */
#define DRA_MAX_CALL       256  /* claims in one Prepare or Unprepare call */
#define DRA_CLAIM_MAX_JSON (1u << 20)
#define DRA_CKPT_MAX_BYTES (16u << 20)

/* One GPU (or share of one) a claim was allocated. */
typedef struct dra_alloc {
    int req;                     /* index into dra_claim.reqs */
    char device[DRA_DEVICE_MAX]; /* the slice's device name, "gpu-<index>" */
    char uuid[KGPU_GPU_UUID_MAX];
    int index;          /* host (NVML) index */
    int64_t memory_mib; /* the share's memory */
    int milli;          /* the share's compute in thousandths; 0 = not limited */
    int limit_pct;      /* burst ceiling (opaque config coreLimit), percent; 0 = none */
    char share_id[DRA_UID_MAX]; /* consumable capacity's share, "" for none */
} dra_alloc;

/* A claim as this driver prepares it: its devices of gpu.kgpu.io, by request. */
typedef struct dra_claim {
    char ns[KGPU_NAME_MAX + 1];
    char name[KGPU_NAME_MAX + 1];
    char uid[DRA_UID_MAX];
    int nreqs;
    char reqs[DRA_MAX_REQUESTS][DRA_REQ_MAX]; /* base request names (before any '/') */
    int nallocs;
    dra_alloc allocs[KGPU_MAX_GPUS_PER_NODE];
} dra_claim;

/* ---- slice.c ---- */

/* The slice's device name of a GPU: "gpu-<index>". */
void dra_device_name(int index, char *buf, size_t cap);

/* The name of the node's one slice: "<node>-gpu.kgpu.io" (within 253 characters). */
void dra_slice_name(const char *node, char *buf, size_t cap);

/* What the slice is built from. */
typedef struct dra_slice_input {
    const char *node;
    const char *node_uid; /* the Node's UID for the owner reference; "" = none */
    const kgpu_gpu_info *gpus;
    int ngpus;
    /* "8.0" per GPU position, or NULL / "" where unknown; may be NULL. */
    const char *const *compute_capability;
    int64_t generation; /* the pool's generation */
} dra_slice_input;

/*
 * A resource.k8s.io/v1 ResourceSlice for the node's healthy GPUs (an
 * unhealthy GPU is left out, so no new claim is allocated it). Each device
 * allows multiple allocations and offers `memory` (bytes: default the whole
 * GPU, steps of 1 MiB) and `cores` (percent: default 0, not limited, up to
 * 100). New reference; NULL only when out of memory.
 */
json_t *dra_slice_build(const dra_slice_input *in);

/*
 * Whether an existing slice (as the API server returns it) already says what
 * `want` says: driver, node, pool name, devices and owner. Fields the server
 * adds (metadata, defaults) are ignored.
 */
bool dra_slice_same(const json_t *have, const json_t *want);

/*
 * Whether device plugins also hand out this node's GPUs: the Node's
 * status.allocatable holds more than zero of kgpu.io/gpu-mem,
 * kgpu.io/gpu-core, nvidia.com/gpu or aliyun.com/gpu-mem (kubelet sets a
 * stopped plugin's resources to zero). Returns how many such resources and
 * writes them ("kgpu.io/gpu-mem=40, nvidia.com/gpu=2") into buf. While there
 * are any, the driver publishes no devices: one path owns a node's GPUs.
 */
int dra_node_gpu_conflicts(const json_t *node, char *buf, size_t cap);

/* ---- claim.c ---- */

/* The node's GPUs a claim may name, with this node's pool. */
typedef struct dra_node_view {
    const char *pool; /* the node's name */
    const kgpu_gpu_info *gpus;
    int ngpus;
} dra_node_view;

/*
 * Reads a ResourceClaim (the object the API server answered) into `out`:
 * its status.allocation.devices.results of driver gpu.kgpu.io, each a GPU of
 * `node` with the share its consumedCapacity gives (memory rounded down to
 * MiB; a result without consumedCapacity is the whole GPU). Results of other
 * drivers are skipped: kubelet asks each driver for its own. `want_uid` (may
 * be NULL) must be the claim's metadata.uid. Errors name the claim and what
 * is wrong: not allocated, a result for another node's pool, an unknown or
 * unhealthy device, a share beyond the device, no result for this driver
 * (KGPU_EPARSE, KGPU_ENOENT, KGPU_ERANGE, KGPU_ESTATE).
 */
int dra_claim_read(const json_t *claim, const char *want_uid, const dra_node_view *node,
                   dra_claim *out, kgpu_error *err);

/* The same from JSON text of at most DRA_CLAIM_MAX_JSON bytes. */
int dra_claim_read_text(const char *buf, size_t len, const char *want_uid,
                        const dra_node_view *node, dra_claim *out, kgpu_error *err);

/* Whether s may name a file or CDI device: [A-Za-z0-9._-], not "." or "..", < 64 chars. */
bool dra_safe_name(const char *s);

/* ---- cdi.c ---- */

/* The CDI device name of request r of a claim: "<claim uid>-<request>". */
void dra_cdi_name(const dra_claim *c, int r, char *buf, size_t cap);

/* The fully qualified CDI device ID, "kgpu.io/gpu=<name>". */
void dra_cdi_id(const dra_claim *c, int r, char *buf, size_t cap);

/* Path of a claim's CDI spec file: <cdi_dir>/kgpu.io-gpu_<uid>.json. */
void dra_cdi_path(const char *cdi_dir, const char *uid, char *buf, size_t cap);

/*
 * The contract's target for request r of a claim, as the device plugin's
 * Allocate would build it for a container that got these GPUs and shares:
 * the pod fields hold the claim (uid = the claim's UID, container = the
 * request's name), so the contract's files land in <state>/pods/<claim uid>/.
 * Two shares of one GPU in the request are that GPU once, with their sum.
 */
void dra_claim_target(const dra_claim *c, int r, int64_t unit_mib, contract_target *out);

/*
 * The CDI spec (cdiVersion 0.5.0, kind kgpu.io/gpu) of a claim: one device
 * per request, whose containerEdits carry exactly the env and mounts the
 * device plugin's Allocate gives (contract_response_build). New reference.
 */
json_t *dra_cdi_spec(const dra_claim *c, const contract_inventory *inv,
                     const contract_paths *paths);

/*
 * Writes what a prepared claim needs on the host: each request's limits file
 * and accounting directory and the GPUs' schedules (contract_write_files),
 * then the CDI spec file (write, fsync, rename: the runtime never reads half
 * a spec). Idempotent.
 */
int dra_claim_files_write(const dra_claim *c, const contract_inventory *inv,
                          const contract_paths *paths, const char *cdi_dir, kgpu_error *err);

/* Removes a claim's CDI spec and <state>/pods/<uid>; absent files are fine. */
int dra_claim_files_remove(const char *uid, const contract_paths *paths, const char *cdi_dir,
                           kgpu_error *err);

/* ---- checkpoint.c ---- */

/* The prepared claims; `claims` is malloc'd, `n` of `cap`. */
typedef struct dra_ckpt {
    dra_claim *claims;
    int n, cap;
} dra_ckpt;

void dra_ckpt_free(dra_ckpt *ck);
/* The claim with this UID, or NULL. */
dra_claim *dra_ckpt_find(dra_ckpt *ck, const char *uid);
/* Adds or replaces by UID; KGPU_ERANGE beyond DRA_MAX_CLAIMS. */
int dra_ckpt_put(dra_ckpt *ck, const dra_claim *c, kgpu_error *err);
/* Removes by UID; true when it was there. */
bool dra_ckpt_drop(dra_ckpt *ck, const char *uid);

/* JSON text of the checkpoint (malloc'd). */
char *dra_ckpt_encode(const dra_ckpt *ck);
/*
 * Parses checkpoint text into `out` (emptied first). Every claim is checked
 * as it would be on its way in (names, counts, ranges); errors name `file`
 * and the claim.
 */
int dra_ckpt_parse(const char *buf, size_t len, const char *file, dra_ckpt *out, kgpu_error *err);
/* Saves by write, fsync, rename, fsync of the folder. */
int dra_ckpt_save(const char *path, const dra_ckpt *ck, kgpu_error *err);
/* Loads; a missing file is an empty checkpoint. */
int dra_ckpt_load(const char *path, dra_ckpt *out, kgpu_error *err);

/* ---- driver.c ---- */

typedef struct dra_config {
    node_config node; /* the node agents' flags (nodeagent.h); unit_mib is gpushare's env unit */
    char cdi_dir[1024];
    char plugin_dir[1024];   /* kubelet's plugins folder; the socket is <dir>/gpu.kgpu.io/dra.sock */
    char registry_dir[1024]; /* kubelet's plugins_registry folder */
    int resync_s;            /* how often the slice is checked against the API server */
    /* --gpu-cdi-kind: each device is also named as "<kind>=<uuid>" (NVIDIA's own
     * CDI spec, nvidia-ctk's), so that the runtime gives the GPU without
     * NVIDIA_VISIBLE_DEVICES; "" = not named (the variable in kgpu's spec alone). */
    char gpu_cdi_kind[128];
} dra_config;

/* Runs the driver until *stop; 0 on a clean stop. */
int dra_run(const dra_config *cfg, atomic_bool *stop, kgpu_error *err);

#endif
