/*
 * npu_vision.c -- the kernels only the vision tower needs (Qwen3_5VisionModel):
 * LayerNorm with bias, the two GELUs (tanh approximation in the blocks'
 * MLP, erf in the merger), bias rows and the half-split rotary of
 * apply_rotary_pos_emb_vision. The text tower's kernels (npu_fast.c) do
 * the projections and the attention.
 *
 * LayerNorm and GELU-erf are plain C (cheap next to the matmuls: one pass
 * over (N, D)); GELU-tanh runs over (N, 4 * D) per block, 24 times per
 * image, so it has an AVX-512 path written as x * sigmoid(2u) -- the same
 * function as 0.5 x (1 + tanh u), to rounding -- on the vectorised exp.
 */
#include "npu.h"

#include <math.h>

/* Rows per npu_parallel_for item: big enough to amortise the dispatch. */
#define ROWS_PER_ITEM 64

typedef struct ln_job {
    const float *x, *w, *b;
    size_t       T, D;
    float        eps;
    float       *out;
} ln_job_t;

/* torch's LayerNorm: biased variance, (x - mean) * rsqrt(var + eps) * w + b;
 * sums in double so the result is the correctly rounded one in practice. */
static void ln_rows(void *ctx, size_t item) {
    const ln_job_t *j = ctx;
    size_t          t1 = (item + 1) * ROWS_PER_ITEM < j->T ? (item + 1) * ROWS_PER_ITEM : j->T;
    for (size_t t = item * ROWS_PER_ITEM; t < t1; t++) {
        const float *xr = j->x + t * j->D;
        float       *yr = j->out + t * j->D;
        double       s = 0.0, ss = 0.0;
        for (size_t d = 0; d < j->D; d++)
            s += xr[d];
        double mean = s / (double)j->D;
        for (size_t d = 0; d < j->D; d++) {
            double c = xr[d] - mean;
            ss += c * c;
        }
        double inv = 1.0 / sqrt(ss / (double)j->D + (double)j->eps);
        for (size_t d = 0; d < j->D; d++)
            yr[d] = (float)(((double)xr[d] - mean) * inv * j->w[d] + j->b[d]);
    }
}

void npu_layernorm(const float *x, const float *w, const float *b, size_t T, size_t D, float eps,
                   float *out) {
    SVC_ASSERT(D > 0);
    ln_job_t j = {x, w, b, T, D, eps, out};
    npu_parallel_for((T + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM, ln_rows, &j);
}

void npu_add_bias(float *x, const float *b, size_t T, size_t N) {
    for (size_t t = 0; t < T; t++) {
        float *r = x + t * N;
        for (size_t i = 0; i < N; i++)
            r[i] += b[i];
    }
}

/* F.gelu(x, approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static float gelu_tanh1(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

/* F.gelu(x): 0.5 x (1 + erf(x / sqrt 2)). */
void npu_gelu_erf(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] * 0.70710678118654752)));
}

void npu_rope_half(float *x, const float *cos_t, const float *sin_t, size_t T, size_t H, size_t D) {
    size_t h2 = D / 2;
    SVC_ASSERT(D % 2 == 0);
    for (size_t t = 0; t < T; t++) {
        const float *c = cos_t + t * D, *s = sin_t + t * D;
        for (size_t hh = 0; hh < H; hh++) {
            float *r = x + (t * H + hh) * D;
            for (size_t i = 0; i < h2; i++) {
                float a = r[i], bb = r[i + h2];
                /* rotate_half(x) = [-x2, x1] */
                r[i] = a * c[i] - bb * s[i];
                r[i + h2] = bb * c[i + h2] + a * s[i + h2];
            }
        }
    }
}

/* ---- GELU-tanh on AVX-512 ------------------------------------------------ */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))),    \
                             apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

#include "npu_vec_int.h"

/* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)); exp saturates to +inf for very
 * negative x, giving -0 as the exact value rounds to. */
static void gelu_tanh_avx512(float *x, size_t n) {
    const __m512 k0 = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
    const __m512 k1 = _mm512_set1_ps(0.044715f);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = npu_mask16(n - i);
        __m512    v = _mm512_maskz_loadu_ps(m, x + i);
        __m512    v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
        __m512    u = _mm512_mul_ps(k0, _mm512_fmadd_ps(k1, v3, v));
        __m512    e = npu_exp512(u);
        _mm512_mask_storeu_ps(x + i, m, _mm512_div_ps(v, _mm512_add_ps(one, e)));
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

typedef struct gelu_job {
    float *x;
    size_t n;
    bool   vec;
} gelu_job_t;

#define GELU_PER_ITEM 65536

static void gelu_part(void *ctx, size_t item) {
    const gelu_job_t *j = ctx;
    size_t            i0 = item * GELU_PER_ITEM;
    size_t            n = j->n - i0 < GELU_PER_ITEM ? j->n - i0 : GELU_PER_ITEM;
    if (j->vec) {
        gelu_tanh_avx512(j->x + i0, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        j->x[i0 + i] = gelu_tanh1(j->x[i0 + i]);
}

void npu_gelu_tanh(float *x, size_t n) {
    /* the AVX-512 kernels are picked only where the CPU has them */
    gelu_job_t j = {x, n, strcmp(npu_kernels_name(), "avx512") == 0};
    npu_parallel_for((n + GELU_PER_ITEM - 1) / GELU_PER_ITEM, gelu_part, &j);
}
