/*
 * Workload benchmark figures (docs/multicluster.md "Benchmarks per GPU
 * model"): the samples kgpu_workload_throughput{workload,gpu_model,cluster}
 * that `kgpu bench-export` serves, or the federated rules'
 * kgpu:workload_throughput:max30d, read from an exposition text with
 * expo.c's bounded reader. One reader for `kgpu report --benchmarks` and
 * kgpu-dispatcher --benchmarks, so both keep the same figures. Pure.
 */
#ifndef KGPU_BENCHFIG_H
#define KGPU_BENCHFIG_H

#include <stddef.h>

#include "kgpu/error.h"

typedef struct kgpu_bench_figure {
    char workload[128], model[128], cluster[64]; /* cluster "" when the sample has none */
    double value;                                /* finite, >= 0 */
} kgpu_bench_figure;

/*
 * The figures of text[0..len) into *out (malloc'd, *n of them; free it),
 * at most `max`: more is an error. A sample without workload or gpu_model,
 * with a label too long, or a value not finite or below 0 is not a figure
 * and is skipped; other metrics are ignored. Errors name source and line.
 */
int kgpu_bench_figures_read(const char *text, size_t len, const char *source, size_t max,
                            kgpu_bench_figure **out, size_t *n, kgpu_error *err);

#endif
