/*
 * kgpu-extender, serving layer: how the extender is reached. The HTTP(S)
 * server (http.c), which knows nothing of scheduling and hands each
 * complete, size-checked request to the handler it was given; the
 * observers' documents, /metrics (metrics.c) and /inspect (inspect.c),
 * rendered from a snapshot so they never slow the hot path; and the
 * GPUQueues' status written back to the API server (status.c).
 */
#ifndef KGPU_EXT_SERVE_H
#define KGPU_EXT_SERVE_H

#include "decide.h"

/* ---- the HTTP(S) server (http.c) ---- */

/*
 * One complete request, answered in *r. Runs on a handler thread; any
 * number at once (the probe listener's on its own thread).
 */
typedef void (*ext_http_handler)(void *ctx, const char *method, const char *url,
                                 const char *body, size_t len, ext_response *r);

typedef struct ext_http ext_http;

/*
 * Serves the scheduling listener (and the probe listener when
 * cfg->probe_listen is set) with cfg's limits, counting into m. *out is
 * set even when it fails part way: close it. cfg, m and ctx outlive it.
 */
int ext_http_serve(const ext_config *cfg, ext_metrics *m, ext_http_handler handle, void *ctx,
                   ext_http **out, kgpu_error *err);
/* The ports bound (0: none). */
int ext_http_port(const ext_http *h);
int ext_http_probe_port(const ext_http *h);
/* Stops both listeners after answering what is queued; frees h (NULL: nothing). */
void ext_http_close(ext_http *h);

/* ---- observers (metrics.c, inspect.c) ---- */

/*
 * The Prometheus text exposition of everything the extender measures, as a
 * stream: every family but the per-GPU ones rendered
 * now, the per-GPU ones written line by line from a snapshot of the GPUs
 * (~130 bytes a GPU) as the client reads, so a scrape costs the snapshot, not
 * the text. At most EXT_METRICS_STREAMS at once (each holds a snapshot
 * until its client has read it): false when that many are open or out of
 * memory, with *busy saying which. `ready`: the readiness gauge's value.
 */
#define EXT_METRICS_STREAMS 4
bool ext_metrics_stream(ext_metrics *m, ext_state *st, bool ready, ext_stream *out, bool *busy);

/* The /inspect document: every node (or one: node non-NULL) with GPUs and pods. NULL if unknown. */
json_t *ext_inspect_json(ext_state *st, const char *node);

/* ---- GPUQueue status (status.c) ---- */

#define EXT_STATUS_INTERVAL_MS 2000 /* how often the leader writes statuses that changed */

/* A GPUQueue's status as the extender would write it now (tests and the status writer). */
json_t *ext_gpuqueue_status(const ext_queue_row *row, long long generation, const char *error,
                            const json_t *old_status, const char *now);
/*
 * Writes the status of every GPUQueue whose status differs from what it
 * holds and from what `written` (name -> the status last written, JSON
 * text, owned) says was written; updates `written`. Takes the state lock to copy.
 */
void ext_status_write(ext_state *st, kgpu_k8s *k8s, kgpu_strmap *written);

#endif
