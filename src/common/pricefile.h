/*
 * The prices file of `kgpu simulate --autoscale` (YAML or JSON): per GPU
 * model and capacity type the price of a GPU-hour, optionally of a
 * CPU core-hour. Format: docs/autoscaling.md; example: examples/prices.yaml.
 */
#ifndef KGPU_PRICEFILE_H
#define KGPU_PRICEFILE_H

#include <stddef.h>

#include "kgpu/autoscale.h"

/*
 * Parses buf[0..len) into *out. Errors name the file and the field:
 * "p.yaml: prices.gpu.T4.spot: expected a price, a number >= 0".
 */
int kgpu_prices_load(const char *buf, size_t len, const char *file, kgpu_prices *out,
                     kgpu_error *err);

/* Reads the file, as above. */
int kgpu_prices_load_file(const char *path, kgpu_prices *out, kgpu_error *err);

#endif
