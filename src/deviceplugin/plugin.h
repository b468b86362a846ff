/*
 * The device plugin daemon's state (plugin.c), shared with the parts that
 * run on other threads: kubelet's unary calls (allocate.c), the API thread
 * (apithread.c) and the API server calls they make (kubeapi.c). Internal to
 * src/deviceplugin; dp.h says who owns what and on which thread.
 */
#ifndef KGPU_DP_PLUGIN_H
#define KGPU_DP_PLUGIN_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "dp.h"
#include "gpu.h"
#include "k8s.h"
#include "watcher.h"

typedef struct plugin plugin;

/*
 * The resources the plugin may serve, each with its socket: slots below
 * DP_NRES are dp_res's, the rest the mixed MIG strategy's profiles
 * (mig_profile[slot - DP_NRES]), added as profiles appear and kept, with
 * an empty list, when their instances go (kubelet has no unregistering).
 */
#define DP_SLOTS (DP_NRES + DP_MIG_RES_MAX)

/* What one resource's server hands its unary calls: the plugin and the resource. */
typedef struct res_ctx {
    plugin *p;
    dp_res r; /* DP_RES_WHOLE for a MIG profile's slot */
    int slot;
} res_ctx;

struct plugin {
    const dp_config *cfg;
    /* The inventory: written by the main thread under inv_mu, read by workers. */
    pthread_mutex_t inv_mu;
    contract_inventory inv; /* the GPUs offered whole or as shares: none in MIG mode */
    dp_mig_set mig;         /* under inv_mu: the MIG devices advertised (--mig-strategy) */
    node_snapshot snap[DP_SLOTS];
    unsigned registered; /* bit per slot */
    node_server *srv[DP_SLOTS];
    res_ctx srv_ctx[DP_SLOTS];
    bool need_register[DP_SLOTS];
    ino_t sock_ino[DP_SLOTS];
    /* The main thread's: every GPU discovered (MIG-enabled ones too), with health. */
    kgpu_gpu_info all[KGPU_MAX_GPUS_PER_NODE];
    int nall;
    int nmig_res; /* mixed: profile slots in use */
    char mig_profile[DP_MIG_RES_MAX][KGPU_MIG_NAME_MAX];
    dp_mig_dev mig_found[DP_MIG_DEVS_MAX]; /* the last NVML listing of instances */
    dp_mig_set mig_next;                   /* scratch: the set being planned */
    int nmig_found;
    double next_mig_list;
    char mig_why[DP_MIG_WHY_MAX]; /* what the last plan left out (logged when it changes) */
    char mig_err[512];            /* the last listing error (logged when it changes) */
    bool mig_said[KGPU_MAX_GPUS_PER_NODE]; /* "GPU i is in MIG mode" logged */
    bool serving;                          /* the servers were started */
    bool mig_full_said;                    /* "no resource for profile" logged */
    ino_t kubelet_ino;
    double next_register;
    kgpu_k8s *k8s;            /* NULL: no API server */
    pthread_mutex_t alloc_mu; /* one list-match-annotate sequence at a time */
    kgpu_nvml *nvml;
    bool xid_bad[KGPU_MAX_GPUS_PER_NODE];
    struct stat fake_st;
    /*
     * The API thread (node publication, pod directory clean-up) works at the
     * API server's pace, never the main loop's: a slow or unreachable server
     * must not hold back health, socket watching or registration. It wakes
     * on api_cv (with inv_mu) when inv_gen moves on or api_stop is set.
     */
    pthread_t api_thread;
    bool api_started;
    pthread_cond_t api_cv;
    uint64_t inv_gen; /* under inv_mu: bumped on every inventory change */
    bool api_stop;    /* under inv_mu */
    char shim[1100];
    contract_paths paths;
    dp_cdi cdi; /* kind NULL: --device-list-strategy envvar, no CDI devices */
    /* The watcher and its /metrics (watcher.h): their own threads; NULL without --watch-config. */
    dp_watcher *watcher;
    dp_metrics_server *metrics;
};

/* Seconds on the monotonic clock. */
static inline double dp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- kubeapi.c: the API server calls (p->k8s must be set) ---- */

/*
 * PATCHes the node with `inv` (kgpu.io/gpus and the model and count labels;
 * a copy: runs on the API thread); 0 when it took, else logged, naming
 * `backoff` as the wait before the next try.
 */
int dp_publish_node(plugin *p, const contract_inventory *inv, double backoff);

/* The node's pods (a new array; NULL on error), in pages like every list. */
json_t *dp_list_node_pods(plugin *p, kgpu_error *err);

/* Records progress (or completion) in the pod; the uid guards against a namesake. */
int dp_mark_pod(plugin *p, const dp_match *m, kgpu_error *err);

/* ---- allocate.c ---- */

/*
 * kubelet's unary calls on a resource's socket (a node_unary_fn; ctx: that
 * resource's res_ctx): options, PreStartContainer, GetPreferredAllocation
 * and Allocate. On a server's worker thread.
 */
void dp_plugin_unary(void *ctx, const char *method, const uint8_t *in, size_t len, uint8_t **out,
                     size_t *outlen, node_status *st);

/* ---- apithread.c ---- */

/*
 * Starts the API thread (nothing without an API server): it publishes the
 * node whenever inv_gen moves on and removes gone pods' directories.
 */
int dp_api_start(plugin *p, kgpu_error *err);
/* Stops and joins it; fine when it never started. */
void dp_api_stop(plugin *p);

#endif
