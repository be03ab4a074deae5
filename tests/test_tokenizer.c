/*
 * test_tokenizer.c -- the tokenizer of engine.h against Hugging Face
 * `tokenizers` 0.23: golden files (tests/golden/tokenizer/<name>.<mode>.jsonl, written by
 * the reference) and unit tests on small tokenizer.json files written here.
 *
 * The expected ids of the unit tests were produced with python3 `tokenizers`
 * on the same files.
 */
#include "engine.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---- */

typedef struct tmpdir {
    char path[64];
    char files[8][160];
    int  n;
} tmpdir_t;

static void tmp_init(tmpdir_t *t) {
    snprintf(t->path, sizeof t->path, "/tmp/d3tok.XXXXXX");
    cr_assert_not_null(mkdtemp(t->path));
    t->n = 0;
}

static void tmp_fini(tmpdir_t *t) {
    for (int i = 0; i < t->n; i++)
        unlink(t->files[i]);
    rmdir(t->path);
}

/* Writes name into the temp dir; returns its path (owned by t). */
static const char *tmp_write(tmpdir_t *t, const char *name, const char *text) {
    cr_assert_lt(t->n, 8);
    char dir[64];
    memcpy(dir, t->path, sizeof dir);
    char *p = t->files[t->n++];
    snprintf(p, sizeof t->files[0], "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* A tokenizer.json with the given parts (JSON text each). */
static char *tok_json(const char *vocab, const char *merges, const char *added, const char *norm,
                      const char *pre, const char *model_extra) {
    svc_buf_t b;
    svc_buf_init(&b, 1 << 20);
    cr_assert_eq(svc_buf_addf(&b,
                              "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,"
                              " \"added_tokens\": %s, \"normalizer\": %s, \"pre_tokenizer\": %s,"
                              " \"post_processor\": null, \"decoder\": null,"
                              " \"model\": {\"type\": \"BPE\", \"dropout\": null,"
                              " \"unk_token\": null, \"fuse_unk\": false,"
                              " \"byte_fallback\": false, %s \"vocab\": %s, \"merges\": %s}}",
                              added, norm, pre, model_extra, vocab, merges),
                 SVC_OK);
    return svc_buf_steal(&b, NULL);
}

static eng_tokenizer_t *load_ok(const char *json, const char *cfg, eng_tok_mode_t mode) {
    tmpdir_t t;
    tmp_init(&t);
    const char      *jp = tmp_write(&t, "tokenizer.json", json);
    const char      *cp = cfg ? tmp_write(&t, "tokenizer_config.json", cfg) : NULL;
    char             err[512] = "";
    eng_tokenizer_t *tok = NULL;
    svc_err_t        rc = eng_tokenizer_load(jp, cp, mode, &tok, err, sizeof err);
    tmp_fini(&t);
    cr_assert_eq(rc, SVC_OK, "load failed: %s", err);
    return tok;
}

/* Loads and expects failure; returns the message (static storage). */
static const char *load_err(const char *json, const char *cfg, eng_tok_mode_t mode,
                            svc_err_t *code) {
    static char      err[512];
    tmpdir_t         t;
    eng_tokenizer_t *tok = NULL;
    tmp_init(&t);
    const char *jp = tmp_write(&t, "tokenizer.json", json);
    const char *cp = cfg ? tmp_write(&t, "tokenizer_config.json", cfg) : NULL;
    err[0] = '\0';
    svc_err_t rc = eng_tokenizer_load(jp, cp, mode, &tok, err, sizeof err);
    tmp_fini(&t);
    cr_assert_neq(rc, SVC_OK, "load should fail");
    cr_assert_null(tok);
    if (code)
        *code = rc;
    return err;
}

static void expect_ids(const eng_tokenizer_t *tok, const char *text, const int32_t *want,
                       size_t n) {
    eng_ids_t ids;
    eng_ids_init(&ids);
    cr_assert_eq(eng_tokenizer_encode(tok, text, strlen(text), &ids), SVC_OK);
    bool same = ids.n == n && (n == 0 || memcmp(ids.v, want, n * sizeof *want) == 0);
    if (!same) {
        fprintf(stderr, "text \"%s\": got", text);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(stderr, " %d", ids.v[i]);
        fprintf(stderr, "\n");
    }
    eng_ids_fini(&ids);
    cr_assert(same, "ids differ for \"%s\"", text);
}

#define EXPECT(tok, text, ...)                                                                     \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(tok, text, want_, sizeof want_ / sizeof want_[0]);                              \
    } while (0)

#define AT(id, content, flags)                                                                     \
    "{\"id\": " #id ", \"content\": \"" content "\", \"single_word\": false, \"lstrip\": false,"   \
    " \"rstrip\": false, \"normalized\": false, \"special\": true" flags "}"

/* ---- golden files ---- */

static const char *qwen3_dir(void) {
    const char *d = getenv("D3_QWEN3_DIR");
    static char p[1024];
    if (!d || !*d)
        return NULL;
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    return access(p, R_OK) == 0 ? d : NULL;
}

/* Runs one golden file; returns the number of mismatches. */
static size_t run_golden(const char *dir, const char *golden, eng_tok_mode_t mode) {
    char jp[1024], cp[1024], err[512] = "";
    snprintf(jp, sizeof jp, "%s/tokenizer.json", dir);
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
    eng_tokenizer_t *tok = NULL;
    svc_err_t        rc =
        eng_tokenizer_load(jp, mode == ENG_TOK_UPSTREAM ? cp : NULL, mode, &tok, err, sizeof err);
    cr_assert_eq(rc, SVC_OK, "%s: load failed: %s", golden, err);
    FILE *f = fopen(golden, "r");
    cr_assert_not_null(f);
    char   *line = NULL;
    size_t  cap = 0, lines = 0, bad = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t      *o = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        cr_assert_not_null(o, "%s:%zu: bad JSON: %s", golden, lines + 1, je.text);
        json_t *text = json_object_get(o, "text"), *want = json_object_get(o, "ids");
        cr_assert(json_is_string(text) && json_is_array(want), "%s:%zu", golden, lines + 1);
        eng_ids_t ids;
        eng_ids_init(&ids);
        rc = eng_tokenizer_encode(tok, json_string_value(text), json_string_length(text), &ids);
        bool same = rc == SVC_OK && ids.n == json_array_size(want);
        for (size_t i = 0; same && i < ids.n; i++)
            same = ids.v[i] == json_integer_value(json_array_get(want, i));
        if (!same && ++bad <= 10) {
            char *t = json_dumps(text, JSON_ENCODE_ANY);
            char *w = json_dumps(want, JSON_COMPACT);
            fprintf(stderr, "MISMATCH %s:%zu text %s\n  want %s\n  got ", golden, lines + 1, t, w);
            for (size_t i = 0; i < ids.n; i++)
                fprintf(stderr, "%s%d", i ? "," : "[", ids.v[i]);
            fprintf(stderr, "%s (rc %d)\n", ids.n ? "]" : "[]", rc);
            free(t);
            free(w);
        }
        eng_ids_fini(&ids);
        json_decref(o);
        lines++;
    }
    free(line);
    fclose(f);
    eng_tokenizer_free(tok);
    fprintf(stderr, "%s: %zu lines, %zu mismatches\n", golden, lines, bad);
    cr_assert_gt(lines, 0, "%s is empty", golden);
    return bad;
}

static void golden(const char *name, const char *mode_name, eng_tok_mode_t mode) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/tokenizer/%s.%s.jsonl", D3_SOURCE_DIR, name,
             mode_name);
    const char *dir = NULL;
    if (strcmp(name, "qwen3") == 0) {
        dir = qwen3_dir();
        cr_assert_not_null(dir,
                           "the Qwen3 tokenizer is missing (D3_QWEN3_DIR=\"%s\"): run "
                           "tests/tools/fetch_qwen3_tokenizer.sh",
                           getenv("D3_QWEN3_DIR") ? getenv("D3_QWEN3_DIR") : "");
    } else {
        dir = D3_SOURCE_DIR "/tests/fixtures/qwen35-mini";
    }
    if (access(path, R_OK) != 0)
        cr_skip_test("%s not present", path);
    size_t bad = run_golden(dir, path, mode);
    cr_assert_eq(bad, 0, "%s: %zu mismatches (see above)", path, bad);
}

Test(tokenizer, qwen3_tokenizer_present) {
    cr_assert_not_null(qwen3_dir(), "the Qwen3 tokenizer is missing (D3_QWEN3_DIR): run "
                                    "tests/tools/fetch_qwen3_tokenizer.sh");
}

Test(tokenizer, golden_qwen3_upstream, .timeout = 120) {
    golden("qwen3", "upstream", ENG_TOK_UPSTREAM);
}

Test(tokenizer, golden_qwen3_as_is, .timeout = 120) {
    golden("qwen3", "as_is", ENG_TOK_AS_IS);
}

Test(tokenizer, golden_qwen35mini_upstream, .timeout = 120) {
    golden("qwen35mini", "upstream", ENG_TOK_UPSTREAM);
}

Test(tokenizer, golden_qwen35mini_as_is, .timeout = 120) {
    golden("qwen35mini", "as_is", ENG_TOK_AS_IS);
}

/* ---- BPE model ---- */

#define V_SPLIT "{\"a\":0,\"b\":1,\"-\":2,\" \":3,\"a-\":4,\"--\":5,\"-b\":6,\"ab\":7}"
#define M_SPLIT "[\"a -\",\"- -\",\"- b\",\"a b\"]"

Test(tokenizer, merges_priority_and_forms) {
    const char      *v = "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4}";
    char            *j1 = tok_json(v, "[\"b c\", \"a b\"]", "[]", "null", "null", "");
    char            *j2 = tok_json(v, "[[\"a\", \"b\"], [\"b\", \"c\"]]", "[]", "null", "null", "");
    eng_tokenizer_t *t1 = load_ok(j1, NULL, ENG_TOK_AS_IS);
    eng_tokenizer_t *t2 = load_ok(j2, NULL, ENG_TOK_AS_IS);
    EXPECT(t1, "abc", 0, 4);
    EXPECT(t2, "abc", 3, 2);
    EXPECT(t2, "abab", 3, 3);
    EXPECT(t2, "axb", 3); /* x is not in the vocabulary: dropped, then a+b merge */
    cr_assert_eq(eng_tokenizer_token_id(t2, "bc", 2), 4);
    cr_assert_eq(eng_tokenizer_token_id(t2, "zz", 2), -1);
    cr_assert_eq(eng_tokenizer_n_ids(t2), 5);
    eng_tokenizer_free(t1);
    eng_tokenizer_free(t2);
    free(j1);
    free(j2);
}

Test(tokenizer, ignore_merges) {
    const char *v = "{\"a\":0,\"b\":1,\"c\":2,\"abc\":3,\"ab\":4}";
    char       *j1 = tok_json(v, "[\"a b\"]", "[]", "null", "null", "\"ignore_merges\": true,");
    char       *j2 = tok_json(v, "[\"a b\"]", "[]", "null", "null", "\"ignore_merges\": false,");
    eng_tokenizer_t *t1 = load_ok(j1, NULL, ENG_TOK_AS_IS);
    eng_tokenizer_t *t2 = load_ok(j2, NULL, ENG_TOK_AS_IS);
    EXPECT(t1, "abc", 3);
    EXPECT(t2, "abc", 4, 2);
    eng_tokenizer_free(t1);
    eng_tokenizer_free(t2);
    free(j1);
    free(j2);
}

Test(tokenizer, nfc_normalizer) {
    const char *v = "{\"a\":0,\"b\":1,\" \":2,\"x\":3,\"\\u00e9\":4,\"e\":5}";
    char       *j1 = tok_json(v, "[]", "[]", "{\"type\": \"NFC\"}", "null", "");
    char       *j2 =
        tok_json(v, "[]", "[]", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}",
                 "null", "");
    char            *j3 = tok_json(v, "[]", "[]", "null", "null", "");
    eng_tokenizer_t *t1 = load_ok(j1, NULL, ENG_TOK_AS_IS);
    eng_tokenizer_t *t2 = load_ok(j2, NULL, ENG_TOK_AS_IS);
    eng_tokenizer_t *t3 = load_ok(j3, NULL, ENG_TOK_AS_IS);
    EXPECT(t1, "e\xcc\x81", 4);
    EXPECT(t2, "e\xcc\x81", 4);
    EXPECT(t3, "e\xcc\x81", 5);
    eng_tokenizer_free(t1);
    eng_tokenizer_free(t2);
    eng_tokenizer_free(t3);
    free(j1);
    free(j2);
    free(j3);
}

/* ---- added tokens ---- */

#define V_ADD "{\"a\":0,\"b\":1,\" \":2,\"x\":3,\"\\u00e9\":4,\"e\":5}"

static eng_tokenizer_t *added_tok(const char *added, const char *norm) {
    char            *j = tok_json(V_ADD, "[]", added, norm, "null", "");
    eng_tokenizer_t *t = load_ok(j, NULL, ENG_TOK_AS_IS);
    free(j);
    return t;
}

Test(tokenizer, added_lstrip_rstrip) {
    eng_tokenizer_t *lr =
        added_tok("[" AT(6, "<m>", ", \"lstrip\": true, \"rstrip\": true") "]", "null");
    eng_tokenizer_t *l = added_tok("[" AT(6, "<m>", ", \"lstrip\": true") "]", "null");
    EXPECT(lr, "a  <m>  b", 0, 6, 1);
    EXPECT(l, "a  <m>  b", 0, 6, 2, 2, 1);
    EXPECT(l, "<m><m> <m>", 6, 6, 6);
    eng_tokenizer_free(lr);
    eng_tokenizer_free(l);
}

Test(tokenizer, added_single_word) {
    eng_tokenizer_t *t = added_tok("[" AT(6, "<m>", ", \"single_word\": true") "]", "null");
    EXPECT(t, "a<m> <m> <m>b <m>", 0, 2, 6, 2, 1, 2, 6);
    EXPECT(t, "<m>_ <m>\xc2\xb7", 2, 6); /* '_' is a word character, U+00B7 is not */
    eng_tokenizer_free(t);
}

#define V_NORM "{\"a\":0,\"b\":1,\" \":2,\"x\":3,\"e\":4}"

Test(tokenizer, added_normalized) {
    char *j1 = tok_json(V_NORM, "[]",
                        "[" AT(5, "\\u00e9", ", \"normalized\": true, \"special\": false") "]",
                        "{\"type\": \"NFC\"}", "null", "");
    char *j2 =
        tok_json(V_NORM, "[]", "[" AT(5, "\\u00e9", "") "]", "{\"type\": \"NFC\"}", "null", "");
    eng_tokenizer_t *t1 = load_ok(j1, NULL, ENG_TOK_AS_IS);
    eng_tokenizer_t *t2 = load_ok(j2, NULL, ENG_TOK_AS_IS);
    EXPECT(t1, "e\xcc\x81 \xc3\xa9", 5, 2, 5);
    EXPECT(t2, "e\xcc\x81 \xc3\xa9", 2, 5); /* raw match only; NFC'd é is not in the vocab */
    eng_tokenizer_free(t1);
    eng_tokenizer_free(t2);
    free(j1);
    free(j2);
}

Test(tokenizer, added_leftmost_longest_and_inside_text) {
    eng_tokenizer_t *t = added_tok("[" AT(6, "<a>", "") ", " AT(7, "<a>b", "") "]", "null");
    EXPECT(t, "x<a>b<a>x", 3, 7, 6, 3);
    EXPECT(t, "ab<a<a>>", 0, 1, 0, 6);
    cr_assert_eq(eng_tokenizer_token_id(t, "<a>b", 4), 7);
    cr_assert_eq(eng_tokenizer_n_ids(t), 8);
    eng_tokenizer_free(t);
}

/* A NUL inside an added token's content is part of it (JSON "\u0000"). */
Test(tokenizer, added_with_nul) {
    eng_tokenizer_t *t = added_tok("[" AT(6, "\\u0000<nul token>", "") "]", "null");
    cr_assert_eq(eng_tokenizer_token_id(t, "\0<nul token>", 12), 6);
    cr_assert_eq(eng_tokenizer_token_id(t, "\0", 1), -1);
    eng_tokenizer_free(t);
}

Test(tokenizer, invalid_utf8) {
    eng_tokenizer_t *t = added_tok("[]", "null");
    const char      *bad[] = {"a\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\xe4\xbd"};
    eng_ids_t        ids;
    eng_ids_init(&ids);
    cr_assert_eq(eng_ids_push(&ids, 42), SVC_OK);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(eng_tokenizer_encode(t, bad[i], strlen(bad[i]), &ids), SVC_ERR_INVALID);
    cr_assert_eq(ids.n, 1);
    cr_assert_eq(eng_tokenizer_encode(t, "", 0, &ids), SVC_OK);
    cr_assert_eq(ids.n, 1);
    eng_ids_fini(&ids);
    eng_tokenizer_free(t);
}

/* ---- pre-tokenizers (AS_IS) ---- */

static eng_tokenizer_t *split_tok(const char *behavior, bool invert) {
    char pre[256];
    snprintf(pre, sizeof pre,
             "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\","
             " \"invert\": %s}",
             behavior, invert ? "true" : "false");
    char            *j = tok_json(V_SPLIT, M_SPLIT, "[]", "null", pre, "");
    eng_tokenizer_t *t = load_ok(j, NULL, ENG_TOK_AS_IS);
    free(j);
    return t;
}

Test(tokenizer, split_behaviors) {
    static const struct {
        const char *behavior;
        bool        invert;
        int32_t     want[8];
        size_t      n;
    } rows[] = {
        {"Isolated", false, {0, 2, 1, 2, 2, 7, 2}, 7},
        {"Isolated", true, {0, 2, 1, 2, 2, 7, 2}, 7},
        {"Removed", false, {0, 1, 7}, 3},
        {"Removed", true, {2, 2, 2, 2}, 4},
        {"MergedWithPrevious", false, {4, 1, 2, 2, 7, 2}, 6},
        {"MergedWithPrevious", true, {0, 6, 2, 2, 7, 2}, 6},
        {"MergedWithNext", false, {0, 6, 2, 2, 7, 2}, 6},
        {"MergedWithNext", true, {4, 1, 2, 2, 7, 2}, 6},
        {"Contiguous", false, {0, 2, 1, 5, 7, 2}, 6},
        {"Contiguous", true, {0, 2, 1, 5, 7, 2}, 6},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        eng_tokenizer_t *t = split_tok(rows[i].behavior, rows[i].invert);
        expect_ids(t, "a-b--ab-", rows[i].want, rows[i].n);
        eng_tokenizer_free(t);
    }
}

Test(tokenizer, split_regex_and_sequence) {
    char            *j = tok_json(V_SPLIT, M_SPLIT, "[]", "null",
                                  "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\","
                                             " \"pattern\": {\"Regex\": \"-+\"}, \"behavior\": \"Isolated\","
                                             " \"invert\": false}]}",
                                  "");
    eng_tokenizer_t *t = load_ok(j, NULL, ENG_TOK_AS_IS);
    EXPECT(t, "a-b--ab-", 0, 2, 1, 5, 7, 2);
    eng_tokenizer_free(t);
    free(j);
}

Test(tokenizer, byte_level_prefix_and_regex) {
    const char      *v = "{\"\\u0120\":0,\"a\":1,\"b\":2,\"\\u0120a\":3}";
    char            *j1 = tok_json(v, "[\"\\u0120 a\"]", "[]", "null",
                                   "{\"type\": \"ByteLevel\", \"add_prefix_space\": true,"
                                              " \"trim_offsets\": false, \"use_regex\": true}",
                                   "");
    char            *j2 = tok_json(v, "[\"\\u0120 a\"]", "[]", "null",
                                   "{\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                                              " \"trim_offsets\": false, \"use_regex\": true}",
                                   "");
    eng_tokenizer_t *t1 = load_ok(j1, NULL, ENG_TOK_AS_IS);
    eng_tokenizer_t *t2 = load_ok(j2, NULL, ENG_TOK_AS_IS);
    EXPECT(t1, "a a", 3, 3);
    EXPECT(t1, "<x>a a", 0, 1, 3);
    EXPECT(t2, "a a", 1, 3);
    eng_tokenizer_free(t1);
    eng_tokenizer_free(t2);
    free(j1);
    free(j2);
}

/* ---- UPSTREAM mode and tokenizer_config.json ---- */

#define V_UP "{\"\\u0120\":0,\"a\":1,\"b\":2,\"\\u0120a\":3,\"<\":4,\">\":5}"

static char *config_json(const char *cls, const char *extra, const char *decoder) {
    svc_buf_t b;
    svc_buf_init(&b, 1 << 16);
    cr_assert_eq(svc_buf_addf(&b,
                              "{\"tokenizer_class\": \"%s\", \"add_prefix_space\": false,"
                              " \"add_bos_token\": false, %s"
                              " \"added_tokens_decoder\": {%s}}",
                              cls, extra, decoder),
                 SVC_OK);
    return svc_buf_steal(&b, NULL);
}

#define DEC(id, content)                                                                           \
    "\"" #id "\": {\"content\": \"" content "\", \"lstrip\": false, \"normalized\": false,"        \
    " \"rstrip\": false, \"single_word\": false, \"special\": true}"

Test(tokenizer, upstream_config_tokens) {
    /* The file's own pre-tokenizer (Metaspace) is ignored in UPSTREAM mode. */
    char            *j = tok_json(V_UP, "[\"\\u0120 a\"]", "[" AT(6, "<|e|>", "") "]", "null",
                                  "{\"type\": \"Metaspace\"}", "");
    char            *c = config_json("Qwen2TokenizerFast", "\"pad_token\": \"<|e|>\",",
                                     DEC(6, "<|e|>") ", " DEC(8, "<|z|>") ", " DEC(7, "<|y|>"));
    eng_tokenizer_t *t = load_ok(j, c, ENG_TOK_UPSTREAM);
    EXPECT(t, "a a<|y|>b<|z|> <|e|>", 1, 3, 7, 2, 8, 0, 6);
    cr_assert_eq(eng_tokenizer_n_ids(t), 9);
    eng_tokenizer_free(t);
    svc_err_t   code;
    const char *e = load_err(j, c, ENG_TOK_AS_IS, &code);
    cr_assert(strstr(e, "\"Metaspace\"") && strstr(e, "tokenizer.json \""), "%s", e);
    cr_assert_eq(code, SVC_ERR_UNSUPPORTED);
    free(j);
    free(c);
}

/* A tokenizer_config.json entry without "normalized" is not normalized
 * (upstream: bool(entry.get("normalized", False))), whatever "special"
 * says; tokenizer.json's own default (!special) does not apply. The
 * entry A + U+030A matches NFC'd input (U+00C5, bytes c3 85: byte-level
 * U+00C3 U+0127) only when normalized. */
Test(tokenizer, upstream_config_normalized_default) {
    char *j = tok_json("{\"\\u0120\":0,\"a\":1,\"b\":2,\"\\u0120a\":3,\"<\":4,\">\":5,"
                       "\"\\u00c3\":6,\"\\u0127\":7}",
                       "[]", "[" AT(8, "<|e|>", "") "]", "{\"type\": \"NFC\"}", "null", "");
    static const struct {
        const char *flags;
        int32_t     want[2];
        size_t      n;
    } rows[] = {
        {"", {6, 7}, 2},
        {"\"normalized\": false,", {6, 7}, 2},
        {"\"normalized\": true,", {9, 0}, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char dec[256];
        snprintf(dec, sizeof dec,
                 DEC(8, "<|e|>") ", \"9\": {\"content\": \"A\\u030a\", %s \"special\": false}",
                 rows[i].flags);
        char            *c = config_json("Qwen2Tokenizer", "\"pad_token\": \"<|e|>\",", dec);
        eng_tokenizer_t *t = load_ok(j, c, ENG_TOK_UPSTREAM);
        eng_ids_t        ids = {0};
        cr_assert_eq(eng_tokenizer_encode(t, "\xc3\x85", 2, &ids), SVC_OK);
        cr_assert_eq(ids.n, rows[i].n, "row %zu: %zu ids", i, ids.n);
        for (size_t k = 0; k < ids.n; k++)
            cr_assert_eq(ids.v[k], rows[i].want[k], "row %zu id %zu: %d", i, k, (int)ids.v[k]);
        free(ids.v);
        eng_tokenizer_free(t);
        free(c);
    }
    free(j);
}

Test(tokenizer, upstream_config_errors) {
    char *j = tok_json(V_UP, "[]", "[" AT(6, "<|e|>", "") "]", "null", "null", "");
    static const struct {
        const char *cls, *extra, *dec, *needle;
    } rows[] = {
        {"Qwen2Tokenizer", "\"pad_token\": \"<|e|>\",", DEC(9, "<|z|>"),
         "added_tokens_decoder[\"9\"] \"<|z|>\" has id 9 but would get id 7"},
        {"LlamaTokenizer", "\"pad_token\": \"<|e|>\",", DEC(6, "<|e|>"),
         "tokenizer_class \"LlamaTokenizer\""},
        {"Qwen2Tokenizer", "\"pad_token\": \"<|nope|>\",", DEC(6, "<|e|>"),
         "pad_token \"<|nope|>\" is not a token"},
        {"Qwen2Tokenizer", "", DEC(6, "<|e|>"), "pad_token is missing"},
        {"Qwen2Tokenizer", "\"pad_token\": {\"content\": \"<|e|>\"}, \"add_bos_token\": true,",
         DEC(6, "<|e|>"), "add_bos_token must be null or false"},
        {"Qwen2Tokenizer", "\"pad_token\": \"<|e|>\",", "\"x\": {}",
         "added_tokens_decoder[\"x\"]: the key is not an id"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char       *c = config_json(rows[i].cls, rows[i].extra, rows[i].dec);
        const char *e = load_err(j, c, ENG_TOK_UPSTREAM, NULL);
        cr_assert(strstr(e, "tokenizer_config.json \"/tmp/d3tok."), "%s", e);
        cr_assert(strstr(e, rows[i].needle), "row %zu: %s", i, e);
        free(c);
    }
    /* pad_token as {content} resolves. */
    char            *c = config_json("Qwen2Tokenizer", "\"pad_token\": {\"content\": \"a\"},", "");
    eng_tokenizer_t *t = load_ok(j, c, ENG_TOK_UPSTREAM);
    eng_tokenizer_free(t);
    free(c);
    free(j);
}

/* ---- bad tokenizer.json files ---- */

/* A FIFO where tokenizer.json should be: an error at once, not a wait. */
Test(tokenizer, fifo_file, .timeout = 30) {
    char dir[64] = "/tmp/d3tok.XXXXXX", path[128], err[512] = "";
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    eng_tokenizer_t *tok = NULL;
    svc_err_t        rc = eng_tokenizer_load(path, NULL, ENG_TOK_AS_IS, &tok, err, sizeof err);
    unlink(path);
    rmdir(dir);
    cr_assert_eq(rc, SVC_ERR_IO, "%s", err);
    cr_assert(strstr(err, "not a regular file") && strstr(err, path), "%s", err);
}

Test(tokenizer, bad_files) {
    const char *v = "{\"a\":0,\"b\":1,\"ab\":2}";
    static const struct {
        const char *merges, *added, *norm, *pre, *extra, *needle;
    } rows[] = {
        {"[\"a b\", \"x y\"]", "[]", "null", "null", "",
         "model.merges[1] names unknown token \"x\""},
        {"[\"a b\", \"b a\"]", "[]", "null", "null", "",
         "model.merges[1] makes unknown token \"ba\""},
        {"[\"a b c\"]", "[]", "null", "null", "", "model.merges[0] is not"},
        {"[]", "[" AT(3, "<x>", "") ", " AT(3, "<y>", "") "]", "null", "null", "",
         "added_tokens[1] \"<y>\": id 3 is already \"<x>\""},
        {"[]", "[" AT(5, "<x>", "") "]", "null", "null", "",
         "added_tokens[0] \"<x>\" has id 5 but would get id 3"},
        {"[]", "[" AT(3, "<x>", "") ", " AT(4, "<x>", "") "]", "null", "null", "",
         "added_tokens[1] \"<x>\" is listed twice"},
        {"[]", "[]", "{\"type\": \"NFKC\"}", "null", "", "normalizer type \"NFKC\" is not"},
        {"[]", "[]", "null",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Whitespace\"}]}", "",
         "pre_tokenizer.pretokenizers[0] type \"Whitespace\" is not supported"},
        {"[]", "[]", "null",
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}", "",
         "pre_tokenizer: regex does not compile"},
        {"[]", "[]", "null", "null", "\"byte_fallback\": true,", "model.byte_fallback"},
        {"[]", "[]", "null", "null", "\"continuing_subword_prefix\": \"##\",",
         "model.continuing_subword_prefix"},
        {"[]", "[]", "null", "null", "\"ignore_merges\": 1,",
         "model.ignore_merges is not a boolean"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char *j =
            tok_json(v, rows[i].merges, rows[i].added, rows[i].norm, rows[i].pre, rows[i].extra);
        const char *e = load_err(j, NULL, ENG_TOK_AS_IS, NULL);
        cr_assert(strstr(e, "tokenizer.json \"/tmp/d3tok."), "row %zu: %s", i, e);
        cr_assert(strstr(e, rows[i].needle), "row %zu: %s", i, e);
        free(j);
    }
}

Test(tokenizer, bad_vocab_and_json) {
    static const struct {
        const char *json, *needle;
    } rows[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
         "id 0 is also"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}, \"merges\": []}}",
         "model.vocab[\"a\"] is not an id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}",
         "model.vocab is not an object"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": {}}}",
         "model.merges is not an array"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type WordPiece"},
        {"{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}",
         "model.dropout"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"mer", "not valid JSON"},
        {"[1, 2]", "the top level is not an object"},
        {"{\"version\": \"1.0\"}", "model is missing"},
        {"{\"truncation\": {\"max_length\": 5}, \"model\": {}}", "truncation is set"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        svc_err_t   code;
        const char *e = load_err(rows[i].json, NULL, ENG_TOK_AS_IS, &code);
        cr_assert(strstr(e, "tokenizer.json \"/tmp/d3tok."), "row %zu: %s", i, e);
        cr_assert(strstr(e, rows[i].needle), "row %zu: %s", i, e);
    }
    char             err[512] = "";
    eng_tokenizer_t *tok = NULL;
    svc_err_t rc = eng_tokenizer_load("/nonexistent/tokenizer.json", NULL, ENG_TOK_AS_IS, &tok, err,
                                      sizeof err);
    cr_assert_eq(rc, SVC_ERR_IO);
    cr_assert_null(tok);
    cr_assert(strstr(err, "tokenizer.json \"/nonexistent/tokenizer.json\": open() failed"), "%s",
              err);
}

/* ---- concurrency: one tokenizer, many threads, shared word cache ---- */

typedef struct enc_job {
    const eng_tokenizer_t *tok;
    const char            *text;
    eng_ids_t              ids;
    svc_err_t              rc;
} enc_job_t;

static void *enc_thread(void *arg) {
    enc_job_t *j = arg;
    for (int r = 0; r < 20 && !j->rc; r++) {
        j->ids.n = 0;
        j->rc = eng_tokenizer_encode(j->tok, j->text, strlen(j->text), &j->ids);
    }
    return NULL;
}

Test(tokenizer, concurrent_encode) {
    char            *j = tok_json(V_SPLIT, M_SPLIT, "[]", "null",
                                  "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"},"
                                             " \"behavior\": \"Isolated\"}",
                                  "");
    eng_tokenizer_t *t = load_ok(j, NULL, ENG_TOK_AS_IS);
    svc_buf_t        text;
    svc_buf_init(&text, 1 << 22);
    for (int i = 0; i < 20000; i++)
        cr_assert_eq(svc_buf_adds(&text, (i * 7) % 3 ? "a-b-- ab-a " : "ab--b- a-a- "), SVC_OK);
    eng_ids_t ref;
    eng_ids_init(&ref);
    cr_assert_eq(eng_tokenizer_encode(t, text.data, text.len, &ref), SVC_OK);
    enc_job_t jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (enc_job_t){.tok = t, .text = text.data};
        eng_ids_init(&jobs[i].ids);
        cr_assert_eq(pthread_create(&th[i], NULL, enc_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(jobs[i].rc, SVC_OK);
        cr_assert_eq(jobs[i].ids.n, ref.n);
        cr_assert_eq(memcmp(jobs[i].ids.v, ref.v, ref.n * sizeof *ref.v), 0);
        eng_ids_fini(&jobs[i].ids);
    }
    eng_ids_fini(&ref);
    svc_buf_fini(&text);
    eng_tokenizer_free(t);
    free(j);
}
