/*
 * sch_avro_int.h -- what the Avro files of schemas/ share (sch_avro.c:
 * embedded schemas, writer schemas and resolution, the body check, framing;
 * sch_avro_request.c and sch_avro_answer.c: the JSON <-> Avro mappings;
 * sch_registry.c). Nothing outside schemas/ includes avro.h.
 */
#ifndef D3STREAM_SCH_AVRO_INT_H
#define D3STREAM_SCH_AVRO_INT_H

#include <avro.h>

#include "schemas.h"

/* The .avsc files, embedded at build time (generated sch_avsc.c). */
extern const char   sch_avsc_request[];
extern const size_t sch_avsc_request_len;
extern const char   sch_avsc_answer[];
extern const size_t sch_avsc_answer_len;

/* Caps on what one Avro body may make avro-c allocate: items of all arrays
 * and maps together, values of every kind together (a registered writer
 * schema's array of records of 1,000 null fields costs no body byte per
 * field: a 12-byte body made 614 MB), and nesting (registry schemas may be
 * recursive). */
#define SCH_AVRO_MAX_ITEMS  (1u << 20)
#define SCH_AVRO_MAX_VALUES (1u << 22)
#define SCH_AVRO_MAX_DEPTH  64

/* A decoded body: `src` in the writer's schema, `view` the same data seen
 * through the embedded (reader) schema -- `src` itself when the writer is
 * the embedded schema. */
typedef struct sch_av_decoded {
    avro_value_t src;
    avro_value_t view;
    bool         has_src;
    bool         has_view;
} sch_av_decoded_t;

/* Checks `body` against the writer schema, then reads it with avro-c and
 * resolves it to the embedded schema of `kind`. */
SVC_WUR svc_err_t sch_av_decode(sch_avro_kind_t kind, const sch_avro_writer_t *w, const void *body,
                                size_t len, sch_av_decoded_t *d, char *errstr, size_t errstr_size);
void              sch_av_decoded_fini(sch_av_decoded_t *d);

/* A fresh value of the embedded schema of `kind` (avro_value_decref it). */
SVC_WUR svc_err_t sch_av_new_value(sch_avro_kind_t kind, avro_value_t *v, char *errstr,
                                   size_t errstr_size);
/* Serialises v to Avro binary (no framing) into out. */
SVC_WUR svc_err_t sch_av_write(avro_value_t *v, svc_buf_t *out, char *errstr, size_t errstr_size);

/* Field `name` of record rec; false when the (resolved) schema lacks it,
 * which readers treat as an absent optional field. */
bool sch_av_field(avro_value_t *rec, const char *name, avro_value_t *out);
/* The current branch of a union and its type; for a named type (record,
 * enum) *name is its short name, else NULL. */
SVC_WUR int sch_av_branch(avro_value_t *u, avro_value_t *branch, avro_type_t *type,
                          const char **name);
/* Selects the union branch of type t (and short name, for named types). */
SVC_WUR int sch_av_set_branch(avro_value_t *u, avro_type_t t, const char *name,
                              avro_value_t *branch);

/* Sets a string value from bytes that may contain NUL. */
SVC_WUR int sch_av_set_str(avro_value_t *v, const char *s, size_t len);
/* Reads a string value: pointer and length without the terminator. */
SVC_WUR int sch_av_get_str(avro_value_t *v, const char **s, size_t *len);
/* Selects the string branch of an optional ["null", "string"] union and sets
 * it to s/len, or the null branch when s is NULL. */
SVC_WUR int sch_av_set_opt_str(avro_value_t *u, const char *s, size_t len);

/* ---- what the JSON <-> Avro mappings share ------------------------------- */

/* The key k/n is one of names (NULL-terminated). */
bool sch_av_key_in(const char *k, size_t n, const char *const *names);
/* An object whose keys are all in names (NULL-terminated). */
bool sch_av_keys_within(const sch_json_t *o, const char *const *names);

/* Parses the JSON body of a `kind` ("request", "answer") to encode. */
SVC_WUR svc_err_t sch_av_parse_body(const char *json, size_t len, const char *kind,
                                    sch_jdoc_t **doc, char *errstr, size_t errstr_size);
/* Ends an encoding: on success writes rec to out; then frees rec and doc. */
SVC_WUR svc_err_t sch_av_encode_end(svc_err_t err, avro_value_t *rec, sch_jdoc_t *doc,
                                    svc_buf_t *out, char *errstr, size_t errstr_size);

/* Avro -> JSON: where the text goes, and the body's kind for errors. */
typedef struct sch_av_dec {
    svc_buf_t  *out;
    const char *kind;
    char       *errstr;
    size_t      errstr_size;
} sch_av_dec_t;

/* "avro <kind> field <what>: <why>"; SVC_ERR_FORMAT. */
SVC_WUR svc_err_t sch_av_bad(sch_av_dec_t *d, const char *what, const char *why);
/* `,"key":` (no comma when *first). */
SVC_WUR svc_err_t sch_av_w_key(sch_av_dec_t *d, bool *first, const char *key, size_t n);
/* A string value as a JSON string. */
SVC_WUR svc_err_t sch_av_w_str(sch_av_dec_t *d, avro_value_t *v, const char *what);
/* Ends a decoding begun at out->len == start: closes the object, or on
 * error leaves no half-written body; then frees dv. */
SVC_WUR svc_err_t sch_av_decode_end(svc_err_t err, sch_av_dec_t *d, size_t start,
                                    sch_av_decoded_t *dv);

#endif /* D3STREAM_SCH_AVRO_INT_H */
