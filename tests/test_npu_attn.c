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
    cr_assert_eq(npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, ref, NULL), SVC_OK);
    for (size_t m = 0; m < N_MODES; m++) {
        float *a = nans(Tq * H * D);
        cr_assert_eq(npu_attention_tiled_mode(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, a, NULL,
                                              k_modes[m].mode),
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
            cr_assert_eq(npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, causal, mask, o, NULL,
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
        cr_assert_eq(npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, false, mask, o, NULL,
                                              k_modes[m].mode),
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
    cr_assert_eq(
        npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, true, NULL, b, NULL, NPU_ATTN_BF16),
        SVC_OK);
    cr_expect(memcmp(a, b, T * H * D * sizeof *a) == 0);
    free(q), free(k), free(v), free(a), free(b);
}

/* The fast profile's attention: the BF16 mode for wide heads where the CPU
 * has bf16 products and the fast kernels run (bit-identical), the
 * dispatched npu_attention otherwise and for heads of 32 or fewer. */
Test(npu_attn, fast_is_bf16_where_usable) {
    rng_t        r = {10};
    const size_t Ds[] = {16, 64, 256};
    for (size_t di = 0; di < 3; di++) {
        size_t T = 70, H = 4, Hkv = 2, D = Ds[di];
        float *q = rand_vec(&r, T * H * D, -2, 2), *k = rand_vec(&r, T * Hkv * D, -2, 2);
        float *v = rand_vec(&r, T * Hkv * D, -1, 1), *a = nans(T * H * D), *b = nans(T * H * D);
        cr_assert_eq(npu_attention_fast(q, k, v, T, T, H, Hkv, D, false, NULL, a), SVC_OK);
        bool bf16 = D > 32 && npu_fast_usable() && !strcmp(npu_kernels_name(), "avx512") &&
                    (npu_attention_amx_usable() || npu_attention_bf16_usable());
        svc_err_t err = bf16 ? npu_attention_tiled_mode(q, k, v, T, T, H, Hkv, D, false, NULL, b,
                                                        NULL, NPU_ATTN_BF16)
                             : npu_attention(q, k, v, T, T, H, Hkv, D, false, NULL, b);
        cr_assert_eq(err, SVC_OK);
        cr_expect(memcmp(a, b, T * H * D * sizeof *a) == 0, "D=%zu: %s", D,
                  bf16 ? "the bf16 mode" : "npu_attention");
        free(q), free(k), free(v), free(a), free(b);
    }
}

/* d3-nano's full-attention shape at 2048 tokens, non-causal (the prompt
 * case), against the reference once. */
Test(npu_attn, model_shape_2048, .timeout = 600) {
    rng_t r = {31};
    check(&r, 2048, 2048, 8, 2, 256, false, HOLES_NONE);
    report_worst("model_shape_2048");
}

/* ---- log-sum-exp and merging (npu_attention_lse, npu_attention_merge) ----
 *
 * Every kernel with an lse output, noncausal: the lse against a double
 * sum by hand, out unchanged by asking for it, and the attention over the
 * keys cut in two and merged against one call over all of them. Queries
 * outnumber keys (Tq > Tk: a prefix's rows against a question's keys). */

/* The kernels with an lse output. */
enum { LSE_REF, LSE_FP32, LSE_BF16X3, LSE_SMALL, LSE_DNNL, LSE_DISPATCH };

static svc_err_t lse_call(int kind, const float *q, const float *k, const float *v, size_t Tq,
                          size_t Tk, size_t H, size_t Hkv, size_t D, const uint8_t *mask,
                          float *out, float *lse) {
    switch (kind) {
    case LSE_REF:
        return npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, false, mask, out, lse);
    case LSE_FP32:
    case LSE_BF16X3:
        return npu_attention_tiled_mode(q, k, v, Tq, Tk, H, Hkv, D, false, mask, out, lse,
                                        kind == LSE_FP32 ? NPU_ATTN_FP32 : NPU_ATTN_BF16X3);
    case LSE_SMALL:
        return npu_attention_small_avx512(q, k, v, Tq, Tk, H, Hkv, D, false, mask, out, lse);
    case LSE_DNNL:
        return npu_attention_dnnl(q, k, v, Tq, Tk, H, Hkv, D, false, mask, out, lse);
    default: /* the entry point wants an lse; without one it is npu_attention */
        return lse ? npu_attention_lse(q, k, v, Tq, Tk, H, Hkv, D, mask, out, lse)
                   : npu_attention(q, k, v, Tq, Tk, H, Hkv, D, false, mask, out);
    }
}

static const struct {
    int         kind;
    const char *name;
    double      tol;   /* out, as the kernel's own (max-norm relative) */
    double      ltol;  /* lse, absolute */
    size_t      max_d; /* widest head it takes */
} k_lse[] = {
    {LSE_REF, "ref", 1e-5, 1e-5, 1000},
    {LSE_FP32, "tiled fp32", 1e-4, 1e-4, 1000},
    {LSE_BF16X3, "tiled bf16x3", 1e-4, 2e-4, 1000},
    {LSE_SMALL, "small avx512", 1e-4, 1e-4, 32},
    {LSE_DNNL, "dnnl", 1e-4, 1e-4, 1000},
    {LSE_DISPATCH, "dispatched", 1e-4, 2e-4, 1000},
};

/* ln sum_j exp(q_i k_j / sqrt(D)) over the keys row (i, h) sees, in double. */
static double lse_by_hand(const float *q, const float *k, size_t i, size_t h, size_t Tk, size_t H,
                          size_t Hkv, size_t D, const uint8_t *mask) {
    size_t kvh = h / (H / Hkv);
    double s[512], mx = -INFINITY, sum = 0.0;
    cr_assert(Tk <= 512);
    for (size_t j = 0; j < Tk; j++) {
        s[j] = -INFINITY;
        if (mask && !mask[j])
            continue;
        double dot = 0.0;
        for (size_t d = 0; d < D; d++)
            dot += (double)q[(i * H + h) * D + d] * k[(j * Hkv + kvh) * D + d];
        s[j] = dot / sqrt((double)D);
        mx = s[j] > mx ? s[j] : mx;
    }
    if (mx == -INFINITY)
        return -INFINITY;
    for (size_t j = 0; j < Tk; j++)
        sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - mx);
    return mx + log(sum);
}

/* Largest |lse - by hand| (inf where exactly one of them is -inf). */
static double lse_err(const float *lse, const float *q, const float *k, size_t Tq, size_t Tk,
                      size_t H, size_t Hkv, size_t D, const uint8_t *mask) {
    double worst = 0.0;
    for (size_t i = 0; i < Tq; i++)
        for (size_t h = 0; h < H; h++) {
            double want = lse_by_hand(q, k, i, h, Tk, H, Hkv, D, mask), got = lse[i * H + h];
            double e = want == -INFINITY || got == -INFINITY ? (want == got ? 0.0 : INFINITY)
                                                             : fabs(got - want);
            worst = e > worst ? e : worst;
        }
    return worst;
}

static void check_lse(size_t ki, rng_t *r, size_t Tq, size_t Tk, size_t cut, size_t H, size_t Hkv,
                      size_t D, int holes) {
    if (D > k_lse[ki].max_d || (k_lse[ki].kind == LSE_SMALL && !npu_probe()->avx512f))
        return;
    const char *name = k_lse[ki].name;
    size_t      no = Tq * H * D, nl = Tq * H, kd = Hkv * D;
    float      *q = rand_vec(r, no, -2, 2), *k = rand_vec(r, Tk * kd, -2, 2);
    float      *v = rand_vec(r, Tk * kd, -1, 1), *o = nans(no), *o0 = nans(no), *l = nans(nl);
    float      *o1 = nans(no), *l1 = nans(nl), *o2 = nans(no), *l2 = nans(nl);
    uint8_t    *mask = make_mask(Tk, holes);
    cr_assert_eq(lse_call(k_lse[ki].kind, q, k, v, Tq, Tk, H, Hkv, D, mask, o, l), SVC_OK);
    double e = lse_err(l, q, k, Tq, Tk, H, Hkv, D, mask);
    cr_expect(e <= k_lse[ki].ltol, "%s Tq=%zu Tk=%zu D=%zu holes=%d: lse off by %g", name, Tq, Tk,
              D, holes, e);
    /* asking for lse leaves out alone */
    cr_assert_eq(lse_call(k_lse[ki].kind, q, k, v, Tq, Tk, H, Hkv, D, mask, o0, NULL), SVC_OK);
    cr_expect(memcmp(o, o0, no * sizeof *o) == 0, "%s: out moved with lse", name);
    /* keys [0, cut) and [cut, Tk) apart, merged (in place into the first) */
    const uint8_t *m2 = mask ? mask + cut : NULL;
    cr_assert_eq(lse_call(k_lse[ki].kind, q, k, v, Tq, cut, H, Hkv, D, mask, o1, l1), SVC_OK);
    cr_assert_eq(lse_call(k_lse[ki].kind, q, k + cut * kd, v + cut * kd, Tq, Tk - cut, H, Hkv, D,
                          m2, o2, l2),
                 SVC_OK);
    npu_attention_merge(o1, l1, o2, l2, Tq, H, D, o1, l1);
    e = rel_err(o1, o, no);
    cr_expect(e <= k_lse[ki].tol, "%s Tq=%zu Tk=%zu cut=%zu holes=%d: merged out rel err %g", name,
              Tq, Tk, cut, holes, e);
    e = lse_err(l1, q, k, Tq, Tk, H, Hkv, D, mask);
    cr_expect(e <= k_lse[ki].ltol, "%s cut=%zu: merged lse off by %g", name, cut, e);
    for (size_t i = 0; i < no; i++)
        if (o[i] == 0.0f && o1[i] != 0.0f) { /* a row that sees no key stays 0 */
            cr_expect(0, "%s cut=%zu: merged out[%zu] = %g where one call has 0", name, cut, i,
                      (double)o1[i]);
            break;
        }
    free(q), free(k), free(v), free(o), free(o0), free(l), free(o1), free(l1), free(o2), free(l2);
    free(mask);
}

/* Cuts at one key, at a block edge and inside a block; every mask (the
 * sparse one hides the first 20 keys: a cut at 1 leaves one side empty,
 * lse -inf); heads of 16 (the small kernel), 64 and 256; Tq > Tk. */
Test(npu_attn, lse_and_merge) {
    rng_t        r = {4242};
    const size_t Ds[] = {16, 64, 256}, cuts[] = {1, 64, 100};
    for (size_t ki = 0; ki < sizeof k_lse / sizeof k_lse[0]; ki++)
        for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
            for (int holes = HOLES_NONE; holes <= HOLES_BLOCKS; holes++)
                for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
                    size_t Tk = holes == HOLES_BLOCKS ? 260 : 130;
                    check_lse(ki, &r, 150, Tk, cuts[ci], 4, 2, Ds[di], holes);
                }
}

/* No key at all (Tk = 0) through the entry point: zeros and -inf. */
Test(npu_attn, lse_no_keys) {
    rng_t  r = {6};
    float *q = rand_vec(&r, 3 * 4 * 8, -1, 1), *o = nans(3 * 4 * 8), *l = nans(3 * 4);
    cr_assert_eq(npu_attention_lse(q, NULL, NULL, 3, 0, 4, 2, 8, NULL, o, l), SVC_OK);
    for (size_t i = 0; i < 3 * 4 * 8; i++)
        cr_assert_eq(o[i], 0.0f);
    for (size_t i = 0; i < 3 * 4; i++)
        cr_assert(isinf(l[i]) && l[i] < 0);
    free(q), free(o), free(l);
}
