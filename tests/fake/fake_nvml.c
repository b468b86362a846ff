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
 *                    "<gpu index>:<gi>:<ci>" in the first field puts the
 *                    process in that MIG device (GPU instance ID, compute
 *                    instance ID): the GPU's lists show it with those IDs,
 *                    the MIG device's handle lists only its own, and its
 *                    compute instance cannot be destroyed (IN_USE).
 *   FAKE_NVML_NO_UTIL set: nvmlDeviceGetProcessUtilization answers NOT_SUPPORTED
 *                    (it always does on a MIG device handle)
 * MIG, as NVML documents it (nvmlDeviceGetMigMode, GPU and compute instance
 * profiles, placements, creation, listing, destruction, MIG device handles):
 *   FAKE_NVML_MIG    GPU indices in MIG mode ("0,2"). A GPU is MIG-capable when
 *                    its name and memory are those of an A100-40GB/80GB,
 *                    H100-80GB or H200-141GB (the fake's own profile tables,
 *                    kept apart from kgpu's so that tests cross-check them);
 *                    others answer NOT_SUPPORTED. The mode cannot be changed:
 *                    there is no nvmlDeviceSetMigMode, as kgpu never sets it.
 *                    Profile info answers NOT_SUPPORTED with MIG off;
 *                    placements answer either way.
 *   FAKE_NVML_MIG_STATE a file holding the GPU and compute instances, shared by
 *                    every process under flock and read at every MIG call, so a
 *                    restarted driver finds the instances it made; deleting it
 *                    is a node reboot. Lines "gi <GPU UUID> <GI ID> <profile>
 *                    <start>" and "ci <GPU UUID> <GI ID> <CI ID> <CI profile>
 *                    <start>"; lines of GPUs a process does not have are kept.
 *                    Unset: the instances live in the process only.
 *   FAKE_NVML_MIG_CI_FAIL a return code for nvmlGpuInstanceCreateComputeInstance
 * GI creation refuses, with INSUFFICIENT_RESOURCES, a memory slice already
 * taken, more than 7 compute slices, more instances of a profile than its
 * instanceCount; a placement not among the possible ones is
 * INVALID_ARGUMENT. GI IDs follow the placement (7g 0, halves 1-2, two-slice
 * 3-6, one-slice 7-13) and CI IDs count from 0, as the driver's do. A GI that
 * still has compute instances cannot be destroyed (IN_USE); a destroyed
 * instance's handle is INVALID_ARGUMENT. MIG device UUIDs ("MIG-" and a
 * UUID-shaped hash of the GPU's UUID and the two IDs) are stable across
 * processes.
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
 * Variants built with -DFAKE_NO_EVENTS (no event functions),
 * -DFAKE_NO_MIG (a driver without MIG functions) and -DFAKE_NO_MEMINFO (a
 * required function missing) test the loader;
 * -DFAKE_PROCS_V1 exports only the unversioned process list, which fills
 * the older 16-byte records, as drivers before the _v2 functions did.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/time.h>
#include <unistd.h>

#include "fake_gpumem.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct fake_dev {
    char uuid[96], name[96], bus[32];
    unsigned long long mib;
    int cc_major, cc_minor;
    int mig;              /* a MIG device handle: compute instance `ci` of GI `gi` on GPU `gpu` */
    unsigned gpu, gi, ci;
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

/* MIG: GPU instance IDs 0..13 (from the placement, as the driver numbers them), CIs 0..7. */
#define FAKE_GI_IDS 14
#define FAKE_CI_IDS 8
/* MIG device handles, one per (GPU, GI, CI): stable for as long as the instance lives. */
static fake_dev migdevs[16][FAKE_GI_IDS][FAKE_CI_IDS];

/* The MIG device a handle is, or NULL. */
static const fake_dev *mig_dev_of(const fake_dev *d)
{
    uintptr_t p = (uintptr_t)d, b = (uintptr_t)migdevs;
    if (p < b || p >= (uintptr_t)migdevs + sizeof(migdevs) || (p - b) % sizeof(*d) != 0)
        return NULL;
    return d->mig ? d : NULL;
}
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
    case 3:
        return "Not Supported";
    case 6:
        return "Not Found";
    case 7:
        return "Insufficient Size";
    case 9:
        return "Driver Not Loaded";
    case 10:
        return "Timeout";
    case 15:
        return "GPU is lost";
    case 19:
        return "In use by another client";
    case 23:
        return "Insufficient resources";
    case 25:
        return "Argument version mismatch";
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

/* A GPU's index; ~0u for anything else (a MIG device handle, a stray pointer). */
static unsigned dev_index(const fake_dev *d)
{
    uintptr_t p = (uintptr_t)d, b = (uintptr_t)devs;
    if (p < b || p >= (uintptr_t)(devs + ndevs) || (p - b) % sizeof(*d) != 0)
        return ~0u;
    return (unsigned)((p - b) / sizeof(*d));
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
    unsigned i = dev_index(d);
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
    unsigned gi, ci; /* the MIG device it runs in; ~0u outside MIG */
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
        char where[48], used[32], kind[16] = "";
        fake_proc *p = &out[n];
        if (line[0] == '#' || sscanf(line, "%47s %u %31s %u %15s", where, &p->pid, used, &p->sm,
                                     kind) < 4)
            continue;
        /* "<gpu>" or "<gpu>:<gi>:<ci>": a process inside that MIG device */
        int k = sscanf(where, "%u:%u:%u", &p->gpu, &p->gi, &p->ci);
        if (k != 1 && k != 3)
            continue;
        if (k == 1)
            p->gi = p->ci = ~0u;
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
                out[n++] = (fake_proc){.gpu = g, .pid = (unsigned)pid, .used = used, .gi = ~0u,
                                       .ci = ~0u};
        }
    }
    return n;
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
    const fake_dev *m = mig_dev_of(d);
    unsigned g = m != NULL ? m->gpu : dev_index(d);
    if (d == NULL || count == NULL || g >= ndevs)
        return 2;
    fake_proc all[FAKE_PROCS_MAX];
    unsigned n = read_script(all), k = 0;
    /* A GPU lists every process, those in its MIG devices too; a MIG device its own. */
#define PROC_HERE(p) ((p).gpu == g && (p).mps == mps && (m == NULL || ((p).gi == m->gi && \
                                                                      (p).ci == m->ci)))
    for (unsigned i = 0; i < n; i++)
        if (PROC_HERE(all[i]))
            k++;
    if (k > *count || (k > 0 && infos == NULL)) {
        *count = k;
        return 7; /* INSUFFICIENT_SIZE */
    }
    *count = 0;
    for (unsigned i = 0; i < n; i++) {
        if (!PROC_HERE(all[i]))
            continue;
        if (v1)
            ((fake_proc_info_v1 *)infos)[*count] = (fake_proc_info_v1){all[i].pid, all[i].used};
        else
            ((fake_proc_info *)infos)[*count] =
                (fake_proc_info){all[i].pid, all[i].used, all[i].gi, all[i].ci};
        (*count)++;
    }
#undef PROC_HERE
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
    if (getenv("FAKE_NVML_NO_UTIL") != NULL || mig_dev_of(d) != NULL)
        return 3; /* NOT_SUPPORTED (and not per MIG device) */
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

/* ---- MIG (FAKE_NVML_MIG, FAKE_NVML_MIG_STATE) ---- */
#ifndef FAKE_NO_MIG

/*
 * The fake's own GI profile tables: written out row by row, apart from
 * kgpu's (src/core/mig.c), so that a test comparing the two cross-checks
 * kgpu's table. Each row: NVML_GPU_INSTANCE_PROFILE_*, the profile ID,
 * name, compute slices, memory slices, instances at most, SMs, memorySizeMB
 * and the allowed starts.
 */
typedef struct {
    unsigned nvml, id;
    const char *name;
    unsigned compute, size, count, sms;
    unsigned long long mib;
    unsigned nstarts, starts[7];
} fake_gip_row;

typedef struct {
    const char *word; /* in the device name */
    unsigned long long lo_mib, hi_mib;
    fake_gip_row rows[7];
} fake_mig_table;

#define FAKE_ALL7 7, {0, 1, 2, 3, 4, 5, 6}

static const fake_mig_table MIG_TABLES[] = {
    {"A100", 30000, 60000,
     {{0, 19, "1g.5gb", 1, 1, 7, 14, 4864, FAKE_ALL7},
      {7, 20, "1g.5gb+me", 1, 1, 1, 14, 4864, FAKE_ALL7},
      {9, 15, "1g.10gb", 1, 2, 4, 14, 9856, 4, {0, 2, 4, 6}},
      {1, 14, "2g.10gb", 2, 2, 3, 28, 9856, 3, {0, 2, 4}},
      {2, 9, "3g.20gb", 3, 4, 2, 42, 19968, 2, {0, 4}},
      {3, 5, "4g.20gb", 4, 4, 1, 56, 19968, 1, {0}},
      {4, 0, "7g.40gb", 7, 8, 1, 98, 40192, 1, {0}}}},
    {"A100", 60000, 100000,
     {{0, 19, "1g.10gb", 1, 1, 7, 14, 9728, FAKE_ALL7},
      {7, 20, "1g.10gb+me", 1, 1, 1, 14, 9728, FAKE_ALL7},
      {9, 15, "1g.20gb", 1, 2, 4, 14, 19968, 4, {0, 2, 4, 6}},
      {1, 14, "2g.20gb", 2, 2, 3, 28, 19968, 3, {0, 2, 4}},
      {2, 9, "3g.40gb", 3, 4, 2, 42, 40192, 2, {0, 4}},
      {3, 5, "4g.40gb", 4, 4, 1, 56, 40192, 1, {0}},
      {4, 0, "7g.80gb", 7, 8, 1, 98, 80896, 1, {0}}}},
    {"H100", 70000, 90000,
     {{0, 19, "1g.10gb", 1, 1, 7, 16, 9984, FAKE_ALL7},
      {7, 20, "1g.10gb+me", 1, 1, 1, 16, 9984, FAKE_ALL7},
      {9, 15, "1g.20gb", 1, 2, 4, 26, 20096, 4, {0, 2, 4, 6}},
      {1, 14, "2g.20gb", 2, 2, 3, 32, 20096, 3, {0, 2, 4}},
      {2, 9, "3g.40gb", 3, 4, 2, 60, 40448, 2, {0, 4}},
      {3, 5, "4g.40gb", 4, 4, 1, 64, 40448, 1, {0}},
      {4, 0, "7g.80gb", 7, 8, 1, 132, 81152, 1, {0}}}},
    {"H200", 130000, 160000,
     {{0, 19, "1g.18gb", 1, 1, 7, 16, 18432, FAKE_ALL7},
      {7, 20, "1g.18gb+me", 1, 1, 1, 16, 18432, FAKE_ALL7},
      {9, 15, "1g.35gb", 1, 2, 4, 26, 35840, 4, {0, 2, 4, 6}},
      {1, 14, "2g.35gb", 2, 2, 3, 32, 35840, 3, {0, 2, 4}},
      {2, 9, "3g.71gb", 3, 4, 2, 60, 72704, 2, {0, 4}},
      {3, 5, "4g.71gb", 4, 4, 1, 64, 72704, 1, {0}},
      {4, 0, "7g.141gb", 7, 8, 1, 132, 144384, 1, {0}}}},
};

#define FAKE_GI_PROFILE_COUNT 17 /* NVML_GPU_INSTANCE_PROFILE_COUNT in recent drivers */

/* nvmlGpuInstanceProfileInfo_t, and the _v2 record nvmlDeviceGetGpuInstanceProfileInfoV fills. */
typedef struct {
    unsigned int id, p2p, slices, instances, sms, ce, dec, enc, jpeg, ofa;
    unsigned long long mib;
} fake_gip;

typedef struct {
    unsigned int version, id, p2p, slices, instances, sms, ce, dec, enc, jpeg, ofa;
    unsigned long long mib;
    char name[96];
} fake_gip_v2;

typedef struct {
    unsigned int start, size;
} fake_placement; /* nvmlGpuInstancePlacement_t, nvmlComputeInstancePlacement_t */

typedef struct {
    unsigned gpu, id;
} fake_gi_handle; /* what an nvmlGpuInstance_t points to */

typedef struct {
    unsigned gpu, gi, id;
} fake_ci_handle; /* what an nvmlComputeInstance_t points to */

typedef struct {
    fake_dev *device;
    unsigned int id, profile_id;
    fake_placement placement;
} fake_gi_info; /* nvmlGpuInstanceInfo_t */

typedef struct {
    unsigned int id, slices, instances, sms, ce, dec, enc, jpeg, ofa;
} fake_cip; /* nvmlComputeInstanceProfileInfo_t */

typedef struct {
    fake_dev *device;
    fake_gi_handle *gpu_instance;
    unsigned int id, profile_id;
    fake_placement placement;
} fake_ci_info; /* nvmlComputeInstanceInfo_t */

/* One GPU instance as the state holds it. */
typedef struct {
    int used;
    const fake_gip_row *row;
    unsigned start;
    unsigned ci_mask; /* bit c: compute instance c exists */
    unsigned ci_profile[FAKE_CI_IDS], ci_start[FAKE_CI_IDS];
} fake_gi;

static fake_gi gis[16][FAKE_GI_IDS];
static fake_gi_handle gi_handles[16][FAKE_GI_IDS];
static fake_ci_handle ci_handles[16][FAKE_GI_IDS][FAKE_CI_IDS];
static char foreign[16384]; /* state lines of GPUs this process does not have, kept as read */
static size_t nforeign;
static pthread_mutex_t mig_mu = PTHREAD_MUTEX_INITIALIZER;
static int mig_fd = -1;

static const fake_mig_table *mig_table(unsigned g)
{
    for (size_t i = 0; g < ndevs && i < sizeof(MIG_TABLES) / sizeof(MIG_TABLES[0]); i++)
        if (strstr(devs[g].name, MIG_TABLES[i].word) != NULL &&
            devs[g].mib >= MIG_TABLES[i].lo_mib && devs[g].mib <= MIG_TABLES[i].hi_mib)
            return &MIG_TABLES[i];
    return NULL;
}

/* Whether FAKE_NVML_MIG ("0,2": GPU indices) turns MIG on for GPU g. */
static int mig_on(unsigned g)
{
    const char *s = getenv("FAKE_NVML_MIG");
    while (s != NULL && *s) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s)
            return 0;
        if (v == g)
            return mig_table(g) != NULL;
        s = *end == ',' ? end + 1 : "";
    }
    return 0;
}

static const fake_gip_row *row_by_nvml(const fake_mig_table *t, unsigned nvml)
{
    for (int i = 0; t != NULL && i < 7; i++)
        if (t->rows[i].nvml == nvml)
            return &t->rows[i];
    return NULL;
}

static const fake_gip_row *row_by_id(const fake_mig_table *t, unsigned id)
{
    for (int i = 0; t != NULL && i < 7; i++)
        if (t->rows[i].id == id)
            return &t->rows[i];
    return NULL;
}

/* GI IDs follow the placement, as the driver's do: 7g 0, halves 1-2, quarters 3-6, 1g 7-13. */
static unsigned gi_id_for(unsigned start, unsigned size)
{
    switch (size) {
    case 8:
        return 0;
    case 4:
        return 1 + start / 4;
    case 2:
        return 3 + start / 2;
    default:
        return 7 + start;
    }
}

/* NVML_COMPUTE_INSTANCE_PROFILE_* to compute slices; 0 for none. */
static unsigned ci_slices(unsigned profile)
{
    static const unsigned s[] = {1, 2, 3, 4, 7, 8, 6};
    return profile < 7 ? s[profile] : 0;
}

static unsigned gpu_by_uuid(const char *uuid)
{
    for (unsigned g = 0; g < ndevs; g++)
        if (strcmp(devs[g].uuid, uuid) == 0)
            return g;
    return ~0u;
}

/* One state line: "gi <uuid> <gi> <profile> <start>" or "ci <uuid> <gi> <ci> <profile> <start>". */
static void parse_state_line(const char *line)
{
    char uuid[96];
    unsigned gi, ci, prof, start;
    int n = 0;
    if (sscanf(line, "gi %95s %u %u %u", uuid, &gi, &prof, &start) == 4)
        n = 4;
    else if (sscanf(line, "ci %95s %u %u %u %u", uuid, &gi, &ci, &prof, &start) == 5)
        n = 5;
    else
        return;
    unsigned g = gpu_by_uuid(uuid);
    if (g == ~0u) {
        size_t len = strlen(line);
        if (nforeign + len + 2 < sizeof(foreign)) {
            memcpy(foreign + nforeign, line, len);
            nforeign += len;
            foreign[nforeign++] = '\n';
        }
        return;
    }
    if (gi >= FAKE_GI_IDS)
        return;
    fake_gi *x = &gis[g][gi];
    if (n == 4) {
        const fake_gip_row *r = row_by_nvml(mig_table(g), prof);
        if (r != NULL && !x->used)
            *x = (fake_gi){.used = 1, .row = r, .start = start};
    } else if (x->used && ci < FAKE_CI_IDS) {
        x->ci_mask |= 1u << ci;
        x->ci_profile[ci] = prof;
        x->ci_start[ci] = start;
    }
}

/*
 * Every MIG call runs between mig_begin and mig_end: under the process's
 * mutex and, with FAKE_NVML_MIG_STATE, under an exclusive flock of the
 * state file, read at the start and written back when changed, so that
 * processes share the instances as they share a GPU and a restarted
 * process finds those it made.
 */
static int mig_begin(void)
{
    pthread_mutex_lock(&mig_mu);
    const char *path = getenv("FAKE_NVML_MIG_STATE");
    if (path == NULL || *path == '\0')
        return 0; /* the instances live in this process only */
    mig_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (mig_fd < 0 || flock(mig_fd, LOCK_EX) != 0) {
        if (mig_fd >= 0)
            close(mig_fd);
        mig_fd = -1;
        pthread_mutex_unlock(&mig_mu);
        return 999; /* UNKNOWN */
    }
    memset(gis, 0, sizeof(gis));
    nforeign = 0;
    static char buf[65536];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(buf) - 1 && (r = read(mig_fd, buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = '\0';
    /* GI lines first, so that a CI line finds its GI whatever the order. */
    for (int pass = 0; pass < 2; pass++)
        for (char *line = buf, *next; line != NULL && *line; line = next) {
            next = strchr(line, '\n');
            if (next != NULL)
                *next = '\0';
            if ((pass == 0) == (strncmp(line, "gi ", 3) == 0))
                parse_state_line(line);
            if (next != NULL)
                *next++ = '\n';
        }
    return 0;
}

static void put(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put(char *buf, size_t cap, size_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = *n < cap ? vsnprintf(buf + *n, cap - *n, fmt, ap) : 0;
    va_end(ap);
    if (k > 0)
        *n = *n + (size_t)k < cap ? *n + (size_t)k : cap;
}

static void mig_end(int dirty)
{
    if (mig_fd >= 0) {
        if (dirty) {
            static char buf[65536];
            size_t n = 0;
            put(buf, sizeof(buf), &n, "%.*s", (int)nforeign, foreign);
            for (unsigned g = 0; g < ndevs; g++)
                for (unsigned i = 0; i < FAKE_GI_IDS; i++) {
                    const fake_gi *x = &gis[g][i];
                    if (!x->used)
                        continue;
                    put(buf, sizeof(buf), &n, "gi %s %u %u %u\n", devs[g].uuid, i, x->row->nvml,
                        x->start);
                    for (unsigned c = 0; c < FAKE_CI_IDS; c++)
                        if (x->ci_mask & (1u << c))
                            put(buf, sizeof(buf), &n, "ci %s %u %u %u %u\n", devs[g].uuid, i, c,
                                x->ci_profile[c], x->ci_start[c]);
                }
            if (ftruncate(mig_fd, 0) == 0 && lseek(mig_fd, 0, SEEK_SET) == 0)
                for (size_t off = 0; off < n;) {
                    ssize_t w = write(mig_fd, buf + off, n - off);
                    if (w <= 0)
                        break;
                    off += (size_t)w;
                }
        }
        close(mig_fd); /* drops the flock */
        mig_fd = -1;
    }
    pthread_mutex_unlock(&mig_mu);
}

/* A device-level MIG call's checks: 1 UNINITIALIZED, 2 not a GPU, 3 not MIG-capable. */
static int mig_device(const fake_dev *d, unsigned *g, const fake_mig_table **t)
{
    if (!initialised)
        return 1;
    *g = dev_index(d);
    if (*g >= ndevs)
        return 2;
    *t = mig_table(*g);
    return *t == NULL ? 3 : 0;
}

/* The GI a handle names, once the state is read; NULL when it is none or gone. */
static fake_gi *gi_of(const fake_gi_handle *h, unsigned *g, unsigned *id)
{
    uintptr_t p = (uintptr_t)h, b = (uintptr_t)gi_handles;
    if (p < b || p >= b + sizeof(gi_handles) || (p - b) % sizeof(*h) != 0)
        return NULL;
    size_t k = (p - b) / sizeof(*h);
    *g = (unsigned)(k / FAKE_GI_IDS);
    *id = (unsigned)(k % FAKE_GI_IDS);
    return *g < ndevs && gis[*g][*id].used ? &gis[*g][*id] : NULL;
}

static fake_gi_handle *gi_handle(unsigned g, unsigned id)
{
    gi_handles[g][id] = (fake_gi_handle){g, id};
    return &gi_handles[g][id];
}

/* The CI a handle names; NULL when none or gone. */
static fake_gi *ci_of(const fake_ci_handle *h, unsigned *g, unsigned *gi, unsigned *ci)
{
    uintptr_t p = (uintptr_t)h, b = (uintptr_t)ci_handles;
    if (p < b || p >= b + sizeof(ci_handles) || (p - b) % sizeof(*h) != 0)
        return NULL;
    size_t k = (p - b) / sizeof(*h);
    *ci = (unsigned)(k % FAKE_CI_IDS);
    *gi = (unsigned)(k / FAKE_CI_IDS % FAKE_GI_IDS);
    *g = (unsigned)(k / FAKE_CI_IDS / FAKE_GI_IDS);
    fake_gi *x = *g < ndevs ? &gis[*g][*gi] : NULL;
    return x != NULL && x->used && (x->ci_mask & (1u << *ci)) ? x : NULL;
}

static fake_ci_handle *ci_handle(unsigned g, unsigned gi, unsigned ci)
{
    ci_handles[g][gi][ci] = (fake_ci_handle){g, gi, ci};
    return &ci_handles[g][gi][ci];
}

EXPORT int nvmlDeviceGetMigMode(fake_dev *d, unsigned int *current, unsigned int *pending);
int nvmlDeviceGetMigMode(fake_dev *d, unsigned int *current, unsigned int *pending)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (current == NULL || pending == NULL)
        return 2;
    /* kgpu never changes the mode (there is no nvmlDeviceSetMigMode here): pending = current. */
    *current = *pending = (unsigned)mig_on(g);
    return 0;
}

static void fill_gip(const fake_gip_row *r, fake_gip *info)
{
    *info = (fake_gip){.id = r->id, .slices = r->compute, .instances = r->count, .sms = r->sms,
                       .ce = r->compute, .dec = r->compute / 2, .mib = r->mib};
}

/* Profile info answers on a MIG-capable GPU in MIG mode only (NOT_SUPPORTED otherwise). */
static int gip_row(fake_dev *d, unsigned profile, const fake_gip_row **r)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (profile >= FAKE_GI_PROFILE_COUNT)
        return 2;
    if (!mig_on(g) || (*r = row_by_nvml(t, profile)) == NULL)
        return 3;
    return 0;
}

EXPORT int nvmlDeviceGetGpuInstanceProfileInfo(fake_dev *d, unsigned int profile, fake_gip *info);
int nvmlDeviceGetGpuInstanceProfileInfo(fake_dev *d, unsigned int profile, fake_gip *info)
{
    const fake_gip_row *r;
    int rc = gip_row(d, profile, &r);
    if (rc == 0 && info == NULL)
        rc = 2;
    if (rc == 0)
        fill_gip(r, info);
    return rc;
}

EXPORT int nvmlDeviceGetGpuInstanceProfileInfoV(fake_dev *d, unsigned int profile,
                                                fake_gip_v2 *info);
int nvmlDeviceGetGpuInstanceProfileInfoV(fake_dev *d, unsigned int profile, fake_gip_v2 *info)
{
    const fake_gip_row *r;
    int rc = gip_row(d, profile, &r);
    if (rc != 0)
        return rc;
    if (info == NULL)
        return 2;
    if (info->version != (unsigned)(sizeof(*info) | 2u << 24))
        return 25; /* ARGUMENT_VERSION_MISMATCH */
    fake_gip v1;
    fill_gip(r, &v1);
    memcpy(&info->id, &v1, sizeof(v1));
    snprintf(info->name, sizeof(info->name), "MIG %s", r->name);
    return 0;
}

/* Documented to answer whether MIG is on or not. */
EXPORT int nvmlDeviceGetGpuInstancePossiblePlacements_v2(fake_dev *d, unsigned int profile_id,
                                                         fake_placement *out, unsigned int *count);
int nvmlDeviceGetGpuInstancePossiblePlacements_v2(fake_dev *d, unsigned int profile_id,
                                                  fake_placement *out, unsigned int *count)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    const fake_gip_row *r = row_by_id(t, profile_id);
    if (r == NULL || count == NULL)
        return 2;
    if (out == NULL) {
        *count = r->nstarts;
        return 0;
    }
    if (*count < r->nstarts) {
        *count = r->nstarts;
        return 7;
    }
    for (unsigned i = 0; i < r->nstarts; i++)
        out[i] = (fake_placement){r->starts[i], r->size};
    *count = r->nstarts;
    return 0;
}

static unsigned mem_mask(unsigned start, unsigned size)
{
    return ((1u << size) - 1u) << start;
}

EXPORT int nvmlDeviceCreateGpuInstanceWithPlacement(fake_dev *d, unsigned int profile_id,
                                                    const fake_placement *pl,
                                                    fake_gi_handle **out);
int nvmlDeviceCreateGpuInstanceWithPlacement(fake_dev *d, unsigned int profile_id,
                                             const fake_placement *pl, fake_gi_handle **out)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (!mig_on(g))
        return 3;
    const fake_gip_row *r = row_by_id(t, profile_id);
    if (r == NULL || pl == NULL || out == NULL || pl->size != r->size)
        return 2;
    int allowed = 0;
    for (unsigned i = 0; i < r->nstarts; i++)
        allowed |= r->starts[i] == pl->start;
    if (!allowed)
        return 2;
    if ((rc = mig_begin()) != 0)
        return rc;
    /* What NVML refuses as INSUFFICIENT_RESOURCES: a taken memory slice, too few compute
     * slices left, the profile's instances all made, a second media-extension profile. */
    unsigned mem = 0, compute = 0, same = 0;
    for (unsigned i = 0; i < FAKE_GI_IDS; i++) {
        const fake_gi *x = &gis[g][i];
        if (!x->used)
            continue;
        mem |= mem_mask(x->start, x->row->size);
        compute += x->row->compute;
        same += x->row->nvml == r->nvml;
    }
    if ((mem & mem_mask(pl->start, r->size)) != 0 || compute + r->compute > 7 ||
        same >= r->count) {
        mig_end(0);
        return 23;
    }
    unsigned id = gi_id_for(pl->start, r->size);
    gis[g][id] = (fake_gi){.used = 1, .row = r, .start = pl->start};
    *out = gi_handle(g, id);
    mig_end(1);
    return 0;
}

/* The GIs of one profile ID; the caller's array holds the profile's instanceCount. */
EXPORT int nvmlDeviceGetGpuInstances(fake_dev *d, unsigned int profile_id, fake_gi_handle **out,
                                     unsigned int *count);
int nvmlDeviceGetGpuInstances(fake_dev *d, unsigned int profile_id, fake_gi_handle **out,
                              unsigned int *count)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (!mig_on(g))
        return 3;
    const fake_gip_row *r = row_by_id(t, profile_id);
    if (r == NULL || out == NULL || count == NULL)
        return 2;
    if ((rc = mig_begin()) != 0)
        return rc;
    unsigned n = 0;
    for (unsigned i = 0; i < FAKE_GI_IDS; i++)
        if (gis[g][i].used && gis[g][i].row == r)
            out[n++] = gi_handle(g, i);
    *count = n;
    mig_end(0);
    return 0;
}

EXPORT int nvmlDeviceGetGpuInstanceById(fake_dev *d, unsigned int id, fake_gi_handle **out);
int nvmlDeviceGetGpuInstanceById(fake_dev *d, unsigned int id, fake_gi_handle **out)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (!mig_on(g))
        return 3;
    if (out == NULL)
        return 2;
    if ((rc = mig_begin()) != 0)
        return rc;
    rc = id < FAKE_GI_IDS && gis[g][id].used ? 0 : 6; /* NOT_FOUND */
    if (rc == 0)
        *out = gi_handle(g, id);
    mig_end(0);
    return rc;
}

EXPORT int nvmlGpuInstanceGetInfo(fake_gi_handle *h, fake_gi_info *info);
int nvmlGpuInstanceGetInfo(fake_gi_handle *h, fake_gi_info *info)
{
    if (!initialised)
        return 1;
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, id;
    const fake_gi *x = gi_of(h, &g, &id);
    if (x == NULL || info == NULL) {
        mig_end(0);
        return 2;
    }
    *info = (fake_gi_info){&devs[g], id, x->row->id, {x->start, x->row->size}};
    mig_end(0);
    return 0;
}

/* Compute instance profiles of a GI: every slice count up to the GI's, engines shared. */
EXPORT int nvmlGpuInstanceGetComputeInstanceProfileInfo(fake_gi_handle *h, unsigned int profile,
                                                        unsigned int eng, fake_cip *info);
int nvmlGpuInstanceGetComputeInstanceProfileInfo(fake_gi_handle *h, unsigned int profile,
                                                 unsigned int eng, fake_cip *info)
{
    if (!initialised)
        return 1;
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, id;
    const fake_gi *x = gi_of(h, &g, &id);
    unsigned s = ci_slices(profile);
    if (x == NULL || info == NULL || eng != 0 || profile >= 8)
        rc = 2;
    else if (s == 0 || s > x->row->compute || s == 6 || s == 8)
        rc = 3;
    else
        *info = (fake_cip){.id = profile, .slices = s, .instances = x->row->compute / s,
                           .sms = x->row->sms * s / x->row->compute, .ce = x->row->compute};
    mig_end(0);
    return rc;
}

EXPORT int nvmlGpuInstanceCreateComputeInstance(fake_gi_handle *h, unsigned int profile_id,
                                                fake_ci_handle **out);
int nvmlGpuInstanceCreateComputeInstance(fake_gi_handle *h, unsigned int profile_id,
                                         fake_ci_handle **out)
{
    if (!initialised)
        return 1;
    const char *fail = getenv("FAKE_NVML_MIG_CI_FAIL");
    if (fail != NULL && atoi(fail) != 0)
        return atoi(fail);
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, id;
    fake_gi *x = gi_of(h, &g, &id);
    unsigned s = ci_slices(profile_id);
    if (x == NULL || out == NULL || profile_id >= 8) {
        mig_end(0);
        return 2;
    }
    if (s == 0 || s > x->row->compute || s == 6 || s == 8) {
        mig_end(0);
        return 3;
    }
    unsigned busy = 0, ci = 0;
    for (unsigned c = 0; c < FAKE_CI_IDS; c++)
        if (x->ci_mask & (1u << c))
            busy |= mem_mask(x->ci_start[c], ci_slices(x->ci_profile[c]));
    while (ci < FAKE_CI_IDS && (x->ci_mask & (1u << ci)))
        ci++;
    unsigned start = 0;
    while (start + s <= x->row->compute && (busy & mem_mask(start, s)) != 0)
        start += s;
    if (ci == FAKE_CI_IDS || start + s > x->row->compute) {
        mig_end(0);
        return 23; /* INSUFFICIENT_RESOURCES */
    }
    x->ci_mask |= 1u << ci;
    x->ci_profile[ci] = profile_id;
    x->ci_start[ci] = start;
    *out = ci_handle(g, id, ci);
    mig_end(1);
    return 0;
}

EXPORT int nvmlGpuInstanceGetComputeInstances(fake_gi_handle *h, unsigned int profile_id,
                                              fake_ci_handle **out, unsigned int *count);
int nvmlGpuInstanceGetComputeInstances(fake_gi_handle *h, unsigned int profile_id,
                                       fake_ci_handle **out, unsigned int *count)
{
    if (!initialised)
        return 1;
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, id;
    const fake_gi *x = gi_of(h, &g, &id);
    if (x == NULL || out == NULL || count == NULL || profile_id >= 8) {
        mig_end(0);
        return 2;
    }
    unsigned n = 0;
    for (unsigned c = 0; c < FAKE_CI_IDS; c++)
        if ((x->ci_mask & (1u << c)) && x->ci_profile[c] == profile_id)
            out[n++] = ci_handle(g, id, c);
    *count = n;
    mig_end(0);
    return 0;
}

EXPORT int nvmlComputeInstanceGetInfo_v2(fake_ci_handle *h, fake_ci_info *info);
int nvmlComputeInstanceGetInfo_v2(fake_ci_handle *h, fake_ci_info *info)
{
    if (!initialised)
        return 1;
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, gi, ci;
    const fake_gi *x = ci_of(h, &g, &gi, &ci);
    if (x == NULL || info == NULL) {
        mig_end(0);
        return 2;
    }
    *info = (fake_ci_info){&devs[g], gi_handle(g, gi), ci, x->ci_profile[ci],
                           {x->ci_start[ci], ci_slices(x->ci_profile[ci])}};
    mig_end(0);
    return 0;
}

/* IN_USE while a process (FAKE_NVML_PROCS "<gpu>:<gi>:<ci>") runs in it. */
EXPORT int nvmlComputeInstanceDestroy(fake_ci_handle *h);
int nvmlComputeInstanceDestroy(fake_ci_handle *h)
{
    if (!initialised)
        return 1;
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, gi, ci;
    fake_gi *x = ci_of(h, &g, &gi, &ci);
    if (x == NULL) {
        mig_end(0);
        return 2;
    }
    static fake_proc all[FAKE_PROCS_MAX];
    unsigned n = read_script(all);
    for (unsigned i = 0; i < n; i++)
        if (all[i].gpu == g && all[i].gi == gi && all[i].ci == ci) {
            mig_end(0);
            return 19; /* IN_USE */
        }
    x->ci_mask &= ~(1u << ci);
    mig_end(1);
    return 0;
}

/* IN_USE while the GI still has compute instances, as NVML answers. */
EXPORT int nvmlGpuInstanceDestroy(fake_gi_handle *h);
int nvmlGpuInstanceDestroy(fake_gi_handle *h)
{
    if (!initialised)
        return 1;
    int rc = mig_begin();
    if (rc != 0)
        return rc;
    unsigned g, id;
    fake_gi *x = gi_of(h, &g, &id);
    if (x == NULL) {
        mig_end(0);
        return 2;
    }
    if (x->ci_mask != 0) {
        mig_end(0);
        return 19;
    }
    memset(x, 0, sizeof(*x));
    mig_end(1);
    return 0;
}

EXPORT int nvmlDeviceGetMaxMigDeviceCount(fake_dev *d, unsigned int *count);
int nvmlDeviceGetMaxMigDeviceCount(fake_dev *d, unsigned int *count)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (count == NULL)
        return 2;
    *count = 7;
    return 0;
}

/* 64-bit FNV-1a: MIG UUIDs that are the same in every process for the same instance. */
static unsigned long long fnv(const char *s, unsigned long long h)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* The MIG devices of a GPU in (GI, CI) order: one per compute instance. */
EXPORT int nvmlDeviceGetMigDeviceHandleByIndex(fake_dev *d, unsigned int index, fake_dev **out);
int nvmlDeviceGetMigDeviceHandleByIndex(fake_dev *d, unsigned int index, fake_dev **out)
{
    unsigned g;
    const fake_mig_table *t;
    int rc = mig_device(d, &g, &t);
    if (rc != 0)
        return rc;
    if (out == NULL || index >= 7)
        return 2;
    if (!mig_on(g))
        return 6;
    if ((rc = mig_begin()) != 0)
        return rc;
    unsigned k = 0;
    rc = 6; /* NOT_FOUND */
    for (unsigned i = 0; i < FAKE_GI_IDS && rc != 0; i++)
        for (unsigned c = 0; gis[g][i].used && c < FAKE_CI_IDS && rc != 0; c++) {
            if (!(gis[g][i].ci_mask & (1u << c)) || k++ != index)
                continue;
            fake_dev *m = &migdevs[g][i][c];
            char key[160];
            snprintf(key, sizeof(key), "%s/%u/%u", devs[g].uuid, i, c);
            unsigned long long a = fnv(key, 0xcbf29ce484222325ULL), b = fnv(key, a);
            memset(m, 0, sizeof(*m));
            snprintf(m->uuid, sizeof(m->uuid), "MIG-%08llx-%04llx-%04llx-%04llx-%012llx",
                     a >> 32, (a >> 16) & 0xffff, a & 0xffff, b >> 48, b & 0xffffffffffffULL);
            snprintf(m->name, sizeof(m->name), "%.60s MIG %s", devs[g].name,
                     gis[g][i].row->name);
            snprintf(m->bus, sizeof(m->bus), "%s", devs[g].bus);
            m->mib = gis[g][i].row->mib;
            m->cc_major = devs[g].cc_major;
            m->cc_minor = devs[g].cc_minor;
            m->mig = 1;
            m->gpu = g;
            m->gi = i;
            m->ci = c;
            *out = m;
            rc = 0;
        }
    mig_end(0);
    return rc;
}

EXPORT int nvmlDeviceIsMigDeviceHandle(fake_dev *d, unsigned int *is_mig);
int nvmlDeviceIsMigDeviceHandle(fake_dev *d, unsigned int *is_mig)
{
    if (!initialised)
        return 1;
    if (is_mig == NULL || (mig_dev_of(d) == NULL && dev_index(d) >= ndevs))
        return 2;
    *is_mig = mig_dev_of(d) != NULL;
    return 0;
}

/* On a GPU's own handle these answer NOT_SUPPORTED: only a MIG device has instance IDs. */
EXPORT int nvmlDeviceGetGpuInstanceId(fake_dev *d, unsigned int *id);
int nvmlDeviceGetGpuInstanceId(fake_dev *d, unsigned int *id)
{
    if (!initialised)
        return 1;
    const fake_dev *m = mig_dev_of(d);
    if (id == NULL || (m == NULL && dev_index(d) >= ndevs))
        return 2;
    if (m == NULL)
        return 3;
    *id = m->gi;
    return 0;
}

EXPORT int nvmlDeviceGetComputeInstanceId(fake_dev *d, unsigned int *id);
int nvmlDeviceGetComputeInstanceId(fake_dev *d, unsigned int *id)
{
    if (!initialised)
        return 1;
    const fake_dev *m = mig_dev_of(d);
    if (id == NULL || (m == NULL && dev_index(d) >= ndevs))
        return 2;
    if (m == NULL)
        return 3;
    *id = m->ci;
    return 0;
}
#endif /* FAKE_NO_MIG */
