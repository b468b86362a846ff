/*
 * `kgpu example`: writes the synthetic cluster and workload the README's
 * quick start runs, so trying kgpu needs no external trace.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "example.h"
#include "example_queues.h"

int kgpu_cmd_example(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 's'},
        {"nodes", required_argument, NULL, 'n'},
        {"queues", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool queues = false;
    const char *dir = "examples";
    unsigned long long seed = 1;
    long nodes = 64;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'o':
            dir = optarg;
            break;
        case 's':
            seed = strtoull(optarg, &end, 10);
            if (end == optarg || *end) {
                fprintf(stderr, "kgpu example: --seed '%s': expected an integer\n", optarg);
                return 2;
            }
            break;
        case 'n':
            nodes = strtol(optarg, &end, 10);
            if (end == optarg || *end || nodes < 1 || nodes > 100000) {
                fprintf(stderr, "kgpu example: --nodes '%s': expected 1..100000\n", optarg);
                return 2;
            }
            break;
        case 'q':
            queues = true;
            break;
        case 'h':
            printf("usage: kgpu example [--out DIR] [--seed N] [--nodes N] [--queues]\n"
                   "Writes DIR/nodes.csv and DIR/pods.csv: a synthetic GPU cluster and workload\n"
                   "in the Alibaba trace format (default DIR=examples, seed 1, 64 nodes).\n"
                   "--queues: instead a bursty day of four teams on 8-GPU nodes, and\n"
                   "DIR/queues.yaml dividing the cluster between them (docs/queues.md).\n");
            return 0;
        default:
            return 2;
        }
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    if (queues) {
        if (kgpu_example_queues_write(dir, seed, (int)nodes, &err) != 0) {
            fprintf(stderr, "kgpu example: %s\n", err.msg);
            return 1;
        }
        printf("wrote %s/nodes.csv, %s/pods.csv and %s/queues.yaml\n", dir, dir, dir);
        return 0;
    }
    if (kgpu_example_write(dir, seed, (int)nodes, &err) != 0) {
        fprintf(stderr, "kgpu example: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s/nodes.csv and %s/pods.csv\n", dir, dir);
    return 0;
}
