/*
 * The node's watcher (src/deviceplugin/watcher.h) against the fake NVML
 * (tests/fake/fake_nvml.c, processes scripted through FAKE_NVML_PROCS), a
 * fake /proc of cgroup files in a temporary folder, limits files as
 * Allocate writes them, real child processes for the kills, and a small
 * HTTP server in this file standing in for the API server's pod list and
 * Events.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <jansson.h>

#include "gpu.h"
#include "k8s.h"
#include "watcher.h"

#define UID_A "11111111-2222-3333-4444-555555555555"
#define UID_B "66666666-7777-8888-9999-000000000000"
#define UID_X "abcdefab-cdef-abcd-efab-cdefabcdefab" /* a pod kgpu did not allocate */
#define CID_1 "1111111111111111111111111111111111111111111111111111111111111111"
#define CID_2 "2222222222222222222222222222222222222222222222222222222222222222"
#define CID_3 "3333333333333333333333333333333333333333333333333333333333333333"
#define CID_4 "4444444444444444444444444444444444444444444444444444444444444444"
#define CID_5 "5555555555555555555555555555555555555555555555555555555555555555"
#define MIB   (1024LL * 1024)

static char root[256];

static const char *fake_lib(void)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/full/libnvidia-ml.so.1", KGPU_FAKE_NVML_DIR);
    return path;
}

static void write_file(const char *path, const char *text)
{
    char tmp[700];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, path), 0); /* the fake may read it meanwhile */
}

static void mkdirf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void mkdirf(const char *fmt, ...)
{
    char path[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof(path), fmt, ap);
    va_end(ap);
    assert_true(mkdir(path, 0700) == 0 || errno == EEXIST);
}

/* The cgroup file of `pid` in the fake /proc: the systemd driver's containerd scope. */
static void cgroup_of(unsigned pid, const char *uid, const char *cid)
{
    char path[600], text[600], u[40];
    snprintf(u, sizeof(u), "%s", uid);
    for (char *p = u; *p; p++)
        if (*p == '-')
            *p = '_';
    mkdirf("%s/proc/%u", root, pid);
    snprintf(path, sizeof(path), "%s/proc/%u/cgroup", root, pid);
    if (cid == NULL)
        snprintf(text, sizeof(text), "0::/system.slice/sshd.service\n");
    else
        snprintf(text, sizeof(text),
                 "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/"
                 "cri-containerd-%s.scope\n",
                 u, cid);
    write_file(path, text);
}

static void limits(const char *uid, const char *container, const char *lines)
{
    char path[600], text[1024];
    mkdirf("%s/state/pods/%s", root, uid);
    snprintf(path, sizeof(path), "%s/state/pods/%s/%s.limits", root, uid, container);
    snprintf(text, sizeof(text), "# kgpu limits v1\n%s", lines);
    write_file(path, text);
}

static void procs(const char *script)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/procs", root);
    write_file(path, script);
}

static int setup(void **state)
{
    snprintf(root, sizeof(root), "/tmp/kgpu-test-watcher-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    char path[600];
    snprintf(path, sizeof(path), "%s/proc", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/state", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/state/pods", root);
    mkdir(path, 0700);
    setenv("FAKE_NVML_GPUS",
           "GPU-aaaa,NVIDIA A100-SXM4-40GB,40960,00000000:3B:00.0;"
           "GPU-bbbb,Tesla T4,15360,00000000:AF:00.0",
           1);
    snprintf(path, sizeof(path), "%s/procs", root);
    setenv("FAKE_NVML_PROCS", path, 1);
    unsetenv("FAKE_NVML_NO_UTIL");
    unsetenv("FAKE_NVML_MIG");
    unsetenv("FAKE_NVML_MIG_STATE");
    procs("");
    return 0;
}

/*
 * The children a test starts: a failed assertion leaves its test early, so
 * teardown kills what is still here (a live probe would hold CTest's pipe
 * open until the test's timeout). Each child also dies with this process.
 */
static pid_t kids[16];

static void kid_started(pid_t pid)
{
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++)
        if (kids[i] == 0) {
            kids[i] = pid;
            return;
        }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("more than %zu children at once", sizeof(kids) / sizeof(kids[0]));
}

static void kid_gone(pid_t pid)
{
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++)
        if (kids[i] == pid)
            kids[i] = 0;
}

static int teardown(void **state)
{
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++)
        if (kids[i] > 0) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
            kids[i] = 0;
        }
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static dp_watch_config config(dp_enforce enforce)
{
    dp_watch_config c;
    dp_watch_config_defaults(&c);
    c.enforce = enforce;
    snprintf(c.proc_root, sizeof(c.proc_root), "%s/proc", root);
    return c;
}

static dp_watcher *watcher(const dp_watch_config *c, kgpu_k8s *k8s)
{
    char state[600];
    snprintf(state, sizeof(state), "%s/state", root);
    dp_watch_sources src = {.k8s = k8s, .node_name = "node-1", .state_dir = state,
                            .nvml_lib = fake_lib()};
    kgpu_error err = {0};
    dp_watcher *w = dp_watcher_new(c, &src, &err);
    assert_non_null(w);
    return w;
}

static char *scan_text(dp_watcher *w)
{
    kgpu_error err = {0};
    int rc = dp_watcher_scan(w, &err);
    if (rc != 0)
        fail_msg("scan: %s", err.msg);
    size_t len;
    char *t = dp_watcher_metrics(w, &len);
    assert_non_null(t);
    assert_int_equal(strlen(t), len);
    return t;
}

/* The value of the sample whose line starts with `prefix` (name and labels), or -1. */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, prefix, n) == 0 && l[n] == ' ')
            return strtod(l + n + 1, NULL);
    return -1;
}

#define LBL(ns, pod, cont, uid, cid, gpu, uuid)                                                    \
    "{namespace=\"" ns "\",pod=\"" pod "\",container=\"" cont "\",pod_uid=\"" uid                  \
    "\",container_id=\"" cid "\",gpu=\"" gpu "\",gpu_uuid=\"" uuid "\""

/* promtool's verdict on the text when Debian's prometheus package is installed; 77 if not. */
static int promtool(const char *text)
{
    if (access("/usr/bin/promtool", X_OK) != 0)
        return 77;
    char path[600], cmd[800];
    snprintf(path, sizeof(path), "%s/metrics.txt", root);
    write_file(path, text);
    snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < '%s' >/dev/null 2>&1", path);
    return WEXITSTATUS(system(cmd));
}

/*
 * The text format's grammar as Prometheus parses it, strictly: HELP and TYPE
 * before a family's samples, each family once and contiguous, metric and
 * label names [a-zA-Z_:][a-zA-Z0-9_:]*, values numbers, a final newline.
 */
static void assert_exposition(const char *text)
{
    assert_true(text[0] != '\0' && text[strlen(text) - 1] == '\n');
    char families[64][96];
    int nfam = 0;
    char current[96] = "";
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        assert_non_null(e);
        char line[4096];
        size_t n = (size_t)(e - l);
        assert_true(n < sizeof(line));
        memcpy(line, l, n);
        line[n] = '\0';
        l = e + 1;
        if (strncmp(line, "# HELP ", 7) == 0) {
            char name[96];
            assert_int_equal(sscanf(line + 7, "%95s", name), 1);
            for (int i = 0; i < nfam; i++)
                if (strcmp(families[i], name) == 0)
                    fail_msg("family %s twice", name);
            snprintf(families[nfam++], sizeof(families[0]), "%s", name);
            snprintf(current, sizeof(current), "%s", name);
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[96], type[32];
            assert_int_equal(sscanf(line + 7, "%95s %31s", name, type), 2);
            assert_string_equal(name, current);
            assert_true(strcmp(type, "gauge") == 0 || strcmp(type, "counter") == 0);
            continue;
        }
        assert_true(line[0] != '#');
        size_t k = 0;
        while (line[k] && line[k] != '{' && line[k] != ' ')
            k++;
        assert_true(k == strlen(current) && strncmp(line, current, k) == 0);
        if (strstr(current, "_total") != NULL)
            assert_true(strlen(current) > 6);
        if (line[k] == '{') {
            k++;
            for (;;) {
                size_t s = k;
                while ((line[k] >= 'a' && line[k] <= 'z') || line[k] == '_')
                    k++;
                assert_true(k > s && line[k] == '=' && line[k + 1] == '"');
                k += 2;
                while (line[k] && line[k] != '"') {
                    if (line[k] == '\\') {
                        char esc = line[k + 1];
                        assert_true(esc == '\\' || esc == '"' || esc == 'n');
                        k++;
                    }
                    k++;
                }
                assert_true(line[k] == '"');
                k++;
                if (line[k] == ',') {
                    k++;
                    continue;
                }
                assert_true(line[k] == '}');
                k++;
                break;
            }
        }
        assert_true(line[k] == ' ');
        char *end;
        strtod(line + k + 1, &end);
        assert_true(end != line + k + 1 && *end == '\0');
    }
}

/* ---- parsers ---- */

static void test_cgroup_forms(void **state)
{
    dp_cgroup_id id;
    kgpu_error err = {0};
    /* cgroup v2, systemd driver, containerd. */
    const char *v2 = "0::/kubepods.slice/kubepods-besteffort.slice/"
                     "kubepods-besteffort-pod" "11111111_2222_3333_4444_555555555555"
                     ".slice/cri-containerd-" CID_1 ".scope\n";
    assert_int_equal(dp_cgroup_parse(v2, strlen(v2), &id, &err), 0);
    assert_string_equal(id.pod_uid, UID_A);
    assert_string_equal(id.container_id, CID_1);
    /* cgroup v1, cgroupfs driver, upper-case hex normalised. */
    const char *v1 = "12:memory:/kubepods/burstable/pod" UID_B "/" CID_2 "\n"
                     "11:cpu,cpuacct:/kubepods/burstable/pod" UID_B "/" CID_2 "\n"
                     "1:name=systemd:/kubepods/burstable/pod" UID_B "/" CID_2 "\n";
    assert_int_equal(dp_cgroup_parse(v1, strlen(v1), &id, &err), 0);
    assert_string_equal(id.pod_uid, UID_B);
    assert_string_equal(id.container_id, CID_2);
    /* Guaranteed QoS (no QoS slice), CRI-O, a sub-cgroup the container made. */
    const char *crio = "0::/kubepods.slice/kubepods-pod" "66666666_7777_8888_9999_000000000000"
                       ".slice/crio-" CID_3 ".scope/worker\n";
    assert_int_equal(dp_cgroup_parse(crio, strlen(crio), &id, &err), 0);
    assert_string_equal(id.pod_uid, UID_B);
    assert_string_equal(id.container_id, CID_3);
    /* Read from inside a cgroup namespace: the path climbs out first. */
    const char *ns = "0::/../../kubepods-burstable-pod" "11111111_2222_3333_4444_555555555555"
                     ".slice/cri-containerd-" CID_1 ".scope\n";
    assert_int_equal(dp_cgroup_parse(ns, strlen(ns), &id, &err), 0);
    assert_string_equal(id.container_id, CID_1);
    /* A static pod's UID is 32 hex digits. */
    const char *st = "0::/kubepods/pod0123456789abcdef0123456789ABCDEF/" CID_1 "\n";
    assert_int_equal(dp_cgroup_parse(st, strlen(st), &id, &err), 0);
    assert_string_equal(id.pod_uid, "0123456789abcdef0123456789abcdef");
    /* Not a container: a host service, CRI-O's monitor, the pod's own cgroup. */
    const char *host = "0::/system.slice/containerd.service\n";
    assert_int_equal(dp_cgroup_parse(host, strlen(host), &id, &err), KGPU_ENOENT);
    const char *conmon = "0::/kubepods.slice/kubepods-pod" "66666666_7777_8888_9999_000000000000"
                         ".slice/crio-conmon-" CID_3 ".scope\n";
    assert_int_equal(dp_cgroup_parse(conmon, strlen(conmon), &id, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "monitor"));
    const char *podonly = "0::/kubepods/burstable/pod" UID_B "\n";
    assert_int_equal(dp_cgroup_parse(podonly, strlen(podonly), &id, &err), KGPU_ENOENT);
    /* A container ID one digit short is not one. */
    const char *shortid = "0::/kubepods/pod" UID_B "/" "123456789012345678901234567890123456789"
                          "012345678901234567890123\n";
    assert_int_equal(dp_cgroup_parse(shortid, strlen(shortid), &id, &err), KGPU_ENOENT);
    /* Malformed: two containers, no path, a NUL, nothing. */
    const char *two = "12:memory:/kubepods/pod" UID_B "/" CID_2 "\n"
                      "11:cpu:/kubepods/pod" UID_B "/" CID_3 "\n";
    assert_int_equal(dp_cgroup_parse(two, strlen(two), &id, &err), KGPU_EPARSE);
    assert_string_equal(id.container_id, "");
    assert_int_equal(dp_cgroup_parse("garbage\n", 8, &id, &err), KGPU_EPARSE);
    assert_int_equal(dp_cgroup_parse("0::/a\0b\n", 8, &id, &err), KGPU_EPARSE);
    assert_int_equal(dp_cgroup_parse("x::/a\n", 6, &id, &err), KGPU_EPARSE);
    assert_int_equal(dp_cgroup_parse("", 0, &id, &err), KGPU_EPARSE);
}

static void test_config(void **state)
{
    dp_watch_config c;
    kgpu_error err = {0};
    assert_int_equal(dp_watch_config_parse("", 0, "w.yaml", &c, &err), 0);
    assert_true(c.interval_s == 5 && c.enforce == DP_ENFORCE_NONE && c.events &&
                c.core_slack_pct == 10 && c.core_grace_scans == 3 && c.memory_slack_mib == 0);
    assert_string_equal(c.proc_root, "/proc");
    assert_string_equal(c.listen, "");
    const char *full = "intervalSeconds: 2.5\nenforce: kill\nmemorySlackMiB: 256\n"
                       "coreSlackPercent: 5\ncoreGraceScans: 4\nevents: false\n"
                       "metricsListen: \"0.0.0.0:9402\"\nprocRoot: /host/proc\n";
    assert_int_equal(dp_watch_config_parse(full, strlen(full), "w.yaml", &c, &err), 0);
    assert_true(c.interval_s == 2.5 && c.enforce == DP_ENFORCE_KILL && !c.events &&
                c.memory_slack_mib == 256 && c.core_slack_pct == 5 && c.core_grace_scans == 4);
    assert_string_equal(c.listen, "0.0.0.0:9402");
    assert_string_equal(c.proc_root, "/host/proc");
    /* A typo in enforce or in a key must not silently mean "none". */
    const char *typo = "enforce: kil\n";
    assert_int_equal(dp_watch_config_parse(typo, strlen(typo), "w.yaml", &c, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "w.yaml: enforce"));
    assert_int_equal(c.enforce, DP_ENFORCE_NONE);
    const char *key = "enforcement: kill\n";
    assert_int_equal(dp_watch_config_parse(key, strlen(key), "w.yaml", &c, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "enforcement"));
    const char *range = "coreSlackPercent: 101\n";
    assert_int_equal(dp_watch_config_parse(range, strlen(range), "w.yaml", &c, &err), KGPU_ERANGE);
    const char *fast = "intervalSeconds: 0.01\n";
    assert_int_equal(dp_watch_config_parse(fast, strlen(fast), "w.yaml", &c, &err), KGPU_ERANGE);
    const char *rel = "procRoot: proc\n";
    assert_int_equal(dp_watch_config_parse(rel, strlen(rel), "w.yaml", &c, &err), KGPU_EINVAL);
    const char *list = "- enforce\n";
    assert_int_equal(dp_watch_config_parse(list, strlen(list), "w.yaml", &c, &err), KGPU_EPARSE);
    const char *str = "events: \"yes\"\n";
    assert_int_equal(dp_watch_config_parse(str, strlen(str), "w.yaml", &c, &err), KGPU_EPARSE);
    const char *ex = "exemptNamespaces: [gpu-operator, kube-system]\n";
    assert_int_equal(dp_watch_config_parse(ex, strlen(ex), "w.yaml", &c, &err), 0);
    assert_int_equal(c.nexempt, 2);
    assert_string_equal(c.exempt[1], "kube-system");
    const char *bad_ex[] = {"exemptNamespaces: gpu-operator\n", "exemptNamespaces: [\"Bad_NS\"]\n",
                            "exemptNamespaces: [\"\"]\n", "exemptNamespaces: [1]\n",
                            "exemptNamespaces: [a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q]\n"};
    for (size_t i = 0; i < sizeof(bad_ex) / sizeof(bad_ex[0]); i++) {
        assert_int_equal(dp_watch_config_parse(bad_ex[i], strlen(bad_ex[i]), "w.yaml", &c, &err),
                         KGPU_EPARSE);
        assert_non_null(strstr(err.msg, "exemptNamespaces"));
    }
}

/* ---- NVML's process lists ---- */

static void test_nvml_processes(void **state)
{
    kgpu_nvml *nv = NULL;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(fake_lib(), NULL, &nv, &err), 0);
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    assert_int_equal(kgpu_nvml_discover(nv, &gpus, &n, &err), 0);
    assert_int_equal(n, 2);
    free(gpus);
    /* 11 is listed as compute and as an MPS client: merged; 12's memory is not available. */
    procs("0 11 100 40\n0 11 50 0 mps\n0 12 - 10\n1 13 7 0\n# a comment\nnonsense\n");
    kgpu_gpu_proc p[8];
    bool no_util = true;
    assert_int_equal(kgpu_nvml_processes(nv, 0, p, 8, &n, &no_util, &err), 0);
    assert_false(no_util);
    assert_int_equal(n, 2);
    assert_int_equal(p[0].pid, 11);
    assert_true(p[0].used_bytes == 150 * MIB);
    assert_int_equal(p[0].sm_pct, 40);
    assert_int_equal(p[1].pid, 12);
    assert_true(p[1].used_bytes == -1);
    assert_int_equal(p[1].sm_pct, 10);
    assert_int_equal(kgpu_nvml_processes(nv, 1, p, 8, &n, NULL, &err), 0);
    assert_int_equal(n, 1);
    assert_true(p[0].used_bytes == 7 * MIB && p[0].sm_pct == 0);
    /* More processes than room is an error, not a silent cut. */
    assert_int_equal(kgpu_nvml_processes(nv, 0, p, 1, &n, NULL, &err), KGPU_ERANGE);
    assert_int_equal(kgpu_nvml_processes(nv, 5, p, 8, &n, NULL, &err), KGPU_EINVAL);
    setenv("FAKE_NVML_NO_UTIL", "1", 1);
    assert_int_equal(kgpu_nvml_processes(nv, 0, p, 8, &n, &no_util, &err), 0);
    assert_true(no_util && n == 2 && p[0].sm_pct == 0);
    unsetenv("FAKE_NVML_NO_UTIL");
    /* A second handle in the same process (the watcher's) leaves the first working. */
    kgpu_nvml *nv2 = NULL;
    assert_int_equal(kgpu_nvml_open(fake_lib(), NULL, &nv2, &err), 0);
    kgpu_nvml_close(nv2);
    assert_true(kgpu_nvml_alive(nv, 0));
    kgpu_nvml_close(nv);
}

static void test_nvml_processes_v1_records(void **state)
{
    /* An older driver: the unversioned list only, 16-byte records, and no MPS list. */
    char lib[600];
    snprintf(lib, sizeof(lib), "%s/procsv1/libnvidia-ml.so.1", KGPU_FAKE_NVML_DIR);
    kgpu_nvml *nv = NULL;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(lib, NULL, &nv, &err), 0);
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    assert_int_equal(kgpu_nvml_discover(nv, &gpus, &n, &err), 0);
    free(gpus);
    procs("0 21 100 0\n0 22 200 0\n0 23 300 0\n0 24 7 0 mps\n");
    kgpu_gpu_proc p[8];
    assert_int_equal(kgpu_nvml_processes(nv, 0, p, 8, &n, NULL, &err), 0);
    assert_int_equal(n, 3); /* read with a 24-byte stride, the second record would be garbage */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(p[i].pid, 21 + i);
        assert_true(p[i].used_bytes == (i + 1) * 100 * MIB);
    }
    kgpu_nvml_close(nv);
}

/* ---- scans without an API server ---- */

static void test_scan_maps_processes(void **state)
{
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=30\n");
    cgroup_of(101, UID_A, CID_1);
    cgroup_of(102, UID_A, CID_1);
    cgroup_of(103, UID_X, CID_3); /* another pod, not kgpu's */
    cgroup_of(104, NULL, NULL);   /* a host process */
    procs("0 101 1000 20\n0 102 500 5\n1 103 100 0\n0 104 300 0\n0 105 10 0\n");
    dp_watch_config c = config(DP_ENFORCE_NONE);
    dp_watcher *w = watcher(&c, NULL);
    char *t = scan_text(w);
    assert_exposition(t);
    int pt = promtool(t);
    if (pt != 77)
        assert_int_equal(pt, 0);
#define A0 LBL("", "", "train", UID_A, CID_1, "0", "GPU-aaaa")
    assert_true(sample(t, "kgpu_container_gpu_memory_used_bytes" A0 "}") == 1500.0 * MIB);
    assert_true(sample(t, "kgpu_container_gpu_memory_share_bytes" A0 "}") == 4096.0 * MIB);
    assert_true(sample(t, "kgpu_container_gpu_core_used_percent" A0 "}") == 25);
    assert_true(sample(t, "kgpu_container_gpu_core_share_percent" A0 "}") == 30);
    assert_true(sample(t, "kgpu_container_gpu_processes" A0 "}") == 2);
    assert_true(sample(t, "kgpu_container_gpu_throttled" A0 ",resource=\"memory\"}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_throttled" A0 ",resource=\"core\"}") == 0);
    assert_true(sample(t, "kgpu_watcher_up") == 1);
    const char *g0 = "kgpu_watcher_gpu_processes{gpu=\"0\",gpu_uuid=\"GPU-aaaa\",kind=";
    char k[200];
    snprintf(k, sizeof(k), "%s\"kgpu_container\"}", g0);
    assert_true(sample(t, k) == 2);
    snprintf(k, sizeof(k), "%s\"host\"}", g0);
    assert_true(sample(t, k) == 1);
    snprintf(k, sizeof(k), "%s\"unreadable\"}", g0); /* 105 has no /proc entry: gone */
    assert_true(sample(t, k) == 1);
    assert_true(sample(t, "kgpu_watcher_gpu_processes{gpu=\"1\",gpu_uuid=\"GPU-bbbb\","
                          "kind=\"other_pod\"}") == 1);
    /*
     * Issue 24, item 3: the other pod's process holds a GPU kgpu never gave
     * it (NVIDIA_VISIBLE_DEVICES=all past the runtime): a share of zero, over.
     */
#define X1 LBL("", "", "", UID_X, CID_3, "1", "GPU-bbbb")
    assert_true(sample(t, "kgpu_container_gpu_memory_share_bytes" X1 "}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_unallocated" X1 "}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_throttled" X1 ",resource=\"memory\"}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_unallocated" A0 "}") == 0);
    free(t);
    /* The container stops using the GPU: its series go. */
    procs("0 104 300 0\n");
    t = scan_text(w);
    assert_null(strstr(t, CID_1));
    assert_true(sample(t, "kgpu_watcher_scans_total") == 2);
    free(t);
    dp_watcher_free(w);
}

/* A child that waits to be killed; its fake cgroup names (uid, cid). */
static pid_t child_in(const char *uid, const char *cid)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    kid_started(pid);
    cgroup_of((unsigned)pid, uid, cid);
    return pid;
}

/* Whether `pid` died of SIGKILL (reaped), waiting up to 2 s; false if it lives. */
static bool killed(pid_t pid)
{
    for (int i = 0; i < 200; i++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            kid_gone(pid);
            return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        }
        usleep(10000);
    }
    return false;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    kid_gone(pid);
}

static void test_memory_over_share_kills_only_the_offender(void **state)
{
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=30\n");
    limits(UID_B, "serve", "device 0 uuid=GPU-aaaa memory_mib=8192\n");
    pid_t bad = child_in(UID_A, CID_1);
    pid_t quiet = child_in(UID_A, CID_1);    /* the offender's, but NVML does not list it */
    pid_t neighbour = child_in(UID_B, CID_2); /* another container on the same GPU */
    char script[256];
    snprintf(script, sizeof(script), "0 %d 5000 50\n0 %d 6000 30\n", (int)bad, (int)neighbour);
    procs(script);
    dp_watch_config c = config(DP_ENFORCE_KILL);
    dp_watcher *w = watcher(&c, NULL);
    char *t = scan_text(w);
    assert_true(killed(bad));
    assert_false(killed(quiet));
    assert_false(killed(neighbour));
    assert_true(sample(t, "kgpu_container_gpu_throttled" A0 ",resource=\"memory\"}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_over_share_total" A0 ",resource=\"memory\"}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_killed_processes_total" A0 "}") == 1);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"killed\"}") == 1);
#define B0 LBL("", "", "serve", UID_B, CID_2, "0", "GPU-aaaa")
    assert_true(sample(t, "kgpu_container_gpu_throttled" B0 ",resource=\"memory\"}") == 0);
    /* A memory-only share is not limited in compute. */
    assert_true(sample(t, "kgpu_container_gpu_core_share_percent" B0 "}") == 100);
    free(t);
    reap(quiet);
    reap(neighbour);
    dp_watcher_free(w);
}

static void test_kill_only_when_enforced(void **state)
{
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=100\n");
    pid_t p = child_in(UID_A, CID_1);
    char script[128];
    snprintf(script, sizeof(script), "0 %d 5000 0\n", (int)p);
    procs(script);
    dp_watch_config c = config(DP_ENFORCE_NONE);
    dp_watcher *w = watcher(&c, NULL);
    char *t = scan_text(w); /* over, but enforce: none */
    assert_true(sample(t, "kgpu_container_gpu_throttled" A0 ",resource=\"memory\"}") == 1);
    free(t);
    assert_false(killed(p));
    dp_watcher_free(w);
    c = config(DP_ENFORCE_KILL);
    w = watcher(&c, NULL);
    t = scan_text(w);
    free(t);
    assert_true(killed(p));
    /* Killed and reaped: the next scan finds its PID gone and kills nothing more. */
    t = scan_text(w);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"killed\"}") == 1);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"failed\"}") == 0);
    free(t);
    dp_watcher_free(w);
}

static void test_enforce_none_reports_once_per_episode(void **state)
{
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=1000\n");
    cgroup_of(201, UID_A, CID_1);
    procs("0 201 1200 0\n");
    dp_watch_config c = config(DP_ENFORCE_NONE);
    c.memory_slack_mib = 100;
    dp_watcher *w = watcher(&c, NULL);
    char *t = scan_text(w);
    /* 1200 > 1000 + 100 slack. */
    assert_true(sample(t, "kgpu_container_gpu_throttled" A0 ",resource=\"memory\"}") == 1);
    free(t);
    t = scan_text(w);
    assert_true(sample(t, "kgpu_container_gpu_over_share_total" A0 ",resource=\"memory\"}") == 1);
    free(t);
    procs("0 201 1100 0\n"); /* within the slack */
    t = scan_text(w);
    assert_true(sample(t, "kgpu_container_gpu_throttled" A0 ",resource=\"memory\"}") == 0);
    free(t);
    procs("0 201 1101 0\n");
    t = scan_text(w);
    assert_true(sample(t, "kgpu_container_gpu_over_share_total" A0 ",resource=\"memory\"}") == 2);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"killed\"}") == 0);
    free(t);
    dp_watcher_free(w);
}

static void test_core_over_share_after_grace(void **state)
{
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=30\n");
    cgroup_of(301, UID_A, CID_1);
    limits(UID_B, "serve", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=70\n");
    cgroup_of(302, UID_B, CID_2);
    dp_watch_config c = config(DP_ENFORCE_KILL); /* compute is never killed for */
    dp_watcher *w = watcher(&c, NULL);
    const char *core = "kgpu_container_gpu_throttled" A0 ",resource=\"core\"}";
    /* Alone on the GPU it is lent the idle rest: 50 % of a 30 % share is not over. */
    procs("0 301 10 50\n");
    for (int i = 1; i <= 4; i++) {
        char *t = scan_text(w);
        assert_true(sample(t, core) == 0);
        free(t);
    }
    /* With another container busy on the GPU too, it is over after the grace scans. */
    procs("0 301 10 50\n0 302 10 40\n");
    for (int i = 1; i <= 3; i++) {
        char *t = scan_text(w);
        assert_true(sample(t, core) == (i == 3 ? 1 : 0));
        assert_true(sample(t, "kgpu_container_gpu_core_used_percent" A0 "}") == 50);
        free(t);
    }
    procs("0 301 10 40\n0 302 10 40\n"); /* 30 + 10 slack: not over */
    char *t = scan_text(w);
    assert_true(sample(t, core) == 0);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"killed\"}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_over_share_total" A0 ",resource=\"core\"}") == 1);
    free(t);
    dp_watcher_free(w);
}

/*
 * The library and the watcher count a container's memory alike. A process
 * under libkgpu-limit.so (the probe, against the fake driver, whose
 * contexts take 520 MiB as NVML and the driver both see through one
 * memory file) fills its 2048 MiB share as the library charges it: NVML
 * then counts 2048 MiB for it, and with memorySlackMiB 0 and enforce: kill
 * it is left alone. Charged the fixed 300 MiB instead (its NVML finds no
 * GPU to measure the context with), the same process fits 220 MiB more
 * than its share, and is killed.
 */
#define PROBE_UUID "GPU-fa4e0000-0000-0000-0000-000000000000"
#define PROBE_GPUS PROBE_UUID ",NVIDIA H200,40960,00000000:3B:00.0"

static pid_t probe_holding(unsigned hold_mib, int nvml)
{
    char e[10][700];
    snprintf(e[0], sizeof(e[0]), "LD_PRELOAD=%s", KGPU_SHIM_LIB);
    snprintf(e[1], sizeof(e[1]), "LD_LIBRARY_PATH=%s/full:%s", KGPU_FAKE_CUDA_DIR,
             KGPU_SHIM_FAKE_NVML_DIR);
    snprintf(e[2], sizeof(e[2]), "KGPU_SHARED_DIR=%s/acct", root);
    snprintf(e[3], sizeof(e[3]), "KGPU_LIMITS_FILE=%s/state/pods/%s/train.limits", root, UID_A);
    snprintf(e[4], sizeof(e[4]), "FAKE_GPU_MEM_FILE=%s/gpumem", root);
    snprintf(e[5], sizeof(e[5]), "FAKE_CUDA_MEM_MIB=40960");
    snprintf(e[6], sizeof(e[6]), "FAKE_CUDA_CTX_MIB=520");
    snprintf(e[7], sizeof(e[7]), "PROBE_HOLD_MIB=%u", hold_mib);
    snprintf(e[8], sizeof(e[8]), "FAKE_NVML_GPUS=%s", nvml ? PROBE_GPUS : "");
    char *envp[] = {e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], NULL};
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        char *argv[] = {(char *)KGPU_SHIM_PROBE, (char *)"hold", NULL};
        execve(KGPU_SHIM_PROBE, argv, envp);
        _exit(127);
    }
    kid_started(pid);
    close(fds[1]);
    char buf[256];
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1); /* "holding" once its memory is held */
    close(fds[0]);
    assert_true(n > 0);
    buf[n] = '\0';
    if (strstr(buf, "holding") == NULL)
        fail_msg("the probe did not get its memory: %s", buf);
    cgroup_of((unsigned)pid, UID_A, CID_1);
    return pid;
}

static void test_library_and_watcher_agree(void **state)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/acct", root);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/gpumem", root);
    setenv("FAKE_GPU_MEM_FILE", path, 1);
    setenv("FAKE_NVML_GPUS", PROBE_GPUS, 1);
    limits(UID_A, "train", "device 0 uuid=" PROBE_UUID " memory_mib=2048\n");
    dp_watch_config c = config(DP_ENFORCE_KILL);
    assert_int_equal(c.memory_slack_mib, 0);
#define P0 LBL("", "", "train", UID_A, CID_1, "0", PROBE_UUID)
    /* Measured: 520 for the context + 1528 allocated = the share, as NVML counts it too. */
    pid_t full = probe_holding(1528, 1);
    dp_watcher *w = watcher(&c, NULL);
    char *t = scan_text(w);
    assert_true(sample(t, "kgpu_container_gpu_memory_used_bytes" P0 "}") == 2048.0 * MIB);
    assert_true(sample(t, "kgpu_container_gpu_throttled" P0 ",resource=\"memory\"}") == 0);
    free(t);
    assert_false(killed(full));
    reap(full);
    dp_watcher_free(w);
    /*
     * Without NVML in the process the library measures its first context
     * by a throwaway second one (docs/shim.md, "The context footprint"):
     * it agrees with NVML's count too. (A fixed 300 MiB per context let
     * 1748 MiB more in, 2268 as NVML counts: over, and killed.)
     */
    pid_t fits = probe_holding(1528, 0);
    w = watcher(&c, NULL);
    t = scan_text(w);
    double used = sample(t, "kgpu_container_gpu_memory_used_bytes" P0 "}");
    if (used != 2048.0 * MIB)
        fail_msg("without NVML the container uses %.0f MiB as NVML counts, not 2048", used / MIB);
    assert_true(sample(t, "kgpu_container_gpu_throttled" P0 ",resource=\"memory\"}") == 0);
    free(t);
    assert_false(killed(fits));
    reap(fits);
    dp_watcher_free(w);
    unsetenv("FAKE_GPU_MEM_FILE");
}

/*
 * A tenant that tampers with its GPU's schedule file (raises its own share,
 * stops taking turns) shows on the GPU as more SM time than its share while
 * the other container is busy: the watcher reports it after the grace
 * scans, and never kills for compute. Taking a little more than its share,
 * within the slack, goes unreported (docs/shim.md's threat table).
 */
static void test_schedule_tamperer_is_caught_under_contention(void **state)
{
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=30\n");
    limits(UID_B, "serve", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=70\n");
    pid_t tamperer = child_in(UID_A, CID_1), victim = child_in(UID_B, CID_2);
    dp_watch_config c = config(DP_ENFORCE_KILL);
    dp_watcher *w = watcher(&c, NULL);
    const char *a_core = "kgpu_container_gpu_throttled" A0 ",resource=\"core\"}";
    const char *b_core = "kgpu_container_gpu_throttled" B0 ",resource=\"core\"}";
    char script[128];
    /* Its share raised to 38 % in the file: 8 points over, inside the 10-point slack. */
    snprintf(script, sizeof(script), "0 %d 100 38\n0 %d 100 55\n", (int)tamperer, (int)victim);
    procs(script);
    for (int i = 0; i < 4; i++) {
        char *t = scan_text(w);
        assert_true(sample(t, a_core) == 0);
        free(t);
    }
    /* Not taking turns at all: the driver's time slicing gives it about half. */
    snprintf(script, sizeof(script), "0 %d 100 50\n0 %d 100 45\n", (int)tamperer, (int)victim);
    procs(script);
    for (int i = 1; i <= 3; i++) {
        char *t = scan_text(w);
        assert_true(sample(t, a_core) == (i == 3 ? 1 : 0));
        assert_true(sample(t, b_core) == 0); /* 45 % of a 70 % share: the victim is not over */
        free(t);
    }
    char *t = scan_text(w);
    assert_true(sample(t, "kgpu_container_gpu_over_share_total" A0 ",resource=\"core\"}") == 1);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"killed\"}") == 0);
    free(t);
    assert_false(killed(tamperer));
    reap(tamperer);
    reap(victim);
    dp_watcher_free(w);
}

static void test_gpu_not_given_is_over(void **state)
{
    /* The container was given GPU 0 only, but NVML sees it on GPU 1. */
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=4096 core_pct=30\n");
    cgroup_of(401, UID_A, CID_1);
    procs("1 401 10 0\n");
    dp_watch_config c = config(DP_ENFORCE_NONE);
    dp_watcher *w = watcher(&c, NULL);
    char *t = scan_text(w);
#define A1 LBL("", "", "train", UID_A, CID_1, "1", "GPU-bbbb")
    assert_true(sample(t, "kgpu_container_gpu_memory_share_bytes" A1 "}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_throttled" A1 ",resource=\"memory\"}") == 1);
    free(t);
    dp_watcher_free(w);
}

static void test_nvml_missing(void **state)
{
    dp_watch_config c = config(DP_ENFORCE_NONE);
    char state_dir[600];
    snprintf(state_dir, sizeof(state_dir), "%s/state", root);
    dp_watch_sources src = {.state_dir = state_dir, .nvml_lib = "/nonexistent/libnvidia-ml.so.1"};
    kgpu_error err = {0};
    dp_watcher *w = dp_watcher_new(&c, &src, &err);
    assert_non_null(w);
    assert_int_equal(dp_watcher_scan(w, &err), KGPU_ENOENT);
    size_t len;
    char *t = dp_watcher_metrics(w, &len);
    assert_true(sample(t, "kgpu_watcher_up") == 0);
    assert_true(sample(t, "kgpu_watcher_scan_errors_total") == 1);
    assert_exposition(t);
    free(t);
    dp_watcher_free(w);
}

/* ---- with an API server: names and Events ---- */

typedef struct apisrv {
    int fd, port;
    pthread_t thread;
    atomic_int events;
    atomic_int lists;
    char last_event[4096];
    pthread_mutex_t mu;
    atomic_bool stop;
} apisrv;

static const char pod_list[] =
    "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"7\"},"
    "\"items\":[{\"metadata\":{\"name\":\"pod-a\",\"namespace\":\"ns1\",\"uid\":\"" UID_A "\"},"
    "\"status\":{\"containerStatuses\":[{\"name\":\"train\",\"containerID\":\"containerd://" CID_1
    "\"},{\"name\":\"eval\",\"containerID\":\"containerd://" CID_2 "\"},"
    "{\"name\":\"side\",\"containerID\":\"containerd://" CID_4 "\"}]}},"
    "{\"metadata\":{\"name\":\"rogue\",\"namespace\":\"ns1\",\"uid\":\"" UID_X "\"},"
    "\"status\":{\"containerStatuses\":[{\"name\":\"cuda\",\"containerID\":\"containerd://" CID_3
    "\"}]}},"
    "{\"metadata\":{\"name\":\"validator\",\"namespace\":\"gpu-operator\",\"uid\":\"" UID_B
    "\"},\"status\":{\"containerStatuses\":[{\"name\":\"check\",\"containerID\":"
    "\"containerd://" CID_5 "\"}]}}]}";

static void *api_loop(void *arg)
{
    apisrv *s = arg;
    while (!atomic_load(&s->stop)) {
        int c = accept(s->fd, NULL, NULL);
        if (c < 0)
            continue;
        char req[16384];
        size_t n = 0;
        ssize_t r;
        char *body = NULL;
        size_t want = 0;
        while (n + 1 < sizeof(req) && (r = read(c, req + n, sizeof(req) - 1 - n)) > 0) {
            n += (size_t)r;
            req[n] = '\0';
            char *end = strstr(req, "\r\n\r\n");
            if (end == NULL)
                continue;
            char *cl = strcasestr(req, "content-length:");
            want = cl != NULL && cl < end ? strtoul(cl + 15, NULL, 10) : 0;
            body = end + 4;
            if ((size_t)(req + n - body) >= want)
                break;
        }
        const char *answer;
        char head[256];
        if (strncmp(req, "GET /api/v1/pods?", 17) == 0 &&
            strstr(req, "fieldSelector=spec.nodeName%3Dnode-1") != NULL) {
            atomic_fetch_add(&s->lists, 1);
            answer = pod_list;
            snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\n");
        } else if (strncmp(req, "POST /api/v1/namespaces/ns1/events ", 35) == 0 && body) {
            pthread_mutex_lock(&s->mu);
            snprintf(s->last_event, sizeof(s->last_event), "%.*s", (int)want, body);
            pthread_mutex_unlock(&s->mu);
            atomic_fetch_add(&s->events, 1);
            answer = "{}";
            snprintf(head, sizeof(head), "HTTP/1.1 201 Created\r\n");
        } else {
            answer = "{\"kind\":\"Status\",\"code\":404}";
            snprintf(head, sizeof(head), "HTTP/1.1 404 Not Found\r\n");
        }
        char out[8192];
        int len = snprintf(out, sizeof(out),
                           "%sContent-Type: application/json\r\nContent-Length: %zu\r\n"
                           "Connection: close\r\n\r\n%s",
                           head, strlen(answer), answer);
        if (write(c, out, (size_t)len) < 0) {
            /* the client went away: nothing to do */
        }
        close(c);
    }
    return NULL;
}

static void api_start(apisrv *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(s->fd, 16), 0);
    socklen_t al = sizeof(a);
    getsockname(s->fd, (struct sockaddr *)&a, &al);
    s->port = ntohs(a.sin_port);
    struct timeval tv = {0, 100000};
    setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* accept wakes to see stop */
    assert_int_equal(pthread_create(&s->thread, NULL, api_loop, s), 0);
}

static void api_stop(apisrv *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->thread, NULL);
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
}

static kgpu_k8s *client(const apisrv *s)
{
    kgpu_k8s_config kc;
    memset(&kc, 0, sizeof(kc));
    snprintf(kc.server, sizeof(kc.server), "http://127.0.0.1:%d", s->port);
    kc.timeout_ms = 5000;
    kgpu_error err = {0};
    kgpu_k8s *k = kgpu_k8s_new(&kc, &err);
    if (k == NULL)
        fail_msg("%s", err.msg);
    return k;
}

static void test_names_and_events_from_the_api(void **state)
{
    apisrv s;
    api_start(&s);
    kgpu_k8s *k = client(&s);
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=1024 core_pct=30\n");
    limits(UID_A, "eval", "device 0 uuid=GPU-aaaa memory_mib=2048 core_pct=20\n");
    cgroup_of(501, UID_A, CID_1);
    cgroup_of(502, UID_A, CID_2);
    procs("0 501 2000 0\n0 502 1000 0\n");
    dp_watch_config c = config(DP_ENFORCE_NONE);
    dp_watcher *w = watcher(&c, k);
    char *t = scan_text(w);
    assert_int_equal(atomic_load(&s.lists), 1);
#define TR LBL("ns1", "pod-a", "train", UID_A, CID_1, "0", "GPU-aaaa")
#define EV LBL("ns1", "pod-a", "eval", UID_A, CID_2, "0", "GPU-aaaa")
    /* Two containers in one pod: each compared with its own share. */
    assert_true(sample(t, "kgpu_container_gpu_memory_share_bytes" TR "}") == 1024.0 * MIB);
    assert_true(sample(t, "kgpu_container_gpu_memory_share_bytes" EV "}") == 2048.0 * MIB);
    assert_true(sample(t, "kgpu_container_gpu_throttled" TR ",resource=\"memory\"}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_throttled" EV ",resource=\"memory\"}") == 0);
    assert_true(sample(t, "kgpu_watcher_events_total{result=\"posted\"}") == 1);
    free(t);
    assert_int_equal(atomic_load(&s.events), 1);
    pthread_mutex_lock(&s.mu);
    json_error_t je;
    json_t *ev = json_loads(s.last_event, 0, &je);
    pthread_mutex_unlock(&s.mu);
    assert_non_null(ev);
    json_t *io = json_object_get(ev, "involvedObject");
    assert_string_equal(json_string_value(json_object_get(io, "kind")), "Pod");
    assert_string_equal(json_string_value(json_object_get(io, "name")), "pod-a");
    assert_string_equal(json_string_value(json_object_get(io, "uid")), UID_A);
    assert_string_equal(json_string_value(json_object_get(io, "fieldPath")),
                        "spec.containers{train}");
    assert_string_equal(json_string_value(json_object_get(ev, "reason")), "GPUMemoryOverShare");
    assert_string_equal(json_string_value(json_object_get(ev, "type")), "Warning");
    assert_non_null(strstr(json_string_value(json_object_get(ev, "message")), "2000 MiB"));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(ev, "metadata"), "namespace")), "ns1");
    json_decref(ev);
    /* Still over: no second Event; names known: no second list. */
    t = scan_text(w);
    free(t);
    assert_int_equal(atomic_load(&s.events), 1);
    assert_int_equal(atomic_load(&s.lists), 1);
    dp_watcher_free(w);
    /* enforce: kill: the kill, then its Event after the over-share one. */
    pid_t p = child_in(UID_A, CID_1);
    char script[128];
    snprintf(script, sizeof(script), "0 %d 2000 0\n0 502 1000 0\n", (int)p);
    procs(script);
    c = config(DP_ENFORCE_KILL);
    w = watcher(&c, k);
    t = scan_text(w);
    free(t);
    assert_true(killed(p));
    assert_int_equal(atomic_load(&s.events), 3);
    pthread_mutex_lock(&s.mu);
    ev = json_loads(s.last_event, 0, &je);
    pthread_mutex_unlock(&s.mu);
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "reason")), "GPUShareEnforced");
    assert_non_null(strstr(json_string_value(json_object_get(ev, "message")), "killed 1"));
    json_decref(ev);
    dp_watcher_free(w);
    kgpu_k8s_free(k);
    api_stop(&s);
}

/*
 * Issue 24, item 3: a GPU process of a pod kgpu did not allocate a GPU (it
 * set NVIDIA_VISIBLE_DEVICES=all and the runtime accepted it), or of a
 * container of a kgpu pod that Allocate gave nothing, is over a share of
 * zero: reported, and killed with enforce: kill. exemptNamespaces spares the
 * operator's own GPU pods.
 */
static void test_unallocated_pods_are_over_a_zero_share(void **state)
{
    apisrv s;
    api_start(&s);
    kgpu_k8s *k = client(&s);
    limits(UID_A, "train", "device 0 uuid=GPU-aaaa memory_mib=1024 core_pct=30\n");
    pid_t side = child_in(UID_A, CID_4);      /* pod-a's sidecar: no limits file */
    pid_t rogue = child_in(UID_X, CID_3);     /* no kgpu directory at all */
    pid_t validator = child_in(UID_B, CID_5); /* the same, in an exempt namespace */
    char script[256];
    snprintf(script, sizeof(script), "0 %d 500 10\n1 %d 300 90\n1 %d 200 0\n", (int)side,
             (int)rogue, (int)validator);
    procs(script);
    dp_watch_config c = config(DP_ENFORCE_KILL);
    c.nexempt = 1;
    snprintf(c.exempt[0], sizeof(c.exempt[0]), "gpu-operator");
    dp_watcher *w = watcher(&c, k);
    char *t = scan_text(w);
    assert_true(killed(side));
    assert_true(killed(rogue));
    assert_false(killed(validator));
#define SD LBL("ns1", "pod-a", "side", UID_A, CID_4, "0", "GPU-aaaa")
#define RG LBL("ns1", "rogue", "cuda", UID_X, CID_3, "1", "GPU-bbbb")
#define VL LBL("gpu-operator", "validator", "check", UID_B, CID_5, "1", "GPU-bbbb")
    assert_true(sample(t, "kgpu_container_gpu_unallocated" SD "}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_unallocated" RG "}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_unallocated" VL "}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_memory_share_bytes" RG "}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_throttled" RG ",resource=\"memory\"}") == 1);
    assert_true(sample(t, "kgpu_container_gpu_throttled" VL ",resource=\"memory\"}") == 0);
    assert_true(sample(t, "kgpu_container_gpu_killed_processes_total" RG "}") == 1);
    assert_true(sample(t, "kgpu_watcher_kills_total{result=\"killed\"}") == 2);
    free(t);
    /* Per offender: the Event saying it has no allocation, then the one saying it was killed. */
    assert_int_equal(atomic_load(&s.events), 4);
    pthread_mutex_lock(&s.mu);
    json_error_t je;
    json_t *ev = json_loads(s.last_event, 0, &je);
    pthread_mutex_unlock(&s.mu);
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "reason")), "GPUShareEnforced");
    json_decref(ev);
    dp_watcher_free(w);
    /* enforce: none reports the same without killing. */
    reap(validator);
    pid_t again = child_in(UID_X, CID_3);
    snprintf(script, sizeof(script), "1 %d 300 0\n", (int)again);
    procs(script);
    c = config(DP_ENFORCE_NONE);
    w = watcher(&c, k);
    t = scan_text(w);
    assert_true(sample(t, "kgpu_container_gpu_throttled" RG ",resource=\"memory\"}") == 1);
    free(t);
    pthread_mutex_lock(&s.mu);
    ev = json_loads(s.last_event, 0, &je);
    pthread_mutex_unlock(&s.mu);
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "reason")), "GPUWithoutAllocation");
    assert_non_null(strstr(json_string_value(json_object_get(ev, "message")), "did not allocate"));
    json_decref(ev);
    assert_false(killed(again));
    reap(again);
    dp_watcher_free(w);
    kgpu_k8s_free(k);
    api_stop(&s);
}

/* ---- concurrency: /metrics readers against the watcher thread ---- */

typedef struct reader {
    dp_watcher *w;
    int port;
    atomic_bool *stop;
    int reads;
    char failure[256];
} reader;

/* Checks one scrape: complete, and the three containers from one and the same scan. */
static bool check_scrape(const char *t, double *last_scans, char *why, size_t cap)
{
    double scans = sample(t, "kgpu_watcher_scans_total");
    if (scans < *last_scans) {
        snprintf(why, cap, "scans_total went back from %g to %g", *last_scans, scans);
        return false;
    }
    *last_scans = scans;
    double v[3];
    const char *cids[3] = {CID_1, CID_2, CID_3};
    for (int i = 0; i < 3; i++) {
        const char *p = strstr(t, "kgpu_container_gpu_memory_used_bytes{");
        v[i] = -1;
        for (; p != NULL; p = strstr(p + 1, "kgpu_container_gpu_memory_used_bytes{")) {
            const char *nl = strchr(p, '\n');
            const char *c = strstr(p, cids[i]);
            if (c != NULL && nl != NULL && c < nl) {
                const char *br = memchr(p, '}', (size_t)(nl - p));
                v[i] = br != NULL ? strtod(br + 2, NULL) : -2;
                break;
            }
        }
    }
    if (scans >= 1 && (v[0] < 0 || v[0] != v[1] || v[1] != v[2])) {
        snprintf(why, cap, "torn scrape: %g %g %g", v[0], v[1], v[2]);
        return false;
    }
    const char *tail = t + strlen(t);
    if (tail == t || tail[-1] != '\n') {
        snprintf(why, cap, "scrape does not end with a newline");
        return false;
    }
    return true;
}

static void *read_direct(void *arg)
{
    reader *r = arg;
    double last = 0;
    while (!atomic_load(r->stop) && r->failure[0] == '\0') {
        size_t len;
        char *t = dp_watcher_metrics(r->w, &len);
        if (t == NULL || !check_scrape(t, &last, r->failure, sizeof(r->failure)))
            if (r->failure[0] == '\0')
                snprintf(r->failure, sizeof(r->failure), "no text");
        free(t);
        r->reads++;
    }
    return NULL;
}

/* GET path over HTTP/1.0; the body (malloc'd) or NULL; *status the code. */
static char *http_get(int port, const char *method, const char *path, int *status)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method, path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (buf != NULL && (r = read(fd, buf + len, cap - 1 - len)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) {
            char *q = realloc(buf, cap * 2);
            if (q == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = q;
            cap *= 2;
        }
    }
    close(fd);
    if (buf == NULL)
        return NULL;
    buf[len] = '\0';
    *status = 0;
    sscanf(buf, "HTTP/1.%*d %d", status);
    char *body = strstr(buf, "\r\n\r\n");
    char *out = strdup(body != NULL ? body + 4 : "");
    if (strcasestr(buf, "Content-Type: text/plain; version=0.0.4") == NULL && *status == 200 &&
        strcmp(path, "/metrics") == 0) {
        free(out);
        out = NULL;
    }
    free(buf);
    return out;
}

static void *read_http(void *arg)
{
    reader *r = arg;
    double last = 0;
    while (!atomic_load(r->stop) && r->failure[0] == '\0') {
        int status = 0;
        char *t = http_get(r->port, "GET", "/metrics", &status);
        if (t == NULL || status != 200)
            snprintf(r->failure, sizeof(r->failure), "GET /metrics: status %d", status);
        else
            check_scrape(t, &last, r->failure, sizeof(r->failure));
        free(t);
        r->reads++;
    }
    return NULL;
}

static void test_concurrent_metrics_reads(void **state)
{
    limits(UID_A, "a", "device 0 uuid=GPU-aaaa memory_mib=100000\n");
    limits(UID_B, "b", "device 0 uuid=GPU-aaaa memory_mib=100000\n");
    char uid_c[] = "c0c0c0c0-0000-0000-0000-000000000000";
    limits(uid_c, "c", "device 0 uuid=GPU-aaaa memory_mib=100000\n");
    cgroup_of(601, UID_A, CID_1);
    cgroup_of(602, UID_B, CID_2);
    cgroup_of(603, uid_c, CID_3);
    procs("0 601 1 0\n0 602 1 0\n0 603 1 0\n");
    dp_watch_config c = config(DP_ENFORCE_NONE);
    c.interval_s = 0.1; /* the smallest interval the config allows */
    dp_watcher *w = watcher(&c, NULL);
    kgpu_error err = {0};
    dp_metrics_server *srv = dp_metrics_server_start("127.0.0.1:0", w, &err);
    if (srv == NULL)
        fail_msg("%s", err.msg);
    int port = dp_metrics_server_port(srv);
    assert_true(port > 0);
    /* Routing before the thread starts: the probe and unknown paths. */
    int status = 0;
    char *body = http_get(port, "GET", "/healthz", &status);
    assert_int_equal(status, 200);
    free(body);
    body = http_get(port, "GET", "/nope", &status);
    assert_int_equal(status, 404);
    free(body);
    body = http_get(port, "POST", "/metrics", &status);
    assert_int_equal(status, 405);
    free(body);

    assert_int_equal(dp_watcher_start(w, &err), 0);
    atomic_bool stop = false;
    reader r[6];
    pthread_t th[6];
    for (int i = 0; i < 6; i++) {
        r[i] = (reader){.w = w, .port = port, .stop = &stop};
        assert_int_equal(pthread_create(&th[i], NULL, i < 4 ? read_direct : read_http, &r[i]), 0);
    }
    /* The script changes under the watcher: every container holds `gen` MiB. */
    for (int gen = 2; gen < 40; gen++) {
        char script[128];
        snprintf(script, sizeof(script), "0 601 %d 0\n0 602 %d 0\n0 603 %d 0\n", gen, gen, gen);
        procs(script);
        usleep(50000);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        if (r[i].failure[0] != '\0')
            fail_msg("reader %d: %s", i, r[i].failure);
        assert_true(r[i].reads > 5);
    }
    size_t len;
    char *t = dp_watcher_metrics(w, &len);
    assert_true(sample(t, "kgpu_watcher_scans_total") >= 10);
    assert_exposition(t);
    free(t);
    dp_metrics_server_stop(srv);
    dp_watcher_free(w);
}


/* Every metric the shipped Grafana dashboard queries is one the watcher exports. */
static void test_dashboard_queries_exported_metrics(void **state)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/deploy/grafana/kgpu-node.json", KGPU_SOURCE_DIR);
    json_error_t je;
    json_t *dash = json_load_file(path, 0, &je);
    if (dash == NULL)
        fail_msg("%s: %s", path, je.text);
    dp_watch_config c = config(DP_ENFORCE_NONE);
    dp_watcher *w = watcher(&c, NULL);
    size_t len;
    char *t = dp_watcher_metrics(w, &len);
    int checked = 0;
    json_t *panels = json_object_get(dash, "panels");
    assert_true(json_array_size(panels) >= 6);
    for (size_t i = 0; i < json_array_size(panels); i++) {
        json_t *targets = json_object_get(json_array_get(panels, i), "targets");
        assert_true(json_array_size(targets) >= 1);
        for (size_t j = 0; j < json_array_size(targets); j++) {
            json_t *target = json_array_get(targets, j);
            const char *expr = json_string_value(json_object_get(target, "expr"));
            assert_non_null(expr);
            for (const char *p = strstr(expr, "kgpu_"); p != NULL; p = strstr(p + 1, "kgpu_")) {
                bool inside = p > expr && (p[-1] == '_' || p[-1] == '"' ||
                                           (p[-1] >= 'a' && p[-1] <= 'z'));
                if (inside)
                    continue;
                char name[128], want[160];
                size_t n = 0;
                while (n + 1 < sizeof(name) && ((p[n] >= 'a' && p[n] <= 'z') || p[n] == '_'))
                    name[n] = p[n], n++;
                name[n] = '\0';
                snprintf(want, sizeof(want), "# TYPE %s ", name);
                if (strstr(t, want) == NULL)
                    fail_msg("the dashboard queries %s, which the watcher does not export", name);
                checked++;
            }
        }
    }
    assert_true(checked >= 10);
    free(t);
    dp_watcher_free(w);
    json_decref(dash);
}


/* ---- MIG devices (--mig-strategy) ---- */

/* kubelet's checkpoint holding two MIG devices: one per (pod, container). */
static void checkpoint(const char *path, const char *one_uid, const char *one,
                       const char *three_uid, const char *three)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "{\"Data\":{\"PodDeviceEntries\":["
             "{\"PodUID\":\"%s\",\"ContainerName\":\"train\",\"ResourceName\":"
             "\"nvidia.com/mig-1g.5gb\",\"DeviceIDs\":{\"-1\":[\"%s\"]},\"AllocResp\":\"Cg==\"},"
             "{\"PodUID\":\"%s\",\"ContainerName\":\"serve\",\"ResourceName\":"
             "\"nvidia.com/mig-3g.20gb\",\"DeviceIDs\":{\"-1\":[\"%s\"]},\"AllocResp\":\"Cg==\"}"
             "],\"RegisteredDevices\":{}},\"Checksum\":1}",
             one_uid, one, three_uid, three);
    write_file(path, text);
}

static void test_mig_devices_are_watched_per_instance(void **state)
{
    char mig_state[600], ckpt[600];
    snprintf(mig_state, sizeof(mig_state), "%s/mig-state", root);
    snprintf(ckpt, sizeof(ckpt), "%s/kubelet_internal_checkpoint", root);
    /* A 1g.5gb at slice 0 (GI 7) and a 3g.20gb at slice 4 (GI 2) on the A100, index 0. */
    write_file(mig_state, "gi GPU-aaaa 7 0 0\nci GPU-aaaa 7 0 0 0\n"
                          "gi GPU-aaaa 2 2 4\nci GPU-aaaa 2 0 2 0\n");
    setenv("FAKE_NVML_MIG", "0", 1);
    setenv("FAKE_NVML_MIG_STATE", mig_state, 1);
    kgpu_nvml *nv = NULL;
    kgpu_error err = {0};
    assert_int_equal(kgpu_nvml_open(fake_lib(), NULL, &nv, &err), 0);
    kgpu_gpu_info *gpus = NULL;
    int ngpus = 0;
    assert_int_equal(kgpu_nvml_discover(nv, &gpus, &ngpus, &err), 0);
    assert_int_equal(gpus[0].mig_mode, 1);
    kgpu_nvml_mig ms[8];
    int nm = 0;
    assert_int_equal(kgpu_nvml_mig_list(nv, 0, ms, 8, &nm, &err), 0);
    assert_int_equal(nm, 2);
    char one[96], three[96];
    snprintf(one, sizeof(one), "%s", ms[0].start == 0 ? ms[0].uuid : ms[1].uuid);
    snprintf(three, sizeof(three), "%s", ms[0].start == 0 ? ms[1].uuid : ms[0].uuid);
    free(gpus);
    kgpu_nvml_close(nv);

    checkpoint(ckpt, UID_A, one, UID_B, three);
    cgroup_of(201, UID_A, CID_1);
    cgroup_of(203, UID_B, CID_2);
    pid_t intruder = child_in(UID_X, CID_3); /* in the 3g device kubelet gave B */
    char script[256];
    snprintf(script, sizeof(script), "0:7:0 201 3000 0\n0:2:0 203 1000 0\n0:2:0 %d 500 0\n",
             (int)intruder);
    procs(script);
    dp_watch_config c = config(DP_ENFORCE_KILL);
    char sdir[600];
    snprintf(sdir, sizeof(sdir), "%s/state", root);
    dp_watch_sources src = {.node_name = "node-1", .state_dir = sdir, .nvml_lib = fake_lib(),
                            .kubelet_ckpt = ckpt};
    dp_watcher *w = dp_watcher_new(&c, &src, &err);
    assert_non_null(w);
    char *t = scan_text(w);
    assert_exposition(t);
    char a[300], b[300], x[300], k[400];
    snprintf(a, sizeof(a), LBL("", "", "", UID_A, CID_1, "0", "%s") "}", one);
    snprintf(b, sizeof(b), LBL("", "", "", UID_B, CID_2, "0", "%s") "}", three);
    snprintf(x, sizeof(x), LBL("", "", "", UID_X, CID_3, "0", "%s") "}", three);
    /* Each process is its MIG device's, against that instance's whole memory. */
    snprintf(k, sizeof(k), "kgpu_container_gpu_memory_used_bytes%s", a);
    assert_true(sample(t, k) == 3000.0 * MIB);
    snprintf(k, sizeof(k), "kgpu_container_gpu_memory_share_bytes%s", a);
    assert_true(sample(t, k) == 4864.0 * MIB);
    snprintf(k, sizeof(k), "kgpu_container_gpu_memory_share_bytes%s", b);
    assert_true(sample(t, k) == 19968.0 * MIB);
    snprintf(k, sizeof(k), "kgpu_container_gpu_unallocated%s", b);
    assert_true(sample(t, k) == 0);
    /* Another pod's process in B's device: over a share of zero, and killed. */
    snprintf(k, sizeof(k), "kgpu_container_gpu_memory_share_bytes%s", x);
    assert_true(sample(t, k) == 0);
    snprintf(k, sizeof(k), "kgpu_container_gpu_unallocated%s", x);
    assert_true(sample(t, k) == 1);
    assert_true(killed(intruder));
    snprintf(k, sizeof(k),
             "kgpu_watcher_gpu_processes{gpu=\"0\",gpu_uuid=\"%s\",kind=\"other_pod\"}", three);
    assert_true(sample(t, k) == 1);
    snprintf(k, sizeof(k),
             "kgpu_watcher_gpu_processes{gpu=\"0\",gpu_uuid=\"%s\",kind=\"kgpu_container\"}",
             three);
    assert_true(sample(t, k) == 1);
    free(t);

    /* kubelet's record unreadable: no MIG share is known, so nothing is judged over. */
    write_file(ckpt, "{not json");
    procs("0:7:0 201 3000 0\n");
    t = scan_text(w);
    snprintf(k, sizeof(k), "kgpu_container_gpu_memory_share_bytes%s", a);
    assert_true(sample(t, k) < 0 || strstr(t, k) == NULL);
    snprintf(k, sizeof(k), "kgpu_container_gpu_unallocated%s", a);
    assert_true(sample(t, k) == 0);
    free(t);

    /* The 1g device is destroyed and its process gone: its series go with it. */
    checkpoint(ckpt, UID_A, one, UID_B, three);
    write_file(mig_state, "gi GPU-aaaa 2 2 4\nci GPU-aaaa 2 0 2 0\n");
    procs("0:2:0 203 1000 0\n");
    t = scan_text(w);
    assert_null(strstr(t, one));
    snprintf(k, sizeof(k), "kgpu_container_gpu_memory_share_bytes%s", b);
    assert_true(sample(t, k) == 19968.0 * MIB);
    free(t);
    dp_watcher_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cgroup_forms),
        cmocka_unit_test(test_config),
        cmocka_unit_test_setup_teardown(test_nvml_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvml_processes_v1_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scan_maps_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_over_share_kills_only_the_offender, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_kill_only_when_enforced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enforce_none_reports_once_per_episode, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_core_over_share_after_grace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_and_watcher_agree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schedule_tamperer_is_caught_under_contention, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_gpu_not_given_is_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvml_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_and_events_from_the_api, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unallocated_pods_are_over_a_zero_share, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_metrics_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dashboard_queries_exported_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mig_devices_are_watched_per_instance, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
