/*
 * eng_pkgwrite_vision.c -- the vision tower of a synthetic package: its
 * shapes, tensor list, config.json vision_config (both layouts),
 * preprocessor_config.json and vision_weight.q4nx.
 *
 * Shapes (every size gets a tower, so image requests run anywhere):
 *   nano (Qwen3.5-2B): depth 24, hidden 1024, 16 heads, MLP 4096, 2304
 *     position embeddings, patch 16, temporal 2, merge 2, out 2048
 *     (/work/shared/docs/Q4NX.md §2.7, from the HF config and T-ag's).
 *   lite (Qwen3.5-0.8B): depth 12, hidden 768, 12 heads, MLP 3072, 2304
 *     position embeddings, out 1024, same patch/temporal/merge -- the HF
 *     config's vision_config as quoted by several third-party projects
 *     (pinned "official vision contracts" and parser tests; the config.json
 *     itself was not read) [third-party, consistent].
 *   tiny: depth 2, hidden 32, 2 heads, MLP 64, 64 position embeddings
 *     (an 8 x 8 grid), out = the text hidden (64).
 * All: hidden_act gelu_pytorch_tanh, 3 input channels, no deepstack.
 *
 * Tiles of vision_weight.q4nx: MM_N 64 and MM_K 512 (the 2B's converter
 * config) for nano and tiny; MM_K 256 for lite, as the converter's 0.8B
 * config (Q4NX.md §5). config.json says which (VISION_MM_TILE_N/K).
 *
 * Values: seeded like the text tower (eng_pkgwrite.c): linears
 * N(0, 0.9 / sqrt(in)), biases N(0, 0.02), LayerNorm gains 1 + N(0, 0.1),
 * pos_embed N(0, 0.1); all BF16-rounded, so vision_weight.q4nx (BF16)
 * holds exactly what model.safetensors of the same seed holds.
 */
#include "eng_pkgwrite_int.h"
#include "eng_q4nx_int.h"

static const pw_vision_t VISION[] = {
    [ENG_MAKE_TINY] = {2, 32, 2, 64, 16, 2, 2, 3, 64, 64, "gelu_pytorch_tanh", 64, 512},
    [ENG_MAKE_LITE] = {12, 768, 12, 3072, 16, 2, 2, 3, 1024, 2304, "gelu_pytorch_tanh", 64, 256},
    [ENG_MAKE_NANO] = {24, 1024, 16, 4096, 16, 2, 2, 3, 2048, 2304, "gelu_pytorch_tanh", 64, 512},
};

const pw_vision_t *pw_vision_get(eng_make_size_t size) {
    SVC_ASSERT((size_t)size < sizeof VISION / sizeof VISION[0]);
    return &VISION[size];
}

/* ---------------------------------------------------------------------
 * Tensors (SPEC e.6; stored shapes of Q4NX.md §2.7 before tiling)
 * --------------------------------------------------------------------- */

static svc_err_t vadd(pw_list_t *l, const char *suffix, pw_init_t init, size_t rank,
                      const uint64_t *dims) {
    if (l->n == l->cap) {
        size_t       cap = l->cap ? l->cap * 2 : 64;
        pw_tensor_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        l->v = v;
        l->cap = cap;
    }
    pw_tensor_t *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, PW_VISION_PREFIX "%s", suffix);
    t->rank = rank;
    memcpy(t->dims, dims, rank * sizeof *dims);
    t->init = init;
    return SVC_OK;
}

/* <prefix>.weight [out, in] and <prefix>.bias [out] */
static svc_err_t vlinear(pw_list_t *l, const char *prefix, uint64_t out, uint64_t in) {
    char     w[96], b[96];
    uint64_t dw[2] = {out, in}, db[1] = {out};
    snprintf(w, sizeof w, "%s.weight", prefix);
    snprintf(b, sizeof b, "%s.bias", prefix);
    svc_err_t err = vadd(l, w, PW_LINEAR, 2, dw);
    return err ? err : vadd(l, b, PW_BIAS, 1, db);
}

/* A LayerNorm of width n: weight and bias. */
static svc_err_t vnorm(pw_list_t *l, const char *prefix, uint64_t n) {
    char     w[96], b[96];
    uint64_t d[1] = {n};
    snprintf(w, sizeof w, "%s.weight", prefix);
    snprintf(b, sizeof b, "%s.bias", prefix);
    svc_err_t err = vadd(l, w, PW_LN_GAIN, 1, d);
    return err ? err : vadd(l, b, PW_BIAS, 1, d);
}

static int vcmp(const void *a, const void *b) {
    return strcmp(((const pw_tensor_t *)a)->name, ((const pw_tensor_t *)b)->name);
}

svc_err_t pw_vision_tensors(const pw_vision_t *v, pw_list_t *l) {
    uint64_t  H = v->hidden, M = v->hidden * v->merge * v->merge; /* merged width */
    uint64_t  pe[5] = {H, v->in_ch, v->temporal, v->patch, v->patch}, pos[2] = {v->npos, H};
    uint64_t  pb[1] = {H};
    size_t    first = l->n;
    svc_err_t err = vadd(l, "patch_embed.proj.weight", PW_LINEAR, 5, pe);
    if (!err)
        err = vadd(l, "patch_embed.proj.bias", PW_BIAS, 1, pb);
    if (!err)
        err = vadd(l, "pos_embed.weight", PW_EMBED, 2, pos);
    for (size_t i = 0; !err && i < v->depth; i++) {
        char p[5][64];
        snprintf(p[0], sizeof p[0], "blocks.%zu.norm1", i);
        snprintf(p[1], sizeof p[1], "blocks.%zu.norm2", i);
        snprintf(p[2], sizeof p[2], "blocks.%zu.attn.qkv", i);
        snprintf(p[3], sizeof p[3], "blocks.%zu.attn.proj", i);
        snprintf(p[4], sizeof p[4], "blocks.%zu.mlp.linear_fc", i);
        char fc1[72], fc2[72];
        snprintf(fc1, sizeof fc1, "%s1", p[4]);
        snprintf(fc2, sizeof fc2, "%s2", p[4]);
        if ((err = vnorm(l, p[0], H)) || (err = vnorm(l, p[1], H)) ||
            (err = vlinear(l, p[2], 3 * H, H)) || (err = vlinear(l, p[3], H, H)) ||
            (err = vlinear(l, fc1, v->inter, H)))
            break;
        err = vlinear(l, fc2, H, v->inter);
    }
    /* merger: LayerNorm over each patch, 2x2 patches concatenated, MLP */
    if (!err)
        err = vnorm(l, "merger.norm", H);
    if (!err)
        err = vlinear(l, "merger.linear_fc1", M, M);
    if (!err)
        err = vlinear(l, "merger.linear_fc2", v->out_hidden, M);
    if (!err)
        qsort(l->v + first, l->n - first, sizeof *l->v, vcmp);
    return err;
}

uint64_t pw_vision_params(eng_make_size_t size) {
    pw_list_t l = {0};
    uint64_t  n = 0;
    if (pw_vision_tensors(pw_vision_get(size), &l) == SVC_OK)
        for (size_t i = 0; i < l.n; i++)
            n += pw_numel(&l.v[i]);
    free(l.v);
    return n;
}

/* ---------------------------------------------------------------------
 * JSON
 * --------------------------------------------------------------------- */

/* The HF Qwen3.5 vision_config keys (SPEC e.1; deepstack_visual_indexes
 * empty: Qwen3.5 has no deepstack, Q4NX.md §2.7). model_type "qwen3_5" as
 * the released checkpoints' vision_config [third-party copies]; SPEC e.1
 * names "qwen3_5_vision" for the runtime's own. */
json_t *pw_vision_config_hf(const pw_ctx_t *c) {
    const pw_vision_t *v = pw_vision_get(c->opts->size);
    return json_pack(
        "{s[]sIsssIsIsfsIsssIsIsIsIsIsI}", "deepstack_visual_indexes", "depth",
        (json_int_t)v->depth, "hidden_act", v->act, "hidden_size", (json_int_t)v->hidden,
        "in_channels", (json_int_t)v->in_ch, "initializer_range", 0.02, "intermediate_size",
        (json_int_t)v->inter, "model_type", "qwen3_5", "num_heads", (json_int_t)v->heads,
        "num_position_embeddings", (json_int_t)v->npos, "out_hidden_size",
        (json_int_t)v->out_hidden, "patch_size", (json_int_t)v->patch, "spatial_merge_size",
        (json_int_t)v->merge, "temporal_patch_size", (json_int_t)v->temporal);
}

/* Q4NX.md §6: the keys FLM's runtime reads, those T-ag's 2B config carries
 * (tower dimensions, xclbin names, matmul tiles) and the [unconfirmed]
 * QWEN3_5_VISION_OUT_HIDDEN_SIZE, which a reader needs for the merger. */
json_t *pw_vision_config_flm(const pw_vision_t *v) {
    json_t *o = json_pack(
        "{sIsIsIsIsIsfsfsfsI}", "QWEN3_5_PATCH_SIZE", (json_int_t)v->patch,
        "QWEN3_5_IMAGE_MERGE_SIZE", (json_int_t)v->merge, "QWEN3_5_SPATIAL_MERGE_SIZE",
        (json_int_t)v->merge, "QWEN3_5_SHORTEST_EDGE", (json_int_t)65536, "QWEN3_5_LONGEST_EDGE",
        (json_int_t)16777216, "QWEN3_5_VISION_RESCALE_FACTOR", 1.0 / 255.0,
        "QWEN3_5_VISION_RESCALE_IMAGE_MEAN", 0.5, "QWEN3_5_VISION_RESCALE_IMAGE_STD", 0.5,
        "QWEN3_5_TEMPORAL_PATCH_SIZE", (json_int_t)v->temporal);
    json_t *dims = json_pack(
        "{sIsIsIsIsIsIsfsIsssssIsIsI}", "QWEN3_5_VISION_EMBED_DIM", (json_int_t)v->hidden,
        "QWEN3_5_VISION_NUM_HEADS", (json_int_t)v->heads, "QWEN3_5_VISION_HEAD_DIM",
        (json_int_t)(v->hidden / v->heads), "QWEN3_5_VISION_MLP_INTERMEDIATE_SIZE",
        (json_int_t)v->inter, "QWEN3_5_VISION_NUM_POSITION_EMBEDDINGS", (json_int_t)v->npos,
        "QWEN3_5_VISION_NUM_LAYERS", (json_int_t)v->depth, "QWEN3_5_VISION_LAYER_NORM_EPSILON",
        1e-6, "QWEN3_5_VISION_OUT_HIDDEN_SIZE", (json_int_t)v->out_hidden,
        "vision_mm_engine_xclbin_name", "vision_mm.xclbin", "vision_mha_engine_xclbin_name",
        "vision_attn.xclbin", "VISION_MM_TILE_M", (json_int_t)128, "VISION_MM_TILE_K",
        (json_int_t)v->mm_k, "VISION_MM_TILE_N", (json_int_t)v->mm_n);
    if (!o || !dims || json_object_update(o, dims)) {
        json_decref(o);
        o = NULL;
    }
    json_decref(dims);
    return o;
}

/* As the released Qwen3.5 packages' file (image_processor_type, patch,
 * temporal, merge, mean/std 0.5, the pixel budget as "size"), plus the
 * SPEC e.7 fields with their required values made explicit. */
svc_err_t pw_preprocessor(const pw_ctx_t *c) {
    const pw_vision_t *v = pw_vision_get(c->opts->size);
    json_t            *j = json_pack(
                   "{sbsbsbsbs[fff]s[fff]sssIsIsssisfs{sIsI}sI}", "do_convert_rgb", 1, "do_normalize", 1,
                   "do_rescale", 1, "do_resize", 1, "image_mean", 0.5, 0.5, 0.5, "image_std", 0.5, 0.5, 0.5,
                   "image_processor_type", "Qwen2VLImageProcessorFast", "merge_size", (json_int_t)v->merge,
                   "patch_size", (json_int_t)v->patch, "processor_class", "Qwen3VLProcessor", "resample", 3,
                   "rescale_factor", 1.0 / 255.0, "size", "longest_edge", (json_int_t)16777216,
                   "shortest_edge", (json_int_t)65536, "temporal_patch_size", (json_int_t)v->temporal);
    svc_err_t err =
        j ? pw_write_json(c, "preprocessor_config.json", j, JSON_SORT_KEYS) : SVC_ERR_NOMEM;
    json_decref(j);
    return err;
}

svc_err_t pw_vision_tokens(const pw_ctx_t *c) {
    static const char *const need[] = {"<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                       "<|vision_end|>"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (eng_tokenizer_token_id(c->tok, need[i], strlen(need[i])) < 0) {
            svc_errf(c->errstr, c->errstr_size,
                     "tokenizer of \"%s\" has no %s token, which the vision tower's "
                     "config.json ids must name (SPEC e.7)",
                     c->opts->tokenizer_dir ? c->opts->tokenizer_dir : c->opts->out_dir, need[i]);
            return SVC_ERR_FORMAT;
        }
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * vision_weight.q4nx
 * --------------------------------------------------------------------- */

svc_err_t pw_vision_q4nx(const pw_ctx_t *c) {
    const pw_vision_t *v = pw_vision_get(c->opts->size);
    pw_list_t          l = {0};
    eng_q4nx_writer_t *w = NULL;
    svc_err_t          err = pw_vision_tensors(v, &l);
    if (!err)
        err = eng_q4nx_writer_new(c->shape->head_dim, &w);
    if (!err)
        err = eng_q4nx_writer_set_vision_tiles(w, v->mm_n, v->mm_k);
    if (!err)
        err = pw_q4nx_write_list(c, w, &l, "vision_weight.q4nx", false);
    eng_q4nx_writer_free(w);
    free(l.v);
    return err;
}
