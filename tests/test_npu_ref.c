/*
 * test_npu_ref.c -- the scalar reference kernels (npu_ref.c,
 * npu_ref_delta.c): each against a direct formula written here, small
 * hand-computed cases, and the two forms of the delta rule and of attention
 * against each other. Inputs are random from a fixed seed, so a failure
 * reproduces.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

static float *zeros(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    cr_assert(p);
    return p;
}

/* max|a - b| / max|b| (max-norm relative error); b all zero -> max|a|. */
static double rel_err_max(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num || isnan(d))
            num = isnan(d) ? INFINITY : d;
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return den > 0.0 ? num / den : num;
}

static double silu(double x) {
    return x / (1.0 + exp(-x));
}

/* ---- norms and activations ---------------------------------------------- */

Test(npu_ref, rmsnorm_hand) {
    const float x[4] = {1, 2, 3, 4};
    const float w[4] = {0, 1, -0.5f, 2};
    float       out[4];
    /* mean(x^2) = 30 / 4 = 7.5; with 1 + w the factors are 1, 2, 0.5, 3. */
    npu_rmsnorm_ref(x, w, 1, 4, 0.0f, out, true);
    double       inv = 1.0 / sqrt(7.5);
    const double want[4] = {1 * inv * 1, 2 * inv * 2, 3 * inv * 0.5, 4 * inv * 3};
    for (int i = 0; i < 4; i++)
        cr_expect_float_eq(out[i], (float)want[i], 1e-6, "i=%d", i);
    /* eps sits inside the root: [1e-3] -> 1e-3 / sqrt(1e-6 + 1e-6). */
    const float tiny = 1e-3f, one = 0.0f;
    float       o;
    npu_rmsnorm_ref(&tiny, &one, 1, 1, 1e-6f, &o, true);
    cr_expect_float_eq(o, (float)(1e-3 / sqrt(2e-6)), 1e-6);
    /* Plain weight: factor w itself. */
    npu_rmsnorm_ref(x, w, 1, 4, 0.0f, out, false);
    cr_expect_float_eq(out[0], 0.0f, 1e-7);
    cr_expect_float_eq(out[3], (float)(4 * inv * 2), 1e-6);
}

Test(npu_ref, rmsnorm_random_and_in_place) {
    rng_t  r = {0x1234};
    size_t T = 7, D = 96;
    float *x = rand_vec(&r, T * D, -3, 3), *w = rand_vec(&r, D, -1, 1), *out = zeros(T * D);
    float *want = zeros(T * D);
    float  eps = 1e-6f;
    for (size_t t = 0; t < T; t++) {
        double ss = 0;
        for (size_t d = 0; d < D; d++)
            ss += (double)x[t * D + d] * x[t * D + d];
        double inv = 1.0 / sqrt(ss / D + eps);
        for (size_t d = 0; d < D; d++)
            want[t * D + d] = (float)(x[t * D + d] * inv * (1.0 + w[d]));
    }
    npu_rmsnorm_ref(x, w, T, D, eps, out, true);
    cr_expect_lt(rel_err_max(out, want, T * D), 1e-6);
    npu_rmsnorm_ref(x, w, T, D, eps, x, true); /* in place */
    cr_expect_lt(rel_err_max(x, want, T * D), 1e-6);
    free(x), free(w), free(out), free(want);
}

Test(npu_ref, rmsnorm_gated) {
    rng_t  r = {0x77};
    size_t T = 5, D = 128;
    float *x = rand_vec(&r, T * D, -2, 2), *z = rand_vec(&r, T * D, -4, 4);
    float *w = rand_vec(&r, D, 0.5f, 1.5f), *out = zeros(T * D), *want = zeros(T * D);
    float  eps = 1e-6f;
    for (size_t t = 0; t < T; t++) {
        double ss = 0;
        for (size_t d = 0; d < D; d++)
            ss += (double)x[t * D + d] * x[t * D + d];
        double inv = 1.0 / sqrt(ss / D + eps);
        for (size_t d = 0; d < D; d++)
            want[t * D + d] = (float)(x[t * D + d] * inv * w[d] * silu(z[t * D + d]));
    }
    npu_rmsnorm_gated_ref(x, z, w, T, D, eps, out);
    cr_expect_lt(rel_err_max(out, want, T * D), 1e-6);
    /* Hand: z = 0 closes the gate (silu(0) = 0). */
    const float x1[2] = {3, 4}, z0[2] = {0, 0}, w1[2] = {1, 1};
    float       o1[2];
    npu_rmsnorm_gated_ref(x1, z0, w1, 1, 2, 0.0f, o1);
    cr_expect_float_eq(o1[0], 0.0f, 1e-7);
    cr_expect_float_eq(o1[1], 0.0f, 1e-7);
    free(x), free(z), free(w), free(out), free(want);
}

Test(npu_ref, l2norm) {
    const float x[4] = {3, 4, 0, 0};
    float       out[4];
    npu_l2norm_ref(x, 2, 2, 0.0f, out);
    cr_expect_float_eq(out[0], 0.6f, 1e-7);
    cr_expect_float_eq(out[1], 0.8f, 1e-7);
    npu_l2norm_ref(x + 2, 1, 2, 1e-6f, out + 2); /* eps keeps zeros finite */
    cr_expect_eq(out[2], 0.0f);
    /* eps is added to the sum of squares: [1e-3] -> 1e-3 / sqrt(1e-6 + 1e-6). */
    const float tiny = 1e-3f;
    float       o;
    npu_l2norm_ref(&tiny, 1, 1, 1e-6f, &o);
    cr_expect_float_eq(o, (float)(1e-3 / sqrt(2e-6)), 1e-6);
}

Test(npu_ref, silu_mul) {
    const float gate[3] = {0, 1, -2}, up[3] = {5, 2, 3};
    float       out[3];
    npu_silu_mul_ref(gate, up, 1, 3, out);
    cr_expect_eq(out[0], 0.0f);
    cr_expect_float_eq(out[1], (float)(2.0 / (1.0 + exp(-1.0))), 1e-6);
    cr_expect_float_eq(out[2], (float)(3.0 * -2.0 / (1.0 + exp(2.0))), 1e-6);
}

/* ---- matmul ------------------------------------------------------------- */

Test(npu_ref, matmul_hand) {
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    const float w[2 * 3] = {1, 0, -1, 0.5f, 0.5f, 0.5f};
    float       out[4];
    npu_matmul_ref(x, w, 2, 3, 2, out);
    cr_expect_float_eq(out[0], -2.0f, 1e-6);
    cr_expect_float_eq(out[1], 3.0f, 1e-6);
    cr_expect_float_eq(out[2], -2.0f, 1e-6);
    cr_expect_float_eq(out[3], 7.5f, 1e-6);
}

Test(npu_ref, matmul_random_and_bf16) {
    rng_t     r = {0xbeef};
    size_t    T = 9, K = 300, N = 37;
    float    *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float    *out = zeros(T * N), *want = zeros(T * N), *wr = zeros(N * K);
    uint16_t *wb = malloc(N * K * sizeof *wb);
    cr_assert(wb);
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < N; n++) {
            double a = 0;
            for (size_t i = 0; i < K; i++)
                a += (double)x[t * K + i] * w[n * K + i];
            want[t * N + n] = (float)a;
        }
    npu_matmul_ref(x, w, T, K, N, out);
    cr_expect_lt(rel_err_max(out, want, T * N), 1e-6);
    /* bf16 weights: the same as fp32 on the bf16-rounded weights. */
    for (size_t i = 0; i < N * K; i++) {
        wb[i] = npu_f32_to_bf16(w[i]);
        wr[i] = npu_bf16_to_f32(wb[i]);
        cr_assert_leq(fabsf(wr[i] - w[i]), fabsf(w[i]) * (1.0f / 256.0f));
    }
    npu_matmul_ref(x, wr, T, K, N, want);
    npu_matmul_bf16_ref(x, wb, T, K, N, out);
    cr_expect_lt(rel_err_max(out, want, T * N), 1e-7);
    free(x), free(w), free(out), free(want), free(wr), free(wb);
}

Test(npu_ref, bf16_rounding) {
    cr_expect_eq(npu_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(npu_f32_to_bf16(-2.0f), 0xc000);
    uint32_t u;
    float    f;
    u = 0x3f808000u; /* halfway between 0x3f80 and 0x3f81: ties to even */
    memcpy(&f, &u, 4);
    cr_expect_eq(npu_f32_to_bf16(f), 0x3f80);
    u = 0x3f818000u; /* halfway between 0x3f81 and 0x3f82: ties to even */
    memcpy(&f, &u, 4);
    cr_expect_eq(npu_f32_to_bf16(f), 0x3f82);
    u = 0x3f808001u; /* just above halfway: up */
    memcpy(&f, &u, 4);
    cr_expect_eq(npu_f32_to_bf16(f), 0x3f81);
    cr_expect(isnan(npu_bf16_to_f32(npu_f32_to_bf16(NAN))));
    cr_expect_eq(npu_bf16_to_f32(0x3fc0), 1.5f);
}

/* ---- rope --------------------------------------------------------------- */

Test(npu_ref, rope_hand_partial) {
    /* head_dim 6, rot_dim 4, theta 1e4: inv_freq = {1, 1e4^-0.5 = 0.01};
     * pairs (0, 2) and (1, 3) rotate, 4 and 5 pass through. */
    float         x[6] = {1, 2, 3, 4, 5, 6};
    const int32_t pos[1] = {1};
    npu_rope_ref(x, pos, 1, 1, 6, 4, 10000.0f);
    double c1 = cos(1.0), s1 = sin(1.0), c2 = cos(0.01), s2 = sin(0.01);
    cr_expect_float_eq(x[0], (float)(1 * c1 - 3 * s1), 1e-6);
    cr_expect_float_eq(x[2], (float)(3 * c1 + 1 * s1), 1e-6);
    cr_expect_float_eq(x[1], (float)(2 * c2 - 4 * s2), 1e-6);
    cr_expect_float_eq(x[3], (float)(4 * c2 + 2 * s2), 1e-6);
    cr_expect_eq(x[4], 5.0f);
    cr_expect_eq(x[5], 6.0f);
    /* Position 0 is the identity; every head of a token gets the same angles. */
    float         y[2 * 2 * 4];
    const int32_t p2[2] = {0, 3};
    for (int i = 0; i < 16; i++)
        y[i] = (float)(i % 4 + 1);
    npu_rope_ref(y, p2, 2, 2, 4, 4, 10000.0f);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(y[i], (float)(i % 4 + 1));
    for (int i = 0; i < 4; i++)
        cr_expect_eq(y[8 + i], y[12 + i]);
}

/* The angle that frequency i of a rotated unit vector got. */
static double rotated_angle(size_t i, size_t half, int32_t p_t, int32_t p_h, int32_t p_w,
                            const int sec[3], bool interleaved) {
    float   x[64] = {0};
    int32_t pos3[3] = {p_t, p_h, p_w};
    x[i] = 1.0f;
    npu_mrope_ref(x, pos3, 1, 1, 2 * half, 2 * half, 1e7f, sec, interleaved);
    return atan2(x[i + half], x[i]);
}

Test(npu_ref, mrope_sections) {
    const int sec[3] = {11, 11, 10};
    size_t    half = 32;
    for (size_t i = 0; i < half; i++) {
        double inv = 1.0 / pow(1e7, (double)(2 * i) / 64.0);
        /* Interleaved (Qwen3.5): H on i%3==1 below 33, W on i%3==2 below 30. */
        int32_t want_pos = 1;
        if (i % 3 == 1 && i < 33)
            want_pos = 2;
        else if (i % 3 == 2 && i < 30)
            want_pos = 3;
        double a = rotated_angle(i, half, 1, 2, 3, sec, true);
        cr_expect(fabs(a - want_pos * inv) < 1e-5 * want_pos * inv, "interleaved i=%zu", i);
        /* Not interleaved: T, H, W in contiguous sections. */
        want_pos = i < 11 ? 1 : i < 22 ? 2 : 3;
        a = rotated_angle(i, half, 1, 2, 3, sec, false);
        cr_expect(fabs(a - want_pos * inv) < 1e-5 * want_pos * inv, "sections i=%zu", i);
    }
    /* Unequal sections (10, 12, 10): height reaches i = 34, width i = 29. */
    const int sec2[3] = {10, 12, 10};
    for (size_t i = 0; i < half; i++) {
        double  inv = 1.0 / pow(1e7, (double)(2 * i) / 64.0);
        int32_t want_pos = (i % 3 == 1 && i < 36) ? 2 : (i % 3 == 2 && i < 30) ? 3 : 1;
        double  a = rotated_angle(i, half, 1, 2, 3, sec2, true);
        cr_expect(fabs(a - want_pos * inv) < 1e-5 * want_pos * inv, "sec2 i=%zu", i);
        want_pos = i < 10 ? 1 : i < 22 ? 2 : 3;
        a = rotated_angle(i, half, 1, 2, 3, sec2, false);
        cr_expect(fabs(a - want_pos * inv) < 1e-5 * want_pos * inv, "sec2 nI i=%zu", i);
    }
    cr_expect_eq(rotated_angle(31, half, 1, 2, 3, sec, true),
                 rotated_angle(31, half, 5, 2, 9, sec, true), "i=31 is height");
}

Test(npu_ref, mrope_text_equals_rope) {
    rng_t   r = {0x5eed};
    size_t  T = 40, H = 3, hd = 256, rot = 64;
    float  *a = rand_vec(&r, T * H * hd, -1, 1), *b = zeros(T * H * hd);
    int32_t pos[40], pos3[40 * 3];
    memcpy(b, a, T * H * hd * sizeof *a);
    for (size_t t = 0; t < T; t++) {
        pos[t] = (int32_t)(t * 97 + 3);
        pos3[t * 3] = pos3[t * 3 + 1] = pos3[t * 3 + 2] = pos[t];
    }
    const int sec[3] = {11, 11, 10};
    npu_rope_ref(a, pos, T, H, hd, rot, 1e7f);
    npu_mrope_ref(b, pos3, T, H, hd, rot, 1e7f, sec, true);
    cr_expect_eq(memcmp(a, b, T * H * hd * sizeof *a), 0);
    free(a), free(b);
}

/* ---- attention ---------------------------------------------------------- */

Test(npu_ref, attention_hand) {
    /* One head, head_dim 1, two tokens: q = k = 0 makes all scores equal. */
    const float q[2] = {0, 0}, k[2] = {0, 0}, v[2] = {2, 4};
    float       out[2];
    cr_assert_eq(npu_attention_ref(q, k, v, 2, 2, 1, 1, 1, true, NULL, out, NULL), SVC_OK);
    cr_expect_float_eq(out[0], 2.0f, 1e-6); /* sees only key 0 */
    cr_expect_float_eq(out[1], 3.0f, 1e-6); /* mean of both */
    cr_assert_eq(npu_attention_ref(q, k, v, 2, 2, 1, 1, 1, false, NULL, out, NULL), SVC_OK);
    cr_expect_float_eq(out[0], 3.0f, 1e-6);
    const uint8_t mask[2] = {0, 1};
    cr_assert_eq(npu_attention_ref(q, k, v, 2, 2, 1, 1, 1, true, mask, out, NULL), SVC_OK);
    cr_expect_eq(out[0], 0.0f); /* sees nothing: zeros */
    cr_expect_float_eq(out[1], 4.0f, 1e-6);
    /* One query after a prefix of two keys: it is position 2 of 3, so
     * causal it sees all three; q = k = 0 gives their mean. */
    const float q0 = 0, k3[3] = {0, 0, 0}, v3[3] = {1, 2, 6};
    cr_assert_eq(npu_attention_ref(&q0, k3, v3, 1, 3, 1, 1, 1, true, NULL, out, NULL), SVC_OK);
    cr_expect_float_eq(out[0], 3.0f, 1e-6);
    /* Two queries over three keys, causal: query 0 is position 1. */
    const float q2[2] = {0, 0};
    cr_assert_eq(npu_attention_ref(q2, k3, v3, 2, 3, 1, 1, 1, true, NULL, out, NULL), SVC_OK);
    cr_expect_float_eq(out[0], 1.5f, 1e-6);
    cr_expect_float_eq(out[1], 3.0f, 1e-6);
    /* Scores 1 * 1 / sqrt(1) vs 0: weights e/(1+e), 1/(1+e). */
    const float q1[2] = {1, 1}, k1[2] = {1, 0};
    cr_assert_eq(npu_attention_ref(q1, k1, v, 2, 2, 1, 1, 1, false, NULL, out, NULL), SVC_OK);
    double e = exp(1.0);
    cr_expect_float_eq(out[1], (float)((2 * e + 4) / (1 + e)), 1e-6);
}

static void attention_case(size_t Tq, size_t Tk, size_t nh, size_t nkv, size_t hd, bool causal,
                           bool masked, uint64_t seed) {
    rng_t    r = {seed};
    float   *q = rand_vec(&r, Tq * nh * hd, -2, 2), *k = rand_vec(&r, Tk * nkv * hd, -2, 2);
    float   *v = rand_vec(&r, Tk * nkv * hd, -1, 1);
    float   *o1 = zeros(Tq * nh * hd), *o2 = zeros(Tq * nh * hd);
    uint8_t *mask = NULL;
    if (masked) {
        mask = malloc(Tk);
        cr_assert(mask);
        for (size_t j = 0; j < Tk; j++)
            mask[j] = rng_uniform(&r, 0, 1) > 0.3f; /* ~30% padding, first key masked too */
        mask[0] = 0;
    }
    cr_assert_eq(npu_attention_ref(q, k, v, Tq, Tk, nh, nkv, hd, causal, mask, o1, NULL), SVC_OK);
    cr_assert_eq(npu_attention_naive(q, k, v, Tq, Tk, nh, nkv, hd, causal, mask, o2), SVC_OK);
    double err = rel_err_max(o1, o2, Tq * nh * hd);
    cr_expect_lt(err, 1e-6, "Tq=%zu Tk=%zu nh=%zu nkv=%zu causal=%d mask=%d: err %g", Tq, Tk, nh,
                 nkv, causal, masked, err);
    free(q), free(k), free(v), free(o1), free(o2), free(mask);
}

Test(npu_ref, attention_online_vs_naive) {
    const size_t Ts[] = {1, 5, 63, 64, 65, 129, 300};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        size_t T = Ts[i];
        attention_case(T, T, 2, 2, 32, true, false, 100 + T);  /* causal MHA */
        attention_case(T, T, 2, 2, 32, false, false, 200 + T); /* non-causal */
        attention_case(T, T, 8, 2, 16, true, false, 300 + T);  /* GQA */
        attention_case(T, T, 4, 1, 16, false, true, 400 + T);  /* padding, non-causal */
        attention_case(T, T, 4, 2, 16, true, true, 500 + T);   /* padding, causal */
    }
    /* Queries over a longer key prefix (shared prefix computed earlier). */
    attention_case(37, 300, 4, 2, 16, true, false, 601);
    attention_case(1, 300, 4, 2, 16, true, true, 602);
    attention_case(100, 130, 2, 1, 8, false, false, 603);
}

Test(npu_ref, attention_gqa_mapping) {
    /* Head h with 4 heads over 2 KV heads uses KV head h / 2: run each KV
     * head as plain MHA and compare. */
    rng_t  r = {42};
    size_t T = 20, hd = 8;
    float *q = rand_vec(&r, T * 4 * hd, -1, 1), *k = rand_vec(&r, T * 2 * hd, -1, 1);
    float *v = rand_vec(&r, T * 2 * hd, -1, 1), *o = zeros(T * 4 * hd);
    float *q1 = zeros(T * hd), *k1 = zeros(T * hd), *v1 = zeros(T * hd), *o1 = zeros(T * hd);
    cr_assert_eq(npu_attention_ref(q, k, v, T, T, 4, 2, hd, true, NULL, o, NULL), SVC_OK);
    for (size_t h = 0; h < 4; h++) {
        for (size_t t = 0; t < T; t++) {
            memcpy(q1 + t * hd, q + (t * 4 + h) * hd, hd * sizeof *q);
            memcpy(k1 + t * hd, k + (t * 2 + h / 2) * hd, hd * sizeof *k);
            memcpy(v1 + t * hd, v + (t * 2 + h / 2) * hd, hd * sizeof *v);
        }
        cr_assert_eq(npu_attention_ref(q1, k1, v1, T, T, 1, 1, hd, true, NULL, o1, NULL), SVC_OK);
        for (size_t t = 0; t < T; t++)
            cr_expect_eq(memcmp(o1 + t * hd, o + (t * 4 + h) * hd, hd * sizeof *o), 0, "h=%zu", h);
    }
    free(q), free(k), free(v), free(o), free(q1), free(k1), free(v1), free(o1);
}

/* ---- causal conv -------------------------------------------------------- */

Test(npu_ref, conv1d_hand) {
    /* One channel, K = 4, w = {1, 2, 3, 4}: an impulse at t = 0 comes out
     * as w reversed (w[3] multiplies the newest input). */
    const float w[4] = {1, 2, 3, 4}, x[5] = {1, 0, 0, 0, 0};
    float       out[5], st[3];
    npu_conv1d_causal_silu_ref(x, w, 5, 1, 4, NULL, st, out);
    const double pre[5] = {4, 3, 2, 1, 0};
    for (int t = 0; t < 5; t++)
        cr_expect_float_eq(out[t], (float)silu(pre[t]), 1e-6, "t=%d", t);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(st[i], 0.0f);
    /* With history {1, 0, 0} (oldest first) and x = {0}: 1 * w[0]. */
    const float hist[3] = {1, 0, 0}, x0 = 0;
    npu_conv1d_causal_silu_ref(&x0, w, 1, 1, 4, hist, st, out);
    cr_expect_float_eq(out[0], (float)silu(1.0), 1e-6);
    cr_expect_eq(st[0], 0.0f);
    cr_expect_eq(st[2], 0.0f);
}

Test(npu_ref, conv1d_random_and_split) {
    rng_t  r = {0xc0};
    size_t T = 50, C = 24, K = 4;
    float *x = rand_vec(&r, T * C, -2, 2), *w = rand_vec(&r, C * K, -1, 1);
    float *hist = rand_vec(&r, (K - 1) * C, -2, 2);
    float *out = zeros(T * C), *want = zeros(T * C), *st = zeros((K - 1) * C);
    /* Direct formula over (hist ++ x). */
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < C; c++) {
            double a = 0;
            for (size_t i = 0; i < K; i++) {
                long   tt = (long)t - (long)(K - 1) + (long)i;
                double xv = tt >= 0 ? x[(size_t)tt * C + c] : hist[(size_t)(tt + 3) * C + c];
                a += (double)w[c * K + i] * xv;
            }
            want[t * C + c] = (float)silu(a);
        }
    npu_conv1d_causal_silu_ref(x, w, T, C, K, hist, st, out);
    cr_expect_lt(rel_err_max(out, want, T * C), 1e-6);
    cr_expect_eq(memcmp(st, x + (T - 3) * C, 3 * C * sizeof *x), 0);
    /* In blocks of 1, 2, 17, 30 carrying the state in place: same output. */
    float       *s2 = zeros((K - 1) * C), *o2 = zeros(T * C);
    const size_t cut[] = {0, 1, 3, 20, 50};
    memcpy(s2, hist, (K - 1) * C * sizeof *s2);
    for (size_t b = 0; b + 1 < sizeof cut / sizeof cut[0]; b++)
        npu_conv1d_causal_silu_ref(x + cut[b] * C, w, cut[b + 1] - cut[b], C, K, s2, s2,
                                   o2 + cut[b] * C);
    cr_expect_eq(memcmp(o2, out, T * C * sizeof *out), 0);
    cr_expect_eq(memcmp(s2, st, 3 * C * sizeof *st), 0);
    free(x), free(w), free(hist), free(out), free(want), free(st), free(s2), free(o2);
}

/* ---- gated delta rule --------------------------------------------------- */

typedef struct delta_in {
    size_t T, nk, nv, dk, dv;
    float *q, *k, *v, *g, *beta, *s0;
} delta_in_t;

/* Inputs shaped like the model's: q, k L2-normalised, g = -A softplus(.)
 * spread over [-6, 0) with some near 0, beta in (0, 1). */
static delta_in_t delta_make(size_t T, size_t nk, size_t nv, size_t dk, size_t dv, uint64_t seed) {
    rng_t      r = {seed};
    delta_in_t d = {T, nk, nv, dk, dv, NULL, NULL, NULL, NULL, NULL, NULL};
    d.q = rand_vec(&r, T * nk * dk, -1, 1);
    d.k = rand_vec(&r, T * nk * dk, -1, 1);
    d.v = rand_vec(&r, T * nv * dv, -1, 1);
    d.g = rand_vec(&r, T * nv, 0, 1);
    d.beta = rand_vec(&r, T * nv, 0.05f, 0.95f);
    d.s0 = rand_vec(&r, nv * dk * dv, -0.5f, 0.5f);
    for (size_t i = 0; i < T * nv; i++)
        d.g[i] = d.g[i] < 0.3f ? -0.01f * d.g[i] : -6.0f * d.g[i] * d.g[i];
    npu_l2norm_ref(d.q, T * nk, dk, 1e-6f, d.q);
    npu_l2norm_ref(d.k, T * nk, dk, 1e-6f, d.k);
    return d;
}

static void delta_free(delta_in_t *d) {
    free(d->q), free(d->k), free(d->v), free(d->g), free(d->beta), free(d->s0);
}

Test(npu_ref, delta_hand) {
    /* dk = dv = 1, q = k = 1: S = e^g s0; S += beta (v - S); out = S. */
    const float q = 1, k = 1, v = 2, g = -0.5f, beta = 0.25f, s0 = 1;
    float       out, s1;
    cr_assert_eq(npu_delta_rule_recurrent_ref(&q, &k, &v, &g, &beta, 1, 1, 1, 1, 1, &s0, &s1, &out),
                 SVC_OK);
    double S = exp(-0.5);
    S += 0.25 * (2 - S);
    cr_expect_float_eq(s1, (float)S, 1e-6);
    cr_expect_float_eq(out, (float)S, 1e-6);
    cr_assert_eq(npu_delta_rule_chunked_ref(&q, &k, &v, &g, &beta, 1, 1, 1, 1, 1, &s0, &s1, &out),
                 SVC_OK);
    cr_expect_float_eq(out, (float)S, 1e-6);
}

/* The textbook form, in double: S_t = e^g (I - beta k k^T) S + beta k v^T,
 * out = S_t^T q / sqrt(dk), with GQA by repeat_interleave. */
static void delta_naive(const delta_in_t *d, float *out, float *s_out) {
    size_t  dk = d->dk, dv = d->dv, rep = d->nv / d->nk;
    double *S = malloc(dk * dv * sizeof *S), *N = malloc(dk * dv * sizeof *N);
    cr_assert(S && N);
    for (size_t h = 0; h < d->nv; h++) {
        for (size_t i = 0; i < dk * dv; i++)
            S[i] = d->s0[h * dk * dv + i];
        for (size_t t = 0; t < d->T; t++) {
            const float *k = d->k + (t * d->nk + h / rep) * dk;
            const float *q = d->q + (t * d->nk + h / rep) * dk;
            const float *v = d->v + (t * d->nv + h) * dv;
            double       b = d->beta[t * d->nv + h], e = exp(d->g[t * d->nv + h]);
            for (size_t a = 0; a < dk; a++)
                for (size_t c = 0; c < dv; c++) {
                    double m = 0; /* ((I - b k k^T) S)[a][c] */
                    for (size_t x = 0; x < dk; x++)
                        m += ((a == x ? 1.0 : 0.0) - b * k[a] * k[x]) * S[x * dv + c];
                    N[a * dv + c] = e * m + b * k[a] * v[c];
                }
            memcpy(S, N, dk * dv * sizeof *S);
            for (size_t c = 0; c < dv; c++) {
                double o = 0;
                for (size_t a = 0; a < dk; a++)
                    o += S[a * dv + c] * q[a];
                out[(t * d->nv + h) * dv + c] = (float)(o / sqrt((double)dk));
            }
        }
        for (size_t i = 0; i < dk * dv; i++)
            s_out[h * dk * dv + i] = (float)S[i];
    }
    free(S), free(N);
}

Test(npu_ref, delta_recurrent_vs_textbook) {
    delta_in_t d = delta_make(30, 2, 4, 16, 12, 0xd1);
    size_t     no = d.T * d.nv * d.dv, ns = d.nv * d.dk * d.dv;
    float     *o1 = zeros(no), *o2 = zeros(no), *s1 = zeros(ns), *s2 = zeros(ns);
    cr_assert_eq(npu_delta_rule_recurrent_ref(d.q, d.k, d.v, d.g, d.beta, d.T, d.nk, d.nv, d.dk,
                                              d.dv, d.s0, s1, o1),
                 SVC_OK);
    delta_naive(&d, o2, s2);
    cr_expect_lt(rel_err_max(o1, o2, no), 1e-6);
    cr_expect_lt(rel_err_max(s1, s2, ns), 1e-6);
    delta_free(&d), free(o1), free(o2), free(s1), free(s2);
}

Test(npu_ref, delta_chunked_vs_recurrent) {
    const size_t Ts[] = {1, 63, 64, 65, 200};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        for (int with_state = 0; with_state < 2; with_state++) {
            delta_in_t   d = delta_make(Ts[ti], 2, 4, 32, 24, 0xde17a + Ts[ti]);
            size_t       no = d.T * d.nv * d.dv, ns = d.nv * d.dk * d.dv;
            float       *o1 = zeros(no), *o2 = zeros(no), *s1 = zeros(ns), *s2 = zeros(ns);
            const float *s0 = with_state ? d.s0 : NULL;
            cr_assert_eq(npu_delta_rule_recurrent_ref(d.q, d.k, d.v, d.g, d.beta, d.T, d.nk, d.nv,
                                                      d.dk, d.dv, s0, s1, o1),
                         SVC_OK);
            cr_assert_eq(npu_delta_rule_chunked_ref(d.q, d.k, d.v, d.g, d.beta, d.T, d.nk, d.nv,
                                                    d.dk, d.dv, s0, s2, o2),
                         SVC_OK);
            double eo = rel_err_max(o2, o1, no), es = rel_err_max(s2, s1, ns);
            cr_expect_lt(eo, 1e-5, "T=%zu state=%d: out err %g", d.T, with_state, eo);
            cr_expect_lt(es, 1e-5, "T=%zu state=%d: state err %g", d.T, with_state, es);
            delta_free(&d), free(o1), free(o2), free(s1), free(s2);
        }
    }
}

Test(npu_ref, delta_state_carry_and_gqa) {
    /* Two calls of 70 + 60 tokens with the state carried in place equal
     * one call of 130. */
    delta_in_t d = delta_make(130, 1, 3, 16, 16, 0xca77);
    size_t     no = d.T * d.nv * d.dv, ns = d.nv * d.dk * d.dv;
    float     *o1 = zeros(no), *o2 = zeros(no), *s1 = zeros(ns), *s2 = zeros(ns);
    cr_assert_eq(
        npu_delta_rule_chunked_ref(d.q, d.k, d.v, d.g, d.beta, 130, 1, 3, 16, 16, d.s0, s1, o1),
        SVC_OK);
    memcpy(s2, d.s0, ns * sizeof *s2);
    cr_assert_eq(
        npu_delta_rule_chunked_ref(d.q, d.k, d.v, d.g, d.beta, 70, 1, 3, 16, 16, s2, s2, o2),
        SVC_OK);
    size_t off_k = 70 * 1 * 16, off_v = 70 * 3 * 16, off_g = 70 * 3;
    cr_assert_eq(npu_delta_rule_chunked_ref(d.q + off_k, d.k + off_k, d.v + off_v, d.g + off_g,
                                            d.beta + off_g, 60, 1, 3, 16, 16, s2, s2, o2 + off_v),
                 SVC_OK);
    cr_expect_lt(rel_err_max(o2, o1, no), 1e-5);
    cr_expect_lt(rel_err_max(s2, s1, ns), 1e-5);
    /* GQA: value head h of 3 over one key head equals a run of that head
     * alone with the same q, k. */
    float *v1 = zeros(d.T * 16), *g1 = zeros(d.T), *b1 = zeros(d.T), *oh = zeros(d.T * 16);
    for (size_t h = 0; h < 3; h++) {
        for (size_t t = 0; t < d.T; t++) {
            memcpy(v1 + t * 16, d.v + (t * 3 + h) * 16, 16 * sizeof *v1);
            g1[t] = d.g[t * 3 + h];
            b1[t] = d.beta[t * 3 + h];
        }
        cr_assert_eq(npu_delta_rule_recurrent_ref(d.q, d.k, v1, g1, b1, d.T, 1, 1, 16, 16,
                                                  d.s0 + h * 256, NULL, oh),
                     SVC_OK);
        float worst = 0;
        for (size_t t = 0; t < d.T; t++)
            for (size_t e = 0; e < 16; e++) {
                float df = fabsf(oh[t * 16 + e] - o1[(t * 3 + h) * 16 + e]);
                worst = df > worst ? df : worst;
            }
        cr_expect_lt(worst, 1e-5f, "h=%zu", h);
    }
    delta_free(&d), free(o1), free(o2), free(s1), free(s2), free(v1), free(g1), free(b1), free(oh);
}
