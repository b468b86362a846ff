/*
 * Fuzz target for /proc/<pid>/cgroup as the watcher reads it
 * (dp_cgroup_parse). Whatever it accepts names a pod UID of 32 or 36
 * characters and a 64-digit container ID, both lower-case, that occur in the
 * input (modulo case and the systemd driver's '_'); whatever it refuses
 * comes back zeroed with a reason.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "watcher.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether `needle` occurs in data, comparing case-insensitively and '_' as '-'. */
static int occurs(const uint8_t *data, size_t size, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= size; i++) {
        size_t k = 0;
        for (; k < n; k++) {
            int c = tolower(data[i + k]);
            if (c == '_')
                c = '-';
            if (c != needle[k])
                break;
        }
        if (k == n)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dp_cgroup_id id;
    kgpu_error err = {0};
    int rc = dp_cgroup_parse((const char *)data, size, &id, &err);
    if (rc != KGPU_OK) {
        if ((rc != KGPU_ENOENT && rc != KGPU_EPARSE) || err.msg[0] == '\0' ||
            id.pod_uid[0] != '\0' || id.container_id[0] != '\0')
            abort();
        return 0;
    }
    size_t u = strnlen(id.pod_uid, sizeof(id.pod_uid));
    size_t c = strnlen(id.container_id, sizeof(id.container_id));
    if ((u != 32 && u != 36) || c != 64)
        abort();
    for (size_t i = 0; i < u; i++) {
        char ch = id.pod_uid[i];
        if (!(isdigit((unsigned char)ch) || (ch >= 'a' && ch <= 'f') || (u == 36 && ch == '-')))
            abort();
    }
    for (size_t i = 0; i < c; i++)
        if (!(isdigit((unsigned char)id.container_id[i]) ||
              (id.container_id[i] >= 'a' && id.container_id[i] <= 'f')))
            abort();
    if (!occurs(data, size, id.pod_uid) || !occurs(data, size, id.container_id))
        abort();
    return 0;
}
