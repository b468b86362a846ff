/*
 * How well libkgpu-limit.so isolates containers sharing one GPU, measured
 * against the fake driver (tests/fake/fake_cuda.c) in processes set up as
 * containers (a limits file each, one accounting directory, one schedule
 * directory, the library preloaded). Prints figures; asserts nothing.
 *
 *   bench_isolation [--seconds S] [--runs N] [--quick] [--only share|noisy|memory]
 *                   [--ctx-mib MIB] [--lib LIBRARY] [--fake-dir DIR] [--worker PROGRAM]
 *
 * 1. Share accuracy. Two containers with compute shares of 30/70 and 10/90
 *    keep the fake GPU busy for S seconds with one of five patterns (flat
 *    out, training steps, one CUDA graph per step, four processes per
 *    container flat out or in steps); each container's share of the GPU
 *    time both got, from the fake driver's timeline (fakeCudaGpuTime,
 *    summed over its processes), against its core_pct.
 * 2. Noisy neighbour. A victim with core_pct=25 core_limit_pct=25 running
 *    training steps, alone and next to a neighbour with 75 % launching flat
 *    out: its steps per second and the slowdown; the same without the
 *    library for comparison.
 * 3. Memory-limit accuracy (GPU-Virt-Bench's IS-001): per allocation route,
 *    share and first allocation size, a process allocates until refused,
 *    halving the size after each refusal down to 1 MiB; accuracy is
 *    1 - |held - share| / share, where held is what the fake driver's pool
 *    has given the process at the last refusal, as the driver counts it.
 *
 * Per-operation overheads are bench/bench_shim.c's business, not this one's.
 * Compute figures are medians and ranges over N runs, interleaved (the
 * default: S = 3, N = 3, about two and a half minutes; --quick: S = 1,
 * N = 1, about half a minute). docs/shim.md, "Isolation benchmark", says
 * what each figure means and records results.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define UUID0     "GPU-fa4e0000-0000-0000-0000-000000000000" /* the fake driver's GPU 0 */
#define MAX_RUNS  50
#define SERIES    256 /* values a series holds: runs, or the memory part's measurements */
#define MAX_PROCS 8

static const char *lib = KGPU_SHIM_LIB, *fake_dir = KGPU_FAKE_CUDA_DIR,
                  *worker = KGPU_ISOLATION_WORKER;
static char root[] = "/tmp/kgpu-bench-iso-XXXXXX";
static double seconds = 3;
static int runs = 3, serial;
/*
 * What the fake driver's context takes from its pool: by default the
 * library's figure for a context it cannot measure (no NVML here), so that
 * the memory figures are the allocation routes'; --ctx-mib shows what an
 * unmeasured context of another size does.
 */
static int ctx_mib = 300;

/* ---- statistics ---- */

typedef struct {
    double v[SERIES];
    int n;
} series;

static void add(series *s, double x)
{
    if (s->n < SERIES)
        s->v[s->n++] = x;
}

static double median(const series *s)
{
    series t = *s;
    if (t.n == 0)
        return NAN;
    qsort(t.v, (size_t)t.n, sizeof(double), bench_cmp_double);
    return t.n % 2 ? t.v[t.n / 2] : (t.v[t.n / 2 - 1] + t.v[t.n / 2]) / 2;
}

static double lo(const series *s)
{
    double m = INFINITY;
    for (int i = 0; i < s->n; i++)
        m = s->v[i] < m ? s->v[i] : m;
    return m;
}

static double hi(const series *s)
{
    double m = -INFINITY;
    for (int i = 0; i < s->n; i++)
        m = s->v[i] > m ? s->v[i] : m;
    return m;
}

/* ---- processes as containers ---- */

/* One container: its compute share, burst ceiling (0: none), pattern and processes. */
typedef struct {
    const char *name;
    int core, core_limit;
    const char *pattern;
    int procs;
} container;

typedef struct {
    pid_t pid;
    FILE *out;
    int c; /* its container */
} proc;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int write_limits(const char *path, unsigned mib, int core, int core_limit)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "# kgpu limits v1\ndevice 0 uuid=%s memory_mib=%u", UUID0, mib);
    if (core > 0)
        fprintf(f, " core_pct=%d", core);
    if (core_limit > 0)
        fprintf(f, " core_limit_pct=%d", core_limit);
    fprintf(f, "\n");
    return fclose(f);
}

/*
 * Starts the worker with `argv` as a process of container `name` whose files
 * are in `dir` (the library preloaded unless `nolib`); its stdout is
 * p->out, descriptor 3 reads `go_fd` when that is not -1. `queue_ms`: the
 * fake driver's queue depth (0: its default); `ctx`: its context, MiB.
 */
static int spawn(proc *p, const char *dir, const char *name, int nolib, int queue_ms,
                 int ctx, int go_fd, char *const argv[])
{
    int fd[2];
    if (pipe2(fd, O_CLOEXEC) != 0) /* a child holds only its own ends: dup2 clears the flag */
        return -1;
    fflush(stdout);
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        char buf[512];
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        if (go_fd == 3) /* already there: only its close-on-exec flag to clear */
            fcntl(3, F_SETFD, 0);
        else if (go_fd >= 0)
            dup2(go_fd, 3);
        setenv("LD_LIBRARY_PATH", fake_dir, 1);
        snprintf(buf, sizeof(buf), "%s/gpu", dir);
        setenv("FAKE_CUDA_GPU_FILE", buf, 1);
        snprintf(buf, sizeof(buf), "%d", ctx);
        setenv("FAKE_CUDA_CTX_MIB", buf, 1);
        snprintf(buf, sizeof(buf), "%d", queue_ms);
        if (queue_ms > 0)
            setenv("FAKE_CUDA_QUEUE_MS", buf, 1);
        else
            unsetenv("FAKE_CUDA_QUEUE_MS");
        const char *vars[] = {"LD_PRELOAD", "KGPU_LIMITS_FILE", "KGPU_SHARED_DIR",
                              "KGPU_CONTAINER", "KGPU_SCHED_DIR"};
        for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
            unsetenv(vars[i]);
        if (!nolib) {
            setenv("LD_PRELOAD", lib, 1);
            snprintf(buf, sizeof(buf), "%s/%s.limits", dir, name);
            setenv("KGPU_LIMITS_FILE", buf, 1);
            snprintf(buf, sizeof(buf), "%s/shared", dir);
            setenv("KGPU_SHARED_DIR", buf, 1);
            snprintf(buf, sizeof(buf), "%s/sched", dir);
            setenv("KGPU_SCHED_DIR", buf, 1);
            setenv("KGPU_CONTAINER", name, 1);
        }
        execv(worker, argv);
        _exit(127);
    }
    close(fd[1]);
    p->out = fdopen(fd[0], "r");
    return p->out != NULL ? 0 : -1;
}

/* Waits for p; 0 when it exited 0. */
static int reap(proc *p)
{
    int st;
    if (p->out != NULL)
        fclose(p->out);
    p->out = NULL;
    if (p->pid <= 0)
        return -1;
    return waitpid(p->pid, &st, 0) == p->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* A fresh directory for one run: its GPU timeline, accounting and schedule. */
static int fresh_dir(char *dir, size_t size)
{
    snprintf(dir, size, "%s/run-%d", root, ++serial);
    char sub[400];
    if (mkdir(dir, 0700) != 0)
        return -1;
    snprintf(sub, sizeof(sub), "%s/shared", dir);
    mkdir(sub, 0700);
    snprintf(sub, sizeof(sub), "%s/sched", dir);
    return mkdir(sub, 0700);
}

/*
 * Runs containers c[0..n) together for `seconds`; their GPU seconds and
 * steps per second (summed over each one's processes) into gpu[] and rate[].
 */
static int run_compute(const container *c, int n, int nolib, double *gpu, double *rate)
{
    char dir[320], path[400], secs[32];
    proc p[MAX_PROCS];
    int np = 0, go[2], failed = 0;
    if (fresh_dir(dir, sizeof(dir)) != 0 || pipe2(go, O_CLOEXEC) != 0)
        return -1;
    snprintf(secs, sizeof(secs), "%g", seconds);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s.limits", dir, c[i].name);
        failed |= write_limits(path, 4096, c[i].core, c[i].core_limit) != 0;
        gpu[i] = rate[i] = 0;
        int queue = strcmp(c[i].pattern, "flat") == 0 ? 0 : 100; /* a whole step queued */
        for (int k = 0; k < c[i].procs && np < MAX_PROCS && !failed; k++) {
            char *argv[] = {(char *)worker, "compute", (char *)c[i].pattern, secs, NULL};
            p[np].c = i;
            if (spawn(&p[np], dir, c[i].name, nolib, queue, 0, go[0], argv) != 0)
                failed = 1; /* those started are killed below */
            else
                np++;
        }
    }
    close(go[0]);
    char line[256];
    for (int i = 0; i < np && !failed; i++)
        if (fgets(line, sizeof(line), p[i].out) == NULL || strncmp(line, "ready", 5) != 0)
            failed = 1;
    /* Everyone starts at once, a little after the last one is ready. */
    unsigned long long t0 = (unsigned long long)((bench_now_s() + 0.1) * 1e9);
    for (int i = 0; i < np && !failed; i++)
        if (write(go[1], &t0, sizeof(t0)) != (ssize_t)sizeof(t0))
            failed = 1;
    close(go[1]);
    for (int i = 0; i < np; i++) {
        unsigned long long ns = 0, last = 0;
        long steps = 0;
        if (!failed && (fgets(line, sizeof(line), p[i].out) == NULL ||
                        sscanf(line, "gpu_ns=%llu steps=%ld last_ns=%llu", &ns, &steps, &last) != 3))
            failed = 1;
        gpu[p[i].c] += (double)ns / 1e9;
        /*
         * Steps up to the end of the last one in the window: counting whole
         * steps over the window alone would be off by up to a step (7 % of
         * 15 steps), a partial step at the end.
         */
        rate[p[i].c] += last > 0 ? (double)steps / ((double)last / 1e9) : 0;
        if (failed)
            kill(p[i].pid, SIGKILL);
        failed |= reap(&p[i]) != 0;
    }
    rm_tree(dir);
    if (failed)
        fprintf(stderr, "bench_isolation: a worker failed (%s, library %s, driver in %s)\n",
                worker, nolib ? "none" : lib, fake_dir);
    return failed ? -1 : 0;
}

/* ---- 1. share accuracy ---- */

typedef struct {
    const char *name, *pattern;
    int procs;
} pattern;

static const pattern patterns[] = {
    {"flat-out (1-2 ms kernels)", "flat", 1},
    {"training steps (25 x 2 ms, sync)", "train", 1},
    {"one CUDA graph per step", "graph", 1},
    {"4 processes each, flat-out", "flat", 4},
    {"4 processes each, training steps", "train", 4},
};
#define NPATTERNS ((int)(sizeof(patterns) / sizeof(patterns[0])))
static const int splits[] = {30, 10}; /* the first container's share; the other has the rest */
#define NSPLITS   ((int)(sizeof(splits) / sizeof(splits[0])))

static series got[NSPLITS][NPATTERNS], busy[NSPLITS][NPATTERNS];

static int share_run(int s, int k)
{
    container c[2] = {{"a", splits[s], 0, patterns[k].pattern, patterns[k].procs},
                      {"b", 100 - splits[s], 0, patterns[k].pattern, patterns[k].procs}};
    double gpu[2], rate[2];
    if (run_compute(c, 2, 0, gpu, rate) != 0)
        return -1;
    add(&got[s][k], gpu[0] + gpu[1] > 0 ? 100 * gpu[0] / (gpu[0] + gpu[1]) : NAN);
    add(&busy[s][k], 100 * (gpu[0] + gpu[1]) / seconds);
    return 0;
}

static void share_report(void)
{
    printf("\n1. Share accuracy: two containers on one fake GPU, %g s per run, %d run(s);\n"
           "   each container's part of the GPU time both got (fakeCudaGpuTime over its\n"
           "   processes). Goal: within 3 points of its share.\n\n",
           seconds, runs);
    printf("%-6s %-34s %-4s %5s  %-17s  %-25s%s\n", "split", "pattern", "ctr", "share",
           "got: med (range)", "error: med (range)", "busy");
    double worst = 0;
    const char *worst_at = "";
    int worst_split = 0;
    for (int s = 0; s < NSPLITS; s++)
        for (int k = 0; k < NPATTERNS; k++)
            for (int side = 0; side < 2; side++) {
                int share = side == 0 ? splits[s] : 100 - splits[s];
                series g = got[s][k];
                if (side == 1)
                    for (int i = 0; i < g.n; i++)
                        g.v[i] = 100 - g.v[i];
                double m = median(&g), l = lo(&g), h = hi(&g);
                char split[16];
                snprintf(split, sizeof(split), "%d/%d", splits[s], 100 - splits[s]);
                printf("%-6s %-34s %-4s %4d%%  %5.1f (%4.1f-%4.1f)  %+5.1f (%+5.1f..%+5.1f)     "
                       "%3.0f%%\n",
                       side == 0 ? split : "", side == 0 ? patterns[k].name : "",
                       side == 0 ? "a" : "b", share, m, l, h, m - share, l - share, h - share,
                       median(&busy[s][k]));
                double e = fmax(fabs(l - share), fabs(h - share));
                if (side == 0 && e > worst) {
                    worst = e;
                    worst_at = patterns[k].name;
                    worst_split = splits[s];
                }
            }
    printf("\n   worst error over all runs: %.1f points (%d/%d, %s); goal 3\n", worst,
           worst_split, 100 - worst_split, worst_at);
}

/* ---- 2. noisy neighbour ---- */

static series steps_alone[2], steps_with[2], slowdown[2], victim_share[2];

static int noisy_run(int nolib)
{
    container c[2] = {{"victim", 25, 25, "train", 1}, {"noisy", 75, 0, "flat", 1}};
    double gpu[2], alone[2], with[2];
    if (run_compute(c, 1, nolib, gpu, alone) != 0 || run_compute(c, 2, nolib, gpu, with) != 0)
        return -1;
    add(&steps_alone[nolib], alone[0]);
    add(&steps_with[nolib], with[0]);
    add(&slowdown[nolib], alone[0] > 0 ? 100 * (1 - with[0] / alone[0]) : NAN);
    add(&victim_share[nolib], gpu[0] + gpu[1] > 0 ? 100 * gpu[0] / (gpu[0] + gpu[1]) : NAN);
    return 0;
}

static void noisy_report(void)
{
    printf("\n2. Noisy neighbour: a victim (core_pct=25 core_limit_pct=25) running training\n"
           "   steps (25 kernels of 2 ms, then cuStreamSynchronize), alone and next to a\n"
           "   neighbour (core_pct=75) launching flat out; %g s per run, %d run(s).\n"
           "   Goal with the library: slowdown under 5 %%.\n\n",
           seconds, runs);
    printf("%-11s %-22s  %-22s  %-20s  %s\n", "", "alone, steps/s", "with neighbour, steps/s",
           "slowdown %", "victim's GPU share");
    printf("%-11s %-22s  %-22s  %-20s  %s\n", "", "med (range)", "med (range)", "med (range)",
           "with neighbour, med");
    for (int nolib = 0; nolib < 2; nolib++)
        printf("%-11s %6.2f (%6.2f-%6.2f)  %6.2f (%6.2f-%6.2f)  %5.1f (%5.1f..%5.1f)  %5.1f %%\n",
               nolib ? "no library" : "library", median(&steps_alone[nolib]),
               lo(&steps_alone[nolib]), hi(&steps_alone[nolib]), median(&steps_with[nolib]),
               lo(&steps_with[nolib]), hi(&steps_with[nolib]), median(&slowdown[nolib]),
               lo(&slowdown[nolib]), hi(&slowdown[nolib]), median(&victim_share[nolib]));
}

/* ---- 3. memory-limit accuracy ---- */

static const struct {
    const char *arg, *name;
} routes[] = {
    {"alloc", "cuMemAlloc_v2"},        {"pitch", "cuMemAllocPitch_v2"},
    {"vmm", "cuMemCreate+cuMemMap"},   {"async", "cuMemAllocAsync"},
    {"managed", "cuMemAllocManaged"},  {"array", "cuArrayCreate_v2"},
};
#define NROUTES ((int)(sizeof(routes) / sizeof(routes[0])))
static const unsigned shares_mib[] = {1024, 2048, 4096};
#define NSHARES 3
#define NSTARTS 11 /* 1 MiB ... 1 GiB */

/* One process: the accuracy of route r with `share` MiB starting at `start` MiB; held into *held. */
static double memory_one(int r, unsigned share, unsigned start, unsigned floor,
                         unsigned long long *held)
{
    char dir[320], path[400], a[16], b[16], name[32], line[256];
    proc p = {0};
    if (fresh_dir(dir, sizeof(dir)) != 0)
        return NAN;
    snprintf(name, sizeof(name), "m%d", serial);
    snprintf(path, sizeof(path), "%s/%s.limits", dir, name);
    write_limits(path, share, 0, 0);
    snprintf(a, sizeof(a), "%u", start);
    snprintf(b, sizeof(b), "%u", floor);
    char *argv[] = {(char *)worker, "memory", (char *)routes[r].arg, a, b, NULL};
    unsigned long long asked = 0;
    int refusals = 0, ok = spawn(&p, dir, name, 0, 0, ctx_mib, -1, argv) == 0 &&
                          fgets(line, sizeof(line), p.out) != NULL &&
                          sscanf(line, "held=%llu asked=%llu refusals=%d", held, &asked,
                                 &refusals) == 3;
    ok &= reap(&p) == 0;
    rm_tree(dir);
    if (!ok) {
        fprintf(stderr, "bench_isolation: the memory worker failed (%s, %u MiB from %u MiB)\n",
                routes[r].name, share, start);
        return NAN;
    }
    double s = (double)share * 1048576.0;
    return 100 * (1 - fabs((double)*held - s) / s);
}

static int memory_part(void)
{
    printf("\n3. Memory-limit accuracy (GPU-Virt-Bench IS-001): per route, share and first\n"
           "   size (1 MiB ... 1 GiB), one process allocates until refused, halving the size\n"
           "   after each refusal down to 1 MiB (cuMemCreate: the 2 MiB granularity, or\n"
           "   share/512); accuracy = 1 - |held - share| / share, held = the fake driver's\n"
           "   own count of what it gave the process (allocations, and its %d MiB context)\n"
           "   at the last refusal. Goal: 99 %% or more.\n\n",
           ctx_mib);
    printf("%-22s", "route");
    for (int s = 0; s < NSHARES; s++) {
        char h[32];
        snprintf(h, sizeof(h), "%u GiB: med (min)", shares_mib[s] / 1024);
        printf("   %-17s", h);
    }
    printf("   worst: held of share\n");
    series all = {0};
    double all_min = INFINITY;
    const char *all_min_at = "";
    for (int r = 0; r < NROUTES; r++) {
        double worst = INFINITY;
        unsigned long long worst_held = 0;
        unsigned worst_share = 0, worst_start = 0;
        printf("%-22s", routes[r].name);
        for (int s = 0; s < NSHARES; s++) {
            unsigned share = shares_mib[s], floor = 1;
            series acc = {0};
            if (strcmp(routes[r].arg, "vmm") == 0) /* whole granules; the fake's 1024 handles */
                for (floor = 2; share / floor > 512; floor *= 2)
                    ;
            for (int k = 0; k < NSTARTS; k++) {
                unsigned start = 1u << k;
                unsigned long long held = 0;
                double a = memory_one(r, share, start < floor ? floor : start, floor, &held);
                if (isnan(a))
                    return -1;
                add(&acc, a);
                add(&all, a);
                if (a < worst) {
                    worst = a;
                    worst_held = held;
                    worst_share = share;
                    worst_start = start < floor ? floor : start;
                }
            }
            printf("   %7.3f (%7.3f)", median(&acc), lo(&acc));
        }
        printf("   %.1f of %u MiB (from %u MiB)\n", (double)worst_held / 1048576.0, worst_share,
               worst_start);
        if (worst < all_min) {
            all_min = worst;
            all_min_at = routes[r].name;
        }
    }
    printf("\n   overall (%d measurements): median %.3f %%, lowest %.3f %% (%s); goal 99 %%\n",
           all.n, median(&all), all_min, all_min_at);
    return 0;
}

/* ---- main ---- */

static int usage(void)
{
    fprintf(stderr, "usage: bench_isolation [--seconds S] [--runs N] [--quick] "
                    "[--only share|noisy|memory] [--ctx-mib MIB] [--lib LIBRARY] "
                    "[--fake-dir DIR] [--worker PROGRAM]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--quick") == 0)
            seconds = 1, runs = 1;
        else if (strcmp(argv[i], "--seconds") == 0 && v != NULL)
            seconds = strtod(v, NULL), i++;
        else if (strcmp(argv[i], "--runs") == 0 && v != NULL)
            runs = atoi(v), i++;
        else if (strcmp(argv[i], "--only") == 0 && v != NULL)
            only = v, i++;
        else if (strcmp(argv[i], "--lib") == 0 && v != NULL)
            lib = v, i++;
        else if (strcmp(argv[i], "--fake-dir") == 0 && v != NULL)
            fake_dir = v, i++;
        else if (strcmp(argv[i], "--ctx-mib") == 0 && v != NULL)
            ctx_mib = atoi(v), i++;
        else if (strcmp(argv[i], "--worker") == 0 && v != NULL)
            worker = v, i++;
        else
            return usage();
    }
    if (seconds < 0.2 || seconds > 600 || runs < 1 || runs > MAX_RUNS || ctx_mib < 0)
        return usage();
    int do_share = only == NULL || strcmp(only, "share") == 0,
        do_noisy = only == NULL || strcmp(only, "noisy") == 0,
        do_memory = only == NULL || strcmp(only, "memory") == 0;
    if (!do_share && !do_noisy && !do_memory)
        return usage();
    if (mkdtemp(root) == NULL) {
        fprintf(stderr, "bench_isolation: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("bench_isolation: library %s, fake driver in %s\n", lib, fake_dir);
    int rc = 0;
    double t_start = bench_now_s();
    /* Runs interleaved: a slow moment of the machine spreads over every scenario. */
    for (int n = 0; n < runs && rc == 0 && (do_share || do_noisy); n++) {
        fprintf(stderr, "bench_isolation: run %d of %d\n", n + 1, runs);
        for (int s = 0; s < NSPLITS && rc == 0 && do_share; s++)
            for (int k = 0; k < NPATTERNS && rc == 0; k++)
                rc = share_run(s, k);
        for (int nolib = 0; nolib < 2 && rc == 0 && do_noisy; nolib++)
            rc = noisy_run(nolib);
    }
    if (rc == 0 && do_share)
        share_report();
    if (rc == 0 && do_noisy)
        noisy_report();
    if (rc == 0 && do_memory)
        rc = memory_part();
    printf("\n4. Per-operation overheads (a launch, an alloc/free pair): bench/bench_shim.c\n"
           "   (build/bench/bench_shim); not measured here.\n");
    printf("\nbench_isolation: %.0f s in all\n", bench_now_s() - t_start);
    rm_tree(root);
    return rc != 0;
}
