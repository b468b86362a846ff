/*
 * glibc's own dlvsym, dlsym, dlopen and dlmopen, for the library's code to
 * call without coming back into its own interposers: every reference in
 * this library binds to its own export first, so glibc's dlvsym is looked
 * up once in the C library's symbol table, and the others through it under
 * their version names.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>
#include <unistd.h>

#include "compat.h"
#include "state.h"

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

/* glibc's own dlsym, found with glibc's dlvsym under its version names. */
kgpu__dlsym_fn kgpu__real_dlsym(void)
{
    static _Atomic(kgpu__dlsym_fn) real_dlsym_ptr;
    kgpu__dlsym_fn f = atomic_load_explicit(&real_dlsym_ptr, memory_order_acquire);
    if (f != NULL)
        return f;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && f == NULL; i++)
        f = (kgpu__dlsym_fn)kgpu__real_dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    atomic_store_explicit(&real_dlsym_ptr, f, memory_order_release);
    return f;
}

static void *real_fn(const char *name)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.3.4",
                                           "GLIBC_2.17", "GLIBC_2.1", "GLIBC_2.0"};
    void *f = NULL;
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && f == NULL; i++)
        f = kgpu__real_dlvsym(RTLD_NEXT, name, versions[i]);
    return f;
}

kgpu__dlopen_fn kgpu__real_dlopen(void)
{
    static _Atomic(kgpu__dlopen_fn) f;
    kgpu__dlopen_fn g = atomic_load_explicit(&f, memory_order_acquire);
    if (g == NULL) {
        g = (kgpu__dlopen_fn)real_fn("dlopen");
        atomic_store_explicit(&f, g, memory_order_release);
    }
    return g;
}

kgpu__dlmopen_fn kgpu__real_dlmopen(void)
{
    static _Atomic(kgpu__dlmopen_fn) f;
    kgpu__dlmopen_fn g = atomic_load_explicit(&f, memory_order_acquire);
    if (g == NULL) {
        g = (kgpu__dlmopen_fn)real_fn("dlmopen");
        atomic_store_explicit(&f, g, memory_order_release);
    }
    return g;
}
