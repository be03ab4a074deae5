/*
 * fuzz_codec.c -- libFuzzer harness for compressed request bodies
 * (ops/ops_http_codec.c). The first byte picks a Content-Encoding (gzip,
 * deflate, zstd, or two of them), the rest is the body, fed in pieces of
 * the second byte's size. Checks: the sink never gets more than the limit
 * (it stops the stream there), a refusal says why, and what a stream that
 * ends cleanly decodes to, re-encoded and decoded again, is the same.
 *
 *     tests/fuzz/run.sh [SECONDS]    # builds and runs every harness
 */
#include "ops_http_int.h"

#include "fuzz_util.h"

#define LIMIT 65536

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct sink {
    unsigned char buf[LIMIT];
    size_t        n;
    bool          stopped;
} sink_t;

static bool take(void *user, const char *p, size_t n) {
    sink_t *s = user;
    FUZZ_CHECK(!s->stopped); /* nothing after a stop */
    if (s->n + n > LIMIT) {
        s->stopped = true;
        return false;
    }
    memcpy(s->buf + s->n, p, n);
    s->n += n;
    return true;
}

/* Feeds body in pieces of step; 0 ended cleanly, else the failing code. */
static int decode(const char *coding, const uint8_t *body, size_t n, size_t step, sink_t *s) {
    http_codec_t *c = NULL;
    char          why[400] = "";
    FUZZ_CHECK(ops_http_codec_new(coding, LIMIT, &c, why, sizeof why) == 0 && c);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i += step)
        rc = ops_http_codec_feed(c, (const char *)body + i, n - i < step ? n - i : step, take, s,
                                 why, sizeof why);
    if (rc < 0)
        FUZZ_CHECK(why[0] != '\0');
    if (!rc && ops_http_codec_end(c, why, sizeof why) < 0) {
        FUZZ_CHECK(why[0] != '\0');
        rc = -1;
    }
    ops_http_codec_free(c);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const CODINGS[] = {"gzip", "deflate", "zstd", "gzip, zstd", "zstd, deflate"};
    static sink_t            s1, s2;
    if (size < 2)
        return 0;
    const char *coding = CODINGS[data[0] % 5];
    size_t      step = (size_t)data[1] + 1;
    s1.n = 0, s1.stopped = false;
    if (decode(coding, data + 2, size - 2, step, &s1) != 0 || coding[4] == ',' || coding[4] == ' ')
        return 0;
    /* A clean single stream: the same bytes compressed again decode to them. */
    char  *z = NULL;
    size_t zn = 0;
    if (strcmp(coding, "deflate") == 0 || s1.n == 0)
        return 0; /* ops_http_codec_compress writes gzip and zstd only */
    FUZZ_CHECK(ops_http_codec_compress(coding, (const char *)s1.buf, s1.n, &z, &zn));
    s2.n = 0, s2.stopped = false;
    FUZZ_CHECK(decode(coding, (const uint8_t *)z, zn, 4096, &s2) == 0);
    FUZZ_CHECK(s2.n == s1.n && memcmp(s1.buf, s2.buf, s1.n) == 0);
    free(z);
    return 0;
}
