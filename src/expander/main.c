/*
 * kgpu-expander: flags, the TLS gRPC server (src/nodeagent grpcsrv.c) and a
 * log line per decision. The decision itself is service.c's.
 */
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "caexp.h"
#include "fileio.h"
#include "log.h"
#include "podspec.h"
#include "pricefile.h"
#include "grpcsrv.h"

#ifndef KGPU_VERSION
#define KGPU_VERSION "dev"
#endif

static const char usage[] =
    "usage: kgpu-expander --tls-cert FILE --tls-key FILE [flags]\n"
    "\n"
    "Cluster Autoscaler's gRPC expander (--expander=grpc): among the node groups it\n"
    "offers, kgpu chooses the one that really places the most pending GPU pods under\n"
    "its per-GPU packing, for the least cost, and offers none when no new node would\n"
    "take one (so no useless scale-up).\n"
    "\n"
    "  --listen ADDR         where to serve (default 0.0.0.0:8447)\n"
    "  --tls-cert FILE       PEM certificate chain served (Cluster Autoscaler refuses\n"
    "                        plaintext: give it the CA with --grpc-expander-cert)\n"
    "  --tls-key FILE        its PEM private key\n"
    "  --memory-unit QTY     one kgpu.io/gpu-mem unit, as the extender's memoryUnit\n"
    "                        (default 1Gi)\n"
    "  --prices FILE         prices per GPU-hour by GPU model and capacity type, and\n"
    "                        per core-hour (YAML or JSON, a prices: section); without\n"
    "                        it every group costs nothing and the one placing most wins\n"
    "  --gpu-hour-price X    what a GPU placed is worth per hour, in the prices'\n"
    "                        currency (default 1): weighs pods against node cost\n"
    "  --log-level LEVEL     debug, info, warn or error (default info)\n"
    "  --version, --help\n";

typedef struct expander_flags {
    char listen[256];
    const char *cert, *key, *prices_path;
    kgpu_prices prices;
    caexp_config cfg;
} expander_flags;



static atomic_bool stop;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop, true);
}

static void best_options(void *ctx, const char *method, const uint8_t *in, size_t len,
                         uint8_t **out, size_t *outlen, node_status *st)
{
    const expander_flags *f = ctx;
    if (strcmp(method, CAEXP_METHOD) != 0) {
        st->code = 12; /* UNIMPLEMENTED */
        snprintf(st->message, sizeof(st->message), "kgpu-expander serves %s only, not %s",
                 CAEXP_METHOD, method);
        return;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    caexp_decision d;
    int rc = caexp_best_options(&f->cfg, in, len, out, outlen, &d, &err);
    if (rc != 0) {
        /* INVALID_ARGUMENT, RESOURCE_EXHAUSTED: Cluster Autoscaler keeps its own choice. */
        st->code = rc == KGPU_ERANGE || rc == KGPU_ENOMEM ? 8 : 3;
        snprintf(st->message, sizeof(st->message), "%s", err.msg);
        kgpu_log(KGPU_LOG_WARN, "BestOptions refused: %s", err.msg);
        return;
    }
    if (d.chosen >= 0)
        kgpu_log(KGPU_LOG_INFO, "BestOptions: %d options; chose %s (%d of %d pending pods fit)",
                 d.options, d.group, d.placed, d.offered);
    else
        kgpu_log(KGPU_LOG_INFO,
                 "BestOptions: %d options; none: no new node would take a pending pod", d.options);
}

static int parse(int argc, char **argv, expander_flags *f)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"tls-cert", required_argument, NULL, 'c'},
        {"tls-key", required_argument, NULL, 'k'},
        {"memory-unit", required_argument, NULL, 'm'},
        {"gpu-hour-price", required_argument, NULL, 'p'},
        {"prices", required_argument, NULL, 'P'},
        {"log-level", required_argument, NULL, 'L'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        kgpu_log_level level;
        switch (c) {
        case 'l':
            if (strlen(optarg) >= sizeof(f->listen)) {
                fprintf(stderr, "kgpu-expander: --listen: too long\n");
                return 2;
            }
            snprintf(f->listen, sizeof(f->listen), "%s", optarg);
            break;
        case 'c':
            f->cert = optarg;
            break;
        case 'k':
            f->key = optarg;
            break;
        case 'm': {
            int64_t bytes;
            kgpu_error e;
            if (kgpu_quantity_value(optarg, &bytes, &e) != 0 || bytes < 1 << 20 ||
                bytes % (1 << 20) != 0 || bytes > (int64_t)1 << 40) {
                fprintf(stderr,
                        "kgpu-expander: --memory-unit '%s': expected whole MiB such as 1Gi or "
                        "512Mi\n",
                        optarg);
                return 2;
            }
            f->cfg.memory_unit_mib = bytes >> 20;
            break;
        }
        case 'p':
            f->cfg.pod_gpu_price = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(f->cfg.pod_gpu_price > 0) ||
                f->cfg.pod_gpu_price > 1e6) {
                fprintf(stderr, "kgpu-expander: --gpu-hour-price '%s': expected a number > 0\n",
                        optarg);
                return 2;
            }
            break;
        case 'P':
            f->prices_path = optarg;
            break;
        case 'L':
            if (kgpu_log_level_parse(optarg, &level) != 0) {
                fprintf(stderr, "kgpu-expander: --log-level '%s': expected debug, info, warn "
                                "or error\n",
                        optarg);
                return 2;
            }
            kgpu_log_set_level(level);
            break;
        case 'V':
            printf("kgpu-expander %s\n", KGPU_VERSION);
            return 1;
        case 'h':
            fputs(usage, stdout);
            return 1;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind < argc || f->cert == NULL || f->key == NULL) {
        fprintf(stderr, "kgpu-expander: %s\n%s",
                optind < argc ? "unexpected argument" : "--tls-cert and --tls-key are required",
                usage);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    expander_flags f = {.cfg = {.memory_unit_mib = 1024, .pod_gpu_price = 1}};
    snprintf(f.listen, sizeof(f.listen), "0.0.0.0:8447");
    kgpu_log_set_format(3, "kgpu-expander");
    int rc = parse(argc, argv, &f);
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    char *cert = NULL, *key = NULL;
    size_t n;
    kgpu_error err;
    kgpu_error_clear(&err);
    if (f.prices_path != NULL) {
        if (kgpu_prices_load_file(f.prices_path, &f.prices, &err) != 0) {
            fprintf(stderr, "kgpu-expander: %s\n", err.msg);
            return 1;
        }
        f.cfg.prices = &f.prices;
    }
    if (kgpu_read_file_max(f.cert, 1 << 20, &cert, &n, &err) != 0 ||
        kgpu_read_file_max(f.key, 1 << 20, &key, &n, &err) != 0) {
        fprintf(stderr, "kgpu-expander: %s\n", err.msg);
        free(cert);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    node_grpc_init();
    node_server *s = node_server_start_tls(f.listen, cert, key, "expander", best_options, &f, &err);
    free(cert);
    free(key);
    if (s == NULL) {
        kgpu_log(KGPU_LOG_ERROR, "%s", err.msg);
        node_grpc_shutdown();
        return 1;
    }
    if (f.prices_path != NULL)
        kgpu_log(KGPU_LOG_INFO, "prices of %d GPU models in %s from %s", f.prices.nmodels,
                 f.prices.currency, f.prices_path);
    kgpu_log(KGPU_LOG_INFO, "serving %s on %s (TLS)", CAEXP_METHOD, f.listen);
    while (!atomic_load(&stop))
        usleep(100000);
    kgpu_log(KGPU_LOG_INFO, "stopping");
    node_server_stop(s);
    node_grpc_shutdown();
    return 0;
}
