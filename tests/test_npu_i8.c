/*
 * test_npu_i8.c -- the int8x3 matmul for quantised weights: on AMX-INT8
 * tiles (npu_amx_i8.c) and on AVX-512 VNNI (npu_vnni_i8.c), and
 * npu_wpack_new_quantised's choice between them.
 *
 * Two oracles, as for the bf16 kernel: the scheme's own exact value
 * (npu_matmul_i8_ref: the same 16-bit integers and products summed in
 * double), which the tile kernel must meet to fp32 rounding (1e-6
 * relative), and the fp32 product of the unquantised operands, which it
 * meets to the scheme's rounding (16-bit operands per row and column, the
 * low bytes' product left out: measured <= 5.6e-5 here, held to 2e-4).
 * The VNNI kernel computes the same integers, so it must give the AMX
 * kernel's bits where both run. Each kernel's checks skip on a CPU
 * without it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

static bool have_i8(void) {
    const npu_features_t *f = npu_probe();
    return f->amx_int8 && f->amx_usable && f->avx512bw && f->avx512_bf16 && f->amx_bf16;
}

static bool have_vnni(void) {
    const npu_features_t *f = npu_probe();
    return f->avx512_vnni && f->avx512bw && f->avx512vl;
}

static void *pack(const float *w, size_t N, size_t K) {
    void *pk = aligned_alloc(64, (npu_amx_i8_pack_bytes(N, K) + 63) / 64 * 64);
    cr_assert(pk);
    npu_amx_i8_pack(w, N, K, pk);
    return pk;
}

/* One kernel's result a against the scheme's exact value b and the fp32
 * product c. */
static void check_one(const char *name, const float *a, const float *b, const float *c, size_t T,
                      size_t K, size_t N) {
    double e = rel_err(a, b, T * N), e32 = rel_err(a, c, T * N);
    cr_expect(e <= 1e-6, "%s T=%zu K=%zu N=%zu: %g from the scheme's exact value", name, T, K, N,
              e);
    cr_expect(e32 <= 2e-4, "%s T=%zu K=%zu N=%zu: %g from the fp32 product", name, T, K, N, e32);
}

static float *outputs(size_t n) {
    float *a = malloc((n + 1) * sizeof *a);
    cr_assert(a);
    for (size_t i = 0; i < n; i++)
        a[i] = NAN; /* an output the kernel forgot shows up */
    return a;
}

/* Both kernels where the CPU has them, each against the oracles, and
 * against each other bit for bit. */
static void check(rng_t *r, size_t T, size_t K, size_t N) {
    float *x = rand_vec(r, T * K, -1, 1), *w = rand_vec(r, N * K, -1, 1);
    void  *pk = pack(w, N, K);
    float *a = outputs(T * N), *v = outputs(T * N), *b = outputs(T * N), *c = outputs(T * N);
    npu_matmul_i8_ref(x, pk, T, K, N, b);
    npu_matmul_ref(x, w, T, K, N, c);
    if (have_i8()) {
        npu_matmul_amx_i8(x, pk, T, K, N, a);
        check_one("amx", a, b, c, T, K, N);
    }
    if (have_vnni()) {
        npu_matmul_vnni_i8(x, pk, T, K, N, v);
        check_one("vnni", v, b, c, T, K, N);
    }
    if (have_i8() && have_vnni())
        cr_expect(memcmp(a, v, T * N * sizeof *a) == 0, "T=%zu K=%zu N=%zu: vnni differs from amx",
                  T, K, N);
    free(x), free(w), free(pk), free(a), free(v), free(b), free(c);
}

static void skip_without_int8(void) {
    if (!have_i8() && !have_vnni())
        cr_skip_test("neither AMX-INT8 nor AVX-512 VNNI here");
}

Test(npu_i8, shapes) {
    skip_without_int8();
    rng_t        r = {0x18};
    const size_t Ts[] = {1, 15, 16, 17, 33, 257};
    const size_t Ks[] = {1, 63, 64, 65, 100, 300};
    const size_t Ns[] = {1, 16, 31, 32, 33, 130};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++)
                check(&r, Ts[i], Ks[j], Ns[l]);
}

/* Several row chunks (512), column blocks (256) and K blocks (2048, with a
 * tail: the int32 sums wait in the item's buffer), through the pool. */
Test(npu_i8, blocked_and_parallel) {
    skip_without_int8();
    rng_t r = {0x29};
    check(&r, 600, 1000, 300);
    check(&r, 513, 2048, 64);
    check(&r, 40, 6144, 200);
    check(&r, 70, 4100, 290);
}

/* Rows of very different sizes, a zero row and a zero column: each row and
 * column has its own scale, so none loses precision to another. */
Test(npu_i8, scales_per_row_and_column) {
    if (!have_i8())
        cr_skip_test("no usable AMX-INT8 here");
    rng_t  r = {0x3a};
    size_t T = 40, K = 200, N = 48;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    for (size_t k = 0; k < K; k++) {
        x[3 * K + k] *= 1e-6f;
        x[4 * K + k] *= 1e5f;
        x[5 * K + k] = 0.0f;
        w[7 * K + k] = 0.0f;
        w[8 * K + k] *= 1e-4f;
    }
    void  *pk = pack(w, N, K);
    float *a = malloc(T * N * sizeof *a), *c = malloc(T * N * sizeof *c);
    cr_assert(a && c);
    npu_matmul_amx_i8(x, pk, T, K, N, a);
    npu_matmul_ref(x, w, T, K, N, c);
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < N; n++) {
            double ref = c[t * N + n], scale = 0;
            for (size_t k = 0; k < K; k++)
                scale += fabs((double)x[t * K + k] * w[n * K + k]);
            cr_expect(fabs(a[t * N + n] - ref) <= 1e-2 * scale + 1e-30,
                      "t=%zu n=%zu: %g vs %g (sum of |terms| %g)", t, n, a[t * N + n], ref, scale);
        }
    cr_expect(a[5 * N + 1] == 0.0f && a[2 * N + 7] == 0.0f, "zero row / column");
    free(x), free(w), free(pk), free(a), free(c);
}

/* A row's result does not depend on the rows around it or on T
 * (bit-identical): prefix sharing relies on it. */
static void rows_independent(void (*mm)(const float *, const void *, size_t, size_t, size_t,
                                        float *)) {
    rng_t  r = {0x4b};
    size_t T = 600, K = 2100, N = 70;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    void  *pk = pack(w, N, K);
    float *all = malloc(T * N * sizeof *all), *part = malloc(T * N * sizeof *part);
    cr_assert(all && part);
    mm(x, pk, T, K, N, all);
    mm(x, pk, 37, K, N, part);
    mm(x + 37 * K, pk, 1, K, N, part + 37 * N);
    mm(x + 38 * K, pk, T - 38, K, N, part + 38 * N);
    cr_expect(memcmp(all, part, T * N * sizeof *all) == 0, "rows differ");
    free(x), free(w), free(pk), free(all), free(part);
}

Test(npu_i8, rows_independent) {
    if (!have_i8())
        cr_skip_test("no usable AMX-INT8 here");
    rows_independent(npu_matmul_amx_i8);
}

Test(npu_i8, rows_independent_vnni) {
    if (!have_vnni())
        cr_skip_test("no AVX-512 VNNI here");
    rows_independent(npu_matmul_vnni_i8);
}

/* The dispatch: a quantised pack takes the int8 layout here (a quarter of
 * the fp32 bytes plus the column scales) and npu_matmul_packed runs it; a
 * plain pack stays bf16. */
Test(npu_i8, wpack_quantised) {
    if (!have_i8())
        cr_skip_test("no usable AMX-INT8 here");
    rng_t  r = {0x5c};
    size_t T = 70, K = 128, N = 96;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float *wc = malloc(N * K * sizeof *wc), *a = malloc(T * N * sizeof *a);
    float *b = malloc(T * N * sizeof *b);
    cr_assert(wc && a && b);
    memcpy(wc, w, N * K * sizeof *w);
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new_quantised(wc, N, K, &wp), SVC_OK);
    cr_expect(npu_wpack_is_int8(wp), "layout: %s", npu_matmul_name());
    cr_expect_eq(npu_wpack_bytes(wp), 2 * N * K + N * sizeof(float));
    npu_matmul_packed(x, wp, T, a);
    void *pk = pack(w, N, K);
    npu_matmul_i8_ref(x, pk, T, K, N, b);
    cr_expect(rel_err(a, b, T * N) <= 1e-6, "%g", rel_err(a, b, T * N));
    npu_wpack_free(wp);
    float *wc2 = malloc(N * K * sizeof *wc2);
    cr_assert(wc2);
    memcpy(wc2, w, N * K * sizeof *w);
    cr_assert_eq(npu_wpack_new(wc2, N, K, &wp), SVC_OK);
    cr_expect(!npu_wpack_is_int8(wp));
    npu_wpack_free(wp);
    free(x), free(w), free(pk), free(a), free(b);
}

/* D3_NPU_KERNELS=avx512-vnni (what a CPU without AMX gets): the AVX-512
 * kernels, plain packs on VDPBF16PS where the CPU has AVX512-BF16 (else
 * oneDNN's sgemm), quantised ones on VNNI with the int8
 * bytes, npu_matmul_packed giving the VNNI kernel's bits. (Each test runs
 * in its own process, so the dispatch is decided here.) */
Test(npu_i8, wpack_vnni_dispatch) {
    if (!have_vnni())
        cr_skip_test("no AVX-512 VNNI here");
    cr_assert_eq(setenv("D3_NPU_KERNELS", "avx512-vnni", 1), 0);
    rng_t  r = {0x6d};
    size_t T = 45, K = 200, N = 70;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float *wc = malloc(N * K * sizeof *wc), *a = outputs(T * N), *b = outputs(T * N);
    cr_assert(wc);
    memcpy(wc, w, N * K * sizeof *w);
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new_quantised(wc, N, K, &wp), SVC_OK);
    cr_assert_str_eq(npu_matmul_quantised_name(), "avx512-int8x3");
    cr_assert_str_eq(npu_matmul_name(), npu_probe()->avx512_bf16 ? "avx512-bf16x2" : "onednn-f32");
    cr_expect(!npu_amx_enabled());
    cr_expect(npu_wpack_is_int8(wp));
    cr_expect_eq(npu_wpack_bytes(wp), (npu_amx_i8_pack_bytes(N, K) + 63) / 64 * 64);
    npu_matmul_packed(x, wp, T, a);
    void *pk = pack(w, N, K);
    npu_matmul_vnni_i8(x, pk, T, K, N, b);
    cr_expect(memcmp(a, b, T * N * sizeof *a) == 0, "npu_matmul_packed is the VNNI kernel");
    npu_wpack_free(wp);
    memcpy(wc = malloc(N * K * sizeof *wc), w, N * K * sizeof *w);
    cr_assert_eq(npu_wpack_new(wc, N, K, &wp), SVC_OK);
    cr_expect(!npu_wpack_is_int8(wp), "a plain pack stays off the int8 layout");
    npu_wpack_free(wp);
    free(x), free(w), free(pk), free(a), free(b);
}
