/*
 * Starting and stopping the serving layer's listeners: addresses, TLS
 * files read once, the descriptor limit raised to what the connection
 * limit needs, libmicrohttpd's daemons and the server's threads; and
 * stopping them after answering what is queued (http.c has the why).
 */
#include <errno.h>
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


static char *read_pem(const char *path, kgpu_error *err)
{
    char *buf;
    size_t n;
    if (kgpu_read_file_max(path, 1 << 20, &buf, &n, err) != 0)
        return NULL;
    return buf;
}

/* "ADDR:PORT", "[V6]:PORT" or ":PORT" -> a socket address. */
static int parse_listen(const char *what, const char *text, struct sockaddr_storage *ss,
                        kgpu_error *err)
{
    char host[256], port[16];
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) >= sizeof(port))
        return kgpu_error_set(err, KGPU_EINVAL, "%s '%s': expected ADDR:PORT", what, text);
    size_t hl = (size_t)(colon - text);
    if (hl >= sizeof(host))
        return kgpu_error_set(err, KGPU_EINVAL, "%s '%s': address too long", what, text);
    memcpy(host, text, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    snprintf(port, sizeof(port), "%s", colon + 1);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (rc != 0 || ai == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "%s '%s': %s", what, text, gai_strerror(rc));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return 0;
}

/*
 * maxConnections is a real limit only if the process may open that many
 * descriptors: raise the soft RLIMIT_NOFILE to what the limits need, or
 * refuse to start.
 */
static int raise_nofile(const ext_config *cfg, kgpu_error *err)
{
    rlim_t need = (rlim_t)cfg->max_connections + PROBE_CONNECTIONS + FD_SLACK;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return kgpu_error_set(err, KGPU_EIO, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need)
        return 0;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "maxConnections %d needs %llu open files, but the hard limit "
                              "(RLIMIT_NOFILE) is %llu: lower maxConnections or raise the limit",
                              cfg->max_connections, (unsigned long long)need,
                              (unsigned long long)rl.rlim_max);
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return kgpu_error_set(err, KGPU_EIO, "setrlimit(RLIMIT_NOFILE, %llu): %s",
                              (unsigned long long)need, strerror(errno));
    return 0;
}

/* libmicrohttpd's format strings; the attribute tells clang's -Wformat-nonliteral so. */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    ext_log(EXT_DEBUG, "%s: %s", (const char *)cls, msg);
}

static int start_probe(ext_http *h, kgpu_error *err)
{
    ext_http *d = h;
    struct sockaddr_storage ss;
    int rc = parse_listen("--probe-listen", d->cfg->probe_listen, &ss, err);
    if (rc != 0)
        return rc;
    unsigned int flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->probe = MHD_start_daemon(
        flags, 0, NULL, NULL, ext__http_on_probe, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        (void *)"probe listener", MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)PROBE_CONNECTIONS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)PROBE_PER_CLIENT,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)PROBE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)PROBE_CONN_MEMORY, MHD_OPTION_END);
    if (h->probe == NULL)
        return kgpu_error_set(err, KGPU_EIO, "cannot serve probes on %s (address in use?)",
                              d->cfg->probe_listen);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->probe, MHD_DAEMON_INFO_BIND_PORT);
    d->probe_port = info ? info->port : 0;
    return 0;
}

int ext_http_serve(const ext_config *cfg, ext_metrics *metrics, ext_http_handler handle,
                   void *ctx, ext_http **out, kgpu_error *err)
{
    ext_http *h = calloc(1, sizeof(*h));
    *out = h;
    if (h == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    h->cfg = cfg;
    h->metrics = metrics;
    h->handle = handle;
    h->ctx = ctx;
    ext_http *d = h;
    h->pooled = d->cfg->serve_threads > 0;
    h->registry.next = h->registry.prev = &h->registry;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->small.cv, NULL);
    pthread_cond_init(&h->large.cv, NULL);
    pthread_cond_init(&h->watch_cv, NULL);
    atomic_init(&h->buffered, 0);
    int rc = raise_nofile(d->cfg, err);
    if (rc != 0)
        return rc;
    struct sockaddr_storage ss;
    if ((rc = parse_listen("--listen", d->cfg->listen, &ss, err)) != 0)
        return rc;
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    flags |= h->pooled ? MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME
                       : MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    if (d->cfg->tls_cert[0]) {
        d->tls_cert_pem = read_pem(d->cfg->tls_cert, err);
        d->tls_key_pem = d->tls_cert_pem ? read_pem(d->cfg->tls_key, err) : NULL;
        if (d->tls_key_pem == NULL)
            return err ? err->code : KGPU_EIO;
        if (d->cfg->tls_client_ca[0] &&
            (d->tls_ca_pem = read_pem(d->cfg->tls_client_ca, err)) == NULL)
            return err ? err->code : KGPU_EIO;
        flags |= MHD_USE_TLS;
    }
    /* Options that only some configurations set; MHD stops at the first END. */
    struct MHD_OptionItem opts[8];
    int no = 0;
    if (d->tls_cert_pem) {
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, d->tls_cert_pem};
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, d->tls_key_pem};
    }
    if (d->tls_ca_pem)
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, d->tls_ca_pem};
    if (h->pooled)
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE,
                                             (intptr_t)d->cfg->serve_threads, NULL};
    opts[no] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    h->main = MHD_start_daemon(
        flags, 0, NULL, NULL, ext__http_on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        (void *)"listener", MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_NOTIFY_CONNECTION, ext__http_on_connection, h, MHD_OPTION_NOTIFY_COMPLETED,
        ext__http_on_completed, h, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)d->cfg->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)d->cfg->max_connections_per_client,
        /* Idle timeout; the deadline (watchdog) is the one bytes cannot extend. */
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)d->cfg->request_timeout_s,
        /* Bounds the request line and headers; bodies stream through in pieces. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY, MHD_OPTION_LISTEN_BACKLOG_SIZE,
        (unsigned int)1024, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (h->main == NULL)
        return kgpu_error_set(
            err, KGPU_EIO, "cannot serve on %s (address in use, or bad TLS files?)", d->cfg->listen);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->main, MHD_DAEMON_INFO_BIND_PORT);
    d->port = info ? info->port : 0;
    if (h->pooled) {
        h->workers = calloc((size_t)d->cfg->handler_threads + 1, sizeof(*h->workers));
        if (h->workers == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        for (int i = 0; i <= d->cfg->handler_threads; i++) {
            /* The last one serves the large-body queue alone. */
            worker *w = &h->workers[i];
            w->h = h;
            w->q = i < d->cfg->handler_threads ? &h->small : &h->large;
            if (pthread_create(&w->thread, NULL, ext__http_worker_main, w) != 0)
                return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the handler threads");
            h->nworkers++;
        }
    }
    if (pthread_create(&h->watchdog, NULL, ext__http_watchdog_main, h) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the connection watchdog");
    h->watchdog_running = true;
    if (d->cfg->probe_listen[0] && (rc = start_probe(h, err)) != 0)
        return rc;
    ext_log(EXT_INFO,
            "kgpu-extender %s serving %s on port %d (%s), probes on port %d, policy %s",
            KGPU_VERSION, d->tls_cert_pem ? "HTTPS" : "HTTP", d->port,
            h->pooled ? "epoll" : "a thread per connection", d->probe_port, d->cfg->policy);
    return 0;
}

int ext_http_port(const ext_http *h)
{
    return h != NULL ? h->port : 0;
}

int ext_http_probe_port(const ext_http *h)
{
    return h != NULL ? h->probe_port : 0;
}

void ext_http_close(ext_http *h)
{
    if (h == NULL)
        return;
    if (h->probe != NULL)
        MHD_stop_daemon(h->probe);
    /* Workers answer what is queued (resuming each connection), then leave. */
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    pthread_cond_broadcast(&h->small.cv);
    pthread_cond_broadcast(&h->large.cv);
    pthread_cond_broadcast(&h->watch_cv);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < h->nworkers; i++)
        pthread_join(h->workers[i].thread, NULL);
    if (h->watchdog_running)
        pthread_join(h->watchdog, NULL);
    if (h->main != NULL)
        MHD_stop_daemon(h->main);
    free(h->workers);
    pthread_cond_destroy(&h->small.cv);
    pthread_cond_destroy(&h->large.cv);
    pthread_cond_destroy(&h->watch_cv);
    pthread_mutex_destroy(&h->mu);
    free(h->tls_cert_pem);
    free(h->tls_key_pem);
    free(h->tls_ca_pem);
    free(h);
}
