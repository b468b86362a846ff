/*
 * Unit tests of where the extender places multi-container pods, through its
 * own handlers in-process (no HTTP, no API server): whatever filter passes,
 * bind places, and whatever filter refuses, bind refuses, under every policy
 * a pod may name. Before filter and bind asked one placement search, a
 * policy that chose each container's GPUs on its own could strand a later
 * container, and bind refused a pod filter had passed, forever.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ext.h"
#include "kgpu/rng.h"

/* An extender without an API server, serving one node `ngpus` GPUs of `gmem` MiB each. */
static void daemon_with_node(ext_daemon *d, int ngpus, const int64_t *gmem)
{
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE];
    for (int i = 0; i < ngpus; i++)
        g[i] = (kgpu_gpu_spec){.index = i,
                               .model = gmem[i] == 15360 ? "T4" : "V100-PCIE-16GB",
                               .memory_mib = gmem[i],
                               .numa = i / 2,
                               .healthy = true};
    kgpu_node_spec spec = {
        .name = "n", .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = g, .ngpus = ngpus};
    kgpu_error err;
    if (ext_state_set_nodes(&d->state, &spec, 1, &err) != 0)
        fail_msg("set_nodes: %s", err.msg);
}

static void daemon_init(ext_daemon *d)
{
    memset(d, 0, sizeof(*d));
    ext_config_defaults(&d->cfg);
    d->cfg.log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    if (ext_state_init(&d->state, &d->cfg, &d->metrics, &err) != 0)
        fail_msg("state: %s", err.msg);
    d->state.nodes_synced = d->state.pods_synced = true;
}

/* POSTs a JSON value (stolen) to /verb; returns the parsed reply (caller decrefs). */
static json_t *post(ext_daemon *d, const char *verb, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    assert_non_null(text);
    char url[32];
    snprintf(url, sizeof(url), "/%s", verb);
    ext_response r;
    ext_handle(d, "POST", url, text, strlen(text), &r);
    free(text);
    if (r.status != 200)
        fail_msg("%s answered %d: %s", verb, r.status, r.body ? r.body : "");
    json_t *reply = json_loads(r.body, 0, NULL);
    free(r.body);
    assert_non_null(reply);
    return reply;
}

/* One container's limits: whole GPUs, or memory units (and compute %) over `count` GPUs. */
static json_t *container(int i, bool whole, int count, int core, int mem_each)
{
    char name[16];
    snprintf(name, sizeof(name), "c%d", i);
    json_t *limits = json_object();
    char v[32];
    if (whole) {
        snprintf(v, sizeof(v), "%d", count);
        json_object_set_new(limits, "nvidia.com/gpu", json_string(v));
    } else {
        if (mem_each > 0) {
            snprintf(v, sizeof(v), "%d", mem_each * count);
            json_object_set_new(limits, "kgpu.io/gpu-mem", json_string(v));
        }
        if (core > 0) {
            snprintf(v, sizeof(v), "%d", core);
            json_object_set_new(limits, "kgpu.io/gpu-core", json_string(v));
        }
        if (count > 1) {
            snprintf(v, sizeof(v), "%d", count);
            json_object_set_new(limits, "kgpu.io/gpu-count", json_string(v));
        }
    }
    return json_pack("{s:s,s:{s:o}}", "name", name, "resources", "limits", limits);
}

static json_t *pod(const char *uid, const char *policy, json_t *containers)
{
    return json_pack("{s:{s:s,s:s,s:s,s:{s:s}},s:{s:o}}", "metadata", "name", uid, "namespace",
                     "default", "uid", uid, "annotations", "kgpu.io/policy", policy, "spec",
                     "containers", containers);
}

/* Filter for node n: passed? Bind to a node: the Error ("" on success, malloc'd). */
static bool filter_passes(ext_daemon *d, json_t *p)
{
    json_t *reply =
        post(d, "filter", json_pack("{s:O,s:n,s:[s]}", "Pod", p, "Nodes", "NodeNames", "n"));
    bool pass = json_array_size(json_object_get(reply, "NodeNames")) == 1;
    json_decref(reply);
    return pass;
}

static char *bind(ext_daemon *d, const char *uid, const char *node)
{
    json_t *reply = post(d, "bind",
                         json_pack("{s:s,s:s,s:s,s:s}", "PodName", uid, "PodNamespace", "default",
                                   "PodUID", uid, "Node", node));
    char *err = strdup(json_string_value(json_object_get(reply, "Error")));
    json_decref(reply);
    return err;
}

/* Fills the node's GPUs at random, as pods bound before would (not known to the extender). */
static void fill_at_random(ext_daemon *d, kgpu_rng *rng)
{
    kgpu_cluster *c = d->state.cluster;
    const kgpu_node *n = kgpu_cluster_node(c, 0);
    for (int k = (int)kgpu_rng_below(rng, 5); k > 0; k--) {
        kgpu_request r = {.gpu_count = 1, .shape = -1};
        if (kgpu_rng_below(rng, 4) == 0) {
            r.exclusive = true;
            r.gpu_milli = KGPU_MILLI;
        } else {
            r.gpu_milli = 100 * (int)kgpu_rng_below(rng, 6);
            r.gpu_memory_mib = 1024 * (1 + (int64_t)kgpu_rng_below(rng, 10));
        }
        kgpu_request_compile(c, &r, NULL);
        int g[1] = {(int)kgpu_rng_below(rng, (uint64_t)n->ngpus)};
        kgpu_cluster_apply(c, &r, 0, g, NULL, NULL); /* refused when it does not fit: fine */
    }
}

/*
 * The case kube-scheduler met: two V100-16GB GPUs holding 8 GiB and 4 GiB;
 * [mem 2, mem 11] under spread. Filter passed; bind put mem 2 on the emptier
 * GPU and mem 11 then fit nowhere.
 */
static void test_spread_binds_what_filter_passed(void **state)
{
    ext_daemon *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    daemon_init(d);
    daemon_with_node(d, 2, (const int64_t[]){16384, 16384});
    kgpu_cluster *c = d->state.cluster;
    kgpu_request held = {.gpu_count = 1, .gpu_memory_mib = 8192, .shape = -1};
    kgpu_request_compile(c, &held, NULL);
    assert_int_equal(kgpu_cluster_apply(c, &held, 0, (int[]){0}, NULL, NULL), 0);
    held.gpu_memory_mib = 4096;
    assert_int_equal(kgpu_cluster_apply(c, &held, 0, (int[]){1}, NULL, NULL), 0);
    json_t *p =
        pod("p1", "spread",
            json_pack("[o,o]", container(0, false, 1, 0, 2), container(1, false, 1, 0, 11)));
    assert_true(filter_passes(d, p));
    char *err = bind(d, "p1", "n");
    assert_string_equal(err, "");
    free(err);
    const ext_pod *held_pod = kgpu_strmap_get(&d->state.pods, "p1");
    assert_non_null(held_pod);
    assert_int_equal(held_pod->part[0].a.gpus[0], 0); /* mem 2 beside the 8 GiB */
    assert_int_equal(held_pod->part[1].a.gpus[0], 1); /* mem 11 beside the 4 GiB */
    json_decref(p);
    ext_state_destroy(&d->state);
    free(d);
}

/*
 * For every policy the extender accepts: random multi-container pods on
 * random partly filled nodes. Filter says the node fits if and only if bind
 * then places the pod there; what bind holds stays within every GPU.
 */
static void test_filter_passes_iff_bind_places(void **state)
{
    ext_daemon *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    daemon_init(d);
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 2024, 9);
    long uid = 0;
    for (const kgpu_policy_ops *const *ops = kgpu_policy_list(); *ops != NULL; ops++) {
        int bound = 0, refused = 0;
        for (int trial = 0; trial < 150; trial++) {
            int ngpus = 2 + (int)kgpu_rng_below(&rng, 4);
            int64_t gmem[KGPU_MAX_GPUS_PER_NODE];
            for (int i = 0; i < ngpus; i++)
                gmem[i] = kgpu_rng_below(&rng, 4) == 0 ? 15360 : 16384;
            daemon_with_node(d, ngpus, gmem);
            fill_at_random(d, &rng);
            json_t *containers = json_array();
            int nc = 2 + (int)kgpu_rng_below(&rng, 3);
            for (int i = 0; i < nc; i++) {
                bool whole = kgpu_rng_below(&rng, 5) == 0;
                int count = 1 + (int)kgpu_rng_below(&rng, whole ? 2 : 3);
                int core = 10 * (int)kgpu_rng_below(&rng, 6);
                int mem = 1 + (int)kgpu_rng_below(&rng, 11);
                json_array_append_new(containers, container(i, whole, count, core, mem));
            }
            char id[32];
            snprintf(id, sizeof(id), "pod-%ld", ++uid);
            json_t *p = pod(id, (*ops)->name, containers);
            bool pass = filter_passes(d, p);
            char *err = bind(d, id, "n");
            if (pass != (err[0] == '\0'))
                fail_msg("%s trial %d: filter %s, bind: \"%s\"\npod: %s", (*ops)->name, trial,
                         pass ? "passed" : "refused", err, json_dumps(p, JSON_COMPACT));
            bound += pass;
            refused += !pass;
            const kgpu_node *n = kgpu_cluster_node(d->state.cluster, 0);
            for (int g = 0; g < n->ngpus; g++)
                assert_true(n->gpus[g].free_milli >= 0 && n->gpus[g].free_memory_mib >= 0);
            ext_state_release(&d->state, id);
            free(err);
            json_decref(p);
        }
        if (bound < 30 || refused < 30)
            fail_msg("%s: weak run: bound %d refused %d", (*ops)->name, bound, refused);
    }
    ext_state_destroy(&d->state);
    free(d);
}

/*
 * The search's budget per filter call: sixteen containers that defeat greedy
 * placement on twelve busy nodes. The first ten nodes get a full search
 * each (20000 steps, cut), the other two what is left of the call's budget
 * (one step): every node refused, saying the search was cut, and none
 * unresolvable. Bind then refuses the pod as filter did.
 */
static void test_filter_search_budget_per_call(void **state)
{
    ext_daemon *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    daemon_init(d);
    d->cfg.memory_unit_mib = 1; /* kgpu.io/gpu-mem in MiB, for sizes that do not round */
    static const int64_t fill[8] = {6176, 6199, 6615, 4113, 4627, 6941, 6979, 6371};
    static const int sizes[16] = {4056, 4151, 4708, 5276, 5764, 4651, 5577, 4547,
                                  4547, 4911, 5006, 4562, 4268, 5200, 5424, 4755};
    kgpu_gpu_spec g[8];
    for (int i = 0; i < 8; i++)
        g[i] = (kgpu_gpu_spec){.index = i,
                               .model = "V100-PCIE-16GB",
                               .memory_mib = 16384,
                               .numa = i / 4,
                               .healthy = true};
    kgpu_node_spec specs[12];
    char names[12][16];
    for (int k = 0; k < 12; k++) {
        snprintf(names[k], sizeof(names[k]), "busy-%d", k);
        specs[k] = (kgpu_node_spec){
            .name = names[k], .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = g, .ngpus = 8};
    }
    kgpu_error err;
    if (ext_state_set_nodes(&d->state, specs, 12, &err) != 0)
        fail_msg("set_nodes: %s", err.msg);
    for (int k = 0; k < 12; k++)
        for (int i = 0; i < 8; i++) {
            kgpu_request r = {.gpu_count = 1, .gpu_memory_mib = fill[i], .shape = -1};
            kgpu_request_compile(d->state.cluster, &r, NULL);
            assert_int_equal(kgpu_cluster_apply(d->state.cluster, &r, k, (int[]){i}, NULL, NULL),
                             0);
        }
    json_t *containers = json_array();
    for (int i = 0; i < 16; i++)
        json_array_append_new(containers, container(i, false, 1, 0, sizes[i]));
    json_t *p = pod("sixteen", "binpack", containers);
    json_t *list = json_array();
    for (int k = 0; k < 12; k++)
        json_array_append_new(list, json_string(names[k]));
    json_t *reply =
        post(d, "filter", json_pack("{s:O,s:n,s:o}", "Pod", p, "Nodes", "NodeNames", list));
    assert_int_equal(json_array_size(json_object_get(reply, "NodeNames")), 0);
    assert_int_equal(json_object_size(json_object_get(reply, "FailedAndUnresolvableNodes")), 0);
    json_t *failed = json_object_get(reply, "FailedNodes");
    assert_int_equal(json_object_size(failed), 12);
    for (int k = 0; k < 12; k++) {
        const char *why = json_string_value(json_object_get(failed, names[k]));
        assert_non_null(why);
        assert_non_null(strstr(why, "container 16 of 16: "));
        assert_non_null(strstr(why, k < 10 ? "after 20000 steps)" : "after 1 step)"));
    }
    json_decref(reply);
    char *e = bind(d, "sixteen", "busy-0");
    assert_non_null(strstr(e, "do not fit node busy-0 together: container 16 of 16: "));
    free(e);
    json_decref(p);
    ext_state_destroy(&d->state);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread_binds_what_filter_passed),
        cmocka_unit_test(test_filter_passes_iff_bind_places),
        cmocka_unit_test(test_filter_search_budget_per_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
