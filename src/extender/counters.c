/*
 * The extender's counters: verb and failure names, and the latency
 * histogram's buckets. Lock-free atomics that any thread updates; the
 * serving layer's metrics.c renders them.
 */
#include "base.h"

const double ext_hist_bounds[EXT_HIST_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};

const char *ext_verb_name(enum ext_verb v)
{
    static const char *names[VERB_COUNT] = {"filter",  "prioritize",         "bind",
                                            "preempt", "prioritize-gpuless", "filter-gpuless",
                                            "other"};
    return v >= 0 && v < VERB_COUNT ? names[v] : "other";
}

const char *ext_bind_fail_name(enum ext_bind_fail f)
{
    static const char *names[BIND_FAIL_COUNT] = {
        "bad_request",     "unknown_pod",  "unknown_node",
        "no_fit",          "api_conflict", "api_error",
        "api_unreachable", "standby",      "awaiting_allocation",
        "in_doubt"};
    return f >= 0 && f < BIND_FAIL_COUNT ? names[f] : "other";
}

void ext_metrics_observe(ext_metrics *m, enum ext_verb v, double seconds)
{
    ext_hist *h = &m->latency[v];
    int b = 0;
    while (b < EXT_HIST_BUCKETS && seconds > ext_hist_bounds[b])
        b++;
    atomic_fetch_add(&h->bucket[b], 1);
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_ns, (unsigned long long)(seconds * 1e9));
}
