/*
 * test_image.c -- request images against the upstream runtime's libraries
 * (tests/golden/image/, written by tests/tools/gen_image_golden.py with
 * Pillow 13 and torch):
 *
 *   decode    every PNG colour type / depth / interlacing, JPEG baseline,
 *             progressive, grey, 4:2:0 / 4:2:2 / 4:4:4, CMYK, YCCK, WebP
 *             lossy / lossless / alpha / animated, and broken files
 *             (truncated, patched, lying headers, a random one-byte mutation
 *             sweep): schemas' sch_image_decode then eng_image_decode must
 *             give upstream decode()'s message, or Pillow's exact RGB.
 *   resize    eng_image_resize against F.interpolate(bicubic, antialias)
 *             on synthetic images (pattern() below mirrors the generator's).
 *   pipeline  decode + smart_resize + resize + patches against images.py's
 *             _preprocess (grid, tokens, resized pixels, sampled rows).
 *   smart     eng_smart_resize / eng_image_tokens against Python.
 *   config    preprocessor_config.json rules (SPEC e.7).
 *
 * A mismatch prints the case; the counts are printed per group, so a run
 * shows how far from upstream the decoders are, not only that they differ.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eng_image_int.h"
#include "sch_int.h"

#define GOLDEN D3_SOURCE_DIR "/tests/golden/image"

/* ---- helpers ----------------------------------------------------------- */

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

static bool fnv_eq(const uint8_t *p, size_t n, const char *hex) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)fnv1a64(p, n));
    return hex && strcmp(buf, hex) == 0;
}

static uint8_t *read_file(const char *rel, size_t *n) {
    char path[512];
    snprintf(path, sizeof path, GOLDEN "/%s", rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    if (p && len > 0 && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)(len > 0 ? len : 0);
    return p;
}

static json_t *g_index;

static const json_t *cases(void) {
    if (!g_index) {
        json_error_t je;
        g_index = json_load_file(GOLDEN "/index.json", 0, &je);
        cr_assert(g_index, "index.json: %s (regenerate: tests/tools/gen_image_golden.py)", je.text);
    }
    return json_object_get(g_index, "cases");
}

static const char *str(const json_t *c, const char *k) {
    return json_string_value(json_object_get(c, k));
}

static long long num(const json_t *c, const char *k) {
    return json_integer_value(json_object_get(c, k));
}

/* The synthetic image of the generator's pattern(): integer arithmetic only. */
static void pattern(uint32_t w, uint32_t h, int seed, eng_rgb_t *im) {
    im->w = w;
    im->h = h;
    im->px = malloc((size_t)w * h * 3);
    cr_assert(im->px);
    int64_t dw = w > 1 ? w - 1 : 1, dh = h > 1 ? h - 1 : 1;
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++)
            for (int64_t c = 0; c < 3; c++) {
                int64_t v = (x * 255) / dw * (c + 1) + (y * 255) / dh * (3 - c);
                v += ((x / 7 + y / 5) % 2) * 60;
                uint64_t s = ((uint64_t)x * 73856093u) ^ ((uint64_t)y * 19349663u) ^
                             ((uint64_t)(c + seed) * 83492791u);
                s &= 0xFFFFFFFFu;
                s ^= (s << 13) & 0xFFFFFFFFu;
                s ^= s >> 17;
                s ^= (s << 5) & 0xFFFFFFFFu;
                v += (int64_t)(s & 63) - 32;
                im->px[((size_t)y * w + (size_t)x) * 3 + (size_t)c] = (uint8_t)(v & 255);
            }
}

static char *base64(const uint8_t *p, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char             *o = malloc(4 * (n / 3 + 1) + 1), *q = o;
    cr_assert(o);
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *q++ = A[v >> 18];
        *q++ = A[(v >> 12) & 63];
        *q++ = A[(v >> 6) & 63];
        *q++ = A[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *q++ = A[v >> 18];
        *q++ = A[(v >> 12) & 63];
        *q++ = '=';
        *q++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *q++ = A[v >> 18];
        *q++ = A[(v >> 12) & 63];
        *q++ = A[(v >> 6) & 63];
        *q++ = '=';
    }
    *q = '\0';
    return o;
}

/* The bytes through the contract's path: the data URL read by schemas
 * (format, header size, limits), then decoded. *msg is the 400 message
 * when either refuses. */
static svc_err_t decode_bytes(const uint8_t *p, size_t n, const char *mime, eng_rgb_t *out,
                              char *msg, size_t msg_size) {
    char  *b64 = base64(p, n);
    size_t tlen = strlen(b64) + 64;
    char  *text = malloc(tlen);
    cr_assert(text);
    snprintf(text, tlen, "\"data:image/%s;base64,%s\"", mime, b64);
    free(b64);
    sch_jfail_t fail;
    char        jmsg[128];
    sch_jdoc_t *doc = sch_json_parse(text, strlen(text), &fail, jmsg, sizeof jmsg);
    cr_assert(doc, "%s", jmsg);
    sch_image_t img = {0};
    svc_err_t   err = sch_image_decode(sch_jdoc_root(doc), &img, true, msg, msg_size);
    if (!err) {
        err = eng_image_decode(&img, out, msg, msg_size);
        free((void *)img.bytes);
    }
    sch_jdoc_free(doc);
    free(text);
    return err;
}

static const char *mime_of(const char *file) {
    const char *dot = strrchr(file, '.');
    if (dot && strcmp(dot, ".jpg") == 0)
        return "jpeg";
    return dot && strcmp(dot, ".webp") == 0 ? "webp" : "png";
}

/* ---- decode ------------------------------------------------------------ */

typedef struct tally {
    int n, ok, mismatch, raises;
} tally_t;

/* One decode case: true when ours is upstream's. */
static bool run_decode(const json_t *c, tally_t *t) {
    size_t   n;
    uint8_t *p = read_file(str(c, "file"), &n);
    cr_assert(p, "missing %s", str(c, "file"));
    if (json_object_get(c, "cut"))
        n = (size_t)num(c, "cut");
    const json_t *patch = json_object_get(c, "patch");
    for (size_t i = 0; i < json_array_size(patch); i++) {
        const json_t *pv = json_array_get(patch, i);
        p[json_integer_value(json_array_get(pv, 0))] =
            (uint8_t)json_integer_value(json_array_get(pv, 1));
    }
    eng_rgb_t   im = {0};
    char        msg[256] = "";
    svc_err_t   err = decode_bytes(p, n, mime_of(str(c, "file")), &im, msg, sizeof msg);
    const char *want_err = str(c, "error");
    bool        same;
    t->n++;
    if (str(c, "raises")) {
        /* Upstream does not catch this one (its answer is a 500). */
        t->raises++;
        cr_log_info("%s: upstream raises %s; ours: %s", str(c, "name"), str(c, "raises"),
                    err ? msg : "decoded");
        eng_rgb_fini(&im);
        free(p);
        return true;
    }
    if (want_err) {
        same = err && strcmp(msg, want_err) == 0;
        if (!same)
            cr_log_warn("%s: want \"%s\", got %s%s%s", str(c, "name"), want_err,
                        err ? "\"" : "pixels", err ? msg : "", err ? "\"" : "");
    } else if (err) {
        same = false;
        cr_log_warn("%s: want pixels, got \"%s\"", str(c, "name"), msg);
    } else {
        size_t w = (size_t)num(c, "w"), h = (size_t)num(c, "h");
        same = im.w == w && im.h == h && fnv_eq(im.px, w * h * 3, str(c, "fnv"));
        if (!same && im.w == w && im.h == h && str(c, "rgb")) {
            size_t   rn;
            uint8_t *want = read_file(str(c, "rgb"), &rn);
            int      maxd = 0;
            size_t   nd = 0;
            for (size_t i = 0; want && i < rn && i < w * h * 3; i++) {
                int d = abs((int)want[i] - (int)im.px[i]);
                nd += d != 0;
                maxd = d > maxd ? d : maxd;
            }
            cr_log_warn("%s: %zu of %zu samples differ, by at most %d", str(c, "name"), nd,
                        w * h * 3, maxd);
            free(want);
        } else if (!same) {
            cr_log_warn("%s: pixels differ (%ux%u, want %zux%zu)", str(c, "name"), im.w, im.h, w,
                        h);
        }
    }
    t->ok += same;
    t->mismatch += !same;
    eng_rgb_fini(&im);
    free(p);
    return same;
}

/* The decode cases whose name starts with prefix (and, when mutated is
 * false, that are not from the mutation sweep). */
static tally_t decode_group(const char *prefix) {
    tally_t       t = {0};
    const json_t *cs = cases();
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const json_t *c = json_array_get(cs, i);
        const char   *name = str(c, "name");
        if (strcmp(str(c, "kind"), "decode") != 0 || strncmp(name, prefix, strlen(prefix)) != 0)
            continue;
        run_decode(c, &t);
    }
    fprintf(stderr, "decode %s*: %d cases, %d as upstream, %d differ, %d upstream raises\n", prefix,
            t.n, t.ok, t.mismatch, t.raises);
    return t;
}

Test(image, decode_png) {
    tally_t t = decode_group("png_");
    cr_expect_gt(t.n, 100);
    cr_expect_eq(t.mismatch, 0, "%d of %d PNG cases differ from upstream", t.mismatch, t.n);
}

Test(image, decode_jpeg) {
    tally_t t = decode_group("jpeg_");
    cr_expect_gt(t.n, 40);
    cr_expect_eq(t.mismatch, 0, "%d of %d JPEG cases differ from upstream", t.mismatch, t.n);
}

Test(image, decode_webp) {
    tally_t t = decode_group("webp_");
    cr_expect_gt(t.n, 30);
    cr_expect_eq(t.mismatch, 0, "%d of %d WebP cases differ from upstream", t.mismatch, t.n);
}

/* Random one-byte changes: same outcome, same pixels as upstream. */
Test(image, decode_mutations) {
    tally_t t = decode_group("mut_");
    cr_expect_gt(t.n, 200);
    cr_expect_eq(t.mismatch, 0, "%d of %d mutated files differ from upstream", t.mismatch, t.n);
}

/* Every prefix of a few files: never a crash, never pixels where Pillow
 * has none (the outcome itself is checked at the cut points above). */
Test(image, decode_every_truncation) {
    static const char *files[] = {"src/png_rgb8_interlaced.png", "src/jpeg_progressive.jpg",
                                  "src/webp_anim.webp", "src/png_pal4_short.png"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        size_t   n;
        uint8_t *p = read_file(files[f], &n);
        cr_assert(p);
        for (size_t cut = 0; cut < n; cut++) {
            eng_rgb_t im = {0};
            char      msg[256];
            svc_err_t err = decode_bytes(p, cut, mime_of(files[f]), &im, msg, sizeof msg);
            cr_expect(err == SVC_OK || err == SVC_ERR_INVALID, "%s cut %zu: %d", files[f], cut,
                      err);
            eng_rgb_fini(&im);
        }
        free(p);
    }
}

/* A header's size is never trusted: a sch_image_t claiming more than the
 * data holds fails cleanly, one past the cap is refused before decoding. */
Test(image, decode_lying_sizes) {
    size_t   n;
    uint8_t *p = read_file("src/png_rgb8.png", &n);
    cr_assert(p);
    static const char *fmts[] = {"png", "jpeg", "webp"};
    for (size_t f = 0; f < 3; f++) {
        sch_image_t img = {.bytes = p, .len = n, .format = fmts[f], .width = 4000, .height = 4000};
        eng_rgb_t   im = {0};
        char        msg[256];
        cr_expect_eq(eng_image_decode(&img, &im, msg, sizeof msg), SVC_ERR_INVALID, "%s", fmts[f]);
        img.width = 37, img.height = 23;
        if (f == 0) {
            cr_expect_eq(eng_image_decode(&img, &im, msg, sizeof msg), SVC_OK, "%s", msg);
            eng_rgb_fini(&im);
        }
        img.width = 40000, img.height = 40000;
        cr_expect_eq(eng_image_decode(&img, &im, msg, sizeof msg), SVC_ERR_INVALID);
        cr_expect_null(im.px);
    }
    free(p);
}

/* ---- formats upstream opens and refuses ---------------------------------- */

/* tests/fixtures/image-other.json (tests/tools/gen_image_other.py, Pillow
 * 13): GIF, BMP, DIB, TIFF, PPM and kin, AVIF, ICO, CUR, QOI, JPEG 2000 and TGA
 * files, whole, cut and past the bomb limit, with upstream's message. */
Test(image, other_formats_as_upstream) {
    json_error_t je;
    json_t      *doc = json_load_file(D3_SOURCE_DIR "/tests/fixtures/image-other.json", 0, &je);
    cr_assert(doc, "image-other.json: %s", je.text);
    const json_t *cs = json_object_get(doc, "cases");
    size_t        bad = 0;
    cr_assert_gt(json_array_size(cs), 40);
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const json_t *c = json_array_get(cs, i);
        const char   *b64 = str(c, "data");
        size_t        n;
        uint8_t      *p = malloc(strlen(b64) + 1);
        cr_assert(p && sch_base64_decode(b64, strlen(b64), p, &n), "%s", str(c, "name"));
        eng_rgb_t im = {0};
        char      msg[256] = "";
        svc_err_t err = decode_bytes(p, n, "png", &im, msg, sizeof msg);
        if (err != SVC_ERR_INVALID || strcmp(msg, str(c, "error")) != 0) {
            cr_log_error("%s: want \"%s\", got %d \"%s\"", str(c, "name"), str(c, "error"), err,
                         msg);
            bad++;
        }
        eng_rgb_fini(&im);
        free(p);
    }
    cr_expect_eq(bad, 0, "%zu of %zu files answered unlike upstream", bad, json_array_size(cs));
    json_decref(doc);
}

/* The size the bomb check sees: GIF's screen grown to its first frame's
 * extent, BMP's with a top-down (negative) height made positive. */
Test(image, gif_and_bmp_sizes) {
    static const uint8_t gif[] = {'G', 'I', 'F', '8', '9',  'a',  5,    0,    4, 0, 0x80, 0,
                                  0,   0,   0,   0,   0xff, 0xff, 0xff, ',',  2, 0, 3,    0,
                                  8,   0,   6,   0,   0,    2,    2,    0x44, 1, 0, ';'};
    uint8_t              bmp[54] = {'B', 'M'};
    bmp[10] = 54;
    bmp[14] = 40;                            /* BITMAPINFOHEADER */
    bmp[18] = 7;                             /* width 7 */
    memset(bmp + 22, 0xff, 4), bmp[22] = -3; /* height -3: top-down */
    bmp[26] = 1, bmp[28] = 24;
    static const uint8_t core[] = {'B', 'M', 0, 0, 0, 0, 0, 0, 0, 0, 26, 0,  0,
                                   0,   12,  0, 0, 0, 6, 0, 5, 0, 1, 0,  24, 0};
    uint32_t             w, h;
    const char          *fail;
    cr_expect_str_eq(sch_image_probe(gif, sizeof gif, &w, &h, &fail), "other");
    cr_expect(w == 10 && h == 9, "gif %ux%u, want 10x9", w, h);
    cr_expect_str_eq(sch_image_probe(bmp, sizeof bmp, &w, &h, &fail), "other");
    cr_expect(w == 7 && h == 3, "bmp %ux%u, want 7x3", w, h);
    cr_expect_str_eq(sch_image_probe(core, sizeof core, &w, &h, &fail), "other");
    cr_expect(w == 6 && h == 5, "bmp core %ux%u, want 6x5", w, h);
}

/* chunk_PLTE keeps a palette only while the mode is P: one before IHDR, or
 * after an RGB IHDR that a P one replaces, leaves Pillow's black. */
Test(image, png_palette_only_in_p_mode) {
    static const uint8_t sig[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const uint8_t ihdr_p[] = {0, 0, 0, 13, 'I', 'H', 'D', 'R', 0,    0,    0,    2,   0,
                                     0, 0, 2, 8,  3,   0,   0,   0,   0x45, 0x68, 0xfd, 0x16};
    static const uint8_t ihdr_rgb[] = {0, 0, 0, 13, 'I', 'H', 'D', 'R', 0,    0,    0,    2,   0,
                                       0, 0, 2, 8,  2,   0,   0,   0,   0xfd, 0xd4, 0x9a, 0x73};
    static const uint8_t plte[] = {0,   0,   0,  9, 'P', 'L', 'T',  'E',  10,   20,  30,
                                   200, 100, 50, 1, 2,   3,   0xb8, 0x8b, 0x9f, 0x6d};
    static const uint8_t idat[] = {0,    0,    0,    14,   'I',  'D',  'A',  'T', 0x78,
                                   0x9c, 0x63, 0x60, 0x60, 0x64, 0x60, 0x62, 4,   0,
                                   0,    0x0f, 0,    5,    0x2b, 0xdc, 0x64, 0x4f};
    static const uint8_t iend[] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    static const uint8_t colours[12] = {10, 20, 30, 200, 100, 50, 1, 2, 3, 200, 100, 50};
    static const uint8_t black[12] = {0};
    struct {
        const char    *name;
        const uint8_t *chunks[4];
        size_t         lens[4];
        const uint8_t *want;
    } cases[] = {
        {"IHDR PLTE", {ihdr_p, plte}, {sizeof ihdr_p, sizeof plte}, colours},
        {"PLTE IHDR", {plte, ihdr_p}, {sizeof plte, sizeof ihdr_p}, black},
        {"IHDR(RGB) PLTE IHDR(P)",
         {ihdr_rgb, plte, ihdr_p},
         {sizeof ihdr_rgb, sizeof plte, sizeof ihdr_p},
         black},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t png[256];
        size_t  n = 0;
        memcpy(png, sig, sizeof sig), n += sizeof sig;
        for (size_t c = 0; c < 4 && cases[k].chunks[c]; c++)
            memcpy(png + n, cases[k].chunks[c], cases[k].lens[c]), n += cases[k].lens[c];
        memcpy(png + n, idat, sizeof idat), n += sizeof idat;
        memcpy(png + n, iend, sizeof iend), n += sizeof iend;
        eng_rgb_t im = {0};
        char      msg[256] = "";
        cr_assert_eq(decode_bytes(png, n, "png", &im, msg, sizeof msg), SVC_OK, "%s: %s",
                     cases[k].name, msg);
        cr_expect(im.w == 2 && im.h == 2 && memcmp(im.px, cases[k].want, 12) == 0,
                  "%s: pixels differ from Pillow's", cases[k].name);
        eng_rgb_fini(&im);
    }
}

/* ---- resize ------------------------------------------------------------ */

Test(image, resize_matches_torch) {
    const json_t *cs = cases();
    int           n = 0, exact = 0, worst = 0;
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const json_t *c = json_array_get(cs, i);
        if (strcmp(str(c, "kind"), "resize") != 0)
            continue;
        eng_rgb_t src, dst = {0};
        pattern((uint32_t)num(c, "w"), (uint32_t)num(c, "h"), (int)num(c, "seed"), &src);
        uint32_t ow = (uint32_t)num(c, "ow"), oh = (uint32_t)num(c, "oh");
        cr_assert_eq(eng_image_resize(&src, oh, ow, &dst), SVC_OK, "%s", str(c, "name"));
        cr_assert(dst.w == ow && dst.h == oh);
        size_t        rn;
        uint8_t      *rows = read_file(str(c, "file"), &rn);
        const json_t *picks = json_object_get(c, "rows");
        int           maxd = 0;
        for (size_t k = 0; rows && k < json_array_size(picks); k++) {
            size_t         y = (size_t)json_integer_value(json_array_get(picks, k));
            const uint8_t *want = rows + k * (size_t)ow * 3;
            for (size_t x = 0; x < (size_t)ow * 3; x++) {
                int d = abs((int)want[x] - (int)dst.px[y * ow * 3 + x]);
                maxd = d > maxd ? d : maxd;
            }
        }
        bool same = fnv_eq(dst.px, (size_t)ow * oh * 3, str(c, "fnv"));
        n++;
        exact += same;
        worst = maxd > worst ? maxd : worst;
        if (!same)
            cr_log_warn("%s: differs from torch (sampled rows: max diff %d)", str(c, "name"), maxd);
        cr_expect(same || maxd <= 1, "%s: max diff %d", str(c, "name"), maxd);
        free(rows);
        eng_rgb_fini(&src);
        eng_rgb_fini(&dst);
    }
    fprintf(stderr, "resize: %d cases, %d identical to torch, max sampled diff %d\n", n, exact,
            worst);
    cr_expect_gt(n, 10);
    cr_expect_eq(exact, n, "%d of %d resizes differ from torch", n - exact, n);
}

/* ---- pipeline ---------------------------------------------------------- */

static eng_vis_proc_t proc_of(const json_t *c) {
    eng_vis_proc_t p;
    eng_vis_proc_default(&p);
    for (size_t k = 0; k < 3; k++) {
        p.mean[k] = (float)json_number_value(json_array_get(json_object_get(c, "mean"), k));
        p.std[k] = (float)json_number_value(json_array_get(json_object_get(c, "std"), k));
    }
    return p;
}

Test(image, pipeline_matches_reference) {
    const json_t *cs = cases();
    int           n = 0;
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const json_t *c = json_array_get(cs, i);
        if (strcmp(str(c, "kind"), "pipeline") != 0)
            continue;
        n++;
        size_t   len;
        uint8_t *p = read_file(str(c, "file"), &len);
        cr_assert(p);
        eng_rgb_t src = {0}, dst = {0};
        char      msg[256];
        cr_assert_eq(decode_bytes(p, len, mime_of(str(c, "file")), &src, msg, sizeof msg), SVC_OK,
                     "%s: %s", str(c, "name"), msg);
        uint32_t oh, ow;
        cr_assert_eq(eng_smart_resize(src.h, src.w, 32, &oh, &ow, msg, sizeof msg), SVC_OK);
        cr_expect(oh == num(c, "oh") && ow == num(c, "ow"), "%s: %ux%u", str(c, "name"), ow, oh);
        cr_assert_eq(eng_image_resize(&src, oh, ow, &dst), SVC_OK);
        cr_expect(fnv_eq(dst.px, (size_t)oh * ow * 3, str(c, "resized_fnv")),
                  "%s: resized pixels differ from torch", str(c, "name"));
        eng_vis_proc_t pr = proc_of(c);
        float         *rows = NULL;
        size_t         gh = 0, gw = 0;
        cr_assert_eq(eng_image_patches(&dst, &pr, &rows, &gh, &gw), SVC_OK);
        cr_expect(gh == (size_t)num(c, "gh") && gw == (size_t)num(c, "gw"));
        size_t row_len = eng_vis_proc_row_elems(&pr);
        cr_expect(
            fnv_eq((const uint8_t *)rows, gh * gw * row_len * sizeof(float), str(c, "rows_fnv")),
            "%s: patch rows are not bit-identical to the reference", str(c, "name"));
        size_t        rn;
        float        *want = (float *)(void *)read_file(str(c, "rows_file"), &rn);
        const json_t *picks = json_object_get(c, "rows");
        double        maxd = 0;
        for (size_t k = 0; want && k < json_array_size(picks); k++) {
            size_t r = (size_t)json_integer_value(json_array_get(picks, k));
            for (size_t e = 0; e < row_len; e++)
                maxd = fmax(maxd, fabs((double)want[k * row_len + e] - rows[r * row_len + e]));
        }
        bool ident =
            fnv_eq((const uint8_t *)rows, gh * gw * row_len * sizeof(float), str(c, "rows_fnv"));
        fprintf(stderr, "pipeline %s: %zux%zu patches, rows %s, sampled rows max |diff| %g\n",
                str(c, "name"), gh, gw, ident ? "bit-identical" : "DIFFERENT", maxd);
        cr_expect_leq(maxd, 1.0 / 255, "%s", str(c, "name"));
        /* The one-call path gives the same. */
        sch_image_t     img = {.bytes = p,
                               .len = len,
                               .format = mime_of(str(c, "file")),
                               .width = src.w,
                               .height = src.h};
        eng_vis_input_t vi = {0};
        cr_assert_eq(eng_image_preprocess(&img, &pr, &vi, msg, sizeof msg), SVC_OK, "%s", msg);
        cr_expect(vi.gh == gh && vi.gw == gw && vi.tokens == (size_t)num(c, "tokens"));
        cr_expect(memcmp(vi.rows, rows, gh * gw * row_len * sizeof(float)) == 0);
        cr_expect_eq(eng_image_tokens(src.w, src.h), vi.tokens);
        eng_vis_input_fini(&vi);
        free(want);
        free(rows);
        free(p);
        eng_rgb_fini(&src);
        eng_rgb_fini(&dst);
    }
    cr_expect_eq(n, 5);
}

/* ---- smart_resize ------------------------------------------------------ */

Test(image, smart_resize_matches_python) {
    const json_t *cs = cases();
    int           n = 0, bad = 0;
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const json_t *c = json_array_get(cs, i);
        if (strcmp(str(c, "kind"), "smart") != 0)
            continue;
        n++;
        uint32_t  h = (uint32_t)num(c, "h"), w = (uint32_t)num(c, "w"), oh = 0, ow = 0;
        size_t    factor = (size_t)num(c, "factor");
        char      msg[256] = "";
        svc_err_t err = eng_smart_resize(h, w, factor, &oh, &ow, msg, sizeof msg);
        if (str(c, "error")) {
            bool same = err == SVC_ERR_INVALID && strcmp(msg, str(c, "error")) == 0;
            bad += !same;
            cr_expect(same, "%ux%u: want \"%s\", got \"%s\"", h, w, str(c, "error"), msg);
            continue;
        }
        bool same = !err && oh == num(c, "oh") && ow == num(c, "ow");
        bad += !same;
        cr_expect(same, "%ux%u /%zu: %ux%u, want %lldx%lld (%s)", h, w, factor, oh, ow,
                  num(c, "oh"), num(c, "ow"), msg);
        if (factor == 32)
            cr_expect_eq(eng_image_tokens(w, h), (size_t)(oh / 16) * (ow / 16) / 4, "%ux%u", h, w);
    }
    fprintf(stderr, "smart_resize: %d cases, %d differ\n", n, bad);
    cr_expect_gt(n, 500);
}

Test(image, smart_resize_edges) {
    uint32_t oh, ow;
    char     msg[256];
    cr_expect_eq(eng_smart_resize(1, 100000, 32, &oh, &ow, msg, sizeof msg), SVC_ERR_INVALID);
    cr_expect_str_eq(msg, "absolute aspect ratio must be smaller than 200, got 100000.0");
    cr_expect_eq(eng_smart_resize(2, 401, 32, &oh, &ow, msg, sizeof msg), SVC_ERR_INVALID);
    cr_expect_str_eq(msg, "absolute aspect ratio must be smaller than 200, got 200.5");
    cr_expect_eq(eng_smart_resize(1, 200, 32, &oh, &ow, msg, sizeof msg), SVC_OK);
    cr_expect(oh == 32 && ow == 3648);
    /* eng_image_tokens keeps counting past the aspect limit, as before. */
    cr_expect_eq(eng_image_tokens(100000, 1), 2530);
    cr_expect_eq(eng_image_tokens(0, 5), 0);
}

/* ---- preprocessor_config.json ------------------------------------------ */

static char g_dir[64];

static svc_err_t load_config(const char *json, eng_vis_proc_t *p, char *msg, size_t n) {
    snprintf(g_dir, sizeof g_dir, "/tmp/d3-img-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char path[128];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(json, f);
    fclose(f);
    svc_err_t err = eng_vis_proc_load(g_dir, p, NULL, msg, n);
    unlink(path);
    rmdir(g_dir);
    return err;
}

#define PPC_BASE                                                                                   \
    "\"image_processor_type\": \"Qwen2VLImageProcessorFast\", \"patch_size\": 16, "                \
    "\"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0.48145466, 0.4578275, "      \
    "0.40821073], \"image_std\": [0.26862954, 0.26130258, 0.27577711]"

Test(image, preprocessor_config) {
    eng_vis_proc_t p;
    char           msg[512];
    cr_assert_eq(load_config("{" PPC_BASE ", \"do_resize\": true, \"resample\": 3, "
                             "\"rescale_factor\": 0.00392156862745098, \"size\": {}}",
                             &p, msg, sizeof msg),
                 SVC_OK, "%s", msg);
    cr_expect(p.patch == 16 && p.temporal == 2 && p.merge == 2);
    cr_expect(p.mean[0] == 0.48145466f && p.std[2] == 0.27577711f);
    cr_expect_eq(eng_vis_proc_row_elems(&p), 1536);
    static const char *bad[] = {
        "{\"image_processor_type\": \"CLIPImageProcessor\", \"patch_size\": 16}",
        "{" PPC_BASE ", \"do_resize\": false}",
        "{" PPC_BASE ", \"do_normalize\": false}",
        "{" PPC_BASE ", \"do_convert_rgb\": false}",
        "{" PPC_BASE ", \"do_rescale\": false}",
        "{" PPC_BASE ", \"resample\": 2}",
        "{" PPC_BASE ", \"rescale_factor\": 0.5}",
        "[1, 2]",
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 0, "
        "\"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0, 0, 0], "
        "\"image_std\": [1, 1, 1]}",
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 16.0, "
        "\"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0, 0, 0], "
        "\"image_std\": [1, 1, 1]}",
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 16, "
        "\"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0, 0], "
        "\"image_std\": [1, 1, 1]}",
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 16, "
        "\"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0, 0, 0], "
        "\"image_std\": [1, 0, 1]}",
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 16, "
        "\"temporal_patch_size\": 2, \"image_mean\": [0, 0, 0], \"image_std\": [1, 1, 1]}",
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 16, "
        "\"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0, \"0\", 0], "
        "\"image_std\": [1, 1, 1]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        svc_err_t err = load_config(bad[i], &p, msg, sizeof msg);
        cr_expect_eq(err, SVC_ERR_FORMAT, "accepted: %s", bad[i]);
        cr_expect(strstr(msg, "preprocessor_config.json") != NULL, "%s", msg);
    }
    /* Absent: SVC_ERR_IO naming the file; with `present`, not an error. */
    bool present = true;
    cr_expect_eq(eng_vis_proc_load("/nonexistent-d3", &p, NULL, msg, sizeof msg), SVC_ERR_IO);
    cr_expect_eq(eng_vis_proc_load("/nonexistent-d3", &p, &present, msg, sizeof msg), SVC_OK);
    cr_expect(!present);
}
