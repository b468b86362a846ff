/* Wall-clock timestamps in the form Kubernetes writes them. */
#ifndef KGPU_CLOCK_H
#define KGPU_CLOCK_H

#include <stddef.h>

/* Now in RFC 3339, UTC, with nanoseconds: "2026-11-26T01:02:03.123456789Z". */
void kgpu_rfc3339_now(char *buf, size_t len);

#endif
