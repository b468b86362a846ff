/*
 * `kgpu simulate --clusters FILE` (simclusters.h): one job per (dispatcher,
 * seed) on the shared thread pool, medians per dispatcher.
 */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fileio.h"
#include "jobs.h"
#include "pricefile.h"
#include "simclusters.h"

#define SPLIT_FILE_MAX (1 << 20)

/* ---- the clusters file ---- */

static bool cluster_name_ok(const char *s)
{
    size_t n = strlen(s);
    bool ok = n >= 1 && n <= 63 && isalnum((unsigned char)s[0]) && isalnum((unsigned char)s[n - 1]);
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-';
    return ok;
}

/* Splits line at commas into at most 3 trimmed fields; their count, or 4 when more. */
static int fields(char *line, char **f)
{
    int n = 0;
    for (char *p = line;; n++) {
        if (n == 3)
            return 4;
        while (*p == ' ' || *p == '\t')
            p++;
        f[n] = p;
        char *comma = strchr(p, ',');
        char *end = comma ? comma : p + strlen(p);
        while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        char *next = comma ? comma + 1 : NULL;
        *end = '\0';
        if (next == NULL)
            return n + 1;
        p = next;
    }
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int kgpu_clusters_split_parse(const char *buf, size_t len, const char *file,
                              const kgpu_cluster *c, kgpu_multisim_split *split, int *cluster_of,
                              kgpu_error *err)
{
    memset(split, 0, sizeof(*split));
    int nn = kgpu_cluster_node_count(c);
    int *line_of = calloc((size_t)nn + 1, sizeof(int)); /* the line that took each node */
    char(*names)[64] = calloc(KGPU_MULTISIM_CLUSTERS, sizeof(*names));
    if (line_of == NULL || names == NULL) {
        free(line_of);
        free(names);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (int i = 0; i < nn; i++)
        cluster_of[i] = -1;
    int ncl = 0, rc = 0;
    long lineno = 0;
    size_t at = 0;
    while (at < len && rc == 0) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t l = nl ? (size_t)(nl - (buf + at)) : len - at;
        lineno++;
        char line[512];
        if (l >= sizeof(line)) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%ld: line longer than %zu bytes", file,
                                lineno, sizeof(line) - 1);
            break;
        }
        memcpy(line, buf + at, l);
        line[l] = '\0';
        at += l + 1;
        if (memchr(line, '\0', l) != NULL) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%ld: a NUL byte", file, lineno);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *f[3] = {NULL, NULL, NULL};
        const char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r')
            s++;
        if (*s == '\0')
            continue;
        int nf = fields(line, f);
        if (nf < 2 || nf > 3) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%ld: expected CLUSTER,MODEL[,K/N]", file,
                                lineno);
            break;
        }
        if (!cluster_name_ok(f[0])) {
            rc = kgpu_error_set(err, KGPU_EPARSE,
                                "%s:%ld: cluster '%.64s' is not a DNS label (1-63 of a-z, 0-9, "
                                "'-')",
                                file, lineno, f[0]);
            break;
        }
        int k = 0, parts = 1;
        if (nf == 3) {
            char *end;
            long a = strtol(f[2], &end, 10), b = *end == '/' ? strtol(end + 1, &end, 10) : 0;
            if (*end != '\0' || f[2][0] < '0' || f[2][0] > '9' || b < 1 || b > 64 || a < 1 ||
                a > b) {
                rc = kgpu_error_set(err, KGPU_EPARSE,
                                    "%s:%ld: part '%.32s': expected K/N with 1 <= K <= N <= 64",
                                    file, lineno, f[2]);
                break;
            }
            k = (int)a - 1;
            parts = (int)b;
        }
        int id = -1;
        for (int i = 0; i < ncl; i++)
            if (strcmp(names[i], f[0]) == 0)
                id = i;
        if (id < 0) {
            if (ncl == KGPU_MULTISIM_CLUSTERS) {
                rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%ld: more than %d clusters", file,
                                    lineno, KGPU_MULTISIM_CLUSTERS);
                break;
            }
            id = ncl++;
            snprintf(names[id], sizeof(names[id]), "%s", f[0]);
        }
        int j = 0, took = 0;
        for (int i = 0; i < nn && rc == 0; i++) {
            const kgpu_node *n = kgpu_cluster_node(c, i);
            if (n->ngpus == 0 || strcmp(kgpu_cluster_model_name(c, n->gpus[0].model), f[1]) != 0)
                continue;
            if (j++ % parts != k)
                continue;
            if (cluster_of[i] >= 0)
                rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%ld: node %s is already in cluster %s "
                                    "(line %d)", file, lineno, n->name, names[cluster_of[i]],
                                    line_of[i]);
            cluster_of[i] = id;
            line_of[i] = (int)lineno;
            took++;
        }
        if (rc == 0 && took == 0)
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%ld: no node of GPU model '%.64s'%s", file,
                                lineno, f[1], j > 0 ? " in that part" : "");
    }
    if (rc == 0 && ncl == 0)
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: no cluster", file);
    if (rc == 0) {
        /* Names sorted (MultiKueue's incremental order); the nodes' ids follow. */
        const char *sorted[KGPU_MULTISIM_CLUSTERS];
        for (int i = 0; i < ncl; i++)
            sorted[i] = names[i];
        qsort(sorted, (size_t)ncl, sizeof(sorted[0]), cmp_name);
        int remap[KGPU_MULTISIM_CLUSTERS];
        for (int i = 0; i < ncl; i++) {
            snprintf(split->names[i], sizeof(split->names[i]), "%s", sorted[i]);
            remap[(int)((sorted[i] - names[0]) / (ptrdiff_t)sizeof(names[0]))] = i;
        }
        for (int i = 0; i < nn; i++)
            if (cluster_of[i] >= 0)
                cluster_of[i] = remap[cluster_of[i]];
        split->nclusters = ncl;
        split->cluster_of = cluster_of;
    }
    free(line_of);
    free(names);
    return rc;
}

/* ---- the study ---- */

typedef struct mc_study {
    const kgpu_mc_opts *o;
    const kgpu_sim_input *in;
    const kgpu_multisim_split *split;
    const double *price;
    int rows[KGPU_DISPATCH_COUNT];
    int nrows;
    kgpu_multisim_result *runs; /* row * nseeds + seed */
    double *wall;
} mc_study;

static int mc_job(void *ctx, int j, kgpu_error *err)
{
    mc_study *s = ctx;
    int row = j / s->o->nseeds, k = j % s->o->nseeds;
    kgpu_multisim_config cfg = {.dispatcher = (kgpu_dispatcher)s->rows[row],
                                .policy = s->o->policy,
                                .seed = s->o->seeds[k],
                                .inflate = s->o->inflate,
                                .price = s->price,
                                .quota_per_model = s->o->quota_per_model};
    double t0 = kgpu_now();
    int rc = kgpu_multisim_run(s->in, s->split, &cfg, &s->runs[j], err);
    s->wall[j] = kgpu_now() - t0;
    return rc;
}

static int cmp_dbl(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

typedef double (*mc_get)(const kgpu_multisim_result *r);
static double get_a100(const kgpu_multisim_result *r) { return r->alloc_pct_100; }
static double get_final(const kgpu_multisim_result *r) { return r->alloc_pct_final; }
static double get_failed(const kgpu_multisim_result *r) { return (double)r->gpu_pods_failed; }
static double get_stuck(const kgpu_multisim_result *r) { return (double)r->stuck; }
static double get_cost(const kgpu_multisim_result *r) { return r->cost_per_hour; }
static double get_unit(const kgpu_multisim_result *r)
{
    return r->allocated_gpus > 0 ? r->cost_per_hour / r->allocated_gpus : 0;
}

/* Median over seeds of row `row`. */
static double median(const mc_study *s, int row, mc_get get)
{
    int n = s->o->nseeds;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (v == NULL)
        return 0;
    for (int k = 0; k < n; k++)
        v[k] = get(&s->runs[row * n + k]);
    qsort(v, (size_t)n, sizeof(double), cmp_dbl);
    double m = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    free(v);
    return m;
}

/* Per cluster: nodes and GPUs by model, e.g. "onprem: 120 nodes, 402 GPUs (P100 265, ...)". */
static void describe_clusters(FILE *f, const mc_study *s, json_t *arr)
{
    const kgpu_cluster *c = s->in->cluster;
    for (int k = 0; k < s->split->nclusters; k++) {
        long nodes = 0, gpus = 0, per[KGPU_MAX_MODELS] = {0};
        for (int i = 0; i < kgpu_cluster_node_count(c); i++) {
            if (s->split->cluster_of[i] != k)
                continue;
            const kgpu_node *n = kgpu_cluster_node(c, i);
            nodes++;
            gpus += n->ngpus;
            for (int g = 0; g < n->ngpus; g++)
                per[n->gpus[g].model]++;
        }
        json_t *models = json_object();
        if (f)
            fprintf(f, "  %-10s %4ld nodes, %5ld GPUs:", s->split->names[k], nodes, gpus);
        for (int m = 0; m < KGPU_MAX_MODELS; m++)
            if (per[m] > 0) {
                if (f)
                    fprintf(f, " %s %ld", kgpu_cluster_model_name(c, m), per[m]);
                json_object_set_new(models, kgpu_cluster_model_name(c, m), json_integer(per[m]));
            }
        if (f)
            fputc('\n', f);
        if (arr)
            json_array_append_new(arr, json_pack("{s:s,s:I,s:I,s:o}", "name", s->split->names[k],
                                                 "nodes", (json_int_t)nodes, "gpus",
                                                 (json_int_t)gpus, "models", models));
        else
            json_decref(models);
    }
}

static void mc_table(FILE *f, const mc_study *s)
{
    const kgpu_mc_opts *o = s->o;
    fprintf(f, "clusters: %s (%d), placement %s within each; Kueue: %s; workload %s, inflated "
               "to %.2fx; seeds %llu..%llu (%d)\n",
            o->clusters_path, s->split->nclusters, o->policy,
            o->quota_per_model ? "a flavor per GPU model" : "one flavor per cluster",
            o->pods_path, o->inflate,
            (unsigned long long)o->seeds[0], (unsigned long long)o->seeds[o->nseeds - 1],
            o->nseeds);
    describe_clusters(f, s, NULL);
    int one = -1;
    for (int r = 0; r < s->nrows; r++)
        if (s->rows[r] == KGPU_DISPATCH_ONE)
            one = r;
    fprintf(f, "\n%-13s %13s %13s %8s %11s %8s %12s %12s\n", "dispatcher", "alloc% @100%",
            "alloc% final", "vs one", "GPU failed", "stuck", o->prices_path ? "cost/hour" : "",
            o->prices_path ? "per GPU-hour" : "");
    for (int r = 0; r < s->nrows; r++) {
        double fin = median(s, r, get_final);
        fprintf(f, "%-13s %13.2f %13.2f ", kgpu_dispatcher_name((kgpu_dispatcher)s->rows[r]),
                median(s, r, get_a100), fin);
        if (one >= 0)
            fprintf(f, "%+8.2f", fin - median(s, one, get_final));
        else
            fprintf(f, "%8s", "");
        fprintf(f, " %11.0f %8.0f", median(s, r, get_failed), median(s, r, get_stuck));
        if (o->prices_path)
            fprintf(f, " %12.2f %12.3f", median(s, r, get_cost), median(s, r, get_unit));
        fputc('\n', f);
    }
    fprintf(f, "(medians over seeds; \"vs one\": points of allocation against all nodes as one "
               "cluster;%s stuck: admitted by quota where the pod fits no node)\n",
            o->prices_path ? " cost: the GPUs held at the end at their model's on-demand price;"
                           : "");
}

static json_t *mc_json(const mc_study *s)
{
    const kgpu_mc_opts *o = s->o;
    json_t *root = json_object(), *clusters = json_array(), *results = json_array();
    json_object_set_new(root, "mode", json_string("clusters"));
    json_object_set_new(root, "clusters_file", json_string(o->clusters_path));
    json_object_set_new(root, "policy", json_string(o->policy));
    json_object_set_new(root, "inflate", json_real(o->inflate));
    json_object_set_new(root, "kueue_flavors",
                        json_string(o->quota_per_model ? "per-model" : "one"));
    describe_clusters(NULL, s, clusters);
    json_object_set_new(root, "clusters", clusters);
    for (int r = 0; r < s->nrows; r++) {
        json_t *x = json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:f}", "dispatcher",
                              kgpu_dispatcher_name((kgpu_dispatcher)s->rows[r]), "alloc_pct_100",
                              median(s, r, get_a100), "alloc_pct_final", median(s, r, get_final),
                              "gpu_pods_failed", median(s, r, get_failed), "stuck",
                              median(s, r, get_stuck), "cost_per_hour", median(s, r, get_cost),
                              "cost_per_gpu_hour", median(s, r, get_unit));
        json_t *by = json_array(), *pc = json_array();
        double wall = 0;
        for (int k = 0; k < o->nseeds; k++) {
            const kgpu_multisim_result *res = &s->runs[r * o->nseeds + k];
            json_array_append_new(by, json_real(res->alloc_pct_final));
            wall += s->wall[r * o->nseeds + k];
        }
        for (int k = 0; k < s->split->nclusters; k++)
            json_array_append_new(pc, json_integer(s->runs[r * o->nseeds].per_cluster[k]));
        json_object_set_new(x, "alloc_pct_final_by_seed", by);
        json_object_set_new(x, "pods_per_cluster_first_seed", pc);
        json_object_set_new(x, "wall_s", json_real(o->timing ? wall : 0.0));
        json_array_append_new(results, x);
    }
    json_object_set_new(root, "results", results);
    return root;
}

static int parse_rows(mc_study *s, const char *text, kgpu_error *err)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int d = kgpu_dispatcher_find(t);
        if (d < 0)
            return kgpu_error_set(err, KGPU_EINVAL, "--dispatch: unknown '%s' (one, kgpu, "
                                  "all-at-once, incremental, static, kgpu-separate)", t);
        for (int r = 0; r < s->nrows; r++)
            if (s->rows[r] == d)
                return kgpu_error_set(err, KGPU_EINVAL, "--dispatch: '%s' twice", t);
        s->rows[s->nrows++] = d;
    }
    if (s->nrows == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "--dispatch is empty");
    return 0;
}

int kgpu_simulate_clusters(const kgpu_mc_opts *o)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    mc_study s;
    memset(&s, 0, sizeof(s));
    s.o = o;
    if (parse_rows(&s, o->dispatch, &err) != 0) {
        fprintf(stderr, "kgpu simulate: %s\n", err.msg);
        return 2;
    }
    char *cb = NULL;
    size_t cl = 0;
    const kgpu_sim_input *inp = o->in;
    kgpu_multisim_split split;
    int *cluster_of = NULL;
    double price[KGPU_MAX_MODELS] = {0};
    int status = 1;
    int rc = kgpu_read_file_max(o->clusters_path, SPLIT_FILE_MAX, &cb, &cl, &err);
    if (rc == 0 && (cluster_of = calloc((size_t)kgpu_cluster_node_count(inp->cluster) + 1,
                                        sizeof(int))) == NULL)
        rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    if (rc == 0)
        rc = kgpu_clusters_split_parse(cb, cl, o->clusters_path, inp->cluster, &split, cluster_of,
                                       &err);
    if (rc == 0 && o->prices_path != NULL) {
        kgpu_prices prices;
        rc = kgpu_prices_load_file(o->prices_path, &prices, &err);
        uint64_t used = 0; /* the models of the clusters' nodes: those need a price */
        for (int i = 0; i < kgpu_cluster_node_count(inp->cluster); i++)
            if (cluster_of[i] >= 0)
                used |= kgpu_cluster_node(inp->cluster, i)->model_mask;
        for (int m = 0; rc == 0 && m < kgpu_cluster_model_count(inp->cluster); m++) {
            if (!((used >> m) & 1))
                continue;
            const char *model = kgpu_cluster_model_name(inp->cluster, m);
            const kgpu_price *p = kgpu_prices_gpu(&prices, model);
            if (p == NULL)
                rc = kgpu_error_set(&err, KGPU_EINVAL, "%s: no price for GPU model %s",
                                    o->prices_path, model);
            else
                price[m] = p->on_demand;
        }
        s.price = price;
    }
    size_t nruns = (size_t)s.nrows * (size_t)o->nseeds;
    if (rc == 0 && ((s.runs = calloc(nruns, sizeof(*s.runs))) == NULL ||
                    (s.wall = calloc(nruns, sizeof(*s.wall))) == NULL))
        rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    if (rc != 0)
        goto out;
    s.in = inp;
    s.split = &split;
    if (kgpu_jobs_run((int)nruns, o->threads, false, mc_job, &s, &err) != 0)
        goto out;
    if (o->json) {
        kgpu_study_print_json(mc_json(&s));
    } else {
        mc_table(stdout, &s);
    }
    if (kgpu_study_flush(&err) != 0)
        goto out;
    status = 0;
out:
    if (status != 0)
        fprintf(stderr, "kgpu simulate: %s\n", err.msg[0] ? err.msg : kgpu_strerror(err.code));
    free(s.runs);
    free(s.wall);
    free(cluster_of);
    free(cb);
    return status;
}
