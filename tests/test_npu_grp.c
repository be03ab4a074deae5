/*
 * test_npu_grp.c -- the matmul on a package's own group codes
 * (npu_vnni_grp.c, "avx512-grp8x2") and npu_wpack_new_groups's choice.
 *
 * Two oracles: npu_matmul_grp_ref, the same integers and fp32 steps in
 * scalar code, which the VNNI kernel must meet bit for bit; and the fp32
 * product of the activations with the dequantised weight (d u + m), which
 * both meet to the activations' 16-bit rounding (measured <= 3e-5 here,
 * held to 2e-4, int8x3's bound in test_npu_i8.c). The kernel's checks skip
 * on a CPU without AVX-512 VNNI; the reference's run everywhere.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

static bool have_vnni(void) {
    const npu_features_t *f = npu_probe();
    return f->avx512_vnni && f->avx512bw && f->avx512vl;
}

/* A group-coded weight: codes below cmax + 1, scales and mins as a Q4_1
 * tile holds them (d > 0, m < 0). */
typedef struct grp_w {
    size_t   N, K, G;
    uint8_t *u;
    float   *d, *m;
} grp_w_t;

static grp_w_t grp_rand(rng_t *r, size_t N, size_t K, unsigned cmax) {
    grp_w_t g = {N, K, (K + NPU_GRP_K - 1) / NPU_GRP_K, NULL, NULL, NULL};
    g.u = malloc(N * K + 1);
    g.d = rand_vec(r, N * g.G, 0.001f, 0.02f);
    g.m = rand_vec(r, N * g.G, -0.2f, 0.0f);
    cr_assert(g.u);
    for (size_t i = 0; i < N * K; i++)
        g.u[i] = (uint8_t)(rng_uniform(r, 0.0f, (float)cmax + 0.999f));
    return g;
}

static void grp_free(grp_w_t *g) {
    free(g->u), free(g->d), free(g->m);
}

/* w = d u + m, (N, K) fp32. */
static float *grp_dense(const grp_w_t *g) {
    float *w = malloc(g->N * g->K * sizeof *w + 1);
    cr_assert(w);
    for (size_t n = 0; n < g->N; n++)
        for (size_t k = 0; k < g->K; k++) {
            size_t s = n * g->G + k / NPU_GRP_K;
            w[n * g->K + k] = g->d[s] * (float)g->u[n * g->K + k] + g->m[s];
        }
    return w;
}

static void *grp_packed(const grp_w_t *g) {
    void *pk = aligned_alloc(64, npu_grp_pack_bytes(g->N, g->K) + 64);
    cr_assert(pk);
    npu_grp_pack(g->u, g->d, g->m, g->N, g->K, pk);
    return pk;
}

/* Reference and kernel (where the CPU has it) against the fp32 product,
 * and against each other bit for bit. */
static void check(rng_t *r, size_t T, size_t K, size_t N, unsigned cmax) {
    grp_w_t g = grp_rand(r, N, K, cmax);
    float  *x = rand_vec(r, T * K, -1, 1), *w = grp_dense(&g);
    void   *pk = grp_packed(&g);
    float  *ref = nans(T * N), *c = nans(T * N), *v = nans(T * N);
    npu_matmul_grp_ref(x, pk, T, K, N, ref);
    npu_matmul_ref(x, w, T, K, N, c);
    double e = rel_err(ref, c, T * N);
    cr_expect(e <= 2e-4, "ref T=%zu K=%zu N=%zu: %g from the fp32 product", T, K, N, e);
    if (have_vnni()) {
        npu_matmul_vnni_grp(x, pk, T, K, N, v);
        cr_expect(memcmp(v, ref, T * N * sizeof *v) == 0,
                  "T=%zu K=%zu N=%zu: the kernel differs from its reference (%g)", T, K, N,
                  rel_err(v, ref, T * N));
    }
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k += 7)
            cr_expect(npu_grp_pack_at(pk, K, n, k) == w[n * K + k], "pack_at n=%zu k=%zu", n, k);
    grp_free(&g);
    free(x), free(w), free(pk), free(ref), free(c), free(v);
}

Test(npu_grp, shapes) {
    rng_t        r = {0x61};
    const size_t Ts[] = {1, 5, 6, 7, 13, 33};
    const size_t Ks[] = {1, 31, 32, 33, 100, 256};
    const size_t Ns[] = {1, 16, 31, 32, 33, 130};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++)
                check(&r, Ts[i], Ks[j], Ns[l], 15);
}

/* 8-bit codes (a Q8 tile's, offset by 128): the int32 sums' worst case. */
Test(npu_grp, eight_bit_codes) {
    rng_t r = {0x72};
    check(&r, 9, 2048, 48, 255);
    grp_w_t g = grp_rand(&r, 16, 64, 255);
    memset(g.u, 255, 16 * 64);
    float *x = rand_vec(&r, 2 * 64, 1, 1), *w = grp_dense(&g);
    void  *pk = grp_packed(&g);
    float *ref = nans(2 * 16), *c = nans(2 * 16);
    npu_matmul_grp_ref(x, pk, 2, 64, 16, ref);
    npu_matmul_ref(x, w, 2, 64, 16, c);
    cr_expect(rel_err(ref, c, 2 * 16) <= 2e-4, "all codes 255, x = 1: %g", rel_err(ref, c, 32));
    grp_free(&g);
    free(x), free(w), free(pk), free(ref), free(c);
}

/* grp8's rounding bound for out[t][n]: each activation moves by at most
 * half its group's step, max |x_g| / 254, times its weight; plus fp32's
 * share of the sum of |x w|. */
static double grp8_bound(const float *x, const float *w, size_t K, size_t t, size_t n) {
    double b = 0, mag = 0;
    for (size_t g0 = 0; g0 < K; g0 += NPU_GRP_K) {
        double mx = 0;
        for (size_t k = g0; k < K && k < g0 + NPU_GRP_K; k++)
            mx = fmax(mx, fabs(x[t * K + k]));
        for (size_t k = g0; k < K && k < g0 + NPU_GRP_K; k++) {
            b += fabs(w[n * K + k]) * mx / 254.0;
            mag += fabs(w[n * K + k] * x[t * K + k]);
        }
    }
    return 1.001 * b + 1e-5 * mag + 1e-30;
}

/* grp8 (one activation byte per value, a scale per row and group): the
 * kernel against its reference bit for bit, the reference against the
 * fp32 product within the bytes' rounding bound (grp8_bound). */
static void check8(rng_t *r, size_t T, size_t K, size_t N) {
    grp_w_t g = grp_rand(r, N, K, 15);
    float  *x = rand_vec(r, T * K, -1, 1), *w = grp_dense(&g);
    void   *pk = grp_packed(&g);
    float  *ref = nans(T * N), *c = nans(T * N), *v = nans(T * N);
    npu_matmul_grp8_ref(x, pk, T, K, N, ref);
    npu_matmul_ref(x, w, T, K, N, c);
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < N; n++) {
            double e = fabs((double)ref[t * N + n] - c[t * N + n]), b = grp8_bound(x, w, K, t, n);
            if (!(e <= b))
                cr_assert_fail("grp8 ref T=%zu K=%zu N=%zu (%zu, %zu): %g vs %g, past the bound %g",
                               T, K, N, t, n, (double)ref[t * N + n], (double)c[t * N + n], b);
        }
    if (have_vnni()) {
        npu_matmul_vnni_grp8(x, pk, T, K, N, v);
        cr_expect(memcmp(v, ref, T * N * sizeof *v) == 0,
                  "grp8 T=%zu K=%zu N=%zu: the kernel differs from its reference (%g)", T, K, N,
                  rel_err(v, ref, T * N));
    }
    grp_free(&g);
    free(x), free(w), free(pk), free(ref), free(c), free(v);
}

Test(npu_grp, grp8) {
    rng_t        r = {0xc7};
    const size_t Ts[] = {1, 6, 7, 33};
    const size_t Ks[] = {1, 31, 32, 33, 100, 256, 544, 1000};
    const size_t Ns[] = {1, 16, 33, 130};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++)
            for (size_t l = 0; l < sizeof Ns / sizeof Ns[0]; l++)
                check8(&r, Ts[i], Ks[j], Ns[l]);
    check8(&r, 520, 2048, 70);
}

/* Several row chunks (512) and items (4 panels), through the pool. */
Test(npu_grp, blocked_and_parallel) {
    rng_t r = {0x83};
    check(&r, 520, 2048, 70, 15);
    check(&r, 40, 6144, 200, 15);
}

/* A zero row gives zeros; a tiny and a huge row keep their own scale. */
Test(npu_grp, row_scales) {
    rng_t   r = {0x94};
    size_t  T = 8, K = 96, N = 40;
    grp_w_t g = grp_rand(&r, N, K, 15);
    float  *x = rand_vec(&r, T * K, -1, 1), *w = grp_dense(&g);
    for (size_t k = 0; k < K; k++) {
        x[1 * K + k] = 0.0f;
        x[2 * K + k] *= 1e-6f;
        x[3 * K + k] *= 1e5f;
    }
    void  *pk = grp_packed(&g);
    float *a = nans(T * N), *c = nans(T * N);
    if (have_vnni())
        npu_matmul_vnni_grp(x, pk, T, K, N, a);
    else
        npu_matmul_grp_ref(x, pk, T, K, N, a);
    npu_matmul_ref(x, w, T, K, N, c);
    for (size_t t = 0; t < T; t++)
        cr_expect(rel_err(a + t * N, c + t * N, N) <= 2e-4 || t == 2, "row %zu: %g", t,
                  rel_err(a + t * N, c + t * N, N));
    /* row 2's values are ~1e-6: rel_err's floor (1e-3) hides them */
    double big = 0, diff = 0;
    for (size_t n = 0; n < N; n++) {
        big = fmax(big, fabs(c[2 * N + n]));
        diff = fmax(diff, fabs(a[2 * N + n] - c[2 * N + n]));
    }
    cr_expect(diff <= 2e-4 * big, "tiny row: %g of %g", diff, big);
    for (size_t n = 0; n < N; n++)
        cr_expect(a[1 * N + n] == 0.0f, "zero row, column %zu: %g", n, a[1 * N + n]);
    grp_free(&g);
    free(x), free(w), free(pk), free(a), free(c);
}

/* A row's result does not depend on the rows around it or on T
 * (bit-identical): prefix sharing relies on it. */
Test(npu_grp, rows_independent) {
    if (!have_vnni())
        cr_skip_test("no AVX-512 VNNI here");
    rng_t   r = {0xa5};
    size_t  T = 600, K = 2100, N = 70;
    grp_w_t g = grp_rand(&r, N, K, 15);
    float  *x = rand_vec(&r, T * K, -1, 1);
    void   *pk = grp_packed(&g);
    float  *all = nans(T * N), *part = nans(T * N);
    npu_matmul_vnni_grp(x, pk, T, K, N, all);
    npu_matmul_vnni_grp(x, pk, 37, K, N, part);
    npu_matmul_vnni_grp(x + 37 * K, pk, 1, K, N, part + 37 * N);
    npu_matmul_vnni_grp(x + 38 * K, pk, T - 38, K, N, part + 38 * N);
    cr_expect(memcmp(all, part, T * N * sizeof *all) == 0, "rows differ");
    grp_free(&g);
    free(x), free(pk), free(all), free(part);
}

/* The dispatch: on VNNI without AMX the codes stay (a byte each, plus d
 * and m per 32) and npu_matmul_packed runs the kernel; elsewhere the
 * dequantised weight takes the quantised layout, whose product with the
 * same values it then is. */
Test(npu_grp, wpack_new_groups) {
    rng_t   r = {0xb6};
    size_t  T = 20, K = 160, N = 96;
    grp_w_t g = grp_rand(&r, N, K, 15);
    float  *x = rand_vec(&r, T * K, -1, 1), *w = grp_dense(&g);
    void   *pk = grp_packed(&g);
    float  *a = nans(T * N), *b = nans(T * N);
    /* the pack takes u, d and m */
    npu_wpack_t *wp;
    cr_assert_eq(npu_wpack_new_groups(g.u, g.d, g.m, N, K, &wp), SVC_OK);
    npu_matmul_packed(x, wp, T, a);
    if (strcmp(npu_matmul_groups_name(), "avx512-grp8x2") == 0) {
        cr_expect(npu_wpack_is_int8(wp));
        cr_expect_eq(npu_wpack_bytes(wp), npu_grp_pack_bytes(N, K));
        cr_expect_eq(npu_grp_pack_bytes(N, K), N * K + 2 * N * g.G * sizeof(float));
        npu_matmul_grp_ref(x, pk, T, K, N, b);
        cr_expect(memcmp(a, b, T * N * sizeof *a) == 0, "packed product differs from the ref");
    } else {
        float *wc = malloc(N * K * sizeof *wc);
        cr_assert(wc);
        memcpy(wc, w, N * K * sizeof *w);
        npu_wpack_t *wq;
        cr_assert_eq(npu_wpack_new_quantised(wc, N, K, &wq), SVC_OK);
        npu_matmul_packed(x, wq, T, b);
        cr_expect(memcmp(a, b, T * N * sizeof *a) == 0, "not the quantised pack's product");
        npu_wpack_free(wq);
    }
    npu_wpack_free(wp);
    free(x), free(w), free(pk), free(a), free(b);
}

/* grp8 over several weights of one x (npu_matmul_vnni_grp8_n): each output
 * bit for bit the single call's, across row chunks (T past the kernel's
 * 512-row chunk), small and large N mixed (a Gated DeltaNet's 16 gate
 * columns beside its wide projection), and through the packs'
 * npu_matmul_packed_fast_n. */
Test(npu_grp, grp8_shared_quantisation) {
    if (!have_vnni())
        cr_skip_test("no AVX-512 VNNI");
    rng_t        r = {0x5a};
    const size_t Ts[] = {1, 7, 600}, K = 96, Ns[] = {130, 16, 16, 48};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        size_t      T = Ts[ti];
        grp_w_t     g[4];
        void       *pk[4];
        float      *one[4], *all[4];
        float      *x = rand_vec(&r, T * K, -1, 1);
        const void *cpk[4];
        for (int i = 0; i < 4; i++) {
            g[i] = grp_rand(&r, Ns[i], K, 15);
            cpk[i] = pk[i] = grp_packed(&g[i]);
            one[i] = nans(T * Ns[i]);
            all[i] = nans(T * Ns[i]);
            npu_matmul_vnni_grp8(x, pk[i], T, K, Ns[i], one[i]);
        }
        npu_matmul_vnni_grp8_n(x, T, K, 4, cpk, Ns, all);
        for (int i = 0; i < 4; i++)
            cr_expect(memcmp(one[i], all[i], T * Ns[i] * sizeof *one[i]) == 0,
                      "T=%zu weight %d: shared quantisation differs from its own call", T, i);
        /* the packs' entry point: the same bits as npu_matmul_packed_fast */
        npu_wpack_t *wp[4];
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(npu_wpack_new_groups(g[i].u, g[i].d, g[i].m, Ns[i], K, &wp[i]), SVC_OK);
            g[i].u = NULL, g[i].d = g[i].m = NULL; /* the pack took them */
            npu_matmul_packed_fast(x, wp[i], T, one[i]);
        }
        npu_matmul_packed_fast_n(x, T, 4, (const npu_wpack_t *const *)wp, all);
        for (int i = 0; i < 4; i++) {
            cr_expect(memcmp(one[i], all[i], T * Ns[i] * sizeof *one[i]) == 0,
                      "T=%zu pack %d: npu_matmul_packed_fast_n differs", T, i);
            npu_wpack_free(wp[i]);
            grp_free(&g[i]);
            free(pk[i]), free(one[i]), free(all[i]);
        }
        free(x);
    }
}

/* The fused MLP (npu_mlp_vnni_grp8) against its three calls: gate and up
 * sharing x's quantisation, npu_silu_mul, down; out (T, N = K) bit for
 * bit. Row 1 (when there) is zero: its groups' scales are 0. */
static void check_mlp(rng_t *r, size_t T, size_t K, size_t F) {
    size_t  N = K;
    grp_w_t g = grp_rand(r, F, K, 15), u = grp_rand(r, F, K, 15), d = grp_rand(r, N, F, 15);
    float  *x = rand_vec(r, T * K, -2, 2);
    if (T > 2)
        memset(x + K, 0, K * sizeof *x);
    void        *gp = grp_packed(&g), *up = grp_packed(&u), *dp = grp_packed(&d);
    float       *ga = nans(T * F), *ub = nans(T * F), *ref = nans(T * N), *fused = nans(T * N);
    const void  *pk[2] = {gp, up};
    const size_t Ns[2] = {F, F};
    npu_matmul_vnni_grp8_n(x, T, K, 2, pk, Ns, (float *const[]){ga, ub});
    npu_silu_mul(ga, ub, T, F, ga);
    npu_matmul_vnni_grp8(ga, dp, T, F, N, ref);
    cr_assert(npu_mlp_vnni_grp8(x, T, K, F, N, gp, up, dp, fused), "T=%zu K=%zu F=%zu: not run", T,
              K, F);
    cr_expect(memcmp(ref, fused, T * N * sizeof *ref) == 0,
              "T=%zu K=%zu F=%zu: the fused MLP differs from its three calls", T, K, F);
    grp_free(&g), grp_free(&u), grp_free(&d);
    free(x), free(gp), free(up), free(dp), free(ga), free(ub), free(ref), free(fused);
}

/* Rows across the 512-row chunk, K and F not multiples of 32 (F's last
 * group is part of a panel: its columns past F are zero, as g8_quant's
 * masked loads make them), the nano's 6144 through the pool. */
Test(npu_grp, mlp_fused) {
    if (!have_vnni())
        cr_skip_test("no AVX-512 VNNI");
    rng_t        r = {0x3c};
    const size_t Ts[] = {1, 5, 6, 7, 33, 520};
    const size_t KF[][2] = {{32, 32}, {100, 64}, {256, 96}, {256, 100}, {2048, 32}, {100, 6144}};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof KF / sizeof KF[0]; j++)
            check_mlp(&r, Ts[i], KF[j][0], KF[j][1]);
    check_mlp(&r, 33, 2048, 6144);
    check_mlp(&r, 520, 256, 6144);
}

/* npu_mlp_fast on group-coded packs (fused here) and on packs of values
 * (their Q8_0 companions: fused too where npu_fast_usable()): the bits of
 * npu_matmul_packed_fast_n, npu_silu_mul and npu_matmul_packed_fast. */
Test(npu_grp, mlp_fast_packs) {
    rng_t        r = {0x4d};
    const size_t Ts[] = {1, 7, 520}, K = 96, F = 160, N = 64;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        size_t       T = Ts[ti];
        float       *x = rand_vec(&r, T * K, -2, 2);
        grp_w_t      g = grp_rand(&r, F, K, 15), u = grp_rand(&r, F, K, 15);
        npu_wpack_t *wg, *wu, *wd;
        cr_assert_eq(npu_wpack_new_groups(g.u, g.d, g.m, F, K, &wg), SVC_OK);
        cr_assert_eq(npu_wpack_new_groups(u.u, u.d, u.m, F, K, &wu), SVC_OK);
        cr_assert_eq(npu_wpack_new(rand_vec(&r, N * F, -0.1f, 0.1f), N, F, &wd), SVC_OK);
        float *ga = nans(T * F), *ub = nans(T * F), *ref = nans(T * N), *out = nans(T * N);
        npu_matmul_packed_fast_n(x, T, 2, (const npu_wpack_t *const[]){wg, wu},
                                 (float *const[]){ga, ub});
        npu_silu_mul(ga, ub, T, F, ga);
        npu_matmul_packed_fast(ga, wd, T, ref);
        npu_mlp_fast(x, T, wg, wu, wd, ga, ub, out);
        cr_expect(memcmp(ref, out, T * N * sizeof *ref) == 0, "T=%zu: npu_mlp_fast differs", T);
        npu_wpack_free(wg), npu_wpack_free(wu), npu_wpack_free(wd);
        free(x), free(ga), free(ub), free(ref), free(out);
    }
}
