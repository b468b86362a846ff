/*
 * List-then-watch ("reflector"): list a collection in pages (list.c), hand the
 * items over, then stream newline-delimited watch events from the list's
 * resourceVersion. Any end of the stream (410 Gone, an ERROR event, a break, a
 * clean close) leads to a fresh list after a jittered, doubling backoff, so the
 * caller's view never silently drifts. Every wait looks at *stop at least every 100 ms.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k8s_internal.h"

#define LINE_MAX_BYTES   ((size_t)16 << 20) /* one watch event */
#define ERR_BODY_MAX     4096               /* kept of a failed watch's body */
#define BACKOFF_MIN_MS   100
#define BACKOFF_MAX_MS   30000
#define HEALTHY_WATCH_MS 30000
#define WHY_MAX          1024

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* splitmix64: a private jitter source, so no shared rand() state. */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sleeps backoff ±20 % in slices of at most 100 ms; doubles the backoff. */
static void backoff_sleep(long *backoff_ms, uint64_t *rng, atomic_bool *stop)
{
    long jitter = (long)(next_rand(rng) % (uint64_t)(*backoff_ms * 2 / 5 + 1)) - *backoff_ms / 5;
    uint64_t until = now_ms() + (uint64_t)(*backoff_ms + jitter);
    for (uint64_t t = now_ms(); t < until && !atomic_load(stop); t = now_ms()) {
        uint64_t slice = until - t < KGPU__K8S_STOP_POLL_MS ? until - t : KGPU__K8S_STOP_POLL_MS;
        struct timespec ts = {0, (long)slice * 1000000L};
        nanosleep(&ts, NULL);
    }
    *backoff_ms = *backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : *backoff_ms * 2;
}

/* collection?query[&extra] into out; -1 if it does not fit. */
static int build_path(char *out, size_t outsz, const char *collection, const char *query,
                      const char *extra)
{
    bool q = query != NULL && query[0] != '\0';
    bool e = extra != NULL && extra[0] != '\0';
    int n = snprintf(out, outsz, "%s%s%s%s%s", collection, q || e ? "?" : "", q ? query : "",
                     q && e ? "&" : "", e ? extra : "");
    return n < 0 || (size_t)n >= outsz ? -1 : 0;
}

/* Lists, page by page; on success *items (owned by the caller) and rv are set, else `why`. */
static int list(kgpu_k8s *k, const char *collection, const char *query,
                const kgpu_reflector_ops *ops, void *ctx, atomic_bool *stop, json_t **items,
                char *rv, size_t rvsz, char *why)
{
    kgpu_k8s_list_opts opts = {.stop = stop, .trim = ops->trim, .trim_ctx = ctx};
    kgpu_error err;
    if (kgpu_k8s_list(k, collection, query, &opts, items, rv, rvsz, NULL, &err) != 0) {
        snprintf(why, WHY_MAX, "%s", err.msg);
        return -1;
    }
    return 0;
}

/* One watch stream being read. */
typedef struct watch {
    const kgpu_reflector_ops *ops;
    void *ctx;
    CURL *h;
    long status; /* HTTP status, once the body starts */
    char *line;  /* a partial event line */
    size_t len, cap;
    char *errbody; /* start of a non-200 body */
    size_t errlen;
    char rv[128];         /* the newest resourceVersion seen */
    unsigned long events; /* events and bookmarks delivered */
    bool aborted;         /* we stopped the stream; `why` says why */
    char why[WHY_MAX];
} watch;

static int watch_abort(watch *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int watch_abort(watch *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->why, sizeof(w->why), fmt, ap);
    va_end(ap);
    w->aborted = true;
    return -1;
}

/* Handles one event line; -1 ends the stream (w->why set). */
static int watch_line(watch *w, const char *s, size_t n)
{
    while (n > 0 && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n == 0)
        return 0;
    json_error_t jerr;
    json_t *ev = json_loadb(s, n, 0, &jerr);
    if (ev == NULL)
        return watch_abort(w, "watch: malformed event: %s", jerr.text);
    const char *type = json_string_value(json_object_get(ev, "type"));
    json_t *obj = json_object_get(ev, "object");
    int rc = 0;
    if (type == NULL || !json_is_object(obj)) {
        rc = watch_abort(w, "watch: event without a type or an object");
        goto out;
    }
    if (strcmp(type, "ERROR") == 0) {
        /* A Status: 410 Gone when our resourceVersion fell out of the window. */
        json_int_t code = json_integer_value(json_object_get(obj, "code"));
        const char *msg = json_string_value(json_object_get(obj, "message"));
        if (code == 410)
            rc = watch_abort(w, "410 Gone: %s", msg ? msg : "resource version too old");
        else
            rc = watch_abort(w, "watch error %lld: %s", (long long)code, msg ? msg : "(none)");
        goto out;
    }
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (rv != NULL && strlen(rv) < sizeof(w->rv))
        memcpy(w->rv, rv, strlen(rv) + 1);
    if (strcmp(type, "BOOKMARK") == 0) {
        w->events++;
    } else if (strcmp(type, "ADDED") == 0 || strcmp(type, "MODIFIED") == 0 ||
               strcmp(type, "DELETED") == 0) {
        w->events++;
        w->ops->event(w->ctx, type, obj);
    } /* other types: newer servers may add some; skip them */
out:
    json_decref(ev);
    return rc;
}

/* CURLOPT_WRITEFUNCTION of a watch: splits the stream into lines. */
static size_t watch_write(char *p, size_t size, size_t nmemb, void *userdata)
{
    watch *w = userdata;
    size_t n = size * nmemb;
    if (w->status == 0)
        curl_easy_getinfo(w->h, CURLINFO_RESPONSE_CODE, &w->status);
    if (w->status != 200) {
        size_t keep = n < ERR_BODY_MAX - w->errlen ? n : ERR_BODY_MAX - w->errlen;
        memcpy(w->errbody + w->errlen, p, keep);
        w->errlen += keep;
        return n;
    }
    size_t off = 0;
    while (off < n) {
        const char *nl = memchr(p + off, '\n', n - off);
        size_t chunk = nl != NULL ? (size_t)(nl - (p + off)) : n - off;
        if (chunk > LINE_MAX_BYTES - w->len) {
            watch_abort(w, "watch: an event line is longer than %zu MiB", LINE_MAX_BYTES >> 20);
            return 0;
        }
        if (nl != NULL && w->len == 0) { /* a whole line in this chunk: no copy */
            if (watch_line(w, p + off, chunk) != 0)
                return 0;
        } else {
            if (w->len + chunk > w->cap) {
                size_t cap = w->cap ? w->cap : 16384;
                while (cap < w->len + chunk)
                    cap *= 2;
                char *nb = realloc(w->line, cap);
                if (nb == NULL) {
                    watch_abort(w, "watch: out of memory for an event line");
                    return 0;
                }
                w->line = nb;
                w->cap = cap;
            }
            memcpy(w->line + w->len, p + off, chunk);
            w->len += chunk;
            if (nl != NULL) {
                int rc = watch_line(w, w->line, w->len);
                w->len = 0;
                if (rc != 0)
                    return 0;
            }
        }
        off += chunk + (nl != NULL ? 1 : 0);
    }
    return n;
}

/* Watches from rv until the stream ends; `why` says how it ended. */
static void watch_run(kgpu_k8s *k, const char *collection, const char *query, const char *rv,
                      const kgpu_reflector_ops *ops, void *ctx, atomic_bool *stop,
                      unsigned long *events, char *why)
{
    char erv[3 * 128 + 1], extra[600], path[KGPU_K8S_PATH_MAX * 4];
    *events = 0;
    if (kgpu__k8s_escape(rv, erv, sizeof(erv)) != 0 ||
        snprintf(extra, sizeof(extra), "watch=1&resourceVersion=%s&allowWatchBookmarks=true",
                 erv) >= (int)sizeof(extra) ||
        build_path(path, sizeof(path), collection, query, extra) != 0) {
        snprintf(why, WHY_MAX, "watch: path too long");
        return;
    }
    kgpu__k8s_call c;
    kgpu_error err;
    if (kgpu__k8s_call_open(k, &c, "GET", path, NULL, NULL, 0, &err) != 0) {
        snprintf(why, WHY_MAX, "watch: %s", err.msg);
        return;
    }
    watch w = {.ops = ops, .ctx = ctx, .h = c.h, .errbody = malloc(ERR_BODY_MAX)};
    snprintf(w.rv, sizeof(w.rv), "%s", rv);
    if (w.errbody == NULL) {
        snprintf(why, WHY_MAX, "watch: out of memory");
        kgpu__k8s_call_close(&c);
        return;
    }
    curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &w);
    int rc = kgpu__k8s_call_perform(&c, stop, &err);
    if (w.status == 0)
        curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &w.status);
    *events = w.events;
    if (w.aborted) {
        snprintf(why, WHY_MAX, "%s", w.why);
    } else if (w.status == 410) {
        snprintf(why, WHY_MAX, "410 Gone (HTTP status of the watch)");
    } else if (w.status != 200 && w.status != 0) {
        char msg[300];
        kgpu__k8s_status_message(w.errbody, w.errlen, msg, sizeof(msg));
        snprintf(why, WHY_MAX, "watch: HTTP %ld: %s", w.status, msg);
    } else if (rc != 0) {
        snprintf(why, WHY_MAX, "watch stream broke at resourceVersion %s: %s", w.rv, err.msg);
    } else {
        snprintf(why, WHY_MAX, "watch stream ended at resourceVersion %s", w.rv);
    }
    free(w.line);
    free(w.errbody);
    kgpu__k8s_call_close(&c);
}

int kgpu_reflector_run(kgpu_k8s *k, const char *collection, const char *query,
                       const kgpu_reflector_ops *ops, void *ctx, atomic_bool *stop)
{
    char path[KGPU_K8S_PATH_MAX * 4];
    if (k == NULL || collection == NULL || collection[0] != '/' || ops == NULL ||
        ops->reset == NULL || ops->event == NULL || stop == NULL ||
        build_path(path, sizeof(path), collection, query, NULL) != 0)
        return KGPU_EINVAL;
    uint64_t rng = now_ms() ^ (uint64_t)(uintptr_t)&rng;
    long backoff = BACKOFF_MIN_MS;
    char why[WHY_MAX], rv[KGPU_K8S_RV_MAX];
    while (!atomic_load(stop)) {
        json_t *items;
        if (list(k, collection, query, ops, ctx, stop, &items, rv, sizeof(rv), why) != 0) {
            if (atomic_load(stop))
                break;
            if (ops->restart != NULL)
                ops->restart(ctx, why);
            backoff_sleep(&backoff, &rng, stop);
            continue;
        }
        ops->reset(ctx, items);
        json_decref(items);

        uint64_t t0 = now_ms();
        unsigned long events;
        watch_run(k, collection, query, rv, ops, ctx, stop, &events, why);
        if (atomic_load(stop))
            break;
        if (events > 0 || now_ms() - t0 > HEALTHY_WATCH_MS)
            backoff = BACKOFF_MIN_MS;
        if (ops->restart != NULL)
            ops->restart(ctx, why);
        backoff_sleep(&backoff, &rng, stop);
    }
    return 0;
}
