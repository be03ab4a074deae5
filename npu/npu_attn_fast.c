/*
 * npu_attn_fast.c -- tiled (flash-attention style) attention for heads
 * wider than the small-head path's 32 (npu.h, npu_attention_tiled): the
 * full-attention layers of d3-nano (8 query heads, 2 KV heads, head_dim
 * 256) over prompts of up to 32,768 tokens.
 *
 * Work item: one KV head x AT_QR query rows, a row being a (token, GQA
 * head) pair in token order, so that all query heads of a KV head share
 * every key and value they load. An item walks the keys in blocks of
 * AT_KB:
 *   S = Q K^T            (AT_QR x AT_KB, a matrix product)
 *   online softmax per row: running max m and sum l; when m grows the
 *   accumulator row is rescaled by 2^(m_old - m_new)
 *   acc += P V           (a matrix product)
 * and writes acc / l at the end. Scratch is O(AT_QR * (AT_KB + head_dim))
 * per item: no Tq x Tk score matrix anywhere. Items run on the kernels'
 * pool (npu_parallel_for); the causal ones last in the prompt have the
 * most keys, so items are handed out from the end backwards.
 *
 * Three engines behind the same loop:
 *  - AMX-BF16 (TDPBF16PS, 16x16 fp32 tiles): q, k, v and the softmax's p
 *    rounded to bf16, products accumulated in fp32. K and V are packed
 *    into tile layout once per call (per KV head, AT_KB keys a block, the
 *    VNNI pair order TDPBF16PS wants). NPU_ATTN_BF16X3 splits each value x
 *    into hi = bf16(x) and lo = bf16(x - hi) and sums hi*hi + hi*lo +
 *    lo*hi, three products for near-fp32 accuracy.
 *  - AVX-512 BF16 (VDPBF16PS) where there is no AMX, NPU_ATTN_BF16 only:
 *    the AMX engine's operands and packing, one vector of 16 keys (scores)
 *    or 16 dims (P V) per pair of bf16 products.
 *  - AVX-512 fp32: K transposed once per call to (block, d, key) so a score
 *    vector of 16 keys is D broadcast FMAs; 8 rows x 32 keys (scores) and
 *    8 rows x 32 dims (P V) register tiles.
 *
 * Scores are computed in the base-2 domain (q is scaled by log2(e) /
 * sqrt(head_dim) once), so the softmax's exponentials are 2^x.
 *
 * Compiled for AVX-512 + AMX by the target pragma below (after the
 * includes, as npu_avx512.c: CMake builds npu/ with baseline flags); only
 * called when npu_probe() reports the features (npu_fast.c, tests).
 */
#include "npu.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((                                                                                \
        target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))),           \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#endif

/* Query rows (token, head pairs) per item: 16 tiles of 16. The rows of
 * an item share each key block, so K and V (1 MiB per 1,024 keys of a
 * head of 256, split) stream from memory once per AT_QR rows: at 64 rows
 * the products waited on that stream (~20 GB/s per core at the tile
 * peak); at 256 they need a quarter of it, and the item's Q, S, P and
 * acc (~650 KiB) still fit in L2. */
#define AT_QR 256
/* Keys per block: 4 score tiles of 16 keys, 2 P V steps of 32. */
#define AT_KB 64
/* bf16 elements in one 16 x 64-byte tile. */
#define AT_TILE 512

/* ---- helpers -------------------------------------------------------------- */

/* 2^x for 16 lanes: x = n + f, |f| <= 1/2, 2^f by the Taylor series of
 * e^(f ln 2) to degree 6 (relative error < 2e-7), times 2^n by scalef.
 * x is clamped to -160 first, so -inf (a masked score) gives exactly 0. */
static inline __m512 at_exp2(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-160.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Bits [0, n) of a 64-bit mask (n may exceed 64). */
static inline uint64_t at_below64(size_t n) {
    return n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1u;
}

/* bf16 of 16 floats as 16-bit lanes, and the rest x - bf16(x) as bf16
 * (the lo half of a BF16X3 split). */
static inline __m256i at_bf16(__m512 x) {
    return (__m256i)_mm512_cvtneps_pbh(x);
}
static inline __m512 at_bf16_back(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Tiles (npu_tiles_16x64): 0-3 accumulate (fp32 16 x 16), 4-5 hold A
 * (16 rows x 32 bf16), 6-7 hold B (16 pairs of rows x 16 columns x 2 bf16). */
#include "npu_amx_int.h"
#include "npu_vec_int.h"
_Static_assert(sizeof(npu_tilecfg_t) == 64, "LDTILECFG reads 64 bytes");

/* ---- shared state of one call ------------------------------------------------ */

typedef struct at_ctx {
    const float    *q, *k, *v;
    float          *out, *lse; /* lse optional */
    size_t          Tq, Tk, H, Hkv, G, D;
    bool            causal;
    npu_attn_mode_t mode;
    size_t          nkb;    /* key blocks of AT_KB */
    size_t          nqb;    /* query row blocks of AT_QR per KV head */
    const uint64_t *kbits;  /* (nkb): bit jb: key b * AT_KB + jb < Tk and not masked out */
    float           qscale; /* log2(e) / sqrt(D) */
    /* fp32: kt (Hkv, nkb, D, AT_KB); 0 past Tk. */
    float *kt;
    /* AMX: kp (nsplit, Hkv, nkb, 4 key tiles, Dq / 32 chunks, 512) and
     * vp (nsplit, Hkv, nkb, 2 key halves, D16 / 16 chunks, 512), bf16. */
    uint16_t   *kp, *vp;
    size_t      Dq, D16, nsplit;
    size_t      kp_plane, vp_plane; /* elements per split plane */
    atomic_bool nomem;
} at_ctx_t;

/* Item it -> (KV head, query block), the last blocks first. */
static void at_item(const at_ctx_t *c, size_t it, size_t *kvh, size_t *qb) {
    *kvh = it / c->nqb;
    *qb = c->nqb - 1 - it % c->nqb;
}

/* Per row of a query block: the first key it cannot see (causal; Tk
 * otherwise; 0 for a padding row past the last pair), and where its q and
 * out are. Returns the number of real rows. */
static size_t at_rows(const at_ctx_t *c, size_t kvh, size_t qb, size_t jend[AT_QR],
                      size_t qoff[AT_QR]) {
    size_t n_pairs = c->Tq * c->G, p0 = qb * AT_QR;
    size_t nr = n_pairs - p0 < AT_QR ? n_pairs - p0 : AT_QR;
    for (size_t r = 0; r < AT_QR; r++) {
        if (r >= nr) {
            jend[r] = 0;
            qoff[r] = 0;
            continue;
        }
        size_t p = p0 + r, i = p / c->G, h = kvh * c->G + p % c->G;
        jend[r] = c->causal ? i + (c->Tk - c->Tq) + 1 : c->Tk;
        qoff[r] = (i * c->H + h) * c->D;
    }
    return nr;
}

/* The online-softmax step for one key block, row by row (rows [0, nr)):
 * S holds the scores (AT_QR x AT_KB, base 2), vis[r] the keys row r may
 * see. Updates m, l; sets corr[r] (the factor acc row r must be scaled by
 * before P V is added) and writes p (fp32 into pf, or bf16 hi [/ lo]
 * planes into pb, AT_QR x AT_KB each). Returns whether any corr != 1. */
static bool at_softmax(const float *S, const uint64_t vis[AT_QR], size_t nr, float *m, float *l,
                       float *corr, float *pf, uint16_t *pb, size_t nsplit) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    bool         rescale = false;
    for (size_t r = 0; r < nr; r++) {
        const float *sr = S + r * AT_KB;
        __m512       s[4], p[4];
        corr[r] = 1.0f;
        if (!vis[r]) { /* nothing visible in this block: p = 0, m, l kept */
            for (int u = 0; u < 4; u++)
                p[u] = _mm512_setzero_ps();
        } else {
            for (int u = 0; u < 4; u++)
                s[u] = _mm512_mask_blend_ps((__mmask16)(vis[r] >> (16 * u)), ninf,
                                            _mm512_loadu_ps(sr + 16 * u));
            float mb = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_max_ps(s[0], s[1]), _mm512_max_ps(s[2], s[3])));
            if (mb > m[r]) { /* m[r] = -inf on the first visible block: corr 0 */
                corr[r] = exp2f(m[r] - mb);
                m[r] = mb;
                rescale = true;
            }
            __m512 mv = _mm512_set1_ps(m[r]);
            for (int u = 0; u < 4; u++)
                p[u] = at_exp2(_mm512_sub_ps(s[u], mv));
            l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[1]),
                                                                       _mm512_add_ps(p[2], p[3])));
        }
        if (pf) {
            for (int u = 0; u < 4; u++)
                _mm512_storeu_ps(pf + r * AT_KB + 16 * u, p[u]);
            continue;
        }
        for (int u = 0; u < 4; u++) {
            __m256i hi = at_bf16(p[u]);
            _mm256_storeu_si256((__m256i *)(void *)(pb + r * AT_KB + 16 * u), hi);
            if (nsplit == 2)
                _mm256_storeu_si256((__m256i *)(void *)(pb + AT_QR * AT_KB + r * AT_KB + 16 * u),
                                    at_bf16(_mm512_sub_ps(p[u], at_bf16_back(hi))));
        }
    }
    return rescale;
}

/* Visibility of key block b for each row; returns their union. */
static uint64_t at_block_vis(const at_ctx_t *c, size_t b, const size_t jend[AT_QR], size_t nr,
                             uint64_t vis[AT_QR]) {
    uint64_t any = 0, kb = c->kbits[b];
    size_t   j0 = b * AT_KB;
    for (size_t r = 0; r < nr; r++) {
        vis[r] = jend[r] > j0 ? kb & at_below64(jend[r] - j0) : 0;
        any |= vis[r];
    }
    return any;
}

/* Writes out rows [0, nr) = acc / l (zeros where l = 0: no key seen) and,
 * if asked, their log-sum-exp: (m + log2 l) ln 2, m and l being base 2. */
static void at_store(const at_ctx_t *c, const float *acc, size_t ld, const float *m, const float *l,
                     size_t nr, const size_t qoff[AT_QR]) {
    for (size_t r = 0; r < nr; r++) {
        if (c->lse)
            c->lse[qoff[r] / c->D] =
                l[r] > 0.0f ? (m[r] + log2f(l[r])) * 0.69314718055994531f : -INFINITY;
        __m512 inv = _mm512_set1_ps(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
        float *o = c->out + qoff[r];
        for (size_t d = 0; d < c->D; d += 16)
            _mm512_mask_storeu_ps(o + d, npu_mask16(c->D - d),
                                  _mm512_mul_ps(_mm512_loadu_ps(acc + r * ld + d), inv));
    }
}

/* ---- packing (once per call, in parallel over key blocks) ------------------- */

/* fp32: kt block (kvh, b)[d][jb] = k[b * AT_KB + jb][kvh][d], 0 past Tk. */
static void at_pack_f32(void *ctx, size_t it) {
    at_ctx_t *c = ctx;
    size_t    kvh = it / c->nkb, b = it % c->nkb, D = c->D;
    float    *dst = c->kt + it * D * AT_KB;
    size_t    nk = c->Tk - b * AT_KB < AT_KB ? c->Tk - b * AT_KB : AT_KB;
    if (nk < AT_KB)
        memset(dst, 0, D * AT_KB * sizeof *dst);
    /* Each 16 dims of a key go down one column: a scatter AT_KB floats apart. */
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(AT_KB));
    for (size_t jb = 0; jb < nk; jb++) {
        const float *kj = c->k + ((b * AT_KB + jb) * c->Hkv + kvh) * D;
        for (size_t d = 0; d < D; d += 16) {
            __mmask16 dm = npu_mask16(D - d);
            _mm512_mask_i32scatter_ps(dst + d * AT_KB + jb, dm, idx,
                                      _mm512_maskz_loadu_ps(dm, kj + d), 4);
        }
    }
}

/* Splits 16 floats into the bf16 planes: hi into h, lo into l (if l). */
static inline void at_split(__m512 x, __m256i *h, __m256i *lo) {
    *h = at_bf16(x);
    if (lo)
        *lo = at_bf16(_mm512_sub_ps(x, at_bf16_back(*h)));
}

/* AMX: block (kvh, b) of K and V in tile layout, each split plane.
 *  K tile (key tile t, chunk ch): row rr, dword n = the pair
 *    (k[key 16 t + n][32 ch + 2 rr], [.. + 1]): a B operand of Q K^T.
 *  V tile (key half hf, chunk dc): row rr, dword n = the pair
 *    (v[key 32 hf + 2 rr][16 dc + n], v[key 32 hf + 2 rr + 1][..]): a B
 *    operand of P V. Zeros past Tk and past D. */
static void at_pack_bf16(void *ctx, size_t it) {
    at_ctx_t *c = ctx;
    size_t    kvh = it / c->nkb, b = it % c->nkb, D = c->D;
    size_t    nck = c->Dq / 32, ncv = c->D16 / 16;
    size_t    kblk = 4 * nck * AT_TILE, vblk = 2 * ncv * AT_TILE;
    size_t    nk = c->Tk - b * AT_KB < AT_KB ? c->Tk - b * AT_KB : AT_KB;
    bool      two = c->nsplit == 2;
    uint16_t *kd = c->kp + it * kblk, *vd = c->vp + it * vblk;
    if (nk < AT_KB) { /* keys past Tk: zeros (pad dims are zeroed below) */
        memset(kd, 0, kblk * sizeof *kd);
        if (two)
            memset(kd + c->kp_plane, 0, kblk * sizeof *kd);
    }
    if (nk < AT_KB) {
        memset(vd, 0, vblk * sizeof *vd);
        if (two)
            memset(vd + c->vp_plane, 0, vblk * sizeof *vd);
    }
    /* K: 32 dims of a key = 16 dword pairs, one per tile row: a scatter of
     * dwords 16 apart into column n. */
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(16));
    for (size_t jb = 0; jb < nk; jb++) {
        const float *kj = c->k + ((b * AT_KB + jb) * c->Hkv + kvh) * D;
        size_t       t = jb / 16, n = jb % 16;
        for (size_t ch = 0; ch < nck; ch++) {
            size_t    d = ch * 32;
            __mmask16 m0 = npu_mask16(D > d ? D - d : 0),
                      m1 = npu_mask16(D > d + 16 ? D - d - 16 : 0);
            __m256i h0, h1, l0, l1;
            at_split(_mm512_maskz_loadu_ps(m0, kj + d), &h0, two ? &l0 : NULL);
            at_split(_mm512_maskz_loadu_ps(m1, kj + d + 16), &h1, two ? &l1 : NULL);
            uint16_t *tile = kd + (t * nck + ch) * AT_TILE + 2 * n;
            _mm512_i32scatter_epi32(tile, idx,
                                    _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1), 4);
            if (two)
                _mm512_i32scatter_epi32(tile + c->kp_plane, idx,
                                        _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1), 4);
        }
    }
    /* V: two consecutive keys' 16 dims interleave into one tile row. */
    for (size_t jb = 0; jb < nk; jb += 2) {
        const float *v0 = c->v + ((b * AT_KB + jb) * c->Hkv + kvh) * D;
        const float *v1 = jb + 1 < nk ? v0 + c->Hkv * D : NULL;
        size_t       hf = jb / 32, rr = (jb % 32) / 2;
        for (size_t dc = 0; dc < ncv; dc++) {
            size_t    d = dc * 16;
            __mmask16 dm = npu_mask16(D - d);
            __m256i   h0, h1 = _mm256_setzero_si256(), l0, l1 = _mm256_setzero_si256();
            at_split(_mm512_maskz_loadu_ps(dm, v0 + d), &h0, two ? &l0 : NULL);
            if (v1)
                at_split(_mm512_maskz_loadu_ps(dm, v1 + d), &h1, two ? &l1 : NULL);
            uint16_t *row = vd + ((hf * ncv + dc) * AT_TILE) + rr * 32;
            __m512i   w = _mm512_or_si512(_mm512_cvtepu16_epi32(h0),
                                          _mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
            _mm512_storeu_si512(row, w);
            if (two) {
                w = _mm512_or_si512(_mm512_cvtepu16_epi32(l0),
                                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(l1), 16));
                _mm512_storeu_si512(row + c->vp_plane, w);
            }
        }
    }
}

/* ---- fp32 engine ---------------------------------------------------------- */

/* S rows [r0, r0 + 8) x keys [32 kh, 32 kh + 32) = Q kt over D. */
static inline void at_f32_scores8(const float *Q, size_t D, const float *kt, float *S, size_t r0,
                                  size_t kh) {
    __m512 a[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i][0] = a[i][1] = _mm512_setzero_ps();
    const float *kc = kt + 32 * kh;
    for (size_t d = 0; d < D; d++) {
        __m512 k0 = _mm512_loadu_ps(kc + d * AT_KB), k1 = _mm512_loadu_ps(kc + d * AT_KB + 16);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512 qv = _mm512_set1_ps(Q[(r0 + (size_t)i) * D + d]);
            a[i][0] = _mm512_fmadd_ps(qv, k0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(qv, k1, a[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        _mm512_storeu_ps(S + (r0 + (size_t)i) * AT_KB + 32 * kh, a[i][0]);
        _mm512_storeu_ps(S + (r0 + (size_t)i) * AT_KB + 32 * kh + 16, a[i][1]);
    }
}

/* acc rows [r0, r0 + 8), dims [d0, d0 + 32) = corr * acc + P V over the
 * nk keys of the block; v rows ldv apart, masked to the head's D. */
static inline void at_f32_pv8(float *acc, size_t ld, const float *corr, const float *P,
                              const float *vb, size_t ldv, size_t nk, size_t r0, size_t d0,
                              size_t D) {
    __mmask16 m0 = npu_mask16(D - d0), m1 = npu_mask16(D > d0 + 16 ? D - d0 - 16 : 0);
    __m512    a[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        float *ar = acc + (r0 + (size_t)i) * ld + d0;
        __m512 cr = _mm512_set1_ps(corr[r0 + (size_t)i]);
        a[i][0] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, ar), cr);
        a[i][1] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, ar + 16), cr);
    }
    for (size_t j = 0; j < nk; j++) {
        __m512 v0 = _mm512_maskz_loadu_ps(m0, vb + j * ldv + d0);
        __m512 v1 = _mm512_maskz_loadu_ps(m1, vb + j * ldv + d0 + 16);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512 pv = _mm512_set1_ps(P[(r0 + (size_t)i) * AT_KB + j]);
            a[i][0] = _mm512_fmadd_ps(pv, v0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(pv, v1, a[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        float *ar = acc + (r0 + (size_t)i) * ld + d0;
        _mm512_mask_storeu_ps(ar, m0, a[i][0]);
        _mm512_mask_storeu_ps(ar + 16, m1, a[i][1]);
    }
}

static void at_item_f32(void *ctx, size_t it) {
    at_ctx_t *c = ctx;
    size_t    kvh, qb, jend[AT_QR], qoff[AT_QR];
    uint64_t  vis[AT_QR];
    at_item(c, it, &kvh, &qb);
    size_t nr = at_rows(c, kvh, qb, jend, qoff), nr8 = (nr + 7) / 8 * 8, D = c->D, ld = c->D16;
    /* Q (AT_QR, D) scaled, S and P (AT_QR, AT_KB), acc (AT_QR, D16), m, l, corr. */
    size_t nf = AT_QR * D + 2 * AT_QR * AT_KB + AT_QR * ld + 3 * AT_QR;
    float *buf = npu_scratch(NPU_SCRATCH_ATTN_ITEM, nf * sizeof(float));
    if (!buf) {
        atomic_store(&c->nomem, true);
        return;
    }
    float *Q = buf, *S = Q + AT_QR * D, *P = S + AT_QR * AT_KB, *acc = P + AT_QR * AT_KB;
    float *m = acc + AT_QR * ld, *l = m + AT_QR, *corr = l + AT_QR;
    memset(Q, 0, AT_QR * D * sizeof *Q);
    memset(acc, 0, AT_QR * ld * sizeof *acc);
    for (size_t r = 0; r < AT_QR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (size_t r = 0; r < nr; r++)
        for (size_t d = 0; d < D; d++)
            Q[r * D + d] = c->q[qoff[r] + d] * c->qscale;
    size_t jmax = jend[nr - 1], ldv = c->Hkv * D;
    for (size_t b = 0; b * AT_KB < jmax; b++) {
        if (!at_block_vis(c, b, jend, nr, vis))
            continue;
        const float *kt = c->kt + (kvh * c->nkb + b) * D * AT_KB;
        for (size_t r0 = 0; r0 < nr8; r0 += 8) {
            at_f32_scores8(Q, D, kt, S, r0, 0);
            at_f32_scores8(Q, D, kt, S, r0, 1);
        }
        at_softmax(S, vis, nr, m, l, corr, P, NULL, 1);
        for (size_t r = nr; r < nr8; r++) { /* padding rows: p = 0 */
            corr[r] = 1.0f;
            memset(P + r * AT_KB, 0, AT_KB * sizeof *P);
        }
        size_t       j0 = b * AT_KB, nk = jmax - j0 < AT_KB ? jmax - j0 : AT_KB;
        const float *vb = c->v + j0 * ldv + kvh * D;
        for (size_t r0 = 0; r0 < nr8; r0 += 8)
            for (size_t d0 = 0; d0 < D; d0 += 32)
                at_f32_pv8(acc, ld, corr, P, vb, ldv, nk, r0, d0, D);
    }
    at_store(c, acc, ld, m, l, nr, qoff);
}

/* ---- the bf16 engines' item scratch ---------------------------------------- */

/* One item's buffers: fp32 S (AT_QR x AT_KB), acc (AT_QR x D16), m, l,
 * corr; bf16 Q planes (ns x AT_QR x Dq) and P planes (ns x AT_QR x AT_KB). */
typedef struct at_bufs {
    float    *S, *acc, *m, *l, *corr;
    uint16_t *qh, *ph;
} at_bufs_t;

/* The item's scratch with acc and the planes zeroed, m = -inf, l = 0, and
 * its nr query rows scaled into the Q planes (split hi + lo when ns is 2).
 * False (and c->nomem) when out of memory. */
static bool at_bf16_setup(at_ctx_t *c, size_t nr, const size_t qoff[AT_QR], size_t ns,
                          at_bufs_t *b) {
    size_t Dq = c->Dq, ld = c->D16, D = c->D;
    size_t nh = ns * AT_QR * (Dq + AT_KB), nf = AT_QR * AT_KB + AT_QR * ld + 3 * AT_QR;
    char  *buf = npu_scratch(NPU_SCRATCH_ATTN_ITEM, nh * 2 + nf * 4);
    if (!buf) {
        atomic_store(&c->nomem, true);
        return false;
    }
    b->S = (float *)(void *)buf;
    b->acc = b->S + AT_QR * AT_KB;
    b->m = b->acc + AT_QR * ld;
    b->l = b->m + AT_QR;
    b->corr = b->l + AT_QR;
    b->qh = (uint16_t *)(void *)(b->corr + AT_QR);
    b->ph = b->qh + ns * AT_QR * Dq;
    memset(b->qh, 0, ns * AT_QR * Dq * sizeof *b->qh);
    memset(b->ph, 0, ns * AT_QR * AT_KB * sizeof *b->ph);
    memset(b->acc, 0, AT_QR * ld * sizeof *b->acc);
    for (size_t r = 0; r < AT_QR; r++) {
        b->m[r] = -INFINITY;
        b->l[r] = 0.0f;
    }
    const __m512 qs = _mm512_set1_ps(c->qscale);
    for (size_t r = 0; r < nr; r++)
        for (size_t d = 0; d < D; d += 16) {
            __mmask16 dm = npu_mask16(D - d);
            __m256i   h, lo;
            at_split(_mm512_mul_ps(_mm512_maskz_loadu_ps(dm, c->q + qoff[r] + d), qs), &h,
                     ns == 2 ? &lo : NULL);
            _mm256_mask_storeu_epi16(b->qh + r * Dq + d, dm, h);
            if (ns == 2)
                _mm256_mask_storeu_epi16(b->qh + AT_QR * Dq + r * Dq + d, dm, lo);
        }
    return true;
}

/* acc rows [0, nr) scaled by corr where the softmax's max grew. */
static void at_rescale(float *acc, size_t ld, const float *corr, size_t nr) {
    for (size_t r = 0; r < nr; r++) {
        if (corr[r] == 1.0f)
            continue;
        __m512 cr = _mm512_set1_ps(corr[r]);
        for (size_t d = 0; d < ld; d += 16)
            _mm512_storeu_ps(acc + r * ld + d,
                             _mm512_mul_ps(_mm512_loadu_ps(acc + r * ld + d), cr));
    }
}

/* ---- AMX-BF16 engine ------------------------------------------------------ */

/* S rows [32 rp, 32 rp + 32) x keys [32 kp, 32 kp + 32) = sum over the
 * split terms of Q K^T, as 2 x 2 tiles over the Dq / 32 chunks. Q planes
 * are qp[0], qp[1] (AT_QR x Dq), K planes kb[0], kb[1] (this block). */
static void at_amx_scores(const uint16_t *const qp[2], const uint16_t *const kb[2], size_t Dq,
                          size_t nterm, float *S, size_t rp, size_t kp) {
    static const int tq[3] = {0, 0, 1}, tk[3] = {0, 1, 0}; /* hi hi, hi lo, lo hi */
    size_t           nck = Dq / 32, ldq = Dq * 2;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (size_t t = 0; t < nterm; t++) {
        const uint16_t *q0 = qp[tq[t]] + rp * 32 * Dq, *q1 = q0 + 16 * Dq;
        const uint16_t *k0 = kb[tk[t]] + (2 * kp) * nck * AT_TILE, *k1 = k0 + nck * AT_TILE;
        for (size_t ch = 0; ch < nck; ch++) {
            _tile_loadd(4, q0 + ch * 32, ldq);
            _tile_loadd(5, q1 + ch * 32, ldq);
            _tile_loadd(6, k0 + ch * AT_TILE, 64);
            _tile_loadd(7, k1 + ch * AT_TILE, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    float *s0 = S + rp * 32 * AT_KB + kp * 32;
    _tile_stored(0, s0, AT_KB * 4);
    _tile_stored(1, s0 + 16, AT_KB * 4);
    _tile_stored(2, s0 + 16 * AT_KB, AT_KB * 4);
    _tile_stored(3, s0 + 16 * AT_KB + 16, AT_KB * 4);
}

/* acc rows [32 rp, +32) x dims [16 dc, 16 dc + 16 nd) (nd 1 or 2) += sum
 * over the split terms of P V for this key block. P planes pp[0], pp[1]
 * (AT_QR x AT_KB), V planes vb[0], vb[1] (this block, ncv chunks). */
static void at_amx_pv(const uint16_t *const pp[2], const uint16_t *const vb[2], size_t ncv,
                      size_t nterm, float *acc, size_t ld, size_t rp, size_t dc, size_t nd) {
    static const int tp[3] = {0, 0, 1}, tv[3] = {0, 1, 0};
    float           *a0 = acc + rp * 32 * ld + dc * 16, *a1 = a0 + 16 * ld;
    size_t           lda = ld * 4;
    _tile_loadd(0, a0, lda);
    _tile_loadd(2, a1, lda);
    if (nd == 2) {
        _tile_loadd(1, a0 + 16, lda);
        _tile_loadd(3, a1 + 16, lda);
    }
    for (size_t t = 0; t < nterm; t++)
        for (size_t hf = 0; hf < 2; hf++) {
            const uint16_t *p0 = pp[tp[t]] + rp * 32 * AT_KB + hf * 32;
            const uint16_t *v0 = vb[tv[t]] + (hf * ncv + dc) * AT_TILE;
            _tile_loadd(4, p0, AT_KB * 2);
            _tile_loadd(5, p0 + 16 * AT_KB, AT_KB * 2);
            _tile_loadd(6, v0, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            if (nd == 2) {
                _tile_loadd(7, v0 + AT_TILE, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
    _tile_stored(0, a0, lda);
    _tile_stored(2, a1, lda);
    if (nd == 2) {
        _tile_stored(1, a0 + 16, lda);
        _tile_stored(3, a1 + 16, lda);
    }
}

static void at_item_amx(void *ctx, size_t it) {
    at_ctx_t *c = ctx;
    size_t    kvh, qb, jend[AT_QR], qoff[AT_QR];
    uint64_t  vis[AT_QR];
    at_item(c, it, &kvh, &qb);
    size_t    nr = at_rows(c, kvh, qb, jend, qoff), nrp = (nr + 31) / 32;
    size_t    Dq = c->Dq, ld = c->D16, ns = c->nsplit, nterm = ns == 2 ? 3 : 1;
    at_bufs_t bf;
    if (!at_bf16_setup(c, nr, qoff, ns, &bf))
        return;
    float    *S = bf.S, *acc = bf.acc, *m = bf.m, *l = bf.l, *corr = bf.corr;
    uint16_t *qh = bf.qh, *ph = bf.ph;
    /* Each thread configures its own tiles (the state is per thread). */
    npu_tiles_16x64();
    const uint16_t *qp[2] = {qh, qh + AT_QR * Dq}, *pp[2] = {ph, ph + AT_QR * AT_KB};
    size_t          nck = Dq / 32, ncv = ld / 16;
    size_t          kblk = 4 * nck * AT_TILE, vblk = 2 * ncv * AT_TILE;
    size_t          jmax = jend[nr - 1];
    for (size_t b = 0; b * AT_KB < jmax; b++) {
        if (!at_block_vis(c, b, jend, nr, vis))
            continue;
        size_t          blk = kvh * c->nkb + b;
        const uint16_t *kb[2] = {c->kp + blk * kblk, c->kp + c->kp_plane + blk * kblk};
        const uint16_t *vb[2] = {c->vp + blk * vblk, c->vp + c->vp_plane + blk * vblk};
        for (size_t rp = 0; rp < nrp; rp++) {
            at_amx_scores(qp, kb, Dq, nterm, S, rp, 0);
            at_amx_scores(qp, kb, Dq, nterm, S, rp, 1);
        }
        /* Padding rows of the last row pair keep p = 0 (never written). */
        if (at_softmax(S, vis, nr, m, l, corr, NULL, ph, ns))
            at_rescale(acc, ld, corr, nr);
        for (size_t rp = 0; rp < nrp; rp++)
            for (size_t dc = 0; dc < ncv; dc += 2)
                at_amx_pv(pp, vb, ncv, nterm, acc, ld, rp, dc, ncv - dc >= 2 ? 2 : 1);
    }
    _tile_release(); /* lets the core drop the tile state between calls */
    at_store(c, acc, ld, m, l, nr, qoff);
}

/* ---- AVX-512 BF16 engine (no AMX) ----------------------------------------- */

/* The AMX engine's operands, multiplied by VDPBF16PS instead of tiles: a K
 * tile row is 16 keys x one pair of dims, a V tile row 16 dims x one pair
 * of keys -- each a 512-bit vector whose dword lanes VDPBF16PS takes as
 * pairs -- and a Q or P row's pair is one broadcast dword. Half the
 * instructions of the fp32 engine's FMAs for the same products; used for
 * NPU_ATTN_BF16 (the fast profile) where the CPU has AVX512_BF16 but no
 * AMX. */

static inline __m512 at_dp(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

static inline __m512i at_pair(const uint16_t *p) {
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return _mm512_set1_epi32((int)w);
}

/* S rows [r0, r0 + 8) x keys [32 kh, 32 kh + 32) = Q K^T (bf16 products,
 * fp32 sums); Q (AT_QR x Dq) bf16, kb this block's K tiles. */
static inline void at_vdp_scores8(const uint16_t *Q, size_t Dq, const uint16_t *kb, float *S,
                                  size_t r0, size_t kh) {
    size_t nck = Dq / 32;
    __m512 a[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i][0] = a[i][1] = _mm512_setzero_ps();
    const uint16_t *k0 = kb + (2 * kh) * nck * AT_TILE, *k1 = k0 + nck * AT_TILE;
    for (size_t ch = 0; ch < nck; ch++)
        for (size_t rr = 0; rr < 16; rr++) {
            __m512i kv0 = _mm512_loadu_si512(k0 + ch * AT_TILE + rr * 32);
            __m512i kv1 = _mm512_loadu_si512(k1 + ch * AT_TILE + rr * 32);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m512i qv = at_pair(Q + (r0 + (size_t)i) * Dq + ch * 32 + 2 * rr);
                a[i][0] = at_dp(a[i][0], qv, kv0);
                a[i][1] = at_dp(a[i][1], qv, kv1);
            }
        }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        _mm512_storeu_ps(S + (r0 + (size_t)i) * AT_KB + 32 * kh, a[i][0]);
        _mm512_storeu_ps(S + (r0 + (size_t)i) * AT_KB + 32 * kh + 16, a[i][1]);
    }
}

/* acc rows [r0, r0 + 8), dims [16 dc, 16 dc + 16 nd) += P V over the
 * block's np key pairs; P (AT_QR x AT_KB) bf16, vb this block's V tiles. */
static inline void at_vdp_pv8(float *acc, size_t ld, const uint16_t *P, const uint16_t *vb,
                              size_t ncv, size_t np, size_t r0, size_t dc, size_t nd) {
    __m512 a[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        float *ar = acc + (r0 + (size_t)i) * ld + dc * 16;
        a[i][0] = _mm512_loadu_ps(ar);
        a[i][1] = nd == 2 ? _mm512_loadu_ps(ar + 16) : _mm512_setzero_ps();
    }
    for (size_t jp = 0; jp < np; jp++) {
        const uint16_t *row = vb + ((jp / 16) * ncv + dc) * AT_TILE + (jp % 16) * 32;
        __m512i         v0 = _mm512_loadu_si512(row);
        __m512i         v1 = nd == 2 ? _mm512_loadu_si512(row + AT_TILE) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i pv = at_pair(P + (r0 + (size_t)i) * AT_KB + 2 * jp);
            a[i][0] = at_dp(a[i][0], pv, v0);
            a[i][1] = at_dp(a[i][1], pv, v1);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        float *ar = acc + (r0 + (size_t)i) * ld + dc * 16;
        _mm512_storeu_ps(ar, a[i][0]);
        if (nd == 2)
            _mm512_storeu_ps(ar + 16, a[i][1]);
    }
}

static void at_item_vdp(void *ctx, size_t it) {
    at_ctx_t *c = ctx;
    size_t    kvh, qb, jend[AT_QR], qoff[AT_QR];
    uint64_t  vis[AT_QR];
    at_item(c, it, &kvh, &qb);
    size_t    nr = at_rows(c, kvh, qb, jend, qoff), nr8 = (nr + 7) / 8 * 8;
    size_t    Dq = c->Dq, ld = c->D16;
    at_bufs_t bf;
    if (!at_bf16_setup(c, nr, qoff, 1, &bf))
        return;
    float    *S = bf.S, *acc = bf.acc, *m = bf.m, *l = bf.l, *corr = bf.corr;
    uint16_t *qh = bf.qh, *ph = bf.ph;
    size_t    nck = Dq / 32, ncv = ld / 16;
    size_t    kblk = 4 * nck * AT_TILE, vblk = 2 * ncv * AT_TILE;
    size_t    jmax = jend[nr - 1];
    for (size_t b = 0; b * AT_KB < jmax; b++) {
        if (!at_block_vis(c, b, jend, nr, vis))
            continue;
        size_t          blk = kvh * c->nkb + b;
        const uint16_t *kb = c->kp + blk * kblk, *vb = c->vp + blk * vblk;
        for (size_t r0 = 0; r0 < nr8; r0 += 8) {
            at_vdp_scores8(qh, Dq, kb, S, r0, 0);
            at_vdp_scores8(qh, Dq, kb, S, r0, 1);
        }
        /* Padding rows keep p = 0 (never written). */
        if (at_softmax(S, vis, nr, m, l, corr, NULL, ph, 1))
            at_rescale(acc, ld, corr, nr);
        size_t j0 = b * AT_KB, nk = jmax - j0 < AT_KB ? jmax - j0 : AT_KB;
        for (size_t r0 = 0; r0 < nr8; r0 += 8)
            for (size_t dc = 0; dc < ncv; dc += 2)
                at_vdp_pv8(acc, ld, ph, vb, ncv, (nk + 1) / 2, r0, dc, ncv - dc >= 2 ? 2 : 1);
    }
    at_store(c, acc, ld, m, l, nr, qoff);
}

/* ---- entry points --------------------------------------------------------- */

bool npu_attention_amx_usable(void) {
    const npu_features_t *f = npu_probe();
    return f->amx_tile && f->amx_bf16 && f->amx_usable && f->avx512_bf16 && f->avx512f &&
           f->avx512bw && f->avx512vl;
}

bool npu_attention_bf16_usable(void) {
    const npu_features_t *f = npu_probe();
    return f->avx512_bf16 && f->avx512f && f->avx512bw && f->avx512vl;
}

svc_err_t npu_attention_tiled_mode(const float *q, const float *k, const float *v, size_t Tq,
                                   size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                   bool causal, const uint8_t *key_mask, float *out, float *lse,
                                   npu_attn_mode_t mode) {
    SVC_ASSERT((!causal || Tq <= Tk) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
               head_dim > 0);
    if (Tq == 0 || n_heads == 0)
        return SVC_OK;
    /* BF16X3 is AMX's alone (three products on vectors would lose to fp32);
     * BF16 runs on AVX512_BF16 vectors where there are no tiles */
    bool amx = npu_attention_amx_usable();
    if ((mode == NPU_ATTN_BF16X3 && !amx) ||
        (mode == NPU_ATTN_BF16 && !npu_attention_bf16_usable()))
        mode = NPU_ATTN_FP32;
    size_t   nkb = (Tk + AT_KB - 1) / AT_KB, G = n_heads / n_kv_heads;
    at_ctx_t c = {
        .q = q,
        .k = k,
        .v = v,
        .out = out,
        .lse = lse,
        .Tq = Tq,
        .Tk = Tk,
        .H = n_heads,
        .Hkv = n_kv_heads,
        .G = G,
        .D = head_dim,
        .causal = causal,
        .mode = mode,
        .nkb = nkb,
        .nqb = (Tq * G + AT_QR - 1) / AT_QR,
        .qscale = (float)(1.4426950408889634 / sqrt((double)head_dim)),
        .Dq = (head_dim + 31) / 32 * 32,
        .D16 = (head_dim + 15) / 16 * 16,
        .nsplit = mode == NPU_ATTN_BF16X3 ? 2 : 1,
    };
    atomic_init(&c.nomem, false);
    uint64_t *kbits = malloc(nkb * sizeof *kbits);
    if (!kbits)
        return SVC_ERR_NOMEM;
    for (size_t b = 0; b < nkb; b++) {
        size_t   nk = Tk - b * AT_KB < AT_KB ? Tk - b * AT_KB : AT_KB;
        uint64_t bits = at_below64(nk);
        if (key_mask)
            for (size_t jb = 0; jb < nk; jb++)
                if (!key_mask[b * AT_KB + jb])
                    bits &= ~((uint64_t)1 << jb);
        kbits[b] = bits;
    }
    c.kbits = kbits;
    void *packed;
    if (mode == NPU_ATTN_FP32) {
        packed = c.kt =
            npu_scratch(NPU_SCRATCH_ATTN_KV, n_kv_heads * nkb * head_dim * AT_KB * sizeof(float));
    } else {
        c.kp_plane = n_kv_heads * nkb * AT_KB * c.Dq;
        c.vp_plane = n_kv_heads * nkb * AT_KB * c.D16;
        packed = c.kp = npu_scratch(NPU_SCRATCH_ATTN_KV,
                                    c.nsplit * (c.kp_plane + c.vp_plane) * sizeof(uint16_t));
        c.vp = c.kp + c.nsplit * c.kp_plane;
    }
    if (!packed) {
        free(kbits);
        return SVC_ERR_NOMEM;
    }
    npu_parallel_for(n_kv_heads * nkb, mode == NPU_ATTN_FP32 ? at_pack_f32 : at_pack_bf16, &c);
    npu_parallel_for(n_kv_heads * c.nqb,
                     mode == NPU_ATTN_FP32 ? at_item_f32
                     : amx                 ? at_item_amx
                                           : at_item_vdp,
                     &c);
    free(kbits);
    return atomic_load(&c.nomem) ? SVC_ERR_NOMEM : SVC_OK;
}

svc_err_t npu_attention_tiled(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                              size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                              const uint8_t *key_mask, float *out) {
    return npu_attention_tiled_mode(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal,
                                    key_mask, out, NULL, NPU_ATTN_BF16);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
