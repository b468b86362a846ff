/*
 * What the extender benchmarks share: a synthetic cluster file, starting a
 * kgpu-extender child on it and waiting for its port, a monotonic clock, a
 * seeded RNG and a sort order for latency samples. Benchmarks only: they
 * print figures and assert nothing.
 */
#ifndef KGPU_EXTENDER_BENCH_H
#define KGPU_EXTENDER_BENCH_H

#include <stddef.h>
#include <sys/types.h>

/* Seconds on the monotonic clock. */
double bench_now(void);

/* splitmix64: the next value of the sequence seeded by *x. */
unsigned long long bench_splitmix(unsigned long long *x);

/* qsort order for doubles. */
int bench_cmp_double(const void *a, const void *b);

/* Value of `field` (e.g. "VmHWM:") in /proc/PID/status, in kB; -1 when unreadable. */
long bench_rss_kb(pid_t pid, const char *field);

/*
 * A scratch folder holding cluster.yaml with `nodes` nodes of `gpus` GPUs each
 * (two in three A100-80GB, the rest V100-32GB, NUMA by halves), and the
 * kgpu-extender at `binary` started on it in cluster-file mode on a free
 * loopback port, with `extra` arguments (NULL-terminated, may be NULL).
 * Returns the child's pid and fills *port, or -1 after saying why on stderr
 * (the child, if any, is stopped). `dir` (at least 32 bytes) receives the folder.
 */
pid_t bench_start_extender(const char *binary, int nodes, int gpus, const char *const *extra,
                           const char *log_level, char *dir, size_t dirlen, int *port);

/* Removes what bench_start_extender wrote into `dir`, and `dir`. */
void bench_remove_scratch(const char *dir);

#endif
