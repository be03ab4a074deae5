/*
 * svc.h -- what every d3stream module shares: error codes, asserts, logging
 * and a size-capped growable byte buffer.
 *
 * Header-only so that the lowest modules (schemas/, npu/) can use it without
 * depending on ops/. Nothing here allocates behind the caller's back except
 * svc_buf, whose cap is set by its owner.
 */
#ifndef D3STREAM_SVC_H
#define D3STREAM_SVC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#define SVC_WUR       __attribute__((warn_unused_result))
#define SVC_FMT(a, b) __attribute__((format(printf, a, b)))

/* Project-wide error codes: 0 is success, failures are negative.
 * Append only; the numbers are part of logs and metrics. */
typedef enum svc_err {
    SVC_OK = 0,
    SVC_ERR_INVALID = -1,   /* bad input from a user or a file */
    SVC_ERR_NOMEM = -2,     /* allocation failed or a cap was hit */
    SVC_ERR_IO = -3,        /* open/read/write failed */
    SVC_ERR_FORMAT = -4,    /* a file is not in the expected format */
    SVC_ERR_TOO_LARGE = -5, /* input over a configured limit */
    SVC_ERR_UNSUPPORTED = -6,
    SVC_ERR_INTERNAL = -7,   /* a broken invariant reported, not asserted */
    SVC_ERR_RETRIABLE = -8,  /* transient (broker, timeout): the same call may succeed later */
    SVC_ERR_TXN_ABORT = -9,  /* the transaction must be aborted and redone */
    SVC_ERR_FATAL = -10,     /* the handle is unusable (fenced, idempotence broken): rebuild it */
    SVC_ERR_CANCELLED = -11, /* the caller withdrew the work (its client went away) */
} svc_err_t;

static inline const char *svc_err_name(svc_err_t err) {
    switch (err) {
    case SVC_OK:
        return "OK";
    case SVC_ERR_INVALID:
        return "INVALID";
    case SVC_ERR_NOMEM:
        return "NOMEM";
    case SVC_ERR_IO:
        return "IO";
    case SVC_ERR_FORMAT:
        return "FORMAT";
    case SVC_ERR_TOO_LARGE:
        return "TOO_LARGE";
    case SVC_ERR_UNSUPPORTED:
        return "UNSUPPORTED";
    case SVC_ERR_INTERNAL:
        return "INTERNAL";
    case SVC_ERR_RETRIABLE:
        return "RETRIABLE";
    case SVC_ERR_TXN_ABORT:
        return "TXN_ABORT";
    case SVC_ERR_FATAL:
        return "FATAL";
    case SVC_ERR_CANCELLED:
        return "CANCELLED";
    }
    return "UNKNOWN";
}

/* Retriable: the same call may succeed later (memory pressure, a broker). */
static inline bool svc_err_is_retriable(svc_err_t err) {
    return err == SVC_ERR_NOMEM || err == SVC_ERR_RETRIABLE;
}

/* Fatal: the handle that returned it can do nothing more; rebuild it. */
static inline bool svc_err_is_fatal(svc_err_t err) {
    return err == SVC_ERR_FATAL;
}

/* Broken invariants abort with file:line; bad input never reaches here. */
#define SVC_ASSERT(x)                                                                              \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Writes a formatted message into errstr (may be NULL or of size 0). */
SVC_FMT(3, 4)
static inline void svc_errf(char *errstr, size_t errstr_size, const char *fmt, ...) {
    if (!errstr || errstr_size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* ---- svc_buf: a growable byte buffer with a hard cap (curl dynbuf) ---- */

typedef struct svc_buf {
    char  *data; /* NUL-terminated when len > 0 or after svc_buf_cstr */
    size_t len;
    size_t cap; /* allocated bytes */
    size_t max; /* never grow past this many bytes of content */
} svc_buf_t;

static inline void svc_buf_init(svc_buf_t *b, size_t max) {
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

static inline void svc_buf_fini(svc_buf_t *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static inline void svc_buf_reset(svc_buf_t *b) {
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

/* Takes the content; the caller frees it. The buffer is left empty. */
static inline char *svc_buf_steal(svc_buf_t *b, size_t *len) {
    char *d = b->data;
    if (!d)
        d = calloc(1, 1);
    if (len)
        *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

/* Makes room for n more bytes (+ NUL). SVC_ERR_TOO_LARGE past max. */
SVC_WUR static inline svc_err_t svc_buf_reserve(svc_buf_t *b, size_t n) {
    if (n > b->max || b->len > b->max - n)
        return SVC_ERR_TOO_LARGE;
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return SVC_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *d = realloc(b->data, cap);
    if (!d)
        return SVC_ERR_NOMEM;
    b->data = d;
    b->cap = cap;
    return SVC_OK;
}

SVC_WUR static inline svc_err_t svc_buf_add(svc_buf_t *b, const void *p, size_t n) {
    svc_err_t err = svc_buf_reserve(b, n);
    if (err)
        return err;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return SVC_OK;
}

SVC_WUR static inline svc_err_t svc_buf_adds(svc_buf_t *b, const char *s) {
    return svc_buf_add(b, s, strlen(s));
}

SVC_WUR static inline svc_err_t svc_buf_addc(svc_buf_t *b, char c) {
    return svc_buf_add(b, &c, 1);
}

SVC_FMT(2, 3) SVC_WUR static inline svc_err_t svc_buf_addf(svc_buf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return SVC_ERR_INTERNAL;
    svc_err_t err = svc_buf_reserve(b, (size_t)n);
    if (err)
        return err;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return SVC_OK;
}

/* Reads a whole file (or stdin when path is NULL or "-") into b, refusing
 * more than b->max bytes: then SVC_ERR_TOO_LARGE with exactly b->max bytes
 * kept. errstr says which file and why. */
SVC_WUR static inline svc_err_t svc_buf_read_file(svc_buf_t *b, const char *path, char *errstr,
                                                  size_t errstr_size) {
    bool  is_stdin = !path || strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        svc_errf(errstr, errstr_size, "open() \"%s\" failed: %s", path, strerror(errno));
        return SVC_ERR_IO;
    }
    svc_err_t err = SVC_OK;
    char      chunk[65536];
    size_t    n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        /* Keep what fits, so the caller sees exactly max bytes when the input
         * is larger (and can tell "too large" from a short read). */
        size_t fit = n < b->max - b->len ? n : b->max - b->len;
        err = svc_buf_add(b, chunk, fit);
        if (!err && fit < n)
            err = SVC_ERR_TOO_LARGE;
        if (err) {
            svc_errf(errstr, errstr_size, "read \"%s\": larger than %zu bytes",
                     is_stdin ? "<stdin>" : path, b->max);
            break;
        }
    }
    if (!err && ferror(f)) {
        svc_errf(errstr, errstr_size, "read() \"%s\" failed: %s", is_stdin ? "<stdin>" : path,
                 strerror(errno));
        err = SVC_ERR_IO;
    }
    if (!err && !b->data)
        err = svc_buf_add(b, "", 0); /* an empty file is an empty, NUL-terminated string */
    if (!is_stdin)
        fclose(f);
    return err;
}

#endif /* D3STREAM_SVC_H */
