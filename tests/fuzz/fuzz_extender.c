/*
 * Fuzz target for the extender's request parsers: every byte string is fed
 * to filter, prioritize, bind or preempt (first byte chooses; 'E' is POST
 * /estimate, whose answer must also leave every GPU as it was) of an
 * in-process extender with a small cluster and no API server. Whatever comes
 * in, the answer is a status and a body, and the state stays within capacity.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ext.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ext_daemon *daemon_for_fuzzing(void)
{
    static ext_daemon d;
    static int calls;
    if (calls++ % 512 == 0) { /* start afresh now and then so reservations cannot pile up */
        if (calls > 1)
            ext_state_destroy(&d.state);
        ext_config_defaults(&d.cfg);
        d.cfg.log_level = -1;
        d.cfg.max_node_names = 64; /* within reach of small inputs (corpus: *_over_cap) */
        ext_log_set_level(-1);
        kgpu_error err;
        if (ext_state_init(&d.state, &d.cfg, &d.metrics, &err) != 0)
            abort();
        static const kgpu_gpu_spec a[] = {
            {0, "GPU-0", "A100", 81920, 0, true},
            {1, "GPU-1", "A100", 81920, 1, true},
        };
        static const kgpu_gpu_spec t[] = {{0, "GPU-t", "T4", 15360, -1, true}};
        kgpu_node_spec specs[] = {
            {.name = "n1", .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = a, .ngpus = 2},
            {.name = "n2", .cpu_milli = 32000, .memory_mib = 1 << 17, .gpus = t, .ngpus = 1},
        };
        if (ext_state_set_nodes(&d.state, specs, 2, &err) != 0)
            abort();
        d.state.nodes_synced = d.state.pods_synced = true;
    }
    return &d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    static const char *verbs[] = {"/filter", "/prioritize", "/bind", "/preempt"};
    ext_daemon *d = daemon_for_fuzzing();
    ext_response r;
    bool estimate = data[0] == 'E';
    int64_t held = estimate ? kgpu_cluster_gpu_milli_allocated(d->state.cluster) : 0;
    ext_handle(d, "POST", estimate ? "/estimate" : verbs[data[0] & 3], (const char *)data + 1,
               size - 1, &r);
    if (estimate && kgpu_cluster_gpu_milli_allocated(d->state.cluster) != held)
        abort(); /* an estimate holds nothing */
    if (r.status < 200 || r.status > 599 || r.body == NULL)
        abort();
    free(r.body);
    /* Nothing the requests did may overbook a GPU. */
    const kgpu_cluster *c = d->state.cluster;
    for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
        const kgpu_node *n = kgpu_cluster_node(c, i);
        for (int g = 0; g < n->ngpus; g++)
            if (n->gpus[g].free_milli < 0 || n->gpus[g].free_memory_mib < 0)
                abort();
    }
    return 0;
}
