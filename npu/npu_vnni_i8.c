/*
 * npu_vnni_i8.c -- the int8x3 projection matmul (npu_amx_i8.c's scheme and
 * weight layout) with AVX-512 VNNI instead of AMX tiles: what a CPU with
 * AVX-512 VNNI but no AMX (Ice Lake, Zen 4 and 5) runs for the weights a
 * package stored as Q4/Q8 ("avx512-int8x3"). Without it those weights
 * would be fp32 panels: twice the bytes of this layout (a nano q4nx
 * package would not fit issue 7's 6 GiB) and one FMA per 16 products
 * where VPDPBUSD does 64.
 *
 * The same integers as the AMX kernel, so the same bits:
 *  - the weight pack is npu_amx_i8_pack's: a tile row (64 bytes) holds,
 *    for 16 columns, the 4 bytes of k = 4r .. 4r + 3 -- exactly VPDPBUSD's
 *    second operand for one broadcast group of 4 activation bytes;
 *  - VPDPBUSD multiplies unsigned by signed bytes, where TDPBSSD multiplies
 *    signed by signed. The weight bytes become unsigned by flipping their
 *    top bit (w + 128) and the activations stay signed: sum (w + 128) x =
 *    sum w x + 128 sum x, so Chh = sum (wh + 128) xh - 128 sum xh and Cm =
 *    sum (wl + 128) xh + sum (wh + 128) xl - 128 (sum xh + sum xl), with
 *    the row sums taken when the row is quantised. int32 arithmetic wraps,
 *    and the true Chh and Cm fit (npu_amx_i8.c's bound), so they come out
 *    exact whatever the intermediate sums do;
 *  - the rows are quantised as npu_amx_i8.c's quant_rows does, and the
 *    final scaling is its finish(), operation for operation.
 * test_npu_i8 holds the two kernels to equal bits.
 *
 * Blocking: a chunk of MC = 512 rows is quantised once (row-major, Kp
 * bytes per row and plane). Items -- NPB = 4 panels of 32 columns, their
 * weights (~1.5 MiB at K = 6,144) kept in L2 -- go to the pool; an item
 * walks the chunk 6 rows at a time and, for each panel, runs a 6 x 32
 * micro-kernel over all of K: 24 accumulators (Chh and Cm of two
 * 16-column vectors per row), 4 weight vectors per 4 of K, the activation
 * groups broadcast from memory.
 *
 * Compiled for AVX-512 VNNI by the target pragma below; only called after
 * npu_probe() said avx512_vnni, avx512bw and avx512vl.
 */
#include "npu.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma"))),                  \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#endif

#include "npu_vec_int.h"

#define V_KB   64   /* K per tile of the pack */
#define V_TILE 1024 /* bytes per tile of the pack: 16 rows x 64 */
#define V_MC   512  /* rows per chunk */
#define V_NPB  4    /* panels (of 32 columns) per item */

static size_t round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

typedef struct v_job {
    const float  *x;
    const int8_t *pk;
    const float  *sw;
    size_t        T, K, N, Kp, n_kb, n_item;
    float        *out;
    /* the chunk in flight: rows [t0, t0 + mc); xh, xl (mc, Kp) signed
     * bytes, row-major; sh, sl their row sums; sx the row scales */
    size_t   t0, mc;
    int8_t  *xh, *xl;
    int32_t *sh, *sl;
    float   *sx;
} v_job_t;

/* Rows [16 i, 16 i + 16) of the chunk (those below mc) quantised as
 * npu_amx_i8.c's quant_rows does them (zero past K), with their sums. */
static void v_quant(void *ctx, size_t i) {
    const v_job_t *j = ctx;
    for (size_t r = 16 * i; r < 16 * i + 16 && r < j->mc; r++) {
        int8_t *xh = j->xh + r * j->Kp, *xl = j->xl + r * j->Kp;
        j->sx[r] = npu_i8_quant_row(j->x + (j->t0 + r) * j->K, j->K, j->Kp, xh, xl);
        __m512i sum_h = _mm512_setzero_si512(), sum_l = _mm512_setzero_si512();
        for (size_t k = 0; k < j->Kp; k += 16) {
            sum_h = _mm512_add_epi32(sum_h, npu_i8_widen16(xh + k));
            sum_l = _mm512_add_epi32(sum_l, npu_i8_widen16(xl + k));
        }
        j->sh[r] = _mm512_reduce_add_epi32(sum_h);
        j->sl[r] = _mm512_reduce_add_epi32(sum_l);
    }
}

/* One row's products for 4 of K: hh += wh xh; m += wl xh + wh xl (both
 * column halves). */
#define V_ROW(r)                                                                                   \
    do {                                                                                           \
        int32_t gh, gl;                                                                            \
        memcpy(&gh, ah + (r)*j->Kp + k, 4);                                                        \
        memcpy(&gl, al + (r)*j->Kp + k, 4);                                                        \
        __m512i xh = _mm512_set1_epi32(gh), xl = _mm512_set1_epi32(gl);                            \
        hh0_##r = _mm512_dpbusd_epi32(hh0_##r, wh0, xh);                                           \
        hh1_##r = _mm512_dpbusd_epi32(hh1_##r, wh1, xh);                                           \
        m0_##r = _mm512_dpbusd_epi32(m0_##r, wl0, xh);                                             \
        m1_##r = _mm512_dpbusd_epi32(m1_##r, wl1, xh);                                             \
        m0_##r = _mm512_dpbusd_epi32(m0_##r, wh0, xl);                                             \
        m1_##r = _mm512_dpbusd_epi32(m1_##r, wh1, xl);                                             \
    } while (0)
#define V_ZERO(r) __m512i hh0_##r = z, hh1_##r = z, m0_##r = z, m1_##r = z
#define V_FIN(r)                                                                                   \
    do {                                                                                           \
        v_finish(j, r0 + (r), hh0_##r, m0_##r, n0, cols);                                          \
        if (cols > 16)                                                                             \
            v_finish(j, r0 + (r), hh1_##r, m1_##r, n0 + 16, cols - 16);                            \
    } while (0)

/* Rows [r0, r0 + MR) of the chunk times panel pan (32 columns from n0,
 * cols of them real) into out, for MR = 1 .. 6 (a constant in each
 * instance). Written out row by row (NPU_ROWS6): with arrays and a loop
 * over the rows GCC kept the accumulators in memory (6 VPDPBUSD per row
 * per 4 of K, each a load and a store: 200-230 GFLOP/s on two Zen 5 cores
 * where the registers give ~1.5-2x that). Integer sums: the order does
 * not change the bits. */
#define V_MICRO(MR)                                                                                \
    static void v_micro_##MR(const void *job, size_t r0, size_t p, size_t n0, size_t cols) {       \
        const v_job_t *j = job;                                                                    \
        const int8_t  *pan = j->pk + p * j->n_kb * 4 * V_TILE;                                     \
        const __m512i  flip = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();            \
        V_ZERO(0);                                                                                 \
        V_ZERO(1);                                                                                 \
        V_ZERO(2);                                                                                 \
        V_ZERO(3);                                                                                 \
        V_ZERO(4);                                                                                 \
        V_ZERO(5);                                                                                 \
        const int8_t *ah = j->xh + r0 * j->Kp, *al = j->xl + r0 * j->Kp;                           \
        for (size_t kb = 0; kb < j->n_kb; kb++) {                                                  \
            const int8_t *bk = pan + kb * 4 * V_TILE;                                              \
            for (size_t q = 0; q < V_KB / 4; q++) {                                                \
                /* wh of columns 0..15, 16..31, then wl, as unsigned bytes w + 128 */              \
                __m512i wh0 = _mm512_xor_si512(_mm512_loadu_si512(bk + q * 64), flip);             \
                __m512i wh1 = _mm512_xor_si512(_mm512_loadu_si512(bk + V_TILE + q * 64), flip);    \
                __m512i wl0 =                                                                      \
                    _mm512_xor_si512(_mm512_loadu_si512(bk + 2 * V_TILE + q * 64), flip);          \
                __m512i wl1 =                                                                      \
                    _mm512_xor_si512(_mm512_loadu_si512(bk + 3 * V_TILE + q * 64), flip);          \
                size_t k = kb * V_KB + 4 * q;                                                      \
                NPU_ROWS6(MR, V_ROW);                                                              \
            }                                                                                      \
        }                                                                                          \
        NPU_ROWS6(MR, V_FIN);                                                                      \
    }

/* Row r of the chunk, 16 columns from n0 (cols of them real): the biased
 * sums corrected to Chh and Cm, then npu_amx_i8.c's finish(): out =
 * (256 Chh + Cm) (256 sx) sw. */
static void v_finish(const v_job_t *j, size_t r, __m512i hh, __m512i m, size_t n0, size_t cols) {
    __mmask16 mk = npu_mask16(cols);
    /* 128 times the sums, shifted in the vector: it wraps as the sums do */
    __m512i chh = _mm512_sub_epi32(hh, _mm512_slli_epi32(_mm512_set1_epi32(j->sh[r]), 7));
    __m512i cm = _mm512_sub_epi32(m, _mm512_slli_epi32(_mm512_set1_epi32(j->sh[r] + j->sl[r]), 7));
    __m512  sx = _mm512_set1_ps(j->sx[r] * 256.0f);
    __m512  v =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(chh), _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(cm));
    __m512 s = _mm512_mul_ps(sx, _mm512_maskz_loadu_ps(mk, j->sw + n0));
    _mm512_mask_storeu_ps(j->out + (j->t0 + r) * j->N + n0, mk, _mm512_mul_ps(v, s));
}

NPU_VNNI_MICROS(v, V_MICRO)

/* Item i: the chunk's rows times panels [i NPB, i NPB + NPB). */
static void v_item(void *ctx, size_t i) {
    const v_job_t *j = ctx;
    npu_vnni_item(j, j->mc, j->N, i * V_NPB, V_NPB, v_micros);
}

void npu_matmul_vnni_i8(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    if (npu_i8_trivial(T, K, N, out))
        return;
    SVC_ASSERT(K <= NPU_AMX_I8_MAX_K);
    size_t  n_pan = round_up(N, 32) / 32, Kp = round_up(K, V_KB);
    v_job_t j = {.x = x,
                 .pk = pk,
                 .sw = npu_i8_pack_scales(pk, N, K),
                 .T = T,
                 .K = K,
                 .N = N,
                 .Kp = Kp,
                 .n_kb = Kp / V_KB,
                 .n_item = (n_pan + V_NPB - 1) / V_NPB,
                 .out = out};
    size_t  chunk = T < V_MC ? T : V_MC;
    char   *a = npu_scratch(NPU_SCRATCH_MM_A, 2 * chunk * Kp + chunk * 3 * sizeof(float));
    if (!a) { /* out of memory: the scheme's reference needs none */
        npu_matmul_i8_ref(x, pk, T, K, N, out);
        return;
    }
    j.xh = (int8_t *)a;
    j.xl = (int8_t *)a + chunk * Kp;
    j.sh = (int32_t *)(void *)(a + 2 * chunk * Kp);
    j.sl = j.sh + chunk;
    j.sx = (float *)(void *)(j.sl + chunk);
    npu_vnni_chunks(&j, &j.t0, &j.mc, T, K, N, V_MC, v_quant, v_item, j.n_item);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
