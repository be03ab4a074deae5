/*
 * test_tower.c -- the Qwen3.5 text tower (eng_model_*) against the
 * transformers goldens of tests/tools/gen_tower_golden.py (.d3gt, format in
 * that script's docstring), and the loader's refusals of broken packages.
 */
/* Tolerances (issue 3): relative max-norm error for states, final hidden and
 * logits; absolute error for probabilities. Both the transformers fp32 golden
 * and the fp64 reference of the same model (D3GT v2) must be met.
 * With the bf16 projections (npu.h, "amx-bf16x2" and, without AMX,
 * "avx512-bf16x2": bf16 weights, exact here since the package is BF16,
 * activations split into two bf16) the
 * sums run in another order and the activations carry ~2^-17: the worst
 * seen on these goldens is 3.6e-4 on a state, 9e-5 on final_last and 3.5e-5
 * on a probability, so the documented bounds there are 1e-3 and 1e-4.
 * (One bf16 rounding of the activations, D3_NPU_MATMUL=bf16, moves a
 * probability by up to 2.5e-2 on this random model: not tested here, it
 * is past issue 7's 1e-2 cap.) ctest runs this file three times: `tower`
 * (D3_NPU_KERNELS=avx512, fp32), `tower_ref` (the references) and
 * `tower_amx` (the default dispatch). */
#define STATE_TOL (bf16_matmul() ? 1e-3 : 1e-4)
#define PROB_TOL  (bf16_matmul() ? 1e-4 : 1e-5)

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "npu.h"

static bool bf16_matmul(void) {
    return strncmp(npu_matmul_name(), "amx-", 4) == 0 ||
           strcmp(npu_matmul_name(), "avx512-bf16x2") == 0;
}

#define PKG  D3_SOURCE_DIR "/tests/fixtures/tiny-upstream"
#define GOLD D3_SOURCE_DIR "/tests/golden/tower"

/* ------------------------------------------------------------ .d3gt */

typedef struct golden {
    uint32_t T, H, S, P, C, mode;
    int32_t *ids;        /* (T) */
    int32_t *pos;        /* (P) */
    float   *states;     /* (S, P, H) */
    float   *final_last; /* (H) */
    float   *logits;     /* (C) */
    double   probs3[3];
    double  *probs255; /* (C) */
    /* fp64 reference (v2): states rounded to f32, the rest f64 */
    float   *states64;     /* (S, P, H) */
    double  *final_last64; /* (H) */
    double  *logits64;     /* (C) */
    double   probs3_64[3];
    double  *probs255_64; /* (C) */
    uint8_t *raw;         /* the file; the arrays above are copies */
} golden_t;

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)sz + 1);
    cr_assert(buf && fread(buf, 1, (size_t)sz, fp) == (size_t)sz);
    fclose(fp);
    *n = (size_t)sz;
    return buf;
}

/* Copies n elements of size sz from the file at *off (unaligned). */
static void *take(const uint8_t *raw, size_t len, size_t *off, size_t n, size_t sz) {
    cr_assert(*off + n * sz <= len, "golden file truncated");
    void *p = malloc(n * sz + 1);
    cr_assert(p);
    memcpy(p, raw + *off, n * sz);
    *off += n * sz;
    return p;
}

static void golden_load(const char *path, golden_t *g) {
    size_t len, off = 32;
    g->raw = read_all(path, &len);
    cr_assert(len >= 32 && memcmp(g->raw, "D3GT", 4) == 0, "%s: not a D3GT file", path);
    uint32_t hdr[7];
    memcpy(hdr, g->raw + 4, sizeof hdr);
    cr_assert_eq(hdr[0], 2, "%s: version %u", path, hdr[0]);
    g->T = hdr[1], g->H = hdr[2], g->S = hdr[3], g->P = hdr[4], g->C = hdr[5], g->mode = hdr[6];
    g->ids = take(g->raw, len, &off, g->T, 4);
    g->pos = take(g->raw, len, &off, g->P, 4);
    g->states = take(g->raw, len, &off, (size_t)g->S * g->P * g->H, 4);
    g->final_last = take(g->raw, len, &off, g->H, 4);
    g->logits = take(g->raw, len, &off, g->C, 4);
    double *p3 = take(g->raw, len, &off, 3, 8);
    memcpy(g->probs3, p3, sizeof g->probs3);
    free(p3);
    g->probs255 = take(g->raw, len, &off, g->C, 8);
    off += 4 * g->H + 4 * g->C; /* final_last_bf16, logits_bf16h: not compared */
    g->states64 = take(g->raw, len, &off, (size_t)g->S * g->P * g->H, 4);
    g->final_last64 = take(g->raw, len, &off, g->H, 8);
    g->logits64 = take(g->raw, len, &off, g->C, 8);
    p3 = take(g->raw, len, &off, 3, 8);
    memcpy(g->probs3_64, p3, sizeof g->probs3_64);
    free(p3);
    g->probs255_64 = take(g->raw, len, &off, g->C, 8);
    cr_assert_eq(off, len, "%s: size mismatch", path);
}

static void golden_free(golden_t *g) {
    free(g->ids);
    free(g->pos);
    free(g->states);
    free(g->final_last);
    free(g->logits);
    free(g->probs255);
    free(g->states64);
    free(g->final_last64);
    free(g->logits64);
    free(g->probs255_64);
    free(g->raw);
}

/* ------------------------------------------------------------ comparison */

/* max|a - b| / max|b| over n values. */
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* The same against an fp64 reference. */
static double rel_err64(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return den > 0 ? num / den : num;
}

static double abs_err(const double *a, const double *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++)
        e = fmax(e, fabs(a[i] - b[i]));
    return e;
}

/* The trace callback compares each state at the recorded positions. */
typedef struct trace_ctx {
    const golden_t *g;
    double          worst; /* worst state error against the fp32 golden */
    int             worst_state;
    double          worst64; /* ... and against the fp64 reference */
    int             worst_state64;
    float          *row; /* (P, H) gathered */
} trace_ctx_t;

static void on_state(int layer, const float *x, size_t T, size_t H, void *user) {
    trace_ctx_t    *tc = user;
    const golden_t *g = tc->g;
    size_t          s = (size_t)(layer + 1);
    cr_assert(s < g->S && T == g->T && H == g->H);
    for (size_t p = 0; p < g->P; p++)
        memcpy(tc->row + p * H, x + (size_t)g->pos[p] * H, H * sizeof *x);
    double e = rel_err(tc->row, g->states + s * g->P * H, g->P * H);
    double e64 = rel_err(tc->row, g->states64 + s * g->P * H, g->P * H);
    if (e > tc->worst) {
        tc->worst = e;
        tc->worst_state = (int)s;
    }
    if (e64 > tc->worst64) {
        tc->worst64 = e64;
        tc->worst_state64 = (int)s;
    }
    cr_expect(e <= STATE_TOL, "state %zu: relative error %.3g", s, e);
    cr_expect(e64 <= STATE_TOL, "state %zu: relative error %.3g against fp64", s, e64);
}

static void run_case(const eng_model_t *m, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", GOLD, file);
    golden_t g;
    golden_load(path, &g);
    cr_assert_eq(g.H, eng_model_hidden_size(m));
    trace_ctx_t tc = {&g, 0, -1, 0, -1, malloc((size_t)g.P * g.H * sizeof(float))};
    float      *fin = malloc(g.H * sizeof *fin);
    char        err[512] = "";
    cr_assert_eq(eng_model_forward(m, g.ids, g.T, g.mode == 1, fin, on_state, &tc, err, sizeof err),
                 SVC_OK, "%s: %s", file, err);
    float  logits[ENG_N_CODES];
    double p3[3], p255[ENG_N_CODES];
    eng_readout_logits(m, fin, logits);
    cr_assert_eq(eng_readout_probs(m, fin, 3, 1.0, p3), SVC_OK);
    cr_assert_eq(eng_readout_probs(m, fin, ENG_N_CODES, 1.0, p255), SVC_OK);
    double ef = rel_err(fin, g.final_last, g.H), el = rel_err(logits, g.logits, ENG_N_CODES);
    double e3 = abs_err(p3, g.probs3, 3), e255 = abs_err(p255, g.probs255, ENG_N_CODES);
    cr_expect(ef <= STATE_TOL, "%s: final_last relative error %.3g", file, ef);
    cr_expect(el <= STATE_TOL, "%s: logits relative error %.3g", file, el);
    cr_expect(e3 <= PROB_TOL, "%s: probs3 error %.3g", file, e3);
    cr_expect(e255 <= PROB_TOL, "%s: probs255 error %.3g", file, e255);
    double ef64 = rel_err64(fin, g.final_last64, g.H);
    double el64 = rel_err64(logits, g.logits64, ENG_N_CODES);
    double e3_64 = abs_err(p3, g.probs3_64, 3), e255_64 = abs_err(p255, g.probs255_64, ENG_N_CODES);
    cr_expect(ef64 <= STATE_TOL, "%s: final_last relative error %.3g against fp64", file, ef64);
    cr_expect(el64 <= STATE_TOL, "%s: logits relative error %.3g against fp64", file, el64);
    cr_expect(e3_64 <= PROB_TOL, "%s: probs3 error %.3g against fp64", file, e3_64);
    cr_expect(e255_64 <= PROB_TOL, "%s: probs255 error %.3g against fp64", file, e255_64);
    cr_log_info("%-42s T=%-5u states %.2e (state %d) final %.2e logits %.2e p3 %.2e p255 %.2e",
                file, g.T, tc.worst, tc.worst_state, ef, el, e3, e255);
    cr_log_info("%-42s fp64:   states %.2e (state %d) final %.2e logits %.2e p3 %.2e p255 %.2e",
                file, tc.worst64, tc.worst_state64, ef64, el64, e3_64, e255_64);
    free(fin);
    free(tc.row);
    golden_free(&g);
}

/* Runs every index.json case with min_T <= n_tokens < max_T. */
static void run_goldens(size_t min_T, size_t max_T) {
    json_error_t jerr;
    json_t      *idx = json_load_file(GOLD "/index.json", 0, &jerr);
    cr_assert(idx, "index.json: %s", jerr.text);
    eng_model_t *m = NULL;
    char         err[512] = "";
    cr_assert_eq(eng_model_load(PKG, &m, err, sizeof err), SVC_OK, "%s", err);
    const json_t *cases = json_object_get(idx, "cases");
    size_t        i, n = 0;
    json_t       *c;
    json_array_foreach(cases, i, c) {
        size_t T = (size_t)json_integer_value(json_object_get(c, "n_tokens"));
        if (T < min_T || T >= max_T)
            continue;
        run_case(m, json_string_value(json_object_get(c, "file")));
        n++;
    }
    cr_assert(n > 0);
    eng_model_free(m);
    json_decref(idx);
}

Test(tower, goldens_short, .timeout = 600) {
    run_goldens(0, 1000);
}
Test(tower, goldens_1000, .timeout = 600) {
    run_goldens(1000, 2000);
}
Test(tower, goldens_5000, .timeout = 1200) {
    run_goldens(2000, SIZE_MAX);
}

Test(tower, ids_out_of_range) {
    eng_model_t *m = NULL;
    char         err[512] = "";
    cr_assert_eq(eng_model_load(PKG, &m, err, sizeof err), SVC_OK, "%s", err);
    int32_t ids[3] = {1, 4048, 2};
    float   h[64];
    cr_expect_eq(eng_model_forward(m, ids, 3, false, h, NULL, NULL, err, sizeof err),
                 SVC_ERR_INVALID);
    cr_expect(strstr(err, "4048") && strstr(err, "position 1"), "%s", err);
    ids[1] = -1;
    cr_expect_eq(eng_model_forward(m, ids, 3, false, h, NULL, NULL, err, sizeof err),
                 SVC_ERR_INVALID);
    cr_expect_eq(eng_model_forward(m, ids, 0, false, h, NULL, NULL, err, sizeof err),
                 SVC_ERR_INVALID);
    double p[3];
    cr_expect_eq(eng_readout_probs(m, h, 0, 1.0, p), SVC_ERR_INVALID);
    cr_expect_eq(eng_readout_probs(m, h, 3, 0.0, p), SVC_ERR_INVALID);
    eng_model_free(m);
}

/* ------------------------------------------------------------ broken packages */

static char g_dir[256];

/* A copy of tiny-upstream in a fresh temp dir. */
static const char *copy_package(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/d3stream-tower-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cp '%s/config.json' '%s/model.safetensors' '%s/readout.safetensors' '%s/'", PKG, PKG,
             PKG, g_dir);
    cr_assert_eq(system(cmd), 0);
    return g_dir;
}

static void remove_package(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

/* Writes a safetensors file: header (JSON, padded to 8 bytes) + data. */
static void write_st(const char *path, const json_t *hdr, const uint8_t *data, size_t n) {
    char  *js = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t hl = strlen(js), pad = (8 - hl % 8) % 8;
    FILE  *fp = fopen(path, "wb");
    cr_assert(fp && js);
    uint64_t L = hl + pad; /* little-endian hosts only (x86-64, aarch64) */
    fwrite(&L, 8, 1, fp);
    fwrite(js, 1, hl, fp);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', fp);
    if (n)
        fwrite(data, 1, n, fp);
    cr_assert_eq(fclose(fp), 0);
    free(js);
}

/* Rewrites dir/model.safetensors with fn applied to its header. */
static void edit_model(const char *dir, void (*fn)(json_t *hdr)) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t   len;
    uint8_t *raw = read_all(path, &len);
    uint64_t hl;
    memcpy(&hl, raw, 8);
    json_error_t jerr;
    json_t      *hdr = json_loadb((const char *)raw + 8, hl, 0, &jerr);
    cr_assert(hdr, "%s", jerr.text);
    fn(hdr);
    write_st(path, hdr, raw + 8 + hl, len - 8 - hl);
    json_decref(hdr);
    free(raw);
}

#define T_KNORM "model.language_model.layers.3.self_attn.k_norm.weight"
#define T_INA   "model.language_model.layers.0.linear_attn.in_proj_a.weight"

static void drop_knorm(json_t *hdr) {
    json_t *t = json_incref(json_object_get(hdr, T_KNORM));
    json_object_del(hdr, T_KNORM);
    json_object_set_new(hdr, "model.language_model.layers.3.self_attn.k_norm.weightX", t);
}

static void reshape_ina(json_t *hdr) { /* [4, 64] -> [8, 32]: same bytes */
    json_object_set_new(json_object_get(hdr, T_INA), "shape", json_pack("[ii]", 8, 32));
}

static void i32_ina(json_t *hdr) { /* BF16 [4, 64] -> I32 [2, 64]: same bytes */
    json_t *t = json_object_get(hdr, T_INA);
    json_object_set_new(t, "dtype", json_string("I32"));
    json_object_set_new(t, "shape", json_pack("[ii]", 2, 64));
}

static void expect_refused(const char *dir, const char *want1, const char *want2) {
    eng_model_t *m = NULL;
    char         err[512] = "";
    cr_expect_neq(eng_model_load(dir, &m, err, sizeof err), SVC_OK);
    cr_expect_null(m);
    cr_expect(strstr(err, want1) && strstr(err, want2), "message: %s", err);
    cr_expect_null(strchr(err, '\n'), "one line: %s", err);
    cr_log_info("refused: %s", err);
}

Test(tower, refuses_missing_tensor) {
    const char *d = copy_package();
    edit_model(d, drop_knorm);
    expect_refused(d, "model.safetensors", "\"" T_KNORM "\" is missing");
    remove_package();
}

Test(tower, refuses_wrong_shape) {
    const char *d = copy_package();
    edit_model(d, reshape_ina);
    expect_refused(d, T_INA, "shape [8, 32], expected [4, 64]");
    remove_package();
}

Test(tower, refuses_wrong_dtype) {
    const char *d = copy_package();
    edit_model(d, i32_ina);
    expect_refused(d, T_INA, "dtype I32");
    remove_package();
}

/* SPEC d.5's bfloat16 readout (decision_config readout_dtype): the
 * hidden state and the weights rounded to bf16, each logit rounded to
 * bf16; float32 (the default) keeps both and rounds the logits to fp32.
 * Weights of our own, not bf16 values, so that every rounding shows. */
static float bf16_of(float x) {
    return npu_bf16_to_f32(npu_f32_to_bf16(x));
}

Test(tower, readout_dtype_bfloat16) {
    const char *d = copy_package();
    enum { H = 64 };
    static float w[ENG_N_CODES * H];
    for (size_t i = 0; i < ENG_N_CODES * H; i++)
        w[i] = 0.37f * sinf((float)i * 0.731f) + 1e-3f;
    char path[512];
    snprintf(path, sizeof path, "%s/readout.safetensors", d);
    json_t *hdr = json_pack("{s{ss s[ii] s[ii]}}", "weight", "dtype", "F32", "shape", ENG_N_CODES,
                            H, "data_offsets", 0, (int)sizeof w);
    write_st(path, hdr, (const uint8_t *)w, sizeof w);
    json_decref(hdr);
    eng_model_t *m32 = NULL, *m16 = NULL;
    char         err[512] = "";
    cr_assert_eq(eng_model_load(d, &m32, err, sizeof err), SVC_OK, "%s", err);
    snprintf(path, sizeof path, "%s/decision_config.json", d);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"readout_dtype\": \"bfloat16\"}\n", f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(eng_model_load(d, &m16, err, sizeof err), SVC_OK, "%s", err);
    cr_assert(!eng_model_readout_bf16(m32) && eng_model_readout_bf16(m16));
    int32_t ids[5] = {1, 7, 300, 12, 2};
    float   h[H];
    cr_assert_eq(eng_model_forward(m32, ids, 5, false, h, NULL, NULL, err, sizeof err), SVC_OK,
                 "%s", err);
    float l32[ENG_N_CODES], l16[ENG_N_CODES];
    eng_readout_logits(m32, h, l32);
    eng_readout_logits(m16, h, l16);
    size_t differ = 0;
    for (size_t i = 0; i < ENG_N_CODES; i++) {
        double a32 = 0, a16 = 0;
        for (size_t k = 0; k < H; k++) {
            a32 += (double)h[k] * w[i * H + k];
            a16 += (double)bf16_of(h[k]) * bf16_of(w[i * H + k]);
        }
        cr_assert_eq(l32[i], (float)a32, "logit %zu (float32)", i);
        cr_assert_eq(l16[i], bf16_of((float)a16), "logit %zu (bfloat16)", i);
        differ += l16[i] != l32[i];
    }
    cr_assert_gt(differ, ENG_N_CODES / 2, "%zu of 255 logits moved", differ);
    double p32[3], p16[3];
    cr_assert_eq(eng_readout_probs(m32, h, 3, 1.0, p32), SVC_OK);
    cr_assert_eq(eng_readout_probs(m16, h, 3, 1.0, p16), SVC_OK);
    cr_assert(p32[0] != p16[0], "the probabilities follow the logits");
    eng_model_free(m32);
    eng_model_free(m16);
    remove_package();
}

Test(tower, refuses_readout_shape) {
    const char *d = copy_package();
    char        path[512];
    snprintf(path, sizeof path, "%s/readout.safetensors", d);
    size_t   n = 255 * 65 * sizeof(float);
    json_t  *hdr = json_pack("{s{ss s[ii] s[ii]}}", "weight", "dtype", "F32", "shape", 255, 65,
                             "data_offsets", 0, (int)n);
    uint8_t *data = calloc(1, n);
    write_st(path, hdr, data, n);
    free(data);
    json_decref(hdr);
    expect_refused(d, "readout.safetensors", "shape [255, 65], expected [255, 64]");
    remove_package();
}

Test(tower, refuses_unknown_layer_type) {
    const char *d = copy_package();
    char        path[512];
    snprintf(path, sizeof path, "%s/config.json", d);
    json_error_t jerr;
    json_t      *cfg = json_load_file(path, 0, &jerr);
    cr_assert(cfg);
    json_t *lt = json_object_get(json_object_get(cfg, "text_config"), "layer_types");
    json_array_set_new(lt, 2, json_string("sliding_attention"));
    cr_assert_eq(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
    expect_refused(d, "config.json", "layer_types[2] is 'sliding_attention'");
    remove_package();
}

Test(tower, refuses_missing_config_key) {
    const char *d = copy_package();
    char        path[512];
    snprintf(path, sizeof path, "%s/config.json", d);
    json_error_t jerr;
    json_t      *cfg = json_load_file(path, 0, &jerr);
    cr_assert(cfg);
    json_object_del(json_object_get(cfg, "text_config"), "linear_num_value_heads");
    cr_assert_eq(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
    expect_refused(d, "config.json", "text_config.linear_num_value_heads");
    remove_package();
}
