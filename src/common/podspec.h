/*
 * What a Kubernetes Pod asks of kgpu, read from its v1 JSON, and the
 * annotations kgpu reads and writes (the resource and annotation contract of
 * docs/architecture.md). Pure functions over jansson values: no I/O.
 */
#ifndef KGPU_PODSPEC_H
#define KGPU_PODSPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "kgpu/model.h"

/* Resource names. */
#define KGPU_RES_WHOLE     "nvidia.com/gpu"
#define KGPU_RES_MEM       "kgpu.io/gpu-mem"
#define KGPU_RES_MEM_ALIAS "aliyun.com/gpu-mem"
#define KGPU_RES_CORE      "kgpu.io/gpu-core"
#define KGPU_RES_COUNT     "kgpu.io/gpu-count"
/* Pod annotations a user may set. */
#define KGPU_ANN_TYPE      "kgpu.io/gpu-type"         /* comma-separated allowed model globs */
#define KGPU_ANN_TYPE_EXCL "kgpu.io/gpu-type-exclude" /* comma-separated excluded model globs */
#define KGPU_ANN_POLICY    "kgpu.io/policy"
#define KGPU_ANN_CORE_LIMIT "kgpu.io/gpu-core-limit" /* percent: burst ceiling over kgpu.io/gpu-core */
#define KGPU_ANN_RESTARTABLE "kgpu.io/restartable" /* "true": may be evicted to be placed again */
/* Annotations kgpu writes. */
#define KGPU_ANN_ASSIGNMENT "kgpu.io/assignment" /* pod: JSON, see kgpu_assignment_format */
#define KGPU_ANN_NODE       "kgpu.io/node"       /* pod: node the assignment is for */
#define KGPU_ANN_BIND_TIME  "kgpu.io/bind-time"  /* pod: RFC 3339, UTC, nanoseconds */
#define KGPU_ANN_ALLOCATED  "kgpu.io/allocated"  /* pod: set by the device plugin */
#define KGPU_ANN_GPUS       "kgpu.io/gpus"       /* node: JSON inventory by the device plugin */
#define KGPU_LABEL_MODEL    "kgpu.io/gpu-model"
#define KGPU_LABEL_COUNT    "kgpu.io/gpu-count"
/* Labels of NVIDIA GPU feature discovery, used when a node has no kgpu.io/gpus. */
#define KGPU_LABEL_PRODUCT "nvidia.com/gpu.product"
#define KGPU_LABEL_MEMORY  "nvidia.com/gpu.memory" /* MiB per GPU */

#define KGPU_MAX_PARTS 16 /* GPU-using containers in one pod */
#define KGPU_MAX_GLOBS 8
#define KGPU_GLOB_MAX  128

/* One container's GPU demand: a core request with the container's name. */
typedef struct kgpu_part {
    char container[64]; /* container names are DNS labels: at most 63 characters */
    bool init;          /* an init container that no app container's GPUs can cover */
    kgpu_request req;   /* allow/exclude point into the owning kgpu_pod */
} kgpu_part;

/*
 * A pod as kgpu sees it. Self-contained (no pointers into the JSON).
 * CPU and memory are the pod's effective requests as Kubernetes computes them
 * (max of the sum of app containers and the largest init container, plus
 * overhead) and ride on parts[0]; the other parts carry GPU demand only.
 */
typedef struct kgpu_pod {
    char ns[KGPU_NAME_MAX + 1];
    char name[KGPU_NAME_MAX + 1];
    char uid[64];
    char node[KGPU_NAME_MAX + 1]; /* spec.nodeName, "" when unbound */
    char phase[16];               /* status.phase */
    int64_t cpu_milli, memory_mib;
    int nparts;
    kgpu_part parts[KGPU_MAX_PARTS];
    char allow_buf[KGPU_MAX_GLOBS][KGPU_GLOB_MAX];
    char exclude_buf[KGPU_MAX_GLOBS][KGPU_GLOB_MAX];
    const char *allow[KGPU_MAX_GLOBS];
    const char *exclude[KGPU_MAX_GLOBS];
    int nallow, nexclude;
    char policy[32];     /* kgpu.io/policy, "" when unset */
    bool has_assignment; /* kgpu.io/assignment present */
    bool restartable;    /* kgpu.io/restartable is "true" */
    bool terminal;       /* phase Succeeded or Failed, or deletionTimestamp set */
} kgpu_pod;

/*
 * Reads a v1 Pod. `memory_unit_mib` is the size of one kgpu.io/gpu-mem unit.
 * A resource named kgpu.io/... that kgpu does not know is an error (a typo
 * must not silently schedule the pod without its GPU).
 * Errors (KGPU_EPARSE/KGPU_EINVAL) name the field: "container main:
 * kgpu.io/gpu-core 150 outside 1..100". A pod with no GPU resources is valid
 * (nparts 0). Resource limits are read, requests used when limits are absent.
 */
int kgpu_pod_from_json(const json_t *pod, int64_t memory_unit_mib, kgpu_pod *out, kgpu_error *err);

/*
 * The same for a Pod or a pod template (a Job's, a Kueue Workload's pod
 * set's), which has no name: one without metadata.name is read as named
 * "template". tmpl is not changed.
 */
int kgpu_pod_from_template(const json_t *tmpl, int64_t memory_unit_mib, kgpu_pod *out,
                           kgpu_error *err);

/*
 * Cuts a v1 Pod down, in place, to what kgpu reads of it: metadata name,
 * namespace, uid, deletionTimestamp and the kgpu.io/ annotations kgpu reads
 * (not others of that prefix, which any tenant may add); spec
 * nodeName, overhead, and each container's and init container's name,
 * resources and restartPolicy; status phase. kgpu_pod_from_json answers the
 * same for the result as for the whole pod (fuzz_podspec checks it). For the
 * extender's pod list, where a few hundred bytes a pod are kept instead of
 * several KB. Members of the wrong type are left for the reader to refuse.
 */
void kgpu_pod_json_trim(json_t *pod);

/* Kubernetes quantity ("500m", "2", "1.5", "4Gi", "128974848", "1e3", "1k") in milli-units. */
int kgpu_quantity_milli(const char *s, int64_t *out, kgpu_error *err);
/* The same in whole units, rounded up (memory in bytes, counts). */
int kgpu_quantity_value(const char *s, int64_t *out, kgpu_error *err);

/*
 * The assignment annotation: which GPUs each part got.
 *   [{"container":"main","gpus":[{"index":0,"uuid":"GPU-..","milli":500,"memory_mib":4096}],
 *     "exclusive":false}, ...]
 * `parts` and `assigned` are parallel arrays of n entries; node gives uuids.
 * Returns a malloc'd string (caller frees), or NULL when out of memory or when
 * an assignment names a GPU position the node does not have.
 */
char *kgpu_assignment_format(const kgpu_node *node, const kgpu_part *parts,
                             const kgpu_assignment *assigned, int n);

/* One GPU in a parsed assignment. */
typedef struct kgpu_assigned_gpu {
    int index; /* device index on the node (kgpu_gpu.index) */
    char uuid[KGPU_UUID_MAX];
    int milli;
    int64_t memory_mib;
} kgpu_assigned_gpu;

typedef struct kgpu_assigned_part {
    char container[KGPU_NAME_MAX + 1];
    bool exclusive;
    int ngpus;
    kgpu_assigned_gpu gpus[KGPU_MAX_GPUS_PER_NODE];
} kgpu_assigned_part;

/* Parses an assignment annotation. Errors name what is wrong and where. */
int kgpu_assignment_parse(const char *text, kgpu_assigned_part *parts, int max, int *n,
                          kgpu_error *err);

/*
 * Whether a parsed assignment stays within what the pod asks for: each part
 * names a GPU-using container of the pod (at most once), holds no more GPUs
 * than it requests, is exclusive only when it asked for whole GPUs, and gives
 * each shared GPU no more compute or memory than asked. The assignment is
 * annotation text on the pod, which whoever can write the pod can forge;
 * both node agents and the extender check it before trusting it. Returns 0,
 * or KGPU_EINVAL with the first excess named ("assignment[0] (container
 * main): 2 GPUs, the pod asks for 1").
 */
int kgpu_assignment_within(const kgpu_pod *pod, const kgpu_assigned_part *parts, int n,
                           kgpu_error *err);

/*
 * A node's GPU inventory from its v1 Node JSON: the kgpu.io/gpus annotation
 * when present, else nvidia.com/gpu allocatable with the product and memory
 * labels of GPU feature discovery (uuids then read "<node>-gpu<i>").
 * Fills spec (strings point into `store`, which must outlive spec's use).
 * A node without GPUs gives ngpus 0. Also reads allocatable cpu and memory.
 */
typedef struct kgpu_node_store {
    char name[KGPU_NAME_MAX + 1];
    char uuid[KGPU_MAX_GPUS_PER_NODE][KGPU_UUID_MAX];
    char model[KGPU_MAX_GPUS_PER_NODE][KGPU_MODEL_NAME_MAX];
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
} kgpu_node_store;

int kgpu_node_from_json(const json_t *node, kgpu_node_spec *spec, kgpu_node_store *store,
                        kgpu_error *err);

/*
 * Copies `in` to `out` with its name and GPUs (and the GPUs' uuid and model
 * strings) in one malloc'd block sized to them, which it returns (free it
 * when `out` is no longer used); labels stay borrowed. NULL when out of
 * memory. A kgpu_node_store is sized for the largest node (6 KiB); packed, an
 * 8-GPU node takes about 1 KiB, which is what lets a list of thousands of
 * nodes be held at once.
 */
void *kgpu_node_spec_pack(const kgpu_node_spec *in, kgpu_node_spec *out);

/* The kgpu.io/gpus annotation value for n GPU specs; malloc'd string or NULL. */
char *kgpu_gpus_annotation_format(const kgpu_gpu_spec *gpus, int n);

/*
 * One GPU of a hand-written inventory (the extender's --cluster-file, the
 * device plugin's --fake-gpus): an object with `model` and `memory_mib`,
 * `index` (0..1023; when absent and not required, `position`), `uuid`
 * (required when uuid_required), and optional `numa` (-1..1023, default -1)
 * and `healthy` (a boolean, default true). Strings are copied into `uuid` and
 * `model` (KGPU_UUID_MAX and KGPU_MODEL_NAME_MAX bytes), which g points to.
 * Errors name `where` and the field: "cluster.yaml: nodes[0].gpus[1].healthy:
 * needs true or false".
 */
int kgpu_gpu_item_parse(const json_t *v, const char *where, int position, bool index_required,
                        bool uuid_required, kgpu_gpu_spec *g, char *uuid, char *model,
                        kgpu_error *err);

/* Parses a kgpu.io/gpus annotation into store->gpus (and its strings). */
int kgpu_gpus_annotation_parse(const char *text, kgpu_node_store *store, int *n, kgpu_error *err);

#endif
