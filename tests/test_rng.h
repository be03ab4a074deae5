/*
 * test_rng.h -- reproducible random inputs for the kernel tests
 * (test_npu_*.c), and the two checks they share: NaN-filled outputs and
 * the max-norm relative error.
 */
#ifndef D3_TEST_RNG_H
#define D3_TEST_RNG_H

#include <criterion/criterion.h>
#include <math.h>
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

/* A buffer filled with NaN, so an output the kernel forgot shows up. */
static inline float *nans(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert(p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

/* max|a - b| / max(max|b|, 1e-3); any NaN in a or b -> inf. */
static inline double rel_err(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 1e-3;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num)
            num = d;
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return num / den;
}

#endif
