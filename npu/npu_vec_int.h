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

#include <immintrin.h>
#include <stddef.h>

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

#endif /* D3STREAM_NPU_VEC_INT_H */
