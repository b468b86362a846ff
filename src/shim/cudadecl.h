/*
 * The few CUDA driver API and NVML types libkgpu-limit.so needs, declared
 * here from the documented ABI so the library builds without cuda.h or
 * nvml.h. Handles are opaque pointers; only structures whose fields the shim
 * reads are spelled out, up to the last field it reads.
 */
#ifndef KGPU_SHIM_CUDADECL_H
#define KGPU_SHIM_CUDADECL_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 on 64-bit hosts */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef unsigned int CUdeviceptr_v1; /* the pre-3.2 entry points' 32-bit pointers */

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* cuGetProcAddress flags */
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2ULL

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* CUarray_format: bytes per channel are derived from it (see track.c). */
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

#define CU_MEM_LOCATION_TYPE_DEVICE 1

/* CUmemAllocationProp, up to its location (the device a cuMemCreate charges). */
typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
    struct {
        int type;
        int id;
    } location;
} CUmemAllocationProp;

/* CUmemPoolProps: 88 bytes in every CUDA version so far; the shim reads the location. */
typedef struct CUmemPoolProps_st {
    int allocType;
    int handleTypes;
    struct {
        int type;
        int id;
    } location;
    void *win32SecurityAttributes;
    unsigned char rest[64]; /* maxSize, usage, reserved */
} CUmemPoolProps;

typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* CUarrayMapInfo: what cuMemMapArrayAsync maps where (96 bytes on 64-bit hosts). */
typedef struct CUarrayMapInfo_st {
    int resourceType;
    union {
        CUmipmappedArray mipmap;
        CUarray array;
    } resource;
    int subresourceType; /* 0: sparseLevel, 1: miptail */
    union {
        struct {
            unsigned int level, layer, offsetX, offsetY, offsetZ;
            unsigned int extentWidth, extentHeight, extentDepth;
        } sparseLevel;
        struct {
            unsigned int layer;
            unsigned long long offset, size;
        } miptail;
    } subresource;
    int memOperationType; /* 1: map, 2: unmap */
    int memHandleType;    /* 0: generic (a CUmemGenericAllocationHandle) */
    CUmemGenericAllocationHandle memHandle;
    unsigned long long offset;
    unsigned int deviceBitMask, flags, reserved[2];
} CUarrayMapInfo;

#define CUDA_ARRAY3D_SPARSE 0x40 /* no memory of its own: tiles are mapped from handles */

/* CUmemPool_attribute (values are cuuint64_t for these) */
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD    4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT     7

/* CUgraphMem_attribute (cuuint64_t values) */
#define CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT     0
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2

/* CUgraphNodeType */
#define CU_GRAPH_NODE_TYPE_GRAPH     4
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10

/* CUstreamCaptureStatus */
#define CU_STREAM_CAPTURE_STATUS_NONE 0

/* The per-thread default stream's handle (CU_STREAM_PER_THREAD). */
#define KGPU_CU_STREAM_PER_THREAD ((CUstream)(uintptr_t)0x2)

/* CUlaunchConfig (cuLaunchKernelEx): the grid, the block, shared memory, the stream, attributes. */
typedef struct CUlaunchConfig {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* CUstreamCaptureMode */
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

/* CUmemAllocationHandleType */
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1

/* CUlimit */
#define CU_LIMIT_STACK_SIZE       0
#define CU_LIMIT_PRINTF_FIFO_SIZE 1
#define CU_LIMIT_MALLOC_HEAP_SIZE 2

/* CUdevice_attribute */
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT            16
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR       75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR       76

/* CUfunction_attribute: bytes of local memory each thread of the kernel needs. */
#define CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES 3

/* CUDA_LAUNCH_PARAMS: one device's part of cuLaunchCooperativeKernelMultiDevice. */
typedef struct CUDA_LAUNCH_PARAMS_st {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

typedef void (*CUhostFn)(void *userData);

/* ---- issue 25: IPC handles, multicast objects ---- */

/* An IPC handle of device memory, passed by value (64 opaque bytes). */
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

/* cuGraphInstantiateWithParams's parameters; with the upload flag it uploads at once. */
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUmulticastObjectProp_st {
    unsigned int numDevices;
    size_t size;
    unsigned long long handleTypes;
    unsigned long long flags;
} CUmulticastObjectProp;

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
};

typedef struct nvmlMemory_st {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#endif
