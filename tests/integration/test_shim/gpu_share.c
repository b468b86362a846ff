/*
 * Compute shares (core_pct) through libkgpu-limit.so in front of a real
 * NVIDIA driver (scripts/gpu-check.sh; docs/shim.md, "On a real GPU"): the
 * patterns bench/bench_isolation.c measures on the fake driver, on GPU 0.
 * No CUDA compiler is needed: the kernel is PTX (gpu_kernels.h).
 *
 *   shim_gpu_share              the orchestrator: calibrates a fixed-work
 *                               kernel to about 2 ms, then runs containers
 *                               (a limits file each, one accounting and one
 *                               schedule directory per run, the library
 *                               preloaded) side by side; prints figures
 *                               and FAIL lines; exits 0, 1 or 77 (no GPU)
 *   shim_gpu_share run flat|train|graph SECONDS
 *                               one process of a container: prints "ready",
 *                               reads the start time (CLOCK_MONOTONIC ns,
 *                               8 bytes) from descriptor 3, launches until
 *                               SECONDS later and prints
 *                               "kernels K steps S last_ns T"
 *
 * Patterns: flat, kernels back to back (at most two batches of four
 * queued); train, a training step of 25 kernels then cuStreamSynchronize;
 * graph, the same 25 kernels captured once into a CUDA graph
 * (cuStreamBeginCapture_v2 / cuStreamEndCapture / cuGraphInstantiateWithFlags,
 * what CUDA 12's cuGraphInstantiate is) and one cuGraphLaunch and
 * cuStreamSynchronize per step.
 *
 * Checks: for splits 30/70 and 10/90, with each pattern and with four
 * processes per container (flat and train), the first container's part of
 * the kernels run must be within 5 points of its share. Recorded, never
 * failed: the same 30/70 without the library, and a noisy neighbour (a
 * victim at core_pct=25 core_limit_pct=25 in training steps, alone and next
 * to a 75 % container launching flat out: its steps per second and the
 * slowdown, with and without the library). Each run lasts
 * KGPU_GPU_CHECK_SECONDS (default 8): 15 runs, about three minutes.
 * KGPU_GPU_CHECK_LIB names the library where the build folder was moved.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadecl.h"
#include "gpu_kernels.h"

typedef struct CUevent_st *CUevent;

#define STREAM_NON_BLOCKING  1 /* CU_STREAM_NON_BLOCKING */
#define CAPTURE_MODE_GLOBAL  0 /* CU_STREAM_CAPTURE_MODE_GLOBAL, as frameworks capture */
#define SPIN_BLOCKS_PER_SM   4
#define SPIN_THREADS         256
#define BATCH                4
#define STEP_KERNELS         25
#define GO_FD                3
#define MAX_PROCS            8
#define BAND                 5.0 /* points a share may be off on a real GPU */

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*attribute)(int *, int, CUdevice);
    CUresult (*uuid)(CUuuid *, CUdevice);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*sync)(void);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_sync)(CUstream);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_sync)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    CUresult (*begin_capture)(CUstream, int);
    CUresult (*end_capture)(CUstream, CUgraph *);
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
} A;

static CUdevice dev;
static CUfunction spin_fn;
static CUdeviceptr spin_out;
static unsigned grid;
static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* -1: no driver; -2: a driver without a function used here (said on stdout). */
static int load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    static const struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cuInit", (void **)&A.init},
        {"cuDeviceGet", (void **)&A.device_get},
        {"cuDeviceGetAttribute", (void **)&A.attribute},
        {"cuDeviceGetUuid", (void **)&A.uuid},
        {"cuDevicePrimaryCtxRetain", (void **)&A.retain},
        {"cuCtxSetCurrent", (void **)&A.set_current},
        {"cuCtxSynchronize", (void **)&A.sync},
        {"cuMemAlloc_v2", (void **)&A.alloc},
        {"cuMemFree_v2", (void **)&A.free},
        {"cuModuleLoadData", (void **)&A.module_load},
        {"cuModuleGetFunction", (void **)&A.get_function},
        {"cuLaunchKernel", (void **)&A.launch},
        {"cuStreamCreate", (void **)&A.stream_create},
        {"cuStreamSynchronize", (void **)&A.stream_sync},
        {"cuEventCreate", (void **)&A.event_create},
        {"cuEventRecord", (void **)&A.event_record},
        {"cuEventSynchronize", (void **)&A.event_sync},
        {"cuEventElapsedTime", (void **)&A.event_elapsed},
        {"cuStreamBeginCapture_v2", (void **)&A.begin_capture},
        {"cuStreamEndCapture", (void **)&A.end_capture},
        {"cuGraphInstantiateWithFlags", (void **)&A.instantiate},
        {"cuGraphLaunch", (void **)&A.graph_launch},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
        if ((*syms[i].slot = dlsym(h, syms[i].name)) == NULL) {
            printf("FAIL: the driver lacks %s (CUDA 11.4 or newer is needed)\n", syms[i].name);
            return -2;
        }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The context, the spin kernel and its output buffer; 0 when all worked. */
static int setup(void)
{
    CUcontext ctx;
    CUmodule mod;
    CUresult r;
    int sms = 0;
    if ((r = A.retain(&ctx, dev)) != CUDA_SUCCESS || (r = A.set_current(ctx)) != CUDA_SUCCESS ||
        (r = A.module_load(&mod, kgpu_gpu_ptx)) != CUDA_SUCCESS ||
        (r = A.get_function(&spin_fn, mod, "kgpu_spin")) != CUDA_SUCCESS) {
        printf("FAIL: the context or the PTX kernel: %d\n", r);
        return -1;
    }
    A.attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    grid = (unsigned)((sms > 0 ? sms : 1) * SPIN_BLOCKS_PER_SM);
    if ((r = A.alloc(&spin_out, (size_t)grid * SPIN_THREADS * 4)) != CUDA_SUCCESS) {
        printf("FAIL: no memory for the kernel's output: %d\n", r);
        return -1;
    }
    return 0;
}

static CUresult spin(unsigned *iters, CUstream s)
{
    void *args[] = {&spin_out, iters};
    return A.launch(spin_fn, grid, 1, 1, SPIN_THREADS, 1, 1, 0, s, args, NULL);
}

/* ---- one process of a container ---- */

static int cmd_run(const char *pattern, int seconds)
{
    const char *its = getenv("KGPU_GPU_CHECK_ITERS");
    int flat = strcmp(pattern, "flat") == 0, graph = strcmp(pattern, "graph") == 0;
    if (its == NULL || (!flat && !graph && strcmp(pattern, "train") != 0)) {
        printf("FAIL: run: KGPU_GPU_CHECK_ITERS, and a pattern flat|train|graph, are needed\n");
        return 1;
    }
    unsigned iters = (unsigned)strtoul(its, NULL, 10);
    CUstream s;
    CUevent ev[2];
    CUgraph g = NULL;
    CUgraphExec exec = NULL;
    CUresult r = A.stream_create(&s, STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = A.event_create(&ev[0], 0);
    if (r == CUDA_SUCCESS)
        r = A.event_create(&ev[1], 0);
    if (r != CUDA_SUCCESS) {
        printf("FAIL: run: a stream and two events: %d\n", r);
        return 1;
    }
    if (graph) {
        /* Captured once, launched every step, as CUDA-graph training loops do. */
        r = A.begin_capture(s, CAPTURE_MODE_GLOBAL);
        for (int i = 0; i < STEP_KERNELS && r == CUDA_SUCCESS; i++)
            r = spin(&iters, s);
        CUresult e = A.end_capture(s, &g);
        if (r == CUDA_SUCCESS)
            r = e;
        if (r == CUDA_SUCCESS)
            r = A.instantiate(&exec, g, 0);
        if (r != CUDA_SUCCESS) {
            printf("FAIL: run: capturing a step of %d kernels into a graph: %d\n", STEP_KERNELS,
                   r);
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    uint64_t t0;
    if (read(GO_FD, &t0, sizeof(t0)) != (ssize_t)sizeof(t0)) {
        printf("FAIL: run: no start time on descriptor 3\n");
        return 1;
    }
    uint64_t t1 = t0 + (uint64_t)seconds * 1000000000ULL, now = now_ns(), last = t0;
    if (t0 > now) {
        struct timespec ts = {(time_t)((t0 - now) / 1000000000ULL),
                              (long)((t0 - now) % 1000000000ULL)};
        nanosleep(&ts, NULL);
    }
    long kernels = 0, steps = 0;
    for (int b = 0; (now = now_ns()) < t1; b++) {
        if (flat) {
            /* At most two batches queued, as a framework that synchronises now and then. */
            if (b >= 2)
                A.event_sync(ev[b % 2]);
            for (int i = 0; i < BATCH; i++)
                kernels += spin(&iters, s) == CUDA_SUCCESS;
            A.event_record(ev[b % 2], s);
            continue;
        }
        r = CUDA_SUCCESS;
        if (graph)
            r = A.graph_launch(exec, s);
        else
            for (int i = 0; i < STEP_KERNELS && r == CUDA_SUCCESS; i++)
                r = spin(&iters, s);
        if (r != CUDA_SUCCESS) {
            printf("FAIL: run: %s: %d\n", graph ? "cuGraphLaunch" : "cuLaunchKernel", r);
            return 1;
        }
        kernels += STEP_KERNELS;
        A.stream_sync(s);
        if ((now = now_ns()) <= t1)
            steps++, last = now;
    }
    A.sync();
    printf("kernels %ld steps %ld last_ns %llu\n", kernels, steps,
           (unsigned long long)(last - t0));
    return 0;
}

/* ---- the orchestrator ---- */

static char tmpdir[] = "/tmp/kgpu-gpu-share-XXXXXX";
static char uuid[64], self[4096];
static unsigned iters;
static int seconds, serial;

typedef struct {
    const char *name;
    int core, core_limit;
    const char *pattern;
    int procs;
} container;

typedef struct {
    double kernels, rate; /* kernels run; steps per second */
} outcome;

/* Milliseconds one kernel of `n` iterations takes alone. */
static double spin_ms(unsigned n)
{
    CUevent a, b;
    float ms = 0;
    A.event_create(&a, 0);
    A.event_create(&b, 0);
    A.event_record(a, NULL);
    spin(&n, NULL);
    A.event_record(b, NULL);
    A.event_sync(b);
    A.event_elapsed(&ms, a, b);
    return ms;
}

/*
 * Starts one process of container c (the library preloaded unless `nolib`);
 * its stdout is read from *out_fd, descriptor 3 from `go_fd`. Every pipe is
 * made close-on-exec, so a child holds only its own two ends.
 */
static pid_t start(const char *dir, const container *c, int nolib, int go_fd, int *out_fd)
{
    int fd[2];
    if (pipe2(fd, O_CLOEXEC) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0) {
        close(fd[1]);
        *out_fd = fd[0];
        return pid;
    }
    char path[400], secs[16];
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    if (go_fd == GO_FD) /* already there: only its close-on-exec flag to clear */
        fcntl(GO_FD, F_SETFD, 0);
    else
        dup2(go_fd, GO_FD);
    if (!nolib) {
        snprintf(path, sizeof(path), "%s/%s.limits", dir, c->name);
        setenv("KGPU_LIMITS_FILE", path, 1);
        snprintf(path, sizeof(path), "%s/shared", dir);
        setenv("KGPU_SHARED_DIR", path, 1);
        snprintf(path, sizeof(path), "%s/sched", dir);
        setenv("KGPU_SCHED_DIR", path, 1);
        setenv("KGPU_CONTAINER", c->name, 1);
        const char *lib = getenv("KGPU_GPU_CHECK_LIB");
        setenv("LD_PRELOAD", lib != NULL ? lib : KGPU_SHIM_LIB, 1);
    }
    snprintf(secs, sizeof(secs), "%d", seconds);
    alarm((unsigned)seconds + 180); /* never outlive the check, whatever the driver does */
    execl(self, self, "run", c->pattern, secs, (char *)NULL);
    _exit(127);
}

/* Reads one line of a child's output; FAIL lines are passed on. */
static int line_of(FILE *f, char *buf, size_t size)
{
    while (fgets(buf, (int)size, f) != NULL) {
        if (strncmp(buf, "FAIL", 4) == 0)
            fputs(buf, stdout);
        else
            return 0;
    }
    return -1;
}

/* Runs containers c[0..n) side by side; per container, kernels and steps/s into o[]. */
static int run(const container *c, int n, int nolib, outcome *o)
{
    char dir[320], path[400], line[256];
    int go[2], np = 0, bad = 0, fd, cont[MAX_PROCS];
    pid_t pid[MAX_PROCS];
    FILE *out[MAX_PROCS];
    snprintf(dir, sizeof(dir), "%s/run-%d", tmpdir, ++serial);
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/shared", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/sched", dir);
    mkdir(path, 0700);
    if (pipe2(go, O_CLOEXEC) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s.limits", dir, c[i].name);
        FILE *f = fopen(path, "w");
        if (f == NULL)
            return -1;
        fprintf(f, "# kgpu limits v1\ndevice 0 uuid=%s memory_mib=8192 core_pct=%d", uuid,
                c[i].core);
        if (c[i].core_limit > 0)
            fprintf(f, " core_limit_pct=%d", c[i].core_limit);
        fprintf(f, "\n");
        fclose(f);
        o[i].kernels = o[i].rate = 0;
        for (int k = 0; k < c[i].procs && np < MAX_PROCS; k++, np++) {
            pid[np] = start(dir, &c[i], nolib, go[0], &fd);
            out[np] = pid[np] > 0 ? fdopen(fd, "r") : NULL;
            cont[np] = i;
            bad |= out[np] == NULL;
        }
    }
    close(go[0]);
    for (int i = 0; i < np && !bad; i++)
        bad |= line_of(out[i], line, sizeof(line)) != 0 || strncmp(line, "ready", 5) != 0;
    uint64_t t0 = now_ns() + 200000000ULL; /* all start together, once all are ready */
    for (int i = 0; i < np && !bad; i++)
        bad |= write(go[1], &t0, sizeof(t0)) != (ssize_t)sizeof(t0);
    close(go[1]);
    for (int i = 0; i < np; i++) {
        long kernels = 0, steps = 0;
        unsigned long long last = 0;
        if (!bad && (line_of(out[i], line, sizeof(line)) != 0 ||
                     sscanf(line, "kernels %ld steps %ld last_ns %llu", &kernels, &steps,
                            &last) != 3))
            bad = 1;
        if (bad && pid[i] > 0)
            kill(pid[i], SIGKILL);
        if (out[i] != NULL)
            fclose(out[i]);
        int st;
        bad |= pid[i] <= 0 || waitpid(pid[i], &st, 0) != pid[i] || !WIFEXITED(st) ||
               WEXITSTATUS(st) != 0;
        o[cont[i]].kernels += (double)kernels;
        o[cont[i]].rate += last > 0 ? (double)steps / ((double)last / 1e9) : 0;
    }
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", dir);
    if (bad) {
        printf("FAIL: a run of %d process(es) did not complete\n", np);
        failures++;
    }
    return bad ? -1 : 0;
}

/* The first container's part of the kernels run, in percent; -1 when the run failed. */
static double split(int core_a, const char *pattern, int procs, int nolib)
{
    container c[2] = {{"a", core_a, 0, pattern, procs}, {"b", 100 - core_a, 0, pattern, procs}};
    outcome o[2];
    if (run(c, 2, nolib, o) != 0 || o[0].kernels + o[1].kernels <= 0)
        return -1;
    return 100 * o[0].kernels / (o[0].kernels + o[1].kernels);
}

static void noisy(int nolib)
{
    container c[2] = {{"victim", 25, 25, "train", 1}, {"noisy", 75, 0, "flat", 1}};
    outcome alone[1], with[2];
    if (run(c, 1, nolib, alone) != 0 || run(c, 2, nolib, with) != 0)
        return;
    double share = 100 * with[0].kernels / (with[0].kernels + with[1].kernels);
    printf("noisy neighbour, %s: the victim (25 %%, training steps) ran %.2f steps/s alone, "
           "%.2f next to a 75 %% container flat out: slowdown %.1f %% (recorded; goal < 5 %% "
           "with the library); its part of the kernels %.1f %%\n",
           nolib ? "without the library" : "with the library", alone[0].rate, with[0].rate,
           alone[0].rate > 0 ? 100 * (1 - with[0].rate / alone[0].rate) : 0, share);
}

static int orchestrate(void)
{
    int loaded = load();
    if (loaded == -2)
        return 1;
    if (loaded != 0) {
        printf("skipped: no CUDA driver or GPU here\n");
        return 77;
    }
    int first = kgpu_gpu_first(A.init, A.device_get, A.uuid, &dev, uuid, sizeof(uuid));
    if (first != 0)
        return first;
    if (mkdtemp(tmpdir) == NULL || setup() != 0)
        return 1;
    /* A fixed-work kernel of about 2 ms alone. */
    iters = 100000;
    spin_ms(iters); /* the first launch pays for setting up */
    double ms = spin_ms(iters);
    if (ms > 0)
        iters = (unsigned)(iters * 2.0 / ms);
    ms = spin_ms(iters);
    A.free(spin_out);
    char it[32];
    snprintf(it, sizeof(it), "%u", iters);
    setenv("KGPU_GPU_CHECK_ITERS", it, 1);
    const char *s = getenv("KGPU_GPU_CHECK_SECONDS");
    seconds = s != NULL && atoi(s) > 0 ? atoi(s) : 8;
    printf("GPU 0: %s; one kernel of %u iterations x %u blocks takes %.2f ms alone; %d s per "
           "run\n",
           uuid, iters, grid, ms, seconds);

    static const struct {
        const char *name, *pattern;
        int procs;
    } patterns[] = {
        {"flat-out", "flat", 1},
        {"training steps (25 kernels, sync)", "train", 1},
        {"one CUDA graph per step", "graph", 1},
        {"4 processes each, flat-out", "flat", 4},
        {"4 processes each, training steps", "train", 4},
    };
    static const int splits[] = {30, 10};
    for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++)
        for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
            int a = splits[k];
            double got = split(a, patterns[p].pattern, patterns[p].procs, 0);
            if (got < 0)
                continue;
            printf("share %d/%d, %s: the %d %% container got %.1f %% of the kernels (%+.1f "
                   "points)\n",
                   a, 100 - a, patterns[p].name, a, got, got - a);
            CHECK(got >= a - BAND && got <= a + BAND,
                  "%d/%d, %s: the %d %% container got %.1f %%, outside %.0f-%.0f", a, 100 - a,
                  patterns[p].name, a, got, a - BAND, a + BAND);
        }
    double base = split(30, "flat", 1, 1);
    if (base >= 0)
        printf("without the library, 30/70 flat-out: %.1f %% / %.1f %% (time-sliced by the "
               "driver)\n",
               base, 100 - base);
    noisy(0);
    noisy(1);

    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    if (argc < 2)
        return orchestrate();
    if (strcmp(argv[1], "run") == 0 && argc >= 4) {
        if (load() != 0 || A.init(0) != CUDA_SUCCESS || A.device_get(&dev, 0) != CUDA_SUCCESS ||
            setup() != 0)
            return 1;
        seconds = atoi(argv[3]);
        return cmd_run(argv[2], seconds);
    }
    fprintf(stderr, "usage: shim_gpu_share [run flat|train|graph SECONDS]\n");
    return 2;
}
