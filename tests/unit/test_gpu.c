/*
 * The GPU backends: the real NVML loader run against fake libnvidia-ml.so.1
 * builds (the same dlopen/dlsym path as on a GPU node), and the fake
 * inventory file.
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

#include "gpu.h"

static char sysfs[256];

static const char *fake_lib(const char *variant)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s/libnvidia-ml.so.1", KGPU_FAKE_NVML_DIR, variant);
    return path;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    snprintf(sysfs, sizeof(sysfs), "/tmp/kgpu-test-gpu-XXXXXX");
    if (mkdtemp(sysfs) == NULL)
        return -1;
    char path[512];
    const char *parts[] = {"/bus", "/bus/pci", "/bus/pci/devices", "/bus/pci/devices/0000:3b:00.0"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s%s", sysfs, parts[i]);
        mkdir(path, 0700);
    }
    snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:3b:00.0/numa_node", sysfs);
    write_file(path, "1\n");
    setenv("FAKE_NVML_GPUS",
           "GPU-aaaa,NVIDIA A100-SXM4-40GB,40960,00000000:3B:00.0;"
           "GPU-bbbb,Tesla T4,15360,00000000:AF:00.0,7.5",
           1);
    unsetenv("FAKE_NVML_INIT");
    unsetenv("FAKE_NVML_XID");
    unsetenv("FAKE_NVML_LOST");
    return 0;
}

static int teardown(void **state)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", sysfs);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_discover(void **state)
{
    kgpu_nvml *nv;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(fake_lib("full"), sysfs, &nv, &err), KGPU_OK);
    assert_true(kgpu_nvml_has_events(nv));
    kgpu_gpu_info *g;
    int n;
    assert_int_equal(kgpu_nvml_discover(nv, &g, &n, &err), KGPU_OK);
    assert_int_equal(n, 2);
    assert_int_equal(g[0].index, 0);
    assert_string_equal(g[0].uuid, "GPU-aaaa");
    assert_string_equal(g[0].model, "NVIDIA A100-SXM4-40GB");
    assert_int_equal(g[0].memory_mib, 40960);
    assert_int_equal(g[0].numa,
                     1); /* 8-digit upper-case bus id found in 4-digit lower-case sysfs */
    assert_string_equal(g[0].pci_bus_id, "00000000:3B:00.0");
    assert_true(g[0].healthy);
    assert_int_equal(g[1].index, 1);
    assert_string_equal(g[1].model, "Tesla T4");
    assert_int_equal(g[1].memory_mib, 15360);
    assert_int_equal(g[1].numa, -1); /* no sysfs entry */
    /* nvmlDeviceGetCudaComputeCapability: the fake's default, then the one given. */
    assert_string_equal(g[0].compute_capability, "8.0");
    assert_string_equal(g[1].compute_capability, "7.5");
    free(g);
    kgpu_nvml_close(nv);
}

static void test_xid_and_loss(void **state)
{
    setenv("FAKE_NVML_XID", "1:79", 1);
    setenv("FAKE_NVML_LOST", "0", 1);
    kgpu_nvml *nv;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(fake_lib("full"), sysfs, &nv, &err), KGPU_OK);
    kgpu_gpu_info *g;
    int n;
    /* A lost GPU is left out, named, and its siblings still come back. */
    assert_int_equal(kgpu_nvml_discover(nv, &g, &n, &err), KGPU_OK);
    assert_int_equal(n, kgpu_nvml_device_count(nv) - 1);
    assert_true(n >= 1);
    assert_int_equal(g[0].index, 1);
    assert_non_null(strstr(kgpu_nvml_skipped(nv), "GPU 0: nvmlDeviceGetUUID: GPU is lost"));
    free(g);
    unsetenv("FAKE_NVML_LOST");
    assert_int_equal(kgpu_nvml_discover(nv, &g, &n, &err), KGPU_OK);
    assert_int_equal(n, kgpu_nvml_device_count(nv));
    assert_string_equal(kgpu_nvml_skipped(nv), "");
    free(g);
    int idx = -2;
    unsigned long long xid = 0;
    assert_int_equal(kgpu_nvml_wait_xid(nv, 10, &idx, &xid, &err), 1);
    assert_int_equal(idx, 1);
    assert_int_equal(xid, 79);
    assert_int_equal(kgpu_nvml_wait_xid(nv, 10, &idx, &xid, &err), 0);
    assert_true(kgpu_nvml_alive(nv, 0));
    setenv("FAKE_NVML_LOST", "0", 1);
    assert_false(kgpu_nvml_alive(nv, 0));
    assert_true(kgpu_nvml_alive(nv, 1));
    assert_false(kgpu_nvml_alive(nv, 2));
    kgpu_nvml_close(nv);
}

static void test_optional_events_missing(void **state)
{
    setenv("FAKE_NVML_XID", "0:48", 1);
    kgpu_nvml *nv;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(fake_lib("noevents"), sysfs, &nv, &err), KGPU_OK);
    assert_false(kgpu_nvml_has_events(nv));
    kgpu_gpu_info *g;
    int n;
    assert_int_equal(kgpu_nvml_discover(nv, &g, &n, &err), KGPU_OK);
    assert_int_equal(n, 2);
    free(g);
    int idx;
    unsigned long long xid;
    assert_int_equal(kgpu_nvml_wait_xid(nv, 10, &idx, &xid, &err), 0);
    kgpu_nvml_close(nv);
}

static void test_required_symbol_missing(void **state)
{
    kgpu_nvml *nv = (kgpu_nvml *)1;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(fake_lib("nomeminfo"), sysfs, &nv, &err), KGPU_ENOENT);
    assert_null(nv);
    assert_non_null(strstr(err.msg, "required function nvmlDeviceGetMemoryInfo"));
}

static void test_no_library_and_init_failure(void **state)
{
    kgpu_nvml *nv;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open("/nonexistent/libnvidia-ml.so.1", NULL, &nv, &err),
                     KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "cannot load NVML (/nonexistent/libnvidia-ml.so.1)"));
    setenv("FAKE_NVML_INIT", "9", 1);
    assert_int_equal(kgpu_nvml_open(fake_lib("full"), sysfs, &nv, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, "nvmlInit: Driver Not Loaded (9)"));
    unsetenv("FAKE_NVML_INIT");
}

static int load_text(const char *text, kgpu_gpu_info **g, int *n, kgpu_error *err)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/gpus.yaml", sysfs);
    write_file(path, text);
    return kgpu_fake_gpus_load(path, g, n, err);
}

static void test_fake_file(void **state)
{
    kgpu_gpu_info *g;
    int n;
    kgpu_error err = {0};
    assert_int_equal(
        load_text("gpus:\n"
                  "- {index: 0, uuid: GPU-1, model: V100, memory_mib: 16384, numa: 0,"
                  " compute_capability: \"7.0\"}\n"
                  "- {index: 1, uuid: GPU-2, model: V100, memory_mib: 16384,"
                  " healthy: false, compute_capability: \"7.0 beta\"}\n",
                  &g, &n, &err),
        KGPU_OK);
    assert_int_equal(n, 2);
    assert_string_equal(g[1].uuid, "GPU-2");
    assert_int_equal(g[0].numa, 0);
    assert_int_equal(g[1].numa, -1);
    assert_true(g[0].healthy);
    assert_false(g[1].healthy);
    assert_int_equal(g[1].memory_mib, 16384);
    assert_string_equal(g[0].compute_capability, "7.0");
    assert_string_equal(g[1].compute_capability, ""); /* not a version: unknown */
    free(g);

    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"nodes: []\n", "needs a top-level `gpus:` list"},
        {"gpus: [3]\n", "gpus[0]: not a mapping"},
        {"gpus: []\n", "0 GPUs listed; 1 to 32 wanted"},
        {"gpus: [{uuid: a, model: m, memory_mib: 1}]\n", "gpus[0].index"},
        {"gpus: [{index: 0, model: m, memory_mib: 1}]\n", "gpus[0].uuid"},
        {"gpus: [{index: 0, uuid: a, memory_mib: 1}]\n", "gpus[0].model"},
        {"gpus: [{index: 0, uuid: a, model: m, memory_mib: '16'}]\n", "gpus[0].memory_mib"},
        {"gpus: [{index: 0, uuid: a, model: m, memory_mib: 1, numa: x}]\n", "gpus[0].numa"},
        {"gpus: [{index: 0, uuid: a, model: m, memory_mib: 1, healthy: 1}]\n", "gpus[0].healthy"},
        {"gpus: [{index: 0, uuid: a, model: m, memory_mib: 1},"
         " {index: 0, uuid: b, model: m, memory_mib: 1}]\n",
         "gpus[1] repeats the index or uuid of gpus[0]"},
        {"gpus: [{index: 0\n", "gpus.yaml"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        g = (kgpu_gpu_info *)1;
        assert_int_not_equal(load_text(bad[i].text, &g, &n, &err), KGPU_OK);
        assert_null(g);
        if (strstr(err.msg, bad[i].msg) == NULL)
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, bad[i].msg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_discover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xid_and_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optional_events_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_required_symbol_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_library_and_init_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
