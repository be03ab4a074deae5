/*
 * npu_avx512_bf16.c -- the projection matmul on AVX512-BF16's VDPBF16PS
 * (npu.h, npu_matmul_bf16_avx512, "avx512-bf16x2"): what bf16 weights run
 * on where the CPU has AVX512-BF16 but no usable AMX tiles (Zen 4 and 5,
 * Cooper Lake).
 *
 * Why not oneDNN's fp32 sgemm there, as before: the weights stay bf16, half
 * the bytes (the nano BF16 package's peak RSS 7.5 GiB -> ~3.9, under issue
 * 7's 6 GiB) and half the traffic of the few-row passes, which stream
 * every weight from memory; and VDPBF16PS does 32 multiply-adds where an
 * fp32 FMA does 16 (measured on a Zen 5 EPYC: 431 against 214 GFLOP/s per
 * thread, register-resident), so with the activations split in two (below)
 * the products cost what sgemm's do.
 *
 * The weight pack is the AMX-BF16 one (npu_amx_pack_bf16): a 1 KiB tile
 * row r holds, for 16 output columns, the pair (w[c][k], w[c][k + 1]) at
 * k = 32 kb + 2 r -- exactly VDPBF16PS's 64-byte operand for one pair of
 * k, the other operand being that pair of one activation row broadcast.
 * The activations are split into hi = bf16(x) and lo = bf16(x - hi), as
 * the AMX kernel does (npu.h: why one bf16 rounding is not enough), and
 * both products accumulate in the same fp32 registers.
 *
 * Blocking: a chunk of up to MC rows is converted once, in parallel, into row
 * blocks of MR = 6 rows whose pairs are interleaved (pair q of the block:
 * the hi of its 6 rows, then their lo: one 48-byte run per q, so the
 * micro-kernel's broadcasts come from one pointer at fixed offsets).
 * Items -- two panels of 32 columns, 64 columns -- go to the pool; an item
 * walks the chunk one row block at a time, each a 6 x 64 micro-kernel over
 * all of K: 24 accumulators stay in registers for the whole of K and are
 * stored once; per pair, 4 weight vectors and 12 broadcasts feed 48
 * VDPBF16PS. The item's weights (64 x K bf16: 256 KiB at K = 2,048, 768
 * KiB at 6,144) stay in L2 across the row blocks, a row block (24 x K
 * bytes) in L1 and L2 across its 4 weight vectors.
 *
 * Each output element is the same sum in the same order whatever T and
 * the chunking are (pair by pair over K, hi then lo): a row's result does
 * not depend on the other rows, as the batched passes want.
 *
 * Compiled for AVX512-BF16 by the target pragma below; only called after
 * npu_probe() said avx512_bf16, avx512bw and avx512vl.
 */
#include "npu.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))),                  \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#endif

#include "npu_vec_int.h"

#define B_KB   32  /* K per tile of the pack (16 pairs) */
#define B_TILE 512 /* bf16 per tile: 16 pairs x 16 columns x 2 */
#define B_MR   6   /* rows per micro-kernel */
/* Rows per chunk at most (86 row blocks). Why not 504 = 84 x 6: the
 * engine's layers run 512 rows at a time, and a 504 + 8 split streams
 * every weight a second time for the 8 rows. */
#define B_MC 516

static size_t round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

typedef struct b_job {
    const float    *x;
    const uint16_t *pk;
    size_t          T, K, N, Kp, n_kb, n_pan;
    float          *out;
    /* the chunk in flight: rows [t0, t0 + mc); a = its row blocks, each
     * Kp / 2 pairs of w32 uint32 (the 6 rows' hi, then their lo when
     * split) */
    size_t    t0, mc;
    uint32_t *a;
    size_t    w32;
    bool      split;
} b_job_t;

/* Row block i of the chunk: rows past mc and pairs past K are zeros. */
static void b_convert(void *ctx, size_t i) {
    const b_job_t *j = ctx;
    uint32_t      *blk = j->a + i * (j->Kp / 2) * j->w32;
    for (size_t m = 0; m < B_MR; m++) {
        size_t       row = i * B_MR + m;
        const float *xr = row < j->mc ? j->x + (j->t0 + row) * j->K : NULL;
        for (size_t k = 0; k < j->Kp; k += 16) {
            size_t    left = xr && k < j->K ? j->K - k : 0;
            __mmask16 mk = npu_mask16(left);
            /* A masked load reads nothing past the mask. */
            __m512   v = _mm512_maskz_loadu_ps(mk, left ? xr + k : j->x);
            __m256i  h = (__m256i)_mm512_cvtneps_pbh(v);
            uint32_t hp[8], lp[8];
            _mm256_storeu_si256((__m256i *)hp, h);
            if (j->split) {
                /* v - hi is exact in fp32; its bf16 leaves ~2^-17 of v. */
                __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                _mm256_storeu_si256((__m256i *)lp,
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf)));
            }
            uint32_t *q = blk + (k / 2) * j->w32 + m;
            for (size_t p = 0; p < 8; p++) {
                q[p * j->w32] = hp[p];
                if (j->split)
                    q[p * j->w32 + B_MR] = lp[p];
            }
        }
    }
}

/* acc (6 rows x 16 NV columns) = the row block a times NV / 2 panels of
 * the pack starting at b (panel after panel pstride apart), over n_kb K
 * blocks; lo products too when SPLIT. One function per (NV, SPLIT),
 * written out row by row: with loops over rows and vectors GCC kept the
 * accumulators in memory (9 VDPBF16PS in the whole item, 5x slower). */
#define B_DP(m, x, NV)                                                                             \
    do {                                                                                           \
        c##m##0 = _mm512_dpbf16_ps(c##m##0, w0, x);                                                \
        c##m##1 = _mm512_dpbf16_ps(c##m##1, w1, x);                                                \
        if (NV == 4) {                                                                             \
            c##m##2 = _mm512_dpbf16_ps(c##m##2, w2, x);                                            \
            c##m##3 = _mm512_dpbf16_ps(c##m##3, w3, x);                                            \
        }                                                                                          \
    } while (0)
#define B_ROW(m, NV, SPLIT)                                                                        \
    do {                                                                                           \
        B_DP(m, (__m512bh)_mm512_set1_epi32((int)aq[m]), NV);                                      \
        if (SPLIT)                                                                                 \
            B_DP(m, (__m512bh)_mm512_set1_epi32((int)aq[B_MR + m]), NV);                           \
    } while (0)
#define B_ZERO(m) __m512 c##m##0 = z, c##m##1 = z, c##m##2 = z, c##m##3 = z
#define B_OUT(m)                                                                                   \
    do {                                                                                           \
        acc[m][0] = c##m##0, acc[m][1] = c##m##1, acc[m][2] = c##m##2, acc[m][3] = c##m##3;        \
    } while (0)
#define B_MICRO(name, NV, SPLIT)                                                                   \
    static void name(const uint32_t *a, const uint16_t *b, size_t pstride, size_t n_kb,            \
                     __m512 acc[B_MR][4]) {                                                        \
        const size_t w32 = (SPLIT) ? 2 * B_MR : B_MR;                                              \
        const __m512 z = _mm512_setzero_ps();                                                      \
        B_ZERO(0);                                                                                 \
        B_ZERO(1);                                                                                 \
        B_ZERO(2);                                                                                 \
        B_ZERO(3);                                                                                 \
        B_ZERO(4);                                                                                 \
        B_ZERO(5);                                                                                 \
        for (size_t q = 0; q < n_kb * 16; q++) {                                                   \
            const uint16_t *bq = b + q / 16 * 2 * B_TILE + q % 16 * 32;                            \
            const uint32_t *aq = a + q * w32;                                                      \
            __m512bh        w0 = (__m512bh)_mm512_loadu_si512(bq);                                 \
            __m512bh        w1 = (__m512bh)_mm512_loadu_si512(bq + B_TILE), w2 = w0, w3 = w1;      \
            if (NV == 4) {                                                                         \
                w2 = (__m512bh)_mm512_loadu_si512(bq + pstride);                                   \
                w3 = (__m512bh)_mm512_loadu_si512(bq + pstride + B_TILE);                          \
            }                                                                                      \
            B_ROW(0, NV, SPLIT);                                                                   \
            B_ROW(1, NV, SPLIT);                                                                   \
            B_ROW(2, NV, SPLIT);                                                                   \
            B_ROW(3, NV, SPLIT);                                                                   \
            B_ROW(4, NV, SPLIT);                                                                   \
            B_ROW(5, NV, SPLIT);                                                                   \
        }                                                                                          \
        B_OUT(0);                                                                                  \
        B_OUT(1);                                                                                  \
        B_OUT(2);                                                                                  \
        B_OUT(3);                                                                                  \
        B_OUT(4);                                                                                  \
        B_OUT(5);                                                                                  \
    }

B_MICRO(b_micro_4s, 4, 1)
B_MICRO(b_micro_4, 4, 0)
B_MICRO(b_micro_2s, 2, 1)
B_MICRO(b_micro_2, 2, 0)

/* acc's rows below mr and columns below nc into out (row stride ld). */
static void b_store(__m512 acc[B_MR][4], int nv, size_t mr, size_t nc, float *out, size_t ld) {
    for (size_t m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) {
            size_t c0 = (size_t)v * 16;
            if (c0 >= nc)
                break;
            _mm512_mask_storeu_ps(out + m * ld + c0, npu_mask16(nc - c0), acc[m][v]);
        }
}

/* Item i: the chunk's rows times panels 2 i and 2 i + 1 (or the last one
 * alone). */
static void b_item(void *ctx, size_t i) {
    const b_job_t  *j = ctx;
    size_t          p0 = 2 * i, np = j->n_pan - p0 < 2 ? 1 : 2;
    size_t          n0 = p0 * 32, nc = j->N - n0 < np * 32 ? j->N - n0 : np * 32;
    size_t          pstride = j->n_kb * 2 * B_TILE;
    const uint16_t *b = j->pk + p0 * pstride;
    __m512          acc[B_MR][4];
    for (size_t r0 = 0; r0 < j->mc; r0 += B_MR) {
        const uint32_t *a = j->a + (r0 / B_MR) * (j->Kp / 2) * j->w32;
        size_t          mr = j->mc - r0 < B_MR ? j->mc - r0 : B_MR;
        if (np == 2 && j->split)
            b_micro_4s(a, b, pstride, j->n_kb, acc);
        else if (np == 2)
            b_micro_4(a, b, pstride, j->n_kb, acc);
        else if (j->split)
            b_micro_2s(a, b, pstride, j->n_kb, acc);
        else
            b_micro_2(a, b, pstride, j->n_kb, acc);
        b_store(acc, (int)np * 2, mr, nc, j->out + (j->t0 + r0) * j->N + n0, j->N);
    }
}

/* Without scratch (an allocation failed): the same products, one at a
 * time, in fp32 (split) or on the bf16-rounded inputs. Slow, but the
 * matmul never fails. */
static void b_scalar(const b_job_t *j) {
    for (size_t t = 0; t < j->T; t++)
        for (size_t n = 0; n < j->N; n++) {
            float s = 0;
            for (size_t k = 0; k < j->K; k++) {
                float xv = j->x[t * j->K + k];
                s += (j->split ? xv : npu_bf16_to_f32(npu_f32_to_bf16(xv))) *
                     npu_amx_pack_at(j->pk, j->K, n, k);
            }
            j->out[t * j->N + n] = s;
        }
}

void npu_matmul_bf16_avx512(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N,
                            bool split, float *out) {
    if (T == 0 || N == 0)
        return;
    if (K == 0) {
        memset(out, 0, T * N * sizeof *out);
        return;
    }
    size_t  Kp = round_up(K, B_KB), n_pan = round_up(N, 32) / 32;
    b_job_t j = {.x = x,
                 .pk = pk,
                 .T = T,
                 .K = K,
                 .N = N,
                 .Kp = Kp,
                 .n_kb = Kp / B_KB,
                 .n_pan = n_pan,
                 .out = out,
                 .w32 = split ? 2 * B_MR : B_MR,
                 .split = split};
    /* Equal chunks: 1,000 rows are 500 + 500, not 516 + 484. */
    size_t n_chunk = (T + B_MC - 1) / B_MC, chunk = round_up((T + n_chunk - 1) / n_chunk, B_MR);
    j.a = npu_scratch(NPU_SCRATCH_MM_A, chunk / B_MR * (Kp / 2) * j.w32 * sizeof *j.a);
    if (!j.a) {
        b_scalar(&j);
        return;
    }
    /* Below ~2 M multiply-adds the pool's wake-up costs more than it gains. */
    bool par = (double)T * (double)N * (double)K >= 2e6;
    for (j.t0 = 0; j.t0 < T; j.t0 += chunk) {
        j.mc = T - j.t0 < chunk ? T - j.t0 : chunk;
        npu_run_items(par, round_up(j.mc, B_MR) / B_MR, b_convert, &j);
        npu_run_items(par, (n_pan + 1) / 2, b_item, &j);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
