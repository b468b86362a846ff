/*
 * kgpu-expander: Cluster Autoscaler's gRPC expander (--expander=grpc),
 * choosing among the node groups Cluster Autoscaler offers by what kgpu
 * would really place on them (kgpu/expander.h), and offering none when no
 * new node would take a pending pod.
 *
 *   decode.c   CA's v1.Node and v1.Pod protobuf bytes as the JSON kgpu reads
 *   service.c  BestOptions: request bytes in, response bytes out (pure)
 *   main.c     flags, TLS, the gRPC server (src/nodeagent grpcsrv.c)
 *
 * Threads: every call runs on its own worker thread (grpcsrv.c) over a
 * read-only configuration; nothing is shared between calls.
 */
#ifndef KGPU_CAEXP_H
#define KGPU_CAEXP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ca_expander.pb-c.h"
#include "kgpu/autoscale.h"
#include "kgpu/error.h"
#include "kgpu/model.h"

/* The method Cluster Autoscaler calls (package grpcplugin, service Expander). */
#define CAEXP_METHOD "/grpcplugin.Expander/BestOptions"

/* Bounds on one request: beyond them the call fails and CA keeps its own choice. */
#define CAEXP_MAX_GROUPS  1000
#define CAEXP_MAX_PODS    20000  /* distinct pending pods (CA lists one in every option it fits) */
#define CAEXP_MAX_ENTRIES 200000 /* pod entries over all options */
#define CAEXP_MAX_NEW_NODES 5000  /* nodes one option adds */

/*
 * v1.Node / v1.Pod protobuf bytes (as Cluster Autoscaler sends them) as
 * their JSON form, cut to what kgpu reads: metadata name, namespace, uid,
 * labels, annotations; a node's spec.unschedulable, spec.taints,
 * status.capacity and .allocatable; a pod's containers' and init
 * containers' names and resources, nodeSelector, tolerations, priority.
 * NULL with err (KGPU_EPARSE) for bytes that are not such a message.
 */
json_t *caexp_node_json(const uint8_t *b, size_t n, kgpu_error *err);
json_t *caexp_pod_json(const uint8_t *b, size_t n, kgpu_error *err);

/*
 * Whether a node group's template says spot (preemptible) capacity: its
 * labels as kgpu_capacity_spot (src/common/capacity.h) reads them.
 */
bool caexp_template_spot(const json_t *node);

/* ---- service.c ---- */

/* What the service needs besides the request. Read-only while serving. */
typedef struct caexp_config {
    int64_t memory_unit_mib; /* one kgpu.io/gpu-mem unit (1024) */
    /*
     * Prices of nodes by GPU model and capacity type (kgpu_prices_node);
     * NULL: every group costs nothing. Borrowed.
     */
    const kgpu_prices *prices;
    double pod_gpu_price, pod_core_price; /* what a placed pod is worth (kgpu/expander.h) */
} caexp_config;

/* What one call decided, for the log line and the counters. */
typedef struct caexp_decision {
    int options;  /* offered */
    int chosen;   /* index into the request's options, -1 for none */
    int placed;   /* pending pods kgpu places on the chosen option's new nodes */
    int offered;  /* pods Cluster Autoscaler expected them to take */
    char group[256];
} caexp_decision;

/*
 * BestOptions: `in` is a BestOptionsRequest; *out (malloc'd) the
 * BestOptionsResponse: the one option kgpu chooses, or no option at all when
 * none would really place a pending pod (Cluster Autoscaler then adds no
 * node). Errors name what was wrong ("option 2 (group gpu-a10): pod 4: not
 * a v1.Pod in protobuf encoding"): KGPU_EPARSE, KGPU_EINVAL, KGPU_ERANGE
 * (past the bounds above), KGPU_ENOMEM.
 */
int caexp_best_options(const caexp_config *cfg, const uint8_t *in, size_t len, uint8_t **out,
                       size_t *outlen, caexp_decision *d, kgpu_error *err);

#endif
