/*
 * The Kubernetes API client: one libcurl easy handle per request at a time,
 * taken from a small pool of idle ones (their connections are reused), so any
 * number of threads may share a kgpu_k8s; the bearer token is re-read from its
 * file on every request (service account tokens rotate); response bodies are
 * collected into a buffer capped at KGPU__K8S_BODY_MAX.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "k8s_internal.h"

#define TOKEN_FILE_MAX (64 * 1024)

/* curl_global_init is not thread-safe before curl 7.84: run it exactly once. */
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *userptr)
{
    kgpu_k8s *k = userptr;
    pthread_mutex_lock(&k->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *userptr)
{
    kgpu_k8s *k = userptr;
    pthread_mutex_unlock(&k->share_locks[data]);
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *oom = true;
    return d;
}

kgpu_k8s *kgpu_k8s_new(const kgpu_k8s_config *cfg, kgpu_error *err)
{
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        kgpu_error_set(err, KGPU_EIO, "libcurl: %s", curl_easy_strerror(curl_init_rc));
        return NULL;
    }
    if (cfg == NULL ||
        (strncmp(cfg->server, "https://", 8) != 0 && strncmp(cfg->server, "http://", 7) != 0)) {
        kgpu_error_set(err, KGPU_EINVAL, "Kubernetes API server '%s' is not an http(s) URL",
                       cfg != NULL ? cfg->server : "");
        return NULL;
    }
    kgpu_k8s *k = calloc(1, sizeof(*k));
    if (k == NULL) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    k->cfg = *cfg;
    bool oom = false;
    k->cfg.ca_data = dup_or_null(cfg->ca_data, &oom);
    k->cfg.cert_data = dup_or_null(cfg->cert_data, &oom);
    k->cfg.key_data = dup_or_null(cfg->key_data, &oom);
    k->cfg.server[sizeof(k->cfg.server) - 1] = '\0';
    size_t n = strlen(k->cfg.server);
    while (n > 0 && k->cfg.server[n - 1] == '/')
        k->cfg.server[--n] = '\0';
    if (k->cfg.timeout_ms <= 0)
        k->cfg.timeout_ms = KGPU__K8S_TIMEOUT_MS;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&k->share_locks[i], NULL);
    pthread_mutex_init(&k->idle_mu, NULL);
    k->share = curl_share_init();
    if (oom || k->share == NULL) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        kgpu_k8s_free(k);
        return NULL;
    }
    curl_share_setopt(k->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(k->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(k->share, CURLSHOPT_USERDATA, k);
    curl_share_setopt(k->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(k->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    return k;
}

void kgpu_k8s_free(kgpu_k8s *k)
{
    if (k == NULL)
        return;
    for (int i = 0; i < k->nidle; i++)
        curl_easy_cleanup(k->idle[i]); /* before the share they use */
    pthread_mutex_destroy(&k->idle_mu);
    if (k->share != NULL)
        curl_share_cleanup(k->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&k->share_locks[i]);
    kgpu_k8s_config_clear(&k->cfg);
    explicit_bzero(k->cfg.token, sizeof(k->cfg.token));
    free(k);
}

/*
 * The Authorization header line (malloc'd; NULL when there is no token):
 * token_file read now, trailing whitespace stripped, else the static token.
 * Never puts the token into an error message.
 */
static int auth_header(const kgpu_k8s *k, char **out, kgpu_error *err)
{
    *out = NULL;
    char *buf = NULL;
    const char *tok = k->cfg.token;
    int rc = 0;
    if (k->cfg.token_file[0] != '\0') {
        int fd = open(k->cfg.token_file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return kgpu_error_set(err, KGPU_EIO, "bearer token %s: %s", k->cfg.token_file,
                                  strerror(errno));
        buf = malloc(TOKEN_FILE_MAX + 1);
        size_t len = 0;
        ssize_t r = 0;
        while (buf != NULL && len < TOKEN_FILE_MAX &&
               ((r = read(fd, buf + len, TOKEN_FILE_MAX - len)) > 0 || (r < 0 && errno == EINTR)))
            len += r > 0 ? (size_t)r : 0;
        int e = errno;
        close(fd);
        if (buf == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        if (r < 0)
            rc = kgpu_error_set(err, KGPU_EIO, "bearer token %s: %s", k->cfg.token_file,
                                strerror(e));
        else if (len == TOKEN_FILE_MAX)
            rc = kgpu_error_set(err, KGPU_ERANGE, "bearer token %s: larger than %d bytes",
                                k->cfg.token_file, TOKEN_FILE_MAX);
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                           buf[len - 1] == '\t'))
            len--;
        buf[len] = '\0';
        if (rc == 0 && (strlen(buf) != len || strpbrk(buf, "\r\n") != NULL))
            rc = kgpu_error_set(err, KGPU_EPARSE, "bearer token %s: holds a line break or NUL byte",
                                k->cfg.token_file);
        if (rc == 0 && len == 0)
            rc = kgpu_error_set(err, KGPU_EPARSE, "bearer token %s: empty", k->cfg.token_file);
        tok = buf;
    }
    if (rc == 0 && tok[0] != '\0' && asprintf(out, "Authorization: Bearer %s", tok) < 0) {
        *out = NULL;
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    if (buf != NULL) {
        explicit_bzero(buf, TOKEN_FILE_MAX + 1);
        free(buf);
    }
    return rc;
}

/* An idle handle (options at their defaults, connections and caches kept), or a new one. */
static CURL *handle_take(kgpu_k8s *k)
{
    pthread_mutex_lock(&k->idle_mu);
    CURL *h = k->nidle > 0 ? k->idle[--k->nidle] : NULL;
    pthread_mutex_unlock(&k->idle_mu);
    return h != NULL ? h : curl_easy_init();
}

/*
 * Keeps h for the next request, or frees it when enough are kept. Reset
 * first: its options point into the finished call (URL, headers, buffers).
 */
static void handle_give(kgpu_k8s *k, CURL *h)
{
    curl_easy_reset(h);
    pthread_mutex_lock(&k->idle_mu);
    if (k->nidle < KGPU__K8S_IDLE_HANDLES) {
        k->idle[k->nidle++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&k->idle_mu);
    if (h != NULL)
        curl_easy_cleanup(h);
}

void kgpu__k8s_call_close(kgpu__k8s_call *c)
{
    if (c->h != NULL)
        handle_give(c->k, c->h);
    /* The slist holds a copy of the Authorization line. */
    for (struct curl_slist *l = c->headers; l != NULL; l = l->next)
        explicit_bzero(l->data, strlen(l->data));
    curl_slist_free_all(c->headers);
    free(c->url);
    c->h = NULL;
    c->headers = NULL;
    c->url = NULL;
}

static int add_header(kgpu__k8s_call *c, const char *line)
{
    struct curl_slist *l = curl_slist_append(c->headers, line);
    if (l == NULL)
        return -1;
    c->headers = l;
    return 0;
}

int kgpu__k8s_call_open(kgpu_k8s *k, kgpu__k8s_call *c, const char *method, const char *path,
                        const char *content_type, const char *body, long timeout_ms,
                        kgpu_error *err)
{
    memset(c, 0, sizeof(*c));
    if (method == NULL || method[0] == '\0' || strlen(method) >= sizeof(c->method) ||
        strpbrk(method, " \r\n") != NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "bad HTTP method '%s'", method ? method : "");
    if (path == NULL || path[0] != '/' || strpbrk(path, " \r\n") != NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "bad API path '%s': must start with /",
                              path ? path : "");
    snprintf(c->method, sizeof(c->method), "%s", method);
    if (asprintf(&c->url, "%s%s", k->cfg.server, path) < 0) {
        c->url = NULL;
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    char *auth = NULL;
    int rc = auth_header(k, &auth, err);
    if (rc != 0) {
        kgpu__k8s_call_close(c);
        return rc;
    }
    char ct[128];
    snprintf(ct, sizeof(ct), "Content-Type: %s", content_type ? content_type : "application/json");
    bool oom = add_header(c, "Accept: application/json") != 0 ||
               add_header(c, "Expect:") != 0 || /* no 100-continue round trip */
               (body != NULL && add_header(c, ct) != 0) ||
               (auth != NULL && add_header(c, auth) != 0);
    if (auth != NULL) {
        explicit_bzero(auth, strlen(auth));
        free(auth);
    }
    c->k = k;
    c->h = handle_take(k);
    if (oom || c->h == NULL) {
        kgpu__k8s_call_close(c);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }

    CURLcode cc = CURLE_OK;
#define SET(opt, val)                                                                              \
    do {                                                                                           \
        if (cc == CURLE_OK)                                                                        \
            cc = curl_easy_setopt(c->h, opt, val);                                                 \
    } while (0)
    SET(CURLOPT_URL, c->url);
    SET(CURLOPT_HTTPHEADER, c->headers);
    SET(CURLOPT_ERRORBUFFER, c->errbuf);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_USERAGENT, "kgpu/" KGPU_VERSION);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_SHARE, k->share);
    SET(CURLOPT_TCP_KEEPALIVE, 1L); /* notice a dead peer under an idle watch */
    SET(CURLOPT_TCP_KEEPIDLE, 30L);
    SET(CURLOPT_TCP_KEEPINTVL, 10L);
    SET(CURLOPT_CONNECTTIMEOUT_MS,
        timeout_ms > 0 && timeout_ms < KGPU__K8S_TIMEOUT_MS ? timeout_ms : KGPU__K8S_TIMEOUT_MS);
    if (timeout_ms > 0)
        SET(CURLOPT_TIMEOUT_MS, timeout_ms);
    if (strcmp(method, "GET") == 0 && body == NULL) {
        SET(CURLOPT_HTTPGET, 1L);
    } else {
        if (strcmp(method, "POST") != 0)
            SET(CURLOPT_CUSTOMREQUEST, c->method);
        if (body != NULL || strcmp(method, "POST") == 0) {
            SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? strlen(body) : 0));
            SET(CURLOPT_POSTFIELDS, body ? body : "");
        }
    }
    const kgpu_k8s_config *cfg = &k->cfg;
    if (cfg->ca_data != NULL) {
        struct curl_blob b = {cfg->ca_data, strlen(cfg->ca_data), CURL_BLOB_NOCOPY};
        SET(CURLOPT_CAINFO_BLOB, &b);
    } else if (cfg->ca_file[0] != '\0') {
        SET(CURLOPT_CAINFO, cfg->ca_file);
    }
    if (cfg->cert_data != NULL) {
        struct curl_blob b = {cfg->cert_data, strlen(cfg->cert_data), CURL_BLOB_NOCOPY};
        SET(CURLOPT_SSLCERT_BLOB, &b);
        SET(CURLOPT_SSLCERTTYPE, "PEM");
    } else if (cfg->cert_file[0] != '\0') {
        SET(CURLOPT_SSLCERT, cfg->cert_file);
        SET(CURLOPT_SSLCERTTYPE, "PEM");
    }
    if (cfg->key_data != NULL) {
        struct curl_blob b = {cfg->key_data, strlen(cfg->key_data), CURL_BLOB_NOCOPY};
        SET(CURLOPT_SSLKEY_BLOB, &b);
        SET(CURLOPT_SSLKEYTYPE, "PEM");
    } else if (cfg->key_file[0] != '\0') {
        SET(CURLOPT_SSLKEY, cfg->key_file);
        SET(CURLOPT_SSLKEYTYPE, "PEM");
    }
    if (cfg->insecure) {
        SET(CURLOPT_SSL_VERIFYPEER, 0L);
        SET(CURLOPT_SSL_VERIFYHOST, 0L);
    }
#undef SET
    if (cc != CURLE_OK) {
        rc = kgpu_error_set(err, KGPU_EIO, "%s %s: libcurl: %s", c->method, c->url,
                            curl_easy_strerror(cc));
        kgpu__k8s_call_close(c);
        return rc;
    }
    return 0;
}

int kgpu__k8s_call_perform(kgpu__k8s_call *c, atomic_bool *stop, kgpu_error *err)
{
    CURLcode cc = CURLE_OK;
    c->errbuf[0] = '\0';
    if (stop == NULL) {
        cc = curl_easy_perform(c->h);
    } else {
        /* curl_easy_perform may sit a whole second between progress calls
         * under an idle watch; our own loop looks at *stop more often. */
        CURLM *m = curl_multi_init();
        if (m == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        CURLMcode mc = curl_multi_add_handle(m, c->h);
        bool stopped = false;
        int running = 1;
        while (mc == CURLM_OK) {
            mc = curl_multi_perform(m, &running);
            if (mc != CURLM_OK || running == 0)
                break;
            if (atomic_load(stop)) {
                stopped = true;
                break;
            }
            mc = curl_multi_poll(m, NULL, 0, KGPU__K8S_STOP_POLL_MS, NULL);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left)) != NULL)
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == c->h)
                cc = msg->data.result;
        curl_multi_remove_handle(m, c->h);
        curl_multi_cleanup(m);
        if (stopped)
            return kgpu_error_set(err, KGPU_EIO, "%s %s: stopped", c->method, c->url);
        if (mc != CURLM_OK)
            return kgpu_error_set(err, KGPU_EIO, "%s %s: %s", c->method, c->url,
                                  curl_multi_strerror(mc));
    }
    c->result = cc;
    if (cc != CURLE_OK)
        return kgpu_error_set(err, KGPU_EIO, "%s %s: %s", c->method, c->url,
                              c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc));
    return 0;
}

/* After a failed transfer: whether none of the request can have reached the server. */
static bool call_unsent(kgpu__k8s_call *c)
{
    long sent = 0;
    if (c->result == CURLE_COULDNT_RESOLVE_HOST || c->result == CURLE_COULDNT_RESOLVE_PROXY ||
        c->result == CURLE_COULDNT_CONNECT || c->result == CURLE_SSL_CONNECT_ERROR ||
        c->result == CURLE_PEER_FAILED_VERIFICATION)
        return true;
    /* Bytes of request headers sent: 0 when it failed before the request went out. */
    return curl_easy_getinfo(c->h, CURLINFO_REQUEST_SIZE, &sent) == CURLE_OK && sent == 0;
}

/* A response body growing up to KGPU__K8S_BODY_MAX. */
typedef struct body_sink {
    char *buf;
    size_t len, cap;
    bool too_big, oom;
} body_sink;

static size_t sink_write(char *p, size_t size, size_t nmemb, void *userdata)
{
    body_sink *s = userdata;
    size_t add = size * nmemb;
    if (add > KGPU__K8S_BODY_MAX - s->len) {
        s->too_big = true;
        return 0;
    }
    if (s->len + add + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + add + 1)
            cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (nb == NULL) {
            s->oom = true;
            return 0;
        }
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, add);
    s->len += add;
    return add;
}

int kgpu__k8s_request_ex(kgpu_k8s *k, const char *method, const char *path,
                         const char *content_type, const char *body, atomic_bool *stop,
                         kgpu_http_resp *resp, kgpu_error *err)
{
    kgpu_http_resp local;
    if (resp == NULL)
        resp = &local;
    memset(resp, 0, sizeof(*resp));
    resp->unsent = true;
    if (k == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "no Kubernetes client");
    kgpu__k8s_call c;
    int rc = kgpu__k8s_call_open(k, &c, method, path, content_type, body, k->cfg.timeout_ms, err);
    if (rc != 0)
        return rc;
    body_sink s = {0};
    curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &s);
    rc = kgpu__k8s_call_perform(&c, stop, err);
    resp->unsent = rc != 0 && call_unsent(&c);
    if (s.too_big)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s %s: response larger than %zu MiB", c.method,
                            c.url, KGPU__K8S_BODY_MAX >> 20);
    else if (s.oom)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "%s %s: out of memory for the response", c.method,
                            c.url);
    if (rc == 0 && s.buf == NULL && (s.buf = malloc(1)) == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    if (rc == 0) {
        curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &resp->status);
        s.buf[s.len] = '\0';
        resp->body = s.buf;
        resp->len = s.len;
    } else {
        free(s.buf);
    }
    kgpu__k8s_call_close(&c);
    if (resp == &local)
        free(local.body);
    return rc;
}

int kgpu_k8s_request(kgpu_k8s *k, const char *method, const char *path, const char *content_type,
                     const char *body, kgpu_http_resp *resp, kgpu_error *err)
{
    return kgpu__k8s_request_ex(k, method, path, content_type, body, NULL, resp, err);
}

json_t *kgpu_k8s_get_json(kgpu_k8s *k, const char *path, long *status, kgpu_error *err)
{
    kgpu_http_resp resp = {0};
    *status = 0;
    if (kgpu_k8s_request(k, "GET", path, NULL, NULL, &resp, err) != 0)
        return NULL;
    *status = resp.status;
    json_t *doc = resp.status == 200 && resp.body ? json_loads(resp.body, 0, NULL) : NULL;
    free(resp.body);
    return doc;
}

int kgpu__k8s_escape(const char *s, char *out, size_t outsz)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~';
        if (o + (plain ? 1 : 3) >= outsz)
            return -1;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    if (o >= outsz)
        return -1;
    out[o] = '\0';
    return 0;
}

void kgpu__k8s_status_message(const char *body, size_t len, char *out, size_t outsz)
{
    json_t *st = body != NULL ? json_loadb(body, len, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(st, "message"));
    if (msg != NULL)
        snprintf(out, outsz, "%s", msg);
    else
        snprintf(out, outsz, "%.*s", (int)(len < 200 ? len : 200), body ? body : "");
    json_decref(st);
}

void kgpu__k8s_status_reason(const char *body, size_t len, char *out, size_t outsz)
{
    json_t *st = body != NULL ? json_loadb(body, len, 0, NULL) : NULL;
    const char *reason = json_string_value(json_object_get(st, "reason"));
    snprintf(out, outsz, "%s", reason != NULL ? reason : "");
    json_decref(st);
}

/* /api/v1/namespaces/{ns}/pods/{name}{suffix}, segments escaped. */
static int pod_path(const char *ns, const char *name, const char *suffix, char *out, size_t outsz,
                    kgpu_error *err)
{
    char ens[3 * 256], ename[3 * 256];
    if (ns == NULL || ns[0] == '\0' || name == NULL || name[0] == '\0')
        return kgpu_error_set(err, KGPU_EINVAL, "pod namespace and name must be set");
    if (kgpu__k8s_escape(ns, ens, sizeof(ens)) != 0 ||
        kgpu__k8s_escape(name, ename, sizeof(ename)) != 0)
        return kgpu_error_set(err, KGPU_ERANGE, "pod name %s/%s too long", ns, name);
    snprintf(out, outsz, "/api/v1/namespaces/%s/pods/%s%s", ens, ename, suffix);
    return 0;
}

/* Serialises `doc` (stolen) and sends it. */
static int send_json(kgpu_k8s *k, const char *method, const char *path, const char *content_type,
                     json_t *doc, kgpu_http_resp *resp, kgpu_error *err)
{
    char *body = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (body == NULL) {
        if (resp != NULL) {
            memset(resp, 0, sizeof(*resp));
            resp->unsent = true;
        }
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s %s: cannot build the request (strings must be UTF-8)", method,
                              path);
    }
    int rc = kgpu_k8s_request(k, method, path, content_type, body, resp, err);
    free(body);
    return rc;
}

json_t *kgpu_k8s_get_pod(kgpu_k8s *k, const char *ns, const char *name, long *status,
                         kgpu_error *err)
{
    char path[2048];
    *status = 0;
    if (pod_path(ns, name, "", path, sizeof(path), err) != 0)
        return NULL;
    return kgpu_k8s_get_json(k, path, status, err);
}

int kgpu_k8s_bind(kgpu_k8s *k, const char *ns, const char *name, const char *uid, const char *node,
                  json_t *annotations, kgpu_http_resp *resp, kgpu_error *err)
{
    if (resp != NULL) {
        memset(resp, 0, sizeof(*resp));
        resp->unsent = true; /* until the request goes out */
    }
    char path[2048];
    int rc = pod_path(ns, name, "/binding", path, sizeof(path), err);
    if (rc != 0)
        return rc;
    if (node == NULL || node[0] == '\0')
        return kgpu_error_set(err, KGPU_EINVAL, "bind %s/%s: no node", ns, name);
    if (annotations != NULL && !json_is_object(annotations))
        return kgpu_error_set(err, KGPU_EINVAL, "bind %s/%s: annotations must be an object", ns,
                              name);
    json_t *meta = json_pack("{s:s, s:s}", "name", name, "namespace", ns);
    if (meta != NULL && uid != NULL && uid[0] != '\0')
        json_object_set_new(meta, "uid", json_string(uid));
    if (meta != NULL && annotations != NULL)
        json_object_set(meta, "annotations", annotations);
    json_t *b =
        json_pack("{s:s, s:s, s:o, s:{s:s, s:s, s:s}}", "apiVersion", "v1", "kind", "Binding",
                  "metadata", meta, "target", "apiVersion", "v1", "kind", "Node", "name", node);
    return send_json(k, "POST", path, "application/json", b, resp, err);
}

int kgpu_k8s_annotate_pod(kgpu_k8s *k, const char *ns, const char *name, json_t *annotations,
                          kgpu_http_resp *resp, kgpu_error *err)
{
    if (resp != NULL)
        memset(resp, 0, sizeof(*resp));
    char path[2048];
    int rc = pod_path(ns, name, "", path, sizeof(path), err);
    if (rc != 0)
        return rc;
    if (!json_is_object(annotations))
        return kgpu_error_set(err, KGPU_EINVAL, "annotate %s/%s: annotations must be an object", ns,
                              name);
    json_t *patch = json_pack("{s:{s:O}}", "metadata", "annotations", annotations);
    return send_json(k, "PATCH", path, "application/merge-patch+json", patch, resp, err);
}

int kgpu_k8s_post_pod_event(kgpu_k8s *k, const kgpu_k8s_pod_event *ev, kgpu_error *err)
{
    char path[2048];
    char ens[3 * 256];
    if (ev->ns == NULL || ev->ns[0] == '\0' || ev->pod == NULL || ev->pod[0] == '\0')
        return kgpu_error_set(err, KGPU_EINVAL, "event: pod namespace and name must be set");
    if (kgpu__k8s_escape(ev->ns, ens, sizeof(ens)) != 0)
        return kgpu_error_set(err, KGPU_ERANGE, "event: namespace %s too long", ev->ns);
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/events", ens);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char when[64], name[256];
    kgpu_rfc3339((double)ts.tv_sec + (double)ts.tv_nsec / 1e9, 0, when, sizeof(when));
    /* Unique like kubectl's: the object's name, a dot, a timestamp in hex (at most 253 in all). */
    snprintf(name, sizeof(name), "%.200s.%llx", ev->pod,
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec);
    const char *inst = ev->instance != NULL ? ev->instance : "";
    json_t *doc = json_pack(
        "{s:s,s:s,s:{s:s,s:s},s:{s:s,s:s,s:s,s:s,s:s,s:s},s:s,s:s,s:s,s:{s:s,s:s},s:s,s:s,s:i,"
        "s:s,s:s}",
        "apiVersion", "v1", "kind", "Event", "metadata", "name", name, "namespace", ev->ns,
        "involvedObject", "apiVersion", "v1", "kind", "Pod", "namespace", ev->ns, "name", ev->pod,
        "uid", ev->uid != NULL ? ev->uid : "", "fieldPath",
        ev->field_path != NULL ? ev->field_path : "", "reason", ev->reason, "message", ev->message,
        "type", ev->type, "source", "component", ev->component, "host", inst, "firstTimestamp",
        when, "lastTimestamp", when, "count", 1, "reportingComponent", ev->component,
        "reportingInstance", inst);
    kgpu_http_resp resp;
    int rc = send_json(k, "POST", path, "application/json", doc, &resp, err);
    if (rc == 0 && resp.status != 200 && resp.status != 201)
        rc = kgpu_error_set(err, KGPU_EIO, "event %s on pod %s/%s: API server answered %ld: %.200s",
                            ev->reason, ev->ns, ev->pod, resp.status,
                            resp.body != NULL ? resp.body : "");
    free(resp.body);
    return rc;
}
