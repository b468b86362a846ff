/*
 * What the files of kgpu's NVML loader share (nvml.c opens and discovers,
 * nvml_mig.c manages MIG instances): kgpu's own declarations of NVML's ABI
 * and the handle's insides. Private to src/gpu.
 */
#ifndef KGPU_NVML_PRIV_H
#define KGPU_NVML_PRIV_H

#include <stdbool.h>
#include <stddef.h>

#include "gpu.h"

typedef int nvml_ret;
typedef struct nvml_device_st *nvml_device;
typedef struct nvml_event_set_st *nvml_event_set;

enum {
    NVML_OK = 0,
    NVML_ERR_INVALID_ARGUMENT = 2,
    NVML_ERR_NOT_SUPPORTED = 3,
    NVML_ERR_NOT_FOUND = 6,
    NVML_ERR_INSUFFICIENT_SIZE = 7,
    NVML_ERR_TIMEOUT = 10,
    NVML_ERR_GPU_IS_LOST = 15,
    NVML_ERR_IN_USE = 19,
    NVML_ERR_INSUFFICIENT_RESOURCES = 23,
};

/* NVML_VALUE_NOT_AVAILABLE: what usedGpuMemory holds when the driver cannot tell. */
#define NVML_NOT_AVAILABLE_ULL (~0ULL)

/*
 * nvmlProcessInfo_t as the _v2 and _v3 process lists fill it; the
 * unversioned (v1) functions fill only the first two members, a 16-byte
 * record. Which one a resolved function takes is kept beside it.
 */
typedef struct {
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id, compute_instance_id;
} nvml_process_info;

typedef struct {
    unsigned int pid;
    unsigned long long used_gpu_memory;
} nvml_process_info_v1;

/* nvmlProcessUtilizationSample_t. */
typedef struct {
    unsigned int pid;
    unsigned long long time_stamp; /* CPU time, microseconds */
    unsigned int sm_util, mem_util, enc_util, dec_util;
} nvml_process_sample;

typedef nvml_ret (*nvml_procs_fn)(nvml_device, unsigned int *, void *);

/*
 * Reads one of NVML's process lists of GPU `index` through fn (records of
 * `size` bytes) into *records (malloc'd, NULL when none) and *count. The
 * list can grow between the sizing call and the reading call; a few tries
 * absorb that. Errors name the GPU and `what`. (nvml.c)
 */
int nvml_proc_records(kgpu_nvml *nv, int index, nvml_procs_fn fn, size_t size,
                      const char *what, void **records, unsigned int *count, kgpu_error *err);

/* usedGpuMemory in bytes, or -1 where NVML cannot tell (or past int64). */
int64_t nvml_used_bytes(unsigned long long used);

#define NVML_EVENT_XID_CRITICAL 0x8ULL

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci_info;

typedef struct {
    nvml_device device;
    unsigned long long event_type, event_data;
    unsigned int gpu_instance_id, compute_instance_id;
} nvml_event_data;

struct kgpu_nvml {
    void *lib;
    bool initialised;
    char sysfs[256];
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    const char *(*error_string)(nvml_ret);
    nvml_ret (*count)(unsigned int *);
    nvml_ret (*by_index)(unsigned int, nvml_device *);
    nvml_ret (*uuid)(nvml_device, char *, unsigned int);
    nvml_ret (*name)(nvml_device, char *, unsigned int);
    nvml_ret (*memory)(nvml_device, nvml_memory *);
    nvml_ret (*pci)(nvml_device, nvml_pci_info *);
    /* optional: CUDA compute capability (major, minor) */
    nvml_ret (*cuda_cc)(nvml_device, int *, int *);
    /* optional: the current and pending MIG mode */
    nvml_ret (*mig_mode)(nvml_device, unsigned int *, unsigned int *);
    /* nvml_mig.c's MIG functions, resolved (malloc'd) at the first MIG call; NULL before */
    void *mig;
    /* optional: XID events */
    nvml_ret (*set_create)(nvml_event_set *);
    nvml_ret (*register_events)(nvml_device, unsigned long long, nvml_event_set);
    nvml_ret (*set_wait)(nvml_event_set, nvml_event_data *, unsigned int);
    nvml_ret (*set_free)(nvml_event_set);
    nvml_event_set events;
    /* optional: the watcher's per-process figures; *_size is the record size each fills */
    nvml_procs_fn compute_procs, mps_procs;
    size_t compute_size, mps_size;
    nvml_ret (*proc_util)(nvml_device, nvml_process_sample *, unsigned int *, unsigned long long);
    unsigned long long *util_seen; /* by index: newest utilization sample read so far */
    nvml_device *devices; /* by index, after discover */
    int ndevices;
    char skipped[256]; /* why the last GPU discovery left a GPU out, or "" */
};

static inline const char *nvml_strerror(const kgpu_nvml *nv, nvml_ret r)
{
    const char *s = nv->error_string != NULL ? nv->error_string(r) : NULL;
    return s != NULL ? s : "unknown NVML error";
}

#endif
