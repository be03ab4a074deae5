/*
 * sch_image.c -- image and video data URLs (SPEC a.10): the data URL form,
 * strict base64, the size limits, and the format and size an image's own
 * header declares (PNG IHDR, JPEG SOFn, WebP VP8/VP8L/VP8X).
 *
 * Upstream opens the bytes with PIL; here only the headers are read, and
 * pixels are decoded later by engine/. A header PIL could not open is
 * reported as PIL reports it: `invalid image data (UnidentifiedImageError)`.
 * Every reader below checks lengths before each access: the bytes are
 * untrusted.
 */
#include "sch_int.h"

/* ---- base64 ------------------------------------------------------------ */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* binascii.a2b_base64(strict_mode=True): whole quads of the alphabet, the
 * last one optionally `xx==` or `xxx=`, nothing after the padding. */
bool sch_base64_decode(const char *s, size_t n, unsigned char *out, size_t *out_len) {
    size_t o = 0;
    if (n % 4)
        return false;
    for (size_t i = 0; i < n; i += 4) {
        int  v[4];
        int  pad = 0;
        bool last = i + 4 == n;
        for (int j = 0; j < 4; j++) {
            unsigned char c = (unsigned char)s[i + (size_t)j];
            if (c == '=' && last && j >= 2) {
                pad++;
                v[j] = 0;
                continue;
            }
            v[j] = b64_value(c);
            if (v[j] < 0 || pad)
                return false;
        }
        uint32_t bits =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        unsigned char b[3] = {(unsigned char)(bits >> 16), (unsigned char)(bits >> 8),
                              (unsigned char)bits};
        for (int j = 0; j < 3 - pad; j++) {
            if (out)
                out[o] = b[j];
            o++;
        }
    }
    *out_len = o;
    return true;
}

/* ---- header readers ---------------------------------------------------- */

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t be16(const unsigned char *p) {
    return (uint32_t)p[0] << 8 | p[1];
}

static uint32_t le16(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t le24(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
}

static uint32_t le32(const unsigned char *p) {
    return le24(p) | (uint32_t)p[3] << 24;
}

static uint32_t crc32_png(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

static bool png_is_cid(const unsigned char *t) {
    for (int i = 0; i < 4; i++) {
        unsigned char c = t[i];
        bool          word =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        if (!word)
            return false;
    }
    return true;
}

#define UNIDENTIFIED "invalid image data (UnidentifiedImageError)"
#define OS_ERROR     "invalid image data (OSError)"

/* (bit depth, colour type) pairs PIL has a mode for; others are refused. */
static bool png_mode_known(unsigned depth, unsigned colour) {
    switch (colour) {
    case 0:
        return depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
    case 3:
        return depth == 1 || depth == 2 || depth == 4 || depth == 8;
    case 2:
    case 4:
    case 6:
        return depth == 8 || depth == 16;
    default:
        return false;
    }
}

/* PIL's PngImageFile._open: chunks up to IDAT, each whole (else OSError),
 * with a readable, matching CRC (else unidentified); IHDR gives the size.
 * Returns NULL, or the failure message. */
const char *sch_image_probe_png(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    size_t pos = 8;
    bool   mode = false;
    for (;;) {
        if (n - pos < 8)
            return UNIDENTIFIED;
        uint32_t             len = be32(p + pos);
        const unsigned char *cid = p + pos + 4;
        const unsigned char *data = cid + 4;
        if (!png_is_cid(cid))
            return UNIDENTIFIED;
        if (memcmp(cid, "IDAT", 4) == 0)
            return mode ? NULL : UNIDENTIFIED;
        if (memcmp(cid, "IHDR", 4) == 0 && len < 13)
            return "Truncated IHDR chunk"; /* a ValueError PIL lets through */
        if ((size_t)len > n - pos - 8)
            return OS_ERROR;
        if (n - pos - 8 - len < 4 || crc32_png(cid, (size_t)len + 4) != be32(data + len))
            return UNIDENTIFIED;
        if (memcmp(cid, "IHDR", 4) == 0) {
            *w = be32(data);
            *h = be32(data + 4);
            mode = png_mode_known(data[8], data[9]);
        }
        pos += 12 + (size_t)len;
    }
}

static bool jpeg_is_sof(uint32_t m) {
    return m >= 0xFFC0 && m <= 0xFFCF && m != 0xFFC4 && m != 0xFFC8 && m != 0xFFCC;
}

/* PIL's JpegImageFile._open: walk the markers to SOS. A marker or length
 * cut short is unidentified; a segment cut short is an OSError. */
/* Pillow's jpeg_factory: a JPEG whose APP2 "MPF" segment (the last one,
 * as JpegImagePlugin keeps it) is a TIFF directory with NumberOfImages
 * (tag 0xB001) above 1 opens as MPO -- a format the contract refuses --
 * unless an APP1 segment marks it Ultra HDR (" hdrgm:Version="). A
 * directory Pillow cannot read (its SyntaxError) leaves it a JPEG. */
typedef struct jpeg_mp {
    const unsigned char *mpf; /* APP2 payload after "MPF\0", or NULL */
    size_t               mpf_len;
    bool                 ultra_hdr;
} jpeg_mp_t;

static uint32_t rd16(const unsigned char *p, bool be) {
    return be ? be16(p) : le16(p);
}

static uint32_t rd32(const unsigned char *p, bool be) {
    return be ? be32(p) : le32(p);
}

static bool jpeg_is_mpo(const jpeg_mp_t *mp) {
    const unsigned char *d = mp->mpf;
    size_t               n = mp->mpf_len;
    if (!d || mp->ultra_hdr || n < 8)
        return false;
    bool be = memcmp(d, "MM\0*", 4) == 0;
    if (!be && memcmp(d, "II*\0", 4) != 0)
        return false;
    uint32_t ifd = rd32(d + 4, be);
    if (ifd > n || n - ifd < 2)
        return false;
    uint32_t count = rd16(d + ifd, be);
    for (uint32_t i = 0; i < count; i++) {
        size_t e = ifd + 2 + (size_t)i * 12;
        if (e + 12 > n)
            return false;
        uint32_t tag = rd16(d + e, be), type = rd16(d + e + 2, be);
        if (tag != 0xB001)
            continue;
        /* LONG (4) or SHORT (3), one value, stored in the entry */
        uint32_t v = type == 3 ? rd16(d + e + 8, be) : type == 4 ? rd32(d + e + 8, be) : 0;
        return rd32(d + e + 4, be) == 1 && v > 1;
    }
    return false;
}

static void jpeg_app(uint32_t m, const unsigned char *s, size_t len, jpeg_mp_t *mp) {
    static const char hdr[] = " hdrgm:Version=";
    if (m == 0xFFE2 && len >= 4 && memcmp(s, "MPF\0", 4) == 0) {
        mp->mpf = s + 4;
        mp->mpf_len = len - 4;
    }
    if (m == 0xFFE1 && len >= sizeof hdr - 1 && memmem(s, len, hdr, sizeof hdr - 1))
        mp->ultra_hdr = true;
}

static const char *probe_jpeg(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h,
                              bool *mpo) {
    size_t    pos = 2;
    jpeg_mp_t mp = {NULL, 0, false};
    *mpo = false;
    while (pos < n) {
        if (p[pos] != 0xFF) {
            pos++; /* PIL skips junk between markers */
            continue;
        }
        if (n - pos < 2)
            return UNIDENTIFIED;
        uint32_t m = be16(p + pos);
        if (m == 0xFFFF || m == 0xFF00) {
            pos += m == 0xFFFF ? 1 : 2;
            continue;
        }
        if (m < 0xFFC0)
            return UNIDENTIFIED; /* "no marker found" */
        pos += 2;
        if (m == 0xFFDA) { /* Skip() reads SOS's length: struct.error when cut */
            if (n - pos < 2)
                return UNIDENTIFIED;
            *mpo = jpeg_is_mpo(&mp);
            return NULL; /* the size is checked by the caller */
        }
        if (m >= 0xFFD0 && m <= 0xFFD9)
            continue; /* RSTn, SOI, EOI: no length */
        if (n - pos < 2 || be16(p + pos) < 2)
            return UNIDENTIFIED;
        uint32_t len = be16(p + pos);
        if (len > n - pos)
            return OS_ERROR;
        if (m >= 0xFFE0 && m <= 0xFFEF)
            jpeg_app(m, p + pos + 2, len - 2, &mp);
        if (jpeg_is_sof(m)) {
            const unsigned char *s = p + pos + 2;
            if (len < 8 || s[0] != 8 || (s[5] != 1 && s[5] != 3 && s[5] != 4))
                return UNIDENTIFIED;
            *h = be16(s + 1);
            *w = be16(s + 3);
        }
        pos += len;
    }
    return UNIDENTIFIED;
}

/* PIL hands WebP to libwebp once "VP8" follows the RIFF header; what
 * libwebp cannot read is an OSError. */
static const char *probe_webp(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 16 || memcmp(p + 12, "VP8", 3) != 0)
        return UNIDENTIFIED;
    if (p[15] == 'X' && n >= 30) {
        *w = le24(p + 24) + 1;
        *h = le24(p + 27) + 1;
        return NULL;
    }
    if (p[15] == 'L' && n >= 25 && p[20] == 0x2F) {
        uint32_t bits = le32(p + 21);
        *w = (bits & 0x3FFF) + 1;
        *h = ((bits >> 14) & 0x3FFF) + 1;
        return NULL;
    }
    if (p[15] == ' ' && n >= 30 && (p[20] & 1) == 0 && p[23] == 0x9D && p[24] == 0x01 &&
        p[25] == 0x2A) {
        *w = le16(p + 26) & 0x3FFF;
        *h = le16(p + 28) & 0x3FFF;
        return NULL;
    }
    return OS_ERROR;
}

const char *sch_image_probe(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h,
                            const char **fail) {
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    const char                *format = NULL;
    *w = *h = 0;
    *fail = UNIDENTIFIED;
    if (n >= 8 && memcmp(p, png_sig, 8) == 0) {
        format = "png";
        *fail = sch_image_probe_png(p, n, w, h);
    } else if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) {
        format = "jpeg";
        bool mpo = false;
        *fail = probe_jpeg(p, n, w, h, &mpo);
        if (!*fail && mpo && *w && *h)
            return "other"; /* Pillow's MPO: refused by name, like GIF */
    } else if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) {
        format = "webp";
        *fail = probe_webp(p, n, w, h);
    } else {
        /* GIF, BMP, TIFF, ... (sch_image_other.c): refused by name */
        *fail = sch_image_probe_other(p, n, w, h);
        return *fail ? NULL : "other";
    }
    /* PIL's ImageFile refuses an empty size while opening. */
    if (!*fail && (*w == 0 || *h == 0))
        *fail = UNIDENTIFIED;
    return *fail ? NULL : format;
}

/* ---- data URLs --------------------------------------------------------- */

typedef struct media_kind {
    const char        *prefix;  /* "data:image/" */
    const char *const *formats; /* accepted subtypes, NULL-terminated */
    const char        *bad_url; /* not a data URL of an accepted type */
    const char        *bad_form;
    size_t             max_b64;
    size_t             max_bytes;
    const char        *too_large;
    const char        *bad_b64;
} media_kind_t;

static const char *const IMAGE_FORMATS[] = {"png", "jpeg", "jpg", "webp", NULL};
static const char *const VIDEO_FORMATS[] = {"mp4", "webm", "quicktime", "x-matroska", NULL};

static const media_kind_t IMAGE = {
    "data:image/",
    IMAGE_FORMATS,
    "images must be base64 PNG, JPEG or WebP data URLs",
    "a data URL image is data:image/<format>;base64,<data>",
    SCH_IMAGE_MAX_B64,
    SCH_IMAGE_MAX_BYTES,
    "each image must be at most 8,000,000 bytes",
    "invalid base64 image data",
};

static const media_kind_t VIDEO = {
    "data:video/",
    VIDEO_FORMATS,
    "videos must be base64 MP4, WebM, QuickTime or Matroska data URLs",
    "a data URL video is data:video/<format>;base64,<data>",
    SCH_VIDEO_MAX_B64,
    SCH_VIDEO_MAX_BYTES,
    "each video must be at most 32,000,000 bytes",
    "invalid base64 video data",
};

/* `header.strip().lower()` starts with prefix, ends with ";base64", and the
 * subtype between is accepted. Returns the message, or NULL when fine. */
static const char *check_header(const media_kind_t *kind, const char *hdr, size_t n) {
    static const char b64[] = ";base64";
    size_t            start, len;
    size_t            plen = strlen(kind->prefix);
    sch_py_strip(hdr, n, &start, &len);
    hdr += start;
    /* Only ASCII letters matter below; no non-ASCII letter lower-cases to
     * one of them, so ASCII folding is enough. */
    if (len < plen + sizeof b64 - 1 || strncasecmp(hdr, kind->prefix, plen) != 0 ||
        strncasecmp(hdr + len - (sizeof b64 - 1), b64, sizeof b64 - 1) != 0)
        return kind->bad_form;
    const char *sub = hdr + plen;
    size_t      sub_len = len - plen - (sizeof b64 - 1);
    for (const char *const *f = kind->formats; *f; f++)
        if (strlen(*f) == sub_len && strncasecmp(sub, *f, sub_len) == 0)
            return NULL;
    return kind->bad_url;
}

/* The payload of a data URL: *bytes (heap; NULL when decode is false). */
static svc_err_t data_url(const media_kind_t *kind, const sch_json_t *v, bool decode,
                          unsigned char **bytes, size_t *n_bytes, char *msg, size_t msg_size) {
    size_t      n;
    const char *s = sch_json_type(v) == SCH_JSON_STRING ? sch_json_string(v, &n) : NULL;
    const char *why;
    *bytes = NULL;
    *n_bytes = 0;
    if (!s || n < 5 || memcmp(s, "data:", 5) != 0) {
        svc_errf(msg, msg_size, "%s", kind->bad_url);
        return SVC_ERR_INVALID;
    }
    const char *comma = memchr(s, ',', n);
    why = comma ? check_header(kind, s, (size_t)(comma - s)) : kind->bad_form;
    if (why) {
        svc_errf(msg, msg_size, "%s", why);
        return SVC_ERR_INVALID;
    }
    const char *enc = comma + 1;
    size_t      enc_len = n - (size_t)(enc - s);
    if (sch_utf8_count(enc, enc_len) > kind->max_b64) {
        svc_errf(msg, msg_size, "%s", kind->too_large);
        return SVC_ERR_INVALID;
    }
    if (!sch_base64_decode(enc, enc_len, NULL, n_bytes)) {
        svc_errf(msg, msg_size, "%s", kind->bad_b64);
        return SVC_ERR_INVALID;
    }
    if (*n_bytes > kind->max_bytes) {
        svc_errf(msg, msg_size, "%s", kind->too_large);
        return SVC_ERR_INVALID;
    }
    if (!decode)
        return SVC_OK;
    *bytes = malloc(*n_bytes ? *n_bytes : 1);
    if (!*bytes)
        return SVC_ERR_NOMEM;
    (void)sch_base64_decode(enc, enc_len, *bytes, n_bytes);
    return SVC_OK;
}

/* Size rules on a read header (SPEC a.10), in PIL's then the resizer's
 * order: bomb, format, pixel count, then (when asked) the aspect ratio. */
static svc_err_t check_size(const char *format, uint32_t w, uint32_t h, bool aspect, char *msg,
                            size_t msg_size) {
    if ((uint64_t)w * h > SCH_IMAGE_BOMB_PIXELS) {
        svc_errf(msg, msg_size, "invalid image data (DecompressionBombError)");
        return SVC_ERR_INVALID;
    }
    if (strcmp(format, "other") == 0) {
        svc_errf(msg, msg_size, "images must be PNG, JPEG or WebP");
        return SVC_ERR_INVALID;
    }
    if ((uint64_t)w * h > SCH_IMAGE_MAX_PIXELS) {
        svc_errf(msg, msg_size, "each image must have at most 16,000,000 pixels");
        return SVC_ERR_INVALID;
    }
    if (!aspect)
        return SVC_OK;
    uint32_t big = w > h ? w : h;
    uint32_t small = w > h ? h : w;
    double   ratio = (double)big / (double)small;
    if (ratio > SCH_IMAGE_MAX_ASPECT) {
        svc_buf_t r;
        svc_buf_init(&r, 64);
        svc_err_t err = sch_json_write_double(&r, ratio);
        if (!err)
            svc_errf(msg, msg_size, "absolute aspect ratio must be smaller than 200, got %s",
                     r.data);
        svc_buf_fini(&r);
        return err ? err : SVC_ERR_INVALID;
    }
    return SVC_OK;
}

svc_err_t sch_image_decode(const sch_json_t *v, sch_image_t *img, bool aspect, char *msg,
                           size_t msg_size) {
    unsigned char *bytes;
    size_t         n;
    svc_err_t      err = data_url(&IMAGE, v, true, &bytes, &n, msg, msg_size);
    if (err)
        return err;
    uint32_t    w, h;
    const char *fail;
    const char *format = sch_image_probe(bytes, n, &w, &h, &fail);
    if (!format) {
        svc_errf(msg, msg_size, "%s", fail);
        err = SVC_ERR_INVALID;
    } else {
        err = check_size(format, w, h, aspect, msg, msg_size);
    }
    if (err) {
        free(bytes);
        return err;
    }
    img->bytes = bytes;
    img->len = n;
    img->format = format;
    img->width = w;
    img->height = h;
    return SVC_OK;
}

svc_err_t sch_video_check(const sch_json_t *v, char *msg, size_t msg_size) {
    unsigned char *bytes;
    size_t         n;
    return data_url(&VIDEO, v, false, &bytes, &n, msg, msg_size);
}
