/*
 * The container's limits file, as the device plugin writes it (shimlimits.h, not
 * limits.h, so that <limits.h> stays the C library's):
 *
 *   # kgpu limits v1
 *   device 0 uuid=GPU-8f3c... memory_mib=4096 core_pct=25 core_limit_pct=50
 *
 * A pure parser (no I/O), so it is fuzzed and unit-tested on its own. The
 * shim enforces what it returns and nothing else: the file is a read-only
 * mount, which is why limits come only from here.
 */
#ifndef KGPU_SHIM_SHIMLIMITS_H
#define KGPU_SHIM_SHIMLIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "kgpu/error.h"

#define KGPU_SHIM_MAX_DEVICES    16
#define KGPU_SHIM_UUID_MAX       96           /* with the NUL */
#define KGPU_SHIM_MAX_MEMORY_MIB (1ULL << 32) /* 4 PiB: anything larger is a typo */

typedef struct kgpu_shim_device_limit {
    char uuid[KGPU_SHIM_UUID_MAX];
    uint64_t memory_mib;
    int core_pct; /* 0..100, or -1 when the line has none */
    /*
     * The ceiling on an otherwise idle GPU, core_pct..100 (0..100, unused,
     * without core_pct), or -1 when the line has none: no ceiling, as 100.
     */
    int core_limit_pct;
} kgpu_shim_device_limit;

/* Devices in file order: dev[i] is "device i", i.e. the i-th GPU of NVIDIA_VISIBLE_DEVICES. */
typedef struct kgpu_shim_limits {
    int ndevices; /* 1..KGPU_SHIM_MAX_DEVICES after a successful parse */
    kgpu_shim_device_limit dev[KGPU_SHIM_MAX_DEVICES];
} kgpu_shim_limits;

/*
 * Parses `len` bytes of `text` (not NUL-terminated; NUL bytes are refused).
 * `name` only labels messages ("/etc/kgpu/limits:3: memory_mib: ..."). The
 * first line must be "# kgpu limits v1"; then blank lines, '#' comments and
 * lines "device <i> key=value ...", numbered 0, 1, ... in order, each with
 * uuid= and memory_mib= and optionally core_pct= and core_limit_pct= (not
 * below core_pct); other keys are ignored so
 * a newer plugin may add some. Returns KGPU_OK, or KGPU_EPARSE/KGPU_ERANGE
 * with `err` naming the line and field; *out is then zeroed.
 */
int kgpu_shim_limits_parse(const char *text, size_t len, const char *name, kgpu_shim_limits *out,
                           kgpu_error *err);

/*
 * Writes `lim` in the file's format into buf (always NUL-terminated when
 * size > 0). Returns the length it needed, as snprintf does.
 */
size_t kgpu_shim_limits_format(const kgpu_shim_limits *lim, char *buf, size_t size);

/* Index of the device whose uuid equals `uuid` (ASCII case-insensitive), or -1. */
int kgpu_shim_limits_find(const kgpu_shim_limits *lim, const char *uuid);

#endif
