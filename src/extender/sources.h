/*
 * kgpu-extender, sources layer: where the cluster's facts come from. The
 * objects kgpu reads (nodes, pods, GPUQueues, namespaces, ResourceSlices,
 * ResourceClaims, the cluster file) cut down and parsed, and the reflector
 * threads that list and watch them. A source never touches the state: it
 * hands what it read to an ext_sink, which the daemon connects to the state
 * (state.h ext_state_sink). Parsers are pure: no lock, no I/O.
 *
 * Threads: each reflector runs on its own thread (ext_sources_start) and
 * calls its sink's functions on that thread, one call at a time; leader.c
 * runs the election on one more.
 */
#ifndef KGPU_EXT_SOURCES_H
#define KGPU_EXT_SOURCES_H

#include <string.h>

#include "base.h"
#include "k8s.h"
#include "kgpu/model.h"
#include "kgpu/policy.h"
#include "podspec.h"
#include "strmap.h"

/* ---- pods (objects.c) ---- */


/*
 * What kubelet's device plugin Allocate calls for a pod will carry: for each
 * device-plugin resource, the count of devices one container asks for.
 * kubelet names devices, never the pod, so the device plugin tells pods
 * apart by these counts alone (see awaiting.c).
 */
enum ext_res { EXT_RES_WHOLE, EXT_RES_MEM, EXT_RES_CORE };

typedef struct ext_ask {
    int res;        /* enum ext_res; aliyun.com/gpu-mem counts as kgpu.io/gpu-mem */
    int64_t amount; /* whole GPUs, memory units or compute percent; never 0 */
} ext_ask;

#define EXT_ASKS_MAX 32

/* A pod's asks over all its containers, init containers included: a small sorted set. */
typedef struct ext_asks {
    int n;
    bool overflow;           /* more distinct asks than fit: clashes with any pod asking one */
    ext_ask a[EXT_ASKS_MAX]; /* sorted by (res, amount), distinct */
} ext_asks;


/* The asks of a v1 Pod's containers. Reads what it can: the pod was validated elsewhere. */
void ext_asks_from_json(const json_t *pod, ext_asks *out);
/* Whether x and y share an ask (resource and amount); *same (may be NULL) gets the first. */
bool ext_asks_clash(const ext_asks *x, const ext_asks *y, ext_ask *same);
/* "kgpu.io/gpu-mem" and the like. */
const char *ext_res_name(int res);

/* A v1 Pod's kgpu.io/queue label into label ("" without one) and its spec.priority (0). */
void ext_pod_queue_fields(const json_t *pod, char *label, size_t len, int *priority);
/* The pod's requests without CPU and memory, for fit checks: tmp and out have pod->nparts room. */
void ext_fit_requests(const kgpu_pod *pod, kgpu_request *tmp, const kgpu_request **out);
/*
 * Copies a kgpu_pod: its request and pattern pointers point into the struct
 * itself, so a plain assignment would leave them pointing into the source.
 */
void ext_pod_copy(kgpu_pod *dst, const kgpu_pod *src);

/*
 * Reflector trims (kgpu_reflector_ops.trim): a listed object cut as its page
 * arrives to what kgpu reads, so that a 20,000-pod list fits the memory limit.
 */
void ext_pod_trim(void *ctx, json_t *pod);
void ext_node_trim(void *ctx, json_t *node);

/*
 * A Node's inventory as kgpu_node_from_json reads it, and whether it is
 * labelled for DRA (*dra). A DRA node's kgpu.io/gpus annotation is not read.
 */
int ext_node_parse(const json_t *item, kgpu_node_spec *spec, kgpu_node_store *store, bool *dra,
                   kgpu_error *err);

/*
 * Whether the node is going away, so that kgpu places nothing new there:
 * deleted, cordoned, or carrying a taint that an autoscaler or a spot
 * interruption handler puts on a node it is about to remove (the list in
 * objects.c, and kgpu.io/leaving for any other handler). *why (len >= 1)
 * says which, e.g. "taint aws-node-termination-handler/spot-itn".
 */
bool ext_node_leaving(const json_t *node, char *why, size_t len);
#define EXT_LEAVING_MAX 160 /* room for ext_node_leaving's reason */

/*
 * The scale-down guard's annotations (guard.c; docs/autoscaling.md
 * "Scale-down that shares survive"): kgpu writes all three on a node whose
 * GPU pods could not all run elsewhere, and removes them only from a node
 * carrying its own mark, never an operator's.
 */
#define EXT_GUARD_MARK "kgpu.io/scale-down-guard"                    /* kgpu's, with why */
#define EXT_GUARD_CA   "cluster-autoscaler.kubernetes.io/scale-down-disabled" /* "true" */
#define EXT_GUARD_KARPENTER "karpenter.sh/do-not-disrupt"            /* "true" */
/* Which of them the node carries: EXT_GUARD_HAS_MARK, EXT_GUARD_HAS_OTHER (CA's or Karpenter's). */
int ext_node_guard_marks(const json_t *node);
#define EXT_GUARD_HAS_MARK  1
#define EXT_GUARD_NODES_MAX 20000 /* GPU nodes the guard follows, marked or checked */
#define EXT_GUARD_HAS_OTHER 2

/* ---- DRA objects (dra_objects.c; docs/install-dra.md "kgpu's scores on DRA nodes") ---- */

#define EXT_DRA_DRIVER      "gpu.kgpu.io" /* kgpu-dra-plugin's driver name */
#define EXT_DRA_CLASS       "gpu.kgpu.io" /* the DeviceClass kgpu's claims name */
#define EXT_DRA_MIG_CLASS   "mig.gpu.kgpu.io" /* the DeviceClass of MIG partitions */
#define EXT_DRA_LABEL       "kgpu.io/gpu-allocator"
#define EXT_DRA_LABEL_VALUE "dra"
/* Why a DRA node serves no device-plugin pod (filter's reason, bind's error). */
#define EXT_DRA_NODE_REASON                                                                        \
    "a DRA node (" EXT_DRA_LABEL "=" EXT_DRA_LABEL_VALUE "): its GPUs are given out through "      \
    "ResourceClaims of class " EXT_DRA_CLASS ", not as kgpu.io/gpu-mem or nvidia.com/gpu"
#define EXT_DRA_DEVICE_MAX  64     /* a device name is a DNS label */
#define EXT_DRA_REQUESTS    8      /* requests of one claim kept (the driver's own bound) */
#define EXT_DRA_RESULTS     32     /* allocation results of one claim (the driver's own bound) */
#define EXT_DRA_CLAIMS_MAX  200000 /* claims held at once; more are ignored, logged */

#define EXT_DRA_MIG_MAX     256    /* MIG devices of one slice kept (more are skipped, said) */
#define EXT_DRA_CEL_MAX     2048   /* bytes of selectors kept of one claim (EXT_CEL_LEN_MAX each) */

/* One device of a slice of gpu.kgpu.io: a whole GPU. */
typedef struct ext_dra_device {
    char name[EXT_DRA_DEVICE_MAX]; /* gpu-<index> */
    int index;                     /* attribute index */
    char uuid[KGPU_UUID_MAX];
    char model[KGPU_MODEL_NAME_MAX]; /* productName (else model) */
    int64_t memory_mib;              /* capacity memory (else attribute memoryMiB) */
    int numa;                        /* attribute numaNode, -1 without */
    int mig_model; /* 1 + kgpu_mig_model_at index of its model when MIG devices name it; 0 */
    int64_t cc;    /* attribute computeCapability as EXT_CEL_SEMVER; -1 without */
    bool tainted;  /* a taint of effect NoSchedule or NoExecute: kgpu places nothing there */
} ext_dra_device;

/*
 * A MIG device (attribute mig true): a placement of a profile on one of the
 * pool's GPUs (attribute index names the GPU, which may be in another slice
 * of the pool). Kept small, as a node offers hundreds: its name as a hash.
 * A slice as parsed has the attributes; a pool (ext_dra_pool_resolve) has
 * only the devices kgpu knows, each with its GPU and profile.
 */
typedef struct ext_dra_mig {
    uint64_t name_hash; /* ext_dra_name_hash of the device's name */
    uint16_t index;     /* attribute index: its GPU's */
    uint8_t pname;      /* attribute profile, as ext_dra_profile_id numbers profile names */
    uint8_t start;      /* attribute migStart */
    uint8_t size;       /* attribute migSize; 0 without */
    uint8_t gpu;        /* in a pool: position in its devices of the GPU */
    uint8_t profile;    /* in a pool: index of the profile in the GPU's MIG model */
    uint8_t order;      /* in a pool: position of start in kgpu_mig_slice_order */
} ext_dra_mig;

/* The request that holds a GPU whole while it has MIG instances (none whole or shared then). */
static inline void ext_dra_mig_hold(kgpu_request *hold)
{
    memset(hold, 0, sizeof(*hold));
    hold->gpu_count = 1;
    hold->models = ~0ULL;
    hold->shape = -1;
    hold->exclusive = true;
    hold->gpu_milli = KGPU_MILLI;
}

/*
 * A ResourceSlice of gpu.kgpu.io as parsed, or a node's pool: the devices of
 * all the slices of the newest generation of the pool named after it
 * (dra_nodes.c; a pool spans slices: counter sets apart from devices, at
 * most 64 devices with counters a slice). Only the first nmig entries of
 * migs are allocated in a copy kept by the state (ext_dra_slice_size).
 */
typedef struct ext_dra_slice {
    char name[KGPU_NAME_MAX + 1]; /* the object's (a pool: its node's) */
    char node[KGPU_NAME_MAX + 1]; /* spec.nodeName, which is the pool's name too */
    int64_t generation;           /* spec.pool.generation: the newest slices of a pool count */
    int ndevices;
    ext_dra_device devices[KGPU_MAX_GPUS_PER_NODE];
    int skipped;        /* devices not kept: MIG devices of profiles kgpu does not know, ... */
    char skip_why[120]; /* why the first of them was not; "" */
    int nmig;
    ext_dra_mig migs[EXT_DRA_MIG_MAX]; /* last: see above */
} ext_dra_slice;

/* A MIG profile name's id: its first model's index x KGPU_MIG_MAX_PROFILES + its own; -1. */
int ext_dra_profile_id(const char *name);
/* The bytes of s up to its last MIG device: what a copy of it takes. */
size_t ext_dra_slice_size(const ext_dra_slice *s);
/*
 * A pool: `pool` empties for node, each slice of it is added, then the MIG
 * devices are resolved to their GPUs; what cannot be is counted in skipped.
 * Pure (fuzz_extdra).
 */
void ext_dra_pool_init(ext_dra_slice *pool, const char *node, int64_t generation);
void ext_dra_pool_add(ext_dra_slice *pool, const ext_dra_slice *part);
void ext_dra_pool_resolve(ext_dra_slice *pool);

/* FNV-1a of a device name: how a MIG device is named in kgpu's records. */
uint64_t ext_dra_name_hash(const char *name);

/* A request of a claim of class gpu.kgpu.io (spec.devices.requests[].exactly). */
typedef struct ext_dra_request {
    int count;          /* exactly.count, 1 by default */
    bool all;           /* allocationMode All */
    int64_t memory_mib; /* capacity.requests.memory, rounded up; 0: none (the whole GPU's) */
    int cores;          /* capacity.requests.cores, percent; 0 by default */
    bool mig;           /* of class mig.gpu.kgpu.io (MIG devices), else gpu.kgpu.io (the rest) */
    /* Its selectors: offset in the claim's `cel` of their expressions joined by &&, or: */
    int cel; /* EXT_DRA_CEL_NONE, or _UNREAD (cel_why says why) */
    char cel_why[48];
} ext_dra_request;
#define EXT_DRA_CEL_NONE   (-1) /* no selector */
#define EXT_DRA_CEL_UNREAD (-2) /* selectors kgpu did not keep */

/* A device of gpu.kgpu.io allocated to a claim (status.allocation.devices.results[]). */
typedef struct ext_dra_result {
    char pool[KGPU_NAME_MAX + 1];
    char device[EXT_DRA_DEVICE_MAX];
    int64_t memory_mib; /* consumedCapacity.memory, rounded up; -1: none given (the whole GPU) */
    int cores;          /* consumedCapacity.cores, percent; 0 without */
    bool applied;       /* charged to the cluster now, as `a` */
    bool mig;           /* a MIG device, charged in its node's MIG records (`a`: its share) */
    uint8_t mig_profile, mig_start;
    kgpu_assignment a;
} ext_dra_result;

/* A ResourceClaim that names gpu.kgpu.io, cut to what kgpu reads. One block: free() it. */
typedef struct ext_dra_claim {
    char ns[64], name[KGPU_NAME_MAX + 1], uid[64];
    char error[200]; /* why it cannot be read (then nreq and nres are 0); "" */
    int nreq;        /* requests of class gpu.kgpu.io under `exactly` */
    int nres;        /* results of driver gpu.kgpu.io */
    bool warned;     /* a result that could not be charged was logged */
    char consumer[64]; /* uid of the first pod in status.reservedFor; "" */
    /* Charged to a GPU queue (queues.c ext_queues_charge_claim): where, and exactly what. */
    bool qcharged;
    char queue[KGPU_QUEUE_NAME_MAX + 1];
    kgpu_qdemand qd;
    ext_dra_request req[EXT_DRA_REQUESTS];
    char *cel;            /* the requests' selectors, NUL-ended, in this block after res */
    ext_dra_result res[]; /* nres */
} ext_dra_claim;

/*
 * Parsers of outside input (fuzz_extdra). A ResourceSlice: 0 and *out
 * filled when it is gpu.kgpu.io's; KGPU_ENOENT for another driver's;
 * KGPU_EPARSE with err naming the slice and the field when malformed.
 */
int ext_dra_slice_parse(const json_t *obj, ext_dra_slice *out, kgpu_error *err);
/*
 * A ResourceClaim: *out (malloc'd, caller frees) when it names class or
 * driver gpu.kgpu.io, with (*out)->error set when the rest cannot be read;
 * *out NULL for anyone else's claim. KGPU_EPARSE without a namespace and a
 * name, KGPU_ENOMEM. Pure: no state, no lock.
 */
int ext_dra_claim_parse(const json_t *obj, ext_dra_claim **out, kgpu_error *err);

/* Whether a v1 Node is labelled kgpu.io/gpu-allocator=dra. */
bool ext_dra_node_labelled(const json_t *node);

/* Reflector trims: what is not gpu.kgpu.io's, to nothing; the rest to what the parsers read. */
void ext_dra_slice_trim(void *ctx, json_t *obj);
void ext_dra_claim_trim(void *ctx, json_t *obj);

/* ---- GPUQueues and namespaces (objects.c) ---- */

/* metadata.name of any object, or NULL. */
const char *ext_obj_name(const json_t *obj);
/* What is kept of a GPUQueue: metadata.name and .generation, spec, status. */
void ext_gpuqueue_trim(void *ctx, json_t *obj);
/* A namespace's kgpu.io/queue annotation, or NULL (ns may be NULL). */
const char *ext_namespace_queue(const json_t *ns);
/* A namespace's labels (an object), or NULL (ns may be NULL). */
const json_t *ext_namespace_labels(const json_t *ns);
/* A namespace is its name, its kgpu.io/queue annotation and its labels (queue selectors read them). */
void ext_namespace_trim(void *ctx, json_t *ns);

/* ---- the sink: where sources hand what they read (reflectors.c, clusterfile.c) ---- */

enum ext_dra_kind { EXT_DRA_SLICES, EXT_DRA_CLAIMS };

/*
 * Every function is called on the source's own thread, never two of one
 * source at once; arguments are borrowed for the call unless it says
 * "taken over". The state's implementation (state.h) takes its lock.
 */
typedef struct ext_sink {
    void *ctx;
    /* Nodes: a list (n specs, dra[i]: labelled for DRA), one node seen, one gone. */
    /* leaving[i] / leaving: ext_node_leaving's reason, "" when the node stays. */
    /* spot[i] / spot: its labels say spot capacity (kgpu_capacity_spot). */
    int (*nodes_listed)(void *ctx, kgpu_node_spec *specs, const bool *dra,
                        const char (*leaving)[EXT_LEAVING_MAX], const bool *spot, size_t n,
                        kgpu_error *err);
    int (*node_seen)(void *ctx, kgpu_node_spec *spec, bool dra, const char *leaving, bool spot,
                     kgpu_error *err);
    void (*node_gone)(void *ctx, const char *name);
    /*
     * Which scale-down annotations a GPU node carries (ext_node_guard_marks):
     * called for each node of a list after nodes_listed (which forgets the
     * marks the list replaces) and for each node seen.
     */
    void (*node_marked)(void *ctx, const char *name, int marks);
    /* Whether the nodes are known (pods name their nodes: the pod source waits for this). */
    bool (*nodes_known)(void *ctx);
    /* The cluster file's nodes: pods are known with them (there are none). */
    int (*file_nodes)(void *ctx, const kgpu_node_spec *specs, int n, kgpu_error *err);
    /*
     * Pods: a list; pods it did not show that may have been bound after its
     * snapshot come back in *suspects ("ns/name/uid", malloc'd, the source
     * frees) for the source to look up, and to report with pod_gone if gone.
     */
    void (*pods_listed)(void *ctx, json_t *items, char ***suspects, size_t *nsuspects);
    long (*pods_held)(void *ctx); /* pods holding GPUs now */
    void (*pod_seen)(void *ctx, const json_t *pod);
    void (*pod_gone)(void *ctx, const char *uid);
    /* The pod watch restarts: pods bound from now on may miss the coming list. */
    void (*pods_relisting)(void *ctx);
    /* DRA: slices (copied), claims (taken over), a list of either replacing all. */
    void (*slices_listed)(void *ctx, const ext_dra_slice *s, int n);
    void (*slice_seen)(void *ctx, const ext_dra_slice *s);
    void (*slice_gone)(void *ctx, const char *name, const char *node);
    /* Returns the devices not counted now. */
    int (*claims_listed)(void *ctx, ext_dra_claim **c, int n);
    void (*claim_seen)(void *ctx, ext_dra_claim *c);
    void (*claim_gone)(void *ctx, const char *ns, const char *name);
    /* A DRA reflector restarts: `why` has "HTTP 404" when the server has no such resource. */
    void (*dra_restart)(void *ctx, enum ext_dra_kind which, const char *why);
    /* GPUQueues (trimmed, borrowed): a list, one seen (obj NULL: gone), a restart. */
    void (*gpuqueues_listed)(void *ctx, json_t *items);
    void (*gpuqueue_seen)(void *ctx, const char *name, json_t *obj);
    void (*gpuqueues_restart)(void *ctx, const char *why);
    /* Namespaces' kgpu.io/queue: a list (trimmed), one seen (queue NULL: gone or none). */
    void (*namespaces_listed)(void *ctx, json_t *items);
    void (*namespace_seen)(void *ctx, const char *name, const json_t *ns); /* NULL: deleted */
} ext_sink;

/* What the reflectors need; lives as long as their threads. */
typedef struct ext_sources {
    kgpu_k8s *k8s;
    ext_metrics *metrics;    /* watch restarts */
    const ext_sink *sink;
    atomic_bool *stop; /* the threads end once it is true */
    /*
     * The node groups (--node-groups; NULL none): the labels they name are
     * kept on the nodes handed to the sink, so a group's nodes can be
     * counted; other labels are not kept (memory).
     */
    const struct kgpu_node_groups *groups;
} ext_sources;

/*
 * Starts the reflector threads of cluster mode: nodes, pods, GPUQueues,
 * namespaces, ResourceSlices of gpu.kgpu.io, ResourceClaims. Their ids go
 * to threads[*n...] (room for EXT_SOURCES_THREADS); join them after stop.
 */
#define EXT_SOURCES_THREADS 6
int ext_sources_start(ext_sources *s, pthread_t *threads, int *n, kgpu_error *err);

/*
 * The --cluster-file form: nodes: [{name, cpu_milli?, memory_mib?, labels?,
 * gpus: [...]}], handed to sink->file_nodes. Errors name the file and the entry.
 */
int ext_cluster_file_load(const char *path, const ext_sink *sink, kgpu_error *err);

/* ---- leader election on a Lease (leader.c) ---- */

typedef struct ext_leader {
    const ext_config *cfg;
    kgpu_k8s *k8s;
    const atomic_bool *stop; /* the thread ends once it is true */
    atomic_bool leads; /* this replica holds the lease */
    char identity[256];
    pthread_t thread;
    bool running;
} ext_leader;

/* Starts the election thread (cfg, k8s and stop set); identity is filled. */
int ext_leader_start(ext_leader *l, kgpu_error *err);
/* Ends it; a leader hands the lease back on its way out. */
void ext_leader_stop(ext_leader *l);

#endif
