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
 * share. Alone, a container keeps the GPU: an idle GPU is lent.
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
#define KGPU_SCHED_VERSION   2 /* 1 was mapped and locked by a mutex inside */
#define KGPU_SCHED_MEMBERS   64
#define KGPU_SCHED_PERIOD_NS 50000000ULL /* one round of slices: 50 ms */

typedef struct kgpu_sched_member {
    char id[64];                 /* the container's region name; "" free */
    uint32_t share;              /* percent of the GPU, 1..100 */
    _Atomic uint32_t waits;      /* how often a launch of it waited for another's turn */
    _Atomic uint64_t seen_ns;    /* when a process of it last launched or waited */
    _Atomic uint64_t waiting_ns; /* when a process of it last waited for the GPU */
    uint64_t used_ns;            /* GPU time held, halved now and then */
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
 * whole if damaged) and joins as container `id` with `share` percent. The
 * caller owns *out.
 */
int kgpu_sched_attach(const char *dir, const char *gpu, const char *id, int share,
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
 * A lock held by another for over a second opens the gate for good in this
 * process (the GPU's own time slicing then applies).
 */
void kgpu_sched_gate(kgpu_sched *s, void (*drain)(void));

/* In a child after fork: its own descriptor at the next lock (OFD locks follow descriptions). */
void kgpu_sched_forked(kgpu_sched *s);

/* CLOCK_MONOTONIC in ns. */
uint64_t kgpu_sched_now(void);

#endif
