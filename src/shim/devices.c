/*
 * Which device a call lands on, and which line of the limits file that
 * device is: CUDA ordinals matched to the file by UUID once cuInit has
 * succeeded; the current context's device, learnt from the retained
 * primary contexts without asking the driver where it can be.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "compat.h"
#include "driver.h"

/* The 36-character canonical form after a "GPU-"/"MIG-" prefix, or the whole string. */
static const char *uuid_body(const char *u)
{
    size_t n = strlen(u);
    return n > 36 && u[n - 37] == '-' ? u + n - 36 : u;
}

int kgpu__uuid_index(const char *uuid)
{
    const char *body = uuid_body(uuid);
    for (int i = 0; i < kgpu__shim.limits.ndevices; i++)
        if (strcasecmp(uuid_body(kgpu__shim.limits.dev[i].uuid), body) == 0)
            return i;
    return -1;
}

static int uuid_of(CUdevice dev, int fn, char *out, size_t size)
{
    kgpu__pfn_cuDeviceGetUuid get = (kgpu__pfn_cuDeviceGetUuid)kgpu__real(fn);
    CUuuid u;
    if (get == NULL || get(&u, dev) != CUDA_SUCCESS)
        return -1;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(out, size, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return 0;
}

/*
 * A limit is never more than the device has: inside a MIG instance CUDA's
 * device is the instance, whose memory (what cuDeviceTotalMem and
 * cuMemGetInfo report) can be below the profile's size the limits file
 * names. Capped here, once, before any limit is read (readers reach a
 * limits index only through the mapping, published after this).
 */
static void cap_to_device(CUdevice d, int li)
{
    kgpu__pfn_cuDeviceTotalMem_v2 total = KGPU_REAL(cuDeviceTotalMem_v2);
    size_t bytes = 0;
    if (li < 0 || li >= KGPU_SHIM_MAX_DEVICES || total == NULL ||
        total(&bytes, d) != CUDA_SUCCESS || bytes == 0)
        return;
    if ((uint64_t)bytes < kgpu__shim.limit_bytes[li])
        kgpu__shim.limit_bytes[li] = (uint64_t)bytes;
}

/*
 * Matches each CUDA device to its line of the limits file by UUID (the MIG
 * or the GPU one); a device whose UUID cannot be read falls back to its
 * ordinal. A device on no line gets no memory at all.
 */
void kgpu__map_devices(void)
{
    if (atomic_load_explicit(&kgpu__shim.dev_mapped, memory_order_acquire))
        return;
    pthread_mutex_lock(&kgpu__shim.dev_mu);
    int count = 0;
    kgpu__pfn_cuDeviceGetCount get_count = KGPU_REAL(cuDeviceGetCount);
    if (atomic_load(&kgpu__shim.dev_mapped) || get_count == NULL ||
        get_count(&count) != CUDA_SUCCESS) {
        pthread_mutex_unlock(&kgpu__shim.dev_mu);
        return; /* before cuInit: try again later */
    }
    for (int d = 0; d < count && d < KGPU_SHIM_MAX_CUDA_DEVICES; d++) {
        char u2[40] = "", u1[40] = "";
        int have2 = uuid_of(d, KGPU_FN_cuDeviceGetUuid_v2, u2, sizeof(u2)) == 0;
        int have1 = uuid_of(d, KGPU_FN_cuDeviceGetUuid, u1, sizeof(u1)) == 0;
        int li = -1;
        if (have2)
            li = kgpu__uuid_index(u2);
        if (li < 0 && have1)
            li = kgpu__uuid_index(u1);
        if (!have1 && !have2)
            li = d < kgpu__shim.limits.ndevices ? d : -1;
        kgpu__shim.devmap[d] = (int16_t)li;
        cap_to_device(d, li);
        if (li < 0 && atomic_exchange(&kgpu__shim.warned, 1) == 0) {
            char line[200];
            snprintf(line, sizeof(line),
                     "CUDA device %d (%s) is not in the limits file: nothing can be allocated "
                     "on it",
                     d,
                     have2   ? u2
                     : have1 ? u1
                             : "UUID unknown");
            kgpu__say(line);
        }
    }
    atomic_store_explicit(&kgpu__shim.dev_mapped, 1, memory_order_release);
    pthread_mutex_unlock(&kgpu__shim.dev_mu);
}

CUdevice kgpu__cuda_dev(int li)
{
    kgpu__map_devices();
    if (li < 0 || !atomic_load_explicit(&kgpu__shim.dev_mapped, memory_order_acquire))
        return -1;
    for (int d = 0; d < KGPU_SHIM_MAX_CUDA_DEVICES; d++)
        if (kgpu__shim.devmap[d] == li)
            return d;
    return -1;
}

int kgpu__dev_index(CUdevice dev)
{
    kgpu__map_devices();
    if (!atomic_load_explicit(&kgpu__shim.dev_mapped, memory_order_acquire))
        return -2;
    if (dev < 0 || dev >= KGPU_SHIM_MAX_CUDA_DEVICES)
        return -1;
    return kgpu__shim.devmap[dev];
}

/* The current context's device (li -2 before cuInit). */
CUresult kgpu__where_current(kgpu_where *w)
{
    CUdevice dev;
    CUresult r = KGPU_REAL(cuCtxGetCurrent)(&w->ctx);
    if (r != CUDA_SUCCESS)
        return r;
    /* A retained primary context (what the runtime API uses) names its device: no driver call. */
    int n = atomic_load_explicit(&kgpu__shim.nprimary, memory_order_acquire);
    for (int d = 0; d < n && w->ctx != NULL; d++)
        if (atomic_load_explicit(&kgpu__shim.primary[d].ctx, memory_order_relaxed) == w->ctx) {
            w->li = kgpu__dev_index(d);
            w->dev = d;
            return CUDA_SUCCESS;
        }
    r = KGPU_REAL(cuCtxGetDevice)(&dev);
    if (r == CUDA_SUCCESS) {
        w->li = kgpu__dev_index(dev);
        w->dev = dev;
    }
    return r;
}

/* The device of a stream's context (asynchronous allocations land there). */
CUresult kgpu__where_stream(CUstream s, kgpu_where *w)
{
    kgpu__pfn_cuStreamGetCtx get = KGPU_REAL(cuStreamGetCtx);
    kgpu__pfn_cuCtxPushCurrent_v2 push = KGPU_REAL(cuCtxPushCurrent_v2);
    kgpu__pfn_cuCtxPopCurrent_v2 pop = KGPU_REAL(cuCtxPopCurrent_v2);
    CUcontext ctx, popped;
    CUresult r = kgpu__where_current(w);
    if (r != CUDA_SUCCESS || s == NULL || s == STREAM_LEGACY || s == STREAM_PER_THREAD ||
        get == NULL || get(s, &ctx) != CUDA_SUCCESS || ctx == w->ctx || push == NULL || pop == NULL)
        return r;
    /* Another context's stream: ask that context for its device. */
    if ((r = push(ctx)) != CUDA_SUCCESS)
        return r;
    r = kgpu__where_current(w);
    pop(&popped);
    return r;
}
