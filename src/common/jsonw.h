/*
 * A minimal streaming JSON writer for the extender's hot replies (filter and
 * prioritize name hundreds of nodes per call). Building those replies as
 * jansson trees and dumping them cost about 40 % of a call (callgrind, 500
 * nodes); appending to one buffer costs a few percent. Everything else uses
 * jansson. Strings are escaped per RFC 8259; input must be valid UTF-8 (it
 * comes from jansson, which guarantees it).
 */
#ifndef KGPU_JSONW_H
#define KGPU_JSONW_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kgpu_jsonw {
    char *s;
    size_t len, cap;
    bool oom;
} kgpu_jsonw;

void kgpu_jsonw_init(kgpu_jsonw *w, size_t hint);
/* Appends bytes as they are (a literal such as "{\"Error\":"). */
void kgpu_jsonw_raw(kgpu_jsonw *w, const char *s, size_t n);
void kgpu_jsonw_lit(kgpu_jsonw *w, const char *s);
/* Appends a quoted, escaped string. */
void kgpu_jsonw_str(kgpu_jsonw *w, const char *s);
void kgpu_jsonw_int(kgpu_jsonw *w, long long v);
/* The NUL-terminated text (caller frees), or NULL if memory ran out. */
char *kgpu_jsonw_finish(kgpu_jsonw *w);

#endif
