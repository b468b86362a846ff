/*
 * Readers for the Alibaba GPU cluster trace (FGD study) CSV files: the node
 * list `sn,cpu_milli,memory_mib,gpu,model` and the pod lists, in their
 * 11-column form (with qos, phase and times), that form with a `queue` column
 * (not in the Alibaba files: docs/queues.md) and the 5-column multigpu form.
 * Parsing works on a memory buffer: no I/O here, the caller reads the file.
 * A malformed line stops the parse with "file:line: what is wrong".
 */
#ifndef KGPU_TRACE_H
#define KGPU_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"
#include "kgpu/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kgpu_trace_node {
    char *name;
    int64_t cpu_milli, memory_mib;
    int gpus;
    char *model; /* "" when the node has no GPU */
    int line;
} kgpu_trace_node;

#define KGPU_TRACE_MAX_SPEC 16 /* models in one gpu_spec */

typedef struct kgpu_trace_pod {
    char *name;
    int64_t cpu_milli, memory_mib;
    int num_gpu;
    int gpu_milli;
    int nspec;
    const char *spec[KGPU_TRACE_MAX_SPEC]; /* allowed models; pointers into the trace's storage */
    char *spec_text;                       /* the gpu_spec column as written ("" = any) */
    char *qos, *phase;                     /* "" in the 5-column layout */
    char *queue;                           /* GPU queue; "" unless the 12-column layout */
    int64_t creation, deletion, scheduled; /* seconds; -1 when absent */
    int line;
} kgpu_trace_pod;

/* A parsed file. Owns all strings (one arena) and the arrays. */
typedef struct kgpu_trace {
    kgpu_trace_node *nodes;
    size_t nnodes;
    kgpu_trace_pod *pods;
    size_t npods;
    int columns; /* of the pod file: 11, 12 (with a queue column) or 5; 5 for the node file */
    char *arena;
} kgpu_trace;

/* Parses a node list from buf[0..len); `file` names it in errors. */
int kgpu_trace_parse_nodes(const char *buf, size_t len, const char *file, kgpu_trace *out,
                           kgpu_error *err);

/* Parses a pod list (either layout, told apart by the header). */
int kgpu_trace_parse_pods(const char *buf, size_t len, const char *file, kgpu_trace *out,
                          kgpu_error *err);

void kgpu_trace_free(kgpu_trace *t);

/*
 * The core request of a trace pod. `allow` points into the pod (borrowed).
 * Whole GPUs when gpu_milli is 1000, a share otherwise.
 */
void kgpu_trace_pod_request(const kgpu_trace_pod *pod, kgpu_request *req);

/* Adds every node of a node list to cluster c (GPUs named <node>-gpu<i>). */
int kgpu_trace_build_cluster(const kgpu_trace *nodes, kgpu_cluster *c, kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
