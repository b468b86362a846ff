/*
 * kgpu-dra-plugin: its own flags, then the driver (driver.c); the shared flags, signals
 * and main() are the node agents' (src/nodeagent).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dra.h"
#include "nodeagent.h"

/* Paths end up in socket addresses and file names: bounded well below PATH_MAX. */
#define PATH_RESERVE 128

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
    "  --gpu-cdi-kind KIND   also name each GPU as the CDI device KIND=<uuid> (nvidia.com/gpu:\n"
    "                        NVIDIA's spec, nvidia-ctk cdi generate), for runtimes that ignore\n"
    "                        NVIDIA_VISIBLE_DEVICES from unprivileged containers; 'none'\n"
    "                        (default): not named\n"
    "  --resync SECONDS      how often the ResourceSlice is checked against the API server\n"
    "                        (default 300; it is written at once whenever the GPUs change)\n"
    "  --state-limit QTY     the largest filesystem STATE-DIR may be on (default 1Gi):\n"
    "                        containers write into it outside ephemeral-storage\n"
    "  --state-check MODE    'warn' (default) or 'refuse' to start when it is larger\n"
    "  --log-level LEVEL     debug, info, warn or error (default info)\n"
    "  --version, --help\n";

enum { O_CDI = NODE_OPT_OWN, O_PLUGIN, O_REGISTRY, O_RESYNC, O_GPU_CDI_KIND };

static int own_flag(void *ctx, int key, const char *arg, const char *flag, kgpu_error *err)
{
    dra_config *cfg = ctx;
    switch (key) {
    case O_CDI:
        return node_flag_copy(flag, arg, cfg->cdi_dir, sizeof(cfg->cdi_dir), PATH_RESERVE, false,
                              err);
    case O_PLUGIN:
        return node_flag_copy(flag, arg, cfg->plugin_dir, sizeof(cfg->plugin_dir), PATH_RESERVE,
                              false, err);
    case O_REGISTRY:
        return node_flag_copy(flag, arg, cfg->registry_dir, sizeof(cfg->registry_dir),
                              PATH_RESERVE, false, err);
    case O_GPU_CDI_KIND:
        if (strcmp(arg, "none") == 0) {
            cfg->gpu_cdi_kind[0] = '\0';
            return 0;
        }
        if (node_flag_copy(flag, arg, cfg->gpu_cdi_kind, sizeof(cfg->gpu_cdi_kind), 0, false,
                           err) != 0)
            return KGPU_EINVAL;
        if (contract_cdi_kind_check(arg, err) != 0) {
            char why[sizeof(err->msg)];
            snprintf(why, sizeof(why), "%s", err->msg);
            return kgpu_error_set(err, KGPU_EINVAL, "%s: %s", flag, why);
        }
        return 0;
    case O_RESYNC: {
        char *end;
        long v = strtol(arg, &end, 10);
        if (*end != '\0' || v < 1 || v > 86400)
            return kgpu_error_set(err, KGPU_EINVAL, "--resync %s: expected 1..86400 seconds", arg);
        cfg->resync_s = (int)v;
        return 0;
    }
    default:
        return 1;
    }
}

/* Parses the flags; 1 = --help/--version printed, negative = error. */
static int parse(int argc, char **argv, dra_config *cfg, kgpu_error *err)
{
    static const struct option opts[] = {
        NODE_OPTIONS,
        {"cdi-dir", required_argument, NULL, O_CDI},
        {"plugin-dir", required_argument, NULL, O_PLUGIN},
        {"registry-dir", required_argument, NULL, O_REGISTRY},
        {"resync", required_argument, NULL, O_RESYNC},
        {"gpu-cdi-kind", required_argument, NULL, O_GPU_CDI_KIND},
        {NULL, 0, NULL, 0},
    };
    memset(cfg, 0, sizeof(*cfg));
    node_defaults(&cfg->node, "/var/lib/kgpu/dra");
    snprintf(cfg->cdi_dir, sizeof(cfg->cdi_dir), "/var/run/cdi");
    snprintf(cfg->plugin_dir, sizeof(cfg->plugin_dir), "/var/lib/kubelet/plugins");
    snprintf(cfg->registry_dir, sizeof(cfg->registry_dir), "/var/lib/kubelet/plugins_registry");
    cfg->resync_s = 300;
    return node_parse(argc, argv, opts, "kgpu-dra-plugin", usage, PATH_RESERVE, &cfg->node,
                      own_flag, cfg, err);
}

static int run(const void *cfg, atomic_bool *stop, kgpu_error *err)
{
    int rc = node_state_check(&((const dra_config *)cfg)->node, err);
    return rc != 0 ? rc : dra_run(cfg, stop, err);
}

int main(int argc, char **argv)
{
    static dra_config cfg;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = parse(argc, argv, &cfg, &err);
    return node_daemon_main("kgpu-dra-plugin", rc, &err, run, &cfg);
}
