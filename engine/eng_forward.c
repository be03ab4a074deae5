/*
 * eng_forward.c -- the Qwen3.5 text tower forward pass in fp32 on the
 * reference kernels (npu_*_ref), following transformers'
 * models/qwen3_5/modeling_qwen3_5.py (Qwen3_5TextModel) step by step:
 *
 *   x = embed[ids]
 *   per layer:  x += mixer(rmsnorm_1+w(x))      (Gated DeltaNet or attention)
 *               x += mlp(rmsnorm_1+w(x))         (down(silu(gate) * up))
 *   final_last = rmsnorm_1+w(x[T-1])
 *
 * Activations are a few (T, W) buffers, W the widest projection; attention
 * uses the online-softmax kernel and the delta rule the chunked one, so
 * nothing is T x T. No fast paths here: this is the oracle they are
 * checked against.
 */
#include "eng_model_int.h"
#include "npu.h"

#include <math.h>

/* Per-call activations; every buffer is owned by the call. */
typedef struct fwd {
    const eng_model_t *m;
    size_t             T;
    float             *x;    /* (T, H) residual stream */
    float             *h;    /* (T, H) normed input of a block */
    float             *a;    /* (T, W) scratch */
    float             *b;    /* (T, W) */
    float             *c;    /* (T, W) */
    float             *d;    /* (T, W) */
    float             *s1;   /* (T, nv) beta */
    float             *s2;   /* (T, nv) g */
    int32_t           *pos3; /* (T, 3) mrope positions, all rows t */
} fwd_t;

static size_t max_z(size_t a, size_t b) {
    return a > b ? a : b;
}

/* W: the widest per-token row any step writes into a scratch buffer. */
static size_t scratch_width(const eng_model_cfg_t *c) {
    size_t w = max_z(c->hidden, c->inter);
    w = max_z(w, eng_lin_conv_dim(c));
    w = max_z(w, eng_q_rows(c));
    w = max_z(w, 2 * c->n_kv * c->head_dim); /* k and v share one buffer */
    return w;
}

static void fwd_free(fwd_t *f) {
    free(f->x);
    free(f->h);
    free(f->a);
    free(f->b);
    free(f->c);
    free(f->d);
    free(f->s1);
    free(f->s2);
    free(f->pos3);
}

static svc_err_t fwd_alloc(fwd_t *f, const eng_model_t *m, size_t T) {
    memset(f, 0, sizeof *f);
    f->m = m;
    f->T = T;
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 W = scratch_width(c);
    if (T > SIZE_MAX / sizeof(float) / W / 4)
        return SVC_ERR_NOMEM;
    f->x = malloc(T * c->hidden * sizeof *f->x);
    f->h = malloc(T * c->hidden * sizeof *f->h);
    f->a = malloc(T * W * sizeof *f->a);
    f->b = malloc(T * W * sizeof *f->b);
    f->c = malloc(T * W * sizeof *f->c);
    f->d = malloc(T * W * sizeof *f->d);
    f->s1 = malloc(T * c->lin_nv * sizeof *f->s1);
    f->s2 = malloc(T * c->lin_nv * sizeof *f->s2);
    f->pos3 = malloc(T * 3 * sizeof *f->pos3);
    if (!f->x || !f->h || !f->a || !f->b || !f->c || !f->d || !f->s1 || !f->s2 || !f->pos3)
        return SVC_ERR_NOMEM;
    /* Text: plain positions 0..T-1 on all three mrope axes (SPEC d.2). */
    for (size_t t = 0; t < T; t++)
        f->pos3[3 * t] = f->pos3[3 * t + 1] = f->pos3[3 * t + 2] = (int32_t)t;
    return SVC_OK;
}

static void add_into(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static float sigmoidf_(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* F.softplus with its default threshold 20 (linear above). */
static float softplusf_(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

/* Gated DeltaNet (Qwen3_5GatedDeltaNet.forward without cache); h is (T, H),
 * the mixer output lands in f->b as (T, H). */
static svc_err_t linear_attn(fwd_t *f, const eng_layer_t *l) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t T = f->T, H = c->hidden, kd = eng_lin_key_dim(c), vd = eng_lin_value_dim(c);
    size_t C = eng_lin_conv_dim(c), nv = c->lin_nv;
    /* mixed qkv (T, C) -> causal depthwise conv + silu -> f->b (T, C) */
    npu_matmul_ref(f->h, l->in_qkv, T, H, C, f->a);
    npu_conv1d_causal_silu_ref(f->a, l->conv, T, C, c->conv_k, NULL, NULL, f->b);
    /* split into contiguous q (T, nk, dk), k (T, nk, dk), v (T, nv, dv) in f->a */
    float *q = f->a, *k = f->a + T * kd, *v = f->a + 2 * T * kd;
    for (size_t t = 0; t < T; t++) {
        const float *row = f->b + t * C;
        memcpy(q + t * kd, row, kd * sizeof *q);
        memcpy(k + t * kd, row + kd, kd * sizeof *k);
        memcpy(v + t * vd, row + 2 * kd, vd * sizeof *v);
    }
    /* use_qk_l2norm_in_kernel=True: FLA's l2norm, eps 1e-6 */
    npu_l2norm_ref(q, T * c->lin_nk, c->lin_dk, 1e-6f, q);
    npu_l2norm_ref(k, T * c->lin_nk, c->lin_dk, 1e-6f, k);
    /* beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), both (T, nv) */
    npu_matmul_ref(f->h, l->in_b, T, H, nv, f->s1);
    npu_matmul_ref(f->h, l->in_a, T, H, nv, f->s2);
    for (size_t t = 0; t < T; t++)
        for (size_t j = 0; j < nv; j++) {
            f->s1[t * nv + j] = sigmoidf_(f->s1[t * nv + j]);
            f->s2[t * nv + j] = -expf(l->a_log[j]) * softplusf_(f->s2[t * nv + j] + l->dt_bias[j]);
        }
    /* core (T, nv, dv) in f->d */
    svc_err_t err = npu_delta_rule_chunked_ref(q, k, v, f->s2, f->s1, T, c->lin_nk, nv, c->lin_dk,
                                               c->lin_dv, NULL, NULL, f->d);
    if (err)
        return err;
    /* gated norm per value head with z = in_proj_z(h) (T, nv, dv), then out_proj */
    npu_matmul_ref(f->h, l->in_z, T, H, vd, f->c);
    npu_rmsnorm_gated_ref(f->d, f->c, l->lin_norm, T * nv, c->lin_dv, c->eps, f->d);
    npu_matmul_ref(f->d, l->out_proj, T, vd, H, f->b);
    return SVC_OK;
}

/* Gated softmax attention (Qwen3_5Attention.forward); h is (T, H), the
 * mixer output lands in f->b as (T, H). */
static svc_err_t full_attn(fwd_t *f, const eng_layer_t *l, bool noncausal) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t                 T = f->T, H = c->hidden, hd = c->head_dim, nh = c->n_heads;
    size_t                 qd = nh * hd, kvd = c->n_kv * hd, QR = eng_q_rows(c);
    /* q_proj (T, nh, [2] hd): with the output gate, transformers views it as
     * (T, nh, 2 * hd) and chunks the last dim: query first, gate second. */
    npu_matmul_ref(f->h, l->q_proj, T, H, QR, f->a);
    float *q = f->b, *gate = f->c;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < nh; i++) {
            const float *src = f->a + t * QR + i * (c->attn_gate ? 2 * hd : hd);
            memcpy(q + (t * nh + i) * hd, src, hd * sizeof *q);
            if (c->attn_gate)
                memcpy(gate + (t * nh + i) * hd, src + hd, hd * sizeof *gate);
        }
    float *k = f->d, *v = f->d + T * kvd;
    npu_matmul_ref(f->h, l->k_proj, T, H, kvd, k);
    npu_matmul_ref(f->h, l->v_proj, T, H, kvd, v);
    npu_rmsnorm_ref(q, l->q_norm, T * nh, hd, c->eps, q, true);
    npu_rmsnorm_ref(k, l->k_norm, T * c->n_kv, hd, c->eps, k, true);
    npu_mrope_ref(q, f->pos3, T, nh, hd, c->rot_dim, c->theta, c->section, c->interleaved);
    npu_mrope_ref(k, f->pos3, T, c->n_kv, hd, c->rot_dim, c->theta, c->section, c->interleaved);
    /* attention (T, nh, hd) -> f->a; SPEC d.3: noncausal sees every token */
    svc_err_t err = npu_attention_ref(q, k, v, T, T, nh, c->n_kv, hd, !noncausal, NULL, f->a);
    if (err)
        return err;
    if (c->attn_gate)
        for (size_t i = 0; i < T * qd; i++)
            f->a[i] *= sigmoidf_(gate[i]);
    npu_matmul_ref(f->a, l->o_proj, T, qd, H, f->b);
    return SVC_OK;
}

/* Qwen3_5MLP on f->h (T, H): down(silu(gate(h)) * up(h)) -> f->c (T, H). */
static void mlp(fwd_t *f, const eng_layer_t *l) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t                 T = f->T, H = c->hidden, I = c->inter;
    npu_matmul_ref(f->h, l->mlp_gate, T, H, I, f->a);
    npu_matmul_ref(f->h, l->mlp_up, T, H, I, f->b);
    npu_silu_mul_ref(f->a, f->b, T, I, f->a);
    npu_matmul_ref(f->a, l->mlp_down, T, I, H, f->c);
}

static svc_err_t layer_forward(fwd_t *f, const eng_layer_t *l, bool noncausal) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t                 TH = f->T * c->hidden;
    npu_rmsnorm_ref(f->x, l->in_norm, f->T, c->hidden, c->eps, f->h, true);
    svc_err_t err = l->kind == ENG_LAYER_LINEAR ? linear_attn(f, l) : full_attn(f, l, noncausal);
    if (err)
        return err;
    add_into(f->x, f->b, TH);
    npu_rmsnorm_ref(f->x, l->post_norm, f->T, c->hidden, c->eps, f->h, true);
    mlp(f, l);
    add_into(f->x, f->c, TH);
    return SVC_OK;
}

static svc_err_t check_ids(const eng_model_t *m, const int32_t *ids, size_t T, char *errstr,
                           size_t n) {
    if (T == 0) {
        svc_errf(errstr, n, "forward pass over 0 tokens");
        return SVC_ERR_INVALID;
    }
    for (size_t t = 0; t < T; t++)
        if (ids[t] < 0 || (size_t)ids[t] >= m->cfg.vocab) {
            svc_errf(errstr, n, "token id %d at position %zu is outside the vocabulary (0..%zu)",
                     (int)ids[t], t, m->cfg.vocab - 1);
            return SVC_ERR_INVALID;
        }
    return SVC_OK;
}

svc_err_t eng_model_forward(const eng_model_t *m, const int32_t *ids, size_t T, bool noncausal,
                            float *final_last, eng_trace_fn trace, void *user, char *errstr,
                            size_t errstr_size) {
    svc_err_t err = check_ids(m, ids, T, errstr, errstr_size);
    if (err)
        return err;
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 H = c->hidden;
    fwd_t                  f;
    err = fwd_alloc(&f, m, T);
    for (size_t t = 0; !err && t < T; t++)
        memcpy(f.x + t * H, m->embed + (size_t)ids[t] * H, H * sizeof *f.x);
    if (!err && trace)
        trace(-1, f.x, T, H, user);
    for (size_t i = 0; !err && i < c->n_layers; i++) {
        err = layer_forward(&f, &m->layers[i], noncausal);
        if (!err && trace)
            trace((int)i, f.x, T, H, user);
    }
    if (!err)
        npu_rmsnorm_ref(f.x + (T - 1) * H, m->final_norm, 1, H, c->eps, final_last, true);
    if (err == SVC_ERR_NOMEM)
        svc_errf(errstr, errstr_size, "out of memory for a forward pass over %zu tokens", T);
    fwd_free(&f);
    return err;
}
