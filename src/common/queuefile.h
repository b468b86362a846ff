/*
 * The `queues:` section of the extender's configuration file (YAML or JSON),
 * read into a kgpu_queues tree. The simulator's --queues reads it today; the
 * extender is to read the same section (it does not yet), so that what was
 * measured is what it enforces. Format and rules: docs/queues.md.
 */
#ifndef KGPU_QUEUEFILE_H
#define KGPU_QUEUEFILE_H

#include <jansson.h>
#include <stddef.h>

#include "kgpu/queue.h"

/*
 * Builds the tree from a parsed document's `queues` member. *out is NULL
 * (and 0 returned) when the document has no `queues`. Errors name the file
 * and the field: "q.yaml: queues[2] (team-a): limit.gpu: expected GPUs as a
 * number (4, 0.5) or milli (\"500m\")".
 */
int kgpu_queues_from_json(const json_t *root, const char *file, kgpu_queues **out,
                          kgpu_error *err);

/* Parses buf[0..len) (YAML or JSON) and builds the tree, as above. */
int kgpu_queues_load(const char *buf, size_t len, const char *file, kgpu_queues **out,
                     kgpu_error *err);

/* Reads the file, as above. */
int kgpu_queues_load_file(const char *path, kgpu_queues **out, kgpu_error *err);

#endif
