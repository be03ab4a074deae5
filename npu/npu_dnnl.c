/*
 * npu_dnnl.c -- kernels on oneDNN's sgemm (npu.h): the projection matmul
 * (npu_matmul_dnnl, "onednn-f32"), what fp32 weights run on where neither
 * the AMX tiles nor AVX512-BF16 (npu_avx512_bf16.c) are used; and, for
 * CPUs without AVX-512 (the "generic"
 * kernels), attention (npu_attention_dnnl) and the chunked delta rule
 * (npu_delta_rule_dnnl), each with its own section below.
 *
 * Why oneDNN here and not our own kernel: measured in one process on this
 * machine (tests/bench/bench_onednn, runs alternating), oneDNN 2.6's JIT
 * sgemm on AVX-512 does 70-73 GFLOP/s per thread at the nano shapes where
 * our fp32 panels (npu_matmul_panels_avx512, D3_NPU_MATMUL=panels) do
 * 43-53, and the panels ran on one thread: 2.2-3.3x on two cores, 1.6-1.7x
 * on a whole nano pass in fp32 (D3_NPU_KERNELS=avx512). With AVX2 only
 * (ONEDNN_MAX_CPU_ISA=AVX2, what a CPU without AVX-512 gets) it still runs
 * them ~70x faster than the scalar reference such a CPU ran before. Where
 * the tiles are there, our AMX kernels beat oneDNN's own AMX matmul at the
 * same number of products (bench_onednn), so they stay.
 *
 * The weight stays as given, fp32 (N, K) row-major (out = x w^T is sgemm
 * with B transposed), so the pack costs what the fp32 copy does and needs
 * no reorder. The product goes over our pool, not oneDNN's OpenMP team:
 * items of DNNL_NB output columns, each one single-threaded sgemm
 * (omp_set_num_threads(1) on the thread that runs it). Why: one pool for
 * every kernel, so two scheduler workers share the cores instead of each
 * starting an OpenMP team that spins after every call.
 *
 * Bits: an output element's value depends on the sgemm kernel oneDNN picks
 * for the call's shape. The column blocks depend on N only; below
 * DNNL_MIN_M rows oneDNN takes another kernel, so such a call runs on
 * DNNL_MIN_M rows (its rows, then zeros) and keeps its own. With the
 * AVX-512 kernels a row's result is then the same whatever T
 * (test_npu_dnnl checks it), as for the other layouts: the batched passes
 * rely on it. oneDNN's AVX2 kernels do not keep that (a row's bits depend
 * on where it falls in the call), so on such CPUs a batched question agrees
 * with its single pass to fp32 rounding, not bit for bit.
 */
#include "npu.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- may oneDNN run here? --------------------------------------------------
 *
 * oneDNN's sgemm writes its kernels at run time into memory it then makes
 * executable. Where that is refused (systemd's MemoryDenyWriteExecute=,
 * prctl PR_SET_MDWE, SELinux deny_execmem) every call returns
 * dnnl_unimplemented and leaves its output as it was: attention would
 * answer zeros and the delta rule garbage, with SVC_OK. So one small
 * product, its values checked, decides once whether the dispatch
 * (npu_fast.c) may choose these kernels at all. */

#define DNNL_PROBE_M 16

static char           g_dnnl_refusal[200]; /* empty: usable */
static pthread_once_t g_dnnl_once = PTHREAD_ONCE_INIT;

static void dnnl_probe(void) {
    enum { M = DNNL_PROBE_M };
    float a[M * M], b[M * M], c[M * M];
    for (size_t i = 0; i < M * M; i++)
        a[i] = (float)(i % 7) - 3.0f, b[i] = (float)(i % 5) - 2.0f, c[i] = NAN;
    omp_set_num_threads(1);
    dnnl_status_t st = dnnl_sgemm('N', 'T', M, M, M, 1.0f, a, M, b, M, 0.0f, c, M);
    bool          ok = st == dnnl_success;
    for (size_t i = 0; ok && i < M * M; i++) {
        float want = 0.0f; /* small integers: exact in any order */
        for (size_t k = 0; k < M; k++)
            want += a[i / M * M + k] * b[i % M * M + k];
        ok = c[i] == want;
    }
    if (!ok)
        snprintf(g_dnnl_refusal, sizeof g_dnnl_refusal,
                 "oneDNN's sgemm %s (status %d; its kernels need memory that is written, then "
                 "executed: MemoryDenyWriteExecute= or PR_SET_MDWE forbid that)",
                 st == dnnl_success ? "gave a wrong product" : "is refused", (int)st);
}

const char *npu_dnnl_refusal(void) {
    pthread_once(&g_dnnl_once, dnnl_probe);
    return g_dnnl_refusal[0] ? g_dnnl_refusal : NULL;
}

#define DNNL_NB    256 /* output columns per item */
#define DNNL_MIN_M 16  /* fewer rows are padded to this many (above: why) */

typedef struct dnnl_job {
    const float *x; /* T rows of K (or the padded copy) */
    const float *w;
    size_t       T, K, N;
    float       *out; /* T rows of N */
    size_t       ldo;
} dnnl_job_t;

/* Columns [i * DNNL_NB, ...) of out. A failed sgemm (only a bad argument
 * can fail it) takes the reference instead: the matmul never fails. */
static void dnnl_item(void *ctx, size_t i) {
    const dnnl_job_t *j = ctx;
    size_t            n0 = i * DNNL_NB, nc = j->N - n0 < DNNL_NB ? j->N - n0 : DNNL_NB;
    omp_set_num_threads(1);
    dnnl_status_t s = dnnl_sgemm('N', 'T', (dnnl_dim_t)j->T, (dnnl_dim_t)nc, (dnnl_dim_t)j->K, 1.0f,
                                 j->x, (dnnl_dim_t)j->K, j->w + n0 * j->K, (dnnl_dim_t)j->K, 0.0f,
                                 j->out + n0, (dnnl_dim_t)j->ldo);
    if (s == dnnl_success)
        return;
    for (size_t t = 0; t < j->T; t++)
        npu_matmul_ref(j->x + t * j->K, j->w + n0 * j->K, 1, j->K, nc, j->out + t * j->ldo + n0);
}

void npu_matmul_dnnl(const float *x, const float *w, size_t T, size_t K, size_t N, float *out) {
    if (T == 0 || N == 0)
        return;
    if (K == 0) {
        memset(out, 0, T * N * sizeof *out);
        return;
    }
    dnnl_job_t j = {.x = x, .w = w, .T = T, .K = K, .N = N, .out = out, .ldo = N};
    float     *pad = NULL;
    if (T < DNNL_MIN_M) {
        /* the rows, then zeros, and their product in the same block */
        pad = npu_scratch(NPU_SCRATCH_MM_A, DNNL_MIN_M * (K + N) * sizeof *pad);
        if (!pad) {
            npu_matmul_ref(x, w, T, K, N, out);
            return;
        }
        memcpy(pad, x, T * K * sizeof *pad);
        memset(pad + T * K, 0, (DNNL_MIN_M - T) * K * sizeof *pad);
        j.x = pad, j.T = DNNL_MIN_M, j.out = pad + DNNL_MIN_M * K;
    }
    /* Below ~2 M multiply-adds the pool's wake-up costs more than it gains. */
    size_t n_items = (N + DNNL_NB - 1) / DNNL_NB;
    if ((double)T * (double)N * (double)K >= 2e6)
        npu_parallel_for(n_items, dnnl_item, &j);
    else
        for (size_t i = 0; i < n_items; i++)
            dnnl_item(&j, i);
    if (pad)
        memcpy(out, j.out, T * N * sizeof *out);
}

/* ---- attention on sgemm (CPUs without AVX-512) ----------------------------
 *
 * npu_attention_ref's contract as a tiled online softmax whose two block
 * products are single-threaded sgemms: per item (a query head, ATT_QB
 * queries), S = scale Q K_blk^T straight from the strided q and k (lda =
 * n_heads * head_dim, ldb = n_kv_heads * head_dim: no gather), the masks,
 * the running max and sum in plain C, acc = acc * rescale + P V_blk.
 * Why: a CPU without AVX-512 ran the double-precision reference, O(Tq Tk)
 * scalar products per head: with oneDNN's AVX2 kernels one nano layer's
 * causal attention takes 0.22 s instead of 3.4 s at 1,024 tokens, 1.6 s
 * instead of 57 s at 4,096 (ONEDNN_MAX_CPU_ISA=AVX2 here). Items go over
 * the pool, as the matmul's. Scratch: one item's S block, acc and row
 * state (npu_scratch, NPU_SCRATCH_ATTN_ITEM). */

#define ATT_QB 64  /* queries per item */
#define ATT_KB 512 /* keys per block */

typedef struct att_job {
    const float   *q, *k, *v;
    size_t         Tq, Tk, H, Hkv, D;
    bool           causal;
    const uint8_t *mask;
    float         *out, *lse; /* lse optional */
    size_t         n_qblk;
    atomic_bool    nomem;
    atomic_bool    refused; /* an sgemm failed: the output is not written */
} att_job_t;

/* Row i of S (kb keys from j0) with what it may not see at -inf; returns
 * whether any key is left. */
static bool att_mask_row(const att_job_t *j, size_t t, size_t j0, size_t kb, float *s) {
    size_t last = j->causal ? t + (j->Tk - j->Tq) : j->Tk - 1; /* last visible key */
    bool   any = false;
    for (size_t c = 0; c < kb; c++) {
        bool ok = j0 + c <= last && (!j->mask || j->mask[j0 + c]);
        if (!ok)
            s[c] = -INFINITY;
        any |= ok;
    }
    return any;
}

/* Online softmax of one row of S into P (in place): m and l are the row's
 * running max and sum; returns the factor acc must be scaled by. */
static float att_softmax_row(float *s, size_t kb, float *m, float *l) {
    float mx = *m;
    for (size_t c = 0; c < kb; c++)
        mx = s[c] > mx ? s[c] : mx;
    float scale = *m == -INFINITY ? 0.0f : expf(*m - mx), sum = 0.0f;
    for (size_t c = 0; c < kb; c++) {
        s[c] = s[c] == -INFINITY ? 0.0f : expf(s[c] - mx);
        sum += s[c];
    }
    *l = *l * scale + sum;
    *m = mx;
    return scale;
}

static void att_item(void *ctx, size_t i) {
    att_job_t *j = ctx;
    size_t     h = i / j->n_qblk, t0 = i % j->n_qblk * ATT_QB;
    size_t     qb = j->Tq - t0 < ATT_QB ? j->Tq - t0 : ATT_QB, D = j->D;
    size_t     g = h / (j->H / j->Hkv), ldq = j->H * D, ldk = j->Hkv * D;
    float     *s = npu_scratch(NPU_SCRATCH_ATTN_ITEM, (ATT_QB * (ATT_KB + D) + 2 * ATT_QB) * 4);
    if (!s) {
        atomic_store(&j->nomem, true);
        return;
    }
    float *acc = s + ATT_QB * ATT_KB, *m = acc + ATT_QB * D, *l = m + ATT_QB;
    memset(acc, 0, qb * D * sizeof *acc);
    for (size_t r = 0; r < qb; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    omp_set_num_threads(1);
    /* Keys past the last query's causal horizon are never visible. */
    size_t tk = j->causal ? t0 + qb + (j->Tk - j->Tq) : j->Tk;
    for (size_t j0 = 0; j0 < tk; j0 += ATT_KB) {
        size_t        kb = tk - j0 < ATT_KB ? tk - j0 : ATT_KB;
        dnnl_status_t st =
            dnnl_sgemm('N', 'T', (dnnl_dim_t)qb, (dnnl_dim_t)kb, (dnnl_dim_t)D,
                       1.0f / sqrtf((float)D), j->q + (t0 * j->H + h) * D, (dnnl_dim_t)ldq,
                       j->k + (j0 * j->Hkv + g) * D, (dnnl_dim_t)ldk, 0.0f, s, (dnnl_dim_t)kb);
        if (st != dnnl_success) {
            atomic_store(&j->refused, true);
            return;
        }
        for (size_t r = 0; r < qb; r++) {
            float *sr = s + r * kb, f = 1.0f;
            if (att_mask_row(j, t0 + r, j0, kb, sr))
                f = att_softmax_row(sr, kb, m + r, l + r);
            else
                memset(sr, 0, kb * sizeof *sr);
            for (size_t d = 0; d < D; d++)
                acc[r * D + d] *= f;
        }
        st = dnnl_sgemm('N', 'N', (dnnl_dim_t)qb, (dnnl_dim_t)D, (dnnl_dim_t)kb, 1.0f, s,
                        (dnnl_dim_t)kb, j->v + (j0 * j->Hkv + g) * D, (dnnl_dim_t)ldk, 1.0f, acc,
                        (dnnl_dim_t)D);
        if (st != dnnl_success) {
            atomic_store(&j->refused, true);
            return;
        }
    }
    for (size_t r = 0; r < qb; r++) {
        float *o = j->out + ((t0 + r) * j->H + h) * D, inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (size_t d = 0; d < D; d++)
            o[d] = acc[r * D + d] * inv;
        if (j->lse)
            j->lse[(t0 + r) * j->H + h] = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
    }
}

svc_err_t npu_attention_dnnl(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                             size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                             const uint8_t *key_mask, float *out, float *lse) {
    SVC_ASSERT((!causal || Tq <= Tk) && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    if (Tq == 0 || n_heads == 0 || head_dim == 0)
        return SVC_OK;
    att_job_t j = {.q = q,
                   .k = k,
                   .v = v,
                   .Tq = Tq,
                   .Tk = Tk,
                   .H = n_heads,
                   .Hkv = n_kv_heads,
                   .D = head_dim,
                   .causal = causal,
                   .mask = key_mask,
                   .out = out,
                   .lse = lse,
                   .n_qblk = (Tq + ATT_QB - 1) / ATT_QB};
    atomic_init(&j.nomem, false);
    atomic_init(&j.refused, false);
    npu_parallel_for(n_heads * j.n_qblk, att_item, &j);
    return atomic_load(&j.refused) ? SVC_ERR_UNSUPPORTED
           : atomic_load(&j.nomem) ? SVC_ERR_NOMEM
                                   : SVC_OK;
}

/* ---- the chunked delta rule on sgemm (CPUs without AVX-512) ---------------
 *
 * npu_delta_rule_chunked_ref's algorithm (npu_ref_delta.c has the chunk's
 * equations) in fp32 with its five matrix products per chunk on
 * single-threaded sgemms straight from the strided q, k, v and out (lda =
 * heads * head size: no gather): K K^T and Q K^T (n x n), W S, Q S and
 * A U (into out), and the state update K_d^T U. The forward substitution
 * and the decays stay plain C. One item per value head over the pool.
 * Why: the reference carries every product in double, scalar; one nano
 * layer's delta rule (16 heads of 128) takes 0.27 s instead of 1.45 s at
 * 1,024 tokens, 0.61 s instead of 6.3 s at 4,096 (ONEDNN_MAX_CPU_ISA=AVX2
 * here). */

typedef struct dr_job {
    const float *q, *k, *v, *g, *beta;
    size_t       T, nk, nv, dk, dv;
    const float *state_in;
    float       *state_out, *out;
    atomic_bool  nomem;
    atomic_bool  refused; /* an sgemm failed: out and the state are not written */
} dr_job_t;

#define DR_C NPU_DELTA_CHUNK

/* Scratch of one item, in floats: S, gc, L, A, U, W, Kd. */
static size_t dr_scratch_floats(size_t dk, size_t dv) {
    return dk * dv + DR_C + 2 * DR_C * DR_C + DR_C * dv + 2 * DR_C * dk;
}

typedef struct dr_ws {
    float *S, *gc, *L, *A, *U, *W, *Kd;
} dr_ws_t;

/* L and A from K K^T and Q K^T (in L and A): the decays, beta, the masks. */
static void dr_decays(const dr_job_t *j, const dr_ws_t *w, size_t t0, size_t n, size_t h) {
    for (size_t i = 0; i < n; i++) {
        float b = j->beta[(t0 + i) * j->nv + h];
        for (size_t c = 0; c < n; c++) {
            float decay = c <= i ? expf(w->gc[i] - w->gc[c]) : 0.0f;
            w->L[i * DR_C + c] = c < i ? b * w->L[i * DR_C + c] * decay : 0.0f;
            w->A[i * DR_C + c] *= decay;
        }
    }
}

/* U = (I + L)^-1 beta v, W = (I + L)^-1 beta exp(gc) k: forward
 * substitution, row by row. */
static void dr_solve(const dr_job_t *j, const dr_ws_t *w, size_t t0, size_t n, size_t h,
                     size_t hk) {
    size_t dk = j->dk, dv = j->dv;
    for (size_t i = 0; i < n; i++) {
        size_t       t = t0 + i;
        float        b = j->beta[t * j->nv + h], be = b * expf(w->gc[i]);
        const float *vt = j->v + (t * j->nv + h) * dv, *kt = j->k + (t * j->nk + hk) * dk;
        float       *u = w->U + i * dv, *wr = w->W + i * dk;
        for (size_t d = 0; d < dv; d++)
            u[d] = b * vt[d];
        for (size_t d = 0; d < dk; d++)
            wr[d] = be * kt[d];
        for (size_t c = 0; c < i; c++) {
            float        l = w->L[i * DR_C + c];
            const float *uc = w->U + c * dv, *wc = w->W + c * dk;
            for (size_t d = 0; d < dv; d++)
                u[d] -= l * uc[d];
            for (size_t d = 0; d < dk; d++)
                wr[d] -= l * wc[d];
        }
    }
}

#define SG(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc)                                        \
    dnnl_sgemm(ta, tb, (dnnl_dim_t)(M), (dnnl_dim_t)(N), (dnnl_dim_t)(K), al, A,                   \
               (dnnl_dim_t)(lda), B, (dnnl_dim_t)(ldb), be, C, (dnnl_dim_t)(ldc))

/* One chunk; false when an sgemm failed (the rest is then meaningless). */
static bool dr_chunk(const dr_job_t *j, const dr_ws_t *w, size_t t0, size_t n, size_t h,
                     size_t hk) {
    size_t       dk = j->dk, dv = j->dv, ldqk = j->nk * dk, ldv = j->nv * dv;
    const float *qc = j->q + (t0 * j->nk + hk) * dk, *kc = j->k + (t0 * j->nk + hk) * dk;
    float       *oc = j->out + (t0 * j->nv + h) * dv, scale = 1.0f / sqrtf((float)dk);
    double       acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += (double)j->g[(t0 + i) * j->nv + h];
        w->gc[i] = (float)acc;
    }
    if (SG('N', 'T', n, n, dk, 1.0f, kc, ldqk, kc, ldqk, 0.0f, w->L, DR_C) ||
        SG('N', 'T', n, n, dk, scale, qc, ldqk, kc, ldqk, 0.0f, w->A, DR_C))
        return false;
    dr_decays(j, w, t0, n, h);
    dr_solve(j, w, t0, n, h, hk);
    if (SG('N', 'N', n, dv, dk, -1.0f, w->W, dk, w->S, dv, 1.0f, w->U, dv) || /* v_new */
        SG('N', 'N', n, dv, dk, scale, qc, ldqk, w->S, dv, 0.0f, oc, ldv))    /* q S */
        return false;
    for (size_t i = 0; i < n; i++) {
        float e = expf(w->gc[i]);
        for (size_t d = 0; d < dv; d++)
            oc[i * ldv + d] *= e;
    }
    if (SG('N', 'N', n, dv, n, 1.0f, w->A, DR_C, w->U, dv, 1.0f, oc, ldv)) /* + A v_new */
        return false;
    float glast = w->gc[n - 1], cd = expf(glast);
    for (size_t i = 0; i < dk * dv; i++)
        w->S[i] *= cd;
    for (size_t i = 0; i < n; i++) {
        float        kd = expf(glast - w->gc[i]);
        const float *kt = kc + i * ldqk;
        for (size_t d = 0; d < dk; d++)
            w->Kd[i * dk + d] = kd * kt[d];
    }
    return SG('T', 'N', dk, dv, n, 1.0f, w->Kd, dk, w->U, dv, 1.0f, w->S, dv) == dnnl_success;
}

static void dr_item(void *ctx, size_t h) {
    dr_job_t *j = ctx;
    size_t    dk = j->dk, dv = j->dv, hk = h / (j->nv / j->nk);
    float    *p = npu_scratch(NPU_SCRATCH_ATTN_ITEM, dr_scratch_floats(dk, dv) * sizeof *p);
    if (!p) {
        atomic_store(&j->nomem, true);
        return;
    }
    dr_ws_t w = {.S = p};
    w.gc = w.S + dk * dv, w.L = w.gc + DR_C, w.A = w.L + DR_C * DR_C, w.U = w.A + DR_C * DR_C;
    w.W = w.U + DR_C * dv, w.Kd = w.W + DR_C * dk;
    if (j->state_in)
        memcpy(w.S, j->state_in + h * dk * dv, dk * dv * sizeof *w.S);
    else
        memset(w.S, 0, dk * dv * sizeof *w.S);
    omp_set_num_threads(1);
    for (size_t t0 = 0; t0 < j->T; t0 += DR_C)
        if (!dr_chunk(j, &w, t0, j->T - t0 < DR_C ? j->T - t0 : DR_C, h, hk)) {
            atomic_store(&j->refused, true);
            return;
        }
    if (j->state_out)
        memcpy(j->state_out + h * dk * dv, w.S, dk * dv * sizeof *w.S);
}

svc_err_t npu_delta_rule_dnnl(const float *q, const float *k, const float *v, const float *g,
                              const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                              size_t dk, size_t dv, const float *state_in, float *state_out,
                              float *out) {
    SVC_ASSERT(n_k_heads > 0 && n_v_heads % n_k_heads == 0 && dk > 0 && dv > 0);
    dr_job_t j = {.q = q,
                  .k = k,
                  .v = v,
                  .g = g,
                  .beta = beta,
                  .T = T,
                  .nk = n_k_heads,
                  .nv = n_v_heads,
                  .dk = dk,
                  .dv = dv,
                  .state_in = state_in,
                  .state_out = state_out,
                  .out = out};
    atomic_init(&j.nomem, false);
    atomic_init(&j.refused, false);
    npu_parallel_for(n_v_heads, dr_item, &j);
    return atomic_load(&j.refused) ? SVC_ERR_UNSUPPORTED
           : atomic_load(&j.nomem) ? SVC_ERR_NOMEM
                                   : SVC_OK;
}

/* ---- strided C = alpha A B^T + beta C (npu.h npu_sgemm_nt) ----------------
 *
 * For the quantizer's dense linear algebra (engine/eng_gptq.c: Hessians,
 * a blocked Cholesky, the error feedback), whose operands are blocks of
 * larger matrices. Items of DNNL_NB columns of C go over the pool, each a
 * single-threaded sgemm; a refused sgemm takes the double-accumulating
 * loop instead, so the product never fails. */

typedef struct sg_job {
    const float *a, *b;
    float       *c;
    size_t       M, N, K, lda, ldb, ldc;
    float        alpha, beta;
} sg_job_t;

#define SG_MB 256 /* rows of C per item (with DNNL_NB columns) */

/* Rows [m0, m0 + mc) and columns [n0, n0 + nc) of C. */
static void sg_block_ref(const sg_job_t *j, size_t m0, size_t mc, size_t n0, size_t nc) {
    for (size_t m = m0; m < m0 + mc; m++)
        for (size_t n = n0; n < n0 + nc; n++) {
            double s = 0.0;
            for (size_t k = 0; k < j->K; k++)
                s += (double)j->a[m * j->lda + k] * (double)j->b[n * j->ldb + k];
            float *c = &j->c[m * j->ldc + n];
            *c = (float)((double)j->alpha * s + (j->beta != 0.0f ? (double)j->beta * *c : 0.0));
        }
}

static void sg_item(void *ctx, size_t i) {
    const sg_job_t *j = ctx;
    size_t          nb = (j->N + DNNL_NB - 1) / DNNL_NB;
    size_t          m0 = i / nb * SG_MB, n0 = i % nb * DNNL_NB;
    size_t          mc = j->M - m0 < SG_MB ? j->M - m0 : SG_MB;
    size_t          nc = j->N - n0 < DNNL_NB ? j->N - n0 : DNNL_NB;
    omp_set_num_threads(1);
    if (npu_dnnl_refusal() ||
        SG('N', 'T', mc, nc, j->K, j->alpha, j->a + m0 * j->lda, j->lda, j->b + n0 * j->ldb, j->ldb,
           j->beta, j->c + m0 * j->ldc + n0, j->ldc) != dnnl_success)
        sg_block_ref(j, m0, mc, n0, nc);
}

void npu_sgemm_nt(size_t M, size_t N, size_t K, float alpha, const float *a, size_t lda,
                  const float *b, size_t ldb, float beta, float *c, size_t ldc) {
    if (M == 0 || N == 0)
        return;
    sg_job_t j = {a, b, c, M, N, K, lda, ldb, ldc, alpha, beta};
    if (K == 0) { /* oneDNN takes no empty inner dimension */
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++)
                c[m * ldc + n] = beta != 0.0f ? beta * c[m * ldc + n] : 0.0f;
        return;
    }
    size_t n_items = (M + SG_MB - 1) / SG_MB * ((N + DNNL_NB - 1) / DNNL_NB);
    if ((double)M * (double)N * (double)K >= 2e6)
        npu_parallel_for(n_items, sg_item, &j);
    else
        for (size_t i = 0; i < n_items; i++)
            sg_item(&j, i);
}
