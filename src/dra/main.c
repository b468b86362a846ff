/*
 * kgpu-dra-plugin: flags, signals, and the driver (driver.c).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dra.h"
#include "podspec.h"

static atomic_bool stop;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop, true);
}

static const char usage[] =
    "usage: kgpu-dra-plugin [flags]\n"
    "\n"
    "kgpu's Dynamic Resource Allocation driver gpu.kgpu.io: publishes the node's GPUs\n"
    "in a ResourceSlice with consumable memory and compute, and prepares the claims\n"
    "kube-scheduler allocated as CDI devices carrying kgpu's limits.\n"
    "\n"
    "  --node-name NAME      this node (default: $NODE_NAME)\n"
    "  --kubeconfig FILE     API server credentials (default: in-cluster service account)\n"
    "  --fake-gpus FILE      read the GPUs from a YAML/JSON file with a 'gpus:' list instead\n"
    "                        of NVML (re-read when it changes)\n"
    "  --nvml-lib PATH       NVML library (default libnvidia-ml.so.1)\n"
    "  --state-dir DIR       host folder for claims' limits, accounting and the checkpoint\n"
    "                        (default /var/lib/kgpu/dra)\n"
    "  --shim-lib PATH       host path of libkgpu-limit.so (default STATE-DIR/lib/libkgpu-limit.so;\n"
    "                        'none': no interception library, no memory isolation)\n"
    "  --sharing MODE        how claims sharing a GPU are held to their compute shares, as\n"
    "                        the device plugin's flag: 'sched' (default) or 'mps'\n"
    "  --mps-pipe-dir DIR    host folder of the MPS control daemon's pipes (default\n"
    "                        /tmp/nvidia-mps)\n"
    "  --cdi-dir DIR         where CDI specs are written (default /var/run/cdi)\n"
    "  --plugin-dir DIR      kubelet's plugins folder (default /var/lib/kubelet/plugins)\n"
    "  --registry-dir DIR    kubelet's plugin registry (default "
    "/var/lib/kubelet/plugins_registry)\n"
    "  --memory-unit QTY     unit of the gpushare-compatible env variables (default 1Gi)\n"
    "  --resync SECONDS      how often the ResourceSlice is checked against the API server\n"
    "                        (default 300; it is written at once whenever the GPUs change)\n"
    "  --log-level LEVEL     debug, info, warn or error (default info)\n"
    "  --version, --help\n";

static int parse(int argc, char **argv, dra_config *cfg, kgpu_error *err)
{
    enum {
        O_NODE = 256,
        O_KUBECONFIG,
        O_FAKE,
        O_NVML,
        O_SYSFS,
        O_STATE,
        O_SHIM,
        O_CDI,
        O_SHARING,
        O_MPS_PIPE,
        O_PLUGIN,
        O_REGISTRY,
        O_UNIT,
        O_RESYNC,
        O_LOG,
        O_VERSION,
        O_HELP
    };
    static const struct option opts[] = {
        {"node-name", required_argument, NULL, O_NODE},
        {"kubeconfig", required_argument, NULL, O_KUBECONFIG},
        {"fake-gpus", required_argument, NULL, O_FAKE},
        {"nvml-lib", required_argument, NULL, O_NVML},
        {"sysfs", required_argument, NULL, O_SYSFS},
        {"state-dir", required_argument, NULL, O_STATE},
        {"shim-lib", required_argument, NULL, O_SHIM},
        {"cdi-dir", required_argument, NULL, O_CDI},
        {"sharing", required_argument, NULL, O_SHARING},
        {"mps-pipe-dir", required_argument, NULL, O_MPS_PIPE},
        {"plugin-dir", required_argument, NULL, O_PLUGIN},
        {"registry-dir", required_argument, NULL, O_REGISTRY},
        {"memory-unit", required_argument, NULL, O_UNIT},
        {"resync", required_argument, NULL, O_RESYNC},
        {"log-level", required_argument, NULL, O_LOG},
        {"version", no_argument, NULL, O_VERSION},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->state_dir, sizeof(cfg->state_dir), "/var/lib/kgpu/dra");
    snprintf(cfg->cdi_dir, sizeof(cfg->cdi_dir), "/var/run/cdi");
    snprintf(cfg->mps_pipe_dir, sizeof(cfg->mps_pipe_dir), "/tmp/nvidia-mps");
    snprintf(cfg->plugin_dir, sizeof(cfg->plugin_dir), "/var/lib/kubelet/plugins");
    snprintf(cfg->registry_dir, sizeof(cfg->registry_dir), "/var/lib/kubelet/plugins_registry");
    const char *env = getenv("NODE_NAME");
    if (env != NULL)
        snprintf(cfg->node_name, sizeof(cfg->node_name), "%s", env);
    cfg->unit_mib = 1024;
    cfg->resync_s = 300;
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL);
        if (c == -1)
            break;
        char *dst = NULL;
        size_t cap = 0;
        switch (c) {
        case O_NODE:
            dst = cfg->node_name, cap = sizeof(cfg->node_name);
            break;
        case O_KUBECONFIG:
            dst = cfg->kubeconfig, cap = sizeof(cfg->kubeconfig);
            break;
        case O_FAKE:
            dst = cfg->fake_gpus, cap = sizeof(cfg->fake_gpus);
            break;
        case O_NVML:
            dst = cfg->nvml_lib, cap = sizeof(cfg->nvml_lib);
            break;
        case O_SYSFS:
            dst = cfg->sysfs, cap = sizeof(cfg->sysfs);
            break;
        case O_STATE:
            dst = cfg->state_dir, cap = sizeof(cfg->state_dir);
            break;
        case O_SHIM:
            dst = cfg->shim_lib, cap = sizeof(cfg->shim_lib);
            break;
        case O_CDI:
            dst = cfg->cdi_dir, cap = sizeof(cfg->cdi_dir);
            break;
        case O_MPS_PIPE:
            dst = cfg->mps_pipe_dir, cap = sizeof(cfg->mps_pipe_dir);
            break;
        case O_SHARING:
            if (dp_sharing_parse(optarg, &cfg->sharing) != 0)
                return kgpu_error_set(err, KGPU_EINVAL, "--sharing %s: expected sched or mps",
                                      optarg);
            break;
        case O_PLUGIN:
            dst = cfg->plugin_dir, cap = sizeof(cfg->plugin_dir);
            break;
        case O_REGISTRY:
            dst = cfg->registry_dir, cap = sizeof(cfg->registry_dir);
            break;
        case O_UNIT: {
            int64_t bytes;
            if (kgpu_quantity_value(optarg, &bytes, NULL) != 0 || bytes <= 0 ||
                bytes % (1024 * 1024) != 0)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "--memory-unit %s: expected a whole number of MiB such as "
                                      "1Gi or 512Mi",
                                      optarg);
            cfg->unit_mib = bytes / (1024 * 1024);
            break;
        }
        case O_RESYNC: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end != '\0' || v < 1 || v > 86400)
                return kgpu_error_set(err, KGPU_EINVAL, "--resync %s: expected 1..86400 seconds",
                                      optarg);
            cfg->resync_s = (int)v;
            break;
        }
        case O_LOG: {
            static const char *const names[] = {"debug", "info", "warn", "error"};
            int l = -1;
            for (int i = 0; i < 4; i++)
                if (strcmp(optarg, names[i]) == 0)
                    l = i;
            if (l < 0)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "--log-level %s: expected debug, info, warn or error",
                                      optarg);
            dp_log_level = (dp_level)l;
            break;
        }
        case O_VERSION:
            printf("kgpu-dra-plugin %s\n", KGPU_VERSION);
            return 1;
        case O_HELP:
            fputs(usage, stdout);
            return 1;
        default:
            return kgpu_error_set(err, KGPU_EINVAL, "unknown or incomplete flag '%s' (see --help)",
                                  argv[optind - 1]);
        }
        if (dst != NULL) {
            /* Paths end up in socket addresses and file names: bounded well below PATH_MAX. */
            if (strlen(optarg) >= cap - 128 || (c != O_SHIM && c != O_NVML && optarg[0] == '\0'))
                return kgpu_error_set(err, KGPU_EINVAL, "%s: value empty or too long",
                                      argv[optind - 1]);
            snprintf(dst, cap, "%s", optarg);
        }
    }
    if (optind < argc)
        return kgpu_error_set(err, KGPU_EINVAL, "unexpected argument '%s' (see --help)",
                              argv[optind]);
    return 0;
}

int main(int argc, char **argv)
{
    static dra_config cfg;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = parse(argc, argv, &cfg, &err);
    if (rc == 1)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "kgpu-dra-plugin: %s\n", err.msg);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    dp_grpc_init();
    rc = dra_run(&cfg, &stop, &err);
    dp_grpc_shutdown();
    if (rc != 0) {
        dp_log(DP_ERROR, "%s", err.msg);
        return 1;
    }
    return 0;
}
