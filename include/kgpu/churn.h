/*
 * The trace simulator with time: pods arrive at their trace creation times
 * (optionally compressed), run for their trace lifetime (deletion - creation)
 * once placed, and leave. A pod that fits nowhere waits in a FIFO queue and
 * is retried whenever departures free room; what is reported is GPU
 * allocation over time, waiting times and pods never placed.
 *
 * Built on a prepared kgpu_sim_input (same cluster, requests and shapes);
 * kgpu_churn_prepare adds the times. kgpu_churn_run is pure and thread-safe
 * on a shared prepared input, like kgpu_sim_run.
 */
#ifndef KGPU_CHURN_H
#define KGPU_CHURN_H

#include <stdbool.h>
#include <stdint.h>

#include "kgpu/queue.h"
#include "kgpu/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Allocation samples, evenly spaced from the arrival of the pod at 5 % of
 * the arrival order to a quarter of that span past the last arrival (the
 * queue draining shows).
 */
#define KGPU_CHURN_SAMPLES 201

typedef struct kgpu_churn_input {
    const kgpu_sim_input *sim; /* borrowed; must outlive this input */
    double *creation;          /* seconds, one per sim->requests entry (owned) */
    double *lifetime;          /* deletion - creation, seconds (owned) */
    size_t *order;             /* request indices by creation time, file order on ties (owned) */
} kgpu_churn_input;

/* How a churn run divides the cluster between GPU queues (docs/queues.md). */
typedef enum kgpu_churn_queue_mode {
    KGPU_CHURN_QUEUES_OFF = 0,      /* no queues: unrestricted sharing */
    KGPU_CHURN_QUEUES_STATIC,       /* each queue capped at its guarantee, no borrowing */
    KGPU_CHURN_QUEUES_PRIORITY_AGE, /* borrowing; reclaim by priority and age (Kueue-like) */
    KGPU_CHURN_QUEUES_FRAG,         /* borrowing; kgpu's reclaim that frees usable GPUs */
} kgpu_churn_queue_mode;

#define KGPU_CHURN_MAX_QUEUES 16 /* queues a churn run reports on */

/* The queues of a churn run, and which pod belongs to which. Borrowed. */
typedef struct kgpu_churn_queues {
    const kgpu_queues *tree; /* each run works on its own copy */
    const int *queue;        /* per sim->requests entry: its queue's id in tree */
    const int *priority;     /* per sim->requests entry: higher is more important */
} kgpu_churn_queues;

typedef struct kgpu_churn_config {
    const char *policy;
    uint64_t seed;    /* tie order (as kgpu_sim_config), random draws, the inflated workload */
    bool random_ties; /* see kgpu_sim_config */
    bool online;      /* see kgpu_sim_config; kgpu always runs online */
    /*
     * Arrivals come `speedup` times as fast as in the trace (creation / speedup);
     * lifetimes are kept. 1 replays the trace as recorded.
     */
    double speedup;
    /*
     * 0: the file's pods as recorded. Otherwise the study's volume: pods
     * drawn with replacement (seeded) until GPU demand reaches inflate x
     * capacity (or random pods dropped); a drawn pod arrives with its
     * original and lives as long.
     */
    double inflate;
    /*
     * Optional (tests, tracing): called each time a pod is shown to the
     * policy and its learner, with the request index and the simulated time.
     */
    void (*on_observe)(void *ctx, size_t request, double now);
    void *ctx;
    /* Optional: queues (NULL, or mode OFF: none). At most KGPU_CHURN_MAX_QUEUES queues. */
    const kgpu_churn_queues *queues;
    kgpu_churn_queue_mode queue_mode;
    /*
     * 0: none. 1..3: consolidation (kgpu_sim_config.consolidate): a pod that
     * fits nowhere on arrival, and the oldest few waiting after each batch of
     * departures, may be placed by moving up to that many restartable pods
     * of one node elsewhere. A moved pod starts over (its lifetime again from
     * the move; the work it had done counts in lost_gpu_s). Not with queues.
     */
    int consolidate;
    const bool *restartable; /* per sim->requests entry; NULL: every pod */
} kgpu_churn_config;

/* Per queue, over the measured span (simulated seconds). */
typedef struct kgpu_churn_queue_result {
    /* Below its guarantee while a pod of it that would fit within the guarantee waits. */
    double starved_s;
    /*
     * ... while evicting pods that borrow could make room for the smallest
     * such pod (kgpu's reclaim search finds a set): reclaimable.
     */
    double starved_reclaimable_s;
    /* The longest run of consecutive scheduling rounds (event instants) spent so. */
    long starved_reclaimable_rounds_max;
    double used_mean_gpus;  /* time-weighted GPU compute in use */
    double borrowed_mean_gpus;
    long evicted; /* its pods evicted by reclaim */
} kgpu_churn_queue_result;

typedef struct kgpu_churn_result {
    double t_first, t_last; /* the measured span (5 % of arrivals to the last), simulated s */
    double t_end;           /* the last departure (or last event) */
    double sample_t[KGPU_CHURN_SAMPLES];  /* t_first .. t_last + (t_last - t_first) / 4 */
    double alloc_pct[KGPU_CHURN_SAMPLES]; /* GPU allocated / capacity after events <= t */
    double alloc_mean_pct;                /* time-weighted over [t_first, t_last] */
    double alloc_peak_pct;
    double offered_load_pct; /* mean GPU demand present in the span were every pod placed at once */
    long pods;               /* arrivals */
    long placed_at_once;     /* placed on arrival */
    long waited;             /* placed after waiting in the queue */
    long never_placed;       /* still queued when nothing was left to depart */
    long max_queue;
    double wait_median_s, wait_p99_s, wait_mean_s; /* over all placed pods (0 for the prompt) */
    long retries;                                  /* placement attempts made for queued pods */
    bool online;                                   /* the policy's target was learned online */
    /* With queues (zero without). */
    int nqueues;
    kgpu_churn_queue_result queue[KGPU_CHURN_MAX_QUEUES];
    long evictions;        /* pods evicted by reclaim */
    long reclaims;         /* reclaims that evicted something */
    long reclaim_failed;   /* reclaims tried that found no set of victims */
    double freed_unused_gpus; /* GPU compute reclaim freed on GPUs the waiting pod did not take */
    double freed_gpus;        /* GPU compute reclaim freed */
    /*
     * Jain's index of borrowed/weight among queues that borrow and still
     * have pods waiting, mean over the samples where two or more do (1 when
     * none ever did).
     */
    double jain_borrowers;
    long jain_samples;
    long quota_refused; /* placements refused for a queue limit (the static caps' cost) */
    double lost_gpu_s;  /* GPU-seconds of work evicted pods had done, lost (they start over) */
    long moves;         /* pods moved by consolidation */
    long consolidated;  /* pods placed thanks to such moves */
    long placed;        /* placements, moves not counted */
} kgpu_churn_result;

/*
 * Adds the times of `pods` (the list `sim` was prepared from, same order) to a
 * churn input. `file` names the pod list in errors ("pods.csv:12: deletion_time
 * 5 before creation_time 9"). Both times are required. Free with kgpu_churn_input_free.
 */
int kgpu_churn_prepare(const kgpu_sim_input *sim, const kgpu_trace *pods, const char *file,
                       kgpu_churn_input *in, kgpu_error *err);
void kgpu_churn_input_free(kgpu_churn_input *in);

/*
 * One run. Deterministic for (input, policy, seed, speedup, inflate, ties, online).
 * Policies that learn see each pod once, when it arrives, never before.
 */
int kgpu_churn_run(const kgpu_churn_input *in, const kgpu_churn_config *cfg, kgpu_churn_result *out,
                   kgpu_error *err);

#ifdef __cplusplus
}
#endif

#endif
