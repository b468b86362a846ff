/*
 * The fake GPUs' memory as every process sees it: with FAKE_GPU_MEM_FILE
 * naming a file, the fake driver of each process publishes there what it
 * holds per device (one slot per process), and both memory reports read
 * it: the fake driver's cuMemGetInfo (free = total - what all processes and
 * the neighbour hold) and the fake NVML's device memory and per-process
 * lists, as on a real GPU where NVML and the driver count the same memory.
 * `neighbour` is memory held by something that is no process of the test
 * (FAKE_CUDA_CTX_NEIGHBOUR_MIB moves it while a context is made, as a
 * neighbour allocating or freeing at that moment would).
 *
 * Header-only, shared by fake_cuda.c and fake_nvml.c; not part of kgpu.
 */
#ifndef KGPU_FAKE_GPUMEM_H
#define KGPU_FAKE_GPUMEM_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_MEM_SLOTS 64
#define FAKE_MEM_DEVS  8

typedef struct fake_mem_slot {
    int pid; /* 0: free */
    int pad;
    unsigned long long used[FAKE_MEM_DEVS]; /* bytes, written by that process only */
} fake_mem_slot;

typedef struct fake_mem_file {
    long long neighbour[FAKE_MEM_DEVS]; /* bytes held outside the test's processes */
    fake_mem_slot slot[FAKE_MEM_SLOTS];
} fake_mem_file;

/* The shared file mapped (created zero-filled), or NULL without FAKE_GPU_MEM_FILE. */
static inline fake_mem_file *fake_mem_open(void)
{
    const char *path = getenv("FAKE_GPU_MEM_FILE");
    int fd = path != NULL && *path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    if (fd < 0)
        return NULL;
    void *m = MAP_FAILED;
    if (ftruncate(fd, sizeof(fake_mem_file)) == 0)
        m = mmap(NULL, sizeof(fake_mem_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m != MAP_FAILED ? (fake_mem_file *)m : NULL;
}

static inline int fake_mem_alive(int pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* This process's slot: its own from before, or a free or dead one taken. NULL when full. */
static inline fake_mem_slot *fake_mem_claim(fake_mem_file *f)
{
    int me = (int)getpid();
    for (int i = 0; i < FAKE_MEM_SLOTS; i++)
        if (__atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE) == me)
            return &f->slot[i];
    for (int i = 0; i < FAKE_MEM_SLOTS; i++) {
        int old = __atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE);
        if ((old == 0 || !fake_mem_alive(old)) &&
            __atomic_compare_exchange_n(&f->slot[i].pid, &old, me, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            for (int d = 0; d < FAKE_MEM_DEVS; d++)
                __atomic_store_n(&f->slot[i].used[d], 0, __ATOMIC_RELEASE);
            return &f->slot[i];
        }
    }
    return NULL;
}

/* What live processes and the neighbour hold on device d. */
static inline unsigned long long fake_mem_device_used(const fake_mem_file *f, int d)
{
    long long sum = __atomic_load_n(&f->neighbour[d], __ATOMIC_ACQUIRE);
    for (int i = 0; i < FAKE_MEM_SLOTS; i++) {
        int pid = __atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE);
        if (fake_mem_alive(pid))
            sum += (long long)__atomic_load_n(&f->slot[i].used[d], __ATOMIC_ACQUIRE);
    }
    return sum > 0 ? (unsigned long long)sum : 0;
}

#endif
