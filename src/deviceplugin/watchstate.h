/*
 * The watcher's state (watcher.h), shared by the files that make it up:
 * watchmap.c (which container a process belongs to, and its share),
 * watchact.c (Events and kills), watchmetrics.c (the metrics text) and
 * watcher.c (life cycle, NVML, the scan, the thread). Internal to
 * src/deviceplugin.
 *
 * Ownership: see watcher.h. Everything in a dp_watcher except `pub*`
 * belongs to the owner thread.
 */
#ifndef KGPU_DP_WATCHSTATE_H
#define KGPU_DP_WATCHSTATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "gpu.h"
#include "k8s.h"
#include "kubeletckpt.h"
#include "kgpu/model.h"
#include "watcher.h"

#define MIB                ((int64_t)1024 * 1024)
#define ENTRIES_MAX        4096 /* (container, GPU) pairs tracked; more are counted, not kept */
#define ENTRY_PIDS_MAX     64   /* GPU processes of one container on one GPU that can be killed */
#define POD_CONTAINERS_MAX 48   /* init, app and ephemeral containers of one pod */
#define LIST_EVERY_S       10   /* at most one pod list per this, when a container is unknown */
#define CGROUP_FILE_MAX    65536

/* MIG devices watched at most (7 per GPU), and units: GPUs, then MIG devices. */
#define WATCH_MIG_MAX   (KGPU_MAX_GPUS_PER_NODE * 7)
#define WATCH_UNITS_MAX (KGPU_MAX_GPUS_PER_NODE + WATCH_MIG_MAX)

/* Process kinds counted per GPU (the kgpu_watcher_gpu_processes metric). */
enum { K_CONTAINER, K_OTHER_POD, K_HOST, K_UNREADABLE, K_NKINDS };

/* One container's use of one GPU; kept from scan to scan while it lasts. */
typedef struct wentry {
    dp_cgroup_id id;
    int gpu; /* position in w->gpus: a GPU, or (from w->nphys) a MIG device */
    char ns[KGPU_NAME_MAX + 1], pod[KGPU_NAME_MAX + 1], name[64]; /* "" until known */
    int64_t used;       /* bytes this scan; -1 when NVML could not tell for a process */
    int sm;             /* SM % summed over its processes, capped at 100 */
    int64_t share;      /* bytes; -1 when no limits file says */
    int core_share;     /* percent; -1 when no limits file says */
    int npids;          /* in pids; more processes are counted in nprocs */
    int nprocs;         /* GPU processes this scan */
    unsigned pids[ENTRY_PIDS_MAX];
    bool mem_over, core_over;
    /*
     * A container kgpu did not allocate this GPU (a pod without kgpu's
     * directory, or a container of a kgpu pod without a limits file): a GPU
     * it reached around kgpu (NVIDIA_VISIBLE_DEVICES=all and a runtime that
     * accepts it), so its share is zero.
     */
    bool unallocated;
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

    char ckpt_path[1024]; /* kubelet's checkpoint; "" = none */

    /* The owner thread's. */
    kgpu_nvml *nv;
    /*
     * The units watched (WATCH_UNITS_MAX of room): the GPUs NVML discovered
     * (nphys), then the MIG devices on those in MIG mode, listed again at
     * every scan; a MIG device's record has its parent's index, its own
     * UUID and memory. mig[u - nphys] says which instance unit u is.
     */
    kgpu_gpu_info *gpus;
    int ngpus, nphys;
    struct {
        int parent; /* position in gpus */
        unsigned gi, ci;
    } mig[WATCH_MIG_MAX];
    /* Who holds each MIG device, from kubelet's checkpoint at the last scan. */
    dp_ckpt_holder held[WATCH_MIG_MAX];
    int nheld;
    bool held_known;       /* false: unreadable, so MIG shares are unknown */
    char held_error[512];  /* logged when it changes */
    wentry *entries;
    int nentries;
    wpod *pods;
    int npods;
    double listed_at; /* monotonic seconds of the last pod list; 0 = never */
    bool up;
    char last_error[512];
    uint64_t scans, scan_errors, events_posted, events_failed, kills, kill_failures;
    uint64_t dropped; /* (container, GPU) pairs over ENTRIES_MAX, summed over scans */
    int kinds[WATCH_UNITS_MAX][K_NKINDS];
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

static inline double dp_watch_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double dp_watch_unix_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- watchmap.c ---- */

/* 0 with *id filled, or the parser's code (KGPU_ENOENT: not a pod's container). */
int dp_watch_process_container(const dp_watcher *w, unsigned pid, dp_cgroup_id *id);
/* Whether the plugin wrote a directory for the pod (its containers have limits files). */
bool dp_watch_is_kgpu_pod(const dp_watcher *w, const char *uid);
/* The entry of (container, GPU), made when new; NULL beyond ENTRIES_MAX. */
wentry *dp_watch_entry_for(dp_watcher *w, const dp_cgroup_id *id, int gpu);
/* Lists the node's pods into w->pods (needs the API server). */
void dp_watch_list_pods(dp_watcher *w);
/* Names the entry's pod and container from the last pod list; false when unknown there. */
bool dp_watch_resolve_from_cache(const dp_watcher *w, wentry *e);
/* Names the entry from the pod directory when the pod has a single limits file. */
void dp_watch_resolve_single(const dp_watcher *w, wentry *e);
/* The holder of MIG device `device` in kubelet's checkpoint at the last scan, or NULL. */
const dp_ckpt_holder *dp_watch_holder(const dp_watcher *w, const char *device);
/* Reads the entry's share from its container's limits file (-1 when none says). */
void dp_watch_read_share(const dp_watcher *w, wentry *e);

/* ---- watchact.c ---- */

/* Compares the entry with its share and acts: Events, and kills with enforce: kill. */
void dp_watch_judge(dp_watcher *w, wentry *e);

/* ---- watchmetrics.c ---- */

/* Renders the whole metrics text and swaps it into w->pub under pub_mu. */
void dp_watch_render(dp_watcher *w);

#endif
