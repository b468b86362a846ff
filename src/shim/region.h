/*
 * The accounting region that all processes of one container share: a file
 * in the pod's accounting directory, mapped MAP_SHARED, with a fixed layout
 * (below, and in docs/shim.md). It holds how much each device has reserved
 * in total and per process, so that the sum over the container's processes
 * is checked against the limit in one step: a reservation claims room in
 * the device's total with one compare-and-swap that refuses to pass the
 * limit, so two processes never both pass the check (region.c says why no
 * lock is needed there).
 *
 * The limits enforced are always the caller's (from the read-only limits
 * file); the region's copy of them is for observers only, so writing the
 * region cannot raise a limit.
 *
 * Threads: a kgpu_shim_region handle may be used by all threads of its
 * process at once; its functions lock the region as needed.
 */
#ifndef KGPU_SHIM_REGION_H
#define KGPU_SHIM_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "kgpu/error.h"
#include "shimlimits.h"

#define KGPU_REGION_MAGIC   "KGPUACCT" /* 8 bytes, no NUL */
#define KGPU_REGION_VERSION 1
#define KGPU_REGION_SLOTS   1024 /* processes of one container using the GPU at once */

typedef struct kgpu_region_device {
    _Atomic uint64_t limit; /* bytes, as the last process to attach read it; informational */
    _Atomic uint64_t used;  /* bytes reserved by the container's processes together */
    char uuid[48];          /* informational, NUL-terminated (truncated if longer) */
} kgpu_region_device;

typedef struct kgpu_region_slot {
    _Atomic int32_t pid; /* 0: free; as the process's own PID namespace numbers it */
    uint32_t pidns;      /* inode of that PID namespace; 0: unknown (read as the reader's own) */
    uint64_t start_time; /* field 22 of /proc/<pid>/stat: tells a reused pid apart */
    _Atomic uint64_t bytes[KGPU_SHIM_MAX_DEVICES]; /* what this process holds, per device */
} kgpu_region_slot;

/* The file, byte for byte (native endianness; one machine reads it). */
typedef struct kgpu_region_file {
    char magic[8];
    uint32_t version;
    uint32_t header_size; /* offsetof(kgpu_region_file, dev) */
    uint64_t file_size;   /* sizeof(kgpu_region_file) */
    uint32_t max_devices; /* KGPU_SHIM_MAX_DEVICES */
    uint32_t max_slots;   /* KGPU_REGION_SLOTS */
    uint32_t ndevices;    /* devices in the limits file */
    uint8_t reserved[28];
    union {
        pthread_mutex_t mutex; /* process-shared, robust; guards the slot table (pid, freeing) */
        uint8_t size[64];
    } lock;
    kgpu_region_device dev[KGPU_SHIM_MAX_DEVICES];
    kgpu_region_slot slot[KGPU_REGION_SLOTS];
} kgpu_region_file;

typedef struct kgpu_shim_region kgpu_shim_region;

/*
 * Maps `dir`/`name`.acct, creating it first if needed without any process
 * ever seeing it half-made (written under a temporary name, then link()ed
 * into place; mode 0600). An existing file must be a regular file of this
 * user, not readable or writable by others, with this version's layout.
 * `name` is the container's name: letters, digits, '.', '_', '-'. Records
 * `lim` in the region for observers. The caller owns *out (detach frees).
 */
int kgpu_shim_region_attach(const char *dir, const char *name, const kgpu_shim_limits *lim,
                            kgpu_shim_region **out, kgpu_error *err);

/* Unmaps and frees; the process's slot stays until it is released or reclaimed. */
void kgpu_shim_region_detach(kgpu_shim_region *r);

/*
 * Reserves `bytes` on device `dev` for this process if the container's
 * total stays within `limit` bytes; the first reservation of a process
 * takes its slot. When the limit would be passed, the slots of dead
 * processes are reclaimed and the check made again. Returns KGPU_OK,
 * KGPU_ENOFIT (over the limit), or KGPU_ESTATE (no free slot, or the lock is
 * unusable), never partially reserving.
 */
int kgpu_shim_region_reserve(kgpu_shim_region *r, int dev, uint64_t bytes, uint64_t limit);

/* Gives back `bytes` of this process's reservation on `dev` (at most what it holds). */
void kgpu_shim_region_release(kgpu_shim_region *r, int dev, uint64_t bytes);

/* Bytes reserved on `dev` by the whole container, now. */
uint64_t kgpu_shim_region_used(const kgpu_shim_region *r, int dev);

/* Bytes this process holds on `dev`. */
uint64_t kgpu_shim_region_mine(kgpu_shim_region *r, int dev);

/*
 * Gives back everything this process holds and frees its slot (at exit),
 * unless a child that inherited the driver client (see
 * kgpu_shim_region_client) still lives: the driver keeps this process's
 * memory until that child is gone too, so the slot stays, alive by the
 * lock the child inherited, and is reclaimed after it. After it, the next
 * reservation takes a slot again.
 */
void kgpu_shim_region_leave(kgpu_shim_region *r);

/*
 * This process has opened its driver client (cuInit succeeded): children
 * forked from now on inherit the driver's descriptors, and with them keep
 * its device memory alive; they then keep its slot alive too.
 */
void kgpu_shim_region_client(kgpu_shim_region *r);

/*
 * In a child after fork(): forgets the parent's slot without touching it
 * (the parent still holds it); the child takes its own at its first
 * reservation. Only async-signal-safe work. A child made without fork's
 * handlers (_Fork(), clone(), a raw syscall) is noticed by the region
 * itself at its next call (a MADV_WIPEONFORK page), so that it can never
 * give back or free its parent's slot.
 */
void kgpu_shim_region_forked(kgpu_shim_region *r);

/*
 * Whether this handle is still used by the process that attached it or
 * took its slot (1), or by a child that inherited it without
 * kgpu_shim_region_forked (0; the handle then forgets the parent's slot).
 */
int kgpu_shim_region_same_process(kgpu_shim_region *r);

/*
 * Reclaims the slots of dead processes now; returns how many. A process is
 * alive while it holds the open-file-description lock on its slot's byte
 * (taken with the slot; the kernel drops it when the process is gone,
 * whatever PID namespace it ran in); where that cannot tell, a process of
 * the reader's PID namespace is judged by pid and start time, and one of
 * another namespace is left alone.
 */
int kgpu_shim_region_reclaim(kgpu_shim_region *r);

/*
 * Whether process `pid` started at `start_time` (0: unknown) still runs:
 * false when the pid is gone, a zombie, or now another process.
 */
int kgpu_shim_process_alive(pid_t pid, uint64_t start_time);

/* Field 22 of /proc/<pid>/stat (start time in clock ticks after boot), or 0. */
uint64_t kgpu_shim_process_start_time(pid_t pid);

/*
 * For observers (tests, tools): maps `path` read-only and checks its
 * layout. *view stays valid until kgpu_shim_region_unview(*view).
 */
int kgpu_shim_region_view(const char *path, const kgpu_region_file **view, kgpu_error *err);
void kgpu_shim_region_unview(const kgpu_region_file *view);

#endif
