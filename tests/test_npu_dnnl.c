/*
 * test_npu_dnnl.c -- the projection matmul on oneDNN's sgemm (npu.h,
 * npu_matmul_dnnl, "onednn-f32"): against the reference over shapes with
 * row, column-block and K tails; a row's bits whatever the call's T (what
 * the batched passes rely on); and the dispatch that sends fp32 packs there
 * where the tiles are not used (D3_NPU_KERNELS=avx512, and =generic: what a
 * CPU without AVX-512 gets); the attention on sgemm (npu_attention_dnnl)
 * against the reference. Criterion runs each test in its own process, so
 * each test's environment decides its dispatch.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "npu.h"
#include "test_rng.h"

static void check_dnnl(rng_t *r, size_t T, size_t K, size_t N) {
    expect_mm_like_ref(r, npu_matmul_dnnl, "npu_matmul_dnnl", T, K, N);
}

/* T below, at and above the 16-row padding; N within one block of 256
 * columns, at it, and with a tail block; K down to 1. */
Test(npu_dnnl, shapes) {
    rng_t        r = {0xd11};
    const size_t Ts[] = {1, 2, 15, 16, 17, 100, 513};
    const size_t Ks[] = {1, 17, 300, 2048};
    const size_t Ns[] = {1, 31, 256, 257, 600};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++) {
                if (Ts[i] * Ks[j] * Ns[l] > 40000000)
                    continue;
                check_dnnl(&r, Ts[i], Ks[j], Ns[l]);
            }
}

/* K = 0: zeros; T = 0 or N = 0: nothing written. */
Test(npu_dnnl, trivial_shapes) {
    float out[6] = {1, 2, 3, 4, 5, 6};
    npu_matmul_dnnl(NULL, NULL, 2, 0, 3, out);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(out[i], 0.0f);
    out[0] = 7;
    npu_matmul_dnnl(NULL, NULL, 0, 4, 3, out);
    npu_matmul_dnnl(NULL, NULL, 2, 4, 0, out);
    cr_expect_eq(out[0], 7.0f);
}

/* A hand case that catches a transposed w or a swapped row and column. */
Test(npu_dnnl, hand) {
    expect_mm_hand(npu_matmul_dnnl);
}

/* With oneDNN's AVX-512 kernels a row's result is the same bits whatever
 * rows share its call (npu_dnnl.c; its AVX2 kernels do not promise it, so
 * the check needs AVX-512): every run of rows of a 600-row product, cut at
 * sizes below and above the padding, on the pool (large) and inline. */
Test(npu_dnnl, rows_independent) {
    if (!npu_probe()->avx512f)
        cr_skip_test("oneDNN's kernels here are not the AVX-512 ones");
    rng_t        r = {0xd12};
    const size_t T = 600, K = 2048, N = 300;
    float       *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float       *all = nans(T * N), *part = nans(T * N);
    npu_matmul_dnnl(x, w, T, K, N, all);
    const size_t cuts[] = {1, 2, 5, 15, 16, 17, 64, 100, 511};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        size_t M = cuts[c];
        for (size_t t0 = 3; t0 + M <= T; t0 += 7 * M + 11) {
            npu_matmul_dnnl(x + t0 * K, w, M, K, N, part);
            cr_expect(memcmp(part, all + t0 * N, M * N * sizeof *part) == 0,
                      "rows [%zu, %zu) alone differ from the same rows of T = %zu", t0, t0 + M, T);
        }
    }
    free(x), free(w), free(all), free(part);
}

/* A plain pack on the dispatch asked for: npu_matmul_packed gives
 * npu_matmul_dnnl's bits, and the pack holds the fp32 weight as given. */
static void check_dispatch(const char *kernels, bool quantised) {
    cr_assert_eq(setenv("D3_NPU_KERNELS", kernels, 1), 0);
    cr_assert_eq(unsetenv("D3_NPU_MATMUL"), 0);
    rng_t  r = {0xd13};
    size_t T = 40, K = 300, N = 270;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float *wc = malloc(N * K * sizeof *wc), *a = nans(T * N), *b = nans(T * N);
    cr_assert(wc);
    memcpy(wc, w, N * K * sizeof *w);
    npu_wpack_t *wp;
    if (quantised)
        cr_assert_eq(npu_wpack_new_quantised(wc, N, K, &wp), SVC_OK);
    else
        cr_assert_eq(npu_wpack_new(wc, N, K, &wp), SVC_OK);
    cr_expect_str_eq(npu_matmul_name(), "onednn-f32");
    cr_expect(!npu_amx_enabled());
    cr_expect(!npu_wpack_is_int8(wp));
    cr_expect_eq(npu_wpack_bytes(wp), N * K * sizeof(float));
    npu_matmul_packed(x, wp, T, a);
    npu_matmul_dnnl(x, w, T, K, N, b);
    cr_expect(memcmp(a, b, T * N * sizeof *a) == 0, "npu_matmul_packed is npu_matmul_dnnl");
    npu_wpack_free(wp);
    free(x), free(w), free(a), free(b);
}

/* D3_NPU_KERNELS=avx512 (the fp32 twin of the AMX path): fp32 packs on
 * oneDNN, and quantised ones too (fp32 everywhere is what it asks for). */
Test(npu_dnnl, dispatch_avx512) {
    if (!npu_probe()->avx512f)
        cr_skip_test("no AVX-512 here");
    check_dispatch("avx512", false);
    cr_expect_str_eq(npu_kernels_name(), "avx512");
    cr_expect_str_eq(npu_matmul_quantised_name(), "onednn-f32");
}

Test(npu_dnnl, dispatch_avx512_quantised) {
    if (!npu_probe()->avx512f)
        cr_skip_test("no AVX-512 here");
    check_dispatch("avx512", true);
}

/* D3_NPU_KERNELS=generic (a CPU without AVX-512): the reference kernels,
 * but every pack, quantised too (no VNNI kernel without AVX-512), on
 * oneDNN instead of the scalar reference matmul. */
Test(npu_dnnl, dispatch_generic) {
    check_dispatch("generic", true);
    cr_expect_str_eq(npu_kernels_name(), "generic");
    cr_expect_str_eq(npu_matmul_quantised_name(), "onednn-f32");
}

/* D3_NPU_KERNELS=ref stays the scalar reference (the oracle), and
 * D3_NPU_MATMUL=panels keeps our AVX-512 fp32 panels reachable. */
Test(npu_dnnl, ref_stays) {
    cr_assert_eq(setenv("D3_NPU_KERNELS", "ref", 1), 0);
    cr_expect_str_eq(npu_matmul_name(), "ref-f32");
}

Test(npu_dnnl, panels_stay) {
    if (!npu_probe()->avx512f)
        cr_skip_test("no AVX-512 here");
    cr_assert_eq(setenv("D3_NPU_KERNELS", "avx512", 1), 0);
    cr_assert_eq(setenv("D3_NPU_MATMUL", "panels", 1), 0);
    cr_expect_str_eq(npu_matmul_name(), "avx512-f32");
}

/* ---- attention on sgemm ---------------------------------------------------- */

/* npu_attention_dnnl against npu_attention_ref on random q, k, v: key
 * blocks of 512 with a tail, query blocks of 64 with a tail, GQA, the
 * causal prefix offset, a key mask (keys 0 and 2 padded, so the causal
 * first query of a full prompt sees key 1 only), and with every key of
 * the first block masked: queries that see no key get zeros. */
static void check_attn(rng_t *r, size_t Tq, size_t Tk, size_t H, size_t Hkv, size_t D, bool causal,
                       int masking) {
    float   *q = rand_vec(r, Tq * H * D, -1, 1), *k = rand_vec(r, Tk * Hkv * D, -1, 1);
    float   *v = rand_vec(r, Tk * Hkv * D, -1, 1);
    float   *a = nans(Tq * H * D), *b = nans(Tq * H * D);
    uint8_t *mask = NULL;
    if (masking) {
        mask = malloc(Tk);
        cr_assert(mask);
        for (size_t j = 0; j < Tk; j++)
            mask[j] = masking == 1 ? j != 0 && j != 2 : j >= 600;
    }
    cr_assert_eq(npu_attention_dnnl(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, a, NULL), SVC_OK);
    cr_assert_eq(npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, b, NULL), SVC_OK);
    double e = rel_err(a, b, Tq * H * D);
    cr_expect(e <= 2e-5, "attention Tq=%zu Tk=%zu H=%zu/%zu D=%zu causal=%d mask=%d: rel err %g",
              Tq, Tk, H, Hkv, D, causal, masking, e);
    free(q), free(k), free(v), free(a), free(b), free(mask);
}

Test(npu_dnnl, attention_like_ref) {
    rng_t r = {0xa77};
    for (int causal = 0; causal < 2; causal++)
        for (int masking = 0; masking < 2; masking++) {
            check_attn(&r, 1, 1, 2, 1, 16, causal, masking);
            check_attn(&r, 7, 7, 4, 2, 64, causal, masking);
            check_attn(&r, 130, 1100, 4, 1, 32, causal, masking);
            check_attn(&r, 600, 600, 2, 2, 256, causal, masking);
        }
    /* keys [0, 600) padded: a causal query before 600 sees nothing */
    check_attn(&r, 700, 700, 2, 1, 32, true, 2);
    check_attn(&r, 100, 700, 2, 1, 32, false, 2);
}

/* The generic kernels run it, and the delta rule on sgemm: npu_attention
 * and npu_delta_rule give npu_attention_dnnl's and npu_delta_rule_dnnl's
 * bits. */
Test(npu_dnnl, attention_dispatch_generic) {
    cr_assert_eq(setenv("D3_NPU_KERNELS", "generic", 1), 0);
    rng_t  r = {0xa78};
    size_t Tq = 70, Tk = 90, H = 4, Hkv = 2, D = 64;
    float *q = rand_vec(&r, Tq * H * D, -1, 1), *k = rand_vec(&r, Tk * Hkv * D, -1, 1);
    float *v = rand_vec(&r, Tk * Hkv * D, -1, 1), *a = nans(Tq * H * D), *b = nans(Tq * H * D);
    cr_assert_eq(npu_attention(q, k, v, Tq, Tk, H, Hkv, D, true, NULL, a), SVC_OK);
    cr_assert_eq(npu_attention_dnnl(q, k, v, Tq, Tk, H, Hkv, D, true, NULL, b, NULL), SVC_OK);
    cr_expect(memcmp(a, b, Tq * H * D * sizeof *a) == 0, "npu_attention is npu_attention_dnnl");
    /* the delta rule on the same q and k: 2 key heads of 64, 4 value heads
     * of 64 (g and beta in range, state from zeros) */
    size_t T = 70, nk = 2, nv = 4, d = 64;
    float *g = rand_vec(&r, T * nv, -1, 0), *beta = rand_vec(&r, T * nv, 0.1f, 0.9f);
    float *vd = rand_vec(&r, T * nv * d, -1, 1);
    float *o1 = nans(T * nv * d), *o2 = nans(T * nv * d);
    float *s1 = nans(nv * d * d), *s2 = nans(nv * d * d);
    cr_assert_eq(npu_delta_rule(q, k, vd, g, beta, T, nk, nv, d, d, NULL, s1, o1), SVC_OK);
    cr_assert_eq(npu_delta_rule_dnnl(q, k, vd, g, beta, T, nk, nv, d, d, NULL, s2, o2), SVC_OK);
    cr_expect(memcmp(o1, o2, T * nv * d * sizeof *o1) == 0 &&
                  memcmp(s1, s2, nv * d * d * sizeof *s1) == 0,
              "npu_delta_rule is npu_delta_rule_dnnl");
    free(q), free(k), free(v), free(a), free(b), free(g), free(beta), free(o1), free(o2), free(s1),
        free(s2), free(vd);
}

/* ---- where oneDNN may not run ---------------------------------------------- */

#ifndef PR_SET_MDWE /* Linux 6.3; Debian 12's headers predate it */
#define PR_SET_MDWE              65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

/* What systemd's MemoryDenyWriteExecute= does on Linux 6.3+: memory that
 * was writable never becomes executable, so oneDNN cannot run the kernels
 * it writes. Skips where the kernel has no PR_SET_MDWE. */
static void deny_write_execute(void) {
    if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) != 0)
        cr_skip_test("no PR_SET_MDWE in this kernel");
}

/* There, oneDNN's kernels refuse instead of answering zeros (attention)
 * or garbage (the delta rule) with SVC_OK, and the generic dispatch runs
 * the references: the same bits as calling them. */
Test(npu_dnnl, refused_is_never_silent) {
    deny_write_execute();
    cr_assert_eq(setenv("D3_NPU_KERNELS", "generic", 1), 0);
    cr_assert(npu_dnnl_refusal(), "oneDNN ran under PR_SET_MDWE");
    cr_expect(strstr(npu_dnnl_refusal(), "MemoryDenyWriteExecute"), "%s", npu_dnnl_refusal());
    cr_expect_str_eq(npu_kernels_name(), "ref");
    cr_expect_str_eq(npu_matmul_name(), "ref-f32");
    rng_t  r = {0xa79};
    size_t Tq = 70, Tk = 90, H = 4, Hkv = 2, D = 64;
    float *q = rand_vec(&r, Tq * H * D, -1, 1), *k = rand_vec(&r, Tk * Hkv * D, -1, 1);
    float *v = rand_vec(&r, Tk * Hkv * D, -1, 1), *a = nans(Tq * H * D), *b = nans(Tq * H * D);
    cr_expect_eq(npu_attention_dnnl(q, k, v, Tq, Tk, H, Hkv, D, true, NULL, a, NULL),
                 SVC_ERR_UNSUPPORTED);
    cr_assert_eq(npu_attention(q, k, v, Tq, Tk, H, Hkv, D, true, NULL, a), SVC_OK);
    cr_assert_eq(npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, true, NULL, b, NULL), SVC_OK);
    cr_expect(memcmp(a, b, Tq * H * D * sizeof *a) == 0, "npu_attention is the reference");
    size_t T = 70, nk = 2, nv = 4, d = 64;
    float *g = rand_vec(&r, T * nv, -1, 0), *beta = rand_vec(&r, T * nv, 0.1f, 0.9f);
    float *vd = rand_vec(&r, T * nv * d, -1, 1), *o = nans(T * nv * d), *st = nans(nv * d * d);
    cr_expect_eq(npu_delta_rule_dnnl(q, k, vd, g, beta, T, nk, nv, d, d, NULL, st, o),
                 SVC_ERR_UNSUPPORTED);
    /* the matmul never fails: its items take the reference */
    check_dnnl(&r, 20, 64, 300);
    free(q), free(k), free(v), free(a), free(b), free(g), free(beta), free(vd), free(o), free(st);
}

/* An AVX-512 CPU whose fp32 weights would go to oneDNN (no AVX512-BF16,
 * or D3_NPU_KERNELS=avx512) keeps our fp32 panels instead. */
Test(npu_dnnl, refused_keeps_the_panels) {
    if (!npu_probe()->avx512f)
        cr_skip_test("no AVX-512 here");
    deny_write_execute();
    cr_assert_eq(setenv("D3_NPU_KERNELS", "avx512", 1), 0);
    cr_expect_str_eq(npu_kernels_name(), "avx512");
    cr_expect_str_eq(npu_matmul_name(), "avx512-f32");
}
