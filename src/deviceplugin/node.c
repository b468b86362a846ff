/*
 * What kgpu's two node daemons share (node.h): their common flags, main(),
 * the container contract's host paths, the API server connection and the
 * fake inventory's polling. Each daemon keeps only what is its own.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"
#include "podspec.h"

void dp_node_defaults(dp_node_config *c, const char *state_dir)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->state_dir, sizeof(c->state_dir), "%s", state_dir);
    snprintf(c->mps_pipe_dir, sizeof(c->mps_pipe_dir), "/tmp/nvidia-mps");
    const char *env = getenv("NODE_NAME");
    if (env != NULL)
        snprintf(c->node_name, sizeof(c->node_name), "%s", env);
    c->unit_mib = 1024;
}

int dp_flag_copy(const char *flag, const char *arg, char *dst, size_t cap, size_t reserve,
                 bool may_be_empty, kgpu_error *err)
{
    if (strlen(arg) >= cap - reserve || (!may_be_empty && arg[0] == '\0'))
        return kgpu_error_set(err, KGPU_EINVAL, "%s: value empty or too long", flag);
    snprintf(dst, cap, "%s", arg);
    return 0;
}

int dp_node_flag(int key, const char *arg, const char *flag, size_t reserve, dp_node_config *c,
                 kgpu_error *err)
{
    switch (key) {
    case DP_OPT_NODE:
        return dp_flag_copy(flag, arg, c->node_name, sizeof(c->node_name), reserve, false, err);
    case DP_OPT_KUBECONFIG:
        return dp_flag_copy(flag, arg, c->kubeconfig, sizeof(c->kubeconfig), reserve, false, err);
    case DP_OPT_FAKE:
        return dp_flag_copy(flag, arg, c->fake_gpus, sizeof(c->fake_gpus), reserve, false, err);
    case DP_OPT_NVML: /* empty: the default library */
        return dp_flag_copy(flag, arg, c->nvml_lib, sizeof(c->nvml_lib), reserve, true, err);
    case DP_OPT_SYSFS:
        return dp_flag_copy(flag, arg, c->sysfs, sizeof(c->sysfs), reserve, false, err);
    case DP_OPT_STATE:
        return dp_flag_copy(flag, arg, c->state_dir, sizeof(c->state_dir), reserve, false, err);
    case DP_OPT_SHIM: /* empty: the default path */
        return dp_flag_copy(flag, arg, c->shim_lib, sizeof(c->shim_lib), reserve, true, err);
    case DP_OPT_MPS_PIPE:
        return dp_flag_copy(flag, arg, c->mps_pipe_dir, sizeof(c->mps_pipe_dir), reserve, false,
                            err);
    case DP_OPT_SHARING:
        if (dp_sharing_parse(arg, &c->sharing) != 0)
            return kgpu_error_set(err, KGPU_EINVAL, "--sharing %s: expected sched or mps", arg);
        return 0;
    case DP_OPT_UNIT: {
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
    case DP_OPT_LOG: {
        static const char *const names[] = {"debug", "info", "warn", "error"};
        for (int i = 0; i < 4; i++)
            if (strcmp(arg, names[i]) == 0) {
                dp_log_level = (dp_level)i;
                return 0;
            }
        return kgpu_error_set(err, KGPU_EINVAL,
                              "--log-level %s: expected debug, info, warn or error", arg);
    }
    default:
        return 1;
    }
}

int dp_node_parse(int argc, char **argv, const struct option *opts, const char *prog,
                  const char *usage, size_t reserve, dp_node_config *node, dp_own_flag_fn own,
                  void *ctx, kgpu_error *err)
{
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL);
        if (c == -1)
            break;
        const char *flag = argv[optind - 1];
        if (c == DP_OPT_VERSION) {
            printf("%s %s\n", prog, KGPU_VERSION);
            return 1;
        }
        if (c == DP_OPT_HELP) {
            fputs(usage, stdout);
            return 1;
        }
        int rc = dp_node_flag(c, optarg, flag, reserve, node, err);
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

static atomic_bool *stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(stop_flag, true);
}

int dp_daemon_main(const char *prog, int parse_rc, const kgpu_error *perr, dp_daemon_fn run,
                   const void *cfg)
{
    static atomic_bool stop;
    if (parse_rc == 1)
        return 0;
    if (parse_rc != 0) {
        fprintf(stderr, "%s: %s\n", prog, perr->msg);
        return 2;
    }
    stop_flag = &stop;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    kgpu_error err;
    kgpu_error_clear(&err);
    dp_grpc_init();
    int rc = run(cfg, &stop, &err);
    dp_grpc_shutdown();
    if (rc != 0) {
        dp_log(DP_ERROR, "%s", err.msg);
        return 1;
    }
    return 0;
}

void dp_node_paths(const dp_node_config *c, char *shim, size_t cap, dp_paths *paths)
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
    if (c->sharing == DP_SHARING_MPS)
        paths->mps_pipe_dir = c->mps_pipe_dir;
}

int dp_write_preload(const dp_paths *paths, kgpu_error *err)
{
    if (paths->shim_lib == NULL)
        return 0;
    char path[1100], tmp[1110];
    snprintf(path, sizeof(path), "%s/ld.so.preload", paths->state_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool ok = f != NULL && fprintf(f, "%s\n", DP_SHIM_PATH) >= 0;
    if (f != NULL && fclose(f) != 0)
        ok = false;
    if (!ok || chmod(tmp, 0644) != 0 || rename(tmp, path) != 0)
        return kgpu_error_set(err, KGPU_EIO, "writing %s: %s", path, strerror(errno));
    return 0;
}

int dp_k8s_connect(const char *kubeconfig, kgpu_k8s **out, bool *no_cluster, kgpu_error *err)
{
    *out = NULL;
    *no_cluster = false;
    kgpu_k8s_config kc;
    memset(&kc, 0, sizeof(kc));
    int rc;
    if (kubeconfig[0] != '\0') {
        rc = kgpu_k8s_config_kubeconfig(kubeconfig, &kc, err);
    } else {
        rc = kgpu_k8s_config_in_cluster(NULL, &kc, err);
        *no_cluster = rc == KGPU_ENOENT;
    }
    if (rc == 0) {
        *out = kgpu_k8s_new(&kc, err);
        rc = *out == NULL ? (err->code ? err->code : KGPU_EIO) : 0;
    }
    kgpu_k8s_config_clear(&kc);
    return rc;
}

int dp_fake_poll(const char *path, struct stat *seen, bool first, dp_gpus_fn take, void *ctx,
                 kgpu_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return first ? kgpu_error_set(err, KGPU_ENOENT, "%s: %s", path, strerror(errno)) : 0;
    if (!first && st.st_mtim.tv_sec == seen->st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == seen->st_mtim.tv_nsec && st.st_size == seen->st_size &&
        st.st_ino == seen->st_ino)
        return 0;
    *seen = st;
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    kgpu_error e = {0};
    int rc = kgpu_fake_gpus_load(path, &gpus, &n, &e);
    if (rc == 0)
        rc = take(ctx, gpus, n, &e);
    free(gpus);
    if (rc == 0)
        return 0;
    if (first) {
        *err = e;
        return rc;
    }
    dp_log(DP_ERROR, "%s (keeping the previous inventory)", e.msg);
    return 0;
}

bool dp_same_gpus(const dp_inventory *inv, const kgpu_gpu_info *gpus, int n)
{
    return inv->ngpus == n && memcmp(inv->gpus, gpus, (size_t)n * sizeof(*gpus)) == 0;
}
