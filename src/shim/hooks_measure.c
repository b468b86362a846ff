/*
 * The hooks whose footprint no argument gives and no driver figure
 * reports apart: context limits (cuCtxSetLimit) and module and library
 * loads. They are charged what the driver's free memory drops by across
 * the call (cuMemGetInfo), and the limits what can be computed besides:
 * the heap and printf FIFO byte for byte, the stack per resident thread.
 */
#include "compat.h"
#include "hooks.h"

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
    return r;
}

/* ---- modules and libraries: measured across the load ---- */

/*
 * After a load that succeeded: charges what the driver's free memory
 * dropped by across it; over the limit, the load is undone with `unload`
 * and CUDA_ERROR_OUT_OF_MEMORY returned.
 */
static CUresult loaded(CUresult r, int measured, size_t before, const kgpu_where *w, int kind,
                       uint64_t key, CUcontext ctx, CUresult (*unload)(uint64_t key))
{
    size_t after = 0;
    if (r != CUDA_SUCCESS || !measured || free_now(&after) != 0 || after >= before)
        return r;
    uint64_t bytes = before - after;
    if (kgpu__charge(w->li, bytes) != CUDA_SUCCESS) {
        unload(key);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    kgpu_track_rec rec = {
        .key = key, .bytes = bytes, .ctx = (uintptr_t)ctx, .dev = (int16_t)w->li, .kind = kind};
    if (kgpu_track_put(&kgpu__shim.track, &rec) != 0) {
        unload(key);
        kgpu__uncharge(w->li, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

static CUresult unload_module(uint64_t key)
{
    return KGPU_REAL(cuModuleUnload)((CUmodule)(uintptr_t)key);
}

static CUresult unload_library(uint64_t key)
{
    return KGPU_REAL(cuLibraryUnload)((CUlibrary)(uintptr_t)key);
}

/* Before a load: where it lands and the free memory then (0: cannot be measured). */
static int before_load(kgpu_where *w, size_t *before)
{
    return kgpu__where_current(w) == CUDA_SUCCESS && w->ctx != NULL && w->li >= 0 &&
           free_now(before) == 0;
}

#define MODULE_LOAD(call, pmod)                                                                    \
    kgpu_where w;                                                                                  \
    size_t before = 0;                                                                             \
    int measured = before_load(&w, &before);                                                       \
    CUresult r = call;                                                                             \
    return loaded(r, measured, before, &w, KGPU_TRACK_MODULE,                                      \
                  r == CUDA_SUCCESS && (pmod) != NULL ? (uint64_t)(uintptr_t)*(pmod) : 0, w.ctx,   \
                  unload_module)

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    KGPU_ENTER(cuModuleLoad, (module, fname));
    MODULE_LOAD(real_(module, fname), module);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    KGPU_ENTER(cuModuleLoadData, (module, image));
    MODULE_LOAD(real_(module, image), module);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            int *options, void **optionValues)
{
    KGPU_ENTER(cuModuleLoadDataEx, (module, image, numOptions, options, optionValues));
    MODULE_LOAD(real_(module, image, numOptions, options, optionValues), module);
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    KGPU_ENTER(cuModuleLoadFatBinary, (module, fatCubin));
    MODULE_LOAD(real_(module, fatCubin), module);
}

CUresult cuModuleUnload(CUmodule hmod)
{
    KGPU_ENTER(cuModuleUnload, (hmod));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MODULE, (uintptr_t)hmod, &rec);
    return kgpu__settle_free(real_(hmod), had, &rec);
}

/* A library is not tied to the context it was measured in: it goes when it is unloaded. */
#define LIBRARY_LOAD(call, plib)                                                                   \
    kgpu_where w;                                                                                  \
    size_t before = 0;                                                                             \
    int measured = before_load(&w, &before);                                                       \
    CUresult r = call;                                                                             \
    return loaded(r, measured, before, &w, KGPU_TRACK_LIBRARY,                                     \
                  r == CUDA_SUCCESS && (plib) != NULL ? (uint64_t)(uintptr_t)*(plib) : 0, NULL,    \
                  unload_library)

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           int *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions)
{
    KGPU_ENTER(cuLibraryLoadData, (library, code, jitOptions, jitOptionsValues, numJitOptions,
                                   libraryOptions, libraryOptionValues, numLibraryOptions));
    LIBRARY_LOAD(real_(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                       libraryOptionValues, numLibraryOptions),
                 library);
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
                 library);
}

CUresult cuLibraryUnload(CUlibrary library)
{
    KGPU_ENTER(cuLibraryUnload, (library));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_LIBRARY, (uintptr_t)library, &rec);
    return kgpu__settle_free(real_(library), had, &rec);
}
