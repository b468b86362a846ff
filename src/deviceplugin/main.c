/*
 * kgpu-device-plugin: flags, signals, and the daemon (plugin.c).
 */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "podspec.h"

static atomic_bool stop;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop, true);
}

static const char usage[] =
    "usage: kgpu-device-plugin [flags]\n"
    "\n"
    "Advertises the node's GPUs to kubelet (device plugin API v1beta1) as\n"
    "kgpu.io/gpu-mem and kgpu.io/gpu-core, and gives each container the GPUs\n"
    "kgpu-extender assigned it.\n"
    "\n"
    "  --plugin-dir DIR     kubelet's device plugin folder (default "
    "/var/lib/kubelet/device-plugins)\n"
    "  --node-name NAME     this node (default: $NODE_NAME)\n"
    "  --kubeconfig FILE    API server credentials (default: in-cluster service account;\n"
    "                       with neither, runs without an API server and Allocate refuses)\n"
    "  --memory-unit QTY    size of one kgpu.io/gpu-mem unit (default 1Gi; must equal the\n"
    "                       extender's memoryUnit)\n"
    "  --fake-gpus FILE     read the GPUs from a YAML/JSON file with a 'gpus:' list instead\n"
    "                       of NVML (re-read when it changes)\n"
    "  --nvml-lib PATH      NVML library (default libnvidia-ml.so.1)\n"
    "  --state-dir DIR      host folder for per-pod limits and accounting (default /var/lib/kgpu)\n"
    "  --shim-lib PATH      host path of libkgpu-limit.so (default "
    "STATE-DIR/lib/libkgpu-limit.so;\n"
    "                       'none': no interception library, no memory isolation)\n"
    "  --sharing MODE       how containers sharing a GPU are held to their compute shares:\n"
    "                       'sched' (default: the library's turns, one schedule file per\n"
    "                       GPU) or 'mps' (NVIDIA MPS; needs the node's MPS control daemon)\n"
    "  --mps-pipe-dir DIR   host folder of the MPS control daemon's pipes, mounted into\n"
    "                       containers in MPS mode (default /tmp/nvidia-mps)\n"
    "  --whole-gpus         also register nvidia.com/gpu (leave off while NVIDIA's plugin owns "
    "it)\n"
    "  --gpushare-alias     also register aliyun.com/gpu-mem for gpushare manifests\n"
    "  --watch-config FILE  run the watcher: compare each container's real GPU use (NVML)\n"
    "                       with its share, serve /metrics, post Events, optionally kill\n"
    "                       (docs/install-device-plugin.md, \"The watcher\")\n"
    "  --log-level LEVEL    debug, info, warn or error (default info)\n"
    "  --version, --help\n";

/* Parses the flags; 1 = --help/--version printed, negative = error. */
static int parse(int argc, char **argv, dp_config *cfg, kgpu_error *err)
{
    enum {
        O_PLUGIN = 256,
        O_NODE,
        O_KUBECONFIG,
        O_UNIT,
        O_FAKE,
        O_NVML,
        O_SYSFS,
        O_STATE,
        O_SHIM,
        O_WHOLE,
        O_ALIAS,
        O_LOG,
        O_NOAPI,
        O_WATCH,
        O_SHARING,
        O_MPS_PIPE,
        O_VERSION,
        O_HELP
    };
    static const struct option opts[] = {
        {"plugin-dir", required_argument, NULL, O_PLUGIN},
        {"node-name", required_argument, NULL, O_NODE},
        {"kubeconfig", required_argument, NULL, O_KUBECONFIG},
        {"memory-unit", required_argument, NULL, O_UNIT},
        {"fake-gpus", required_argument, NULL, O_FAKE},
        {"nvml-lib", required_argument, NULL, O_NVML},
        {"sysfs", required_argument, NULL, O_SYSFS},
        {"state-dir", required_argument, NULL, O_STATE},
        {"shim-lib", required_argument, NULL, O_SHIM},
        {"whole-gpus", no_argument, NULL, O_WHOLE},
        {"gpushare-alias", no_argument, NULL, O_ALIAS},
        {"log-level", required_argument, NULL, O_LOG},
        {"no-api-server", no_argument, NULL, O_NOAPI},
        {"watch-config", required_argument, NULL, O_WATCH},
        {"sharing", required_argument, NULL, O_SHARING},
        {"mps-pipe-dir", required_argument, NULL, O_MPS_PIPE},
        {"version", no_argument, NULL, O_VERSION},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->plugin_dir, sizeof(cfg->plugin_dir), "/var/lib/kubelet/device-plugins");
    snprintf(cfg->state_dir, sizeof(cfg->state_dir), "/var/lib/kgpu");
    snprintf(cfg->mps_pipe_dir, sizeof(cfg->mps_pipe_dir), "/tmp/nvidia-mps");
    const char *env = getenv("NODE_NAME");
    if (env != NULL)
        snprintf(cfg->node_name, sizeof(cfg->node_name), "%s", env);
    cfg->unit_mib = 1024;
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL);
        if (c == -1)
            break;
        char *dst = NULL;
        size_t cap = 0;
        switch (c) {
        case O_PLUGIN:
            dst = cfg->plugin_dir, cap = sizeof(cfg->plugin_dir);
            break;
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
        case O_WATCH:
            dst = cfg->watch_config, cap = sizeof(cfg->watch_config);
            break;
        case O_MPS_PIPE:
            dst = cfg->mps_pipe_dir, cap = sizeof(cfg->mps_pipe_dir);
            break;
        case O_SHARING:
            if (dp_sharing_parse(optarg, &cfg->sharing) != 0)
                return kgpu_error_set(err, KGPU_EINVAL, "--sharing %s: expected sched or mps",
                                      optarg);
            break;
        case O_UNIT: {
            int64_t bytes;
            kgpu_error qe = {0};
            if (kgpu_quantity_value(optarg, &bytes, &qe) != 0 || bytes <= 0 ||
                bytes % (1024 * 1024) != 0)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "--memory-unit %s: expected a whole number of MiB such as "
                                      "1Gi or 512Mi",
                                      optarg);
            cfg->unit_mib = bytes / (1024 * 1024);
            break;
        }
        case O_WHOLE:
            cfg->whole_gpus = true;
            break;
        case O_ALIAS:
            cfg->gpushare_alias = true;
            break;
        case O_NOAPI:
            cfg->no_api = true;
            break;
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
            printf("kgpu-device-plugin %s\n", KGPU_VERSION);
            return 1;
        case O_HELP:
            fputs(usage, stdout);
            return 1;
        default:
            return kgpu_error_set(err, KGPU_EINVAL, "unknown or incomplete flag '%s' (see --help)",
                                  argv[optind - 1]);
        }
        if (dst != NULL) {
            if (strlen(optarg) >= cap || (c != O_SHIM && c != O_NVML && optarg[0] == '\0'))
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
    static dp_config cfg;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = parse(argc, argv, &cfg, &err);
    if (rc == 1)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "kgpu-device-plugin: %s\n", err.msg);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    dp_grpc_init();
    rc = dp_run(&cfg, &stop, &err);
    dp_grpc_shutdown();
    if (rc != 0) {
        dp_log(DP_ERROR, "%s", err.msg);
        return 1;
    }
    return 0;
}
