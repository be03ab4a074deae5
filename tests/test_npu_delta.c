/*
 * test_npu_delta.c -- the chunked AVX-512 gated delta rule
 * (npu_delta_rule_chunked_avx512, npu/npu_delta_fast.c) and npu_delta_rule,
 * which dispatches to it or to the recurrent kernel, against both
 * references, the chunked (npu_delta_rule_chunked_ref) and the
 * token-by-token oracle (npu_delta_rule_recurrent_ref): token counts
 * around the chunk size (tail chunks, a chunk of 1, T = 0), grouped value
 * heads, head sizes with vector tails, with and without a state in, the
 * state updated in place, and a prompt split over two calls.
 *
 * Inputs are shaped as the model makes them: q, k L2-normalised, g =
 * -exp(A_log) softplus(a + dt_bias) (per-head A_log spanning A in
 * (0.1, 16), so some heads forget within a few tokens and others barely
 * decay), beta = sigmoid(b).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "test_rng.h"

/* Agreement asked of the fast kernel (npu.h, "Fast kernels"). */
#define DELTA_TOL 1e-4
/* Of the fast profile's (npu_delta_rule_fast): operands rounded to bf16
 * (2^-9 relative each) in its two big products; measured 1.7e-3 to 4.2e-3
 * on the shapes below, out and state, flat from 8 to 3,000 tokens (Zen 5). */
#define DELTA_BF16_TOL 1e-2

static bool have_avx512(void) {
    const npu_features_t *f = npu_probe();
    return f->avx512f && f->avx512bw && f->avx512vl;
}

typedef struct delta_in {
    size_t T, Hk, Hv, dk, dv;
    float *q, *k, *v, *g, *beta, *s0;
} delta_in_t;

static double softplus(double x) {
    return x > 20.0 ? x : log1p(exp(x));
}

static delta_in_t delta_make(rng_t *r, size_t T, size_t Hk, size_t Hv, size_t dk, size_t dv) {
    delta_in_t in = {.T = T, .Hk = Hk, .Hv = Hv, .dk = dk, .dv = dv};
    in.q = rand_vec(r, T * Hk * dk, -1, 1);
    in.k = rand_vec(r, T * Hk * dk, -1, 1);
    npu_l2norm_ref(in.q, T * Hk, dk, 1e-6f, in.q);
    npu_l2norm_ref(in.k, T * Hk, dk, 1e-6f, in.k);
    in.v = rand_vec(r, T * Hv * dv, -1, 1);
    /* Per head: A_log in (log 0.1, log 16), dt_bias in (-1, 1). */
    float *a_log = rand_vec(r, Hv, logf(0.1f), logf(16.0f));
    float *dt_bias = rand_vec(r, Hv, -1, 1);
    in.g = rand_vec(r, T * Hv, -6, 1); /* a, then g */
    in.beta = rand_vec(r, T * Hv, -4, 4);
    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < Hv; h++) {
            size_t i = t * Hv + h;
            in.g[i] = (float)(-exp((double)a_log[h]) * softplus((double)in.g[i] + dt_bias[h]));
            in.beta[i] = (float)(1.0 / (1.0 + exp(-(double)in.beta[i])));
        }
    in.s0 = rand_vec(r, Hv * dk * dv, -0.5f, 0.5f);
    free(a_log), free(dt_bias);
    return in;
}

static void delta_free(delta_in_t *in) {
    free(in->q), free(in->k), free(in->v), free(in->g), free(in->beta), free(in->s0);
}

typedef svc_err_t (*delta_fn)(const float *, const float *, const float *, const float *,
                              const float *, size_t, size_t, size_t, size_t, size_t, const float *,
                              float *, float *);

/* fn on in (state s_in, NULL for none) into fresh NaN buffers. */
static void delta_run(delta_fn fn, const delta_in_t *in, const float *s_in, float **out,
                      float **s_out) {
    *out = nans(in->T * in->Hv * in->dv);
    *s_out = nans(in->Hv * in->dk * in->dv);
    cr_assert_eq(fn(in->q, in->k, in->v, in->g, in->beta, in->T, in->Hk, in->Hv, in->dk, in->dv,
                    s_in, *s_out, *out),
                 SVC_OK);
}

/* fn against both references, with the state in (s0) and without, to
 * relative error tol. */
static void check_delta_tol(delta_fn fn, const char *name, rng_t *r, size_t T, size_t Hk, size_t Hv,
                            size_t dk, size_t dv, double tol) {
    delta_in_t in = delta_make(r, T, Hk, Hv, dk, dv);
    size_t     no = T * Hv * dv, ns = Hv * dk * dv;
    for (int with_state = 0; with_state < 2; with_state++) {
        const float *s_in = with_state ? in.s0 : NULL;
        float       *a, *sa, *c, *sc, *e, *se;
        delta_run(fn, &in, s_in, &a, &sa);
        delta_run(npu_delta_rule_chunked_ref, &in, s_in, &c, &sc);
        delta_run(npu_delta_rule_recurrent_ref, &in, s_in, &e, &se);
        double eoc = rel_err(a, c, no), esc = rel_err(sa, sc, ns);
        double eoe = rel_err(a, e, no), ese = rel_err(sa, se, ns);
        cr_expect(eoc <= tol && esc <= tol,
                  "%s T=%zu H=%zu/%zu dk=%zu dv=%zu state=%d vs chunked ref: out %g state %g", name,
                  T, Hk, Hv, dk, dv, with_state, eoc, esc);
        cr_expect(eoe <= tol && ese <= tol,
                  "%s T=%zu H=%zu/%zu dk=%zu dv=%zu state=%d vs recurrent ref: out %g state %g",
                  name, T, Hk, Hv, dk, dv, with_state, eoe, ese);
        free(a), free(sa), free(c), free(sc), free(e), free(se);
    }
    /* No state out at all (the NULL path). */
    float *a = nans(no), *c, *sc;
    cr_assert_eq(fn(in.q, in.k, in.v, in.g, in.beta, T, Hk, Hv, dk, dv, in.s0, NULL, a), SVC_OK);
    delta_run(npu_delta_rule_chunked_ref, &in, in.s0, &c, &sc);
    cr_expect(rel_err(a, c, no) <= tol, "%s T=%zu dk=%zu dv=%zu no state out: %g", name, T, dk, dv,
              rel_err(a, c, no));
    free(a), free(c), free(sc);
    delta_free(&in);
}

static void check_delta(delta_fn fn, const char *name, rng_t *r, size_t T, size_t Hk, size_t Hv,
                        size_t dk, size_t dv) {
    check_delta_tol(fn, name, r, T, Hk, Hv, dk, dv, DELTA_TOL);
}

/* The shapes: T around the chunk (64) and below 8, the model's
 * head size (128), a mid one (64), the tiny model's (16), and a dv that is
 * not a multiple of 16. */
static const struct {
    size_t T, Hk, Hv, dk, dv;
} k_shapes[] = {
    {0, 2, 4, 16, 16},    {1, 2, 4, 16, 16},     {5, 2, 4, 16, 16},      {63, 2, 4, 16, 16},
    {64, 2, 4, 16, 16},   {65, 2, 4, 16, 16},    {200, 2, 4, 16, 16},    {1000, 2, 4, 16, 16},
    {0, 1, 2, 128, 128},  {5, 1, 2, 128, 128},   {63, 1, 2, 128, 128},   {64, 1, 2, 128, 128},
    {65, 1, 2, 128, 128}, {200, 1, 2, 128, 128}, {1000, 1, 2, 128, 128}, {63, 2, 4, 64, 64},
    {65, 2, 4, 64, 64},   {200, 2, 4, 64, 64},   {1000, 1, 2, 64, 64},   {5, 2, 4, 64, 24},
    {65, 2, 4, 64, 24},   {200, 2, 4, 16, 24},   {200, 1, 2, 128, 24},   {130, 1, 2, 24, 128},
    {100, 3, 6, 17, 33},
};

Test(npu_delta, chunked_avx512_shapes) {
    if (!have_avx512())
        cr_skip_test("no AVX-512");
    rng_t r = {0xde17a};
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        check_delta(npu_delta_rule_chunked_avx512, "chunked_avx512", &r, k_shapes[i].T,
                    k_shapes[i].Hk, k_shapes[i].Hv, k_shapes[i].dk, k_shapes[i].dv);
}

/* The sgemm form (npu_delta_rule_dnnl: what a CPU without AVX-512 runs)
 * on the same shapes, any CPU; and with the state updated in place
 * (state_out == state_in, which the contract allows). */
Test(npu_delta, chunked_dnnl_shapes) {
    rng_t r = {0xde17b};
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        check_delta(npu_delta_rule_dnnl, "chunked_dnnl", &r, k_shapes[i].T, k_shapes[i].Hk,
                    k_shapes[i].Hv, k_shapes[i].dk, k_shapes[i].dv);
    delta_in_t in = delta_make(&r, 150, 1, 2, 128, 128);
    size_t     ns = 2 * 128 * 128;
    float     *s = malloc(ns * sizeof *s), *a = nans(150 * 2 * 128), *c, *sc;
    cr_assert(s);
    memcpy(s, in.s0, ns * sizeof *s);
    cr_assert_eq(npu_delta_rule_dnnl(in.q, in.k, in.v, in.g, in.beta, 150, 1, 2, 128, 128, s, s, a),
                 SVC_OK);
    delta_run(npu_delta_rule_chunked_ref, &in, in.s0, &c, &sc);
    cr_expect(rel_err(a, c, 150 * 2 * 128) <= DELTA_TOL && rel_err(s, sc, ns) <= DELTA_TOL,
              "in place: out %g state %g", rel_err(a, c, 150 * 2 * 128), rel_err(s, sc, ns));
    free(s), free(a), free(c), free(sc);
    delta_free(&in);
}

/* The same shapes with the fp32 FMA products forced (D3_NPU_DELTA=f32,
 * read at each call; this test has its own process): on a CPU with AMX
 * the test above ran the bf16 tile products for dk, dv multiples of 32. */
Test(npu_delta, chunked_avx512_f32_products) {
    if (!have_avx512())
        cr_skip_test("no AVX-512");
    cr_assert_eq(setenv("D3_NPU_DELTA", "f32", 1), 0);
    rng_t r = {0xf32};
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (k_shapes[i].dk % 32 == 0 && k_shapes[i].dv % 32 == 0 && k_shapes[i].T <= 200)
            check_delta(npu_delta_rule_chunked_avx512, "chunked_avx512 f32", &r, k_shapes[i].T,
                        k_shapes[i].Hk, k_shapes[i].Hv, k_shapes[i].dk, k_shapes[i].dv);
}

/* The dispatched entry point (here npu_delta_rule_pick_avx512: the
 * recurrent kernel for T < 8 or small heads, else the chunked one) on both
 * sides of each cut-over. */
Test(npu_delta, dispatched_shapes) {
    rng_t r = {77};
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 1, 2, 4, 128, 128);
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 7, 2, 4, 128, 128);
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 8, 2, 4, 128, 128);
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 300, 2, 4, 128, 128);
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 300, 2, 4, 64, 64);
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 300, 2, 4, 32, 64);
    check_delta(npu_delta_rule, "npu_delta_rule", &r, 300, 2, 4, 16, 16);
}

/* A long prompt: the state's rounding must not grow over many chunks. */
Test(npu_delta, chunked_avx512_long) {
    if (!have_avx512())
        cr_skip_test("no AVX-512");
    rng_t      r = {4096};
    delta_in_t in = delta_make(&r, 3000, 1, 2, 128, 128);
    float     *a, *sa, *e, *se;
    delta_run(npu_delta_rule_chunked_avx512, &in, in.s0, &a, &sa);
    delta_run(npu_delta_rule_recurrent_ref, &in, in.s0, &e, &se);
    double eo = rel_err(a, e, in.T * in.Hv * in.dv), es = rel_err(sa, se, in.Hv * in.dk * in.dv);
    cr_expect(eo <= DELTA_TOL && es <= DELTA_TOL, "T=3000: out %g state %g", eo, es);
    free(a), free(sa), free(e), free(se);
    delta_free(&in);
}

/* state_out == state_in: each head's state is read before it is written. */
Test(npu_delta, state_in_place) {
    if (!have_avx512())
        cr_skip_test("no AVX-512");
    rng_t  r = {31};
    size_t Ts[] = {5, 64, 150};
    for (size_t c = 0; c < 3; c++) {
        delta_in_t in = delta_make(&r, Ts[c], 2, 4, 128, 24);
        size_t     ns = in.Hv * in.dk * in.dv, no = in.T * in.Hv * in.dv;
        float     *s = malloc(ns * sizeof *s), *a = nans(no), *b, *sb;
        cr_assert(s);
        memcpy(s, in.s0, ns * sizeof *s);
        cr_assert_eq(npu_delta_rule_chunked_avx512(in.q, in.k, in.v, in.g, in.beta, in.T, in.Hk,
                                                   in.Hv, in.dk, in.dv, s, s, a),
                     SVC_OK);
        delta_run(npu_delta_rule_chunked_ref, &in, in.s0, &b, &sb);
        cr_expect(rel_err(a, b, no) <= DELTA_TOL, "in place T=%zu out: %g", in.T,
                  rel_err(a, b, no));
        cr_expect(rel_err(s, sb, ns) <= DELTA_TOL, "in place T=%zu state: %g", in.T,
                  rel_err(s, sb, ns));
        free(s), free(a), free(b), free(sb);
        delta_free(&in);
    }
}

/* T tokens in one call = T1 tokens, then T - T1 with the state carried
 * (in place), for cuts on and off the chunk grid and empty halves; both
 * against the one-call reference. */
Test(npu_delta, continuation) {
    if (!have_avx512())
        cr_skip_test("no AVX-512");
    rng_t      r = {8};
    delta_in_t in = delta_make(&r, 200, 2, 4, 64, 64);
    size_t     T = in.T, Hk = in.Hk, Hv = in.Hv, dk = in.dk, dv = in.dv;
    size_t     ns = Hv * dk * dv, no = T * Hv * dv;
    float     *ref, *sref;
    delta_run(npu_delta_rule_chunked_ref, &in, in.s0, &ref, &sref);
    size_t cuts[] = {0, 1, 5, 64, 77, 128, 190, 200};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        size_t T1 = cuts[c];
        float *split = nans(no), *s = malloc(ns * sizeof *s);
        cr_assert(s);
        memcpy(s, in.s0, ns * sizeof *s);
        cr_assert_eq(npu_delta_rule_chunked_avx512(in.q, in.k, in.v, in.g, in.beta, T1, Hk, Hv, dk,
                                                   dv, s, s, split),
                     SVC_OK);
        size_t oqk = T1 * Hk * dk, ov = T1 * Hv * dv, og = T1 * Hv;
        cr_assert_eq(npu_delta_rule_chunked_avx512(in.q + oqk, in.k + oqk, in.v + ov, in.g + og,
                                                   in.beta + og, T - T1, Hk, Hv, dk, dv, s, s,
                                                   split + ov),
                     SVC_OK);
        cr_expect(rel_err(split, ref, no) <= DELTA_TOL, "cut at %zu: out %g", T1,
                  rel_err(split, ref, no));
        cr_expect(rel_err(s, sref, ns) <= DELTA_TOL, "cut at %zu: state %g", T1,
                  rel_err(s, sref, ns));
        free(split), free(s);
    }
    free(ref), free(sref);
    delta_free(&in);
}

/* T = 0 writes nothing to out and passes the state through (or zeros). */
Test(npu_delta, zero_tokens_state) {
    if (!have_avx512())
        cr_skip_test("no AVX-512");
    rng_t      r = {3};
    delta_in_t in = delta_make(&r, 0, 1, 2, 16, 24);
    size_t     ns = in.Hv * in.dk * in.dv;
    float     *s = nans(ns), sentinel = 42.0f;
    cr_assert_eq(npu_delta_rule_chunked_avx512(in.q, in.k, in.v, in.g, in.beta, 0, 1, 2, 16, 24,
                                               in.s0, s, &sentinel),
                 SVC_OK);
    cr_expect(memcmp(s, in.s0, ns * sizeof *s) == 0);
    cr_assert_eq(npu_delta_rule_chunked_avx512(in.q, in.k, in.v, in.g, in.beta, 0, 1, 2, 16, 24,
                                               NULL, s, &sentinel),
                 SVC_OK);
    for (size_t i = 0; i < ns; i++)
        cr_expect(s[i] == 0.0f);
    cr_expect(sentinel == 42.0f);
    free(s);
    delta_free(&in);
}

/* The fast profile's bf16 products (npu_delta_rule_bf16_avx512) against
 * both references on the shapes it takes, T = 3000 among them (the
 * state's rounding must not grow over many chunks); and
 * npu_delta_rule_fast is npu_delta_rule, bit for bit, where it does not
 * take them (T < 8, dv not a multiple of 16, small heads). */
Test(npu_delta, bf16_products) {
    if (!have_avx512() || !npu_delta_bf16_usable(64, 64, 64))
        cr_skip_test("no AVX512-BF16");
    rng_t r = {0xbf16};
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (npu_delta_bf16_usable(k_shapes[i].T, k_shapes[i].dk, k_shapes[i].dv))
            check_delta_tol(npu_delta_rule_bf16_avx512, "bf16", &r, k_shapes[i].T, k_shapes[i].Hk,
                            k_shapes[i].Hv, k_shapes[i].dk, k_shapes[i].dv, DELTA_BF16_TOL);
    check_delta_tol(npu_delta_rule_bf16_avx512, "bf16", &r, 3000, 1, 2, 128, 128, DELTA_BF16_TOL);
    check_delta_tol(npu_delta_rule_bf16_avx512, "bf16", &r, 8, 2, 4, 128, 128, DELTA_BF16_TOL);
    static const size_t other[][5] = {
        {7, 2, 4, 128, 128}, {200, 2, 4, 64, 24}, {200, 2, 4, 16, 16}};
    for (size_t i = 0; i < 3; i++) {
        const size_t *sh = other[i];
        cr_assert(!npu_delta_bf16_usable(sh[0], sh[3], sh[4]));
        delta_in_t in = delta_make(&r, sh[0], sh[1], sh[2], sh[3], sh[4]);
        float     *a, *sa, *b, *sb;
        delta_run(npu_delta_rule_fast, &in, in.s0, &a, &sa);
        delta_run(npu_delta_rule, &in, in.s0, &b, &sb);
        cr_expect(memcmp(a, b, in.T * in.Hv * in.dv * sizeof *a) == 0 &&
                      memcmp(sa, sb, in.Hv * in.dk * in.dv * sizeof *sa) == 0,
                  "T=%zu dk=%zu dv=%zu: npu_delta_rule_fast is not npu_delta_rule", sh[0], sh[3],
                  sh[4]);
        free(a), free(sa), free(b), free(sb);
        delta_free(&in);
    }
}
