/*
 * sch_json_int.h -- private layout of the JSON values of schemas.h, shared by
 * sch_json.c and nothing else yet (the request decoder uses the accessors).
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

struct sch_json {
    sch_jtype_t type;
    union {
        bool       b; /* BOOL */
        double     d; /* REAL */
        sch_jstr_t s; /* STRING, INT (the integer's text as written) */
        struct {
            const sch_json_t *items;  /* n values */
            const sch_jstr_t *keys;   /* OBJECT: n keys, unique, first-seen order */
            const uint32_t   *sorted; /* OBJECT: indexes of keys in byte order */
            size_t            n;
        } c; /* ARRAY, OBJECT */
    } u;
};

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
