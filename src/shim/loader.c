/*
 * The loader's ways to the driver that lookups do not cover, above
 * lookup.c: this library's dlopen and dlmopen.
 *
 * RTLD_DEEPBIND: an object opened with it resolves its own references in
 * its own dependencies first (the driver, the C library's dlsym), past
 * this library. So after such a dlopen, the GOT entries of the objects it
 * loaded that name a hooked function, dlsym, dlvsym, dlopen or dlmopen are
 * rewritten to the library's, as the loader would have bound them without
 * the flag.
 *
 * dlmopen: a new link-map namespace gets its own copy of every library, the
 * driver included, and not this one. The driver is refused there (the
 * dlmopen fails, with one line on stderr), and the objects of such a
 * namespace get their dlopen/dlmopen rewritten as above, so that a later
 * load of the driver from inside it is refused too.
 *
 * glibc's dlopen and dlmopen use the caller's address (its namespace, its
 * RUNPATH, $ORIGIN): the plain case is a tail call, which leaves the
 * caller's return address in place; the rewritten cases call glibc with a
 * path resolved as the caller's search path would resolve it (dlinfo
 * RTLD_DI_SERINFO), in the caller's namespace.
 *
 * compat.h is told that this file defines dlopen, and names dlvsym (its
 * address, for the rewritten GOT entries): its .symver for them would
 * version the definition and the reference below.
 */
#define KGPU_SHIM_DEFINES_DLVSYM
#define KGPU_SHIM_DEFINES_DLOPEN
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "compat.h"
#include "lookup.h"

KGPU_EXPORT void *dlopen(const char *file, int mode);
KGPU_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode);

/* The link map of the object containing `addr`, or NULL. */
static struct link_map *map_of(const void *addr)
{
    Dl_info info;
    struct link_map *l = NULL;
    return dladdr1(addr, &info, (void **)&l, RTLD_DL_LINKMAP) && l != NULL ? l : NULL;
}

static Lmid_t namespace_of(struct link_map *l)
{
    Lmid_t id = LM_ID_BASE;
    if (l == NULL || dlinfo(l, RTLD_DI_LMID, &id) != 0) /* a link map is a handle in glibc */
        return LM_ID_BASE;
    return id;
}

static struct link_map *first_of(struct link_map *l)
{
    while (l != NULL && l->l_prev != NULL)
        l = l->l_prev;
    return l;
}

/* The objects of a namespace before a load (to tell the new ones after it). */
typedef struct snapshot {
    struct link_map **maps;
    size_t n;
} snapshot;

static void take_snapshot(struct link_map *any, snapshot *s)
{
    size_t n = 0;
    for (struct link_map *l = first_of(any); l != NULL; l = l->l_next)
        n++;
    s->maps = calloc(n ? n : 1, sizeof(*s->maps));
    s->n = 0;
    for (struct link_map *l = first_of(any); l != NULL && s->maps != NULL && s->n < n;
         l = l->l_next)
        s->maps[s->n++] = l;
}

static int in_snapshot(const snapshot *s, const struct link_map *l)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->maps[i] == l)
            return 1;
    return 0;
}

static int is_driver(const struct link_map *l)
{
    return l->l_name != NULL && strstr(l->l_name, "libcuda.so") != NULL;
}

/* glibc's own objects and this library: their references are left as they are. */
static int leave_alone(const struct link_map *l)
{
    static const char *const names[] = {"/libc.so", "/libdl.so", "/ld-linux", "/libpthread.so"};
    if (l == map_of((const void *)&map_of) || l->l_name == NULL || l->l_name[0] == '\0')
        return 1;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strstr(l->l_name, names[i]) != NULL)
            return 1;
    return 0;
}

/*
 * What a reference to `name` from a rewritten object should reach; NULL:
 * leave it. In the base namespace (base: 1) the lookups and the driver's
 * functions; in another one only the loads, since lookups there must stay
 * within that namespace (glibc's dlsym(RTLD_DEFAULT) searches the caller's)
 * and the driver is never there.
 */
static void *rebind_target(const char *name, int base)
{
    if (strcmp(name, "dlopen") == 0)
        return (void *)dlopen;
    if (strcmp(name, "dlmopen") == 0)
        return (void *)dlmopen;
    if (!base)
        return NULL;
    if (strcmp(name, "dlsym") == 0)
        return (void *)dlsym;
    if (strcmp(name, "dlvsym") == 0)
        return (void *)dlvsym;
    return kgpu__hook_named(name);
}

/* The PT_GNU_RELRO range of the object loaded at `base` named `name` (0, 0 when none). */
typedef struct relro {
    ElfW(Addr) base;
    const char *name;
    uintptr_t start, end;
} relro;

static int find_relro(struct dl_phdr_info *info, size_t size, void *data)
{
    relro *r = data;
    (void)size;
    if (info->dlpi_addr != r->base || info->dlpi_name == NULL ||
        strcmp(info->dlpi_name, r->name) != 0)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
            r->start = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            r->end = r->start + info->dlpi_phdr[i].p_memsz;
        }
    return 1;
}

/*
 * Writes `value` into the GOT slot at `slot`: a page of the RELRO segment,
 * read-only once relocated, is made writable for the write and read-only
 * again; other GOT pages are writable already.
 */
static void write_slot(void **slot, void *value, const relro *r)
{
    if (*slot == value)
        return;
    uintptr_t a = (uintptr_t)slot;
    if (a < r->start || a >= r->end) {
        *slot = value;
        return;
    }
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = a & ~(uintptr_t)(page - 1);
    if (mprotect((void *)start, (size_t)page, PROT_READ | PROT_WRITE) != 0)
        return;
    *slot = value;
    mprotect((void *)start, (size_t)page, PROT_READ);
}

#if defined(__x86_64__)
#define R_GLOB_DAT  R_X86_64_GLOB_DAT
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#elif defined(__aarch64__)
#define R_GLOB_DAT  R_AARCH64_GLOB_DAT
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#endif

/* Rewrites object l's GOT entries that rebind_target names (base: in the base namespace). */
static void rebind(struct link_map *l, int base)
{
#if defined(R_GLOB_DAT)
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *rela[2] = {NULL, NULL};
    size_t relasz[2] = {0, 0};
    for (const ElfW(Dyn) *d = l->l_ld; d != NULL && d->d_tag != DT_NULL; d++) {
        ElfW(Addr) a = d->d_un.d_ptr < l->l_addr ? d->d_un.d_ptr + l->l_addr : d->d_un.d_ptr;
        switch (d->d_tag) {
        case DT_SYMTAB:
            symtab = (const ElfW(Sym) *)a;
            break;
        case DT_STRTAB:
            strtab = (const char *)a;
            break;
        case DT_JMPREL:
            rela[0] = (const ElfW(Rela) *)a;
            break;
        case DT_PLTRELSZ:
            relasz[0] = d->d_un.d_val;
            break;
        case DT_RELA:
            rela[1] = (const ElfW(Rela) *)a;
            break;
        case DT_RELASZ:
            relasz[1] = d->d_un.d_val;
            break;
        }
    }
    if (symtab == NULL || strtab == NULL)
        return;
    relro r = {.base = l->l_addr, .name = l->l_name};
    dl_iterate_phdr(find_relro, &r);
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; rela[t] != NULL && i < relasz[t] / sizeof(ElfW(Rela)); i++) {
            unsigned type = (unsigned)ELF64_R_TYPE(rela[t][i].r_info);
            size_t sym = (size_t)ELF64_R_SYM(rela[t][i].r_info);
            if ((type != R_GLOB_DAT && type != R_JUMP_SLOT) || sym == 0)
                continue;
            void *to = rebind_target(strtab + symtab[sym].st_name, base);
            if (to != NULL)
                write_slot((void **)(l->l_addr + rela[t][i].r_offset), to, &r);
        }
#else
    (void)l;
    (void)base;
#endif
}

/*
 * The path glibc would load `file` from for the code in `caller`: as
 * given when it has a '/' ($ORIGIN expanded), else the first match in the
 * caller's search path (LD_LIBRARY_PATH, RPATH/RUNPATH, system
 * directories); NULL to let glibc search (its cache). *buf owns it.
 */
static const char *resolve(struct link_map *caller, const char *file, char **buf)
{
    *buf = NULL;
    if (file == NULL || caller == NULL)
        return file;
    if (strncmp(file, "$ORIGIN/", 8) == 0 || strncmp(file, "${ORIGIN}/", 10) == 0) {
        char origin[4096];
        if (dlinfo(caller, RTLD_DI_ORIGIN, origin) != 0)
            return file;
        size_t n = strlen(origin) + strlen(file) + 2;
        if ((*buf = malloc(n)) == NULL)
            return file;
        snprintf(*buf, n, "%s/%s", origin, strchr(file, '/') + 1);
        return *buf;
    }
    if (strchr(file, '/') != NULL)
        return file;
    Dl_serinfo size;
    if (dlinfo(caller, RTLD_DI_SERINFOSIZE, &size) != 0)
        return file;
    Dl_serinfo *info = malloc(size.dls_size);
    if (info == NULL)
        return file;
    info->dls_size = size.dls_size;
    info->dls_cnt = size.dls_cnt;
    if (dlinfo(caller, RTLD_DI_SERINFOSIZE, info) == 0 &&
        dlinfo(caller, RTLD_DI_SERINFO, info) == 0)
        for (unsigned i = 0; i < info->dls_cnt && *buf == NULL; i++) {
            size_t n = strlen(info->dls_serpath[i].dls_name) + strlen(file) + 2;
            char *path = malloc(n);
            if (path == NULL)
                break;
            snprintf(path, n, "%s/%s", info->dls_serpath[i].dls_name, file);
            if (access(path, F_OK) == 0)
                *buf = path;
            else
                free(path);
        }
    free(info);
    return *buf != NULL ? *buf : file;
}

static void say_refused(void)
{
    static const char line[] = "kgpu-limit: the CUDA driver cannot be loaded into a dlmopen "
                               "namespace while limits apply: refused\n";
    ssize_t n = write(STDERR_FILENO, line, sizeof(line) - 1);
    (void)n;
}

/*
 * A load that needs watching: with RTLD_DEEPBIND, or into a namespace
 * other than the base one. Loads as the caller would, then rewrites the
 * new objects (the driver's functions too, in the base namespace) or, in
 * another namespace, refuses the driver.
 */
static __attribute__((noinline)) void *watched_open(Lmid_t lmid, const char *file, int mode,
                                                   const void *ret)
{
    struct link_map *caller = map_of(ret);
    char *buf;
    const char *path = resolve(caller, file, &buf);
    snapshot before = {NULL, 0};
    struct link_map *here = lmid == LM_ID_BASE ? map_of((const void *)&map_of) : NULL;
    if (here != NULL)
        take_snapshot(here, &before);
    void *h = lmid == LM_ID_BASE ? kgpu__real_dlopen()(path, mode)
                                 : kgpu__real_dlmopen()(lmid, path, mode);
    free(buf);
    if (h == NULL || file == NULL) {
        free(before.maps);
        return h;
    }
    struct link_map *l = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &l) != 0 || l == NULL) {
        free(before.maps);
        return h;
    }
    int base = namespace_of(l) == LM_ID_BASE;
    if (!base) {
        for (struct link_map *m = first_of(l); m != NULL; m = m->l_next)
            if (is_driver(m)) {
                dlclose(h);
                say_refused();
                free(before.maps);
                return NULL;
            }
    }
    for (struct link_map *m = first_of(l); m != NULL; m = m->l_next)
        if (!leave_alone(m) && !is_driver(m) && !in_snapshot(&before, m))
            rebind(m, base);
    free(before.maps);
    return h;
}

/* Whether `file`, as the code at `ret` would find it, is the driver itself. */
static int names_driver(const char *file, const void *ret)
{
    char *buf;
    const char *path = resolve(map_of(ret), file, &buf);
    const char *base = path != NULL ? strrchr(path, '/') : NULL;
    int driver = path != NULL && strstr(base != NULL ? base : path, "libcuda.so") != NULL;
    free(buf);
    return driver;
}

enum { OPEN_PLAIN, OPEN_WATCHED, OPEN_REFUSED };

/*
 * How a dlopen from `ret` goes: plain (no limits, or nothing to watch);
 * watched (RTLD_DEEPBIND, or from another namespace); refused. glibc's
 * dlmopen rejects RTLD_GLOBAL outside the base namespace, where its dlopen
 * accepts it: such a load stays glibc's own call, refused only when it
 * names the driver.
 */
static __attribute__((noinline)) int how_to_open(const char *file, int mode, const void *ret)
{
    int foreign = namespace_of(map_of(ret)) != LM_ID_BASE;
    /* Only a load that needs watching reads the limits. */
    if ((!foreign && (mode & RTLD_DEEPBIND) == 0) || kgpu__config() != KGPU_MODE_ACTIVE)
        return OPEN_PLAIN;
    if (foreign && (mode & RTLD_GLOBAL)) {
        if (!names_driver(file, ret))
            return OPEN_PLAIN;
        say_refused();
        return OPEN_REFUSED;
    }
    return foreign || (mode & RTLD_DEEPBIND) != 0 ? OPEN_WATCHED : OPEN_PLAIN;
}

/*
 * The plain case is a tail call: glibc then sees the caller's return
 * address, as if called directly (optimize attribute: even in -O0 builds).
 */
__attribute__((optimize("O2", "optimize-sibling-calls"))) KGPU_EXPORT void *dlopen(const char *file,
                                                                            int mode)
{
    const void *ret = __builtin_return_address(0);
    int how = how_to_open(file, mode, ret);
    if (how == OPEN_REFUSED)
        return NULL;
    if (how == OPEN_WATCHED)
        return watched_open(namespace_of(map_of(ret)), file, mode, ret);
    return kgpu__real_dlopen()(file, mode);
}

__attribute__((optimize("O2", "optimize-sibling-calls"))) KGPU_EXPORT void *dlmopen(Lmid_t lmid,
                                                                             const char *file,
                                                                             int mode)
{
    const void *ret = __builtin_return_address(0);
    if ((lmid != LM_ID_BASE || (mode & RTLD_DEEPBIND) != 0) && kgpu__config() == KGPU_MODE_ACTIVE)
        return watched_open(lmid, file, mode, ret);
    return kgpu__real_dlmopen()(lmid, file, mode);
}
