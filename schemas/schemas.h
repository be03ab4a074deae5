/*
 * schemas.h -- the System One contract: JSON values with Python's json
 * semantics, request decoding and validation with the upstream error codes,
 * answer and error serialisation (../shared/docs/SPEC.md, sections a and b).
 *
 * Why our own JSON reader and writer rather than jansson's: the contract is
 * defined by Python's json module, which accepts NaN/Infinity, turns 1e400
 * into inf, keeps integers of any size as written, lets a repeated key keep
 * its first position with its last value, and prints floats in repr form.
 * jansson refuses the first three and cannot print the last, so a request
 * decoded with it would get different answers than upstream. jansson is used
 * where plain JSON is enough (package files in engine/).
 *
 * Usage:
 *
 *     sch_request_t *req = NULL;
 *     sch_error_t    err;
 *     if (sch_request_decode(body, len, &limits, NULL, &req, &err) != SVC_OK) {
 *         sch_error_encode(&err, &out);     // {"error": {...}}, err.status
 *         sch_error_fini(&err);
 *     } else {
 *         for (size_t p = 0; p < sch_request_n_parts(req); p++) {
 *             const sch_part_t *part = sch_request_part(req, p);
 *             ...
 *         }
 *         sch_request_free(req);
 *     }
 *
 * Thread-safety: a decoded request is immutable and may be read from any
 * thread; functions here keep no global state.
 */
#ifndef D3STREAM_SCHEMAS_H
#define D3STREAM_SCHEMAS_H

#include "svc.h"

/* ======================================================================
 * JSON values (Python semantics)
 * ====================================================================== */

typedef enum sch_jtype {
    SCH_JSON_NULL = 0,
    SCH_JSON_BOOL = 1,
    SCH_JSON_INT = 2,    /* an integer of any size, kept as written */
    SCH_JSON_REAL = 3,   /* a double; may be NaN or +-inf (Python accepts them) */
    SCH_JSON_STRING = 4, /* UTF-8, may contain NUL */
    SCH_JSON_ARRAY = 5,
    SCH_JSON_OBJECT = 6, /* keys unique, in first-seen order */
} sch_jtype_t;

typedef struct sch_json sch_json_t; /* a value, owned by its document */
typedef struct sch_jdoc sch_jdoc_t; /* owns every value of one parse */

/* Why a parse failed; the request decoder turns these into SPEC a.1. */
typedef enum sch_jfail {
    SCH_JFAIL_NONE = 0,
    SCH_JFAIL_UTF8 = 1,      /* the bytes are not UTF-8 */
    SCH_JFAIL_SYNTAX = 2,    /* not JSON (message in Python's words) */
    SCH_JFAIL_SURROGATE = 3, /* an escape left an unpaired surrogate */
    SCH_JFAIL_TOO_DEEP = 4,  /* nesting deeper than SCH_JSON_MAX_DEPTH */
    SCH_JFAIL_NOMEM = 5,
} sch_jfail_t;

/* Arrays and objects nested deeper than this are refused at parse time, so
 * no later recursion over a value can exhaust the stack. */
#define SCH_JSON_MAX_DEPTH 256

/**
 * @brief Parses text the way Python's json.loads parses a str decoded from
 *        UTF-8 bytes.
 * @param msg filled with the reason on failure, e.g.
 *        "Expecting value: line 1 column 1 (char 0)" or "'utf-8' codec can't
 *        decode byte 0xff in position 0: invalid start byte".
 * @returns the document, or NULL with *fail set.
 * @remark The caller owns the document (sch_jdoc_free); values returned by
 *         sch_jdoc_root and the accessors live as long as the document.
 */
SVC_WUR sch_jdoc_t *sch_json_parse(const char *text, size_t len, sch_jfail_t *fail, char *msg,
                                   size_t msg_size);
void                sch_jdoc_free(sch_jdoc_t *doc);
const sch_json_t   *sch_jdoc_root(const sch_jdoc_t *doc);

sch_jtype_t       sch_json_type(const sch_json_t *v);
bool              sch_json_bool(const sch_json_t *v);                  /* BOOL only */
const char       *sch_json_string(const sch_json_t *v, size_t *len);   /* STRING only */
const char       *sch_json_int_text(const sch_json_t *v, size_t *len); /* INT only */
double            sch_json_number(const sch_json_t *v); /* INT or REAL as double (may be inf) */
size_t            sch_json_size(const sch_json_t *v);   /* ARRAY/OBJECT count, else 0 */
const sch_json_t *sch_json_at(const sch_json_t *v, size_t i); /* ARRAY/OBJECT value i */
const char       *sch_json_key_at(const sch_json_t *v, size_t i, size_t *len);    /* OBJECT */
const sch_json_t *sch_json_get(const sch_json_t *v, const char *key, size_t len); /* or NULL */
bool              sch_json_truthy(const sch_json_t *v);     /* Python bool(value) */
bool              sch_json_all_finite(const sch_json_t *v); /* no NaN/inf anywhere inside */

/* Python json.dumps(v, ensure_ascii=False): ", " and ": " separators, keys in
 * order, floats in repr form (100.0, 1e-07, 1e+16), non-finite as NaN/Infinity. */
SVC_WUR svc_err_t sch_json_dump_py(const sch_json_t *v, svc_buf_t *out);
/* Canonical form of the score legend: sorted keys, "," and ":", raw UTF-8. */
SVC_WUR svc_err_t sch_json_dump_canonical(const sch_json_t *v, svc_buf_t *out);
/* json.dumps(v, ensure_ascii=False, separators=(",", ":")): the compact form
 * of response bodies, keys in stored order. */
SVC_WUR svc_err_t sch_json_dump_compact(const sch_json_t *v, svc_buf_t *out);
/* A JSON string literal as Python's json.dumps(ensure_ascii=False) writes it. */
SVC_WUR svc_err_t sch_json_write_string(svc_buf_t *out, const char *s, size_t len);
/* A double the way Python's repr() writes it: shortest round-trip digits. */
SVC_WUR svc_err_t sch_json_write_double(svc_buf_t *out, double d);

/* "Content" as the decision3 prompt renders it: a string verbatim, any other
 * value as sch_json_dump_py. Used for score levels, descriptions, states. */
SVC_WUR svc_err_t sch_content_text(const sch_json_t *v, svc_buf_t *out);

/* ======================================================================
 * Requests
 * ====================================================================== */

typedef enum sch_qtype {
    SCH_Q_CHOICE = 0,
    SCH_Q_NOUL = 1,
    SCH_Q_SCORE = 2,
} sch_qtype_t;

/* A whole-request error (SPEC b.7): the HTTP status, the code, the message. */
typedef struct sch_error {
    int         status;      /* 400, 404, 413, 422, 429, 500, 503 */
    const char *code;        /* static string, e.g. "invalid_request" */
    char       *message;     /* owned, heap, NUL-terminated; freed by sch_error_fini */
    size_t      message_len; /* its bytes: a name it quotes may hold a NUL (the
                                encoders write all of them; C-string readers,
                                such as logs, see the text up to the first) */
} sch_error_t;

void sch_error_init(sch_error_t *err);
void sch_error_fini(sch_error_t *err); /* frees message; safe twice */

/* What the decoder must know about the served model. Pass NULL to
 * sch_request_decode to skip every model-dependent check (`d3stream
 * validate`): `model` is then only checked to be a string or null, any
 * `profile` string is accepted, images are checked in full (data URL,
 * base64, format and size from the header) as if a vision tower existed,
 * and a non-empty `videos` is refused as "model d3stream reads no videos". */
typedef struct sch_model_info {
    const char *const *names; /* names that select this model (SPEC a.2 4.) */
    size_t             n_names;
    const char        *label; /* served id, used in messages */
    bool               has_vision;
    bool               reads_videos;
    const char *const *profiles; /* enabled profiles, "exact" included */
    size_t             n_profiles;
    /* The request goes to an engine that decodes its images (eng_sched_submit,
     * eng_answer_request). Upstream decodes each image in full before the
     * checks that follow it (its own aspect ratio, the next image's data
     * URL, the videos, the state, the questions, later states: SPEC a.3,
     * a.10), and only the engine can decode; so the aspect ratio is left to
     * the engine's resize, and a whole-request error found after images
     * whose headers passed is held (sch_request_pending), not returned. */
    bool        engine_decodes;
    const char *default_profile; /* when options.profile is absent; NULL: "exact" */
} sch_model_info_t;

typedef struct sch_limits {
    size_t max_request_bytes; /* SPEC a.1, default 8,388,608 */
} sch_limits_t;

#define SCH_DEFAULT_MAX_REQUEST_BYTES 8388608u

/* One option of a question, in answer order (choice: request order; noul:
 * false then true; score: level order). */
typedef struct sch_option {
    const char       *key; /* choice key; "false"/"true"; score: "0".."n-1" */
    size_t            key_len;
    const sch_json_t *desc; /* description or level; NULL when null/absent */
} sch_option_t;

/* One question. Invalid questions keep their error here (SPEC b.6). */
typedef struct sch_question {
    const char         *id;
    size_t              id_len;
    const sch_json_t   *raw_type; /* echoed in an error answer; NULL if absent */
    sch_qtype_t         type;     /* meaningful only when error_code is NULL */
    bool                require_full_input;
    const sch_json_t   *instructions; /* NULL when absent: the prompt's fallback */
    size_t              n_options;
    const sch_option_t *options;
    const char         *error_code;        /* NULL when valid; static string */
    const char         *error_message;     /* NULL when none; NUL-terminated */
    size_t              error_message_len; /* its bytes (a quoted key may hold a NUL) */
} sch_question_t;

/* One image of a part: the bytes of its data URL after base64, with the
 * size its header declares (pixels are decoded by engine/, issue 6). */
typedef struct sch_image {
    const unsigned char *bytes;
    size_t               len;
    const char          *format; /* "png", "jpeg" or "webp", from the bytes */
    uint32_t             width;  /* as stored, before any EXIF orientation */
    uint32_t             height;
} sch_image_t;

/* One state with its questions: the request itself, or one of its `states`. */
typedef struct sch_part {
    const char           *name; /* NULL for the request's own state */
    size_t                name_len;
    const sch_json_t     *state;
    size_t                n_images;
    const sch_image_t    *images;
    size_t                n_videos;
    size_t                n_questions;
    const sch_question_t *questions;
} sch_part_t;

typedef struct sch_options {
    bool   has_deadline;
    double deadline_ms;
    bool   return_meta;
    /* one of the model's profiles (its static string), the served default
     * (sch_model_info_t.default_profile) when not given */
    const char *profile;
} sch_options_t;

typedef struct sch_request sch_request_t;

/**
 * @brief Decodes and validates a System One request body (SPEC a.1-a.11, b.7).
 * @param model the served model, or NULL to skip model-dependent checks.
 * @param out   on SVC_OK the request; the caller frees it with sch_request_free.
 * @param err   on failure the whole-request error (status, code, message).
 * @returns SVC_OK, or SVC_ERR_INVALID with *err filled. Per-question errors
 *          are not failures: they are in the questions. When every question
 *          of every part is invalid, the result is the 400 "no question is
 *          valid (...)" error.
 * @remark The body is copied; it need not outlive the request.
 */
SVC_WUR svc_err_t sch_request_decode(const char *body, size_t len, const sch_limits_t *limits,
                                     const sch_model_info_t *model, sch_request_t **out,
                                     sch_error_t *err);
void              sch_request_free(sch_request_t *req);
/* The whole-request error held for the engine (sch_model_info_t's
 * engine_decodes), or NULL. A request holding one has no question: its
 * parts end with the one that failed, and each part keeps the images that
 * came before the failure. The engine decodes those in order and answers
 * the first that fails (SPEC a.10), else this error, as its reject. */
const sch_error_t   *sch_request_pending(const sch_request_t *req);
size_t               sch_request_n_parts(const sch_request_t *req); /* 1 + number of states */
const sch_part_t    *sch_request_part(const sch_request_t *req, size_t i);
const sch_options_t *sch_request_options(const sch_request_t *req);
/* The `model` string the client sent, or NULL. */
const char *sch_request_model(const sch_request_t *req, size_t *len);

/* ======================================================================
 * Answers
 * ====================================================================== */

/* The engine's outcome for one question that reached the model. */
typedef struct sch_result {
    const char   *error_code;    /* NULL when answered, else "max_length_exceeded", ... */
    const char   *error_message; /* NULL when none */
    const double *probs;         /* n_options probabilities when answered */
} sch_result_t;

typedef struct sch_meta {
    const char *model_id;
    const char *revision; /* NULL writes null */
    const char *model_sha256;
    const char *profile;
    const char *numerics; /* "exact" or "approximate" */
    const char *engine;
    const char *accelerator;
    const char *device;
    double      queue_ms;
    double      compute_ms;
} sch_meta_t;

/**
 * @brief Writes the 200 response body (SPEC b.1-b.5, b.9).
 * @param results results[p][q] for question q of part p; ignored for
 *        questions that already carry a validation error.
 * @param input_tokens input_tokens[p], the usage of part p.
 * @param meta written when the request asked for it (NULL otherwise allowed).
 * @returns SVC_OK, or SVC_ERR_INVALID with *err = 500 internal_error when a
 *          number is not finite (the body is then not written).
 */
SVC_WUR svc_err_t sch_response_encode(const sch_request_t *req, const char *model_id,
                                      const sch_result_t *const *results,
                                      const size_t *input_tokens, const sch_meta_t *meta,
                                      svc_buf_t *out, sch_error_t *err);

/* A question's own error as its answer, {"type":<raw>,"error":...[,"message":...]}
 * (SPEC b.6). SVC_ERR_INVALID when the echoed type is not finite. */
SVC_WUR svc_err_t sch_question_error_encode(const sch_question_t *q, svc_buf_t *out);

/* The max_length_exceeded message (SPEC b.6): printf with the prompt's
 * length and the limit, both size_t. */
#define SCH_MSG_MAX_LENGTH                                                                         \
    "the question prompt has %zu tokens, over the maximum context length of %zu tokens; "          \
    "nothing was truncated"

/* {"error":{"code":...,"message":...}} */
SVC_WUR svc_err_t sch_error_encode(const sch_error_t *err, svc_buf_t *out);

/* The `d3stream validate` verdict: {"status": 400, "error": {...}} or
 * {"status": 200, "questions": {...}} (+ "states"), see ops/ --help. */
SVC_WUR svc_err_t sch_verdict_encode(const sch_request_t *req, const sch_error_t *err,
                                     svc_buf_t *out);

/* Appends bytes s[0..n) to out as Python's s.decode("utf-8", "replace"):
 * valid UTF-8 as it is, each maximal ill-formed subpart as one U+FFFD (as
 * uvicorn's unquote() does to a request path), so that any bytes can go
 * into a message. */
SVC_WUR svc_err_t sch_py_utf8_replace(svc_buf_t *out, const char *s, size_t n);

/* Fills err with the message msg[0..len) (any bytes), replacing what it held. */
void sch_error_set_bytes(sch_error_t *err, int status, const char *code, const char *msg,
                         size_t len);

/* Fills err (status, code, printf message), replacing what it held. */
SVC_FMT(4, 5)
void sch_error_set(sch_error_t *err, int status, const char *code, const char *fmt, ...);

/* ======================================================================
 * Avro records (issue 4.5; SPEC k): request.avsc / answer.avsc, embedded
 * at build time, Confluent framing and a schema-registry client.
 *
 * Open JSON values (state, instructions, criteria, levels, the echoed type
 * of an error answer, any value of an unexpected shape) travel as strings
 * holding JSON text, so Python json semantics (NaN, big integers, 1.0 vs 1,
 * key order) survive. A decoded request is the JSON body an HTTP client
 * would send, and goes through sch_request_decode like any other body.
 * A body that is not a JSON object cannot be written as an Avro request.
 *
 * Thread-safety: writers (sch_avro_writer_t) are immutable and refcounted;
 * the registry locks its cache; everything else keeps no state.
 * ====================================================================== */

typedef enum sch_avro_kind {
    SCH_AVRO_REQUEST = 0, /* schemas/request.avsc */
    SCH_AVRO_ANSWER = 1,  /* schemas/answer.avsc */
} sch_avro_kind_t;

/* Schema ids that stand for the embedded schemas when no registry is
 * configured (a registry's own ids are then not looked up). With a
 * registry, answers carry the id it gives answer.avsc
 * (sch_registry_register) and requests whatever id their producer framed. */
#define SCH_AVRO_ID_REQUEST 1u
#define SCH_AVRO_ID_ANSWER  2u

/* The Confluent wire format: magic byte 0, 4-byte big-endian schema id. */
#define SCH_FRAME_MAGIC  0u
#define SCH_FRAME_HEADER 5u

/* The embedded .avsc text of kind (static, not NUL-terminated-safe: use len). */
const char *sch_avro_schema_text(sch_avro_kind_t kind, size_t *len);

/* A writer schema, compiled and resolved against the embedded schema. */
typedef struct sch_avro_writer sch_avro_writer_t;

/**
 * @brief Compiles a writer schema (e.g. from the registry) for reading
 *        bodies of `kind`: fields the writer lacks must have defaults in the
 *        embedded schema (they read as absent), fields it adds are skipped.
 * @param schema_json the writer schema, or NULL for the embedded one.
 * @returns a writer with one reference, or NULL with errstr set.
 * @remark Release with sch_avro_writer_free; share with sch_avro_writer_keep.
 */
SVC_WUR sch_avro_writer_t *sch_avro_writer_new(sch_avro_kind_t kind, const char *schema_json,
                                               size_t len, char *errstr, size_t errstr_size);
sch_avro_writer_t         *sch_avro_writer_keep(sch_avro_writer_t *w);
void                       sch_avro_writer_free(sch_avro_writer_t *w); /* drops one ref; NULL ok */

/**
 * @brief Avro binary (no framing) -> the request's JSON body, appended to out.
 * @param w the writer schema, or NULL when written with the embedded one.
 * @returns SVC_OK; SVC_ERR_FORMAT for a truncated or corrupt body or an
 *          embedded JSON text that does not parse (errstr says which field);
 *          SVC_ERR_TOO_LARGE when out's cap is hit.
 */
SVC_WUR svc_err_t sch_avro_request_to_json(const sch_avro_writer_t *w, const void *body, size_t len,
                                           svc_buf_t *out, char *errstr, size_t errstr_size);
/* JSON request body -> Avro binary with the embedded schema (tests, test
 * data producers). SVC_ERR_INVALID when the body is not a JSON object. */
SVC_WUR svc_err_t sch_avro_request_from_json(const char *json, size_t len, svc_buf_t *out,
                                             char *errstr, size_t errstr_size);
/* One of our response bodies (sch_response_encode / sch_error_encode) ->
 * Avro binary with the embedded schema. SVC_ERR_INVALID for another shape. */
SVC_WUR svc_err_t sch_avro_answer_from_json(const char *json, size_t len, svc_buf_t *out,
                                            char *errstr, size_t errstr_size);
/* Avro binary -> the response body, byte for byte as the shim writes it. */
SVC_WUR svc_err_t sch_avro_answer_to_json(const sch_avro_writer_t *w, const void *body, size_t len,
                                          svc_buf_t *out, char *errstr, size_t errstr_size);

/**
 * @brief Splits a Confluent-framed value.
 * @param body set to point into bytes (not copied).
 * @returns SVC_OK, or SVC_ERR_FORMAT when shorter than 5 bytes or the magic
 *          byte is not 0 (errstr names what was found).
 */
SVC_WUR svc_err_t sch_frame_parse(const void *bytes, size_t len, uint32_t *schema_id,
                                  const void **body, size_t *body_len, char *errstr,
                                  size_t errstr_size);
/* Appends magic, id and body to out. */
SVC_WUR svc_err_t sch_frame_write(uint32_t schema_id, const void *body, size_t len, svc_buf_t *out);

/* A schema-registry client with a bounded, locked cache of writers by id. */
typedef struct sch_registry sch_registry_t;

#define SCH_REGISTRY_CACHE_DEFAULT 256u

/**
 * @brief A client for the registry at url ("http://host:8081", credentials
 *        as "http://user:pass@host:8081"), or NULL/"" for none: then only
 *        SCH_AVRO_ID_REQUEST / SCH_AVRO_ID_ANSWER are known, as the embedded
 *        schemas. Messages show the URL with its password masked.
 * @param cache_max writers kept (0: SCH_REGISTRY_CACHE_DEFAULT).
 * @returns NULL with errstr set for a URL that is not http(s) or too long.
 */
SVC_WUR sch_registry_t *sch_registry_new(const char *url, size_t cache_max, char *errstr,
                                         size_t errstr_size);
void                    sch_registry_free(sch_registry_t *reg);

/**
 * @brief The writer for schema `id`, reading bodies of `kind`: from the
 *        cache, else GET {url}/schemas/ids/{id} (connect timeout 5 s, total
 *        10 s, 3 tries after network failures and 5xx). Errors name the URL
 *        and the HTTP status.
 * @returns SVC_OK with *w holding a new reference (sch_avro_writer_free it);
 *          SVC_ERR_IO when the registry could not be asked: no answer, 5xx
 *          three times, or another status than 200 or the registry's own
 *          "not found" (a 404 with error_code 40403) -- worth a retry or a
 *          stop, never a verdict on the record;
 *          SVC_ERR_INVALID for an id the registry has not (40403: the
 *          answer is remembered for 30 s), or any id but the fixed ones
 *          without a registry; SVC_ERR_FORMAT for an answer that is not
 *          {"schema": ...}, exceeds 256 KiB, or holds a schema that does not
 *          compile or resolve; SVC_ERR_NOMEM.
 * @locks the registry's mutex, not held during the HTTP request.
 */
SVC_WUR svc_err_t sch_registry_writer(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind,
                                      sch_avro_writer_t **w, char *errstr, size_t errstr_size);
/* Replaces the 5 s connect / 10 s total timeouts and the 250 ms wait
 * before a second try (tests); before first use. */
void sch_registry_set_timeouts(sch_registry_t *reg, long connect_ms, long total_ms,
                               long backoff_ms);
/* Schema lookups (GETs) made so far (tests: a cache hit makes none). */
size_t sch_registry_n_fetches(sch_registry_t *reg);

/**
 * @brief POST {url}/subjects/{subject}/versions {"schema": schema} -> *id:
 *        the id the registry has (or gives) the schema under subject, as a
 *        Confluent serializer with auto.register.schemas does.
 * @returns SVC_OK; SVC_ERR_INVALID without a registry; SVC_ERR_IO for no
 *          answer or any status but 200 (409: incompatible with the
 *          subject's schemas); SVC_ERR_FORMAT for a 200 without an id.
 */
SVC_WUR svc_err_t sch_registry_register(sch_registry_t *reg, const char *subject,
                                        const char *schema, size_t schema_len, uint32_t *id,
                                        char *errstr, size_t errstr_size);

#endif /* D3STREAM_SCHEMAS_H */
