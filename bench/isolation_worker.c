/*
 * One process of one container for bench/bench_isolation.c, run with
 * libkgpu-limit.so preloaded (or not) in front of the fake driver
 * (tests/fake/fake_cuda.c). Kept apart from the benchmark so that what the
 * library is preloaded into links nothing but the C library: the driver is
 * found as CUDA runtimes find it, dlopen("libcuda.so.1") and dlsym, which
 * the library answers with its hooks.
 *
 *   isolation_worker compute flat|train|graph SECONDS
 *       Sets up its context, prints "ready", reads the start time
 *       (CLOCK_MONOTONIC ns, 8 bytes) from descriptor 3, then keeps the
 *       fake GPU busy until SECONDS later:
 *         flat   kernels of 1-2 ms launched back to back, never waiting
 *         train  a training step: 25 kernels of 2 ms, cuStreamSynchronize
 *         graph  the same step as one CUDA graph of 25 kernel nodes, one
 *                cuGraphLaunch and cuStreamSynchronize per step
 *       Prints "gpu_ns=N steps=M last_ns=T": its GPU time in the window,
 *       as the fake driver's timeline counts it (fakeCudaGpuTime), the
 *       steps (kernels, for flat) finished within the window, and when
 *       the last of them finished (ns after the start).
 *
 *   isolation_worker memory ROUTE START_MIB FLOOR_MIB
 *       Allocates START_MIB at a time by ROUTE until one is refused, then
 *       halves the size and goes on, as an application retrying smaller
 *       would, down to FLOOR_MIB; at the last refusal prints
 *       "held=B asked=B refusals=N": the bytes the fake driver's pool has
 *       given this process (fakeCudaPoolUsed, its own count, past any
 *       interception) and the sum of the sizes the successful calls asked
 *       for. ROUTE: alloc, pitch, vmm, async, managed, array.
 *
 * Exit status 0, or 1 with a line on stderr saying what failed.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudadecl.h"

#define MIB        (1024ULL * 1024ULL)
#define STEP_N     25   /* kernels per training step */
#define STEP_US    2000 /* each kernel's duration on the fake GPU (its grid x) */
#define GO_FD      3
#define MAX_PIECES 65536

/* CUmemAllocationProp in full (the driver reads every field). */
typedef struct {
    int type, requested_handle_types;
    struct {
        int type, id;
    } location;
    void *win32_handle_meta_data;
    struct {
        unsigned char compression_type, gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
} mem_prop;

/* CUDA_KERNEL_NODE_PARAMS (the first version), as cuGraphAddKernelNode reads it. */
typedef struct {
    void *func;
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    void **params, **extra;
} kernel_node;

#define FORMAT_FLOAT 0x20
#define ATTACH_GLOBAL 1

static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*stream_sync)(CUstream);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*graph_create)(CUgraph *, unsigned);
    CUresult (*add_kernel)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                           const kernel_node *);
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const mem_prop *,
                       unsigned long long);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    /* Not driver functions: the fake driver's own counters. */
    CUresult (*gpu_time)(unsigned long long, unsigned long long, unsigned long long *);
    CUresult (*pool_used)(int, unsigned long long *);
} D;

static int die(const char *what, int r)
{
    fprintf(stderr, "isolation_worker: %s (%d)\n", what, r);
    return 1;
}

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* The driver's functions through dlsym (the library's hooks when it is preloaded). */
static int load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "isolation_worker: %s\n", dlerror());
        return -1;
    }
    static const struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cuInit", (void **)&D.init},
        {"cuDevicePrimaryCtxRetain", (void **)&D.retain},
        {"cuCtxSetCurrent", (void **)&D.set_current},
        {"cuLaunchKernel", (void **)&D.launch},
        {"cuStreamSynchronize", (void **)&D.stream_sync},
        {"cuStreamCreate", (void **)&D.stream_create},
        {"cuGraphCreate", (void **)&D.graph_create},
        {"cuGraphAddKernelNode", (void **)&D.add_kernel},
        {"cuGraphInstantiateWithFlags", (void **)&D.instantiate},
        {"cuGraphLaunch", (void **)&D.graph_launch},
        {"cuMemAlloc_v2", (void **)&D.alloc},
        {"cuMemAllocPitch_v2", (void **)&D.pitch},
        {"cuMemAllocManaged", (void **)&D.managed},
        {"cuMemAllocAsync", (void **)&D.alloc_async},
        {"cuMemCreate", (void **)&D.create},
        {"cuMemAddressReserve", (void **)&D.reserve},
        {"cuMemMap", (void **)&D.map},
        {"cuMemRelease", (void **)&D.release},
        {"cuArrayCreate_v2", (void **)&D.array},
        {"fakeCudaGpuTime", (void **)&D.gpu_time},
        {"fakeCudaPoolUsed", (void **)&D.pool_used},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
        if ((*syms[i].slot = dlsym(h, syms[i].name)) == NULL) {
            fprintf(stderr, "isolation_worker: the driver lacks %s (the fake driver is needed)\n",
                    syms[i].name);
            return -1;
        }
    CUcontext ctx;
    CUresult r;
    if ((r = D.init(0)) != CUDA_SUCCESS || (r = D.retain(&ctx, 0)) != CUDA_SUCCESS ||
        (r = D.set_current(ctx)) != CUDA_SUCCESS)
        return die("the driver did not start", r), -1;
    return 0;
}

/* ---- compute ---- */

/* A step of STEP_N kernels as one graph, chained one after another as a framework captures it. */
static CUresult make_step_graph(CUgraphExec *exec)
{
    CUgraph g;
    CUgraphNode prev = NULL, node;
    kernel_node k = {NULL, STEP_US, 1, 1, 32, 1, 1, 0, NULL, NULL};
    CUresult r = D.graph_create(&g, 0);
    for (int i = 0; r == CUDA_SUCCESS && i < STEP_N; i++) {
        r = D.add_kernel(&node, g, prev != NULL ? &prev : NULL, prev != NULL ? 1 : 0, &k);
        prev = node;
    }
    return r == CUDA_SUCCESS ? D.instantiate(exec, g, 0) : r;
}

static int compute(const char *pattern, double seconds)
{
    int flat = strcmp(pattern, "flat") == 0, graph = strcmp(pattern, "graph") == 0;
    if (!flat && !graph && strcmp(pattern, "train") != 0)
        return die("unknown compute pattern", 0);
    CUgraphExec exec = NULL;
    CUresult r;
    if (graph && (r = make_step_graph(&exec)) != CUDA_SUCCESS)
        return die("building the step's graph", r);
    printf("ready\n");
    fflush(stdout);
    unsigned long long t0;
    if (read(GO_FD, &t0, sizeof(t0)) != (ssize_t)sizeof(t0))
        return die("no start time on descriptor 3", 0);
    unsigned long long now = now_ns(), t1 = t0 + (unsigned long long)(seconds * 1e9);
    if (t0 > now) {
        struct timespec ts = {(time_t)((t0 - now) / 1000000000ULL),
                              (long)((t0 - now) % 1000000000ULL)};
        nanosleep(&ts, NULL);
    }
    long steps = 0;
    unsigned long long last = t0; /* when the last step within the window ended */
    unsigned seed = (unsigned)getpid() * 2654435761u;
    while ((now = now_ns()) < t1) {
        if (flat) {
            seed = seed * 1103515245u + 12345u;
            unsigned us = 1000 + (seed >> 16) % 1001;
            if ((r = D.launch(NULL, us, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)) != CUDA_SUCCESS)
                return die("cuLaunchKernel", r);
            if ((now = now_ns()) <= t1)
                steps++, last = now;
            continue;
        }
        r = CUDA_SUCCESS;
        if (graph)
            r = D.graph_launch(exec, NULL);
        else
            for (int i = 0; i < STEP_N && r == CUDA_SUCCESS; i++)
                r = D.launch(NULL, STEP_US, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        if (r != CUDA_SUCCESS)
            return die(graph ? "cuGraphLaunch" : "cuLaunchKernel", r);
        if ((r = D.stream_sync(NULL)) != CUDA_SUCCESS)
            return die("cuStreamSynchronize", r);
        if ((now = now_ns()) <= t1)
            steps++, last = now;
    }
    unsigned long long ns = 0;
    D.gpu_time(t0, t1, &ns);
    printf("gpu_ns=%llu steps=%ld last_ns=%llu\n", ns, steps, last - t0);
    return 0;
}

/* ---- memory ---- */

static CUstream stream;

/* One allocation of `size` bytes by `route`; *asked: what the call asked for. */
static CUresult alloc_one(const char *route, unsigned long long size, unsigned long long *asked)
{
    CUdeviceptr p;
    *asked = size;
    if (strcmp(route, "alloc") == 0)
        return D.alloc(&p, size);
    if (strcmp(route, "managed") == 0)
        return D.managed(&p, size, ATTACH_GLOBAL);
    if (strcmp(route, "async") == 0)
        return D.alloc_async(&p, size, stream);
    if (strcmp(route, "pitch") == 0) {
        /* Rows of 1000 bytes, which the driver pads to a pitch of 1024: the height is what fits. */
        size_t pitch, height = size / 1024;
        *asked = 1000ULL * height;
        return D.pitch(&p, &pitch, 1000, height, 4);
    }
    if (strcmp(route, "array") == 0) {
        /* float4 texels, rows of 16384 (256 KiB). */
        CUDA_ARRAY_DESCRIPTOR d = {16384, size / (256 * 1024), FORMAT_FLOAT, 4};
        CUarray a;
        return D.array(&a, &d);
    }
    if (strcmp(route, "vmm") == 0) {
        /* Created, mapped, and released while mapped, as frameworks do: alive through the map. */
        mem_prop prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        CUresult r = D.create(&h, size, &prop, 0);
        if (r != CUDA_SUCCESS)
            return r;
        if ((r = D.reserve(&va, size, 0, 0, 0)) != CUDA_SUCCESS ||
            (r = D.map(va, size, 0, h, 0)) != CUDA_SUCCESS) {
            D.release(h);
            return r == CUDA_ERROR_OUT_OF_MEMORY ? CUDA_ERROR_INVALID_VALUE : r;
        }
        return D.release(h);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

static int memory(const char *route, unsigned long long start_mib, unsigned long long floor_mib)
{
    CUresult r;
    if (strcmp(route, "async") == 0 && (r = D.stream_create(&stream, 0)) != CUDA_SUCCESS)
        return die("cuStreamCreate", r);
    unsigned long long size = start_mib * MIB, floor = floor_mib * MIB, asked = 0, one;
    int refusals = 0, pieces = 0;
    while (size >= floor) {
        r = alloc_one(route, size, &one);
        if (r == CUDA_SUCCESS) {
            asked += one;
            if (++pieces > MAX_PIECES)
                return die("more pieces than a share could hold", 0);
            continue;
        }
        if (r != CUDA_ERROR_OUT_OF_MEMORY) {
            fprintf(stderr, "isolation_worker: %s of %llu MiB: ", route, size / MIB);
            return die("refused, but not for memory", r);
        }
        refusals++;
        size /= 2;
    }
    unsigned long long held = 0;
    D.pool_used(0, &held);
    printf("held=%llu asked=%llu refusals=%d\n", held, asked, refusals);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "compute") == 0) {
        double seconds = strtod(argv[3], NULL);
        alarm((unsigned)seconds + 120); /* never outlive the benchmark, whatever happens */
        return load() != 0 ? 1 : compute(argv[2], seconds);
    }
    if (argc == 5 && strcmp(argv[1], "memory") == 0) {
        alarm(120);
        return load() != 0 ? 1 : memory(argv[2], strtoull(argv[3], NULL, 10),
                                         strtoull(argv[4], NULL, 10));
    }
    fprintf(stderr, "usage: isolation_worker compute flat|train|graph SECONDS\n"
                    "       isolation_worker memory ROUTE START_MIB FLOOR_MIB\n");
    return 2;
}
