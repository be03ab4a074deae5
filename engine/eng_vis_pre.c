/*
 * eng_vis_pre.c -- the Qwen2-VL image processor as the upstream runtime runs
 * it (images.py): smart_resize, torch's uint8 bicubic antialiased resize,
 * the fp32 normalisation, the patch rows; and preprocessor_config.json.
 *
 * The resize reproduces ATen's CPU uint8 path (UpSampleKernel.cpp's int16
 * weights, UpSampleKernelAVXAntialias.h's kernels) in portable C, so the
 * pixels the tower sees are torch's to the bit: weights computed in double
 * exactly as ATen does, scaled to int16 at the precision ATen derives from
 * the largest weight, a horizontal then a vertical pass, each rounding to
 * uint8. The file is built without FP contraction (ISO C17 mode), so no FMA
 * changes a weight.
 */
#include "eng_image_int.h"

#include "eng_util_int.h"

#include <jansson.h>
#include <math.h>

void eng_rgb_fini(eng_rgb_t *im) {
    if (!im)
        return;
    free(im->px);
    im->px = NULL;
    im->w = im->h = 0;
}

void eng_vis_input_fini(eng_vis_input_t *in) {
    if (!in)
        return;
    free(in->rows);
    memset(in, 0, sizeof *in);
}

/* ---- smart_resize ---- */

/* Python's round() on a float: halves go to the even neighbour. */
static double round_half_even(double x) {
    double f = floor(x);
    double d = x - f; /* exact for the magnitudes here */
    if (d > 0.5)
        return f + 1.0;
    if (d < 0.5)
        return f;
    return fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

void eng_smart_resize_dims(uint32_t h, uint32_t w, size_t factor, uint32_t min_pixels,
                           uint32_t max_pixels, uint32_t *oh, uint32_t *ow) {
    /* Every step is the double operation Python does on the same values:
     * int / int and int * float are correctly rounded either way. */
    double fh = h, fw = w, f = (double)factor;
    double hb = round_half_even(fh / f) * f;
    double wb = round_half_even(fw / f) * f;
    if (hb * wb > (double)max_pixels) {
        double beta = sqrt(fh * fw / (double)max_pixels);
        hb = fmax(f, floor(fh / beta / f) * f);
        wb = fmax(f, floor(fw / beta / f) * f);
    } else if (hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / (fh * fw));
        hb = ceil(fh * beta / f) * f;
        wb = ceil(fw * beta / f) * f;
    }
    *oh = (uint32_t)hb;
    *ow = (uint32_t)wb;
}

/* repr(x) of a finite float in [1e-4, 1e16): the shortest digits that read
 * back as x (the nearest such, as glibc's exact printf rounds), in fixed
 * notation with at least one fractional digit. */
static void py_float_repr(double x, char *out, size_t n) {
    char e[40];
    int  p = 1;
    for (; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x)
            break;
    }
    /* e is "d.ddde+XX" (or "de+XX" when p == 1). */
    char        digits[24];
    size_t      nd = 0;
    const char *s = e;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && nd < sizeof digits - 1)
            digits[nd++] = *s;
    digits[nd] = '\0';
    long      exp10 = *s == 'e' ? strtol(s + 1, NULL, 10) : 0;
    svc_buf_t b;
    svc_buf_init(&b, 64);
    bool ok = true;
    if (exp10 >= 0) {
        size_t ni = (size_t)exp10 + 1;
        for (size_t i = 0; i < ni && ok; i++)
            ok = !svc_buf_addc(&b, i < nd ? digits[i] : '0');
        ok = ok && !svc_buf_addc(&b, '.');
        if (nd > ni)
            ok = ok && !svc_buf_add(&b, digits + ni, nd - ni);
        else
            ok = ok && !svc_buf_addc(&b, '0');
    } else {
        ok = !svc_buf_adds(&b, "0.");
        for (long i = 0; i < -exp10 - 1 && ok; i++)
            ok = !svc_buf_addc(&b, '0');
        ok = ok && !svc_buf_add(&b, digits, nd);
    }
    snprintf(out, n, "%s", ok && b.data ? b.data : e);
    svc_buf_fini(&b);
}

svc_err_t eng_smart_resize(uint32_t h, uint32_t w, size_t factor, uint32_t *oh, uint32_t *ow,
                           char *errstr, size_t errstr_size) {
    if (h == 0 || w == 0) {
        /* max/min divides by zero in Python. */
        svc_errf(errstr, errstr_size, "invalid image data (ZeroDivisionError)");
        return SVC_ERR_INVALID;
    }
    double ratio = (double)(h > w ? h : w) / (double)(h > w ? w : h);
    if (ratio > ENG_IMG_MAX_ASPECT) {
        char r[48];
        py_float_repr(ratio, r, sizeof r);
        svc_errf(errstr, errstr_size, "absolute aspect ratio must be smaller than %d, got %s",
                 ENG_IMG_MAX_ASPECT, r);
        return SVC_ERR_INVALID;
    }
    eng_smart_resize_dims(h, w, factor, ENG_IMG_MIN_PIXELS, ENG_IMG_MAX_PIXELS, oh, ow);
    return SVC_OK;
}

/* ---- the resize: ATen's uint8 antialiased bicubic ---- */

/* Keys' cubic with a = -0.5 (antialias=True, Pillow's), written as ATen's
 * cubic_convolution1/2 so the double rounding is the same. */
static double aa_cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0)
        return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0)
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

/* One axis: per output index its first input, its count and ksize int16
 * weights at prec bits. */
typedef struct aa_axis {
    int64_t *xmin, *xsize;
    int16_t *k; /* (out, ksize) */
    int64_t  ksize;
    unsigned prec;
} aa_axis_t;

static void aa_axis_fini(aa_axis_t *a) {
    free(a->xmin);
    free(a->xsize);
    free(a->k);
}

static svc_err_t aa_axis_init(int64_t in, int64_t out, aa_axis_t *a) {
    memset(a, 0, sizeof *a);
    double  scale = (double)in / (double)out; /* area_pixel_compute_scale, no scale given */
    double  support = scale >= 1.0 ? (4 * 0.5) * scale : 4 * 0.5;
    int64_t ks = (int64_t)ceil(support) * 2 + 1;
    a->ksize = ks;
    a->xmin = malloc((size_t)out * sizeof *a->xmin);
    a->xsize = malloc((size_t)out * sizeof *a->xsize);
    a->k = calloc((size_t)out * (size_t)ks, sizeof *a->k);
    double *wf = malloc((size_t)out * (size_t)ks * sizeof *wf);
    if (!a->xmin || !a->xsize || !a->k || !wf) {
        free(wf);
        aa_axis_fini(a);
        return SVC_ERR_NOMEM;
    }
    double wt_max = 0.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    for (int64_t i = 0; i < out; i++) {
        double  center = scale * ((double)i + 0.5);
        int64_t xmin = (int64_t)(center - support + 0.5); /* truncation, as ATen's cast */
        if (xmin < 0)
            xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        int64_t xsize = (xmax < in ? xmax : in) - xmin;
        xsize = xsize < 0 ? 0 : xsize > ks ? ks : xsize;
        double *w = wf + i * ks;
        double  total = 0.0;
        int64_t j = 0;
        for (; j < xsize; j++) {
            w[j] = aa_cubic(((double)(j + xmin) - center + 0.5) * invscale);
            total += w[j];
        }
        if (total != 0.0)
            for (j = 0; j < xsize; j++) {
                w[j] /= total;
                wt_max = fmax(wt_max, w[j]);
            }
        for (j = xsize; j < ks; j++)
            w[j] = 0.0;
        a->xmin[i] = xmin;
        a->xsize[i] = xsize;
    }
    unsigned p = 0;
    for (; p < 22; p++) {
        int next = (int)(0.5 + wt_max * (double)(1 << (p + 1)));
        if (next >= (1 << 15))
            break;
    }
    a->prec = p;
    for (int64_t t = 0; t < out * ks; t++) {
        double v = wf[t] * (double)(1 << p);
        a->k[t] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wf);
    return a->prec > 0 ? SVC_OK : SVC_ERR_INTERNAL;
}

/* (acc >> prec) saturated to uint8, as _mm_srai_epi32 + packs + packus; a
 * negative sum saturates to 0 without a shift of a negative number. */
static inline uint8_t aa_out(int32_t acc, unsigned prec) {
    if (acc < 0)
        return 0;
    int32_t v = acc >> prec;
    return (uint8_t)(v > 255 ? 255 : v);
}

/* Rows of src (h x sw x 3) to dst (h x ax.out x 3) along x. */
static void aa_horizontal(const uint8_t *src, uint32_t h, uint32_t sw, uint8_t *dst, uint32_t dw,
                          const aa_axis_t *ax) {
    const int32_t init = 1 << (ax->prec - 1);
    for (uint32_t y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * sw * 3;
        uint8_t       *o = dst + (size_t)y * dw * 3;
        for (uint32_t x = 0; x < dw; x++) {
            const int16_t *k = ax->k + (size_t)x * (size_t)ax->ksize;
            const uint8_t *p = row + (size_t)ax->xmin[x] * 3;
            int32_t        r = init, g = init, b = init;
            for (int64_t j = 0; j < ax->xsize[x]; j++) {
                r += p[3 * j] * k[j];
                g += p[3 * j + 1] * k[j];
                b += p[3 * j + 2] * k[j];
            }
            o[3 * x] = aa_out(r, ax->prec);
            o[3 * x + 1] = aa_out(g, ax->prec);
            o[3 * x + 2] = aa_out(b, ax->prec);
        }
    }
}

/* src (sh x w x 3) to dst (dh x w x 3) along y. */
static void aa_vertical(const uint8_t *src, uint32_t w, uint8_t *dst, uint32_t dh,
                        const aa_axis_t *ax) {
    const int32_t init = 1 << (ax->prec - 1);
    size_t        stride = (size_t)w * 3;
    for (uint32_t y = 0; y < dh; y++) {
        const int16_t *k = ax->k + (size_t)y * (size_t)ax->ksize;
        const uint8_t *base = src + (size_t)ax->xmin[y] * stride;
        uint8_t       *o = dst + (size_t)y * stride;
        for (size_t i = 0; i < stride; i++) {
            int32_t acc = init;
            for (int64_t j = 0; j < ax->xsize[y]; j++)
                acc += base[(size_t)j * stride + i] * k[j];
            o[i] = aa_out(acc, ax->prec);
        }
    }
}

svc_err_t eng_image_resize(const eng_rgb_t *in, uint32_t oh, uint32_t ow, eng_rgb_t *out) {
    memset(out, 0, sizeof *out);
    if (oh == 0 || ow == 0 || in->w == 0 || in->h == 0)
        return SVC_ERR_INVALID;
    size_t   n = (size_t)oh * ow * 3;
    uint8_t *dst = malloc(n);
    if (!dst)
        return SVC_ERR_NOMEM;
    if (oh == in->h && ow == in->w) {
        memcpy(dst, in->px, n);
        *out = (eng_rgb_t){.w = ow, .h = oh, .px = dst};
        return SVC_OK;
    }
    bool      need_h = ow != in->w, need_v = oh != in->h;
    aa_axis_t ax_h = {0}, ax_v = {0};
    uint8_t  *tmp = NULL;
    svc_err_t err = SVC_OK;
    if (need_h)
        err = aa_axis_init(in->w, ow, &ax_h);
    if (!err && need_v)
        err = aa_axis_init(in->h, oh, &ax_v);
    if (!err && need_h && need_v) {
        tmp = malloc((size_t)in->h * ow * 3);
        if (!tmp)
            err = SVC_ERR_NOMEM;
    }
    if (!err) {
        const uint8_t *src = in->px;
        if (need_h) {
            aa_horizontal(src, in->h, in->w, need_v ? tmp : dst, ow, &ax_h);
            src = tmp;
        }
        if (need_v)
            aa_vertical(src, ow, dst, oh, &ax_v);
    }
    free(tmp);
    if (need_h)
        aa_axis_fini(&ax_h);
    if (need_v)
        aa_axis_fini(&ax_v);
    if (err) {
        free(dst);
        return err;
    }
    *out = (eng_rgb_t){.w = ow, .h = oh, .px = dst};
    return SVC_OK;
}

/* ---- normalise + patch rows ---- */

svc_err_t eng_image_patches(const eng_rgb_t *im, const eng_vis_proc_t *p, float **rows, size_t *gh,
                            size_t *gw) {
    *rows = NULL;
    size_t ps = p->patch, m = p->merge, tp = p->temporal;
    if (ps == 0 || m == 0 || tp == 0 || im->h % (ps * m) || im->w % (ps * m) || !im->h || !im->w)
        return SVC_ERR_INVALID;
    size_t gh_ = im->h / ps, gw_ = im->w / ps;
    size_t row_len = eng_vis_proc_row_elems(p);
    size_t n_rows = gh_ * gw_;
    if (n_rows > SIZE_MAX / row_len / sizeof(float))
        return SVC_ERR_NOMEM;
    float *r = malloc(n_rows * row_len * sizeof *r);
    if (!r)
        return SVC_ERR_NOMEM;
    /* torch: mean * (1 / rescale) in fp32 (the scalar cast to float), then
     * (x - mean) / std in fp32. */
    float inv = (float)(1.0 / p->rescale);
    float mean[3], stdv[3];
    for (int c = 0; c < 3; c++) {
        mean[c] = p->mean[c] * inv;
        stdv[c] = p->std[c] * inv;
    }
    size_t plane = ps * ps;
    size_t bw_n = gw_ / m;
    for (size_t ri = 0; ri < n_rows; ri++) {
        /* ri = ((bh * (gw/m) + bw) * m + mh) * m + mw */
        size_t mw = ri % m, mh = (ri / m) % m, blk = ri / (m * m);
        size_t py = (blk / bw_n) * m + mh, px = (blk % bw_n) * m + mw;
        float *row = r + ri * row_len;
        for (int c = 0; c < 3; c++) {
            float *dst = row + (size_t)c * tp * plane;
            for (size_t y = 0; y < ps; y++) {
                const uint8_t *s = im->px + (((py * ps + y) * im->w) + px * ps) * 3 + c;
                for (size_t x = 0; x < ps; x++) {
                    float v = (float)s[3 * x];
                    v = v - mean[c];
                    v = v / stdv[c];
                    dst[y * ps + x] = v;
                }
            }
            for (size_t t = 1; t < tp; t++)
                memcpy(dst + t * plane, dst, plane * sizeof *dst);
        }
    }
    *rows = r;
    *gh = gh_;
    *gw = gw_;
    return SVC_OK;
}

svc_err_t eng_image_preprocess(const sch_image_t *img, const eng_vis_proc_t *p,
                               eng_vis_input_t *out, char *errstr, size_t errstr_size) {
    memset(out, 0, sizeof *out);
    eng_rgb_t src = {0}, dst = {0};
    svc_err_t err = eng_image_decode(img, &src, errstr, errstr_size);
    if (err)
        return err;
    uint32_t oh = 0, ow = 0;
    err = eng_smart_resize(src.h, src.w, p->patch * p->merge, &oh, &ow, errstr, errstr_size);
    if (!err) {
        err = eng_image_resize(&src, oh, ow, &dst);
        if (err)
            svc_errf(errstr, errstr_size, "out of memory resizing an image");
    }
    eng_rgb_fini(&src);
    if (!err) {
        err = eng_image_patches(&dst, p, &out->rows, &out->gh, &out->gw);
        if (err)
            svc_errf(errstr, errstr_size, "out of memory building an image's patch rows");
    }
    eng_rgb_fini(&dst);
    if (err)
        return err;
    out->h = oh;
    out->w = ow;
    out->tokens = out->gh * out->gw / (p->merge * p->merge);
    return SVC_OK;
}

/* ---- preprocessor_config.json (SPEC e.7) ---- */

#define PPC "preprocessor_config.json"

void eng_vis_proc_default(eng_vis_proc_t *p) {
    p->patch = 16;
    p->temporal = 2;
    p->merge = 2;
    for (int c = 0; c < 3; c++) {
        p->mean[c] = 0.5f;
        p->std[c] = 0.5f;
    }
    p->rescale = 1.0 / 255.0;
}

typedef struct ppc_ctx {
    const char *path;
    char       *errstr;
    size_t      errstr_size;
} ppc_ctx_t;

static svc_err_t ppc_fail(const ppc_ctx_t *c, const char *key, const char *rule) {
    svc_errf(c->errstr, c->errstr_size, PPC " \"%s\": %s %s", c->path, key, rule);
    return SVC_ERR_FORMAT;
}

/* A positive integer at most cap: the caps keep patch rows and grids far
 * from overflow (Qwen's are 16, 2, 2). */
static svc_err_t ppc_size(const ppc_ctx_t *c, const json_t *o, const char *key, size_t cap,
                          size_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!v)
        return ppc_fail(c, key, "is missing");
    if (!json_is_integer(v) || json_integer_value(v) <= 0)
        return ppc_fail(c, key, "must be a positive integer");
    if ((json_int_t)cap < json_integer_value(v)) {
        svc_errf(c->errstr, c->errstr_size, PPC " \"%s\": %s %lld is over the supported %zu",
                 c->path, key, (long long)json_integer_value(v), cap);
        return SVC_ERR_FORMAT;
    }
    *out = (size_t)json_integer_value(v);
    return SVC_OK;
}

static svc_err_t ppc_triple(const ppc_ctx_t *c, const json_t *o, const char *key, bool nonzero,
                            float out[3]) {
    const json_t *v = json_object_get(o, key);
    if (!v)
        return ppc_fail(c, key, "is missing");
    if (!json_is_array(v) || json_array_size(v) != 3)
        return ppc_fail(c, key, "must be a list of three numbers");
    for (size_t i = 0; i < 3; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_number(e) || !isfinite(json_number_value(e)))
            return ppc_fail(c, key, "must be a list of three finite numbers");
        double d = json_number_value(e);
        if (nonzero && d == 0.0)
            return ppc_fail(c, key, "must not hold a zero");
        /* torch.tensor(list of floats) holds them as fp32. */
        out[i] = (float)d;
        if (!isfinite(out[i]) || (nonzero && out[i] == 0.0f))
            return ppc_fail(c, key, "must hold values representable in fp32, none zero");
    }
    return SVC_OK;
}

static svc_err_t ppc_check(const ppc_ctx_t *c, const json_t *o, eng_vis_proc_t *p) {
    const json_t *t = json_object_get(o, "image_processor_type");
    if (!json_is_string(t) || (strcmp(json_string_value(t), "Qwen2VLImageProcessorFast") != 0 &&
                               strcmp(json_string_value(t), "Qwen2VLImageProcessor") != 0))
        return ppc_fail(c, "image_processor_type",
                        "must be Qwen2VLImageProcessorFast or Qwen2VLImageProcessor");
    static const char *const flags[] = {"do_resize", "do_rescale", "do_normalize",
                                        "do_convert_rgb"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const json_t *v = json_object_get(o, flags[i]);
        if (v && !json_is_true(v))
            return ppc_fail(c, flags[i], "must be true");
    }
    const json_t *rs = json_object_get(o, "resample");
    if (rs && (!json_is_integer(rs) || json_integer_value(rs) != 3))
        return ppc_fail(c, "resample", "must be 3 (bicubic)");
    p->rescale = 1.0 / 255.0;
    const json_t *rf = json_object_get(o, "rescale_factor");
    if (rf) {
        double v = json_is_number(rf) ? json_number_value(rf) : NAN;
        /* The JSON text of 1/255 may be written with fewer digits. */
        if (!isfinite(v) || fabs(v - 1.0 / 255.0) > 1e-12)
            return ppc_fail(c, "rescale_factor", "must be 1/255");
        p->rescale = v;
    }
    svc_err_t err = ppc_size(c, o, "patch_size", 256, &p->patch);
    if (!err)
        err = ppc_size(c, o, "temporal_patch_size", 16, &p->temporal);
    if (!err)
        err = ppc_size(c, o, "merge_size", 16, &p->merge);
    if (!err)
        err = ppc_triple(c, o, "image_mean", false, p->mean);
    if (!err)
        err = ppc_triple(c, o, "image_std", true, p->std);
    return err;
}

svc_err_t eng_vis_proc_load(const char *dir, eng_vis_proc_t *out, bool *present, char *errstr,
                            size_t errstr_size) {
    char *path = eng_path_join(dir, PPC);
    if (!path) {
        svc_errf(errstr, errstr_size, "out of memory");
        return SVC_ERR_NOMEM;
    }
    if (present) {
        *present = eng_is_file(path);
        if (!*present) {
            free(path);
            return SVC_OK;
        }
    }
    json_error_t je;
    json_t      *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    svc_err_t    err = SVC_OK;
    if (!root) {
        svc_errf(errstr, errstr_size, PPC " \"%s\": %s (line %d, column %d)", path, je.text,
                 je.line, je.column);
        err = eng_is_file(path) ? SVC_ERR_FORMAT : SVC_ERR_IO;
    } else if (!json_is_object(root)) {
        svc_errf(errstr, errstr_size, PPC " \"%s\": the top level is not a JSON object", path);
        err = SVC_ERR_FORMAT;
    } else {
        ppc_ctx_t      c = {.path = path, .errstr = errstr, .errstr_size = errstr_size};
        eng_vis_proc_t p = {0};
        err = ppc_check(&c, root, &p);
        if (!err)
            *out = p;
    }
    json_decref(root);
    free(path);
    return err;
}
