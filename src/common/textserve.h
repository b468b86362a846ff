/*
 * A small plain-HTTP server of text for Prometheus scrapes and probes:
 * GET /healthz answers "ok", any other GET what the caller's function
 * gives for the path (404 when it gives nothing), other methods 405.
 * libmicrohttpd's one polling thread answers; the function is called on
 * that thread, so what it reads is the caller's to guard. Used by
 * kgpu-dispatcher and `kgpu bench-export` for /metrics.
 */
#ifndef KGPU_TEXTSERVE_H
#define KGPU_TEXTSERVE_H

#include "kgpu/error.h"

/* The body for `path` (malloc'd, freed by the server), or NULL for 404. */
typedef char *(*kgpu_text_fn)(void *ctx, const char *path);

typedef struct kgpu_textserver kgpu_textserver;

/* Serves on `listen` (IPV4:PORT, or :PORT for every address); NULL with err. */
kgpu_textserver *kgpu_textserver_start(const char *listen, kgpu_text_fn fn, void *ctx,
                                       kgpu_error *err);
void kgpu_textserver_stop(kgpu_textserver *s);

#endif
