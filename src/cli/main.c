/*
 * kgpu: the operator's command line. Dispatches to subcommands; installed
 * also as kubectl-kgpu so `kubectl kgpu ...` works.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kgpu <command> [options]\n"
               "\n"
               "commands:\n"
               "  simulate   replay a GPU trace against placement policies (FGD study method)\n"
               "  example    write the bundled synthetic example cluster and workload\n"
               "  inspect    GPU sharing as kgpu-extender sees it, per node and GPU\n"
               "  report     GPU-hours and cost per namespace, queue, GPU model and capacity type;\n"
               "             benchmark figures ranked by throughput per price (--benchmarks)\n"
               "  bench-export  a benchmark's throughput served to Prometheus (a Job's sidecar)\n"
               "  version    print the version\n"
               "\n"
               "`kgpu <command> --help` describes a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "simulate") == 0)
        return kgpu_cmd_simulate(argc - 1, argv + 1);
    if (strcmp(cmd, "example") == 0)
        return kgpu_cmd_example(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return kgpu_cmd_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "report") == 0)
        return kgpu_cmd_report(argc - 1, argv + 1);
    if (strcmp(cmd, "bench-export") == 0)
        return kgpu_cmd_bench_export(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kgpu %s\n", KGPU_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kgpu: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
