/*
 * The DRA driver's pure parts: the ResourceSlice, a claim's allocation read
 * into shares, the CDI spec (checked against the device plugin's own
 * Allocate answer for the same shares), and the checkpoint's round trip.
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

#include "dra.h"

#define U0   "GPU-aaaaaaaa-0000-4000-8000-000000000000"
#define U1   "GPU-aaaaaaaa-0000-4000-8000-000000000001"
#define U2   "GPU-bbbbbbbb-0000-4000-8000-000000000002"
#define NODE "gpu-node-1"

static kgpu_gpu_info gpus[3];

static void inventory(contract_inventory *inv)
{
    memset(gpus, 0, sizeof(gpus));
    const char *u[3] = {U0, U1, U2};
    for (int i = 0; i < 3; i++) {
        gpus[i].index = i;
        snprintf(gpus[i].uuid, sizeof(gpus[i].uuid), "%s", u[i]);
        snprintf(gpus[i].model, sizeof(gpus[i].model), i < 2 ? "A100-SXM4-40GB" : "T4");
        gpus[i].memory_mib = i < 2 ? 40960 : 15109;
        gpus[i].numa = i < 2 ? 0 : -1;
        gpus[i].healthy = true;
    }
    if (inv != NULL) {
        memset(inv, 0, sizeof(*inv));
        inv->ngpus = 3;
        memcpy(inv->gpus, gpus, sizeof(gpus));
        inv->unit_mib = 1024;
    }
}

static json_t *path(json_t *v, const char *p)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", p);
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k != NULL;
         k = strtok_r(NULL, ".", &save)) {
        if (json_is_array(v))
            v = json_array_get(v, (size_t)atoi(k));
        else
            v = json_object_get(v, k);
    }
    return v;
}

static const char *spath(json_t *v, const char *p)
{
    return json_string_value(path(v, p));
}

/* The node's one slice (a node without MIG GPUs has one). */
static json_t *build1(const dra_slice_input *in)
{
    json_t *all = dra_slices_build(in);
    assert_non_null(all);
    assert_int_equal(json_array_size(all), 1);
    json_t *s = json_incref(json_array_get(all, 0));
    json_decref(all);
    return s;
}

static void test_slice(void **state)
{
    (void)state;
    inventory(NULL);
    gpus[1].healthy = false;
    const char *cc[3] = {"8.0", NULL, "7.5"};
    dra_slice_input in = {.node = NODE, .node_uid = "node-uid-1", .gpus = gpus, .ngpus = 3,
                          .compute_capability = cc, .generation = 4};
    json_t *s = build1(&in);
    assert_non_null(s);
    assert_string_equal(spath(s, "apiVersion"), "resource.k8s.io/v1");
    assert_string_equal(spath(s, "metadata.name"), NODE "-gpu.kgpu.io");
    assert_string_equal(spath(s, "metadata.ownerReferences.0.uid"), "node-uid-1");
    assert_string_equal(spath(s, "metadata.ownerReferences.0.kind"), "Node");
    assert_string_equal(spath(s, "spec.driver"), "gpu.kgpu.io");
    assert_string_equal(spath(s, "spec.nodeName"), NODE);
    assert_string_equal(spath(s, "spec.pool.name"), NODE);
    assert_int_equal(json_integer_value(path(s, "spec.pool.generation")), 4);
    assert_int_equal(json_integer_value(path(s, "spec.pool.resourceSliceCount")), 1);
    /* The unhealthy GPU stays, tainted: no new claim is allocated it. */
    assert_int_equal(json_array_size(path(s, "spec.devices")), 3);
    json_t *d0 = path(s, "spec.devices.0"), *d2 = path(s, "spec.devices.2");
    assert_string_equal(spath(d0, "name"), "gpu-0");
    assert_string_equal(spath(s, "spec.devices.1.name"), "gpu-1");
    assert_string_equal(spath(s, "spec.devices.1.taints.0.key"), "gpu.kgpu.io/unhealthy");
    assert_string_equal(spath(s, "spec.devices.1.taints.0.effect"), "NoSchedule");
    assert_int_equal(json_array_size(path(s, "spec.devices.1.taints")), 1);
    assert_null(path(d0, "taints"));
    assert_null(path(d0, "consumesCounters"));
    assert_null(path(s, "spec.sharedCounters"));
    assert_string_equal(spath(d2, "name"), "gpu-2");
    assert_true(json_is_true(path(d0, "allowMultipleAllocations")));
    assert_string_equal(spath(d0, "attributes.uuid.string"), U0);
    assert_string_equal(spath(d0, "attributes.model.string"), "A100-SXM4-40GB");
    assert_string_equal(spath(d0, "attributes.productName.string"), "A100-SXM4-40GB");
    assert_int_equal(json_integer_value(path(d0, "attributes.numaNode.int")), 0);
    assert_int_equal(json_integer_value(path(d0, "attributes.index.int")), 0);
    assert_int_equal(json_integer_value(path(d0, "attributes.memoryMiB.int")), 40960);
    assert_string_equal(spath(d0, "attributes.computeCapability.version"), "8.0.0");
    assert_null(path(d2, "attributes.numaNode")); /* unknown NUMA: no attribute */
    assert_string_equal(spath(d2, "attributes.computeCapability.version"), "7.5.0");
    assert_string_equal(spath(d0, "capacity.memory.value"), "40Gi");
    assert_string_equal(spath(d2, "capacity.memory.value"), "15109Mi");
    assert_string_equal(spath(d0, "capacity.memory.requestPolicy.default"), "40Gi");
    assert_string_equal(spath(d0, "capacity.memory.requestPolicy.validRange.min"), "1Mi");
    assert_string_equal(spath(d0, "capacity.memory.requestPolicy.validRange.step"), "1Mi");
    assert_string_equal(spath(d0, "capacity.cores.value"), "100");
    assert_string_equal(spath(d0, "capacity.cores.requestPolicy.default"), "0");
    assert_string_equal(spath(d0, "capacity.cores.requestPolicy.validRange.max"), "100");

    /* The same slice as the server returns it, other spellings and all: the same. */
    json_t *have = json_deep_copy(s);
    json_object_set_new(path(have, "spec.devices.0.capacity.memory"), "value",
                        json_string("40960Mi"));
    json_object_set_new(path(have, "metadata"), "resourceVersion", json_string("77"));
    json_object_set_new(path(have, "spec.pool"), "generation", json_integer(9));
    /* The server stamps a taint's time. */
    json_object_set_new(path(have, "spec.devices.1.taints.0"), "timeAdded",
                        json_string("2026-11-29T03:00:00Z"));
    assert_true(dra_slice_same(have, s));
    /* A GPU back to health is a change. */
    gpus[1].healthy = true;
    json_t *want = build1(&in);
    assert_false(dra_slice_same(have, want));
    json_decref(want);
    gpus[1].healthy = false;
    /* So is another owner (the Node was made again). */
    in.node_uid = "node-uid-2";
    want = build1(&in);
    assert_false(dra_slice_same(have, want));
    json_decref(want);
    /* Without a known Node UID, the owner is not compared. */
    in.node_uid = "";
    want = build1(&in);
    assert_null(path(want, "metadata.ownerReferences"));
    assert_true(dra_slice_same(have, want));
    json_decref(want);
    json_decref(have);
    json_decref(s);

    char name[300];
    char longnode[260];
    memset(longnode, 'n', 253);
    longnode[253] = '\0';
    dra_slice_name(longnode, name, sizeof(name));
    assert_int_equal(strlen(name), 253);
    assert_string_equal(name + 253 - strlen("-gpu.kgpu.io"), "-gpu.kgpu.io");
}

static void test_node_conflicts(void **state)
{
    (void)state;
    char buf[256];
    json_t *node = json_pack("{s:{s:{s:s, s:s, s:s, s:s}}}", "status", "allocatable",
                             "kgpu.io/gpu-mem", "0", "nvidia.com/gpu", "2", "cpu", "64",
                             "kgpu.io/gpu-core", "200");
    assert_int_equal(dra_node_gpu_conflicts(node, buf, sizeof(buf)), 2);
    assert_string_equal(buf, "kgpu.io/gpu-core=200, nvidia.com/gpu=2");
    json_object_set_new(json_object_get(json_object_get(node, "status"), "allocatable"),
                        "nvidia.com/gpu", json_string("0"));
    json_object_set_new(json_object_get(json_object_get(node, "status"), "allocatable"),
                        "kgpu.io/gpu-core", json_string("0"));
    assert_int_equal(dra_node_gpu_conflicts(node, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
    json_decref(node);
    assert_int_equal(dra_node_gpu_conflicts(NULL, buf, sizeof(buf)), 0);
}

static const char *CLAIM =
    "{\"metadata\": {\"namespace\": \"team-a\", \"name\": \"c1\", \"uid\": \"uid-1\"},"
    " \"status\": {\"allocation\": {\"devices\": {\"results\": ["
    "  {\"request\": \"small\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE "\","
    "   \"device\": \"gpu-0\", \"shareID\": \"share-1\","
    "   \"consumedCapacity\": {\"memory\": \"8Gi\", \"cores\": \"30\"}},"
    "  {\"request\": \"net\", \"driver\": \"nic.example.com\", \"pool\": \"x\", \"device\": \"y\"},"
    "  {\"request\": \"pair/a100\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE "\","
    "   \"device\": \"gpu-0\"},"
    "  {\"request\": \"pair/a100\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE "\","
    "   \"device\": \"gpu-1\"},"
    "  {\"request\": \"frac\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE "\","
    "   \"device\": \"gpu-2\", \"shareID\": \"share-2\","
    "   \"consumedCapacity\": {\"memory\": \"1536Mi\", \"cores\": \"12500m\", \"future\": \"3\"}}"
    "]}}}}";

static void test_claim_read(void **state)
{
    (void)state;
    inventory(NULL);
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3};
    dra_claim c;
    kgpu_error err = {0};
    assert_int_equal(dra_claim_read_text(CLAIM, strlen(CLAIM), "uid-1", &node, &c, &err), 0);
    assert_string_equal(c.ns, "team-a");
    assert_string_equal(c.name, "c1");
    assert_int_equal(c.nreqs, 3);
    assert_string_equal(c.reqs[0], "small");
    assert_string_equal(c.reqs[1], "pair"); /* a subrequest serves its request */
    assert_string_equal(c.reqs[2], "frac");
    assert_int_equal(c.nallocs, 4);
    assert_int_equal(c.allocs[0].req, 0);
    assert_int_equal(c.allocs[0].memory_mib, 8192);
    assert_int_equal(c.allocs[0].milli, 300);
    assert_string_equal(c.allocs[0].share_id, "share-1");
    assert_string_equal(c.allocs[0].uuid, U0);
    /* Whole devices: no consumedCapacity, the whole GPU, compute not limited. */
    assert_int_equal(c.allocs[1].req, 1);
    assert_int_equal(c.allocs[1].memory_mib, 40960);
    assert_int_equal(c.allocs[1].milli, 0);
    assert_string_equal(c.allocs[2].device, "gpu-1");
    assert_int_equal(c.allocs[3].memory_mib, 1536);
    assert_int_equal(c.allocs[3].milli, 125); /* 12.5 % */
    assert_int_equal(c.allocs[3].index, 2);
}

static void expect_refused(const char *text, const char *uid, const char *needle)
{
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3};
    dra_claim c;
    kgpu_error err = {0};
    int rc = dra_claim_read_text(text, strlen(text), uid, &node, &c, &err);
    if (rc == 0 || strstr(err.msg, needle) == NULL)
        fail_msg("claim %s: rc %d, message '%s', wanted '%s'", text, rc, err.msg, needle);
}

#define HEAD "{\"metadata\": {\"namespace\": \"ns\", \"name\": \"c\", \"uid\": \"u\"},"
#define RES(x)                                                                                     \
    HEAD " \"status\": {\"allocation\": {\"devices\": {\"results\": [" x "]}}}}"
#define OURS(dev, extra)                                                                           \
    "{\"request\": \"r\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE "\", \"device\": \"" dev \
    "\"" extra "}"

/* Two shares of one GPU for one request: the container sees the GPU once, with both. */
static void test_claim_two_shares_one_gpu(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    dra_node_view node = {.pool = NODE, .gpus = inv.gpus, .ngpus = 3};
    const char *text =
        RES(OURS("gpu-0", ", \"shareID\": \"s1\", \"consumedCapacity\": {\"memory\": \"4Gi\","
                          " \"cores\": \"20\"}") ","
            OURS("gpu-0", ", \"shareID\": \"s2\", \"consumedCapacity\": {\"memory\": \"2Gi\","
                          " \"cores\": \"10\"}") ","
            OURS("gpu-1", ", \"shareID\": \"s3\", \"consumedCapacity\": {\"memory\": \"1Gi\"}"));
    dra_claim c;
    kgpu_error err = {0};
    assert_int_equal(dra_claim_read_text(text, strlen(text), NULL, &node, &c, &err), 0);
    assert_int_equal(c.nallocs, 3);
    contract_target m;
    dra_claim_target(&c, 0, 1024, &m);
    assert_int_equal(m.ngpus, 2);
    assert_string_equal(m.gpus[0].uuid, U0);
    assert_int_equal(m.gpus[0].memory_mib, 6144);
    assert_int_equal(m.gpus[0].milli, 300);
    assert_int_equal(m.gpus[1].memory_mib, 1024);
    assert_int_equal(m.pod_units, 7);
    char *limits = contract_limits_text(&m);
    assert_non_null(strstr(limits, "device 0 uuid=" U0 " memory_mib=6144 core_pct=30\n"));
    free(limits);
}

/* An opaque config of this driver gives its requests a burst ceiling; others' are ignored. */
#define CFG(x)                                                                                     \
    HEAD " \"status\": {\"allocation\": {\"devices\": {\"results\": ["                            \
    OURS("gpu-0", ", \"shareID\": \"s1\", \"consumedCapacity\": {\"cores\": \"20\"}")              \
    "], \"config\": [" x "]}}}}"
#define OPAQUE(reqs, params)                                                                       \
    "{\"source\": \"FromClaim\"" reqs ", \"opaque\": {\"driver\": \"gpu.kgpu.io\", "               \
    "\"parameters\": " params "}}"

static void test_claim_core_limit(void **state)
{
    (void)state;
    inventory(NULL);
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3};
    struct {
        const char *text;
        int want;
    } ok[] = {
        {CFG(OPAQUE("", "{\"apiVersion\": \"gpu.kgpu.io/v1\", \"kind\": \"GpuConfig\","
                        " \"coreLimit\": 60}")),
         60},
        {CFG(OPAQUE(", \"requests\": [\"r\"]", "{\"coreLimit\": 45}")), 45},
        {CFG(OPAQUE(", \"requests\": [\"r/small\"]", "{\"coreLimit\": 45}")), 45},
        {CFG(OPAQUE(", \"requests\": [\"other\"]", "{\"coreLimit\": 45}")), 0},
        {CFG("{\"opaque\": {\"driver\": \"other.example.com\", \"parameters\": {\"x\": 1}}}"), 0},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        dra_claim c;
        kgpu_error err = {0};
        if (dra_claim_read_text(ok[i].text, strlen(ok[i].text), NULL, &node, &c, &err) != 0)
            fail_msg("case %zu refused: %s", i, err.msg);
        assert_int_equal(c.allocs[0].limit_pct, ok[i].want);
        contract_target m;
        dra_claim_target(&c, 0, 1024, &m);
        char *limits = contract_limits_text(&m);
        char want[64];
        snprintf(want, sizeof(want), "core_pct=20%s%d\n", ok[i].want ? " core_limit_pct=" : "",
                 ok[i].want);
        if (ok[i].want == 0)
            snprintf(want, sizeof(want), "core_pct=20\n");
        assert_non_null(strstr(limits, want));
        free(limits);
    }
    expect_refused(CFG(OPAQUE("", "{\"coreLimit\": 0}")), NULL, "coreLimit is not a whole");
    expect_refused(CFG(OPAQUE("", "{\"coreLimit\": 101}")), NULL, "coreLimit is not a whole");
    expect_refused(CFG(OPAQUE("", "{\"coreLimit\": \"60\"}")), NULL, "coreLimit is not a whole");
    expect_refused(CFG(OPAQUE("", "{\"corelimit\": 60}")), NULL, "unknown parameter corelimit");
    expect_refused(CFG(OPAQUE("", "[]")), NULL, "parameters is not an object");
    expect_refused(CFG("7"), NULL, "config 0 is not an object");
}

static void test_claim_refused(void **state)
{
    (void)state;
    inventory(NULL);
    expect_refused("{", NULL, "ResourceClaim:");
    expect_refused("[]", NULL, "metadata");
    expect_refused(HEAD " \"status\": {}}", NULL, "ResourceClaim ns/c is not allocated");
    expect_refused(RES(OURS("gpu-0", "")), "other-uid", "has UID u, not other-uid");
    expect_refused(RES(OURS("gpu-9", "")), NULL, "device gpu-9, which node " NODE " does not");
    expect_refused(RES("{\"request\": \"r\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"n2\","
                       " \"device\": \"gpu-0\"}"),
                   NULL, "not of this node's pool");
    expect_refused(RES(OURS("gpu-2", ", \"consumedCapacity\": {\"memory\": \"16Gi\"}")), NULL,
                   "outside 1 MiB .. the GPU's 15109 MiB");
    expect_refused(RES(OURS("gpu-2", ", \"consumedCapacity\": {\"memory\": \"1000Ki\"}")), NULL,
                   "outside 1 MiB");
    expect_refused(RES(OURS("gpu-0", ", \"consumedCapacity\": {\"cores\": \"101\"}")), NULL,
                   "exceed the GPU's 100");
    expect_refused(RES(OURS("gpu-0", ", \"consumedCapacity\": {\"cores\": \"-5\"}")), NULL,
                   "cores:");
    expect_refused(RES(OURS("gpu-0", ", \"consumedCapacity\": {\"memory\": 5}")), NULL,
                   "not a quantity");
    expect_refused(RES(OURS("gpu-0", ", \"shareID\": \"../x\"")), NULL, "shareID");
    expect_refused(RES(OURS("gpu-0", "") "," OURS("gpu-0", "")), NULL, "got device gpu-0 twice");
    expect_refused(RES(OURS("gpu-0", ", \"shareID\": \"s1\"") "," OURS("gpu-0", ", \"shareID\": \"s1\"")),
                   NULL, "got device gpu-0 twice");
    expect_refused(RES("{\"request\": \"r\", \"driver\": \"other\", \"pool\": \"p\","
                       " \"device\": \"d\"}"),
                   NULL, "has no device of gpu.kgpu.io");
    expect_refused(RES("{\"request\": \"r\", \"pool\": \"p\", \"device\": \"d\"}"), NULL,
                   "has no driver");
    expect_refused(RES("{\"request\": \"R_!\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE
                       "\", \"device\": \"gpu-0\"}"),
                   NULL, "is not a DNS label");
    expect_refused(HEAD " \"status\": {\"allocation\": {\"devices\": {\"results\": 3}}}}", NULL,
                   "is not a list");
    gpus[0].healthy = false;
    expect_refused(RES(OURS("gpu-0", "")), NULL, "turned unhealthy");
    gpus[0].healthy = true;
}

/* A claim's CDI device and the device plugin's Allocate answer for the same shares. */
static void test_cdi_matches_allocate(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    dra_node_view node = {.pool = NODE, .gpus = inv.gpus, .ngpus = 3};
    dra_claim c;
    kgpu_error err = {0};
    assert_int_equal(dra_claim_read_text(CLAIM, strlen(CLAIM), NULL, &node, &c, &err), 0);
    contract_paths paths = {.state_dir = "/var/lib/kgpu/dra",
                      .shim_lib = "/var/lib/kgpu/dra/lib/libkgpu-limit.so"};
    json_t *spec = dra_cdi_spec(&c, &inv, &paths);
    assert_string_equal(spath(spec, "cdiVersion"), "0.5.0");
    assert_string_equal(spath(spec, "kind"), "kgpu.io/gpu");
    assert_int_equal(json_array_size(path(spec, "devices")), 3);
    for (int r = 0; r < c.nreqs; r++) {
        json_t *dev = path(spec, "devices");
        dev = json_array_get(dev, (size_t)r);
        char name[160];
        dra_cdi_name(&c, r, name, sizeof(name));
        assert_string_equal(spath(dev, "name"), name);
        /* What Allocate answers a container whose shares these are. */
        contract_target m;
        memset(&m, 0, sizeof(m));
        snprintf(m.uid, sizeof(m.uid), "uid-1");
        snprintf(m.container, sizeof(m.container), "%s", c.reqs[r]);
        for (int i = 0; i < c.nallocs; i++) {
            if (c.allocs[i].req != r)
                continue;
            contract_share *g = &m.gpus[m.ngpus++];
            g->index = c.allocs[i].index;
            snprintf(g->uuid, sizeof(g->uuid), "%s", c.allocs[i].uuid);
            g->milli = c.allocs[i].milli;
            g->memory_mib = c.allocs[i].memory_mib;
            m.pod_units += c.allocs[i].memory_mib / 1024;
        }
        contract_response want;
        contract_response_build(&m, &inv, &paths, &want);
        json_t *env = path(dev, "containerEdits.env");
        assert_int_equal(json_array_size(env), (size_t)want.nenv);
        for (int e = 0; e < want.nenv; e++) {
            char kv[600];
            snprintf(kv, sizeof(kv), "%s=%s", want.env[e].key, want.env[e].value);
            assert_string_equal(json_string_value(json_array_get(env, (size_t)e)), kv);
        }
        json_t *mounts = path(dev, "containerEdits.mounts");
        assert_int_equal(json_array_size(mounts), (size_t)want.nmounts);
        for (int k = 0; k < want.nmounts; k++) {
            json_t *mt = json_array_get(mounts, (size_t)k);
            assert_string_equal(spath(mt, "containerPath"), want.mounts[k].container_path);
            assert_string_equal(spath(mt, "hostPath"), want.mounts[k].host_path);
            assert_string_equal(spath(mt, "type"), "bind");
            assert_string_equal(json_string_value(json_array_get(path(mt, "options"), 0)),
                                want.mounts[k].read_only ? "ro" : "rw");
        }
    }
    /* The 30 % share: its GPU's schedule is mounted, as for a gpu-core container. */
    json_t *small = json_array_get(path(spec, "devices"), 0);
    char sched[200];
    snprintf(sched, sizeof(sched), "/var/run/kgpu-gpu/%s.sched", U0);
    bool found = false;
    size_t i;
    json_t *mt;
    json_array_foreach(path(small, "containerEdits.mounts"), i, mt) found |=
        strcmp(spath(mt, "containerPath"), sched) == 0;
    assert_true(found);
    assert_string_equal(json_string_value(json_array_get(path(small, "containerEdits.env"), 0)),
                        "NVIDIA_VISIBLE_DEVICES=" U0);
    json_decref(spec);

    char id[200];
    dra_cdi_id(&c, 1, id, sizeof(id));
    assert_string_equal(id, "kgpu.io/gpu=uid-1-pair");
    dra_cdi_path("/var/run/cdi", "uid-1", id, sizeof(id));
    assert_string_equal(id, "/var/run/cdi/kgpu.io-gpu_uid-1.json");
}

static void test_files(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    dra_node_view node = {.pool = NODE, .gpus = inv.gpus, .ngpus = 3};
    dra_claim c;
    kgpu_error err = {0};
    assert_int_equal(dra_claim_read_text(CLAIM, strlen(CLAIM), NULL, &node, &c, &err), 0);
    char dir[] = "/tmp/kgpu-dra-unit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cdi[200], p[400];
    snprintf(cdi, sizeof(cdi), "%s/cdi", dir);
    contract_paths paths = {.state_dir = dir, .shim_lib = NULL};
    assert_int_equal(dra_claim_files_write(&c, &inv, &paths, cdi, &err), 0);
    assert_int_equal(dra_claim_files_write(&c, &inv, &paths, cdi, &err), 0); /* idempotent */
    struct stat st;
    snprintf(p, sizeof(p), "%s/kgpu.io-gpu_uid-1.json", cdi);
    assert_int_equal(stat(p, &st), 0);
    snprintf(p, sizeof(p), "%s/pods/uid-1/small.limits", dir);
    assert_int_equal(stat(p, &st), 0);
    snprintf(p, sizeof(p), "%s/pods/uid-1/pair.limits", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(dra_claim_files_remove("uid-1", &paths, cdi, &err), 0);
    assert_int_equal(dra_claim_files_remove("uid-1", &paths, cdi, &err), 0); /* absent is fine */
    snprintf(p, sizeof(p), "%s/pods/uid-1", dir);
    assert_int_not_equal(stat(p, &st), 0);
    assert_int_not_equal(dra_claim_files_remove("../x", &paths, cdi, &err), 0);
    snprintf(p, sizeof(p), "rm -rf %s", dir);
    assert_int_equal(system(p), 0);
}

static void test_checkpoint(void **state)
{
    (void)state;
    inventory(NULL);
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3};
    dra_ckpt ck = {0}, back = {0};
    kgpu_error err = {0};
    dra_claim c;
    assert_int_equal(dra_claim_read_text(CLAIM, strlen(CLAIM), NULL, &node, &c, &err), 0);
    c.allocs[0].limit_pct = 60; /* a burst ceiling survives the round trip */
    assert_int_equal(dra_ckpt_put(&ck, &c, &err), 0);
    snprintf(c.uid, sizeof(c.uid), "uid-2");
    c.nallocs = 1;
    c.nreqs = 1;
    assert_int_equal(dra_ckpt_put(&ck, &c, &err), 0);
    assert_int_equal(dra_ckpt_put(&ck, &c, &err), 0); /* by UID: replaced, not added */
    assert_int_equal(ck.n, 2);

    char dir[] = "/tmp/kgpu-dra-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char file[200];
    snprintf(file, sizeof(file), "%s/checkpoint.json", dir);
    assert_int_equal(dra_ckpt_load(file, &back, &err), 0); /* none yet: empty */
    assert_int_equal(back.n, 0);
    assert_int_equal(dra_ckpt_save(file, &ck, &err), 0);
    assert_int_equal(dra_ckpt_load(file, &back, &err), 0);
    assert_int_equal(back.n, 2);
    for (int i = 0; i < 2; i++) {
        dra_claim *a = &ck.claims[i], *b = dra_ckpt_find(&back, a->uid);
        assert_non_null(b);
        assert_string_equal(a->ns, b->ns);
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->nreqs, b->nreqs);
        assert_int_equal(a->nallocs, b->nallocs);
        for (int r = 0; r < a->nreqs; r++)
            assert_string_equal(a->reqs[r], b->reqs[r]);
        for (int k = 0; k < a->nallocs; k++)
            assert_memory_equal(&a->allocs[k], &b->allocs[k], sizeof(a->allocs[k]));
    }
    assert_true(dra_ckpt_drop(&back, "uid-1"));
    assert_false(dra_ckpt_drop(&back, "uid-1"));
    assert_int_equal(back.n, 1);

    static const char *const bad[] = {
        "",
        "{\"version\": 3, \"claims\": []}",
        "{\"version\": 1}",
        "{\"version\": 1, \"claims\": [{\"uid\": \"../x\", \"namespace\": \"a\", \"name\": \"b\","
        " \"devices\": []}]}",
        "{\"version\": 1, \"claims\": [{\"uid\": \"u\", \"namespace\": \"a\", \"name\": \"b\","
        " \"devices\": [{\"request\": \"r\", \"device\": \"gpu-0\", \"uuid\": \"G\","
        " \"index\": 0, \"memoryMiB\": 1, \"milli\": 1001, \"shareID\": \"\"}]}]}",
        "{\"version\": 1, \"claims\": [{\"uid\": \"u\", \"namespace\": \"a\", \"name\": \"b\","
        " \"devices\": [{\"request\": \"r\", \"device\": \"gpu-0\", \"uuid\": \"G\","
        " \"index\": 0, \"memoryMiB\": 1, \"milli\": 1, \"shareID\": \"\"}]},"
        " {\"uid\": \"u\", \"namespace\": \"a\", \"name\": \"b\","
        " \"devices\": [{\"request\": \"r\", \"device\": \"gpu-0\", \"uuid\": \"G\","
        " \"index\": 0, \"memoryMiB\": 1, \"milli\": 1, \"shareID\": \"\"}]}]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kgpu_error e = {0};
        if (dra_ckpt_parse(bad[i], strlen(bad[i]), "ck.json", &back, &e) == 0)
            fail_msg("accepted checkpoint %zu", i);
        assert_non_null(strstr(e.msg, "ck.json"));
        assert_int_equal(back.n, 0);
    }
    dra_ckpt_free(&ck);
    dra_ckpt_free(&back);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_checkpoint_bounded(void **state)
{
    (void)state;
    dra_ckpt ck = {0};
    dra_claim c;
    memset(&c, 0, sizeof(c));
    kgpu_error err = {0};
    for (int i = 0; i < DRA_MAX_CLAIMS; i++) {
        snprintf(c.uid, sizeof(c.uid), "u%d", i);
        assert_int_equal(dra_ckpt_put(&ck, &c, &err), 0);
    }
    snprintf(c.uid, sizeof(c.uid), "one-more");
    assert_int_equal(dra_ckpt_put(&ck, &c, &err), KGPU_ERANGE);
    assert_non_null(strstr(err.msg, "1024 prepared claims"));
    dra_ckpt_free(&ck);
}


/* ---- MIG ---- */

#define MIG_CLAIM(devs)                                                                            \
    "{\"metadata\": {\"namespace\": \"ns\", \"name\": \"m\", \"uid\": \"mig-1\"},"                \
    " \"status\": {\"allocation\": {\"devices\": {\"results\": [" devs "]}}}}"

/* GPU 0 in MIG mode (an A100-40GB), GPU 1 not, GPU 2 a T4. */
static void mig_inventory(contract_inventory *inv)
{
    inventory(inv);
    gpus[0].mig_mode = 1;
    if (inv != NULL)
        inv->gpus[0].mig_mode = 1;
}

static bool dns_label(const char *s)
{
    if (s == NULL || *s == '\0' || strlen(s) > 63 || *s == '-' || s[strlen(s) - 1] == '-')
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-'))
            return false;
    return true;
}

static void test_slice_mig(void **state)
{
    (void)state;
    mig_inventory(NULL);
    dra_slice_input in = {.node = NODE, .gpus = gpus, .ngpus = 3, .generation = 3, .mig = true};
    json_t *all = dra_slices_build(&in);
    /* Devices in one slice, the counter set in another: a slice holds one or the other. */
    assert_int_equal(json_array_size(all), 2);
    json_t *ds = json_array_get(all, 0), *cs = json_array_get(all, 1);
    assert_string_equal(spath(ds, "metadata.name"), NODE "-gpu.kgpu.io");
    assert_string_equal(spath(cs, "metadata.name"), NODE "-gpu.kgpu.io-01");
    for (int k = 0; k < 2; k++) {
        json_t *sl = json_array_get(all, (size_t)k);
        assert_int_equal(json_integer_value(path(sl, "spec.pool.resourceSliceCount")), 2);
        assert_int_equal(json_integer_value(path(sl, "spec.pool.generation")), 3);
        assert_string_equal(spath(sl, "spec.nodeName"), NODE);
    }
    assert_null(path(ds, "spec.sharedCounters"));
    assert_null(path(cs, "spec.devices"));
    json_t *devs = path(ds, "spec.devices");
    /* gpu-0, its 18 partitions ("+me" left out), gpu-1, gpu-2. */
    assert_int_equal(json_array_size(devs), 21);
    assert_string_equal(spath(devs, "0.name"), "gpu-0");
    assert_string_equal(spath(devs, "19.name"), "gpu-1");
    assert_string_equal(spath(devs, "20.name"), "gpu-2");
    /* The whole GPU consumes all of its counters; its memory is the full instance's. */
    json_t *g0 = json_array_get(devs, 0);
    assert_string_equal(spath(g0, "consumesCounters.0.counterSet"), "gpu-0-slices");
    assert_int_equal(json_object_size(path(g0, "consumesCounters.0.counters")), 9);
    assert_string_equal(spath(g0, "consumesCounters.0.counters.memory-slice-7.value"), "1");
    assert_string_equal(spath(g0, "consumesCounters.0.counters.compute-slices.value"), "7");
    assert_string_equal(spath(g0, "capacity.memory.value"), "40192Mi");
    assert_true(json_is_true(path(g0, "allowMultipleAllocations")));
    assert_null(path(devs, "19.consumesCounters"));
    assert_string_equal(spath(devs, "19.capacity.memory.value"), "40Gi");
    /* 1g.5gb first, in kgpu_mig_slice_order: the scheduler's first fit is kgpu's choice. */
    const kgpu_mig_model *m = kgpu_mig_model_find("A100-SXM4-40GB", 40960);
    int order[KGPU_MIG_MAX_STARTS];
    int n = kgpu_mig_slice_order(m, 0, order);
    assert_int_equal(n, 7);
    assert_int_equal(order[0], 6);
    for (int i = 0; i < n; i++) {
        char want[64];
        dra_mig_device_name(0, "1g.5gb", order[i], want, sizeof(want));
        assert_string_equal(spath(json_array_get(devs, (size_t)(1 + i)), "name"), want);
    }
    json_t *d1 = json_array_get(devs, 1);
    assert_string_equal(spath(d1, "name"), "gpu-0-mig-1g-5gb-6");
    assert_true(json_is_true(path(d1, "attributes.mig.bool")));
    assert_string_equal(spath(d1, "attributes.profile.string"), "1g.5gb");
    assert_int_equal(json_integer_value(path(d1, "attributes.migStart.int")), 6);
    assert_int_equal(json_integer_value(path(d1, "attributes.migSize.int")), 1);
    assert_int_equal(json_integer_value(path(d1, "attributes.parentIndex.int")), 0);
    assert_string_equal(spath(d1, "attributes.parentUUID.string"), U0);
    assert_int_equal(json_integer_value(path(d1, "attributes.memoryMiB.int")), 4864);
    assert_int_equal(json_integer_value(path(d1, "attributes.multiprocessors.int")), 14);
    assert_string_equal(spath(d1, "attributes.productName.string"), "A100-SXM4-40GB");
    assert_string_equal(spath(d1, "capacity.memory.value"), "4864Mi");
    assert_null(path(d1, "capacity.memory.requestPolicy"));
    assert_null(path(d1, "allowMultipleAllocations"));
    assert_string_equal(spath(d1, "consumesCounters.0.counters.memory-slice-6.value"), "1");
    assert_string_equal(spath(d1, "consumesCounters.0.counters.compute-slices.value"), "1");
    assert_int_equal(json_object_size(path(d1, "consumesCounters.0.counters")), 2);
    /* Every name a DNS label that maps back to what it is; 3g.20gb at 4 takes slices 4-7. */
    size_t i;
    json_t *d;
    json_array_foreach(devs, i, d)
    {
        assert_true(dns_label(spath(d, "name")));
        dra_device_ref ref;
        assert_true(dra_device_find(gpus, 3, true, spath(d, "name"), &ref));
        if (ref.profile >= 0) {
            assert_int_equal(ref.gpu, 0);
            assert_string_equal(ref.model->profiles[ref.profile].name,
                                spath(d, "attributes.profile.string"));
            assert_int_equal(ref.start, json_integer_value(path(d, "attributes.migStart.int")));
        }
        if (strcmp(spath(d, "name"), "gpu-0-mig-3g-20gb-4") == 0) {
            json_t *c = path(d, "consumesCounters.0.counters");
            assert_int_equal(json_object_size(c), 5);
            assert_non_null(json_object_get(c, "memory-slice-4"));
            assert_non_null(json_object_get(c, "memory-slice-7"));
            assert_string_equal(spath(c, "compute-slices.value"), "3");
        }
    }
    assert_string_equal(spath(cs, "spec.sharedCounters.0.name"), "gpu-0-slices");
    assert_int_equal(json_array_size(path(cs, "spec.sharedCounters")), 1);
    assert_string_equal(spath(cs, "spec.sharedCounters.0.counters.memory-slice-0.value"), "1");
    assert_string_equal(spath(cs, "spec.sharedCounters.0.counters.compute-slices.value"), "7");
    /* As the server returns them: the same; a changed counter is not. */
    json_t *have = json_deep_copy(cs);
    json_object_set_new(path(have, "spec.pool"), "generation", json_integer(8));
    assert_true(dra_slice_same(have, cs));
    json_object_set_new(path(have, "spec.sharedCounters.0.counters.compute-slices"), "value",
                        json_string("6"));
    assert_false(dra_slice_same(have, cs));
    assert_false(dra_slice_same(ds, cs));
    json_decref(have);
    json_decref(all);

    /* Unhealthy: every device of the GPU tainted, the partitions too. */
    gpus[0].healthy = false;
    all = dra_slices_build(&in);
    json_array_foreach(path(json_array_get(all, 0), "spec.devices"), i, d)
    {
        bool on0 = i < 19;
        assert_int_equal(path(d, "taints") != NULL, on0);
        if (on0)
            assert_string_equal(spath(d, "taints.0.key"), DRA_TAINT_UNHEALTHY);
    }
    json_decref(all);
    gpus[0].healthy = true;

    /* Without MIG offered (--fake-gpus), MIG mode changes nothing: today's one slice. */
    in.mig = false;
    all = dra_slices_build(&in);
    assert_int_equal(json_array_size(all), 1);
    assert_int_equal(json_array_size(path(json_array_get(all, 0), "spec.devices")), 3);
    assert_null(path(json_array_get(all, 0), "spec.devices.0.consumesCounters"));
    json_decref(all);
    dra_device_ref ref;
    assert_false(dra_device_find(gpus, 3, false, "gpu-0-mig-1g-5gb-6", &ref));
}

static void test_slice_mig_chunks(void **state)
{
    (void)state;
    kgpu_gpu_info many[9];
    memset(many, 0, sizeof(many));
    for (int i = 0; i < 9; i++) {
        many[i].index = i;
        snprintf(many[i].uuid, sizeof(many[i].uuid), "GPU-%d", i);
        snprintf(many[i].model, sizeof(many[i].model), "NVIDIA H100 80GB HBM3");
        many[i].memory_mib = 81559;
        many[i].numa = -1;
        many[i].healthy = true;
        many[i].mig_mode = 1;
    }
    dra_slice_input in = {.node = NODE, .gpus = many, .ngpus = 9, .generation = 1, .mig = true};
    json_t *all = dra_slices_build(&in);
    /* 19 devices a GPU, 3 GPUs a slice (64 at most); 8 counter sets a slice. */
    assert_int_equal(json_array_size(all), 5);
    const char *names[5] = {NODE "-gpu.kgpu.io", NODE "-gpu.kgpu.io-01", NODE "-gpu.kgpu.io-02",
                            NODE "-gpu.kgpu.io-03", NODE "-gpu.kgpu.io-04"};
    int gpu_slice[9];
    for (int g = 0; g < 9; g++)
        gpu_slice[g] = -1;
    for (size_t k = 0; k < 5; k++) {
        json_t *sl = json_array_get(all, k);
        assert_string_equal(spath(sl, "metadata.name"), names[k]);
        assert_int_equal(json_integer_value(path(sl, "spec.pool.resourceSliceCount")), 5);
        json_t *devs = path(sl, "spec.devices");
        if (k < 3) {
            assert_int_equal(json_array_size(devs), 57);
            size_t i;
            json_t *d;
            json_array_foreach(devs, i, d)
            {
                dra_device_ref ref;
                assert_true(dra_device_find(many, 9, true, spath(d, "name"), &ref));
                /* A GPU's devices stay in one slice, so their order holds. */
                assert_true(gpu_slice[ref.gpu] < 0 || gpu_slice[ref.gpu] == (int)k);
                gpu_slice[ref.gpu] = (int)k;
            }
        } else {
            assert_null(devs);
            assert_int_equal(json_array_size(path(sl, "spec.sharedCounters")), k == 3 ? 8 : 1);
        }
    }
    assert_string_equal(spath(json_array_get(all, 4), "spec.sharedCounters.0.name"),
                        "gpu-8-slices");
    json_decref(all);
}

static void test_claim_mig(void **state)
{
    (void)state;
    mig_inventory(NULL);
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3, .mig = true};
    dra_claim c;
    kgpu_error err = {0};
    const char *text = MIG_CLAIM(OURS("gpu-0-mig-3g-20gb-4", "") "," OURS("gpu-0", ""));
    assert_int_equal(dra_claim_read_text(text, strlen(text), "mig-1", &node, &c, &err), 0);
    assert_int_equal(c.nallocs, 2);
    const dra_alloc *a = &c.allocs[0], *w = &c.allocs[1];
    assert_string_equal(a->profile, "3g.20gb");
    assert_int_equal(a->mig_start, 4);
    assert_int_equal(a->mig_size, 4);
    assert_int_equal(a->nvml_profile, 2);
    assert_false(a->mig_shared);
    assert_int_equal(a->memory_mib, 19968);
    assert_string_equal(a->uuid, U0);
    assert_string_equal(a->mig_uuid, "");
    /* The whole device of a MIG GPU is its full instance, shared. */
    assert_string_equal(w->profile, "7g.40gb");
    assert_true(w->mig_shared);
    assert_int_equal(w->mig_start, 0);
    assert_int_equal(w->memory_mib, 40192);
    /* Names no slice of this node publishes, and shares of an instance. */
    static const char *const hostile[] = {
        "gpu-0-mig-3g-20gb-2",  "gpu-0-mig-3g-20gb-04", "gpu-1-mig-1g-5gb-0",
        "gpu-0-mig-1g-5gb+me-0", "gpu-0-mig-1g-5gb-me-0", "gpu-0-mig-1g.5gb-6",
        "gpu-0-mig-1g-5gb-7",   "gpu-0-mig-1g-5gb-6x",  "gpu-0-mig-7g-40gb-0 ",
        "gpu-2-mig-1g-5gb-0",   "gpu-0-mig-",           "gpu-0-mig-1g-10gb-1",
    };
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        char buf[512];
        snprintf(buf, sizeof(buf),
                 MIG_CLAIM("{\"request\": \"r\", \"driver\": \"gpu.kgpu.io\", \"pool\": \"" NODE
                           "\", \"device\": \"%s\"}"),
                 hostile[i]);
        if (dra_claim_read_text(buf, strlen(buf), NULL, &node, &c, &err) == 0 ||
            strstr(err.msg, "which node " NODE " does not have") == NULL)
            fail_msg("accepted device '%s' (%s)", hostile[i], err.msg);
    }
    text = MIG_CLAIM(OURS("gpu-0-mig-1g-5gb-6", ", \"shareID\": \"s1\""));
    assert_int_not_equal(dra_claim_read_text(text, strlen(text), NULL, &node, &c, &err), 0);
    assert_non_null(strstr(err.msg, "allows no shares"));
    text = MIG_CLAIM(OURS("gpu-0-mig-1g-5gb-6", ", \"consumedCapacity\": {\"memory\": \"5Gi\"}"));
    assert_int_not_equal(dra_claim_read_text(text, strlen(text), NULL, &node, &c, &err), 0);
    assert_non_null(strstr(err.msg, "the instance's 4864 MiB"));
    /* Not offered (--fake-gpus): a MIG name is unknown. */
    node.mig = false;
    text = MIG_CLAIM(OURS("gpu-0-mig-1g-5gb-6", ""));
    assert_int_not_equal(dra_claim_read_text(text, strlen(text), NULL, &node, &c, &err), 0);
}

/* The CDI spec hands the container the instance, with the profile's memory. */
static void test_cdi_mig(void **state)
{
    (void)state;
    contract_inventory inv;
    mig_inventory(&inv);
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3, .mig = true};
    dra_claim c;
    kgpu_error err = {0};
    const char *text = MIG_CLAIM(OURS("gpu-0-mig-1g-5gb-6", ""));
    assert_int_equal(dra_claim_read_text(text, strlen(text), NULL, &node, &c, &err), 0);
    snprintf(c.allocs[0].mig_uuid, sizeof(c.allocs[0].mig_uuid), "MIG-1111");
    contract_paths paths = {.state_dir = "/s", .shim_lib = NULL};
    json_t *spec = dra_cdi_spec(&c, &inv, &paths);
    json_t *env = path(spec, "devices.0.containerEdits.env");
    bool vis = false, mem = false;
    size_t i;
    json_t *e;
    json_array_foreach(env, i, e)
    {
        vis |= strcmp(json_string_value(e), "NVIDIA_VISIBLE_DEVICES=MIG-1111") == 0;
        mem |= strcmp(json_string_value(e), "KGPU_MEMORY_LIMIT_MIB=4864") == 0;
    }
    assert_true(vis);
    assert_true(mem);
    json_decref(spec);
    contract_target t;
    dra_claim_target(&c, 0, 1024, &t);
    assert_string_equal(t.gpus[0].uuid, "MIG-1111");
    char *limits = contract_limits_text(&t);
    assert_non_null(strstr(limits, "uuid=MIG-1111 memory_mib=4864"));
    free(limits);
}

static dra_claim mig_claim(const char *uid, const char *devs_json)
{
    char buf[2048];
    snprintf(buf, sizeof(buf),
             "{\"metadata\": {\"namespace\": \"ns\", \"name\": \"%s\", \"uid\": \"%s\"},"
             " \"status\": {\"allocation\": {\"devices\": {\"results\": [%s]}}}}",
             uid, uid, devs_json);
    dra_node_view node = {.pool = NODE, .gpus = gpus, .ngpus = 3, .mig = true};
    dra_claim c;
    kgpu_error err = {0};
    if (dra_claim_read_text(buf, strlen(buf), NULL, &node, &c, &err) != 0)
        fail_msg("%s", err.msg);
    return c;
}

static void test_mig_conflict(void **state)
{
    (void)state;
    mig_inventory(NULL);
    dra_ckpt ck = {0};
    kgpu_error err = {0};
    dra_claim a = mig_claim("a", OURS("gpu-0-mig-3g-20gb-4", ""));
    assert_int_equal(dra_ckpt_put(&ck, &a, &err), 0);
    assert_int_equal(dra_ckpt_conflict(&ck, &a, &err), 0); /* itself: no conflict */
    dra_claim b = mig_claim("b", OURS("gpu-0-mig-1g-5gb-6", ""));
    assert_int_equal(dra_ckpt_conflict(&ck, &b, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "gpu-0-mig-1g-5gb-6 (1g.5gb on memory slices 6-6) overlaps "
                                    "gpu-0-mig-3g-20gb-4 (3g.20gb on memory slices 4-7)"));
    assert_non_null(strstr(err.msg, "prepared claim ns/a (a)"));
    b = mig_claim("b", OURS("gpu-0-mig-1g-5gb-3", ""));
    assert_int_equal(dra_ckpt_conflict(&ck, &b, &err), 0);
    b = mig_claim("b", OURS("gpu-0", "") "," OURS("gpu-1", ""));
    assert_int_equal(dra_ckpt_conflict(&ck, &b, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "gpu-0 (the whole GPU)"));
    b = mig_claim("b", OURS("gpu-1", ""));
    assert_int_equal(dra_ckpt_conflict(&ck, &b, &err), 0);
    /* Within one claim. */
    b = mig_claim("b", OURS("gpu-0-mig-1g-5gb-0", "") "," OURS("gpu-0-mig-2g-10gb-0", ""));
    assert_int_equal(dra_ckpt_conflict(&ck, &b, &err), KGPU_ESTATE);
    /* Shares of the whole instance go together; a partition beside them does not. */
    dra_ckpt_free(&ck);
    dra_claim s1 = mig_claim("s1", OURS("gpu-0", ", \"shareID\": \"x1\""));
    dra_claim s2 = mig_claim("s2", OURS("gpu-0", ", \"shareID\": \"x2\""));
    assert_int_equal(dra_ckpt_put(&ck, &s1, &err), 0);
    assert_int_equal(dra_ckpt_conflict(&ck, &s2, &err), 0);
    assert_int_equal(dra_ckpt_conflict(&ck, &a, &err), KGPU_ESTATE);
    dra_ckpt_free(&ck);
}

/* ---- a stand-in for NVML's MIG calls, as NVML documents them ---- */

typedef struct fake_mig {
    int n;
    kgpu_nvml_mig gi[KGPU_NVML_MIG_MAX];
    unsigned next_id, serial;
    int fail_at; /* the create call that fails (1-based); 0 = none */
    int creates, destroys;
} fake_mig;

static int fake_list(void *ctx, int index, kgpu_nvml_mig *out, int cap, int *n, kgpu_error *err)
{
    (void)err;
    fake_mig *f = ctx;
    *n = 0;
    for (int i = 0; i < f->n && *n < cap; i++)
        if (f->gi[i].gpu == index)
            out[(*n)++] = f->gi[i];
    return 0;
}

static int fake_create(void *ctx, int index, int nvml_profile, int start, kgpu_nvml_mig *out,
                       kgpu_error *err)
{
    fake_mig *f = ctx;
    const kgpu_mig_model *m = kgpu_mig_model_find("A100-SXM4-40GB", 40960);
    int size = 0;
    for (int p = 0; p < m->nprofiles; p++)
        if (m->profiles[p].nvml_profile == nvml_profile)
            size = m->profiles[p].size;
    if (++f->creates == f->fail_at)
        return kgpu_error_set(err, KGPU_EIO, "injected failure");
    for (int i = 0; i < f->n; i++)
        if (f->gi[i].gpu == index &&
            (kgpu_mig_mask(start, size) & kgpu_mig_mask(f->gi[i].start, f->gi[i].size)) != 0)
            return kgpu_error_set(err, KGPU_ENOFIT, "INSUFFICIENT_RESOURCES");
    kgpu_nvml_mig *g = &f->gi[f->n++];
    memset(g, 0, sizeof(*g));
    g->gpu = index;
    g->gi_id = ++f->next_id;
    g->nvml_profile = nvml_profile;
    g->start = start;
    g->size = size;
    snprintf(g->uuid, sizeof(g->uuid), "MIG-%u", ++f->serial);
    *out = *g;
    return 0;
}

static int fake_destroy(void *ctx, int index, unsigned gi_id, kgpu_error *err)
{
    (void)err;
    fake_mig *f = ctx;
    f->destroys++;
    for (int i = 0; i < f->n; i++)
        if (f->gi[i].gpu == index && f->gi[i].gi_id == gi_id) {
            f->gi[i] = f->gi[--f->n];
            return 0;
        }
    return 0;
}

static void test_instances(void **state)
{
    (void)state;
    mig_inventory(NULL);
    fake_mig f;
    memset(&f, 0, sizeof(f));
    dra_mig_ops ops = {
        .ctx = &f, .list = fake_list, .create = fake_create, .destroy = fake_destroy};
    dra_ckpt ck = {0};
    kgpu_error err = {0};
    bool changed = false;

    dra_claim a = mig_claim("a", OURS("gpu-0-mig-3g-20gb-4", "") "," OURS("gpu-1", ""));
    assert_true(dra_claim_has_mig(&a));
    assert_int_equal(dra_instances_ensure(&ops, &ck, &a, &changed, &err), 0);
    assert_true(changed);
    assert_int_equal(f.n, 1);
    assert_int_equal(f.gi[0].start, 4);
    assert_int_equal(f.gi[0].nvml_profile, 2);
    assert_string_equal(a.allocs[0].mig_uuid, "MIG-1");
    assert_int_equal(a.allocs[0].gi_id, f.gi[0].gi_id);
    assert_string_equal(a.allocs[1].mig_uuid, ""); /* gpu-1 is not in MIG mode */
    assert_int_equal(dra_ckpt_put(&ck, &a, &err), 0);
    /* Again (a driver restart): kept as it is. */
    assert_int_equal(dra_instances_ensure(&ops, &ck, &ck.claims[0], &changed, &err), 0);
    assert_false(changed);
    assert_int_equal(f.creates, 1);
    /* A reboot: the instance is gone, made again at the same place with a new UUID. */
    f.n = 0;
    f.next_id = 5;
    assert_int_equal(dra_instances_ensure(&ops, &ck, &ck.claims[0], &changed, &err), 0);
    assert_true(changed);
    assert_string_equal(ck.claims[0].allocs[0].mig_uuid, "MIG-2");
    assert_int_equal(ck.claims[0].allocs[0].gi_id, 6);
    assert_int_equal(f.gi[0].start, 4);

    /* The whole GPU's instance: made once, shared, destroyed with its last claim. */
    dra_ckpt_free(&ck);
    f.n = 0;
    dra_claim s1 = mig_claim("s1", OURS("gpu-0", ", \"shareID\": \"x1\""));
    dra_claim s2 = mig_claim("s2", OURS("gpu-0", ", \"shareID\": \"x2\""));
    assert_int_equal(dra_instances_ensure(&ops, &ck, &s1, NULL, &err), 0);
    assert_int_equal(dra_ckpt_put(&ck, &s1, &err), 0);
    int made = f.creates;
    assert_int_equal(dra_instances_ensure(&ops, &ck, &s2, NULL, &err), 0);
    assert_int_equal(f.creates, made);
    assert_string_equal(s2.allocs[0].mig_uuid, s1.allocs[0].mig_uuid);
    assert_int_equal(f.gi[0].nvml_profile, 4); /* 7g */
    assert_int_equal(dra_ckpt_put(&ck, &s2, &err), 0);
    /* After a reboot the first restored makes it, the second shares it. */
    f.n = 0;
    assert_int_equal(dra_instances_ensure(&ops, &ck, &ck.claims[0], NULL, &err), 0);
    assert_int_equal(dra_instances_ensure(&ops, &ck, &ck.claims[1], NULL, &err), 0);
    assert_int_equal(f.n, 1);
    assert_string_equal(ck.claims[0].allocs[0].mig_uuid, ck.claims[1].allocs[0].mig_uuid);
    assert_int_equal(dra_instances_release(&ops, &ck, &ck.claims[1], &err), 0);
    assert_int_equal(f.n, 1); /* s1 still holds it */
    dra_ckpt_drop(&ck, "s2");
    assert_int_equal(dra_instances_release(&ops, &ck, &ck.claims[0], &err), 0);
    assert_int_equal(f.n, 0);
    /* Idempotent: gone already is fine. */
    assert_int_equal(dra_instances_release(&ops, &ck, &ck.claims[0], &err), 0);
    dra_ckpt_free(&ck);

    /* A failure leaves nothing made behind, and names the device. */
    dra_claim two =
        mig_claim("t", OURS("gpu-0-mig-1g-5gb-6", "") "," OURS("gpu-0-mig-2g-10gb-0", ""));
    f.fail_at = f.creates + 2;
    assert_int_not_equal(dra_instances_ensure(&ops, &ck, &two, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "gpu-0-mig-2g-10gb-0"));
    assert_non_null(strstr(err.msg, "injected failure"));
    assert_int_equal(f.n, 0);
    assert_string_equal(two.allocs[0].mig_uuid, "");
    /* Slices taken by something else: NVML refuses, and the claim gets the error. */
    f.fail_at = 0;
    kgpu_nvml_mig other;
    assert_int_equal(fake_create(&f, 0, 0, 6, &other, &err), 0);
    two = mig_claim("t", OURS("gpu-0-mig-1g-5gb-6", ""));
    assert_int_equal(dra_instances_ensure(&ops, &ck, &two, NULL, &err), KGPU_ENOFIT);
    assert_int_equal(f.n, 1);

    /* No NVML (--fake-gpus): a MIG claim is refused, another is not touched. */
    dra_mig_ops none = {0};
    assert_int_equal(dra_instances_ensure(&none, &ck, &two, NULL, &err), KGPU_ESTATE);
    dra_claim plain = mig_claim("p", OURS("gpu-1", ""));
    assert_int_equal(dra_instances_ensure(&none, &ck, &plain, NULL, &err), 0);
    assert_int_equal(dra_instances_release(&none, &ck, &plain, &err), 0);
}

static void test_checkpoint_mig(void **state)
{
    (void)state;
    mig_inventory(NULL);
    dra_ckpt ck = {0}, back = {0};
    kgpu_error err = {0};
    dra_claim a = mig_claim("a", OURS("gpu-0-mig-3g-20gb-4", "") "," OURS("gpu-1", ""));
    a.allocs[0].gi_id = 2;
    a.allocs[0].ci_id = 0;
    snprintf(a.allocs[0].mig_uuid, sizeof(a.allocs[0].mig_uuid), "MIG-abc");
    dra_claim s = mig_claim("s", OURS("gpu-0", ", \"shareID\": \"x1\""));
    assert_int_equal(dra_ckpt_put(&ck, &a, &err), 0);
    assert_int_equal(dra_ckpt_put(&ck, &s, &err), 0);
    char *text = dra_ckpt_encode(&ck);
    assert_non_null(strstr(text, "\"version\":2"));
    assert_int_equal(dra_ckpt_parse(text, strlen(text), "ck", &back, &err), 0);
    free(text);
    assert_int_equal(back.n, 2);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < ck.claims[i].nallocs; k++)
            assert_memory_equal(&ck.claims[i].allocs[k], &back.claims[i].allocs[k],
                                sizeof(dra_alloc));
    /* Without MIG the file stays version 1, and version 1 files read as before. */
    dra_ckpt_drop(&ck, "s");
    ck.claims[0].allocs[0] = ck.claims[0].allocs[1];
    ck.claims[0].nallocs = 1;
    text = dra_ckpt_encode(&ck);
    assert_non_null(strstr(text, "\"version\":1"));
    free(text);
    static const char old[] =
        "{\"version\": 1, \"claims\": [{\"uid\": \"u\", \"namespace\": \"a\", \"name\": \"b\","
        " \"devices\": [{\"request\": \"r\", \"device\": \"gpu-0\", \"uuid\": \"G\","
        " \"index\": 0, \"memoryMiB\": 1, \"milli\": 1, \"shareID\": \"\"}]}]}";
    assert_int_equal(dra_ckpt_parse(old, strlen(old), "old", &back, &err), 0);
    assert_int_equal(back.n, 1);
    assert_string_equal(back.claims[0].allocs[0].profile, "");
    assert_false(dra_claim_has_mig(&back.claims[0]));
    /* Malformed MIG entries are refused. */
#define MIGDEV(m)                                                                                  \
    "{\"version\": 2, \"claims\": [{\"uid\": \"u\", \"namespace\": \"a\", \"name\": \"b\","        \
    " \"devices\": [{\"request\": \"r\", \"device\": \"gpu-0\", \"uuid\": \"G\","                 \
    " \"index\": 0, \"memoryMiB\": 1, \"milli\": 0, \"shareID\": \"\", \"mig\": " m "}]}]}"
#define MIGOK(p, st, sz, u)                                                                        \
    "{\"profile\": \"" p "\", \"nvmlProfile\": 2, \"start\": " st ", \"size\": " sz ","           \
    " \"shared\": false, \"gi\": 1, \"ci\": 0, \"uuid\": \"" u "\"}"
    static const char good[] = MIGDEV(MIGOK("3g.20gb", "4", "4", "MIG-x"));
    assert_int_equal(dra_ckpt_parse(good, strlen(good), "ck", &back, &err), 0);
    assert_int_equal(back.claims[0].allocs[0].mig_start, 4);
    static const char *const bad[] = {
        MIGDEV(MIGOK("3g.20gb", "6", "4", "MIG-x")), MIGDEV(MIGOK("3g.20gb", "-1", "4", "")),
        MIGDEV(MIGOK("3g/20gb", "4", "4", "")),      MIGDEV(MIGOK("3g.20gb", "4", "0", "")),
        MIGDEV(MIGOK("3g.20gb", "4", "4", "../x")),  MIGDEV(MIGOK("", "4", "4", "")),
        MIGDEV("7"),                                 MIGDEV("{}"),
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kgpu_error e = {0};
        if (dra_ckpt_parse(bad[i], strlen(bad[i]), "ck.json", &back, &e) == 0)
            fail_msg("accepted MIG checkpoint %zu", i);
        assert_non_null(strstr(e.msg, "mig malformed"));
    }
    dra_ckpt_free(&ck);
    dra_ckpt_free(&back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_slice_mig),
        cmocka_unit_test(test_slice_mig_chunks),
        cmocka_unit_test(test_claim_mig),
        cmocka_unit_test(test_cdi_mig),
        cmocka_unit_test(test_mig_conflict),
        cmocka_unit_test(test_instances),
        cmocka_unit_test(test_checkpoint_mig),
        cmocka_unit_test(test_node_conflicts),
        cmocka_unit_test(test_claim_read),
        cmocka_unit_test(test_claim_core_limit),
        cmocka_unit_test(test_claim_refused),
        cmocka_unit_test(test_claim_two_shares_one_gpu),
        cmocka_unit_test(test_cdi_matches_allocate),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_checkpoint_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
