/*
 * npu_vec_int.h -- private to npu/: the AVX-512 helpers more than one
 * kernel file needs (npu_avx512.c, npu_delta_fast.c, the AMX kernels),
 * written once.
 *
 * Include it after the file's target pragma (avx512f at least): the
 * functions below are compiled with the including file's ISA.
 */
#ifndef D3STREAM_NPU_VEC_INT_H
#define D3STREAM_NPU_VEC_INT_H

#include "npu.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* Lanes [0, n) of a 16-lane vector; 0 for n = 0. */
static inline __mmask16 npu_mask16(size_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* exp(x) for 16 lanes: x = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor
 * polynomial to degree 7 (truncation < 6e-9), times 2^n with scalef.
 * Inputs below -104 (and -inf) give 0, above 88.7 give +inf. */
static inline __m512 npu_exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.8f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* silu(x) = x / (1 + exp(-x)); exp(-x) saturates to +inf for x < -88.8,
 * which gives -0, as the exact value rounds to. Shared by npu_avx512.c
 * (npu_silu_mul_avx512, the gated norm, the conv) and the fused MLP of
 * npu_vnni_grp.c, which must give npu_silu_mul's bits. */
static inline __m512 npu_silu512(__m512 x) {
    __m512 e = npu_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* Qwen3_5MLP's activation on 16 lanes: silu(gate) * up, in that order
 * (npu_silu_mul_avx512 and the fused MLP's epilogue: one formula, the
 * same bits). */
static inline __m512 npu_silu_mul16(__m512 gate, __m512 up) {
    return _mm512_mul_ps(npu_silu512(gate), up);
}

/* The int8x3 scheme's quantisation (npu_amx_i8.c's header; also
 * npu_vnni_i8.c): a row of weights or activations as 16-bit integers of
 * one scale, each split into a high and a low signed byte. QMAX = 127 *
 * 256 + 127 keeps the high byte within int8. */
#define NPU_I8_QMAX 32639

/* The scale of a row xr (K): sx = max |x| / QMAX and 1 / sx (0, 0 for a
 * zero row). */
static inline void npu_i8_row_scale(const float *xr, size_t K, float *sx, float *inv) {
    __m512 m = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 16 <= K; k += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xr + k)));
    if (k < K)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(npu_mask16(K - k), xr + k)));
    float mx = _mm512_reduce_max_ps(m);
    *sx = mx / (float)NPU_I8_QMAX;
    *inv = mx > 0.0f ? (float)NPU_I8_QMAX / mx : 0.0f;
}

/* 16 values v (already times 1 / scale): q = round(v) (nearest even)
 * clamped to +-QMAX, split as 256 hi + lo, hi = (q + 128) >> 8, lo in
 * [-128, 127]: the high and the low bytes. */
static inline void npu_i8_split16_x16(__m512 v, __m128i *hi, __m128i *lo) {
    const __m512i lim = _mm512_set1_epi32(NPU_I8_QMAX), nlim = _mm512_set1_epi32(-NPU_I8_QMAX);
    __m512i       q = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(v), lim), nlim);
    __m512i       h = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(128)), 8);
    *hi = _mm512_cvtepi32_epi8(h);
    *lo = _mm512_cvtepi32_epi8(_mm512_sub_epi32(q, _mm512_slli_epi32(h, 8)));
}

/* Row xr (K) quantised as the int8x3 scheme does it: its scale (the
 * return value, sx = max |x| / QMAX) and its high and low bytes into xh
 * and xl (Kp >= K bytes each, a multiple of 16; zero past K). Shared by
 * the VNNI kernels (npu_vnni_i8.c, npu_vnni_grp.c), which take their row
 * or group sums from the bytes. */
static inline float npu_i8_quant_row(const float *xr, size_t K, size_t Kp, int8_t *xh, int8_t *xl) {
    float sx, inv;
    npu_i8_row_scale(xr, K, &sx, &inv);
    __m512 vi = _mm512_set1_ps(inv);
    for (size_t k = 0; k < Kp; k += 16) {
        size_t  left = k < K ? K - k : 0;
        __m128i h, l;
        npu_i8_split16_x16(
            _mm512_mul_ps(_mm512_maskz_loadu_ps(npu_mask16(left), left ? xr + k : xr), vi), &h, &l);
        _mm_storeu_si128((__m128i *)(void *)(xh + k), h);
        _mm_storeu_si128((__m128i *)(void *)(xl + k), l);
    }
    return sx;
}

/* 16 signed bytes at p widened to int32. */
static inline __m512i npu_i8_widen16(const int8_t *p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* OP(0), then OP(1) .. OP(MR - 1) for a constant MR <= 6: a micro-kernel's
 * rows written out one by one, so that GCC keeps each row's accumulators
 * in registers (npu_vnni_i8.c: with arrays and a loop it kept them in
 * memory). */
#define NPU_ROWS6(MR, OP)                                                                          \
    do {                                                                                           \
        OP(0);                                                                                     \
        if ((MR) > 1)                                                                              \
            OP(1);                                                                                 \
        if ((MR) > 2)                                                                              \
            OP(2);                                                                                 \
        if ((MR) > 3)                                                                              \
            OP(3);                                                                                 \
        if ((MR) > 4)                                                                              \
            OP(4);                                                                                 \
        if ((MR) > 5)                                                                              \
            OP(5);                                                                                 \
    } while (0)

/* A VNNI micro-kernel (npu_vnni_i8.c, npu_vnni_grp.c): rows [r0, r0 + MR)
 * of its job's chunk times panel pan (32 columns from n0, cols of them
 * real), MR fixed per instance. */
typedef void (*npu_vnni_micro_fn)(const void *job, size_t r0, size_t pan, size_t n0, size_t cols);

/* The six instances MICRO(1) .. MICRO(6), which define P##_micro_1 ..
 * P##_micro_6, and their table P##_micros for npu_vnni_item. */
#define NPU_VNNI_MICROS(P, MICRO)                                                                  \
    MICRO(1)                                                                                       \
    MICRO(2)                                                                                       \
    MICRO(3)                                                                                       \
    MICRO(4)                                                                                       \
    MICRO(5)                                                                                       \
    MICRO(6)                                                                                       \
    static const npu_vnni_micro_fn P##_micros[7] = {                                               \
        NULL, P##_micro_1, P##_micro_2, P##_micro_3, P##_micro_4, P##_micro_5, P##_micro_6};

/* One item of those kernels: the chunk's mc rows, 6 at a time (micros[mr]
 * for the last mr < 6), times panels [p0, p0 + npb) of the N columns'
 * panels of 32. The panels' weights stay in L2 across the row blocks. */
static inline void npu_vnni_item(const void *job, size_t mc, size_t N, size_t p0, size_t npb,
                                 const npu_vnni_micro_fn micros[7]) {
    size_t n_pan = (N + 31) / 32, np = n_pan - p0 < npb ? n_pan - p0 : npb;
    for (size_t r0 = 0; r0 < mc; r0 += 6) {
        size_t mr = mc - r0 < 6 ? mc - r0 : 6;
        for (size_t p = p0; p < p0 + np; p++)
            micros[mr](job, r0, p, p * 32, N - p * 32 < 32 ? N - p * 32 : 32);
    }
}

/* Items [0, n) of fn on the pool (par) or one after another on the
 * caller: below ~2 M multiply-adds the pool's wake-up costs more than it
 * gains, and the matmul kernels decide par from that. */
static inline void npu_run_items(bool par, size_t n, void (*fn)(void *ctx, size_t i), void *ctx) {
    if (par)
        npu_parallel_for(n, fn, ctx);
    else
        for (size_t i = 0; i < n; i++)
            fn(ctx, i);
}

/* The int8x3 product's trivial shapes (npu_matmul_amx_i8 and _vnni_i8):
 * nothing to write (T or N zero) or zeros (K zero). True when done. */
static inline bool npu_i8_trivial(size_t T, size_t K, size_t N, float *out) {
    if (T == 0 || N == 0)
        return true;
    if (K == 0)
        memset(out, 0, T * N * sizeof *out);
    return K == 0;
}

/* The column scales of an int8x3 pack of (N, K): after its tiles. */
static inline const float *npu_i8_pack_scales(const void *pk, size_t N, size_t K) {
    return (const float *)(const void *)((const char *)pk + npu_amx_i8_pack_bytes(N, K) -
                                         (N + 31) / 32 * 32 * sizeof(float));
}

/* The VNNI kernels' outer loop: the T rows in chunks of mc <= MC (*t0,
 * *mc: the job's fields, set before each chunk), each quantised in
 * parallel (quant, one item per 16 rows) and then multiplied by the
 * n_item items (item), over the pool when the product is large enough. */
static inline void npu_vnni_chunks(void *job, size_t *t0, size_t *mc, size_t T, size_t K, size_t N,
                                   size_t MC, void (*quant)(void *, size_t),
                                   void (*item)(void *, size_t), size_t n_item) {
    bool par = (double)T * (double)N * (double)K >= 2e6;
    for (*t0 = 0; *t0 < T; *t0 += MC) {
        *mc = T - *t0 < MC ? T - *t0 : MC;
        npu_run_items(par, (*mc + 15) / 16, quant, job);
        npu_run_items(par, n_item, item, job);
    }
}

#endif /* D3STREAM_NPU_VEC_INT_H */
