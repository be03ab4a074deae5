/*
 * npu_ref_delta.c -- the gated delta rule of the Gated DeltaNet layers, two
 * ways: token by token (the oracle) and in chunks (the prefill form).
 *
 * Both follow transformers' modeling_qwen3_5.py:
 * torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule. The
 * state of a value head is S (dk, dv); a token with key k, value v, log
 * decay g and rate beta does
 *   S <- exp(g) S;  S <- S + k (beta (v - k^T S))^T;  out = q^T S / sqrt(dk).
 * Heads are independent, so both kernels run one value head at a time with
 * intermediates in double.
 */
#include "npu.h"

#include <math.h>

/* Value head h reads q/k head h / (n_v / n_k): transformers repeats q and k
 * with repeat_interleave(num_v_heads // num_k_heads, dim=2). */
static size_t qk_head_of(size_t h, size_t n_k_heads, size_t n_v_heads) {
    return h / (n_v_heads / n_k_heads);
}

static void state_load(double *S, const float *state_in, size_t h, size_t dk, size_t dv) {
    size_t n = dk * dv;
    for (size_t i = 0; i < n; i++)
        S[i] = state_in ? (double)state_in[h * n + i] : 0.0;
}

static void state_store(float *state_out, const double *S, size_t h, size_t dk, size_t dv) {
    size_t n = dk * dv;
    for (size_t i = 0; i < n; i++)
        state_out[h * n + i] = (float)S[i];
}

svc_err_t npu_delta_rule_recurrent_ref(const float *q, const float *k, const float *v,
                                       const float *g, const float *beta, size_t T,
                                       size_t n_k_heads, size_t n_v_heads, size_t dk, size_t dv,
                                       const float *state_in, float *state_out, float *out) {
    SVC_ASSERT(n_k_heads > 0 && n_v_heads % n_k_heads == 0 && dk > 0 && dv > 0);
    /* S (dk, dv), then kv_mem (dv). */
    double *S = malloc((dk * dv + dv) * sizeof *S);
    if (!S)
        return SVC_ERR_NOMEM;
    double *delta = S + dk * dv;
    double  scale = 1.0 / sqrt((double)dk);

    for (size_t h = 0; h < n_v_heads; h++) {
        size_t hk = qk_head_of(h, n_k_heads, n_v_heads);
        state_load(S, state_in, h, dk, dv);
        for (size_t t = 0; t < T; t++) {
            const float *qt = q + (t * n_k_heads + hk) * dk;
            const float *kt = k + (t * n_k_heads + hk) * dk;
            const float *vt = v + (t * n_v_heads + h) * dv;
            double       decay = exp((double)g[t * n_v_heads + h]);
            double       b = beta[t * n_v_heads + h];
            /* last_recurrent_state * decay_t */
            for (size_t i = 0; i < dk * dv; i++)
                S[i] *= decay;
            /* kv_mem = k^T S; delta = (v - kv_mem) * beta */
            for (size_t j = 0; j < dv; j++) {
                double mem = 0.0;
                for (size_t i = 0; i < dk; i++)
                    mem += (double)kt[i] * S[i * dv + j];
                delta[j] = ((double)vt[j] - mem) * b;
            }
            /* S += k delta^T */
            for (size_t i = 0; i < dk; i++)
                for (size_t j = 0; j < dv; j++)
                    S[i * dv + j] += (double)kt[i] * delta[j];
            /* out = (q / sqrt(dk))^T S */
            float *ot = out + (t * n_v_heads + h) * dv;
            for (size_t j = 0; j < dv; j++) {
                double o = 0.0;
                for (size_t i = 0; i < dk; i++)
                    o += (double)qt[i] * S[i * dv + j];
                ot[j] = (float)(o * scale);
            }
        }
        if (state_out)
            state_store(state_out, S, h, dk, dv);
    }
    free(S);
    return SVC_OK;
}

/* Scratch of the chunked kernel, one value head and one chunk at a time
 * (C = NPU_DELTA_CHUNK rows at most). */
typedef struct delta_scratch {
    double *S;    /* (dk, dv) recurrent state */
    double *gc;   /* (C) cumulative log decay within the chunk (cum_decay) */
    double *L;    /* (C, C) strictly lower part of ut_system */
    double *A;    /* (C, C) intra_chunk_attn, lower incl. diagonal */
    double *U;    /* (C, dv) new_values, then v_new */
    double *W;    /* (C, dk) k_cumdecay */
    double *qs;   /* (C, dk) scaled query */
    double *kk;   /* (C, dk) key */
    double *Snew; /* (dk, dv) */
} delta_scratch_t;

/*
 * One chunk of length n <= C for one value head (the body of the
 * "Second phase" loop of torch_chunk_gated_delta_rule, with its "First
 * phase" quantities computed for this chunk only). With gc_i the
 * cumulative log decay up to position i of the chunk and
 * D_ij = exp(gc_i - gc_j) (j <= i):
 *   L_ij  = beta_i (k_i . k_j) D_ij               (j < i)   ut_system
 *   U     = (I + L)^-1 (beta v)                             new_values
 *   W     = (I + L)^-1 (beta exp(gc) k)                     k_cumdecay
 *   Vn    = U - W S                                         v_new
 *   out_i = exp(gc_i) q_i^T S + sum_{j<=i} (q_i . k_j) D_ij Vn_j
 *   S     = exp(gc_last) S + sum_j exp(gc_last - gc_j) k_j Vn_j^T
 * (I + L) is unit lower triangular, so its inverse is applied by forward
 * substitution, as torch.linalg.solve_triangular(..., unitriangular=True).
 */
static void delta_chunk(delta_scratch_t *ws, size_t n, size_t dk, size_t dv, const float *q,
                        const float *k, const float *v, const float *g, const float *beta,
                        size_t t0, size_t hk, size_t h, size_t n_k_heads, size_t n_v_heads,
                        double scale, float *out) {
    const size_t C = NPU_DELTA_CHUNK;
    double      *S = ws->S;

    double acc_g = 0.0;
    for (size_t i = 0; i < n; i++) {
        size_t t = t0 + i;
        acc_g += (double)g[t * n_v_heads + h];
        ws->gc[i] = acc_g;
        const float *qt = q + (t * n_k_heads + hk) * dk;
        const float *kt = k + (t * n_k_heads + hk) * dk;
        for (size_t d = 0; d < dk; d++) {
            ws->qs[i * dk + d] = (double)qt[d] * scale;
            ws->kk[i * dk + d] = kt[d];
        }
    }

    /* L (strictly lower) and A (lower with diagonal). The exponent
     * gc_i - gc_j <= 0 for j <= i, so nothing overflows; the strictly
     * upper part is never formed (the -inf mask of the reference). */
    for (size_t i = 0; i < n; i++) {
        double b = beta[(t0 + i) * n_v_heads + h];
        for (size_t j = 0; j <= i; j++) {
            double kdot = 0.0, qk = 0.0;
            for (size_t d = 0; d < dk; d++) {
                kdot += ws->kk[i * dk + d] * ws->kk[j * dk + d];
                qk += ws->qs[i * dk + d] * ws->kk[j * dk + d];
            }
            double decay = exp(ws->gc[i] - ws->gc[j]);
            ws->L[i * C + j] = b * kdot * decay;
            ws->A[i * C + j] = qk * decay;
        }
    }

    /* Forward substitution: row i = rhs_i - sum_{j<i} L_ij row_j. */
    for (size_t i = 0; i < n; i++) {
        size_t t = t0 + i;
        double b = beta[t * n_v_heads + h];
        double eg = exp(ws->gc[i]);
        for (size_t d = 0; d < dv; d++)
            ws->U[i * dv + d] = b * (double)v[(t * n_v_heads + h) * dv + d];
        for (size_t d = 0; d < dk; d++)
            ws->W[i * dk + d] = b * eg * ws->kk[i * dk + d];
        for (size_t j = 0; j < i; j++) {
            double l = ws->L[i * C + j];
            for (size_t d = 0; d < dv; d++)
                ws->U[i * dv + d] -= l * ws->U[j * dv + d];
            for (size_t d = 0; d < dk; d++)
                ws->W[i * dk + d] -= l * ws->W[j * dk + d];
        }
    }

    /* v_new = new_values - k_cumdecay @ S (in place in U). */
    for (size_t i = 0; i < n; i++)
        for (size_t e = 0; e < dv; e++) {
            double wsum = 0.0;
            for (size_t d = 0; d < dk; d++)
                wsum += ws->W[i * dk + d] * S[d * dv + e];
            ws->U[i * dv + e] -= wsum;
        }

    /* out = inter_chunk_attn + intra_chunk_attn @ v_new, with the old S. */
    for (size_t i = 0; i < n; i++) {
        double eg = exp(ws->gc[i]);
        float *ot = out + ((t0 + i) * n_v_heads + h) * dv;
        for (size_t e = 0; e < dv; e++) {
            double inter = 0.0;
            for (size_t d = 0; d < dk; d++)
                inter += ws->qs[i * dk + d] * S[d * dv + e];
            double intra = 0.0;
            for (size_t j = 0; j <= i; j++)
                intra += ws->A[i * C + j] * ws->U[j * dv + e];
            ot[e] = (float)(eg * inter + intra);
        }
    }

    /* S = S * chunk_decay + (k * exp(gc_last - gc))^T @ v_new */
    double glast = ws->gc[n - 1];
    double chunk_decay = exp(glast);
    for (size_t d = 0; d < dk; d++)
        for (size_t e = 0; e < dv; e++)
            ws->Snew[d * dv + e] = S[d * dv + e] * chunk_decay;
    for (size_t j = 0; j < n; j++) {
        double kd = exp(glast - ws->gc[j]);
        for (size_t d = 0; d < dk; d++) {
            double kj = ws->kk[j * dk + d] * kd;
            for (size_t e = 0; e < dv; e++)
                ws->Snew[d * dv + e] += kj * ws->U[j * dv + e];
        }
    }
    memcpy(S, ws->Snew, dk * dv * sizeof *S);
}

/* The reference pads T to a multiple of the chunk size with zeros; a padded
 * token has g = 0, beta = 0 and k = 0, so it changes neither the outputs of
 * real tokens nor the final state. Here the last chunk is simply shorter. */
svc_err_t npu_delta_rule_chunked_ref(const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, size_t T, size_t n_k_heads,
                                     size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                     float *state_out, float *out) {
    SVC_ASSERT(n_k_heads > 0 && n_v_heads % n_k_heads == 0 && dk > 0 && dv > 0);
    const size_t C = NPU_DELTA_CHUNK;
    size_t       total = 2 * dk * dv + C + 2 * C * C + C * dv + 3 * C * dk;
    double      *mem = malloc(total * sizeof *mem);
    if (!mem)
        return SVC_ERR_NOMEM;
    delta_scratch_t ws;
    double         *p = mem;
    ws.S = p, p += dk * dv;
    ws.Snew = p, p += dk * dv;
    ws.gc = p, p += C;
    ws.L = p, p += C * C;
    ws.A = p, p += C * C;
    ws.U = p, p += C * dv;
    ws.W = p, p += C * dk;
    ws.qs = p, p += C * dk;
    ws.kk = p, p += C * dk;
    SVC_ASSERT((size_t)(p - mem) == total);

    double scale = 1.0 / sqrt((double)dk);
    for (size_t h = 0; h < n_v_heads; h++) {
        size_t hk = qk_head_of(h, n_k_heads, n_v_heads);
        state_load(ws.S, state_in, h, dk, dv);
        for (size_t t0 = 0; t0 < T; t0 += C) {
            size_t n = T - t0 < C ? T - t0 : C;
            delta_chunk(&ws, n, dk, dv, q, k, v, g, beta, t0, hk, h, n_k_heads, n_v_heads, scale,
                        out);
        }
        if (state_out)
            state_store(state_out, ws.S, h, dk, dv);
    }
    free(mem);
    return SVC_OK;
}
