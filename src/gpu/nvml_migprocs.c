/*
 * The processes of a GPU in MIG mode, each with its MIG device (migprocs.h),
 * from the same NVML lists as kgpu_nvml_processes, read as the _v2/_v3
 * records they are: those carry gpuInstanceId and computeInstanceId.
 */
#include <stdlib.h>
#include <string.h>

#include "migprocs.h"
#include "nvml_priv.h"

/* One process list with its records' instance IDs, merged into out (nvml_proc_records). */
static int read_list(kgpu_nvml *nv, int index, nvml_procs_fn fn, const char *what,
                     kgpu_gpu_mig_proc *out, int cap, int *n, kgpu_error *err)
{
    void *records;
    unsigned int count;
    int rc = nvml_proc_records(nv, index, fn, sizeof(nvml_process_info), what, &records, &count,
                               err);
    if (rc != KGPU_OK)
        return rc;
    const nvml_process_info *buf = records;
    for (unsigned int i = 0; i < count && rc == KGPU_OK; i++) {
        const nvml_process_info *pi = &buf[i];
        int64_t used = nvml_used_bytes(pi->used_gpu_memory);
        int k = 0;
        while (k < *n && !(out[k].pid == pi->pid && out[k].gi_id == pi->gpu_instance_id &&
                           out[k].ci_id == pi->compute_instance_id))
            k++;
        if (k < *n) {
            /* Listed twice (compute and MPS): the same memory, counted once. */
            if (used < 0 || out[k].used_bytes < 0)
                out[k].used_bytes = -1;
            else if (used > out[k].used_bytes)
                out[k].used_bytes = used;
        } else if (*n >= cap) {
            rc = kgpu_error_set(err, KGPU_ERANGE, "GPU %d: more than %d processes", index, cap);
        } else {
            out[(*n)++] = (kgpu_gpu_mig_proc){.pid = pi->pid,
                                              .gi_id = pi->gpu_instance_id,
                                              .ci_id = pi->compute_instance_id,
                                              .used_bytes = used};
        }
    }
    free(records);
    return rc;
}

int kgpu_nvml_mig_processes(kgpu_nvml *nv, int index, kgpu_gpu_mig_proc *out, int cap, int *n,
                            kgpu_error *err)
{
    *n = 0;
    if (index < 0 || index >= nv->ndevices)
        return kgpu_error_set(err, KGPU_EINVAL, "GPU %d: no such NVML index", index);
    if (nv->compute_procs == NULL || nv->compute_size != sizeof(nvml_process_info))
        return kgpu_error_set(err, KGPU_ENOENT,
                              "GPU %d: this NVML has no process list with MIG instance IDs "
                              "(nvmlDeviceGetComputeRunningProcesses_v2 or _v3)",
                              index);
    int rc = read_list(nv, index, nv->compute_procs, "nvmlDeviceGetComputeRunningProcesses", out,
                       cap, n, err);
    if (rc == KGPU_OK && nv->mps_procs != NULL && nv->mps_size == sizeof(nvml_process_info)) {
        kgpu_error e = {0};
        /* A driver without MPS answers NOT_SUPPORTED, which is no error here. */
        if (read_list(nv, index, nv->mps_procs, "nvmlDeviceGetMPSComputeRunningProcesses", out,
                      cap, n, &e) == KGPU_ERANGE)
            rc = kgpu_error_set(err, KGPU_ERANGE, "%s", e.msg);
    }
    return rc;
}
