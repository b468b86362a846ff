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

static void test_slice(void **state)
{
    (void)state;
    inventory(NULL);
    gpus[1].healthy = false;
    const char *cc[3] = {"8.0", NULL, "7.5"};
    dra_slice_input in = {.node = NODE, .node_uid = "node-uid-1", .gpus = gpus, .ngpus = 3,
                          .compute_capability = cc, .generation = 4};
    json_t *s = dra_slice_build(&in);
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
    /* The unhealthy GPU is left out. */
    assert_int_equal(json_array_size(path(s, "spec.devices")), 2);
    json_t *d0 = path(s, "spec.devices.0"), *d2 = path(s, "spec.devices.1");
    assert_string_equal(spath(d0, "name"), "gpu-0");
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
    assert_true(dra_slice_same(have, s));
    /* A GPU back to health is a change. */
    gpus[1].healthy = true;
    json_t *want = dra_slice_build(&in);
    assert_false(dra_slice_same(have, want));
    json_decref(want);
    gpus[1].healthy = false;
    /* So is another owner (the Node was made again). */
    in.node_uid = "node-uid-2";
    want = dra_slice_build(&in);
    assert_false(dra_slice_same(have, want));
    json_decref(want);
    /* Without a known Node UID, the owner is not compared. */
    in.node_uid = "";
    want = dra_slice_build(&in);
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
        "{\"version\": 2, \"claims\": []}",
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice),
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
