/*
 * test_util.h -- fixtures the tests share: a package opened and loaded,
 * a request decoded without model info, a temp tree removed.
 */
#ifndef D3STREAM_TEST_UTIL_H
#define D3STREAM_TEST_UTIL_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <png.h>
#include <stdio.h>

#include "engine.h"

typedef struct loaded {
    eng_package_t *pkg;
    eng_model_t   *model;
    const char    *dir;
} loaded_t;

static inline void load(const char *dir, loaded_t *l) {
    char errstr[1024] = "";
    l->dir = dir;
    cr_assert_eq(eng_package_open(dir, &l->pkg, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(eng_model_load(dir, &l->model, errstr, sizeof errstr), SVC_OK, "%s", errstr);
}

/* Appends p (n bytes) to b as base64 (data: URLs of images). */
static inline void b64_add(svc_buf_t *b, const unsigned char *p, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {A[v >> 18], A[v >> 12 & 63], i + 1 < n ? A[v >> 6 & 63] : '=',
                     i + 2 < n ? A[v & 63] : '='};
        cr_assert_eq(svc_buf_add(b, q, 4), SVC_OK);
    }
}

/* The w x h pixels px (format: a libpng simplified-API format, e.g.
 * PNG_FORMAT_RGB) as a PNG in memory, *len bytes; the caller frees it. */
static inline unsigned char *test_png(uint32_t w, uint32_t h, uint32_t format,
                                      const unsigned char *px, size_t *len) {
    png_image im = {.version = PNG_IMAGE_VERSION, .width = w, .height = h, .format = format};
    cr_assert(png_image_write_to_memory(&im, NULL, len, 0, px, 0, NULL), "%s", im.message);
    unsigned char *out = malloc(*len);
    cr_assert(out);
    cr_assert(png_image_write_to_memory(&im, out, len, 0, px, 0, NULL), "%s", im.message);
    return out;
}

/* A request body into b: one synthetic w x h PNG (only its first half when
 * cut, the pixel data then short), the state given as JSON text, and one
 * noul question. */
static inline void image_body(svc_buf_t *b, uint32_t w, uint32_t h, bool cut, const char *state) {
    unsigned char *png;
    size_t         n;
    cr_assert_eq(eng_image_synth_png(w, h, 7, &png, &n), SVC_OK);
    cr_assert_eq(svc_buf_addf(b, "{\"state\": %s, \"images\": [\"data:image/png;base64,", state),
                 SVC_OK);
    b64_add(b, png, cut ? n / 2 : n);
    free(png);
    cr_assert_eq(svc_buf_adds(b, "\"], \"questions\": {\"n\": {\"type\": \"noul\", "
                                 "\"instructions\": \"Is it?\"}}}"),
                 SVC_OK);
}

static inline void unload(loaded_t *l) {
    eng_model_free(l->model);
    eng_package_free(l->pkg);
}

/* body decoded as valid (no model info); the caller frees the request. */
static inline sch_request_t *decode_valid(const char *body, size_t len) {
    sch_limits_t   limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    e;
    sch_error_init(&e);
    cr_assert_eq(sch_request_decode(body, len, &limits, NULL, &req, &e), SVC_OK, "%s", e.message);
    sch_error_fini(&e);
    return req;
}

static inline int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* rm -rf root. */
static inline void rm_tree(const char *root) {
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

#endif /* D3STREAM_TEST_UTIL_H */
