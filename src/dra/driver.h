/*
 * The DRA driver daemon's state (driver.c), shared with the two parts that
 * run on threads of their own: the ResourceSlice publisher (publish.c) and
 * kubelet's calls (service.c). Internal to src/dra.
 *
 * Threads: the main thread (driver.c) owns discovery and the servers' life
 * cycle and writes the inventory under inv_mu; the publisher thread owns the
 * fields marked "publisher thread only"; the servers' workers run Prepare
 * and Unprepare one at a time under claim_mu, which also guards ck.
 */
#ifndef KGPU_DRA_DRIVER_H
#define KGPU_DRA_DRIVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "dra.h"
#include "gpu.h"
#include "k8s.h"
#include "nodeagent.h"

#define LOOP_MS 200 /* the main loop's and the publisher's pace */

typedef struct driver {
    const dra_config *cfg;
    kgpu_k8s *k8s;
    kgpu_nvml *nvml;
    dra_mig_ops mig; /* MIG instances through nvml; all NULL with --fake-gpus */
    /* The inventory: written by the main thread under inv_mu, read by the others. */
    pthread_mutex_t inv_mu;
    contract_inventory inv;
    uint64_t inv_gen;
    struct stat fake_st;
    time_t rediscover_at;
    /* Prepared claims and their files. */
    pthread_mutex_t claim_mu;
    dra_ckpt ck;
    char ckpt_path[1100];
    contract_paths paths;
    char shim[1100];
    /* Servers: unary calls only (DRA has no stream). */
    node_server *reg, *dra;
    char reg_sock[1200], dra_sock[1200];
    /* Publisher. */
    pthread_t pub;
    bool pub_started;
    atomic_bool *stop;
    char node_uid[DRA_UID_MAX]; /* publisher thread only */
    /*
     * When kubelet last said it registered the driver (0: never). kubelet
     * deletes the node's ResourceSlices when it starts, before or after
     * registering the drivers again, so for a while after each registration
     * the publisher checks the slice every few seconds instead of every
     * --resync: a restarted kubelet must not leave the node without devices
     * for minutes.
     */
    atomic_llong registered_at;
    char conflicts[256];        /* publisher thread only: dra_node_gpu_conflicts' list */
} driver;

/* Seconds on the monotonic clock. */
static inline time_t dra_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
}

/* ---- publish.c ---- */

/*
 * The publisher thread (arg: the driver): writes the node's ResourceSlice
 * whenever the inventory's generation moves on, and checks it every
 * --resync (every few seconds just after kubelet registered the driver),
 * until *d->stop.
 */
void *dra_publisher(void *arg);

/* ---- service.c ---- */

/* kubelet's calls on both sockets (a node_unary_fn; ctx: the driver). */
void dra_on_call(void *ctx, const char *method, const uint8_t *in, size_t len, uint8_t **out,
                 size_t *outlen, node_status *st);

#endif
