/*
 * What the in-process benchmarks share: a monotonic clock in seconds and
 * the comparison that sorts samples for medians and quantiles.
 */
#ifndef KGPU_BENCH_UTIL_H
#define KGPU_BENCH_UTIL_H

#include <time.h>

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* qsort's comparison for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
