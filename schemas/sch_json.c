/*
 * sch_json.c -- JSON values with the semantics of Python 3.11's json module
 * (SPEC a.1, b.2, b.3, c.4): the reader, which mirrors
 * `json.loads(body.decode())` (the C scanner of Modules/_json.c, error texts
 * included), its arena and the accessors. The writers, which mirror
 * `json.dumps(..., ensure_ascii=False)` and `repr(float)`, are in
 * sch_json_write.c.
 *
 * The reader is iterative: containers are tracked in a fixed array of
 * SCH_JSON_MAX_DEPTH frames and their members wait on a heap stack until the
 * closing bracket, when they are copied into the document's arena. Nothing
 * recurses on input, so hostile nesting costs no stack. The writers recurse,
 * but only over parsed values, whose depth the reader bounds.
 *
 * Assumes LC_NUMERIC is "C" (the process never calls setlocale): strtod is
 * used for doubles.
 */
#include "sch_json_int.h"

#include <math.h>

/* Python's default sys.get_int_max_str_digits() (CVE-2020-10735): json.loads
 * raises ValueError for a longer integer, which upstream reports as not JSON. */
#define JSON_INT_MAX_DIGITS 4300

/* Objects up to this size are searched linearly; larger ones bisect. */
#define JSON_LINEAR_KEYS 16

#define JSON_BLOCK_MIN ((size_t)16384)

/* ---------------------------------------------------------------------
 * Arena
 * --------------------------------------------------------------------- */

/* Bump allocation from the newest block; a new block at least doubles the
 * last one so a document of any size costs O(log n) mallocs. */
static void *arena_alloc(sch_jdoc_t *doc, size_t n) {
    const size_t align = _Alignof(max_align_t);
    n = (n + align - 1) & ~(align - 1);
    sch_jblock_t *blk = doc->blocks;
    if (!blk || blk->size - blk->used < n) {
        size_t size = blk ? blk->size * 2 : JSON_BLOCK_MIN;
        if (size < n)
            size = n;
        if (size > SIZE_MAX - sizeof(sch_jblock_t))
            return NULL;
        blk = malloc(sizeof(sch_jblock_t) + size);
        if (!blk)
            return NULL;
        blk->next = doc->blocks;
        blk->size = size;
        blk->used = 0;
        doc->blocks = blk;
    }
    void *p = (char *)blk->data + blk->used;
    blk->used += n;
    return p;
}

void sch_jdoc_free(sch_jdoc_t *doc) {
    if (!doc)
        return;
    sch_jblock_t *blk = doc->blocks;
    while (blk) {
        sch_jblock_t *next = blk->next;
        free(blk);
        blk = next;
    }
    free(doc->pool);
    free(doc);
}

const sch_json_t *sch_jdoc_root(const sch_jdoc_t *doc) {
    return &doc->root;
}

/* ---------------------------------------------------------------------
 * UTF-8 check, as CPython's strict decoder (Objects/stringlib/codecs.h)
 * --------------------------------------------------------------------- */

static bool is_cont(unsigned char c) {
    return (c & 0xC0) == 0x80;
}

/* Returns how many bytes of the sequence at s are bad: 0 when it is a valid
 * character (*step set), else -1 for "invalid start byte", -2 for "unexpected
 * end of data", or n >= 1 for "invalid continuation byte" covering n bytes.
 * E0/ED/F0/F4 narrow their second byte, which rejects overlongs, surrogates
 * and code points past U+10FFFF at the lead byte, as CPython does. */
static int utf8_seq(const unsigned char *s, size_t left, size_t *step) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *step = 1;
        return 0;
    }
    if (c < 0xC2 || c > 0xF4)
        return -1;
    size_t        need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    for (size_t i = 1; i < need; i++) {
        if (i >= left)
            return -2;
        bool ok = i == 1 ? s[i] >= lo && s[i] <= hi : is_cont(s[i]);
        if (!ok)
            return (int)i;
    }
    *step = need;
    return 0;
}

/* UnicodeDecodeError.__str__: one byte is named, a range is not. */
static bool utf8_check(const unsigned char *s, size_t len, char *msg, size_t msg_size) {
    size_t pos = 0;
    while (pos < len) {
        size_t step = 0;
        int    bad = utf8_seq(s + pos, len - pos, &step);
        if (bad == 0) {
            pos += step;
            continue;
        }
        const char *why = bad == -1   ? "invalid start byte"
                          : bad == -2 ? "unexpected end of data"
                                      : "invalid continuation byte";
        size_t      end = bad == -1 ? pos + 1 : bad == -2 ? len : pos + (size_t)bad;
        if (end - pos == 1)
            svc_errf(msg, msg_size, "'utf-8' codec can't decode byte 0x%02x in position %zu: %s",
                     s[pos], pos, why);
        else
            svc_errf(msg, msg_size, "'utf-8' codec can't decode bytes in position %zu-%zu: %s", pos,
                     end - 1, why);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------------
 * Reader state and errors
 * --------------------------------------------------------------------- */

/* A growable stack of n items of `size` bytes: members waiting for their
 * container to close (values, and keys for objects). */
typedef struct jstack {
    void  *items;
    size_t n;
    size_t cap;
} jstack_t;

typedef struct jframe {
    bool       is_object;
    size_t     base_val; /* first member value on p->vals */
    size_t     base_key; /* first member key on p->keys */
    sch_jstr_t key;      /* the key whose value is being read */
} jframe_t;

typedef struct jparser {
    const unsigned char *s;
    size_t               len;
    size_t               pos; /* byte offset; messages count code points */
    sch_jdoc_t          *doc;
    size_t               pool_used;
    size_t               pool_cap;
    jstack_t             vals;    /* sch_json_t */
    jstack_t             keys;    /* sch_jstr_t */
    uint32_t            *scratch; /* object closing: 3 * n indexes */
    size_t               cap_scratch;
    jframe_t             frames[SCH_JSON_MAX_DEPTH];
    size_t               depth;
    bool                 lone_surrogate;
    sch_jfail_t          fail;
    char                *msg;
    size_t               msg_size;
} jparser_t;

typedef enum jstep {
    J_FAIL = 0,
    J_DONE = 1, /* a whole value was read */
    J_MORE = 2, /* p->pos is at the start of the next value to read */
} jstep_t;

static size_t count_chars(const unsigned char *s, size_t n) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += !is_cont(s[i]);
    return chars;
}

/* JSONDecodeError.__str__: "msg: line L column C (char P)", where P counts
 * code points and C is P minus the index of the last newline before it. */
static jstep_t fail_at(jparser_t *p, const char *what, size_t pos) {
    size_t line = 1;
    size_t nl = 0; /* one past the last newline */
    for (size_t i = 0; i < pos; i++) {
        if (p->s[i] == '\n') {
            line++;
            nl = i + 1;
        }
    }
    size_t chars = count_chars(p->s, pos);
    size_t col = count_chars(p->s + nl, pos - nl) + 1;
    p->fail = SCH_JFAIL_SYNTAX;
    svc_errf(p->msg, p->msg_size, "%s: line %zu column %zu (char %zu)", what, line, col, chars);
    return J_FAIL;
}

static jstep_t fail_with(jparser_t *p, sch_jfail_t fail, const char *msg) {
    p->fail = fail;
    svc_errf(p->msg, p->msg_size, "%s", msg);
    return J_FAIL;
}

static jstep_t fail_nomem(jparser_t *p) {
    return fail_with(p, SCH_JFAIL_NOMEM, "out of memory while parsing JSON");
}

static bool is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void skip_ws(jparser_t *p) {
    while (p->pos < p->len && is_ws(p->s[p->pos]))
        p->pos++;
}

static bool at(const jparser_t *p, char c) {
    return p->pos < p->len && p->s[p->pos] == (unsigned char)c;
}

/* The pool holds every decoded string and integer text; a token starting at
 * `start` never needs more than len - start + 1 bytes (see sch_json_parse),
 * so running out means a bug, reported rather than overflowed. */
static char *pool_reserve(jparser_t *p, size_t start) {
    size_t need = p->len - start + 1;
    if (p->pool_cap - p->pool_used < need)
        return NULL;
    return p->doc->pool + p->pool_used;
}

/* ---------------------------------------------------------------------
 * Strings (scanstring_unicode)
 * --------------------------------------------------------------------- */

static int hex_val(unsigned char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Four hex digits at i (the caller checked they exist); -1 if one is not. */
static long hex4(const unsigned char *s, size_t i) {
    long v = 0;
    for (size_t k = 0; k < 4; k++) {
        int h = hex_val(s[i + k]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* Code points as UTF-8. A lone surrogate is written as its 3-byte form; the
 * document is refused at the end anyway (SCH_JFAIL_SURROGATE). */
static size_t put_utf8(char *out, unsigned long cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A \uXXXX escape whose 'u' is at u; joins a following low surrogate the way
 * _json.c does (only when one more character follows the pair). */
static jstep_t scan_uescape(jparser_t *p, size_t u, size_t *end, unsigned long *cp) {
    const unsigned char *s = p->s;
    if (u + 5 >= p->len)
        return fail_at(p, "Invalid \\uXXXX escape", u);
    long c = hex4(s, u + 1);
    if (c < 0)
        return fail_at(p, "Invalid \\uXXXX escape", u);
    *end = u + 5;
    *cp = (unsigned long)c;
    bool high = c >= 0xD800 && c <= 0xDBFF;
    if (high && *end + 6 < p->len && s[*end] == '\\' && s[*end + 1] == 'u') {
        long c2 = hex4(s, *end + 2);
        if (c2 < 0)
            return fail_at(p, "Invalid \\uXXXX escape", *end + 1);
        if (c2 >= 0xDC00 && c2 <= 0xDFFF) {
            *cp = 0x10000 + (((unsigned long)c - 0xD800) << 10) + ((unsigned long)c2 - 0xDC00);
            *end += 6;
        }
    }
    if (*cp >= 0xD800 && *cp <= 0xDFFF)
        p->lone_surrogate = true;
    return J_DONE;
}

/* One escape whose backslash is at bs; appends its UTF-8 to out. */
static jstep_t scan_escape(jparser_t *p, size_t begin, size_t bs, char *out, size_t *n_out,
                           size_t *end) {
    if (bs + 1 == p->len)
        return fail_at(p, "Unterminated string starting at", begin);
    unsigned char c = p->s[bs + 1];
    if (c == 'u') {
        unsigned long cp = 0;
        if (scan_uescape(p, bs + 1, end, &cp) == J_FAIL)
            return J_FAIL;
        *n_out += put_utf8(out + *n_out, cp);
        return J_DONE;
    }
    static const char from[] = "\"\\/bfnrt";
    static const char to[] = "\"\\/\b\f\n\r\t";
    const char       *hit = c ? strchr(from, c) : NULL;
    if (!hit)
        return fail_at(p, "Invalid \\escape", bs);
    out[(*n_out)++] = to[hit - from];
    *end = bs + 2;
    return J_DONE;
}

/* The string whose opening quote is at p->pos, decoded into the pool. */
static jstep_t scan_string(jparser_t *p, sch_jstr_t *str) {
    size_t begin = p->pos;
    char  *out = pool_reserve(p, begin);
    if (!out)
        return fail_nomem(p);
    size_t n = 0;
    size_t i = begin + 1;
    for (;;) {
        size_t run = i;
        while (i < p->len && p->s[i] != '"' && p->s[i] != '\\') {
            if (p->s[i] <= 0x1F)
                return fail_at(p, "Invalid control character at", i);
            i++;
        }
        memcpy(out + n, p->s + run, i - run);
        n += i - run;
        if (i == p->len)
            return fail_at(p, "Unterminated string starting at", begin);
        if (p->s[i] == '"')
            break;
        if (scan_escape(p, begin, i, out, &n, &i) == J_FAIL)
            return J_FAIL;
    }
    out[n] = '\0';
    p->pool_used += n + 1;
    str->p = out;
    str->len = n;
    p->pos = i + 1;
    return J_DONE;
}

/* ---------------------------------------------------------------------
 * Numbers and literals (_match_number_unicode, scan_once_unicode)
 * --------------------------------------------------------------------- */

static size_t skip_digits(const jparser_t *p, size_t i) {
    while (i < p->len && sch_json_is_digit(p->s[i]))
        i++;
    return i;
}

/* Matches (-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)? at p->pos; returns the
 * end, or p->pos when there is no number. */
static size_t match_number(const jparser_t *p, bool *is_real) {
    size_t i = p->pos;
    if (i < p->len && p->s[i] == '-')
        i++;
    if (i >= p->len || !sch_json_is_digit(p->s[i]))
        return p->pos;
    i = p->s[i] == '0' ? i + 1 : skip_digits(p, i);
    *is_real = false;
    if (i + 1 < p->len && p->s[i] == '.' && sch_json_is_digit(p->s[i + 1])) {
        i = skip_digits(p, i + 1);
        *is_real = true;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        size_t e = i + 1;
        if (e < p->len && (p->s[e] == '+' || p->s[e] == '-'))
            e++;
        if (e < p->len && sch_json_is_digit(p->s[e])) {
            i = skip_digits(p, e);
            *is_real = true;
        }
    }
    return i;
}

static jstep_t scan_number(jparser_t *p, sch_json_t *v) {
    bool   is_real = false;
    size_t start = p->pos;
    size_t end = match_number(p, &is_real);
    if (end == start)
        return fail_at(p, "Expecting value", start);
    size_t n = end - start;
    char  *text = pool_reserve(p, start);
    if (!text)
        return fail_nomem(p);
    memcpy(text, p->s + start, n);
    text[n] = '\0';
    p->pos = end;
    if (is_real) {
        /* The pool copy is scratch here: strtod needs the NUL, Python's
         * float() rounds correctly like glibc's, and overflow gives inf. */
        v->type = SCH_JSON_REAL;
        v->u.d = strtod(text, NULL);
        return J_DONE;
    }
    size_t digits = n - (text[0] == '-');
    if (digits > JSON_INT_MAX_DIGITS) {
        p->fail = SCH_JFAIL_SYNTAX;
        svc_errf(p->msg, p->msg_size,
                 "Exceeds the limit (%d digits) for integer string conversion: value has %zu "
                 "digits; use sys.set_int_max_str_digits() to increase the limit",
                 JSON_INT_MAX_DIGITS, digits);
        return J_FAIL;
    }
    p->pool_used += n + 1;
    v->type = SCH_JSON_INT;
    v->u.s.p = text;
    v->u.s.len = n;
    return J_DONE;
}

static bool match_word(const jparser_t *p, const char *word) {
    size_t n = strlen(word);
    return p->len - p->pos >= n && memcmp(p->s + p->pos, word, n) == 0;
}

/* null/true/false/NaN/Infinity/-Infinity; false when none is here. */
static bool scan_literal(jparser_t *p, sch_json_t *v) {
    static const struct {
        const char *word;
        sch_jtype_t type;
        double      d;
        bool        b;
    } lits[] = {
        {"null", SCH_JSON_NULL, 0, false},
        {"true", SCH_JSON_BOOL, 0, true},
        {"false", SCH_JSON_BOOL, 0, false},
        {"NaN", SCH_JSON_REAL, NAN, false},
        {"Infinity", SCH_JSON_REAL, INFINITY, false},
        {"-Infinity", SCH_JSON_REAL, -INFINITY, false},
    };
    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        if (!match_word(p, lits[i].word))
            continue;
        v->type = lits[i].type;
        if (lits[i].type == SCH_JSON_REAL)
            v->u.d = lits[i].d;
        else
            v->u.b = lits[i].b;
        p->pos += strlen(lits[i].word);
        return true;
    }
    return false;
}

/* ---------------------------------------------------------------------
 * Containers
 * --------------------------------------------------------------------- */

static bool stack_push(jstack_t *st, const void *item, size_t size) {
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        if (cap > SIZE_MAX / size)
            return false;
        void *items = realloc(st->items, cap * size);
        if (!items)
            return false;
        st->items = items;
        st->cap = cap;
    }
    memcpy((char *)st->items + st->n * size, item, size);
    st->n++;
    return true;
}

static bool members_push(jparser_t *p, const sch_json_t *v) {
    const jframe_t *f = &p->frames[p->depth - 1];
    if (f->is_object && !stack_push(&p->keys, &f->key, sizeof f->key))
        return false;
    return stack_push(&p->vals, v, sizeof *v);
}

/* Byte order of UTF-8 is code point order, which is how Python sorts str. */
static int key_cmp(const sch_jstr_t *a, const sch_jstr_t *b) {
    size_t n = a->len < b->len ? a->len : b->len;
    int    c = n ? memcmp(a->p, b->p, n) : 0;
    if (c)
        return c;
    return (a->len > b->len) - (a->len < b->len);
}

/* Stable bottom-up merge sort of member indexes by key: O(n log n) whatever
 * the keys, so hostile objects cannot make closing them quadratic. */
static void sort_by_key(const sch_jstr_t *keys, uint32_t *idx, uint32_t *tmp, size_t n) {
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n;
            size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo;
            size_t b = mid;
            size_t k = lo;
            while (a < mid && b < hi)
                tmp[k++] = key_cmp(&keys[idx[b]], &keys[idx[a]]) < 0 ? idx[b++] : idx[a++];
            while (a < mid)
                tmp[k++] = idx[a++];
            while (b < hi)
                tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}

static bool scratch_reserve(jparser_t *p, size_t n) {
    if (n <= p->cap_scratch)
        return true;
    if (n > SIZE_MAX / sizeof(uint32_t))
        return false;
    uint32_t *s = realloc(p->scratch, n * sizeof *s);
    if (!s)
        return false;
    p->scratch = s;
    p->cap_scratch = n;
    return true;
}

/* Python dict semantics for n members (mk[i], mv[i]): a repeated key keeps
 * its first position and takes its last value. Fills the object's items,
 * keys and sorted index in the arena. */
static bool build_object(jparser_t *p, const sch_jstr_t *mk, const sch_json_t *mv, size_t n,
                         sch_json_t *v) {
    v->type = SCH_JSON_OBJECT;
    v->n = 0;
    v->u.c.items = NULL;
    v->u.c.keys = NULL;
    if (n == 0)
        return true;
    if (n > UINT32_MAX || !scratch_reserve(p, 3 * n))
        return false;
    uint32_t *idx = p->scratch;
    uint32_t *tmp = idx + n;
    uint32_t *last = tmp + n; /* for a first occurrence, its last; else UINT32_MAX */
    for (size_t i = 0; i < n; i++) {
        idx[i] = (uint32_t)i;
        last[i] = UINT32_MAX;
    }
    sort_by_key(mk, idx, tmp, n);
    size_t n_keys = 0;
    for (size_t g = 0; g < n; n_keys++) {
        size_t e = g + 1;
        while (e < n && key_cmp(&mk[idx[g]], &mk[idx[e]]) == 0)
            e++;
        last[idx[g]] = idx[e - 1]; /* stable sort: idx[g] is the first */
        idx[n_keys] = idx[g];      /* groups in key order, by first member */
        g = e;
    }
    sch_json_t *items = arena_alloc(p->doc, n_keys * sizeof *items);
    sch_jstr_t *keys = arena_alloc(p->doc, n_keys * (sizeof *keys + sizeof(uint32_t)));
    if (!items || !keys)
        return false;
    uint32_t *sorted = (uint32_t *)(void *)(keys + n_keys); /* sch_json_sorted */
    uint32_t *out_pos = tmp;
    size_t    j = 0;
    for (size_t i = 0; i < n; i++) {
        if (last[i] == UINT32_MAX)
            continue;
        keys[j] = mk[i];
        items[j] = mv[last[i]];
        out_pos[i] = (uint32_t)j++;
    }
    for (size_t g = 0; g < n_keys; g++)
        sorted[g] = out_pos[idx[g]];
    v->u.c.items = items;
    v->u.c.keys = keys;
    v->n = (uint32_t)n_keys;
    return true;
}

static bool build_array(jparser_t *p, const sch_json_t *mv, size_t n, sch_json_t *v) {
    sch_json_t *items = NULL;
    if (n) {
        if (n > UINT32_MAX)
            return false;
        items = arena_alloc(p->doc, n * sizeof *items);
        if (!items)
            return false;
        memcpy(items, mv, n * sizeof *items);
    }
    v->type = SCH_JSON_ARRAY;
    v->n = (uint32_t)n;
    v->u.c.items = items;
    v->u.c.keys = NULL;
    return true;
}

/* Pops the innermost container (its closing bracket is at p->pos). */
static jstep_t close_container(jparser_t *p, sch_json_t *v) {
    jframe_t         *f = &p->frames[--p->depth];
    size_t            n = p->vals.n - f->base_val;
    const sch_json_t *mv = n ? (const sch_json_t *)p->vals.items + f->base_val : NULL;
    const sch_jstr_t *mk =
        n && f->is_object ? (const sch_jstr_t *)p->keys.items + f->base_key : NULL;
    bool ok = f->is_object ? build_object(p, mk, mv, n, v) : build_array(p, mv, n, v);
    if (!ok)
        return fail_nomem(p);
    p->vals.n = f->base_val;
    p->keys.n = f->base_key;
    p->pos++;
    return J_DONE;
}

/* An object member's key and ':' (_parse_object_unicode); leaves p->pos at
 * the value. */
static jstep_t scan_key(jparser_t *p) {
    if (!at(p, '"'))
        return fail_at(p, "Expecting property name enclosed in double quotes", p->pos);
    jframe_t *f = &p->frames[p->depth - 1];
    if (scan_string(p, &f->key) == J_FAIL)
        return J_FAIL;
    skip_ws(p);
    if (!at(p, ':'))
        return fail_at(p, "Expecting ':' delimiter", p->pos);
    p->pos++;
    skip_ws(p);
    return J_MORE;
}

/* '[' or '{' at p->pos. */
static jstep_t open_container(jparser_t *p, sch_json_t *v) {
    bool is_object = p->s[p->pos] == '{';
    if (p->depth == SCH_JSON_MAX_DEPTH)
        return fail_with(p, SCH_JFAIL_TOO_DEEP, "nesting deeper than 256 levels");
    jframe_t *f = &p->frames[p->depth++];
    f->is_object = is_object;
    f->base_val = p->vals.n;
    f->base_key = p->keys.n;
    f->key.p = NULL;
    f->key.len = 0;
    p->pos++;
    skip_ws(p);
    if (at(p, is_object ? '}' : ']'))
        return close_container(p, v);
    return is_object ? scan_key(p) : J_MORE;
}

/* scan_once_unicode: the value starting exactly at p->pos. */
static jstep_t scan_value(jparser_t *p, sch_json_t *v) {
    if (p->pos >= p->len)
        return fail_at(p, "Expecting value", p->pos);
    unsigned char c = p->s[p->pos];
    if (c == '"') {
        v->type = SCH_JSON_STRING;
        return scan_string(p, &v->u.s);
    }
    if (c == '[' || c == '{')
        return open_container(p, v);
    if (scan_literal(p, v))
        return J_DONE;
    return scan_number(p, v);
}

/* After a member: ',' and the next member, or the closing bracket. */
static jstep_t after_member(jparser_t *p, sch_json_t *v) {
    jframe_t *f = &p->frames[p->depth - 1];
    skip_ws(p);
    if (at(p, f->is_object ? '}' : ']'))
        return close_container(p, v);
    if (!at(p, ','))
        return fail_at(p, "Expecting ',' delimiter", p->pos);
    p->pos++;
    skip_ws(p);
    return f->is_object ? scan_key(p) : J_MORE;
}

/* true when s holds a lone surrogate: its 3-byte form (ED A0..BF), which
 * only a \u escape can have put there (the UTF-8 check refuses it). */
static bool has_surrogate(const char *s, size_t n) {
    for (const char *e = memchr(s, 0xED, n); e; e = memchr(e + 1, 0xED, n - (size_t)(e + 1 - s)))
        if (e + 1 < s + n && (unsigned char)e[1] >= 0xA0)
            return true;
    return false;
}

/* Whether a string the document keeps holds a lone surrogate. Upstream
 * re-encodes the parsed body, so the value of a repeated key that a later
 * one replaced does not count. Recursion is bounded by SCH_JSON_MAX_DEPTH. */
static bool kept_surrogate(const sch_json_t *v) {
    size_t len;
    switch (sch_json_type(v)) {
    case SCH_JSON_STRING: {
        const char *str = sch_json_string(v, &len);
        return has_surrogate(str, len);
    }
    case SCH_JSON_OBJECT:
        for (size_t i = 0; i < sch_json_size(v); i++) {
            const char *k = sch_json_key_at(v, i, &len);
            if (has_surrogate(k, len) || kept_surrogate(sch_json_at(v, i)))
                return true;
        }
        return false;
    case SCH_JSON_ARRAY:
        for (size_t i = 0; i < sch_json_size(v); i++)
            if (kept_surrogate(sch_json_at(v, i)))
                return true;
        return false;
    default:
        return false;
    }
}

/* JSONDecoder.decode: whitespace, one value, whitespace, end of text. */
static bool parse_document(jparser_t *p) {
    skip_ws(p);
    for (;;) {
        sch_json_t v;
        jstep_t    step = scan_value(p, &v);
        while (step == J_DONE && p->depth > 0) {
            if (!members_push(p, &v))
                return fail_nomem(p);
            step = after_member(p, &v);
        }
        if (step == J_FAIL)
            return false;
        if (step == J_DONE) {
            p->doc->root = v;
            break;
        }
    }
    skip_ws(p);
    if (p->pos != p->len)
        return fail_at(p, "Extra data", p->pos);
    /* json.loads accepts lone surrogates; upstream refuses them afterwards,
     * so only an otherwise valid document gets this error. */
    if (p->lone_surrogate && kept_surrogate(&p->doc->root))
        return fail_with(p, SCH_JFAIL_SURROGATE, "the request contains an unpaired surrogate");
    return true;
}

sch_jdoc_t *sch_json_parse(const char *text, size_t len, sch_jfail_t *fail, char *msg,
                           size_t msg_size) {
    const unsigned char *s = (const unsigned char *)text;
    if (msg && msg_size)
        msg[0] = '\0';
    *fail = SCH_JFAIL_UTF8;
    if (!utf8_check(s, len, msg, msg_size))
        return NULL;
    jparser_t p = {.s = s, .len = len, .msg = msg, .msg_size = msg_size};
    if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
        /* json.loads refuses a str that starts with U+FEFF. */
        fail_at(&p, "Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
        *fail = p.fail;
        return NULL;
    }
    /* Every token's pool bytes (text + NUL) fit in its raw bytes plus the
     * delimiter that must follow it, so len + 1 bytes hold them all. */
    p.doc = calloc(1, sizeof *p.doc);
    p.pool_cap = len + 1;
    if (p.doc)
        p.doc->pool = malloc(p.pool_cap);
    bool ok = p.doc && p.doc->pool && parse_document(&p);
    if (!ok && (!p.doc || !p.doc->pool))
        fail_nomem(&p);
    free(p.vals.items);
    free(p.keys.items);
    free(p.scratch);
    *fail = ok ? SCH_JFAIL_NONE : p.fail;
    if (!ok) {
        sch_jdoc_free(p.doc);
        return NULL;
    }
    return p.doc;
}

/* ---------------------------------------------------------------------
 * Accessors
 * --------------------------------------------------------------------- */

sch_jtype_t sch_json_type(const sch_json_t *v) {
    return v->type;
}

bool sch_json_bool(const sch_json_t *v) {
    SVC_ASSERT(v->type == SCH_JSON_BOOL);
    return v->u.b;
}

const char *sch_json_string(const sch_json_t *v, size_t *len) {
    SVC_ASSERT(v->type == SCH_JSON_STRING);
    if (len)
        *len = v->u.s.len;
    return v->u.s.p;
}

const char *sch_json_int_text(const sch_json_t *v, size_t *len) {
    SVC_ASSERT(v->type == SCH_JSON_INT);
    if (len)
        *len = v->u.s.len;
    return v->u.s.p;
}

double sch_json_number(const sch_json_t *v) {
    if (v->type == SCH_JSON_REAL)
        return v->u.d;
    SVC_ASSERT(v->type == SCH_JSON_INT);
    return strtod(v->u.s.p, NULL);
}

static bool is_container(const sch_json_t *v) {
    return v->type == SCH_JSON_ARRAY || v->type == SCH_JSON_OBJECT;
}

size_t sch_json_size(const sch_json_t *v) {
    return is_container(v) ? v->n : 0;
}

const sch_json_t *sch_json_at(const sch_json_t *v, size_t i) {
    SVC_ASSERT(is_container(v) && i < v->n);
    return &v->u.c.items[i];
}

const char *sch_json_key_at(const sch_json_t *v, size_t i, size_t *len) {
    SVC_ASSERT(v->type == SCH_JSON_OBJECT && i < v->n);
    if (len)
        *len = v->u.c.keys[i].len;
    return v->u.c.keys[i].p;
}

const sch_json_t *sch_json_get(const sch_json_t *v, const char *key, size_t len) {
    if (v->type != SCH_JSON_OBJECT)
        return NULL;
    const sch_jstr_t  want = {key, len};
    const sch_jstr_t *keys = v->u.c.keys;
    size_t            n = v->n;
    if (n <= JSON_LINEAR_KEYS) {
        for (size_t i = 0; i < n; i++) {
            if (keys[i].len == len && (len == 0 || memcmp(keys[i].p, key, len) == 0))
                return &v->u.c.items[i];
        }
        return NULL;
    }
    const uint32_t *sorted = sch_json_sorted(v);
    size_t          lo = 0;
    size_t          hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int    c = key_cmp(&keys[sorted[mid]], &want);
        if (c == 0)
            return &v->u.c.items[sorted[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

bool sch_json_truthy(const sch_json_t *v) {
    switch (v->type) {
    case SCH_JSON_NULL:
        return false;
    case SCH_JSON_BOOL:
        return v->u.b;
    case SCH_JSON_INT:
        return !sch_json_int_is_zero(v);
    case SCH_JSON_REAL:
        return v->u.d != 0.0; /* NaN != 0: truthy, as in Python */
    case SCH_JSON_STRING:
        return v->u.s.len > 0;
    case SCH_JSON_ARRAY:
    case SCH_JSON_OBJECT:
        return v->n > 0;
    }
    return false;
}

bool sch_json_all_finite(const sch_json_t *v) {
    if (v->type == SCH_JSON_REAL)
        return isfinite(v->u.d);
    if (!is_container(v))
        return true;
    for (size_t i = 0; i < v->n; i++) {
        if (!sch_json_all_finite(&v->u.c.items[i]))
            return false;
    }
    return true;
}
