/*
 * Reader of the queue configuration (queuefile.h): a jansson walk that
 * checks every member's type and range before the core sees it, and names
 * the field that is wrong. Unknown keys are refused, so a misspelt
 * `gaurantee` is an error instead of a queue with nothing guaranteed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "podspec.h"
#include "queuefile.h"
#include "yamljson.h"

#define QF_MAX_FILE (16 << 20)

static int fail(kgpu_error *err, const char *file, const char *where, const char *field,
                const char *what)
{
    return kgpu_error_set(err, KGPU_EPARSE, "%s: %s%s%s: %s", file, where, field[0] ? "." : "",
                          field, what);
}

/* GPUs: a number (4, 0.5) or a quantity string ("500m", "2"), in milli, whole milli only. */
static int parse_gpus(const json_t *v, int64_t *milli)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < 0 || i > 1000000000)
            return -1;
        *milli = (int64_t)i * 1000;
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d >= 0 && d <= 1e9))
            return -1;
        double m = d * 1000;
        if (fabs(m - nearbyint(m)) > 1e-6)
            return -1;
        *milli = (int64_t)nearbyint(m);
        return 0;
    }
    const char *s = json_string_value(v);
    if (s == NULL || kgpu_quantity_milli(s, milli, NULL) != 0 || *milli < 0 ||
        *milli > (int64_t)1e12)
        return -1;
    return 0;
}

/* Memory: a quantity ("40Gi") or an integer of bytes, in MiB rounded up. */
static int parse_memory(const json_t *v, int64_t *mib)
{
    int64_t bytes;
    if (json_is_integer(v)) {
        bytes = (int64_t)json_integer_value(v);
    } else {
        const char *s = json_string_value(v);
        if (s == NULL || kgpu_quantity_value(s, &bytes, NULL) != 0)
            return -1;
    }
    if (bytes < 0 || bytes > (int64_t)1 << 60)
        return -1;
    *mib = (bytes + (1 << 20) - 1) >> 20;
    return 0;
}

/* {gpu: ..., memory: ...} at field `name` of `where`. */
static int parse_amount(const json_t *v, const char *file, const char *where, const char *name,
                        kgpu_qamount *out, kgpu_error *err)
{
    *out = (kgpu_qamount){KGPU_QUEUE_UNSET, KGPU_QUEUE_UNSET};
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return fail(err, file, where, name, "expected a mapping with gpu and/or memory");
    const char *key;
    json_t *m;
    char field[64];
    json_object_foreach((json_t *)v, key, m)
    {
        snprintf(field, sizeof(field), "%s.%.32s", name, key);
        if (strcmp(key, "gpu") == 0) {
            if (parse_gpus(m, &out->milli) != 0)
                return fail(err, file, where, field,
                            "expected GPUs as a number (4, 0.5) or milli (\"500m\"), at least 0, "
                            "in whole milli");
        } else if (strcmp(key, "memory") == 0) {
            if (parse_memory(m, &out->mem_mib) != 0)
                return fail(err, file, where, field,
                            "expected GPU memory as a quantity (\"40Gi\") or bytes");
        } else {
            return fail(err, file, where, field, "unknown key (gpu, memory)");
        }
    }
    return 0;
}

static int parse_model(const json_t *v, const char *file, const char *where,
                       kgpu_queue_model_spec *out, kgpu_error *err)
{
    if (!json_is_object(v))
        return fail(err, file, where, "", "expected a mapping with model, guarantee, limit");
    const char *key;
    json_t *m;
    memset(out, 0, sizeof(*out));
    out->guarantee = out->limit = (kgpu_qamount){KGPU_QUEUE_UNSET, KGPU_QUEUE_UNSET};
    json_object_foreach((json_t *)v, key, m)
    {
        int rc = 0;
        if (strcmp(key, "model") == 0) {
            if ((out->model = json_string_value(m)) == NULL || out->model[0] == '\0')
                return fail(err, file, where, "model", "expected a GPU model name");
        } else if (strcmp(key, "guarantee") == 0) {
            rc = parse_amount(m, file, where, "guarantee", &out->guarantee, err);
        } else if (strcmp(key, "limit") == 0) {
            rc = parse_amount(m, file, where, "limit", &out->limit, err);
        } else {
            char field[48];
            snprintf(field, sizeof(field), "%.40s", key);
            return fail(err, file, where, field, "unknown key (model, guarantee, limit)");
        }
        if (rc != 0)
            return rc;
    }
    if (out->model == NULL)
        return fail(err, file, where, "model", "missing");
    return 0;
}

/* What one queue's namespace rules point into, freed once the tree is made. */
typedef struct qf_ns {
    const char *names[KGPU_QUEUE_MAX_NAMESPACES];
    kgpu_queue_selreq sel[KGPU_QUEUE_MAX_SELECTOR];
    const char *values[KGPU_QUEUE_MAX_SELECTOR][KGPU_QUEUE_MAX_SEL_VALUES];
} qf_ns;

static int parse_namespaces(const json_t *v, const char *file, const char *where,
                            kgpu_queue_spec *s, qf_ns *b, kgpu_error *err)
{
    if (!json_is_array(v) || json_array_size(v) > KGPU_QUEUE_MAX_NAMESPACES) {
        char what[64];
        snprintf(what, sizeof(what), "expected a list of at most %d namespace names",
                 KGPU_QUEUE_MAX_NAMESPACES);
        return fail(err, file, where, "namespaces", what);
    }
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x)
    {
        if ((b->names[i] = json_string_value(x)) == NULL)
            return fail(err, file, where, "namespaces", "expected namespace names (strings)");
    }
    s->namespaces = b->names;
    s->nnamespaces = (int)json_array_size(v);
    return 0;
}

static int add_req(const char *file, const char *where, kgpu_queue_spec *s, qf_ns *b,
                   kgpu_error *err, kgpu_queue_selreq **out)
{
    if (s->nselector == KGPU_QUEUE_MAX_SELECTOR) {
        char what[64];
        snprintf(what, sizeof(what), "at most %d requirements", KGPU_QUEUE_MAX_SELECTOR);
        return fail(err, file, where, "namespaceSelector", what);
    }
    *out = &b->sel[s->nselector];
    (*out)->values = b->values[s->nselector];
    s->nselector++;
    return 0;
}

static int parse_expression(const json_t *e, const char *file, const char *where,
                            kgpu_queue_spec *s, qf_ns *b, kgpu_error *err)
{
    static const char *const ops[] = {"In", "NotIn", "Exists", "DoesNotExist"};
    const char *f = "namespaceSelector.matchExpressions";
    kgpu_queue_selreq *r = NULL;
    if (!json_is_object(e))
        return fail(err, file, where, f, "expected mappings with key, operator, values");
    int rc = add_req(file, where, s, b, err, &r);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)e, key, v)
    {
        if (rc != 0)
            break;
        if (strcmp(key, "key") == 0 && json_is_string(v)) {
            r->key = json_string_value(v);
        } else if (strcmp(key, "operator") == 0 && json_is_string(v)) {
            for (int i = 0; i < 4; i++)
                if (strcmp(json_string_value(v), ops[i]) == 0)
                    r->op = (kgpu_qsel_op)(KGPU_QSEL_IN + i);
            if (r->op == 0)
                rc = fail(err, file, where, f, "operator: In, NotIn, Exists or DoesNotExist");
        } else if (strcmp(key, "values") == 0 && json_is_array(v) &&
                   json_array_size(v) <= KGPU_QUEUE_MAX_SEL_VALUES) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x)
            {
                if ((b->values[r - b->sel][i] = json_string_value(x)) == NULL)
                    rc = fail(err, file, where, f, "values: expected strings");
            }
            r->nvalues = (int)json_array_size(v);
        } else {
            rc = fail(err, file, where, f,
                      "expected key and operator (strings) and values (at most 64 strings)");
        }
    }
    if (rc == 0 && (r->key == NULL || r->op == 0))
        rc = fail(err, file, where, f, "key and operator are required");
    return rc;
}

/* namespaceSelector: {matchLabels: {k: v}, matchExpressions: [...]}, as Kubernetes writes one. */
static int parse_selector(const json_t *v, const char *file, const char *where,
                          kgpu_queue_spec *s, qf_ns *b, kgpu_error *err)
{
    if (!json_is_object(v))
        return fail(err, file, where, "namespaceSelector",
                    "expected a mapping with matchLabels and/or matchExpressions");
    s->has_selector = true;
    s->selector = b->sel;
    const char *key;
    json_t *m;
    json_object_foreach((json_t *)v, key, m)
    {
        int rc = 0;
        if (strcmp(key, "matchLabels") == 0 && json_is_object(m)) {
            const char *k;
            json_t *x;
            json_object_foreach(m, k, x)
            {
                kgpu_queue_selreq *r = NULL;
                if (rc == 0 && (rc = add_req(file, where, s, b, err, &r)) == 0) {
                    if ((b->values[r - b->sel][0] = json_string_value(x)) == NULL)
                        rc = fail(err, file, where, "namespaceSelector.matchLabels",
                                  "expected string values");
                    *r = (kgpu_queue_selreq){k, KGPU_QSEL_IN, r->values, 1};
                }
            }
        } else if (strcmp(key, "matchExpressions") == 0 && json_is_array(m)) {
            size_t i;
            json_t *e;
            json_array_foreach(m, i, e)
            {
                if (rc == 0)
                    rc = parse_expression(e, file, where, s, b, err);
            }
        } else {
            char field[64];
            snprintf(field, sizeof(field), "namespaceSelector.%.32s", key);
            rc = fail(err, file, where, field,
                      "unknown key, or not a mapping / a list (matchLabels, matchExpressions)");
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kgpu_queues_from_json(const json_t *root, const char *file, kgpu_queues **out,
                          kgpu_error *err)
{
    *out = NULL;
    const json_t *list = json_is_object(root) ? json_object_get(root, "queues") : NULL;
    if (list == NULL)
        return 0;
    if (!json_is_array(list))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: queues: expected a list of queues", file);
    size_t n = json_array_size(list);
    if (n >= KGPU_QUEUE_MAX)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: queues: %zu queues, at most %d", file, n,
                              KGPU_QUEUE_MAX - 1);
    kgpu_queue_spec *specs = calloc(n ? n : 1, sizeof(*specs));
    kgpu_queue_model_spec *models = calloc(n ? n * KGPU_QUEUE_MAX_MODELS : 1, sizeof(*models));
    qf_ns **nsb = calloc(n ? n : 1, sizeof(*nsb)); /* made for queues with namespace rules */
    int rc = 0;
    if (specs == NULL || models == NULL || nsb == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *q = json_array_get(list, i);
        kgpu_queue_spec *s = &specs[i];
        const char *name = json_is_object(q) ? json_string_value(json_object_get(q, "name")) : NULL;
        char where[128];
        snprintf(where, sizeof(where), "queues[%zu] (%.63s)", i, name ? name : "no name");
        if (!json_is_object(q)) {
            rc = fail(err, file, where, "", "expected a mapping with name, parent, guarantee, "
                                            "limit, weight, models, namespaces, "
                                            "namespaceSelector");
            goto out;
        }
        if (name == NULL) {
            rc = fail(err, file, where, "name", "missing, or not a string");
            goto out;
        }
        s->name = name;
        s->guarantee = s->limit = (kgpu_qamount){KGPU_QUEUE_UNSET, KGPU_QUEUE_UNSET};
        s->models = &models[i * KGPU_QUEUE_MAX_MODELS];
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)q, key, v)
        {
            if (strcmp(key, "name") == 0)
                continue;
            if (strcmp(key, "parent") == 0) {
                if (!json_is_null(v) && (s->parent = json_string_value(v)) == NULL)
                    rc = fail(err, file, where, "parent", "expected a queue name");
            } else if (strcmp(key, "weight") == 0) {
                if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                    json_integer_value(v) > 1000)
                    rc = fail(err, file, where, "weight", "expected an integer 1..1000");
                else
                    s->weight = (int)json_integer_value(v);
            } else if (strcmp(key, "guarantee") == 0) {
                rc = parse_amount(v, file, where, "guarantee", &s->guarantee, err);
            } else if (strcmp(key, "limit") == 0) {
                rc = parse_amount(v, file, where, "limit", &s->limit, err);
            } else if (strcmp(key, "models") == 0) {
                if (!json_is_array(v) || json_array_size(v) > KGPU_QUEUE_MAX_MODELS) {
                    char what[64];
                    snprintf(what, sizeof(what), "expected a list of at most %d models",
                             KGPU_QUEUE_MAX_MODELS);
                    rc = fail(err, file, where, "models", what);
                }
                for (size_t m = 0; rc == 0 && m < json_array_size(v); m++) {
                    char mw[160];
                    snprintf(mw, sizeof(mw), "%s.models[%zu]", where, m);
                    rc = parse_model(json_array_get(v, m), file, mw,
                                     &models[i * KGPU_QUEUE_MAX_MODELS + m], err);
                    s->nmodels = (int)m + 1;
                }
            } else if (strcmp(key, "namespaces") == 0 || strcmp(key, "namespaceSelector") == 0) {
                if (nsb[i] == NULL && (nsb[i] = calloc(1, sizeof(*nsb[i]))) == NULL)
                    rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
                else if (strcmp(key, "namespaces") == 0)
                    rc = parse_namespaces(v, file, where, s, nsb[i], err);
                else
                    rc = parse_selector(v, file, where, s, nsb[i], err);
            } else {
                char field[48];
                snprintf(field, sizeof(field), "%.40s", key);
                rc = fail(err, file, where, field,
                          "unknown key (name, parent, guarantee, limit, weight, models, "
                          "namespaces, namespaceSelector)");
            }
            if (rc != 0)
                goto out;
        }
    }
    kgpu_error e;
    if ((rc = kgpu_queues_new(specs, (int)n, out, &e)) != 0)
        kgpu_error_set(err, rc, "%s: %s", file, e.msg);
out:
    for (size_t i = 0; nsb != NULL && i < n; i++)
        free(nsb[i]);
    free(nsb);
    free(specs);
    free(models);
    return rc;
}

int kgpu_queues_load(const char *buf, size_t len, const char *file, kgpu_queues **out,
                     kgpu_error *err)
{
    *out = NULL;
    json_t *root = kgpu_yaml_load(buf, len, file, err);
    if (root == NULL)
        return err ? err->code : KGPU_EPARSE;
    int rc = kgpu_queues_from_json(root, file, out, err);
    json_decref(root);
    return rc;
}

int kgpu_queues_load_file(const char *path, kgpu_queues **out, kgpu_error *err)
{
    char *buf;
    size_t n;
    *out = NULL;
    if (kgpu_read_file_max(path, QF_MAX_FILE, &buf, &n, err) != 0)
        return err ? err->code : KGPU_EIO;
    int rc = kgpu_queues_load(buf, n, path, out, err);
    free(buf);
    return rc;
}
