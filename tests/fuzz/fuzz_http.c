/*
 * Fuzz target for the extender's HTTP framing: each input is written as raw
 * bytes, in one to three pieces, to the real serving layer (http.c on
 * libmicrohttpd) listening on loopback in this process, with a small cluster
 * and no API server. Whatever the bytes, every answer is "HTTP/1.1 NNN", never
 * a 500, and a fresh connection still gets GET /healthz answered afterwards.
 *
 * The daemon is started once per process with a 1 s request deadline and a
 * small maxBodyBytes. After the input the write side is shut; an input the
 * server cannot complete (a body cut short, a chunked body without its end)
 * then ends at that end of stream, or, where no answer has begun within
 * QUIET_S, by a reset from this side, so that replaying the corpus stays fast
 * (the deadline itself is tested in tests/integration/test_extender_hardening.py).
 * KGPU_FUZZ_HTTP_TRACE=1 prints each input's first status and time.
 */
#include <ctype.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ext.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ANSWER_WAIT_S  2.0       /* past the 1 s deadline and its 0.1 s watchdog tick */
#define QUIET_S        0.1       /* no answer begun by then: the server waits for more input */
#define ANSWER_KEEP    (1 << 16) /* bytes of the answer kept for the checks */
#define RESET_EVERY    256       /* inputs between releasing every pod the binds reserved */
#define PIECE_PAUSE_NS 100000    /* between pieces: lets the server read one at a time */

static ext_daemon daemon_state;
static bool tracing;

static void fail(const char *what, const uint8_t *answer, size_t n)
{
    fprintf(stderr, "fuzz_http: %s; the answer (%zu bytes) begins:\n%.*s\n", what, n,
            (int)(n < 512 ? n : 512), (const char *)answer);
    abort();
}

/* Starts the serving layer on 127.0.0.1, any port, once per process. */
static ext_daemon *server(void)
{
    static bool started;
    ext_daemon *d = &daemon_state;
    if (started)
        return d;
    started = true;
    tracing = getenv("KGPU_FUZZ_HTTP_TRACE") != NULL;
    ext_config_defaults(&d->cfg);
    d->cfg.log_level = -1;
    ext_log_set_level(-1);
    snprintf(d->cfg.listen, sizeof(d->cfg.listen), "127.0.0.1:0");
    d->cfg.probe_listen[0] = '\0';
    d->cfg.request_timeout_s = 1;
    d->cfg.max_body_bytes = 16384;
    d->cfg.max_buffered_bytes = 4L << 20;
    d->cfg.max_connections = 64;
    d->cfg.max_connections_per_client = 32;
    d->cfg.max_node_names = 64;
    d->cfg.serve_threads = 1;
    d->cfg.handler_threads = 2;
    atomic_init(&d->stop, false);
    kgpu_error err;
    if (ext_state_init(&d->state, &d->cfg, &d->metrics, &err) != 0) {
        fprintf(stderr, "fuzz_http: %s\n", err.msg);
        abort();
    }
    static const kgpu_gpu_spec a[] = {
        {0, "GPU-0", "A100", 81920, 0, true},
        {1, "GPU-1", "A100", 81920, 1, true},
    };
    static const kgpu_gpu_spec t[] = {{0, "GPU-t", "T4", 15360, -1, true}};
    kgpu_node_spec specs[] = {
        {.name = "n1", .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = a, .ngpus = 2},
        {.name = "n2", .cpu_milli = 32000, .memory_mib = 1 << 17, .gpus = t, .ngpus = 1},
    };
    pthread_mutex_lock(&d->state.mu);
    int rc = ext_state_set_nodes(&d->state, specs, 2, &err);
    d->state.nodes_synced = d->state.pods_synced = true;
    pthread_mutex_unlock(&d->state.mu);
    if (rc != 0 || ext_http_start(d, &err) != 0 || d->port <= 0) {
        fprintf(stderr, "fuzz_http: cannot start the server: %s\n", err.msg);
        abort();
    }
    return d;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits for fd to be ready for `events` until `deadline`; false when it passed. */
static bool wait_for(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0)
            return false;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc > 0)
            return true;
        if (rc < 0 && errno != EINTR)
            return false;
    }
}

/*
 * A non-blocking socket connected to the server, or -1 (then the caller
 * aborts). Connected without blocking: libFuzzer's timer signal interrupts
 * a blocking connect().
 */
static int connect_server(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int error = errno;
        socklen_t len = sizeof(error);
        if ((error != EINPROGRESS && error != EINTR) ||
            !wait_for(fd, POLLOUT, now_s() + ANSWER_WAIT_S) ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
            close(fd);
            errno = error;
            return -1;
        }
    }
    return fd;
}

/*
 * Writes bytes until done, the server stops reading (it may answer and close
 * before the body: an early 413), or the deadline. Returns false once the
 * connection refuses more.
 */
static bool write_all(int fd, const uint8_t *p, size_t n, double deadline)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_for(fd, POLLOUT, deadline))
                return false;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else {
            return false;
        }
    }
    return true;
}

/*
 * Reads until the server closes, the deadline, or `quiet` seconds without a
 * first byte; keeps the first `cap` bytes. *ended: the server closed.
 */
static size_t read_answer(int fd, uint8_t *buf, size_t cap, double deadline, double quiet,
                          bool *ended)
{
    size_t kept = 0;
    bool any = false;
    double give_up = now_s() + quiet;
    uint8_t scratch[4096];
    *ended = false;
    for (;;) {
        uint8_t *into = kept < cap ? buf + kept : scratch;
        size_t room = kept < cap ? cap - kept : sizeof(scratch);
        ssize_t r = recv(fd, into, room, 0);
        if (r > 0) {
            any = true;
            if (kept < cap)
                kept += (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_for(fd, POLLIN, any || give_up > deadline ? deadline : give_up))
                return kept;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else {
            *ended = true; /* closed, or reset: the server dropped the rest of the input */
            return kept;
        }
    }
}

/* Closes with a reset: the server sees the client gone at once, and no TIME_WAIT stays. */
static void abort_connection(int fd)
{
    struct linger now = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    close(fd);
}

static bool starts_with(const uint8_t *p, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    return n >= k && memcmp(p, prefix, k) == 0;
}

/* The status of a status line "HTTP/1.1 NNN ", or -1. */
static int status_of(const uint8_t *p, size_t n)
{
    if (!starts_with(p, n, "HTTP/1.1 ") || n < 13 || p[12] != ' ')
        return -1;
    int s = 0;
    for (int i = 9; i < 12; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        s = s * 10 + (p[i] - '0');
    }
    return s >= 100 && s <= 599 ? s : -1;
}

/* The value of Content-Length in the header block [p, end), or -1. */
static long content_length(const uint8_t *p, const uint8_t *end)
{
    static const char name[] = "\r\nContent-Length:";
    size_t k = sizeof(name) - 1;
    for (; p + k <= end; p++) {
        if (strncasecmp((const char *)p, name, k) != 0)
            continue;
        long v = 0;
        const uint8_t *q = p + k;
        while (q < end && *q == ' ')
            q++;
        while (q < end && *q >= '0' && *q <= '9' && v < (1L << 40))
            v = v * 10 + (*q++ - '0');
        return v;
    }
    return -1;
}

/* Whether the header block [p, end) says Transfer-Encoding: chunked. */
static bool is_chunked(const uint8_t *p, const uint8_t *end)
{
    static const char name[] = "\r\nTransfer-Encoding: chunked";
    size_t k = sizeof(name) - 1;
    for (; p + k <= end; p++)
        if (strncasecmp((const char *)p, name, k) == 0)
            return true;
    return false;
}

/*
 * Where a chunked body starting at buf[at] ends (after its last, empty chunk
 * and the CRLF that ends it; the extender sends no trailers), or n when buf
 * ends first. Fails on a malformed chunk.
 */
static size_t chunked_end(const uint8_t *buf, size_t at, size_t n)
{
    for (;;) {
        size_t size = 0, digits = 0;
        while (at < n && isxdigit(buf[at]) && digits < 12) {
            int c = buf[at++];
            size = size * 16 + (size_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            digits++;
        }
        if (at + 2 > n)
            return n;
        if (digits == 0 || buf[at] != '\r' || buf[at + 1] != '\n')
            fail("a malformed chunk in a chunked answer", buf + at, n - at);
        at += 2;
        if (size == 0)
            break;
        if (at + size + 2 > n)
            return n;
        if (buf[at + size] != '\r' || buf[at + size + 1] != '\n')
            fail("a chunk without its CRLF", buf + at + size, n - at - size);
        at += size + 2;
    }
    if (at + 2 > n)
        return n;
    if (buf[at] != '\r' || buf[at + 1] != '\n')
        fail("a chunked answer that does not end with an empty line", buf + at, n - at);
    return at + 2;
}

/*
 * Every answer in buf (pipelined requests get several, an Expect a 100
 * first) starts with "HTTP/1.1 NNN" and is not a 500. An answer to HEAD has
 * a Content-Length but no body: the next answer may start either after the
 * body or right after the headers. Returns the first status, or 0 for none.
 */
static int check_answers(const uint8_t *buf, size_t n, bool truncated)
{
    int first = 0;
    size_t pos = 0;
    while (pos < n) {
        int status = status_of(buf + pos, n - pos);
        if (status < 0)
            fail("an answer that does not start with \"HTTP/1.1 NNN \"", buf + pos, n - pos);
        if (status == 500)
            fail("a 500 for a request", buf + pos, n - pos);
        if (first == 0)
            first = status;
        const uint8_t *head_end = memmem(buf + pos, n - pos, "\r\n\r\n", 4);
        if (head_end == NULL)
            return first; /* cut short: by our cap, or by a deadline mid-answer */
        size_t body = (size_t)(head_end + 4 - buf);
        long len = content_length(buf + pos, head_end + 2);
        bool chunked = is_chunked(buf + pos, head_end + 2); /* /metrics, made as it is sent */
        bool bodiless =
            status < 200 || status == 204 || status == 304 || (len <= 0 && !chunked);
        /* A chunked answer to HEAD has no body: the next answer follows its headers. */
        if (chunked && starts_with(buf + body, n - body, "HTTP/"))
            bodiless = true;
        size_t after = bodiless  ? body
                       : chunked ? chunked_end(buf, body, n)
                                 : body + (size_t)len;
        if (after >= n)
            return first;
        if (starts_with(buf + after, n - after, "HTTP/"))
            pos = after;
        else if (starts_with(buf + body, n - body, "HTTP/"))
            pos = body;
        else if (truncated)
            return first;
        else
            fail("bytes after an answer that are not an answer", buf + after, n - after);
    }
    return first;
}

/* Sends the input in pieces chosen by its bytes; returns the first status, or 0. */
static int exchange(int port, const uint8_t *data, size_t size)
{
    static uint8_t answer[ANSWER_KEEP];
    int fd = connect_server(port);
    if (fd < 0) {
        perror("fuzz_http: connect");
        abort();
    }
    /* FNV-1a of the input picks the pieces: a mutation moves the cuts too. */
    uint32_t hash = 2166136261u;
    for (size_t i = 0; i < size; i++)
        hash = (hash ^ data[i]) * 16777619u;
    size_t cut[2] = {size, size};
    int pieces = size > 1 ? 1 + (int)(hash % 3) : 1;
    if (pieces >= 2)
        cut[0] = (hash >> 8) % size;
    if (pieces == 3)
        cut[1] = cut[0] + (hash >> 20) % (size - cut[0]);
    double deadline = now_s() + ANSWER_WAIT_S;
    size_t at = 0;
    bool open = true;
    for (int i = 0; i < 2 && open; i++) {
        open = write_all(fd, data + at, cut[i] - at, deadline);
        at = cut[i];
        if (open && at < size) {
            struct timespec gap = {0, PIECE_PAUSE_NS};
            nanosleep(&gap, NULL);
        }
    }
    if (open)
        write_all(fd, data + at, size - at, deadline);
    /*
     * libmicrohttpd (0.9.75, epoll) misses an end of stream that arrives with
     * the last bytes of an unfinished request and then waits for the deadline:
     * a pause lets it read the bytes first, so most such inputs end at once.
     */
    struct timespec pause = {0, PIECE_PAUSE_NS};
    nanosleep(&pause, NULL);
    shutdown(fd, SHUT_WR);
    bool ended;
    size_t n = read_answer(fd, answer, sizeof(answer), deadline, QUIET_S, &ended);
    if (ended)
        close(fd);
    else
        abort_connection(fd);
    return check_answers(answer, n, n == sizeof(answer));
}

/* The server still serves: GET /healthz on a fresh connection is a 200. */
static void check_healthz(int port)
{
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n";
    uint8_t answer[1024];
    int fd = connect_server(port);
    if (fd < 0) {
        perror("fuzz_http: connect for /healthz");
        abort();
    }
    double deadline = now_s() + ANSWER_WAIT_S;
    write_all(fd, (const uint8_t *)req, sizeof(req) - 1, deadline);
    bool ended;
    size_t n = read_answer(fd, answer, sizeof(answer), deadline, ANSWER_WAIT_S, &ended);
    close(fd);
    if (status_of(answer, n) != 200)
        fail("GET /healthz after the input is not a 200", answer, n);
}

/* Drops every pod the binds reserved, so that GPUs stay free for later inputs. */
static void release_all(ext_state *st)
{
    pthread_mutex_lock(&st->mu);
    size_t count = st->pods.len, got = 0, i = 0;
    char **uids = calloc(count + 1, sizeof(*uids));
    const char *key;
    void *value;
    while (uids != NULL && got < count && kgpu_strmap_next(&st->pods, &i, &key, &value))
        if ((uids[got] = strdup(key)) != NULL)
            got++;
    for (size_t k = 0; k < got; k++) {
        ext_state_release(st, uids[k]);
        free(uids[k]);
    }
    free(uids);
    pthread_mutex_unlock(&st->mu);
}

/* Nothing the requests did may overbook a GPU. */
static void check_capacity(ext_state *st)
{
    pthread_mutex_lock(&st->mu);
    const kgpu_cluster *c = st->cluster;
    for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        for (int g = 0; g < n->ngpus; g++)
            if (n->gpus[g].free_milli < 0 || n->gpus[g].free_memory_mib < 0)
                abort();
    }
    pthread_mutex_unlock(&st->mu);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned long calls;
    ext_daemon *d = server();
    if (++calls % RESET_EVERY == 0)
        release_all(&d->state);
    double t0 = now_s();
    int status = exchange(d->port, data, size);
    if (tracing)
        fprintf(stderr, "fuzz_http: %zu bytes -> %d in %.3f s\n", size, status, now_s() - t0);
    check_healthz(d->port);
    check_capacity(&d->state);
    return 0;
}
