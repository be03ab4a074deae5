/*
 * test_npu_fast.c -- the fast kernels (npu.h, "Fast kernels": npu_fast.c,
 * npu_avx512.c) against their _ref twins on random inputs from a fixed
 * seed, over shapes with vector tails; the dispatch, including
 * D3_NPU_KERNELS=ref. Criterion runs each test in its own process, so a
 * test that sets the variable before its first kernel call gets its own
 * dispatch decision.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

/* The tests below compare the dispatched kernels with the references; on
 * this machine (AVX-512) that must really be the AVX-512 kernels. */
static void expect_fast_dispatch(void) {
    const npu_features_t *f = npu_probe();
    bool                  avx = f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma;
    cr_assert_str_eq(npu_kernels_name(), avx ? "avx512" : "generic");
}

/* ---- matmul ---------------------------------------------------------------- */

static void check_matmul(rng_t *r, size_t T, size_t K, size_t N) {
    expect_mm_like_ref(r, npu_matmul, "matmul", T, K, N);
}

Test(npu_fast, matmul_shapes) {
    expect_fast_dispatch();
    rng_t        r = {0x1234};
    const size_t Ts[] = {1, 3, 17, 64, 65, 260};
    const size_t Ks[] = {1, 15, 16, 17, 64, 100, 2048};
    const size_t Ns[] = {1, 5, 16, 33, 128};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++) {
                if (Ts[i] * Ks[j] * Ns[l] > 20000000)
                    continue;
                check_matmul(&r, Ts[i], Ks[j], Ns[l]);
            }
}

/* K over several blocks of 512 with a tail, N over several panels of 64. */
Test(npu_fast, matmul_blocked) {
    rng_t r = {77};
    check_matmul(&r, 9, 1500, 150);
    check_matmul(&r, 5, 1024, 70);
}

/* A hand case that catches a transposed w or a swapped row and column. */
Test(npu_fast, matmul_hand) {
    expect_mm_hand(npu_matmul);
}

/* ---- packed matmul ---------------------------------------------------------- */

static void check_matmul_packed(rng_t *r, size_t T, size_t K, size_t N) {
    float *x = rand_vec(r, T * K, -1, 1), *w = rand_vec(r, N * K, -1, 1);
    float *wc = malloc(N * K * sizeof *wc);
    cr_assert(wc);
    memcpy(wc, w, N * K * sizeof *w);
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new(wc, N, K, &wp), SVC_OK); /* wc now belongs to wp */
    cr_expect_eq(npu_wpack_n(wp), N);
    cr_expect_eq(npu_wpack_k(wp), K);
    cr_expect_geq(npu_wpack_bytes(wp), N * K * sizeof(float));
    float *a = nans(T * N), *b = nans(T * N);
    npu_matmul_packed(x, wp, T, a);
    npu_matmul_ref(x, w, T, K, N, b);
    double e = rel_err(a, b, T * N);
    cr_expect(e <= 1e-5, "matmul_packed T=%zu K=%zu N=%zu: rel err %g", T, K, N, e);
    npu_wpack_free(wp);
    free(x), free(w), free(a), free(b);
}

/* The packed tests here are of the fp32 panel layout (D3_NPU_KERNELS=avx512
 * and D3_NPU_MATMUL=panels, set before the first kernel call: each test is
 * its own process); the AMX-BF16 layout has its own tests (test_npu_amx.c),
 * oneDNN's (the fp32 default) too (test_npu_dnnl.c). */
static void fp32_panels(void) {
    cr_assert_eq(setenv("D3_NPU_KERNELS", "avx512", 1), 0);
    cr_assert_eq(setenv("D3_NPU_MATMUL", "panels", 1), 0);
    if (npu_probe()->avx512f)
        cr_assert_str_eq(npu_matmul_name(), "avx512-f32");
}

Test(npu_fast, matmul_packed_shapes) {
    fp32_panels();
    expect_fast_dispatch();
    rng_t        r = {0x4321};
    const size_t Ts[] = {1, 3, 8, 9, 17, 64, 65, 260};
    const size_t Ks[] = {1, 15, 16, 17, 64, 100, 2048};
    const size_t Ns[] = {1, 5, 16, 31, 32, 33, 64, 128, 150};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++) {
                if (Ts[i] * Ks[j] * Ns[l] > 20000000)
                    continue;
                check_matmul_packed(&r, Ts[i], Ks[j], Ns[l]);
            }
}

/* K over several blocks of 256 with a tail, T over several blocks of 64. */
Test(npu_fast, matmul_packed_blocked) {
    fp32_panels();
    rng_t r = {78};
    check_matmul_packed(&r, 9, 1500, 150);
    check_matmul_packed(&r, 130, 1024, 70);
    check_matmul_packed(&r, 200, 300, 33);
}

/* The hand case of matmul_hand through a pack (catches a transposed panel). */
Test(npu_fast, matmul_packed_hand) {
    fp32_panels();
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    float      *w = malloc(6 * sizeof *w); /* out[t] = (x0, x1 + x2) */
    cr_assert(w);
    memcpy(w, (const float[6]){1, 0, 0, 0, 1, 1}, 6 * sizeof *w);
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new(w, 2, 3, &wp), SVC_OK);
    float out[4];
    npu_matmul_packed(x, wp, 2, out);
    cr_expect_float_eq(out[0], 1.0f, 1e-6);
    cr_expect_float_eq(out[1], 5.0f, 1e-6);
    cr_expect_float_eq(out[2], 4.0f, 1e-6);
    cr_expect_float_eq(out[3], 11.0f, 1e-6);
    npu_wpack_free(wp);
    npu_wpack_free(NULL);
}

/* ---- attention ------------------------------------------------------------- */

static void check_attention(rng_t *r, size_t Tq, size_t Tk, size_t H, size_t Hkv, size_t D,
                            bool causal, bool holes) {
    float   *q = rand_vec(r, Tq * H * D, -2, 2), *k = rand_vec(r, Tk * Hkv * D, -2, 2);
    float   *v = rand_vec(r, Tk * Hkv * D, -1, 1);
    float   *a = nans(Tq * H * D), *b = nans(Tq * H * D);
    uint8_t *mask = NULL;
    if (holes) {
        mask = malloc(Tk);
        cr_assert(mask);
        /* Holes: every third key, and the whole first 20 (a query near the
         * start of a causal prefix then sees no key at all). */
        for (size_t j = 0; j < Tk; j++)
            mask[j] = (j % 3 != 1) && j >= 20;
    }
    cr_assert_eq(npu_attention(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, a), SVC_OK);
    cr_assert_eq(npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, b, NULL), SVC_OK);
    double e = rel_err(a, b, Tq * H * D);
    cr_expect(e <= 1e-4, "attention Tq=%zu Tk=%zu H=%zu/%zu D=%zu causal=%d holes=%d: rel err %g",
              Tq, Tk, H, Hkv, D, causal, holes, e);
    free(q), free(k), free(v), free(a), free(b), free(mask);
}

Test(npu_fast, attention_shapes) {
    expect_fast_dispatch();
    rng_t r = {99};
    for (int causal = 0; causal < 2; causal++)
        for (int holes = 0; holes < 2; holes++) {
            check_attention(&r, 1, 1, 1, 1, 1, causal, false);
            check_attention(&r, 17, 17, 4, 2, 16, causal, holes);
            check_attention(&r, 5, 70, 4, 2, 16, causal, holes); /* Tq < Tk: a prefix */
            check_attention(&r, 33, 100, 6, 3, 17, causal, holes);
            check_attention(&r, 260, 260, 4, 2, 16, causal, holes);
            check_attention(&r, 3, 300, 4, 1, 100, causal, holes);
            check_attention(&r, 20, 64, 16, 2, 256, causal, holes);
        }
}

/* The head_dim <= 32 path (several queries per key block, two passes):
 * head sizes around one and two vectors, GQA ratios 1, 2, 4 (and 8, more
 * queries per token than a chunk holds), Tq < Tk, key_mask holes. */
Test(npu_fast, attention_small_heads) {
    expect_fast_dispatch();
    rng_t        r = {123};
    const size_t Ds[] = {1, 8, 15, 16, 17, 32};
    const size_t Hs[][2] = {{2, 2}, {4, 2}, {4, 1}, {8, 1}};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (size_t hi = 0; hi < sizeof Hs / sizeof Hs[0]; hi++)
            for (int causal = 0; causal < 2; causal++)
                for (int holes = 0; holes < 2; holes++) {
                    size_t H = Hs[hi][0], Hkv = Hs[hi][1], D = Ds[di];
                    check_attention(&r, 1, 1, H, Hkv, D, causal, false);
                    check_attention(&r, 3, 3, H, Hkv, D, causal, holes);
                    check_attention(&r, 23, 23, H, Hkv, D, causal, holes);
                    check_attention(&r, 7, 45, H, Hkv, D, causal, holes); /* a prefix */
                    check_attention(&r, 1, 33, H, Hkv, D, causal, holes); /* one token */
                    check_attention(&r, 70, 270, H, Hkv, D, causal, holes);
                }
}

/* Queries that see no key (key_mask holes over a causal prefix) among ones
 * that do, in one chunk of 8: zeros for the former only. */
Test(npu_fast, attention_small_no_key_mixed) {
    rng_t   r = {6};
    size_t  T = 6, H = 4, Hkv = 2, D = 8;
    float  *q = rand_vec(&r, T * H * D, -1, 1), *k = rand_vec(&r, T * Hkv * D, -1, 1);
    float  *v = rand_vec(&r, T * Hkv * D, -1, 1), *a = nans(T * H * D), *b = nans(T * H * D);
    uint8_t mask[6] = {0, 0, 0, 1, 1, 0};
    cr_assert_eq(npu_attention(q, k, v, T, T, H, Hkv, D, true, mask, a), SVC_OK);
    cr_assert_eq(npu_attention_ref(q, k, v, T, T, H, Hkv, D, true, mask, b, NULL), SVC_OK);
    for (size_t i = 0; i < 3 * H * D; i++)
        cr_expect(a[i] == 0.0f, "token %zu: %g", i / (H * D), a[i]);
    cr_expect(rel_err(a, b, T * H * D) <= 1e-4, "%g", rel_err(a, b, T * H * D));
    free(q), free(k), free(v), free(a), free(b);
}

/* The small-head kernel by name agrees with the general AVX-512 path's
 * reference on the tiny model's shape (noncausal, 270 tokens). */
Test(npu_fast, attention_small_by_name) {
    const npu_features_t *f = npu_probe();
    if (!(f->avx512f && f->avx512bw && f->avx512vl))
        cr_skip_test("no AVX-512 F/BW/VL");
    rng_t  r = {17};
    size_t T = 270, H = 4, Hkv = 2, D = 16;
    float *q = rand_vec(&r, T * H * D, -2, 2), *k = rand_vec(&r, T * Hkv * D, -2, 2);
    float *v = rand_vec(&r, T * Hkv * D, -1, 1), *a = nans(T * H * D), *b = nans(T * H * D);
    cr_assert_eq(npu_attention_small_avx512(q, k, v, T, T, H, Hkv, D, false, NULL, a, NULL),
                 SVC_OK);
    cr_assert_eq(npu_attention_ref(q, k, v, T, T, H, Hkv, D, false, NULL, b, NULL), SVC_OK);
    cr_expect(rel_err(a, b, T * H * D) <= 1e-4, "%g", rel_err(a, b, T * H * D));
    free(q), free(k), free(v), free(a), free(b);
}

/* Causal, query 0 of a fresh sequence with key 0 masked: sees nothing -> 0. */
Test(npu_fast, attention_no_key_zeros) {
    rng_t   r = {5};
    float  *q = rand_vec(&r, 3 * 16, -1, 1), *k = rand_vec(&r, 3 * 16, -1, 1);
    float  *v = rand_vec(&r, 3 * 16, -1, 1), *o = nans(3 * 16);
    uint8_t mask[3] = {0, 1, 1};
    cr_assert_eq(npu_attention(q, k, v, 3, 3, 1, 1, 16, true, mask, o), SVC_OK);
    for (int d = 0; d < 16; d++)
        cr_expect(o[d] == 0.0f, "d=%d: %g", d, o[d]);
    /* Query 1 sees key 1 only: out = v[1]. */
    for (int d = 0; d < 16; d++)
        cr_expect_float_eq(o[16 + d], v[16 + d], 1e-6);
    free(q), free(k), free(v), free(o);
}

/* ---- delta rule ------------------------------------------------------------ */

typedef struct delta_in {
    float *q, *k, *v, *g, *beta, *s0;
} delta_in_t;

static delta_in_t delta_make(rng_t *r, size_t T, size_t Hk, size_t Hv, size_t dk, size_t dv) {
    delta_in_t in;
    in.q = rand_vec(r, T * Hk * dk, -1, 1);
    in.k = rand_vec(r, T * Hk * dk, -1, 1);
    npu_l2norm_ref(in.q, T * Hk, dk, 1e-6f, in.q);
    npu_l2norm_ref(in.k, T * Hk, dk, 1e-6f, in.k);
    in.v = rand_vec(r, T * Hv * dv, -1, 1);
    in.g = rand_vec(r, T * Hv, -0.5f, 0.0f);
    in.beta = rand_vec(r, T * Hv, 0.05f, 0.95f);
    in.s0 = rand_vec(r, Hv * dk * dv, -0.5f, 0.5f);
    return in;
}

static void delta_free(delta_in_t *in) {
    free(in->q), free(in->k), free(in->v), free(in->g), free(in->beta), free(in->s0);
}

static void check_delta(rng_t *r, size_t T, size_t Hk, size_t Hv, size_t dk, size_t dv) {
    delta_in_t in = delta_make(r, T, Hk, Hv, dk, dv);
    size_t     ns = Hv * dk * dv, no = T * Hv * dv;
    float     *a = nans(no), *b = nans(no), *sa = nans(ns), *sb = nans(ns);
    /* With a state in and out. */
    cr_assert_eq(npu_delta_rule(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv, in.s0, sa, a),
                 SVC_OK);
    cr_assert_eq(npu_delta_rule_chunked_ref(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv,
                                            in.s0, sb, b),
                 SVC_OK);
    double eo = rel_err(a, b, no), es = rel_err(sa, sb, ns);
    cr_expect(eo <= 1e-4, "delta out T=%zu H=%zu/%zu dk=%zu dv=%zu: rel err %g", T, Hk, Hv, dk, dv,
              eo);
    cr_expect(es <= 1e-4, "delta state T=%zu dk=%zu dv=%zu: rel err %g", T, dk, dv, es);
    /* Fresh (NULL state in, NULL state out). */
    cr_assert_eq(npu_delta_rule(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv, NULL, NULL, a),
                 SVC_OK);
    cr_assert_eq(npu_delta_rule_chunked_ref(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv,
                                            NULL, NULL, b),
                 SVC_OK);
    eo = rel_err(a, b, no);
    cr_expect(eo <= 1e-4, "delta fresh T=%zu dk=%zu dv=%zu: rel err %g", T, dk, dv, eo);
    free(a), free(b), free(sa), free(sb);
    delta_free(&in);
}

Test(npu_fast, delta_shapes) {
    expect_fast_dispatch();
    rng_t r = {2024};
    check_delta(&r, 1, 1, 1, 16, 16);
    check_delta(&r, 3, 2, 4, 16, 16);
    check_delta(&r, 64, 2, 4, 16, 16);
    check_delta(&r, 65, 2, 4, 16, 16);
    check_delta(&r, 300, 2, 4, 16, 16);
    check_delta(&r, 40, 1, 2, 17, 33); /* tails in dk and dv */
    check_delta(&r, 130, 2, 2, 128, 128);
    check_delta(&r, 70, 1, 2, 128, 128);
}

/* state_out == state_in: the state is read before it is written. */
Test(npu_fast, delta_state_in_place) {
    rng_t      r = {31};
    size_t     T = 50, Hk = 2, Hv = 4, dk = 16, dv = 16;
    delta_in_t in = delta_make(&r, T, Hk, Hv, dk, dv);
    size_t     ns = Hv * dk * dv, no = T * Hv * dv;
    float     *s = malloc(ns * sizeof *s), *sb = nans(ns), *a = nans(no), *b = nans(no);
    cr_assert(s);
    memcpy(s, in.s0, ns * sizeof *s);
    cr_assert_eq(npu_delta_rule(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv, s, s, a),
                 SVC_OK);
    cr_assert_eq(npu_delta_rule_chunked_ref(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv,
                                            in.s0, sb, b),
                 SVC_OK);
    cr_expect(rel_err(a, b, no) <= 1e-4);
    cr_expect(rel_err(s, sb, ns) <= 1e-4, "in-place state: %g", rel_err(s, sb, ns));
    free(s), free(sb), free(a), free(b);
    delta_free(&in);
}

/* T tokens in one call = T1 tokens, then T - T1 with the state passed on. */
Test(npu_fast, delta_split_equals_whole) {
    rng_t      r = {8};
    size_t     T = 200, T1 = 77, Hk = 2, Hv = 4, dk = 16, dv = 16;
    delta_in_t in = delta_make(&r, T, Hk, Hv, dk, dv);
    size_t     ns = Hv * dk * dv, no = T * Hv * dv;
    float     *whole = nans(no), *split = nans(no), *sw = nans(ns), *ss = nans(ns);
    cr_assert_eq(
        npu_delta_rule(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv, NULL, sw, whole),
        SVC_OK);
    cr_assert_eq(
        npu_delta_rule(in.q, in.k, in.v, in.g, in.beta, T1, Hk, Hv, dk, dv, NULL, ss, split),
        SVC_OK);
    size_t oqk = T1 * Hk * dk, ov = T1 * Hv * dv, og = T1 * Hv;
    cr_assert_eq(npu_delta_rule(in.q + oqk, in.k + oqk, in.v + ov, in.g + og, in.beta + og, T - T1,
                                Hk, Hv, dk, dv, ss, ss, split + ov),
                 SVC_OK);
    cr_expect(rel_err(split, whole, no) <= 1e-5, "split vs whole: %g", rel_err(split, whole, no));
    cr_expect(rel_err(ss, sw, ns) <= 1e-5, "split state: %g", rel_err(ss, sw, ns));
    free(whole), free(split), free(sw), free(ss);
    delta_free(&in);
}

/* ---- conv, norms, activation ----------------------------------------------- */

static void check_conv(rng_t *r, size_t T, size_t C, size_t K, bool with_state) {
    size_t hist = K - 1;
    float *x = rand_vec(r, T * C, -2, 2), *w = rand_vec(r, C * K, -1, 1);
    float *s0 = with_state ? rand_vec(r, hist * C, -2, 2) : NULL;
    float *a = nans(T * C), *b = nans(T * C), *sa = nans(hist * C), *sb = nans(hist * C);
    npu_conv1d_causal_silu(x, w, T, C, K, s0, sa, a);
    npu_conv1d_causal_silu_ref(x, w, T, C, K, s0, sb, b);
    double e = rel_err(a, b, T * C);
    cr_expect(e <= 1e-5, "conv T=%zu C=%zu K=%zu state=%d: %g", T, C, K, with_state, e);
    cr_expect(rel_err(sa, sb, hist * C) == 0.0, "conv state T=%zu C=%zu K=%zu", T, C, K);
    if (with_state) { /* in place: state_out == state_in */
        npu_conv1d_causal_silu(x, w, T, C, K, s0, s0, a);
        cr_expect(rel_err(s0, sb, hist * C) == 0.0, "conv in-place state T=%zu K=%zu", T, K);
    }
    free(x), free(w), free(s0), free(a), free(b), free(sa), free(sb);
}

Test(npu_fast, conv_shapes) {
    expect_fast_dispatch();
    rng_t r = {4};
    for (int st = 0; st < 2; st++) {
        check_conv(&r, 1, 128, 4, st);
        check_conv(&r, 2, 5, 4, st); /* T < K - 1 */
        check_conv(&r, 17, 33, 4, st);
        check_conv(&r, 260, 128, 4, st);
        check_conv(&r, 9, 16, 1, st);
        check_conv(&r, 9, 20, 20, st); /* K > 16: the reference path */
    }
}

static void check_norms(rng_t *r, size_t T, size_t D) {
    float *x = rand_vec(r, T * D, -3, 3), *z = rand_vec(r, T * D, -6, 6);
    float *w = rand_vec(r, D, -0.5f, 1.5f);
    float *a = nans(T * D), *b = nans(T * D);
    for (int opw = 0; opw < 2; opw++) {
        npu_rmsnorm(x, w, T, D, 1e-6f, a, opw);
        npu_rmsnorm_ref(x, w, T, D, 1e-6f, b, opw);
        cr_expect(rel_err(a, b, T * D) <= 1e-5, "rmsnorm T=%zu D=%zu 1+w=%d: %g", T, D, opw,
                  rel_err(a, b, T * D));
    }
    npu_rmsnorm_gated(x, z, w, T, D, 1e-6f, a);
    npu_rmsnorm_gated_ref(x, z, w, T, D, 1e-6f, b);
    cr_expect(rel_err(a, b, T * D) <= 1e-5, "rmsnorm_gated T=%zu D=%zu: %g", T, D,
              rel_err(a, b, T * D));
    npu_l2norm(x, T, D, 1e-6f, a);
    npu_l2norm_ref(x, T, D, 1e-6f, b);
    cr_expect(rel_err(a, b, T * D) <= 1e-5, "l2norm T=%zu D=%zu: %g", T, D, rel_err(a, b, T * D));
    npu_silu_mul(z, x, T, D, a);
    npu_silu_mul_ref(z, x, T, D, b);
    cr_expect(rel_err(a, b, T * D) <= 1e-5, "silu_mul T=%zu D=%zu: %g", T, D, rel_err(a, b, T * D));
    /* In place: out == x. */
    memcpy(a, x, T * D * sizeof *a);
    npu_rmsnorm(a, w, T, D, 1e-6f, a, true);
    npu_rmsnorm_ref(x, w, T, D, 1e-6f, b, true);
    cr_expect(rel_err(a, b, T * D) <= 1e-5, "rmsnorm in place T=%zu D=%zu", T, D);
    free(x), free(z), free(w), free(a), free(b);
}

Test(npu_fast, norms_shapes) {
    expect_fast_dispatch();
    rng_t        r = {11};
    const size_t Ts[] = {1, 3, 17, 64, 65, 260};
    const size_t Ds[] = {1, 15, 16, 17, 64, 100, 2048};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ds / sizeof Ds[0]; j++)
            check_norms(&r, Ts[i], Ds[j]);
}

/* Rows split over the pool (npu_fast.c's rows_run, the conv's row blocks)
 * give the bits of one call per row: the norms against the AVX-512
 * kernels called on the whole block (no split), the conv (4 rows at a
 * time inside, conv_span) against one row at a time with the state
 * carried, with a state in and without. Sizes well past one item's 32,768
 * floats, so several items run. */
Test(npu_fast, pool_split_bit_identical) {
    expect_fast_dispatch();
    rng_t  r = {14};
    size_t T = 97, D = 2048, K = 4, hist = K - 1;
    float *x = rand_vec(&r, T * D, -3, 3), *z = rand_vec(&r, T * D, -6, 6);
    float *w = rand_vec(&r, D, -0.5f, 1.5f), *cw = rand_vec(&r, D * K, -1, 1);
    float *a = nans(T * D), *b = nans(T * D);
    npu_rmsnorm(x, w, T, D, 1e-6f, a, true);
    npu_rmsnorm_avx512(x, w, T, D, 1e-6f, b, true);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "rmsnorm");
    npu_rmsnorm_gated(x, z, w, T, D, 1e-6f, a);
    npu_rmsnorm_gated_avx512(x, z, w, T, D, 1e-6f, b);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "rmsnorm_gated");
    npu_l2norm(x, T, D, 1e-6f, a);
    npu_l2norm_avx512(x, T, D, 1e-6f, b);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "l2norm");
    npu_silu_mul(z, x, T, D, a);
    npu_silu_mul_avx512(z, x, T, D, b);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "silu_mul");
    memcpy(a, x, T * D * sizeof *a), memcpy(b, x, T * D * sizeof *b);
    npu_sigmoid_mul(z, a, T * D);
    npu_sigmoid_mul_avx512(z, b, T * D);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "sigmoid_mul");
    float *s0 = rand_vec(&r, hist * D, -2, 2), *sa = nans(hist * D), *sb = nans(hist * D);
    npu_conv1d_causal_silu(x, cw, T, D, K, s0, sa, a);
    memcpy(sb, s0, hist * D * sizeof *sb);
    for (size_t t = 0; t < T; t++) /* one row a call, the state carried in place */
        npu_conv1d_causal_silu(x + t * D, cw, 1, D, K, sb, sb, b + t * D);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "conv rows");
    cr_expect(memcmp(sa, sb, hist * D * sizeof *sa) == 0, "conv state");
    /* A fresh sequence (no state: the rows before it are skipped, not
     * zeros): its first hist rows in one call of their own (one row at a
     * time inside), then one row a call. */
    npu_conv1d_causal_silu(x, cw, T, D, K, NULL, sa, a);
    npu_conv1d_causal_silu(x, cw, hist, D, K, NULL, sb, b);
    for (size_t t = hist; t < T; t++)
        npu_conv1d_causal_silu(x + t * D, cw, 1, D, K, sb, sb, b + t * D);
    cr_expect(memcmp(a, b, T * D * sizeof *a) == 0, "conv rows, fresh");
    cr_expect(memcmp(sa, sb, hist * D * sizeof *sa) == 0, "conv state, fresh");
    free(x), free(z), free(w), free(cw), free(a), free(b), free(s0), free(sa), free(sb);
}

/* The split conv (the Gated DeltaNet's q, k, v written straight from the
 * conv) gives each value the unsplit call's bits, in its block's place:
 * block widths off the 16-channel vectors, several row items, both the
 * AVX-512 kernel and the reference. */
static void expect_split_conv(const float *x, const float *cw, const float *s0, size_t T, size_t C,
                              size_t K, const size_t *width, size_t n, bool ref) {
    size_t hist = K - 1;
    float *whole = nans(T * C), *parts = nans(T * C), *sa = nans(hist * C), *sb = nans(hist * C);
    npu_conv_split_t sp = {.n = n};
    for (size_t i = 0, off = 0; i < n; off += T * width[i++]) {
        sp.width[i] = width[i];
        sp.out[i] = parts + off;
    }
    if (ref) {
        npu_conv1d_causal_silu_ref(x, cw, T, C, K, s0, sa, whole);
        npu_conv1d_causal_silu_split_ref(x, cw, T, C, K, s0, sb, &sp);
    } else {
        npu_conv1d_causal_silu(x, cw, T, C, K, s0, sa, whole);
        npu_conv1d_causal_silu_split(x, cw, T, C, K, s0, sb, &sp);
    }
    size_t bad = 0;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0, base = 0; i < n; base += width[i++])
            bad += memcmp(whole + t * C + base, sp.out[i] + t * width[i],
                          width[i] * sizeof *whole) != 0;
    cr_expect_eq(bad, 0, "split conv (ref %d, T=%zu, C=%zu, %zu blocks): %zu rows differ", ref, T,
                 C, n, bad);
    cr_expect(memcmp(sa, sb, hist * C * sizeof *sa) == 0, "split conv state (ref %d)", ref);
    free(whole), free(parts), free(sa), free(sb);
}

Test(npu_fast, conv_split_bit_identical) {
    expect_fast_dispatch();
    rng_t        r = {15};
    size_t       T = 41, C = 2 * 40 + 23 + 5 * 16, K = 4; /* widths below */
    float       *x = rand_vec(&r, T * C, -3, 3), *cw = rand_vec(&r, C * K, -1, 1);
    float       *s0 = rand_vec(&r, (K - 1) * C, -2, 2);
    const size_t qkv[3] = {40, 40, 23 + 5 * 16}, one[1] = {C}, four[4] = {1, 17, 32, C - 50};
    for (int ref = 0; ref < 2; ref++) {
        expect_split_conv(x, cw, s0, T, C, K, qkv, 3, ref);
        expect_split_conv(x, cw, NULL, T, C, K, qkv, 3, ref);
        expect_split_conv(x, cw, s0, T, C, K, one, 1, ref);
        expect_split_conv(x, cw, s0, T, C, K, four, 4, ref);
    }
    /* many rows: the conv's row items on the pool */
    size_t Tl = 300, Cl = 2 * 512 + 1024;
    float *xl = rand_vec(&r, Tl * Cl, -3, 3), *cwl = rand_vec(&r, Cl * K, -1, 1);
    expect_split_conv(xl, cwl, NULL, Tl, Cl, K, (const size_t[]){512, 512, 1024}, 3, false);
    free(x), free(cw), free(s0), free(xl), free(cwl);
}

/* The residual add over the pool: the plain loop's bits, every length
 * (blocks of 16 and a tail, several items). */
Test(npu_fast, add_matches_loop) {
    rng_t        r = {16};
    const size_t ns[] = {1, 15, 16, 33, 4096, 330 * 2048 + 16, 330 * 2048 + 5};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        size_t n = ns[i];
        float *x = rand_vec(&r, n, -3, 3), *y = rand_vec(&r, n, -3, 3), *a = nans(n);
        memcpy(a, x, n * sizeof *a);
        npu_add(a, y, n);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++) {
            float want = x[k] + y[k];
            bad += memcmp(&a[k], &want, sizeof want) != 0;
        }
        cr_expect_eq(bad, 0, "npu_add n=%zu: %zu values differ", n, bad);
        free(x), free(y), free(a);
    }
}

/* silu's saturated ends: large |x| must give x or 0, not NaN or inf. */
Test(npu_fast, silu_extremes) {
    const float gate[6] = {-1000.0f, -100.0f, -20.0f, 20.0f, 100.0f, 1000.0f};
    const float up[6] = {1, 1, 1, 1, 1, 1};
    float       a[6], b[6];
    npu_silu_mul(gate, up, 1, 6, a);
    npu_silu_mul_ref(gate, up, 1, 6, b);
    for (int i = 0; i < 6; i++)
        cr_expect(fabsf(a[i] - b[i]) <= 1e-5f * fmaxf(1.0f, fabsf(b[i])), "x=%g: %g vs %g", gate[i],
                  a[i], b[i]);
}

/* silu on the negative side is exp-dominated: per element it must match to
 * a few fp32 ulps, which checks the vector exp's polynomial. */
Test(npu_fast, silu_elementwise) {
    rng_t  r = {12};
    size_t n = 4099;
    float *x = rand_vec(&r, n, -30, 5), *one = rand_vec(&r, n, 1, 1);
    float *a = nans(n), *b = nans(n);
    npu_silu_mul(x, one, 1, n, a);
    npu_silu_mul_ref(x, one, 1, n, b);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / fabs((double)b[i]);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    cr_expect(worst <= 2e-6, "silu worst element rel err %g", worst);
    free(x), free(one), free(a), free(b);
}

/* The attention output gate x *= sigmoid(g): per element, over the whole
 * range including saturated ends and a length with a tail. */
Test(npu_fast, sigmoid_mul_elementwise) {
    rng_t  r = {13};
    size_t n = 1029;
    float *g = rand_vec(&r, n, -40, 40), *x = rand_vec(&r, n, -3, 3);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    cr_assert(a && b);
    g[0] = -1000.0f, g[1] = 1000.0f, g[2] = 0.0f;
    memcpy(a, x, n * sizeof *a);
    memcpy(b, x, n * sizeof *b);
    npu_sigmoid_mul(g, a, n);
    npu_sigmoid_mul_ref(g, b, n);
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= 2e-6f * fabsf(b[i]) + 1e-30f, "g=%g x=%g: %g vs %g", g[i],
                  x[i], a[i], b[i]);
    cr_assert_float_eq(a[1], x[1], 1e-6, "sigmoid(1000) must be 1");
    cr_assert_float_eq(a[2], x[2] / 2, 1e-6, "sigmoid(0) must be 1/2");
    free(g), free(x), free(a), free(b);
}

/* ---- dispatch --------------------------------------------------------------- */

/* D3_NPU_KERNELS=ref: every entry point is bit-identical to its _ref. */
Test(npu_fast, env_ref_bit_identical) {
    cr_assert_eq(setenv("D3_NPU_KERNELS", "ref", 1), 0);
    cr_assert_str_eq(npu_kernels_name(), "ref");
    rng_t  r = {3};
    size_t T = 33, K = 100, N = 17;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float *a = nans(T * K), *b = nans(T * K);
    npu_matmul(x, w, T, K, N, a);
    npu_matmul_ref(x, w, T, K, N, b);
    cr_expect(memcmp(a, b, T * N * sizeof *a) == 0, "matmul");
    float *wc = malloc(N * K * sizeof *wc);
    cr_assert(wc);
    memcpy(wc, w, N * K * sizeof *wc);
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new(wc, N, K, &wp), SVC_OK);
    cr_expect_eq(npu_wpack_bytes(wp), N * K * sizeof(float)); /* the plain copy, kept */
    npu_matmul_packed(x, wp, T, a);
    cr_expect(memcmp(a, b, T * N * sizeof *a) == 0, "matmul_packed");
    npu_wpack_free(wp);
    cr_assert_eq(npu_attention(x, x, x, T, T, 4, 2, 25, true, NULL, a), SVC_OK);
    cr_assert_eq(npu_attention_ref(x, x, x, T, T, 4, 2, 25, true, NULL, b, NULL), SVC_OK);
    cr_expect(memcmp(a, b, T * K * sizeof *a) == 0, "attention");
    npu_silu_mul(x, w, 1, N * 5, a);
    npu_silu_mul_ref(x, w, 1, N * 5, b);
    cr_expect(memcmp(a, b, N * 5 * sizeof *a) == 0, "silu_mul");
    npu_rmsnorm(x, w, T, K, 1e-6f, a, true);
    npu_rmsnorm_ref(x, w, T, K, 1e-6f, b, true);
    cr_expect(memcmp(a, b, T * K * sizeof *a) == 0, "rmsnorm");
    free(x), free(w), free(a), free(b);
}

/* The AVX-512 kernels by name, whatever the dispatch: not bit-identical to
 * the references (fp32 vs double sums), which is what makes the test above
 * meaningful. */
Test(npu_fast, avx512_differs_from_ref) {
    const npu_features_t *f = npu_probe();
    if (!(f->avx512f && f->avx512bw && f->avx512vl))
        cr_skip_test("no AVX-512 F/BW/VL");
    rng_t  r = {3};
    size_t T = 33, K = 100, N = 17;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float *a = nans(T * N), *b = nans(T * N);
    npu_matmul_avx512(x, w, T, K, N, a);
    npu_matmul_ref(x, w, T, K, N, b);
    cr_expect(memcmp(a, b, T * N * sizeof *a) != 0);
    cr_expect(rel_err(a, b, T * N) <= 1e-5);
    free(x), free(w), free(a), free(b);
}
