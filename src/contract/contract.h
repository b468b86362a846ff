/*
 * The container contract: what a container that was given GPUs and shares
 * gets, whichever path gave them (kgpu-device-plugin's Allocate, or
 * kgpu-dra-plugin's prepared claim as a CDI spec): its environment, its
 * mounts, its limits file and the host files behind them. One copy, so
 * isolation is the same on both paths.
 *
 *   response.c  the env, mounts and limits file's text (pure)
 *   files.c     the host side: per-target files, GPU schedules, the preload
 *               file, the MPS control daemon's check
 *
 * Everything here is reentrant: no globals, no threads of its own. Strings in
 * the structs are copies; a contract_paths borrows its strings.
 */
#ifndef KGPU_CONTRACT_H
#define KGPU_CONTRACT_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu.h"
#include "kgpu/error.h"
#include "kgpu/model.h"

/* Container paths of what a container gets mounted. */
#define CONTRACT_LIMITS_PATH  "/etc/kgpu/limits"
#define CONTRACT_SHARED_PATH  "/var/run/kgpu"
#define CONTRACT_SHIM_PATH    "/usr/lib/kgpu/libkgpu-limit.so"
#define CONTRACT_PRELOAD_PATH "/etc/ld.so.preload"
/* The node-wide GPU schedules (src/shim/gpusched.h): <dir>/<uuid>.sched, one per GPU. */
#define CONTRACT_SCHED_PATH "/var/run/kgpu-gpu"
/* MPS mode: the MPS control daemon's pipe directory, in the container (NVIDIA's default). */
#define CONTRACT_MPS_PIPE_PATH "/tmp/nvidia-mps"

/* The node's GPUs and the size of one memory unit (gpushare's env unit). */
typedef struct contract_inventory {
    int ngpus;
    kgpu_gpu_info gpus[KGPU_MAX_GPUS_PER_NODE];
    int64_t unit_mib;
} contract_inventory;

/* The position in inv of the GPU with this UUID, or -1. */
int contract_inventory_find(const contract_inventory *inv, const char *uuid);

/* One GPU a container was given, and its share of it. */
typedef struct contract_share {
    int index;                    /* host index */
    char uuid[KGPU_GPU_UUID_MAX]; /* as discovery's: a GPU's UUID is never cut */
    int milli;                    /* compute in thousandths; 0 = not limited */
    int limit_pct;                /* burst ceiling above the share, percent; 0 = none (100) */
    int64_t memory_mib;
} contract_share;

/*
 * Whom the contract is for: a pod's container (device plugin), or a claim's
 * request (DRA: uid = the claim's UID, container = the request's name). The
 * host files land in <state>/pods/<uid>/.
 */
typedef struct contract_target {
    char ns[KGPU_NAME_MAX + 1];   /* namespace and name: for messages */
    char name[KGPU_NAME_MAX + 1];
    char uid[64];
    char container[64];
    int ngpus;
    contract_share gpus[KGPU_MAX_GPUS_PER_NODE];
    int64_t pod_units; /* the pod's memory units over all app containers (gpushare's env) */
} contract_target;

/* How containers sharing a GPU are held to their compute shares. */
typedef enum contract_sharing {
    CONTRACT_SHARING_SCHED = 0, /* the library's turns through each GPU's schedule file */
    CONTRACT_SHARING_MPS, /* NVIDIA MPS: active-thread percentage and pinned memory per client */
} contract_sharing;

/* "sched" or "mps" -> *out; -1 for anything else. */
int contract_sharing_parse(const char *s, contract_sharing *out);

/* The host side of the contract. Strings are borrowed from the caller. */
typedef struct contract_paths {
    const char *state_dir;    /* host: pods/<uid>/..., ld.so.preload, sched/ */
    const char *shim_lib;     /* host path of libkgpu-limit.so, NULL = no interception */
    const char *mps_pipe_dir; /* host: MPS mode's pipe directory; NULL = schedule-file mode */
} contract_paths;

/*
 * Room for the longest value: NVIDIA_VISIBLE_DEVICES naming every GPU a node
 * can have, each UUID whole (a cut one names no GPU, and the runtime fails).
 */
#define CONTRACT_ENV_VALUE_MAX (KGPU_MAX_GPUS_PER_NODE * KGPU_GPU_UUID_MAX)

typedef struct contract_kv {
    char key[48];
    char value[CONTRACT_ENV_VALUE_MAX];
} contract_kv;

typedef struct contract_mount {
    char container_path[256];
    char host_path[1024];
    bool read_only;
} contract_mount;

/*
 * Mounts a container can get: limits, accounting, library, preload, and one
 * schedule per GPU or the MPS pipe directory.
 */
#define CONTRACT_MAX_MOUNTS (5 + KGPU_MAX_GPUS_PER_NODE)
#define CONTRACT_MAX_ENV    16

/* A fully-qualified CDI device name: "<vendor>/<class>=<uuid or index>". */
#define CONTRACT_CDI_NAME_MAX (128 + KGPU_GPU_UUID_MAX)

/* What one container gets. */
typedef struct contract_response {
    int ncdi; /* CDI devices: one per GPU (contract_cdi_devices) */
    char cdi[KGPU_MAX_GPUS_PER_NODE][CONTRACT_CDI_NAME_MAX];
    int nenv;
    contract_kv env[CONTRACT_MAX_ENV];
    int nmounts;
    contract_mount mounts[CONTRACT_MAX_MOUNTS];
} contract_response;

/* ---- response.c ---- */

/* The limits file text (`# kgpu limits v1` and one line per visible GPU); malloc'd. */
char *contract_limits_text(const contract_target *t);

/*
 * Env and mounts for a target (empty when it has no GPU): the GPUs and
 * limits, gpushare's variables (in inv->unit_mib), the limits file, the
 * accounting directory, the library and its preload, and each GPU's schedule
 * or in MPS mode the control daemon's pipes.
 */
void contract_response_build(const contract_target *t, const contract_inventory *inv,
                             const contract_paths *paths, contract_response *out);

/*
 * Names each of the target's GPUs as a CDI device in out->cdi:
 * "<kind>=<uuid>", or "<kind>=<index>" with by_index (kind: "nvidia.com/gpu",
 * as nvidia-ctk names NVIDIA's GPUs). The runtime injects exactly these,
 * whatever the container's own NVIDIA_VISIBLE_DEVICES says.
 */
void contract_cdi_devices(const contract_target *t, const char *kind, bool by_index,
                          contract_response *out);

/* The CDI kind NVIDIA's container toolkit gives GPUs (nvidia-ctk cdi generate). */
#define CONTRACT_CDI_KIND_NVIDIA "nvidia.com/gpu"

/*
 * Checks a CDI kind, "<vendor>/<class>" as the CDI specification spells
 * them (vendor: letters, digits, '.', '-', '_', starting and ending with a
 * letter or digit; class: letters, digits, '-', '_'); 0 or KGPU_EINVAL
 * naming the kind. Both node agents take one from a flag.
 */
int contract_cdi_kind_check(const char *kind, kgpu_error *err);

/*
 * Whether the target's share of GPU i is a compute share, which the
 * library enforces through that GPU's schedule, mounted read-write.
 */
bool contract_sched_shared(const contract_target *t, int i);

/* Whether the target takes turns on GPU i through its schedule (never in MPS mode). */
bool contract_takes_turns(const contract_target *t, const contract_paths *paths, int i);

/* ---- files.c ---- */

/*
 * MPS mode needs the node's MPS control daemon: 0 when `dir` holds its
 * control pipe (a FIFO named "control"), else KGPU_ENOENT saying what to do.
 */
int contract_mps_check(const char *dir, kgpu_error *err);

/*
 * Creates <state>/pods/<uid>/shared, writes <state>/pods/<uid>/<container>.limits
 * and, for each GPU on which the target has a compute share, makes sure
 * of <state>/sched/<uuid>.sched (contract_sched_shared). Idempotent.
 */
int contract_write_files(const contract_target *t, const contract_paths *paths, kgpu_error *err);

/*
 * Writes <state_dir>/ld.so.preload naming the library's container path, by
 * write and rename; nothing without a library.
 */
int contract_write_preload(const contract_paths *paths, kgpu_error *err);

#endif
