/*
 * xoshiro256** seeded through splitmix64: fast, small state, good enough
 * statistics for sampling workloads and breaking ties. Not for secrets.
 */
#include "kgpu/rng.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void kgpu_rng_seed(kgpu_rng *rng, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL);
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kgpu_rng_next(kgpu_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t kgpu_rng_below(kgpu_rng *rng, uint64_t n)
{
    /* Lemire's multiply-shift with rejection of the biased low zone. */
    uint64_t x = kgpu_rng_next(rng);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t l = (uint64_t)m;
    if (l < n) {
        uint64_t t = -n % n;
        while (l < t) {
            x = kgpu_rng_next(rng);
            m = (__uint128_t)x * n;
            l = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double kgpu_rng_double(kgpu_rng *rng)
{
    return (double)(kgpu_rng_next(rng) >> 11) * 0x1.0p-53;
}
