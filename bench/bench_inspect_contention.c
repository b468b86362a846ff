/*
 * Does an observer slow scheduling? kgpu-extender with a 5,000-node,
 * 40,000-GPU cluster holding 10,000 pods; one client sends filter calls
 * (500 node names each, as kube-scheduler does for 5,000 nodes) back to
 * back, first alone, then while other clients render GET /inspect (and then
 * GET /metrics) over and over. Prints filter latency p50/p99/max per phase
 * and how long each render took. Asserts nothing: a figure, not a test.
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

#define NODES       5000
#define GPUS        8
#define PODS        10000
#define CANDIDATES  500
#define MAX_SAMPLES 1000000
#define BODY_MAX    (CANDIDATES * 16 + 1024)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t count_bytes(char *p, size_t s, size_t n, void *u)
{
    (void)p;
    *(size_t *)u += s * n;
    return s * n;
}

static unsigned long long splitmix(unsigned long long *x)
{
    unsigned long long z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
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
                       pod, pod, shapes[splitmix(seed) % 4]);
    for (int i = 0; i < n; i++)
        off += snprintf(buf + off, len - (size_t)off, "%s\"node-%04d\"", i ? "," : "",
                        i == 0 ? first : (int)(splitmix(seed) % NODES));
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
    double t0 = now();
    CURLcode rc = curl_easy_perform(h);
    double dt = now() - t0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    if (rc != CURLE_OK)
        *status = -1;
    if (bytes != NULL)
        *bytes = got;
    return dt;
}

typedef struct observer {
    int port;
    const char *path; /* "/inspect" or "/metrics" */
    atomic_bool *stop;
    long renders, errors;
    double seconds, longest;
    size_t bytes;
} observer;

static void *observe(void *arg)
{
    observer *o = arg;
    CURL *h = client();
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", o->port, o->path);
    while (!atomic_load(o->stop)) {
        long st;
        size_t bytes;
        double dt = call(h, url, NULL, &st, &bytes);
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
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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
    double until = now() + seconds;
    while (now() < until && n < MAX_SAMPLES) {
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
    qsort(lat, (size_t)n, sizeof(double), cmp);
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
    char dir[] = "/tmp/kgpu-bench-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char cluster[128], portfile[128];
    snprintf(cluster, sizeof(cluster), "%s/cluster.yaml", dir);
    snprintf(portfile, sizeof(portfile), "%s/port", dir);
    FILE *f = fopen(cluster, "w");
    if (f == NULL)
        return 1;
    fprintf(f, "nodes:\n");
    for (int i = 0; i < NODES; i++) {
        fprintf(f, "- name: node-%04d\n  gpus:\n", i);
        for (int g = 0; g < GPUS; g++)
            fprintf(f, "  - {index: %d, uuid: GPU-%04d-%d, model: %s, memory_mib: %d, numa: %d}\n",
                    g, i, g, i % 3 ? "A100-SXM4-80GB" : "V100-SXM2-32GB", i % 3 ? 81920 : 32768,
                    g / 4);
    }
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[1], argv[1], "--cluster-file", cluster, "--listen", "127.0.0.1:0", "--port-file",
              portfile, "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    int port = 0;
    for (int i = 0; i < 600 && port == 0; i++) {
        usleep(50000);
        FILE *p = fopen(portfile, "r");
        if (p) {
            if (fscanf(p, "%d", &port) != 1)
                port = 0;
            fclose(p);
        }
    }
    if (port == 0) {
        fprintf(stderr, "bench_inspect_contention: the extender did not start\n");
        kill(pid, SIGTERM);
        return 1;
    }
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
    double t0 = now();
    for (int pod = 0; pod < PODS; pod++) {
        int node = (int)(splitmix(&seed) % NODES);
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
           PODS, now() - t0);
    /* Filter bodies made up front, for pods never bound (new uids). */
    enum { BODIES = 64 };
    char *bodies[BODIES];
    for (int i = 0; i < BODIES; i++) {
        bodies[i] = malloc(BODY_MAX);
        make_args(bodies[i], BODY_MAX, &seed, 1000000 + i, (int)(splitmix(&seed) % NODES),
                  CANDIDATES);
    }
    phase(port, seconds, NULL, 0, bodies, BODIES);
    phase(port, seconds, "/inspect", nobs, bodies, BODIES);
    phase(port, seconds, "/metrics", nobs, bodies, BODIES);
    phase(port, seconds, NULL, 0, bodies, BODIES);
    for (int i = 0; i < BODIES; i++)
        free(bodies[i]);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(cluster);
    unlink(portfile);
    rmdir(dir);
    curl_global_cleanup();
    return 0;
}
