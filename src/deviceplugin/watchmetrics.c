/*
 * The watcher's metrics text (Prometheus text format 0.0.4), rendered whole
 * after each scan and published under pub_mu for /metrics readers
 * (watchstate.h).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "watcher.h"
#include "watchstate.h"

static const char *const kind_names[K_NKINDS] = {"kgpu_container", "other_pod", "host",
                                                 "unreadable"};

/* ---- text buffer ---- */

typedef struct tbuf {
    char *p;
    size_t len, cap;
    bool oom;
} tbuf;

static void tb_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(tbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p != NULL && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A label value, escaped as the text format wants (backslash, quote, newline). */
static void tb_label(tbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            tb_printf(b, "\\\\");
        else if (*v == '"')
            tb_printf(b, "\\\"");
        else if (*v == '\n')
            tb_printf(b, "\\n");
        else
            tb_printf(b, "%c", *v);
    }
}

/* ---- metrics ---- */

/* The label set of an entry, without its closing brace (callers may add labels). */
static void entry_labels(tbuf *b, const dp_watcher *w, const wentry *e)
{
    tb_printf(b, "{namespace=\"");
    tb_label(b, e->ns);
    tb_printf(b, "\",pod=\"");
    tb_label(b, e->pod);
    tb_printf(b, "\",container=\"");
    tb_label(b, e->name);
    tb_printf(b, "\",pod_uid=\"%s\",container_id=\"%s\",gpu=\"%d\",gpu_uuid=\"", e->id.pod_uid,
              e->id.container_id, w->gpus[e->gpu].index);
    tb_label(b, w->gpus[e->gpu].uuid);
    tb_printf(b, "\"");
}

static void family(tbuf *b, const char *name, const char *type, const char *help)
{
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One per-container family: `what` picks the value; entries without one are left out. */
enum { V_USED, V_SHARE, V_CORE, V_CORE_SHARE, V_PROCS, V_KILLED, V_UNALLOC };

static void entry_family(tbuf *b, const dp_watcher *w, const char *name, const char *type,
                         const char *help, int what)
{
    family(b, name, type, help);
    for (int i = 0; i < w->nentries; i++) {
        const wentry *e = &w->entries[i];
        long long v;
        switch (what) {
        case V_USED:
            v = e->used;
            break;
        case V_SHARE:
            v = e->share;
            break;
        case V_CORE:
            v = e->sm;
            break;
        case V_CORE_SHARE:
            v = e->core_share;
            break;
        case V_PROCS:
            v = e->nprocs;
            break;
        case V_UNALLOC:
            v = e->unallocated;
            break;
        default:
            v = (long long)e->killed;
            break;
        }
        if (v < 0)
            continue;
        tb_printf(b, "%s", name);
        entry_labels(b, w, e);
        tb_printf(b, "} %lld\n", v);
    }
}

void dp_watch_render(dp_watcher *w)
{
    tbuf b = {0};
    family(&b, "kgpu_watcher_up", "gauge",
           "1 when the last scan read every GPU's processes from NVML, 0 when it failed.");
    tb_printf(&b, "kgpu_watcher_up %d\n", w->up ? 1 : 0);
    family(&b, "kgpu_watcher_scans_total", "counter", "Scans of the GPUs' processes.");
    tb_printf(&b, "kgpu_watcher_scans_total %" PRIu64 "\n", w->scans);
    family(&b, "kgpu_watcher_scan_errors_total", "counter",
           "Scans that failed (NVML unavailable or a GPU not answering).");
    tb_printf(&b, "kgpu_watcher_scan_errors_total %" PRIu64 "\n", w->scan_errors);
    family(&b, "kgpu_watcher_last_scan_timestamp_seconds", "gauge",
           "Unix time the last scan finished.");
    tb_printf(&b, "kgpu_watcher_last_scan_timestamp_seconds %.3f\n", w->last_scan_unix);
    family(&b, "kgpu_watcher_scan_duration_seconds", "gauge", "How long the last scan took.");
    tb_printf(&b, "kgpu_watcher_scan_duration_seconds %.6f\n", w->last_scan_s);
    family(&b, "kgpu_watcher_gpu_processes", "gauge",
           "GPU processes in the last scan, by GPU and by what they belong to.");
    for (int g = 0; g < w->ngpus; g++)
        for (int k = 0; k < K_NKINDS; k++) {
            tb_printf(&b, "kgpu_watcher_gpu_processes{gpu=\"%d\",gpu_uuid=\"", w->gpus[g].index);
            tb_label(&b, w->gpus[g].uuid);
            tb_printf(&b, "\",kind=\"%s\"} %d\n", kind_names[k], w->kinds[g][k]);
        }
    family(&b, "kgpu_watcher_untracked_total", "counter",
           "Container and GPU pairs seen but not tracked: more than the watcher keeps.");
    tb_printf(&b, "kgpu_watcher_untracked_total %" PRIu64 "\n", w->dropped);
    family(&b, "kgpu_watcher_events_total", "counter",
           "Kubernetes Events the watcher posted, by outcome.");
    tb_printf(&b, "kgpu_watcher_events_total{result=\"posted\"} %" PRIu64 "\n", w->events_posted);
    tb_printf(&b, "kgpu_watcher_events_total{result=\"failed\"} %" PRIu64 "\n", w->events_failed);
    family(&b, "kgpu_watcher_kills_total", "counter",
           "GPU processes the watcher sent SIGKILL (enforce: kill), by outcome.");
    tb_printf(&b, "kgpu_watcher_kills_total{result=\"killed\"} %" PRIu64 "\n", w->kills);
    tb_printf(&b, "kgpu_watcher_kills_total{result=\"failed\"} %" PRIu64 "\n", w->kill_failures);

    entry_family(&b, w, "kgpu_container_gpu_memory_used_bytes", "gauge",
                 "GPU memory the container's processes hold, as the driver counts it.", V_USED);
    entry_family(&b, w, "kgpu_container_gpu_memory_share_bytes", "gauge",
                 "The container's memory share on the GPU (its limits file; 0: not given it).",
                 V_SHARE);
    entry_family(&b, w, "kgpu_container_gpu_core_used_percent", "gauge",
                 "SM utilization of the container's processes since the previous scan.", V_CORE);
    entry_family(&b, w, "kgpu_container_gpu_core_share_percent", "gauge",
                 "The container's compute share on the GPU (100: not limited).", V_CORE_SHARE);
    entry_family(&b, w, "kgpu_container_gpu_processes", "gauge",
                 "The container's processes using the GPU.", V_PROCS);
    family(&b, "kgpu_container_gpu_throttled", "gauge",
           "1 while the container is over its share on the GPU (memory: over share plus "
           "memorySlackMiB; core: over share plus coreSlackPercent for coreGraceScans scans).");
    for (int i = 0; i < w->nentries; i++)
        for (int r = 0; r < 2; r++) {
            const wentry *e = &w->entries[i];
            tb_printf(&b, "kgpu_container_gpu_throttled");
            entry_labels(&b, w, e);
            tb_printf(&b, ",resource=\"%s\"} %d\n", r == 0 ? "memory" : "core",
                      r == 0 ? e->mem_over : e->core_over);
        }
    family(&b, "kgpu_container_gpu_over_share_total", "counter",
           "Times the container went over its share on the GPU.");
    for (int i = 0; i < w->nentries; i++)
        for (int r = 0; r < 2; r++) {
            const wentry *e = &w->entries[i];
            tb_printf(&b, "kgpu_container_gpu_over_share_total");
            entry_labels(&b, w, e);
            tb_printf(&b, ",resource=\"%s\"} %" PRIu64 "\n", r == 0 ? "memory" : "core",
                      r == 0 ? e->mem_episodes : e->core_episodes);
        }
    entry_family(&b, w, "kgpu_container_gpu_killed_processes_total", "counter",
                 "The container's GPU processes the watcher killed on the GPU.", V_KILLED);
    entry_family(&b, w, "kgpu_container_gpu_unallocated", "gauge",
                 "1 when kgpu did not allocate the container this GPU (its share is zero).",
                 V_UNALLOC);
    if (b.oom) {
        free(b.p);
        return; /* keep the previous text */
    }
    pthread_mutex_lock(&w->pub_mu);
    char *old = w->pub;
    w->pub = b.p;
    w->pub_len = b.len;
    pthread_mutex_unlock(&w->pub_mu);
    free(old);
}
