/*
 * The shared accounting region (layout and contract in region.h).
 *
 * The counters change without a lock on the hot path: a reservation adds
 * to its own process's slot, then claims room in the device's total with a
 * compare-and-swap that refuses to pass the limit (taking its slot's bytes
 * back when refused); a release takes from the total, then from its slot.
 * Only the owner writes a live slot, and the total is the one gate of the
 * limit, so no interleaving lets the total pass it. The process-shared
 * robust mutex guards the slot table only: taking a slot, freeing one,
 * reclaiming the dead. Robust, so that a process killed while holding it
 * does not block the container: the next locker gets EOWNERDEAD and
 * carries on.
 *
 * Whenever a dead process's slot is freed, each device's total is counted
 * again from the live slots. The order of the two steps above makes that
 * count safe to race with live processes: at any instant a live slot holds
 * at least what it has in the total, so a count can only find more than is
 * held (kept until the next count), never less; and a process that dies
 * between its two steps leaves its slot holding what the total lacks or
 * more, which the count settles.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compat.h"
#include "region.h"

_Static_assert(offsetof(kgpu_region_file, lock) == 64, "region header is 64 bytes");
_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits its place in the region");
_Static_assert(sizeof(kgpu_region_device) == 64, "device records are 64 bytes");
_Static_assert(sizeof(kgpu_region_slot) == 16 + 8 * KGPU_SHIM_MAX_DEVICES, "slot layout");

struct kgpu_shim_region {
    kgpu_region_file *map;
    int slot;       /* this process's slot, -1 before its first reservation */
    pid_t pid;      /* the process that owns `slot` */
    uint64_t start; /* its start time */
    uint32_t pidns; /* its PID namespace */
    int fd;         /* the region, open (not the mapped description): holds the slot's lock */
    /*
     * The process has the driver's descriptors open (its driver client):
     * a child forked from then on inherits them, and so keeps this
     * process's device memory alive; it then keeps `fd` open too, and with
     * it the slot's lock (become_child).
     */
    bool client;
    /*
     * A page the kernel zeroes in a child (MADV_WIPEONFORK): *mark == 0
     * means this handle was inherited by a child that did not go through
     * kgpu_shim_region_forked. NULL where the kernel cannot: getpid() then.
     */
    volatile uint8_t *mark;
    pid_t attacher; /* getpid() when the mark was last set, for the fallback */
    char path[PATH_MAX];
};

/* Slot s's liveness lock is byte LOCK_BASE + s of the file (past its end: no data is locked). */
#define LOCK_BASE ((off_t)sizeof(kgpu_region_file))

#ifndef F_OFD_GETLK
#define F_OFD_GETLK  36
#define F_OFD_SETLK  37
#endif
#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

/*
 * Relaxed loads and stores: a live slot has one writer (its process); the
 * totals change by compare-and-swap (reserve_total, release_total); only
 * their values matter, no other memory is published through them.
 */
static uint64_t get(_Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

static void put(_Atomic uint64_t *a, uint64_t v)
{
    atomic_store_explicit(a, v, memory_order_relaxed);
}

static int name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 128 || name[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Reads /proc/<pid>/stat; returns its state letter and start time, or 0 state if unreadable. */
static char read_stat(pid_t pid, uint64_t *start, int *err_no)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err_no = errno;
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    *err_no = n < 0 ? errno : 0;
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: fields go on after the last ')'.
     */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ' || p[2] == '\0')
        return 0;
    char state = p[2];
    p += 3; /* the space before field 4 */
    for (int field = 4; field <= 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return 0;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return state;
}

/* Inode of this process's PID namespace ("pid:[4026531836]"), or 0. */
static uint32_t own_pidns(void)
{
    char buf[64];
    ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *p = strchr(buf, '[');
    return p != NULL ? (uint32_t)strtoul(p + 1, NULL, 10) : 0;
}

/* The slot lock at byte LOCK_BASE + s through fd: F_WRLCK to take, F_UNLCK to drop. 0 or -1. */
static int slot_lock(int fd, int s, short type)
{
    if (fd < 0)
        return -1;
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = LOCK_BASE + s, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* 1 when some other open file description holds slot s's lock, 0 when none does, -1 unknown. */
static int slot_locked(int fd, int s)
{
    if (fd < 0)
        return -1;
    struct flock fl = {
        .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = LOCK_BASE + s, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

uint64_t kgpu_shim_process_start_time(pid_t pid)
{
    uint64_t start = 0;
    int e;
    return read_stat(pid, &start, &e) ? start : 0;
}

int kgpu_shim_process_alive(pid_t pid, uint64_t start_time)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    uint64_t start = 0;
    int e = 0;
    char state = read_stat(pid, &start, &e);
    if (state == 0)
        return e != ENOENT && e != ESRCH; /* exited meanwhile; other errors: assume it runs */
    if (state == 'Z' || state == 'X')
        return 0; /* exited: the driver has already given its memory back */
    return start_time == 0 || start == start_time;
}

/* Makes used[] agree with the live slots again (lock held; see the comment at the top). */
static void recount(kgpu_region_file *f)
{
    for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (int s = 0; s < KGPU_REGION_SLOTS; s++)
            if (atomic_load_explicit(&f->slot[s].pid, memory_order_relaxed) != 0)
                sum += get(&f->slot[s].bytes[d]);
        put(&f->dev[d].used, sum);
    }
}

static int lock(kgpu_shim_region *r)
{
    int rc = pthread_mutex_lock(&r->map->lock.mutex);
    if (rc == EOWNERDEAD) {
        recount(r->map);
        rc = pthread_mutex_consistent(&r->map->lock.mutex);
    }
    return rc;
}

static void unlock(kgpu_shim_region *r)
{
    pthread_mutex_unlock(&r->map->lock.mutex);
}

/* Claims b in a device's total unless that passes limit: true when claimed. */
static bool reserve_total(_Atomic uint64_t *used, uint64_t b, uint64_t limit)
{
    uint64_t u = atomic_load_explicit(used, memory_order_relaxed);
    do {
        if (b > limit || u > limit - b)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(used, &u, u + b, memory_order_relaxed,
                                                    memory_order_relaxed));
    return true;
}

/* Gives b back to a device's total (never below 0). */
static void release_total(_Atomic uint64_t *used, uint64_t b)
{
    uint64_t u = atomic_load_explicit(used, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(used, &u, u > b ? u - b : 0,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/*
 * Frees a dead process's slot s (lock held): its bytes go, and the totals
 * are counted again from the live slots, whatever step it died between.
 */
static void free_dead_slot(kgpu_region_file *f, int s)
{
    for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++)
        put(&f->slot[s].bytes[d], 0);
    f->slot[s].start_time = 0;
    atomic_store_explicit(&f->slot[s].pid, 0, memory_order_relaxed);
    recount(f);
}

/*
 * Lock held. Whether the owner of slot s (pid) still runs. Its slot lock
 * settles it when held; otherwise a pid of this PID namespace is looked up;
 * a pid of another namespace means nothing here, so the lock alone decides
 * (and where locks are unknown, the slot is left alone).
 */
static int owner_alive(kgpu_shim_region *r, int s, pid_t pid)
{
    const kgpu_region_slot *sl = &r->map->slot[s];
    int held = slot_locked(r->fd, s);
    if (held == 1)
        return 1;
    if (sl->pidns == 0 || r->pidns == 0 || sl->pidns == r->pidns)
        return kgpu_shim_process_alive(pid, sl->start_time);
    return held != 0;
}

/* Lock held. A slot with this process's pid and start time but not its own is from before an exec.
 */
static int reclaim_locked(kgpu_shim_region *r)
{
    kgpu_region_file *f = r->map;
    int n = 0;
    if (r->pidns == 0)
        r->pidns = own_pidns();
    if (r->start == 0) {
        r->pid = getpid();
        r->start = kgpu_shim_process_start_time(r->pid);
    }
    for (int s = 0; s < KGPU_REGION_SLOTS; s++) {
        pid_t pid = atomic_load_explicit(&f->slot[s].pid, memory_order_relaxed);
        if (pid == 0 || s == r->slot)
            continue;
        /* Unless a child forked before that exec still holds its client (and its lock). */
        int stale = pid == r->pid && f->slot[s].start_time == r->start &&
                    (f->slot[s].pidns == 0 || f->slot[s].pidns == r->pidns) &&
                    slot_locked(r->fd, s) != 1;
        if (stale || !owner_alive(r, s, pid)) {
            free_dead_slot(f, s);
            n++;
        }
    }
    return n;
}

int kgpu_shim_region_reclaim(kgpu_shim_region *r)
{
    if (lock(r) != 0)
        return 0;
    int n = reclaim_locked(r);
    unlock(r);
    return n;
}

/*
 * Lock held: takes a free slot for this process, reclaiming dead ones
 * first, and its liveness lock (a slot whose lock someone still holds is
 * passed over).
 */
static int take_slot(kgpu_shim_region *r)
{
    r->pid = getpid();
    r->start = kgpu_shim_process_start_time(r->pid);
    r->pidns = own_pidns();
    reclaim_locked(r);
    for (int s = 0; s < KGPU_REGION_SLOTS; s++) {
        kgpu_region_slot *sl = &r->map->slot[s];
        if (atomic_load_explicit(&sl->pid, memory_order_relaxed) != 0)
            continue;
        if (slot_lock(r->fd, s, F_WRLCK) != 0 && r->fd >= 0 && errno != EINVAL)
            continue; /* EAGAIN: held by a process that lost the slot but lives */
        for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++)
            put(&sl->bytes[d], 0);
        sl->pidns = r->pidns;
        sl->start_time = r->start;
        atomic_store_explicit(&sl->pid, r->pid, memory_order_relaxed);
        r->slot = s;
        return 0;
    }
    return -1;
}

/*
 * Re-arms the fork mark and opens the file again for a slot of the child's
 * own. The inherited description is the parent's, holding its slot's lock.
 * Where the parent had its driver client open, the child holds that client
 * too (the driver's descriptors are inherited), and the parent's device
 * memory lives until both are gone: the child then keeps the description
 * open, so the parent's slot stays alive by its lock even after the
 * parent exits. Both are close-on-exec, so an exec() in the child lets go
 * of both at once. Without a client there is nothing to keep alive.
 */
static void become_child(kgpu_shim_region *r)
{
    r->slot = -1;
    r->start = 0;
    if (r->mark != NULL)
        *r->mark = 1;
    r->attacher = getpid();
    if (r->fd >= 0 && !r->client)
        close(r->fd);
    r->client = false; /* the child's own client, if it opens one, is another */
    r->fd = open(r->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
}

void kgpu_shim_region_client(kgpu_shim_region *r)
{
    if (kgpu_shim_region_same_process(r))
        r->client = true;
}

int kgpu_shim_region_same_process(kgpu_shim_region *r)
{
    int same = r->mark != NULL ? *r->mark != 0 : getpid() == r->attacher;
    if (!same)
        become_child(r);
    return same;
}

/*
 * Adds b to (or, add false, takes b from, never below 0) this process's own
 * slot: only its threads write there.
 */
static void own_add(_Atomic uint64_t *mine, uint64_t b, bool add)
{
    if (add) {
        atomic_fetch_add_explicit(mine, b, memory_order_relaxed);
        return;
    }
    uint64_t h = atomic_load_explicit(mine, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(mine, &h, h > b ? h - b : 0,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

int kgpu_shim_region_reserve(kgpu_shim_region *r, int dev, uint64_t bytes, uint64_t limit)
{
    if (dev < 0 || dev >= KGPU_SHIM_MAX_DEVICES || bytes > limit)
        return KGPU_ENOFIT; /* and the slot never has to hold what no total could */
    kgpu_shim_region_same_process(r);
    if (r->slot < 0) { /* the first reservation of this process: a slot, under the lock */
        if (lock(r) != 0)
            return KGPU_ESTATE;
        int rc = r->slot < 0 ? take_slot(r) : 0;
        unlock(r);
        if (rc != 0)
            return KGPU_ESTATE;
    }
    kgpu_region_file *f = r->map;
    _Atomic uint64_t *mine = &f->slot[r->slot].bytes[dev];
    own_add(mine, bytes, true); /* first the slot: see the comment at the top */
    if (reserve_total(&f->dev[dev].used, bytes, limit))
        return KGPU_OK;
    own_add(mine, bytes, false);
    /* Over the limit: perhaps only because of the dead, or of a count a dead locker spoilt. */
    if (lock(r) != 0)
        return KGPU_ESTATE;
    reclaim_locked(r);
    unlock(r);
    own_add(mine, bytes, true);
    if (reserve_total(&f->dev[dev].used, bytes, limit))
        return KGPU_OK;
    own_add(mine, bytes, false);
    return KGPU_ENOFIT;
}

void kgpu_shim_region_release(kgpu_shim_region *r, int dev, uint64_t bytes)
{
    if (dev < 0 || dev >= KGPU_SHIM_MAX_DEVICES || bytes == 0 ||
        !kgpu_shim_region_same_process(r) || r->slot < 0)
        return;
    kgpu_region_file *f = r->map;
    _Atomic uint64_t *mine = &f->slot[r->slot].bytes[dev];
    uint64_t held = get(mine);
    uint64_t b = bytes < held ? bytes : held;
    release_total(&f->dev[dev].used, b); /* first the total: see the comment at the top */
    own_add(mine, b, false);
}

uint64_t kgpu_shim_region_used(const kgpu_shim_region *r, int dev)
{
    if (dev < 0 || dev >= KGPU_SHIM_MAX_DEVICES)
        return 0;
    return get(&r->map->dev[dev].used);
}

uint64_t kgpu_shim_region_mine(kgpu_shim_region *r, int dev)
{
    if (dev < 0 || dev >= KGPU_SHIM_MAX_DEVICES || !kgpu_shim_region_same_process(r) ||
        r->slot < 0)
        return 0;
    return get(&r->map->slot[r->slot].bytes[dev]);
}

/*
 * Lock held, at leave: drops this handle's own reference to the slot's
 * lock (closing its description) and asks through a fresh one whether
 * another process still holds it: a child that inherited the description
 * together with the driver client. 1 held, 0 not, -1 unknown. r->fd is
 * the fresh description afterwards.
 */
static int lock_outlives_us(kgpu_shim_region *r)
{
    if (r->fd < 0)
        return -1;
    close(r->fd);
    r->fd = open(r->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    return slot_locked(r->fd, r->slot);
}

void kgpu_shim_region_leave(kgpu_shim_region *r)
{
    /* A child that never said it was one must not free the slot it inherited. */
    if (!kgpu_shim_region_same_process(r) || r->slot < 0 || lock(r) != 0)
        return;
    kgpu_region_file *f = r->map;
    /*
     * A forked child still holding the driver client keeps this process's
     * memory alive: the slot stays, held by the child's lock, and is
     * reclaimed once that child is gone too.
     */
    if (lock_outlives_us(r) == 1) {
        r->slot = -1;
        r->client = false;
        unlock(r);
        return;
    }
    for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++) {
        _Atomic uint64_t *mine = &f->slot[r->slot].bytes[d];
        uint64_t b = get(mine);
        release_total(&f->dev[d].used, b);
        own_add(mine, b, false);
    }
    f->slot[r->slot].start_time = 0;
    atomic_store_explicit(&f->slot[r->slot].pid, 0, memory_order_relaxed);
    r->slot = -1;
    unlock(r);
}

void kgpu_shim_region_forked(kgpu_shim_region *r)
{
    become_child(r);
}

/* Checks a mapped file's header; 0 if it is this version's layout. */
static int check_layout(const kgpu_region_file *f, size_t size, const char *path, kgpu_error *err)
{
    if (size != sizeof(kgpu_region_file) || memcmp(f->magic, KGPU_REGION_MAGIC, 8) != 0 ||
        f->version != KGPU_REGION_VERSION || f->header_size != offsetof(kgpu_region_file, dev) ||
        f->file_size != sizeof(kgpu_region_file) || f->max_devices != KGPU_SHIM_MAX_DEVICES ||
        f->max_slots != KGPU_REGION_SLOTS)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "%s is not a version %d accounting region of %zu bytes "
                              "(written by another libkgpu-limit version?)",
                              path, KGPU_REGION_VERSION, sizeof(kgpu_region_file));
    return KGPU_OK;
}

/* Writes a fresh region under a temporary name and links it to `path` unless one is there. */
static int create(const char *dir, const char *name, const char *path, kgpu_error *err)
{
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.%s.acct.XXXXXX", dir, name) >= sizeof(tmp))
        return kgpu_error_set(err, KGPU_EINVAL, "accounting directory path too long: %s", dir);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return kgpu_error_set(err, KGPU_EIO, "cannot create a file in %s: %s", dir,
                              strerror(errno));
    int rc = KGPU_OK;
    kgpu_region_file *f = MAP_FAILED;
    pthread_mutexattr_t attr;
    /* mkostemp already made it 0600 unless the umask is stranger than that; either way, 0600. */
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)sizeof(*f)) != 0) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot size %s: %s", tmp, strerror(errno));
        goto out;
    }
    f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (f == MAP_FAILED) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot map %s: %s", tmp, strerror(errno));
        goto out;
    }
    memcpy(f->magic, KGPU_REGION_MAGIC, 8);
    f->version = KGPU_REGION_VERSION;
    f->header_size = offsetof(kgpu_region_file, dev);
    f->file_size = sizeof(*f);
    f->max_devices = KGPU_SHIM_MAX_DEVICES;
    f->max_slots = KGPU_REGION_SLOTS;
    if (pthread_mutexattr_init(&attr) != 0 ||
        pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) != 0 ||
        pthread_mutex_init(&f->lock.mutex, &attr) != 0) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot make a process-shared robust mutex");
        goto out;
    }
    pthread_mutexattr_destroy(&attr);
    if (link(tmp, path) != 0 && errno != EEXIST)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot create %s: %s", path, strerror(errno));
    /* EEXIST: another process of the container made it first; use theirs. */
out:
    if (f != MAP_FAILED)
        munmap(f, sizeof(*f));
    unlink(tmp);
    close(fd);
    return rc;
}

int kgpu_shim_region_attach(const char *dir, const char *name, const kgpu_shim_limits *lim,
                            kgpu_shim_region **out, kgpu_error *err)
{
    *out = NULL;
    if (!name_ok(name))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "container name '%.64s' is not usable as a file name", name);
    kgpu_shim_region *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    r->slot = -1;
    r->fd = -1;
    if ((size_t)snprintf(r->path, sizeof(r->path), "%s/%s.acct", dir, name) >= sizeof(r->path)) {
        free(r);
        return kgpu_error_set(err, KGPU_EINVAL, "accounting directory path too long: %s", dir);
    }
    int rc;
    int fd = open(r->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if ((rc = create(dir, name, r->path, err)) != KGPU_OK)
            goto fail;
        fd = open(r->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot open %s: %s", r->path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (kgpu_shim_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0) {
        rc = kgpu_error_set(err, KGPU_ESTATE,
                            "%s must be a regular file of uid %d with mode 0600; it has uid %d, "
                            "mode %04o (all GPU processes of a container must run as one user)",
                            r->path, (int)geteuid(), (int)st.st_uid, (unsigned)st.st_mode & 07777);
        close(fd);
        goto fail;
    }
    r->map = mmap(NULL, sizeof(kgpu_region_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->map == MAP_FAILED) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot map %s: %s", r->path, strerror(errno));
        close(fd);
        goto fail;
    }
    if ((rc = check_layout(r->map, (size_t)st.st_size, r->path, err)) != KGPU_OK) {
        munmap(r->map, sizeof(kgpu_region_file));
        close(fd);
        goto fail;
    }
    /*
     * The slot's lock goes through a description of its own: the mapping
     * holds a reference to the one it was made from, which would keep a
     * lock on it alive after its descriptor is closed (leave needs that).
     */
    r->fd = open(r->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat again;
    close(fd);
    if (r->fd < 0 || kgpu_shim_fstat(r->fd, &again) != 0 || again.st_dev != st.st_dev ||
        again.st_ino != st.st_ino) {
        rc = kgpu_error_set(err, KGPU_ESTATE, "%s was replaced while it was opened", r->path);
        if (r->fd >= 0)
            close(r->fd);
        munmap(r->map, sizeof(kgpu_region_file));
        goto fail;
    }
    r->attacher = getpid();
    void *page = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page != MAP_FAILED && madvise(page, (size_t)sysconf(_SC_PAGESIZE), MADV_WIPEONFORK) == 0) {
        r->mark = page;
        *r->mark = 1;
    } else if (page != MAP_FAILED) {
        munmap(page, (size_t)sysconf(_SC_PAGESIZE));
    }
    for (int i = 0; i < lim->ndevices; i++) {
        kgpu_region_device *d = &r->map->dev[i];
        put(&d->limit, lim->dev[i].memory_mib << 20);
        if (strncmp(d->uuid, lim->dev[i].uuid, sizeof(d->uuid) - 1) != 0) {
            size_t n = strnlen(lim->dev[i].uuid, sizeof(d->uuid) - 1); /* truncated if longer */
            memcpy(d->uuid, lim->dev[i].uuid, n);
            d->uuid[n] = '\0';
        }
    }
    r->map->ndevices = (uint32_t)lim->ndevices;
    *out = r;
    return KGPU_OK;
fail:
    free(r);
    return rc;
}

void kgpu_shim_region_detach(kgpu_shim_region *r)
{
    if (r == NULL)
        return;
    munmap(r->map, sizeof(kgpu_region_file));
    if (r->mark != NULL)
        munmap((void *)r->mark, (size_t)sysconf(_SC_PAGESIZE));
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

int kgpu_shim_region_view(const char *path, const kgpu_region_file **view, kgpu_error *err)
{
    *view = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kgpu_error_set(err, KGPU_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (kgpu_shim_fstat(fd, &st) != 0 || (size_t)st.st_size != sizeof(kgpu_region_file)) {
        close(fd);
        return kgpu_error_set(err, KGPU_ESTATE, "%s is not an accounting region", path);
    }
    const kgpu_region_file *f = mmap(NULL, sizeof(*f), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (f == MAP_FAILED)
        return kgpu_error_set(err, KGPU_EIO, "cannot map %s: %s", path, strerror(errno));
    int rc = check_layout(f, (size_t)st.st_size, path, err);
    if (rc != KGPU_OK) {
        munmap((void *)f, sizeof(*f));
        return rc;
    }
    *view = f;
    return KGPU_OK;
}

void kgpu_shim_region_unview(const kgpu_region_file *view)
{
    if (view != NULL)
        munmap((void *)view, sizeof(*view));
}
