/*
 * `kgpu simulate`: replay an Alibaba-format trace against placement policies
 * and report GPU allocation as the FGD study does (table, JSON, SVG plot).
 * All file I/O of the simulator lives here; the core only sees buffers.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "fileio.h"
#include "kgpu/churn.h"
#include "plot.h"
#include "queuefile.h"
#include "simautoscale.h"
#include "simclusters.h"
#include "simmig.h"
#include "simqueues.h"
#include "study.h"

#define MAX_SEEDS    1000
#define MAX_POLICIES 32

int kgpu_read_file(const char *path, char **buf, size_t *len, kgpu_error *err)
{
    return kgpu_read_file_max(path, (size_t)1 << 30, buf, len, err);
}

int kgpu_parse_seeds(const char *text, uint64_t *seeds, int max, int *n, kgpu_error *err)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long long a = strtoull(p, &end, 10);
        if (end == p || errno != 0 || *p == '-')
            return kgpu_error_set(err, KGPU_EINVAL, "--seeds '%s': expected N, A-B or a list",
                                  text);
        unsigned long long b = a;
        if (*end == '-') {
            p = end + 1;
            errno = 0;
            b = strtoull(p, &end, 10);
            if (end == p || errno != 0 || *p == '-' || b < a)
                return kgpu_error_set(err, KGPU_EINVAL, "--seeds '%s': bad range", text);
        }
        for (unsigned long long s = a;; s++) {
            if (*n >= max)
                return kgpu_error_set(err, KGPU_ERANGE, "--seeds '%s': more than %d seeds", text,
                                      max);
            seeds[(*n)++] = s;
            if (s == b) /* not s <= b in the loop test: b may be the largest value */
                break;
        }
        if (*end == ',')
            end++;
        else if (*end != '\0')
            return kgpu_error_set(err, KGPU_EINVAL, "--seeds '%s': unexpected '%c'", text, *end);
        p = end;
    }
    if (*n == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "--seeds is empty");
    return 0;
}

/*
 * Reads and parses the node and pod lists and prepares the simulator input;
 * with ch, also the pods' times for a churn study (kgpu/churn.h); with
 * best_effort, per pod whether its qos is BE (caller frees).
 */
static int load_traces(const char *nodes_path, const char *pods_path, kgpu_sim_input *in,
                       kgpu_churn_input *ch, const kgpu_queues *qs, int **queue_of,
                       int **priority_of, bool **best_effort, kgpu_error *err)
{
    char *nb = NULL, *pb = NULL;
    size_t nl = 0, pl = 0;
    kgpu_trace nodes, pods;
    memset(&nodes, 0, sizeof(nodes));
    memset(&pods, 0, sizeof(pods));
    int rc = kgpu_read_file(nodes_path, &nb, &nl, err);
    if (rc == 0)
        rc = kgpu_read_file(pods_path, &pb, &pl, err);
    if (rc == 0)
        rc = kgpu_trace_parse_nodes(nb, nl, nodes_path, &nodes, err);
    if (rc == 0)
        rc = kgpu_trace_parse_pods(pb, pl, pods_path, &pods, err);
    if (rc == 0)
        rc = kgpu_sim_prepare(&nodes, &pods, in, err);
    if (rc == 0 && ch != NULL)
        rc = kgpu_churn_prepare(in, &pods, pods_path, ch, err);
    if (rc == 0 && qs != NULL)
        rc = kgpu_simq_assign(qs, &pods, pods_path, queue_of, priority_of, err);
    if (rc == 0 && best_effort != NULL) {
        *best_effort = calloc(pods.npods ? pods.npods : 1, sizeof(**best_effort));
        if (*best_effort == NULL)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        for (size_t i = 0; rc == 0 && i < pods.npods; i++)
            (*best_effort)[i] = strcmp(pods.pods[i].qos, "BE") == 0;
    }
    kgpu_trace_free(&nodes);
    kgpu_trace_free(&pods);
    free(nb);
    free(pb);
    return rc;
}

int kgpu_load_input(const char *nodes_path, const char *pods_path, kgpu_sim_input *in,
                    kgpu_error *err)
{
    return load_traces(nodes_path, pods_path, in, NULL, NULL, NULL, NULL, NULL, err);
}

static json_t *real_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

json_t *kgpu_study_json(const kgpu_study *s, bool timing)
{
    json_t *root = json_object();
    json_object_set_new(root, "nodes", json_integer(kgpu_cluster_node_count(s->in->cluster)));
    json_object_set_new(root, "gpus", json_integer(s->in->gpus));
    json_object_set_new(root, "inflate", json_real(s->inflate));
    json_object_set_new(root, "pods_in_file", json_integer((json_int_t)s->in->nrequests));
    json_object_set_new(root, "target_shapes", json_integer(s->in->target.n));
    json_object_set_new(root, "tie_break", json_string(s->random_ties ? "random" : "seeded-order"));
    json_object_set_new(root, "target", json_string(s->online ? "online" : "trace"));
    if (s->extender_scores)
        json_object_set_new(root, "choice", json_string(s->k8s ? "kube-scheduler" : "extender-scores"));
    /* Only when not the default, so that the default's output stays what it always was. */
    if (s->allocator == KGPU_SIM_ALLOC_DRA)
        json_object_set_new(root, "allocator", json_string("dra"));
    if (s->consolidate > 0) {
        json_object_set_new(root, "consolidate", json_integer(s->consolidate));
        json_object_set_new(root, "restartable", json_string(s->restartable ? "be" : "all"));
    }
    if (s->k8s) {
        json_t *k = json_object();
        json_object_set_new(k, "extender_weight", json_integer(s->k8s->extender_weight));
        json_object_set_new(k, "nodes_to_score", json_integer(s->k8s->nodes_to_score));
        json_object_set_new(k, "fit_weight", json_integer(s->k8s->fit_weight));
        json_object_set_new(k, "fit", json_string(s->k8s->most_allocated ? "MostAllocated"
                                                                         : "LeastAllocated"));
        json_object_set_new(k, "balanced_weight", json_integer(s->k8s->balanced_weight));
        json_object_set_new(k, "all_pods", json_boolean(s->k8s->all_pods));
        json_object_set_new(root, "kube_scheduler", k);
    }
    json_t *results = json_array();
    for (int r = 0; r < s->nrows; r++) {
        const kgpu_study_row *row = &s->rows[r];
        json_t *o = json_object();
        json_t *seeds = json_array();
        double by_seed[MAX_SEEDS];
        for (int k = 0; k < s->nseeds; k++) {
            json_array_append_new(seeds, json_integer((json_int_t)s->seeds[k]));
            by_seed[k] = row->runs[k].alloc_pct_final;
        }
        json_object_set_new(o, "policy", json_string(row->policy));
        json_object_set_new(o, "online", json_boolean(s->nseeds > 0 && row->runs[0].online));
        json_object_set_new(o, "seeds", seeds);
        json_object_set_new(o, "alloc_pct_100", json_real(row->alloc_pct_100));
        json_object_set_new(o, "alloc_pct_130", json_real(row->alloc_pct_130));
        json_object_set_new(o, "alloc_pct_130_by_seed", real_array(by_seed, s->nseeds));
        json_object_set_new(o, "unallocated_gpus", json_real(row->unallocated_gpus));
        json_object_set_new(o, "frag_ratio_pct_90", json_real(row->frag_ratio_pct_90));
        json_object_set_new(o, "alloc_curve", real_array(row->curve, KGPU_SIM_CURVE_MAX + 1));
        json_object_set_new(o, "pods", json_real(row->pods));
        json_object_set_new(o, "pods_failed", json_real(row->pods_failed));
        json_object_set_new(o, "constrained_pods", json_real(row->constrained_pods));
        json_object_set_new(o, "constrained_pods_failed", json_real(row->constrained_failed));
        if (s->consolidate > 0) {
            json_object_set_new(o, "moves", json_real(row->moves));
            json_object_set_new(o, "consolidated_pods", json_real(row->consolidated));
            double placed = row->pods - row->pods_failed;
            json_object_set_new(o, "moves_per_100_placed",
                                json_real(placed > 0 ? row->moves * 100.0 / placed : 0));
        }
        json_t *sp = json_object();
        json_object_set_new(sp, "pods", json_real(row->share_pods));
        json_object_set_new(sp, "pods_failed", json_real(row->share_pods_failed));
        json_object_set_new(sp, "compute_gpus", json_real(row->share_compute_gpus));
        json_object_set_new(sp, "gpus", json_real(row->share_gpus));
        json_object_set_new(sp, "gpus_lower_bound", json_real(row->share_gpus_bound));
        json_object_set_new(sp, "gpus_best_fit_decreasing", json_real(row->share_gpus_bfd));
        json_t *sizes = json_array(); /* per seed: {milli: shares placed} */
        json_t *used = json_array();
        for (int k = 0; k < s->nseeds; k++) {
            json_array_append_new(used, json_integer(row->runs[k].share_gpus));
            json_t *h = json_object();
            for (int m = 1; m < KGPU_MILLI; m++) {
                char key[8];
                snprintf(key, sizeof(key), "%d", m);
                if (row->runs[k].share_sizes[m] > 0)
                    json_object_set_new(h, key, json_integer(row->runs[k].share_sizes[m]));
            }
            json_array_append_new(sizes, h);
        }
        json_object_set_new(sp, "gpus_by_seed", used);
        json_object_set_new(sp, "sizes_by_seed", sizes);
        json_object_set_new(o, "share_packing", sp);
        json_object_set_new(o, "wall_s", json_real(timing ? row->wall_s_total : 0.0));
        json_array_append_new(results, o);
    }
    json_object_set_new(root, "results", results);
    return root;
}

static void print_table(FILE *f, const kgpu_study *s, const char *pods_path)
{
    fprintf(f, "cluster: %d nodes, %d GPUs   workload: %s (%zu pods), inflated to %.2fx\n",
            kgpu_cluster_node_count(s->in->cluster), s->in->gpus, pods_path, s->in->nrequests,
            s->inflate);
    fprintf(f, "seeds: %" PRIu64, s->seeds[0]);
    if (s->nseeds > 1)
        fprintf(f, "..%" PRIu64 " (%d runs each, means shown)", s->seeds[s->nseeds - 1], s->nseeds);
    if (s->allocator == KGPU_SIM_ALLOC_DRA) {
        fprintf(f, "\nallocator: dra (GPUs first fit in slice order on kube-scheduler's node)");
        if (s->k8s != NULL && s->k8s->extender_weight == 0)
            fprintf(f, "; extender weight 0: no extender, the policy is not consulted");
    }
    /* The second column is the allocation when the last pod arrived: at inflate x capacity. */
    char last[32] = "alloc@end";
    if (s->inflate > 0)
        snprintf(last, sizeof(last), "alloc@%.0f%%", s->inflate * 100);
    fprintf(f, "\n\n%-16s %11s %11s %13s %12s %9s %8s\n", "policy", "alloc@100%", last,
            "unalloc GPUs", "failed pods", "frag@90%", "wall s");
    for (int r = 0; r < s->nrows; r++) {
        const kgpu_study_row *row = &s->rows[r];
        char name[64];
        snprintf(name, sizeof(name), "%s%s", row->policy,
                 s->nseeds > 0 && row->runs[0].online ? " (online)" : "");
        fprintf(f, "%-16s %10.2f%% %10.2f%% %13.1f %12.1f %8.1f%% %8.2f\n", name,
                row->alloc_pct_100, row->alloc_pct_130, row->unallocated_gpus, row->pods_failed,
                row->frag_ratio_pct_90, row->wall_s_total);
    }
    if (s->consolidate > 0) {
        fprintf(f,
                "\nconsolidation: up to %d moves a pod, %s pods restartable\n"
                "%-16s %12s %14s %12s\n",
                s->consolidate, s->restartable ? "BE" : "all", "policy", "moves",
                "placed by moves", "moves/100");
        for (int r = 0; r < s->nrows; r++) {
            const kgpu_study_row *row = &s->rows[r];
            double placed = row->pods - row->pods_failed;
            fprintf(f, "%-16s %12.1f %14.1f %12.2f\n", row->policy, row->moves, row->consolidated,
                    placed > 0 ? row->moves * 100.0 / placed : 0.0);
        }
    }
    fprintf(f, "\nalloc@N%%: GPU allocated / capacity when GPU demand arrived reached N%% of "
               "capacity.\nfrag@90%%: share of idle GPU compute the target workload cannot use.\n");
}

/* The plot as an SVG file at path; a write that fails is an error. */
static int write_svg(const char *path, const kgpu_plot *plot, kgpu_error *err)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return kgpu_error_set(err, KGPU_EIO, "cannot write %s: %s", path, strerror(errno));
    int rc = kgpu_plot_svg(f, plot, err);
    if (fclose(f) != 0 && rc == 0)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot write %s: %s", path, strerror(errno));
    return rc;
}

/*
 * order[0..n) = 0..n-1 ranked by v, highest first; ties keep their order, so
 * the same results give the same legend.
 */
static void rank_desc(const double *v, int n, int *order)
{
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && v[order[j - 1]] < v[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
}

#define ZOOM_CONTENDERS_PTS 3.0
#define ZOOM_SPREAD_PTS     1.0
#define ZOOM_LEAD_PTS       4

/* The lowest and highest curve point of the rows marked in cont, at arrival x0..x1. */
static void contenders_extent(const kgpu_study *s, const bool *cont, int x0, int x1, double *lo,
                              double *hi)
{
    bool any = false;
    *lo = *hi = 0.0;
    for (int r = 0; r < s->nrows; r++)
        for (int x = x0; cont[r] && x <= x1; x++) {
            double v = s->rows[r].curve[x];
            *lo = !any || v < *lo ? v : *lo;
            *hi = !any || v > *hi ? v : *hi;
            any = true;
        }
}

/*
 * The detail panel of the allocation chart. At the main panel's scale (3.84
 * px per point of allocation, lines 2 px wide) policies that finish within
 * a few points of each other draw as one line, and which of them allocates
 * most is the study's answer. The contenders are the policies ending within
 * ZOOM_CONTENDERS_PTS of the best: 3 points is 11.5 px, so a policy further
 * behind is already apart from them above. All policies are a point apart
 * from 18 % arrived on the example (spread leaves the others early), so the
 * window looks at the contenders only: it opens ZOOM_LEAD_PTS of arrival
 * before the first point where they are ZOOM_SPREAD_PTS apart (max - min),
 * so the panel shows them together before they part, and runs to the end of
 * the curve, y fitted to the contenders' points inside it. 1 point is over
 * twice the largest standard error of a 10-seed mean on the example (0.44;
 * alloc_pct_130_by_seed's standard deviation is up to 1.4): contenders that
 * never part by that much tie, and the legend's values say so without a
 * panel. Returns whether to draw one; *ncont is how many contenders it shows.
 */
static bool zoom_window(const kgpu_study *s, double *x0, double *y0, double *y1, int *ncont)
{
    const int end = KGPU_SIM_CURVE_MAX;
    bool cont[MAX_POLICIES];
    int first = -1;

    *ncont = 0;
    if (s->nrows < 2)
        return false;
    double best = s->rows[0].curve[end];
    for (int r = 1; r < s->nrows; r++)
        if (s->rows[r].curve[end] > best)
            best = s->rows[r].curve[end];
    for (int r = 0; r < s->nrows; r++) {
        cont[r] = s->rows[r].curve[end] >= best - ZOOM_CONTENDERS_PTS;
        *ncont += cont[r];
    }
    if (*ncont < 2)
        return false;
    for (int x = 0; x <= end && first < 0; x++) {
        double lo, hi;
        contenders_extent(s, cont, x, x, &lo, &hi);
        if (hi - lo >= ZOOM_SPREAD_PTS)
            first = x;
    }
    if (first < 0)
        return false;
    int start = first > ZOOM_LEAD_PTS ? first - ZOOM_LEAD_PTS : 0;
    double lo, hi;
    contenders_extent(s, cont, start, end, &lo, &hi);
    /*
     * The panel is 0.7 times the main one's height: a window over 50 points
     * tall would enlarge by under 1.4 and show nothing new.
     */
    if (hi - lo > 50.0)
        return false;
    *x0 = start;
    *y0 = lo - (hi - lo) * 0.05;
    *y1 = hi + (hi - lo) * 0.05;
    return true;
}

static int write_plot(const char *path, const kgpu_study *s, kgpu_error *err)
{
    kgpu_plot_series series[MAX_POLICIES];
    char values[MAX_POLICIES][16];
    double last[MAX_POLICIES];
    int order[MAX_POLICIES];
    /*
     * The legend's value is the curve's last point, at 130 % arrived: the
     * table's alloc@130% whenever arrival ends by then (--inflate 1.3 or less).
     */
    for (int r = 0; r < s->nrows; r++) {
        last[r] = s->rows[r].curve[KGPU_SIM_CURVE_MAX];
        snprintf(values[r], sizeof(values[r]), "%.2f %%", last[r]);
        series[r] = (kgpu_plot_series){.label = s->rows[r].policy,
                                       .x = NULL,
                                       .y = s->rows[r].curve,
                                       .n = KGPU_SIM_CURVE_MAX + 1,
                                       .value = values[r]};
    }
    rank_desc(last, s->nrows, order);
    kgpu_plot plot = {.title = "GPU allocation as workload arrives (mean over seeds)",
                      .xlabel = "GPU demand arrived (% of capacity)",
                      .ylabel = "GPU allocated (% of capacity)",
                      .xmin = 0,
                      .xmax = KGPU_SIM_CURVE_MAX,
                      .ymin = 0,
                      .ymax = 100,
                      .series = series,
                      .nseries = s->nrows,
                      .legend_order = order,
                      .legend_title = "at 130 % arrived"};
    char heading[160];
    double x0, y0, y1;
    int ncont;
    if (zoom_window(s, &x0, &y0, &y1, &ncont)) {
        snprintf(heading, sizeof(heading),
                 "Detail of the shaded box: %g to %d %% arrived, the %d policies within %g "
                 "points of the best",
                 x0, KGPU_SIM_CURVE_MAX, ncont, ZOOM_CONTENDERS_PTS);
        plot.zoom_xmin = x0;
        plot.zoom_xmax = KGPU_SIM_CURVE_MAX;
        plot.zoom_ymin = y0;
        plot.zoom_ymax = y1;
        plot.zoom_title = heading;
    }
    return write_svg(path, &plot, err);
}

/* ---- --churn: the simulator with time (kgpu/churn.h) ---------------------------------------- */

/* Means over seeds of one policy's churn runs. */
typedef struct churn_row {
    const char *policy; /* borrowed */
    kgpu_churn_queue_mode mode;
    char label[80]; /* policy, and the queue mode with --queues */
    double evictions, freed_unused, freed, jain, quota_refused, reclaim_failed, lost_gpu_h,
        alloc_useful;
    kgpu_churn_queue_result q[KGPU_CHURN_MAX_QUEUES]; /* means over seeds */
    kgpu_churn_result *runs;
    double *wall_s;
    double pods, alloc_mean, alloc_peak, wait_median, wait_p99, wait_mean, waited, never_placed,
        max_queue, retries, wall_s_total;
    double alloc[KGPU_CHURN_SAMPLES];
    double moves, consolidated, placed; /* with consolidation */
} churn_row;

typedef struct churn_study {
    const kgpu_churn_input *in;
    const uint64_t *seeds;
    int nseeds;
    churn_row *rows;
    int nrows;
    double speedup, inflate;
    bool random_ties, online;
    const kgpu_churn_queues *queues; /* NULL without --queues */
    int consolidate;                 /* see kgpu_churn_config */
    const bool *restartable;         /* see kgpu_churn_config; borrowed */
} churn_study;

/* Job j: row j / nseeds, seed j % nseeds (jobs.h). */
static int churn_job(void *ctx, int j, kgpu_error *err)
{
    churn_study *s = ctx;
    churn_row *row = &s->rows[j / s->nseeds];
    int k = j % s->nseeds;
    kgpu_churn_config cfg = {.policy = row->policy,
                             .seed = s->seeds[k],
                             .random_ties = s->random_ties,
                             .online = s->online,
                             .speedup = s->speedup,
                             .inflate = s->inflate,
                             .queues = s->queues,
                             .queue_mode = row->mode,
                             .consolidate = s->consolidate,
                             .restartable = s->restartable};
    double t0 = kgpu_now();
    int rc = kgpu_churn_run(s->in, &cfg, &row->runs[k], err);
    row->wall_s[k] = kgpu_now() - t0;
    return rc;
}

static int churn_study_run(churn_study *s, int threads, kgpu_error *err)
{
    int rc = kgpu_jobs_run(s->nrows * s->nseeds, threads, false, churn_job, s, err);
    if (rc != 0)
        return rc;
    for (int r = 0; r < s->nrows; r++) {
        churn_row *row = &s->rows[r];
        double n = s->nseeds;
        for (int k = 0; k < s->nseeds; k++) {
            const kgpu_churn_result *x = &row->runs[k];
            row->pods += (double)x->pods / n;
            row->alloc_mean += x->alloc_mean_pct / n;
            row->alloc_peak += x->alloc_peak_pct / n;
            row->wait_median += x->wait_median_s / n;
            row->wait_p99 += x->wait_p99_s / n;
            row->wait_mean += x->wait_mean_s / n;
            row->waited += (double)x->waited / n;
            row->never_placed += (double)x->never_placed / n;
            row->max_queue += (double)x->max_queue / n;
            row->retries += (double)x->retries / n;
            row->evictions += (double)x->evictions / n;
            row->freed_unused += x->freed_unused_gpus / n;
            row->freed += x->freed_gpus / n;
            row->jain += x->jain_borrowers / n;
            row->quota_refused += (double)x->quota_refused / n;
            row->reclaim_failed += (double)x->reclaim_failed / n;
            row->lost_gpu_h += x->lost_gpu_s / 3600.0 / n;
            row->moves += (double)x->moves / n;
            row->consolidated += (double)x->consolidated / n;
            row->placed += (double)x->placed / n;
            /* Allocation less the work evictions threw away, as a share of the span. */
            double span = x->t_last - x->t_first;
            double lost_pct = span > 0 ? x->lost_gpu_s * 100.0 / (span * s->in->sim->gpus) : 0;
            row->alloc_useful += (x->alloc_mean_pct - lost_pct) / n;
            for (int q = 0; q < x->nqueues; q++) {
                kgpu_churn_queue_result *m = &row->q[q];
                const kgpu_churn_queue_result *y = &x->queue[q];
                m->starved_s += y->starved_s / n;
                m->starved_reclaimable_s += y->starved_reclaimable_s / n;
                if (y->starved_reclaimable_rounds_max > m->starved_reclaimable_rounds_max)
                    m->starved_reclaimable_rounds_max = y->starved_reclaimable_rounds_max;
                m->used_mean_gpus += y->used_mean_gpus / n;
                m->borrowed_mean_gpus += y->borrowed_mean_gpus / n;
                m->evicted += y->evicted; /* summed, divided below */
            }
            row->wall_s_total += row->wall_s[k];
            for (int i = 0; i < KGPU_CHURN_SAMPLES; i++)
                row->alloc[i] += x->alloc_pct[i] / n;
        }
    }
    return 0;
}

static json_t *churn_json(const churn_study *s, bool timing)
{
    const kgpu_sim_input *in = s->in->sim;
    const kgpu_churn_result *r0 = &s->rows[0].runs[0];
    json_t *root = json_object();
    json_object_set_new(root, "mode", json_string("churn"));
    json_object_set_new(root, "nodes", json_integer(kgpu_cluster_node_count(in->cluster)));
    json_object_set_new(root, "gpus", json_integer(in->gpus));
    json_object_set_new(root, "pods_in_file", json_integer((json_int_t)in->nrequests));
    json_object_set_new(root, "speedup", json_real(s->speedup));
    json_object_set_new(root, "inflate", json_real(s->inflate));
    json_object_set_new(root, "tie_break", json_string(s->random_ties ? "random" : "seeded-order"));
    json_object_set_new(root, "target", json_string(s->online ? "online" : "trace"));
    json_object_set_new(root, "offered_load_pct", json_real(r0->offered_load_pct));
    json_object_set_new(root, "t_first_s", json_real(r0->t_first));
    json_object_set_new(root, "t_last_s", json_real(r0->t_last));
    json_object_set_new(root, "sample_t_s", real_array(r0->sample_t, KGPU_CHURN_SAMPLES));
    json_t *results = json_array();
    for (int r = 0; r < s->nrows; r++) {
        const churn_row *row = &s->rows[r];
        json_t *o = json_object(), *seeds = json_array();
        double by_seed[MAX_SEEDS];
        for (int k = 0; k < s->nseeds; k++) {
            json_array_append_new(seeds, json_integer((json_int_t)s->seeds[k]));
            by_seed[k] = row->runs[k].alloc_mean_pct;
        }
        json_object_set_new(o, "policy", json_string(row->policy));
        if (s->queues != NULL) {
            json_object_set_new(o, "queue_mode", json_string(kgpu_simq_mode_name(row->mode)));
            json_object_set_new(o, "evictions", json_real(row->evictions));
            json_object_set_new(o, "freed_gpus", json_real(row->freed));
            json_object_set_new(o, "freed_unused_gpus", json_real(row->freed_unused));
            json_object_set_new(o, "reclaim_failed", json_real(row->reclaim_failed));
            json_object_set_new(o, "lost_gpu_hours", json_real(row->lost_gpu_h));
            json_object_set_new(o, "alloc_useful_pct", json_real(row->alloc_useful));
            json_object_set_new(o, "jain_borrowers", json_real(row->jain));
            json_object_set_new(o, "quota_refused", json_real(row->quota_refused));
            json_t *qa = json_array();
            for (int q = 0; q < row->runs[0].nqueues; q++) {
                kgpu_queue_info qi;
                kgpu_queues_info(s->queues->tree, q, &qi);
                const kgpu_churn_queue_result *m = &row->q[q];
                json_t *qo = json_object();
                json_object_set_new(qo, "queue", json_string(qi.name));
                json_object_set_new(qo, "starved_s", json_real(m->starved_s));
                json_object_set_new(qo, "starved_reclaimable_s",
                                    json_real(m->starved_reclaimable_s));
                json_object_set_new(qo, "starved_reclaimable_rounds_max",
                                    json_integer(m->starved_reclaimable_rounds_max));
                json_object_set_new(qo, "used_mean_gpus", json_real(m->used_mean_gpus));
                json_object_set_new(qo, "borrowed_mean_gpus", json_real(m->borrowed_mean_gpus));
                json_object_set_new(qo, "evicted", json_real((double)m->evicted / s->nseeds));
                json_array_append_new(qa, qo);
            }
            json_object_set_new(o, "queues", qa);
        }
        if (s->consolidate > 0) {
            json_object_set_new(o, "moves", json_real(row->moves));
            json_object_set_new(o, "consolidated_pods", json_real(row->consolidated));
            json_object_set_new(o, "moves_per_100_placed",
                                json_real(row->placed > 0 ? row->moves * 100.0 / row->placed : 0));
            json_object_set_new(o, "lost_gpu_hours", json_real(row->lost_gpu_h));
        }
        json_object_set_new(o, "online", json_boolean(row->runs[0].online));
        json_object_set_new(o, "seeds", seeds);
        json_object_set_new(o, "alloc_mean_pct", json_real(row->alloc_mean));
        json_object_set_new(o, "alloc_mean_pct_by_seed", real_array(by_seed, s->nseeds));
        json_object_set_new(o, "alloc_peak_pct", json_real(row->alloc_peak));
        json_object_set_new(o, "wait_median_s", json_real(row->wait_median));
        json_object_set_new(o, "wait_p99_s", json_real(row->wait_p99));
        json_object_set_new(o, "wait_mean_s", json_real(row->wait_mean));
        json_object_set_new(o, "pods", json_real(row->pods));
        json_object_set_new(o, "waited", json_real(row->waited));
        json_object_set_new(o, "never_placed", json_real(row->never_placed));
        json_object_set_new(o, "max_queue", json_real(row->max_queue));
        json_object_set_new(o, "retries", json_real(row->retries));
        json_object_set_new(o, "alloc_over_time", real_array(row->alloc, KGPU_CHURN_SAMPLES));
        json_object_set_new(o, "wall_s", json_real(timing ? row->wall_s_total : 0.0));
        json_array_append_new(results, o);
    }
    json_object_set_new(root, "results", results);
    return root;
}

/* A readable unit for a span of simulated seconds: seconds per unit, and its name. */
static double time_unit(double span_s, const char **name)
{
    if (span_s >= 2 * 3600.0) {
        *name = "hours";
        return 3600.0;
    }
    if (span_s >= 120.0) {
        *name = "minutes";
        return 60.0;
    }
    *name = "seconds";
    return 1.0;
}

static void churn_table(FILE *f, const churn_study *s, const char *pods_path)
{
    const kgpu_sim_input *in = s->in->sim;
    const kgpu_churn_result *r0 = &s->rows[0].runs[0];
    const char *unit;
    double scale = time_unit(r0->t_last - r0->t_first, &unit);
    fprintf(f,
            "cluster: %d nodes, %d GPUs   workload: %s (%zu pods), trace times, arrivals "
            "x%g\n",
            kgpu_cluster_node_count(in->cluster), in->gpus, pods_path, in->nrequests, s->speedup);
    if (s->inflate > 0)
        fprintf(f, "inflated to %.2fx capacity: %.1f pods (mean over seeds)\n", s->inflate,
                s->rows[0].pods);
    fprintf(f,
            "offered load %.1f%% of GPU capacity over %.1f %s (from 5%% of arrivals to the last)\n",
            r0->offered_load_pct, (r0->t_last - r0->t_first) / scale, unit);
    fprintf(f, "seeds: %" PRIu64, s->seeds[0]);
    if (s->nseeds > 1)
        fprintf(f, "..%" PRIu64 " (%d runs each, means shown)", s->seeds[s->nseeds - 1], s->nseeds);
    int w = s->queues != NULL ? 28 : 16;
    fprintf(f, "\n\n%-*s %10s %10s %11s %11s %9s %8s %9s %8s\n", w, "policy", "alloc mean",
            "alloc peak", "wait p50 s", "wait p99 s", "waited", "never", "max queue", "wall s");
    for (int r = 0; r < s->nrows; r++) {
        const churn_row *row = &s->rows[r];
        char name[96];
        snprintf(name, sizeof(name), "%s%s", row->label, row->runs[0].online ? " (online)" : "");
        fprintf(f, "%-*s %9.2f%% %9.2f%% %11.1f %11.1f %9.1f %8.1f %9.1f %8.2f\n", w, name,
                row->alloc_mean, row->alloc_peak, row->wait_median, row->wait_p99, row->waited,
                row->never_placed, row->max_queue, row->wall_s_total);
    }
    fprintf(f, "\nalloc mean: GPU allocated / capacity, time-weighted over that span.\n"
               "wait: arrival to placement, over placed pods; waited: pods that queued; never:\n"
               "pods still queued when every placed pod had left.\n");
    if (s->consolidate > 0) {
        fprintf(f,
                "\nconsolidation: up to %d moves a pod, %s pods restartable\n"
                "%-16s %10s %16s %10s %11s\n",
                s->consolidate, s->restartable ? "BE" : "all", "policy", "moves",
                "placed by moves", "moves/100", "lost GPU-h");
        for (int r = 0; r < s->nrows; r++) {
            const churn_row *row = &s->rows[r];
            fprintf(f, "%-16s %10.1f %16.1f %10.2f %11.2f\n", row->label, row->moves,
                    row->consolidated, row->placed > 0 ? row->moves * 100.0 / row->placed : 0.0,
                    row->lost_gpu_h);
        }
        fprintf(f, "moves/100: pods moved per 100 placements; lost GPU-h: work moved pods had\n"
                   "done (they start over).\n");
    }
    if (s->queues == NULL)
        return;
    int nq = 0;
    for (int r = 0; r < s->nrows; r++)
        if (s->rows[r].runs[0].nqueues > nq)
            nq = s->rows[r].runs[0].nqueues;
    fprintf(f, "\n%-28s %9s %9s %11s %10s %9s %10s %11s\n", "queues", "evictions", "freed GPU",
            "freed unused", "Jain borr.", "refused", "lost GPU-h", "alloc useful");
    for (int r = 0; r < s->nrows; r++) {
        const churn_row *row = &s->rows[r];
        fprintf(f, "%-28s %9.1f %9.1f %11.1f %10.3f %9.1f %10.1f %10.2f%%\n", row->label,
                row->evictions, row->freed, row->freed_unused, row->jain, row->quota_refused,
                row->lost_gpu_h, row->alloc_useful);
    }
    fprintf(f, "\nper queue: GPUs used (mean) / %s below guarantee with a pod waiting, of which\n"
               "reclaimable [longest run in rounds]\n%-28s",
            unit, "");
    for (int q = 0; q < nq; q++) {
        kgpu_queue_info qi;
        kgpu_queues_info(s->queues->tree, q, &qi);
        fprintf(f, " %24s", qi.name);
    }
    fputc('\n', f);
    for (int r = 0; r < s->nrows; r++) {
        const churn_row *row = &s->rows[r];
        fprintf(f, "%-28s", row->label);
        for (int q = 0; q < nq; q++) {
            char cell[64];
            snprintf(cell, sizeof(cell), "%.1f / %.2f, %.2f [%ld]", row->q[q].used_mean_gpus,
                     row->q[q].starved_s / scale, row->q[q].starved_reclaimable_s / scale,
                     row->q[q].starved_reclaimable_rounds_max);
            fprintf(f, " %24s", cell);
        }
        fputc('\n', f);
    }
    fprintf(f, "\nfreed unused: GPU compute evictions freed on GPUs the waiting pod did not take.\n"
               "Jain borr.: Jain's index of borrowed GPU / weight among queues borrowing with\n"
               "pods waiting (1 = even). refused: pods a queue limit held back at least once.\n"
               "lost GPU-h: work evicted pods had done (they start over when placed again);\n"
               "alloc useful: alloc mean less that lost work over the span.\n");
}

static int churn_plot(const char *path, const churn_study *s, kgpu_error *err)
{
    kgpu_plot_series series[MAX_POLICIES * 4];
    double hours[KGPU_CHURN_SAMPLES];
    const kgpu_churn_result *r0 = &s->rows[0].runs[0];
    const char *unit;
    double scale = time_unit(r0->t_last - r0->t_first, &unit);
    for (int i = 0; i < KGPU_CHURN_SAMPLES; i++)
        hours[i] = (r0->sample_t[i] - r0->t_first) / scale;
    /*
     * The legend is ranked by the table's alloc mean: the last sample is a
     * quarter span after the last arrival, with the cluster emptying, and
     * ranks nothing.
     */
    char values[MAX_POLICIES * 4][16];
    double mean[MAX_POLICIES * 4];
    int order[MAX_POLICIES * 4];
    for (int r = 0; r < s->nrows; r++) {
        mean[r] = s->rows[r].alloc_mean;
        snprintf(values[r], sizeof(values[r]), "%.2f %%", mean[r]);
        series[r] = (kgpu_plot_series){.label = s->rows[r].label,
                                       .x = hours,
                                       .y = s->rows[r].alloc,
                                       .n = KGPU_CHURN_SAMPLES,
                                       .value = values[r]};
    }
    rank_desc(mean, s->nrows, order);
    char title[160], xlabel[96], volume[48] = "";
    if (s->inflate > 0)
        snprintf(volume, sizeof(volume), ", inflated %gx", s->inflate);
    snprintf(title, sizeof(title),
             "GPU allocation over time: trace times, arrivals x%g%s (mean over seeds)", s->speedup,
             volume);
    snprintf(xlabel, sizeof(xlabel), "%s since 5%% of the pods had arrived", unit);
    kgpu_plot plot = {.title = title,
                      .xlabel = xlabel,
                      .ylabel = "GPU allocated (% of capacity)",
                      .xmin = 0,
                      .xmax = hours[KGPU_CHURN_SAMPLES - 1],
                      .ymin = 0,
                      .ymax = 100,
                      .series = series,
                      .nseries = s->nrows,
                      .legend_order = order,
                      .legend_title = "alloc mean"};
    return write_svg(path, &plot, err);
}

typedef struct churn_opts {
    const char *nodes_path, *pods_path, *plot_path, *queues_path;
    const kgpu_churn_queue_mode *modes;
    int nmodes;
    const char *const *policies;
    int npolicies, threads;
    const uint64_t *seeds;
    int nseeds;
    double speedup, inflate;
    bool json, timing, random_ties, online;
    int consolidate;
    bool restartable_be;
} churn_opts;

/* The whole --churn run; returns the exit status. */
static int run_churn(const churn_opts *o)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    kgpu_sim_input in;
    kgpu_churn_input ch;
    memset(&in, 0, sizeof(in));
    memset(&ch, 0, sizeof(ch));
    churn_study s;
    memset(&s, 0, sizeof(s));
    int status = 1;
    kgpu_queues *qs = NULL;
    int *queue_of = NULL, *priority_of = NULL;
    bool *best_effort = NULL;
    kgpu_churn_queues cq;
    if (o->queues_path != NULL) {
        if (kgpu_queues_load_file(o->queues_path, &qs, &err) != 0)
            goto out;
        if (qs == NULL) {
            kgpu_error_set(&err, KGPU_EINVAL, "%s: no queues section", o->queues_path);
            goto out;
        }
    }
    if (load_traces(o->nodes_path, o->pods_path, &in, &ch, qs, &queue_of, &priority_of,
                    o->restartable_be ? &best_effort : NULL, &err) != 0)
        goto out;
    s.consolidate = o->consolidate;
    s.restartable = best_effort;
    if (qs != NULL) {
        cq = (kgpu_churn_queues){.tree = qs, .queue = queue_of, .priority = priority_of};
        s.queues = &cq;
    }
    s.in = &ch;
    s.seeds = o->seeds;
    s.nseeds = o->nseeds;
    s.speedup = o->speedup;
    s.inflate = o->inflate;
    s.random_ties = o->random_ties;
    s.online = o->online;
    int nmodes = qs != NULL ? o->nmodes : 1;
    s.rows = calloc((size_t)(o->npolicies * nmodes), sizeof(*s.rows));
    if (s.rows == NULL) {
        kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    s.nrows = o->npolicies * nmodes;
    for (int r = 0; r < s.nrows; r++) {
        s.rows[r].policy = o->policies[r / nmodes];
        s.rows[r].mode = qs != NULL ? o->modes[r % nmodes] : KGPU_CHURN_QUEUES_OFF;
        if (qs != NULL)
            snprintf(s.rows[r].label, sizeof(s.rows[r].label), "%s/%s", s.rows[r].policy,
                     kgpu_simq_mode_name(s.rows[r].mode));
        else
            snprintf(s.rows[r].label, sizeof(s.rows[r].label), "%s", s.rows[r].policy);
        s.rows[r].runs = calloc((size_t)o->nseeds, sizeof(*s.rows[r].runs));
        s.rows[r].wall_s = calloc((size_t)o->nseeds, sizeof(*s.rows[r].wall_s));
        if (s.rows[r].runs == NULL || s.rows[r].wall_s == NULL) {
            kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
            goto out;
        }
    }
    if (churn_study_run(&s, o->threads, &err) != 0)
        goto out;
    if (o->json) {
        kgpu_study_print_json(churn_json(&s, o->timing));
    } else {
        churn_table(stdout, &s, o->pods_path);
    }
    if (o->plot_path != NULL && churn_plot(o->plot_path, &s, &err) != 0)
        goto out;
    if (kgpu_study_flush(&err) != 0)
        goto out;
    status = 0;
out:
    if (status != 0)
        fprintf(stderr, "kgpu simulate: %s\n", err.msg[0] ? err.msg : kgpu_strerror(err.code));
    for (int r = 0; r < s.nrows; r++) {
        free(s.rows[r].runs);
        free(s.rows[r].wall_s);
    }
    free(s.rows);
    free(queue_of);
    free(priority_of);
    free(best_effort);
    kgpu_queues_free(qs);
    kgpu_churn_input_free(&ch);
    kgpu_sim_input_free(&in);
    return status;
}

/*
 * --workload: the arrival sequence of one seed as CSV on stdout, one line per
 * arrival in order: `seq,pod,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec`
 * (pod: 0-based row of the pod file; gpu_spec as written). It is the sequence
 * every policy's run of that seed replays (kgpu_sim_workload), so a benchmark can
 * send the same pods through a real kube-scheduler without re-implementing the
 * draws and the shuffle. Returns the exit status.
 */
static int print_workload(const char *nodes_path, const char *pods_path, uint64_t seed,
                          double inflate)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    char *nb = NULL, *pb = NULL;
    size_t nl = 0, pl = 0, *order = NULL, len = 0;
    kgpu_trace nodes, pods;
    memset(&nodes, 0, sizeof(nodes));
    memset(&pods, 0, sizeof(pods));
    kgpu_sim_input in;
    memset(&in, 0, sizeof(in));
    int rc = kgpu_read_file(nodes_path, &nb, &nl, &err);
    if (rc == 0)
        rc = kgpu_read_file(pods_path, &pb, &pl, &err);
    if (rc == 0)
        rc = kgpu_trace_parse_nodes(nb, nl, nodes_path, &nodes, &err);
    if (rc == 0)
        rc = kgpu_trace_parse_pods(pb, pl, pods_path, &pods, &err);
    if (rc == 0)
        rc = kgpu_sim_prepare(&nodes, &pods, &in, &err);
    if (rc == 0)
        rc = kgpu_sim_workload(&in, seed, inflate, &order, &len, &err);
    if (rc == 0) {
        printf("seq,pod,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
        for (size_t k = 0; k < len; k++) {
            const kgpu_trace_pod *p = &pods.pods[order[k]];
            printf("%zu,%zu,%s,%" PRId64 ",%" PRId64 ",%d,%d,%s\n", k, order[k], p->name,
                   p->cpu_milli, p->memory_mib, p->num_gpu, p->gpu_milli, p->spec_text);
        }
        if (fflush(stdout) != 0)
            rc = kgpu_error_set(&err, KGPU_EIO, "cannot write the workload: %s", strerror(errno));
    }
    if (rc != 0)
        fprintf(stderr, "kgpu simulate: %s\n", err.msg[0] ? err.msg : kgpu_strerror(err.code));
    free(order);
    kgpu_sim_input_free(&in);
    kgpu_trace_free(&nodes);
    kgpu_trace_free(&pods);
    free(nb);
    free(pb);
    return rc == 0 ? 0 : 1;
}

static void simulate_usage(FILE *f)
{
    fprintf(f, "usage: kgpu simulate --nodes NODES.csv --pods PODS.csv [options]\n"
               "\n"
               "Replays an Alibaba-format GPU trace against placement policies, as the FGD study\n"
               "(ATC '23) does, and reports how much of the cluster's GPU each policy allocates.\n"
               "\n"
               "  --nodes FILE      node list (sn,cpu_milli,memory_mib,gpu,model)\n"
               "  --pods FILE       pod list (11-column or 5-column layout)\n"
               "  --policy LIST     comma-separated policies (default: all):");
    for (const kgpu_policy_ops *const *p = kgpu_policy_list(); *p; p++)
        fprintf(f, " %s", (*p)->name);
    fprintf(f, "\n"
               "  --seeds SEEDS     N, A-B or a comma list (default 42-51)\n"
               "  --inflate X       workload GPU demand as a multiple of capacity (default 1.3)\n"
               "  --threads N       parallel runs (default: one per CPU)\n"
               "  --json            print the results as JSON on stdout\n"
               "  --no-timing       report wall_s as 0, so output is byte-identical per seed\n"
               "  --random-ties     break score ties at random per pod (kube-scheduler's way)\n"
               "                    instead of the study's fixed per-seed node order\n"
               "  --online          policies learn the workload from the pods arrived so far\n"
               "                    instead of the whole file's shape mix (kgpu always does)\n"
               "  --extender-scores choose as kube-scheduler with the extender does: the\n"
               "                    highest of the policy's 0-10 prioritize scores over every\n"
               "                    node that fits, ties at random\n"
               "  --kube-scheduler SPEC  as --extender-scores, with kube-scheduler's own part:\n"
               "                    its node sample, its default score plugins beside the\n"
               "                    extender's. SPEC: default (the shipped configuration),\n"
               "                    or a comma list of weight=N (extender weight, 5; 0: no\n"
               "                    prioritize, the plugins alone choose the node),\n"
               "                    score=PCT (percentageOfNodesToScore, 0 adaptive),\n"
               "                    fit=least|most|off, fit-weight=N, balanced=N (weights 1),\n"
               "                    gpu-pods (pods without GPU placed by the plugins alone,\n"
               "                    as without the prioritize-gpuless entry), all-pods (the\n"
               "                    default: pods without GPU get the extender's scores too)\n"
               "  --allocator A     who picks the GPUs on the chosen node: policy (default:\n"
               "                    the policy), or dra: devices as kube-scheduler's DRA\n"
               "                    allocator takes them (first fit in slice order) on the\n"
               "                    node kube-scheduler chooses (--kube-scheduler SPEC,\n"
               "                    default `default`; weight=0: no extender, DRA alone)\n"
               "  --consolidate N   before a pod fails, move up to N (1..3) restartable pods\n"
               "                    of one node elsewhere if that makes room for it (the\n"
               "                    fewest moves); reports the moves made\n"
               "  --restartable W   with --consolidate: which pods may be moved: all (the\n"
               "                    default) or be (pods whose qos is BE)\n"
               "  --workload        print the arrival sequence of the (one) seed as CSV\n"
               "                    (seq,pod,name,cpu_milli,memory_mib,num_gpu,gpu_milli,\n"
               "                    gpu_spec) instead of simulating\n"
               "  --plot FILE.svg   write allocation %% against arrival %% for each policy\n"
               "  --churn           replay the trace's creation and deletion times: pods that\n"
               "                    fit nowhere wait in a queue; reports allocation over time,\n"
               "                    waiting times and pods never placed (--plot: over time)\n"
               "  --speedup X       with --churn: arrivals X times as fast as recorded,\n"
               "                    lifetimes kept (default 1)\n"
               "                    (--inflate with --churn: drawn pods arrive with their\n"
               "                    originals; without it the file's pods as recorded)\n"
               "  --queues FILE     with --churn: GPU queues (a YAML/JSON file's queues:\n"
               "                    section); pods go to the queue their name starts with\n"
               "                    (\"team-a-...\"), else by a hash of the name in proportion\n"
               "                    to the queues' guarantees (docs/queues.md)\n"
               "  --queue-modes L   with --queues: compare none (no queues), static (caps at\n"
               "                    the guarantees), priority-age (borrowing, Kueue-like\n"
               "                    reclaim), frag (kgpu's reclaim); default all four\n"
               "  --autoscale       replay the trace's times on node groups (one per node\n"
               "                    shape x on-demand/spot, quotas from --nodes) that start\n"
               "                    empty and a Cluster Autoscaler-like loop grows and\n"
               "                    shrinks; reports GPU-hours bought, cost and waiting per\n"
               "                    expander, medians over seeds (docs/autoscaling.md).\n"
               "                    --speedup and --inflate as with --churn\n"
               "  --prices FILE     with --autoscale: prices per GPU-hour by model and\n"
               "                    capacity type (default examples/prices.yaml)\n"
               "  --expanders L     kgpu, least-waste, price, random, fixed (a cluster of\n"
               "                    kgpu's peak node counts, on-demand); default all five\n"
               "  --scan-interval S         autoscaler loop period (default 10)\n"
               "  --provision-delay S       scale-up to node ready (default 120)\n"
               "  --scale-down-unneeded-time S    (default 600)\n"
               "  --scale-down-delay-after-add S  (default 600)\n"
               "  --scale-down-utilization-threshold X  (default 0.5)\n"
               "  --spot-interruptions R    per spot node-hour, Poisson (default 0.05)\n"
               "  --spot-qos LIST   qos values whose pods tolerate spot nodes (default BE)\n"
               "  --clusters FILE   the nodes split into clusters (CLUSTER,MODEL[,K/N] lines), the\n"
               "                    arrivals dispatched among them (docs/multicluster.md);\n"
               "                    --prices then costs the GPUs held\n"
               "  --dispatch LIST   with --clusters: one, kgpu, all-at-once, incremental,\n"
               "                    static (default all five), kgpu-separate\n"
               "  --kueue-flavors F with --clusters: MultiKueue's Kueues with one flavor per\n"
               "                    cluster (one, the default) or a flavor per GPU model\n"
               "                    (per-model)\n"
               "  --mig MODELS      every GPU as a MIG GPU of each model (comma list of\n"
               "                    A100-40GB, A100-80GB, H100-80GB, H200-141GB), requests as\n"
               "                    MIG profiles: requests placed by first fit in NVML's\n"
               "                    order, kgpu's slice order, kgpu with node scores, free\n"
               "                    best fit, against an offline packing and its LP bound;\n"
               "                    with --churn [--speedup X]: the file's pods at their\n"
               "                    times, a request that fits nowhere lost\n");
}

/*
 * --kube-scheduler SPEC: comma-separated `default` (the shipped configuration
 * on kube-scheduler's defaults: pods without a GPU scored too), `weight=N`
 * (0: no prioritize), `score=PCT` (percentageOfNodesToScore, 0 adaptive), `fit=least|most|off`,
 * `fit-weight=N`, `balanced=N`, `gpu-pods` (no prioritize-gpuless entry: only
 * GPU pods reach the extender), `all-pods`. Later items override earlier ones.
 * False after saying on stderr what was wrong.
 */
static bool k8s_arg(const char *text, kgpu_sim_k8s *k)
{
    *k = (kgpu_sim_k8s)KGPU_SIM_K8S_DEFAULT;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        char *end = NULL;
        long v = eq ? strtol(eq + 1, &end, 10) : 0;
        bool num = eq && end != eq + 1 && *end == '\0' && v >= 0 && v <= 1000000;
        if (strcmp(t, "default") == 0)
            continue;
        if (strncmp(t, "weight=", 7) == 0 && num)
            k->extender_weight = (int)v;
        else if (strncmp(t, "score=", 6) == 0 && num && v <= 100)
            k->nodes_to_score = (int)v;
        else if (strcmp(t, "fit=least") == 0)
            k->most_allocated = false;
        else if (strcmp(t, "fit=most") == 0)
            k->most_allocated = true;
        else if (strcmp(t, "fit=off") == 0)
            k->fit_weight = 0;
        else if (strncmp(t, "fit-weight=", 11) == 0 && num)
            k->fit_weight = (int)v;
        else if (strncmp(t, "balanced=", 9) == 0 && num)
            k->balanced_weight = (int)v;
        else if (strcmp(t, "all-pods") == 0)
            k->all_pods = true;
        else if (strcmp(t, "gpu-pods") == 0)
            k->all_pods = false;
        else {
            fprintf(stderr, "kgpu simulate: --kube-scheduler '%s': unknown item '%s'\n", text,
                    t);
            return false;
        }
    }
    return true;
}

/* --flag's number in (0, max] into *out; false after saying on stderr what was expected. */
static bool number_arg(const char *flag, const char *text, double max, const char *range,
                       double *out)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !(v > 0 && v <= max)) {
        fprintf(stderr, "kgpu simulate: --%s '%s': expected a number in %s\n", flag, text, range);
        return false;
    }
    *out = v;
    return true;
}

/* The long option whose getopt value is `val` (for messages). */
static const char *long_name(const struct option *opts, int val)
{
    for (; opts->name != NULL; opts++)
        if (opts->val == val)
            return opts->name;
    return "?";
}

int kgpu_cmd_simulate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"nodes", required_argument, NULL, 'n'},
        {"pods", required_argument, NULL, 'p'},
        {"policy", required_argument, NULL, 'P'},
        {"seeds", required_argument, NULL, 's'},
        {"inflate", required_argument, NULL, 'i'},
        {"threads", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"no-timing", no_argument, NULL, 'T'},
        {"plot", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {"random-ties", no_argument, NULL, 'R'},
        {"online", no_argument, NULL, 'O'},
        {"churn", no_argument, NULL, 'C'},
        {"speedup", required_argument, NULL, 'S'},
        {"extender-scores", no_argument, NULL, 'E'},
        {"workload", no_argument, NULL, 'W'},
        {"kube-scheduler", required_argument, NULL, 'K'},
        {"queues", required_argument, NULL, 'Q'},
        {"queue-modes", required_argument, NULL, 'M'},
        {"allocator", required_argument, NULL, 'A'},
        {"autoscale", no_argument, NULL, 'a'},
        {"prices", required_argument, NULL, 1000},
        {"expanders", required_argument, NULL, 1001},
        {"scan-interval", required_argument, NULL, 1002},
        {"provision-delay", required_argument, NULL, 1003},
        {"scale-down-unneeded-time", required_argument, NULL, 1004},
        {"scale-down-delay-after-add", required_argument, NULL, 1005},
        {"scale-down-utilization-threshold", required_argument, NULL, 1006},
        {"spot-interruptions", required_argument, NULL, 1007},
        {"spot-qos", required_argument, NULL, 1008},
        {"consolidate", required_argument, NULL, 'X'},
        {"restartable", required_argument, NULL, 'r'},
        {"clusters", required_argument, NULL, 1010},
        {"dispatch", required_argument, NULL, 1011},
        {"kueue-flavors", required_argument, NULL, 1012},
        {"mig", required_argument, NULL, 1013},
        {NULL, 0, NULL, 0},
    };
    const char *nodes_path = NULL, *pods_path = NULL, *plot_path = NULL, *queues_path = NULL;
    const char *modes_text = "none,static,priority-age,frag";
    char *policy_text = NULL;
    const char *seeds_text = "42-51";
    double inflate = 1.3, speedup = 1;
    int threads = 0;
    bool json = false, timing = true, random_ties = false, online = false;
    bool churn = false, inflate_set = false, speedup_set = false;
    bool extender_scores = false, workload = false, k8s_set = false, extender_only = false;
    kgpu_sim_allocator allocator = KGPU_SIM_ALLOC_POLICY;
    kgpu_sim_k8s k8s = KGPU_SIM_K8S_DEFAULT;
    int consolidate = 0;
    bool restartable_be = false, restartable_set = false;
    bool *best_effort = NULL;
    bool autoscale = false, autoscale_flag = false, prices_set = false;
    const char *clusters_path = NULL, *dispatch = NULL, *flavors = NULL, *mig = NULL;
    kgpu_as_opts ao = {.prices_path = "examples/prices.yaml",
                       .expanders = "kgpu,least-waste,price,random,fixed",
                       .spot_qos = "BE",
                       .base = KGPU_AUTOSCALE_DEFAULTS};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'n':
            nodes_path = optarg;
            break;
        case 'p':
            pods_path = optarg;
            break;
        case 'P':
            free(policy_text);
            policy_text = strdup(optarg);
            break;
        case 's':
            seeds_text = optarg;
            break;
        case 'i':
            if (!number_arg("inflate", optarg, 100, "(0, 100]", &inflate)) {
                free(policy_text);
                return 2;
            }
            inflate_set = true;
            break;
        case 'S':
            if (!number_arg("speedup", optarg, 1e6, "(0, 1e6]", &speedup)) {
                free(policy_text);
                return 2;
            }
            speedup_set = true;
            break;
        case 'C':
            churn = true;
            break;
        case 'Q':
            queues_path = optarg;
            break;
        case 'M':
            modes_text = optarg;
            break;
        case 't':
            threads = (int)strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || threads < 1 || threads > 256) {
                fprintf(stderr, "kgpu simulate: --threads '%s': expected 1..256\n", optarg);
                free(policy_text);
                return 2;
            }
            break;
        case 'j':
            json = true;
            break;
        case 'T':
            timing = false;
            break;
        case 'o':
            plot_path = optarg;
            break;
        case 'R':
            random_ties = true;
            break;
        case 'O':
            online = true;
            break;
        case 'E':
            extender_scores = extender_only = true;
            break;
        case 'A':
            if (strcmp(optarg, "policy") == 0) {
                allocator = KGPU_SIM_ALLOC_POLICY;
            } else if (strcmp(optarg, "dra") == 0) {
                allocator = KGPU_SIM_ALLOC_DRA;
            } else {
                fprintf(stderr, "kgpu simulate: --allocator '%s': expected policy or dra\n",
                        optarg);
                free(policy_text);
                return 2;
            }
            break;
        case 'W':
            workload = true;
            break;
        case 'X':
            consolidate = (int)strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || consolidate < 1 || consolidate > 3) {
                fprintf(stderr, "kgpu simulate: --consolidate '%s': expected 1..3 moves\n",
                        optarg);
                free(policy_text);
                return 2;
            }
            break;
        case 'r':
            if (strcmp(optarg, "all") != 0 && strcmp(optarg, "be") != 0) {
                fprintf(stderr, "kgpu simulate: --restartable '%s': expected all or be\n",
                        optarg);
                free(policy_text);
                return 2;
            }
            restartable_be = strcmp(optarg, "be") == 0;
            restartable_set = true;
            break;
        case 'a':
            autoscale = true;
            break;
        case 1000:
            ao.prices_path = optarg;
            prices_set = true;
            break;
        case 1010:
            clusters_path = optarg;
            break;
        case 1011:
            dispatch = optarg;
            break;
        case 1012:
            if (strcmp(optarg, "one") != 0 && strcmp(optarg, "per-model") != 0) {
                fprintf(stderr, "kgpu simulate: --kueue-flavors '%s': one or per-model\n",
                        optarg);
                free(policy_text);
                return 2;
            }
            flavors = optarg;
            break;
        case 1013:
            mig = optarg;
            break;
        case 1001:
            ao.expanders = optarg;
            autoscale_flag = true;
            break;
        case 1008:
            ao.spot_qos = optarg;
            autoscale_flag = true;
            break;
        case 1002:
        case 1003:
        case 1004:
        case 1005:
        case 1006:
        case 1007: {
            /* Seconds, a fraction or a rate: each checked again, with its range, by the core. */
            double v = strtod(optarg, &end);
            bool ok = end != optarg && *end == '\0' && v >= 0 && v <= 604800 &&
                      (c != 1002 || v > 0) && (c != 1006 || v <= 1);
            if (!ok) {
                fprintf(stderr, "kgpu simulate: --%s '%s': expected a number %s\n",
                        long_name(opts, c), optarg,
                        c == 1006 ? "in [0, 1]" : c == 1002 ? "in (0, 86400]" : ">= 0");
                free(policy_text);
                return 2;
            }
            double *dst[] = {&ao.base.scan_interval_s, &ao.base.provision_delay_s,
                             &ao.base.unneeded_s,      &ao.base.delay_after_add_s,
                             &ao.base.utilization,     &ao.base.spot_rate};
            *dst[c - 1002] = v;
            autoscale_flag = true;
            break;
        }
        case 'K':
            if (!k8s_arg(optarg, &k8s)) {
                free(policy_text);
                return 2;
            }
            k8s_set = extender_scores = true;
            break;
        case 'h':
            simulate_usage(stdout);
            free(policy_text);
            return 0;
        default:
            simulate_usage(stderr);
            free(policy_text);
            return 2;
        }
    }
    if (queues_path != NULL && !churn) {
        fprintf(stderr, "kgpu simulate: --queues needs --churn\n");
        free(policy_text);
        return 2;
    }
    if (restartable_set && consolidate == 0) {
        fprintf(stderr, "kgpu simulate: --restartable needs --consolidate\n");
        free(policy_text);
        return 2;
    }
    if ((dispatch != NULL || flavors != NULL) && clusters_path == NULL) {
        fprintf(stderr, "kgpu simulate: --dispatch and --kueue-flavors need --clusters\n");
        free(policy_text);
        return 2;
    }
    if (clusters_path != NULL &&
        (autoscale || churn || queues_path != NULL || plot_path != NULL || extender_scores ||
         allocator != KGPU_SIM_ALLOC_POLICY || workload || consolidate > 0 || autoscale_flag)) {
        fprintf(stderr, "kgpu simulate: --clusters takes none of --autoscale, --churn, "
                        "--queues, --plot, --extender-scores, --kube-scheduler, --allocator, "
                        "--workload, --consolidate, --expanders, --scan-interval, ...\n");
        free(policy_text);
        return 2;
    }
    if (mig != NULL && churn && inflate_set) {
        fprintf(stderr, "kgpu simulate: --mig with --churn replays the file as recorded: no "
                        "--inflate\n");
        free(policy_text);
        return 2;
    }
    if (mig != NULL &&
        (clusters_path != NULL || autoscale || queues_path != NULL || plot_path != NULL ||
         extender_scores || allocator != KGPU_SIM_ALLOC_POLICY || workload || consolidate > 0 ||
         autoscale_flag || policy_text != NULL || random_ties || online || prices_set)) {
        fprintf(stderr, "kgpu simulate: --mig takes none of --clusters, --autoscale, "
                        "--queues, --plot, --extender-scores, --kube-scheduler, --allocator, "
                        "--workload, --consolidate, --policy, --random-ties, --online, "
                        "--prices, ...\n");
        free(policy_text);
        return 2;
    }
    if (prices_set && !autoscale && clusters_path == NULL) {
        fprintf(stderr, "kgpu simulate: --prices needs --autoscale or --clusters\n");
        free(policy_text);
        return 2;
    }
    if (autoscale_flag && !autoscale) {
        fprintf(stderr, "kgpu simulate: --expanders, --scan-interval, "
                        "--provision-delay, --scale-down-*, --spot-* need --autoscale\n");
        free(policy_text);
        return 2;
    }
    if (autoscale && (churn || queues_path != NULL || plot_path != NULL || extender_scores ||
                      allocator != KGPU_SIM_ALLOC_POLICY || workload || policy_text != NULL ||
                      consolidate > 0)) {
        fprintf(stderr, "kgpu simulate: --autoscale takes none of --churn, --queues, --plot, "
                        "--policy (the scheduler is kgpu's), --extender-scores, "
                        "--kube-scheduler, --allocator, --workload, --consolidate\n");
        free(policy_text);
        return 2;
    }
    if (speedup_set && !churn && !autoscale) {
        fprintf(stderr, "kgpu simulate: --speedup needs --churn or --autoscale\n");
        free(policy_text);
        return 2;
    }
    if (nodes_path == NULL || pods_path == NULL || optind < argc) {
        fprintf(stderr, "kgpu simulate: %s\n",
                optind < argc ? "unexpected argument" : "--nodes and --pods are required");
        simulate_usage(stderr);
        free(policy_text);
        return 2;
    }
    const char *policies[MAX_POLICIES];
    int npolicies = 0;
    if (policy_text == NULL && clusters_path != NULL) {
        policies[npolicies++] = "kgpu"; /* the placement within each cluster */
    } else if (policy_text == NULL) {
        for (const kgpu_policy_ops *const *p = kgpu_policy_list(); *p && npolicies < MAX_POLICIES;
             p++)
            policies[npolicies++] = (*p)->name;
    } else {
        for (char *save = NULL, *t = strtok_r(policy_text, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (npolicies == MAX_POLICIES) {
                fprintf(stderr, "kgpu simulate: more than %d policies\n", MAX_POLICIES);
                free(policy_text);
                return 2;
            }
            if (kgpu_policy_find(t) == NULL) {
                fprintf(stderr, "kgpu simulate: unknown policy '%s' (see --help)\n", t);
                free(policy_text);
                return 2;
            }
            policies[npolicies++] = t;
        }
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    uint64_t seeds[MAX_SEEDS];
    int nseeds = 0, status = 1;
    kgpu_sim_input in;
    memset(&in, 0, sizeof(in));
    kgpu_study study;
    memset(&study, 0, sizeof(study));
    if (npolicies == 0) {
        kgpu_error_set(&err, KGPU_EINVAL, "--policy is empty");
        goto out;
    }
    if (kgpu_parse_seeds(seeds_text, seeds, MAX_SEEDS, &nseeds, &err) != 0)
        goto out;
    if (clusters_path != NULL) {
        if (npolicies != 1) {
            kgpu_error_set(&err, KGPU_EINVAL, "--clusters places with one --policy (default "
                                              "kgpu), not %d", npolicies);
            goto out;
        }
        if (kgpu_load_input(nodes_path, pods_path, &in, &err) != 0)
            goto out;
        kgpu_mc_opts mo = {.in = &in,
                           .nodes_path = nodes_path,
                           .pods_path = pods_path,
                           .clusters_path = clusters_path,
                           .prices_path = prices_set ? ao.prices_path : NULL,
                           .dispatch = dispatch ? dispatch : "one,kgpu,all-at-once,incremental,"
                                                             "static",
                           .policy = policies[0],
                           .seeds = seeds,
                           .nseeds = nseeds,
                           .threads = threads,
                           .inflate = inflate,
                           .quota_per_model = flavors != NULL && strcmp(flavors, "per-model") == 0,
                           .json = json,
                           .timing = timing};
        status = kgpu_simulate_clusters(&mo);
        kgpu_sim_input_free(&in);
        free(policy_text);
        return status;
    }
    if (mig != NULL) {
        kgpu_churn_input ch;
        memset(&ch, 0, sizeof(ch));
        if (load_traces(nodes_path, pods_path, &in, churn ? &ch : NULL, NULL, NULL, NULL, NULL,
                        &err) != 0)
            goto out;
        kgpu_mig_opts mo = {.in = &in,
                            .ch = churn ? &ch : NULL,
                            .speedup = speedup,
                            .pods_path = pods_path,
                            .models = mig,
                            .seeds = seeds,
                            .nseeds = nseeds,
                            .threads = threads,
                            .inflate = inflate,
                            .json = json,
                            .timing = timing};
        status = kgpu_simulate_mig(&mo);
        kgpu_churn_input_free(&ch);
        kgpu_sim_input_free(&in);
        free(policy_text);
        return status;
    }
    if (autoscale) {
        ao.nodes_path = nodes_path;
        ao.pods_path = pods_path;
        ao.seeds = seeds;
        ao.nseeds = nseeds;
        ao.threads = threads;
        ao.json = json;
        ao.timing = timing;
        ao.base.speedup = speedup;
        ao.base.inflate = inflate_set ? inflate : 0;
        free(policy_text);
        return kgpu_simulate_autoscale(&ao);
    }
    if (workload) {
        if (nseeds != 1 || churn) {
            kgpu_error_set(&err, KGPU_EINVAL, "--workload takes one seed and no --churn");
            goto out;
        }
        status = print_workload(nodes_path, pods_path, seeds[0], inflate);
        free(policy_text);
        return status;
    }
    if (extender_scores && churn) {
        kgpu_error_set(&err, KGPU_EINVAL, "--extender-scores does not work with --churn yet");
        goto out;
    }
    if (allocator == KGPU_SIM_ALLOC_DRA && churn) {
        kgpu_error_set(&err, KGPU_EINVAL, "--allocator dra does not work with --churn yet");
        goto out;
    }
    if (allocator == KGPU_SIM_ALLOC_DRA && extender_only && !k8s_set) {
        /* The DRA allocator sits inside kube-scheduler: its node choice comes with it. */
        kgpu_error_set(&err, KGPU_EINVAL,
                       "--allocator dra takes --kube-scheduler SPEC, not --extender-scores");
        goto out;
    }
    if (allocator == KGPU_SIM_ALLOC_DRA)
        k8s_set = extender_scores = true; /* k8s holds the default when no SPEC was given */
    if (consolidate > 0 && extender_scores) {
        kgpu_error_set(&err, KGPU_EINVAL,
                       "--consolidate is simulated under the policy's own choice only (no "
                       "--extender-scores, --kube-scheduler or --allocator dra)");
        goto out;
    }
    if (churn) {
        kgpu_churn_queue_mode modes[4];
        int nmodes = 0;
        if (kgpu_simq_parse_modes(modes_text, modes, 4, &nmodes, &err) != 0)
            goto out;
        churn_opts co = {.nodes_path = nodes_path,
                         .queues_path = queues_path,
                         .modes = modes,
                         .nmodes = nmodes,
                         .pods_path = pods_path,
                         .plot_path = plot_path,
                         .policies = policies,
                         .npolicies = npolicies,
                         .threads = threads,
                         .seeds = seeds,
                         .nseeds = nseeds,
                         .speedup = speedup,
                         .inflate = inflate_set ? inflate : 0,
                         .json = json,
                         .timing = timing,
                         .random_ties = random_ties,
                         .online = online,
                         .consolidate = consolidate,
                         .restartable_be = restartable_be};
        status = run_churn(&co);
        free(policy_text);
        return status;
    }
    if (load_traces(nodes_path, pods_path, &in, NULL, NULL, NULL, NULL,
                    restartable_be ? &best_effort : NULL, &err) != 0)
        goto out;
    if (kgpu_study_init(&study, &in, policies, npolicies, seeds, nseeds, inflate, &err) != 0)
        goto out;
    study.threads = threads;
    study.random_ties = random_ties;
    study.online = online;
    study.extender_scores = extender_scores ? 1 : 0;
    study.k8s = k8s_set ? &k8s : NULL;
    study.allocator = allocator;
    study.consolidate = consolidate;
    study.restartable = best_effort;
    study.progress = isatty(STDERR_FILENO);
    if (kgpu_study_run(&study, &err) != 0)
        goto out;
    if (json) {
        kgpu_study_print_json(kgpu_study_json(&study, timing));
    } else {
        print_table(stdout, &study, pods_path);
    }
    if (plot_path != NULL && write_plot(plot_path, &study, &err) != 0)
        goto out;
    if (kgpu_study_flush(&err) != 0)
        goto out;
    status = 0;
out:
    if (status != 0)
        fprintf(stderr, "kgpu simulate: %s\n", err.msg[0] ? err.msg : kgpu_strerror(err.code));
    kgpu_study_free(&study);
    kgpu_sim_input_free(&in);
    free(best_effort);
    free(policy_text);
    return status;
}
