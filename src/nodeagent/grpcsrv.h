/*
 * gRPC core servers (grpcsrv.c, Debian's libgrpc): on a unix socket for the
 * node agents (nodeagent.h), over TLS on a TCP port for kgpu-expander.
 * Unary calls on worker threads, optionally one streamed method. Apart from
 * nodeagent.h so that a server's users need nothing else of the node agents.
 */
#ifndef KGPU_GRPCSRV_H
#define KGPU_GRPCSRV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"

/* The current message of a server's streamed method (written by the agent). */
typedef struct node_snapshot {
    pthread_mutex_t mu;
    uint64_t gen; /* bumped on every change */
    uint8_t *buf;
    size_t len;
} node_snapshot;

/* A gRPC status and message for a failed call. */
typedef struct node_status {
    int code; /* grpc_status_code; 0 = OK */
    char message[1024];
} node_status;

/*
 * A unary method: `in` is the request's bytes; on success *out (malloc'd)
 * holds the response's. Runs on a worker thread; `ctx` is the server's.
 */
typedef void (*node_unary_fn)(void *ctx, const char *method, const uint8_t *in, size_t len,
                              uint8_t **out, size_t *outlen, node_status *st);

typedef struct node_server node_server;

/*
 * Serves the unix socket `path` (removed first if stale). `name` (copied)
 * begins the server's log lines: the resource it serves ("kgpu.io/gpu-mem"),
 * or what else it is. Calls of `stream` (a full method name such as
 * "/v1beta1.DevicePlugin/ListAndWatch"; NULL for none) stay open and get
 * `snap`'s message at once and again whenever its generation moves on
 * (checked every 100 ms); every other method is handed to `unary` on a
 * worker thread of its own. `snap` (borrowed, outlives the server) may be
 * NULL without a stream.
 */
node_server *node_server_start(const char *path, const char *name, const char *stream,
                               node_snapshot *snap, node_unary_fn unary, void *ctx,
                               kgpu_error *err);
#define NODE_TLS_MAX_MESSAGE (32 << 20) /* largest request a TLS server takes (gRPC's default: 4 MiB) */

/*
 * Serves gRPC over TLS at `addr` ("0.0.0.0:8447", "[::]:8447") with the PEM
 * certificate chain and key given (their text; copied by gRPC), no client
 * certificate asked; unary methods only, as above. ALPN offers h2, which
 * gRPC-Go clients require.
 */
node_server *node_server_start_tls(const char *addr, const char *cert_pem, const char *key_pem,
                                   const char *name, node_unary_fn unary, void *ctx,
                                   kgpu_error *err);
/* Cancels every call, waits for workers and removes the socket. NULL is fine. */
void node_server_stop(node_server *s);

/* gRPC core's global state, around every server's life (node_daemon_main does it). */
void node_grpc_init(void);
void node_grpc_shutdown(void);

#endif
