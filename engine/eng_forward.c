/*
 * eng_forward.c -- the Qwen3.5 text tower forward pass in fp32, following
 * transformers' models/qwen3_5/modeling_qwen3_5.py (Qwen3_5TextModel) step
 * by step:
 *
 *   x = embed[ids]
 *   per layer:  x += mixer(rmsnorm_1+w(x))      (Gated DeltaNet or attention)
 *               x += mlp(rmsnorm_1+w(x))         (down(silu(gate) * up))
 *   final_last = rmsnorm_1+w(x[T-1])
 *
 * Activations are the (T, H) residual stream plus a few (512, W) chunk
 * buffers (fwd_t below), W the widest projection; attention uses an
 * online-softmax kernel, so nothing is T x T. The kernels are npu.h's
 * dispatching ones: AMX-BF16 tiles (split-bf16 products, fp32 sums) where
 * the CPU has them, else AVX-512 fp32; D3_NPU_KERNELS=avx512 forces fp32
 * and D3_NPU_KERNELS=ref the scalar reference kernels (double
 * accumulation), the oracle the fast ones are checked against --
 * test_tower holds all three to the transformers goldens.
 *
 * A pass may continue from a per-sequence state (eng_fwd_int.h): the
 * full-attention layers' keys and values and the Gated DeltaNet layers'
 * conv and recurrent states of the positions run before, so that a shared
 * prompt prefix runs once. eng_model_forward starts from an empty one.
 * noncausal_full_attention states keep only the layers before the first
 * full-attention layer F plus the residual rows at its input and layer F's
 * attention among those rows (forward_noncausal, attn_shared).
 */
#include "eng_fwd_int.h"
#include "eng_model_int.h"
#include "eng_util_int.h"
#include "npu.h"

#include <math.h>

struct eng_fwd_state {
    const eng_model_t *m;
    bool               noncausal; /* made for noncausal_full_attention passes */
    size_t             n_pre;     /* layers [0, n_pre) kept per position: L, or F if noncausal */
    size_t             len;       /* positions run */
    size_t             cap;       /* rows held: KV rows of every full layer, or xs rows */
    bool               broken;    /* a pass with update failed halfway */
    float            **k;         /* (L): (cap, n_kv * hd) for full layers (causal), else NULL */
    float            **v;         /* (L): likewise */
    float            **conv;      /* (L): (K - 1, conv channels) for linear layers < n_pre */
    float            **rec;       /* (L): (nv, dk, dv) for linear layers < n_pre */
    float             *xs;        /* noncausal: (cap, H) residual stream at layer n_pre's input */
    int32_t           *pos3;      /* noncausal: (cap, 3) mrope positions of those rows */
    bool               keep_f;    /* noncausal and a layer after F: ao, alse kept */
    float             *ao;        /* keep_f: (cap, nh * hd) layer F's attention, rows x keys held */
    float             *alse;      /* keep_f: (cap, nh) its log-sum-exp per head */
    int64_t            next;      /* the position the next text token takes (text: len) */
    int64_t            base;      /* the first position of the image a run of image tokens is in */
};

#define FWD_CHUNK ENG_FWD_CHUNK

/* One sequence of a pass: its rows x[off .. off + T) continue st's P
 * positions. */
typedef struct fwd_seq {
    eng_fwd_state_t *st;   /* NULL: an empty state */
    const int32_t   *ids;  /* (T) */
    size_t           off;  /* its first row in the pass */
    size_t           T;    /* its rows */
    size_t           P;    /* positions before them (st's length) */
    float           *conv; /* (K - 1, conv channels) its running conv state in a linear layer */
    float           *rec;  /* (nv, dk, dv) its running recurrent state */
    int64_t          next; /* after its rows: the next text position (get_rope_index) */
    int64_t          base; /* and the current image's first position */
    eng_fwd_state_t *fst;  /* second noncausal pass: ao, alse of its rows [0, fP), or NULL */
    size_t           fP;
} fwd_seq_t;

/* A run of one sequence's rows inside a chunk: rows [r, r + n) of the
 * pass are its rows [t, t + n). A sequence is cut only where its own rows
 * reach a multiple of FWD_CHUNK, so each sequence of a batched pass sees
 * the chunk boundaries (delta-rule chunks, conv carries) a pass of its own
 * would, and gives the same bits. */
typedef struct fwd_piece {
    size_t s, t, r, n;
} fwd_piece_t;

/* Rows [r, r + n) of the pass, pieces [p0, p0 + np): what one step of a
 * layer (norm, projections, MLP) runs over at once, n <= FWD_CHUNK. */
typedef struct fwd_chunk {
    size_t r, n, p0, np;
} fwd_chunk_t;

/* Per-call activations; every buffer is owned by the call. A pass runs
 * S >= 1 sequences (several: a batch, every state read-only), their rows
 * one after the other in one residual stream, so that the projections and
 * the MLP read each weight once per chunk for all of them; only the
 * mixers (conv, delta rule, attention) run sequence by sequence. A layer
 * runs over the rows in chunks of at most FWD_CHUNK tokens, so that only
 * the residual stream (and a full-attention layer's keys and values) grow
 * with T: the per-token work (norms, projections, MLP) needs no more, the
 * Gated DeltaNet carries its conv and recurrent states from chunk to
 * chunk, and a full-attention layer computes every key and value first,
 * then the queries and outputs chunk by chunk. A 32,768-token nano pass
 * then holds ~0.5 GB of activations instead of ~3.7 GB. */
typedef struct fwd {
    const eng_model_t *m;
    size_t             T;     /* rows, all sequences */
    size_t             S;     /* sequences */
    fwd_seq_t         *seq;   /* (S) */
    fwd_piece_t       *piece; /* (n_piece) in row order */
    fwd_chunk_t       *chunk; /* (n_chunk) in row order */
    size_t             n_piece, n_chunk;
    const eng_media_t *media;     /* the images negative ids refer to, or NULL */
    size_t             C;         /* rows of the chunk buffers: min(T, FWD_CHUNK) */
    bool               update;    /* S == 1 and seq[0].st takes in its T positions */
    float             *kall;      /* (P + T, n_kv * hd) one read-only state's prefix + new keys */
    float             *vall;      /* likewise for values */
    size_t             kv_of;     /* the sequence kall/vall hold now (SIZE_MAX: none) */
    float             *x;         /* (T, H) residual stream */
    float             *kn;        /* (T, n_kv * hd) new keys of a full-attention layer */
    float             *vn;        /* (T, n_kv * hd) new values */
    float             *h;         /* (C, H) normed input of a block */
    float             *a;         /* (C, W) scratch */
    float             *b;         /* (C, W) */
    float             *c;         /* (C, W) */
    float             *d;         /* (C, W) */
    float             *s1;        /* (C, nv) beta */
    float             *s2;        /* (C, nv) g */
    float             *lse;       /* (C, n_heads) log-sum-exp of a layer-F attention */
    float             *conv;      /* (S, K - 1, conv channels) the sequences' running conv states */
    float             *rec;       /* (S, nv, dk, dv) their running recurrent states */
    int32_t           *pos3;      /* (T, 3) mrope positions (t, h, w) */
    bool               last_rows; /* the last layer ran on the last rows only: sequence
                                     s's is row s of x (full_layer_last) */
    size_t f_layer;               /* where covered rows merge fst's attention (SIZE_MAX: none) */
    bool   f_keep;                /* that layer writes its attention into the fst (update) */
    bool   f_only;                /* and stops after it: no output, no MLP (a prefix run) */
    /* eng_fwd_ref_t.tap while a reference layer runs, else NULL */
    void (*tap)(void *user, const npu_wpack_t *w, const float *x, size_t T);
    void *tap_user;
} fwd_t;

static size_t max_z(size_t a, size_t b) {
    return a > b ? a : b;
}

/* W: the widest per-token row any step writes into a scratch buffer. */
static size_t scratch_width(const eng_model_cfg_t *c) {
    size_t w = max_z(c->hidden, c->inter);
    w = max_z(w, eng_lin_conv_dim(c));
    w = max_z(w, eng_q_rows(c));
    return w;
}

static void fwd_free(fwd_t *f) {
    free(f->seq);
    free(f->piece);
    free(f->chunk);
    free(f->x);
    free(f->kn);
    free(f->vn);
    free(f->h);
    free(f->a);
    free(f->b);
    free(f->c);
    free(f->d);
    free(f->s1);
    free(f->s2);
    free(f->lse);
    free(f->conv);
    free(f->rec);
    free(f->pos3);
    free(f->kall);
    free(f->vall);
}

static bool has_full_layer(const eng_model_cfg_t *c) {
    for (size_t i = 0; i < c->n_layers; i++)
        if (c->kinds[i] == ENG_LAYER_FULL)
            return true;
    return false;
}

/* The image of an image token id (ENG_IMAGE_ID), and its token index. */
static const eng_image_emb_t *media_image(const eng_media_t *md, int32_t id, size_t *j) {
    uint32_t u = (uint32_t)(-(int64_t)id - 1);
    size_t   slot = u >> 16;
    *j = u & 0xffffu;
    if (!md || slot >= md->n_slots || !md->slots[slot])
        return NULL;
    return md->slots[slot];
}

/* get_rope_index for sequence q: a text token takes (next, next, next) and
 * advances next by one; image token j of a gh x gw merged grid takes
 * (base, base + j / gw, base + j % gw), base = next at its first token,
 * and after its last one the text goes on at base + max(gh, gw). */
static void positions(fwd_t *f, fwd_seq_t *q, int64_t next, int64_t base) {
    for (size_t t = 0; t < q->T; t++) {
        int32_t *p = f->pos3 + 3 * (q->off + t);
        if (q->ids[t] >= 0) {
            p[0] = p[1] = p[2] = (int32_t)next++;
            continue;
        }
        size_t                 j;
        const eng_image_emb_t *im = media_image(f->media, q->ids[t], &j);
        if (j == 0)
            base = next;
        p[0] = (int32_t)base;
        p[1] = (int32_t)(base + (int64_t)(j / im->gw));
        p[2] = (int32_t)(base + (int64_t)(j % im->gw));
        if (j + 1 == im->gh * im->gw)
            next = base + (int64_t)(im->gh > im->gw ? im->gh : im->gw);
    }
    q->next = next;
    q->base = base;
}

/* Positions and input rows of every sequence from its ids: the token's
 * embedding, or the image token's row; each continues its state's
 * positions. */
static void embed_all(fwd_t *f, const eng_media_t *md) {
    size_t H = f->m->cfg.hidden;
    f->media = md;
    for (size_t s = 0; s < f->S; s++) {
        fwd_seq_t *q = &f->seq[s];
        positions(f, q, q->st ? q->st->next : 0, q->st ? q->st->base : 0);
        for (size_t t = 0; t < q->T; t++) {
            float *row = f->x + (q->off + t) * H;
            if (q->ids[t] >= 0) {
                eng_model_embed_row(f->m, q->ids[t], row);
                continue;
            }
            size_t                 j;
            const eng_image_emb_t *im = media_image(md, q->ids[t], &j);
            memcpy(row, im->rows + j * H, H * sizeof *row);
        }
    }
}

/* The pieces and chunks of the pass (fwd_piece_t: why a sequence is cut
 * only at its own multiples of FWD_CHUNK). Pieces fill a chunk in order
 * while they fit. */
static svc_err_t fwd_plan(fwd_t *f) {
    size_t np = 0;
    for (size_t s = 0; s < f->S; s++)
        np += (f->seq[s].T + FWD_CHUNK - 1) / FWD_CHUNK;
    f->piece = malloc(np * sizeof *f->piece);
    f->chunk = malloc(np * sizeof *f->chunk);
    if (!f->piece || !f->chunk)
        return SVC_ERR_NOMEM;
    for (size_t s = 0; s < f->S; s++)
        for (size_t t = 0; t < f->seq[s].T; t += FWD_CHUNK) {
            size_t n = f->seq[s].T - t < FWD_CHUNK ? f->seq[s].T - t : FWD_CHUNK;
            f->piece[f->n_piece++] = (fwd_piece_t){s, t, f->seq[s].off + t, n};
        }
    for (size_t p = 0; p < f->n_piece;) {
        fwd_chunk_t *ch = &f->chunk[f->n_chunk++];
        *ch = (fwd_chunk_t){f->piece[p].r, 0, p, 0};
        while (p < f->n_piece && ch->n + f->piece[p].n <= FWD_CHUNK) {
            ch->n += f->piece[p++].n;
            ch->np++;
        }
    }
    return SVC_OK;
}

/* Sets up a pass over the S sequences of in (their st, ids and T; in is
 * copied): rows, plan, buffers. update needs S == 1. */
static svc_err_t fwd_alloc(fwd_t *f, const eng_model_t *m, const fwd_seq_t *in, size_t S,
                           bool update) {
    memset(f, 0, sizeof *f);
    f->m = m;
    f->S = S;
    f->kv_of = SIZE_MAX;
    f->f_layer = SIZE_MAX;
    f->seq = calloc(S, sizeof *f->seq);
    if (!f->seq)
        return SVC_ERR_NOMEM;
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 W = scratch_width(c), kvd = c->n_kv * c->head_dim, kv_rows = 0, lim;
    lim = SIZE_MAX / sizeof(float) / max_z(c->hidden, kvd) / 4;
    for (size_t s = 0; s < S; s++) {
        fwd_seq_t *q = &f->seq[s];
        *q = in[s];
        q->off = f->T;
        q->P = q->st ? q->st->len : 0;
        if (q->T > lim - f->T || q->P > lim - q->T)
            return SVC_ERR_NOMEM;
        f->T += q->T;
        if (q->P > 0 && !update && !q->st->noncausal) /* read only: prefix and new rows joined */
            kv_rows = max_z(kv_rows, q->P + q->T);
    }
    SVC_ASSERT(S == 1 || !update);
    f->update = update && f->seq[0].st;
    f->C = f->T < FWD_CHUNK ? f->T : FWD_CHUNK;
    size_t T = f->T, C = f->C;
    size_t conv_n = (c->conv_k - 1) * eng_lin_conv_dim(c),
           rec_n = c->lin_nv * c->lin_dk * c->lin_dv;
    f->x = malloc(T * c->hidden * sizeof *f->x);
    f->h = malloc(C * c->hidden * sizeof *f->h);
    f->a = malloc(C * W * sizeof *f->a);
    f->b = malloc(C * W * sizeof *f->b);
    f->c = malloc(C * W * sizeof *f->c);
    f->d = malloc(C * W * sizeof *f->d);
    f->s1 = malloc(C * c->lin_nv * sizeof *f->s1);
    f->s2 = malloc(C * c->lin_nv * sizeof *f->s2);
    f->conv = malloc((S * conv_n + 1) * sizeof *f->conv);
    f->rec = malloc((S * rec_n + 1) * sizeof *f->rec);
    f->pos3 = malloc(T * 3 * sizeof *f->pos3);
    if (!f->x || !f->h || !f->a || !f->b || !f->c || !f->d || !f->s1 || !f->s2 || !f->conv ||
        !f->rec || !f->pos3)
        return SVC_ERR_NOMEM;
    for (size_t s = 0; s < S; s++) {
        f->seq[s].conv = f->conv + s * conv_n;
        f->seq[s].rec = f->rec + s * rec_n;
    }
    if (has_full_layer(c)) {
        f->kn = malloc(T * kvd * sizeof *f->kn);
        f->vn = malloc(T * kvd * sizeof *f->vn);
        f->lse = malloc(C * c->n_heads * sizeof *f->lse);
        if (!f->kn || !f->vn || !f->lse)
            return SVC_ERR_NOMEM;
    }
    if (kv_rows) {
        f->kall = malloc(kv_rows * kvd * sizeof *f->kall);
        f->vall = malloc(kv_rows * kvd * sizeof *f->vall);
        if (!f->kall || !f->vall)
            return SVC_ERR_NOMEM;
    }
    return fwd_plan(f); /* positions: embed_all, or the caller's copy */
}

static float sigmoidf_(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* F.softplus with its default threshold 20 (linear above). */
static float softplusf_(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

/* A projection under the pass's profile: the exact packs, or their fast
 * companions (eng_model_profile). */
static void fwd_mm(const fwd_t *f, const float *x, const npu_wpack_t *w, size_t T, float *out) {
    if (f->tap)
        f->tap(f->tap_user, w, x, T);
    (f->m->fast ? npu_matmul_packed_fast : npu_matmul_packed)(x, w, T, out);
}

/* n projections of the same x (fwd_mm each): under fast, x is quantised
 * once for all of them (npu_matmul_packed_fast_n; the same bits). */
static void fwd_mm_n(const fwd_t *f, const float *x, size_t T, size_t n,
                     const npu_wpack_t *const *w, float *const *out) {
    if (f->tap)
        f->tap(f->tap_user, w[0], x, T);
    if (f->m->fast) {
        npu_matmul_packed_fast_n(x, T, n, w, out);
        return;
    }
    for (size_t i = 0; i < n; i++)
        npu_matmul_packed(x, w[i], T, out[i]);
}

/* f->h = the block input norm w of rows [t0, t0 + n) of the residual. */
static void norm_rows(fwd_t *f, const float *w, size_t t0, size_t n) {
    const eng_model_cfg_t *c = &f->m->cfg;
    npu_rmsnorm(f->x + t0 * c->hidden, w, n, c->hidden, c->eps, f->h, true);
}

/* Qwen3_5MLP on f->h (n, H): down(silu(gate(h)) * up(h)) -> f->c (n, H).
 * Under fast, one fused call (npu_mlp_fast: the same bits, without the
 * (n, inter) intermediates where the packs run grp8), but while a tap
 * listens: the calibration must see the down projection's input. */
static void mlp(fwd_t *f, const eng_layer_t *l, size_t n) {
    const eng_model_cfg_t *c = &f->m->cfg;
    if (f->m->fast && !f->tap) {
        npu_mlp_fast(f->h, n, l->mlp_gate, l->mlp_up, l->mlp_down, f->a, f->b, f->c);
        return;
    }
    fwd_mm_n(f, f->h, n, 2, (const npu_wpack_t *const[]){l->mlp_gate, l->mlp_up},
             (float *const[]){f->a, f->b});
    npu_silu_mul(f->a, f->b, n, c->inter, f->a);
    fwd_mm(f, f->a, l->mlp_down, n, f->c);
}

/* The second half of a block on rows [t0, t0 + n), after the mixer's
 * output (n, H) was added: x += mlp(rmsnorm(x)). */
static void mlp_rows(fwd_t *f, const eng_layer_t *l, size_t t0, size_t n) {
    size_t H = f->m->cfg.hidden;
    norm_rows(f, l->post_norm, t0, n);
    mlp(f, l, n);
    npu_add(f->x + t0 * H, f->c, n * H);
}

/* A piece's linear states in layer li: before its first row (the state's
 * at the sequence's start, NULL for zeros; else the running ones) and
 * where they go after its last (the state's own with update). */
static void lin_states(fwd_t *f, const fwd_piece_t *pc, size_t li, const float **conv_in,
                       float **conv_out, const float **rec_in, float **rec_out) {
    fwd_seq_t *q = &f->seq[pc->s];
    bool       first = pc->t == 0, prefix = q->P > 0;
    *conv_out = f->update ? q->st->conv[li] : q->conv;
    *rec_out = f->update ? q->st->rec[li] : q->rec;
    *conv_in = !first ? *conv_out : prefix ? q->st->conv[li] : NULL;
    *rec_in = !first ? *rec_out : prefix ? q->st->rec[li] : NULL;
}

/* Gated DeltaNet (Qwen3_5GatedDeltaNet.forward, with the cache of layer li
 * in the sequences' states) on chunk ch; the conv and the delta rule run
 * piece by piece on each sequence's states (lin_states). The mixer output
 * lands in f->b (n, H). */
static svc_err_t linear_chunk(fwd_t *f, const eng_layer_t *l, size_t li, const fwd_chunk_t *ch) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t                 T = ch->n, kd = eng_lin_key_dim(c), vd = eng_lin_value_dim(c);
    size_t                 C = eng_lin_conv_dim(c), nv = c->lin_nv;
    const float           *conv_in, *rec_in;
    float                 *conv_out, *rec_out;
    /* every projection of h at once: mixed qkv (T, C) into f->a, b and a
     * (T, nv) into s1, s2, z (T, nv, dv) into f->c (read at the end) */
    fwd_mm_n(f, f->h, T, 4, (const npu_wpack_t *const[]){l->in_qkv, l->in_b, l->in_a, l->in_z},
             (float *const[]){f->a, f->s1, f->s2, f->c});
    /* mixed qkv -> causal depthwise conv + silu, written straight as
     * contiguous q (T, nk, dk), k (T, nk, dk), v (T, nv, dv) in f->b */
    float *q = f->b, *k = f->b + T * kd, *v = f->b + 2 * T * kd;
    for (size_t p = ch->p0; p < ch->p0 + ch->np; p++) {
        const fwd_piece_t *pc = &f->piece[p];
        size_t             r = pc->r - ch->r;
        npu_conv_split_t   sp = {3, {kd, kd, vd}, {q + r * kd, k + r * kd, v + r * vd}};
        lin_states(f, pc, li, &conv_in, &conv_out, &rec_in, &rec_out);
        npu_conv1d_causal_silu_split(f->a + r * C, l->conv, pc->n, C, c->conv_k, conv_in, conv_out,
                                     &sp);
    }
    /* use_qk_l2norm_in_kernel=True: FLA's l2norm, eps 1e-6 */
    npu_l2norm(q, T * c->lin_nk, c->lin_dk, 1e-6f, q);
    npu_l2norm(k, T * c->lin_nk, c->lin_dk, 1e-6f, k);
    /* beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), both (T, nv) */
    for (size_t j = 0; j < nv; j++) {
        float decay = -expf(l->a_log[j]); /* once per head, not per token */
        for (size_t t = 0; t < T; t++) {
            f->s1[t * nv + j] = sigmoidf_(f->s1[t * nv + j]);
            f->s2[t * nv + j] = decay * softplusf_(f->s2[t * nv + j] + l->dt_bias[j]);
        }
    }
    /* core (T, nv, dv) in f->d, each piece from its sequence's state */
    for (size_t p = ch->p0; p < ch->p0 + ch->np; p++) {
        const fwd_piece_t *pc = &f->piece[p];
        size_t             r = pc->r - ch->r;
        lin_states(f, pc, li, &conv_in, &conv_out, &rec_in, &rec_out);
        svc_err_t err = (f->m->fast ? npu_delta_rule_fast : npu_delta_rule)(
            q + r * kd, k + r * kd, v + r * vd, f->s2 + r * nv, f->s1 + r * nv, pc->n, c->lin_nk,
            nv, c->lin_dk, c->lin_dv, rec_in, rec_out, f->d + r * vd);
        if (err)
            return err;
    }
    /* gated norm per value head with z = in_proj_z(h) (T, nv, dv), then out_proj */
    npu_rmsnorm_gated(f->d, f->c, l->lin_norm, T * nv, c->lin_dv, c->eps, f->d);
    fwd_mm(f, f->d, l->out_proj, T, f->b);
    return SVC_OK;
}

/* A Gated DeltaNet layer and its MLP over every row, chunk by chunk; each
 * sequence's running states start as its state's (P > 0) or zeros, and
 * pass through its own buffers (or the state's with update, which take
 * in the T positions). */
static svc_err_t linear_layer(fwd_t *f, const eng_layer_t *l, size_t li) {
    size_t H = f->m->cfg.hidden;
    for (size_t i = 0; i < f->n_chunk; i++) {
        const fwd_chunk_t *ch = &f->chunk[i];
        norm_rows(f, l->in_norm, ch->r, ch->n);
        svc_err_t err = linear_chunk(f, l, li, ch);
        if (err)
            return err;
        npu_add(f->x + ch->r * H, f->b, ch->n * H);
        mlp_rows(f, l, ch->r, ch->n);
    }
    return SVC_OK;
}

/* Keys and values of layer li over sequence s's P + T positions: the
 * state's own after its new rows were appended (update), the state's
 * prefix and the new rows joined in f->kall/vall (read-only; refilled only
 * when another sequence's are asked for), or the new rows themselves for
 * a fresh sequence. */
static void kv_of(fwd_t *f, size_t li, size_t s, const float **K, const float **V) {
    size_t     kvd = f->m->cfg.n_kv * f->m->cfg.head_dim;
    fwd_seq_t *q = &f->seq[s];
    if (f->update) {
        *K = q->st->k[li];
        *V = q->st->v[li];
        return;
    }
    if (q->P == 0) {
        *K = f->kn + q->off * kvd;
        *V = f->vn + q->off * kvd;
        return;
    }
    if (f->kv_of != s) {
        memcpy(f->kall, q->st->k[li], q->P * kvd * sizeof *f->kall);
        memcpy(f->vall, q->st->v[li], q->P * kvd * sizeof *f->vall);
        memcpy(f->kall + q->P * kvd, f->kn + q->off * kvd, q->T * kvd * sizeof *f->kall);
        memcpy(f->vall + q->P * kvd, f->vn + q->off * kvd, q->T * kvd * sizeof *f->vall);
        f->kv_of = s;
    }
    *K = f->kall;
    *V = f->vall;
}

/* Keys (after k_norm and rope) and values of rows [t0, t0 + n) into
 * f->kn / f->vn. */
static void kv_rows(fwd_t *f, const eng_layer_t *l, size_t t0, size_t n) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t                 hd = c->head_dim, kvd = c->n_kv * hd;
    float                 *k = f->kn + t0 * kvd, *v = f->vn + t0 * kvd;
    norm_rows(f, l->in_norm, t0, n);
    fwd_mm_n(f, f->h, n, 2, (const npu_wpack_t *const[]){l->k_proj, l->v_proj},
             (float *const[]){k, v});
    npu_rmsnorm(k, l->k_norm, n * c->n_kv, hd, c->eps, k, true);
    npu_mrope_ref(k, f->pos3 + 3 * t0, n, c->n_kv, hd, c->rot_dim, c->theta, c->section,
                  c->interleaved);
}

/* Layer F's noncausal attention of piece pc (queries q, output o; Tk
 * keys K, V of its sequence) when its sequence's state fst ran the
 * sequence's rows [0, fP) through it over their own fP keys (ao, alse):
 * those rows of the piece attend only to the keys after fP, merged with
 * what fst holds (npu_attention_merge); the others attend to every key.
 * f_keep (the pass extends fst): fst takes the merged rows and the new
 * ones' attention and log-sum-exp in. */
static svc_err_t attn_shared(fwd_t *f, const fwd_piece_t *pc, const float *q, const float *K,
                             const float *V, size_t Tk, float *o) {
    const eng_model_cfg_t *c = &f->m->cfg;
    const fwd_seq_t       *sq = &f->seq[pc->s];
    eng_fwd_state_t       *st = sq->fst;
    size_t    hd = c->head_dim, nh = c->n_heads, qd = nh * hd, kvd = c->n_kv * hd, fP = sq->fP;
    size_t    nc = fP > pc->t ? (fP - pc->t < pc->n ? fP - pc->t : pc->n) : 0; /* covered rows */
    bool      keep = f->f_keep;
    svc_err_t err = SVC_OK;
    if (nc) {
        float *ao = st->ao + pc->t * qd, *al = st->alse + pc->t * nh;
        err = npu_attention_lse(q, K + fP * kvd, V + fP * kvd, nc, Tk - fP, nh, c->n_kv, hd, NULL,
                                f->d, f->lse);
        if (!err) /* into the state (keep) or straight into o */
            npu_attention_merge(ao, al, f->d, f->lse, nc, nh, hd, keep ? ao : o, keep ? al : NULL);
        if (!err && keep)
            memcpy(o, ao, nc * qd * sizeof *o);
    }
    if (!err && nc < pc->n) { /* the rest over every key; their lse only kept */
        size_t t = pc->t + nc, n = pc->n - nc;
        err = npu_attention_lse(q + nc * qd, K, V, n, Tk, nh, c->n_kv, hd, NULL, o + nc * qd,
                                keep ? st->alse + t * nh : f->lse);
        if (!err && keep)
            memcpy(st->ao + t * qd, o + nc * qd, n * qd * sizeof *o);
    }
    return err;
}

/* Gated softmax attention (Qwen3_5Attention.forward) of chunk ch, each
 * piece against the keys and values of its own sequence (kv_of); the
 * mixer output lands in f->b (n, H). */
static svc_err_t attn_rows(fwd_t *f, const eng_layer_t *l, size_t li, const fwd_chunk_t *ch,
                           bool noncausal) {
    const eng_model_cfg_t *c = &f->m->cfg;
    size_t hd = c->head_dim, nh = c->n_heads, qd = nh * hd, QR = eng_q_rows(c), n = ch->n;
    /* q_proj (n, nh, [2] hd): with the output gate, transformers views it as
     * (n, nh, 2 * hd) and chunks the last dim: query first, gate second. */
    norm_rows(f, l->in_norm, ch->r, n);
    fwd_mm(f, f->h, l->q_proj, n, f->a);
    float *q = f->b, *gate = f->c;
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < nh; i++) {
            const float *src = f->a + t * QR + i * (c->attn_gate ? 2 * hd : hd);
            memcpy(q + (t * nh + i) * hd, src, hd * sizeof *q);
            if (c->attn_gate)
                memcpy(gate + (t * nh + i) * hd, src + hd, hd * sizeof *gate);
        }
    npu_rmsnorm(q, l->q_norm, n * nh, hd, c->eps, q, true);
    npu_mrope_ref(q, f->pos3 + 3 * ch->r, n, nh, hd, c->rot_dim, c->theta, c->section,
                  c->interleaved);
    for (size_t p = ch->p0; p < ch->p0 + ch->np; p++) {
        const fwd_piece_t *pc = &f->piece[p];
        const fwd_seq_t   *sq = &f->seq[pc->s];
        size_t             r = pc->r - ch->r;
        const float       *K, *V;
        kv_of(f, li, pc->s, &K, &V);
        /* Causal: the queries are positions P + t .. of the keys up to the
         * piece's end; SPEC d.3 noncausal: every key (never with a prefix). */
        size_t    Tk = noncausal ? sq->P + sq->T : sq->P + pc->t + pc->n;
        svc_err_t err = li == f->f_layer && sq->fst
                            ? attn_shared(f, pc, q + r * qd, K, V, Tk, f->a + r * qd)
                            : (f->m->fast ? npu_attention_fast
                                          : npu_attention)(q + r * qd, K, V, pc->n, Tk, nh, c->n_kv,
                                                           hd, !noncausal, NULL, f->a + r * qd);
        if (err)
            return err;
    }
    if (f->f_only)
        return SVC_OK;
    if (c->attn_gate)
        npu_sigmoid_mul(gate, f->a, n * qd);
    fwd_mm(f, f->a, l->o_proj, n, f->b);
    return SVC_OK;
}

/* Every key and value of layer li (the queries of a chunk may see later
 * rows); with update the state takes in the new rows (one sequence). */
static void kv_layer(fwd_t *f, const eng_layer_t *l, size_t li) {
    size_t kvd = f->m->cfg.n_kv * f->m->cfg.head_dim;
    for (size_t i = 0; i < f->n_chunk; i++)
        kv_rows(f, l, f->chunk[i].r, f->chunk[i].n);
    if (f->update) {
        fwd_seq_t *q = &f->seq[0];
        memcpy(q->st->k[li] + q->P * kvd, f->kn, q->T * kvd * sizeof *f->kn);
        memcpy(q->st->v[li] + q->P * kvd, f->vn, q->T * kvd * sizeof *f->vn);
    }
    f->kv_of = SIZE_MAX; /* kall holds another layer's */
}

/* The second step of a full-attention layer on chunk ch: queries,
 * attention, output, and the MLP. */
static svc_err_t query_chunk(fwd_t *f, const eng_layer_t *l, size_t li, const fwd_chunk_t *ch,
                             bool noncausal) {
    size_t    H = f->m->cfg.hidden;
    svc_err_t err = attn_rows(f, l, li, ch, noncausal);
    if (err || f->f_only)
        return err;
    npu_add(f->x + ch->r * H, f->b, ch->n * H);
    mlp_rows(f, l, ch->r, ch->n);
    return SVC_OK;
}

/* A full-attention layer and its MLP: every key and value first, then
 * queries, outputs and MLP chunk by chunk. A row of x changes only in its
 * own chunk's second step, so its input norm is the same both times. */
static svc_err_t full_layer(fwd_t *f, const eng_layer_t *l, size_t li, bool noncausal) {
    kv_layer(f, l, li);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; !err && i < f->n_chunk; i++)
        err = query_chunk(f, l, li, &f->chunk[i], noncausal);
    return err;
}

/* The model's last layer when it is full attention and nothing reads its
 * output but each sequence's last row (the final norm; no trace): every
 * key and value as full_layer computes them (a state may take them in),
 * then the query, attention, output and MLP of the S last rows only,
 * gathered into rows [0, S) of x (f->last_rows). Each of those rows comes
 * out as in full_layer: it depends only on its own row and the keys and
 * values. What it saves: the last layer's work on every other row, ~1/24
 * of a nano pass, and one of its six attention layers' queries. */
static svc_err_t full_layer_last(fwd_t *f, const eng_layer_t *l, size_t li, bool noncausal) {
    size_t H = f->m->cfg.hidden, S = f->S;
    kv_layer(f, l, li);
    fwd_piece_t *rows = malloc(S * sizeof *rows), *all = f->piece;
    if (!rows)
        return SVC_ERR_NOMEM;
    /* row s <= sequence s's last row, so moving in order never overwrites
     * a row still to move */
    for (size_t s = 0; s < S; s++) {
        size_t last = f->seq[s].off + f->seq[s].T - 1;
        memmove(f->x + s * H, f->x + last * H, H * sizeof *f->x);
        memmove(f->pos3 + 3 * s, f->pos3 + 3 * last, 3 * sizeof *f->pos3);
        rows[s] = (fwd_piece_t){s, f->seq[s].T - 1, s, 1};
    }
    f->piece = rows;
    f->last_rows = true;
    svc_err_t err = SVC_OK;
    for (size_t r0 = 0; !err && r0 < S; r0 += f->C) {
        size_t      n = S - r0 < f->C ? S - r0 : f->C;
        fwd_chunk_t ch = {r0, n, r0, n};
        err = query_chunk(f, l, li, &ch, noncausal);
    }
    f->piece = all;
    free(rows);
    return err;
}

/* Layer li; last_only: nothing reads the last layer's output but the
 * sequences' last rows (full_layer_last). */
static svc_err_t layer_forward(fwd_t *f, size_t li, bool noncausal, bool last_only) {
    const eng_layer_t *l = &f->m->layers[li];
    if (l->kind == ENG_LAYER_LINEAR)
        return linear_layer(f, l, li);
    if (last_only && li + 1 == f->m->cfg.n_layers)
        return full_layer_last(f, l, li, noncausal);
    return full_layer(f, l, li, noncausal);
}

static svc_err_t check_ids(const eng_model_t *m, const int32_t *ids, size_t T,
                           const eng_media_t *md, char *errstr, size_t n) {
    if (T == 0) {
        svc_errf(errstr, n, "forward pass over 0 tokens");
        return SVC_ERR_INVALID;
    }
    for (size_t t = 0; t < T; t++) {
        if (ids[t] < 0) {
            size_t                 j;
            const eng_image_emb_t *im = media_image(md, ids[t], &j);
            if (!im || j >= im->gh * im->gw || im->hidden != m->cfg.hidden) {
                svc_errf(errstr, n, "image token %d at position %zu refers to no encoded image",
                         (int)ids[t], t);
                return SVC_ERR_INVALID;
            }
            continue;
        }
        if ((size_t)ids[t] >= m->cfg.vocab) {
            svc_errf(errstr, n, "token id %d at position %zu is outside the vocabulary (0..%zu)",
                     (int)ids[t], t, m->cfg.vocab - 1);
            return SVC_ERR_INVALID;
        }
    }
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * Prefix states (eng_fwd_int.h)
 * --------------------------------------------------------------------- */

size_t eng_fwd_shared_layers(const eng_model_t *m, bool noncausal) {
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 F = 0;
    if (!noncausal)
        return c->n_layers;
    while (F < c->n_layers && c->kinds[F] == ENG_LAYER_LINEAR)
        F++;
    return F;
}

eng_fwd_state_t *eng_fwd_state_new(const eng_model_t *m, bool noncausal) {
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 L = c->n_layers;
    eng_fwd_state_t       *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->m = m;
    st->noncausal = noncausal;
    st->n_pre = eng_fwd_shared_layers(m, noncausal);
    st->keep_f = noncausal && st->n_pre + 1 < L;
    st->k = calloc(L, sizeof *st->k);
    st->v = calloc(L, sizeof *st->v);
    st->conv = calloc(L, sizeof *st->conv);
    st->rec = calloc(L, sizeof *st->rec);
    bool ok = st->k && st->v && st->conv && st->rec;
    for (size_t i = 0; ok && i < st->n_pre; i++) {
        if (c->kinds[i] != ENG_LAYER_LINEAR)
            continue;
        st->conv[i] = calloc((c->conv_k - 1) * eng_lin_conv_dim(c), sizeof *st->conv[i]);
        st->rec[i] = calloc(c->lin_nv * c->lin_dk * c->lin_dv, sizeof *st->rec[i]);
        ok = st->conv[i] && st->rec[i];
    }
    if (!ok) {
        eng_fwd_state_free(st);
        return NULL;
    }
    return st;
}

void eng_fwd_state_free(eng_fwd_state_t *st) {
    if (!st)
        return;
    for (size_t i = 0; i < st->m->cfg.n_layers; i++) {
        if (st->k)
            free(st->k[i]);
        if (st->v)
            free(st->v[i]);
        if (st->conv)
            free(st->conv[i]);
        if (st->rec)
            free(st->rec[i]);
    }
    free(st->k);
    free(st->v);
    free(st->conv);
    free(st->rec);
    free(st->xs);
    free(st->pos3);
    free(st->ao);
    free(st->alse);
    free(st);
}

size_t eng_fwd_state_len(const eng_fwd_state_t *st) {
    return st->len;
}

/* Room for n residual rows (noncausal) or n KV rows in every full layer;
 * on failure st keeps its rows (some buffers may have grown: harmless). */
static svc_err_t state_reserve(eng_fwd_state_t *st, size_t n) {
    const eng_model_cfg_t *c = &st->m->cfg;
    size_t                 kvd = c->n_kv * c->head_dim;
    if (n <= st->cap)
        return SVC_OK;
    if (n > SIZE_MAX / sizeof(float) /
                (st->noncausal ? max_z(c->hidden, c->n_heads * c->head_dim) : kvd))
        return SVC_ERR_NOMEM;
    if (st->noncausal) {
        float *xs = realloc(st->xs, n * c->hidden * sizeof *xs);
        if (!xs)
            return SVC_ERR_NOMEM;
        st->xs = xs;
        int32_t *p3 = realloc(st->pos3, n * 3 * sizeof *p3);
        if (!p3)
            return SVC_ERR_NOMEM;
        st->pos3 = p3;
        if (st->keep_f) {
            float *ao = realloc(st->ao, n * c->n_heads * c->head_dim * sizeof *ao);
            if (!ao)
                return SVC_ERR_NOMEM;
            st->ao = ao;
            float *al = realloc(st->alse, n * c->n_heads * sizeof *al);
            if (!al)
                return SVC_ERR_NOMEM;
            st->alse = al;
        }
        st->cap = n;
        return SVC_OK;
    }
    for (size_t i = 0; i < c->n_layers; i++) {
        if (c->kinds[i] == ENG_LAYER_LINEAR)
            continue;
        float *k = realloc(st->k[i], n * kvd * sizeof *k);
        if (!k)
            return SVC_ERR_NOMEM;
        st->k[i] = k;
        float *v = realloc(st->v[i], n * kvd * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        st->v[i] = v;
    }
    st->cap = n;
    return SVC_OK;
}

svc_err_t eng_fwd_state_copy(eng_fwd_state_t *dst, const eng_fwd_state_t *src) {
    const eng_model_cfg_t *c = &src->m->cfg;
    size_t                 kvd = c->n_kv * c->head_dim;
    size_t                 conv_n = (c->conv_k - 1) * eng_lin_conv_dim(c);
    size_t                 rec_n = c->lin_nv * c->lin_dk * c->lin_dv;
    SVC_ASSERT(dst->m == src->m && dst->noncausal == src->noncausal);
    if (src->broken)
        return SVC_ERR_INVALID;
    svc_err_t err = state_reserve(dst, src->len);
    if (err)
        return err;
    if (src->noncausal && src->len) {
        memcpy(dst->xs, src->xs, src->len * c->hidden * sizeof *dst->xs);
        memcpy(dst->pos3, src->pos3, src->len * 3 * sizeof *dst->pos3);
    }
    if (src->keep_f && src->len) {
        memcpy(dst->ao, src->ao, src->len * c->n_heads * c->head_dim * sizeof *dst->ao);
        memcpy(dst->alse, src->alse, src->len * c->n_heads * sizeof *dst->alse);
    }
    for (size_t i = 0; i < c->n_layers; i++) {
        if (c->kinds[i] == ENG_LAYER_LINEAR) {
            if (i >= src->n_pre)
                continue;
            memcpy(dst->conv[i], src->conv[i], conv_n * sizeof *dst->conv[i]);
            memcpy(dst->rec[i], src->rec[i], rec_n * sizeof *dst->rec[i]);
        } else if (src->len && !src->noncausal) {
            memcpy(dst->k[i], src->k[i], src->len * kvd * sizeof *dst->k[i]);
            memcpy(dst->v[i], src->v[i], src->len * kvd * sizeof *dst->v[i]);
        }
    }
    dst->len = src->len;
    dst->next = src->next;
    dst->base = src->base;
    dst->broken = false;
    return SVC_OK;
}

eng_fwd_state_t *eng_fwd_state_clone(const eng_fwd_state_t *src) {
    if (src->broken)
        return NULL;
    eng_fwd_state_t *st = eng_fwd_state_new(src->m, src->noncausal);
    if (st && eng_fwd_state_copy(st, src) != SVC_OK) {
        eng_fwd_state_free(st);
        st = NULL;
    }
    return st;
}

/* ---------------------------------------------------------------------
 * The pass
 * --------------------------------------------------------------------- */

/* Each sequence's final-norm output at its last row, where asked for. */
static void final_rows(const fwd_t *f, const eng_model_t *m, float *const *fin) {
    size_t H = m->cfg.hidden;
    for (size_t s = 0; s < f->S; s++)
        if (fin[s])
            npu_rmsnorm(f->x + (f->last_rows ? s : f->seq[s].off + f->seq[s].T - 1) * H,
                        m->final_norm, 1, H, m->cfg.eps, fin[s], true);
}

/* After a pass with update: the state holds the sequence's rows too. */
static void state_advance(eng_fwd_state_t *st, const fwd_seq_t *q) {
    st->len += q->T;
    st->next = q->next;
    st->base = q->base;
}

/* A noncausal pass from the sequences' states (eng_fwd_int.h; a NULL
 * state is an empty one): layers [0, F) on each sequence's T new tokens
 * continuing its linear states (f), then layers [F, L) over its P prefix
 * rows of st->xs and its T new rows (g, attention over all of them), the
 * prefix rows' attention in layer F merged from the state's (attn_shared)
 * where it keeps one. With update (one sequence), st takes in the T rows
 * before layers [F, L) run, and layer F's attention of all its rows over
 * all its keys; the rest is skipped when nothing reads its output (no
 * final_last, no trace). trace: one sequence only. */
static svc_err_t forward_noncausal(const eng_model_t *m, const fwd_seq_t *in, size_t S, bool update,
                                   const eng_media_t *md, float *const *fin, eng_trace_fn trace,
                                   void *user) {
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 H = c->hidden, F = eng_fwd_shared_layers(m, true);
    eng_fwd_state_t       *st = in[0].st; /* the one updated */
    bool                   tail = trace != NULL;
    for (size_t s = 0; s < S; s++)
        tail = tail || fin[s];
    fwd_t f, g;
    memset(&g, 0, sizeof g);
    fwd_seq_t *gin = calloc(S, sizeof *gin);
    svc_err_t  err = gin ? fwd_alloc(&f, m, in, S, update) : SVC_ERR_NOMEM;
    if (!gin)
        memset(&f, 0, sizeof f);
    if (!err && f.update)
        err = state_reserve(st, st->len + in[0].T);
    bool touched = false; /* st changed: a failure from here on leaves it unusable */
    if (!err)
        embed_all(&f, md);
    if (!err && trace)
        trace(-1, f.x, f.T, H, user);
    for (size_t i = 0; !err && i < F; i++) {
        touched = f.update;
        err = layer_forward(&f, i, true, false);
        if (!err && trace)
            trace((int)i, f.x, f.T, H, user);
    }
    /* layer F's attention goes into st even when nothing reads the rest */
    bool keep = f.update && st->keep_f, second = tail || keep;
    for (size_t s = 0; !err && second && s < S; s++) {
        eng_fwd_state_t *qs = f.seq[s].st;
        gin[s].T = f.seq[s].P + f.seq[s].T;
        gin[s].fst = qs && qs->keep_f ? qs : NULL;
        gin[s].fP = f.seq[s].P;
    }
    if (!err && second)
        err = fwd_alloc(&g, m, gin, S, false);
    g.f_layer = F;
    g.f_keep = keep;
    g.f_only = !tail;
    for (size_t s = 0; !err && second && s < S; s++) {
        /* layers [F, L) over every row of each sequence, at its own position */
        const fwd_seq_t *q = &f.seq[s];
        size_t           o = g.seq[s].off;
        if (q->P) {
            memcpy(g.x + o * H, q->st->xs, q->P * H * sizeof *g.x);
            memcpy(g.pos3 + o * 3, q->st->pos3, q->P * 3 * sizeof *g.pos3);
        }
        memcpy(g.x + (o + q->P) * H, f.x + q->off * H, q->T * H * sizeof *g.x);
        memcpy(g.pos3 + (o + q->P) * 3, f.pos3 + q->off * 3, q->T * 3 * sizeof *g.pos3);
    }
    if (!err && f.update) {
        size_t P = f.seq[0].P, T = f.seq[0].T;
        touched = true;
        memcpy(st->xs + P * H, f.x, T * H * sizeof *st->xs);
        memcpy(st->pos3 + P * 3, f.pos3, T * 3 * sizeof *st->pos3);
        state_advance(st, &f.seq[0]);
    }
    size_t P0 = f.seq ? f.seq[0].P : 0;
    fwd_free(&f);
    for (size_t i = F; !err && second && i < (tail ? c->n_layers : F + 1); i++) {
        err = layer_forward(&g, i, true, !trace);
        if (!err && trace)
            trace((int)i, g.x + P0 * H, g.T - P0, H, user);
    }
    if (!err && tail)
        final_rows(&g, m, fin);
    if (err && touched)
        st->broken = true;
    fwd_free(&g);
    free(gin);
    return err;
}

/* Every layer over the sequences' new rows, continuing their states (a
 * causal pass, or a noncausal one from empty states). */
static svc_err_t forward_plain(const eng_model_t *m, const fwd_seq_t *in, size_t S, bool update,
                               const eng_media_t *md, bool noncausal, float *const *fin,
                               eng_trace_fn trace, void *user) {
    const eng_model_cfg_t *c = &m->cfg;
    eng_fwd_state_t       *st = in[0].st; /* the one updated */
    fwd_t                  f;
    svc_err_t              err = fwd_alloc(&f, m, in, S, update);
    if (!err && f.update)
        err = state_reserve(st, st->len + in[0].T);
    bool touched = false; /* st changed: a failure from here on leaves it unusable */
    if (!err)
        embed_all(&f, md);
    if (!err && trace)
        trace(-1, f.x, f.T, c->hidden, user);
    for (size_t i = 0; !err && i < c->n_layers; i++) {
        touched = f.update;
        err = layer_forward(&f, i, noncausal, !trace);
        if (!err && trace)
            trace((int)i, f.x, f.T, c->hidden, user);
    }
    if (!err)
        final_rows(&f, m, fin);
    if (!err && f.update)
        state_advance(st, &f.seq[0]);
    if (err && touched)
        st->broken = true;
    fwd_free(&f);
    return err;
}

/* The pass for sequences already checked; update and trace: S == 1. */
static svc_err_t forward_seqs(const eng_model_t *m, const fwd_seq_t *in, size_t S, bool update,
                              const eng_media_t *md, bool noncausal, float *const *fin,
                              eng_trace_fn trace, void *user) {
    bool from_state = false;
    for (size_t s = 0; s < S; s++)
        from_state = from_state || in[s].st;
    return noncausal && from_state
               ? forward_noncausal(m, in, S, update, md, fin, trace, user)
               : forward_plain(m, in, S, update, md, noncausal, fin, trace, user);
}

/* Whether st (optional) can carry a pass of m in this mode; errstr if not. */
static svc_err_t check_state(const eng_model_t *m, const eng_fwd_state_t *st, bool noncausal,
                             char *errstr, size_t errstr_size) {
    if (!st || (noncausal == st->noncausal && !st->broken && st->m == m))
        return SVC_OK;
    svc_errf(errstr, errstr_size, "forward pass: %s",
             noncausal != st->noncausal
                 ? (noncausal ? "a noncausal pass cannot continue from a causal prefix state"
                              : "a causal pass cannot continue from a noncausal prefix state")
             : st->broken ? "the prefix state is unusable after a failed pass"
                          : "the prefix state belongs to another model");
    return SVC_ERR_INVALID;
}

svc_err_t eng_model_forward_media(const eng_model_t *m, eng_fwd_state_t *st, bool update,
                                  const int32_t *ids, size_t T, const eng_media_t *md,
                                  bool noncausal, float *final_last, eng_trace_fn trace, void *user,
                                  char *errstr, size_t errstr_size) {
    svc_err_t err = check_ids(m, ids, T, md, errstr, errstr_size);
    if (!err)
        err = check_state(m, st, noncausal, errstr, errstr_size);
    if (err)
        return err;
    fwd_seq_t in = {.st = st, .ids = ids, .T = T};
    size_t    P = st ? st->len : 0;
    err = forward_seqs(m, &in, 1, update, md, noncausal, &final_last, trace, user);
    if (err == SVC_ERR_NOMEM && P)
        svc_errf(errstr, errstr_size,
                 "out of memory for a forward pass over %zu tokens after a prefix of %zu", T, P);
    else if (err == SVC_ERR_NOMEM)
        svc_errf(errstr, errstr_size, "out of memory for a forward pass over %zu tokens", T);
    return err;
}

svc_err_t eng_model_forward_batch(const eng_model_t *m, const eng_fwd_seq_t *seqs, size_t n,
                                  const eng_media_t *md, bool noncausal, char *errstr,
                                  size_t errstr_size) {
    if (n == 0)
        return SVC_OK;
    fwd_seq_t *in = calloc(n, sizeof *in);
    float    **fin = calloc(n, sizeof *fin);
    svc_err_t  err = in && fin ? SVC_OK : SVC_ERR_NOMEM;
    size_t     rows = 0;
    for (size_t s = 0; !err && s < n; s++) {
        char why[400];
        err = check_ids(m, seqs[s].ids, seqs[s].T, md, why, sizeof why);
        if (!err)
            err = check_state(m, seqs[s].st, noncausal, why, sizeof why);
        if (err)
            svc_errf(errstr, errstr_size, "sequence %zu of %zu: %s", s, n, why);
        in[s] =
            (fwd_seq_t){.st = (eng_fwd_state_t *)seqs[s].st, .ids = seqs[s].ids, .T = seqs[s].T};
        fin[s] = seqs[s].final_last;
        rows += seqs[s].T;
    }
    if (!err)
        err = forward_seqs(m, in, n, false, md, noncausal, fin, NULL, NULL);
    if (err == SVC_ERR_NOMEM)
        svc_errf(errstr, errstr_size,
                 "out of memory for a batched forward pass over %zu sequences, %zu tokens", n,
                 rows);
    free(in);
    free(fin);
    return err;
}

svc_err_t eng_model_forward_from(const eng_model_t *m, eng_fwd_state_t *st, bool update,
                                 const int32_t *ids, size_t T, bool noncausal, float *final_last,
                                 eng_trace_fn trace, void *user, char *errstr, size_t errstr_size) {
    return eng_model_forward_media(m, st, update, ids, T, NULL, noncausal, final_last, trace, user,
                                   errstr, errstr_size);
}

svc_err_t eng_model_forward(const eng_model_t *m, const int32_t *ids, size_t T, bool noncausal,
                            float *final_last, eng_trace_fn trace, void *user, char *errstr,
                            size_t errstr_size) {
    return eng_model_forward_from(m, NULL, false, ids, T, noncausal, final_last, trace, user,
                                  errstr, errstr_size);
}

/* ---------------------------------------------------------------------
 * Teacher-forced layer errors (eng_fwd_int.h)
 * --------------------------------------------------------------------- */

static bool same_shape(const eng_model_t *a, const eng_model_t *b) {
    const eng_model_cfg_t *x = &a->cfg, *y = &b->cfg;
    if (x->hidden != y->hidden || x->n_layers != y->n_layers || x->vocab != y->vocab ||
        x->n_heads != y->n_heads || x->n_kv != y->n_kv || x->head_dim != y->head_dim ||
        x->lin_nk != y->lin_nk || x->lin_nv != y->lin_nv || x->lin_dk != y->lin_dk ||
        x->lin_dv != y->lin_dv || x->conv_k != y->conv_k || x->inter != y->inter)
        return false;
    for (size_t i = 0; i < x->n_layers; i++)
        if (a->layers[i].kind != b->layers[i].kind)
            return false;
    return true;
}

/* Runs layer li of the pass from the reference layer l (m's others
 * untouched: view is m with l in place of layer li), then each of r's alt
 * models on the same input; f->x leaves with the reference's output. */
static svc_err_t ref_layer(fwd_t *f, const eng_model_t *m, eng_model_t *view, const eng_layer_t *l,
                           size_t li, const eng_fwd_ref_t *r, bool noncausal, float *x_in,
                           float *x_ref) {
    size_t n = f->T * m->cfg.hidden;
    if (r->n_alt)
        memcpy(x_in, f->x, n * sizeof *x_in);
    view->layers[li] = *l;
    f->m = view;
    f->tap = r->tap;
    f->tap_user = r->tap_user;
    svc_err_t err = layer_forward(f, li, noncausal, false);
    f->tap = NULL;
    view->layers[li] = m->layers[li];
    if (err || !r->n_alt)
        return err;
    memcpy(x_ref, f->x, n * sizeof *x_ref);
    for (size_t a = 0; !err && a < r->n_alt; a++) {
        memcpy(f->x, x_in, n * sizeof *f->x);
        f->m = r->alt[a]; /* the same shape: the pass's buffers fit it */
        err = layer_forward(f, li, noncausal, false);
        if (!err)
            eng_step_error_add(f->x, x_ref, x_in, n, &r->num[a][li], &r->den[a][li]);
    }
    memcpy(f->x, x_ref, n * sizeof *f->x); /* the next layer's input: the reference's */
    return err;
}

static svc_err_t ref_seqs(const eng_model_t *m, const eng_fwd_seq_t *seqs, size_t S,
                          const eng_media_t *md, fwd_seq_t *in, char *errstr, size_t errstr_size) {
    for (size_t s = 0; s < S; s++) {
        char why[400];
        if (seqs[s].st) {
            svc_errf(errstr, errstr_size, "reference pass: sequence %zu has a prefix state", s);
            return SVC_ERR_INVALID;
        }
        if (check_ids(m, seqs[s].ids, seqs[s].T, md, why, sizeof why)) {
            svc_errf(errstr, errstr_size, "sequence %zu of %zu: %s", s, S, why);
            return SVC_ERR_INVALID;
        }
        in[s] = (fwd_seq_t){.ids = seqs[s].ids, .T = seqs[s].T};
    }
    return SVC_OK;
}

svc_err_t eng_fwd_reference(const eng_model_t *m, const eng_fwd_ref_t *r, const eng_fwd_seq_t *seqs,
                            size_t S, const eng_media_t *md, bool noncausal, char *errstr,
                            size_t errstr_size) {
    const eng_model_cfg_t *c = &m->cfg;
    SVC_ASSERT(r->n_alt <= ENG_FWD_REF_ALTS);
    fwd_seq_t  *in = calloc(S ? S : 1, sizeof *in);
    float     **fin = calloc(S ? S : 1, sizeof *fin);
    eng_model_t view = *m;
    svc_err_t   err = in && fin ? SVC_OK : SVC_ERR_NOMEM;
    if (!err)
        err = ref_seqs(m, seqs, S, md, in, errstr, errstr_size);
    for (size_t s = 0; !err && s < S; s++)
        fin[s] = seqs[s].final_last;
    view.layers = err ? NULL : malloc(c->n_layers * sizeof *view.layers);
    fwd_t  f = {0};
    size_t rows = 0;
    for (size_t s = 0; s < S; s++)
        rows += seqs[s].T;
    float *x_in = r->n_alt ? malloc(rows * c->hidden * sizeof *x_in) : NULL;
    float *x_ref = r->n_alt ? malloc(rows * c->hidden * sizeof *x_ref) : NULL;
    if (!err && (!view.layers || (r->n_alt && (!x_in || !x_ref))))
        err = SVC_ERR_NOMEM;
    if (!err) {
        memcpy(view.layers, m->layers, c->n_layers * sizeof *view.layers);
        err = fwd_alloc(&f, m, in, S, false);
    }
    if (!err && (r->first > c->n_layers || (r->first && !r->x0))) {
        svc_errf(errstr, errstr_size, "reference pass: start at layer %zu of %zu%s", r->first,
                 c->n_layers, r->first && !r->x0 ? " without its input" : "");
        err = SVC_ERR_INVALID;
    }
    if (!err) /* a resumed pass still wants embed_all's positions */
        embed_all(&f, md);
    if (!err && r->first)
        memcpy(f.x, r->x0, rows * c->hidden * sizeof *f.x);
    for (size_t li = r->first; !err && li < c->n_layers; li++) {
        eng_layer_t l = {0};
        if ((err = r->fetch(r->user, li, &l, errstr, errstr_size)))
            break;
        if (l.kind != m->layers[li].kind) {
            svc_errf(errstr, errstr_size, "reference pass: layer %zu is of another kind", li);
            err = SVC_ERR_INVALID;
        } else
            err = ref_layer(&f, m, &view, &l, li, r, noncausal, x_in, x_ref);
        r->drop(r->user, &l);
        if (!err && r->done)
            err = r->done(r->user, li, f.x, rows, errstr, errstr_size);
    }
    if (!err) {
        f.m = m;
        final_rows(&f, m, fin);
    }
    if (err == SVC_ERR_NOMEM && errstr_size && !errstr[0])
        svc_errf(errstr, errstr_size, "out of memory for a reference pass over %zu tokens", rows);
    fwd_free(&f); /* zeroed or set up by fwd_alloc: either frees */
    free(view.layers);
    free(x_in);
    free(x_ref);
    free(in);
    free(fin);
    return err;
}

/* eng_fwd_layer_errors' reference layers: ref's own, shared. */
static svc_err_t model_layer(void *user, size_t li, eng_layer_t *l, char *errstr,
                             size_t errstr_size) {
    (void)errstr, (void)errstr_size;
    *l = ((const eng_model_t *)user)->layers[li];
    return SVC_OK;
}

static void model_layer_keep(void *user, eng_layer_t *l) {
    (void)user, (void)l;
}

svc_err_t eng_fwd_layer_errors(const eng_model_t *ref, const eng_model_t *alt, const int32_t *ids,
                               size_t T, bool noncausal, double *num, double *den, char *errstr,
                               size_t errstr_size) {
    if (!same_shape(ref, alt)) {
        svc_errf(errstr, errstr_size, "layer errors: the two models differ in shape");
        return SVC_ERR_INVALID;
    }
    float        *fin = malloc(ref->cfg.hidden * sizeof *fin);
    eng_fwd_ref_t r = {.fetch = model_layer,
                       .drop = model_layer_keep,
                       .user = (void *)ref,
                       .alt = {alt},
                       .num = {num},
                       .den = {den},
                       .n_alt = 1};
    eng_fwd_seq_t seq = {.ids = ids, .T = T, .final_last = fin};
    svc_err_t err = fin ? eng_fwd_reference(ref, &r, &seq, 1, NULL, noncausal, errstr, errstr_size)
                        : SVC_ERR_NOMEM;
    if (err == SVC_ERR_NOMEM)
        svc_errf(errstr, errstr_size, "out of memory for layer errors over %zu tokens", T);
    free(fin);
    return err;
}
