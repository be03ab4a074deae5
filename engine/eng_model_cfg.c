/*
 * eng_model_cfg.c -- config.json of a package -> eng_model_cfg_t, in either
 * of the two layouts a decision3 package can carry:
 *
 *   Hugging Face (upstream, SPEC e.1): model_type "qwen3_5", the text
 *     tower's keys inside a "text_config" object.
 *   FastFlowLM (D3-Nano-NPU2, /work/shared/docs/Q4NX.md §6): the HF config
 *     with text_config flattened to the top level, plus FLM-only keys
 *     (flm_version, vision_model_weight, addr_*, ...) that the text tower
 *     does not need and that are ignored here. model_type "qwen3_5" or
 *     "qwen3_5_text" (§6 leaves open which).
 *
 * Key mapping for the FastFlowLM layout: §6 lists hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, head_dim, rms_norm_eps, vocab_size and the five
 * linear_* keys as read by FLM's LM_Config, so they are required under the
 * same names. The rest is only "[inferred]" or "[unconfirmed]" there and
 * has fallbacks:
 *   rope_theta        rope_parameters.rope_theta, else the top-level key
 *                     (§6: "10000000 if present at top level").
 *   partial_rotary_factor, mrope_*  rope_parameters when present; else
 *                     Qwen3.5's 0.25 and plain (non-M) RoPE: tensor shapes
 *                     cannot tell the rotary fraction.
 *   layer_types       if present; else full_attention_interval (layer i is
 *                     full iff i % n == n - 1, §2.1); else DERIVED FROM THE
 *                     TENSORS of model.q4nx: layer i is full attention iff
 *                     it holds self_attn.q_proj.weight (§2.5).
 *   attn_output_gate  default true, as in the HF layout.
 */
#include "eng_model_int.h"
#include "eng_q4nx_int.h"

#include <jansson.h>
#include <math.h>

#define CFG "config.json"

typedef struct cfg_ctx {
    const char       *path;
    const char       *where; /* "text_config." (HF) or "" (FastFlowLM, flattened) */
    bool              flm;
    const eng_q4nx_t *q; /* optional: tensors to read layer kinds off */
    char             *errstr;
    size_t            errstr_size;
} cfg_ctx_t;

SVC_FMT(2, 3) static svc_err_t cfg_fail(const cfg_ctx_t *c, const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(c->errstr, c->errstr_size, CFG " \"%s\": %s", c->path, msg);
    return SVC_ERR_FORMAT;
}

/* <key>: a positive integer (a count or a width). */
static svc_err_t cfg_size(const cfg_ctx_t *c, const json_t *tc, const char *key, size_t *out) {
    const json_t *v = json_object_get(tc, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 24))
        return cfg_fail(c, "%s%s must be a positive integer", c->where, key);
    *out = (size_t)json_integer_value(v);
    return SVC_OK;
}

/* A positive finite number, looked up in rope_parameters, then in
 * text_config itself (older configs keep rope_theta at the top). */
static svc_err_t cfg_rope_num(const cfg_ctx_t *c, const json_t *tc, const char *key, double dflt,
                              double *out) {
    const json_t *rp = json_object_get(tc, "rope_parameters");
    const json_t *v = json_is_object(rp) ? json_object_get(rp, key) : NULL;
    if (!v)
        v = json_object_get(tc, key);
    if (!v && dflt > 0) {
        *out = dflt;
        return SVC_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return cfg_fail(c, "%srope_parameters.%s must be a positive number", c->where, key);
    *out = json_number_value(v);
    return SVC_OK;
}

/* FastFlowLM layout without layer_types: full_attention_interval, else the
 * tensors (see the file comment). */
static svc_err_t cfg_kinds_derived(const cfg_ctx_t *c, const json_t *tc, eng_model_cfg_t *cfg) {
    const json_t *fi = json_object_get(tc, "full_attention_interval");
    if (fi && (!json_is_integer(fi) || json_integer_value(fi) < 1 ||
               json_integer_value(fi) > (json_int_t)cfg->n_layers))
        return cfg_fail(c, "full_attention_interval must be an integer in 1..%zu", cfg->n_layers);
    if (!fi && !c->q)
        return cfg_fail(c, "layer_types and full_attention_interval are both missing, and there "
                           "is no model.q4nx to read the layer kinds from");
    for (size_t i = 0; i < cfg->n_layers; i++) {
        if (fi) {
            size_t n = (size_t)json_integer_value(fi);
            cfg->kinds[i] = i % n == n - 1 ? ENG_LAYER_FULL : ENG_LAYER_LINEAR;
            continue;
        }
        char name[96];
        snprintf(name, sizeof name, "model.language_model.layers.%zu.self_attn.q_proj.weight", i);
        cfg->kinds[i] = eng_q4nx_find_hf(c->q, name) ? ENG_LAYER_FULL : ENG_LAYER_LINEAR;
    }
    return SVC_OK;
}

static svc_err_t cfg_layer_types(const cfg_ctx_t *c, const json_t *tc, eng_model_cfg_t *cfg) {
    const json_t *lt = json_object_get(tc, "layer_types");
    cfg->kinds = calloc(cfg->n_layers, sizeof *cfg->kinds);
    if (!cfg->kinds)
        return SVC_ERR_NOMEM;
    if (!lt && c->flm)
        return cfg_kinds_derived(c, tc, cfg);
    if (!json_is_array(lt) || json_array_size(lt) != cfg->n_layers)
        return cfg_fail(c, "%slayer_types must be an array of num_hidden_layers (%zu) strings",
                        c->where, cfg->n_layers);
    for (size_t i = 0; i < cfg->n_layers; i++) {
        const char *s = json_string_value(json_array_get(lt, i));
        if (s && strcmp(s, "linear_attention") == 0)
            cfg->kinds[i] = ENG_LAYER_LINEAR;
        else if (s && strcmp(s, "full_attention") == 0)
            cfg->kinds[i] = ENG_LAYER_FULL;
        else
            return cfg_fail(c,
                            "%slayer_types[%zu] is '%s', expected linear_attention "
                            "or full_attention",
                            c->where, i, s ? s : "(not a string)");
    }
    return SVC_OK;
}

/* rope: rotary dim = head_dim * partial_rotary_factor; mrope_section (if
 * given) must cover exactly rot_dim / 2 frequencies. */
static svc_err_t cfg_rope(const cfg_ctx_t *c, const json_t *tc, eng_model_cfg_t *cfg) {
    double theta, prf;
    /* HF's default factor is 1.0; FastFlowLM's config may drop
     * rope_parameters, and Qwen3.5 rotates a quarter of each head. */
    if (cfg_rope_num(c, tc, "rope_theta", 0, &theta) ||
        cfg_rope_num(c, tc, "partial_rotary_factor", c->flm ? 0.25 : 1.0, &prf))
        return SVC_ERR_FORMAT;
    double rd = (double)cfg->head_dim * prf;
    if (prf > 1.0 || rd != floor(rd) || ((size_t)rd % 2) != 0 || rd < 2)
        return cfg_fail(c,
                        "%srope_parameters.partial_rotary_factor %g gives no even "
                        "rotary dimension of head_dim %zu",
                        c->where, prf, cfg->head_dim);
    cfg->theta = (float)theta;
    cfg->rot_dim = (size_t)rd;
    const json_t *rp = json_object_get(tc, "rope_parameters");
    const json_t *sec = json_is_object(rp) ? json_object_get(rp, "mrope_section") : NULL;
    const json_t *il = json_is_object(rp) ? json_object_get(rp, "mrope_interleaved") : NULL;
    cfg->section[0] = (int)(cfg->rot_dim / 2);
    cfg->section[1] = cfg->section[2] = 0;
    cfg->interleaved = il ? json_is_true(il) : false;
    if (!sec)
        return SVC_OK;
    long sum = 0;
    for (size_t i = 0; i < 3 && json_is_array(sec); i++) {
        const json_t *v = json_array_get(sec, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 4096)
            break;
        cfg->section[i] = (int)json_integer_value(v);
        sum += cfg->section[i];
        if (i == 2 && json_array_size(sec) == 3 && sum == (long)(cfg->rot_dim / 2))
            return SVC_OK;
    }
    return cfg_fail(c,
                    "%srope_parameters.mrope_section must be 3 integers summing to "
                    "rotary dim / 2 = %zu",
                    c->where, cfg->rot_dim / 2);
}

static svc_err_t cfg_sizes(const cfg_ctx_t *c, const json_t *tc, eng_model_cfg_t *cfg) {
    if (cfg_size(c, tc, "hidden_size", &cfg->hidden) ||
        cfg_size(c, tc, "num_hidden_layers", &cfg->n_layers) ||
        cfg_size(c, tc, "intermediate_size", &cfg->inter) ||
        cfg_size(c, tc, "vocab_size", &cfg->vocab) ||
        cfg_size(c, tc, "num_attention_heads", &cfg->n_heads) ||
        cfg_size(c, tc, "num_key_value_heads", &cfg->n_kv) ||
        cfg_size(c, tc, "head_dim", &cfg->head_dim) ||
        cfg_size(c, tc, "linear_num_key_heads", &cfg->lin_nk) ||
        cfg_size(c, tc, "linear_num_value_heads", &cfg->lin_nv) ||
        cfg_size(c, tc, "linear_key_head_dim", &cfg->lin_dk) ||
        cfg_size(c, tc, "linear_value_head_dim", &cfg->lin_dv) ||
        cfg_size(c, tc, "linear_conv_kernel_dim", &cfg->conv_k))
        return SVC_ERR_FORMAT;
    if (cfg->n_heads % cfg->n_kv)
        return cfg_fail(c,
                        "%snum_attention_heads (%zu) must be a multiple of "
                        "num_key_value_heads (%zu)",
                        c->where, cfg->n_heads, cfg->n_kv);
    if (cfg->lin_nv % cfg->lin_nk)
        return cfg_fail(c,
                        "%slinear_num_value_heads (%zu) must be a multiple of "
                        "linear_num_key_heads (%zu)",
                        c->where, cfg->lin_nv, cfg->lin_nk);
    return SVC_OK;
}

/* Which layout: text_config (HF), else top-level hidden_size (FastFlowLM). */
static svc_err_t cfg_layout(const json_t *root, cfg_ctx_t *c, const json_t **tc) {
    *tc = json_object_get(root, "text_config");
    if (json_is_object(*tc))
        return SVC_OK;
    if (*tc || !json_object_get(root, "hidden_size"))
        return cfg_fail(c, "text_config is missing or not an object (and there is no top-level "
                           "hidden_size of FastFlowLM's flattened layout)");
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (json_object_get(root, "model_type") &&
        (!mt || (strcmp(mt, "qwen3_5") != 0 && strcmp(mt, "qwen3_5_text") != 0)))
        return cfg_fail(c, "model_type '%s' of the flattened layout is not qwen3_5 or qwen3_5_text",
                        mt ? mt : "(not a string)");
    c->where = "";
    c->flm = true;
    *tc = root;
    return SVC_OK;
}

static svc_err_t cfg_parse(const json_t *root, cfg_ctx_t *c, eng_model_cfg_t *cfg) {
    const json_t *tc;
    svc_err_t     err = cfg_layout(root, c, &tc);
    if (!err)
        err = cfg_sizes(c, tc, cfg);
    if (err)
        return err;
    const json_t *eps = json_object_get(tc, "rms_norm_eps");
    if (!json_is_number(eps) || !(json_number_value(eps) > 0) || json_number_value(eps) > 1)
        return cfg_fail(c, "%srms_norm_eps must be a number in (0, 1]", c->where);
    cfg->eps = (float)json_number_value(eps);
    const json_t *gate = json_object_get(tc, "attn_output_gate");
    if (gate && !json_is_boolean(gate))
        return cfg_fail(c, "%sattn_output_gate must be true or false", c->where);
    cfg->attn_gate = gate ? json_is_true(gate) : true; /* Qwen3.5's default */
    if ((err = cfg_rope(c, tc, cfg)))
        return err;
    return cfg_layer_types(c, tc, cfg);
}

svc_err_t eng_model_cfg_load(const char *dir, const eng_q4nx_t *q, eng_model_cfg_t *cfg,
                             char *errstr, size_t n) {
    size_t plen = strlen(dir) + sizeof "/" CFG;
    char  *path = malloc(plen);
    if (!path)
        return SVC_ERR_NOMEM;
    snprintf(path, plen, "%s/" CFG, dir);
    cfg_ctx_t    c = {path, "text_config.", false, q, errstr, n};
    json_error_t jerr;
    json_t      *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    svc_err_t    err = SVC_OK;
    if (!root) {
        svc_errf(errstr, n, CFG " \"%s\": %s (line %d, column %d)", path, jerr.text, jerr.line,
                 jerr.column);
        err = SVC_ERR_FORMAT;
    } else if (!json_is_object(root))
        err = cfg_fail(&c, "the top level is not a JSON object");
    else
        err = cfg_parse(root, &c, cfg);
    json_decref(root);
    free(path);
    return err;
}
