/*
 * kgpu-extender's HTTP serving layer (libmicrohttpd): the scheduling
 * listener, the probe listener, and the limits that keep both answering
 * under attack. It knows nothing of scheduling: a complete, size-checked
 * request goes to the handler it was given, its answer goes back.
 *
 * Why it is built this way (docs/install-extender.md, "Limits"):
 * - epoll with a small pool of I/O threads (serveThreads): a slow client
 *   costs a descriptor and a connection's buffer, not a thread, and
 *   descriptors above 1023 work (select() cannot watch them).
 * - The handlers run on their own pool (handlerThreads): a bind waits for the
 *   API server, and must not stall the other connections of its I/O thread.
 *   The connection is suspended while its request is handled. Bodies larger
 *   than LARGE_BODY go to one dedicated thread, so that their parse trees are
 *   built one at a time and small calls never queue behind them.
 * - Every connection must deliver a whole request within requestTimeoutSeconds
 *   of its accept or of its previous answer, and take its answer within as
 *   long: libmicrohttpd's own timeout restarts on every byte, so a watchdog
 *   shuts the socket of a connection past its deadline.
 * - The bytes of request bodies held in memory, across all connections, stay
 *   under maxBufferedBytes: an upload that would pass it is refused before
 *   its body is read (503), one larger than maxBodyBytes too (413).
 * - /healthz and /readyz are also served on probeListen by a separate small
 *   daemon: a client that fills the scheduling port cannot fail the probes.
 */
#include <errno.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_impl.h"
#include "fileio.h"


/* ---- the buffer budget ---- */

static bool budget_take(ext_http *h, size_t n)
{
    long long limit = h->cfg->max_buffered_bytes;
    long long cur = atomic_load(&h->buffered);
    do {
        if (cur + (long long)n > limit)
            return false;
    } while (!atomic_compare_exchange_weak(&h->buffered, &cur, cur + (long long)n));
    long long now = cur + (long long)n;
    long long peak = atomic_load(&h->metrics->http_buffered_peak);
    while (now > peak && !atomic_compare_exchange_weak(&h->metrics->http_buffered_peak, &peak, now))
        ;
    atomic_store(&h->metrics->http_buffered, now);
    return true;
}

static void budget_give(ext_http *h, size_t n)
{
    long long now = atomic_fetch_sub(&h->buffered, (long long)n) - (long long)n;
    atomic_store(&h->metrics->http_buffered, now);
}

static void request_free_body(request *rq)
{
    free(rq->body);
    rq->body = NULL;
    rq->len = rq->cap = 0;
    if (rq->charged > 0)
        budget_give(rq->h, rq->charged);
    rq->charged = 0;
}

/* ---- the connection registry and its watchdog ---- */

static void slot_phase(ext_http *h, conn_slot *s, enum slot_phase phase)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    s->phase = phase;
    s->since = ext_now();
    pthread_mutex_unlock(&h->mu);
}

void ext__http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    ext_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_slot *s = calloc(1, sizeof(*s));
        if (s == NULL || ci == NULL) {
            free(s);
            *socket_context = NULL; /* ext__http_on_request refuses a connection without a slot */
            return;
        }
        s->fd = ci->connect_fd;
        s->since = ext_now();
        pthread_mutex_lock(&h->mu);
        s->prev = h->registry.prev;
        s->next = &h->registry;
        h->registry.prev->next = s;
        h->registry.prev = s;
        pthread_mutex_unlock(&h->mu);
        atomic_fetch_add(&h->metrics->http_connections, 1);
        atomic_fetch_add(&h->metrics->http_accepted, 1);
        *socket_context = s;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
        conn_slot *s = *socket_context;
        pthread_mutex_lock(&h->mu);
        s->prev->next = s->next;
        s->next->prev = s->prev;
        pthread_mutex_unlock(&h->mu);
        atomic_fetch_sub(&h->metrics->http_connections, 1);
        free(s);
        *socket_context = NULL;
    }
}

/*
 * Shuts the sockets of connections past their deadline. shutdown() wakes
 * libmicrohttpd's epoll, which reads the end of the stream and closes the
 * connection as if the client had left: its thread stays the only one to
 * touch the connection.
 */
void *ext__http_watchdog_main(void *arg)
{
    ext_http *h = arg;
    double limit = h->cfg->request_timeout_s;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        double now = ext_now();
        for (conn_slot *s = h->registry.next; s != &h->registry; s = s->next) {
            if (s->shut || s->phase == SLOT_WORKING || now - s->since < limit)
                continue;
            shutdown(s->fd, SHUT_RDWR);
            s->shut = true;
            atomic_fetch_add(&h->metrics->http_deadline_closes, 1);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&h->watch_cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- replies ---- */

/* libmicrohttpd's reader over an ext_stream (cls: a malloc'd copy of it). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    ext_stream *s = cls;
    long n = s->read(s->ctx, buf, max);
    return n > 0 ? (ssize_t)n : n == 0 ? MHD_CONTENT_READER_END_OF_STREAM
                                       : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
    ext_stream *s = cls;
    s->free(s->ctx);
    free(s);
}

/* A response for r, which it takes over (also when it fails: NULL). */
static struct MHD_Response *make_response(ext_response *r)
{
    if (r->stream.read == NULL) {
        char *body = r->body;
        r->body = NULL;
        struct MHD_Response *resp = MHD_create_response_from_buffer(
            body ? strlen(body) : 0, body ? body : (void *)"",
            body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        if (resp == NULL)
            free(body);
        return resp;
    }
    ext_stream *s = malloc(sizeof(*s));
    if (s == NULL) {
        ext_response_discard(r);
        return NULL;
    }
    *s = r->stream;
    r->stream = (ext_stream){0};
    /* Chunked, in pieces of up to 64 KiB, generated as the client reads. */
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, s,
                                          stream_free);
    if (resp == NULL)
        stream_free(s);
    return resp;
}

/* Queues r (taken over) on conn. */
static enum MHD_Result send_response(struct MHD_Connection *conn, ext_response *r)
{
    int status = r->status;
    const char *type = r->content_type;
    struct MHD_Response *resp = make_response(r);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_reply(struct MHD_Connection *conn, int status, const char *type,
                                  char *body)
{
    return send_response(conn, &(ext_response){status, type, body, {0}});
}

/* An answer before the body is read: libmicrohttpd then drops the body and closes. */
static enum MHD_Result refuse(ext_http *h, request *rq, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result refuse(ext_http *h, request *rq, int status, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    request_free_body(rq);
    int why = status == 413 ? EXT_HTTP_REFUSED_TOO_LARGE
              : status == 503 ? EXT_HTTP_REFUSED_BUSY
              : status == 403 ? EXT_HTTP_REFUSED_UNAUTHENTICATED
                              : EXT_HTTP_REFUSED_BAD_FRAMING;
    atomic_fetch_add(&h->metrics->http_refused[why], 1);
    slot_phase(h, rq->slot, SLOT_SENDING);
    if (status == 403)
        return send_reply(rq->conn, status, "text/plain", strdup("client certificate required\n"));
    char *body = NULL;
    if (asprintf(&body, "{\"Error\":\"%s\"}", msg) < 0)
        return MHD_NO;
    return send_reply(rq->conn, status, "application/json", body);
}

/* ---- the handler pool ---- */

/*
 * The most a handler may allocate for a body, charged to the budget while it
 * runs: jansson's tree (a value of `[]` or `{}` costs more than a hundred
 * bytes, so a body of them weighs far more than its length), filter's two
 * copies of the body, and the reply's entry (name and reason) for each node.
 * The values are counted, not parsed: one pass, outside strings.
 */
static size_t working_estimate(const ext_config *cfg, const char *body, size_t len)
{
    size_t values = 1;
    bool in_string = false, escape = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string) {
            if (escape)
                escape = false;
            else if (c == '\\')
                escape = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == ',' || c == '[' || c == ':') {
            values++;
        }
    }
    size_t nodes = values < (size_t)cfg->max_node_names ? values : (size_t)cfg->max_node_names;
    return 3 * len + values * JSON_VALUE_BYTES + nodes * REPLY_NODE_BYTES;
}

static void handle_now(ext_http *h, request *rq)
{
    const ext_config *cfg = h->cfg;
    size_t est = rq->len > 0 ? working_estimate(cfg, rq->body, rq->len) : 0;
    char msg[256];
    if (est > (size_t)cfg->max_buffered_bytes) {
        snprintf(msg, sizeof(msg),
                 "{\"Error\":\"request too complex: parsing it could take %zu bytes, more than "
                 "maxBufferedBytes %ld\"}",
                 est, cfg->max_buffered_bytes);
        rq->resp = (ext_response){413, "application/json", strdup(msg), {0}};
        atomic_fetch_add(&h->metrics->http_refused[EXT_HTTP_REFUSED_TOO_LARGE], 1);
        est = 0;
    } else if (!budget_take(h, est)) {
        snprintf(msg, sizeof(msg),
                 "{\"Error\":\"the extender's request memory (maxBufferedBytes %ld) is in use; "
                 "retry\"}",
                 cfg->max_buffered_bytes);
        rq->resp = (ext_response){503, "application/json", strdup(msg), {0}};
        atomic_fetch_add(&h->metrics->http_refused[EXT_HTTP_REFUSED_BUSY], 1);
        est = 0;
    } else {
        h->handle(h->ctx, rq->method, rq->url, rq->body ? rq->body : "", rq->len, &rq->resp);
        budget_give(h, est);
    }
    if (rq->resp.body == NULL && rq->resp.stream.read == NULL) {
        rq->resp.status = 500;
        rq->resp.content_type = "text/plain";
        rq->resp.body = strdup("out of memory\n");
    }
    request_free_body(rq); /* the answer is built: the budget is free for other uploads */
    rq->answered = true;
}

void *ext__http_worker_main(void *arg)
{
    worker *w = arg;
    ext_http *h = w->h;
    job_queue *q = w->q;
    pthread_mutex_t *mu = &h->mu;
    pthread_mutex_lock(mu);
    for (;;) {
        while (q->head == NULL && !h->stopping)
            pthread_cond_wait(&q->cv, mu);
        request *rq = q->head;
        if (rq == NULL)
            break; /* stopping, and nothing left to answer */
        q->head = rq->qnext;
        if (q->head == NULL)
            q->tail = NULL;
        pthread_mutex_unlock(mu);
        handle_now(h, rq);
        slot_phase(h, rq->slot, SLOT_SENDING);
        MHD_resume_connection(rq->conn);
        pthread_mutex_lock(mu);
    }
    pthread_mutex_unlock(mu);
    return NULL;
}

/* Hands a complete request to the pool; false when stopping (answer it here). */
static bool dispatch(ext_http *h, request *rq)
{
    /* Observers render the whole state: one at a time, never in the scheduler's way. */
    bool observer = strncmp(rq->url, "/inspect", 8) == 0 || strcmp(rq->url, "/metrics") == 0 ||
                    strcmp(rq->url, "/estimate") == 0;
    job_queue *q = rq->len > LARGE_BODY || observer ? &h->large : &h->small;
    pthread_mutex_lock(&h->mu);
    if (h->stopping) {
        pthread_mutex_unlock(&h->mu);
        return false;
    }
    if (rq->slot != NULL) {
        rq->slot->phase = SLOT_WORKING;
        rq->slot->since = ext_now();
    }
    MHD_suspend_connection(rq->conn);
    rq->qnext = NULL;
    if (q->tail != NULL)
        q->tail->qnext = rq;
    else
        q->head = rq;
    q->tail = rq;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&h->mu);
    return true;
}

/* ---- the scheduling listener ---- */

/* SHA-256 over the peer's certificates as presented, each with its length; 0 on success. */
static int peer_digest(const gnutls_datum_t *certs, unsigned int n, unsigned char *out)
{
    gnutls_hash_hd_t hd;
    if (gnutls_hash_init(&hd, GNUTLS_DIG_SHA256) != 0)
        return -1;
    int rc = 0;
    for (unsigned int i = 0; i < n && rc == 0; i++) {
        unsigned char len[4] = {(unsigned char)(certs[i].size >> 24),
                                (unsigned char)(certs[i].size >> 16),
                                (unsigned char)(certs[i].size >> 8), (unsigned char)certs[i].size};
        rc = gnutls_hash(hd, len, sizeof(len));
        if (rc == 0)
            rc = gnutls_hash(hd, certs[i].data, certs[i].size);
    }
    gnutls_hash_deinit(hd, out);
    return rc;
}

/*
 * With a client CA configured, only peers whose certificate it signed get in.
 * Verifying the chain (parsing it, checking its signatures) costs far more
 * than answering a filter, and kube-scheduler sends every call of a pod on
 * connections it keeps: so a connection's verdict is kept in its slot and
 * reused while the peer presents the very same chain (compared by digest, so
 * a renegotiation with another certificate is verified afresh) and for at most
 * PEER_RECHECK_S. A refusal is never kept.
 */
static bool client_allowed(const ext_http *d, struct MHD_Connection *conn, conn_slot *slot)
{
    if (d->tls_ca_pem == NULL)
        return true;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (ci == NULL || ci->tls_session == NULL)
        return false;
    gnutls_session_t tls = (gnutls_session_t)ci->tls_session;
    unsigned int n = 0, status = 0;
    const gnutls_datum_t *certs = gnutls_certificate_get_peers(tls, &n);
    if (certs == NULL || n == 0)
        return false;
    unsigned char digest[PEER_DIGEST_LEN];
    bool digested = slot != NULL && peer_digest(certs, n, digest) == 0;
    double now = ext_now();
    if (digested && slot->peer_ok && now - slot->peer_checked < PEER_RECHECK_S &&
        memcmp(digest, slot->peer_digest, sizeof(digest)) == 0)
        return true;
    bool ok = gnutls_certificate_verify_peers2(tls, &status) == 0 && status == 0;
    if (digested) {
        slot->peer_ok = ok;
        slot->peer_checked = now;
        memcpy(slot->peer_digest, digest, sizeof(digest));
    }
    return ok;
}

typedef struct length_headers {
    int n;
    bool disagree, malformed;
    bool transfer_encoding; /* any Transfer-Encoding header */
    unsigned long long value;
} length_headers;

static enum MHD_Result count_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    length_headers *lh = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
        lh->transfer_encoding = true;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0)
        return MHD_YES;
    char *end;
    errno = 0;
    unsigned long long v = value && *value >= '0' && *value <= '9' ? strtoull(value, &end, 10) : 0;
    if (value == NULL || *value < '0' || *value > '9' || *end != '\0' || errno != 0)
        lh->malformed = true;
    else if (lh->n > 0 && v != lh->value)
        lh->disagree = true;
    lh->value = v;
    lh->n++;
    return MHD_YES;
}

/* The first call, headers read: every check that can answer before the body. */
static enum MHD_Result request_start(ext_http *h, request *rq, const char *method,
                                     const char *url)
{
    ext_http *d = h;
    /* Probes carry no client certificate: health and version reveal nothing. */
    bool probe = strcmp(method, "GET") == 0 &&
                 (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0 ||
                  strcmp(url, "/version") == 0);
    /*
     * Nor does the API server calling the pod-routing webhook (mutate.c): its
     * answer depends on the request alone and changes nothing here.
     */
    bool webhook = strcmp(method, "POST") == 0 && strcmp(url, "/mutate/pods") == 0;
    if (!probe && !webhook && !client_allowed(d, rq->conn, rq->slot))
        return refuse(h, rq, 403, "client certificate required");
    length_headers lh = {0, false, false, false, 0};
    MHD_get_connection_values(rq->conn, MHD_HEADER_KIND, count_length, &lh);
    /* RFC 9110 8.6: differing lengths leave the message's end unknown. */
    if (lh.disagree || lh.malformed)
        return refuse(h, rq, 400, "%s Content-Length headers",
                      lh.disagree ? "conflicting" : "malformed");
    /*
     * RFC 9112 6.1: both headers may be a request smuggled past a proxy that
     * reads the other one. libmicrohttpd follows Transfer-Encoding and keeps
     * the connection open for what follows; refused, the connection closes.
     */
    if (lh.n > 0 && lh.transfer_encoding)
        return refuse(h, rq, 400, "both Transfer-Encoding and Content-Length headers");
    if (lh.n > 0 && lh.value > (unsigned long long)d->cfg->max_body_bytes)
        return refuse(h, rq, 413, "request body larger than %ld bytes", d->cfg->max_body_bytes);
    if (lh.n > 0 && lh.value > 0) {
        /* The whole declared body is charged now: a stalled upload holds its share. */
        if (!budget_take(h, (size_t)lh.value))
            return refuse(h, rq, 503,
                          "the extender holds %ld bytes of request bodies already; retry",
                          d->cfg->max_buffered_bytes);
        rq->charged = (size_t)lh.value; /* the body; its terminating NUL is not counted */
        if ((rq->body = malloc((size_t)lh.value + 1)) == NULL)
            return refuse(h, rq, 503, "out of memory");
        rq->cap = (size_t)lh.value + 1;
    }
    return MHD_YES;
}

/* A piece of the body: appended within maxBodyBytes and the budget. */
static enum MHD_Result request_data(ext_http *h, request *rq, const char *data, size_t n)
{
    ext_http *d = h;
    if (rq->len + n > (size_t)d->cfg->max_body_bytes)
        return refuse(h, rq, 413, "request body larger than %ld bytes", d->cfg->max_body_bytes);
    if (rq->len + n + 1 > rq->cap) {
        /* Chunked (or longer than declared, which libmicrohttpd does not pass on). */
        size_t cap = rq->cap ? rq->cap : 4096;
        while (cap < rq->len + n + 1)
            cap *= 2;
        if (cap > (size_t)d->cfg->max_body_bytes + 1)
            cap = (size_t)d->cfg->max_body_bytes + 1;
        if (!budget_take(h, cap - 1 - rq->charged))
            return refuse(h, rq, 503,
                          "the extender holds %ld bytes of request bodies already; retry",
                          d->cfg->max_buffered_bytes);
        rq->charged = cap - 1;
        char *b = realloc(rq->body, cap);
        if (b == NULL)
            return refuse(h, rq, 503, "out of memory");
        rq->body = b;
        rq->cap = cap;
    }
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
    rq->body[rq->len] = '\0';
    return MHD_YES;
}

enum MHD_Result ext__http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    ext_http *h = cls;
    request *rq = *con_cls;
    if (rq == NULL) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        conn_slot *slot = ci ? ci->socket_context : NULL;
        if (slot == NULL && h->pooled)
            return MHD_NO; /* no deadline could be kept for it */
        if ((rq = calloc(1, sizeof(*rq))) == NULL)
            return MHD_NO;
        rq->h = h;
        rq->conn = conn;
        rq->slot = slot;
        rq->method = method;
        rq->url = url;
        *con_cls = rq;
        return request_start(h, rq, method, url);
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return request_data(h, rq, upload_data, n);
    }
    if (!rq->answered) {
        if (h->pooled && dispatch(h, rq))
            return MHD_YES; /* resumed by the worker; then called again, answered */
        if (h->pooled) {
            request_free_body(rq);
            return send_reply(conn, 503, "application/json",
                              strdup("{\"Error\":\"the extender is stopping\"}"));
        }
        handle_now(h, rq);
    }
    slot_phase(h, rq->slot, SLOT_SENDING);
    ext_response r = rq->resp;
    rq->resp.body = NULL;
    rq->resp.stream = (ext_stream){0};
    return send_response(conn, &r);
}

void ext__http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    ext_http *h = cls;
    request *rq = *con_cls;
    if (rq == NULL)
        return;
    /* Kept alive, the connection has until the deadline to send its next request. */
    slot_phase(h, rq->slot, SLOT_READING);
    request_free_body(rq);
    ext_response_discard(&rq->resp);
    free(rq);
    *con_cls = NULL;
}

/* ---- the probe listener ---- */

enum MHD_Result ext__http_on_probe(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls)
{
    ext_http *h = cls;
    /* Answered as soon as the headers are in: a body, if any, is never read. */
    if (*con_cls != NULL)
        return MHD_NO;
    *con_cls = conn;
    ext_response r;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool known = strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0 ||
                 strcmp(url, "/version") == 0;
    if (!get) {
        r.status = 405;
        r.content_type = "text/plain";
        r.body = strdup("method not allowed: this port serves GET /healthz, /readyz and /version\n");
    } else if (known) {
        h->handle(h->ctx, method, url, "", 0, &r);
    } else {
        r.status = 404;
        r.content_type = "text/plain";
        r.body = strdup("not found: this port serves /healthz, /readyz and /version\n");
    }
    if (r.body == NULL)
        return MHD_NO;
    return send_reply(conn, r.status, r.content_type, r.body);
}
