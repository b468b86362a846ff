/*
 * kgpu-dra-plugin: kgpu's Dynamic Resource Allocation driver (gpu.kgpu.io)
 * for kubelet (DRA plugin API v1 and v1beta1) and the API server
 * (resource.k8s.io/v1).
 *
 * Modules:
 *   slice.c       the node's ResourceSlices: one device per GPU with attributes
 *                 and consumable capacity, and on a GPU in MIG mode one device
 *                 per profile and placement, consuming the GPU's shared
 *                 counters (pure)
 *   claim.c       a ResourceClaim's allocation for this driver, read into the
 *                 GPUs and shares it gives (pure)
 *   cdi.c         a prepared claim's CDI spec: the container contract
 *                 (src/contract: env, mounts and limits file) as CDI
 *                 container edits; and the files on the host
 *   checkpoint.c  the prepared claims, saved by write-and-rename; which of
 *                 them overlap on a MIG GPU
 *   instance.c    the MIG instances prepared claims hold: made, found again
 *                 after a restart or reboot, destroyed (through dra_mig_ops)
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
#include "kgpu/mig.h"
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
/* One slice holds at most 64 devices once any uses taints or counters (v1.37 validation). */
#define DRA_SLICE_MAX_DEVICES 64
#define DRA_SLICE_MAX_SETS    8 /* counter sets per slice */
/* The taint every device of an unhealthy GPU carries (effect NoSchedule). */
#define DRA_TAINT_UNHEALTHY "gpu.kgpu.io/unhealthy"
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
    /*
     * MIG: the GPU instance the device stands for, "" profile for none (a GPU
     * not in MIG mode). A MIG device ("gpu-0-mig-3g-20gb-4") is its profile at
     * mig_start; the whole-GPU device of a GPU in MIG mode is the full-size
     * profile at 0, shared (mig_shared) by every claim holding it. uuid stays
     * the parent GPU's; mig_uuid is the instance's once made.
     */
    char profile[KGPU_MIG_NAME_MAX];
    int nvml_profile; /* NVML_GPU_INSTANCE_PROFILE_* */
    int mig_start, mig_size;
    bool mig_shared;
    unsigned gi_id, ci_id;
    char mig_uuid[KGPU_GPU_UUID_MAX]; /* "MIG-..."; "" until made */
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

/* A MIG device's name, a DNS label: "gpu-<index>-mig-<profile, '.' as '-'>-<start>". */
void dra_mig_device_name(int index, const char *profile, int start, char *buf, size_t cap);

/*
 * The MIG table the driver offers GPU g by: its model's, when `mig` (MIG is
 * offered at all: NVML mode), g is in MIG mode and kgpu knows the model;
 * else NULL (the GPU is one device, as without MIG).
 */
const kgpu_mig_model *dra_mig_model(const kgpu_gpu_info *g, bool mig);

/* What a device name of the node's slices stands for. */
typedef struct dra_device_ref {
    int gpu;                     /* position in the node's GPUs */
    const kgpu_mig_model *model; /* the GPU's MIG table, NULL when not offered as MIG */
    int profile;                 /* index into model->profiles; -1: the whole-GPU device */
    int start;                   /* the MIG placement's first memory slice */
} dra_device_ref;

/*
 * Finds the device the slices publish under `name`: true only for a name
 * they would publish (gpus as the slice input's; `mig` likewise).
 */
bool dra_device_find(const kgpu_gpu_info *gpus, int ngpus, bool mig, const char *name,
                     dra_device_ref *out);

/* The name of the node's k-th slice: "<node>-gpu.kgpu.io", then "...-01" (within 253). */
void dra_slice_name_at(const char *node, int k, char *buf, size_t cap);
/* The first: dra_slice_name_at(node, 0, ...). */
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
    bool mig;           /* offer GPUs in MIG mode by profile (NVML mode only) */
} dra_slice_input;

/*
 * The node's pool as resource.k8s.io/v1 ResourceSlices, a JSON array in
 * name order (new reference; NULL only when out of memory).
 *
 * Each GPU is a device gpu-<index> that allows multiple allocations and
 * offers `memory` (bytes: default the whole GPU, steps of 1 MiB) and `cores`
 * (percent: default 0, not limited, up to 100). A GPU in MIG mode with a
 * known table (dra_mig_model) adds one device per profile ("+me" ones left
 * out) and allowed start, and a counter set gpu-<index>-slices in a slice of
 * its own (a slice holds counters or devices, never both): memory-slice-0..7
 * of 1 and compute-slices of 7. Each MIG device consumes its memory slices
 * and compute slices; gpu-<index> consumes all of them, which kube-scheduler
 * charges once however many shares it gives, so a GPU used whole or by
 * shares offers no partition and a partitioned one no share. Devices go GPU
 * by GPU, gpu-<index> first, then each profile's starts in
 * kgpu_mig_slice_order: kube-scheduler takes the first free device in slice
 * order, so that order is the placement. A GPU's devices stay in one slice;
 * slices hold at most DRA_SLICE_MAX_DEVICES devices and DRA_SLICE_MAX_SETS
 * counter sets. An unhealthy GPU's devices carry the taint
 * DRA_TAINT_UNHEALTHY (NoSchedule). A node without MIG GPUs is one slice.
 */
json_t *dra_slices_build(const dra_slice_input *in);

/*
 * Whether an existing slice (as the API server returns it) already says what
 * `want` says: driver, node, pool name and slice count, devices, counters
 * and owner. Fields the server adds (metadata, defaults, a taint's
 * timeAdded) are ignored; so is the generation (the publisher's to compare).
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
    bool mig; /* as the slice input's: MIG devices are published */
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
 * (KGPU_EPARSE, KGPU_ENOENT, KGPU_ERANGE, KGPU_ESTATE). A device name is
 * mapped back through dra_device_find: a MIG device's alloc records its
 * profile and placement (memory: the profile's), and one named as no slice
 * of this node would name it is refused.
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

/* The UUID the container is given for a: the MIG instance's once made, else the GPU's. */
const char *dra_alloc_visible_uuid(const dra_alloc *a);

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

/*
 * Defense in depth behind kube-scheduler's counters: KGPU_ESTATE naming both
 * when a MIG device of claim c overlaps (memory slices) another of its own
 * or of a prepared claim in ck (other than c itself), or when c holds a
 * partition of a GPU whose whole device a prepared claim holds, or the other
 * way round. Shares of one GPU's whole device never conflict with each other.
 */
int dra_ckpt_conflict(const dra_ckpt *ck, const dra_claim *c, kgpu_error *err);

/* ---- instance.c ---- */

/*
 * The MIG calls the driver makes, behind a table so that a test can stand
 * in for NVML (driver.c: kgpu_nvml_mig_*; ctx: the kgpu_nvml handle).
 */
typedef struct dra_mig_ops {
    void *ctx;
    int (*list)(void *ctx, int index, kgpu_nvml_mig *out, int cap, int *n, kgpu_error *err);
    int (*create)(void *ctx, int index, int nvml_profile, int start, kgpu_nvml_mig *out,
                  kgpu_error *err);
    int (*destroy)(void *ctx, int index, unsigned gi_id, kgpu_error *err);
} dra_mig_ops;

/* Whether claim c holds a MIG instance (a MIG device, or a MIG GPU's whole device). */
bool dra_claim_has_mig(const dra_claim *c);

/*
 * Makes sure every MIG instance claim c needs exists, and records it in c
 * (gi_id, ci_id, mig_uuid): an instance c records that NVML still lists at
 * its placement is kept; a MIG GPU's whole instance another claim in ck
 * holds is shared; anything else is made at the allocated placement (after
 * a reboot: with a new UUID). *changed (may be NULL) is set when c changed.
 * On failure every instance this call made is destroyed again and the error
 * names the device. ck may hold c itself (it is told apart by UID).
 */
int dra_instances_ensure(const dra_mig_ops *ops, const dra_ckpt *ck, dra_claim *c,
                         bool *changed, kgpu_error *err);

/*
 * Destroys the instances claim c holds, but a shared whole-GPU instance that
 * another claim in ck still holds; one NVML no longer lists at c's placement
 * is gone already. Idempotent.
 */
int dra_instances_release(const dra_mig_ops *ops, const dra_ckpt *ck, const dra_claim *c,
                          kgpu_error *err);

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
