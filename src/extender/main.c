/*
 * kgpu-extender: the kube-scheduler HTTP extender of kgpu. Parses the
 * configuration, starts serving, and stops cleanly on SIGTERM or SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ext.h"

int main(int argc, char **argv)
{
    static ext_daemon d;
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
