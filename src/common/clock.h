/* Wall-clock timestamps in the forms Kubernetes writes them (RFC 3339, UTC). */
#ifndef KGPU_CLOCK_H
#define KGPU_CLOCK_H

#include <stdbool.h>
#include <stddef.h>

/* Now with nanoseconds: "2026-11-26T01:02:03.123456789Z". */
void kgpu_rfc3339_now(char *buf, size_t len);

/* Unix time `t` with `digits` (0..9) fraction digits: 6 gives a MicroTime. */
void kgpu_rfc3339(double t, int digits, char *buf, size_t len);

/*
 * Parses "2025-06-02T09:14:07.512345678Z" (any fraction, or none; "Z" or an
 * offset such as "+02:00") into Unix seconds. False when unreadable.
 */
bool kgpu_rfc3339_parse(const char *s, double *out);

#endif
