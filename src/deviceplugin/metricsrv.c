/*
 * /metrics for Prometheus: the watcher's published text over plain HTTP,
 * served by libmicrohttpd's own polling thread. A request copies the text
 * under the watcher's publication mutex (watcher.h) and never waits for a
 * scan. Small fixed limits: this port answers a scraper, not the world.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "watcher.h"

#define CONNECTIONS   16
#define PER_CLIENT    8
#define TIMEOUT_S     10
#define CONN_MEMORY   (32 * 1024)
#define CONTENT_TYPE  "text/plain; version=0.0.4; charset=utf-8"

struct dp_metrics_server {
    struct MHD_Daemon *d;
    dp_watcher *w;
    int port;
};

/* "ADDR:PORT" or "[V6ADDR]:PORT" into *ss. */
static int parse_listen(const char *text, struct sockaddr_storage *ss, kgpu_error *err)
{
    memset(ss, 0, sizeof(*ss));
    char host[DP_WATCH_LISTEN_MAX];
    const char *colon = strrchr(text, ':');
    if (colon == NULL || (size_t)(colon - text) >= sizeof(host))
        return kgpu_error_set(err, KGPU_EINVAL, "metricsListen '%s': expected ADDR:PORT", text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || port < 0 || port > 65535)
        return kgpu_error_set(err, KGPU_EINVAL, "metricsListen '%s': bad port", text);
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
        host[hl - 1] = '\0';
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((unsigned short)port);
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) != 1)
            return kgpu_error_set(err, KGPU_EINVAL, "metricsListen '%s': bad IPv6 address", text);
        return 0;
    }
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    a4->sin_family = AF_INET;
    a4->sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &a4->sin_addr) != 1)
        return kgpu_error_set(err, KGPU_EINVAL, "metricsListen '%s': bad IPv4 address", text);
    return 0;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *body, size_t len,
                             enum MHD_ResponseMemoryMode mode, const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (r == NULL) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **con_cls)
{
    dp_metrics_server *s = cls;
    (void)version;
    (void)upload;
    if (*con_cls == NULL) {
        *con_cls = s; /* the headers came; answer at the next call */
        return MHD_YES;
    }
    if (*upload_len != 0) {
        *upload_len = 0; /* a body to a GET: ignored */
        return MHD_YES;
    }
    static char not_found[] = "not found: try /metrics\n";
    static char bad_method[] = "only GET\n";
    static char ok[] = "ok\n";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, bad_method, sizeof(bad_method) - 1,
                     MHD_RESPMEM_PERSISTENT, "text/plain");
    if (strcmp(url, "/healthz") == 0)
        return reply(c, MHD_HTTP_OK, ok, sizeof(ok) - 1, MHD_RESPMEM_PERSISTENT, "text/plain");
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1,
                     MHD_RESPMEM_PERSISTENT, "text/plain");
    size_t len = 0;
    char *text = dp_watcher_metrics(s->w, &len);
    if (text == NULL)
        return MHD_NO;
    return reply(c, MHD_HTTP_OK, text, len, MHD_RESPMEM_MUST_FREE, CONTENT_TYPE);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    kgpu_log(KGPU_LOG_DEBUG, "metrics listener: %s", msg);
}

dp_metrics_server *dp_metrics_server_start(const char *listen, dp_watcher *w, kgpu_error *err)
{
    struct sockaddr_storage ss;
    if (parse_listen(listen, &ss, err) != 0)
        return NULL;
    dp_metrics_server *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    s->w = w;
    unsigned int flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)PER_CLIENT,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)TIMEOUT_S,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
                            MHD_OPTION_END);
    if (s->d == NULL) {
        free(s);
        kgpu_error_set(err, KGPU_EIO, "cannot serve /metrics on %s (address in use?)", listen);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info != NULL ? info->port : 0;
    return s;
}

int dp_metrics_server_port(const dp_metrics_server *s)
{
    return s->port;
}

void dp_metrics_server_stop(dp_metrics_server *s)
{
    if (s == NULL)
        return;
    MHD_stop_daemon(s->d);
    free(s);
}
