/*
 * Shared pieces of the extender benchmarks (see extender_bench.h): the same
 * synthetic cluster and the same way of starting the daemon, so their
 * figures are comparable.
 */
#include "extender_bench.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

unsigned long long bench_splitmix(unsigned long long *x)
{
    unsigned long long z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

long bench_rss_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, field, strlen(field)) == 0)
            kb = strtol(line + strlen(field) + 1, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

pid_t bench_start_extender(const char *binary, int nodes, int gpus, const char *const *extra,
                           const char *log_level, char *dir, size_t dirlen, int *port)
{
    if (snprintf(dir, dirlen, "/tmp/kgpu-bench-XXXXXX") >= (int)dirlen || mkdtemp(dir) == NULL)
        return -1;
    char cluster[128], portfile[128];
    snprintf(cluster, sizeof(cluster), "%s/cluster.yaml", dir);
    snprintf(portfile, sizeof(portfile), "%s/port", dir);
    FILE *f = fopen(cluster, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "nodes:\n");
    for (int i = 0; i < nodes; i++) {
        fprintf(f, "- name: node-%04d\n  gpus:\n", i);
        for (int g = 0; g < gpus; g++)
            fprintf(f, "  - {index: %d, uuid: GPU-%04d-%d, model: %s, memory_mib: %d, numa: %d}\n",
                    g, i, g, i % 3 ? "A100-SXM4-80GB" : "V100-SXM2-32GB", i % 3 ? 81920 : 32768,
                    g / 4);
    }
    fclose(f);
    const char *argv[32] = {binary,     "--cluster-file", cluster,
                            "--listen", "127.0.0.1:0",    "--port-file",
                            portfile,   "--log-level",    log_level};
    int argc = 9;
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 31; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execv(binary, (char *const *)argv);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    *port = 0;
    for (int i = 0; i < 600 && *port == 0; i++) { /* 30 s: a 40,000-GPU file takes a while */
        usleep(50000);
        FILE *p = fopen(portfile, "r");
        if (p) {
            if (fscanf(p, "%d", port) != 1)
                *port = 0;
            fclose(p);
        }
    }
    if (*port == 0) {
        fprintf(stderr, "%s did not start on %s\n", binary, cluster);
        kill(pid, SIGTERM);
        return -1;
    }
    return pid;
}

void bench_remove_scratch(const char *dir)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/cluster.yaml", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/port", dir);
    unlink(path);
    rmdir(dir);
}
