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
 *   FAKE_CUDA_PROC_INTERNAL  1: cuGetProcAddress hands out internal
 *                       addresses for cuMemAlloc/cuMemFree, not the exports
 * Variants: -DFAKE_CUDA_OLD leaves out what drivers before CUDA 11 lack
 * (stream-ordered and virtual memory, cuGetProcAddress, _v2 UUIDs);
 * -DFAKE_CUDA_NO_MEMGETINFO leaves out a function the shim requires.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
} ctx;

typedef struct stream {
    ctx *c;
} stream;

typedef struct pool {
    int dev;
} pool;

typedef struct dev {
    unsigned long long total, used;
    char uuid[64];
    ctx primary;
    pool default_pool;
    unsigned long long next_addr;
} dev;

enum kind { K_MEM = 1, K_HANDLE, K_ARRAY, K_MIPMAP };

typedef struct alloc {
    unsigned long long key;
    unsigned long long size;
    ctx *c; /* NULL: not tied to a context */
    int dev;
    int kind; /* 0: empty cell */
} alloc;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialised, ndevs, no_uuid;
static unsigned long long ctx_bytes;
static dev devs[MAX_DEVS];
static ctx ctxs[MAX_CTXS];
static alloc *table;
static size_t table_cap;
static unsigned long long next_handle = 0x1000;
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
    devs[a->dev].used -= a->size;
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
    if (size > devs[d].total - devs[d].used)
        return OUT_OF_MEMORY;
    if (kind == K_MEM) {
        *key = devs[d].next_addr;
        devs[d].next_addr += (size + 511) / 512 * 512;
    } else {
        *key = next_handle++;
    }
    devs[d].used += size;
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
        unsigned long long mib = env_num("FAKE_CUDA_MEM_MIB", 16384);
        const char *uuids = getenv("FAKE_CUDA_UUIDS");
        for (int d = 0; d < ndevs; d++) {
            devs[d].total = mib * MIB;
            devs[d].next_addr = (unsigned long long)(d + 1) << 40;
            devs[d].primary.dev = d;
            devs[d].primary.is_primary = 1;
            devs[d].default_pool.dev = d;
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
EXPORT CUresult fakeCudaPoolUsed(int d, unsigned long long *used);
CUresult fakeCudaPoolUsed(int d, unsigned long long *used)
{
    NEED_INIT();
    if (d < 0 || d >= ndevs || used == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *used = devs[d].used;
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
        if (ctx_bytes > devs[d].total - devs[d].used)
            break;
        devs[d].used += ctx_bytes;
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
    devs[c->dev].used -= ctx_bytes;
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
        if (ctx_bytes > devs[d].total - devs[d].used) {
            pthread_mutex_unlock(&mu);
            return OUT_OF_MEMORY;
        }
        devs[d].used += ctx_bytes;
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
            devs[d].used -= ctx_bytes;
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
    *ps = malloc(sizeof(stream));
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
    *free_bytes = (size_t)(devs[c->dev].total - devs[c->dev].used);
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

#ifndef FAKE_CUDA_OLD
static CUresult alloc_async(CUdeviceptr *p, size_t size, stream *s)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    ctx *c = stream_ctx(s);
    CUresult r = !valid_ctx(c) ? INVALID_CONTEXT
                 : p == NULL   ? INVALID_VALUE
                               : take(c->dev, size, c, K_MEM, p);
    pthread_mutex_unlock(&mu);
    return r;
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

static CUresult alloc_from_pool(CUdeviceptr *p, size_t size, pool *pl, stream *s)
{
    NEED_INIT();
    if (pl == NULL || p == NULL)
        return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    ctx *c = stream_ctx(s);
    CUresult r = !valid_ctx(c) ? INVALID_CONTEXT : take(pl->dev, size, c, K_MEM, p);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, pool *pl, stream *s);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, pool *pl, stream *s)
{
    return alloc_from_pool(p, size, pl, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, pool *pl, stream *s);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, pool *pl, stream *s)
{
    return alloc_from_pool(p, size, pl, s);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, stream *s);
CUresult cuMemFreeAsync(CUdeviceptr p, stream *s)
{
    return cuMemFree_v2(p);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, stream *s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, stream *s)
{
    return cuMemFree_v2(p);
}

typedef struct {
    int type, handle_types;
    struct {
        int type, id;
    } location;
} mem_prop;

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const mem_prop *prop,
                            unsigned long long flags);
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const mem_prop *prop,
                     unsigned long long flags)
{
    NEED_INIT();
    if (h == NULL || prop == NULL || prop->location.type != 1 || flags != 0)
        return INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= ndevs)
        return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = take(prop->location.id, size, NULL, K_HANDLE, h);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = give(h, K_HANDLE);
    pthread_mutex_unlock(&mu);
    return r;
}
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

static CUresult make_array(unsigned long long *out, unsigned long long size, int kind)
{
    NEED_CTX(c);
    CUresult r = out == NULL ? INVALID_VALUE : take(c->dev, size, c, kind, out);
    pthread_mutex_unlock(&mu);
    return r;
}

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
    CUresult r = make_array(&key, array_size(dsc->w, dsc->h, dsc->d, dsc->format, dsc->channels, 1),
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
    CUresult r = make_array(
        &key, array_size(dsc->w, dsc->h, dsc->d, dsc->format, dsc->channels, levels), K_MIPMAP);
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
    pthread_mutex_unlock(&mu);
    return r;
}

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
