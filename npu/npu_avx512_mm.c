/*
 * npu_avx512_mm.c -- the AVX-512 matmul on packed weights (npu.h,
 * npu_matmul_panels_avx512): w is stored as K-major panels of
 * NPU_WPACK_NR = 32 output columns, so that a row of out accumulates as
 *   out[t, n .. n + 32) += x[t, k] * panel[k][0 .. 32)
 * one broadcast and two FMAs per k, no horizontal sums (the plain-layout
 * kernel in npu_avx512.c reduces 16 dot products per tile, which dominates
 * at the tiny model's K = 64).
 *
 * Compiled for AVX-512 by the target pragma below (after the includes, as
 * npu_avx512.c does: CMakeLists.txt builds every npu/ source with the
 * baseline flags).
 */
#include "npu.h"

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))),    \
                             apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

_Static_assert(NPU_WPACK_NR == 32, "the tile below holds two vectors of columns");

/* Rows of x per register tile: MMP_MR x 32 outputs = 16 accumulators; per
 * k, 2 panel loads and 8 broadcasts feed 16 FMAs. */
#define MMP_MR 8
/* K in blocks of this many (a panel's slice is 256 * 32 * 4 = 32 KiB, L1
 * resident while the rows of an MMP_MC block go by); partial sums are added
 * into out between blocks. */
#define MMP_KC 256
/* Rows of x per block (64 rows * 256 * 4 = 64 KiB of x, in L2, reused by
 * every panel). */
#define MMP_MC 64

/* Lanes [0, n) of a 16-lane vector; 0 for n = 0. */
static inline __mmask16 mmp_mask(size_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* out[0 .. mr)[cols in m0|m1] (+)= x[0 .. mr)[0 .. kc) panel[0 .. kc)[32];
 * x rows are ldx apart, out rows ldo apart. Called with a constant mr, so
 * that the accumulators stay in registers. */
static inline __attribute__((always_inline)) void mmp_tile(const float *x, size_t ldx,
                                                           const float *pan, size_t kc, float *out,
                                                           size_t ldo, int mr, int nv, __mmask16 m0,
                                                           __mmask16 m1, bool add) {
    __m512 c0[MMP_MR], c1[MMP_MR];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    for (size_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(pan + k * NPU_WPACK_NR);
        __m512 b1 = nv == 2 ? _mm512_loadu_ps(pan + k * NPU_WPACK_NR + 16) : b0;
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
            c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
            if (nv == 2)
                c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        float *o = out + (size_t)r * ldo;
        if (add) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, o));
            if (nv == 2)
                c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, o + 16));
        }
        _mm512_mask_storeu_ps(o, m0, c0[r]);
        if (nv == 2)
            _mm512_mask_storeu_ps(o + 16, m1, c1[r]);
    }
}

/* One tile of mr rows, mr in [1, MMP_MR], and nv vectors of columns (1
 * when at most 16 columns are left: the panel's zero half is skipped);
 * each case with constants. */
#define MMP_CASE(n)                                                                                \
    case n:                                                                                        \
        if (nv == 2)                                                                               \
            mmp_tile(x, ldx, pan, kc, out, ldo, n, 2, m0, m1, add);                                \
        else                                                                                       \
            mmp_tile(x, ldx, pan, kc, out, ldo, n, 1, m0, m1, add);                                \
        break

static void mmp_tile_n(const float *x, size_t ldx, const float *pan, size_t kc, float *out,
                       size_t ldo, size_t mr, int nv, __mmask16 m0, __mmask16 m1, bool add) {
    switch (mr) {
        MMP_CASE(8);
        MMP_CASE(7);
        MMP_CASE(6);
        MMP_CASE(5);
        MMP_CASE(4);
        MMP_CASE(3);
        MMP_CASE(2);
    default:
        MMP_CASE(1);
    }
}

void npu_matmul_panels_avx512(const float *x, const float *panels, size_t T, size_t K, size_t N,
                              float *out) {
    if (T == 0 || N == 0)
        return;
    if (K == 0) {
        memset(out, 0, T * N * sizeof *out);
        return;
    }
    size_t n_pan = (N + NPU_WPACK_NR - 1) / NPU_WPACK_NR;
    for (size_t k0 = 0; k0 < K; k0 += MMP_KC) {
        size_t kc = K - k0 < MMP_KC ? K - k0 : MMP_KC;
        bool   add = k0 > 0;
        for (size_t t0 = 0; t0 < T; t0 += MMP_MC) {
            size_t t1 = T - t0 < MMP_MC ? T : t0 + MMP_MC;
            for (size_t p = 0; p < n_pan; p++) {
                size_t       n0 = p * NPU_WPACK_NR, nrem = N - n0;
                __mmask16    m0 = mmp_mask(nrem), m1 = mmp_mask(nrem > 16 ? nrem - 16 : 0);
                int          nv = nrem > 16 ? 2 : 1;
                const float *pan = panels + p * K * NPU_WPACK_NR + k0 * NPU_WPACK_NR;
                for (size_t t = t0; t < t1; t += MMP_MR) {
                    size_t mr = t1 - t < MMP_MR ? t1 - t : MMP_MR;
                    mmp_tile_n(x + t * K + k0, K, pan, kc, out + t * N + n0, N, mr, nv, m0, m1,
                               add);
                }
            }
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
