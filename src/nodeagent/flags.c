/*
 * The node agents' shared flags (nodeagent.h): defaults, parsing with an
 * agent's own flags mixed in, and the container contract's host paths they
 * give.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "nodeagent.h"
#include "podspec.h"

void node_defaults(node_config *c, const char *state_dir)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->state_dir, sizeof(c->state_dir), "%s", state_dir);
    snprintf(c->mps_pipe_dir, sizeof(c->mps_pipe_dir), "/tmp/nvidia-mps");
    const char *env = getenv("NODE_NAME");
    if (env != NULL)
        snprintf(c->node_name, sizeof(c->node_name), "%s", env);
    c->unit_mib = 1024;
    c->state_limit = NODE_STATE_LIMIT_DEFAULT;
}

int node_flag_copy(const char *flag, const char *arg, char *dst, size_t cap, size_t reserve,
                   bool may_be_empty, kgpu_error *err)
{
    if (strlen(arg) >= cap - reserve || (!may_be_empty && arg[0] == '\0'))
        return kgpu_error_set(err, KGPU_EINVAL, "%s: value empty or too long", flag);
    snprintf(dst, cap, "%s", arg);
    return 0;
}

int node_flag(int key, const char *arg, const char *flag, size_t reserve, node_config *c,
              kgpu_error *err)
{
    switch (key) {
    case NODE_OPT_NODE:
        return node_flag_copy(flag, arg, c->node_name, sizeof(c->node_name), reserve, false, err);
    case NODE_OPT_KUBECONFIG:
        return node_flag_copy(flag, arg, c->kubeconfig, sizeof(c->kubeconfig), reserve, false, err);
    case NODE_OPT_FAKE:
        return node_flag_copy(flag, arg, c->fake_gpus, sizeof(c->fake_gpus), reserve, false, err);
    case NODE_OPT_NVML: /* empty: the default library */
        return node_flag_copy(flag, arg, c->nvml_lib, sizeof(c->nvml_lib), reserve, true, err);
    case NODE_OPT_SYSFS:
        return node_flag_copy(flag, arg, c->sysfs, sizeof(c->sysfs), reserve, false, err);
    case NODE_OPT_STATE:
        return node_flag_copy(flag, arg, c->state_dir, sizeof(c->state_dir), reserve, false, err);
    case NODE_OPT_SHIM: /* empty: the default path */
        return node_flag_copy(flag, arg, c->shim_lib, sizeof(c->shim_lib), reserve, true, err);
    case NODE_OPT_MPS_PIPE:
        return node_flag_copy(flag, arg, c->mps_pipe_dir, sizeof(c->mps_pipe_dir), reserve, false,
                              err);
    case NODE_OPT_SHARING:
        if (contract_sharing_parse(arg, &c->sharing) != 0)
            return kgpu_error_set(err, KGPU_EINVAL, "--sharing %s: expected sched or mps", arg);
        return 0;
    case NODE_OPT_UNIT: {
        int64_t bytes;
        if (kgpu_quantity_value(arg, &bytes, NULL) != 0 || bytes <= 0 ||
            bytes % (1024 * 1024) != 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--memory-unit %s: expected a whole number of MiB such as "
                                  "1Gi or 512Mi",
                                  arg);
        c->unit_mib = bytes / (1024 * 1024);
        return 0;
    }
    case NODE_OPT_STATE_LIMIT:
        if (kgpu_quantity_value(arg, &c->state_limit, NULL) != 0 || c->state_limit <= 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--state-limit %s: expected a size such as 256Mi or 1Gi", arg);
        return 0;
    case NODE_OPT_STATE_CHECK:
        if (strcmp(arg, "warn") != 0 && strcmp(arg, "refuse") != 0)
            return kgpu_error_set(err, KGPU_EINVAL, "--state-check %s: expected warn or refuse",
                                  arg);
        c->state_refuse = strcmp(arg, "refuse") == 0;
        return 0;
    case NODE_OPT_LOG: {
        kgpu_log_level level;
        if (kgpu_log_level_parse(arg, &level) != 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--log-level %s: expected debug, info, warn or error", arg);
        kgpu_log_set_level(level);
        return 0;
    }
    default:
        return 1;
    }
}

int node_parse(int argc, char **argv, const struct option *opts, const char *prog,
               const char *usage, size_t reserve, node_config *node, node_own_flag_fn own,
               void *ctx, kgpu_error *err)
{
    opterr = 0;
    optind = 1;
    for (;;) {
        int at = -1;
        int c = getopt_long(argc, argv, "", opts, &at);
        if (c == -1)
            break;
        /* The flag's own name: with "--flag value", argv[optind - 1] is the value. */
        char named[96];
        const char *flag = argv[optind - 1];
        if (at >= 0) {
            snprintf(named, sizeof(named), "--%s", opts[at].name);
            flag = named;
        }
        if (c == NODE_OPT_VERSION) {
            printf("%s %s\n", prog, KGPU_VERSION);
            return 1;
        }
        if (c == NODE_OPT_HELP) {
            fputs(usage, stdout);
            return 1;
        }
        int rc = node_flag(c, optarg, flag, reserve, node, err);
        if (rc == 1)
            rc = own(ctx, c, optarg, flag, err);
        if (rc == 1)
            return kgpu_error_set(err, KGPU_EINVAL, "unknown or incomplete flag '%s' (see --help)",
                                  flag);
        if (rc != 0)
            return rc;
    }
    if (optind < argc)
        return kgpu_error_set(err, KGPU_EINVAL, "unexpected argument '%s' (see --help)",
                              argv[optind]);
    return 0;
}

void node_contract_paths(const node_config *c, char *shim, size_t cap, contract_paths *paths)
{
    memset(paths, 0, sizeof(*paths));
    paths->state_dir = c->state_dir;
    if (strcmp(c->shim_lib, "none") != 0) {
        if (c->shim_lib[0] != '\0')
            snprintf(shim, cap, "%s", c->shim_lib);
        else
            snprintf(shim, cap, "%s/lib/libkgpu-limit.so", c->state_dir);
        paths->shim_lib = shim;
    }
    if (c->sharing == CONTRACT_SHARING_MPS)
        paths->mps_pipe_dir = c->mps_pipe_dir;
}
