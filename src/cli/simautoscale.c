/*
 * `kgpu simulate --autoscale` (simautoscale.h): loads the traces and the
 * prices, runs every (expander, seed) on a small worker pool as --churn
 * does, then the fixed cluster sized by kgpu's runs, and prints medians
 * over seeds. All I/O of the autoscaled replay lives here.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "pricefile.h"
#include "simautoscale.h"
#include "study.h"

#define AS_MAX_ROWS 8

typedef struct as_row {
    char name[16];
    bool fixed, hidden; /* hidden: kgpu run only to size the fixed cluster */
    kgpu_expander_kind kind;
    kgpu_autoscale_result *runs; /* per seed */
    double *wall_s;
} as_row;

typedef struct as_study {
    const kgpu_autoscale_input *in;
    const kgpu_as_opts *o;
    const kgpu_prices *prices;
    as_row rows[AS_MAX_ROWS];
    int nrows;
    int kgpu_row; /* the row whose peaks size the fixed cluster, or -1 */
    bool fixed_phase;
} as_study;

/* Job j: row j / nseeds, seed j % nseeds, when the row belongs to this phase (jobs.h). */
static int as_job(void *ctx, int j, kgpu_error *err)
{
    as_study *s = ctx;
    as_row *row = &s->rows[j / s->o->nseeds];
    int k = j % s->o->nseeds;
    if (row->fixed != s->fixed_phase)
        return 0;
    kgpu_autoscale_config cfg = s->o->base;
    cfg.seed = s->o->seeds[k];
    cfg.prices = s->prices;
    cfg.expander = row->kind;
    int fixed[KGPU_AS_MAX_GROUPS] = {0};
    if (row->fixed) {
        /* Per shape, the most nodes kgpu's run of this seed held at once, all on-demand. */
        const kgpu_autoscale_result *kr = &s->rows[s->kgpu_row].runs[k];
        for (int g = 0; g < s->in->ngroups; g += 2)
            fixed[g] = kr->peak_shape[g / 2];
        cfg.mode = KGPU_AS_FIXED;
        cfg.fixed_nodes = fixed;
    }
    double t0 = kgpu_now();
    int rc = kgpu_autoscale_run(s->in, &cfg, &row->runs[k], err);
    row->wall_s[k] = kgpu_now() - t0;
    return rc;
}

static int as_phase(as_study *s, bool fixed, kgpu_error *err)
{
    s->fixed_phase = fixed;
    return kgpu_jobs_run(s->nrows * s->o->nseeds, s->o->threads, false, as_job, s, err);
}

/* The figures of a row, one per seed, by name: what the table and the JSON show. */
typedef double (*as_get)(const kgpu_autoscale_result *r);
#define GETTER(name, expr)                                                                         \
    static double get_##name(const kgpu_autoscale_result *r) { return (double)(expr); }
GETTER(bought, r->gpu_hours_bought)
GETTER(cost, r->cost)
GETTER(used, r->gpu_hours_used)
GETTER(wait_mean, r->wait_mean_s)
GETTER(wait_p50, r->wait_p50_s)
GETTER(wait_p99, r->wait_p99_s)
GETTER(never, r->never_placed)
GETTER(scale_ups, r->scale_ups)
GETTER(added, r->nodes_added)
GETTER(useless, r->useless_nodes)
GETTER(removed, r->nodes_removed)
GETTER(interruptions, r->interruptions)
GETTER(restarted, r->restarted)
GETTER(lost, r->lost_gpu_hours)
GETTER(on_spot, r->pods_on_spot)
GETTER(peak, r->peak_nodes)
GETTER(pods, r->pods)
GETTER(span_h, (r->t_end - r->t_first) / 3600.0)
GETTER(day_bought, r->arrival_gpu_hours_bought)
GETTER(day_cost, r->arrival_cost)
GETTER(day_h, (r->t_last - r->t_first) / 3600.0)

static const struct {
    const char *json;
    as_get get;
} measures[] = {
    {"gpu_hours_bought", get_bought},   {"cost", get_cost},
    {"gpu_hours_used", get_used},       {"wait_mean_s", get_wait_mean},
    {"wait_p50_s", get_wait_p50},       {"wait_p99_s", get_wait_p99},
    {"never_placed", get_never},        {"scale_ups", get_scale_ups},
    {"nodes_added", get_added},         {"useless_nodes", get_useless},
    {"nodes_removed", get_removed},     {"spot_interruptions", get_interruptions},
    {"pods_restarted", get_restarted},  {"lost_gpu_hours", get_lost},
    {"pods_on_spot", get_on_spot},      {"peak_nodes", get_peak},
    {"pods", get_pods},                 {"span_hours", get_span_h},
    {"arrival_span_hours", get_day_h},  {"arrival_gpu_hours_bought", get_day_bought},
    {"arrival_cost", get_day_cost},
};

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median over seeds (the mean of the middle two for an even count); min and max. */
static double median(const as_row *row, int nseeds, as_get get, double *lo, double *hi)
{
    double v[1000];
    int n = nseeds < 1000 ? nseeds : 1000;
    for (int k = 0; k < n; k++)
        v[k] = get(&row->runs[k]);
    qsort(v, (size_t)n, sizeof(v[0]), cmp_double);
    if (lo)
        *lo = v[0];
    if (hi)
        *hi = v[n - 1];
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static json_t *as_json(const as_study *s)
{
    const kgpu_as_opts *o = s->o;
    json_t *root = json_object();
    json_object_set_new(root, "mode", json_string("autoscale"));
    json_object_set_new(root, "node_groups", json_integer(s->in->ngroups));
    json_object_set_new(root, "pods_in_file", json_integer((json_int_t)s->in->churn->sim->nrequests));
    json_object_set_new(root, "speedup", json_real(o->base.speedup));
    json_object_set_new(root, "inflate", json_real(o->base.inflate));
    json_object_set_new(root, "currency", json_string(s->prices->currency));
    json_object_set_new(root, "scan_interval_s", json_real(o->base.scan_interval_s));
    json_object_set_new(root, "provision_delay_s", json_real(o->base.provision_delay_s));
    json_object_set_new(root, "scale_down_unneeded_s", json_real(o->base.unneeded_s));
    json_object_set_new(root, "scale_down_delay_after_add_s", json_real(o->base.delay_after_add_s));
    json_object_set_new(root, "scale_down_utilization", json_real(o->base.utilization));
    json_object_set_new(root, "spot_interruptions_per_node_hour", json_real(o->base.spot_rate));
    json_object_set_new(root, "spot_qos", json_string(o->spot_qos));
    json_t *seeds = json_array();
    for (int k = 0; k < o->nseeds; k++)
        json_array_append_new(seeds, json_integer((json_int_t)o->seeds[k]));
    json_object_set_new(root, "seeds", seeds);
    json_t *results = json_array();
    for (int r = 0; r < s->nrows; r++) {
        const as_row *row = &s->rows[r];
        if (row->hidden)
            continue;
        json_t *x = json_object();
        json_object_set_new(x, "expander", json_string(row->name));
        for (size_t m = 0; m < sizeof(measures) / sizeof(measures[0]); m++)
            json_object_set_new(x, measures[m].json,
                                json_real(median(row, o->nseeds, measures[m].get, NULL, NULL)));
        json_t *bc = json_array(), *bw = json_array(), *bp = json_array();
        double wall = 0;
        for (int k = 0; k < o->nseeds; k++) {
            json_array_append_new(bc, json_real(row->runs[k].cost));
            json_array_append_new(bw, json_real(row->runs[k].wait_mean_s));
            json_array_append_new(bp, json_real(row->runs[k].wait_p99_s));
            wall += row->wall_s[k];
        }
        json_object_set_new(x, "cost_by_seed", bc);
        json_object_set_new(x, "wait_mean_s_by_seed", bw);
        json_object_set_new(x, "wait_p99_s_by_seed", bp);
        json_object_set_new(x, "wall_s", json_real(o->timing ? wall : 0.0));
        json_array_append_new(results, x);
    }
    json_object_set_new(root, "results", results);
    return root;
}

static void as_table(FILE *f, const as_study *s)
{
    const kgpu_as_opts *o = s->o;
    const kgpu_sim_input *sim = s->in->churn->sim;
    fprintf(f, "node groups: %d (%d node shapes x on-demand/spot, quotas from %s), from zero\n",
            s->in->ngroups, s->in->ngroups / 2, o->nodes_path);
    fprintf(f, "workload: %s (%zu pods), trace times, arrivals x%g", o->pods_path, sim->nrequests,
            o->base.speedup);
    if (o->base.inflate > 0)
        fprintf(f, ", inflated to %.2fx", o->base.inflate);
    fprintf(f, "\nautoscaler: scan %gs, provisioning %gs, unneeded %gs, delay after add %gs, "
               "threshold %g; spot: %g interruptions/node-hour, pods of qos %s\n",
            o->base.scan_interval_s, o->base.provision_delay_s, o->base.unneeded_s,
            o->base.delay_after_add_s, o->base.utilization, o->base.spot_rate, o->spot_qos);
    fprintf(f, "prices: %s (%s); seeds %llu", o->prices_path, s->prices->currency,
            (unsigned long long)o->seeds[0]);
    if (o->nseeds > 1)
        fprintf(f, "..%llu, medians of %d runs", (unsigned long long)o->seeds[o->nseeds - 1],
                o->nseeds);
    fprintf(f, "\n\n%-12s %10s %10s %9s %9s %8s %9s %6s %7s %7s %8s %9s %10s\n", "expander",
            "GPU-h buy", "cost", "GPU-h use", "wait mean", "wait p50", "wait p99", "never",
            "scaleup", "useless", "interrup", "restarted", "cost arr.");
    int lw = -1;
    for (int r = 0; r < s->nrows; r++) {
        const as_row *row = &s->rows[r];
        if (row->hidden)
            continue;
        if (!row->fixed && row->kind == KGPU_EXPANDER_LEAST_WASTE)
            lw = r;
        double v[12];
        as_get gets[] = {get_bought,   get_cost,     get_used,      get_wait_mean,
                         get_wait_p50, get_wait_p99, get_never,     get_scale_ups,
                         get_useless,  get_interruptions, get_restarted, get_day_cost};
        for (int m = 0; m < 12; m++)
            v[m] = median(row, o->nseeds, gets[m], NULL, NULL);
        fprintf(f,
                "%-12s %10.1f %10.1f %9.1f %9.1f %8.1f %9.1f %6.1f %7.1f %7.1f %8.1f %9.1f "
                "%10.1f\n",
                row->name, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10],
                v[11]);
    }
    fprintf(f, "\nspread over seeds (min-max): cost / wait mean s / wait p99 s\n");
    for (int r = 0; r < s->nrows; r++) {
        const as_row *row = &s->rows[r];
        if (row->hidden)
            continue;
        double a, b, c, d, e, g;
        median(row, o->nseeds, get_cost, &a, &b);
        median(row, o->nseeds, get_wait_mean, &c, &d);
        median(row, o->nseeds, get_wait_p99, &e, &g);
        fprintf(f, "%-12s %.1f-%.1f / %.1f-%.1f / %.1f-%.1f\n", row->name, a, b, c, d, e, g);
    }
    if (lw >= 0) {
        double base = median(&s->rows[lw], o->nseeds, get_cost, NULL, NULL);
        double dbase = median(&s->rows[lw], o->nseeds, get_day_cost, NULL, NULL);
        for (int r = 0; r < s->nrows; r++) {
            const as_row *row = &s->rows[r];
            if (row->hidden || r == lw || base <= 0 || dbase <= 0)
                continue;
            int lower = 0;
            for (int k = 0; k < o->nseeds; k++)
                lower += row->runs[k].cost < s->rows[lw].runs[k].cost;
            fprintf(f,
                    "%s vs least-waste: cost %+.1f%% (median; lower in %d of %d seeds), over "
                    "the arrivals %+.1f%%\n",
                    row->name,
                    (median(row, o->nseeds, get_cost, NULL, NULL) - base) * 100.0 / base, lower,
                    o->nseeds,
                    (median(row, o->nseeds, get_day_cost, NULL, NULL) - dbase) * 100.0 / dbase);
        }
    }
    fprintf(f, "\nGPU-h buy: GPUs of the nodes held (scale-up to removal) over the span from 5%% of\n"
               "arrivals to the last departure; cost: their price over it; GPU-h use: GPU\n"
               "allocated. wait: a pod's time pending for capacity (all of it, restarts\n"
               "included). useless: nodes added that never held a pod. restarted: pods sent back\n"
               "by interruptions and scale-down drains. fixed: the most nodes kgpu's run held\n"
               "per node shape, on-demand, for the whole span. cost arr.: the cost from 5%% of\n"
               "arrivals to the last arrival only (trace pods live up to months: the span to\n"
               "the last departure is mostly their tail).\n");
}

/* Per request: does its pod's qos appear in the comma list? */
static int tolerations(const kgpu_trace *pods, const char *list, bool **out, kgpu_error *err)
{
    *out = calloc(pods->npods ? pods->npods : 1, sizeof(**out));
    if (*out == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t i = 0; i < pods->npods; i++) {
        const char *q = pods->pods[i].qos;
        size_t ql = strlen(q);
        for (const char *p = list; ql > 0 && *p;) {
            const char *e = strchr(p, ',');
            size_t l = e ? (size_t)(e - p) : strlen(p);
            if (l == ql && strncmp(p, q, l) == 0)
                (*out)[i] = true;
            p += l + (e != NULL);
        }
    }
    return 0;
}

static int parse_rows(as_study *s, const char *text, kgpu_error *err)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", text);
    bool want_fixed = false;
    s->kgpu_row = -1;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "fixed") == 0) {
            want_fixed = true;
            continue;
        }
        int k = kgpu_expander_parse(t);
        if (k < 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--expanders: unknown '%s' (kgpu, least-waste, price, random, "
                                  "fixed)",
                                  t);
        for (int r = 0; r < s->nrows; r++)
            if (!s->rows[r].fixed && s->rows[r].kind == (kgpu_expander_kind)k)
                return kgpu_error_set(err, KGPU_EINVAL, "--expanders: '%s' twice", t);
        if (k == KGPU_EXPANDER_KGPU)
            s->kgpu_row = s->nrows;
        as_row *row = &s->rows[s->nrows++];
        row->kind = (kgpu_expander_kind)k;
        snprintf(row->name, sizeof(row->name), "%s", t);
    }
    if (want_fixed) {
        if (s->kgpu_row < 0) {
            s->kgpu_row = s->nrows;
            as_row *row = &s->rows[s->nrows++];
            *row = (as_row){.kind = KGPU_EXPANDER_KGPU, .hidden = true};
            snprintf(row->name, sizeof(row->name), "kgpu");
        }
        as_row *row = &s->rows[s->nrows++];
        *row = (as_row){.fixed = true};
        snprintf(row->name, sizeof(row->name), "fixed");
    }
    if (s->nrows == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "--expanders is empty");
    return 0;
}

int kgpu_simulate_autoscale(const kgpu_as_opts *o)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    char *nb = NULL, *pb = NULL;
    size_t nl = 0, pl = 0;
    kgpu_trace nodes, pods;
    memset(&nodes, 0, sizeof(nodes));
    memset(&pods, 0, sizeof(pods));
    kgpu_sim_input sim;
    kgpu_churn_input ch;
    kgpu_autoscale_input in;
    memset(&sim, 0, sizeof(sim));
    memset(&ch, 0, sizeof(ch));
    memset(&in, 0, sizeof(in));
    kgpu_prices prices;
    bool *tol = NULL;
    as_study s;
    memset(&s, 0, sizeof(s));
    int status = 1;
    if (parse_rows(&s, o->expanders, &err) != 0) {
        fprintf(stderr, "kgpu simulate: %s\n", err.msg);
        return 2;
    }
    int rc = kgpu_prices_load_file(o->prices_path, &prices, &err);
    if (rc == 0)
        rc = kgpu_read_file_max(o->nodes_path, (size_t)1 << 30, &nb, &nl, &err);
    if (rc == 0)
        rc = kgpu_read_file_max(o->pods_path, (size_t)1 << 30, &pb, &pl, &err);
    if (rc == 0)
        rc = kgpu_trace_parse_nodes(nb, nl, o->nodes_path, &nodes, &err);
    if (rc == 0)
        rc = kgpu_trace_parse_pods(pb, pl, o->pods_path, &pods, &err);
    if (rc == 0)
        rc = kgpu_sim_prepare(&nodes, &pods, &sim, &err);
    if (rc == 0)
        rc = kgpu_churn_prepare(&sim, &pods, o->pods_path, &ch, &err);
    if (rc == 0)
        rc = tolerations(&pods, o->spot_qos, &tol, &err);
    if (rc == 0)
        rc = kgpu_autoscale_prepare(&ch, tol, &in, &err);
    if (rc != 0)
        goto out;
    s.in = &in;
    s.o = o;
    s.prices = &prices;
    for (int r = 0; r < s.nrows; r++) {
        s.rows[r].runs = calloc((size_t)o->nseeds, sizeof(*s.rows[r].runs));
        s.rows[r].wall_s = calloc((size_t)o->nseeds, sizeof(*s.rows[r].wall_s));
        if (s.rows[r].runs == NULL || s.rows[r].wall_s == NULL) {
            kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
            goto out;
        }
    }
    if (as_phase(&s, false, &err) != 0 || as_phase(&s, true, &err) != 0)
        goto out;
    if (o->json) {
        kgpu_study_print_json(as_json(&s));
    } else {
        as_table(stdout, &s);
    }
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
    free(tol);
    kgpu_autoscale_input_free(&in);
    kgpu_churn_input_free(&ch);
    kgpu_sim_input_free(&sim);
    kgpu_trace_free(&nodes);
    kgpu_trace_free(&pods);
    free(nb);
    free(pb);
    return status;
}
