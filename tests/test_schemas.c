/*
 * test_schemas.c -- the request decoder and the answer writers (SPEC a, b).
 *
 * The contract table tests/contract/cases.jsonl holds request bodies with
 * the `d3stream validate` verdict the spec prescribes, written by hand;
 * every row runs through sch_request_decode (no model info) and
 * sch_verdict_encode and must match in content and key order. The unit
 * tests below cover what the table cannot: model info, limits, accessors,
 * the 200 response body, and malformed input.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <math.h>

#include "sch_int.h"
#include "schemas.h"

#define BUF_MAX (64u << 20)

/* ---- helpers ----------------------------------------------------------- */

typedef struct decoded {
    sch_request_t *req;
    sch_error_t    err;
    svc_err_t      rc;
} decoded_t;

static decoded_t decode_with(const char *body, size_t len, const sch_limits_t *limits,
                             const sch_model_info_t *model) {
    decoded_t d;
    sch_error_init(&d.err);
    d.rc = sch_request_decode(body, len, limits, model, &d.req, &d.err);
    return d;
}

static decoded_t decode(const char *body, const sch_model_info_t *model) {
    return decode_with(body, strlen(body), NULL, model);
}

static void decoded_fini(decoded_t *d) {
    sch_request_free(d->req);
    sch_error_fini(&d->err);
}

/* The whole-request error message (asserts there is one). */
static void expect_error(const char *body, const sch_model_info_t *model, int status,
                         const char *code, const char *message) {
    decoded_t d = decode(body, model);
    cr_assert_eq(d.rc, SVC_ERR_INVALID, "expected an error for %s", body);
    cr_expect_eq(d.err.status, status, "status %d for %s", d.err.status, body);
    cr_expect_str_eq(d.err.code, code);
    cr_expect_str_eq(d.err.message, message);
    decoded_fini(&d);
}

/* Encodes a 200 response of d.req; returns the body (caller frees). */
static char *respond(const sch_request_t *req, const sch_result_t *const *results,
                     const size_t *tokens, const sch_meta_t *meta) {
    svc_buf_t   out;
    sch_error_t err;
    sch_error_init(&err);
    svc_buf_init(&out, BUF_MAX);
    svc_err_t rc = sch_response_encode(req, "d3-nano", results, tokens, meta, &out, &err);
    cr_assert_eq(rc, SVC_OK, "encode failed: %s", err.message ? err.message : "?");
    sch_error_fini(&err);
    return svc_buf_steal(&out, NULL);
}

/* ---- the contract table ------------------------------------------------ */

static unsigned char *b64_body(const char *text, size_t *len) {
    size_t         n = strlen(text);
    unsigned char *out = malloc(n + 1);
    cr_assert(out);
    cr_assert(sch_base64_decode(text, n, out, len), "bad body_b64");
    return out;
}

/* The verdict for one body, as a jansson value (order kept). */
static json_t *verdict_of(const char *body, size_t len) {
    decoded_t d = decode_with(body, len, NULL, NULL);
    svc_buf_t out;
    svc_buf_init(&out, BUF_MAX);
    svc_err_t rc = sch_verdict_encode(d.rc == SVC_OK ? d.req : NULL, &d.err, &out);
    cr_assert_eq(rc, SVC_OK);
    json_error_t jerr;
    json_t      *v = json_loadb(out.data, out.len, JSON_ALLOW_NUL, &jerr);
    cr_assert(v, "verdict is not JSON (%s): %s", jerr.text, out.data);
    svc_buf_fini(&out);
    decoded_fini(&d);
    return v;
}

static bool run_case(json_t *c, size_t line) {
    const char    *name = json_string_value(json_object_get(c, "name"));
    json_t        *jbody = json_object_get(c, "body");
    unsigned char *owned = NULL;
    const char    *body;
    size_t         len;
    if (jbody) {
        body = json_string_value(jbody);
        len = json_string_length(jbody);
    } else {
        owned = b64_body(json_string_value(json_object_get(c, "body_b64")), &len);
        body = (const char *)owned;
    }
    json_t *got = verdict_of(body, len);
    char   *a = json_dumps(got, JSON_COMPACT | JSON_ENSURE_ASCII);
    char   *e = json_dumps(json_object_get(c, "verdict"), JSON_COMPACT | JSON_ENSURE_ASCII);
    bool    same = a && e && strcmp(a, e) == 0;
    if (!same)
        cr_log_error("case %zu %s:\n  got      %s\n  expected %s", line, name, a, e);
    free(a);
    free(e);
    free(owned);
    json_decref(got);
    return same;
}

Test(schemas, contract_cases) {
    FILE *f = fopen(D3_SOURCE_DIR "/tests/contract/cases.jsonl", "rb");
    cr_assert(f, "cannot open the contract table");
    char  *line = NULL;
    size_t cap = 0;
    size_t n = 0, failed = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t jerr;
        json_t      *c = json_loads(line, JSON_ALLOW_NUL, &jerr);
        cr_assert(c, "line %zu: %s", n + 1, jerr.text);
        n++;
        failed += !run_case(c, n);
        json_decref(c);
    }
    free(line);
    fclose(f);
    cr_expect_geq(n, 120, "only %zu contract cases", n);
    cr_expect_eq(failed, 0, "%zu of %zu contract cases failed", failed, n);
}

/* ---- a.1 limits and parse failures ------------------------------------- */

/* bytes.decode("utf-8", "replace"): one U+FFFD per maximal ill-formed
 * subpart (the expected texts are CPython 3.11's). */
Test(schemas, utf8_replace_as_python) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"\xff\xc3", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82"
         "a",
         "\xef\xbf\xbd"
         "a"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"ok\xe2\x82\xac", "ok\xe2\x82\xac"},
        {"\xf0\x9f\x98\x80x", "\xf0\x9f\x98\x80x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        svc_buf_t b;
        svc_buf_init(&b, 1 << 10);
        cr_assert_eq(sch_py_utf8_replace(&b, cases[i].in, strlen(cases[i].in)), SVC_OK);
        cr_assert_eq(b.len, strlen(cases[i].out), "case %zu", i);
        cr_assert(!memcmp(b.data, cases[i].out, b.len), "case %zu", i);
        svc_buf_fini(&b);
    }
}

Test(schemas, body_limit) {
    const char  *body = "{\"state\": \"s\", \"questions\": {\"q\": {\"type\": \"noul\"}}}";
    size_t       len = strlen(body);
    sch_limits_t limits = {len};
    decoded_t    d = decode_with(body, len, &limits, NULL);
    cr_expect_eq(d.rc, SVC_OK);
    decoded_fini(&d);
    limits.max_request_bytes = len - 1;
    d = decode_with(body, len, &limits, NULL);
    cr_assert_eq(d.rc, SVC_ERR_INVALID);
    cr_expect_eq(d.err.status, 413);
    cr_expect_str_eq(d.err.code, "request_too_large");
    char want[64];
    snprintf(want, sizeof want, "the request body exceeds %zu bytes", len - 1);
    cr_expect_str_eq(d.err.message, want);
    decoded_fini(&d);
}

Test(schemas, too_deep_is_not_json) {
    svc_buf_t b;
    svc_buf_init(&b, BUF_MAX);
    cr_assert_eq(svc_buf_adds(&b, "{\"state\": "), SVC_OK);
    for (int i = 0; i < 400; i++)
        cr_assert_eq(svc_buf_addc(&b, '['), SVC_OK);
    for (int i = 0; i < 400; i++)
        cr_assert_eq(svc_buf_addc(&b, ']'), SVC_OK);
    cr_assert_eq(svc_buf_adds(&b, ", \"questions\": {\"q\": {\"type\": \"noul\"}}}"), SVC_OK);
    decoded_t d = decode_with(b.data, b.len, NULL, NULL);
    cr_assert_eq(d.rc, SVC_ERR_INVALID);
    cr_expect_eq(d.err.status, 400);
    cr_expect(strncmp(d.err.message, "the request body is not JSON: ", 30) == 0, "%s",
              d.err.message);
    decoded_fini(&d);
    svc_buf_fini(&b);
}

/* ---- model info ---------------------------------------------------------- */

static const char *const      NAMES[] = {"d3-nano", "", "org/D3-Nano"};
static const char *const      PROFILES[] = {"exact", "fast"};
static const sch_model_info_t NANO = {NAMES, 3, "d3-nano", false, false, PROFILES, 2, false, NULL};
static const sch_model_info_t VISION = {NAMES, 3, "d3-vl", true, false, NULL, 0, false, NULL};
static const sch_model_info_t VIDEO = {NAMES, 3, "d3-vl", true, true, NULL, 0, false, NULL};
/* VISION for an engine that decodes the images (errors after them held). */
static const sch_model_info_t VISION_ENGINE = {NAMES, 3, "d3-vl", true, false, NULL, 0, true, NULL};
/* NANO serving fast by default (--profile fast) */
static const sch_model_info_t NANO_FAST = {NAMES,    3, "d3-nano", false, false,
                                           PROFILES, 2, false,     "fast"};

#define Q_NOUL "\"questions\": {\"q\": {\"type\": \"noul\"}}"

Test(schemas, model_names) {
    const char *ok[] = {"{\"model\": \"d3-nano\", \"state\": \"s\", " Q_NOUL "}",
                        "{\"model\": \"org/D3-Nano\", \"state\": \"s\", " Q_NOUL "}",
                        "{\"model\": null, \"state\": \"s\", " Q_NOUL "}",
                        "{\"state\": \"s\", " Q_NOUL "}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        decoded_t d = decode(ok[i], &NANO);
        cr_expect_eq(d.rc, SVC_OK, "%s: %s", ok[i], d.err.message);
        decoded_fini(&d);
    }
    expect_error("{\"model\": \"d3-lite\", \"state\": \"s\", " Q_NOUL "}", &NANO, 404,
                 "model_not_found", "this runtime serves d3-nano, not d3-lite");
    expect_error("{\"model\": \"\", \"state\": \"s\", " Q_NOUL "}", &NANO, 404, "model_not_found",
                 "this runtime serves d3-nano, not ");
    expect_error("{\"model\": \"D3-NANO\", \"state\": \"s\", " Q_NOUL "}", &NANO, 404,
                 "model_not_found", "this runtime serves d3-nano, not D3-NANO");
    expect_error("{\"model\": 1, \"state\": \"s\", " Q_NOUL "}", &NANO, 400, "invalid_request",
                 "model must be a string");
}

/* A NUL in a name a message quotes (a question id, a criteria key, the
 * model) stays in the message, as in upstream's f-strings: the body says
 * \u0000 and the text goes on past it. */
Test(schemas, messages_keep_nul) {
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"{\"state\": \"x\", \"questions\": {\"a\\u0000b\": {\"type\": \"choice\", \"criteria\": "
         "{\"only\": null}}}}",
         "{\"error\":{\"code\":\"invalid_request\",\"message\":\"no question is valid "
         "(a\\u0000b: criteria must name 2 to 255 options)\"}}"},
        {"{\"state\": \"x\", \"questions\": {\"q\": {\"type\": \"choice\", \"criteria\": "
         "{\"a\\u0000b\": \" \", \"c\": null}}}}",
         "{\"error\":{\"code\":\"invalid_request\",\"message\":\"no question is valid "
         "(q: criteria.a\\u0000b must not be empty or whitespace)\"}}"},
        {"{\"model\": \"d3\\u0000x\", \"state\": \"s\", " Q_NOUL "}",
         "{\"error\":{\"code\":\"model_not_found\",\"message\":\"this runtime serves d3-nano, "
         "not d3\\u0000x\"}}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        decoded_t d = decode(cases[i].body, &NANO);
        cr_assert_eq(d.rc, SVC_ERR_INVALID, "%s", cases[i].body);
        svc_buf_t out;
        svc_buf_init(&out, BUF_MAX);
        cr_assert_eq(sch_error_encode(&d.err, &out), SVC_OK);
        cr_assert_eq(svc_buf_addc(&out, '\0'), SVC_OK);
        cr_assert_str_eq(out.data, cases[i].want);
        svc_buf_fini(&out);
        decoded_fini(&d);
    }
    /* a per-question message too, when another question is valid */
    decoded_t d = decode("{\"state\": \"x\", \"questions\": {\"q\": {\"type\": \"choice\", "
                         "\"criteria\": {\"a\\u0000b\": \" \", \"c\": null}}, \"n\": {\"type\": "
                         "\"noul\"}}}",
                         &NANO);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    svc_buf_t out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_question_error_encode(&sch_request_part(d.req, 0)->questions[0], &out),
                 SVC_OK);
    cr_assert_eq(svc_buf_addc(&out, '\0'), SVC_OK);
    cr_assert_str_eq(out.data, "{\"type\":\"choice\",\"error\":\"invalid_question\",\"message\":"
                               "\"criteria.a\\u0000b must not be empty or whitespace\"}");
    svc_buf_fini(&out);
    decoded_fini(&d);
}

Test(schemas, model_profiles) {
    decoded_t d =
        decode("{\"state\": \"s\", " Q_NOUL ", \"options\": {\"profile\": \"fast\"}}", &NANO);
    cr_assert_eq(d.rc, SVC_OK);
    cr_expect_str_eq(sch_request_options(d.req)->profile, "fast");
    decoded_fini(&d);
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"options\": {\"profile\": \"slow\"}}", &NANO, 400,
                 "invalid_request", "options.profile must be one of ['exact', 'fast']");
    /* the served default when a request names none; a request still picks */
    d = decode("{\"state\": \"s\", " Q_NOUL "}", &NANO_FAST);
    cr_assert_eq(d.rc, SVC_OK);
    cr_expect_str_eq(sch_request_options(d.req)->profile, "fast");
    decoded_fini(&d);
    d = decode("{\"state\": \"s\", " Q_NOUL ", \"options\": {\"profile\": \"exact\"}}", &NANO_FAST);
    cr_assert_eq(d.rc, SVC_OK);
    cr_expect_str_eq(sch_request_options(d.req)->profile, "exact");
    cr_expect_eq(sch_request_options(d.req)->profile, PROFILES[0], "the model's own string");
    decoded_fini(&d);
    d = decode("{\"state\": \"s\", " Q_NOUL "}", &NANO);
    cr_expect_str_eq(sch_request_options(d.req)->profile, "exact");
    decoded_fini(&d);
}

#define PNG_1X1                                                                                    \
    "data:image/png;base64,"                                                                       \
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGM4IacBAALAAQ/aQIG5AAAAAElFTkSuQmCC"

Test(schemas, model_vision_and_videos) {
    const char *img = "{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1 "\"]}";
    expect_error(img, &NANO, 400, "invalid_request",
                 "model d3-nano has no vision tower; images are not supported");
    /* no vision tower: videos are refused first, in upstream's words (issue 30),
     * with or without images */
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"videos\": [\"x\"]}", &NANO, 400,
                 "invalid_request", "model d3-nano reads no videos");
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1
                 "\"], \"videos\": [\"x\"]}",
                 &NANO, 400, "invalid_request", "model d3-nano reads no videos");
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"videos\": [\"x\"]}", &VISION, 400,
                 "invalid_request", "model d3-vl reads no videos");
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"videos\": [\"x\"]}", &VIDEO, 400,
                 "invalid_request",
                 "videos[0]: videos must be base64 MP4, WebM, QuickTime or Matroska data URLs");
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"videos\": [\"data:video/mp4,AAAA\"]}", &VIDEO,
                 400, "invalid_request",
                 "videos[0]: a data URL video is data:video/<format>;base64,<data>");
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"videos\": [\"data:video/mp4;base64,A\"]}",
                 &VIDEO, 400, "invalid_request", "videos[0]: invalid base64 video data");

    decoded_t d = decode(img, &VISION);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    const sch_part_t *part = sch_request_part(d.req, 0);
    cr_assert_eq(part->n_images, 1);
    cr_expect_str_eq(part->images[0].format, "png");
    cr_expect_eq(part->images[0].width, 1);
    cr_expect_eq(part->images[0].height, 1);
    cr_expect(part->images[0].len > 8 && part->images[0].bytes[1] == 'P');
    decoded_fini(&d);

    d = decode("{\"state\": \"s\", " Q_NOUL ", \"videos\": [\"data:video/webm;base64,AAAA\"]}",
               &VIDEO);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    cr_expect_eq(sch_request_part(d.req, 0)->n_videos, 1);
    decoded_fini(&d);
}

/* A body that decodes with its whole-request error held behind its images
 * (engine_decodes): no question left, n_parts parts, n_images[p] images. */
static void expect_held(const char *body, const char *message, size_t n_parts,
                        const size_t *n_images) {
    decoded_t d = decode(body, &VISION_ENGINE);
    cr_assert_eq(d.rc, SVC_OK, "%s: %s", body, d.err.message ? d.err.message : "?");
    const sch_error_t *held = sch_request_pending(d.req);
    cr_assert(held, "nothing held for %s", body);
    cr_expect_eq(held->status, 400);
    cr_expect_str_eq(held->code, "invalid_request");
    cr_expect_str_eq(held->message, message);
    cr_assert_eq(sch_request_n_parts(d.req), n_parts, "%s", body);
    for (size_t p = 0; p < n_parts; p++) {
        const sch_part_t *part = sch_request_part(d.req, p);
        cr_expect_eq(part->n_questions, 0, "part %zu of %s", p, body);
        cr_expect_eq(part->n_images, n_images[p], "part %zu of %s", p, body);
        for (size_t i = 0; i < part->n_images; i++)
            cr_expect_str_eq(part->images[i].format, "png");
    }
    decoded_fini(&d);
}

/* SPEC a.3, a.10: upstream decodes each image in full before the next
 * image's data URL, the state, the questions and the later states are
 * checked, so an image that fails to decode must answer before them. Only
 * the engine decodes: the decoder holds those later errors for it. */
Test(schemas, errors_after_images_are_held_for_the_engine) {
    const char  *bad_state = "state must be text, an object, or an array";
    const size_t one[] = {1}, two[] = {2}, one_two[] = {1, 2}, one_zero[] = {1, 0};
    expect_held("{\"state\": null, " Q_NOUL ", \"images\": [\"" PNG_1X1 "\"]}", bad_state, 1, one);
    expect_held("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1 "\", \"" PNG_1X1
                "\", \"data:image/gif;base64,AAAA\"]}",
                "images[2]: images must be base64 PNG, JPEG or WebP data URLs", 1, two);
    expect_held(
        "{\"state\": \"s\", \"questions\": {\"a\": {\"type\": \"set\"}}, \"images\": [\"" PNG_1X1
        "\"]}",
        "no question is valid (a: type must be one of ['choice', 'noul', 'score'])", 1, one);
    expect_held("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1
                "\"], \"videos\": [\"data:video/mp4;base64,AAAA\"]}",
                "model d3-vl reads no videos", 1, one);
    /* a later state's error waits for the images of the states before it */
    expect_held("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1
                "\"], \"states\": {\"b\": {\"state\": 1, " Q_NOUL ", \"images\": [\"" PNG_1X1
                "\", \"" PNG_1X1 "\"]}, \"c\": {\"state\": [], " Q_NOUL "}}}",
                bad_state, 2, one_two);
    expect_held("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1
                "\"], \"states\": {\"b\": {\"state\": \"t\", \"questions\": []}}}",
                "questions must be a nonempty mapping of question IDs", 2, one_zero);

    /* no image before the error, or no engine to decode: answered at once */
    expect_error("{\"state\": null, " Q_NOUL "}", &VISION_ENGINE, 400, "invalid_request",
                 bad_state);
    expect_error("{\"state\": \"s\", " Q_NOUL
                 ", \"images\": [\"data:image/gif;base64,AAAA\", \"" PNG_1X1 "\"]}",
                 &VISION_ENGINE, 400, "invalid_request",
                 "images[0]: images must be base64 PNG, JPEG or WebP data URLs");
    expect_error("{\"state\": null, " Q_NOUL ", \"images\": [\"" PNG_1X1 "\"]}", &VISION, 400,
                 "invalid_request", bad_state);
    expect_error("{\"state\": null, " Q_NOUL ", \"images\": [\"" PNG_1X1 "\"]}", NULL, 400,
                 "invalid_request", bad_state);
    /* checks before any part (options, model) never wait */
    expect_error("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1
                 "\"], \"options\": {\"x\": 1}}",
                 &VISION_ENGINE, 400, "invalid_request",
                 "options accepts only ['deadline_ms', 'max_tokens', 'profile', 'return_meta']");

    decoded_t d =
        decode("{\"state\": \"s\", " Q_NOUL ", \"images\": [\"" PNG_1X1 "\"]}", &VISION_ENGINE);
    cr_assert_eq(d.rc, SVC_OK);
    cr_expect_null(sch_request_pending(d.req));
    cr_expect_eq(sch_request_part(d.req, 0)->n_questions, 1);
    decoded_fini(&d);
}

/* ---- accessors ----------------------------------------------------------- */

Test(schemas, accessors) {
    const char *body =
        "{\"model\": \"m\", \"state\": {\"a\": 1}, \"options\": {\"deadline_ms\": 2.5, "
        "\"return_meta\": true}, \"questions\": {"
        "\"c\": {\"type\": \"choice\", \"criteria\": {\"x\": null, \"y\": \"Y\"}},"
        "\"n\": {\"type\": \"noul\", \"instructions\": \"I\", \"criteria\": {\"true\": \"T\"}},"
        "\"s\": {\"type\": \"score\", \"instructions\": {}, \"levels\": [\"a\", [1]], "
        "\"require_full_input\": true},"
        "\"bad\": {\"type\": \"set\"}},"
        "\"states\": {\"two\": {\"state\": \"t\", \"questions\": {\"q\": {\"type\": \"noul\"}}}}}";
    decoded_t d = decode(body, NULL);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    size_t len;
    cr_expect_eq(strncmp(sch_request_model(d.req, &len), "m", 1), 0);
    cr_expect_eq(len, 1);
    const sch_options_t *o = sch_request_options(d.req);
    cr_expect(o->has_deadline && o->deadline_ms == 2.5 && o->return_meta);
    cr_expect_str_eq(o->profile, "exact");
    cr_assert_eq(sch_request_n_parts(d.req), 2);
    const sch_part_t *p = sch_request_part(d.req, 0);
    cr_expect_null(p->name);
    cr_expect_eq(sch_json_type(p->state), SCH_JSON_OBJECT);
    cr_assert_eq(p->n_questions, 4);
    const sch_question_t *q = &p->questions[0];
    cr_expect_null(q->error_code);
    cr_expect_null(q->instructions);
    cr_expect_eq(q->type, SCH_Q_CHOICE);
    cr_assert_eq(q->n_options, 2);
    cr_expect_null(q->options[0].desc);
    cr_expect_eq(sch_json_type(q->options[1].desc), SCH_JSON_STRING);
    q = &p->questions[1];
    cr_expect_eq(q->type, SCH_Q_NOUL);
    cr_assert_eq(q->n_options, 2);
    cr_expect_str_eq(q->options[0].key, "false");
    cr_expect_null(q->options[0].desc);
    cr_expect_not_null(q->options[1].desc);
    q = &p->questions[2];
    cr_expect_eq(q->type, SCH_Q_SCORE);
    cr_expect(q->require_full_input);
    cr_expect_eq(sch_json_type(q->instructions), SCH_JSON_OBJECT);
    cr_assert_eq(q->n_options, 2);
    cr_expect_str_eq(q->options[1].key, "1");
    cr_expect_eq(sch_json_type(q->options[1].desc), SCH_JSON_ARRAY);
    q = &p->questions[3];
    cr_expect_str_eq(q->error_code, "invalid_question");
    cr_expect_str_eq(q->error_message, "type must be one of ['choice', 'noul', 'score']");
    p = sch_request_part(d.req, 1);
    cr_expect_eq(p->name_len, 3);
    cr_expect_eq(memcmp(p->name, "two", 3), 0);
    cr_expect_eq(p->n_questions, 1);
    cr_expect_null(sch_request_part(d.req, 2));
    decoded_fini(&d);
}

/* ---- b: the response body ------------------------------------------------ */

static json_t *parse_out(const char *text) {
    json_error_t jerr;
    json_t      *v = json_loads(text, JSON_ALLOW_NUL, &jerr);
    cr_assert(v, "not JSON (%s): %s", jerr.text, text);
    return v;
}

Test(schemas, response_exact_bytes) {
    decoded_t d = decode("{\"state\": \"s\", \"questions\": {"
                         "\"n\": {\"type\": \"noul\"},"
                         "\"s\": {\"type\": \"score\", \"criteria\": [\"Trivial\", {\"level\": "
                         "\"hárd\", \"a\": 1}]},"
                         "\"bad\": {\"type\": {\"k\": [1, 2.5]}},"
                         "\"f\": {\"type\": \"noul\", \"require_full_input\": true}}}",
                         NULL);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    double       pn[] = {1, 3}, ps[] = {0, 2}, pf[] = {0.5, 0.5};
    sch_result_t r[] = {{NULL, NULL, pn}, {NULL, NULL, ps}, {NULL, NULL, NULL}, {NULL, NULL, pf}};
    const sch_result_t *results[] = {r};
    size_t              tokens[] = {42};
    char               *body = respond(d.req, results, tokens, NULL);
    cr_expect_str_eq(
        body, "{\"model\":\"d3-nano\",\"answers\":{"
              "\"n\":{\"type\":\"noul\",\"noul\":0.75},"
              "\"s\":{\"type\":\"score\",\"score\":1.0,\"probabilities\":{\"0\":0.0,\"1\":1.0},"
              "\"confidence\":1.0,\"legend\":{\"0\":\"Trivial\",\"1\":"
              "\"{\\\"a\\\":1,\\\"level\\\":\\\"hárd\\\"}\"}},"
              "\"bad\":{\"type\":{\"k\":[1,2.5]},\"error\":\"invalid_question\",\"message\":"
              "\"type must be one of ['choice', 'noul', 'score']\"},"
              "\"f\":{\"type\":\"noul\",\"noul\":0.5,\"input_coverage\":\"complete\"}},"
              "\"usage\":{\"input_tokens\":42,\"output_tokens\":0}}");
    free(body);
    decoded_fini(&d);
}

Test(schemas, response_choice_confidence_and_ties) {
    decoded_t d = decode("{\"state\": \"s\", \"questions\": {"
                         "\"a\": {\"type\": \"choice\", \"criteria\": {\"x\": null, \"y\": null}},"
                         "\"t\": {\"type\": \"choice\", \"criteria\": {\"p\": null, \"q\": [], "
                         "\"r\": {}}}}}",
                         NULL);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    double              pa[] = {1, 3}, pt[] = {0.2, 0.4, 0.4};
    sch_result_t        r[] = {{NULL, NULL, pa}, {NULL, NULL, pt}};
    const sch_result_t *results[] = {r};
    char               *body = respond(d.req, results, NULL, NULL);
    json_t             *v = parse_out(body);
    json_t             *a = json_object_get(json_object_get(v, "answers"), "a");
    cr_expect_str_eq(json_string_value(json_object_get(a, "choice")), "y");
    double h = -(0.25 * log(0.25) + 0.75 * log(0.75));
    cr_expect(fabs(json_real_value(json_object_get(a, "confidence")) - (1 - h / log(2))) < 1e-15);
    const char *keys[] = {"type", "choice", "probabilities", "confidence"};
    size_t      i = 0;
    const char *key;
    json_t     *val;
    json_object_foreach(a, key, val) {
        cr_assert_lt(i, 4);
        cr_expect_str_eq(key, keys[i++]);
    }
    json_t *t = json_object_get(json_object_get(v, "answers"), "t");
    cr_expect_str_eq(json_string_value(json_object_get(t, "choice")), "q"); /* first of equals */
    json_decref(v);
    free(body);
    decoded_fini(&d);
}

Test(schemas, response_model_errors) {
    decoded_t d = decode("{\"state\": \"s\", \"questions\": {\"a\": {\"type\": \"noul\"}, "
                         "\"b\": {\"type\": \"noul\"}, \"c\": {\"type\": \"noul\"}, "
                         "\"d\": {\"type\": \"noul\"}, \"e\": {\"type\": \"noul\"}, "
                         "\"f\": {\"type\": \"noul\"}}}",
                         NULL);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    double              neg[] = {-0.1, 1}, zero[] = {0, 0}, nan_[] = {NAN, 1};
    sch_result_t        r[] = {{"max_length_exceeded", "the question prompt has 9 tokens", NULL},
                               {"deadline_exceeded", NULL, NULL},
                               {NULL, NULL, neg},
                               {NULL, NULL, zero},
                               {NULL, NULL, nan_},
                               {NULL, NULL, NULL}};
    const sch_result_t *results[] = {r};
    char               *body = respond(d.req, results, NULL, NULL);
    const char         *bad =
        "{\"type\":\"noul\",\"error\":\"invalid_model_output\",\"message\":\"need one "
        "finite non-negative probability per option\"}";
    char want[2048];
    snprintf(want, sizeof want,
             "{\"model\":\"d3-nano\",\"answers\":{"
             "\"a\":{\"type\":\"noul\",\"error\":\"max_length_exceeded\",\"message\":\"the "
             "question prompt has 9 tokens\"},"
             "\"b\":{\"type\":\"noul\",\"error\":\"deadline_exceeded\"},"
             "\"c\":%s,\"d\":%s,\"e\":%s,"
             "\"f\":{\"type\":\"noul\",\"error\":\"invalid_model_output\"}},"
             "\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}",
             bad, bad, bad);
    cr_expect_str_eq(body, want);
    free(body);
    decoded_fini(&d);
}

Test(schemas, response_non_finite_is_500) {
    decoded_t d = decode("{\"state\": \"s\", \"questions\": {\"q\": {\"type\": NaN}, "
                         "\"ok\": {\"type\": \"noul\"}}}",
                         NULL);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    double              p[] = {1, 1};
    sch_result_t        r[] = {{NULL, NULL, NULL}, {NULL, NULL, p}};
    const sch_result_t *results[] = {r};
    svc_buf_t           out;
    sch_error_t         err;
    sch_error_init(&err);
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_response_encode(d.req, "m", results, NULL, NULL, &out, &err), SVC_ERR_INVALID);
    cr_expect_eq(out.len, 0);
    cr_expect_eq(err.status, 500);
    cr_expect_str_eq(err.code, "internal_error");
    cr_expect_str_eq(err.message, "the model produced a non-finite number");
    cr_assert_eq(sch_error_encode(&err, &out), SVC_OK);
    cr_expect_str_eq(out.data, "{\"error\":{\"code\":\"internal_error\",\"message\":\"the model "
                               "produced a non-finite number\"}}");
    svc_buf_fini(&out);
    sch_error_fini(&err);
    sch_error_fini(&err); /* safe twice */
    decoded_fini(&d);
}

Test(schemas, response_meta_and_states) {
    decoded_t d = decode("{\"state\": \"s\", \"questions\": {\"q\": {\"type\": \"noul\"}}, "
                         "\"options\": {\"return_meta\": true}, \"states\": {"
                         "\"b\": {\"state\": \"x\", \"questions\": {\"r\": {\"type\": \"noul\"}}},"
                         "\"a\": {\"state\": \"y\", \"questions\": {\"q\": 5, \"s\": {\"type\": "
                         "\"noul\"}}}}}",
                         NULL);
    cr_assert_eq(d.rc, SVC_OK, "%s", d.err.message);
    double              p[] = {1, 1};
    sch_result_t        r0[] = {{NULL, NULL, p}}, r1[] = {{NULL, NULL, p}};
    sch_result_t        r2[] = {{NULL, NULL, NULL}, {NULL, NULL, p}};
    const sch_result_t *results[] = {r0, r1, r2};
    size_t              tokens[] = {10, 11, 12};
    sch_meta_t          meta = {"org/d3-nano", NULL,  "ab12", NULL,    "exact",
                                "native",      "cpu", "cpu0", 1.23456, 2.0};
    char               *body = respond(d.req, results, tokens, &meta);
    const char *m = "\"meta\":{\"model_id\":\"org/d3-nano\",\"revision\":null,\"model_sha256\":"
                    "\"ab12\",\"profile\":\"exact\",\"numerics\":\"exact\",\"engine\":\"native\","
                    "\"accelerator\":\"cpu\",\"device\":\"cpu0\",\"queue_ms\":1.235,"
                    "\"compute_ms\":2.0}";
    char        want[4096];
    snprintf(want, sizeof want,
             "{\"model\":\"d3-nano\",\"answers\":{\"q\":{\"type\":\"noul\",\"noul\":0.5}},"
             "\"usage\":{\"input_tokens\":10,\"output_tokens\":0},%s,\"states\":{"
             "\"b\":{\"model\":\"d3-nano\",\"answers\":{\"r\":{\"type\":\"noul\",\"noul\":0.5}},"
             "\"usage\":{\"input_tokens\":11,\"output_tokens\":0},%s},"
             "\"a\":{\"model\":\"d3-nano\",\"answers\":{\"q\":{\"type\":null,\"error\":"
             "\"invalid_question\",\"message\":\"a question must be an object\"},"
             "\"s\":{\"type\":\"noul\",\"noul\":0.5}},"
             "\"usage\":{\"input_tokens\":12,\"output_tokens\":0},%s}}}",
             m, m, m);
    cr_expect_str_eq(body, want);
    free(body);
    decoded_fini(&d);
}

Test(schemas, verdict_error_form) {
    sch_error_t err;
    sch_error_init(&err);
    sch_error_set(&err, 404, "model_not_found", "this runtime serves %s, not %s", "a", "b");
    svc_buf_t out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_verdict_encode(NULL, &err, &out), SVC_OK);
    cr_expect_str_eq(out.data, "{\"status\":404,\"error\":{\"code\":\"model_not_found\","
                               "\"message\":\"this runtime serves a, not b\"}}");
    svc_buf_fini(&out);
    sch_error_fini(&err);
}

/* ---- Python text helpers and base64 ------------------------------------- */

static void expect_repr(const char *s, size_t n, const char *want) {
    svc_buf_t out;
    svc_buf_init(&out, 1024);
    cr_assert_eq(sch_py_repr_str(&out, s, n), SVC_OK);
    cr_expect_str_eq(out.data, want);
    svc_buf_fini(&out);
}

Test(schemas, python_repr) {
    expect_repr("abc", 3, "'abc'");
    expect_repr("it's", 4, "\"it's\"");
    expect_repr("a'\"b", 4, "'a\\'\"b'");
    expect_repr("\\\t\n\r\x01\x7f", 6, "'\\\\\\t\\n\\r\\x01\\x7f'");
    expect_repr("\0", 1, "'\\x00'");
    expect_repr("é日本😀", strlen("é日本😀"), "'é日本😀'");
    expect_repr("\xc2\x85\xc2\xa0\xc2\xad", 6, "'\\x85\\xa0\\xad'");
    expect_repr("\xe2\x80\x8b\xe2\x80\xa8\xe3\x80\x80", 9, "'\\u200b\\u2028\\u3000'");
    expect_repr("\xf3\xa0\x80\x81", 4, "'\\U000e0001'"); /* TAG LATIN... (Cf) */
    expect_repr("\xf4\x8f\xbf\xbf", 4, "'\\U0010ffff'"); /* noncharacter (Cn) */
}

Test(schemas, python_strip) {
    cr_expect(sch_py_blank("", 0));
    cr_expect(sch_py_blank(" \t\n\v\f\r\x1c\x1f", 8));
    cr_expect(sch_py_blank("\xc2\x85\xc2\xa0\xe1\x9a\x80\xe2\x80\x8a\xe2\x80\xaf\xe3\x80\x80", 16));
    cr_expect(!sch_py_blank("\xe2\x80\x8b", 3)); /* U+200B */
    cr_expect(!sch_py_blank("\xef\xbb\xbf", 3)); /* U+FEFF */
    size_t start, len;
    sch_py_strip("\xc2\xa0 a b\t", 7, &start, &len);
    cr_expect_eq(start, 3);
    cr_expect_eq(len, 3);
}

Test(schemas, python_sum) {
    double v[] = {0.1, 0.2, 0.3};
    cr_expect_eq(sch_py_fsum(v, 3), 0.6); /* Neumaier; plain addition gives 0.6000000000000001 */
    double w[] = {1e100, 1.0, -1e100};
    cr_expect_eq(sch_py_fsum(w, 3), 1.0);
}

Test(schemas, base64_strict) {
    size_t        n;
    unsigned char out[16];
    cr_expect(sch_base64_decode("", 0, out, &n) && n == 0);
    cr_expect(sch_base64_decode("TWFu", 4, out, &n) && n == 3 && memcmp(out, "Man", 3) == 0);
    cr_expect(sch_base64_decode("TWE=", 4, out, &n) && n == 2);
    cr_expect(sch_base64_decode("TQ==", 4, out, &n) && n == 1);
    const char *bad[] = {"TQ=", "T===", "====", "TQ==TWFu", "TW=u", "TW u", "TWF\n", "TWF-"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect(!sch_base64_decode(bad[i], strlen(bad[i]), NULL, &n), "%s", bad[i]);
}

/* ---- robustness ---------------------------------------------------------- */

static void decode_and_render(const char *body, size_t len) {
    decoded_t d = decode_with(body, len, NULL, &VIDEO);
    svc_buf_t out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_verdict_encode(d.rc == SVC_OK ? d.req : NULL, &d.err, &out), SVC_OK);
    if (d.rc == SVC_OK) {
        size_t        parts = sch_request_n_parts(d.req);
        sch_result_t *r[8] = {0};
        for (size_t p = 0; p < parts && p < 8; p++)
            r[p] = calloc(sch_request_part(d.req, p)->n_questions + 1, sizeof *r[p]);
        svc_buf_reset(&out);
        sch_error_t err;
        sch_error_init(&err);
        if (parts <= 8) {
            svc_err_t rc = sch_response_encode(d.req, "m", (const sch_result_t *const *)r, NULL,
                                               NULL, &out, &err);
            cr_expect(rc == SVC_OK || rc == SVC_ERR_INVALID);
        }
        sch_error_fini(&err);
        for (size_t p = 0; p < 8; p++)
            free(r[p]);
    } else {
        cr_expect_not_null(d.err.message);
    }
    svc_buf_fini(&out);
    decoded_fini(&d);
}

Test(schemas, truncations_never_crash) {
    const char *bodies[] = {
        "{\"model\": \"d3-nano\", \"state\": {\"a\": [1, 2.5, \"\\u00e9\"]}, \"options\": "
        "{\"deadline_ms\": 5, \"return_meta\": true}, \"questions\": {\"c\": {\"type\": "
        "\"choice\", \"instructions\": \"Pick\", \"choices\": [{\"key\": \"a\"}, {\"key\": "
        "\"b\", \"description\": {\"x\": null}}]}, \"n\": {\"type\": \"noul\", \"criteria\": "
        "{\"true\": \"Y\"}}, \"s\": {\"type\": \"score\", \"levels\": [\"a\", \"b\"], "
        "\"require_full_input\": true}}, \"states\": {\"t\": {\"state\": \"x\", \"questions\": "
        "{\"q\": {\"type\": \"noul\"}}}}}",
        "{\"state\": \"s\", \"images\": [\"" PNG_1X1 "\"], \"videos\": [\"data:video/mp4;"
        "base64,AAAA\"], \"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": "
        "\"<|image_pad|>\"}, \"r\": {\"type\": \"choice\", \"criteria\": {\"a\": null, \"b\": "
        "null}}}}",
    };
    for (size_t b = 0; b < sizeof bodies / sizeof bodies[0]; b++) {
        size_t n = strlen(bodies[b]);
        decode_and_render(bodies[b], n);
        for (size_t cut = 0; cut < n; cut++) {
            char *copy = malloc(cut ? cut : 1); /* exact size: ASan sees overreads */
            memcpy(copy, bodies[b], cut);
            decode_and_render(copy, cut);
            free(copy);
        }
    }
}

Test(schemas, image_truncations_never_crash) {
    size_t                     n;
    const char                *b64 = strchr(PNG_1X1, ',') + 1;
    unsigned char             *png = b64_body(b64, &n);
    static const unsigned char jpeg[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00, 0xFF,
                                         0xC0, 0x00, 0x0B, 0x08, 0x00, 0x02, 0x00, 0x03, 0x01,
                                         0x01, 0x11, 0x00, 0xFF, 0xDA, 0x00, 0x02};
    static const unsigned char webp[] = {'R', 'I', 'F', 'F', 0, 0, 0, 0,    'W', 'E', 'B', 'P', 'V',
                                         'P', '8', 'L', 5,   0, 0, 0, 0x2F, 1,   0,   0,   0};
    uint32_t                   w, h;
    const char                *fail;
    cr_expect_str_eq(sch_image_probe(png, n, &w, &h, &fail), "png");
    cr_expect_str_eq(sch_image_probe(jpeg, sizeof jpeg, &w, &h, &fail), "jpeg");
    cr_expect(w == 3 && h == 2, "jpeg %ux%u", w, h);
    cr_expect_str_eq(sch_image_probe(webp, sizeof webp, &w, &h, &fail), "webp");
    cr_expect(w == 2 && h == 1, "webp %ux%u", w, h);
    /* Shorter than this, no header is whole: PNG to the IDAT chunk header,
     * JPEG to its SOS marker, WebP to the VP8L size bits. */
    const unsigned char *all[] = {png, jpeg, webp};
    size_t               lens[] = {n, sizeof jpeg, sizeof webp};
    size_t               whole[] = {8 + 25 + 8, 23, 25};
    for (size_t k = 0; k < 3; k++) {
        for (size_t cut = 0; cut < lens[k]; cut++) {
            unsigned char *copy = malloc(cut ? cut : 1);
            memcpy(copy, all[k], cut);
            const char *format = sch_image_probe(copy, cut, &w, &h, &fail);
            if (cut < whole[k]) {
                cr_expect_null(format, "kind %zu cut %zu", k, cut);
                cr_expect_not_null(fail);
            }
            free(copy);
        }
    }
    free(png);
}
