/*
 * test_q4nx.c -- the Q4NX codec (engine/eng_q4nx*.c): tile byte maps from
 * Q4NX.md §7's worked example, encoder round trips and their error bounds,
 * the name/transform table (§2.3-§2.5), generation/raster detection (§8),
 * a file round trip through the writer, and refusals of broken files.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng_q4nx_int.h"
#include "test_q4nx_util.h"

/* ------------------------------------------------------------ kinds, bf16 */

Test(q4nx, kind_table) {
    cr_expect_eq(eng_q4nx_tile_bytes(ENG_Q4NX_Q4_1), 5120);
    cr_expect_eq(eng_q4nx_tile_bytes(ENG_Q4NX_Q4_K), 4736);
    cr_expect_eq(eng_q4nx_tile_bytes(ENG_Q4NX_Q8), 8704);
    cr_expect_eq(eng_q4nx_tile_bytes(ENG_Q4NX_Q8_LEGACY), 5120);
    cr_expect_eq(eng_q4nx_tile_cols(ENG_Q4NX_Q8_LEGACY), 128);
    cr_expect_not(eng_q4nx_kind_packed(ENG_Q4NX_BF16));
    /* 248320 x 2048 lm_head: [7760, 8, 8704] = 540,344,320 bytes (§2.5). */
    cr_expect_eq(eng_q4nx_packed_bytes(ENG_Q4NX_Q8, 248320, 2048), 540344320u);
    cr_expect_eq(eng_q4nx_packed_bytes(ENG_Q4NX_Q4_K, 33, 257), 4u * 4736u);
}

Test(q4nx, bf16_rounding) {
    cr_expect_eq(eng_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(eng_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie -> even */
    cr_expect_eq(eng_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    cr_expect_eq(eng_f32_to_bf16(-2.0f), 0xc000);
    cr_expect_eq(eng_f32_to_bf16_up(1.0f), 0x3f80);
    cr_expect_eq(eng_f32_to_bf16_up(1.0f + 0x1p-20f), 0x3f81);
    cr_expect_eq(eng_f32_to_bf16_up(0.0f), 0);
    cr_expect(isnan(eng_bf16_to_f32(eng_f32_to_bf16(NAN))));
}

/* ------------------------------------------------------------ byte maps */

/* One non-zero code at a documented byte: in a 64 x 512 matrix (§7) only
 * element (r, k) may decode non-zero. */
typedef struct {
    eng_q4nx_kind_t   kind;
    eng_q4nx_raster_t ra;
    size_t            r, k;
    size_t            byte;
    int               high; /* nibble half for 4-bit kinds */
} pos_t;

static const pos_t POS[] = {
    /* §7 table and the "more raster-A Q4_1 positions" list */
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 37, 300, 16738, 1},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 0, 0, 1024, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 1, 0, 1024, 1},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 2, 0, 1025, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 15, 0, 1031, 1},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 16, 0, 3072, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 0, 1, 1032, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 0, 32, 1280, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 0, 255, 3064, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 0, 256, 5120 + 1024, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 32, 0, 10240 + 1024, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 63, 511, 20479, 1},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_B, 37, 300, 17090, 1},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_B, 16, 0, 1032, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_B, 0, 1, 1040, 0},
    {ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_B, 0, 255, 5104, 0},
    {ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, 37, 300, 15426, 1},
    {ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, 0, 0, 512, 0},
    {ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, 17, 1, 512 + 16 + 8, 1},
    {ENG_Q4NX_Q8, ENG_Q4NX_RASTER_A, 37, 300, 27333, 0},
    {ENG_Q4NX_Q8, ENG_Q4NX_RASTER_A, 16, 0, 512 + 4096, 0}, /* §4.2 formula */
    {ENG_Q4NX_Q8, ENG_Q4NX_RASTER_B, 37, 300, 28037, 0},
    {ENG_Q4NX_Q8, ENG_Q4NX_RASTER_B, 16, 0, 512 + 16, 0},
    {ENG_Q4NX_Q8_LEGACY, ENG_Q4NX_RASTER_A, 37, 300, 31941, 0},
};

/* Every scale 1 (and mins 0), so each code decodes to itself. */
static void unit_scales(eng_q4nx_kind_t kind, uint8_t *buf, size_t ntiles) {
    size_t tb = eng_q4nx_tile_bytes(kind);
    for (size_t t = 0; t < ntiles; t++) {
        uint8_t *p = buf + t * tb;
        if (kind == ENG_Q4NX_Q4_K) {
            memset(p, 1, 256); /* s8 = 1, m8 = 0 */
            for (size_t rt = 0; rt < 32; rt++)
                wr16(p + 4608 + 2 * rt, BF_ONE);
        } else {
            for (size_t s = 0; s < (kind == ENG_Q4NX_Q8_LEGACY ? 256u : 256u); s++)
                wr16(p + 2 * s, BF_ONE);
        }
    }
}

Test(q4nx, code_positions) {
    for (size_t i = 0; i < sizeof POS / sizeof POS[0]; i++) {
        const pos_t *c = &POS[i];
        size_t       Q = c->kind == ENG_Q4NX_Q8_LEGACY ? 4 : 2, tb = eng_q4nx_tile_bytes(c->kind);
        uint8_t     *buf = calloc(2 * Q, tb);
        float       *out = malloc(64 * 512 * sizeof *out);
        unit_scales(c->kind, buf, 2 * Q);
        bool four = c->kind == ENG_Q4NX_Q4_1 || c->kind == ENG_Q4NX_Q4_K;
        buf[c->byte] = four ? (uint8_t)(c->high ? 0x50 : 0x05) : 0x05;
        eng_q4nx_decode_ref(c->kind, c->ra, buf, 2, Q, 64, 512, out);
        for (size_t r = 0; r < 64; r++)
            for (size_t k = 0; k < 512; k++) {
                float want = (r == c->r && k == c->k) ? 5.0f : 0.0f;
                cr_assert_eq(out[r * 512 + k], want, "case %zu (%s %c): (%zu, %zu) = %g, want %g",
                             i, eng_q4nx_kind_name(c->kind), c->ra ? 'B' : 'A', r, k,
                             (double)out[r * 512 + k], (double)want);
            }
        free(buf);
        free(out);
    }
}

/* §7: the per-(row, group) parameters of element (37, 300) and where they act. */
Test(q4nx, scale_positions) {
    /* Q4_1: d at 15434, m at 15946 act on row 37, columns 288..319 only. */
    uint8_t *b = calloc(4, 5120);
    float   *out = malloc(64 * 512 * sizeof *out);
    wr16(b + 15434, 0x4000);                 /* d = 2 */
    wr16(b + 15946, eng_f32_to_bf16(-0.5f)); /* m */
    b[16738] = 0x30;                         /* n = 3 at (37, 300) */
    eng_q4nx_decode_ref(ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, b, 2, 2, 64, 512, out);
    for (size_t r = 0; r < 64; r++)
        for (size_t k = 0; k < 512; k++) {
            float want = (r == 37 && k == 300)              ? 5.5f
                         : (r == 37 && k >= 288 && k < 320) ? -0.5f
                                                            : 0;
            cr_assert_eq(out[r * 512 + k], want, "q4_1 (%zu, %zu)", r, k);
        }
    free(b);
    /* Q4_K: s8 14245, m8 14501, S 18826 (per row), M 18890 (negated). */
    b = calloc(4, 4736);
    b[14245] = 3;
    b[14501] = 4;
    wr16(b + 18826, eng_f32_to_bf16(0.5f));
    wr16(b + 18890, eng_f32_to_bf16(-0.25f));
    b[15426] = 0x20; /* n = 2 */
    eng_q4nx_decode_ref(ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, b, 2, 2, 64, 512, out);
    for (size_t r = 0; r < 64; r++)
        for (size_t k = 0; k < 512; k++) {
            float want = (r == 37 && k == 300)              ? 0.5f * 3 * 2 - 0.25f * 4
                         : (r == 37 && k >= 288 && k < 320) ? -1.0f
                                                            : 0;
            cr_assert_eq(out[r * 512 + k], want, "q4_k (%zu, %zu)", r, k);
        }
    free(b);
    /* Q8: d at 26186, signed codes. */
    b = calloc(4, 8704);
    wr16(b + 26186, eng_f32_to_bf16(0.25f));
    b[28037] = 0xfe; /* -2, raster B */
    eng_q4nx_decode_ref(ENG_Q4NX_Q8, ENG_Q4NX_RASTER_B, b, 2, 2, 64, 512, out);
    cr_expect_eq(out[37 * 512 + 300], -0.5f);
    free(b);
    /* Legacy Q8: d at 30794 (tile 6 of [2, 4, 5120]). */
    b = calloc(8, 5120);
    wr16(b + 30794, eng_f32_to_bf16(0.25f));
    b[31941] = 0x7f;
    eng_q4nx_decode_ref(ENG_Q4NX_Q8_LEGACY, ENG_Q4NX_RASTER_A, b, 2, 4, 64, 512, out);
    cr_expect_eq(out[37 * 512 + 300], 31.75f);
    free(b);
    free(out);
}

/* ------------------------------------------------------------ round trips */

/* |decoded - x| <= step/2 (+ float slack) per element; step read from the
 * tile the element lives in. Returns the RMS error over the matrix. */
static double check_bound(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, size_t R, size_t K) {
    float   *x = malloc(R * K * sizeof *x), *y = malloc(R * K * sizeof *y);
    size_t   nb = eng_q4nx_packed_bytes(kind, R, K), tb = eng_q4nx_tile_bytes(kind);
    uint8_t *p = malloc(nb);
    for (size_t i = 0; i < R * K; i++)
        x[i] = frand() * (1.0f + (float)(i % 7)) + ((i / K) % 5 == 0 ? 3.0f : 0.0f);
    for (size_t k = 0; k < K; k++)
        x[k] = 0; /* an all-zero row must come back exact */
    cr_assert_eq(eng_q4nx_encode_ref(kind, ra, x, R, K, p), SVC_OK);
    size_t P = (R + 31) / 32, Q = (K + 255) / 256;
    eng_q4nx_decode_ref(kind, ra, p, P, Q, R, K, y);
    double se = 0;
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < K; k++) {
            const uint8_t *t = p + ((r / 32) * Q + k / 256) * tb;
            size_t         rt = r % 32, s = ((k % 256) / 32) * 32 + rt;
            float          step =
                kind == ENG_Q4NX_Q4_K ? bf(t + 4608 + 2 * rt) * (float)t[s] : bf(t + 2 * s);
            float e = fabsf(y[r * K + k] - x[r * K + k]);
            se += (double)e * e;
            cr_assert_leq(e, 0.5f * step * 1.0001f + 1e-6f, "%s: (%zu, %zu) x=%g y=%g step=%g",
                          eng_q4nx_kind_name(kind), r, k, (double)x[r * K + k],
                          (double)y[r * K + k], (double)step);
            if (r == 0)
                cr_assert_eq(y[k], 0.0f);
        }
    free(x);
    free(y);
    free(p);
    return sqrt(se / (double)(R * K));
}

Test(q4nx, q4k_round_trip) {
    double rms = check_bound(ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, 70, 600);
    cr_expect_lt(rms, 0.35, "rms %g", rms); /* ~ step / sqrt(12) */
}

Test(q4nx, q8_round_trip) {
    double a = check_bound(ENG_Q4NX_Q8, ENG_Q4NX_RASTER_A, 40, 300);
    double b = check_bound(ENG_Q4NX_Q8, ENG_Q4NX_RASTER_B, 64, 512);
    cr_expect_lt(a, 0.02);
    cr_expect_lt(b, 0.02);
}

Test(q4nx, q41_round_trip) {
    check_bound(ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, 33, 256);
    check_bound(ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_B, 32, 700);
}

Test(q4nx, encoders_refuse_non_finite) {
    float   x[64] = {0};
    uint8_t p[8704];
    x[5] = NAN;
    cr_expect_eq(eng_q4nx_encode_q4k_ref(x, 1, 64, p), SVC_ERR_INVALID);
    x[5] = INFINITY;
    cr_expect_eq(eng_q4nx_encode_q8_ref(x, 1, 64, ENG_Q4NX_RASTER_B, p), SVC_ERR_INVALID);
    x[5] = 1e31f;
    cr_expect_eq(eng_q4nx_encode_q41_ref(x, 1, 64, ENG_Q4NX_RASTER_A, p), SVC_ERR_INVALID);
}

/* ------------------------------------------------------------ names */

typedef struct {
    const char      *q4nx, *hf;
    eng_q4nx_xform_t xf;
} name_case_t;

static const name_case_t NAMES[] = {
    {"model.embed_tokens.weight", "model.language_model.embed_tokens.weight", ENG_Q4NX_X_NONE},
    {"model.norm.weight", "model.language_model.norm.weight", ENG_Q4NX_X_PLUS1},
    {"lm_head.weight", "lm_head.weight", ENG_Q4NX_X_NONE},
    {"model.layers.0.input_layernorm.weight",
     "model.language_model.layers.0.input_layernorm.weight", ENG_Q4NX_X_PLUS1},
    {"model.layers.0.post_attention_layernorm.weight",
     "model.language_model.layers.0.post_attention_layernorm.weight", ENG_Q4NX_X_PLUS1},
    {"model.layers.0.linear_attn.qkv_proj.weight",
     "model.language_model.layers.0.linear_attn.in_proj_qkv.weight", ENG_Q4NX_X_NONE},
    {"model.layers.2.self_attn.gate_proj.weight",
     "model.language_model.layers.2.linear_attn.in_proj_z.weight", ENG_Q4NX_X_NONE},
    {"model.layers.0.linear_attn.ssm_out_proj.weight",
     "model.language_model.layers.0.linear_attn.out_proj.weight", ENG_Q4NX_X_NONE},
    {"model.layers.0.linear_attn.ssm_alpha_proj.weight",
     "model.language_model.layers.0.linear_attn.in_proj_a.weight", ENG_Q4NX_X_ROW_DUP},
    {"model.layers.0.linear_attn.ssm_beta_proj.weight",
     "model.language_model.layers.0.linear_attn.in_proj_b.weight", ENG_Q4NX_X_ROW_DUP},
    {"model.layers.0.linear_attn.ssm_conv1d.weight",
     "model.language_model.layers.0.linear_attn.conv1d.weight", ENG_Q4NX_X_CONV_T},
    {"model.layers.0.linear_attn.ssm_norm.weight",
     "model.language_model.layers.0.linear_attn.norm.weight", ENG_Q4NX_X_NONE},
    {"model.layers.0.linear_attn.ssm_a", "model.language_model.layers.0.linear_attn.A_log",
     ENG_Q4NX_X_NEG_EXP},
    {"model.layers.0.linear_attn.ssm_dt.bias", "model.language_model.layers.0.linear_attn.dt_bias",
     ENG_Q4NX_X_NONE},
    {"model.layers.23.mlp.gate_proj.weight", "model.language_model.layers.23.mlp.gate_proj.weight",
     ENG_Q4NX_X_NONE},
    {"model.layers.23.mlp.up_proj.weight", "model.language_model.layers.23.mlp.up_proj.weight",
     ENG_Q4NX_X_NONE},
    {"model.layers.23.mlp.down_proj.weight", "model.language_model.layers.23.mlp.down_proj.weight",
     ENG_Q4NX_X_NONE},
    {"model.layers.3.self_attn.q_proj.weight",
     "model.language_model.layers.3.self_attn.q_proj.weight", ENG_Q4NX_X_Q_REGROUP},
    {"model.layers.3.self_attn.k_proj.weight",
     "model.language_model.layers.3.self_attn.k_proj.weight", ENG_Q4NX_X_NONE},
    {"model.layers.3.self_attn.v_proj.weight",
     "model.language_model.layers.3.self_attn.v_proj.weight", ENG_Q4NX_X_NONE},
    {"model.layers.3.self_attn.o_proj.weight",
     "model.language_model.layers.3.self_attn.o_proj.weight", ENG_Q4NX_X_NONE},
    {"model.layers.3.self_attn.q_norm.weight",
     "model.language_model.layers.3.self_attn.q_norm.weight", ENG_Q4NX_X_PLUS1},
    {"model.layers.3.self_attn.k_norm.weight",
     "model.language_model.layers.3.self_attn.k_norm.weight", ENG_Q4NX_X_PLUS1},
};

Test(q4nx, name_table) {
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        char             buf[256];
        eng_q4nx_xform_t xf = (eng_q4nx_xform_t)-1;
        cr_assert_eq(eng_q4nx_name_to_hf(NAMES[i].q4nx, buf, sizeof buf, &xf), SVC_OK, "%s",
                     NAMES[i].q4nx);
        cr_expect_str_eq(buf, NAMES[i].hf);
        cr_expect_eq(xf, NAMES[i].xf, "%s", NAMES[i].q4nx);
        cr_assert_eq(eng_q4nx_name_from_hf(NAMES[i].hf, buf, sizeof buf, &xf), SVC_OK);
        cr_expect_str_eq(buf, NAMES[i].q4nx);
    }
    char             buf[256];
    eng_q4nx_xform_t xf;
    /* HF prefixes accepted by lookups */
    cr_assert_eq(eng_q4nx_name_from_hf("layers.7.mlp.up_proj.weight", buf, sizeof buf, &xf), 0);
    cr_expect_str_eq(buf, "model.layers.7.mlp.up_proj.weight");
    cr_assert_eq(eng_q4nx_name_from_hf("language_model.norm.weight", buf, sizeof buf, &xf), 0);
    cr_expect_str_eq(buf, "model.norm.weight");
    /* vision names are their own HF names (§2.7; test_q4nx_vision.c) */
    cr_assert_eq(eng_q4nx_name_to_hf("model.visual.blocks.0.attn.qkv.weight", buf, sizeof buf, &xf),
                 SVC_OK);
    cr_expect_eq(xf, ENG_Q4NX_X_VTILE);
    /* no HF counterpart (a stored name always has the model. prefix) */
    static const char *bad_q[] = {"model.layers.0.linear_attn.ssm_alpha_proj.bf16.weight",
                                  "model.layers.01.mlp.up_proj.weight",
                                  "model.layers.x.mlp",
                                  "visual.blocks.0.attn.qkv.weight",
                                  "model.visual.",
                                  ""};
    for (size_t i = 0; i < sizeof bad_q / sizeof bad_q[0]; i++)
        cr_expect_neq(eng_q4nx_name_to_hf(bad_q[i], buf, sizeof buf, &xf), SVC_OK, "%s", bad_q[i]);
    cr_expect_neq(
        eng_q4nx_name_from_hf("model.language_model.layers.0.mlp.foo", buf, sizeof buf, &xf),
        SVC_OK);
    cr_expect_neq(eng_q4nx_name_to_hf("model.norm.weight", buf, 4, &xf), SVC_OK); /* too small */
}

/* ------------------------------------------------------------ file round trip */

/* A tiny Qwen3.5-like tower: H = 256, layer 0 Gated DeltaNet (nk = nv = 2,
 * dk = dv = 16, conv 4), layer 1 full attention (2 heads x 32, gated). */
#define TH  256
#define TV  64
#define THD 32

typedef struct {
    const char *hf;
    size_t      rank;
    uint64_t    dims[3];
    float       tol; /* max |read - written| */
    float      *data;
} tt_t;

static tt_t TT[] = {
    {"model.language_model.embed_tokens.weight", 2, {TV, TH}, 0.01f, NULL},
    {"model.language_model.norm.weight", 1, {TH}, 0.01f, NULL},
    {"model.language_model.layers.0.input_layernorm.weight", 1, {TH}, 0.01f, NULL},
    {"model.language_model.layers.0.post_attention_layernorm.weight", 1, {TH}, 0.01f, NULL},
    {"model.language_model.layers.0.linear_attn.in_proj_qkv.weight", 2, {96, TH}, 0.1f, NULL},
    {"model.language_model.layers.0.linear_attn.in_proj_z.weight", 2, {32, TH}, 0.1f, NULL},
    {"model.language_model.layers.0.linear_attn.in_proj_a.weight", 2, {2, TH}, 0.01f, NULL},
    {"model.language_model.layers.0.linear_attn.in_proj_b.weight", 2, {2, TH}, 0.01f, NULL},
    {"model.language_model.layers.0.linear_attn.conv1d.weight", 3, {96, 1, 4}, 0.005f, NULL},
    {"model.language_model.layers.0.linear_attn.norm.weight", 1, {16}, 0.005f, NULL},
    {"model.language_model.layers.0.linear_attn.A_log", 1, {2}, 1e-5f, NULL},
    {"model.language_model.layers.0.linear_attn.dt_bias", 1, {2}, 0, NULL},
    {"model.language_model.layers.0.linear_attn.out_proj.weight", 2, {TH, 32}, 0.01f, NULL},
    {"model.language_model.layers.0.mlp.gate_proj.weight", 2, {96, TH}, 0.1f, NULL},
    {"model.language_model.layers.0.mlp.up_proj.weight", 2, {96, TH}, 0.1f, NULL},
    {"model.language_model.layers.0.mlp.down_proj.weight", 2, {TH, 96}, 0.1f, NULL},
    {"model.language_model.layers.1.input_layernorm.weight", 1, {TH}, 0.01f, NULL},
    {"model.language_model.layers.1.post_attention_layernorm.weight", 1, {TH}, 0.01f, NULL},
    {"model.language_model.layers.1.self_attn.q_proj.weight", 2, {4 * THD, TH}, 0.1f, NULL},
    {"model.language_model.layers.1.self_attn.k_proj.weight", 2, {THD, TH}, 0.1f, NULL},
    {"model.language_model.layers.1.self_attn.v_proj.weight", 2, {THD, TH}, 0.1f, NULL},
    {"model.language_model.layers.1.self_attn.o_proj.weight", 2, {TH, 2 * THD}, 0.1f, NULL},
    {"model.language_model.layers.1.self_attn.q_norm.weight", 1, {THD}, 0.01f, NULL},
    {"model.language_model.layers.1.self_attn.k_norm.weight", 1, {THD}, 0.01f, NULL},
    {"model.language_model.layers.1.mlp.gate_proj.weight", 2, {96, TH}, 0.1f, NULL},
    {"model.language_model.layers.1.mlp.up_proj.weight", 2, {96, TH}, 0.1f, NULL},
    {"model.language_model.layers.1.mlp.down_proj.weight", 2, {TH, 96}, 0.1f, NULL},
};
#define NTT (sizeof TT / sizeof TT[0])

static size_t numel(const tt_t *t) {
    size_t n = 1;
    for (size_t i = 0; i < t->rank; i++)
        n *= t->dims[i];
    return n;
}

static char g_model[64];

/* Writes the tiny tower; every value in [-1, 1) (A_log in [-1, 1) too). */
static void write_tiny(void) {
    eng_q4nx_writer_t *w = NULL;
    char               err[512] = "";
    cr_assert_eq(eng_q4nx_writer_new(THD, &w), SVC_OK);
    for (size_t i = 0; i < NTT; i++) {
        size_t n = numel(&TT[i]);
        free(TT[i].data);
        TT[i].data = malloc(n * sizeof(float));
        for (size_t k = 0; k < n; k++)
            TT[i].data[k] = frand();
        cr_assert_eq(eng_q4nx_writer_add(w, TT[i].hf, TT[i].rank, TT[i].dims, TT[i].data,
                                         ENG_Q4NX_AUTO, err, sizeof err),
                     SVC_OK, "%s: %s", TT[i].hf, err);
    }
    snprintf(g_model, sizeof g_model, "%s", tmp_path());
    cr_assert_eq(eng_q4nx_writer_finish(w, g_model, err, sizeof err), SVC_OK, "%s", err);
    eng_q4nx_writer_free(w);
}

static void free_tiny(void) {
    for (size_t i = 0; i < NTT; i++) {
        free(TT[i].data);
        TT[i].data = NULL;
    }
    unlink(g_model);
}

static const tt_t *tt(const char *suffix) {
    for (size_t i = 0; i < NTT; i++)
        if (strstr(TT[i].hf, suffix))
            return &TT[i];
    cr_assert_fail("no %s", suffix);
    return NULL;
}

Test(q4nx, file_round_trip, .init = write_tiny, .fini = free_tiny) {
    eng_q4nx_t *q = NULL;
    char        err[512] = "";
    cr_assert_eq(eng_q4nx_open(g_model, &q, err, sizeof err), SVC_OK, "%s", err);
    cr_expect_eq(eng_q4nx_generation(q), ENG_Q4NX_GEN_B);
    cr_expect_eq(eng_q4nx_q8_raster(q), ENG_Q4NX_RASTER_B); /* alpha probe on our own file */
    cr_expect_eq(eng_q4nx_count(q), NTT + 2);               /* + the alpha/beta .bf16 copies */
    for (size_t i = 0; i < NTT; i++) {
        size_t n = numel(&TT[i]);
        float *y = malloc(n * sizeof *y);
        cr_assert_eq(eng_q4nx_tensor_f32(q, TT[i].hf, TT[i].rank, TT[i].dims, y, err, sizeof err),
                     SVC_OK, "%s: %s", TT[i].hf, err);
        float emax = 0;
        for (size_t k = 0; k < n; k++)
            emax = fmaxf(emax, fabsf(y[k] - TT[i].data[k]));
        cr_expect_leq(emax, TT[i].tol, "%s: max error %g > %g", TT[i].hf, (double)emax,
                      (double)TT[i].tol);
        free(y);
    }
    /* Kinds as official Gen-B files (§2.6) and the tied embedding (§2.3). */
    const eng_q4nx_info_t *in = eng_q4nx_find_hf(q, "embed_tokens.weight");
    cr_assert(in);
    cr_expect_str_eq(in->name, "lm_head.weight");
    cr_expect_eq(in->kind, ENG_Q4NX_Q8);
    cr_expect_eq(eng_q4nx_find_hf(q, "lm_head.weight"), in);
    in = eng_q4nx_find_hf(q, "layers.0.mlp.up_proj.weight");
    cr_expect_eq(in->kind, ENG_Q4NX_Q4_K);
    cr_expect_eq(in->st->shape[0], 3);
    cr_expect_eq(in->st->shape[2], 4736);
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.linear_attn.out_proj.weight")->kind, ENG_Q4NX_Q8);
    cr_expect_str_eq(eng_q4nx_find_hf(q, "layers.0.linear_attn.out_proj.weight")->hf_name,
                     "model.language_model.layers.0.linear_attn.out_proj.weight");
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.linear_attn.A_log")->st->dtype, ENG_DT_F32);
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.linear_attn.dt_bias")->st->dtype, ENG_DT_F32);
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.linear_attn.norm.weight")->st->dtype, ENG_DT_BF16);
    eng_q4nx_close(q);
}

/* The group codes (what avx512-grp8x2 multiplies) of each tile kind
 * decode to eng_q4nx_decode_ref's values bit for bit: d * u + m. */
static void check_groups(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, const uint8_t *p, size_t P,
                         size_t Q, size_t R, size_t K) {
    size_t   G = (K + 31) / 32;
    float   *y = malloc(R * K * sizeof *y), *d = malloc(R * G * sizeof *d);
    float   *m = malloc(R * G * sizeof *m);
    uint8_t *u = malloc(R * K);
    cr_assert(y && d && m && u);
    eng_q4nx_decode_ref(kind, ra, p, P, Q, R, K, y);
    eng_q4nx_decode_groups_ref(kind, ra, p, P, Q, R, K, u, d, m);
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < K; k++) {
            float w = d[r * G + k / 32] * (float)u[r * K + k] + m[r * G + k / 32];
            cr_assert_eq(w, y[r * K + k], "%s %c (%zu, %zu): %a from the codes, %a decoded",
                         eng_q4nx_kind_name(kind), ra ? 'B' : 'A', r, k, (double)w,
                         (double)y[r * K + k]);
            if (kind == ENG_Q4NX_Q4_1 || kind == ENG_Q4NX_Q4_K || kind == ENG_Q4NX_Q4_0)
                cr_assert_leq(u[r * K + k], 15);
        }
    free(y), free(d), free(m), free(u);
}

Test(q4nx, group_codes_decode_to_the_same_values) {
    size_t R = 40, K = 300, P = 2, Q = 2;
    float *x = malloc(R * K * sizeof *x);
    for (size_t i = 0; i < R * K; i++)
        x[i] = frand() * (1.0f + (float)(i % 5));
    uint8_t *p = malloc(eng_q4nx_packed_bytes(ENG_Q4NX_Q8, R, K));
    cr_assert_eq(eng_q4nx_encode_q4k_ref(x, R, K, p), SVC_OK);
    check_groups(ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, p, P, Q, R, K);
    for (int ra = 0; ra < 2; ra++) {
        cr_assert_eq(eng_q4nx_encode_q41_ref(x, R, K, (eng_q4nx_raster_t)ra, p), SVC_OK);
        check_groups(ENG_Q4NX_Q4_1, (eng_q4nx_raster_t)ra, p, P, Q, R, K);
        cr_assert_eq(eng_q4nx_encode_q8_ref(x, R, K, (eng_q4nx_raster_t)ra, p), SVC_OK);
        check_groups(ENG_Q4NX_Q8, (eng_q4nx_raster_t)ra, p, P, Q, R, K);
        cr_assert_eq(eng_q4nx_encode_ref(ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, x, R, K, p), SVC_OK);
        check_groups(ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, p, P, Q, R, K);
    }
    /* legacy Q8 has no encoder: random codes under finite bf16 scales */
    size_t ql = 3, nb = P * ql * ENG_Q4NX_B_Q8_LEGACY;
    free(p);
    p = malloc(nb);
    for (size_t i = 0; i < nb; i++)
        p[i] = (uint8_t)(frand() * 128.0f + 128.0f);
    for (size_t t = 0; t < P * ql; t++)
        for (size_t s = 0; s < 256; s++)
            wr16(p + t * ENG_Q4NX_B_Q8_LEGACY + 2 * s, eng_f32_to_bf16(frand() * 0.01f));
    check_groups(ENG_Q4NX_Q8_LEGACY, ENG_Q4NX_RASTER_A, p, P, ql, R, K);
    free(p), free(x);
}

/* eng_q4nx_tensor_groups: the values eng_q4nx_tensor_f32 reads, bit for
 * bit, through the q_proj regroup and the duplicated alpha rows; a tensor
 * not in tiles is left to eng_q4nx_tensor_f32. */
Test(q4nx, tensor_groups, .init = write_tiny, .fini = free_tiny) {
    eng_q4nx_t *q = NULL;
    char        err[512] = "";
    cr_assert_eq(eng_q4nx_open(g_model, &q, err, sizeof err), SVC_OK, "%s", err);
    const char *names[] = {"q_proj", "mlp.up_proj", "linear_attn.out_proj", "in_proj_a"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const tt_t *t = tt(names[i]);
        cr_assert_eq(t->rank, 2);
        size_t   R = t->dims[0], K = t->dims[1], G = (K + 31) / 32;
        float   *y = malloc(R * K * sizeof *y), *d, *m;
        uint8_t *u;
        cr_assert_eq(eng_q4nx_tensor_f32(q, t->hf, 2, t->dims, y, err, sizeof err), SVC_OK, "%s",
                     err);
        cr_assert_eq(eng_q4nx_tensor_groups(q, t->hf, t->dims, &u, &d, &m, err, sizeof err), SVC_OK,
                     "%s: %s", t->hf, err);
        for (size_t r = 0; r < R; r++)
            for (size_t k = 0; k < K; k++)
                cr_assert_eq(d[r * G + k / 32] * (float)u[r * K + k] + m[r * G + k / 32],
                             y[r * K + k], "%s (%zu, %zu)", t->hf, r, k);
        free(y), free(d), free(m), free(u);
    }
    const tt_t *n = tt("input_layernorm");
    uint64_t    dims[2] = {1, n->dims[0]};
    uint8_t    *u;
    float      *d, *m;
    err[0] = '\0';
    cr_expect_eq(eng_q4nx_tensor_groups(q, n->hf, dims, &u, &d, &m, err, sizeof err),
                 SVC_ERR_UNSUPPORTED);
    cr_expect_str_eq(err, "");
    cr_expect(!u && !d && !m);
    eng_q4nx_close(q);
}

/* The stored forms, read raw: +1 norms, -exp(A_log), [tap, channel] conv,
 * duplicated alpha rows, and the q_proj regroup direction (§2.2). */
Test(q4nx, stored_transforms, .init = write_tiny, .fini = free_tiny) {
    eng_st_t *st = NULL;
    char      err[512] = "";
    cr_assert_eq(eng_st_open(g_model, &st, err, sizeof err), SVC_OK, "%s", err);
    const eng_st_tensor_t *t = eng_st_find(st, "model.norm.weight");
    const float           *x = tt(".norm.weight")->data;
    cr_expect_eq(bf(t->data), eng_bf16_to_f32(eng_f32_to_bf16(x[0] + 1.0f)));
    t = eng_st_find(st, "model.layers.0.linear_attn.ssm_a");
    float a[2];
    memcpy(a, t->data, sizeof a);
    cr_expect_float_eq(a[1], -expf(tt("A_log")->data[1]), 1e-6);
    t = eng_st_find(st, "model.layers.0.linear_attn.ssm_conv1d.weight");
    cr_expect_eq(t->shape[0], 4);
    cr_expect_eq(t->shape[1], 96);
    x = tt("conv1d")->data; /* stored [t, c] = HF [c, 0, t] */
    cr_expect_eq(bf((const uint8_t *)t->data + 2 * (3 * 96 + 5)),
                 eng_bf16_to_f32(eng_f32_to_bf16(x[5 * 4 + 3])));
    /* alpha: [1, 1, 8704], rows 2..31 repeat rows 0..1 */
    t = eng_st_find(st, "model.layers.0.linear_attn.ssm_alpha_proj.weight");
    cr_expect_eq(t->shape[0], 1);
    cr_expect_eq(t->shape[2], 8704);
    float *m = malloc(32 * TH * sizeof *m);
    eng_q4nx_decode_ref(ENG_Q4NX_Q8, ENG_Q4NX_RASTER_B, t->data, 1, 1, 32, TH, m);
    for (size_t r = 2; r < 32; r++)
        cr_assert_eq(memcmp(m + r * TH, m + (r % 2) * TH, TH * sizeof *m), 0, "row %zu", r);
    free(m);
    cr_expect(eng_st_find(st, "model.layers.0.linear_attn.ssm_alpha_proj.bf16.weight"));
    cr_expect_null(eng_st_find(st, "model.embed_tokens.weight"));
    /* q_proj: stored rows [all queries | all gates], HF per head [q | gate] */
    t = eng_st_find(st, "model.layers.1.self_attn.q_proj.weight");
    m = malloc(4 * THD * TH * sizeof *m);
    eng_q4nx_decode_ref(ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, t->data, 4, 1, 4 * THD, TH, m);
    x = tt("q_proj")->data;
    struct {
        size_t stored, hf;
    } rows[] = {{0, 0}, {THD, 2 * THD}, {2 * THD, THD}, {3 * THD + 1, 3 * THD + 1}};
    for (size_t i = 0; i < 4; i++)
        for (size_t k = 0; k < TH; k++)
            cr_assert_leq(fabsf(m[rows[i].stored * TH + k] - x[rows[i].hf * TH + k]), 0.1f,
                          "stored row %zu vs HF row %zu", rows[i].stored, rows[i].hf);
    free(m);
    eng_st_close(st);
}

Test(q4nx, read_refusals, .init = write_tiny, .fini = free_tiny) {
    eng_q4nx_t *q = NULL;
    char        err[512] = "";
    cr_assert_eq(eng_q4nx_open(g_model, &q, err, sizeof err), SVC_OK, "%s", err);
    float      *buf = malloc(96 * TH * 4 * sizeof *buf);
    uint64_t    d_wide[2] = {96, 512}, d_tall[2] = {200, TH}, d_vec[1] = {96 * TH};
    const char *up = "model.language_model.layers.0.mlp.up_proj.weight";
    cr_expect_eq(eng_q4nx_tensor_f32(q, up, 2, d_wide, buf, err, sizeof err), SVC_ERR_INVALID);
    cr_expect(strstr(err, "mlp.up_proj") && strstr(err, "[3, 1, 4736]"), "%s", err);
    cr_expect_eq(eng_q4nx_tensor_f32(q, up, 2, d_tall, buf, err, sizeof err), SVC_ERR_INVALID);
    cr_expect_eq(eng_q4nx_tensor_f32(q, up, 1, d_vec, buf, err, sizeof err), SVC_ERR_INVALID);
    uint64_t d_norm[1] = {TH + 1};
    cr_expect_eq(eng_q4nx_tensor_f32(q, "norm.weight", 1, d_norm, buf, err, sizeof err),
                 SVC_ERR_INVALID);
    cr_expect_eq(
        eng_q4nx_tensor_f32(q, "layers.9.mlp.up_proj.weight", 2, d_wide, buf, err, sizeof err),
        SVC_ERR_INVALID);
    cr_expect(strstr(err, "is missing"), "%s", err);
    cr_expect_eq(eng_q4nx_tensor_f32(q, "visual.x", 2, d_wide, buf, err, sizeof err),
                 SVC_ERR_INVALID);
    free(buf);
    eng_q4nx_close(q);
}

/* Every truncation of a valid file is refused at open, never read past. */
Test(q4nx, truncated_file, .init = write_tiny, .fini = free_tiny) {
    FILE *f = fopen(g_model, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fclose(f);
    long cuts[] = {0, 4, 8, 9, 100, len / 2, len - 4736, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        cr_assert_eq(truncate(g_model, cuts[i]), 0);
        eng_q4nx_t *q = NULL;
        char        err[512] = "";
        cr_expect_neq(eng_q4nx_open(g_model, &q, err, sizeof err), SVC_OK, "cut %ld", cuts[i]);
        cr_expect_null(q);
        cr_expect(err[0], "cut %ld: no message", cuts[i]);
        write_tiny(); /* restore (new random data; only the size matters) */
        f = fopen(g_model, "rb");
        fseek(f, 0, SEEK_END);
        cr_assert_eq(ftell(f), len);
        fclose(f);
    }
}

typedef struct {
    ent_t       e;
    const char *needle; /* expected in the message */
} bad_t;

Test(q4nx, open_refusals) {
    static uint8_t data[2 * 8704];
    bad_t          cases[] = {
                 {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 1, 5000}, data, 5000},
                  "tile size 5000"},
                 {{"model.layers.0.mlp.up_proj.weight", "I8", 2, {1, 4736}, data, 4736}, "rank 2"},
                 {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {0, 1, 4736}, data, 0}, "no tile"},
                 {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {2, 1, 4736}, data, 4736}, "needs"},
                 {{"model.norm.weight", "U8", 1, {4}, data, 4}, "dtype U8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = tmp_path();
        write_st(p, &cases[i].e, 1);
        eng_q4nx_t *q = NULL;
        char        err[512] = "";
        cr_expect_neq(eng_q4nx_open(p, &q, err, sizeof err), SVC_OK, "case %zu", i);
        cr_expect(strstr(err, cases[i].needle) && strstr(err, p), "case %zu: %s", i, err);
        cr_expect(i == 4 || strstr(err, "up_proj"), "case %zu: %s", i, err);
        unlink(p);
    }
}

/* ------------------------------------------------------------ generations */

/* Gen-A: BF16 embed table, Q4_1 raster A; alpha probe against its twin. */
Test(q4nx, gen_a_detection) {
    float    w[32 * 256], alpha[16 * 256];
    uint8_t *q41 = malloc(5120), *q8 = malloc(8704), emb[2 * 256 * 2], twin[16 * 256 * 2];
    for (size_t i = 0; i < 32 * 256; i++)
        w[i] = frand();
    cr_assert_eq(eng_q4nx_encode_q41_ref(w, 32, 256, ENG_Q4NX_RASTER_A, q41), SVC_OK);
    for (size_t r = 0; r < 32; r++) /* rows 16-31 duplicate 0-15 */
        for (size_t k = 0; k < 256; k++)
            w[r * 256 + k] = r < 16 ? frand() : w[(r - 16) * 256 + k];
    cr_assert_eq(eng_q4nx_encode_q8_ref(w, 32, 256, ENG_Q4NX_RASTER_A, q8), SVC_OK);
    eng_q4nx_decode_ref(ENG_Q4NX_Q8, ENG_Q4NX_RASTER_A, q8, 1, 1, 16, 256, alpha);
    for (size_t i = 0; i < 16 * 256; i++)
        wr16(twin + 2 * i, eng_f32_to_bf16(alpha[i]));
    for (size_t i = 0; i < 2 * 256; i++)
        wr16(emb + 2 * i, eng_f32_to_bf16(0.5f));
    ent_t e[] = {
        {"model.embed_tokens.weight", "BF16", 2, {2, 256}, emb, sizeof emb},
        {"model.layers.0.linear_attn.ssm_alpha_proj.bf16.weight",
         "BF16",
         2,
         {16, 256},
         twin,
         sizeof twin},
        {"model.layers.0.linear_attn.ssm_alpha_proj.weight", "I8", 3, {1, 1, 8704}, q8, 8704},
        {"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 1, 5120}, q41, 5120},
    };
    const char *p = tmp_path();
    write_st(p, e, 4);
    eng_q4nx_t *q = NULL;
    char        err[512] = "";
    cr_assert_eq(eng_q4nx_open(p, &q, err, sizeof err), SVC_OK, "%s", err);
    cr_expect_eq(eng_q4nx_generation(q), ENG_Q4NX_GEN_A);
    cr_expect_eq(eng_q4nx_q8_raster(q), ENG_Q4NX_RASTER_A);
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.mlp.up_proj.weight")->kind, ENG_Q4NX_Q4_1);
    float    out[32 * 256], ref[32 * 256];
    uint64_t d[2] = {32, 256};
    cr_assert_eq(eng_q4nx_tensor_f32(q, "layers.0.mlp.up_proj.weight", 2, d, out, err, sizeof err),
                 SVC_OK, "%s", err);
    eng_q4nx_decode_ref(ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, q41, 1, 1, 32, 256, ref);
    cr_expect_eq(memcmp(out, ref, sizeof out), 0);
    d[0] = 16;
    cr_assert_eq(
        eng_q4nx_tensor_f32(q, "layers.0.linear_attn.in_proj_a.weight", 2, d, out, err, sizeof err),
        SVC_OK, "%s", err);
    cr_expect_eq(memcmp(out, alpha, 16 * 256 * sizeof *out), 0);
    d[0] = 2;
    cr_assert_eq(eng_q4nx_tensor_f32(q, "embed_tokens.weight", 2, d, out, err, sizeof err), SVC_OK);
    cr_expect_eq(out[300], 0.5f);
    eng_q4nx_close(q);
    unlink(p);
    free(q41);
    free(q8);
}

/* A Gen-B file whose Q8 alpha is raster A (what T-oflm assumes, §4.4): the
 * probe must override the generation's default. Also the legacy 5120-byte
 * Q8 (§4.5) listed and decoded by the logical K. */
Test(q4nx, probe_overrides_and_legacy) {
    float    w[32 * 256], alpha[16 * 256];
    uint8_t *q4k = malloc(4736), *q8 = malloc(8704), twin[16 * 256 * 2];
    uint8_t *leg = calloc(2, 5120);
    for (size_t i = 0; i < 32 * 256; i++)
        w[i] = frand();
    cr_assert_eq(eng_q4nx_encode_q4k_ref(w, 32, 256, q4k), SVC_OK);
    cr_assert_eq(eng_q4nx_encode_q8_ref(w, 32, 256, ENG_Q4NX_RASTER_A, q8), SVC_OK);
    eng_q4nx_decode_ref(ENG_Q4NX_Q8, ENG_Q4NX_RASTER_A, q8, 1, 1, 16, 256, alpha);
    for (size_t i = 0; i < 16 * 256; i++)
        wr16(twin + 2 * i, eng_f32_to_bf16(alpha[i]));
    for (size_t t = 0; t < 2; t++) { /* legacy: d = 1 twice, code 3 at (rt 1, kt 2) */
        uint8_t *b = leg + t * 5120;
        for (size_t s = 0; s < 128; s++) {
            wr16(b + 2 * s, BF_ONE);
            wr16(b + 256 + 2 * s, BF_ONE);
        }
        b[512 + 2 * 16 + 1] = 3;
    }
    ent_t e[] = {
        {"lm_head.weight", "I8", 3, {1, 2, 5120}, leg, 2 * 5120},
        {"model.layers.0.linear_attn.ssm_alpha_proj.bf16.weight",
         "BF16",
         2,
         {16, 256},
         twin,
         sizeof twin},
        {"model.layers.0.linear_attn.ssm_alpha_proj.weight", "I8", 3, {1, 1, 8704}, q8, 8704},
        {"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 1, 4736}, q4k, 4736},
    };
    const char *p = tmp_path();
    write_st(p, e, 4);
    eng_q4nx_t *q = NULL;
    char        err[512] = "";
    cr_assert_eq(eng_q4nx_open(p, &q, err, sizeof err), SVC_OK, "%s", err);
    cr_expect_eq(eng_q4nx_generation(q), ENG_Q4NX_GEN_B);
    cr_expect_eq(eng_q4nx_q8_raster(q), ENG_Q4NX_RASTER_A);
    cr_expect_eq(eng_q4nx_find_hf(q, "embed_tokens.weight")->kind, ENG_Q4NX_Q8_LEGACY);
    float    out[32 * 256];
    uint64_t d[2] = {32, 256};
    cr_assert_eq(eng_q4nx_tensor_f32(q, "embed_tokens.weight", 2, d, out, err, sizeof err), SVC_OK,
                 "%s", err);
    for (size_t i = 0; i < 32 * 256; i++)
        cr_assert_eq(out[i], (i == 1 * 256 + 2 || i == 1 * 256 + 130) ? 3.0f : 0.0f, "%zu", i);
    d[0] = 16;
    cr_assert_eq(
        eng_q4nx_tensor_f32(q, "layers.0.linear_attn.in_proj_a.weight", 2, d, out, err, sizeof err),
        SVC_OK);
    cr_expect_eq(memcmp(out, alpha, 16 * 256 * sizeof *out), 0);
    eng_q4nx_close(q);
    unlink(p);
    free(q4k);
    free(q8);
    free(leg);
}

/* ------------------------------------------------------------ writer refusals */

Test(q4nx, writer_refusals) {
    eng_q4nx_writer_t *w = NULL;
    char               err[512] = "";
    float              x[4 * 256] = {0};
    uint64_t           d2[2] = {4, 256}, d1[1] = {4};
    cr_assert_eq(eng_q4nx_writer_new(32, &w), SVC_OK);
    cr_expect_eq(eng_q4nx_writer_add(w, "model.language_model.foo", 2, d2, x, ENG_Q4NX_AUTO, err,
                                     sizeof err),
                 SVC_ERR_INVALID);
    x[7] = NAN;
    cr_expect_eq(eng_q4nx_writer_add(w, "layers.0.mlp.up_proj.weight", 2, d2, x, ENG_Q4NX_AUTO, err,
                                     sizeof err),
                 SVC_ERR_INVALID);
    cr_expect(strstr(err, "element 7"), "%s", err);
    x[7] = 0;
    cr_expect_eq(
        eng_q4nx_writer_add(w, "embed_tokens.weight", 2, d2, x, ENG_Q4NX_AUTO, err, sizeof err),
        SVC_OK, "%s", err);
    cr_expect_eq(eng_q4nx_writer_add(w, "lm_head.weight", 2, d2, x, ENG_Q4NX_AUTO, err, sizeof err),
                 SVC_ERR_INVALID);
    cr_expect_eq(eng_q4nx_writer_add(w, "layers.0.self_attn.q_proj.weight", 2, d2, x, ENG_Q4NX_AUTO,
                                     err, sizeof err),
                 SVC_ERR_INVALID); /* 4 rows: not 2 x head_dim 32 */
    cr_expect_eq(eng_q4nx_writer_add(w, "layers.0.linear_attn.conv1d.weight", 1, d1, x,
                                     ENG_Q4NX_AUTO, err, sizeof err),
                 SVC_ERR_INVALID);
    cr_expect_eq(eng_q4nx_writer_add(w, "norm.weight", 1, d1, x, ENG_Q4NX_Q4_K, err, sizeof err),
                 SVC_ERR_INVALID);
    cr_expect_eq(eng_q4nx_writer_finish(w, "/nonexistent-dir/model.q4nx", err, sizeof err),
                 SVC_ERR_IO);
    cr_expect(strstr(err, "/nonexistent-dir/model.q4nx"), "%s", err);
    eng_q4nx_writer_free(w);
    eng_q4nx_writer_free(NULL);
    eng_q4nx_close(NULL);
}

/* ------------------------------------------------------------ writer: encoded tensors */

static uint8_t *file_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n ? *n : 1);
    cr_assert(b && fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}

/* A writer given another's tensors as they are held (quantize --resume's
 * checkpoints), in another order, writes the same file byte for byte. */
Test(q4nx, writer_add_encoded_same_file) {
    eng_q4nx_writer_t *a = NULL, *b = NULL;
    char               err[512] = "", pa[64], pb[64];
    float              x[64 * 256], nrm[256];
    uint64_t           d2[2] = {64, 256}, d1[1] = {256};
    for (size_t i = 0; i < 64 * 256; i++)
        x[i] = sinf((float)i * 0.37f) * 0.02f;
    for (size_t i = 0; i < 256; i++)
        nrm[i] = cosf((float)i);
    cr_assert_eq(eng_q4nx_writer_new(32, &a), SVC_OK);
    cr_assert_eq(eng_q4nx_writer_new(32, &b), SVC_OK);
    static const char *const mats[] = {"layers.0.mlp.up_proj.weight",
                                       "layers.0.linear_attn.in_proj_a.weight",
                                       "layers.0.self_attn.q_proj.weight"};
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(eng_q4nx_writer_add(a, mats[i], 2, d2, x, ENG_Q4NX_AUTO, err, sizeof err),
                     SVC_OK, "%s", err);
    cr_assert_eq(eng_q4nx_writer_add(a, "layers.0.input_layernorm.weight", 1, d1, nrm,
                                     ENG_Q4NX_AUTO, err, sizeof err),
                 SVC_OK, "%s", err);
    size_t n = eng_q4nx_writer_count(a);
    cr_assert_eq(n, 5); /* in_proj_a's ".bf16" copy too */
    for (size_t i = n; i-- > 0;) {
        eng_q4nx_wtensor_t t;
        eng_q4nx_writer_tensor(a, i, &t);
        cr_assert_eq(eng_q4nx_writer_add_encoded(b, &t, err, sizeof err), SVC_OK, "%s", err);
        cr_expect_eq(eng_q4nx_writer_add_encoded(b, &t, err, sizeof err), SVC_ERR_INVALID);
        t.nbytes--;
        cr_expect_eq(eng_q4nx_writer_add_encoded(b, &t, err, sizeof err), SVC_ERR_INVALID);
    }
    snprintf(pa, sizeof pa, "%s", tmp_path());
    snprintf(pb, sizeof pb, "%s", tmp_path());
    cr_assert_eq(eng_q4nx_writer_finish(a, pa, err, sizeof err), SVC_OK, "%s", err);
    cr_assert_eq(eng_q4nx_writer_finish(b, pb, err, sizeof err), SVC_OK, "%s", err);
    size_t   na, nb;
    uint8_t *fa = file_bytes(pa, &na), *fb = file_bytes(pb, &nb);
    cr_expect(na == nb && memcmp(fa, fb, na) == 0, "the files differ");
    free(fa), free(fb);
    unlink(pa), unlink(pb);
    eng_q4nx_writer_free(a);
    eng_q4nx_writer_free(b);
}
