/*
 * libkgpu-limit.so, the frame: decides once per process whether it enforces
 * anything (limits file present and usable), resolves the real driver
 * functions once, and hands out the hooks however the application looks the
 * driver up: by symbol (the library exports them and is preloaded), through
 * dlsym (interposed here), and through cuGetProcAddress (hooked in hooks.c,
 * which asks kgpu__proc_substitute here). The hooks themselves are in
 * hooks.c; the accounting in region.c and track.c.
 *
 * Rules for code here: it runs inside any process of the container, so it
 * never exits, never touches signal handlers or the umask, writes only in
 * the accounting directory, and prints at most one line per reason.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compat.h"
#include "shim.h"

#define LIMITS_PATH     "/etc/kgpu/limits"
#define SHARED_DIR      "/var/run/kgpu"
#define SCHED_DIR       "/var/run/kgpu-gpu" /* node-wide, one schedule file per GPU */
#define LIMITS_MAX_SIZE (64 * 1024)
#define MADV_WIPEONFORK_ 18 /* Linux 4.14; older kernels say EINVAL */

kgpu_shim_state kgpu__shim = {
    .config_once = PTHREAD_ONCE_INIT,
    .cuda_once = PTHREAD_ONCE_INIT,
    .nvml_once = PTHREAD_ONCE_INIT,
    .dev_mu = PTHREAD_MUTEX_INITIALIZER,
    .prim_mu = PTHREAD_MUTEX_INITIALIZER,
    .track = KGPU_TRACK_INIT,
    .vmm = KGPU_VMM_INIT(kgpu__export_open),
    .pool_mu = PTHREAD_MUTEX_INITIALIZER,
    .sched_mu = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- the table generated from hooks.def ---- */

enum { LIB_CUDA, LIB_NVML };
enum { USE_HOOK, USE_CALL };
enum { NEED_REQUIRED, NEED_OPTIONAL };

typedef struct entry {
    const char *name;
    unsigned char lib, use, need;
    int since;
} entry;

static const entry entries[KGPU_FN_COUNT] = {
#define X(lib, name, use, need, since, ret, params)                                                \
    [KGPU_FN_##name] = {#name, LIB_##lib, USE_##use, NEED_##need, since},
#include "hooks.def"
#undef X
};

/* The hook functions by index (CALL entries: NULL). */
#define KGPU__ADDR_HOOK(name) (void *)name
#define KGPU__ADDR_CALL(name) NULL
static void *const hooks[KGPU_FN_COUNT] = {
#define X(lib, name, use, need, since, ret, params) [KGPU_FN_##name] = KGPU__ADDR_##use(name),
#include "hooks.def"
#undef X
};

void *kgpu__hook(int i)
{
    return i >= 0 && i < KGPU_FN_COUNT ? hooks[i] : NULL;
}

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
        if (entries[i].use == USE_HOOK && strcmp(entries[i].name, name) == 0)
            return i;
    return -1;
}

/* ---- the real dlsym ---- */

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym_ptr;

/* glibc's own dlsym, found with glibc's dlvsym (loader.c) under its version names. */
static dlsym_fn real_dlsym(void)
{
    dlsym_fn f = atomic_load_explicit(&real_dlsym_ptr, memory_order_acquire);
    if (f != NULL)
        return f;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && f == NULL; i++)
        f = (dlsym_fn)kgpu__real_dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    atomic_store_explicit(&real_dlsym_ptr, f, memory_order_release);
    return f;
}

/* ---- failing closed ---- */

__attribute__((format(printf, 1, 2))) static void set_failed(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kgpu__shim.reason, sizeof(kgpu__shim.reason), fmt, ap);
    va_end(ap);
    atomic_store(&kgpu__shim.mode, KGPU_MODE_FAILED);
}

/* One write(2) of one line: no stdio state of the application is touched. */
static void say(const char *line)
{
    char buf[700];
    int n = snprintf(buf, sizeof(buf), "kgpu-limit: %s\n", line);
    if (n > (int)sizeof(buf) - 1)
        n = (int)sizeof(buf) - 1;
    ssize_t rc = write(STDERR_FILENO, buf, (size_t)n);
    (void)rc;
}

CUresult kgpu__refuse(void)
{
    if (atomic_exchange(&kgpu__shim.told, 1) == 0) {
        char line[680];
        snprintf(line, sizeof(line), "%s; GPU access is refused in this process",
                 kgpu__shim.reason);
        say(line);
    }
    return CUDA_ERROR_NOT_INITIALIZED;
}

/* ---- configuration: the limits file and the region ---- */

static const char *env(const char *name)
{
    const char *v = secure_getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* Where the limits came from. */
enum { LIMITS_NONE, LIMITS_MOUNTED, LIMITS_ENV };

/* The fixed paths, under $KGPU_TEST_ROOT in test builds (the installed library has no such
 * variable). */
static const char *root(void)
{
#ifdef KGPU_SHIM_TEST_ROOT
    if (env("KGPU_TEST_ROOT") != NULL)
        return env("KGPU_TEST_ROOT");
#endif
    return "";
}

/*
 * Where the limits come from: /etc/kgpu/limits whenever anything exists at
 * that path (lstat, so neither a dangling link nor an unreadable file lets
 * KGPU_LIMITS_FILE in); otherwise KGPU_LIMITS_FILE; otherwise nowhere.
 */
static int limits_path(char *out, size_t size)
{
    snprintf(out, size, "%s%s", root(), LIMITS_PATH);
    struct stat st;
    if (kgpu_shim_lstat(out, &st) == 0 || (errno != ENOENT && errno != ENOTDIR))
        return LIMITS_MOUNTED;
    const char *alt = env("KGPU_LIMITS_FILE");
    if (alt == NULL)
        return LIMITS_NONE;
    snprintf(out, size, "%s", alt);
    return LIMITS_ENV;
}

/* Reads and parses the limits file; *id gets its device and inode. */
static int read_limits(const char *path, struct stat *id)
{
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        set_failed("cannot open limits file %s: %s", path, strerror(errno));
        return -1;
    }
    if (kgpu_shim_fstat(fd, id) != 0) {
        set_failed("cannot stat limits file %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    buf = malloc(LIMITS_MAX_SIZE + 1);
    size_t len = 0;
    ssize_t n = 0;
    while (buf != NULL && len <= LIMITS_MAX_SIZE &&
           (n = read(fd, buf + len, LIMITS_MAX_SIZE + 1 - len)) > 0)
        len += (size_t)n;
    int e = errno;
    close(fd);
    if (buf == NULL) {
        set_failed("out of memory reading %s", path);
        return -1;
    }
    if (n < 0) {
        set_failed("cannot read limits file %s: %s", path, strerror(e));
        free(buf);
        return -1;
    }
    if (len > LIMITS_MAX_SIZE) {
        set_failed("limits file %s is larger than %d bytes", path, LIMITS_MAX_SIZE);
        free(buf);
        return -1;
    }
    kgpu_error err = {0};
    int rc = kgpu_shim_limits_parse(buf, len, path, &kgpu__shim.limits, &err);
    free(buf);
    if (rc != KGPU_OK) {
        set_failed("%s", err.msg);
        return -1;
    }
    return 0;
}

/*
 * KGPU_CONTEXT_MIB: the least charged per context, measured or not (0:
 * unset). It can only raise the charge: set from inside the container, a
 * lower figure would buy memory.
 */
static uint64_t context_floor(void)
{
    const char *v = env("KGPU_CONTEXT_MIB");
    if (v != NULL) {
        char *end;
        errno = 0;
        unsigned long long m = strtoull(v, &end, 10);
        if (errno == 0 && *end == '\0' && m < (1ULL << 32))
            return (uint64_t)m << 20;
    }
    return 0;
}

/*
 * The order every path takes these locks in: prim_mu, then dev_mu, then
 * pool_mu, then the virtual memory table's, then the allocation table's.
 */
static void fork_prepare(void)
{
    pthread_mutex_lock(&kgpu__shim.prim_mu);
    pthread_mutex_lock(&kgpu__shim.dev_mu);
    pthread_mutex_lock(&kgpu__shim.pool_mu);
    pthread_mutex_lock(&kgpu__shim.vmm.mu);
    pthread_mutex_lock(&kgpu__shim.track.mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&kgpu__shim.track.mu);
    pthread_mutex_unlock(&kgpu__shim.vmm.mu);
    pthread_mutex_unlock(&kgpu__shim.pool_mu);
    pthread_mutex_unlock(&kgpu__shim.dev_mu);
    pthread_mutex_unlock(&kgpu__shim.prim_mu);
}

/*
 * The child has none of the parent's GPU state (CUDA contexts do not
 * survive fork): it starts with no allocations, no retained contexts and
 * no slot of its own in the region.
 */
static void fork_child(void)
{
    pthread_mutex_init(&kgpu__shim.dev_mu, NULL);
    pthread_mutex_init(&kgpu__shim.prim_mu, NULL);
    for (int d = 0; d < KGPU_SHIM_MAX_CUDA_DEVICES; d++) {
        kgpu__shim.primary[d].refs = 0;
        atomic_store(&kgpu__shim.primary[d].ctx, NULL);
    }
    atomic_store(&kgpu__shim.nprimary, 0);
    kgpu_track_forked(&kgpu__shim.track);
    kgpu_vmm_forked(&kgpu__shim.vmm);
    pthread_mutex_init(&kgpu__shim.pool_mu, NULL);
    kgpu__shim.npools = 0; /* the array is the parent's copy: reused */
    memset(kgpu__shim.graph_charged, 0, sizeof(kgpu__shim.graph_charged));
    if (kgpu__shim.fork_mark != NULL)
        *kgpu__shim.fork_mark = 1;
    if (kgpu__shim.region != NULL)
        kgpu_shim_region_forked(kgpu__shim.region);
    for (int li = 0; li < KGPU_SHIM_MAX_DEVICES; li++)
        kgpu_sched_forked(atomic_load(&kgpu__shim.sched[li]));
}

/*
 * A child made by _Fork(), clone() or a raw fork syscall ran no fork
 * handlers: its inherited state is the parent's. The first hooked call that
 * sees the wiped mark drops it, as fork_child would have.
 */
void kgpu__forked_quietly(void)
{
    if (__atomic_exchange_n(kgpu__shim.fork_mark, 1, __ATOMIC_ACQ_REL) == 0)
        fork_child();
}

/* At exit: what this process holds goes back now rather than when a reservation next fails. */
__attribute__((destructor)) static void leave_region(void)
{
    if (atomic_load(&kgpu__shim.mode) == KGPU_MODE_ACTIVE && kgpu__shim.region != NULL)
        kgpu_shim_region_leave(kgpu__shim.region);
}

static void config_once(void)
{
    char path[4096], dir[4096], name[64];
    struct stat id;
    int from = limits_path(path, sizeof(path));
    if (from == LIMITS_NONE) {
        atomic_store(&kgpu__shim.mode, KGPU_MODE_PASS);
        return;
    }
    if (read_limits(path, &id) != 0)
        return;
    for (int i = 0; i < kgpu__shim.limits.ndevices; i++)
        kgpu__shim.limit_bytes[i] = kgpu__shim.limits.dev[i].memory_mib << 20;
    kgpu__shim.context_floor = context_floor();
    kgpu__shim.context_bytes = (uint64_t)KGPU_SHIM_CONTEXT_MIB << 20;
    if (kgpu__shim.context_floor > kgpu__shim.context_bytes)
        kgpu__shim.context_bytes = kgpu__shim.context_floor;
    for (int i = 0; i < KGPU_SHIM_MAX_CUDA_DEVICES; i++)
        kgpu__shim.devmap[i] = -1;

    /*
     * Which region. With the mounted limits file, nothing a process can set
     * decides it, or a process could account apart from its container (a
     * fresh region: a second full share): the plugin's fixed directory, and
     * a name from the limits file's identity, which is one host file per
     * container. Otherwise (KGPU_LIMITS_FILE) the environment names both.
     */
    if (from == LIMITS_MOUNTED) {
        snprintf(dir, sizeof(dir), "%s%s", root(), SHARED_DIR);
        snprintf(name, sizeof(name), "limits-%llx-%llx", (unsigned long long)id.st_dev,
                 (unsigned long long)id.st_ino);
        snprintf(kgpu__shim.sched_dir, sizeof(kgpu__shim.sched_dir), "%s%s", root(), SCHED_DIR);
    } else {
        snprintf(dir, sizeof(dir), "%s",
                 env("KGPU_SHARED_DIR") ? env("KGPU_SHARED_DIR") : SHARED_DIR);
        snprintf(name, sizeof(name), "%.63s",
                 env("KGPU_CONTAINER") ? env("KGPU_CONTAINER") : "default");
        snprintf(kgpu__shim.sched_dir, sizeof(kgpu__shim.sched_dir), "%s",
                 env("KGPU_SCHED_DIR") ? env("KGPU_SCHED_DIR") : SCHED_DIR);
    }
    /* Compute shares are scheduled among containers, each known by its region's name. */
    snprintf(kgpu__shim.sched_id, sizeof(kgpu__shim.sched_id), "%s", name);
    for (int i = 0; i < kgpu__shim.limits.ndevices; i++)
        if (kgpu__shim.limits.dev[i].core_pct >= 0 && kgpu__shim.limits.dev[i].core_pct < 100)
            atomic_store(&kgpu__shim.compute_limited, 1);
    kgpu_error err = {0};
    if (kgpu_shim_region_attach(dir, name, &kgpu__shim.limits, &kgpu__shim.region, &err) !=
        KGPU_OK) {
        set_failed("accounting region: %s", err.msg);
        return;
    }
    if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) {
        set_failed("cannot register fork handlers");
        return;
    }
    void *page = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page != MAP_FAILED &&
        madvise(page, (size_t)sysconf(_SC_PAGESIZE), MADV_WIPEONFORK_) == 0) {
        kgpu__shim.fork_mark = page;
        *kgpu__shim.fork_mark = 1;
    } else if (page != MAP_FAILED) {
        munmap(page, (size_t)sysconf(_SC_PAGESIZE)); /* old kernel: the region still checks pids */
    }
    atomic_store(&kgpu__shim.mode, KGPU_MODE_ACTIVE);
}

int kgpu__config(void)
{
    int mode = atomic_load_explicit(&kgpu__shim.mode, memory_order_acquire);
    if (mode != KGPU_MODE_UNKNOWN)
        return mode;
    pthread_once(&kgpu__shim.config_once, config_once);
    return atomic_load(&kgpu__shim.mode);
}

/* ---- the real functions ---- */

/* Resolves every entry of `lib` from `handle`; lists missing required ones into `missing`. */
static void resolve(int lib, void *handle, char *missing, size_t size)
{
    dlsym_fn sym = real_dlsym();
    size_t off = 0;
    missing[0] = '\0';
    for (int i = 0; i < KGPU_FN_COUNT; i++) {
        if (entries[i].lib != lib)
            continue;
        void *f = handle != NULL && sym != NULL ? sym(handle, entries[i].name) : NULL;
        atomic_store_explicit(&kgpu__shim.real[i], f, memory_order_relaxed);
        if (f == NULL && entries[i].need == NEED_REQUIRED && off < size) {
            int n = snprintf(missing + off, size - off, "%s%s", off ? ", " : "", entries[i].name);
            off += n > 0 ? (size_t)n : 0;
        }
    }
}

static void cuda_once(void)
{
    char missing[512];
    kgpu__shim.cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    resolve(LIB_CUDA, kgpu__shim.cuda_lib, missing, sizeof(missing));
    if (atomic_load(&kgpu__shim.mode) != KGPU_MODE_ACTIVE)
        return; /* pass-through needs nothing; a failure is already recorded */
    if (kgpu__shim.cuda_lib == NULL)
        set_failed("cannot load the CUDA driver libcuda.so.1");
    else if (missing[0] != '\0')
        set_failed("the CUDA driver lacks %s, which limits cannot be enforced without", missing);
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
    resolve(LIB_NVML, kgpu__shim.nvml_lib, missing, sizeof(missing));
    if (kgpu__shim.nvml_lib != NULL && missing[0] != '\0' &&
        atomic_load(&kgpu__shim.mode) == KGPU_MODE_ACTIVE) {
        char line[400];
        snprintf(line, sizeof(line), "NVML lacks %s: its memory figures are refused", missing);
        say(line);
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

/* ---- devices ---- */

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
        if (li < 0 && atomic_exchange(&kgpu__shim.warned, 1) == 0) {
            char line[200];
            snprintf(line, sizeof(line),
                     "CUDA device %d (%s) is not in the limits file: nothing can be allocated "
                     "on it",
                     d,
                     have2   ? u2
                     : have1 ? u1
                             : "UUID unknown");
            say(line);
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
void *kgpu__proc_substitute(const char *symbol, void *fn, int version, cuuint64_t flags)
{
    if (fn == NULL || symbol == NULL)
        return fn;
    for (int i = 0; i < KGPU_FN_COUNT; i++)
        if (entries[i].use == USE_HOOK && kgpu__real(i) == fn)
            return hooks[i];
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    /* From CUDA 12.0 the name cuGraphInstantiate means cuGraphInstantiateWithFlags. */
    if (strcmp(symbol, "cuGraphInstantiate") == 0 && version >= 12000)
        symbol = "cuGraphInstantiateWithFlags";
    size_t n = strlen(symbol);
    int best = -1;
    for (int i = 0; i < KGPU_FN_COUNT; i++) {
        int ptsz;
        if (entries[i].use != USE_HOOK || entries[i].lib != LIB_CUDA ||
            base_len(entries[i].name, &ptsz) != n || strncmp(entries[i].name, symbol, n) != 0 ||
            entries[i].since > version || kgpu__real(i) == NULL)
            continue;
        if (best < 0 || entries[i].since > entries[best].since ||
            (entries[i].since == entries[best].since && ptsz == want_ptsz))
            best = i;
    }
    return best >= 0 ? hooks[best] : fn;
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
    dlsym_fn sym = real_dlsym();
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
        dlsym_fn sym = real_dlsym();
        p = sym != NULL ? sym(handle, name) : NULL;
    }
    /* A hooked name the driver has, or dlsym/dlvsym: ours, unless there are no limits at all. */
    return kgpu__lookup_result(name, p);
}
