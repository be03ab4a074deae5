/*
 * eng_q4nx.c -- model.q4nx reader: name map, geometry checks, generation
 * detection and HF-convention tensors (eng_q4nx_int.h; Q4NX.md §1, §2, §8).
 *
 * The file is untrusted: eng_st_open has already checked every offset and
 * byte count, and open() adds the tile geometry. The logical shape of a
 * packed tensor is not in the file (rows and columns are padded, §3.2), so
 * eng_q4nx_tensor_f32 takes it from the caller and checks it against the
 * tile grid before decoding anything.
 */
#include "eng_q4nx_int.h"

#include <math.h>

#define HF_PREFIX    "model.language_model."
#define HF_PREFIX2   "language_model."
#define Q_PREFIX     "model.layers."
#define HF_L_PREFIX  "layers."
#define HD_FALLBACK  256 /* §2.2: h = 256 when no q_norm tells us */
#define NAME_MAX_LEN 256

struct eng_q4nx {
    eng_st_t           *st;
    eng_q4nx_info_t    *info; /* eng_st order (by name) */
    size_t              n;
    eng_q4nx_gen_t      gen;
    eng_q4nx_decision_t dec[ENG_Q4NX_FAM_COUNT]; /* eng_q4nx_layout.c */
    size_t              n_vision;
    size_t              vis_mm_n, vis_mm_k; /* 0: §5's fallback per tensor */
};

/* ---------------------------------------------------------------------
 * Names (§2.3-§2.5)
 * --------------------------------------------------------------------- */

typedef struct name_map {
    const char      *q4nx; /* after "model.layers.{i}." for layer tensors */
    const char      *hf;   /* after "model.language_model.layers.{i}." */
    eng_q4nx_xform_t xf;
} name_map_t;

static const name_map_t LAYER_MAP[] = {
    {"input_layernorm.weight", "input_layernorm.weight", ENG_Q4NX_X_PLUS1},
    {"post_attention_layernorm.weight", "post_attention_layernorm.weight", ENG_Q4NX_X_PLUS1},
    {"linear_attn.qkv_proj.weight", "linear_attn.in_proj_qkv.weight", ENG_Q4NX_X_NONE},
    /* the DeltaNet z projection, despite the self_attn. name (§2.4) */
    {"self_attn.gate_proj.weight", "linear_attn.in_proj_z.weight", ENG_Q4NX_X_NONE},
    {"linear_attn.ssm_out_proj.weight", "linear_attn.out_proj.weight", ENG_Q4NX_X_NONE},
    {"linear_attn.ssm_alpha_proj.weight", "linear_attn.in_proj_a.weight", ENG_Q4NX_X_ROW_DUP},
    {"linear_attn.ssm_beta_proj.weight", "linear_attn.in_proj_b.weight", ENG_Q4NX_X_ROW_DUP},
    {"linear_attn.ssm_conv1d.weight", "linear_attn.conv1d.weight", ENG_Q4NX_X_CONV_T},
    {"linear_attn.ssm_norm.weight", "linear_attn.norm.weight", ENG_Q4NX_X_NONE}, /* no +1 */
    {"linear_attn.ssm_a", "linear_attn.A_log", ENG_Q4NX_X_NEG_EXP},
    {"linear_attn.ssm_dt.bias", "linear_attn.dt_bias", ENG_Q4NX_X_NONE},
    {"mlp.gate_proj.weight", "mlp.gate_proj.weight", ENG_Q4NX_X_NONE},
    {"mlp.up_proj.weight", "mlp.up_proj.weight", ENG_Q4NX_X_NONE},
    {"mlp.down_proj.weight", "mlp.down_proj.weight", ENG_Q4NX_X_NONE},
    {"self_attn.q_proj.weight", "self_attn.q_proj.weight", ENG_Q4NX_X_Q_REGROUP},
    {"self_attn.k_proj.weight", "self_attn.k_proj.weight", ENG_Q4NX_X_NONE},
    {"self_attn.v_proj.weight", "self_attn.v_proj.weight", ENG_Q4NX_X_NONE},
    {"self_attn.o_proj.weight", "self_attn.o_proj.weight", ENG_Q4NX_X_NONE},
    {"self_attn.q_norm.weight", "self_attn.q_norm.weight", ENG_Q4NX_X_PLUS1},
    {"self_attn.k_norm.weight", "self_attn.k_norm.weight", ENG_Q4NX_X_PLUS1},
};

/* Full names; the HF side is relative to HF_PREFIX except lm_head. */
static const name_map_t GLOBAL_MAP[] = {
    {"model.embed_tokens.weight", "embed_tokens.weight", ENG_Q4NX_X_NONE},
    {"model.norm.weight", "norm.weight", ENG_Q4NX_X_PLUS1},
    {"lm_head.weight", "lm_head.weight", ENG_Q4NX_X_NONE},
};

#define N_LAYER_MAP  (sizeof LAYER_MAP / sizeof LAYER_MAP[0])
#define N_GLOBAL_MAP (sizeof GLOBAL_MAP / sizeof GLOBAL_MAP[0])

static bool has_prefix(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

/* "<digits>." at s: the layer number (no sign, no leading zeros), and the
 * rest after the dot. false when s does not start that way. */
static bool parse_layer(const char *s, size_t *layer, const char **rest) {
    size_t v = 0, i = 0;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        if (i >= 6 || (i == 1 && s[0] == '0'))
            return false;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    if (i == 0 || s[i] != '.')
        return false;
    *layer = v;
    *rest = s + i + 1;
    return true;
}

static svc_err_t emit(char *buf, size_t n, const char *a, size_t layer, bool with_layer,
                      const char *b) {
    int k = with_layer ? snprintf(buf, n, "%s%zu.%s", a, layer, b) : snprintf(buf, n, "%s%s", a, b);
    return (k < 0 || (size_t)k >= n) ? SVC_ERR_INVALID : SVC_OK;
}

svc_err_t eng_q4nx_name_to_hf(const char *q4nx_name, char *hf, size_t hf_size,
                              eng_q4nx_xform_t *xform) {
    if (has_prefix(q4nx_name, ENG_Q4NX_VISION_PREFIX) && eng_q4nx_vision_name(q4nx_name)) {
        /* §2.7: the vision tower keeps its HF names */
        *xform = eng_q4nx_vision_tiled_name(q4nx_name) ? ENG_Q4NX_X_VTILE : ENG_Q4NX_X_NONE;
        return emit(hf, hf_size, "", 0, false, q4nx_name);
    }
    for (size_t i = 0; i < N_GLOBAL_MAP; i++)
        if (strcmp(q4nx_name, GLOBAL_MAP[i].q4nx) == 0) {
            *xform = GLOBAL_MAP[i].xf;
            bool lm = strcmp(GLOBAL_MAP[i].hf, "lm_head.weight") == 0;
            return emit(hf, hf_size, lm ? "" : HF_PREFIX, 0, false, GLOBAL_MAP[i].hf);
        }
    size_t      layer;
    const char *rest;
    if (!has_prefix(q4nx_name, Q_PREFIX) ||
        !parse_layer(q4nx_name + strlen(Q_PREFIX), &layer, &rest))
        return SVC_ERR_INVALID;
    for (size_t i = 0; i < N_LAYER_MAP; i++)
        if (strcmp(rest, LAYER_MAP[i].q4nx) == 0) {
            *xform = LAYER_MAP[i].xf;
            return emit(hf, hf_size, HF_PREFIX HF_L_PREFIX, layer, true, LAYER_MAP[i].hf);
        }
    return SVC_ERR_INVALID;
}

/* The HF name relative to HF_PREFIX ("lm_head.weight" stays as is). */
static const char *hf_suffix(const char *hf_name) {
    if (has_prefix(hf_name, HF_PREFIX))
        return hf_name + strlen(HF_PREFIX);
    if (has_prefix(hf_name, HF_PREFIX2))
        return hf_name + strlen(HF_PREFIX2);
    return hf_name;
}

svc_err_t eng_q4nx_name_from_hf(const char *hf_name, char *q4nx, size_t q4nx_size,
                                eng_q4nx_xform_t *xform) {
    if (eng_q4nx_vision_name(hf_name)) {
        *xform = eng_q4nx_vision_tiled_name(hf_name) ? ENG_Q4NX_X_VTILE : ENG_Q4NX_X_NONE;
        const char *rest = has_prefix(hf_name, ENG_Q4NX_VISION_PREFIX)
                               ? hf_name + strlen(ENG_Q4NX_VISION_PREFIX)
                               : hf_name + strlen("visual.");
        return emit(q4nx, q4nx_size, ENG_Q4NX_VISION_PREFIX, 0, false, rest);
    }
    const char *s = hf_suffix(hf_name);
    for (size_t i = 0; i < N_GLOBAL_MAP; i++)
        if (strcmp(s, GLOBAL_MAP[i].hf) == 0) {
            *xform = GLOBAL_MAP[i].xf;
            return emit(q4nx, q4nx_size, "", 0, false, GLOBAL_MAP[i].q4nx);
        }
    size_t      layer;
    const char *rest;
    if (!has_prefix(s, HF_L_PREFIX) || !parse_layer(s + strlen(HF_L_PREFIX), &layer, &rest))
        return SVC_ERR_INVALID;
    for (size_t i = 0; i < N_LAYER_MAP; i++)
        if (strcmp(rest, LAYER_MAP[i].hf) == 0) {
            *xform = LAYER_MAP[i].xf;
            return emit(q4nx, q4nx_size, Q_PREFIX, layer, true, LAYER_MAP[i].q4nx);
        }
    return SVC_ERR_INVALID;
}

/* ---------------------------------------------------------------------
 * Open: kinds and geometry (§1, §8 step 2)
 * --------------------------------------------------------------------- */

svc_err_t eng_q4nx_failf(const eng_st_t *st, char *errstr, size_t n, const char *fmt, ...) {
    char    msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(errstr, n, "q4nx \"%s\": %s", eng_st_path(st), msg);
    return SVC_ERR_FORMAT;
}

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* 5120-byte tiles are legacy Q8 when in every tile the second scale copy
 * repeats the first and the tail is padding (§4.5), and some tile has a
 * scale; else Q4_1 (or Q4_0, eng_q4nx_layout.c). Q4_1 tiles cannot pass
 * that by chance: groups 4-7 would need each row's scales of groups 0-3
 * and zero codes in their last 512 bytes. §4.5's other test, shape[1] *
 * 128 == K, cannot tell a Q4_1 matrix of K = 128 (one tile of columns,
 * half padding) from a legacy one: read by it, such a Q4_1 tensor came
 * out as noise. */
static eng_q4nx_kind_t kind_5120(const eng_st_tensor_t *t) {
    const uint8_t *b = t->data;
    bool           any = false;
    for (size_t i = 0; i < t->nbytes / ENG_Q4NX_B_Q4_1; i++, b += ENG_Q4NX_B_Q4_1) {
        if (memcmp(b, b + 256, 256) != 0 || !all_zero(b + 4608, 512))
            return ENG_Q4NX_Q4_1;
        any = any || !all_zero(b, 256);
    }
    return any ? ENG_Q4NX_Q8_LEGACY : ENG_Q4NX_Q4_1;
}

static svc_err_t classify(const eng_st_t *st, const eng_st_tensor_t *t, eng_q4nx_kind_t *kind,
                          char *errstr, size_t n) {
    switch (t->dtype) {
    case ENG_DT_BF16:
        *kind = ENG_Q4NX_BF16;
        return SVC_OK;
    case ENG_DT_F32:
        *kind = ENG_Q4NX_F32;
        return SVC_OK;
    case ENG_DT_F16:
        *kind = ENG_Q4NX_F16;
        return SVC_OK;
    case ENG_DT_I8:
        break;
    default:
        return eng_q4nx_failf(st, errstr, n,
                              "tensor \"%s\": dtype %s, expected I8, BF16 or F32 (Q4NX.md §1)",
                              t->name, eng_dtype_name(t->dtype));
    }
    /* §8 step 2 also mentions 2-D I8 tensors without saying how their tile
     * count is known [unconfirmed]: refused rather than guessed. */
    if (t->rank != 3)
        return eng_q4nx_failf(
            st, errstr, n,
            "tensor \"%s\": packed I8 tensor of rank %u, expected [R/32, K/256, B] "
            "(Q4NX.md §1)",
            t->name, t->rank);
    uint64_t P = t->shape[0], Q = t->shape[1], B = t->shape[2];
    if (B == ENG_Q4NX_B_Q4_K)
        *kind = ENG_Q4NX_Q4_K;
    else if (B == ENG_Q4NX_B_Q8)
        *kind = ENG_Q4NX_Q8;
    else if (B == ENG_Q4NX_B_Q4_1)
        *kind = ENG_Q4NX_Q4_1; /* kind_5120 once the byte count is checked */
    else
        return eng_q4nx_failf(
            st, errstr, n,
            "tensor \"%s\": tile size %llu bytes, expected 4736 (Q4_K), 5120 (Q4_1 or "
            "legacy Q8) or 8704 (Q8) (Q4NX.md §1)",
            t->name, (unsigned long long)B);
    if (!P || !Q)
        return eng_q4nx_failf(st, errstr, n,
                              "tensor \"%s\": shape [%llu, %llu, %llu] holds no tile", t->name,
                              (unsigned long long)P, (unsigned long long)Q, (unsigned long long)B);
    if (t->nbytes / B != P * Q || t->nbytes % B) /* eng_st checked numel; be explicit */
        return eng_q4nx_failf(st, errstr, n, "tensor \"%s\": %zu bytes, expected %llu tiles x %llu",
                              t->name, t->nbytes, (unsigned long long)(P * Q),
                              (unsigned long long)B);
    if (B == ENG_Q4NX_B_Q4_1)
        *kind = kind_5120(t);
    return SVC_OK;
}

static svc_err_t build_info(eng_q4nx_t *q, char *errstr, size_t n) {
    q->n = eng_st_count(q->st);
    q->info = calloc(q->n ? q->n : 1, sizeof *q->info);
    if (!q->info) {
        (void)eng_q4nx_failf(q->st, errstr, n, "out of memory for %zu tensors", q->n);
        return SVC_ERR_NOMEM;
    }
    for (size_t i = 0; i < q->n; i++) {
        eng_q4nx_info_t *in = &q->info[i];
        in->st = eng_st_at(q->st, i);
        in->name = in->st->name;
        svc_err_t err = classify(q->st, in->st, &in->kind, errstr, n);
        if (err)
            return err;
        char hf[NAME_MAX_LEN];
        if (has_prefix(in->name, ENG_Q4NX_VISION_PREFIX))
            q->n_vision++;
        if (eng_q4nx_name_to_hf(in->name, hf, sizeof hf, &in->xform) == SVC_OK) {
            in->hf_name = strdup(hf);
            if (!in->hf_name) {
                (void)eng_q4nx_failf(q->st, errstr, n, "out of memory");
                return SVC_ERR_NOMEM;
            }
        }
    }
    return SVC_OK;
}

svc_err_t eng_q4nx_bf16_name(const char *qname, char *buf, size_t n) {
    size_t len = strlen(qname), w = strlen(".weight");
    int    k = len > w ? snprintf(buf, n, "%.*s.bf16.weight", (int)(len - w), qname) : -1;
    return (k < 0 || (size_t)k >= n) ? SVC_ERR_INVALID : SVC_OK;
}

const eng_q4nx_info_t *eng_q4nx_info_find(const eng_st_t *st, const eng_q4nx_info_t *info,
                                          const char *name) {
    const eng_st_tensor_t *t = eng_st_find(st, name);
    return t ? &info[t - eng_st_at(st, 0)] : NULL;
}

static const eng_q4nx_info_t *find_q(const eng_q4nx_t *q, const char *name) {
    return eng_q4nx_info_find(q->st, q->info, name);
}

/* ---------------------------------------------------------------------
 * Generation (§0.2); the code orders are eng_q4nx_layout.c's
 * --------------------------------------------------------------------- */

/* Q4_K tiles or no BF16 embedding table: the Q4_K era. Only the name of
 * the format follows from it (eng_model_format), never how a tile is read:
 * the converter writes both code orders in both (§8.1). */
static void detect(eng_q4nx_t *q) {
    bool any_q4k = false;
    for (size_t i = 0; i < q->n; i++)
        any_q4k = any_q4k || q->info[i].kind == ENG_Q4NX_Q4_K;
    q->gen = (any_q4k || !eng_st_find(q->st, "model.embed_tokens.weight")) ? ENG_Q4NX_GEN_B
                                                                           : ENG_Q4NX_GEN_A;
}

svc_err_t eng_q4nx_open(const char *path, eng_q4nx_t **out, char *errstr, size_t errstr_size) {
    return eng_q4nx_open_with(path, NULL, out, errstr, errstr_size);
}

svc_err_t eng_q4nx_open_with(const char *path, const eng_q4nx_layout_t *forced, eng_q4nx_t **out,
                             char *errstr, size_t errstr_size) {
    *out = NULL;
    eng_q4nx_t *q = calloc(1, sizeof *q);
    if (!q) {
        svc_errf(errstr, errstr_size, "q4nx \"%s\": out of memory", path);
        return SVC_ERR_NOMEM;
    }
    svc_err_t err = eng_st_open(path, &q->st, errstr, errstr_size);
    if (!err)
        err = build_info(q, errstr, errstr_size);
    if (!err)
        err = eng_q4nx_layout_decide(q->st, q->info, q->n, forced, q->dec, errstr, errstr_size);
    if (err) {
        eng_q4nx_close(q);
        return err;
    }
    detect(q);
    *out = q;
    return SVC_OK;
}

void eng_q4nx_close(eng_q4nx_t *q) {
    if (!q)
        return;
    for (size_t i = 0; q->info && i < q->n; i++)
        free((char *)q->info[i].hf_name);
    free(q->info);
    eng_st_close(q->st);
    free(q);
}

eng_q4nx_gen_t eng_q4nx_generation(const eng_q4nx_t *q) {
    return q->gen;
}

eng_q4nx_raster_t eng_q4nx_q8_raster(const eng_q4nx_t *q) {
    return q->dec[ENG_Q4NX_FAM_Q8].raster;
}

const eng_q4nx_decision_t *eng_q4nx_decision(const eng_q4nx_t *q, eng_q4nx_family_t f) {
    return &q->dec[f];
}

size_t eng_q4nx_count(const eng_q4nx_t *q) {
    return q->n;
}

size_t eng_q4nx_vision_count(const eng_q4nx_t *q) {
    return q->n_vision;
}

svc_err_t eng_q4nx_set_vision_tiles(eng_q4nx_t *q, size_t mm_n, size_t mm_k, char *errstr,
                                    size_t errstr_size) {
    if (mm_n && mm_k && !eng_q4nx_vision_tiles_valid(mm_n, mm_k)) {
        svc_errf(errstr, errstr_size,
                 "q4nx \"%s\": vision tiles %zu x %zu: expected sizes in 1..%u, the larger a "
                 "multiple of the smaller (Q4NX.md §5)",
                 eng_st_path(q->st), mm_n, mm_k, ENG_Q4NX_VISION_MM_MAX);
        return SVC_ERR_INVALID;
    }
    q->vis_mm_n = mm_n && mm_k ? mm_n : 0;
    q->vis_mm_k = mm_n && mm_k ? mm_k : 0;
    return SVC_OK;
}

void eng_q4nx_vision_tiles(const eng_q4nx_t *q, size_t *mm_n, size_t *mm_k) {
    *mm_n = q->vis_mm_n;
    *mm_k = q->vis_mm_k;
}

const eng_q4nx_info_t *eng_q4nx_at(const eng_q4nx_t *q, size_t i) {
    return i < q->n ? &q->info[i] : NULL;
}

/* Where an HF tensor is stored, following the tied embedding (Gen-B, §8
 * step 5) and the alpha/beta BF16 copies when the packed one is absent. */
static const eng_q4nx_info_t *resolve(const eng_q4nx_t *q, const char *hf_name,
                                      eng_q4nx_xform_t *xf) {
    char qn[NAME_MAX_LEN];
    if (eng_q4nx_name_from_hf(hf_name, qn, sizeof qn, xf))
        return NULL;
    const eng_q4nx_info_t *in = find_q(q, qn);
    if (!in && strcmp(qn, "model.embed_tokens.weight") == 0) {
        *xf = ENG_Q4NX_X_TIED;
        return find_q(q, "lm_head.weight");
    }
    char tw[NAME_MAX_LEN + 16];
    if (!in && *xf == ENG_Q4NX_X_ROW_DUP && eng_q4nx_bf16_name(qn, tw, sizeof tw) == SVC_OK) {
        *xf = ENG_Q4NX_X_NONE;
        return find_q(q, tw);
    }
    return in;
}

const eng_q4nx_info_t *eng_q4nx_find_hf(const eng_q4nx_t *q, const char *hf_name) {
    eng_q4nx_xform_t xf;
    return resolve(q, hf_name, &xf);
}

/* ---------------------------------------------------------------------
 * HF-convention tensors (§8 step 4)
 * --------------------------------------------------------------------- */

typedef struct rd {
    const eng_q4nx_t      *q;
    const char            *hf;
    const eng_q4nx_info_t *in;
    char                  *errstr;
    size_t                 errstr_size;
} rd_t;

SVC_FMT(3, 4) static svc_err_t rd_fail(const rd_t *r, svc_err_t err, const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(r->errstr, r->errstr_size, "q4nx \"%s\": tensor \"%s\" (HF \"%s\"): %s",
             eng_st_path(r->q->st), r->in ? r->in->name : "?", r->hf, msg);
    return err;
}

static void dims_str(char *buf, size_t n, size_t rank, const uint64_t *d) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (size_t i = 0; i < rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)d[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

static uint64_t ceil_div(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

/* Head size of layer <i> for the q_proj regroup: its q_norm's length. */
static size_t head_dim_of(const eng_q4nx_t *q, const char *qname) {
    size_t      layer;
    const char *rest;
    char        nm[NAME_MAX_LEN];
    if (!parse_layer(qname + strlen(Q_PREFIX), &layer, &rest) ||
        emit(nm, sizeof nm, Q_PREFIX, layer, true, "self_attn.q_norm.weight"))
        return HD_FALLBACK;
    const eng_q4nx_info_t *qn = find_q(q, nm);
    return qn && qn->st->rank == 1 && qn->st->shape[0] ? (size_t)qn->st->shape[0] : HD_FALLBACK;
}

/* A packed tensor's tile grid checked against the HF shape (R, K): its
 * kind (5120-byte tiles told apart by K) and raster in *kind, *ra, and
 * the head size of a q_proj to regroup in *hd (0: none). */
static svc_err_t rd_grid(const rd_t *r, size_t rank, const uint64_t *dims, eng_q4nx_kind_t *kind,
                         eng_q4nx_raster_t *ra, size_t *hd) {
    const eng_st_tensor_t *t = r->in->st;
    char                   want[96];
    dims_str(want, sizeof want, rank, dims);
    if (rank != 2 || !dims[0] || !dims[1])
        return rd_fail(r, SVC_ERR_INVALID, "packed matrix read as %s, expected a 2-D shape", want);
    uint64_t P = t->shape[0], Q = t->shape[1], R = dims[0], K = dims[1];
    *kind = r->in->kind; /* 5120-byte tiles: by their bytes (kind_5120), checked against K below */
    uint64_t tc = eng_q4nx_tile_cols(*kind);
    if (ceil_div(R, ENG_Q4NX_ROWS) != P || ceil_div(K, tc) != Q)
        return rd_fail(r, SVC_ERR_INVALID,
                       "stored as [%llu, %llu, %llu] %s tiles, which cannot hold %s (expected "
                       "[%llu, %llu, %zu], Q4NX.md §3.1)",
                       (unsigned long long)P, (unsigned long long)Q,
                       (unsigned long long)t->shape[2], eng_q4nx_kind_name(*kind), want,
                       (unsigned long long)ceil_div(R, ENG_Q4NX_ROWS),
                       (unsigned long long)ceil_div(K, tc), eng_q4nx_tile_bytes(*kind));
    /* Q4_K and legacy Q8 have one order each (the decoders ignore ra) */
    *ra = r->q->dec[*kind == ENG_Q4NX_Q8 ? ENG_Q4NX_FAM_Q8 : ENG_Q4NX_FAM_Q4].raster;
    *hd = 0;
    if (r->in->xform != ENG_Q4NX_X_Q_REGROUP)
        return SVC_OK;
    *hd = head_dim_of(r->q, r->in->name);
    if (R % (2 * *hd))
        return rd_fail(r, SVC_ERR_INVALID,
                       "q_proj has %llu rows, not a multiple of 2 x head_dim %zu (Q4NX.md §2.2)",
                       (unsigned long long)R, *hd);
    return SVC_OK;
}

/* §2.2: stored row p*(R/2) + g*hd + h holds HF row g*2hd + p*hd + h; each
 * row is rb bytes. */
static void regroup_rows(const void *stored, size_t R, size_t hd, size_t rb, void *out) {
    size_t half = R / 2;
    for (size_t g = 0; g < half / hd; g++)
        for (size_t p = 0; p < 2; p++)
            memcpy((char *)out + (g * 2 * hd + p * hd) * rb,
                   (const char *)stored + (p * half + g * hd) * rb, hd * rb);
}

/* Packed tensor -> (R, K) in out, checked against the tile grid. */
static svc_err_t rd_packed(const rd_t *r, size_t rank, const uint64_t *dims, float *out) {
    const eng_st_tensor_t *t = r->in->st;
    eng_q4nx_kind_t        kind;
    eng_q4nx_raster_t      ra;
    size_t                 hd;
    svc_err_t              err = rd_grid(r, rank, dims, &kind, &ra, &hd);
    if (err)
        return err;
    uint64_t P = t->shape[0], Q = t->shape[1], R = dims[0], K = dims[1];
    if (!hd) {
        eng_q4nx_decode_ref(kind, ra, t->data, P, Q, R, K, out);
        return SVC_OK;
    }
    float *tmp = malloc(R * K * sizeof *tmp);
    if (!tmp)
        return rd_fail(r, SVC_ERR_NOMEM, "out of memory for a %llu x %llu q_proj",
                       (unsigned long long)R, (unsigned long long)K);
    eng_q4nx_decode_ref(kind, ra, t->data, P, Q, R, K, tmp);
    regroup_rows(tmp, R, hd, K * sizeof *tmp, out);
    free(tmp);
    return SVC_OK;
}

/* BF16/F32 tensor: same shape as HF except conv1d, stored transposed (§2.4). */
static svc_err_t rd_plain(const rd_t *r, size_t rank, const uint64_t *dims, float *out) {
    const eng_st_tensor_t *t = r->in->st;
    char                   want[96], got[96];
    dims_str(want, sizeof want, rank, dims);
    dims_str(got, sizeof got, t->rank, t->shape);
    if (r->in->xform == ENG_Q4NX_X_CONV_T) {
        bool ok = (rank == 3 && dims[1] == 1) || rank == 2;
        if (!ok || t->rank != 2 || t->shape[0] != dims[rank - 1] || t->shape[1] != dims[0])
            return rd_fail(r, SVC_ERR_INVALID,
                           "stored %s, expected [taps, channels] for HF %s (Q4NX.md §2.4)", got,
                           want);
        size_t C = dims[0], Kt = dims[rank - 1];
        float *tmp = malloc(C * Kt * sizeof *tmp);
        if (!tmp)
            return rd_fail(r, SVC_ERR_NOMEM, "out of memory for %s", want);
        svc_err_t err = eng_st_to_f32(t, tmp);
        SVC_ASSERT(err == SVC_OK); /* kind checked by the caller */
        for (size_t c = 0; c < C; c++)
            for (size_t k = 0; k < Kt; k++)
                out[c * Kt + k] = tmp[k * C + c];
        free(tmp);
        return SVC_OK;
    }
    bool same = t->rank == rank;
    for (size_t i = 0; same && i < rank; i++)
        same = t->shape[i] == dims[i];
    if (!same)
        return rd_fail(r, SVC_ERR_INVALID, "stored %s, expected %s", got, want);
    svc_err_t err = eng_st_to_f32(t, out);
    SVC_ASSERT(err == SVC_OK);
    return SVC_OK;
}

/* Undoes the value transforms in place (§2.2, §8 step 4). */
static svc_err_t rd_values(const rd_t *r, float *out, size_t n) {
    if (r->in->xform == ENG_Q4NX_X_PLUS1)
        for (size_t i = 0; i < n; i++)
            out[i] -= 1.0f;
    if (r->in->xform == ENG_Q4NX_X_NEG_EXP)
        for (size_t i = 0; i < n; i++) {
            if (!(out[i] < 0) || !isfinite(out[i]))
                return rd_fail(r, SVC_ERR_INVALID,
                               "ssm_a[%zu] = %g: -exp(A_log) must be negative and finite", i,
                               (double)out[i]);
            out[i] = logf(-out[i]);
        }
    return SVC_OK;
}

svc_err_t eng_q4nx_tensor_f32(const eng_q4nx_t *q, const char *hf_name, size_t rank,
                              const uint64_t *dims, float *out, char *errstr, size_t errstr_size) {
    eng_q4nx_xform_t xf = ENG_Q4NX_X_NONE;
    rd_t             r = {q, hf_name, resolve(q, hf_name, &xf), errstr, errstr_size};
    if (!r.in) {
        char qn[NAME_MAX_LEN];
        if (eng_q4nx_name_from_hf(hf_name, qn, sizeof qn, &xf))
            svc_errf(errstr, errstr_size,
                     "q4nx \"%s\": \"%s\" is not a Qwen3.5 text- or vision-tower name",
                     eng_st_path(q->st), hf_name);
        else
            svc_errf(errstr, errstr_size, "q4nx \"%s\": tensor \"%s\" (HF \"%s\") is missing",
                     eng_st_path(q->st), qn, hf_name);
        return SVC_ERR_INVALID;
    }
    uint64_t numel = 1;
    for (size_t i = 0; i < rank; i++)
        if (rank > ENG_ST_MAX_RANK || __builtin_mul_overflow(numel, dims[i], &numel) ||
            numel > SIZE_MAX / sizeof(float))
            return rd_fail(&r, SVC_ERR_INVALID, "requested shape is too large");
    /* a tiled vision weight asked for as its logical matrix (§5); asked
     * for as stored, or stored untiled, it is a plain tensor */
    if (r.in->xform == ENG_Q4NX_X_VTILE && r.in->st->rank == 3 && rank == 2 &&
        !eng_q4nx_kind_packed(r.in->kind))
        return eng_q4nx_vision_read(eng_st_path(q->st), r.in->st, q->vis_mm_n, q->vis_mm_k, dims,
                                    out, errstr, errstr_size);
    svc_err_t err = eng_q4nx_kind_packed(r.in->kind) ? rd_packed(&r, rank, dims, out)
                                                     : rd_plain(&r, rank, dims, out);
    /* The stored tensor's own transform applies: the tied lm_head and the
     * BF16 alpha/beta copies carry none. */
    return err ? err : rd_values(&r, out, (size_t)numel);
}

svc_err_t eng_q4nx_tensor_groups(const eng_q4nx_t *q, const char *hf_name, const uint64_t dims[2],
                                 uint8_t **u, float **d, float **m, char *errstr,
                                 size_t errstr_size) {
    *u = NULL, *d = NULL, *m = NULL;
    eng_q4nx_xform_t xf = ENG_Q4NX_X_NONE;
    rd_t             r = {q, hf_name, resolve(q, hf_name, &xf), errstr, errstr_size};
    /* what the values path would transform further is not a projection */
    if (!r.in || !eng_q4nx_kind_packed(r.in->kind) || r.in->xform == ENG_Q4NX_X_PLUS1 ||
        r.in->xform == ENG_Q4NX_X_NEG_EXP)
        return SVC_ERR_UNSUPPORTED;
    eng_q4nx_kind_t   kind;
    eng_q4nx_raster_t ra;
    size_t            hd;
    svc_err_t         err = rd_grid(&r, 2, dims, &kind, &ra, &hd);
    if (err)
        return err;
    const eng_st_tensor_t *t = r.in->st;
    size_t R = (size_t)dims[0], K = (size_t)dims[1], G = (K + ENG_Q4NX_GROUP - 1) / ENG_Q4NX_GROUP;
    uint8_t *ou = malloc(R * K), *tu = hd ? malloc(R * K) : ou;
    float   *od = malloc(R * G * sizeof *od), *td = hd ? malloc(R * G * sizeof *td) : od;
    float   *om = malloc(R * G * sizeof *om), *tm = hd ? malloc(R * G * sizeof *tm) : om;
    if (!ou || !od || !om || !tu || !td || !tm) {
        if (hd)
            free(tu), free(td), free(tm);
        free(ou), free(od), free(om);
        return rd_fail(&r, SVC_ERR_NOMEM, "out of memory for a %zu x %zu matrix's codes", R, K);
    }
    /* a q_proj is decoded in stored row order, then regrouped (§2.2) */
    eng_q4nx_decode_groups_ref(kind, ra, t->data, t->shape[0], t->shape[1], R, K, tu, td, tm);
    if (hd) {
        regroup_rows(tu, R, hd, K, ou);
        regroup_rows(td, R, hd, G * sizeof *td, od);
        regroup_rows(tm, R, hd, G * sizeof *tm, om);
        free(tu), free(td), free(tm);
    }
    *u = ou, *d = od, *m = om;
    return SVC_OK;
}
