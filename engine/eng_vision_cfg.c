/*
 * eng_vision_cfg.c -- config.json's vision_config (eng_vision_int.h).
 *
 * Two layouts: Hugging Face's (`vision_config` with depth, hidden_size,
 * num_heads, ...; a key left out takes transformers' Qwen3_5VisionConfig
 * default, as transformers would load it) and FastFlowLM's (Q4NX.md §6:
 * QWEN3_5_VISION_EMBED_DIM, QWEN3_5_VISION_NUM_LAYERS, ...; the keys its
 * runtime reads must be present, the tower dimensions it leaves to the
 * closed library default to Qwen3.5-2B's). The layout is told by its keys:
 * `QWEN3_5_VISION_EMBED_DIM` or `QWEN3_5_PATCH_SIZE` means FastFlowLM's.
 */
#include "eng_vision_int.h"

#include "eng_util_int.h"

#include <jansson.h>
#include <math.h>

#define CFG "config.json"

typedef struct vc_ctx {
    const char *path;
    const char *where; /* "vision_config." */
    char       *errstr;
    size_t      errstr_size;
} vc_ctx_t;

SVC_FMT(2, 3) static svc_err_t vc_fail(const vc_ctx_t *c, const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(c->errstr, c->errstr_size, CFG " \"%s\": %s", c->path, msg);
    return SVC_ERR_FORMAT;
}

/* key: a positive integer; absent -> dflt (0: required). */
static svc_err_t vc_size(const vc_ctx_t *c, const json_t *vc, const char *key, size_t dflt,
                         size_t *out) {
    const json_t *v = json_object_get(vc, key);
    if (!v && dflt) {
        *out = dflt;
        return SVC_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 24))
        return vc_fail(c, "%s%s must be a positive integer", c->where, key);
    *out = (size_t)json_integer_value(v);
    return SVC_OK;
}

static svc_err_t vc_num(const vc_ctx_t *c, const json_t *v, const char *key, double dflt,
                        double *out) {
    if (!v) {
        *out = dflt;
        return SVC_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return vc_fail(c, "%s%s must be a positive number", c->where, key);
    *out = json_number_value(v);
    return SVC_OK;
}

/* Hugging Face's keys, transformers 5.24 Qwen3_5VisionConfig defaults. */
static svc_err_t vc_hf(const vc_ctx_t *c, const json_t *vc, eng_vis_cfg_t *o) {
    svc_err_t err;
    if ((err = vc_size(c, vc, "depth", 27, &o->depth)) ||
        (err = vc_size(c, vc, "hidden_size", 1152, &o->hidden)) ||
        (err = vc_size(c, vc, "num_heads", 16, &o->heads)) ||
        (err = vc_size(c, vc, "intermediate_size", 4304, &o->inter)) ||
        (err = vc_size(c, vc, "patch_size", 16, &o->patch)) ||
        (err = vc_size(c, vc, "temporal_patch_size", 2, &o->temporal)) ||
        (err = vc_size(c, vc, "spatial_merge_size", 2, &o->merge)) ||
        (err = vc_size(c, vc, "in_channels", 3, &o->in_ch)) ||
        (err = vc_size(c, vc, "out_hidden_size", 3584, &o->out_hidden)) ||
        (err = vc_size(c, vc, "num_position_embeddings", 2304, &o->n_pos)))
        return err;
    const json_t *act = json_object_get(vc, "hidden_act");
    const char   *a = act ? json_string_value(act) : "gelu_pytorch_tanh";
    if (!a || (strcmp(a, "gelu_pytorch_tanh") != 0 && strcmp(a, "gelu") != 0))
        return vc_fail(c, "%shidden_act must be \"gelu_pytorch_tanh\" or \"gelu\"", c->where);
    o->act_tanh = strcmp(a, "gelu") != 0;
    const json_t *ds = json_object_get(vc, "deepstack_visual_indexes");
    if (ds && !json_is_null(ds) && !(json_is_array(ds) && json_array_size(ds) == 0)) {
        vc_fail(c, "%sdeepstack_visual_indexes: deepstack vision features are not supported",
                c->where);
        return SVC_ERR_UNSUPPORTED;
    }
    const json_t *rp = json_object_get(vc, "rope_parameters");
    if (rp && !json_is_object(rp))
        return vc_fail(c, "%srope_parameters must be an object", c->where);
    const json_t *rt = rp ? json_object_get(rp, "rope_type") : NULL;
    if (rt && (!json_is_string(rt) || strcmp(json_string_value(rt), "axial") != 0))
        return vc_fail(c, "%srope_parameters.rope_type must be \"axial\"", c->where);
    double theta;
    err = vc_num(c, rp ? json_object_get(rp, "rope_theta") : NULL, "rope_parameters.rope_theta",
                 10000.0, &theta);
    o->theta = (float)theta;
    o->eps = 1e-6f;
    return err;
}

/* FastFlowLM's keys (Q4NX.md §6); dimensions it may leave out are 2B's. */
static svc_err_t vc_flm(const vc_ctx_t *c, const json_t *vc, size_t text_hidden, eng_vis_cfg_t *o) {
    svc_err_t err;
    size_t    hd = 0;
    if ((err = vc_size(c, vc, "QWEN3_5_PATCH_SIZE", 0, &o->patch)) ||
        (err = vc_size(c, vc, "QWEN3_5_SPATIAL_MERGE_SIZE", 0, &o->merge)) ||
        (err = vc_size(c, vc, "QWEN3_5_TEMPORAL_PATCH_SIZE", 0, &o->temporal)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_EMBED_DIM", 1024, &o->hidden)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_NUM_HEADS", 16, &o->heads)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_HEAD_DIM", o->hidden / o->heads, &hd)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_MLP_INTERMEDIATE_SIZE", 4096, &o->inter)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_NUM_POSITION_EMBEDDINGS", 2304, &o->n_pos)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_NUM_LAYERS", 24, &o->depth)) ||
        (err = vc_size(c, vc, "QWEN3_5_VISION_OUT_HIDDEN_SIZE", text_hidden, &o->out_hidden)))
        return err;
    if (hd * o->heads != o->hidden)
        return vc_fail(c, "%sQWEN3_5_VISION_HEAD_DIM %zu x %zu heads is not the embed dim %zu",
                       c->where, hd, o->heads, o->hidden);
    double eps;
    err = vc_num(c, json_object_get(vc, "QWEN3_5_VISION_LAYER_NORM_EPSILON"),
                 "QWEN3_5_VISION_LAYER_NORM_EPSILON", 1e-6, &eps);
    o->eps = (float)eps;
    o->in_ch = 3;
    o->theta = 10000.0f;
    o->act_tanh = true;
    return err;
}

static svc_err_t vc_check(const vc_ctx_t *c, size_t text_hidden, eng_vis_cfg_t *o) {
    if (o->hidden % o->heads || (o->hidden / o->heads) % 4)
        return vc_fail(c,
                       "%shidden_size %zu over num_heads %zu must give a head size divisible by 4",
                       c->where, o->hidden, o->heads);
    o->head_dim = o->hidden / o->heads;
    /* the rotary tables (eng_vision.c rope_tables) hold head_dim / 4
     * frequencies, at most ENG_VIS_MAX_HEAD_DIM / 4 */
    if (o->head_dim > ENG_VIS_MAX_HEAD_DIM)
        return vc_fail(
            c,
            "%shidden_size %zu over num_heads %zu gives a head size of %zu, over the %d supported",
            c->where, o->hidden, o->heads, o->head_dim, ENG_VIS_MAX_HEAD_DIM);
    o->side = (size_t)llround(sqrt((double)o->n_pos));
    if (o->side * o->side != o->n_pos)
        return vc_fail(c, "%snum_position_embeddings %zu is not a square", c->where, o->n_pos);
    if (o->out_hidden != text_hidden)
        return vc_fail(c, "%sout_hidden_size %zu differs from the text hidden_size %zu", c->where,
                       o->out_hidden, text_hidden);
    if (o->merge > 8 || o->patch > 64 || o->temporal > 8)
        return vc_fail(c, "%sunsupported patch geometry (patch %zu, merge %zu, temporal %zu)",
                       c->where, o->patch, o->merge, o->temporal);
    return SVC_OK;
}

svc_err_t eng_vis_cfg_load(const char *dir, size_t text_hidden, eng_vis_cfg_t *out, bool *present,
                           char *errstr, size_t errstr_size) {
    *present = false;
    char *path = eng_path_join(dir, CFG);
    if (!path)
        return SVC_ERR_NOMEM;
    vc_ctx_t     c = {path, "vision_config.", errstr, errstr_size};
    json_error_t je;
    json_t      *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    svc_err_t    err = SVC_OK;
    if (!root) {
        svc_errf(errstr, errstr_size, CFG " \"%s\": %s", path, je.text);
        err = SVC_ERR_IO;
    }
    const json_t *vc = root ? json_object_get(root, "vision_config") : NULL;
    if (!err && vc && !json_is_object(vc))
        err = vc_fail(&c, "vision_config must be an object");
    if (!err && vc) {
        eng_vis_cfg_t o = {0};
        bool          flm = json_object_get(vc, "QWEN3_5_VISION_EMBED_DIM") ||
                   json_object_get(vc, "QWEN3_5_PATCH_SIZE");
        err = flm ? vc_flm(&c, vc, text_hidden, &o) : vc_hf(&c, vc, &o);
        if (!err)
            err = vc_check(&c, text_hidden, &o);
        const json_t *it = json_object_get(root, "image_token_id");
        o.image_token_id = 248056; /* Qwen3_5Config's default */
        if (!err && it &&
            (!json_is_integer(it) || json_integer_value(it) < 0 ||
             json_integer_value(it) > INT32_MAX))
            err = vc_fail(&c, "image_token_id must be a token id");
        else if (it)
            o.image_token_id = (int32_t)json_integer_value(it);
        /* Upstream (the BF16 package) refuses a config without the id;
         * the NPU2 runtime hard-codes 248056 (Q4NX.md section 6), so an
         * FLM config is taken to mean the default. */
        o.image_token_listed = it != NULL || flm;
        if (!err) {
            *out = o;
            *present = true;
        }
    }
    json_decref(root);
    free(path);
    return err;
}
