/*
 * ops_bench_img.c -- the request bodies of `d3stream bench`'s image rows
 * (D3-Nano-NPU2.md: 1 question + a 1024 x 768 image, + two images, + a
 * 2000 x 1500 image downscaled to 1.6 MP, 8 questions + one image):
 * synthetic PNGs (eng_image_synth_png) as base64 data URLs on a short
 * state, with noul questions that differ per index.
 */
#include "ops_int.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* RFC 4648 base64 with padding, as a data URL wants it. */
static svc_err_t add_base64(svc_buf_t *b, const unsigned char *p, size_t n) {
    char      q[4];
    svc_err_t err = SVC_OK;
    for (size_t i = 0; !err && i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        q[0] = B64[v >> 18 & 63];
        q[1] = B64[v >> 12 & 63];
        q[2] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? B64[v & 63] : '=';
        err = svc_buf_add(b, q, 4);
    }
    return err;
}

svc_err_t ops_bench_image_body(size_t n_img, uint32_t w, uint32_t h, size_t nq, svc_buf_t *b) {
    svc_buf_reset(b);
    svc_err_t err = svc_buf_adds(b, "{\"state\": \"A customer attached photos of the delivered "
                                    "parcel and asks what to do next.\", \"images\": [");
    for (size_t i = 0; !err && i < n_img; i++) {
        unsigned char *png = NULL;
        size_t         len = 0;
        err = eng_image_synth_png(w, h, i + 1, &png, &len);
        if (!err)
            err = svc_buf_addf(b, "%s\"data:image/png;base64,", i ? ", " : "");
        if (!err)
            err = add_base64(b, png, len);
        if (!err)
            err = svc_buf_adds(b, "\"");
        free(png);
    }
    if (!err)
        err = svc_buf_adds(b, "], \"questions\": {");
    for (size_t i = 0; !err && i < nq; i++)
        err = svc_buf_addf(b,
                           "%s\"q%zu\": {\"type\": \"noul\", \"instructions\": \"Does photo detail "
                           "%zu show damage?\"}",
                           i ? ", " : "", i, i + 1);
    if (!err)
        err = svc_buf_adds(b, "}}");
    return err;
}
