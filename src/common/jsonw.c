/*
 * Append-only buffer with JSON string escaping; see jsonw.h for why.
 */
#include <stdlib.h>
#include <string.h>

#include "jsonw.h"

void kgpu_jsonw_init(kgpu_jsonw *w, size_t hint)
{
    w->cap = hint > 64 ? hint : 64;
    w->len = 0;
    w->s = malloc(w->cap);
    w->oom = w->s == NULL;
}

static bool reserve(kgpu_jsonw *w, size_t n)
{
    if (w->oom)
        return false;
    if (w->len + n + 1 <= w->cap)
        return true;
    size_t cap = w->cap * 2;
    while (cap < w->len + n + 1)
        cap *= 2;
    char *s = realloc(w->s, cap);
    if (s == NULL) {
        w->oom = true;
        return false;
    }
    w->s = s;
    w->cap = cap;
    return true;
}

void kgpu_jsonw_raw(kgpu_jsonw *w, const char *s, size_t n)
{
    if (!reserve(w, n))
        return;
    memcpy(w->s + w->len, s, n);
    w->len += n;
}

void kgpu_jsonw_lit(kgpu_jsonw *w, const char *s)
{
    kgpu_jsonw_raw(w, s, strlen(s));
}

void kgpu_jsonw_str(kgpu_jsonw *w, const char *s)
{
    size_t n = strlen(s);
    if (!reserve(w, n * 6 + 2)) /* worst case: every byte as \u00XX */
        return;
    char *o = w->s + w->len;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            static const char hex[] = "0123456789abcdef";
            *o++ = '\\';
            switch (c) {
            case '\n':
                *o++ = 'n';
                break;
            case '\r':
                *o++ = 'r';
                break;
            case '\t':
                *o++ = 't';
                break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    w->len = (size_t)(o - w->s);
}

void kgpu_jsonw_int(kgpu_jsonw *w, long long v)
{
    /* Digits by hand: snprintf was a tenth of a prioritize call. */
    char buf[24];
    int i = (int)sizeof(buf);
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        buf[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0)
        buf[--i] = '-';
    kgpu_jsonw_raw(w, buf + i, sizeof(buf) - (size_t)i);
}

char *kgpu_jsonw_finish(kgpu_jsonw *w)
{
    if (w->oom || !reserve(w, 0)) {
        free(w->s);
        w->s = NULL;
        return NULL;
    }
    w->s[w->len] = '\0';
    char *s = w->s;
    w->s = NULL;
    return s;
}
