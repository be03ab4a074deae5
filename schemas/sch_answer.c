/*
 * sch_answer.c -- the bodies d3stream writes (SPEC b.1-b.9): the 200
 * response with its answers, the {"error": ...} body, and the verdict of
 * `d3stream validate`.
 *
 * Everything is compact JSON ("," and ":") with raw UTF-8, as upstream's
 * JSON renderer writes it. A number that is not finite never reaches a
 * body: the writers below return SVC_ERR_INVALID for it and the caller
 * answers 500 internal_error instead (upstream's allow_nan=False).
 */
#include "sch_int.h"

#include <math.h>

static const char *const NON_FINITE = "the model produced a non-finite number";
static const char *const BAD_OUTPUT = "need one finite non-negative probability per option";

/* ---- small writers ----------------------------------------------------- */

/* `"key":` for a static ASCII key; a leading comma unless first. */
static svc_err_t w_key(svc_buf_t *out, const char *key, bool first) {
    svc_err_t err = first ? SVC_OK : svc_buf_addc(out, ',');
    if (!err)
        err = sch_json_write_string(out, key, strlen(key));
    return err ? err : svc_buf_addc(out, ':');
}

static svc_err_t w_cstr(svc_buf_t *out, const char *s) {
    return s ? sch_json_write_string(out, s, strlen(s)) : svc_buf_adds(out, "null");
}

/* A double, or SVC_ERR_INVALID when it is not finite. */
static svc_err_t w_double(svc_buf_t *out, double d) {
    return isfinite(d) ? sch_json_write_double(out, d) : SVC_ERR_INVALID;
}

/* An echoed request value (or null), refusing non-finite numbers. */
static svc_err_t w_raw(svc_buf_t *out, const sch_json_t *v) {
    if (!v)
        return svc_buf_adds(out, "null");
    if (!sch_json_all_finite(v))
        return SVC_ERR_INVALID;
    return sch_json_dump_compact(v, out);
}

static const char *type_name(sch_qtype_t type) {
    return type == SCH_Q_CHOICE ? "choice" : type == SCH_Q_NOUL ? "noul" : "score";
}

/* {"type":...,"error":...[,"message":...]} */
/* message: NULL, or message_len bytes. */
static svc_err_t w_error_answer(svc_buf_t *out, const sch_json_t *raw, const char *type,
                                const char *code, const char *message, size_t message_len) {
    svc_err_t err = svc_buf_addc(out, '{');
    if (!err)
        err = w_key(out, "type", true);
    if (!err)
        err = type ? w_cstr(out, type) : w_raw(out, raw);
    if (!err)
        err = w_key(out, "error", false);
    if (!err)
        err = w_cstr(out, code);
    if (!err && message) {
        err = w_key(out, "message", false);
        if (!err)
            err = sch_json_write_string(out, message, message_len);
    }
    return err ? err : svc_buf_addc(out, '}');
}

svc_err_t sch_question_error_encode(const sch_question_t *q, svc_buf_t *out) {
    return w_error_answer(out, q->raw_type, NULL, q->error_code, q->error_message,
                          q->error_message_len);
}

/* ---- b.2-b.4: one answer ----------------------------------------------- */

/* `_confidence`: 1 - H / ln(n), clipped to [0, 1]. */
static double confidence(const double *p, size_t n) {
    if (n <= 1)
        return 1.0;
    double *terms = malloc(n * sizeof *terms);
    size_t  k = 0;
    if (!terms)
        return NAN; /* reported as a non-finite number */
    for (size_t i = 0; i < n; i++)
        if (p[i] > 0)
            terms[k++] = p[i] * log(p[i]);
    double entropy = -sch_py_fsum(terms, k);
    free(terms);
    double c = 1.0 - entropy / log((double)n);
    return c > 1.0 ? 1.0 : c < 0.0 ? 0.0 : c;
}

/* `{"0":p0,...}` or `{"key":p,...}` in option order. */
static svc_err_t w_probabilities(svc_buf_t *out, const sch_question_t *q, const double *p) {
    svc_err_t err = svc_buf_addc(out, '{');
    for (size_t i = 0; !err && i < q->n_options; i++) {
        if (i)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = sch_json_write_string(out, q->options[i].key, q->options[i].key_len);
        if (!err)
            err = svc_buf_addc(out, ':');
        if (!err)
            err = w_double(out, p[i]);
    }
    return err ? err : svc_buf_addc(out, '}');
}

/* Score legend: a string level verbatim, any other as canonical JSON text. */
static svc_err_t w_legend(svc_buf_t *out, const sch_question_t *q) {
    svc_buf_t text;
    svc_buf_init(&text, out->max);
    svc_err_t err = svc_buf_addc(out, '{');
    for (size_t i = 0; !err && i < q->n_options; i++) {
        const sch_json_t *level = q->options[i].desc;
        if (i)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = w_key(out, q->options[i].key, true);
        if (err)
            break;
        if (sch_json_type(level) == SCH_JSON_STRING) {
            err = w_raw(out, level);
            continue;
        }
        svc_buf_reset(&text);
        err = sch_json_dump_canonical(level, &text);
        if (!err)
            err = sch_json_write_string(out, text.data ? text.data : "", text.len);
    }
    svc_buf_fini(&text);
    return err ? err : svc_buf_addc(out, '}');
}

static size_t argmax_first(const double *p, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (p[i] > p[best])
            best = i;
    return best;
}

static svc_err_t w_typed(svc_buf_t *out, const sch_question_t *q, const double *p) {
    svc_err_t err = svc_buf_addc(out, '{');
    if (!err)
        err = w_key(out, "type", true);
    if (!err)
        err = w_cstr(out, type_name(q->type));
    if (!err && q->type == SCH_Q_NOUL) {
        err = w_key(out, "noul", false);
        return err ? err : w_double(out, p[1]);
    }
    if (!err && q->type == SCH_Q_CHOICE) {
        const sch_option_t *best = &q->options[argmax_first(p, q->n_options)];
        err = w_key(out, "choice", false);
        if (!err)
            err = sch_json_write_string(out, best->key, best->key_len);
    } else if (!err) {
        double *terms = malloc(q->n_options * sizeof *terms);
        if (!terms)
            return SVC_ERR_NOMEM;
        for (size_t i = 0; i < q->n_options; i++)
            terms[i] = (double)i * p[i];
        double score = sch_py_fsum(terms, q->n_options);
        free(terms);
        err = w_key(out, "score", false);
        if (!err)
            err = w_double(out, score);
    }
    if (!err)
        err = w_key(out, "probabilities", false);
    if (!err)
        err = w_probabilities(out, q, p);
    if (!err)
        err = w_key(out, "confidence", false);
    if (!err)
        err = w_double(out, confidence(p, q->n_options));
    if (!err && q->type == SCH_Q_SCORE) {
        err = w_key(out, "legend", false);
        if (!err)
            err = w_legend(out, q);
    }
    return err;
}

/* `product_answer`: check, renormalise, then the typed answer. */
static svc_err_t w_answered(svc_buf_t *out, const sch_question_t *q, const double *probs) {
    size_t n = q->n_options;
    bool   ok = n > 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = isfinite(probs[i]) && probs[i] >= 0;
    double total = ok ? sch_py_fsum(probs, n) : 0.0;
    if (!ok || !(total > 0))
        return w_error_answer(out, NULL, type_name(q->type), "invalid_model_output", BAD_OUTPUT,
                              strlen(BAD_OUTPUT));
    double *p = malloc(n * sizeof *p);
    if (!p)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        p[i] = probs[i] / total;
    svc_err_t err = w_typed(out, q, p);
    free(p);
    if (!err && q->require_full_input) {
        err = w_key(out, "input_coverage", false);
        if (!err)
            err = svc_buf_adds(out, "\"complete\"");
    }
    return err ? err : svc_buf_addc(out, '}');
}

static svc_err_t w_answer(svc_buf_t *out, const sch_question_t *q, const sch_result_t *r) {
    if (q->error_code)
        return w_error_answer(out, q->raw_type, NULL, q->error_code, q->error_message,
                              q->error_message_len);
    if (!r || r->error_code)
        return w_error_answer(
            out, NULL, type_name(q->type), r ? r->error_code : "invalid_model_output",
            r ? r->error_message : NULL, r && r->error_message ? strlen(r->error_message) : 0);
    if (!r->probs)
        return w_error_answer(out, NULL, type_name(q->type), "invalid_model_output", NULL, 0);
    return w_answered(out, q, r->probs);
}

/* ---- b.1, b.5, b.8: one part's body ------------------------------------ */

/* Python's round(x, 3): correctly rounded to 3 decimals, then repr. */
static svc_err_t w_ms(svc_buf_t *out, double ms) {
    char text[400];
    if (!isfinite(ms))
        return SVC_ERR_INVALID;
    snprintf(text, sizeof text, "%.3f", ms);
    return w_double(out, strtod(text, NULL));
}

static svc_err_t w_meta(svc_buf_t *out, const sch_meta_t *m, const sch_options_t *o) {
    svc_err_t err = svc_buf_addc(out, '{');
    const struct {
        const char *key;
        const char *value;
    } fields[] = {
        {"model_id", m->model_id},         {"revision", m->revision},
        {"model_sha256", m->model_sha256}, {"profile", m->profile ? m->profile : o->profile},
        {"numerics", m->numerics},         {"engine", m->engine},
        {"accelerator", m->accelerator},   {"device", m->device},
    };
    for (size_t i = 0; !err && i < sizeof fields / sizeof fields[0]; i++) {
        err = w_key(out, fields[i].key, i == 0);
        if (!err)
            err = w_cstr(out, fields[i].value);
    }
    if (!err)
        err = w_key(out, "queue_ms", false);
    if (!err)
        err = w_ms(out, m->queue_ms);
    if (!err)
        err = w_key(out, "compute_ms", false);
    if (!err)
        err = w_ms(out, m->compute_ms);
    return err ? err : svc_buf_addc(out, '}');
}

/* `{"model":...,"answers":{...},"usage":{...}[,"meta":{...}]` (unclosed). */
static svc_err_t w_part(svc_buf_t *out, const sch_request_t *req, size_t p, const char *model_id,
                        const sch_result_t *results, size_t input_tokens, const sch_meta_t *meta) {
    const sch_part_t *part = &req->parts[p];
    svc_err_t         err = svc_buf_addc(out, '{');
    if (!err)
        err = w_key(out, "model", true);
    if (!err)
        err = w_cstr(out, model_id);
    if (!err)
        err = w_key(out, "answers", false);
    if (!err)
        err = svc_buf_addc(out, '{');
    for (size_t i = 0; !err && i < part->n_questions; i++) {
        const sch_question_t *q = &part->questions[i];
        if (i)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = sch_json_write_string(out, q->id, q->id_len);
        if (!err)
            err = svc_buf_addc(out, ':');
        if (!err)
            err = w_answer(out, q, results ? &results[i] : NULL);
    }
    if (!err)
        err = svc_buf_addf(out, "},\"usage\":{\"input_tokens\":%zu,\"output_tokens\":0}",
                           input_tokens);
    if (!err && req->options.return_meta && meta) {
        err = w_key(out, "meta", false);
        if (!err)
            err = w_meta(out, meta, &req->options);
    }
    return err;
}

static svc_err_t w_response(svc_buf_t *out, const sch_request_t *req, const char *model_id,
                            const sch_result_t *const *results, const size_t *input_tokens,
                            const sch_meta_t *meta) {
    svc_err_t err = w_part(out, req, 0, model_id, results ? results[0] : NULL,
                           input_tokens ? input_tokens[0] : 0, meta);
    if (!err && req->has_states) {
        err = w_key(out, "states", false);
        if (!err)
            err = svc_buf_addc(out, '{');
        for (size_t p = 1; !err && p < req->n_parts; p++) {
            if (p > 1)
                err = svc_buf_addc(out, ',');
            if (!err)
                err = sch_json_write_string(out, req->parts[p].name, req->parts[p].name_len);
            if (!err)
                err = svc_buf_addc(out, ':');
            if (!err)
                err = w_part(out, req, p, model_id, results ? results[p] : NULL,
                             input_tokens ? input_tokens[p] : 0, meta);
            if (!err)
                err = svc_buf_addc(out, '}');
        }
        if (!err)
            err = svc_buf_addc(out, '}');
    }
    return err ? err : svc_buf_addc(out, '}');
}

svc_err_t sch_response_encode(const sch_request_t *req, const char *model_id,
                              const sch_result_t *const *results, const size_t *input_tokens,
                              const sch_meta_t *meta, svc_buf_t *out, sch_error_t *err) {
    svc_buf_t body;
    svc_buf_init(&body, out->max);
    svc_err_t e = w_response(&body, req, model_id, results, input_tokens, meta);
    if (!e)
        e = svc_buf_add(out, body.data, body.len);
    svc_buf_fini(&body);
    if (e == SVC_ERR_INVALID)
        sch_error_set(err, 500, "internal_error", "%s", NON_FINITE);
    return e;
}

/* ---- b.7: error bodies, and the validate verdict ------------------------ */

static svc_err_t w_error_object(svc_buf_t *out, const sch_error_t *err) {
    svc_err_t e = svc_buf_adds(out, "{\"code\":");
    if (!e)
        e = w_cstr(out, err->code ? err->code : "internal_error");
    if (!e)
        e = w_key(out, "message", false);
    if (!e)
        e = err->message ? sch_json_write_string(out, err->message, err->message_len)
                         : w_cstr(out, "");
    return e ? e : svc_buf_addc(out, '}');
}

svc_err_t sch_error_encode(const sch_error_t *err, svc_buf_t *out) {
    svc_err_t e = svc_buf_adds(out, "{\"error\":");
    if (!e)
        e = w_error_object(out, err);
    return e ? e : svc_buf_addc(out, '}');
}

static svc_err_t w_verdict_error(svc_buf_t *out, const sch_error_t *err) {
    svc_err_t e = svc_buf_addf(out, "{\"status\":%d,\"error\":", err->status);
    if (!e)
        e = w_error_object(out, err);
    return e ? e : svc_buf_addc(out, '}');
}

static svc_err_t w_verdict_question(svc_buf_t *out, const sch_question_t *q) {
    if (q->error_code)
        return w_error_answer(out, q->raw_type, NULL, q->error_code, q->error_message,
                              q->error_message_len);
    svc_err_t e = svc_buf_adds(out, "{\"type\":");
    if (!e)
        e = w_cstr(out, type_name(q->type));
    if (!e)
        e = svc_buf_adds(out, ",\"options\":[");
    for (size_t i = 0; !e && i < q->n_options; i++) {
        if (i)
            e = svc_buf_addc(out, ',');
        if (!e)
            e = sch_json_write_string(out, q->options[i].key, q->options[i].key_len);
    }
    return e ? e : svc_buf_adds(out, "]}");
}

/* `"questions":{...}` of one part. */
static svc_err_t w_verdict_part(svc_buf_t *out, const sch_part_t *part) {
    svc_err_t e = svc_buf_adds(out, "\"questions\":{");
    for (size_t i = 0; !e && i < part->n_questions; i++) {
        const sch_question_t *q = &part->questions[i];
        if (i)
            e = svc_buf_addc(out, ',');
        if (!e)
            e = sch_json_write_string(out, q->id, q->id_len);
        if (!e)
            e = svc_buf_addc(out, ':');
        if (!e)
            e = w_verdict_question(out, q);
    }
    return e ? e : svc_buf_addc(out, '}');
}

static svc_err_t w_verdict(svc_buf_t *out, const sch_request_t *req) {
    svc_err_t e = svc_buf_adds(out, "{\"status\":200,");
    if (!e)
        e = w_verdict_part(out, &req->parts[0]);
    if (!e && req->has_states) {
        e = svc_buf_adds(out, ",\"states\":{");
        for (size_t p = 1; !e && p < req->n_parts; p++) {
            if (p > 1)
                e = svc_buf_addc(out, ',');
            if (!e)
                e = sch_json_write_string(out, req->parts[p].name, req->parts[p].name_len);
            if (!e)
                e = svc_buf_addc(out, ':');
            if (!e)
                e = svc_buf_addc(out, '{');
            if (!e)
                e = w_verdict_part(out, &req->parts[p]);
            if (!e)
                e = svc_buf_addc(out, '}');
        }
        if (!e)
            e = svc_buf_addc(out, '}');
    }
    return e ? e : svc_buf_addc(out, '}');
}

svc_err_t sch_verdict_encode(const sch_request_t *req, const sch_error_t *err, svc_buf_t *out) {
    if (!req)
        return w_verdict_error(out, err);
    svc_buf_t body;
    svc_buf_init(&body, out->max);
    svc_err_t e = w_verdict(&body, req);
    if (e == SVC_ERR_INVALID) {
        /* An echoed NaN: the server would answer 500 (SPEC b.1). */
        sch_error_t nf = {500, "internal_error", (char *)NON_FINITE, strlen(NON_FINITE)};
        svc_buf_reset(&body);
        e = w_verdict_error(&body, &nf);
    }
    if (!e)
        e = svc_buf_add(out, body.data, body.len);
    svc_buf_fini(&body);
    return e;
}
