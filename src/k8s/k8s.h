/*
 * A small Kubernetes API client over libcurl: configuration (in-cluster
 * service account or a kubeconfig), JSON requests, paged lists, and
 * list-then-watch ("reflector") with relist on 410 Gone or a broken stream,
 * with backoff.
 *
 * Threads: a kgpu_k8s is immutable after kgpu_k8s_new and may be used from
 * any number of threads at once; each call uses its own curl handle. The
 * bearer token is re-read from its file on every request (it rotates).
 */
#ifndef KGPU_K8S_H
#define KGPU_K8S_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "kgpu/error.h"

#define KGPU_K8S_PATH_MAX 1024

typedef struct kgpu_k8s_config {
    char server[512];                   /* https://host:port, no trailing slash */
    char token[4096];                   /* static bearer token, or "" */
    char token_file[KGPU_K8S_PATH_MAX]; /* re-read each request when set */
    char ca_file[KGPU_K8S_PATH_MAX];    /* PEM file, or "" */
    char *ca_data;                      /* PEM text (decoded kubeconfig data), malloc'd or NULL */
    char *cert_data, *key_data;         /* client certificate and key PEM, malloc'd or NULL */
    char cert_file[KGPU_K8S_PATH_MAX], key_file[KGPU_K8S_PATH_MAX];
    bool insecure;   /* skip TLS verification (kubeconfig insecure-skip-tls-verify) */
    long timeout_ms; /* per plain request; watches have none; default 10000 */
} kgpu_k8s_config;

/* Frees the malloc'd members of cfg. */
void kgpu_k8s_config_clear(kgpu_k8s_config *cfg);

/*
 * In-cluster configuration: KUBERNETES_SERVICE_HOST/PORT and the service
 * account's token and ca.crt in `sa_dir` (NULL = the standard
 * /var/run/secrets/kubernetes.io/serviceaccount). KGPU_ENOENT when not in a cluster.
 */
int kgpu_k8s_config_in_cluster(const char *sa_dir, kgpu_k8s_config *cfg, kgpu_error *err);

/*
 * A kubeconfig file (YAML, read with libyaml): its current context's cluster
 * (server, certificate-authority or -data, insecure-skip-tls-verify) and user
 * (token, tokenFile, client-certificate/-key or their -data). Errors name the
 * file and the missing or malformed key.
 */
int kgpu_k8s_config_kubeconfig(const char *path, kgpu_k8s_config *cfg, kgpu_error *err);

typedef struct kgpu_k8s kgpu_k8s;

/* Copies cfg. NULL on error. */
kgpu_k8s *kgpu_k8s_new(const kgpu_k8s_config *cfg, kgpu_error *err);
void kgpu_k8s_free(kgpu_k8s *k);

typedef struct kgpu_http_resp {
    long status;
    char *body; /* NUL-terminated, malloc'd; caller frees */
    size_t len;
    /*
     * After a transport failure: true when no byte of the request can have
     * reached the server (no connection, or none of it sent), so that the
     * request was certainly not applied. False after a failure past that
     * point (a timeout, a broken connection): the server may have applied it.
     */
    bool unsent;
} kgpu_http_resp;

/*
 * One request; `body` may be NULL. Returns 0 when a response arrived (any
 * status: check resp->status), or a negative error for transport failures
 * (connection refused, TLS, timeout), with a message naming the URL.
 * content_type: "application/json" or "application/merge-patch+json".
 */
int kgpu_k8s_request(kgpu_k8s *k, const char *method, const char *path, const char *content_type,
                     const char *body, kgpu_http_resp *resp, kgpu_error *err);

/*
 * GET path and parse the answer. *status is the HTTP status (0 when none
 * arrived); the result is a new reference when the status is 200 and the
 * body is JSON, else NULL. For one object; a collection is read with
 * kgpu_k8s_list, which pages.
 */
json_t *kgpu_k8s_get_json(kgpu_k8s *k, const char *path, long *status, kgpu_error *err);

#define KGPU_K8S_LIST_PAGE     500 /* items asked for per page, as client-go's pager */
#define KGPU_K8S_LIST_RESTARTS 3   /* fresh starts of one list after its token expired */
#define KGPU_K8S_RV_MAX        128 /* room for a resourceVersion and its NUL */

/* How a list is read; a NULL kgpu_k8s_list_opts means all defaults. */
typedef struct kgpu_k8s_list_opts {
    long limit;        /* items per page; 0 = KGPU_K8S_LIST_PAGE */
    int restarts;      /* fresh starts after 410 Expired; 0 = KGPU_K8S_LIST_RESTARTS, <0 = none */
    atomic_bool *stop; /* give up within 100 ms of *stop becoming true; NULL = never */
    /*
     * Optional, called on the caller's thread once per item as its page
     * arrives, before the item is kept: it may delete members the caller
     * never reads (managedFields, status details), so the peak of a big
     * list is what is kept plus one page. It must not keep `item` itself.
     */
    void (*trim)(void *ctx, json_t *item);
    void *trim_ctx;
} kgpu_k8s_list_opts;

/* What a list took; for logs and tests. */
typedef struct kgpu_k8s_list_stats {
    unsigned pages;    /* pages answered 200, over every start */
    unsigned restarts; /* fresh starts after 410 Expired */
} kgpu_k8s_list_stats;

/*
 * Lists `collection` (e.g. "/api/v1/pods"; `query` such as
 * "fieldSelector=spec.nodeName%3Dn1", already escaped, may be NULL) page by
 * page: `limit=N`, then `limit=N&continue=TOKEN` with the same query and no
 * resourceVersion, until a page comes without a continue token. A server that
 * ignores limit answers everything in one page (up to 64 MiB); that is fine.
 * All pages come from one snapshot of the server; if it expires during the
 * list (410, etcd compacted it) the list starts again from the first page,
 * at most opts->restarts times, then fails with KGPU_EIO naming the
 * collection, the pages read and the server's reason. A page whose
 * resourceVersion differs from the first's, or a token repeated, fails.
 *
 * On success *items is a new array of every item (trimmed when opts->trim is
 * set; the caller decrefs) and `rv` (rvsz bytes, KGPU_K8S_RV_MAX is enough)
 * holds the snapshot's resourceVersion, from which a watch continues. On
 * error *items is NULL. `stats` may be NULL. Thread-safe like every call.
 */
int kgpu_k8s_list(kgpu_k8s *k, const char *collection, const char *query,
                  const kgpu_k8s_list_opts *opts, json_t **items, char *rv, size_t rvsz,
                  kgpu_k8s_list_stats *stats, kgpu_error *err);

/*
 * GET of one pod (path segments escaped), as kgpu_k8s_get_json: the pod's JSON
 * when *status is 200, else NULL with *status the HTTP status (0: none came).
 */
json_t *kgpu_k8s_get_pod(kgpu_k8s *k, const char *ns, const char *name, long *status,
                         kgpu_error *err);

/* POST .../pods/{name}/binding with annotations (an object of strings, borrowed). */
int kgpu_k8s_bind(kgpu_k8s *k, const char *ns, const char *name, const char *uid, const char *node,
                  json_t *annotations, kgpu_http_resp *resp, kgpu_error *err);

/* PATCH a pod's annotations (merge patch). */
int kgpu_k8s_annotate_pod(kgpu_k8s *k, const char *ns, const char *name, json_t *annotations,
                          kgpu_http_resp *resp, kgpu_error *err);

/* A core/v1 Event about a pod, as kgpu's components report what they did to or for it. */
typedef struct kgpu_k8s_pod_event {
    const char *ns, *pod, *uid; /* the pod; uid may be "" */
    const char *field_path;     /* e.g. "spec.containers{main}", or NULL */
    const char *type;           /* "Normal" or "Warning" */
    const char *reason;         /* UpperCamelCase, e.g. "GPUQueueReclaim" */
    const char *message;
    const char *component; /* source.component and reportingComponent, e.g. "kgpu-extender" */
    const char *instance;  /* source.host / reportingInstance (a node or a pod name), or NULL */
} kgpu_k8s_pod_event;

/*
 * POSTs the Event to the pod's namespace, named as kubectl names its own
 * (the pod's name, a dot, the time in hex). 0 when the API server created
 * it; else a negative code with err naming the pod, the reason and the answer.
 */
int kgpu_k8s_post_pod_event(kgpu_k8s *k, const kgpu_k8s_pod_event *ev, kgpu_error *err);

/* Callbacks of a reflector; `ctx` is the caller's. Called on the reflector's thread only. */
typedef struct kgpu_reflector_ops {
    /* A fresh list: `items` (array of objects, borrowed) replaces everything known. */
    void (*reset)(void *ctx, json_t *items);
    /* One watch event: type ADDED, MODIFIED or DELETED; object borrowed. */
    void (*event)(void *ctx, const char *type, json_t *object);
    /* A relist is coming (410, broken stream, error); `why` says which. Optional. */
    void (*restart)(void *ctx, const char *why);
    /* Trims each listed item as its page arrives (kgpu_k8s_list_opts.trim). Optional. */
    void (*trim)(void *ctx, json_t *item);
} kgpu_reflector_ops;

/*
 * Lists `collection` with kgpu_k8s_list (pages of KGPU_K8S_LIST_PAGE; `query`
 * such as "fieldSelector=spec.nodeName!=" may be NULL), then watches from the
 * list's resourceVersion with bookmarks, forever: on 410 Gone, an ERROR event, a
 * broken stream or a failed request it backs off (100 ms doubling to 30 s,
 * jittered, reset after a healthy watch) and relists. Returns when *stop
 * becomes true (checked at least every 500 ms) with 0.
 */
int kgpu_reflector_run(kgpu_k8s *k, const char *collection, const char *query,
                       const kgpu_reflector_ops *ops, void *ctx, atomic_bool *stop);

#endif
