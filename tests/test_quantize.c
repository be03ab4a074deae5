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
#include "eng_gptq_int.h"
#include "eng_q4nx_int.h"
#include "npu.h"
#include "test_rng.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>

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

typedef struct gq_case {
    eng_q4nx_kind_t kind;
    bool            act_order, static_groups;
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
    eng_gptq_opts_t  o = {ENG_GPTQ_DAMP, c->act_order, c->static_groups};
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
    cr_log_info("%s act_order %d static %d: loss %.4g / rtn %.4g; held out %.4g / %.4g (%.2fx)",
                eng_q4nx_kind_name(c->kind), c->act_order, c->static_groups, st.loss_gptq,
                st.loss_rtn, out_g, out_r, out_g / out_r);
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
        for (int v = 0; v < 3; v++) {
            gq_case_t c = {KINDS[i], v == 2, v == 1};
            gptq_case(&c);
        }
}
