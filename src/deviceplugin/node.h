/*
 * What kgpu's two node daemons share: kgpu-device-plugin (src/deviceplugin)
 * and kgpu-dra-plugin (src/dra) take the same flags for the node, its GPUs
 * and the container contract, and start, log and stop the same way. One
 * copy here, so a flag or a default cannot drift between the two paths.
 */
#ifndef KGPU_DP_NODE_H
#define KGPU_DP_NODE_H

#include <getopt.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "dp.h"
#include "k8s.h"

/* getopt_long keys of the shared flags; a daemon numbers its own from DP_OPT_OWN. */
enum {
    DP_OPT_NODE = 256,
    DP_OPT_KUBECONFIG,
    DP_OPT_FAKE,
    DP_OPT_NVML,
    DP_OPT_SYSFS,
    DP_OPT_STATE,
    DP_OPT_SHIM,
    DP_OPT_SHARING,
    DP_OPT_MPS_PIPE,
    DP_OPT_UNIT,
    DP_OPT_LOG,
    DP_OPT_VERSION,
    DP_OPT_HELP,
    DP_OPT_OWN
};

/* The shared flags' entries, to begin a daemon's struct option table. */
#define DP_NODE_OPTIONS                                                                            \
    {"node-name", required_argument, NULL, DP_OPT_NODE},                                           \
        {"kubeconfig", required_argument, NULL, DP_OPT_KUBECONFIG},                                \
        {"fake-gpus", required_argument, NULL, DP_OPT_FAKE},                                       \
        {"nvml-lib", required_argument, NULL, DP_OPT_NVML},                                        \
        {"sysfs", required_argument, NULL, DP_OPT_SYSFS},                                          \
        {"state-dir", required_argument, NULL, DP_OPT_STATE},                                      \
        {"shim-lib", required_argument, NULL, DP_OPT_SHIM},                                        \
        {"sharing", required_argument, NULL, DP_OPT_SHARING},                                      \
        {"mps-pipe-dir", required_argument, NULL, DP_OPT_MPS_PIPE},                                \
        {"memory-unit", required_argument, NULL, DP_OPT_UNIT},                                     \
        {"log-level", required_argument, NULL, DP_OPT_LOG},                                        \
        {"version", no_argument, NULL, DP_OPT_VERSION}, {"help", no_argument, NULL, DP_OPT_HELP}

/*
 * The defaults: state_dir as given, MPS pipes in /tmp/nvidia-mps, the node
 * from $NODE_NAME, a 1 GiB memory unit; everything else empty or zero.
 */
void dp_node_defaults(dp_node_config *c, const char *state_dir);

/*
 * Copies a path or name flag's value into dst. It must be shorter than
 * cap - reserve (what the daemon appends to it, in socket addresses and
 * file names) and, unless may_be_empty, not empty. `flag` names it in the
 * error.
 */
int dp_flag_copy(const char *flag, const char *arg, char *dst, size_t cap, size_t reserve,
                 bool may_be_empty, kgpu_error *err);

/*
 * Takes one of the shared flags (key from DP_OPT_NODE to DP_OPT_LOG; `flag`
 * as the user wrote it): 0 when taken, 1 when `key` is not one of them,
 * else an error naming the flag. Paths keep `reserve` characters spare, as
 * dp_flag_copy; --log-level sets dp_log_level.
 */
int dp_node_flag(int key, const char *arg, const char *flag, size_t reserve, dp_node_config *c,
                 kgpu_error *err);

/*
 * A daemon's own flag: 0 when taken, 1 when `key` is none of its own, else
 * an error naming the flag.
 */
typedef int (*dp_own_flag_fn)(void *ctx, int key, const char *arg, const char *flag,
                              kgpu_error *err);

/*
 * Parses argv with `opts` (DP_NODE_OPTIONS and the daemon's own, ending in
 * a zero entry): the shared flags into *node (after dp_node_defaults), the
 * others through `own`. --version and --help print (`prog`'s version, or
 * `usage`) and return 1; 0 when every flag was taken; else an error naming
 * the flag or argument at fault.
 */
int dp_node_parse(int argc, char **argv, const struct option *opts, const char *prog,
                  const char *usage, size_t reserve, dp_node_config *node, dp_own_flag_fn own,
                  void *ctx, kgpu_error *err);

/* The daemon proper: runs until *stop; 0 on a clean stop. */
typedef int (*dp_daemon_fn)(const void *cfg, atomic_bool *stop, kgpu_error *err);

/*
 * A daemon's main() after its flags were parsed into `cfg` (parse_rc: 0,
 * 1 for --help or --version printed, or an error in *perr): stops on
 * SIGINT and SIGTERM, ignores SIGPIPE, runs `run` between gRPC's init and
 * shutdown. Returns the exit status: 0, 1 when the daemon failed (logged),
 * 2 for bad flags (printed after `prog`).
 */
int dp_daemon_main(const char *prog, int parse_rc, const kgpu_error *perr, dp_daemon_fn run,
                   const void *cfg);

/*
 * The host paths of the container contract from the flags: the library
 * (shim_lib, or <state_dir>/lib/libkgpu-limit.so; none for "none"), written
 * into `shim` (cap bytes, borrowed by *paths), and the MPS pipes in MPS mode.
 */
void dp_node_paths(const dp_node_config *c, char *shim, size_t cap, dp_paths *paths);

/*
 * Writes <state_dir>/ld.so.preload naming the library's container path, by
 * write and rename; nothing without a library.
 */
int dp_write_preload(const dp_paths *paths, kgpu_error *err);

/*
 * Connects to the API server with `kubeconfig`, or else the in-cluster
 * service account. *no_cluster is set (and the error filled) when there is
 * no in-cluster account to use.
 */
int dp_k8s_connect(const char *kubeconfig, kgpu_k8s **out, bool *no_cluster, kgpu_error *err);

/* Takes a newly read set of GPUs: 0, or an error that keeps the previous set. */
typedef int (*dp_gpus_fn)(void *ctx, const kgpu_gpu_info *gpus, int n, kgpu_error *err);

/*
 * Reads the fake inventory file `path` when it changed since *seen (always
 * when `first`) and hands its GPUs to take. At the first read a failure is
 * returned (a daemon cannot start without its GPUs); later ones are logged
 * and the previous inventory stays (0).
 */
int dp_fake_poll(const char *path, struct stat *seen, bool first, dp_gpus_fn take, void *ctx,
                 kgpu_error *err);

/* Whether inv holds exactly these n GPUs. */
bool dp_same_gpus(const dp_inventory *inv, const kgpu_gpu_info *gpus, int n);

#endif
