/*
 * npu_vnni_grp.c -- the projection matmul for weights stored in groups of
 * 32 along K (Q4_1, Q4_K, Q8 tiles: Q4NX.md §3-4) on AVX-512 VNNI, on
 * the package's own codes ("avx512-grp8x2"; npu.h, npu_wpack_new_groups).
 *
 * A weight is w[n][k] = d[n][g] u[n][k] + m[n][g], g = k / 32, u an
 * unsigned byte (0..15 for the 4-bit kinds). The activations are quantised
 * per row as the int8x3 scheme does them (npu_vec_int.h): xq = 256 xh + xl,
 * x ~ sx xq. Then, exactly in integers per group,
 *
 *     A[g] = sum_k u xq = 256 (sum_k u xh) + sum_k u xl
 *     I[g] = sum_k xq
 *
 * and out[t][n] = sx sum_g (d A[g] + m I[g]), the two terms fused in fp32
 * per group (one FMA each, in g order). Two VPDPBUSD per 4 of K (the
 * codes are VPDPBUSD's unsigned operand as they are, xh and xl its signed
 * one) where int8x3 on the same weights dequantised to 16-bit columns
 * takes three; the weights are the package's exactly (int8x3 keeps them to
 * 2^-16 of a column's range), and a code is one byte where int8x3 needs
 * two. What is left is the activations' rounding, 2^-16 of a row's largest
 * value, as int8x3's. Why not on AMX: a group's scale changes every 32 of
 * K, inside one 64-deep tile product (npu_amx_i8.c); VPDPBUSD's 4-deep
 * steps leave room for the per-group FMAs.
 *
 * Bounds: |A[g]| <= 32 * 255 * 32639 < 2^28 and the intermediate
 * 256 sum u xh as well, so the int32 sums never wrap; |I[g]| <= 32 * 32639
 * < 2^24, exact in fp32.
 *
 * Weight layout (npu_grp_pack): panels of 32 output columns; in a panel,
 * one 1,280-byte block per group: 8 quads x 2 column halves of 64 bytes
 * (for 16 columns the 4 codes of k = 4q .. 4q + 3: VPDPBUSD's 64-byte
 * operand), then d and m of the 32 columns (fp32). Columns past N and k
 * past K are code 0, d = m = 0.
 *
 * Blocking: as npu_vnni_i8.c -- a chunk of MC = 512 rows is quantised once
 * (xh, xl row-major, Kp = K rounded up to 32 bytes each; I per row and
 * group); items of up to NPB panels (G_ITEM_BYTES) go to the pool and walk the chunk 6 rows at
 * a time, each panel a 6 x 32 micro-kernel over all of K: 12 int32 group
 * sums and 12 fp32 accumulators in registers; per group the 8 quads run
 * twice (xh, then the sums shifted by 8, then xl: GCC keeps the block's
 * 16 code vectors in registers for both), then the 24 FMAs. Measured on
 * a Zen 5 (bench_matmul 1024, 2 threads): 630-715 GFLOP/s, 1.2x int8x3's
 * 520-580; the 60 ops per group besides the 192 VPDPBUSD (shift, convert,
 * FMAs, zeroing) are most of the gap to the VNNI peak: on a Zen 4 the
 * FMAs issue to the pipes VPDPBUSD uses (24 VPDPBUSD + 6 FMAs cost 30
 * VPDPBUSD slots in a register loop) while the shifts, converts and
 * broadcasts go to others for free, so the scheme's ceiling is 192 / 216
 * of the VNNI rate in products (bench_amx_peak's grp8x2-ceiling, its op
 * mix in registers); the kernel measured 87-89% of that ceiling there.
 * VPDPWSSD on 16-bit activations (one pass, no shift) ran at VPDPBUSD's
 * instruction rate, two products per lane where VPDPBUSD has four: the
 * same useful rate, twice the code bytes; not written. Tried and not
 * kept: the activation broadcast embedded in each VPDPBUSD ({1to16}
 * operand, one per column half instead of one VPBROADCASTD per row),
 * 470-600 GFLOP/s; without the unrolled quad loop GCC copied every
 * accumulator twice per step (~560).
 *
 * grp8 (npu_matmul_vnni_grp8, D3_NPU_MATMUL=grp8): the same pack times
 * activations of one signed byte per value with a scale s per row and
 * group (max |x| / 127, llama.cpp's Q8 activations): one pass per group,
 * out = sum_g s (d A + m I). 1.6x grp8x2, but on the synthetic nano it
 * moves the hidden state to cosine 0.98 (docs/performance.md): a measurement switch.
 *
 * The fused MLP (npu_mlp_vnni_grp8, the fast profile's Qwen3_5MLP):
 * unfused, gate and up write (T, F) fp32 each, npu_silu_mul reads both
 * and writes one, and the down projection's g8_quant reads it again:
 * four streams of T x F floats (F = 6,144 on the nano) beside the
 * kernels, memory-bound (g8_quant and npu_silu_mul_avx512 were 2.7% and
 * 2.1% of a fast 1 x 1,024 pass, perf, one thread; the stalls on their
 * loads). Fused, per chunk of MC rows: x is quantised once; an item owns
 * npb / 2 pairs (gate panel p, up panel p) and walks the chunk 6 rows
 * at a time, each panel's micro-kernel storing its 6 x 32 sums into a
 * scratch on the stack (G8S_STORE) instead of out; the epilogue takes
 * silu(gate) * up of the 32 columns (npu_silu_mul16, npu_silu_mul's
 * formula) and quantises them with g8_quant_group, g8_quant's own steps:
 * a panel's 32 columns are exactly one group of the down projection's K,
 * so its codes, S and I land in the down job's chunk buffers at group p,
 * and nothing else of the row is needed. Then the down job's g8 items run
 * on that chunk as g_run's would. Every value is the same fp32 operation
 * on the same operands as in the three calls, so the bits are theirs
 * (test_npu_grp mlp_fused, memcmp); what is gone is the fp32 (T, F)
 * traffic: per chunk the down projection's codes (MC x F bytes) and its
 * S and I are all that is kept between the two halves. Measured (the same
 * pass, 2-core Zen 5 VM, shared): the epilogue 1.7% and x's quantisation
 * 1.2% where g8_quant and SiLU were 3.4% and 2.2%, and the kernel's own
 * samples 7.5% fewer (gate and up no longer store their sums to memory);
 * docs/profiles.md has the runs.
 *
 * Each output element is the same sum in the same order whatever T and the
 * chunking are, and npu_matmul_grp_ref computes it with the same integers
 * and the same fp32 operations: test_npu_grp holds the two to equal bits.
 *
 * The kernel is compiled for AVX-512 VNNI by the target pragma below; only
 * called after npu_probe() said avx512_vnni, avx512bw and avx512vl.
 */
#include "npu.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define G_K     NPU_GRP_K /* K per group */
#define G_NR    32        /* columns per panel */
#define G_CODES 1024      /* code bytes per (panel, group): 8 quads x 2 halves x 64 */
#define G_BLK   1280      /* bytes per (panel, group): codes, then d and m */
#define G_MC    512       /* rows per chunk */
#define G_NPB   4         /* panels per item, at most */
/* An item's weights at most (g_npb): they stay in the core's L2 (1 MiB on
 * a Zen 4 or 5) while its row strips' activations stream past. The nano's
 * down projection (K = 6,144: 245 KB a panel) ran 4 panels an item, 983 KB,
 * and fetched them from L3 strip after strip; one panel an item took its
 * grp8 product from 1,010-1,090 to 1,155-1,225 GFLOP/s at 330 rows on 2
 * threads (bench_matmul, Zen 5) and the fast 1 x 330 pass ~3.5% faster. */
#define G_ITEM_BYTES (400u << 10)
#define G_QMAX       32639.0f /* npu_vec_int.h's NPU_I8_QMAX, for the scalar reference */

static size_t g_round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

size_t npu_grp_pack_bytes(size_t N, size_t K) {
    return g_round_up(N, G_NR) / G_NR * g_round_up(K, G_K) / G_K * G_BLK;
}

/* Offset of w[n][k]'s code in the pack of K (G groups). */
static size_t g_code_at(size_t G, size_t n, size_t k) {
    size_t q = k % G_K / 4, half = n % G_NR / 16;
    return (n / G_NR * G + k / G_K) * G_BLK + (q * 2 + half) * 64 + n % 16 * 4 + k % 4;
}

/* Offset of the d of column n, group g, and of its m (128 bytes on). */
static size_t g_scale_at(size_t G, size_t n, size_t g) {
    return (n / G_NR * G + g) * G_BLK + G_CODES + n % G_NR * sizeof(float);
}

static size_t g_min_at(size_t G, size_t n, size_t g) {
    return g_scale_at(G, n, g) + G_NR * sizeof(float);
}

typedef struct g_pack_job {
    const uint8_t *u;
    const float   *d, *m;
    size_t         N, K;
    uint8_t       *dst;
} g_pack_job_t;

/* Panel i of the pack (rows [32 i, 32 i + 32) of u, d, m): its blocks are
 * its own, so the panels go to the pool (at load, ~0.6 s of a nano q4nx
 * package's on one core). */
static void g_pack_panel(void *ctx, size_t i) {
    const g_pack_job_t *j = ctx;
    const uint8_t      *u = j->u;
    const float        *d = j->d, *m = j->m;
    size_t              K = j->K, G = g_round_up(K, G_K) / G_K;
    uint8_t            *p = j->dst;
    memset(p + i * G * G_BLK, 0, G * G_BLK);
    for (size_t n = i * G_NR; n < j->N && n < (i + 1) * G_NR; n++) {
        /* a row's codes 4 at a time: each quad is 4 bytes in a row of the
         * pack (g_code_at's k % 4), so only the row's tail goes byte by byte */
        size_t k = 0;
        for (; k + 4 <= K; k += 4)
            memcpy(p + g_code_at(G, n, k), u + n * K + k, 4);
        for (; k < K; k++)
            p[g_code_at(G, n, k)] = u[n * K + k];
        for (size_t g = 0; g < G; g++) {
            memcpy(p + g_scale_at(G, n, g), &d[n * G + g], sizeof(float));
            memcpy(p + g_min_at(G, n, g), &m[n * G + g], sizeof(float));
        }
    }
}

void npu_grp_pack(const uint8_t *u, const float *d, const float *m, size_t N, size_t K, void *dst) {
    g_pack_job_t j = {u, d, m, N, K, dst};
    npu_parallel_for(g_round_up(N, G_NR) / G_NR, g_pack_panel, &j);
}

float npu_grp_pack_at(const void *pk, size_t K, size_t n, size_t k) {
    size_t         G = g_round_up(K, G_K) / G_K;
    const uint8_t *p = pk;
    float          d, m;
    memcpy(&d, p + g_scale_at(G, n, k / G_K), sizeof d);
    memcpy(&m, p + g_min_at(G, n, k / G_K), sizeof m);
    return d * (float)p[g_code_at(G, n, k)] + m;
}

/* ---- the reference: the kernel's integers and fp32 steps, one by one ---- */

/* The row scale and the 16-bit integers of npu_vec_int.h's scheme, in
 * scalar code: the max is exact, the product and the nearest-even
 * rounding those of the vector code (cvtps2dq under the default MXCSR). */
static void g_ref_row(const float *xr, size_t K, int32_t *q, float *sx) {
    float mx = 0.0f;
    for (size_t k = 0; k < K; k++)
        mx = fmaxf(mx, fabsf(xr[k]));
    float inv = mx > 0.0f ? (float)G_QMAX / mx : 0.0f;
    *sx = mx / (float)G_QMAX;
    for (size_t k = 0; k < K; k++) {
        float v = nearbyintf(xr[k] * inv);
        v = v > G_QMAX ? G_QMAX : v;
        v = v < -G_QMAX ? -G_QMAX : v;
        q[k] = (int32_t)v;
    }
}

void npu_matmul_grp_ref(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    size_t         G = g_round_up(K, G_K) / G_K;
    const uint8_t *p = pk;
    int32_t       *q = malloc((K ? K : 1) * sizeof *q);
    SVC_ASSERT(q); /* the tests' reference: a failure here is the test's */
    for (size_t t = 0; t < T; t++) {
        float sx;
        g_ref_row(x + t * K, K, q, &sx);
        for (size_t n = 0; n < N; n++) {
            float f = 0.0f;
            for (size_t g = 0; g < G; g++) {
                int32_t a = 0, s = 0;
                for (size_t k = g * G_K; k < K && k < (g + 1) * G_K; k++) {
                    a += (int32_t)p[g_code_at(G, n, k)] * q[k];
                    s += q[k];
                }
                float d, m;
                memcpy(&d, p + g_scale_at(G, n, g), sizeof d);
                memcpy(&m, p + g_min_at(G, n, g), sizeof m);
                f = fmaf(d, (float)a, f);
                f = fmaf(m, (float)s, f);
            }
            out[t * N + n] = f * sx;
        }
    }
    free(q);
}

/* grp8's activations for one group (k in [k0, k1) of xr): the bytes into
 * q, the scale and the bytes' sum returned in *s and *I. */
static void g8_ref_group(const float *xr, size_t k0, size_t k1, int32_t *q, float *s, float *I) {
    float mx = 0.0f;
    for (size_t k = k0; k < k1; k++)
        mx = fmaxf(mx, fabsf(xr[k]));
    float   inv = mx > 0.0f ? 127.0f / mx : 0.0f;
    int32_t sum = 0;
    for (size_t k = k0; k < k1; k++) {
        float v = nearbyintf(xr[k] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[k] = (int32_t)v;
        sum += q[k];
    }
    *s = mx / 127.0f;
    *I = (float)sum;
}

void npu_matmul_grp8_ref(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    size_t         G = g_round_up(K, G_K) / G_K;
    const uint8_t *p = pk;
    int32_t       *q = malloc((K ? K : 1) * sizeof *q);
    float         *sI = malloc(2 * (G ? G : 1) * sizeof *sI);
    SVC_ASSERT(q && sI); /* the tests' reference: a failure here is the test's */
    for (size_t t = 0; t < T; t++) {
        for (size_t g = 0; g < G; g++)
            g8_ref_group(x + t * K, g * G_K, (g + 1) * G_K < K ? (g + 1) * G_K : K, q, &sI[2 * g],
                         &sI[2 * g + 1]);
        for (size_t n = 0; n < N; n++) {
            float f = 0.0f;
            for (size_t g = 0; g < G; g++) {
                int32_t a = 0;
                for (size_t k = g * G_K; k < K && k < (g + 1) * G_K; k++)
                    a += (int32_t)p[g_code_at(G, n, k)] * q[k];
                float d, m;
                memcpy(&d, p + g_scale_at(G, n, g), sizeof d);
                memcpy(&m, p + g_min_at(G, n, g), sizeof m);
                f = fmaf(sI[2 * g], fmaf(d, (float)a, m * sI[2 * g + 1]), f);
            }
            out[t * N + n] = f;
        }
    }
    free(q), free(sI);
}

/* ---- the VNNI kernel ------------------------------------------------------ */

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma"))),                  \
    apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#endif

#include "npu_vec_int.h"

_Static_assert(NPU_I8_QMAX == (int)G_QMAX, "the reference's QMAX is the kernel's");

typedef struct g_job {
    const float   *x;
    const uint8_t *pk;
    size_t         T, K, N, Kp, G, npb, n_item; /* npb: panels per item (g_npb) */
    float         *out;
    /* the chunk in flight: rows [t0, t0 + mc); xh, xl (mc, Kp) signed
     * bytes, row-major; I (mc, G) the groups' sums of xq; sx the row
     * scales */
    size_t  t0, mc;
    int8_t *xh, *xl;
    float  *I, *sx;
    float  *S; /* grp8 only: (mc, G) the groups' scales; xh holds the codes */
} g_job_t;

/* Rows [16 i, 16 i + 16) of the chunk (those below mc) quantised as
 * npu_vnni_i8.c's v_quant does them (zero past K), with each group's sum
 * of xq = 256 xh + xl. */
static void g_quant(void *ctx, size_t i) {
    const g_job_t *j = ctx;
    for (size_t r = 16 * i; r < 16 * i + 16 && r < j->mc; r++) {
        int8_t *xh = j->xh + r * j->Kp, *xl = j->xl + r * j->Kp;
        j->sx[r] = npu_i8_quant_row(j->x + (j->t0 + r) * j->K, j->K, j->Kp, xh, xl);
        for (size_t g = 0; g < j->G; g++) {
            __m512i s = _mm512_setzero_si512();
            for (size_t k = g * G_K; k < (g + 1) * G_K; k += 16)
                s = _mm512_add_epi32(s,
                                     _mm512_add_epi32(_mm512_slli_epi32(npu_i8_widen16(xh + k), 8),
                                                      npu_i8_widen16(xl + k)));
            j->I[r * j->G + g] = (float)_mm512_reduce_add_epi32(s);
        }
    }
}

/* grp8's activations of one row and group, its 32 values in a and b
 * (zero past K): the bytes into xh (32), the scale into *S and the
 * bytes' sum into *I, by g8_ref_group's steps (max, 127 / max, nearest
 * even, clamp). g8_quant and the fused MLP's epilogue both: the same bits. */
static inline void g8_quant_group(__m512 a, __m512 b, int8_t *xh, float *S, float *I) {
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    float         mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    __m512        vi = _mm512_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
    __m512i       qa =
        _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, vi)), lim), nlim);
    __m512i qb =
        _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, vi)), lim), nlim);
    _mm_storeu_si128((__m128i *)(void *)xh, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(void *)(xh + 16), _mm512_cvtepi32_epi8(qb));
    *S = mx / 127.0f;
    *I = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

/* grp8: rows [16 i, 16 i + 16) of the chunk as one signed byte per value
 * and a scale per group of 32 (g8_quant_group), the group's sum of the
 * bytes in I. */
static void g8_quant(void *ctx, size_t i) {
    const g_job_t *j = ctx;
    for (size_t r = 16 * i; r < 16 * i + 16 && r < j->mc; r++) {
        const float *xr = j->x + (j->t0 + r) * j->K;
        for (size_t g = 0; g < j->G; g++) {
            size_t k0 = g * G_K, l0 = k0 < j->K ? j->K - k0 : 0, l1 = l0 > 16 ? l0 - 16 : 0;
            __m512 a = _mm512_maskz_loadu_ps(npu_mask16(l0), l0 ? xr + k0 : xr);
            __m512 b = _mm512_maskz_loadu_ps(npu_mask16(l1), l1 ? xr + k0 + 16 : xr);
            g8_quant_group(a, b, j->xh + r * j->Kp + k0, &j->S[r * j->G + g], &j->I[r * j->G + g]);
        }
    }
}

/* The 4 activation bytes at p, broadcast. */
static inline __m512i g_bc(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
/* Row r's products for the quad at kq of plane pl (both column halves). */
#define G_DP(r)                                                                                    \
    do {                                                                                           \
        __m512i b_ = g_bc(pl + (r)*j->Kp + kq);                                                    \
        s0_##r = _mm512_dpbusd_epi32(s0_##r, w0, b_);                                              \
        s1_##r = _mm512_dpbusd_epi32(s1_##r, w1, b_);                                              \
    } while (0)
/* One pass of a group's 8 quads over plane a. */
#define G_PASS(MR, a)                                                                              \
    _Pragma("GCC unroll 8") for (size_t q = 0; q < G_K / 4; q++) {                                 \
        __m512i w0 = _mm512_loadu_si512(blk + q * 128),                                            \
                w1 = _mm512_loadu_si512(blk + q * 128 + 64);                                       \
        const int8_t *pl = (a);                                                                    \
        size_t        kq = k0 + 4 * q;                                                             \
        NPU_ROWS6(MR, G_DP);                                                                       \
    }
#define G_SHL(r)                                                                                   \
    do {                                                                                           \
        s0_##r = _mm512_slli_epi32(s0_##r, 8);                                                     \
        s1_##r = _mm512_slli_epi32(s1_##r, 8);                                                     \
    } while (0)
/* f += d A + m I, in that order (the reference's); the sums restart at 0. */
#define G_FMA(r)                                                                                   \
    do {                                                                                           \
        __m512 i_ = _mm512_set1_ps(Ig[(r)*j->G]);                                                  \
        f0_##r = _mm512_fmadd_ps(d0, _mm512_cvtepi32_ps(s0_##r), f0_##r);                          \
        f1_##r = _mm512_fmadd_ps(d1, _mm512_cvtepi32_ps(s1_##r), f1_##r);                          \
        f0_##r = _mm512_fmadd_ps(m0, i_, f0_##r);                                                  \
        f1_##r = _mm512_fmadd_ps(m1, i_, f1_##r);                                                  \
        s0_##r = _mm512_setzero_si512(), s1_##r = _mm512_setzero_si512();                          \
    } while (0)
#define G_DECL(r)                                                                                  \
    __m512i s0_##r = z, s1_##r = z;                                                                \
    __m512  f0_##r = _mm512_setzero_ps(), f1_##r = _mm512_setzero_ps()
#define G_STORE(r)                                                                                 \
    do {                                                                                           \
        __m512 sx_ = _mm512_set1_ps(j->sx[r0 + (r)]);                                              \
        float *o_ = j->out + (j->t0 + r0 + (r)) * j->N + n0;                                       \
        _mm512_mask_storeu_ps(o_, npu_mask16(cols), _mm512_mul_ps(f0_##r, sx_));                   \
        if (cols > 16)                                                                             \
            _mm512_mask_storeu_ps(o_ + 16, npu_mask16(cols - 16), _mm512_mul_ps(f1_##r, sx_));     \
    } while (0)

/* grp8: f += s (d A + m I), in that order (g8 reference's). */
#define G8_FMA(r)                                                                                  \
    do {                                                                                           \
        __m512 i_ = _mm512_set1_ps(Ig[(r)*j->G]), s_ = _mm512_set1_ps(Sg[(r)*j->G]);               \
        f0_##r = _mm512_fmadd_ps(                                                                  \
            s_, _mm512_fmadd_ps(d0, _mm512_cvtepi32_ps(s0_##r), _mm512_mul_ps(m0, i_)), f0_##r);   \
        f1_##r = _mm512_fmadd_ps(                                                                  \
            s_, _mm512_fmadd_ps(d1, _mm512_cvtepi32_ps(s1_##r), _mm512_mul_ps(m1, i_)), f1_##r);   \
        s0_##r = _mm512_setzero_si512(), s1_##r = _mm512_setzero_si512();                          \
    } while (0)
#define G8_STORE(r)                                                                                \
    do {                                                                                           \
        float *o_ = j->out + (j->t0 + r0 + (r)) * j->N + n0;                                       \
        _mm512_mask_storeu_ps(o_, npu_mask16(cols), f0_##r);                                       \
        if (cols > 16)                                                                             \
            _mm512_mask_storeu_ps(o_ + 16, npu_mask16(cols - 16), f1_##r);                         \
    } while (0)
/* The fused MLP's gate and up panels (npu_mlp_vnni_grp8): row r of the
 * strip, all 32 columns (zero past N), into the item's 6 x 32 scratch
 * at j->out. */
#define G8S_STORE(r)                                                                               \
    do {                                                                                           \
        _mm512_store_ps(j->out + (r)*G_NR, f0_##r);                                                \
        _mm512_store_ps(j->out + (r)*G_NR + 16, f1_##r);                                           \
    } while (0)
/* Rows [r0, r0 + MR) of the chunk times panel pan (32 columns from n0,
 * cols of them real) into out, for MR = 1 .. 6 (a constant in each
 * instance), written out row by row so that the accumulators stay in
 * registers (npu_vnni_i8.c: GCC keeps arrays of them in memory); A8 (a
 * constant): grp8's one byte per activation, one pass per group; STORE
 * the rows' way out (G_STORE, G8_STORE, G8S_STORE). */
#define G_MICRO_ANY(P, A8, STORE, MR)                                                              \
    static void P##_micro_##MR(const void *job, size_t r0, size_t p, size_t n0, size_t cols) {     \
        const g_job_t *j = job;                                                                    \
        (void)n0, (void)cols; /* STORE's: G8S_STORE takes neither */                               \
        const uint8_t *pan = j->pk + p * j->G * G_BLK;                                             \
        const __m512i  z = _mm512_setzero_si512();                                                 \
        G_DECL(0);                                                                                 \
        G_DECL(1);                                                                                 \
        G_DECL(2);                                                                                 \
        G_DECL(3);                                                                                 \
        G_DECL(4);                                                                                 \
        G_DECL(5);                                                                                 \
        const int8_t *ah = j->xh + r0 * j->Kp, *al = A8 ? NULL : j->xl + r0 * j->Kp;               \
        for (size_t g = 0; g < j->G; g++) {                                                        \
            const uint8_t *blk = pan + g * G_BLK;                                                  \
            const float   *Ig = j->I + r0 * j->G + g, *Sg = A8 ? j->S + r0 * j->G + g : NULL;      \
            size_t         k0 = g * G_K;                                                           \
            G_PASS(MR, ah);                                                                        \
            if (!A8) {                                                                             \
                NPU_ROWS6(MR, G_SHL);                                                              \
                G_PASS(MR, al);                                                                    \
            }                                                                                      \
            const float *sc = (const float *)(const void *)(blk + G_CODES);                        \
            __m512       d0 = _mm512_loadu_ps(sc), d1 = _mm512_loadu_ps(sc + 16);                  \
            __m512       m0 = _mm512_loadu_ps(sc + 32), m1 = _mm512_loadu_ps(sc + 48);             \
            if (A8)                                                                                \
                NPU_ROWS6(MR, G8_FMA);                                                             \
            else                                                                                   \
                NPU_ROWS6(MR, G_FMA);                                                              \
        }                                                                                          \
        NPU_ROWS6(MR, STORE);                                                                      \
    }
#define G_MICRO(MR)   G_MICRO_ANY(g, false, G_STORE, MR)
#define G8_MICRO(MR)  G_MICRO_ANY(g8, true, G8_STORE, MR)
#define G8S_MICRO(MR) G_MICRO_ANY(g8s, true, G8S_STORE, MR)

NPU_VNNI_MICROS(g, G_MICRO)

NPU_VNNI_MICROS(g8, G8_MICRO)

NPU_VNNI_MICROS(g8s, G8S_MICRO)

/* Item i: the chunk's rows times panels [i npb, i npb + npb). */
static void g_item(void *ctx, size_t i) {
    const g_job_t *j = ctx;
    npu_vnni_item(j, j->mc, j->N, i * j->npb, j->npb, g_micros);
}

static void g8_item(void *ctx, size_t i) {
    const g_job_t *j = ctx;
    npu_vnni_item(j, j->mc, j->N, i * j->npb, j->npb, g8_micros);
}

/* Panels per item for G groups of K: G_NPB while their weights fit
 * G_ITEM_BYTES, fewer for a long K. */
static size_t g_npb(size_t G) {
    size_t npb = G_ITEM_BYTES / (G * G_BLK);
    return npb < 1 ? 1 : npb > G_NPB ? G_NPB : npb;
}

/* The job of x (T, K) times the pack pk (N, K) into out, before its
 * scratch. */
static g_job_t g_job(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    size_t n_pan = g_round_up(N, G_NR) / G_NR, Kp = g_round_up(K, G_K), npb = g_npb(Kp / G_K);
    return (g_job_t){.x = x,
                     .pk = pk,
                     .T = T,
                     .K = K,
                     .N = N,
                     .Kp = Kp,
                     .G = Kp / G_K,
                     .npb = npb,
                     .n_item = (n_pan + npb - 1) / npb,
                     .out = out};
}

/* Both products (grp8x2, or grp8 when a8): the job, its scratch, the
 * chunks. */
static void g_run(const float *x, const void *pk, size_t T, size_t K, size_t N, bool a8,
                  float *out) {
    if (npu_i8_trivial(T, K, N, out))
        return;
    g_job_t j = g_job(x, pk, T, K, N, out);
    size_t  Kp = j.Kp, chunk = T < G_MC ? T : G_MC, planes = a8 ? 1 : 2;
    size_t  nf = a8 ? 2 * chunk * j.G : chunk * (j.G + 1);
    char   *a = npu_scratch(NPU_SCRATCH_MM_A, planes * chunk * Kp + nf * sizeof(float));
    if (!a) { /* out of memory: the references need only a row of K */
        (a8 ? npu_matmul_grp8_ref : npu_matmul_grp_ref)(x, pk, T, K, N, out);
        return;
    }
    j.xh = (int8_t *)a;
    j.xl = a8 ? NULL : (int8_t *)a + chunk * Kp;
    j.I = (float *)(void *)(a + planes * chunk * Kp);
    j.sx = a8 ? NULL : j.I + chunk * j.G;
    j.S = a8 ? j.I + chunk * j.G : NULL;
    npu_vnni_chunks(&j, &j.t0, &j.mc, T, K, N, G_MC, a8 ? g8_quant : g_quant, a8 ? g8_item : g_item,
                    j.n_item);
}

/* grp8 over n weights that multiply the same x: one job per weight
 * sharing the chunk's quantised activations (quantised once), their items
 * in one run so that small products (a Gated DeltaNet's 16 gate columns)
 * ride along with large ones instead of running alone. */
typedef struct g_multi {
    g_job_t j[NPU_GRP8_SHARE_MAX];
    size_t  first[NPU_GRP8_SHARE_MAX + 1]; /* item ranges per weight */
    size_t  n;
} g_multi_t;

static void gm_quant(void *ctx, size_t i) {
    g8_quant(&((g_multi_t *)ctx)->j[0], i);
}

static void gm_item(void *ctx, size_t i) {
    g_multi_t *m = ctx;
    size_t     w = 0;
    while (i >= m->first[w + 1])
        w++;
    g8_item(&m->j[w], i - m->first[w]);
}

void npu_matmul_vnni_grp8_n(const float *x, size_t T, size_t K, size_t n, const void *const *pk,
                            const size_t *N, float *const *out) {
    SVC_ASSERT(n <= NPU_GRP8_SHARE_MAX);
    bool plain = T == 0 || K == 0 || n < 2;
    for (size_t w = 0; w < n; w++)
        plain = plain || N[w] == 0;
    if (plain) {
        for (size_t w = 0; w < n; w++)
            g_run(x, pk[w], T, K, N[w], true, out[w]);
        return;
    }
    g_multi_t m = {.n = n};
    size_t    Kp = g_round_up(K, G_K), chunk = T < G_MC ? T : G_MC, G = Kp / G_K, N_all = 0;
    char     *a = npu_scratch(NPU_SCRATCH_MM_A, chunk * Kp + 2 * chunk * G * sizeof(float));
    if (!a) {
        for (size_t w = 0; w < n; w++)
            npu_matmul_grp8_ref(x, pk[w], T, K, N[w], out[w]);
        return;
    }
    for (size_t w = 0; w < n; w++) {
        m.j[w] = g_job(x, pk[w], T, K, N[w], out[w]);
        m.j[w].xh = (int8_t *)a;
        m.j[w].I = (float *)(void *)(a + chunk * Kp);
        m.j[w].S = m.j[w].I + chunk * G;
        m.first[w + 1] = m.first[w] + m.j[w].n_item;
        N_all += N[w];
    }
    bool par = (double)T * (double)N_all * (double)K >= 2e6;
    for (size_t t0 = 0; t0 < T; t0 += G_MC) {
        for (size_t w = 0; w < n; w++) {
            m.j[w].t0 = t0;
            m.j[w].mc = T - t0 < G_MC ? T - t0 : G_MC;
        }
        npu_run_items(par, (m.j[0].mc + 15) / 16, gm_quant, &m);
        npu_run_items(par, m.first[n], gm_item, &m);
    }
}

/* ---- the fused MLP (npu_mlp_vnni_grp8) ----
 * down(silu(gate(x)) * up(x)) per row chunk: x quantised once (g8_quant
 * on the gate's job, shared by the up's); items of gate.npb / 2 panel
 * pairs (gate panel p, up panel p) walk the chunk 6 rows at a time, each
 * pair's two micro-kernels into a 6 x 32 scratch on the stack, then the
 * epilogue: silu(gate) * up (npu_silu_mul16) and g8_quant_group of the 32
 * products, which are exactly group p of the down projection's K, into
 * the down job's xh, S and I; then the down job's g8 items on them. */

typedef struct g_mlp {
    g_job_t gate, up;           /* x's quantised chunk (xh, S, I) shared, out unused */
    g_job_t down;               /* xh, S, I: the product's quantised chunk, filled by the pairs */
    size_t  pairs, n_pair_item; /* pairs an item: the gate's npb / 2, at least 1 */
} g_mlp_t;

/* Rows [r0, r0 + mr) of the strip's gate and up panel p (sg, su: 6 x 32)
 * into group p of the down job's activations; columns past the down's K
 * (F) are zero, as g8_quant's masked loads make them. */
static void g8_mlp_epilogue(const g_job_t *d, const float *sg, const float *su, size_t r0,
                            size_t mr, size_t p) {
    size_t    k0 = p * G_K, l0 = d->K - k0, l1 = l0 > 16 ? l0 - 16 : 0;
    __mmask16 m0 = npu_mask16(l0), m1 = npu_mask16(l1);
    for (size_t r = 0; r < mr; r++) {
        const float *g = sg + r * G_NR, *u = su + r * G_NR;
        __m512 a = _mm512_maskz_mov_ps(m0, npu_silu_mul16(_mm512_load_ps(g), _mm512_load_ps(u)));
        __m512 b =
            _mm512_maskz_mov_ps(m1, npu_silu_mul16(_mm512_load_ps(g + 16), _mm512_load_ps(u + 16)));
        size_t row = r0 + r;
        g8_quant_group(a, b, d->xh + row * d->Kp + k0, &d->S[row * d->G + p],
                       &d->I[row * d->G + p]);
    }
}

/* Item i: the chunk's rows times panel pairs [i PAIRS, i PAIRS + PAIRS). */
static void g8_mlp_item(void *ctx, size_t i) {
    const g_mlp_t     *m = ctx;
    _Alignas(64) float sg[6 * G_NR], su[6 * G_NR];
    g_job_t            jg = m->gate, ju = m->up;
    jg.out = sg, ju.out = su;
    size_t n_pan = m->down.G, p0 = i * m->pairs;
    size_t np = n_pan - p0 < m->pairs ? n_pan - p0 : m->pairs;
    for (size_t r0 = 0; r0 < m->gate.mc; r0 += 6) {
        size_t mr = m->gate.mc - r0 < 6 ? m->gate.mc - r0 : 6;
        for (size_t p = p0; p < p0 + np; p++) {
            g8s_micros[mr](&jg, r0, p, p * G_NR, G_NR);
            g8s_micros[mr](&ju, r0, p, p * G_NR, G_NR);
            g8_mlp_epilogue(&m->down, sg, su, r0, mr, p);
        }
    }
}

static void g8_mlp_down_item(void *ctx, size_t i) {
    g8_item(&((g_mlp_t *)ctx)->down, i);
}

static void g8_mlp_quant(void *ctx, size_t i) {
    g8_quant(&((g_mlp_t *)ctx)->gate, i);
}

bool npu_mlp_vnni_grp8(const float *x, size_t T, size_t K, size_t F, size_t N, const void *gate,
                       const void *up, const void *down, float *out) {
    if (T == 0 || K == 0 || F == 0 || N == 0)
        return false; /* the unfused calls' trivial shapes */
    size_t  chunk = T < G_MC ? T : G_MC;
    g_mlp_t m = {.gate = g_job(x, gate, T, K, F, NULL),
                 .up = g_job(x, up, T, K, F, NULL),
                 .down = g_job(NULL, down, T, F, N, out)};
    size_t  xb = chunk * m.gate.Kp, ab = chunk * m.down.Kp;
    size_t  nf = 2 * chunk * (m.gate.G + m.down.G);
    char   *a = npu_scratch(NPU_SCRATCH_MM_A, xb + ab + nf * sizeof(float));
    if (!a)
        return false;
    m.gate.xh = m.up.xh = (int8_t *)a;
    m.down.xh = (int8_t *)a + xb;
    m.gate.I = m.up.I = (float *)(void *)(a + xb + ab);
    m.gate.S = m.up.S = m.gate.I + chunk * m.gate.G;
    m.down.I = m.gate.S + chunk * m.gate.G;
    m.down.S = m.down.I + chunk * m.down.G;
    m.pairs = m.gate.npb > 1 ? m.gate.npb / 2 : 1;
    m.n_pair_item = (m.down.G + m.pairs - 1) / m.pairs;
    bool par_gu = (double)T * (double)(2 * F) * (double)K >= 2e6;
    bool par_d = (double)T * (double)N * (double)F >= 2e6;
    for (size_t t0 = 0; t0 < T; t0 += G_MC) {
        size_t mc = T - t0 < G_MC ? T - t0 : G_MC;
        m.gate.t0 = m.up.t0 = m.down.t0 = t0;
        m.gate.mc = m.up.mc = m.down.mc = mc;
        npu_run_items(par_gu, (mc + 15) / 16, g8_mlp_quant, &m);
        npu_run_items(par_gu, m.n_pair_item, g8_mlp_item, &m);
        npu_run_items(par_d, m.down.n_item, g8_mlp_down_item, &m);
    }
    return true;
}

void npu_matmul_vnni_grp(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out) {
    g_run(x, pk, T, K, N, false, out);
}

void npu_matmul_vnni_grp8(const float *x, const void *pk, size_t T, size_t K, size_t N,
                          float *out) {
    g_run(x, pk, T, K, N, true, out);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
