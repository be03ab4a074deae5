/*
 * eng_quant_gptq.c -- `quantize --method gptq`: the text tower's
 * projections rounded by GPTQ (eng_gptq.c) on the inputs the calibration
 * prompts give them, layer by layer.
 *
 * The prompts run through the package's own fp32 layers
 * (eng_fwd_reference: each layer read from the file when it is reached,
 * freed after it ran, every layer fed the reference's output of the one
 * before). While layer i runs, its projections' inputs are summed into
 * one Hessian per distinct input (eng_fwd_ref_t.tap):
 *     in    the block's normed input: in_proj_qkv/z/a/b, or q/k/v_proj
 *     out   the mixer's output: out_proj (gated norm), o_proj (gated attention)
 *     mlp   the MLP's normed input: gate_proj, up_proj
 *     down  silu(gate) * up: down_proj
 * and when it has run (drop) its tensors go into the writer, the packed
 * ones through eng_gptq_encode against their slot's Hessian. Memory: the
 * calibration tokens' residual stream, one layer of fp32 weights twice
 * (the pass's and the one being rounded) and at most four Hessians (for
 * nano 3 x 2048^2 + 6144^2 floats, 200 MB).
 *
 * The embedding (the Q8 lm_head) has no input to calibrate on: it is
 * rounded to nearest, as the seed's token embedding is plain Q8_0.
 */
#include "eng_fwd_int.h"
#include "eng_gptq_int.h"
#include "eng_quant_int.h"

typedef enum qg_slot { QG_IN = 0, QG_OUT = 1, QG_MLP = 2, QG_DOWN = 3, QG_SLOTS } qg_slot_t;

static const char *const SLOT_NAME[QG_SLOTS] = {"in", "out", "mlp", "down"};

/* Which projection takes which input, by the part of its name after
 * "layers.<i>.". */
static const struct {
    const char *suffix;
    qg_slot_t   slot;
} SLOTS[] = {
    {"linear_attn.in_proj_qkv.weight", QG_IN},
    {"linear_attn.in_proj_z.weight", QG_IN},
    {"linear_attn.in_proj_a.weight", QG_IN},
    {"linear_attn.in_proj_b.weight", QG_IN},
    {"self_attn.q_proj.weight", QG_IN},
    {"self_attn.k_proj.weight", QG_IN},
    {"self_attn.v_proj.weight", QG_IN},
    {"linear_attn.out_proj.weight", QG_OUT},
    {"self_attn.o_proj.weight", QG_OUT},
    {"mlp.gate_proj.weight", QG_MLP},
    {"mlp.up_proj.weight", QG_MLP},
    {"mlp.down_proj.weight", QG_DOWN},
};

typedef struct qg {
    qz_t              *q;
    eng_q4nx_writer_t *w;
    size_t             mark; /* w's tensors before this layer's */
    float             *x0;   /* a resumed pass's input, freed once read */
    size_t             li;   /* the layer running */
    eng_layer_t        l;    /* its packs, for the tap */
    eng_gptq_hess_t   *h[QG_SLOTS];
    eng_gptq_opts_t    go;
    svc_err_t          err; /* a drop's failure, returned by the next fetch */
    char               why[768];
    double             loss_g[QG_SLOTS], loss_r[QG_SLOTS];
    size_t             kept;
    double             t0;
} qg_t;

/* The slot of an HF tensor name, or -1 (not a layer projection). */
static int qg_slot(const char *hf) {
    const char *p = strstr(hf, "layers.");
    if (!p || !(p = strchr(p + strlen("layers."), '.')))
        return -1;
    for (size_t i = 0; i < sizeof SLOTS / sizeof SLOTS[0]; i++)
        if (strcmp(p + 1, SLOTS[i].suffix) == 0)
            return (int)SLOTS[i].slot;
    return -1;
}

/* The writer's encoder: GPTQ for a layer's projections, the reference
 * encoder for the embedding. */
static svc_err_t qg_encode(void *user, const char *hf, eng_q4nx_kind_t kind,
                           eng_q4nx_raster_t raster, const float *w, size_t rows, size_t cols,
                           void *packed, char *errstr, size_t errstr_size) {
    qg_t *g = user;
    int   slot = qg_slot(hf);
    if (slot < 0)
        return eng_q4nx_encode_ref(kind, raster, w, rows, cols, packed);
    eng_gptq_hess_t *h = g->h[slot];
    if (!h || eng_gptq_hess_k(h) != cols || !eng_gptq_hess_rows(h)) {
        svc_errf(errstr, errstr_size,
                 "layer %zu: \"%s\" (%zu x %zu): no calibration input of width %zu was seen", g->li,
                 hf, rows, cols, cols);
        return SVC_ERR_INTERNAL;
    }
    eng_gptq_stats_t st;
    char             why[384] = "";
    svc_err_t        err =
        eng_gptq_encode(kind, raster, w, rows, cols, h, &g->go, packed, &st, why, sizeof why);
    if (err) {
        svc_errf(errstr, errstr_size, "layer %zu: \"%s\": %s", g->li, hf, why);
        return err;
    }
    g->loss_g[slot] += st.loss_gptq;
    g->loss_r[slot] += st.loss_rtn;
    g->kept += st.kept_rtn;
    if (st.damp > g->go.damp)
        qz_log(g->q, "layer %zu: \"%s\": dampening raised to %g", g->li, hf, st.damp);
    return SVC_OK;
}

/* Hessian of slot s for inputs of width K, zeroed. */
static svc_err_t qg_hess(qg_t *g, qg_slot_t s, size_t K) {
    if (g->h[s] && eng_gptq_hess_k(g->h[s]) == K) {
        eng_gptq_hess_reset(g->h[s]);
        return SVC_OK;
    }
    eng_gptq_hess_free(g->h[s]);
    g->h[s] = eng_gptq_hess_new(K);
    return g->h[s] ? SVC_OK : SVC_ERR_NOMEM;
}

static svc_err_t qg_fetch(void *user, size_t li, eng_layer_t *l, char *errstr, size_t n) {
    qg_t *g = user;
    if (g->err) { /* the last layer's rounding failed: stop the pass */
        svc_errf(errstr, n, "%s", g->why);
        return g->err;
    }
    free(g->x0); /* copied into the pass (eng_fwd_ref_t.x0): one stream less held */
    g->x0 = NULL;
    const eng_model_cfg_t *c = &g->q->shell->cfg;
    svc_err_t              err = eng_ref_layer(g->q->src, g->q->shell, li, l, errstr, n);
    size_t out = l->kind == ENG_LAYER_LINEAR ? eng_lin_value_dim(c) : c->n_heads * c->head_dim;
    if (!err)
        err = qg_hess(g, QG_IN, c->hidden);
    if (!err)
        err = qg_hess(g, QG_OUT, out);
    if (!err)
        err = qg_hess(g, QG_MLP, c->hidden);
    if (!err)
        err = qg_hess(g, QG_DOWN, c->inter);
    if (err == SVC_ERR_NOMEM)
        svc_errf(errstr, n, "layer %zu: out of memory for its Hessians", li);
    g->li = li;
    g->l = *l;
    g->mark = eng_q4nx_writer_count(g->w);
    g->t0 = qz_now();
    memset(g->loss_g, 0, sizeof g->loss_g);
    memset(g->loss_r, 0, sizeof g->loss_r);
    g->kept = 0;
    return err;
}

/* The projection input x (T rows) into its slot's Hessian; k_proj's is
 * q_proj's, seen again (eng_fwd_ref_t.tap). */
static void qg_tap(void *user, const npu_wpack_t *w, const float *x, size_t T) {
    qg_t              *g = user;
    const eng_layer_t *l = &g->l;
    int                slot = w == l->in_qkv || w == l->q_proj     ? QG_IN
                              : w == l->out_proj || w == l->o_proj ? QG_OUT
                              : w == l->mlp_gate                   ? QG_MLP
                              : w == l->mlp_down                   ? QG_DOWN
                                                                   : -1;
    if (slot < 0 || g->err)
        return;
    if (eng_gptq_hess_add(g->h[slot], x, T)) {
        g->err = SVC_ERR_NOMEM;
        snprintf(g->why, sizeof g->why, "layer %zu: out of memory adding to a Hessian", g->li);
    }
}

static void qg_report(const qg_t *g) {
    char   line[400];
    size_t used = (size_t)snprintf(line, sizeof line, "layer %zu/%zu (%s): %llu tokens; GPTQ/RTN",
                                   g->li + 1, g->q->shell->cfg.n_layers,
                                   g->l.kind == ENG_LAYER_LINEAR ? "Gated DeltaNet" : "attention",
                                   (unsigned long long)eng_gptq_hess_rows(g->h[QG_IN]));
    for (int s = 0; s < QG_SLOTS && used < sizeof line; s++)
        used += (size_t)snprintf(line + used, sizeof line - used, " %s %.2f", SLOT_NAME[s],
                                 g->loss_r[s] > 0 ? g->loss_g[s] / g->loss_r[s] : 0.0);
    qz_log(g->q, "%s%s; %.1f s", line, g->kept ? " (RTN kept for some)" : "", qz_now() - g->t0);
}

/* Layer li has run: its tensors into the writer, then its weights freed. */
static void qg_drop(void *user, eng_layer_t *l) {
    qg_t     *g = user;
    char      prefix[64];
    pw_list_t sub = {0};
    snprintf(prefix, sizeof prefix, PW_TEXT_PREFIX "layers.%zu.", g->li);
    eng_ref_layer_free(l);
    if (g->err)
        return;
    svc_err_t err = qz_sublist(&g->q->text, prefix, true, &sub);
    if (!err) {
        pw_fill_t fill = {qz_fill, g->q};
        pw_ctx_t  pc = g->q->pc;
        pc.errstr = g->why;
        pc.errstr_size = sizeof g->why;
        err = pw_q4nx_add_list(&pc, g->w, &sub, &fill, false);
    }
    free(sub.v);
    if (err) {
        if (!g->why[0])
            snprintf(g->why, sizeof g->why, "layer %zu: %s", g->li, svc_err_name(err));
        g->err = err;
        return;
    }
    qg_report(g);
}

/* Layer li has run and been rounded: its tiles and output checkpointed. */
static svc_err_t qg_done(void *user, size_t li, const float *x, size_t rows, char *errstr,
                         size_t n) {
    qg_t *g = user;
    if (g->err) { /* its rounding failed */
        svc_errf(errstr, n, "%s", g->why);
        return g->err;
    }
    return qz_ckpt_layer(g->q, li, g->w, g->mark, x, rows, errstr, n);
}

/* The calibration prompts (opts: a file, or generated). */
static svc_err_t qg_calib(qz_t *q, eng_calib_t *c) {
    const eng_quant_opts_t *o = q->o;
    uint64_t                budget = o->calib_tokens ? o->calib_tokens : ENG_QUANT_TOKENS;
    svc_err_t               err =
        o->calib_file ? eng_calib_file(q->pkg, o->calib_file, budget, c, q->errstr, q->errstr_size)
                                    : eng_calib_generate(q->pkg, o->calib_seed,
                                           o->calib_prompts ? o->calib_prompts : ENG_QUANT_PROMPTS,
                                                         budget, c, q->errstr, q->errstr_size);
    if (!err && !c->n) {
        svc_errf(q->errstr, q->errstr_size, "no calibration prompt fits the budget of %llu tokens",
                 (unsigned long long)budget);
        err = SVC_ERR_INVALID;
    }
    if (!err)
        qz_log(q, "calibration: %zu prompts, %llu tokens (%zu question(s) left out)", c->n,
               (unsigned long long)c->tokens, c->skipped);
    q->calib_tokens = c->tokens;
    q->calib_prompts = c->n;
    return err;
}

/* The pass over every prompt at once, its layers rounded and
 * checkpointed as they go; a resumed run's from its first layer not done
 * (the ones before it put back into the writer). */
static svc_err_t qg_pass(qz_t *q, qg_t *g, const eng_calib_t *c) {
    size_t         H = q->shell->cfg.hidden;
    eng_fwd_seq_t *seqs = calloc(c->n, sizeof *seqs);
    float         *fin = malloc(c->n * H * sizeof *fin);
    svc_err_t      err = seqs && fin ? SVC_OK : SVC_ERR_NOMEM;
    for (size_t i = 0; !err && i < c->n; i++)
        seqs[i] = (eng_fwd_seq_t){NULL, c->seqs[i].v, c->seqs[i].n, fin + i * H};
    if (!err)
        err = qz_ckpt_restore(q, g->w, (size_t)c->tokens, &g->x0);
    eng_fwd_ref_t r = {.fetch = qg_fetch,
                       .drop = qg_drop,
                       .user = g,
                       .tap = qg_tap,
                       .tap_user = g,
                       .first = g->x0 ? qz_ckpt_done(q->ck) : 0,
                       .x0 = g->x0,
                       .done = qg_done};
    if (!err)
        err = eng_fwd_reference(q->shell, &r, seqs, c->n, NULL, eng_package_noncausal(q->pkg),
                                q->errstr, q->errstr_size);
    if (!err && g->err) { /* the last layer's drop */
        svc_errf(q->errstr, q->errstr_size, "%s", g->why);
        err = g->err;
    }
    free(seqs);
    free(fin);
    free(g->x0); /* not freed by a fetch: the pass failed first, or every layer was done */
    g->x0 = NULL;
    return err;
}

svc_err_t qz_gptq_text(qz_t *q, eng_q4nx_writer_t *w) {
    eng_calib_t c;
    eng_calib_init(&c);
    qg_t g = {.q = q,
              .w = w,
              .go = {q->o->damp > 0 ? q->o->damp : ENG_QUANT_DAMP, !q->o->no_act_order,
                     q->o->static_groups, q->o->plain_grids}};
    eng_q4nx_writer_set_encoder(w, qg_encode, &g);
    svc_err_t err = qg_calib(q, &c);
    if (!err)
        err = qz_ckpt_calib(q, &c);
    if (!err)
        err = qg_pass(q, &g, &c);
    eng_calib_fini(&c);
    pw_list_t rest = {0};
    if (!err) /* the embedding and the final norm */
        err = qz_sublist(&q->text, PW_TEXT_PREFIX "layers.", false, &rest);
    if (!err) {
        pw_fill_t fill = {qz_fill, q};
        err = pw_q4nx_add_list(&q->pc, w, &rest, &fill, false);
    }
    free(rest.v);
    eng_q4nx_writer_set_encoder(w, NULL, NULL);
    for (int s = 0; s < QG_SLOTS; s++)
        eng_gptq_hess_free(g.h[s]);
    return err;
}
