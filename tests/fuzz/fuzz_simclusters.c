/*
 * Fuzz target for the clusters file of `kgpu simulate --clusters`
 * (kgpu_clusters_split_parse, src/cli/simclusters.c): any bytes against a
 * small cluster of two models. Whatever comes in: an error, or a split
 * whose every node is in no cluster or in one of at most 16, names sorted.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simclusters.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kgpu_cluster *cluster(void)
{
    static kgpu_cluster *c;
    if (c != NULL)
        return c;
    c = kgpu_cluster_new();
    kgpu_error err;
    static const char *const models[] = {"T4", "T4", "P100", "T4", "P100"};
    for (int i = 0; i < 5; i++) {
        kgpu_gpu_spec g = {.index = 0, .model = models[i], .memory_mib = 16384, .numa = -1,
                           .healthy = true};
        char name[16];
        snprintf(name, sizeof(name), "n%d", i);
        kgpu_node_spec n = {.name = name, .cpu_milli = 64000, .memory_mib = 262144, .gpus = &g,
                            .ngpus = 1};
        if (c == NULL || kgpu_cluster_add_node(c, &n, &err) != i)
            abort();
    }
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kgpu_cluster *c = cluster();
    kgpu_multisim_split split;
    int cluster_of[5];
    kgpu_error err;
    if (kgpu_clusters_split_parse((const char *)data, size, "fuzz", c, &split, cluster_of,
                                  &err) != 0)
        return 0;
    if (split.nclusters < 1 || split.nclusters > KGPU_MULTISIM_CLUSTERS)
        abort();
    for (int i = 0; i < 5; i++)
        if (cluster_of[i] < -1 || cluster_of[i] >= split.nclusters)
            abort();
    for (int k = 1; k < split.nclusters; k++)
        if (strcmp(split.names[k - 1], split.names[k]) >= 0)
            abort();
    return 0;
}
