/*
 * eng_pkgwrite_meta.c -- the JSON and text files of a synthetic package
 * (SPEC e.1-e.4): config.json, decision_config.json, chat_template.jinja,
 * README.md and, last, MODEL_MANIFEST.json over all of them.
 *
 * Layout and key choice mirror tests/fixtures/tiny-upstream (written by
 * tests/tools/gen_tower_golden.py from Transformers' own config writer).
 * Hashes and the identity come from eng_manifest_int.h, the same code that
 * verifies them, so a package we write always verifies.
 */
#include "eng_manifest_int.h"
#include "eng_pkgwrite_int.h"

#include <sys/stat.h>

svc_err_t pw_write_json(const pw_ctx_t *c, const char *name, const json_t *j, size_t flags) {
    /* 15 significant digits print 1e-06 as 1e-06, not 9.9999999999999995e-07 */
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(15) | flags) : NULL;
    if (!text)
        return SVC_ERR_NOMEM;
    size_t n = strlen(text);
    char  *nl = realloc(text, n + 2);
    if (!nl) {
        free(text);
        return SVC_ERR_NOMEM;
    }
    nl[n] = '\n';
    nl[n + 1] = '\0';
    svc_err_t err = pw_write_file(c, name, nl, n + 1);
    free(nl);
    return err;
}

/* ---- config.json ---- */

static json_t *layer_types(const pw_shape_t *s) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < s->n_layers; i++)
        if (json_array_append_new(
                a, json_string(pw_layer_is_full(s, i) ? "full_attention" : "linear_attention"))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *pw_text_config(const pw_ctx_t *c) {
    const pw_shape_t *s = c->shape;
    json_t           *rope = json_pack("{sbs[iii]sfsfss}", "mrope_interleaved", 1, "mrope_section",
                                       s->mrope[0], s->mrope[1], s->mrope[2], "partial_rotary_factor", 0.25,
                                       "rope_theta", 1e7, "rope_type", "default");
    json_t           *tc = json_pack(
                  "{sbsfsnsssnsIsssIsfsIsosIsIsIsIsIsIsssIsIsIsnsfsosbsbsI}", "attention_bias", 0,
                  "attention_dropout", 0.0, "bos_token_id", "dtype", "bfloat16", "eos_token_id", "head_dim",
                  (json_int_t)s->head_dim, "hidden_act", "silu", "hidden_size", (json_int_t)s->hidden,
                  "initializer_range", 0.02, "intermediate_size", (json_int_t)s->inter, "layer_types",
                  layer_types(s), "linear_conv_kernel_dim", (json_int_t)s->conv_k, "linear_key_head_dim",
                  (json_int_t)s->lin_dk, "linear_num_key_heads", (json_int_t)s->lin_nk,
                  "linear_num_value_heads", (json_int_t)s->lin_nv, "linear_value_head_dim",
                  (json_int_t)s->lin_dv, "max_position_embeddings", (json_int_t)s->max_pos, "model_type",
                  "qwen3_5_text", "num_attention_heads", (json_int_t)s->n_heads, "num_hidden_layers",
                  (json_int_t)s->n_layers, "num_key_value_heads", (json_int_t)s->n_kv, "pad_token_id",
                  "rms_norm_eps", 1e-6, "rope_parameters", rope, "tie_word_embeddings", s->tied, "use_cache",
                  1, "vocab_size", (json_int_t)c->vocab);
    if (tc && json_object_set_new(tc, "attn_output_gate", json_true())) {
        json_decref(tc);
        return NULL;
    }
    if (tc && s->every4 && json_object_set_new(tc, "full_attention_interval", json_integer(4))) {
        json_decref(tc);
        return NULL;
    }
    return tc;
}

/* image/video/vision token ids when the tokenizer has them. */
svc_err_t pw_special_ids(const pw_ctx_t *c, json_t *root) {
    static const char *const keys[][2] = {
        {"image_token_id", "<|image_pad|>"},
        {"video_token_id", "<|video_pad|>"},
        {"vision_start_token_id", "<|vision_start|>"},
        {"vision_end_token_id", "<|vision_end|>"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int32_t id = eng_tokenizer_token_id(c->tok, keys[i][1], strlen(keys[i][1]));
        if (id >= 0 && json_object_set_new(root, keys[i][0], json_integer(id)))
            return SVC_ERR_NOMEM;
    }
    return SVC_OK;
}

/* FastFlowLM's config.json (Q4NX.md §6): the HF config with text_config
 * flattened to the top level, plus FLM keys. Only keys §6 documents are
 * written, and of the FLM-only ones only those whose value is known:
 * vision_model_weight (non-empty: a VLM) and vision_config with the
 * QWEN3_5_* keys (eng_pkgwrite_vision.c), no addr_qk / addr_kv (engine
 * memory layout, 2B values unconfirmed).
 * model_type "qwen3_5_text": §6 leaves qwen3_5 vs qwen3_5_text open, and
 * the flattened keys are the text model's. rope_theta is written both at
 * the top level (FLM's LM_Config reads it there, else 0) and in
 * rope_parameters. flm_version: D3-NANO-NPU2.md's "FastFlowLM 1.0.11 or
 * later". */
json_t *pw_flm_config(json_t *text_config, json_t *vision_flm) {
    json_t *root = text_config;
    if (!root) {
        json_decref(vision_flm);
        return NULL;
    }
    const json_t *theta = json_object_get(json_object_get(root, "rope_parameters"), "rope_theta");
    json_t       *arch = json_pack("[s]", "Qwen3_5ForConditionalGeneration");
    if (!arch || json_object_set_new(root, "architectures", arch) ||
        json_object_set_new(root, "model_type", json_string("qwen3_5_text")) ||
        (json_is_number(theta) &&
         json_object_set_new(root, "rope_theta", json_real(json_number_value(theta)))) ||
        json_object_set_new(root, "flm_version", json_string("1.0.11")) ||
        /* Gen-B keeps one table, lm_head, for both ends (Q4NX.md §0.2) */
        json_object_set_new(root, "tie_word_embeddings", json_true())) {
        json_decref(root);
        json_decref(vision_flm);
        return NULL;
    }
    if (vision_flm &&
        (json_object_set_new(root, "vision_model_weight", json_string("vision_weight.q4nx")) ||
         json_object_set_new(root, "vision_config", vision_flm))) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static svc_err_t write_config(const pw_ctx_t *c) {
    json_t *root =
        c->opts->format == ENG_MAKE_Q4NX
            ? pw_flm_config(pw_text_config(c), pw_vision_config_flm(pw_vision_get(c->opts->size)))
            : json_pack("{s[s]sssssosbssso}", "architectures", "Qwen3_5ForConditionalGeneration",
                        "dtype", "bfloat16", "model_type", "qwen3_5", "text_config",
                        pw_text_config(c), "tie_word_embeddings", c->shape->tied,
                        "transformers_version", "5.24.0", "vision_config", pw_vision_config_hf(c));
    svc_err_t err = root ? pw_special_ids(c, root) : SVC_ERR_NOMEM;
    if (!err)
        err = pw_write_json(c, "config.json", root, JSON_SORT_KEYS);
    json_decref(root);
    return err;
}

/* ---- decision_config.json (SPEC e.2) ---- */

static json_t *decision_json(const pw_ctx_t *c) {
    json_t *codes = json_array(), *ids = json_array();
    for (size_t i = 0; codes && ids && i < ENG_N_CODES; i++)
        if (json_array_append_new(codes, json_string(c->codes[i])) ||
            json_array_append_new(ids, json_integer(c->code_ids[i]))) {
            json_decref(codes);
            codes = NULL;
        }
    char base[64], rev[32];
    snprintf(base, sizeof base, "d3stream/synthetic-%s", c->shape->name);
    snprintf(rev, sizeof rev, "seed-%llu", (unsigned long long)c->opts->seed);
    return json_pack("{sisssssssssososfsssssIss}", "format_version", 1, "format_id",
                     "d3-code-readout-v1", "prompt", "d3", "base_model", base, "revision", rev,
                     "codes", codes, "token_ids", ids, "temperature", 1.0, "attention_mode",
                     "noncausal_full_attention", "pooling", "last", "max_length",
                     (json_int_t)c->shape->max_length, "readout_dtype", "float32");
}

/* ---- chat_template.jinja and README.md ---- */

/* Not one of SPEC e.5's pinned templates: d3stream never executes the
 * template, and a synthetic package should not pass for a released one. */
static const char CHAT_TEMPLATE[] =
    "{#- d3stream synthetic package: a minimal ChatML template, never executed by d3stream.\n"
    "    Its SHA-256 is not one of the pinned decision3 templates (SPEC e.5). -#}\n"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor -%}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif -%}\n";

/* What differs from the upstream layout, for the q4nx package and its twin. */
static svc_err_t readme_format(const pw_ctx_t *c, svc_buf_t *b) {
    if (c->opts->format == ENG_MAKE_Q4NX)
        return svc_buf_addf(
            b, "\nFormat: the D3-Nano-NPU2 file set. model.q4nx is FastFlowLM's Q4NX\n"
               "container (Gen-B: Q4_K projections, Q8 alpha/beta/out_proj and the tied\n"
               "embedding as lm_head), quantised from the same BF16 values the safetensors\n"
               "package of this seed holds; config.json has FastFlowLM's flattened layout;\n"
               "vision_weight.q4nx holds the vision tower in BF16, its matmul weights in\n"
               "FastFlowLM's MM_N x MM_K blocks (config.json vision_config VISION_MM_TILE_N/K);\n"
               "MANIFEST.sha256 (sha256sum format) lists every file.\n");
    if (c->twin_of)
        return svc_buf_addf(b,
                            "\nTwin: model.safetensors holds, as F32, the dequantised weights of "
                            "the q4nx\npackage \"%s\", read back through d3stream's Q4NX reader, "
                            "so both\npackages load the same numbers.\n",
                            c->twin_of);
    return SVC_OK;
}

static svc_err_t write_readme(const pw_ctx_t *c) {
    svc_buf_t b;
    svc_buf_init(&b, 1 << 16);
    svc_err_t err = svc_buf_addf(
        &b,
        "# d3stream-synthetic-%s (seed %llu)\n\n"
        "**The weights are random. The answers of this package are meaningless.**\n\n"
        "Written by `d3stream make-package --size %s --seed %llu` so that d3stream, its demo\n"
        "and its benchmarks run on any machine without downloads. The text tower has the\n"
        "shapes of %s (hidden %zu, %zu layers, vocab %zu) with seeded random BF16 weights;\n"
        "so has the vision tower (depth %zu, width %zu); the readout is random too. Use it\n"
        "to measure speed and memory, never quality.\n\n"
        "Tokenizer: %s.\n\n"
        "chat_template.jinja is a placeholder whose SHA-256 is not one of the pinned\n"
        "decision3 templates, so d3stream warns about it. The manifest lists the\n"
        "SHA-256 of every file here; regenerate rather than edit.\n\n"
        "Licence: Apache-2.0.\n",
        c->shape->name, (unsigned long long)c->opts->seed, c->shape->name,
        (unsigned long long)c->opts->seed, c->shape->real, c->shape->hidden, c->shape->n_layers,
        c->vocab, pw_vision_get(c->opts->size)->depth, pw_vision_get(c->opts->size)->hidden,
        c->opts->tokenizer_dir ? "copied from the directory given with --tokenizer"
                               : "a small byte-level BPE written by d3stream (256 byte symbols, "
                                 "the answer codes\nA..Z and AA..IU as single tokens, a few "
                                 "English merges, the Qwen chat special tokens)");
    if (!err)
        err = readme_format(c, &b);
    if (!err)
        err = pw_write_file(c, "README.md", b.data, b.len);
    svc_buf_fini(&b);
    return err;
}

svc_err_t pw_meta(const pw_ctx_t *c) {
    svc_err_t err = write_config(c);
    json_t   *dc = err ? NULL : decision_json(c);
    if (!err)
        err = pw_write_json(c, "decision_config.json", dc, 0);
    json_decref(dc);
    if (!err)
        err = pw_write_file(c, "chat_template.jinja", CHAT_TEMPLATE, sizeof CHAT_TEMPLATE - 1);
    if (!err)
        err = pw_preprocessor(c);
    return err ? err : write_readme(c);
}

/* ---- MODEL_MANIFEST.json (SPEC e.3, e.4) ---- */

/* Every file written before the manifest, in name order. */
static const char *const FILES[] = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "decision_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "readout.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
};

/* Hashes each file once into v (the identity reuses them). */
static svc_err_t hash_files(const pw_ctx_t *c, eng_mf_verdict_t *v) {
    size_t n = sizeof FILES / sizeof FILES[0];
    v->files = calloc(n, sizeof *v->files);
    if (!v->files)
        return SVC_ERR_NOMEM;
    v->cap = n;
    for (size_t i = 0; i < n; i++) {
        eng_mf_file_t *f = &v->files[v->n];
        char          *path = eng_path_join(c->opts->out_dir, FILES[i]);
        if (!path || !(f->name = strdup(FILES[i]))) {
            free(path);
            return SVC_ERR_NOMEM;
        }
        v->n++;
        svc_err_t err = eng_sha256_file(path, f->actual, &f->bytes, c->errstr, c->errstr_size);
        free(path);
        if (err)
            return err;
    }
    return SVC_OK;
}

static bool is_identity_file(const char *name) {
    size_t n = strlen(name);
    return (n > 12 && strcmp(name + n - 12, ".safetensors") == 0) ||
           !strcmp(name, "tokenizer.json") || !strcmp(name, "tokenizer_config.json") ||
           !strcmp(name, "chat_template.jinja");
}

static json_t *manifest_json(const pw_ctx_t *c, const eng_mf_verdict_t *v, const char *model_sha) {
    json_t *sha = json_object(), *bytes = json_object(), *id_files = json_object();
    for (size_t i = 0; sha && bytes && id_files && i < v->n; i++) {
        const eng_mf_file_t *f = &v->files[i];
        json_object_set_new(sha, f->name, json_string(f->actual));
        json_object_set_new(bytes, f->name, json_integer((json_int_t)f->bytes));
        if (is_identity_file(f->name))
            json_object_set_new(id_files, f->name, json_string(f->actual));
    }
    uint64_t n_text = eng_make_text_params(c->opts->size, c->vocab);
    uint64_t n_vis = pw_vision_params(c->opts->size);
    uint64_t n_ro = (uint64_t)ENG_N_CODES * c->shape->hidden;
    char     name[64], comp[96];
    snprintf(name, sizeof name, "d3stream-synthetic-%s", c->shape->name);
    snprintf(comp, sizeof comp, "d3stream synthetic random weights (%s)", c->shape->name);
    return json_pack("{sssssssssssIs{sss[{ssss}]}s{sIsIsIsI}s{sssoso}soso}", "schema",
                     "d3-package-manifest/1", "model_name", name, "format_id", "d3-code-readout-v1",
                     "prompt", "d3", "attention_mode", "noncausal_full_attention",
                     "max_input_tokens", (json_int_t)c->shape->max_length, "licence", "spdx",
                     "Apache-2.0", "components", "component", comp, "licence", "Apache-2.0",
                     "parameters", "text", (json_int_t)n_text, "vision", (json_int_t)n_vis,
                     "readout", (json_int_t)n_ro, "loaded", (json_int_t)(n_text + n_vis + n_ro),
                     "identity", "model_sha256", model_sha, "files_sha256", id_files, "decision",
                     decision_json(c), "files_sha256", sha, "files_bytes", bytes);
}

svc_err_t pw_manifest(const pw_ctx_t *c) {
    eng_mf_verdict_t v;
    eng_mf_verdict_init(&v);
    char      model_sha[ENG_SHA256_HEX + 1];
    svc_err_t err = hash_files(c, &v);
    if (!err)
        err = eng_manifest_identity(c->opts->out_dir, &v, model_sha, c->errstr, c->errstr_size);
    json_t *mf = err ? NULL : manifest_json(c, &v, model_sha);
    if (!err)
        err = pw_write_json(c, "MODEL_MANIFEST.json", mf, 0);
    json_decref(mf);
    eng_mf_verdict_fini(&v);
    return err;
}
