/*
 * test_rng.h -- reproducible random inputs for the kernel tests
 * (test_npu_ref.c, test_npu_fast.c).
 */
#ifndef D3_TEST_RNG_H
#define D3_TEST_RNG_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

/* xorshift64*: reproducible across libcs, unlike rand(). */
typedef struct rng {
    uint64_t s;
} rng_t;

static inline float rng_uniform(rng_t *r, float lo, float hi) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    uint64_t x = r->s * 0x2545F4914F6CDD1DULL;
    double   u = (double)(x >> 11) / 9007199254740992.0; /* [0, 1) */
    return (float)(lo + (hi - lo) * u);
}

static inline float *rand_vec(rng_t *r, size_t n, float lo, float hi) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rng_uniform(r, lo, hi);
    return p;
}

#endif
