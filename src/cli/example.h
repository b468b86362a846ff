/*
 * The bundled example: a small synthetic GPU cluster and workload written in
 * the Alibaba GPU trace's CSV formats, so `kgpu simulate` can be tried (and
 * tested) without downloading the trace.
 */
#ifndef KGPU_CLI_EXAMPLE_H
#define KGPU_CLI_EXAMPLE_H

#include <stdint.h>

#include "kgpu/error.h"

/* Largest cluster kgpu_example_write accepts. */
#define KGPU_EXAMPLE_MAX_NODES 100000

/*
 * Writes <dir>/nodes.csv (`sn,cpu_milli,memory_mib,gpu,model`) and
 * <dir>/pods.csv (the 11-column pod layout), creating dir and its parents
 * if needed. The cluster has `nodes` nodes in a mix like a real GPU fleet;
 * the workload asks for about 0.95 of its GPUs. The output depends only on
 * seed and nodes: byte-identical on every machine.
 * Returns 0, KGPU_EINVAL (no dir, nodes outside 1..KGPU_EXAMPLE_MAX_NODES),
 * KGPU_ENOMEM, or KGPU_EIO naming the path that failed; a file that could
 * not be written completely is removed.
 */
int kgpu_example_write(const char *dir, uint64_t seed, int nodes, kgpu_error *err);

#endif
