/*
 * The text exposition reader (expo.h): one pass over the buffer, line by
 * line, with a cursor that never reads past the line's end. Each part of a
 * sample is copied into a fixed field only after its length is checked, so
 * a hostile server can make the reading fail, never overrun.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expo.h"

typedef struct cursor {
    const char *p, *end; /* the rest of the line */
    const char *source;
    long line;
} cursor;

static int fail(kgpu_error *err, const cursor *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(kgpu_error *err, const cursor *c, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return kgpu_error_set(err, KGPU_EPARSE, "%.200s:%ld: %s", c->source, c->line, what);
}

static void skip_blanks(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t'))
        c->p++;
}

static bool name_char(char ch, bool first, bool colon)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
           (colon && ch == ':') || (!first && ch >= '0' && ch <= '9');
}

/* A metric name (colons allowed) or a label name into out; what: for the message. */
static int read_name(cursor *c, bool colon, char *out, const char *what, kgpu_error *err)
{
    const char *start = c->p;
    while (c->p < c->end && name_char(*c->p, c->p == start, colon))
        c->p++;
    size_t n = (size_t)(c->p - start);
    if (n == 0)
        return fail(err, c, "expected a %s", what);
    if (n > KGPU_EXPO_NAME_MAX)
        return fail(err, c, "%s longer than %d bytes", what, KGPU_EXPO_NAME_MAX);
    memcpy(out, start, n);
    out[n] = '\0';
    return 0;
}

/* "value" with the format's three escapes, into out (KGPU_EXPO_VALUE_MAX + 1 bytes). */
static int read_value(cursor *c, char *out, const char *label, kgpu_error *err)
{
    if (c->p >= c->end || *c->p != '"')
        return fail(err, c, "label %s: expected a quoted value", label);
    c->p++;
    size_t n = 0;
    for (;;) {
        if (c->p >= c->end)
            return fail(err, c, "label %s: value not closed by '\"'", label);
        char ch = *c->p++;
        if (ch == '"')
            break;
        if (ch == '\\') {
            if (c->p >= c->end)
                return fail(err, c, "label %s: value not closed by '\"'", label);
            char e = *c->p++;
            if (e == 'n')
                ch = '\n';
            else if (e == '\\' || e == '"')
                ch = e;
            else
                return fail(err, c, "label %s: unknown escape '\\%c' (\\\\, \\\" and \\n are known)",
                            label, e >= 0x20 && e < 0x7f ? e : '?');
        }
        if (n == KGPU_EXPO_VALUE_MAX)
            return fail(err, c, "label %s: value longer than %d bytes", label,
                        KGPU_EXPO_VALUE_MAX);
        out[n++] = ch;
    }
    out[n] = '\0';
    return 0;
}

static int read_labels(cursor *c, kgpu_expo_sample *s, kgpu_error *err)
{
    c->p++; /* '{' */
    for (;;) {
        skip_blanks(c);
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            return 0;
        }
        if (s->nlabels == KGPU_EXPO_LABELS_MAX)
            return fail(err, c, "more than %d labels", KGPU_EXPO_LABELS_MAX);
        kgpu_expo_label *l = &s->label[s->nlabels];
        int rc = read_name(c, false, l->name, "label name", err);
        if (rc != 0)
            return rc;
        for (int i = 0; i < s->nlabels; i++)
            if (strcmp(s->label[i].name, l->name) == 0)
                return fail(err, c, "label %s given twice", l->name);
        skip_blanks(c);
        if (c->p >= c->end || *c->p != '=')
            return fail(err, c, "label %s: expected '='", l->name);
        c->p++;
        skip_blanks(c);
        if ((rc = read_value(c, l->value, l->name, err)) != 0)
            return rc;
        s->nlabels++;
        skip_blanks(c);
        if (c->p < c->end && *c->p == ',')
            c->p++;
        else if (c->p >= c->end || *c->p != '}')
            return fail(err, c, "expected ',' or '}' after label %s", l->name);
    }
}

/* The next blank-separated token as a double (Prometheus' NaN, +Inf, -Inf included). */
static int read_number(cursor *c, double *out, bool integer, const char *what, kgpu_error *err)
{
    const char *start = c->p;
    while (c->p < c->end && *c->p != ' ' && *c->p != '\t')
        c->p++;
    size_t n = (size_t)(c->p - start);
    char tok[64];
    if (n == 0)
        return fail(err, c, "expected a %s", what);
    if (n >= sizeof(tok))
        return fail(err, c, "%s longer than %zu bytes", what, sizeof(tok) - 1);
    memcpy(tok, start, n);
    tok[n] = '\0';
    char *end;
    errno = 0;
    if (integer) {
        long long v = strtoll(tok, &end, 10);
        *out = (double)v;
    } else {
        *out = strtod(tok, &end);
    }
    /* strtod also takes hex floats and "infinity": the format has neither. */
    bool odd = strpbrk(tok, "xXyY") != NULL;
    if (*end != '\0' || end == tok || errno == ERANGE || odd)
        return fail(err, c, "%s '%.40s' is not a number", what, tok);
    return 0;
}

static int read_sample(cursor *c, kgpu_expo_sample *s, kgpu_error *err)
{
    int rc = read_name(c, true, s->name, "metric name", err);
    if (rc != 0)
        return rc;
    s->nlabels = 0;
    const char *before = c->p; /* the value must follow blanks: "m 1", "m{} 1", "m {} 1" */
    skip_blanks(c);
    if (c->p < c->end && *c->p == '{') {
        if ((rc = read_labels(c, s, err)) != 0)
            return rc;
        before = c->p;
        skip_blanks(c);
    }
    if (c->p == before)
        return fail(err, c, "expected a blank before the value of %s", s->name);
    if ((rc = read_number(c, &s->value, false, "value", err)) != 0)
        return rc;
    skip_blanks(c);
    double ts;
    if (c->p < c->end && (rc = read_number(c, &ts, true, "timestamp", err)) != 0)
        return rc;
    skip_blanks(c);
    if (c->p < c->end)
        return fail(err, c, "unexpected text after the sample of %s", s->name);
    return 0;
}

const char *kgpu_expo_label_value(const kgpu_expo_sample *s, const char *name)
{
    for (int i = 0; i < s->nlabels; i++)
        if (strcmp(s->label[i].name, name) == 0)
            return s->label[i].value;
    return NULL;
}

int kgpu_expo_parse(const char *text, size_t len, const char *source, kgpu_expo_fn fn, void *ctx,
                    kgpu_error *err)
{
    kgpu_error_clear(err);
    kgpu_expo_sample *s = malloc(sizeof(*s)); /* 20 KiB: kept off the stack */
    if (s == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    cursor c = {.source = source ? source : "metrics", .line = 0};
    const char *p = text, *end = text + len;
    int rc = 0;
    while (rc == 0 && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl != NULL ? nl : end;
        c.line++;
        c.p = p;
        c.end = eol;
        if (c.end > c.p && c.end[-1] == '\r')
            c.end--; /* a file edited on Windows */
        p = nl != NULL ? nl + 1 : end;
        if ((size_t)(eol - c.p) > KGPU_EXPO_LINE_MAX) {
            rc = fail(err, &c, "line longer than %d bytes", KGPU_EXPO_LINE_MAX);
            break;
        }
        if (memchr(c.p, '\0', (size_t)(c.end - c.p)) != NULL) {
            rc = fail(err, &c, "a NUL byte: not a text exposition");
            break;
        }
        skip_blanks(&c);
        if (c.p == c.end || *c.p == '#')
            continue;
        memset(s, 0, sizeof(*s));
        s->line = c.line;
        rc = read_sample(&c, s, err);
        if (rc == 0)
            rc = fn(ctx, s, err);
    }
    free(s);
    return rc;
}
