/*
 * What libkgpu-limit.so adds to a cuMemAlloc_v2 + cuMemFree_v2 pair, and to
 * a cuLaunchKernel with no compute limit applying, against the fake driver
 * (tests/fake/fake_cuda.c), in CPU time of the timed thread, in three
 * configurations run in turn in child processes: the driver alone (the
 * baseline), the library preloaded without limits (pass-through), the
 * library enforcing a (memory) limit, and the library with a compute share
 * too, alone on the GPU (so its launches pass the schedule's fast path);
 * and a launch of a function with local memory the context already holds
 * (the fake driver's "kgpufake_local_4096", 4 KiB per thread), which every
 * launch of a real kernel that spills is. Each child times ROUNDS rounds of PAIRS pairs and reports its
 * median; each configuration runs CHILDREN times, interleaved, and the
 * median of those is printed with the difference to the baseline. Asserts
 * nothing.
 *
 *   bench_shim [PATH/TO/libkgpu-limit.so [FAKE_CUDA_DIR]]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadecl.h"

#define PAIRS    200000
#define ROUNDS   7
#define CHILDREN 7
#define SIZE     (1 << 20)

/*
 * The timed thread's CPU time, not the wall clock: on a machine shared with
 * other work (two cores, builds running) the wall clock measures the
 * scheduler, not the library. Time spent waiting for a lock another process
 * holds would not show here, but the children run one at a time.
 */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* In a child: the timed loop, through whatever dlsym hands out (the hooks when preloaded). */
static int child(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "bench_shim: %s\n", dlerror());
        return 1;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    CUresult (*release)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void *, void **, void **) = NULL;
    *(void **)&launch = dlsym(h, "cuLaunchKernel");
    CUcontext ctx;
    if (launch == NULL || init(0) != CUDA_SUCCESS || retain(&ctx, 0) != CUDA_SUCCESS ||
        set(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "bench_shim: the driver did not start\n");
        return 1;
    }
    CUdeviceptr p;
    double rounds[ROUNDS];
    for (int i = 0; i < PAIRS / 10; i++) { /* warm up: tables grown, caches filled */
        alloc(&p, SIZE);
        release(p);
    }
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < PAIRS; i++) {
            if (alloc(&p, SIZE) != CUDA_SUCCESS || release(p) != CUDA_SUCCESS) {
                fprintf(stderr, "bench_shim: a pair failed\n");
                return 1;
            }
        }
        rounds[r] = (now_ns() - t0) / PAIRS;
    }
    double launches[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < PAIRS; i++)
            if (launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
                fprintf(stderr, "bench_shim: a launch failed\n");
                return 1;
            }
        launches[r] = (now_ns() - t0) / PAIRS;
    }
    CUresult (*load)(void **, const void *) =
        (CUresult(*)(void **, const void *))dlsym(h, "cuModuleLoadData");
    CUresult (*get)(void **, void *, const char *) =
        (CUresult(*)(void **, void *, const char *))dlsym(h, "cuModuleGetFunction");
    void *module = NULL, *fn = NULL;
    if (load == NULL || get == NULL || load(&module, "KGPUFAKEMOD 2") != CUDA_SUCCESS ||
        get(&fn, module, "kgpufake_local_4096") != CUDA_SUCCESS) {
        fprintf(stderr, "bench_shim: no function with local memory\n");
        return 1;
    }
    double local[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < PAIRS; i++)
            if (launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
                fprintf(stderr, "bench_shim: a launch with local memory failed\n");
                return 1;
            }
        local[r] = (now_ns() - t0) / PAIRS;
    }
    printf("%.2f %.2f %.2f\n", median(rounds, ROUNDS), median(launches, ROUNDS),
           median(local, ROUNDS));
    return 0;
}

/*
 * Runs this program as a child with `preload` (or none) and `limits` (or
 * none); its median per pair, per launch into *launch, per launch with
 * local memory into *local.
 */
static double run(const char *self, const char *fake_dir, const char *preload, const char *limits,
                  const char *shared, double *launch, double *local)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        setenv("BENCH_SHIM_CHILD", "1", 1);
        setenv("LD_LIBRARY_PATH", fake_dir, 1);
        setenv("KGPU_SHARED_DIR", shared, 1);
        setenv("KGPU_CONTAINER", "bench", 1);
        setenv("KGPU_SCHED_DIR", shared, 1);
        if (preload != NULL)
            setenv("LD_PRELOAD", preload, 1);
        if (limits != NULL)
            setenv("KGPU_LIMITS_FILE", limits, 1);
        else
            unsetenv("KGPU_LIMITS_FILE");
        execl(self, self, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[128] = "";
    ssize_t n = read(fd[0], buf, sizeof(buf) - 1);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    buf[n] = '\0';
    char *end;
    double pair = strtod(buf, &end);
    *launch = strtod(end, &end);
    *local = strtod(end, NULL);
    return pair;
}

int main(int argc, char **argv)
{
    if (getenv("BENCH_SHIM_CHILD") != NULL)
        return child();
    const char *lib = argc > 1 ? argv[1] : KGPU_SHIM_LIB;
    const char *fake_dir = argc > 2 ? argv[2] : KGPU_FAKE_CUDA_DIR;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';

    char dir[] = "/tmp/kgpu-bench-shim-XXXXXX", limits[128], shared[128];
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(limits, sizeof(limits), "%s/limits", dir);
    snprintf(shared, sizeof(shared), "%s/shared", dir);
    mkdir(shared, 0700);
    FILE *f = fopen(limits, "w");
    /* The fake driver's first GPU; a limit no pair comes near. */
    fprintf(f, "# kgpu limits v1\ndevice 0 uuid=GPU-fa4e0000-0000-0000-0000-000000000000 "
               "memory_mib=8192 core_pct=100\n");
    fclose(f);
    char shares[128];
    snprintf(shares, sizeof(shares), "%s/limits-core", dir);
    f = fopen(shares, "w");
    fprintf(f, "# kgpu limits v1\ndevice 0 uuid=GPU-fa4e0000-0000-0000-0000-000000000000 "
               "memory_mib=8192 core_pct=50\n");
    fclose(f);

    const char *names[] = {"driver alone (baseline)", "library, no limits (pass-through)",
                           "library enforcing a limit", "same, with a 50 % compute share"};
    double runs[4][CHILDREN], launches[4][CHILDREN], local[4][CHILDREN];
    const char *preloads[4] = {NULL, lib, lib, lib}, *files[4] = {NULL, NULL, limits, shares};
    for (int c = 0; c < CHILDREN; c++) {
        for (int k = 0; k < 4; k++)
            runs[k][c] =
                run(self, fake_dir, preloads[k], files[k], shared, &launches[k][c], &local[k][c]);
        for (int k = 0; k < 4; k++)
            if (runs[k][c] < 0) {
                fprintf(stderr, "bench_shim: the '%s' child failed (library %s, driver in %s)\n",
                        names[k], lib, fake_dir);
                return 1;
            }
    }
    printf("cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB against the fake driver: median of %d processes"
           " x median of %d rounds x %d pairs\n",
           CHILDREN, ROUNDS, PAIRS);
    double base = median(runs[0], CHILDREN);
    for (int k = 0; k < 3; k++) { /* the compute share changes nothing here */
        double m = median(runs[k], CHILDREN);
        if (k == 0)
            printf("  %-36s %8.1f ns per pair\n", names[k], m);
        else
            printf("  %-36s %8.1f ns per pair  (+%.1f ns)\n", names[k], m, m - base);
    }
    printf("cuLaunchKernel (a memory limit: no compute limit applies; then a compute share):\n");
    double lbase = median(launches[0], CHILDREN);
    for (int k = 0; k < 4; k++) {
        double m = median(launches[k], CHILDREN);
        if (k == 0)
            printf("  %-36s %8.1f ns per launch\n", names[k], m);
        else
            printf("  %-36s %8.1f ns per launch (+%.1f ns)\n", names[k], m, m - lbase);
    }
    printf("cuLaunchKernel of a function with 4 KiB of local memory per thread, held already:\n");
    double bbase = median(local[0], CHILDREN);
    for (int k = 0; k < 4; k++) {
        double m = median(local[k], CHILDREN);
        if (k == 0)
            printf("  %-36s %8.1f ns per launch\n", names[k], m);
        else
            printf("  %-36s %8.1f ns per launch (+%.1f ns)\n", names[k], m, m - bbase);
    }
    char path[256];
    snprintf(path, sizeof(path), "%s/bench.acct", shared);
    unlink(path);
    snprintf(path, sizeof(path), "%s/GPU-fa4e0000-0000-0000-0000-000000000000.sched", shared);
    unlink(path);
    unlink(shares);
    rmdir(shared);
    unlink(limits);
    rmdir(dir);
    return 0;
}
