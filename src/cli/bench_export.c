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
 * outside input: only a regular file, not through a link, up to 4 KiB;
 * anything but one finite number >= 0 leaves the figure out and counts
 * kgpu_workload_benchmark_errors_total.
 *
 * Threads: the text server's thread answers (textserve.h); the main
 * thread waits for SIGTERM. The counter is atomic.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "textserve.h"

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

/*
 * The workload's figure; false when there is none to show (counted unless
 * absent). The file is the workload's: a link is not followed, and only a
 * regular file is read (a FIFO would hold the scrape, a device spill).
 */
static bool read_value(exporter *x, double *v, double *mtime)
{
    int fd = open(x->file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return false; /* not written yet: nothing to show, no error */
    struct stat st;
    char buf[RESULT_MAX + 1];
    ssize_t n = -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        n = read(fd, buf, sizeof(buf));
        *mtime = (double)st.st_mtime;
    }
    if (fd >= 0)
        close(fd);
    bool ok = n > 0 && n <= RESULT_MAX;
    if (ok) {
        buf[n] = '\0';
        char *end;
        errno = 0;
        *v = strtod(buf, &end);
        while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r')
            end++;
        ok = end != buf && *end == '\0' && errno == 0 && isfinite(*v) && *v >= 0 &&
             memchr(buf, '\0', (size_t)n) == NULL;
    }
    if (!ok)
        atomic_fetch_add(&x->errors, 1);
    return ok;
}

/* /metrics for the text server: the figure as the file holds it now. */
static char *metrics(void *ctx, const char *path)
{
    exporter *x = ctx;
    if (strcmp(path, "/metrics") != 0)
        return NULL;
    double v = 0, mtime = 0;
    bool have = read_value(x, &v, &mtime);
    size_t len = 4096;
    char *text = malloc(len);
    if (text == NULL)
        return NULL;
    int o = snprintf(text, len,
                     "# HELP kgpu_workload_throughput The workload's throughput on this GPU "
                     "model, in its own unit per second (higher is better).\n"
                     "# TYPE kgpu_workload_throughput gauge\n");
    if (have)
        o += snprintf(text + o, len - (size_t)o, "kgpu_workload_throughput{%s} %.17g\n",
                      x->labels, v);
    o += snprintf(text + o, len - (size_t)o,
                  "# HELP kgpu_workload_benchmark_last_write_timestamp_seconds When the "
                  "workload last wrote its figure.\n"
                  "# TYPE kgpu_workload_benchmark_last_write_timestamp_seconds gauge\n");
    if (have)
        o += snprintf(text + o, len - (size_t)o,
                      "kgpu_workload_benchmark_last_write_timestamp_seconds{%s} %.0f\n",
                      x->labels, mtime);
    snprintf(text + o, len - (size_t)o,
             "# HELP kgpu_workload_benchmark_errors_total Reads of the figure that found no "
             "finite number >= 0.\n"
             "# TYPE kgpu_workload_benchmark_errors_total counter\n"
             "kgpu_workload_benchmark_errors_total{%s} %ld\n",
             x->labels, atomic_load(&x->errors));
    return text;
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
    if (!esc(workload, w, sizeof(w)) || !esc(model, m, sizeof(m)) ||
        !esc(cluster, cl, sizeof(cl))) {
        fprintf(stderr, "kgpu bench-export: --workload, --gpu-model and --cluster: at most 120 "
                        "characters each\n");
        return 2;
    }
    snprintf(x.labels, sizeof(x.labels), "workload=\"%s\",gpu_model=\"%s\",cluster=\"%s\"", w, m,
             cl);
    kgpu_error err;
    kgpu_textserver *d = kgpu_textserver_start(listen, metrics, &x, &err);
    if (d == NULL) {
        fprintf(stderr, "kgpu bench-export: --listen %s\n", err.msg);
        return err.code == KGPU_EINVAL ? 2 : 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    fprintf(stderr, "kgpu bench-export: serving %s's figure from %s on %s\n", workload, file,
            listen);
    while (!stop)
        usleep(100000);
    kgpu_textserver_stop(d);
    return 0;
}
