/*
 * `kgpu report`: GPU-hours and their cost per namespace, queue, GPU model
 * and capacity type, with totals per namespace (docs/autoscaling.md "Cost
 * per team"). From the extender's /metrics (a URL or a saved file: the
 * counters since the extender started) or from a Prometheus that scrapes
 * it (the increase over --range, e.g. a month). Both answers are outside
 * input: the exposition goes through expo.c's bounded reader, the
 * Prometheus answer is checked member by member.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "benchfig.h"
#include "expo.h"
#include "fileio.h"
#include "k8s.h"
#include "pricefile.h"
#include "strmap.h"

#define REPORT_ROWS_MAX  200000    /* series of one report: far above the extender's 16384 */
#define REPORT_BODY_MAX  (256 << 20) /* bytes of a /metrics file or answer */
#define SECONDS_METRIC   "kgpu_namespace_gpu_seconds_total"
#define COST_METRIC      "kgpu_namespace_gpu_cost_total"
#define UNPRICED_METRIC  "kgpu_unpriced_gpu_seconds_total"

/* One namespace, queue, model and capacity type. */
typedef struct rep_row {
    char ns[KGPU_EXPO_VALUE_MAX + 1], queue[KGPU_EXPO_VALUE_MAX + 1];
    char model[KGPU_EXPO_VALUE_MAX + 1], capacity[KGPU_EXPO_VALUE_MAX + 1];
    char currency[KGPU_EXPO_VALUE_MAX + 1]; /* "" while no cost was seen */
    double seconds, cost;
    bool unpriced; /* a row of kgpu_unpriced_gpu_seconds_total: model and capacity only */
} rep_row;

typedef struct report {
    kgpu_strmap index; /* key -> (intptr) row + 1 */
    rep_row *rows;
    size_t n, cap;
} report;

static void report_free(report *r)
{
    kgpu_strmap_clear(&r->index);
    free(r->rows);
}

/* The row of the key (created empty), or NULL with err set. */
static rep_row *row_of(report *r, const char *ns, const char *queue, const char *model,
                       const char *capacity, bool unpriced, kgpu_error *err)
{
    char key[4 * (KGPU_EXPO_VALUE_MAX + 1) + 8];
    snprintf(key, sizeof(key), "%d\x1f%s\x1f%s\x1f%s\x1f%s", unpriced, ns, queue, model, capacity);
    void *v = kgpu_strmap_get(&r->index, key);
    if (v != NULL)
        return &r->rows[(intptr_t)v - 1];
    if (r->n == REPORT_ROWS_MAX) {
        kgpu_error_set(err, KGPU_ERANGE, "more than %d series: not a kgpu-extender's metrics?",
                       REPORT_ROWS_MAX);
        return NULL;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        rep_row *rows = realloc(r->rows, cap * sizeof(*rows));
        if (rows == NULL) {
            kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
            return NULL;
        }
        r->rows = rows;
        r->cap = cap;
    }
    if (!kgpu_strmap_put(&r->index, key, (void *)(intptr_t)(r->n + 1), NULL)) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    rep_row *row = &r->rows[r->n++];
    memset(row, 0, sizeof(*row));
    snprintf(row->ns, sizeof(row->ns), "%s", ns);
    snprintf(row->queue, sizeof(row->queue), "%s", queue);
    snprintf(row->model, sizeof(row->model), "%s", model);
    snprintf(row->capacity, sizeof(row->capacity), "%s", capacity);
    row->unpriced = unpriced;
    return row;
}

/*
 * Adds one sample of the three metrics (metric: its name) with labels read
 * through get(ctx, name) to r. Missing labels read as "" (an extender
 * before queue, model and capacity type counts by namespace only).
 */
static int add_sample(report *r, const char *metric, const char *(*get)(const void *, const char *),
                      const void *ctx, double value, const char *where, kgpu_error *err)
{
    bool seconds = strcmp(metric, SECONDS_METRIC) == 0, cost = strcmp(metric, COST_METRIC) == 0;
    bool unpriced = strcmp(metric, UNPRICED_METRIC) == 0;
    if (!seconds && !cost && !unpriced)
        return 0;
    if (!isfinite(value) || value < 0)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s: %g is not a count", where, metric, value);
#define L(name) (get(ctx, name) ? get(ctx, name) : "")
    if (!unpriced && get(ctx, "namespace") == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s without a namespace label", where, metric);
    rep_row *row = row_of(r, unpriced ? "" : L("namespace"), unpriced ? "" : L("queue"),
                          L("model"), L("capacity_type"), unpriced, err);
    if (row == NULL)
        return err->code;
    if (cost) {
        const char *cur = L("currency");
        if (row->currency[0] != '\0' && strcmp(row->currency, cur) != 0)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: %s in two currencies, %s and %.16s",
                                  where, metric, row->currency, cur);
        snprintf(row->currency, sizeof(row->currency), "%s", cur);
        row->cost += value;
    } else {
        row->seconds += value;
    }
#undef L
    return 0;
}

/* ---- from a text exposition ---- */

static const char *expo_get(const void *ctx, const char *name)
{
    return kgpu_expo_label_value(ctx, name);
}

typedef struct expo_ctx {
    report *r;
    const char *source;
} expo_ctx;

static int expo_sample(void *ctx, const kgpu_expo_sample *s, kgpu_error *err)
{
    expo_ctx *e = ctx;
    char where[300];
    snprintf(where, sizeof(where), "%.200s:%ld", e->source, s->line);
    return add_sample(e->r, s->name, expo_get, s, s->value, where, err);
}

static int from_exposition(const char *text, size_t len, const char *source, report *r,
                           kgpu_error *err)
{
    expo_ctx e = {r, source};
    return kgpu_expo_parse(text, len, source, expo_sample, &e, err);
}

/* ---- from Prometheus' HTTP API ---- */

static const char *json_get(const void *ctx, const char *name)
{
    const json_t *v = json_object_get(ctx, name);
    return json_string_value(v);
}

/* One /api/v1/query answer for `metric` (a vector) into r. */
static int from_prometheus_answer(const char *body, const char *metric, const char *url, report *r,
                                  kgpu_error *err)
{
    json_error_t jerr;
    json_t *doc = json_loads(body, 0, &jerr);
    int rc = 0;
    if (doc == NULL) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: not JSON: %s (line %d)", url, jerr.text,
                            jerr.line);
        goto out;
    }
    const char *status = json_string_value(json_object_get(doc, "status"));
    json_t *data = json_object_get(doc, "data");
    if (status == NULL || strcmp(status, "success") != 0) {
        const char *e = json_string_value(json_object_get(doc, "error"));
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: status %s: %.300s", url,
                            status ? status : "missing", e ? e : "");
        goto out;
    }
    const char *type = json_string_value(json_object_get(data, "resultType"));
    json_t *result = json_object_get(data, "result");
    if (type == NULL || strcmp(type, "vector") != 0 || !json_is_array(result)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: data.result: expected an instant vector", url);
        goto out;
    }
    size_t i;
    json_t *item;
    json_array_foreach(result, i, item)
    {
        char where[600];
        snprintf(where, sizeof(where), "%.500s: data.result[%zu]", url, i);
        json_t *labels = json_object_get(item, "metric");
        json_t *value = json_object_get(item, "value");
        const char *num = json_string_value(json_array_get(value, 1));
        char *end = NULL;
        double x = num ? strtod(num, &end) : NAN;
        if (!json_is_object(labels) || num == NULL || end == num || *end != '\0') {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s: expected {metric: {...}, value: [t, \"x\"]}",
                                where);
            break;
        }
        const char *key;
        json_t *lv;
        json_object_foreach(labels, key, lv)
        {
            const char *s = json_string_value(lv);
            if (s == NULL || strlen(s) > KGPU_EXPO_VALUE_MAX) {
                rc = kgpu_error_set(err, KGPU_EPARSE, "%s: label %.40s: expected a string of at "
                                    "most %d bytes", where, key, KGPU_EXPO_VALUE_MAX);
                break;
            }
        }
        if (rc == 0)
            rc = add_sample(r, metric, json_get, labels, x, where, err);
        if (rc != 0)
            break;
    }
out:
    json_decref(doc);
    return rc;
}

/* s percent-encoded for a query string into out (len bytes); false when it does not fit. */
static bool url_encode(const char *s, char *out, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' || ch == '~';
        if (o + (plain ? 1 : 3) >= len)
            return false;
        if (plain) {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = '\0';
    return true;
}

/* A range Prometheus reads: digits then one unit (ms s m h d w y), as in 30d. */
static bool valid_range(const char *s)
{
    size_t d = strspn(s, "0123456789");
    const char *u = s + d;
    return d > 0 && d <= 9 &&
           (strcmp(u, "ms") == 0 || (strlen(u) == 1 && strchr("smhdwy", u[0]) != NULL));
}

/* ---- fetching ---- */

typedef struct tls_opts {
    const char *cacert, *cert, *key;
} tls_opts;

/* GET url (http:// or https://...), the body into *body (malloc'd). */
static int http_get(const char *url, const tls_opts *tls, char **body, size_t *len,
                    kgpu_error *err)
{
    const char *sep = strstr(url, "://");
    const char *slash = sep ? strchr(sep + 3, '/') : NULL;
    size_t server_len = slash ? (size_t)(slash - url) : strlen(url);
    kgpu_k8s_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    if (sep == NULL || server_len >= sizeof(cfg.server))
        return kgpu_error_set(err, KGPU_EINVAL, "%.300s: expected http://HOST:PORT/PATH", url);
    memcpy(cfg.server, url, server_len);
    cfg.server[server_len] = '\0';
    snprintf(cfg.ca_file, sizeof(cfg.ca_file), "%s", tls->cacert ? tls->cacert : "");
    snprintf(cfg.cert_file, sizeof(cfg.cert_file), "%s", tls->cert ? tls->cert : "");
    snprintf(cfg.key_file, sizeof(cfg.key_file), "%s", tls->key ? tls->key : "");
    cfg.timeout_ms = 60000;
    kgpu_k8s *k = kgpu_k8s_new(&cfg, err);
    kgpu_k8s_config_clear(&cfg);
    if (k == NULL)
        return err->code;
    kgpu_http_resp resp = {0};
    int rc = kgpu_k8s_request(k, "GET", slash ? slash : "/", NULL, NULL, &resp, err);
    kgpu_k8s_free(k);
    if (rc == 0 && resp.status != 200)
        rc = kgpu_error_set(err, KGPU_EIO, "%.300s answered %ld: %.200s", url, resp.status,
                            resp.body ? resp.body : "");
    else if (rc == 0 && resp.len > REPORT_BODY_MAX)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%.300s: answer larger than %d bytes", url,
                            REPORT_BODY_MAX);
    if (rc != 0) {
        free(resp.body);
        return rc;
    }
    *body = resp.body;
    *len = resp.len;
    return 0;
}

static bool is_url(const char *s)
{
    return strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0;
}

/* --metrics: a URL or a file. */
static int load_metrics(const char *where, const tls_opts *tls, report *r, kgpu_error *err)
{
    char *body = NULL;
    size_t len = 0;
    int rc = is_url(where) ? http_get(where, tls, &body, &len, err)
                           : kgpu_read_file_max(where, REPORT_BODY_MAX, &body, &len, err);
    if (rc == 0)
        rc = from_exposition(body, len, where, r, err);
    free(body);
    return rc;
}

/* --prometheus: the increase over `range` of the seconds, the cost and the unpriced seconds. */
static int load_prometheus(const char *base, const char *range, const tls_opts *tls, report *r,
                           kgpu_error *err)
{
    static const struct {
        const char *metric, *by;
    } q[] = {
        {SECONDS_METRIC, "namespace, queue, model, capacity_type"},
        {COST_METRIC, "namespace, queue, model, capacity_type, currency"},
        {UNPRICED_METRIC, "model, capacity_type"},
    };
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/')
        bl--;
    for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
        char query[512], enc[1536], url[2600];
        /* max, not sum: every extender replica counts the same pods (as the recording rules). */
        snprintf(query, sizeof(query), "max by (%s) (increase(%s[%s]))", q[i].by, q[i].metric,
                 range);
        if (!url_encode(query, enc, sizeof(enc)) || bl > 1000)
            return kgpu_error_set(err, KGPU_EINVAL, "--prometheus URL too long");
        snprintf(url, sizeof(url), "%.*s/api/v1/query?query=%s", (int)bl, base, enc);
        char *body = NULL;
        size_t len = 0;
        int rc = http_get(url, tls, &body, &len, err);
        if (rc == 0)
            rc = from_prometheus_answer(body, q[i].metric, url, r, err);
        free(body);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- printing ---- */

static int cmp_row(const void *pa, const void *pb)
{
    const rep_row *a = pa, *b = pb;
    int c = (int)a->unpriced - (int)b->unpriced;
    if (c == 0)
        c = strcmp(a->ns, b->ns);
    if (c == 0)
        c = strcmp(a->queue, b->queue);
    if (c == 0)
        c = strcmp(a->model, b->model);
    return c != 0 ? c : strcmp(a->capacity, b->capacity);
}

/* The currency of rows [from, to) with a cost: "" none, "*" several. */
static const char *currency_of(const rep_row *rows, size_t from, size_t to)
{
    const char *cur = "";
    for (size_t i = from; i < to; i++) {
        if (rows[i].currency[0] == '\0')
            continue;
        if (cur[0] == '\0')
            cur = rows[i].currency;
        else if (strcmp(cur, rows[i].currency) != 0)
            return "*";
    }
    return cur;
}

static void cost_cell(char *buf, size_t len, double cost, const char *currency)
{
    if (currency[0] == '\0')
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.2f %s", cost, currency);
}

static void print_table(const rep_row *rows, size_t n, const char *what)
{
    printf("GPU-hours and cost %s\n\n", what);
    printf("%-24s %-16s %-24s %-10s %12s %16s\n", "NAMESPACE", "QUEUE", "MODEL", "CAPACITY",
           "GPU-HOURS", "COST");
    size_t i = 0;
    while (i < n && !rows[i].unpriced) {
        size_t j = i;
        double hours = 0, cost = 0;
        for (; j < n && !rows[j].unpriced && strcmp(rows[j].ns, rows[i].ns) == 0; j++) {
            char c[64];
            cost_cell(c, sizeof(c), rows[j].cost, rows[j].currency);
            printf("%-24.63s %-16.63s %-24.63s %-10.16s %12.3f %16s\n", rows[j].ns,
                   rows[j].queue[0] ? rows[j].queue : "-", rows[j].model[0] ? rows[j].model : "-",
                   rows[j].capacity[0] ? rows[j].capacity : "-", rows[j].seconds / 3600.0, c);
            hours += rows[j].seconds / 3600.0;
            cost += rows[j].cost;
        }
        char c[64];
        cost_cell(c, sizeof(c), cost, currency_of(rows, i, j));
        printf("%-24.63s %-16s %-24s %-10s %12.3f %16s\n", rows[i].ns, "(total)", "", "", hours,
               c);
        i = j;
    }
    if (i < n)
        printf("\nNot priced (no cost counted; add these models to the prices file):\n");
    for (; i < n; i++)
        printf("  %-24.63s %-10.16s %12.3f GPU-hours\n", rows[i].model,
               rows[i].capacity[0] ? rows[i].capacity : "-", rows[i].seconds / 3600.0);
}

static void print_json(const rep_row *rows, size_t n, const char *source, const char *range)
{
    json_t *doc = json_object(), *list = json_array(), *totals = json_array(),
           *gaps = json_array();
    json_object_set_new(doc, "source", json_string(source));
    json_object_set_new(doc, "range", range ? json_string(range) : json_null());
    size_t i = 0;
    while (i < n && !rows[i].unpriced) {
        size_t j = i;
        double hours = 0, cost = 0;
        for (; j < n && !rows[j].unpriced && strcmp(rows[j].ns, rows[i].ns) == 0; j++) {
            const rep_row *r = &rows[j];
            json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:f}", "namespace", r->ns, "queue",
                                  r->queue, "model", r->model, "capacity_type", r->capacity,
                                  "gpu_hours", r->seconds / 3600.0);
            if (o != NULL && r->currency[0]) {
                json_object_set_new(o, "cost", json_real(r->cost));
                json_object_set_new(o, "currency", json_string(r->currency));
            }
            json_array_append_new(list, o);
            hours += r->seconds / 3600.0;
            cost += r->cost;
        }
        const char *cur = currency_of(rows, i, j);
        json_t *t = json_pack("{s:s, s:f}", "namespace", rows[i].ns, "gpu_hours", hours);
        if (t != NULL && cur[0]) {
            json_object_set_new(t, "cost", json_real(cost));
            json_object_set_new(t, "currency", json_string(cur));
        }
        json_array_append_new(totals, t);
        i = j;
    }
    for (; i < n; i++)
        json_array_append_new(gaps, json_pack("{s:s, s:s, s:f}", "model", rows[i].model,
                                              "capacity_type", rows[i].capacity, "gpu_hours",
                                              rows[i].seconds / 3600.0));
    json_object_set_new(doc, "rows", list);
    json_object_set_new(doc, "namespaces", totals);
    json_object_set_new(doc, "unpriced", gaps);
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    if (text != NULL)
        puts(text);
    free(text);
    json_decref(doc);
}

/* ---- the command ---- */

/* ---- --benchmarks: figures of workloads per GPU model, ranked ---- */

#define BENCH_ROWS_MAX 10000

typedef struct bench_row {
    kgpu_bench_figure f;
    double price; /* per GPU-hour, on-demand; 0 unknown */
} bench_row;

typedef struct bench_set {
    bench_row *rows;
    size_t n;
} bench_set;

/* Per workload, throughput per price first (priced before unpriced), then throughput. */
static int cmp_bench(const void *pa, const void *pb)
{
    const bench_row *a = pa, *b = pb;
    int c = strcmp(a->f.workload, b->f.workload);
    if (c != 0)
        return c;
    bool ka = a->price > 0, kb = b->price > 0;
    if (ka != kb)
        return ka ? -1 : 1;
    double va = ka ? a->f.value / a->price : a->f.value;
    double vb = kb ? b->f.value / b->price : b->f.value;
    if (va != vb)
        return va > vb ? -1 : 1;
    c = strcmp(a->f.model, b->f.model);
    return c != 0 ? c : strcmp(a->f.cluster, b->f.cluster);
}

static int report_benchmarks(const char *where, const char *prices_path, const tls_opts *tls,
                             bool json)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    kgpu_prices prices;
    char *body = NULL;
    size_t len = 0, n = 0;
    kgpu_bench_figure *figs = NULL;
    int rc = 0;
    if (prices_path != NULL)
        rc = kgpu_prices_load_file(prices_path, &prices, &err);
    if (rc == 0)
        rc = is_url(where) ? http_get(where, tls, &body, &len, &err)
                           : kgpu_read_file_max(where, REPORT_BODY_MAX, &body, &len, &err);
    if (rc == 0)
        rc = kgpu_bench_figures_read(body, len, where, BENCH_ROWS_MAX, &figs, &n, &err);
    free(body);
    bench_set b = {.rows = rc == 0 ? calloc(n + 1, sizeof(bench_row)) : NULL, .n = n};
    if (rc == 0 && b.rows == NULL)
        rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
    if (rc != 0) {
        fprintf(stderr, "kgpu report: %s\n", err.msg);
        free(figs);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        b.rows[i].f = figs[i];
        const kgpu_price *p =
            prices_path != NULL ? kgpu_prices_gpu(&prices, figs[i].model) : NULL;
        b.rows[i].price = p != NULL ? p->on_demand : 0;
    }
    free(figs);
    qsort(b.rows, b.n, sizeof(*b.rows), cmp_bench);
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < b.n; i++) {
            const bench_row *r = &b.rows[i];
            json_t *x = json_pack("{s:s,s:s,s:s,s:f}", "workload", r->f.workload, "gpu_model",
                                  r->f.model, "cluster", r->f.cluster, "throughput", r->f.value);
            if (r->price > 0) {
                json_object_set_new(x, "price_per_hour", json_real(r->price));
                json_object_set_new(x, "throughput_per_price",
                                    json_real(r->f.value / r->price));
            }
            json_array_append_new(arr, x);
        }
        json_dumpf(arr, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(arr);
    } else if (b.n == 0) {
        printf("no kgpu_workload_throughput figures in %s\n", where);
    } else {
        printf("%-20s %-26s %-14s %12s %9s %12s\n", "WORKLOAD", "GPU MODEL", "CLUSTER",
               "THROUGHPUT", "PRICE/h", "PER PRICE");
        for (size_t i = 0; i < b.n; i++) {
            const bench_row *r = &b.rows[i];
            bool first = i == 0 || strcmp(b.rows[i - 1].f.workload, r->f.workload) != 0;
            printf("%-20s %-26s %-14s %12.2f ", first ? r->f.workload : "", r->f.model,
                   r->f.cluster[0] ? r->f.cluster : "-", r->f.value);
            if (r->price > 0)
                printf("%9.2f %12.2f\n", r->price, r->f.value / r->price);
            else
                printf("%9s %12s\n", "-", "-");
        }
        printf("(each workload's GPU models, best first: throughput per on-demand price of a "
               "GPU-hour%s)\n",
               prices_path ? "" : "; no --prices: by throughput");
    }
    free(b.rows);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kgpu report (--metrics URL|FILE | --prometheus URL [--range 30d])\n"
            "                   [--output table|json] [--cacert FILE] [--cert FILE --key FILE]\n"
            "\n"
            "GPU-hours and their cost per namespace, queue, GPU model and capacity type, with\n"
            "totals per namespace (the extender's --prices gives the cost).\n"
            "  --metrics URL|FILE  the extender's /metrics, e.g.\n"
            "                    https://127.0.0.1:12346/metrics, or a file saved from it:\n"
            "                    the counters since the extender started\n"
            "  --prometheus URL  a Prometheus that scrapes the extender, e.g.\n"
            "                    http://prometheus:9090: the increase over --range\n"
            "  --range RANGE     with --prometheus: how far back, as Prometheus writes it\n"
            "                    (default 30d)\n"
            "       kgpu report --benchmarks URL|FILE [--prices FILE] [--output table|json]\n"
            "  --benchmarks URL|FILE  kgpu_workload_throughput figures (a bench-export's\n"
            "                    /metrics, a Prometheus /federate answer, or a file): each\n"
            "                    workload's GPU models ranked by throughput per price\n"
            "  --prices FILE     with --benchmarks: prices per GPU-hour by model\n"
            "  --output FORMAT   table (default) or json\n"
            "  --cacert FILE     CA of the server's certificate (https)\n"
            "  --cert, --key FILE  a client certificate the server accepts (https)\n");
}

int kgpu_cmd_report(int argc, char **argv)
{
    static const struct option opts[] = {
        {"metrics", required_argument, NULL, 'm'},
        {"prometheus", required_argument, NULL, 'p'},
        {"range", required_argument, NULL, 'r'},
        {"output", required_argument, NULL, 'o'},
        {"cacert", required_argument, NULL, 'a'},
        {"cert", required_argument, NULL, 'c'},
        {"key", required_argument, NULL, 'k'},
        {"benchmarks", required_argument, NULL, 'b'},
        {"prices", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *metrics = NULL, *prom = NULL, *range = NULL, *output = "table";
    const char *benchmarks = NULL, *prices = NULL;
    tls_opts tls = {0};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            metrics = optarg;
            break;
        case 'p':
            prom = optarg;
            break;
        case 'r':
            range = optarg;
            break;
        case 'o':
            output = optarg;
            break;
        case 'a':
            tls.cacert = optarg;
            break;
        case 'b':
            benchmarks = optarg;
            break;
        case 'P':
            prices = optarg;
            break;
        case 'c':
            tls.cert = optarg;
            break;
        case 'k':
            tls.key = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    const char *bad = NULL;
    if (optind < argc)
        bad = "unexpected argument";
    else if (benchmarks != NULL && (metrics != NULL || prom != NULL || range != NULL))
        bad = "--benchmarks takes none of --metrics, --prometheus, --range";
    else if (prices != NULL && benchmarks == NULL)
        bad = "--prices is for --benchmarks (the extender's own --prices gives the cost)";
    else if (benchmarks == NULL && (metrics != NULL) == (prom != NULL))
        bad = "give one of --metrics and --prometheus";
    else if (range != NULL && prom == NULL)
        bad = "--range is for --prometheus (/metrics holds counters since the extender started)";
    else if (range != NULL && !valid_range(range))
        bad = "--range: digits and a unit, e.g. 30d, 720h";
    else if (strcmp(output, "table") != 0 && strcmp(output, "json") != 0)
        bad = "--output: table or json";
    else if ((tls.cert != NULL) != (tls.key != NULL))
        bad = "--cert and --key go together";
    if (bad != NULL) {
        fprintf(stderr, "kgpu report: %s\n", bad);
        usage(stderr);
        return 2;
    }
    if (benchmarks != NULL)
        return report_benchmarks(benchmarks, prices, &tls, strcmp(output, "json") == 0);
    if (prom != NULL && range == NULL)
        range = "30d";
    report r = {0};
    kgpu_strmap_init(&r.index);
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = metrics != NULL ? load_metrics(metrics, &tls, &r, &err)
                             : load_prometheus(prom, range, &tls, &r, &err);
    if (rc != 0) {
        fprintf(stderr, "kgpu report: %s\n", err.msg);
        report_free(&r);
        return 1;
    }
    qsort(r.rows, r.n, sizeof(*r.rows), cmp_row);
    char what[600];
    if (metrics != NULL)
        snprintf(what, sizeof(what), "since the extender started (%.500s)", metrics);
    else
        snprintf(what, sizeof(what), "over the last %s (%.500s)", range, prom);
    if (strcmp(output, "json") == 0)
        print_json(r.rows, r.n, metrics ? metrics : prom, range);
    else if (r.n == 0)
        printf("GPU-hours and cost %s\n\nno GPU usage recorded\n", what);
    else
        print_table(r.rows, r.n, what);
    report_free(&r);
    return 0;
}
