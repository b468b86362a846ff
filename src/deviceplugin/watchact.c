/*
 * What the watcher does about a container over its share (watchstate.h):
 * a Warning Event, and with `enforce: kill` SIGKILL to its GPU processes
 * when memory is over, each process checked again to still be that
 * container's before it is killed (pidfd).
 *
 * Why memory only is killed: memory taken past a share makes the
 * neighbours' allocations fail (their work is lost), so stopping the
 * offender is proportionate. Compute taken past a share slows neighbours
 * down, and only while the GPU is contended; the interception library
 * throttles launches for that, and the watcher reports it (Event, metric)
 * after coreGraceScans scans in a row, never kills for it.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "watcher.h"
#include "watchstate.h"

/* ---- acting ---- */

/* Posts a Warning Event on the entry's pod; counts the outcome. */
static void post_event(dp_watcher *w, const wentry *e, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void post_event(dp_watcher *w, const wentry *e, const char *reason, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kgpu_log(KGPU_LOG_WARN, "watcher: pod %s/%s container %s: %s", e->ns[0] ? e->ns : "?",
             e->pod[0] ? e->pod : e->id.pod_uid, e->name[0] ? e->name : e->id.container_id, msg);
    if (!w->cfg.events || w->k8s == NULL || e->ns[0] == '\0' || e->pod[0] == '\0')
        return;
    char field[128];
    snprintf(field, sizeof(field), "spec.containers{%s}", e->name);
    kgpu_k8s_pod_event ev = {.ns = e->ns,
                             .pod = e->pod,
                             .uid = e->id.pod_uid,
                             .field_path = e->name[0] ? field : NULL,
                             .type = "Warning",
                             .reason = reason,
                             .message = msg,
                             .component = "kgpu-device-plugin",
                             .instance = w->node};
    kgpu_error err;
    kgpu_error_clear(&err);
    if (kgpu_k8s_post_pod_event(w->k8s, &ev, &err) == 0) {
        w->events_posted++;
    } else {
        w->events_failed++;
        kgpu_log(KGPU_LOG_WARN, "watcher: posting Event %s on pod %s/%s failed: %s", reason,
                 e->ns, e->pod, err.msg);
    }
}

static int sys_pidfd_open(unsigned pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static int sys_pidfd_kill(int fd)
{
#ifdef SYS_pidfd_send_signal
    return (int)syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
#else
    errno = ENOSYS;
    return -1;
#endif
}

/*
 * SIGKILL to `pid` if, and only if, it still is a process of the container
 * `want`. The pidfd is taken before the cgroup is read again, so a PID
 * reused after that check would be another pidfd's process: the signal goes
 * to the process that was checked or to nobody. 1 = killed, 0 = not (gone,
 * or not the container's any more), -1 = failed.
 */
static int kill_checked(const dp_watcher *w, unsigned pid, const dp_cgroup_id *want)
{
    int fd = sys_pidfd_open(pid);
    if (fd < 0 && errno == ESRCH)
        return 0;
    bool have_fd = fd >= 0;
    if (!have_fd && errno != ENOSYS)
        return -1;
    dp_cgroup_id now;
    int rc = 0;
    if (dp_watch_process_container(w, pid, &now) == KGPU_OK &&
        strcmp(now.container_id, want->container_id) == 0 &&
        strcmp(now.pod_uid, want->pod_uid) == 0) {
        int r = have_fd ? sys_pidfd_kill(fd) : kill((pid_t)pid, SIGKILL);
        rc = r == 0 ? 1 : errno == ESRCH ? 0 : -1;
    }
    if (have_fd)
        close(fd);
    return rc;
}

/*
 * Whether another container used e's GPU in this scan. A compute share is a
 * guarantee while the GPU is contended, not a ceiling: the library lends an
 * idle GPU to a container alone on it (docs/shim.md, "Compute shares").
 */
static bool contended(const dp_watcher *w, const wentry *e)
{
    for (int i = 0; i < w->nentries; i++) {
        const wentry *o = &w->entries[i];
        if (o != e && o->gpu == e->gpu && o->sm > 0)
            return true;
    }
    return false;
}

/*
 * Compares the entry with its share and acts on what changed: kills first
 * (enforce: kill, memory), then Events, so a slow API server delays only
 * the Event.
 */
void dp_watch_judge(dp_watcher *w, wentry *e)
{
    const kgpu_gpu_info *g = &w->gpus[e->gpu];
    /* Without a share, any GPU memory is over it, even what NVML cannot count. */
    bool mem_over = e->unallocated
                        ? e->used < 0 || e->used > w->cfg.memory_slack_mib * MIB
                        : e->share >= 0 && e->used >= 0 &&
                              e->used > e->share + w->cfg.memory_slack_mib * MIB;
    bool core_now = e->core_share >= 0 && e->core_share < 100 &&
                    e->sm > e->core_share + w->cfg.core_slack_pct && contended(w, e);
    e->core_streak = core_now ? e->core_streak + 1 : 0;
    bool core_over = e->core_streak >= w->cfg.core_grace_scans;
    bool mem_began = mem_over && !e->mem_over, core_began = core_over && !e->core_over;
    e->mem_over = mem_over;
    e->core_over = core_over;
    if (!mem_over)
        e->killed_event = e->kill_fail_said = false;

    int killed = 0, failed = 0;
    if (mem_over && w->cfg.enforce == DP_ENFORCE_KILL) {
        for (int i = 0; i < e->npids; i++) {
            int r = kill_checked(w, e->pids[i], &e->id);
            killed += r > 0;
            failed += r < 0;
        }
        e->killed += (uint64_t)killed;
        w->kills += (uint64_t)killed;
        w->kill_failures += (uint64_t)failed;
        if (failed > 0 && !e->kill_fail_said) {
            /* Once per episode: it fails again at every scan while it lasts. */
            e->kill_fail_said = true;
            kgpu_log(KGPU_LOG_ERROR,
                     "watcher: %d GPU process(es) of container %s could not be killed (the KILL "
                     "capability or the host PID namespace missing?)",
                     failed, e->id.container_id);
        }
    }
    if (mem_began && e->unallocated) {
        e->mem_episodes++;
        post_event(w, e, "GPUWithoutAllocation",
                   "uses GPU %d (%s), %" PRId64 " MiB, which kgpu did not allocate it (a GPU "
                   "reached around kgpu, e.g. NVIDIA_VISIBLE_DEVICES set in the pod)%s",
                   g->index, g->uuid, e->used < 0 ? 0 : e->used / MIB,
                   w->cfg.enforce == DP_ENFORCE_KILL ? "; its GPU processes are killed" : "");
    } else if (mem_began) {
        e->mem_episodes++;
        post_event(w, e, "GPUMemoryOverShare",
                   "uses %" PRId64 " MiB of GPU %d (%s), over its share of %" PRId64 " MiB%s",
                   e->used / MIB, g->index, g->uuid, e->share / MIB,
                   w->cfg.enforce == DP_ENFORCE_KILL ? "; its GPU processes are killed" : "");
    }
    if (killed > 0 && !e->killed_event) {
        e->killed_event = true;
        post_event(w, e, "GPUShareEnforced",
                   "killed %d GPU process(es) on GPU %d (%s): %" PRId64 " MiB used, share %" PRId64
                   " MiB (enforce: kill)",
                   killed, g->index, g->uuid, e->used / MIB, e->share / MIB);
    }
    if (core_began) {
        e->core_episodes++;
        post_event(w, e, "GPUCoreOverShare",
                   "used %d%% of GPU %d (%s) for %d scans in a row while other containers "
                   "used it too, over its share of %d%%",
                   e->sm, g->index, g->uuid, e->core_streak, e->core_share);
    }
}
