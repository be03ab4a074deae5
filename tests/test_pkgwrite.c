/*
 * test_pkgwrite.c -- `make-package` (engine/eng_pkgwrite*.c): a synthetic
 * tiny package must verify, open, load and run; the same seed must give
 * the same bytes; the built-in tokenizer must make every code one token.
 * Every package has a vision tower: its tensors, config keys, processor
 * config and manifest counts are checked on tiny.
 * lite/nano are checked by their parameter counts only (nothing written).
 */
#include "engine.h"
#include "eng_manifest_int.h"
#include "eng_pkgwrite_int.h"
#include "eng_st_int.h"
#include "ops.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <ftw.h>
#include <math.h>
#include <unistd.h>

#define MINI_TOK D3_SOURCE_DIR "/tests/fixtures/qwen35-mini"
#define NANO_REQ D3_SOURCE_DIR "/tests/golden/prompt/qwen35mini/d3nano_example.request.json"

/* A fresh package dir under a new temp dir; *root receives the temp dir. */
static void make_tiny(char root[64], char dir[128], uint64_t seed, const char *tokenizer) {
    snprintf(root, 64, "/tmp/d3pkgw.XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    snprintf(dir, 128, "%s/pkg", root);
    eng_make_opts_t o = {
        .size = ENG_MAKE_TINY, .seed = seed, .out_dir = dir, .tokenizer_dir = tokenizer};
    char errstr[1024] = "";
    cr_assert_eq(eng_package_make(&o, errstr, sizeof errstr), SVC_OK, "%s", errstr);
}

static svc_buf_t read_all(const char *path) {
    svc_buf_t b;
    svc_buf_init(&b, (size_t)1 << 30);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    char   chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        cr_assert_eq(svc_buf_add(&b, chunk, n), SVC_OK);
    fclose(f);
    return b;
}

/* Manifest, package (codes), model load and one forward pass. */
static void check_package(const char *dir) {
    char             errstr[1024] = "";
    eng_mf_verdict_t v;
    eng_mf_verdict_init(&v);
    cr_expect_eq(eng_manifest_verify_model(dir, &v, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_mf_verdict_fini(&v);

    eng_package_t *pkg = NULL;
    cr_assert_eq(eng_package_open(dir, &pkg, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_expect_str_eq(eng_package_code(pkg, 0), "A");
    cr_expect_str_eq(eng_package_code(pkg, 26), "AA");
    cr_expect_eq(eng_package_max_length(pkg), 8192);
    cr_expect(eng_package_noncausal(pkg));
    cr_expect_str_eq(eng_package_model_id(pkg), "d3stream-synthetic-tiny");

    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_load(dir, &m, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_model_info_t info;
    eng_model_get_info(m, &info);
    cr_expect_eq(info.vocab, eng_tokenizer_n_ids(eng_package_tokenizer(pkg)));
    cr_expect_eq(info.n_params_text, eng_make_text_params(ENG_MAKE_TINY, info.vocab));
    int32_t ids[] = {1, 32, eng_package_code_id(pkg, 3), 7, eng_package_code_id(pkg, 254)};
    float   h[64];
    cr_assert_eq(eng_model_hidden_size(m), 64);
    cr_assert_eq(eng_model_forward(m, ids, 5, true, h, NULL, NULL, errstr, sizeof errstr), SVC_OK,
                 "%s", errstr);
    for (size_t i = 0; i < 64; i++)
        cr_assert(isfinite(h[i]), "h[%zu] = %g", i, (double)h[i]);
    double probs[4];
    cr_assert_eq(eng_readout_probs(m, h, 4, 1.0, probs), SVC_OK);
    cr_expect(fabs(probs[0] + probs[1] + probs[2] + probs[3] - 1.0) < 1e-9);
    /* MODEL_MANIFEST parameters: loaded = text + vision + readout, vision not loaded */
    cr_expect_eq(eng_model_check_parameters(m, dir, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_model_free(m);
    eng_package_free(pkg);
}

Test(pkgwrite, own_tokenizer_package_verifies_loads_and_runs) {
    char root[64], dir[128];
    make_tiny(root, dir, 7, NULL);
    check_package(dir);
    rm_tree(root);
}

Test(pkgwrite, copied_tokenizer_package_verifies_loads_and_runs) {
    char root[64], dir[128];
    make_tiny(root, dir, 7, MINI_TOK);
    check_package(dir);
    /* the copies are byte for byte, and the mini tokenizer's codes are A..Z, AA..IU */
    svc_buf_t a = read_all(MINI_TOK "/tokenizer.json");
    char      p[160];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    svc_buf_t b = read_all(p);
    cr_expect(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
    svc_buf_fini(&a);
    svc_buf_fini(&b);
    char           errstr[512];
    eng_package_t *pkg = NULL;
    cr_assert_eq(eng_package_open(dir, &pkg, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_expect_str_eq(eng_package_code(pkg, 254), "IU");
    cr_expect_eq(eng_package_code_id(pkg, 0), 32);
    eng_package_free(pkg);
    rm_tree(root);
}

Test(pkgwrite, same_seed_same_bytes_other_seed_differs) {
    char r1[64], d1[128], r2[64], d2[128], r3[64], d3[128], p[160];
    make_tiny(r1, d1, 42, NULL);
    make_tiny(r2, d2, 42, NULL);
    make_tiny(r3, d3, 43, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", d1);
    svc_buf_t a = read_all(p);
    snprintf(p, sizeof p, "%s/model.safetensors", d2);
    svc_buf_t b = read_all(p);
    snprintf(p, sizeof p, "%s/model.safetensors", d3);
    svc_buf_t c = read_all(p);
    cr_expect(a.len == b.len && memcmp(a.data, b.data, a.len) == 0, "same seed, other bytes");
    cr_expect(a.len == c.len, "the size depends on the shape only");
    cr_expect(memcmp(a.data, c.data, a.len) != 0, "another seed, same bytes");
    svc_buf_fini(&a);
    svc_buf_fini(&b);
    svc_buf_fini(&c);
    rm_tree(r1);
    rm_tree(r2);
    rm_tree(r3);
}

Test(pkgwrite, own_tokenizer_codes_specials_and_prompt) {
    char root[64], dir[128], errstr[1024] = "";
    make_tiny(root, dir, 1, NULL);
    eng_package_t *pkg = NULL;
    cr_assert_eq(eng_package_open(dir, &pkg, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    const eng_tokenizer_t *tok = eng_package_tokenizer(pkg);
    eng_ids_t              ids;
    eng_ids_init(&ids);
    for (size_t i = 0; i < ENG_N_CODES; i++) {
        const char *code = eng_package_code(pkg, i);
        ids.n = 0;
        cr_assert_eq(eng_tokenizer_encode(tok, code, strlen(code), &ids), SVC_OK);
        cr_assert_eq(ids.n, 1, "code %s is %zu tokens", code, ids.n);
        cr_assert_eq(ids.v[0], eng_package_code_id(pkg, i));
    }
    ids.n = 0;
    cr_assert_eq(eng_tokenizer_encode(tok, "<|im_start|>", 12, &ids), SVC_OK);
    cr_expect_eq(ids.n, 1);
    cr_expect_geq(ids.v[0], 256 + 229);
    ids.n = 0;
    cr_assert_eq(eng_tokenizer_encode(tok, " the", 4, &ids), SVC_OK);
    cr_expect_eq(ids.n, 1, "the English merges make \" the\" one token");
    eng_ids_fini(&ids);

    /* the D3-Nano example request renders and tokenizes */
    svc_buf_t body = read_all(NANO_REQ), out;
    svc_buf_init(&out, (size_t)1 << 24);
    int rc = ops_prompt_body(pkg, dir, body.data, body.len, &out, errstr, sizeof errstr);
    cr_expect_eq(rc, OPS_EXIT_OK, "%s", errstr);
    cr_expect_not_null(strstr(out.data, "\"n_tokens\":"));
    svc_buf_fini(&out);
    svc_buf_fini(&body);
    eng_package_free(pkg);
    rm_tree(root);
}

Test(pkgwrite, q4nx_package_file_set) {
    char root[64], dir[128], errstr[1024] = "";
    snprintf(root, sizeof root, "/tmp/d3pkgw.XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    snprintf(dir, sizeof dir, "%s/q4nx", root);
    eng_make_opts_t o = {.size = ENG_MAKE_TINY, .format = ENG_MAKE_Q4NX, .seed = 3, .out_dir = dir};
    cr_assert_eq(eng_package_make(&o, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    static const char *const files[] = {
        "MANIFEST.sha256",      "README.md",  "chat_template.jinja", "config.json",
        "decision_config.json", "model.q4nx", "readout.safetensors", "tokenizer.json",
        "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[200];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        cr_expect_eq(access(p, R_OK), 0, "%s is missing", files[i]);
    }
    char p[200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    cr_expect_neq(access(p, F_OK), 0, "a q4nx package has no model.safetensors");
    /* FastFlowLM's config.json: text keys at the top level (Q4NX.md §6) */
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    cr_assert_not_null(cfg);
    cr_expect_null(json_object_get(cfg, "text_config"));
    cr_expect_eq(json_integer_value(json_object_get(cfg, "hidden_size")), 64);
    cr_expect_str_eq(json_string_value(json_object_get(cfg, "model_type")), "qwen3_5_text");
    json_decref(cfg);
    snprintf(p, sizeof p, "%s/README.md", dir);
    svc_buf_t readme = read_all(p);
    cr_expect_not_null(strstr(readme.data, "meaningless"));
    svc_buf_fini(&readme);
    rm_tree(root);
}

/* ---- the vision tower (tiny: depth 2, hidden 32, MLP 64, out 64) ---- */

typedef struct vshape {
    const char *suffix;
    uint32_t    rank;
    uint64_t    d[5];
} vshape_t;

/* Every tensor of tiny's tower, as SPEC e.6 names them. */
static const vshape_t TINY_VISION[] = {
    {"patch_embed.proj.weight", 5, {32, 3, 2, 16, 16}},
    {"patch_embed.proj.bias", 1, {32}},
    {"pos_embed.weight", 2, {64, 32}},
    {"blocks.0.norm1.weight", 1, {32}},
    {"blocks.0.norm1.bias", 1, {32}},
    {"blocks.0.norm2.weight", 1, {32}},
    {"blocks.0.norm2.bias", 1, {32}},
    {"blocks.0.attn.qkv.weight", 2, {96, 32}},
    {"blocks.0.attn.qkv.bias", 1, {96}},
    {"blocks.0.attn.proj.weight", 2, {32, 32}},
    {"blocks.0.attn.proj.bias", 1, {32}},
    {"blocks.0.mlp.linear_fc1.weight", 2, {64, 32}},
    {"blocks.0.mlp.linear_fc1.bias", 1, {64}},
    {"blocks.0.mlp.linear_fc2.weight", 2, {32, 64}},
    {"blocks.0.mlp.linear_fc2.bias", 1, {32}},
    {"blocks.1.attn.qkv.weight", 2, {96, 32}},
    {"blocks.1.mlp.linear_fc2.bias", 1, {32}},
    {"merger.norm.weight", 1, {32}},
    {"merger.norm.bias", 1, {32}},
    {"merger.linear_fc1.weight", 2, {128, 128}},
    {"merger.linear_fc1.bias", 1, {128}},
    {"merger.linear_fc2.weight", 2, {64, 128}},
    {"merger.linear_fc2.bias", 1, {64}},
};
#define TINY_VISION_TENSORS (2 * 12 + 9)

static json_t *load_json(const char *dir, const char *name) {
    char p[200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t e;
    json_t      *j = json_load_file(p, 0, &e);
    cr_assert_not_null(j, "%s: %s", p, e.text);
    return j;
}

static json_int_t geti(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

Test(pkgwrite, vision_tower_tensors_config_and_manifest) {
    char root[64], dir[128], p[200], errstr[1024] = "";
    make_tiny(root, dir, 5, NULL);

    /* model.safetensors: the tower next to the text tensors, BF16 */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    eng_st_t *st = NULL;
    cr_assert_eq(eng_st_open(p, &st, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    size_t   n_vis = 0;
    uint64_t vis_elems = 0, text_elems = 0;
    for (size_t i = 0; i < eng_st_count(st); i++) {
        const eng_st_tensor_t *t = eng_st_at(st, i);
        bool                   vis = strncmp(t->name, "model.visual.", 13) == 0;
        cr_expect(vis || strncmp(t->name, "model.language_model.", 21) == 0, "%s", t->name);
        cr_expect_eq(t->dtype, ENG_DT_BF16, "%s", t->name);
        n_vis += vis;
        (vis ? &vis_elems : &text_elems)[0] += eng_st_numel(t);
    }
    cr_expect_eq(n_vis, TINY_VISION_TENSORS);
    for (size_t i = 0; i < sizeof TINY_VISION / sizeof TINY_VISION[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "model.visual.%s", TINY_VISION[i].suffix);
        const eng_st_tensor_t *t = eng_st_find(st, name);
        cr_assert_not_null(t, "%s is missing", name);
        cr_expect_eq(t->rank, TINY_VISION[i].rank, "%s", name);
        for (uint32_t k = 0; k < t->rank; k++)
            cr_expect_eq(t->shape[k], TINY_VISION[i].d[k], "%s dim %u", name, k);
    }
    /* LayerNorm gains near 1, biases small, pos_embed ~N(0, 0.1) */
    float g[32], pos[64 * 32];
    cr_assert_eq(eng_st_to_f32(eng_st_find(st, "model.visual.blocks.1.norm2.weight"), g), SVC_OK);
    cr_assert_eq(eng_st_to_f32(eng_st_find(st, "model.visual.pos_embed.weight"), pos), SVC_OK);
    double mean = 0, sq = 0;
    for (size_t i = 0; i < 32; i++)
        mean += g[i] / 32.0;
    for (size_t i = 0; i < 64 * 32; i++)
        sq += (double)pos[i] * pos[i] / (64.0 * 32.0);
    cr_expect(mean > 0.9 && mean < 1.1, "norm gain mean %g", mean);
    cr_expect(sqrt(sq) > 0.08 && sqrt(sq) < 0.12, "pos_embed rms %g", sqrt(sq));
    eng_st_close(st);
    cr_expect_eq(vis_elems, pw_vision_params(ENG_MAKE_TINY));

    /* config.json: HF vision_config; the four ids are the tokenizer's */
    json_t       *cfg = load_json(dir, "config.json");
    const json_t *vc = json_object_get(cfg, "vision_config");
    cr_assert(json_is_object(vc));
    cr_expect_eq(geti(vc, "depth"), 2);
    cr_expect_eq(geti(vc, "hidden_size"), 32);
    cr_expect_eq(geti(vc, "num_heads"), 2);
    cr_expect_eq(geti(vc, "intermediate_size"), 64);
    cr_expect_eq(geti(vc, "patch_size"), 16);
    cr_expect_eq(geti(vc, "temporal_patch_size"), 2);
    cr_expect_eq(geti(vc, "spatial_merge_size"), 2);
    cr_expect_eq(geti(vc, "in_channels"), 3);
    cr_expect_eq(geti(vc, "out_hidden_size"), 64);
    cr_expect_eq(geti(vc, "num_position_embeddings"), 64);
    cr_expect_str_eq(json_string_value(json_object_get(vc, "hidden_act")), "gelu_pytorch_tanh");
    cr_expect(json_is_array(json_object_get(vc, "deepstack_visual_indexes")) &&
              json_array_size(json_object_get(vc, "deepstack_visual_indexes")) == 0);
    eng_package_t *pkg = NULL;
    cr_assert_eq(eng_package_open(dir, &pkg, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    static const char *const ids[][2] = {{"image_token_id", "<|image_pad|>"},
                                         {"video_token_id", "<|video_pad|>"},
                                         {"vision_start_token_id", "<|vision_start|>"},
                                         {"vision_end_token_id", "<|vision_end|>"}};
    for (size_t i = 0; i < 4; i++) {
        int32_t id =
            eng_tokenizer_token_id(eng_package_tokenizer(pkg), ids[i][1], strlen(ids[i][1]));
        cr_expect(id >= 0, "%s", ids[i][1]);
        cr_expect_eq(geti(cfg, ids[i][0]), id, "%s", ids[i][0]);
    }
    eng_package_free(pkg);
    json_decref(cfg);

    /* preprocessor_config.json (SPEC e.7) */
    json_t *pp = load_json(dir, "preprocessor_config.json");
    cr_expect_str_eq(json_string_value(json_object_get(pp, "image_processor_type")),
                     "Qwen2VLImageProcessorFast");
    cr_expect_eq(geti(pp, "patch_size"), 16);
    cr_expect_eq(geti(pp, "temporal_patch_size"), 2);
    cr_expect_eq(geti(pp, "merge_size"), 2);
    cr_expect_eq(geti(pp, "resample"), 3);
    cr_expect_eq(json_real_value(json_object_get(pp, "rescale_factor")), 1.0 / 255.0);
    static const char *const flags[] = {"do_resize", "do_rescale", "do_normalize",
                                        "do_convert_rgb"};
    for (size_t i = 0; i < 4; i++)
        cr_expect(json_is_true(json_object_get(pp, flags[i])), "%s", flags[i]);
    for (size_t i = 0; i < 3; i++) {
        cr_expect_eq(json_real_value(json_array_get(json_object_get(pp, "image_mean"), i)), 0.5);
        cr_expect_eq(json_real_value(json_array_get(json_object_get(pp, "image_std"), i)), 0.5);
    }
    json_decref(pp);

    /* MODEL_MANIFEST.json: parameters from the headers, the processor config listed */
    json_t       *mf = load_json(dir, "MODEL_MANIFEST.json");
    const json_t *par = json_object_get(mf, "parameters");
    cr_expect_eq((uint64_t)geti(par, "text"), text_elems);
    cr_expect_eq((uint64_t)geti(par, "vision"), vis_elems);
    cr_expect_eq(geti(par, "readout"), 255 * 64);
    cr_expect_eq((uint64_t)geti(par, "loaded"), text_elems + vis_elems + 255 * 64);
    cr_expect(json_is_string(
        json_object_get(json_object_get(mf, "files_sha256"), "preprocessor_config.json")));
    json_decref(mf);
    rm_tree(root);
}

/* Shapes: element counts of the text towers, nothing written.
 * Expected nano range: Qwen3.5-2B is a ~2B model including its vision tower;
 * from the shapes in /work/shared/docs/Q4NX.md section 2.1 (hidden 2048,
 * 24 layers 18 DeltaNet + 6 full, FFN 6144, vocab 248320) the text tower is
 * 508,559,360 embedding + 18 x 58,814,624 + 6 x 52,433,408 + 2,048 = 1,881,825,088. A
 * window of [1.8e9, 2.0e9] catches any wrong width or layer count. */
Test(pkgwrite, parameter_counts) {
    uint64_t nano = eng_make_text_params(ENG_MAKE_NANO, 0);
    uint64_t lite = eng_make_text_params(ENG_MAKE_LITE, 0);
    cr_expect(nano > 1800000000ull && nano < 2000000000ull, "nano %llu", (unsigned long long)nano);
    cr_expect_eq(nano, 1881825088ull, "nano %llu", (unsigned long long)nano);
    /* 0.8B total with vision; the text tower with its 254M-element embedding */
    cr_expect(lite > 650000000ull && lite < 800000000ull, "lite %llu", (unsigned long long)lite);
    /* tiny with tiny-upstream's vocabulary has exactly the fixture's count */
    cr_expect_eq(eng_make_text_params(ENG_MAKE_TINY, 4048), 509920);
    /* vision towers: patch_embed (h x 3 x 2 x 16 x 16 + h), pos_embed (npos x h), per
     * block 4h (norms) + 3h^2 + 3h (qkv) + h^2 + h (proj) + 2 h i + i + h (MLP), merger
     * 2h (norm) + 16h^2 + 4h (fc1) + 4h out + out (fc2) */
    struct {
        eng_make_size_t s;
        uint64_t        d, h, i, npos, out;
    } v[] = {{ENG_MAKE_TINY, 2, 32, 64, 64, 64},
             {ENG_MAKE_LITE, 12, 768, 3072, 2304, 1024},
             {ENG_MAKE_NANO, 24, 1024, 4096, 2304, 2048}};
    for (size_t k = 0; k < 3; k++) {
        uint64_t h = v[k].h, i = v[k].i;
        uint64_t want = h * 1536 + h + v[k].npos * h +
                        v[k].d * (4 * h + 3 * h * h + 3 * h + h * h + h + 2 * h * i + i + h) +
                        2 * h + 16 * h * h + 4 * h + 4 * h * v[k].out + v[k].out;
        cr_expect_eq(pw_vision_params(v[k].s), want, "%s: %llu, expected %llu",
                     eng_make_size_name(v[k].s), (unsigned long long)pw_vision_params(v[k].s),
                     (unsigned long long)want);
    }
    /* Qwen3.5-2B: 2.0-2.3B in all with its ~0.33B tower */
    uint64_t nano_vis = pw_vision_params(ENG_MAKE_NANO);
    cr_expect(nano_vis > 300000000ull && nano_vis < 350000000ull, "%llu",
              (unsigned long long)nano_vis);
    eng_make_size_t s;
    cr_expect(eng_make_size_parse("nano", &s) && s == ENG_MAKE_NANO);
    cr_expect(!eng_make_size_parse("huge", &s));
    cr_expect_str_eq(eng_make_size_name(ENG_MAKE_LITE), "lite");
}
