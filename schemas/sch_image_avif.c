/*
 * sch_image_avif.c -- what Pillow's AVIF plugin (Pillow 13, libavif's
 * avifDecoderParse) makes of bytes at Image.open: the image and its size,
 * or a failure that moves Image.open on to the next plugin.
 *
 * Written here rather than with Debian's libavif: what counts is the
 * parse of the libavif Pillow bundles (1.x; Debian 12 has 0.11, whose
 * checks differ), and reading a header should not pull in four AV1 codec
 * libraries. The parse is modelled for what decides its outcome on real
 * files, and compared with Pillow 13 (tests/tools/gen_image_other.py):
 *
 *   - the top-level boxes in order: `ftyp` first, with `avif` or `avis`
 *     among its brands; `ftyp`, `meta` and `moov` whole (a box cut short
 *     fails); the parse ends as soon as the boxes the brands need (`meta`
 *     for avif, `moov` for avis) are read, so `mdat` may be cut;
 *   - in `meta`: a `hdlr` of `pict`, the `pitm` primary item, `iloc`,
 *     `iinf`, `iprp` (`ipco`, `ipma`) each well formed, the primary item's
 *     `ispe` size, and the data of Exif and XMP items inside the file
 *     (Pillow reads them while opening);
 *   - sizes: zero, a side past 32,768 or more than 16,384 x 16,384 pixels
 *     fail (libavif's limits).
 *
 * Not reproduced: libavif's checks on the other properties (av1C, pixi,
 * colr, auxC, iref) and the RuntimeErrors (a 500 upstream) some malformed
 * boxes raise; a file wrong only there is taken as AVIF here. Of Pillow's
 * answers to every single-byte change of four small AVIF files, 12% differ.
 */
#include "sch_int.h"

#define AVIF_MAX_SIDE   32768u
#define AVIF_MAX_PIXELS (16384ull * 16384ull)
#define AVIF_MAX_ITEMS  64 /* Exif/XMP items checked; real files have one or two */

typedef struct bmff {
    const unsigned char *p; /* the file */
    uint64_t             n;
} bmff_t;

typedef struct box {
    char     type[4];
    uint64_t body; /* first byte after the header */
    uint64_t end;  /* one past the box (may be past the file at top level) */
} box_t;

static uint64_t rd(const unsigned char *p, unsigned k) {
    uint64_t v = 0;
    for (unsigned i = 0; i < k; i++)
        v = v << 8 | p[i];
    return v;
}

/* The box header at off within [off, end): false when it does not fit or
 * declares less than itself. b->end may pass end (the caller decides). */
static bool box_at(const bmff_t *f, uint64_t off, uint64_t end, box_t *b) {
    if (end - off < 8)
        return false;
    uint64_t size = rd(f->p + off, 4), head = 8;
    memcpy(b->type, f->p + off + 4, 4);
    if (size == 1) {
        if (end - off < 16)
            return false;
        size = rd(f->p + off + 8, 8);
        head = 16;
    } else if (size == 0) {
        size = end - off;
    }
    if (size < head || size > UINT64_MAX - off)
        return false;
    b->body = off + head;
    b->end = off + size;
    return true;
}

static bool is(const box_t *b, const char *type) {
    return memcmp(b->type, type, 4) == 0;
}

/* Child i of [start, end): walks from *off; false at the end or when a
 * child does not fit (*bad set). */
static bool child(const bmff_t *f, uint64_t *off, uint64_t end, box_t *b, bool *bad) {
    if (*off >= end)
        return false;
    if (!box_at(f, *off, end, b) || b->end > end) {
        *bad = true;
        return false;
    }
    *off = b->end;
    return true;
}

typedef struct meta {
    bool     hdlr_pict, has_pitm;
    uint64_t pitm;
    uint64_t ispe_w, ispe_h;
    bool     has_ispe;
    /* iinf: the Exif/XMP items; iloc: their extents, checked at the end */
    uint64_t meta_items[AVIF_MAX_ITEMS];
    size_t   n_meta_items;
    box_t    iloc, ipco, ipma;
    bool     has_iloc, has_ipco, has_ipma;
} meta_t;

static bool parse_hdlr(const bmff_t *f, const box_t *b, meta_t *m) {
    const unsigned char *d = f->p + b->body;
    if (b->end - b->body < 12 || d[0] != 0 || rd(d + 4, 4) != 0)
        return false; /* version 0, pre_defined 0 */
    m->hdlr_pict = memcmp(d + 8, "pict", 4) == 0;
    return true;
}

static bool parse_pitm(const bmff_t *f, const box_t *b, meta_t *m) {
    const unsigned char *d = f->p + b->body;
    uint64_t             len = b->end - b->body;
    unsigned             w = len >= 4 && d[0] == 0 ? 2 : 4;
    if (len < 4 + (uint64_t)w)
        return false;
    m->pitm = rd(d + 4, w);
    m->has_pitm = true;
    return true;
}

/* iinf: infe v2/v3 entries; Exif and XMP ("mime") items remembered. */
static bool parse_iinf(const bmff_t *f, const box_t *b, meta_t *m) {
    const unsigned char *d = f->p + b->body;
    uint64_t             len = b->end - b->body;
    if (len < 4)
        return false;
    unsigned w = d[0] == 0 ? 2 : 4;
    if (len < 4 + (uint64_t)w)
        return false;
    uint64_t count = rd(d + 4, w), off = b->body + 4 + w, seen = 0;
    box_t    e;
    bool     bad = false;
    while (child(f, &off, b->end, &e, &bad)) { /* every child well formed */
        if (seen++ >= count)
            continue;
        const unsigned char *q = f->p + e.body;
        uint64_t             el = e.end - e.body;
        if (!is(&e, "infe") || el < 4)
            return false;
        if (q[0] != 2 && q[0] != 3)
            continue; /* older entries name no item type */
        unsigned iw = q[0] == 2 ? 2 : 4;
        if (el < 4 + (uint64_t)iw + 2 + 4)
            return false;
        bool meta_item =
            memcmp(q + 4 + iw + 2, "Exif", 4) == 0 || memcmp(q + 4 + iw + 2, "mime", 4) == 0;
        if (meta_item && m->n_meta_items < AVIF_MAX_ITEMS)
            m->meta_items[m->n_meta_items++] = rd(q + 4, iw);
    }
    return !bad && seen >= count;
}

static bool size_ok(unsigned k) {
    return k == 0 || k == 4 || k == 8;
}

static bool wanted(const meta_t *m, uint64_t id) {
    for (size_t i = 0; i < m->n_meta_items; i++)
        if (m->meta_items[i] == id)
            return true;
    return false;
}

/* iloc (versions 0-2): well formed, and the file-offset extents of the
 * Exif/XMP items inside the file. */
static bool check_iloc(const bmff_t *f, const meta_t *m) {
    const unsigned char *d = f->p + m->iloc.body;
    uint64_t             len = m->iloc.end - m->iloc.body, pos = 6;
    if (len < 8 || d[0] > 2)
        return false;
    unsigned v = d[0], osz = d[4] >> 4, lsz = d[4] & 15, bsz = d[5] >> 4;
    unsigned isz = v ? d[5] & 15 : 0, w = v < 2 ? 2 : 4;
    if (!size_ok(osz) || !size_ok(lsz) || !size_ok(bsz) || !size_ok(isz) || len < pos + w)
        return false;
    uint64_t items = rd(d + pos, w);
    pos += w;
    for (uint64_t i = 0; i < items; i++) {
        if (len < pos + w + (v ? 2 : 0) + 2 + bsz + 2)
            return false;
        uint64_t id = rd(d + pos, w);
        pos += w;
        unsigned method = v ? (unsigned)(rd(d + pos, 2) & 15) : 0;
        pos += (v ? 2 : 0) + 2; /* construction method, data reference index */
        uint64_t base = rd(d + pos, bsz);
        pos += bsz;
        uint64_t extents = rd(d + pos, 2);
        pos += 2;
        for (uint64_t x = 0; x < extents; x++) {
            if (len < pos + isz + osz + lsz)
                return false;
            uint64_t off = rd(d + pos + isz, osz), el = rd(d + pos + isz + osz, lsz);
            pos += isz + osz + lsz;
            if (method == 0 && wanted(m, id) &&
                (off > UINT64_MAX - base || base + off > f->n || el > f->n - (base + off)))
                return false;
        }
    }
    return true;
}

/* ipma: the properties of the primary item; its ispe read from ipco. */
static bool check_ipma(const bmff_t *f, meta_t *m) {
    const unsigned char *d = f->p + m->ipma.body;
    uint64_t             len = m->ipma.end - m->ipma.body, pos = 8;
    if (len < 8)
        return false;
    unsigned w = d[0] == 0 ? 2 : 4, wide = d[3] & 1;
    uint64_t entries = rd(d + 4, 4);
    for (uint64_t i = 0; i < entries; i++) {
        if (len < pos + w + 1)
            return false;
        uint64_t item = rd(d + pos, w);
        unsigned k = d[pos + w];
        pos += w + 1;
        for (unsigned j = 0; j < k; j++) {
            if (len < pos + 1 + wide)
                return false;
            uint64_t idx = wide ? rd(d + pos, 2) & 0x7FFF : d[pos] & 0x7Fu;
            pos += 1 + wide;
            if (item != m->pitm || m->has_ispe || !m->has_ipco || idx == 0)
                continue;
            uint64_t off = m->ipco.body;
            box_t    prop;
            bool     bad = false;
            for (uint64_t p = 1; child(f, &off, m->ipco.end, &prop, &bad) && p <= idx; p++) {
                if (p < idx || !is(&prop, "ispe"))
                    continue;
                if (prop.end - prop.body < 12)
                    return false;
                m->ispe_w = rd(f->p + prop.body + 4, 4);
                m->ispe_h = rd(f->p + prop.body + 8, 4);
                m->has_ispe = true;
            }
        }
    }
    return true;
}

static bool parse_iprp(const bmff_t *f, const box_t *b, meta_t *m) {
    uint64_t off = b->body;
    box_t    c;
    bool     bad = false;
    while (child(f, &off, b->end, &c, &bad)) {
        if (is(&c, "ipco")) {
            uint64_t o = c.body;
            box_t    prop;
            while (child(f, &o, c.end, &prop, &bad))
                ;
            m->ipco = c;
            m->has_ipco = true;
        } else if (is(&c, "ipma")) {
            m->ipma = c;
            m->has_ipma = true;
        }
    }
    return !bad;
}

/* The meta box: true with the primary item's size, or false. */
static bool parse_meta(const bmff_t *f, const box_t *b, uint64_t *w, uint64_t *h) {
    meta_t m;
    memset(&m, 0, sizeof m);
    if (b->end - b->body < 4 || f->p[b->body] != 0)
        return false;
    uint64_t off = b->body + 4;
    box_t    c;
    bool     bad = false, ok = true;
    while (ok && child(f, &off, b->end, &c, &bad)) {
        if (is(&c, "hdlr"))
            ok = parse_hdlr(f, &c, &m);
        else if (is(&c, "pitm"))
            ok = parse_pitm(f, &c, &m);
        else if (is(&c, "iinf"))
            ok = parse_iinf(f, &c, &m);
        else if (is(&c, "iprp"))
            ok = parse_iprp(f, &c, &m);
        else if (is(&c, "iloc")) {
            m.iloc = c;
            m.has_iloc = true;
        }
    }
    if (!ok || bad || !m.hdlr_pict || !m.has_pitm)
        return false;
    if ((m.has_iloc && !check_iloc(f, &m)) || (m.has_ipma && !check_ipma(f, &m)) || !m.has_ispe)
        return false;
    *w = m.ispe_w;
    *h = m.ispe_h;
    return true;
}

/* ftyp: a major brand, a version, whole compatible brands, avif or avis
 * among them; *need_meta, *need_moov from the brands. */
static bool parse_ftyp(const bmff_t *f, const box_t *b, bool *need_meta, bool *need_moov) {
    uint64_t len = b->end - b->body;
    if (len < 8 || (len - 8) % 4)
        return false;
    *need_meta = *need_moov = false;
    for (uint64_t i = 0; i < len; i += i ? 4 : 8) {
        const unsigned char *brand = f->p + b->body + i;
        *need_meta = *need_meta || memcmp(brand, "avif", 4) == 0;
        *need_moov = *need_moov || memcmp(brand, "avis", 4) == 0;
    }
    return *need_meta || *need_moov;
}

bool sch_image_avif_accepts(const unsigned char *p, size_t n) {
    return n >= 12 && memcmp(p + 4, "ftyp", 4) == 0 &&
           (memcmp(p + 8, "avif", 4) == 0 || memcmp(p + 8, "avis", 4) == 0 ||
            memcmp(p + 8, "mif1", 4) == 0 || memcmp(p + 8, "msf1", 4) == 0);
}

bool sch_image_probe_avif(const unsigned char *p, size_t n, uint32_t *w, uint32_t *h) {
    bmff_t   f = {p, n};
    uint64_t off = 0, iw = 0, ih = 0;
    bool     ftyp = false, meta = false, moov = false, need_meta = false, need_moov = false;
    box_t    b;
    while (off < n) {
        if (!box_at(&f, off, n, &b))
            return false;
        bool whole = is(&b, "ftyp") || is(&b, "meta") || is(&b, "moov");
        if (whole && b.end > n)
            return false; /* truncated */
        if (is(&b, "ftyp")) {
            if (ftyp || !parse_ftyp(&f, &b, &need_meta, &need_moov))
                return false;
            ftyp = true;
        } else if (!ftyp) {
            return false;
        } else if (is(&b, "meta")) {
            if (meta || !parse_meta(&f, &b, &iw, &ih))
                return false;
            meta = true;
        } else if (is(&b, "moov")) {
            moov = true;
        }
        off = b.end;
        if (ftyp && (!need_meta || meta) && (!need_moov || moov))
            break;
    }
    if (!ftyp || !meta || (need_moov && !moov))
        return false; /* incomplete, or a sequence without a primary item (not modelled) */
    if (!iw || !ih || iw > AVIF_MAX_SIDE || ih > AVIF_MAX_SIDE || iw * ih > AVIF_MAX_PIXELS)
        return false;
    *w = (uint32_t)iw;
    *h = (uint32_t)ih;
    return true;
}
