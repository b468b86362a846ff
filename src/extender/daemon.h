/*
 * kgpu-extender, the daemon: what wires the layers. It owns the
 * configuration, the counters, the state, the API client, the sources'
 * threads, the leader election and the HTTP server; it routes each request
 * (routes.c) to a verb or an observer, and runs the leader's periodic work
 * (GPUQueue status, the reclaim sweep) on threads of its own.
 */
#ifndef KGPU_EXT_DAEMON_H
#define KGPU_EXT_DAEMON_H

#include "serve.h"

typedef struct ext_daemon {
    ext_config cfg;
    ext_metrics metrics;
    ext_state state;
    kgpu_k8s *k8s; /* NULL in cluster-file mode */
    atomic_bool stop;
    ext_sink sink;       /* into state */
    ext_sources sources; /* the reflectors' view of the above */
    pthread_t watch_threads[EXT_SOURCES_THREADS + 3]; /* the sources', status writer, sweep, guard */
    int nwatch;
    ext_http *http;  /* the serving layer */
    int port;        /* the port actually bound */
    int probe_port;  /* the probe listener's, 0 without one */
    ext_leader leader; /* with leader election */
} ext_daemon;

/* The context a verb or an observer works in: d's own parts, borrowed. */
ext_ctx ext_daemon_ctx(ext_daemon *d);

/* One request: method, URL (any urlPrefix for POST verbs) and body; the answer in *r. */
void ext_handle(ext_daemon *d, const char *method, const char *url, const char *body, size_t len,
                ext_response *r);

/* The serving layer for d (ext_http_serve with ext_handle): sets d->http, d->port, d->probe_port. */
int ext_http_start(ext_daemon *d, kgpu_error *err);
void ext_http_stop(ext_daemon *d);

/* Loads inventory (cluster file) or starts watching (API server), then serves. */
int ext_daemon_start(ext_daemon *d, kgpu_error *err);
void ext_daemon_stop(ext_daemon *d);

/* Whether this replica leads now (always, without leader election). */
bool ext_daemon_leads(ext_daemon *d);

/* True once inventory and pods are known and, with leader election, this replica leads (readyz). */
bool ext_daemon_ready(ext_daemon *d);

#endif
