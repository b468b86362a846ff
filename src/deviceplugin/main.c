/*
 * kgpu-device-plugin: its own flags, then the daemon (plugin.c); the shared flags, signals
 * and main() are the node agents' (src/nodeagent).
 */
#include <stdio.h>
#include <string.h>

#include "dp.h"
#include "nodeagent.h"

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
    "  --device-list-strategy S  how a container is given its GPUs: 'cdi-cri' (default: CDI\n"
    "                       devices in Allocate's answer, which kubelet hands the runtime, and\n"
    "                       NVIDIA_VISIBLE_DEVICES) or 'envvar' (NVIDIA_VISIBLE_DEVICES alone,\n"
    "                       for nodes without a CDI spec of the GPUs; needs the runtime to accept\n"
    "                       the variable from any container: docs/install-device-plugin.md)\n"
    "  --device-id-strategy S  CDI device names: 'uuid' (default, KIND=GPU-...) or 'index'\n"
    "                       (KIND=0), as the node's CDI spec was generated\n"
    "  --cdi-kind KIND      CDI kind of the node's GPUs (default nvidia.com/gpu)\n"
    "  --whole-gpus         also register nvidia.com/gpu (leave off while NVIDIA's plugin owns "
    "it)\n"
    "  --gpushare-alias     also register aliyun.com/gpu-mem for gpushare manifests\n"
    "  --mig-strategy S     GPUs in MIG mode, partitioned beforehand: 'none' (default: their\n"
    "                       instances are not advertised), 'single' (each MIG device is one\n"
    "                       nvidia.com/gpu, when all have one profile) or 'mixed' (one\n"
    "                       nvidia.com/mig-<profile> resource per profile). A GPU in MIG mode is\n"
    "                       never offered whole or as shares (docs/install-device-plugin.md)\n"
    "  --watch-config FILE  run the watcher: compare each container's real GPU use (NVML)\n"
    "                       with its share, serve /metrics, post Events, optionally kill\n"
    "                       (docs/install-device-plugin.md, \"The watcher\")\n"
    "  --state-limit QTY    the largest filesystem STATE-DIR may be on (default 1Gi):\n"
    "                       containers write into it outside ephemeral-storage\n"
    "  --state-check MODE   'warn' (default) or 'refuse' to start when it is larger\n"
    "  --log-level LEVEL    debug, info, warn or error (default info)\n"
    "  --version, --help\n";

enum { O_PLUGIN = NODE_OPT_OWN, O_WHOLE, O_ALIAS, O_NOAPI, O_WATCH, O_LIST, O_IDS, O_KIND, O_MIG };

static int own_flag(void *ctx, int key, const char *arg, const char *flag, kgpu_error *err)
{
    dp_config *cfg = ctx;
    switch (key) {
    case O_PLUGIN:
        return node_flag_copy(flag, arg, cfg->plugin_dir, sizeof(cfg->plugin_dir), 0, false, err);
    case O_WATCH:
        return node_flag_copy(flag, arg, cfg->watch_config, sizeof(cfg->watch_config), 0, false,
                              err);
    case O_LIST:
        if (strcmp(arg, "cdi-cri") == 0)
            cfg->device_list = DP_LIST_CDI;
        else if (strcmp(arg, "envvar") == 0)
            cfg->device_list = DP_LIST_ENVVAR;
        else
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--device-list-strategy: expected cdi-cri or envvar, not "
                                  "'%.64s'",
                                  arg);
        return 0;
    case O_IDS:
        if (strcmp(arg, "uuid") != 0 && strcmp(arg, "index") != 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--device-id-strategy: expected uuid or index, not '%.64s'", arg);
        cfg->cdi_by_index = strcmp(arg, "index") == 0;
        return 0;
    case O_KIND: {
        int rc = node_flag_copy(flag, arg, cfg->cdi_kind, sizeof(cfg->cdi_kind), 0, false, err);
        return rc != 0 ? rc : contract_cdi_kind_check(cfg->cdi_kind, err);
    }
    case O_MIG:
        if (dp_mig_strategy_parse(arg, &cfg->mig_strategy) != 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--mig-strategy: expected none, single or mixed, not '%.64s'",
                                  arg);
        return 0;
    case O_WHOLE:
        cfg->whole_gpus = true;
        return 0;
    case O_ALIAS:
        cfg->gpushare_alias = true;
        return 0;
    case O_NOAPI:
        cfg->no_api = true;
        return 0;
    default:
        return 1;
    }
}

/* Parses the flags; 1 = --help/--version printed, negative = error. */
static int parse(int argc, char **argv, dp_config *cfg, kgpu_error *err)
{
    static const struct option opts[] = {
        NODE_OPTIONS,
        {"plugin-dir", required_argument, NULL, O_PLUGIN},
        {"whole-gpus", no_argument, NULL, O_WHOLE},
        {"gpushare-alias", no_argument, NULL, O_ALIAS},
        {"no-api-server", no_argument, NULL, O_NOAPI},
        {"watch-config", required_argument, NULL, O_WATCH},
        {"device-list-strategy", required_argument, NULL, O_LIST},
        {"device-id-strategy", required_argument, NULL, O_IDS},
        {"cdi-kind", required_argument, NULL, O_KIND},
        {"mig-strategy", required_argument, NULL, O_MIG},
        {NULL, 0, NULL, 0},
    };
    memset(cfg, 0, sizeof(*cfg));
    node_defaults(&cfg->node, "/var/lib/kgpu");
    snprintf(cfg->plugin_dir, sizeof(cfg->plugin_dir), "/var/lib/kubelet/device-plugins");
    return node_parse(argc, argv, opts, "kgpu-device-plugin", usage, 0, &cfg->node, own_flag,
                      cfg, err);
}

static int run(const void *cfg, atomic_bool *stop, kgpu_error *err)
{
    int rc = node_state_check(&((const dp_config *)cfg)->node, err);
    return rc != 0 ? rc : dp_run(cfg, stop, err);
}

int main(int argc, char **argv)
{
    static dp_config cfg;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = parse(argc, argv, &cfg, &err);
    return node_daemon_main("kgpu-device-plugin", rc, &err, run, &cfg);
}
