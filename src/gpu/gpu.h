/*
 * The node's GPUs as the device plugin sees them, from one of two backends:
 * NVML, opened at run time so that the same binary runs (and is tested) on
 * machines without a driver, or a fake inventory read from a file for tests
 * and demos. Both fill the same kgpu_gpu_info records.
 *
 * Threads: a kgpu_nvml handle is used by one thread at a time (the plugin's
 * discovery thread); NVML itself is thread-safe, but the handle's event set
 * and cached device handles are not shared.
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

typedef struct kgpu_gpu_info {
    int index;
    char uuid[KGPU_GPU_UUID_MAX];
    char model[KGPU_GPU_NAME_MAX];
    int64_t memory_mib;
    int numa; /* -1 when the platform does not say */
    bool healthy;
    char pci_bus_id[KGPU_GPU_BUSID_MAX]; /* "0000:3b:00.0"; "" when unknown */
} kgpu_gpu_info;

/* ---- NVML ---- */

typedef struct kgpu_nvml kgpu_nvml;

/*
 * dlopen()s `library` (NULL: "libnvidia-ml.so.1"), resolves the functions
 * kgpu uses (newest symbol version first) and initialises NVML. A missing
 * required symbol fails naming it; missing event functions only disable XID
 * health events. `sysfs` (NULL: "/sys") is where NUMA nodes are read from.
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

/* ---- fake inventory ---- */

/*
 * Reads a YAML or JSON file with a top-level `gpus:` list; each item has
 * `index`, `uuid`, `model`, `memory_mib` and optionally `numa` (default -1)
 * and `healthy` (default true), as in the extender's cluster file. Errors
 * name the file, the item and the field.
 */
int kgpu_fake_gpus_load(const char *path, kgpu_gpu_info **gpus, int *ngpus, kgpu_error *err);
/* The same from a buffer; `name` stands for the file in errors. */
int kgpu_fake_gpus_parse(const char *buf, size_t len, const char *name, kgpu_gpu_info **gpus,
                         int *ngpus, kgpu_error *err);

#endif
