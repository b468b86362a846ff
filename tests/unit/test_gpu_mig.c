/*
 * MIG through NVML (src/gpu/nvml_mig.c) against the fake libnvidia-ml.so.1:
 * creating, listing and destroying instances, what NVML refuses, the state
 * that outlives a process, and kgpu's profile tables (src/core/mig.c)
 * against the fake's own, kept apart so that each checks the other.
 */
#include <dlfcn.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu.h"
#include "kgpu/mig.h"

static char dir[256], state_path[512], procs_path[512];

static const char *fake_lib(const char *variant)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s/libnvidia-ml.so.1", KGPU_FAKE_NVML_DIR, variant);
    return path;
}

/* GPU 0 A100-40GB, 1 H100-80GB, 2 T4 (no MIG), 3 H200-141GB, 4 A100-80GB. */
static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kgpu-test-gpu-mig-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(state_path, sizeof(state_path), "%s/mig-state", dir);
    snprintf(procs_path, sizeof(procs_path), "%s/procs", dir);
    setenv("FAKE_NVML_GPUS",
           "GPU-aaaa,NVIDIA A100-SXM4-40GB,40960,00000000:3B:00.0;"
           "GPU-bbbb,NVIDIA H100 80GB HBM3,81559,00000000:3C:00.0,9.0;"
           "GPU-cccc,Tesla T4,15360,00000000:AF:00.0,7.5;"
           "GPU-dddd,NVIDIA H200,143771,00000000:3D:00.0,9.0;"
           "GPU-eeee,NVIDIA A100-SXM4-80GB,81920,00000000:3E:00.0",
           1);
    setenv("FAKE_NVML_MIG", "0,1,2,3,4", 1);
    setenv("FAKE_NVML_MIG_STATE", state_path, 1);
    unsetenv("FAKE_NVML_MIG_CI_FAIL");
    unsetenv("FAKE_NVML_PROCS");
    unsetenv("FAKE_NVML_INIT");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static kgpu_nvml *open_fake(const char *variant, kgpu_gpu_info **gpus, int *n)
{
    kgpu_nvml *nv = NULL;
    kgpu_error err = {0};
    if (kgpu_nvml_open(fake_lib(variant), dir, &nv, &err) != KGPU_OK)
        fail_msg("open: %s", err.msg);
    kgpu_gpu_info *g = NULL;
    int k = 0;
    if (kgpu_nvml_discover(nv, &g, &k, &err) != KGPU_OK)
        fail_msg("discover: %s", err.msg);
    if (gpus != NULL) {
        *gpus = g;
        *n = k;
    } else {
        free(g);
    }
    return nv;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    static char buf[8192];
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f != NULL) {
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

static void test_mig_mode_in_discover(void **state)
{
    (void)state;
    setenv("FAKE_NVML_MIG", "0,3", 1);
    kgpu_gpu_info *g;
    int n;
    kgpu_nvml *nv = open_fake("full", &g, &n);
    assert_int_equal(n, 5);
    assert_int_equal(g[0].mig_mode, 1);
    assert_int_equal(g[1].mig_mode, 0);  /* MIG-capable, mode off */
    assert_int_equal(g[2].mig_mode, -1); /* a T4: NOT_SUPPORTED, though listed */
    assert_int_equal(g[3].mig_mode, 1);
    assert_int_equal(g[4].mig_mode, 0);
    free(g);
    kgpu_nvml_close(nv);

    /* A driver without MIG functions: -1 everywhere, everything else works. */
    nv = open_fake("nomig", &g, &n);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++)
        assert_int_equal(g[i].mig_mode, -1);
    assert_string_equal(g[0].uuid, "GPU-aaaa");
    kgpu_nvml_mig list[KGPU_NVML_MIG_MAX];
    int k = -1;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &k, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "nvmlDeviceGetMigMode"));
    assert_int_equal(k, 0);
    kgpu_nvml_mig created;
    assert_int_equal(kgpu_nvml_mig_create(nv, 0, 0, 6, &created, &err), KGPU_ENOENT);
    free(g);
    kgpu_nvml_close(nv);
}

static void test_mig_create_list_destroy(void **state)
{
    (void)state;
    kgpu_nvml *nv = open_fake("full", NULL, NULL);
    kgpu_error err = {0};
    kgpu_nvml_mig one, three, list[KGPU_NVML_MIG_MAX];
    int n = -1;
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 0);

    if (kgpu_nvml_mig_create(nv, 0, 0, 6, &one, &err) != KGPU_OK) /* 1g.5gb at slice 6 */
        fail_msg("create 1g: %s", err.msg);
    assert_int_equal(one.gpu, 0);
    assert_int_equal(one.nvml_profile, 0);
    assert_int_equal(one.start, 6);
    assert_int_equal(one.size, 1);
    assert_int_equal(one.memory_mib, 4864);
    assert_int_equal(one.ci_id, 0);
    assert_int_equal(strncmp(one.uuid, "MIG-", 4), 0);
    assert_int_equal(strlen(one.uuid), 40); /* MIG- and a 36-character UUID */
    if (kgpu_nvml_mig_create(nv, 0, 2, 0, &three, &err) != KGPU_OK) /* 3g.20gb at 0 */
        fail_msg("create 3g: %s", err.msg);
    assert_int_equal(three.size, 4);
    assert_int_equal(three.memory_mib, 19968);
    assert_true(three.gi_id != one.gi_id);
    assert_string_not_equal(three.uuid, one.uuid);

    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 2);
    assert_int_equal(list[0].start, 0); /* by start slice */
    assert_int_equal(list[0].gi_id, three.gi_id);
    assert_int_equal(list[0].nvml_profile, 2);
    assert_string_equal(list[0].uuid, three.uuid);
    assert_int_equal(list[1].gi_id, one.gi_id);
    assert_int_equal(list[1].ci_id, one.ci_id);
    assert_int_equal(list[1].size, 1);
    assert_string_equal(list[1].uuid, one.uuid);
    /* A list that does not hold them all says so. */
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, 1, &n, &err), KGPU_ERANGE);
    /* Other GPUs are untouched. */
    assert_int_equal(kgpu_nvml_mig_list(nv, 1, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 0);

    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, one.gi_id, &err), KGPU_OK);
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].gi_id, three.gi_id);
    /* Idempotent: a GI already gone is success, again and again. */
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, one.gi_id, &err), KGPU_OK);
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, 99, &err), KGPU_OK);
    /* The freed slice takes a new instance; the same placement comes back the same. */
    kgpu_nvml_mig again;
    assert_int_equal(kgpu_nvml_mig_create(nv, 0, 0, 6, &again, &err), KGPU_OK);
    assert_int_equal(again.gi_id, one.gi_id);
    assert_string_equal(again.uuid, one.uuid);
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, three.gi_id, &err), KGPU_OK);
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, again.gi_id, &err), KGPU_OK);
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 0);
    kgpu_nvml_close(nv);
}

static void test_mig_refusals(void **state)
{
    (void)state;
    kgpu_nvml *nv = open_fake("full", NULL, NULL);
    kgpu_error err = {0};
    kgpu_nvml_mig m;
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 2, 4, &m, &err), KGPU_OK); /* 3g at 4-7 */
    /* 2g.20gb at slices 4-5 overlaps: ENOFIT naming the GPU, the profile and the slices. */
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 1, 4, &m, &err), KGPU_ENOFIT);
    assert_non_null(strstr(err.msg, "GPU 1"));
    assert_non_null(strstr(err.msg, "profile 1"));
    assert_non_null(strstr(err.msg, "slices 4-5"));
    assert_non_null(strstr(err.msg, "Insufficient resources"));
    /* 7g needs every slice. */
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 4, 0, &m, &err), KGPU_ENOFIT);
    /* The profile's instance limit: one media-extension instance per GPU. */
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 7, 0, &m, &err), KGPU_OK);
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 7, 1, &m, &err), KGPU_ENOFIT);
    assert_non_null(strstr(err.msg, "profile 7"));
    /* A start the profile does not allow, and a profile the GPU does not have. */
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 2, 2, &m, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "cannot start at memory slice 2"));
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 5, 0, &m, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_nvml_mig_create(nv, 1, 99, 0, &m, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_nvml_mig_create(nv, 9, 0, 0, &m, &err), KGPU_EINVAL);

    /* MIG off, or a GPU without MIG: KGPU_ESTATE for every MIG call. */
    kgpu_nvml_mig list[KGPU_NVML_MIG_MAX];
    int n = -1;
    assert_int_equal(kgpu_nvml_mig_list(nv, 2, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "does not support MIG"));
    setenv("FAKE_NVML_MIG", "1", 1);
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "MIG mode is off"));
    assert_int_equal(kgpu_nvml_mig_create(nv, 0, 0, 0, &m, &err), KGPU_ESTATE);
    /* Destroying is idempotent: with MIG off no instance exists, so it is gone. */
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, 1, &err), KGPU_OK);
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 2, 1, &err), KGPU_ESTATE); /* a T4 */
    kgpu_nvml_mig_profile prof[KGPU_MIG_MAX_PROFILES * 2];
    assert_int_equal(kgpu_nvml_mig_profiles(nv, 0, prof, 16, &n, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "profiles readable only in MIG mode"));
    kgpu_nvml_close(nv);
}

static void test_mig_ci_failure_destroys_gi(void **state)
{
    (void)state;
    kgpu_nvml *nv = open_fake("full", NULL, NULL);
    kgpu_error err = {0};
    kgpu_nvml_mig m, list[KGPU_NVML_MIG_MAX];
    int n = -1;
    setenv("FAKE_NVML_MIG_CI_FAIL", "23", 1);
    assert_int_equal(kgpu_nvml_mig_create(nv, 3, 3, 0, &m, &err), KGPU_ENOFIT); /* 4g */
    assert_non_null(strstr(err.msg, "nvmlGpuInstanceCreateComputeInstance"));
    assert_non_null(strstr(err.msg, "destroyed again"));
    assert_non_null(strstr(err.msg, "GPU 3"));
    setenv("FAKE_NVML_MIG_CI_FAIL", "999", 1);
    assert_int_equal(kgpu_nvml_mig_create(nv, 3, 0, 0, &m, &err), KGPU_EIO);
    unsetenv("FAKE_NVML_MIG_CI_FAIL");
    /* No GPU instance was left behind: the list is empty and the slices are free. */
    assert_int_equal(kgpu_nvml_mig_list(nv, 3, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 0);
    assert_null(strstr(read_text(state_path), "gi "));
    assert_int_equal(kgpu_nvml_mig_create(nv, 3, 4, 0, &m, &err), KGPU_OK); /* 7g: all free */
    assert_int_equal(m.memory_mib, 144384);
    kgpu_nvml_close(nv);
}

static void test_mig_state_outlives_process(void **state)
{
    (void)state;
    kgpu_nvml *nv = open_fake("full", NULL, NULL);
    kgpu_error err = {0};
    kgpu_nvml_mig a, list[KGPU_NVML_MIG_MAX];
    int n = -1;
    assert_int_equal(kgpu_nvml_mig_create(nv, 4, 1, 2, &a, &err), KGPU_OK); /* 2g.20gb at 2 */
    kgpu_nvml_close(nv);
    assert_non_null(strstr(read_text(state_path), "gi GPU-eeee "));

    /* Another process (a restarted driver) sees it and adds one of its own. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kgpu_nvml *c = NULL;
        kgpu_error e = {0};
        kgpu_nvml_mig l[KGPU_NVML_MIG_MAX], b;
        int k = 0;
        kgpu_gpu_info *g = NULL;
        int ng = 0;
        int ok = kgpu_nvml_open(fake_lib("full"), dir, &c, &e) == KGPU_OK &&
                 kgpu_nvml_discover(c, &g, &ng, &e) == KGPU_OK &&
                 kgpu_nvml_mig_list(c, 4, l, KGPU_NVML_MIG_MAX, &k, &e) == KGPU_OK && k == 1 &&
                 strcmp(l[0].uuid, a.uuid) == 0 &&
                 kgpu_nvml_mig_create(c, 4, 0, 6, &b, &e) == KGPU_OK;
        free(g);
        kgpu_nvml_close(c);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    nv = open_fake("full", NULL, NULL);
    assert_int_equal(kgpu_nvml_mig_list(nv, 4, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 2);
    assert_string_equal(list[0].uuid, a.uuid);
    assert_int_equal(list[0].gi_id, a.gi_id);
    assert_int_equal(list[1].start, 6);
    /* A line of a GPU this process does not have survives its writes. */
    FILE *f = fopen(state_path, "a");
    assert_non_null(f);
    fputs("gi GPU-elsewhere 0 4 0\n", f);
    fclose(f);
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 4, list[1].gi_id, &err), KGPU_OK);
    assert_non_null(strstr(read_text(state_path), "gi GPU-elsewhere 0 4 0"));
    assert_int_equal(kgpu_nvml_mig_list(nv, 4, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 1);

    /* Deleting the file is a reboot: the instances are gone. */
    assert_int_equal(unlink(state_path), 0);
    assert_int_equal(kgpu_nvml_mig_list(nv, 4, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 0);
    kgpu_nvml_close(nv);
}

static void test_mig_in_use(void **state)
{
    (void)state;
    kgpu_nvml *nv = open_fake("full", NULL, NULL);
    kgpu_error err = {0};
    kgpu_nvml_mig m;
    assert_int_equal(kgpu_nvml_mig_create(nv, 0, 0, 3, &m, &err), KGPU_OK);
    char line[128];
    snprintf(line, sizeof(line), "0:%u:%u 4242 100 30\n0 77 10 0\n", m.gi_id, m.ci_id);
    write_text(procs_path, line);
    setenv("FAKE_NVML_PROCS", procs_path, 1);
    /* The GPU's list shows the process inside the instance beside the others. */
    kgpu_gpu_proc procs[8];
    int n = 0;
    assert_int_equal(kgpu_nvml_processes(nv, 0, procs, 8, &n, NULL, &err), KGPU_OK);
    assert_int_equal(n, 2);
    assert_int_equal(procs[0].pid, 4242);
    assert_int_equal(procs[0].used_bytes, 100LL * 1024 * 1024);
    /* A process in it: NVML says IN_USE, and the instance stays. */
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, m.gi_id, &err), KGPU_ESTATE);
    assert_non_null(strstr(err.msg, "in use"));
    kgpu_nvml_mig list[KGPU_NVML_MIG_MAX];
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, list, KGPU_NVML_MIG_MAX, &n, &err), KGPU_OK);
    assert_int_equal(n, 1);
    write_text(procs_path, "0 77 10 0\n");
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, m.gi_id, &err), KGPU_OK);
    unsetenv("FAKE_NVML_PROCS");
    kgpu_nvml_close(nv);
}

/* The fake as NVML documents it, called directly: a GI with a CI refuses to go. */
static void test_fake_gi_destroy_in_use(void **state)
{
    (void)state;
    kgpu_nvml *nv = open_fake("full", NULL, NULL);
    kgpu_error err = {0};
    kgpu_nvml_mig m;
    assert_int_equal(kgpu_nvml_mig_create(nv, 0, 1, 0, &m, &err), KGPU_OK);
    void *lib = dlopen(fake_lib("full"), RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(
        lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*by_id)(void *, unsigned, void **) =
        (int (*)(void *, unsigned, void **))dlsym(lib, "nvmlDeviceGetGpuInstanceById");
    int (*destroy)(void *) = (int (*)(void *))dlsym(lib, "nvmlGpuInstanceDestroy");
    int (*set_mode)(void *, unsigned, int *) =
        (int (*)(void *, unsigned, int *))dlsym(lib, "nvmlDeviceSetMigMode");
    assert_null(set_mode); /* the mode cannot be changed through the fake */
    void *dev = NULL, *gi = NULL;
    assert_int_equal(by_index(0, &dev), 0);
    assert_int_equal(by_id(dev, m.gi_id, &gi), 0);
    assert_int_equal(destroy(gi), 19); /* IN_USE: its compute instance is still there */
    assert_int_equal(by_id(dev, 12, &gi), 6); /* NOT_FOUND */

    /* Its MIG device: the UUID kgpu reported, its IDs, and only its own processes. */
    int (*mig_by_index)(void *, unsigned, void **) =
        (int (*)(void *, unsigned, void **))dlsym(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
    int (*uuid)(void *, char *, unsigned) =
        (int (*)(void *, char *, unsigned))dlsym(lib, "nvmlDeviceGetUUID");
    int (*gi_id)(void *, unsigned *) =
        (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetGpuInstanceId");
    int (*procs)(void *, unsigned *, void *) = (int (*)(void *, unsigned *, void *))dlsym(
        lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    void *mig = NULL;
    char buf[96];
    unsigned id = 99;
    assert_int_equal(mig_by_index(dev, 0, &mig), 0);
    void *none = NULL;
    assert_int_equal(mig_by_index(dev, 1, &none), 6); /* one MIG device only */
    assert_int_equal(uuid(mig, buf, sizeof(buf)), 0);
    assert_string_equal(buf, m.uuid);
    assert_int_equal(gi_id(mig, &id), 0);
    assert_int_equal(id, m.gi_id);
    assert_int_equal(gi_id(dev, &id), 3); /* a whole GPU has no instance ID */
    char line[128];
    snprintf(line, sizeof(line), "0 77 10 0\n0:%u:%u 4242 100 30\n", m.gi_id, m.ci_id);
    write_text(procs_path, line);
    setenv("FAKE_NVML_PROCS", procs_path, 1);
    struct {
        unsigned pid;
        unsigned long long used;
        unsigned gi, ci;
    } info[4];
    unsigned count = 4;
    assert_int_equal(procs(mig, &count, info), 0);
    assert_int_equal(count, 1);
    assert_int_equal(info[0].pid, 4242);
    assert_int_equal(info[0].gi, m.gi_id);
    assert_int_equal(info[0].ci, m.ci_id);
    count = 4;
    assert_int_equal(procs(dev, &count, info), 0);
    assert_int_equal(count, 2);
    assert_int_equal(info[0].gi, UINT_MAX); /* outside MIG */
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, m.gi_id, &err), KGPU_ESTATE);
    unsetenv("FAKE_NVML_PROCS");
    dlclose(lib);
    assert_int_equal(kgpu_nvml_mig_destroy(nv, 0, m.gi_id, &err), KGPU_OK);
    kgpu_nvml_close(nv);
}

/* What the fake's NVML reports for every GI profile equals kgpu's table, model by model. */
static void test_mig_profiles_match_kgpu_tables(void **state)
{
    (void)state;
    kgpu_gpu_info *g;
    int ngpus;
    kgpu_nvml *nv = open_fake("full", &g, &ngpus);
    const int mig_gpus[] = {0, 1, 3, 4};
    bool seen[8] = {false};
    for (size_t gi = 0; gi < sizeof(mig_gpus) / sizeof(mig_gpus[0]); gi++) {
        int i = mig_gpus[gi];
        const kgpu_mig_model *model = kgpu_mig_model_find(g[i].model, g[i].memory_mib);
        assert_non_null(model);
        for (int k = 0; k < kgpu_mig_model_count(); k++)
            seen[k] |= kgpu_mig_model_at(k) == model;
        kgpu_nvml_mig_profile prof[16];
        int n = 0;
        kgpu_error err = {0};
        if (kgpu_nvml_mig_profiles(nv, i, prof, 16, &n, &err) != KGPU_OK)
            fail_msg("GPU %d: %s", i, err.msg);
        assert_int_equal(n, model->nprofiles);
        for (int p = 0; p < model->nprofiles; p++) {
            const kgpu_mig_profile *want = &model->profiles[p];
            const kgpu_nvml_mig_profile *got = NULL;
            for (int k = 0; k < n; k++)
                if (prof[k].nvml_profile == want->nvml_profile)
                    got = &prof[k];
            if (got == NULL)
                fail_msg("%s: NVML lacks %s", model->name, want->name);
            if (got->id != want->id || strcmp(got->name, want->name) != 0 ||
                got->slices != want->compute || got->instances != want->instances ||
                got->memory_mib != want->memory_mib ||
                got->multiprocessors != want->multiprocessors ||
                got->nplacements != want->nstarts)
                fail_msg("%s %s: NVML id %d name %s slices %d instances %d MiB %lld SMs %d "
                         "placements %d",
                         model->name, want->name, got->id, got->name, got->slices,
                         got->instances, (long long)got->memory_mib, got->multiprocessors,
                         got->nplacements);
            for (int s = 0; s < want->nstarts; s++) {
                assert_int_equal(got->starts[s], want->starts[s]);
                assert_int_equal(got->sizes[s], want->size);
            }
        }
    }
    for (int k = 0; k < kgpu_mig_model_count(); k++)
        assert_true(seen[k]); /* every model kgpu knows was compared */
    /* Without MIG there are no profiles: the T4. */
    kgpu_nvml_mig_profile prof[16];
    int n = 0;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_mig_profiles(nv, 2, prof, 16, &n, &err), KGPU_ESTATE);
    free(g);
    kgpu_nvml_close(nv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mig_mode_in_discover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_create_list_destroy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_ci_failure_destroys_gi, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_state_outlives_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_gi_destroy_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_profiles_match_kgpu_tables, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
