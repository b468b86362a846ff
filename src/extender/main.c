/*
 * kgpu-extender: the kube-scheduler HTTP extender of kgpu. Parses the
 * configuration, starts serving, and stops cleanly on SIGTERM or SIGINT.
 */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

/*
 * glibc's malloc, tuned for a daemon whose peaks are large transient buffers
 * (node lists, /metrics and /inspect renders of 40,000 GPUs) handled on ~20
 * threads. By default each thread may get its own arena (8 per core) that
 * keeps what it freed, and freeing a large mmap'd block raises the mmap and
 * trim thresholds to its size, so the next such buffers come from an arena
 * and stay there. Fixed thresholds keep blocks from 1 MiB up mmap'd (given
 * back on free, grown by mremap without a copy) and four arenas bound what
 * threads keep; measured in docs/e2e.md (peak RSS of bench/e2e_scale.sh).
 * MALLOC_ARENA_MAX or GLIBC_TUNABLES in the environment leave all of it to
 * the operator.
 */
static void tune_malloc(void)
{
    if (getenv("MALLOC_ARENA_MAX") != NULL || getenv("GLIBC_TUNABLES") != NULL)
        return;
    mallopt(M_ARENA_MAX, 4);
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
}

int main(int argc, char **argv)
{
    static ext_daemon d;
    tune_malloc();
    kgpu_error err;
    kgpu_error_clear(&err);
    ext_config_defaults(&d.cfg);
    int rc = ext_config_parse_args(&d.cfg, argc, argv, &err);
    if (rc == 1)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "kgpu-extender: %s\n", err.msg);
        return 2;
    }
    /* Signals go to this thread alone (sigwait below); every thread started later inherits the
     * mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (ext_daemon_start(&d, &err) != 0) {
        ext_log(EXT_ERROR, "%s", err.msg);
        ext_daemon_stop(&d);
        return 1;
    }
    if (d.cfg.port_file[0]) {
        FILE *f = fopen(d.cfg.port_file, "w");
        if (f == NULL || fprintf(f, "%d\n", d.port) < 0 || fclose(f) != 0) {
            ext_log(EXT_ERROR, "cannot write %s", d.cfg.port_file);
            ext_daemon_stop(&d);
            return 1;
        }
    }
    int sig = 0;
    sigwait(&set, &sig);
    ext_log(EXT_INFO, "%s: stopping", strsignal(sig));
    ext_daemon_stop(&d);
    return 0;
}
