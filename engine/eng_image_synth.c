/*
 * eng_image_synth.c -- deterministic synthetic PNG images (engine.h), so
 * that `d3stream bench` can run D3-Nano-NPU2's image rows with no image
 * files at hand: smooth colour gradients with a few rings and a little
 * seeded noise (photo-like enough that PNG does not collapse it to
 * nothing, and decoding costs what a real image costs).
 */
#include "engine.h"

#include <math.h>
#include <png.h>
#include <setjmp.h>

typedef struct png_out {
    unsigned char *p;
    size_t         n, cap;
    bool           oom;
} png_out_t;

static void out_write(png_structp png, png_bytep data, png_size_t len) {
    png_out_t *o = png_get_io_ptr(png);
    if (o->oom)
        return;
    if (o->n + len > o->cap) {
        size_t         cap = (o->n + len) * 2;
        unsigned char *q = realloc(o->p, cap);
        if (!q) {
            o->oom = true;
            return;
        }
        o->p = q;
        o->cap = cap;
    }
    memcpy(o->p + o->n, data, len);
    o->n += len;
}

static void out_flush(png_structp png) {
    (void)png;
}

/* Pixel (x, y): gradients, rings around the centre, xorshift noise. */
static void synth_row(uint32_t w, uint32_t h, uint32_t y, uint64_t *rng, unsigned char *row) {
    double cx = w / 2.0, cy = h / 2.0, scale = (w > h ? w : h) / 12.0;
    for (uint32_t x = 0; x < w; x++) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        int    noise = (int)(*rng % 5) - 2;
        double r = sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy)) / scale;
        double ring = 40.0 * sin(r * 3.14159);
        int    v[3] = {(int)(255.0 * x / w + ring) + noise, (int)(255.0 * y / h - ring) + noise,
                       (int)(128.0 + ring) + noise};
        for (int c = 0; c < 3; c++)
            row[3 * x + (uint32_t)c] = (unsigned char)(v[c] < 0 ? 0 : v[c] > 255 ? 255 : v[c]);
    }
}

svc_err_t eng_image_synth_png(uint32_t w, uint32_t h, uint64_t seed, unsigned char **bytes,
                              size_t *len) {
    *bytes = NULL;
    *len = 0;
    if (!w || !h || (uint64_t)w * h > 16000000u)
        return SVC_ERR_INVALID;
    png_out_t o = {0};
    unsigned char *volatile row = malloc((size_t)w * 3);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop   info = png ? png_create_info_struct(png) : NULL;
    if (!row || !png || !info) {
        png_destroy_write_struct(&png, &info);
        free(row);
        return SVC_ERR_NOMEM;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(row);
        free(o.p);
        return SVC_ERR_NOMEM;
    }
    png_set_write_fn(png, &o, out_write, out_flush);
    png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_set_compression_level(png, 1); /* fast: the bench times decoding, not encoding */
    png_write_info(png, info);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint32_t y = 0; y < h; y++) {
        synth_row(w, h, y, &rng, row);
        png_write_row(png, row);
    }
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(row);
    if (o.oom) {
        free(o.p);
        return SVC_ERR_NOMEM;
    }
    *bytes = o.p;
    *len = o.n;
    return SVC_OK;
}
