/*
 * The GPU's turns (gpusched.h). Every change is made to a private copy of
 * the file read under its lock and written back whole; the holder's fast
 * path reads neither: a launch while the container's slice lasts costs one
 * atomic load and a clock read.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compat.h"
#include "gpusched.h"

#define MIN_SLICE_NS 2000000ULL   /* a share's slice is never shorter than 2 ms */
#define RECENT_NS    20000000ULL  /* a container that waited this recently still waits */
#define IDLE_NS      5000000ULL   /* a holder that launched nothing this long after its slice */
#define OVERRUN_NS   200000000ULL /* a holder that never gives back (gone) loses it after this */
#define DECAY_NS     10000000000ULL /* accounts are halved when one passes 10 s */
#define GONE_NS      60000000000ULL /* a member unused this long is a container gone */
#define LOCK_WAIT_S  1 /* the lock is held for microseconds; held this long, it is held hostage */

#ifndef F_OFD_SETLK
#define F_OFD_SETLK 37 /* Linux 3.15; older glibc headers lack the name */
#endif

/*
 * Every container on the GPU can write the file, so what it says about
 * others is checked before it is believed (docs/shim.md, "A hostile
 * tenant and its GPU's schedule file"): it is read into a private copy
 * under the lock, never mapped (a truncation costs a short read, not
 * SIGBUS), clamped to what a library could have written (clamp), and a
 * copy that is no schedule is rewritten whole (fresh); a slice never ends
 * more than a period ahead; a member's own share and name are rewritten
 * from its limits at every pass; and a lock not had within LOCK_WAIT_S
 * stops the gate for good in this process (the GPU's own time slicing
 * then applies, as without a schedule) rather than hanging every launch.
 */
struct kgpu_sched {
    pthread_mutex_t mu;     /* this process's threads, one at a time through the file */
    int fd;                 /* holds the OFD lock while mu is held */
    pid_t pid;              /* whose descriptor fd is: a forked child opens its own */
    char path[PATH_MAX];
    char id[64];            /* this container */
    int me;                 /* member index; -1: not found yet */
    uint32_t share;         /* this container's, from its limits file */
    _Atomic int off;        /* the lock was held hostage: launches pass ungated */
    _Atomic uint64_t until; /* this container holds the GPU until then: launches pass */
    kgpu_sched_file copy;   /* the file, while mu is held */
};

uint64_t kgpu_sched_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void fresh(kgpu_sched_file *f)
{
    memset(f, 0, sizeof(*f));
    memcpy(f->magic, KGPU_SCHED_MAGIC, 8);
    f->version = KGPU_SCHED_VERSION;
    f->members = KGPU_SCHED_MEMBERS;
    atomic_store(&f->holder, -1);
}

static int valid(const kgpu_sched_file *f)
{
    return memcmp(f->magic, KGPU_SCHED_MAGIC, 8) == 0 && f->version == KGPU_SCHED_VERSION &&
           f->members == KGPU_SCHED_MEMBERS;
}

/*
 * What no library writes, brought back to what one could have: a holder
 * out of range, a share outside 1..100, a wait or sighting in the future,
 * a used time past what halving allows, a name without its NUL. It bounds
 * what a forged entry does to the others.
 */
static void clamp(kgpu_sched_file *f, uint64_t now)
{
    int h = atomic_load(&f->holder);
    if (h < -1 || h >= KGPU_SCHED_MEMBERS)
        atomic_store(&f->holder, -1);
    if (atomic_load(&f->slice_start) > now)
        atomic_store(&f->slice_start, now);
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++) {
        kgpu_sched_member *m = &f->m[i];
        m->id[sizeof(m->id) - 1] = '\0';
        if (m->id[0] == '\0')
            continue;
        m->share = m->share < 1 ? 1 : m->share > 100 ? 100 : m->share;
        if (m->used_ns > 2 * DECAY_NS)
            m->used_ns = 2 * DECAY_NS;
        if (atomic_load(&m->waiting_ns) > now)
            atomic_store(&m->waiting_ns, 0);
        if (atomic_load(&m->seen_ns) > now)
            atomic_store(&m->seen_ns, now);
    }
}

/* mu held: this process's own descriptor (OFD locks belong to descriptions, which fork shares). */
static int own_fd(kgpu_sched *s)
{
    if (s->fd >= 0 && s->pid == getpid())
        return 0;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = open(s->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    s->pid = getpid();
    return s->fd >= 0 ? 0 : -1;
}

static int ofd(int fd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/*
 * Takes the file for this thread and reads it into s->copy, clamped, or
 * fresh if what is there is no schedule (it is written back whole). 0, or
 * an error number when the lock was not had within LOCK_WAIT_S.
 */
static int lock(kgpu_sched *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t t0 = kgpu_sched_now();
    int rc = own_fd(s) == 0 ? 0 : EIO;
    while (rc == 0 && ofd(s->fd, F_WRLCK) != 0) {
        int e = errno;
        if (e != EAGAIN && e != EACCES && e != EINTR)
            rc = e;
        else if (kgpu_sched_now() - t0 > LOCK_WAIT_S * 1000000000ULL)
            rc = ETIMEDOUT;
        struct timespec ts = {0, 200000}; /* 200 us: the lock is held for microseconds */
        if (rc == 0)
            nanosleep(&ts, NULL);
    }
    if (rc != 0) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    ssize_t n = pread(s->fd, &s->copy, sizeof(s->copy), 0);
    if (n != (ssize_t)sizeof(s->copy) || !valid(&s->copy))
        fresh(&s->copy);
    clamp(&s->copy, kgpu_sched_now());
    return 0;
}

/* Writes the copy back whole (which also undoes a truncation) and lets the file go. */
static void unlock(kgpu_sched *s)
{
    ssize_t n = pwrite(s->fd, &s->copy, sizeof(s->copy), 0);
    (void)n; /* refused (a full disk): the others keep the file as it was */
    ofd(s->fd, F_UNLCK);
    pthread_mutex_unlock(&s->mu);
}

/*
 * Lock held: this container's member, found again by name when the file
 * was rewritten or the entry taken over; else a free one, or one no
 * process has used for GONE_NS (a container gone). -1 when there is none.
 * Its share is written again from the limits, and when it was last seen.
 */
static int member(kgpu_sched *s, uint64_t now)
{
    kgpu_sched_file *f = &s->copy;
    if (s->me < 0 || strcmp(f->m[s->me].id, s->id) != 0)
        s->me = -1;
    for (int i = 0; i < KGPU_SCHED_MEMBERS && s->me < 0; i++)
        if (strcmp(f->m[i].id, s->id) == 0)
            s->me = i;
    for (int i = 0; i < KGPU_SCHED_MEMBERS && s->me < 0; i++)
        if (f->m[i].id[0] == '\0' ||
            (atomic_load(&f->holder) != i && now - atomic_load(&f->m[i].seen_ns) > GONE_NS)) {
            memset(&f->m[i], 0, sizeof(f->m[i]));
            snprintf(f->m[i].id, sizeof(f->m[i].id), "%s", s->id);
            s->me = i;
        }
    if (s->me >= 0) {
        f->m[s->me].share = s->share;
        atomic_store(&f->m[s->me].seen_ns, now);
    }
    return s->me;
}

static uint64_t slice_of(const kgpu_sched_member *m)
{
    uint64_t s = KGPU_SCHED_PERIOD_NS * m->share / 100;
    return s < MIN_SLICE_NS ? MIN_SLICE_NS : s;
}

/*
 * Lock held. The waiting member furthest below its share, counting `me`
 * as waiting and never `not`; -1 if none.
 */
static int neediest(kgpu_sched_file *f, uint64_t now, int me, int not)
{
    int best = -1;
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++) {
        kgpu_sched_member *m = &f->m[i];
        uint64_t w = atomic_load(&m->waiting_ns);
        if (i == not || m->id[0] == '\0' || m->share == 0 ||
            (i != me && (w == 0 || now - w > RECENT_NS)))
            continue;
        /* used / share, compared without division */
        if (best < 0 ||
            (unsigned __int128)m->used_ns * f->m[best].share <
                (unsigned __int128)f->m[best].used_ns * m->share)
            best = i;
    }
    return best;
}

/*
 * Lock held: gives the GPU to member i from `now`. Its turn starts when it
 * next launches (fresh), so the moment it takes to notice is nobody's.
 */
static void hand_to(kgpu_sched_file *f, int i, uint64_t now)
{
    atomic_store(&f->fresh, 1);
    atomic_store(&f->holder, i);
    atomic_store(&f->slice_start, now);
    atomic_store(&f->slice_end, i >= 0 ? now + slice_of(&f->m[i]) : now);
    if (i >= 0)
        atomic_store(&f->m[i].waiting_ns, 0);
}

/* Lock held: the holder's time so far goes on its account; old accounts fade. */
static void account(kgpu_sched_file *f, int h, uint64_t now)
{
    uint64_t start = atomic_load(&f->slice_start);
    f->m[h].used_ns += now > start ? now - start : 0;
    atomic_store(&f->slice_start, now);
    if (f->m[h].used_ns > DECAY_NS)
        for (int i = 0; i < KGPU_SCHED_MEMBERS; i++)
            f->m[i].used_ns /= 2;
}

static int others_waiting(kgpu_sched_file *f, int me, uint64_t now)
{
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++) {
        uint64_t w = atomic_load(&f->m[i].waiting_ns);
        if (i != me && f->m[i].id[0] != '\0' && w != 0 && now - w <= RECENT_NS)
            return 1;
    }
    return 0;
}

/* Lock not had: the gate stays open in this process from now on. */
static void give_up(kgpu_sched *s)
{
    atomic_store(&s->off, 1);
}

void kgpu_sched_gate(kgpu_sched *s, void (*drain)(void))
{
    uint64_t now = kgpu_sched_now();
    if (now < atomic_load_explicit(&s->until, memory_order_relaxed))
        return;
    kgpu_sched_file *f = &s->copy;
    for (;;) {
        if (atomic_load_explicit(&s->off, memory_order_relaxed) || lock(s) != 0) {
            give_up(s);
            return;
        }
        now = kgpu_sched_now();
        int me = member(s, now);
        if (me < 0) { /* the file has no room for this container: as without a schedule */
            unlock(s);
            give_up(s);
            return;
        }
        int h = atomic_load(&f->holder);
        uint64_t end = atomic_load(&f->slice_end), slice = slice_of(&f->m[me]);
        if (h == me) {
            if (atomic_load(&f->fresh)) { /* its turn starts now */
                atomic_store(&f->fresh, 0);
                atomic_store(&f->slice_start, now);
                atomic_store(&f->slice_end, now + slice);
                atomic_store(&f->m[me].waiting_ns, 0);
                atomic_store(&s->until, now + slice);
                unlock(s);
                return;
            }
            if (now < end) { /* never believed past one slice from now */
                atomic_store(&s->until, end < now + slice ? end : now + slice);
                unlock(s);
                return;
            }
            if (!others_waiting(f, me, now)) { /* alone: the GPU is lent on */
                account(f, me, now);
                atomic_store(&f->slice_end, now + slice);
                atomic_store(&s->until, now + slice);
                unlock(s);
                return;
            }
            /* Its turn is over: its queued work runs out before the next one starts. */
            atomic_store(&f->m[me].waiting_ns, now);
            unlock(s);
            drain();
            if (lock(s) != 0) {
                give_up(s);
                return;
            }
            now = kgpu_sched_now();
            if ((me = member(s, now)) >= 0 && atomic_load(&f->holder) == me) {
                account(f, me, now);
                int next = neediest(f, now, -1, me);
                hand_to(f, next, now);
            }
            if (me >= 0)
                atomic_store(&f->m[me].waiting_ns, now);
            unlock(s);
            continue;
        }
        int free = h < 0 || f->m[h].id[0] == '\0';
        /*
         * A holder that stopped launching after its slice, or that is gone,
         * lets go; so does one whose slice ends further ahead than any
         * slice lasts, which no library wrote.
         */
        if (!free && (end > now + KGPU_SCHED_PERIOD_NS ||
                      (now > end && ((atomic_load(&f->m[h].seen_ns) < end && now > end + IDLE_NS) ||
                                     now > end + OVERRUN_NS)))) {
            account(f, h, now);
            free = 1;
        }
        atomic_store(&f->m[me].waiting_ns, now);
        if (free && neediest(f, now, me, -1) == me) {
            hand_to(f, me, now);
            atomic_store(&f->fresh, 0);
            atomic_store(&s->until, now + slice);
            unlock(s);
            return;
        }
        if (free)
            hand_to(f, neediest(f, now, me, -1), now);
        atomic_fetch_add(&f->m[me].waits, 1);
        unlock(s);
        struct timespec ts = {0, 100000}; /* 100 us */
        nanosleep(&ts, NULL);
    }
}

/*
 * Writes a fresh file of `mode` under a temporary name and links it into
 * place unless one is there, or, with `replace`, renames it over what is.
 */
static int create(const char *dir, const char *path, mode_t mode, int replace, kgpu_error *err)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s/.sched.XXXXXX", dir);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return kgpu_error_set(err, KGPU_EIO, "cannot create a file in %s: %s", dir,
                              strerror(errno));
    int rc = KGPU_OK;
    kgpu_sched_file *f = malloc(sizeof(*f)); /* 6 KiB: not on an application thread's stack */
    ssize_t n = -1;
    if (f != NULL) {
        fresh(f);
        n = fchmod(fd, mode) == 0 ? pwrite(fd, f, sizeof(*f), 0) : -1;
        free(f);
    }
    if (n != (ssize_t)sizeof(kgpu_sched_file))
        rc = kgpu_error_set(err, KGPU_EIO, "cannot make %s: %s", tmp,
                            n < 0 ? strerror(errno) : "short write");
    else if (replace ? rename(tmp, path) != 0 : link(tmp, path) != 0 && errno != EEXIST)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot create %s: %s", path, strerror(errno));
    unlink(tmp);
    close(fd);
    return rc;
}

/* `dir`/`gpu`.sched into path, or KGPU_EINVAL for a GPU name that is no file name. */
static int sched_path(const char *dir, const char *gpu, char *path, size_t size, kgpu_error *err)
{
    if (strchr(gpu, '/') != NULL || gpu[0] == '.' || gpu[0] == '\0' ||
        (size_t)snprintf(path, size, "%s/%s.sched", dir, gpu) >= size)
        return kgpu_error_set(err, KGPU_EINVAL, "GPU '%.60s' cannot name a schedule file", gpu);
    return KGPU_OK;
}

int kgpu_sched_attach(const char *dir, const char *gpu, const char *id, int share,
                      kgpu_sched **out, kgpu_error *err)
{
    char path[PATH_MAX];
    *out = NULL;
    int rc = sched_path(dir, gpu, path, sizeof(path), err);
    if (rc != KGPU_OK)
        return rc;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if ((rc = create(dir, path, 0600, 0, err)) != KGPU_OK)
            return rc;
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    }
    struct stat st;
    if (fd < 0 || kgpu_shim_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = fd < 0 ? errno : S_ISREG(st.st_mode) ? errno : EINVAL;
        if (fd >= 0)
            close(fd);
        return kgpu_error_set(err, KGPU_EIO, "cannot open %s: %s", path, strerror(e));
    }
    kgpu_sched *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        close(fd);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    s->fd = fd;
    s->pid = getpid();
    snprintf(s->path, sizeof(s->path), "%s", path);
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->me = -1;
    s->share = (uint32_t)(share < 1 ? 1 : share > 100 ? 100 : share);
    if (lock(s) != 0) {
        kgpu_sched_detach(s);
        return kgpu_error_set(err, KGPU_ESTATE, "%s: its lock has been held for over %d s", path,
                              LOCK_WAIT_S);
    }
    int me = member(s, kgpu_sched_now());
    unlock(s);
    if (me < 0) {
        kgpu_sched_detach(s);
        return kgpu_error_set(err, KGPU_ESTATE, "%s has no room for another container", path);
    }
    *out = s;
    return KGPU_OK;
}

int kgpu_sched_prepare(const char *dir, const char *gpu, mode_t mode, kgpu_error *err)
{
    char path[PATH_MAX];
    int rc = sched_path(dir, gpu, path, sizeof(path), err);
    if (rc != KGPU_OK)
        return rc;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return create(dir, path, mode, 0, err);
    /*
     * One that is there stays (containers running have it mounted: a new
     * file would split them from the next ones), unless it is not a
     * schedule of this version; then the new containers get a fresh one.
     * Read, not mapped: a container may be truncating it meanwhile.
     */
    struct stat st;
    kgpu_sched_file *f = malloc(sizeof(*f));
    if (f == NULL) {
        if (fd >= 0)
            close(fd);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    int ok = fd >= 0 && kgpu_shim_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
             pread(fd, f, sizeof(*f), 0) == (ssize_t)sizeof(*f) && valid(f);
    free(f);
    if (!ok)
        rc = create(dir, path, mode, 1, err);
    else if ((st.st_mode & 07777) != mode && fchmod(fd, mode) != 0)
        rc = kgpu_error_set(err, KGPU_EIO, "chmod %s: %s", path, strerror(errno));
    /*
     * Back to its size: every container may write the file, and what one
     * appended would stay on the node's disk, outside its pod's accounting.
     */
    else if (st.st_size != (off_t)sizeof(kgpu_sched_file) &&
             ftruncate(fd, (off_t)sizeof(kgpu_sched_file)) != 0)
        rc = kgpu_error_set(err, KGPU_EIO, "truncating %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    return rc;
}

void kgpu_sched_forked(kgpu_sched *s)
{
    if (s == NULL)
        return;
    pthread_mutex_init(&s->mu, NULL); /* another thread may have held it at the fork */
    atomic_store(&s->until, 0);
}

void kgpu_sched_detach(kgpu_sched *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0 && s->pid == getpid())
        close(s->fd);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
