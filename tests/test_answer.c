/*
 * test_answer.c -- requests answered end to end in-process
 * (eng_answer_request through ops_ask_body, the function `d3stream ask`
 * calls) on the tiny upstream package: the response shape of SPEC b, the
 * length limit of c.7, options.deadline_ms (a.8, b.6), usage of b.5, media
 * refusal, and one question's
 * probabilities against the transformers golden of the same prompt.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng_answer_int.h"
#include "engine.h"
#include "ops.h"
#include "test_util.h"

#define PKG     D3_SOURCE_DIR "/tests/fixtures/tiny-upstream"
#define GOLDEN  D3_SOURCE_DIR "/tests/golden/tower/prompt_d3nano_example.noncausal.d3gt"
#define EXAMPLE D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json"

/* The golden's probabilities come from transformers fp32 (SPEC d). */
#define GOLDEN_TOL 1e-5

static const char EXAMPLE_BODY[] =
    "{\"state\": \"The order arrived damaged.\", \"questions\": {\"route\": {\"type\": \"choice\","
    "\"criteria\": {\"returns\": \"Refunds and replacements\", \"billing\": \"Payments\", "
    "\"general\": null}}}}";

/* ------------------------------------------------------------ fixtures */

/* Runs body through ops_ask_body; returns the exit status and the parsed
 * output (the caller decrefs). */
static int ask(const loaded_t *l, const char *body, json_t **out) {
    ops_ask_t a = {l->pkg, l->model, l->dir, "0123"};
    svc_buf_t buf;
    char      errstr[1024] = "";
    svc_buf_init(&buf, (size_t)1 << 30);
    int rc = ops_ask_body(&a, body, strlen(body), &buf, NULL, errstr, sizeof errstr);
    cr_assert_neq(rc, OPS_EXIT_FAILURE, "ask failed: %s", errstr);
    json_error_t jerr;
    *out = json_loadb(buf.data, buf.len, 0, &jerr);
    cr_assert(*out, "not JSON (%s): %.400s", jerr.text, buf.data);
    svc_buf_fini(&buf);
    return rc;
}

static const json_t *path2(const json_t *j, const char *a, const char *b) {
    return json_object_get(json_object_get(j, a), b);
}

/* A choice/score answer: finite probabilities summing to 1 (1e-12), the
 * choice is the first maximum, confidence in [0, 1]. Returns the sum. */
static void check_distribution(const json_t *ans, const char *const *keys, size_t n) {
    const json_t *probs = json_object_get(ans, "probabilities");
    cr_assert_eq(json_object_size(probs), n, "%zu probabilities", json_object_size(probs));
    double sum = 0, best = -1;
    size_t arg = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_object_get(probs, keys[i]);
        cr_assert(json_is_number(p), "no probability for %s", keys[i]);
        double v = json_number_value(p);
        cr_assert(isfinite(v) && v >= 0 && v <= 1, "%s: %g", keys[i], v);
        sum += v;
        if (v > best) {
            best = v;
            arg = i;
        }
    }
    cr_assert(fabs(sum - 1.0) <= 1e-12, "probabilities sum to %.17g", sum);
    const json_t *choice = json_object_get(ans, "choice");
    if (choice)
        cr_assert_str_eq(json_string_value(choice), keys[arg]);
    double conf = json_number_value(json_object_get(ans, "confidence"));
    cr_assert(conf >= 0 && conf <= 1, "confidence %g", conf);
}

/* Prompt length of question 0 of body on the package (c.7). */
static size_t prompt_tokens(const loaded_t *l, const char *body, size_t q) {
    sch_request_t *req = decode_valid(body, strlen(body));
    eng_prompt_t   pr;
    char           errstr[256];
    eng_prompt_init(&pr);
    const sch_part_t *part = sch_request_part(req, 0);
    cr_assert_eq(eng_prompt_render(l->pkg, part, &part->questions[q], &pr, errstr, sizeof errstr),
                 SVC_OK);
    size_t n = pr.n_tokens;
    eng_prompt_fini(&pr);
    sch_request_free(req);
    return n;
}

/* ------------------------------------------------------------ tests */

Test(answer, d3nano_example) {
    loaded_t l;
    load(PKG, &l);
    json_t   *r;
    svc_buf_t body;
    char      errstr[256];
    svc_buf_init(&body, 1 << 20);
    cr_assert_eq(svc_buf_read_file(&body, EXAMPLE, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(ask(&l, body.data, &r), OPS_EXIT_OK);
    cr_assert_str_eq(json_string_value(json_object_get(r, "model")), "tiny-upstream");
    const json_t      *route = path2(r, "answers", "route");
    static const char *keys[] = {"returns", "billing", "general"};
    cr_assert_str_eq(json_string_value(json_object_get(route, "type")), "choice");
    check_distribution(route, keys, 3);
    cr_assert_eq(json_integer_value(path2(r, "usage", "input_tokens")),
                 (json_int_t)prompt_tokens(&l, EXAMPLE_BODY, 0));
    cr_assert_eq(json_integer_value(path2(r, "usage", "output_tokens")), 0);
    cr_assert_null(json_object_get(r, "meta"), "meta only when asked for");
    json_decref(r);
    svc_buf_fini(&body);
    unload(&l);
}

/* ---- the transformers golden of the same prompt ---- */

typedef struct gold {
    uint32_t version, T;
    int32_t *ids;
    double   probs3[3];
} gold_t;

/* Reads the .d3gt header, ids and probs3 (tests/tools/gen_tower_golden.py
 * docstring); false when the file is not there or of an unknown version.
 * Version 2 appends the fp64 reference after the version 1 records, so
 * probs3 (transformers fp32) is at the same place in both. */
static bool gold_read(const char *path, gold_t *g) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return false;
    uint8_t  head[32];
    uint32_t h[7];
    bool     ok = fread(head, 1, 32, fp) == 32 && memcmp(head, "D3GT", 4) == 0;
    memcpy(h, head + 4, sizeof h);
    ok = ok && (h[0] == 1 || h[0] == 2);
    g->version = h[0];
    g->T = h[1];
    size_t H = h[2], S = h[3], P = h[4], C = h[5];
    g->ids = ok ? malloc((size_t)g->T * sizeof *g->ids + 1) : NULL;
    ok = ok && g->ids && fread(g->ids, sizeof *g->ids, g->T, fp) == g->T;
    /* pos[P], states[S][P][H], final_last[H] (f32/i32), logits[C] (f32) */
    long skip = (long)(4 * P + 4 * S * P * H + 4 * H + 4 * C);
    ok = ok && fseek(fp, skip, SEEK_CUR) == 0 && fread(g->probs3, sizeof(double), 3, fp) == 3;
    fclose(fp);
    if (!ok) {
        free(g->ids);
        g->ids = NULL;
    }
    return ok;
}

Test(answer, matches_tower_golden) {
    gold_t g = {0};
    if (!gold_read(GOLDEN, &g)) {
        cr_skip_test("%s: missing or of an unknown version; not compared", GOLDEN);
    }
    loaded_t l;
    load(PKG, &l);
    sch_request_t *req = decode_valid(EXAMPLE_BODY, strlen(EXAMPLE_BODY));
    eng_prompt_t   pr;
    char           errstr[512] = "";
    eng_prompt_init(&pr);
    const sch_part_t *part = sch_request_part(req, 0);
    cr_assert_eq(eng_prompt_render(l.pkg, part, &part->questions[0], &pr, errstr, sizeof errstr),
                 SVC_OK);
    bool same = pr.ids.n == g.T && memcmp(pr.ids.v, g.ids, g.T * sizeof *g.ids) == 0;
    cr_assert(same, "the golden's ids (%u) are not this prompt's (%zu)", g.T, pr.ids.n);
    eng_answers_t *ans = NULL;
    cr_assert_eq(eng_answer_request(l.pkg, l.model, req, &ans, NULL, errstr, sizeof errstr), SVC_OK,
                 "%s", errstr);
    const sch_result_t *res = &eng_answers_results(ans)[0][0];
    cr_assert_null(res->error_code);
    for (size_t i = 0; i < 3; i++)
        cr_expect(fabs(res->probs[i] - g.probs3[i]) <= GOLDEN_TOL, "p[%zu] %.17g, golden %.17g", i,
                  res->probs[i], g.probs3[i]);
    cr_assert_eq(eng_answers_input_tokens(ans)[0], pr.n_tokens);
    cr_assert_eq(eng_answers_stats(ans)->n_forward, 1);
    eng_answers_free(ans);
    eng_prompt_fini(&pr);
    sch_request_free(req);
    free(g.ids);
    unload(&l);
}

/* ---- the length limit (c.7, b.5, b.6) ---- */

/* A copy of the package whose decision_config.json has max_length = limit.
 * Its manifest no longer matches: nothing here verifies it. */
static void copy_with_limit(char *dir, size_t size, size_t limit) {
    snprintf(dir, size, "/tmp/d3ans-XXXXXX");
    cr_assert(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s'/* '%s'/", PKG, dir);
    cr_assert_eq(system(cmd), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/decision_config.json", dir);
    json_error_t jerr;
    json_t      *dc = json_load_file(path, 0, &jerr);
    cr_assert(dc, "%s", jerr.text);
    cr_assert_eq(json_object_set_new(dc, "max_length", json_integer((json_int_t)limit)), 0);
    cr_assert_eq(json_dump_file(dc, path, JSON_PRESERVE_ORDER), 0);
    json_decref(dc);
}

static void remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static const char LENGTH_BODY[] =
    "{\"state\": \"The order arrived damaged.\", \"questions\": {"
    "\"short\": {\"type\": \"noul\", \"instructions\": \"Damaged?\"},"
    "\"long\": {\"type\": \"noul\", \"instructions\": \"Is the customer, who wrote a short note "
    "about a parcel that arrived in a poor state, asking for anything at all?\"},"
    "\"bad\": {\"type\": \"noul\", \"instructions\": \"\"}}}";

Test(answer, max_length_exceeded) {
    loaded_t l;
    load(PKG, &l);
    size_t n_short = prompt_tokens(&l, LENGTH_BODY, 0);
    size_t n_long = prompt_tokens(&l, LENGTH_BODY, 1);
    unload(&l);
    cr_assert_gt(n_long, n_short);
    char dir[64];
    copy_with_limit(dir, sizeof dir, n_short); /* equal to the limit is allowed */
    load(dir, &l);
    cr_assert_eq(eng_package_max_length(l.pkg), n_short);
    json_t *r;
    cr_assert_eq(ask(&l, LENGTH_BODY, &r), OPS_EXIT_OK);
    const json_t *answers = json_object_get(r, "answers");
    cr_assert(json_is_number(path2(answers, "short", "noul")), "short is answered");
    const json_t *lg = json_object_get(answers, "long");
    char          want[256];
    snprintf(want, sizeof want, SCH_MSG_MAX_LENGTH, n_long, n_short);
    cr_assert_str_eq(json_string_value(json_object_get(lg, "type")), "noul");
    cr_assert_str_eq(json_string_value(json_object_get(lg, "error")), "max_length_exceeded");
    cr_assert_str_eq(json_string_value(json_object_get(lg, "message")), want);
    cr_assert_null(json_object_get(lg, "noul"));
    cr_assert_str_eq(json_string_value(path2(answers, "bad", "error")), "invalid_question");
    /* b.5: only the question that reached the model is counted. */
    cr_assert_eq(json_integer_value(path2(r, "usage", "input_tokens")), (json_int_t)n_short);
    json_decref(r);
    unload(&l);
    remove_dir(dir);
}

Test(answer, all_too_long_is_still_200) {
    char dir[64];
    copy_with_limit(dir, sizeof dir, 16);
    loaded_t l;
    load(dir, &l);
    json_t *r;
    cr_assert_eq(ask(&l, EXAMPLE_BODY, &r), OPS_EXIT_OK);
    const json_t *route = path2(r, "answers", "route");
    cr_assert_str_eq(json_string_value(json_object_get(route, "error")), "max_length_exceeded");
    cr_assert(strstr(json_string_value(json_object_get(route, "message")),
                     "over the maximum context length of 16 tokens; nothing was truncated"));
    cr_assert_eq(json_integer_value(path2(r, "usage", "input_tokens")), 0);
    json_decref(r);
    unload(&l);
    remove_dir(dir);
}

/* ---- options.deadline_ms (a.8, b.5, b.6) ---- */

#define DEADLINE_QUESTIONS                                                                         \
    "\"questions\": {\"a\": {\"type\": \"noul\", \"instructions\": \"Damaged?\"},"                 \
    "\"b\": {\"type\": \"noul\", \"instructions\": \"Late?\"},"                                    \
    "\"c\": {\"type\": \"choice\", \"criteria\": {\"yes\": null, \"no\": null}}}"

/* Answers body in-process; the caller frees *req and the answers. */
static eng_answers_t *answer_body(const loaded_t *l, const char *body, sch_request_t **req) {
    *req = decode_valid(body, strlen(body));
    eng_answers_t *ans = NULL;
    char           errstr[512] = "";
    cr_assert_eq(eng_answer_request(l->pkg, l->model, *req, &ans, NULL, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
    return ans;
}

static void check_expired(const sch_result_t *r, const char *what) {
    cr_assert_str_eq(r->error_code, "deadline_exceeded", "%s", what);
    cr_assert_null(r->error_message, "%s: no message (b.6)", what);
    cr_assert_null(r->probs, "%s", what);
}

/* Every question skipped, yet every prompt counted; real clock: 1e-9 ms
 * has passed once the first prompt is tokenized. */
Test(answer, deadline_tiny_skips_all) {
    loaded_t l;
    load(PKG, &l);
    static const char body[] = "{\"state\": \"The order arrived damaged.\", " DEADLINE_QUESTIONS
                               ", \"options\": {\"deadline_ms\": 1e-9}}";
    sch_request_t      *req;
    eng_answers_t      *ans = answer_body(&l, body, &req);
    const sch_result_t *res = eng_answers_results(ans)[0];
    check_expired(&res[0], "a");
    check_expired(&res[1], "b");
    check_expired(&res[2], "c");
    cr_assert_eq(eng_answers_stats(ans)->n_forward, 0);
    size_t want =
        prompt_tokens(&l, body, 0) + prompt_tokens(&l, body, 1) + prompt_tokens(&l, body, 2);
    cr_assert_eq(eng_answers_input_tokens(ans)[0], want, "usage counts all three (b.5)");
    svc_buf_t   out;
    sch_error_t e;
    sch_error_init(&e);
    svc_buf_init(&out, 1 << 20);
    cr_assert_eq(sch_response_encode(req, "tiny-upstream", eng_answers_results(ans),
                                     eng_answers_input_tokens(ans), NULL, &out, &e),
                 SVC_OK);
    cr_assert_eq(svc_buf_addc(&out, '\0'), SVC_OK);
    cr_assert(strstr(out.data, "\"a\":{\"type\":\"noul\",\"error\":\"deadline_exceeded\"}"), "%s",
              out.data);
    cr_assert(strstr(out.data, "\"c\":{\"type\":\"choice\",\"error\":\"deadline_exceeded\"}"), "%s",
              out.data);
    char usage[64];
    snprintf(usage, sizeof usage, "\"input_tokens\":%zu", want);
    cr_assert(strstr(out.data, usage), "%s", out.data);
    svc_buf_fini(&out);
    sch_error_fini(&e);
    eng_answers_free(ans);
    sch_request_free(req);
    unload(&l);
}

Test(answer, deadline_large_answers_all) {
    loaded_t l;
    load(PKG, &l);
    json_t *r;
    cr_assert_eq(ask(&l,
                     "{\"state\": \"The order arrived damaged.\", " DEADLINE_QUESTIONS
                     ", \"options\": {\"deadline_ms\": 1e9}}",
                     &r),
                 OPS_EXIT_OK);
    const json_t *answers = json_object_get(r, "answers");
    cr_assert(json_is_number(path2(answers, "a", "noul")), "a is answered");
    cr_assert(json_is_number(path2(answers, "b", "noul")), "b is answered");
    static const char *keys[] = {"yes", "no"};
    check_distribution(json_object_get(answers, "c"), keys, 2);
    json_decref(r);
    unload(&l);
}

/* A fake deadline clock: 10 ms more at every read (eng_answer_int.h). */
static int    fake_reads;
static double fake_clock(void) {
    return 10.0 * fake_reads++;
}

/* The clock reads 0 at the start, 10 before a's forward (answered), 20
 * before b's (past 15: skipped); then b, c and the other state's question
 * are all skipped without reading it again. No real timing involved. */
Test(answer, deadline_expires_midway) {
    loaded_t l;
    load(PKG, &l);
    static const char body[] =
        "{\"state\": \"The order arrived damaged.\", " DEADLINE_QUESTIONS
        ", \"options\": {\"deadline_ms\": 15}, \"states\": {\"second\": {\"state\": \"All good.\", "
        "\"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"Damaged?\"}}}}}";
    sch_request_t *req;
    eng_answer_set_clock(fake_clock);
    eng_answers_t *ans = answer_body(&l, body, &req);
    eng_answer_set_clock(NULL);
    cr_assert_eq(fake_reads, 3, "the clock was read %d times", fake_reads);
    cr_assert_eq(sch_request_n_parts(req), 2);
    const sch_result_t *res = eng_answers_results(ans)[0];
    cr_assert_null(res[0].error_code, "a ran before the deadline: %s", res[0].error_code);
    cr_assert(res[0].probs && res[0].probs[0] >= 0 && res[0].probs[0] <= 1);
    check_expired(&res[1], "b");
    check_expired(&res[2], "c");
    check_expired(&eng_answers_results(ans)[1][0], "second.q");
    cr_assert_eq(eng_answers_stats(ans)->n_forward, 1);
    size_t want =
        prompt_tokens(&l, body, 0) + prompt_tokens(&l, body, 1) + prompt_tokens(&l, body, 2);
    cr_assert_eq(eng_answers_input_tokens(ans)[0], want, "usage counts all three (b.5)");
    cr_assert_gt(eng_answers_input_tokens(ans)[1], 0);
    eng_answers_free(ans);
    sch_request_free(req);
    unload(&l);
}

/* ---- families, states, meta, media ---- */

Test(answer, noul_and_score) {
    loaded_t l;
    load(PKG, &l);
    json_t *r;
    cr_assert_eq(ask(&l,
                     "{\"state\": \"x\", \"questions\": {"
                     "\"n\": {\"type\": \"noul\", \"instructions\": \"Is it?\"},"
                     "\"s\": {\"type\": \"score\", \"instructions\": \"How bad?\", \"criteria\": "
                     "[\"low\", {\"level\": \"mid\"}, \"high\"]},"
                     "\"f\": {\"type\": \"noul\", \"instructions\": \"Full?\", "
                     "\"require_full_input\": true}}}",
                     &r),
                 OPS_EXIT_OK);
    const json_t *answers = json_object_get(r, "answers");
    double        noul = json_number_value(path2(answers, "n", "noul"));
    cr_assert(noul >= 0 && noul <= 1, "noul %g", noul);
    const json_t      *s = json_object_get(answers, "s");
    static const char *levels[] = {"0", "1", "2"};
    check_distribution(s, levels, 3);
    const json_t *p = json_object_get(s, "probabilities");
    double        score = json_number_value(json_object_get(s, "score"));
    double        want =
        json_number_value(json_object_get(p, "1")) + 2 * json_number_value(json_object_get(p, "2"));
    cr_assert(fabs(score - want) <= 1e-12, "score %.17g, expected %.17g", score, want);
    cr_assert_str_eq(json_string_value(path2(s, "legend", "1")), "{\"level\":\"mid\"}");
    cr_assert_str_eq(json_string_value(path2(answers, "f", "input_coverage")), "complete");
    json_decref(r);
    unload(&l);
}

Test(answer, multi_state) {
    loaded_t l;
    load(PKG, &l);
    static const char body[] =
        "{\"state\": \"The order arrived damaged.\", \"questions\": {\"q\": {\"type\": \"noul\", "
        "\"instructions\": \"Damaged?\"}}, \"states\": {\"second\": {\"state\": \"All good, "
        "thanks.\", \"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"Damaged?\"}, "
        "\"c\": {\"type\": \"choice\", \"criteria\": {\"yes\": null, \"no\": null}}}}}}";
    json_t *r;
    cr_assert_eq(ask(&l, body, &r), OPS_EXIT_OK);
    const json_t *second = path2(r, "states", "second");
    cr_assert(second, "states.second is there");
    cr_assert_str_eq(json_string_value(json_object_get(second, "model")), "tiny-upstream");
    double own = json_number_value(path2(json_object_get(r, "answers"), "q", "noul"));
    double other = json_number_value(path2(json_object_get(second, "answers"), "q", "noul"));
    cr_assert(own != other, "each state gets its own answer (%g, %g)", own, other);
    static const char *keys[] = {"yes", "no"};
    check_distribution(path2(second, "answers", "c"), keys, 2);
    /* usage: each part its own (b.5) */
    json_int_t u0 = json_integer_value(path2(r, "usage", "input_tokens"));
    json_int_t u1 = json_integer_value(path2(second, "usage", "input_tokens"));
    cr_assert_gt(u0, 0);
    cr_assert_gt(u1, u0, "the second state has two questions");
    json_decref(r);
    unload(&l);
}

Test(answer, meta_when_asked) {
    loaded_t l;
    load(PKG, &l);
    json_t *r;
    cr_assert_eq(ask(&l,
                     "{\"state\": \"x\", \"questions\": {\"n\": {\"type\": \"noul\", "
                     "\"instructions\": \"Is it?\"}}, \"options\": {\"return_meta\": true}}",
                     &r),
                 OPS_EXIT_OK);
    const json_t *meta = json_object_get(r, "meta");
    cr_assert_str_eq(json_string_value(json_object_get(meta, "model_id")), "tiny-upstream");
    cr_assert(json_is_null(json_object_get(meta, "revision")));
    cr_assert_str_eq(json_string_value(json_object_get(meta, "model_sha256")), "0123");
    cr_assert_str_eq(json_string_value(json_object_get(meta, "numerics")), "exact");
    cr_assert_str_eq(json_string_value(json_object_get(meta, "accelerator")), "cpu");
    cr_assert_eq(strncmp(json_string_value(json_object_get(meta, "device")), "cpu (", 5), 0);
    cr_assert(json_number_value(json_object_get(meta, "compute_ms")) >= 0);
    json_decref(r);
    unload(&l);
}

/* A 1x1 PNG. */
#define PNG_1X1                                                                                    \
    "data:image/"                                                                                  \
    "png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwG"           \
    "A60e6kgAAAABJRU5ErkJggg=="

Test(answer, images_refused) {
    loaded_t l;
    load(PKG, &l);
    json_t *r;
    cr_assert_eq(ask(&l,
                     "{\"state\": \"x\", \"images\": [\"" PNG_1X1 "\"], \"questions\": {\"n\": "
                     "{\"type\": \"noul\", \"instructions\": \"Is it?\"}}}",
                     &r),
                 OPS_EXIT_VERDICT);
    cr_assert_str_eq(json_string_value(path2(r, "error", "code")), "invalid_request");
    cr_assert_str_eq(json_string_value(path2(r, "error", "message")),
                     "model tiny-upstream has no vision tower; images are not supported");
    json_decref(r);
    unload(&l);
}

/* Decoded as if a vision tower existed, the engine still refuses before
 * any forward pass. */
Test(answer, engine_refuses_media) {
    loaded_t l;
    load(PKG, &l);
    static const char body[] = "{\"state\": \"x\", \"images\": [\"" PNG_1X1
                               "\"], \"questions\": {\"n\": {\"type\": \"noul\", "
                               "\"instructions\": \"Is it?\"}}}";
    sch_request_t *req = decode_valid(body, strlen(body));
    eng_answers_t *ans = NULL;
    char           errstr[256] = "";
    cr_assert_eq(eng_answer_request(l.pkg, l.model, req, &ans, NULL, errstr, sizeof errstr),
                 SVC_ERR_UNSUPPORTED);
    cr_assert_null(ans);
    cr_assert(strstr(errstr, "has no vision tower"), "%s", errstr);
    sch_request_free(req);
    unload(&l);
}

Test(answer, chat_template_verdict) {
    eng_chat_template_t v;
    char                sha[65], errstr[256];
    cr_assert_eq(eng_chat_template_check(PKG, &v, sha, errstr, sizeof errstr), SVC_OK);
    cr_assert_eq(v, ENG_CHAT_TEMPLATE_UNPINNED, "the fixture's template is a placeholder");
    cr_assert_eq(strlen(sha), 64, "%s", sha);
    cr_assert_eq(strspn(sha, "0123456789abcdef"), 64, "%s", sha);
    cr_assert_eq(eng_chat_template_check("/nonexistent-d3", &v, sha, errstr, sizeof errstr),
                 SVC_OK);
    cr_assert_eq(v, ENG_CHAT_TEMPLATE_MISSING);
}
