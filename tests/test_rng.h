/*
 * test_rng.h -- reproducible random inputs for the kernel tests
 * (test_npu_*.c), and the checks they share: NaN-filled outputs, the
 * max-norm relative error, a matmul against the reference and by hand.
 */
#ifndef D3_TEST_RNG_H
#define D3_TEST_RNG_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "npu.h"

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

/* cos(a, b) in double; 1 for two zero vectors, 0 for one. */
static inline double vec_cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa && bb ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

/* An unpacked matmul (npu.h: out (T, N) = x (T, K) w^T) against
 * npu_matmul_ref on random inputs, to 1e-5 relative; name labels it. */
typedef void (*test_mm_fn)(const float *x, const float *w, size_t T, size_t K, size_t N,
                           float *out);

static inline void expect_mm_like_ref(rng_t *r, test_mm_fn mm, const char *name, size_t T, size_t K,
                                      size_t N) {
    float *x = rand_vec(r, T * K, -1, 1), *w = rand_vec(r, N * K, -1, 1);
    float *a = nans(T * N), *b = nans(T * N);
    mm(x, w, T, K, N, a);
    npu_matmul_ref(x, w, T, K, N, b);
    double e = rel_err(a, b, T * N);
    cr_expect(e <= 1e-5, "%s T=%zu K=%zu N=%zu: rel err %g", name, T, K, N, e);
    free(x), free(w), free(a), free(b);
}

/* A hand case that catches a transposed w or a swapped row and column. */
static inline void expect_mm_hand(test_mm_fn mm) {
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    const float w[2 * 3] = {1, 0, 0, 0, 1, 1}; /* out[t] = (x0, x1 + x2) */
    float       out[4];
    mm(x, w, 2, 3, 2, out);
    cr_expect_float_eq(out[0], 1.0f, 1e-6);
    cr_expect_float_eq(out[1], 5.0f, 1e-6);
    cr_expect_float_eq(out[2], 4.0f, 1e-6);
    cr_expect_float_eq(out[3], 11.0f, 1e-6);
}

#endif
