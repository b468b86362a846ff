/*
 * Parser of the container's limits file (format in shimlimits.h). Strict where
 * a mistake would hand out memory (the header, indices, numbers, duplicate
 * fields or GPUs), lenient only about keys it does not know, so that a newer
 * device plugin can add fields without breaking older libraries.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "shimlimits.h"

#define HEADER     "# kgpu limits v1"
#define HEADER_PFX "# kgpu limits v"
#define ECHO_MAX   40 /* how much of a bad value a message repeats */

/* One line being parsed; `p`..`end` is what is left of it. */
typedef struct cursor {
    const char *p, *end;
    const char *name;
    int line;
} cursor;

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

static void skip_blanks(cursor *c)
{
    while (c->p < c->end && is_blank(*c->p))
        c->p++;
}

/* The next blank-separated token, or an empty one at the end of the line. */
static void next_token(cursor *c, const char **tok, size_t *n)
{
    skip_blanks(c);
    *tok = c->p;
    while (c->p < c->end && !is_blank(*c->p))
        c->p++;
    *n = (size_t)(c->p - *tok);
}

/* A printable copy of at most ECHO_MAX bytes of s, for messages. */
static const char *echo(const char *s, size_t n, char out[ECHO_MAX + 4])
{
    size_t k = n < ECHO_MAX ? n : ECHO_MAX;
    for (size_t i = 0; i < k; i++)
        out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (n > ECHO_MAX) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
    return out;
}

__attribute__((format(printf, 4, 5))) static int fail(kgpu_error *err, int code, const cursor *c,
                                                      const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return kgpu_error_set(err, code, "%s:%d: %s", c->name, c->line, msg);
}

static int token_is(const char *tok, size_t n, const char *word)
{
    return n == strlen(word) && memcmp(tok, word, n) == 0;
}

/* A decimal number without sign or leading noise; -1 if not one or above max. */
static int parse_number(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    if (n == 0 || n > 20)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (max - d) / 10)
            return -2;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_device(cursor *c, kgpu_shim_limits *lim, kgpu_error *err)
{
    char e1[ECHO_MAX + 4];
    const char *tok;
    size_t n;
    uint64_t index;

    next_token(c, &tok, &n);
    if (n == 0)
        return fail(err, KGPU_EPARSE, c, "device: index missing");
    int r = parse_number(tok, n, 1000000, &index);
    if (r == -1)
        return fail(err, KGPU_EPARSE, c, "device index '%s' is not a number", echo(tok, n, e1));
    if (r != 0 || index != (uint64_t)lim->ndevices)
        return fail(err, KGPU_EPARSE, c,
                    "device index %s, expected %d (devices are numbered 0, 1, ... in order)",
                    echo(tok, n, e1), lim->ndevices);
    if (lim->ndevices == KGPU_SHIM_MAX_DEVICES)
        return fail(err, KGPU_ERANGE, c, "more than %d devices", KGPU_SHIM_MAX_DEVICES);

    kgpu_shim_device_limit *d = &lim->dev[lim->ndevices];
    int have_uuid = 0, have_mem = 0, have_core = 0, have_limit = 0;
    d->core_pct = -1;
    d->core_limit_pct = -1;
    for (;;) {
        next_token(c, &tok, &n);
        if (n == 0)
            break;
        const char *eq = memchr(tok, '=', n);
        if (eq == NULL || eq == tok)
            return fail(err, KGPU_EPARSE, c, "field '%s': expected key=value", echo(tok, n, e1));
        size_t klen = (size_t)(eq - tok), vlen = n - klen - 1;
        const char *val = eq + 1;
        uint64_t v;
        if (token_is(tok, klen, "uuid")) {
            if (have_uuid++)
                return fail(err, KGPU_EPARSE, c, "uuid given twice");
            if (vlen == 0)
                return fail(err, KGPU_EPARSE, c, "uuid: empty");
            if (vlen >= KGPU_SHIM_UUID_MAX)
                return fail(err, KGPU_ERANGE, c, "uuid: '%s' is too long", echo(val, vlen, e1));
            for (size_t i = 0; i < vlen; i++)
                if (val[i] < 0x21 || val[i] > 0x7e)
                    return fail(err, KGPU_EPARSE, c,
                                "uuid: '%s' has a character that is not "
                                "printable ASCII",
                                echo(val, vlen, e1));
            memcpy(d->uuid, val, vlen);
            d->uuid[vlen] = '\0';
        } else if (token_is(tok, klen, "memory_mib")) {
            if (have_mem++)
                return fail(err, KGPU_EPARSE, c, "memory_mib given twice");
            r = parse_number(val, vlen, KGPU_SHIM_MAX_MEMORY_MIB, &v);
            if (r == -2)
                return fail(err, KGPU_ERANGE, c, "memory_mib: %s is too large",
                            echo(val, vlen, e1));
            if (r != 0)
                return fail(err, KGPU_EPARSE, c, "memory_mib: '%s' is not a whole number of MiB",
                            echo(val, vlen, e1));
            d->memory_mib = v;
        } else if (token_is(tok, klen, "core_pct")) {
            if (have_core++)
                return fail(err, KGPU_EPARSE, c, "core_pct given twice");
            r = parse_number(val, vlen, 100, &v);
            if (r == -2)
                return fail(err, KGPU_ERANGE, c, "core_pct: %s is above 100", echo(val, vlen, e1));
            if (r != 0)
                return fail(err, KGPU_EPARSE, c, "core_pct: '%s' is not a whole percent",
                            echo(val, vlen, e1));
            d->core_pct = (int)v;
        } else if (token_is(tok, klen, "core_limit_pct")) {
            if (have_limit++)
                return fail(err, KGPU_EPARSE, c, "core_limit_pct given twice");
            r = parse_number(val, vlen, 100, &v);
            if (r == -2)
                return fail(err, KGPU_ERANGE, c, "core_limit_pct: %s is above 100",
                            echo(val, vlen, e1));
            if (r != 0)
                return fail(err, KGPU_EPARSE, c, "core_limit_pct: '%s' is not a whole percent",
                            echo(val, vlen, e1));
            d->core_limit_pct = (int)v;
        }
        /* Other keys: left for newer readers. */
    }
    if (!have_uuid)
        return fail(err, KGPU_EPARSE, c, "device has no uuid=");
    if (!have_mem)
        return fail(err, KGPU_EPARSE, c, "device has no memory_mib=");
    /* A ceiling below the guaranteed share is a contradiction, not a smaller share. */
    if (d->core_limit_pct >= 0 && d->core_limit_pct < d->core_pct)
        return fail(err, KGPU_ERANGE, c, "core_limit_pct: %d is below core_pct (%d)",
                    d->core_limit_pct, d->core_pct);
    for (int i = 0; i < lim->ndevices; i++)
        if (strcasecmp(lim->dev[i].uuid, d->uuid) == 0)
            return fail(err, KGPU_EPARSE, c, "uuid %s is already device %d", d->uuid, i);
    lim->ndevices++;
    return KGPU_OK;
}

int kgpu_shim_limits_parse(const char *text, size_t len, const char *name, kgpu_shim_limits *out,
                           kgpu_error *err)
{
    char e1[ECHO_MAX + 4];
    cursor c = {.name = name != NULL ? name : "limits", .line = 0};
    const char *p = text, *end = text + len;
    int rc = KGPU_OK;

    memset(out, 0, sizeof(*out));
    if (len > 0 && memchr(text, '\0', len) != NULL) {
        c.line = 1;
        for (const char *q = text; *q != '\0'; q++)
            c.line += *q == '\n';
        rc = fail(err, KGPU_EPARSE, &c, "NUL byte in the file");
        goto out;
    }
    while (p < end || c.line == 0) {
        size_t rest = p < end ? (size_t)(end - p) : 0;
        const char *nl = rest > 0 ? memchr(p, '\n', rest) : NULL;
        c.p = p;
        c.end = nl != NULL ? nl : end;
        c.line++;
        p = nl != NULL ? nl + 1 : end;

        if (c.line == 1) {
            const char *e = c.end;
            while (e > c.p && is_blank(e[-1]))
                e--;
            size_t n = (size_t)(e - c.p);
            if (token_is(c.p, n, HEADER))
                continue;
            if (n > strlen(HEADER_PFX) && memcmp(c.p, HEADER_PFX, strlen(HEADER_PFX)) == 0)
                rc = fail(err, KGPU_EPARSE, &c,
                          "unsupported format version '%s' (this library reads v1)",
                          echo(c.p + strlen(HEADER_PFX) - 1, n - strlen(HEADER_PFX) + 1, e1));
            else
                rc = fail(err, KGPU_EPARSE, &c, "expected '%s' first, found '%s'", HEADER,
                          echo(c.p, n, e1));
            goto out;
        }
        skip_blanks(&c);
        if (c.p == c.end || *c.p == '#')
            continue;
        const char *tok;
        size_t n;
        next_token(&c, &tok, &n);
        if (!token_is(tok, n, "device")) {
            rc = fail(err, KGPU_EPARSE, &c, "unknown line '%s' (expected 'device <index> ...')",
                      echo(tok, n, e1));
            goto out;
        }
        if ((rc = parse_device(&c, out, err)) != KGPU_OK)
            goto out;
    }
    if (out->ndevices == 0) {
        c.line = 0;
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: no device lines", c.name);
    }
out:
    if (rc != KGPU_OK)
        memset(out, 0, sizeof(*out));
    return rc;
}

size_t kgpu_shim_limits_format(const kgpu_shim_limits *lim, char *buf, size_t size)
{
    size_t off = 0;
    int n = snprintf(buf, size, "%s\n", HEADER);
    off += n > 0 ? (size_t)n : 0;
    for (int i = 0; i < lim->ndevices; i++) {
        const kgpu_shim_device_limit *d = &lim->dev[i];
        char core[24] = "", ceiling[32] = "";
        if (d->core_pct >= 0)
            snprintf(core, sizeof(core), " core_pct=%d", d->core_pct);
        if (d->core_limit_pct >= 0)
            snprintf(ceiling, sizeof(ceiling), " core_limit_pct=%d", d->core_limit_pct);
        n = snprintf(off < size ? buf + off : NULL, off < size ? size - off : 0,
                     "device %d uuid=%s memory_mib=%llu%s%s\n", i, d->uuid,
                     (unsigned long long)d->memory_mib, core, ceiling);
        off += n > 0 ? (size_t)n : 0;
    }
    return off;
}

int kgpu_shim_limits_find(const kgpu_shim_limits *lim, const char *uuid)
{
    for (int i = 0; i < lim->ndevices; i++)
        if (strcasecmp(lim->dev[i].uuid, uuid) == 0)
            return i;
    return -1;
}
