/*
 * eng_vision.c -- the Qwen3.5 vision tower: loading its tensors and the
 * forward pass over one image's patch rows (eng_vision_int.h), following
 * transformers' Qwen3_5VisionModel step by step:
 *
 *   x  = rows W_patch^T + b                 (the Conv3d, kernel = stride)
 *   x += sum_4 pos_embed[tap] * weight       (bilinear, align_corners, merge-block order)
 *   per block:  x += proj(attn(rope(qkv(LN1(x)))))   (bidirectional, within the image)
 *               x += fc2(gelu_tanh(fc1(LN2(x))))
 *   out = fc2(gelu_erf(fc1(view(LN(x), N/4, 4 hidden))))
 *
 * The resampling weights and rotary angles are computed as transformers
 * computes them, one fp32 operation at a time, so the position terms match
 * to the last bit or two. Rows are processed in chunks for the projections
 * and the MLP, so memory is a few (patches, hidden) arrays.
 */
#include "eng_vision_int.h"

#include "eng_image_int.h"
#include "eng_util_int.h"
#include "npu.h"

#include <math.h>

/* Rows per chunk of the QKV projection and the MLP. */
#define VIS_CHUNK 512

/* ---------------------------------------------------------------------
 * Loading
 * --------------------------------------------------------------------- */

static svc_err_t vl_proj(const eng_ld_t *ld, const char *name, size_t r, size_t c,
                         npu_wpack_t **dst) {
    uint64_t d[2] = {r, c};
    return eng_ld_pack(ld, name, 2, d, dst);
}

static svc_err_t vl_name(char *buf, size_t n, size_t i, const char *rest) {
    int k = snprintf(buf, n, "blocks.%zu.%s", i, rest);
    return (k < 0 || (size_t)k >= n) ? SVC_ERR_INTERNAL : SVC_OK;
}

static svc_err_t vl_bvec(const eng_ld_t *ld, size_t i, const char *rest, size_t n, float **dst) {
    char      s[160];
    svc_err_t err = vl_name(s, sizeof s, i, rest);
    return err ? err : eng_ld_vec(ld, s, n, dst);
}

static svc_err_t vl_bproj(const eng_ld_t *ld, size_t i, const char *rest, size_t r, size_t c,
                          npu_wpack_t **dst) {
    char      s[160];
    svc_err_t err = vl_name(s, sizeof s, i, rest);
    return err ? err : vl_proj(ld, s, r, c, dst);
}

svc_err_t eng_vision_load_block(const eng_ld_t *ld, const eng_vis_cfg_t *c, size_t i,
                                eng_vis_block_t *b) {
    size_t    H = c->hidden, I = c->inter;
    svc_err_t err;
    if ((err = vl_bvec(ld, i, "norm1.weight", H, &b->n1_w)) ||
        (err = vl_bvec(ld, i, "norm1.bias", H, &b->n1_b)) ||
        (err = vl_bvec(ld, i, "norm2.weight", H, &b->n2_w)) ||
        (err = vl_bvec(ld, i, "norm2.bias", H, &b->n2_b)) ||
        (err = vl_bproj(ld, i, "attn.qkv.weight", 3 * H, H, &b->qkv)) ||
        (err = vl_bvec(ld, i, "attn.qkv.bias", 3 * H, &b->qkv_b)) ||
        (err = vl_bproj(ld, i, "attn.proj.weight", H, H, &b->proj)) ||
        (err = vl_bvec(ld, i, "attn.proj.bias", H, &b->proj_b)) ||
        (err = vl_bproj(ld, i, "mlp.linear_fc1.weight", I, H, &b->fc1)) ||
        (err = vl_bvec(ld, i, "mlp.linear_fc1.bias", I, &b->fc1_b)) ||
        (err = vl_bproj(ld, i, "mlp.linear_fc2.weight", H, I, &b->fc2)))
        return err;
    return vl_bvec(ld, i, "mlp.linear_fc2.bias", H, &b->fc2_b);
}

/* patch_embed.proj.weight is the Conv3d kernel (hidden, in, t, p, p):
 * flattened, it is the matrix over the processor's (c, t, y, x) rows. */
static svc_err_t vl_patch(const eng_ld_t *ld, const eng_vis_cfg_t *c, eng_vision_t *v) {
    uint64_t  d[5] = {c->hidden, c->in_ch, c->temporal, c->patch, c->patch};
    svc_err_t err = eng_ld_pack(ld, "patch_embed.proj.weight", 5, d, &v->patch);
    return err ? err : eng_ld_vec(ld, "patch_embed.proj.bias", c->hidden, &v->patch_b);
}

svc_err_t eng_vision_load(const eng_ld_t *ld_in, const eng_vis_cfg_t *c, eng_vision_t **out) {
    *out = NULL;
    eng_vision_t *v = calloc(1, sizeof *v);
    if (!v)
        return SVC_ERR_NOMEM;
    v->cfg = *c;
    eng_ld_t ld = *ld_in;
    ld.numel = &v->n_params;
    size_t    H = c->hidden, M = H * c->merge * c->merge;
    svc_err_t err = SVC_OK;
    v->blocks = calloc(c->depth, sizeof *v->blocks);
    if (!v->blocks)
        err = SVC_ERR_NOMEM;
    if (!err)
        err = vl_patch(&ld, c, v);
    if (!err)
        err = eng_ld_mat(&ld, "pos_embed.weight", c->n_pos, H, &v->pos);
    for (size_t i = 0; !err && i < c->depth; i++)
        err = eng_vision_load_block(&ld, c, i, &v->blocks[i]);
    if (!err && !(err = eng_ld_vec(&ld, "merger.norm.weight", H, &v->mn_w)) &&
        !(err = eng_ld_vec(&ld, "merger.norm.bias", H, &v->mn_b)) &&
        !(err = vl_proj(&ld, "merger.linear_fc1.weight", M, M, &v->m_fc1)) &&
        !(err = eng_ld_vec(&ld, "merger.linear_fc1.bias", M, &v->m_fc1_b)) &&
        !(err = vl_proj(&ld, "merger.linear_fc2.weight", c->out_hidden, M, &v->m_fc2)))
        err = eng_ld_vec(&ld, "merger.linear_fc2.bias", c->out_hidden, &v->m_fc2_b);
    if (err) {
        eng_vision_free(v);
        return err;
    }
    *out = v;
    return SVC_OK;
}

void eng_vision_block_free(eng_vis_block_t *b) {
    float *all[] = {b->n1_w, b->n1_b, b->n2_w, b->n2_b, b->qkv_b, b->proj_b, b->fc1_b, b->fc2_b};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        free(all[k]);
    npu_wpack_free(b->qkv);
    npu_wpack_free(b->proj);
    npu_wpack_free(b->fc1);
    npu_wpack_free(b->fc2);
    memset(b, 0, sizeof *b);
}

void eng_vision_free(eng_vision_t *v) {
    if (!v)
        return;
    for (size_t i = 0; v->blocks && i < v->cfg.depth; i++)
        eng_vision_block_free(&v->blocks[i]);
    free(v->blocks);
    npu_wpack_free(v->patch);
    free(v->patch_b);
    free(v->pos);
    free(v->mn_w);
    free(v->mn_b);
    npu_wpack_free(v->m_fc1);
    free(v->m_fc1_b);
    npu_wpack_free(v->m_fc2);
    free(v->m_fc2_b);
    free(v->proc);
    free(v);
}

/* The processor must cut the patches the tower was built for. */
svc_err_t eng_vision_proc_attach(const char *dir, eng_vision_t *v, char *errstr,
                                 size_t errstr_size) {
    eng_vis_proc_t *p = calloc(1, sizeof *p);
    if (!p)
        return SVC_ERR_NOMEM;
    svc_err_t            err = eng_vis_proc_load(dir, p, NULL, errstr, errstr_size);
    const eng_vis_cfg_t *c = &v->cfg;
    if (!err && (p->patch != c->patch || p->temporal != c->temporal || p->merge != c->merge ||
                 c->in_ch != 3)) {
        svc_errf(errstr, errstr_size,
                 "preprocessor_config.json in \"%s\": patch_size %zu, temporal_patch_size %zu, "
                 "merge_size %zu do not match config.json vision_config (%zu, %zu, %zu, "
                 "in_channels %zu)",
                 dir, p->patch, p->temporal, p->merge, c->patch, c->temporal, c->merge, c->in_ch);
        err = SVC_ERR_FORMAT;
    }
    if (err) {
        free(p);
        return err;
    }
    v->proc = p;
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * Forward
 * --------------------------------------------------------------------- */

/* (row, col) of patch i of a gh x gw grid laid out by merge blocks
 * (get_vision_position_ids): blocks row-major, m x m patches in each. */
static void patch_rc(size_t i, size_t gw, size_t m, size_t *r, size_t *c) {
    size_t bw = gw / m;
    *r = (i / (m * m * bw)) * m + (i / m) % m;
    *c = ((i / (m * m)) % bw) * m + i % m;
}

/* _interpolation_axis_taps_weights, bilinear, align_corners: the source
 * coordinate index * (side - 1) / max(size - 1, 1) in fp32, its floor and
 * the next tap clamped to the table, weights 1 - |distance| clamped at 0. */
static void axis_taps(size_t index, size_t size, size_t side, size_t tap[2], float w[2]) {
    float den = (float)(size > 1 ? size - 1 : 1);
    float src = (float)index * (float)(side - 1) / den;
    float fl = floorf(src);
    long  f = (long)fl;
    for (int o = 0; o < 2; o++) {
        long t = f + o;
        t = t < 0 ? 0 : t > (long)side - 1 ? (long)side - 1 : t;
        tap[o] = (size_t)t;
        float d = fabsf(src - fl - (float)o);
        w[o] = 1.0f - d > 0.0f ? 1.0f - d : 0.0f;
    }
}

/* x (N, H) += the position table resampled to the grid. */
static void add_pos(const eng_vision_t *v, float *x, size_t gh, size_t gw) {
    const eng_vis_cfg_t *c = &v->cfg;
    size_t               H = c->hidden, N = gh * gw;
    for (size_t i = 0; i < N; i++) {
        size_t r, col, th[2], tw[2];
        float  wh[2], ww[2];
        patch_rc(i, gw, c->merge, &r, &col);
        axis_taps(r, gh, c->side, th, wh);
        axis_taps(col, gw, c->side, tw, ww);
        float *xr = x + i * H;
        for (size_t d = 0; d < H; d++) {
            float s = 0.0f;
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++)
                    s += v->pos[(th[a] * c->side + tw[b]) * H + d] * (wh[a] * ww[b]);
            xr[d] += s;
        }
    }
}

/* Qwen3_5VisionRotaryEmbedding: inv_freq over head_dim / 2 "spatial"
 * dims in steps of 2 (head_dim / 4 frequencies); per patch the angles are
 * [row * inv, col * inv] repeated twice over the head. */
static void rope_tables(const eng_vision_t *v, size_t gh, size_t gw, float *cos_t, float *sin_t) {
    const eng_vis_cfg_t *c = &v->cfg;
    size_t               D = c->head_dim, sp = D / 2, nf = D / 4;
    float                inv[ENG_VIS_MAX_HEAD_DIM / 4];
    SVC_ASSERT(nf <= ENG_VIS_MAX_HEAD_DIM / 4); /* eng_vis_cfg_load's bound */
    for (size_t j = 0; j < nf; j++)
        inv[j] = 1.0f / powf(c->theta, (float)(2 * j) / (float)sp);
    for (size_t i = 0; i < gh * gw; i++) {
        size_t r, col;
        patch_rc(i, gw, c->merge, &r, &col);
        float *cr = cos_t + i * D, *sr = sin_t + i * D;
        for (size_t j = 0; j < nf; j++) {
            float ah = (float)r * inv[j], aw = (float)col * inv[j];
            cr[j] = cr[j + sp] = cosf(ah);
            sr[j] = sr[j + sp] = sinf(ah);
            cr[nf + j] = cr[nf + j + sp] = cosf(aw);
            sr[nf + j] = sr[nf + j + sp] = sinf(aw);
        }
    }
}

typedef struct vfwd {
    const eng_vision_t *v;
    bool                fast; /* the fast profile: npu_matmul_packed_fast, bf16 attention */
    size_t              N;
    float              *x, *h, *q, *k, *a, *cos_t, *sin_t, *chunk, *chunk2, *vv;
} vfwd_t;

static void vfwd_free(vfwd_t *f) {
    float *all[] = {f->x, f->h, f->q, f->k, f->vv, f->a, f->cos_t, f->sin_t, f->chunk, f->chunk2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* A projection under the pass's profile (as the text tower's fwd_mm). */
static void vis_mm(const vfwd_t *f, const float *x, const npu_wpack_t *w, size_t n, float *out) {
    (f->fast ? npu_matmul_packed_fast : npu_matmul_packed)(x, w, n, out);
}

static svc_err_t vfwd_alloc(vfwd_t *f, const eng_vision_t *v, bool fast, size_t N) {
    const eng_vis_cfg_t *c = &v->cfg;
    size_t               H = c->hidden, C = N < VIS_CHUNK ? N : VIS_CHUNK,
           W = c->inter > 3 * H ? c->inter : 3 * H;
    memset(f, 0, sizeof *f);
    f->v = v;
    f->fast = fast;
    f->N = N;
    if (N > SIZE_MAX / sizeof(float) / (4 * H * c->merge * c->merge + c->head_dim))
        return SVC_ERR_NOMEM;
    f->x = malloc(N * H * sizeof *f->x);
    f->h = malloc(N * H * sizeof *f->h);
    f->q = malloc(N * H * sizeof *f->q);
    f->k = malloc(N * H * sizeof *f->k);
    f->vv = malloc(N * H * sizeof *f->vv);
    f->a = malloc(N * H * sizeof *f->a);
    f->cos_t = malloc(N * c->head_dim * sizeof *f->cos_t);
    f->sin_t = malloc(N * c->head_dim * sizeof *f->sin_t);
    f->chunk = malloc(C * W * sizeof *f->chunk);
    f->chunk2 = malloc(C * H * sizeof *f->chunk2);
    if (!f->x || !f->h || !f->q || !f->k || !f->vv || !f->a || !f->cos_t || !f->sin_t ||
        !f->chunk || !f->chunk2)
        return SVC_ERR_NOMEM;
    return SVC_OK;
}

/* One ViT block over the N rows of f->x. */
static svc_err_t vis_block(vfwd_t *f, const eng_vis_block_t *b) {
    const eng_vis_cfg_t *c = &f->v->cfg;
    size_t               H = c->hidden, N = f->N;
    npu_layernorm(f->x, b->n1_w, b->n1_b, N, H, c->eps, f->h);
    /* qkv (n, 3, heads, hd): columns [0, H) are q, [H, 2H) k, [2H, 3H) v */
    for (size_t t0 = 0; t0 < N; t0 += VIS_CHUNK) {
        size_t n = N - t0 < VIS_CHUNK ? N - t0 : VIS_CHUNK;
        vis_mm(f, f->h + t0 * H, b->qkv, n, f->chunk);
        npu_add_bias(f->chunk, b->qkv_b, n, 3 * H);
        for (size_t t = 0; t < n; t++) {
            const float *row = f->chunk + t * 3 * H;
            memcpy(f->q + (t0 + t) * H, row, H * sizeof *f->q);
            memcpy(f->k + (t0 + t) * H, row + H, H * sizeof *f->k);
            memcpy(f->vv + (t0 + t) * H, row + 2 * H, H * sizeof *f->vv);
        }
    }
    npu_rope_half(f->q, f->cos_t, f->sin_t, N, c->heads, c->head_dim);
    npu_rope_half(f->k, f->cos_t, f->sin_t, N, c->heads, c->head_dim);
    svc_err_t err = (f->fast ? npu_attention_fast : npu_attention)(
        f->q, f->k, f->vv, N, N, c->heads, c->heads, c->head_dim, false, NULL, f->a);
    if (err)
        return err;
    for (size_t t0 = 0; t0 < N; t0 += VIS_CHUNK) {
        size_t n = N - t0 < VIS_CHUNK ? N - t0 : VIS_CHUNK;
        vis_mm(f, f->a + t0 * H, b->proj, n, f->chunk2);
        npu_add_bias(f->chunk2, b->proj_b, n, H);
        float *xr = f->x + t0 * H;
        for (size_t i = 0; i < n * H; i++)
            xr[i] += f->chunk2[i];
    }
    npu_layernorm(f->x, b->n2_w, b->n2_b, N, H, c->eps, f->h);
    for (size_t t0 = 0; t0 < N; t0 += VIS_CHUNK) {
        size_t n = N - t0 < VIS_CHUNK ? N - t0 : VIS_CHUNK;
        vis_mm(f, f->h + t0 * H, b->fc1, n, f->chunk);
        npu_add_bias(f->chunk, b->fc1_b, n, c->inter);
        if (c->act_tanh)
            npu_gelu_tanh(f->chunk, n * c->inter);
        else
            npu_gelu_erf(f->chunk, n * c->inter);
        vis_mm(f, f->chunk, b->fc2, n, f->chunk2);
        npu_add_bias(f->chunk2, b->fc2_b, n, H);
        float *xr = f->x + t0 * H;
        for (size_t i = 0; i < n * H; i++)
            xr[i] += f->chunk2[i];
    }
    return SVC_OK;
}

/* Qwen3_5VisionPatchMerger: LayerNorm per patch, each run of merge^2
 * patches (one merge block) as one row of merge^2 * hidden, GELU-erf MLP. */
static svc_err_t vis_merge(vfwd_t *f, float *out) {
    const eng_vis_cfg_t *c = &f->v->cfg;
    size_t H = c->hidden, M = H * c->merge * c->merge, n = f->N / (c->merge * c->merge);
    npu_layernorm(f->x, f->v->mn_w, f->v->mn_b, f->N, H, c->eps, f->h);
    float *z = malloc(n * M * sizeof *z);
    if (!z)
        return SVC_ERR_NOMEM;
    vis_mm(f, f->h, f->v->m_fc1, n, z);
    npu_add_bias(z, f->v->m_fc1_b, n, M);
    npu_gelu_erf(z, n * M);
    vis_mm(f, z, f->v->m_fc2, n, out);
    npu_add_bias(out, f->v->m_fc2_b, n, c->out_hidden);
    free(z);
    return SVC_OK;
}

/* The grid check, then the patch rows' embedding with positions, and the
 * rotary tables, into f (allocated here; the caller frees it). */
static svc_err_t vis_start(vfwd_t *f, const eng_vision_t *v, bool fast, const float *rows,
                           size_t gh, size_t gw, char *errstr, size_t errstr_size) {
    const eng_vis_cfg_t *c = &v->cfg;
    if (!gh || !gw || gh % c->merge || gw % c->merge) {
        memset(f, 0, sizeof *f);
        svc_errf(errstr, errstr_size,
                 "vision tower: a %zu x %zu patch grid is not in %zu x %zu blocks", gh, gw,
                 c->merge, c->merge);
        return SVC_ERR_INVALID;
    }
    size_t    N = gh * gw, H = c->hidden;
    svc_err_t err = vfwd_alloc(f, v, fast, N);
    if (err)
        return err;
    for (size_t t0 = 0; t0 < N; t0 += VIS_CHUNK) {
        size_t n = N - t0 < VIS_CHUNK ? N - t0 : VIS_CHUNK;
        vis_mm(f, rows + t0 * eng_vis_patch_elems(c), v->patch, n, f->x + t0 * H);
    }
    npu_add_bias(f->x, v->patch_b, N, H);
    add_pos(v, f->x, gh, gw);
    rope_tables(v, gh, gw, f->cos_t, f->sin_t);
    return SVC_OK;
}

static void vis_nomem(svc_err_t err, size_t gh, size_t gw, char *errstr, size_t errstr_size) {
    if (err == SVC_ERR_NOMEM)
        svc_errf(errstr, errstr_size, "out of memory for the vision tower over %zu x %zu patches",
                 gh, gw);
    else if (err && errstr_size && !errstr[0])
        svc_errf(errstr, errstr_size, "vision tower: %s", svc_err_name(err));
}

svc_err_t eng_vision_forward(const eng_vision_t *v, bool fast, const float *rows, size_t gh,
                             size_t gw, float *out, char *errstr, size_t errstr_size) {
    vfwd_t    f;
    svc_err_t err = vis_start(&f, v, fast, rows, gh, gw, errstr, errstr_size);
    for (size_t i = 0; !err && i < v->cfg.depth; i++)
        err = vis_block(&f, &v->blocks[i]);
    if (!err)
        err = vis_merge(&f, out);
    vfwd_free(&f);
    vis_nomem(err, gh, gw, errstr, errstr_size);
    return err;
}

/* Block b of the pass from the reference block rb, then the serving
 * block under exact and (fast) fast on the same input; f->x leaves with
 * the reference's output. */
static svc_err_t vref_block(vfwd_t *f, const eng_vis_block_t *rb, size_t b, const eng_vis_ref_t *r,
                            float *x_in, float *x_ref) {
    size_t n = f->N * f->v->cfg.hidden;
    memcpy(x_in, f->x, n * sizeof *x_in);
    f->fast = false;
    svc_err_t      err = vis_block(f, rb);
    double *const *num = r->num, *const *den = r->den;
    if (!err)
        memcpy(x_ref, f->x, n * sizeof *x_ref);
    for (size_t a = r->no_exact ? 1 : 0; !err && a < (r->fast ? 2u : 1u); a++) {
        memcpy(f->x, x_in, n * sizeof *f->x);
        f->fast = a == 1;
        err = vis_block(f, &f->v->blocks[b]);
        if (!err)
            eng_step_error_add(f->x, x_ref, x_in, n, &num[a][b], &den[a][b]);
    }
    memcpy(f->x, x_ref, n * sizeof *f->x);
    f->fast = false;
    return err;
}

svc_err_t eng_vision_reference(const eng_vision_t *v, const eng_vis_ref_t *r, const float *rows,
                               size_t gh, size_t gw, char *errstr, size_t errstr_size) {
    vfwd_t    f;
    svc_err_t err = vis_start(&f, v, false, rows, gh, gw, errstr, errstr_size);
    size_t    n = gh * gw * v->cfg.hidden;
    float    *x_in = err ? NULL : malloc(n * sizeof *x_in),
          *x_ref = err ? NULL : malloc(n * sizeof *x_ref);
    if (!err && (!x_in || !x_ref))
        err = SVC_ERR_NOMEM;
    for (size_t b = 0; !err && b < v->cfg.depth; b++) {
        eng_vis_block_t rb = {0};
        if ((err = r->fetch(r->user, b, &rb, errstr, errstr_size)))
            break;
        err = vref_block(&f, &rb, b, r, x_in, x_ref);
        r->drop(r->user, &rb);
    }
    vfwd_free(&f);
    free(x_in);
    free(x_ref);
    vis_nomem(err, gh, gw, errstr, errstr_size);
    return err;
}

/* eng_vision_block_errors' reference blocks: the tower's own, shared. */
static svc_err_t own_block(void *user, size_t i, eng_vis_block_t *b, char *errstr,
                           size_t errstr_size) {
    (void)errstr, (void)errstr_size;
    *b = ((const eng_vision_t *)user)->blocks[i];
    return SVC_OK;
}

static void own_block_keep(void *user, eng_vis_block_t *b) {
    (void)user, (void)b;
}

svc_err_t eng_vision_block_errors(const eng_vision_t *v, const float *rows, size_t gh, size_t gw,
                                  double *num, double *den, char *errstr, size_t errstr_size) {
    eng_vis_ref_t r = {.fetch = own_block,
                       .drop = own_block_keep,
                       .user = (void *)v,
                       .fast = true,
                       .no_exact = true,
                       .num = {NULL, num},
                       .den = {NULL, den}};
    return eng_vision_reference(v, &r, rows, gh, gw, errstr, errstr_size);
}
