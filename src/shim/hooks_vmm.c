/*
 * The hooks of virtual memory management: physical memory lives while a
 * handle, a mapping or an export does (vmm.c keeps count), so cuMemCreate
 * is charged and the charge goes back only when the driver really frees
 * the memory. Also the sparse arrays' tiles mapped from such handles
 * (cuMemMapArrayAsync), and exports and imports of handles between
 * processes. docs/shim.md says, per route, where the count can be wrong.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compat.h"
#include "hooks.h"

/* ---- virtual memory management ---- */

static int export_of(int fd, kgpu_vmm_export *e)
{
    struct stat st;
    if (fd < 0 || kgpu_shim_fstat(fd, &st) != 0)
        return -1;
    *e = (kgpu_vmm_export){.fd = fd, .dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino};
    return 0;
}

/* Physical memory: device memory only, tied to no context. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    KGPU_ENTER(cuMemCreate, (handle, size, prop, flags));
    if (handle == NULL || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        size == 0)
        return real_(handle, size, prop, flags);
    int li = kgpu__dev_index(prop->location.id);
    CHARGE_OR_RETURN(li, size);
    CUresult r = real_(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        kgpu__uncharge(li, size);
        return r;
    }
    if (kgpu_vmm_created(&kgpu__shim.vmm, *handle, size, li) != 0) {
        KGPU_REAL(cuMemRelease)(*handle);
        kgpu__uncharge(li, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* The charge goes back only when the last handle, mapping and export are gone. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    KGPU_ENTER(cuMemRelease, (handle));
    int known = kgpu_vmm_knows(&kgpu__shim.vmm, handle);
    CUresult r = real_(handle);
    if (r == CUDA_SUCCESS && known) {
        kgpu_vmm_freed f = {0};
        kgpu_vmm_released(&kgpu__shim.vmm, handle, &f);
        kgpu__uncharge_freed(&f);
    }
    return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    KGPU_ENTER(cuMemMap, (ptr, size, offset, handle, flags));
    uint64_t more = 0;
    int li = -1;
    int known = kgpu_vmm_map_cost(&kgpu__shim.vmm, handle, offset, size, &more, &li);
    if (known && more > 0)
        CHARGE_OR_RETURN(li, more); /* an import: charged as far as it is mapped */
    CUresult r = real_(ptr, size, offset, handle, flags);
    if (r != CUDA_SUCCESS) {
        kgpu__uncharge(li, more);
        return r;
    }
    if (!known)
        return r;
    int64_t excess = kgpu_vmm_mapped(&kgpu__shim.vmm, ptr, size, offset, handle, more);
    if (excess < 0) {
        KGPU_REAL(cuMemUnmap)(ptr, size);
        kgpu__uncharge(li, more);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    kgpu__uncharge(li, (uint64_t)excess);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    KGPU_ENTER(cuMemUnmap, (ptr, size));
    CUresult r = real_(ptr, size);
    if (r == CUDA_SUCCESS) {
        kgpu_vmm_freed f = {0};
        kgpu_vmm_unmapped(&kgpu__shim.vmm, ptr, size, &f);
        kgpu__uncharge_freed(&f);
    }
    return r;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    KGPU_ENTER(cuMemRetainAllocationHandle, (handle, addr));
    CUresult r = real_(handle, addr);
    if (r == CUDA_SUCCESS && handle != NULL)
        kgpu_vmm_retained(&kgpu__shim.vmm, *handle, (uint64_t)(uintptr_t)addr);
    return r;
}

/* Which subresource a CUarrayMapInfo names, from its defined fields only (not its padding). */
static uint64_t tile_of(const CUarrayMapInfo *m)
{
    uint64_t h = 1469598103934665603ULL, f[8] = {0};
    int n = 0;
    if (m->subresourceType == 0) {
        f[0] = m->subresource.sparseLevel.level;
        f[1] = m->subresource.sparseLevel.layer;
        f[2] = m->subresource.sparseLevel.offsetX;
        f[3] = m->subresource.sparseLevel.offsetY;
        f[4] = m->subresource.sparseLevel.offsetZ;
        n = 5;
    } else {
        f[0] = 1ULL << 32 | m->subresource.miptail.layer;
        f[1] = m->subresource.miptail.offset;
        n = 2;
    }
    for (int i = 0; i < n; i++)
        h = (h ^ f[i]) * 1099511628211ULL;
    return h == UINT64_MAX ? h - 1 : h;
}

/*
 * Tiles of sparse arrays mapped from handles: the handle's memory lives
 * while a tile maps it, like a virtual mapping. (The driver performs the
 * operations in stream order; they are recorded when queued.)
 */
static CUresult map_array(kgpu__pfn_cuMemMapArrayAsync real, CUarrayMapInfo *infos,
                          unsigned int count, CUstream stream)
{
    CUresult r = real(infos, count, stream);
    for (unsigned int i = 0; r == CUDA_SUCCESS && infos != NULL && i < count; i++) {
        const CUarrayMapInfo *m = &infos[i];
        uint64_t array = (uint64_t)(uintptr_t)m->resource.array, where = tile_of(m);
        kgpu_vmm_freed f = {0};
        kgpu_vmm_tile_unmapped(&kgpu__shim.vmm, array, where, &f); /* what was mapped there */
        if (m->memOperationType == 1 && m->memHandleType == 0)
            kgpu_vmm_tile_mapped(&kgpu__shim.vmm, array, where, m->memHandle);
        kgpu__uncharge_freed(&f);
    }
    return r;
}

CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream)
{
    KGPU_ENTER(cuMemMapArrayAsync, (mapInfoList, count, hStream));
    return map_array(real_, mapInfoList, count, hStream);
}

CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count,
                                 CUstream hStream)
{
    KGPU_ENTER(cuMemMapArrayAsync_ptsz, (mapInfoList, count, hStream));
    return map_array(real_, mapInfoList, count, hStream);
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      int handleType, unsigned long long flags)
{
    KGPU_ENTER(cuMemExportToShareableHandle, (shareableHandle, handle, handleType, flags));
    CUresult r = real_(shareableHandle, handle, handleType, flags);
    if (r != CUDA_SUCCESS || shareableHandle == NULL)
        return r;
    kgpu_vmm_export e;
    /* A descriptor can be watched; a fabric handle cannot: it keeps the charge for good. */
    int watched = handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
                  export_of(*(int *)shareableHandle, &e) == 0;
    kgpu_vmm_exported(&kgpu__shim.vmm, handle, watched ? &e : NULL);
    return r;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        int shHandleType)
{
    KGPU_ENTER(cuMemImportFromShareableHandle, (handle, osHandle, shHandleType));
    CUresult r = real_(handle, osHandle, shHandleType);
    if (r != CUDA_SUCCESS || handle == NULL)
        return r;
    kgpu_vmm_export e;
    int fd = shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                 ? (int)(intptr_t)osHandle
                 : -1;
    /* Its device: where the properties say it lives, else the current context's. */
    int li = -1;
    union {
        CUmemAllocationProp prop;
        unsigned char room[256]; /* the driver writes the whole, larger, structure */
    } p;
    memset(&p, 0, sizeof(p));
    kgpu__pfn_cuMemGetAllocationPropertiesFromHandle props =
        KGPU_REAL(cuMemGetAllocationPropertiesFromHandle);
    kgpu_where w;
    if (props != NULL && props(&p.prop, *handle) == CUDA_SUCCESS &&
        p.prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        li = kgpu__dev_index(p.prop.location.id);
    else if (kgpu__where_current(&w) == CUDA_SUCCESS)
        li = w.li;
    if (kgpu_vmm_imported(&kgpu__shim.vmm, *handle, export_of(fd, &e) == 0 ? &e : NULL, li) !=
        0) {
        KGPU_REAL(cuMemRelease)(*handle);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

/* ---- IPC: memory another process allocated, kept alive by opening it here ---- */

/*
 * An opened IPC allocation lives until the consumer closes it (or its
 * context goes), whatever the producer does meanwhile. Its size shows in
 * no argument and the driver checks nothing before it maps, so it is
 * charged after the open, by the allocation's extent (cuMemGetAddressRange),
 * and over the share the handle is closed again. Producer and consumer in
 * one container are both charged: over, never under.
 */
static CUresult ipc_open(kgpu__pfn_cuIpcOpenMemHandle_v2 real, CUdeviceptr *pdptr,
                         CUipcMemHandle handle, unsigned int flags)
{
    kgpu_where w;
    CUresult r = kgpu__where_current(&w);
    if (r != CUDA_SUCCESS || pdptr == NULL)
        return r != CUDA_SUCCESS ? r : real(pdptr, handle, flags);
    if ((r = real(pdptr, handle, flags)) != CUDA_SUCCESS)
        return r;
    kgpu_track_rec rec;
    if (kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_MEM, *pdptr, &rec))
        return r; /* opened again in this context: the driver hands out the same mapping */
    CUdeviceptr base = 0;
    size_t size = 0;
    kgpu__pfn_cuMemGetAddressRange_v2 range = KGPU_REAL(cuMemGetAddressRange_v2);
    if (range == NULL || range(&base, &size, *pdptr) != CUDA_SUCCESS)
        size = 0; /* not measurable: not charged (docs/shim.md) */
    kgpu__pfn_cuIpcCloseMemHandle close_ = KGPU_REAL(cuIpcCloseMemHandle);
    rec = (kgpu_track_rec){.key = *pdptr, .bytes = size, .ctx = (uintptr_t)w.ctx,
                           .dev = (int16_t)w.li, .kind = KGPU_TRACK_MEM};
    if (kgpu__charge(w.li, size) != CUDA_SUCCESS) {
        if (close_ != NULL)
            close_(*pdptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (kgpu_track_put(&kgpu__shim.track, &rec) != 0) {
        if (close_ != NULL)
            close_(*pdptr);
        kgpu__uncharge(w.li, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    KGPU_ENTER(cuIpcOpenMemHandle, (pdptr, handle, Flags));
    return ipc_open(real_, pdptr, handle, Flags);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    KGPU_ENTER(cuIpcOpenMemHandle_v2, (pdptr, handle, Flags));
    return ipc_open(real_, pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    KGPU_ENTER(cuIpcCloseMemHandle, (dptr));
    kgpu_track_rec rec;
    int had = kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_MEM, dptr, &rec);
    return kgpu__settle_free(real_(dptr), had, &rec);
}

/* ---- multicast objects: what a binding keeps alive ---- */

/*
 * Memory bound into a multicast object stays allocated while it is bound,
 * whatever is released meanwhile: a binding counts as a reference in the
 * virtual memory table until it is unbound or the object is gone (its last
 * handle released and its last mapping unmapped, as for any handle). The
 * object's own footprint is not charged (docs/shim.md).
 */
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                           const CUmulticastObjectProp *prop)
{
    KGPU_ENTER(cuMulticastCreate, (mcHandle, prop));
    CUresult r = real_(mcHandle, prop);
    if (r == CUDA_SUCCESS && mcHandle != NULL &&
        kgpu_vmm_mcast_created(&kgpu__shim.vmm, *mcHandle) != 0) {
        KGPU_REAL(cuMemRelease)(*mcHandle);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

/* After a successful bind: recorded, or undone when the table is out of memory. */
static CUresult mcast_bound(CUmemGenericAllocationHandle mc, size_t off, size_t size,
                            CUmemGenericAllocationHandle mem, CUdeviceptr addr, CUdevice dev)
{
    if (kgpu_vmm_mcast_bound(&kgpu__shim.vmm, mc, off, size, mem, addr) >= 0)
        return CUDA_SUCCESS;
    if (KGPU_REAL(cuMulticastUnbind) != NULL)
        KGPU_REAL(cuMulticastUnbind)(mc, dev, off, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The CUDA device of the current context (whose memory a bind by address names), or 0. */
static CUdevice current_dev(void)
{
    kgpu_where w;
    return kgpu__where_current(&w) == CUDA_SUCCESS ? w.dev : 0;
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                            CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
                            unsigned long long flags)
{
    KGPU_ENTER(cuMulticastBindMem, (mcHandle, mcOffset, memHandle, memOffset, size, flags));
    CUresult r = real_(mcHandle, mcOffset, memHandle, memOffset, size, flags);
    if (r != CUDA_SUCCESS || memHandle == 0)
        return r;
    union {
        CUmemAllocationProp prop;
        unsigned char room[256]; /* the driver writes the whole, larger, structure */
    } p;
    memset(&p, 0, sizeof(p));
    kgpu__pfn_cuMemGetAllocationPropertiesFromHandle props =
        KGPU_REAL(cuMemGetAllocationPropertiesFromHandle);
    CUdevice dev = props != NULL && props(&p.prop, memHandle) == CUDA_SUCCESS
                       ? p.prop.location.id
                       : current_dev();
    return mcast_bound(mcHandle, mcOffset, size, memHandle, 0, dev);
}

CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                             CUdeviceptr memptr, size_t size, unsigned long long flags)
{
    KGPU_ENTER(cuMulticastBindAddr, (mcHandle, mcOffset, memptr, size, flags));
    CUresult r = real_(mcHandle, mcOffset, memptr, size, flags);
    if (r != CUDA_SUCCESS)
        return r;
    return mcast_bound(mcHandle, mcOffset, size, 0, memptr, current_dev());
}

CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
                           size_t size)
{
    KGPU_ENTER(cuMulticastUnbind, (mcHandle, dev, mcOffset, size));
    CUresult r = real_(mcHandle, dev, mcOffset, size);
    if (r == CUDA_SUCCESS) {
        kgpu_vmm_freed f = {0};
        kgpu_vmm_mcast_unbound(&kgpu__shim.vmm, mcHandle, kgpu__dev_index(dev), mcOffset, size,
                               &f);
        kgpu__uncharge_freed(&f);
    }
    return r;
}
