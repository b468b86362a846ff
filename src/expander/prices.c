/*
 * Prices (caexp.h): per GPU-hour by GPU model and capacity type, and per
 * core-hour, from a YAML or JSON file's `prices:` section; a template
 * node's price per hour from them. The file is the operator's, but it is
 * read like outside input: every field is checked and an error names the
 * file and the field.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "caexp.h"
#include "podspec.h"
#include "yamljson.h"

#define PRICE_MAX 1e6 /* per hour; anything above is a typo */

/* {onDemand: X, spot: Y} at `where` into *p; spot may be absent (-1). */
static int read_pair(const json_t *v, const char *file, const char *where, caexp_price *p,
                     kgpu_error *err)
{
    if (!json_is_object(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s: expected {onDemand: N, spot: N}", file,
                              where);
    const char *key;
    json_t *x;
    p->on_demand = -1;
    p->spot = -1;
    json_object_foreach((json_t *)v, key, x)
    {
        double *dst = strcmp(key, "onDemand") == 0 ? &p->on_demand
                      : strcmp(key, "spot") == 0   ? &p->spot
                                                   : NULL;
        if (dst == NULL)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: %s.%s: unknown (onDemand or spot)",
                                  file, where, key);
        if (!json_is_number(x) || !(json_number_value(x) >= 0) ||
            json_number_value(x) > PRICE_MAX)
            return kgpu_error_set(err, KGPU_EINVAL, "%s: %s.%s: expected a price 0..%g", file,
                                  where, key, PRICE_MAX);
        *dst = json_number_value(x);
    }
    if (p->on_demand < 0)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: %s.onDemand is required", file, where);
    return 0;
}

int caexp_prices_from_json(const json_t *root, const char *file, caexp_prices *out,
                           kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    out->cpu_core.on_demand = 0;
    out->cpu_core.spot = -1;
    const json_t *p = json_object_get(root, "prices");
    if (!json_is_object(p))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: no prices: section (a mapping)", file);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)p, key, v)
    {
        if (strcmp(key, "currency") == 0) {
            const char *c = json_string_value(v);
            if (c == NULL || c[0] == '\0' || strlen(c) >= sizeof(out->currency))
                return kgpu_error_set(err, KGPU_EINVAL, "%s: prices.currency: expected a short "
                                                        "name such as USD",
                                      file);
            snprintf(out->currency, sizeof(out->currency), "%s", c);
        } else if (strcmp(key, "cpuCore") == 0) {
            int rc = read_pair(v, file, "prices.cpuCore", &out->cpu_core, err);
            if (rc != 0)
                return rc;
        } else if (strcmp(key, "gpu") == 0) {
            if (!json_is_object(v) || json_object_size(v) == 0)
                return kgpu_error_set(err, KGPU_EPARSE, "%s: prices.gpu: expected a mapping of "
                                                        "GPU models",
                                      file);
            const char *model;
            json_t *pair;
            json_object_foreach(v, model, pair)
            {
                if (out->n == CAEXP_MAX_PRICED)
                    return kgpu_error_set(err, KGPU_ERANGE, "%s: prices.gpu: more than %d models",
                                          file, CAEXP_MAX_PRICED);
                if (model[0] == '\0' || strlen(model) >= KGPU_MODEL_NAME_MAX)
                    return kgpu_error_set(err, KGPU_EINVAL,
                                          "%s: prices.gpu: a model name of 1..%d characters",
                                          file, KGPU_MODEL_NAME_MAX - 1);
                char where[KGPU_MODEL_NAME_MAX + 16];
                snprintf(where, sizeof(where), "prices.gpu.%s", model);
                int rc = read_pair(pair, file, where, &out->gpu[out->n], err);
                if (rc != 0)
                    return rc;
                snprintf(out->model[out->n], sizeof(out->model[0]), "%s", model);
                out->n++;
            }
        } else {
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "%s: prices.%s: unknown (currency, gpu or cpuCore)", file, key);
        }
    }
    if (out->n == 0)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: prices.gpu is required", file);
    if (out->currency[0] == '\0')
        snprintf(out->currency, sizeof(out->currency), "USD");
    return 0;
}

int caexp_prices_load(const char *path, caexp_prices *out, kgpu_error *err)
{
    json_t *root = kgpu_yaml_load_file(path, err);
    if (root == NULL)
        return err->code != 0 ? err->code : KGPU_EPARSE;
    int rc = caexp_prices_from_json(root, path, out, err);
    json_decref(root);
    return rc;
}

/* The price of one capacity type: spot falls back to on-demand when the file gives none. */
static double of(const caexp_price *p, bool spot)
{
    return spot && p->spot >= 0 ? p->spot : p->on_demand;
}

double caexp_node_price(const caexp_prices *p, const json_t *node, bool spot)
{
    kgpu_node_spec spec;
    kgpu_node_store store;
    kgpu_error err;
    if (p == NULL || kgpu_node_from_json(node, &spec, &store, &err) != 0)
        return -1;
    double total = (double)spec.cpu_milli / 1000.0 * of(&p->cpu_core, spot);
    for (int g = 0; g < spec.ngpus; g++) {
        int m = 0;
        while (m < p->n && strcmp(p->model[m], spec.gpus[g].model) != 0)
            m++;
        if (m == p->n)
            return -1; /* a model without a price: the caller decides */
        total += of(&p->gpu[m], spot);
    }
    return isfinite(total) ? total : -1;
}
