/*
 * The GPU schedule of libkgpu-limit.so (compute shares), driven directly:
 * joining, the holder's turn, handing the GPU over when another container
 * waits (after draining), keeping it when alone, and taking it from a
 * holder that went idle.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpusched.h"

#define GPU "GPU-fa4e0000-0000-0000-0000-000000000000"

static char dir[256];
static _Atomic int drains;

static void drain(void)
{
    atomic_fetch_add(&drains, 1);
}

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/kgpu-test-sched-XXXXXX");
    atomic_store(&drains, 0);
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/%s.sched", dir, GPU);
    unlink(path);
    return rmdir(dir);
}

static kgpu_sched *join(const char *id, int share)
{
    kgpu_sched *s = NULL;
    kgpu_error err = {0};
    if (kgpu_sched_attach(dir, GPU, id, share, &s, &err) != KGPU_OK)
        fail_msg("attach: %s", err.msg);
    return s;
}

/* The file, read as an observer. */
static kgpu_sched_file *view(void)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/%s.sched", dir, GPU);
    FILE *f = fopen(path, "r+");
    assert_non_null(f);
    void *m = mmap(NULL, sizeof(kgpu_sched_file), PROT_READ, MAP_SHARED, fileno(f), 0);
    fclose(f);
    assert_true(m != MAP_FAILED);
    return m;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void joins_once_per_container(void **state)
{
    kgpu_sched *a = join("a", 30), *a2 = join("a", 40), *b = join("b", 70);
    kgpu_sched_file *f = view();
    int n = 0;
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++)
        n += f->m[i].id[0] != '\0';
    assert_int_equal(n, 2);
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++)
        if (strcmp(f->m[i].id, "a") == 0)
            assert_int_equal(f->m[i].share, 40); /* the latest word */
    assert_int_equal(atomic_load(&f->holder), -1);
    munmap(f, sizeof(*f));
    kgpu_sched_detach(a);
    kgpu_sched_detach(a2);
    kgpu_sched_detach(b);
}

typedef struct waiter {
    kgpu_sched *s;
    _Atomic int through;
} waiter;

static void *wait_turn(void *arg)
{
    waiter *w = arg;
    kgpu_sched_gate(w->s, drain);
    atomic_store(&w->through, 1);
    return NULL;
}

static void turns_pass_when_another_waits(void **state)
{
    kgpu_sched *a = join("a", 30), *b = join("b", 70);
    kgpu_sched_file *f = view();
    kgpu_sched_gate(a, drain); /* free: a takes it */
    int ia = atomic_load(&f->holder);
    assert_true(ia >= 0);
    uint64_t end = atomic_load(&f->slice_end);
    assert_true(end - atomic_load(&f->slice_start) == KGPU_SCHED_PERIOD_NS * 30 / 100);
    waiter w = {b, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_turn, &w), 0);
    sleep_ms(5);
    int through = atomic_load(&w.through);
    if (kgpu_sched_now() < end) { /* (a loaded machine may have slept past a's slice) */
        assert_int_equal(through, 0); /* a's slice lasts 15 ms */
        kgpu_sched_gate(a, drain);    /* still a's turn: no drain */
        assert_int_equal(atomic_load(&drains), 0);
    }
    while (kgpu_sched_now() < end)
        sleep_ms(1);
    /* a launches again after its slice: it drains and the GPU goes to b, a waits its turn. */
    waiter again = {a, 0};
    pthread_t t2;
    assert_int_equal(pthread_create(&t2, NULL, wait_turn, &again), 0);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&w.through), 1);
    assert_true(atomic_load(&f->holder) != ia);
    /*
     * a gave the GPU up by draining, or, when this machine kept its thread
     * from running for 5 ms past its slice, b took it from a holder that
     * looked idle: both are the schedule working.
     */
    if (atomic_load(&drains) == 0)
        print_message("a looked idle past its slice (a loaded machine): b took the GPU\n");
    assert_true(atomic_load(&drains) <= 1);
    /* b's 35 ms turn, then b goes idle: a gets the GPU back without b's help. */
    pthread_join(t2, NULL);
    assert_int_equal(atomic_load(&again.through), 1);
    assert_int_equal(atomic_load(&f->holder), ia);
    for (int i = 0; i < KGPU_SCHED_MEMBERS; i++)
        if (i == ia)
            assert_true(f->m[i].used_ns >= 15000000ULL);
    munmap(f, sizeof(*f));
    kgpu_sched_detach(a);
    kgpu_sched_detach(b);
}

static void alone_the_gpu_is_lent(void **state)
{
    kgpu_sched *a = join("a", 10), *b = join("b", 90); /* b never launches */
    kgpu_sched_file *f = view();
    uint64_t t0 = kgpu_sched_now();
    while (kgpu_sched_now() - t0 < 30000000ULL) { /* 30 ms: several of a's 5 ms slices */
        kgpu_sched_gate(a, drain);
        sleep_ms(1);
    }
    assert_int_equal(atomic_load(&drains), 0);
    int ia = atomic_load(&f->holder);
    assert_true(ia >= 0);
    assert_string_equal(f->m[ia].id, "a");
    munmap(f, sizeof(*f));
    kgpu_sched_detach(a);
    kgpu_sched_detach(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(joins_once_per_container, setup, teardown),
        cmocka_unit_test_setup_teardown(turns_pass_when_another_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(alone_the_gpu_is_lent, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
