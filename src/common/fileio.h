/*
 * Files for every component: reading a whole file once (trace CSVs, YAML
 * configuration and cluster files, PEM certificates), and removing a tree
 * that a tenant's container could write into.
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

/*
 * Removes the directory `path` and everything below it, as root may do on a
 * node where a container still writes into the tree: every step goes through
 * directory descriptors (openat with O_NOFOLLOW, unlinkat), so an entry a
 * container swaps for a symlink is removed as the link, never followed;
 * nothing on another filesystem (a mount) is entered or removed; at most
 * KGPU_REMOVE_DEPTH levels. `path` itself must be a directory, not a
 * symlink (KGPU_EINVAL). A path that does not exist is already removed (0).
 * Errors name the path and the system's reason; what could be removed is.
 */
#define KGPU_REMOVE_DEPTH 32
int kgpu_remove_tree(const char *path, kgpu_error *err);

#endif
