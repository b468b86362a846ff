/*
 * The node's GPUs as the device plugin sees them, from one of two backends:
 * NVML, opened at run time so that the same binary runs (and is tested) on
 * machines without a driver, or a fake inventory read from a file for tests
 * and demos. Both fill the same kgpu_gpu_info records.
 *
 * Threads: a kgpu_nvml handle is used by one thread at a time (the plugin's
 * discovery thread, or the watcher's thread, which opens a handle of its
 * own); NVML itself is thread-safe and counts nvmlInit calls, but the
 * handle's event set, cached device handles and utilization timestamps are
 * not shared.
 */
#ifndef KGPU_GPU_H
#define KGPU_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"

#define KGPU_GPU_UUID_MAX  96
#define KGPU_GPU_NAME_MAX  96
#define KGPU_GPU_BUSID_MAX 32
#define KGPU_GPU_CC_MAX    16

typedef struct kgpu_gpu_info {
    int index;
    char uuid[KGPU_GPU_UUID_MAX];
    char model[KGPU_GPU_NAME_MAX];
    int64_t memory_mib;
    int numa; /* -1 when the platform does not say */
    bool healthy;
    char pci_bus_id[KGPU_GPU_BUSID_MAX]; /* "0000:3b:00.0"; "" when unknown */
    char compute_capability[KGPU_GPU_CC_MAX]; /* CUDA's "8.0"; "" when unknown */
    int mig_mode; /* current MIG mode: 1 enabled, 0 disabled, -1 not MIG-capable or unknown */
} kgpu_gpu_info;

/* ---- NVML ---- */

typedef struct kgpu_nvml kgpu_nvml;

/*
 * dlopen()s `library` (NULL: "libnvidia-ml.so.1"), resolves the functions
 * kgpu uses (newest symbol version first) and initialises NVML. A missing
 * required symbol fails naming it; missing event functions only disable XID
 * health events, a missing nvmlDeviceGetCudaComputeCapability only leaves
 * compute_capability empty. `sysfs` (NULL: "/sys") is where NUMA nodes are read from.
 */
int kgpu_nvml_open(const char *library, const char *sysfs, kgpu_nvml **out, kgpu_error *err);
void kgpu_nvml_close(kgpu_nvml *nv);

/* True when XID events can be waited for. */
bool kgpu_nvml_has_events(const kgpu_nvml *nv);

/*
 * All GPUs that answer, in NVML index order; *gpus is malloc'd (caller
 * frees). A GPU that fails to report its UUID, name or memory (lost, fallen
 * off the bus) is left out instead of failing the node: compare *ngpus with
 * kgpu_nvml_device_count, and kgpu_nvml_skipped says why.
 */
int kgpu_nvml_discover(kgpu_nvml *nv, kgpu_gpu_info **gpus, int *ngpus, kgpu_error *err);

/*
 * Waits up to timeout_ms for a critical XID event on any discovered GPU.
 * Returns 1 with *index and *xid set, 0 on timeout (or without events), or
 * a negative error code.
 */
int kgpu_nvml_wait_xid(kgpu_nvml *nv, unsigned timeout_ms, int *index, unsigned long long *xid,
                       kgpu_error *err);

/* GPUs NVML counts, answering or not (after kgpu_nvml_discover). */
int kgpu_nvml_device_count(const kgpu_nvml *nv);
/* Why the last discovery left a GPU out ("GPU 1: nvmlDeviceGetUUID: ..."), or "". */
const char *kgpu_nvml_skipped(const kgpu_nvml *nv);

/* Whether GPU `index` (the NVML index) still answers (false once NVML reports it lost). */
bool kgpu_nvml_alive(kgpu_nvml *nv, int index);

/* One process NVML reports on a GPU (the watcher's view, src/deviceplugin/watcher.c). */
typedef struct kgpu_gpu_proc {
    unsigned pid;       /* in the PID namespace of the host (the driver's) */
    int64_t used_bytes; /* GPU memory NVML charges to it; -1 when it cannot tell */
    int sm_pct;         /* mean SM utilization since the previous call, 0..100; 0 if none */
} kgpu_gpu_proc;

/* Processes merged per GPU at most (NVML's lists are bounded by the driver's own limit). */
#define KGPU_GPU_PROCS_MAX 1024

/*
 * The compute processes on GPU `index` (NVML index, after kgpu_nvml_discover),
 * MPS clients included, with the memory each holds and its SM utilization
 * since the previous call for this GPU on this handle. A PID listed twice
 * (compute and MPS lists) is merged. *n ≤ cap; more processes than cap are
 * KGPU_ERANGE. A driver without per-process utilization leaves sm_pct 0
 * and sets *no_util (may be NULL).
 */
int kgpu_nvml_processes(kgpu_nvml *nv, int index, kgpu_gpu_proc *out, int cap, int *n,
                        bool *no_util, kgpu_error *err);

/* ---- MIG through NVML ---- */

/*
 * One MIG device: a GPU instance and the compute instance that spans it
 * (kgpu creates one CI per GI, of the GI's full size).
 */
typedef struct kgpu_nvml_mig {
    int gpu;                      /* the parent's NVML index */
    unsigned gi_id, ci_id;        /* NVML's instance IDs there; ci_id UINT_MAX without a CI */
    int nvml_profile;             /* the GI's NVML_GPU_INSTANCE_PROFILE_* */
    int start, size;              /* its placement in memory slices */
    int64_t memory_mib;           /* the GI profile's memorySizeMB */
    char uuid[KGPU_GPU_UUID_MAX]; /* the MIG device's UUID ("MIG-..."); "" without a CI */
} kgpu_nvml_mig;

#define KGPU_NVML_MIG_MAX 16 /* GPU instances listed per GPU at most (7 fit) */

/*
 * The GPU instances on GPU `index` (after kgpu_nvml_discover), each with its
 * first compute instance, in the order of their start slices; *n <= cap
 * (more are KGPU_ERANGE). KGPU_ESTATE when MIG is off or not supported
 * there; KGPU_ENOENT when the driver's NVML lacks a MIG function (named).
 * MIG mode is only read: kgpu never changes it.
 */
int kgpu_nvml_mig_list(kgpu_nvml *nv, int index, kgpu_nvml_mig *out, int cap, int *n,
                       kgpu_error *err);

/*
 * Creates a GPU instance of `nvml_profile` at memory slice `start`
 * (nvmlDeviceCreateGpuInstanceWithPlacement), then one compute instance of
 * the GI's full size, and fills *out with both and the MIG device's UUID.
 * When the CI fails the GI is destroyed again. Errors name the GPU, the
 * profile and the placement: KGPU_ENOFIT when NVML says the slices are taken
 * (INSUFFICIENT_RESOURCES / IN_USE), KGPU_ESTATE when MIG is off.
 */
int kgpu_nvml_mig_create(kgpu_nvml *nv, int index, int nvml_profile, int start,
                         kgpu_nvml_mig *out, kgpu_error *err);

/*
 * Destroys GI `gi_id` on GPU `index` with its compute instances; an absent
 * GI is success, on a GPU whose MIG mode is off too. KGPU_ESTATE when a
 * process still runs in it (NVML's IN_USE) or the GPU has no MIG.
 */
int kgpu_nvml_mig_destroy(kgpu_nvml *nv, int index, unsigned gi_id, kgpu_error *err);

#define KGPU_MIG_STARTS_MAX 8 /* placements of one profile at most (8 memory slices) */

/* One GI profile as NVML reports it on a GPU (for checking kgpu's tables). */
typedef struct kgpu_nvml_mig_profile {
    int nvml_profile; /* NVML_GPU_INSTANCE_PROFILE_* */
    int id;           /* the profile ID ("19") */
    int slices;       /* sliceCount: compute slices */
    int instances, multiprocessors;
    int64_t memory_mib; /* memorySizeMB */
    char name[32];      /* "1g.5gb" ("MIG " dropped); "" when the driver does not say */
    int nplacements;
    int starts[KGPU_MIG_STARTS_MAX], sizes[KGPU_MIG_STARTS_MAX];
} kgpu_nvml_mig_profile;

/*
 * The GI profiles NVML supports on GPU `index` with their possible
 * placements; *n <= cap. KGPU_ESTATE when NVML refuses every profile (a
 * driver may read them only in MIG mode, which kgpu does not turn on).
 */
int kgpu_nvml_mig_profiles(kgpu_nvml *nv, int index, kgpu_nvml_mig_profile *out, int cap, int *n,
                           kgpu_error *err);

/* ---- fake inventory ---- */

/*
 * Reads a YAML or JSON file with a top-level `gpus:` list; each item has
 * `index`, `uuid`, `model`, `memory_mib` and optionally `numa` (default -1)
 * and `healthy` (default true), as in the extender's cluster file, and
 * `compute_capability` ("8.0": digits and dots, under 12 characters; any
 * other value is passed over as unknown). Errors name the file, the item and
 * the field.
 */
int kgpu_fake_gpus_load(const char *path, kgpu_gpu_info **gpus, int *ngpus, kgpu_error *err);
/* The same from a buffer; `name` stands for the file in errors. */
int kgpu_fake_gpus_parse(const char *buf, size_t len, const char *name, kgpu_gpu_info **gpus,
                         int *ngpus, kgpu_error *err);

#endif
