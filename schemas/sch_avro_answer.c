/*
 * sch_avro_answer.c -- our response bodies (sch_response_encode,
 * sch_error_encode) <-> answer.avsc.
 *
 * Unlike requests, these bodies have one shape we write ourselves, so the
 * mapping is strict: a member the schema has no place for is an error, not
 * a Json fallback. Avro -> JSON writes the members in SPEC b.1/b.2 order and
 * numbers in repr form, so a body survives the round trip byte for byte.
 */
#include <math.h>

#include "sch_avro_int.h"
#include "sch_int.h"

/* ---- JSON -> Avro ----------------------------------------------------------- */

typedef struct enc {
    char  *errstr;
    size_t errstr_size;
} enc_t;

static svc_err_t shape(enc_t *e, const char *what) {
    svc_errf(e->errstr, e->errstr_size, "answer field %s: not the shape answer.avsc carries", what);
    return SVC_ERR_INVALID;
}

static svc_err_t av_fail(enc_t *e, const char *what) {
    svc_errf(e->errstr, e->errstr_size, "answer field %s: avro: %s", what, avro_strerror());
    return SVC_ERR_INTERNAL;
}

static const sch_json_t *get(const sch_json_t *o, const char *key) {
    return sch_json_get(o, key, strlen(key));
}

/* Field `name` of rec = the string member `name` of o (required). */
static svc_err_t set_str(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *o) {
    const sch_json_t *j = get(o, name);
    avro_value_t      f;
    if (!j || sch_json_type(j) != SCH_JSON_STRING)
        return shape(e, name);
    size_t      n;
    const char *s = sch_json_string(j, &n);
    return !sch_av_field(rec, name, &f) || sch_av_set_str(&f, s, n) ? av_fail(e, name) : SVC_OK;
}

/* An optional ["null", "string"] field; JSON null and absence both map to null. */
static svc_err_t set_opt_str(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *o) {
    const sch_json_t *j = get(o, name);
    avro_value_t      u;
    size_t            n = 0;
    const char       *s = NULL;
    if (!sch_av_field(rec, name, &u))
        return av_fail(e, name);
    if (j && sch_json_type(j) != SCH_JSON_NULL) {
        if (sch_json_type(j) != SCH_JSON_STRING)
            return shape(e, name);
        s = sch_json_string(j, &n);
    }
    return sch_av_set_opt_str(&u, s, n) ? av_fail(e, name) : SVC_OK;
}

static bool is_number(const sch_json_t *j) {
    return j && (sch_json_type(j) == SCH_JSON_INT || sch_json_type(j) == SCH_JSON_REAL);
}

static svc_err_t set_num(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *o) {
    const sch_json_t *j = get(o, name);
    avro_value_t      f;
    if (!is_number(j))
        return shape(e, name);
    return !sch_av_field(rec, name, &f) || avro_value_set_double(&f, sch_json_number(j))
               ? av_fail(e, name)
               : SVC_OK;
}

static svc_err_t set_long(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *o) {
    const sch_json_t *j = get(o, name);
    avro_value_t      f;
    if (!j || sch_json_type(j) != SCH_JSON_INT)
        return shape(e, name);
    size_t      n;
    const char *t = sch_json_int_text(j, &n);
    errno = 0;
    long long v = strtoll(t, NULL, 10);
    if (errno)
        return shape(e, name);
    return !sch_av_field(rec, name, &f) || avro_value_set_long(&f, v) ? av_fail(e, name) : SVC_OK;
}

/* A map<double> or map<string> field from a JSON object. */
static svc_err_t set_map(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *o,
                         bool strings) {
    const sch_json_t *j = get(o, name);
    avro_value_t      m, item;
    if (!j || sch_json_type(j) != SCH_JSON_OBJECT || !sch_av_field(rec, name, &m))
        return shape(e, name);
    for (size_t i = 0; i < sch_json_size(j); i++) {
        size_t            n, vn;
        const char       *k = sch_json_key_at(j, i, &n);
        const sch_json_t *v = sch_json_at(j, i);
        if (memchr(k, '\0', n) || (strings ? sch_json_type(v) != SCH_JSON_STRING : !is_number(v)))
            return shape(e, name);
        if (avro_value_add(&m, k, &item, NULL, NULL))
            return av_fail(e, name);
        const char *sv = strings ? sch_json_string(v, &vn) : NULL;
        int         rc = strings ? sch_av_set_str(&item, sv, vn)
                                 : avro_value_set_double(&item, sch_json_number(v));
        if (rc)
            return av_fail(e, name);
    }
    return SVC_OK;
}

static const char *const K_CHOICE[] = {"type",       "choice",         "probabilities",
                                       "confidence", "input_coverage", NULL};
static const char *const K_NOUL[] = {"type", "noul", "input_coverage", NULL};
static const char *const K_SCORE[] = {
    "type", "score", "probabilities", "confidence", "legend", "input_coverage", NULL};
static const char *const K_ERROR[] = {"type", "error", "message", NULL};

static svc_err_t set_answer(enc_t *e, avro_value_t *u, const sch_json_t *a) {
    const sch_json_t *type = sch_json_type(a) == SCH_JSON_OBJECT ? get(a, "type") : NULL;
    size_t            n = 0;
    const char *t = type && sch_json_type(type) == SCH_JSON_STRING ? sch_json_string(type, &n) : "";
    avro_value_t r, f;
    svc_err_t    err;
    if (!type)
        return shape(e, "answers.<id>");
    if (get(a, "error")) {
        if (!sch_av_keys_within(a, K_ERROR) || sch_av_set_branch(u, AVRO_RECORD, "ErrorAnswer", &r))
            return shape(e, "answers.<id>");
        /* The echoed type came in the request: its text is bounded by the
         * body it came from (its escapes at most 6 bytes for 1), so any
         * answer the JSON form could carry fits. */
        svc_buf_t text;
        svc_buf_init(&text, SIZE_MAX / 2);
        err = sch_json_dump_compact(type, &text);
        if (!err && (!sch_av_field(&r, "type", &f) || sch_av_set_str(&f, text.data, text.len)))
            err = av_fail(e, "type");
        svc_buf_fini(&text);
        if (!err)
            err = set_str(e, &r, "error", a);
        return err ? err : set_opt_str(e, &r, "message", a);
    }
    if (sch_str_is(t, n, "choice")) {
        if (!sch_av_keys_within(a, K_CHOICE) ||
            sch_av_set_branch(u, AVRO_RECORD, "ChoiceAnswer", &r))
            return shape(e, "answers.<id>");
        err = set_str(e, &r, "choice", a);
    } else if (sch_str_is(t, n, "noul")) {
        if (!sch_av_keys_within(a, K_NOUL) || sch_av_set_branch(u, AVRO_RECORD, "NoulAnswer", &r))
            return shape(e, "answers.<id>");
        err = set_num(e, &r, "noul", a);
    } else if (sch_str_is(t, n, "score")) {
        if (!sch_av_keys_within(a, K_SCORE) || sch_av_set_branch(u, AVRO_RECORD, "ScoreAnswer", &r))
            return shape(e, "answers.<id>");
        err = set_num(e, &r, "score", a);
        if (!err)
            err = set_map(e, &r, "legend", a, true);
    } else {
        return shape(e, "answers.<id>.type");
    }
    if (!err && !sch_str_is(t, n, "noul")) {
        err = set_map(e, &r, "probabilities", a, false);
        if (!err)
            err = set_num(e, &r, "confidence", a);
    }
    return err ? err : set_opt_str(e, &r, "input_coverage", a);
}

/* Map m (field `what`) from the JSON object j, each entry set with fn. */
static svc_err_t set_entries(enc_t *e, avro_value_t *m, const sch_json_t *j, const char *what,
                             svc_err_t (*fn)(enc_t *, avro_value_t *, const sch_json_t *)) {
    avro_value_t item;
    if (!j || sch_json_type(j) != SCH_JSON_OBJECT)
        return shape(e, what);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < sch_json_size(j) && !err; i++) {
        size_t      n;
        const char *k = sch_json_key_at(j, i, &n);
        if (memchr(k, '\0', n))
            return shape(e, what);
        if (avro_value_add(m, k, &item, NULL, NULL))
            return av_fail(e, what);
        err = fn(e, &item, sch_json_at(j, i));
    }
    return err;
}

static svc_err_t set_answers(enc_t *e, avro_value_t *m, const sch_json_t *as) {
    return set_entries(e, m, as, "answers", set_answer);
}

static const char *const K_USAGE[] = {"input_tokens", "output_tokens", NULL};
static const char *const K_META[] = {
    "model_id",    "revision", "model_sha256", "profile",    "numerics", "engine",
    "accelerator", "device",   "queue_ms",     "compute_ms", NULL};

static svc_err_t set_usage(enc_t *e, avro_value_t *r, const sch_json_t *u) {
    if (!sch_av_keys_within(u, K_USAGE))
        return shape(e, "usage");
    svc_err_t err = set_long(e, r, "input_tokens", u);
    return err ? err : set_long(e, r, "output_tokens", u);
}

static svc_err_t set_meta(enc_t *e, avro_value_t *r, const sch_json_t *m) {
    static const char *const STRS[] = {"model_id", "profile",     "numerics",
                                       "engine",   "accelerator", "device"};
    if (!sch_av_keys_within(m, K_META))
        return shape(e, "meta");
    svc_err_t err = set_opt_str(e, r, "revision", m);
    if (!err)
        err = set_opt_str(e, r, "model_sha256", m);
    for (size_t i = 0; i < 6 && !err; i++)
        err = set_str(e, r, STRS[i], m);
    if (!err)
        err = set_num(e, r, "queue_ms", m);
    return err ? err : set_num(e, r, "compute_ms", m);
}

/* Optional union field `name` of rec set from member `name` of o with fn. */
static svc_err_t set_opt_rec(enc_t *e, avro_value_t *rec, const char *name, const sch_json_t *o,
                             svc_err_t (*fn)(enc_t *, avro_value_t *, const sch_json_t *),
                             avro_type_t t, const char *rname) {
    const sch_json_t *j = get(o, name);
    avro_value_t      u, b;
    if (!sch_av_field(rec, name, &u))
        return av_fail(e, name);
    if (!j)
        return sch_av_set_branch(&u, AVRO_NULL, NULL, &b) ? av_fail(e, name) : SVC_OK;
    if (sch_av_set_branch(&u, t, rname, &b))
        return av_fail(e, name);
    return fn(e, &b, j);
}

static svc_err_t set_state_answer(enc_t *e, avro_value_t *r, const sch_json_t *s) {
    static const char *const K[] = {"model", "answers", "usage", "meta", NULL};
    avro_value_t             f;
    if (!sch_av_keys_within(s, K) || !get(s, "usage"))
        return shape(e, "states.<name>");
    svc_err_t err = set_str(e, r, "model", s);
    if (!err)
        err = sch_av_field(r, "answers", &f) ? set_answers(e, &f, get(s, "answers"))
                                             : av_fail(e, "answers");
    if (!err)
        err =
            sch_av_field(r, "usage", &f) ? set_usage(e, &f, get(s, "usage")) : av_fail(e, "usage");
    return err ? err : set_opt_rec(e, r, "meta", s, set_meta, AVRO_RECORD, "Meta");
}

static svc_err_t set_states(enc_t *e, avro_value_t *m, const sch_json_t *st) {
    return set_entries(e, m, st, "states", set_state_answer);
}

static svc_err_t set_error(enc_t *e, avro_value_t *r, const sch_json_t *x) {
    static const char *const K[] = {"code", "message", NULL};
    if (!sch_av_keys_within(x, K))
        return shape(e, "error");
    svc_err_t err = set_str(e, r, "code", x);
    return err ? err : set_str(e, r, "message", x);
}

static const char *const K_TOP[] = {"model", "answers", "usage", "meta", "states", "error", NULL};

svc_err_t sch_avro_answer_from_json(const char *json, size_t len, svc_buf_t *out, char *errstr,
                                    size_t errstr_size) {
    enc_t       e = {errstr, errstr_size};
    sch_jdoc_t *doc;
    svc_err_t   err = sch_av_parse_body(json, len, "answer", &doc, errstr, errstr_size);
    if (err)
        return err;
    const sch_json_t *b = sch_jdoc_root(doc);
    avro_value_t      rec;
    err = sch_av_keys_within(b, K_TOP) ? SVC_OK : shape(&e, "<top level>");
    if (!err)
        err = sch_av_new_value(SCH_AVRO_ANSWER, &rec, errstr, errstr_size);
    if (err) {
        sch_jdoc_free(doc);
        return err;
    }
    err = set_opt_str(&e, &rec, "model", b);
    if (!err)
        err = set_opt_rec(&e, &rec, "answers", b, set_answers, AVRO_MAP, NULL);
    if (!err)
        err = set_opt_rec(&e, &rec, "usage", b, set_usage, AVRO_RECORD, "Usage");
    if (!err)
        err = set_opt_rec(&e, &rec, "meta", b, set_meta, AVRO_RECORD, "Meta");
    if (!err)
        err = set_opt_rec(&e, &rec, "states", b, set_states, AVRO_MAP, NULL);
    if (!err)
        err = set_opt_rec(&e, &rec, "error", b, set_error, AVRO_RECORD, "Error");
    return sch_av_encode_end(err, &rec, doc, out, errstr, errstr_size);
}

/* ---- Avro -> JSON ------------------------------------------------------------ */

typedef sch_av_dec_t dec_t;

/* `,"key":` (no comma when first). */
static svc_err_t w_key(dec_t *d, bool *first, const char *key) {
    return sch_av_w_key(d, first, key, strlen(key));
}

static svc_err_t w_double(dec_t *d, avro_value_t *v, const char *what) {
    double x;
    if (avro_value_get_double(v, &x))
        return sch_av_bad(d, what, "not a double");
    return isfinite(x) ? sch_json_write_double(d->out, x)
                       : sch_av_bad(d, what, "not a finite number");
}

/* "name":<value> for a required field of rec, written by fn. */
static svc_err_t w_field(dec_t *d, bool *first, avro_value_t *rec, const char *name,
                         svc_err_t (*fn)(dec_t *, avro_value_t *, const char *)) {
    avro_value_t f;
    if (!sch_av_field(rec, name, &f))
        return sch_av_bad(d, name, "missing");
    svc_err_t err = w_key(d, first, name);
    return err ? err : fn(d, &f, name);
}

/* The non-null branch of optional field `name`, or false. */
static bool opt_branch(avro_value_t *rec, const char *name, avro_value_t *b) {
    avro_value_t u;
    avro_type_t  t;
    const char  *bn;
    return sch_av_field(rec, name, &u) && !sch_av_branch(&u, b, &t, &bn) && t != AVRO_NULL;
}

static svc_err_t w_opt_str(dec_t *d, bool *first, avro_value_t *rec, const char *name,
                           bool null_if_absent) {
    avro_value_t b;
    if (!opt_branch(rec, name, &b) && !null_if_absent)
        return SVC_OK;
    svc_err_t err = w_key(d, first, name);
    if (err)
        return err;
    return opt_branch(rec, name, &b) ? sch_av_w_str(d, &b, name) : svc_buf_adds(d->out, "null");
}

/* Map m as a JSON object in stored order, each value written by fn. */
static svc_err_t w_entries(dec_t *d, avro_value_t *m, const char *what,
                           svc_err_t (*fn)(dec_t *, avro_value_t *, const char *)) {
    size_t    n = 0;
    bool      first = true;
    svc_err_t err =
        avro_value_get_size(m, &n) ? sch_av_bad(d, what, "not a map") : svc_buf_addc(d->out, '{');
    for (size_t i = 0; i < n && !err; i++) {
        avro_value_t v;
        const char  *k = NULL;
        if (avro_value_get_by_index(m, i, &v, &k))
            return sch_av_bad(d, what, "unreadable entry");
        err = w_key(d, &first, k);
        if (!err)
            err = fn(d, &v, what);
    }
    return err ? err : svc_buf_addc(d->out, '}');
}

static svc_err_t w_map_value(dec_t *d, avro_value_t *v, const char *what) {
    return avro_value_get_type(v) == AVRO_STRING ? sch_av_w_str(d, v, what) : w_double(d, v, what);
}

/* A map<double> (probabilities) or map<string> (legend), in stored order. */
static svc_err_t w_map(dec_t *d, avro_value_t *m, const char *what) {
    return w_entries(d, m, what, w_map_value);
}

static svc_err_t w_type_text(dec_t *d, avro_value_t *v, const char *what) {
    const char *s;
    size_t      n;
    if (sch_av_get_str(v, &s, &n))
        return sch_av_bad(d, what, "not a string");
    sch_jfail_t fail;
    char        msg[200];
    sch_jdoc_t *doc = sch_json_parse(s, n, &fail, msg, sizeof msg);
    if (!doc)
        return sch_av_bad(d, what, "not JSON text");
    svc_err_t err = sch_json_dump_compact(sch_jdoc_root(doc), d->out);
    sch_jdoc_free(doc);
    return err;
}

static svc_err_t w_answer(dec_t *d, avro_value_t *u, const char *what) {
    avro_value_t r;
    avro_type_t  t;
    const char  *name;
    bool         first = true;
    if (sch_av_branch(u, &r, &t, &name) || t != AVRO_RECORD || !name)
        return sch_av_bad(d, what, "not an answer record");
    svc_err_t err = svc_buf_addc(d->out, '{');
    if (!err && strcmp(name, "ErrorAnswer") == 0) {
        err = w_field(d, &first, &r, "type", w_type_text);
        if (!err)
            err = w_field(d, &first, &r, "error", sch_av_w_str);
        if (!err)
            err = w_opt_str(d, &first, &r, "message", false);
        return err ? err : svc_buf_addc(d->out, '}');
    }
    const char *type = strcmp(name, "ChoiceAnswer") == 0  ? "choice"
                       : strcmp(name, "NoulAnswer") == 0  ? "noul"
                       : strcmp(name, "ScoreAnswer") == 0 ? "score"
                                                          : NULL;
    if (!type)
        return sch_av_bad(d, what, "unknown answer record");
    if (!err)
        err = w_key(d, &first, "type");
    if (!err)
        err = sch_json_write_string(d->out, type, strlen(type));
    if (!err && type[0] == 'c')
        err = w_field(d, &first, &r, "choice", sch_av_w_str);
    if (!err && type[0] == 'n')
        err = w_field(d, &first, &r, "noul", w_double);
    if (!err && type[0] == 's')
        err = w_field(d, &first, &r, "score", w_double);
    if (!err && type[0] != 'n') {
        err = w_field(d, &first, &r, "probabilities", w_map);
        if (!err)
            err = w_field(d, &first, &r, "confidence", w_double);
    }
    if (!err && type[0] == 's')
        err = w_field(d, &first, &r, "legend", w_map);
    if (!err)
        err = w_opt_str(d, &first, &r, "input_coverage", false);
    return err ? err : svc_buf_addc(d->out, '}');
}

static svc_err_t w_answers(dec_t *d, avro_value_t *m, const char *what) {
    return w_entries(d, m, what, w_answer);
}

static svc_err_t w_long(dec_t *d, avro_value_t *v, const char *what) {
    int64_t x;
    return avro_value_get_long(v, &x) ? sch_av_bad(d, what, "not a long")
                                      : svc_buf_addf(d->out, "%lld", (long long)x);
}

static svc_err_t w_usage(dec_t *d, avro_value_t *r, const char *what) {
    bool      first = true;
    svc_err_t err = svc_buf_addc(d->out, '{');
    (void)what;
    if (!err)
        err = w_field(d, &first, r, "input_tokens", w_long);
    if (!err)
        err = w_field(d, &first, r, "output_tokens", w_long);
    return err ? err : svc_buf_addc(d->out, '}');
}

static svc_err_t w_meta(dec_t *d, avro_value_t *r, const char *what) {
    static const char *const STRS[] = {"profile", "numerics", "engine", "accelerator", "device"};
    bool                     first = true;
    svc_err_t                err = svc_buf_addc(d->out, '{');
    (void)what;
    if (!err)
        err = w_field(d, &first, r, "model_id", sch_av_w_str);
    if (!err)
        err = w_opt_str(d, &first, r, "revision", true);
    if (!err)
        err = w_opt_str(d, &first, r, "model_sha256", true);
    for (size_t i = 0; i < 5 && !err; i++)
        err = w_field(d, &first, r, STRS[i], sch_av_w_str);
    if (!err)
        err = w_field(d, &first, r, "queue_ms", w_double);
    if (!err)
        err = w_field(d, &first, r, "compute_ms", w_double);
    return err ? err : svc_buf_addc(d->out, '}');
}

/* model, answers, usage, meta: the 200 body and each states entry. */
static svc_err_t w_body(dec_t *d, bool *first, avro_value_t *r, bool top) {
    avro_value_t b;
    svc_err_t    err = SVC_OK;
    if (top ? opt_branch(r, "model", &b) : sch_av_field(r, "model", &b)) {
        err = w_key(d, first, "model");
        if (!err)
            err = sch_av_w_str(d, &b, "model");
    }
    if (!err && (top ? opt_branch(r, "answers", &b) : sch_av_field(r, "answers", &b))) {
        err = w_key(d, first, "answers");
        if (!err)
            err = w_answers(d, &b, "answers");
    }
    if (!err && (top ? opt_branch(r, "usage", &b) : sch_av_field(r, "usage", &b))) {
        err = w_key(d, first, "usage");
        if (!err)
            err = w_usage(d, &b, "usage");
    }
    if (!err && opt_branch(r, "meta", &b)) {
        err = w_key(d, first, "meta");
        if (!err)
            err = w_meta(d, &b, "meta");
    }
    return err;
}

static svc_err_t w_state(dec_t *d, avro_value_t *v, const char *what) {
    bool      first = true;
    svc_err_t err = svc_buf_addc(d->out, '{');
    (void)what;
    if (!err)
        err = w_body(d, &first, v, false);
    return err ? err : svc_buf_addc(d->out, '}');
}

svc_err_t sch_avro_answer_to_json(const sch_avro_writer_t *w, const void *body, size_t len,
                                  svc_buf_t *out, char *errstr, size_t errstr_size) {
    sch_av_decoded_t dv;
    svc_err_t        err = sch_av_decode(SCH_AVRO_ANSWER, w, body, len, &dv, errstr, errstr_size);
    if (err)
        return err;
    dec_t        d = {out, "answer", errstr, errstr_size};
    avro_value_t b;
    bool         first = true;
    size_t       start = out->len;
    err = svc_buf_addc(out, '{');
    if (!err)
        err = w_body(&d, &first, &dv.view, true);
    if (!err && opt_branch(&dv.view, "states", &b)) {
        err = w_key(&d, &first, "states");
        if (!err)
            err = w_entries(&d, &b, "states", w_state);
    }
    if (!err && opt_branch(&dv.view, "error", &b)) {
        bool efirst = true;
        err = w_key(&d, &first, "error");
        if (!err)
            err = svc_buf_addc(out, '{');
        if (!err)
            err = w_field(&d, &efirst, &b, "code", sch_av_w_str);
        if (!err)
            err = w_field(&d, &efirst, &b, "message", sch_av_w_str);
        if (!err)
            err = svc_buf_addc(out, '}');
    }
    return sch_av_decode_end(err, &d, start, &dv);
}
