/*
 * A reader of the Prometheus text exposition format (0.0.4), as
 * kgpu-extender's /metrics writes it, for `kgpu report` and kgpu-dispatcher's
 * benchmarks. The text comes
 * from a file or a server the operator names, so it is read as outside
 * input: every length is bounded, and an error names the line. Pure: no I/O.
 */
#ifndef KGPU_EXPO_H
#define KGPU_EXPO_H

#include <stddef.h>

#include "kgpu/error.h"

#define KGPU_EXPO_LINE_MAX   65536 /* bytes of one line, its newline excluded */
#define KGPU_EXPO_NAME_MAX   128   /* bytes of a metric or label name */
#define KGPU_EXPO_VALUE_MAX  256   /* bytes of a label value, unescaped */
#define KGPU_EXPO_LABELS_MAX 16    /* labels of one sample */

typedef struct kgpu_expo_label {
    char name[KGPU_EXPO_NAME_MAX + 1];
    char value[KGPU_EXPO_VALUE_MAX + 1]; /* unescaped: \\ \" \n read as \ " newline */
} kgpu_expo_label;

/* One sample line. Borrowed by the callback for the call only. */
typedef struct kgpu_expo_sample {
    char name[KGPU_EXPO_NAME_MAX + 1];
    int nlabels;
    kgpu_expo_label label[KGPU_EXPO_LABELS_MAX];
    double value; /* NaN and +-Inf as written */
    long line;    /* 1-based */
} kgpu_expo_sample;

/* The value of label `name` of s, or NULL. */
const char *kgpu_expo_label_value(const kgpu_expo_sample *s, const char *name);

/*
 * Called for each sample; a non-zero return stops the reading and is
 * returned (err filled by the callback).
 */
typedef int (*kgpu_expo_fn)(void *ctx, const kgpu_expo_sample *s, kgpu_error *err);

/*
 * Reads text[0..len) (need not be NUL-terminated; a NUL byte is an error),
 * calling fn for each sample in order. Comments (# HELP, # TYPE, any #)
 * and blank lines are skipped. Returns 0, the callback's code, or
 * KGPU_EPARSE with err "SOURCE:LINE: what is wrong" (source: a file name
 * or URL for messages).
 */
int kgpu_expo_parse(const char *text, size_t len, const char *source, kgpu_expo_fn fn, void *ctx,
                    kgpu_error *err);

#endif
