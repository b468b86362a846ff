/*
 * The processes of a GPU in MIG mode with the MIG device each runs in, for
 * the device plugin's watcher (src/deviceplugin/watcher.c): in MIG mode
 * NVML's process lists on the GPU's handle carry each process's GPU and
 * compute instance IDs (the _v2/_v3 records), which kgpu_nvml_processes
 * drops. A separate header and file so the MIG listing (nvml_mig.c) and the
 * loader (nvml.c) stay as they are.
 *
 * Threads: as gpu.h (one thread per kgpu_nvml handle).
 */
#ifndef KGPU_GPU_MIGPROCS_H
#define KGPU_GPU_MIGPROCS_H

#include "gpu.h"

/* One process on a GPU in MIG mode, in one MIG device. */
typedef struct kgpu_gpu_mig_proc {
    unsigned pid;          /* in the host's PID namespace */
    unsigned gi_id, ci_id; /* the MIG device: GPU instance and compute instance IDs */
    int64_t used_bytes;    /* memory NVML charges to it there; -1 when it cannot tell */
} kgpu_gpu_mig_proc;

/*
 * The compute processes (MPS clients too) on GPU `index` (NVML index, after
 * kgpu_nvml_discover), one record per (PID, MIG device), merged across the
 * two lists; *n <= cap, more is KGPU_ERANGE. KGPU_ENOENT when the driver's
 * NVML lacks the process list or fills only the records without instance
 * IDs (drivers before the _v2 functions, which predate MIG anyway). No SM
 * utilization: NVML does not report it per process in MIG mode.
 */
int kgpu_nvml_mig_processes(kgpu_nvml *nv, int index, kgpu_gpu_mig_proc *out, int cap, int *n,
                            kgpu_error *err);

#endif
