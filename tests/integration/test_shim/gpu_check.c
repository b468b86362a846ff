/*
 * libkgpu-limit.so in front of the real driver, on a machine with an
 * NVIDIA GPU (CTest label "gpu"). First, without the library, it reads
 * GPU 0's UUID and writes a limits file giving that GPU KGPU_GPU_CHECK_MIB
 * MiB (default 1024); then it runs itself again with the library preloaded
 * and checks that cuMemGetInfo shows the share, that an allocation within
 * it succeeds and one past it fails with CUDA_ERROR_OUT_OF_MEMORY, through
 * dlsym and through cuGetProcAddress, and that a free gives it back.
 * Exits 77 (skipped) without a driver or a GPU.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadecl.h"

#define MIB (1024ULL * 1024ULL)

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct api {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*uuid)(CUuuid *, CUdevice);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*proc)(const char *, void **, int, cuuint64_t);
} api;

static int load(api *a)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    *(void **)&a->init = dlsym(h, "cuInit");
    *(void **)&a->device_get = dlsym(h, "cuDeviceGet");
    *(void **)&a->uuid = dlsym(h, "cuDeviceGetUuid");
    *(void **)&a->retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&a->set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&a->info = dlsym(h, "cuMemGetInfo_v2");
    *(void **)&a->alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&a->free = dlsym(h, "cuMemFree_v2");
    *(void **)&a->proc = dlsym(h, "cuGetProcAddress");
    return a->init && a->device_get && a->uuid && a->retain && a->set_current && a->info &&
                   a->alloc && a->free
               ? 0
               : -1;
}

static int phase1(const char *self, unsigned long long mib)
{
    api a;
    CUdevice dev;
    CUuuid u;
    if (load(&a) != 0 || a.init(0) != CUDA_SUCCESS || a.device_get(&dev, 0) != CUDA_SUCCESS) {
        printf("skipped: no CUDA driver or GPU here\n");
        return 77;
    }
    struct stat st;
    if (lstat("/etc/kgpu/limits", &st) == 0) {
        printf("skipped: /etc/kgpu/limits exists, so KGPU_LIMITS_FILE would be ignored\n");
        return 77;
    }
    if (a.uuid(&u, dev) != CUDA_SUCCESS) {
        printf("FAIL: cuDeviceGetUuid\n");
        return 1;
    }
    char dir[] = "/tmp/kgpu-gpu-check-XXXXXX", path[128], shared[128];
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(path, sizeof(path), "%s/limits", dir);
    snprintf(shared, sizeof(shared), "%s/shared", dir);
    mkdir(shared, 0700);
    const unsigned char *b = (const unsigned char *)u.bytes;
    FILE *f = fopen(path, "w");
    fprintf(f,
            "# kgpu limits v1\ndevice 0 uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x memory_mib=%llu core_pct=100\n",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
            b[14], b[15], mib);
    fclose(f);
    printf("limit: GPU 0 gets %llu MiB\n", mib);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* KGPU_GPU_CHECK_LIB: the library where a build folder was moved (gpu-check.sh). */
        const char *lib = getenv("KGPU_GPU_CHECK_LIB");
        setenv("LD_PRELOAD", lib != NULL ? lib : KGPU_SHIM_LIB, 1);
        setenv("KGPU_LIMITS_FILE", path, 1);
        setenv("KGPU_SHARED_DIR", shared, 1);
        setenv("KGPU_CONTAINER", "gpu-check", 1);
        setenv("KGPU_GPU_CHECK_PHASE", "2", 1);
        execl(self, self, (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    char acct[160];
    snprintf(acct, sizeof(acct), "%s/gpu-check.acct", shared);
    unlink(acct);
    rmdir(shared);
    unlink(path);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static int phase2(unsigned long long mib)
{
    api a;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p, q;
    size_t free_b = 0, total = 0;
    const unsigned long long limit = mib * MIB, ctx_charge = 300 * MIB;
    if (load(&a) != 0) {
        printf("FAIL: cannot load the driver with the library preloaded\n");
        return 1;
    }
    CHECK(a.init(0) == CUDA_SUCCESS, "cuInit");
    CHECK(a.device_get(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
    CHECK(a.retain(&ctx, dev) == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    CHECK(a.set_current(ctx) == CUDA_SUCCESS, "cuCtxSetCurrent");
    CHECK(a.info(&free_b, &total) == CUDA_SUCCESS, "cuMemGetInfo_v2");
    printf("cuMemGetInfo: total %llu MiB, free %llu MiB\n", (unsigned long long)total / MIB,
           (unsigned long long)free_b / MIB);
    CHECK(total == limit, "total %zu, expected %llu", total, limit);
    CHECK(free_b <= limit - ctx_charge, "free %zu above the share left", free_b);

    CUresult r = a.alloc(&p, limit - ctx_charge - 64 * MIB);
    printf("cuMemAlloc_v2(%llu MiB) = %d\n", (limit - ctx_charge - 64 * MIB) / MIB, r);
    CHECK(r == CUDA_SUCCESS, "allocation within the share failed: %d", r);
    r = a.alloc(&q, 128 * MIB);
    printf("cuMemAlloc_v2(128 MiB) past the share = %d\n", r);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "allocation past the share returned %d", r);
    if (a.proc != NULL) {
        CUresult (*alloc2)(CUdeviceptr *, size_t) = NULL;
        CHECK(a.proc("cuMemAlloc", (void **)&alloc2, 12000, 0) == CUDA_SUCCESS,
              "cuGetProcAddress(cuMemAlloc)");
        if (alloc2 != NULL) {
            r = alloc2(&q, 128 * MIB);
            printf("cuGetProcAddress route: cuMemAlloc(128 MiB) past the share = %d\n", r);
            CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "through cuGetProcAddress: %d", r);
        }
    }
    CHECK(a.free(p) == CUDA_SUCCESS, "cuMemFree_v2");
    r = a.alloc(&q, 128 * MIB);
    CHECK(r == CUDA_SUCCESS, "after the free, 128 MiB failed: %d", r);
    if (r == CUDA_SUCCESS)
        a.free(q);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}

int main(int argc, char **argv)
{
    const char *m = getenv("KGPU_GPU_CHECK_MIB");
    unsigned long long mib = m != NULL ? strtoull(m, NULL, 10) : 1024;
    if (mib < 512)
        mib = 512; /* room for the context's charge and a test allocation */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("KGPU_GPU_CHECK_PHASE") != NULL)
        return phase2(mib);
    return phase1("/proc/self/exe", mib);
}
