/*
 * test_q4nx_vision.c -- vision_weight.q4nx (engine/eng_q4nx_vision.c and
 * the vision branches of eng_q4nx.c / eng_q4nx_write.c): Q4NX.md §7's
 * worked tiling examples, a writer -> reader round trip, both paddings
 * (§5's max(MM_N, MM_K) one and §7's minimal one), the config.json tile
 * keys, and refusals of wrong shapes, tiles and padding.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng_q4nx_int.h"
#include "test_q4nx_util.h"

/* BF16-representable, distinct-ish values: (i % 251 - 125) / 64. */
static float val(size_t i) {
    return (float)((int)(i % 251) - 125) / 64.0f;
}

/* W[N, K] = val(n * K + k) tiled into shape (any padding), as bytes. */
static uint8_t *tiled(size_t N, size_t K, size_t mm_n, size_t mm_k, const uint64_t shape[3],
                      float **w_out) {
    float *w = malloc(N * K * sizeof *w);
    cr_assert_not_null(w);
    for (size_t i = 0; i < N * K; i++)
        w[i] = val(i);
    uint8_t *d = malloc(2 * shape[0] * shape[1] * shape[2]);
    cr_assert_not_null(d);
    eng_q4nx_vision_tile(w, N, K, mm_n, mm_k, shape, d);
    *w_out = w;
    return d;
}

static float bf_at(const uint8_t *d, uint64_t i) {
    return eng_bf16_to_f32((uint16_t)(d[2 * i] | (d[2 * i + 1] << 8)));
}

/* ------------------------------------------------------------ §7 */

Test(q4nx_vision, worked_examples) {
    uint64_t s[3];
    /* 64 x 512: N padded to 512 (!) -> [8, 1, 32768]; (37, 300) at 19244, byte 38488 */
    eng_q4nx_vision_tiled_shape(64, 512, 64, 512, s);
    cr_expect(s[0] == 8 && s[1] == 1 && s[2] == 32768, "[%llu, %llu, %llu]",
              (unsigned long long)s[0], (unsigned long long)s[1], (unsigned long long)s[2]);
    cr_expect_eq(eng_q4nx_vision_index(37, 300, 1, 64, 512), 19244);
    float   *w;
    uint8_t *d = tiled(64, 512, 64, 512, s, &w);
    cr_expect_eq(bf_at(d, 19244), w[37 * 512 + 300]);
    cr_expect_eq(bf_at(d, 38488 / 2), w[37 * 512 + 300]);
    cr_expect_eq(bf_at(d, 64 * 512), 0.0f, "row 64 is padding");
    free(w);
    free(d);
    /* [128, 1024]: (100, 700) at (1*2+1)*32768 + 36*512 + 188 = 116924, byte 233848,
     * with 2 K-blocks whatever the N padding */
    cr_expect_eq(eng_q4nx_vision_index(100, 700, 2, 64, 512), 116924);
    uint64_t minimal[3] = {2, 2, 32768}; /* §7's shape */
    d = tiled(128, 1024, 64, 512, minimal, &w);
    cr_expect_eq(bf_at(d, 233848 / 2), w[100 * 1024 + 700]);
    free(w);
    free(d);
    /* §5's rule pads N to 512 as well: [8, 2, 32768] */
    eng_q4nx_vision_tiled_shape(128, 1024, 64, 512, s);
    cr_expect(s[0] == 8 && s[1] == 2 && s[2] == 32768);
    /* the 2B's shapes (§2.7) need no padding */
    eng_q4nx_vision_tiled_shape(3072, 1024, 64, 512, s);
    cr_expect(s[0] == 48 && s[1] == 2);
    eng_q4nx_vision_tiled_shape(1024, 4096, 64, 512, s);
    cr_expect(s[0] == 16 && s[1] == 8);
    eng_q4nx_vision_tiled_shape(2048, 4096, 64, 512, s);
    cr_expect(s[0] == 32 && s[1] == 8);
}

Test(q4nx_vision, names) {
    cr_expect(eng_q4nx_vision_name("model.visual.pos_embed.weight"));
    cr_expect(eng_q4nx_vision_name("visual.pos_embed.weight"));
    cr_expect(!eng_q4nx_vision_name("model.visual."));
    cr_expect(!eng_q4nx_vision_name("model.language_model.norm.weight"));
    static const char *const tiled_names[] = {"model.visual.blocks.0.attn.qkv.weight",
                                              "model.visual.blocks.23.attn.proj.weight",
                                              "model.visual.blocks.1.mlp.linear_fc1.weight",
                                              "model.visual.blocks.1.mlp.linear_fc2.weight",
                                              "model.visual.merger.linear_fc1.weight",
                                              "visual.merger.linear_fc2.weight"};
    for (size_t i = 0; i < sizeof tiled_names / sizeof tiled_names[0]; i++)
        cr_expect(eng_q4nx_vision_tiled_name(tiled_names[i]), "%s", tiled_names[i]);
    cr_expect(!eng_q4nx_vision_tiled_name("model.visual.blocks.0.attn.qkv.bias"));
    cr_expect(!eng_q4nx_vision_tiled_name("model.visual.patch_embed.proj.weight"));
    cr_expect(!eng_q4nx_vision_tiled_name("model.visual.pos_embed.weight"));
    cr_expect(!eng_q4nx_vision_tiled_name("model.language_model.layers.0.mlp.fc1.weight"));
    char             out[128];
    eng_q4nx_xform_t xf;
    cr_assert_eq(eng_q4nx_name_from_hf("visual.blocks.2.attn.qkv.weight", out, sizeof out, &xf),
                 SVC_OK);
    cr_expect_str_eq(out, "model.visual.blocks.2.attn.qkv.weight");
    cr_expect_eq(xf, ENG_Q4NX_X_VTILE);
    cr_assert_eq(eng_q4nx_name_to_hf("model.visual.merger.norm.bias", out, sizeof out, &xf),
                 SVC_OK);
    cr_expect_str_eq(out, "model.visual.merger.norm.bias");
    cr_expect_eq(xf, ENG_Q4NX_X_NONE);
}

/* ------------------------------------------------------------ config keys */

Test(q4nx_vision, tiles_from_config) {
    char   errstr[256] = "";
    size_t n = 9, k = 9;
    cr_expect_eq(eng_q4nx_vision_tiles_from_config(NULL, &n, &k, errstr, sizeof errstr), SVC_OK);
    cr_expect(n == 0 && k == 0);
    json_t *vc = json_pack("{sisi}", "VISION_MM_TILE_N", 64, "VISION_MM_TILE_K", 256);
    cr_expect_eq(eng_q4nx_vision_tiles_from_config(vc, &n, &k, errstr, sizeof errstr), SVC_OK);
    cr_expect(n == 64 && k == 256);
    json_decref(vc);
    /* the converter's own spelling, and VISION_MM_TILE_* first when both are there */
    vc = json_pack("{sisisi}", "vision_MM_N", 32, "vision_MM_K", 512, "VISION_MM_TILE_K", 128);
    cr_expect_eq(eng_q4nx_vision_tiles_from_config(vc, &n, &k, errstr, sizeof errstr), SVC_OK);
    cr_expect(n == 32 && k == 128, "%zu %zu", n, k);
    json_decref(vc);
    vc = json_pack("{ss}", "VISION_MM_TILE_K", "512");
    cr_expect_eq(eng_q4nx_vision_tiles_from_config(vc, &n, &k, errstr, sizeof errstr),
                 SVC_ERR_FORMAT);
    cr_expect_not_null(strstr(errstr, "VISION_MM_TILE_K"), "%s", errstr);
    json_decref(vc);
    vc = json_pack("{si}", "vision_MM_N", 0);
    cr_expect_eq(eng_q4nx_vision_tiles_from_config(vc, &n, &k, errstr, sizeof errstr),
                 SVC_ERR_FORMAT);
    json_decref(vc);
    cr_expect(eng_q4nx_vision_tiles_valid(64, 512));
    cr_expect(eng_q4nx_vision_tiles_valid(64, 256));
    cr_expect(!eng_q4nx_vision_tiles_valid(48, 512), "512 is no multiple of 48");
    cr_expect(!eng_q4nx_vision_tiles_valid(64, 8192));
}

/* ------------------------------------------------------------ round trip */

typedef struct vt {
    const char *name;
    size_t      rank;
    uint64_t    dims[5];
} vt_t;

/* A tiny tower's worth: hidden 32, intermediate 64, patch 16, temporal 2, npos 64. */
static const vt_t TOWER[] = {
    {"model.visual.patch_embed.proj.weight", 5, {32, 3, 2, 16, 16}},
    {"model.visual.patch_embed.proj.bias", 1, {32}},
    {"model.visual.pos_embed.weight", 2, {64, 32}},
    {"model.visual.blocks.0.norm1.weight", 1, {32}},
    {"model.visual.blocks.0.attn.qkv.weight", 2, {96, 32}},
    {"model.visual.blocks.0.attn.qkv.bias", 1, {96}},
    {"model.visual.blocks.0.attn.proj.weight", 2, {32, 32}},
    {"model.visual.blocks.0.mlp.linear_fc1.weight", 2, {64, 32}},
    {"model.visual.blocks.0.mlp.linear_fc2.weight", 2, {32, 64}},
    {"model.visual.merger.linear_fc1.weight", 2, {128, 128}},
    {"model.visual.merger.linear_fc2.weight", 2, {64, 128}},
};
#define N_TOWER (sizeof TOWER / sizeof TOWER[0])

static size_t numel(const vt_t *t) {
    size_t n = 1;
    for (size_t i = 0; i < t->rank; i++)
        n *= t->dims[i];
    return n;
}

/* Writes TOWER (values val(i + 7 * tensor)) with tiles mm_n x mm_k, plus
 * optional text tensors (a file as C-main writes, everything in one). */
static void write_tower(const char *path, size_t mm_n, size_t mm_k, bool with_text) {
    eng_q4nx_writer_t *w = NULL;
    char               errstr[512] = "";
    cr_assert_eq(eng_q4nx_writer_new(16, &w), SVC_OK);
    cr_assert_eq(eng_q4nx_writer_set_vision_tiles(w, mm_n, mm_k), SVC_OK);
    for (size_t t = 0; t < N_TOWER; t++) {
        size_t n = numel(&TOWER[t]);
        float *x = malloc(n * sizeof *x);
        for (size_t i = 0; i < n; i++)
            x[i] = val(i + 7 * t);
        cr_assert_eq(eng_q4nx_writer_add(w, TOWER[t].name, TOWER[t].rank, TOWER[t].dims, x,
                                         ENG_Q4NX_AUTO, errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
        free(x);
    }
    if (with_text) {
        float    a[16 * 64], nw[64];
        uint64_t da[2] = {16, 64}, dn[1] = {64};
        for (size_t i = 0; i < 16 * 64; i++)
            a[i] = val(i) / 8;
        for (size_t i = 0; i < 64; i++)
            nw[i] = val(i) / 4;
        cr_assert_eq(
            eng_q4nx_writer_add(w, "model.language_model.layers.0.linear_attn.in_proj_a.weight", 2,
                                da, a, ENG_Q4NX_AUTO, errstr, sizeof errstr),
            SVC_OK, "%s", errstr);
        cr_assert_eq(eng_q4nx_writer_add(w, "model.language_model.norm.weight", 1, dn, nw,
                                         ENG_Q4NX_AUTO, errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
    }
    cr_assert_eq(eng_q4nx_writer_finish(w, path, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_q4nx_writer_free(w);
}

static void check_tower(const eng_q4nx_t *q) {
    char errstr[512] = "";
    for (size_t t = 0; t < N_TOWER; t++) {
        size_t n = numel(&TOWER[t]);
        float *x = malloc(n * sizeof *x);
        cr_assert_eq(eng_q4nx_tensor_f32(q, TOWER[t].name, TOWER[t].rank, TOWER[t].dims, x, errstr,
                                         sizeof errstr),
                     SVC_OK, "%s", errstr);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(x[i], val(i + 7 * t), "%s[%zu] = %g", TOWER[t].name, i, (double)x[i]);
        free(x);
    }
}

Test(q4nx_vision, round_trip_default_tiles) {
    const char *path = tmp_path();
    write_tower(path, 64, 512, false);
    eng_q4nx_t *q = NULL;
    char        errstr[512] = "";
    cr_assert_eq(eng_q4nx_open(path, &q, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_expect_eq(eng_q4nx_count(q), N_TOWER);
    cr_expect_eq(eng_q4nx_vision_count(q), N_TOWER);
    /* stored shapes: §5's padding to 512 on both sides */
    const eng_q4nx_info_t *in = eng_q4nx_find_hf(q, "visual.blocks.0.attn.qkv.weight");
    cr_assert_not_null(in);
    cr_expect_str_eq(in->name, "model.visual.blocks.0.attn.qkv.weight");
    cr_expect_str_eq(in->hf_name, "model.visual.blocks.0.attn.qkv.weight");
    cr_expect_eq(in->kind, ENG_Q4NX_BF16);
    cr_expect_eq(in->xform, ENG_Q4NX_X_VTILE);
    cr_expect(in->st->rank == 3 && in->st->shape[0] == 8 && in->st->shape[1] == 1 &&
              in->st->shape[2] == 32768);
    in = eng_q4nx_find_hf(q, "model.visual.patch_embed.proj.weight");
    cr_assert_not_null(in);
    cr_expect(in->st->rank == 5 && in->st->shape[0] == 32 && in->st->shape[4] == 16);
    /* §5's fallback (MM_K = 32768 / 64) and the sizes set explicitly read the same */
    check_tower(q);
    cr_assert_eq(eng_q4nx_set_vision_tiles(q, 64, 512, errstr, sizeof errstr), SVC_OK);
    check_tower(q);
    /* the HF alias works for reading too */
    float    b[96];
    uint64_t db[1] = {96};
    cr_expect_eq(
        eng_q4nx_tensor_f32(q, "visual.blocks.0.attn.qkv.bias", 1, db, b, errstr, sizeof errstr),
        SVC_OK, "%s", errstr);
    eng_q4nx_close(q);
    unlink(path);
}

Test(q4nx_vision, round_trip_config_tiles) {
    const char *path = tmp_path();
    write_tower(path, 64, 256, false); /* the 0.8B's K tile (§5) */
    eng_q4nx_t *q = NULL;
    char        errstr[512] = "";
    cr_assert_eq(eng_q4nx_open(path, &q, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    json_t *vc = json_pack("{sisi}", "VISION_MM_TILE_N", 64, "VISION_MM_TILE_K", 256);
    size_t  n, k;
    cr_assert_eq(eng_q4nx_vision_tiles_from_config(vc, &n, &k, errstr, sizeof errstr), SVC_OK);
    json_decref(vc);
    cr_assert_eq(eng_q4nx_set_vision_tiles(q, n, k, errstr, sizeof errstr), SVC_OK);
    eng_q4nx_vision_tiles(q, &n, &k);
    cr_expect(n == 64 && k == 256);
    check_tower(q);
    /* the fallback gives the same here: MM_K = 16384 / 64 = 256 */
    cr_assert_eq(eng_q4nx_set_vision_tiles(q, 0, 0, errstr, sizeof errstr), SVC_OK);
    check_tower(q);
    /* the wrong sizes: the block size no longer matches */
    cr_assert_eq(eng_q4nx_set_vision_tiles(q, 64, 512, errstr, sizeof errstr), SVC_OK);
    float    x[96 * 32];
    uint64_t d[2] = {96, 32};
    cr_expect_eq(eng_q4nx_tensor_f32(q, "model.visual.blocks.0.attn.qkv.weight", 2, d, x, errstr,
                                     sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "MM_N x MM_K = 64 x 512"), "%s", errstr);
    cr_expect_not_null(strstr(errstr, path), "%s", errstr);
    cr_expect_null(strchr(errstr, '\n'));
    cr_expect_eq(eng_q4nx_set_vision_tiles(q, 48, 512, errstr, sizeof errstr), SVC_ERR_INVALID);
    eng_q4nx_close(q);
    unlink(path);
}

/* Vision tensors next to text ones (C-main writes both into model.q4nx):
 * the text reader's detection and reads are unaffected. */
Test(q4nx_vision, mixed_file_text_checks_unaffected) {
    const char *path = tmp_path();
    write_tower(path, 64, 512, true);
    eng_q4nx_t *q = NULL;
    char        errstr[512] = "";
    cr_assert_eq(eng_q4nx_open(path, &q, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_expect_eq(eng_q4nx_generation(q), ENG_Q4NX_GEN_B);
    cr_expect_eq(eng_q4nx_q8_raster(q), ENG_Q4NX_RASTER_B, "the alpha probe still decides");
    cr_expect_eq(eng_q4nx_vision_count(q), N_TOWER);
    cr_expect_eq(eng_q4nx_count(q), N_TOWER + 3); /* alpha, its .bf16 copy, norm */
    float    nw[64];
    uint64_t dn[1] = {64};
    cr_assert_eq(eng_q4nx_tensor_f32(q, "model.language_model.norm.weight", 1, dn, nw, errstr,
                                     sizeof errstr),
                 SVC_OK, "%s", errstr);
    cr_expect_eq(nw[5], val(5) / 4);
    check_tower(q);
    eng_q4nx_close(q);
    unlink(path);
}

/* ------------------------------------------------------------ padding and refusals */

static eng_q4nx_t *open_one(const char *path, const char *name, const uint64_t shape[3],
                            const uint8_t *d) {
    ent_t e = {
        name, "BF16", 3, {shape[0], shape[1], shape[2]}, d, 2 * shape[0] * shape[1] * shape[2]};
    write_st(path, &e, 1);
    eng_q4nx_t *q = NULL;
    char        errstr[512] = "";
    cr_assert_eq(eng_q4nx_open(path, &q, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    return q;
}

Test(q4nx_vision, both_paddings_read) {
    static const char *const name = "model.visual.blocks.0.attn.proj.weight";
    const uint64_t           shapes[2][3] = {{2, 2, 32768}, {8, 2, 32768}};
    for (size_t s = 0; s < 2; s++) {
        const char *path = tmp_path();
        float      *w;
        uint8_t    *d = tiled(100, 700, 64, 512, shapes[s], &w);
        eng_q4nx_t *q = open_one(path, name, shapes[s], d);
        float      *x = malloc(100 * 700 * sizeof *x);
        char        errstr[512] = "";
        uint64_t    dims[2] = {100, 700};
        cr_assert_eq(eng_q4nx_tensor_f32(q, name, 2, dims, x, errstr, sizeof errstr), SVC_OK,
                     "shape %zu: %s", s, errstr);
        cr_expect_eq(memcmp(x, w, 100 * 700 * sizeof *x), 0);
        /* asked for as stored: the tiles themselves */
        float *raw = malloc(shapes[s][0] * shapes[s][1] * 32768 * sizeof *raw);
        cr_expect_eq(eng_q4nx_tensor_f32(q, name, 3, shapes[s], raw, errstr, sizeof errstr), SVC_OK,
                     "%s", errstr);
        cr_expect_eq(raw[eng_q4nx_vision_index(99, 699, 2, 64, 512)], w[99 * 700 + 699]);
        free(raw);
        /* a shape the grid cannot hold, and one it would hold with more padding than allowed */
        uint64_t big[2] = {shapes[s][0] * 64 + 1, 700}, small[2] = {60, 700};
        cr_expect_eq(eng_q4nx_tensor_f32(q, name, 2, big, x, errstr, sizeof errstr),
                     SVC_ERR_INVALID);
        cr_expect_not_null(strstr(errstr, "cannot hold ["), "%s", errstr);
        cr_expect_not_null(strstr(errstr, name), "%s", errstr);
        if (s == 0) {
            cr_expect_eq(eng_q4nx_tensor_f32(q, name, 2, small, x, errstr, sizeof errstr),
                         SVC_ERR_INVALID, "[2, 2] blocks hold 65..128 rows, not 60");
        }
        free(x);
        free(w);
        free(d);
        eng_q4nx_close(q);
        unlink(path);
    }
}

Test(q4nx_vision, dirty_padding_refused) {
    static const char *const name = "model.visual.merger.linear_fc2.weight";
    const char              *path = tmp_path();
    uint64_t                 shape[3] = {8, 1, 32768};
    float                   *w;
    uint8_t                 *d = tiled(64, 128, 64, 512, shape, &w);
    /* W[70, 3] is padding (row >= 64); so is W[5, 200] (column >= 128) */
    uint64_t i = eng_q4nx_vision_index(5, 200, 1, 64, 512);
    d[2 * i + 1] = 0x3f;
    eng_q4nx_t *q = open_one(path, name, shape, d);
    float      *x = malloc(64 * 128 * sizeof *x);
    char        errstr[512] = "";
    uint64_t    dims[2] = {64, 128};
    cr_expect_eq(eng_q4nx_tensor_f32(q, name, 2, dims, x, errstr, sizeof errstr), SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "padding element (5, 200)"), "%s", errstr);
    cr_expect_null(strchr(errstr, '\n'));
    eng_q4nx_close(q);
    /* -0.0 is zero padding too */
    d[2 * i + 1] = 0x80;
    q = open_one(path, name, shape, d);
    cr_expect_eq(eng_q4nx_tensor_f32(q, name, 2, dims, x, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_expect_eq(memcmp(x, w, 64 * 128 * sizeof *x), 0);
    eng_q4nx_close(q);
    free(x);
    free(w);
    free(d);
    unlink(path);
}

Test(q4nx_vision, wrong_shapes_refused) {
    const char *path = tmp_path();
    write_tower(path, 64, 512, false);
    eng_q4nx_t *q = NULL;
    char        errstr[512] = "";
    cr_assert_eq(eng_q4nx_open(path, &q, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    float   *x = malloc(4096 * 1024 * sizeof *x);
    uint64_t qkv[2] = {3072, 1024}, pos[2] = {2304, 32}, pe[5] = {32, 3, 2, 14, 14};
    cr_expect_eq(eng_q4nx_tensor_f32(q, "model.visual.blocks.0.attn.qkv.weight", 2, qkv, x, errstr,
                                     sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "expected [48, 2, 32768]"), "%s", errstr);
    cr_expect_eq(
        eng_q4nx_tensor_f32(q, "model.visual.pos_embed.weight", 2, pos, x, errstr, sizeof errstr),
        SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "stored [64, 32], expected [2304, 32]"), "%s", errstr);
    cr_expect_eq(eng_q4nx_tensor_f32(q, "model.visual.patch_embed.proj.weight", 5, pe, x, errstr,
                                     sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_eq(eng_q4nx_tensor_f32(q, "model.visual.blocks.1.norm1.weight", 1, pe, x, errstr,
                                     sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "is missing"), "%s", errstr);
    free(x);
    eng_q4nx_close(q);
    unlink(path);

    /* a block size §5's fallback cannot split (not a multiple of 64) */
    uint64_t shape[3] = {1, 1, 1000};
    uint8_t *d = calloc(2000, 1);
    q = open_one(path, "model.visual.blocks.0.mlp.linear_fc1.weight", shape, d);
    float    y[10];
    uint64_t dims[2] = {2, 5};
    cr_expect_eq(eng_q4nx_tensor_f32(q, "model.visual.blocks.0.mlp.linear_fc1.weight", 2, dims, y,
                                     errstr, sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "blocks of 1000 elements"), "%s", errstr);
    cr_expect_not_null(strstr(errstr, "no VISION_MM_TILE_N/K"), "%s", errstr);
    eng_q4nx_close(q);
    free(d);
    unlink(path);
}

Test(q4nx_vision, writer_refusals) {
    eng_q4nx_writer_t *w = NULL;
    char               errstr[512] = "";
    cr_assert_eq(eng_q4nx_writer_new(16, &w), SVC_OK);
    cr_expect_eq(eng_q4nx_writer_set_vision_tiles(w, 0, 512), SVC_ERR_INVALID);
    cr_expect_eq(eng_q4nx_writer_set_vision_tiles(w, 48, 512), SVC_ERR_INVALID);
    float    x[8 * 4 * 2] = {0};
    uint64_t d3[3] = {8, 4, 2}, d2[2] = {8, 8};
    cr_expect_eq(eng_q4nx_writer_add(w, "model.visual.blocks.0.attn.qkv.weight", 3, d3, x,
                                     ENG_Q4NX_AUTO, errstr, sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "2-D"), "%s", errstr);
    cr_expect_eq(eng_q4nx_writer_add(w, "model.visual.blocks.0.attn.qkv.weight", 2, d2, x,
                                     ENG_Q4NX_Q4_K, errstr, sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_not_null(strstr(errstr, "BF16"), "%s", errstr);
    cr_expect_eq(eng_q4nx_writer_add(w, "model.visual.blocks.0.attn.qkv.weight", 2, d2, x,
                                     ENG_Q4NX_AUTO, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
    cr_expect_eq(eng_q4nx_writer_add(w, "visual.blocks.0.attn.qkv.weight", 2, d2, x, ENG_Q4NX_AUTO,
                                     errstr, sizeof errstr),
                 SVC_ERR_INVALID, "the same tensor under its other prefix");
    eng_q4nx_writer_free(w);
}
