/*
 * test_schemas_json.c -- the JSON reader and writers of schemas/sch_json.c
 * against Python 3.11's json module and repr(float) (SPEC a.1, b.3, c.4).
 *
 * Expected texts come from python3: the literal tables below were printed by
 * it, and tests/golden/json/{parse,doubles}.txt are written by
 * tests/tools/gen_json_golden.py (rerun it, never edit them by hand).
 */
#include <criterion/criterion.h>
#include <math.h>

#include "schemas.h"

#ifndef D3_SOURCE_DIR
#define D3_SOURCE_DIR "."
#endif

#define MSG_SIZE 512

/* ---- helpers ------------------------------------------------------------ */

static sch_jdoc_t *parse_ok(const char *text, size_t len) {
    sch_jfail_t fail = SCH_JFAIL_NOMEM;
    char        msg[MSG_SIZE];
    sch_jdoc_t *doc = sch_json_parse(text, len, &fail, msg, sizeof msg);
    cr_assert_not_null(doc, "parse failed (%d): %s", (int)fail, msg);
    cr_assert_eq(fail, SCH_JFAIL_NONE);
    return doc;
}

static sch_jdoc_t *parse_s(const char *text) {
    return parse_ok(text, strlen(text));
}

/* Expects a failure of kind `want` with message `want_msg`. */
static void parse_fails(const char *text, size_t len, sch_jfail_t want, const char *want_msg) {
    sch_jfail_t fail = SCH_JFAIL_NONE;
    char        msg[MSG_SIZE];
    sch_jdoc_t *doc = sch_json_parse(text, len, &fail, msg, sizeof msg);
    cr_assert_null(doc, "parse of \"%.*s\" should fail", (int)len, text);
    cr_assert_eq(fail, want, "kind %d, want %d (%s) for \"%.*s\"", (int)fail, (int)want, msg,
                 (int)len, text);
    cr_assert_str_eq(msg, want_msg, "for \"%.*s\"", (int)len, text);
}

typedef svc_err_t (*dump_fn)(const sch_json_t *v, svc_buf_t *out);

/* Dumps v with fn into a NUL-terminated heap string (len in *len). */
static char *dump_with(dump_fn fn, const sch_json_t *v, size_t *len) {
    svc_buf_t out;
    svc_buf_init(&out, 1u << 26);
    cr_assert_eq(fn(v, &out), SVC_OK);
    return svc_buf_steal(&out, len);
}

static void assert_dump(dump_fn fn, const sch_json_t *v, const char *want, size_t want_len) {
    size_t len = 0;
    char  *got = dump_with(fn, v, &len);
    cr_assert(len == want_len && memcmp(got, want, len) == 0, "dump \"%s\", want \"%.*s\"", got,
              (int)want_len, want);
    free(got);
}

static void assert_dump_s(dump_fn fn, const sch_json_t *v, const char *want) {
    assert_dump(fn, v, want, strlen(want));
}

static char *double_repr(double d) {
    svc_buf_t out;
    svc_buf_init(&out, 64);
    cr_assert_eq(sch_json_write_double(&out, d), SVC_OK);
    return svc_buf_steal(&out, NULL);
}

static char *string_literal(const char *s, size_t len) {
    svc_buf_t out;
    svc_buf_init(&out, 4096);
    cr_assert_eq(sch_json_write_string(&out, s, len), SVC_OK);
    return svc_buf_steal(&out, NULL);
}

/* ---- error messages ----------------------------------------------------- */

typedef struct fail_case {
    const char *text;
    size_t      len;
    sch_jfail_t fail;
    const char *msg;
} fail_case_t;

/* Printed by python3 -c 'json.loads(b.decode("utf-8"))' for each input. */
static const fail_case_t fail_cases[] = {
    {"", 0, SCH_JFAIL_SYNTAX, "Expecting value: line 1 column 1 (char 0)"},
    {"   ", 3, SCH_JFAIL_SYNTAX, "Expecting value: line 1 column 4 (char 3)"},
    {"\xef\xbb\xbf{}", 5, SCH_JFAIL_SYNTAX,
     "Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)"},
    {"{", 1, SCH_JFAIL_SYNTAX,
     "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"},
    {"{\"a\" 1}", 7, SCH_JFAIL_SYNTAX, "Expecting ':' delimiter: line 1 column 6 (char 5)"},
    {"{\"a\":1 \"b\":2}", 13, SCH_JFAIL_SYNTAX,
     "Expecting ',' delimiter: line 1 column 8 (char 7)"},
    {"[1 2]", 5, SCH_JFAIL_SYNTAX, "Expecting ',' delimiter: line 1 column 4 (char 3)"},
    {"\"abc", 4, SCH_JFAIL_SYNTAX, "Unterminated string starting at: line 1 column 1 (char 0)"},
    {"\"a\x01b\"", 5, SCH_JFAIL_SYNTAX, "Invalid control character at: line 1 column 3 (char 2)"},
    {"\"\\x\"", 4, SCH_JFAIL_SYNTAX, "Invalid \\escape: line 1 column 2 (char 1)"},
    {"\"\\u12x4\"", 8, SCH_JFAIL_SYNTAX, "Invalid \\uXXXX escape: line 1 column 3 (char 2)"},
    {"\"\\ud800\\u12x4\"", 14, SCH_JFAIL_SYNTAX,
     "Invalid \\uXXXX escape: line 1 column 9 (char 8)"},
    {"\"\\u12\"", 6, SCH_JFAIL_SYNTAX, "Invalid \\uXXXX escape: line 1 column 3 (char 2)"},
    {"[1] x", 5, SCH_JFAIL_SYNTAX, "Extra data: line 1 column 5 (char 4)"},
    {"[1,]", 4, SCH_JFAIL_SYNTAX, "Expecting value: line 1 column 4 (char 3)"},
    {"{\"a\":1,}", 8, SCH_JFAIL_SYNTAX,
     "Expecting property name enclosed in double quotes: line 1 column 8 (char 7)"},
    {"[\n  1,\n  ]", 10, SCH_JFAIL_SYNTAX, "Expecting value: line 3 column 3 (char 9)"},
    {"[\"\xc3\xa9\xc3\xa9\", 1 x]", 13, SCH_JFAIL_SYNTAX,
     "Expecting ',' delimiter: line 1 column 10 (char 9)"},
    {"-Inf", 4, SCH_JFAIL_SYNTAX, "Expecting value: line 1 column 1 (char 0)"},
    {"1.", 2, SCH_JFAIL_SYNTAX, "Extra data: line 1 column 2 (char 1)"},
    {"01", 2, SCH_JFAIL_SYNTAX, "Extra data: line 1 column 2 (char 1)"},
    {"\xff", 1, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"},
    {"\xc3", 1, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xc3 in position 0: unexpected end of data"},
    {"\xc3(", 2, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xc3 in position 0: invalid continuation byte"},
    {"\xed\xa0\x80", 3, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xed in position 0: invalid continuation byte"},
    {"\xc0\xaf", 2, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xc0 in position 0: invalid start byte"},
    {"\xe0\x80\xaf", 3, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xe0 in position 0: invalid continuation byte"},
    {"\xf4\x90\x80\x80", 4, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xf4 in position 0: invalid continuation byte"},
    {"ab\xe2\x82", 4, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode bytes in position 2-3: unexpected end of data"},
    {"\xe2\x82(", 3, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode bytes in position 0-1: invalid continuation byte"},
    {"\xf0\x9f\x98", 3, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode bytes in position 0-2: unexpected end of data"},
    {"{\"a\":1}\xff", 8, SCH_JFAIL_UTF8,
     "'utf-8' codec can't decode byte 0xff in position 7: invalid start byte"},
    {"\"\\ud800\"", 8, SCH_JFAIL_SURROGATE, "the request contains an unpaired surrogate"},
    {"[\"\\udc00\", 1]", 13, SCH_JFAIL_SURROGATE, "the request contains an unpaired surrogate"},
    {"[\"\\ud800\" 1]", 12, SCH_JFAIL_SYNTAX,
     "Expecting ',' delimiter: line 1 column 11 (char 10)"},
};

Test(schemas_json, error_messages_are_pythons) {
    for (size_t i = 0; i < sizeof fail_cases / sizeof fail_cases[0]; i++) {
        const fail_case_t *c = &fail_cases[i];
        parse_fails(c->text, c->len, c->fail, c->msg);
    }
}

/* json.loads raises ValueError past sys.get_int_max_str_digits() (4300), and
 * upstream reports it as not JSON; the sign is not a digit. */
Test(schemas_json, integer_digit_limit) {
    char text[4400];
    text[0] = '-';
    memset(text + 1, '1', 4301);
    parse_fails(text, 4302, SCH_JFAIL_SYNTAX,
                "Exceeds the limit (4300 digits) for integer string conversion: value has 4301 "
                "digits; use sys.set_int_max_str_digits() to increase the limit");
    sch_jdoc_t *doc = parse_ok(text, 4301); /* 4300 digits */
    size_t      len = 0;
    sch_json_int_text(sch_jdoc_root(doc), &len);
    cr_assert_eq(len, 4301);
    cr_assert(isinf(sch_json_number(sch_jdoc_root(doc))));
    sch_jdoc_free(doc);
}

Test(schemas_json, message_buffer_optional_and_truncated) {
    sch_jfail_t fail = SCH_JFAIL_NONE;
    cr_assert_null(sch_json_parse("[", 1, &fail, NULL, 0));
    cr_assert_eq(fail, SCH_JFAIL_SYNTAX);
    char msg[10];
    cr_assert_null(sch_json_parse("[", 1, &fail, msg, sizeof msg));
    cr_assert_str_eq(msg, "Expecting");
}

/* ---- golden files ------------------------------------------------------- */

static int hex_nibble(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    return c - 'a' + 10;
}

/* "=" is the empty string, "-" none; returns a heap copy with its length. */
static char *unhex(const char *h, size_t *len) {
    size_t n = strcmp(h, "=") == 0 ? 0 : strlen(h) / 2;
    char  *out = malloc(n + 1);
    cr_assert_not_null(out);
    for (size_t i = 0; i < n; i++)
        out[i] = (char)(hex_nibble(h[2 * i]) << 4 | hex_nibble(h[2 * i + 1]));
    out[n] = '\0';
    *len = n;
    return out;
}

static sch_jfail_t kind_of(const char *kind) {
    if (strcmp(kind, "OK") == 0)
        return SCH_JFAIL_NONE;
    if (strcmp(kind, "UTF8") == 0)
        return SCH_JFAIL_UTF8;
    if (strcmp(kind, "SURROGATE") == 0)
        return SCH_JFAIL_SURROGATE;
    cr_assert_str_eq(kind, "SYNTAX");
    return SCH_JFAIL_SYNTAX;
}

/* One line of parse.txt: KIND, input, then dump_py and canonical (OK) or
 * the message. */
static void check_parse_line(char *line, size_t lineno) {
    char *fields[4];
    for (int f = 0; f < 4; f++) {
        fields[f] = line;
        line += strcspn(line, "\t\n");
        cr_assert(*line != '\0', "parse.txt:%zu: 4 fields", lineno);
        *line++ = '\0';
    }
    size_t      in_len = 0;
    size_t      a_len = 0;
    char       *in = unhex(fields[1], &in_len);
    char       *a = unhex(fields[2], &a_len);
    sch_jfail_t want = kind_of(fields[0]);
    if (want != SCH_JFAIL_NONE) {
        parse_fails(in, in_len, want, a);
    } else {
        size_t      b_len = 0;
        char       *b = unhex(fields[3], &b_len);
        sch_jdoc_t *doc = parse_ok(in, in_len);
        assert_dump(sch_json_dump_py, sch_jdoc_root(doc), a, a_len);
        assert_dump(sch_json_dump_canonical, sch_jdoc_root(doc), b, b_len);
        sch_jdoc_free(doc);
        free(b);
    }
    free(in);
    free(a);
}

static FILE *open_golden(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/json/%s", D3_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "open \"%s\": %s (run tests/tools/gen_json_golden.py)", path,
                       strerror(errno));
    return f;
}

Test(schemas_json, golden_parse_and_dump) {
    FILE  *f = open_golden("parse.txt");
    char  *line = NULL;
    size_t cap = 0;
    size_t n = 0;
    while (getline(&line, &cap, f) > 0)
        check_parse_line(line, ++n);
    free(line);
    fclose(f);
    cr_assert_gt(n, 800, "parse.txt has %zu cases", n);
}

Test(schemas_json, golden_doubles_repr) {
    FILE  *f = open_golden("doubles.txt");
    char   want[64];
    char   hex[17];
    size_t n = 0;
    while (fscanf(f, "%16s %63s", hex, want) == 2) {
        uint64_t bits = strtoull(hex, NULL, 16);
        double   d;
        memcpy(&d, &bits, sizeof d);
        char *got = double_repr(d);
        cr_assert_str_eq(got, want, "repr of bits %s", hex);
        free(got);
        n++;
    }
    fclose(f);
    cr_assert_gt(n, 5000, "doubles.txt has %zu values", n);
}

/* ---- values ------------------------------------------------------------- */

Test(schemas_json, duplicate_key_keeps_first_position_last_value) {
    sch_jdoc_t       *doc = parse_s("{\"b\":1,\"a\":2,\"b\":3,\"a\":{\"x\":4},\"c\":5}");
    const sch_json_t *root = sch_jdoc_root(doc);
    cr_assert_eq(sch_json_type(root), SCH_JSON_OBJECT);
    cr_assert_eq(sch_json_size(root), 3);
    static const char *keys[] = {"b", "a", "c"};
    for (size_t i = 0; i < 3; i++) {
        size_t      len = 0;
        const char *k = sch_json_key_at(root, i, &len);
        cr_assert(len == 1 && k[0] == keys[i][0], "key %zu", i);
    }
    size_t      len = 0;
    const char *three = sch_json_int_text(sch_json_get(root, "b", 1), &len);
    cr_assert(len == 1 && three[0] == '3');
    const sch_json_t *a = sch_json_get(root, "a", 1);
    cr_assert_eq(sch_json_type(a), SCH_JSON_OBJECT);
    cr_assert_not_null(sch_json_get(a, "x", 1));
    cr_assert_eq(sch_json_at(root, 1), a);
    assert_dump_s(sch_json_dump_py, root, "{\"b\": 3, \"a\": {\"x\": 4}, \"c\": 5}");
    sch_jdoc_free(doc);
}

Test(schemas_json, big_integers_kept_as_text) {
    const char       *text = "[123456789012345678901234567890, -0, 0, -17, 1e2, 10]";
    sch_jdoc_t       *doc = parse_s(text);
    const sch_json_t *root = sch_jdoc_root(doc);
    size_t            len = 0;
    const char       *big = sch_json_int_text(sch_json_at(root, 0), &len);
    cr_assert(len == 30 && memcmp(big, "123456789012345678901234567890", 30) == 0);
    cr_assert_float_eq(sch_json_number(sch_json_at(root, 0)), 1.2345678901234568e29, 1e14);
    cr_assert_str_eq(sch_json_int_text(sch_json_at(root, 1), NULL), "-0"); /* as written */
    cr_assert_eq(sch_json_type(sch_json_at(root, 4)), SCH_JSON_REAL);
    cr_assert_eq(sch_json_number(sch_json_at(root, 4)), 100.0);
    cr_assert_eq(sch_json_number(sch_json_at(root, 3)), -17.0);
    assert_dump_s(sch_json_dump_py, root, "[123456789012345678901234567890, 0, 0, -17, 100.0, 10]");
    sch_jdoc_free(doc);
}

Test(schemas_json, strings_keep_nul_and_utf8) {
    static const char text[] = "{\"k\\u0000y\":\"a\\u0000b\",\"k\":\"\xc3\xa9\\u00e9\"}";
    sch_jdoc_t       *doc = parse_ok(text, sizeof text - 1);
    const sch_json_t *root = sch_jdoc_root(doc);
    const sch_json_t *v = sch_json_get(root, "k\0y", 3);
    cr_assert_not_null(v);
    size_t      len = 0;
    const char *s = sch_json_string(v, &len);
    cr_assert(len == 3 && memcmp(s, "a\0b", 3) == 0);
    cr_assert_null(sch_json_get(root, "k", 0));
    s = sch_json_string(sch_json_get(root, "k", 1), &len);
    cr_assert(len == 4 && memcmp(s, "\xc3\xa9\xc3\xa9", 4) == 0);
    size_t klen = 0;
    sch_json_key_at(root, 0, &klen);
    cr_assert_eq(klen, 3);
    sch_jdoc_free(doc);
}

Test(schemas_json, surrogates) {
    /* A pair is one code point; a lone one is valid JSON for Python but
     * refused by upstream, unless a syntax error comes first. */
    sch_jdoc_t *doc = parse_s("\"\\ud83d\\ude00\\uD83D\\uDE00x\"");
    size_t      len = 0;
    const char *s = sch_json_string(sch_jdoc_root(doc), &len);
    cr_assert(len == 9 && memcmp(s, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80x", 9) == 0);
    sch_jdoc_free(doc);
    static const char *lone[] = {
        "\"\\ud800\"",          "\"\\udfff\"",        "{\"\\ud800\": 1}",
        "\"\\ud800\\u0041\"",   "\"\\ude00\\ud83d\"", "[\"\\ud83d\", \"\\ude00\"]",
        "\"\\ud800\\\\u0041\"",
    };
    for (size_t i = 0; i < sizeof lone / sizeof lone[0]; i++)
        parse_fails(lone[i], strlen(lone[i]), SCH_JFAIL_SURROGATE,
                    "the request contains an unpaired surrogate");
    parse_fails("[\"\\ud800\", x]", 13, SCH_JFAIL_SYNTAX,
                "Expecting value: line 1 column 12 (char 11)");
    /* Upstream re-encodes the parsed body: a repeated key's replaced value
     * does not count, its kept one does. */
    static const char *dropped[] = {
        "{\"a\": \"\\ud800\", \"a\": \"ok\"}",
        "{\"s\": {\"a\": [\"\\udc00\"], \"a\": 1}, \"t\": \"\\ud83d\\ude00\"}",
    };
    for (size_t i = 0; i < sizeof dropped / sizeof dropped[0]; i++)
        sch_jdoc_free(parse_s(dropped[i]));
    static const char kept[] = "{\"a\": \"ok\", \"b\": 2, \"a\": \"\\ud800\"}";
    parse_fails(kept, strlen(kept), SCH_JFAIL_SURROGATE,
                "the request contains an unpaired surrogate");
}

Test(schemas_json, literals_and_non_finite) {
    sch_jdoc_t *doc =
        parse_s("[null, true, false, NaN, Infinity, -Infinity, 1e400, -1e400, 1e-400]");
    const sch_json_t *root = sch_jdoc_root(doc);
    cr_assert_eq(sch_json_type(sch_json_at(root, 0)), SCH_JSON_NULL);
    cr_assert(sch_json_bool(sch_json_at(root, 1)));
    cr_assert(!sch_json_bool(sch_json_at(root, 2)));
    cr_assert(isnan(sch_json_number(sch_json_at(root, 3))));
    cr_assert(isinf(sch_json_number(sch_json_at(root, 6))));
    cr_assert_eq(sch_json_number(sch_json_at(root, 7)), -INFINITY);
    cr_assert_eq(sch_json_number(sch_json_at(root, 8)), 0.0);
    cr_assert(!sch_json_all_finite(root));
    assert_dump_s(sch_json_dump_py, root,
                  "[null, true, false, NaN, Infinity, -Infinity, Infinity, -Infinity, 0.0]");
    sch_jdoc_free(doc);
    doc = parse_s("{\"a\": [1, 2.5, {\"b\": \"NaN\"}], \"c\": 123456789012345678901234567890}");
    cr_assert(sch_json_all_finite(sch_jdoc_root(doc)));
    sch_jdoc_free(doc);
    doc = parse_s("{\"a\": [1, 2.5, {\"b\": NaN}]}");
    cr_assert(!sch_json_all_finite(sch_jdoc_root(doc)));
    sch_jdoc_free(doc);
}

Test(schemas_json, truthiness_is_python_bool) {
    static const struct {
        const char *text;
        bool        truthy;
    } cases[] = {
        {"null", false},
        {"false", false},
        {"true", true},
        {"0", false},
        {"-0", false},
        {"7", true},
        {"-1", true},
        {"0.0", false},
        {"-0.0", false},
        {"0e5", false},
        {"1e-400", false},
        {"0.5", true},
        {"NaN", true},
        {"-Infinity", true},
        {"\"\"", false},
        {"\" \"", true},
        {"\"0\"", true},
        {"[]", false},
        {"[0]", true},
        {"{}", false},
        {"{\"\": null}", true},
        {"\"\\u0000\"", true},
        {"100000000000000000000000", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sch_jdoc_t *doc = parse_s(cases[i].text);
        cr_assert_eq(sch_json_truthy(sch_jdoc_root(doc)), cases[i].truthy, "bool(%s)",
                     cases[i].text);
        sch_jdoc_free(doc);
    }
}

Test(schemas_json, accessors_on_other_types) {
    sch_jdoc_t       *doc = parse_s("[\"s\", 1, {}]");
    const sch_json_t *root = sch_jdoc_root(doc);
    cr_assert_eq(sch_json_size(sch_json_at(root, 0)), 0);
    cr_assert_eq(sch_json_size(sch_json_at(root, 2)), 0);
    cr_assert_null(sch_json_get(root, "s", 1));
    cr_assert_null(sch_json_get(sch_json_at(root, 2), "", 0));
    cr_assert_eq(sch_json_type(sch_json_at(root, 1)), SCH_JSON_INT);
    sch_jdoc_free(doc);
}

/* Above JSON_LINEAR_KEYS the lookup bisects a sorted index. */
Test(schemas_json, large_object_lookup) {
    enum { N = 5000 };
    svc_buf_t text;
    svc_buf_init(&text, 1u << 20);
    cr_assert_eq(svc_buf_addc(&text, '{'), SVC_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(svc_buf_addf(&text, "%s\"k%d\": %d", i ? ", " : "", (i * 7919) % N, i),
                     SVC_OK);
    /* a repeat of the first key, at the end */
    cr_assert_eq(svc_buf_adds(&text, ", \"k0\": -1}"), SVC_OK);
    sch_jdoc_t       *doc = parse_ok(text.data, text.len);
    const sch_json_t *root = sch_jdoc_root(doc);
    cr_assert_eq(sch_json_size(root), N);
    for (int i = 0; i < N; i++) {
        char              key[16];
        int               n = snprintf(key, sizeof key, "k%d", (i * 7919) % N);
        const sch_json_t *v = sch_json_get(root, key, (size_t)n);
        cr_assert_not_null(v, "key %s", key);
        cr_assert_eq(sch_json_number(v), i == 0 ? -1.0 : (double)i, "key %s", key);
        cr_assert_eq(sch_json_at(root, (size_t)i), v);
    }
    cr_assert_null(sch_json_get(root, "k", 1));
    cr_assert_null(sch_json_get(root, "k50000", 6));
    cr_assert_null(sch_json_get(root, "", 0));
    sch_jdoc_free(doc);
    svc_buf_fini(&text);
}

/* ---- depth -------------------------------------------------------------- */

/* depth times `open`, a 1, depth times `close`. */
static char *nested(size_t depth, const char *open, const char *close, size_t *len) {
    size_t no = strlen(open);
    size_t nc = strlen(close);
    char  *s = malloc(depth * (no + nc) + 2);
    cr_assert_not_null(s);
    for (size_t i = 0; i < depth; i++)
        memcpy(s + i * no, open, no);
    s[depth * no] = '1';
    for (size_t i = 0; i < depth; i++)
        memcpy(s + depth * no + 1 + i * nc, close, nc);
    *len = depth * (no + nc) + 1;
    s[*len] = '\0';
    return s;
}

Test(schemas_json, depth_limit) {
    static const char  *opens[] = {"[", "{\"a\":", "[{\"a\":"};
    static const char  *closes[] = {"]", "}", "}]"};
    static const size_t per[] = {1, 1, 2}; /* levels per open */
    for (size_t k = 0; k < 3; k++) {
        size_t      len = 0;
        size_t      ok_reps = SCH_JSON_MAX_DEPTH / per[k];
        char       *s = nested(ok_reps, opens[k], closes[k], &len);
        sch_jdoc_t *doc = parse_ok(s, len);
        svc_buf_t   out;
        svc_buf_init(&out, 1u << 20);
        cr_assert_eq(sch_json_dump_py(sch_jdoc_root(doc), &out), SVC_OK);
        cr_assert_eq(sch_json_dump_canonical(sch_jdoc_root(doc), &out), SVC_OK);
        cr_assert(sch_json_truthy(sch_jdoc_root(doc)));
        cr_assert(sch_json_all_finite(sch_jdoc_root(doc)));
        svc_buf_fini(&out);
        sch_jdoc_free(doc);
        free(s);
        s = nested(ok_reps + 1, opens[k], closes[k], &len);
        parse_fails(s, len, SCH_JFAIL_TOO_DEEP, "nesting deeper than 256 levels");
        free(s);
    }
}

Test(schemas_json, hostile_nesting_never_crashes) {
    size_t n = 100000;
    char  *s = malloc(n);
    cr_assert_not_null(s);
    memset(s, '[', n);
    parse_fails(s, n, SCH_JFAIL_TOO_DEEP, "nesting deeper than 256 levels");
    memset(s, '{', n);
    parse_fails(s, n, SCH_JFAIL_SYNTAX,
                "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)");
    free(s);
    /* A syntax error before the limit is reached wins. */
    parse_fails("[[[x", 4, SCH_JFAIL_SYNTAX, "Expecting value: line 1 column 4 (char 3)");
}

/* ---- writers ------------------------------------------------------------ */

typedef struct dump_case {
    const char *text;
    const char *py;
    const char *canonical;
} dump_case_t;

/* Printed by python3: json.dumps(v, ensure_ascii=False) and json.dumps(v,
 * ensure_ascii=False, sort_keys=True, separators=(",", ":")). */
static const dump_case_t dump_cases[] = {
    {"{\"b\": 1, \"a\": [true, false, null], \"b\": {\"y\": 2, \"x\": 1.5}}",
     "{\"b\": {\"y\": 2, \"x\": 1.5}, \"a\": [true, false, null]}",
     "{\"a\":[true,false,null],\"b\":{\"x\":1.5,\"y\":2}}"},
    {"[-0, -0.0, 1e2, 1E400, -1e400, NaN, 1e-7, 1e16, 12.5, 123456789012345678901234567890]",
     "[0, -0.0, 100.0, Infinity, -Infinity, NaN, 1e-07, 1e+16, 12.5, "
     "123456789012345678901234567890]",
     "[0,-0.0,100.0,Infinity,-Infinity,NaN,1e-07,1e+16,12.5,123456789012345678901234567890]"},
    {"{\"\\u00e9\\ud83d\\ude00\": \"\\u2028\\u007f\\u0000\\u001f\\\"\\\\\\/\\b\\f\\n\\r\\t\", "
     "\"z\": \"\", \"Z\": [], \"\": {}}",
     "{\"\xc3\xa9\xf0\x9f\x98\x80\": \"\xe2\x80\xa8\x7f\\u0000\\u001f\\\"\\\\/\\b\\f\\n\\r\\t\", "
     "\"z\": \"\", \"Z\": [], \"\": {}}",
     "{\"\":{},\"Z\":[],\"z\":\"\",\"\xc3\xa9\xf0\x9f\x98\x80\":"
     "\"\xe2\x80\xa8\x7f\\u0000\\u001f\\\"\\\\/\\b\\f\\n\\r\\t\"}"},
    {"\"caf\xc3\xa9\"", "\"caf\xc3\xa9\"", "\"caf\xc3\xa9\""},
    {" [ ] ", "[]", "[]"},
    {"{\"ticket\": 1234, \"tags\": [\"damage\", \"urgent\"], \"vip\": true, \"note\": null}",
     "{\"ticket\": 1234, \"tags\": [\"damage\", \"urgent\"], \"vip\": true, \"note\": null}",
     "{\"note\":null,\"tags\":[\"damage\",\"urgent\"],\"ticket\":1234,\"vip\":true}"},
    {"{\"level\":\"hard\",\"\xf0\x9f\x98\x80\":1,\"\xef\xbf\xbf\":2,\"a\":{\"c\":[{\"z\":1,\"y\":2}"
     "],\"b\":0.1}}",
     "{\"level\": \"hard\", \"\xf0\x9f\x98\x80\": 1, \"\xef\xbf\xbf\": 2, \"a\": {\"c\": [{\"z\": "
     "1, \"y\": 2}], \"b\": 0.1}}",
     "{\"a\":{\"b\":0.1,\"c\":[{\"y\":2,\"z\":1}]},\"level\":\"hard\",\"\xef\xbf\xbf\":2,"
     "\"\xf0\x9f\x98\x80\":1}"},
    {"[[], {}, [[]], {\"a\": {}}]", "[[], {}, [[]], {\"a\": {}}]", "[[],{},[[]],{\"a\":{}}]"},
};

Test(schemas_json, dump_py_and_canonical) {
    for (size_t i = 0; i < sizeof dump_cases / sizeof dump_cases[0]; i++) {
        const dump_case_t *c = &dump_cases[i];
        sch_jdoc_t        *doc = parse_s(c->text);
        assert_dump(sch_json_dump_py, sch_jdoc_root(doc), c->py, strlen(c->py));
        assert_dump(sch_json_dump_canonical, sch_jdoc_root(doc), c->canonical,
                    strlen(c->canonical));
        sch_jdoc_free(doc);
    }
}

/* A dump parses back to a value that dumps the same (NaN included). */
Test(schemas_json, dump_round_trips) {
    for (size_t i = 0; i < sizeof dump_cases / sizeof dump_cases[0]; i++) {
        dump_fn fns[] = {sch_json_dump_py, sch_json_dump_canonical};
        for (size_t f = 0; f < 2; f++) {
            sch_jdoc_t *doc = parse_s(dump_cases[i].text);
            size_t      len = 0;
            char       *once = dump_with(fns[f], sch_jdoc_root(doc), &len);
            sch_jdoc_t *again = parse_ok(once, len);
            assert_dump(fns[f], sch_jdoc_root(again), once, len);
            sch_jdoc_free(again);
            sch_jdoc_free(doc);
            free(once);
        }
    }
}

Test(schemas_json, content_text) {
    sch_jdoc_t        *doc = parse_s("[\"a\\\"b\\n\", {\"x\": [1, 2.0]}, null, 3]");
    const sch_json_t  *root = sch_jdoc_root(doc);
    static const char *want[] = {"a\"b\n", "{\"x\": [1, 2.0]}", "null", "3"};
    for (size_t i = 0; i < 4; i++)
        assert_dump(sch_content_text, sch_json_at(root, i), want[i], strlen(want[i]));
    sch_jdoc_free(doc);
}

Test(schemas_json, write_string_escapes_like_json_dumps) {
    static const struct {
        const char *in;
        size_t      len;
        const char *want;
    } cases[] = {
        {"", 0, "\"\""},
        {"plain", 5, "\"plain\""},
        {"\"\\/", 3, "\"\\\"\\\\/\""},
        {"\n\r\t\b\f", 5, "\"\\n\\r\\t\\b\\f\""},
        {"\x00\x01\x1f\x7f", 4, "\"\\u0000\\u0001\\u001f\x7f\""},
        {"\x0b\x1a", 2, "\"\\u000b\\u001a\""},
        {"\xe2\x80\xa8\xc3\xa9\xf0\x9f\x98\x80", 9, "\"\xe2\x80\xa8\xc3\xa9\xf0\x9f\x98\x80\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = string_literal(cases[i].in, cases[i].len);
        cr_assert_str_eq(got, cases[i].want);
        free(got);
    }
}

Test(schemas_json, write_double_specials) {
    static const struct {
        double      d;
        const char *want;
    } cases[] = {
        {0.0, "0.0"},
        {-0.0, "-0.0"},
        {NAN, "NaN"},
        {INFINITY, "Infinity"},
        {-INFINITY, "-Infinity"},
        {1e16, "1e+16"},
        {1e-5, "1e-05"},
        {1e-4, "0.0001"},
        {100.0, "100.0"},
        {12.5, "12.5"},
        {0.1 + 0.2, "0.30000000000000004"},
        {9999999999999998.0, "9999999999999998.0"},
        {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"},
        {-1.5e-300, "-1.5e-300"},
        {0.5040127515792847, "0.5040127515792847"},
        {123456789.125, "123456789.125"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = double_repr(cases[i].d);
        cr_assert_str_eq(got, cases[i].want);
        free(got);
    }
}

/* Writers report the buffer's cap instead of writing past it. */
Test(schemas_json, writers_respect_the_cap) {
    sch_jdoc_t *doc = parse_s("{\"key\": [1, 2, 3, \"a long string value\"]}");
    for (size_t max = 0; max < 40; max++) {
        svc_buf_t out;
        svc_buf_init(&out, max);
        cr_assert_eq(sch_json_dump_py(sch_jdoc_root(doc), &out), SVC_ERR_TOO_LARGE);
        cr_assert_leq(out.len, max);
        svc_buf_fini(&out);
    }
    svc_buf_t out;
    svc_buf_init(&out, 3);
    cr_assert_eq(sch_json_write_double(&out, 0.30000000000000004), SVC_ERR_TOO_LARGE);
    svc_buf_fini(&out);
    sch_jdoc_free(doc);
}

Test(schemas_json, free_null_is_noop) {
    sch_jdoc_free(NULL);
}
