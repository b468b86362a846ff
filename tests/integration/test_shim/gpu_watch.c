/*
 * The device plugin's watcher against the real NVML (scripts/gpu-check.sh;
 * docs/shim.md, "On a real GPU"). Two processes on GPU 0 stand for two
 * containers of two pods, through a /proc of cgroup files made here (the
 * watcher's procRoot) and limits files as Allocate writes them, each a
 * 1024 MiB share: "within" runs with libkgpu-limit.so and holds 256 MiB;
 * "hog" runs without it, as a static binary would, holds 1536 MiB and keeps
 * the GPU busy. With enforce: kill the watcher must see both through NVML,
 * report the hog over its memory share and kill it, and leave the other
 * alone. Exits 77 without NVML or a GPU, or when NVML does not list this
 * PID namespace's processes (a container without the host's PIDs).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dp.h"
#include "log.h"
#include "gpu.h"
#include "watcher.h"

#define UID_A "0a0a0a0a-0000-4000-8000-000000000001"
#define UID_B "0b0b0b0b-0000-4000-8000-000000000002"
#define CID_A "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
#define CID_B "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"

static char root[] = "/tmp/kgpu-gpu-watch-XXXXXX";
static int failures;

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* The pod's limits file, as Allocate writes it; its path in *out. */
static void pod(const char *uid, const char *uuid, char *out, size_t cap)
{
    char path[300], text[300];
    snprintf(path, sizeof(path), "%s/state/pods/%s", root, uid);
    mkdir(path, 0700);
    snprintf(out, cap, "%s/state/pods/%s/main.limits", root, uid);
    snprintf(text, sizeof(text), "# kgpu limits v1\ndevice 0 uuid=%s memory_mib=1024 core_pct=50\n",
             uuid);
    write_text(out, text);
}

/* The kernel's record of the process's cgroup, as a containerd pod under systemd has it. */
static void cgroup(pid_t pid, const char *uid, const char *cid)
{
    char path[300], text[400], u[40];
    snprintf(u, sizeof(u), "%s", uid);
    for (char *p = u; *p; p++)
        if (*p == '-')
            *p = '_';
    snprintf(path, sizeof(path), "%s/proc/%d", root, (int)pid);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/proc/%d/cgroup", root, (int)pid);
    snprintf(text, sizeof(text),
             "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/"
             "cri-containerd-%s.scope\n",
             u, cid);
    write_text(path, text);
}

/* Starts shim_gpu_real hold ...; returns once it holds its memory (or has ended). */
static pid_t start(const char *limits, char *const args[])
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (limits != NULL) {
            char shared[300];
            snprintf(shared, sizeof(shared), "%s/shared", root);
            setenv("KGPU_LIMITS_FILE", limits, 1);
            setenv("KGPU_SHARED_DIR", shared, 1);
            setenv("KGPU_CONTAINER", "main", 1);
            const char *lib = getenv("KGPU_GPU_CHECK_LIB");
            setenv("LD_PRELOAD", lib != NULL ? lib : KGPU_SHIM_LIB, 1);
        }
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execv(args[0], args);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[256];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        printf("  [%d] %s", (int)pid, line);
        if (strncmp(line, "holding", 7) == 0)
            break;
    }
    if (f != NULL)
        fclose(f); /* the child's later lines go nowhere; it writes few */
    return pid;
}

/* The value of `family` for container `cid` in the metrics text, or -1. */
static double sample(const char *text, const char *family, const char *cid, const char *extra)
{
    char want[200];
    snprintf(want, sizeof(want), "container_id=\"%s\"", cid);
    size_t n = strlen(family);
    for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char line[2048];
        if (len >= sizeof(line) || strncmp(l, family, n) != 0 || l[n] != '{')
            continue;
        memcpy(line, l, len);
        line[len] = '\0';
        if (strstr(line, want) == NULL || (extra != NULL && strstr(line, extra) == NULL))
            continue;
        const char *v = strrchr(line, ' ');
        return v ? strtod(v + 1, NULL) : -1;
    }
    return -1;
}

static int run(void)
{
    kgpu_error err = {0};
    kgpu_nvml *nv = NULL;
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    if (kgpu_nvml_open(NULL, NULL, &nv, &err) != 0 ||
        kgpu_nvml_discover(nv, &gpus, &n, &err) != 0 || n < 1) {
        printf("skipped: no NVML or no GPU here (%s)\n", err.msg);
        kgpu_nvml_close(nv);
        free(gpus);
        return 77;
    }
    char uuid[sizeof(gpus[0].uuid)];
    snprintf(uuid, sizeof(uuid), "%s", gpus[0].uuid);
    printf("watcher: GPU 0 %s (%s), real NVML\n", uuid, gpus[0].model);
    free(gpus);
    kgpu_nvml_close(nv);

    if (mkdtemp(root) == NULL)
        return 1;
    char path[300], limits_a[300], limits_b[300];
    static const char *const dirs[] = {"proc", "shared", "state", "state/pods"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", root, dirs[i]);
        mkdir(path, 0700);
    }
    pod(UID_A, uuid, limits_a, sizeof(limits_a));
    pod(UID_B, uuid, limits_b, sizeof(limits_b));
    /* KGPU_GPU_CHECK_REAL, like KGPU_GPU_CHECK_LIB: where a build folder was moved. */
    char *real = getenv("KGPU_GPU_CHECK_REAL") ? getenv("KGPU_GPU_CHECK_REAL") : KGPU_GPU_REAL;
    char *within_args[] = {real, "hold", "256", "60", NULL};
    char *hog_args[] = {real, "hold", "1536", "60", "spin", NULL};
    pid_t within = start(limits_a, within_args), hog = start(NULL, hog_args);
    cgroup(within, UID_A, CID_A);
    cgroup(hog, UID_B, CID_B);

    dp_watch_config c;
    dp_watch_config_defaults(&c);
    c.enforce = DP_ENFORCE_KILL;
    c.events = false;
    snprintf(c.proc_root, sizeof(c.proc_root), "%s/proc", root);
    snprintf(path, sizeof(path), "%s/state", root);
    dp_watch_sources src = {.node_name = "", .state_dir = path};
    dp_watcher *w = dp_watcher_new(&c, &src, &err);
    int seen = 0, hog_killed = 0, rc = 0;
    double used_a = -1, used_b = -1, core_b = -1;
    for (int scan = 1; scan <= 10 && w != NULL && !hog_killed; scan++) {
        sleep(1);
        if (dp_watcher_scan(w, &err) != 0) {
            printf("FAIL: scan: %s\n", err.msg);
            failures++;
            break;
        }
        size_t len;
        char *t = dp_watcher_metrics(w, &len);
        if (t == NULL)
            break;
        double a = sample(t, "kgpu_container_gpu_memory_used_bytes", CID_A, NULL);
        double b = sample(t, "kgpu_container_gpu_memory_used_bytes", CID_B, NULL);
        double over_a = sample(t, "kgpu_container_gpu_throttled", CID_A, "\"memory\"");
        double over_b = sample(t, "kgpu_container_gpu_throttled", CID_B, "\"memory\"");
        double cb = sample(t, "kgpu_container_gpu_core_used_percent", CID_B, NULL);
        printf("scan %d: within %.0f MiB (over: %.0f), hog %.0f MiB (over: %.0f), hog's SM "
               "%.0f %%\n",
               scan, a / 1048576, over_a, b / 1048576, over_b, cb);
        seen |= a > 0 || b > 0;
        used_a = a > used_a ? a : used_a;
        used_b = b > used_b ? b : used_b;
        core_b = cb > core_b ? cb : core_b;
        if (over_a > 0) {
            printf("FAIL: the container within its share is reported over it\n");
            failures++;
        }
        free(t);
        int st;
        if (waitpid(hog, &st, WNOHANG) == hog) {
            hog_killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
            if (!hog_killed) {
                printf("FAIL: the hog ended by itself (status %d)\n", st);
                failures++;
                hog = -1;
                break;
            }
            hog = -1;
        }
    }
    if (!seen) {
        printf("skipped: NVML showed no memory for either process (run in a container "
               "without the host's PIDs, or a GPU without per-process figures?)\n");
        rc = 77;
    } else {
        printf("watcher: within used %.0f MiB of 1024, hog %.0f MiB of 1024 (SM up to %.0f %%)"
               "; hog %s\n",
               used_a / 1048576, used_b / 1048576, core_b, hog_killed ? "killed" : "NOT killed");
        if (used_a < 256.0 * 1048576) {
            printf("FAIL: NVML's figure for the container within its share is below its 256 MiB\n");
            failures++;
        }
        if (!hog_killed) {
            printf("FAIL: enforce: kill did not kill the process over its memory share\n");
            failures++;
        }
        if (kill(within, 0) != 0 || waitpid(within, NULL, WNOHANG) == within) {
            printf("FAIL: the container within its share did not survive\n");
            failures++;
        }
        rc = failures != 0;
    }
    dp_watcher_free(w);
    if (hog > 0)
        kill(hog, SIGKILL);
    kill(within, SIGKILL);
    while (wait(NULL) > 0 || errno == EINTR)
        ;
    snprintf(path, sizeof(path), "rm -rf '%s'", root);
    if (system(path) != 0)
        printf("could not remove %s\n", root);
    printf("%s\n", rc == 77 ? "skipped" : rc ? "FAILED" : "ok");
    return rc;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    kgpu_log_set_level(KGPU_LOG_WARN);
    return run();
}
