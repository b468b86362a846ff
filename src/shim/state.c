/*
 * libkgpu-limit.so's process-wide state and its one decision per process:
 * whether it enforces anything (a limits file present and usable) and,
 * when it does, the container's accounting region and the fork handlers.
 * What cannot be enforced is refused (failing closed), said once.
 *
 * Rules for code in this library: it runs inside any process of the
 * container, so it never exits, never touches signal handlers or the umask,
 * writes only in the accounting directory, and prints at most one line per
 * reason.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compat.h"
#include "state.h"

#define LIMITS_PATH     "/etc/kgpu/limits"
#define SHARED_DIR      "/var/run/kgpu"
#define SCHED_DIR       "/var/run/kgpu-gpu" /* node-wide, one schedule file per GPU */
#define LIMITS_MAX_SIZE (64 * 1024)
#define MADV_WIPEONFORK_ 18 /* Linux 4.14; older kernels say EINVAL */

static int same_file(int fd, const kgpu_vmm_export *e)
{
    struct stat st;
    return fcntl(fd, F_GETFD) != -1 && kgpu_shim_fstat(fd, &st) == 0 &&
           (uint64_t)st.st_dev == e->dev && (uint64_t)st.st_ino == e->ino;
}

/*
 * Whether any descriptor of this process still refers to an exported
 * file (vmm.h's is_open): the driver keeps the memory while the export's
 * open file description lives, and a dup() of it, with the original
 * closed, keeps it as well. The number it was handed out under is asked
 * first; only when that no longer refers to it are all descriptors
 * looked at (/proc/self/fd), which happens at a release or when a
 * reservation would fail, never on the allocation path.
 */
static int export_open(const kgpu_vmm_export *e)
{
    if (same_file(e->fd, e))
        return 1;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    int found = 0;
    for (struct dirent *de; !found && (de = readdir(d)) != NULL;) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        found = de->d_name[0] != '.' && *end == '\0' && fd != dirfd(d) && fd >= 0 &&
                fd <= INT_MAX && same_file((int)fd, e);
    }
    closedir(d);
    return found;
}

kgpu_shim_state kgpu__shim = {
    .config_once = PTHREAD_ONCE_INIT,
    .cuda_once = PTHREAD_ONCE_INIT,
    .nvml_once = PTHREAD_ONCE_INIT,
    .dev_mu = PTHREAD_MUTEX_INITIALIZER,
    .prim_mu = PTHREAD_MUTEX_INITIALIZER,
    .track = KGPU_TRACK_INIT,
    .vmm = KGPU_VMM_INIT(export_open),
    .pool_mu = PTHREAD_MUTEX_INITIALIZER,
    .sched_mu = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- failing closed ---- */

void kgpu__set_failed(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kgpu__shim.reason, sizeof(kgpu__shim.reason), fmt, ap);
    va_end(ap);
    atomic_store(&kgpu__shim.mode, KGPU_MODE_FAILED);
}

/* One write(2) of one line: no stdio state of the application is touched. */
void kgpu__say(const char *line)
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
        kgpu__say(line);
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
        kgpu__set_failed("cannot open limits file %s: %s", path, strerror(errno));
        return -1;
    }
    if (kgpu_shim_fstat(fd, id) != 0) {
        kgpu__set_failed("cannot stat limits file %s: %s", path, strerror(errno));
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
        kgpu__set_failed("out of memory reading %s", path);
        return -1;
    }
    if (n < 0) {
        kgpu__set_failed("cannot read limits file %s: %s", path, strerror(e));
        free(buf);
        return -1;
    }
    if (len > LIMITS_MAX_SIZE) {
        kgpu__set_failed("limits file %s is larger than %d bytes", path, LIMITS_MAX_SIZE);
        free(buf);
        return -1;
    }
    kgpu_error err = {0};
    int rc = kgpu_shim_limits_parse(buf, len, path, &kgpu__shim.limits, &err);
    free(buf);
    if (rc != KGPU_OK) {
        kgpu__set_failed("%s", err.msg);
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
    atomic_store(&kgpu__shim.captures, 0);  /* a child has no captures of its own */
    atomic_fetch_add(&kgpu__shim.lmem_gen, 1); /* nor the contexts its thread's cache names */
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
        kgpu__set_failed("accounting region: %s", err.msg);
        return;
    }
    if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) {
        kgpu__set_failed("cannot register fork handlers");
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

