/*
 * ops_bench_img.c -- the request bodies of `d3stream bench`'s image rows
 * (D3-Nano-NPU2.md: 1 question + a 1024 x 768 image, + two images, + a
 * 2000 x 1500 image downscaled to 1.6 MP, 8 questions + one image):
 * synthetic PNGs (eng_image_synth_png) as base64 data URLs on a short
 * state, with noul questions that differ per index.
 */
#include "ops_int.h"

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
            err = ops_base64_add(b, png, len);
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
