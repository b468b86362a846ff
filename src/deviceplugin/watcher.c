/*
 * The watcher thread: every interval it asks NVML which processes use each
 * GPU and how much, maps each process to its pod's container through the
 * kernel's cgroup record, compares the container's total with the share in
 * its limits file, and acts: metrics always, a Kubernetes Event when a
 * container goes over, SIGKILL to that container's GPU processes when the
 * operator chose `enforce: kill` and it is memory that is over.
 *
 * Why memory only is killed: memory taken past a share makes the
 * neighbours' allocations fail (their work is lost), so stopping the
 * offender is proportionate. Compute taken past a share slows neighbours
 * down, and only while the GPU is contended; the interception library
 * throttles launches for that, and the watcher reports it (Event, metric)
 * after coreGraceScans scans in a row, never kills for it.
 *
 * Ownership: see watcher.h. Everything below except `pub*` belongs to the
 * owner thread.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "dp.h"
#include "fileio.h"
#include "gpu.h"
#include "k8s.h"
#include "kgpu/model.h"
#include "shimlimits.h"
#include "watcher.h"

#define MIB                ((int64_t)1024 * 1024)
#define ENTRIES_MAX        4096 /* (container, GPU) pairs tracked; more are counted, not kept */
#define ENTRY_PIDS_MAX     64   /* GPU processes of one container on one GPU that can be killed */
#define POD_CONTAINERS_MAX 48   /* init, app and ephemeral containers of one pod */
#define LIST_EVERY_S       10   /* at most one pod list per this, when a container is unknown */
#define CGROUP_FILE_MAX    65536

/* Process kinds counted per GPU (the kgpu_watcher_gpu_processes metric). */
enum { K_CONTAINER, K_OTHER_POD, K_HOST, K_UNREADABLE, K_NKINDS };
static const char *const kind_names[K_NKINDS] = {"kgpu_container", "other_pod", "host",
                                                 "unreadable"};

/* One container's use of one GPU; kept from scan to scan while it lasts. */
typedef struct wentry {
    dp_cgroup_id id;
    int gpu; /* position in w->gpus */
    char ns[KGPU_NAME_MAX + 1], pod[KGPU_NAME_MAX + 1], name[64]; /* "" until known */
    int64_t used;       /* bytes this scan; -1 when NVML could not tell for a process */
    int sm;             /* SM % summed over its processes, capped at 100 */
    int64_t share;      /* bytes; -1 when no limits file says */
    int core_share;     /* percent; -1 when no limits file says */
    int npids;          /* in pids; more processes are counted in nprocs */
    int nprocs;         /* GPU processes this scan */
    unsigned pids[ENTRY_PIDS_MAX];
    bool mem_over, core_over;
    int core_streak;     /* scans in a row with compute over share + slack */
    bool killed_event;   /* an Event already said this episode's processes were killed */
    bool kill_fail_said; /* the log already said this episode's kills failed */
    uint64_t mem_episodes, core_episodes, killed;
    bool seen;
} wentry;

/* A pod of this node as the API server last listed it. */
typedef struct wpod {
    char uid[DP_POD_UID_MAX];
    char ns[KGPU_NAME_MAX + 1], name[KGPU_NAME_MAX + 1];
    int ncont;
    struct {
        char id[DP_CONTAINER_ID_MAX];
        char name[64];
    } cont[POD_CONTAINERS_MAX];
} wpod;

struct dp_watcher {
    dp_watch_config cfg;
    kgpu_k8s *k8s;
    char node[KGPU_NAME_MAX + 1];
    char state_dir[1024];
    char nvml_lib[1024];

    /* The owner thread's. */
    kgpu_nvml *nv;
    kgpu_gpu_info *gpus;
    int ngpus;
    wentry *entries;
    int nentries;
    wpod *pods;
    int npods;
    double listed_at; /* monotonic seconds of the last pod list; 0 = never */
    bool up;
    char last_error[512];
    uint64_t scans, scan_errors, events_posted, events_failed, kills, kill_failures;
    uint64_t dropped; /* (container, GPU) pairs over ENTRIES_MAX, summed over scans */
    int kinds[KGPU_MAX_GPUS_PER_NODE][K_NKINDS];
    double last_scan_unix, last_scan_s;

    /* Published text: pub_mu guards pub and pub_len, nothing else. */
    pthread_mutex_t pub_mu;
    char *pub;
    size_t pub_len;

    /* The thread. */
    pthread_t thread;
    bool started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop; /* under stop_mu */
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double unix_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- text buffer ---- */

typedef struct tbuf {
    char *p;
    size_t len, cap;
    bool oom;
} tbuf;

static void tb_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(tbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p != NULL && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A label value, escaped as the text format wants (backslash, quote, newline). */
static void tb_label(tbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            tb_printf(b, "\\\\");
        else if (*v == '"')
            tb_printf(b, "\\\"");
        else if (*v == '\n')
            tb_printf(b, "\\n");
        else
            tb_printf(b, "%c", *v);
    }
}

/* ---- life cycle ---- */

static void render(dp_watcher *w);

dp_watcher *dp_watcher_new(const dp_watch_config *cfg, const dp_watch_sources *src,
                           kgpu_error *err)
{
    dp_watcher *w = calloc(1, sizeof(*w));
    if (w != NULL)
        w->entries = calloc(ENTRIES_MAX, sizeof(*w->entries));
    if (w == NULL || w->entries == NULL) {
        free(w);
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    w->cfg = *cfg;
    w->k8s = src->k8s;
    snprintf(w->node, sizeof(w->node), "%s", src->node_name ? src->node_name : "");
    snprintf(w->state_dir, sizeof(w->state_dir), "%s", src->state_dir ? src->state_dir : "");
    snprintf(w->nvml_lib, sizeof(w->nvml_lib), "%s", src->nvml_lib ? src->nvml_lib : "");
    pthread_mutex_init(&w->pub_mu, NULL);
    pthread_mutex_init(&w->stop_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->stop_cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(w->last_error, sizeof(w->last_error), "no scan yet");
    render(w); /* /metrics answers from the start, with kgpu_watcher_up 0 */
    return w;
}

/* ---- NVML ---- */

static int ensure_nvml(dp_watcher *w, kgpu_error *err)
{
    if (w->nv != NULL)
        return KGPU_OK;
    kgpu_nvml *nv = NULL;
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    int rc = kgpu_nvml_open(w->nvml_lib[0] ? w->nvml_lib : NULL, NULL, &nv, err);
    if (rc == KGPU_OK)
        rc = kgpu_nvml_discover(nv, &gpus, &n, err);
    if (rc != KGPU_OK) {
        kgpu_nvml_close(nv);
        return rc;
    }
    if (n > KGPU_MAX_GPUS_PER_NODE)
        n = KGPU_MAX_GPUS_PER_NODE;
    w->nv = nv;
    free(w->gpus);
    w->gpus = gpus;
    w->ngpus = n;
    return KGPU_OK;
}

/* ---- which container a process belongs to ---- */

/* 0 with *id filled, or the parser's code (KGPU_ENOENT: not a pod's container). */
static int process_container(const dp_watcher *w, unsigned pid, dp_cgroup_id *id)
{
    char path[DP_WATCH_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/%u/cgroup", w->cfg.proc_root, pid);
    char *buf = NULL;
    size_t len = 0;
    kgpu_error e = {0};
    if (kgpu_read_file_max(path, CGROUP_FILE_MAX, &buf, &len, &e) != KGPU_OK)
        return KGPU_EIO; /* gone already, or not ours to read */
    int rc = dp_cgroup_parse(buf, len, id, &e);
    free(buf);
    return rc;
}

static bool is_kgpu_pod(const dp_watcher *w, const char *uid)
{
    char path[1200];
    struct stat st;
    snprintf(path, sizeof(path), "%s/pods/%s", w->state_dir, uid);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static wentry *entry_for(dp_watcher *w, const dp_cgroup_id *id, int gpu)
{
    for (int i = 0; i < w->nentries; i++) {
        wentry *e = &w->entries[i];
        if (e->gpu == gpu && strcmp(e->id.container_id, id->container_id) == 0 &&
            strcmp(e->id.pod_uid, id->pod_uid) == 0)
            return e;
    }
    if (w->nentries >= ENTRIES_MAX)
        return NULL;
    wentry *e = &w->entries[w->nentries++];
    memset(e, 0, sizeof(*e));
    e->id = *id;
    e->gpu = gpu;
    e->share = -1;
    e->core_share = -1;
    return e;
}

/* The pod list's containerID is "<runtime>://<id>". */
static const char *bare_container_id(const char *s)
{
    const char *p = s != NULL ? strstr(s, "://") : NULL;
    return p != NULL ? p + 3 : s;
}

static void pod_from_json(json_t *item, wpod *p)
{
    memset(p, 0, sizeof(*p));
    json_t *meta = json_object_get(item, "metadata");
    snprintf(p->uid, sizeof(p->uid), "%s", json_string_value(json_object_get(meta, "uid")) ?: "");
    snprintf(p->ns, sizeof(p->ns), "%s",
             json_string_value(json_object_get(meta, "namespace")) ?: "");
    snprintf(p->name, sizeof(p->name), "%s",
             json_string_value(json_object_get(meta, "name")) ?: "");
    static const char *const lists[] = {"initContainerStatuses", "containerStatuses",
                                        "ephemeralContainerStatuses"};
    json_t *status = json_object_get(item, "status");
    for (size_t l = 0; l < 3; l++) {
        json_t *arr = json_object_get(status, lists[l]);
        for (size_t i = 0; i < json_array_size(arr) && p->ncont < POD_CONTAINERS_MAX; i++) {
            json_t *c = json_array_get(arr, i);
            const char *id =
                bare_container_id(json_string_value(json_object_get(c, "containerID")));
            const char *name = json_string_value(json_object_get(c, "name"));
            if (id == NULL || name == NULL || strlen(id) >= DP_CONTAINER_ID_MAX)
                continue;
            snprintf(p->cont[p->ncont].id, sizeof(p->cont[0].id), "%s", id);
            snprintf(p->cont[p->ncont].name, sizeof(p->cont[0].name), "%s", name);
            p->ncont++;
        }
    }
}

/* Replaces the pod cache with a fresh list of this node's pods. */
static void list_pods(dp_watcher *w)
{
    w->listed_at = mono_s();
    char query[KGPU_K8S_PATH_MAX];
    snprintf(query, sizeof(query), "fieldSelector=spec.nodeName%%3D%s", w->node);
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_error e = {0};
    if (kgpu_k8s_list(w->k8s, "/api/v1/pods", query, NULL, &items, rv, sizeof(rv), NULL, &e) !=
        0) {
        dp_log(DP_WARN, "watcher: listing the node's pods: %s", e.msg);
        return;
    }
    size_t n = json_array_size(items);
    wpod *pods = calloc(n ? n : 1, sizeof(*pods));
    if (pods == NULL) {
        json_decref(items);
        return;
    }
    for (size_t i = 0; i < n; i++)
        pod_from_json(json_array_get(items, i), &pods[i]);
    json_decref(items);
    free(w->pods);
    w->pods = pods;
    w->npods = (int)n;
}

/* Fills the entry's names from the cache; false when the cache does not know it. */
static bool resolve_from_cache(const dp_watcher *w, wentry *e)
{
    for (int i = 0; i < w->npods; i++) {
        const wpod *p = &w->pods[i];
        if (strcmp(p->uid, e->id.pod_uid) != 0)
            continue;
        snprintf(e->ns, sizeof(e->ns), "%s", p->ns);
        snprintf(e->pod, sizeof(e->pod), "%s", p->name);
        for (int c = 0; c < p->ncont; c++)
            if (strcmp(p->cont[c].id, e->id.container_id) == 0) {
                snprintf(e->name, sizeof(e->name), "%s", p->cont[c].name);
                return true;
            }
        return false;
    }
    return false;
}

/*
 * Without the container's name from the API server: a pod whose directory
 * holds exactly one limits file has one GPU container, so it is that one.
 */
static void resolve_single(const dp_watcher *w, wentry *e)
{
    char dir[1200];
    snprintf(dir, sizeof(dir), "%s/pods/%s", w->state_dir, e->id.pod_uid);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    int found = 0;
    char name[64] = "";
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t n = strlen(de->d_name);
        if (n > 7 && strcmp(de->d_name + n - 7, ".limits") == 0 && n - 7 < sizeof(name)) {
            found++;
            snprintf(name, sizeof(name), "%.*s", (int)(n - 7), de->d_name);
        }
    }
    closedir(d);
    if (found == 1)
        snprintf(e->name, sizeof(e->name), "%s", name);
}

/* The share of the entry's container on its GPU, from the limits file Allocate wrote. */
static void read_share(const dp_watcher *w, wentry *e)
{
    e->share = -1;
    e->core_share = -1;
    if (e->name[0] == '\0' || strchr(e->name, '/') != NULL)
        return;
    char path[1400];
    snprintf(path, sizeof(path), "%s/pods/%s/%s.limits", w->state_dir, e->id.pod_uid, e->name);
    char *buf = NULL;
    size_t len = 0;
    kgpu_error err = {0};
    if (kgpu_read_file_max(path, 64 * 1024, &buf, &len, &err) != KGPU_OK)
        return;
    kgpu_shim_limits lim;
    int rc = kgpu_shim_limits_parse(buf, len, path, &lim, &err);
    free(buf);
    if (rc != KGPU_OK) {
        dp_log(DP_WARN, "watcher: %s", err.msg);
        return;
    }
    int k = kgpu_shim_limits_find(&lim, w->gpus[e->gpu].uuid);
    if (k < 0) {
        /* A GPU the container was not given: its share there is nothing. */
        e->share = 0;
        e->core_share = 0;
        return;
    }
    e->share = (int64_t)lim.dev[k].memory_mib * MIB;
    e->core_share = lim.dev[k].core_pct < 0 ? 100 : lim.dev[k].core_pct;
}

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
    dp_log(DP_WARN, "watcher: pod %s/%s container %s: %s", e->ns[0] ? e->ns : "?",
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
        dp_log(DP_WARN, "watcher: posting Event %s on pod %s/%s failed: %s", reason, e->ns, e->pod,
               err.msg);
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
    if (process_container(w, pid, &now) == KGPU_OK &&
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
static void judge(dp_watcher *w, wentry *e)
{
    const kgpu_gpu_info *g = &w->gpus[e->gpu];
    bool mem_over =
        e->share >= 0 && e->used >= 0 && e->used > e->share + w->cfg.memory_slack_mib * MIB;
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
            dp_log(DP_ERROR,
                   "watcher: %d GPU process(es) of container %s could not be killed (the KILL "
                   "capability or the host PID namespace missing?)",
                   failed, e->id.container_id);
        }
    }
    if (mem_began) {
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

/* ---- metrics ---- */

/* The label set of an entry, without its closing brace (callers may add labels). */
static void entry_labels(tbuf *b, const dp_watcher *w, const wentry *e)
{
    tb_printf(b, "{namespace=\"");
    tb_label(b, e->ns);
    tb_printf(b, "\",pod=\"");
    tb_label(b, e->pod);
    tb_printf(b, "\",container=\"");
    tb_label(b, e->name);
    tb_printf(b, "\",pod_uid=\"%s\",container_id=\"%s\",gpu=\"%d\",gpu_uuid=\"", e->id.pod_uid,
              e->id.container_id, w->gpus[e->gpu].index);
    tb_label(b, w->gpus[e->gpu].uuid);
    tb_printf(b, "\"");
}

static void family(tbuf *b, const char *name, const char *type, const char *help)
{
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One per-container family: `what` picks the value; entries without one are left out. */
enum { V_USED, V_SHARE, V_CORE, V_CORE_SHARE, V_PROCS, V_KILLED };

static void entry_family(tbuf *b, const dp_watcher *w, const char *name, const char *type,
                         const char *help, int what)
{
    family(b, name, type, help);
    for (int i = 0; i < w->nentries; i++) {
        const wentry *e = &w->entries[i];
        long long v;
        switch (what) {
        case V_USED:
            v = e->used;
            break;
        case V_SHARE:
            v = e->share;
            break;
        case V_CORE:
            v = e->sm;
            break;
        case V_CORE_SHARE:
            v = e->core_share;
            break;
        case V_PROCS:
            v = e->nprocs;
            break;
        default:
            v = (long long)e->killed;
            break;
        }
        if (v < 0)
            continue;
        tb_printf(b, "%s", name);
        entry_labels(b, w, e);
        tb_printf(b, "} %lld\n", v);
    }
}

static void render(dp_watcher *w)
{
    tbuf b = {0};
    family(&b, "kgpu_watcher_up", "gauge",
           "1 when the last scan read every GPU's processes from NVML, 0 when it failed.");
    tb_printf(&b, "kgpu_watcher_up %d\n", w->up ? 1 : 0);
    family(&b, "kgpu_watcher_scans_total", "counter", "Scans of the GPUs' processes.");
    tb_printf(&b, "kgpu_watcher_scans_total %" PRIu64 "\n", w->scans);
    family(&b, "kgpu_watcher_scan_errors_total", "counter",
           "Scans that failed (NVML unavailable or a GPU not answering).");
    tb_printf(&b, "kgpu_watcher_scan_errors_total %" PRIu64 "\n", w->scan_errors);
    family(&b, "kgpu_watcher_last_scan_timestamp_seconds", "gauge",
           "Unix time the last scan finished.");
    tb_printf(&b, "kgpu_watcher_last_scan_timestamp_seconds %.3f\n", w->last_scan_unix);
    family(&b, "kgpu_watcher_scan_duration_seconds", "gauge", "How long the last scan took.");
    tb_printf(&b, "kgpu_watcher_scan_duration_seconds %.6f\n", w->last_scan_s);
    family(&b, "kgpu_watcher_gpu_processes", "gauge",
           "GPU processes in the last scan, by GPU and by what they belong to.");
    for (int g = 0; g < w->ngpus; g++)
        for (int k = 0; k < K_NKINDS; k++) {
            tb_printf(&b, "kgpu_watcher_gpu_processes{gpu=\"%d\",gpu_uuid=\"", w->gpus[g].index);
            tb_label(&b, w->gpus[g].uuid);
            tb_printf(&b, "\",kind=\"%s\"} %d\n", kind_names[k], w->kinds[g][k]);
        }
    family(&b, "kgpu_watcher_untracked_total", "counter",
           "Container and GPU pairs seen but not tracked: more than the watcher keeps.");
    tb_printf(&b, "kgpu_watcher_untracked_total %" PRIu64 "\n", w->dropped);
    family(&b, "kgpu_watcher_events_total", "counter",
           "Kubernetes Events the watcher posted, by outcome.");
    tb_printf(&b, "kgpu_watcher_events_total{result=\"posted\"} %" PRIu64 "\n", w->events_posted);
    tb_printf(&b, "kgpu_watcher_events_total{result=\"failed\"} %" PRIu64 "\n", w->events_failed);
    family(&b, "kgpu_watcher_kills_total", "counter",
           "GPU processes the watcher sent SIGKILL (enforce: kill), by outcome.");
    tb_printf(&b, "kgpu_watcher_kills_total{result=\"killed\"} %" PRIu64 "\n", w->kills);
    tb_printf(&b, "kgpu_watcher_kills_total{result=\"failed\"} %" PRIu64 "\n", w->kill_failures);

    entry_family(&b, w, "kgpu_container_gpu_memory_used_bytes", "gauge",
                 "GPU memory the container's processes hold, as the driver counts it.", V_USED);
    entry_family(&b, w, "kgpu_container_gpu_memory_share_bytes", "gauge",
                 "The container's memory share on the GPU (its limits file; 0: not given it).",
                 V_SHARE);
    entry_family(&b, w, "kgpu_container_gpu_core_used_percent", "gauge",
                 "SM utilization of the container's processes since the previous scan.", V_CORE);
    entry_family(&b, w, "kgpu_container_gpu_core_share_percent", "gauge",
                 "The container's compute share on the GPU (100: not limited).", V_CORE_SHARE);
    entry_family(&b, w, "kgpu_container_gpu_processes", "gauge",
                 "The container's processes using the GPU.", V_PROCS);
    family(&b, "kgpu_container_gpu_throttled", "gauge",
           "1 while the container is over its share on the GPU (memory: over share plus "
           "memorySlackMiB; core: over share plus coreSlackPercent for coreGraceScans scans).");
    for (int i = 0; i < w->nentries; i++)
        for (int r = 0; r < 2; r++) {
            const wentry *e = &w->entries[i];
            tb_printf(&b, "kgpu_container_gpu_throttled");
            entry_labels(&b, w, e);
            tb_printf(&b, ",resource=\"%s\"} %d\n", r == 0 ? "memory" : "core",
                      r == 0 ? e->mem_over : e->core_over);
        }
    family(&b, "kgpu_container_gpu_over_share_total", "counter",
           "Times the container went over its share on the GPU.");
    for (int i = 0; i < w->nentries; i++)
        for (int r = 0; r < 2; r++) {
            const wentry *e = &w->entries[i];
            tb_printf(&b, "kgpu_container_gpu_over_share_total");
            entry_labels(&b, w, e);
            tb_printf(&b, ",resource=\"%s\"} %" PRIu64 "\n", r == 0 ? "memory" : "core",
                      r == 0 ? e->mem_episodes : e->core_episodes);
        }
    entry_family(&b, w, "kgpu_container_gpu_killed_processes_total", "counter",
                 "The container's GPU processes the watcher killed on the GPU.", V_KILLED);
    if (b.oom) {
        free(b.p);
        return; /* keep the previous text */
    }
    pthread_mutex_lock(&w->pub_mu);
    char *old = w->pub;
    w->pub = b.p;
    w->pub_len = b.len;
    pthread_mutex_unlock(&w->pub_mu);
    free(old);
}

char *dp_watcher_metrics(dp_watcher *w, size_t *len)
{
    pthread_mutex_lock(&w->pub_mu);
    size_t n = w->pub != NULL ? w->pub_len : 0;
    char *copy = malloc(n + 1);
    if (copy != NULL) {
        if (n > 0)
            memcpy(copy, w->pub, n);
        copy[n] = '\0';
    }
    pthread_mutex_unlock(&w->pub_mu);
    *len = copy != NULL ? n : 0;
    return copy;
}

/* ---- the scan ---- */

/* Adds GPU g's processes to the entries; KGPU_OK or NVML's error. */
static int scan_gpu(dp_watcher *w, int g, kgpu_gpu_proc *procs, kgpu_error *err)
{
    int n = 0;
    int rc = kgpu_nvml_processes(w->nv, w->gpus[g].index, procs, KGPU_GPU_PROCS_MAX, &n, NULL, err);
    if (rc != KGPU_OK)
        return rc;
    for (int i = 0; i < n; i++) {
        dp_cgroup_id id;
        int pc = process_container(w, procs[i].pid, &id);
        int kind = pc == KGPU_OK ? (is_kgpu_pod(w, id.pod_uid) ? K_CONTAINER : K_OTHER_POD)
                   : pc == KGPU_ENOENT ? K_HOST
                                       : K_UNREADABLE;
        w->kinds[g][kind]++;
        if (kind != K_CONTAINER)
            continue;
        wentry *e = entry_for(w, &id, g);
        if (e == NULL) {
            w->dropped++;
            continue;
        }
        if (!e->seen) {
            e->seen = true;
            e->used = 0;
            e->sm = 0;
            e->npids = 0;
            e->nprocs = 0;
        }
        if (procs[i].used_bytes < 0 || e->used < 0)
            e->used = -1;
        else
            e->used += procs[i].used_bytes;
        e->sm = e->sm + procs[i].sm_pct > 100 ? 100 : e->sm + procs[i].sm_pct;
        e->nprocs++;
        if (e->npids < ENTRY_PIDS_MAX)
            e->pids[e->npids++] = procs[i].pid;
    }
    return KGPU_OK;
}

int dp_watcher_scan(dp_watcher *w, kgpu_error *err)
{
    double t0 = mono_s();
    w->scans++;
    memset(w->kinds, 0, sizeof(w->kinds));
    for (int i = 0; i < w->nentries; i++)
        w->entries[i].seen = false;
    int rc = ensure_nvml(w, err);
    kgpu_gpu_proc *procs = rc == KGPU_OK ? calloc(KGPU_GPU_PROCS_MAX, sizeof(*procs)) : NULL;
    if (rc == KGPU_OK && procs == NULL)
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int g = 0; g < w->ngpus && rc == KGPU_OK; g++)
        rc = scan_gpu(w, g, procs, err);
    free(procs);
    if (rc != KGPU_OK) {
        /* A GPU that stopped answering, a driver going away: start afresh next time. */
        w->scan_errors++;
        w->up = false;
        snprintf(w->last_error, sizeof(w->last_error), "%s", err != NULL ? err->msg : "");
        kgpu_nvml_close(w->nv);
        w->nv = NULL;
        for (int i = 0; i < w->nentries; i++)
            w->entries[i].seen = false;
    } else {
        w->up = true;
        w->last_error[0] = '\0';
    }
    /* Entries this scan did not see are gone: their container stopped using the GPU. */
    int k = 0;
    for (int i = 0; i < w->nentries; i++)
        if (w->entries[i].seen)
            w->entries[k++] = w->entries[i];
    w->nentries = k;

    bool unknown = false;
    for (int i = 0; i < w->nentries; i++)
        unknown |= !resolve_from_cache(w, &w->entries[i]);
    bool may_list = w->listed_at == 0 || mono_s() - w->listed_at >= LIST_EVERY_S;
    if (unknown && w->k8s != NULL && may_list) {
        list_pods(w);
        for (int i = 0; i < w->nentries; i++)
            resolve_from_cache(w, &w->entries[i]);
    }
    for (int i = 0; i < w->nentries; i++) {
        wentry *e = &w->entries[i];
        if (e->name[0] == '\0')
            resolve_single(w, e);
        read_share(w, e);
        judge(w, e);
    }
    w->last_scan_unix = unix_s();
    w->last_scan_s = mono_s() - t0;
    render(w);
    return rc;
}

/* ---- the thread ---- */

static void *watch_loop(void *arg)
{
    dp_watcher *w = arg;
    pthread_mutex_lock(&w->stop_mu);
    while (!w->stop) {
        pthread_mutex_unlock(&w->stop_mu);
        kgpu_error e = {0};
        bool was_up = w->up;
        if (dp_watcher_scan(w, &e) != KGPU_OK && (was_up || w->scan_errors == 1))
            dp_log(DP_WARN, "watcher: %s (retrying every %.1f s)", e.msg, w->cfg.interval_s);
        double at = mono_s() + w->cfg.interval_s;
        struct timespec ts;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
        pthread_mutex_lock(&w->stop_mu);
        while (!w->stop && pthread_cond_timedwait(&w->stop_cv, &w->stop_mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&w->stop_mu);
    return NULL;
}

int dp_watcher_start(dp_watcher *w, kgpu_error *err)
{
    if (pthread_create(&w->thread, NULL, watch_loop, w) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the watcher thread");
    w->started = true;
    return KGPU_OK;
}

void dp_watcher_free(dp_watcher *w)
{
    if (w == NULL)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->stop_mu);
        w->stop = true;
        pthread_cond_signal(&w->stop_cv);
        pthread_mutex_unlock(&w->stop_mu);
        pthread_join(w->thread, NULL);
    }
    kgpu_nvml_close(w->nv);
    free(w->gpus);
    free(w->entries);
    free(w->pods);
    free(w->pub);
    pthread_mutex_destroy(&w->pub_mu);
    pthread_mutex_destroy(&w->stop_mu);
    pthread_cond_destroy(&w->stop_cv);
    free(w);
}
