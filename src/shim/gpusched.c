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
#define OVERRUN_NS   200000000ULL /* a holder busy or gone this long past its slice loses it */
#define DECAY_NS     10000000000ULL /* accounts are halved when one passes 10 s */
#define GONE_NS      60000000000ULL /* a member unused this long is a container gone */
#define AWAY_NS      1000000000ULL  /* a member back after this long starts level with the rest */
#define LOCK_WAIT_NS 100000000ULL   /* the lock is held for microseconds; held this long, hostage */
#define BACKOFF_NS   1000000000ULL  /* the gate stays open this long after a hostage lock */
/*
 * A waiter's own bound: the longest an honest schedule keeps a member of
 * share s waiting is about its neighbours' turns, PERIOD + OVERRUN each,
 * (100 - s) / s of them for each of its own; past that (never under one
 * round) it takes the GPU for ROUND_NS whatever the file says. Kept
 * waiting by forged turns, it so still gets min(s, 50) % of the time.
 */
#define ROUND_NS (KGPU_SCHED_PERIOD_NS + OVERRUN_NS)
/* The deepest a ceiling's credit goes: a turn's overrun past it is forgiven. */
#define FLOOR_NS ((int64_t)(ROUND_NS / 2))

#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36 /* Linux 3.15; older glibc headers lack the names */
#endif
#ifndef F_OFD_SETLK
#define F_OFD_SETLK 37
#endif

/*
 * Every container on the GPU can write the file, so what it says about
 * others is checked before it is believed (docs/shim.md, "A hostile
 * tenant and its GPU's schedule file"): it is read into a private copy
 * under the lock, never mapped (a truncation costs a short read, not
 * SIGBUS), clamped to what a library could have written (clamp), and a
 * copy that is no schedule is rewritten whole (fresh); a slice never ends
 * more than a period ahead; a member's own share, ceiling and name are
 * rewritten from its limits at every pass; a waiter's wait is bounded by
 * its own clock (wait_bound); and a lock not had within LOCK_WAIT_NS opens
 * the gate for BACKOFF_NS (the GPU's own time slicing then applies, as
 * without a schedule) rather than hanging every launch.
 */
struct kgpu_sched {
    pthread_mutex_t mu;     /* this process's threads, one at a time through the file */
    int fd;                 /* holds the OFD lock while mu is held */
    pid_t pid;              /* whose descriptor fd is: a forked child opens its own */
    char path[PATH_MAX];
    char id[64];            /* this container */
    _Atomic int me;         /* member index; -1: not found yet */
    uint32_t share;         /* this container's, from its limits file */
    uint32_t limit;         /* its ceiling, share..100 */
    _Atomic uint64_t until; /* this container holds the GPU until then: launches pass */
    _Atomic uint64_t forced_until; /* took the GPU after waiting too long: holds it until then */
    uint64_t seen_before;   /* mu held: this member's last pass through the file before this one */
    pthread_mutex_t busy_mu; /* the threads inside a synchronisation */
    int busy_fd;            /* holds the busy byte's read lock while busy_n > 0 */
    pid_t busy_pid;
    int busy_n, busy_idx;
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

/* The most credit a ceiling of m's keeps: its part of one period. */
static int64_t credit_cap(const kgpu_sched_member *m)
{
    return (int64_t)(KGPU_SCHED_PERIOD_NS * m->limit / 100);
}

static int limited(const kgpu_sched_member *m)
{
    return m->limit < 100;
}

/* Over its ceiling: it may not take the GPU until its credit is back. */
static int over(const kgpu_sched_member *m)
{
    return limited(m) && m->credit_ns <= 0;
}

/*
 * What no library writes, brought back to what one could have: a holder
 * out of range, a share outside 1..100, a ceiling outside share..100, a
 * credit outside its bucket, a wait or sighting in the future, a used
 * time past what halving allows, a name without its NUL. It bounds what a
 * forged entry does to the others. Then ceilings' credits are refilled.
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
        m->limit = m->limit < m->share || m->limit > 100 ? 100 : m->limit;
        if (m->used_ns > 2 * DECAY_NS)
            m->used_ns = 2 * DECAY_NS;
        if (atomic_load(&m->waiting_ns) > now)
            atomic_store(&m->waiting_ns, 0);
        if (atomic_load(&m->seen_ns) > now)
            atomic_store(&m->seen_ns, now);
        if (m->credit_at > now)
            m->credit_at = now;
        int64_t cap = credit_cap(m);
        m->credit_ns = m->credit_ns < -FLOOR_NS ? -FLOOR_NS
                       : m->credit_ns > cap     ? cap
                                                : m->credit_ns;
        if (limited(m)) { /* refilled at its ceiling's rate, up to one period's worth */
            uint64_t gained = (now - m->credit_at) * m->limit / 100;
            m->credit_ns = gained >= (uint64_t)(cap - m->credit_ns) ? cap
                                                                     : m->credit_ns + (int64_t)gained;
        }
        m->credit_at = now;
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

/* Locks (or, F_UNLCK, unlocks) `len` bytes from `start` by the description of fd. */
static int ofd(int fd, short type, off_t start, off_t len)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/*
 * Takes the file for this thread and reads it into s->copy, clamped, or
 * fresh if what is there is no schedule (it is written back whole). 0, or
 * an error number when the lock was not had within LOCK_WAIT_NS.
 */
static int lock(kgpu_sched *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t t0 = kgpu_sched_now();
    int rc = own_fd(s) == 0 ? 0 : EIO;
    while (rc == 0 && ofd(s->fd, F_WRLCK, 0, sizeof(kgpu_sched_file)) != 0) {
        int e = errno;
        if (e != EAGAIN && e != EACCES && e != EINTR)
            rc = e;
        else if (kgpu_sched_now() - t0 > LOCK_WAIT_NS)
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
    ofd(s->fd, F_UNLCK, 0, sizeof(kgpu_sched_file));
    pthread_mutex_unlock(&s->mu);
}

/*
 * Lock held: whether a process of member i is inside a synchronisation
 * (its busy byte is read-locked by some description, this process's own
 * busy one included: s->fd holds none).
 */
static int busy(kgpu_sched *s, int i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = KGPU_SCHED_BUSY_BASE + i, .l_len = 1};
    return fcntl(s->fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

/*
 * Lock held: member i, back after AWAY_NS or new, starts level with the
 * members about (its used time raised to the least, for its share, of
 * theirs), so that a newcomer does not hold the GPU until it has caught
 * up with what the others used before it came.
 */
static void level(kgpu_sched_file *f, int i, uint64_t now)
{
    int low = -1;
    for (int j = 0; j < KGPU_SCHED_MEMBERS; j++) {
        kgpu_sched_member *m = &f->m[j];
        if (j == i || m->id[0] == '\0' || now - atomic_load(&m->seen_ns) > AWAY_NS)
            continue;
        if (low < 0 || (unsigned __int128)m->used_ns * f->m[low].share <
                           (unsigned __int128)f->m[low].used_ns * m->share)
            low = j;
    }
    if (low < 0)
        return;
    uint64_t even = (uint64_t)((unsigned __int128)f->m[low].used_ns * f->m[i].share /
                               f->m[low].share);
    if (f->m[i].used_ns < even)
        f->m[i].used_ns = even > 2 * DECAY_NS ? 2 * DECAY_NS : even;
}

/*
 * Lock held: this container's member, found again by name when the file
 * was rewritten or the entry taken over; else a free one, or one no
 * process has used for GONE_NS (a container gone). -1 when there is none.
 * Its share and ceiling are written again from the limits, and, with
 * `pass` (a launch or a synchronisation, not a process joining), when it
 * was last seen: a holder's last pass is what its turn is charged up to.
 */
static int member(kgpu_sched *s, uint64_t now, int pass)
{
    kgpu_sched_file *f = &s->copy;
    int me = atomic_load(&s->me), created = 0;
    if (me < 0 || strcmp(f->m[me].id, s->id) != 0)
        me = -1;
    for (int i = 0; i < KGPU_SCHED_MEMBERS && me < 0; i++)
        if (strcmp(f->m[i].id, s->id) == 0)
            me = i;
    for (int i = 0; i < KGPU_SCHED_MEMBERS && me < 0; i++)
        if (f->m[i].id[0] == '\0' ||
            (atomic_load(&f->holder) != i && now - atomic_load(&f->m[i].seen_ns) > GONE_NS)) {
            memset(&f->m[i], 0, sizeof(f->m[i]));
            snprintf(f->m[i].id, sizeof(f->m[i].id), "%s", s->id);
            atomic_store(&f->m[i].seen_ns, now);
            me = i;
            created = 1;
        }
    atomic_store(&s->me, me);
    if (me >= 0) {
        kgpu_sched_member *m = &f->m[me];
        if (m->limit != s->limit) /* a new ceiling (or a forged one) starts with a full bucket */
            m->credit_ns = (int64_t)(KGPU_SCHED_PERIOD_NS * s->limit / 100);
        m->share = s->share;
        m->limit = s->limit;
        s->seen_before = atomic_load(&m->seen_ns);
        if (created || (pass && now - s->seen_before > AWAY_NS))
            level(f, me, now);
        if (pass)
            atomic_store(&m->seen_ns, now);
    }
    return me;
}

static uint64_t slice_of(const kgpu_sched_member *m)
{
    uint64_t s = KGPU_SCHED_PERIOD_NS * m->share / 100;
    return s < MIN_SLICE_NS ? MIN_SLICE_NS : s;
}

/*
 * Lock held. The waiting member furthest below its share, counting `me`
 * as waiting and never `not` nor one over its ceiling; -1 if none.
 */
static int neediest(kgpu_sched_file *f, uint64_t now, int me, int not)
{
    int best = -1;
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++) {
        kgpu_sched_member *m = &f->m[i];
        uint64_t w = atomic_load(&m->waiting_ns);
        if (i == not || m->id[0] == '\0' || m->share == 0 || over(m) ||
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

/* Lock held: member `me` (this process's) holds the GPU from now for `len`; launches pass. */
static void take(kgpu_sched *s, int me, uint64_t now, uint64_t len)
{
    hand_to(&s->copy, me, now);
    atomic_store(&s->copy.fresh, 0);
    atomic_store(&s->copy.slice_end, now + len);
    atomic_store(&s->until, now + len);
}

/*
 * Lock held: the holder's time so far goes on its account, and off its
 * ceiling's credit; old accounts fade.
 */
static void account(kgpu_sched_file *f, int h, uint64_t now)
{
    uint64_t start = atomic_load(&f->slice_start), held = now > start ? now - start : 0;
    kgpu_sched_member *m = &f->m[h];
    m->used_ns += held;
    if (limited(m))
        m->credit_ns = held > (uint64_t)(m->credit_ns + FLOOR_NS) ? -FLOOR_NS
                                                                  : m->credit_ns - (int64_t)held;
    atomic_store(&f->slice_start, now);
    if (m->used_ns > DECAY_NS)
        for (int i = 0; i < KGPU_SCHED_MEMBERS; i++)
            f->m[i].used_ns /= 2;
}

static int others_waiting(kgpu_sched_file *f, int me, uint64_t now)
{
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++) {
        uint64_t w = atomic_load(&f->m[i].waiting_ns);
        if (i != me && f->m[i].id[0] != '\0' && w != 0 && now - w <= RECENT_NS && !over(&f->m[i]))
            return 1;
    }
    return 0;
}

/*
 * Lock held, `me` the holder past its slice with nobody of it busy: its
 * turn is charged, and the GPU goes to the neediest, itself included, or
 * stays lent when nobody else waits and its ceiling allows.
 */
static void settle(kgpu_sched *s, int me, uint64_t now)
{
    kgpu_sched_file *f = &s->copy;
    account(f, me, now);
    uint64_t slice = slice_of(&f->m[me]);
    if (!others_waiting(f, me, now) && !over(&f->m[me])) { /* alone: the GPU is lent on */
        atomic_store(&f->slice_end, now + slice);
        atomic_store(&s->until, now + slice);
        return;
    }
    int next = neediest(f, now, me, -1);
    if (next == me)
        take(s, me, now, slice);
    else
        hand_to(f, next, now);
}

/*
 * Lock held: until when holder h, whose slice ends at `end` and whose last
 * pass through the file was at `seen`, counts as holding the GPU. Busy
 * (draining, or waiting in a synchronisation) it holds until OVERRUN_NS
 * past its slice; not busy, IDLE_NS past its slice or its last pass,
 * whichever is later, and never past OVERRUN_NS after its slice.
 */
static uint64_t held_until(kgpu_sched *s, int h, uint64_t seen, uint64_t end)
{
    uint64_t upto = busy(s, h) ? end + OVERRUN_NS : (seen > end ? seen : end) + IDLE_NS;
    return upto < end + OVERRUN_NS ? upto : end + OVERRUN_NS;
}

/* Lock not had, or no room: the gate stays open in this process for BACKOFF_NS, then tries again. */
static void give_up(kgpu_sched *s)
{
    atomic_store(&s->until, kgpu_sched_now() + BACKOFF_NS);
}

/* How long a member of `share` percent waits, by its own clock, before it takes the GPU. */
static uint64_t wait_bound(uint32_t share)
{
    return share >= 50 ? ROUND_NS : ROUND_NS * (100 - share) / share;
}

static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* busy_mu held: this process's own busy descriptor (a forked child's is its parent's). */
static int own_busy_fd(kgpu_sched *s)
{
    if (s->busy_fd >= 0 && s->busy_pid == getpid())
        return 0;
    if (s->busy_fd >= 0)
        close(s->busy_fd);
    s->busy_fd = open(s->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    s->busy_pid = getpid();
    return s->busy_fd >= 0 ? 0 : -1;
}

/* This process is busy for its member: its work runs and it waits for it (any thread). */
static void busy_begin(kgpu_sched *s)
{
    pthread_mutex_lock(&s->busy_mu);
    int me = atomic_load(&s->me);
    if (s->busy_n++ == 0) {
        /* Not marked (not joined yet, or refused): the others see it idle, as before. */
        s->busy_idx = -1;
        if (me >= 0 && own_busy_fd(s) == 0 &&
            ofd(s->busy_fd, F_RDLCK, KGPU_SCHED_BUSY_BASE + me, 1) == 0)
            s->busy_idx = me;
    }
    pthread_mutex_unlock(&s->busy_mu);
}

static void busy_end(kgpu_sched *s)
{
    pthread_mutex_lock(&s->busy_mu);
    if (s->busy_n > 0 && --s->busy_n == 0 && s->busy_idx >= 0) {
        ofd(s->busy_fd, F_UNLCK, KGPU_SCHED_BUSY_BASE + s->busy_idx, 1);
        s->busy_idx = -1;
    }
    pthread_mutex_unlock(&s->busy_mu);
}

void kgpu_sched_gate(kgpu_sched *s, void (*drain)(void))
{
    uint64_t now = kgpu_sched_now();
    if (now < atomic_load_explicit(&s->until, memory_order_relaxed))
        return;
    kgpu_sched_file *f = &s->copy;
    uint64_t waited_from = 0; /* this call's own clock: since when it has been kept waiting */
    for (;;) {
        if (lock(s) != 0) {
            give_up(s);
            return;
        }
        now = kgpu_sched_now();
        int me = member(s, now, 1);
        if (me < 0) { /* the file has no room for this container: as without a schedule */
            unlock(s);
            give_up(s);
            return;
        }
        int h = atomic_load(&f->holder);
        uint64_t end = atomic_load(&f->slice_end), slice = slice_of(&f->m[me]);
        if (waited_from != 0 && h != me && now - waited_from > wait_bound(f->m[me].share))
            /* Kept waiting past what the shares allow: forged turns, or a forged ceiling. */
            atomic_store(&s->forced_until, now + ROUND_NS);
        uint64_t forced = atomic_load(&s->forced_until);
        if (forced > now) { /* a turn taken by this process's own clock: the file is told again */
            if (h >= 0 && h != me && f->m[h].id[0] != '\0')
                account(f, h, now);
            uint64_t len = forced - now < KGPU_SCHED_PERIOD_NS ? forced - now : KGPU_SCHED_PERIOD_NS;
            if (h != me)
                take(s, me, now, len);
            atomic_store(&f->fresh, 0);
            atomic_store(&f->slice_end, now + len);
            atomic_store(&s->until, now + len);
            unlock(s);
            return;
        }
        if (h == me) {
            if (atomic_load(&f->fresh)) { /* its turn starts now */
                take(s, me, now, slice);
                unlock(s);
                return;
            }
            if (now < end) { /* never believed past one slice from now */
                atomic_store(&s->until, end < now + slice ? end : now + slice);
                unlock(s);
                return;
            }
            /*
             * The slice so far, its ceiling's credit with it; no further than
             * a waiter would have charged it: a process of this container
             * that ended holding the GPU, or this one back after a pause,
             * does not pay for the time nobody of it used the GPU.
             */
            uint64_t upto = held_until(s, me, s->seen_before, end);
            account(f, me, upto < now ? upto : now);
            atomic_store(&f->slice_start, now);
            if (!others_waiting(f, me, now) && !over(&f->m[me])) { /* alone: lent on */
                atomic_store(&f->slice_end, now + slice);
                atomic_store(&s->until, now + slice);
                unlock(s);
                return;
            }
            /* Its turn is over: its queued work runs out before the next one starts. */
            atomic_store(&f->m[me].waiting_ns, now);
            unlock(s);
            busy_begin(s); /* its queued work runs: the others wait for it, up to OVERRUN_NS */
            drain();
            busy_end(s);
            if (lock(s) != 0) {
                give_up(s);
                return;
            }
            now = kgpu_sched_now();
            if ((me = member(s, now, 1)) >= 0 && atomic_load(&f->holder) == me &&
                !atomic_load(&f->fresh)) {
                /* Another process of it still waits for its work: the turn ends with it. */
                if (busy(s, me) && now < atomic_load(&f->slice_end) + OVERRUN_NS) {
                    atomic_store(&f->m[me].waiting_ns, now);
                    unlock(s);
                    pause_us(100);
                    continue;
                }
                settle(s, me, now);
                if (atomic_load(&f->holder) == me && !atomic_load(&f->fresh)) {
                    unlock(s);
                    return;
                }
            }
            if (me >= 0)
                atomic_store(&f->m[me].waiting_ns, now);
            unlock(s);
            continue;
        }
        if (waited_from == 0)
            waited_from = now;
        if (over(&f->m[me])) { /* over its ceiling: it waits for its credit, not for a turn */
            unlock(s);
            pause_us(100);
            continue;
        }
        int free = h < 0 || f->m[h].id[0] == '\0';
        /*
         * A holder that stopped launching after its slice and is not inside
         * a synchronisation, or that is gone or busy past OVERRUN_NS, lets
         * go; so does one whose slice ends further ahead than any slice
         * lasts, which no library wrote.
         */
        if (!free && end > now + KGPU_SCHED_PERIOD_NS) {
            account(f, h, now);
            free = 1;
        } else if (!free && now > end) {
            /*
             * A holder past held_until lets go, charged no further than
             * that: a holder gone for an hour (nobody waited) is not
             * charged the hour.
             */
            uint64_t upto = held_until(s, h, atomic_load(&f->m[h].seen_ns), end);
            if (now > upto) {
                account(f, h, upto);
                atomic_store(&f->slice_start, now);
                free = 1;
            }
        }
        atomic_store(&f->m[me].waiting_ns, now);
        if (free && neediest(f, now, me, -1) == me) {
            take(s, me, now, slice);
            unlock(s);
            return;
        }
        if (free)
            hand_to(f, neediest(f, now, me, -1), now);
        atomic_fetch_add(&f->m[me].waits, 1);
        unlock(s);
        pause_us(100);
    }
}

void kgpu_sched_sync_begin(kgpu_sched *s)
{
    busy_begin(s);
}

void kgpu_sched_sync_end(kgpu_sched *s)
{
    busy_end(s);
    /* Within its slice, or not holding: nothing to settle (the next launch passes the gate). */
    if (kgpu_sched_now() < atomic_load_explicit(&s->until, memory_order_relaxed) ||
        atomic_load(&s->me) < 0)
        return;
    if (lock(s) != 0) {
        give_up(s);
        return;
    }
    uint64_t now = kgpu_sched_now();
    int me = member(s, now, 1);
    kgpu_sched_file *f = &s->copy;
    /* The last of it out settles the turn: what it queued has run, and was held for. */
    if (me >= 0 && atomic_load(&f->holder) == me && !atomic_load(&f->fresh) &&
        now >= atomic_load(&f->slice_end) && atomic_load(&s->forced_until) <= now &&
        !busy(s, me))
        settle(s, me, now);
    unlock(s);
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

int kgpu_sched_attach(const char *dir, const char *gpu, const char *id, int share, int limit,
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
    pthread_mutex_init(&s->busy_mu, NULL);
    s->busy_fd = -1;
    s->fd = fd;
    s->pid = getpid();
    snprintf(s->path, sizeof(s->path), "%s", path);
    snprintf(s->id, sizeof(s->id), "%s", id);
    atomic_store(&s->me, -1);
    s->share = (uint32_t)(share < 1 ? 1 : share > 100 ? 100 : share);
    s->limit = limit < (int)s->share || limit > 100 ? 100 : (uint32_t)limit;
    if (lock(s) != 0) { /* held hostage: this container joins at its first turn instead */
        *out = s;
        return KGPU_OK;
    }
    int me = member(s, kgpu_sched_now(), 0);
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
    atomic_store(&s->forced_until, 0);
    /*
     * The parent's synchronisations are not the child's; its busy
     * description is the parent's too, and kept open here it would keep
     * the parent's busy mark alive past the parent's death.
     */
    pthread_mutex_init(&s->busy_mu, NULL);
    if (s->busy_fd >= 0)
        close(s->busy_fd);
    s->busy_fd = -1;
    s->busy_n = 0;
    s->busy_idx = -1;
}

void kgpu_sched_detach(kgpu_sched *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0 && s->pid == getpid())
        close(s->fd);
    if (s->busy_fd >= 0 && s->busy_pid == getpid())
        close(s->busy_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->busy_mu);
    free(s);
}
