/*
 * Fuzz target for the watcher's config file (dp_watch_config_parse). What
 * it accepts is within the documented ranges; what it refuses leaves the
 * defaults and says why, naming the file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "watcher.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dp_watch_config c, def;
    dp_watch_config_defaults(&def);
    kgpu_error err = {0};
    int rc = dp_watch_config_parse((const char *)data, size, "fuzz", &c, &err);
    if (rc != KGPU_OK) {
        if (err.msg[0] == '\0' || strstr(err.msg, "fuzz") == NULL ||
            memcmp(&c, &def, sizeof(c)) != 0)
            abort();
        return 0;
    }
    if (!(c.interval_s >= 0.1 && c.interval_s <= 3600) ||
        (c.enforce != DP_ENFORCE_NONE && c.enforce != DP_ENFORCE_KILL) ||
        c.memory_slack_mib < 0 || c.memory_slack_mib > (1LL << 30) || c.core_slack_pct < 0 ||
        c.core_slack_pct > 100 || c.core_grace_scans < 1 || c.core_grace_scans > 1000 ||
        c.proc_root[0] != '/' || strnlen(c.listen, sizeof(c.listen)) == sizeof(c.listen) ||
        strnlen(c.proc_root, sizeof(c.proc_root)) == sizeof(c.proc_root))
        abort();
    return 0;
}
