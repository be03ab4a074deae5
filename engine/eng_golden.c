/*
 * eng_golden.c -- the golden check before serving (SPEC f.1 readiness,
 * issue 35): the golden request answered by the kernels that will serve,
 * against the same prompts through a reference pass that shares neither
 * their packs nor their kernels.
 *
 * The reference: the package's weight file opened again, each layer read
 * from it as fp32 values on oneDNN's sgemm (eng_ref_layer,
 * npu_wpack_new_fp32), one layer held at a time (~0.25 GB for nano), so a
 * pack damaged in memory after the manifest check, a kernel path that
 * computes wrongly on this CPU or a packing bug shows as a difference. What
 * it shares with serving: the weight decoder (a file misread the same way
 * by both is what the recorded answers and inspect's evidence are for),
 * the embedding table, the norms, attention, the delta rule and the
 * readout (fp32 code, tested against transformers by test_tower).
 *
 * What is compared, on the first ENG_GOLDEN_REF_TOKENS tokens of the first
 * golden prompt (a layer's error does not depend on how many tokens it
 * sees, and the reference's fp32 products cost ~3 GFLOP a token on nano):
 * - each layer, teacher-forced from the reference's input, through the
 *   serving exact layer (within ENG_GOLDEN_LAYER_EXACT relative RMS:
 *   eng_fwd_layer_errors' measure) and, where fast runs its own kernels,
 *   the serving fast layer (ENG_GOLDEN_LAYER_FAST);
 * - end to end, the serving exact pass's probabilities against the
 *   reference's (ENG_GOLDEN_TOL_EXACT). Fast's are reported, not bounded:
 *   on random weights (every synthetic package) 24 layers amplify fast's
 *   ~2% per layer into anything (docs/profiles.md), while a layer's own
 *   error does not depend on the weights being trained;
 * - the vision tower, where there is one: each block teacher-forced over a
 *   synthetic 256 x 256 image against the same block read again
 *   (eng_vision_reference; the patch embedding and the merger, 2-3% of its
 *   weights, run on the serving packs only), with the text tower's bounds;
 * - where the package carries golden.json (make-package records it), the
 *   whole golden request answered as clients are (eng_answer_request,
 *   exact) against the recorded answers (ENG_GOLDEN_TOL_RECORDED): this
 *   covers what the reference shares with serving, the decoder included.
 */
#include "eng_fwd_int.h"
#include "eng_image_int.h"
#include "eng_vision_int.h"
#include "eng_model_int.h"
#include "eng_answer_int.h"
#include "eng_util_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SPEC f.1's GOLDEN_STATE and question set; the instructions are ours
 * (the SPEC names only the ids, types and options). */
#define GOLDEN_STATE                                                                               \
    "Write a Python function that merges two sorted lists and explain its running time."
#define GOLDEN_BODY                                                                                \
    "{\"state\": \"" GOLDEN_STATE "\", \"questions\": {"                                           \
    "\"domain\": {\"type\": \"choice\", \"instructions\": \"Which domain does this task belong "   \
    "to?\", \"choices\": [{\"key\": \"code\"}, {\"key\": \"math\"}, {\"key\": \"other\"}]}, "      \
    "\"reasoning\": {\"type\": \"noul\", \"instructions\": \"Does answering it need step-by-step " \
    "reasoning?\"}, "                                                                              \
    "\"difficulty\": {\"type\": \"score\", \"instructions\": \"How difficult is this task?\", "    \
    "\"criteria\": [\"Trivial\", \"Moderate\", \"Hard\"]}}}"

#define G_NQ 3 /* questions of the golden request */

typedef struct golden_run {
    const eng_package_t *pkg;
    const eng_model_t   *m;
    sch_request_t       *req;                         /* the golden request (profile exact) */
    double               served[G_NQ][ENG_N_CODES];   /* the golden answers, exact */
    double               recorded[G_NQ][ENG_N_CODES]; /* golden.json's, when present */
    double               pass[ENG_PROFILE_COUNT][ENG_N_CODES]; /* the prefix, served kernels */
    double               ref[ENG_N_CODES];                     /* the prefix, reference */
    size_t               n_options[G_NQ];
    eng_ref_src_t       *src;
    double              *num[ENG_PROFILE_COUNT], *den[ENG_PROFILE_COUNT];
    double              *vnum[ENG_PROFILE_COUNT], *vden[ENG_PROFILE_COUNT]; /* (depth) */
} golden_run_t;

/* The golden image: a synthetic 256 x 256 PNG (eng_image_synth_png: the
 * smallest size the resize keeps, 256 patches), seed fixed. */
#define G_IMAGE_SIDE 256
#define G_IMAGE_SEED 35

static svc_err_t golden_decode(golden_run_t *g, char *errstr, size_t errstr_size) {
    sch_limits_t limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_error_t  e;
    sch_error_init(&e);
    svc_err_t err =
        sch_request_decode(GOLDEN_BODY, strlen(GOLDEN_BODY), &limits, NULL, &g->req, &e);
    if (err)
        svc_errf(errstr, errstr_size, "golden request: %s", e.message ? e.message : e.code);
    sch_error_fini(&e);
    return err;
}

/* The option count of each golden question. */
static svc_err_t golden_options(golden_run_t *g) {
    const sch_part_t *part = sch_request_part(g->req, 0);
    if (sch_request_n_parts(g->req) != 1 || part->n_questions != G_NQ)
        return SVC_ERR_INTERNAL;
    for (size_t q = 0; q < G_NQ; q++)
        g->n_options[q] = part->questions[q].n_options;
    return SVC_OK;
}

/* The golden answers: the request path every client takes (exact). */
static svc_err_t golden_serve(golden_run_t *g, char *errstr, size_t errstr_size) {
    eng_answers_t *ans = NULL;
    sch_error_t    rej;
    sch_error_init(&rej);
    svc_err_t err = eng_answer_request(g->pkg, g->m, g->req, &ans, &rej, errstr, errstr_size);
    sch_error_fini(&rej);
    const sch_part_t *part = err ? NULL : sch_request_part(g->req, 0);
    for (size_t q = 0; !err && q < G_NQ; q++) {
        const sch_result_t *r = &eng_answers_results(ans)[0][q];
        g->n_options[q] = part->questions[q].n_options;
        if (!r->probs) {
            svc_errf(errstr, errstr_size, "golden request: question %zu not answered: %s", q,
                     r->error_message ? r->error_message : r->error_code);
            err = SVC_ERR_INTERNAL;
        } else
            memcpy(g->served[q], r->probs, g->n_options[q] * sizeof(double));
    }
    eng_answers_free(ans);
    return err;
}

static const char *const G_IDS[G_NQ] = {"domain", "reasoning", "difficulty"};

static svc_err_t golden_file_fail(const char *path, char *errstr, size_t errstr_size,
                                  const char *why) {
    svc_errf(errstr, errstr_size, "%s \"%s\": %s", ENG_GOLDEN_FILE, path, why);
    return SVC_ERR_FORMAT;
}

/* golden.json's answers into g->recorded; *present false without the file. */
static svc_err_t golden_recorded(const char *dir, golden_run_t *g, bool *present, char *errstr,
                                 size_t errstr_size) {
    char *path = eng_path_join(dir, ENG_GOLDEN_FILE);
    *present = path && eng_dir_has_file(dir, ENG_GOLDEN_FILE);
    if (!path || !*present) {
        free(path);
        return path ? SVC_OK : SVC_ERR_NOMEM;
    }
    json_error_t  je;
    json_t       *root = json_load_file(path, 0, &je);
    const json_t *ans = json_object_get(root, "answers");
    const char   *req = json_string_value(json_object_get(root, "request"));
    svc_err_t     err = SVC_OK;
    if (!root)
        err = golden_file_fail(path, errstr, errstr_size, je.text);
    else if (!req || strcmp(req, GOLDEN_BODY) != 0 || !json_is_object(ans))
        err = golden_file_fail(path, errstr, errstr_size,
                               "not this version's golden request and answers");
    for (size_t q = 0; !err && q < G_NQ; q++) {
        const json_t *a = json_object_get(ans, G_IDS[q]);
        if (json_array_size(a) != g->n_options[q])
            err = golden_file_fail(path, errstr, errstr_size, "an answer has another option count");
        for (size_t o = 0; !err && o < g->n_options[q]; o++) {
            const json_t *v = json_array_get(a, o);
            if (!json_is_number(v))
                err = golden_file_fail(path, errstr, errstr_size, "a probability is not a number");
            else
                g->recorded[q][o] = json_number_value(v);
        }
    }
    json_decref(root);
    free(path);
    return err;
}

svc_err_t eng_golden_record(const eng_package_t *pkg, const eng_model_t *m, const char *dir,
                            char *errstr, size_t errstr_size) {
    golden_run_t g = {.pkg = pkg, .m = m};
    svc_err_t    err = golden_decode(&g, errstr, errstr_size);
    if (!err)
        err = golden_serve(&g, errstr, errstr_size);
    json_t *ans = err ? NULL : json_object();
    for (size_t q = 0; ans && q < G_NQ; q++) {
        json_t *a = json_array();
        for (size_t o = 0; o < g.n_options[q]; o++)
            json_array_append_new(a, json_real(g.served[q][o]));
        json_object_set_new(ans, G_IDS[q], a);
    }
    char    kernels[200];
    json_t *root = NULL;
    if (ans) {
        snprintf(kernels, sizeof kernels, "kernels %s, matmul %s, group codes %s",
                 npu_kernels_name(), npu_matmul_name(), npu_matmul_groups_name());
        root = json_pack("{s:s, s:s, s:s, s:o, s:s}", "format", "d3stream-golden/1", "request",
                         GOLDEN_BODY, "profile", "exact", "answers", ans, "recorded_with", kernels);
    }
    char *path = root ? eng_path_join(dir, ENG_GOLDEN_FILE) : NULL;
    if (!err && (!root || !path))
        err = SVC_ERR_NOMEM;
    if (!err && json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(17)) != 0) {
        svc_errf(errstr, errstr_size, "cannot write \"%s\"", path);
        err = SVC_ERR_IO;
    }
    json_decref(root);
    free(path);
    sch_request_free(g.req);
    return err;
}

static svc_err_t ref_fetch(void *user, size_t li, eng_layer_t *l, char *errstr,
                           size_t errstr_size) {
    golden_run_t *g = user;
    return eng_ref_layer(g->src, g->m, li, l, errstr, errstr_size);
}

static void ref_drop(void *user, eng_layer_t *l) {
    (void)user;
    eng_ref_layer_free(l);
}

/* The serving model of profile p over ids: its final hidden state's
 * probabilities for q's options, as a served answer would have them. */
static svc_err_t golden_pass(const golden_run_t *g, size_t p, const int32_t *ids, size_t T,
                             size_t n_options, double *probs, char *errstr, size_t errstr_size) {
    size_t    H = eng_model_hidden_size(g->m);
    float    *fin = malloc(H * sizeof *fin);
    svc_err_t err =
        fin ? eng_model_forward(eng_model_profile(g->m, (eng_profile_t)p), ids, T,
                                eng_package_noncausal(g->pkg), fin, NULL, NULL, errstr, errstr_size)
            : SVC_ERR_NOMEM;
    if (!err)
        err = eng_readout_probs(g->m, fin, n_options, eng_package_temperature(g->pkg), probs);
    free(fin);
    return err;
}

/* The reference pass over the first ENG_GOLDEN_REF_TOKENS tokens of the
 * first golden prompt, the serving layers compared on its way (alt:
 * exact, and fast where it has kernels); then the serving passes over the
 * same tokens, end to end. Why a prefix: the reference's fp32 products
 * cost ~3 GFLOP a token on nano, and a layer's error does not depend on
 * how many tokens it sees. */
static svc_err_t golden_reference(golden_run_t *g, bool fast, char *errstr, size_t errstr_size) {
    const sch_part_t *part = sch_request_part(g->req, 0);
    eng_prompt_t      pr;
    size_t            H = eng_model_hidden_size(g->m), nopt = g->n_options[0];
    float            *fin = calloc(H, sizeof *fin);
    svc_err_t         err = fin ? SVC_OK : SVC_ERR_NOMEM;
    eng_prompt_init(&pr);
    if (!err)
        err = eng_prompt_render(g->pkg, part, &part->questions[0], &pr, errstr, errstr_size);
    size_t        T = pr.ids.n < ENG_GOLDEN_REF_TOKENS ? pr.ids.n : ENG_GOLDEN_REF_TOKENS;
    eng_fwd_seq_t seq = {.ids = pr.ids.v, .T = T, .final_last = fin};
    eng_fwd_ref_t r = {.fetch = ref_fetch,
                       .drop = ref_drop,
                       .user = g,
                       .alt = {g->m, eng_model_profile(g->m, ENG_PROFILE_FAST)},
                       .num = {g->num[0], g->num[1]},
                       .den = {g->den[0], g->den[1]},
                       .n_alt = fast ? 2 : 1};
    if (!err)
        err = eng_fwd_reference(g->m, &r, &seq, 1, NULL, eng_package_noncausal(g->pkg), errstr,
                                errstr_size);
    if (!err)
        err = eng_readout_probs(g->m, fin, nopt, eng_package_temperature(g->pkg), g->ref);
    for (size_t p = 0; !err && p < ENG_PROFILE_COUNT; p++)
        if (p == ENG_PROFILE_EXACT || fast)
            err = golden_pass(g, p, pr.ids.v, T, nopt, g->pass[p], errstr, errstr_size);
    eng_prompt_fini(&pr);
    free(fin);
    return err;
}

static svc_err_t vis_fetch(void *user, size_t i, eng_vis_block_t *b, char *errstr,
                           size_t errstr_size) {
    golden_run_t *g = user;
    return eng_ref_vision_block(g->src, g->m, i, b, errstr, errstr_size);
}

static void vis_drop(void *user, eng_vis_block_t *b) {
    (void)user;
    eng_vision_block_free(b);
}

/* The vision tower over the golden image, block by block against the
 * reference blocks (the patch embedding is the serving one). */
static svc_err_t golden_vision(golden_run_t *g, bool fast, char *errstr, size_t errstr_size) {
    size_t            depth = g->m->vision->cfg.depth, len = 0, gh = 0, gw = 0;
    unsigned char    *png = NULL;
    eng_image_prep_t *prep = NULL;
    float            *rows = NULL;
    svc_err_t err = eng_image_synth_png(G_IMAGE_SIDE, G_IMAGE_SIDE, G_IMAGE_SEED, &png, &len);
    for (size_t p = 0; !err && p < ENG_PROFILE_COUNT; p++) {
        g->vnum[p] = calloc(depth ? depth : 1, sizeof *g->vnum[p]);
        g->vden[p] = calloc(depth ? depth : 1, sizeof *g->vden[p]);
        if (!g->vnum[p] || !g->vden[p])
            err = SVC_ERR_NOMEM;
    }
    sch_image_t img = {png, len, "png", G_IMAGE_SIDE, G_IMAGE_SIDE};
    if (!err)
        err = eng_image_prepare(g->m, &img, &prep, errstr, errstr_size);
    if (!err)
        err = eng_image_prep_rows(g->m, prep, &rows, &gh, &gw);
    eng_vis_ref_t r = {.fetch = vis_fetch,
                       .drop = vis_drop,
                       .user = g,
                       .fast = fast,
                       .num = {g->vnum[0], g->vnum[1]},
                       .den = {g->vden[0], g->vden[1]}};
    if (!err)
        err = eng_vision_reference(g->m->vision, &r, rows, gh, gw, errstr, errstr_size);
    free(rows);
    eng_image_prep_free(prep);
    free(png);
    return err;
}

static double golden_max_dp(const golden_run_t *g, size_t p) {
    double worst = 0.0;
    for (size_t o = 0; o < g->n_options[0]; o++) {
        double d = fabs(g->pass[p][o] - g->ref[o]);
        worst = d > worst || isnan(d) ? d : worst;
    }
    return worst;
}

static double golden_recorded_dp(const golden_run_t *g) {
    double worst = 0.0;
    for (size_t q = 0; q < G_NQ; q++)
        for (size_t o = 0; o < g->n_options[q]; o++) {
            double d = fabs(g->served[q][o] - g->recorded[q][o]);
            worst = d > worst || isnan(d) ? d : worst;
        }
    return worst;
}

/* The worst of n layers (or blocks): its relative RMS error and where. */
static double golden_worst(const double *num, const double *den, size_t n, size_t *at) {
    double worst = 0.0;
    *at = 0;
    for (size_t li = 0; li < n; li++) {
        double e = den[li] > 0 ? sqrt(num[li] / den[li]) : 0.0;
        if (e > worst || isnan(e)) {
            worst = e;
            *at = li;
            if (isnan(e))
                break;
        }
    }
    return worst;
}

static void golden_verdict(const golden_run_t *g, bool fast, eng_golden_t *out) {
    out->max_dp_recorded = out->recorded ? golden_recorded_dp(g) : NAN;
    out->max_dp = golden_max_dp(g, ENG_PROFILE_EXACT);
    size_t L = g->m->cfg.n_layers, D = out->vision ? g->m->vision->cfg.depth : 0;
    out->layer_err = golden_worst(g->num[0], g->den[0], L, &out->layer_at);
    out->vis_err = out->vision ? golden_worst(g->vnum[0], g->vden[0], D, &out->vis_at) : NAN;
    out->vis_err_fast =
        out->vision && fast ? golden_worst(g->vnum[1], g->vden[1], D, &out->vis_at_fast) : NAN;
    out->max_dp_fast = fast ? golden_max_dp(g, ENG_PROFILE_FAST) : NAN;
    out->layer_err_fast = fast ? golden_worst(g->num[1], g->den[1], L, &out->layer_at_fast) : NAN;
    out->passed = true;
    if (!(out->layer_err <= ENG_GOLDEN_LAYER_EXACT))
        snprintf(out->reason, sizeof out->reason,
                 "profile exact: layer %zu differs from the fp32 reference by %.3g relative RMS "
                 "(bound %.0e) on %s",
                 out->layer_at, out->layer_err, ENG_GOLDEN_LAYER_EXACT, out->kernels);
    else if (!(out->max_dp <= ENG_GOLDEN_TOL_EXACT))
        snprintf(out->reason, sizeof out->reason,
                 "profile exact: a golden probability differs from the fp32 reference by %.3g "
                 "(bound %.0e) on %s",
                 out->max_dp, ENG_GOLDEN_TOL_EXACT, out->kernels);
    else if (out->recorded && !(out->max_dp_recorded <= ENG_GOLDEN_TOL_RECORDED))
        snprintf(out->reason, sizeof out->reason,
                 "profile exact: a golden answer differs from the package's recorded one (%s) "
                 "by %.3g (bound %.0e) on %s",
                 ENG_GOLDEN_FILE, out->max_dp_recorded, ENG_GOLDEN_TOL_RECORDED, out->kernels);
    else if (out->vision && !(out->vis_err <= ENG_GOLDEN_LAYER_EXACT))
        snprintf(out->reason, sizeof out->reason,
                 "profile exact: vision block %zu differs from the fp32 reference by %.3g "
                 "relative RMS (bound %.0e) on %s",
                 out->vis_at, out->vis_err, ENG_GOLDEN_LAYER_EXACT, out->kernels);
    else if (out->vision && fast && !(out->vis_err_fast <= ENG_GOLDEN_LAYER_FAST))
        snprintf(out->reason, sizeof out->reason,
                 "profile fast: vision block %zu differs from the fp32 reference by %.3g "
                 "relative RMS (bound %.0e) on %s",
                 out->vis_at_fast, out->vis_err_fast, ENG_GOLDEN_LAYER_FAST, out->kernels);
    else if (fast && !(out->layer_err_fast <= ENG_GOLDEN_LAYER_FAST))
        snprintf(out->reason, sizeof out->reason,
                 "profile fast: layer %zu differs from the fp32 reference by %.3g relative RMS "
                 "(bound %.0e) on %s",
                 out->layer_at_fast, out->layer_err_fast, ENG_GOLDEN_LAYER_FAST, out->kernels);
    else
        return;
    out->passed = false;
}

static void golden_kernels(eng_golden_t *out, bool fast) {
    snprintf(out->kernels, sizeof out->kernels, "kernels %s, matmul %s, group codes %s%s%s",
             npu_kernels_name(), npu_matmul_name(), npu_matmul_groups_name(), fast ? ", fast " : "",
             fast ? npu_matmul_fast_name() : "");
}

static void golden_free(golden_run_t *g) {
    sch_request_free(g->req);
    for (size_t p = 0; p < ENG_PROFILE_COUNT; p++) {
        free(g->num[p]);
        free(g->den[p]);
        free(g->vnum[p]);
        free(g->vden[p]);
    }
    eng_ref_close(g->src);
}

svc_err_t eng_golden_check(const eng_package_t *pkg, const eng_model_t *m, const char *dir,
                           const eng_load_opts_t *opts, eng_golden_t *out, char *errstr,
                           size_t errstr_size) {
    memset(out, 0, sizeof *out);
    double       t0 = eng_now_ms();
    bool         fast = npu_fast_usable();
    size_t       L = m->cfg.n_layers;
    golden_run_t g = {.pkg = pkg, .m = m};
    svc_err_t    err = SVC_OK;
    golden_kernels(out, fast);
    for (size_t p = 0; !err && p < ENG_PROFILE_COUNT; p++) {
        g.num[p] = calloc(L ? L : 1, sizeof *g.num[p]);
        g.den[p] = calloc(L ? L : 1, sizeof *g.den[p]);
        err = g.num[p] && g.den[p] ? SVC_OK : SVC_ERR_NOMEM;
    }
    if (!err)
        err = golden_decode(&g, errstr, errstr_size);
    double t1 = eng_now_ms();
    if (!err)
        err = golden_options(&g);
    if (!err)
        err = golden_recorded(dir, &g, &out->recorded, errstr, errstr_size);
    if (!err && out->recorded)
        err = golden_serve(&g, errstr, errstr_size);
    out->seconds_answer = (eng_now_ms() - t1) / 1000.0;
    t1 = eng_now_ms();
    if (!err)
        err = eng_ref_open(dir, opts, &g.src, errstr, errstr_size);
    if (!err)
        err = golden_reference(&g, fast, errstr, errstr_size);
    out->vision = eng_model_has_vision(m);
    if (!err && out->vision)
        err = golden_vision(&g, fast, errstr, errstr_size);
    out->seconds_ref = (eng_now_ms() - t1) / 1000.0;
    if (!err)
        golden_verdict(&g, fast, out);
    if (err == SVC_ERR_NOMEM && errstr_size && !errstr[0])
        svc_errf(errstr, errstr_size, "out of memory for the golden check");
    golden_free(&g);
    out->seconds = (eng_now_ms() - t0) / 1000.0;
    return err;
}

void eng_model_test_corrupt(eng_model_t *m, bool vision) {
    if (vision && m->vision)
        npu_wpack_test_corrupt(m->vision->blocks[m->vision->cfg.depth / 2].fc2);
    else if (!vision)
        npu_wpack_test_corrupt(m->layers[m->cfg.n_layers / 2].mlp_down);
}
