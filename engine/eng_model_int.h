/*
 * eng_model_int.h -- private: the loaded Qwen3.5 text tower (eng_model.c
 * loads it, eng_forward.c runs it).
 *
 * Every weight is owned and fp32. The projections (nn.Linear weights,
 * (out, in) in the checkpoint) are packed at load for npu_matmul_packed
 * (npu.h: npu_wpack_t, the plain copy freed, so a weight is held once);
 * the rest are contiguous arrays in the checkpoint's torch layout.
 * eng_model_free frees them all. Shapes are given next to each field.
 */
#ifndef D3STREAM_ENG_MODEL_INT_H
#define D3STREAM_ENG_MODEL_INT_H

#include "engine.h"
#include "npu.h"

typedef enum eng_layer_kind {
    ENG_LAYER_LINEAR = 0, /* "linear_attention": Gated DeltaNet */
    ENG_LAYER_FULL = 1,   /* "full_attention": gated softmax attention */
} eng_layer_kind_t;

/* text_config of config.json, plus what follows from it. */
typedef struct eng_model_cfg {
    size_t hidden;   /* hidden_size, H */
    size_t n_layers; /* num_hidden_layers, L */
    size_t inter;    /* intermediate_size, I */
    size_t vocab;    /* vocab_size */
    /* full attention */
    size_t n_heads;  /* num_attention_heads */
    size_t n_kv;     /* num_key_value_heads */
    size_t head_dim; /* head_dim */
    size_t rot_dim;  /* head_dim * partial_rotary_factor (even) */
    float  theta;    /* rope_theta */
    int    section[3];
    bool   interleaved; /* mrope_interleaved */
    bool   attn_gate;   /* attn_output_gate (default true): q_proj is 2x wide */
    /* Gated DeltaNet */
    size_t            lin_nk, lin_nv; /* linear_num_key_heads, linear_num_value_heads */
    size_t            lin_dk, lin_dv; /* linear_key_head_dim, linear_value_head_dim */
    size_t            conv_k;         /* linear_conv_kernel_dim */
    float             eps;            /* rms_norm_eps */
    eng_layer_kind_t *kinds;          /* (L), owned */
} eng_model_cfg_t;

/* Derived widths of the Gated DeltaNet: key_dim = nk * dk, value_dim =
 * nv * dv, conv channels = 2 * key_dim + value_dim (q, k, v in order). */
static inline size_t eng_lin_key_dim(const eng_model_cfg_t *c) {
    return c->lin_nk * c->lin_dk;
}
static inline size_t eng_lin_value_dim(const eng_model_cfg_t *c) {
    return c->lin_nv * c->lin_dv;
}
static inline size_t eng_lin_conv_dim(const eng_model_cfg_t *c) {
    return 2 * eng_lin_key_dim(c) + eng_lin_value_dim(c);
}
/* Rows of q_proj: n_heads * head_dim, doubled with the output gate. */
static inline size_t eng_q_rows(const eng_model_cfg_t *c) {
    return c->n_heads * c->head_dim * (c->attn_gate ? 2 : 1);
}

typedef struct eng_layer {
    eng_layer_kind_t kind;
    float           *in_norm;   /* input_layernorm (H), (1 + w) */
    float           *post_norm; /* post_attention_layernorm (H), (1 + w) */
    npu_wpack_t     *mlp_gate;  /* (I, H) */
    npu_wpack_t     *mlp_up;    /* (I, H) */
    npu_wpack_t     *mlp_down;  /* (H, I) */
    /* linear_attention */
    npu_wpack_t *in_qkv;   /* (2 * key_dim + value_dim, H) */
    npu_wpack_t *in_z;     /* (value_dim, H) */
    npu_wpack_t *in_b;     /* (nv, H) */
    npu_wpack_t *in_a;     /* (nv, H) */
    float       *conv;     /* (conv channels, K), conv1d.weight (C, 1, K) squeezed */
    float       *dt_bias;  /* (nv) */
    float       *a_log;    /* (nv) */
    float       *lin_norm; /* (dv), plain w (gated norm) */
    npu_wpack_t *out_proj; /* (H, value_dim) */
    /* full_attention */
    npu_wpack_t *q_proj; /* (eng_q_rows, H): per head [query(hd), gate(hd)] when gated */
    npu_wpack_t *k_proj; /* (n_kv * hd, H) */
    npu_wpack_t *v_proj; /* (n_kv * hd, H) */
    npu_wpack_t *o_proj; /* (H, n_heads * hd) */
    float       *q_norm; /* (hd), (1 + w) */
    float       *k_norm; /* (hd), (1 + w) */
} eng_layer_t;

/* Where the weights came from (eng_model_format). */
typedef enum eng_model_fmt {
    ENG_MODEL_SAFETENSORS = 0,
    ENG_MODEL_Q4NX_GEN_A = 1,
    ENG_MODEL_Q4NX_GEN_B = 2,
} eng_model_fmt_t;

struct eng_model {
    eng_model_cfg_t    cfg;
    eng_model_fmt_t    format;
    float             *embed;      /* (vocab, H), or NULL when embed16 holds it */
    uint16_t          *embed16;    /* (vocab, H) bf16 bits when every value is a bf16, else NULL */
    int8_t            *embed8;     /* (vocab, H) codes when every block of 32 is codes x a scale */
    float             *embed8_s;   /* (vocab, H / 32) those scales (embed8 only) */
    float             *final_norm; /* (H), (1 + w) */
    eng_layer_t       *layers;     /* (L) */
    float             *readout;    /* (255, H); bf16 values when readout_bf16 */
    bool               readout_bf16; /* decision_config readout_dtype bfloat16 (SPEC d.5) */
    uint64_t           n_params;     /* elements of the text tensors loaded (not the readout) */
    struct eng_vision *vision;       /* the vision tower, or NULL (eng_vision_int.h) */
    /* Profiles (eng_model_profile): fast_view is this model under the fast
     * profile, a copy of this struct sharing every weight, whose passes
     * take the packs' fast companions (npu_matmul_packed_fast); fast is
     * true in it. Only the loaded model owns anything (and fast_view). */
    bool                    fast;
    struct eng_model       *fast_view;
    const struct eng_model *base; /* in fast_view: the loaded model; else NULL */
};

struct eng_q4nx;
struct eng_st_set;
struct eng_vision;

/* ---- loading (eng_model.c; the vision tower's loader uses it too) ----- */

/* Where tensors are taken from: a safetensors set (model.safetensors or
 * its shards) or an opened q4nx file, with the name prefix to prepend. */
typedef struct eng_ld {
    struct eng_st_set     *set; /* one of set and q */
    const struct eng_q4nx *q;
    const char            *file; /* "model.safetensors", "model.safetensors.index.json" */
    const char            *path;
    const char            *prefix;
    char                  *errstr;
    size_t                 errstr_size;
    uint64_t              *numel; /* optional: adds the elements of every tensor taken */
    bool                   fp32; /* eng_ld_pack: every matrix as fp32 values (npu_wpack_new_fp32) */
} eng_ld_t;

/* Fails with err and `<file> "<path>": <message>` in ld->errstr. */
SVC_FMT(5, 6)
svc_err_t eng_ld_fail_in(const eng_ld_t *ld, const char *file, const char *path, svc_err_t err,
                         const char *fmt, ...);
#define eng_ld_fail(ld, err, ...) eng_ld_fail_in((ld), (ld)->file, (ld)->path, (err), __VA_ARGS__)

/* Finds prefix + suffix, checks dtype and shape (dims, rank entries) and
 * converts it into a new fp32 array *dst, owned by the caller. */
SVC_WUR svc_err_t eng_ld_take(const eng_ld_t *ld, const char *suffix, size_t rank,
                              const uint64_t *dims, float **dst);
/* As eng_ld_take, into caller memory w (the product of dims floats). */
SVC_WUR svc_err_t eng_ld_take_into(const eng_ld_t *ld, const char *suffix, size_t rank,
                                   const uint64_t *dims, float *w);
/* Shorthands: a vector (n), a matrix (r, c). */
SVC_WUR svc_err_t eng_ld_vec(const eng_ld_t *ld, const char *suffix, size_t n, float **dst);
SVC_WUR svc_err_t eng_ld_mat(const eng_ld_t *ld, const char *suffix, size_t r, size_t c,
                             float **dst);

/* As eng_ld_take, then packed for npu_matmul_packed as a (dims[0], the
 * product of the rest) matrix: the fp32 copy goes to the pack (kept or
 * freed there), so a weight is held once at rest. A q4nx matrix stored as
 * Q4/Q8 tiles is read as its group codes (eng_q4nx_tensor_groups) and
 * goes through npu_wpack_new_groups (the codes kept on VNNI without AMX,
 * else dequantised to eng_ld_take's values and packed as quantised); any
 * other weight bf16 cannot hold through npu_wpack_new_quantised (int8
 * tiles where the CPU has AMX-INT8), the rest through npu_wpack_new. */
SVC_WUR svc_err_t eng_ld_pack(const eng_ld_t *ld, const char *suffix, size_t rank,
                              const uint64_t *dims, npu_wpack_t **dst);

/* ---- the golden check's reference layers (eng_golden.c) ----
 * The package's weight file opened again, and each layer read from it as
 * fp32 values on oneDNN's sgemm (npu_wpack_new_fp32): the same decoder as
 * the load, none of the serving packs or their kernels. */
typedef struct eng_ref_src eng_ref_src_t;

/* Opens dir's weights as the load did (opts: the load's). */
SVC_WUR svc_err_t eng_ref_open(const char *dir, const eng_load_opts_t *opts, eng_ref_src_t **out,
                               char *errstr, size_t errstr_size);
/* Layer i of m's shape into *l (free with eng_ref_layer_free). */
SVC_WUR svc_err_t eng_ref_layer(eng_ref_src_t *r, const eng_model_t *m, size_t i, eng_layer_t *l,
                                char *errstr, size_t errstr_size);
void              eng_ref_layer_free(eng_layer_t *l);
/* Block i of m's vision tower into *b (free with eng_vision_block_free);
 * SVC_ERR_INVALID when the package has none. */
struct eng_vis_block;
SVC_WUR svc_err_t eng_ref_vision_block(eng_ref_src_t *r, const eng_model_t *m, size_t i,
                                       struct eng_vis_block *b, char *errstr, size_t errstr_size);
void              eng_ref_close(eng_ref_src_t *r); /* NULL is a no-op */
/* Tensor prefix + suffix of the text tower (vision: of the vision tower)
 * as fp32, shape checked (eng_ld_take_into), into dst (the product of
 * dims floats); SVC_ERR_INVALID for vision when the package has none. */
SVC_WUR svc_err_t eng_ref_take(eng_ref_src_t *r, bool vision, const char *suffix, size_t rank,
                               const uint64_t *dims, float *dst, char *errstr, size_t errstr_size);
/* The safetensors set the weights are read from (NULL for a model.q4nx),
 * valid until eng_ref_close, and the prefix of the text (vision) tower's
 * names in it (vision: NULL without a tower). */
const struct eng_st_set *eng_ref_set(const eng_ref_src_t *r);
const char              *eng_ref_prefix(const eng_ref_src_t *r, bool vision);

/* An upstream package's text tower without its layers, for passes whose
 * layers come from elsewhere (eng_fwd_reference: `quantize`): config,
 * embedding and final norm loaded as eng_model_load does, every layer
 * only its kind (no weights), no readout, no vision tower. Free with
 * eng_model_free. SVC_ERR_UNSUPPORTED when dir has no model.safetensors
 * (or index); else eng_model_load's errors. */
SVC_WUR svc_err_t eng_model_load_shell(const char *dir, eng_model_t **out, char *errstr,
                                       size_t errstr_size);

/* Row id of the embedding (embed or embed16) as fp32 into out (H). */
void eng_model_embed_row(const eng_model_t *m, int32_t id, float *out);

/**
 * @brief Reads dir/config.json into *cfg (eng_model_cfg.c): the Hugging Face
 *   layout (text_config object) or FastFlowLM's, whose text keys sit at the
 *   top level (Q4NX.md §6).
 * @param q the opened model.q4nx, or NULL: where FastFlowLM's config leaves
 *   the layer kinds out, they are read off its tensors.
 * @returns SVC_OK; SVC_ERR_FORMAT with one line naming the file and key;
 *   SVC_ERR_NOMEM. cfg->kinds is owned by the caller on success and failure.
 */
SVC_WUR svc_err_t eng_model_cfg_load(const char *dir, const struct eng_q4nx *q,
                                     eng_model_cfg_t *cfg, char *errstr, size_t errstr_size);

#endif /* D3STREAM_ENG_MODEL_INT_H */
