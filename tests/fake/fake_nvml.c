/*
 * A stand-in for libnvidia-ml.so.1 that behaves like the real one for the
 * calls kgpu makes: init must come first, handles are opaque, strings are
 * truncated to the caller's size with NVML's "insufficient size" code,
 * events are delivered through an event set. Its GPUs come from the
 * environment, so tests need no files:
 *   FAKE_NVML_GPUS   "uuid,name,MiB,busid;..."   (default: none)
 *   FAKE_NVML_INIT   a return code for nvmlInit_v2 (default 0)
 *   FAKE_NVML_XID    "index:xid" delivered by the first wait
 *   FAKE_NVML_LOST   index of a GPU that reports GPU_IS_LOST
 * nvmlDeviceGetMemoryInfo(_v2) report the whole card free (the interception
 * library's tests check that it reports the container's share instead).
 * Variants built with -DFAKE_NO_EVENTS (no event functions) and
 * -DFAKE_NO_MEMINFO (a required function missing) test the loader.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct fake_dev {
    char uuid[96], name[96], bus[32];
    unsigned long long mib;
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
static int initialised;
static int xid_sent;

EXPORT int nvmlInit_v2(void);
EXPORT int nvmlShutdown(void);
EXPORT const char *nvmlErrorString(int r);
EXPORT int nvmlDeviceGetCount_v2(unsigned int *n);
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, fake_dev **d);
EXPORT int nvmlDeviceGetUUID(fake_dev *d, char *buf, unsigned int len);
EXPORT int nvmlDeviceGetName(fake_dev *d, char *buf, unsigned int len);
EXPORT int nvmlDeviceGetPciInfo_v3(fake_dev *d, fake_pci *p);

int nvmlInit_v2(void)
{
    const char *rc = getenv("FAKE_NVML_INIT");
    if (rc != NULL && atoi(rc) != 0)
        return atoi(rc);
    ndevs = 0;
    const char *spec = getenv("FAKE_NVML_GPUS");
    while (spec != NULL && *spec && ndevs < 16) {
        fake_dev *d = &devs[ndevs];
        memset(d, 0, sizeof(*d));
        if (sscanf(spec, "%95[^,],%95[^,],%llu,%31[^;]", d->uuid, d->name, &d->mib, d->bus) != 4)
            return 999; /* NVML_ERROR_UNKNOWN */
        ndevs++;
        spec = strchr(spec, ';');
        spec = spec ? spec + 1 : NULL;
    }
    initialised = 1;
    xid_sent = 0;
    return 0;
}

int nvmlShutdown(void)
{
    if (!initialised)
        return 1; /* UNINITIALIZED */
    initialised = 0;
    return 0;
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
int nvmlDeviceGetMemoryInfo(fake_dev *d, unsigned long long m[3])
{
    if (!initialised)
        return 1;
    m[0] = d->mib * 1024 * 1024;
    m[1] = m[0];
    m[2] = 0;
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
    m->total = d->mib * 1024 * 1024;
    m->reserved = 0;
    m->free = m->total;
    m->used = 0;
    return 0;
}
#endif

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
