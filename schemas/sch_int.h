/*
 * sch_int.h -- private declarations shared by the request decoder
 * (sch_request.c, sch_question.c, sch_image.c), the answer writers
 * (sch_answer.c) and the Python text helpers (sch_pytext.c).
 *
 * Nothing here is part of the module's API: ops/ and engine/ see only
 * schemas.h.
 */
#ifndef D3STREAM_SCH_INT_H
#define D3STREAM_SCH_INT_H

#include "schemas.h"

/* ---- a decoded request ------------------------------------------------ */

/* One part under construction: the public view plus what it owns. */
typedef struct sch_part_own {
    sch_question_t *questions; /* n_questions, owned; options owned inside */
    sch_image_t    *images;    /* n_images, owned; bytes owned inside */
} sch_part_own_t;

struct sch_request {
    char           *text; /* owned copy of the body; the document reads it */
    sch_jdoc_t     *doc;  /* owns every sch_json_t below */
    size_t          n_parts;
    sch_part_t     *parts;      /* n_parts, owned */
    sch_part_own_t *own;        /* n_parts, owned */
    bool            has_states; /* a `states` key was given, even {} */
    sch_options_t   options;
    const char     *model; /* into doc, or NULL */
    size_t          model_len;
    sch_error_t     pending; /* held behind its images (pending.code NULL: none) */
    char          **strs;    /* heap strings the request owns (messages) */
    size_t          n_strs;
    size_t          cap_strs;
};

/* Takes ownership of s (heap) and keeps it until sch_request_free; frees s
 * and returns NULL when the list cannot grow. */
char *sch_req_keep(sch_request_t *req, char *s);

/* ---- questions (sch_question.c) --------------------------------------- */

/**
 * @brief Validates one question (SPEC a.5-a.7) into q.
 * @returns SVC_OK whether or not the question is valid (an invalid one has
 *          q->error_code set); SVC_ERR_NOMEM when memory ran out.
 * @remark q->options is heap memory owned by the request (sch_request_free);
 *         every pointer into the value lives as long as the request's doc.
 */
SVC_WUR svc_err_t sch_question_read(sch_request_t *req, const sch_json_t *v, sch_question_t *q);

/* Marks q invalid_question with a message the request keeps. */
SVC_WUR svc_err_t sch_question_fail(sch_request_t *req, sch_question_t *q, const char *fmt, ...)
    SVC_FMT(3, 4);

/* *found: the prompt text of a valid question (instructions, option keys
 * and descriptions) contains a literal image or video placeholder token
 * (SPEC a.10). Fails only when memory runs out. */
SVC_WUR svc_err_t sch_question_has_placeholder(const sch_question_t *q, bool *found);

/* true when the state as the prompt renders it contains a placeholder. */
SVC_WUR svc_err_t sch_state_has_placeholder(const sch_json_t *state, bool *found);

/* ---- images (sch_image.c) --------------------------------------------- */

#define SCH_IMAGE_MAX_BYTES  8000000u
#define SCH_IMAGE_MAX_B64    10666668u /* 4 * ceil(8,000,000 / 3) */
#define SCH_IMAGE_MAX_PIXELS 16000000u
#define SCH_IMAGE_MAX_ASPECT 200
#define SCH_VIDEO_MAX_BYTES  32000000u
#define SCH_VIDEO_MAX_B64    42666668u /* 4 * ceil(32,000,000 / 3) */

/**
 * @brief Decodes one image data URL (SPEC a.10) into img.
 * @param aspect whether the aspect ratio is checked here, from the header;
 *        upstream checks it when it resizes, after the decode, so an engine
 *        that decodes (sch_model_info_t's engine_decodes) checks it there.
 * @param msg on SVC_ERR_INVALID the reason without the "images[i]: " prefix.
 * @returns SVC_OK; SVC_ERR_INVALID with msg; SVC_ERR_NOMEM.
 * @remark On SVC_OK img->bytes is heap memory the caller frees.
 */
SVC_WUR svc_err_t sch_image_decode(const sch_json_t *v, sch_image_t *img, bool aspect, char *msg,
                                   size_t msg_size);

/* Checks one video data URL's form, base64 and size (the rest needs a
 * decoder d3stream does not have). Same contract as sch_image_decode. */
SVC_WUR svc_err_t sch_video_check(const sch_json_t *v, char *msg, size_t msg_size);

/* PIL's Image.open refuses more than twice Image.MAX_IMAGE_PIXELS
 * (89,478,485 by default) as a decompression bomb. */
#define SCH_IMAGE_BOMB_PIXELS 178956970u

/* Reads width and height from PNG, JPEG or WebP bytes as PIL opens them.
 * Returns the format ("png", "jpeg", "webp"), "other" for a format PIL
 * opens but the contract refuses (GIF, BMP, TIFF, ...: w, h its size, for
 * the bomb check), or NULL with *fail = the message PIL's failure becomes,
 * e.g. "invalid image data (UnidentifiedImageError)". Pixels are not
 * decoded. */
const char *sch_image_probe(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h,
                            const char **fail);

/* PngImageFile._open on bytes with the PNG signature: NULL (w, h from IHDR,
 * maybe zero) or the failure's message. */
const char *sch_image_probe_png(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h);

/* Image.open over the other plugins (sch_image_other.c) for bytes that are
 * not PNG, JPEG or WebP: NULL when one opens them (w, h nonzero: its size),
 * else the message, "invalid image data (UnidentifiedImageError)" when none
 * does. */
const char *sch_image_probe_other(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h);

/* Pillow's AVIF plugin (sch_image_avif.c): whether its prefix test takes
 * the bytes, and whether its open succeeds (true with w, h its size). */
bool sch_image_avif_accepts(const unsigned char *p, size_t n);
bool sch_image_probe_avif(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h);

/* Strict base64 (Python b64decode(validate=True)): false when invalid.
 * out may be NULL to validate only; *out_len gets the decoded size. */
bool sch_base64_decode(const char *s, size_t n, unsigned char *out, size_t *out_len);

/* ---- Python text semantics (sch_pytext.c) ------------------------------ */

/* Python str.strip() is empty: every code point is Unicode whitespace. */
bool sch_py_blank(const char *s, size_t n);

/* Python str.strip() of s: [*start, *start + *len). */
void sch_py_strip(const char *s, size_t n, size_t *start, size_t *len);

/* Number of code points in valid UTF-8. */
size_t sch_utf8_count(const char *s, size_t n);

/* repr(str) as Python 3 writes it. */
SVC_WUR svc_err_t sch_py_repr_str(svc_buf_t *out, const char *s, size_t n);

/* repr(list_of_str) of n strings: ['a', 'b']. */
typedef struct sch_str {
    const char *s;
    size_t      n;
} sch_str_t;
SVC_WUR svc_err_t sch_py_repr_list(svc_buf_t *out, const sch_str_t *items, size_t n);

/* Sorts strings the way Python sorts str (code point order). */
void sch_str_sort(sch_str_t *items, size_t n);

/* Bytes equal (NUL-safe). */
static inline bool sch_str_eq(const char *a, size_t an, const char *b, size_t bn) {
    return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* true when the NUL-free C string lit equals the n bytes of s. */
static inline bool sch_str_is(const char *s, size_t n, const char *lit) {
    return sch_str_eq(s, n, lit, strlen(lit));
}

/* Python's sum() of floats (3.12+: Neumaier-compensated). */
double sch_py_fsum(const double *v, size_t n);

#endif /* D3STREAM_SCH_INT_H */
