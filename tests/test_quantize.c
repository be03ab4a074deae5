/*
 * test_quantize.c -- `d3stream quantize` (issue 33, docs/quantize.md).
 *
 * The GPTQ core first, on synthetic matrices with correlated inputs: the
 * blocked Cholesky against its definition, the tile encoders split into
 * grid and codes giving eng_q4nx_encode_ref's bytes, and GPTQ's codes
 * (every tile kind, static and dynamic grids, act-order) decoding to a
 * matrix whose output error on held-out inputs is below round-to-nearest's,
 * with its reported loss equal to the decoded matrix's.
 */
#include "engine.h"
#include "eng_fwd_int.h"
#include "eng_gptq_int.h"
#include "eng_q4nx_int.h"
#include "eng_quant_int.h"
#include "eng_util_int.h"
#include "npu.h"
#include "test_cmd.h"
#include "test_rng.h"
#include "test_util.h"

#include <jansson.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <unistd.h>

/* ---------------------------------------------------------------------
 * GPTQ core
 * --------------------------------------------------------------------- */

/* About N(0, 1): the sum of four uniforms, centred and scaled. */
static double nrm(rng_t *r) {
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += rng_uniform(r, 0.0f, 1.0f);
    return (s - 2.0) * 1.7320508075688772;
}

/* x (n, K): rows z M, z standard normal (K), M a fixed random mixing with
 * a strong shared direction, so that H = X^T X is far from diagonal, as a
 * layer's inputs are. */
static float *correlated(rng_t *r, const float *mix, size_t n, size_t K) {
    float *x = malloc(n * K * sizeof *x), *z = malloc(K * sizeof *z);
    cr_assert(x && z);
    for (size_t t = 0; t < n; t++) {
        for (size_t k = 0; k < K; k++)
            z[k] = (float)nrm(r);
        for (size_t k = 0; k < K; k++) {
            double s = 0;
            for (size_t j = 0; j < K; j++)
                s += (double)z[j] * mix[j * K + k];
            x[t * K + k] = (float)s;
        }
    }
    free(z);
    return x;
}

static float *mixing(rng_t *r, size_t K) {
    float *m = malloc(K * K * sizeof *m);
    cr_assert(m);
    for (size_t j = 0; j < K; j++)
        for (size_t k = 0; k < K; k++)
            m[j * K + k] = (float)(nrm(r) * 0.3 + (j < 4 ? 1.0 : 0.0) +
                                   (j == k ? 1.0 + (double)(k % 7) : 0.0));
    return m;
}

/* sum over rows of x of |x (a - b)^T|^2 */
static double out_err(const float *x, size_t n, const float *a, const float *b, size_t R,
                      size_t K) {
    double s = 0;
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < R; r++) {
            double y = 0;
            for (size_t k = 0; k < K; k++)
                y += (double)x[t * K + k] * ((double)a[r * K + k] - (double)b[r * K + k]);
            s += y * y;
        }
    return s;
}

Test(quantize, cholesky_blocked) {
    rng_t  r = {3 * 0x9e3779b97f4a7c15ull + 1};
    size_t K = 300; /* three blocks, the last partial */
    float *b = malloc(K * K * sizeof *b), *a = malloc(K * K * sizeof *a);
    cr_assert(a && b);
    for (size_t i = 0; i < K * K; i++)
        b[i] = (float)nrm(&r);
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < K; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (size_t k = 0; k < K; k++)
                s += (double)b[i * K + k] * b[j * K + k];
            a[i * K + j] = (float)s;
        }
    float *l = malloc(K * K * sizeof *l);
    memcpy(l, a, K * K * sizeof *l);
    cr_assert_eq(eng_gptq_cholesky(l, K), 0);
    double worst = 0;
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j <= i; j++) {
            double s = 0;
            for (size_t k = 0; k <= j; k++)
                s += (double)l[i * K + k] * l[j * K + k];
            worst = fmax(worst, fabs(s - a[i * K + j]) / sqrt((double)a[i * K + i] * a[j * K + j]));
        }
    cr_assert_lt(worst, 1e-4, "L L^T off by %g (relative)", worst);
    a[5 * K + 5] = -1; /* not positive definite at row 5 */
    memcpy(l, a, K * K * sizeof *l);
    cr_assert_eq(eng_gptq_cholesky(l, K), 6);
    free(a), free(b), free(l);
}

static const eng_q4nx_kind_t KINDS[] = {ENG_Q4NX_Q4_K, ENG_Q4NX_Q4_1, ENG_Q4NX_Q4_0, ENG_Q4NX_Q8};

Test(quantize, encode_col_is_encode_ref) {
    rng_t  r = {5 * 0x9e3779b97f4a7c15ull + 1};
    size_t R = 40, K = 300; /* padding rows and columns */
    float *w = malloc(R * K * sizeof *w);
    for (size_t i = 0; i < R * K; i++)
        w[i] = (float)nrm(&r) * 0.05f;
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        for (int ra = 0; ra < 2; ra++) {
            size_t   nb = eng_q4nx_packed_bytes(KINDS[i], R, K);
            uint8_t *a = malloc(nb), *b = malloc(nb);
            memset(b, 0x5a, nb);
            cr_assert_eq(eng_q4nx_encode_ref(KINDS[i], ra, w, R, K, a), SVC_OK);
            for (size_t q = 0; q < 2; q++)
                cr_assert_eq(eng_q4nx_encode_col(KINDS[i], ra, w, R, K, q, b, NULL, NULL), SVC_OK);
            cr_assert(memcmp(a, b, nb) == 0, "%s raster %d", eng_q4nx_kind_name(KINDS[i]), ra);
            free(a), free(b);
        }
    free(w);
}

/* Importance-fitted grids (eng_q4nx_encode_col_imp): without importances
 * exactly encode_col's bytes; with them, a lower importance-weighted
 * squared error than the plain grids', tile by tile, on weights with
 * outliers and importances that vary by 100x across columns. */
Test(quantize, importance_grids) {
    rng_t  r = {11 * 0x9e3779b97f4a7c15ull + 1};
    size_t R = 40, K = 300, P = 2, Q = 2;
    float *w = malloc(R * K * sizeof *w), *imp = malloc(K * sizeof *imp);
    for (size_t i = 0; i < R * K; i++)
        w[i] = (float)nrm(&r) * 0.05f * (i % 97 == 0 ? 4.0f : 1.0f);
    for (size_t k = 0; k < K; k++)
        imp[k] = 0.01f + rng_uniform(&r, 0.0f, 1.0f);
    for (size_t i = 0; i < 2; i++) { /* Q4_K, Q4_1 */
        size_t   nb = eng_q4nx_packed_bytes(KINDS[i], R, K);
        uint8_t *a = malloc(nb), *b = malloc(nb), *c = malloc(nb);
        float   *wa = malloc(R * K * sizeof *wa), *wc = malloc(R * K * sizeof *wc);
        for (size_t q = 0; q < Q; q++) {
            cr_assert_eq(eng_q4nx_encode_col(KINDS[i], 0, w, R, K, q, a, NULL, NULL), SVC_OK);
            cr_assert_eq(eng_q4nx_encode_col_imp(KINDS[i], 0, w, R, K, q, NULL, b, NULL, NULL),
                         SVC_OK);
            cr_assert_eq(eng_q4nx_encode_col_imp(KINDS[i], 0, w, R, K, q, imp, c, NULL, NULL),
                         SVC_OK);
        }
        cr_assert(memcmp(a, b, nb) == 0, "%s: no importances, other bytes",
                  eng_q4nx_kind_name(KINDS[i]));
        eng_q4nx_decode_ref(KINDS[i], 0, a, P, Q, R, K, wa);
        eng_q4nx_decode_ref(KINDS[i], 0, c, P, Q, R, K, wc);
        double ea = 0, ec = 0;
        for (size_t n = 0; n < R; n++)
            for (size_t k = 0; k < K; k++) {
                double da = w[n * K + k] - wa[n * K + k], dc = w[n * K + k] - wc[n * K + k];
                ea += imp[k] * da * da, ec += imp[k] * dc * dc;
            }
        cr_log_info("%s: weighted error %.4g plain, %.4g fitted (%.2fx)",
                    eng_q4nx_kind_name(KINDS[i]), ea, ec, ec / ea);
        cr_assert_lt(ec, 0.9 * ea, "%s: fitted %g, plain %g", eng_q4nx_kind_name(KINDS[i]), ec, ea);
        free(a), free(b), free(c), free(wa), free(wc);
    }
    free(w), free(imp);
}

typedef struct gq_case {
    eng_q4nx_kind_t kind;
    bool            act_order, static_groups, plain_grids;
} gq_case_t;

/* GPTQ against RTN on one case: loss in-sample and out-of-sample. */
static void gptq_case(const gq_case_t *c) {
    rng_t  r = {9 * 0x9e3779b97f4a7c15ull + 1};
    size_t R = 48, K = 320, n = 1200;
    float *mix = mixing(&r, K);
    float *x = correlated(&r, mix, n, K), *x2 = correlated(&r, mix, n, K);
    float *w = malloc(R * K * sizeof *w);
    for (size_t i = 0; i < R * K; i++)
        w[i] = (float)nrm(&r) * 0.05f;
    eng_gptq_hess_t *h = eng_gptq_hess_new(K);
    cr_assert(h);
    cr_assert_eq(eng_gptq_hess_add(h, x, n / 2), SVC_OK);
    cr_assert_eq(eng_gptq_hess_add(h, x + n / 2 * K, n - n / 2), SVC_OK);
    cr_assert_eq(eng_gptq_hess_rows(h), n);
    size_t           nb = eng_q4nx_packed_bytes(c->kind, R, K);
    uint8_t         *pg = malloc(nb), *pr = malloc(nb);
    eng_gptq_opts_t  o = {ENG_GPTQ_DAMP, c->act_order, c->static_groups, c->plain_grids};
    eng_gptq_stats_t st;
    char             errstr[256] = "";
    cr_assert_eq(
        eng_gptq_encode(c->kind, ENG_Q4NX_RASTER_B, w, R, K, h, &o, pg, &st, errstr, sizeof errstr),
        SVC_OK, "%s", errstr);
    cr_assert_eq(eng_q4nx_encode_ref(c->kind, ENG_Q4NX_RASTER_B, w, R, K, pr), SVC_OK);
    size_t P = (R + 31) / 32, Q = (K + 255) / 256;
    float *wg = malloc(R * K * sizeof *wg), *wr = malloc(R * K * sizeof *wr);
    eng_q4nx_decode_ref(c->kind, ENG_Q4NX_RASTER_B, pg, P, Q, R, K, wg);
    eng_q4nx_decode_ref(c->kind, ENG_Q4NX_RASTER_B, pr, P, Q, R, K, wr);
    double in_g = out_err(x, n, w, wg, R, K), in_r = out_err(x, n, w, wr, R, K);
    double out_g = out_err(x2, n, w, wg, R, K), out_r = out_err(x2, n, w, wr, R, K);
    cr_log_info("%s act_order %d static %d plain %d: loss %.4g / rtn %.4g; held out %.4g / %.4g "
                "(%.2fx)",
                eng_q4nx_kind_name(c->kind), c->act_order, c->static_groups, c->plain_grids,
                st.loss_gptq, st.loss_rtn, out_g, out_r, out_g / out_r);
    cr_assert(!st.kept_rtn);
    cr_assert_float_eq(st.loss_gptq, in_g, 1e-3 * in_g, "reported %g, decoded %g", st.loss_gptq,
                       in_g);
    cr_assert_float_eq(st.loss_rtn, in_r, 1e-3 * in_r, "reported %g, decoded %g", st.loss_rtn,
                       in_r);
    cr_assert_lt(out_g, 0.8 * out_r, "%s: GPTQ %g, RTN %g held out", eng_q4nx_kind_name(c->kind),
                 out_g, out_r);
    eng_gptq_hess_free(h);
    free(mix), free(x), free(x2), free(w), free(pg), free(pr), free(wg), free(wr);
}

Test(quantize, gptq_beats_rtn) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        for (int v = 0; v < 6; v++) {
            gq_case_t c = {KINDS[i], v % 3 == 2, v % 3 == 1, v >= 3};
            gptq_case(&c);
        }
}

/* ---------------------------------------------------------------------
 * Packages: tests/fixtures/tiny-upstream quantised both ways
 * --------------------------------------------------------------------- */

#define TINY    D3_SOURCE_DIR "/tests/fixtures/tiny-upstream"
#define EXAMPLE D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json"

static void tmp_root(char *root, size_t n) {
    snprintf(root, n, "/tmp/d3quant.XXXXXX");
    cr_assert_not_null(mkdtemp(root));
}

/* d3stream quantize ARGS, its exit status; stderr to the test's log. */
static int quantize_cmd(const char *args) {
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "%s quantize %s 2>&1", binary(), args);
    int rc = run_shell(cmd, &out);
    cr_log_info("%s -> %d\n%s", cmd, rc, out.data);
    svc_buf_fini(&out);
    return rc;
}

static bool same_file(const char *a, const char *b) {
    svc_buf_t x, y;
    char      errstr[256];
    svc_buf_init(&x, (size_t)1 << 26);
    svc_buf_init(&y, (size_t)1 << 26);
    bool same = svc_buf_read_file(&x, a, errstr, sizeof errstr) == SVC_OK &&
                svc_buf_read_file(&y, b, errstr, sizeof errstr) == SVC_OK && x.len == y.len &&
                memcmp(x.data, y.data, x.len) == 0;
    svc_buf_fini(&x);
    svc_buf_fini(&y);
    return same;
}

/* inspect says ok, ask answers the example, the upstream files are there
 * byte for byte and its weights and manifest are not. */
static void check_package(const char *dir) {
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "%s inspect --model %s", binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s:\n%s", cmd, out.data);
    cr_assert(strstr(out.data, "verdict        ok"), "%s", out.data);
    cr_assert(strstr(out.data, "q4nx Gen-B"), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "%s ask --model %s %s 2>/dev/null", binary(), dir, EXAMPLE);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s:\n%s", cmd, out.data);
    cr_assert(strstr(out.data, "\"route\":{\"type\":\"choice\""), "%s", out.data);
    svc_buf_fini(&out);
    static const char *const same[] = {"tokenizer.json", "tokenizer_config.json",
                                       "readout.safetensors", "decision_config.json",
                                       "chat_template.jinja"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", TINY, same[i]);
        snprintf(b, sizeof b, "%s/%s", dir, same[i]);
        cr_assert(same_file(a, b), "%s differs from the upstream file", b);
    }
    static const char *const absent[] = {"model.safetensors", "MODEL_MANIFEST.json"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        cr_assert(!eng_dir_has_file(dir, absent[i]), "%s/%s was written", dir, absent[i]);
}

Test(quantize, tiny_rtn_and_gptq_packages) {
    char root[64], args[512], rtn[128], gptq[128];
    tmp_root(root, sizeof root);
    snprintf(rtn, sizeof rtn, "%s/rtn", root);
    snprintf(gptq, sizeof gptq, "%s/gptq", root);
    snprintf(args, sizeof args, "--model %s --out %s --method rtn", TINY, rtn);
    cr_assert_eq(quantize_cmd(args), 0);
    check_package(rtn);
    snprintf(args, sizeof args, "--model %s --out %s --calibration-prompts 16", TINY, gptq);
    cr_assert_eq(quantize_cmd(args), 0);
    check_package(gptq);
    rm_tree(root);
}

/* Per layer, teacher-forced on prompts the calibration never saw (another
 * seed), the relative RMS error of what each layer adds, for the two
 * packages against the BF16 one (eng_fwd_layer_errors). */
static void layer_errors(const char *bf16, const char *a, const char *b, double *ea, double *eb,
                         size_t L) {
    loaded_t    ref, qa, qb;
    eng_calib_t c;
    char        errstr[1024] = "";
    load(bf16, &ref);
    load(a, &qa);
    load(b, &qb);
    eng_calib_init(&c);
    cr_assert_eq(eng_calib_generate(ref.pkg, 1000, 12, 16384, &c, errstr, sizeof errstr), SVC_OK,
                 "%s", errstr);
    cr_assert_geq(c.n, 6);
    double *num = calloc(2 * L, sizeof *num), *den = calloc(2 * L, sizeof *den);
    bool    nc = eng_package_noncausal(ref.pkg);
    for (size_t i = 0; i < c.n; i++) {
        cr_assert_eq(eng_fwd_layer_errors(ref.model, qa.model, c.seqs[i].v, c.seqs[i].n, nc, num,
                                          den, errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
        cr_assert_eq(eng_fwd_layer_errors(ref.model, qb.model, c.seqs[i].v, c.seqs[i].n, nc,
                                          num + L, den + L, errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
    }
    for (size_t l = 0; l < L; l++) {
        ea[l] = sqrt(num[l] / den[l]);
        eb[l] = sqrt(num[L + l] / den[L + l]);
    }
    cr_log_info("held out: %zu prompts, %llu tokens", c.n, (unsigned long long)c.tokens);
    free(num), free(den);
    eng_calib_fini(&c);
    unload(&ref), unload(&qa), unload(&qb);
}

static void quantize_to(const char *out, eng_quant_method_t m) {
    char             errstr[1024] = "";
    eng_quant_opts_t o = {.model_dir = TINY, .out_dir = out, .method = m};
    cr_assert_eq(eng_quantize(&o, errstr, sizeof errstr), SVC_OK, "%s", errstr);
}

Test(quantize, gptq_layer_error_below_rtn) {
    char root[64], rtn[128], gptq[128];
    tmp_root(root, sizeof root);
    snprintf(rtn, sizeof rtn, "%s/rtn", root);
    snprintf(gptq, sizeof gptq, "%s/gptq", root);
    quantize_to(rtn, ENG_QUANT_RTN);
    quantize_to(gptq, ENG_QUANT_GPTQ);
    enum { L = 6 };
    double er[L], eg[L];
    layer_errors(TINY, rtn, gptq, er, eg, L);
    for (size_t l = 0; l < L; l++) {
        cr_log_info("layer %zu: relative RMS error RTN %.4f, GPTQ %.4f (%.2fx)", l, er[l], eg[l],
                    eg[l] / er[l]);
        cr_expect_lt(eg[l], er[l], "layer %zu: GPTQ %g, RTN %g", l, eg[l], er[l]);
    }
    rm_tree(root);
}

/* A reference pass over a model's own layers, the stream after layer
 * `keep` copied out (eng_fwd_ref_t.done). */
typedef struct ref_cut {
    const eng_model_t *m;
    size_t             keep, seen;
    float             *x;
} ref_cut_t;

static svc_err_t cut_fetch(void *user, size_t li, eng_layer_t *l, char *errstr, size_t n) {
    (void)errstr, (void)n;
    *l = ((ref_cut_t *)user)->m->layers[li];
    return SVC_OK;
}

static void cut_drop(void *user, eng_layer_t *l) {
    (void)user, (void)l;
}

static svc_err_t cut_done(void *user, size_t li, const float *x, size_t rows, char *errstr,
                          size_t n) {
    ref_cut_t *c = user;
    (void)errstr, (void)n;
    c->seen++;
    if (li == c->keep) {
        c->x = malloc(rows * c->m->cfg.hidden * sizeof *c->x);
        cr_assert(c->x);
        memcpy(c->x, x, rows * c->m->cfg.hidden * sizeof *c->x);
    }
    return SVC_OK;
}

/* A reference pass started at layer k from the stream another pass had
 * after layer k - 1 ends bit for bit where the whole pass does (what
 * `quantize --resume` relies on). */
Test(quantize, reference_pass_resumes_bit_for_bit) {
    loaded_t    l;
    eng_calib_t c;
    char        errstr[1024] = "";
    load(TINY, &l);
    eng_calib_init(&c);
    cr_assert_eq(eng_calib_generate(l.pkg, 5, 3, 4096, &c, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    size_t         H = l.model->cfg.hidden, L = l.model->cfg.n_layers, k = 3;
    float         *fin = malloc(2 * c.n * H * sizeof *fin);
    eng_fwd_seq_t *seqs = calloc(c.n, sizeof *seqs);
    cr_assert(fin && seqs && c.n >= 2);
    for (size_t i = 0; i < c.n; i++)
        seqs[i] = (eng_fwd_seq_t){NULL, c.seqs[i].v, c.seqs[i].n, fin + i * H};
    ref_cut_t     cut = {.m = l.model, .keep = k - 1};
    eng_fwd_ref_t r = {.fetch = cut_fetch, .drop = cut_drop, .user = &cut, .done = cut_done};
    bool          nc = eng_package_noncausal(l.pkg);
    cr_assert_eq(eng_fwd_reference(l.model, &r, seqs, c.n, NULL, nc, errstr, sizeof errstr), SVC_OK,
                 "%s", errstr);
    cr_assert_eq(cut.seen, L);
    for (size_t i = 0; i < c.n; i++)
        seqs[i].final_last = fin + (c.n + i) * H;
    ref_cut_t     again = {.m = l.model, .keep = SIZE_MAX};
    eng_fwd_ref_t r2 = {.fetch = cut_fetch,
                        .drop = cut_drop,
                        .user = &again,
                        .done = cut_done,
                        .first = k,
                        .x0 = cut.x};
    cr_assert_eq(eng_fwd_reference(l.model, &r2, seqs, c.n, NULL, nc, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
    cr_assert_eq(again.seen, L - k);
    cr_assert(memcmp(fin, fin + c.n * H, c.n * H * sizeof *fin) == 0,
              "the resumed pass's final states differ");
    r2.x0 = NULL; /* a start without its input is refused */
    cr_assert_eq(eng_fwd_reference(l.model, &r2, seqs, c.n, NULL, nc, errstr, sizeof errstr),
                 SVC_ERR_INVALID);
    free(cut.x), free(fin), free(seqs);
    eng_calib_fini(&c);
    unload(&l);
}

/* The examples' requests as a JSONL file (a blank line among them). */
static void write_jsonl(const char *path, const char *bad_line) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    static const char *const ex[] = {D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json",
                                     D3_SOURCE_DIR "/ops/examples/ticket-triage.json"};
    for (size_t i = 0; i < 2; i++) {
        svc_buf_t b;
        char      errstr[256];
        svc_buf_init(&b, 1 << 20);
        cr_assert_eq(svc_buf_read_file(&b, ex[i], errstr, sizeof errstr), SVC_OK, "%s", errstr);
        while (b.len && b.data[b.len - 1] == '\n')
            b.len--;
        fwrite(b.data, 1, b.len, f);
        fputs("\n\n", f);
        svc_buf_fini(&b);
    }
    if (bad_line)
        fprintf(f, "%s\n", bad_line);
    fclose(f);
}

Test(quantize, calibration_file) {
    char root[64], jsonl[128], bad[128], out[128], args[768];
    tmp_root(root, sizeof root);
    snprintf(jsonl, sizeof jsonl, "%s/calib.jsonl", root);
    snprintf(bad, sizeof bad, "%s/bad.jsonl", root);
    snprintf(out, sizeof out, "%s/q", root);
    write_jsonl(jsonl, NULL);
    write_jsonl(bad, "{\"state\": \"x\"}");
    snprintf(args, sizeof args, "--model %s --out %s --calibration %s", TINY, out, jsonl);
    cr_assert_eq(quantize_cmd(args), 0);
    check_package(out);
    /* line 5 (two requests, each followed by a blank line) has no questions */
    char      cmd[1024];
    svc_buf_t o;
    snprintf(cmd, sizeof cmd, "%s quantize --model %s --out %s/q2 --calibration %s 2>&1", binary(),
             TINY, root, bad);
    cr_assert_eq(run_shell(cmd, &o), 3, "%s", o.data);
    cr_assert(strstr(o.data, "bad.jsonl\" line 5: invalid_request"), "%s", o.data);
    svc_buf_fini(&o);
    rm_tree(root);
}

Test(quantize, refusals) {
    char root[64], src[128], out[128], args[768];
    tmp_root(root, sizeof root);
    snprintf(out, sizeof out, "%s/q", root);
    static const char *const usage[] = {
        "--method rtn --calibration-prompts 4",
        "--calibration /dev/null --calibration-prompts 3",
        "--generation c",
        "--damp 0",
        "--calibration-tokens x",
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        snprintf(args, sizeof args, "--model %s --out %s %s", TINY, out, usage[i]);
        cr_assert_eq(quantize_cmd(args), 2, "%s", usage[i]);
    }
    snprintf(args, sizeof args, "--model %s --out %s", TINY, TINY); /* not empty */
    cr_assert_eq(quantize_cmd(args), 2);
    /* the package's own directory, however spelt: refused before anything is written */
    snprintf(src, sizeof src, "%s/src", root);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp -r %s %s", TINY, src);
    cr_assert_eq(system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --out %s/. --force --method rtn", src, src);
    cr_assert_eq(quantize_cmd(args), 3);
    cr_assert(!eng_dir_has_file(src, "model.q4nx"));
    /* not an upstream package: a q4nx one */
    snprintf(args, sizeof args, "--model %s --out %s --method rtn", src, out);
    cr_assert_eq(quantize_cmd(args), 0);
    snprintf(args, sizeof args, "--model %s --out %s/again --method rtn", out, root);
    cr_assert_eq(quantize_cmd(args), 3);
    rm_tree(root);
}

Test(quantize, generation_a) {
    char root[64], out[128], args[512], cmd[512];
    tmp_root(root, sizeof root);
    snprintf(out, sizeof out, "%s/a", root);
    snprintf(args, sizeof args, "--model %s --out %s --generation a --calibration-prompts 8", TINY,
             out);
    cr_assert_eq(quantize_cmd(args), 0);
    svc_buf_t o;
    snprintf(cmd, sizeof cmd, "%s inspect --model %s", binary(), out);
    cr_assert_eq(run_shell(cmd, &o), 0, "%s", o.data);
    cr_assert(strstr(o.data, "q4nx Gen-A"), "%s", o.data);
    cr_assert(strstr(o.data, "q4_1"), "%s", o.data);
    svc_buf_fini(&o);
    snprintf(cmd, sizeof cmd, "%s ask --model %s %s 2>/dev/null", binary(), out, EXAMPLE);
    cr_assert_eq(run_shell(cmd, &o), 0, "%s", o.data);
    svc_buf_fini(&o);
    rm_tree(root);
}

/* The generator: deterministic, decodable, its states in range, and
 * varied (every question type, instructions given and not, non-ASCII
 * languages). */
Test(quantize, generated_requests) {
    loaded_t l;
    load(TINY, &l);
    const eng_tokenizer_t *tok = eng_package_tokenizer(l.pkg);
    size_t                 types[3] = {0}, no_instr = 0, non_ascii = 0, n = 60;
    for (size_t i = 0; i < n; i++) {
        svc_buf_t a, b;
        svc_buf_init(&a, 1 << 24);
        svc_buf_init(&b, 1 << 24);
        cr_assert_eq(eng_calib_request(tok, 7, i, &a), SVC_OK);
        cr_assert_eq(eng_calib_request(tok, 7, i, &b), SVC_OK);
        cr_assert(a.len == b.len && memcmp(a.data, b.data, a.len) == 0, "request %zu differs", i);
        sch_request_t        *req = decode_valid(a.data, a.len);
        const sch_part_t     *p = sch_request_part(req, 0);
        const sch_question_t *q = &p->questions[0];
        cr_assert_null(q->error_code, "request %zu: %s", i, q->error_message);
        types[q->type]++;
        no_instr += q->instructions == NULL;
        non_ascii += strstr(a.data, "\\u") != NULL;
        eng_ids_t ids;
        eng_ids_init(&ids);
        json_t *j = json_loads(a.data, 0, NULL);
        cr_assert(j);
        const char *state = json_string_value(json_object_get(j, "state"));
        cr_assert_eq(eng_tokenizer_encode(tok, state, strlen(state), &ids), SVC_OK);
        cr_assert(ids.n >= ENG_CALIB_STATE_MIN && ids.n < ENG_CALIB_STATE_MAX + 400,
                  "request %zu: state of %zu tokens", i, ids.n);
        json_decref(j);
        eng_ids_fini(&ids);
        sch_request_free(req);
        svc_buf_fini(&a);
        svc_buf_fini(&b);
    }
    cr_log_info("types %zu %zu %zu, %zu without instructions, %zu non-ASCII", types[0], types[1],
                types[2], no_instr, non_ascii);
    for (int t = 0; t < 3; t++)
        cr_assert_gt(types[t], 0, "no question of type %d in %zu requests", t, n);
    cr_assert_gt(no_instr, 0);
    cr_assert_gt(non_ascii, 0);
    unload(&l);
}

/* ---------------------------------------------------------------------
 * Restarting (--resume): per-layer checkpoints in OUT/quantize.partial
 * --------------------------------------------------------------------- */

#define TRAINED D3_SOURCE_DIR "/tests/fixtures/trained-tiny"

/* `ENV d3stream quantize ARGS`: its exit status, its stderr in out (the
 * caller frees). */
static int quantize_out(const char *env, const char *args, svc_buf_t *out) {
    char cmd[1536];
    snprintf(cmd, sizeof cmd, "%s %s quantize %s --no-golden 2>&1", env ? env : "", binary(), args);
    int rc = run_shell(cmd, out);
    cr_log_info("%s -> %d\n%s", cmd, rc, out->data);
    return rc;
}

static void expect_same_package(const char *a, const char *b) {
    static const char *const files[] = {"model.q4nx", "MANIFEST.sha256", "README.md",
                                        "config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char x[256], y[256];
        snprintf(x, sizeof x, "%s/%s", a, files[i]);
        snprintf(y, sizeof y, "%s/%s", b, files[i]);
        cr_expect(same_file(x, y), "%s differs from %s", y, x);
    }
    cr_expect(!eng_dir_has_file(b, ENG_QUANT_PARTIAL), "%s/%s left behind", b, ENG_QUANT_PARTIAL);
    char partial[256];
    snprintf(partial, sizeof partial, "%s/%s", b, ENG_QUANT_PARTIAL);
    cr_expect(access(partial, F_OK) != 0, "%s left behind", partial);
}

/* A run stopped after `stop` layers (the test hook: as a kill after that
 * layer's checkpoint), then resumed: the package an uninterrupted run
 * writes, byte for byte. */
static void stop_and_resume(const char *model, const char *opts, const char *whole, const char *out,
                            int stop, size_t layers) {
    char      args[768], env[64], want[96];
    svc_buf_t o;
    snprintf(env, sizeof env, "D3_TEST_QUANT_STOP_AFTER_LAYER=%d", stop);
    snprintf(args, sizeof args, "--model %s --out %s %s", model, out, opts);
    cr_assert_eq(quantize_out(env, args, &o), 3, "%s", o.data);
    cr_assert(strstr(o.data, "stopped after layer"), "%s", o.data);
    svc_buf_fini(&o);
    cr_assert(!eng_dir_has_file(out, "model.q4nx"));
    snprintf(args, sizeof args, "--model %s --out %s %s --resume", model, out, opts);
    cr_assert_eq(quantize_out(NULL, args, &o), 0, "%s", o.data);
    if ((size_t)stop < layers)
        snprintf(want, sizeof want, "resuming at layer %d of %zu", stop + 1, layers);
    else
        snprintf(want, sizeof want, "all %zu layers were checkpointed", layers);
    cr_expect(strstr(o.data, want), "no \"%s\" in:\n%s", want, o.data);
    svc_buf_fini(&o);
    expect_same_package(whole, out);
}

/* A fresh root for a test (into root) and tiny-upstream quantised there
 * uninterrupted with opts, into root/whole (into whole). */
static void uninterrupted(const char *opts, char *root, size_t root_size, char *whole,
                          size_t whole_size) {
    char      args[512];
    svc_buf_t o;
    tmp_root(root, root_size);
    snprintf(whole, whole_size, "%s/whole", root);
    snprintf(args, sizeof args, "--model %s --out %s %s", TINY, whole, opts);
    cr_assert_eq(quantize_out(NULL, args, &o), 0, "%s", o.data);
    svc_buf_fini(&o);
}

Test(quantize, resume_is_byte_identical, .timeout = 120) {
    char      root[64], whole[128], out[192], args[512];
    svc_buf_t o;
    uninterrupted("", root, sizeof root, whole, sizeof whole);
    static const int stops[] = {1, 4, 6}; /* 6: every layer done, only the rest left */
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        snprintf(out, sizeof out, "%s/stop%d", root, stops[i]);
        stop_and_resume(TINY, "", whole, out, stops[i], 6);
    }
    /* --resume with nothing to resume starts at layer 1 */
    snprintf(out, sizeof out, "%s/fresh", root);
    snprintf(args, sizeof args, "--model %s --out %s --resume", TINY, out);
    cr_assert_eq(quantize_out(NULL, args, &o), 0, "%s", o.data);
    cr_expect(strstr(o.data, "no checkpoint"), "%s", o.data);
    svc_buf_fini(&o);
    expect_same_package(whole, out);
    /* the trained fixture, Gen-A, the columns in order, a smaller calibration */
    static const char opts[] = "--generation a --no-act-order --calibration-tokens 8192";
    snprintf(whole, sizeof whole, "%s/trained", root);
    snprintf(args, sizeof args, "--model %s --out %s %s", TRAINED, whole, opts);
    cr_assert_eq(quantize_out(NULL, args, &o), 0, "%s", o.data);
    svc_buf_fini(&o);
    snprintf(out, sizeof out, "%s/trained-stop", root);
    stop_and_resume(TRAINED, opts, whole, out, 3, 6);
    rm_tree(root);
}

/* A checkpoint of other options, of another method or calibration is
 * refused naming the field; without --resume it is neither used nor
 * silently discarded. */
Test(quantize, resume_refuses_other_options, .timeout = 60) {
    char      root[64], out[128], args[512];
    svc_buf_t o;
    tmp_root(root, sizeof root);
    snprintf(out, sizeof out, "%s/q", root);
    snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192", TINY, out);
    cr_assert_eq(quantize_out("D3_TEST_QUANT_STOP_AFTER_LAYER=2", args, &o), 3, "%s", o.data);
    svc_buf_fini(&o);
    static const struct {
        const char *opts, *field;
    } other[] = {
        {"--calibration-tokens 8192 --damp 0.2", "field \"damp\""},
        {"--calibration-tokens 8192 --calibration-seed 3", "field \"calibration_seed\""},
        {"--calibration-tokens 8192 --no-act-order", "field \"act_order\""},
        {"--calibration-tokens 8192 --plain-grids", "field \"grids\""},
        {"--calibration-tokens 8192 --generation a", "field \"generation\""},
        {"--calibration-tokens 4096", "field \"calibration_tokens\""},
        {"--method rtn", "field \"method\""},
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        snprintf(args, sizeof args, "--model %s --out %s %s --resume", TINY, out, other[i].opts);
        cr_expect_eq(quantize_out(NULL, args, &o), 3, "%s: %s", other[i].opts, o.data);
        cr_expect(strstr(o.data, other[i].field) && strstr(o.data, "refusing to mix"),
                  "%s: no %s in %s", other[i].opts, other[i].field, o.data);
        svc_buf_fini(&o);
    }
    /* the source's files changed (another copy of the package) */
    char src[128], cmd[512];
    snprintf(src, sizeof src, "%s/src", root);
    snprintf(cmd, sizeof cmd, "cp -r %s %s && touch -d '2001-01-01' %s/config.json", TINY, src,
             src);
    cr_assert_eq(system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192 --resume", src, out);
    cr_expect_eq(quantize_out(NULL, args, &o), 3, "%s", o.data);
    cr_expect(strstr(o.data, "field \"source\""), "%s", o.data);
    svc_buf_fini(&o);
    /* not resumed: refused unless --force; --resume --force is a usage error */
    snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192", TINY, out);
    cr_expect_eq(quantize_out(NULL, args, &o), 2, "%s", o.data);
    cr_expect(strstr(o.data, "unfinished run's checkpoints"), "%s", o.data);
    svc_buf_fini(&o);
    snprintf(args, sizeof args, "--model %s --out %s --resume --force", TINY, out);
    cr_expect_eq(quantize_out(NULL, args, &o), 2, "%s", o.data);
    svc_buf_fini(&o);
    /* the checkpoint is still the one made: it resumes */
    snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192 --resume", TINY,
             out);
    cr_expect_eq(quantize_out(NULL, args, &o), 0, "%s", o.data);
    cr_expect(strstr(o.data, "resuming at layer 3 of 6"), "%s", o.data);
    svc_buf_fini(&o);
    rm_tree(root);
}

/* Flips one byte of dir/name, or cuts it to half its size. */
static void damage(const char *dir, const char *name, bool cut) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", dir, ENG_QUANT_PARTIAL, name);
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    if (cut) {
        cr_assert_eq(ftruncate(fileno(f), n / 2), 0);
    } else {
        fseek(f, n / 2, SEEK_SET);
        int c = fgetc(f);
        fseek(f, n / 2, SEEK_SET);
        fputc(c ^ 0x40, f);
    }
    fclose(f);
}

/* A damaged checkpoint file (a tiles file, the stream; a byte changed or
 * the file cut) is refused naming it, never used; --force starts over. */
Test(quantize, resume_refuses_damaged_checkpoint, .timeout = 60) {
    char      root[64], out[128], whole[128], args[512];
    svc_buf_t o;
    uninterrupted("--calibration-tokens 8192", root, sizeof root, whole, sizeof whole);
    static const struct {
        const char *file;
        bool        cut;
    } bad[] = {
        {"layer-001.tiles", false},
        {"layer-000.tiles", true},
        {"stream-002.f32", false},
        {"stream-002.f32", true},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(out, sizeof out, "%s/q%zu", root, i);
        snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192", TINY, out);
        cr_assert_eq(quantize_out("D3_TEST_QUANT_STOP_AFTER_LAYER=3", args, &o), 3, "%s", o.data);
        svc_buf_fini(&o);
        damage(out, bad[i].file, bad[i].cut);
        snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192 --resume", TINY,
                 out);
        cr_expect_eq(quantize_out(NULL, args, &o), 3, "%s: %s", bad[i].file, o.data);
        cr_expect(strstr(o.data, bad[i].file) && strstr(o.data, "is damaged"), "%s: %s",
                  bad[i].file, o.data);
        cr_expect(!eng_dir_has_file(out, "model.q4nx"));
        svc_buf_fini(&o);
        snprintf(args, sizeof args, "--model %s --out %s --calibration-tokens 8192 --force", TINY,
                 out);
        cr_assert_eq(quantize_out(NULL, args, &o), 0, "%s", o.data);
        svc_buf_fini(&o);
        expect_same_package(whole, out);
    }
    rm_tree(root);
}
