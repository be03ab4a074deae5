/*
 * sch_image_other.c -- the image formats PIL opens that the contract
 * refuses by name (SPEC a.10: `images must be PNG, JPEG or WebP`).
 *
 * Upstream calls Image.open before it looks at the format, so what it
 * answers for such bytes is what Image.open does: it tries each plugin
 * whose prefix test accepts them, in its registration order; a plugin's
 * SyntaxError (and the IndexError, struct.error, EOFError and KeyError it
 * turns into one) moves on to the next, anything else ends the search, and
 * an opened image past twice MAX_IMAGE_PIXELS is a DecompressionBombError.
 * Each probe below is that plugin's _open, as far as it decides between
 * those outcomes, for the formats a client is likely to send: BMP, DIB,
 * GIF, PPM/PGM/PBM/PFM, AVIF (sch_image_avif.c), CUR, JPEG 2000, ICO,
 * TIFF, QOI and TGA (Pillow 13, compared with it by cutting and mutating
 * files of each format). Not
 * reproduced: TIFF's pixel-mode table, the pixel data ICO decodes while
 * opening, a JPEG 2000 palette of more than 256 colours (three ValueErrors
 * or OSErrors upstream; here the format is named); formats a client is not
 * likely to send (PSD, DDS, ICNS, EPS, XBM, SGI, ...) stay unidentified.
 *
 * Where upstream's plugin raises a ValueError that the runtime does not
 * catch (a 500 there), the probe returns that error's text, as
 * sch_image.c's "Truncated IHDR chunk" does.
 */
#include <math.h>

#include "sch_int.h"

/* A plugin that does not take the bytes: Image.open tries the next. */
static const char NEXT[] = "invalid image data (UnidentifiedImageError)";

#define OS_ERROR "invalid image data (OSError)"
#define BOMB     "invalid image data (DecompressionBombError)"
#define BIG63    (UINT64_C(1) << 63)

static uint32_t le16(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t le32(const unsigned char *p) {
    return le16(p) | (uint32_t)le16(p + 2) << 16;
}

static uint32_t be16(const unsigned char *p) {
    return (uint32_t)p[0] << 8 | p[1];
}

static uint32_t be32(const unsigned char *p) {
    return be16(p) << 16 | be16(p + 2);
}

static uint64_t be64(const unsigned char *p) {
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static uint64_t le64(const unsigned char *p) {
    return (uint64_t)le32(p + 4) << 32 | le32(p);
}

/* Bytes a read(k) at pos returns (pos may be past the end: a seek). */
static uint64_t take(uint64_t pos, size_t n, uint64_t k) {
    if (pos >= n)
        return 0;
    return k < n - pos ? k : n - pos;
}

static uint32_t clamp32(uint64_t v) {
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* ---- BMP, DIB (BmpImagePlugin) ------------------------------------------ */

static bool bmp_header_size(uint32_t hs) {
    return hs == 12 || hs == 40 || hs == 52 || hs == 56 || hs == 64 || hs == 108 || hs == 124;
}

/* The BITFIELDS masks _bitmap supports for the bit count. */
static bool bmp_masks_ok(uint32_t bits, const uint32_t m[4]) {
    static const uint32_t m32[8][4] = {
        {0xFF0000, 0xFF00, 0xFF, 0},          {0xFF000000, 0xFF0000, 0xFF00, 0},
        {0xFF000000, 0xFF00, 0xFF, 0},        {0xFF000000, 0xFF0000, 0xFF00, 0xFF},
        {0xFF, 0xFF00, 0xFF0000, 0xFF000000}, {0xFF0000, 0xFF00, 0xFF, 0xFF000000},
        {0xFF000000, 0xFF00, 0xFF, 0xFF0000}, {0, 0, 0, 0},
    };
    if (bits == 32) {
        for (size_t k = 0; k < 8; k++)
            if (memcmp(m, m32[k], sizeof m32[k]) == 0)
                return true;
        return false;
    }
    if (bits == 24)
        return m[0] == 0xFF0000 && m[1] == 0xFF00 && m[2] == 0xFF;
    return bits == 16 && ((m[0] == 0xF800 && m[1] == 0x7E0 && m[2] == 0x1F) ||
                          (m[0] == 0x7C00 && m[1] == 0x3E0 && m[2] == 0x1F));
}

/* BmpImageFile._bitmap with the header at pos: *w, *h as it sets the size
 * (a 40+-byte header's height is unsigned unless its top byte is 0xFF,
 * a top-down image: then 2**32 - height). Zero sizes are the caller's. */
static const char *bmp_info(const unsigned char *p, size_t n, uint64_t pos, uint32_t *w,
                            uint32_t *h) {
    if (take(pos, n, 4) < 4)
        return NEXT; /* i32(read(4)): struct.error */
    uint32_t             hs = le32(p + pos);
    const unsigned char *d = p + pos + 4;
    if (hs > 4 && hs - 4 > n - pos - 4)
        return OS_ERROR; /* _safe_read: "Truncated File Read" */
    uint32_t bits, comp = 0, colors = 0, m[4] = {0, 0, 0, 0};
    if (hs == 12) {
        *w = le16(d);
        *h = le16(d + 2);
        bits = le16(d + 6);
    } else if (bmp_header_size(hs)) {
        *w = le32(d);
        *h = d[7] == 0xFF ? 0u - le32(d + 4) : le32(d + 4);
        bits = le16(d + 10);
        comp = le32(d + 12);
        colors = le32(d + 28);
        if (comp == 3 && hs >= 52) {
            for (int i = 0; i < 3; i++)
                m[i] = le32(d + 36 + 4 * i);
            m[3] = hs >= 56 ? le32(d + 48) : 0;
        } else if (comp == 3) {
            /* a 40-byte header's three masks follow it */
            for (int i = 0; i < 3; i++) {
                if (take(pos + hs + 4u * (unsigned)i, n, 4) < 4)
                    return NEXT;
                m[i] = le32(p + pos + hs + 4u * (unsigned)i);
            }
        }
    } else {
        return OS_ERROR; /* "Unsupported BMP header type" */
    }
    if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32)
        return OS_ERROR; /* "Unsupported BMP pixel depth" */
    if (comp == 3 ? !bmp_masks_ok(bits, m) : comp > 2)
        return OS_ERROR; /* bitfields layout, compression */
    if (bits <= 8 && colors > 65536)
        return OS_ERROR; /* "Unsupported BMP Palette size"; 0 is 1 << bits */
    return NULL;
}

static const char *probe_bmp(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 14 || p[0] != 'B' || p[1] != 'M')
        return NEXT; /* i32(head_data, 10) needs all 14 */
    const char *e = bmp_info(p, n, 14, w, h);
    return e ? e : *w && *h ? NULL : NEXT;
}

static const char *probe_dib(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 4 || !bmp_header_size(le32(p)))
        return NEXT;
    const char *e = bmp_info(p, n, 0, w, h);
    return e ? e : *w && *h ? NULL : NEXT;
}

/* ---- GIF (GifImagePlugin) ----------------------------------------------- */

/* GifImageFile.data(): false for None (the end, or a zero length), else
 * the sub-block's bytes (*len, maybe fewer than its length says). */
static bool gif_data(const unsigned char *p, size_t n, size_t *pos, size_t *len) {
    if (*pos >= n)
        return false;
    size_t k = p[(*pos)++];
    if (!k)
        return false;
    *len = (size_t)take(*pos, n, k);
    *pos += *len;
    return true;
}

/* _open then _seek(0): the screen (its colour table), then blocks up to
 * the first image descriptor, which may grow the size (and is checked as a
 * bomb there); a file that ends first has no frame (EOFError). */
static const char *probe_gif(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 6 || (memcmp(p, "GIF87a", 6) != 0 && memcmp(p, "GIF89a", 6) != 0))
        return NEXT;
    if (n < 11 || ((p[10] & 128) && n < 12))
        return NEXT; /* the size, the flags, the background */
    uint64_t sw = le16(p + 6), sh = le16(p + 8);
    size_t   pos = n < 13 ? n : 13, len = 0;
    if (p[10] & 128)
        pos += (size_t)take(pos, n, (size_t)3 << ((p[10] & 7) + 1));
    for (;;) {
        if (pos >= n || p[pos] == ';')
            return NEXT; /* "image not found in GIF frame" */
        unsigned c = p[pos++];
        if (c == '!') {
            if (pos >= n)
                return NEXT; /* s[0] of an empty read */
            unsigned label = p[pos++];
            bool     block = gif_data(p, n, &pos, &len);
            if (label == 254) { /* a comment: its sub-blocks, then the next byte */
                for (bool more = block && len; more;)
                    more = gif_data(p, n, &pos, &len) && len;
                continue;
            }
            /* graphic control: flags, the transparency index if flagged,
             * the duration */
            if (label == 249 && block && (len < 3 || ((p[pos - len] & 1) && len < 4)))
                return NEXT;
            if (label == 255 && block && len >= 11 && memcmp(p + pos - len, "NETSCAPE2.0", 11) == 0)
                (void)gif_data(p, n, &pos, &len); /* the loop count, whatever it is */
            while (gif_data(p, n, &pos, &len) && len)
                ;
        } else if (c == ',') {
            if (take(pos, n, 9) < 8)
                return NEXT;
            uint64_t x1 = (uint64_t)le16(p + pos) + le16(p + pos + 4);
            uint64_t y1 = (uint64_t)le16(p + pos + 2) + le16(p + pos + 6);
            if (x1 > sw || y1 > sh) {
                sw = x1 > sw ? x1 : sw;
                sh = y1 > sh ? y1 : sh;
                if (sw * sh > SCH_IMAGE_BOMB_PIXELS)
                    return BOMB;
            }
            if (n - pos < 9)
                return NEXT;
            unsigned flags = p[pos + 8];
            pos += 9;
            if (flags & 128)
                pos += (size_t)take(pos, n, (size_t)3 << ((flags & 7) + 1));
            if (pos >= n)
                return NEXT; /* the LZW code size */
            break;
        }
        /* any other byte is skipped */
    }
    if (!sw || !sh)
        return NEXT;
    *w = (uint32_t)sw;
    *h = (uint32_t)sh;
    return NULL;
}

/* ---- PPM, PGM, PBM, PFM (PpmImagePlugin) -------------------------------- */

static bool ppm_space(unsigned c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* _read_token into tok[11]: *len 0 when the data ends first, 11 when the
 * token is too long. A '#' comment runs to CR, LF or the end. */
static size_t ppm_token(const unsigned char *p, size_t n, size_t *pos, unsigned char tok[11]) {
    size_t len = 0;
    while (len <= 10 && *pos < n) {
        unsigned c = p[(*pos)++];
        if (ppm_space(c)) {
            if (len)
                break;
        } else if (c == '#') {
            while (*pos < n && p[*pos] != '\r' && p[*pos] != '\n')
                (*pos)++;
            *pos += *pos < n;
        } else {
            tok[len++] = (unsigned char)c;
        }
    }
    return len;
}

/* Python's int(bytes): a sign, then digits with single underscores
 * between them. */
static bool py_int(const unsigned char *t, size_t len, int64_t *v) {
    size_t   i = 0;
    bool     neg = len && t[0] == '-';
    uint64_t x = 0;
    i += len && (t[0] == '-' || t[0] == '+');
    if (i >= len || t[i] < '0' || t[i] > '9')
        return false;
    for (; i < len; i++) {
        if (t[i] == '_' && i + 1 < len && t[i + 1] >= '0' && t[i + 1] <= '9')
            continue;
        if (t[i] < '0' || t[i] > '9')
            return false;
        x = x * 10 + (t[i] - '0'); /* at most 11 characters */
    }
    *v = neg ? -(int64_t)x : (int64_t)x;
    return true;
}

/* Python's float(bytes), near enough: what strtod reads whole, less its
 * hexadecimal and nan(...) forms. */
static bool py_float(const unsigned char *t, size_t len, double *v) {
    char s[12], *end;
    memcpy(s, t, len);
    s[len] = '\0';
    if (!len || strpbrk(s, "xX(") != NULL)
        return false;
    *v = strtod(s, &end);
    return *end == '\0';
}

static const char *ppm_number(const unsigned char *p, size_t n, size_t *pos, int64_t *v) {
    unsigned char tok[11];
    size_t        len = ppm_token(p, n, pos, tok);
    if (!len)
        return "Reached EOF while reading header";
    if (len > 10)
        return "Token too long in file header";
    return py_int(tok, len, v) ? NULL : "invalid literal for int() with base 10";
}

static const char *probe_ppm(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    static const char *const magics[] = {
        "P1", "P2",  "P3",     "P4",     "P5",    "P6",
        "Pf", "PyP", "P0CMYK", "PyRGBA", "PyCMYK"}; /* modes 1 L RGB 1 L RGB F P ... */
    if (n < 2 || p[0] != 'P' || !p[1] || !strchr("0123456fy", p[1]))
        return NEXT;
    size_t pos = 0, ml = 0;
    char   magic[6];
    while (ml < 6 && pos < n && !ppm_space(p[pos]))
        magic[ml++] = (char)p[pos++];
    pos += ml < 6 && pos < n; /* the whitespace that ended it */
    size_t k = 0;
    while (k < sizeof magics / sizeof magics[0] &&
           (strlen(magics[k]) != ml || memcmp(magic, magics[k], ml) != 0))
        k++; /* by length: a NUL byte is part of a magic */
    if (k == sizeof magics / sizeof magics[0])
        return NEXT; /* "not a PPM file" */
    int64_t     sw, sh, maxval;
    const char *e;
    if ((e = ppm_number(p, n, &pos, &sw)) || (e = ppm_number(p, n, &pos, &sh)))
        return e;
    if (k == 6) { /* Pf: the scale */
        unsigned char tok[11];
        size_t        len = ppm_token(p, n, &pos, tok);
        double        scale;
        if (!len)
            return "Reached EOF while reading header";
        if (len > 10)
            return "Token too long in file header";
        if (!py_float(tok, len, &scale))
            return "could not convert string to float";
        if (scale == 0.0 || !isfinite(scale))
            return "scale must be finite and non-zero";
    } else if (k != 0 && k != 3) { /* all but the bitmaps: maxval */
        if ((e = ppm_number(p, n, &pos, &maxval)))
            return e;
        if (maxval <= 0 || maxval >= 65536)
            return "maxval must be greater than 0 and less than 65536";
    }
    if (sw <= 0 || sh <= 0)
        return NEXT;
    *w = clamp32((uint64_t)sw);
    *h = clamp32((uint64_t)sh);
    return NULL;
}

/* ---- CUR, ICO (CurImagePlugin, IcoImagePlugin) -------------------------- */

/* CurImageFile._open: the largest of the directory's cursors (an entry
 * wider and taller than the one kept so far), a BMP header at its offset
 * (or, for offset 0, where the directory ends), half its height. */
static const char *probe_cur(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 6 || memcmp(p, "\0\0\2\0", 4) != 0)
        return NEXT;
    size_t               count = le16(p + 4), pos = 6, mlen = 0;
    const unsigned char *m = NULL;
    for (size_t i = 0; i < count; i++) {
        const unsigned char *s = p + pos;
        size_t               slen = (size_t)take(pos, n, 16);
        pos += slen;
        if (!mlen) {
            m = s;
            mlen = slen;
        } else if (!slen || (s[0] > m[0] && (slen < 2 || mlen < 2))) {
            return NEXT; /* s[0], s[1] or m[1] of a short read */
        } else if (s[0] > m[0] && s[1] > m[1]) {
            m = s;
            mlen = slen;
        }
    }
    if (mlen < 16)
        return NEXT; /* no cursor, or i32(m, 12) */
    uint32_t    at = le32(m + 12), bh;
    const char *e = bmp_info(p, n, at ? at : pos, w, &bh);
    if (e)
        return e;
    *h = bh / 2;
    return *w && *h ? NULL : NEXT;
}

/* IconHeader.color_depth: bpp, else ceil(log2(colours)) when nonzero,
 * else 256. */
static double ico_depth(const unsigned char *e) {
    if (le16(e + 6))
        return le16(e + 6);
    double d = e[2] ? ceil(log(e[2]) / log(2)) : 0.0;
    return d != 0.0 ? d : 256.0;
}

/* IcoImageFile._open: the directory, the entry IcoFile sorts first (the
 * largest, then the least colour depth), and that entry's image opened as
 * a PNG or as a DIB (its height halved: the AND mask). The size is that
 * image's. */
static const char *probe_ico(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (n < 6 || memcmp(p, "\0\0\1\0", 4) != 0)
        return NEXT;
    size_t count = le16(p + 4);
    if (!count || (n - 6) / 16 < count)
        return NEXT; /* entry[0] of none; a short entry */
    const unsigned char *best = NULL;
    uint32_t             best_sq = 0;
    double               best_depth = 0.0;
    for (size_t i = 0; i < count; i++) {
        const unsigned char *e = p + 6 + 16 * i;
        uint32_t             sq = (e[0] ? e[0] : 256u) * (e[1] ? e[1] : 256u);
        double               d = ico_depth(e);
        if (!best || sq > best_sq || (sq == best_sq && d < best_depth)) {
            best = e;
            best_sq = sq;
            best_depth = d;
        }
    }
    uint32_t at = le32(best + 12);
    if (take(at, n, 8) == 8 && memcmp(p + at, png_sig, 8) == 0) {
        const char *e = sch_image_probe_png(p + at, n - at, w, h);
        return e ? e : *w && *h ? NULL : NEXT;
    }
    uint32_t    dh;
    const char *e = bmp_info(p, n, at, w, &dh);
    if (e)
        return e;
    if (!*w || !dh)
        return NEXT;
    if ((uint64_t)*w * dh > SCH_IMAGE_BOMB_PIXELS)
        return BOMB; /* checked before the height is halved */
    *h = dh / 2;
    return *h ? NULL : NEXT;
}

/* ---- JPEG 2000 (Jpeg2KImagePlugin) -------------------------------------- */

/* _parse_codestream from pos (past the SOC and SIZ markers), then
 * _parse_comment over the markers after it. *cw, *ch: the image area. */
static const char *j2k_stream(const unsigned char *p, size_t n, uint64_t pos, int64_t *cw,
                              int64_t *ch) {
    if (take(pos, n, 2) < 2)
        return NEXT;
    uint32_t lsiz = be16(p + pos);
    if (lsiz < 38)
        return "SIZ marker length must be at least 38";
    uint64_t             got = 2 + take(pos + 2, n, lsiz - 2);
    const unsigned char *s = p + pos;
    if (got < 38)
        return NEXT;
    uint32_t csiz = be16(s + 36);
    if ((csiz == 1 && got < 39) || csiz < 1 || csiz > 4)
        return NEXT; /* Ssiz cut short; "unable to determine J2K image mode" */
    *cw = (int64_t)be32(s + 4) - be32(s + 12);
    *ch = (int64_t)be32(s + 8) - be32(s + 16);
    for (pos += got;;) {
        uint64_t k = take(pos, n, 2);
        if (!k)
            return NULL;
        if (k < 2)
            return NEXT; /* marker[1] */
        unsigned typ = p[pos + 1];
        pos += 2;
        if (typ == 0x90 || typ == 0xD9)
            return NULL;
        if (take(pos, n, 2) < 2)
            return NEXT;
        uint32_t len = be16(p + pos);
        pos += 2;
        if (len < 2)
            return "Marker length too small";
        if (typ == 0x64)
            return NULL;
        pos += len - 2; /* a seek: past the end, the next read is empty */
    }
}

/* BoxReader over a whole box's contents (jp2h, res ): rem is
 * remaining_in_box, -1 before the first box. */
typedef struct j2_box {
    const unsigned char *d;
    uint64_t             len, pos;
    int64_t              rem;
} j2_box_t;

/* _read_bytes(k): false for its SyntaxError (past the box or the data). */
static bool j2_read(j2_box_t *b, uint64_t k, const unsigned char **out) {
    if (b->pos > b->len || k > b->len - b->pos || (b->rem >= 0 && k > (uint64_t)b->rem))
        return false;
    *out = b->d + b->pos;
    b->pos += k;
    if (b->rem > 0)
        b->rem -= (int64_t)k;
    return true;
}

static bool j2_more(const j2_box_t *b) {
    return (int64_t)b->pos + b->rem < (int64_t)b->len;
}

/* next_box_type: the type, or NULL for its SyntaxError. */
static const unsigned char *j2_next(j2_box_t *b) {
    const unsigned char *f;
    if (b->rem > 0)
        b->pos += (uint64_t)b->rem;
    b->rem = -1;
    if (!j2_read(b, 8, &f))
        return NULL;
    uint64_t lbox = be32(f), hlen = 8;
    if (lbox == 1) {
        const unsigned char *q;
        if (!j2_read(b, 8, &q))
            return NULL;
        lbox = be64(q);
        hlen = 16;
    }
    if (lbox < hlen || lbox - hlen > b->len - b->pos)
        return NULL; /* "Invalid header length" */
    b->rem = (int64_t)(lbox - hlen);
    return f + 4;
}

enum { J2_NONE, J2_L, J2_LA, J2_OTHER };

/* _parse_jp2_header's walk of the jp2h box: ihdr gives the size, and a
 * mode must come from ihdr or colr. */
static const char *jp2_header(const unsigned char *d, uint64_t len, uint32_t *w, uint32_t *h) {
    j2_box_t             b = {d, len, 0, -1};
    const unsigned char *f, *t;
    int                  mode = J2_NONE, nc = -1;
    char                 colr = 0;
    bool                 sized = false;
    while (j2_more(&b)) {
        if (!(t = j2_next(&b)))
            return NEXT;
        if (memcmp(t, "ihdr", 4) == 0) {
            if (!j2_read(&b, 11, &f))
                return NEXT;
            *h = be32(f);
            *w = be32(f + 4);
            nc = (int)be16(f + 8);
            sized = true;
            if (nc == 1) /* "I;16" past 8 bits: not a palette's base */
                mode = (f[10] & 0x7F) > 8 ? J2_OTHER : J2_L;
            else if (nc == 2)
                mode = J2_LA;
            else if (nc == 3 || nc == 4)
                mode = J2_OTHER;
        } else if (memcmp(t, "colr", 4) == 0) {
            if (!j2_read(&b, 7, &f))
                return NEXT;
            uint32_t cs = be32(f + 3);
            if (f[0] == 1 && (cs == 0 || cs == 15))
                colr = '1';
            else if (f[0] == 1 && cs == 12)
                colr = 'C', mode = nc == 4 ? J2_OTHER : mode;
            else if (f[0] == 1 && cs == 17)
                colr = 'L';
        } else if (memcmp(t, "pclr", 4) == 0 && (mode == J2_L || mode == J2_LA) && colr != '1' &&
                   colr != 'L') {
            if (!j2_read(&b, 3, &f))
                return NEXT;
            uint32_t ne = be16(f), npc = f[2], depth = 0;
            if (!j2_read(&b, npc, &f))
                return NEXT;
            for (uint32_t i = 0; i < npc; i++)
                depth = f[i] > depth ? f[i] : depth;
            if (depth <= 8) {
                for (uint32_t i = 0; i < ne; i++)
                    if (!j2_read(&b, npc, &f))
                        return NEXT;
                mode = J2_OTHER; /* P or PA */
            }
        } else if (memcmp(t, "res ", 4) == 0) {
            uint64_t k = (uint64_t)b.rem;
            if (!j2_read(&b, k, &f))
                return NEXT;
            j2_box_t r = {f, k, 0, -1};
            while (j2_more(&r)) {
                if (!(t = j2_next(&r)))
                    return NEXT;
                if (memcmp(t, "resc", 4) == 0) {
                    if (!j2_read(&r, 10, &f))
                        return NEXT;
                    break;
                }
            }
        }
    }
    return sized && mode != J2_NONE ? NULL : NEXT; /* "Malformed JP2 header" */
}

static const char *probe_jp2(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    static const unsigned char soc[4] = {0xFF, 0x4F, 0xFF, 0x51};
    static const unsigned char sig[12] = {0,   0,   0,    0x0C, 'j',  'P',
                                          ' ', ' ', '\r', '\n', 0x87, '\n'};
    static const unsigned char jp2c[8] = {'j', 'p', '2', 'c', 0xFF, 0x4F, 0xFF, 0x51};
    int64_t                    cw, ch;
    const char                *e;
    if (n >= 4 && memcmp(p, soc, 4) == 0) {
        if ((e = j2k_stream(p, n, 4, &cw, &ch)))
            return e;
        if (cw <= 0 || ch <= 0)
            return NEXT;
        *w = (uint32_t)cw;
        *h = (uint32_t)ch;
        return NULL;
    }
    if (n < 12 || memcmp(p, sig, 12) != 0)
        return NEXT;
    /* The top-level boxes up to jp2h, read from the file: a read cut short
     * there is an OSError, a box header that makes no sense a SyntaxError. */
    uint64_t pos = 12, rem = 0;
    for (;;) {
        if (rem >= BIG63 - pos)
            return NEXT; /* "Box length too large" */
        pos += rem;
        if (take(pos, n, 8) < 8)
            return OS_ERROR;
        uint64_t             lbox = be32(p + pos), hlen = 8;
        const unsigned char *t = p + pos + 4;
        pos += 8;
        if (lbox == 1) {
            if (take(pos, n, 8) < 8)
                return OS_ERROR;
            lbox = be64(p + pos);
            pos += 8;
            hlen = 16;
        }
        if (lbox < hlen)
            return NEXT;
        rem = lbox - hlen;
        if (memcmp(t, "jp2h", 4) == 0)
            break;
        if (memcmp(t, "ftyp", 4) == 0) {
            if (rem < 4)
                return NEXT;
            if (take(pos, n, 4) < 4)
                return OS_ERROR;
            pos += 4;
            rem -= 4;
        }
    }
    if (rem >= BIG63 - pos)
        return NEXT;
    if (take(pos, n, rem) < rem)
        return OS_ERROR;
    if ((e = jp2_header(p + pos, rem, w, h)))
        return e;
    pos += rem;
    uint64_t k = take(pos, n, 12); /* a jp2c box with a codestream next? */
    if (k >= 8 && memcmp(p + pos + k - 8, jp2c, 8) == 0 &&
        (e = j2k_stream(p, n, pos + k, &cw, &ch)))
        return e;
    return *w && *h ? NULL : NEXT;
}

/* ---- TIFF (TiffImagePlugin) --------------------------------------------- */

typedef struct tiff_tag {
    bool    set;
    bool    is_int; /* one value of an integer type */
    int64_t v;
} tiff_tag_t;

static uint32_t tiff_unit(uint32_t typ) {
    static const uint8_t unit[17] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8};
    return typ < 17 ? unit[typ] : 0;
}

static bool tiff_integer(uint32_t typ) {
    return typ == 1 || typ == 3 || typ == 4 || typ == 6 || typ == 8 || typ == 9 || typ == 13 ||
           typ == 16;
}

static int64_t tiff_int(const unsigned char *d, uint32_t typ, bool be) {
    switch (typ) {
    case 1:
        return d[0];
    case 6:
        return (int8_t)d[0];
    case 3:
        return be ? be16(d) : le16(d);
    case 8:
        return (int16_t)(be ? be16(d) : le16(d));
    case 9:
        return (int32_t)(be ? be32(d) : le32(d));
    case 16:
        return (int64_t)(be ? be64(d) : le64(d)); /* past 2**63: clamped by the caller */
    default:
        return be ? be32(d) : le32(d); /* LONG, IFD */
    }
}

/* TiffImageFile._open: the header and the first IFD, loaded as
 * ImageFileDirectory_v2.load does (an entry or its data cut short ends the
 * load with the tags read so far, data that would pass the file's size is
 * skipped), then _setup's refusals: a JPEG XR tag, an unknown
 * compression, no width or length, uncompressed data without strips or
 * tiles. Its pixel-mode table (OPEN_INFO) is not read: a file that has
 * the size but not a mode Pillow knows is named here, unidentified there. */
static const char *probe_tiff(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    static const char pre[6][4] = {"MM\0*", "II*\0", "MM*\0", "II\0*", "MM\0+", "II+\0"};
    size_t            k = 0;
    while (k < 6 && (n < 4 || memcmp(p, pre[k], 4) != 0))
        k++;
    if (k == 6)
        return NEXT;
    bool   be = p[0] == 'M', big = p[2] == 43;
    size_t esize = big ? 20 : 12, inl = big ? 8 : 4;
    if (n < (big ? 16u : 8u))
        return NEXT;
    uint64_t ifd = big ? (be ? be64(p + 8) : le64(p + 8)) : (be ? be32(p + 4) : le32(p + 4));
    if (!ifd)
        return NEXT; /* "no more images in TIFF file" */
    if (ifd >= BIG63)
        return "Unable to seek to frame";
    enum { T_W, T_H, T_COMP, T_WMP, T_STRIPS, T_TILES, T_N };
    static const uint32_t wanted[T_N] = {256, 257, 259, 0xBC01, 273, 324};
    tiff_tag_t            tags[T_N] = {{0}};
    uint8_t               stored[65536 / 8] = {0}; /* the tags load() kept */
    uint64_t              pos = ifd, total = 0, count = 0;
    if (take(pos, n, big ? 8 : 2) == (big ? 8u : 2u))
        count = big ? (be ? be64(p + pos) : le64(p + pos)) : (be ? be16(p + pos) : le16(p + pos));
    pos += big ? 8 : 2;
    for (uint64_t i = 0; i < count && take(pos, n, esize) == esize; i++, pos += esize) {
        const unsigned char *e = p + pos, *data = e + (big ? 12 : 8);
        uint32_t             tag = be ? be16(e) : le16(e), typ = be ? be16(e + 2) : le16(e + 2);
        uint64_t cnt = big ? (be ? be64(e + 4) : le64(e + 4)) : (be ? be32(e + 4) : le32(e + 4));
        uint32_t unit = tiff_unit(typ);
        size_t   t = 0;
        while (t < T_N && wanted[t] != tag)
            t++;
        if ((stored[tag / 8] >> (tag % 8) & 1) || !unit)
            continue; /* the first one kept counts; an unknown type is ignored */
        uint64_t size = cnt > UINT64_MAX / unit ? UINT64_MAX : cnt * unit;
        if (size > inl) {
            uint64_t at = big ? (be ? be64(data) : le64(data)) : (be ? be32(data) : le32(data));
            if (at >= BIG63)
                continue;
            total = size > UINT64_MAX - total ? UINT64_MAX : total + size;
            if (total > n)
                continue; /* "Tag data larger than file" */
            if (take(at, n, size) < size)
                break; /* _safe_read's OSError ends the load */
            data = p + at;
        }
        if (!size)
            continue;
        stored[tag / 8] |= (uint8_t)(1u << (tag % 8));
        if (t < T_N)
            tags[t] = (tiff_tag_t){true, cnt == 1 && tiff_integer(typ),
                                   tiff_integer(typ) ? tiff_int(data, typ, be) : 0};
    }
    if (tags[T_WMP].set)
        return OS_ERROR; /* "Windows Media Photo files not yet supported" */
    if (tags[T_COMP].set) {
        static const int64_t known[] = {
            1, 2, 3, 4, 5, 6, 7, 8, 32771, 32773, 32809, 32946, 34676, 34677, 34925, 50000, 50001};
        size_t c = 0;
        while (c < sizeof known / sizeof known[0] &&
               !(tags[T_COMP].is_int && tags[T_COMP].v == known[c]))
            c++;
        if (c == sizeof known / sizeof known[0])
            return NEXT; /* COMPRESSION_INFO's KeyError */
    }
    if (!tags[T_W].set || !tags[T_H].set)
        return NEXT; /* "Missing dimensions" (a TypeError) */
    if (!tags[T_W].is_int || !tags[T_H].is_int)
        return "Invalid dimensions";
    /* uncompressed data (libtiff reads the rest) needs strips or tiles */
    bool raw = !tags[T_COMP].set || tags[T_COMP].v == 1;
    if (raw && !tags[T_STRIPS].set && !tags[T_TILES].set)
        return NEXT; /* "unknown data organization" */
    if (tags[T_W].v <= 0 || tags[T_H].v <= 0)
        return NEXT;
    *w = clamp32((uint64_t)tags[T_W].v);
    *h = clamp32((uint64_t)tags[T_H].v);
    return NULL;
}

/* ---- QOI, TGA ----------------------------------------------------------- */

static const char *probe_qoi(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 13 || memcmp(p, "qoif", 4) != 0)
        return NEXT; /* the size, the channel count */
    *w = be32(p + 4);
    *h = be32(p + 8);
    return *w && *h ? NULL : NEXT;
}

/* TGA has no prefix test: its plugin reads any 18 bytes as a header. */
static const char *probe_tga(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 18)
        return NEXT;
    unsigned cmap = p[1], type = p[2], depth = p[16];
    *w = le16(p + 12);
    *h = le16(p + 14);
    if (cmap > 1 || !*w || !*h ||
        (depth != 1 && depth != 8 && depth != 16 && depth != 24 && depth != 32))
        return NEXT;
    if (type != 1 && type != 2 && type != 3 && type != 9 && type != 10 && type != 11)
        return NEXT; /* "unknown TGA mode" */
    if (cmap && p[7] != 16 && p[7] != 24 && p[7] != 32)
        return NEXT; /* "unknown TGA map depth" */
    return NULL;
}

/* ---- AVIF (sch_image_avif.c) -------------------------------------------- */

static const char *probe_avif(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    bool opens = sch_image_avif_accepts(p, n) && sch_image_probe_avif(p, n, w, h);
    return opens ? NULL : NEXT; /* the size goes to the caller's bomb check */
}

/* ---- Image.open's order ------------------------------------------------- */

typedef const char *(*probe_fn)(const unsigned char *, size_t, uint32_t *, uint32_t *);

const char *sch_image_probe_other(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    /* preinit()'s plugins (BMP, DIB, GIF, JPEG, PPM, PNG), then init()'s
     * in the order Pillow 13 registers them; JPEG, PNG and WebP are the
     * caller's, and no plugin here accepts their signatures. */
    static const probe_fn chain[] = {probe_bmp,  probe_dib, probe_gif, probe_ppm,
                                     probe_avif, probe_cur, probe_jp2, probe_ico,
                                     probe_tiff, probe_qoi, probe_tga};
    for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++) {
        *w = *h = 0;
        const char *e = chain[i](p, n, w, h);
        if (e != NEXT)
            return e;
    }
    *w = *h = 0;
    return NEXT;
}
