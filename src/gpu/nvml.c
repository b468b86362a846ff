/*
 * NVML through dlopen. The declarations (nvml_priv.h) are kgpu's own, from
 * NVML's documented ABI: return codes are ints (0 = success), devices and
 * event sets are opaque pointers, and only the structures read here are
 * spelled out. Versioned symbols are tried newest first, as the driver
 * exports both for compatibility. MIG instances: nvml_mig.c.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "gpu.h"
#include "kgpu/model.h"
#include "nvml_priv.h"

/* The first of `names` (NULL-terminated) the library exports. */
static void *resolve(void *lib, const char *const *names)
{
    for (; *names != NULL; names++) {
        void *f = dlsym(lib, *names);
        if (f != NULL)
            return f;
    }
    return NULL;
}

int kgpu_nvml_open(const char *library, const char *sysfs, kgpu_nvml **out, kgpu_error *err)
{
    *out = NULL;
    if (library == NULL)
        library = "libnvidia-ml.so.1";
    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        return kgpu_error_set(err, KGPU_ENOENT, "cannot load NVML (%s): %s", library,
                              why ? why : "unknown reason");
    }
    kgpu_nvml *nv = calloc(1, sizeof(*nv));
    if (nv == NULL) {
        dlclose(lib);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    nv->lib = lib;
    snprintf(nv->sysfs, sizeof(nv->sysfs), "%s", sysfs ? sysfs : "/sys");

    static const struct {
        size_t offset;
        const char *names[3];
    } required[] = {
        {offsetof(kgpu_nvml, init), {"nvmlInit_v2", "nvmlInit", NULL}},
        {offsetof(kgpu_nvml, shutdown), {"nvmlShutdown", NULL}},
        {offsetof(kgpu_nvml, count), {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount", NULL}},
        {offsetof(kgpu_nvml, by_index),
         {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex", NULL}},
        {offsetof(kgpu_nvml, uuid), {"nvmlDeviceGetUUID", NULL}},
        {offsetof(kgpu_nvml, name), {"nvmlDeviceGetName", NULL}},
        {offsetof(kgpu_nvml, memory), {"nvmlDeviceGetMemoryInfo", NULL}},
        {offsetof(kgpu_nvml, pci), {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", NULL}},
    };
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        void *f = resolve(lib, required[i].names);
        if (f == NULL) {
            kgpu_error_set(err, KGPU_ENOENT, "%s lacks the required function %s", library,
                           required[i].names[0]);
            kgpu_nvml_close(nv);
            return KGPU_ENOENT;
        }
        memcpy((char *)nv + required[i].offset, &f, sizeof(f));
    }
    void *f;
    if ((f = resolve(lib, (const char *const[]){"nvmlErrorString", NULL})) != NULL)
        memcpy(&nv->error_string, &f, sizeof(f));
    /* Events are optional: all four or none. */
    void *ev[4] = {
        resolve(lib, (const char *const[]){"nvmlEventSetCreate", NULL}),
        resolve(lib, (const char *const[]){"nvmlDeviceRegisterEvents", NULL}),
        resolve(lib, (const char *const[]){"nvmlEventSetWait_v2", "nvmlEventSetWait", NULL}),
        resolve(lib, (const char *const[]){"nvmlEventSetFree", NULL}),
    };
    if (ev[0] && ev[1] && ev[2] && ev[3]) {
        memcpy(&nv->set_create, &ev[0], sizeof(void *));
        memcpy(&nv->register_events, &ev[1], sizeof(void *));
        memcpy(&nv->set_wait, &ev[2], sizeof(void *));
        memcpy(&nv->set_free, &ev[3], sizeof(void *));
    }
    /* Process lists: newest first; the unversioned one fills the shorter v1 record. */
    static const struct {
        const char *name;
        size_t size;
        bool mps;
    } procs[] = {
        {"nvmlDeviceGetComputeRunningProcesses_v3", sizeof(nvml_process_info), false},
        {"nvmlDeviceGetComputeRunningProcesses_v2", sizeof(nvml_process_info), false},
        {"nvmlDeviceGetComputeRunningProcesses", sizeof(nvml_process_info_v1), false},
        {"nvmlDeviceGetMPSComputeRunningProcesses_v3", sizeof(nvml_process_info), true},
        {"nvmlDeviceGetMPSComputeRunningProcesses_v2", sizeof(nvml_process_info), true},
        {"nvmlDeviceGetMPSComputeRunningProcesses", sizeof(nvml_process_info_v1), true},
    };
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        nvml_procs_fn *slot = procs[i].mps ? &nv->mps_procs : &nv->compute_procs;
        if (*slot != NULL || (f = dlsym(lib, procs[i].name)) == NULL)
            continue;
        memcpy(slot, &f, sizeof(f));
        *(procs[i].mps ? &nv->mps_size : &nv->compute_size) = procs[i].size;
    }
    if ((f = resolve(lib, (const char *const[]){"nvmlDeviceGetProcessUtilization", NULL})) != NULL)
        memcpy(&nv->proc_util, &f, sizeof(f));
    if ((f = resolve(lib, (const char *const[]){"nvmlDeviceGetCudaComputeCapability", NULL})) !=
        NULL)
        memcpy(&nv->cuda_cc, &f, sizeof(f));
    /* MIG is optional: without it mig_mode is -1 and nvml_mig.c's calls say what is missing. */
    if ((f = resolve(lib, (const char *const[]){"nvmlDeviceGetMigMode", NULL})) != NULL)
        memcpy(&nv->mig_mode, &f, sizeof(f));
    nvml_ret r = nv->init();
    if (r != NVML_OK) {
        kgpu_error_set(err, KGPU_EIO, "nvmlInit: %s (%d)", nvml_strerror(nv, r), r);
        kgpu_nvml_close(nv);
        return KGPU_EIO;
    }
    nv->initialised = true;
    *out = nv;
    return KGPU_OK;
}

void kgpu_nvml_close(kgpu_nvml *nv)
{
    if (nv == NULL)
        return;
    if (nv->events != NULL && nv->set_free != NULL)
        nv->set_free(nv->events);
    if (nv->initialised)
        nv->shutdown();
    free(nv->devices);
    free(nv->util_seen);
    free(nv->mig);
    dlclose(nv->lib);
    free(nv);
}

bool kgpu_nvml_has_events(const kgpu_nvml *nv)
{
    return nv->set_create != NULL;
}

/* NUMA node of a PCI device from sysfs; -1 when absent or unknown. */
static int numa_of(const kgpu_nvml *nv, const char *bus_id)
{
    /* NVML writes an 8-digit domain ("00000000:3B:00.0"); sysfs uses 4, lower case. */
    char id[32];
    size_t len = strlen(bus_id);
    const char *colon = strchr(bus_id, ':');
    if (colon == NULL || len >= sizeof(id))
        return -1;
    size_t domain_len = (size_t)(colon - bus_id);
    size_t skip = domain_len > 4 ? domain_len - 4 : 0;
    snprintf(id, sizeof(id), "%.*s%s", (int)(domain_len - skip), bus_id + skip, colon);
    for (char *p = id; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    char path[512];
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/numa_node", nv->sysfs, id);
    char *buf;
    size_t n;
    if (kgpu_read_file_max(path, 64, &buf, &n, NULL) != KGPU_OK)
        return -1;
    char *end;
    long v = strtol(buf, &end, 10);
    bool ok = end != buf && v >= 0 && v < 1024;
    free(buf);
    return ok ? (int)v : -1;
}

int kgpu_nvml_discover(kgpu_nvml *nv, kgpu_gpu_info **gpus, int *ngpus, kgpu_error *err)
{
    *gpus = NULL;
    *ngpus = 0;
    unsigned int count = 0;
    nvml_ret r = nv->count(&count);
    if (r != NVML_OK)
        return kgpu_error_set(err, KGPU_EIO, "nvmlDeviceGetCount: %s", nvml_strerror(nv, r));
    if (count > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "NVML reports %u GPUs; kgpu handles at most %d",
                              count, KGPU_MAX_GPUS_PER_NODE);
    kgpu_gpu_info *out = calloc(count ? count : 1, sizeof(*out));
    nvml_device *devs = calloc(count ? count : 1, sizeof(*devs));
    if (out == NULL || devs == NULL) {
        free(out);
        free(devs);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int n = 0;
    nv->skipped[0] = '\0';
    for (unsigned int i = 0; i < count; i++) {
        kgpu_gpu_info *g = &out[n];
        memset(g, 0, sizeof(*g));
        const char *what = "nvmlDeviceGetHandleByIndex";
        nvml_memory mem;
        nvml_pci_info pci;
        memset(&pci, 0, sizeof(pci));
        if ((r = nv->by_index(i, &devs[i])) != NVML_OK ||
            (what = "nvmlDeviceGetUUID", r = nv->uuid(devs[i], g->uuid, sizeof(g->uuid))) !=
                NVML_OK ||
            (what = "nvmlDeviceGetName", r = nv->name(devs[i], g->model, sizeof(g->model))) !=
                NVML_OK ||
            (what = "nvmlDeviceGetMemoryInfo", r = nv->memory(devs[i], &mem)) != NVML_OK) {
            /*
             * A GPU that does not answer (lost, or fallen off the bus) is left
             * out rather than failing the node: its siblings still work. The
             * caller sees the gap in the indices (kgpu_nvml_device_count).
             */
            snprintf(nv->skipped, sizeof(nv->skipped), "GPU %u: %s: %s", i, what,
                     nvml_strerror(nv, r));
            continue;
        }
        g->uuid[sizeof(g->uuid) - 1] = '\0';
        g->model[sizeof(g->model) - 1] = '\0';
        g->index = (int)i;
        g->memory_mib = (int64_t)(mem.total / (1024 * 1024));
        g->healthy = true;
        g->numa = -1;
        if (nv->pci(devs[i], &pci) == NVML_OK) {
            pci.bus_id[sizeof(pci.bus_id) - 1] = '\0';
            snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "%s", pci.bus_id);
            g->numa = numa_of(nv, pci.bus_id);
        }
        /* Unknown rather than a GPU left out: only the DRA slice's attribute needs it. */
        int major = -1, minor = -1;
        char cc[32];
        if (nv->cuda_cc != NULL && nv->cuda_cc(devs[i], &major, &minor) == NVML_OK && major >= 0 &&
            minor >= 0 && (size_t)snprintf(cc, sizeof(cc), "%d.%d", major, minor) <
                              sizeof(g->compute_capability))
            memcpy(g->compute_capability, cc, strlen(cc) + 1);
        /* The current mode (a pending change waits for a GPU reset kgpu never makes). */
        unsigned int mig_now = 0, mig_pending = 0;
        g->mig_mode = -1;
        if (nv->mig_mode != NULL && nv->mig_mode(devs[i], &mig_now, &mig_pending) == NVML_OK)
            g->mig_mode = mig_now != 0 ? 1 : 0;
        n++;
    }
    unsigned long long *seen = calloc(count ? count : 1, sizeof(*seen));
    if (seen == NULL) {
        free(out);
        free(devs);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    free(nv->devices);
    free(nv->util_seen);
    nv->devices = devs;
    nv->util_seen = seen;
    nv->ndevices = (int)count;
    if (nv->set_create != NULL && nv->events == NULL && nv->set_create(&nv->events) != NVML_OK)
        nv->events = NULL;
    if (nv->events != NULL) {
        /* A GPU that refuses events stays usable; only its XIDs go unseen. */
        for (int i = 0; i < nv->ndevices; i++)
            (void)nv->register_events(devs[i], NVML_EVENT_XID_CRITICAL, nv->events);
    }
    *gpus = out;
    *ngpus = n;
    return KGPU_OK;
}

int kgpu_nvml_wait_xid(kgpu_nvml *nv, unsigned timeout_ms, int *index, unsigned long long *xid,
                       kgpu_error *err)
{
    if (nv->events == NULL)
        return 0;
    nvml_event_data data;
    memset(&data, 0, sizeof(data));
    nvml_ret r = nv->set_wait(nv->events, &data, timeout_ms);
    if (r == NVML_ERR_TIMEOUT)
        return 0;
    if (r != NVML_OK)
        return kgpu_error_set(err, KGPU_EIO, "nvmlEventSetWait: %s", nvml_strerror(nv, r));
    *index = -1;
    for (int i = 0; i < nv->ndevices; i++)
        if (nv->devices[i] == data.device)
            *index = i;
    *xid = data.event_data;
    return 1;
}

int kgpu_nvml_device_count(const kgpu_nvml *nv)
{
    return nv->ndevices;
}

const char *kgpu_nvml_skipped(const kgpu_nvml *nv)
{
    return nv->skipped;
}

bool kgpu_nvml_alive(kgpu_nvml *nv, int index)
{
    if (index < 0 || index >= nv->ndevices)
        return false;
    char uuid[KGPU_GPU_UUID_MAX];
    return nv->uuid(nv->devices[index], uuid, sizeof(uuid)) != NVML_ERR_GPU_IS_LOST;
}

int nvml_proc_records(kgpu_nvml *nv, int index, nvml_procs_fn fn, size_t size,
                      const char *what, void **records, unsigned int *count, kgpu_error *err)
{
    nvml_ret r = NVML_OK;
    void *buf = NULL;
    *records = NULL;
    for (int attempt = 0; attempt < 4; attempt++) {
        *count = 0;
        r = fn(nv->devices[index], count, NULL);
        if (r == NVML_OK)
            return KGPU_OK; /* no process */
        if (r != NVML_ERR_INSUFFICIENT_SIZE)
            break;
        *count += 8; /* room for processes that start meanwhile */
        if (*count > KGPU_GPU_PROCS_MAX)
            *count = KGPU_GPU_PROCS_MAX;
        free(buf);
        if ((buf = calloc(*count, size)) == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        r = fn(nv->devices[index], count, buf);
        if (r != NVML_ERR_INSUFFICIENT_SIZE)
            break;
    }
    if (r != NVML_OK) {
        free(buf);
        *count = 0;
        return kgpu_error_set(err, KGPU_EIO, "GPU %d: %s: %s", index, what, nvml_strerror(nv, r));
    }
    *records = buf;
    return KGPU_OK;
}

int64_t nvml_used_bytes(unsigned long long used)
{
    return used == NVML_NOT_AVAILABLE_ULL || used > (unsigned long long)INT64_MAX ? -1
                                                                                  : (int64_t)used;
}

/* One of NVML's process lists into `out` (merged by PID: the same PID's memory added). */
static int read_procs(kgpu_nvml *nv, int index, nvml_procs_fn fn, size_t size, const char *what,
                      kgpu_gpu_proc *out, int cap, int *n, kgpu_error *err)
{
    void *buf;
    unsigned int count;
    int rc = nvml_proc_records(nv, index, fn, size, what, &buf, &count, err);
    if (rc != KGPU_OK)
        return rc;
    for (unsigned int i = 0; i < count; i++) {
        const char *rec = (const char *)buf + (size_t)i * size;
        nvml_process_info_v1 pi; /* the first two members of every version */
        memcpy(&pi, rec, sizeof(pi));
        int64_t used = nvml_used_bytes(pi.used_gpu_memory);
        int k = 0;
        while (k < *n && out[k].pid != pi.pid)
            k++;
        if (k == *n) {
            if (*n >= cap) {
                free(buf);
                return kgpu_error_set(err, KGPU_ERANGE, "GPU %d: more than %d processes", index,
                                      cap);
            }
            out[k] = (kgpu_gpu_proc){.pid = pi.pid, .used_bytes = used, .sm_pct = 0};
            (*n)++;
        } else if (used < 0 || out[k].used_bytes < 0) {
            out[k].used_bytes = -1;
        } else {
            out[k].used_bytes += used;
        }
    }
    free(buf);
    return KGPU_OK;
}

/* Mean SM utilization per PID over the samples newer than the last call's. */
static void read_util(kgpu_nvml *nv, int index, kgpu_gpu_proc *procs, int n, bool *no_util)
{
    unsigned int count = 0;
    nvml_ret r = nv->proc_util(nv->devices[index], NULL, &count, nv->util_seen[index]);
    if (r == NVML_ERR_NOT_FOUND || (r == NVML_OK && count == 0))
        return; /* no sample since the last call: every process was idle */
    if (r != NVML_ERR_INSUFFICIENT_SIZE && r != NVML_OK) {
        if (no_util != NULL)
            *no_util = true;
        return;
    }
    count += 8;
    if (count > 4 * KGPU_GPU_PROCS_MAX)
        count = 4 * KGPU_GPU_PROCS_MAX;
    nvml_process_sample *s = calloc(count, sizeof(*s));
    if (s == NULL)
        return;
    r = nv->proc_util(nv->devices[index], s, &count, nv->util_seen[index]);
    if (r == NVML_OK) {
        for (int k = 0; k < n; k++) {
            unsigned long long sum = 0, samples = 0;
            for (unsigned int i = 0; i < count; i++)
                if (s[i].pid == procs[k].pid && s[i].time_stamp > nv->util_seen[index]) {
                    sum += s[i].sm_util > 100 ? 100 : s[i].sm_util;
                    samples++;
                }
            procs[k].sm_pct = samples ? (int)(sum / samples) : 0;
        }
        unsigned long long newest = nv->util_seen[index];
        for (unsigned int i = 0; i < count; i++)
            if (s[i].time_stamp > newest)
                newest = s[i].time_stamp;
        nv->util_seen[index] = newest;
    }
    free(s);
}

int kgpu_nvml_processes(kgpu_nvml *nv, int index, kgpu_gpu_proc *out, int cap, int *n,
                        bool *no_util, kgpu_error *err)
{
    *n = 0;
    if (no_util != NULL)
        *no_util = nv->proc_util == NULL;
    if (index < 0 || index >= nv->ndevices)
        return kgpu_error_set(err, KGPU_EINVAL, "GPU %d: no such NVML index", index);
    if (nv->compute_procs == NULL)
        return kgpu_error_set(err, KGPU_ENOENT,
                              "this NVML lacks nvmlDeviceGetComputeRunningProcesses: the node "
                              "cannot see its GPU processes");
    int rc = read_procs(nv, index, nv->compute_procs, nv->compute_size,
                        "nvmlDeviceGetComputeRunningProcesses", out, cap, n, err);
    if (rc == KGPU_OK && nv->mps_procs != NULL) {
        kgpu_error e = {0};
        /* MPS clients: a driver without MPS answers NOT_SUPPORTED, which is no error here. */
        if (read_procs(nv, index, nv->mps_procs, nv->mps_size,
                       "nvmlDeviceGetMPSComputeRunningProcesses", out, cap, n, &e) == KGPU_ERANGE)
            rc = kgpu_error_set(err, KGPU_ERANGE, "%s", e.msg);
    }
    if (rc == KGPU_OK && nv->proc_util != NULL && *n > 0)
        read_util(nv, index, out, *n, no_util);
    return rc;
}
