/*
 * npu_amx_mm.c -- the projection matmul on AMX-BF16 tiles (npu.h,
 * npu_matmul_amx_bf16 and its weight layout).
 *
 * out (T, N) = x (T, K) w^T with w packed once at load as bf16 in the
 * order TDPBF16PS reads its B operand: panels of 32 output columns, each
 * panel a run of K blocks of 32, each K block two 1 KiB tiles (columns
 * 0..15 and 16..31) whose row r holds, for each column c, the pair
 * w[c][2r], w[c][2r + 1]. A tile of B is then one contiguous 1 KiB load.
 *
 * The activations are rounded to bf16 (nearest even), or split into a bf16
 * hi and a bf16 lo = bf16(x - hi) that both multiply the same B tiles
 * (npu.h: why), and the products accumulate in fp32 inside the tiles.
 * Blocking, from the inside out (why: the 2x2 tile kernel loads 4 tiles
 * per 4 products, 6 per 8 when split, so its operands must come from L1
 * and L2 for the products to be the limit; measured with random data, the
 * split micro-kernel keeps ~90% of the tile peak with A and B in L2, ~45%
 * with B streamed from memory):
 *  - micro-kernel: 32 rows x 32 columns = 4 accumulator tiles, 2 A tiles,
 *    2 B tiles (all 8 tile registers), over KC = 512 of K;
 *  - a row chunk of MC = 512 rows is converted to bf16 once, in parallel,
 *    into tile order (each 16 x 32 tile 1 KiB contiguous, a_at);
 *  - its items -- column blocks of NPB = 8 panels (256 columns) -- go to
 *    the pool; an item loops k block > row block > panel, so its B slices
 *    (8 x 32 KiB) stay in L2 across the row blocks and the A block (32 x
 *    KC, 64 KiB split) across the panels;
 *  - a 32 x 32 block of C sits in the item's fp32 buffer between K blocks
 *    and the last K block writes it straight to out (a block that sticks
 *    out past T or N goes through the buffer: rows and columns past them
 *    are computed on zeros and never stored);
 *  - the traffic that remains is A, read once per item (T x K x 4 bytes
 *    per 256 columns), and B, once per chunk.
 * Measured against the row-major A, KC = 512 layout before it (bench in
 * one process, alternating, best of 9 on one thread): 1.05-1.3x at
 * 1024 x 2048 -> 6144, 1.02-1.09x at 1024 x 6144 -> 2048, bit-identical.
 * Each output element is the same sum in the same order whatever T and
 * the chunking are: a row's result does not depend on the other rows.
 *
 * Compiled for AMX by the target pragma below (CMake builds npu/ with the
 * baseline flags); only called after npu_probe() said amx_bf16, avx512_bf16
 * and amx_usable.
 */
#include "npu.h"

#include <immintrin.h>
#include <stdlib.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((                                                                                \
        target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))),           \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#endif

#include "npu_amx_int.h"
#include "npu_vec_int.h"

_Static_assert(NPU_WPACK_NR == 32, "a panel is two 16-column tiles");

#define AMX_KB   32  /* K per tile product (16 bf16 pairs) */
#define AMX_TILE 512 /* bf16 per tile: 16 rows x 32 */
#define AMX_KC   512 /* K per block (see above) */
#define AMX_MC   512 /* rows per chunk */
#define AMX_NPB  8   /* panels (of 32 columns) per item */
/* Bytes of B prefetched ahead while the first row block of an item reads
 * it from memory (the later ones find it in L2). Why: a panel's K run is
 * contiguous, but the item interleaves 8 of them and the L2 streamer stops
 * at every 4 KiB page, so at few rows the tile loads waited on memory.
 * Measured on 24 different 2048 -> 6144 weights (more than L3), 2
 * threads, alternating with and without: 8 rows 1.1-1.45x (2.2-3.5 GB/s
 * of weights -> 3.1-4.6), 128 and 1,024 rows within the noise; 8 KiB and
 * 16 KiB ahead did no better. */
#define AMX_PF 4096

static size_t round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

size_t npu_amx_pack_elems(size_t N, size_t K) {
    return round_up(N, NPU_WPACK_NR) * round_up(K, AMX_KB);
}

/* Rows [n0, n0 + 32) of w in bf16 pairs (VCVTNEPS2BF16: nearest even, as
 * npu_f32_to_bf16, but a denormal becomes 0), zero past N and K: rows is
 * (32, Kp / 2) uint32, each the pair (k = 2i, 2i + 1) of one row. */
static void panel_rows(const float *w, size_t N, size_t K, size_t Kp, size_t n0, uint32_t *rows) {
    for (size_t c = 0; c < 32; c++) {
        uint16_t *r = (uint16_t *)(rows + c * (Kp / 2));
        if (n0 + c >= N) {
            memset(r, 0, Kp * sizeof *r);
            continue;
        }
        const float *wr = w + (n0 + c) * K;
        for (size_t k = 0; k < Kp; k += 16) {
            size_t    left = k < K ? K - k : 0;
            __mmask16 m = npu_mask16(left);
            __m512    v = _mm512_maskz_loadu_ps(m, left ? wr + k : wr);
            _mm256_storeu_si256((__m256i *)(r + k), (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
}

typedef struct pack_job {
    const float *w;
    size_t       N, K, Kp, n_kb;
    uint16_t    *dst;
} pack_job_t;

/* Panel p (output columns [32 p, 32 p + 32)): its tiles are its own, so
 * the panels go to the pool (at load: a nano BF16 package packs ~1.9 G
 * weights). */
static void pack_panel(void *ctx, size_t p) {
    const pack_job_t *j = ctx;
    const float      *w = j->w;
    size_t            N = j->N, K = j->K, Kp = j->Kp;
    uint32_t         *rows = malloc(32 * (Kp / 2) * sizeof *rows);
    if (rows)
        panel_rows(w, N, K, Kp, p * 32, rows);
    for (size_t kb = 0; kb < j->n_kb; kb++)
        for (size_t h = 0; h < 2; h++) {
            /* tile row r, column c = the pair (k = 32 kb + 2r, +1) of
             * output column 32 p + 16 h + c */
            uint32_t *tile = (uint32_t *)(j->dst + ((p * j->n_kb + kb) * 2 + h) * AMX_TILE);
            for (size_t r = 0; r < 16; r++)
                for (size_t c = 0; c < 16; c++) {
                    size_t n = p * 32 + h * 16 + c, k = kb * AMX_KB + 2 * r;
                    if (rows)
                        tile[r * 16 + c] = rows[(h * 16 + c) * (Kp / 2) + kb * 16 + r];
                    else /* no room for the row buffer: element by element */
                        tile[r * 16 + c] =
                            (n < N && k < K ? npu_f32_to_bf16(w[n * K + k]) : 0u) |
                            (n < N && k + 1 < K ? (uint32_t)npu_f32_to_bf16(w[n * K + k + 1]) << 16
                                                : 0u);
                }
        }
    free(rows);
}

void npu_amx_pack_bf16(const float *w, size_t N, size_t K, uint16_t *dst) {
    size_t     Kp = round_up(K, AMX_KB);
    pack_job_t j = {w, N, K, Kp, Kp / AMX_KB, dst};
    npu_parallel_for(round_up(N, NPU_WPACK_NR) / NPU_WPACK_NR, pack_panel, &j);
}

float npu_amx_pack_at(const uint16_t *pk, size_t K, size_t n, size_t k) {
    size_t n_kb = round_up(K, AMX_KB) / AMX_KB;
    size_t p = n / 32, h = n % 32 / 16, c = n % 16, kb = k / AMX_KB, r = k % AMX_KB / 2, j = k % 2;
    return npu_bf16_to_f32(pk[((p * n_kb + kb) * 2 + h) * AMX_TILE + r * 32 + c * 2 + j]);
}

/* A 32 x 32 fp32 block of C: where it is read from (NULL: it starts at
 * zero) and where it is written, each with its row stride in floats. */
typedef struct c_blk {
    const float *in;
    size_t       ld_in;
    float       *out;
    size_t       ld_out;
} c_blk_t;

/* c.out = c.in (or 0) + a (two 16-row tile rows of kc / 32 tiles, the
 * second a_next elements after the first) times the panel slice b (kc / 32
 * blocks of 2 tiles); and, when lo is not NULL, + lo (the rounding
 * remainders of a, same layout) times b. stream: b comes from memory
 * (prefetched AMX_PF ahead). */
static void micro_2x2(const uint16_t *a, const uint16_t *lo, size_t a_next, const uint16_t *b,
                      size_t kc, c_blk_t c, bool stream) {
    if (!c.in) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        size_t si = c.ld_in * sizeof *c.in;
        _tile_loadd(0, c.in, si);
        _tile_loadd(1, c.in + 16, si);
        _tile_loadd(2, c.in + 16 * c.ld_in, si);
        _tile_loadd(3, c.in + 16 * c.ld_in + 16, si);
    }
    /* Each load is placed right after the last product that reads the
     * register's old value, and before the first that needs the new one:
     * tile registers are not renamed, so a load waits for the products
     * still reading it, and this order overlaps it with the others. */
    for (size_t kb = 0; kb < kc / AMX_KB; kb++) {
        const uint16_t *ak = a + kb * AMX_TILE, *bk = b + kb * 2 * AMX_TILE;
        if (stream) /* the 2 KiB of this panel's B AMX_PF bytes ahead, into L2 */
            for (size_t l = 0; l < 2 * AMX_TILE * sizeof *bk; l += 64)
                _mm_prefetch((const char *)bk + AMX_PF + l, _MM_HINT_T1);
        _tile_loadd(4, ak, 64);
        _tile_loadd(6, bk, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bk + AMX_TILE, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, ak + a_next, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        if (lo) {
            const uint16_t *lk = lo + kb * AMX_TILE;
            _tile_loadd(4, lk, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, lk + a_next, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    size_t so = c.ld_out * sizeof *c.out;
    _tile_stored(0, c.out, so);
    _tile_stored(1, c.out + 16, so);
    _tile_stored(2, c.out + 16 * c.ld_out, so);
    _tile_stored(3, c.out + 16 * c.ld_out + 16, so);
}

typedef struct mm_job {
    const float    *x;
    const uint16_t *pk;
    size_t          T, K, N, Kp, n_kb, n_nblk;
    float          *out;
    /* the row chunk in flight: rows [t0, t0 + mc), mcp = mc rounded up to
     * 32; a = its bf16 in tile order (a_at), lo = the remainders x - a in
     * bf16 (split) in the same order, or NULL */
    size_t    t0, mc, mcp;
    uint16_t *a, *lo;
    bool      split;
} mm_job_t;

/* Where row r, K block kb of a chunk starts: the chunk is stored as tiles,
 * 16 rows x 32 bf16 (1 KiB, contiguous), K blocks of one 16-row group next
 * to each other. Why: a tile load from contiguous memory is one 1 KiB
 * stream; from rows Kp apart it touches 16 lines that compete for L1 sets,
 * which measured ~15% slower on the L1-resident micro-kernel. */
static size_t a_at(const mm_job_t *j, size_t r, size_t kb) {
    return ((r / 16) * j->n_kb + kb) * AMX_TILE + (r % 16) * AMX_KB;
}

/* Rows [32 i, 32 i + 32) of the chunk: a = bf16 of x, zero past T and K;
 * written tile by tile, so that each 1 KiB tile is filled at once. */
static void convert_rows(void *ctx, size_t i) {
    const mm_job_t *j = ctx;
    for (size_t r0 = 32 * i; r0 < 32 * i + 32; r0 += 16)
        for (size_t kb = 0; kb < j->n_kb; kb++) {
            size_t at = a_at(j, r0, kb);
            for (size_t r = r0; r < r0 + 16; r++)
                for (size_t k = kb * AMX_KB; k < kb * AMX_KB + AMX_KB; k += 16) {
                    const float *xr = r < j->mc ? j->x + (j->t0 + r) * j->K : NULL;
                    size_t       left = xr && k < j->K ? j->K - k : 0;
                    __mmask16    m = npu_mask16(left);
                    /* A masked load reads nothing past the mask: no access
                     * past K or past the chunk's last row. */
                    __m512  v = _mm512_maskz_loadu_ps(m, left ? xr + k : j->x);
                    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
                    size_t  o = at + (r - r0) * AMX_KB + k % AMX_KB;
                    _mm256_storeu_si256((__m256i *)(j->a + o), h);
                    if (j->lo) {
                        /* v - hi is exact in fp32; its bf16 leaves ~2^-17 of v. */
                        __m512 hf =
                            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                        _mm256_storeu_si256((__m256i *)(j->lo + o),
                                            (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf)));
                    }
                }
        }
}

/* Without scratch (an allocation failed): the same products, one at a
 * time, on the bf16-rounded inputs. Slow, but the matmul never fails. */
static void rows_scalar(const mm_job_t *j, size_t t0, size_t mc, size_t n0, size_t nc) {
    for (size_t t = t0; t < t0 + mc; t++)
        for (size_t n = n0; n < n0 + nc; n++) {
            float s = 0;
            for (size_t k = 0; k < j->K; k++)
                s += (j->split ? j->x[t * j->K + k]
                               : npu_bf16_to_f32(npu_f32_to_bf16(j->x[t * j->K + k]))) *
                     npu_amx_pack_at(j->pk, j->K, n, k);
            j->out[t * j->N + n] = s;
        }
}

/* Item i: the chunk's rows times column block i (AMX_NPB panels), in the
 * order the header explains; ldc pads the buffer's rows so that the 16
 * rows of a C tile do not share L1 sets. */
static void mm_item(void *ctx, size_t i) {
    const mm_job_t *j = ctx;
    size_t          p0 = i * AMX_NPB, n_pan = round_up(j->N, 32) / 32;
    size_t          np = n_pan - p0 < AMX_NPB ? n_pan - p0 : AMX_NPB;
    size_t          n0 = p0 * 32, nc = j->N - n0 < np * 32 ? j->N - n0 : np * 32;
    size_t          ldc = AMX_NPB * 32 + 16, a_next = j->n_kb * AMX_TILE;
    float          *c = npu_scratch(NPU_SCRATCH_MM_C, j->mcp * ldc * sizeof *c);
    if (!c) {
        rows_scalar(j, j->t0, j->mc, n0, nc);
        return;
    }
    npu_tiles_16x64();
    for (size_t k0 = 0; k0 < j->Kp; k0 += AMX_KC) {
        size_t kc = j->Kp - k0 < AMX_KC ? j->Kp - k0 : AMX_KC;
        bool   last = k0 + kc == j->Kp;
        for (size_t tb = 0; tb < j->mcp; tb += 32) {
            size_t at = a_at(j, tb, k0 / AMX_KB);
            for (size_t p = 0; p < np; p++) {
                const uint16_t *b = j->pk + (((p0 + p) * j->n_kb + k0 / AMX_KB) * 2) * AMX_TILE;
                float          *cb = c + tb * ldc + p * 32;
                c_blk_t         cc = {k0 ? cb : NULL, ldc, cb, ldc};
                if (last && tb + 32 <= j->mc && p * 32 + 32 <= nc)
                    cc.out = j->out + (j->t0 + tb) * j->N + n0 + p * 32, cc.ld_out = j->N;
                micro_2x2(j->a + at, j->lo ? j->lo + at : NULL, a_next, b, kc, cc, tb == 0);
            }
        }
    }
    _tile_release();
    /* the blocks that stick out past T or N: their valid part */
    for (size_t tb = 0; tb < j->mcp; tb += 32)
        for (size_t p = 0; p < np; p++) {
            if (tb + 32 <= j->mc && p * 32 + 32 <= nc)
                continue;
            size_t cols = nc - p * 32 < 32 ? nc - p * 32 : 32;
            for (size_t r = tb; r < tb + 32 && r < j->mc; r++)
                memcpy(j->out + (j->t0 + r) * j->N + n0 + p * 32, c + r * ldc + p * 32,
                       cols * sizeof *c);
        }
}

void npu_matmul_amx(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N, bool split,
                    float *out) {
    if (T == 0 || N == 0)
        return;
    if (K == 0) {
        memset(out, 0, T * N * sizeof *out);
        return;
    }
    size_t   n_pan = round_up(N, 32) / 32, Kp = round_up(K, AMX_KB);
    mm_job_t j = {.x = x,
                  .pk = pk,
                  .T = T,
                  .K = K,
                  .N = N,
                  .Kp = Kp,
                  .n_kb = Kp / AMX_KB,
                  .n_nblk = (n_pan + AMX_NPB - 1) / AMX_NPB,
                  .out = out,
                  .split = split};
    size_t   chunk = round_up(T < AMX_MC ? T : AMX_MC, 32);
    j.a = npu_scratch(NPU_SCRATCH_MM_A, (split ? 2 : 1) * chunk * Kp * sizeof *j.a);
    if (!j.a) {
        rows_scalar(&j, 0, T, 0, N);
        return;
    }
    j.lo = split ? j.a + chunk * Kp : NULL;
    /* Below ~2 M multiply-adds the pool's wake-up costs more than it gains. */
    bool par = (double)T * (double)N * (double)K >= 2e6;
    for (j.t0 = 0; j.t0 < T; j.t0 += AMX_MC) {
        j.mc = T - j.t0 < AMX_MC ? T - j.t0 : AMX_MC;
        j.mcp = round_up(j.mc, 32);
        npu_run_items(par, j.mcp / 32, convert_rows, &j);
        npu_run_items(par, j.n_nblk, mm_item, &j);
    }
}

void npu_matmul_amx_bf16(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N,
                         float *out) {
    npu_matmul_amx(x, pk, T, K, N, false, out);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
