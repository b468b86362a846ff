/*
 * `kgpu bench-export`: the sidecar of a workload benchmark (the chart's
 * benchmarks Jobs, docs/multicluster.md "Benchmarks per GPU model"). It
 * serves /metrics for Prometheus with one figure,
 *
 *   kgpu_workload_throughput{workload="W",gpu_model="M",cluster="C"} V
 *
 * where W, M and C come from its flags (set by the chart, never by the
 * workload) and V is the number the workload writes into a file of a
 * shared folder (--file), read again at every scrape. The workload is
 * outside input: the file is read up to 4 KiB, and anything but one finite
 * number >= 0 leaves the figure out and counts
 * kgpu_workload_benchmark_errors_total.
 *
 * Threads: libmicrohttpd's one polling thread answers; the main thread
 * waits for SIGTERM. The counter is atomic.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define RESULT_MAX 4096

typedef struct exporter {
    const char *file;
    char labels[900]; /* workload="..",gpu_model="..",cluster=".." escaped */
    atomic_long errors;
} exporter;

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* Prometheus label value escaping (\\, ", newline) into out; false when too long. */
static bool esc(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s; s++) {
        const char *r = *s == '\\' ? "\\\\" : *s == '"' ? "\\\"" : *s == '\n' ? "\\n" : NULL;
        size_t n = r ? 2 : 1;
        if (o + n + 1 > len)
            return false;
        if (r)
            memcpy(out + o, r, 2);
        else
            out[o] = *s;
        o += n;
    }
    out[o] = '\0';
    return true;
}

/* The workload's figure; false when there is none to show (counted unless absent). */
static bool read_value(exporter *x, double *v, double *mtime)
{
    FILE *f = fopen(x->file, "r");
    if (f == NULL)
        return false; /* not written yet: nothing to show, no error */
    char buf[RESULT_MAX + 1];
    size_t n = fread(buf, 1, sizeof(buf), f);
    struct stat st;
    *mtime = fstat(fileno(f), &st) == 0 ? (double)st.st_mtime : 0;
    fclose(f);
    bool ok = n > 0 && n <= RESULT_MAX;
    if (ok) {
        buf[n] = '\0';
        char *end;
        errno = 0;
        *v = strtod(buf, &end);
        while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r')
            end++;
        ok = end != buf && *end == '\0' && errno == 0 && isfinite(*v) && *v >= 0;
    }
    if (!ok)
        atomic_fetch_add(&x->errors, 1);
    return ok;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **con_cls)
{
    (void)version;
    (void)upload;
    (void)con_cls;
    exporter *x = cls;
    if (*upload_len != 0)
        return MHD_NO;
    char *text = NULL;
    unsigned status = 200;
    if (strcmp(method, "GET") != 0) {
        status = 405;
        text = strdup("method not allowed\n");
    } else if (strcmp(url, "/healthz") == 0) {
        text = strdup("ok\n");
    } else if (strcmp(url, "/metrics") == 0) {
        double v = 0, mtime = 0;
        bool have = read_value(x, &v, &mtime);
        size_t len = 2048;
        text = malloc(len);
        if (text != NULL) {
            int o = snprintf(text, len,
                             "# HELP kgpu_workload_throughput The workload's throughput on this "
                             "GPU model, in its own unit per second (higher is better).\n"
                             "# TYPE kgpu_workload_throughput gauge\n");
            if (have)
                o += snprintf(text + o, len - (size_t)o, "kgpu_workload_throughput{%s} %.17g\n",
                              x->labels, v);
            o += snprintf(text + o, len - (size_t)o,
                          "# HELP kgpu_workload_benchmark_last_write_timestamp_seconds When "
                          "the workload last wrote its figure.\n"
                          "# TYPE kgpu_workload_benchmark_last_write_timestamp_seconds gauge\n");
            if (have)
                o += snprintf(text + o, len - (size_t)o,
                              "kgpu_workload_benchmark_last_write_timestamp_seconds{%s} %.0f\n",
                              x->labels, mtime);
            snprintf(text + o, len - (size_t)o,
                     "# HELP kgpu_workload_benchmark_errors_total Reads of the figure that "
                     "found no finite number >= 0.\n"
                     "# TYPE kgpu_workload_benchmark_errors_total counter\n"
                     "kgpu_workload_benchmark_errors_total{%s} %ld\n",
                     x->labels, atomic_load(&x->errors));
        }
    } else {
        status = 404;
        text = strdup("not found\n");
    }
    if (text == NULL)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kgpu bench-export --file PATH --workload NAME --gpu-model MODEL\n"
               "                         --cluster NAME [--listen ADDR:PORT]\n"
               "Serves /metrics with kgpu_workload_throughput{workload,gpu_model,cluster}: the\n"
               "number a benchmark writes into --file, read at each scrape (the sidecar of the\n"
               "chart's benchmarks Jobs). --listen defaults to 0.0.0.0:9402.\n");
}

int kgpu_cmd_bench_export(int argc, char **argv)
{
    static const struct option opts[] = {
        {"file", required_argument, NULL, 'f'},      {"workload", required_argument, NULL, 'w'},
        {"gpu-model", required_argument, NULL, 'm'}, {"cluster", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},    {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *file = NULL, *workload = NULL, *model = NULL, *cluster = NULL;
    const char *listen = "0.0.0.0:9402";
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'f': file = optarg; break;
        case 'w': workload = optarg; break;
        case 'm': model = optarg; break;
        case 'c': cluster = optarg; break;
        case 'l': listen = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!file || !workload || !model || !cluster || optind < argc || !*workload || !*model) {
        usage(stderr);
        return 2;
    }
    static exporter x;
    x.file = file;
    char w[256], m[256], cl[256];
    if (!esc(workload, w, sizeof(w)) || !esc(model, m, sizeof(m)) || !esc(cluster, cl, sizeof(cl))) {
        fprintf(stderr, "kgpu bench-export: --workload, --gpu-model and --cluster: at most 120 "
                        "characters each\n");
        return 2;
    }
    snprintf(x.labels, sizeof(x.labels), "workload=\"%s\",gpu_model=\"%s\",cluster=\"%s\"", w, m,
             cl);
    const char *colon = strrchr(listen, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    char host[64];
    snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - listen) : 0, listen);
    if (colon == NULL || port < 0 || port > 65535 || *end ||
        (host[0] && inet_pton(AF_INET, host, &sa.sin_addr) != 1)) {
        fprintf(stderr, "kgpu bench-export: --listen '%s': an IPv4 address and a port\n", listen);
        return 2;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port, NULL, NULL, answer,
        &x, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, 32u,
        MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (d == NULL) {
        fprintf(stderr, "kgpu bench-export: cannot serve on %s\n", listen);
        return 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    fprintf(stderr, "kgpu bench-export: serving %s's figure from %s on %s\n", workload, file,
            listen);
    while (!stop)
        usleep(100000);
    MHD_stop_daemon(d);
    return 0;
}
