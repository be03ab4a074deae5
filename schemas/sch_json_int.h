/*
 * sch_json_int.h -- private layout of the JSON values of schemas.h, shared by
 * sch_json.c (reader, arena, accessors) and sch_json_write.c (writers) and
 * nothing else (the request decoder uses the accessors).
 *
 * Every value of a document lives in the document's arena; strings and
 * integer texts live in one pool sized from the input, so a parse costs a
 * handful of mallocs whatever the number of values.
 */
#ifndef D3STREAM_SCH_JSON_INT_H
#define D3STREAM_SCH_JSON_INT_H

#include "schemas.h"

/* A string with its length: keys and string values may contain NUL. */
typedef struct sch_jstr {
    const char *p; /* NUL-terminated for convenience, but len is the truth */
    size_t      len;
} sch_jstr_t;

/* 24 bytes on LP64: a hostile 8 MB body of "[1,1,...]" holds 4M of them. */
struct sch_json {
    sch_jtype_t type;
    uint32_t    n; /* ARRAY/OBJECT: members (the reader refuses more) */
    union {
        bool       b; /* BOOL */
        double     d; /* REAL */
        sch_jstr_t s; /* STRING, INT (the integer's text as written) */
        struct {
            const sch_json_t *items; /* n values */
            /* OBJECT: n keys, unique, in first-seen order, followed in the
             * same allocation by n uint32_t: the key indexes in byte order
             * (see sch_json_sorted). NULL for arrays. */
            const sch_jstr_t *keys;
        } c;
    } u;
};

static inline const uint32_t *sch_json_sorted(const sch_json_t *v) {
    return (const uint32_t *)(const void *)(v->u.c.keys + v->n);
}

static inline bool sch_json_is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

/* An integer is zero when all its digits are: "0" or "-0" (JSON has no
 * leading zeros). */
static inline bool sch_json_int_is_zero(const sch_json_t *v) {
    const char *t = v->u.s.p;
    return strcmp(t, "0") == 0 || strcmp(t, "-0") == 0;
}

/* One malloc'd block of the document arena. */
typedef struct sch_jblock {
    struct sch_jblock *next;
    size_t             size; /* bytes in data */
    size_t             used;
    max_align_t        data[];
} sch_jblock_t;

struct sch_jdoc {
    sch_json_t    root;
    char         *pool;   /* decoded strings and integer texts */
    sch_jblock_t *blocks; /* containers' items, keys and indexes */
};

#endif /* D3STREAM_SCH_JSON_INT_H */
