/*
 * The device plugin's pure parts: device IDs and the ListAndWatch message,
 * preferred allocations, the Allocate matcher (which pod and container),
 * and the container's limits file, environment and mounts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "deviceplugin.pb-c.h"
#include "dp.h"
#include "gpusched.h"

#define U0   "GPU-aaaaaaaa-0000-4000-8000-000000000000"
#define U1   "GPU-aaaaaaaa-0000-4000-8000-000000000001"
#define ALL  (1u << DP_RES_MEM | 1u << DP_RES_CORE)
#define NODE "gpu-0"

static void inventory(contract_inventory *inv, int64_t unit_mib)
{
    memset(inv, 0, sizeof(*inv));
    inv->ngpus = 2;
    inv->unit_mib = unit_mib;
    const char *u[2] = {U0, U1};
    for (int i = 0; i < 2; i++) {
        inv->gpus[i].index = i;
        snprintf(inv->gpus[i].uuid, sizeof(inv->gpus[i].uuid), "%s", u[i]);
        snprintf(inv->gpus[i].model, sizeof(inv->gpus[i].model), "Tesla-T4");
        inv->gpus[i].memory_mib = 15360;
        inv->gpus[i].numa = i == 0 ? 0 : -1;
        inv->gpus[i].healthy = true;
    }
}

/* ---- device IDs and ListAndWatch ---- */

static void test_device_ids(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv, 1024);
    assert_int_equal(dp_devices_per_gpu(&inv, 0, DP_RES_MEM), 15);
    assert_int_equal(dp_devices_per_gpu(&inv, 0, DP_RES_CORE), 100);
    assert_int_equal(dp_devices_per_gpu(&inv, 1, DP_RES_WHOLE), 1);
    inv.unit_mib = 512;
    assert_int_equal(dp_devices_per_gpu(&inv, 1, DP_RES_ALIAS), 30);
    inv.unit_mib = 1024;
    char id[160];
    dp_device_id(&inv, 1, DP_RES_MEM, 14, id, sizeof(id));
    assert_string_equal(id, U1 "::14");
    assert_int_equal(dp_device_gpu(&inv, DP_RES_MEM, id), 1);
    dp_device_id(&inv, 0, DP_RES_WHOLE, 0, id, sizeof(id));
    assert_string_equal(id, U0);
    assert_int_equal(dp_device_gpu(&inv, DP_RES_WHOLE, U0), 0);
    /* Strangers: past the last unit, malformed numbers, unknown GPUs, wrong resource shape. */
    const char *bad[] = {U1 "::15", U1 "::", U1 "::01",      U1 "::-1", U1 "::+1",
                         U1 "::1x", U1,      "GPU-other::0", "::0",     ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(dp_device_gpu(&inv, DP_RES_MEM, bad[i]), -1);
    assert_int_equal(dp_device_gpu(&inv, DP_RES_CORE, U1 "::99"), 1);
    assert_int_equal(dp_device_gpu(&inv, DP_RES_CORE, U1 "::100"), -1);
    assert_int_equal(dp_device_gpu(&inv, DP_RES_WHOLE, U1 "::0"), -1);
    assert_int_equal(dp_res_from_name("kgpu.io/gpu-core"), DP_RES_CORE);
    assert_int_equal(dp_res_from_name("kgpu.io/gpu-count"), -1);
}

static void test_list_encode(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv, 1024);
    inv.gpus[1].healthy = false;
    uint8_t *buf;
    size_t len;
    kgpu_error err = {0};
    assert_int_equal(dp_list_encode(&inv, DP_RES_MEM, &buf, &len, &err), 0);
    V1beta1__ListAndWatchResponse *m = v1beta1__list_and_watch_response__unpack(NULL, len, buf);
    assert_non_null(m);
    assert_int_equal(m->n_devices, 30);
    assert_string_equal(m->devices[0]->id, U0 "::0");
    assert_string_equal(m->devices[0]->health, "Healthy");
    assert_non_null(m->devices[0]->topology);
    assert_int_equal(m->devices[0]->topology->n_nodes, 1);
    assert_int_equal(m->devices[0]->topology->nodes[0]->id, 0);
    assert_string_equal(m->devices[29]->id, U1 "::14");
    assert_string_equal(m->devices[29]->health, "Unhealthy");
    assert_null(m->devices[29]->topology); /* NUMA unknown: no topology at all */
    v1beta1__list_and_watch_response__free_unpacked(m, NULL);
    free(buf);

    /* One device per MiB of eight 80 GiB GPUs would blow kubelet's 4 MiB limit. */
    inv.ngpus = 8;
    for (int i = 0; i < 8; i++) {
        inv.gpus[i] = inv.gpus[0];
        snprintf(inv.gpus[i].uuid, sizeof(inv.gpus[i].uuid), "GPU-%08d-1111-2222-3333-444444444444",
                 i);
        inv.gpus[i].memory_mib = 81920;
    }
    inv.unit_mib = 1;
    assert_int_equal(dp_list_encode(&inv, DP_RES_MEM, &buf, &len, &err), KGPU_ERANGE);
    assert_null(buf);
    assert_non_null(strstr(err.msg, "use a memory unit of at least"));
    assert_non_null(strstr(err.msg, "655360 devices"));
    /* The unit it names is the smallest that fits, from any refused unit. */
    for (int64_t unit = 1; unit <= 32; unit *= 32) {
        inv.unit_mib = unit;
        assert_int_equal(dp_list_encode(&inv, DP_RES_MEM, &buf, &len, &err), KGPU_ERANGE);
        const char *at = strstr(err.msg, "at least ");
        assert_non_null(at);
        int64_t need = strtoll(at + 9, NULL, 10);
        inv.unit_mib = need;
        assert_int_equal(dp_list_encode(&inv, DP_RES_MEM, &buf, &len, &err), 0);
        assert_true(len <= DP_MAX_LIST_BYTES);
        free(buf);
        inv.unit_mib = need - 1;
        assert_int_equal(dp_list_encode(&inv, DP_RES_MEM, &buf, &len, &err), KGPU_ERANGE);
    }
}

/* ---- preferred allocation ---- */

static void test_prefer(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv, 1024);
    /* Available: GPU 0 units 0-9, GPU 1 units 0-4 (GPU 1 is fuller). */
    char ids[15][160];
    const char *avail[15];
    for (int i = 0; i < 15; i++) {
        dp_device_id(&inv, i < 10 ? 0 : 1, DP_RES_MEM, i < 10 ? i : i - 10, ids[i], sizeof(ids[i]));
        avail[i] = ids[i];
    }
    int chosen[15];
    /* No target: pack onto the GPU with the fewest available devices (GPU 1) first. */
    int n = dp_prefer(&inv, DP_RES_MEM, avail, 15, NULL, 0, 6, NULL, chosen);
    assert_int_equal(n, 6);
    for (int i = 0; i < 5; i++)
        assert_int_equal(dp_device_gpu(&inv, DP_RES_MEM, avail[chosen[i]]), 1);
    assert_int_equal(dp_device_gpu(&inv, DP_RES_MEM, avail[chosen[5]]), 0);
    /* A target on GPU 0 wins over packing; must-include comes first whatever it is. */
    dp_want want = {.n = 1, .gpu = {0}, .count = {4}};
    const char *must[] = {ids[12]};
    n = dp_prefer(&inv, DP_RES_MEM, avail, 15, must, 1, 4, &want, chosen);
    assert_int_equal(n, 4);
    assert_int_equal(chosen[0], 12);
    for (int i = 1; i < 4; i++)
        assert_int_equal(dp_device_gpu(&inv, DP_RES_MEM, avail[chosen[i]]), 0);
    /* Without a target, the rest goes where the must-include ID is (GPU 0, the emptier one). */
    const char *must0[] = {ids[3]};
    n = dp_prefer(&inv, DP_RES_MEM, avail, 15, must0, 1, 3, NULL, chosen);
    assert_int_equal(n, 3);
    assert_int_equal(chosen[0], 3);
    for (int i = 1; i < 3; i++)
        assert_int_equal(dp_device_gpu(&inv, DP_RES_MEM, avail[chosen[i]]), 0);
    /* Never more than asked, never an index twice. */
    n = dp_prefer(&inv, DP_RES_MEM, avail, 15, NULL, 0, 15, &want, chosen);
    assert_int_equal(n, 15);
    int seen[15] = {0};
    for (int i = 0; i < n; i++)
        assert_int_equal(seen[chosen[i]]++, 0);
}

/* ---- the matcher ---- */

/* A pod JSON; containers as JSON text; annotations added by the caller. */
static json_t *pod(const char *name, const char *node, const char *containers, const char *init,
                   const char *assignment)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"metadata\":{\"name\":\"%s\",\"namespace\":\"default\",\"uid\":\"uid-%s\","
             "\"annotations\":{}},\"spec\":{\"nodeName\":\"%s\",\"containers\":%s%s%s},"
             "\"status\":{\"phase\":\"Pending\"}}",
             name, name, node, containers, init ? ",\"initContainers\":" : "", init ? init : "");
    json_error_t je;
    json_t *p = json_loads(text, 0, &je);
    assert_non_null(p);
    json_t *ann = json_object_get(json_object_get(p, "metadata"), "annotations");
    if (assignment != NULL) {
        json_object_set_new(ann, "kgpu.io/assignment", json_string(assignment));
        json_object_set_new(ann, "kgpu.io/node", json_string(node));
    }
    return p;
}

static void annotate(json_t *p, const char *key, const char *value)
{
    json_t *ann = json_object_get(json_object_get(p, "metadata"), "annotations");
    json_object_set_new(ann, key, json_string(value));
}

#define MAIN4 "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"4\"}}}]"
#define ASSIGN(c, idx, uuid, mib)                                                                  \
    "[{\"container\":\"" c "\",\"gpus\":[{\"index\":" #idx ",\"uuid\":\"" uuid                     \
    "\",\"milli\":0,\"memory_mib\":" #mib "}],\"exclusive\":false}]"

static void test_match_single(void **state)
{
    (void)state;
    json_t *items = json_array();
    json_array_append_new(items, pod("a", NODE, MAIN4, NULL, ASSIGN("main", 1, U1, 4096)));
    dp_match m;
    kgpu_error err = {0};
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "a");
    assert_string_equal(m.t.uid, "uid-a");
    assert_string_equal(m.t.container, "main");
    assert_int_equal(m.t.ngpus, 1);
    assert_string_equal(m.t.gpus[0].uuid, U1);
    assert_int_equal(m.t.gpus[0].index, 1);
    assert_int_equal(m.t.gpus[0].memory_mib, 4096);
    assert_true(m.primary);
    assert_true(m.complete);
    assert_string_equal(m.progress, "main:kgpu.io/gpu-mem");
    assert_int_equal(m.t.pod_units, 4);
    /* The wrong count finds nothing and says what is awaited. */
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 3, ALL, 1024, &m, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "default/a container main asks 4"));
    /* Another node's plugin sees nothing. */
    assert_int_equal(dp_match_find(items, "gpu-1", DP_RES_MEM, 4, ALL, 1024, &m, &err),
                     KGPU_ENOENT);
    json_decref(items);
}

static void test_match_same_size(void **state)
{
    (void)state;
    json_t *items = json_array();
    json_t *a = pod("a", NODE, MAIN4, NULL, ASSIGN("main", 0, U0, 4096));
    json_t *b = pod("b", NODE, MAIN4, NULL, ASSIGN("main", 1, U1, 4096));
    json_array_append(items, a);
    json_array_append(items, b);
    dp_match m;
    kgpu_error err = {0};
    /* Two same-size pods awaiting at once: refuse, naming both. */
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EAMBIG);
    assert_non_null(strstr(err.msg, "default/a (container main)"));
    assert_non_null(strstr(err.msg, "default/b (container main)"));
    /* Once a is allocated, b is the one, with its own GPU. */
    annotate(a, "kgpu.io/allocated", "2026-11-26T00:00:00Z");
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "b");
    assert_string_equal(m.t.gpus[0].uuid, U1);
    /* Terminal, deleting, or assigned to another node: not awaiting. */
    json_object_del(json_object_get(a, "metadata"), "annotations");
    json_object_set_new(json_object_get(a, "metadata"), "annotations", json_object());
    annotate(a, "kgpu.io/assignment", ASSIGN("main", 0, U0, 4096));
    json_object_set_new(json_object_get(a, "status"), "phase", json_string("Failed"));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "b");
    json_object_set_new(json_object_get(a, "status"), "phase", json_string("Running"));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "b");
    json_object_set_new(json_object_get(a, "status"), "phase", json_string("Pending"));
    json_object_set_new(json_object_get(a, "metadata"), "deletionTimestamp",
                        json_string("2026-11-26T00:00:00Z"));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "b");
    json_object_del(json_object_get(a, "metadata"), "deletionTimestamp");
    annotate(a, "kgpu.io/node", "gpu-9");
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "b");
    json_decref(a);
    json_decref(b);
    json_decref(items);
}

static void test_match_sizes_tell_apart(void **state)
{
    (void)state;
    json_t *items = json_array();
    json_array_append_new(items, pod("a", NODE, MAIN4, NULL, ASSIGN("main", 0, U0, 4096)));
    json_array_append_new(
        items, pod("b", NODE,
                   "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"2\"}}}]",
                   NULL, ASSIGN("main", 1, U1, 2048)));
    dp_match m;
    kgpu_error err = {0};
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 2, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "b");
    assert_string_equal(m.t.gpus[0].uuid, U1);
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_string_equal(m.t.name, "a");
    assert_string_equal(m.t.gpus[0].uuid, U0);
    json_decref(items);
}

/* Replays kubelet's calls for a pod, feeding back the progress as the API server would. */
static void serve(json_t *items, json_t *p, dp_res r, int64_t count, const char *container,
                  bool primary, bool complete, dp_match *m)
{
    kgpu_error err = {0};
    int rc = dp_match_find(items, NODE, r, count, ALL, 1024, m, &err);
    if (rc != 0)
        fail_msg("%s", err.msg);
    assert_string_equal(m->t.container, container);
    assert_int_equal(m->primary, primary);
    assert_int_equal(m->complete, complete);
    if (complete) {
        annotate(p, "kgpu.io/allocated", "now");
        json_object_del(json_object_get(json_object_get(p, "metadata"), "annotations"),
                        "kgpu.io/allocating");
    } else {
        annotate(p, "kgpu.io/allocating", m->progress);
    }
}

static void test_match_multi_container(void **state)
{
    (void)state;
    /* An init container (2 units, covered by main), main (4 units) and side (2 units + 30 %). */
    const char *init = "[{\"name\":\"prep\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":2}}}]";
    const char *apps =
        "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"4\"}}},"
        "{\"name\":\"side\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"2\","
        "\"kgpu.io/gpu-core\":\"30\"}}},{\"name\":\"log\"}]";
    const char *assign = "[{\"container\":\"main\",\"gpus\":[{\"index\":0,\"uuid\":\"" U0
                         "\",\"milli\":0,\"memory_mib\":4096}],\"exclusive\":false},"
                         "{\"container\":\"side\",\"gpus\":[{\"index\":1,\"uuid\":\"" U1
                         "\",\"milli\":300,\"memory_mib\":2048}],\"exclusive\":false}]";
    json_t *p = pod("m", NODE, apps, init, assign);
    json_t *items = json_array();
    json_array_append(items, p);
    dp_match m;
    serve(items, p, DP_RES_MEM, 2, "prep", true, false, &m);
    assert_true(m.init);
    assert_string_equal(m.t.gpus[0].uuid, U0); /* main's GPU, the init container's own amount */
    assert_int_equal(m.t.gpus[0].memory_mib, 2048);
    /* kubelet now asks for main: 4 units; 2 would be the wrong container. */
    kgpu_error err = {0};
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 2, ALL, 1024, &m, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "container main asks 4"));
    serve(items, p, DP_RES_MEM, 4, "main", true, false, &m);
    assert_string_equal(m.t.gpus[0].uuid, U0);
    assert_int_equal(m.t.gpus[0].memory_mib, 4096);
    /* side's resources come in either order (kubelet walks a map): core first here. */
    serve(items, p, DP_RES_CORE, 30, "side", false, false, &m);
    assert_string_equal(m.progress,
                        "prep:kgpu.io/gpu-mem,main:kgpu.io/gpu-mem,side:kgpu.io/gpu-core");
    serve(items, p, DP_RES_MEM, 2, "side", true, true, &m);
    assert_string_equal(m.t.gpus[0].uuid, U1);
    assert_int_equal(m.t.gpus[0].milli, 300);
    assert_int_equal(m.t.pod_units, 6);
    /* Done: nothing awaits any more. */
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 2, ALL, 1024, &m, &err), KGPU_ENOENT);
    json_decref(p);
    json_decref(items);
}

static void test_match_bad_input(void **state)
{
    (void)state;
    dp_match m;
    kgpu_error err = {0};
    /* A malformed assignment on the only candidate: refuse, naming pod and annotation. */
    json_t *items = json_array();
    json_array_append_new(items, pod("a", NODE, MAIN4, NULL, "[{\"container\":"));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "default/a"));
    assert_non_null(strstr(err.msg, "kgpu.io/assignment"));
    json_decref(items);
    /* A malformed progress annotation blocks the pod: it might be the one kubelet admits. */
    items = json_array();
    json_t *p = pod("a", NODE, MAIN4, NULL, ASSIGN("main", 0, U0, 4096));
    annotate(p, "kgpu.io/allocating", "nosuch:kgpu.io/gpu-mem");
    json_array_append_new(items, p);
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "kgpu.io/allocating"));
    annotate(p, "kgpu.io/allocating", "main:kgpu.io/gpu-bogus");
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EPARSE);
    json_decref(items);
    /* An assignment without the container. */
    items = json_array();
    json_array_append_new(items, pod("a", NODE, MAIN4, NULL, ASSIGN("other", 0, U0, 4096)));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "no entry for container main"));
    json_decref(items);
    /* Units that disagree with the extender's: 4 units of 512 MiB are not 4096 MiB. */
    items = json_array();
    json_array_append_new(items, pod("a", NODE, MAIN4, NULL, ASSIGN("main", 0, U0, 4096)));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 512, &m, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "same memory unit"));
    json_decref(items);
    /* A limit that is not a count. */
    items = json_array();
    json_array_append_new(
        items, pod("a", NODE,
                   "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"x\"}}}]",
                   NULL, ASSIGN("main", 0, U0, 4096)));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "kgpu.io/gpu-mem"));
    json_decref(items);
    /* Not a list at all. */
    assert_int_equal(dp_match_find(NULL, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), KGPU_EPARSE);
}

/* kgpu.io/gpu-core-limit: a whole percent onto every GPU; anything else refused, named. */
static void test_match_core_limit(void **state)
{
    (void)state;
    dp_match m;
    kgpu_error err = {0};
    json_t *items = json_array();
    json_t *p = pod("a", NODE, MAIN4, NULL, ASSIGN("main", 1, U1, 4096));
    json_array_append_new(items, p);
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_int_equal(m.t.gpus[0].limit_pct, 0);
    annotate(p, "kgpu.io/gpu-core-limit", "60");
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_int_equal(m.t.gpus[0].limit_pct, 60);
    const char *bad[] = {"", "0", "101", "-5", "+5", "5%", "1000", "6 0", "0x10", "99999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        annotate(p, "kgpu.io/gpu-core-limit", bad[i]);
        assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err),
                         KGPU_EINVAL);
        assert_non_null(strstr(err.msg, "kgpu.io/gpu-core-limit"));
        assert_non_null(strstr(err.msg, "default/a"));
    }
    json_decref(items);
}

static void test_match_unregistered(void **state)
{
    (void)state;
    /* nvidia.com/gpu belongs to another plugin: it does not hold back completion. */
    json_t *items = json_array();
    json_array_append_new(
        items, pod("a", NODE,
                   "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"4\"}}},"
                   "{\"name\":\"train\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]",
                   NULL,
                   "[{\"container\":\"main\",\"gpus\":[{\"index\":0,\"uuid\":\"" U0
                   "\",\"milli\":0,\"memory_mib\":4096}],\"exclusive\":false},"
                   "{\"container\":\"train\",\"gpus\":[{\"index\":1,\"uuid\":\"" U1
                   "\",\"milli\":1000,\"memory_mib\":15360}],\"exclusive\":true}]"));
    dp_match m;
    kgpu_error err = {0};
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, ALL, 1024, &m, &err), 0);
    assert_true(m.complete);
    /* With nvidia.com/gpu registered, the whole GPU comes from the assignment. */
    unsigned all = ALL | 1u << DP_RES_WHOLE;
    assert_int_equal(dp_match_find(items, NODE, DP_RES_MEM, 4, all, 1024, &m, &err), 0);
    assert_false(m.complete);
    assert_int_equal(dp_match_find(items, NODE, DP_RES_WHOLE, 1, all, 1024, &m, &err), 0);
    assert_string_equal(m.t.container, "train");
    assert_true(m.exclusive);
    assert_int_equal(m.t.gpus[0].memory_mib, 15360);
    json_decref(items);
}

/*
 * Issue 24, item 2: a pod created with spec.nodeName never meets the
 * extender, and its kgpu.io/assignment is whatever its author wrote. The
 * matcher gives a container at most its requests, whatever the annotation
 * says.
 */
static int match_one(const char *containers, const char *init, const char *assignment, dp_res r,
                     int64_t count, dp_match *m, kgpu_error *err)
{
    json_t *items = json_array();
    json_array_append_new(items, pod("f", NODE, containers, init, assignment));
    int rc = dp_match_find(items, NODE, r, count, ALL, 1024, m, err);
    json_decref(items);
    return rc;
}

#define GPU_JSON(idx, uuid, milli, mib)                                                            \
    "{\"index\":" #idx ",\"uuid\":\"" uuid "\",\"milli\":" #milli ",\"memory_mib\":" #mib "}"
#define PART(c, excl, gpus) "[{\"container\":\"" c "\",\"gpus\":[" gpus "],\"exclusive\":" excl "}]"
#define ONE_UNIT  "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"1\"}}}]"
#define UNIT_CORE                                                                                  \
    "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"1\","                   \
    "\"kgpu.io/gpu-core\":\"30\"}}}]"

static void test_match_forged_assignment(void **state)
{
    (void)state;
    dp_match m;
    kgpu_error err = {0};
    /* What the extender writes for one unit: accepted. */
    assert_int_equal(match_one(ONE_UNIT, NULL, PART("main", "false", GPU_JSON(0, U0, 0, 1024)),
                               DP_RES_MEM, 1, &m, &err),
                     0);
    /* The attack as reported: both GPUs whole, all their memory and compute, for one unit. */
    assert_int_equal(match_one(ONE_UNIT, NULL,
                               PART("main", "true",
                                    GPU_JSON(0, U0, 1000, 15360) "," GPU_JSON(1, U1, 1000, 15360)),
                               DP_RES_MEM, 1, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "default/f"));
    assert_non_null(strstr(err.msg, "whole GPUs"));
    /* Not exclusive, but two GPUs for a container that asks one. */
    assert_int_equal(match_one(ONE_UNIT, NULL,
                               PART("main", "false",
                                    GPU_JSON(0, U0, 0, 512) "," GPU_JSON(1, U1, 0, 512)),
                               DP_RES_MEM, 1, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "2 GPU(s), but it asks 1"));
    /* One GPU, all its memory. */
    assert_int_equal(match_one(ONE_UNIT, NULL, PART("main", "false", GPU_JSON(0, U0, 0, 15360)),
                               DP_RES_MEM, 1, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "asks 1 units of 1024 MiB but its assignment gives 15360"));
    /* Compute it did not ask for: 100 % for a memory-only container... */
    assert_int_equal(match_one(ONE_UNIT, NULL, PART("main", "false", GPU_JSON(0, U0, 1000, 1024)),
                               DP_RES_MEM, 1, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "1000/1000"));
    /* ...and no compute limit (milli 0) for one that asks 30 %. */
    assert_int_equal(match_one(UNIT_CORE, NULL, PART("main", "false", GPU_JSON(0, U0, 0, 1024)),
                               DP_RES_CORE, 30, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "kgpu.io/gpu-core 30"));
    assert_int_equal(match_one(UNIT_CORE, NULL, PART("main", "false", GPU_JSON(0, U0, 300, 1024)),
                               DP_RES_CORE, 30, &m, &err),
                     0);
    /* The same GPU twice is not two GPUs. */
    const char *two =
        "[{\"name\":\"main\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"2\","
        "\"kgpu.io/gpu-count\":\"2\"}}}]";
    assert_int_equal(match_one(two, NULL,
                               PART("main", "false",
                                    GPU_JSON(0, U0, 0, 1024) "," GPU_JSON(0, U0, 0, 1024)),
                               DP_RES_MEM, 2, &m, &err),
                     KGPU_EPARSE); /* the annotation's parser refuses it already */
    assert_non_null(strstr(err.msg, "default/f"));
    assert_int_equal(match_one(two, NULL,
                               PART("main", "false",
                                    GPU_JSON(0, U0, 0, 1024) "," GPU_JSON(1, U1, 0, 1024)),
                               DP_RES_MEM, 2, &m, &err),
                     0);
    /* Uneven memory over the two GPUs: more than its share on one. */
    assert_int_equal(match_one(two, NULL,
                               PART("main", "false",
                                    GPU_JSON(0, U0, 0, 2048) "," GPU_JSON(1, U1, 0, 0)),
                               DP_RES_MEM, 2, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "even share"));
    /* An init container served first from a forged app part: refused too. */
    const char *init = "[{\"name\":\"prep\",\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":1}}}]";
    assert_int_equal(match_one(ONE_UNIT, init, PART("main", "false", GPU_JSON(0, U0, 1000, 15360)),
                               DP_RES_MEM, 1, &m, &err),
                     KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "15360"));
    /* Whole GPUs: exactly as many as nvidia.com/gpu asks. */
    unsigned all = ALL | 1u << DP_RES_WHOLE;
    json_t *items = json_array();
    json_array_append_new(
        items, pod("w", NODE,
                   "[{\"name\":\"main\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]",
                   NULL,
                   PART("main", "true",
                        GPU_JSON(0, U0, 1000, 15360) "," GPU_JSON(1, U1, 1000, 15360))));
    assert_int_equal(dp_match_find(items, NODE, DP_RES_WHOLE, 1, all, 1024, &m, &err),
                     KGPU_EINVAL);
    json_decref(items);
}

static void test_cdi_kind_check(void **state)
{
    (void)state;
    kgpu_error err = {0};
    assert_int_equal(contract_cdi_kind_check("nvidia.com/gpu", &err), 0);
    assert_int_equal(contract_cdi_kind_check("k8s.device-plugin.nvidia.com/gpu", &err), 0);
    const char *bad[] = {"", "gpu", "nvidia.com/", "/gpu", "a/b/c", "nvidia.com/gpu=0",
                         "-x.com/gpu", "nvidia.com/g.pu", "nvidia com/gpu"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(contract_cdi_kind_check(bad[i], &err), KGPU_EINVAL);
        assert_non_null(strstr(err.msg, "<vendor>/<class>"));
    }
}

/* Issue 24, item 2: the assignment's GPUs must be those of kubelet's devices. */
static void test_ids_cover_assignment(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv, 1024);
    contract_target t;
    memset(&t, 0, sizeof(t));
    t.ngpus = 1;
    snprintf(t.gpus[0].uuid, sizeof(t.gpus[0].uuid), "%s", U1);
    const char *on0[] = {U0 "::0", U0 "::1"};
    const char *on1[] = {U1 "::3", U1 "::4"};
    const char *both[] = {U0 "::0", U1 "::4"};
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_MEM, on1, 2, &t), -1);
    /* kubelet counted GPU 0 for the container; the assignment names GPU 1. */
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_MEM, on0, 2, &t), 0);
    /* Two GPUs need a device on each... */
    t.ngpus = 2;
    snprintf(t.gpus[1].uuid, sizeof(t.gpus[1].uuid), "%s", U0);
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_MEM, both, 2, &t), -1);
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_MEM, on1, 2, &t), 1);
    /* ...unless there are fewer devices than GPUs (one unit over gpu-count 2). */
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_MEM, on1, 1, &t), -1);
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_MEM, on0, 1, &t), -1);
    /* Whole GPUs: the IDs are the UUIDs. */
    const char *whole0[] = {U0};
    t.ngpus = 1;
    assert_int_equal(dp_ids_uncovered(&inv, DP_RES_WHOLE, whole0, 1, &t), 0);
}

/* ---- what the container gets ---- */

static void sample_match(dp_match *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->t.ns, sizeof(m->t.ns), "default");
    snprintf(m->t.name, sizeof(m->t.name), "a");
    snprintf(m->t.uid, sizeof(m->t.uid), "0b0c-11");
    snprintf(m->t.container, sizeof(m->t.container), "main");
    m->t.ngpus = 2;
    for (int i = 0; i < 2; i++) {
        m->t.gpus[i].index = i + 2;
        snprintf(m->t.gpus[i].uuid, sizeof(m->t.gpus[i].uuid), "%s", i ? U1 : U0);
        m->t.gpus[i].milli = 250;
        m->t.gpus[i].memory_mib = 3072;
    }
    m->count = 6;
    m->t.pod_units = 8;
    m->primary = true;
}

static const char *env_of(const contract_response *r, const char *key)
{
    for (int i = 0; i < r->nenv; i++)
        if (strcmp(r->env[i].key, key) == 0)
            return r->env[i].value;
    return NULL;
}

static void test_response(void **state)
{
    (void)state;
    dp_match m;
    sample_match(&m);
    char *text = contract_limits_text(&m.t);
    assert_string_equal(text, "# kgpu limits v1\n"
                              "device 0 uuid=" U0 " memory_mib=3072 core_pct=25\n"
                              "device 1 uuid=" U1 " memory_mib=3072 core_pct=25\n");
    free(text);
    /* A burst ceiling: written when below 100, never below the share, not for memory only. */
    m.t.gpus[0].limit_pct = 60;
    m.t.gpus[1].limit_pct = 10;
    text = contract_limits_text(&m.t);
    assert_string_equal(text,
                        "# kgpu limits v1\n"
                        "device 0 uuid=" U0 " memory_mib=3072 core_pct=25 core_limit_pct=60\n"
                        "device 1 uuid=" U1 " memory_mib=3072 core_pct=25 core_limit_pct=25\n");
    free(text);
    m.t.gpus[0].limit_pct = 100;
    m.t.gpus[1].milli = 0;
    text = contract_limits_text(&m.t);
    assert_string_equal(text, "# kgpu limits v1\n"
                              "device 0 uuid=" U0 " memory_mib=3072 core_pct=25\n"
                              "device 1 uuid=" U1 " memory_mib=3072 core_pct=100\n");
    free(text);
    sample_match(&m);
    contract_inventory inv;
    inventory(&inv, 1024);
    contract_paths paths = {"/var/lib/kgpu", "/var/lib/kgpu/lib/libkgpu-limit.so", NULL};
    contract_response r;
    dp_response_of(&m, &inv, &paths, NULL, &r);
    assert_string_equal(env_of(&r, "NVIDIA_VISIBLE_DEVICES"), U0 "," U1);
    assert_string_equal(env_of(&r, "KGPU_MEMORY_LIMIT_MIB"), "3072");
    assert_string_equal(env_of(&r, "KGPU_CORE_LIMIT_PCT"), "25");
    assert_string_equal(env_of(&r, "KGPU_SHARED_DIR"), "/var/run/kgpu");
    assert_string_equal(env_of(&r, "ALIYUN_COM_GPU_MEM_CONTAINER"), "6");
    assert_string_equal(env_of(&r, "ALIYUN_COM_GPU_MEM_DEV"), "15");
    assert_string_equal(env_of(&r, "ALIYUN_COM_GPU_MEM_IDX"), "2");
    assert_string_equal(env_of(&r, "ALIYUN_COM_GPU_MEM_POD"), "8");
    assert_int_equal(r.nmounts, 6);
    assert_string_equal(r.mounts[0].container_path, "/etc/kgpu/limits");
    assert_string_equal(r.mounts[0].host_path, "/var/lib/kgpu/pods/0b0c-11/main.limits");
    assert_true(r.mounts[0].read_only);
    assert_string_equal(r.mounts[1].host_path, "/var/lib/kgpu/pods/0b0c-11/shared");
    assert_false(r.mounts[1].read_only);
    assert_string_equal(r.mounts[2].container_path, "/usr/lib/kgpu/libkgpu-limit.so");
    assert_string_equal(r.mounts[3].container_path, "/etc/ld.so.preload");
    assert_string_equal(r.mounts[3].host_path, "/var/lib/kgpu/ld.so.preload");
    assert_true(r.mounts[3].read_only);
    /* A compute share: each GPU's schedule file, read-write, where the library opens it. */
    assert_string_equal(r.mounts[4].container_path, "/var/run/kgpu-gpu/" U0 ".sched");
    assert_string_equal(r.mounts[4].host_path, "/var/lib/kgpu/sched/" U0 ".sched");
    assert_false(r.mounts[4].read_only);
    assert_string_equal(r.mounts[5].container_path, "/var/run/kgpu-gpu/" U1 ".sched");
    assert_string_equal(r.mounts[5].host_path, "/var/lib/kgpu/sched/" U1 ".sched");
    assert_false(r.mounts[5].read_only);
    /* Every mount survives the encoding (there are more than the four of old). */
    uint8_t *enc;
    size_t enclen;
    assert_int_equal(dp_allocate_encode(&r, 1, &enc, &enclen), 0);
    V1beta1__AllocateResponse *dec = v1beta1__allocate_response__unpack(NULL, enclen, enc);
    assert_non_null(dec);
    assert_int_equal(dec->container_responses[0]->n_mounts, 6);
    assert_string_equal(dec->container_responses[0]->mounts[5]->host_path,
                        "/var/lib/kgpu/sched/" U1 ".sched");
    v1beta1__allocate_response__free_unpacked(dec, NULL);
    free(enc);

    /* Without CDI (--device-list-strategy envvar): no CDI devices, none on the wire. */
    assert_int_equal(r.ncdi, 0);

    /*
     * Issue 24, item 3: the GPUs as CDI devices, named as nvidia-ctk names
     * them, so the runtime injects exactly these whatever the container's
     * NVIDIA_VISIBLE_DEVICES says; they reach kubelet in cdi_devices.
     */
    dp_cdi cdi = {"nvidia.com/gpu", false};
    dp_response_of(&m, &inv, &paths, &cdi, &r);
    assert_int_equal(r.ncdi, 2);
    assert_string_equal(r.cdi[0], "nvidia.com/gpu=" U0);
    assert_string_equal(r.cdi[1], "nvidia.com/gpu=" U1);
    assert_int_equal(dp_allocate_encode(&r, 1, &enc, &enclen), 0);
    dec = v1beta1__allocate_response__unpack(NULL, enclen, enc);
    assert_non_null(dec);
    assert_int_equal(dec->container_responses[0]->n_cdi_devices, 2);
    assert_string_equal(dec->container_responses[0]->cdi_devices[0]->name, "nvidia.com/gpu=" U0);
    assert_string_equal(dec->container_responses[0]->cdi_devices[1]->name, "nvidia.com/gpu=" U1);
    v1beta1__allocate_response__free_unpacked(dec, NULL);
    free(enc);
    cdi.by_index = true;
    dp_response_of(&m, &inv, &paths, &cdi, &r);
    assert_string_equal(r.cdi[0], "nvidia.com/gpu=2");
    assert_string_equal(r.cdi[1], "nvidia.com/gpu=3");
    /* The container's other resources carry no devices either (kubelet merges the answers). */
    m.primary = false;
    dp_response_of(&m, &inv, &paths, &cdi, &r);
    assert_int_equal(r.ncdi, 0);
    m.primary = true;

    /* Memory-only shares are not limited in compute: no schedule; without the shim, two mounts. */
    m.t.gpus[0].milli = m.t.gpus[1].milli = 0;
    paths.shim_lib = NULL;
    dp_response_of(&m, &inv, &paths, NULL, &r);
    assert_string_equal(env_of(&r, "KGPU_CORE_LIMIT_PCT"), "100");
    assert_int_equal(r.nmounts, 2);
    /* The container's other resources answer empty (kubelet merges the answers). */
    m.primary = false;
    dp_response_of(&m, &inv, &paths, NULL, &r);
    assert_int_equal(r.nenv, 0);
    assert_int_equal(r.nmounts, 0);

    /* The encoded answer decodes to the same. */
    m.primary = true;
    contract_response two[2];
    dp_response_of(&m, &inv, &paths, NULL, &two[0]);
    memset(&two[1], 0, sizeof(two[1]));
    uint8_t *buf;
    size_t len;
    assert_int_equal(dp_allocate_encode(two, 2, &buf, &len), 0);
    V1beta1__AllocateResponse *ar = v1beta1__allocate_response__unpack(NULL, len, buf);
    assert_non_null(ar);
    assert_int_equal(ar->n_container_responses, 2);
    assert_int_equal(ar->container_responses[0]->n_envs, (size_t)two[0].nenv);
    assert_int_equal(ar->container_responses[0]->n_mounts, 2);
    assert_string_equal(ar->container_responses[0]->mounts[0]->container_path, "/etc/kgpu/limits");
    assert_int_equal(ar->container_responses[1]->n_envs, 0);
    v1beta1__allocate_response__free_unpacked(ar, NULL);
    free(buf);
}

/* MPS mode: the MPS client's variables and the daemon's pipes instead of schedules. */
static void test_response_mps(void **state)
{
    (void)state;
    dp_match m;
    sample_match(&m);
    m.t.gpus[0].milli = m.t.gpus[1].milli = 300;
    m.t.gpus[0].memory_mib = m.t.gpus[1].memory_mib = 8192;
    contract_inventory inv;
    inventory(&inv, 1024);
    contract_paths paths = {"/var/lib/kgpu", "/var/lib/kgpu/lib/libkgpu-limit.so",
                            "/run/nvidia-mps"};
    contract_response r;
    dp_response_of(&m, &inv, &paths, NULL, &r);
    assert_string_equal(env_of(&r, "CUDA_MPS_PIPE_DIRECTORY"), "/tmp/nvidia-mps");
    assert_string_equal(env_of(&r, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "30");
    assert_string_equal(env_of(&r, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=8192M,1=8192M");
    /* The library stays: MPS limits each process, the share is the container's. */
    assert_string_equal(env_of(&r, "KGPU_CORE_LIMIT_PCT"), "30");
    assert_int_equal(r.nmounts, 5);
    assert_string_equal(r.mounts[2].container_path, "/usr/lib/kgpu/libkgpu-limit.so");
    assert_string_equal(r.mounts[3].container_path, "/etc/ld.so.preload");
    assert_string_equal(r.mounts[4].container_path, "/tmp/nvidia-mps");
    assert_string_equal(r.mounts[4].host_path, "/run/nvidia-mps");
    assert_false(r.mounts[4].read_only);
    for (int i = 0; i < r.nmounts; i++) /* no schedule: MPS holds the compute share */
        assert_null(strstr(r.mounts[i].container_path, ".sched"));
    uint8_t *enc;
    size_t enclen;
    assert_int_equal(dp_allocate_encode(&r, 1, &enc, &enclen), 0);
    V1beta1__AllocateResponse *dec = v1beta1__allocate_response__unpack(NULL, enclen, enc);
    assert_non_null(dec);
    assert_int_equal(dec->container_responses[0]->n_envs, (size_t)r.nenv);
    assert_int_equal(dec->container_responses[0]->n_mounts, 5);
    v1beta1__allocate_response__free_unpacked(dec, NULL);
    free(enc);
    /* A memory-only share: all the SMs, its memory still pinned. */
    m.t.gpus[0].milli = m.t.gpus[1].milli = 0;
    dp_response_of(&m, &inv, &paths, NULL, &r);
    assert_string_equal(env_of(&r, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "100");
    assert_string_equal(env_of(&r, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=8192M,1=8192M");
    /* The schedule-file mode hands out none of it. */
    paths.mps_pipe_dir = NULL;
    m.t.gpus[0].milli = m.t.gpus[1].milli = 300;
    dp_response_of(&m, &inv, &paths, NULL, &r);
    assert_null(env_of(&r, "CUDA_MPS_PIPE_DIRECTORY"));
    assert_null(env_of(&r, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    assert_null(env_of(&r, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
    assert_int_equal(r.nmounts, 6);
}

/* MPS mode starts only where the control daemon's pipe is; no schedule files are made. */
static void test_mps_mode_needs_the_daemon(void **state)
{
    (void)state;
    contract_sharing s;
    assert_int_equal(contract_sharing_parse("mps", &s), 0);
    assert_int_equal(s, CONTRACT_SHARING_MPS);
    assert_int_equal(contract_sharing_parse("sched", &s), 0);
    assert_int_equal(s, CONTRACT_SHARING_SCHED);
    assert_int_equal(contract_sharing_parse("MPS", &s), -1);
    assert_int_equal(contract_sharing_parse("", &s), -1);
    char dir[] = "/tmp/kgpu-test-mps-XXXXXX", path[512];
    assert_non_null(mkdtemp(dir));
    kgpu_error err = {0};
    assert_int_equal(contract_mps_check(dir, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "control is missing"));
    assert_non_null(strstr(err.msg, "nvidia-cuda-mps-control -d"));
    snprintf(path, sizeof(path), "%s/control", dir);
    FILE *f = fopen(path, "w"); /* a plain file is not the daemon's pipe */
    assert_non_null(f);
    fclose(f);
    assert_int_equal(contract_mps_check(dir, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "not the daemon's control pipe"));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(contract_mps_check(dir, &err), 0);
    /* Pod files in MPS mode: limits and accounting, no schedule. */
    dp_match m;
    sample_match(&m);
    contract_paths paths = {dir, NULL, dir};
    assert_int_equal(contract_write_files(&m.t, &paths, &err), 0);
    struct stat st;
    snprintf(path, sizeof(path), "%s/pods/0b0c-11/main.limits", dir);
    assert_int_equal(stat(path, &st), 0);
    snprintf(path, sizeof(path), "%s/sched", dir);
    assert_int_equal(stat(path, &st), -1);
    snprintf(path, sizeof(path), "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
}

static void test_pod_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/kgpu-test-dp-XXXXXX";
    assert_non_null(mkdtemp(dir));
    dp_match m;
    sample_match(&m);
    contract_paths paths = {dir, NULL, NULL};
    kgpu_error err = {0};
    assert_int_equal(contract_write_files(&m.t, &paths, &err), 0);
    char path[512];
    struct stat st;
    snprintf(path, sizeof(path), "%s/pods/0b0c-11/shared", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 01777);
    snprintf(path, sizeof(path), "%s/pods/0b0c-11/main.limits", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0444);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *want = contract_limits_text(&m.t);
    assert_string_equal(buf, want);
    free(want);
    /* The compute share's schedules: one per GPU, any user may open them, the host may not. */
    snprintf(path, sizeof(path), "%s/sched", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);
    snprintf(path, sizeof(path), "%s/sched/" U1 ".sched", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0666);
    assert_int_equal((size_t)st.st_size, sizeof(kgpu_sched_file));
    /* Rewritten in place (a second call for the same container, e.g. another resource). */
    m.t.gpus[0].memory_mib = 1024;
    assert_int_equal(contract_write_files(&m.t, &paths, &err), 0);
    /* A uid that would climb out of the state directory is refused. */
    snprintf(m.t.uid, sizeof(m.t.uid), "../../etc");
    assert_int_equal(contract_write_files(&m.t, &paths, &err), KGPU_EINVAL);
    snprintf(path, sizeof(path), "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
}


/* ---- static MIG (migdev.c) ---- */

#define M0 "MIG-11111111-0000-4000-8000-000000000000"
#define M1 "MIG-11111111-0000-4000-8000-000000000001"
#define M2 "MIG-11111111-0000-4000-8000-000000000002"

/* An A100-40GB in MIG mode as NVML names it. */
static void a100(kgpu_gpu_info *g, int index)
{
    memset(g, 0, sizeof(*g));
    g->index = index;
    snprintf(g->uuid, sizeof(g->uuid), "GPU-a100a100-0000-4000-8000-00000000000%d", index);
    snprintf(g->model, sizeof(g->model), "NVIDIA A100-SXM4-40GB");
    g->memory_mib = 40960;
    g->numa = 1;
    g->healthy = true;
    g->mig_mode = 1;
}

static void mig_dev(const kgpu_gpu_info *g, int nvml_profile, const char *uuid, unsigned gi,
                    dp_mig_dev *out)
{
    kgpu_nvml_mig m = {.gpu = g->index, .gi_id = gi, .ci_id = 0, .nvml_profile = nvml_profile};
    m.memory_mib = nvml_profile == 0 ? 4864 : 19968;
    snprintf(m.uuid, sizeof(m.uuid), "%s", uuid);
    dp_mig_dev_of(g, &m, out);
}

static void test_mig_names(void **state)
{
    (void)state;
    dp_mig_strategy s = DP_MIG_NONE;
    assert_int_equal(dp_mig_strategy_parse("single", &s), 0);
    assert_int_equal(s, DP_MIG_SINGLE);
    assert_int_equal(dp_mig_strategy_parse("mixed", &s), 0);
    assert_int_equal(s, DP_MIG_MIXED);
    assert_int_equal(dp_mig_strategy_parse("none", &s), 0);
    assert_int_equal(s, DP_MIG_NONE);
    assert_int_equal(dp_mig_strategy_parse("Mixed", &s), -1);
    assert_int_equal(dp_mig_strategy_parse("", &s), -1);
    kgpu_gpu_info g;
    a100(&g, 0);
    char name[KGPU_MIG_NAME_MAX];
    /* NVML's GI profile IDs: 0 the 1-slice, 2 the 3-slice, 9 the 1-slice of two memory slices. */
    assert_true(dp_mig_profile_name(&g, 0, name, sizeof(name)));
    assert_string_equal(name, "1g.5gb");
    assert_true(dp_mig_profile_name(&g, 2, name, sizeof(name)));
    assert_string_equal(name, "3g.20gb");
    assert_true(dp_mig_profile_name(&g, 9, name, sizeof(name)));
    assert_string_equal(name, "1g.10gb");
    assert_false(dp_mig_profile_name(&g, 42, name, sizeof(name)));
    assert_string_equal(name, "");
    /* The 80 GB card's 1-slice is another profile; a T4 has none. */
    g.memory_mib = 81920;
    assert_true(dp_mig_profile_name(&g, 0, name, sizeof(name)));
    assert_string_equal(name, "1g.10gb");
    snprintf(g.model, sizeof(g.model), "Tesla T4");
    g.memory_mib = 15360;
    assert_false(dp_mig_profile_name(&g, 0, name, sizeof(name)));
    char res[80];
    assert_true(dp_mig_resource("1g.5gb", res, sizeof(res)));
    assert_string_equal(res, "nvidia.com/mig-1g.5gb");
    assert_false(dp_mig_resource("", res, sizeof(res)));
    assert_string_equal(dp_slot_resource(DP_RES_CORE, NULL, res, sizeof(res)),
                        "kgpu.io/gpu-core");
    assert_string_equal(dp_slot_resource(DP_NRES + 1, "3g.20gb", res, sizeof(res)),
                        "nvidia.com/mig-3g.20gb");
    assert_string_equal(dp_slot_resource(DP_NRES, NULL, res, sizeof(res)), "?");
    assert_false(dp_mig_resource("a-profile-name-far-too-long-for-a-kubernetes-resource-name-x",
                                 res, sizeof(res)));
}

static void test_mig_plan(void **state)
{
    (void)state;
    kgpu_gpu_info g0, g1;
    a100(&g0, 0);
    a100(&g1, 1);
    dp_mig_dev found[4];
    mig_dev(&g0, 0, M0, 13, &found[0]);
    mig_dev(&g1, 0, M1, 14, &found[1]);
    mig_dev(&g1, 2, M2, 2, &found[2]);
    assert_string_equal(found[0].profile, "1g.5gb");
    assert_string_equal(found[0].gpu_uuid, g0.uuid);
    assert_int_equal(found[0].numa, 1);
    static dp_mig_set set;
    char why[DP_MIG_WHY_MAX];
    /* single, one profile: every device. */
    assert_int_equal(dp_mig_plan(DP_MIG_SINGLE, found, 2, 0, &set, why, sizeof(why)), 0);
    assert_int_equal(set.n, 2);
    assert_string_equal(why, "");
    assert_int_equal(dp_mig_find(&set, M1), 1);
    assert_int_equal(dp_mig_find(&set, "MIG-other"), -1);
    /* single, mismatched profiles: none, and the reason names both. */
    assert_int_equal(dp_mig_plan(DP_MIG_SINGLE, found, 3, 0, &set, why, sizeof(why)), -1);
    assert_int_equal(set.n, 0);
    assert_non_null(strstr(why, "1g.5gb and 3g.20gb"));
    assert_non_null(strstr(why, "--mig-strategy mixed"));
    /* single beside a whole GPU: units would differ, so none. */
    assert_int_equal(dp_mig_plan(DP_MIG_SINGLE, found, 2, 1, &set, why, sizeof(why)), -1);
    assert_int_equal(set.n, 0);
    assert_non_null(strstr(why, "listed whole"));
    /* mixed: every profile. */
    assert_int_equal(dp_mig_plan(DP_MIG_MIXED, found, 3, 1, &set, why, sizeof(why)), 0);
    assert_int_equal(set.n, 3);
    /* none: nothing, without a reason. */
    assert_int_equal(dp_mig_plan(DP_MIG_NONE, found, 3, 0, &set, why, sizeof(why)), 0);
    assert_int_equal(set.n, 0);
    /* A GI without a CI, an old-style UUID with slashes, an unknown profile: left out, said. */
    found[3] = found[0];
    found[3].uuid[0] = '\0';
    assert_int_equal(dp_mig_plan(DP_MIG_MIXED, found, 4, 0, &set, why, sizeof(why)), -1);
    assert_int_equal(set.n, 3);
    assert_non_null(strstr(why, "without a compute instance"));
    snprintf(found[3].uuid, sizeof(found[3].uuid), "MIG-GPU-abc/1/0");
    assert_int_equal(dp_mig_plan(DP_MIG_MIXED, found, 4, 0, &set, why, sizeof(why)), -1);
    assert_int_equal(set.n, 3);
    snprintf(found[3].uuid, sizeof(found[3].uuid), "MIG-unknown");
    found[3].profile[0] = '\0';
    assert_int_equal(dp_mig_plan(DP_MIG_MIXED, found, 4, 0, &set, why, sizeof(why)), -1);
    assert_int_equal(set.n, 3);
    assert_non_null(strstr(why, "does not know"));
    /* single takes all or none. */
    found[2] = found[0];
    snprintf(found[2].uuid, sizeof(found[2].uuid), "%s", M2);
    assert_int_equal(dp_mig_plan(DP_MIG_SINGLE, found, 4, 0, &set, why, sizeof(why)), -1);
    assert_int_equal(set.n, 0);
}

static void test_mig_list(void **state)
{
    (void)state;
    kgpu_gpu_info g0;
    a100(&g0, 0);
    dp_mig_dev found[3];
    mig_dev(&g0, 0, M0, 13, &found[0]);
    mig_dev(&g0, 0, M1, 14, &found[1]);
    mig_dev(&g0, 2, M2, 2, &found[2]);
    found[1].healthy = false;
    static dp_mig_set set;
    char why[DP_MIG_WHY_MAX];
    assert_int_equal(dp_mig_plan(DP_MIG_MIXED, found, 3, 0, &set, why, sizeof(why)), 0);
    contract_inventory inv;
    inventory(&inv, 1024);
    uint8_t *buf;
    size_t len;
    kgpu_error err = {0};
    /* A profile's resource: its devices, by UUID, with the parent's health and NUMA node. */
    assert_int_equal(dp_list_encode_mig(&inv, DP_RES_WHOLE, &set, "1g.5gb", &buf, &len, &err), 0);
    V1beta1__ListAndWatchResponse *m = v1beta1__list_and_watch_response__unpack(NULL, len, buf);
    assert_non_null(m);
    assert_int_equal(m->n_devices, 2);
    assert_string_equal(m->devices[0]->id, M0);
    assert_string_equal(m->devices[0]->health, "Healthy");
    assert_int_equal(m->devices[0]->topology->nodes[0]->id, 1);
    assert_string_equal(m->devices[1]->id, M1);
    assert_string_equal(m->devices[1]->health, "Unhealthy");
    v1beta1__list_and_watch_response__free_unpacked(m, NULL);
    free(buf);
    assert_int_equal(dp_list_encode_mig(&inv, DP_RES_WHOLE, &set, "3g.20gb", &buf, &len, &err), 0);
    m = v1beta1__list_and_watch_response__unpack(NULL, len, buf);
    assert_int_equal(m->n_devices, 1);
    assert_string_equal(m->devices[0]->id, M2);
    v1beta1__list_and_watch_response__free_unpacked(m, NULL);
    free(buf);
    /* A profile with no device left: an empty list (kubelet sees zero). */
    assert_int_equal(dp_list_encode_mig(&inv, DP_RES_WHOLE, &set, "7g.40gb", &buf, &len, &err), 0);
    m = v1beta1__list_and_watch_response__unpack(NULL, len, buf);
    assert_int_equal(m->n_devices, 0);
    v1beta1__list_and_watch_response__free_unpacked(m, NULL);
    free(buf);
    /* single: nvidia.com/gpu lists the whole GPUs and the MIG devices; shares list no MIG. */
    assert_int_equal(dp_list_encode_mig(&inv, DP_RES_WHOLE, &set, NULL, &buf, &len, &err), 0);
    m = v1beta1__list_and_watch_response__unpack(NULL, len, buf);
    assert_int_equal(m->n_devices, 5);
    assert_string_equal(m->devices[0]->id, U0);
    assert_string_equal(m->devices[2]->id, M0);
    v1beta1__list_and_watch_response__free_unpacked(m, NULL);
    free(buf);
    assert_int_equal(dp_list_encode_mig(&inv, DP_RES_CORE, &set, NULL, &buf, &len, &err), 0);
    m = v1beta1__list_and_watch_response__unpack(NULL, len, buf);
    assert_int_equal(m->n_devices, 200);
    v1beta1__list_and_watch_response__free_unpacked(m, NULL);
    free(buf);
}

static void test_mig_response(void **state)
{
    (void)state;
    kgpu_gpu_info g0;
    a100(&g0, 3);
    dp_mig_dev found[2];
    mig_dev(&g0, 0, M0, 13, &found[0]);
    mig_dev(&g0, 2, M2, 2, &found[1]);
    static dp_mig_set set;
    char why[DP_MIG_WHY_MAX];
    assert_int_equal(dp_mig_plan(DP_MIG_MIXED, found, 2, 0, &set, why, sizeof(why)), 0);
    dp_match m = {.primary = true};
    int ids[1] = {1};
    dp_mig_target(&set, ids, 1, &m.t);
    assert_int_equal(m.t.ngpus, 1);
    assert_string_equal(m.t.uid, M2);
    assert_string_equal(m.t.container, "mig");
    char *text = contract_limits_text(&m.t);
    assert_string_equal(text, "# kgpu limits v1\n"
                              "device 0 uuid=" M2 " memory_mib=19968 core_pct=100\n");
    free(text);
    contract_inventory none = {.unit_mib = 1024};
    contract_paths paths = {"/var/lib/kgpu", "/var/lib/kgpu/lib/libkgpu-limit.so", NULL};
    dp_cdi cdi = {"nvidia.com/gpu", false};
    contract_response r;
    dp_response_of(&m, &none, &paths, &cdi, &r);
    assert_string_equal(env_of(&r, "NVIDIA_VISIBLE_DEVICES"), M2);
    assert_string_equal(env_of(&r, "KGPU_MEMORY_LIMIT_MIB"), "19968");
    assert_string_equal(env_of(&r, "KGPU_CORE_LIMIT_PCT"), "100");
    assert_int_equal(r.ncdi, 1);
    assert_string_equal(r.cdi[0], "nvidia.com/gpu=" M2);
    assert_string_equal(r.mounts[0].host_path, "/var/lib/kgpu/pods/" M2 "/mig.limits");
    /* The whole instance: no schedule to take turns through. */
    for (int i = 0; i < r.nmounts; i++)
        assert_null(strstr(r.mounts[i].container_path, "kgpu-gpu"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_ids),
        cmocka_unit_test(test_list_encode),
        cmocka_unit_test(test_prefer),
        cmocka_unit_test(test_match_single),
        cmocka_unit_test(test_match_same_size),
        cmocka_unit_test(test_match_sizes_tell_apart),
        cmocka_unit_test(test_match_multi_container),
        cmocka_unit_test(test_match_bad_input),
        cmocka_unit_test(test_match_core_limit),
        cmocka_unit_test(test_match_unregistered),
        cmocka_unit_test(test_match_forged_assignment),
        cmocka_unit_test(test_ids_cover_assignment),
        cmocka_unit_test(test_cdi_kind_check),
        cmocka_unit_test(test_response),
        cmocka_unit_test(test_response_mps),
        cmocka_unit_test(test_mps_mode_needs_the_daemon),
        cmocka_unit_test(test_pod_files),
        cmocka_unit_test(test_mig_names),
        cmocka_unit_test(test_mig_plan),
        cmocka_unit_test(test_mig_list),
        cmocka_unit_test(test_mig_response),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
