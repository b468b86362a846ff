/*
 * What the unit tests of the extender's state share: a quiet state, two
 * nodes of four GPUs each, and a queue tree loaded from YAML text. Include after
 * cmocka.h, decide.h and queuefile.h.
 */
#ifndef KGPU_TEST_EXTENDER_FIXTURE_H
#define KGPU_TEST_EXTENDER_FIXTURE_H

/* A state on the default configuration, quiet. */
static inline void ext_fixture_state(ext_config *cfg, ext_state *st, ext_metrics *m)
{
    ext_config_defaults(cfg);
    cfg->log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    if (ext_state_init(st, cfg, m, &err) != 0)
        fail_msg("state: %s", err.msg);
}

/* Nodes n0 and n1 (the first n of them), each with four GPUs of models[i] and mib[i]. */
static inline void ext_fixture_nodes(ext_state *st, kgpu_gpu_spec g[2][4], kgpu_node_spec nodes[2],
                                     const char *const models[2], const int64_t mib[2], int n)
{
    static const char *const name[2] = {"n0", "n1"};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 4; k++)
            g[i][k] = (kgpu_gpu_spec){
                .index = k, .model = models[i], .memory_mib = mib[i], .numa = -1, .healthy = true};
        nodes[i] = (kgpu_node_spec){.name = name[i],
                                    .cpu_milli = 64000,
                                    .memory_mib = 1 << 18,
                                    .gpus = g[i],
                                    .ngpus = 4};
    }
    kgpu_error err;
    if (ext_state_set_nodes(st, nodes, n, &err) != 0)
        fail_msg("nodes: %s", err.msg);
}

/* The queue tree of the `queues:` text, in force. */
static inline void ext_fixture_queues(ext_state *st, const char *text)
{
    kgpu_queues *qs;
    kgpu_error err;
    if (kgpu_queues_load(text, strlen(text), "q.yaml", &qs, &err) != 0)
        fail_msg("queues: %s", err.msg);
    ext_queues_set(st, qs);
}

#endif
