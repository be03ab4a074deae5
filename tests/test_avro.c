/*
 * test_avro.c -- Avro records (schemas/sch_avro*.c, sch_registry.c).
 *
 * The central check runs every request of tests/contract/cases.jsonl that
 * is a JSON object through JSON -> Avro -> JSON and demands the same
 * `d3stream validate` verdict for the rebuilt body as for the original:
 * that is what "a decoded Avro request is the HTTP body" means for the rest
 * of the pipeline. Bodies that are not JSON objects cannot be Avro requests
 * (request.avsc is a record); they are counted and reported, not failed.
 */
#include <arpa/inet.h>
#include <avro.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sch_int.h"
#include "schemas.h"
#include "test_registry.h"

#define BUF_MAX (64u << 20)

/* ---- helpers ----------------------------------------------------------- */

static char *verdict(const char *body, size_t len) {
    sch_limits_t   lim = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    err;
    svc_buf_t      out;
    sch_error_init(&err);
    svc_buf_init(&out, BUF_MAX);
    svc_err_t rc = sch_request_decode(body, len, &lim, NULL, &req, &err);
    cr_assert_eq(sch_verdict_encode(rc == SVC_OK ? req : NULL, &err, &out), SVC_OK);
    sch_request_free(req);
    sch_error_fini(&err);
    return svc_buf_steal(&out, NULL);
}

static svc_buf_t to_avro(const char *json) {
    svc_buf_t out;
    char      e[512] = "";
    svc_buf_init(&out, BUF_MAX);
    svc_err_t rc = sch_avro_request_from_json(json, strlen(json), &out, e, sizeof e);
    cr_assert_eq(rc, SVC_OK, "from_json(%s): %s", json, e);
    return out;
}

static char *from_avro(const sch_avro_writer_t *w, const svc_buf_t *av) {
    svc_buf_t out;
    char      e[512] = "";
    svc_buf_init(&out, BUF_MAX);
    svc_err_t rc = sch_avro_request_to_json(w, av->data, av->len, &out, e, sizeof e);
    cr_assert_eq(rc, SVC_OK, "to_json: %s", e);
    return svc_buf_steal(&out, NULL);
}

/* ---- the contract table ------------------------------------------------- */

Test(avro, contract_cases_round_trip) {
    FILE *f = fopen(D3_SOURCE_DIR "/tests/contract/cases.jsonl", "rb");
    cr_assert(f);
    char  *line = NULL;
    size_t cap = 0, n_rt = 0, n_not_json = 0, n_not_object = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t jerr;
        json_t      *c = json_loads(line, JSON_ALLOW_NUL, &jerr);
        cr_assert(c, "bad line: %s", jerr.text);
        const char    *name = json_string_value(json_object_get(c, "name"));
        json_t        *jb = json_object_get(c, "body");
        size_t         len = 0;
        unsigned char *owned = NULL;
        const char    *body;
        if (jb) {
            body = json_string_value(jb);
            len = json_string_length(jb);
        } else {
            const char *b64 = json_string_value(json_object_get(c, "body_b64"));
            owned = malloc(strlen(b64) + 1);
            cr_assert(sch_base64_decode(b64, strlen(b64), owned, &len));
            body = (const char *)owned;
        }
        sch_jfail_t fail;
        char        msg[256];
        sch_jdoc_t *doc = sch_json_parse(body, len, &fail, msg, sizeof msg);
        if (!doc) {
            n_not_json++;
        } else if (sch_json_type(sch_jdoc_root(doc)) != SCH_JSON_OBJECT) {
            /* request.avsc is a record: such a body has no Avro form. */
            svc_buf_t av;
            char      e[256] = "";
            svc_buf_init(&av, BUF_MAX);
            cr_assert_eq(sch_avro_request_from_json(body, len, &av, e, sizeof e), SVC_ERR_INVALID);
            cr_assert(strstr(e, "not a JSON object"), "%s", e);
            svc_buf_fini(&av);
            n_not_object++;
            cr_log_info("not Avro-representable (not an object): %s", name);
        } else {
            svc_buf_t av;
            char      e[512] = "";
            svc_buf_init(&av, BUF_MAX);
            cr_assert_eq(sch_avro_request_from_json(body, len, &av, e, sizeof e), SVC_OK, "%s: %s",
                         name, e);
            char *back = from_avro(NULL, &av);
            char *v1 = verdict(body, len);
            char *v2 = verdict(back, strlen(back));
            cr_expect_str_eq(v2, v1, "%s: verdict changed; rebuilt body %s", name, back);
            /* The rebuilt body is a fixed point of the mapping. */
            svc_buf_t av2 = to_avro(back);
            char     *back2 = from_avro(NULL, &av2);
            cr_expect_str_eq(back2, back, "%s: not a fixed point", name);
            free(back2);
            svc_buf_fini(&av2);
            free(v1);
            free(v2);
            free(back);
            svc_buf_fini(&av);
            n_rt++;
        }
        sch_jdoc_free(doc);
        free(owned);
        json_decref(c);
    }
    free(line);
    fclose(f);
    fprintf(stderr,
            "avro contract round trip: %zu cases round-trip with identical verdicts; %zu are not "
            "JSON (no Avro form); %zu are JSON but not objects (no Avro form)\n",
            n_rt, n_not_json, n_not_object);
    cr_assert_gt(n_rt, 200);
}

/* Open values keep Python json semantics through the JSON-text strings. */
Test(avro, open_values_exact) {
    const char *body =
        "{\"model\":\"m\",\"state\":{\"z\":1,\"a\":[NaN,123456789012345678901234567890,1.0]},"
        "\"questions\":{\"q\\u0000id\":{\"type\":\"choice\",\"instructions\":\"x\"}},"
        "\"options\":{\"deadline_ms\":1e400},\"seed\":7,\"temperature\":0.5}";
    svc_buf_t av = to_avro(body);
    char     *back = from_avro(NULL, &av);
    cr_assert_str_eq(
        back, "{\"model\":\"m\",\"state\":{\"z\":1,\"a\":[NaN,123456789012345678901234567890,"
              "1.0]},\"questions\":{\"q\\u0000id\":{\"type\":\"choice\",\"instructions\":"
              "\"x\"}},\"options\":{\"deadline_ms\":Infinity},\"seed\":7,"
              "\"temperature\":0.5}");
    free(back);
    svc_buf_fini(&av);
}

Test(avro, typed_fields_round_trip) {
    const char *body =
        "{\"model\":\"d3\",\"state\":\"s\",\"questions\":{\"a\":{\"type\":\"score\","
        "\"instructions\":{\"k\":[1,2]},\"levels\":[\"lo\",\"hi\"],\"require_full_input\":true},"
        "\"b\":{\"type\":\"noul\",\"instructions\":\"i\"}},\"images\":[\"data:image/png;base64,"
        "AA==\"],\"videos\":[],\"options\":{\"deadline_ms\":250,\"max_tokens\":2.5,"
        "\"profile\":\"exact\",\"return_meta\":false},\"states\":{\"x\":{\"state\":[1],"
        "\"questions\":{\"c\":{\"type\":\"choice\",\"instructions\":\"i\",\"criteria\":{\"p\":null,"
        "\"q\":\"d\"}}}},\"y\":5}}";
    svc_buf_t av = to_avro(body);
    char     *back = from_avro(NULL, &av);
    cr_assert_str_eq(back, body);
    free(back);
    svc_buf_fini(&av);
}

/* ---- answers ------------------------------------------------------------- */

static void answer_round_trip(const char *body) {
    svc_buf_t av, out;
    char      e[512] = "";
    svc_buf_init(&av, BUF_MAX);
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_avro_answer_from_json(body, strlen(body), &av, e, sizeof e), SVC_OK,
                 "%s (body %s)", e, body);
    cr_assert_eq(sch_avro_answer_to_json(NULL, av.data, av.len, &out, e, sizeof e), SVC_OK, "%s",
                 e);
    cr_assert_str_eq(out.data, body);
    svc_buf_fini(&av);
    svc_buf_fini(&out);
}

Test(avro, answers_from_the_encoder_round_trip) {
    const char *body =
        "{\"questions\":{\"c\":{\"type\":\"choice\",\"instructions\":\"i\",\"criteria\":{\"x\":"
        "\"X\",\"y\":null},\"require_full_input\":true},\"n\":{\"type\":\"noul\",\"instructions\":"
        "\"i\"},\"s\":{\"type\":\"score\",\"instructions\":\"i\",\"criteria\":[\"lo\",{\"l\":2}]},"
        "\"bad\":{\"type\":\"set\"},\"long\":{\"type\":\"noul\",\"instructions\":\"i\"}},"
        "\"options\":{\"return_meta\":true},\"states\":{\"two\":{\"state\":\"t\",\"questions\":{"
        "\"n2\":{\"type\":\"noul\",\"instructions\":\"i\"}}}},\"state\":\"s\"}";
    sch_limits_t   lim = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    err;
    sch_error_init(&err);
    cr_assert_eq(sch_request_decode(body, strlen(body), &lim, NULL, &req, &err), SVC_OK, "%s",
                 err.message);
    static const double p2a[] = {0.25, 0.75}, p2b[] = {0.4, 0.6}, p2c[] = {0.1, 0.9};
    sch_result_t        r0[] = {{NULL, NULL, p2a},
                                {NULL, NULL, p2b},
                                {NULL, NULL, p2c},
                                {NULL, NULL, NULL},
                                {"max_length_exceeded", "too long", NULL}};
    sch_result_t        r1[] = {{"deadline_exceeded", NULL, NULL}};
    const sch_result_t *results[] = {r0, r1};
    size_t              tokens[] = {123, 45};
    sch_meta_t meta = {"org/m", NULL, "ab12", "exact", "exact", "native", "cpu", "cpu0", 1.5, 2.25};
    svc_buf_t  out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_response_encode(req, "d3", results, tokens, &meta, &out, &err), SVC_OK);
    answer_round_trip(out.data);
    svc_buf_reset(&out);
    meta.revision = "0123456789012345678901234567890123456789";
    cr_assert_eq(sch_response_encode(req, "d3", results, tokens, &meta, &out, &err), SVC_OK);
    answer_round_trip(out.data);
    svc_buf_reset(&out);
    meta.model_sha256 = NULL; /* the identity unknown: null, as in the JSON body */
    cr_assert_eq(sch_response_encode(req, "d3", results, tokens, &meta, &out, &err), SVC_OK);
    cr_assert(strstr(out.data, "\"model_sha256\":null"), "%s", out.data);
    answer_round_trip(out.data);

    sch_error_t e2;
    sch_error_init(&e2);
    sch_error_set(&e2, 429, "overloaded", "the request queue is full; retry later");
    svc_buf_reset(&out);
    cr_assert_eq(sch_error_encode(&e2, &out), SVC_OK);
    answer_round_trip(out.data);
    sch_error_fini(&e2);
    svc_buf_fini(&out);
    sch_request_free(req);
    sch_error_fini(&err);
}

Test(avro, answers_by_hand) {
    answer_round_trip("{\"model\":\"m\",\"answers\":{\"q\":{\"type\":null,\"error\":"
                      "\"invalid_question\",\"message\":\"a question must be an object\"},\"r\":{"
                      "\"type\":[1,{\"a\":2}],\"error\":\"invalid_question\"}},\"usage\":{"
                      "\"input_tokens\":0,\"output_tokens\":0}}");
    answer_round_trip("{\"error\":{\"code\":\"invalid_request\",\"message\":\"state is "
                      "required\"}}");
    svc_buf_t av;
    char      e[256] = "";
    svc_buf_init(&av, BUF_MAX);
    cr_assert_eq(sch_avro_answer_from_json("{\"model\":\"m\",\"extra\":1}", 23, &av, e, sizeof e),
                 SVC_ERR_INVALID);
    cr_assert(strstr(e, "not the shape"), "%s", e);
    svc_buf_fini(&av);
}

/* ---- framing ------------------------------------------------------------- */

Test(avro, frame_round_trip_and_errors) {
    svc_buf_t out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_frame_write(0x01020304u, "abc", 3, &out), SVC_OK);
    cr_assert_eq(out.len, 8);
    cr_assert_eq(memcmp(out.data, "\0\1\2\3\4abc", 8), 0);
    uint32_t    id = 0;
    const void *body = NULL;
    size_t      blen = 0;
    char        e[256] = "";
    cr_assert_eq(sch_frame_parse(out.data, out.len, &id, &body, &blen, e, sizeof e), SVC_OK);
    cr_assert_eq(id, 0x01020304u);
    cr_assert_eq(blen, 3);
    cr_assert_eq(memcmp(body, "abc", 3), 0);
    /* An empty Avro body is still a frame (a record of nothing). */
    cr_assert_eq(sch_frame_parse("\0\0\0\0\1", 5, &id, &body, &blen, e, sizeof e), SVC_OK);
    cr_assert_eq(blen, 0);
    cr_assert_eq(sch_frame_parse("\0\0\0\1", 4, &id, &body, &blen, e, sizeof e), SVC_ERR_FORMAT);
    cr_assert(strstr(e, "4 bytes, shorter than the 5-byte header"), "%s", e);
    cr_assert_eq(sch_frame_parse("", 0, &id, &body, &blen, e, sizeof e), SVC_ERR_FORMAT);
    cr_assert(strstr(e, "0 bytes"), "%s", e);
    cr_assert_eq(sch_frame_parse("{\"state\":1}", 11, &id, &body, &blen, e, sizeof e),
                 SVC_ERR_FORMAT);
    cr_assert(strstr(e, "magic byte is 0x7b, expected 0x00"), "%s", e);
    svc_buf_fini(&out);
}

/* ---- schema resolution ------------------------------------------------------ */

/* request.avsc edited as an older or newer producer might have it. */
static char *edited_schema(const char *from, const char *to, const char *from2, const char *to2) {
    size_t      len;
    const char *text = sch_avro_schema_text(SCH_AVRO_REQUEST, &len);
    json_t     *s = json_loadb(text, len, 0, NULL);
    cr_assert(s);
    char *c = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    svc_buf_t b;
    svc_buf_init(&b, BUF_MAX);
    char *p = strstr(c, from);
    cr_assert(p, "%s not in schema", from);
    cr_assert_eq(svc_buf_add(&b, c, (size_t)(p - c)), SVC_OK);
    cr_assert_eq(svc_buf_adds(&b, to), SVC_OK);
    char *rest = p + strlen(from);
    if (from2) {
        char *q = strstr(rest, from2);
        cr_assert(q, "%s not in schema", from2);
        cr_assert_eq(svc_buf_add(&b, rest, (size_t)(q - rest)), SVC_OK);
        cr_assert_eq(svc_buf_adds(&b, to2), SVC_OK);
        rest = q + strlen(from2);
    }
    cr_assert_eq(svc_buf_adds(&b, rest), SVC_OK);
    free(c);
    return svc_buf_steal(&b, NULL);
}

static void set_str_field(avro_value_t *rec, const char *name, const char *s, int branch) {
    avro_value_t f, b;
    cr_assert_eq(avro_value_get_by_name(rec, name, &f, NULL), 0, "%s", name);
    if (branch < 0) {
        cr_assert_eq(avro_value_set_string(&f, s), 0);
        return;
    }
    cr_assert_eq(avro_value_set_branch(&f, branch, &b), 0);
    if (s)
        cr_assert_eq(avro_value_set_string(&b, s), 0);
}

/* Sets every union field of rec that is still unset to its null branch. */
static void nulls(avro_value_t *rec) {
    size_t n = 0;
    cr_assert_eq(avro_value_get_size(rec, &n), 0);
    for (size_t i = 0; i < n; i++) {
        avro_value_t f, b;
        int          d = -1;
        cr_assert_eq(avro_value_get_by_index(rec, i, &f, NULL), 0);
        if (avro_value_get_type(&f) == AVRO_UNION && avro_value_get_discriminant(&f, &d) == 0 &&
            d < 0)
            cr_assert_eq(avro_value_set_branch(&f, 0, &b), 0);
    }
}

/* Writes {state, questions:{q:{type choice, instructions, criteria}}} with
 * a writer schema, via avro-c directly (as a foreign producer would). */
static svc_buf_t write_with(const char *wtext, bool newer) {
    avro_schema_t ws;
    cr_assert_eq(avro_schema_from_json_length(wtext, strlen(wtext), &ws), 0, "%s", avro_strerror());
    avro_value_iface_t *cls = avro_generic_class_from_schema(ws);
    avro_value_t        v, f, m, item, q, t;
    cr_assert_eq(avro_generic_value_new(cls, &v), 0);
    set_str_field(&v, "state", "\"the state\"", 1);
    cr_assert_eq(avro_value_get_by_name(&v, "questions", &f, NULL), 0);
    cr_assert_eq(avro_value_set_branch(&f, 1, &m), 0);
    cr_assert_eq(avro_value_add(&m, "q", &item, NULL, NULL), 0);
    cr_assert_eq(avro_value_set_branch(&item, 0, &q), 0);
    cr_assert_eq(avro_value_get_by_name(&q, "type", &t, NULL), 0);
    cr_assert_eq(avro_value_set_enum(&t, 0), 0);
    set_str_field(&q, "instructions", "\"pick\"", 1);
    set_str_field(&q, "criteria", "{\"a\":null,\"b\":\"B\"}", 1);
    if (newer) {
        set_str_field(&q, "note", "ignored", -1);
        cr_assert_eq(avro_value_get_by_name(&v, "seed", &f, NULL), 0);
        cr_assert_eq(avro_value_set_long(&f, 42), 0);
    }
    nulls(&v);
    nulls(&q);
    size_t size = 0;
    cr_assert_eq(avro_value_sizeof(&v, &size), 0);
    svc_buf_t out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(svc_buf_reserve(&out, size), SVC_OK);
    avro_writer_t w = avro_writer_memory(out.data, (int64_t)size);
    cr_assert_eq(avro_value_write(w, &v), 0, "%s", avro_strerror());
    out.len = size;
    avro_writer_free(w);
    avro_value_decref(&v);
    avro_value_iface_decref(cls);
    avro_schema_decref(ws);
    return out;
}

static void expect_resolves(const char *wtext, bool newer) {
    char               e[512] = "";
    sch_avro_writer_t *w = sch_avro_writer_new(SCH_AVRO_REQUEST, wtext, strlen(wtext), e, sizeof e);
    cr_assert(w, "%s", e);
    svc_buf_t av = write_with(wtext, newer);
    char     *back = from_avro(w, &av);
    cr_assert_str_eq(back, "{\"state\":\"the state\",\"questions\":{\"q\":{\"type\":\"choice\","
                           "\"instructions\":\"pick\",\"criteria\":{\"a\":null,\"b\":\"B\"}}}}");
    free(back);
    svc_buf_fini(&av);
    sch_avro_writer_free(w);
}

Test(avro, resolution_newer_writer_with_extra_fields) {
    char *wtext = edited_schema(
        "{\"name\":\"require_full_input\"",
        "{\"name\":\"note\",\"type\":\"string\",\"default\":\"\"},{\"name\":\"require_full_input\"",
        "{\"name\":\"extra\"",
        "{\"name\":\"seed\",\"type\":\"long\",\"default\":0},{\"name\":\"extra\"");
    expect_resolves(wtext, true);
    free(wtext);
}

Test(avro, resolution_older_writer_missing_optional_fields) {
    /* No `levels` in Question and no `extra` at the top: both default null. */
    char *wtext = edited_schema(
        ",{\"name\":\"levels\",\"type\":[\"null\",\"string\"],\"default\":null,\"doc\":\"JSON "
        "text; null = absent.\"}",
        "",
        ",{\"name\":\"extra\",\"type\":[\"null\",\"string\"],\"default\":null,\"doc\":\"JSON text "
        "of an object holding the body's unknown top-level fields, in order (the decoder refuses "
        "them by name); null = none.\"}",
        "");
    cr_assert_null(strstr(wtext, "\"levels\""));
    expect_resolves(wtext, false);
    free(wtext);
}

/* Avro matches enum symbols by name: a writer whose QuestionType lists
 * them in another order, or one more, still means its own symbol (the
 * record write_with makes has the writer's symbol 0). */
Test(avro, resolution_enum_symbols_by_name) {
    static const char *const SYMS[][2] = {
        {"[\"score\",\"choice\",\"noul\"]", "score"},
        {"[\"noul\",\"score\",\"choice\"]", "noul"},
        {"[\"rank\",\"choice\",\"noul\",\"score\"]", "rank"},
    };
    for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; i++) {
        char to[128];
        snprintf(to, sizeof to, "\"symbols\":%s", SYMS[i][0]);
        char *wtext = edited_schema("\"symbols\":[\"choice\",\"noul\",\"score\"]", to, NULL, NULL);
        char  e[512] = "";
        sch_avro_writer_t *w =
            sch_avro_writer_new(SCH_AVRO_REQUEST, wtext, strlen(wtext), e, sizeof e);
        cr_assert(w, "%s", e);
        svc_buf_t av = write_with(wtext, false);
        char     *back = from_avro(w, &av);
        char      want[256];
        snprintf(want, sizeof want,
                 "{\"state\":\"the state\",\"questions\":{\"q\":{\"type\":\"%s\","
                 "\"instructions\":\"pick\",\"criteria\":{\"a\":null,\"b\":\"B\"}}}}",
                 SYMS[i][1]);
        cr_assert_str_eq(back, want, "writer symbols %s", SYMS[i][0]);
        free(back);
        svc_buf_fini(&av);
        sch_avro_writer_free(w);
        free(wtext);
    }
}

Test(avro, resolution_refuses_a_missing_required_field) {
    char *wtext = edited_schema("{\"name\":\"type\",\"type\":{\"type\":\"enum\"",
                                "{\"name\":\"kind\",\"type\":{\"type\":\"enum\"", NULL, NULL);
    char  e[512] = "";
    cr_assert_null(sch_avro_writer_new(SCH_AVRO_REQUEST, wtext, strlen(wtext), e, sizeof e));
    cr_assert(strstr(e, "lacks field \"type\""), "%s", e);
    cr_assert_null(sch_avro_writer_new(SCH_AVRO_REQUEST, "{\"type\":", 8, e, sizeof e));
    cr_assert(e[0]);
    free(wtext);
}

/* ---- corrupt bodies ----------------------------------------------------------- */

static const char *RICH =
    "{\"model\":\"m\",\"state\":{\"a\":[1,2]},\"questions\":{\"q\":{\"type\":\"choice\","
    "\"instructions\":\"i\",\"criteria\":{\"x\":\"X\",\"y\":null},\"require_full_input\":false},"
    "\"j\":[1]},\"images\":[\"data:image/png;base64,AA==\",\"b\"],\"options\":{\"deadline_ms\":"
    "10.5,\"profile\":\"exact\"},\"states\":{\"s\":{\"state\":\"t\",\"questions\":{}}},"
    "\"zz\":null}";

Test(avro, truncations_fail_cleanly) {
    svc_buf_t av = to_avro(RICH);
    for (size_t n = 0; n < av.len; n++) {
        svc_buf_t out;
        char      e[512] = "";
        svc_buf_init(&out, BUF_MAX);
        svc_err_t rc = sch_avro_request_to_json(NULL, av.data, n, &out, e, sizeof e);
        cr_assert_eq(rc, SVC_ERR_FORMAT, "truncated to %zu bytes: rc %d", n, rc);
        cr_assert(strstr(e, "avro request"), "%zu: %s", n, e);
        cr_assert_eq(out.len, 0);
        svc_buf_fini(&out);
    }
    svc_buf_fini(&av);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Random byte flips: never a crash; either a clear error or a JSON body. */
static void flip_loop(const svc_buf_t *av, bool answer) {
    uint64_t seed = 12345;
    size_t   ok = 0, bad = 0;
    char    *copy = malloc(av->len);
    for (int it = 0; it < 3000; it++) {
        memcpy(copy, av->data, av->len);
        int flips = 1 + (int)(lcg(&seed) % 3);
        for (int k = 0; k < flips; k++)
            copy[lcg(&seed) % av->len] ^= (char)(1u << (lcg(&seed) % 8));
        svc_buf_t out;
        char      e[512] = "";
        svc_buf_init(&out, BUF_MAX);
        svc_err_t rc = answer ? sch_avro_answer_to_json(NULL, copy, av->len, &out, e, sizeof e)
                              : sch_avro_request_to_json(NULL, copy, av->len, &out, e, sizeof e);
        if (rc == SVC_OK) {
            ok++;
            cr_assert(out.len > 1 && out.data[0] == '{');
        } else {
            bad++;
            cr_assert_eq(rc, SVC_ERR_FORMAT, "rc %d: %s", rc, e);
            cr_assert(e[0]);
        }
        svc_buf_fini(&out);
    }
    free(copy);
    cr_log_info("flips: %zu decoded, %zu refused", ok, bad);
    cr_assert_gt(bad, 0);
}

Test(avro, byte_flips_never_crash) {
    svc_buf_t av = to_avro(RICH);
    flip_loop(&av, false);
    svc_buf_fini(&av);
    const char *ans = "{\"model\":\"m\",\"answers\":{\"q\":{\"type\":\"choice\",\"choice\":\"a\","
                      "\"probabilities\":{\"a\":0.75,\"b\":0.25},\"confidence\":0.1887},\"e\":{"
                      "\"type\":null,\"error\":\"invalid_question\",\"message\":\"m\"}},"
                      "\"usage\":{\"input_tokens\":12,\"output_tokens\":0}}";
    char        e[256] = "";
    svc_buf_init(&av, BUF_MAX);
    cr_assert_eq(sch_avro_answer_from_json(ans, strlen(ans), &av, e, sizeof e), SVC_OK, "%s", e);
    flip_loop(&av, true);
    svc_buf_fini(&av);
}

Test(avro, hostile_lengths_are_refused_before_allocating) {
    /* model = branch 1 (string) with length 2^62: avro-c would malloc it. */
    static const unsigned char huge[] = {0x02, 0x80, 0x80, 0x80, 0x80, 0x80,
                                         0x80, 0x80, 0x80, 0x80, 0x01};
    static const unsigned char neg[] = {0x02, 0x03, 'a'};             /* length -2 */
    static const unsigned char trail[] = {0, 0, 0, 0, 0, 0, 0, 0, 0}; /* 8 nulls + 1 */
    char                       e[512] = "";
    svc_buf_t                  out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_avro_request_to_json(NULL, huge, sizeof huge, &out, e, sizeof e),
                 SVC_ERR_FORMAT);
    cr_assert(strstr(e, "varint") || strstr(e, "length"), "%s", e);
    cr_assert_eq(sch_avro_request_to_json(NULL, neg, sizeof neg, &out, e, sizeof e),
                 SVC_ERR_FORMAT);
    cr_assert(strstr(e, "negative length"), "%s", e);
    cr_assert_eq(sch_avro_request_to_json(NULL, trail, sizeof trail, &out, e, sizeof e),
                 SVC_ERR_FORMAT);
    cr_assert(strstr(e, "left over"), "%s", e);
    cr_assert_eq(sch_avro_request_to_json(NULL, trail, 8, &out, e, sizeof e), SVC_OK, "%s", e);
    cr_assert_str_eq(out.data, "{}");
    svc_buf_reset(&out);
    /* A JSON text field holding something that is not JSON. */
    static const unsigned char badtext[] = {0, 0x02, 0x06, '{', 'x', '}', 0, 0, 0, 0, 0, 0};
    cr_assert_eq(sch_avro_request_to_json(NULL, badtext, sizeof badtext, &out, e, sizeof e),
                 SVC_ERR_FORMAT);
    cr_assert(strstr(e, "field state: not JSON text"), "%s", e);
    svc_buf_fini(&out);
}

/* A registered writer schema can make values that cost no body byte: an
 * array of records of 1,000 null fields, 10,000 items in a 4-byte block.
 * The values are counted before avro-c builds any (it made 614 MB of a
 * 12-byte body): refused, whatever the item count allows. */
Test(avro, values_without_bytes_are_counted) {
    svc_buf_t f;
    svc_buf_init(&f, BUF_MAX);
    cr_assert_eq(svc_buf_adds(&f, "{\"name\":\"x\",\"type\":{\"type\":\"array\",\"items\":{"
                                  "\"type\":\"record\",\"name\":\"Nulls\",\"fields\":["),
                 SVC_OK);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(svc_buf_addf(&f, "%s{\"name\":\"n%d\",\"type\":\"null\"}", i ? "," : "", i),
                     SVC_OK);
    cr_assert_eq(svc_buf_adds(&f, "]}},\"default\":[]},"), SVC_OK);
    /* x first in the top-level record: its fields list is the first one */
    svc_buf_t to;
    svc_buf_init(&to, BUF_MAX);
    cr_assert_eq(svc_buf_adds(&to, "\"fields\":["), SVC_OK);
    cr_assert_eq(svc_buf_add(&to, f.data, f.len), SVC_OK);
    cr_assert_eq(svc_buf_addc(&to, '\0'), SVC_OK);
    char              *wtext = edited_schema("\"fields\":[", to.data, NULL, NULL);
    char               e[512] = "";
    sch_avro_writer_t *w = sch_avro_writer_new(SCH_AVRO_REQUEST, wtext, strlen(wtext), e, sizeof e);
    cr_assert(w, "%s", e);
    /* x: one block of 10,000 items (zigzag 20,000), the end, then the
     * request's fields all null */
    static const unsigned char body[] = {0xa0, 0x9c, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    svc_buf_t                  out;
    svc_buf_init(&out, BUF_MAX);
    cr_assert_eq(sch_avro_request_to_json(w, body, sizeof body, &out, e, sizeof e), SVC_ERR_FORMAT);
    cr_assert(strstr(e, "more values than allowed"), "%s", e);
    svc_buf_fini(&out);
    sch_avro_writer_free(w);
    svc_buf_fini(&to);
    svc_buf_fini(&f);
    free(wtext);
}

/* ---- the schema registry --------------------------------------------------- */

static sch_registry_t *registry_at(const fake_registry_t *s, const char *userinfo, const char *path,
                                   size_t cache_max) {
    char url[256], e[512] = "";
    snprintf(url, sizeof url, "http://%s127.0.0.1:%d%s", userinfo, s->port, path);
    sch_registry_t *reg = sch_registry_new(url, cache_max, e, sizeof e);
    cr_assert(reg, "%s", e);
    sch_registry_set_timeouts(reg, 5000, 10000, 10); /* short waits between tries */
    return reg;
}

Test(avro, registry_fetches_caches_and_decodes) {
    fake_registry_t s;
    fake_registry_start(&s);
    char url[64], e[512] = "";
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", s.port);
    sch_registry_t    *reg = registry_at(&s, "", "/", 2);
    sch_avro_writer_t *w = NULL, *w2 = NULL;
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_OK, "%s", e);
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w2, e, sizeof e), SVC_OK, "%s", e);
    cr_assert_eq(w, w2, "the second lookup is the cached writer");
    cr_assert_eq(s.hits[7], 1, "a cache hit makes no request");
    cr_assert_eq(sch_registry_n_fetches(reg), 1);

    /* A framed record written with schema 7 decodes through the writer. */
    svc_buf_t av = to_avro(RICH), framed;
    svc_buf_init(&framed, BUF_MAX);
    cr_assert_eq(sch_frame_write(7, av.data, av.len, &framed), SVC_OK);
    uint32_t    id;
    const void *body;
    size_t      blen;
    cr_assert_eq(sch_frame_parse(framed.data, framed.len, &id, &body, &blen, e, sizeof e), SVC_OK);
    svc_buf_t body_buf = {(char *)(uintptr_t)body, blen, blen, blen};
    char     *back = from_avro(w, &body_buf);
    char     *direct = from_avro(NULL, &av);
    cr_assert_str_eq(back, direct);
    free(back);
    free(direct);
    svc_buf_fini(&framed);
    svc_buf_fini(&av);
    sch_avro_writer_free(w);
    sch_avro_writer_free(w2);

    /* The registry's "not found", garbage, and the URL in the message. */
    cr_assert_eq(sch_registry_writer(reg, 404, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_INVALID);
    cr_assert(strstr(e, "/schemas/ids/404: HTTP 404"), "%s", e);
    cr_assert(strstr(e, url), "%s", e);
    cr_assert_eq(sch_registry_writer(reg, 8, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_FORMAT);
    cr_assert(strstr(e, "HTTP 200 but not {\"schema\""), "%s", e);
    cr_assert_eq(s.hits[8], 1, "a 200 is not tried again");
    cr_assert_eq(sch_registry_writer(reg, 8, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_FORMAT);
    cr_assert_eq(s.hits[8], 2, "a bad answer is not remembered");

    /* Eviction (a cache of 2): 7 is the least recently used when 11
     * arrives; a writer the caller still holds outlives its eviction. */
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_OK, "%s", e);
    cr_assert_eq(sch_registry_writer(reg, 10, SCH_AVRO_REQUEST, &w2, e, sizeof e), SVC_OK);
    sch_avro_writer_free(w2);
    cr_assert_eq(sch_registry_writer(reg, 11, SCH_AVRO_REQUEST, &w2, e, sizeof e), SVC_OK);
    sch_avro_writer_free(w2);
    cr_assert_eq(s.hits[7], 1);
    av = to_avro(RICH);
    back = from_avro(w, &av);
    cr_assert(strstr(back, "\"model\":\"m\""));
    free(back);
    svc_buf_fini(&av);
    sch_avro_writer_free(w);
    cr_assert_eq(sch_registry_writer(reg, 10, SCH_AVRO_REQUEST, &w2, e, sizeof e), SVC_OK);
    sch_avro_writer_free(w2);
    cr_assert_eq(s.hits[10], 1, "10 stayed cached");
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w2, e, sizeof e), SVC_OK);
    sch_avro_writer_free(w2);
    cr_assert_eq(s.hits[7], 2, "7 was evicted and is fetched again");
    sch_registry_free(reg);
    fake_registry_stop(&s);
}

/* A 40403 is a verdict, remembered for a while; a flood of records with an
 * unknown id asks once. */
Test(avro, registry_remembers_not_found) {
    fake_registry_t s;
    fake_registry_start(&s);
    char               e[512] = "";
    sch_registry_t    *reg = registry_at(&s, "", "", 0);
    sch_avro_writer_t *w = NULL;
    for (int i = 0; i < 50; i++)
        cr_assert_eq(sch_registry_writer(reg, 5, SCH_AVRO_REQUEST, &w, e, sizeof e),
                     SVC_ERR_INVALID);
    cr_assert_eq(s.hits[0], 1, "asked once, %d times", s.hits[0]);
    cr_assert(strstr(e, "has no schema 5") && strstr(e, "40403"), "%s", e);
    /* Other ids are still asked; a known one is still found. */
    cr_assert_eq(sch_registry_writer(reg, 6, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_INVALID);
    cr_assert_eq(s.hits[0], 2);
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_OK, "%s", e);
    sch_avro_writer_free(w);
    sch_registry_free(reg);
    fake_registry_stop(&s);
}

/* Only the registry's own "not found" is a verdict: an HTML 404 (a wrong
 * base path, a proxy) would dead-letter a whole stream. */
Test(avro, registry_other_404_is_not_a_verdict) {
    fake_registry_t s;
    fake_registry_start(&s);
    char               e[512] = "";
    sch_registry_t    *reg = registry_at(&s, "", "/wrong/prefix", 0);
    sch_avro_writer_t *w = NULL;
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_IO);
    cr_assert(strstr(e, "HTTP 404") && strstr(e, "base URL"), "%s", e);
    cr_assert_eq(s.hits[3], 1, "a 404 is not tried again");
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_IO);
    cr_assert_eq(s.hits[3], 2, "nor remembered");
    sch_registry_free(reg);
    fake_registry_stop(&s);
}

Test(avro, registry_oversized_answer) {
    fake_registry_t s;
    fake_registry_start(&s);
    char               e[512] = "";
    sch_registry_t    *reg = registry_at(&s, "", "", 0);
    sch_avro_writer_t *w = NULL;
    cr_assert_eq(sch_registry_writer(reg, 12, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_FORMAT);
    cr_assert(strstr(e, "answer exceeds 262144 bytes"), "%s", e);
    cr_assert_eq(s.hits[12], 1);
    sch_registry_free(reg);
    fake_registry_stop(&s);
}

/* 5xx: tried again, and a registry that recovers within the tries answers. */
Test(avro, registry_retries_5xx) {
    fake_registry_t s;
    fake_registry_start(&s);
    char               e[512] = "";
    sch_registry_t    *reg = registry_at(&s, "", "", 0);
    sch_avro_writer_t *w = NULL;
    cr_assert_eq(sch_registry_writer(reg, 13, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_OK, "%s", e);
    cr_assert_eq(s.hits[13], 2, "one 503, then the schema");
    sch_avro_writer_free(w);
    cr_assert_eq(sch_registry_writer(reg, 14, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_IO);
    cr_assert_eq(s.hits[14], 3);
    cr_assert(strstr(e, "HTTP 503 (3 tries)"), "%s", e);
    sch_registry_free(reg);
    fake_registry_stop(&s);
}

/* Credentials in the URL are sent, and masked in every message (they end up
 * in error answers and dead letters). */
Test(avro, registry_masks_the_password) {
    fake_registry_t s;
    fake_registry_start(&s);
    char               e[512] = "";
    sch_registry_t    *reg = registry_at(&s, "alice:s3cr3t@", "", 0);
    sch_avro_writer_t *w = NULL;
    cr_assert_eq(sch_registry_writer(reg, 15, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_OK, "%s", e);
    sch_avro_writer_free(w);
    cr_assert_str_eq(s.auth, "Basic YWxpY2U6czNjcjN0", "curl sends user:pass");
    cr_assert_eq(sch_registry_writer(reg, 5, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_INVALID);
    cr_assert(strstr(e, "http://alice:****@127.0.0.1:") && !strstr(e, "s3cr3t"), "%s", e);
    cr_assert_eq(sch_registry_writer(reg, 5, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_INVALID);
    cr_assert(!strstr(e, "s3cr3t"), "remembered: %s", e);
    sch_registry_free(reg);
    fake_registry_stop(&s);

    /* No answer at all: curl's own message is not used (it may quote the URL). */
    reg = registry_at(&s, "alice:s3cr3t@", "", 0);
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_IO);
    cr_assert(strstr(e, "(3 tries)") && !strstr(e, "s3cr3t"), "%s", e);
    cr_assert_eq(sch_registry_register(reg, "x-value", "{}", 2, &(uint32_t){0}, e, sizeof e),
                 SVC_ERR_IO);
    cr_assert(!strstr(e, "s3cr3t"), "%s", e);
    sch_registry_free(reg);
}

Test(avro, registry_bad_urls) {
    static const char *const bad[] = {"ftp://h:21", "not a url", "http://", "file:///etc"};
    char                     e[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e[0] = '\0';
        cr_assert_null(sch_registry_new(bad[i], 0, e, sizeof e), "%s", bad[i]);
        cr_assert(strstr(e, "not an http:// or https:// URL"), "%s: %s", bad[i], e);
    }
    char long_url[4096];
    snprintf(long_url, sizeof long_url, "http://h/%04000d", 0);
    cr_assert_null(sch_registry_new(long_url, 0, e, sizeof e));
    cr_assert(strstr(e, "longer than"), "%s", e);
}

Test(avro, registry_timeout_and_unreachable) {
    fake_registry_t s;
    fake_registry_start(&s);
    char url[64], e[512] = "";
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
    sch_registry_t *reg = sch_registry_new(url, 0, e, sizeof e);
    sch_registry_set_timeouts(reg, 5000, 300, 10);
    sch_avro_writer_t *w = NULL;
    cr_assert_eq(sch_registry_writer(reg, 9, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_IO);
    cr_assert(strstr(e, "/schemas/ids/9 failed") && strstr(e, "imeout"), "%s", e);
    sch_registry_free(reg);
    fake_registry_stop(&s);

    /* Nothing listens on the port any more. */
    reg = sch_registry_new(url, 0, e, sizeof e);
    sch_registry_set_timeouts(reg, 5000, 10000, 10);
    cr_assert_eq(sch_registry_writer(reg, 7, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_IO);
    cr_assert(strstr(e, url), "%s", e);
    sch_registry_free(reg);
}

Test(avro, registry_register) {
    fake_registry_t s;
    fake_registry_start(&s);
    char            e[512] = "";
    sch_registry_t *reg = registry_at(&s, "", "", 0);
    uint32_t        id = 0;
    size_t          len;
    const char     *text = sch_avro_schema_text(SCH_AVRO_ANSWER, &len);
    cr_assert_eq(sch_registry_register(reg, "d3 answers-value", text, len, &id, e, sizeof e),
                 SVC_OK, "%s", e);
    cr_assert_eq(id, REG_ANSWER_ID);
    cr_assert_str_eq(s.subject, "d3%20answers-value", "the subject is escaped");
    cr_assert_eq(sch_registry_register(reg, "bad", text, len, &id, e, sizeof e), SVC_ERR_IO);
    cr_assert(strstr(e, "HTTP 409"), "%s", e);
    sch_registry_free(reg);
    fake_registry_stop(&s);

    reg = sch_registry_new(NULL, 0, e, sizeof e);
    cr_assert_eq(sch_registry_register(reg, "x", text, len, &id, e, sizeof e), SVC_ERR_INVALID);
    sch_registry_free(reg);
}

Test(avro, no_registry_uses_fixed_ids) {
    char            e[512] = "";
    sch_registry_t *reg = sch_registry_new(NULL, 0, e, sizeof e);
    cr_assert(reg);
    sch_avro_writer_t *w = NULL;
    cr_assert_eq(sch_registry_writer(reg, SCH_AVRO_ID_REQUEST, SCH_AVRO_REQUEST, &w, e, sizeof e),
                 SVC_OK, "%s", e);
    svc_buf_t av = to_avro(RICH);
    char     *a = from_avro(w, &av), *b = from_avro(NULL, &av);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
    svc_buf_fini(&av);
    sch_avro_writer_free(w);
    cr_assert_eq(sch_registry_writer(reg, SCH_AVRO_ID_ANSWER, SCH_AVRO_ANSWER, &w, e, sizeof e),
                 SVC_OK);
    sch_avro_writer_free(w);
    cr_assert_eq(sch_registry_writer(reg, 5, SCH_AVRO_REQUEST, &w, e, sizeof e), SVC_ERR_INVALID);
    cr_assert(strstr(e, "schema id 5 is unknown: no schema registry is configured"), "%s", e);
    cr_assert_eq(sch_registry_n_fetches(reg), 0);
    sch_registry_free(reg);
}
