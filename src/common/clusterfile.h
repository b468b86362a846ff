/*
 * The clusters file: the worker clusters kgpu-dispatcher chooses among,
 * each by the name its MultiKueueCluster has and the address of its
 * kgpu-extender (docs/multicluster.md). YAML or JSON; the operator's file,
 * read as outside input: bounded, unknown keys refused, errors name the
 * file and the field. Pure apart from reading the file.
 */
#ifndef KGPU_CLUSTERFILE_H
#define KGPU_CLUSTERFILE_H

#include <stddef.h>

#include "kgpu/error.h"

#define KGPU_CLUSTERS_MAX 64
#define KGPU_CLUSTER_PATH_MAX 1024

typedef struct kgpu_cluster_entry {
    char name[64];                     /* a DNS label: the MultiKueueCluster's name */
    char extender[512];                /* http:// or https:// URL of its kgpu-extender */
    char ca[KGPU_CLUSTER_PATH_MAX];    /* PEM files for TLS; "" when not given */
    char cert[KGPU_CLUSTER_PATH_MAX];  /* client certificate and key: both or neither */
    char key[KGPU_CLUSTER_PATH_MAX];
} kgpu_cluster_entry;

typedef struct kgpu_clusters {
    kgpu_cluster_entry v[KGPU_CLUSTERS_MAX];
    int n;
} kgpu_clusters;

/* Parses buf[0..len) ("file" names it in errors) into *out. 0 or KGPU_EPARSE/KGPU_EINVAL. */
int kgpu_clusters_load(const char *buf, size_t len, const char *file, kgpu_clusters *out,
                       kgpu_error *err);

/* Reads the file (at most 1 MiB), as above. */
int kgpu_clusters_load_file(const char *path, kgpu_clusters *out, kgpu_error *err);

#endif
