/*
 * eng_image.c -- request image bytes to RGB, as the upstream runtime's PIL
 * calls produce them (eng_image_int.h): Image.open + verify(), then
 * Image.open + convert("RGB").
 *
 * The bytes were validated by schemas/sch_image.c (format, header size,
 * pixel and aspect limits), so every decoder below is capped at that size
 * and must report exactly it. What Pillow refuses while loading is an
 * OSError; PNG's verify() adds SyntaxError (a chunk's CRC or name). Pillow
 * decodes PNG itself (zlib and its own unfiltering) and drives libjpeg
 * through a suspending source; both are reproduced here rather than
 * approximated with libpng or TurboJPEG, whose end-of-data rules differ (a
 * libpng + TurboJPEG version of this file differed from upstream on 11 of
 * tests/test_image.c's 101 PNG cases and 3 of its 50 JPEG ones: a PNG whose
 * zlib stream ends early on a row boundary, an IEND cut short, a JPEG
 * without its EOI that Pillow still decodes; this one on none):
 *
 *   PNG   Pillow's verify() walk from the first IDAT to IEND, then its
 *         ZipDecode loop over the IDAT (fdAT, DDAT) run in Pillow's 64 KiB
 *         blocks: whole rows only, filter types 0-4, Adam7 for any nonzero
 *         interlace byte, any compression byte read as zlib, unknown chunks
 *         ignored; the image ends at its last row (whatever follows) or
 *         when the zlib stream ends on a row boundary (the rows left stay
 *         zero, as Pillow's new image). Pixels as Pillow's modes convert:
 *         1/2/4-bit grey scaled, 16-bit samples their high byte except
 *         16-bit grey ("I;16", clipped at 255), palette entries past PLTE
 *         (or with no PLTE) black, tRNS and alpha dropped.
 *   JPEG  libjpeg with a suspending source, as Pillow's decoder runs it:
 *         running out of data before the last scanline is an OSError
 *         (Pillow's "image file is truncated"), in jpeg_finish_decompress
 *         it is not; libjpeg's warnings are ignored. Grey is replicated;
 *         CMYK (and YCCK, which libjpeg turns into CMYK) is read
 *         Adobe-inverted ("CMYK;I") and converted with Pillow's cmyk2rgb.
 *   WebP  what WebPAnimDecoder shows as frame 1: the demuxer validates the
 *         whole file (as Pillow's decoder does when it opens it), and the
 *         first frame is decoded onto a zeroed canvas at its offset.
 *
 * Memory: the RGB buffer (3 bytes a pixel) is what the decoders write; PNG
 * keeps two rows besides, JPEG one. libjpeg's and libwebp's own buffers are
 * bounded by the validated size (a progressive JPEG's coefficients, a
 * lossless WebP's ARGB plane).
 */
#include "eng_image_int.h"

#include <jpeglib.h>
#include <setjmp.h>
#include <webp/decode.h>
#include <webp/demux.h>
#include <zlib.h>

#define OS_ERROR     "invalid image data (OSError)"
#define SYNTAX_ERROR "invalid image data (SyntaxError)"
#define UNIDENTIFIED "invalid image data (UnidentifiedImageError)"

static svc_err_t fail(char *errstr, size_t errstr_size, const char *msg) {
    svc_errf(errstr, errstr_size, "%s", msg);
    return SVC_ERR_INVALID;
}

static svc_err_t no_memory(char *errstr, size_t errstr_size) {
    svc_errf(errstr, errstr_size, "out of memory decoding an image");
    return SVC_ERR_NOMEM;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ---- PNG ---------------------------------------------------------------- */

static bool png_cid(const unsigned char *t) {
    for (int i = 0; i < 4; i++) {
        unsigned char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

/* The IHDR/PLTE state Pillow's PngStream keeps while opening: the last
 * IHDR, and the last PLTE before the first IDAT that came while the mode
 * was P (chunk_PLTE keeps it only then: not before IHDR, not for RGB). */
typedef struct png_info {
    uint32_t w, h;
    unsigned depth, ct;
    bool     interlaced;  /* any nonzero interlace byte */
    uint8_t  pal[256][3]; /* PLTE, zero past its end (Pillow's black) */
    size_t   idat;        /* offset of the first IDAT chunk */
} png_info_t;

/* Bits per pixel of Pillow's rawmode for (depth, colour type); 0 for a
 * pair sch_image.c would have refused. */
static unsigned png_bits(const png_info_t *pi) {
    static const unsigned channels[7] = {1, 0, 3, 1, 2, 0, 4};
    unsigned              d = pi->depth;
    if (pi->ct > 6 || !channels[pi->ct] || !(d == 1 || d == 2 || d == 4 || d == 8 || d == 16))
        return 0;
    if ((pi->ct == 3 && d == 16) || (pi->ct != 0 && pi->ct != 3 && d < 8))
        return 0;
    return d * channels[pi->ct];
}

static const char *png_header(const unsigned char *p, size_t n, png_info_t *pi) {
    size_t pos = 8;
    bool   ihdr = false;
    bool   mode_p = false; /* PngStream.im_mode == "P" */
    while (n - pos >= 8 && memcmp(p + pos + 4, "IDAT", 4) != 0) {
        uint32_t             len = be32(p + pos);
        const unsigned char *d = p + pos + 8;
        if ((size_t)len > n - pos - 8 || n - pos - 8 - len < 4)
            return OS_ERROR; /* not reached: the probe read these */
        if (memcmp(p + pos + 4, "IHDR", 4) == 0 && len >= 13) {
            ihdr = true;
            pi->w = be32(d);
            pi->h = be32(d + 4);
            pi->depth = d[8];
            pi->ct = d[9];
            pi->interlaced = d[12] != 0; /* d[10], the compression method, is ignored */
            /* chunk_IHDR sets the mode only for a pair _MODES knows */
            if (png_bits(pi))
                mode_p = pi->ct == 3;
            /* chunk_IHDR: another filter method is a SyntaxError while
             * opening, which Image.open reports as unidentified. */
            if (d[11] != 0)
                return UNIDENTIFIED;
        } else if (memcmp(p + pos + 4, "PLTE", 4) == 0 && mode_p) {
            memset(pi->pal, 0, sizeof pi->pal);
            for (uint32_t i = 0; i < len / 3 && i < 256; i++)
                memcpy(pi->pal[i], d + 3 * i, 3);
        }
        pos += 12 + (size_t)len;
    }
    pi->idat = pos;
    return ihdr ? NULL : UNIDENTIFIED;
}

/* PngImageFile.verify(): from the first IDAT, every chunk whole with its CRC
 * (IEND's is not read), up to IEND. A header cut before its length is
 * struct.error -> "truncated PNG file" (OSError); a cut name or a bad one,
 * a cut or wrong CRC are SyntaxError; data cut short is _safe_read's
 * OSError. Returns NULL or the message. */
static const char *png_verify(const unsigned char *p, size_t n, size_t pos) {
    for (;;) {
        if (n - pos < 4)
            return OS_ERROR;
        if (n - pos < 8 || !png_cid(p + pos + 4))
            return SYNTAX_ERROR;
        uint32_t             len = be32(p + pos);
        const unsigned char *cid = p + pos + 4;
        if (memcmp(cid, "IEND", 4) == 0)
            return NULL;
        pos += 8;
        if ((size_t)len > n - pos)
            return OS_ERROR;
        if (n - pos - len < 4 ||
            (uint32_t)crc32(crc32(0L, cid, 4), cid + 4, (uInt)len) != be32(p + pos + len))
            return SYNTAX_ERROR;
        pos += (size_t)len + 4;
    }
}

/* Pillow's ImagingZipDecode for PNG, its state kept across IDAT blocks. */
typedef struct png_dec {
    const png_info_t *pi;
    z_stream          z;
    unsigned          bits;  /* bits per pixel */
    size_t            bytes; /* bytes of a full row */
    uint8_t          *buf;   /* filter byte + row */
    uint8_t          *prev;  /* the row above, filter byte + row */
    size_t            last;  /* bytes of buf already inflated */
    int               pass;  /* Adam7 pass, when interlaced */
    uint32_t          y;     /* next row (of the pass) */
    uint8_t          *px;    /* the RGB image */
    bool              done;
} png_dec_t;

static const int ADAM7_OFFSET[7] = {7, 3, 3, 1, 1, 0, 0};
static const int ADAM7_COL[7] = {0, 4, 0, 2, 0, 1, 0};
static const int ADAM7_ROW[7] = {0, 0, 4, 0, 2, 0, 1};
static const int ADAM7_DX[7] = {8, 8, 4, 4, 2, 2, 1};
static const int ADAM7_DY[7] = {8, 8, 8, 4, 4, 2, 2};

/* Pixels in a row of the current pass, and that row's bytes. */
static size_t png_cols(const png_dec_t *d) {
    if (!d->pi->interlaced)
        return d->pi->w;
    return ((size_t)d->pi->w + (size_t)ADAM7_OFFSET[d->pass]) / (size_t)ADAM7_DX[d->pass];
}

static size_t png_row_len(const png_dec_t *d) {
    return d->pi->interlaced ? (png_cols(d) * d->bits + 7) / 8 : d->bytes;
}

/* Pixel x of an unfiltered row as RGB, the way Pillow's unpacker and
 * convert("RGB") see it. */
static void png_pixel(const png_dec_t *d, const uint8_t *row, size_t x, uint8_t *o) {
    const png_info_t *pi = d->pi;
    unsigned          depth = pi->depth;
    if (depth < 8) {
        size_t   bit = x * depth;
        unsigned v = (row[bit / 8] >> (8 - depth - bit % 8)) & ((1u << depth) - 1);
        if (pi->ct == 3) {
            memcpy(o, pi->pal[v], 3);
            return;
        }
        /* "1" is 0 or 255, "L;2" and "L;4" scale by 0x55 and 0x11. */
        uint8_t g = (uint8_t)(depth == 1 ? v * 255 : depth == 2 ? v * 0x55 : v * 0x11);
        o[0] = o[1] = o[2] = g;
        return;
    }
    const uint8_t *s = row + x * (d->bits / 8);
    switch (pi->ct) {
    case 0:
        if (depth == 8)
            o[0] = o[1] = o[2] = s[0];
        else /* I;16 -> RGB clips at 255 */
            o[0] = o[1] = o[2] = s[0] ? 255 : s[1];
        return;
    case 3:
        memcpy(o, pi->pal[s[0]], 3);
        return;
    case 4:
        o[0] = o[1] = o[2] = s[0]; /* L, or the high byte of L;16 */
        return;
    default: /* 2, 6: R, G, B or their high bytes */
        if (depth == 8) {
            memcpy(o, s, 3);
        } else {
            o[0] = s[0];
            o[1] = s[2];
            o[2] = s[4];
        }
        return;
    }
}

/* A row's cols pixels to RGB at o, o + 3 dx, ...: the common 8-bit
 * layouts directly, the rest through png_pixel. */
static void png_row_out(const png_dec_t *d, const uint8_t *row, size_t cols, uint8_t *o,
                        size_t dx) {
    const png_info_t *pi = d->pi;
    size_t            step = 3 * dx;
    if (pi->depth != 8 || pi->ct == 4) {
        for (size_t x = 0; x < cols; x++, o += step)
            png_pixel(d, row, x, o);
    } else if (pi->ct == 2 && dx == 1) {
        memcpy(o, row, cols * 3);
    } else if (pi->ct == 2 || pi->ct == 6) {
        size_t in = pi->ct == 2 ? 3 : 4;
        for (size_t x = 0; x < cols; x++, o += step, row += in)
            memcpy(o, row, 3);
    } else if (pi->ct == 0) {
        for (size_t x = 0; x < cols; x++, o += step)
            o[0] = o[1] = o[2] = row[x];
    } else {
        for (size_t x = 0; x < cols; x++, o += step)
            memcpy(o, pi->pal[row[x]], 3);
    }
}

static uint8_t paeth(int a, int b, int c) {
    int pa = abs(b - c), pb = abs(a - c), pc = abs(a + b - 2 * c);
    return (uint8_t)(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

/* The predictor on buf[1..len]; false for an unknown filter type. */
static bool png_unfilter(png_dec_t *d, size_t len) {
    uint8_t       *b = d->buf;
    const uint8_t *p = d->prev;
    size_t         bpp = (d->bits + 7) / 8;
    size_t         i;
    switch (b[0]) {
    case 0:
        return true;
    case 1:
        for (i = bpp + 1; i <= len; i++)
            b[i] = (uint8_t)(b[i] + b[i - bpp]);
        return true;
    case 2:
        for (i = 1; i <= len; i++)
            b[i] = (uint8_t)(b[i] + p[i]);
        return true;
    case 3:
        for (i = 1; i <= bpp && i <= len; i++)
            b[i] = (uint8_t)(b[i] + p[i] / 2);
        for (; i <= len; i++)
            b[i] = (uint8_t)(b[i] + (b[i - bpp] + p[i]) / 2);
        return true;
    case 4:
        for (i = 1; i <= bpp && i <= len; i++)
            b[i] = (uint8_t)(b[i] + p[i]);
        for (; i <= len; i++)
            b[i] = (uint8_t)(b[i] + paeth(b[i - bpp], p[i], p[i - bpp]));
        return true;
    default:
        return false;
    }
}

/* One block of IDAT data through Pillow's loop, statement for statement:
 * rows are taken whole; the image ends at its last row, or when the zlib
 * stream ends on a row boundary. Returns NULL, or the error. */
static const char *png_feed(png_dec_t *d, const uint8_t *in, size_t n) {
    const png_info_t *pi = d->pi;
    size_t            row_len = png_row_len(d);
    d->z.next_in = (Bytef *)(uintptr_t)in;
    d->z.avail_in = (uInt)n;
    while (d->z.avail_in > 0) {
        d->z.next_out = d->buf + d->last;
        d->z.avail_out = (uInt)(row_len + 1 - d->last);
        int zerr = inflate(&d->z, Z_NO_FLUSH);
        if (zerr < 0)
            return OS_ERROR;
        size_t got = row_len + 1 - d->z.avail_out;
        if (got < row_len + 1) {
            d->last = got;
            break;
        }
        if (!png_unfilter(d, row_len))
            return OS_ERROR;
        uint8_t *orow = d->px + (size_t)d->y * pi->w * 3;
        if (pi->interlaced) {
            png_row_out(d, d->buf + 1, png_cols(d), orow + (size_t)ADAM7_COL[d->pass] * 3,
                        (size_t)ADAM7_DX[d->pass]);
            d->y += (uint32_t)ADAM7_DY[d->pass];
            while (d->y >= pi->h || row_len == 0) {
                if (++d->pass == 7) {
                    d->y = pi->h;
                    break;
                }
                d->y = (uint32_t)ADAM7_ROW[d->pass];
                row_len = png_row_len(d);
                memset(d->buf, 0, d->bytes + 1); /* a pass's first row has black above */
            }
        } else {
            png_row_out(d, d->buf + 1, pi->w, orow, 1);
            d->y++;
        }
        d->last = 0;
        if (d->y >= pi->h || zerr == Z_STREAM_END) {
            d->done = true;
            return NULL;
        }
        uint8_t *t = d->buf;
        d->buf = d->prev;
        d->prev = t;
    }
    return NULL;
}

/* PngImageFile.load_read: the data of IDAT (or fdAT, less its sequence
 * number, or DDAT) chunks that follow each other, in blocks of at most
 * ImageFile's 65,536 bytes. Running out before the last row is Pillow's
 * "image file is truncated" OSError. */
static const char *png_inflate(png_dec_t *d, const unsigned char *p, size_t n, size_t pos) {
    for (;;) {
        if (n - pos < 8)
            return OS_ERROR;
        uint32_t             len = be32(p + pos);
        const unsigned char *cid = p + pos + 4;
        size_t               skip = 0;
        if (memcmp(cid, "fdAT", 4) == 0)
            skip = 4;
        else if (memcmp(cid, "IDAT", 4) != 0 && memcmp(cid, "DDAT", 4) != 0)
            return OS_ERROR;
        if ((size_t)len > n - pos - 8 || len < skip)
            return OS_ERROR; /* verify() saw every chunk whole: not reached */
        const unsigned char *data = cid + 4 + skip;
        size_t               left = len - skip;
        while (left > 0) {
            size_t      blk = left < 65536 ? left : 65536;
            const char *bad = png_feed(d, data, blk);
            if (bad)
                return bad;
            if (d->done)
                return NULL;
            data += blk;
            left -= blk;
        }
        pos += 12 + (size_t)len;
    }
}

static svc_err_t png_decode(const sch_image_t *img, eng_rgb_t *out, char *errstr,
                            size_t errstr_size) {
    png_info_t *pi = calloc(1, sizeof *pi);
    if (!pi)
        return no_memory(errstr, errstr_size);
    png_dec_t   d = {.pi = pi};
    bool        z_open = false;
    svc_err_t   err = SVC_OK;
    const char *bad = png_header(img->bytes, img->len, pi);
    if (!bad)
        bad = png_verify(img->bytes, img->len, pi->idat);
    d.bits = png_bits(pi);
    if (!bad && (pi->w != img->width || pi->h != img->height || d.bits == 0))
        bad = OS_ERROR;
    if (bad) {
        err = fail(errstr, errstr_size, bad);
        goto done;
    }
    d.bytes = ((size_t)pi->w * d.bits + 7) / 8;
    d.buf = calloc(1, d.bytes + 1);
    d.prev = calloc(1, d.bytes + 1);
    d.px = malloc((size_t)pi->w * pi->h * 3);
    if (!d.buf || !d.prev || !d.px || inflateInit(&d.z) != Z_OK) {
        err = no_memory(errstr, errstr_size);
        goto done;
    }
    z_open = true;
    /* Pillow's image starts as zeros: black, or palette entry 0. */
    if (pi->ct == 3)
        for (size_t i = 0; i < (size_t)pi->w * pi->h; i++)
            memcpy(d.px + 3 * i, pi->pal[0], 3);
    else
        memset(d.px, 0, (size_t)pi->w * pi->h * 3);
    bad = png_inflate(&d, img->bytes, img->len, pi->idat);
    if (bad) {
        err = fail(errstr, errstr_size, bad);
        goto done;
    }
    out->w = pi->w;
    out->h = pi->h;
    out->px = d.px;
    d.px = NULL;
done:
    if (z_open)
        inflateEnd(&d.z);
    free(d.buf);
    free(d.prev);
    free(d.px);
    free(pi);
    return err;
}

/* ---- JPEG --------------------------------------------------------------- */

/* Progressive scans beyond this are refused: each costs a pass over the
 * image, and 8 MB of empty scans would stall a worker. Pillow has no limit;
 * encoders write about 10. */
#define JPEG_MAX_SCANS 1000

typedef struct jpeg_ctx {
    struct jpeg_error_mgr         pub;
    struct jpeg_source_mgr        src;
    struct jpeg_progress_mgr      progress;
    jmp_buf                       jmp;
    struct jpeg_decompress_struct cinfo;
    uint8_t                      *px, *line;
} jpeg_ctx_t;

static void jpeg_error_cb(j_common_ptr cinfo) {
    jpeg_ctx_t *c = (jpeg_ctx_t *)cinfo->client_data;
    longjmp(c->jmp, 1);
}

/* Warnings are ignored, as Pillow's decoder ignores them. */
static void jpeg_output_cb(j_common_ptr cinfo) {
    (void)cinfo;
}

static void jpeg_src_nop(j_decompress_ptr cinfo) {
    (void)cinfo;
}

/* All the data is in the buffer: asking for more suspends, as Pillow's
 * source does when its file has nothing left. */
static boolean jpeg_src_fill(j_decompress_ptr cinfo) {
    (void)cinfo;
    return FALSE;
}

static void jpeg_src_skip(j_decompress_ptr cinfo, long n) {
    struct jpeg_source_mgr *s = cinfo->src;
    if (n <= 0)
        return;
    if ((size_t)n > s->bytes_in_buffer) {
        s->next_input_byte += s->bytes_in_buffer;
        s->bytes_in_buffer = 0;
    } else {
        s->next_input_byte += n;
        s->bytes_in_buffer -= (size_t)n;
    }
}

static void jpeg_progress_cb(j_common_ptr cinfo) {
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > JPEG_MAX_SCANS)
        jpeg_error_cb(cinfo);
}

/* Pillow's cmyk2rgb on the inverted ("CMYK;I") samples: with c = 255 - raw
 * and nk = 255 - k, each channel is nk - c * nk / 255 (MULDIV255). */
static uint8_t cmyk_channel(uint8_t raw, uint8_t nk) {
    int tmp = (255 - raw) * nk + 128;
    int v = nk - (((tmp >> 8) + tmp) >> 8);
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Everything changed after setjmp lives in *c (heap), so nothing is
 * indeterminate after libjpeg's longjmp. */
static svc_err_t jpeg_decode(const sch_image_t *img, eng_rgb_t *out, char *errstr,
                             size_t errstr_size) {
    jpeg_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return no_memory(errstr, errstr_size);
    const uint32_t                 w = img->width, h = img->height;
    struct jpeg_decompress_struct *ci = &c->cinfo;
    svc_err_t                      err = SVC_OK;
    ci->err = jpeg_std_error(&c->pub);
    c->pub.error_exit = jpeg_error_cb;
    c->pub.output_message = jpeg_output_cb;
    ci->client_data = c;
    if (setjmp(c->jmp)) {
        err = fail(errstr, errstr_size, OS_ERROR);
        goto done;
    }
    jpeg_create_decompress(ci);
    /* Bounds libjpeg's arrays (a progressive image's coefficients: at most
     * 16e6 pixels x 4 components x 2 bytes, sampling padding aside). */
    ci->mem->max_memory_to_use = 512L << 20;
    c->src.next_input_byte = img->bytes;
    c->src.bytes_in_buffer = img->len;
    c->src.init_source = jpeg_src_nop;
    c->src.fill_input_buffer = jpeg_src_fill;
    c->src.skip_input_data = jpeg_src_skip;
    c->src.resync_to_restart = jpeg_resync_to_restart;
    c->src.term_source = jpeg_src_nop;
    ci->src = &c->src;
    c->progress.progress_monitor = jpeg_progress_cb;
    ci->progress = &c->progress;
    int r;
    do /* Pillow's loop: a tables-only datastream may come first */
        r = jpeg_read_header(ci, FALSE);
    while (r == JPEG_HEADER_TABLES_ONLY);
    if (r != JPEG_HEADER_OK || ci->image_width != w || ci->image_height != h) {
        err = fail(errstr, errstr_size, OS_ERROR);
        goto done;
    }
    /* Pillow's mode follows the component count: L, RGB or CMYK. */
    int comps = ci->num_components;
    if (comps == 1)
        ci->out_color_space = JCS_GRAYSCALE;
    else if (comps == 3)
        ci->out_color_space = JCS_RGB;
    else if (comps == 4)
        ci->out_color_space = JCS_CMYK;
    else {
        err = fail(errstr, errstr_size, UNIDENTIFIED);
        goto done;
    }
    if (!jpeg_start_decompress(ci) || ci->output_width != w || ci->output_height != h ||
        ci->output_components != comps) {
        err = fail(errstr, errstr_size, OS_ERROR);
        goto done;
    }
    c->px = malloc((size_t)w * h * 3);
    c->line = comps == 3 ? NULL : malloc((size_t)w * (size_t)comps);
    if (!c->px || (comps != 3 && !c->line)) {
        err = no_memory(errstr, errstr_size);
        goto done;
    }
    while (ci->output_scanline < h) {
        uint8_t *dst = c->px + (size_t)ci->output_scanline * w * 3;
        JSAMPROW row = comps == 3 ? dst : c->line;
        if (jpeg_read_scanlines(ci, &row, 1) != 1) {
            err = fail(errstr, errstr_size, OS_ERROR); /* suspended: truncated */
            goto done;
        }
        if (comps == 1) {
            for (uint32_t x = 0; x < w; x++)
                dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = c->line[x];
        } else if (comps == 4) {
            for (uint32_t x = 0; x < w; x++) {
                const uint8_t *s = c->line + 4 * (size_t)x;
                dst[3 * x] = cmyk_channel(s[0], s[3]); /* nk = 255 - (255 - k) */
                dst[3 * x + 1] = cmyk_channel(s[1], s[3]);
                dst[3 * x + 2] = cmyk_channel(s[2], s[3]);
            }
        }
    }
    /* Pillow ignores a finish that suspends once every line is out, but
     * not an error in the markers after the scans. */
    (void)jpeg_finish_decompress(ci);
    out->w = w;
    out->h = h;
    out->px = c->px;
    c->px = NULL;
done:
    jpeg_destroy_decompress(ci);
    free(c->line);
    free(c->px);
    free(c);
    return err;
}

/* ---- WebP --------------------------------------------------------------- */

static svc_err_t webp_decode(const sch_image_t *img, eng_rgb_t *out, char *errstr,
                             size_t errstr_size) {
    WebPData       data = {img->bytes, img->len};
    WebPDemuxer   *dmux = WebPDemux(&data);
    WebPIterator   it;
    bool           have_it = false;
    uint8_t       *px = NULL;
    svc_err_t      err = SVC_OK;
    const uint32_t w = img->width, h = img->height;
    if (!dmux || WebPDemuxGetI(dmux, WEBP_FF_CANVAS_WIDTH) != w ||
        WebPDemuxGetI(dmux, WEBP_FF_CANVAS_HEIGHT) != h ||
        !(have_it = WebPDemuxGetFrame(dmux, 1, &it)) || it.x_offset < 0 || it.y_offset < 0 ||
        it.width <= 0 || it.height <= 0 || (uint32_t)it.x_offset + (uint32_t)it.width > w ||
        (uint32_t)it.y_offset + (uint32_t)it.height > h) {
        err = fail(errstr, errstr_size, OS_ERROR);
        goto done;
    }
    /* The anim decoder's first frame is a key frame: a zeroed canvas, the
     * frame decoded into its rectangle, no blending. */
    px = calloc((size_t)w * h, 3);
    if (!px) {
        err = no_memory(errstr, errstr_size);
        goto done;
    }
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg) ||
        WebPGetFeatures(it.fragment.bytes, it.fragment.size, &cfg.input) != VP8_STATUS_OK ||
        cfg.input.width != it.width || cfg.input.height != it.height) {
        err = fail(errstr, errstr_size, OS_ERROR);
        goto done;
    }
    size_t stride = (size_t)w * 3;
    cfg.output.colorspace = MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = px + (size_t)it.y_offset * stride + (size_t)it.x_offset * 3;
    cfg.output.u.RGBA.stride = (int)stride;
    cfg.output.u.RGBA.size = stride * (size_t)(it.height - 1) + (size_t)it.width * 3;
    if (WebPDecode(it.fragment.bytes, it.fragment.size, &cfg) != VP8_STATUS_OK) {
        err = fail(errstr, errstr_size, OS_ERROR);
        goto done;
    }
    WebPFreeDecBuffer(&cfg.output);
    out->w = w;
    out->h = h;
    out->px = px;
    px = NULL;
done:
    if (have_it)
        WebPDemuxReleaseIterator(&it);
    WebPDemuxDelete(dmux);
    free(px);
    return err;
}

svc_err_t eng_image_decode(const sch_image_t *img, eng_rgb_t *out, char *errstr,
                           size_t errstr_size) {
    if (!img->bytes || !img->format || img->width == 0 || img->height == 0)
        return fail(errstr, errstr_size, UNIDENTIFIED);
    if ((uint64_t)img->width * img->height > ENG_IMG_MAX_SOURCE_PX)
        return fail(errstr, errstr_size, "each image must have at most 16,000,000 pixels");
    if (strcmp(img->format, "png") == 0)
        return img->len >= 8 ? png_decode(img, out, errstr, errstr_size)
                             : fail(errstr, errstr_size, OS_ERROR);
    if (strcmp(img->format, "jpeg") == 0)
        return jpeg_decode(img, out, errstr, errstr_size);
    if (strcmp(img->format, "webp") == 0)
        return webp_decode(img, out, errstr, errstr_size);
    return fail(errstr, errstr_size, "images must be PNG, JPEG or WebP");
}
