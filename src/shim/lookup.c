/*
 * Every way a program looks a driver function up, and the hook it gets
 * instead: the table of hooks generated from hooks.def, dlsym and dlvsym
 * (interposed here), and cuGetProcAddress / cuGetProcAddress_v2, through
 * which CUDA 11.3+ runtimes fetch every driver function. (By symbol, the
 * application binds to the exported hooks themselves: the library is
 * preloaded.) Nothing below this file knows the hooks' addresses.
 *
 * compat.h is told that this file defines dlvsym: its .symver for it would
 * version the definition below.
 */
#define KGPU_SHIM_DEFINES_DLVSYM
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "compat.h"
#include "lookup.h"

/* ---- the table generated from hooks.def ---- */

/* The hook functions by index (CALL entries: NULL). */
#define KGPU__ADDR_HOOK(name) (void *)name
#define KGPU__ADDR_CALL(name) NULL
static void *const hooks[KGPU_FN_COUNT] = {
#define X(lib, name, use, need, since, ret, params) [KGPU_FN_##name] = KGPU__ADDR_##use(name),
#include "hooks.def"
#undef X
};

static int hooked_index(const char *name);

void *kgpu__hook_named(const char *name)
{
    int i = hooked_index(name);
    return i >= 0 ? hooks[i] : NULL;
}

/* Index of the hooked entry called `name`, or -1. Not a hot path (dlsym). */
static int hooked_index(const char *name)
{
    if (name == NULL || !((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
        return -1;
    for (int i = 0; i < KGPU_FN_COUNT; i++)
        if (kgpu__entries[i].use == KGPU_USE_HOOK && strcmp(kgpu__entries[i].name, name) == 0)
            return i;
    return -1;
}

/* ---- cuGetProcAddress: which hook replaces what the driver returned ---- */

/* Length of `name` without a "_ptsz" and then a "_v<digits>" suffix. */
static size_t base_len(const char *name, int *ptsz)
{
    size_t n = strlen(name);
    *ptsz = n > 5 && strcmp(name + n - 5, "_ptsz") == 0;
    if (*ptsz)
        n -= 5;
    size_t k = n;
    while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9')
        k--;
    if (k < n && k >= 2 && name[k - 1] == 'v' && name[k - 2] == '_')
        n = k - 2;
    return n;
}

/*
 * What cuGetProcAddress(symbol, version, flags) should hand out instead of
 * `fn`, the driver's answer: the hook whose real function is `fn`; failing
 * that (a driver that returns internal addresses), the hooked variant that
 * the name and version select (the newest whose `since` <= version, the
 * _ptsz one for per-thread default streams). Otherwise `fn` itself.
 */
static void *proc_substitute(const char *symbol, void *fn, int version, cuuint64_t flags)
{
    if (fn == NULL || symbol == NULL)
        return fn;
    for (int i = 0; i < KGPU_FN_COUNT; i++)
        if (kgpu__entries[i].use == KGPU_USE_HOOK && kgpu__real(i) == fn)
            return hooks[i];
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    /* From CUDA 12.0 the name cuGraphInstantiate means cuGraphInstantiateWithFlags. */
    if (strcmp(symbol, "cuGraphInstantiate") == 0 && version >= 12000)
        symbol = "cuGraphInstantiateWithFlags";
    size_t n = strlen(symbol);
    int best = -1;
    for (int i = 0; i < KGPU_FN_COUNT; i++) {
        int ptsz;
        if (kgpu__entries[i].use != KGPU_USE_HOOK || kgpu__entries[i].lib != KGPU_LIB_CUDA ||
            base_len(kgpu__entries[i].name, &ptsz) != n ||
            strncmp(kgpu__entries[i].name, symbol, n) != 0 || kgpu__entries[i].since > version ||
            kgpu__real(i) == NULL)
            continue;
        if (best < 0 || kgpu__entries[i].since > kgpu__entries[best].since ||
            (kgpu__entries[i].since == kgpu__entries[best].since && ptsz == want_ptsz))
            best = i;
    }
    return best >= 0 ? hooks[best] : fn;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    KGPU_ENTER(cuGetProcAddress, (symbol, pfn, cudaVersion, flags));
    CUresult r = real_(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = proc_substitute(symbol, *pfn, cudaVersion, flags);
    return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    KGPU_ENTER(cuGetProcAddress_v2, (symbol, pfn, cudaVersion, flags, symbolStatus));
    CUresult r = real_(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = proc_substitute(symbol, *pfn, cudaVersion, flags);
    return r;
}

/* ---- what a lookup hands out ---- */

KGPU_EXPORT void *dlvsym(void *restrict handle, const char *restrict name,
                         const char *restrict version);

/*
 * What a lookup of `name` that found `p` should hand out: the library's
 * own dlsym and dlvsym, or the hook of a hooked driver function; `p`
 * itself when there are no limits at all.
 */
static void *lookup_result(const char *name, void *p)
{
    if (p == NULL || name == NULL)
        return p;
    void *ours = strcmp(name, "dlsym") == 0    ? (void *)dlsym
                 : strcmp(name, "dlvsym") == 0 ? (void *)dlvsym
                                               : kgpu__hook_named(name);
    /* Only a name that matters reads the limits: other lookups cost a process nothing. */
    return ours == NULL || kgpu__config() == KGPU_MODE_PASS ? p : ours;
}

/* ---- dlsym ---- */

/*
 * dlsym(RTLD_NEXT, name) on behalf of the code at `caller`: glibc resolves
 * RTLD_NEXT relative to whoever calls it, which would be this library, so
 * walk the objects loaded after the caller's and take the first that
 * defines `name` itself.
 */
static void *next_after(const void *caller, const char *name)
{
    kgpu__dlsym_fn sym = kgpu__real_dlsym();
    Dl_info info;
    struct link_map *self = NULL;
    if (sym == NULL)
        return NULL;
    if (!dladdr1(caller, &info, (void **)&self, RTLD_DL_LINKMAP) || self == NULL)
        return sym(RTLD_NEXT, name);
    for (struct link_map *l = self->l_next; l != NULL; l = l->l_next) {
        if (l->l_name == NULL || l->l_name[0] == '\0')
            continue;
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        void *p = sym(h, name);
        dlclose(h);
        struct link_map *owner = NULL;
        if (p != NULL && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == l)
            return p;
    }
    return NULL;
}

KGPU_EXPORT void *dlsym(void *restrict handle, const char *restrict name)
{
    void *p;
    if (handle == RTLD_NEXT)
        p = next_after(__builtin_return_address(0), name);
    else {
        kgpu__dlsym_fn sym = kgpu__real_dlsym();
        p = sym != NULL ? sym(handle, name) : NULL;
    }
    /* A hooked name the driver has, or dlsym/dlvsym: ours, unless there are no limits at all. */
    return lookup_result(name, p);
}

/* ---- dlvsym ---- */

/*
 * dlvsym(RTLD_NEXT, ...) on behalf of the code at `caller`: the first
 * object loaded after the caller's that defines the symbol itself.
 */
static void *next_after_v(const void *caller, const char *name, const char *version)
{
    Dl_info info;
    struct link_map *self = NULL;
    if (!dladdr1(caller, &info, (void **)&self, RTLD_DL_LINKMAP) || self == NULL)
        return NULL;
    for (struct link_map *l = self->l_next; l != NULL; l = l->l_next) {
        if (l->l_name == NULL || l->l_name[0] == '\0')
            continue;
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        void *p = kgpu__real_dlvsym(h, name, version);
        dlclose(h);
        struct link_map *owner = NULL;
        if (p != NULL && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == l)
            return p;
    }
    return NULL;
}

void *dlvsym(void *restrict handle, const char *restrict name, const char *restrict version)
{
    void *p = handle == RTLD_NEXT ? next_after_v(__builtin_return_address(0), name, version)
                                  : kgpu__real_dlvsym(handle, name, version);
    return lookup_result(name, p);
}
