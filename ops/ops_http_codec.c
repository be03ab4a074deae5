/*
 * ops_http_codec.c -- compressed request bodies (issue 30): the codings of
 * a Content-Encoding header (gzip, deflate, zstd, identity; several in the
 * order they were applied) undone as the body's pieces arrive, with zlib
 * and libzstd from Debian. The caller's sink takes the decoded bytes and
 * stops the stream at its limit, so a bomb costs no more than the limit:
 * output goes out in pieces of CODEC_CHUNK, zstd's window is capped at the
 * smallest power of two that holds the limit, zlib's is 32 KiB.
 */
#include "ops_http_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>
#include <zstd.h>

#define CODEC_MAX   4          /* codings in one header */
#define CODEC_CHUNK (64 << 10) /* bytes decoded per step */

typedef enum coding { C_GZIP, C_DEFLATE, C_ZSTD } coding_t;

typedef struct stage {
    coding_t   kind;
    z_stream   z;
    bool       z_on, raw_tried, ended; /* ended: the last stream finished */
    ZSTD_DCtx *zd;
    char       name[16];
} stage_t;

struct http_codec {
    stage_t n[CODEC_MAX]; /* in decoding order: the last coding applied first */
    size_t  count;
    char   *buf[CODEC_MAX];
};

void ops_http_codec_free(http_codec_t *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->count; i++) {
        if (c->n[i].z_on)
            inflateEnd(&c->n[i].z);
        ZSTD_freeDCtx(c->n[i].zd);
        free(c->buf[i]);
    }
    free(c);
}

/* windowLog for a limit: the smallest power of two >= limit, 10..27. */
static int zstd_window_log(size_t limit) {
    int w = 10;
    while (w < 27 && ((size_t)1 << w) < limit)
        w++;
    return w;
}

static bool stage_init(stage_t *s, coding_t kind, size_t limit) {
    s->kind = kind;
    if (kind == C_ZSTD) {
        s->zd = ZSTD_createDCtx();
        return s->zd && !ZSTD_isError(ZSTD_DCtx_setParameter(s->zd, ZSTD_d_windowLogMax,
                                                             zstd_window_log(limit)));
    }
    /* gzip: 16 + 15 (the gzip wrapper); deflate: the zlib wrapper RFC 9110
     * names, and raw deflate when the first bytes are no zlib header (what
     * some clients send), decided on the first piece. */
    s->z_on = inflateInit2(&s->z, kind == C_GZIP ? 16 + 15 : 15) == Z_OK;
    return s->z_on;
}

/* One coding name of the header: gzip (x-gzip), deflate, zstd; identity is
 * skipped. -1: not one of these. */
static int coding_of(const char *p, size_t n) {
    static const struct {
        const char *name;
        int         kind;
    } K[] = {{"gzip", C_GZIP}, {"x-gzip", C_GZIP}, {"deflate", C_DEFLATE}, {"zstd", C_ZSTD}};
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++)
        if (strlen(K[i].name) == n && strncasecmp(p, K[i].name, n) == 0)
            return K[i].kind;
    return -1;
}

int ops_http_codec_new(const char *header, size_t limit, http_codec_t **out, char *why,
                       size_t why_size) {
    *out = NULL;
    coding_t applied[CODEC_MAX];
    char     names[CODEC_MAX][16];
    size_t   count = 0;
    for (const char *p = header; *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, " \t,");
        if (!n)
            break;
        int  k = coding_of(p, n);
        bool identity = n == 8 && strncasecmp(p, "identity", 8) == 0;
        if (!identity && (k < 0 || count == CODEC_MAX)) {
            snprintf(why, why_size,
                     k < 0 ? "Content-Encoding \"%.*s\" is not supported (gzip, deflate, zstd or "
                             "identity)"
                           : "Content-Encoding: at most 4 codings (\"%.*s\")",
                     (int)(n > 64 ? 64 : n), p);
            return -1;
        }
        if (!identity) {
            snprintf(names[count], sizeof names[count], "%.*s", (int)n, p);
            applied[count++] = (coding_t)k;
        }
        p += n;
    }
    if (!count)
        return 0;
    http_codec_t *c = calloc(1, sizeof *c);
    if (!c)
        return -2;
    for (size_t i = 0; i < count; i++) { /* undone last first */
        c->count++;
        snprintf(c->n[i].name, sizeof c->n[i].name, "%s", names[count - 1 - i]);
        c->buf[i] = malloc(CODEC_CHUNK);
        if (!c->buf[i] || !stage_init(&c->n[i], applied[count - 1 - i], limit)) {
            ops_http_codec_free(c);
            return -2;
        }
    }
    *out = c;
    return 0;
}

typedef struct feed {
    http_codec_t    *c;
    ops_http_sink_fn sink;
    void            *user;
    char            *why;
    size_t           why_size;
} feed_t;

static int feed_stage(const feed_t *f, size_t i, const char *data, size_t n);

/* Output of stage i: to stage i + 1, or to the sink. 1 when the sink stopped. */
static int emit(const feed_t *f, size_t i, const char *p, size_t n) {
    if (!n)
        return 0;
    if (i + 1 < f->c->count)
        return feed_stage(f, i + 1, p, n);
    return f->sink(f->user, p, n) ? 0 : 1;
}

static int corrupt(const feed_t *f, const stage_t *s, const char *detail) {
    snprintf(f->why, f->why_size, "the request body is not valid %s data (Content-Encoding): %s",
             s->name, detail ? detail : "corrupt stream");
    return -1;
}

/* Deflate without the zlib wrapper: the first two bytes are no zlib header
 * (RFC 1950: CM 8, the check bits). */
static bool raw_deflate(const unsigned char *p, size_t n) {
    return n >= 2 && ((p[0] & 0x0f) != 8 || ((p[0] << 8) | p[1]) % 31 != 0);
}

static int feed_zlib(const feed_t *f, size_t i, const char *data, size_t n) {
    stage_t *s = &f->c->n[i];
    if (s->kind == C_DEFLATE && !s->raw_tried) {
        s->raw_tried = true;
        if (raw_deflate((const unsigned char *)data, n)) {
            inflateEnd(&s->z);
            s->z_on = inflateInit2(&s->z, -15) == Z_OK;
            if (!s->z_on)
                return corrupt(f, s, "out of memory");
        }
    }
    s->z.next_in = (Bytef *)(uintptr_t)data;
    s->z.avail_in = (uInt)n;
    for (;;) {
        if (s->ended && !s->z.avail_in)
            return 0;
        if (s->ended) { /* gzip: another member may follow; deflate: nothing */
            if (s->kind != C_GZIP)
                return corrupt(f, s, "bytes after the end of the stream");
            inflateReset(&s->z);
            s->ended = false;
        }
        s->z.next_out = (Bytef *)f->c->buf[i];
        s->z.avail_out = CODEC_CHUNK;
        int rc = inflate(&s->z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
            return corrupt(f, s, s->z.msg);
        s->ended = rc == Z_STREAM_END;
        int st = emit(f, i, f->c->buf[i], CODEC_CHUNK - s->z.avail_out);
        if (st)
            return st;
        /* Output space left over and no stream end: it wants input. */
        if (!s->ended && s->z.avail_out)
            return 0;
    }
}

static int feed_zstd(const feed_t *f, size_t i, const char *data, size_t n) {
    stage_t      *s = &f->c->n[i];
    ZSTD_inBuffer in = {data, n, 0};
    for (;;) {
        size_t         before = in.pos;
        ZSTD_outBuffer o = {f->c->buf[i], CODEC_CHUNK, 0};
        size_t         rc = ZSTD_decompressStream(s->zd, &o, &in);
        if (ZSTD_isError(rc))
            return corrupt(f, s, ZSTD_getErrorName(rc));
        /* 0: a frame ended and is flushed. A call that moved nothing says
         * what the next frame would need: not an answer about this one. */
        if (in.pos != before || o.pos)
            s->ended = rc == 0;
        int st = emit(f, i, f->c->buf[i], o.pos);
        if (st)
            return st;
        if (in.pos == in.size && o.pos < CODEC_CHUNK)
            return 0; /* all taken, nothing held back */
    }
}

static int feed_stage(const feed_t *f, size_t i, const char *data, size_t n) {
    return f->c->n[i].kind == C_ZSTD ? feed_zstd(f, i, data, n) : feed_zlib(f, i, data, n);
}

int ops_http_codec_feed(http_codec_t *c, const char *data, size_t n, ops_http_sink_fn sink,
                        void *user, char *why, size_t why_size) {
    feed_t f = {c, sink, user, why, why_size};
    return n ? feed_stage(&f, 0, data, n) : 0;
}

int ops_http_codec_end(const http_codec_t *c, char *why, size_t why_size) {
    for (size_t i = 0; i < c->count; i++)
        if (!c->n[i].ended) {
            snprintf(why, why_size,
                     "the request body is not valid %s data (Content-Encoding): the stream is "
                     "truncated",
                     c->n[i].name);
            return -1;
        }
    return 0;
}

/* ---- responses ---- */

/* q of a token's parameters ("; q=0.5"); 1 when absent. */
static double accept_q(const char *p, size_t n) {
    const char *q = memchr(p, ';', n);
    while (q && q < p + n) {
        q++;
        q += strspn(q, " \t");
        if ((q[0] == 'q' || q[0] == 'Q') && q[1] == '=')
            return strtod(q + 2, NULL);
        q = memchr(q, ';', (size_t)(p + n - q));
    }
    return 1.0;
}

const char *ops_http_codec_pick(const char *accept) {
    bool zstd = false, gzip = false;
    for (const char *p = accept ? accept : ""; *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ","), name = strcspn(p, " \t;,");
        if (!n)
            break;
        bool on = accept_q(p, n) > 0.0;
        if (name == 4 && strncasecmp(p, "zstd", 4) == 0)
            zstd = on;
        else if (name == 4 && strncasecmp(p, "gzip", 4) == 0)
            gzip = on;
        p += n;
    }
    return zstd ? "zstd" : gzip ? "gzip" : NULL;
}

bool ops_http_codec_compress(const char *coding, const char *in, size_t n, char **out,
                             size_t *out_n) {
    *out = NULL;
    if (strcmp(coding, "zstd") == 0) {
        size_t cap = ZSTD_compressBound(n);
        char  *z = malloc(cap);
        size_t zn = z ? ZSTD_compress(z, cap, in, n, 3) : 0;
        if (!z || ZSTD_isError(zn)) {
            free(z);
            return false;
        }
        *out = z, *out_n = zn;
        return true;
    }
    z_stream zs = {0};
    if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return false;
    size_t cap = deflateBound(&zs, (uLong)n);
    char  *z = malloc(cap);
    zs.next_in = (Bytef *)(uintptr_t)in;
    zs.avail_in = (uInt)n;
    zs.next_out = (Bytef *)z;
    zs.avail_out = (uInt)cap;
    bool ok = z && deflate(&zs, Z_FINISH) == Z_STREAM_END;
    *out_n = zs.total_out;
    deflateEnd(&zs);
    if (!ok) {
        free(z);
        return false;
    }
    *out = z;
    return true;
}
