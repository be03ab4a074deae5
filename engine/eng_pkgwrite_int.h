/*
 * eng_pkgwrite_int.h -- private: the pieces of `make-package`
 * (eng_pkgwrite.c weights, eng_pkgwrite_tok.c tokenizer and codes,
 * eng_pkgwrite_meta.c the JSON files and the manifest,
 * eng_pkgwrite_q4nx.c the D3-Nano-NPU2 file set, eng_pkgwrite_vision.c
 * the vision tower every size gets).
 */
#ifndef D3STREAM_ENG_PKGWRITE_INT_H
#define D3STREAM_ENG_PKGWRITE_INT_H

#include "engine.h"
#include "eng_util_int.h"

#include <jansson.h>

#define PW_TEXT_PREFIX   "model.language_model."
#define PW_VISION_PREFIX "model.visual."
#define PW_MAX_RANK      5 /* patch_embed.proj.weight [hidden, 3, T, P, P] */

/* One text_config; see the table in eng_pkgwrite.c for where each value
 * comes from. */
typedef struct pw_shape {
    const char *name; /* "tiny", "lite", "nano" */
    const char *real; /* the checkpoint whose shapes these are */
    size_t      hidden, n_layers, inter;
    size_t      n_heads, n_kv, head_dim;
    size_t      lin_nk, lin_nv, lin_dk, lin_dv, conv_k;
    size_t      vocab;      /* the real checkpoint's vocab_size (a floor) */
    size_t      max_pos;    /* max_position_embeddings */
    size_t      max_length; /* decision_config.max_length */
    int         mrope[3];   /* mrope_section, sums to head_dim * 0.25 / 2 */
    bool        every4;     /* layer i is full iff i % 4 == 3; else tiny's pattern */
    bool        tied;       /* tie_word_embeddings of the real checkpoint */
    const bool *full;       /* optional (NULL): layer i is full attention iff full[i]
                               (a package's own layer_types, `quantize`) */
} pw_shape_t;

const pw_shape_t *pw_shape_get(eng_make_size_t size);
bool              pw_layer_is_full(const pw_shape_t *s, size_t i);

typedef enum pw_init {
    PW_LINEAR,    /* [out, in]: N(0, 0.9 / sqrt(in)), ~0.02 at nano's widths */
    PW_EMBED,     /* N(0, 0.1) */
    PW_NORM_1P,   /* (1 + w) RMSNorms: N(0, 0.1), so the gain is near 1 */
    PW_NORM_GATE, /* linear_attn.norm multiplies by plain w: 1 + N(0, 0.1) */
    PW_CONV,      /* N(0, 0.3) as the golden script */
    PW_A_LOG,     /* U(-0.69, 2.08) = log U(0.5, 8): decay rates of the golden script */
    PW_DT_BIAS,   /* U(-1.5, 1.0) */
    PW_BIAS,      /* vision biases (linear and LayerNorm): N(0, 0.02) */
    PW_LN_GAIN,   /* vision LayerNorm weights: 1 + N(0, 0.1) */
} pw_init_t;
/* PW_LINEAR of rank > 2 (patch_embed) takes in = the product of dims[1..]. */

typedef struct pw_tensor {
    char      name[128];
    size_t    rank;
    uint64_t  dims[PW_MAX_RANK];
    pw_init_t init;
} pw_tensor_t;

typedef struct pw_list {
    pw_tensor_t *v;
    size_t       n, cap;
} pw_list_t;

/* Every text-tower tensor of shape s with vocab rows, sorted by name (the
 * safetensors convention); the caller frees l->v. */
SVC_WUR svc_err_t pw_tensors(const pw_shape_t *s, size_t vocab, pw_list_t *l);
uint64_t          pw_numel(const pw_tensor_t *t);

/* The vision tower of a size (eng_pkgwrite_vision.c has the sources). */
typedef struct pw_vision {
    size_t      depth, hidden, heads, inter;
    size_t      patch, temporal, merge, in_ch;
    size_t      out_hidden; /* = the text hidden size */
    size_t      npos;       /* num_position_embeddings, a square */
    const char *act;        /* hidden_act */
    size_t      mm_n, mm_k; /* vision_weight.q4nx tiles (Q4NX.md §5) */
} pw_vision_t;

const pw_vision_t *pw_vision_get(eng_make_size_t size);
/* Every vision tensor (SPEC e.6 names, "model.visual."), sorted by name,
 * appended to l. */
SVC_WUR svc_err_t pw_vision_tensors(const pw_vision_t *v, pw_list_t *l);
/* Elements of the vision tower of size (MODEL_MANIFEST parameters.vision). */
uint64_t pw_vision_params(eng_make_size_t size);

/* ---- the package being written ---- */

typedef struct pw_ctx {
    const eng_make_opts_t *opts;
    const pw_shape_t      *shape;
    size_t                 vocab;                 /* config.json vocab_size */
    eng_tokenizer_t       *tok;                   /* the written tokenizer, UPSTREAM mode */
    char                   codes[ENG_N_CODES][3]; /* "A".."Z", "AA".. */
    int32_t                code_ids[ENG_N_CODES];
    const char            *twin_of; /* the q4nx package this one is the twin of, or NULL */
    char                  *errstr;
    size_t                 errstr_size;
} pw_ctx_t;

struct eng_q4nx_writer;
struct pw_fill;
/* Adds every tensor of l to w (eng_q4nx_writer_add, kinds chosen by name),
 * its values from fill, or generated (pw_gen_f32) when fill is NULL;
 * progress: report through opts->progress every 5%. */
SVC_WUR svc_err_t pw_q4nx_add_list(const pw_ctx_t *c, struct eng_q4nx_writer *w, const pw_list_t *l,
                                   const struct pw_fill *fill, bool progress);
/* Writes w to out_dir/file. */
SVC_WUR svc_err_t pw_q4nx_finish(const pw_ctx_t *c, struct eng_q4nx_writer *w, const char *file);
/* Both: every tensor of l generated, then written. */
SVC_WUR svc_err_t pw_q4nx_write_list(const pw_ctx_t *c, struct eng_q4nx_writer *w,
                                     const pw_list_t *l, const char *file, bool progress);
/* MANIFEST.sha256 as sha256sum(1) writes it ("<hex>  <name>\n") over the n
 * files of out_dir named, in the order given. */
SVC_WUR svc_err_t pw_sha256sum(const pw_ctx_t *c, const char *const *files, size_t n);

/* mkdir -p dir. */
SVC_WUR svc_err_t pw_mkdirs(const char *dir, char *errstr, size_t n);
/* Writes n bytes to dir/name (replacing it). */
SVC_WUR svc_err_t pw_write_file(const pw_ctx_t *c, const char *name, const void *p, size_t n);
/* Dumps j (not consumed) to dir/name with 2-space indent and a final newline. */
SVC_WUR svc_err_t pw_write_json(const pw_ctx_t *c, const char *name, const json_t *j, size_t flags);

/* eng_pkgwrite_tok.c: writes (or copies) tokenizer.json and
 * tokenizer_config.json, loads them in UPSTREAM mode into c->tok and picks
 * the 255 codes (SPEC c.5). */
SVC_WUR svc_err_t pw_tokenizer(pw_ctx_t *c);

/* eng_pkgwrite.c: model.safetensors and readout.safetensors. */
SVC_WUR svc_err_t pw_weights(const pw_ctx_t *c);
SVC_WUR svc_err_t pw_readout(const pw_ctx_t *c);

/* Tensor t's values exactly as model.safetensors of the same seed holds
 * them (BF16-rounded), whole, into out (pw_numel(t) floats). */
void pw_gen_f32(const pw_ctx_t *c, const pw_tensor_t *t, float *out);

/* Where pw_st_write takes a tensor's values from instead of the seeded
 * generator: the whole tensor into out, then written as F32. */
typedef struct pw_fill {
    svc_err_t (*fn)(const pw_tensor_t *t, float *out, void *user, char *errstr, size_t errstr_size);
    void *user;
} pw_fill_t;

/* Writes dir/name as safetensors holding tensors v[0..n-1] (sorted by name):
 * seeded values (BF16, or F32 times scale), or fill's (F32) when given. */
SVC_WUR svc_err_t pw_st_write(const pw_ctx_t *c, const char *name, const pw_tensor_t *v, size_t n,
                              bool f32, double scale, const pw_fill_t *fill);

/* eng_pkgwrite_q4nx.c: the D3-Nano-NPU2 file set (model.q4nx,
 * vision_weight.q4nx, FastFlowLM config.json, MANIFEST.sha256) after the
 * tokenizer, and the --twin package. */
SVC_WUR svc_err_t pw_q4nx_package(pw_ctx_t *c);

/* eng_pkgwrite_meta.c: config.json, decision_config.json, chat_template.jinja,
 * README.md (before the manifest) and MODEL_MANIFEST.json (last). For a
 * q4nx package (c->opts->format) config.json has FastFlowLM's layout and the
 * README says so; for a twin (c->twin_of) the README says what it is. */
SVC_WUR svc_err_t pw_meta(const pw_ctx_t *c);
/* FastFlowLM's config.json object (Q4NX.md §6) from a Hugging Face
 * text_config (flattened to the top level) and, for a tower, its
 * vision_config of FastFlowLM keys; both references are stolen (NULL
 * text_config, or out of memory: NULL). */
json_t *pw_flm_config(json_t *text_config, json_t *vision_flm);
/* The Hugging Face text_config object of c's shape (new reference, NULL
 * when out of memory). */
json_t *pw_text_config(const pw_ctx_t *c);
/* image/video/vision token ids into root when the tokenizer has them. */
SVC_WUR svc_err_t pw_special_ids(const pw_ctx_t *c, json_t *root);
SVC_WUR svc_err_t pw_manifest(const pw_ctx_t *c);

/* eng_pkgwrite_vision.c: config.json's vision_config, Hugging Face keys
 * (new reference, NULL when out of memory) */
json_t *pw_vision_config_hf(const pw_ctx_t *c);
/* ... and FastFlowLM's QWEN3_5_* keys (Q4NX.md §6) of tower v with its
 * tile sizes */
json_t *pw_vision_config_flm(const pw_vision_t *v);
/* preprocessor_config.json (SPEC e.7) */
SVC_WUR svc_err_t pw_preprocessor(const pw_ctx_t *c);
/* The tokenizer has <|image_pad|>, <|video_pad|>, <|vision_start|> and
 * <|vision_end|> (config.json's *_token_id must name them, SPEC e.7). */
SVC_WUR svc_err_t pw_vision_tokens(const pw_ctx_t *c);
/* vision_weight.q4nx: every vision tensor (BF16, the same values
 * model.safetensors of the seed holds), tiled per Q4NX.md §5. */
SVC_WUR svc_err_t pw_vision_q4nx(const pw_ctx_t *c);

#endif /* D3STREAM_ENG_PKGWRITE_INT_H */
