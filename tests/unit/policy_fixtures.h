/*
 * Shared by the policy unit tests (test_policy.c, test_policy_kgpu.c): build
 * clusters and requests that fail the test on error, and drive one policy's
 * state through its ops table so raw scores can be compared. Header-only;
 * include it once per test program, after cmocka.h.
 */
#ifndef KGPU_TEST_POLICY_FIXTURES_H
#define KGPU_TEST_POLICY_FIXTURES_H

#include <stdlib.h>

#include "kgpu/model.h"
#include "kgpu/policy.h"

/* Adds a node with `ngpus` healthy GPUs of one model (32 GiB each); fails the test on error. */
static inline int add_node(kgpu_cluster *c, const char *name, int64_t cpu, int ngpus,
                           const char *model)
{
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){
            .index = i, .model = model, .memory_mib = 32768, .numa = -1, .healthy = true};
    kgpu_node_spec s = {
        .name = name, .cpu_milli = cpu, .memory_mib = 1 << 20, .gpus = g, .ngpus = ngpus};
    kgpu_error e;
    int rc = kgpu_cluster_add_node(c, &s, &e);
    if (rc < 0)
        fail_msg("add_node %s: %s", name, e.msg);
    return rc;
}

static inline void compile(const kgpu_cluster *c, kgpu_request *r)
{
    kgpu_error e;
    if (kgpu_request_compile(c, r, &e) != 0)
        fail_msg("compile: %s", e.msg);
}

static inline kgpu_request cpu_req(const kgpu_cluster *c, int64_t cpu)
{
    kgpu_request r = {.cpu_milli = cpu, .shape = -1};
    compile(c, &r);
    return r;
}

static inline kgpu_request whole_req(const kgpu_cluster *c, int64_t cpu, int count)
{
    kgpu_request r = {.cpu_milli = cpu,
                      .gpu_count = count,
                      .gpu_milli = KGPU_MILLI,
                      .exclusive = true,
                      .shape = -1};
    compile(c, &r);
    return r;
}

/* Applies and fails the test unless it succeeds. */
static inline kgpu_assignment apply_ok(kgpu_cluster *c, const kgpu_request *r, int node,
                                       const int *gpus)
{
    kgpu_assignment a;
    kgpu_error e;
    if (kgpu_cluster_apply(c, r, node, gpus, &a, &e) != 0)
        fail_msg("apply on node %d: %s", node, e.msg);
    return a;
}

/* A policy's state driven through the public ops table, so raw scores can be compared. */
typedef struct state_handle {
    const kgpu_policy_ops *ops;
    void *state;
} state_handle;

/* The named policy's state, initialised for c and w; free with state_close. */
static inline state_handle state_open(const char *policy, const kgpu_cluster *c,
                                      const kgpu_workload *w)
{
    state_handle h = {kgpu_policy_find(policy), NULL};
    assert_non_null(h.ops);
    h.state = calloc(1, h.ops->state_size);
    assert_non_null(h.state);
    kgpu_error e;
    if (h.ops->init(h.state, c, w, &e) != 0)
        fail_msg("%s init: %s", policy, e.msg);
    return h;
}

static inline void state_close(state_handle *h)
{
    h->ops->fini(h->state);
    free(h->state);
}

#endif
