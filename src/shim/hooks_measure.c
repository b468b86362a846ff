/*
 * The hooks whose footprint no argument gives and no driver figure
 * reports apart: context limits (cuCtxSetLimit), module and library
 * loads, and the local memory a launch grows. They are charged what the
 * driver's free memory drops by across the call (cuMemGetInfo), and what
 * can be computed besides: the heap and printf FIFO byte for byte, the
 * stack and local memory per resident thread, a module image's sections.
 */
#include <stdlib.h>

#include "compat.h"
#include "hooks.h"
#include "modimage.h"

static void fn_forget_all(void);

/* ---- context limits ---- */

/* Bytes of device memory a limit of `value` takes on device dev, as far as it can be computed. */
static uint64_t limit_footprint(int limit, size_t value, CUdevice dev)
{
    if (limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE)
        return value;
    if (limit != CU_LIMIT_STACK_SIZE)
        return 0; /* measured only */
    /* The stack is reserved for every thread the device can hold at once. */
    int sms = 0, threads = 0;
    kgpu__pfn_cuDeviceGetAttribute attr = KGPU_REAL(cuDeviceGetAttribute);
    if (attr == NULL ||
        attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        attr(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
        sms <= 0 || threads <= 0)
        return 0;
    uint64_t per = (uint64_t)sms * (uint64_t)threads;
    return value > UINT64_MAX / per ? UINT64_MAX : (uint64_t)value * per;
}

static int free_now(size_t *f)
{
    size_t total;
    return KGPU_REAL(cuMemGetInfo_v2)(f, &total) == CUDA_SUCCESS ? 0 : -1;
}

/*
 * Raising a limit of the current context is charged what the new value
 * takes beyond the value the context had before it was first raised
 * (that much is in the context's footprint): computed where it can be
 * (heap, printf FIFO, stack x resident threads), and never less than the
 * driver's free memory drops across the call. Lowering it gives back.
 */
CUresult cuCtxSetLimit(int limit, size_t value)
{
    KGPU_ENTER(cuCtxSetLimit, (limit, value));
    kgpu_where w;
    size_t old = 0, before = 0, after = 0;
    kgpu__pfn_cuCtxGetLimit get = KGPU_REAL(cuCtxGetLimit);
    if (kgpu__where_current(&w) != CUDA_SUCCESS || w.ctx == NULL || get == NULL ||
        get(&old, limit) != CUDA_SUCCESS)
        return real_(limit, value); /* the driver says what is wrong */
    uint64_t key = (uint64_t)(uintptr_t)w.ctx ^ ((uint64_t)(limit & 0xff) << 56);
    kgpu_track_rec base, prev = {0};
    if (!kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_LIMITBASE, key, &base)) {
        base = (kgpu_track_rec){.key = key,
                                .bytes = old,
                                .ctx = (uintptr_t)w.ctx,
                                .dev = -1,
                                .kind = KGPU_TRACK_LIMITBASE};
        if (kgpu_track_put(&kgpu__shim.track, &base) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_LIMIT, key, &prev);
    uint64_t fp_new = limit_footprint(limit, value, w.dev),
             fp_base = limit_footprint(limit, (size_t)base.bytes, w.dev);
    uint64_t target = fp_new > fp_base ? fp_new - fp_base : 0, charged = had ? prev.bytes : 0;
    uint64_t more = target > charged ? target - charged : 0;
    int measured = free_now(&before) == 0;
    CUresult r = kgpu__charge(w.li, more);
    if (r == CUDA_SUCCESS && (r = real_(limit, value)) != CUDA_SUCCESS)
        kgpu__uncharge(w.li, more);
    /* What the driver took beyond the computed part (a limit with no formula, or a bigger one). */
    if (r == CUDA_SUCCESS && measured && free_now(&after) == 0 && before > after &&
        before - after > more) {
        uint64_t extra = before - after - more;
        if (kgpu__charge(w.li, extra) == CUDA_SUCCESS) {
            more += extra;
        } else {
            real_(limit, old);
            kgpu__uncharge(w.li, more);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r != CUDA_SUCCESS) {
        if (had)
            kgpu_track_put(&kgpu__shim.track, &prev);
        return r;
    }
    uint64_t now = charged + more;
    if (more == 0 && target < charged) { /* lowered: what it took above the new value comes back */
        kgpu__uncharge(w.li, charged - target);
        now = target;
    }
    kgpu_track_rec rec = {.key = key,
                          .bytes = now,
                          .ctx = (uintptr_t)w.ctx,
                          .dev = (int16_t)w.li,
                          .kind = KGPU_TRACK_LIMIT};
    if (now != 0 && kgpu_track_put(&kgpu__shim.track, &rec) != 0)
        kgpu__uncharge(w.li, now);
    if (limit == CU_LIMIT_STACK_SIZE) { /* the local memory is resized to the new stack */
        kgpu_track_rec gone;
        kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_LMEM, (uintptr_t)w.ctx, &gone);
        atomic_fetch_add(&kgpu__shim.lmem_gen, 1);
    }
    return r;
}

/* ---- modules and libraries: an estimate before the load, the measured drop after ---- */

/*
 * Before a load: the image's own upper bound (modimage.c: cubins, PTX and
 * fatbinaries, compressed entries decompressed) is charged, so a module
 * that cannot fit is refused before the driver makes it. An image without
 * an estimate (unparsable, or another format) is charged nothing before:
 * refusing it would refuse what the driver may load well within the
 * share, so it is measured after, and for that moment can be past the
 * share (docs/shim.md). After a load that succeeded the charge becomes
 * what the driver's free memory dropped by across it; past the limit (an
 * image without an estimate, or one the driver took more for), the load
 * is undone with `unload` and CUDA_ERROR_OUT_OF_MEMORY returned. A driver
 * without the unload function cannot undo it: the memory is then charged
 * past the limit, as it is held.
 */
static CUresult loaded(CUresult r, int measured, size_t before, const kgpu_where *w, int kind,
                       uint64_t key, CUcontext ctx, CUresult (*unload)(uint64_t key), uint64_t est)
{
    size_t after = 0;
    if (r != CUDA_SUCCESS || !measured || free_now(&after) != 0 || after >= before) {
        if (est != 0)
            kgpu__uncharge(w->li, est);
        return r;
    }
    uint64_t bytes = before - after;
    if (bytes <= est) {
        kgpu__uncharge(w->li, est - bytes);
    } else if (kgpu__charge(w->li, bytes - est) != CUDA_SUCCESS) {
        if (unload(key) == CUDA_ERROR_NOT_FOUND) {
            kgpu__charge_anyway(w->li, bytes - est);
        } else {
            kgpu__uncharge(w->li, est);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    kgpu_track_rec rec = {
        .key = key, .bytes = bytes, .ctx = (uintptr_t)ctx, .dev = (int16_t)w->li, .kind = kind};
    if (kgpu_track_put(&kgpu__shim.track, &rec) != 0 && unload(key) != CUDA_ERROR_NOT_FOUND) {
        kgpu__uncharge(w->li, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

/* CUDA_ERROR_NOT_FOUND: the driver has no function to unload with (a load cannot be undone). */
static CUresult unload_module(uint64_t key)
{
    kgpu__pfn_cuModuleUnload unload = KGPU_REAL(cuModuleUnload);
    return unload != NULL ? unload((CUmodule)(uintptr_t)key) : CUDA_ERROR_NOT_FOUND;
}

static CUresult unload_library(uint64_t key)
{
    kgpu__pfn_cuLibraryUnload unload = KGPU_REAL(cuLibraryUnload);
    return unload != NULL ? unload((CUlibrary)(uintptr_t)key) : CUDA_ERROR_NOT_FOUND;
}

/* Before a load: where it lands and the free memory then (0: cannot be measured). */
static int before_load(kgpu_where *w, size_t *before)
{
    return kgpu__where_current(w) == CUDA_SUCCESS && w->ctx != NULL && w->li >= 0 &&
           free_now(before) == 0;
}

/*
 * The device's compute capability as 10 * major + minor (86 for 8.6), 0
 * where the driver does not say: which cubin of a fatbinary it loads, and
 * whether it compiles the PTX instead (modimage.h).
 */
static unsigned device_sm(CUdevice dev)
{
    int major = 0, minor = 0;
    kgpu__pfn_cuDeviceGetAttribute attr = KGPU_REAL(cuDeviceGetAttribute);
    if (attr == NULL ||
        attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
        attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS ||
        major <= 0 || major > 99 || minor < 0 || minor > 9)
        return 0;
    return (unsigned)(major * 10 + minor);
}

/* The image's estimate (0: none, measured after the load); files: up to IMAGE_FILE_MAX. */
#define IMAGE_FILE_MAX (64u << 20)

static uint64_t image_estimate(const void *image, CUdevice dev)
{
    uint64_t b = 0;
    return kgpu_modimage_estimate(image, SIZE_MAX, device_sm(dev), &b) ? b : 0;
}

static uint64_t file_estimate(const char *path, CUdevice dev)
{
    struct stat st;
    uint64_t b = 0;
    int fd = path != NULL ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0)
        return 0;
    unsigned char *buf = NULL;
    if (kgpu_shim_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        st.st_size <= IMAGE_FILE_MAX && (buf = malloc((size_t)st.st_size)) != NULL) {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t n = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        if (!kgpu_modimage_estimate(buf, got, device_sm(dev), &b))
            b = 0;
    }
    free(buf);
    close(fd);
    return b;
}

#define IMAGE_LOAD(call, phandle, kind, ctx, unload, estimate)                                         kgpu_where w;                                                                                      size_t before = 0;                                                                                 int measured = before_load(&w, &before);                                                           uint64_t est = measured ? (estimate) : 0;                                                          if (est != 0)                                                                                          CHARGE_OR_RETURN(w.li, est);                                                                   CUresult r = call;                                                                                 return loaded(r, measured, before, &w, kind,                                                                     r == CUDA_SUCCESS && (phandle) != NULL ? (uint64_t)(uintptr_t)*(phandle) : 0,                      ctx, unload, est)

#define MODULE_LOAD(call, pmod, estimate)                                                              IMAGE_LOAD(call, pmod, KGPU_TRACK_MODULE, w.ctx, unload_module, estimate)

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    KGPU_ENTER(cuModuleLoad, (module, fname));
    MODULE_LOAD(real_(module, fname), module, file_estimate(fname, w.dev));
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    KGPU_ENTER(cuModuleLoadData, (module, image));
    MODULE_LOAD(real_(module, image), module, image_estimate(image, w.dev));
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            int *options, void **optionValues)
{
    KGPU_ENTER(cuModuleLoadDataEx, (module, image, numOptions, options, optionValues));
    MODULE_LOAD(real_(module, image, numOptions, options, optionValues), module,
                image_estimate(image, w.dev));
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    KGPU_ENTER(cuModuleLoadFatBinary, (module, fatCubin));
    MODULE_LOAD(real_(module, fatCubin), module, image_estimate(fatCubin, w.dev));
}

CUresult cuModuleUnload(CUmodule hmod)
{
    KGPU_ENTER(cuModuleUnload, (hmod));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MODULE, (uintptr_t)hmod, &rec);
    fn_forget_all();
    return kgpu__settle_free(real_(hmod), had, &rec);
}

/* A library is not tied to the context it was measured in: it goes when it is unloaded. */
#define LIBRARY_LOAD(call, plib, estimate)                                                         \
    IMAGE_LOAD(call, plib, KGPU_TRACK_LIBRARY, NULL, unload_library, estimate)

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           int *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions)
{
    KGPU_ENTER(cuLibraryLoadData, (library, code, jitOptions, jitOptionsValues, numJitOptions,
                                   libraryOptions, libraryOptionValues, numLibraryOptions));
    LIBRARY_LOAD(real_(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                       libraryOptionValues, numLibraryOptions),
                 library, image_estimate(code, w.dev));
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, int *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               int *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions)
{
    KGPU_ENTER(cuLibraryLoadFromFile, (library, fileName, jitOptions, jitOptionsValues,
                                       numJitOptions, libraryOptions, libraryOptionValues,
                                       numLibraryOptions));
    LIBRARY_LOAD(real_(library, fileName, jitOptions, jitOptionsValues, numJitOptions,
                       libraryOptions, libraryOptionValues, numLibraryOptions),
                 library, file_estimate(fileName, w.dev));
}

CUresult cuLibraryUnload(CUlibrary library)
{
    KGPU_ENTER(cuLibraryUnload, (library));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_LIBRARY, (uintptr_t)library, &rec);
    fn_forget_all();
    return kgpu__settle_free(real_(library), had, &rec);
}

/* ---- local memory, grown at launch ---- */

/*
 * A kernel whose threads need more local memory than the context reserves
 * per thread makes the driver grow the reservation at its launch, for
 * every thread the device holds at once, and keep it until the context
 * goes or cuCtxSetLimit(CU_LIMIT_STACK_SIZE) sets it anew: the stack limit
 * and local memory are one reservation. So the growth is charged as that
 * limit raised to the kernel's local size would be (the same records as
 * cuCtxSetLimit above, so either can follow the other), before the
 * launch. Each function's local size is asked once and kept in a
 * lock-free table, so a launch of a function seen before costs a hash and
 * a load; only a function with local memory goes further. There each
 * thread remembers the context it last launched in and the local memory
 * that context is known to hold, good for one generation of
 * kgpu__shim.lmem_gen (state.h): a launch that fits asks the driver for the
 * current context and compares, with no lock and no table.
 */

static _Thread_local struct {
    CUcontext ctx;
    uint64_t gen;
    uint32_t held; /* local bytes per thread ctx holds at least */
} lmem_seen;

#define FN_SLOTS 4096 /* a power of two */
#define FN_PROBE 8

static struct fn_slot {
    _Atomic uintptr_t f; /* the function; | 1 while being filled; 0 free */
    _Atomic uint32_t local;
} fn_cache[FN_SLOTS];

static pthread_mutex_t lmem_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t fn_hash(uintptr_t f)
{
    return (size_t)(((uint64_t)f >> 4) * 0x9e3779b97f4a7c15ULL >> 52) & (FN_SLOTS - 1);
}

/* The local bytes per thread of f: 1 and *local when it is known, else 0. */
static inline int fn_cached(uintptr_t f, uint32_t *local)
{
    size_t h = fn_hash(f);
    for (int i = 0; i < FN_PROBE; i++) {
        struct fn_slot *s = &fn_cache[(h + (size_t)i) & (FN_SLOTS - 1)];
        uintptr_t k = atomic_load_explicit(&s->f, memory_order_acquire);
        if (k == f) {
            *local = atomic_load_explicit(&s->local, memory_order_relaxed);
            return 1;
        }
        if (k == 0)
            return 0;
    }
    return 0;
}

static void fn_remember(uintptr_t f, uint32_t local)
{
    size_t h = fn_hash(f);
    for (int i = 0; i < FN_PROBE; i++) {
        struct fn_slot *s = &fn_cache[(h + (size_t)i) & (FN_SLOTS - 1)];
        uintptr_t empty = 0;
        if (atomic_compare_exchange_strong(&s->f, &empty, f | 1)) {
            atomic_store_explicit(&s->local, local, memory_order_relaxed);
            atomic_store_explicit(&s->f, f, memory_order_release);
            return;
        }
        if ((empty & ~(uintptr_t)1) == f)
            return;
    }
    /* Full around here: asked again at each launch, which is only slower. */
}

/* Modules went: their functions' handles may be reused for others. */
static void fn_forget_all(void)
{
    for (size_t i = 0; i < FN_SLOTS; i++)
        atomic_store_explicit(&fn_cache[i].f, 0, memory_order_release);
}

/* The slow part: f has local memory; the current context may have to grow for it. */
static CUresult lmem_grow(uint32_t local)
{
    kgpu_where w;
    kgpu__pfn_cuCtxGetLimit get = KGPU_REAL(cuCtxGetLimit);
    if (kgpu__where_current(&w) != CUDA_SUCCESS || w.ctx == NULL || w.li < 0 || get == NULL)
        return CUDA_SUCCESS; /* the launch fails in the driver, or lands on no line */
    uint64_t key = (uint64_t)(uintptr_t)w.ctx; /* ^ (CU_LIMIT_STACK_SIZE << 56), which is 0 */
    CUresult r = CUDA_SUCCESS;
    /* Read before the records: a change after this read makes what is cached below stale. */
    uint64_t gen = atomic_load(&kgpu__shim.lmem_gen);
    pthread_mutex_lock(&lmem_mu);
    kgpu_track_rec cur, base, prev = {0};
    size_t stack = 0;
    if (kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_LMEM, key, &cur)) {
        stack = (size_t)cur.bytes;
    } else if (get(&stack, CU_LIMIT_STACK_SIZE) != CUDA_SUCCESS) {
        pthread_mutex_unlock(&lmem_mu);
        return CUDA_SUCCESS;
    }
    if (local <= stack) { /* reserved already */
        lmem_seen.ctx = w.ctx;
        lmem_seen.gen = gen;
        lmem_seen.held = stack < UINT32_MAX ? (uint32_t)stack : UINT32_MAX;
        goto out;
    }
    if (!kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_LIMITBASE, key, &base)) {
        size_t now = stack;
        get(&now, CU_LIMIT_STACK_SIZE);
        base = (kgpu_track_rec){.key = key,
                                .bytes = now,
                                .ctx = (uintptr_t)w.ctx,
                                .dev = -1,
                                .kind = KGPU_TRACK_LIMITBASE};
        if (kgpu_track_put(&kgpu__shim.track, &base) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    int had = kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_LIMIT, key, &prev);
    uint64_t fp_new = limit_footprint(CU_LIMIT_STACK_SIZE, local, w.dev),
             fp_base = limit_footprint(CU_LIMIT_STACK_SIZE, (size_t)base.bytes, w.dev);
    uint64_t target = fp_new > fp_base ? fp_new - fp_base : 0, charged = had ? prev.bytes : 0;
    if (target > charged) {
        if ((r = kgpu__charge(w.li, target - charged)) != CUDA_SUCCESS)
            goto out;
        kgpu_track_rec rec = {.key = key,
                              .bytes = target,
                              .ctx = (uintptr_t)w.ctx,
                              .dev = (int16_t)w.li,
                              .kind = KGPU_TRACK_LIMIT};
        if (kgpu_track_put(&kgpu__shim.track, &rec) != 0) {
            kgpu__uncharge(w.li, target - charged);
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    kgpu_track_rec grown = {.key = key,
                            .bytes = local,
                            .ctx = (uintptr_t)w.ctx,
                            .dev = -1, /* a size per thread, not a charge */
                            .kind = KGPU_TRACK_LMEM};
    if (kgpu_track_put(&kgpu__shim.track, &grown) == 0) { /* lost: asked again, nothing worse */
        lmem_seen.ctx = w.ctx;
        lmem_seen.gen = gen;
        lmem_seen.held = local;
    }
out:
    pthread_mutex_unlock(&lmem_mu);
    return r;
}

CUresult kgpu__lmem_launch(CUfunction f)
{
    uint32_t local;
    if (f == NULL) /* the driver refuses it */
        return CUDA_SUCCESS;
    if (__builtin_expect(!fn_cached((uintptr_t)f, &local), 0)) {
        int v = 0;
        kgpu__pfn_cuFuncGetAttribute attr = KGPU_REAL(cuFuncGetAttribute);
        if (attr == NULL || attr(&v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) != CUDA_SUCCESS ||
            v < 0)
            return CUDA_SUCCESS; /* not a function the driver knows: the launch says so */
        local = (uint32_t)v;
        fn_remember((uintptr_t)f, local);
    }
    if (local == 0)
        return CUDA_SUCCESS;
    CUcontext ctx;
    if (local <= lmem_seen.held &&
        atomic_load(&kgpu__shim.lmem_gen) == lmem_seen.gen &&
        KGPU_REAL(cuCtxGetCurrent)(&ctx) == CUDA_SUCCESS && ctx != NULL && ctx == lmem_seen.ctx)
        return CUDA_SUCCESS; /* this thread saw this context hold as much, nothing since */
    return lmem_grow(local);
}
