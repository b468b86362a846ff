/*
 * The GPU's turns (sched.h). Every change happens under the file's robust
 * mutex except the holder's fast path, which only reads: a launch while the
 * container's slice lasts costs two atomic loads and a clock read.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/*
 * Every container on the GPU can write the file, so what it says about
 * others is checked before it is believed (docs/shim.md, "Where it can be
 * wrong"): a slice never ends more than a period ahead, a member's own
 * share is rewritten from its limits at every pass, and a lock not had
 * within LOCK_WAIT_S stops the gate for good in this process (the GPU's
 * own time slicing then applies, as without a schedule) rather than
 * hanging every launch.
 */
struct kgpu_sched {
    kgpu_sched_file *map;
    int me;          /* member index */
    uint32_t share;  /* this container's, from its limits file */
    _Atomic int off; /* the lock was held hostage: launches pass ungated */
};

uint64_t kgpu_sched_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* 0 when locked; an error number when the lock was not had within LOCK_WAIT_S. */
static int lock(kgpu_sched_file *f)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* the clock pthread_mutex_timedlock counts in */
    until.tv_sec += LOCK_WAIT_S;
    int rc = pthread_mutex_timedlock(&f->lock.mutex, &until);
    if (rc == EOWNERDEAD) /* nothing to repair: all fields stand alone */
        rc = pthread_mutex_consistent(&f->lock.mutex);
    return rc;
}

static void unlock(kgpu_sched_file *f)
{
    pthread_mutex_unlock(&f->lock.mutex);
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
    kgpu_sched_file *f = s->map;
    int me = s->me;
    uint64_t now = kgpu_sched_now();
    if (atomic_load_explicit(&f->holder, memory_order_acquire) == me &&
        !atomic_load_explicit(&f->fresh, memory_order_relaxed) &&
        now < atomic_load_explicit(&f->slice_end, memory_order_acquire)) {
        atomic_store_explicit(&f->m[me].seen_ns, now, memory_order_relaxed);
        return;
    }
    for (;;) {
        if (atomic_load_explicit(&s->off, memory_order_relaxed) || lock(f) != 0) {
            give_up(s);
            return;
        }
        now = kgpu_sched_now();
        atomic_store(&f->m[me].seen_ns, now);
        f->m[me].share = s->share;
        int h = atomic_load(&f->holder);
        uint64_t end = atomic_load(&f->slice_end);
        if (h == me) {
            if (atomic_load(&f->fresh)) { /* its turn starts now */
                atomic_store(&f->fresh, 0);
                atomic_store(&f->slice_start, now);
                atomic_store(&f->slice_end, now + slice_of(&f->m[me]));
                atomic_store(&f->m[me].waiting_ns, 0);
                unlock(f);
                return;
            }
            if (now < end) {
                unlock(f);
                return;
            }
            if (!others_waiting(f, me, now)) { /* alone: the GPU is lent on */
                account(f, me, now);
                atomic_store(&f->slice_end, now + slice_of(&f->m[me]));
                unlock(f);
                return;
            }
            /* Its turn is over: its queued work runs out before the next one starts. */
            atomic_store(&f->m[me].waiting_ns, now);
            unlock(f);
            drain();
            if (lock(f) != 0) {
                give_up(s);
                return;
            }
            now = kgpu_sched_now();
            if (atomic_load(&f->holder) == me) {
                account(f, me, now);
                int next = neediest(f, now, -1, me);
                hand_to(f, next, now);
            }
            atomic_store(&f->m[me].waiting_ns, now);
            unlock(f);
            continue;
        }
        int free = h < 0 || h >= KGPU_SCHED_MEMBERS || f->m[h].id[0] == '\0';
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
            unlock(f);
            return;
        }
        if (free)
            hand_to(f, neediest(f, now, me, -1), now);
        atomic_fetch_add(&f->m[me].waits, 1);
        unlock(f);
        struct timespec ts = {0, 100000}; /* 100 us */
        nanosleep(&ts, NULL);
    }
}

static int check(const kgpu_sched_file *f, size_t size, const char *path, kgpu_error *err)
{
    if (size != sizeof(*f) || memcmp(f->magic, KGPU_SCHED_MAGIC, 8) != 0 ||
        f->version != KGPU_SCHED_VERSION || f->members != KGPU_SCHED_MEMBERS)
        return kgpu_error_set(err, KGPU_ESTATE, "%s is not a version %d GPU schedule", path,
                              KGPU_SCHED_VERSION);
    return KGPU_OK;
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
    kgpu_sched_file *f = MAP_FAILED;
    pthread_mutexattr_t attr;
    if (fchmod(fd, mode) != 0 || ftruncate(fd, (off_t)sizeof(*f)) != 0 ||
        (f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot make %s: %s", tmp, strerror(errno));
        goto out;
    }
    memcpy(f->magic, KGPU_SCHED_MAGIC, 8);
    f->version = KGPU_SCHED_VERSION;
    f->members = KGPU_SCHED_MEMBERS;
    atomic_store(&f->holder, -1);
    if (pthread_mutexattr_init(&attr) != 0 ||
        pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) != 0 ||
        pthread_mutex_init(&f->lock.mutex, &attr) != 0) {
        rc = kgpu_error_set(err, KGPU_EIO, "cannot make a process-shared robust mutex");
        goto out;
    }
    pthread_mutexattr_destroy(&attr);
    if (replace ? rename(tmp, path) != 0 : link(tmp, path) != 0 && errno != EEXIST)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot create %s: %s", path, strerror(errno));
out:
    if (f != MAP_FAILED)
        munmap(f, sizeof(*f));
    unlink(tmp);
    close(fd);
    return rc;
}

int kgpu_sched_attach(const char *dir, const char *gpu, const char *id, int share,
                      kgpu_sched **out, kgpu_error *err)
{
    char path[PATH_MAX];
    *out = NULL;
    if (strchr(gpu, '/') != NULL || gpu[0] == '.' ||
        (size_t)snprintf(path, sizeof(path), "%s/%s.sched", dir, gpu) >= sizeof(path))
        return kgpu_error_set(err, KGPU_EINVAL, "GPU '%.60s' cannot name a schedule file", gpu);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        int rc = create(dir, path, 0600, 0, err);
        if (rc != KGPU_OK)
            return rc;
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    }
    struct stat st;
    if (fd < 0 || kgpu_shim_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return kgpu_error_set(err, KGPU_EIO, "cannot open %s: %s", path, strerror(e));
    }
    kgpu_sched_file *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (f == MAP_FAILED)
        return kgpu_error_set(err, KGPU_EIO, "cannot map %s: %s", path, strerror(errno));
    int rc = check(f, (size_t)st.st_size, path, err);
    kgpu_sched *s = rc == KGPU_OK ? calloc(1, sizeof(*s)) : NULL;
    if (rc == KGPU_OK && s == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    if (rc != KGPU_OK) {
        munmap(f, sizeof(*f));
        return rc;
    }
    s->map = f;
    s->me = -1;
    s->share = (uint32_t)(share < 1 ? 1 : share > 100 ? 100 : share);
    if (lock(f) != 0) {
        munmap(f, sizeof(*f));
        free(s);
        return kgpu_error_set(err, KGPU_ESTATE, "%s: its lock has been held for over %d s", path,
                              LOCK_WAIT_S);
    }
    uint64_t now = kgpu_sched_now();
    for (int i = 0; i < KGPU_SCHED_MEMBERS && s->me < 0; i++)
        if (strncmp(f->m[i].id, id, sizeof(f->m[i].id) - 1) == 0)
            s->me = i;
    /* A free member, or one no process has used for a long time (a container gone). */
    for (int i = 0; i < KGPU_SCHED_MEMBERS && s->me < 0; i++)
        if (f->m[i].id[0] == '\0' ||
            (atomic_load(&f->holder) != i && now - atomic_load(&f->m[i].seen_ns) > GONE_NS)) {
            memset(&f->m[i], 0, sizeof(f->m[i]));
            snprintf(f->m[i].id, sizeof(f->m[i].id), "%s", id);
            s->me = i;
        }
    if (s->me >= 0) {
        f->m[s->me].share = s->share;
        atomic_store(&f->m[s->me].seen_ns, now);
    }
    unlock(f);
    if (s->me < 0) {
        munmap(f, sizeof(*f));
        free(s);
        return kgpu_error_set(err, KGPU_ESTATE, "%s has no room for another container", path);
    }
    *out = s;
    return KGPU_OK;
}

int kgpu_sched_prepare(const char *dir, const char *gpu, mode_t mode, kgpu_error *err)
{
    char path[PATH_MAX];
    if (strchr(gpu, '/') != NULL || gpu[0] == '.' || gpu[0] == '\0' ||
        (size_t)snprintf(path, sizeof(path), "%s/%s.sched", dir, gpu) >= sizeof(path))
        return kgpu_error_set(err, KGPU_EINVAL, "GPU '%.60s' cannot name a schedule file", gpu);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return create(dir, path, mode, 0, err);
    /*
     * One that is there stays (containers running have it mounted: a new
     * file would split them from the next ones), unless it is not a
     * schedule of this version; then the new containers get a fresh one.
     */
    struct stat st;
    int ok = fd >= 0 && kgpu_shim_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
             (size_t)st.st_size == sizeof(kgpu_sched_file);
    if (ok) {
        kgpu_sched_file *f = mmap(NULL, sizeof(*f), PROT_READ, MAP_SHARED, fd, 0);
        kgpu_error ignored = {0};
        ok = f != MAP_FAILED && check(f, (size_t)st.st_size, path, &ignored) == KGPU_OK;
        if (f != MAP_FAILED)
            munmap(f, sizeof(*f));
    }
    int rc = KGPU_OK;
    if (!ok)
        rc = create(dir, path, mode, 1, err);
    else if ((st.st_mode & 07777) != mode && fchmod(fd, mode) != 0)
        rc = kgpu_error_set(err, KGPU_EIO, "chmod %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    return rc;
}

void kgpu_sched_detach(kgpu_sched *s)
{
    if (s == NULL)
        return;
    munmap(s->map, sizeof(*s->map));
    free(s);
}
