/* Workload benchmark figures from an exposition text (benchfig.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchfig.h"
#include "expo.h"

typedef struct reading {
    kgpu_bench_figure *v;
    size_t n, max;
} reading;

static int sample(void *ctx, const kgpu_expo_sample *s, kgpu_error *err)
{
    reading *r = ctx;
    if (strcmp(s->name, "kgpu_workload_throughput") != 0 &&
        strcmp(s->name, "kgpu:workload_throughput:max30d") != 0)
        return 0;
    const char *w = kgpu_expo_label_value(s, "workload");
    const char *m = kgpu_expo_label_value(s, "gpu_model");
    const char *c = kgpu_expo_label_value(s, "cluster");
    if (c == NULL)
        c = "";
    if (w == NULL || m == NULL || !isfinite(s->value) || s->value < 0 || *w == '\0' ||
        *m == '\0' || strlen(w) >= sizeof(r->v->workload) || strlen(m) >= sizeof(r->v->model) ||
        strlen(c) >= sizeof(r->v->cluster))
        return 0; /* not a usable figure: as if not measured */
    if (r->n == r->max)
        return kgpu_error_set(err, KGPU_ERANGE, "more than %zu benchmark figures", r->max);
    kgpu_bench_figure *f = &r->v[r->n++];
    snprintf(f->workload, sizeof(f->workload), "%s", w);
    snprintf(f->model, sizeof(f->model), "%s", m);
    snprintf(f->cluster, sizeof(f->cluster), "%s", c);
    f->value = s->value;
    return 0;
}

int kgpu_bench_figures_read(const char *text, size_t len, const char *source, size_t max,
                            kgpu_bench_figure **out, size_t *n, kgpu_error *err)
{
    reading r = {.v = malloc(sizeof(kgpu_bench_figure) * (max ? max : 1)), .max = max};
    *out = NULL;
    *n = 0;
    if (r.v == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    int rc = kgpu_expo_parse(text, len, source, sample, &r, err);
    if (rc != 0) {
        free(r.v);
        return rc;
    }
    *out = r.v;
    *n = r.n;
    return 0;
}
