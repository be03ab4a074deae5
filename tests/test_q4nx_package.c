/*
 * test_q4nx_package.c -- `make-package --format q4nx --twin` and loading a
 * D3-Nano-NPU2-style package (issue 3): the q4nx package and its twin (an
 * upstream package holding the dequantised q4nx values as F32) both verify
 * and load, and answer the D3-Nano-NPU2 example request with the same
 * probabilities (1e-4) and the same residual stream after every layer
 * (1e-4 relative). Against the safetensors package of the same seed the
 * difference is the quantisation error: logged, not bounded. Both
 * config.json layouts (FastFlowLM's flattened one, with and without
 * layer_types, and Hugging Face's) load the same tower. The vision tower:
 * vision_weight.q4nx holds Q4NX.md §2.7's names and tiled shapes, and
 * untiled it equals the twin's and the safetensors package's values
 * exactly (BF16 all the way).
 */
#include "engine.h"
#include "eng_manifest_int.h"
#include "eng_model_int.h"
#include "eng_pkgwrite_int.h"
#include "eng_q4nx_int.h"
#include "eng_st_int.h"
#include "eng_vision_int.h"
#include "eng_fwd_int.h"
#include "npu.h"
#include "test_rng.h"
#include "ops.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <unistd.h>

#define EXAMPLE D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json"
#define SEED    11
#define TOL     1e-4

typedef struct pkgs {
    char root[64], q4nx[128], twin[128], st[128];
} pkgs_t;

/* q4nx (laid out as lay says; NULL: official Gen-B) + twin, and the
 * safetensors package of the same seed. */
static void make_laid_out(pkgs_t *p, const eng_make_q4nx_t *lay) {
    snprintf(p->root, sizeof p->root, "/tmp/d3q4pkg.XXXXXX");
    cr_assert_not_null(mkdtemp(p->root));
    snprintf(p->q4nx, sizeof p->q4nx, "%s/q4nx", p->root);
    snprintf(p->twin, sizeof p->twin, "%s/twin", p->root);
    snprintf(p->st, sizeof p->st, "%s/st", p->root);
    char            errstr[1024] = "";
    eng_make_opts_t o = {.size = ENG_MAKE_TINY,
                         .format = ENG_MAKE_Q4NX,
                         .seed = SEED,
                         .out_dir = p->q4nx,
                         .twin_dir = p->twin};
    if (lay)
        o.q4nx = *lay;
    cr_assert_eq(eng_package_make(&o, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_make_opts_t s = {.size = ENG_MAKE_TINY, .seed = SEED, .out_dir = p->st};
    cr_assert_eq(eng_package_make(&s, errstr, sizeof errstr), SVC_OK, "%s", errstr);
}

static void make_all(pkgs_t *p) {
    make_laid_out(p, NULL);
}

static svc_buf_t example_body(void) {
    svc_buf_t b;
    char      errstr[256];
    svc_buf_init(&b, 1 << 20);
    cr_assert_eq(svc_buf_read_file(&b, EXAMPLE, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    return b;
}

/* The example's three probabilities through ops_ask_body (what `ask` runs). */
static void answer(const loaded_t *l, double probs[3]) {
    static const char *keys[] = {"returns", "billing", "general"};
    svc_buf_t          body = example_body(), out;
    ops_ask_t          a = {l->pkg, l->model, l->dir, ""};
    char               errstr[1024] = "";
    svc_buf_init(&out, (size_t)1 << 24);
    cr_assert_eq(ops_ask_body(&a, body.data, body.len, &out, NULL, errstr, sizeof errstr),
                 OPS_EXIT_OK, "%s", errstr);
    json_t *r = json_loadb(out.data, out.len, 0, NULL);
    cr_assert(r, "not JSON: %s", out.data);
    const json_t *pr =
        json_object_get(json_object_get(json_object_get(r, "answers"), "route"), "probabilities");
    for (size_t i = 0; i < 3; i++) {
        cr_assert(json_is_real(json_object_get(pr, keys[i])), "%s", out.data);
        probs[i] = json_real_value(json_object_get(pr, keys[i]));
    }
    json_decref(r);
    svc_buf_fini(&out);
    svc_buf_fini(&body);
}

/* The example's prompt ids on package l. */
static void prompt_ids(const loaded_t *l, eng_prompt_t *pr) {
    svc_buf_t         body = example_body();
    sch_request_t    *req = decode_valid(body.data, body.len);
    char              errstr[256];
    const sch_part_t *part = sch_request_part(req, 0);
    cr_assert_eq(eng_prompt_render(l->pkg, part, &part->questions[0], pr, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
    sch_request_free(req);
    svc_buf_fini(&body);
}

/* The residual stream after the embeddings and every layer, (L+1, T, H). */
typedef struct trace {
    float *v;
    size_t T, H, n_layers;
} trace_t;

static void on_layer(int layer, const float *state, size_t T, size_t hidden, void *user) {
    trace_t *t = user;
    memcpy(t->v + (size_t)(layer + 1) * T * hidden, state, T * hidden * sizeof *state);
}

static void run_trace(const loaded_t *l, const eng_prompt_t *pr, trace_t *t, float *final) {
    eng_model_info_t mi;
    char             errstr[512];
    eng_model_get_info(l->model, &mi);
    t->T = pr->ids.n;
    t->H = mi.hidden;
    t->n_layers = mi.n_layers;
    t->v = calloc((mi.n_layers + 1) * t->T * t->H, sizeof *t->v);
    cr_assert_not_null(t->v);
    cr_assert_eq(eng_model_forward(l->model, pr->ids.v, pr->ids.n, eng_package_noncausal(l->pkg),
                                   final, on_layer, t, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
}

/* max |a - b| / max(1, max |b|) over n values */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / scale;
}

Test(q4nx_package, twin_matches_and_quantisation_error_is_reported, .timeout = 120) {
    /* The same packs for both (eng_ld_pack): where the q4nx tiles would
     * keep their codes (avx512-grp8x2) they take the twin's int8x3 layout
     * instead. test_ops holds the codes' kernel to the fp32 reference. */
    setenv("D3_NPU_MATMUL", "int8x3", 1);
    cr_assert_str_eq(npu_matmul_groups_name(), npu_matmul_quantised_name());
    pkgs_t p;
    make_all(&p);
    char             errstr[1024] = "";
    eng_mf_verdict_t v;
    eng_mf_verdict_init(&v);
    cr_expect_eq(eng_manifest_verify_sha256sum(p.q4nx, &v, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_expect_eq(v.n, 10, "MANIFEST.sha256 lists every file");
    bool has_vis = false, has_pp = false;
    for (size_t i = 0; i < v.n; i++) {
        has_vis = has_vis || strcmp(v.files[i].name, "vision_weight.q4nx") == 0;
        has_pp = has_pp || strcmp(v.files[i].name, "preprocessor_config.json") == 0;
    }
    cr_expect(has_vis && has_pp, "MANIFEST.sha256 lists vision_weight.q4nx and the processor");
    eng_mf_verdict_fini(&v);
    eng_mf_verdict_init(&v);
    cr_expect_eq(eng_manifest_verify_model(p.twin, &v, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    eng_mf_verdict_fini(&v);

    loaded_t q, t, s;
    load(p.q4nx, &q);
    load(p.twin, &t);
    load(p.st, &s);
    cr_expect_str_eq(eng_model_format(q.model), "q4nx-gen-b");
    cr_expect_str_eq(eng_model_format(t.model), "safetensors");
    /* the Q8 embedding is kept as its codes and scales (a quarter of the
     * fp32 bytes); the twin's F32 values are those same products, so it
     * finds the same codes; a BF16 package keeps bf16 (the layers below
     * compare their outputs bit for bit) */
    cr_expect(q.model->embed8 && q.model->embed8_s && !q.model->embed, "q4nx: Q8 embedding");
    cr_expect(t.model->embed8 && !t.model->embed, "twin: the same codes");
    /* the q4nx one is read from the Q8 tiles' codes (embed_from_groups),
     * the twin's found again from its F32 values (embed_q8): equal bytes */
    size_t V = q.model->cfg.vocab, H = q.model->cfg.hidden;
    cr_assert(q.model->embed8 && t.model->embed8 && t.model->embed8_s);
    cr_expect(memcmp(q.model->embed8, t.model->embed8, V * H) == 0, "embedding codes");
    cr_expect(memcmp(q.model->embed8_s, t.model->embed8_s, V * (H / 32) * sizeof(float)) == 0,
              "embedding scales");
    cr_expect(s.model->embed16 && !s.model->embed8, "BF16 package: bf16 embedding");
    eng_model_info_t qi, ti;
    eng_model_get_info(q.model, &qi);
    eng_model_get_info(t.model, &ti);
    cr_expect_eq(qi.n_params_text, ti.n_params_text);
    cr_expect_eq(qi.n_params_text, eng_make_text_params(ENG_MAKE_TINY, qi.vocab));

    double pq[3], pt[3], ps[3];
    answer(&q, pq);
    answer(&t, pt);
    answer(&s, ps);
    double dq = 0, ds = 0;
    for (size_t i = 0; i < 3; i++) {
        dq = fmax(dq, fabs(pq[i] - pt[i]));
        ds = fmax(ds, fabs(pq[i] - ps[i]));
    }
    cr_expect(dq <= TOL, "q4nx vs twin: max |dp| = %.3g", dq);
    cr_log_info("q4nx vs twin: max |dp| %.3g; q4nx vs safetensors of the same seed (quantisation "
                "error): max |dp| %.3g (p = %.6f %.6f %.6f vs %.6f %.6f %.6f)",
                dq, ds, pq[0], pq[1], pq[2], ps[0], ps[1], ps[2]);

    /* every layer's output, and the final-norm hidden state */
    eng_prompt_t pr;
    eng_prompt_init(&pr);
    prompt_ids(&q, &pr);
    trace_t tq, tt;
    float   fq[64], ft[64];
    cr_assert_eq(qi.hidden, 64);
    run_trace(&q, &pr, &tq, fq);
    run_trace(&t, &pr, &tt, ft);
    for (size_t layer = 0; layer <= tq.n_layers; layer++) {
        size_t n = tq.T * tq.H;
        double d = rel_diff(tq.v + layer * n, tt.v + layer * n, n);
        cr_expect(d <= TOL, "layer %d: relative difference %.3g", (int)layer - 1, d);
    }
    cr_expect(rel_diff(fq, ft, 64) <= TOL, "final hidden differs");
    free(tq.v);
    free(tt.v);
    eng_prompt_fini(&pr);
    unload(&q);
    unload(&t);
    unload(&s);
    rm_tree(p.root);
}

/* Rewrites dir/config.json through edit. */
static void edit_config(const char *dir, void (*edit)(json_t *root)) {
    char path[200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    cr_assert_not_null(root);
    edit(root);
    cr_assert_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
    json_decref(root);
}

static void drop_layer_types(json_t *root) {
    json_object_del(root, "layer_types");
    json_object_del(root, "full_attention_interval");
}

static void wrong_hidden(json_t *root) {
    json_object_set_new(root, "hidden_size", json_integer(32));
}

static void right_hidden(json_t *root) {
    json_object_set_new(root, "hidden_size", json_integer(64));
}

static void layer_kinds(const eng_model_t *m, char *out, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)
        out[i] = eng_model_layer_is_full(m, i) ? 'F' : 'L';
    out[n - 1] = '\0';
}

/* Issue 28's accuracy bound for the fast profile, per layer and
 * teacher-forced (eng_fwd_layer_errors): what each text layer adds to the
 * residual stream, from the exact input, under fast against exact on the
 * q4nx package, is at most 1/5 as far off as what the Q4 weights
 * themselves move it (the q4nx package against the safetensors package it
 * was quantised from, both exact). tests/bench/bench_accuracy `layers`
 * measures the same on nano (docs/profiles.md). The vision blocks (BF16
 * in every package: no Q4 to compare with) are logged and held to 5%. */
Test(q4nx_package, fast_layer_error_within_a_fifth_of_q4, .timeout = 120) {
    pkgs_t p;
    make_all(&p);
    loaded_t q, st;
    load(p.q4nx, &q);
    load(p.st, &st);
    const eng_model_t *fast = eng_model_profile(q.model, ENG_PROFILE_FAST);
    size_t             L = q.model->cfg.n_layers, V = eng_model_vocab_size(q.model);
    double             acc[4][16] = {{0}}; /* fast num, den; q4 num, den */
    cr_assert(L <= 16);
    char     errstr[512] = "";
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 20; i++) {
        int32_t ids[160];
        size_t  T = 16 + (size_t)i * 7;
        for (size_t t = 0; t < T; t++) {
            s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
            ids[t] = (int32_t)((s * 0x2545F4914F6CDD1Dull >> 33) % V);
        }
        bool nc = eng_package_noncausal(q.pkg);
        cr_assert_eq(
            eng_fwd_layer_errors(q.model, fast, ids, T, nc, acc[0], acc[1], errstr, sizeof errstr),
            SVC_OK, "%s", errstr);
        cr_assert_eq(eng_fwd_layer_errors(st.model, q.model, ids, T, nc, acc[2], acc[3], errstr,
                                          sizeof errstr),
                     SVC_OK, "%s", errstr);
    }
    for (size_t l = 0; l < L; l++) {
        double ef = sqrt(acc[0][l] / acc[1][l]), eq = sqrt(acc[2][l] / acc[3][l]);
        cr_log_info("layer %zu: fast/exact %.3e, q4/bf16 %.3e, ratio %.3f (%s)", l, ef, eq, ef / eq,
                    npu_matmul_fast_name());
        cr_expect(ef <= 0.2 * eq, "layer %zu: fast adds %.3e, over 1/5 of Q4's %.3e", l, ef, eq);
        if (npu_fast_usable())
            cr_expect(ef > 0, "layer %zu: the fast kernels ran", l);
    }
    const eng_vision_t *v = q.model->vision;
    cr_assert(v);
    size_t gh = 8, gw = 6, pe = eng_vis_patch_elems(&v->cfg);
    float *rows = malloc(gh * gw * pe * sizeof *rows);
    double vn[8] = {0}, vd[8] = {0};
    cr_assert(rows && v->cfg.depth <= 8);
    for (size_t i = 0; i < gh * gw * pe; i++)
        rows[i] = (float)((double)(i * 2654435761u % 2001) / 1000.0 - 1.0);
    cr_assert_eq(eng_vision_block_errors(v, rows, gh, gw, vn, vd, errstr, sizeof errstr), SVC_OK,
                 "%s", errstr);
    for (size_t b = 0; b < v->cfg.depth; b++) {
        double e = sqrt(vn[b] / vd[b]);
        cr_log_info("vision block %zu: fast/exact %.3e", b, e);
        cr_expect(e < 0.05, "vision block %zu: %.3e", b, e);
    }
    free(rows);
    unload(&q);
    unload(&st);
    rm_tree(p.root);
}

Test(q4nx_package, both_config_layouts_load, .timeout = 120) {
    pkgs_t p;
    make_all(&p);
    char         errstr[1024] = "", want[7], got[7], cmd[600];
    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_load(p.q4nx, &m, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    layer_kinds(m, want, sizeof want);
    cr_expect_str_eq(want, "LLLFLF");
    eng_model_free(m);

    /* a shape that disagrees: one line naming the file, tensor and shape */
    edit_config(p.q4nx, wrong_hidden);
    cr_expect_eq(eng_model_load(p.q4nx, &m, errstr, sizeof errstr), SVC_ERR_FORMAT);
    cr_expect_not_null(strstr(errstr, "model.q4nx"), "%s", errstr);
    /* packed tensors are checked against their tile grid only, and a tile
     * is 256 columns wide, so with hidden 64 the first plain tensor is the
     * one that disagrees */
    cr_expect_not_null(strstr(errstr, "tensor \"model.layers.0.input_layernorm.weight\""), "%s",
                       errstr);
    cr_expect_not_null(strstr(errstr, "expected [32]"), "%s", errstr);
    cr_expect_null(strchr(errstr, '\n'), "%s", errstr);
    edit_config(p.q4nx, right_hidden);

    /* FastFlowLM layout without layer_types: kinds read off the tensors */
    edit_config(p.q4nx, drop_layer_types);
    cr_assert_eq(eng_model_load(p.q4nx, &m, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    layer_kinds(m, got, sizeof got);
    cr_expect_str_eq(got, want);
    eng_model_free(m);

    /* the Hugging Face layout (the twin's config.json) next to model.q4nx */
    snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/config.json'", p.twin, p.q4nx);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(eng_model_load(p.q4nx, &m, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_expect_str_eq(eng_model_format(m), "q4nx-gen-b");
    layer_kinds(m, got, sizeof got);
    cr_expect_str_eq(got, want);
    eng_model_free(m);
    rm_tree(p.root);
}

Test(q4nx_package, twin_needs_q4nx) {
    eng_make_opts_t o = {.size = ENG_MAKE_TINY, .out_dir = "/nonexistent", .twin_dir = "/x"};
    char            errstr[256] = "";
    cr_expect_eq(eng_package_make(&o, errstr, sizeof errstr), SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "q4nx"), "%s", errstr);
}

/* ---- the vision tower ---- */

static json_t *load_cfg(const char *dir) {
    char p[200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    cr_assert_not_null(j, "%s", p);
    return j;
}

static bool tiled_suffix(const char *name) {
    return eng_q4nx_vision_tiled_name(name);
}

Test(q4nx_package, vision_weight_file_and_twin, .timeout = 120) {
    pkgs_t p;
    make_all(&p);
    char errstr[1024] = "", path[200];

    /* config.json: FastFlowLM's keys (Q4NX.md §6) */
    json_t       *cfg = load_cfg(p.q4nx);
    const json_t *vc = json_object_get(cfg, "vision_config");
    cr_expect_str_eq(json_string_value(json_object_get(cfg, "vision_model_weight")),
                     "vision_weight.q4nx");
    cr_assert(json_is_object(vc));
    static const struct {
        const char *key;
        json_int_t  v;
    } want[] = {{"QWEN3_5_PATCH_SIZE", 16},
                {"QWEN3_5_IMAGE_MERGE_SIZE", 2},
                {"QWEN3_5_SPATIAL_MERGE_SIZE", 2},
                {"QWEN3_5_TEMPORAL_PATCH_SIZE", 2},
                {"QWEN3_5_SHORTEST_EDGE", 65536},
                {"QWEN3_5_LONGEST_EDGE", 16777216},
                {"QWEN3_5_VISION_EMBED_DIM", 32},
                {"QWEN3_5_VISION_NUM_HEADS", 2},
                {"QWEN3_5_VISION_HEAD_DIM", 16},
                {"QWEN3_5_VISION_MLP_INTERMEDIATE_SIZE", 64},
                {"QWEN3_5_VISION_NUM_POSITION_EMBEDDINGS", 64},
                {"QWEN3_5_VISION_NUM_LAYERS", 2},
                {"QWEN3_5_VISION_OUT_HIDDEN_SIZE", 64},
                {"VISION_MM_TILE_N", 64},
                {"VISION_MM_TILE_K", 512}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_eq(json_integer_value(json_object_get(vc, want[i].key)), want[i].v, "%s",
                     want[i].key);
    cr_expect_eq(json_real_value(json_object_get(vc, "QWEN3_5_VISION_RESCALE_FACTOR")),
                 1.0 / 255.0);
    cr_expect_eq(json_real_value(json_object_get(vc, "QWEN3_5_VISION_RESCALE_IMAGE_MEAN")), 0.5);
    cr_expect_eq(json_real_value(json_object_get(vc, "QWEN3_5_VISION_RESCALE_IMAGE_STD")), 0.5);
    size_t mm_n = 0, mm_k = 0;
    cr_assert_eq(eng_q4nx_vision_tiles_from_config(vc, &mm_n, &mm_k, errstr, sizeof errstr),
                 SVC_OK);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/preprocessor_config.json", p.q4nx);
    cr_expect_eq(access(path, R_OK), 0);

    /* vision_weight.q4nx: §2.7's names, BF16, the tiled weights as [Np/64, Kp/512, 32768] */
    snprintf(path, sizeof path, "%s/vision_weight.q4nx", p.q4nx);
    eng_q4nx_t *v = NULL;
    cr_assert_eq(eng_q4nx_open(path, &v, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(eng_q4nx_set_vision_tiles(v, mm_n, mm_k, errstr, sizeof errstr), SVC_OK);
    cr_expect_eq(eng_q4nx_count(v), 2 * 12 + 9);
    cr_expect_eq(eng_q4nx_vision_count(v), eng_q4nx_count(v));
    size_t n_tiled = 0;
    for (size_t i = 0; i < eng_q4nx_count(v); i++) {
        const eng_q4nx_info_t *in = eng_q4nx_at(v, i);
        cr_expect_eq(in->kind, ENG_Q4NX_BF16, "%s", in->name);
        if (!tiled_suffix(in->name))
            continue;
        n_tiled++;
        cr_expect(in->st->rank == 3 && in->st->shape[2] == 32768, "%s", in->name);
        /* tiny's widths are all < 512: one 512 x 512 padded block each */
        cr_expect(in->st->shape[0] == 8 && in->st->shape[1] == 1, "%s", in->name);
    }
    cr_expect_eq(n_tiled, 2 * 4 + 2, "four per block and the merger's two");
    const eng_q4nx_info_t *pe = eng_q4nx_find_hf(v, "model.visual.patch_embed.proj.weight");
    cr_assert_not_null(pe);
    cr_expect(pe->st->rank == 5 && pe->st->shape[0] == 32 && pe->st->shape[1] == 3 &&
              pe->st->shape[2] == 2 && pe->st->shape[3] == 16 && pe->st->shape[4] == 16);

    /* untiled == the twin's F32 == the safetensors package's BF16, exactly */
    eng_st_t *tw = NULL, *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", p.twin);
    cr_assert_eq(eng_st_open(path, &tw, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    snprintf(path, sizeof path, "%s/model.safetensors", p.st);
    cr_assert_eq(eng_st_open(path, &st, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    pw_list_t l = {0};
    cr_assert_eq(pw_vision_tensors(pw_vision_get(ENG_MAKE_TINY), &l), SVC_OK);
    cr_expect_eq(l.n, eng_q4nx_count(v));
    for (size_t i = 0; i < l.n; i++) {
        const pw_tensor_t     *t = &l.v[i];
        const eng_st_tensor_t *a = eng_st_find(tw, t->name), *b = eng_st_find(st, t->name);
        cr_assert(a && b, "%s missing from a safetensors package", t->name);
        cr_expect_eq(a->dtype, ENG_DT_F32);
        size_t n = (size_t)pw_numel(t);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
        cr_assert_eq(eng_q4nx_tensor_f32(v, t->name, t->rank, t->dims, x, errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
        cr_assert_eq(eng_st_to_f32(a, y), SVC_OK);
        cr_assert_eq(eng_st_to_f32(b, z), SVC_OK);
        cr_expect_eq(memcmp(x, y, n * sizeof *x), 0, "%s: q4nx vs twin", t->name);
        cr_expect_eq(memcmp(x, z, n * sizeof *x), 0, "%s: q4nx vs safetensors", t->name);
        free(x);
        free(y);
        free(z);
    }
    free(l.v);
    eng_st_close(tw);
    eng_st_close(st);
    eng_q4nx_close(v);

    /* the twin: HF vision_config, the processor config, the manifest's counts */
    cfg = load_cfg(p.twin);
    cr_expect_eq(
        json_integer_value(json_object_get(json_object_get(cfg, "vision_config"), "hidden_size")),
        32);
    json_decref(cfg);
    loaded_t t;
    load(p.twin, &t);
    cr_expect_eq(eng_model_check_parameters(t.model, p.twin, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    unload(&t);
    rm_tree(p.root);
}

/* ---- the converter's other layouts (Q4NX.md §2.6, §3.3, §8.1) ---- */

/* Only arrays inside: Criterion runs each case in a new process of the
 * binary (BoxFort), where a pointer to this one's data means nothing. */
typedef struct layout_case {
    eng_make_q4nx_t lay;
    char            what[64];
    char            kernels[16], matmul[16]; /* D3_NPU_KERNELS, D3_NPU_MATMUL ("": unset) */
    double          tol, layer_tol;          /* max |dp|; a layer's relative difference */
} layout_case_t;

/* The layout and its name; the kernel fields are the path test's. */
#define LAYOUT(tiles, raster_a, embed_bf16, alpha_tiles, what)                                     \
    { {tiles, raster_a, embed_bf16, alpha_tiles}, what, "", "", 0, 0 }

static const layout_case_t LAYOUTS[] = {
    /* FastFlowLM's converter fed a Q4_0 GGUF: signed codes in Q4_1 tiles */
    LAYOUT(ENG_MAKE_TILES_Q4_0, true, true, true, "q4_0, order A, BF16 embedding, alpha q4_0"),
    LAYOUT(ENG_MAKE_TILES_Q4_0, false, false, false, "q4_0, order B, tied"),
    /* its ROCm-era revision fed a Q4_1 GGUF: order B, no Q4_K tile */
    LAYOUT(ENG_MAKE_TILES_Q4_1, false, true, true, "q4_1, order B, BF16 embedding, alpha q4_1"),
    /* official Gen-A */
    LAYOUT(ENG_MAKE_TILES_Q4_1, true, true, false, "q4_1, order A, BF16 embedding"),
    /* official Gen-B */
    LAYOUT(ENG_MAKE_TILES_Q4_K, false, false, false, "q4_k, order B, tied"),
};
#define N_LAYOUTS (sizeof LAYOUTS / sizeof LAYOUTS[0])

ParameterizedTestParameters(q4nx_package, layouts_read_as_written) {
    return cr_make_param_array(layout_case_t, (void *)LAYOUTS, N_LAYOUTS);
}

/* Every matrix the q4nx package stores in tiles, read back, is the
 * safetensors package's (the values it was quantised from) up to the
 * quantisation error; read with the wrong rules it would be noise
 * (cosine 0.03, or -0.4 for Q4_0 codes read as Q4_1). */
ParameterizedTest(const layout_case_t *c, q4nx_package, layouts_read_as_written, .timeout = 120) {
    pkgs_t p;
    make_laid_out(&p, &c->lay);
    char        path[200], errstr[1024] = "";
    eng_q4nx_t *q = NULL;
    eng_st_t   *st = NULL;
    snprintf(path, sizeof path, "%s/model.q4nx", p.q4nx);
    cr_assert_eq(eng_q4nx_open(path, &q, errstr, sizeof errstr), SVC_OK, "%s: %s", c->what, errstr);
    snprintf(path, sizeof path, "%s/model.safetensors", p.st);
    cr_assert_eq(eng_st_open(path, &st, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    static const eng_q4nx_kind_t four[] = {ENG_Q4NX_Q4_K, ENG_Q4NX_Q4_1, ENG_Q4NX_Q4_0};
    size_t                       n_four = 0, n_checked = 0;
    for (size_t i = 0; i < eng_q4nx_count(q); i++) {
        const eng_q4nx_info_t *in = eng_q4nx_at(q, i);
        if (!eng_q4nx_kind_packed(in->kind) || !in->hf_name)
            continue;
        n_four += in->kind == four[c->lay.tiles];
        bool                   lm = strcmp(in->hf_name, "lm_head.weight") == 0;
        const eng_st_tensor_t *t =
            eng_st_find(st, lm ? "model.language_model.embed_tokens.weight" : in->hf_name);
        cr_assert(t && t->rank == 2, "%s: %s not in the safetensors package", c->what, in->hf_name);
        size_t n = (size_t)(t->shape[0] * t->shape[1]);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        cr_assert_eq(eng_q4nx_tensor_f32(q, in->hf_name, 2, t->shape, x, errstr, sizeof errstr),
                     SVC_OK, "%s: %s", c->what, errstr);
        cr_assert_eq(eng_st_to_f32(t, y), SVC_OK);
        double cs = vec_cosine(x, y, n);
        cr_expect_geq(cs, 0.98, "%s: %s (%s) cosine %.4f to the values it holds", c->what, in->name,
                      eng_q4nx_kind_name(in->kind), cs);
        free(x), free(y);
        n_checked++;
    }
    cr_expect_gt(n_four, 20, "%s: the projections are %s tiles", c->what,
                 eng_q4nx_kind_name(four[c->lay.tiles]));
    cr_expect_gt(n_checked, n_four);
    eng_q4nx_raster_t want = c->lay.raster_a ? ENG_Q4NX_RASTER_A : ENG_Q4NX_RASTER_B;
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++) {
        const eng_q4nx_decision_t *d = eng_q4nx_decision(q, (eng_q4nx_family_t)f);
        cr_expect(!d->present || d->raster == want, "%s: family %d order %c: %s", c->what, f,
                  "AB"[d->raster], d -> how);
        cr_expect(d->present == (f == ENG_Q4NX_FAM_Q8 || c->lay.tiles != ENG_MAKE_TILES_Q4_K),
                  "%s: family %d", c->what, f);
    }
    eng_st_close(st);
    eng_q4nx_close(q);
    rm_tree(p.root);
}

/* Each layout on each kernel path (Criterion runs every case in its own
 * process, so the kernel choice, made once per process, is the case's):
 * the q4nx package answers as its twin, which holds the reader's fp32
 * decode as F32 weights. ref, generic, avx512 and int8x3 take the same
 * values on both sides (measured: equal bits). The default path keeps the
 * q4nx codes (avx512-grp8x2 on VNNI, AMX tiles where the CPU has them)
 * against the twin's int8x3: two roundings of the activations apart, which
 * the random tiny tower amplifies to 2% by its last layer (test_npu_grp
 * holds grp8x2 to the fp32 reference). A misread layout is off by 0.1-0.5
 * in a probability and ~100% in every layer. */
static const struct {
    const char *kernels, *matmul;
    double      tol, layer_tol;
} PATHS[] = {
    {"ref", NULL, 1e-6, 1e-5},   {"generic", NULL, 1e-5, 1e-4}, {"avx512", NULL, 1e-5, 1e-4},
    {NULL, "int8x3", TOL, 1e-3}, {NULL, NULL, 5e-3, 5e-2},
};
#define N_PATHS (sizeof PATHS / sizeof PATHS[0])

ParameterizedTestParameters(q4nx_package, layouts_on_every_kernel_path) {
    static layout_case_t cases[N_LAYOUTS * N_PATHS];
    for (size_t i = 0; i < N_LAYOUTS; i++)
        for (size_t k = 0; k < N_PATHS; k++) {
            layout_case_t *c = &cases[i * N_PATHS + k];
            *c = LAYOUTS[i];
            snprintf(c->kernels, sizeof c->kernels, "%s", PATHS[k].kernels ? PATHS[k].kernels : "");
            snprintf(c->matmul, sizeof c->matmul, "%s", PATHS[k].matmul ? PATHS[k].matmul : "");
            c->tol = PATHS[k].tol;
            c->layer_tol = PATHS[k].layer_tol;
        }
    return cr_make_param_array(layout_case_t, cases, N_LAYOUTS * N_PATHS);
}

ParameterizedTest(const layout_case_t *c, q4nx_package, layouts_on_every_kernel_path,
                  .timeout = 120) {
    if (c->kernels[0])
        cr_assert_eq(setenv("D3_NPU_KERNELS", c->kernels, 1), 0);
    else
        cr_assert_eq(unsetenv("D3_NPU_KERNELS"), 0);
    if (c->matmul[0])
        cr_assert_eq(setenv("D3_NPU_MATMUL", c->matmul, 1), 0);
    else
        cr_assert_eq(unsetenv("D3_NPU_MATMUL"), 0);
    pkgs_t p;
    make_laid_out(&p, &c->lay);
    loaded_t q, t;
    load(p.q4nx, &q);
    load(p.twin, &t);
    double pq[3], pt[3], dp = 0, tol = c->tol;
    answer(&q, pq);
    answer(&t, pt);
    for (size_t i = 0; i < 3; i++)
        dp = fmax(dp, fabs(pq[i] - pt[i]));
    cr_log_info("%s on %s/%s (%s): q4nx vs twin max |dp| %.3g", c->what,
                c->kernels[0] ? c->kernels : "default", c->matmul[0] ? c->matmul : "default",
                npu_matmul_groups_name(), dp);
    cr_expect_leq(dp, tol, "%s on %s/%s: max |dp| %.3g", c->what, c->kernels, c->matmul, dp);
    eng_prompt_t pr;
    eng_prompt_init(&pr);
    prompt_ids(&q, &pr);
    trace_t tq, tt;
    float   fq[64], ft[64];
    run_trace(&q, &pr, &tq, fq);
    run_trace(&t, &pr, &tt, ft);
    for (size_t layer = 0; layer <= tq.n_layers; layer++) {
        size_t n = tq.T * tq.H;
        double d = rel_diff(tq.v + layer * n, tt.v + layer * n, n);
        cr_expect(d <= c->layer_tol, "%s: layer %d: relative difference %.3g", c->what,
                  (int)layer - 1, d);
    }
    free(tq.v);
    free(tt.v);
    eng_prompt_fini(&pr);
    unload(&q);
    unload(&t);
    rm_tree(p.root);
}
