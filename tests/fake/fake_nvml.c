/*
 * A stand-in for libnvidia-ml.so.1 that behaves like the real one for the
 * calls kgpu makes: init must come first, handles are opaque, strings are
 * truncated to the caller's size with NVML's "insufficient size" code,
 * events are delivered through an event set. Its GPUs come from the
 * environment, so tests need no files:
 *   FAKE_NVML_GPUS   "uuid,name,MiB,busid[,major.minor];..."   (default: none);
 *                    major.minor is the CUDA compute capability (default 8.0:
 *                    the real call answers for every GPU it knows)
 *   FAKE_NVML_INIT   a return code for nvmlInit_v2 (default 0)
 *   FAKE_NVML_XID    "index:xid" delivered by the first wait
 *   FAKE_NVML_LOST   index of a GPU that reports GPU_IS_LOST
 *   FAKE_NVML_PROCS  a file of GPU processes, read again at every call so a
 *                    test scripts them as it goes; one per line:
 *                    "<gpu index> <pid> <used MiB, or - for not available>
 *                    <SM %> [mps]" ('#' starts a comment). A process with SM
 *                    above 0 gets one utilization sample stamped with the
 *                    current time, as a busy process does on the driver.
 *   FAKE_NVML_NO_UTIL set: nvmlDeviceGetProcessUtilization answers NOT_SUPPORTED
 * nvmlInit counts its calls and nvmlShutdown only shuts down at the last, as
 * NVML documents, so two handles in one process (the plugin's discovery and
 * its watcher) live side by side.
 * nvmlDeviceGetMemoryInfo(_v2) report the whole card free (the interception
 * library's tests check that it reports the container's share instead),
 * unless FAKE_GPU_MEM_FILE names the fake driver's shared memory file
 * (fake_gpumem.h): then they report what the fake drivers of all processes
 * hold, and every process holding memory there is listed with it as a
 * compute process (after the FAKE_NVML_PROCS ones, which win for a pid
 * they name on that GPU).
 * Variants built with -DFAKE_NO_EVENTS (no event functions) and
 * -DFAKE_NO_MEMINFO (a required function missing) test the loader;
 * -DFAKE_PROCS_V1 exports only the unversioned process list, which fills
 * the older 16-byte records, as drivers before the _v2 functions did.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "fake_gpumem.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct fake_dev {
    char uuid[96], name[96], bus[32];
    unsigned long long mib;
    int cc_major, cc_minor;
} fake_dev;

typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} fake_pci;

typedef struct {
    fake_dev *device;
    unsigned long long event_type, event_data;
    unsigned int gi, ci;
} fake_event;

static fake_dev devs[16];
static unsigned ndevs;
static int initialised; /* nvmlInit calls not yet matched by nvmlShutdown */
static int xid_sent;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

EXPORT int nvmlInit_v2(void);
EXPORT int nvmlShutdown(void);
EXPORT const char *nvmlErrorString(int r);
EXPORT int nvmlDeviceGetCount_v2(unsigned int *n);
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, fake_dev **d);
EXPORT int nvmlDeviceGetUUID(fake_dev *d, char *buf, unsigned int len);
EXPORT int nvmlDeviceGetName(fake_dev *d, char *buf, unsigned int len);
EXPORT int nvmlDeviceGetPciInfo_v3(fake_dev *d, fake_pci *p);

/*
 * The fake drivers' shared memory file (FAKE_GPU_MEM_FILE), mapped again
 * whenever the variable names another (a test process sets it per case);
 * NULL without it.
 */
static fake_mem_file *shared;
static char shared_path[512];
static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;

static fake_mem_file *shared_mem(void)
{
    const char *path = getenv("FAKE_GPU_MEM_FILE");
    path = path != NULL ? path : "";
    pthread_mutex_lock(&shared_mu);
    if (strcmp(path, shared_path) != 0) {
        if (shared != NULL)
            munmap(shared, sizeof(*shared));
        shared = fake_mem_open();
        snprintf(shared_path, sizeof(shared_path), "%s", path);
    }
    fake_mem_file *f = shared;
    pthread_mutex_unlock(&shared_mu);
    return f;
}

static int init_locked(void)
{
    const char *rc = getenv("FAKE_NVML_INIT");
    if (rc != NULL && atoi(rc) != 0)
        return atoi(rc);
    if (initialised > 0) {
        initialised++;
        return 0;
    }
    ndevs = 0;
    const char *spec = getenv("FAKE_NVML_GPUS");
    while (spec != NULL && *spec && ndevs < 16) {
        fake_dev *d = &devs[ndevs];
        memset(d, 0, sizeof(*d));
        int used = 0;
        if (sscanf(spec, "%95[^,],%95[^,],%llu,%31[^,;]%n", d->uuid, d->name, &d->mib, d->bus,
                   &used) != 4 || used == 0)
            return 999; /* NVML_ERROR_UNKNOWN */
        d->cc_major = 8;
        d->cc_minor = 0;
        if (spec[used] == ',' &&
            sscanf(spec + used, ",%d.%d", &d->cc_major, &d->cc_minor) != 2)
            return 999;
        ndevs++;
        spec = strchr(spec, ';');
        spec = spec ? spec + 1 : NULL;
    }
    initialised = 1;
    xid_sent = 0;
    return 0;
}

int nvmlInit_v2(void)
{
    pthread_mutex_lock(&init_mu);
    int rc = init_locked();
    pthread_mutex_unlock(&init_mu);
    return rc;
}

int nvmlShutdown(void)
{
    pthread_mutex_lock(&init_mu);
    int rc = initialised > 0 ? 0 : 1; /* UNINITIALIZED */
    if (initialised > 0)
        initialised--;
    pthread_mutex_unlock(&init_mu);
    return rc;
}

const char *nvmlErrorString(int r)
{
    switch (r) {
    case 0:
        return "Success";
    case 1:
        return "Uninitialized";
    case 2:
        return "Invalid Argument";
    case 7:
        return "Insufficient Size";
    case 9:
        return "Driver Not Loaded";
    case 10:
        return "Timeout";
    case 15:
        return "GPU is lost";
    default:
        return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (!initialised)
        return 1;
    *n = ndevs;
    return 0;
}

static int lost(const fake_dev *d)
{
    const char *l = getenv("FAKE_NVML_LOST");
    return l != NULL && d == &devs[atoi(l)];
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, fake_dev **d)
{
    if (!initialised)
        return 1;
    if (i >= ndevs || d == NULL)
        return 2;
    *d = &devs[i];
    return 0;
}

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, fake_dev **d);
int nvmlDeviceGetHandleByUUID(const char *uuid, fake_dev **d)
{
    if (!initialised)
        return 1;
    if (uuid == NULL || d == NULL)
        return 2;
    for (unsigned i = 0; i < ndevs; i++)
        if (strcmp(devs[i].uuid, uuid) == 0) {
            *d = &devs[i];
            return 0;
        }
    return 6; /* NOT_FOUND */
}

static int copy_str(char *buf, unsigned int len, const char *s)
{
    if (strlen(s) + 1 > len)
        return 7;
    memcpy(buf, s, strlen(s) + 1);
    return 0;
}

int nvmlDeviceGetUUID(fake_dev *d, char *buf, unsigned int len)
{
    if (!initialised)
        return 1;
    if (lost(d))
        return 15;
    return copy_str(buf, len, d->uuid);
}

int nvmlDeviceGetName(fake_dev *d, char *buf, unsigned int len)
{
    return initialised ? copy_str(buf, len, d->name) : 1;
}

#ifndef FAKE_NO_MEMINFO
EXPORT int nvmlDeviceGetMemoryInfo(fake_dev *d, unsigned long long m[3]);
/* Bytes in use on d: what the fake drivers hold, with FAKE_GPU_MEM_FILE; else nothing. */
static unsigned long long mem_used(const fake_dev *d)
{
    fake_mem_file *f = shared_mem();
    unsigned i = (unsigned)(d - devs);
    return f != NULL && i < FAKE_MEM_DEVS ? fake_mem_device_used(f, (int)i) : 0;
}

int nvmlDeviceGetMemoryInfo(fake_dev *d, unsigned long long m[3])
{
    if (!initialised)
        return 1;
    unsigned long long total = d->mib * 1024 * 1024, used = mem_used(d);
#ifdef FAKE_NVML_HOSTILE
    /*
     * A tenant's own libnvidia-ml.so.1 that lies (issue 25): every call
     * reports 33 MiB more in use than the last, whatever the GPU holds, so
     * whatever is measured across two calls "took" 33 MiB.
     */
    static unsigned long long calls;
    used = ++calls * 33 * 1024 * 1024;
#endif
    m[0] = total;
    m[2] = used < total ? used : total;
    m[1] = total - m[2];
    return 0;
}

/* nvmlMemory_v2_t: a version word (its size | 2 << 24), then total, reserved, free, used. */
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} fake_memory_v2;

EXPORT int nvmlDeviceGetMemoryInfo_v2(fake_dev *d, fake_memory_v2 *m);
int nvmlDeviceGetMemoryInfo_v2(fake_dev *d, fake_memory_v2 *m)
{
    if (!initialised)
        return 1;
    if (m == NULL)
        return 2;
    if (m->version != (unsigned)(sizeof(*m) | 2u << 24))
        return 25; /* ARGUMENT_VERSION_MISMATCH */
    unsigned long long used = mem_used(d);
    m->total = d->mib * 1024 * 1024;
    m->reserved = 0;
    m->used = used < m->total ? used : m->total;
    m->free = m->total - m->used;
    return 0;
}
#endif

/*
 * As NVML documents it: UNINITIALIZED before init, INVALID_ARGUMENT for a
 * device that is not one or a NULL output, GPU_IS_LOST for a lost GPU.
 */
EXPORT int nvmlDeviceGetCudaComputeCapability(fake_dev *d, int *major, int *minor);
int nvmlDeviceGetCudaComputeCapability(fake_dev *d, int *major, int *minor)
{
    if (!initialised)
        return 1;
    if (d == NULL || d < devs || d >= devs + ndevs || major == NULL || minor == NULL)
        return 2;
    if (lost(d))
        return 15;
    *major = d->cc_major;
    *minor = d->cc_minor;
    return 0;
}

int nvmlDeviceGetPciInfo_v3(fake_dev *d, fake_pci *p)
{
    if (!initialised)
        return 1;
    memset(p, 0, sizeof(*p));
    return copy_str(p->bus_id, sizeof(p->bus_id), d->bus);
}

#ifndef FAKE_NO_EVENTS
EXPORT int nvmlEventSetCreate(int **set);
EXPORT int nvmlDeviceRegisterEvents(fake_dev *d, unsigned long long types, int *set);
EXPORT int nvmlEventSetWait_v2(int *set, fake_event *e, unsigned int ms);
EXPORT int nvmlEventSetFree(int *set);
static int the_set;

int nvmlEventSetCreate(int **set)
{
    *set = &the_set;
    return 0;
}

int nvmlDeviceRegisterEvents(fake_dev *d, unsigned long long types, int *set)
{
    return set == &the_set && (types & 0x8ULL) ? 0 : 2;
}

int nvmlEventSetWait_v2(int *set, fake_event *e, unsigned int ms)
{
    const char *x = getenv("FAKE_NVML_XID");
    unsigned idx;
    unsigned long long xid;
    if (set != &the_set)
        return 2;
    if (x == NULL || xid_sent || sscanf(x, "%u:%llu", &idx, &xid) != 2 || idx >= ndevs)
        return 10; /* TIMEOUT, without sleeping: tests need no clock */
    xid_sent = 1;
    memset(e, 0, sizeof(*e));
    e->device = &devs[idx];
    e->event_type = 0x8ULL;
    e->event_data = xid;
    return 0;
}

int nvmlEventSetFree(int *set)
{
    return set == &the_set ? 0 : 2;
}
#endif

/* ---- processes (FAKE_NVML_PROCS) ---- */

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci;
} fake_proc_info; /* nvmlProcessInfo_t (v2, v3) */

typedef struct {
    unsigned int pid;
    unsigned long long ts;
    unsigned int sm, mem, enc, dec;
} fake_util_sample; /* nvmlProcessUtilizationSample_t */

typedef struct {
    unsigned gpu, pid, sm;
    unsigned long long used; /* bytes; ~0ULL = NVML_VALUE_NOT_AVAILABLE */
    int mps;
} fake_proc;

#define FAKE_PROCS_MAX 256

/*
 * The script's processes now (a line that does not parse is left out), then
 * those holding memory in FAKE_GPU_MEM_FILE that the script does not name.
 */
static unsigned read_script(fake_proc *out)
{
    const char *path = getenv("FAKE_NVML_PROCS");
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    unsigned n = 0;
    char line[256];
    while (f != NULL && n < FAKE_PROCS_MAX && fgets(line, sizeof(line), f) != NULL) {
        char used[32], kind[16] = "";
        fake_proc *p = &out[n];
        if (line[0] == '#' || sscanf(line, "%u %u %31s %u %15s", &p->gpu, &p->pid, used, &p->sm,
                                     kind) < 4)
            continue;
        p->used = strcmp(used, "-") == 0 ? ~0ULL : strtoull(used, NULL, 10) * 1024 * 1024;
        p->mps = strcmp(kind, "mps") == 0;
        n++;
    }
    if (f != NULL)
        fclose(f);
    fake_mem_file *m = shared_mem();
    unsigned scripted = n;
    for (int s = 0; m != NULL && s < FAKE_MEM_SLOTS; s++) {
        int pid = __atomic_load_n(&m->slot[s].pid, __ATOMIC_ACQUIRE);
        for (unsigned g = 0; fake_mem_slot_alive(m, s) && g < FAKE_MEM_DEVS && n < FAKE_PROCS_MAX;
             g++) {
            unsigned long long used = __atomic_load_n(&m->slot[s].used[g], __ATOMIC_ACQUIRE);
            int named = 0;
            for (unsigned i = 0; i < scripted; i++)
                named |= out[i].gpu == g && out[i].pid == (unsigned)pid;
            if (used != 0 && !named)
                out[n++] = (fake_proc){.gpu = g, .pid = (unsigned)pid, .used = used};
        }
    }
    return n;
}

static unsigned dev_index(const fake_dev *d)
{
    return (unsigned)(d - devs);
}

typedef struct {
    unsigned int pid;
    unsigned long long used;
} fake_proc_info_v1; /* nvmlProcessInfo_v1_t */

/*
 * A process list: the NVML contract of sizing with *count = 0 and
 * INSUFFICIENT_SIZE. `v1` fills the older 16-byte records instead.
 */
static int list_procs_as(fake_dev *d, unsigned int *count, void *infos, int mps, int v1)
{
    if (!initialised)
        return 1;
    if (d == NULL || count == NULL || dev_index(d) >= ndevs)
        return 2;
    fake_proc all[FAKE_PROCS_MAX];
    unsigned n = read_script(all), k = 0;
    for (unsigned i = 0; i < n; i++)
        if (all[i].gpu == dev_index(d) && all[i].mps == mps)
            k++;
    if (k > *count || (k > 0 && infos == NULL)) {
        *count = k;
        return 7; /* INSUFFICIENT_SIZE */
    }
    *count = 0;
    for (unsigned i = 0; i < n; i++) {
        if (all[i].gpu != dev_index(d) || all[i].mps != mps)
            continue;
        if (v1)
            ((fake_proc_info_v1 *)infos)[*count] = (fake_proc_info_v1){all[i].pid, all[i].used};
        else
            ((fake_proc_info *)infos)[*count] = (fake_proc_info){all[i].pid, all[i].used, ~0u, ~0u};
        (*count)++;
    }
    return 0;
}

#ifdef FAKE_PROCS_V1
EXPORT int nvmlDeviceGetComputeRunningProcesses(fake_dev *d, unsigned int *count,
                                                fake_proc_info_v1 *infos);
int nvmlDeviceGetComputeRunningProcesses(fake_dev *d, unsigned int *count, fake_proc_info_v1 *infos)
{
    return list_procs_as(d, count, infos, 0, 1);
}
#else
static int list_procs(fake_dev *d, unsigned int *count, fake_proc_info *infos, int mps)
{
    return list_procs_as(d, count, infos, mps, 0);
}

EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(fake_dev *d, unsigned int *count,
                                                   fake_proc_info *infos);
int nvmlDeviceGetComputeRunningProcesses_v3(fake_dev *d, unsigned int *count, fake_proc_info *infos)
{
    return list_procs(d, count, infos, 0);
}

EXPORT int nvmlDeviceGetMPSComputeRunningProcesses_v3(fake_dev *d, unsigned int *count,
                                                      fake_proc_info *infos);
int nvmlDeviceGetMPSComputeRunningProcesses_v3(fake_dev *d, unsigned int *count,
                                               fake_proc_info *infos)
{
    return list_procs(d, count, infos, 1);
}
#endif

EXPORT int nvmlDeviceGetProcessUtilization(fake_dev *d, fake_util_sample *s, unsigned int *count,
                                           unsigned long long last_seen);
int nvmlDeviceGetProcessUtilization(fake_dev *d, fake_util_sample *s, unsigned int *count,
                                    unsigned long long last_seen)
{
    if (!initialised)
        return 1;
    if (getenv("FAKE_NVML_NO_UTIL") != NULL)
        return 3; /* NOT_SUPPORTED */
    if (d == NULL || count == NULL || dev_index(d) >= ndevs)
        return 2;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    unsigned long long now =
        (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
    fake_proc all[FAKE_PROCS_MAX];
    unsigned n = read_script(all), k = 0;
    for (unsigned i = 0; i < n; i++)
        if (all[i].gpu == dev_index(d) && all[i].sm > 0)
            k++;
    if (k == 0 || now <= last_seen)
        return 6; /* NOT_FOUND: no sample newer than last_seen */
    if (s == NULL || *count < k) {
        *count = k;
        return 7;
    }
    *count = 0;
    for (unsigned i = 0; i < n; i++)
        if (all[i].gpu == dev_index(d) && all[i].sm > 0)
            s[(*count)++] = (fake_util_sample){all[i].pid, now, all[i].sm, 0, 0, 0};
    return 0;
}
