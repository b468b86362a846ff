/* The text server (textserve.h). */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "textserve.h"

struct kgpu_textserver {
    struct MHD_Daemon *d;
    kgpu_text_fn fn;
    void *ctx;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **con_cls)
{
    (void)version;
    (void)upload;
    (void)con_cls;
    kgpu_textserver *s = cls;
    if (*upload_len != 0)
        return MHD_NO; /* no body is read: the connection closes */
    unsigned status = 200;
    char *text;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        status = 405;
        text = strdup("method not allowed\n");
    } else if (strcmp(url, "/healthz") == 0) {
        text = strdup("ok\n");
    } else if ((text = s->fn(s->ctx, url)) == NULL) {
        status = 404;
        text = strdup("not found\n");
    }
    if (text == NULL)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

kgpu_textserver *kgpu_textserver_start(const char *listen, kgpu_text_fn fn, void *ctx,
                                       kgpu_error *err)
{
    const char *colon = strrchr(listen, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    char host[64];
    snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - listen) : 0, listen);
    if (colon == NULL || port < 0 || port > 65535 || *end != '\0' ||
        (host[0] && inet_pton(AF_INET, host, &sa.sin_addr) != 1)) {
        kgpu_error_set(err, KGPU_EINVAL, "'%.100s': an IPv4 address and a port", listen);
        return NULL;
    }
    kgpu_textserver *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    s->fn = fn;
    s->ctx = ctx;
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
                            NULL, NULL, answer, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_END);
    if (s->d == NULL) {
        kgpu_error_set(err, KGPU_EIO, "cannot serve on %.100s", listen);
        free(s);
        return NULL;
    }
    return s;
}

void kgpu_textserver_stop(kgpu_textserver *s)
{
    if (s == NULL)
        return;
    MHD_stop_daemon(s->d);
    free(s);
}
