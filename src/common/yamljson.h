/*
 * YAML (and therefore JSON) documents read with libyaml into jansson values,
 * so configuration files and cluster files are walked with one API whatever
 * their syntax. Plain scalars become integers, reals, booleans or null when
 * they look like one (YAML 1.2 core schema); quoted scalars stay strings.
 */
#ifndef KGPU_YAMLJSON_H
#define KGPU_YAMLJSON_H

#include <jansson.h>
#include <stddef.h>

#include "kgpu/error.h"

/*
 * Parses the first document of buf[0..len). Returns a new reference, or NULL
 * with err naming `file`, the line and what is wrong. Anchors/aliases are
 * refused (they serve no purpose here and allow "billion laughs").
 */
json_t *kgpu_yaml_load(const char *buf, size_t len, const char *file, kgpu_error *err);

/* Reads and parses a file. */
json_t *kgpu_yaml_load_file(const char *path, kgpu_error *err);

#endif
