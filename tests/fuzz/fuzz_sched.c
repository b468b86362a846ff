/*
 * Fuzz target for a GPU's schedule file as libkgpu-limit.so reads it: every
 * container taking turns on the GPU can write the file, so whatever bytes
 * it holds (truncated, forged, garbage), joining and taking a turn must
 * neither crash nor hang, and must leave a whole, valid schedule behind:
 * at least the schedule's size, its header, a holder in range, shares of
 * 1..100, ceilings of share..100 with credits inside their bucket, names
 * that end, and this container in it once. Its own synchronisation (a
 * busy mark and the turn settled after) must leave the same.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpusched.h"

#define GPU "GPU-f0220000-0000-0000-0000-000000000000"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], path[160];

static void no_drain(void)
{
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (dir[0] == '\0') {
        snprintf(dir, sizeof(dir), "/tmp/kgpu-fuzz-sched-XXXXXX");
        if (mkdtemp(dir) == NULL)
            abort();
        snprintf(path, sizeof(path), "%s/%s.sched", dir, GPU);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size || close(fd) != 0)
        abort();
    kgpu_sched *s = NULL;
    kgpu_error err = {0};
    if (kgpu_sched_attach(dir, GPU, "fuzz", 30, 60, &s, &err) != KGPU_OK)
        abort(); /* a file of any content is repaired, never refused */
    kgpu_sched_gate(s, no_drain);
    kgpu_sched_sync_begin(s);
    kgpu_sched_sync_end(s);
    kgpu_sched_detach(s);
    static kgpu_sched_file f;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, &f, sizeof(f)) : -1;
    if (n != (ssize_t)sizeof(f) || close(fd) != 0)
        abort();
    int h = atomic_load(&f.holder);
    if (memcmp(f.magic, KGPU_SCHED_MAGIC, 8) != 0 || f.version != KGPU_SCHED_VERSION ||
        f.members != KGPU_SCHED_MEMBERS || h < -1 || h >= KGPU_SCHED_MEMBERS)
        abort();
    int me = 0;
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++) {
        if (memchr(f.m[i].id, '\0', sizeof(f.m[i].id)) == NULL)
            abort();
        if (f.m[i].id[0] != '\0' &&
            (f.m[i].share < 1 || f.m[i].share > 100 || f.m[i].limit < f.m[i].share ||
             f.m[i].limit > 100 || f.m[i].credit_ns < -(int64_t)KGPU_SCHED_PERIOD_NS * 5 ||
             f.m[i].credit_ns > (int64_t)KGPU_SCHED_PERIOD_NS))
            abort();
        me += strcmp(f.m[i].id, "fuzz") == 0;
    }
    if (me != 1)
        abort();
    return 0;
}
