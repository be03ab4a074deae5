/*
 * sch_json_write.c -- the JSON writers of schemas.h, with the semantics of
 * Python 3.11's json module (SPEC a.1, b.2, b.3, c.4): strings as
 * `json.dumps(..., ensure_ascii=False)` writes them, doubles as `repr(float)`,
 * and whole values in three styles that differ only in separators and key
 * order (json.dumps' defaults, its compact separators, and the canonical
 * form with sorted keys), all from one dumper.
 *
 * The dumper recurses, but only over parsed values, whose depth the reader
 * (sch_json.c) bounds to SCH_JSON_MAX_DEPTH.
 *
 * Assumes LC_NUMERIC is "C" (the process never calls setlocale): strtod and
 * "%e" are used for doubles.
 */
#include "sch_json_int.h"

#include <math.h>

svc_err_t sch_json_write_string(svc_buf_t *out, const char *s, size_t len) {
    svc_err_t err = svc_buf_addc(out, '"');
    if (len == 0)
        return err ? err : svc_buf_addc(out, '"');
    size_t run = 0; /* start of the bytes not yet written */
    for (size_t i = 0; i < len && !err; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        err = svc_buf_add(out, s + run, i - run);
        run = i + 1;
        const char *esc = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t"
                          : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f"
                                      : NULL;
        if (err)
            break;
        if (esc)
            err = svc_buf_adds(out, esc);
        else
            err = svc_buf_addf(out, "\\u%04x", c);
    }
    if (!err)
        err = svc_buf_add(out, s + run, len - run);
    if (!err)
        err = svc_buf_addc(out, '"');
    return err;
}

/* Decimal digits d[0..n) with the point after decpt digits: the value is
 * 0.d1d2...dn x 10^decpt, the shape of dtoa's output. */
typedef struct jdigits {
    char d[24];
    int  n;
    int  decpt;
} jdigits_t;

/* The double the digits read back as: "DDDe-X" needs no radix point. */
static double digits_value(const jdigits_t *g) {
    char buf[48];
    memcpy(buf, g->d, (size_t)g->n);
    snprintf(buf + g->n, sizeof buf - (size_t)g->n, "e%d", g->decpt - g->n);
    return strtod(buf, NULL);
}

/* The digits of x (> 0, finite) rounded to `prec` significant digits. */
static void digits_rounded(double x, int prec, jdigits_t *g) {
    char buf[48];
    snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    g->n = 0;
    const char *c = buf;
    for (; *c && *c != 'e'; c++) {
        if (sch_json_is_digit((unsigned char)*c))
            g->d[g->n++] = *c;
    }
    g->decpt = (int)strtol(c + 1, NULL, 10) + 1;
}

/* Moves g to the next decimal of as many digits above (dir 1) or below
 * (dir -1): 999 -> 1000 keeps 3 digits as "100" one decade up, 100 -> 99.9
 * as "999" one decade down. */
static void digits_step(jdigits_t *g, int dir) {
    char wrap = dir > 0 ? '9' : '0';
    int  i = g->n - 1;
    while (i >= 0 && g->d[i] == wrap)
        g->d[i--] = dir > 0 ? '0' : '9';
    if (i < 0) {
        g->d[0] = '1';
        g->decpt++;
        return;
    }
    g->d[i] = (char)(g->d[i] + dir);
    if (g->d[0] == '0') {
        memmove(g->d, g->d + 1, (size_t)g->n - 1);
        g->d[g->n - 1] = '9';
        g->decpt--;
    }
}

/* Whether some decimal of `prec` digits reads back as x; if so, *g is the
 * one nearest to x. The readable decimals form an interval around x, so
 * they include the correctly rounded one or its neighbour on the other
 * side of x; the neighbour matters at powers of two, whose rounding
 * interval is wider above than below. */
static bool digits_try(double x, int prec, jdigits_t *g) {
    digits_rounded(x, prec, g);
    double back = digits_value(g);
    if (back == x)
        return true;
    jdigits_t alt = *g;
    digits_step(&alt, back < x ? 1 : -1);
    if (digits_value(&alt) != x)
        return false;
    *g = alt;
    return true;
}

/* Shortest digits that read back as x, the nearest to x among those: what
 * Python's repr (dtoa mode 0) prints. digits_try is monotone in the
 * precision (a shorter decimal is also a longer one), so bisect 1..17;
 * 17 digits always read back. */
static void digits_shortest(double x, jdigits_t *g) {
    int  lo = 1;
    int  hi = 17;
    bool have = false;
    while (lo < hi) {
        int       mid = lo + (hi - lo) / 2;
        jdigits_t cand;
        if (digits_try(x, mid, &cand)) {
            *g = cand;
            have = true;
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if (!have) {
        bool ok = digits_try(x, 17, g);
        SVC_ASSERT(ok);
    }
    while (g->n > 1 && g->d[g->n - 1] == '0')
        g->n--;
}

static svc_err_t add_zeros(svc_buf_t *out, int n) {
    svc_err_t err = SVC_OK;
    for (int i = 0; i < n && !err; i++)
        err = svc_buf_addc(out, '0');
    return err;
}

/* float_repr_style 'short': fixed notation for -4 < decpt <= 16, else
 * d.ddde+XX; a fixed integral value keeps ".0". */
static svc_err_t write_digits(svc_buf_t *out, const jdigits_t *g) {
    svc_err_t err = SVC_OK;
    if (g->decpt <= -4 || g->decpt > 16) {
        err = svc_buf_add(out, g->d, 1);
        if (!err && g->n > 1)
            err = svc_buf_addf(out, ".%.*s", g->n - 1, g->d + 1);
        if (!err)
            err = svc_buf_addf(out, "e%c%02d", g->decpt - 1 < 0 ? '-' : '+', abs(g->decpt - 1));
        return err;
    }
    if (g->decpt <= 0) {
        err = svc_buf_adds(out, "0.");
        if (!err)
            err = add_zeros(out, -g->decpt);
        return err ? err : svc_buf_add(out, g->d, (size_t)g->n);
    }
    if (g->decpt >= g->n) {
        err = svc_buf_add(out, g->d, (size_t)g->n);
        if (!err)
            err = add_zeros(out, g->decpt - g->n);
        return err ? err : svc_buf_adds(out, ".0");
    }
    return svc_buf_addf(out, "%.*s.%.*s", g->decpt, g->d, g->n - g->decpt, g->d + g->decpt);
}

svc_err_t sch_json_write_double(svc_buf_t *out, double d) {
    if (isnan(d))
        return svc_buf_adds(out, "NaN");
    if (isinf(d))
        return svc_buf_adds(out, d < 0 ? "-Infinity" : "Infinity");
    svc_err_t err = signbit(d) ? svc_buf_addc(out, '-') : SVC_OK;
    if (err)
        return err;
    if (d == 0.0)
        return svc_buf_adds(out, "0.0");
    jdigits_t g;
    digits_shortest(fabs(d), &g);
    return write_digits(out, &g);
}

/* Separators and key order of one dump style: json.dumps' defaults, its
 * compact separators, or the canonical compact form with sorted keys. */
typedef struct jstyle {
    const char *item_sep;
    const char *key_sep;
    bool        sort_keys;
} jstyle_t;

static svc_err_t dump_value(const sch_json_t *v, const jstyle_t *st, svc_buf_t *out);

static svc_err_t dump_scalar(const sch_json_t *v, svc_buf_t *out) {
    switch (v->type) {
    case SCH_JSON_NULL:
        return svc_buf_adds(out, "null");
    case SCH_JSON_BOOL:
        return svc_buf_adds(out, v->u.b ? "true" : "false");
    case SCH_JSON_INT:
        /* Python's int("-0") is 0. */
        return svc_buf_adds(out, sch_json_int_is_zero(v) ? "0" : v->u.s.p);
    case SCH_JSON_REAL:
        return sch_json_write_double(out, v->u.d);
    case SCH_JSON_STRING:
        return sch_json_write_string(out, v->u.s.p, v->u.s.len);
    default:
        return SVC_ERR_INTERNAL;
    }
}

static svc_err_t dump_array(const sch_json_t *v, const jstyle_t *st, svc_buf_t *out) {
    svc_err_t err = svc_buf_addc(out, '[');
    for (size_t i = 0; i < v->n && !err; i++) {
        if (i)
            err = svc_buf_adds(out, st->item_sep);
        if (!err)
            err = dump_value(&v->u.c.items[i], st, out);
    }
    return err ? err : svc_buf_addc(out, ']');
}

static svc_err_t dump_object(const sch_json_t *v, const jstyle_t *st, svc_buf_t *out) {
    svc_err_t err = svc_buf_addc(out, '{');
    for (size_t i = 0; i < v->n && !err; i++) {
        size_t            k = st->sort_keys ? sch_json_sorted(v)[i] : i;
        const sch_jstr_t *key = &v->u.c.keys[k];
        if (i)
            err = svc_buf_adds(out, st->item_sep);
        if (!err)
            err = sch_json_write_string(out, key->p, key->len);
        if (!err)
            err = svc_buf_adds(out, st->key_sep);
        if (!err)
            err = dump_value(&v->u.c.items[k], st, out);
    }
    return err ? err : svc_buf_addc(out, '}');
}

/* Recursion is bounded by SCH_JSON_MAX_DEPTH, enforced by the reader. */
static svc_err_t dump_value(const sch_json_t *v, const jstyle_t *st, svc_buf_t *out) {
    if (v->type == SCH_JSON_ARRAY)
        return dump_array(v, st, out);
    if (v->type == SCH_JSON_OBJECT)
        return dump_object(v, st, out);
    return dump_scalar(v, out);
}

svc_err_t sch_json_dump_py(const sch_json_t *v, svc_buf_t *out) {
    static const jstyle_t py = {", ", ": ", false};
    return dump_value(v, &py, out);
}

svc_err_t sch_json_dump_canonical(const sch_json_t *v, svc_buf_t *out) {
    static const jstyle_t canonical = {",", ":", true};
    return dump_value(v, &canonical, out);
}

svc_err_t sch_json_dump_compact(const sch_json_t *v, svc_buf_t *out) {
    static const jstyle_t compact = {",", ":", false};
    return dump_value(v, &compact, out);
}

svc_err_t sch_content_text(const sch_json_t *v, svc_buf_t *out) {
    if (v->type == SCH_JSON_STRING)
        return svc_buf_add(out, v->u.s.p, v->u.s.len);
    return sch_json_dump_py(v, out);
}
