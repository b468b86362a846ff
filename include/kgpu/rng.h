/*
 * Seeded pseudo-random numbers for the scheduling core (xoshiro256**).
 * Every random choice in libkgpu draws from a kgpu_rng the caller owns, so a
 * run is reproducible from its seed and threads never share generator state.
 */
#ifndef KGPU_RNG_H
#define KGPU_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kgpu_rng {
    uint64_t s[4];
} kgpu_rng;

/* Seeds the generator; different `stream` values give independent sequences for one seed. */
void kgpu_rng_seed(kgpu_rng *rng, uint64_t seed, uint64_t stream);

uint64_t kgpu_rng_next(kgpu_rng *rng);

/* Uniform integer in [0, n); n must be > 0. Unbiased (rejection sampling). */
uint64_t kgpu_rng_below(kgpu_rng *rng, uint64_t n);

/* Uniform double in [0, 1). */
double kgpu_rng_double(kgpu_rng *rng);

#ifdef __cplusplus
}
#endif

#endif
