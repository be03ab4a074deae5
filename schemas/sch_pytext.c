/*
 * sch_pytext.c -- the bits of Python's str semantics the error messages
 * depend on: str.strip() whitespace, repr() of str and of a list of str,
 * sorted() order, and sum() of floats.
 *
 * Input strings are UTF-8 from the JSON parser (valid, no surrogates), but
 * the decoders below still never read past n bytes on malformed input.
 */
#include "sch_int.h"

#include <math.h>
#include <utf8proc.h>

/* Decodes one code point at s[0..n); *cp = U+FFFD and 1 byte on bad input. */
static size_t utf8_next(const char *s, size_t n, int32_t *cp) {
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

/* Py_UNICODE_ISSPACE: what str.strip() and str.isspace() treat as blank. */
static bool py_isspace(int32_t c) {
    if (c < 0x80)
        return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

void sch_py_strip(const char *s, size_t n, size_t *start, size_t *len) {
    size_t i = 0;
    size_t end = 0; /* one past the last non-space code point */
    size_t first = n;
    while (i < n) {
        int32_t c;
        size_t  k = utf8_next(s + i, n - i, &c);
        if (!py_isspace(c)) {
            if (first == n)
                first = i;
            end = i + k;
        }
        i += k;
    }
    *start = first == n ? n : first;
    *len = first == n ? 0 : end - first;
}

bool sch_py_blank(const char *s, size_t n) {
    size_t start, len;
    sch_py_strip(s, n, &start, &len);
    return len == 0;
}

size_t sch_utf8_count(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += ((unsigned char)s[i] & 0xC0) != 0x80;
    return count;
}

/* Py_UNICODE_ISPRINTABLE: not Cc, Cf, Cs, Co, Cn, Zl, Zp, and not Zs except
 * the ASCII space. */
static bool py_isprintable(int32_t c) {
    if (c == ' ')
        return true;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static svc_err_t repr_char(svc_buf_t *out, int32_t c, char quote, const char *raw, size_t k) {
    if (c == quote || c == '\\') {
        char esc[2] = {'\\', (char)c};
        return svc_buf_add(out, esc, 2);
    }
    if (c == '\t')
        return svc_buf_adds(out, "\\t");
    if (c == '\n')
        return svc_buf_adds(out, "\\n");
    if (c == '\r')
        return svc_buf_adds(out, "\\r");
    if (c < 0x20 || c == 0x7F)
        return svc_buf_addf(out, "\\x%02x", (unsigned)c);
    if (c < 0x7F || py_isprintable(c))
        return svc_buf_add(out, raw, k);
    if (c <= 0xFF)
        return svc_buf_addf(out, "\\x%02x", (unsigned)c);
    if (c <= 0xFFFF)
        return svc_buf_addf(out, "\\u%04x", (unsigned)c);
    return svc_buf_addf(out, "\\U%08x", (unsigned)c);
}

svc_err_t sch_py_repr_str(svc_buf_t *out, const char *s, size_t n) {
    /* Single quotes unless the text holds ' and no ". */
    bool squote = memchr(s, '\'', n) != NULL;
    bool dquote = memchr(s, '"', n) != NULL;
    char quote = squote && !dquote ? '"' : '\'';

    svc_err_t err = svc_buf_addc(out, quote);
    size_t    i = 0;
    while (!err && i < n) {
        int32_t c;
        size_t  k = utf8_next(s + i, n - i, &c);
        err = repr_char(out, c, quote, s + i, k);
        i += k;
    }
    return err ? err : svc_buf_addc(out, quote);
}

svc_err_t sch_py_repr_list(svc_buf_t *out, const sch_str_t *items, size_t n) {
    svc_err_t err = svc_buf_addc(out, '[');
    for (size_t i = 0; i < n && !err; i++) {
        if (i)
            err = svc_buf_adds(out, ", ");
        if (!err)
            err = sch_py_repr_str(out, items[i].s, items[i].n);
    }
    return err ? err : svc_buf_addc(out, ']');
}

/* UTF-8 byte order is code point order, so memcmp sorts as Python does. */
static int str_cmp(const void *pa, const void *pb) {
    const sch_str_t *a = pa;
    const sch_str_t *b = pb;
    size_t           n = a->n < b->n ? a->n : b->n;
    int              c = n ? memcmp(a->s, b->s, n) : 0;
    if (c)
        return c;
    return (a->n > b->n) - (a->n < b->n);
}

void sch_str_sort(sch_str_t *items, size_t n) {
    if (n > 1)
        qsort(items, n, sizeof *items, str_cmp);
}

double sch_py_fsum(const double *v, size_t n) {
    double sum = 0.0;
    double c = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = v[i];
        double t = sum + x;
        if (fabs(sum) >= fabs(x))
            c += (sum - t) + x;
        else
            c += (x - t) + sum;
        sum = t;
    }
    /* As CPython: keep an infinite or overflowed sum from turning NaN. */
    if (c != 0.0 && isfinite(c))
        sum += c;
    return sum;
}

/* The bytes a well-formed sequence led by b may continue with next: its
 * second byte's range (Unicode Table 3-7), later ones 80..BF; 0: none. */
static size_t utf8_lead(unsigned char b, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        *lo = b == 0xE0 ? 0xA0 : 0x80;
        *hi = b == 0xED ? 0x9F : 0xBF;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        *lo = b == 0xF0 ? 0x90 : 0x80;
        *hi = b == 0xF4 ? 0x8F : 0xBF;
        return 4;
    }
    return 0;
}

svc_err_t sch_py_utf8_replace(svc_buf_t *out, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    svc_err_t            err = SVC_OK;
    for (size_t i = 0; i < n && !err;) {
        if (p[i] < 0x80) {
            err = svc_buf_addc(out, (char)p[i++]);
            continue;
        }
        unsigned char lo, hi;
        size_t        want = utf8_lead(p[i], &lo, &hi), k = 1;
        while (k < want && i + k < n && p[i + k] >= lo && p[i + k] <= hi) {
            lo = 0x80;
            hi = 0xBF;
            k++;
        }
        err = want && k == want ? svc_buf_add(out, s + i, k) : svc_buf_adds(out, "\xEF\xBF\xBD");
        i += k;
    }
    return err;
}
