/*
 * Strict one-pass reader for the Alibaba GPU trace CSV files (FGD study): any line
 * that is not exactly what the trace writes stops the parse with "file:line: ...", so a
 * damaged or foreign file is never half-read. All strings go into one arena sized up
 * front from the input length, so pointers stay valid and nothing is allocated per field.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kgpu/trace.h"

#define NODE_HEADER "sn,cpu_milli,memory_mib,gpu,model"
#define POD_HEADER5 "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
#define POD_HEADER11                                                                               \
    POD_HEADER5 ",gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
/* The 11 columns and the pod's GPU queue (docs/queues.md): not in the Alibaba files. */
#define POD_HEADER12 POD_HEADER11 ",queue"

/* Sanity limits: far above any real node or pod, low enough that sums cannot overflow. */
#define MAX_CPU_MILLI  1000000000LL    /* 10^6 cores */
#define MAX_MEMORY_MIB 10000000000LL   /* ~9.3 PiB */
#define MAX_TIME       1000000000000LL /* seconds; ~31,700 years */
#define MAX_DIGITS     18              /* accumulating 18 digits cannot overflow int64 */
#define SHOWN_MAX      40              /* bytes of a bad value quoted in a message */
#define MAX_COLUMNS    12

static const char *const node_columns[] = {"sn", "cpu_milli", "memory_mib", "gpu", "model"};
static const char *const pod_columns[] = {
    "name", "cpu_milli", "memory_mib",    "num_gpu",       "gpu_milli",     "gpu_spec",
    "qos",  "pod_phase", "creation_time", "deletion_time", "scheduled_time", "queue"};

/* A field of the current line: borrowed from the input buffer, not NUL-terminated. */
typedef struct field {
    const char *s;
    size_t n;
} field;

/* State of one parse. The arena is owned by `t` (freed with it on error). */
typedef struct parser {
    const char *file;
    int line;
    kgpu_error *err;
    kgpu_trace *t;
    size_t arena_used, arena_cap;
    size_t cap; /* allocated entries of t->nodes or t->pods */
} parser;

/* Length of s[0..n) shown in a message, so a huge bad value cannot swamp it. */
static int shown(size_t n)
{
    return n > SHOWN_MAX ? SHOWN_MAX : (int)n;
}

static const char *ellipsis(size_t n)
{
    return n > SHOWN_MAX ? "..." : "";
}

static bool field_is(field f, const char *lit)
{
    size_t n = strlen(lit);
    return f.n == n && memcmp(f.s, lit, n) == 0;
}

/* Empty, or "nan" as pandas writes a missing value. */
static bool field_missing(field f)
{
    return f.n == 0 || field_is(f, "nan");
}

/*
 * Copies s[0..n) into the arena and NUL-terminates it; "" is shared (arena[0]).
 * The arena is sized so this cannot run out (see arena_size); the check is a guard.
 */
static char *arena_put(parser *ps, const char *s, size_t n)
{
    if (n == 0)
        return ps->t->arena;
    if (n + 1 > ps->arena_cap - ps->arena_used)
        return NULL;
    char *d = ps->t->arena + ps->arena_used;
    memcpy(d, s, n);
    d[n] = '\0';
    ps->arena_used += n + 1;
    return d;
}

/* Like arena_put, but fails the parse (internal error) if the guard trips. */
static int put_field(parser *ps, field f, char **out)
{
    *out = arena_put(ps, f.s, f.n);
    if (*out == NULL)
        return kgpu_error_set(ps->err, KGPU_ESTATE, "%s:%d: internal error: string arena full",
                              ps->file, ps->line);
    return KGPU_OK;
}

/*
 * Splits line s[0..n) (line end already stripped) at commas into f[0..want) and
 * returns the number of fields on the line, which may differ from want. Rejects
 * quotes, NUL bytes and stray carriage returns, naming the column they sit in.
 */
static int split_line(parser *ps, const char *s, size_t n, field *f, int want,
                      const char *const *names, int *count)
{
    int k = 0;
    const char *start = s;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch > ',') /* letters, digits, '-', '|', '.', ...: the common case */
            continue;
        const char *what = NULL;
        if (ch == ',') {
            if (k < want)
                f[k] = (field){start, (size_t)(s + i - start)};
            k++;
            start = s + i + 1;
            continue;
        } else if (ch == '"') {
            what = "a quote character (quoting is not supported)";
        } else if (ch == '\0') {
            what = "a NUL byte";
        } else if (ch == '\r') {
            what = "a carriage return inside the line";
        }
        if (what != NULL) {
            if (k < want)
                return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s contains %s", ps->file,
                                      ps->line, names[k], what);
            return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: column %d contains %s", ps->file,
                                  ps->line, k + 1, what);
        }
    }
    if (k < want)
        f[k] = (field){start, (size_t)(s + n - start)};
    *count = k + 1;
    return KGPU_OK;
}

/*
 * Parses a decimal integer (optional '-', digits only, no spaces) in [min, max]
 * into *out. Errors name the column and quote the text as written.
 */
static int parse_int(parser *ps, field f, const char *what, int64_t min, int64_t max, int64_t *out)
{
    if (f.n == 0)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s is empty", ps->file, ps->line, what);
    size_t i = f.s[0] == '-' ? 1 : 0;
    bool neg = i == 1;
    if (i == f.n)
        goto not_int;
    int64_t v = 0;
    bool huge = false;
    for (size_t digits = 0; i < f.n; i++) {
        unsigned d = (unsigned char)f.s[i] - '0';
        if (d > 9)
            goto not_int;
        if (v == 0 && d == 0)
            continue; /* leading zeros do not count towards overflow */
        if (++digits > MAX_DIGITS)
            huge = true;
        else
            v = v * 10 + d;
    }
    if (neg)
        v = -v;
    if (huge ? !neg : v > max)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s %.*s%s > %lld", ps->file, ps->line,
                              what, shown(f.n), f.s, ellipsis(f.n), (long long)max);
    if (huge || v < min)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s %.*s%s < %lld", ps->file, ps->line,
                              what, shown(f.n), f.s, ellipsis(f.n), (long long)min);
    *out = v;
    return KGPU_OK;
not_int:
    return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s \"%.*s%s\" is not an integer", ps->file,
                          ps->line, what, shown(f.n), f.s, ellipsis(f.n));
}

static int parse_small(parser *ps, field f, const char *what, int min, int max, int *out)
{
    int64_t v;
    int rc = parse_int(ps, f, what, min, max, &v);
    if (rc == KGPU_OK)
        *out = (int)v;
    return rc;
}

/* An optional time: empty means absent (-1). */
static int parse_time(parser *ps, field f, const char *what, int64_t *out)
{
    if (f.n == 0) {
        *out = -1;
        return KGPU_OK;
    }
    return parse_int(ps, f, what, 0, MAX_TIME, out);
}

/* A pod or node name: required, and short enough to be a Kubernetes object name. */
static int parse_name(parser *ps, field f, const char *what, char **out)
{
    if (f.n == 0)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s is empty", ps->file, ps->line, what);
    if (f.n > KGPU_NAME_MAX)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: %s \"%.*s...\" longer than %d bytes",
                              ps->file, ps->line, what, SHOWN_MAX, f.s, KGPU_NAME_MAX);
    return put_field(ps, f, out);
}

/*
 * Makes room for one more record in `array` (count used, `size`-byte entries), doubling
 * as needed. Returns the (maybe moved) array, or NULL with the error set.
 */
static void *grow(parser *ps, void *array, size_t count, size_t size)
{
    if (count < ps->cap)
        return array;
    size_t cap = ps->cap * 2;
    void *p = realloc(array, cap * size);
    if (p == NULL) {
        kgpu_error_set(ps->err, KGPU_ENOMEM, "%s:%d: out of memory", ps->file, ps->line);
        return NULL;
    }
    ps->cap = cap;
    return p;
}

static int node_line(parser *ps, const field *f)
{
    kgpu_trace *t = ps->t;
    kgpu_trace_node *nodes = grow(ps, t->nodes, t->nnodes, sizeof(*t->nodes));
    if (nodes == NULL)
        return KGPU_ENOMEM;
    t->nodes = nodes;
    int rc;
    kgpu_trace_node *n = &t->nodes[t->nnodes];
    memset(n, 0, sizeof(*n));
    n->line = ps->line;
    if ((rc = parse_name(ps, f[0], "sn", &n->name)) != KGPU_OK ||
        (rc = parse_int(ps, f[1], "cpu_milli", 0, MAX_CPU_MILLI, &n->cpu_milli)) != KGPU_OK ||
        (rc = parse_int(ps, f[2], "memory_mib", 0, MAX_MEMORY_MIB, &n->memory_mib)) != KGPU_OK ||
        (rc = parse_small(ps, f[3], "gpu", 0, KGPU_MAX_GPUS_PER_NODE, &n->gpus)) != KGPU_OK)
        return rc;
    field model = f[4];
    if (field_missing(model)) {
        if (n->gpus > 0)
            return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: model is empty with gpu %d",
                                  ps->file, ps->line, n->gpus);
        model.n = 0;
    } else if (n->gpus == 0) {
        /* The header promises "" for GPU-less nodes; a model here means a damaged line. */
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: model \"%.*s%s\" with gpu 0", ps->file,
                              ps->line, shown(model.n), model.s, ellipsis(model.n));
    } else if (model.n >= KGPU_MODEL_NAME_MAX) {
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: model \"%.*s...\" longer than %d bytes",
                              ps->file, ps->line, SHOWN_MAX, model.s, KGPU_MODEL_NAME_MAX - 1);
    }
    if ((rc = put_field(ps, model, &n->model)) != KGPU_OK)
        return rc;
    t->nnodes++;
    return KGPU_OK;
}

/* Splits gpu_spec at '|' into p->spec (copies in the arena); spec_text keeps the raw text. */
static int parse_spec(parser *ps, field f, kgpu_trace_pod *p)
{
    if (field_missing(f))
        f.n = 0; /* "nan" is pandas for empty: any model */
    int rc = put_field(ps, f, &p->spec_text);
    if (rc != KGPU_OK)
        return rc;
    const char *s = f.s, *end = f.s + f.n;
    while (s < end) {
        const char *bar = memchr(s, '|', (size_t)(end - s));
        const char *e = bar != NULL ? bar : end;
        if (e > s) { /* "T4||P100" and a trailing bar hold empty elements: skipped */
            if (p->nspec == KGPU_TRACE_MAX_SPEC)
                return kgpu_error_set(
                    ps->err, KGPU_EPARSE, "%s:%d: gpu_spec \"%.*s%s\" names more than %d models",
                    ps->file, ps->line, shown(f.n), f.s, ellipsis(f.n), KGPU_TRACE_MAX_SPEC);
            char *m;
            if ((rc = put_field(ps, (field){s, (size_t)(e - s)}, &m)) != KGPU_OK)
                return rc;
            p->spec[p->nspec++] = m;
        }
        if (bar == NULL)
            break;
        s = bar + 1;
    }
    return KGPU_OK;
}

static int pod_line(parser *ps, const field *f)
{
    kgpu_trace *t = ps->t;
    kgpu_trace_pod *pods = grow(ps, t->pods, t->npods, sizeof(*t->pods));
    if (pods == NULL)
        return KGPU_ENOMEM;
    t->pods = pods;
    int rc;
    kgpu_trace_pod *p = &t->pods[t->npods];
    memset(p, 0, sizeof(*p));
    p->line = ps->line;
    p->spec_text = p->qos = p->phase = p->queue = t->arena;
    p->creation = p->deletion = p->scheduled = -1;
    if ((rc = parse_name(ps, f[0], "name", &p->name)) != KGPU_OK ||
        (rc = parse_int(ps, f[1], "cpu_milli", 0, MAX_CPU_MILLI, &p->cpu_milli)) != KGPU_OK ||
        (rc = parse_int(ps, f[2], "memory_mib", 0, MAX_MEMORY_MIB, &p->memory_mib)) != KGPU_OK ||
        (rc = parse_small(ps, f[3], "num_gpu", 0, KGPU_MAX_GPUS_PER_NODE, &p->num_gpu)) !=
            KGPU_OK ||
        (rc = parse_small(ps, f[4], "gpu_milli", 0, KGPU_MILLI, &p->gpu_milli)) != KGPU_OK)
        return rc;
    /* Whole GPUs (1000 each), or a share of exactly one GPU; none for CPU-only pods. */
    if (p->num_gpu == 0 && p->gpu_milli != 0)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: gpu_milli %d with num_gpu 0", ps->file,
                              ps->line, p->gpu_milli);
    if (p->num_gpu > 0 && p->gpu_milli == 0)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: gpu_milli 0 with num_gpu %d", ps->file,
                              ps->line, p->num_gpu);
    if (p->num_gpu > 1 && p->gpu_milli < KGPU_MILLI)
        return kgpu_error_set(ps->err, KGPU_EPARSE, "%s:%d: gpu_milli %d < %d with num_gpu %d",
                              ps->file, ps->line, p->gpu_milli, KGPU_MILLI, p->num_gpu);
    if (t->columns >= 11) {
        if ((rc = parse_spec(ps, f[5], p)) != KGPU_OK ||
            (rc = put_field(ps, f[6], &p->qos)) != KGPU_OK ||
            (rc = put_field(ps, f[7], &p->phase)) != KGPU_OK ||
            (rc = parse_time(ps, f[8], "creation_time", &p->creation)) != KGPU_OK ||
            (rc = parse_time(ps, f[9], "deletion_time", &p->deletion)) != KGPU_OK ||
            (rc = parse_time(ps, f[10], "scheduled_time", &p->scheduled)) != KGPU_OK)
            return rc;
    }
    if (t->columns == 12 && (rc = put_field(ps, f[11], &p->queue)) != KGPU_OK)
        return rc;
    t->npods++;
    return KGPU_OK;
}

/*
 * Arena bytes that always suffice. Every stored string is a field plus its NUL,
 * and each field is followed by a comma or line end (the last one in the file
 * perhaps by nothing: +1). Only gpu_spec is stored twice (raw and split, the split
 * copies taking at most its length + 1), so the 11- and 12-column layouts need 2x.
 * One more byte for the shared "".
 */
static size_t arena_size(size_t len, int columns)
{
    return (columns >= 11 ? 2 * len : len) + 3;
}

/*
 * The shared reader: header check, then one record per line. `pods` selects the
 * record kind. On success *out holds the result; on error *out is zeroed and
 * everything allocated is freed.
 */
static int parse(const char *buf, size_t len, const char *file, bool pods, kgpu_trace *out,
                 kgpu_error *err)
{
    if (file == NULL)
        file = "<buffer>";
    if (out == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: no output trace given", file);
    memset(out, 0, sizeof(*out));
    if (buf == NULL && len > 0)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: no input buffer given", file);
    if (len > (size_t)INT32_MAX)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %zu bytes is too large for a trace file", file,
                              len);

    if (len == 0)
        return kgpu_error_set(err, KGPU_EPARSE, "%s:1: empty file, expected the header \"%s\"",
                              file, pods ? POD_HEADER11 : NODE_HEADER);

    kgpu_trace t;
    memset(&t, 0, sizeof(t));
    parser ps = {.file = file, .line = 1, .err = err, .t = &t};
    const char *p = buf, *end = buf + len;
    const char *const *names = pods ? pod_columns : node_columns;
    int rc = KGPU_OK;

    const char *nl = memchr(p, '\n', len);
    size_t n = (size_t)((nl != NULL ? nl : end) - p);
    if (n > 0 && p[n - 1] == '\r')
        n--;
    field header = {p, n};
    if (!pods && field_is(header, NODE_HEADER))
        t.columns = 5;
    else if (pods && field_is(header, POD_HEADER11))
        t.columns = 11;
    else if (pods && field_is(header, POD_HEADER12))
        t.columns = 12;
    else if (pods && field_is(header, POD_HEADER5))
        t.columns = 5;
    else if (pods)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s:1: unknown header \"%.*s%s\", expected the pod list header "
                              "\"%s\" or \"%s\" (or the first with \",queue\")",
                              file, shown(n), p, ellipsis(n), POD_HEADER11, POD_HEADER5);
    else
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s:1: unknown header \"%.*s%s\", expected the node list header "
                              "\"%s\"",
                              file, shown(n), p, ellipsis(n), NODE_HEADER);
    p = nl != NULL ? nl + 1 : end;

    ps.arena_cap = arena_size(len, t.columns);
    /* A first guess of the record count (trace lines run 35..75 bytes); grown if short. */
    ps.cap = len / 48 + 16;
    t.arena = malloc(ps.arena_cap);
    if (pods)
        t.pods = malloc(ps.cap * sizeof(*t.pods));
    else
        t.nodes = malloc(ps.cap * sizeof(*t.nodes));
    if (t.arena == NULL || (t.pods == NULL && t.nodes == NULL)) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "%s: out of memory", file);
        goto fail;
    }
    t.arena[0] = '\0';
    ps.arena_used = 1;

    while (p < end) {
        ps.line++;
        nl = memchr(p, '\n', (size_t)(end - p));
        const char *next = nl != NULL ? nl + 1 : end;
        n = (size_t)((nl != NULL ? nl : end) - p);
        if (n > 0 && p[n - 1] == '\r')
            n--;
        if (n == 0) {
            if (next == end)
                break; /* one empty last line, as some writers leave */
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%d: empty line", file, ps.line);
            goto fail;
        }
        field f[MAX_COLUMNS];
        int count = 0;
        if ((rc = split_line(&ps, p, n, f, t.columns, names, &count)) != KGPU_OK)
            goto fail;
        if (count != t.columns) {
            rc = kgpu_error_set(err, KGPU_EPARSE, "%s:%d: expected %d columns, found %d", file,
                                ps.line, t.columns, count);
            goto fail;
        }
        if ((rc = pods ? pod_line(&ps, f) : node_line(&ps, f)) != KGPU_OK)
            goto fail;
        p = next;
    }

    /* Give back the unused tail of the guess; the arrays hold no inward pointers. */
    if (pods && t.npods > 0 && t.npods < ps.cap) {
        kgpu_trace_pod *shrunk = realloc(t.pods, t.npods * sizeof(*t.pods));
        if (shrunk != NULL)
            t.pods = shrunk;
    } else if (!pods && t.nnodes > 0 && t.nnodes < ps.cap) {
        kgpu_trace_node *shrunk = realloc(t.nodes, t.nnodes * sizeof(*t.nodes));
        if (shrunk != NULL)
            t.nodes = shrunk;
    }
    *out = t;
    return KGPU_OK;
fail:
    kgpu_trace_free(&t);
    return rc;
}

/* Contract (both parsers): *out is overwritten, not freed first; free it with kgpu_trace_free. */
int kgpu_trace_parse_nodes(const char *buf, size_t len, const char *file, kgpu_trace *out,
                           kgpu_error *err)
{
    return parse(buf, len, file, false, out, err);
}

int kgpu_trace_parse_pods(const char *buf, size_t len, const char *file, kgpu_trace *out,
                          kgpu_error *err)
{
    return parse(buf, len, file, true, out, err);
}

/* Frees what a parse allocated and zeroes *t; NULL and zeroed structs are fine. */
void kgpu_trace_free(kgpu_trace *t)
{
    if (t == NULL)
        return;
    free(t->nodes);
    free(t->pods);
    free(t->arena);
    memset(t, 0, sizeof(*t));
}

/* Overwrites all of *req; its allow list borrows pod->spec, so the trace must outlive it. */
void kgpu_trace_pod_request(const kgpu_trace_pod *pod, kgpu_request *req)
{
    memset(req, 0, sizeof(*req));
    req->cpu_milli = pod->cpu_milli;
    req->memory_mib = pod->memory_mib;
    if (pod->num_gpu > 0) {
        req->gpu_count = pod->num_gpu;
        req->gpu_milli = pod->gpu_milli;
        req->exclusive = pod->gpu_milli == KGPU_MILLI;
        req->gpu_memory_mib = 0; /* the trace asks for compute only */
    }
    req->allow = pod->spec;
    req->nallow = pod->nspec;
    req->shape = -1;
    req->models = 0;
}

/*
 * GPU memory by model. Nominal: the trace records none, so these are the usual
 * sizes of those cards; the anonymized G1/G2/G3 and anything unknown get 16 GiB.
 */
static const struct {
    const char *model;
    int64_t memory_mib;
} model_memory[] = {
    {"P100", 16384},    {"T4", 16384},  {"V100M16", 16384},
    {"V100M32", 32768}, {"A10", 24576}, {"A100", 81920},
};
#define DEFAULT_GPU_MEMORY_MIB 16384

static int64_t gpu_memory_mib(const char *model)
{
    for (size_t i = 0; i < sizeof(model_memory) / sizeof(model_memory[0]); i++)
        if (strcmp(model_memory[i].model, model) == 0)
            return model_memory[i].memory_mib;
    return DEFAULT_GPU_MEMORY_MIB;
}

/*
 * Adds nodes->nodes to c in order. On error the nodes before the failing one stay
 * added (the caller normally frees the cluster); duplicate names fail here, not in
 * the parse.
 */
int kgpu_trace_build_cluster(const kgpu_trace *nodes, kgpu_cluster *c, kgpu_error *err)
{
    if (nodes == NULL || c == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "build_cluster: no trace or no cluster given");
    kgpu_gpu_spec gpus[KGPU_MAX_GPUS_PER_NODE];
    char uuids[KGPU_MAX_GPUS_PER_NODE][KGPU_UUID_MAX];
    for (size_t i = 0; i < nodes->nnodes; i++) {
        const kgpu_trace_node *n = &nodes->nodes[i];
        if (n->gpus < 0 || n->gpus > KGPU_MAX_GPUS_PER_NODE)
            return kgpu_error_set(err, KGPU_ERANGE, "line %d: node %s: %d GPUs (at most %d)",
                                  n->line, n->name, n->gpus, KGPU_MAX_GPUS_PER_NODE);
        int64_t mib = n->gpus > 0 ? gpu_memory_mib(n->model) : 0;
        for (int g = 0; g < n->gpus; g++) {
            int w = snprintf(uuids[g], sizeof(uuids[g]), "%s-gpu%d", n->name, g);
            if (w < 0 || (size_t)w >= sizeof(uuids[g]))
                return kgpu_error_set(err, KGPU_ERANGE,
                                      "line %d: node %s: GPU uuid \"%s-gpu%d\" longer than %d "
                                      "bytes",
                                      n->line, n->name, n->name, g, KGPU_UUID_MAX - 1);
            gpus[g] = (kgpu_gpu_spec){.index = g,
                                      .uuid = uuids[g],
                                      .model = n->model,
                                      .memory_mib = mib,
                                      .numa = -1,
                                      .healthy = true};
        }
        kgpu_node_spec spec = {.name = n->name,
                               .cpu_milli = n->cpu_milli,
                               .memory_mib = n->memory_mib,
                               .gpus = gpus,
                               .ngpus = n->gpus};
        int rc = kgpu_cluster_add_node(c, &spec, err);
        if (rc < 0) {
            if (err != NULL) {
                char why[KGPU_ERROR_MSG_MAX];
                memcpy(why, err->msg, sizeof(why));
                why[sizeof(why) - 1] = '\0';
                kgpu_error_set(err, rc, "line %d: %s", n->line, why);
            }
            return rc;
        }
    }
    return KGPU_OK;
}
