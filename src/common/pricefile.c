/*
 * Reader of the prices file (pricefile.h): a jansson walk over the parsed
 * document that checks each member's type and range and names the field
 * that is wrong. Unknown keys are refused, so a misspelt `ondemand` is an
 * error rather than a model priced at nothing.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "pricefile.h"
#include "yamljson.h"

#define PF_MAX_FILE (1 << 20)
#define PF_MAX_PRICE 1e6 /* per hour: a typo's guard, far above any real price */

static int fail(kgpu_error *err, const char *file, const char *field, const char *what)
{
    return kgpu_error_set(err, KGPU_EPARSE, "%s: prices%s%s: %s", file, field[0] ? "." : "",
                          field, what);
}

/* {onDemand: X, spot: Y} at `field`; both required. */
static int parse_pair(const json_t *v, const char *file, const char *field, kgpu_price *out,
                      kgpu_error *err)
{
    if (!json_is_object(v))
        return fail(err, file, field, "expected a mapping with onDemand and spot");
    bool od = false, sp = false;
    const char *key;
    json_t *m;
    json_object_foreach((json_t *)v, key, m)
    {
        char f[160];
        snprintf(f, sizeof(f), "%s.%.40s", field, key);
        bool is_od = strcmp(key, "onDemand") == 0, is_sp = strcmp(key, "spot") == 0;
        if (!is_od && !is_sp)
            return fail(err, file, f, "unknown key (onDemand, spot)");
        double x = json_number_value(m);
        if (!json_is_number(m) || !(x >= 0 && x <= PF_MAX_PRICE))
            return fail(err, file, f, "expected a price per hour, a number from 0 to 1000000");
        if (is_od) {
            out->on_demand = x;
            od = true;
        } else {
            out->spot = x;
            sp = true;
        }
    }
    if (!od || !sp) {
        char f[160];
        snprintf(f, sizeof(f), "%s.%s", field, od ? "spot" : "onDemand");
        return fail(err, file, f, "missing");
    }
    return 0;
}

static int parse_prices(const json_t *p, const char *file, kgpu_prices *out, kgpu_error *err)
{
    if (!json_is_object(p))
        return fail(err, file, "", "expected a mapping with currency, gpu and cpuCore");
    const char *key;
    json_t *v;
    bool gpu = false;
    json_object_foreach((json_t *)p, key, v)
    {
        int rc = 0;
        if (strcmp(key, "currency") == 0) {
            const char *s = json_string_value(v);
            if (s == NULL || s[0] == '\0' || strlen(s) >= sizeof(out->currency))
                return fail(err, file, "currency", "expected a currency code such as USD");
            snprintf(out->currency, sizeof(out->currency), "%s", s);
        } else if (strcmp(key, "cpuCore") == 0) {
            rc = parse_pair(v, file, "cpuCore", &out->cpu_core, err);
        } else if (strcmp(key, "gpu") == 0) {
            gpu = true;
            if (!json_is_object(v) || json_object_size(v) == 0)
                return fail(err, file, "gpu", "expected a mapping of GPU models to prices");
            const char *model;
            json_t *m;
            json_object_foreach(v, model, m)
            {
                char f[KGPU_MODEL_NAME_MAX + 16];
                snprintf(f, sizeof(f), "gpu.%.*s", KGPU_MODEL_NAME_MAX, model);
                if (model[0] == '\0' || strlen(model) >= KGPU_MODEL_NAME_MAX)
                    return fail(err, file, f, "expected a GPU model name of 1 to 63 characters");
                if (out->nmodels == KGPU_MAX_MODELS)
                    return fail(err, file, "gpu", "more than 64 models");
                if ((rc = parse_pair(m, file, f, &out->gpu[out->nmodels], err)) != 0)
                    return rc;
                snprintf(out->model[out->nmodels], KGPU_MODEL_NAME_MAX, "%s", model);
                out->nmodels++;
            }
        } else {
            char f[48];
            snprintf(f, sizeof(f), "%.40s", key);
            return fail(err, file, f, "unknown key (currency, gpu, cpuCore)");
        }
        if (rc != 0)
            return rc;
    }
    if (!gpu)
        return fail(err, file, "gpu", "missing");
    return 0;
}

int kgpu_prices_load(const char *buf, size_t len, const char *file, kgpu_prices *out,
                     kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->currency, sizeof(out->currency), "USD");
    json_t *root = kgpu_yaml_load(buf, len, file, err);
    if (root == NULL)
        return err ? err->code : KGPU_EPARSE;
    const json_t *p = json_is_object(root) ? json_object_get(root, "prices") : NULL;
    int rc = p == NULL ? kgpu_error_set(err, KGPU_EPARSE, "%s: prices: missing", file)
                       : parse_prices(p, file, out, err);
    json_decref(root);
    if (rc != 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

int kgpu_prices_load_file(const char *path, kgpu_prices *out, kgpu_error *err)
{
    char *buf;
    size_t n;
    memset(out, 0, sizeof(*out));
    if (kgpu_read_file_max(path, PF_MAX_FILE, &buf, &n, err) != 0)
        return err ? err->code : KGPU_EIO;
    int rc = kgpu_prices_load(buf, n, path, out, err);
    free(buf);
    return rc;
}
