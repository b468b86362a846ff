/*
 * The hooks of graph memory: a graph's memory allocation nodes allocate
 * from the device's graph memory when the graph is launched or uploaded,
 * not when the node is added. At instantiation the nodes are summed per
 * device; a launch or upload is charged first what the device's graph
 * memory must grow by, then the charge is brought to what the driver
 * reports it reserves. Launches also take the compute-share gate.
 */
#include <stdlib.h>

#include "compat.h"
#include "hooks.h"

/* ---- graph memory ---- */

#define GRAPH_KEY(exec, li) ((uint64_t)(uintptr_t)(exec) ^ ((uint64_t)(li) << 58))

static _Atomic int graphs_with_memory; /* execs recorded: launches skip the lookups while 0 */

/* Like pool_settle (hooks_pool.c), for device dev's graph memory. */
static void graph_settle(CUdevice dev, int li, uint64_t expected)
{
    uint64_t reserved;
    if (dev < 0 || dev >= KGPU_SHIM_MAX_CUDA_DEVICES ||
        kgpu__graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0) {
        kgpu__uncharge(li, expected);
        return;
    }
    pthread_mutex_lock(&kgpu__shim.pool_mu);
    int64_t over = (int64_t)(reserved - kgpu__shim.graph_charged[dev]) - (int64_t)expected;
    kgpu__shim.graph_charged[dev] = reserved;
    pthread_mutex_unlock(&kgpu__shim.pool_mu);
    if (over > 0)
        kgpu__charge_anyway(li, (uint64_t)over); /* launched already: it cannot be refused now */
    else
        kgpu__uncharge(li, (uint64_t)-over);
}

/* Adds the bytes of g's memory allocation nodes (child graphs included) per limits index. */
static void graph_bytes(CUgraph g, uint64_t bytes[KGPU_SHIM_MAX_DEVICES], int depth)
{
    kgpu__pfn_cuGraphGetNodes get_nodes = KGPU_REAL(cuGraphGetNodes);
    kgpu__pfn_cuGraphNodeGetType get_type = KGPU_REAL(cuGraphNodeGetType);
    kgpu__pfn_cuGraphMemAllocNodeGetParams get_params = KGPU_REAL(cuGraphMemAllocNodeGetParams);
    kgpu__pfn_cuGraphChildGraphNodeGetGraph get_child = KGPU_REAL(cuGraphChildGraphNodeGetGraph);
    size_t n = 0;
    if (depth > 8 || get_nodes == NULL || get_type == NULL || get_params == NULL ||
        get_nodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return;
    CUgraphNode *nodes = calloc(n, sizeof(*nodes));
    if (nodes == NULL || get_nodes(g, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int type = -1;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        CUgraph child;
        if (get_type(nodes[i], &type) != CUDA_SUCCESS)
            continue;
        if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && get_params(nodes[i], &p) == CUDA_SUCCESS &&
            p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
            int li = kgpu__dev_index(p.poolProps.location.id);
            if (li >= 0 && li < KGPU_SHIM_MAX_DEVICES)
                bytes[li] += p.bytesize;
        } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && get_child != NULL &&
                   get_child(nodes[i], &child) == CUDA_SUCCESS) {
            graph_bytes(child, bytes, depth + 1);
        }
    }
    free(nodes);
}

/* After an instantiation: what the executable graph's memory nodes will need, per device. */
static CUresult instantiated(CUresult r, CUgraphExec *exec, CUgraph graph)
{
    if (r != CUDA_SUCCESS || exec == NULL)
        return r;
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES] = {0};
    graph_bytes(graph, bytes, 0);
    for (int li = 0; li < KGPU_SHIM_MAX_DEVICES; li++) {
        if (bytes[li] == 0)
            continue;
        kgpu_track_rec rec = {.key = GRAPH_KEY(*exec, li),
                              .bytes = bytes[li],
                              .dev = -1, /* nothing charged by the record itself */
                              .kind = KGPU_TRACK_GRAPHEXEC};
        kgpu_track_put(&kgpu__shim.track, &rec);
        atomic_fetch_add(&graphs_with_memory, 1);
    }
    return r;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize)
{
    KGPU_ENTER(cuGraphInstantiate, (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
    return instantiated(real_(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    KGPU_ENTER(cuGraphInstantiate_v2, (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
    return instantiated(real_(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

static CUresult charge_growth(const uint64_t bytes[KGPU_SHIM_MAX_DEVICES],
                              uint64_t need[KGPU_SHIM_MAX_DEVICES], int *any);

/*
 * An instantiation that uploads at once (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
 * maps the graph's memory before it returns: charged, before the driver is
 * called, what the device's graph memory must grow by, as a launch or
 * upload is, refused over the limit; then settled to what it reserves.
 */
typedef CUresult (*instantiate_call)(void *real, CUgraphExec *exec, CUgraph graph, void *arg);

static CUresult instantiate_uploading(instantiate_call call, void *real, CUgraphExec *exec,
                                      CUgraph graph, void *arg)
{
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES] = {0}, need[KGPU_SHIM_MAX_DEVICES] = {0};
    int any = 0;
    graph_bytes(graph, bytes, 0);
    CUresult c = charge_growth(bytes, need, &any);
    if (c != CUDA_SUCCESS)
        return c;
    CUresult r = instantiated(call(real, exec, graph, arg), exec, graph);
    for (int li = 0; any && li < kgpu__shim.limits.ndevices; li++)
        if (need[li] != 0 || r == CUDA_SUCCESS)
            graph_settle(kgpu__cuda_dev(li), li, need[li]);
    return r;
}

static CUresult call_with_flags(void *real, CUgraphExec *exec, CUgraph graph, void *arg)
{
    return ((kgpu__pfn_cuGraphInstantiateWithFlags)real)(exec, graph,
                                                        *(unsigned long long *)arg);
}

static CUresult call_with_params(void *real, CUgraphExec *exec, CUgraph graph, void *arg)
{
    return ((kgpu__pfn_cuGraphInstantiateWithParams)real)(exec, graph, arg);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    KGPU_ENTER(cuGraphInstantiateWithFlags, (phGraphExec, hGraph, flags));
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) /* documented for ...WithParams only */
        return instantiate_uploading(call_with_flags, (void *)real_, phGraphExec, hGraph, &flags);
    return instantiated(real_(phGraphExec, hGraph, flags), phGraphExec, hGraph);
}

static int uploads(const void *params)
{
    return params != NULL && (((const CUDA_GRAPH_INSTANTIATE_PARAMS *)params)->flags &
                              CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      void *instantiateParams)
{
    KGPU_ENTER(cuGraphInstantiateWithParams, (phGraphExec, hGraph, instantiateParams));
    if (uploads(instantiateParams))
        return instantiate_uploading(call_with_params, (void *)real_, phGraphExec, hGraph,
                                     instantiateParams);
    return instantiated(real_(phGraphExec, hGraph, instantiateParams), phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           void *instantiateParams)
{
    KGPU_ENTER(cuGraphInstantiateWithParams_ptsz, (phGraphExec, hGraph, instantiateParams));
    if (uploads(instantiateParams))
        return instantiate_uploading(call_with_params, (void *)real_, phGraphExec, hGraph,
                                     instantiateParams);
    return instantiated(real_(phGraphExec, hGraph, instantiateParams), phGraphExec, hGraph);
}

/*
 * A launch or upload maps the graph's memory: charged, before the driver
 * is called, what the device's graph memory must grow by to hold the
 * graph's allocations; then settled to what it reserves.
 */
typedef CUresult (*graph_call)(CUgraphExec exec, CUstream stream);

/*
 * Charges, per limits index, what the device's graph memory must grow by
 * to hold bytes[li] more (need[li]); all or nothing. *any: something was.
 */
static CUresult charge_growth(const uint64_t bytes[KGPU_SHIM_MAX_DEVICES],
                              uint64_t need[KGPU_SHIM_MAX_DEVICES], int *any)
{
    for (int li = 0; li < kgpu__shim.limits.ndevices; li++) {
        if (bytes[li] == 0)
            continue;
        uint64_t reserved = 0, used = 0;
        CUdevice dev = kgpu__cuda_dev(li);
        if (kgpu__graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0 &&
            kgpu__graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) == 0 &&
            reserved > used)
            need[li] = bytes[li] > reserved - used ? bytes[li] - (reserved - used) : 0;
        else
            need[li] = bytes[li];
        CUresult c = kgpu__charge(li, need[li]);
        if (c != CUDA_SUCCESS) {
            for (int k = 0; k < li; k++)
                kgpu__uncharge(k, need[k]);
            return c;
        }
        *any = 1;
    }
    return CUDA_SUCCESS;
}

static CUresult graph_run(graph_call real, CUgraphExec exec, CUstream stream, int per_thread)
{
    /* A graph's kernels run in its container's turn like any others (captured: when it runs). */
    kgpu__compute_gate_on(stream, per_thread);
    if (atomic_load_explicit(&graphs_with_memory, memory_order_relaxed) == 0)
        return real(exec, stream);
    uint64_t bytes[KGPU_SHIM_MAX_DEVICES] = {0}, need[KGPU_SHIM_MAX_DEVICES] = {0};
    int any = 0;
    for (int li = 0; li < kgpu__shim.limits.ndevices; li++) {
        kgpu_track_rec rec;
        if (kgpu_track_get(&kgpu__shim.track, KGPU_TRACK_GRAPHEXEC, GRAPH_KEY(exec, li), &rec))
            bytes[li] = rec.bytes;
    }
    CUresult c = charge_growth(bytes, need, &any);
    if (c != CUDA_SUCCESS)
        return c;
    CUresult r = real(exec, stream);
    for (int li = 0; any && li < kgpu__shim.limits.ndevices; li++)
        if (need[li] != 0 || r == CUDA_SUCCESS)
            graph_settle(kgpu__cuda_dev(li), li, need[li]);
    return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphLaunch, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream, 0);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphLaunch_ptsz, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream, 1);
}

CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphUpload, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream, 0);
}

CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    KGPU_ENTER(cuGraphUpload_ptsz, (hGraphExec, hStream));
    return graph_run(real_, hGraphExec, hStream, 1);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    KGPU_ENTER(cuGraphExecDestroy, (hGraphExec));
    CUresult r = real_(hGraphExec);
    if (r != CUDA_SUCCESS)
        return r;
    for (int li = 0; li < KGPU_SHIM_MAX_DEVICES; li++) {
        kgpu_track_rec rec;
        if (kgpu_track_take(&kgpu__shim.track, KGPU_TRACK_GRAPHEXEC, GRAPH_KEY(hGraphExec, li),
                            &rec)) {
            atomic_fetch_sub(&graphs_with_memory, 1);
            graph_settle(kgpu__cuda_dev(li), li, 0);
        }
    }
    return r;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    KGPU_ENTER(cuDeviceGraphMemTrim, (device));
    CUresult r = real_(device);
    int li = kgpu__dev_index(device);
    if (r == CUDA_SUCCESS && li >= 0)
        graph_settle(device, li, 0);
    return r;
}

/* ---- stream capture: the count of captures under way (state.h) ---- */

static void capture_begun(CUresult r)
{
    if (r == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&kgpu__shim.captures, 1, memory_order_relaxed);
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    KGPU_ENTER(cuStreamBeginCapture, (hStream));
    CUresult r = real_(hStream);
    capture_begun(r);
    return r;
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    KGPU_ENTER(cuStreamBeginCapture_ptsz, (hStream));
    CUresult r = real_(hStream);
    capture_begun(r);
    return r;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode)
{
    KGPU_ENTER(cuStreamBeginCapture_v2, (hStream, mode));
    CUresult r = real_(hStream, mode);
    capture_begun(r);
    return r;
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode)
{
    KGPU_ENTER(cuStreamBeginCapture_v2_ptsz, (hStream, mode));
    CUresult r = real_(hStream, mode);
    capture_begun(r);
    return r;
}

CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                     const CUgraphNode *dependencies, const void *dependencyData,
                                     size_t numDependencies, int mode)
{
    KGPU_ENTER(cuStreamBeginCaptureToGraph,
               (hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
    CUresult r = real_(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
    capture_begun(r);
    return r;
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode *dependencies,
                                          const void *dependencyData, size_t numDependencies,
                                          int mode)
{
    KGPU_ENTER(cuStreamBeginCaptureToGraph_ptsz,
               (hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
    CUresult r = real_(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
    capture_begun(r);
    return r;
}

/*
 * A capture ends with cuStreamEndCapture whatever it returns (an
 * invalidated capture ends too): the count goes down where the stream was
 * capturing before the call and is not after it, never below zero.
 */
static CUresult capture_end(CUresult (*real)(CUstream, CUgraph *), CUstream stream, int per_thread,
                            CUgraph *graph)
{
    int was = kgpu__compute_capturing(stream, per_thread);
    CUresult r = real(stream, graph);
    if (was && !kgpu__compute_capturing(stream, per_thread)) {
        int n = atomic_load_explicit(&kgpu__shim.captures, memory_order_relaxed);
        while (n > 0 && !atomic_compare_exchange_weak_explicit(&kgpu__shim.captures, &n, n - 1,
                                                               memory_order_relaxed,
                                                               memory_order_relaxed))
            ;
    }
    return r;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    KGPU_ENTER(cuStreamEndCapture, (hStream, phGraph));
    return capture_end(real_, hStream, 0, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    KGPU_ENTER(cuStreamEndCapture_ptsz, (hStream, phGraph));
    return capture_end(real_, hStream, 1, phGraph);
}
