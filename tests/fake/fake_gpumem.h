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
 * A process's memory lives as long as its driver client, as on the real
 * driver, where device memory belongs to the client behind the driver's
 * descriptors (opened close-on-exec): a child forked without exec holds
 * them too, and the memory stays until the last holder is gone. So a slot
 * is alive while an open-file-description lock on its byte past the end of
 * the file is held, taken at the slot's claim through a descriptor of its
 * own (the fake "client") that forked children inherit and exec closes;
 * its pid only names the process that claimed it.
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

#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

/* Asks about the slots' client locks; a description of its own (never holding one). */
static int fake_mem_query_fd = -1;

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
    if (fake_mem_query_fd >= 0)
        close(fake_mem_query_fd);
    fake_mem_query_fd = fd;
    return m != MAP_FAILED ? (fake_mem_file *)m : NULL;
}

static inline struct flock fake_mem_lockbyte(int i, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET,
                       .l_start = (off_t)sizeof(fake_mem_file) + i, .l_len = 1};
    return fl;
}

/* Whether slot i's client is still held by some process. */
static inline int fake_mem_slot_alive(const fake_mem_file *f, int i)
{
    int pid = __atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE);
    if (pid <= 0)
        return 0;
    struct flock fl = fake_mem_lockbyte(i, F_WRLCK);
    if (fake_mem_query_fd >= 0 && fcntl(fake_mem_query_fd, F_OFD_GETLK, &fl) == 0)
        return fl.l_type != F_UNLCK;
    return kill(pid, 0) == 0 || errno == EPERM; /* no OFD locks: the claimer alone */
}

/*
 * This process's slot: a free one, or one whose client nobody holds any
 * more, taken with the lock through a new client descriptor that stays
 * open (close-on-exec, like the driver's). NULL when full.
 */
static inline fake_mem_slot *fake_mem_claim(fake_mem_file *f)
{
    const char *path = getenv("FAKE_GPU_MEM_FILE");
    int client = path != NULL ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (client < 0)
        return NULL;
    int me = (int)getpid();
    for (int i = 0; i < FAKE_MEM_SLOTS; i++) {
        struct flock fl = fake_mem_lockbyte(i, F_WRLCK);
        if (fcntl(client, F_OFD_SETLK, &fl) != 0)
            continue; /* a live client holds it */
        __atomic_store_n(&f->slot[i].pid, me, __ATOMIC_RELEASE);
        for (int d = 0; d < FAKE_MEM_DEVS; d++)
            __atomic_store_n(&f->slot[i].used[d], 0, __ATOMIC_RELEASE);
        return &f->slot[i];
    }
    close(client);
    return NULL;
}

/* What live processes and the neighbour hold on device d. */
static inline unsigned long long fake_mem_device_used(const fake_mem_file *f, int d)
{
    long long sum = __atomic_load_n(&f->neighbour[d], __ATOMIC_ACQUIRE);
    for (int i = 0; i < FAKE_MEM_SLOTS; i++)
        if (fake_mem_slot_alive(f, i))
            sum += (long long)__atomic_load_n(&f->slot[i].used[d], __ATOMIC_ACQUIRE);
    return sum > 0 ? (unsigned long long)sum : 0;
}

#endif
