/*
 * The real CUDA and NVML functions, resolved once per process from the
 * list in hooks.def (CUDA at the first hook, NVML at the first NVML hook)
 * by dlopen of the drivers' sonames. With limits in force, a driver that
 * lacks a REQUIRED function is named once and CUDA refused (failing closed).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "compat.h"
#include "driver.h"

const kgpu_entry kgpu__entries[KGPU_FN_COUNT] = {
#define X(lib, name, use, need, since, ret, params)                                                \
    [KGPU_FN_##name] = {#name, KGPU_LIB_##lib, KGPU_USE_##use, KGPU_NEED_##need, since},
#include "hooks.def"
#undef X
};

/* Resolves every entry of `lib` from `handle`; lists missing required ones into `missing`. */
static void resolve(int lib, void *handle, char *missing, size_t size)
{
    kgpu__dlsym_fn sym = kgpu__real_dlsym();
    size_t off = 0;
    missing[0] = '\0';
    for (int i = 0; i < KGPU_FN_COUNT; i++) {
        if (kgpu__entries[i].lib != lib)
            continue;
        void *f = handle != NULL && sym != NULL ? sym(handle, kgpu__entries[i].name) : NULL;
        atomic_store_explicit(&kgpu__shim.real[i], f, memory_order_relaxed);
        if (f == NULL && kgpu__entries[i].need == KGPU_NEED_REQUIRED && off < size) {
            int n = snprintf(missing + off, size - off, "%s%s", off ? ", " : "",
                             kgpu__entries[i].name);
            off += n > 0 ? (size_t)n : 0;
        }
    }
}

static void cuda_once(void)
{
    char missing[512];
    kgpu__shim.cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    resolve(KGPU_LIB_CUDA, kgpu__shim.cuda_lib, missing, sizeof(missing));
    if (atomic_load(&kgpu__shim.mode) != KGPU_MODE_ACTIVE)
        return; /* pass-through needs nothing; a failure is already recorded */
    if (kgpu__shim.cuda_lib == NULL)
        kgpu__set_failed("cannot load the CUDA driver libcuda.so.1");
    else if (missing[0] != '\0')
        kgpu__set_failed("the CUDA driver lacks %s, which limits cannot be enforced without",
                         missing);
}

int kgpu__cuda(void)
{
    if (!atomic_load_explicit(&kgpu__shim.cuda_ready, memory_order_acquire)) {
        kgpu__config();
        pthread_once(&kgpu__shim.cuda_once, cuda_once);
        atomic_store_explicit(&kgpu__shim.cuda_ready, 1, memory_order_release);
    }
    int mode = atomic_load_explicit(&kgpu__shim.mode, memory_order_relaxed);
    if (mode == KGPU_MODE_ACTIVE && kgpu__shim.fork_mark != NULL &&
        __builtin_expect(*kgpu__shim.fork_mark == 0, 0))
        kgpu__forked_quietly();
    return mode;
}

static void nvml_once(void)
{
    char missing[256];
    kgpu__shim.nvml_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    resolve(KGPU_LIB_NVML, kgpu__shim.nvml_lib, missing, sizeof(missing));
    if (kgpu__shim.nvml_lib != NULL && missing[0] != '\0' &&
        atomic_load(&kgpu__shim.mode) == KGPU_MODE_ACTIVE) {
        char line[400];
        snprintf(line, sizeof(line), "NVML lacks %s: its memory figures are refused", missing);
        kgpu__say(line);
    }
}

int kgpu__nvml(void)
{
    if (!atomic_load_explicit(&kgpu__shim.nvml_ready, memory_order_acquire)) {
        kgpu__config();
        pthread_once(&kgpu__shim.nvml_once, nvml_once);
        atomic_store_explicit(&kgpu__shim.nvml_ready, 1, memory_order_release);
    }
    return atomic_load_explicit(&kgpu__shim.mode, memory_order_relaxed);
}
