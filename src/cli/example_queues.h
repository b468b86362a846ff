/*
 * A bursty multi-team example for GPU queues (`kgpu example --queues`): a
 * cluster, a workload whose teams take turns wanting more than their share,
 * and the queue file that divides the cluster between them.
 */
#ifndef KGPU_CLI_EXAMPLE_QUEUES_H
#define KGPU_CLI_EXAMPLE_QUEUES_H

#include <stdint.h>

#include "kgpu/error.h"

/*
 * Writes <dir>/nodes.csv, <dir>/pods.csv (11-column layout, pods named
 * team-X-NNNNN) and <dir>/queues.yaml. `nodes` nodes of 8 GPUs; four
 * teams guaranteed 40/30/20/10 % of the GPUs, each in bursts of about 1.6
 * times its guarantee at its own hours of a simulated day, and 0.15 times
 * between. Depends only on seed and nodes. 0 or an error naming the path.
 */
int kgpu_example_queues_write(const char *dir, uint64_t seed, int nodes, kgpu_error *err);

#endif
