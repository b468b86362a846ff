/*
 * The loader's other ways to the driver: dlvsym, and glibc's own dlsym or
 * dlvsym fetched through either. libkgpu-limit.so exports dlvsym; whatever
 * route names a hooked function, or dlsym/dlvsym themselves, gets the
 * library's. To call glibc's dlvsym without coming back here (every
 * reference in this library binds to its own export first), it is looked
 * up once in the C library's symbol table directly.
 *
 * compat.h is told that this file defines dlvsym: its .symver for dlvsym
 * would version the definition below.
 */
#define KGPU_SHIM_DEFINES_DLVSYM
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>
#include <unistd.h>

#include "compat.h"
#include "shim.h"

typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static _Atomic(dlvsym_fn) real_dlvsym_ptr;

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s != '\0'; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

/* The address of the definition of `name` in object l (its GNU hash table), or NULL. */
static void *elf_lookup(const struct link_map *l, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gh = NULL;
    for (const ElfW(Dyn) *d = l->l_ld; d != NULL && d->d_tag != DT_NULL; d++) {
        /* The loader has relocated these on the architectures the library builds for. */
        ElfW(Addr) a = d->d_un.d_ptr < l->l_addr ? d->d_un.d_ptr + l->l_addr : d->d_un.d_ptr;
        if (d->d_tag == DT_SYMTAB)
            symtab = (const ElfW(Sym) *)a;
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)a;
        else if (d->d_tag == DT_GNU_HASH)
            gh = (const uint32_t *)a;
    }
    if (symtab == NULL || strtab == NULL || gh == NULL || gh[0] == 0)
        return NULL;
    uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_size = gh[2];
    const ElfW(Addr) *bloom = (const ElfW(Addr) *)&gh[4];
    const uint32_t *buckets = (const uint32_t *)&bloom[bloom_size];
    const uint32_t *chain = &buckets[nbuckets];
    uint32_t h = gnu_hash(name);
    for (uint32_t i = buckets[h % nbuckets]; i >= symoffset; i++) {
        uint32_t c = chain[i - symoffset];
        if ((c | 1) == (h | 1) && symtab[i].st_shndx != SHN_UNDEF &&
            strcmp(strtab + symtab[i].st_name, name) == 0)
            return (void *)(l->l_addr + symtab[i].st_value);
        if (c & 1)
            break;
    }
    return NULL;
}

/* glibc's dlvsym: in libc.so.6 since 2.34, in libdl.so.2 before. */
void *kgpu__real_dlvsym(void *handle, const char *name, const char *version)
{
    dlvsym_fn f = atomic_load_explicit(&real_dlvsym_ptr, memory_order_acquire);
    if (f == NULL) {
        Dl_info info;
        struct link_map *l = NULL;
        if (!dladdr1((void *)&getpid, &info, (void **)&l, RTLD_DL_LINKMAP) || l == NULL)
            return NULL;
        while (l->l_prev != NULL)
            l = l->l_prev;
        for (; l != NULL && f == NULL; l = l->l_next)
            if (l->l_name != NULL &&
                (strstr(l->l_name, "/libc.so") != NULL || strstr(l->l_name, "/libdl.so") != NULL))
                f = (dlvsym_fn)elf_lookup(l, "dlvsym");
        if (f == NULL)
            return NULL;
        atomic_store_explicit(&real_dlvsym_ptr, f, memory_order_release);
    }
    return f(handle, name, version);
}

/*
 * dlvsym(RTLD_NEXT, ...) on behalf of the code at `caller`: the first
 * object loaded after the caller's that defines the symbol itself.
 */
static void *next_after(const void *caller, const char *name, const char *version)
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

KGPU_EXPORT void *dlvsym(void *restrict handle, const char *restrict name,
                         const char *restrict version);

/*
 * What a lookup of `name` that found `p` should hand out: the library's
 * own dlsym and dlvsym, or the hook of a hooked driver function; `p`
 * itself when there are no limits at all.
 */
void *kgpu__lookup_result(const char *name, void *p)
{
    if (p == NULL || name == NULL || kgpu__config() == KGPU_MODE_PASS)
        return p;
    if (strcmp(name, "dlsym") == 0)
        return (void *)dlsym;
    if (strcmp(name, "dlvsym") == 0)
        return (void *)dlvsym;
    void *hook = kgpu__hook_named(name);
    return hook != NULL ? hook : p;
}

void *dlvsym(void *restrict handle, const char *restrict name, const char *restrict version)
{
    void *p = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), name, version)
                                  : kgpu__real_dlvsym(handle, name, version);
    return kgpu__lookup_result(name, p);
}
