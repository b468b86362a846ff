/*
 * Fuzz target for the limits file that libkgpu-limit.so reads in every GPU
 * container. Whatever it accepts must be a usable set of limits (1 to 16
 * devices with distinct, printable UUIDs and sane sizes) that formats back
 * into a file parsing to the same limits; whatever it refuses must come
 * back empty with a reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shimlimits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kgpu_shim_limits lim, back;
    kgpu_error err = {0};
    if (kgpu_shim_limits_parse((const char *)data, size, "fuzz", &lim, &err) != KGPU_OK) {
        if (lim.ndevices != 0 || err.msg[0] == '\0' || strncmp(err.msg, "fuzz:", 5) != 0)
            abort();
        return 0;
    }
    if (lim.ndevices < 1 || lim.ndevices > KGPU_SHIM_MAX_DEVICES)
        abort();
    for (int i = 0; i < lim.ndevices; i++) {
        const kgpu_shim_device_limit *d = &lim.dev[i];
        size_t n = strnlen(d->uuid, sizeof(d->uuid));
        if (n == 0 || n == sizeof(d->uuid) || d->memory_mib > KGPU_SHIM_MAX_MEMORY_MIB ||
            d->core_pct < -1 || d->core_pct > 100 || d->core_limit_pct < -1 ||
            d->core_limit_pct > 100 || (d->core_limit_pct >= 0 && d->core_limit_pct < d->core_pct) ||
            kgpu_shim_limits_find(&lim, d->uuid) != i)
            abort();
        for (size_t k = 0; k < n; k++)
            if (d->uuid[k] <= ' ' || d->uuid[k] > '~')
                abort();
    }
    char buf[KGPU_SHIM_MAX_DEVICES * 160 + 32];
    size_t len = kgpu_shim_limits_format(&lim, buf, sizeof(buf));
    if (len >= sizeof(buf) || kgpu_shim_limits_parse(buf, len, "again", &back, &err) != KGPU_OK ||
        memcmp(&lim, &back, sizeof(lim)) != 0)
        abort();
    return 0;
}
