/*
 * The kgpu command line: subcommands and the small helpers they share.
 */
#ifndef KGPU_CLI_H
#define KGPU_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"
#include "kgpu/sim.h"
#include "study.h"

/* Subcommands: return the process exit status (0 ok, 1 failure, 2 usage). */
int kgpu_cmd_simulate(int argc, char **argv);
int kgpu_cmd_example(int argc, char **argv);
int kgpu_cmd_inspect(int argc, char **argv);
/* `kgpu bench-export` (bench_export.c): a benchmark's figure served to Prometheus. */
int kgpu_cmd_bench_export(int argc, char **argv);
/*
 * `kgpu inspect --clusters FILE` (inspect_clusters.c): each cluster of the
 * clusters file, per GPU model; 0 when at least one answered, 1 when none
 * did, 2 for a bad file.
 */
int kgpu_inspect_clusters(const char *path, bool json);
int kgpu_cmd_report(int argc, char **argv);

/* Reads a whole file; *buf is malloc'd (caller frees). */
int kgpu_read_file(const char *path, char **buf, size_t *len, kgpu_error *err);

/* "42-51", "7", "1,5,9-11" -> seeds (at most max). */
int kgpu_parse_seeds(const char *text, uint64_t *seeds, int max, int *n, kgpu_error *err);

/* Reads and parses a node list and pod list and prepares a simulation input. */
int kgpu_load_input(const char *nodes_path, const char *pods_path, kgpu_sim_input *in,
                    kgpu_error *err);

/* The study as the documented JSON object (new reference). */
json_t *kgpu_study_json(const kgpu_study *s, bool timing);

#endif
