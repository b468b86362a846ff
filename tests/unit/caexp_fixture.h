/*
 * Cluster Autoscaler's messages, built as it sends them, for kgpu-expander's
 * tests and benchmark (test_caexp.c, bench/bench_caexp.c): a node group's
 * template node (GPU feature discovery's labels, nvidia.com/gpu allocatable)
 * and a pending pod of one container, each as protobuf bytes. Header-only;
 * each returns malloc'd bytes (the caller frees) or NULL when out of memory.
 */
#ifndef KGPU_TEST_CAEXP_FIXTURE_H
#define KGPU_TEST_CAEXP_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "caexp.h"

#define CAEXP_FX_LABELS 6

/*
 * A template with `gpus` GPUs of `product`, `mib` MiB each, `cpu` and `mem`
 * allocatable (quantities), and the extra labels `kv` (key, value, ...,
 * NULL; at most CAEXP_FX_LABELS - 2 pairs).
 */
static uint8_t *caexp_fx_node(const char *product, int gpus, int mib, const char *cpu,
                              const char *mem, const char *const *kv, size_t *len)
{
    char count[16], per_gpu[16];
    snprintf(count, sizeof(count), "%d", gpus);
    snprintf(per_gpu, sizeof(per_gpu), "%d", mib);
    const char *labels[2 * CAEXP_FX_LABELS] = {"nvidia.com/gpu.product", product,
                                               "nvidia.com/gpu.memory", per_gpu};
    size_t nl = 2;
    for (; kv != NULL && kv[0] != NULL && nl < CAEXP_FX_LABELS; kv += 2, nl++) {
        labels[2 * nl] = kv[0];
        labels[2 * nl + 1] = kv[1];
    }
    Kgpu__Caexp__ObjectMeta__LabelsEntry le[CAEXP_FX_LABELS], *lp[CAEXP_FX_LABELS];
    for (size_t i = 0; i < nl; i++) {
        Kgpu__Caexp__ObjectMeta__LabelsEntry e = KGPU__CAEXP__OBJECT_META__LABELS_ENTRY__INIT;
        e.key = (char *)labels[2 * i];
        e.value = (char *)labels[2 * i + 1];
        le[i] = e;
        lp[i] = &le[i];
    }
    Kgpu__Caexp__ObjectMeta meta = KGPU__CAEXP__OBJECT_META__INIT;
    meta.name = "template-node-for-group";
    meta.n_labels = nl;
    meta.labels = lp;
    const char *names[3] = {"cpu", "memory", "nvidia.com/gpu"};
    const char *values[3] = {cpu, mem, count};
    Kgpu__Caexp__Quantity q[3];
    Kgpu__Caexp__NodeStatus__AllocatableEntry ae[3], *ap[3];
    for (int i = 0; i < 3; i++) {
        Kgpu__Caexp__Quantity x = KGPU__CAEXP__QUANTITY__INIT;
        x.string = (char *)values[i];
        q[i] = x;
        Kgpu__Caexp__NodeStatus__AllocatableEntry e =
            KGPU__CAEXP__NODE_STATUS__ALLOCATABLE_ENTRY__INIT;
        e.key = (char *)names[i];
        e.value = &q[i];
        ae[i] = e;
        ap[i] = &ae[i];
    }
    Kgpu__Caexp__NodeStatus st = KGPU__CAEXP__NODE_STATUS__INIT;
    st.n_allocatable = 3;
    st.allocatable = ap;
    Kgpu__Caexp__Node node = KGPU__CAEXP__NODE__INIT;
    node.metadata = &meta;
    node.status = &st;
    *len = kgpu__caexp__node__get_packed_size(&node);
    uint8_t *b = malloc(*len ? *len : 1);
    if (b != NULL)
        kgpu__caexp__node__pack(&node, b);
    return b;
}

/* A pod in namespace ci, one container "main" limited to `cpu` and, given, `resource: amount`. */
static uint8_t *caexp_fx_pod(const char *name, const char *cpu, const char *resource,
                             const char *amount, size_t *len)
{
    Kgpu__Caexp__Quantity q[2] = {KGPU__CAEXP__QUANTITY__INIT, KGPU__CAEXP__QUANTITY__INIT};
    q[0].string = (char *)cpu;
    q[1].string = (char *)amount;
    const char *keys[2] = {"cpu", resource};
    Kgpu__Caexp__ResourceRequirements__LimitsEntry le[2], *lp[2];
    size_t nl = resource != NULL ? 2 : 1;
    for (size_t i = 0; i < nl; i++) {
        Kgpu__Caexp__ResourceRequirements__LimitsEntry e =
            KGPU__CAEXP__RESOURCE_REQUIREMENTS__LIMITS_ENTRY__INIT;
        e.key = (char *)keys[i];
        e.value = &q[i];
        le[i] = e;
        lp[i] = &le[i];
    }
    Kgpu__Caexp__ResourceRequirements rr = KGPU__CAEXP__RESOURCE_REQUIREMENTS__INIT;
    rr.n_limits = nl;
    rr.limits = lp;
    Kgpu__Caexp__Container c = KGPU__CAEXP__CONTAINER__INIT, *cp[1] = {&c};
    c.name = "main";
    c.resources = &rr;
    Kgpu__Caexp__PodSpec spec = KGPU__CAEXP__POD_SPEC__INIT;
    spec.n_containers = 1;
    spec.containers = cp;
    Kgpu__Caexp__ObjectMeta meta = KGPU__CAEXP__OBJECT_META__INIT;
    meta.name = (char *)name;
    meta.namespace_ = "ci";
    meta.uid = "uid-1";
    Kgpu__Caexp__Pod pod = KGPU__CAEXP__POD__INIT;
    pod.metadata = &meta;
    pod.spec = &spec;
    *len = kgpu__caexp__pod__get_packed_size(&pod);
    uint8_t *b = malloc(*len ? *len : 1);
    if (b != NULL)
        kgpu__caexp__pod__pack(&pod, b);
    return b;
}

#endif
