/*
 * kgpu-extender under load, over loopback HTTP, as kube-scheduler drives it:
 * a 5,000-node, 40,000-GPU cluster (a quarter of its GPUs already shared),
 * and for each pod a filter then a prioritize call naming 500 nodes
 * (kube-scheduler's cap for 5,000 nodes, nodeCacheCapable). Prints latency
 * percentiles per call, calls per second, and the extender's resident memory.
 * Asserts nothing.
 *
 *   bench_extender PATH/TO/kgpu-extender [SECONDS] [CLIENT_THREADS] [POLICY]
 *
 * POLICY is the extender's default policy for the run (default: its own
 * default); run it once per policy to compare them on the same machine.
 */
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "extender_bench.h"

#define NODES       5000
#define GPUS        8
#define CANDIDATES  500
#define MAX_SAMPLES 4000000

static size_t sink(char *p, size_t s, size_t n, void *u)
{
    return s * n;
}

typedef struct worker {
    int port, id;
    double until;
    double *lat; /* seconds per call */
    long n;
    long errors;
} worker;

/* ExtenderArgs for one pod and 500 random candidate nodes. */
static int make_args(char *buf, size_t len, unsigned long long *seed, int pod)
{
    static const char *shapes[] = {"\"kgpu.io/gpu-mem\":\"8\"",
                                   "\"kgpu.io/gpu-mem\":\"16\",\"kgpu.io/gpu-core\":\"50\"",
                                   "\"nvidia.com/gpu\":\"1\"", "\"kgpu.io/gpu-mem\":\"4\""};
    int off = snprintf(buf, len,
                       "{\"Pod\":{\"metadata\":{\"name\":\"bench-%d\",\"namespace\":\"bench\","
                       "\"uid\":\"bench-uid-%d\"},\"spec\":{\"containers\":[{\"name\":\"main\","
                       "\"resources\":{\"limits\":{%s}}}]}},\"Nodes\":null,\"NodeNames\":[",
                       pod, pod, shapes[bench_splitmix(seed) % 4]);
    for (int i = 0; i < CANDIDATES; i++)
        off += snprintf(buf + off, len - (size_t)off, "%s\"node-%04d\"", i ? "," : "",
                        (int)(bench_splitmix(seed) % NODES));
    off += snprintf(buf + off, len - (size_t)off, "]}");
    return off;
}

static double call(CURL *h, const char *url, const char *body, long *status)
{
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    double t0 = bench_now();
    CURLcode rc = curl_easy_perform(h);
    double dt = bench_now() - t0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    if (rc != CURLE_OK)
        *status = -1;
    return dt;
}

static void *run(void *arg)
{
    worker *w = arg;
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    char filter[128], prio[128];
    snprintf(filter, sizeof(filter), "http://127.0.0.1:%d/filter", w->port);
    snprintf(prio, sizeof(prio), "http://127.0.0.1:%d/prioritize", w->port);
    /* Bodies made up front: the client should spend its time on HTTP, not snprintf. */
    enum { BODIES = 64 };
    char *bodies[BODIES];
    unsigned long long seed = 1000 + (unsigned long long)w->id;
    for (int i = 0; i < BODIES; i++) {
        bodies[i] = malloc(CANDIDATES * 16 + 1024);
        make_args(bodies[i], CANDIDATES * 16 + 1024, &seed, w->id * 1000000 + i);
    }
    int pod = 0;
    while (bench_now() < w->until && w->n + 2 <= MAX_SAMPLES / 4) {
        const char *body = bodies[pod++ % BODIES];
        long st;
        w->lat[w->n++] = call(h, filter, body, &st);
        w->errors += st != 200;
        w->lat[w->n++] = call(h, prio, body, &st);
        w->errors += st != 200;
    }
    for (int i = 0; i < BODIES; i++)
        free(bodies[i]);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_extender PATH/TO/kgpu-extender [SECONDS] [THREADS] [POLICY]\n");
        return 2;
    }
    double seconds = argc > 2 ? atof(argv[2]) : 5;
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    const char *policy = argc > 4 ? argv[4] : NULL;
    if (seconds <= 0 || threads < 1 || threads > 64)
        return 2;
    char dir[64];
    const char *extra[] = {"--policy", policy, NULL};
    int port;
    pid_t pid = bench_start_extender(argv[1], NODES, GPUS, policy ? extra : NULL, "warn", dir,
                                     sizeof(dir), &port);
    if (pid < 0)
        return 1;
    curl_global_init(CURL_GLOBAL_ALL);
    /* Share a quarter of the GPUs first, through the extender's own filter + bind. */
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    static char body[CANDIDATES * 16 + 1024];
    unsigned long long seed = 1;
    char url[128];
    int bound = 0;
    double t0 = bench_now();
    for (int pod = 0; pod < 10000; pod++) {
        make_args(body, sizeof(body), &seed, pod);
        long st;
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/filter", port);
        call(h, url, body, &st);
        char bind[256];
        snprintf(bind, sizeof(bind),
                 "{\"PodName\":\"bench-%d\",\"PodNamespace\":\"bench\",\"PodUID\":\"bench-uid-%d\","
                 "\"Node\":\"node-%04d\"}",
                 pod, pod, (int)(bench_splitmix(&seed) % NODES));
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/bind", port);
        call(h, url, bind, &st);
        bound++;
    }
    curl_easy_cleanup(h);
    printf("policy: %s\n", policy ? policy : "the extender's default");
    printf("state: %d nodes, %d GPUs, %d pods bound in %.1f s\n", NODES, NODES * GPUS, bound,
           bench_now() - t0);
    printf("extender RSS with that state: %.1f MB\n", bench_rss_kb(pid, "VmRSS:") / 1024.0);

    /* Baseline in the same run: the HTTP round trip alone (GET /version, one client). */
    {
        CURL *b = curl_easy_init();
        curl_easy_setopt(b, CURLOPT_WRITEFUNCTION, sink);
        char vurl[96];
        snprintf(vurl, sizeof(vurl), "http://127.0.0.1:%d/version", port);
        curl_easy_setopt(b, CURLOPT_URL, vurl);
        enum { N = 3000 };
        static double lat[N];
        for (int i = 0; i < N; i++) {
            double t = bench_now();
            curl_easy_perform(b);
            lat[i] = bench_now() - t;
        }
        curl_easy_cleanup(b);
        qsort(lat, N, sizeof(double), bench_cmp_double);
        printf(
            "baseline, HTTP alone (GET /version, 1 client, %d calls): p50 %.3f ms, p99 %.3f ms\n",
            N, lat[N / 2] * 1e3, lat[N * 99 / 100] * 1e3);
    }
    /* Several rounds; medians are what to quote (the machine is shared and noisy). */
    enum { ROUNDS = 3 };
    double rate[ROUNDS], p50[ROUNDS], p99[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        worker *ws = calloc((size_t)threads, sizeof(*ws));
        pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
        double until = bench_now() + seconds;
        for (int i = 0; i < threads; i++) {
            ws[i] = (worker){.port = port, .id = i + 1 + round * 64, .until = until};
            ws[i].lat = malloc(sizeof(double) * (MAX_SAMPLES / 4));
            pthread_create(&tids[i], NULL, run, &ws[i]);
        }
        long total = 0, errors = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(tids[i], NULL);
            total += ws[i].n;
            errors += ws[i].errors;
        }
        double *all = malloc(sizeof(double) * (size_t)(total + 1));
        long k = 0;
        for (int i = 0; i < threads; i++) {
            memcpy(all + k, ws[i].lat, sizeof(double) * (size_t)ws[i].n);
            k += ws[i].n;
            free(ws[i].lat);
        }
        qsort(all, (size_t)total, sizeof(double), bench_cmp_double);
        rate[round] = total / seconds;
        p50[round] = total ? all[total / 2] * 1e3 : 0;
        p99[round] = total ? all[total * 99 / 100] * 1e3 : 0;
        printf(
            "round %d: %d client threads, %.0f s, filter+prioritize with %d node names: "
            "%ld calls (%.0f/s), errors %ld; p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n",
            round + 1, threads, seconds, CANDIDATES, total, rate[round], errors, p50[round],
            total ? all[total * 9 / 10] * 1e3 : 0, p99[round], total ? all[total - 1] * 1e3 : 0);
        free(all);
        free(ws);
        free(tids);
    }
    qsort(rate, ROUNDS, sizeof(double), bench_cmp_double);
    qsort(p50, ROUNDS, sizeof(double), bench_cmp_double);
    qsort(p99, ROUNDS, sizeof(double), bench_cmp_double);
    printf("median of %d rounds: %.0f calls/s (min %.0f, max %.0f), p50 %.3f ms, p99 %.3f ms "
           "(min %.3f, max %.3f)\n",
           ROUNDS, rate[1], rate[0], rate[2], p50[1], p99[1], p99[0], p99[2]);
    printf("extender RSS after load: %.1f MB (peak %.1f MB, reached while loading the cluster "
           "file)\n",
           bench_rss_kb(pid, "VmRSS:") / 1024.0, bench_rss_kb(pid, "VmHWM:") / 1024.0);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    bench_remove_scratch(dir);
    curl_global_cleanup();
    return 0;
}
