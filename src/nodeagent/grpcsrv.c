/*
 * gRPC servers for the node agents (nodeagent.h), on gRPC core's C API
 * (Debian's libgrpc): one server per unix socket. Messages are protobuf-c
 * bytes; this file only moves them.
 *
 * Each server has one thread that owns its completion queue and every call
 * on it. Calls are tagged with a small struct that says which step
 * completed. Calls of the streamed method (the device plugin's
 * ListAndWatch) stay open: the thread sends the current
 * snapshot when the stream starts and again whenever the snapshot's
 * generation moves on (checked every 100 ms, however busy the queue is),
 * one send in flight per stream. Unary calls are handed to a detached
 * worker thread once their request has arrived; the worker starts the reply
 * batch itself, and the reply's completion, back on the queue thread, frees
 * the call.
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grpcsrv.h"
#include "log.h"

#define POLL_MS 100

typedef enum tag_kind { TAG_NEW, TAG_RECV, TAG_REPLY, TAG_SEND, TAG_CLOSE, TAG_SHUTDOWN } tag_kind;

struct rpc;
typedef struct tag {
    tag_kind kind;
    struct rpc *call;
} tag;

typedef struct rpc {
    node_server *s;
    grpc_call *call;
    grpc_call_details det;
    grpc_metadata_array md;
    char *method;
    tag t_main, t_send, t_close;
    grpc_byte_buffer *in, *out;
    grpc_slice details;
    int cancelled;
    bool stream, send_busy, closed;
    uint64_t sent_gen;
    struct rpc *next; /* in the server's list of streams */
} rpc;

struct node_server {
    grpc_server *srv;
    grpc_completion_queue *cq;
    pthread_t thread;
    char name[128];           /* in log lines: the resource or service served */
    char stream[256];         /* the streamed method's full name; "" = none */
    const char *stream_short; /* its last part, in log lines ("ListAndWatch") */
    node_snapshot *snap;
    node_unary_fn unary;
    void *ctx;
    char path[1100];
    atomic_bool stopping;
    int live; /* call structs allocated; queue thread only */
    rpc *streams;
    tag t_shutdown;
};

void node_grpc_init(void)
{
    grpc_init();
}

void node_grpc_shutdown(void)
{
    grpc_shutdown();
}

static void request_new(node_server *s)
{
    rpc *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        kgpu_log(KGPU_LOG_ERROR, "%s: out of memory accepting a call", s->name);
        return;
    }
    c->s = s;
    c->t_main = (tag){TAG_NEW, c};
    c->t_send = (tag){TAG_SEND, c};
    c->t_close = (tag){TAG_CLOSE, c};
    grpc_call_details_init(&c->det);
    grpc_metadata_array_init(&c->md);
    s->live++;
    grpc_call_error e =
        grpc_server_request_call(s->srv, &c->call, &c->det, &c->md, s->cq, s->cq, &c->t_main);
    if (e != GRPC_CALL_OK) {
        kgpu_log(KGPU_LOG_ERROR, "%s: grpc_server_request_call: %d", s->name, (int)e);
        grpc_call_details_destroy(&c->det);
        grpc_metadata_array_destroy(&c->md);
        free(c);
        s->live--;
    }
}

static void free_call(rpc *c)
{
    node_server *s = c->s;
    if (c->in != NULL)
        grpc_byte_buffer_destroy(c->in);
    if (c->out != NULL)
        grpc_byte_buffer_destroy(c->out);
    if (c->call != NULL)
        grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->det);
    grpc_metadata_array_destroy(&c->md);
    grpc_slice_unref(c->details);
    gpr_free(c->method);
    free(c);
    s->live--;
}

/* A copy of the snapshot as a byte buffer; its generation in *gen. */
static grpc_byte_buffer *snapshot_buffer(node_snapshot *snap, uint64_t *gen)
{
    pthread_mutex_lock(&snap->mu);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)snap->buf, snap->len);
    *gen = snap->gen;
    pthread_mutex_unlock(&snap->mu);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

static void stream_send(rpc *c, bool first)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    int n = 0;
    if (first)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->out = snapshot_buffer(c->s->snap, &c->sent_gen);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->out;
    c->send_busy = true;
    if (grpc_call_start_batch(c->call, ops, (size_t)n, &c->t_send, NULL) != GRPC_CALL_OK) {
        c->send_busy = false;
        c->closed = true;
        grpc_call_cancel(c->call, NULL);
    }
}

static void unlink_stream(node_server *s, rpc *c)
{
    for (rpc **p = &s->streams; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            return;
        }
}

/* Starts the final batch of a unary call: message (when OK) and status. */
static void reply(rpc *c, const uint8_t *body, size_t len, const node_status *st)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    int n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (st->code == 0) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)body, len);
        c->out = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->out;
    }
    c->details = grpc_slice_from_copied_string(st->message);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)st->code;
    ops[n++].data.send_status_from_server.status_details = st->code ? &c->details : NULL;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->t_main.kind = TAG_REPLY;
    if (grpc_call_start_batch(c->call, ops, (size_t)n, &c->t_main, NULL) != GRPC_CALL_OK)
        kgpu_log(KGPU_LOG_ERROR, "%s %s: could not start the reply", c->s->name, c->method);
}

static void *worker(void *arg)
{
    rpc *c = arg;
    node_server *s = c->s;
    uint8_t *out = NULL;
    size_t outlen = 0;
    node_status st = {0, ""};
    grpc_slice req = grpc_empty_slice();
    if (c->in != NULL) {
        grpc_byte_buffer_reader r;
        if (grpc_byte_buffer_reader_init(&r, c->in)) {
            req = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
        }
    }
    s->unary(s->ctx, c->method, GRPC_SLICE_START_PTR(req), GRPC_SLICE_LENGTH(req), &out,
             &outlen, &st);
    grpc_slice_unref(req);
    if (st.code == 0 && out == NULL) {
        st.code = GRPC_STATUS_INTERNAL;
        snprintf(st.message, sizeof(st.message), "no response");
    }
    reply(c, out, outlen, &st);
    free(out);
    return NULL;
}

static void on_new(node_server *s, rpc *c, bool ok)
{
    if (!ok) {
        free_call(c); /* the server is shutting down */
        return;
    }
    if (!atomic_load(&s->stopping))
        request_new(s);
    c->method = grpc_slice_to_c_string(c->det.method);
    kgpu_log(KGPU_LOG_DEBUG, "%s: call %s", s->name, c->method);
    if (s->stream[0] != '\0' && strcmp(c->method, s->stream) == 0) {
        c->stream = true;
        c->next = s->streams;
        s->streams = c;
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        op.data.recv_close_on_server.cancelled = &c->cancelled;
        if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK)
            c->closed = true;
        stream_send(c, true);
        if (c->closed && !c->send_busy) {
            unlink_stream(s, c);
            free_call(c);
        }
        return;
    }
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->in;
    c->t_main.kind = TAG_RECV;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_main, NULL) != GRPC_CALL_OK)
        free_call(c);
}

static void on_recv(node_server *s, rpc *c, bool ok)
{
    if (!ok || atomic_load(&s->stopping)) {
        /* The text predates the DRA driver, which answers the same; clients may match it. */
        node_status st = {GRPC_STATUS_UNAVAILABLE, "kgpu-device-plugin is stopping"};
        if (!ok)
            snprintf(st.message, sizeof(st.message), "request not received");
        reply(c, NULL, 0, &st);
        return;
    }
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, worker, c) != 0) {
        node_status st = {GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start a worker thread"};
        reply(c, NULL, 0, &st);
    }
    pthread_attr_destroy(&attr);
}

static void on_stream_event(node_server *s, rpc *c, tag_kind kind, bool ok)
{
    if (kind == TAG_SEND) {
        c->send_busy = false;
        grpc_byte_buffer_destroy(c->out);
        c->out = NULL;
        if (!ok)
            c->closed = true;
    } else {
        c->closed = true;
        kgpu_log(KGPU_LOG_INFO, "%s: %s stream closed%s", s->name, s->stream_short,
                 c->cancelled ? " by the client" : "");
    }
    if (c->closed) {
        if (!c->send_busy) {
            unlink_stream(s, c);
            free_call(c);
        }
        return;
    }
    uint64_t gen;
    pthread_mutex_lock(&s->snap->mu);
    gen = s->snap->gen;
    pthread_mutex_unlock(&s->snap->mu);
    if (gen != c->sent_gen)
        stream_send(c, false);
}

static void poll_streams(node_server *s)
{
    if (s->streams == NULL)
        return; /* also: no snapshot without a streamed method */
    uint64_t gen;
    pthread_mutex_lock(&s->snap->mu);
    gen = s->snap->gen;
    pthread_mutex_unlock(&s->snap->mu);
    for (rpc *c = s->streams; c != NULL; c = c->next)
        if (!c->closed && !c->send_busy && c->sent_gen != gen)
            stream_send(c, false);
}

static void *serve(void *arg)
{
    node_server *s = arg;
    bool shut = false, down = false;
    for (int i = 0; i < 4; i++)
        request_new(s);
    gpr_timespec poll_at =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
    for (;;) {
        if (!shut && atomic_load(&s->stopping)) {
            shut = true;
            grpc_server_shutdown_and_notify(s->srv, s->cq, &s->t_shutdown);
            grpc_server_cancel_all_calls(s->srv);
        }
        if (down && s->live == 0)
            break;
        /*
         * Streams are polled on a clock, not only when the queue falls idle:
         * a steady run of calls (each completes within POLL_MS of the last)
         * would otherwise keep every health change from kubelet.
         */
        if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), poll_at) >= 0) {
            poll_streams(s);
            poll_at = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
        }
        grpc_event ev = grpc_completion_queue_next(s->cq, poll_at, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            continue;
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        tag *t = ev.tag;
        switch (t->kind) {
        case TAG_SHUTDOWN:
            down = true;
            break;
        case TAG_NEW:
            on_new(s, t->call, ev.success);
            break;
        case TAG_RECV:
            on_recv(s, t->call, ev.success);
            break;
        case TAG_REPLY:
            free_call(t->call);
            break;
        case TAG_SEND:
        case TAG_CLOSE:
            on_stream_event(s, t->call, t->kind, ev.success);
            break;
        }
    }
    return NULL;
}

/* Destroys a server whose calls are all done, drains its queue, and frees it. */
static void server_free(node_server *s, bool remove_socket)
{
    grpc_server_destroy(s->srv);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    if (remove_socket && s->path[0] != '\0')
        unlink(s->path);
    free(s);
}

/*
 * A server listening at `addr` (a gRPC address: "unix:/path", "0.0.0.0:8447")
 * with credentials `cr` (taken over); `path` (may be "") is the socket file
 * to remove when the server goes.
 */
static node_server *start(const char *addr, const char *path, grpc_server_credentials *cr,
                          int max_recv, const char *name, const char *stream, node_snapshot *snap,
                          node_unary_fn unary, void *ctx, kgpu_error *err)
{
    node_server *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        grpc_server_credentials_release(cr);
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory starting a server");
        return NULL;
    }
    snprintf(s->name, sizeof(s->name), "%s", name);
    snprintf(s->stream, sizeof(s->stream), "%s", stream != NULL && snap != NULL ? stream : "");
    const char *slash = strrchr(s->stream, '/');
    s->stream_short = slash != NULL ? slash + 1 : s->stream;
    s->snap = snap;
    s->unary = unary;
    s->ctx = ctx;
    s->t_shutdown.kind = TAG_SHUTDOWN;
    snprintf(s->path, sizeof(s->path), "%s", path);
    if (path[0] != '\0')
        unlink(path); /* a socket left by an earlier run */
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_arg arg = {.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = max_recv};
    grpc_channel_args args = {.num_args = 1, .args = &arg};
    s->srv = grpc_server_create(max_recv > 0 ? &args : NULL, NULL);
    grpc_server_register_completion_queue(s->srv, s->cq, NULL);
    int port = grpc_server_add_http2_port(s->srv, addr, cr);
    grpc_server_credentials_release(cr);
    if (port == 0) {
        kgpu_error_set(err, KGPU_EIO, "cannot listen on %s", addr);
        server_free(s, false);
        return NULL;
    }
    grpc_server_start(s->srv);
    if (pthread_create(&s->thread, NULL, serve, s) != 0) {
        kgpu_error_set(err, KGPU_ENOMEM, "cannot start the server thread for %s", addr);
        atomic_store(&s->stopping, true);
        grpc_server_shutdown_and_notify(s->srv, s->cq, &s->t_shutdown);
        grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        server_free(s, true);
        return NULL;
    }
    return s;
}

node_server *node_server_start(const char *path, const char *name, const char *stream,
                               node_snapshot *snap, node_unary_fn unary, void *ctx,
                               kgpu_error *err)
{
    char addr[1200];
    snprintf(addr, sizeof(addr), "unix:%s", path);
    return start(addr, path, grpc_insecure_server_credentials_create(), 0, name, stream, snap,
                 unary, ctx, err);
}

node_server *node_server_start_tls(const char *addr, const char *cert_pem, const char *key_pem,
                                   const char *name, node_unary_fn unary, void *ctx,
                                   kgpu_error *err)
{
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key_pem, .cert_chain = cert_pem};
    grpc_server_credentials *cr = grpc_ssl_server_credentials_create_ex(
        NULL, &pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
    if (cr == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "the TLS certificate or key is not usable"),
               NULL;
    return start(addr, "", cr, NODE_TLS_MAX_MESSAGE, name, NULL, NULL, unary, ctx, err);
}

void node_server_stop(node_server *s)
{
    if (s == NULL)
        return;
    atomic_store(&s->stopping, true);
    pthread_join(s->thread, NULL);
    server_free(s, true);
}
