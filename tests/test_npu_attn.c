/*
 * test_npu_attn.c -- the tiled attention kernel (npu.h,
 * npu_attention_tiled_mode, npu/npu_attn_fast.c) against
 * npu_attention_ref in each of its modes: FP32 (AVX-512), BF16 and
 * BF16X3 (AMX; on a machine without AMX they fall back to FP32 and the
 * tests still hold). Shapes around the block sizes (64 keys, 64 query
 * rows, 16-row tiles), Tq < Tk prefixes, causal or not, key_mask holes
 * (queries that see no key get zeros), GQA ratios 1, 2, 4, head_dim 40
 * .. 256, and one run at d3-nano's shape (8/2 heads x 256, 2048 tokens).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

/* Tolerances per mode (max-norm relative to max |ref|): the bounds npu.h
 * documents. bf16 keeps 8 bits of mantissa (2^-9 relative rounding of
 * q, k, v and p). */
static const struct {
    npu_attn_mode_t mode;
    const char     *name;
    double          tol;
} k_modes[] = {
    {NPU_ATTN_FP32, "fp32", 1e-4},
    {NPU_ATTN_BF16, "bf16", 1.5e-2},
    {NPU_ATTN_BF16X3, "bf16x3", 1e-4},
};
#define N_MODES (sizeof k_modes / sizeof k_modes[0])

/* Largest error seen per mode in this test (each Test is its own process). */
static double g_worst[N_MODES];

/* Key masks: none; every third key out and the first 20 (so that early
 * queries of a causal run see no key at all); two whole key blocks out
 * (64 .. 191: blocks nobody sees are skipped) plus key 0. */
enum { HOLES_NONE, HOLES_SPARSE, HOLES_BLOCKS };

static uint8_t *make_mask(size_t Tk, int holes) {
    if (holes == HOLES_NONE)
        return NULL;
    uint8_t *mask = malloc(Tk);
    cr_assert(mask);
    for (size_t j = 0; j < Tk; j++)
        mask[j] = holes == HOLES_SPARSE ? (j % 3 != 1) && j >= 20 : !(j >= 64 && j < 192) && j;
    return mask;
}

/* The reference once, then every mode against it. */
static void check(rng_t *r, size_t Tq, size_t Tk, size_t H, size_t Hkv, size_t D, bool causal,
                  int holes) {
    float   *q = rand_vec(r, Tq * H * D, -2, 2), *k = rand_vec(r, Tk * Hkv * D, -2, 2);
    float   *v = rand_vec(r, Tk * Hkv * D, -1, 1), *ref = nans(Tq * H * D);
    uint8_t *mask = make_mask(Tk, holes);
    cr_assert_eq(npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, ref), SVC_OK);
    for (size_t m = 0; m < N_MODES; m++) {
        float *a = nans(Tq * H * D);
        cr_assert_eq(
            npu_attention_tiled_mode(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, a, k_modes[m].mode),
            SVC_OK);
        double e = rel_err(a, ref, Tq * H * D);
        if (e > g_worst[m])
            g_worst[m] = e;
        cr_expect(e <= k_modes[m].tol,
                  "%s Tq=%zu Tk=%zu H=%zu/%zu D=%zu causal=%d holes=%d: rel err %g",
                  k_modes[m].name, Tq, Tk, H, Hkv, D, causal, holes, e);
        /* Exactly where the reference has zeros (a query that sees no
         * key), so must the kernel. */
        for (size_t i = 0; i < Tq * H * D; i++)
            if (ref[i] == 0.0f && a[i] != 0.0f) {
                cr_expect(0, "%s: out[%zu] = %g where the reference has 0", k_modes[m].name, i,
                          (double)a[i]);
                break;
            }
        free(a);
    }
    free(q), free(k), free(v), free(ref), free(mask);
}

static void report_worst(const char *what) {
    for (size_t m = 0; m < N_MODES; m++)
        cr_log_info("%s: worst rel err %s %.3g", what, k_modes[m].name, g_worst[m]);
}

static const size_t k_Ds[] = {48, 64, 128, 256, 40, 100};
static const size_t k_Hs[][2] = {{2, 2}, {4, 2}, {8, 2}};

/* Tq = Tk around the tile and block edges, and short prefixes. */
Test(npu_attn, shapes_small) {
    rng_t        r = {2024};
    const size_t Ts[] = {1, 15, 16, 17, 100};
    for (size_t di = 0; di < sizeof k_Ds / sizeof k_Ds[0]; di++)
        for (size_t hi = 0; hi < sizeof k_Hs / sizeof k_Hs[0]; hi++)
            for (int causal = 0; causal < 2; causal++)
                for (int holes = HOLES_NONE; holes <= HOLES_SPARSE; holes++) {
                    size_t H = k_Hs[hi][0], Hkv = k_Hs[hi][1], D = k_Ds[di];
                    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                        check(&r, Ts[ti], Ts[ti], H, Hkv, D, causal, holes);
                    check(&r, 5, 70, H, Hkv, D, causal, holes); /* Tq < Tk: a prefix */
                }
    report_worst("shapes_small");
}

/* 300 tokens (several key blocks, a partial last one; 4.7 .. 19 query
 * blocks) and a prefix of 267 before 33 queries, every mask. */
Test(npu_attn, shapes_300) {
    rng_t        r = {77};
    const size_t Ds[] = {40, 128, 256};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (size_t hi = 0; hi < sizeof k_Hs / sizeof k_Hs[0]; hi++)
            for (int causal = 0; causal < 2; causal++)
                for (int holes = HOLES_NONE; holes <= HOLES_BLOCKS; holes++) {
                    size_t H = k_Hs[hi][0], Hkv = k_Hs[hi][1], D = Ds[di];
                    check(&r, 300, 300, H, Hkv, D, causal, holes);
                    check(&r, 33, 300, H, Hkv, D, causal, holes);
                }
    report_worst("shapes_300");
}

/* Every key masked out: all zeros, no NaN (0/0), in every mode. */
Test(npu_attn, no_key_zeros) {
    rng_t   r = {5};
    size_t  T = 40, H = 4, Hkv = 2, D = 64;
    float  *q = rand_vec(&r, T * H * D, -1, 1), *k = rand_vec(&r, T * Hkv * D, -1, 1);
    float  *v = rand_vec(&r, T * Hkv * D, -1, 1);
    uint8_t mask[40] = {0};
    for (int causal = 0; causal < 2; causal++)
        for (size_t m = 0; m < N_MODES; m++) {
            float *o = nans(T * H * D);
            cr_assert_eq(npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, causal, mask, o,
                                                  k_modes[m].mode),
                         SVC_OK);
            for (size_t i = 0; i < T * H * D; i++)
                if (o[i] != 0.0f) {
                    cr_expect(0, "%s causal=%d: out[%zu] = %g", k_modes[m].name, causal, i,
                              (double)o[i]);
                    break;
                }
            free(o);
        }
    free(q), free(k), free(v);
}

/* One visible key: out = that key's value row (softmax of one score is 1),
 * to bf16 rounding in the BF16 mode. */
Test(npu_attn, one_key_is_v) {
    rng_t   r = {8};
    size_t  T = 70, H = 2, Hkv = 1, D = 48;
    float  *q = rand_vec(&r, T * H * D, -1, 1), *k = rand_vec(&r, T * Hkv * D, -1, 1);
    float  *v = rand_vec(&r, T * Hkv * D, -1, 1), *o = nans(T * H * D);
    uint8_t mask[70] = {0};
    mask[66] = 1;
    for (size_t m = 0; m < N_MODES; m++) {
        cr_assert_eq(
            npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, false, mask, o, k_modes[m].mode),
            SVC_OK);
        for (size_t i = 0; i < T * H; i++)
            for (size_t d = 0; d < D; d++)
                cr_assert_float_eq(o[i * D + d], v[66 * D + d], 4e-3, "%s", k_modes[m].name);
    }
    free(q), free(k), free(v), free(o);
}

/* npu_attention_tiled is the BF16 mode (bit-identical). */
Test(npu_attn, default_is_bf16) {
    rng_t  r = {9};
    size_t T = 50, H = 8, Hkv = 2, D = 256;
    float *q = rand_vec(&r, T * H * D, -2, 2), *k = rand_vec(&r, T * Hkv * D, -2, 2);
    float *v = rand_vec(&r, T * Hkv * D, -1, 1), *a = nans(T * H * D), *b = nans(T * H * D);
    cr_assert_eq(npu_attention_tiled(q, k, v, T, T, H, Hkv, D, true, NULL, a), SVC_OK);
    cr_assert_eq(npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, true, NULL, b, NPU_ATTN_BF16),
                 SVC_OK);
    cr_expect(memcmp(a, b, T * H * D * sizeof *a) == 0);
    free(q), free(k), free(v), free(a), free(b);
}

/* d3-nano's full-attention shape at 2048 tokens, non-causal (the prompt
 * case), against the reference once. */
Test(npu_attn, model_shape_2048, .timeout = 600) {
    rng_t r = {31};
    check(&r, 2048, 2048, 8, 2, 256, false, HOLES_NONE);
    report_worst("model_shape_2048");
}
