/*
 * npu_amx_i8.c -- the projection matmul on AMX-INT8 tiles for weights that
 * a package stored quantised (npu.h, npu_matmul_amx_i8 and its layout).
 *
 * out (T, N) = x (T, K) w^T, both operands as 16-bit integers, each split
 * exactly into two signed bytes:
 *  - w with one scale per output column: sw[n] = max_k |w[n][k]| / QMAX,
 *    wq = round(w / sw) = 256 wh + wl, wh = round(wq / 256), wl in
 *    [-128, 127]; QMAX = 127 * 256 + 127 keeps wh within a signed byte;
 *  - x with one scale per row, the same way: xq = 256 xh + xl;
 *  - out = sx[t] sw[n] 256 (256 Chh + Cm), where Chh = sum xh wh and Cm =
 *    sum (xh wl + xl wh): three TDPBSSD products per 64 of K into two int32
 *    accumulators (exact integers: |Chh| <= 128^2 K and |Cm| <= 2 128^2 K
 *    stay below 2^31 for K <= NPU_AMX_I8_MAX_K).
 * What is left out is sum xl wl, ~2^-16 of the product, and the two
 * roundings, 2^-16 of a row's or a column's largest value (test_npu_i8
 * measures the whole). Why not fewer bits: one int8 per weight column
 * (1/254 of its range) moved the synthetic nano q4nx package's final
 * hidden state to cosine 0.97 of the fp32 path, and even bf16 weights
 * (2^-9 per weight, the bf16 split's) to 0.998, past issue 7's 0.999. Why
 * per column and not the package's groups of 32: a group's scale changes
 * along K, inside a tile product, and would need an accumulator and a
 * rescale per 32 of K; 15 bits per column keep a 4-bit group's values to a
 * small fraction of their step whatever the group's scale.
 * Three int8 products of 64 do the work of the bf16 split's four products
 * of 32 (npu_amx_mm.c), each in the same tile time.
 *
 * Weight layout (npu_amx_i8_pack): panels of 32 output columns, each a run
 * of K blocks of 64, each K block four 1 KiB tiles -- wh of columns 0..15,
 * 16..31, then wl of the same -- whose row r holds, for each column c, the
 * 4 bytes of k = 4r .. 4r + 3 (TDPBSSD's B operand); then the column
 * scales (fp32, N rounded up to 32).
 * Blocking (as npu_amx_mm.c, whose header explains the measurements):
 *  - micro-kernel: 16 rows x 32 columns = 4 accumulators (Chh, Cm of two
 *    column tiles), xh and xl, and two B tiles reloaded between the column
 *    tiles: all 8 tile registers, one tile load per product;
 *  - a chunk of MC = 512 rows is quantised once into tile order, in
 *    parallel; items -- column blocks of NPB = 8 panels -- go to the pool
 *    and loop k block (KC = 2048) > row block > panel; between k blocks the
 *    int32 sums wait in the item's buffer (only when K > KC).
 * Each output element is the same sum whatever T and the chunking are.
 *
 * Compiled for AMX by the target pragma below; only called after
 * npu_probe() said amx_int8, avx512bw and amx_usable.
 */
#include "npu.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,fma"))),           \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

#include "npu_amx_int.h"
#include "npu_vec_int.h"

#define I8_KB   64   /* K per tile product */
#define I8_TILE 1024 /* bytes per tile: 16 rows x 64 */
#define I8_KC   2048 /* K per block: one for every nano projection but the MLP's down */
#define I8_MC   512  /* rows per chunk */
#define I8_NPB  8    /* panels (of 32 columns) per item */
/* Bytes of B prefetched ahead while an item's first row block streams it
 * from memory, as npu_amx_mm.c's AMX_PF (why there). Measured: 24 int8x3
 * packs of 2048 -> 6144 at 8 rows, 2 threads, separate processes with and
 * without, alternating 8 times: median 0.045 s against 0.060 (better in 6
 * of the 8 pairs; this VM's noise is as large as the gain). */
#define I8_PF   4096
#define I8_QMAX NPU_I8_QMAX

static size_t round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

static size_t tile_bytes(size_t N, size_t K) {
    return 2 * round_up(N, 32) * round_up(K, I8_KB);
}

/* q = round(v) clamped to +-QMAX, split as 256 hi + lo, hi = round(q /
 * 256) (ties up), lo in [-128, 127]. */
static void split16(float v, int *hi, int *lo) {
    float q = nearbyintf(v);
    q = q > (float)I8_QMAX ? (float)I8_QMAX : q < -(float)I8_QMAX ? -(float)I8_QMAX : q;
    int qi = (int)q;
    *hi = (qi + 128) >> 8;
    *lo = qi - 256 * *hi;
}

/* Byte of (column n, k) in plane pl (0 = wh, 1 = wl) of the layout. */
static size_t w_at(size_t n_kb, size_t n, size_t k, int pl) {
    size_t p = n / 32, h = n % 32 / 16, c = n % 16, kb = k / I8_KB, r = k % I8_KB / 4, j = k % 4;
    return ((p * n_kb + kb) * 4 + (size_t)pl * 2 + h) * I8_TILE + r * 64 + c * 4 + j;
}

size_t npu_amx_i8_pack_bytes(size_t N, size_t K) {
    return tile_bytes(N, K) + round_up(N, 32) * sizeof(float);
}

void npu_amx_i8_pack(const float *w, size_t N, size_t K, void *dst) {
    size_t  n_kb = round_up(K, I8_KB) / I8_KB, Kp = n_kb * I8_KB;
    int8_t *t = dst;
    float  *sw = (float *)(void *)((char *)dst + tile_bytes(N, K));
    memset(dst, 0, npu_amx_i8_pack_bytes(N, K));
    for (size_t n = 0; n < N; n++) {
        const float *wr = w + n * K;
        float        inv;
        npu_i8_row_scale(wr, K, &sw[n], &inv);
        __m512 vi = _mm512_set1_ps(inv);
        for (size_t k = 0; k < Kp; k += 16) {
            size_t  left = k < K ? K - k : 0;
            __m128i h, l;
            npu_i8_split16_x16(
                _mm512_mul_ps(_mm512_maskz_loadu_ps(npu_mask16(left), left ? wr + k : wr), vi), &h,
                &l);
            /* 4 bytes (k .. k + 3) per tile row: 4 rows of the tile */
            uint32_t hb[4], lb[4];
            _mm_storeu_si128((__m128i *)(void *)hb, h);
            _mm_storeu_si128((__m128i *)(void *)lb, l);
            for (size_t g = 0; g < 4; g++) {
                memcpy(t + w_at(n_kb, n, k + 4 * g, 0), &hb[g], 4);
                memcpy(t + w_at(n_kb, n, k + 4 * g, 1), &lb[g], 4);
            }
        }
    }
}

/* The scheme's exact value of one output element (for tests and the
 * fallback below): the same integers, products and scales, in double. */
static double ref_elem(const float *xr, const int8_t *t, const float *sw, size_t n_kb, size_t K,
                       size_t n, float sx, float inv) {
    double hh = 0, m = 0;
    for (size_t k = 0; k < K; k++) {
        int xh, xl;
        split16(xr[k] * inv, &xh, &xl);
        int wh = t[w_at(n_kb, n, k, 0)], wl = t[w_at(n_kb, n, k, 1)];
        hh += (double)xh * wh;
        m += (double)xh * wl + (double)xl * wh;
    }
    return (256.0 * hh + m) * 256.0 * sx * sw[n];
}

void npu_matmul_i8_ref(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    size_t        n_kb = round_up(K, I8_KB) / I8_KB;
    const int8_t *t = pk;
    const float  *sw = (const float *)(const void *)((const char *)pk + tile_bytes(N, K));
    for (size_t r = 0; r < T; r++) {
        float sx, inv;
        npu_i8_row_scale(x + r * K, K, &sx, &inv);
        for (size_t n = 0; n < N; n++)
            out[r * N + n] = (float)ref_elem(x + r * K, t, sw, n_kb, K, n, sx, inv);
    }
}

typedef struct i8_job {
    const float  *x;
    const int8_t *pk;
    const float  *sw;
    size_t        T, K, N, Kp, n_kb, n_nblk;
    float        *out;
    /* the chunk in flight: rows [t0, t0 + mc), mcp = mc rounded up to 16;
     * hi and lo in tile order (a_at), sx its row scales */
    size_t  t0, mc, mcp;
    int8_t *hi, *lo;
    float  *sx;
} i8_job_t;

/* Where row r, K block kb starts in hi and lo: 16 x 64-byte tiles, the K
 * blocks of one 16-row group next to each other. */
static size_t a_at(const i8_job_t *j, size_t r, size_t kb) {
    return ((r / 16) * j->n_kb + kb) * I8_TILE + (r % 16) * I8_KB;
}

/* Rows [16 i, 16 i + 16) of the chunk quantised: xh, xl and sx (zero past
 * T and K), as split16 does it. */
static void quant_rows(void *ctx, size_t i) {
    const i8_job_t *j = ctx;
    for (size_t r = 16 * i; r < 16 * i + 16; r++) {
        const float *xr = r < j->mc ? j->x + (j->t0 + r) * j->K : NULL;
        float        sx = 0.0f, inv = 0.0f;
        if (xr)
            npu_i8_row_scale(xr, j->K, &sx, &inv);
        j->sx[r] = sx;
        __m512 vi = _mm512_set1_ps(inv);
        for (size_t k = 0; k < j->Kp; k += 16) {
            size_t  left = xr && k < j->K ? j->K - k : 0;
            __m128i h, l;
            npu_i8_split16_x16(
                _mm512_mul_ps(_mm512_maskz_loadu_ps(npu_mask16(left), left ? xr + k : j->x), vi),
                &h, &l);
            size_t at = a_at(j, r, k / I8_KB) + k % I8_KB;
            _mm_storeu_si128((__m128i *)(void *)(j->hi + at), h);
            _mm_storeu_si128((__m128i *)(void *)(j->lo + at), l);
        }
    }
}

/* Where a 16 x 32 block's int32 sums come from (in; NULL = start at zero)
 * and go (acc): per row the 32 columns' Chh, then their Cm. */
typedef struct i8_blk {
    const int32_t *in;
    int32_t       *acc;
    size_t         ld; /* ints per row of in / acc */
} i8_blk_t;

/* The block's sums over kc of K: tiles 0, 2 = Chh of column tiles 0, 1;
 * 1, 3 = Cm of the same; xh / xl are kc / 64 tiles each, b the panel slice
 * (kc / 64 groups of 4 tiles: wh0, wh1, wl0, wl1). In acc a row holds the
 * 32 columns' Chh, then their Cm. stream: b comes from memory (prefetched
 * I8_PF ahead). */
static void micro_1x2(const int8_t *hi, const int8_t *lo, const int8_t *b, size_t kc, i8_blk_t c,
                      bool stream) {
    size_t s = c.ld * sizeof(int32_t);
    if (!c.in) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c.in, s);
        _tile_loadd(2, c.in + 16, s);
        _tile_loadd(1, c.in + 32, s);
        _tile_loadd(3, c.in + 48, s);
    }
    /* A load follows the last product that reads the register's old value
     * (tile registers are not renamed: npu_amx_mm.c). */
    for (size_t kb = 0; kb < kc / I8_KB; kb++) {
        const int8_t *bk = b + kb * 4 * I8_TILE;
        if (stream) /* this K block's 4 KiB of B, I8_PF bytes ahead, into L2 */
            for (size_t l = 0; l < 4 * I8_TILE; l += 64)
                _mm_prefetch((const char *)bk + I8_PF + l, _MM_HINT_T1);
        _tile_loadd(4, hi + kb * I8_TILE, 64);
        _tile_loadd(6, bk, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_loadd(7, bk + 2 * I8_TILE, 64);
        _tile_dpbssd(1, 4, 7);
        _tile_loadd(5, lo + kb * I8_TILE, 64);
        _tile_dpbssd(1, 5, 6);
        _tile_loadd(6, bk + I8_TILE, 64);
        _tile_dpbssd(2, 4, 6);
        _tile_loadd(7, bk + 3 * I8_TILE, 64);
        _tile_dpbssd(3, 4, 7);
        _tile_dpbssd(3, 5, 6);
    }
    _tile_stored(0, c.acc, s);
    _tile_stored(2, c.acc + 16, s);
    _tile_stored(1, c.acc + 32, s);
    _tile_stored(3, c.acc + 48, s);
}

/* out rows [r0, r0 + rows) x columns [n0, n0 + cols) (cols <= 32) from
 * the block's int32 sums (row stride ld: Chh at 0..31, Cm at 32..63). */
static void finish(const i8_job_t *j, const int32_t *acc, size_t ld, size_t r0, size_t rows,
                   size_t n0, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        const int32_t *a = acc + r * ld;
        float         *o = j->out + (j->t0 + r0 + r) * j->N + n0;
        __m512         sx = _mm512_set1_ps(j->sx[r0 + r] * 256.0f); /* 256 (256 Chh + Cm) */
        for (size_t h = 0; h < 32 && h < cols; h += 16) {
            __mmask16 m = npu_mask16(cols - h);
            __m512    v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a + h)),
                                          _mm512_set1_ps(256.0f),
                                          _mm512_cvtepi32_ps(_mm512_loadu_si512(a + 32 + h)));
            __m512    s = _mm512_mul_ps(sx, _mm512_maskz_loadu_ps(m, j->sw + n0 + h));
            _mm512_mask_storeu_ps(o + h, m, _mm512_mul_ps(v, s));
        }
    }
}

/* Without scratch (an allocation failed): the scheme's reference. */
static void rows_scalar(const i8_job_t *j, size_t t0, size_t mc, size_t n0, size_t nc) {
    for (size_t t = t0; t < t0 + mc; t++) {
        float sx, inv;
        npu_i8_row_scale(j->x + t * j->K, j->K, &sx, &inv);
        for (size_t n = n0; n < n0 + nc; n++)
            j->out[t * j->N + n] =
                (float)ref_elem(j->x + t * j->K, j->pk, j->sw, j->n_kb, j->K, n, sx, inv);
    }
}

/* Item i: the chunk's rows times column block i. The int32 sums of a 16 x
 * 32 block sit in buf between K blocks (row stride 64 + 16 ints: padded
 * against L1 set sharing); a block's last K block goes through a small
 * per-block buffer to out. */
static void i8_item(void *ctx, size_t i) {
    const i8_job_t *j = ctx;
    size_t          p0 = i * I8_NPB, n_pan = round_up(j->N, 32) / 32;
    size_t          np = n_pan - p0 < I8_NPB ? n_pan - p0 : I8_NPB;
    size_t          n0 = p0 * 32, nc = j->N - n0 < np * 32 ? j->N - n0 : np * 32;
    size_t          ld = 80, n_k0 = (j->Kp + I8_KC - 1) / I8_KC;
    size_t          blocks = j->mcp / 16 * np;
    /* one block's sums for the last K block, then (K > KC) every block's */
    int32_t *buf = npu_scratch(NPU_SCRATCH_MM_C, (1 + (n_k0 > 1 ? blocks : 0)) * 16 * ld * 4);
    if (!buf) {
        rows_scalar(j, j->t0, j->mc, n0, nc);
        return;
    }
    int32_t *fin = buf, *keep = buf + 16 * ld;
    npu_tiles_16x64();
    for (size_t k0 = 0; k0 < j->Kp; k0 += I8_KC) {
        size_t kc = j->Kp - k0 < I8_KC ? j->Kp - k0 : I8_KC;
        bool   last = k0 + kc == j->Kp;
        for (size_t tb = 0; tb < j->mcp; tb += 16) {
            size_t at = a_at(j, tb, k0 / I8_KB);
            for (size_t p = 0; p < np; p++) {
                const int8_t *b = j->pk + ((p0 + p) * j->n_kb + k0 / I8_KB) * 4 * I8_TILE;
                int32_t      *kp = keep + (tb / 16 * np + p) * 16 * ld;
                i8_blk_t      c = {k0 ? kp : NULL, last ? fin : kp, ld};
                micro_1x2(j->hi + at, j->lo + at, b, kc, c, tb == 0);
                if (last) /* tb < mc: mcp is mc rounded up to 16 */
                    finish(j, fin, ld, tb, j->mc - tb < 16 ? j->mc - tb : 16, n0 + p * 32,
                           nc - p * 32 < 32 ? nc - p * 32 : 32);
            }
        }
    }
    _tile_release();
}

void npu_matmul_amx_i8(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    if (npu_i8_trivial(T, K, N, out))
        return;
    SVC_ASSERT(K <= NPU_AMX_I8_MAX_K);
    size_t   n_pan = round_up(N, 32) / 32, Kp = round_up(K, I8_KB);
    i8_job_t j = {.x = x,
                  .pk = pk,
                  .sw = npu_i8_pack_scales(pk, N, K),
                  .T = T,
                  .K = K,
                  .N = N,
                  .Kp = Kp,
                  .n_kb = Kp / I8_KB,
                  .n_nblk = (n_pan + I8_NPB - 1) / I8_NPB,
                  .out = out};
    size_t   chunk = round_up(T < I8_MC ? T : I8_MC, 16);
    char    *a = npu_scratch(NPU_SCRATCH_MM_A, 2 * chunk * Kp + chunk * sizeof(float));
    if (!a) {
        rows_scalar(&j, 0, T, 0, N);
        return;
    }
    j.hi = (int8_t *)a;
    j.lo = (int8_t *)a + chunk * Kp;
    j.sx = (float *)(void *)(a + 2 * chunk * Kp);
    bool par = (double)T * (double)N * (double)K >= 2e6;
    for (j.t0 = 0; j.t0 < T; j.t0 += I8_MC) {
        j.mc = T - j.t0 < I8_MC ? T - j.t0 : I8_MC;
        j.mcp = round_up(j.mc, 16);
        npu_run_items(par, j.mcp / 16, quant_rows, &j);
        npu_run_items(par, j.n_nblk, i8_item, &j);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
