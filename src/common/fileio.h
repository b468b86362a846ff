/*
 * Reading whole files, once, for every component: trace CSVs, YAML
 * configuration and cluster files, PEM certificates.
 */
#ifndef KGPU_FILEIO_H
#define KGPU_FILEIO_H

#include <stddef.h>

#include "kgpu/error.h"

/*
 * Reads `path` into *buf (malloc'd, NUL-terminated; caller frees) and its
 * length into *len. Files larger than `max` bytes are refused (KGPU_ERANGE).
 * Errors name the path and the system's reason.
 */
int kgpu_read_file_max(const char *path, size_t max, char **buf, size_t *len, kgpu_error *err);

#endif
