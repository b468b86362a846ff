/*
 * Does an observer slow scheduling? kgpu-extender with a 5,000-node,
 * 40,000-GPU cluster holding 10,000 pods; one client sends filter calls
 * (500 node names each, as kube-scheduler does for 5,000 nodes) back to
 * back, first alone, then while other clients render GET /inspect (then
 * GET /metrics, then POST /estimate, kgpu-dispatcher's question: 4 pods of
 * 4 shapes, 16 copies each, 8 dispatches in flight) over and over. Prints
 * filter latency p50/p99/max per phase and how long each render took.
 * Asserts nothing: a figure, not a test.
 *
 *   bench_inspect_contention PATH/TO/kgpu-extender [SECONDS] [OBSERVER_THREADS]
 *
 * On a machine with few cores the observers also compete with filter for
 * CPU; the figure that says whether filter waits for the state lock is the
 * p99 and max next to one render's duration (a filter that waited for a
 * render under the lock takes about as long as the render).
 */
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "extender_bench.h"

#define NODES       5000
#define GPUS        8
#define PODS        10000
#define CANDIDATES  500
#define MAX_SAMPLES 1000000
#define BODY_MAX    (CANDIDATES * 16 + 1024)

static size_t count_bytes(char *p, size_t s, size_t n, void *u)
{
    (void)p;
    *(size_t *)u += s * n;
    return s * n;
}

static const char *const shapes[] = {"\"kgpu.io/gpu-mem\":\"8\"",
                                     "\"kgpu.io/gpu-mem\":\"16\",\"kgpu.io/gpu-core\":\"50\"",
                                     "\"nvidia.com/gpu\":\"1\"", "\"kgpu.io/gpu-mem\":\"4\""};

/* ExtenderArgs for pod `pod` naming `n` nodes: `first` then random ones. */
static int make_args(char *buf, size_t len, unsigned long long *seed, int pod, int first, int n)
{
    int off = snprintf(buf, len,
                       "{\"Pod\":{\"metadata\":{\"name\":\"bench-%d\",\"namespace\":\"bench\","
                       "\"uid\":\"bench-uid-%d\"},\"spec\":{\"containers\":[{\"name\":\"main\","
                       "\"resources\":{\"limits\":{%s}}}]}},\"Nodes\":null,\"NodeNames\":[",
                       pod, pod, shapes[bench_splitmix(seed) % 4]);
    for (int i = 0; i < n; i++)
        off += snprintf(buf + off, len - (size_t)off, "%s\"node-%04d\"", i ? "," : "",
                        i == 0 ? first : (int)(bench_splitmix(seed) % NODES));
    off += snprintf(buf + off, len - (size_t)off, "]}");
    return off;
}

static CURL *client(void)
{
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, count_bytes);
    return h;
}

/* One call; its duration in seconds, *status its HTTP status (-1: transport error). */
static double call(CURL *h, const char *url, const char *body, long *status, size_t *bytes)
{
    size_t got = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
    if (body != NULL)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    else
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    double t0 = bench_now();
    CURLcode rc = curl_easy_perform(h);
    double dt = bench_now() - t0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    if (rc != CURLE_OK)
        *status = -1;
    if (bytes != NULL)
        *bytes = got;
    return dt;
}

typedef struct observer {
    int port;
    const char *path; /* "/inspect", "/metrics" or "/estimate" (POSTed ESTIMATE_BODY) */
    atomic_bool *stop;
    long renders, errors;
    double seconds, longest;
    size_t bytes;
} observer;

/* kgpu-dispatcher's question for one Workload, with the dispatches in flight reserved. */
#define ESTIMATE_POD(lim)                                                                          \
    "{\"pod\":{\"spec\":{\"containers\":[{\"name\":\"m\",\"resources\":{\"limits\":{" lim   \
    "}}}]}},\"count\":"
static const char ESTIMATE_BODY[] =
    "{\"pods\":[" ESTIMATE_POD("\"kgpu.io/gpu-mem\":\"8\"") "16},"
    ESTIMATE_POD("\"kgpu.io/gpu-mem\":\"16\",\"kgpu.io/gpu-core\":\"50\"") "16},"
    ESTIMATE_POD("\"nvidia.com/gpu\":\"1\"") "16},"
    ESTIMATE_POD("\"nvidia.com/gpu\":\"4\"") "16}],"
    "\"reserve\":[" ESTIMATE_POD("\"nvidia.com/gpu\":\"2\"") "8}]}";

static void *observe(void *arg)
{
    observer *o = arg;
    CURL *h = client();
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", o->port, o->path);
    bool post = strcmp(o->path, "/estimate") == 0;
    struct curl_slist *hdr = post ? curl_slist_append(NULL, "Content-Type: application/json")
                                  : NULL;
    if (post)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    while (!atomic_load(o->stop)) {
        long st;
        size_t bytes;
        double dt = call(h, url, post ? ESTIMATE_BODY : NULL, &st, &bytes);
        if (st != 200) {
            o->errors++;
            continue;
        }
        o->renders++;
        o->seconds += dt;
        o->bytes = bytes;
        if (dt > o->longest)
            o->longest = dt;
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    return NULL;
}

/* Filters back to back for `seconds` with observers on `path` (NULL: none); prints a line. */
static void phase(int port, double seconds, const char *path, int nobs, char **bodies, int nbodies)
{
    static double lat[MAX_SAMPLES];
    atomic_bool stop = false;
    observer *obs = calloc((size_t)nobs + 1, sizeof(*obs));
    pthread_t *tids = calloc((size_t)nobs + 1, sizeof(*tids));
    for (int i = 0; path != NULL && i < nobs; i++) {
        obs[i] = (observer){.port = port, .path = path, .stop = &stop};
        pthread_create(&tids[i], NULL, observe, &obs[i]);
    }
    if (path != NULL)
        usleep(200000); /* the observers are rendering when the first filter goes out */
    CURL *h = client();
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/filter", port);
    long n = 0, errors = 0;
    double until = bench_now() + seconds;
    while (bench_now() < until && n < MAX_SAMPLES) {
        long st;
        lat[n] = call(h, url, bodies[n % nbodies], &st, NULL);
        errors += st != 200;
        n++;
    }
    atomic_store(&stop, true);
    for (int i = 0; path != NULL && i < nobs; i++)
        pthread_join(tids[i], NULL);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    qsort(lat, (size_t)n, sizeof(double), bench_cmp_double);
    /* One client waits once per stall: the calls over 100 ms and the time spent in them. */
    long slow = 0;
    double stalled = 0;
    for (long i = 0; i < n; i++)
        if (lat[i] > 0.1) {
            slow++;
            stalled += lat[i];
        }
    printf("filter (%d names)%s%-8s: %6ld calls, errors %ld; p50 %8.3f ms, p99 %8.3f ms, "
           "p99.9 %8.3f ms, max %8.3f ms; %ld over 100 ms (%.1f s of %.0f s)",
           CANDIDATES, path ? " while rendering " : " alone", path ? path : "", n, errors,
           n ? lat[n / 2] * 1e3 : 0, n ? lat[n * 99 / 100] * 1e3 : 0,
           n ? lat[n * 999 / 1000] * 1e3 : 0, n ? lat[n - 1] * 1e3 : 0, slow, stalled, seconds);
    long renders = 0, rerrors = 0;
    double rsec = 0, longest = 0;
    size_t bytes = 0;
    for (int i = 0; path != NULL && i < nobs; i++) {
        renders += obs[i].renders;
        rerrors += obs[i].errors;
        rsec += obs[i].seconds;
        bytes = obs[i].bytes;
        if (obs[i].longest > longest)
            longest = obs[i].longest;
    }
    if (path != NULL)
        printf("; %d observer%s: %ld renders (errors %ld) of %.1f MB, mean %.0f ms, longest "
               "%.0f ms",
               nobs, nobs == 1 ? "" : "s", renders, rerrors, (double)bytes / 1e6,
               renders ? rsec / (double)renders * 1e3 : 0, longest * 1e3);
    printf("\n");
    fflush(stdout);
    free(obs);
    free(tids);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_inspect_contention PATH/TO/kgpu-extender [SECONDS] "
                        "[OBSERVER_THREADS]\n");
        return 2;
    }
    double seconds = argc > 2 ? atof(argv[2]) : 10;
    int nobs = argc > 3 ? atoi(argv[3]) : 1;
    if (seconds <= 0 || nobs < 1 || nobs > 16)
        return 2;
    char dir[64];
    int port;
    pid_t pid = bench_start_extender(argv[1], NODES, GPUS, NULL, "error", dir, sizeof(dir), &port);
    if (pid < 0)
        return 1;
    curl_global_init(CURL_GLOBAL_ALL);
    /* The state: PODS pods, each filtered on one node and bound there. */
    CURL *h = client();
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    static char body[BODY_MAX];
    unsigned long long seed = 1;
    char furl[128], burl[128];
    snprintf(furl, sizeof(furl), "http://127.0.0.1:%d/filter", port);
    snprintf(burl, sizeof(burl), "http://127.0.0.1:%d/bind", port);
    int bound = 0;
    double t0 = bench_now();
    for (int pod = 0; pod < PODS; pod++) {
        int node = (int)(bench_splitmix(&seed) % NODES);
        make_args(body, sizeof(body), &seed, pod, node, 1);
        long st;
        call(h, furl, body, &st, NULL);
        char bind[256];
        snprintf(bind, sizeof(bind),
                 "{\"PodName\":\"bench-%d\",\"PodNamespace\":\"bench\",\"PodUID\":\"bench-uid-%d\","
                 "\"Node\":\"node-%04d\"}",
                 pod, pod, node);
        size_t got;
        call(h, burl, bind, &st, &got);
        bound += st == 200 && got == sizeof("{\"Error\":\"\"}") - 1;
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    printf("state: %d nodes, %d GPUs, %d of %d pods bound in %.1f s\n", NODES, NODES * GPUS, bound,
           PODS, bench_now() - t0);
    /* Filter bodies made up front, for pods never bound (new uids). */
    enum { BODIES = 64 };
    char *bodies[BODIES];
    for (int i = 0; i < BODIES; i++) {
        bodies[i] = malloc(BODY_MAX);
        make_args(bodies[i], BODY_MAX, &seed, 1000000 + i, (int)(bench_splitmix(&seed) % NODES),
                  CANDIDATES);
    }
    phase(port, seconds, NULL, 0, bodies, BODIES);
    phase(port, seconds, "/inspect", nobs, bodies, BODIES);
    phase(port, seconds, "/metrics", nobs, bodies, BODIES);
    phase(port, seconds, "/estimate", nobs, bodies, BODIES);
    phase(port, seconds, NULL, 0, bodies, BODIES);
    for (int i = 0; i < BODIES; i++)
        free(bodies[i]);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    bench_remove_scratch(dir);
    curl_global_cleanup();
    return 0;
}
