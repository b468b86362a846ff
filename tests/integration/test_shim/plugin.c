/*
 * A library the probe opens with RTLD_DEEPBIND or dlmopen, as a framework
 * opens a plugin with a CUDA runtime inside: it reaches the driver through
 * its own references to dlopen and dlsym, and (PLUGIN_LINKED) through its
 * own link to the driver. Built without sanitizers, like the probe.
 */
#include <dlfcn.h>
#include <stddef.h>

#include "cudadecl.h"

#define PLUGIN_EXPORT __attribute__((visibility("default")))

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

/* cuMemAlloc_v2 through dlopen and dlsym of the driver; -1 when the driver cannot be loaded. */
PLUGIN_EXPORT int plugin_alloc_dlsym(size_t bytes, CUdeviceptr *p);
int plugin_alloc_dlsym(size_t bytes, CUdeviceptr *p)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    alloc_fn alloc = NULL;
    if (h == NULL)
        return -1;
    *(void **)&alloc = dlsym(h, "cuMemAlloc_v2");
    return alloc != NULL ? alloc(p, bytes) : -1;
}

PLUGIN_EXPORT int plugin_free_dlsym(CUdeviceptr p);
int plugin_free_dlsym(CUdeviceptr p)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    free_fn release = NULL;
    if (h == NULL)
        return -1;
    *(void **)&release = dlsym(h, "cuMemFree_v2");
    return release != NULL ? release(p) : -1;
}

/* Whether dlopen(name, RTLD_NOW | RTLD_GLOBAL) from here succeeds. */
PLUGIN_EXPORT int plugin_open_global(const char *name);
int plugin_open_global(const char *name)
{
    return dlopen(name, RTLD_NOW | RTLD_GLOBAL) != NULL;
}

#ifdef PLUGIN_LINKED
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

/* cuMemAlloc_v2 by the plugin's own reference to it. */
PLUGIN_EXPORT int plugin_alloc_linked(size_t bytes, CUdeviceptr *p);
int plugin_alloc_linked(size_t bytes, CUdeviceptr *p)
{
    return cuMemAlloc_v2(p, bytes);
}

PLUGIN_EXPORT int plugin_free_linked(CUdeviceptr p);
int plugin_free_linked(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}
#endif
