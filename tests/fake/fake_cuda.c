/*
 * A stand-in for libcuda.so.1 that behaves like the driver for what
 * libkgpu-limit.so and its tests touch: cuInit first, a fixed-size memory
 * pool per device that every allocation (device memory, pitched, managed,
 * stream-ordered, pool, physical handles, arrays, mipmaps, and optionally
 * contexts) draws from, allocations that die with their context, the
 * thread's current context and context stack, and cuGetProcAddress that
 * maps a base name and a CUDA version to its own functions. It is linked
 * with -Bsymbolic, as the driver is, so the addresses it hands out are its
 * own even when a preloaded library exports the same names.
 *
 * Environment:
 *   FAKE_CUDA_DEVICES   number of devices (default 1, at most 8)
 *   FAKE_CUDA_MEM_MIB   pool size per device in MiB (default 16384)
 *   FAKE_CUDA_UUIDS     comma-separated "GPU-<uuid>" per device (default
 *                       GPU-fa4e0000-0000-0000-0000-00000000000<i>)
 *   FAKE_CUDA_NO_UUID   1: cuDeviceGetUuid(_v2) fail (UUIDs unreadable)
 *   FAKE_CUDA_CTX_MIB   what a context takes from the pool (default 0)
 *   FAKE_GPU_MEM_FILE   a file through which every process's fake driver
 *                       and fake NVML see the same device memory
 *                       (fake_gpumem.h): cuMemGetInfo's free memory is then
 *                       what all processes, and a neighbour, leave
 *   FAKE_CUDA_CTX_NEIGHBOUR_MIB  with FAKE_GPU_MEM_FILE: a neighbour
 *                       allocates this much (frees, if negative) while a
 *                       context is made
 *   FAKE_CUDA_PROC_INTERNAL  1: cuGetProcAddress hands out internal
 *                       addresses for cuMemAlloc, cuMemFree and
 *                       cuGraphInstantiate (WithFlags), not the exports
 *
 * What the shim must count as the driver does is modelled after the driver
 * API's documentation: a stream-ordered pool keeps what it reserved up to
 * its release threshold, and gives the rest back only at a synchronisation
 * or a trim; cuMemFreeAsync is done when its stream gets there (a
 * cuStreamSynchronize or cuCtxSynchronize here); physical memory made by
 * cuMemCreate lives while a handle, a mapping or an exported descriptor of
 * it does; graph memory nodes allocate from the device's graph memory when
 * the graph is launched or uploaded; raising a context's limits, and
 * loading a module ("KGPUFAKEMOD <MiB>" as the image), take device memory.
 *
 * Module images are "KGPUFAKEMOD <MiB>", a CUDA ELF (cubin: its allocated
 * sections), PTX (compiled: its variables and code) or a fatbinary, whose
 * entries may be compressed; the device is of compute capability 8.0
 * (see "modules and libraries"). Functions, their
 * local memory and the launches from before CUDA 4.0: see "functions".
 * A launch into a capturing stream is recorded in the capture's graph and
 * does not run.
 * A context's synchronisation waits for that context's kernels only.
 *
 * Variants: -DFAKE_CUDA_OLD leaves out what drivers before CUDA 11 lack
 * (stream-ordered and virtual memory, cuGetProcAddress, _v2 UUIDs);
 * -DFAKE_CUDA_NO_MEMGETINFO leaves out a function the shim requires;
 * -DFAKE_CUDA_NO_LIBRARY_UNLOAD leaves out cuLibraryUnload.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpumem.h"

#ifdef KGPU_MODIMAGE_DECODE
#include <lz4.h>
#include <zstd.h>
#endif

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    CONTEXT_IS_DESTROYED = 709,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    NOT_SUPPORTED = 801,
};

#define MAX_DEVS  8
#define MAX_CTXS  1024
#define MAX_STACK 16
#define MIB       (1024ULL * 1024ULL)

typedef struct ctx {
    int dev;
    int alive;
    int primary_refs; /* primary contexts only */
    int is_primary;
    size_t limits[5];             /* CUlimit 0..4 */
    unsigned long long limit_mem; /* what limits above their defaults take */
    size_t local;                 /* local memory per thread a launch grew the stack to (0: none) */
    _Atomic unsigned long long last_end; /* when its last kernel ends on the timeline */
} ctx;

struct graph;

typedef struct stream {
    ctx *c;
    struct graph *cap; /* capturing into it */
    int cap_mode;      /* CUstreamCaptureMode it was begun with */
    pthread_t cap_thread;
    int cap_invalid;   /* an unsafe call while it captured: cuStreamEndCapture fails */
} stream;

typedef struct pool {
    int dev;
    int alive;
    unsigned long long reserved, used, threshold;
} pool;

typedef struct dev {
    unsigned long long total;
    unsigned long long *used; /* &mine, or this process's slot of FAKE_GPU_MEM_FILE */
    unsigned long long mine;
    char uuid[64];
    ctx primary;
    pool default_pool;
    pool *current_pool;
    unsigned long long next_addr;
    unsigned long long graph_reserved, graph_used;
    unsigned long long peak; /* the most this process had given out since fakeCudaPoolPeak */
} dev;

enum kind {
    K_MEM = 1,
    K_HANDLE,
    K_ARRAY,
    K_MIPMAP,
    K_POOL,     /* from a stream-ordered pool: the pool holds the memory */
    K_GRAPHMEM, /* a graph's allocation, alive after its launch */
    K_MODULE,
    K_LIBRARY,
    K_MEM32, /* asked for only: recorded as K_MEM at an address below 4 GiB */
    K_IPC,   /* another process's allocation opened here (cuIpcOpenMemHandle) */
};

typedef struct alloc {
    unsigned long long key;
    unsigned long long size; /* taken from the device by this allocation itself */
    ctx *c;                  /* NULL: not tied to a context */
    int dev;
    int kind;                /* 0: empty cell */
    pool *owner;             /* K_POOL: the pool it came from */
    unsigned long long part; /* K_POOL, K_GRAPHMEM: its bytes within the pool */
} alloc;

#define FAKE_SM 80 /* every device's compute capability: 8.0 */

/* What device d has given out in this process (an lvalue). */
#define USED(d) (*devs[d].used)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialised, ndevs, no_uuid;
static unsigned long long ctx_bytes;
static long long ctx_neighbour; /* FAKE_CUDA_CTX_NEIGHBOUR_MIB, in bytes */
static fake_mem_file *shared_mem; /* FAKE_GPU_MEM_FILE, or NULL */
static dev devs[MAX_DEVS];

/* After device d gave out more: its peak follows (mu held). */
static void grew(int d)
{
    if (USED(d) > devs[d].peak)
        devs[d].peak = USED(d);
}

static ctx ctxs[MAX_CTXS];
static alloc *table;
static size_t table_cap;
static unsigned long long next_handle = 0x1000, next_addr32 = 0x10000000;
static __thread ctx *stack[MAX_STACK];
static __thread int depth;

static unsigned long long env_num(const char *name, unsigned long long dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v ? strtoull(v, NULL, 10) : dflt;
}

/* ---- the allocation table (mu held) ---- */

static size_t slot_of(unsigned long long key, int kind)
{
    unsigned long long z = key * 0x9e3779b97f4a7c15ULL + (unsigned long long)kind;
    return (size_t)(z ^ (z >> 29)) & (table_cap - 1);
}

static alloc *find(unsigned long long key, int kind)
{
    if (table == NULL)
        return NULL;
    for (size_t i = slot_of(key, kind), n = 0; n < table_cap; i = (i + 1) & (table_cap - 1), n++) {
        if (table[i].kind == 0)
            return NULL;
        if (table[i].kind == kind && table[i].key == key)
            return &table[i];
    }
    return NULL;
}

static void insert(const alloc *a);

static void grow(void)
{
    alloc *old = table;
    size_t old_cap = table_cap;
    table_cap = table_cap ? table_cap * 2 : 4096;
    table = calloc(table_cap, sizeof(*table));
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].kind > 0)
            insert(&old[i]);
    free(old);
}

static size_t table_used;

static void insert(const alloc *a)
{
    if ((table_used + 1) * 2 > table_cap) {
        table_used = 0;
        grow();
    }
    size_t i = slot_of(a->key, a->kind);
    while (table[i].kind > 0)
        i = (i + 1) & (table_cap - 1);
    if (table[i].kind == 0)
        table_used++;
    table[i] = *a;
}

/* Removing shifts the following cluster back, so lookups never need tombstones. */
static void erase(alloc *a)
{
    size_t i = (size_t)(a - table);
    USED(a->dev) -= a->size;
    table[i].kind = 0;
    table_used--;
    for (size_t j = (i + 1) & (table_cap - 1); table[j].kind != 0; j = (j + 1) & (table_cap - 1)) {
        alloc moved = table[j];
        table[j].kind = 0;
        table_used--;
        insert(&moved);
    }
}

/* Frees every allocation of context c (erasing moves entries: sweep until none is left). */
static void free_ctx_allocs(ctx *c)
{
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < table_cap; i++)
            if (table[i].kind > 0 && table[i].c == c) {
                erase(&table[i]);
                again = 1;
            }
    }
}

/* Takes `size` from device d's pool and records it; mu held. */
static CUresult take(int d, unsigned long long size, ctx *c, int kind, unsigned long long *key)
{
    if (size == 0)
        return INVALID_VALUE;
    if (size > devs[d].total - USED(d))
        return OUT_OF_MEMORY;
    if (kind == K_MEM32) { /* the pre-3.2 entry points: addresses below 4 GiB */
        *key = next_addr32;
        next_addr32 += (size + 511) / 512 * 512;
        kind = K_MEM;
    } else if (kind == K_MEM || kind == K_IPC) {
        *key = devs[d].next_addr;
        devs[d].next_addr += (size + 511) / 512 * 512;
    } else {
        *key = next_handle++;
    }
    USED(d) += size;
    grew(d);
    alloc a = {.key = *key, .size = size, .c = c, .dev = d, .kind = kind};
    insert(&a);
    return OK;
}

static CUresult give(unsigned long long key, int kind)
{
    alloc *a = find(key, kind);
    if (a == NULL)
        return kind == K_MEM ? INVALID_VALUE : INVALID_HANDLE;
    erase(a);
    return OK;
}

/* ---- contexts ---- */

/* While a context is made, a neighbour allocates (or frees) FAKE_CUDA_CTX_NEIGHBOUR_MIB. */
static void neighbour_moves(int d)
{
    if (shared_mem != NULL && ctx_neighbour != 0 && d < FAKE_MEM_DEVS)
        __atomic_fetch_add(&shared_mem->neighbour[d], ctx_neighbour, __ATOMIC_ACQ_REL);
}

static ctx *current(void)
{
    return depth > 0 ? stack[depth - 1] : NULL;
}

static int valid_ctx(const ctx *c)
{
    if (c == NULL)
        return 0;
    for (int d = 0; d < ndevs; d++)
        if (c == &devs[d].primary)
            return c->primary_refs > 0;
    return c >= ctxs && c < ctxs + MAX_CTXS && c->alive;
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!initialised)                                                                          \
            return NOT_INITIALIZED;                                                                \
    } while (0)

/* The current context, or return INVALID_CONTEXT. Takes mu. */
#define NEED_CTX(c)                                                                                \
    NEED_INIT();                                                                                   \
    pthread_mutex_lock(&mu);                                                                       \
    ctx *c = current();                                                                            \
    if (!valid_ctx(c)) {                                                                           \
        pthread_mutex_unlock(&mu);                                                                 \
        return INVALID_CONTEXT;                                                                    \
    }

EXPORT CUresult cuInit(unsigned int flags);
CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (!initialised) {
        ndevs = (int)env_num("FAKE_CUDA_DEVICES", 1);
        if (ndevs < 0 || ndevs > MAX_DEVS)
            ndevs = MAX_DEVS;
        no_uuid = env_num("FAKE_CUDA_NO_UUID", 0) != 0;
        ctx_bytes = env_num("FAKE_CUDA_CTX_MIB", 0) * MIB;
        const char *nb = getenv("FAKE_CUDA_CTX_NEIGHBOUR_MIB");
        ctx_neighbour = nb != NULL ? strtoll(nb, NULL, 10) * (long long)MIB : 0;
        unsigned long long mib = env_num("FAKE_CUDA_MEM_MIB", 16384);
        const char *uuids = getenv("FAKE_CUDA_UUIDS");
        fake_mem_slot *slot = NULL;
        if ((shared_mem = fake_mem_open()) != NULL && (slot = fake_mem_claim(shared_mem)) == NULL)
            shared_mem = NULL;
        for (int d = 0; d < ndevs; d++) {
            devs[d].used = slot != NULL && d < FAKE_MEM_DEVS ? &slot->used[d] : &devs[d].mine;
            devs[d].total = mib * MIB;
            devs[d].next_addr = (unsigned long long)(d + 1) << 40;
            devs[d].primary.dev = d;
            devs[d].primary.is_primary = 1;
            devs[d].default_pool.dev = d;
            devs[d].default_pool.alive = 1;
            devs[d].current_pool = &devs[d].default_pool;
            snprintf(devs[d].uuid, sizeof(devs[d].uuid),
                     "GPU-fa4e0000-0000-0000-0000-0000000000%02d", d);
            if (uuids != NULL && *uuids) {
                size_t n = strcspn(uuids, ",");
                snprintf(devs[d].uuid, sizeof(devs[d].uuid), "%.*s", (int)n, uuids);
                uuids += n + (uuids[n] == ',');
            }
        }
        initialised = 1;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}

/* Not a driver function: lets tests see the pool itself, past any interception. */
#ifndef FAKE_CUDA_OLD
static void phys_sweep(void);
#else
static void phys_sweep(void)
{
}
#endif

EXPORT CUresult fakeCudaPoolUsed(int d, unsigned long long *used);
CUresult fakeCudaPoolUsed(int d, unsigned long long *used)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs || used == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    phys_sweep();
    *used = USED(d);
    pthread_mutex_unlock(&mu);
    return OK;
}

/*
 * Not a driver function either: the most device d had given out in this
 * process since the previous call (or cuInit), so a test sees a moment
 * past a limit that is over by the time the call returns. Starts the next
 * window at what is given out now.
 */
EXPORT CUresult fakeCudaPoolPeak(int d, unsigned long long *peak);
CUresult fakeCudaPoolPeak(int d, unsigned long long *peak)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs || peak == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    phys_sweep();
    *peak = devs[d].peak > USED(d) ? devs[d].peak : USED(d);
    devs[d].peak = USED(d);
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuDriverGetVersion(int *v);
CUresult cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return INVALID_VALUE;
    *v = 12040;
    return OK;
}

EXPORT CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    if (n == NULL)
        return INVALID_VALUE;
    *n = ndevs;
    return OK;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (d == NULL)
        return INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndevs)
        return INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The 16 bytes of "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
static CUresult get_uuid(char *out, CUdevice d)
{
    NEED_INIT();
    if (out == NULL)
        return INVALID_VALUE;
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    if (no_uuid)
        return NOT_SUPPORTED;
    const char *s = strchr(devs[d].uuid, '-');
    s = s != NULL ? s + 1 : devs[d].uuid;
    int k = 0;
    memset(out, 0, 16);
    for (; *s && k < 32; s++) {
        int v = hexval(*s);
        if (v < 0)
            continue;
        out[k / 2] = (char)(out[k / 2] | (k % 2 ? v : v << 4));
        k++;
    }
    return OK;
}

EXPORT CUresult cuDeviceGetUuid(char *uuid, CUdevice d);
CUresult cuDeviceGetUuid(char *uuid, CUdevice d)
{
    return get_uuid(uuid, d);
}

#ifndef FAKE_CUDA_OLD
EXPORT CUresult cuDeviceGetUuid_v2(char *uuid, CUdevice d);
CUresult cuDeviceGetUuid_v2(char *uuid, CUdevice d)
{
    return get_uuid(uuid, d);
}
#endif

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    NEED_INIT();
    if (bytes == NULL)
        return INVALID_VALUE;
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    *bytes = (size_t)devs[d].total;
    return OK;
}

EXPORT CUresult cuCtxCreate_v2(ctx **pctx, unsigned int flags, CUdevice d);
CUresult cuCtxCreate_v2(ctx **pctx, unsigned int flags, CUdevice d)
{
    NEED_INIT();
    if (pctx == NULL)
        return INVALID_VALUE;
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = OUT_OF_MEMORY;
    for (int i = 0; i < MAX_CTXS; i++) {
        if (ctxs[i].alive)
            continue;
        if (ctx_bytes > devs[d].total - USED(d))
            break;
        USED(d) += ctx_bytes;
        grew(d);
        neighbour_moves(d);
        ctxs[i] = (ctx){.dev = d, .alive = 1};
        if (depth < MAX_STACK)
            stack[depth++] = &ctxs[i];
        else
            stack[depth - 1] = &ctxs[i];
        *pctx = &ctxs[i];
        r = OK;
        break;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxDestroy_v2(ctx *c);
CUresult cuCtxDestroy_v2(ctx *c)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    if (c == NULL || c->is_primary || !valid_ctx(c)) {
        pthread_mutex_unlock(&mu);
        return INVALID_CONTEXT;
    }
    free_ctx_allocs(c);
    USED(c->dev) -= ctx_bytes + c->limit_mem;
    c->alive = 0;
    for (int i = 0; i < depth; i++)
        if (stack[i] == c)
            stack[i] = NULL;
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(ctx **pctx, CUdevice d);
CUresult cuDevicePrimaryCtxRetain(ctx **pctx, CUdevice d)
{
    NEED_INIT();
    if (pctx == NULL)
        return INVALID_VALUE;
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    ctx *p = &devs[d].primary;
    if (p->primary_refs == 0) {
        if (ctx_bytes > devs[d].total - USED(d)) {
            pthread_mutex_unlock(&mu);
            return OUT_OF_MEMORY;
        }
        USED(d) += ctx_bytes;
        grew(d);
        neighbour_moves(d);
    }
    p->primary_refs++;
    *pctx = p;
    pthread_mutex_unlock(&mu);
    return OK;
}

static CUresult primary_release(CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    ctx *p = &devs[d].primary;
    CUresult r = INVALID_CONTEXT;
    if (p->primary_refs > 0) {
        r = OK;
        if (--p->primary_refs == 0) {
            free_ctx_allocs(p);
            USED(d) -= ctx_bytes + p->limit_mem;
            p->limit_mem = 0;
            memset(p->limits, 0, sizeof(p->limits));
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult primary_reset(CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    free_ctx_allocs(&devs[d].primary);
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d);
CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    return primary_release(d);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d);
CUresult cuDevicePrimaryCtxReset(CUdevice d)
{
    return primary_reset(d);
}

#ifndef FAKE_CUDA_OLD
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    return primary_release(d);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    return primary_reset(d);
}
#endif

EXPORT CUresult cuCtxSetCurrent(ctx *c);
CUresult cuCtxSetCurrent(ctx *c)
{
    NEED_INIT();
    if (depth == 0)
        stack[depth++] = c;
    else
        stack[depth - 1] = c;
    if (c == NULL)
        depth--;
    return OK;
}

EXPORT CUresult cuCtxGetCurrent(ctx **pctx);
CUresult cuCtxGetCurrent(ctx **pctx)
{
    NEED_INIT();
    if (pctx == NULL)
        return INVALID_VALUE;
    *pctx = current();
    return OK;
}

EXPORT CUresult cuCtxPushCurrent_v2(ctx *c);
CUresult cuCtxPushCurrent_v2(ctx *c)
{
    NEED_INIT();
    if (depth == MAX_STACK || c == NULL)
        return INVALID_VALUE;
    stack[depth++] = c;
    return OK;
}

EXPORT CUresult cuCtxPopCurrent_v2(ctx **pctx);
CUresult cuCtxPopCurrent_v2(ctx **pctx)
{
    NEED_INIT();
    if (depth == 0)
        return INVALID_CONTEXT;
    ctx *c = stack[--depth];
    if (pctx != NULL)
        *pctx = c;
    return OK;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d);
CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_CTX(c);
    *d = c->dev;
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuStreamCreate(stream **ps, unsigned int flags);
CUresult cuStreamCreate(stream **ps, unsigned int flags)
{
    NEED_CTX(c);
    pthread_mutex_unlock(&mu);
    *ps = calloc(1, sizeof(stream));
    if (*ps == NULL)
        return OUT_OF_MEMORY;
    (*ps)->c = c;
    return OK;
}

EXPORT CUresult cuStreamDestroy_v2(stream *s);
CUresult cuStreamDestroy_v2(stream *s)
{
    NEED_INIT();
    free(s);
    return OK;
}

/* The legacy and per-thread default streams are handles 0, 1 and 2. */
static ctx *stream_ctx(stream *s)
{
    return (uintptr_t)s <= 2 ? current() : s->c;
}

EXPORT CUresult cuStreamGetCtx(stream *s, ctx **pctx);
CUresult cuStreamGetCtx(stream *s, ctx **pctx)
{
    NEED_INIT();
    *pctx = stream_ctx(s);
    return *pctx != NULL ? OK : INVALID_CONTEXT;
}

#ifndef FAKE_CUDA_NO_MEMGETINFO
EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    NEED_CTX(c);
    if (free_bytes == NULL || total == NULL) {
        pthread_mutex_unlock(&mu);
        return INVALID_VALUE;
    }
    phys_sweep();
    unsigned long long used = USED(c->dev);
    if (shared_mem != NULL) /* neighbours hold memory too */
        used = fake_mem_device_used(shared_mem, c->dev);
    *free_bytes = (size_t)(used < devs[c->dev].total ? devs[c->dev].total - used : 0);
    *total = (size_t)devs[c->dev].total;
    pthread_mutex_unlock(&mu);
    return OK;
}
#endif

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    NEED_CTX(c);
    CUresult r = p == NULL ? INVALID_VALUE : take(c->dev, size, c, K_MEM, p);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem);
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height,
                            unsigned int elem)
{
    NEED_CTX(c);
    CUresult r = INVALID_VALUE;
    if (p != NULL && pitch != NULL && width > 0 && height > 0 &&
        (elem == 4 || elem == 8 || elem == 16)) {
        size_t pt = (width + 511) / 512 * 512;
        r = take(c->dev, (unsigned long long)pt * height, c, K_MEM, p);
        if (r == OK)
            *pitch = pt;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags);
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    NEED_CTX(c);
    CUresult r =
        (p == NULL || (flags != 1 && flags != 2)) ? INVALID_VALUE : take(c->dev, size, c, K_MEM, p);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemFree_v2(CUdeviceptr p)
{
    NEED_INIT();
    if (p == 0)
        return OK;
    pthread_mutex_lock(&mu);
    CUresult r = give(p, K_MEM);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- one GPU's time, shared by every process that uses it ---- */

/*
 * With FAKE_CUDA_GPU_FILE naming a file (zero-filled or absent), kernels
 * take time: a launch's grid x is its duration in microseconds, and the
 * kernels of all processes using that file run one after another on one
 * timeline (CLOCK_MONOTONIC ns), as time-sliced contexts share a GPU. A
 * process may queue at most FAKE_CUDA_QUEUE_MS milliseconds ahead (4 by
 * default): further launches wait, as a driver's full launch queue makes
 * them. A real queue holds about 1024 launches, so a training step of 25
 * kernels of 2 ms fits in it whole: FAKE_CUDA_QUEUE_MS=50 or more lets a
 * process queue a step and then wait for it in a synchronisation.
 * Synchronisations wait for this process's last kernel.
 */
#define QUEUE_NS_DEFAULT 4000000ULL
static unsigned long long queue_ns = QUEUE_NS_DEFAULT;

typedef struct timeline {
    _Atomic unsigned long long busy_until;
} timeline;

static timeline *gpu;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned long long last_end; /* this process's last kernel */

/* This process's kernels: when each ends and how long it ran. */
static pthread_mutex_t ran_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long (*ran)[2];
static size_t nran, cap_ran;

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static void sleep_ns(unsigned long long ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    nanosleep(&ts, NULL);
}

static void gpu_open(void)
{
    const char *path = getenv("FAKE_CUDA_GPU_FILE");
    int fd = path != NULL ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    if (fd < 0)
        return;
    if (ftruncate(fd, sizeof(timeline)) == 0) {
        void *m = mmap(NULL, sizeof(timeline), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED)
            gpu = m;
    }
    close(fd);
    const char *q = getenv("FAKE_CUDA_QUEUE_MS");
    char *end = NULL;
    unsigned long long ms = q != NULL ? strtoull(q, &end, 10) : 0;
    if (q != NULL && end != q && *end == '\0' && ms > 0 && ms <= 600000)
        queue_ns = ms * 1000000ULL;
}

/* Queues a kernel of `us` microseconds on the shared timeline. */
static void run_kernel(unsigned int us)
{
    pthread_once(&gpu_once, gpu_open);
    if (gpu == NULL || us == 0)
        return;
    unsigned long long now = now_ns(), mine = atomic_load(&last_end);
    if (mine > now + queue_ns) {
        sleep_ns(mine - now - queue_ns);
        now = now_ns();
    }
    unsigned long long d = (unsigned long long)us * 1000ULL, old = atomic_load(&gpu->busy_until),
                       end;
    do
        end = (old > now ? old : now) + d;
    while (!atomic_compare_exchange_weak(&gpu->busy_until, &old, end));
    atomic_store(&last_end, end);
    ctx *c = current();
    if (c != NULL)
        atomic_store(&c->last_end, end);
    pthread_mutex_lock(&ran_mu);
    if (nran == cap_ran) {
        size_t cap = cap_ran ? cap_ran * 2 : 1024;
        void *p = realloc(ran, cap * sizeof(*ran));
        if (p != NULL) {
            ran = p;
            cap_ran = cap;
        }
    }
    if (nran < cap_ran) {
        ran[nran][0] = end;
        ran[nran][1] = d;
        nran++;
    }
    pthread_mutex_unlock(&ran_mu);
}

/* Waits until this process's kernels have run. */
static void gpu_drain(void)
{
    unsigned long long end = atomic_load(&last_end), now = now_ns();
    if (end > now)
        sleep_ns(end - now);
}

/*
 * Waits until the current context's kernels have run: a context's
 * synchronisation does not wait for the work of the process's other
 * contexts, which the GPU runs on regardless.
 */
static void ctx_drain(void)
{
    ctx *c = current();
    unsigned long long end = c != NULL ? atomic_load(&c->last_end) : atomic_load(&last_end),
                       now = now_ns();
    if (end > now)
        sleep_ns(end - now);
}

/*
 * Not a driver function: GPU time (ns) of this process's kernels that ran
 * within [from, until] on the CLOCK_MONOTONIC clock.
 */
EXPORT CUresult fakeCudaGpuTime(unsigned long long from, unsigned long long until,
                                unsigned long long *ns);
CUresult fakeCudaGpuTime(unsigned long long from, unsigned long long until, unsigned long long *ns)
{
    unsigned long long t = 0;
    pthread_mutex_lock(&ran_mu);
    for (size_t i = 0; i < nran; i++) {
        unsigned long long end = ran[i][0], start = end - ran[i][1];
        unsigned long long a = start > from ? start : from, b = end < until ? end : until;
        t += b > a ? b - a : 0;
    }
    pthread_mutex_unlock(&ran_mu);
    *ns = t;
    return OK;
}

/* ---- synchronisation: what a stream does when it gets there ---- */

#define GRAN (2 * MIB) /* pools and graph memory grow and shrink by this */

enum op_kind { OP_FREE = 1, OP_HOSTFN };

typedef struct op {
    stream *s; /* NULL: a default stream */
    int kind;
    unsigned long long ptr;
    void (*fn)(void *);
    void *data;
} op;

static op *ops;
static size_t nops, cap_ops;

static unsigned long long round_up(unsigned long long n)
{
    return (n + GRAN - 1) / GRAN * GRAN;
}

static stream *stream_key(stream *s)
{
    return (uintptr_t)s <= 2 ? NULL : s;
}

/* mu held. 0, or OUT_OF_MEMORY. (Unused by the pre-CUDA-11 variant, which queues nothing.) */
__attribute__((unused)) static CUresult enqueue(stream *s, int kind, unsigned long long ptr,
                                               void (*fn)(void *), void *data)
{
    if (nops == cap_ops) {
        size_t cap = cap_ops ? cap_ops * 2 : 64;
        op *p = realloc(ops, cap * sizeof(*ops));
        if (p == NULL)
            return OUT_OF_MEMORY;
        ops = p;
        cap_ops = cap;
    }
    ops[nops++] = (op){.s = stream_key(s), .kind = kind, .ptr = ptr, .fn = fn, .data = data};
    return OK;
}

/* A pool gives back what it holds above max(what is in use, keep). mu held. */
static void pool_shrink(pool *p, unsigned long long keep)
{
    unsigned long long floor = round_up(p->used);
    if (floor < keep)
        floor = keep;
    if (p->reserved > floor) {
        USED(p->dev) -= p->reserved - floor;
        p->reserved = floor;
    }
}

#define MAX_POOLS 64
static pool pools[MAX_POOLS];

/* At a synchronisation, every pool holding more than its release threshold lets the rest go. */
static void sync_pools(void)
{
    for (int d = 0; d < ndevs; d++)
        if (devs[d].default_pool.reserved > devs[d].default_pool.threshold)
            pool_shrink(&devs[d].default_pool, devs[d].default_pool.threshold);
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].alive && pools[i].reserved > pools[i].threshold)
            pool_shrink(&pools[i], pools[i].threshold);
}

/* Frees what an OP_FREE names. mu held. */
static void do_free(unsigned long long ptr)
{
    alloc *a = find(ptr, K_POOL);
    if (a != NULL) {
        a->owner->used -= a->part;
        erase(a);
        return;
    }
    if ((a = find(ptr, K_GRAPHMEM)) != NULL) {
        devs[a->dev].graph_used -= a->part;
        erase(a);
        return;
    }
    give(ptr, K_MEM);
}

/* Runs the queued work of stream s (all streams when `all`), in order; host functions unlocked. */
static void run_ops(stream *s, int all)
{
    s = stream_key(s);
    for (;;) {
        pthread_mutex_lock(&mu);
        size_t i = 0;
        while (i < nops && !all && ops[i].s != s)
            i++;
        if (i == nops) {
            sync_pools();
            pthread_mutex_unlock(&mu);
            return;
        }
        op o = ops[i];
        memmove(&ops[i], &ops[i + 1], (nops - i - 1) * sizeof(*ops));
        nops--;
        if (o.kind == OP_FREE)
            do_free(o.ptr);
        pthread_mutex_unlock(&mu);
        if (o.kind == OP_HOSTFN)
            o.fn(o.data);
    }
}

EXPORT CUresult cuStreamSynchronize(stream *s);
CUresult cuStreamSynchronize(stream *s)
{
    NEED_INIT();
    gpu_drain();
    run_ops(s, 0);
    return OK;
}

/*
 * Stream capture and "potentially unsafe" calls, as the driver API documents
 * them (cuThreadExchangeStreamCaptureMode): a thread whose own mode is
 * global is refused such a call (cuCtxSynchronize here) while it has a
 * capture of its own that was not begun relaxed, or while any thread has
 * one begun global; thread-local mode only minds its own captures; relaxed
 * minds none. A refused call returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * and invalidates the capture it ran into, whose cuStreamEndCapture then
 * fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 */
enum { CAP_GLOBAL = 0, CAP_THREAD_LOCAL = 1, CAP_RELAXED = 2 };
#define CAPTURE_UNSUPPORTED ((CUresult)900)
#define CAPTURE_INVALIDATED ((CUresult)901)
#define MAX_CAPTURES        16
static _Thread_local int capture_mode = CAP_GLOBAL;
static stream *captures[MAX_CAPTURES]; /* mu */

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (mode == NULL || *mode < CAP_GLOBAL || *mode > CAP_RELAXED)
        return INVALID_VALUE;
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return OK;
}

/* A potentially unsafe call from this thread: refused, invalidating what it runs into. */
static CUresult unsafe_call(void)
{
    CUresult r = OK;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_CAPTURES && capture_mode != CAP_RELAXED; i++) {
        stream *s = captures[i];
        if (s == NULL)
            continue;
        int own = pthread_equal(s->cap_thread, pthread_self());
        if ((own && s->cap_mode != CAP_RELAXED) ||
            (!own && capture_mode == CAP_GLOBAL && s->cap_mode == CAP_GLOBAL)) {
            s->cap_invalid = 1;
            r = CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxSynchronize(void);
CUresult cuCtxSynchronize(void)
{
    NEED_INIT();
    CUresult unsafe = unsafe_call();
    if (unsafe != OK)
        return unsafe;
    ctx_drain();
    run_ops(NULL, 1);
    return OK;
}

#ifndef FAKE_CUDA_OLD
/* ---- graphs (what memory nodes need) ---- */

enum { NODE_KERNEL = 0, NODE_HOST = 3, NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11 };

typedef struct gnode {
    int type;
    int dev;
    unsigned long long bytes, dptr;
} gnode;

#define MAX_NODES 64

typedef struct graph {
    gnode *nodes[MAX_NODES];
    int n;
} graph;

typedef struct gexec {
    gnode nodes[MAX_NODES];
    int n;
} gexec;

static CUresult add_node(graph *g, gnode **out, int type, int d, unsigned long long bytes,
                         unsigned long long dptr)
{
    if (g == NULL || g->n == MAX_NODES)
        return INVALID_VALUE;
    gnode *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return OUT_OF_MEMORY;
    *n = (gnode){.type = type, .dev = d, .bytes = bytes, .dptr = dptr};
    g->nodes[g->n++] = n;
    if (out != NULL)
        *out = n;
    return OK;
}

EXPORT CUresult cuGraphCreate(graph **pg, unsigned int flags);
CUresult cuGraphCreate(graph **pg, unsigned int flags)
{
    NEED_INIT();
    if (pg == NULL || (*pg = calloc(1, sizeof(graph))) == NULL)
        return INVALID_VALUE;
    return OK;
}

EXPORT CUresult cuGraphDestroy(graph *g);
CUresult cuGraphDestroy(graph *g)
{
    NEED_INIT();
    for (int i = 0; g != NULL && i < g->n; i++)
        free(g->nodes[i]);
    free(g);
    return OK;
}

/* A memory node's address: fixed when it is added, backed only while the graph's memory is. */
static unsigned long long graph_va(int d, unsigned long long bytes)
{
    unsigned long long va = devs[d].next_addr;
    devs[d].next_addr += round_up(bytes);
    return va;
}

typedef struct {
    int alloc_type, handle_types;
    struct {
        int type, id;
    } location;
    void *win32;
    unsigned char rest[64];
} pool_props;

typedef struct {
    pool_props props;
    const void *access;
    size_t naccess;
    size_t bytesize;
    CUdeviceptr dptr;
} alloc_node_params;

EXPORT CUresult cuGraphAddMemAllocNode(gnode **node, graph *g, void *deps, size_t ndeps,
                                       alloc_node_params *params);
CUresult cuGraphAddMemAllocNode(gnode **node, graph *g, void *deps, size_t ndeps,
                                alloc_node_params *params)
{
    NEED_INIT();
    if (params == NULL || params->bytesize == 0 || params->props.location.type != 1 ||
        params->props.location.id < 0 || params->props.location.id >= ndevs)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int d = params->props.location.id;
    params->dptr = graph_va(d, params->bytesize);
    CUresult r = add_node(g, node, NODE_MEM_ALLOC, d, params->bytesize, params->dptr);
    pthread_mutex_unlock(&mu);
    return r;
}

/* CUDA_KERNEL_NODE_PARAMS begins with the function and the grid: its x is the duration in us. */
typedef struct {
    void *func;
    unsigned int grid_x;
} kernel_node_params;

EXPORT CUresult cuGraphAddKernelNode(gnode **node, graph *g, void *deps, size_t ndeps,
                                     const kernel_node_params *params);
CUresult cuGraphAddKernelNode(gnode **node, graph *g, void *deps, size_t ndeps,
                              const kernel_node_params *params)
{
    NEED_INIT();
    if (params == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = add_node(g, node, NODE_KERNEL, 0, params->grid_x, 0);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuGraphAddMemFreeNode(gnode **node, graph *g, void *deps, size_t ndeps,
                                      CUdeviceptr dptr);
CUresult cuGraphAddMemFreeNode(gnode **node, graph *g, void *deps, size_t ndeps, CUdeviceptr dptr)
{
    NEED_INIT();
    return add_node(g, node, NODE_MEM_FREE, 0, 0, dptr);
}

EXPORT CUresult cuGraphGetNodes(graph *g, gnode **nodes, size_t *n);
CUresult cuGraphGetNodes(graph *g, gnode **nodes, size_t *n)
{
    NEED_INIT();
    if (g == NULL || n == NULL)
        return INVALID_VALUE;
    if (nodes != NULL)
        for (size_t i = 0; i < *n && i < (size_t)g->n; i++)
            nodes[i] = g->nodes[i];
    *n = (size_t)g->n;
    return OK;
}

EXPORT CUresult cuGraphNodeGetType(gnode *node, int *type);
CUresult cuGraphNodeGetType(gnode *node, int *type)
{
    NEED_INIT();
    if (node == NULL || type == NULL)
        return INVALID_VALUE;
    *type = node->type;
    return OK;
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(gnode *node, alloc_node_params *params);
CUresult cuGraphMemAllocNodeGetParams(gnode *node, alloc_node_params *params)
{
    NEED_INIT();
    if (node == NULL || params == NULL || node->type != NODE_MEM_ALLOC)
        return INVALID_VALUE;
    memset(params, 0, sizeof(*params));
    params->props.alloc_type = 1;
    params->props.location.type = 1;
    params->props.location.id = node->dev;
    params->bytesize = node->bytes;
    params->dptr = node->dptr;
    return OK;
}

EXPORT CUresult cuGraphInstantiateWithFlags(gexec **pe, graph *g, unsigned long long flags);
CUresult cuGraphInstantiateWithFlags(gexec **pe, graph *g, unsigned long long flags)
{
    NEED_INIT();
    if (pe == NULL || g == NULL || (*pe = calloc(1, sizeof(gexec))) == NULL)
        return INVALID_VALUE;
    for (int i = 0; i < g->n; i++)
        (*pe)->nodes[i] = *g->nodes[i];
    (*pe)->n = g->n;
    return OK;
}

/*
 * Maps the graph's memory: the device's graph memory grows to hold every
 * allocation node at once. mu held.
 */
static CUresult graph_map(const gexec *e)
{
    unsigned long long need[MAX_DEVS] = {0};
    for (int i = 0; i < e->n; i++)
        if (e->nodes[i].type == NODE_MEM_ALLOC)
            need[e->nodes[i].dev] += e->nodes[i].bytes;
    for (int d = 0; d < ndevs; d++) {
        unsigned long long spare = devs[d].graph_reserved - devs[d].graph_used;
        if (need[d] <= spare)
            continue;
        unsigned long long grow = round_up(need[d] - spare);
        if (grow > devs[d].total - USED(d))
            return OUT_OF_MEMORY;
        USED(d) += grow;
        grew(d);
        devs[d].graph_reserved += grow;
    }
    return OK;
}

EXPORT CUresult cuGraphUpload(gexec *e, stream *s);
CUresult cuGraphUpload(gexec *e, stream *s)
{
    NEED_INIT();
    if (e == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = graph_map(e);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- issue 25: instantiation with parameters ---- */

/* CUDA_GRAPH_INSTANTIATE_PARAMS */
typedef struct {
    unsigned long long flags;
    stream *upload;
    gnode *err_node;
    int result;
} inst_params;

/*
 * As documented: with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD (2) the graph is
 * uploaded to hUploadStream as part of the instantiation, mapping its
 * memory (as cuGraphUpload); that failing fails the call.
 */
EXPORT CUresult cuGraphInstantiateWithParams(gexec **pe, graph *g, inst_params *p);
CUresult cuGraphInstantiateWithParams(gexec **pe, graph *g, inst_params *p)
{
    if (p == NULL)
        return INVALID_VALUE;
    CUresult r = cuGraphInstantiateWithFlags(pe, g, p->flags & ~2ULL);
    if (r == OK && (p->flags & 2)) {
        pthread_mutex_lock(&mu);
        r = graph_map(*pe);
        pthread_mutex_unlock(&mu);
        if (r != OK) {
            free(*pe);
            *pe = NULL;
        }
    }
    p->result = r == OK ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR */
    return r;
}

/* Allocations the graph does not free itself outlive the launch, until freed outside it. */
EXPORT CUresult cuGraphLaunch(gexec *e, stream *s);
CUresult cuGraphLaunch(gexec *e, stream *s)
{
    NEED_INIT();
    if (e == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = graph_map(e);
    for (int i = 0; r == OK && i < e->n; i++) {
        const gnode *n = &e->nodes[i];
        int freed = 0;
        for (int k = 0; n->type == NODE_MEM_ALLOC && k < e->n; k++)
            freed |= e->nodes[k].type == NODE_MEM_FREE && e->nodes[k].dptr == n->dptr;
        if (n->type != NODE_MEM_ALLOC || freed || find(n->dptr, K_GRAPHMEM) != NULL)
            continue;
        devs[n->dev].graph_used += n->bytes;
        alloc a = {.key = n->dptr, .dev = n->dev, .kind = K_GRAPHMEM, .part = n->bytes};
        insert(&a);
    }
    pthread_mutex_unlock(&mu);
    for (int i = 0; r == OK && i < e->n; i++) /* its kernels, one after another */
        if (e->nodes[i].type == NODE_KERNEL)
            run_kernel((unsigned int)e->nodes[i].bytes);
    return r;
}

EXPORT CUresult cuGraphExecDestroy(gexec *e);
CUresult cuGraphExecDestroy(gexec *e)
{
    NEED_INIT();
    free(e);
    return OK;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, unsigned long long *value);
CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, unsigned long long *value)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs || value == NULL || attr < 0 || attr > 3)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *value = attr < 2 ? devs[d].graph_used : devs[d].graph_reserved;
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d);
CUresult cuDeviceGraphMemTrim(CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    run_ops(NULL, 1); /* the driver synchronises first */
    pthread_mutex_lock(&mu);
    unsigned long long floor = round_up(devs[d].graph_used);
    if (devs[d].graph_reserved > floor) {
        USED(d) -= devs[d].graph_reserved - floor;
        devs[d].graph_reserved = floor;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}

/* ---- stream capture ---- */

EXPORT CUresult cuStreamBeginCapture_v2(stream *s, int mode);
CUresult cuStreamBeginCapture_v2(stream *s, int mode)
{
    NEED_INIT();
    if ((uintptr_t)s <= 2 || s->cap != NULL || mode < CAP_GLOBAL || mode > CAP_RELAXED)
        return INVALID_VALUE; /* the default streams cannot be captured */
    CUresult r = cuGraphCreate(&s->cap, 0);
    if (r != OK)
        return r;
    pthread_mutex_lock(&mu);
    s->cap_mode = mode;
    s->cap_thread = pthread_self();
    s->cap_invalid = 0;
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i] == NULL) {
            captures[i] = s;
            break;
        }
    pthread_mutex_unlock(&mu);
    return OK;
}

/* The 10.0 entry point: no mode, as global. */
EXPORT CUresult cuStreamBeginCapture(stream *s);
CUresult cuStreamBeginCapture(stream *s)
{
    return cuStreamBeginCapture_v2(s, CAP_GLOBAL);
}

EXPORT CUresult cuStreamEndCapture(stream *s, graph **pg);
CUresult cuStreamEndCapture(stream *s, graph **pg)
{
    NEED_INIT();
    if ((uintptr_t)s <= 2 || s->cap == NULL || pg == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i] == s)
            captures[i] = NULL;
    int invalid = s->cap_invalid;
    pthread_mutex_unlock(&mu);
    *pg = invalid ? NULL : s->cap; /* an invalidated capture's graph is the driver's to drop */
    s->cap = NULL;
    return invalid ? CAPTURE_INVALIDATED : OK;
}

EXPORT CUresult cuStreamIsCapturing(stream *s, int *status);
CUresult cuStreamIsCapturing(stream *s, int *status)
{
    NEED_INIT();
    if (status == NULL)
        return INVALID_VALUE;
    /* CU_STREAM_CAPTURE_STATUS_NONE, _ACTIVE, _INVALIDATED */
    *status = (uintptr_t)s <= 2 || s->cap == NULL ? 0 : s->cap_invalid ? 2 : 1;
    return OK;
}

static graph *capturing(stream *s)
{
    return (uintptr_t)s > 2 ? s->cap : NULL;
}

/*
 * A kernel launched into a capturing stream is recorded in the capture's
 * graph, as a kernel node of the same duration, and does not run.
 */
static CUresult captured(stream *s, unsigned int grid_x)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = add_node(s->cap, NULL, NODE_KERNEL, 0, grid_x, 0);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuLaunchHostFunc(stream *s, void (*fn)(void *), void *data);
CUresult cuLaunchHostFunc(stream *s, void (*fn)(void *), void *data)
{
    NEED_INIT();
    if (fn == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = capturing(s) != NULL ? add_node(capturing(s), NULL, NODE_HOST, 0, 0, 0)
                                      : enqueue(s, OP_HOSTFN, 0, fn, data);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- stream-ordered pools ---- */

/* From pool p: what it has free first, else it grows by whole granules. mu held. */
static CUresult pool_take(pool *p, unsigned long long size, CUdeviceptr *out)
{
    if (size == 0)
        return INVALID_VALUE;
    unsigned long long spare = p->reserved - p->used;
    if (size > spare) {
        unsigned long long grow = round_up(size - spare);
        if (grow > devs[p->dev].total - USED(p->dev))
            return OUT_OF_MEMORY;
        USED(p->dev) += grow;
        grew(p->dev);
        p->reserved += grow;
    }
    p->used += size;
    *out = devs[p->dev].next_addr;
    devs[p->dev].next_addr += (size + 511) / 512 * 512;
    alloc a = {.key = *out, .dev = p->dev, .kind = K_POOL, .owner = p, .part = size};
    insert(&a);
    return OK;
}

static CUresult alloc_from(pool *p, CUdeviceptr *out, size_t size, stream *s)
{
    NEED_INIT();
    if (out == NULL || p == NULL || !p->alive)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    ctx *c = stream_ctx(s);
    graph *g = capturing(s);
    CUresult r;
    if (!valid_ctx(c))
        r = INVALID_CONTEXT;
    else if (g != NULL) { /* captured: a memory node of the graph, no memory now */
        *out = graph_va(p->dev, size);
        r = add_node(g, NULL, NODE_MEM_ALLOC, p->dev, size, *out);
    } else
        r = pool_take(p, size, out);
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult alloc_async(CUdeviceptr *p, size_t size, stream *s)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    ctx *c = stream_ctx(s);
    pool *pl = valid_ctx(c) ? devs[c->dev].current_pool : NULL;
    pthread_mutex_unlock(&mu);
    return pl == NULL ? INVALID_CONTEXT : alloc_from(pl, p, size, s);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, stream *s);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, stream *s)
{
    return alloc_async(p, size, s);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, stream *s);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, stream *s)
{
    return alloc_async(p, size, s);
}

EXPORT CUresult cuDeviceGetDefaultMemPool(pool **pp, CUdevice d);
CUresult cuDeviceGetDefaultMemPool(pool **pp, CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs)
        return INVALID_DEVICE;
    *pp = &devs[d].default_pool;
    return OK;
}

EXPORT CUresult cuDeviceGetMemPool(pool **pp, CUdevice d);
CUresult cuDeviceGetMemPool(pool **pp, CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs || pp == NULL)
        return INVALID_DEVICE;
    *pp = devs[d].current_pool;
    return OK;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice d, pool *p);
CUresult cuDeviceSetMemPool(CUdevice d, pool *p)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs || p == NULL || p->dev != d)
        return INVALID_VALUE;
    devs[d].current_pool = p;
    return OK;
}

EXPORT CUresult cuMemPoolCreate(pool **pp, const pool_props *props);
CUresult cuMemPoolCreate(pool **pp, const pool_props *props)
{
    NEED_INIT();
    if (pp == NULL || props == NULL || props->location.type != 1 || props->location.id < 0 ||
        props->location.id >= ndevs)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = OUT_OF_MEMORY;
    for (int i = 0; i < MAX_POOLS; i++)
        if (!pools[i].alive) {
            pools[i] = (pool){.dev = props->location.id, .alive = 1};
            *pp = &pools[i];
            r = OK;
            break;
        }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemPoolDestroy(pool *p);
CUresult cuMemPoolDestroy(pool *p)
{
    NEED_INIT();
    if (p == NULL || p < pools || p >= pools + MAX_POOLS || !p->alive)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (devs[p->dev].current_pool == p)
        devs[p->dev].current_pool = &devs[p->dev].default_pool;
    if (p->used == 0) { /* otherwise it lives on until its allocations are freed */
        pool_shrink(p, 0);
        p->alive = 0;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuMemPoolTrimTo(pool *p, size_t keep);
CUresult cuMemPoolTrimTo(pool *p, size_t keep)
{
    NEED_INIT();
    if (p == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    pool_shrink(p, keep);
    pthread_mutex_unlock(&mu);
    return OK;
}

enum { ATTR_THRESHOLD = 4, ATTR_RESERVED, ATTR_RESERVED_HIGH, ATTR_USED, ATTR_USED_HIGH };

EXPORT CUresult cuMemPoolSetAttribute(pool *p, int attr, void *value);
CUresult cuMemPoolSetAttribute(pool *p, int attr, void *value)
{
    NEED_INIT();
    if (p == NULL || value == NULL || attr != ATTR_THRESHOLD)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    p->threshold = *(unsigned long long *)value;
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuMemPoolGetAttribute(pool *p, int attr, void *value);
CUresult cuMemPoolGetAttribute(pool *p, int attr, void *value)
{
    NEED_INIT();
    if (p == NULL || value == NULL || attr < ATTR_THRESHOLD || attr > ATTR_USED_HIGH)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    unsigned long long v = attr == ATTR_THRESHOLD ? p->threshold
                           : attr <= ATTR_RESERVED_HIGH ? p->reserved
                                                        : p->used;
    pthread_mutex_unlock(&mu);
    *(unsigned long long *)value = v;
    return OK;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, pool *pl, stream *s);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, pool *pl, stream *s)
{
    return alloc_from(pl, p, size, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, pool *pl, stream *s);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, pool *pl, stream *s)
{
    return alloc_from(pl, p, size, s);
}

/* Done when the stream gets there, not now; captured, a node of the graph. */
static CUresult free_async(CUdeviceptr p, stream *s)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    graph *g = capturing(s);
    CUresult r;
    if (g != NULL)
        r = add_node(g, NULL, NODE_MEM_FREE, 0, 0, p);
    else if (find(p, K_POOL) == NULL && find(p, K_GRAPHMEM) == NULL && find(p, K_MEM) == NULL)
        r = INVALID_VALUE;
    else
        r = enqueue(s, OP_FREE, p, NULL, NULL);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, stream *s);
CUresult cuMemFreeAsync(CUdeviceptr p, stream *s)
{
    return free_async(p, s);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, stream *s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, stream *s)
{
    return free_async(p, s);
}

/* ---- virtual memory management ---- */

typedef struct {
    int type, handle_types;
    struct {
        int type, id;
    } location;
    void *win32;
    unsigned char flags[8];
} mem_prop;

#define MAX_PHYS    1024
#define MAX_EXPORTS 8

/* Physical memory: alive while a handle, a mapping or an exported descriptor of it is. */
typedef struct phys {
    int alive, dev, foreign;
    int mcast; /* a multicast object (takes no memory here; its bindings keep memory alive) */
    unsigned long long size;
    int refs, maps, nexp;
    int exp_fd[MAX_EXPORTS]; /* the kept end of each export's socket pair */
    unsigned long long exp_ino[MAX_EXPORTS];
} phys;

typedef struct hmap {
    unsigned long long h;
    int p, refs;
} hmap;

typedef struct vmap {
    unsigned long long va, size, h;
    int p;
} vmap;

static phys physs[MAX_PHYS];
static hmap hmaps[4 * MAX_PHYS];
static vmap vmaps[4 * MAX_PHYS];
static int nhmaps, nvmaps;
static unsigned long long next_va = 0x7f0000000000ULL;

/*
 * An exported descriptor keeps the memory alive by its open file
 * description, as the driver's does: every dup of it, in this process or
 * any other that received or inherited it, until the last is closed. The
 * export is one end of a socket pair whose other end the fake keeps (a
 * file of its own, which no scan of descriptors mistakes for the export):
 * that end sees a hangup once the last copy of the exported one is gone.
 * The size waits in the socket for an importer to peek at.
 */
static int export_open(const phys *p, int k)
{
    struct pollfd pf = {.fd = p->exp_fd[k], .events = POLLIN};
    return p->exp_fd[k] >= 0 && poll(&pf, 1, 0) >= 0 && !(pf.revents & (POLLHUP | POLLERR));
}

static void mcast_gone(int mc);

/* Frees physical memory nothing refers to any more. mu held. */
static void phys_settle(int i)
{
    phys *p = &physs[i];
    if (!p->alive || p->refs > 0 || p->maps > 0)
        return;
    for (int k = 0; k < p->nexp; k++)
        if (export_open(p, k))
            return;
    if (!p->foreign)
        USED(p->dev) -= p->size;
    for (int k = 0; k < p->nexp; k++)
        if (p->exp_fd[k] >= 0)
            close(p->exp_fd[k]);
    p->nexp = 0;
    p->alive = 0;
    if (p->mcast)
        mcast_gone(i);
}

/* A closed export is noticed when the driver is next asked about memory. mu held. */
static void phys_sweep(void)
{
    for (int i = 0; i < MAX_PHYS; i++)
        if (physs[i].alive && physs[i].nexp > 0)
            phys_settle(i);
}

static hmap *handle_of(unsigned long long h)
{
    for (int i = 0; i < nhmaps; i++)
        if (hmaps[i].h == h)
            return &hmaps[i];
    return NULL;
}

/* One more reference of handle h to physical memory p. mu held. */
static CUresult handle_ref(unsigned long long h, int p)
{
    hmap *m = handle_of(h);
    if (m == NULL) {
        if (nhmaps == 4 * MAX_PHYS)
            return OUT_OF_MEMORY;
        m = &hmaps[nhmaps++];
        *m = (hmap){.h = h, .p = p};
    }
    m->refs++;
    physs[p].refs++;
    return OK;
}

static int new_phys(void)
{
    for (int i = 0; i < MAX_PHYS; i++)
        if (!physs[i].alive)
            return i;
    return -1;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const mem_prop *prop,
                            unsigned long long flags);
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const mem_prop *prop,
                     unsigned long long flags)
{
    NEED_INIT();
    if (h == NULL || prop == NULL || prop->location.type != 1 || flags != 0 || size == 0)
        return INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= ndevs)
        return INVALID_DEVICE;
    int d = prop->location.id;
    pthread_mutex_lock(&mu);
    phys_sweep();
    int i = new_phys();
    CUresult r = OUT_OF_MEMORY;
    if (i >= 0 && size <= devs[d].total - USED(d)) {
        USED(d) += size;
        grew(d);
        physs[i] = (phys){.alive = 1, .dev = d, .size = size};
        *h = next_handle++;
        r = handle_ref(*h, i);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    hmap *m = handle_of(h);
    CUresult r = INVALID_VALUE;
    if (m != NULL) {
        int p = m->p;
        physs[p].refs--;
        if (--m->refs == 0)
            *m = hmaps[--nhmaps];
        phys_settle(p);
        r = OK;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags)
{
    NEED_INIT();
    if (ptr == NULL || size == 0)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *ptr = next_va;
    next_va += round_up(size);
    pthread_mutex_unlock(&mu);
    return OK;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    return OK;
}

EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset,
                         CUmemGenericAllocationHandle h, unsigned long long flags);
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    hmap *m = handle_of(h);
    CUresult r = INVALID_VALUE;
    if (m != NULL && size != 0 && offset + size <= physs[m->p].size && nvmaps < 4 * MAX_PHYS) {
        vmaps[nvmaps++] = (vmap){.va = va, .size = size, .h = h, .p = m->p};
        physs[m->p].maps++;
        r = OK;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size);
CUresult cuMemUnmap(CUdeviceptr va, size_t size)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    int n = 0;
    for (int i = 0; i < nvmaps;) {
        if (vmaps[i].va >= va && vmaps[i].va < va + size) {
            int p = vmaps[i].p;
            vmaps[i] = vmaps[--nvmaps];
            physs[p].maps--;
            phys_settle(p);
            n++;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&mu);
    return n > 0 ? OK : INVALID_VALUE;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    NEED_INIT();
    unsigned long long a = (uintptr_t)addr;
    pthread_mutex_lock(&mu);
    CUresult r = INVALID_VALUE;
    for (int i = 0; i < nvmaps && h != NULL; i++)
        if (a >= vmaps[i].va && a < vmaps[i].va + vmaps[i].size) {
            *h = vmaps[i].h; /* the very handle it was mapped with */
            r = handle_ref(*h, vmaps[i].p);
            break;
        }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                             unsigned long long flags);
CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                      unsigned long long flags)
{
    NEED_INIT();
    if (out == NULL || type != 1 /* POSIX file descriptor */)
        return NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    hmap *m = handle_of(h);
    CUresult r = INVALID_VALUE;
    phys *p = m != NULL ? &physs[m->p] : NULL;
    struct stat st;
    if (p != NULL && p->nexp < MAX_EXPORTS) {
        /* A descriptor any process can import: its size is the allocation's. */
        int sv[2] = {-1, -1};
        unsigned long long size = p->size;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 &&
            write(sv[0], &size, sizeof(size)) == (ssize_t)sizeof(size) &&
            fstat(sv[1], &st) == 0) {
            int fd = sv[1];
            p->exp_fd[p->nexp] = sv[0];
            p->exp_ino[p->nexp++] = (unsigned long long)st.st_ino;
            *(int *)out = fd;
            r = OK;
        } else {
            if (sv[0] >= 0)
                close(sv[0]);
            if (sv[1] >= 0)
                close(sv[1]);
            r = OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type)
{
    NEED_INIT();
    struct stat st;
    int fd = (int)(intptr_t)os;
    if (h == NULL || type != 1 || fstat(fd, &st) != 0)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int found = -1;
    for (int i = 0; i < MAX_PHYS && found < 0; i++)
        for (int k = 0; physs[i].alive && k < physs[i].nexp; k++)
            if (physs[i].exp_ino[k] == (unsigned long long)st.st_ino)
                found = i;
    CUresult r = OUT_OF_MEMORY;
    unsigned long long size = 0; /* what the exporter left in the socket, peeked at */
    if (found < 0 && recv(fd, &size, sizeof(size), MSG_PEEK | MSG_DONTWAIT) != sizeof(size))
        size = (unsigned long long)st.st_size;
    if (found < 0 && (found = new_phys()) >= 0) /* another process's: not this one's memory */
        physs[found] = (phys){.alive = 1, .foreign = 1, .size = size};
    if (found >= 0) {
        *h = next_handle++; /* a handle of its own, to the same memory */
        r = handle_ref(*h, found);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- sparse arrays: tiles mapped from physical memory ---- */

typedef struct {
    int resource_type;
    void *resource;
    int sub_type;
    union {
        unsigned int level[8]; /* level, layer, offsets x y z, extents */
        struct {
            unsigned int layer;
            unsigned long long offset, size;
        } tail;
    } sub;
    int op;          /* 1 map, 2 unmap */
    int handle_type; /* 0 generic */
    CUmemGenericAllocationHandle handle;
    unsigned long long offset;
    unsigned int mask, flags, reserved[2];
} map_info;

typedef struct tile {
    unsigned long long array;
    unsigned long long where[3];
    int p;
} tile;

static tile tiles[1024];
static int ntiles;

/* Drops the tiles of `array` at `where` (NULL: all of them). mu held. */
static void drop_tiles(unsigned long long array, const unsigned long long *where)
{
    for (int i = 0; i < ntiles;) {
        if (tiles[i].array == array &&
            (where == NULL || memcmp(tiles[i].where, where, sizeof(tiles[i].where)) == 0)) {
            int p = tiles[i].p;
            tiles[i] = tiles[--ntiles];
            physs[p].maps--;
            phys_settle(p);
        } else {
            i++;
        }
    }
}

static void tiles_gone(unsigned long long array)
{
    drop_tiles(array, NULL);
}

EXPORT CUresult cuMemMapArrayAsync(map_info *infos, unsigned int count, stream *s);
CUresult cuMemMapArrayAsync(map_info *infos, unsigned int count, stream *s)
{
    NEED_INIT();
    if (infos == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = OK;
    for (unsigned int i = 0; i < count && r == OK; i++) {
        const map_info *m = &infos[i];
        unsigned long long array = (uintptr_t)m->resource, where[3] = {0, 0, 0};
        if (m->sub_type == 0) {
            where[0] = (unsigned long long)m->sub.level[0] << 32 | m->sub.level[1];
            where[1] = (unsigned long long)m->sub.level[2] << 32 | m->sub.level[3];
            where[2] = m->sub.level[4];
        } else {
            where[0] = 1ULL << 63 | m->sub.tail.layer;
            where[1] = m->sub.tail.offset;
        }
        drop_tiles(array, where);
        if (m->op == 1) {
            hmap *h = handle_of(m->handle);
            if (h == NULL || m->handle_type != 0 || ntiles == 1024) {
                r = INVALID_VALUE;
                break;
            }
            tiles[ntiles++] = (tile){.array = array, .where = {where[0], where[1], where[2]},
                                     .p = h->p};
            physs[h->p].maps++;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(mem_prop *prop,
                                                       CUmemGenericAllocationHandle h);
CUresult cuMemGetAllocationPropertiesFromHandle(mem_prop *prop, CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    hmap *m = handle_of(h);
    if (m != NULL && prop != NULL) {
        memset(prop, 0, sizeof(*prop));
        prop->type = 1;
        prop->location.type = 1;
        prop->location.id = physs[m->p].dev;
    }
    pthread_mutex_unlock(&mu);
    return m != NULL && prop != NULL ? OK : INVALID_VALUE;
}
#endif

/* ---- context limits ---- */

static const size_t limit_default[5] = {1024, 1 << 20, 8 << 20, 2, 2048};

/* Device memory a limit of value v takes: the stack for every resident thread (4 SMs x 2048). */
static unsigned long long limit_mem(int limit, size_t v)
{
    switch (limit) {
    case 0:
        return (unsigned long long)v * 4 * 2048;
    case 1:
    case 2:
        return v;
    case 4:
        return (unsigned long long)v * 1024; /* pending launches: 1 KiB each */
    default:
        return 0;
    }
}

EXPORT CUresult cuCtxGetLimit(size_t *v, int limit);
CUresult cuCtxGetLimit(size_t *v, int limit)
{
    NEED_CTX(c);
    CUresult r = INVALID_VALUE;
    if (v != NULL && limit >= 0 && limit < 5) {
        *v = c->limits[limit] ? c->limits[limit] : limit_default[limit];
        r = OK;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxSetLimit(int limit, size_t v);
CUresult cuCtxSetLimit(int limit, size_t v)
{
    NEED_CTX(c);
    CUresult r = INVALID_VALUE;
    if (limit >= 0 && limit < 5) {
        size_t old = c->limits[limit] ? c->limits[limit] : limit_default[limit];
        if (limit == 0 && c->local > old) /* what launches grew it to is resized too */
            old = c->local;
        unsigned long long was = limit_mem(limit, old), now = limit_mem(limit, v),
                           base = limit_mem(limit, limit_default[limit]);
        was = was > base ? was - base : 0;
        now = now > base ? now - base : 0;
        r = OK;
        if (now > was && now - was > devs[c->dev].total - USED(c->dev))
            r = OUT_OF_MEMORY;
        if (r == OK) {
            USED(c->dev) = USED(c->dev) + now - was;
            grew(c->dev);
            c->limit_mem = c->limit_mem + now - was;
            c->limits[limit] = v;
            if (limit == 0)
                c->local = 0;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d);
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
    NEED_INIT();
    if (v == NULL || d < 0 || d >= ndevs)
        return INVALID_VALUE;
    /* multiprocessors, threads per multiprocessor, compute capability (FAKE_SM) */
    *v = attr == 16   ? 4
         : attr == 39 ? 2048
         : attr == 75 ? FAKE_SM / 10
         : attr == 76 ? FAKE_SM % 10
                      : 0;
    return OK;
}

/*
 * ---- modules and libraries ----
 *
 * What loading an image takes, as the driver does it: a cubin its
 * allocated sections (elf_bytes); PTX is compiled first, and this fake's
 * compiler makes half a byte of code per byte of text besides the
 * module's .global and .const variables (ptx_bytes); of a fatbinary the
 * driver loads the cubin built for the device with the highest
 * architecture (same major version as the device's FAKE_SM, minor at most
 * its own), else it compiles a PTX entry; entries nvcc compressed (LZ4
 * blocks, Zstandard frames) are decompressed first. "KGPUFAKEMOD <MiB>"
 * takes that much.
 */

static _Atomic unsigned long long module_loads;
static unsigned long long elf_bytes(const unsigned char *p);

/* 64 KiB pages, as elf_bytes takes them. */
static unsigned long long fake_pages(unsigned long long b)
{
    return b == 0 ? 0 : (b + 0xffff) / 0x10000 * 0x10000;
}

/* PTX text: comments and white space, then .version. */
static int is_ptx(const char *t, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r') {
            i++;
        } else if (i + 1 < n && t[i] == '/' && t[i + 1] == '/') {
            while (i < n && t[i] != '\n')
                i++;
        } else {
            break;
        }
    }
    return n - i >= 8 && memcmp(t + i, ".version", 8) == 0;
}

/*
 * What the module compiled from PTX text t[0, n) takes: each line
 * declaring .global or .const variables ("[.visible] .global [.align N]
 * .b32 name[N][M]", one name) gives its bytes; .extern ones have none.
 */
static unsigned long long ptx_bytes(const char *t, size_t n)
{
    if (!is_ptx(t, n))
        return 0;
    unsigned long long vars = 0;
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(t + at, '\n', n - at);
        size_t len = nl != NULL ? (size_t)(nl - (t + at)) : n - at;
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1),
                 t + at);
        at += len + 1;
        const char *q = line + strspn(line, " \t");
        if (strncmp(q, ".visible ", 9) == 0)
            q += 9;
        int k = 0;
        unsigned long long align = 0, dim, count = 1;
        unsigned bits = 0;
        if (strncmp(q, ".global ", 8) == 0)
            q += 8;
        else if (strncmp(q, ".const ", 7) == 0)
            q += 7;
        else
            continue;
        q += strspn(q, " \t");
        if (sscanf(q, ".align %llu %n", &align, &k) == 1 && k > 0)
            q += k;
        k = 0;
        if (sscanf(q, ".%*[a-z]%u %*[A-Za-z0-9_$]%n", &bits, &k) != 1 || k == 0 || bits < 8)
            continue;
        for (q += k; sscanf(q, "[%llu]%n", &dim, &k) == 1; q += k)
            count *= dim;
        vars += count * (bits / 8);
    }
    return fake_pages(vars + n / 2);
}

#ifdef KGPU_MODIMAGE_DECODE
/* An entry's payload decompressed into a new buffer of `usize` bytes (NULL: damaged). */
static unsigned char *inflate_entry(int zstd, const unsigned char *src, size_t csize, size_t usize)
{
    unsigned char *buf = malloc(usize ? usize : 1);
    if (buf == NULL)
        return NULL;
    if (zstd ? ZSTD_decompress(buf, usize, src, csize) != usize
             : LZ4_decompress_safe((const char *)src, (char *)buf, (int)csize, (int)usize) !=
                   (int)usize) {
        free(buf);
        return NULL;
    }
    return buf;
}
#else
static unsigned char *inflate_entry(int zstd, const unsigned char *src, size_t csize, size_t usize)
{
    return NULL; /* built without the decoders: compressed images do not load */
}
#endif

/* What the entry the driver picks from fatbinary f takes (0: none it can load). */
static unsigned long long fatbin_bytes(const unsigned char *f)
{
    unsigned short hsize;
    unsigned long long fsize;
    memcpy(&hsize, f + 6, 2);
    memcpy(&fsize, f + 8, 8);
    const unsigned char *cubin = NULL, *ptx = NULL, *end = f + hsize + fsize;
    unsigned best = 0;
    for (const unsigned char *e = f + hsize; e < end;) {
        unsigned short kind;
        unsigned int ehsize, arch = 0;
        unsigned long long psize;
        memcpy(&kind, e, 2);
        memcpy(&ehsize, e + 4, 4);
        memcpy(&psize, e + 8, 8);
        if (ehsize >= 32)
            memcpy(&arch, e + 28, 4);
        unsigned a = arch != 0 ? arch : FAKE_SM; /* the shortest headers have none: it fits */
        if (kind == 2 && a / 10 == FAKE_SM / 10 && a <= FAKE_SM && (cubin == NULL || a > best))
            cubin = e, best = a;
        if (kind == 1 && a <= FAKE_SM && ptx == NULL)
            ptx = e;
        e += ehsize + psize;
    }
    const unsigned char *pick = cubin != NULL ? cubin : ptx;
    int pick_kind = cubin != NULL ? 2 : 1;
    if (pick == NULL)
        return 0;
    unsigned int ehsize;
    unsigned long long psize, flags = 0, usize = 0, bytes;
    memcpy(&ehsize, pick + 4, 4);
    memcpy(&psize, pick + 8, 8);
    const unsigned char *data = pick + ehsize;
    unsigned char *buf = NULL;
    if (ehsize >= 64)
        memcpy(&flags, pick + 40, 8);
    if (flags & (0x2000 | 0x8000)) {
        unsigned int csize;
        memcpy(&csize, pick + 16, 4);
        memcpy(&usize, pick + 56, 8);
        if ((buf = inflate_entry((flags & 0x8000) != 0, data, csize, usize)) == NULL)
            return 0;
        data = buf, psize = usize;
    }
    bytes = pick_kind == 2 ? elf_bytes(data)
                           : ptx_bytes((const char *)data, strnlen((const char *)data, psize));
    free(buf);
    return bytes;
}

static CUresult load_image(const char *image, void **out, int kind)
{
    unsigned long long mib, key, bytes = 0;
    atomic_fetch_add(&module_loads, 1);
    unsigned int magic = 0;
    if (image != NULL)
        memcpy(&magic, image, 4);
    if (image != NULL && memcmp(image, "\x7f" "ELF", 4) == 0)
        bytes = elf_bytes((const unsigned char *)image);
    else if (magic == 0xBA55ED50u)
        bytes = fatbin_bytes((const unsigned char *)image);
    else if (image != NULL && is_ptx(image, strlen(image)))
        bytes = ptx_bytes(image, strlen(image));
    else if (image != NULL && sscanf(image, "KGPUFAKEMOD %llu", &mib) == 1)
        bytes = mib ? mib * MIB : 1;
    if (bytes == 0 || out == NULL)
        return 200; /* CUDA_ERROR_INVALID_IMAGE */
    NEED_CTX(c);
    CUresult r = take(c->dev, bytes, kind == K_MODULE ? c : NULL, kind, &key);
    pthread_mutex_unlock(&mu);
    if (r == OK)
        *out = (void *)(uintptr_t)key;
    return r;
}

static CUresult load_file(const char *path, void **out, int kind)
{
    static char buf[1 << 20]; /* the images the tests write are smaller */
    static pthread_mutex_t file_mu = PTHREAD_MUTEX_INITIALIZER;
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    if (f == NULL)
        return 301; /* CUDA_ERROR_FILE_NOT_FOUND */
    pthread_mutex_lock(&file_mu);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    CUresult r = load_image(buf, out, kind);
    pthread_mutex_unlock(&file_mu);
    return r;
}

EXPORT CUresult cuModuleLoad(void **m, const char *path);
CUresult cuModuleLoad(void **m, const char *path)
{
    return load_file(path, m, K_MODULE);
}

EXPORT CUresult cuModuleLoadData(void **m, const void *image);
CUresult cuModuleLoadData(void **m, const void *image)
{
    return load_image(image, m, K_MODULE);
}

EXPORT CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned int n, int *o, void **v);
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned int n, int *o, void **v)
{
    return load_image(image, m, K_MODULE);
}

EXPORT CUresult cuModuleLoadFatBinary(void **m, const void *image);
CUresult cuModuleLoadFatBinary(void **m, const void *image)
{
    return load_image(image, m, K_MODULE);
}

EXPORT CUresult cuModuleUnload(void *m);
CUresult cuModuleUnload(void *m)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = give((uintptr_t)m, K_MODULE);
    pthread_mutex_unlock(&mu);
    return r;
}

#ifndef FAKE_CUDA_OLD
EXPORT CUresult cuLibraryLoadData(void **l, const void *code, int *jo, void **jv, unsigned int nj,
                                  int *lo, void **lv, unsigned int nl);
CUresult cuLibraryLoadData(void **l, const void *code, int *jo, void **jv, unsigned int nj, int *lo,
                           void **lv, unsigned int nl)
{
    return load_image(code, l, K_LIBRARY);
}

EXPORT CUresult cuLibraryLoadFromFile(void **l, const char *path, int *jo, void **jv,
                                      unsigned int nj, int *lo, void **lv, unsigned int nl);
CUresult cuLibraryLoadFromFile(void **l, const char *path, int *jo, void **jv, unsigned int nj,
                               int *lo, void **lv, unsigned int nl)
{
    return load_file(path, l, K_LIBRARY);
}

#ifndef FAKE_CUDA_NO_LIBRARY_UNLOAD
EXPORT CUresult cuLibraryUnload(void *l);
CUresult cuLibraryUnload(void *l)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = give((uintptr_t)l, K_LIBRARY);
    pthread_mutex_unlock(&mu);
    return r;
}
#endif
#endif

typedef struct {
    size_t w, h;
    int format;
    unsigned channels;
} desc2d;

typedef struct {
    size_t w, h, d;
    int format;
    unsigned channels, flags;
} desc3d;

static unsigned long long array_size(size_t w, size_t h, size_t d, int format, unsigned ch,
                                     unsigned levels)
{
    unsigned per = format == 0x01 || format == 0x08                     ? 1
                   : format == 0x02 || format == 0x09 || format == 0x10 ? 2
                                                                        : 4;
    unsigned long long total = 0;
    w = w ? w : 1, h = h ? h : 1, d = d ? d : 1;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += (unsigned long long)w * h * d * ch * per;
        w = w > 1 ? w / 2 : 1, h = h > 1 ? h / 2 : 1, d = d > 1 ? d / 2 : 1;
    }
    return total;
}

/* An array of `size` bytes; a sparse one (size 0) has none of its own: tiles are mapped in. */
static CUresult make_array(unsigned long long *out, unsigned long long size, int kind)
{
    NEED_CTX(c);
    CUresult r = INVALID_VALUE;
    if (out != NULL && size == 0) {
        *out = next_handle++;
        alloc a = {.key = *out, .c = c, .dev = c->dev, .kind = kind};
        insert(&a);
        r = OK;
    } else if (out != NULL) {
        r = take(c->dev, size, c, kind, out);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

#define ARRAY3D_SPARSE 0x40

#ifndef FAKE_CUDA_OLD
static void tiles_gone(unsigned long long array);
#else
static void tiles_gone(unsigned long long array)
{
    (void)array;
}
#endif

EXPORT CUresult cuArrayCreate_v2(void **ph, const desc2d *dsc);
CUresult cuArrayCreate_v2(void **ph, const desc2d *dsc)
{
    unsigned long long key;
    if (ph == NULL || dsc == NULL || dsc->channels == 0 || dsc->channels > 4 || dsc->w == 0)
        return INVALID_VALUE;
    CUresult r =
        make_array(&key, array_size(dsc->w, dsc->h, 1, dsc->format, dsc->channels, 1), K_ARRAY);
    if (r == OK)
        *ph = (void *)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuArray3DCreate_v2(void **ph, const desc3d *dsc);
CUresult cuArray3DCreate_v2(void **ph, const desc3d *dsc)
{
    unsigned long long key;
    if (ph == NULL || dsc == NULL || dsc->channels == 0 || dsc->channels > 4 || dsc->w == 0)
        return INVALID_VALUE;
    CUresult r = make_array(&key,
                            dsc->flags & ARRAY3D_SPARSE
                                ? 0
                                : array_size(dsc->w, dsc->h, dsc->d, dsc->format, dsc->channels, 1),
                            K_ARRAY);
    if (r == OK)
        *ph = (void *)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuArrayDestroy(void *h);
CUresult cuArrayDestroy(void *h)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = give((uintptr_t)h, K_ARRAY);
    if (r == OK)
        tiles_gone((uintptr_t)h);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMipmappedArrayCreate(void **ph, const desc3d *dsc, unsigned int levels);
CUresult cuMipmappedArrayCreate(void **ph, const desc3d *dsc, unsigned int levels)
{
    unsigned long long key;
    if (ph == NULL || dsc == NULL || dsc->channels == 0 || dsc->channels > 4 || dsc->w == 0 ||
        levels == 0)
        return INVALID_VALUE;
    CUresult r = make_array(&key,
                            dsc->flags & ARRAY3D_SPARSE ? 0
                                                        : array_size(dsc->w, dsc->h, dsc->d,
                                                                     dsc->format, dsc->channels,
                                                                     levels),
                            K_MIPMAP);
    if (r == OK)
        *ph = (void *)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuMipmappedArrayDestroy(void *h);
CUresult cuMipmappedArrayDestroy(void *h)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = give((uintptr_t)h, K_MIPMAP);
    if (r == OK)
        tiles_gone((uintptr_t)h);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- launches: counted, the grid's x recorded, nothing run ---- */

static _Atomic unsigned long long launches;
static _Atomic unsigned int last_grid_x;

static CUresult launched(unsigned int grid_x)
{
    NEED_INIT();
    run_kernel(grid_x);
    atomic_store_explicit(&last_grid_x, grid_x, memory_order_relaxed);
    atomic_fetch_add_explicit(&launches, 1, memory_order_relaxed);
    return OK;
}

static CUresult launched_fn(void *f, unsigned int grid_x);

/* A launch into stream s: recorded where s captures (drivers before CUDA 10 capture nothing). */
#ifndef FAKE_CUDA_OLD
#define launch_into(s, f, gx) (capturing(s) != NULL ? captured((s), (gx)) : launched_fn((f), (gx)))
#else
#define launch_into(s, f, gx) launched_fn((f), (gx))
#endif

/* Not a driver function: how many launches reached the driver, and the last one's grid x. */
EXPORT CUresult fakeCudaLaunches(unsigned long long *n, unsigned int *grid_x);
CUresult fakeCudaLaunches(unsigned long long *n, unsigned int *grid_x)
{
    *n = atomic_load(&launches);
    *grid_x = atomic_load(&last_grid_x);
    return OK;
}

EXPORT CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                               stream *s, void **params, void **extra);
CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shm, stream *s,
                        void **params, void **extra)
{
    return launch_into(s, f, gx);
}

EXPORT CUresult cuLaunchCooperativeKernel(void *f, unsigned int gx, unsigned int gy,
                                          unsigned int gz, unsigned int bx, unsigned int by,
                                          unsigned int bz, unsigned int shm, stream *s,
                                          void **params);
CUresult cuLaunchCooperativeKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shm, stream *s, void **params)
{
    return launch_into(s, f, gx);
}

#ifndef FAKE_CUDA_OLD
/* CUlaunchConfig: the grid's dimensions, the block's, shared memory, then the stream. */
typedef struct {
    unsigned int grid[3], block[3], shm;
    stream *s;
    void *attrs;
    unsigned int nattrs;
} launch_config;

EXPORT CUresult cuLaunchKernelEx(const launch_config *config, void *f, void **params, void **extra);
CUresult cuLaunchKernelEx(const launch_config *config, void *f, void **params, void **extra)
{
    if (config == NULL)
        return INVALID_VALUE;
    return launch_into(config->s, f, config->grid[0]);
}
#endif

/* ---- functions, their local memory, and the launches from before CUDA 4.0 ---- */

/*
 * cuModuleGetFunction hands out a function of any name; one named
 * "kgpufake_local_<bytes>" needs that much local memory per thread
 * (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES). Launching it in a context whose
 * stack (the per-thread local memory reservation) is smaller grows the
 * reservation to it for every resident thread, from the device's memory,
 * as the driver does; kept until the context goes or cuCtxSetLimit of the
 * stack resizes it. The pre-4.0 launches use the block shape and
 * parameters set beforehand; a launch's duration on the timeline is its
 * grid x in microseconds as everywhere here (cuLaunch: a 1 x 1 grid).
 */
#define MAX_FUNCS 256

typedef struct func {
    void *module;
    size_t local;
    int bx, by, bz; /* cuFuncSetBlockShape; 0: not set */
    unsigned int param_bytes;
} func;

static func funcs[MAX_FUNCS];
static int nfuncs;

static func *as_func(void *f)
{
    func *fn = f;
    return fn >= funcs && fn < funcs + MAX_FUNCS ? fn : NULL;
}

EXPORT CUresult cuModuleGetFunction(void **pf, void *module, const char *name);
CUresult cuModuleGetFunction(void **pf, void *module, const char *name)
{
    unsigned long long local = 0;
    NEED_CTX(c);
    (void)c;
    CUresult r = OK;
    if (pf == NULL || name == NULL || find((uintptr_t)module, K_MODULE) == NULL)
        r = INVALID_HANDLE;
    else if (nfuncs == MAX_FUNCS)
        r = OUT_OF_MEMORY;
    if (r == OK) {
        sscanf(name, "kgpufake_local_%llu", &local);
        funcs[nfuncs] = (func){.module = module, .local = (size_t)local};
        *pf = &funcs[nfuncs++];
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuFuncGetAttribute(int *v, int attr, void *f);
CUresult cuFuncGetAttribute(int *v, int attr, void *f)
{
    NEED_INIT();
    func *fn = as_func(f);
    if (fn == NULL || v == NULL)
        return INVALID_HANDLE;
    *v = attr == 3 ? (int)fn->local : 0; /* CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES */
    return OK;
}

/* A launch of f in the current context: its local memory first (grown, or OUT_OF_MEMORY). */
static CUresult launched_fn(void *f, unsigned int grid_x)
{
    func *fn = as_func(f);
    if (fn != NULL && fn->local != 0) {
        NEED_CTX(c);
        size_t have = c->limits[0] ? c->limits[0] : limit_default[0];
        if (c->local > have)
            have = c->local;
        CUresult r = OK;
        if (fn->local > have) {
            unsigned long long more = limit_mem(0, fn->local) - limit_mem(0, have);
            if (more > devs[c->dev].total - USED(c->dev)) {
                r = OUT_OF_MEMORY;
            } else {
                USED(c->dev) += more;
                grew(c->dev);
                c->limit_mem += more;
                c->local = fn->local;
            }
        }
        pthread_mutex_unlock(&mu);
        if (r != OK)
            return r;
    }
    return launched(grid_x);
}

EXPORT CUresult cuFuncSetBlockShape(void *f, int x, int y, int z);
CUresult cuFuncSetBlockShape(void *f, int x, int y, int z)
{
    NEED_INIT();
    func *fn = as_func(f);
    if (fn == NULL)
        return INVALID_HANDLE;
    if (x <= 0 || y <= 0 || z <= 0)
        return INVALID_VALUE;
    fn->bx = x;
    fn->by = y;
    fn->bz = z;
    return OK;
}

EXPORT CUresult cuParamSetSize(void *f, unsigned int bytes);
CUresult cuParamSetSize(void *f, unsigned int bytes)
{
    NEED_INIT();
    func *fn = as_func(f);
    if (fn == NULL)
        return INVALID_HANDLE;
    fn->param_bytes = bytes;
    return OK;
}

EXPORT CUresult cuParamSeti(void *f, int offset, unsigned int value);
CUresult cuParamSeti(void *f, int offset, unsigned int value)
{
    NEED_INIT();
    func *fn = as_func(f);
    if (fn == NULL)
        return INVALID_HANDLE;
    return offset >= 0 && (unsigned)offset + sizeof(value) <= fn->param_bytes ? OK : INVALID_VALUE;
}

EXPORT CUresult cuParamSetv(void *f, int offset, void *ptr, unsigned int bytes);
CUresult cuParamSetv(void *f, int offset, void *ptr, unsigned int bytes)
{
    NEED_INIT();
    func *fn = as_func(f);
    if (fn == NULL)
        return INVALID_HANDLE;
    return ptr != NULL && offset >= 0 && (unsigned)offset + bytes <= fn->param_bytes
               ? OK
               : INVALID_VALUE;
}

/* The pre-4.0 launches need the block shape set first (a NULL function: as the others here). */
static CUresult grid_launch(void *f, int w, int h)
{
    func *fn = as_func(f);
    if (f != NULL && fn == NULL)
        return INVALID_HANDLE;
    if ((fn != NULL && fn->bx == 0) || w <= 0 || h <= 0)
        return INVALID_VALUE;
    return launched_fn(f, (unsigned int)w);
}

EXPORT CUresult cuLaunch(void *f);
CUresult cuLaunch(void *f)
{
    NEED_INIT();
    return grid_launch(f, 1, 1);
}

EXPORT CUresult cuLaunchGrid(void *f, int w, int h);
CUresult cuLaunchGrid(void *f, int w, int h)
{
    NEED_INIT();
    return grid_launch(f, w, h);
}

EXPORT CUresult cuLaunchGridAsync(void *f, int w, int h, stream *s);
CUresult cuLaunchGridAsync(void *f, int w, int h, stream *s)
{
    NEED_INIT();
    return grid_launch(f, w, h);
}

/* CUDA_LAUNCH_PARAMS */
typedef struct {
    void *function;
    unsigned int gx, gy, gz, bx, by, bz, shm;
    stream *s;
    void **params;
} launch_params;

/* Each device's part in its stream's context. */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(launch_params *list, unsigned int n,
                                                     unsigned int flags);
CUresult cuLaunchCooperativeKernelMultiDevice(launch_params *list, unsigned int n,
                                              unsigned int flags)
{
    NEED_INIT();
    if (list == NULL || n == 0 || n > (unsigned)ndevs)
        return INVALID_VALUE;
    for (unsigned int i = 0; i < n; i++)
        if ((uintptr_t)list[i].s <= 2 || !valid_ctx(list[i].s->c))
            return INVALID_VALUE; /* each part needs a stream of its own device's context */
    for (unsigned int i = 0; i < n; i++) {
        ctx *popped;
        cuCtxPushCurrent_v2(list[i].s->c);
        CUresult r = launched_fn(list[i].function, list[i].gx);
        cuCtxPopCurrent_v2(&popped);
        if (r != OK)
            return r;
    }
    return OK;
}

/*
 * What a CUDA ELF (cubin) image takes when loaded: its SHF_ALLOC sections
 * (code, constants, NOBITS globals) at their alignment, in 64 KiB pages;
 * 0 for an image that is not one.
 */
static unsigned long long elf_bytes(const unsigned char *p)
{
    unsigned long long shoff, total = 0;
    unsigned short shnum, shentsize, machine;
    memcpy(&machine, p + 18, 2);
    memcpy(&shoff, p + 40, 8);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    if (p[4] != 2 || machine != 190 || shentsize != 64 || shoff > (1ULL << 30))
        return 0;
    for (unsigned i = 0; i < shnum; i++) {
        unsigned long long flags, size, align;
        const unsigned char *sh = p + shoff + (unsigned long long)i * 64;
        memcpy(&flags, sh + 8, 8);
        memcpy(&size, sh + 32, 8);
        memcpy(&align, sh + 48, 8);
        if (!(flags & 2) || size > (1ULL << 30))
            continue;
        if (align > 1 && align <= 4096)
            total = (total + align - 1) / align * align;
        total += size;
    }
    return total == 0 ? 0 : (total + 0xffff) / 0x10000 * 0x10000;
}

/* Not a driver function: how many module and library loads reached the driver. */
EXPORT CUresult fakeCudaModuleLoads(unsigned long long *n);
CUresult fakeCudaModuleLoads(unsigned long long *n)
{
    *n = atomic_load(&module_loads);
    return OK;
}

/* ---- the entry points from before CUDA 3.2: 32-bit sizes and addresses ---- */

typedef struct {
    unsigned int w, h;
    int format;
    unsigned int channels;
} desc2d_v1;

typedef struct {
    unsigned int w, h, d;
    int format;
    unsigned int channels, flags;
} desc3d_v1;

EXPORT CUresult cuMemAlloc(unsigned int *p, unsigned int size);
CUresult cuMemAlloc(unsigned int *p, unsigned int size)
{
    unsigned long long key = 0;
    NEED_CTX(c);
    CUresult r = p == NULL ? INVALID_VALUE : take(c->dev, size, c, K_MEM32, &key);
    pthread_mutex_unlock(&mu);
    if (r == OK)
        *p = (unsigned int)key;
    return r;
}

EXPORT CUresult cuMemAllocPitch(unsigned int *p, unsigned int *pitch, unsigned int width,
                                unsigned int height, unsigned int elem);
CUresult cuMemAllocPitch(unsigned int *p, unsigned int *pitch, unsigned int width,
                         unsigned int height, unsigned int elem)
{
    unsigned long long key = 0;
    NEED_CTX(c);
    CUresult r = INVALID_VALUE;
    if (p != NULL && pitch != NULL && width > 0 && height > 0) {
        unsigned int pt = (width + 511) / 512 * 512;
        r = take(c->dev, (unsigned long long)pt * height, c, K_MEM32, &key);
        if (r == OK) {
            *pitch = pt;
            *p = (unsigned int)key;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemFree(unsigned int p);
CUresult cuMemFree(unsigned int p)
{
    return cuMemFree_v2(p);
}

#ifndef FAKE_CUDA_NO_MEMGETINFO
EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total);
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == OK && free_bytes != NULL && total != NULL) {
        *free_bytes = f > 0xffffffffu ? 0xffffffffu : (unsigned int)f;
        *total = t > 0xffffffffu ? 0xffffffffu : (unsigned int)t;
    }
    return r;
}
#endif

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d)
{
    size_t b = 0;
    CUresult r = cuDeviceTotalMem_v2(&b, d);
    if (r == OK && bytes != NULL)
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
    return r;
}

EXPORT CUresult cuCtxCreate(ctx **pctx, unsigned int flags, CUdevice d);
CUresult cuCtxCreate(ctx **pctx, unsigned int flags, CUdevice d)
{
    return cuCtxCreate_v2(pctx, flags, d);
}

EXPORT CUresult cuCtxDestroy(ctx *c);
CUresult cuCtxDestroy(ctx *c)
{
    return cuCtxDestroy_v2(c);
}

EXPORT CUresult cuArrayCreate(void **ph, const desc2d_v1 *dsc);
CUresult cuArrayCreate(void **ph, const desc2d_v1 *dsc)
{
    if (dsc == NULL)
        return INVALID_VALUE;
    desc2d d = {.w = dsc->w, .h = dsc->h, .format = dsc->format, .channels = dsc->channels};
    return cuArrayCreate_v2(ph, &d);
}

EXPORT CUresult cuArray3DCreate(void **ph, const desc3d_v1 *dsc);
CUresult cuArray3DCreate(void **ph, const desc3d_v1 *dsc)
{
    if (dsc == NULL)
        return INVALID_VALUE;
    desc3d d = {.w = dsc->w,
                .h = dsc->h,
                .d = dsc->d,
                .format = dsc->format,
                .channels = dsc->channels,
                .flags = dsc->flags};
    return cuArray3DCreate_v2(ph, &d);
}

/* ---- issue 25: IPC handles of device memory ---- */

/*
 * A handle names the exporting process's allocation (device, address,
 * size). As the driver documents, it can be opened only in another
 * process, and the memory then lives until that process closes it
 * (cuIpcCloseMemHandle) or its context goes, whatever the exporter does
 * meanwhile, freeing it or exiting. The fake counts an opened allocation
 * in the opener's memory from the open: while the exporter still holds it
 * too, the one physical allocation shows twice.
 */
typedef struct ipc_handle {
    unsigned magic;
    int pid, dev, pad;
    unsigned long long ptr, size;
    char reserved[32];
} ipc_handle;
_Static_assert(sizeof(ipc_handle) == 64, "CUipcMemHandle is 64 bytes");
#define IPC_MAGIC 0x4b495043u

EXPORT CUresult cuIpcGetMemHandle(ipc_handle *h, CUdeviceptr p);
CUresult cuIpcGetMemHandle(ipc_handle *h, CUdeviceptr p)
{
    NEED_INIT();
    if (h == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    alloc *a = find(p, K_MEM);
    if (a != NULL)
        *h = (ipc_handle){.magic = IPC_MAGIC, .pid = (int)getpid(), .dev = a->dev, .ptr = p,
                          .size = a->size};
    pthread_mutex_unlock(&mu);
    return a != NULL ? OK : INVALID_VALUE;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, ipc_handle h, unsigned int flags);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, ipc_handle h, unsigned int flags)
{
    NEED_CTX(c);
    CUresult r = INVALID_VALUE;
    if (p != NULL && h.magic == IPC_MAGIC && h.dev == c->dev && h.size != 0)
        r = h.pid == (int)getpid() ? INVALID_CONTEXT : take(c->dev, h.size, c, K_IPC, p);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, ipc_handle h, unsigned int flags);
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, ipc_handle h, unsigned int flags)
{
    return cuIpcOpenMemHandle_v2(p, h, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p);
CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = give(p, K_IPC);
    pthread_mutex_unlock(&mu);
    return r == OK ? OK : INVALID_VALUE;
}

/* The allocation (device memory or an opened IPC handle) that contains p. */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = NOT_FOUND;
    for (size_t i = 0; i < table_cap && r != OK; i++) {
        const alloc *a = &table[i];
        if ((a->kind == K_MEM || a->kind == K_IPC) && p >= a->key && p - a->key < a->size) {
            if (base != NULL)
                *base = a->key;
            if (size != NULL)
                *size = (size_t)a->size;
            r = OK;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

#ifndef FAKE_CUDA_OLD
/* ---- issue 25: multicast objects ---- */

/*
 * As the driver documents them (CUDA 12.1): cuMulticastCreate makes an
 * object of prop->size, a generic allocation handle released with
 * cuMemRelease and mappable with cuMemMap; cuMulticastAddDevice adds a
 * device; cuMulticastBindMem/BindAddr bind physical memory of a device at
 * an offset, and the bound memory stays allocated while it is bound, even
 * after every handle and mapping of it is gone, until cuMulticastUnbind of
 * its device and range or the object's destruction.
 */
typedef struct {
    unsigned int devices;
    size_t size;
    unsigned long long handle_types, flags;
} mc_prop;

typedef struct mbind {
    int mc, p, dev;
    unsigned long long off, size;
} mbind;

static mbind mbinds[256];
static int nmbinds;

/* Drops binding k; the memory it kept may go. mu held. */
static void mbind_drop(int k)
{
    int p = mbinds[k].p;
    mbinds[k] = mbinds[--nmbinds];
    physs[p].maps--;
    phys_settle(p);
}

static void mcast_gone(int mc)
{
    for (int k = 0; k < nmbinds;)
        if (mbinds[k].mc == mc)
            mbind_drop(k);
        else
            k++;
}

/* The multicast object behind handle h, or NULL. mu held. */
static hmap *mcast_of(unsigned long long h)
{
    hmap *m = handle_of(h);
    return m != NULL && physs[m->p].mcast ? m : NULL;
}

EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *h, const mc_prop *prop);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *h, const mc_prop *prop)
{
    NEED_INIT();
    if (h == NULL || prop == NULL || prop->size == 0 || prop->devices == 0)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int i = new_phys();
    CUresult r = OUT_OF_MEMORY;
    if (i >= 0) {
        physs[i] = (phys){.alive = 1, .dev = -1, .foreign = 1, .mcast = 1, .size = prop->size};
        *h = next_handle++;
        r = handle_ref(*h, i);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice d);
CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice d)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = mcast_of(mc) == NULL ? INVALID_HANDLE : d < 0 || d >= ndevs ? INVALID_DEVICE : OK;
    pthread_mutex_unlock(&mu);
    return r;
}

/* Binds physical memory p at [off, off+size) of multicast handle mc. mu held. */
static CUresult mcast_bind(unsigned long long mc, unsigned long long off, int p,
                           unsigned long long size)
{
    hmap *m = mcast_of(mc);
    if (m == NULL || p < 0 || physs[p].mcast || size == 0 || off + size > physs[m->p].size ||
        nmbinds == 256)
        return INVALID_VALUE;
    mbinds[nmbinds++] = (mbind){.mc = m->p, .p = p, .dev = physs[p].dev, .off = off, .size = size};
    physs[p].maps++;
    return OK;
}

EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_off,
                                   CUmemGenericAllocationHandle mem, size_t mem_off, size_t size,
                                   unsigned long long flags);
CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_off,
                            CUmemGenericAllocationHandle mem, size_t mem_off, size_t size,
                            unsigned long long flags)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    hmap *h = handle_of(mem);
    CUresult r = h != NULL && mem_off + size <= physs[h->p].size
                     ? mcast_bind(mc, mc_off, h->p, size)
                     : INVALID_VALUE;
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_off,
                                    CUdeviceptr ptr, size_t size, unsigned long long flags);
CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_off, CUdeviceptr ptr,
                             size_t size, unsigned long long flags)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    int p = -1;
    for (int i = 0; i < nvmaps && p < 0; i++)
        if (ptr >= vmaps[i].va && ptr + size <= vmaps[i].va + vmaps[i].size)
            p = vmaps[i].p;
    CUresult r = mcast_bind(mc, mc_off, p, size);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice d, size_t off,
                                  size_t size);
CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice d, size_t off, size_t size)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    hmap *m = mcast_of(mc);
    int n = 0;
    for (int k = 0; m != NULL && k < nmbinds;) {
        if (mbinds[k].mc == m->p && mbinds[k].dev == d && mbinds[k].off >= off &&
            mbinds[k].off < off + size) {
            mbind_drop(k);
            n++;
        } else {
            k++;
        }
    }
    pthread_mutex_unlock(&mu);
    return m == NULL ? INVALID_HANDLE : n > 0 ? OK : INVALID_VALUE;
}
#endif

#ifndef FAKE_CUDA_OLD
/* What FAKE_CUDA_PROC_INTERNAL hands out: same behaviour, addresses no export has. */
static CUresult internal_alloc(CUdeviceptr *p, size_t size)
{
    return cuMemAlloc_v2(p, size);
}

static CUresult internal_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

static CUresult internal_instantiate(gexec **pe, graph *g, unsigned long long flags)
{
    return cuGraphInstantiateWithFlags(pe, g, flags);
}

typedef struct proc {
    const char *base;
    int since;
    int ptsz;
    void *fn;
} proc;

#define P(base, since, fn)                                                                         \
    {                                                                                              \
        base, since, 0, (void *)fn                                                                 \
    }
#define PZ(base, since, fn)                                                                        \
    {                                                                                              \
        base, since, 1, (void *)fn                                                                 \
    }

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status);

static const proc procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamGetCtx", 9020, cuStreamGetCtx),
    PZ("cuStreamGetCtx", 9020, cuStreamGetCtx),
#ifndef FAKE_CUDA_NO_MEMGETINFO
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
#endif
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PZ("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PZ("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PZ("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuArrayCreate", 3020, cuArrayCreate_v2),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    P("cuMemAlloc", 2000, cuMemAlloc),
    P("cuMemAllocPitch", 2000, cuMemAllocPitch),
    P("cuMemFree", 2000, cuMemFree),
#ifndef FAKE_CUDA_NO_MEMGETINFO
    P("cuMemGetInfo", 2000, cuMemGetInfo),
#endif
    P("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    P("cuCtxCreate", 2000, cuCtxCreate),
    P("cuCtxDestroy", 2000, cuCtxDestroy),
    P("cuArrayCreate", 2000, cuArrayCreate),
    P("cuArray3DCreate", 2000, cuArray3DCreate),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    P("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemMapArrayAsync", 11010, cuMemMapArrayAsync),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    P("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    P("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    P("cuGraphGetNodes", 10000, cuGraphGetNodes),
    P("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    P("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphUpload", 11010, cuGraphUpload),
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    P("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    P("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    P("cuCtxGetLimit", 3010, cuCtxGetLimit),
    P("cuCtxSetLimit", 3010, cuCtxSetLimit),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuModuleLoad", 2000, cuModuleLoad),
    P("cuModuleLoadData", 2000, cuModuleLoadData),
    P("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
    P("cuModuleLoadFatBinary", 2000, cuModuleLoadFatBinary),
    P("cuModuleUnload", 2000, cuModuleUnload),
    P("cuLibraryLoadData", 12000, cuLibraryLoadData),
    P("cuLibraryLoadFromFile", 12000, cuLibraryLoadFromFile),
#ifndef FAKE_CUDA_NO_LIBRARY_UNLOAD
    P("cuLibraryUnload", 12000, cuLibraryUnload),
#endif
    P("cuLaunchKernel", 4000, cuLaunchKernel),
    PZ("cuLaunchKernel", 4000, cuLaunchKernel),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    PZ("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    PZ("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    P("cuLaunchCooperativeKernelMultiDevice", 9000, cuLaunchCooperativeKernelMultiDevice),
    P("cuLaunch", 2000, cuLaunch),
    P("cuLaunchGrid", 2000, cuLaunchGrid),
    P("cuLaunchGridAsync", 2000, cuLaunchGridAsync),
    P("cuModuleGetFunction", 2000, cuModuleGetFunction),
    P("cuFuncGetAttribute", 2020, cuFuncGetAttribute),
    P("cuFuncSetBlockShape", 2000, cuFuncSetBlockShape),
    P("cuParamSetSize", 2000, cuParamSetSize),
    P("cuParamSetv", 2000, cuParamSetv),
    P("cuParamSeti", 2000, cuParamSeti),
    /* issue 25 */
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    P("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle),
    P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuMulticastCreate", 12010, cuMulticastCreate),
    P("cuMulticastAddDevice", 12010, cuMulticastAddDevice),
    P("cuMulticastBindMem", 12010, cuMulticastBindMem),
    P("cuMulticastBindAddr", 12010, cuMulticastBindAddr),
    P("cuMulticastUnbind", 12010, cuMulticastUnbind),
    P("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    PZ("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
};

/* 0 found, 1 no such symbol, 2 the version asked for is too old (CUdriverProcAddressQueryResult).
 */
static int lookup(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    const proc *best = NULL;
    int known = 0, ptsz = (flags & 2) != 0;
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        const proc *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        known = 1;
        if (p->since > version || (p->ptsz && !ptsz))
            continue;
        if (best == NULL || p->since > best->since || (p->since == best->since && p->ptsz))
            best = p;
    }
    *pfn = best != NULL ? best->fn : NULL;
    if (best != NULL && getenv("FAKE_CUDA_PROC_INTERNAL") != NULL) {
        if (best->fn == (void *)cuMemAlloc_v2)
            *pfn = (void *)internal_alloc;
        if (best->fn == (void *)cuMemFree_v2)
            *pfn = (void *)internal_free;
        if (best->fn == (void *)cuGraphInstantiateWithFlags)
            *pfn = (void *)internal_instantiate;
    }
    return best != NULL ? 0 : known ? 2 : 1;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    if (symbol == NULL || pfn == NULL)
        return INVALID_VALUE;
    return lookup(symbol, pfn, version, flags) == 0 ? OK : NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status)
{
    if (symbol == NULL || pfn == NULL)
        return INVALID_VALUE;
    int s = lookup(symbol, pfn, version, flags);
    if (status != NULL)
        *status = s;
    return s == 0 ? OK : NOT_FOUND;
}
#endif
