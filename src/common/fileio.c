/*
 * One whole-file reader with a size bound and errors that name the path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

int kgpu_read_file_max(const char *path, size_t max, char **buf, size_t *len, kgpu_error *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kgpu_error_set(err, KGPU_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    int rc = 0;
    while (b != NULL) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap)
            break;
        if (cap > max) {
            rc = kgpu_error_set(err, KGPU_ERANGE, "%s is larger than %zu bytes", path, max);
            break;
        }
        char *g = realloc(b, cap * 2 + 1);
        if (g == NULL) {
            free(b);
            b = NULL;
            break;
        }
        b = g;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (b == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory reading %s", path);
    if (rc == 0 && n > max)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s is larger than %zu bytes", path, max);
    if (rc == 0 && bad)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot read %s: %s", path, strerror(errno));
    if (rc != 0) {
        free(b);
        return rc;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}
