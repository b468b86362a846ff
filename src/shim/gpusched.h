/*
 * Compute shares: the containers sharing a GPU take turns, so that the GPU
 * time each gets is the time it holds the GPU (docs/shim.md, "Compute
 * shares"). One file per GPU in a directory every such container mounts:
 * which container holds the GPU and until when, and per container its
 * share, the GPU time it has held and when it last waited. It is never
 * mapped: every container can write it, truncating included, and a
 * truncated shared mapping kills its readers with SIGBUS. Each change is a
 * read, update and write of the whole file under an open-file-description
 * lock on it (F_OFD_SETLK, which the kernel drops with its holder), and
 * what is read is checked and clamped first; a damaged file is rewritten
 * whole. Only the holder's fast path stays in the process: until its
 * slice ends a launch reads one private atomic and the clock.
 *
 * The holder launches freely for its slice (share x PERIOD). When its slice
 * ends and another container waits, its launches stop, its queued work
 * drains (the caller's `drain`, which waits for the driver to finish it),
 * and the GPU goes to the waiting container that has held least for its
 * share, the holder included (deficit round robin). A turn is charged the
 * time the GPU was held, drain included: while a process of the holder is
 * inside a synchronisation (kgpu_sched_sync_begin/_end) the holder is busy,
 * not idle, for at most OVERRUN past its slice, and when the last one
 * returns the turn is settled. Alone, a container keeps the GPU (an idle
 * GPU is lent) up to its ceiling, core_limit_pct, if it has one.
 *
 * Nothing in the file is believed for ever: a waiter that has waited
 * longer than its share allows (its own clock) takes the GPU whatever the
 * file says, and a lock held hostage opens the gate for a while, not for
 * good.
 *
 * Threads: a handle may be used by all threads of its process at once.
 */
#ifndef KGPU_SHIM_GPUSCHED_H
#define KGPU_SHIM_GPUSCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "kgpu/error.h"

#define KGPU_SCHED_MAGIC     "KGPUSCHD"
#define KGPU_SCHED_VERSION   3 /* 2 had no ceiling; 1 was mapped, with a mutex inside */
#define KGPU_SCHED_MEMBERS   64
#define KGPU_SCHED_PERIOD_NS 50000000ULL /* one round of slices: 50 ms */
/*
 * Byte KGPU_SCHED_BUSY_BASE + i of the file (far past its end) is read-locked
 * (F_OFD_SETLK) by every process of member i while it is inside a
 * synchronisation: the kernel drops the lock with a process that dies, so a
 * killed process leaves nobody busy. The file's own lock covers only the
 * file's bytes.
 */
#define KGPU_SCHED_BUSY_BASE (1LL << 30)

typedef struct kgpu_sched_member {
    char id[64];                 /* the container's region name; "" free */
    uint32_t share;              /* percent of the GPU, 1..100 */
    _Atomic uint32_t waits;      /* how often a launch of it waited for another's turn */
    _Atomic uint64_t seen_ns;    /* when a process of it last launched or waited */
    _Atomic uint64_t waiting_ns; /* when a process of it last waited for the GPU */
    uint64_t used_ns;            /* GPU time held, halved now and then */
    uint32_t limit;              /* ceiling, percent of the GPU, share..100 (100: none) */
    uint32_t pad;
    int64_t credit_ns;           /* with a ceiling: GPU time it may still hold (token bucket) */
    uint64_t credit_at;          /* when credit_ns was last refilled */
} kgpu_sched_member;

typedef struct kgpu_sched_file {
    char magic[8];
    uint32_t version;
    uint32_t members; /* KGPU_SCHED_MEMBERS */
    uint8_t reserved[48];
    uint8_t reserved2[64]; /* version 1's mutex */
    _Atomic int32_t holder; /* member index; -1: nobody */
    _Atomic uint32_t fresh; /* the holder was handed the GPU and has not launched yet */
    _Atomic uint64_t slice_start, slice_end; /* CLOCK_MONOTONIC ns */
    kgpu_sched_member m[KGPU_SCHED_MEMBERS];
} kgpu_sched_file;

typedef struct kgpu_sched kgpu_sched;

/*
 * Opens `dir`/`gpu`.sched (created whole if missing, mode 0600; rewritten
 * whole if damaged) and joins as container `id` with `share` percent and a
 * ceiling of `limit` percent (share..100; outside that, or 100: none). The
 * caller owns *out. A lock held hostage does not stop it: the container
 * joins at its first turn.
 */
int kgpu_sched_attach(const char *dir, const char *gpu, const char *id, int share, int limit,
                      kgpu_sched **out, kgpu_error *err);

void kgpu_sched_detach(kgpu_sched *s);

/*
 * For the node (the device plugin, which mounts the file into containers):
 * makes `dir`/`gpu`.sched a schedule of this version with permissions
 * `mode`, created whole if missing. One already there is kept (running
 * containers have it mounted) unless it is not a valid schedule, which a
 * fresh file replaces.
 */
int kgpu_sched_prepare(const char *dir, const char *gpu, mode_t mode, kgpu_error *err);

/*
 * Before a launch: returns once this container may launch, having called
 * drain() first if it had to give the GPU up. Cheap while it holds the GPU.
 * A lock held by another for over 100 ms opens the gate in this process
 * for a second (the GPU's own time slicing then applies); then it tries
 * again.
 */
void kgpu_sched_gate(kgpu_sched *s, void (*drain)(void));

/*
 * Around a synchronisation (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize) by any thread: while one is inside, this container
 * is busy, its queued work running; when the last returns past the slice,
 * the turn is charged and passes on (or stays, if this container is still
 * the neediest). Every begin needs its end, on any thread.
 */
void kgpu_sched_sync_begin(kgpu_sched *s);
void kgpu_sched_sync_end(kgpu_sched *s);

/* In a child after fork: its own descriptor at the next lock (OFD locks follow descriptions). */
void kgpu_sched_forked(kgpu_sched *s);

/* CLOCK_MONOTONIC in ns. */
uint64_t kgpu_sched_now(void);

#endif
