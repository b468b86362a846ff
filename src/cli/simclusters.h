/*
 * `kgpu simulate --clusters FILE`: the trace's nodes split into clusters,
 * the study's arrivals dispatched among them by kgpu's dispatcher and by
 * MultiKueue's and the users' own (include/kgpu/multisim.h), medians over
 * seeds printed as a table or JSON (docs/multicluster.md "Measured").
 */
#ifndef KGPU_SIMCLUSTERS_H
#define KGPU_SIMCLUSTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/multisim.h"

typedef struct kgpu_mc_opts {
    const kgpu_sim_input *in; /* the traces, loaded (kgpu_load_input) */
    const char *nodes_path, *pods_path, *clusters_path;
    const char *prices_path; /* NULL: no cost column */
    const char *dispatch;    /* comma list of dispatcher names */
    const char *policy;      /* placement within each cluster */
    const uint64_t *seeds;
    int nseeds, threads;
    double inflate;
    bool quota_per_model; /* --kueue-flavors per-model */
    bool json, timing;
} kgpu_mc_opts;

/* The whole run; returns the exit status (0, 1 failure, 2 usage). */
int kgpu_simulate_clusters(const kgpu_mc_opts *o);

/*
 * The clusters file: lines `CLUSTER,MODEL[,K/N]` (# comments, blank lines
 * skipped): the nodes of GPU model MODEL in cluster c (a node's model is its
 * first GPU's), or with K/N every N-th of them from the K-th on, in node
 * order. Fills split (names sorted) and cluster_of (one per node of c, -1:
 * in no cluster). Errors say "FILE:LINE: what is wrong".
 */
int kgpu_clusters_split_parse(const char *buf, size_t len, const char *file,
                              const kgpu_cluster *c, kgpu_multisim_split *split, int *cluster_of,
                              kgpu_error *err);

#endif
