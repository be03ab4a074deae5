/*
 * sch_avro_request.c -- System One request bodies <-> request.avsc.
 *
 * JSON -> Avro takes the typed branch of a field when the value has the
 * contract's shape and the Json branch (JSON text) otherwise, so even a
 * request the decoder will refuse travels unchanged: the verdict of the
 * decoded body is the verdict of the original (tests/test_avro.c checks it
 * over tests/contract/cases.jsonl). Avro -> JSON writes the fields in the
 * schema's order, then the unknown top-level fields of `extra`; every JSON
 * text is parsed first, so a corrupt one is reported here with its field
 * rather than as a confusing position inside the rebuilt body.
 */
#include <math.h>

#include "sch_avro_int.h"
#include "sch_int.h"

#define TEXT_MAX ((size_t)1 << 30)

/* ---- JSON -> Avro ----------------------------------------------------------- */

typedef struct enc {
    char  *errstr;
    size_t errstr_size;
} enc_t;

static svc_err_t av_fail(enc_t *e, const char *what) {
    svc_errf(e->errstr, e->errstr_size, "avro request: cannot set %s: %s", what, avro_strerror());
    return SVC_ERR_INTERNAL;
}

/* v (an Avro string) = the compact JSON text of j. */
static svc_err_t set_text(enc_t *e, avro_value_t *v, const sch_json_t *j, const char *what) {
    svc_buf_t t;
    svc_buf_init(&t, TEXT_MAX);
    svc_err_t err = sch_json_dump_compact(j, &t);
    if (!err && sch_av_set_str(v, t.data ? t.data : "", t.len) != 0)
        err = av_fail(e, what);
    svc_buf_fini(&t);
    return err;
}

/* A ["null", ..., "Json"] union: the Json branch holding j's text. */
static svc_err_t set_json_branch(enc_t *e, avro_value_t *u, const sch_json_t *j, const char *what) {
    avro_value_t rec, text;
    if (sch_av_set_branch(u, AVRO_RECORD, "Json", &rec) || !sch_av_field(&rec, "json", &text))
        return av_fail(e, what);
    return set_text(e, &text, j, what);
}

/* An optional ["null", "boolean"] union u: null when j is NULL (absent). */
static int set_opt_bool(avro_value_t *u, const sch_json_t *j) {
    avro_value_t b;
    return j ? sch_av_set_branch(u, AVRO_BOOLEAN, NULL, &b) ||
                   avro_value_set_boolean(&b, sch_json_bool(j))
             : sch_av_set_branch(u, AVRO_NULL, NULL, &b);
}

/* Field `name` of rec, a ["null", "string"] union: null when j is NULL
 * (absent), else j's JSON text. */
static svc_err_t set_opt_text(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *j) {
    avro_value_t u, b;
    if (!sch_av_field(rec, name, &u))
        return av_fail(e, name);
    if (!j)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &b) ? av_fail(e, name) : SVC_OK;
    if (sch_av_set_branch(&u, AVRO_STRING, NULL, &b))
        return av_fail(e, name);
    return set_text(e, &b, j, name);
}

static const char *const QUESTION_KEYS[] = {"type",   "instructions",       "criteria", "choices",
                                            "levels", "require_full_input", NULL};
static const char *const OPTION_KEYS[] = {"deadline_ms", "max_tokens", "profile", "return_meta",
                                          NULL};
static const char *const ENTRY_KEYS[] = {"state", "questions", "images", "videos", NULL};

static svc_err_t set_question(enc_t *e, avro_value_t *u, const sch_json_t *q) {
    static const char *const TYPES[] = {"choice", "noul", "score"};
    const sch_json_t        *type =
        q && sch_av_keys_within(q, QUESTION_KEYS) ? sch_json_get(q, "type", 4) : NULL;
    const sch_json_t *rfi = type ? sch_json_get(q, "require_full_input", 18) : NULL;
    int               t = -1;
    if (type && sch_json_type(type) == SCH_JSON_STRING) {
        size_t      n;
        const char *s = sch_json_string(type, &n);
        for (int i = 0; i < 3; i++)
            if (sch_str_is(s, n, TYPES[i]))
                t = i;
    }
    if (t < 0 || (rfi && sch_json_type(rfi) != SCH_JSON_BOOL))
        return set_json_branch(e, u, q, "question");
    avro_value_t rec, f;
    if (sch_av_set_branch(u, AVRO_RECORD, "Question", &rec) || !sch_av_field(&rec, "type", &f) ||
        avro_value_set_enum(&f, t) || !sch_av_field(&rec, "require_full_input", &f))
        return av_fail(e, "question");
    if (set_opt_bool(&f, rfi))
        return av_fail(e, "require_full_input");
    static const char *const TEXTS[] = {"instructions", "criteria", "choices", "levels"};
    svc_err_t                err = SVC_OK;
    for (size_t i = 0; i < 4 && !err; i++)
        err = set_opt_text(e, &rec, TEXTS[i], sch_json_get(q, TEXTS[i], strlen(TEXTS[i])));
    return err;
}

/* An object usable as an Avro map: avro-c keys are C strings. */
static bool map_keys_ok(const sch_json_t *j) {
    if (sch_json_type(j) != SCH_JSON_OBJECT)
        return false;
    for (size_t i = 0; i < sch_json_size(j); i++) {
        size_t      n;
        const char *k = sch_json_key_at(j, i, &n);
        if (memchr(k, '\0', n))
            return false;
    }
    return true;
}

/* Field `name`: ["null", map<Question|Json>, "Json"]. */
static svc_err_t set_questions(enc_t *e, avro_value_t *rec, const char *name,
                               const sch_json_t *qs) {
    avro_value_t u, m, item;
    if (!sch_av_field(rec, name, &u))
        return av_fail(e, name);
    if (!qs)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &m) ? av_fail(e, name) : SVC_OK;
    if (!map_keys_ok(qs))
        return set_json_branch(e, &u, qs, name);
    if (sch_av_set_branch(&u, AVRO_MAP, NULL, &m))
        return av_fail(e, name);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < sch_json_size(qs) && !err; i++) {
        size_t n;
        if (avro_value_add(&m, sch_json_key_at(qs, i, &n), &item, NULL, NULL))
            return av_fail(e, name);
        err = set_question(e, &item, sch_json_at(qs, i));
    }
    return err;
}

/* Field `name`: ["null", array<string>, "Json"] (images, videos). */
static svc_err_t set_urls(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *j) {
    avro_value_t u, a, item;
    if (!sch_av_field(rec, name, &u))
        return av_fail(e, name);
    if (!j)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &a) ? av_fail(e, name) : SVC_OK;
    bool strings = sch_json_type(j) == SCH_JSON_ARRAY;
    for (size_t i = 0; strings && i < sch_json_size(j); i++)
        strings = sch_json_type(sch_json_at(j, i)) == SCH_JSON_STRING;
    if (!strings)
        return set_json_branch(e, &u, j, name);
    if (sch_av_set_branch(&u, AVRO_ARRAY, NULL, &a))
        return av_fail(e, name);
    for (size_t i = 0; i < sch_json_size(j); i++) {
        size_t      n;
        const char *s = sch_json_string(sch_json_at(j, i), &n);
        if (avro_value_append(&a, &item, NULL) || sch_av_set_str(&item, s, n))
            return av_fail(e, name);
    }
    return SVC_OK;
}

/* An INT that a long holds exactly as written (so it prints back the same). */
static bool int_as_long(const sch_json_t *j, long long *out) {
    size_t      n;
    const char *t = sch_json_int_text(j, &n);
    char        back[32];
    errno = 0;
    *out = strtoll(t, NULL, 10);
    if (errno)
        return false;
    int m = snprintf(back, sizeof back, "%lld", *out);
    return m > 0 && (size_t)m == n && memcmp(back, t, n) == 0;
}

/* A number option: long, finite double, or false (the options go as Json). */
static bool number_fits(const sch_json_t *j) {
    long long l;
    if (sch_json_type(j) == SCH_JSON_INT)
        return int_as_long(j, &l);
    return sch_json_type(j) == SCH_JSON_REAL && isfinite(sch_json_number(j));
}

static bool options_fit(const sch_json_t *o) {
    if (!sch_av_keys_within(o, OPTION_KEYS))
        return false;
    const sch_json_t *d = sch_json_get(o, "deadline_ms", 11);
    const sch_json_t *m = sch_json_get(o, "max_tokens", 10);
    const sch_json_t *p = sch_json_get(o, "profile", 7);
    const sch_json_t *r = sch_json_get(o, "return_meta", 11);
    return (!d || number_fits(d)) && (!m || number_fits(m)) &&
           (!p || sch_json_type(p) == SCH_JSON_STRING) && (!r || sch_json_type(r) == SCH_JSON_BOOL);
}

static svc_err_t set_number(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *j) {
    avro_value_t u, b;
    long long    l = 0;
    int          rc;
    if (!sch_av_field(rec, name, &u))
        return av_fail(e, name);
    if (!j)
        rc = sch_av_set_branch(&u, AVRO_NULL, NULL, &b);
    else if (sch_json_type(j) == SCH_JSON_INT && int_as_long(j, &l))
        rc = sch_av_set_branch(&u, AVRO_INT64, NULL, &b) || avro_value_set_long(&b, l);
    else
        rc = sch_av_set_branch(&u, AVRO_DOUBLE, NULL, &b) ||
             avro_value_set_double(&b, sch_json_number(j));
    return rc ? av_fail(e, name) : SVC_OK;
}

static svc_err_t set_options(enc_t *e, avro_value_t *rec, const sch_json_t *o) {
    avro_value_t u, r, f;
    if (!sch_av_field(rec, "options", &u))
        return av_fail(e, "options");
    if (!o)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &r) ? av_fail(e, "options") : SVC_OK;
    if (!options_fit(o))
        return set_json_branch(e, &u, o, "options");
    if (sch_av_set_branch(&u, AVRO_RECORD, "Options", &r))
        return av_fail(e, "options");
    svc_err_t err = set_number(e, &r, "deadline_ms", sch_json_get(o, "deadline_ms", 11));
    if (!err)
        err = set_number(e, &r, "max_tokens", sch_json_get(o, "max_tokens", 10));
    if (err)
        return err;
    const sch_json_t *p = sch_json_get(o, "profile", 7);
    const sch_json_t *m = sch_json_get(o, "return_meta", 11);
    size_t            n = 0;
    const char       *s = p ? sch_json_string(p, &n) : NULL;
    if (!sch_av_field(&r, "profile", &f) || sch_av_set_opt_str(&f, s, n))
        return av_fail(e, "options.profile");
    if (!sch_av_field(&r, "return_meta", &f) || set_opt_bool(&f, m))
        return av_fail(e, "options.return_meta");
    return SVC_OK;
}

static svc_err_t set_states(enc_t *e, avro_value_t *rec, const sch_json_t *st) {
    avro_value_t u, m, item, r;
    if (!sch_av_field(rec, "states", &u))
        return av_fail(e, "states");
    if (!st)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &m) ? av_fail(e, "states") : SVC_OK;
    if (!map_keys_ok(st))
        return set_json_branch(e, &u, st, "states");
    if (sch_av_set_branch(&u, AVRO_MAP, NULL, &m))
        return av_fail(e, "states");
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < sch_json_size(st) && !err; i++) {
        size_t            n;
        const sch_json_t *ent = sch_json_at(st, i);
        if (avro_value_add(&m, sch_json_key_at(st, i, &n), &item, NULL, NULL))
            return av_fail(e, "states");
        if (!sch_av_keys_within(ent, ENTRY_KEYS)) {
            err = set_json_branch(e, &item, ent, "states entry");
            continue;
        }
        if (sch_av_set_branch(&item, AVRO_RECORD, "StateEntry", &r))
            return av_fail(e, "states entry");
        err = set_opt_text(e, &r, "state", sch_json_get(ent, "state", 5));
        if (!err)
            err = set_questions(e, &r, "questions", sch_json_get(ent, "questions", 9));
        if (!err)
            err = set_urls(e, &r, "images", sch_json_get(ent, "images", 6));
        if (!err)
            err = set_urls(e, &r, "videos", sch_json_get(ent, "videos", 6));
    }
    return err;
}

static const char *const TOP_KEYS[] = {"model",  "state",   "questions", "images",
                                       "videos", "options", "states",    NULL};

/* The unknown top-level fields as the JSON text of one object, or NULL. */
static svc_err_t set_extra(enc_t *e, avro_value_t *rec, const sch_json_t *body) {
    avro_value_t u;
    svc_buf_t    t;
    svc_buf_init(&t, TEXT_MAX);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < sch_json_size(body) && !err; i++) {
        size_t      n;
        const char *k = sch_json_key_at(body, i, &n);
        if (sch_av_key_in(k, n, TOP_KEYS))
            continue;
        err = svc_buf_addc(&t, t.len ? ',' : '{');
        if (!err)
            err = sch_json_write_string(&t, k, n);
        if (!err)
            err = svc_buf_addc(&t, ':');
        if (!err)
            err = sch_json_dump_compact(sch_json_at(body, i), &t);
    }
    if (!err && t.len)
        err = svc_buf_addc(&t, '}');
    if (!err && !sch_av_field(rec, "extra", &u))
        err = av_fail(e, "extra");
    if (!err && sch_av_set_opt_str(&u, t.len ? t.data : NULL, t.len))
        err = av_fail(e, "extra");
    svc_buf_fini(&t);
    return err;
}

static svc_err_t set_model(enc_t *e, avro_value_t *rec, const sch_json_t *m) {
    avro_value_t u, b;
    if (!sch_av_field(rec, "model", &u))
        return av_fail(e, "model");
    if (!m)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &b) ? av_fail(e, "model") : SVC_OK;
    if (sch_json_type(m) != SCH_JSON_STRING)
        return set_json_branch(e, &u, m, "model");
    size_t      n;
    const char *s = sch_json_string(m, &n);
    return sch_av_set_opt_str(&u, s, n) ? av_fail(e, "model") : SVC_OK;
}

svc_err_t sch_avro_request_from_json(const char *json, size_t len, svc_buf_t *out, char *errstr,
                                     size_t errstr_size) {
    enc_t       e = {errstr, errstr_size};
    sch_jdoc_t *doc;
    svc_err_t   err = sch_av_parse_body(json, len, "request", &doc, errstr, errstr_size);
    if (err)
        return err;
    const sch_json_t *b = sch_jdoc_root(doc);
    if (sch_json_type(b) != SCH_JSON_OBJECT) {
        svc_errf(errstr, errstr_size,
                 "request is not a JSON object, which request.avsc cannot carry");
        sch_jdoc_free(doc);
        return SVC_ERR_INVALID;
    }
    avro_value_t rec;
    err = sch_av_new_value(SCH_AVRO_REQUEST, &rec, errstr, errstr_size);
    if (err) {
        sch_jdoc_free(doc);
        return err;
    }
    err = set_model(&e, &rec, sch_json_get(b, "model", 5));
    if (!err)
        err = set_opt_text(&e, &rec, "state", sch_json_get(b, "state", 5));
    if (!err)
        err = set_questions(&e, &rec, "questions", sch_json_get(b, "questions", 9));
    if (!err)
        err = set_urls(&e, &rec, "images", sch_json_get(b, "images", 6));
    if (!err)
        err = set_urls(&e, &rec, "videos", sch_json_get(b, "videos", 6));
    if (!err)
        err = set_options(&e, &rec, sch_json_get(b, "options", 7));
    if (!err)
        err = set_states(&e, &rec, sch_json_get(b, "states", 6));
    if (!err)
        err = set_extra(&e, &rec, b);
    return sch_av_encode_end(err, &rec, doc, out, errstr, errstr_size);
}

/* ---- Avro -> JSON ------------------------------------------------------------ */

typedef sch_av_dec_t dec_t;

/* Appends a JSON text verbatim after checking that it parses alone. */
static svc_err_t emit_text(dec_t *d, avro_value_t *v, const char *what) {
    const char *s;
    size_t      n;
    if (sch_av_get_str(v, &s, &n))
        return sch_av_bad(d, what, "not a string");
    sch_jfail_t fail;
    char        msg[200];
    char        why[260];
    sch_jdoc_t *doc = sch_json_parse(s, n, &fail, msg, sizeof msg);
    if (!doc) {
        snprintf(why, sizeof why, "not JSON text: %s", msg);
        return fail == SCH_JFAIL_NOMEM ? SVC_ERR_NOMEM : sch_av_bad(d, what, why);
    }
    sch_jdoc_free(doc);
    return svc_buf_add(d->out, s, n);
}

/* The current branch of union field `name` of rec; false when the field is
 * missing (resolved away) or null. */
static bool opt_field(avro_value_t *rec, const char *name, avro_value_t *b, avro_type_t *t,
                      const char **bname) {
    avro_value_t u;
    if (!sch_av_field(rec, name, &u) || sch_av_branch(&u, b, t, bname))
        return false;
    return *t != AVRO_NULL;
}

static bool is_json_rec(avro_type_t t, const char *name) {
    return t == AVRO_RECORD && name && strcmp(name, "Json") == 0;
}

static svc_err_t emit_json_rec(dec_t *d, avro_value_t *rec, const char *what) {
    avro_value_t text;
    return sch_av_field(rec, "json", &text) ? emit_text(d, &text, what)
                                            : sch_av_bad(d, what, "Json record without json");
}

/* "name": <JSON text> for an optional text field of rec. */
static svc_err_t emit_opt_text(dec_t *d, bool *first, avro_value_t *rec, const char *name) {
    avro_value_t b;
    avro_type_t  t;
    const char  *bn;
    if (!opt_field(rec, name, &b, &t, &bn))
        return SVC_OK;
    svc_err_t err = sch_av_w_key(d, first, name, strlen(name));
    return err ? err : emit_text(d, &b, name);
}

/* "name": true|false for an optional boolean field of rec (`what` in errors). */
static svc_err_t emit_opt_bool(dec_t *d, bool *first, avro_value_t *rec, const char *name,
                               const char *what) {
    avro_value_t b;
    avro_type_t  t;
    const char  *bn;
    int          v = 0;
    if (!opt_field(rec, name, &b, &t, &bn))
        return SVC_OK;
    svc_err_t err = sch_av_w_key(d, first, name, strlen(name));
    if (!err && avro_value_get_boolean(&b, &v))
        err = sch_av_bad(d, what, "not a boolean");
    return err ? err : svc_buf_adds(d->out, v ? "true" : "false");
}

static svc_err_t emit_question(dec_t *d, avro_value_t *rec) {
    avro_value_t f;
    int          sym;
    bool         first = true;
    if (!sch_av_field(rec, "type", &f) || avro_value_get_enum(&f, &sym))
        return sch_av_bad(d, "question.type", "missing");
    const char *name = avro_schema_enum_get(avro_value_get_schema(&f), sym);
    if (!name)
        return sch_av_bad(d, "question.type", "bad enum symbol");
    svc_err_t err = svc_buf_addc(d->out, '{');
    if (!err)
        err = sch_av_w_key(d, &first, "type", 4);
    if (!err)
        err = sch_json_write_string(d->out, name, strlen(name));
    static const char *const TEXTS[] = {"instructions", "criteria", "choices", "levels"};
    for (size_t i = 0; i < 4 && !err; i++)
        err = emit_opt_text(d, &first, rec, TEXTS[i]);
    if (!err)
        err = emit_opt_bool(d, &first, rec, "require_full_input", "require_full_input");
    return err ? err : svc_buf_addc(d->out, '}');
}

/* b is the branch of a questions field: a map, or Json. */
static svc_err_t emit_questions(dec_t *d, avro_value_t *b, avro_type_t t, const char *bn) {
    if (is_json_rec(t, bn))
        return emit_json_rec(d, b, "questions");
    if (t != AVRO_MAP)
        return sch_av_bad(d, "questions", "unexpected branch");
    size_t    n = 0;
    bool      first = true;
    svc_err_t err = avro_value_get_size(b, &n) ? sch_av_bad(d, "questions", "no size") : SVC_OK;
    if (!err)
        err = svc_buf_addc(d->out, '{');
    for (size_t i = 0; i < n && !err; i++) {
        avro_value_t u, q;
        const char  *key = NULL;
        avro_type_t  qt;
        const char  *qn;
        if (avro_value_get_by_index(b, i, &u, &key) || sch_av_branch(&u, &q, &qt, &qn))
            return sch_av_bad(d, "questions", "unreadable entry");
        err = sch_av_w_key(d, &first, key, strlen(key));
        if (!err)
            err = is_json_rec(qt, qn) ? emit_json_rec(d, &q, "question") : emit_question(d, &q);
    }
    return err ? err : svc_buf_addc(d->out, '}');
}

static svc_err_t emit_urls(dec_t *d, avro_value_t *b, avro_type_t t, const char *bn,
                           const char *what) {
    if (is_json_rec(t, bn))
        return emit_json_rec(d, b, what);
    size_t    n = 0;
    svc_err_t err = t != AVRO_ARRAY || avro_value_get_size(b, &n)
                        ? sch_av_bad(d, what, "not a list")
                        : svc_buf_addc(d->out, '[');
    for (size_t i = 0; i < n && !err; i++) {
        avro_value_t item;
        err = i ? svc_buf_addc(d->out, ',') : SVC_OK;
        if (!err)
            err = avro_value_get_by_index(b, i, &item, NULL)
                      ? sch_av_bad(d, what, "unreadable item")
                      : sch_av_w_str(d, &item, what);
    }
    return err ? err : svc_buf_addc(d->out, ']');
}

static svc_err_t emit_number(dec_t *d, bool *first, avro_value_t *rec, const char *name) {
    avro_value_t b;
    avro_type_t  t;
    const char  *bn;
    if (!opt_field(rec, name, &b, &t, &bn))
        return SVC_OK;
    svc_err_t err = sch_av_w_key(d, first, name, strlen(name));
    int64_t   l;
    double    x;
    if (err)
        return err;
    if (t == AVRO_INT64 && !avro_value_get_long(&b, &l))
        return svc_buf_addf(d->out, "%lld", (long long)l);
    if (t == AVRO_DOUBLE && !avro_value_get_double(&b, &x))
        return sch_json_write_double(d->out, x);
    return sch_av_bad(d, name, "not a number");
}

static svc_err_t emit_options(dec_t *d, avro_value_t *r, avro_type_t t, const char *bn) {
    if (is_json_rec(t, bn))
        return emit_json_rec(d, r, "options");
    avro_value_t b;
    avro_type_t  bt;
    const char  *bbn;
    bool         first = true;
    svc_err_t    err = svc_buf_addc(d->out, '{');
    if (!err)
        err = emit_number(d, &first, r, "deadline_ms");
    if (!err)
        err = emit_number(d, &first, r, "max_tokens");
    if (!err && opt_field(r, "profile", &b, &bt, &bbn)) {
        err = sch_av_w_key(d, &first, "profile", 7);
        if (!err)
            err = sch_av_w_str(d, &b, "options.profile");
    }
    if (!err)
        err = emit_opt_bool(d, &first, r, "return_meta", "options.return_meta");
    return err ? err : svc_buf_addc(d->out, '}');
}

/* The fields a request and a states entry share, in schema order. */
static svc_err_t emit_common(dec_t *d, bool *first, avro_value_t *rec) {
    avro_value_t b;
    avro_type_t  t;
    const char  *bn;
    svc_err_t    err = emit_opt_text(d, first, rec, "state");
    if (!err && opt_field(rec, "questions", &b, &t, &bn)) {
        err = sch_av_w_key(d, first, "questions", 9);
        if (!err)
            err = emit_questions(d, &b, t, bn);
    }
    static const char *const URLS[] = {"images", "videos"};
    for (size_t i = 0; i < 2 && !err; i++) {
        if (!opt_field(rec, URLS[i], &b, &t, &bn))
            continue;
        err = sch_av_w_key(d, first, URLS[i], 6);
        if (!err)
            err = emit_urls(d, &b, t, bn, URLS[i]);
    }
    return err;
}

static svc_err_t emit_states(dec_t *d, avro_value_t *b, avro_type_t t, const char *bn) {
    if (is_json_rec(t, bn))
        return emit_json_rec(d, b, "states");
    size_t    n = 0;
    bool      first = true;
    svc_err_t err = t != AVRO_MAP || avro_value_get_size(b, &n)
                        ? sch_av_bad(d, "states", "not a map")
                        : svc_buf_addc(d->out, '{');
    for (size_t i = 0; i < n && !err; i++) {
        avro_value_t u, e;
        const char  *key = NULL;
        avro_type_t  et;
        const char  *en;
        bool         efirst = true;
        if (avro_value_get_by_index(b, i, &u, &key) || sch_av_branch(&u, &e, &et, &en))
            return sch_av_bad(d, "states", "unreadable entry");
        err = sch_av_w_key(d, &first, key, strlen(key));
        if (!err && is_json_rec(et, en)) {
            err = emit_json_rec(d, &e, "states entry");
            continue;
        }
        if (!err)
            err = svc_buf_addc(d->out, '{');
        if (!err)
            err = emit_common(d, &efirst, &e);
        if (!err)
            err = svc_buf_addc(d->out, '}');
    }
    return err ? err : svc_buf_addc(d->out, '}');
}

/* The members of the `extra` object, after the known fields. */
static svc_err_t emit_extra(dec_t *d, bool *first, avro_value_t *b) {
    const char *s;
    size_t      n;
    if (sch_av_get_str(b, &s, &n))
        return sch_av_bad(d, "extra", "not a string");
    sch_jfail_t fail;
    char        msg[200];
    sch_jdoc_t *doc = sch_json_parse(s, n, &fail, msg, sizeof msg);
    if (!doc)
        return fail == SCH_JFAIL_NOMEM ? SVC_ERR_NOMEM : sch_av_bad(d, "extra", "not JSON text");
    const sch_json_t *o = sch_jdoc_root(doc);
    svc_err_t         err =
        sch_json_type(o) == SCH_JSON_OBJECT ? SVC_OK : sch_av_bad(d, "extra", "not an object");
    for (size_t i = 0; i < sch_json_size(o) && !err; i++) {
        size_t      kn;
        const char *k = sch_json_key_at(o, i, &kn);
        err = sch_av_w_key(d, first, k, kn);
        if (!err)
            err = sch_json_dump_compact(sch_json_at(o, i), d->out);
    }
    sch_jdoc_free(doc);
    return err;
}

svc_err_t sch_avro_request_to_json(const sch_avro_writer_t *w, const void *body, size_t len,
                                   svc_buf_t *out, char *errstr, size_t errstr_size) {
    sch_av_decoded_t dv;
    svc_err_t        err = sch_av_decode(SCH_AVRO_REQUEST, w, body, len, &dv, errstr, errstr_size);
    if (err)
        return err;
    dec_t        d = {out, "request", errstr, errstr_size};
    avro_value_t b;
    avro_type_t  t;
    const char  *bn;
    bool         first = true;
    size_t       start = out->len;
    err = svc_buf_addc(out, '{');
    if (!err && opt_field(&dv.view, "model", &b, &t, &bn)) {
        err = sch_av_w_key(&d, &first, "model", 5);
        if (!err)
            err =
                is_json_rec(t, bn) ? emit_json_rec(&d, &b, "model") : sch_av_w_str(&d, &b, "model");
    }
    if (!err)
        err = emit_common(&d, &first, &dv.view);
    if (!err && opt_field(&dv.view, "options", &b, &t, &bn)) {
        err = sch_av_w_key(&d, &first, "options", 7);
        if (!err)
            err = emit_options(&d, &b, t, bn);
    }
    if (!err && opt_field(&dv.view, "states", &b, &t, &bn)) {
        err = sch_av_w_key(&d, &first, "states", 6);
        if (!err)
            err = emit_states(&d, &b, t, bn);
    }
    if (!err && opt_field(&dv.view, "extra", &b, &t, &bn))
        err = emit_extra(&d, &first, &b);
    return sch_av_decode_end(err, &d, start, &dv);
}
