/*
 * npu_avx512.c -- AVX-512 fp32 kernels for the text tower's hot spots:
 * matmul (plain layout; the packed one is in npu_avx512_mm.c), attention
 * (a small-head path for head_dim <= 32, a general one above), the gated
 * delta rule, the causal conv, the norms and the MLP activation. Each
 * has the contract of its _ref twin in npu_ref.c / npu_ref_delta.c and is
 * checked against it by tests/test_npu_fast.c; npu_fast.c calls these
 * only when npu_probe() reports avx512f/bw/vl.
 *
 * This file and npu_avx512_mm.c are compiled for AVX-512 (the target
 * pragma below, placed after the includes so that the headers' inline
 * functions stay baseline); the rest of the binary runs on any x86-64.
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

/* ---- helpers -------------------------------------------------------------- */

/* Lanes [0, n) of a 16-lane vector, n <= 16. */
#include "npu_vec_int.h"

/* Sixteen vectors in, one out: lane i = the sum of the lanes of a[i]. */
static inline __m512 reduce16(const __m512 a[16]) {
    __m512 b[8], c[4];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
/* b[i], per 128-bit lane: (a0 part, a1 part, a0 part, a1 part). */
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        c[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    /* c[i], 128-bit lane L: partial sums over lane L of a[4i .. 4i+3]. */
    __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Sum of squares of n floats. */
static inline float sumsq(const float *x, size_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    size_t d = 0;
    for (; d + 32 <= n; d += 32) {
        __m512 v0 = _mm512_loadu_ps(x + d), v1 = _mm512_loadu_ps(x + d + 16);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    for (; d < n; d += 16) {
        __m512 v = _mm512_maskz_loadu_ps(npu_mask16(n - d), x + d);
        a0 = _mm512_fmadd_ps(v, v, a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* ---- matmul --------------------------------------------------------------- */

/* K is cut into blocks of this many floats so that 4 rows of x (8 KiB) stay
 * in L1 while a panel of w rows streams from L2. */
#define MM_KC 512
/* Rows of w per panel (MM_NC rows * MM_KC * 4 bytes = 128 KiB, in L2). */
#define MM_NC 64

/* The register tile: MM_MR rows of x by MM_NR rows of w, MM_MR * MM_NR = 16
 * accumulators (one reduce16 at the end). 8 x 2 needs 10 loads per 16 FMAs
 * and half the w traffic of 4 x 4. */
#define MM_MR 8
#define MM_NR 2
_Static_assert(MM_MR *MM_NR == 16, "one reduce16 per tile");

/* The FMAs of one step of 16 floats along K (m: the valid lanes). */
static inline void mm_step(__m512 acc[16], const float *const xr[MM_MR],
                           const float *const wr[MM_NR], size_t k, __mmask16 m) {
    __m512 wv[MM_NR];
#pragma GCC unroll 16
    for (int c = 0; c < MM_NR; c++)
        wv[c] = _mm512_maskz_loadu_ps(m, wr[c] + k);
#pragma GCC unroll 16
    for (int r = 0; r < MM_MR; r++) {
        __m512 xv = _mm512_maskz_loadu_ps(m, xr[r] + k);
#pragma GCC unroll 16
        for (int c = 0; c < MM_NR; c++)
            acc[r * MM_NR + c] = _mm512_fmadd_ps(xv, wv[c], acc[r * MM_NR + c]);
    }
}

/* out[MM_MR rows of x][MM_NR rows of w] (+)= dot products over kc floats.
 * Rows past the matrix are clamped to the last one by the caller and not
 * stored (only mr x nr outputs are). */
static inline void mm_tile(const float *const xr[MM_MR], const float *const wr[MM_NR], size_t kc,
                           float *out, size_t ldo, size_t mr, size_t nr, bool add) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 16 <= kc; k += 16)
        mm_step(acc, xr, wr, k, (__mmask16)0xffff);
    if (k < kc)
        mm_step(acc, xr, wr, k, npu_mask16(kc - k));
    /* Lane r * MM_NR + c of reduce16 = out[r][c]. */
    float tile[16];
    _mm512_storeu_ps(tile, reduce16(acc));
    for (size_t r = 0; r < mr; r++) {
        float *o = out + r * ldo;
        for (size_t c = 0; c < nr; c++)
            o[c] = add ? o[c] + tile[r * MM_NR + c] : tile[r * MM_NR + c];
    }
}

void npu_matmul_avx512(const float *x, const float *w, size_t T, size_t K, size_t N, float *out) {
    if (T == 0 || N == 0)
        return;
    if (K == 0) {
        memset(out, 0, T * N * sizeof *out);
        return;
    }
    for (size_t k0 = 0; k0 < K; k0 += MM_KC) {
        size_t kc = K - k0 < MM_KC ? K - k0 : MM_KC;
        bool   add = k0 > 0;
        for (size_t n0 = 0; n0 < N; n0 += MM_NC) {
            size_t n1 = N - n0 < MM_NC ? N : n0 + MM_NC;
            for (size_t t = 0; t < T; t += MM_MR) {
                size_t       mr = T - t < MM_MR ? T - t : MM_MR;
                const float *xr[MM_MR];
                for (size_t r = 0; r < MM_MR; r++)
                    xr[r] = x + (t + (r < mr ? r : mr - 1)) * K + k0;
                for (size_t n = n0; n < n1; n += MM_NR) {
                    size_t       nr = n1 - n < MM_NR ? n1 - n : MM_NR;
                    const float *wr[MM_NR];
                    for (size_t c = 0; c < MM_NR; c++)
                        wr[c] = w + (n + (c < nr ? c : nr - 1)) * K + k0;
                    mm_tile(xr, wr, kc, out + t * N + n, N, mr, nr, add);
                }
            }
        }
    }
}

/* ---- attention ------------------------------------------------------------ */

/* Scores of one query against 16 keys: lane j = q . k[j] over D floats.
 * kp[j] points at key j's head (clamped to a valid key by the caller). */
static inline __m512 attn_scores16(const float *qh, const float *const kp[16], size_t D) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        acc[j] = _mm512_setzero_ps();
    for (size_t d = 0; d < D; d += 16) {
        __mmask16 m = npu_mask16(D - d);
        __m512    qv = _mm512_maskz_loadu_ps(m, qh + d);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++)
            acc[j] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, kp[j] + d), acc[j]);
    }
    return reduce16(acc);
}

/* Vectors of acc held in registers while the keys of a block go by. */
#define ATTN_DV 8

/* acc[0, 16 nv) = corr * acc + sum over the keys jb in vis of p[jb] v[jb]
 * (nv vectors; the last one masked to n values). v[jb] is at vb + jb * ldk.
 * Called with a constant nv, so that acc stays in registers across keys. */
static inline __attribute__((always_inline)) void attn_acc_v(float *acc, const float *vb,
                                                             size_t ldk, size_t n, size_t nv,
                                                             const float p[16], __mmask16 vis,
                                                             float corr) {
    __m512    a[ATTN_DV];
    __mmask16 dm[ATTN_DV];
#pragma GCC unroll 16
    for (size_t u = 0; u < nv; u++) {
        dm[u] = npu_mask16(n - 16 * u);
        a[u] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * u), _mm512_set1_ps(corr));
    }
    for (unsigned bits = vis; bits; bits &= bits - 1) {
        unsigned     jb = (unsigned)__builtin_ctz(bits);
        const float *vj = vb + jb * ldk;
        __m512       pv = _mm512_set1_ps(p[jb]);
#pragma GCC unroll 16
        for (size_t u = 0; u < nv; u++)
            a[u] = _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(dm[u], vj + 16 * u), a[u]);
    }
#pragma GCC unroll 16
    for (size_t u = 0; u < nv; u++)
        _mm512_storeu_ps(acc + 16 * u, a[u]);
}

/* ---- attention, head_dim <= 32 -------------------------------------------- */

/* Queries of one KV head done together (GQA heads, then tokens). */
#define AS_QMAX 8
/* The widest head of this path: two vectors. */
#define AS_DMAX 32

/* Lanes of key block b (keys 16 b ..) below jend. */
static inline __mmask16 as_below(size_t b, size_t jend) {
    return jend <= b * 16 ? (__mmask16)0 : npu_mask16(jend - b * 16);
}

/* One KV head's view, shared by its query chunks. */
typedef struct as_ctx {
    const float     *kt;   /* (nb, D, 16): key block b, dim d, key jb; 0 past Tk */
    const __mmask16 *kvis; /* (nb): keys < Tk and not masked out */
    const float     *v;    /* v of this KV head: row j at v + j * ldk */
    size_t           ldk, D, Tkp;
    float            scale;
    float           *S; /* (AS_QMAX, Tkp): scores, then probabilities */
} as_ctx_t;

/* Queries qp[0 .. QN) see keys [0, jend[i]) (jend ascending); the first nq
 * are real and stored to op[i], the rest repeat the last one (QN, NV are
 * constants, so the accumulators stay in registers; NV vectors per head).
 * Pass 1: all scores and a lane-wise max; pass 2: exp(s - max) and the sum;
 * pass 3: p-weighted sum of the value rows, each row loaded once for all. */
static inline __attribute__((always_inline)) void
as_queries(const as_ctx_t *c, const float *const qp[AS_QMAX], const size_t jend[AS_QMAX],
           float *const op[AS_QMAX], float *const lp[AS_QMAX], int nq, int QN, int NV) {
    const size_t D = c->D, jmax = jend[nq - 1], nbq = (jmax + 15) / 16;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(c->scale);
    __m512       vmax[AS_QMAX], acc[AS_QMAX];
#pragma GCC unroll 8
    for (int i = 0; i < QN; i++)
        vmax[i] = ninf;
    for (size_t b = 0; b < nbq; b++) {
        const float *kb = c->kt + b * D * 16;
#pragma GCC unroll 8
        for (int i = 0; i < QN; i++)
            acc[i] = _mm512_setzero_ps();
        for (size_t d = 0; d < D; d++) {
            __m512 kv = _mm512_loadu_ps(kb + d * 16);
#pragma GCC unroll 8
            for (int i = 0; i < QN; i++)
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(qp[i][d]), kv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < QN; i++) {
            __mmask16 vis = c->kvis[b] & as_below(b, jend[i]);
            __m512    s = _mm512_mask_mul_ps(ninf, vis, acc[i], scale);
            _mm512_storeu_ps(c->S + i * c->Tkp + b * 16, s);
            vmax[i] = _mm512_max_ps(vmax[i], s);
        }
    }
    /* Register arrays are only ever indexed by unrolled constants (a
     * runtime index would put them on the stack). */
    float l[AS_QMAX], mx[AS_QMAX];
#pragma GCC unroll 8
    for (int i = 0; i < QN; i++)
        mx[i] = _mm512_reduce_max_ps(vmax[i]);
    for (int i = 0; i < QN; i++) {
        float *si = c->S + i * c->Tkp;
        float  m = mx[i];
        if (m == -INFINITY) { /* sees no key: p = 0, out = 0 */
            memset(si, 0, nbq * 16 * sizeof *si);
            l[i] = 0.0f;
            continue;
        }
        __m512 mv = _mm512_set1_ps(m), lv = _mm512_setzero_ps();
        for (size_t b = 0; b < nbq; b++) {
            __m512    s = _mm512_loadu_ps(si + b * 16);
            __mmask16 vis = _mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_OQ);
            __m512    p = _mm512_maskz_mov_ps(vis, npu_exp512(_mm512_sub_ps(s, mv)));
            _mm512_storeu_ps(si + b * 16, p);
            lv = _mm512_add_ps(lv, p);
        }
        l[i] = _mm512_reduce_add_ps(lv);
    }
    const __mmask16 dm0 = npu_mask16(D), dm1 = npu_mask16(D > 16 ? D - 16 : 0);
    __m512          a1[AS_QMAX];
#pragma GCC unroll 8
    for (int i = 0; i < QN; i++) {
        acc[i] = _mm512_setzero_ps();
        a1[i] = _mm512_setzero_ps();
    }
    const float *sp[AS_QMAX];
#pragma GCC unroll 8
    for (int i = 0; i < QN; i++)
        sp[i] = c->S + i * c->Tkp;
    for (size_t j = 0; j < jmax; j++) {
        const float *vj = c->v + j * c->ldk;
        __m512       v0 = _mm512_maskz_loadu_ps(dm0, vj);
        __m512       v1 = NV == 2 ? _mm512_maskz_loadu_ps(dm1, vj + 16) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int i = 0; i < QN; i++) {
            __m512 p = _mm512_set1_ps(sp[i][j]);
            acc[i] = _mm512_fmadd_ps(p, v0, acc[i]);
            if (NV == 2)
                a1[i] = _mm512_fmadd_ps(p, v1, a1[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < QN; i++) {
        if (i >= nq)
            break;
        __m512 inv = _mm512_set1_ps(l[i] > 0.0f ? 1.0f / l[i] : 0.0f);
        if (lp[i])
            *lp[i] = l[i] > 0.0f ? mx[i] + logf(l[i]) : -INFINITY;
        _mm512_mask_storeu_ps(op[i], dm0, _mm512_mul_ps(acc[i], inv));
        if (NV == 2)
            _mm512_mask_storeu_ps(op[i] + 16, dm1, _mm512_mul_ps(a1[i], inv));
    }
}

/* as_queries with the smallest QN in {1, 2, 4, 8} that holds nq. */
static void as_run(const as_ctx_t *c, const float *const qp[AS_QMAX], const size_t jend[AS_QMAX],
                   float *const op[AS_QMAX], float *const lp[AS_QMAX], int nq) {
    if (c->D <= 16) {
        if (nq <= 1)
            as_queries(c, qp, jend, op, lp, nq, 1, 1);
        else if (nq <= 2)
            as_queries(c, qp, jend, op, lp, nq, 2, 1);
        else if (nq <= 4)
            as_queries(c, qp, jend, op, lp, nq, 4, 1);
        else
            as_queries(c, qp, jend, op, lp, nq, 8, 1);
    } else {
        if (nq <= 1)
            as_queries(c, qp, jend, op, lp, nq, 1, 2);
        else if (nq <= 2)
            as_queries(c, qp, jend, op, lp, nq, 2, 2);
        else if (nq <= 4)
            as_queries(c, qp, jend, op, lp, nq, 4, 2);
        else
            as_queries(c, qp, jend, op, lp, nq, 8, 2);
    }
}

svc_err_t npu_attention_small_avx512(const float *q, const float *k, const float *v, size_t Tq,
                                     size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                     bool causal, const uint8_t *key_mask, float *out, float *lse) {
    SVC_ASSERT((!causal || Tq <= Tk) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
               head_dim > 0 && head_dim <= AS_DMAX);
    if (Tq == 0)
        return SVC_OK;
    size_t group = n_heads / n_kv_heads, D = head_dim, nb = (Tk + 15) / 16, Tkp = nb * 16;
    size_t nf = nb * D * 16 + AS_QMAX * Tkp;
    float *buf = malloc(nf * sizeof *buf + nb * sizeof(__mmask16));
    if (!buf)
        return SVC_ERR_NOMEM;
    __mmask16 *kvis = (__mmask16 *)(void *)(buf + nf);
    for (size_t b = 0; b < nb; b++) {
        __mmask16 vis = npu_mask16(Tk - b * 16);
        if (key_mask) {
            __m128i km = _mm_maskz_loadu_epi8(vis, key_mask + b * 16);
            vis &= _mm_test_epi8_mask(km, km);
        }
        kvis[b] = vis;
    }
    as_ctx_t c = {
        .kt = buf,
        .kvis = kvis,
        .ldk = n_kv_heads * D,
        .D = D,
        .Tkp = Tkp,
        .scale = (float)(1.0 / sqrt((double)D)),
        .S = buf + nb * D * 16,
    };
    size_t n_pairs = Tq * group;
    for (size_t kvh = 0; kvh < n_kv_heads; kvh++) {
        /* Transpose this head's keys: buf[(b * D + d) * 16 + jb] = k_j[d]. */
        for (size_t b = 0; b < nb; b++)
            for (size_t jb = 0; jb < 16; jb++) {
                size_t       j = b * 16 + jb;
                const float *kj = k + j * c.ldk + kvh * D;
                for (size_t d = 0; d < D; d++)
                    buf[(b * D + d) * 16 + jb] = j < Tk ? kj[d] : 0.0f;
            }
        c.v = v + kvh * D;
        /* Pairs (token i, head g of the group) in token order, 8 at a time. */
        for (size_t p0 = 0; p0 < n_pairs; p0 += AS_QMAX) {
            int          nq = n_pairs - p0 < AS_QMAX ? (int)(n_pairs - p0) : AS_QMAX;
            const float *qp[AS_QMAX];
            float       *op[AS_QMAX], *lp[AS_QMAX];
            size_t       jend[AS_QMAX];
            for (int u = 0; u < AS_QMAX; u++) {
                size_t pi = p0 + (size_t)(u < nq ? u : nq - 1);
                size_t i = pi / group, h = kvh * group + pi % group;
                qp[u] = q + (i * n_heads + h) * D;
                op[u] = out + (i * n_heads + h) * D;
                lp[u] = lse ? lse + i * n_heads + h : NULL;
                jend[u] = causal ? i + (Tk - Tq) + 1 : Tk;
            }
            as_run(&c, qp, jend, op, lp, nq);
        }
    }
    free(buf);
    return SVC_OK;
}

svc_err_t npu_attention_avx512(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                               size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                               const uint8_t *key_mask, float *out) {
    SVC_ASSERT(Tq <= Tk && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim > 0);
    if (head_dim <= AS_DMAX)
        return npu_attention_small_avx512(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal,
                                          key_mask, out, NULL);
    size_t group = n_heads / n_kv_heads;
    size_t D = head_dim;
    size_t Dv = (D + 15) / 16 * 16; /* acc is padded to whole vectors */
    float *acc = malloc(Dv * sizeof *acc);
    if (!acc)
        return SVC_ERR_NOMEM;
    const __m512 scale = _mm512_set1_ps((float)(1.0 / sqrt((double)D)));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    size_t       ldk = n_kv_heads * D;

    for (size_t i = 0; i < Tq; i++) {
        /* Keys [0, jend) are causally visible to query i. */
        size_t jend = causal ? i + (Tk - Tq) + 1 : Tk;
        for (size_t h = 0; h < n_heads; h++) {
            const float *qh = q + (i * n_heads + h) * D;
            size_t       kvh = h / group;
            float        m = -INFINITY, l = 0.0f;
            memset(acc, 0, Dv * sizeof *acc);
            for (size_t j0 = 0; j0 < jend; j0 += 16) {
                size_t    nb = jend - j0 < 16 ? jend - j0 : 16;
                __mmask16 vis = npu_mask16(nb);
                if (key_mask) {
                    __m128i km = _mm_maskz_loadu_epi8(vis, key_mask + j0);
                    vis &= _mm_test_epi8_mask(km, km);
                }
                if (!vis)
                    continue;
                const float *kp[16];
#pragma GCC unroll 16
                for (size_t jb = 0; jb < 16; jb++)
                    kp[jb] = k + (j0 + (jb < nb ? jb : nb - 1)) * ldk + kvh * D;
                __m512 s = _mm512_mul_ps(attn_scores16(qh, kp, D), scale);
                s = _mm512_mask_blend_ps(vis, ninf, s);
                float  m_blk = _mm512_reduce_max_ps(s);
                float  m_new = m_blk > m ? m_blk : m;
                float  corr = expf(m - m_new); /* 0 on the first visible block */
                __m512 p = npu_exp512(_mm512_sub_ps(s, _mm512_set1_ps(m_new)));
                l = l * corr + _mm512_reduce_add_ps(p);
                float pj[16];
                _mm512_storeu_ps(pj, p);
                const float *vb = v + j0 * ldk + kvh * D;
                size_t       d = 0;
                for (; d + 16 * ATTN_DV <= D; d += 16 * ATTN_DV)
                    attn_acc_v(acc + d, vb + d, ldk, D - d, ATTN_DV, pj, vis, corr);
                for (; d < D; d += 16)
                    attn_acc_v(acc + d, vb + d, ldk, D - d, 1, pj, vis, corr);
                m = m_new;
            }
            float       *oh = out + (i * n_heads + h) * D;
            const __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
            for (size_t d = 0; d < D; d += 16)
                _mm512_mask_storeu_ps(oh + d, npu_mask16(D - d),
                                      _mm512_mul_ps(_mm512_loadu_ps(acc + d), inv));
        }
    }
    free(acc);
    return SVC_OK;
}

/* ---- gated delta rule ----------------------------------------------------- */

/*
 * Recurrent form with fp32 state. Column j of S evolves on its own:
 *   mem_j   = sum_i k_i S_ij                      (k^T S, before decay)
 *   delta_j = beta (v_j - exp(g) mem_j)           (k^T (exp(g) S) = exp(g) mem)
 *   S_ij    = exp(g) S_ij + k_i delta_j
 *   out_j   = scale sum_i q_i S_ij
 * so one block of 16 columns of one head runs through all T tokens with its
 * (dk, 16) slice of S in scratch (L1), two passes over the slice per token.
 */
svc_err_t npu_delta_rule_avx512(const float *q, const float *k, const float *v, const float *g,
                                const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                                size_t dk, size_t dv, const float *state_in, float *state_out,
                                float *out) {
    SVC_ASSERT(n_k_heads > 0 && n_v_heads % n_k_heads == 0 && dk > 0 && dv > 0);
    /* Sb (dk, 16) slice of the state, then exp(g) of one head (T, padded). */
    size_t Tp = (T + 15) / 16 * 16;
    float *Sb = malloc((dk * 16 + Tp + 16) * sizeof *Sb);
    if (!Sb)
        return SVC_ERR_NOMEM;
    float       *decay = Sb + dk * 16;
    const __m512 scale = _mm512_set1_ps((float)(1.0 / sqrt((double)dk)));
    size_t       group = n_v_heads / n_k_heads;
    size_t       ldqk = n_k_heads * dk;
    size_t       ldv = n_v_heads * dv;

    for (size_t h = 0; h < n_v_heads; h++) {
        size_t hk = h / group;
        for (size_t t = 0; t < Tp; t++)
            decay[t] = t < T ? g[t * n_v_heads + h] : 0.0f;
        for (size_t t = 0; t < T; t += 16)
            _mm512_storeu_ps(decay + t, npu_exp512(_mm512_loadu_ps(decay + t)));
        for (size_t j0 = 0; j0 < dv; j0 += 16) {
            __mmask16 jm = npu_mask16(dv - j0);
            for (size_t i = 0; i < dk; i++) {
                __m512 s = _mm512_setzero_ps();
                if (state_in)
                    s = _mm512_maskz_loadu_ps(jm, state_in + (h * dk + i) * dv + j0);
                _mm512_storeu_ps(Sb + i * 16, s);
            }
            for (size_t t = 0; t < T; t++) {
                const float *qt = q + t * ldqk + hk * dk;
                const float *kt = k + t * ldqk + hk * dk;
                __m512       m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
                size_t       i = 0;
                for (; i + 2 <= dk; i += 2) {
                    m0 = _mm512_fmadd_ps(_mm512_set1_ps(kt[i]), _mm512_loadu_ps(Sb + i * 16), m0);
                    m1 = _mm512_fmadd_ps(_mm512_set1_ps(kt[i + 1]),
                                         _mm512_loadu_ps(Sb + (i + 1) * 16), m1);
                }
                if (i < dk)
                    m0 = _mm512_fmadd_ps(_mm512_set1_ps(kt[i]), _mm512_loadu_ps(Sb + i * 16), m0);
                __m512 dec = _mm512_set1_ps(decay[t]);
                __m512 vt = _mm512_maskz_loadu_ps(jm, v + t * ldv + h * dv + j0);
                __m512 mem = _mm512_mul_ps(_mm512_add_ps(m0, m1), dec);
                __m512 delta =
                    _mm512_mul_ps(_mm512_sub_ps(vt, mem), _mm512_set1_ps(beta[t * n_v_heads + h]));
                __m512 o0 = _mm512_setzero_ps(), o1 = _mm512_setzero_ps();
                for (i = 0; i + 2 <= dk; i += 2) {
                    __m512 s0 = _mm512_fmadd_ps(_mm512_set1_ps(kt[i]), delta,
                                                _mm512_mul_ps(_mm512_loadu_ps(Sb + i * 16), dec));
                    __m512 s1 =
                        _mm512_fmadd_ps(_mm512_set1_ps(kt[i + 1]), delta,
                                        _mm512_mul_ps(_mm512_loadu_ps(Sb + (i + 1) * 16), dec));
                    _mm512_storeu_ps(Sb + i * 16, s0);
                    _mm512_storeu_ps(Sb + (i + 1) * 16, s1);
                    o0 = _mm512_fmadd_ps(_mm512_set1_ps(qt[i]), s0, o0);
                    o1 = _mm512_fmadd_ps(_mm512_set1_ps(qt[i + 1]), s1, o1);
                }
                if (i < dk) {
                    __m512 s0 = _mm512_fmadd_ps(_mm512_set1_ps(kt[i]), delta,
                                                _mm512_mul_ps(_mm512_loadu_ps(Sb + i * 16), dec));
                    _mm512_storeu_ps(Sb + i * 16, s0);
                    o0 = _mm512_fmadd_ps(_mm512_set1_ps(qt[i]), s0, o0);
                }
                _mm512_mask_storeu_ps(out + t * ldv + h * dv + j0, jm,
                                      _mm512_mul_ps(_mm512_add_ps(o0, o1), scale));
            }
            if (state_out)
                for (size_t i = 0; i < dk; i++)
                    _mm512_mask_storeu_ps(state_out + (h * dk + i) * dv + j0, jm,
                                          _mm512_loadu_ps(Sb + i * 16));
        }
    }
    free(Sb);
    return SVC_OK;
}

/* ---- causal conv, norms, activation -------------------------------------- */

/* The widest conv kernel done here; wider ones go to the reference. */
#define CONV_MAX_K 16

/* Row t of (history ++ x) for the conv (tt = t + i, history first), or
 * NULL for a zero row of a fresh sequence. */
static inline const float *conv_row(const float *x, const float *state_in, size_t tt, size_t hist,
                                    size_t C) {
    return tt >= hist ? x + (tt - hist) * C : state_in ? state_in + tt * C : NULL;
}

typedef struct conv_job {
    const float            *x, *wt, *state_in;
    const npu_conv_split_t *sp;
    size_t                  T, C, K, Cp, per; /* per: rows per item */
} conv_job_t;

#define CONV_ITEM_FLOATS 32768 /* at least this much of out per item */

/* Rows at once in conv_span (CONV_RB), for kernels of up to CONV_RB_K
 * taps (the model's 4): CONV_RB + K - 1 input rows and K taps are loaded
 * once per 16 channels instead of K of each per row. */
#define CONV_RB   4
#define CONV_RB_K 4

/* Rows [t, t + nr) of the outputs (nr <= CONV_RB; nr > 1 only for K <=
 * CONV_RB_K); each block of the split 16 channels at a time (masked at its
 * end). Every output is the same FMAs in the same order (taps in order
 * from zero, the zero rows of a fresh sequence skipped) whatever nr and
 * wherever it is written, so the same bits. */
static void conv_span(const conv_job_t *j, size_t t, size_t nr) {
    size_t       hist = j->K - 1, C = j->C, K = j->K, nx = nr + K - 1;
    const float *rows[CONV_RB + CONV_MAX_K - 1];
    for (size_t m = 0; m < nx; m++)
        rows[m] = conv_row(j->x, j->state_in, t + m, hist, C);
    for (size_t b = 0, base = 0; b < j->sp->n; base += j->sp->width[b++]) {
        size_t W = j->sp->width[b];
        float *o = j->sp->out[b] + t * W;
        for (size_t c0 = 0; c0 < W; c0 += 16) {
            __mmask16 cm = npu_mask16(W - c0);
            __m512    wv[CONV_MAX_K], xv[CONV_RB + CONV_MAX_K - 1];
            for (size_t k = 0; k < K; k++)
                wv[k] = _mm512_maskz_loadu_ps(cm, j->wt + k * j->Cp + base + c0);
            for (size_t m = 0; m < nx; m++)
                xv[m] =
                    rows[m] ? _mm512_maskz_loadu_ps(cm, rows[m] + base + c0) : _mm512_setzero_ps();
            for (size_t r = 0; r < nr; r++) {
                __m512 acc = _mm512_setzero_ps();
                for (size_t k = 0; k < K; k++)
                    if (rows[r + k])
                        acc = _mm512_fmadd_ps(wv[k], xv[r + k], acc);
                _mm512_mask_storeu_ps(o + r * W + c0, cm, npu_silu512(acc));
            }
        }
    }
}

/* Rows [i per, i per + per) of the outputs: CONV_RB at a time where the
 * kernel is narrow enough, the rest one by one. */
static void conv_rows(void *ctx, size_t i) {
    const conv_job_t *j = ctx;
    size_t            t = i * j->per, end = (i + 1) * j->per < j->T ? (i + 1) * j->per : j->T;
    if (j->K <= CONV_RB_K)
        for (; t + CONV_RB <= end; t += CONV_RB)
            conv_span(j, t, CONV_RB);
    for (; t < end; t++)
        conv_span(j, t, 1);
}

void npu_conv1d_causal_silu_avx512(const float *x, const float *w, size_t T, size_t C, size_t K,
                                   const float *state_in, float *state_out, float *out) {
    npu_conv_split_t sp = npu_conv_whole(C, out);
    npu_conv1d_causal_silu_split_avx512(x, w, T, C, K, state_in, state_out, &sp);
}

/* Row by row, so that x and out stream in order (a channel strip walked
 * down the rows strides C floats and missed the cache on every row: 2.4%
 * of a nano prefill); blocks of rows on the pool (each row reads only x,
 * state_in and the taps, so the bits are those of one thread). Each output
 * sums its K taps in the same order as before, so the bits are the same. */
void npu_conv1d_causal_silu_split_avx512(const float *x, const float *w, size_t T, size_t C,
                                         size_t K, const float *state_in, float *state_out,
                                         const npu_conv_split_t *sp) {
    SVC_ASSERT(K >= 1 && sp->n >= 1 && sp->n <= NPU_CONV_SPLIT_MAX);
    if (K > CONV_MAX_K) {
        npu_conv1d_causal_silu_split_ref(x, w, T, C, K, state_in, state_out, sp);
        return;
    }
    size_t hist = K - 1, Cp = (C + 15) / 16 * 16;
    /* wt[i * Cp + c] = w[c][i]: each tap's weights contiguous over channels */
    float *wt = npu_scratch(NPU_SCRATCH_CONV, K * Cp * sizeof *wt);
    if (!wt) { /* out of memory: the reference needs none */
        npu_conv1d_causal_silu_split_ref(x, w, T, C, K, state_in, state_out, sp);
        return;
    }
    for (size_t i = 0; i < K; i++)
        for (size_t c = 0; c < Cp; c++)
            wt[i * Cp + c] = c < C ? w[c * K + i] : 0.0f;
    conv_job_t j = {
        .x = x, .wt = wt, .state_in = state_in, .sp = sp, .T = T, .C = C, .K = K, .Cp = Cp};
    j.per = C < CONV_ITEM_FLOATS ? CONV_ITEM_FLOATS / C : 1;
    j.per = (j.per + CONV_RB - 1) / CONV_RB * CONV_RB; /* whole spans of CONV_RB rows */
    size_t items = (T + j.per - 1) / j.per;
    if (items > 1)
        npu_parallel_for(items, conv_rows, &j);
    else if (items == 1)
        conv_rows(&j, 0);
    if (!state_out || hist == 0)
        return;
    /* As the reference: oldest row first, so state_out may alias state_in
     * (after every row above has read state_in). */
    for (size_t r = 0; r < hist; r++) {
        size_t tt = T + r;
        if (tt >= hist)
            memcpy(state_out + r * C, x + (tt - hist) * C, C * sizeof *x);
        else if (state_in)
            memmove(state_out + r * C, state_in + tt * C, C * sizeof *x);
        else
            memset(state_out + r * C, 0, C * sizeof *x);
    }
}

void npu_rmsnorm_avx512(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                        bool one_plus_w) {
    SVC_ASSERT(D > 0);
    const __m512 one = _mm512_set1_ps(one_plus_w ? 1.0f : 0.0f);
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        float       *yr = out + t * D;
        __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt((double)sumsq(xr, D) / (double)D + eps)));
        for (size_t d = 0; d < D; d += 16) {
            __mmask16 m = npu_mask16(D - d);
            __m512    wv = _mm512_add_ps(_mm512_maskz_loadu_ps(m, w + d), one);
            __m512    y = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + d), inv), wv);
            _mm512_mask_storeu_ps(yr + d, m, y);
        }
    }
}

void npu_rmsnorm_gated_avx512(const float *x, const float *z, const float *w, size_t T, size_t D,
                              float eps, float *out) {
    SVC_ASSERT(D > 0);
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        const float *zr = z + t * D;
        float       *yr = out + t * D;
        __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt((double)sumsq(xr, D) / (double)D + eps)));
        for (size_t d = 0; d < D; d += 16) {
            __mmask16 m = npu_mask16(D - d);
            __m512    y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + d), inv);
            y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, w + d));
            y = _mm512_mul_ps(y, npu_silu512(_mm512_maskz_loadu_ps(m, zr + d)));
            _mm512_mask_storeu_ps(yr + d, m, y);
        }
    }
}

void npu_l2norm_avx512(const float *x, size_t T, size_t D, float eps, float *out) {
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        __m512       inv = _mm512_set1_ps((float)(1.0 / sqrt((double)sumsq(xr, D) + eps)));
        for (size_t d = 0; d < D; d += 16) {
            __mmask16 m = npu_mask16(D - d);
            _mm512_mask_storeu_ps(out + t * D + d, m,
                                  _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + d), inv));
        }
    }
}

void npu_silu_mul_avx512(const float *gate, const float *up, size_t T, size_t F, float *out) {
    size_t n = T * F;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = npu_mask16(n - i);
        __m512    y =
            npu_silu_mul16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i));
        _mm512_mask_storeu_ps(out + i, m, y);
    }
}

void npu_sigmoid_mul_avx512(const float *gate, float *x, size_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = npu_mask16(n - i);
        __m512    e =
            npu_exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(m, gate + i)));
        __m512 y = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(x + i, m, y);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
