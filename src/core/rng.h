/* A small, fast, seedable random generator (SplitMix64) for initializers and shuffles. Its
 * state is one integer, so it can be saved in checkpoints. */
#ifndef DIST_CORE_RNG_H
#define DIST_CORE_RNG_H

#include <stdint.h>

typedef struct dist_rng {
    uint64_t state;
} dist_rng;

static inline uint64_t dist_rng_next(dist_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits. */
static inline float dist_rng_uniform(dist_rng *r) {
    return (float)(dist_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform integer in [0, n) without modulo bias. */
static inline uint64_t dist_rng_below(dist_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = dist_rng_next(r);
    while (x >= limit);
    return x % n;
}

/* A generator for stream `stream` of a seed: independent sequences per stream. */
static inline dist_rng dist_rng_stream(uint64_t seed, uint64_t stream) {
    dist_rng r = {seed ^ (stream * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL)};
    dist_rng_next(&r);
    return r;
}

#endif
