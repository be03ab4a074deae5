/*
 * sch_question.c -- one System One question (SPEC a.5-a.7): the shared
 * rules in upstream's order, then the choice, noul and score options.
 *
 * A failed rule is not an error of the call: the question keeps
 * invalid_question and its message, and the request goes on (SPEC b.6).
 * Only running out of memory fails a call here.
 */
#include "sch_int.h"

#define MIN_OPTIONS 2
#define MAX_OPTIONS 255
#define MIN_LEVELS  2
#define MAX_LEVELS  10

static const char *const LEVEL_KEYS[MAX_LEVELS] = {"0", "1", "2", "3", "4",
                                                   "5", "6", "7", "8", "9"};

static const char *const INVALID_QUESTION = "invalid_question";

svc_err_t sch_question_fail(sch_request_t *req, sch_question_t *q, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return SVC_ERR_INTERNAL;
    char *msg = malloc((size_t)n + 1);
    if (!msg)
        return SVC_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    va_end(ap);
    if (!sch_req_keep(req, msg))
        return SVC_ERR_NOMEM;
    q->error_code = INVALID_QUESTION;
    q->error_message = msg;
    q->error_message_len = (size_t)n;
    q->n_options = 0;
    return SVC_OK;
}

/* sch_question_fail with the message where[0..where_len) + text: where is
 * a key as sent, which may hold a NUL that printf would stop at. */
static svc_err_t fail_at(sch_request_t *req, sch_question_t *q, const char *where, size_t where_len,
                         const char *text) {
    size_t tn = strlen(text);
    char  *msg = malloc(where_len + tn + 1);
    if (!msg)
        return SVC_ERR_NOMEM;
    memcpy(msg, where, where_len);
    memcpy(msg + where_len, text, tn + 1);
    if (!sch_req_keep(req, msg))
        return SVC_ERR_NOMEM;
    q->error_code = INVALID_QUESTION;
    q->error_message = msg;
    q->error_message_len = where_len + tn;
    q->n_options = 0;
    return SVC_OK;
}

/* The value of key, or NULL when absent or JSON null (Python's
 * `question.get(key) is None`). */
static const sch_json_t *get_nn(const sch_json_t *obj, const char *key) {
    const sch_json_t *v = sch_json_get(obj, key, strlen(key));
    return v && sch_json_type(v) != SCH_JSON_NULL ? v : NULL;
}

/* `content(value, where, nullable)`: *ok false when the question failed. */
static svc_err_t check_content(sch_request_t *req, sch_question_t *q, const sch_json_t *v,
                               bool nullable, const char *where, size_t where_len, bool *ok) {
    sch_jtype_t t = v ? sch_json_type(v) : SCH_JSON_NULL;
    *ok = true;
    if (t == SCH_JSON_NULL && nullable)
        return SVC_OK;
    if (t == SCH_JSON_STRING) {
        size_t      n;
        const char *s = sch_json_string(v, &n);
        if (!sch_py_blank(s, n))
            return SVC_OK;
        *ok = false;
        return fail_at(req, q, where, where_len, " must not be empty or whitespace");
    }
    if ((t == SCH_JSON_OBJECT || t == SCH_JSON_ARRAY) && sch_json_all_finite(v))
        return SVC_OK;
    *ok = false;
    return fail_at(req, q, where, where_len, " must be text, an object or an array");
}

/* check_content for `criteria.<key>` descriptions. */
static svc_err_t check_desc(sch_request_t *req, sch_question_t *q, const sch_option_t *o,
                            bool *ok) {
    svc_buf_t where;
    svc_buf_init(&where, SIZE_MAX / 2);
    svc_err_t err = svc_buf_adds(&where, "criteria.");
    if (!err)
        err = svc_buf_add(&where, o->key, o->key_len);
    if (!err)
        err = check_content(req, q, o->desc, true, where.data, where.len, ok);
    svc_buf_fini(&where);
    return err;
}

/* ---- choices: [{key, description}] ------------------------------------ */

/* An open-addressing set of keys, so a long `choices` list stays linear. */
typedef struct key_set {
    const sch_option_t **slots;
    size_t               mask;
} key_set_t;

static uint64_t key_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static svc_err_t key_set_init(key_set_t *set, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    set->slots = calloc(cap, sizeof *set->slots);
    set->mask = cap - 1;
    return set->slots ? SVC_OK : SVC_ERR_NOMEM;
}

/* Adds o; false when an equal key was there already. */
static bool key_set_add(key_set_t *set, const sch_option_t *o) {
    size_t i = (size_t)key_hash(o->key, o->key_len) & set->mask;
    while (set->slots[i]) {
        const sch_option_t *s = set->slots[i];
        if (sch_str_eq(s->key, s->key_len, o->key, o->key_len))
            return false;
        i = (i + 1) & set->mask;
    }
    set->slots[i] = o;
    return true;
}

/* One entry of `choices` into *o; *ok false when the question failed. */
static svc_err_t listed_entry(sch_request_t *req, sch_question_t *q, const sch_json_t *e, bool noul,
                              key_set_t *set, sch_option_t *o, bool *ok) {
    *ok = false;
    const sch_json_t *key = NULL;
    bool              shape = sch_json_type(e) == SCH_JSON_OBJECT;
    for (size_t i = 0; shape && i < sch_json_size(e); i++) {
        size_t      n;
        const char *k = sch_json_key_at(e, i, &n);
        if (sch_str_is(k, n, "key"))
            key = sch_json_at(e, i);
        else if (!sch_str_is(k, n, "description"))
            shape = false;
    }
    if (!shape || !key)
        return sch_question_fail(req, q, "each entry of choices is {key, description}");
    if (sch_json_type(key) != SCH_JSON_STRING)
        return sch_question_fail(req, q, "choices keys must be unique nonempty strings");
    o->key = sch_json_string(key, &o->key_len);
    o->desc = sch_json_get(e, "description", strlen("description"));
    if (o->desc && sch_json_type(o->desc) == SCH_JSON_NULL)
        o->desc = NULL;
    if (sch_py_blank(o->key, o->key_len) || !key_set_add(set, o))
        return sch_question_fail(req, q, "choices keys must be unique nonempty strings");
    if (noul && !sch_str_is(o->key, o->key_len, "false") && !sch_str_is(o->key, o->key_len, "true"))
        return sch_question_fail(req, q, "choices may contain only ['false', 'true']");
    *ok = true;
    return SVC_OK;
}

/* `listed_options(choices)`: the ordered mapping in *opts (heap, caller
 * frees), or *ok false when the question failed. */
static svc_err_t listed_options(sch_request_t *req, sch_question_t *q, const sch_json_t *list,
                                bool noul, sch_option_t **opts, size_t *n_opts, bool *ok) {
    *ok = false;
    *opts = NULL;
    *n_opts = 0;
    if (sch_json_type(list) != SCH_JSON_ARRAY)
        return sch_question_fail(req, q, "choices must be a list of {key, description}");
    size_t        n = sch_json_size(list);
    sch_option_t *o = calloc(n ? n : 1, sizeof *o);
    key_set_t     set = {0};
    svc_err_t     err = o ? key_set_init(&set, n) : SVC_ERR_NOMEM;
    bool          entry_ok = true;
    for (size_t i = 0; !err && entry_ok && i < n; i++)
        err = listed_entry(req, q, sch_json_at(list, i), noul, &set, &o[i], &entry_ok);
    free(set.slots);
    if (err || !entry_ok) {
        free(o);
        return err;
    }
    *opts = o;
    *n_opts = n;
    *ok = true;
    return SVC_OK;
}

/* ---- choice ------------------------------------------------------------ */

/* Options from a `criteria` object (NULL criteria fails the count rule). */
static svc_err_t object_options(const sch_json_t *obj, sch_option_t **opts, size_t *n_opts) {
    size_t        n = sch_json_size(obj);
    sch_option_t *o = calloc(n ? n : 1, sizeof *o);
    if (!o)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        o[i].key = sch_json_key_at(obj, i, &o[i].key_len);
        o[i].desc = sch_json_at(obj, i);
        if (sch_json_type(o[i].desc) == SCH_JSON_NULL)
            o[i].desc = NULL;
    }
    *opts = o;
    *n_opts = n;
    return SVC_OK;
}

/* `named_options`: count, then each name and description in order. Takes
 * ownership of opts (kept by q on success, freed otherwise). */
static svc_err_t named_options(sch_request_t *req, sch_question_t *q, sch_option_t *opts, size_t n,
                               bool is_mapping) {
    svc_err_t err = SVC_OK;
    bool      ok = true;
    if (!is_mapping || n < MIN_OPTIONS || n > MAX_OPTIONS) {
        free(opts);
        return sch_question_fail(req, q, "criteria must name 2 to 255 options");
    }
    for (size_t i = 0; i < n && ok && !err; i++) {
        if (sch_py_blank(opts[i].key, opts[i].key_len)) {
            ok = false;
            err = sch_question_fail(req, q, "option names must be nonempty strings");
        } else {
            err = check_desc(req, q, &opts[i], &ok);
        }
    }
    if (err || !ok) {
        free(opts);
        return err;
    }
    q->options = opts;
    q->n_options = n;
    return SVC_OK;
}

static svc_err_t read_choice(sch_request_t *req, sch_question_t *q, const sch_json_t *criteria,
                             const sch_json_t *choices) {
    sch_option_t *opts = NULL;
    size_t        n = 0;
    svc_err_t     err;
    if (choices) {
        bool ok;
        err = listed_options(req, q, choices, false, &opts, &n, &ok);
        if (err || !ok)
            return err;
        return named_options(req, q, opts, n, true);
    }
    if (!criteria || sch_json_type(criteria) != SCH_JSON_OBJECT)
        return named_options(req, q, NULL, 0, false);
    err = object_options(criteria, &opts, &n);
    return err ? err : named_options(req, q, opts, n, true);
}

/* ---- noul -------------------------------------------------------------- */

/* The two options, false then true, from the given descriptions. */
static svc_err_t noul_options(sch_question_t *q, const sch_option_t *given, size_t n) {
    sch_option_t *o = calloc(2, sizeof *o);
    if (!o)
        return SVC_ERR_NOMEM;
    o[0].key = "false";
    o[0].key_len = 5;
    o[1].key = "true";
    o[1].key_len = 4;
    for (size_t i = 0; i < n; i++)
        o[sch_str_is(given[i].key, given[i].key_len, "true")].desc = given[i].desc;
    q->options = o;
    q->n_options = 2;
    return SVC_OK;
}

static svc_err_t read_noul(sch_request_t *req, sch_question_t *q, const sch_json_t *criteria,
                           const sch_json_t *choices) {
    sch_option_t *given = NULL;
    size_t        n = 0;
    svc_err_t     err = SVC_OK;
    bool          ok = true;
    if (choices) {
        err = listed_options(req, q, choices, true, &given, &n, &ok);
        if (err || !ok)
            return err;
    } else if (criteria) {
        if (sch_json_type(criteria) != SCH_JSON_OBJECT)
            return sch_question_fail(req, q, "noul criteria may contain only false and true");
        err = object_options(criteria, &given, &n);
        for (size_t i = 0; !err && i < n && ok; i++)
            ok = sch_str_is(given[i].key, given[i].key_len, "false") ||
                 sch_str_is(given[i].key, given[i].key_len, "true");
        if (!err && !ok)
            err = sch_question_fail(req, q, "noul criteria may contain only false and true");
    }
    for (size_t i = 0; !err && ok && i < n; i++)
        err = check_desc(req, q, &given[i], &ok);
    if (!err && ok)
        err = noul_options(q, given, n);
    free(given);
    return err;
}

/* ---- score ------------------------------------------------------------- */

/* Decision3: rendered levels must be distinct and nonempty. */
static svc_err_t check_levels_distinct(const sch_option_t *o, size_t n, bool *distinct) {
    svc_buf_t text[MAX_LEVELS];
    svc_err_t err = SVC_OK;
    *distinct = true;
    for (size_t i = 0; i < n; i++)
        svc_buf_init(&text[i], SIZE_MAX / 2);
    for (size_t i = 0; i < n && !err; i++) {
        err = sch_content_text(o[i].desc, &text[i]);
        if (!err && text[i].len == 0)
            *distinct = false;
        for (size_t j = 0; !err && j < i; j++)
            if (sch_str_eq(text[i].data, text[i].len, text[j].data, text[j].len))
                *distinct = false;
    }
    for (size_t i = 0; i < n; i++)
        svc_buf_fini(&text[i]);
    return err;
}

static svc_err_t read_score(sch_request_t *req, sch_question_t *q, const sch_json_t *levels) {
    if (!levels || sch_json_type(levels) != SCH_JSON_ARRAY || sch_json_size(levels) < MIN_LEVELS ||
        sch_json_size(levels) > MAX_LEVELS)
        return sch_question_fail(req, q, "criteria must list 2 to 10 levels");
    size_t        n = sch_json_size(levels);
    sch_option_t *o = calloc(n, sizeof *o);
    if (!o)
        return SVC_ERR_NOMEM;
    svc_err_t err = SVC_OK;
    bool      ok = true;
    for (size_t i = 0; i < n && ok && !err; i++) {
        char where[32];
        int  wn = snprintf(where, sizeof where, "criteria[%zu]", i);
        o[i].key = LEVEL_KEYS[i];
        o[i].key_len = 1;
        o[i].desc = sch_json_at(levels, i);
        err = check_content(req, q, o[i].desc, false, where, (size_t)wn, &ok);
    }
    if (!err && ok) {
        bool distinct;
        err = check_levels_distinct(o, n, &distinct);
        if (!err && !distinct) {
            ok = false;
            err = sch_question_fail(req, q, "score levels must be distinct and nonempty");
        }
    }
    if (err || !ok) {
        free(o);
        return err;
    }
    q->options = o;
    q->n_options = n;
    return SVC_OK;
}

/* ---- the shared rules -------------------------------------------------- */

static bool parse_type(const sch_json_t *t, sch_qtype_t *type) {
    size_t      n;
    const char *s;
    if (!t || sch_json_type(t) != SCH_JSON_STRING)
        return false;
    s = sch_json_string(t, &n);
    if (sch_str_is(s, n, "choice"))
        *type = SCH_Q_CHOICE;
    else if (sch_str_is(s, n, "noul"))
        *type = SCH_Q_NOUL;
    else if (sch_str_is(s, n, "score"))
        *type = SCH_Q_SCORE;
    else
        return false;
    return true;
}

static const char *type_name(sch_qtype_t type) {
    return type == SCH_Q_CHOICE ? "choice" : type == SCH_Q_NOUL ? "noul" : "score";
}

/* `require_full_input(question)`: *ok false when the question failed. */
static svc_err_t check_full_input(sch_request_t *req, sch_question_t *q, const sch_json_t *v,
                                  bool *ok) {
    const sch_json_t *rfi = sch_json_get(v, "require_full_input", strlen("require_full_input"));
    *ok = false;
    if (rfi && sch_json_type(rfi) != SCH_JSON_BOOL)
        return sch_question_fail(req, q, "require_full_input must be a boolean");
    q->require_full_input = rfi && sch_json_bool(rfi);
    const sch_json_t *overflow = sch_json_get(v, "overflow", strlen("overflow"));
    if (q->require_full_input && overflow && sch_json_type(overflow) == SCH_JSON_STRING) {
        size_t      n;
        const char *s = sch_json_string(overflow, &n);
        if (sch_str_is(s, n, "truncate"))
            return sch_question_fail(
                req, q, "require_full_input cannot be combined with overflow truncate");
    }
    *ok = true;
    return SVC_OK;
}

static bool field_allowed(sch_qtype_t type, const char *k, size_t n) {
    static const char *const common[] = {"type", "instructions", "criteria", "require_full_input"};
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        if (sch_str_is(k, n, common[i]))
            return true;
    return sch_str_is(k, n, type == SCH_Q_SCORE ? "levels" : "choices");
}

/* `<type> questions do not take [...]`: *ok false when the question failed. */
static svc_err_t check_fields(sch_request_t *req, sch_question_t *q, const sch_json_t *v,
                              bool *ok) {
    size_t     n = sch_json_size(v);
    size_t     n_unknown = 0;
    sch_str_t *unknown = calloc(n ? n : 1, sizeof *unknown);
    if (!unknown)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        sch_str_t k;
        k.s = sch_json_key_at(v, i, &k.n);
        if (!field_allowed(q->type, k.s, k.n))
            unknown[n_unknown++] = k;
    }
    svc_err_t err = SVC_OK;
    *ok = n_unknown == 0;
    if (!*ok) {
        svc_buf_t list;
        svc_buf_init(&list, SIZE_MAX / 2);
        sch_str_sort(unknown, n_unknown);
        err = sch_py_repr_list(&list, unknown, n_unknown);
        if (!err)
            err = sch_question_fail(req, q, "%s questions do not take %s", type_name(q->type),
                                    list.data);
        svc_buf_fini(&list);
    }
    free(unknown);
    return err;
}

svc_err_t sch_question_read(sch_request_t *req, const sch_json_t *v, sch_question_t *q) {
    svc_err_t err;
    bool      ok;
    if (sch_json_type(v) != SCH_JSON_OBJECT)
        return sch_question_fail(req, q, "a question must be an object");
    q->raw_type = sch_json_get(v, "type", 4);
    if (!parse_type(q->raw_type, &q->type))
        return sch_question_fail(req, q, "type must be one of ['choice', 'noul', 'score']");
    err = check_full_input(req, q, v, &ok);
    if (err || !ok)
        return err;
    err = check_fields(req, q, v, &ok);
    if (err || !ok)
        return err;
    /* d3stream's own choice (SPEC "d3stream's own choices" 1.): a missing
     * `instructions` takes the released packages' fallback sentence. */
    q->instructions = sch_json_get(v, "instructions", strlen("instructions"));
    if (q->instructions) {
        err = check_content(req, q, q->instructions, false, "instructions", strlen("instructions"),
                            &ok);
        if (err || !ok)
            return err;
    }
    const sch_json_t *criteria = get_nn(v, "criteria");
    const char       *superset_name = q->type == SCH_Q_SCORE ? "levels" : "choices";
    const sch_json_t *superset = get_nn(v, superset_name);
    if (superset && criteria)
        return sch_question_fail(req, q, "use criteria or %s, not both", superset_name);
    if (q->type == SCH_Q_SCORE)
        return read_score(req, q, superset ? superset : criteria);
    if (q->type == SCH_Q_NOUL)
        return read_noul(req, q, criteria, superset);
    return read_choice(req, q, criteria, superset);
}

/* ---- literal placeholders (SPEC a.10) ---------------------------------- */

static bool has_token(const char *s, size_t n) {
    static const char img[] = "<|image_pad|>";
    static const char vid[] = "<|video_pad|>";
    return memmem(s, n, img, sizeof img - 1) || memmem(s, n, vid, sizeof vid - 1);
}

static svc_err_t content_has_token(const sch_json_t *v, bool *found) {
    svc_buf_t text;
    svc_buf_init(&text, SIZE_MAX / 2);
    svc_err_t err = sch_content_text(v, &text);
    if (!err && text.len && has_token(text.data, text.len))
        *found = true;
    svc_buf_fini(&text);
    return err;
}

svc_err_t sch_state_has_placeholder(const sch_json_t *state, bool *found) {
    *found = false;
    return content_has_token(state, found);
}

svc_err_t sch_question_has_placeholder(const sch_question_t *q, bool *found) {
    svc_err_t err = SVC_OK;
    *found = false;
    if (q->instructions)
        err = content_has_token(q->instructions, found);
    for (size_t i = 0; !err && !*found && i < q->n_options; i++) {
        const sch_option_t *o = &q->options[i];
        if (has_token(o->key, o->key_len))
            *found = true;
        else if (o->desc)
            err = content_has_token(o->desc, found);
    }
    return err;
}
