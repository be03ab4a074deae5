/*
 * npu_ref.c -- scalar fp32 reference kernels for the Qwen3.5 text tower:
 * norms, matmul, rope, attention, causal conv, activations. The gated delta
 * rule is in npu_ref_delta.c.
 *
 * These are the oracles the fast kernels are tested against, so clarity and
 * accuracy come first: every reduction accumulates in double, nothing is
 * vectorised by hand, and the comments name the transformers function
 * (models/qwen3_5/modeling_qwen3_5.py) each kernel reproduces.
 */
#include "npu.h"

#include <math.h>

uint16_t npu_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a NaN after truncation */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static double silu_d(double x) {
    return x / (1.0 + exp(-x));
}

/* Qwen3_5RMSNorm.forward: x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32.
 * The (1 + w) form is why the checkpoint's decoder norm weights sit near 0. */
void npu_rmsnorm_ref(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                     bool one_plus_w) {
    SVC_ASSERT(D > 0);
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        float       *yr = out + t * D;
        double       ss = 0.0;
        for (size_t d = 0; d < D; d++)
            ss += (double)xr[d] * xr[d];
        double inv = 1.0 / sqrt(ss / (double)D + (double)eps);
        for (size_t d = 0; d < D; d++) {
            double wd = one_plus_w ? 1.0 + (double)w[d] : (double)w[d];
            yr[d] = (float)((double)xr[d] * inv * wd);
        }
    }
}

/* Qwen3_5RMSNormGated.forward: norm first, then the plain weight, then the
 * silu(gate) factor ("Norm before gate"). */
void npu_rmsnorm_gated_ref(const float *x, const float *z, const float *w, size_t T, size_t D,
                           float eps, float *out) {
    SVC_ASSERT(D > 0);
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        const float *zr = z + t * D;
        float       *yr = out + t * D;
        double       ss = 0.0;
        for (size_t d = 0; d < D; d++)
            ss += (double)xr[d] * xr[d];
        double inv = 1.0 / sqrt(ss / (double)D + (double)eps);
        for (size_t d = 0; d < D; d++)
            yr[d] = (float)((double)xr[d] * inv * (double)w[d] * silu_d((double)zr[d]));
    }
}

void npu_matmul_ref(const float *x, const float *w, size_t T, size_t K, size_t N, float *out) {
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * K;
        for (size_t n = 0; n < N; n++) {
            const float *wr = w + n * K;
            double       acc = 0.0;
            for (size_t i = 0; i < K; i++)
                acc += (double)xr[i] * wr[i];
            out[t * N + n] = (float)acc;
        }
    }
}

void npu_matmul_bf16_ref(const float *x, const uint16_t *w, size_t T, size_t K, size_t N,
                         float *out) {
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * K;
        for (size_t n = 0; n < N; n++) {
            const uint16_t *wr = w + n * K;
            double          acc = 0.0;
            for (size_t i = 0; i < K; i++)
                acc += (double)xr[i] * npu_bf16_to_f32(wr[i]);
            out[t * N + n] = (float)acc;
        }
    }
}

/* One head's rotation, rotate_half convention: x1 = first half of the
 * rotary part, x2 = second half; x*cos + rotate_half(x)*sin with
 * rotate_half(x) = cat(-x2, x1) (apply_rotary_pos_emb). c[i], s[i]: cos
 * and sin, in double, of the angle of frequency i < rot_dim / 2. */
static void rope_head(float *xh, const double *c, const double *s, size_t rot_dim) {
    size_t half = rot_dim / 2;
    for (size_t i = 0; i < half; i++) {
        double x1 = xh[i];
        double x2 = xh[i + half];
        xh[i] = (float)(x1 * c[i] - x2 * s[i]);
        xh[i + half] = (float)(x2 * c[i] + x1 * s[i]);
    }
}

/* A position's cos and sin of its half angles, taken once for all its
 * heads (they share them; per head, sincos was most of a rope's time). */
static void rope_cos_sin(const float *angle, size_t half, double *c, double *s) {
    for (size_t i = 0; i < half; i++) {
        c[i] = cos((double)angle[i]);
        s[i] = sin((double)angle[i]);
    }
}

/* inv_freq and the angles are formed in fp32 on purpose, as transformers
 * does (compute_default_rope_parameters builds inv_freq in float32 and
 * Qwen3_5TextRotaryEmbedding.forward multiplies in float32 under
 * "Force float32"): at positions of a few thousand the fp32 angle differs
 * from the exact one by more than the fast kernels' tolerance, and the
 * model was trained with the fp32 one. Only cos/sin are taken in double. */
static float rope_inv_freq(float theta, size_t i, size_t rot_dim) {
    float e = (float)(2 * i) / (float)rot_dim;
    return 1.0f / powf(theta, e);
}

/* The largest rot_dim / 2 the kernels accept without malloc. */
#define ROPE_MAX_HALF 512

void npu_rope_ref(float *x, const int32_t *pos, size_t T, size_t H, size_t head_dim, size_t rot_dim,
                  float theta) {
    SVC_ASSERT(rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim / 2 <= ROPE_MAX_HALF);
    float  angle[ROPE_MAX_HALF];
    double c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    size_t half = rot_dim / 2;
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < half; i++)
            angle[i] = (float)pos[t] * rope_inv_freq(theta, i, rot_dim);
        rope_cos_sin(angle, half, c, s);
        for (size_t h = 0; h < H; h++)
            rope_head(x + (t * H + h) * head_dim, c, s, rot_dim);
    }
}

/* Which of the 3 position ids (0 temporal, 1 height, 2 width) drives
 * frequency i. Interleaved is Qwen3_5TextRotaryEmbedding's
 * recomposition_frequencies: start from the temporal angles, then
 * overwrite slice(1, 3 * section[1], 3) with height and
 * slice(2, 3 * section[2], 3) with width. */
static int mrope_axis(size_t i, const int section[3], bool interleaved) {
    if (interleaved) {
        if (i % 3 == 1 && i < 3 * (size_t)section[1])
            return 1;
        if (i % 3 == 2 && i < 3 * (size_t)section[2])
            return 2;
        return 0;
    }
    if (i < (size_t)section[0])
        return 0;
    if (i < (size_t)section[0] + (size_t)section[1])
        return 1;
    return 2;
}

void npu_mrope_ref(float *x, const int32_t *pos3, size_t T, size_t H, size_t head_dim,
                   size_t rot_dim, float theta, const int section[3], bool interleaved) {
    SVC_ASSERT(rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim / 2 <= ROPE_MAX_HALF);
    SVC_ASSERT(section[0] >= 0 && section[1] >= 0 && section[2] >= 0);
    SVC_ASSERT((size_t)section[0] + (size_t)section[1] + (size_t)section[2] == rot_dim / 2);
    float  angle[ROPE_MAX_HALF];
    double c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    size_t half = rot_dim / 2;
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < half; i++) {
            int axis = mrope_axis(i, section, interleaved);
            angle[i] = (float)pos3[t * 3 + (size_t)axis] * rope_inv_freq(theta, i, rot_dim);
        }
        rope_cos_sin(angle, half, c, s);
        for (size_t h = 0; h < H; h++)
            rope_head(x + (t * H + h) * head_dim, c, s, rot_dim);
    }
}

/* Keys per block of the online softmax. Any value gives the same result up
 * to rounding; 64 makes the tests cross several block boundaries. */
#define ATTN_KEY_BLOCK 64

/* Whether query i (of Tq, the last Tq of Tk positions) may see key j. */
static bool attn_visible(size_t i, size_t j, size_t Tq, size_t Tk, bool causal,
                         const uint8_t *key_mask) {
    if (key_mask && !key_mask[j])
        return false;
    return !causal || j <= i + (Tk - Tq);
}

/* Online softmax (the flash-attention recurrence): for each (query, head)
 * keep the running max m, the running sum l of exp(s - m) and the running
 * weighted sum acc of v; each new block of keys rescales l and acc by
 * exp(m_old - m_new). Equal to softmax(s) v of eager_attention_forward
 * without ever holding a row of Tk scores. */
svc_err_t npu_attention_ref(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                            size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                            const uint8_t *key_mask, float *out, float *lse) {
    SVC_ASSERT((!causal || Tq <= Tk) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
               head_dim > 0);
    size_t  group = n_heads / n_kv_heads;
    double  scale = 1.0 / sqrt((double)head_dim);
    double *acc = malloc((head_dim + ATTN_KEY_BLOCK) * sizeof *acc);
    if (!acc)
        return SVC_ERR_NOMEM;
    double *s = acc + head_dim;

    for (size_t i = 0; i < Tq; i++) {
        for (size_t h = 0; h < n_heads; h++) {
            const float *qh = q + (i * n_heads + h) * head_dim;
            size_t       kvh = h / group;
            double       m = -INFINITY;
            double       l = 0.0;
            for (size_t d = 0; d < head_dim; d++)
                acc[d] = 0.0;
            for (size_t j0 = 0; j0 < Tk; j0 += ATTN_KEY_BLOCK) {
                size_t nb = Tk - j0 < ATTN_KEY_BLOCK ? Tk - j0 : ATTN_KEY_BLOCK;
                double m_blk = -INFINITY;
                for (size_t jb = 0; jb < nb; jb++) {
                    size_t j = j0 + jb;
                    if (!attn_visible(i, j, Tq, Tk, causal, key_mask)) {
                        s[jb] = -INFINITY;
                        continue;
                    }
                    const float *kj = k + (j * n_kv_heads + kvh) * head_dim;
                    double       dot = 0.0;
                    for (size_t d = 0; d < head_dim; d++)
                        dot += (double)qh[d] * kj[d];
                    s[jb] = dot * scale;
                    if (s[jb] > m_blk)
                        m_blk = s[jb];
                }
                if (m_blk == -INFINITY)
                    continue; /* nothing visible in this block */
                double m_new = m_blk > m ? m_blk : m;
                double corr = exp(m - m_new); /* 0 on the first visible block */
                l *= corr;
                for (size_t d = 0; d < head_dim; d++)
                    acc[d] *= corr;
                for (size_t jb = 0; jb < nb; jb++) {
                    if (s[jb] == -INFINITY)
                        continue;
                    double       p = exp(s[jb] - m_new);
                    const float *vj = v + ((j0 + jb) * n_kv_heads + kvh) * head_dim;
                    l += p;
                    for (size_t d = 0; d < head_dim; d++)
                        acc[d] += p * vj[d];
                }
                m = m_new;
            }
            float *oh = out + (i * n_heads + h) * head_dim;
            for (size_t d = 0; d < head_dim; d++)
                oh[d] = l > 0.0 ? (float)(acc[d] / l) : 0.0f;
            if (lse)
                lse[i * n_heads + h] = l > 0.0 ? (float)(m + log(l)) : -INFINITY;
        }
    }
    free(acc);
    return SVC_OK;
}

svc_err_t npu_attention_naive(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                              size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                              const uint8_t *key_mask, float *out) {
    SVC_ASSERT((!causal || Tq <= Tk) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
               head_dim > 0);
    size_t  group = n_heads / n_kv_heads;
    double  scale = 1.0 / sqrt((double)head_dim);
    double *p = malloc((Tq * Tk + 1) * sizeof *p);
    if (!p)
        return SVC_ERR_NOMEM;
    for (size_t h = 0; h < n_heads; h++) {
        size_t kvh = h / group;
        /* Scores, then a max-subtracted softmax per row. */
        for (size_t i = 0; i < Tq; i++) {
            double mx = -INFINITY;
            for (size_t j = 0; j < Tk; j++) {
                double sc = -INFINITY;
                /* Visibility spelled out again (not attn_visible) so that the
                 * two versions check each other: position of query i is
                 * Tk - Tq + i. */
                bool seen = (!key_mask || key_mask[j]) && (!causal || j + Tq <= i + Tk);
                if (seen) {
                    sc = 0.0;
                    for (size_t d = 0; d < head_dim; d++)
                        sc += (double)q[(i * n_heads + h) * head_dim + d] *
                              k[(j * n_kv_heads + kvh) * head_dim + d];
                    sc *= scale;
                }
                p[i * Tk + j] = sc;
                if (sc > mx)
                    mx = sc;
            }
            double sum = 0.0;
            for (size_t j = 0; j < Tk; j++) {
                double e = mx == -INFINITY ? 0.0 : exp(p[i * Tk + j] - mx);
                p[i * Tk + j] = e;
                sum += e;
            }
            for (size_t d = 0; d < head_dim; d++) {
                double o = 0.0;
                for (size_t j = 0; j < Tk; j++)
                    o += p[i * Tk + j] * v[(j * n_kv_heads + kvh) * head_dim + d];
                out[(i * n_heads + h) * head_dim + d] = sum > 0.0 ? (float)(o / sum) : 0.0f;
            }
        }
    }
    free(p);
    return SVC_OK;
}

/* o = (w1 o1 + w2 o2) / (w1 + w2) with w_i = exp(lse_i - max): softmax
 * over the union of two disjoint key sets from the two halves' normalised
 * outputs (a side that saw no key has lse -inf and weight 0). */
void npu_attention_merge(const float *o1, const float *lse1, const float *o2, const float *lse2,
                         size_t T, size_t n_heads, size_t head_dim, float *o, float *lse) {
    for (size_t r = 0; r < T * n_heads; r++) {
        double a = lse1[r], b = lse2[r], mx = a > b ? a : b;
        double w1 = a == -INFINITY ? 0.0 : exp(a - mx), w2 = b == -INFINITY ? 0.0 : exp(b - mx);
        double sum = w1 + w2, inv = sum > 0.0 ? 1.0 / sum : 0.0;
        w1 *= inv;
        w2 *= inv;
        const float *x = o1 + r * head_dim, *y = o2 + r * head_dim;
        float       *z = o + r * head_dim;
        for (size_t d = 0; d < head_dim; d++)
            z[d] = (float)(w1 * x[d] + w2 * y[d]);
        if (lse)
            lse[r] = sum > 0.0 ? (float)(mx + log(sum)) : -INFINITY;
    }
}

/* causal_conv1d_fn: F.conv1d(x, w, padding=K-1, groups=C)[..., :T] then
 * silu. Output t therefore mixes inputs t-K+1 .. t with w[c][0] on the
 * oldest. The history before x[0] comes from state_in, which is what
 * cache_params.update_conv_state carries between calls. */
void npu_conv1d_causal_silu_ref(const float *x, const float *w, size_t T, size_t C, size_t K,
                                const float *state_in, float *state_out, float *out) {
    npu_conv_split_t sp = npu_conv_whole(C, out);
    npu_conv1d_causal_silu_split_ref(x, w, T, C, K, state_in, state_out, &sp);
}

void npu_conv1d_causal_silu_split_ref(const float *x, const float *w, size_t T, size_t C, size_t K,
                                      const float *state_in, float *state_out,
                                      const npu_conv_split_t *sp) {
    SVC_ASSERT(K >= 1 && sp->n >= 1 && sp->n <= NPU_CONV_SPLIT_MAX);
    size_t hist = K - 1;
    for (size_t t = 0; t < T; t++) {
        size_t b = 0, base = 0; /* channel c is column c - base of block b */
        for (size_t c = 0; c < C; c++) {
            while (c - base >= sp->width[b])
                base += sp->width[b++];
            double acc = 0.0;
            for (size_t i = 0; i < K; i++) {
                /* Input time t - hist + i; negative times come from the state. */
                size_t tt = t + i; /* index into (history ++ x) */
                double xv;
                if (tt >= hist)
                    xv = x[(tt - hist) * C + c];
                else
                    xv = state_in ? state_in[tt * C + c] : 0.0;
                acc += (double)w[c * K + i] * xv;
            }
            sp->out[b][t * sp->width[b] + c - base] = (float)silu_d(acc);
        }
    }
    if (!state_out || hist == 0)
        return;
    /* The new history: the last hist rows of (state_in ++ x). Rows are
     * written oldest first, and a row of state_out is only read (when it
     * aliases state_in) at an index >= the one being written, so in-place
     * works. */
    for (size_t r = 0; r < hist; r++) {
        size_t tt = T + r; /* index into (history ++ x) */
        for (size_t c = 0; c < C; c++) {
            float xv;
            if (tt >= hist)
                xv = x[(tt - hist) * C + c];
            else
                xv = state_in ? state_in[tt * C + c] : 0.0f;
            state_out[r * C + c] = xv;
        }
    }
}

/* l2norm: x * rsqrt(sum(x^2) + eps), matching the FLA library. */
void npu_l2norm_ref(const float *x, size_t T, size_t D, float eps, float *out) {
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        double       ss = 0.0;
        for (size_t d = 0; d < D; d++)
            ss += (double)xr[d] * xr[d];
        double inv = 1.0 / sqrt(ss + (double)eps);
        for (size_t d = 0; d < D; d++)
            out[t * D + d] = (float)((double)xr[d] * inv);
    }
}

/* Qwen3_5MLP: act_fn(gate_proj(x)) * up_proj(x), act_fn = silu. */
void npu_sigmoid_mul_ref(const float *gate, float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)x[i] / (1.0 + exp(-(double)gate[i])));
}

void npu_silu_mul_ref(const float *gate, const float *up, size_t T, size_t F, float *out) {
    size_t n = T * F;
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(silu_d((double)gate[i]) * (double)up[i]);
}
