/*
 * test_accuracy.c -- the `fast` profile against `exact` on a model trained on
 * real text (tests/fixtures/trained-tiny, tests/tools/train_tiny_qwen35.py:
 * a small Qwen3.5 trained on the King James Bible, its readout the trained
 * lm_head rows of the 255 code tokens), over the fixture's 200 held-out
 * passages (prompts.json).
 *
 * Each passage is tokenized with the package's tokenizer and run through
 * the text tower under both profiles (eng_model_profile); per passage the
 * final-norm hidden at the last position (as eng_model_forward returns it)
 * and the readout's option probabilities (eng_readout_probs, 3 options and
 * all 255 codes, the package temperature) are compared.
 *
 * Bounds (issue 28): median cosine of the final hidden >= 0.999 and
 * max |dp| <= 0.01 over every probability of every passage. Where
 * npu_fast_usable() is false, fast runs the exact kernels: the test says so
 * and still checks (then the two agree exactly).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "npu.h"
#include "test_rng.h"

#define PKG "/tests/fixtures/trained-tiny"

#define MEDIAN_COS_MIN 0.999
#define MAX_DP         0.01

/* ------------------------------------------------------- comparison */

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* What the comparison of two profiles' runs measured. */
typedef struct acc_stats {
    double median_cos, min_cos;
    double max_dp3, max_dp255; /* max |dp| over the 3-option / 255-code probabilities */
    size_t top1_diff255;       /* passages whose most likely code differs */
} acc_stats_t;

static size_t argmax(const double *p, size_t n) {
    size_t k = 0;
    for (size_t i = 1; i < n; i++)
        if (p[i] > p[k])
            k = i;
    return k;
}

/*
 * Compares n runs: ha[i], hb[i] (hidden floats each) are the final hiddens
 * of run i under profiles a and b (models ma, mb: their readouts give the
 * probabilities). The one comparison the test asserts on, and that its unit
 * check feeds perturbed states.
 */
static void acc_compare(const eng_model_t *ma, const eng_model_t *mb, const float *ha,
                        const float *hb, size_t n, size_t hidden, double temperature,
                        acc_stats_t *st) {
    double *cos = calloc(n, sizeof *cos);
    cr_assert(cos);
    memset(st, 0, sizeof *st);
    st->min_cos = INFINITY;
    for (size_t i = 0; i < n; i++) {
        const float *a = ha + i * hidden, *b = hb + i * hidden;
        cos[i] = vec_cosine(a, b, hidden);
        st->min_cos = fmin(st->min_cos, cos[i]);
        double pa[ENG_N_CODES], pb[ENG_N_CODES];
        cr_assert_eq(eng_readout_probs(ma, a, 3, temperature, pa), SVC_OK);
        cr_assert_eq(eng_readout_probs(mb, b, 3, temperature, pb), SVC_OK);
        for (size_t k = 0; k < 3; k++)
            st->max_dp3 = fmax(st->max_dp3, fabs(pa[k] - pb[k]));
        cr_assert_eq(eng_readout_probs(ma, a, ENG_N_CODES, temperature, pa), SVC_OK);
        cr_assert_eq(eng_readout_probs(mb, b, ENG_N_CODES, temperature, pb), SVC_OK);
        for (size_t k = 0; k < ENG_N_CODES; k++)
            st->max_dp255 = fmax(st->max_dp255, fabs(pa[k] - pb[k]));
        st->top1_diff255 += argmax(pa, ENG_N_CODES) != argmax(pb, ENG_N_CODES);
    }
    qsort(cos, n, sizeof *cos, cmp_double);
    st->median_cos = n % 2 ? cos[n / 2] : 0.5 * (cos[n / 2 - 1] + cos[n / 2]);
    free(cos);
}

/* The bounds. */
static bool acc_ok(const acc_stats_t *st) {
    return st->median_cos >= MEDIAN_COS_MIN && st->max_dp3 <= MAX_DP && st->max_dp255 <= MAX_DP;
}

/* ------------------------------------------------------- fixture */

typedef struct passages {
    size_t     n;
    eng_ids_t *ids; /* (n) the package tokenizer's ids */
    size_t     n_tokens;
} passages_t;

/* prompts.json's passages tokenized with the package's tokenizer; the ids
 * the training script stored must be the same. */
static void passages_load(const eng_package_t *pkg, passages_t *ps) {
    json_error_t jerr;
    json_t      *root = json_load_file(D3_SOURCE_DIR PKG "/prompts.json", 0, &jerr);
    cr_assert(root, "prompts.json: %s (line %d)", jerr.text, jerr.line);
    const json_t *arr = json_object_get(root, "prompts");
    cr_assert(json_is_array(arr) && json_array_size(arr) == 200, "prompts.json: 200 prompts");
    ps->n = json_array_size(arr);
    ps->ids = calloc(ps->n, sizeof *ps->ids);
    ps->n_tokens = 0;
    cr_assert(ps->ids);
    size_t  i;
    json_t *p;
    json_array_foreach(arr, i, p) {
        const json_t *text = json_object_get(p, "text"), *ids = json_object_get(p, "ids");
        cr_assert(json_is_string(text) && json_is_array(ids), "prompts[%zu]", i);
        eng_ids_init(&ps->ids[i]);
        cr_assert_eq(eng_tokenizer_encode(eng_package_tokenizer(pkg), json_string_value(text),
                                          json_string_length(text), &ps->ids[i]),
                     SVC_OK);
        const eng_ids_t *got = &ps->ids[i];
        cr_assert_eq(got->n, json_array_size(ids), "prompts[%zu]: %zu ids, the fixture has %zu", i,
                     got->n, json_array_size(ids));
        cr_assert(got->n >= 40 && got->n <= 300, "prompts[%zu]: %zu tokens", i, got->n);
        for (size_t k = 0; k < got->n; k++)
            cr_assert_eq(got->v[k], json_integer_value(json_array_get(ids, k)),
                         "prompts[%zu] token %zu", i, k);
        ps->n_tokens += got->n;
    }
    json_decref(root);
}

static void passages_fini(passages_t *ps) {
    for (size_t i = 0; i < ps->n; i++)
        eng_ids_fini(&ps->ids[i]);
    free(ps->ids);
}

/* Final hiddens of every passage under view m: (n, hidden). */
static float *run_all(const eng_model_t *m, const passages_t *ps, bool noncausal) {
    size_t H = eng_model_hidden_size(m);
    float *h = malloc(ps->n * H * sizeof *h);
    char   err[512] = "";
    cr_assert(h);
    for (size_t i = 0; i < ps->n; i++)
        cr_assert_eq(eng_model_forward(m, ps->ids[i].v, ps->ids[i].n, noncausal, h + i * H, NULL,
                                       NULL, err, sizeof err),
                     SVC_OK, "prompts[%zu]: %s", i, err);
    return h;
}

/* ------------------------------------------------------- tests */

/* The comparison helper on hand-made vectors: it measures what it says and
 * its verdict can fail. */
Test(accuracy, compare_helper) {
    const float a[4] = {1, 0, 0, 0}, b[4] = {0, 1, 0, 0}, c[4] = {2, 0, 0, 0};
    const float d[4] = {-1, 0, 0, 0}, z[4] = {0};
    cr_assert_float_eq(vec_cosine(a, b, 4), 0.0, 1e-15);
    cr_assert_float_eq(vec_cosine(a, c, 4), 1.0, 1e-15);
    cr_assert_float_eq(vec_cosine(a, d, 4), -1.0, 1e-15);
    cr_assert_float_eq(vec_cosine(z, z, 4), 1.0, 1e-15);
    cr_assert_float_eq(vec_cosine(a, z, 4), 0.0, 1e-15);
    acc_stats_t st = {.median_cos = MEDIAN_COS_MIN, .min_cos = 0.99, .max_dp3 = MAX_DP};
    cr_assert(acc_ok(&st), "at the bounds passes");
    st.median_cos = MEDIAN_COS_MIN - 1e-4;
    cr_assert(!acc_ok(&st), "median cosine below the bound fails");
    st.median_cos = 1.0;
    st.max_dp255 = MAX_DP + 1e-4;
    cr_assert(!acc_ok(&st), "a 255-code |dp| over the bound fails");
    st.max_dp255 = 0.0;
    st.max_dp3 = MAX_DP + 1e-4;
    cr_assert(!acc_ok(&st), "a 3-option |dp| over the bound fails");
}

Test(accuracy, fast_vs_exact, .timeout = 600) {
    char           err[1024] = "";
    eng_package_t *pkg = NULL;
    eng_model_t   *m = NULL;
    cr_assert_eq(eng_package_open(D3_SOURCE_DIR PKG, &pkg, err, sizeof err), SVC_OK, "%s", err);
    cr_assert_eq(eng_model_load(D3_SOURCE_DIR PKG, &m, err, sizeof err), SVC_OK, "%s", err);
    cr_assert_eq(eng_model_check_parameters(m, D3_SOURCE_DIR PKG, err, sizeof err), SVC_OK, "%s",
                 err);
    const eng_model_t *exact = eng_model_profile(m, ENG_PROFILE_EXACT);
    const eng_model_t *fast = eng_model_profile(m, ENG_PROFILE_FAST);
    size_t             H = eng_model_hidden_size(m);
    double             temp = eng_package_temperature(pkg);
    bool               noncausal = eng_package_noncausal(pkg);

    passages_t ps;
    passages_load(pkg, &ps);
    if (npu_fast_usable())
        cr_log_info("fast profile: %s kernels (numerics %s)", npu_matmul_fast_name(),
                    eng_profile_numerics(ENG_PROFILE_FAST));
    else
        cr_log_info("no fast kernels (npu_fast_usable() false: no AVX-512 VNNI, or "
                    "D3_NPU_KERNELS): fast runs the exact kernels; the comparison still runs");

    float *he = run_all(exact, &ps, noncausal);
    float *hf = run_all(fast, &ps, noncausal);

    acc_stats_t st;
    acc_compare(exact, fast, he, hf, ps.n, H, temp, &st);
    cr_log_info("trained-tiny, %zu passages, %zu tokens: fast vs exact final hidden cosine "
                "median %.7f min %.7f; max |dp| 3 options %.3g, 255 codes %.3g; top code "
                "differs in %zu",
                ps.n, ps.n_tokens, st.median_cos, st.min_cos, st.max_dp3, st.max_dp255,
                st.top1_diff255);
    cr_expect_geq(st.median_cos, MEDIAN_COS_MIN, "median cosine %.7f", st.median_cos);
    cr_expect_leq(st.max_dp3, MAX_DP, "max |dp| (3 options) %.4g", st.max_dp3);
    cr_expect_leq(st.max_dp255, MAX_DP, "max |dp| (255 codes) %.4g", st.max_dp255);
    cr_expect(acc_ok(&st));
    if (!npu_fast_usable())
        cr_expect_eq(st.max_dp255, 0.0, "fast without fast kernels must be exact");

    /* The readout is meaningful: its 3-option answers are not near uniform. */
    size_t flat = 0;
    for (size_t i = 0; i < ps.n; i++) {
        double p[3];
        cr_assert_eq(eng_readout_probs(exact, he + i * H, 3, temp, p), SVC_OK);
        flat += fabs(p[argmax(p, 3)] - 1.0 / 3) < 0.05;
    }
    cr_expect_leq(flat, ps.n / 4, "%zu of %zu passages with a near-uniform 3-option answer", flat,
                  ps.n);

    /* The same comparison catches a wrong fast path: the exact states with
     * 10% (rms) noise, and with the hidden of each passage shifted to the
     * next passage's, both fail. */
    float   *bad = malloc(ps.n * H * sizeof *bad);
    uint64_t s = 0x9e3779b97f4a7c15u;
    cr_assert(bad);
    for (size_t i = 0; i < ps.n; i++) {
        const float *h = he + i * H;
        double       ss = 0;
        for (size_t k = 0; k < H; k++)
            ss += (double)h[k] * h[k];
        double rms = sqrt(ss / H);
        for (size_t k = 0; k < H; k++) {
            s = s * 6364136223846793005u + 1442695040888963407u;
            double u = ((double)(s >> 11) / 9007199254740992.0) * 2 - 1; /* U(-1, 1) */
            bad[i * H + k] = (float)(h[k] + 0.1 * sqrt(3.0) * rms * u);
        }
    }
    acc_stats_t sb;
    acc_compare(exact, exact, he, bad, ps.n, H, temp, &sb);
    cr_log_info("10%% noise: median cosine %.7f, max |dp| 3 options %.3g, 255 codes %.3g",
                sb.median_cos, sb.max_dp3, sb.max_dp255);
    cr_expect(!acc_ok(&sb), "10%% noise on the hidden state passed the check");
    for (size_t i = 0; i < ps.n; i++)
        memcpy(bad + i * H, he + ((i + 1) % ps.n) * H, H * sizeof *bad);
    acc_compare(exact, exact, he, bad, ps.n, H, temp, &sb);
    cr_expect(!acc_ok(&sb), "the wrong passage's hidden state passed the check");
    acc_compare(exact, exact, he, he, ps.n, H, temp, &sb);
    cr_expect(acc_ok(&sb) && sb.median_cos >= 1 - 1e-12 && sb.max_dp255 == 0.0);

    free(bad);
    free(hf);
    free(he);
    passages_fini(&ps);
    eng_model_free(m);
    eng_package_free(pkg);
}
