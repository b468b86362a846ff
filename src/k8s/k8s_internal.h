/*
 * Internals shared by the API client's files (k8s.c, list.c, reflector.c):
 * the client object, one request's curl handle, and the readers of what the
 * server answers. Not part of the public API.
 */
#ifndef KGPU_K8S_INTERNAL_H
#define KGPU_K8S_INTERNAL_H

#include <curl/curl.h>
#include <pthread.h>

#include "k8s.h"

#define KGPU__K8S_BODY_MAX      ((size_t)64 << 20) /* cap on one plain response body */
#define KGPU__K8S_STOP_POLL_MS  100    /* how often a stoppable transfer looks at *stop */
#define KGPU__K8S_TIMEOUT_MS    10000L /* default per plain request */
#define KGPU__K8S_DEFAULT_SADIR "/var/run/secrets/kubernetes.io/serviceaccount"

#define KGPU__K8S_IDLE_HANDLES 8 /* easy handles (and connections) kept between requests */

struct kgpu_k8s {
    kgpu_k8s_config cfg; /* deep copy, immutable after kgpu_k8s_new */
    /* DNS and TLS sessions shared by every handle, so a request resumes the
     * previous TLS session instead of a full handshake. Connections are not
     * shared: libcurl does not support that across concurrent threads. */
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    /*
     * Easy handles of finished requests, kept for the next request of any
     * thread (one thread uses a handle at a time: taken under idle_mu). A
     * handle keeps its open connection and its parsed CA store, so a run of
     * requests (the binds) reuses one connection instead of a TCP connect,
     * a TLS resumption and a CA parse each.
     */
    pthread_mutex_t idle_mu;
    CURL *idle[KGPU__K8S_IDLE_HANDLES];
    int nidle;
};

/* One request in flight: its easy handle and what the handle points into. */
typedef struct kgpu__k8s_call {
    kgpu_k8s *k; /* where the handle goes back to */
    CURL *h;
    struct curl_slist *headers;
    char method[16];
    char *url; /* server + path; for error messages */
    char errbuf[CURL_ERROR_SIZE];
    CURLcode result; /* of the transfer, once performed */
} kgpu__k8s_call;

/*
 * Prepares `c` for METHOD server+path: headers (Accept, Authorization from the
 * token file read now, Content-Type when `body` is set), TLS and the timeout
 * (0 = none, for watches). `body` is borrowed until kgpu__k8s_call_close.
 * The caller sets CURLOPT_WRITEFUNCTION/WRITEDATA. On error `c` needs no close.
 */
int kgpu__k8s_call_open(kgpu_k8s *k, kgpu__k8s_call *c, const char *method, const char *path,
                        const char *content_type, const char *body, long timeout_ms,
                        kgpu_error *err);

/*
 * Runs the transfer. With `stop` it drives a multi handle and gives up within
 * KGPU__K8S_STOP_POLL_MS of *stop becoming true. 0 when a response completed;
 * KGPU_EIO "METHOD URL: reason" otherwise (including an abort by the write
 * callback, which the caller then explains better).
 */
int kgpu__k8s_call_perform(kgpu__k8s_call *c, atomic_bool *stop, kgpu_error *err);

void kgpu__k8s_call_close(kgpu__k8s_call *c);

/* kgpu_k8s_request that gives up early when *stop (may be NULL) becomes true. */
int kgpu__k8s_request_ex(kgpu_k8s *k, const char *method, const char *path,
                         const char *content_type, const char *body, atomic_bool *stop,
                         kgpu_http_resp *resp, kgpu_error *err);

/* Percent-encodes `s` for a URL path segment or query value into `out`; -1 if it does not fit. */
int kgpu__k8s_escape(const char *s, char *out, size_t outsz);

/* The message of a Kubernetes Status body, or a prefix of the body; writes into `out`. */
void kgpu__k8s_status_message(const char *body, size_t len, char *out, size_t outsz);

/* The `reason` of a Kubernetes Status body ("Expired", "NotFound"), or "" when it has none. */
void kgpu__k8s_status_reason(const char *body, size_t len, char *out, size_t outsz);

#define KGPU__K8S_CONTINUE_MAX 8192 /* the longest continue token taken from a server */

/*
 * One page of a list as the API server sent it (a v1 List: metadata and
 * items). Everything but `doc` is borrowed from `doc`, which the caller
 * decrefs once done with the page.
 */
typedef struct kgpu__k8s_page {
    json_t *doc;
    json_t *items;       /* an array, or NULL when the server sent none or null */
    const char *rv;      /* metadata.resourceVersion: non-empty, < KGPU_K8S_RV_MAX bytes */
    const char *cont;    /* metadata.continue; NULL when absent or "" (the last page) */
    long long remaining; /* metadata.remainingItemCount; -1 when absent */
} kgpu__k8s_page;

/*
 * Reads one page from a 200 answer's body (outside input: checked
 * throughout). KGPU_EPARSE with what is wrong ("metadata.continue is not a
 * string"), and out->doc NULL, when it is not such a page.
 */
int kgpu__k8s_page_parse(const char *body, size_t len, kgpu__k8s_page *out, kgpu_error *err);

#endif
