/*
 * eng_pkgwrite_int.h -- private: the pieces of `make-package`
 * (eng_pkgwrite.c weights, eng_pkgwrite_tok.c tokenizer and codes,
 * eng_pkgwrite_meta.c the JSON files and the manifest).
 */
#ifndef D3STREAM_ENG_PKGWRITE_INT_H
#define D3STREAM_ENG_PKGWRITE_INT_H

#include "engine.h"

#include <jansson.h>

#define PW_TEXT_PREFIX "model.language_model."
#define PW_MAX_RANK    3

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
} pw_shape_t;

const pw_shape_t *pw_shape_get(eng_make_size_t size);
bool              pw_layer_is_full(const pw_shape_t *s, size_t i);

/* ---- the package being written ---- */

typedef struct pw_ctx {
    const eng_make_opts_t *opts;
    const pw_shape_t      *shape;
    size_t                 vocab;                 /* config.json vocab_size */
    eng_tokenizer_t       *tok;                   /* the written tokenizer, UPSTREAM mode */
    char                   codes[ENG_N_CODES][3]; /* "A".."Z", "AA".. */
    int32_t                code_ids[ENG_N_CODES];
    char                  *errstr;
    size_t                 errstr_size;
} pw_ctx_t;

/* dir/name, malloc'd (NULL when out of memory). */
char *pw_path(const char *dir, const char *name);
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

/* eng_pkgwrite_meta.c: config.json, decision_config.json, chat_template.jinja,
 * README.md (before the manifest) and MODEL_MANIFEST.json (last). */
SVC_WUR svc_err_t pw_meta(const pw_ctx_t *c);
SVC_WUR svc_err_t pw_manifest(const pw_ctx_t *c);

#endif /* D3STREAM_ENG_PKGWRITE_INT_H */
