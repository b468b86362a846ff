/*
 * `kgpu simulate --mig MODELS` (simmig.h): one job per (model, seed) on the
 * shared thread pool, each replaying that seed's arrivals (the study's
 * draws and shuffle, kgpu_sim_workload) through every strategy and the
 * offline bound; medians per model.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jobs.h"
#include "kgpu/churn.h"
#include "kgpu/migsim.h"
#include "simmig.h"

#define MAX_MODELS 8

typedef struct mig_run {
    kgpu_migsim_result r[KGPU_MIGSIM_STRATEGIES];
    kgpu_migsim_bound b;
    long profiles[KGPU_MIG_MAX_PROFILES]; /* GPU requests by profile index */
    long none;                            /* GPU requests no profile holds */
    long multi;                           /* GPU requests for more than one GPU */
    double wall;
} mig_run;

typedef struct mig_study {
    const kgpu_mig_opts *o;
    kgpu_migsim_input in[MAX_MODELS];
    int nmodels;
    int nseeds; /* runs per model: the seeds, or 1 with time (no draws) */
    mig_run *runs; /* model * nseeds + seed */
    double *arrive, *life; /* with time: per arrival of o->ch->order */
} mig_study;

/* Counts arrival q into the run's profile mix. */
static void count_mix(mig_run *run, const kgpu_migsim_request *q)
{
    if (q->count > 0 && q->profile >= 0)
        run->profiles[q->profile]++;
    else if (q->count > 0)
        run->none++;
    run->multi += q->count > 1;
}

/* With time: the file's pods at their times, each strategy once (nothing is drawn). */
static int mig_time_job(mig_study *s, int j, kgpu_error *err)
{
    const kgpu_migsim_input *in = &s->in[j];
    const kgpu_churn_input *ch = s->o->ch;
    mig_run *run = &s->runs[j];
    double t0 = kgpu_now();
    int rc = 0;
    for (size_t a = 0; a < in->nrequests; a++)
        count_mix(run, &in->requests[ch->order[a]]);
    for (int k = 0; rc == 0 && k < KGPU_MIGSIM_STRATEGIES; k++)
        rc = kgpu_migsim_run_times(in, (kgpu_migsim_strategy)k, ch->order, s->arrive, s->life,
                                   in->nrequests, &run->r[k], err);
    run->b.requests = run->r[0].requests;
    run->wall = kgpu_now() - t0;
    return rc;
}

static int mig_job(void *ctx, int j, kgpu_error *err)
{
    mig_study *s = ctx;
    if (s->o->ch != NULL)
        return mig_time_job(s, j, err);
    const kgpu_migsim_input *in = &s->in[j / s->nseeds];
    mig_run *run = &s->runs[j];
    double t0 = kgpu_now();
    size_t *order = NULL, n = 0;
    int rc = kgpu_sim_workload(s->o->in, s->o->seeds[j % s->nseeds], s->o->inflate, &order, &n,
                               err);
    for (size_t a = 0; rc == 0 && a < n; a++)
        count_mix(run, &in->requests[order[a]]);
    for (int k = 0; rc == 0 && k < KGPU_MIGSIM_STRATEGIES; k++)
        rc = kgpu_migsim_run(in, (kgpu_migsim_strategy)k, order, n, &run->r[k], err);
    if (rc == 0)
        rc = kgpu_migsim_offline(in, order, n, &run->b, err);
    free(order);
    run->wall = kgpu_now() - t0;
    return rc;
}

static int cmp_dbl(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* One figure of one run; k: the strategy, where the figure has one. */
typedef double (*mig_get)(const kgpu_migsim_input *in, const mig_run *r, int k);

static double pct(long a, long b)
{
    return b > 0 ? (double)a * 100.0 / (double)b : 0;
}
static double get_placed(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in;
    return (double)r->r[k].placed;
}
static double get_placed_pct(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in;
    return pct(r->r[k].placed, r->b.requests);
}
static double get_gpus(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in;
    return (double)r->r[k].gpus_used;
}
static double get_failed_full(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in;
    return (double)r->r[k].failed_by_full;
}
/* Slices asked for when the first request failed, % of capacity; never: 999. */
static double get_first_fail(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in;
    return r->r[k].first_fail_pct < 0 ? 999 : r->r[k].first_fail_pct;
}
/* Compute slices placed when those asked for reached the GPUs' 7 each, % of them. */
static double get_slices_full(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    return pct(r->r[k].slices_at_full, (long)in->gpus * KGPU_MIG_COMPUTE_SLICES);
}
/* Compute slices placed, as a share of every GPU's 7. */
static double get_slices_pct(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    return pct(r->r[k].slices, (long)in->gpus * KGPU_MIG_COMPUTE_SLICES);
}
/* Points of the requests between the strategy and the LP bound. */
static double get_behind(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in;
    return pct(r->b.upper - r->r[k].placed, r->b.requests);
}
static double get_requests(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return (double)r->b.requests;
}
static double get_possible(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return (double)r->b.possible;
}
static double get_upper(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return (double)r->b.upper;
}
static double get_upper_pct(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return pct(r->b.upper, r->b.requests);
}
static double get_packed(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return (double)r->b.packed;
}
static double get_packed_pct(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return pct(r->b.packed, r->b.requests);
}
static double get_packed_behind(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    (void)in, (void)k;
    return pct(r->b.upper - r->b.packed, r->b.requests);
}

static double get_mean_use(const kgpu_migsim_input *in, const mig_run *r, int k)
{
    long total = (long)in->gpus * KGPU_MIG_COMPUTE_SLICES;
    return total > 0 ? r->r[k].mean_in_use * 100.0 / (double)total : 0;
}

/* The median over seeds of model mi's get(run, k). */
static double median(const mig_study *s, int mi, mig_get get, int k)
{
    int n = s->nseeds;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (v == NULL)
        return 0;
    for (int i = 0; i < n; i++)
        v[i] = get(&s->in[mi], &s->runs[mi * n + i], k);
    qsort(v, (size_t)n, sizeof(double), cmp_dbl);
    double m = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    free(v);
    return m;
}

/* Whether the packing reached the bound in every seed of model mi. */
static bool optimal(const mig_study *s, int mi)
{
    for (int k = 0; k < s->nseeds; k++)
        if (s->runs[mi * s->nseeds + k].b.packed != s->runs[mi * s->nseeds + k].b.upper)
            return false;
    return true;
}

/* Requests by profile over every seed of model mi: counts in v[0..nprofiles), v[nprofiles] none. */
static long profile_mix(const mig_study *s, int mi, long *v, long *multi)
{
    long total = 0;
    const kgpu_mig_model *m = s->in[mi].model;
    memset(v, 0, sizeof(long) * (KGPU_MIG_MAX_PROFILES + 1));
    *multi = 0;
    for (int k = 0; k < s->nseeds; k++) {
        const mig_run *r = &s->runs[mi * s->nseeds + k];
        for (int pi = 0; pi < m->nprofiles; pi++)
            v[pi] += r->profiles[pi];
        v[m->nprofiles] += r->none;
        *multi += r->multi;
        total += r->b.requests;
    }
    return total;
}

static void mix_line(FILE *f, const mig_study *s, int mi)
{
    const kgpu_mig_model *m = s->in[mi].model;
    long mix[KGPU_MIG_MAX_PROFILES + 1], multi;
    long total = profile_mix(s, mi, mix, &multi);
    fprintf(f, "as profiles:");
    for (int pi = 0; pi < m->nprofiles; pi++)
        if (mix[pi] > 0)
            fprintf(f, " %s %.1f%%", m->profiles[pi].name, pct(mix[pi], total));
    if (mix[m->nprofiles] > 0)
        fprintf(f, " none %.1f%%", pct(mix[m->nprofiles], total));
    fprintf(f, "; on 2+ GPUs %.1f%%\n\n", pct(multi, total));
}

static void mig_time_table(FILE *f, const mig_study *s)
{
    const kgpu_mig_opts *o = s->o;
    for (int mi = 0; mi < s->nmodels; mi++) {
        const kgpu_migsim_input *in = &s->in[mi];
        fprintf(f, "%sMIG %s with time: %d nodes, %d GPUs; workload %s (%zu pods) at its times, "
                   "arrivals x%g; a request that fits nowhere is lost\n",
                mi > 0 ? "\n" : "", in->model->name, in->nnodes, in->gpus, o->pods_path,
                o->in->nrequests, o->speedup);
        fprintf(f, "GPU requests %ld; ", s->runs[mi].b.requests);
        mix_line(f, s, mi);
        fprintf(f, "%-16s %8s %9s %16s %12s %12s\n", "strategy", "placed", "placed %",
                "slices placed %", "1st loss at", "mean in use");
        for (int k = 0; k < KGPU_MIGSIM_STRATEGIES; k++) {
            const kgpu_migsim_result *r = &s->runs[mi].r[k];
            char first[16] = "never";
            if (r->first_fail_pct >= 0)
                snprintf(first, sizeof(first), "%.1f%%", r->first_fail_pct);
            fprintf(f, "%-16s %8ld %8.2f%% %15.2f%% %12s %11.2f%%\n",
                    kgpu_migsim_strategy_name((kgpu_migsim_strategy)k), r->placed,
                    pct(r->placed, r->requests), pct(r->slices, r->asked), first,
                    get_mean_use(in, &s->runs[mi], k));
        }
    }
    fprintf(f, "\n(slices placed %%: compute slices of the requests placed, %% of those asked "
               "for; 1st loss at:\ncompute slices in use, %% of the GPUs' 7 each, when the "
               "first request was lost; mean in use:\nthe same, time-weighted from the first "
               "arrival to the last)\n");
}

static void mig_table(FILE *f, const mig_study *s)
{
    const kgpu_mig_opts *o = s->o;
    for (int mi = 0; mi < s->nmodels; mi++) {
        const kgpu_migsim_input *in = &s->in[mi];
        const kgpu_mig_model *m = in->model;
        fprintf(f, "%sMIG %s: %d nodes, %d GPUs; workload %s (%zu pods), inflated to %.2fx; "
                   "seeds %" PRIu64 "..%" PRIu64 " (%d)\n",
                mi > 0 ? "\n" : "", m->name, in->nnodes, in->gpus, o->pods_path, o->in->nrequests,
                o->inflate, o->seeds[0], o->seeds[s->nseeds - 1], s->nseeds);
        fprintf(f, "GPU requests %.0f (an empty node could take %.0f); ",
                median(s, mi, get_requests, 0), median(s, mi, get_possible, 0));
        mix_line(f, s, mi);
        fprintf(f, "%-16s %8s %9s %7s %11s %12s %10s %9s %9s\n", "strategy", "placed",
                "placed %", "behind", "failed@100%", "slices@100%", "1st fail@", "slices %",
                "GPUs used");
        for (int k = 0; k < KGPU_MIGSIM_STRATEGIES; k++) {
            char first[16] = "never";
            double ff = median(s, mi, get_first_fail, k);
            if (ff < 999)
                snprintf(first, sizeof(first), "%.1f%%", ff);
            fprintf(f, "%-16s %8.0f %8.2f%% %7.2f %11.0f %11.2f%% %10s %8.2f%% %9.0f\n",
                    kgpu_migsim_strategy_name((kgpu_migsim_strategy)k),
                    median(s, mi, get_placed, k), median(s, mi, get_placed_pct, k),
                    median(s, mi, get_behind, k), median(s, mi, get_failed_full, k),
                    median(s, mi, get_slices_full, k), first, median(s, mi, get_slices_pct, k),
                    median(s, mi, get_gpus, k));
        }
        fprintf(f, "%-16s %8.0f %8.2f%% %7.2f\n", "offline packing",
                median(s, mi, get_packed, 0), median(s, mi, get_packed_pct, 0),
                median(s, mi, get_packed_behind, 0));
        fprintf(f, "%-16s %8.0f %8.2f%%%s\n", "bound (LP)", median(s, mi, get_upper, 0),
                median(s, mi, get_upper_pct, 0),
                optimal(s, mi) ? "   = the optimum: the packing reaches it in every seed" : "");
    }
    fprintf(f, "\n(medians over seeds. placed %%: of the GPU requests; behind: points of the "
               "requests between it and\nthe most any placement could place (bound); the slices "
               "asked for: count x the profile's\ncompute slices; failed@100%% and slices@100%%: "
               "requests failed and slices placed, %% of the\nGPUs' 7 each, when those asked for "
               "reached that total; 1st fail@: the slices asked for, %%\nof it, at the first "
               "failure; slices %%: placed at the end)\n");
}

static json_t *int_array_of(const mig_study *s, int mi, mig_get get, int k)
{
    json_t *a = json_array();
    for (int i = 0; i < s->nseeds; i++)
        json_array_append_new(
            a, json_integer((json_int_t)get(&s->in[mi], &s->runs[mi * s->nseeds + i], k)));
    return a;
}

static json_t *mix_json(const mig_study *s, int mi, long *multi)
{
    const kgpu_mig_model *m = s->in[mi].model;
    json_t *mix = json_object();
    long v[KGPU_MIG_MAX_PROFILES + 1];
    profile_mix(s, mi, v, multi);
    for (int pi = 0; pi < m->nprofiles; pi++)
        if (v[pi] > 0)
            json_object_set_new(mix, m->profiles[pi].name, json_integer(v[pi]));
    if (v[m->nprofiles] > 0)
        json_object_set_new(mix, "none", json_integer(v[m->nprofiles]));
    return mix;
}

static json_t *mig_time_json(const mig_study *s)
{
    const kgpu_mig_opts *o = s->o;
    json_t *root = json_object(), *models = json_array();
    json_object_set_new(root, "mode", json_string("mig-churn"));
    json_object_set_new(root, "nodes", json_integer(s->in[0].nnodes));
    json_object_set_new(root, "gpus", json_integer(s->in[0].gpus));
    json_object_set_new(root, "pods_in_file", json_integer((json_int_t)o->in->nrequests));
    json_object_set_new(root, "speedup", json_real(o->speedup));
    for (int mi = 0; mi < s->nmodels; mi++) {
        const mig_run *run = &s->runs[mi];
        json_t *x = json_object(), *results = json_array();
        long multi;
        json_object_set_new(x, "model", json_string(s->in[mi].model->name));
        json_object_set_new(x, "requests", json_integer(run->b.requests));
        json_object_set_new(x, "profiles", mix_json(s, mi, &multi));
        json_object_set_new(x, "multi_gpu", json_integer(multi));
        for (int k = 0; k < KGPU_MIGSIM_STRATEGIES; k++) {
            const kgpu_migsim_result *r = &run->r[k];
            json_t *y = json_object();
            json_object_set_new(y, "strategy",
                                json_string(kgpu_migsim_strategy_name((kgpu_migsim_strategy)k)));
            json_object_set_new(y, "placed", json_integer(r->placed));
            json_object_set_new(y, "placed_pct", json_real(pct(r->placed, r->requests)));
            json_object_set_new(y, "slices_placed_pct", json_real(pct(r->slices, r->asked)));
            json_object_set_new(y, "first_loss_pct", r->first_fail_pct >= 0
                                                         ? json_real(r->first_fail_pct)
                                                         : json_null());
            json_object_set_new(y, "mean_in_use_pct", json_real(get_mean_use(&s->in[mi], run, k)));
            json_array_append_new(results, y);
        }
        json_object_set_new(x, "results", results);
        json_object_set_new(x, "wall_s", json_real(o->timing ? run->wall : 0.0));
        json_array_append_new(models, x);
    }
    json_object_set_new(root, "models", models);
    return root;
}

static json_t *mig_json(const mig_study *s)
{
    const kgpu_mig_opts *o = s->o;
    json_t *root = json_object(), *models = json_array(), *seeds = json_array();
    json_object_set_new(root, "mode", json_string("mig"));
    json_object_set_new(root, "nodes", json_integer(s->in[0].nnodes));
    json_object_set_new(root, "gpus", json_integer(s->in[0].gpus));
    json_object_set_new(root, "pods_in_file", json_integer((json_int_t)o->in->nrequests));
    json_object_set_new(root, "inflate", json_real(o->inflate));
    for (int k = 0; k < s->nseeds; k++)
        json_array_append_new(seeds, json_integer((json_int_t)o->seeds[k]));
    json_object_set_new(root, "seeds", seeds);
    for (int mi = 0; mi < s->nmodels; mi++) {
        const kgpu_mig_model *m = s->in[mi].model;
        json_t *x = json_object(), *results = json_array();
        long multi;
        json_t *mix = mix_json(s, mi, &multi);
        json_object_set_new(x, "model", json_string(m->name));
        json_object_set_new(x, "requests", json_real(median(s, mi, get_requests, 0)));
        json_object_set_new(x, "possible", json_real(median(s, mi, get_possible, 0)));
        json_object_set_new(x, "profiles_all_seeds", mix);
        json_object_set_new(x, "multi_gpu_all_seeds", json_integer(multi));
        for (int k = 0; k < KGPU_MIGSIM_STRATEGIES; k++) {
            json_t *r = json_object();
            json_object_set_new(r, "strategy",
                                json_string(kgpu_migsim_strategy_name((kgpu_migsim_strategy)k)));
            json_object_set_new(r, "placed", json_real(median(s, mi, get_placed, k)));
            json_object_set_new(r, "placed_pct", json_real(median(s, mi, get_placed_pct, k)));
            json_object_set_new(r, "gpus_used", json_real(median(s, mi, get_gpus, k)));
            json_object_set_new(r, "slices_pct", json_real(median(s, mi, get_slices_pct, k)));
            json_object_set_new(r, "behind_bound_pts", json_real(median(s, mi, get_behind, k)));
            json_object_set_new(r, "failed_by_full", json_real(median(s, mi, get_failed_full, k)));
            json_object_set_new(r, "slices_pct_at_full",
                                json_real(median(s, mi, get_slices_full, k)));
            double ff = median(s, mi, get_first_fail, k);
            json_object_set_new(r, "first_fail_pct", ff < 999 ? json_real(ff) : json_null());
            json_object_set_new(r, "placed_by_seed", int_array_of(s, mi, get_placed, k));
            json_array_append_new(results, r);
        }
        json_object_set_new(x, "results", results);
        json_t *off = json_object();
        json_object_set_new(off, "upper", json_real(median(s, mi, get_upper, 0)));
        json_object_set_new(off, "upper_pct", json_real(median(s, mi, get_upper_pct, 0)));
        json_object_set_new(off, "packed", json_real(median(s, mi, get_packed, 0)));
        json_object_set_new(off, "packed_pct", json_real(median(s, mi, get_packed_pct, 0)));
        json_object_set_new(off, "optimal", json_boolean(optimal(s, mi)));
        json_object_set_new(off, "upper_by_seed", int_array_of(s, mi, get_upper, 0));
        json_object_set_new(off, "packed_by_seed", int_array_of(s, mi, get_packed, 0));
        json_object_set_new(x, "offline", off);
        double wall = 0;
        for (int i = 0; i < s->nseeds; i++)
            wall += s->runs[mi * s->nseeds + i].wall;
        json_object_set_new(x, "wall_s", json_real(o->timing ? wall : 0.0));
        json_array_append_new(models, x);
    }
    json_object_set_new(root, "models", models);
    return root;
}

/* The models of the comma list into s->in; 2 (usage) with a message when one is unknown. */
static int parse_models(mig_study *s, const char *text, kgpu_error *err)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const kgpu_mig_model *m = kgpu_mig_model_named(t);
        if (m == NULL) {
            char known[160] = "";
            for (int i = 0; i < kgpu_mig_model_count(); i++)
                snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s",
                         i ? ", " : "", kgpu_mig_model_at(i)->name);
            return kgpu_error_set(err, KGPU_EINVAL, "--mig: unknown model '%s' (%s)", t, known);
        }
        for (int i = 0; i < s->nmodels; i++)
            if (s->in[i].model == m)
                return kgpu_error_set(err, KGPU_EINVAL, "--mig: '%s' twice", t);
        if (s->nmodels == MAX_MODELS)
            return kgpu_error_set(err, KGPU_EINVAL, "--mig: more than %d models", MAX_MODELS);
        s->in[s->nmodels++].model = m;
    }
    if (s->nmodels == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "--mig is empty");
    return 0;
}

int kgpu_simulate_mig(const kgpu_mig_opts *o)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    mig_study s;
    memset(&s, 0, sizeof(s));
    s.o = o;
    if (parse_models(&s, o->models, &err) != 0) {
        fprintf(stderr, "kgpu simulate: %s\n", err.msg);
        return 2;
    }
    int status = 1, rc = 0, ready = 0;
    for (; rc == 0 && ready < s.nmodels; ready++) {
        const kgpu_mig_model *m = s.in[ready].model;
        rc = kgpu_migsim_prepare(o->in, m, &s.in[ready], &err);
    }
    if (rc != 0)
        ready--; /* the one that failed holds nothing */
    s.nseeds = o->ch != NULL ? 1 : o->nseeds;
    size_t nruns = (size_t)s.nmodels * (size_t)s.nseeds;
    if (rc == 0 && o->ch != NULL) {
        size_t n = o->in->nrequests;
        s.arrive = malloc(sizeof(double) * (n > 0 ? n : 1));
        s.life = malloc(sizeof(double) * (n > 0 ? n : 1));
        if (s.arrive == NULL || s.life == NULL)
            rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
        for (size_t a = 0; rc == 0 && a < n; a++) {
            s.arrive[a] = o->ch->creation[o->ch->order[a]] / o->speedup;
            s.life[a] = o->ch->lifetime[o->ch->order[a]];
        }
    }
    if (rc == 0 && (s.runs = calloc(nruns, sizeof(*s.runs))) == NULL)
        rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    if (rc != 0 || kgpu_jobs_run((int)nruns, o->threads, false, mig_job, &s, &err) != 0)
        goto out;
    if (o->json)
        kgpu_study_print_json(o->ch != NULL ? mig_time_json(&s) : mig_json(&s));
    else if (o->ch != NULL)
        mig_time_table(stdout, &s);
    else
        mig_table(stdout, &s);
    if (kgpu_study_flush(&err) != 0)
        goto out;
    status = 0;
out:
    if (status != 0)
        fprintf(stderr, "kgpu simulate: %s\n", err.msg[0] ? err.msg : kgpu_strerror(err.code));
    for (int i = 0; i < ready; i++)
        kgpu_migsim_input_free(&s.in[i]);
    free(s.runs);
    free(s.arrive);
    free(s.life);
    return status;
}
