/*
 * npu_delta_fast.c -- the gated delta rule in chunks of NPU_DELTA_CHUNK
 * tokens as small matrix products (npu.h,
 * npu_delta_rule_chunked_avx512), for prefill.
 *
 * The recurrent kernel (npu_avx512.c) does 3 dk dv multiply-adds per token
 * and head, but each one streams the whole state through L1 with a short
 * FMA chain, so it runs at about a fifth of the FMA peak. The chunked form
 * does the same 3 dk dv per token plus ~C (dk + dv) / 2 for the
 * intra-chunk part (~1.3x the work at d = 128), as matrix products whose
 * accumulators stay in registers, at about half the peak or more.
 *
 * It follows npu_delta_rule_chunked_ref (npu_ref_delta.c, after
 * torch_chunk_gated_delta_rule) with one change of association. Instead of
 *   U = T (beta v),  W = T (beta exp(gc) k),  Vn = U - W S
 * with T = (I + L)^-1, it computes
 *   Vn = T (beta (v - exp(gc) (k S)))
 * (T is linear), so k S comes out of the same product as q S, and only one
 * (C, dv) right-hand side goes through T. T itself is formed explicitly by
 * forward substitution on the identity (C^3 / 6 FMAs, small next to the
 * C dk dv ones), so that applying it is a register-blocked product too.
 *
 * Per chunk of n <= C tokens of one value head, with S the (dk, dv) state:
 *   G   = [k; q] k^T                       (lower triangle only)
 *   L   = beta_i G_k,ij exp(gc_i - gc_j)   (j < i)
 *   A   = scale G_q,ij exp(gc_i - gc_j)    (j <= i)
 *   T   = (I + L)^-1
 *   P   = [k; q] S                         (old state)
 *   out = scale exp(gc) P_q + A Vn,  Vn = T (beta (v - exp(gc) P_k))
 *   S   = exp(gc_last) S + sum_j k_j (exp(gc_last - gc_j) Vn_j)^T
 * Value heads are independent: runs of them are split over the kernel
 * pool (npu_parallel_for), each run with its own chunk scratch (O(C d)
 * floats); the states are one (n_v_heads, dk, dv) array. Nothing is O(T).
 *
 * Where the CPU has AMX-BF16 (and the head sizes are multiples of 32), the
 * two biggest products, [k; q] S and the state update, run on AMX tiles
 * in three bf16 products of split operands (see "AMX-BF16" below): ~1e-5
 * of the references instead of ~1e-6, within the tests' 1e-4.
 *
 * Compiled for AVX-512 by the target pragma below (after the includes, as
 * in npu_avx512_mm.c: CMakeLists.txt builds every npu/ source with the
 * baseline flags); the AMX functions have a pragma of their own and run
 * only after npu_probe() said amx_bf16, avx512_bf16 and amx_usable.
 */
#include "npu.h"

#include <immintrin.h>
#include <math.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))),    \
                             apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

#define DC NPU_DELTA_CHUNK
_Static_assert(DC % 16 == 0 && DC <= 64, "T rows are at most 4 vectors");

/* Where the recurrent kernel wins, and npu_delta_rule_pick_avx512 hands
 * the call to it:
 *  - below DELTA_MIN_CHUNKED tokens a chunk's fixed costs (the Gram
 *    product, T, the epilogues) are not paid back: on the model's 16/16
 *    heads of 128 the recurrent one is faster up to T = 4, even at 6-8,
 *    and 1.2-1.5x slower from 12 on (one thread);
 *  - below DELTA_MIN_DIM (dk or dv) the intra-chunk work, ~C (dk + dv) / 2
 *    per token, outweighs the 3 dk dv of the recurrent form, whose state
 *    slice then lives in registers: at d = 16 (the tiny model) it is 4-7x
 *    faster than the chunked one even on two threads; at d = 64 it is
 *    1.4x faster on one thread, 1.4x slower on two. */
#ifndef DELTA_MIN_CHUNKED
#define DELTA_MIN_CHUNKED 8
#endif
#define DELTA_MIN_DIM 64

/* A register tile: GM_MR rows by GM_NV vectors (16 GM_NV columns) of
 * accumulators; per k, GM_NV loads of B and GM_MR broadcasts of A feed
 * GM_MR GM_NV FMAs. 6 x 4 (24 accumulators, 10 loads per 24 FMAs) beat
 * 8 x 2, 8 x 3 and 4 x 4 on the products here by 10-20% (a (dv = 128)
 * row of B is two tiles). Overridable for such measurements. */
#ifndef GM_MR
#define GM_MR 6
#endif
#ifndef GM_NV
#define GM_NV 4
#endif

/* Lanes [0, n) of a 16-lane vector; 0 for n <= 0. */
static inline __mmask16 dmask(long n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u);
}

#include "npu_vec_int.h"

/* ---- small matrix products ------------------------------------------------ */

/* gemm flags: the k range of a row tile stops at its last row (A lower
 * triangular: entries right of the diagonal are zeros, not read); column
 * blocks right of a row tile's last row are skipped (only the lower
 * triangle of C is wanted); C = cb C + A B instead of C = A B. */
#define GM_TRI_K 1u
#define GM_TRI_N 2u
#define GM_ADD   4u

/* A tile's accumulators, zeroed (all GM_MR x GM_NV: those of a smaller
 * tile are never read, so the compiler drops their zeroing). */
static inline __attribute__((always_inline)) void gm_zero(__m512 acc[GM_MR][GM_NV]) {
    _Pragma("GCC unroll 16") for (int r = 0; r < GM_MR; r++) {
        _Pragma("GCC unroll 4") for (int v = 0; v < GM_NV; v++) {
            acc[r][v] = _mm512_setzero_ps();
        }
    }
}

/* A tile's accumulators into C[0 .. mr)[cols]: C = acc, or cb C + acc. */
static inline __attribute__((always_inline)) void gm_store(int mr, int nv, __m512 acc[GM_MR][GM_NV],
                                                           float *c, size_t ldc, const __mmask16 *m,
                                                           bool add, float cb) {
    __m512 vb = _mm512_set1_ps(cb);
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            __m512 x = acc[r][v];
            if (add)
                x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[v], cr + 16 * v), x);
            _mm512_mask_storeu_ps(cr + 16 * v, m[v], x);
        }
    }
}

/* CALL(R, V) with R = mr and V = nv as constants (so that a tile's
 * accumulators stay in registers): the dispatch of gm_tile_any and
 * gb_tile_any. */
#define GM_NV_CASE(CALL, R, V)                                                                     \
    case V:                                                                                        \
        CALL(R, V);                                                                                \
        break;
#define GM_CASE(CALL, R)                                                                           \
    case R:                                                                                        \
        switch (nv) {                                                                              \
            GM_NV_CASE(CALL, R, 1)                                                                 \
            GM_NV_CASE(CALL, R, 2)                                                                 \
            GM_NV_CASE(CALL, R, 3)                                                                 \
            GM_NV_CASE(CALL, R, 4)                                                                 \
        default:                                                                                   \
            SVC_ASSERT(!"tile too wide");                                                          \
        }                                                                                          \
        break;
#if GM_MR > 6
#define GM_CASES_7_8(CALL) GM_CASE(CALL, 7) GM_CASE(CALL, 8)
#else
#define GM_CASES_7_8(CALL)
#endif
#if GM_MR > 4
#define GM_CASES_5_8(CALL) GM_CASE(CALL, 5) GM_CASE(CALL, 6) GM_CASES_7_8(CALL)
#else
#define GM_CASES_5_8(CALL)
#endif
#define GM_DISPATCH(CALL)                                                                          \
    switch (mr) {                                                                                  \
        GM_CASE(CALL, 1)                                                                           \
        GM_CASE(CALL, 2)                                                                           \
        GM_CASE(CALL, 3)                                                                           \
        GM_CASE(CALL, 4)                                                                           \
        GM_CASES_5_8(CALL)                                                                         \
    default:                                                                                       \
        SVC_ASSERT(!"row tile too tall");                                                          \
    }

/* C[0 .. mr)[cols] (cb C +)= sum_k A(r, k) B[k][cols] for one tile of mr
 * rows and nv vectors of columns (lane masks m[0 .. nv)); A(r, k) is
 * a[r * sa + k * sk], so A may be read transposed. mr and nv are
 * constants at every call, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void gm_tile(int mr, int nv, const float *a, size_t sa,
                                                          size_t sk, const float *b, size_t ldb,
                                                          size_t kc, float *c, size_t ldc,
                                                          const __mmask16 *m, bool add, float cb) {
    __m512 acc[GM_MR][GM_NV];
    gm_zero(acc);
    for (size_t k = 0; k < kc; k++) {
        __m512 bv[GM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = _mm512_maskz_loadu_ps(m[v], b + k * ldb + 16 * v);
        const float *ak = a + k * sk;
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            __m512 av = _mm512_set1_ps(ak[(size_t)r * sa]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    gm_store(mr, nv, acc, c, ldc, m, add, cb);
}

/* One row tile, dispatched to a constant mr and nv. */
static void gm_tile_any(size_t mr, int nv, const float *a, size_t sa, size_t sk, const float *b,
                        size_t ldb, size_t kc, float *c, size_t ldc, const __mmask16 *m, bool add,
                        float cb) {
#define GM_CALL(R, V) gm_tile(R, V, a, sa, sk, b, ldb, kc, c, ldc, m, add, cb)
    GM_DISPATCH(GM_CALL)
#undef GM_CALL
}

/* The column block of C from j0 (of n columns): its vectors (at most
 * GM_NV) and their lane masks into mk. gemm's and gemm_bf's. */
static int gm_cols(size_t n, size_t j0, __mmask16 mk[GM_NV]) {
    long left = (long)(n - j0);
    for (int v = 0; v < GM_NV; v++)
        mk[v] = dmask(left - 16 * v);
    return left >= 16 * GM_NV ? GM_NV : (int)((left + 15) / 16);
}

/* C (m, n) (cb C +)= A (m, k) B (k, n) with A(i, k) = a[i * sa + k * sk],
 * B rows ldb apart, C rows ldc apart; flags as above. Column blocks of
 * 16 GM_NV outside, row tiles inside, so the (k, 16 GM_NV) slice of B
 * stays in L1 while the row tiles go by. */
static void gemm(size_t m, size_t n, size_t k, const float *a, size_t sa, size_t sk, const float *b,
                 size_t ldb, float *c, size_t ldc, unsigned flags, float cb) {
    for (size_t j0 = 0; j0 < n; j0 += 16 * GM_NV) {
        __mmask16 mk[GM_NV];
        int       nv = gm_cols(n, j0, mk);
        for (size_t i0 = 0; i0 < m; i0 += GM_MR) {
            size_t mr = m - i0 < GM_MR ? m - i0 : GM_MR;
            int    tv = nv;
            if (flags & GM_TRI_N) { /* only the vectors up to the tile's last row */
                if (j0 >= i0 + mr)
                    continue;
                size_t need = (i0 + mr - j0 + 15) / 16;
                tv = need < (size_t)nv ? (int)need : nv;
            }
            size_t kc = k;
            if ((flags & GM_TRI_K) && i0 + mr < kc)
                kc = i0 + mr;
            gm_tile_any(mr, tv, a + i0 * sa, sa, sk, b + j0, ldb, kc, c + i0 * ldc + j0, ldc, mk,
                        (flags & GM_ADD) != 0, cb);
        }
    }
}

/* ---- one value head ------------------------------------------------------- */

/* Scratch of one item for one chunk (reused by each of its heads), in
 * floats; every array starts on a 64-byte boundary. */
typedef struct delta_ws {
    float *KQ; /* (2C, dk) rows 0 .. n: the chunk's k, rows n .. 2n: its q */
    float *KT; /* (dk, C) k^T */
    float *G;  /* (2C, C) [k; q] k^T, then L (rows 0 .. n) and A (n .. 2n) */
    float *Ti; /* (C, C) T = (I + L)^-1, zeros right of the diagonal */
    float *P;  /* (2C, dv) [k; q] S */
    float *U;  /* (C, dv) beta (v - exp(gc) k S) */
    float *Vn; /* (C, dv) v_new = T U */
    float *gc; /* (C) cumulative log decay in the chunk */
    float *eg; /* (C) exp(gc) */
    /* The two operands of one product in bf16, (2C, dk) + (dk, dv) or
     * (dk, C) + (C, dv) of each, as uint16_t: their hi and lo parts on
     * AMX, hi only for the fast profile's one product. */
    uint16_t *bf;
} delta_ws_t;

static size_t ws_round(size_t n) {
    return (n + 15) / 16 * 16;
}

/* The AMX operands, in floats: [k; q] and S for P, or k^T and Vn for the
 * state update, each as bf16 hi and lo. */
static size_t amx_bf_floats(size_t dk, size_t dv) {
    size_t p = 2 * DC * dk + dk * dv, u = DC * dk + DC * dv;
    return p > u ? p : u;
}

static size_t ws_floats(size_t dk, size_t dv) {
    return ws_round(2 * DC * dk) + ws_round(dk * DC) + 2 * DC * DC + DC * DC +
           ws_round(2 * DC * dv) + 2 * ws_round(DC * dv) + 2 * DC + ws_round(amx_bf_floats(dk, dv));
}

static void ws_carve(delta_ws_t *ws, float *p, size_t dk, size_t dv) {
    ws->KQ = p, p += ws_round(2 * DC * dk);
    ws->KT = p, p += ws_round(dk * DC);
    ws->G = p, p += 2 * DC * DC;
    ws->Ti = p, p += DC * DC;
    ws->P = p, p += ws_round(2 * DC * dv);
    ws->U = p, p += ws_round(DC * dv);
    ws->Vn = p, p += ws_round(DC * dv);
    ws->gc = p, p += DC;
    ws->eg = p, p += DC;
    ws->bf = (uint16_t *)p;
}

typedef struct delta_job {
    const float *q, *k, *v, *g, *beta;
    size_t       T, n_k_heads, n_v_heads, dk, dv;
    const float *state_in;
    float       *state_out, *out;
    float       *states;  /* (n_v_heads, dk, dv) fp32 states during the call */
    float       *scratch; /* n_items * ws_floats(dk, dv) */
    size_t       heads_per_item;
    float        scale;
    bool         amx;  /* the two big products on AMX tiles (below) */
    bool         bf16; /* else, as one bf16 product each (the fast profile) */
} delta_job_t;

/* dst[c][r] = src[r][c] for r < rows, c < cols (both <= 16); dst columns
 * r >= rows get zeros. Eight rounds of unpack/shuffle instead of 256
 * scalar stores with a stride. */
static void transpose16(const float *src, size_t lds, size_t rows, size_t cols, float *dst,
                        size_t ldd) {
    __m512    r[16], t[16];
    __mmask16 cm = dmask((long)cols);
    for (size_t i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * lds) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4 b + j] now holds, in 128-bit lane l, column 4 l + j' of rows
     * 4 b .. 4 b + 3 (j' = 0, 1, 2, 3 for j = 0, 1, 2, 3 in that order:
     * unpacklo/hi_pd of unpacklo/hi_ps). Gather the lanes across b. */
    for (int j = 0; j < 4; j++) {
        __m512 a0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44); /* lanes 0,1 | 0,1 */
        __m512 a1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xee); /* lanes 2,3 | 2,3 */
        __m512 b0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44);
        __m512 b1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xee);
        t[j] = _mm512_shuffle_f32x4(a0, b0, 0x88);      /* lane 0 of each: column j */
        t[4 + j] = _mm512_shuffle_f32x4(a0, b0, 0xdd);  /* lane 1: column 4 + j */
        t[8 + j] = _mm512_shuffle_f32x4(a1, b1, 0x88);  /* lane 2: column 8 + j */
        t[12 + j] = _mm512_shuffle_f32x4(a1, b1, 0xdd); /* lane 3: column 12 + j */
    }
    for (size_t c = 0; c < cols; c++)
        _mm512_storeu_ps(dst + c * ldd, t[c]);
}

/* T = (I + L)^-1 by forward substitution on the identity: row i of T is
 * e_i - sum_{j<i} L_ij T_j. Rows are at most 4 vectors (C <= 64) and are
 * kept whole (zeros right of the diagonal), so the sum runs over full
 * vectors; two sets of accumulators (even and odd j) halve the FMA
 * latency chain. */
static void delta_inverse(float *Ti, const float *L, size_t n) {
    for (size_t i = 0; i < n; i++) {
        __m512 x[4], y[4];
        for (int v = 0; v < 4; v++) {
            x[v] = _mm512_setzero_ps();
            y[v] = _mm512_setzero_ps();
        }
        const float *li = L + i * DC;
        size_t       j = 0;
        for (; j + 2 <= i; j += 2) {
            __m512 l0 = _mm512_set1_ps(li[j]), l1 = _mm512_set1_ps(li[j + 1]);
            for (int v = 0; v < 4; v++) {
                x[v] = _mm512_fnmadd_ps(l0, _mm512_load_ps(Ti + j * DC + 16 * v), x[v]);
                y[v] = _mm512_fnmadd_ps(l1, _mm512_load_ps(Ti + (j + 1) * DC + 16 * v), y[v]);
            }
        }
        if (j < i) {
            __m512 l0 = _mm512_set1_ps(li[j]);
            for (int v = 0; v < 4; v++)
                x[v] = _mm512_fnmadd_ps(l0, _mm512_load_ps(Ti + j * DC + 16 * v), x[v]);
        }
        for (int v = 0; v < 4; v++) {
            __m512 r = _mm512_add_ps(x[v], y[v]);
            /* + e_i: lane i - 16 v of vector v */
            if (i / 16 == (size_t)v)
                r = _mm512_mask_add_ps(r, (__mmask16)(1u << (i % 16)), r, _mm512_set1_ps(1.0f));
            _mm512_store_ps(Ti + i * DC + 16 * v, r);
        }
    }
}

/* Asks for token t's rows of q/k head hk and v head h (into L2): the next
 * chunk's rows come from memory, a few KiB per token apart (a new page
 * each), and this chunk's products take long enough to hide the wait.
 * Issued one token at a time between the epilogue rows, not in a burst,
 * so that the misses do not queue up behind each other. */
static inline void delta_prefetch(const delta_job_t *jb, size_t t, size_t h, size_t hk) {
    if (t >= jb->T)
        return;
    size_t      dk = jb->dk, dv = jb->dv;
    const char *qt = (const char *)(jb->q + (t * jb->n_k_heads + hk) * dk);
    const char *kt = (const char *)(jb->k + (t * jb->n_k_heads + hk) * dk);
    const char *vt = (const char *)(jb->v + (t * jb->n_v_heads + h) * dv);
    for (size_t o = 0; o < dk * sizeof(float); o += 64) {
        _mm_prefetch(qt + o, _MM_HINT_T1);
        _mm_prefetch(kt + o, _MM_HINT_T1);
    }
    for (size_t o = 0; o < dv * sizeof(float); o += 64)
        _mm_prefetch(vt + o, _MM_HINT_T1);
}

/* ---- bf16 operands: the AMX products' and the fast profile's ------------- */

/* The fast profile (npu_delta_rule_fast) without AMX: [k; q] S and the
 * state update, 3 of the chunk's ~4 dk dv C multiply-adds, as one bf16
 * product each (VDPBF16PS: 32 multiply-adds per instruction against an
 * FMA's 16; operands rounded to bf16, 2^-9 relative, sums in fp32). The
 * state itself stays fp32: only what multiplies it is rounded, as in the
 * fast profile's attention (NPU_ATTN_BF16). */

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,fma"))),                  \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

/* hi = bf16(x) (nearest even), lo = bf16(x - hi) unless lo is NULL, as
 * 16-bit lanes in the low halves of 32-bit lanes. */
static inline void bf_split16(__m512 x, __m512i *hi, __m512i *lo) {
    __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x));
    *hi = h;
    if (lo) {
        __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
        *lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, hf)));
    }
}

/* Row-major split (the A operand): rows [0, rows) x cols [0, cols) of x
 * (rows ldx apart) into hi, lo (rows_p x cols_p, rows cols_p apart; lo
 * may be NULL); entries past rows or cols are 0. cols_p is a multiple of
 * 16. */
static void bf_split_rows(const float *x, size_t ldx, size_t rows, size_t cols, size_t rows_p,
                          size_t cols_p, uint16_t *hi, uint16_t *lo) {
    for (size_t r = 0; r < rows_p; r++)
        for (size_t c = 0; c < cols_p; c += 16) {
            __mmask16 m = r < rows ? dmask((long)cols - (long)c) : 0;
            __m512i   h, l;
            bf_split16(_mm512_maskz_loadu_ps(m, x + r * ldx + c), &h, lo ? &l : NULL);
            _mm256_storeu_si256((__m256i *)(hi + r * cols_p + c), _mm512_cvtepi32_epi16(h));
            if (lo)
                _mm256_storeu_si256((__m256i *)(lo + r * cols_p + c), _mm512_cvtepi32_epi16(l));
        }
}

/* Pair-interleaved split (the B operand, TDPBF16PS's and VDPBF16PS's
 * layout): x (rows x cols, rows ldx apart) into hi, lo (lo may be NULL)
 * with row pair r / 2 holding x[r][c], x[r + 1][c] at
 * [(r / 2) (2 cols) + 2 c]; rows past `rows` up to rows_p (even) are 0.
 * cols is a multiple of 16. */
static void bf_split_vnni(const float *x, size_t ldx, size_t rows, size_t cols, size_t rows_p,
                          uint16_t *hi, uint16_t *lo) {
    for (size_t r = 0; r < rows_p; r += 2)
        for (size_t c = 0; c < cols; c += 16) {
            __m512 x0 = r < rows ? _mm512_loadu_ps(x + r * ldx + c) : _mm512_setzero_ps();
            __m512 x1 = r + 1 < rows ? _mm512_loadu_ps(x + (r + 1) * ldx + c) : _mm512_setzero_ps();
            __m512i h0, l0, h1, l1;
            bf_split16(x0, &h0, lo ? &l0 : NULL);
            bf_split16(x1, &h1, lo ? &l1 : NULL);
            _mm512_storeu_si512(hi + r * cols + 2 * c,
                                _mm512_or_si512(h0, _mm512_slli_epi32(h1, 16)));
            if (lo)
                _mm512_storeu_si512(lo + r * cols + 2 * c,
                                    _mm512_or_si512(l0, _mm512_slli_epi32(l1, 16)));
        }
}

/* As gm_tile, with A bf16 row-major (rows lda apart) and B pair-interleaved
 * (pair rows ldb apart, both in uint16), over kp pairs of k: per pair,
 * GM_NV loads of B and GM_MR broadcasts of an A pair feed GM_MR GM_NV
 * VDPBF16PS. */
static inline __attribute__((always_inline)) void gb_tile(int mr, int nv, const uint16_t *a,
                                                          size_t lda, const uint16_t *b, size_t ldb,
                                                          size_t kp, float *c, size_t ldc,
                                                          const __mmask16 *m, bool add, float cb) {
    __m512 acc[GM_MR][GM_NV];
    gm_zero(acc);
    for (size_t p = 0; p < kp; p++) {
        __m512bh bv[GM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = (__m512bh)_mm512_maskz_loadu_epi32(m[v], b + p * ldb + 32 * v);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            uint32_t ap;
            memcpy(&ap, a + (size_t)r * lda + 2 * p, sizeof ap);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
    gm_store(mr, nv, acc, c, ldc, m, add, cb);
}

static void gb_tile_any(size_t mr, int nv, const uint16_t *a, size_t lda, const uint16_t *b,
                        size_t ldb, size_t kp, float *c, size_t ldc, const __mmask16 *m, bool add,
                        float cb) {
#define GB_CALL(R, V) gb_tile(R, V, a, lda, b, ldb, kp, c, ldc, m, add, cb)
    GM_DISPATCH(GB_CALL)
#undef GB_CALL
}

/* C (m, n) (cb C +)= A B from bf16 operands: A (m, 2 kp) row-major, rows
 * lda apart; B (2 kp, n) pair-interleaved (bf_split_vnni with cols n); C
 * rows ldc apart. Blocked as gemm. */
static void gemm_bf(size_t m, size_t n, size_t kp, const uint16_t *a, size_t lda, const uint16_t *b,
                    float *c, size_t ldc, bool add, float cb) {
    for (size_t j0 = 0; j0 < n; j0 += 16 * GM_NV) {
        __mmask16 mk[GM_NV];
        int       nv = gm_cols(n, j0, mk);
        for (size_t i0 = 0; i0 < m; i0 += GM_MR) {
            size_t mr = m - i0 < GM_MR ? m - i0 : GM_MR;
            gb_tile_any(mr, nv, a + i0 * lda, lda, b + 2 * j0, 2 * n, kp, c + i0 * ldc + j0, ldc,
                        mk, add, cb);
        }
    }
}

/* P = [k; q] S (2n x dv) in one bf16 product. */
static void bf_kq_state(delta_ws_t *ws, const float *S, size_t n, size_t dk, size_t dv) {
    uint16_t *a = ws->bf, *b = a + 2 * n * dk;
    bf_split_rows(ws->KQ, dk, 2 * n, dk, 2 * n, dk, a, NULL);
    bf_split_vnni(S, dv, dk, dv, dk, b, NULL);
    gemm_bf(2 * n, dv, dk / 2, a, dk, b, ws->P, dv, false, 0.0f);
}

/* S = cd S + k^T Vn (Vn already scaled) in one bf16 product over the n
 * tokens (padded to 16 with zeros). */
static void bf_state_update(delta_ws_t *ws, float *S, size_t n, size_t dk, size_t dv, float cd) {
    size_t    kp = (n + 15) / 16 * 16;
    uint16_t *a = ws->bf, *b = a + dk * kp;
    bf_split_rows(ws->KT, DC, dk, n, dk, kp, a, NULL);
    bf_split_vnni(ws->Vn, dv, n, dv, kp, b, NULL);
    gemm_bf(dk, dv, kp / 2, a, kp, b, S, dv, true, cd);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

/* ---- AMX-BF16: the two big products on tiles ------------------------------ */

/* P = [k; q] S and S += k^T Vn' are 3 of the chunk's ~4 dk dv C FMAs. With
 * AMX (amx_bf16, avx512_bf16, amx_usable; dk and dv multiples of 32) they
 * run as bf16 tile products instead: each fp32 operand x is split into
 * hi = bf16(x) and lo = bf16(x - hi) (x = hi + lo to ~2^-17 relative), and
 * a b ~ ah bh + ah bl + al bh, accumulated in fp32 tiles (the dropped
 * al bl and the rounding of lo are ~2^-17 of each term). That keeps the
 * kernel within ~1e-5 of the references (tests/test_npu_delta.c), where
 * one bf16 product (2^-9) would not. A tile product is 16 x 16 x 32 MACs
 * in 16 cycles, 16 times the fp32 FMA rate, so three of them still win. */

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((                                                                                \
        target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,fma"))),           \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

#include "npu_amx_int.h"

static void amx_release(void) {
    _tile_release();
}

/* C (m x n fp32, rows ldc apart) (+)= A B from the splits: A hi/lo
 * (m x k, rows k apart), B hi/lo pair-interleaved (k x n); m, n, k
 * multiples of 32. C is loaded into the tiles when add, else zeroed.
 * Per 32 x 32 block of C and 32 of k: 10 tile loads, 12 tile products. */
static void amx_gemm3(const uint16_t *ah, const uint16_t *al, const uint16_t *bh,
                      const uint16_t *bl, size_t m, size_t n, size_t k, float *c, size_t ldc,
                      bool add) {
    size_t lda = 2 * k, ldb = 4 * n, ldcb = 4 * ldc; /* bytes */
    for (size_t i0 = 0; i0 < m; i0 += 32)
        for (size_t j0 = 0; j0 < n; j0 += 32) {
            float *c0 = c + i0 * ldc + j0;
            if (add) {
                _tile_loadd(0, c0, ldcb);
                _tile_loadd(1, c0 + 16, ldcb);
                _tile_loadd(2, c0 + 16 * ldc, ldcb);
                _tile_loadd(3, c0 + 16 * ldc + 16, ldcb);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (size_t kb = 0; kb < k; kb += 32) {
                const uint16_t *a0 = ah + i0 * k + kb, *b0 = bh + (kb / 2) * 2 * n + 2 * j0;
                _tile_loadd(4, a0, lda);
                _tile_loadd(5, a0 + 16 * k, lda);
                _tile_loadd(6, b0, ldb);
                _tile_loadd(7, b0 + 32, ldb);
                npu_tdp_2x2();
                const uint16_t *b1 = bl + (kb / 2) * 2 * n + 2 * j0;
                _tile_loadd(6, b1, ldb);
                _tile_loadd(7, b1 + 32, ldb);
                npu_tdp_2x2();
                const uint16_t *a1 = al + i0 * k + kb;
                _tile_loadd(4, a1, lda);
                _tile_loadd(5, a1 + 16 * k, lda);
                _tile_loadd(6, b0, ldb);
                _tile_loadd(7, b0 + 32, ldb);
                npu_tdp_2x2();
            }
            _tile_stored(0, c0, ldcb);
            _tile_stored(1, c0 + 16, ldcb);
            _tile_stored(2, c0 + 16 * ldc, ldcb);
            _tile_stored(3, c0 + 16 * ldc + 16, ldcb);
        }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

/* One chunk of n tokens from t0 for value head h (q/k head hk). */
static void delta_chunk(const delta_job_t *jb, delta_ws_t *ws, float *S, size_t h, size_t hk,
                        size_t t0, size_t n) {
    size_t dk = jb->dk, dv = jb->dv, Hv = jb->n_v_heads;
    size_t ldqk = jb->n_k_heads * dk, ldv = Hv * dv;
    float *K = ws->KQ, *Q = ws->KQ + n * dk;

    /* Gather the chunk's k and q (the inputs' rows are n_k_heads * dk
     * apart: 8 KiB for the model, so all rows would share an L1 set) and
     * k^T, the B operand of the Gram product. */
    for (size_t i = 0; i < n; i++) {
        memcpy(K + i * dk, jb->k + (t0 + i) * ldqk + hk * dk, dk * sizeof *K);
        memcpy(Q + i * dk, jb->q + (t0 + i) * ldqk + hk * dk, dk * sizeof *Q);
    }
    for (size_t i = 0; i < n; i += 16)
        for (size_t d = 0; d < dk; d += 16)
            transpose16(K + i * dk + d, dk, n - i < 16 ? n - i : 16, dk - d < 16 ? dk - d : 16,
                        ws->KT + d * DC + i, DC);
    /* Cumulative log decay, summed in double as the reference does. */
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += (double)jb->g[(t0 + i) * Hv + h];
        ws->gc[i] = (float)acc;
    }
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = dmask((long)(n - i));
        _mm512_mask_storeu_ps(ws->eg + i, m, npu_exp512(_mm512_maskz_loadu_ps(m, ws->gc + i)));
    }

    /* G = [k; q] k^T, lower triangle (per row tile) of each half. */
    gemm(n, n, dk, K, dk, 1, ws->KT, DC, ws->G, DC, GM_TRI_N, 0.0f);
    gemm(n, n, dk, Q, dk, 1, ws->KT, DC, ws->G + n * DC, DC, GM_TRI_N, 0.0f);
    /* L and A in place, over the columns the later triangular products
     * read (up to the end of the row's GM_MR tile); zeros right of the
     * diagonal stand for the reference's mask. exp(gc_i - gc_j) with
     * j <= i has a non-positive exponent, so nothing overflows (the
     * masked-off lanes may be inf; maskz drops them). */
    for (size_t i = 0; i < n; i++) {
        size_t end = (i / GM_MR + 1) * GM_MR;
        end = end < n ? end : n;
        __m512 gi = _mm512_set1_ps(ws->gc[i]);
        __m512 bi = _mm512_set1_ps(jb->beta[(t0 + i) * Hv + h]);
        __m512 si = _mm512_set1_ps(jb->scale);
        float *Li = ws->G + i * DC, *Ai = ws->G + (n + i) * DC;
        for (size_t j = 0; j < end; j += 16) {
            __mmask16 lo = dmask((long)i - (long)j);     /* j' < i */
            __mmask16 le = dmask((long)i + 1 - (long)j); /* j' <= i */
            __mmask16 m = dmask((long)(end - j));
            __m512    dec = npu_exp512(_mm512_sub_ps(gi, _mm512_maskz_loadu_ps(m, ws->gc + j)));
            __m512    l = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, Li + j), bi);
            __m512    a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, Ai + j), si);
            _mm512_mask_storeu_ps(Li + j, m, _mm512_maskz_mul_ps(lo, l, dec));
            _mm512_mask_storeu_ps(Ai + j, m, _mm512_maskz_mul_ps(le, a, dec));
        }
    }
    delta_inverse(ws->Ti, ws->G, n);

    /* P = [k; q] S with the old state. */
    if (jb->amx) {
        size_t    mp = (2 * n + 31) / 32 * 32;
        uint16_t *ah = ws->bf, *al = ah + mp * dk, *bh = al + mp * dk, *bl = bh + dk * dv;
        bf_split_rows(ws->KQ, dk, 2 * n, dk, mp, dk, ah, al);
        bf_split_vnni(S, dv, dk, dv, dk, bh, bl);
        amx_gemm3(ah, al, bh, bl, mp, dv, dk, ws->P, dv, false);
    } else if (jb->bf16) {
        bf_kq_state(ws, S, n, dk, dv);
    } else {
        gemm(2 * n, dv, dk, ws->KQ, dk, 1, S, dv, ws->P, dv, 0, 0.0f);
    }
    /* out = scale exp(gc) P_q (the inter-chunk part); U = beta (v -
     * exp(gc) P_k). */
    for (size_t i = 0; i < n; i++) {
        delta_prefetch(jb, t0 + DC + i, h, hk);
        __m512       e = _mm512_set1_ps(ws->eg[i]);
        __m512       es = _mm512_set1_ps(ws->eg[i] * jb->scale);
        __m512       b = _mm512_set1_ps(jb->beta[(t0 + i) * Hv + h]);
        const float *vi = jb->v + (t0 + i) * ldv + h * dv;
        float       *oi = jb->out + (t0 + i) * ldv + h * dv;
        const float *pk = ws->P + i * dv, *pq = ws->P + (n + i) * dv;
        for (size_t d = 0; d < dv; d += 16) {
            __mmask16 m = dmask((long)(dv - d));
            __m512    u = _mm512_fnmadd_ps(e, _mm512_maskz_loadu_ps(m, pk + d),
                                           _mm512_maskz_loadu_ps(m, vi + d));
            _mm512_mask_storeu_ps(ws->U + i * dv + d, m, _mm512_mul_ps(u, b));
            _mm512_mask_storeu_ps(oi + d, m, _mm512_mul_ps(es, _mm512_maskz_loadu_ps(m, pq + d)));
        }
    }
    /* Vn = T U; out += A Vn (both lower triangular on the left). */
    gemm(n, dv, n, ws->Ti, DC, 1, ws->U, dv, ws->Vn, dv, GM_TRI_K, 0.0f);
    gemm(n, dv, n, ws->G + n * DC, DC, 1, ws->Vn, dv, jb->out + t0 * ldv + h * dv, ldv,
         GM_TRI_K | GM_ADD, 1.0f);

    /* S = exp(gc_last) S + k^T (exp(gc_last - gc) Vn). */
    float glast = ws->gc[n - 1];
    for (size_t i = 0; i < n; i++) {
        __m512 w = npu_exp512(_mm512_set1_ps(glast - ws->gc[i]));
        for (size_t d = 0; d < dv; d += 16) {
            __mmask16 m = dmask((long)(dv - d));
            float    *r = ws->Vn + i * dv + d;
            _mm512_mask_storeu_ps(r, m, _mm512_mul_ps(w, _mm512_maskz_loadu_ps(m, r)));
        }
    }
    if (jb->amx) {
        size_t    kp = (n + 31) / 32 * 32;
        uint16_t *ah = ws->bf, *al = ah + dk * kp, *bh = al + dk * kp, *bl = bh + kp * dv;
        bf_split_rows(ws->KT, DC, dk, n, dk, kp, ah, al);
        bf_split_vnni(ws->Vn, dv, n, dv, kp, bh, bl);
        __m512 cd = _mm512_set1_ps(ws->eg[n - 1]);
        for (size_t i = 0; i < dk * dv; i += 16)
            _mm512_storeu_ps(S + i, _mm512_mul_ps(cd, _mm512_loadu_ps(S + i)));
        amx_gemm3(ah, al, bh, bl, dk, dv, kp, S, dv, true);
    } else if (jb->bf16) {
        bf_state_update(ws, S, n, dk, dv, ws->eg[n - 1]);
    } else {
        gemm(dk, dv, n, ws->KT, DC, 1, ws->Vn, dv, S, dv, GM_ADD, ws->eg[n - 1]);
    }
}

/* Item it: the value heads [it hpi, (it + 1) hpi), chunk by chunk, each
 * chunk for all of them. Taking the heads of a chunk together makes the
 * reads of q, k, v and the writes of out runs of hpi * d floats per token
 * instead of d floats a whole row apart (8 KiB for the model: one head
 * through all T missed the TLB and the prefetchers on every row, and
 * spent a third of its time waiting for memory). */
static void delta_item(void *ctx, size_t it) {
    const delta_job_t *jb = ctx;
    size_t             dk = jb->dk, dv = jb->dv, group = jb->n_v_heads / jb->n_k_heads;
    size_t             h0 = it * jb->heads_per_item, h1 = h0 + jb->heads_per_item;
    h1 = h1 < jb->n_v_heads ? h1 : jb->n_v_heads;
    delta_ws_t ws;
    ws_carve(&ws, jb->scratch + it * ws_floats(dk, dv), dk, dv);
    if (jb->amx)
        npu_tiles_16x64();
    float *S = jb->states + h0 * dk * dv;
    size_t ns = (h1 - h0) * dk * dv;
    /* The item's states are read before any is written back, so
     * state_out may equal state_in. */
    if (jb->state_in)
        memcpy(S, jb->state_in + h0 * dk * dv, ns * sizeof *S);
    else
        memset(S, 0, ns * sizeof *S);
    for (size_t t0 = 0; t0 < jb->T; t0 += DC) {
        size_t n = jb->T - t0 < DC ? jb->T - t0 : DC;
        for (size_t h = h0; h < h1; h++)
            delta_chunk(jb, &ws, jb->states + h * dk * dv, h, h / group, t0, n);
    }
    if (jb->state_out)
        memcpy(jb->state_out + h0 * dk * dv, S, ns * sizeof *S);
    if (jb->amx)
        amx_release();
}

/* The AMX products where the CPU and this process have them and the head
 * sizes fit whole tiles; D3_NPU_DELTA=f32 (read at each call) keeps the
 * fp32 FMA products, for tests and benchmarks of both; npu_amx_enabled()
 * is the process's AMX decision (D3_NPU_KERNELS=avx512: none). */
static bool delta_use_amx(size_t dk, size_t dv) {
    const char *env = getenv("D3_NPU_DELTA");
    if (env && strcmp(env, "f32") == 0)
        return false;
    return npu_amx_enabled() && dk % 32 == 0 && dv % 32 == 0;
}

/* The chunked rule with the big products in fp32 (or AMX), or in one bf16
 * product each (bf16). */
static svc_err_t delta_chunked(const float *q, const float *k, const float *v, const float *g,
                               const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                               size_t dk, size_t dv, const float *state_in, float *state_out,
                               float *out, bool bf16) {
    SVC_ASSERT(n_k_heads > 0 && n_v_heads % n_k_heads == 0 && dk > 0 && dv > 0);
    /* Two items per pool thread (so that a thread the OS takes away costs
     * half an item of waiting, not a whole share), each a run of heads
     * with its own chunk scratch; all the states live in one array. */
    size_t want = 2 * npu_threads();
    size_t hpi = (n_v_heads + want - 1) / want;
    size_t items = (n_v_heads + hpi - 1) / hpi;
    size_t floats = ws_round(n_v_heads * dk * dv) + items * ws_floats(dk, dv);
    float *scratch = aligned_alloc(64, ws_round(floats) * sizeof(float));
    if (!scratch)
        return SVC_ERR_NOMEM;
    delta_job_t jb = {.q = q,
                      .k = k,
                      .v = v,
                      .g = g,
                      .beta = beta,
                      .T = T,
                      .n_k_heads = n_k_heads,
                      .n_v_heads = n_v_heads,
                      .dk = dk,
                      .dv = dv,
                      .state_in = state_in,
                      .state_out = state_out,
                      .out = out,
                      .states = scratch,
                      .scratch = scratch + ws_round(n_v_heads * dk * dv),
                      .heads_per_item = hpi,
                      .scale = (float)(1.0 / sqrt((double)dk)),
                      .amx = delta_use_amx(dk, dv)};
    jb.bf16 = bf16 && !jb.amx;
    npu_parallel_for(items, delta_item, &jb);
    free(scratch);
    return SVC_OK;
}

svc_err_t npu_delta_rule_chunked_avx512(const float *q, const float *k, const float *v,
                                        const float *g, const float *beta, size_t T,
                                        size_t n_k_heads, size_t n_v_heads, size_t dk, size_t dv,
                                        const float *state_in, float *state_out, float *out) {
    return delta_chunked(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state_in, state_out,
                         out, false);
}

bool npu_delta_bf16_usable(size_t T, size_t dk, size_t dv) {
    const npu_features_t *f = npu_probe();
    return f->avx512_bf16 && T >= DELTA_MIN_CHUNKED && dk >= DELTA_MIN_DIM && dv >= DELTA_MIN_DIM &&
           dk % 16 == 0 && dv % 16 == 0;
}

svc_err_t npu_delta_rule_bf16_avx512(const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, size_t T, size_t n_k_heads,
                                     size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                     float *state_out, float *out) {
    SVC_ASSERT(npu_delta_bf16_usable(T, dk, dv));
    return delta_chunked(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state_in, state_out,
                         out, true);
}

svc_err_t npu_delta_rule_pick_avx512(const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, size_t T, size_t n_k_heads,
                                     size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                     float *state_out, float *out) {
    if (T < DELTA_MIN_CHUNKED || dk < DELTA_MIN_DIM || dv < DELTA_MIN_DIM)
        return npu_delta_rule_avx512(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state_in,
                                     state_out, out);
    return npu_delta_rule_chunked_avx512(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv,
                                         state_in, state_out, out);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
