/*
 * The container contract (src/contract) against what the docs promise: the limits file as the
 * library's own parser reads it, env and mounts, host files and their modes, and both agents
 * (Allocate, CDI) giving one container the same.
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

#include "contract.h"
#include "deviceplugin.pb-c.h"
#include "dp.h"
#include "dra.h"
#include "gpusched.h"
#include "shimlimits.h"

/* NVML's UUID form: "GPU-" and 36 characters. */
#define U0    "GPU-aaaaaaaa-0000-4000-8000-000000000000"
#define U1    "GPU-aaaaaaaa-0000-4000-8000-000000000001"
#define U2    "GPU-bbbbbbbb-0000-4000-8000-000000000002"
#define NODE  "gpu-node-1"
#define STATE "/var/lib/kgpu"
#define SHIM  "/opt/kgpu/lib/libkgpu-limit.so"
#define GPU_MIB 40960

static const char *const UUIDS[3] = {U0, U1, U2};

/* Three 40 GiB GPUs, host indexes 0..2, memory unit 1 GiB. */
static void inventory(contract_inventory *inv)
{
    memset(inv, 0, sizeof(*inv));
    inv->ngpus = 3;
    inv->unit_mib = 1024;
    for (int i = 0; i < 3; i++) {
        inv->gpus[i].index = i;
        snprintf(inv->gpus[i].uuid, sizeof(inv->gpus[i].uuid), "%s", UUIDS[i]);
        snprintf(inv->gpus[i].model, sizeof(inv->gpus[i].model), "A100-SXM4-40GB");
        inv->gpus[i].memory_mib = GPU_MIB;
        inv->gpus[i].numa = 0;
        inv->gpus[i].healthy = true;
    }
}

/* A container "main" of pod uid "pod-1" on the inventory's GPUs `first`.. with these shares. */
static void target(contract_target *t, int ngpus, int first, int milli, int64_t memory_mib)
{
    memset(t, 0, sizeof(*t));
    snprintf(t->ns, sizeof(t->ns), "default");
    snprintf(t->name, sizeof(t->name), "trainer");
    snprintf(t->uid, sizeof(t->uid), "pod-1");
    snprintf(t->container, sizeof(t->container), "main");
    t->ngpus = ngpus;
    for (int i = 0; i < ngpus; i++) {
        t->gpus[i].index = first + i;
        snprintf(t->gpus[i].uuid, sizeof(t->gpus[i].uuid), "%s", UUIDS[first + i]);
        t->gpus[i].milli = milli;
        t->gpus[i].memory_mib = memory_mib;
    }
    t->pod_units = ngpus * memory_mib / 1024;
}

static const char *env_of(const contract_response *r, const char *key)
{
    for (int i = 0; i < r->nenv; i++)
        if (strcmp(r->env[i].key, key) == 0)
            return r->env[i].value;
    return NULL;
}

static const contract_mount *mount_at(const contract_response *r, const char *container_path)
{
    for (int i = 0; i < r->nmounts; i++)
        if (strcmp(r->mounts[i].container_path, container_path) == 0)
            return &r->mounts[i];
    return NULL;
}

static bool is_sched(const contract_mount *m)
{
    return strncmp(m->container_path, CONTRACT_SCHED_PATH "/", strlen(CONTRACT_SCHED_PATH "/")) ==
           0;
}

static int count_sched_mounts(const contract_response *r)
{
    int n = 0;
    for (int i = 0; i < r->nmounts; i++)
        n += is_sched(&r->mounts[i]);
    return n;
}

/* The limits text through the library's parser; fails the test if the library would refuse it. */
static void parse_limits(const contract_target *t, kgpu_shim_limits *lim)
{
    char *text = contract_limits_text(t);
    assert_non_null(text);
    kgpu_error err = {0};
    int rc = kgpu_shim_limits_parse(text, strlen(text), CONTRACT_LIMITS_PATH, lim, &err);
    if (rc != KGPU_OK)
        fail_msg("the library refuses the contract's limits file: %s\n%s", err.msg, text);
    free(text);
}

/* ---- the limits file ---- */

/*
 * Whatever the share, the library reads back one device per GPU, in the
 * order of NVIDIA_VISIBLE_DEVICES, with the container's memory and its
 * compute share in percent (100 when compute is not limited).
 */
static void test_limits_round_trip(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        int ngpus, milli;
        int64_t memory_mib;
        int core_pct;
    } cases[] = {
        {"whole GPU, as the extender assigns it", 1, 1000, GPU_MIB, 100},
        {"whole GPU, as a DRA device without capacity", 1, 0, GPU_MIB, 100},
        {"memory-only share", 1, 0, 4096, 100},
        {"compute share", 1, 250, 3072, 25},
        {"1 % of a GPU", 1, 10, 1024, 1},
        {"99 % of a GPU", 1, 990, 1024, 99},
        {"three GPUs, 30 % each", 3, 300, 8192, 30},
        {"three whole GPUs", 3, 1000, GPU_MIB, 100},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        contract_target t;
        target(&t, cases[c].ngpus, 0, cases[c].milli, cases[c].memory_mib);
        kgpu_shim_limits lim;
        parse_limits(&t, &lim);
        if (lim.ndevices != cases[c].ngpus)
            fail_msg("%s: %d devices read back", cases[c].what, lim.ndevices);
        for (int i = 0; i < lim.ndevices; i++) {
            assert_string_equal(lim.dev[i].uuid, UUIDS[i]);
            assert_int_equal(lim.dev[i].memory_mib, (uint64_t)cases[c].memory_mib);
            if (lim.dev[i].core_pct != cases[c].core_pct)
                fail_msg("%s: core_pct %d, wanted %d", cases[c].what, lim.dev[i].core_pct,
                         cases[c].core_pct);
        }
    }

    /* A sliver of compute is still a limit: never 0 % (no compute), never 100 % (unlimited). */
    contract_target t;
    target(&t, 1, 0, 1, 1024);
    kgpu_shim_limits lim;
    parse_limits(&t, &lim);
    assert_in_range(lim.dev[0].core_pct, 1, 99);

    /* Every GPU a node can have that the library reads: 16, all distinct, all in order. */
    memset(&t, 0, sizeof(t));
    snprintf(t.uid, sizeof(t.uid), "pod-1");
    snprintf(t.container, sizeof(t.container), "main");
    t.ngpus = KGPU_SHIM_MAX_DEVICES;
    for (int i = 0; i < t.ngpus; i++) {
        t.gpus[i].index = i;
        snprintf(t.gpus[i].uuid, sizeof(t.gpus[i].uuid), "GPU-%08x-0000-4000-8000-000000000000",
                 i);
        t.gpus[i].milli = 500;
        t.gpus[i].memory_mib = 81920;
    }
    parse_limits(&t, &lim);
    assert_int_equal(lim.ndevices, KGPU_SHIM_MAX_DEVICES);
    for (int i = 0; i < t.ngpus; i++) {
        assert_int_equal(kgpu_shim_limits_find(&lim, t.gpus[i].uuid), i);
        assert_int_equal(lim.dev[i].memory_mib, 81920);
        assert_int_equal(lim.dev[i].core_pct, 50);
    }
    /* A UUID as long as discovery keeps one (never cut) still fits a line the library reads. */
    target(&t, 1, 0, 0, 1024);
    memset(t.gpus[0].uuid, 'f', sizeof(t.gpus[0].uuid) - 1);
    t.gpus[0].uuid[sizeof(t.gpus[0].uuid) - 1] = '\0';
    parse_limits(&t, &lim);
    assert_string_equal(lim.dev[0].uuid, t.gpus[0].uuid);
}

/* ---- env and mounts ---- */

/* The env both agents promise, checked against the limits file the library enforces. */
static void assert_env_matches_limits(const contract_response *r, const contract_target *t,
                                      const contract_inventory *inv)
{
    kgpu_shim_limits lim;
    parse_limits(t, &lim);
    /* NVIDIA_VISIBLE_DEVICES: the UUIDs, comma-separated, in the file's device order. */
    char want[KGPU_MAX_GPUS_PER_NODE * KGPU_GPU_UUID_MAX] = "";
    for (int i = 0; i < lim.ndevices; i++) {
        if (i > 0)
            strcat(want, ",");
        strcat(want, lim.dev[i].uuid);
    }
    assert_string_equal(env_of(r, "NVIDIA_VISIBLE_DEVICES"), want);
    /* The env repeats the file's limits (the same on every GPU of the container). */
    char v[64];
    snprintf(v, sizeof(v), "%llu", (unsigned long long)lim.dev[0].memory_mib);
    assert_string_equal(env_of(r, "KGPU_MEMORY_LIMIT_MIB"), v);
    snprintf(v, sizeof(v), "%d", lim.dev[0].core_pct);
    assert_string_equal(env_of(r, "KGPU_CORE_LIMIT_PCT"), v);
    assert_string_equal(env_of(r, "KGPU_SHARED_DIR"), CONTRACT_SHARED_PATH);
    assert_string_equal(env_of(r, "KGPU_CONTAINER"), t->container);
    /* gpushare's, in memory units: the container's total, its first GPU's size and index. */
    uint64_t total = 0;
    for (int i = 0; i < lim.ndevices; i++)
        total += lim.dev[i].memory_mib;
    snprintf(v, sizeof(v), "%llu", (unsigned long long)(total / (uint64_t)inv->unit_mib));
    assert_string_equal(env_of(r, "ALIYUN_COM_GPU_MEM_CONTAINER"), v);
    int g = 0;
    while (g < inv->ngpus && strcmp(inv->gpus[g].uuid, lim.dev[0].uuid) != 0)
        g++;
    assert_true(g < inv->ngpus);
    snprintf(v, sizeof(v), "%lld", (long long)(inv->gpus[g].memory_mib / inv->unit_mib));
    assert_string_equal(env_of(r, "ALIYUN_COM_GPU_MEM_DEV"), v);
    snprintf(v, sizeof(v), "%d", inv->gpus[g].index);
    assert_string_equal(env_of(r, "ALIYUN_COM_GPU_MEM_IDX"), v);
    snprintf(v, sizeof(v), "%lld", (long long)t->pod_units);
    assert_string_equal(env_of(r, "ALIYUN_COM_GPU_MEM_POD"), v);
}

/* The mounts every container with a GPU gets, whatever its share: the table's first rows. */
static void assert_base_mounts(const contract_response *r, const char *state, const char *shim)
{
    char host[1024];
    const contract_mount *m = mount_at(r, CONTRACT_LIMITS_PATH);
    assert_non_null(m);
    snprintf(host, sizeof(host), "%s/pods/pod-1/main.limits", state);
    assert_string_equal(m->host_path, host);
    assert_true(m->read_only); /* the container cannot raise its own limit */
    m = mount_at(r, CONTRACT_SHARED_PATH);
    assert_non_null(m);
    snprintf(host, sizeof(host), "%s/pods/pod-1/shared", state);
    assert_string_equal(m->host_path, host);
    assert_false(m->read_only); /* every process of the pod writes its accounting there */
    m = mount_at(r, CONTRACT_SHIM_PATH);
    const contract_mount *pre = mount_at(r, CONTRACT_PRELOAD_PATH);
    if (shim == NULL) {
        assert_null(m);
        assert_null(pre);
        return;
    }
    assert_non_null(m);
    assert_string_equal(m->host_path, shim);
    assert_true(m->read_only);
    assert_non_null(pre);
    snprintf(host, sizeof(host), "%s/ld.so.preload", state);
    assert_string_equal(pre->host_path, host);
    assert_true(pre->read_only);
}

/* No container path twice: a runtime would mount one over the other. */
static void assert_distinct_mounts(const contract_response *r)
{
    for (int i = 0; i < r->nmounts; i++)
        for (int k = i + 1; k < r->nmounts; k++)
            assert_string_not_equal(r->mounts[i].container_path, r->mounts[k].container_path);
}

static void test_response_whole_and_shares(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    contract_paths paths = {STATE, SHIM, NULL};
    contract_response whole, mem, core;
    contract_target tw, tm, tc;
    target(&tw, 1, 1, 1000, GPU_MIB);
    target(&tm, 1, 1, 0, 8192);
    target(&tc, 1, 1, 300, 8192);
    contract_response_build(&tw, &inv, &paths, &whole);
    contract_response_build(&tm, &inv, &paths, &mem);
    contract_response_build(&tc, &inv, &paths, &core);
    const contract_response *all[] = {&whole, &mem, &core};
    const contract_target *ts[] = {&tw, &tm, &tc};
    for (int i = 0; i < 3; i++) {
        assert_env_matches_limits(all[i], ts[i], &inv);
        assert_base_mounts(all[i], STATE, SHIM);
        assert_distinct_mounts(all[i]);
        assert_null(env_of(all[i], "CUDA_MPS_PIPE_DIRECTORY")); /* schedule-file mode */
        assert_null(mount_at(all[i], CONTRACT_MPS_PIPE_PATH));
    }
    /* What sets them apart: the compute limit, and the compute share's schedule. */
    assert_string_equal(env_of(&whole, "KGPU_CORE_LIMIT_PCT"), "100");
    assert_string_equal(env_of(&mem, "KGPU_CORE_LIMIT_PCT"), "100");
    assert_string_equal(env_of(&core, "KGPU_CORE_LIMIT_PCT"), "30");
    assert_string_equal(env_of(&whole, "KGPU_MEMORY_LIMIT_MIB"), "40960");
    assert_string_equal(env_of(&mem, "KGPU_MEMORY_LIMIT_MIB"), "8192");
    assert_int_equal(count_sched_mounts(&whole), 0);
    assert_int_equal(count_sched_mounts(&mem), 0);
    assert_int_equal(count_sched_mounts(&core), 1);
    assert_int_equal(whole.nmounts, mem.nmounts);
    assert_int_equal(core.nmounts, mem.nmounts + 1);
    const contract_mount *s = mount_at(&core, CONTRACT_SCHED_PATH "/" U1 ".sched");
    assert_non_null(s);
    assert_string_equal(s->host_path, STATE "/sched/" U1 ".sched");
    assert_false(s->read_only); /* taking turns writes to it */

    /* Without the library (--shim-lib none): env and the limits file, no library, no preload. */
    paths.shim_lib = NULL;
    contract_response bare;
    contract_response_build(&tc, &inv, &paths, &bare);
    assert_env_matches_limits(&bare, &tc, &inv);
    assert_base_mounts(&bare, STATE, NULL);
    assert_int_equal(bare.nmounts, core.nmounts - 2);

    /* A target without a GPU gets nothing at all: no env that names a GPU, no mount. */
    contract_target none;
    target(&none, 0, 0, 0, 0);
    memset(&bare, 0xa5, sizeof(bare));
    contract_response_build(&none, &inv, &paths, &bare);
    assert_int_equal(bare.nenv, 0);
    assert_int_equal(bare.nmounts, 0);
}

/* Several GPUs: all visible, each one's schedule mounted on its own, none of another GPU. */
static void test_response_several_gpus(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    contract_paths paths = {STATE, SHIM, NULL};
    contract_target t;
    target(&t, 2, 1, 250, 4096); /* GPUs 1 and 2, not 0 */
    t.pod_units = 12;            /* another container of the pod holds 4 more units */
    contract_response r;
    contract_response_build(&t, &inv, &paths, &r);
    assert_env_matches_limits(&r, &t, &inv);
    assert_string_equal(env_of(&r, "NVIDIA_VISIBLE_DEVICES"), U1 "," U2);
    assert_string_equal(env_of(&r, "ALIYUN_COM_GPU_MEM_IDX"), "1");
    assert_string_equal(env_of(&r, "ALIYUN_COM_GPU_MEM_POD"), "12");
    assert_int_equal(count_sched_mounts(&r), 2);
    assert_non_null(mount_at(&r, CONTRACT_SCHED_PATH "/" U1 ".sched"));
    assert_non_null(mount_at(&r, CONTRACT_SCHED_PATH "/" U2 ".sched"));
    assert_null(mount_at(&r, CONTRACT_SCHED_PATH "/" U0 ".sched"));
    assert_null(mount_at(&r, CONTRACT_SCHED_PATH)); /* the file, never the directory */
    assert_distinct_mounts(&r);

    /* The largest node the contract takes: every GPU visible, every schedule mounted. */
    memset(&t, 0, sizeof(t));
    snprintf(t.uid, sizeof(t.uid), "pod-1");
    snprintf(t.container, sizeof(t.container), "main");
    t.ngpus = KGPU_MAX_GPUS_PER_NODE;
    char want[KGPU_MAX_GPUS_PER_NODE * KGPU_GPU_UUID_MAX] = "";
    for (int i = 0; i < t.ngpus; i++) {
        t.gpus[i].index = i;
        snprintf(t.gpus[i].uuid, sizeof(t.gpus[i].uuid), "GPU-%08x-0000-4000-8000-000000000000",
                 i);
        t.gpus[i].milli = 500;
        t.gpus[i].memory_mib = 1024;
        if (i > 0)
            strcat(want, ",");
        strcat(want, t.gpus[i].uuid);
    }
    contract_response_build(&t, &inv, &paths, &r);
    assert_string_equal(env_of(&r, "NVIDIA_VISIBLE_DEVICES"), want);
    assert_int_equal(count_sched_mounts(&r), KGPU_MAX_GPUS_PER_NODE);
    assert_int_equal(r.nmounts, 4 + KGPU_MAX_GPUS_PER_NODE);
    /* The same with UUIDs as long as discovery keeps them: still every one, whole. */
    want[0] = '\0';
    for (int i = 0; i < t.ngpus; i++) {
        char *u = t.gpus[i].uuid;
        memset(u, 'f', sizeof(t.gpus[i].uuid) - 1);
        u[sizeof(t.gpus[i].uuid) - 1] = '\0';
        char head[16];
        snprintf(head, sizeof(head), "GPU-%08x", i);
        memcpy(u, head, strlen(head));
        if (i > 0)
            strcat(want, ",");
        strcat(want, u);
    }
    contract_response_build(&t, &inv, &paths, &r);
    assert_string_equal(env_of(&r, "NVIDIA_VISIBLE_DEVICES"), want);
}

/* MPS mode: the same env and mounts, but the daemon's pipes and MPS's variables for schedules. */
static void test_response_mps_vs_sched(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    contract_paths sched = {STATE, SHIM, NULL};
    contract_paths mps = {STATE, SHIM, "/run/nvidia-mps"};
    contract_target t;
    target(&t, 2, 0, 300, 8192);
    contract_response rs, rm;
    contract_response_build(&t, &inv, &sched, &rs);
    contract_response_build(&t, &inv, &mps, &rm);
    assert_env_matches_limits(&rm, &t, &inv);
    assert_base_mounts(&rm, STATE, SHIM);
    assert_distinct_mounts(&rm);
    /* Every variable of the schedule mode, with the same value; MPS's three on top. */
    for (int i = 0; i < rs.nenv; i++) {
        const char *v = env_of(&rm, rs.env[i].key);
        assert_non_null(v);
        assert_string_equal(v, rs.env[i].value);
    }
    assert_int_equal(rm.nenv, rs.nenv + 3);
    assert_string_equal(env_of(&rm, "CUDA_MPS_PIPE_DIRECTORY"), CONTRACT_MPS_PIPE_PATH);
    assert_string_equal(env_of(&rm, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                        env_of(&rm, "KGPU_CORE_LIMIT_PCT"));
    /* Per device as NVIDIA_VISIBLE_DEVICES numbers them, in M(iB). */
    assert_string_equal(env_of(&rm, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=8192M,1=8192M");
    const contract_mount *pipe = mount_at(&rm, CONTRACT_MPS_PIPE_PATH);
    assert_non_null(pipe);
    assert_string_equal(pipe->host_path, "/run/nvidia-mps");
    assert_false(pipe->read_only); /* clients write to the daemon's pipes */
    /* No schedule in MPS mode: the pipe directory takes the place of both. */
    assert_int_equal(count_sched_mounts(&rs), 2);
    assert_int_equal(count_sched_mounts(&rm), 0);
    assert_int_equal(rm.nmounts, rs.nmounts - 2 + 1);
    for (int i = 0; i < rs.nmounts; i++) {
        if (is_sched(&rs.mounts[i]))
            continue;
        const contract_mount *m = mount_at(&rm, rs.mounts[i].container_path);
        assert_non_null(m);
        assert_string_equal(m->host_path, rs.mounts[i].host_path);
        assert_int_equal(m->read_only, rs.mounts[i].read_only);
    }
    /* A memory-only share in MPS mode: all the SMs, its memory still pinned. */
    target(&t, 1, 2, 0, 2048);
    contract_response_build(&t, &inv, &mps, &rm);
    assert_string_equal(env_of(&rm, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "100");
    assert_string_equal(env_of(&rm, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=2048M");
}

/* ---- who takes turns ---- */

static void test_sched_shared_edges(void **state)
{
    (void)state;
    contract_paths sched = {STATE, SHIM, NULL};
    contract_paths mps = {STATE, SHIM, "/run/nvidia-mps"};
    /* Only a compute share below the whole GPU takes turns (docs: core_pct below 100). */
    static const struct {
        int milli;
        bool shared;
    } cases[] = {{0, false}, {1, true}, {10, true}, {500, true}, {990, true}, {1000, false}};
    contract_target t;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        target(&t, 1, 0, cases[c].milli, 1024);
        if (contract_sched_shared(&t, 0) != cases[c].shared)
            fail_msg("milli %d: shared should be %d", cases[c].milli, cases[c].shared);
        assert_int_equal(contract_takes_turns(&t, &sched, 0), cases[c].shared);
        assert_false(contract_takes_turns(&t, &mps, 0));
        /* And it agrees with what the library reads: turns exactly when core_pct < 100. */
        kgpu_shim_limits lim;
        parse_limits(&t, &lim);
        assert_int_equal(lim.dev[0].core_pct < 100, cases[c].shared);
    }
    /* Per GPU, not per container: a mixed target takes turns on its shared GPU only. */
    target(&t, 3, 0, 0, 1024);
    t.gpus[1].milli = 400;
    t.gpus[2].milli = 1000;
    assert_false(contract_sched_shared(&t, 0));
    assert_true(contract_sched_shared(&t, 1));
    assert_false(contract_sched_shared(&t, 2));
    contract_inventory inv;
    inventory(&inv);
    contract_response r;
    contract_response_build(&t, &inv, &sched, &r);
    assert_int_equal(count_sched_mounts(&r), 1);
    assert_non_null(mount_at(&r, CONTRACT_SCHED_PATH "/" U1 ".sched"));
    for (int i = 0; i < 3; i++)
        assert_false(contract_takes_turns(&t, &mps, i));
}

/* ---- the host files ---- */

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static mode_t mode_of(const char *dir, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    struct stat st;
    if (lstat(path, &st) != 0)
        fail_msg("%s is missing", path);
    return st.st_mode;
}

static bool exists(const char *dir, const char *rel)
{
    char path[1024];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    return lstat(path, &st) == 0;
}

static char *slurp(const char *dir, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *buf = calloc(1, 65536);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/*
 * The files behind the mounts, with the modes response.c's layout promises,
 * under the umask the agent happens to run with: a mode that depended on it
 * would lock containers of another user out (the library then refuses CUDA).
 */
static void check_files(mode_t umask_value)
{
    mode_t old = umask(umask_value);
    char dir[] = "/tmp/kgpu-test-contract-XXXXXX";
    assert_non_null(mkdtemp(dir));
    contract_paths paths = {dir, SHIM, NULL};
    contract_target t;
    target(&t, 2, 0, 0, 4096);
    t.gpus[0].milli = 250; /* GPU 0 a compute share, GPU 1 memory only */
    kgpu_error err = {0};
    assert_int_equal(contract_write_files(&t, &paths, &err), 0);

    assert_true(S_ISDIR(mode_of(dir, "pods/pod-1/shared")));
    assert_int_equal(mode_of(dir, "pods/pod-1/shared") & 07777, 01777);
    mode_t m = mode_of(dir, "pods/pod-1/main.limits");
    assert_true(S_ISREG(m));
    if ((m & 07777) != 0444)
        fail_msg("umask %03o: the limits file is mode %04o, not 0444", (unsigned)umask_value,
                 (unsigned)(m & 07777));
    /* What is on disk is what the library reads back. */
    char *text = slurp(dir, "pods/pod-1/main.limits");
    kgpu_shim_limits lim;
    assert_int_equal(kgpu_shim_limits_parse(text, strlen(text), "main.limits", &lim, &err), 0);
    free(text);
    assert_int_equal(lim.ndevices, 2);
    assert_string_equal(lim.dev[0].uuid, U0);
    assert_int_equal(lim.dev[0].core_pct, 25);
    assert_int_equal(lim.dev[1].memory_mib, 4096);
    assert_false(exists(dir, "pods/pod-1/main.limits.tmp"));
    /* The compute share's GPU has its schedule; the memory-only GPU none. */
    assert_int_equal(mode_of(dir, "sched") & 07777, 0700);
    m = mode_of(dir, "sched/" U0 ".sched");
    assert_true(S_ISREG(m));
    assert_int_equal(m & 07777, 0666);
    char path[1024];
    struct stat st;
    snprintf(path, sizeof(path), "%s/sched/" U0 ".sched", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((size_t)st.st_size, sizeof(kgpu_sched_file));
    assert_false(exists(dir, "sched/" U1 ".sched"));
    /* Every mount's host path of the response exists (a missing one becomes an empty directory). */
    assert_int_equal(contract_write_preload(&paths, &err), 0);
    contract_inventory inv;
    inventory(&inv);
    contract_response r;
    contract_response_build(&t, &inv, &paths, &r);
    for (int i = 0; i < r.nmounts; i++)
        if (strcmp(r.mounts[i].host_path, SHIM) != 0 && stat(r.mounts[i].host_path, &st) != 0)
            fail_msg("%s (for %s) was not written", r.mounts[i].host_path,
                     r.mounts[i].container_path);

    /* Idempotent, and a second call writes the new limits over the old. */
    t.gpus[1].memory_mib = 2048;
    assert_int_equal(contract_write_files(&t, &paths, &err), 0);
    text = slurp(dir, "pods/pod-1/main.limits");
    assert_int_equal(kgpu_shim_limits_parse(text, strlen(text), "main.limits", &lim, &err), 0);
    free(text);
    assert_int_equal(lim.dev[1].memory_mib, 2048);
    assert_int_equal(mode_of(dir, "pods/pod-1/main.limits") & 07777, 0444);
    rm_rf(dir);
    umask(old);
}

static void test_write_files(void **state)
{
    (void)state;
    check_files(022);
    check_files(077);
}

/* MPS mode: limits and accounting, and no schedule made at all. */
static void test_write_files_mps(void **state)
{
    (void)state;
    char dir[] = "/tmp/kgpu-test-contract-XXXXXX";
    assert_non_null(mkdtemp(dir));
    contract_paths paths = {dir, NULL, "/run/nvidia-mps"};
    contract_target t;
    target(&t, 2, 0, 300, 4096);
    kgpu_error err = {0};
    assert_int_equal(contract_write_files(&t, &paths, &err), 0);
    assert_true(exists(dir, "pods/pod-1/main.limits"));
    assert_true(exists(dir, "pods/pod-1/shared"));
    assert_false(exists(dir, "sched"));
    rm_rf(dir);
}

/* Names that come from outside (pod UID, container, claim UID, request) never leave the state dir. */
static void test_write_files_refuses(void **state)
{
    (void)state;
    char dir[] = "/tmp/kgpu-test-contract-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char state_dir[600];
    snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
    assert_int_equal(mkdir(state_dir, 0755), 0);
    contract_paths paths = {state_dir, NULL, NULL};
    kgpu_error err = {0};
    contract_target t;
    static const char *const hostile[] = {"../x", "..", ".", "", "a/b", "/etc", "x\ny", "a b"};
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        target(&t, 1, 0, 250, 1024);
        snprintf(t.uid, sizeof(t.uid), "%s", hostile[i]);
        memset(&err, 0, sizeof(err));
        assert_int_equal(contract_write_files(&t, &paths, &err), KGPU_EINVAL);
        assert_non_null(strstr(err.msg, "default/trainer")); /* names the pod */
        target(&t, 1, 0, 250, 1024);
        snprintf(t.container, sizeof(t.container), "%s", hostile[i]);
        assert_int_equal(contract_write_files(&t, &paths, &err), KGPU_EINVAL);
        assert_non_null(strstr(err.msg, "cannot name a directory"));
    }
    /* A GPU whose UUID would name a file outside sched/ is refused before any schedule. */
    target(&t, 1, 0, 250, 1024);
    snprintf(t.gpus[0].uuid, sizeof(t.gpus[0].uuid), "../../x");
    assert_int_equal(contract_write_files(&t, &paths, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "../../x"));
    /* Nothing landed beside the state directory, nor a schedule inside it. */
    assert_false(exists(dir, "x"));
    assert_false(exists(dir, "etc"));
    assert_false(exists(state_dir, "sched/x"));
    assert_false(exists(state_dir, "x.sched"));

    /* A state directory that cannot hold files: a clear error naming the path, no crash. */
    char file[800];
    snprintf(file, sizeof(file), "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    contract_paths bad = {file, SHIM, NULL};
    target(&t, 1, 0, 250, 1024);
    memset(&err, 0, sizeof(err));
    assert_int_equal(contract_write_files(&t, &bad, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, file));
    memset(&err, 0, sizeof(err));
    assert_int_equal(contract_write_preload(&bad, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, "ld.so.preload"));
    /* A limits file that cannot be replaced (a directory in its place): an error, no half file. */
    target(&t, 1, 0, 250, 1024);
    char limits[700];
    snprintf(limits, sizeof(limits), "%s/pods/pod-1/main.limits", state_dir);
    assert_int_equal(unlink(limits), 0); /* the refused UUID's call wrote it before the check */
    assert_int_equal(mkdir(limits, 0755), 0);
    snprintf(file, sizeof(file), "%s/keep", limits);
    f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    memset(&err, 0, sizeof(err));
    assert_int_equal(contract_write_files(&t, &paths, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, limits));
    assert_false(exists(state_dir, "pods/pod-1/main.limits.tmp"));
    contract_paths gone = {"/nonexistent/kgpu-state", SHIM, NULL};
    assert_int_equal(contract_write_files(&t, &gone, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/kgpu-state/pods"));
    rm_rf(dir);
}

static void test_write_preload(void **state)
{
    (void)state;
    mode_t old = umask(077);
    char dir[] = "/tmp/kgpu-test-contract-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kgpu_error err = {0};
    /* No library (--shim-lib none): no preload file, and no error. */
    contract_paths none = {dir, NULL, NULL};
    assert_int_equal(contract_write_preload(&none, &err), 0);
    assert_false(exists(dir, "ld.so.preload"));
    /* It names the library where the container sees it, not where the host keeps it. */
    contract_paths paths = {dir, SHIM, NULL};
    assert_int_equal(contract_write_preload(&paths, &err), 0);
    char *text = slurp(dir, "ld.so.preload");
    assert_string_equal(text, CONTRACT_SHIM_PATH "\n");
    free(text);
    /* ld.so reads it as the process's user, whoever that is; only root writes it. */
    mode_t m = mode_of(dir, "ld.so.preload");
    assert_true(S_ISREG(m));
    assert_int_equal(m & 0444, 0444);
    assert_int_equal(m & 0022, 0);
    assert_int_equal(contract_write_preload(&paths, &err), 0); /* rewritten in place */
    assert_false(exists(dir, "ld.so.preload.tmp"));
    rm_rf(dir);
    umask(old);
}

/* Briefly: test_dp covers these at length. */
static void test_mps_check_and_sharing(void **state)
{
    (void)state;
    contract_sharing s = CONTRACT_SHARING_MPS;
    assert_int_equal(contract_sharing_parse("sched", &s), 0);
    assert_int_equal(s, CONTRACT_SHARING_SCHED);
    assert_int_equal(contract_sharing_parse("mps", &s), 0);
    assert_int_equal(s, CONTRACT_SHARING_MPS);
    assert_int_equal(contract_sharing_parse("mps ", &s), -1);
    char dir[] = "/tmp/kgpu-test-contract-XXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    kgpu_error err = {0};
    assert_int_equal(contract_mps_check(dir, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "--sharing sched")); /* says what else to do */
    snprintf(path, sizeof(path), "%s/control", dir);
    assert_int_equal(mkdir(path, 0700), 0); /* a directory is not the pipe either */
    assert_int_equal(contract_mps_check(dir, &err), KGPU_ENOENT);
    assert_int_equal(rmdir(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(contract_mps_check(dir, &err), 0);
    rm_rf(dir);
}

/* ---- both agents, one contract ---- */

#define POD_UID "3f1c2a7e-0000-4000-8000-0000000000aa"

/* The device plugin's answer for container "main" of a pod (uid POD_UID) as kubelet gets it. */
static V1beta1__ContainerAllocateResponse *
dp_answer(const char *limits, const char *assignment, dp_res res, int64_t count,
          const contract_inventory *inv, const contract_paths *paths, V1beta1__AllocateResponse **msg)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "[{\"metadata\":{\"name\":\"trainer\",\"namespace\":\"team-a\",\"uid\":\"" POD_UID
             "\",\"annotations\":{\"kgpu.io/node\":\"" NODE "\"}},"
             "\"spec\":{\"nodeName\":\"" NODE "\",\"containers\":[{\"name\":\"main\","
             "\"resources\":{\"limits\":%s}}]},\"status\":{\"phase\":\"Pending\"}}]",
             limits);
    json_error_t je;
    json_t *items = json_loads(text, 0, &je);
    assert_non_null(items);
    json_object_set_new(json_object_get(json_object_get(json_array_get(items, 0), "metadata"),
                                        "annotations"),
                        "kgpu.io/assignment", json_string(assignment));
    dp_match m;
    kgpu_error err = {0};
    unsigned registered = 1u << DP_RES_MEM | 1u << DP_RES_CORE | 1u << DP_RES_WHOLE;
    if (dp_match_find(items, NODE, res, count, registered, inv->unit_mib, &m, &err) != 0)
        fail_msg("dp_match_find: %s", err.msg);
    json_decref(items);
    assert_true(m.primary);
    contract_response r;
    dp_response_of(&m, inv, paths, NULL, &r);
    uint8_t *buf;
    size_t len;
    assert_int_equal(dp_allocate_encode(&r, 1, &buf, &len), 0);
    *msg = v1beta1__allocate_response__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(*msg);
    assert_int_equal((*msg)->n_container_responses, 1);
    return (*msg)->container_responses[0];
}

/* The DRA driver's CDI device for request "main" of a claim (uid POD_UID). */
static json_t *dra_device(const char *results, const contract_inventory *inv,
                          const contract_paths *paths, json_t **spec)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"metadata\":{\"namespace\":\"team-a\",\"name\":\"gpus\",\"uid\":\"" POD_UID
             "\"},\"status\":{\"allocation\":{\"devices\":{\"results\":[%s]}}}}",
             results);
    dra_node_view node = {.pool = NODE, .gpus = inv->gpus, .ngpus = inv->ngpus};
    dra_claim c;
    kgpu_error err = {0};
    if (dra_claim_read_text(text, strlen(text), POD_UID, &node, &c, &err) != 0)
        fail_msg("dra_claim_read_text: %s", err.msg);
    *spec = dra_cdi_spec(&c, inv, paths);
    assert_non_null(*spec);
    json_t *devs = json_object_get(*spec, "devices");
    assert_int_equal(json_array_size(devs), 1);
    return json_object_get(json_array_get(devs, 0), "containerEdits");
}

/*
 * Env as a set of KEY=VALUE and mounts as container path -> (host path,
 * access), compared both ways: the runtime does not care about order, the
 * container does care about every entry.
 */
static void assert_same_contract(const char *what, const V1beta1__ContainerAllocateResponse *dp,
                                 json_t *cdi, const char *value_differs)
{
    json_t *env = json_object_get(cdi, "env"), *mounts = json_object_get(cdi, "mounts");
    if (json_array_size(env) != dp->n_envs)
        fail_msg("%s: the device plugin sets %zu variables, the CDI spec %zu", what, dp->n_envs,
                 json_array_size(env));
    for (size_t i = 0; i < dp->n_envs; i++) {
        char kv[sizeof(((contract_kv *)0)->value) + 64];
        snprintf(kv, sizeof(kv), "%s=%s", dp->envs[i]->key, dp->envs[i]->value);
        /* A variable known to differ: it must be there, its value is not compared. */
        if (value_differs != NULL && strcmp(dp->envs[i]->key, value_differs) == 0)
            snprintf(kv, sizeof(kv), "%s=", value_differs);
        bool found = false;
        for (size_t k = 0; k < json_array_size(env) && !found; k++)
            found = strncmp(json_string_value(json_array_get(env, k)), kv,
                            value_differs != NULL && strcmp(dp->envs[i]->key, value_differs) == 0
                                ? strlen(kv)
                                : strlen(kv) + 1) == 0;
        if (!found)
            fail_msg("%s: the device plugin sets %s, the CDI spec does not", what, kv);
    }
    if (json_array_size(mounts) != dp->n_mounts)
        fail_msg("%s: the device plugin mounts %zu paths, the CDI spec %zu", what, dp->n_mounts,
                 json_array_size(mounts));
    for (size_t i = 0; i < dp->n_mounts; i++) {
        const V1beta1__Mount *m = dp->mounts[i];
        json_t *c = NULL;
        for (size_t k = 0; k < json_array_size(mounts) && c == NULL; k++) {
            json_t *x = json_array_get(mounts, k);
            if (strcmp(json_string_value(json_object_get(x, "containerPath")),
                       m->container_path) == 0)
                c = x;
        }
        if (c == NULL)
            fail_msg("%s: the device plugin mounts %s, the CDI spec does not", what,
                     m->container_path);
        assert_string_equal(json_string_value(json_object_get(c, "hostPath")), m->host_path);
        assert_string_equal(json_string_value(json_object_get(c, "type")), "bind");
        json_t *opts = json_object_get(c, "options");
        bool ro = false, rw = false;
        for (size_t k = 0; k < json_array_size(opts); k++) {
            ro |= strcmp(json_string_value(json_array_get(opts, k)), "ro") == 0;
            rw |= strcmp(json_string_value(json_array_get(opts, k)), "rw") == 0;
        }
        if (ro == rw || ro != m->read_only)
            fail_msg("%s: %s is %s for the device plugin, not so in the CDI spec", what,
                     m->container_path, m->read_only ? "read-only" : "read-write");
    }
}

#define RESULT(dev, capacity)                                                                      \
    "{\"request\":\"main\",\"driver\":\"gpu.kgpu.io\",\"pool\":\"" NODE "\",\"device\":\"" dev    \
    "\"" capacity "}"

static void test_agents_give_the_same_contract(void **state)
{
    (void)state;
    contract_inventory inv;
    inventory(&inv);
    static const contract_paths modes[] = {{STATE, SHIM, NULL}, {STATE, NULL, NULL},
                                           {STATE, SHIM, "/run/nvidia-mps"}};
    for (size_t p = 0; p < sizeof(modes) / sizeof(modes[0]); p++) {
        /* 30 % and 8 GiB of GPU 1: gpu-core and gpu-mem, or a claim's consumable capacity. */
        V1beta1__AllocateResponse *msg;
        V1beta1__ContainerAllocateResponse *dp = dp_answer(
            "{\"kgpu.io/gpu-mem\":\"8\",\"kgpu.io/gpu-core\":\"30\"}",
            "[{\"container\":\"main\",\"gpus\":[{\"index\":1,\"uuid\":\"" U1
            "\",\"milli\":300,\"memory_mib\":8192}],\"exclusive\":false}]",
            DP_RES_MEM, 8, &inv, &modes[p], &msg);
        json_t *spec;
        json_t *cdi = dra_device(RESULT("gpu-1", ",\"shareID\":\"s-1\",\"consumedCapacity\":"
                                                 "{\"memory\":\"8Gi\",\"cores\":\"30\"}"),
                                 &inv, &modes[p], &spec);
        assert_same_contract("a compute share", dp, cdi, NULL);
        json_decref(spec);
        v1beta1__allocate_response__free_unpacked(msg, NULL);

        /* 4 GiB of GPU 2, compute not limited. */
        dp = dp_answer("{\"kgpu.io/gpu-mem\":\"4\"}",
                       "[{\"container\":\"main\",\"gpus\":[{\"index\":2,\"uuid\":\"" U2
                       "\",\"milli\":0,\"memory_mib\":4096}],\"exclusive\":false}]",
                       DP_RES_MEM, 4, &inv, &modes[p], &msg);
        cdi = dra_device(RESULT("gpu-2", ",\"shareID\":\"s-2\",\"consumedCapacity\":"
                                         "{\"memory\":\"4Gi\"}"),
                         &inv, &modes[p], &spec);
        assert_same_contract("a memory share", dp, cdi, NULL);
        json_decref(spec);
        v1beta1__allocate_response__free_unpacked(msg, NULL);

        /* Two whole GPUs: nvidia.com/gpu, or two devices without capacity. */
        dp = dp_answer("{\"nvidia.com/gpu\":\"2\"}",
                       "[{\"container\":\"main\",\"gpus\":["
                       "{\"index\":0,\"uuid\":\"" U0 "\",\"milli\":1000,\"memory_mib\":40960},"
                       "{\"index\":1,\"uuid\":\"" U1 "\",\"milli\":1000,\"memory_mib\":40960}],"
                       "\"exclusive\":true}]",
                       DP_RES_WHOLE, 2, &inv, &modes[p], &msg);
        cdi = dra_device(RESULT("gpu-0", "") "," RESULT("gpu-1", ""), &inv, &modes[p], &spec);
        /*
         * Known difference, left to the agents (not the contract): for whole
         * GPUs the device plugin's pod_units counts only gpu-mem units, so
         * ALIYUN_COM_GPU_MEM_POD is 0 below ALIYUN_COM_GPU_MEM_CONTAINER's 80;
         * the DRA driver's is the claim's memory, 80.
         */
        assert_same_contract("two whole GPUs", dp, cdi, "ALIYUN_COM_GPU_MEM_POD");
        json_decref(spec);
        v1beta1__allocate_response__free_unpacked(msg, NULL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_round_trip),
        cmocka_unit_test(test_response_whole_and_shares),
        cmocka_unit_test(test_response_several_gpus),
        cmocka_unit_test(test_response_mps_vs_sched),
        cmocka_unit_test(test_sched_shared_edges),
        cmocka_unit_test(test_write_files),
        cmocka_unit_test(test_write_files_mps),
        cmocka_unit_test(test_write_files_refuses),
        cmocka_unit_test(test_write_preload),
        cmocka_unit_test(test_mps_check_and_sharing),
        cmocka_unit_test(test_agents_give_the_same_contract),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
