/*
 * The accounting region of libkgpu-limit.so, driven directly (no CUDA):
 * creation without half-made files, what it refuses to map, reservations
 * against a limit, processes racing for one limit, and the memory of dead
 * processes coming back, including one that died holding the lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "region.h"

#define MIB (1024ULL * 1024ULL)

static char dir[256];
static kgpu_shim_limits lim;

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/kgpu-test-region-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    memset(&lim, 0, sizeof(lim));
    lim.ndevices = 2;
    snprintf(lim.dev[0].uuid, sizeof(lim.dev[0].uuid), "GPU-aaaa");
    lim.dev[0].memory_mib = 1024;
    snprintf(lim.dev[1].uuid, sizeof(lim.dev[1].uuid), "GPU-bbbb");
    lim.dev[1].memory_mib = 512;
    return 0;
}

static int teardown(void **state)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || strcmp(e->d_name, "..") == 0))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d != NULL)
        closedir(d);
    rmdir(dir);
    return 0;
}

static int entries(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static kgpu_shim_region *attach(const char *name)
{
    kgpu_shim_region *r = NULL;
    kgpu_error err = {0};
    if (kgpu_shim_region_attach(dir, name, &lim, &r, &err) != KGPU_OK)
        fail_msg("attach: %s", err.msg);
    return r;
}

static void created_whole_and_private(void **state)
{
    kgpu_shim_region *r = attach("main");
    char path[512];
    snprintf(path, sizeof(path), "%s/main.acct", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    assert_int_equal(st.st_size, sizeof(kgpu_region_file));
    assert_int_equal(entries(), 1); /* no temporary file left behind */

    const kgpu_region_file *v;
    kgpu_error err;
    assert_int_equal(kgpu_shim_region_view(path, &v, &err), KGPU_OK);
    assert_memory_equal(v->magic, "KGPUACCT", 8);
    assert_int_equal(v->version, KGPU_REGION_VERSION);
    assert_int_equal(v->header_size, offsetof(kgpu_region_file, dev));
    assert_int_equal(v->ndevices, 2);
    assert_int_equal(atomic_load(&((kgpu_region_file *)v)->dev[0].limit), 1024 * MIB);
    assert_string_equal(v->dev[1].uuid, "GPU-bbbb");

    /* A second attach maps the same file; another container gets its own. */
    kgpu_shim_region *r2 = attach("main");
    kgpu_shim_region *other = attach("sidecar");
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 100 * MIB, 1024 * MIB), KGPU_OK);
    assert_int_equal(kgpu_shim_region_used(r2, 0), 100 * MIB);
    assert_int_equal(kgpu_shim_region_used(other, 0), 0);
    assert_int_equal(entries(), 2);
    kgpu_shim_region_unview(v);
    kgpu_shim_region_detach(r);
    kgpu_shim_region_detach(r2);
    kgpu_shim_region_detach(other);
}

static void refuses_what_it_should_not_map(void **state)
{
    kgpu_shim_region *r = NULL;
    kgpu_error err = {0};
    char path[512], target[512];

    assert_int_equal(kgpu_shim_region_attach(dir, "../escape", &lim, &r, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_shim_region_attach(dir, ".hidden", &lim, &r, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_shim_region_attach(dir, "", &lim, &r, &err), KGPU_EINVAL);

    /* Readable by others: someone else could have made it, or could read it. */
    kgpu_shim_region_detach(attach("open"));
    snprintf(path, sizeof(path), "%s/open.acct", dir);
    chmod(path, 0644);
    assert_int_equal(kgpu_shim_region_attach(dir, "open", &lim, &r, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "mode 0644"));
    assert_null(r);

    /* A link planted where the region goes is not followed. */
    snprintf(path, sizeof(path), "%s/link.acct", dir);
    snprintf(target, sizeof(target), "%s/open.acct", dir);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(kgpu_shim_region_attach(dir, "link", &lim, &r, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, "link.acct"));

    /* Not this version's layout. */
    snprintf(path, sizeof(path), "%s/short.acct", dir);
    FILE *f = fopen(path, "w");
    fputs("KGPUACCT", f);
    fclose(f);
    chmod(path, 0600);
    assert_int_equal(kgpu_shim_region_attach(dir, "short", &lim, &r, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "not a version 1 accounting region"));

    /* A directory that does not exist. */
    assert_int_equal(kgpu_shim_region_attach("/nonexistent/kgpu", "main", &lim, &r, &err),
                     KGPU_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/kgpu"));
}

static void reserve_check_and_release(void **state)
{
    kgpu_shim_region *r = attach("main");
    uint64_t limit = 1024 * MIB;
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 1000 * MIB, limit), KGPU_OK);
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 25 * MIB, limit), KGPU_ENOFIT);
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 24 * MIB, limit), KGPU_OK);
    assert_int_equal(kgpu_shim_region_used(r, 0), limit);
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 1, limit), KGPU_ENOFIT);
    /* Devices are separate; overflowing sizes and bad devices are refused, not wrapped. */
    assert_int_equal(kgpu_shim_region_reserve(r, 1, 512 * MIB, 512 * MIB), KGPU_OK);
    assert_int_equal(kgpu_shim_region_reserve(r, 1, UINT64_MAX, UINT64_MAX - 1), KGPU_ENOFIT);
    assert_int_equal(kgpu_shim_region_reserve(r, -1, 1, limit), KGPU_ENOFIT);
    assert_int_equal(kgpu_shim_region_reserve(r, KGPU_SHIM_MAX_DEVICES, 1, limit), KGPU_ENOFIT);
    kgpu_shim_region_release(r, 0, 1000 * MIB);
    assert_int_equal(kgpu_shim_region_used(r, 0), 24 * MIB);
    assert_int_equal(kgpu_shim_region_mine(r, 0), 24 * MIB);
    /* Giving back more than held gives back what is held. */
    kgpu_shim_region_release(r, 0, 1000 * MIB);
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);
    kgpu_shim_region_leave(r);
    assert_int_equal(kgpu_shim_region_used(r, 1), 0);
    kgpu_shim_region_detach(r);
}

/*
 * A child that attaches and reserves `bytes`, then, once `*go` is written
 * to, dies without giving anything back: by `sig`, or by _exit when 0.
 * Returns once the reservation is made.
 */
static pid_t holder(uint64_t bytes, int sig, int *go)
{
    int ready[2], wake[2];
    if (pipe(ready) != 0 || pipe(wake) != 0)
        fail_msg("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        kgpu_shim_region *r = NULL;
        kgpu_error err;
        char c;
        if (kgpu_shim_region_attach(dir, "main", &lim, &r, &err) != KGPU_OK ||
            kgpu_shim_region_reserve(r, 0, bytes, 1024 * MIB) != KGPU_OK)
            _exit(1);
        if (write(ready[1], "r", 1) != 1 || read(wake[0], &c, 1) != 1)
            _exit(1);
        if (sig != 0)
            raise(sig);
        _exit(0);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    close(wake[0]);
    *go = wake[1];
    return pid;
}

static void finish(pid_t pid, int go)
{
    assert_int_equal(write(go, "g", 1), 1);
    close(go);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
}

static void dead_processes_memory_comes_back(void **state)
{
    kgpu_shim_region *r = attach("main");
    int go_a, go_b;
    pid_t a = holder(600 * MIB, 0, &go_a);
    pid_t b = holder(300 * MIB, SIGKILL, &go_b);
    assert_int_equal(kgpu_shim_region_used(r, 0), 900 * MIB);
    finish(a, go_a); /* exits without leaving its slot */
    finish(b, go_b); /* killed */
    assert_int_equal(kgpu_shim_region_used(r, 0), 900 * MIB);
    /* This fits only once both are reclaimed, which a failing reservation does. */
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 1024 * MIB, 1024 * MIB), KGPU_OK);
    assert_int_equal(kgpu_shim_region_used(r, 0), 1024 * MIB);
    kgpu_shim_region_leave(r);
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);

    /* A zombie (exited, not yet waited for) counts as dead too. */
    int go_z;
    pid_t z = holder(700 * MIB, 0, &go_z);
    assert_int_equal(write(go_z, "g", 1), 1);
    close(go_z);
    while (kgpu_shim_process_alive(z, 0))
        usleep(1000);
    assert_int_equal(kill(z, 0), 0); /* still there, as a zombie */
    assert_int_equal(kgpu_shim_region_used(r, 0), 700 * MIB);
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 1024 * MIB, 1024 * MIB), KGPU_OK);
    waitpid(z, NULL, 0);
    kgpu_shim_region_leave(r);
    kgpu_shim_region_detach(r);
}

static void reclaim_at_attach_and_after_exec(void **state)
{
    kgpu_shim_region *r = attach("main");
    int go;
    pid_t a = holder(500 * MIB, SIGKILL, &go);
    finish(a, go);
    assert_int_equal(kgpu_shim_region_used(r, 0), 500 * MIB);
    /* Taking a slot (this process's first reservation) reclaims first. */
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 1, 1024 * MIB), KGPU_OK);
    assert_int_equal(kgpu_shim_region_used(r, 0), 1);

    /*
     * A slot of this very process (same pid and start time) that is not the
     * handle's own is what an image before exec() left: reclaimed too.
     */
    kgpu_shim_region_detach(r); /* what exec() does: the mapping and descriptors go */
    kgpu_shim_region *after_exec = attach("main");
    assert_int_equal(kgpu_shim_region_reserve(after_exec, 0, 10, 1024 * MIB), KGPU_OK);
    assert_int_equal(kgpu_shim_region_used(after_exec, 0), 10);
    kgpu_shim_region_leave(after_exec);
    kgpu_shim_region_detach(after_exec);
}

static void liveness(void **state)
{
    uint64_t start = kgpu_shim_process_start_time(getpid());
    assert_true(start > 0);
    assert_true(kgpu_shim_process_alive(getpid(), start));
    assert_true(kgpu_shim_process_alive(getpid(), 0));
    assert_false(kgpu_shim_process_alive(getpid(), start + 1)); /* the pid now names another */
    assert_false(kgpu_shim_process_alive(0, 0));
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    waitpid(child, NULL, 0);
    assert_false(kgpu_shim_process_alive(child, 0));
}

static void lock_owner_died(void **state)
{
    kgpu_shim_region *r = attach("main");
    char path[512];
    snprintf(path, sizeof(path), "%s/main.acct", dir);
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 100 * MIB, 1024 * MIB), KGPU_OK);
    pid_t pid = fork();
    if (pid == 0) {
        /* Take the lock, leave the totals inconsistent, and die. */
        int fd = open(path, O_RDWR);
        kgpu_region_file *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        pthread_mutex_lock(&f->lock.mutex);
        atomic_store(&f->dev[0].used, 1000 * MIB);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    /* The next locker repairs the totals from the slots and goes on. */
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 900 * MIB, 1024 * MIB), KGPU_OK);
    assert_int_equal(kgpu_shim_region_used(r, 0), 1000 * MIB);
    kgpu_shim_region_release(r, 0, 1000 * MIB);
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);
    kgpu_shim_region_detach(r);
}

static void fork_child_takes_its_own_slot(void **state)
{
    kgpu_shim_region *r = attach("main");
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 100 * MIB, 1024 * MIB), KGPU_OK);
    pid_t pid = fork();
    if (pid == 0) {
        kgpu_shim_region_forked(r);
        int ok = kgpu_shim_region_mine(r, 0) == 0 &&
                 kgpu_shim_region_reserve(r, 0, 50 * MIB, 1024 * MIB) == KGPU_OK &&
                 kgpu_shim_region_mine(r, 0) == 50 * MIB &&
                 kgpu_shim_region_used(r, 0) == 150 * MIB;
        _exit(ok ? 0 : 1); /* dies holding 50 MiB */
    }
    int status;
    waitpid(pid, &status, 0);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(kgpu_shim_region_mine(r, 0), 100 * MIB);
    assert_int_equal(kgpu_shim_region_reclaim(r), 1);
    assert_int_equal(kgpu_shim_region_used(r, 0), 100 * MIB);
    kgpu_shim_region_leave(r);
    kgpu_shim_region_detach(r);
}

/*
 * A child made without fork's handlers (a raw clone, as _Fork() makes) that
 * exits normally, running the library's destructor, must not free its
 * parent's slot; when it reserves, it takes a slot of its own.
 */
static void quiet_children_leave_the_parent_slot(void **state)
{
    kgpu_shim_region *r = attach("main");
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 100 * MIB, 1024 * MIB), KGPU_OK);
    for (int allocates = 0; allocates < 2; allocates++) {
        pid_t pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) {
            int ok = 1;
            if (allocates)
                ok = kgpu_shim_region_reserve(r, 0, 10 * MIB, 1024 * MIB) == KGPU_OK &&
                     kgpu_shim_region_mine(r, 0) == 10 * MIB &&
                     kgpu_shim_region_used(r, 0) == 110 * MIB;
            else
                ok = kgpu_shim_region_mine(r, 0) == 0; /* not the parent's */
            kgpu_shim_region_release(r, 0, 100 * MIB); /* at most its own */
            kgpu_shim_region_leave(r);                 /* what exit() does */
            _exit(ok ? 0 : 1);
        }
        assert_true(pid > 0);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_int_equal(kgpu_shim_region_mine(r, 0), 100 * MIB);
        assert_int_equal(kgpu_shim_region_used(r, 0), 100 * MIB);
    }
    kgpu_shim_region_leave(r);
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);
    kgpu_shim_region_detach(r);
}

/*
 * One round of a process that opened its driver client (or, client 0, did
 * not), reserved 300 MiB and forked a child that outlives it; the process
 * ends by exit (leave) or, exec 1, by exec (detach) then a new image that
 * reserves 10 MiB and exits. Returns the child's wake pipe once the
 * process is gone; the child is not this process's to wait for.
 */
static int parent_then_child(int client, int exec)
{
    int ready[2], wake[2];
    if (pipe(ready) != 0 || pipe(wake) != 0)
        fail_msg("pipe: %s", strerror(errno));
    pid_t parent = fork();
    if (parent == 0) {
        kgpu_shim_region *r = attach("main");
        if (client)
            kgpu_shim_region_client(r);
        if (kgpu_shim_region_reserve(r, 0, 300 * MIB, 1024 * MIB) != KGPU_OK)
            _exit(1);
        if (fork() == 0) {
            char c;
            kgpu_shim_region_forked(r); /* what the library's fork handler does */
            close(wake[1]);
            if (write(ready[1], "r", 1) != 1 || read(wake[0], &c, 1) < 0)
                _exit(1);
            _exit(0);
        }
        char c;
        if (read(ready[0], &c, 1) != 1)
            _exit(1);
        if (exec) {
            kgpu_shim_region_detach(r); /* the image before exec() */
            r = attach("main");
            if (kgpu_shim_region_reserve(r, 0, 10 * MIB, 1024 * MIB) != KGPU_OK ||
                kgpu_shim_region_used(r, 0) != (client ? 310 : 10) * MIB)
                _exit(2);
        }
        kgpu_shim_region_leave(r); /* exit() */
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(parent, &status, 0), parent);
    assert_int_equal(WEXITSTATUS(status), 0);
    close(ready[0]);
    close(ready[1]);
    close(wake[0]);
    return wake[1];
}

/*
 * A child forked after its parent opened the driver client holds that
 * client too, and so the parent's device memory, until it ends (PyTorch's
 * DataLoader workers): the parent's slot stays charged after the parent
 * exits or execs, and comes back once the child is gone. A child forked
 * before any client holds nothing of the parent's.
 */
static void a_child_holding_the_client_keeps_its_parents_slot(void **state)
{
    kgpu_shim_region *watch = attach("main");
    for (int exec = 0; exec < 2; exec++) {
        int wake = parent_then_child(1, exec);
        assert_int_equal(kgpu_shim_region_used(watch, 0), 300 * MIB);
        assert_int_equal(kgpu_shim_region_reclaim(watch), 0);
        assert_int_equal(kgpu_shim_region_used(watch, 0), 300 * MIB);
        close(wake); /* the child ends */
        for (int i = 0; i < 5000 && kgpu_shim_region_used(watch, 0) != 0; i++) {
            kgpu_shim_region_reclaim(watch);
            usleep(1000);
        }
        assert_int_equal(kgpu_shim_region_used(watch, 0), 0);
    }
    int wake = parent_then_child(0, 0);
    assert_int_equal(kgpu_shim_region_used(watch, 0), 0);
    close(wake);
    kgpu_shim_region_detach(watch);
}

/*
 * A process in a PID namespace of its own records a pid that means another
 * process (or none) here: its slot lives as long as it does, judged by the
 * lock it holds, and is reclaimed once it is gone.
 */
static void pid_namespaces_do_not_fool_the_sweep(void **state)
{
    kgpu_shim_region *r = attach("main");
    int ready[2], wake[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(wake), 0);
    pid_t outer = fork();
    if (outer == 0) {
        if (unshare(CLONE_NEWPID) != 0)
            _exit(77);
        pid_t inner = fork(); /* pid 1 of the new namespace */
        if (inner == 0) {
            kgpu_shim_region *q = NULL;
            kgpu_error err;
            char c;
            if (getpid() != 1 || kgpu_shim_region_attach(dir, "main", &lim, &q, &err) != KGPU_OK ||
                kgpu_shim_region_reserve(q, 0, 200 * MIB, 1024 * MIB) != KGPU_OK ||
                write(ready[1], "r", 1) != 1 || read(wake[0], &c, 1) != 1)
                _exit(1);
            _exit(0); /* gone without leaving its slot */
        }
        int status;
        waitpid(inner, &status, 0);
        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 2);
    }
    char c;
    close(ready[1]);
    if (read(ready[0], &c, 1) != 1) {
        int status;
        waitpid(outer, &status, 0);
        if (WEXITSTATUS(status) == 77)
            skip(); /* no PID namespaces here (unprivileged) */
        fail_msg("the process in a new PID namespace failed (status %d)", status);
    }
    /* Its pid 1 is init here, started long before: by pid it would look dead. */
    assert_int_equal(kgpu_shim_region_reclaim(r), 0);
    assert_int_equal(kgpu_shim_region_used(r, 0), 200 * MIB);
    assert_int_equal(kgpu_shim_region_reserve(r, 0, 900 * MIB, 1024 * MIB), KGPU_ENOFIT);
    assert_int_equal(write(wake[1], "g", 1), 1);
    int status;
    assert_int_equal(waitpid(outer, &status, 0), outer);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(kgpu_shim_region_reclaim(r), 1);
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);
    close(ready[0]);
    close(wake[0]);
    close(wake[1]);
    kgpu_shim_region_detach(r);
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Processes reserve and release at random; after each success the total is within the limit. */
static void processes_race_for_one_limit(void **state)
{
    enum { WORKERS = 6, ITERS = 4000, HOLD = 4 };
    const uint64_t limit = 1024 * MIB;
    kgpu_shim_region *r = attach("main");
    pid_t pids[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        pids[w] = fork();
        if (pids[w] != 0)
            continue;
        kgpu_shim_region_forked(r);
        uint64_t seed = (uint64_t)w, held[HOLD];
        int n = 0, bad = 0, refused = 0;
        for (int i = 0; i < ITERS; i++) {
            uint64_t x = splitmix(&seed);
            if (n < HOLD && (n == 0 || x % 3 != 0)) {
                uint64_t b = (1 + (x >> 8) % 400) * MIB;
                if (kgpu_shim_region_reserve(r, 0, b, limit) == KGPU_OK) {
                    held[n++] = b;
                    bad += kgpu_shim_region_used(r, 0) > limit;
                } else {
                    refused++;
                }
            } else {
                int k = (int)((x >> 16) % (uint64_t)n);
                kgpu_shim_region_release(r, 0, held[k]);
                held[k] = held[--n];
            }
        }
        while (n > 0)
            kgpu_shim_region_release(r, 0, held[--n]);
        _exit(bad != 0 ? 1 : refused == 0 ? 2 : 0);
    }
    for (int w = 0; w < WORKERS; w++) {
        int status;
        assert_int_equal(waitpid(pids[w], &status, 0), pids[w]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("worker %d: status %d (1: over the limit, 2: never refused)", w, status);
    }
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);
    kgpu_shim_region_detach(r);
}

typedef struct racer {
    kgpu_shim_region *r;
    uint64_t seed, limit;
    int bad, refused;
} racer;

/* One thread of a racing process: reserve and release at random, all given back at the end. */
static void *race_thread(void *arg)
{
    racer *x = arg;
    uint64_t held[4];
    int n = 0;
    for (int i = 0; i < 3000; i++) {
        uint64_t v = splitmix(&x->seed);
        if (n < 4 && (n == 0 || v % 3 != 0)) {
            uint64_t b = (1 + (v >> 8) % 300) * MIB;
            if (kgpu_shim_region_reserve(x->r, 0, b, x->limit) == KGPU_OK) {
                held[n++] = b;
                x->bad += kgpu_shim_region_used(x->r, 0) > x->limit;
            } else {
                x->refused++;
            }
        } else {
            int k = (int)((v >> 16) % (uint64_t)n);
            kgpu_shim_region_release(x->r, 0, held[k]);
            held[k] = held[--n];
        }
    }
    while (n > 0)
        kgpu_shim_region_release(x->r, 0, held[--n]);
    return NULL;
}

/*
 * The hot path takes no lock: threads of several processes race, and one
 * more process is killed in the middle of its own race, holding memory and
 * perhaps between the two steps of a reservation. The total never passes
 * the limit, and once the dead process's slot is reclaimed (the totals
 * counted again) it is 0: nothing leaks, nothing is counted twice.
 */
static void threads_and_a_killed_process_race(void **state)
{
    enum { PROCS = 3, THREADS = 3 };
    const uint64_t limit = 2048 * MIB;
    kgpu_shim_region *r = attach("main");
    pid_t pids[PROCS + 1];
    for (int p = 0; p <= PROCS; p++) {
        pids[p] = fork();
        if (pids[p] != 0)
            continue;
        kgpu_shim_region_forked(r);
        racer x[THREADS];
        pthread_t th[THREADS];
        for (int i = 0; i < THREADS; i++) {
            x[i] = (racer){.r = r, .seed = (uint64_t)(p * 16 + i), .limit = limit};
            pthread_create(&th[i], NULL, race_thread, &x[i]);
        }
        int bad = 0;
        for (int i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            bad += x[i].bad;
        }
        if (p == PROCS) /* the one to be killed: hold on, then keep racing until it is */
            for (;;) {
                racer y = {.r = r, .seed = 99, .limit = limit};
                race_thread(&y);
                kgpu_shim_region_reserve(r, 0, 64 * MIB, limit);
            }
        _exit(bad != 0 ? 1 : 0);
    }
    for (int p = 0; p < PROCS; p++) {
        int status;
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("process %d: status %d (1: over the limit)", p, status);
    }
    kill(pids[PROCS], SIGKILL);
    waitpid(pids[PROCS], NULL, 0);
    assert_true(kgpu_shim_region_used(r, 0) <= limit);
    /* The killed one, and those of the others not reclaimed by a racer's slow path yet. */
    assert_true(kgpu_shim_region_reclaim(r) >= 1);
    assert_int_equal(kgpu_shim_region_used(r, 0), 0);
    kgpu_shim_region_detach(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(created_whole_and_private, setup, teardown),
        cmocka_unit_test_setup_teardown(refuses_what_it_should_not_map, setup, teardown),
        cmocka_unit_test_setup_teardown(reserve_check_and_release, setup, teardown),
        cmocka_unit_test_setup_teardown(dead_processes_memory_comes_back, setup, teardown),
        cmocka_unit_test_setup_teardown(reclaim_at_attach_and_after_exec, setup, teardown),
        cmocka_unit_test_setup_teardown(liveness, setup, teardown),
        cmocka_unit_test_setup_teardown(lock_owner_died, setup, teardown),
        cmocka_unit_test_setup_teardown(fork_child_takes_its_own_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(quiet_children_leave_the_parent_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(a_child_holding_the_client_keeps_its_parents_slot, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(pid_namespaces_do_not_fool_the_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(processes_race_for_one_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(threads_and_a_killed_process_race, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
