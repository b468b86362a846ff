/*
 * Charges against the container's region and what keeps them: a counted
 * call reserves its bytes before the driver allocates (the limit is
 * checked for the whole container in one step, so concurrent processes
 * cannot pass it together), then keeps the charge recorded under what the
 * driver made, or gives it back if the driver failed. Frees give back what
 * was recorded; a context's end gives back everything that died with it.
 */
#include <unistd.h>

#include "compat.h"
#include "account.h"

/*
 * Reserves `bytes` on limits index li: CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY
 * over the limit, or CUDA_ERROR_NOT_INITIALIZED before cuInit (devices not
 * matched yet, li -2), as the driver would answer then.
 */
CUresult kgpu__charge(int li, uint64_t bytes)
{
    if (li == -2)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (li < 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* a device on no line of the limits file */
    if (bytes == 0)
        return CUDA_SUCCESS;
    int rc = kgpu_shim_region_reserve(kgpu__shim.region, li, bytes, kgpu__limit(li));
    if (rc == KGPU_ENOFIT) {
        /* What closed exports, shrunken pools and trimmed graph memory gave up comes back. */
        kgpu__mem_refresh();
        rc = kgpu_shim_region_reserve(kgpu__shim.region, li, bytes, kgpu__limit(li));
    }
    if (rc == KGPU_ESTATE && atomic_exchange(&kgpu__shim.told, 1) == 0) {
        static const char line[] = "kgpu-limit: the accounting region has no free process slot "
                                   "or its lock is unusable: GPU memory is refused\n";
        ssize_t n = write(2, line, sizeof(line) - 1);
        (void)n;
    }
    return rc == KGPU_OK ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Frees what a counted call made when it cannot be recorded. */
static void undo(int kind, uint64_t key)
{
    switch (kind) {
    case KGPU_TRACK_MEM:
        KGPU_REAL(cuMemFree_v2)((CUdeviceptr)key);
        break;
    case KGPU_TRACK_HANDLE:
        if (KGPU_REAL(cuMemRelease) != NULL)
            KGPU_REAL(cuMemRelease)(key);
        break;
    case KGPU_TRACK_ARRAY:
        KGPU_REAL(cuArrayDestroy)((CUarray)(uintptr_t)key);
        break;
    case KGPU_TRACK_MIPMAP:
        if (KGPU_REAL(cuMipmappedArrayDestroy) != NULL)
            KGPU_REAL(cuMipmappedArrayDestroy)((CUmipmappedArray)(uintptr_t)key);
        break;
    case KGPU_TRACK_CTX:
        KGPU_REAL(cuCtxDestroy_v2)((CUcontext)(uintptr_t)key);
        break;
    }
}

/* After the driver answered a counted call charged `bytes` at w: keep or give back the charge. */
CUresult kgpu__settle(CUresult r, int kind, uint64_t key, uint64_t bytes, const kgpu_where *w)
{
    if (r != CUDA_SUCCESS) {
        kgpu__uncharge(w->li, bytes);
        return r;
    }
    kgpu_track_rec rec = {
        .key = key, .bytes = bytes, .ctx = (uintptr_t)w->ctx, .dev = (int16_t)w->li, .kind = kind};
    if (kgpu_track_put(&kgpu__shim.track, &rec) != 0) {
        undo(kind, key);
        kgpu__uncharge(w->li, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* After the driver answered a free: the charge goes back only if the memory did. */
CUresult kgpu__settle_free(CUresult r, int had, const kgpu_track_rec *rec)
{
    if (!had)
        return r;
    if (r != CUDA_SUCCESS) {
        kgpu_track_put(&kgpu__shim.track, rec);
        return r;
    }
    kgpu__uncharge(rec->dev, rec->bytes);
    return r;
}

void kgpu__drop_ctx(CUcontext ctx)
{
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES] = {0};
    size_t n = kgpu_track_take_ctx(&kgpu__shim.track, (uintptr_t)ctx, bytes);
    atomic_fetch_add(&kgpu__shim.lmem_gen, 1); /* its handle may come back as another context */
    if (n == 0)
        return;
    for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++)
        if (bytes[d] != 0)
            kgpu__uncharge(d, bytes[d]);
}

/* A sparse array destroyed: what its tiles kept alive may go. */
void kgpu__array_gone(uint64_t array)
{
    kgpu_vmm_freed f = {0};
    kgpu_vmm_tile_unmapped(&kgpu__shim.vmm, array, UINT64_MAX, &f);
    kgpu__uncharge_freed(&f);
}
