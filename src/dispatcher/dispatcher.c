/*
 * kgpu-dispatcher: Kueue MultiKueue's external dispatcher
 * (docs/multicluster.md). On the manager cluster, every --interval seconds:
 *
 *   1. list the MultiKueue AdmissionChecks, their MultiKueueConfigs (which
 *      worker clusters each may use) and the MultiKueueClusters (Active or
 *      not), and the Workloads;
 *   2. for each Workload that waits for a dispatcher (quota reserved on the
 *      manager, its MultiKueue check Pending, no cluster yet, and either no
 *      nomination or one naming a cluster that went away), ask each of its
 *      clusters' kgpu-extender POST /estimate for its GPU pod set, with the
 *      dispatches still in flight to that cluster placed first;
 *   3. rank them (kgpu_dispatch_rank: never a cluster that cannot place it;
 *      the workload's GPU model preference or the static table's, then
 *      measured throughput per cost, fragmentation added, price, room) and
 *      write the best into .status.nominatedClusterNames. Kueue then
 *      creates the Workload and its Job in that worker only.
 *
 * The nomination is written by server-side apply under the name of Kueue's
 * own admission field manager, carrying exactly the fields that manager
 * owns as they are (dsp_nomination_apply says why: Kueue clears the
 * nomination by omitting it, which removes only a field no other manager
 * owns; a merge patch of our own made Kueue's next write fail on
 * "clusterName and nominatedClusterNames are mutually exclusive"), plus the
 * resourceVersion read, so a Workload that changed since (admitted,
 * evicted, nominated by someone else) is not overwritten: 409, and it is
 * looked at again next round. Only nominatedClusterNames changes, and only
 * while clusterName is unset.
 *
 * Threads: the main thread owns every decision and all state here; the
 * metrics server's thread reads only the rendered text, under `mu`.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clusterfile.h"
#include "fileio.h"
#include "k8s.h"
#include "kgpu/estimate.h"
#include "pick.h"
#include "textserve.h"

#define KUEUE "/apis/kueue.x-k8s.io/v1beta2"
#define INFLIGHT_MAX 4096
#define INFLIGHT_GRACE_S 10.0 /* after admission, until the worker's extender holds the pods */
#define BUCKETS 8

static const double bucket_le[BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0};

typedef struct inflight {
    char uid[64];
    char cluster[64];
    json_t *pod; /* owned copy of the template */
    int count;
    double since_admitted; /* 0 while not admitted */
} inflight;

/* A workload no cluster could place: asked again after a growing pause. */
typedef struct backoff {
    char uid[64];
    double next, pause;
    bool seen; /* still waiting in this round */
} backoff;

#define BACKOFF_MAX 4096
#define BACKOFF_FIRST_S 5.0
#define BACKOFF_MAX_S 60.0

typedef struct cluster_rt {
    kgpu_k8s *ext; /* its kgpu-extender */
    bool up;       /* its last estimate was answered */
    long nominations_best, nominations_only;
} cluster_rt;

typedef struct dispatcher {
    kgpu_k8s *manager;
    kgpu_clusters clusters;
    cluster_rt rt[KGPU_CLUSTERS_MAX];
    char bench_file[1024], table_file[1024];
    kgpu_k8s *bench_server; /* --benchmarks is a URL: its server (the path is bench_path) */
    const char *bench_path;
    dsp_bench *bench;
    dsp_table *table;
    inflight *fl;
    int nfl;
    backoff *bo;
    int nbo;
    char topology[2048]; /* the usable clusters last round: a change ends every pause */
    long unplaceable, rounds, errors;
    long est_count, est_bucket[BUCKETS];
    double est_sum;
    pthread_mutex_t mu; /* guards metrics_text */
    char *metrics_text;
    int log_level; /* 0 warnings, 1 info, 2 debug */
} dispatcher;

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void say(dispatcher *d, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(dispatcher *d, int level, const char *fmt, ...)
{
    if (level > d->log_level)
        return;
    char ts[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(stderr, "%s %s kgpu-dispatcher: ", ts, level == 0 ? "warn" : level == 1 ? "info" : "debug");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- reading the manager ---- */

static json_t *list(dispatcher *d, const char *what, kgpu_error *err)
{
    char path[256];
    snprintf(path, sizeof(path), KUEUE "/%s", what);
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    if (kgpu_k8s_list(d->manager, path, NULL, NULL, &items, rv, sizeof(rv), NULL, err) != 0)
        return NULL;
    return items;
}

/*
 * MultiKueue checks -> the clusters each may use: {check: {cluster: true}},
 * only clusters of the clusters file whose MultiKueueCluster is Active.
 */
static json_t *read_topology(dispatcher *d, kgpu_error *err)
{
    json_t *checks = list(d, "admissionchecks", err);
    json_t *configs = checks ? list(d, "multikueueconfigs", err) : NULL;
    json_t *mkcs = configs ? list(d, "multikueueclusters", err) : NULL;
    json_t *out = mkcs ? json_object() : NULL;
    json_t *active = json_object();
    size_t i, k;
    json_t *o, *c;
    json_array_foreach(mkcs, i, o) {
        const char *name = json_string_value(json_object_get(json_object_get(o, "metadata"), "name"));
        json_array_foreach(json_object_get(json_object_get(o, "status"), "conditions"), k, c) {
            const char *t = json_string_value(json_object_get(c, "type"));
            const char *s = json_string_value(json_object_get(c, "status"));
            if (name && t && s && strcmp(t, "Active") == 0 && strcmp(s, "True") == 0)
                json_object_set_new(active, name, json_true());
        }
    }
    json_array_foreach(checks, i, o) {
        const json_t *spec = json_object_get(o, "spec");
        const char *name = json_string_value(json_object_get(json_object_get(o, "metadata"), "name"));
        const char *ctl = json_string_value(json_object_get(spec, "controllerName"));
        const json_t *params = json_object_get(spec, "parameters");
        const char *cfg = json_string_value(json_object_get(params, "name"));
        if (out == NULL || !name || !ctl || strcmp(ctl, DSP_MULTIKUEUE) != 0 || !cfg)
            continue;
        json_t *allowed = json_object();
        size_t j;
        json_t *mc;
        json_array_foreach(configs, j, mc) {
            const char *n = json_string_value(json_object_get(json_object_get(mc, "metadata"), "name"));
            if (n == NULL || strcmp(n, cfg) != 0)
                continue;
            json_t *cl;
            json_array_foreach(json_object_get(json_object_get(mc, "spec"), "clusters"), k, cl) {
                const char *cn = json_string_value(cl);
                if (cn != NULL && json_object_get(active, cn) != NULL)
                    json_object_set_new(allowed, cn, json_true());
            }
        }
        json_object_set_new(out, name, allowed);
    }
    json_decref(active);
    json_decref(checks);
    json_decref(configs);
    json_decref(mkcs);
    return out;
}

/* ---- in-flight dispatches ---- */

static inflight *fl_find(dispatcher *d, const char *uid)
{
    for (int i = 0; i < d->nfl; i++)
        if (strcmp(d->fl[i].uid, uid) == 0)
            return &d->fl[i];
    return NULL;
}

static void fl_drop(dispatcher *d, int i)
{
    json_decref(d->fl[i].pod);
    d->fl[i] = d->fl[--d->nfl];
}

/*
 * Forgets dispatches whose Workload is gone, and those admitted a while ago
 * (their pods are the worker's to count by then). Returns how many went:
 * room they held in the estimates is free again.
 */
static int fl_prune(dispatcher *d, json_t *seen, double now)
{
    int gone = 0;
    for (int i = d->nfl - 1; i >= 0; i--) {
        json_t *state = json_object_get(seen, d->fl[i].uid);
        bool drop = state == NULL;
        if (json_is_true(state)) { /* admitted somewhere */
            if (d->fl[i].since_admitted == 0)
                d->fl[i].since_admitted = now;
            else if (now - d->fl[i].since_admitted > INFLIGHT_GRACE_S)
                drop = true;
        }
        if (drop) {
            fl_drop(d, i);
            gone++;
        }
    }
    return gone;
}

/* What is in flight to `cluster`, as the estimate's reserve. */
static json_t *fl_reserve(dispatcher *d, const char *cluster)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < d->nfl && json_array_size(a) < KGPU_ESTIMATE_RESERVE; i++)
        if (strcmp(d->fl[i].cluster, cluster) == 0)
            json_array_append_new(a, json_pack("{s:O,s:i}", "pod", d->fl[i].pod, "count",
                                               d->fl[i].count));
    return a;
}

/* ---- one workload ---- */

static bool estimate(dispatcher *d, int ci, const dsp_workload *w, dsp_answer *ans)
{
    json_t *res = fl_reserve(d, d->clusters.v[ci].name);
    char *body = dsp_estimate_body(w, res);
    json_decref(res);
    if (body == NULL)
        return false;
    kgpu_http_resp resp = {0};
    kgpu_error err;
    kgpu_error_clear(&err);
    double t0 = now_s();
    int rc = kgpu_k8s_request(d->rt[ci].ext, "POST", "/estimate", "application/json", body,
                              &resp, &err);
    double dt = now_s() - t0;
    free(body);
    d->est_count++;
    d->est_sum += dt;
    for (int b = 0; b < BUCKETS; b++)
        d->est_bucket[b] += dt <= bucket_le[b];
    bool ok = rc == 0 && resp.status == 200;
    if (!ok)
        say(d, 0, "cluster %s: estimate failed: %s", d->clusters.v[ci].name,
            rc != 0 ? err.msg : resp.body ? resp.body : "(no body)");
    else if (dsp_answer_read(resp.body, resp.len, ans, &err) != 0) {
        say(d, err.code == KGPU_EINVAL ? 1 : 0, "cluster %s: workload %s/%s: %s",
            d->clusters.v[ci].name, w->ns, w->name, err.msg);
        ans->fit = 0; /* answered, but cannot take it */
    }
    free(resp.body);
    d->rt[ci].up = ok;
    return ok;
}

static int nominate(dispatcher *d, const dsp_workload *w, const char *cluster)
{
    char path[512];
    snprintf(path, sizeof(path),
             KUEUE "/namespaces/%s/workloads/%s/status?fieldManager=" DSP_KUEUE_MANAGER
                   "&force=true",
             w->ns, w->name);
    kgpu_error err;
    kgpu_error_clear(&err);
    json_t *apply = dsp_nomination_apply(w->obj, DSP_KUEUE_MANAGER, cluster, &err);
    char *body = apply ? json_dumps(apply, JSON_COMPACT) : NULL;
    json_decref(apply);
    if (body == NULL) {
        say(d, 0, "workload %s/%s: %s", w->ns, w->name, err.code ? err.msg : "out of memory");
        return -1;
    }
    kgpu_http_resp resp = {0};
    int rc = kgpu_k8s_request(d->manager, "PATCH", path, "application/apply-patch+yaml", body,
                              &resp, &err);
    free(body);
    long status = rc == 0 ? resp.status : 0;
    if (status != 200)
        say(d, status == 409 ? 1 : 0, "workload %s/%s: nominating %s: %s", w->ns, w->name,
            cluster, rc != 0 ? err.msg : resp.body ? resp.body : "no body");
    free(resp.body);
    return status == 200 ? 0 : -1;
}

static backoff *bo_find(dispatcher *d, const char *uid)
{
    for (int i = 0; i < d->nbo; i++)
        if (strcmp(d->bo[i].uid, uid) == 0)
            return &d->bo[i];
    return NULL;
}

/* No cluster could place it: pause before asking again, longer each time. */
static void bo_miss(dispatcher *d, const char *uid, double now)
{
    backoff *b = bo_find(d, uid);
    if (b == NULL && d->nbo < BACKOFF_MAX) {
        b = &d->bo[d->nbo++];
        memset(b, 0, sizeof(*b));
        snprintf(b->uid, sizeof(b->uid), "%s", uid);
    }
    if (b == NULL)
        return;
    b->pause = b->pause == 0 ? BACKOFF_FIRST_S : b->pause * 2;
    if (b->pause > BACKOFF_MAX_S)
        b->pause = BACKOFF_MAX_S;
    b->next = now + b->pause;
    b->seen = true;
}

/* Whether the workload waits out a pause now (and marks it still waiting). */
static bool bo_pausing(dispatcher *d, const char *uid, double now)
{
    backoff *b = bo_find(d, uid);
    if (b == NULL)
        return false;
    b->seen = true;
    return now < b->next;
}

/* Forgets pauses of workloads no longer waiting. */
static void bo_prune(dispatcher *d)
{
    for (int i = d->nbo - 1; i >= 0; i--) {
        if (!d->bo[i].seen)
            d->bo[i] = d->bo[--d->nbo];
        else
            d->bo[i].seen = false;
    }
}

static void dispatch_one(dispatcher *d, dsp_workload *w, const json_t *allowed)
{
    dsp_table_apply(d->table, w);
    kgpu_dispatch_candidate cand[KGPU_CLUSTERS_MAX];
    int idx[KGPU_CLUSTERS_MAX], n = 0;
    for (int ci = 0; ci < d->clusters.n; ci++) {
        const char *name = d->clusters.v[ci].name;
        if (json_object_get(allowed, name) == NULL)
            continue; /* not in its MultiKueueConfig, or not Active */
        dsp_answer a;
        memset(&a, 0, sizeof(a));
        bool up = estimate(d, ci, w, &a);
        int pref = -1;
        double perf = 0;
        for (int m = 0; m < a.nmodels; m++) {
            int r = dsp_pref_rank(w, a.models[m]);
            if (r >= 0 && (pref < 0 || r < pref))
                pref = r;
        }
        const char *model = a.first_model[0] ? a.first_model : NULL;
        if (model != NULL && w->key[0]) {
            double tp = dsp_bench_get(d->bench, w->key, model, name);
            perf = tp > 0 ? (a.price > 0 ? tp / a.price : tp) : 0;
        }
        cand[n] = (kgpu_dispatch_candidate){.name = name, .reachable = up, .fit = a.fit,
                                            .grow = a.grow, .scored = a.scored,
                                            .score = a.score,
                                            .pref = pref, .perf_per_cost = perf,
                                            .frag_added = a.frag_added, .price = a.price};
        idx[n++] = ci;
        say(d, 2,
            "workload %s/%s on %s: %s fit %d grow %d pref %d perf/cost %.3g frag +%.1f price %.3g",
            w->ns, w->name, name, up ? "up" : "down", a.fit, a.grow, pref, perf, a.frag_added,
            a.price);
    }
    int order[KGPU_CLUSTERS_MAX];
    int k = kgpu_dispatch_rank(cand, n, w->count, order);
    if (k == 0) {
        d->unplaceable++;
        bo_miss(d, w->uid, now_s());
        say(d, 1, "workload %s/%s: no cluster can place %d pod%s of it now; asked again next "
            "round", w->ns, w->name, w->count, w->count == 1 ? "" : "s");
        return;
    }
    int ci = idx[order[0]];
    const char *best = d->clusters.v[ci].name;
    if (nominate(d, w, best) != 0)
        return;
    backoff *b = bo_find(d, w->uid);
    if (b != NULL)
        b->next = b->pause = 0; /* placed: a later wait starts its pauses afresh */
    if (k == 1)
        d->rt[ci].nominations_only++;
    else
        d->rt[ci].nominations_best++;
    say(d, 1, "workload %s/%s: nominated %s (%d of %d clusters could place it)", w->ns, w->name,
        best, k, n);
    inflight *f = fl_find(d, w->uid);
    if (f == NULL && d->nfl < INFLIGHT_MAX)
        f = &d->fl[d->nfl++];
    else if (f != NULL)
        json_decref(f->pod);
    if (f != NULL) {
        memset(f, 0, sizeof(*f));
        snprintf(f->uid, sizeof(f->uid), "%s", w->uid);
        snprintf(f->cluster, sizeof(f->cluster), "%s", best);
        f->pod = json_deep_copy(w->pod);
        f->count = w->count;
    }
}

/* Whether w's nomination still names a cluster it may use. */
static bool nomination_holds(const dsp_workload *w, const json_t *allowed)
{
    for (int i = 0; i < w->nnominated; i++)
        if (json_object_get(allowed, w->nominated[i]) != NULL)
            return true;
    return false;
}

/* Appends text to buf[0..len) at *at, cutting what does not fit. */
static void append(char *buf, size_t len, size_t *at, const char *text, char sep)
{
    size_t n = strlen(text);
    if (*at + n + 2 > len)
        return;
    memcpy(buf + *at, text, n);
    buf[*at + n] = sep;
    *at += n + 1;
    buf[*at] = '\0';
}

/* "check:cluster,cluster,;..." of the topology, cut to len. */
static void topology_signature(const json_t *topo, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    const char *check, *cluster;
    json_t *allowed, *v;
    json_object_foreach((json_t *)topo, check, allowed) {
        append(buf, len, &at, check, ':');
        json_object_foreach(allowed, cluster, v) {
            append(buf, len, &at, cluster, ',');
        }
        append(buf, len, &at, "", ';');
    }
}

static int cmp_workloads(const void *a, const void *b)
{
    return dsp_workload_cmp(a, b);
}

static void round_once(dispatcher *d)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    d->rounds++;
    if (d->bench_file[0]) {
        char *buf = NULL;
        size_t len = 0;
        dsp_bench *b = NULL;
        int rc;
        if (d->bench_server != NULL) {
            kgpu_http_resp resp = {0};
            rc = kgpu_k8s_request(d->bench_server, "GET", d->bench_path, NULL, NULL, &resp, &err);
            if (rc == 0 && resp.status != 200)
                rc = kgpu_error_set(&err, KGPU_EIO, "%s answered %ld", d->bench_file,
                                    resp.status);
            buf = resp.body;
            len = resp.len;
        } else {
            rc = kgpu_read_file_max(d->bench_file, 16u << 20, &buf, &len, &err);
        }
        if (rc == 0)
            b = dsp_bench_parse(buf, len, d->bench_file, &err);
        free(buf);
        if (b != NULL) {
            dsp_bench_free(d->bench);
            d->bench = b;
        } else {
            say(d, 0, "benchmarks: %s (the figures read before stay)", err.msg);
        }
    }
    json_t *topo = read_topology(d, &err);
    json_t *wls = topo ? list(d, "workloads", &err) : NULL;
    if (wls == NULL) {
        d->errors++;
        say(d, 0, "reading the manager: %s", err.msg);
        json_decref(topo);
        return;
    }
    /* A cluster that became Active, or went: every pause ends. */
    char sig[sizeof(d->topology)];
    topology_signature(topo, sig, sizeof(sig));
    if (strcmp(sig, d->topology) != 0) {
        d->nbo = 0;
        snprintf(d->topology, sizeof(d->topology), "%s", sig);
    }
    json_t *seen = json_object();
    size_t i, nw = json_array_size(wls), nwait = 0;
    dsp_workload *wait = calloc(nw + 1, sizeof(*wait));
    json_t *o;
    json_array_foreach(wls, i, o) {
        dsp_workload w;
        if (dsp_workload_read(o, topo, &w, &err) != 0) {
            say(d, 2, "%s", err.msg);
            continue;
        }
        json_object_set_new(seen, w.uid, json_boolean(w.cluster[0] != '\0'));
        if (w.waits && wait != NULL)
            wait[nwait++] = w;
    }
    /* Higher priority first, then the older: the order Kueue itself admits them. */
    qsort(wait, nwait, sizeof(*wait), cmp_workloads);
    double now = now_s();
    for (size_t k = 0; k < nwait; k++) {
        dsp_workload *w = &wait[k];
        const json_t *allowed = json_object_get(topo, w->check);
        if (w->nnominated > 0 && nomination_holds(w, allowed))
            continue; /* Kueue is trying it there */
        if (bo_pausing(d, w->uid, now))
            continue;
        dispatch_one(d, w, allowed);
    }
    bo_prune(d);
    free(wait);
    if (fl_prune(d, seen, now_s()) > 0)
        d->nbo = 0; /* room the dispatches in flight held is free: every pause ends */
    json_decref(seen);
    json_decref(wls);
    json_decref(topo);
}

/* ---- metrics ---- */

static void render(dispatcher *d)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return;
    fprintf(f, "# HELP kgpu_dispatcher_nominations_total Workloads nominated to a cluster; reason "
               "best: chosen among several that could place it, only: the one that could.\n"
               "# TYPE kgpu_dispatcher_nominations_total counter\n");
    for (int i = 0; i < d->clusters.n; i++) {
        fprintf(f, "kgpu_dispatcher_nominations_total{cluster=\"%s\",reason=\"best\"} %ld\n",
                d->clusters.v[i].name, d->rt[i].nominations_best);
        fprintf(f, "kgpu_dispatcher_nominations_total{cluster=\"%s\",reason=\"only\"} %ld\n",
                d->clusters.v[i].name, d->rt[i].nominations_only);
    }
    fprintf(f, "# HELP kgpu_dispatcher_cluster_up Whether the cluster's kgpu-extender answered "
               "its last estimate.\n# TYPE kgpu_dispatcher_cluster_up gauge\n");
    for (int i = 0; i < d->clusters.n; i++)
        fprintf(f, "kgpu_dispatcher_cluster_up{cluster=\"%s\"} %d\n", d->clusters.v[i].name,
                d->rt[i].up);
    fprintf(f, "# HELP kgpu_dispatcher_unplaceable_total Decisions that found no cluster able "
               "to place the workload.\n# TYPE kgpu_dispatcher_unplaceable_total counter\n"
               "kgpu_dispatcher_unplaceable_total %ld\n", d->unplaceable);
    fprintf(f, "# HELP kgpu_dispatcher_rounds_total Rounds over the manager's Workloads.\n"
               "# TYPE kgpu_dispatcher_rounds_total counter\nkgpu_dispatcher_rounds_total %ld\n",
            d->rounds);
    fprintf(f, "# HELP kgpu_dispatcher_errors_total Rounds that could not read the manager.\n"
               "# TYPE kgpu_dispatcher_errors_total counter\nkgpu_dispatcher_errors_total %ld\n",
            d->errors);
    fprintf(f, "# HELP kgpu_dispatcher_in_flight Dispatches not yet held by their cluster.\n"
               "# TYPE kgpu_dispatcher_in_flight gauge\nkgpu_dispatcher_in_flight %d\n", d->nfl);
    fprintf(f, "# HELP kgpu_dispatcher_estimate_seconds Time of one POST /estimate.\n"
               "# TYPE kgpu_dispatcher_estimate_seconds histogram\n");
    for (int b = 0; b < BUCKETS; b++)
        fprintf(f, "kgpu_dispatcher_estimate_seconds_bucket{le=\"%g\"} %ld\n", bucket_le[b],
                d->est_bucket[b]);
    fprintf(f, "kgpu_dispatcher_estimate_seconds_bucket{le=\"+Inf\"} %ld\n"
               "kgpu_dispatcher_estimate_seconds_sum %.6f\nkgpu_dispatcher_estimate_seconds_count "
               "%ld\n", d->est_count, d->est_sum, d->est_count);
    fclose(f);
    pthread_mutex_lock(&d->mu);
    free(d->metrics_text);
    d->metrics_text = buf;
    pthread_mutex_unlock(&d->mu);
}

/* /metrics for the text server: the last rendering (under mu). */
static char *serve_metrics(void *ctx, const char *path)
{
    dispatcher *d = ctx;
    if (strcmp(path, "/metrics") != 0)
        return NULL;
    pthread_mutex_lock(&d->mu);
    char *text = strdup(d->metrics_text ? d->metrics_text : "");
    pthread_mutex_unlock(&d->mu);
    return text;
}

/* ---- start ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kgpu-dispatcher --clusters FILE [--kubeconfig FILE] [options]\n"
            "Kueue MultiKueue's external dispatcher: nominates, for each Workload waiting on\n"
            "the manager cluster, the worker cluster whose kgpu places it best.\n"
            "  --clusters FILE        the worker clusters and their kgpu-extenders\n"
            "  --kubeconfig FILE      the manager cluster (default: in-cluster service account)\n"
            "  --benchmarks FILE|URL  kgpu_workload_throughput figures (exposition text: a\n"
            "                         file, or e.g. a central Prometheus's /federate), read\n"
            "                         each round\n"
            "  --table FILE           static workload/GPU-type table: the preference of\n"
            "                         workloads that state none\n"
            "  --interval SECONDS     between rounds (default 2; 0.1..600)\n"
            "  --listen ADDR:PORT     serve /metrics and /healthz (default off)\n"
            "  --once                 one round, then exit (0: the manager was read)\n"
            "  --log-level LEVEL      warn, info (default) or debug\n"
            "  --help                 this text\n");
}

static int load_table(dispatcher *d, kgpu_error *err)
{
    char *buf;
    size_t len;
    int rc = kgpu_read_file_max(d->table_file, 16u << 20, &buf, &len, err);
    if (rc != 0)
        return rc;
    d->table = dsp_table_parse(buf, len, d->table_file, err);
    free(buf);
    return d->table != NULL ? 0 : -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"clusters", required_argument, NULL, 'c'},  {"kubeconfig", required_argument, NULL, 'k'},
        {"benchmarks", required_argument, NULL, 'b'}, {"table", required_argument, NULL, 't'},
        {"interval", required_argument, NULL, 'i'},  {"listen", required_argument, NULL, 'l'},
        {"once", no_argument, NULL, 'o'},            {"log-level", required_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    static dispatcher d;
    d.log_level = 1;
    pthread_mutex_init(&d.mu, NULL);
    const char *clusters = NULL, *kubeconfig = NULL, *listen = NULL;
    double interval = 2;
    bool once = false;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c': clusters = optarg; break;
        case 'k': kubeconfig = optarg; break;
        case 'b': snprintf(d.bench_file, sizeof(d.bench_file), "%s", optarg); break;
        case 't': snprintf(d.table_file, sizeof(d.table_file), "%s", optarg); break;
        case 'l': listen = optarg; break;
        case 'o': once = true; break;
        case 'i':
            interval = strtod(optarg, &end);
            if (end == optarg || *end || !(interval >= 0.1 && interval <= 600)) {
                fprintf(stderr, "kgpu-dispatcher: --interval '%s': 0.1..600 seconds\n", optarg);
                return 2;
            }
            break;
        case 'v':
            d.log_level = strcmp(optarg, "warn") == 0 ? 0 : strcmp(optarg, "info") == 0 ? 1
                        : strcmp(optarg, "debug") == 0 ? 2 : -1;
            if (d.log_level < 0) {
                fprintf(stderr, "kgpu-dispatcher: --log-level '%s': warn, info or debug\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (clusters == NULL || optind != argc) {
        usage(stderr);
        return 2;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    kgpu_k8s_config kc = {0};
    int rc = kgpu_clusters_load_file(clusters, &d.clusters, &err);
    if (rc == 0 && d.table_file[0])
        rc = load_table(&d, &err);
    if (rc == 0)
        rc = kubeconfig ? kgpu_k8s_config_kubeconfig(kubeconfig, &kc, &err)
                        : kgpu_k8s_config_in_cluster(NULL, &kc, &err);
    if (rc == 0 && (d.manager = kgpu_k8s_new(&kc, &err)) == NULL)
        rc = -1;
    kgpu_k8s_config_clear(&kc);
    for (int i = 0; rc == 0 && i < d.clusters.n; i++) {
        const kgpu_cluster_entry *e = &d.clusters.v[i];
        kgpu_k8s_config ec = {.timeout_ms = 5000};
        snprintf(ec.server, sizeof(ec.server), "%s", e->extender);
        snprintf(ec.ca_file, sizeof(ec.ca_file), "%s", e->ca);
        snprintf(ec.cert_file, sizeof(ec.cert_file), "%s", e->cert);
        snprintf(ec.key_file, sizeof(ec.key_file), "%s", e->key);
        if ((d.rt[i].ext = kgpu_k8s_new(&ec, &err)) == NULL)
            rc = -1;
    }
    if (rc == 0 && (strncmp(d.bench_file, "http://", 7) == 0 ||
                    strncmp(d.bench_file, "https://", 8) == 0)) {
        /* A URL, e.g. a central Prometheus's /federate?match[]=...: its server and path. */
        const char *slash = strchr(strstr(d.bench_file, "://") + 3, '/');
        kgpu_k8s_config bc = {.timeout_ms = 10000};
        size_t n = slash ? (size_t)(slash - d.bench_file) : strlen(d.bench_file);
        if (n >= sizeof(bc.server))
            rc = kgpu_error_set(&err, KGPU_EINVAL, "--benchmarks: URL too long");
        else {
            memcpy(bc.server, d.bench_file, n);
            d.bench_path = slash ? slash : "/";
            if ((d.bench_server = kgpu_k8s_new(&bc, &err)) == NULL)
                rc = -1;
        }
    }
    d.fl = rc == 0 ? calloc(INFLIGHT_MAX, sizeof(*d.fl)) : NULL;
    d.bo = rc == 0 ? calloc(BACKOFF_MAX, sizeof(*d.bo)) : NULL;
    if (rc == 0 && (d.fl == NULL || d.bo == NULL))
        rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    kgpu_textserver *m = NULL;
    if (rc == 0 && listen != NULL &&
        (m = kgpu_textserver_start(listen, serve_metrics, &d, &err)) == NULL)
        rc = -1;
    if (rc != 0) {
        fprintf(stderr, "kgpu-dispatcher: %s\n", err.msg);
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    say(&d, 1, "%d worker clusters; a round every %g s", d.clusters.n, interval);
    int status = 0;
    while (!stopping) {
        long errors = d.errors;
        round_once(&d);
        render(&d);
        if (once) {
            status = d.errors > errors ? 1 : 0;
            break;
        }
        for (double slept = 0; slept < interval && !stopping; slept += 0.1)
            usleep(100000);
    }
    kgpu_textserver_stop(m);
    for (int i = 0; i < d.clusters.n; i++)
        kgpu_k8s_free(d.rt[i].ext);
    while (d.nfl > 0)
        fl_drop(&d, d.nfl - 1);
    free(d.fl);
    free(d.bo);
    kgpu_k8s_free(d.manager);
    kgpu_k8s_free(d.bench_server);
    dsp_bench_free(d.bench);
    dsp_table_free(d.table);
    free(d.metrics_text);
    return status;
}
