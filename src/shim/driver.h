/*
 * The driver layer of libkgpu-limit.so, above state.h: the real CUDA and
 * NVML functions, resolved once from the list in hooks.def (real.c), and
 * which device and line of the limits file a call lands on (devices.c).
 */
#ifndef KGPU_SHIM_DRIVER_H
#define KGPU_SHIM_DRIVER_H

#include "state.h"

/* ---- real.c ---- */

enum { KGPU_LIB_CUDA, KGPU_LIB_NVML };
enum { KGPU_USE_HOOK, KGPU_USE_CALL };
enum { KGPU_NEED_REQUIRED, KGPU_NEED_OPTIONAL };

/* One entry of hooks.def: X(lib, name, use, need, since, ...). */
typedef struct kgpu_entry {
    const char *name;
    unsigned char lib, use, need; /* KGPU_LIB_*, KGPU_USE_*, KGPU_NEED_* */
    int since;
} kgpu_entry;

/* Generated from hooks.def, indexed by KGPU_FN_<name>. */
extern const kgpu_entry kgpu__entries[KGPU_FN_COUNT];

/* kgpu__config, then the real CUDA functions resolved once; returns the mode. */
int kgpu__cuda(void);

/* kgpu__config, then the real NVML functions resolved once; returns the mode. */
int kgpu__nvml(void);

/* The real function of entry i (NULL when the driver lacks it). */
static inline void *kgpu__real(int i)
{
    return atomic_load_explicit(&kgpu__shim.real[i], memory_order_relaxed);
}

#define KGPU_REAL(name) ((kgpu__pfn_##name)kgpu__real(KGPU_FN_##name))

/*
 * The start of every CUDA hook. Resolves the driver once, then:
 * pass-through without limits, refusal with unusable ones,
 * CUDA_ERROR_NOT_FOUND when the driver lacks the function. Leaves `real_`
 * set to the driver's function.
 */
#define KGPU_ENTER(name, args)                                                                     \
    int mode_ = kgpu__cuda();                                                                      \
    kgpu__pfn_##name real_ = KGPU_REAL(name);                                                      \
    if (mode_ == KGPU_MODE_PASS)                                                                   \
        return real_ != NULL ? real_ args : CUDA_ERROR_NOT_FOUND;                                  \
    if (mode_ != KGPU_MODE_ACTIVE)                                                                 \
        return kgpu__refuse();                                                                     \
    if (real_ == NULL)                                                                             \
    return CUDA_ERROR_NOT_FOUND

/* ---- devices.c ---- */

/* Maps CUDA ordinals to limits entries if not done yet (needs cuInit to have succeeded). */
void kgpu__map_devices(void);

/*
 * Limits index of CUDA device `dev`; -1: on no line, nothing may be
 * allocated there; -2: not known before cuInit has succeeded.
 */
int kgpu__dev_index(CUdevice dev);

/* The CUDA ordinal of limits index li (first match), or -1. */
CUdevice kgpu__cuda_dev(int li);

/* Limits index whose uuid matches `uuid` ("GPU-..."/"MIG-..." or bare), or -1. */
int kgpu__uuid_index(const char *uuid);

#define STREAM_LEGACY     ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)

/* Where an allocation lands: limits index charged, CUDA ordinal, the context it dies with. */
typedef struct kgpu_where {
    int li;
    CUdevice dev;
    CUcontext ctx;
} kgpu_where;

/* The current context's device (li -2 before cuInit). */
CUresult kgpu__where_current(kgpu_where *w);

/* The device of a stream's context. */
CUresult kgpu__where_stream(CUstream s, kgpu_where *w);

#endif
