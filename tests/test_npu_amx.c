/*
 * test_npu_amx.c -- the bf16 packed matmuls, on AMX-BF16 tiles
 * (npu_amx_mm.c) and on AVX512-BF16's VDPBF16PS (npu_avx512_bf16.c, the
 * same pack), and the kernels' thread pool (npu_pool.c).
 *
 * Each matmul is held to two oracles: the exact (double) product of the
 * bf16-rounded operands, which it must meet to fp32 accumulation error
 * (1e-5 relative), and the fp32 product of the unrounded ones, which it
 * meets to bf16 rounding (1e-2, the bound npu.h states). Tests skip on a
 * CPU without the instructions (the dispatch then never picks the kernel).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

static bool have_amx(void) {
    const npu_features_t *f = npu_probe();
    return f->amx_bf16 && f->amx_usable && f->avx512_bf16;
}

static bool have_bf16(void) {
    const npu_features_t *f = npu_probe();
    return f->avx512_bf16 && f->avx512bw && f->avx512vl;
}

typedef void (*mm_t)(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N, bool split,
                     float *out);

static float bf16_round(float v) {
    return npu_bf16_to_f32(npu_f32_to_bf16(v));
}

/* out = bf16(x) bf16(w)^T in double, or x bf16(w)^T (round_x false). */
static void matmul_bf16_exact(const float *x, const float *w, size_t T, size_t K, size_t N,
                              bool round_x, float *out) {
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < N; n++) {
            double s = 0;
            for (size_t k = 0; k < K; k++)
                s += (double)(round_x ? bf16_round(x[t * K + k]) : x[t * K + k]) *
                     (double)bf16_round(w[n * K + k]);
            out[t * N + n] = (float)s;
        }
}

static uint16_t *pack(const float *w, size_t N, size_t K) {
    uint16_t *pk = aligned_alloc(64, (npu_amx_pack_elems(N, K) * 2 + 63) / 64 * 64 + 64);
    cr_assert(pk);
    npu_amx_pack_bf16(w, N, K, pk);
    return pk;
}

/* Both precisions: one bf16 product (against bf16(x) bf16(w)^T) and the
 * hi + lo split (against x bf16(w)^T), each to fp32 accumulation error;
 * both within the bf16 bound of the fp32 product: each element within 2 x
 * 2^-8 (bf16's unit roundoff) of sum |x| |w| (not of the element, which may
 * cancel). */
static void check(mm_t mm, rng_t *r, size_t T, size_t K, size_t N) {
    float    *x = rand_vec(r, T * K, -1, 1), *w = rand_vec(r, N * K, -1, 1);
    uint16_t *pk = pack(w, N, K);
    float    *a = malloc((T * N + 1) * sizeof *a), *b = malloc((T * N + 1) * sizeof *b);
    float    *c = malloc((T * N + 1) * sizeof *c), *c_abs = malloc((T * N + 1) * sizeof *c_abs);
    float    *xa = malloc((T * K + 1) * sizeof *xa), *wa = malloc((N * K + 1) * sizeof *wa);
    cr_assert(a && b && c && c_abs && xa && wa);
    npu_matmul_ref(x, w, T, K, N, c);
    for (size_t i = 0; i < T * K; i++)
        xa[i] = fabsf(x[i]);
    for (size_t i = 0; i < N * K; i++)
        wa[i] = fabsf(w[i]);
    npu_matmul_ref(xa, wa, T, K, N, c_abs);
    for (int split = 0; split < 2; split++) {
        for (size_t i = 0; i < T * N; i++)
            a[i] = NAN; /* an output the kernel forgot shows up */
        mm(x, pk, T, K, N, split, a);
        matmul_bf16_exact(x, w, T, K, N, !split, b);
        double e = rel_err(a, b, T * N), e32 = 0;
        for (size_t i = 0; i < T * N; i++) {
            double d = fabs((double)a[i] - c[i]) / (c_abs[i] + 1e-6);
            e32 = isnan(a[i]) ? INFINITY : d > e32 ? d : e32;
        }
        cr_expect(e <= 1e-5, "split=%d T=%zu K=%zu N=%zu: %g from its exact product", split, T, K,
                  N, e);
        cr_expect(e32 <= 0x1p-7,
                  "split=%d T=%zu K=%zu N=%zu: %g of sum |x||w| from the fp32 product", split, T, K,
                  N, e32);
    }
    free(x), free(w), free(pk), free(a), free(b), free(c), free(c_abs), free(xa), free(wa);
}

/* Row counts around the tiles' 16 and the micro-kernels' 6, K around a
 * pack block (32), N around a panel (32) and a pair of them. */
static void shapes(mm_t mm) {
    rng_t        r = {0xa3};
    const size_t Ts[] = {1, 5, 6, 7, 15, 16, 17, 32, 33, 257};
    const size_t Ks[] = {1, 31, 32, 33, 100, 300};
    const size_t Ns[] = {1, 16, 31, 32, 33, 64, 65, 129, 130};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++)
                check(mm, &r, Ts[i], Ks[j], Ns[l]);
}

/* Several row chunks (512 rows for the tiles, up to 516 for VDPBF16PS) and column
 * items, K blocks with a tail, large enough to go through the pool. */
static void blocked(mm_t mm) {
    rng_t r = {0xb4};
    check(mm, &r, 600, 1000, 300);
    check(mm, &r, 513, 2048, 64);
    check(mm, &r, 1009, 96, 96);
    check(mm, &r, 40, 6144, 200);
}

/* A row's result does not depend on the rows around it or on T: the
 * prefix sharing of the scheduler relies on it (bit-identical). */
static void rows_independent(mm_t mm) {
    rng_t     r = {0xc5};
    size_t    T = 300, K = 520, N = 70;
    float    *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    uint16_t *pk = pack(w, N, K);
    float    *all = malloc(T * N * sizeof *all), *part = malloc(T * N * sizeof *part);
    cr_assert(all && part);
    for (int split = 0; split < 2; split++) {
        mm(x, pk, T, K, N, split, all);
        mm(x, pk, 37, K, N, split, part);
        mm(x + 37 * K, pk, 1, K, N, split, part + 37 * N);
        mm(x + 38 * K, pk, T - 38, K, N, split, part + 38 * N);
        cr_expect(memcmp(all, part, T * N * sizeof *all) == 0, "split=%d: rows differ", split);
    }
    free(x), free(w), free(pk), free(all), free(part);
}

Test(npu_amx, shapes) {
    if (!have_amx())
        cr_skip_test("no usable AMX-BF16 here");
    shapes(npu_matmul_amx);
}

Test(npu_amx, blocked_and_parallel) {
    if (!have_amx())
        cr_skip_test("no usable AMX-BF16 here");
    blocked(npu_matmul_amx);
}

Test(npu_amx, rows_independent) {
    if (!have_amx())
        cr_skip_test("no usable AMX-BF16 here");
    rows_independent(npu_matmul_amx);
}

Test(npu_bf16, shapes) {
    if (!have_bf16())
        cr_skip_test("no AVX512-BF16 here");
    shapes(npu_matmul_bf16_avx512);
}

Test(npu_bf16, blocked_and_parallel) {
    if (!have_bf16())
        cr_skip_test("no AVX512-BF16 here");
    blocked(npu_matmul_bf16_avx512);
}

Test(npu_bf16, rows_independent) {
    if (!have_bf16())
        cr_skip_test("no AVX512-BF16 here");
    rows_independent(npu_matmul_bf16_avx512);
}

/* The dispatched pack: the default layout here is AMX with the split
 * activations, at half the bytes of fp32, and npu_matmul_packed runs it. */
static void check_wpack(bool split) {
    rng_t  r = {0xd6};
    size_t T = 70, K = 64, N = 96;
    float *x = rand_vec(&r, T * K, -1, 1), *w = rand_vec(&r, N * K, -1, 1);
    float *wc = malloc(N * K * sizeof *wc), *a = malloc(T * N * sizeof *a);
    float *b = malloc(T * N * sizeof *b);
    cr_assert(wc && a && b);
    memcpy(wc, w, N * K * sizeof *w);
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new(wc, N, K, &wp), SVC_OK);
    cr_expect_eq(npu_wpack_bytes(wp), N * K * sizeof(uint16_t));
    npu_matmul_packed(x, wp, T, a);
    matmul_bf16_exact(x, w, T, K, N, !split, b);
    cr_expect(rel_err(a, b, T * N) <= 1e-5, "split=%d: %g", split, rel_err(a, b, T * N));
    npu_wpack_free(wp);
    free(x), free(w), free(a), free(b);
}

Test(npu_amx, wpack_default) {
    if (!have_amx() || !npu_probe()->avx512f)
        cr_skip_test("no usable AMX-BF16 here");
    cr_assert_eq(unsetenv("D3_NPU_KERNELS"), 0);
    cr_assert_eq(unsetenv("D3_NPU_MATMUL"), 0);
    cr_assert_str_eq(npu_matmul_name(), "amx-bf16x2");
    check_wpack(true);
}

Test(npu_amx, wpack_one_product) {
    if (!have_amx() || !npu_probe()->avx512f)
        cr_skip_test("no usable AMX-BF16 here");
    cr_assert_eq(unsetenv("D3_NPU_KERNELS"), 0);
    cr_assert_eq(setenv("D3_NPU_MATMUL", "bf16", 1), 0);
    cr_assert_str_eq(npu_matmul_name(), "amx-bf16");
    check_wpack(false);
}

/* Without AMX (D3_NPU_KERNELS=avx512-bf16 says so on a CPU that has it; a
 * Zen 4 gets it by default): the same pack on VDPBF16PS, the split by
 * default, one product with D3_NPU_MATMUL=bf16, fp32 sgemm with
 * D3_NPU_MATMUL=onednn. (Each test runs in its own process.) */
static void check_wpack_bf16(const char *mm, const char *name, bool split) {
    if (!have_bf16())
        cr_skip_test("no AVX512-BF16 here");
    cr_assert_eq(setenv("D3_NPU_KERNELS", "avx512-bf16", 1), 0);
    if (mm)
        cr_assert_eq(setenv("D3_NPU_MATMUL", mm, 1), 0);
    else
        cr_assert_eq(unsetenv("D3_NPU_MATMUL"), 0);
    cr_assert_str_eq(npu_matmul_name(), name);
    cr_expect(!npu_amx_enabled());
    check_wpack(split);
}

Test(npu_bf16, wpack_split) {
    check_wpack_bf16(NULL, "avx512-bf16x2", true);
}

Test(npu_bf16, wpack_one_product) {
    check_wpack_bf16("bf16", "avx512-bf16", false);
}

Test(npu_bf16, wpack_onednn_stays) {
    if (!have_bf16())
        cr_skip_test("no AVX512-BF16 here");
    cr_assert_eq(setenv("D3_NPU_KERNELS", "avx512-bf16", 1), 0);
    cr_assert_eq(setenv("D3_NPU_MATMUL", "onednn", 1), 0);
    cr_expect_str_eq(npu_matmul_name(), "onednn-f32");
}

/* A hand case: out[t] = (x0, x1 + x2) with values exact in bf16. */
Test(npu_amx, hand) {
    if (!have_amx())
        cr_skip_test("no usable AMX-BF16 here");
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6}, w[2 * 3] = {1, 0, 0, 0, 1, 1};
    uint16_t   *pk = pack(w, 2, 3);
    float       out[4];
    npu_matmul_amx_bf16(x, pk, 2, 3, 2, out);
    cr_expect(out[0] == 1 && out[1] == 5 && out[2] == 4 && out[3] == 11, "%g %g %g %g",
              (double)out[0], (double)out[1], (double)out[2], (double)out[3]);
    free(pk);
}

Test(npu_bf16, hand) {
    if (!have_bf16())
        cr_skip_test("no AVX512-BF16 here");
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6}, w[2 * 3] = {1, 0, 0, 0, 1, 1};
    uint16_t   *pk = pack(w, 2, 3);
    float       out[4];
    for (int split = 0; split < 2; split++) {
        npu_matmul_bf16_avx512(x, pk, 2, 3, 2, split, out);
        cr_expect(out[0] == 1 && out[1] == 5 && out[2] == 4 && out[3] == 11, "%g %g %g %g",
                  (double)out[0], (double)out[1], (double)out[2], (double)out[3]);
    }
    free(pk);
}

/* ---- pool ------------------------------------------------------------------ */

typedef struct hits {
    atomic_int *count;
    size_t      n;
} hits_t;

static void hit(void *ctx, size_t i) {
    hits_t *h = ctx;
    cr_assert_lt(i, h->n);
    atomic_fetch_add(&h->count[i], 1);
}

static void expect_each_once(size_t n) {
    atomic_int *count = calloc(n + 1, sizeof *count);
    cr_assert(count);
    hits_t h = {count, n};
    npu_parallel_for(n, hit, &h);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(atomic_load(&count[i]), 1, "item %zu of %zu ran %d times", i, n,
                     atomic_load(&count[i]));
    free(count);
}

Test(npu_pool, every_item_once) {
    cr_expect_geq(npu_threads(), 1);
    const size_t ns[] = {0, 1, 2, 3, 7, 64, 1000};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        expect_each_once(ns[i]);
}

/* A nested call inside an item completes (no deadlock, every item once). */
static void nested(void *ctx, size_t i) {
    (void)i;
    atomic_int *outer = ctx;
    expect_each_once(17);
    atomic_fetch_add(outer, 1);
}

Test(npu_pool, nested_calls) {
    atomic_int outer = 0;
    npu_parallel_for(9, nested, &outer);
    cr_expect_eq(atomic_load(&outer), 9);
}

/* Several threads calling at once (as the scheduler's workers do). */
static void *caller(void *arg) {
    (void)arg;
    for (int r = 0; r < 50; r++)
        expect_each_once(33);
    return NULL;
}

Test(npu_pool, concurrent_callers) {
    pthread_t th[6];
    for (int i = 0; i < 6; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, caller, NULL), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(th[i], NULL);
}

/* Calls back to back and calls after the pool threads have gone back to
 * sleep: the pool threads spin a while for the next job before they block
 * (npu_pool.c), so both ways of being woken must lose nothing. */
Test(npu_pool, back_to_back_and_after_sleep) {
    for (int r = 0; r < 2000; r++)
        expect_each_once(1 + (size_t)r % 9);
    for (int r = 0; r < 5; r++) {
        struct timespec ts = {0, 3 * 1000 * 1000}; /* 3 ms: past the spin */
        nanosleep(&ts, NULL);
        expect_each_once(64);
    }
}

/* D3_NPU_THREADS=1: no pool threads, everything on the caller. */
Test(npu_pool, one_thread) {
    cr_assert_eq(setenv("D3_NPU_THREADS", "1", 1), 0);
    cr_expect_eq(npu_threads(), 1);
    expect_each_once(100);
}
