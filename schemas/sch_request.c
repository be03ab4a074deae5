/*
 * sch_request.c -- a System One request body into parts and questions
 * (SPEC a.1-a.11, b.7), with upstream's checks in upstream's order:
 *
 *   size, JSON, `states` split, object, unknown fields, model, options;
 *   then per part (own state first, then each `states` entry): state
 *   present, questions mapping, max_tokens, images and videos, state value,
 *   each question; then "no question is valid" over all parts together.
 *
 * The first whole-request failure answers; a question's failure stays in
 * the question.
 */
#include "sch_int.h"

#include <math.h>

#define MSG_SIZE 512

/* ---- errors ------------------------------------------------------------ */

void sch_error_init(sch_error_t *err) {
    err->status = 0;
    err->code = NULL;
    err->message = NULL;
    err->message_len = 0;
}

void sch_error_fini(sch_error_t *err) {
    free(err->message);
    err->message = NULL;
    err->message_len = 0;
}

void sch_error_set_bytes(sch_error_t *err, int status, const char *code, const char *msg,
                         size_t len) {
    char *m = malloc(len + 1);
    if (m) {
        memcpy(m, msg, len);
        m[len] = '\0';
    }
    free(err->message);
    err->status = status;
    err->code = code;
    err->message = m;
    err->message_len = m ? len : 0;
}

void sch_error_set(sch_error_t *err, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    free(err->message);
    err->status = status;
    err->code = code;
    err->message = NULL;
    err->message_len = 0;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    err->message = malloc((size_t)n + 1);
    if (!err->message)
        return;
    va_start(ap, fmt);
    vsnprintf(err->message, (size_t)n + 1, fmt, ap);
    va_end(ap);
    err->message_len = (size_t)n;
}

/* Sets a 400 invalid_request (or the given status) and returns INVALID. */
SVC_FMT(4, 5)
static svc_err_t refuse(sch_error_t *err, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    char    msg[MSG_SIZE];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sch_error_set(err, status, code, "%s", msg);
    return SVC_ERR_INVALID;
}

/* A long message (it may quote the request) built in a buffer. */
static svc_err_t refuse_buf(sch_error_t *err, svc_buf_t *msg) {
    sch_error_set_bytes(err, 400, "invalid_request", msg->data ? msg->data : "", msg->len);
    svc_buf_fini(msg);
    return SVC_ERR_INVALID;
}

static svc_err_t out_of_memory(sch_error_t *err) {
    sch_error_set(err, 500, "internal_error", "MemoryError");
    return SVC_ERR_NOMEM;
}

/* ---- owned strings ----------------------------------------------------- */

char *sch_req_keep(sch_request_t *req, char *s) {
    if (req->n_strs == req->cap_strs) {
        size_t cap = req->cap_strs ? req->cap_strs * 2 : 16;
        char **strs = realloc(req->strs, cap * sizeof *strs);
        if (!strs) {
            free(s);
            return NULL;
        }
        req->strs = strs;
        req->cap_strs = cap;
    }
    req->strs[req->n_strs++] = s;
    return s;
}

/* ---- accessors --------------------------------------------------------- */

void sch_request_free(sch_request_t *req) {
    if (!req)
        return;
    for (size_t p = 0; p < req->n_parts && req->own; p++) {
        sch_part_own_t *own = &req->own[p];
        for (size_t q = 0; own->questions && q < req->parts[p].n_questions; q++)
            free((void *)own->questions[q].options);
        for (size_t i = 0; own->images && i < req->parts[p].n_images; i++)
            free((void *)own->images[i].bytes);
        free(own->questions);
        free(own->images);
    }
    for (size_t i = 0; i < req->n_strs; i++)
        free(req->strs[i]);
    free(req->strs);
    sch_error_fini(&req->pending);
    free(req->own);
    free(req->parts);
    sch_jdoc_free(req->doc);
    free(req->text);
    free(req);
}

size_t sch_request_n_parts(const sch_request_t *req) {
    return req->n_parts;
}

const sch_part_t *sch_request_part(const sch_request_t *req, size_t i) {
    return i < req->n_parts ? &req->parts[i] : NULL;
}

const sch_options_t *sch_request_options(const sch_request_t *req) {
    return &req->options;
}

const char *sch_request_model(const sch_request_t *req, size_t *len) {
    if (len)
        *len = req->model_len;
    return req->model;
}

/* ---- a.1: bytes to JSON ------------------------------------------------ */

static svc_err_t parse_body(sch_request_t *req, const char *body, size_t len,
                            const sch_limits_t *limits, sch_error_t *err) {
    size_t max = limits ? limits->max_request_bytes : SCH_DEFAULT_MAX_REQUEST_BYTES;
    if (len > max)
        return refuse(err, 413, "request_too_large", "the request body exceeds %zu bytes", max);
    req->text = malloc(len + 1);
    if (!req->text)
        return out_of_memory(err);
    if (len)
        memcpy(req->text, body, len);
    req->text[len] = '\0';
    sch_jfail_t fail = SCH_JFAIL_NONE;
    char        msg[MSG_SIZE] = "";
    req->doc = sch_json_parse(req->text, len, &fail, msg, sizeof msg);
    if (req->doc)
        return SVC_OK;
    switch (fail) {
    case SCH_JFAIL_SURROGATE:
        return refuse(err, 400, "invalid_request", "the request contains an unpaired surrogate");
    case SCH_JFAIL_NOMEM:
    case SCH_JFAIL_NONE:
        return out_of_memory(err);
    default:
        return refuse(err, 400, "invalid_request", "the request body is not JSON: %s", msg);
    }
}

/* ---- a.9: states ------------------------------------------------------- */

static bool entry_key_ok(const char *k, size_t n, bool *has_state, bool *has_questions) {
    if (sch_str_is(k, n, "state"))
        return (*has_state = true);
    if (sch_str_is(k, n, "questions"))
        return (*has_questions = true);
    return sch_str_is(k, n, "images") || sch_str_is(k, n, "videos");
}

/* `split_states`: runs before any other check of the body. */
static svc_err_t check_states(const sch_json_t *states, sch_error_t *err) {
    if (sch_json_type(states) != SCH_JSON_OBJECT)
        return refuse(err, 400, "invalid_request", "states must be an object of named states");
    for (size_t i = 0; i < sch_json_size(states); i++) {
        size_t            n;
        const char       *name = sch_json_key_at(states, i, &n);
        const sch_json_t *entry = sch_json_at(states, i);
        if (sch_py_blank(name, n))
            return refuse(err, 400, "invalid_request",
                          "every state in states needs a non-blank name");
        bool ok = sch_json_type(entry) == SCH_JSON_OBJECT;
        bool has_state = false, has_questions = false;
        for (size_t k = 0; ok && k < sch_json_size(entry); k++) {
            size_t      kn;
            const char *key = sch_json_key_at(entry, k, &kn);
            ok = entry_key_ok(key, kn, &has_state, &has_questions);
        }
        if (!ok || !has_state || !has_questions) {
            svc_buf_t msg;
            svc_buf_init(&msg, SIZE_MAX / 2);
            svc_err_t e = svc_buf_adds(&msg, "states[");
            if (!e)
                e = sch_py_repr_str(&msg, name, n);
            if (!e)
                e = svc_buf_adds(&msg, "] must hold state and questions, and may hold images "
                                       "and videos");
            if (e) {
                svc_buf_fini(&msg);
                return out_of_memory(err);
            }
            return refuse_buf(err, &msg);
        }
    }
    return SVC_OK;
}

/* ---- a.2: top-level fields and model ----------------------------------- */

static bool top_field(const char *k, size_t n) {
    static const char *const fields[] = {"model",  "state",   "questions", "images",
                                         "videos", "options", "states"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (sch_str_is(k, n, fields[i]))
            return true;
    return false;
}

static svc_err_t check_unknown(const sch_json_t *root, sch_error_t *err) {
    size_t     n = sch_json_size(root);
    size_t     n_unknown = 0;
    sch_str_t *unknown = calloc(n ? n : 1, sizeof *unknown);
    if (!unknown)
        return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        sch_str_t k;
        k.s = sch_json_key_at(root, i, &k.n);
        if (!top_field(k.s, k.n))
            unknown[n_unknown++] = k;
    }
    if (!n_unknown) {
        free(unknown);
        return SVC_OK;
    }
    svc_buf_t msg;
    svc_buf_init(&msg, SIZE_MAX / 2);
    sch_str_sort(unknown, n_unknown);
    svc_err_t e = svc_buf_adds(&msg, "unknown request fields: ");
    if (!e)
        e = sch_py_repr_list(&msg, unknown, n_unknown);
    free(unknown);
    if (e) {
        svc_buf_fini(&msg);
        return out_of_memory(err);
    }
    return refuse_buf(err, &msg);
}

static svc_err_t check_model(sch_request_t *req, const sch_json_t *root,
                             const sch_model_info_t *model, sch_error_t *err) {
    const sch_json_t *m = sch_json_get(root, "model", 5);
    if (!m || sch_json_type(m) == SCH_JSON_NULL)
        return SVC_OK;
    if (sch_json_type(m) != SCH_JSON_STRING)
        return refuse(err, 400, "invalid_request", "model must be a string");
    req->model = sch_json_string(m, &req->model_len);
    if (!model)
        return SVC_OK;
    for (size_t i = 0; i < model->n_names; i++) {
        const char *name = model->names[i];
        if (name && *name && sch_str_is(req->model, req->model_len, name))
            return SVC_OK;
    }
    /* the name as sent, NUL included (printf's %.*s would stop at one) */
    svc_buf_t msg;
    svc_buf_init(&msg, SIZE_MAX / 2);
    if (svc_buf_addf(&msg, "this runtime serves %s, not ", model->label) ||
        svc_buf_add(&msg, req->model, req->model_len)) {
        svc_buf_fini(&msg);
        return out_of_memory(err);
    }
    sch_error_set_bytes(err, 404, "model_not_found", msg.data, msg.len);
    svc_buf_fini(&msg);
    return SVC_ERR_INVALID;
}

/* ---- a.8: options ------------------------------------------------------ */

static bool option_field(const char *k, size_t n) {
    return sch_str_is(k, n, "deadline_ms") || sch_str_is(k, n, "max_tokens") ||
           sch_str_is(k, n, "profile") || sch_str_is(k, n, "return_meta");
}

/* Python's float(int) raises OverflowError past the double range. */
static svc_err_t check_deadline(sch_request_t *req, const sch_json_t *v, sch_error_t *err) {
    sch_jtype_t t = sch_json_type(v);
    if (t == SCH_JSON_INT && !isfinite(sch_json_number(v)))
        return refuse(err, 500, "internal_error",
                      "OverflowError: int too large to convert to float");
    double d = (t == SCH_JSON_INT || t == SCH_JSON_REAL) ? sch_json_number(v) : NAN;
    if (!isfinite(d) || d <= 0)
        return refuse(err, 400, "invalid_request", "options.deadline_ms must be a positive number");
    req->options.has_deadline = true;
    req->options.deadline_ms = d;
    return SVC_OK;
}

/* Without model info: the profiles every model enables (SPEC point 6). */
static const char *const DEFAULT_PROFILES[] = {"exact", "fast"};

static svc_err_t refuse_profile(const sch_model_info_t *model, sch_error_t *err) {
    bool               own = model && model->n_profiles;
    size_t             n = own ? model->n_profiles : 2;
    const char *const *names = own ? model->profiles : DEFAULT_PROFILES;
    sch_str_t         *list = calloc(n, sizeof *list);
    if (!list)
        return out_of_memory(err);
    for (size_t i = 0; i < n; i++)
        list[i] = (sch_str_t){names[i], strlen(names[i])};
    sch_str_sort(list, n);
    svc_buf_t msg;
    svc_buf_init(&msg, SIZE_MAX / 2);
    svc_err_t e = svc_buf_adds(&msg, "options.profile must be one of ");
    if (!e)
        e = sch_py_repr_list(&msg, list, n);
    free(list);
    if (e) {
        svc_buf_fini(&msg);
        return out_of_memory(err);
    }
    return refuse_buf(err, &msg);
}

/* Without model info any string names a profile: the served model's list is
 * unknown to `d3stream validate`. */
static svc_err_t check_profile(sch_request_t *req, const sch_json_t *v,
                               const sch_model_info_t *model, sch_error_t *err) {
    if (sch_json_type(v) != SCH_JSON_STRING)
        return refuse_profile(model, err);
    size_t      n;
    const char *s = sch_json_string(v, &n);
    if (!model || model->n_profiles == 0) {
        req->options.profile = s;
        return SVC_OK;
    }
    for (size_t i = 0; i < model->n_profiles; i++)
        if (sch_str_is(s, n, model->profiles[i])) {
            req->options.profile = model->profiles[i]; /* NUL-terminated, lives on */
            return SVC_OK;
        }
    return refuse_profile(model, err);
}

static svc_err_t check_options(sch_request_t *req, const sch_json_t *opts,
                               const sch_model_info_t *model, sch_error_t *err) {
    req->options.profile = model && model->default_profile ? model->default_profile : "exact";
    if (!opts || !sch_json_truthy(opts))
        return SVC_OK;
    bool ok = sch_json_type(opts) == SCH_JSON_OBJECT;
    for (size_t i = 0; ok && i < sch_json_size(opts); i++) {
        size_t      n;
        const char *k = sch_json_key_at(opts, i, &n);
        ok = option_field(k, n);
    }
    if (!ok)
        return refuse(err, 400, "invalid_request",
                      "options accepts only ['deadline_ms', 'max_tokens', 'profile', "
                      "'return_meta']");
    const sch_json_t *v = sch_json_get(opts, "deadline_ms", strlen("deadline_ms"));
    svc_err_t         e = v ? check_deadline(req, v, err) : SVC_OK;
    v = sch_json_get(opts, "profile", strlen("profile"));
    if (!e && v)
        e = check_profile(req, v, model, err);
    v = sch_json_get(opts, "return_meta", strlen("return_meta"));
    if (!e && v && sch_json_type(v) != SCH_JSON_BOOL)
        return refuse(err, 400, "invalid_request", "options.return_meta must be a boolean");
    if (!e && v)
        req->options.return_meta = sch_json_bool(v);
    return e;
}

/* `max_tokens` (checked per part, after `questions`). */
static svc_err_t check_max_tokens(const sch_json_t *opts, sch_error_t *err) {
    if (!opts || sch_json_type(opts) != SCH_JSON_OBJECT)
        return SVC_OK;
    const sch_json_t *v = sch_json_get(opts, "max_tokens", strlen("max_tokens"));
    if (!v || sch_json_type(v) == SCH_JSON_NULL)
        return SVC_OK;
    bool positive = false;
    if (sch_json_type(v) == SCH_JSON_INT) {
        size_t      n;
        const char *t = sch_json_int_text(v, &n);
        positive = n > 0 && t[0] != '-' && !(n == 1 && t[0] == '0');
    }
    if (!positive)
        return refuse(err, 400, "invalid_request", "max_tokens must be a positive integer");
    /* Every d3stream model reads one bounded input. */
    return refuse(err, 400, "invalid_request",
                  "max_tokens is the scan budget of a model that reads parts in windows; this "
                  "model reads one bounded input and rejects a longer one");
}

/* ---- one part ---------------------------------------------------------- */

/* What one part's body holds (the request's own, or a `states` entry). */
typedef struct part_src {
    const char       *name;
    size_t            name_len;
    bool              has_state;
    const sch_json_t *state;
    const sch_json_t *questions;
    const sch_json_t *images;
    const sch_json_t *videos;
} part_src_t;

static bool questions_ok(const sch_json_t *qs) {
    if (!qs || sch_json_type(qs) != SCH_JSON_OBJECT || sch_json_size(qs) == 0)
        return false;
    for (size_t i = 0; i < sch_json_size(qs); i++) {
        size_t      n;
        const char *k = sch_json_key_at(qs, i, &n);
        if (sch_py_blank(k, n))
            return false;
    }
    return true;
}

/* A media list: absent, null or [] is none; otherwise it must be a list. */
static bool media_list(const sch_json_t *v, size_t *n) {
    *n = 0;
    if (!v || sch_json_type(v) == SCH_JSON_NULL)
        return true;
    if (sch_json_type(v) != SCH_JSON_ARRAY)
        return false;
    *n = sch_json_size(v);
    return true;
}

static svc_err_t read_images(sch_request_t *req, size_t p, const sch_json_t *list,
                             const sch_model_info_t *model, sch_error_t *err) {
    bool   aspect = !model || !model->engine_decodes; /* else the engine's, after its decode */
    size_t n = sch_json_size(list);
    sch_image_t *imgs = calloc(n, sizeof *imgs);
    if (!imgs)
        return out_of_memory(err);
    req->own[p].images = imgs;
    req->parts[p].images = imgs; /* those before a refused one stay (sch_request_pending) */
    for (size_t i = 0; i < n; i++) {
        char      msg[MSG_SIZE];
        svc_err_t e = sch_image_decode(sch_json_at(list, i), &imgs[i], aspect, msg, sizeof msg);
        if (e == SVC_ERR_INVALID)
            return refuse(err, 400, "invalid_request", "images[%zu]: %s", i, msg);
        if (e)
            return out_of_memory(err);
        req->parts[p].n_images = i + 1;
    }
    return SVC_OK;
}

static svc_err_t read_media(sch_request_t *req, size_t p, const part_src_t *src,
                            const sch_model_info_t *model, sch_error_t *err) {
    size_t n_images, n_videos;
    if (!media_list(src->images, &n_images))
        return refuse(err, 400, "invalid_request", "images must be a list of image data URLs");
    if (!media_list(src->videos, &n_videos))
        return refuse(err, 400, "invalid_request", "videos must be a list of video data URLs");
    if (!n_images && !n_videos)
        return SVC_OK;
    /* Upstream checks a package without a vision tower for videos first
     * (issue 30: its words, whatever images come with them). */
    if (model && !model->has_vision && n_videos && !model->reads_videos)
        return refuse(err, 400, "invalid_request", "model %s reads no videos", model->label);
    if (model && !model->has_vision)
        return refuse(err, 400, "invalid_request",
                      "model %s has no vision tower; images are not supported", model->label);
    svc_err_t e = n_images ? read_images(req, p, src->images, model, err) : SVC_OK;
    if (e || !n_videos)
        return e;
    /* d3stream decodes no videos; without model info none is readable. */
    if (!model || !model->reads_videos)
        return refuse(err, 400, "invalid_request", "model %s reads no videos",
                      model ? model->label : "d3stream");
    for (size_t i = 0; i < n_videos; i++) {
        char msg[MSG_SIZE];
        e = sch_video_check(sch_json_at(src->videos, i), msg, sizeof msg);
        if (e == SVC_ERR_INVALID)
            return refuse(err, 400, "invalid_request", "videos[%zu]: %s", i, msg);
        if (e)
            return out_of_memory(err);
    }
    req->parts[p].n_videos = n_videos;
    return SVC_OK;
}

static bool state_ok(const sch_json_t *s) {
    sch_jtype_t t = sch_json_type(s);
    if (t == SCH_JSON_STRING)
        return true;
    return (t == SCH_JSON_OBJECT || t == SCH_JSON_ARRAY) && sch_json_all_finite(s);
}

static svc_err_t read_questions(sch_request_t *req, size_t p, const sch_json_t *qs,
                                sch_error_t *err) {
    size_t          n = sch_json_size(qs);
    sch_question_t *q = calloc(n, sizeof *q);
    sch_part_t     *part = &req->parts[p];
    bool            media = part->n_images || part->n_videos;
    bool            state_token = false;
    if (!q)
        return out_of_memory(err);
    req->own[p].questions = q;
    part->questions = q;
    part->n_questions = n;
    svc_err_t e = media ? sch_state_has_placeholder(part->state, &state_token) : SVC_OK;
    for (size_t i = 0; !e && i < n; i++) {
        q[i].id = sch_json_key_at(qs, i, &q[i].id_len);
        e = sch_question_read(req, sch_json_at(qs, i), &q[i]);
        bool token = state_token;
        if (!e && media && !q[i].error_code && !token)
            e = sch_question_has_placeholder(&q[i], &token);
        if (!e && media && !q[i].error_code && token) {
            free((void *)q[i].options);
            q[i].options = NULL;
            e = sch_question_fail(req, &q[i],
                                  "the state or question contains a literal image "
                                  "or video placeholder token");
        }
    }
    return e ? out_of_memory(err) : SVC_OK;
}

static svc_err_t read_part(sch_request_t *req, size_t p, const part_src_t *src,
                           const sch_json_t *opts, const sch_model_info_t *model,
                           sch_error_t *err) {
    sch_part_t *part = &req->parts[p];
    part->name = src->name;
    part->name_len = src->name_len;
    if (!src->has_state)
        return refuse(err, 400, "invalid_request", "state is required");
    part->state = src->state;
    if (!questions_ok(src->questions))
        return refuse(err, 400, "invalid_request",
                      "questions must be a nonempty mapping of question IDs");
    svc_err_t e = check_max_tokens(opts, err);
    if (!e)
        e = read_media(req, p, src, model, err);
    if (e)
        return e;
    if (!state_ok(src->state))
        return refuse(err, 400, "invalid_request", "state must be text, an object, or an array");
    return read_questions(req, p, src->questions, err);
}

/* ---- b.7: no question is valid ----------------------------------------- */

static svc_err_t check_any_valid(const sch_request_t *req, sch_error_t *err) {
    for (size_t p = 0; p < req->n_parts; p++)
        for (size_t q = 0; q < req->parts[p].n_questions; q++)
            if (!req->parts[p].questions[q].error_code)
                return SVC_OK;
    svc_buf_t msg;
    svc_buf_init(&msg, SIZE_MAX / 2);
    svc_err_t e = svc_buf_adds(&msg, "no question is valid (");
    for (size_t p = 0; !e && p < req->n_parts; p++) {
        for (size_t i = 0; !e && i < req->parts[p].n_questions; i++) {
            const sch_question_t *q = &req->parts[p].questions[i];
            if (msg.len > strlen("no question is valid ("))
                e = svc_buf_adds(&msg, "; ");
            if (!e)
                e = svc_buf_add(&msg, q->id, q->id_len);
            if (!e)
                e = svc_buf_adds(&msg, ": ");
            if (!e)
                e = q->error_message ? svc_buf_add(&msg, q->error_message, q->error_message_len)
                                     : svc_buf_adds(&msg, "invalid_question");
        }
    }
    if (!e)
        e = svc_buf_addc(&msg, ')');
    if (e) {
        svc_buf_fini(&msg);
        return out_of_memory(err);
    }
    return refuse_buf(err, &msg);
}

/* ---- an error held behind the images (sch_model_info_t.engine_decodes) - */

/* err found while reading the first n_read parts (the last one failed, or
 * all were read and no question is valid): when images came before it,
 * the request keeps them, drops every question, and holds err for the
 * engine, which answers the first image that fails to decode instead. */
static svc_err_t hold_behind_images(sch_request_t *req, size_t n_read, sch_error_t *err) {
    size_t n_images = 0;
    for (size_t p = 0; p < n_read; p++)
        n_images += req->parts[p].n_images;
    if (!n_images)
        return SVC_ERR_INVALID;
    for (size_t p = 0; p < n_read; p++) {
        sch_part_own_t *own = &req->own[p];
        for (size_t q = 0; own->questions && q < req->parts[p].n_questions; q++)
            free((void *)own->questions[q].options);
        free(own->questions);
        own->questions = NULL;
        req->parts[p].questions = NULL;
        req->parts[p].n_questions = 0;
    }
    for (size_t p = n_read; p < req->n_parts; p++)
        SVC_ASSERT(!req->parts[p].n_images && !req->own[p].questions);
    req->n_parts = n_read;
    req->pending = *err;
    sch_error_init(err);
    return SVC_OK;
}

const sch_error_t *sch_request_pending(const sch_request_t *req) {
    return req->pending.code ? &req->pending : NULL;
}

/* ---- the whole request ------------------------------------------------- */

static svc_err_t alloc_parts(sch_request_t *req, const sch_json_t *states, sch_error_t *err) {
    req->n_parts = 1 + (states ? sch_json_size(states) : 0);
    req->parts = calloc(req->n_parts, sizeof *req->parts);
    req->own = calloc(req->n_parts, sizeof *req->own);
    return req->parts && req->own ? SVC_OK : out_of_memory(err);
}

static void part_source(const sch_json_t *body, part_src_t *src) {
    memset(src, 0, sizeof *src);
    src->state = sch_json_get(body, "state", 5);
    src->has_state = src->state != NULL;
    src->questions = sch_json_get(body, "questions", 9);
    src->images = sch_json_get(body, "images", 6);
    src->videos = sch_json_get(body, "videos", 6);
}

static svc_err_t decode_root(sch_request_t *req, const sch_model_info_t *model, sch_error_t *err) {
    const sch_json_t *root = sch_jdoc_root(req->doc);
    const sch_json_t *states = NULL;
    if (sch_json_type(root) == SCH_JSON_OBJECT)
        states = sch_json_get(root, "states", 6);
    req->has_states = states != NULL;
    svc_err_t e = states ? check_states(states, err) : SVC_OK;
    if (e)
        return e;
    if (sch_json_type(root) != SCH_JSON_OBJECT)
        return refuse(err, 400, "invalid_request", "the request body must be a JSON object");
    const sch_json_t *opts = sch_json_get(root, "options", 7);
    e = check_unknown(root, err);
    if (!e)
        e = check_model(req, root, model, err);
    if (!e)
        e = check_options(req, opts, model, err);
    if (!e)
        e = alloc_parts(req, states, err);
    size_t n_read = 0;
    for (size_t p = 0; !e && p < req->n_parts; p++, n_read++) {
        part_src_t src;
        part_source(p ? sch_json_at(states, p - 1) : root, &src);
        if (p)
            src.name = sch_json_key_at(states, p - 1, &src.name_len);
        e = read_part(req, p, &src, opts, model, err);
    }
    if (!e)
        e = check_any_valid(req, err);
    if (e == SVC_ERR_INVALID && model && model->engine_decodes)
        e = hold_behind_images(req, n_read, err);
    return e;
}

svc_err_t sch_request_decode(const char *body, size_t len, const sch_limits_t *limits,
                             const sch_model_info_t *model, sch_request_t **out, sch_error_t *err) {
    *out = NULL;
    sch_request_t *req = calloc(1, sizeof *req);
    if (!req)
        return out_of_memory(err);
    svc_err_t e = parse_body(req, body, len, limits, err);
    if (!e)
        e = decode_root(req, model, err);
    if (e) {
        sch_request_free(req);
        return e;
    }
    *out = req;
    return SVC_OK;
}
