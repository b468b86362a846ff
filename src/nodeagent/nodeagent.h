/*
 * What kgpu's two node agents share, below both: kgpu-device-plugin
 * (src/deviceplugin) and kgpu-dra-plugin (src/dra) take the same flags for
 * the node, its GPUs and the container contract (src/contract), and start,
 * log, reach the API server, read a fake inventory and serve gRPC the same
 * way. One copy here, so a flag or a default cannot drift between the paths.
 *
 *   flags.c    the shared flags, their defaults and the contract's host paths
 *   grpcsrv.c  gRPC core servers on unix sockets (Debian's libgrpc): unary
 *              calls on worker threads, optionally one streamed method
 *   daemon.c   main() after the flags, the API server connection, the fake
 *              inventory's polling
 *
 * Threads: flags and main() run on the main thread. A server has its own
 * completion-queue thread and one short-lived worker per unary call (see
 * node_server_start). Logging is src/common/log.h's, thread-safe.
 */
#ifndef KGPU_NODEAGENT_H
#define KGPU_NODEAGENT_H

#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "contract.h"
#include "grpcsrv.h"
#include "gpu.h"
#include "k8s.h"
#include "kgpu/error.h"
#include "kgpu/model.h"

/* ---- flags.c ---- */

/* The flags both node agents take, with the same meaning. */
typedef struct node_config {
    char node_name[KGPU_NAME_MAX + 1];
    char kubeconfig[1024];
    char fake_gpus[1024];
    char nvml_lib[1024];
    char sysfs[1024];
    char state_dir[1024];
    char shim_lib[1024]; /* "" = <state_dir>/lib/libkgpu-limit.so; "none" = off */
    int64_t unit_mib;    /* the device plugin's memory unit, gpushare's env unit */
    contract_sharing sharing; /* compute shares: schedule files or NVIDIA MPS */
    char mps_pipe_dir[1024];  /* host: with CONTRACT_SHARING_MPS */
    int64_t state_limit;      /* --state-limit: the largest filesystem state_dir may be on */
    bool state_refuse;        /* --state-check refuse: a larger one stops the agent */
} node_config;

/* getopt_long keys of the shared flags; an agent numbers its own from NODE_OPT_OWN. */
enum {
    NODE_OPT_NODE = 256,
    NODE_OPT_KUBECONFIG,
    NODE_OPT_FAKE,
    NODE_OPT_NVML,
    NODE_OPT_SYSFS,
    NODE_OPT_STATE,
    NODE_OPT_SHIM,
    NODE_OPT_SHARING,
    NODE_OPT_MPS_PIPE,
    NODE_OPT_UNIT,
    NODE_OPT_LOG,
    NODE_OPT_STATE_LIMIT,
    NODE_OPT_STATE_CHECK,
    NODE_OPT_VERSION,
    NODE_OPT_HELP,
    NODE_OPT_OWN
};

/* The shared flags' entries, to begin an agent's struct option table. */
#define NODE_OPTIONS                                                                               \
    {"node-name", required_argument, NULL, NODE_OPT_NODE},                                         \
        {"kubeconfig", required_argument, NULL, NODE_OPT_KUBECONFIG},                              \
        {"fake-gpus", required_argument, NULL, NODE_OPT_FAKE},                                     \
        {"nvml-lib", required_argument, NULL, NODE_OPT_NVML},                                      \
        {"sysfs", required_argument, NULL, NODE_OPT_SYSFS},                                        \
        {"state-dir", required_argument, NULL, NODE_OPT_STATE},                                    \
        {"shim-lib", required_argument, NULL, NODE_OPT_SHIM},                                      \
        {"sharing", required_argument, NULL, NODE_OPT_SHARING},                                    \
        {"mps-pipe-dir", required_argument, NULL, NODE_OPT_MPS_PIPE},                              \
        {"memory-unit", required_argument, NULL, NODE_OPT_UNIT},                                   \
        {"log-level", required_argument, NULL, NODE_OPT_LOG},                                      \
        {"state-limit", required_argument, NULL, NODE_OPT_STATE_LIMIT},                            \
        {"state-check", required_argument, NULL, NODE_OPT_STATE_CHECK},                            \
        {"version", no_argument, NULL, NODE_OPT_VERSION},                                          \
        {"help", no_argument, NULL, NODE_OPT_HELP}

/*
 * The defaults: state_dir as given, MPS pipes in /tmp/nvidia-mps, the node
 * from $NODE_NAME, a 1 GiB memory unit, a state filesystem of at most
 * NODE_STATE_LIMIT_DEFAULT (warned about); everything else empty or zero.
 */
#define NODE_STATE_LIMIT_DEFAULT (1LL << 30)
void node_defaults(node_config *c, const char *state_dir);

/*
 * Copies a path or name flag's value into dst. It must be shorter than
 * cap - reserve (what the agent appends to it, in socket addresses and
 * file names) and, unless may_be_empty, not empty. `flag` names it in the
 * error.
 */
int node_flag_copy(const char *flag, const char *arg, char *dst, size_t cap, size_t reserve,
                   bool may_be_empty, kgpu_error *err);

/*
 * Takes one of the shared flags (key from NODE_OPT_NODE to NODE_OPT_LOG;
 * `flag` as the user wrote it): 0 when taken, 1 when `key` is not one of
 * them, else an error naming the flag. Paths keep `reserve` characters
 * spare, as node_flag_copy; --log-level sets kgpu_log_set_level.
 */
int node_flag(int key, const char *arg, const char *flag, size_t reserve, node_config *c,
              kgpu_error *err);

/*
 * An agent's own flag: 0 when taken, 1 when `key` is none of its own, else
 * an error naming the flag.
 */
typedef int (*node_own_flag_fn)(void *ctx, int key, const char *arg, const char *flag,
                                kgpu_error *err);

/*
 * Parses argv with `opts` (NODE_OPTIONS and the agent's own, ending in a
 * zero entry): the shared flags into *node (after node_defaults), the others
 * through `own`. --version and --help print (`prog`'s version, or `usage`)
 * and return 1; 0 when every flag was taken; else an error naming the flag
 * or argument at fault.
 */
int node_parse(int argc, char **argv, const struct option *opts, const char *prog,
               const char *usage, size_t reserve, node_config *node, node_own_flag_fn own,
               void *ctx, kgpu_error *err);

/*
 * The host paths of the container contract from the flags: the library
 * (shim_lib, or <state_dir>/lib/libkgpu-limit.so; none for "none"), written
 * into `shim` (cap bytes, borrowed by *paths), and the MPS pipes in MPS mode.
 * *paths also borrows c's strings.
 */
void node_contract_paths(const node_config *c, char *shim, size_t cap, contract_paths *paths);

/*
 * Whether the state folder is on a filesystem of at most c->state_limit
 * bytes (statfs: a tmpfs's size=, a loop image's, a partition's).
 * Containers write into it (their pod's accounting folder, mode 1777, and
 * the GPUs' schedule files), outside their pods' ephemeral-storage
 * accounting: on the node's root filesystem a tenant could fill the disk
 * kubelet watches and get other pods evicted for DiskPressure. A larger
 * one is logged as a warning (0), or refused with c->state_refuse
 * (KGPU_ERANGE naming the folder, both sizes and the remedy). A folder that
 * cannot be looked at is KGPU_EIO.
 */
int node_state_check(const node_config *c, kgpu_error *err);

/* ---- grpcsrv.c: grpcsrv.h ---- */

/* ---- daemon.c ---- */

/* The agent proper: runs until *stop; 0 on a clean stop. */
typedef int (*node_daemon_fn)(const void *cfg, atomic_bool *stop, kgpu_error *err);

/*
 * An agent's main() after its flags were parsed into `cfg` (parse_rc: 0,
 * 1 for --help or --version printed, or an error in *perr): stops on
 * SIGINT and SIGTERM, ignores SIGPIPE, runs `run` between gRPC's init and
 * shutdown. Returns the exit status: 0, 1 when the agent failed (logged),
 * 2 for bad flags (printed after `prog`).
 */
int node_daemon_main(const char *prog, int parse_rc, const kgpu_error *perr, node_daemon_fn run,
                     const void *cfg);

/*
 * Connects to the API server with `kubeconfig`, or else the in-cluster
 * service account. *no_cluster is set (and the error filled) when there is
 * no in-cluster account to use. *out is the caller's (kgpu_k8s_free).
 */
int node_k8s_connect(const char *kubeconfig, kgpu_k8s **out, bool *no_cluster, kgpu_error *err);

/* Takes a newly read set of GPUs: 0, or an error that keeps the previous set. */
typedef int (*node_gpus_fn)(void *ctx, const kgpu_gpu_info *gpus, int n, kgpu_error *err);

/*
 * Reads the fake inventory file `path` when it changed since *seen (always
 * when `first`) and hands its GPUs to take. At the first read a failure is
 * returned (an agent cannot start without its GPUs); later ones are logged
 * and the previous inventory stays (0).
 */
int node_fake_poll(const char *path, struct stat *seen, bool first, node_gpus_fn take, void *ctx,
                   kgpu_error *err);

/*
 * Takes the critical XIDs NVML has queued without waiting and marks each
 * GPU (by NVML index) in bad[], logging the first for each with `effect`
 * ("marking it unhealthy until the plugin restarts"). Returns how many GPUs
 * were newly marked. Both agents judge health this way.
 */
int node_drain_xids(kgpu_nvml *nv, bool bad[KGPU_MAX_GPUS_PER_NODE], const char *effect);

/* Whether inv holds exactly these n GPUs. */
bool node_same_gpus(const contract_inventory *inv, const kgpu_gpu_info *gpus, int n);

#endif
