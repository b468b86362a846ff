/*
 * kgpu-dispatcher's reading of Workloads, estimates, benchmark figures and
 * the static table (pick.h). Pure.
 */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchfig.h"
#include "pick.h"
#include "podspec.h"
#include "yamljson.h"

#define BENCH_MAX 4096 /* figures kept */
#define TABLE_MAX 1024 /* workloads in the table */

static bool copy_str(char *dst, size_t cap, const json_t *v)
{
    const char *s = json_string_value(v);
    if (s == NULL || strlen(s) >= cap)
        return false;
    snprintf(dst, cap, "%s", s);
    return true;
}

static bool condition_true(const json_t *status, const char *type)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c) {
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *s = json_string_value(json_object_get(c, "status"));
        if (t != NULL && s != NULL && strcmp(t, type) == 0)
            return strcmp(s, "True") == 0;
    }
    return false;
}

/* Splits "a, b,c" into globs; false when there are too many or one is too long. */
static bool split_globs(const char *s, char out[][DSP_GLOB_MAX], int max, int *n)
{
    *n = 0;
    while (*s) {
        while (*s == ' ' || *s == ',')
            s++;
        size_t len = strcspn(s, ",");
        while (len > 0 && s[len - 1] == ' ')
            len--;
        if (len == 0)
            break;
        if (*n == max || len >= DSP_GLOB_MAX)
            return false;
        snprintf(out[(*n)++], DSP_GLOB_MAX, "%.*s", (int)len, s);
        s += len;
        while (*s && *s != ',')
            s++;
    }
    return true;
}

static bool asks_gpu(const json_t *tmpl)
{
    kgpu_pod pod;
    kgpu_error err;
    return kgpu_pod_from_template(tmpl, 1024, &pod, &err) == 0 && pod.nparts > 0;
}

int dsp_workload_read(const json_t *wl, const json_t *checks, dsp_workload *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    out->obj = wl;
    const json_t *meta = json_object_get(wl, "metadata"), *spec = json_object_get(wl, "spec"),
                 *status = json_object_get(wl, "status");
    if (!copy_str(out->ns, sizeof(out->ns), json_object_get(meta, "namespace")) ||
        !copy_str(out->name, sizeof(out->name), json_object_get(meta, "name")) ||
        !copy_str(out->uid, sizeof(out->uid), json_object_get(meta, "uid")))
        return kgpu_error_set(err, KGPU_EINVAL, "a Workload without namespace, name or uid");
    copy_str(out->rv, sizeof(out->rv), json_object_get(meta, "resourceVersion"));
    copy_str(out->created, sizeof(out->created), json_object_get(meta, "creationTimestamp"));
    const json_t *prio = json_object_get(spec, "priority");
    out->priority = json_is_integer(prio) ? (long long)json_integer_value(prio) : 0;
    const json_t *sets = json_object_get(spec, "podSets");
    if (!json_is_array(sets) || json_array_size(sets) == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "Workload %s/%s: no spec.podSets", out->ns,
                              out->name);
    const json_t *set = NULL;
    size_t i;
    json_t *s;
    /* Several pod sets: the first asking for a GPU (the template is parsed only then). */
    json_array_foreach(sets, i, s) {
        if (set == NULL && json_array_size(sets) > 1 && asks_gpu(json_object_get(s, "template")))
            set = s;
    }
    if (set == NULL)
        set = json_array_get(sets, 0);
    const json_t *tmpl = json_object_get(set, "template"), *count = json_object_get(set, "count");
    if (!json_is_object(tmpl))
        return kgpu_error_set(err, KGPU_EINVAL, "Workload %s/%s: a pod set without a template",
                              out->ns, out->name);
    out->pod = tmpl;
    out->count = count == NULL ? 1 : json_is_integer(count) ? (int)json_integer_value(count) : -1;
    if (out->count < 1 || out->count > 1024)
        return kgpu_error_set(err, KGPU_EINVAL, "Workload %s/%s: pod set count not 1..1024",
                              out->ns, out->name);
    const json_t *tmeta = json_object_get(tmpl, "metadata");
    const json_t *key = json_object_get(json_object_get(tmeta, "labels"), DSP_LABEL_WORKLOAD);
    if (key != NULL && !copy_str(out->key, sizeof(out->key), key))
        return kgpu_error_set(err, KGPU_EINVAL, "Workload %s/%s: label %s not a short string",
                              out->ns, out->name, DSP_LABEL_WORKLOAD);
    const char *pref =
        json_string_value(json_object_get(json_object_get(tmeta, "annotations"), DSP_ANN_PREFERENCE));
    if (pref != NULL && !split_globs(pref, out->prefs, DSP_PREFS_MAX, &out->nprefs))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "Workload %s/%s: %s: at most %d globs of < %d bytes", out->ns,
                              out->name, DSP_ANN_PREFERENCE, DSP_PREFS_MAX, DSP_GLOB_MAX);
    const json_t *cn = json_object_get(status, "clusterName");
    if (cn != NULL && !copy_str(out->cluster, sizeof(out->cluster), cn))
        return kgpu_error_set(err, KGPU_EINVAL, "Workload %s/%s: bad status.clusterName",
                              out->ns, out->name);
    json_array_foreach(json_object_get(status, "nominatedClusterNames"), i, s) {
        if (out->nnominated < DSP_NOMINATED_MAX &&
            copy_str(out->nominated[out->nnominated], sizeof(out->nominated[0]), s))
            out->nnominated++;
    }
    json_array_foreach(json_object_get(status, "admissionChecks"), i, s) {
        const char *name = json_string_value(json_object_get(s, "name"));
        const char *state = json_string_value(json_object_get(s, "state"));
        if (name != NULL && state != NULL && json_object_get(checks, name) != NULL &&
            strcmp(state, "Pending") == 0 && strlen(name) < sizeof(out->check))
            snprintf(out->check, sizeof(out->check), "%s", name);
    }
    out->waits = out->check[0] && out->cluster[0] == '\0' &&
                 condition_true(status, "QuotaReserved") && !condition_true(status, "Finished");
    return 0;
}

int dsp_workload_cmp(const dsp_workload *a, const dsp_workload *b)
{
    if (a->priority != b->priority)
        return a->priority > b->priority ? -1 : 1;
    int c = strcmp(a->created, b->created);
    if (c == 0)
        c = strcmp(a->ns, b->ns);
    return c != 0 ? c : strcmp(a->name, b->name);
}

int dsp_pref_rank(const dsp_workload *w, const char *model)
{
    for (int i = 0; model != NULL && i < w->nprefs; i++)
        if (fnmatch(w->prefs[i], model, 0) == 0)
            return i;
    return -1;
}

int dsp_answer_read(const char *body, size_t len, dsp_answer *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *pod = json_array_get(json_object_get(root, "pods"), 0);
    int rc = 0;
    json_t *fit = json_object_get(pod, "fit");
    if (!json_is_object(pod) || !json_is_integer(fit) || json_integer_value(fit) < 0 ||
        json_integer_value(fit) > 1 << 20) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "the estimate's answer has no pods[0].fit");
        goto out;
    }
    const char *why = json_string_value(json_object_get(pod, "error"));
    if (why != NULL) {
        rc = kgpu_error_set(err, KGPU_EINVAL, "the cluster cannot estimate this pod: %.300s",
                            why);
        goto out;
    }
    out->fit = (int)json_integer_value(fit);
    json_t *grow = json_object_get(pod, "grow");
    if (json_is_integer(grow) && json_integer_value(grow) > 0 &&
        json_integer_value(grow) <= 1 << 20)
        out->grow = (int)json_integer_value(grow);
    json_t *m = json_object_get(pod, "firstModel");
    if (m != NULL && !json_is_null(m) && !copy_str(out->first_model, sizeof(out->first_model), m)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "the estimate's firstModel is not a short string");
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(pod, "byModel"), k, v) {
        if (out->nmodels < 16 && strlen(k) < sizeof(out->models[0]))
            snprintf(out->models[out->nmodels++], sizeof(out->models[0]), "%s", k);
    }
    json_t *score = json_object_get(pod, "score");
    out->scored = json_is_integer(score);
    out->score = out->scored ? (double)json_integer_value(score) : 0;
    double before = json_number_value(json_object_get(pod, "fragBefore"));
    double first = json_number_value(json_object_get(pod, "fragFirst"));
    double price = json_number_value(json_object_get(pod, "pricePerHour"));
    out->frag_added = isfinite(first - before) ? first - before : 0;
    out->price = isfinite(price) && price > 0 ? price : 0;
out:
    json_decref(root);
    return rc;
}

/* ---- benchmark figures ---- */

struct dsp_bench {
    kgpu_bench_figure *rows;
    size_t n;
};

dsp_bench *dsp_bench_parse(const char *text, size_t len, const char *source, kgpu_error *err)
{
    dsp_bench *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        return NULL;
    }
    if (kgpu_bench_figures_read(text, len, source, BENCH_MAX, &b->rows, &b->n, err) != 0) {
        free(b);
        return NULL;
    }
    return b;
}

void dsp_bench_free(dsp_bench *b)
{
    if (b != NULL)
        free(b->rows);
    free(b);
}

int dsp_bench_count(const dsp_bench *b)
{
    return b != NULL ? (int)b->n : 0;
}

double dsp_bench_get(const dsp_bench *b, const char *key, const char *model, const char *cluster)
{
    double here = 0, any = 0;
    for (size_t i = 0; b != NULL && key[0] && model != NULL && i < b->n; i++) {
        const kgpu_bench_figure *r = &b->rows[i];
        if (strcmp(r->workload, key) != 0 || strcmp(r->model, model) != 0)
            continue;
        if (cluster != NULL && strcmp(r->cluster, cluster) == 0 && r->value > here)
            here = r->value;
        if (r->value > any)
            any = r->value;
    }
    return here > 0 ? here : any;
}

/* ---- the static table ---- */

typedef struct table_row {
    char key[64];
    char prefs[DSP_PREFS_MAX][DSP_GLOB_MAX];
    int nprefs;
} table_row;

struct dsp_table {
    table_row *rows;
    int n;
};

void dsp_table_free(dsp_table *t)
{
    if (t != NULL)
        free(t->rows);
    free(t);
}

dsp_table *dsp_table_parse(const char *buf, size_t len, const char *file, kgpu_error *err)
{
    json_t *root = kgpu_yaml_load(buf, len, file, err);
    if (root == NULL)
        return NULL;
    json_t *w = json_object_get(root, "workloads");
    dsp_table *t = NULL;
    if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_object(w) ||
        json_object_size(w) > TABLE_MAX) {
        kgpu_error_set(err, KGPU_EINVAL,
                       "%s: expected one key, workloads: a mapping of at most %d workloads to "
                       "lists of GPU model globs",
                       file, TABLE_MAX);
        goto out;
    }
    if ((t = calloc(1, sizeof(*t))) == NULL ||
        (t->rows = calloc(json_object_size(w) + 1, sizeof(*t->rows))) == NULL) {
        kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto fail;
    }
    const char *k;
    json_t *v;
    json_object_foreach(w, k, v) {
        table_row *r = &t->rows[t->n];
        size_t i;
        json_t *g;
        if (strlen(k) == 0 || strlen(k) >= sizeof(r->key) || !json_is_array(v) ||
            json_array_size(v) == 0 || json_array_size(v) > DSP_PREFS_MAX) {
            kgpu_error_set(err, KGPU_EINVAL,
                           "%s: workloads.%.64s: expected a list of 1..%d GPU model globs", file, k,
                           DSP_PREFS_MAX);
            goto fail;
        }
        snprintf(r->key, sizeof(r->key), "%s", k);
        json_array_foreach(v, i, g) {
            if (!copy_str(r->prefs[r->nprefs], DSP_GLOB_MAX, g) || r->prefs[r->nprefs][0] == '\0') {
                kgpu_error_set(err, KGPU_EINVAL, "%s: workloads.%.64s[%zu]: expected a glob of "
                               "1..%d bytes", file, k, i, DSP_GLOB_MAX - 1);
                goto fail;
            }
            r->nprefs++;
        }
        t->n++;
    }
    goto out;
fail:
    dsp_table_free(t);
    t = NULL;
out:
    json_decref(root);
    return t;
}

void dsp_table_apply(const dsp_table *t, dsp_workload *w)
{
    if (t == NULL || w->nprefs > 0 || w->key[0] == '\0')
        return;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->rows[i].key, w->key) == 0) {
            memcpy(w->prefs, t->rows[i].prefs, sizeof(w->prefs));
            w->nprefs = t->rows[i].nprefs;
            return;
        }
}

/* ---- the nomination, as Kueue's field manager writes it ---- */

#define PROJECT_DEPTH 32

/* Whether element e of an associative list has every member of key (a "k:" entry). */
static bool matches_key(const json_t *e, const json_t *key)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)key, k, v) {
        if (!json_equal(json_object_get(e, k), v))
            return false;
    }
    return json_is_object(key);
}

/*
 * The part of `value` that a managedFields fieldsV1 set `fields` names: a
 * set naming nothing below (a leaf, an atomic list or map) takes the value
 * whole; "f:NAME" members of objects, "k:{...}", "v:..." and "i:N" elements
 * of lists. NULL when nothing of it is named, or too deep.
 */
static json_t *project(const json_t *value, const json_t *fields, int depth)
{
    if (depth > PROJECT_DEPTH)
        return NULL;
    bool below = false;
    const char *k;
    json_t *sub;
    json_object_foreach((json_t *)fields, k, sub) {
        below |= strcmp(k, ".") != 0;
    }
    if (!below)
        return json_deep_copy(value);
    if (json_is_object(value)) {
        json_t *out = json_object();
        json_object_foreach((json_t *)fields, k, sub) {
            const json_t *v = strncmp(k, "f:", 2) == 0 ? json_object_get(value, k + 2) : NULL;
            json_t *p = v != NULL ? project(v, sub, depth + 1) : NULL;
            if (p != NULL)
                json_object_set_new(out, k + 2, p);
        }
        return out;
    }
    if (json_is_array(value)) {
        json_t *out = json_array();
        json_object_foreach((json_t *)fields, k, sub) {
            json_t *id = strlen(k) > 2 && k[1] == ':' && k[0] != 'f'
                             ? json_loads(k + 2, JSON_DECODE_ANY, NULL)
                             : NULL;
            size_t i;
            json_t *e;
            json_array_foreach((json_t *)value, i, e) {
                bool take = (k[0] == 'k' && matches_key(e, id)) ||
                            (k[0] == 'v' && json_equal(e, id)) ||
                            (k[0] == 'i' && json_is_integer(id) &&
                             (size_t)json_integer_value(id) == i);
                json_t *p = take ? project(e, sub, depth + 1) : NULL;
                if (p != NULL)
                    json_array_append_new(out, p);
            }
            json_decref(id);
        }
        return out;
    }
    return json_deep_copy(value);
}

json_t *dsp_nomination_apply(const json_t *wl, const char *manager, const char *cluster,
                             kgpu_error *err)
{
    const json_t *meta = json_object_get(wl, "metadata");
    const json_t *owned = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(meta, "managedFields"), i, e) {
        const char *m = json_string_value(json_object_get(e, "manager"));
        const char *op = json_string_value(json_object_get(e, "operation"));
        const char *sub = json_string_value(json_object_get(e, "subresource"));
        if (m && op && sub && strcmp(m, manager) == 0 && strcmp(op, "Apply") == 0 &&
            strcmp(sub, "status") == 0)
            owned = json_object_get(e, "fieldsV1");
    }
    json_t *body = owned != NULL ? project(wl, owned, 0) : json_object();
    if (!json_is_object(body)) {
        json_decref(body);
        kgpu_error_set(err, KGPU_EINVAL, "the Workload's managedFields of %s are not a field set",
                       manager);
        return NULL;
    }
    json_t *m = json_object_get(body, "metadata");
    if (!json_is_object(m))
        json_object_set_new(body, "metadata", m = json_object());
    json_t *status = json_object_get(body, "status");
    if (!json_is_object(status))
        json_object_set_new(body, "status", status = json_object());
    static const char *const ids[] = {"name", "namespace", "uid", "resourceVersion"};
    for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++)
        json_object_set(m, ids[k], json_object_get(meta, ids[k]));
    json_object_del(m, "managedFields");
    json_object_set_new(body, "apiVersion", json_string("kueue.x-k8s.io/v1beta2"));
    json_object_set_new(body, "kind", json_string("Workload"));
    json_object_set_new(status, "nominatedClusterNames", json_pack("[s]", cluster));
    json_object_del(status, "clusterName"); /* never set with a nomination */
    return body;
}

char *dsp_estimate_body(const dsp_workload *w, const json_t *reserve)
{
    json_t *doc = json_pack("{s:[{s:O,s:i}]}", "pods", "pod", w->pod, "count", w->count);
    if (doc != NULL && reserve != NULL && json_array_size(reserve) > 0)
        json_object_set(doc, "reserve", (json_t *)reserve);
    char *s = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return s;
}
