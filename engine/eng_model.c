/*
 * eng_model.c -- loads the Qwen3.5 text tower of a package (SPEC e.1,
 * e.6): config.json (eng_model_cfg.c), the weights from model.safetensors
 * or its shards (eng_st_set.c) or, for a FastFlowLM package, model.q4nx
 * (Q4NX.md), and the code readout (readout.safetensors, SPEC d.5); checks
 * the manifest's parameter counts (SPEC e.3); and computes the readout
 * probabilities (SPEC d.5-d.7, b.2).
 *
 * Weights are checked against the config (presence, dtype, shape) and
 * converted to fp32 once here ("repack at load"), so the forward pass never
 * looks at a file and the mappings are closed before eng_model_load
 * returns. Messages name the file and the key or tensor at fault.
 *
 * Both weight files go through one table of tensors and shapes (ld_tower
 * and below); only ld_take differs: a safetensors tensor is converted
 * as stored, a q4nx one is dequantised by eng_q4nx_tensor_f32 (or, for a
 * projection in Q4/Q8 tiles, read as its group codes for the kernel that
 * multiplies them: ld_pack_groups), which also
 * undoes the converter's transforms (norm + 1, -exp(A_log), conv1d
 * transpose, q_proj regroup) and follows the tied embedding to the Q8
 * lm_head, so both paths fill the same HF-convention fp32 arrays.
 */
#include "eng_model_int.h"
#include "eng_q4nx_int.h"
#include "eng_vision_int.h"
#include "eng_st_int.h"
#include "eng_util_int.h"

#include <jansson.h>
#include <math.h>

/* SPEC e.1: the upstream weights, one file or an index and its shards. */
#define ST_SINGLE "model.safetensors"
#define ST_INDEX  "model.safetensors.index.json"

/* ---------------------------------------------------------------------
 * model.safetensors / model.q4nx / readout.safetensors
 * --------------------------------------------------------------------- */

SVC_FMT(5, 6)
svc_err_t eng_ld_fail_in(const eng_ld_t *ld, const char *file, const char *path, svc_err_t err,
                         const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(ld->errstr, ld->errstr_size, "%s \"%s\": %s", file, path, msg);
    return err;
}

static uint64_t dims_numel(size_t rank, const uint64_t *dims) {
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

/* q4nx: the reader checks presence, storage kind and the (padded) tile grid
 * against dims, and its one-line message names the file, the stored and the
 * HF tensor and the expected shape. */
static svc_err_t ld_take_q4nx(const eng_ld_t *ld, const char *name, size_t rank,
                              const uint64_t *dims, float *w) {
    svc_err_t err = eng_q4nx_tensor_f32(ld->q, name, rank, dims, w, ld->errstr, ld->errstr_size);
    if (err)
        return err == SVC_ERR_INVALID ? SVC_ERR_FORMAT : err;
    if (ld->numel)
        *ld->numel += dims_numel(rank, dims);
    return SVC_OK;
}

static void shape_str(char *buf, size_t n, size_t rank, const uint64_t *dims) {
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (size_t i = 0; i < rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)dims[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

svc_err_t eng_ld_take_into(const eng_ld_t *ld, const char *suffix, size_t rank,
                           const uint64_t *dims, float *w) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", ld->prefix, suffix);
    if (ld->q)
        return ld_take_q4nx(ld, name, rank, dims, w);
    /* A bad tensor is reported against the file that holds it (a shard). */
    const eng_st_tensor_t *t;
    const char            *file, *path;
    svc_err_t err = eng_st_set_find(ld->set, name, &t, &file, &path, ld->errstr, ld->errstr_size);
    if (err)
        return err;
    if (t->dtype != ENG_DT_BF16 && t->dtype != ENG_DT_F16 && t->dtype != ENG_DT_F32)
        return eng_ld_fail_in(ld, file, path, SVC_ERR_UNSUPPORTED,
                              "tensor \"%s\": dtype %s, expected BF16, F16 or F32", name,
                              eng_dtype_name(t->dtype));
    bool same = t->rank == rank;
    for (size_t i = 0; same && i < rank; i++)
        same = t->shape[i] == dims[i];
    if (!same) {
        char got[128], want[128];
        shape_str(got, sizeof got, t->rank, t->shape);
        shape_str(want, sizeof want, rank, dims);
        return eng_ld_fail_in(ld, file, path, SVC_ERR_FORMAT,
                              "tensor \"%s\": shape %s, expected %s", name, got, want);
    }
    err = eng_st_to_f32(t, w);
    SVC_ASSERT(err == SVC_OK); /* dtype checked above */
    if (ld->numel)
        *ld->numel += eng_st_numel(t);
    return SVC_OK;
}

/* Finds prefix+suffix, checks dtype and shape, and converts it to a new
 * fp32 array in *dst (owned by the caller). dims has rank entries. */
svc_err_t eng_ld_take(const eng_ld_t *ld, const char *suffix, size_t rank, const uint64_t *dims,
                      float **dst) {
    uint64_t n = dims_numel(rank, dims);
    float   *w = n <= SIZE_MAX / sizeof *w ? malloc((size_t)(n ? n : 1) * sizeof *w) : NULL;
    if (!w)
        return eng_ld_fail(ld, SVC_ERR_NOMEM, "out of memory for tensor \"%s%s\"", ld->prefix,
                           suffix);
    svc_err_t err = eng_ld_take_into(ld, suffix, rank, dims, w);
    if (err) {
        free(w);
        return err;
    }
    *dst = w;
    return SVC_OK;
}

/* Shorthands: a vector (n), a matrix (r, c). */
svc_err_t eng_ld_vec(const eng_ld_t *ld, const char *suffix, size_t n, float **dst) {
    uint64_t d[1] = {n};
    return eng_ld_take(ld, suffix, 1, d, dst);
}

svc_err_t eng_ld_mat(const eng_ld_t *ld, const char *suffix, size_t r, size_t c, float **dst) {
    uint64_t d[2] = {r, c};
    return eng_ld_take(ld, suffix, 2, d, dst);
}

static svc_err_t ld_layer_name(char *buf, size_t n, size_t i, const char *rest) {
    int k = snprintf(buf, n, "layers.%zu.%s", i, rest);
    return (k < 0 || (size_t)k >= n) ? SVC_ERR_INTERNAL : SVC_OK;
}

/* One layer's tensor: "layers.<i>.<rest>". */
static svc_err_t ld_lvec(const eng_ld_t *ld, size_t i, const char *rest, size_t n, float **dst) {
    char      s[200];
    svc_err_t err = ld_layer_name(s, sizeof s, i, rest);
    return err ? err : eng_ld_vec(ld, s, n, dst);
}

/* Whether every value of w (n) is a bf16 (its low 16 bits zero): such a
 * weight is exact on the bf16 tiles. */
static bool bf16_exact(const float *w, size_t n) {
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], sizeof u);
        any |= u & 0xffffu;
    }
    return any == 0;
}

/* A q4nx matrix stored in Q4/Q8 tiles, packed on its group codes
 * (npu_wpack_new_groups: the codes stay where the kernel can use them,
 * and are dequantised to the same values as eng_ld_take's where not).
 * SVC_ERR_UNSUPPORTED: not stored in tiles, nothing done. */
static svc_err_t ld_pack_groups(const eng_ld_t *ld, const char *name, const uint64_t *dims,
                                npu_wpack_t **dst) {
    uint8_t  *u;
    float    *d, *m;
    svc_err_t err =
        eng_q4nx_tensor_groups(ld->q, name, dims, &u, &d, &m, ld->errstr, ld->errstr_size);
    if (err)
        return err == SVC_ERR_INVALID ? SVC_ERR_FORMAT : err;
    err = npu_wpack_new_groups(u, d, m, (size_t)dims[0], (size_t)dims[1], dst);
    if (err) {
        free(u), free(d), free(m);
        return eng_ld_fail(ld, err, "out of memory packing tensor \"%s\"", name);
    }
    if (ld->numel)
        *ld->numel += dims[0] * dims[1];
    return SVC_OK;
}

svc_err_t eng_ld_pack(const eng_ld_t *ld, const char *suffix, size_t rank, const uint64_t *dims,
                      npu_wpack_t **dst) {
    if (ld->q && !ld->fp32 && rank == 2 && dims[0] && dims[1]) {
        char name[256];
        snprintf(name, sizeof name, "%s%s", ld->prefix, suffix);
        svc_err_t err = ld_pack_groups(ld, name, dims, dst);
        if (err != SVC_ERR_UNSUPPORTED)
            return err;
    }
    float    *w = NULL;
    svc_err_t err = eng_ld_take(ld, suffix, rank, dims, &w);
    if (err)
        return err;
    uint64_t k = 1;
    for (size_t i = 1; i < rank; i++)
        k *= dims[i];
    /* A weight bf16 cannot hold -- the package stored it in 4- or 8-bit
     * groups, or as F32 or F16 values with more than bf16's 8 bits -- goes
     * to the int8 tiles where there are some (npu_wpack_new_quantised:
     * why); a bf16 one stays exact on the bf16 tiles. Decided by the
     * values, so a q4nx package and its F32 twin (the same dequantised
     * values) get the same packs. */
    err = (ld->fp32 ? npu_wpack_new_fp32
           : bf16_exact(w, (size_t)dims[0] * (size_t)k)
               ? npu_wpack_new
               : npu_wpack_new_quantised)(w, (size_t)dims[0], (size_t)k, dst);
    if (err) {
        free(w);
        return eng_ld_fail(ld, err, "out of memory packing tensor \"%s%s\"", ld->prefix, suffix);
    }
    return SVC_OK;
}

/* A projection "layers.<i>.<rest>" (r, c), packed (eng_ld_pack). */
static svc_err_t ld_lproj(const eng_ld_t *ld, size_t i, const char *rest, size_t r, size_t c,
                          npu_wpack_t **dst) {
    char      s[200];
    uint64_t  d[2] = {r, c};
    svc_err_t err = ld_layer_name(s, sizeof s, i, rest);
    return err ? err : eng_ld_pack(ld, s, 2, d, dst);
}

static svc_err_t ld_linear(const eng_ld_t *ld, const eng_model_cfg_t *c, size_t i, eng_layer_t *l) {
    size_t    H = c->hidden, kd = eng_lin_key_dim(c), vd = eng_lin_value_dim(c);
    size_t    C = eng_lin_conv_dim(c);
    char      s[200];
    uint64_t  conv[3] = {C, 1, c->conv_k};
    svc_err_t err;
    if ((err = ld_lproj(ld, i, "linear_attn.in_proj_qkv.weight", 2 * kd + vd, H, &l->in_qkv)) ||
        (err = ld_lproj(ld, i, "linear_attn.in_proj_z.weight", vd, H, &l->in_z)) ||
        (err = ld_lproj(ld, i, "linear_attn.in_proj_b.weight", c->lin_nv, H, &l->in_b)) ||
        (err = ld_lproj(ld, i, "linear_attn.in_proj_a.weight", c->lin_nv, H, &l->in_a)) ||
        (err = ld_lvec(ld, i, "linear_attn.dt_bias", c->lin_nv, &l->dt_bias)) ||
        (err = ld_lvec(ld, i, "linear_attn.A_log", c->lin_nv, &l->a_log)) ||
        (err = ld_lvec(ld, i, "linear_attn.norm.weight", c->lin_dv, &l->lin_norm)) ||
        (err = ld_lproj(ld, i, "linear_attn.out_proj.weight", H, vd, &l->out_proj)) ||
        (err = ld_layer_name(s, sizeof s, i, "linear_attn.conv1d.weight")))
        return err;
    return eng_ld_take(ld, s, 3, conv, &l->conv);
}

static svc_err_t ld_full(const eng_ld_t *ld, const eng_model_cfg_t *c, size_t i, eng_layer_t *l) {
    size_t    H = c->hidden, hd = c->head_dim, kvd = c->n_kv * hd;
    svc_err_t err;
    if ((err = ld_lproj(ld, i, "self_attn.q_proj.weight", eng_q_rows(c), H, &l->q_proj)) ||
        (err = ld_lproj(ld, i, "self_attn.k_proj.weight", kvd, H, &l->k_proj)) ||
        (err = ld_lproj(ld, i, "self_attn.v_proj.weight", kvd, H, &l->v_proj)) ||
        (err = ld_lproj(ld, i, "self_attn.o_proj.weight", H, c->n_heads * hd, &l->o_proj)) ||
        (err = ld_lvec(ld, i, "self_attn.q_norm.weight", hd, &l->q_norm)) ||
        (err = ld_lvec(ld, i, "self_attn.k_norm.weight", hd, &l->k_norm)))
        return err;
    return SVC_OK;
}

static svc_err_t ld_layer(const eng_ld_t *ld, const eng_model_cfg_t *c, size_t i, eng_layer_t *l) {
    size_t    H = c->hidden, I = c->inter;
    svc_err_t err;
    l->kind = c->kinds[i];
    if ((err = ld_lvec(ld, i, "input_layernorm.weight", H, &l->in_norm)) ||
        (err = ld_lvec(ld, i, "post_attention_layernorm.weight", H, &l->post_norm)) ||
        (err = ld_lproj(ld, i, "mlp.gate_proj.weight", I, H, &l->mlp_gate)) ||
        (err = ld_lproj(ld, i, "mlp.up_proj.weight", I, H, &l->mlp_up)) ||
        (err = ld_lproj(ld, i, "mlp.down_proj.weight", H, I, &l->mlp_down)))
        return err;
    return l->kind == ENG_LAYER_LINEAR ? ld_linear(ld, c, i, l) : ld_full(ld, c, i, l);
}

static bool starts_with(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

/* SPEC e.6: one text prefix, at most one vision prefix (returned in
 * *vprefix, NULL when there are no vision tensors), every tensor in a
 * known module. */
static svc_err_t ld_prefix(eng_ld_t *ld, const char **vprefix) {
    static const char *const text[] = {"model.language_model.", "language_model."};
    static const char *const vision[] = {"model.visual.", "visual."};
    const char              *found = NULL;
    *vprefix = NULL;
    for (size_t i = 0; i < eng_st_set_count(ld->set); i++) {
        const char *name = eng_st_set_at(ld->set, i)->name;
        const char *p = starts_with(name, text[0])   ? text[0]
                        : starts_with(name, text[1]) ? text[1]
                                                     : NULL;
        const char *vp = starts_with(name, vision[0])   ? vision[0]
                         : starts_with(name, vision[1]) ? vision[1]
                                                        : NULL;
        if (!p && vp && *vprefix && *vprefix != vp)
            return eng_ld_fail(ld, SVC_ERR_FORMAT, "tensors use both vision prefixes '%s' and '%s'",
                               *vprefix, vp);
        if (!p && vp) {
            *vprefix = vp;
            continue;
        }
        if (!p)
            return eng_ld_fail(ld, SVC_ERR_FORMAT,
                               "checkpoint tensor '%s' belongs to no known module", name);
        if (found && found != p)
            return eng_ld_fail(ld, SVC_ERR_FORMAT, "tensors use both text prefixes '%s' and '%s'",
                               found, p);
        found = p;
    }
    if (!found)
        return eng_ld_fail(ld, SVC_ERR_FORMAT, "no text tower tensors (prefix '%s' or '%s')",
                           text[0], text[1]);
    ld->prefix = found;
    return SVC_OK;
}

/* Whether w (32 values) is exactly q[i] * s for int8 codes q (the product
 * the lookup computes); fills q. */
static bool block_is(const float *w, float s, int8_t *q) {
    for (int i = 0; i < 32; i++) {
        float c = s > 0.0f ? nearbyintf(w[i] / s) : 0.0f;
        if (!(fabsf(c) <= 127.0f) || c * s != w[i] || signbit(c * s) != signbit(w[i]))
            return false;
        q[i] = (int8_t)c;
    }
    return true;
}

/* A block of 32 values of w as int8 codes q and a scale s with q[i] * s ==
 * w[i] exactly: a Q8 block dequantised as d * c comes back as its own
 * codes and d. Its largest code is 127 or, with d rounded up to bf16 as
 * Q4NX.md §4.3 writes it, a little less: s = max |w| / cmax for cmax from
 * 127 down, the first that fits (mx = cmax d exactly, so mx / cmax = d).
 * False when none does. */
static bool block_q8(const float *w, int8_t *q, float *s) {
    float mx = 0.0f;
    for (int i = 0; i < 32; i++)
        mx = fmaxf(mx, fabsf(w[i]));
    for (int cmax = 127; cmax >= (mx > 0.0f ? 96 : 127); cmax--) {
        *s = mx / (float)cmax;
        if (block_is(w, *s, q))
            return true;
    }
    return false;
}

/* The embedding as int8 codes and a scale per 32 when every block is
 * exactly that (a Q8 package: 0.56 GB instead of 2 for nano, the same
 * rows); true when it took. */
static bool embed_q8(eng_model_t *m) {
    size_t n = m->cfg.vocab * m->cfg.hidden;
    if (m->cfg.hidden % 32 || n == 0)
        return false;
    int8_t *q = malloc(n);
    float  *s = malloc(n / 32 * sizeof *s);
    bool    ok = q && s;
    for (size_t b = 0; ok && b < n / 32; b++)
        ok = block_q8(m->embed + 32 * b, q + 32 * b, s + b);
    if (!ok) {
        free(q), free(s);
        return false;
    }
    free(m->embed);
    m->embed = NULL;
    m->embed8 = q;
    m->embed8_s = s;
    return true;
}

/* The embedding as bf16 when every value is one exactly (a BF16 package:
 * 1 GB instead of 2 for nano, and the same rows), else as int8 codes when
 * it is a Q8 one (embed_q8); else it stays fp32 (F32 sources). Narrowing
 * is no error when memory for it is short: the fp32 copy stays. */
static svc_err_t embed_narrow(eng_model_t *m) {
    size_t n = m->cfg.vocab * m->cfg.hidden;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &m->embed[i], sizeof u);
        if (u & 0xffffu) {
            embed_q8(m);
            return SVC_OK;
        }
    }
    uint16_t *e = malloc((n ? n : 1) * sizeof *e);
    if (!e)
        return SVC_OK; /* keeping the fp32 copy is no error */
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &m->embed[i], sizeof u);
        e[i] = (uint16_t)(u >> 16);
    }
    free(m->embed);
    m->embed = NULL;
    m->embed16 = e;
    return SVC_OK;
}

void eng_model_embed_row(const eng_model_t *m, int32_t id, float *out) {
    size_t H = m->cfg.hidden;
    if (m->embed16) {
        const uint16_t *r = m->embed16 + (size_t)id * H;
        for (size_t i = 0; i < H; i++) {
            uint32_t u = (uint32_t)r[i] << 16;
            memcpy(&out[i], &u, sizeof u);
        }
    } else if (m->embed8) {
        const int8_t *r = m->embed8 + (size_t)id * H;
        const float  *s = m->embed8_s + (size_t)id * (H / 32);
        for (size_t i = 0; i < H; i++)
            out[i] = (float)r[i] * s[i / 32];
    } else
        memcpy(out, m->embed + (size_t)id * H, H * sizeof *out);
}

/* A q4nx package's embedding (the Q8 lm_head it is tied to, §8) taken
 * from its group codes: Q8's groups are symmetric (u = c + 128, m = -128 d),
 * so embed8's code is c and its scale d -- the products the fp32 decode
 * gives, without that decode's 2 GB of fp32 values (for nano) and
 * embed_q8's search for the codes again. SVC_ERR_UNSUPPORTED: not tiles,
 * or not symmetric (Q4 groups), or H not a multiple of 32; the values
 * path then. */
static svc_err_t embed_from_groups(const eng_ld_t *ld, eng_model_t *m) {
    size_t V = m->cfg.vocab, H = m->cfg.hidden, G = H / 32;
    if (!ld->q || H % 32 || V == 0)
        return SVC_ERR_UNSUPPORTED;
    char     name[256];
    uint64_t dims[2] = {V, H};
    uint8_t *u;
    float   *d, *mn;
    snprintf(name, sizeof name, "%sembed_tokens.weight", ld->prefix);
    svc_err_t err =
        eng_q4nx_tensor_groups(ld->q, name, dims, &u, &d, &mn, ld->errstr, ld->errstr_size);
    if (err)
        return err == SVC_ERR_INVALID ? SVC_ERR_FORMAT : err;
    bool sym = true;
    for (size_t g = 0; sym && g < V * G; g++)
        sym = mn[g] == -128.0f * d[g];
    free(mn);
    if (!sym) {
        free(u), free(d);
        return SVC_ERR_UNSUPPORTED;
    }
    int8_t *q = (int8_t *)u; /* c = u - 128, in place */
    for (size_t i = 0; i < V * H; i++)
        q[i] = (int8_t)(u[i] ^ 0x80u);
    m->embed8 = q;
    m->embed8_s = d;
    if (ld->numel)
        *ld->numel += (uint64_t)V * H;
    return SVC_OK;
}

/* The embedding: from the q4nx codes where it can (embed_from_groups),
 * else the values, narrowed (embed_narrow). */
static svc_err_t ld_embed(const eng_ld_t *ld, eng_model_t *m) {
    svc_err_t err = embed_from_groups(ld, m);
    if (err != SVC_ERR_UNSUPPORTED)
        return err;
    err = eng_ld_mat(ld, "embed_tokens.weight", m->cfg.vocab, m->cfg.hidden, &m->embed);
    return err ? err : embed_narrow(m);
}

/* The text tower's tensors, in both files' HF names. */
static svc_err_t ld_tower(const eng_ld_t *ld, eng_model_t *m) {
    const eng_model_cfg_t *c = &m->cfg;
    m->layers = calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return SVC_ERR_NOMEM;
    svc_err_t err = ld_embed(ld, m);
    for (size_t i = 0; !err && i < c->n_layers; i++)
        err = ld_layer(ld, c, i, &m->layers[i]);
    if (!err)
        err = eng_ld_vec(ld, "norm.weight", c->hidden, &m->final_norm);
    return err;
}

/* The vision tower (SPEC e.7): used only when the package has vision
 * tensors, a vision_config and preprocessor_config.json; otherwise the
 * model reads no images (and says so to requests that send some). */
static svc_err_t load_vision(const char *dir, const eng_ld_t *ld, eng_model_t *m) {
    eng_vis_cfg_t vc;
    bool          present = false;
    if (!eng_dir_has_file(dir, "preprocessor_config.json"))
        return SVC_OK;
    svc_err_t err =
        eng_vis_cfg_load(dir, m->cfg.hidden, &vc, &present, ld->errstr, ld->errstr_size);
    if (err || !present)
        return err;
    err = eng_vision_load(ld, &vc, &m->vision);
    if (!err)
        err = eng_vision_proc_attach(dir, m->vision, ld->errstr, ld->errstr_size);
    return err;
}

/* model.safetensors, or the shards of model.safetensors.index.json: the
 * same loader either way, only the lookup of a name differs (eng_st_set.c). */
static svc_err_t load_weights(const char *dir, bool sharded, eng_model_t *m, char *errstr,
                              size_t n) {
    eng_ld_t    ld = {NULL, NULL, NULL, NULL, "", errstr, n, &m->n_params, false};
    svc_err_t   err = sharded ? eng_st_set_open_index(dir, ST_INDEX, &ld.set, errstr, n)
                              : eng_st_set_open_file(dir, ST_SINGLE, &ld.set, errstr, n);
    const char *vprefix = NULL;
    if (!err) {
        ld.file = eng_st_set_file(ld.set);
        ld.path = eng_st_set_path(ld.set);
        err = ld_prefix(&ld, &vprefix);
    }
    if (!err)
        err = ld_tower(&ld, m);
    if (!err && vprefix) {
        ld.prefix = vprefix;
        err = load_vision(dir, &ld, m);
    }
    eng_st_set_close(ld.set);
    return err;
}

/* FastFlowLM's vision tower: config.json `vision_model_weight` names the
 * file (Q4NX.md §6; "vision_weight.q4nx"), its vision_config the tile
 * sizes of §5. A package without the key, the file or
 * preprocessor_config.json reads no images. */
/* Opens the file config.json's vision_model_weight names, its tiles set
 * from vision_config: *q and *file (both NULL when the package has no
 * such tower), owned by the caller (eng_q4nx_close, free). */
static svc_err_t q4nx_vision_open(const char *dir, eng_q4nx_t **q, char **file, char *errstr,
                                  size_t n) {
    *q = NULL;
    *file = NULL;
    char *cfg = eng_path_join(dir, "config.json");
    if (!cfg)
        return SVC_ERR_NOMEM;
    json_t       *root = json_load_file(cfg, 0, NULL);
    const json_t *vw = json_object_get(root, "vision_model_weight");
    const char   *name = json_is_string(vw) ? json_string_value(vw) : NULL;
    svc_err_t     err = SVC_OK;
    if (vw && !json_is_string(vw)) {
        svc_errf(errstr, n, "config.json \"%s\": vision_model_weight must be a file name", cfg);
        err = SVC_ERR_FORMAT;
    }
    if (!err && name && (strchr(name, '/') || strcmp(name, "..") == 0)) {
        svc_errf(errstr, n,
                 "config.json \"%s\": vision_model_weight \"%s\" is not a file name in the "
                 "package",
                 cfg, name);
        err = SVC_ERR_FORMAT;
    }
    /* "" means no vision tower (LM_Config: non-empty means a VLM) */
    if (!err && name && name[0] && eng_dir_has_file(dir, name)) {
        char  *path = eng_path_join(dir, name);
        size_t mm_n = 0, mm_k = 0;
        *file = strdup(name);
        err = path && *file ? eng_q4nx_open(path, q, errstr, n) : SVC_ERR_NOMEM;
        if (!err)
            err = eng_q4nx_vision_tiles_from_config(json_object_get(root, "vision_config"), &mm_n,
                                                    &mm_k, errstr, n);
        if (!err)
            err = eng_q4nx_set_vision_tiles(*q, mm_n, mm_k, errstr, n);
        free(path);
    }
    if (err) {
        eng_q4nx_close(*q);
        free(*file);
        *q = NULL;
        *file = NULL;
    }
    json_decref(root);
    free(cfg);
    return err == SVC_ERR_INVALID ? SVC_ERR_FORMAT : err;
}

/* FastFlowLM's vision tower: config.json `vision_model_weight` names the
 * file (Q4NX.md §6; "vision_weight.q4nx"), its vision_config the tile
 * sizes of §5. A package without the key, the file or
 * preprocessor_config.json reads no images. */
static svc_err_t load_q4nx_vision(const char *dir, eng_model_t *m, char *errstr, size_t n) {
    eng_q4nx_t *q = NULL;
    char       *file = NULL;
    svc_err_t   err = q4nx_vision_open(dir, &q, &file, errstr, n);
    char       *path = q ? eng_path_join(dir, file) : NULL;
    if (!err && q && !path)
        err = SVC_ERR_NOMEM;
    if (!err && q) {
        eng_ld_t ld = {NULL, q, file, path, ENG_Q4NX_VISION_PREFIX, errstr, n, NULL, false};
        err = load_vision(dir, &ld, m);
        if (err == SVC_ERR_INVALID)
            err = SVC_ERR_FORMAT;
    }
    eng_q4nx_close(q);
    free(file);
    free(path);
    return err;
}

/* model.q4nx: config.json after the file is open, since FastFlowLM's may
 * leave the layer kinds to the tensors (eng_model_cfg.c). */
static svc_err_t load_q4nx(const char *dir, const eng_q4nx_layout_t *lay, eng_model_t *m,
                           char *errstr, size_t n) {
    char *path = eng_path_join(dir, "model.q4nx");
    if (!path)
        return SVC_ERR_NOMEM;
    eng_q4nx_t *q = NULL;
    svc_err_t   err = eng_q4nx_open_with(path, lay, &q, errstr, n);
    if (!err)
        err = eng_model_cfg_load(dir, q, &m->cfg, errstr, n);
    if (!err) {
        m->format =
            eng_q4nx_generation(q) == ENG_Q4NX_GEN_A ? ENG_MODEL_Q4NX_GEN_A : ENG_MODEL_Q4NX_GEN_B;
        eng_ld_t ld = {NULL,   q, "model.q4nx", path, "model.language_model.",
                       errstr, n, &m->n_params, false};
        err = ld_tower(&ld, m);
    }
    eng_q4nx_close(q);
    free(path);
    if (!err)
        err = load_q4nx_vision(dir, m, errstr, n);
    return err;
}

/* Whether decision_config.json loads the readout as bfloat16 (SPEC d.5).
 * eng_package_open refuses any value but float32 and bfloat16, and the
 * file's absence; the model, loadable without the package, reads only
 * this one key, and anything else is the float32 default. */
static bool readout_is_bf16(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/decision_config.json", dir) >= (int)sizeof path)
        return false;
    json_t     *dc = json_load_file(path, 0, NULL);
    const char *v = json_string_value(json_object_get(dc, "readout_dtype"));
    bool        bf16 = v && strcmp(v, "bfloat16") == 0;
    json_decref(dc);
    return bf16;
}

static float to_bf16(float x) {
    return npu_bf16_to_f32(npu_f32_to_bf16(x));
}

/* readout.safetensors: exactly one tensor `weight` [255, hidden] (SPEC d.5),
 * its values rounded to bf16 when the readout is loaded as bfloat16. */
static svc_err_t load_readout(const char *dir, eng_model_t *m, char *errstr, size_t n) {
    eng_ld_t  ld = {NULL, NULL, "readout.safetensors", NULL, "", errstr, n, NULL, false};
    svc_err_t err = eng_st_set_open_file(dir, ld.file, &ld.set, errstr, n);
    if (err)
        return err;
    ld.path = eng_st_set_path(ld.set);
    if (eng_st_set_count(ld.set) != 1 || strcmp(eng_st_set_at(ld.set, 0)->name, "weight") != 0)
        err = eng_ld_fail(&ld, SVC_ERR_FORMAT, "must hold exactly one tensor \"weight\" (has %zu)",
                          eng_st_set_count(ld.set));
    else
        err = eng_ld_mat(&ld, "weight", ENG_N_CODES, m->cfg.hidden, &m->readout);
    eng_st_set_close(ld.set);
    m->readout_bf16 = !err && readout_is_bf16(dir);
    for (size_t i = 0; m->readout_bf16 && i < (size_t)ENG_N_CODES * m->cfg.hidden; i++)
        m->readout[i] = to_bf16(m->readout[i]);
    return err;
}

svc_err_t eng_load_opts_check(const eng_load_opts_t *opts, char *errstr, size_t errstr_size) {
    eng_q4nx_layout_t lay;
    return eng_q4nx_layout_parse(opts ? opts->q4nx_layout : NULL, &lay, errstr, errstr_size);
}

svc_err_t eng_model_load(const char *dir, eng_model_t **out, char *errstr, size_t errstr_size) {
    return eng_model_load_with(dir, NULL, out, errstr, errstr_size);
}

svc_err_t eng_model_load_with(const char *dir, const eng_load_opts_t *opts, eng_model_t **out,
                              char *errstr, size_t errstr_size) {
    *out = NULL;
    if (errstr_size)
        errstr[0] = '\0';
    eng_q4nx_layout_t lay;
    svc_err_t         err =
        eng_q4nx_layout_parse(opts ? opts->q4nx_layout : NULL, &lay, errstr, errstr_size);
    if (err)
        return err;
    eng_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return SVC_ERR_NOMEM;
    /* An upstream package (single file or sharded) wins when both kinds of
     * weights are present; with neither, the message names model.safetensors. */
    bool single = eng_dir_has_file(dir, ST_SINGLE);
    bool sharded = !single && eng_dir_has_file(dir, ST_INDEX);
    if (!single && !sharded && eng_dir_has_file(dir, "model.q4nx"))
        err = load_q4nx(dir, &lay, m, errstr, errstr_size);
    else if (!(err = eng_model_cfg_load(dir, NULL, &m->cfg, errstr, errstr_size)))
        err = load_weights(dir, sharded, m, errstr, errstr_size);
    if (!err)
        err = load_readout(dir, m, errstr, errstr_size);
    if (!err && !(m->fast_view = malloc(sizeof *m->fast_view)))
        err = SVC_ERR_NOMEM;
    if (!err) { /* the fast profile's view: this struct, sharing everything */
        *m->fast_view = *m;
        m->fast_view->fast = true;
        m->fast_view->fast_view = NULL;
        m->fast_view->base = m;
    }
    if (err) {
        if (err == SVC_ERR_NOMEM && errstr_size && !errstr[0])
            svc_errf(errstr, errstr_size, "out of memory loading \"%s\"", dir);
        eng_model_free(m);
        return err;
    }
    *out = m;
    return SVC_OK;
}

static void layer_free(eng_layer_t *l) {
    float *all[] = {l->in_norm, l->post_norm, l->conv,   l->dt_bias,
                    l->a_log,   l->lin_norm,  l->q_norm, l->k_norm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    npu_wpack_t *packs[] = {l->mlp_gate, l->mlp_up,   l->mlp_down, l->in_qkv, l->in_z,   l->in_b,
                            l->in_a,     l->out_proj, l->q_proj,   l->k_proj, l->v_proj, l->o_proj};
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++)
        npu_wpack_free(packs[i]);
}

void eng_model_free(eng_model_t *m) {
    if (!m)
        return;
    SVC_ASSERT(!m->fast); /* views are the model's own */
    free(m->fast_view);
    for (size_t i = 0; m->layers && i < m->cfg.n_layers; i++)
        layer_free(&m->layers[i]);
    free(m->layers);
    free(m->cfg.kinds);
    free(m->embed);
    free(m->embed16);
    free(m->embed8);
    free(m->embed8_s);
    free(m->final_norm);
    free(m->readout);
    eng_vision_free(m->vision);
    free(m);
}

svc_err_t eng_model_load_shell(const char *dir, eng_model_t **out, char *errstr, size_t n) {
    *out = NULL;
    if (n)
        errstr[0] = '\0';
    bool single = eng_dir_has_file(dir, ST_SINGLE);
    bool sharded = !single && eng_dir_has_file(dir, ST_INDEX);
    if (!single && !sharded) {
        svc_errf(errstr, n, "\"%s\" has no %s or %s (an upstream BF16 package is needed)", dir,
                 ST_SINGLE, ST_INDEX);
        return SVC_ERR_UNSUPPORTED;
    }
    eng_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return SVC_ERR_NOMEM;
    eng_ld_t    ld = {NULL, NULL, NULL, NULL, "", errstr, n, &m->n_params, false};
    const char *vprefix = NULL;
    svc_err_t   err = eng_model_cfg_load(dir, NULL, &m->cfg, errstr, n);
    if (!err)
        err = sharded ? eng_st_set_open_index(dir, ST_INDEX, &ld.set, errstr, n)
                      : eng_st_set_open_file(dir, ST_SINGLE, &ld.set, errstr, n);
    if (!err) {
        ld.file = eng_st_set_file(ld.set);
        ld.path = eng_st_set_path(ld.set);
        err = ld_prefix(&ld, &vprefix);
    }
    if (!err && !(m->layers = calloc(m->cfg.n_layers, sizeof *m->layers)))
        err = SVC_ERR_NOMEM;
    for (size_t i = 0; !err && i < m->cfg.n_layers; i++)
        m->layers[i].kind = m->cfg.kinds[i];
    if (!err)
        err = ld_embed(&ld, m);
    if (!err)
        err = eng_ld_vec(&ld, "norm.weight", m->cfg.hidden, &m->final_norm);
    eng_st_set_close(ld.set);
    if (err) {
        if (err == SVC_ERR_NOMEM && n && !errstr[0])
            svc_errf(errstr, n, "out of memory loading \"%s\"", dir);
        eng_model_free(m);
        return err;
    }
    *out = m;
    return SVC_OK;
}

/* ---- the golden check's reference layers (eng_model_int.h) ---- */

struct eng_ref_src {
    eng_ld_t           ld, vld; /* vld: the vision tower's, when vision */
    eng_q4nx_t        *q, *vq;
    struct eng_st_set *set;
    char              *path, *vfile, *vpath;
    bool               vision;
};

void eng_ref_close(eng_ref_src_t *r) {
    if (!r)
        return;
    eng_q4nx_close(r->q);
    eng_q4nx_close(r->vq);
    eng_st_set_close(r->set);
    free(r->path);
    free(r->vfile);
    free(r->vpath);
    free(r);
}

/* The vision tower's tensors: vision_weight.q4nx beside a model.q4nx,
 * else the safetensors' vision prefix (vprefix). */
static svc_err_t ref_open_vision(const char *dir, const char *vprefix, eng_ref_src_t *r,
                                 char *errstr, size_t n) {
    if (!r->q) {
        r->vld = r->ld;
        r->vld.prefix = vprefix;
        r->vision = vprefix != NULL;
        return SVC_OK;
    }
    svc_err_t err = q4nx_vision_open(dir, &r->vq, &r->vfile, errstr, n);
    if (err || !r->vq)
        return err;
    r->vpath = eng_path_join(dir, r->vfile);
    r->vld = (eng_ld_t){
        .q = r->vq, .file = r->vfile, .path = r->vpath, .prefix = ENG_Q4NX_VISION_PREFIX};
    r->vision = true;
    return r->vpath ? SVC_OK : SVC_ERR_NOMEM;
}

/* As eng_model_load_with picks the weights: upstream's files first. */
static svc_err_t ref_open_files(const char *dir, const eng_q4nx_layout_t *lay, eng_ref_src_t *r,
                                char *errstr, size_t n) {
    bool        single = eng_dir_has_file(dir, ST_SINGLE);
    bool        sharded = !single && eng_dir_has_file(dir, ST_INDEX);
    const char *vprefix = NULL;
    if (!single && !sharded && eng_dir_has_file(dir, "model.q4nx")) {
        r->path = eng_path_join(dir, "model.q4nx");
        svc_err_t err =
            r->path ? eng_q4nx_open_with(r->path, lay, &r->q, errstr, n) : SVC_ERR_NOMEM;
        r->ld = (eng_ld_t){
            .q = r->q, .file = "model.q4nx", .path = r->path, .prefix = "model.language_model."};
        return err ? err : ref_open_vision(dir, NULL, r, errstr, n);
    }
    svc_err_t err = sharded ? eng_st_set_open_index(dir, ST_INDEX, &r->set, errstr, n)
                            : eng_st_set_open_file(dir, ST_SINGLE, &r->set, errstr, n);
    if (err)
        return err;
    r->ld = (eng_ld_t){.set = r->set,
                       .file = eng_st_set_file(r->set),
                       .path = eng_st_set_path(r->set),
                       .errstr = errstr,
                       .errstr_size = n};
    err = ld_prefix(&r->ld, &vprefix);
    return err ? err : ref_open_vision(dir, vprefix, r, errstr, n);
}

svc_err_t eng_ref_open(const char *dir, const eng_load_opts_t *opts, eng_ref_src_t **out,
                       char *errstr, size_t errstr_size) {
    *out = NULL;
    eng_q4nx_layout_t lay;
    svc_err_t         err =
        eng_q4nx_layout_parse(opts ? opts->q4nx_layout : NULL, &lay, errstr, errstr_size);
    eng_ref_src_t *r = err ? NULL : calloc(1, sizeof *r);
    if (!err && !r)
        err = SVC_ERR_NOMEM;
    if (!err)
        err = ref_open_files(dir, &lay, r, errstr, errstr_size);
    if (err) {
        eng_ref_close(r);
        return err;
    }
    r->ld.fp32 = true;
    r->vld.fp32 = true;
    *out = r;
    return SVC_OK;
}

svc_err_t eng_ref_vision_block(eng_ref_src_t *r, const eng_model_t *m, size_t i,
                               struct eng_vis_block *b, char *errstr, size_t errstr_size) {
    memset(b, 0, sizeof *b);
    if (!r->vision || !m->vision) {
        svc_errf(errstr, errstr_size, "reference: the package has no vision tower");
        return SVC_ERR_INVALID;
    }
    r->vld.errstr = errstr;
    r->vld.errstr_size = errstr_size;
    svc_err_t err = eng_vision_load_block(&r->vld, &m->vision->cfg, i, b);
    if (err)
        eng_vision_block_free(b);
    return err;
}

svc_err_t eng_ref_layer(eng_ref_src_t *r, const eng_model_t *m, size_t i, eng_layer_t *l,
                        char *errstr, size_t errstr_size) {
    memset(l, 0, sizeof *l);
    r->ld.errstr = errstr;
    r->ld.errstr_size = errstr_size;
    svc_err_t err = ld_layer(&r->ld, &m->cfg, i, l);
    if (err)
        layer_free(l);
    return err;
}

svc_err_t eng_ref_take(eng_ref_src_t *r, bool vision, const char *suffix, size_t rank,
                       const uint64_t *dims, float *dst, char *errstr, size_t errstr_size) {
    if (vision && !r->vision) {
        svc_errf(errstr, errstr_size, "reference: the package has no vision tower");
        return SVC_ERR_INVALID;
    }
    eng_ld_t *ld = vision ? &r->vld : &r->ld;
    ld->errstr = errstr;
    ld->errstr_size = errstr_size;
    return eng_ld_take_into(ld, suffix, rank, dims, dst);
}

const struct eng_st_set *eng_ref_set(const eng_ref_src_t *r) {
    return r->set;
}

const char *eng_ref_prefix(const eng_ref_src_t *r, bool vision) {
    return vision ? (r->vision ? r->vld.prefix : NULL) : r->ld.prefix;
}

void eng_ref_layer_free(eng_layer_t *l) {
    layer_free(l);
    memset(l, 0, sizeof *l);
}

static const char *const PROFILE_NAMES[ENG_PROFILE_COUNT] = {"exact", "fast"};

bool eng_profile_parse(const char *s, eng_profile_t *out) {
    for (size_t i = 0; s && i < ENG_PROFILE_COUNT; i++)
        if (strcmp(s, PROFILE_NAMES[i]) == 0) {
            *out = (eng_profile_t)i;
            return true;
        }
    return false;
}

const char *eng_profile_name(eng_profile_t p) {
    return (unsigned)p < ENG_PROFILE_COUNT ? PROFILE_NAMES[p] : "?";
}

const char *const *eng_profile_names(void) {
    return PROFILE_NAMES; /* sorted: "exact" < "fast" */
}

const eng_model_t *eng_model_profile(const eng_model_t *m, eng_profile_t p) {
    const eng_model_t *b = m->fast ? m->base : m;
    return p == ENG_PROFILE_FAST ? b->fast_view : b;
}

eng_profile_t eng_request_profile(const sch_request_t *req) {
    eng_profile_t p = ENG_PROFILE_EXACT;
    (void)eng_profile_parse(sch_request_options(req)->profile, &p); /* unknown: exact */
    return p;
}

const char *eng_profile_numerics(eng_profile_t p) {
    return p == ENG_PROFILE_FAST && npu_fast_usable() ? "approximate" : "exact";
}

size_t eng_model_hidden_size(const eng_model_t *m) {
    return m->cfg.hidden;
}

size_t eng_model_vocab_size(const eng_model_t *m) {
    return m->cfg.vocab;
}

const char *eng_model_format(const eng_model_t *m) {
    switch (m->format) {
    case ENG_MODEL_Q4NX_GEN_A:
        return "q4nx-gen-a";
    case ENG_MODEL_Q4NX_GEN_B:
        return "q4nx-gen-b";
    case ENG_MODEL_SAFETENSORS:
        break;
    }
    return "safetensors";
}

void eng_model_get_info(const eng_model_t *m, eng_model_info_t *info) {
    const eng_model_cfg_t *c = &m->cfg;
    size_t                 n_full = 0;
    for (size_t i = 0; i < c->n_layers; i++)
        n_full += c->kinds[i] == ENG_LAYER_FULL;
    *info = (eng_model_info_t){
        .hidden = c->hidden,
        .n_layers = c->n_layers,
        .n_linear = c->n_layers - n_full,
        .n_full = n_full,
        .inter = c->inter,
        .vocab = c->vocab,
        .n_heads = c->n_heads,
        .n_kv = c->n_kv,
        .head_dim = c->head_dim,
        .rot_dim = c->rot_dim,
        .rope_theta = c->theta,
        .partial_rotary = (double)c->rot_dim / (double)c->head_dim,
        .attn_gate = c->attn_gate,
        .lin_nk = c->lin_nk,
        .lin_nv = c->lin_nv,
        .lin_dk = c->lin_dk,
        .lin_dv = c->lin_dv,
        .conv_k = c->conv_k,
        .rms_eps = c->eps,
        .n_params_text = m->n_params,
        .n_params_readout = (uint64_t)ENG_N_CODES * c->hidden,
    };
    if (m->vision) {
        const eng_vis_cfg_t *v = &m->vision->cfg;
        info->vis_depth = v->depth;
        info->vis_hidden = v->hidden;
        info->vis_heads = v->heads;
        info->vis_inter = v->inter;
        info->vis_patch = v->patch;
        info->vis_merge = v->merge;
        info->vis_n_pos = v->n_pos;
        info->n_params_vision = m->vision->n_params;
    }
}

/* ---------------------------------------------------------------------
 * MODEL_MANIFEST.json parameters (SPEC e.3)
 * --------------------------------------------------------------------- */

#define MF_JSON "MODEL_MANIFEST.json"

SVC_FMT(4, 5)
static svc_err_t mf_params_fail(const char *path, char *errstr, size_t n, const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(errstr, n, MF_JSON " \"%s\": %s", path, msg);
    return SVC_ERR_FORMAT;
}

/* parameters.<key> as a count; vision may be left out (no tower: 0). */
static svc_err_t mf_count(const json_t *p, const char *key, bool optional, const char *path,
                          uint64_t *out, char *errstr, size_t n) {
    const json_t *v = json_object_get(p, key);
    *out = 0;
    if (!v && optional)
        return SVC_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return mf_params_fail(path, errstr, n, "parameters.%s: expected a non-negative integer",
                              key);
    *out = (uint64_t)json_integer_value(v);
    return SVC_OK;
}

/* The listed counts against ours: text and readout as loaded, and loaded
 * as text + readout once vision's share is taken out, since no vision
 * tower is loaded yet (SPEC e.3). */
/* SPEC e.3: text and readout as loaded; vision as loaded when the tower
 * is (our_vision > 0), else it may be listed without being loaded. */
static svc_err_t mf_compare(const json_t *p, const char *path, uint64_t our_text,
                            uint64_t our_readout, uint64_t our_vision, char *errstr, size_t n) {
    uint64_t  text, vision, readout, loaded;
    svc_err_t err;
    if ((err = mf_count(p, "text", false, path, &text, errstr, n)) ||
        (err = mf_count(p, "vision", true, path, &vision, errstr, n)) ||
        (err = mf_count(p, "readout", false, path, &readout, errstr, n)) ||
        (err = mf_count(p, "loaded", false, path, &loaded, errstr, n)))
        return err;
    if (text != our_text)
        return mf_params_fail(path, errstr, n,
                              "parameters.text: expected %llu, the loaded text tower has %llu",
                              (unsigned long long)text, (unsigned long long)our_text);
    if (readout != our_readout)
        return mf_params_fail(path, errstr, n,
                              "parameters.readout: expected %llu, the loaded readout has %llu "
                              "(255 x hidden_size)",
                              (unsigned long long)readout, (unsigned long long)our_readout);
    if (our_vision && vision != our_vision)
        return mf_params_fail(path, errstr, n,
                              "parameters.vision: expected %llu, the loaded vision tower has %llu",
                              (unsigned long long)vision, (unsigned long long)our_vision);
    if (loaded < vision || loaded - vision != our_text + our_readout) {
        if (!our_vision)
            return mf_params_fail(path, errstr, n,
                                  "parameters.loaded: expected %llu (vision %llu not loaded), "
                                  "loaded %llu (text %llu + readout %llu)",
                                  (unsigned long long)loaded, (unsigned long long)vision,
                                  (unsigned long long)(our_text + our_readout),
                                  (unsigned long long)our_text, (unsigned long long)our_readout);
        return mf_params_fail(path, errstr, n,
                              "parameters.loaded: expected %llu, loaded %llu (text %llu + "
                              "readout %llu + vision %llu)",
                              (unsigned long long)loaded,
                              (unsigned long long)(our_text + our_readout + our_vision),
                              (unsigned long long)our_text, (unsigned long long)our_readout,
                              (unsigned long long)our_vision);
    }
    return SVC_OK;
}

svc_err_t eng_model_check_parameters(const eng_model_t *m, const char *dir, char *errstr,
                                     size_t errstr_size) {
    if (!eng_dir_has_file(dir, MF_JSON)) /* MANIFEST.sha256 packages list no counts */
        return SVC_OK;
    char *path = eng_path_join(dir, MF_JSON);
    if (!path)
        return SVC_ERR_NOMEM;
    json_error_t  jerr;
    json_t       *mf = json_load_file(path, 0, &jerr);
    const json_t *p = json_object_get(mf, "parameters");
    svc_err_t     err = SVC_OK;
    if (!mf)
        err = mf_params_fail(path, errstr, errstr_size, "%s (line %d)", jerr.text, jerr.line);
    else if (p && !json_is_object(p))
        err = mf_params_fail(path, errstr, errstr_size, "parameters: expected an object");
    else if (p)
        err = mf_compare(p, path, m->n_params, (uint64_t)ENG_N_CODES * m->cfg.hidden,
                         m->vision ? m->vision->n_params : 0, errstr, errstr_size);
    json_decref(mf);
    free(path);
    return err;
}

bool eng_model_layer_is_full(const eng_model_t *m, size_t i) {
    SVC_ASSERT(i < m->cfg.n_layers);
    return m->cfg.kinds[i] == ENG_LAYER_FULL;
}

/* ---------------------------------------------------------------------
 * Readout (SPEC d.5-d.7, b.2)
 * --------------------------------------------------------------------- */

/* The fp32 path: hidden x W^T, the logits rounded to fp32. The bf16 path
 * (upstream: nn.Linear in bf16, then .float()): the hidden state and the
 * weights (at load) rounded to bf16, the products summed wide (as bf16
 * GEMMs accumulate in fp32 or wider), each logit rounded to bf16. */
void eng_readout_logits(const eng_model_t *m, const float *hidden, float logits[ENG_N_CODES]) {
    size_t H = m->cfg.hidden;
    for (size_t i = 0; i < ENG_N_CODES; i++) {
        const float *w = m->readout + i * H;
        double       acc = 0;
        for (size_t d = 0; d < H; d++)
            acc += (double)(m->readout_bf16 ? to_bf16(hidden[d]) : hidden[d]) * w[d];
        logits[i] = m->readout_bf16 ? to_bf16((float)acc) : (float)acc;
    }
}

bool eng_model_readout_bf16(const eng_model_t *m) {
    return m->readout_bf16;
}

svc_err_t eng_readout_probs(const eng_model_t *m, const float *hidden, size_t n_options,
                            double temperature, double *probs) {
    if (n_options < 1 || n_options > ENG_N_CODES || !(temperature > 0) || !isfinite(temperature))
        return SVC_ERR_INVALID;
    float logits[ENG_N_CODES];
    eng_readout_logits(m, hidden, logits);
    /* Rows >= n are -inf: their exp is 0, so the softmax over 255 is one over
     * the first n; its denominator, then the host renormalisation. */
    double zmax = -INFINITY;
    for (size_t i = 0; i < n_options; i++)
        zmax = fmax(zmax, (double)logits[i] / temperature);
    double sum = 0;
    for (size_t i = 0; i < n_options; i++) {
        probs[i] = exp((double)logits[i] / temperature - zmax);
        sum += probs[i];
    }
    for (size_t i = 0; i < n_options; i++)
        probs[i] /= sum;
    double renorm = 0;
    for (size_t i = 0; i < n_options; i++)
        renorm += probs[i];
    for (size_t i = 0; i < n_options; i++)
        probs[i] /= renorm;
    return SVC_OK;
}
