/*
 * The program the node suite runs inside its containers: a GPU job as small
 * as it can be. It finds the driver the way CUDA runtimes do (dlopen of
 * libcuda.so.1 and libnvidia-ml.so.1 from the loader's search path, where
 * the GPU runtime mounts them), so every call goes through libkgpu-limit.so
 * when /etc/ld.so.preload has put it in front. It prints what it saw as
 * "key value" lines for the test to read from the container's log.
 *
 *   gpu_job show                  environment, limits file, whether the
 *                                 library is loaded; no driver calls
 *   gpu_job run max [SECONDS]     allocate everything cuMemGetInfo calls
 *                                 free, then one MiB more; hold SECONDS
 *   gpu_job run MIB [SECONDS]     allocate MIB in one block; hold SECONDS
 *   gpu_job share GO SECONDS      (fake driver's timed kernels) wait for the
 *                                 file GO to hold a start time (CLOCK_MONOTONIC
 *                                 ns), then keep the GPU busy with 1 ms kernels
 *                                 for SECONDS; print the GPU time they got
 *
 * Exit status: 0 when the driver answered (whatever the allocations did),
 * 3 when the driver could not be opened or initialised, 2 on bad usage.
 * Built twice by the suite: dynamically, and statically (-static), the
 * latter standing for an image whose C library cannot load the library.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

#define MIB ((size_t)1024 * 1024)

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (p == NULL)
        printf("missing %s\n", name);
    return p;
}

static void show(void)
{
    static const char *const vars[] = {"NVIDIA_VISIBLE_DEVICES", "KGPU_MEMORY_LIMIT_MIB",
                                       "KGPU_CORE_LIMIT_PCT",    "KGPU_SHARED_DIR",
                                       "KGPU_CONTAINER",         "KGPU_LIMITS_FILE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        printf("env %s=%s\n", vars[i], v ? v : "");
    }
    FILE *f = fopen("/etc/kgpu/limits", "r");
    if (f == NULL) {
        printf("limits absent\n");
    } else {
        char line[512];
        while (fgets(line, sizeof(line), f) != NULL)
            printf("limits %s", line[strlen(line) - 1] == '\n' ? line : strcat(line, "\n"));
        fclose(f);
    }
    /* Whether the preloaded library is mapped into this process. */
    int loaded = 0;
    FILE *m = fopen("/proc/self/maps", "r");
    if (m != NULL) {
        char line[1024];
        while (!loaded && fgets(line, sizeof(line), m) != NULL)
            loaded = strstr(line, "libkgpu-limit.so") != NULL;
        fclose(m);
    }
    printf("shim %s\n", loaded ? "loaded" : "absent");
}

static int nvml_total(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("nvml unavailable %s\n", dlerror());
        return -1;
    }
    int (*init)(void) = (int (*)(void))sym(lib, "nvmlInit_v2");
    int (*get)(unsigned, void **) = (int (*)(unsigned, void **))sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*mem)(void *, unsigned long long *) =
        (int (*)(void *, unsigned long long *))sym(lib, "nvmlDeviceGetMemoryInfo");
    if (!init || !get || !mem)
        return -1;
    void *h = NULL;
    unsigned long long info[3] = {0, 0, 0}; /* total, free, used */
    int rc = init();
    if (rc == 0)
        rc = get(0, &h);
    if (rc == 0)
        rc = mem(h, info);
    printf("nvml_rc %d\n", rc);
    if (rc == 0)
        printf("nvml_total_mib %llu\n", info[0] / (1024ULL * 1024ULL));
    return rc;
}

static int run(const char *amount, int hold)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("driver unavailable %s\n", dlerror());
        return 3;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))sym(lib, "cuInit");
    CUresult (*count)(int *) = (CUresult(*)(int *))sym(lib, "cuDeviceGetCount");
    CUresult (*total)(size_t *, int) = (CUresult(*)(size_t *, int))sym(lib, "cuDeviceTotalMem_v2");
    CUresult (*uuid)(unsigned char *, int) =
        (CUresult(*)(unsigned char *, int))sym(lib, "cuDeviceGetUuid_v2");
    CUresult (*retain)(CUcontext *, int) =
        (CUresult(*)(CUcontext *, int))sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))sym(lib, "cuCtxSetCurrent");
    CUresult (*info)(size_t *, size_t *) = (CUresult(*)(size_t *, size_t *))sym(lib, "cuMemGetInfo_v2");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))sym(lib, "cuMemAlloc_v2");
    CUresult (*release)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))sym(lib, "cuMemFree_v2");
    if (!init || !count || !total || !uuid || !retain || !setcur || !info || !alloc || !release)
        return 3;
    CUresult rc = init(0);
    printf("cuInit %d\n", rc);
    if (rc != 0)
        return 3;
    int n = 0;
    count(&n);
    printf("devices %d\n", n);
    if (n < 1)
        return 3;
    size_t bytes = 0;
    total(&bytes, 0);
    printf("total_mib %zu\n", bytes / MIB);
    unsigned char u[16];
    if (uuid(u, 0) == 0)
        printf("uuid GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
               u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
               u[13], u[14], u[15]);
    CUcontext ctx = NULL;
    printf("ctx %d\n", (rc = retain(&ctx, 0)) == 0 ? setcur(ctx) : rc);
    size_t free_b = 0, total_b = 0;
    rc = info(&free_b, &total_b);
    printf("meminfo %d free_mib %zu total_mib %zu\n", rc, free_b / MIB, total_b / MIB);
    nvml_total();

    CUdeviceptr a = 0, b = 0;
    if (strcmp(amount, "max") == 0) {
        rc = alloc(&a, free_b);
        printf("alloc_within %d mib %zu\n", rc, free_b / MIB);
        rc = alloc(&b, MIB);
        printf("alloc_past %d\n", rc);
    } else {
        size_t want = strtoull(amount, NULL, 10) * MIB;
        rc = alloc(&a, want);
        printf("alloc %d mib %zu\n", rc, want / MIB);
    }
    if (hold > 0) {
        printf("holding %d\n", hold);
        fflush(stdout);
        sleep((unsigned)hold);
    }
    if (a)
        release(a);
    if (b)
        release(b);
    printf("done\n");
    return 0;
}

static unsigned long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/*
 * Launches as a compute-bound job does, on the fake driver whose kernels
 * take the time their grid's x says (microseconds) on a timeline shared by
 * every process given the same FAKE_CUDA_GPU_FILE.
 */
static int share(const char *go, int seconds)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("driver unavailable %s\n", dlerror());
        return 3;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))sym(lib, "cuInit");
    CUresult (*retain)(CUcontext *, int) =
        (CUresult(*)(CUcontext *, int))sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))sym(lib, "cuCtxSetCurrent");
    CUresult (*sync)(void) = (CUresult(*)(void))sym(lib, "cuCtxSynchronize");
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void *, void **, void **) = NULL;
    CUresult (*gpu_time)(unsigned long long, unsigned long long, unsigned long long *) = NULL;
    *(void **)&launch = sym(lib, "cuLaunchKernel");
    *(void **)&gpu_time = sym(lib, "fakeCudaGpuTime"); /* not a driver function: the fake's */
    CUcontext ctx = NULL;
    if (!init || !retain || !setcur || !sync || !launch || !gpu_time || init(0) != 0 ||
        retain(&ctx, 0) != 0 || setcur(ctx) != 0)
        return 3;
    printf("ready\n");
    unsigned long long t0 = 0;
    for (int i = 0; i < 240000 && t0 == 0; i++) { /* two minutes */
        FILE *f = fopen(go, "r");
        if (f == NULL || fscanf(f, "%llu", &t0) != 1)
            t0 = 0;
        if (f != NULL)
            fclose(f);
        if (t0 == 0)
            usleep(500);
    }
    if (t0 == 0) {
        printf("no start\n");
        return 2;
    }
    unsigned long long now = mono_ns(), t1 = t0 + (unsigned long long)seconds * 1000000000ULL;
    if (t0 > now)
        usleep((useconds_t)((t0 - now) / 1000));
    int failed = 0;
    while (mono_ns() < t1 && !failed)
        for (int i = 0; i < 8 && !failed; i++) /* 1 ms kernels, in batches as frameworks queue */
            failed = launch(NULL, 1000, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
    sync();
    unsigned long long ns = 0;
    gpu_time(t0, t1, &ns);
    printf("launch_failed %d\n", failed);
    printf("gpu_ns %llu\n", ns);
    printf("done\n");
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "show") == 0) {
        show();
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "run") == 0) {
        show();
        return run(argv[2], argc >= 4 ? atoi(argv[3]) : 0);
    }
    if (argc >= 4 && strcmp(argv[1], "share") == 0) {
        show();
        return share(argv[2], atoi(argv[3]));
    }
    fprintf(stderr, "usage: gpu_job show | gpu_job run max|MIB [SECONDS] | "
                    "gpu_job share GO SECONDS\n");
    return 2;
}
