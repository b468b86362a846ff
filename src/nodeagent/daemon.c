/*
 * A node agent's life around its own loop (nodeagent.h): main() after the
 * flags (signals, gRPC's global state, the exit status), the API server
 * connection, and the fake inventory's polling.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include "log.h"
#include "nodeagent.h"

static atomic_bool *stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(stop_flag, true);
}

int node_daemon_main(const char *prog, int parse_rc, const kgpu_error *perr, node_daemon_fn run,
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
    node_grpc_init();
    int rc = run(cfg, &stop, &err);
    node_grpc_shutdown();
    if (rc != 0) {
        kgpu_log(KGPU_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    return 0;
}

int node_state_check(const node_config *c, kgpu_error *err)
{
    /* Not made yet (the agent makes it): the filesystem it will be made on. */
    char dir[sizeof(c->state_dir)];
    snprintf(dir, sizeof(dir), "%s", c->state_dir);
    struct statfs fs;
    int rc;
    while ((rc = statfs(dir, &fs)) != 0 && errno == ENOENT && strrchr(dir, '/') != NULL &&
           strrchr(dir, '/') != dir)
        *strrchr(dir, '/') = '\0';
    if (rc != 0 && errno == ENOENT && dir[0] == '/')
        rc = statfs("/", &fs);
    if (rc != 0)
        return kgpu_error_set(err, KGPU_EIO, "--state-dir %s: %s", c->state_dir, strerror(errno));
    long double size = (long double)fs.f_blocks * (long double)fs.f_frsize;
    if (size <= (long double)c->state_limit)
        return 0;
    kgpu_error e = {0};
    kgpu_error_set(&e, KGPU_ERANGE,
                   "--state-dir %s is on a filesystem of %.0Lf MiB, more than --state-limit "
                   "(%lld MiB): containers write into it outside their pods' ephemeral-storage, "
                   "so a tenant can fill it; give it a filesystem of its own that small "
                   "(docs/install-device-plugin.md, \"The state folder's filesystem\")",
                   c->state_dir, size / (1024.0L * 1024.0L),
                   (long long)(c->state_limit / (1024 * 1024)));
    if (c->state_refuse) {
        if (err != NULL)
            *err = e;
        return KGPU_ERANGE;
    }
    kgpu_log(KGPU_LOG_WARN, "%s", e.msg);
    return 0;
}

int node_k8s_connect(const char *kubeconfig, kgpu_k8s **out, bool *no_cluster, kgpu_error *err)
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

int node_fake_poll(const char *path, struct stat *seen, bool first, node_gpus_fn take, void *ctx,
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
    kgpu_log(KGPU_LOG_ERROR, "%s (keeping the previous inventory)", e.msg);
    return 0;
}

bool node_same_gpus(const contract_inventory *inv, const kgpu_gpu_info *gpus, int n)
{
    return inv->ngpus == n && memcmp(inv->gpus, gpus, (size_t)n * sizeof(*gpus)) == 0;
}

int node_drain_xids(kgpu_nvml *nv, bool bad[KGPU_MAX_GPUS_PER_NODE], const char *effect)
{
    int marked = 0;
    /* A bounded drain: the callers' loops pace themselves. */
    for (int i = 0; i < 64; i++) {
        int idx;
        unsigned long long xid;
        kgpu_error e = {0};
        int rc = kgpu_nvml_wait_xid(nv, 0, &idx, &xid, &e);
        if (rc <= 0) {
            if (rc < 0)
                kgpu_log(KGPU_LOG_WARN, "%s", e.msg);
            break;
        }
        if (idx >= 0 && idx < KGPU_MAX_GPUS_PER_NODE && !bad[idx]) {
            kgpu_log(KGPU_LOG_WARN, "GPU %d: XID %llu: %s", idx, xid, effect);
            bad[idx] = true;
            marked++;
        }
    }
    return marked;
}
