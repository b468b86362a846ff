/*
 * What tenants' unschedulable pods cost the extender (issue 24, items 8
 * and 9), in process on the extender's state. Asserts nothing: figures.
 *
 * 1. Memory: N unschedulable GPU pods of about 1 MiB each (a kgpu.io/
 *    annotation of the tenant's own, which the watch's trim kept before
 *    issue 24 and drops now), seen by the unschedulable table; the bytes
 *    the table holds, next to what a deep copy of each pod as the old trim
 *    left it (the table before) held, and what the trim keeps of one pod
 *    now (the watch's relist holds that until its reset), in the same run.
 * 2. Latency: prioritize-gpuless for a pod without a GPU naming every node,
 *    called back to back while the leader's sweep runs over 4,096
 *    unschedulable pods on 1,000 nodes of 8 GPUs (every GPU held by one
 *    8-GPU pod a node, each waiting pod within its queue's guarantee, so
 *    each is looked at in full; 100 ms between sweeps). Worst and median per mode: no sweep; before (one hold of the
 *    lock per sweep, the verb waiting for it); the sweep in slices, the
 *    verb waiting; and after (slices, the verb scoring from the snapshot
 *    when the lock is held).
 *
 *   bench_sweep [PODS_OF_1MIB] [SECONDS_PER_MODE]
 */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decide.h"
#include "queuefile.h"
#include "bench_util.h"

#define NODES   1000
#define GPUS    8
#define WAITING 4096
#define SAMPLES 200000

size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));

/* Bytes allocated now: the sanitizer's count under ASan, malloc's otherwise. */
static size_t allocated(void)
{
    if (__sanitizer_get_current_allocated_bytes != NULL)
        return __sanitizer_get_current_allocated_bytes();
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

typedef struct world {
    ext_config cfg;
    ext_metrics m;
    ext_state st;
    ext_ctx ctx;
} world;

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_sweep: %s: %s\n", what, msg);
    exit(1);
}

static void world_init(world *w, int nodes)
{
    memset(w, 0, sizeof(*w));
    ext_config_defaults(&w->cfg);
    w->cfg.log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    if (ext_state_init(&w->st, &w->cfg, &w->m, &err) != 0)
        die("state", err.msg);
    kgpu_gpu_spec *g = calloc((size_t)nodes * GPUS, sizeof(*g));
    kgpu_node_spec *n = calloc((size_t)nodes, sizeof(*n));
    char(*names)[32] = calloc((size_t)nodes, sizeof(*names));
    for (int i = 0; i < nodes; i++) {
        snprintf(names[i], sizeof(names[i]), "node-%04d", i);
        for (int k = 0; k < GPUS; k++)
            g[i * GPUS + k] = (kgpu_gpu_spec){
                .index = k, .model = "A100", .memory_mib = 81920, .numa = -1, .healthy = true};
        n[i] = (kgpu_node_spec){.name = names[i],
                                .cpu_milli = 128000,
                                .memory_mib = 1 << 20,
                                .gpus = &g[i * GPUS],
                                .ngpus = GPUS};
    }
    if (ext_state_set_nodes(&w->st, n, nodes, &err) != 0)
        die("nodes", err.msg);
    free(g);
    free(n);
    free(names);
    w->ctx = (ext_ctx){.cfg = &w->cfg, .metrics = &w->m, .state = &w->st};
    /* Open to every namespace: a queue a label may not name is never swept for. */
    const char *q = "queues:\n - {name: team-a, guarantee: {gpu: 64}, namespaceSelector: {}}\n"
                    " - {name: team-b, guarantee: {gpu: 8000}, namespaceSelector: {}}\n";
    kgpu_queues *qs;
    if (kgpu_queues_load(q, strlen(q), "q.yaml", &qs, &err) != 0)
        die("queues", err.msg);
    ext_queues_set(&w->st, qs);
}

/*
 * An unschedulable pod of namespace ns asking one whole GPU, with `pad` bytes
 * in a kgpu.io/ annotation of its own: as the watch's trim leaves it, or, with
 * `old_trim`, as the trim before issue 24 left it (every kgpu.io/ annotation
 * kept: here, the pod untrimmed, which holds nothing else the trim cuts).
 */
static json_t *waiting_pod_as(const char *ns, int i, const char *queue, const char *pad,
                              bool old_trim)
{
    char name[32], uid[64];
    snprintf(name, sizeof(name), "w-%d", i);
    snprintf(uid, sizeof(uid), "%s-%d", ns, i);
    json_t *pod = json_pack(
        "{s:{s:s,s:s,s:s,s:{s:s},s:{s:s}},s:{s:[{s:s,s:s,s:{s:{s:s}}}]},"
        "s:{s:s,s:[{s:s,s:s,s:s,s:s}]}}",
        "metadata", "name", name, "namespace", ns, "uid", uid, "labels", "kgpu.io/queue", queue,
        "annotations", "kgpu.io/notes", pad, "spec", "containers", "name", "main", "image",
        "cuda:12", "resources", "limits", "nvidia.com/gpu", "1", "status", "phase", "Pending",
        "conditions", "type", "PodScheduled", "status", "False", "reason", "Unschedulable",
        "message", "0/1000 nodes are available: 1000 Insufficient nvidia.com/gpu.");
    if (!old_trim)
        ext_pod_trim(NULL, pod);
    return pod;
}

static json_t *waiting_pod(const char *ns, int i, const char *queue, const char *pad)
{
    return waiting_pod_as(ns, i, queue, pad, false);
}

static void seen(world *w, json_t *pod)
{
    kgpu_pod p;
    kgpu_error err;
    if (kgpu_pod_from_json(pod, 1024, &p, &err) != 0)
        die("pod", err.msg);
    ext_unsched_seen(&w->st, pod, &p);
}

static void memory_figures(int n)
{
    world w;
    world_init(&w, 4);
    char *pad = malloc(1 << 20);
    memset(pad, 'x', (1 << 20) - 1);
    pad[(1 << 20) - 1] = '\0';
    json_t **copies = calloc((size_t)n, sizeof(*copies));
    size_t before = allocated();
    for (int i = 0; i < n; i++) { /* the table before: a deep copy of each pod, old trim */
        json_t *pod = waiting_pod_as("tenant", i, "team-a", pad, true);
        copies[i] = json_deep_copy(pod);
        json_decref(pod);
    }
    size_t copied = allocated() - before;
    for (int i = 0; i < n; i++)
        json_decref(copies[i]);
    free(copies);
    before = allocated();
    for (int i = 0; i < n; i++) {
        json_t *pod = waiting_pod("tenant", i, "team-a", pad);
        seen(&w, pod);
        json_decref(pod);
    }
    size_t kept = allocated() - before;
    json_t *one = waiting_pod("tenant", 0, "team-a", pad);
    char *text = json_dumps(one, JSON_COMPACT);
    size_t trimmed = text != NULL ? strlen(text) : 0;
    free(text);
    json_decref(one);
    printf("unschedulable table, %d pods of 1 MiB from one namespace: %zu entries\n", n,
           (size_t)w.st.unsched.len);
    printf("  before (a deep copy per pod): %10.1f MiB\n", (double)copied / (1 << 20));
    printf("  after (fields the sweep reads): %8.1f KiB (%zu bytes an entry)\n",
           (double)kept / 1024, sizeof(ext_unsched));
    printf("  one pod as the watch's trim keeps it now: %zu bytes of JSON (the 1 MiB "
           "annotation is not kgpu's)\n",
           trimmed);
    printf("  the table at its bound, %d entries: %.1f MiB at most (model globs aside)\n",
           EXT_UNSCHED_MAX, (double)EXT_UNSCHED_MAX * (double)sizeof(ext_unsched) / (1 << 20));
    free(pad);
    ext_state_destroy(&w.st);
    ext_config_free(&w.cfg);
}

typedef struct sweeper {
    world *w;
    atomic_bool stop;
    atomic_long passes;
    double longest_pass;
} sweeper;

static void *sweep_loop(void *arg)
{
    sweeper *s = arg;
    ext_sweep_act acts[EXT_SWEEP_PODS];
    while (!atomic_load(&s->stop)) {
        double t0 = bench_now_s();
        pthread_mutex_lock(&s->w->st.mu);
        ext_unsched_sweep(&s->w->st, acts, EXT_SWEEP_PODS);
        pthread_mutex_unlock(&s->w->st.mu);
        double d = bench_now_s() - t0;
        if (d > s->longest_pass)
            s->longest_pass = d;
        atomic_fetch_add(&s->passes, 1);
        struct timespec gap = {0, 100 * 1000000L}; /* the daemon waits EXT_SWEEP_MS; shorter here */
        nanosleep(&gap, NULL);
    }
    return NULL;
}

static char *gpuless_body(int nodes)
{
    size_t len = (size_t)nodes * 16 + 512;
    char *b = malloc(len);
    int off = snprintf(b, len,
                       "{\"Pod\":{\"metadata\":{\"name\":\"web\",\"namespace\":\"web\",\"uid\":"
                       "\"web-1\"},\"spec\":{\"containers\":[{\"name\":\"main\",\"resources\":"
                       "{\"requests\":{\"cpu\":\"2\",\"memory\":\"1Gi\"}}}]}},\"NodeNames\":[");
    for (int i = 0; i < nodes; i++)
        off += snprintf(b + off, len - (size_t)off, "%s\"node-%04d\"", i ? "," : "", i);
    snprintf(b + off, len - (size_t)off, "]}");
    return b;
}

/* Calls prioritize-gpuless back to back for `secs`; prints worst and median. */
static void latency(world *w, const char *mode, bool sweep, double slice_s, bool always_lock,
                    double secs, const char *body, double *samples)
{
    w->st.sweep_slice_s = slice_s;
    w->st.gpuless.always_lock = always_lock;
    sweeper s = {.w = w};
    atomic_init(&s.stop, false);
    atomic_init(&s.passes, 0);
    pthread_t t;
    if (sweep)
        pthread_create(&t, NULL, sweep_loop, &s);
    unsigned long stale0 = atomic_load(&w->st.gpuless.stale_answers);
    int n = 0;
    double end = bench_now_s() + secs;
    while ((bench_now_s() < end || (sweep && atomic_load(&s.passes) < 1)) && n < SAMPLES) {
        ext_response r;
        double t0 = bench_now_s();
        ext_decide(&w->ctx, VERB_PRIORITIZE_GPULESS, body, strlen(body), &r);
        samples[n++] = bench_now_s() - t0;
        if (r.status != 200)
            die("prioritize-gpuless", r.body ? r.body : "no body");
        ext_response_discard(&r);
    }
    if (sweep) {
        atomic_store(&s.stop, true);
        pthread_join(t, NULL);
    }
    qsort(samples, (size_t)n, sizeof(*samples), bench_cmp_double);
    printf("  %-44s calls %6d  median %7.2f ms  worst %7.2f ms", mode, n, samples[n / 2] * 1e3,
           samples[n - 1] * 1e3);
    if (sweep)
        printf("  (sweeps %ld, longest %.0f ms, from snapshot %lu)", atomic_load(&s.passes),
               s.longest_pass * 1e3, atomic_load(&w->st.gpuless.stale_answers) - stale0);
    printf("\n");
}

static void latency_figures(double secs)
{
    world w;
    world_init(&w, NODES);
    kgpu_error err;
    for (int i = 0; i < NODES; i++) { /* every GPU held, team-b within its guarantee */
        for (int k = 0; k < 1; k++) {
            char name[48];
            snprintf(name, sizeof(name), "held-%d-%d", i, k);
            json_t *pod = json_pack("{s:{s:s,s:s,s:s},s:{s:[{s:s,s:{s:{s:s}}}]}}", "metadata",
                                    "name", name, "namespace", "b", "uid", name, "spec",
                                    "containers", "name", "main", "resources", "limits",
                                    "nvidia.com/gpu", "8");
            kgpu_pod p;
            const ext_pod *held;
            char node[32];
            snprintf(node, sizeof(node), "node-%04d", i);
            if (kgpu_pod_from_json(pod, 1024, &p, &err) != 0 ||
                ext_state_compile(&w.st, &p, &err) != 0 ||
                ext_state_reserve(&w.st, &p, node, "team-b", 0, &held, &err) != 0)
                die("bind", err.msg);
            ext_state_confirm(&w.st, name);
            json_decref(pod);
        }
    }
    for (int i = 0; i < WAITING; i++) {
        char ns[32];
        snprintf(ns, sizeof(ns), "team-%d", i % (WAITING / EXT_UNSCHED_NS_MAX));
        json_t *pod = waiting_pod(ns, i, "team-a", "");
        seen(&w, pod);
        json_decref(pod);
    }
    printf("prioritize-gpuless naming %d nodes while the sweep runs over %zu unschedulable pods "
           "(%d GPUs, all held):\n",
           NODES, (size_t)w.st.unsched.len, NODES * GPUS);
    char *body = gpuless_body(NODES);
    double *samples = malloc(SAMPLES * sizeof(*samples));
    latency(&w, "no sweep", false, 1e9, true, secs, body, samples);
    latency(&w, "before: one hold per sweep, verb waits", true, 1e9, true, secs, body, samples);
    char mode[96];
    snprintf(mode, sizeof(mode), "sweep in %d ms slices, verb waits", EXT_SWEEP_SLICE_MS);
    latency(&w, mode, true, EXT_SWEEP_SLICE_MS / 1000.0, true, secs, body, samples);
    snprintf(mode, sizeof(mode), "after: %d ms slices, snapshot when held", EXT_SWEEP_SLICE_MS);
    latency(&w, mode, true, EXT_SWEEP_SLICE_MS / 1000.0, false, secs, body, samples);
    free(samples);
    free(body);
    ext_state_destroy(&w.st);
    ext_config_free(&w.cfg);
}

/* The gpu-less entry's timeout as shipped: the most a hung extender costs such a pod. */
static void timeout_statement(void)
{
    FILE *f = fopen(KGPU_SOURCE_DIR "/deploy/extender/scheduler-config.yaml", "r");
    char line[256], last[64] = "?";
    bool gpuless = false, ignorable = false, filter = false;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "filterVerb: filter-gpuless") != NULL)
            filter = true; /* listed before prioritizeVerb in the entry */
        if (strstr(line, "prioritizeVerb: prioritize-gpuless") != NULL)
            gpuless = true;
        if (gpuless && sscanf(line, " httpTimeout: %63s", last) == 1)
            continue;
        if (gpuless && strstr(line, "ignorable: true") != NULL)
            ignorable = true;
    }
    if (f != NULL)
        fclose(f);
    printf("shipped gpu-less entry: httpTimeout %s, ignorable %s, %d call%s a pod (%s): a hung "
           "extender costs a pod without a GPU at most %d x %s (then kube-scheduler places it by "
           "its own filters and scores)\n",
           last, ignorable ? "true" : "false", filter ? 2 : 1, filter ? "s" : "",
           filter ? "filter-gpuless, prioritize-gpuless" : "prioritize-gpuless", filter ? 2 : 1,
           last);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int pods = argc > 1 ? atoi(argv[1]) : 100;
    double secs = argc > 2 ? atof(argv[2]) : 3;
    memory_figures(pods > 0 ? pods : 100);
    latency_figures(secs > 0 ? secs : 3);
    timeout_statement();
    return 0;
}
