/*
 * eng_pretok.c -- text helpers of the tokenizer: UTF-8 checks, the Unicode
 * classes upstream uses (Rust White_Space and \w), NFC through utf8proc, the
 * Split pre-tokenizer on PCRE2 and the GPT-2 byte-level mapping.
 *
 * Why patterns are rewritten: `tokenizers` runs Split regexes on Oniguruma
 * (Ruby syntax), where \s is exactly Unicode White_Space, \h is a hex digit
 * and \w is Alphabetic+Mark+Nd+Pc+Join_Control. PCRE2 with UCP adds U+180E to
 * \s, reads \h as horizontal space and leaves marks out of \w, so those
 * escapes are replaced by explicit classes before compiling.
 */
#include "eng_tok_int.h"

#include <utf8proc.h>

const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char tok_qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                 "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- UTF-8 ---- */

size_t tok_utf8_valid_prefix(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t               i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t   len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        unsigned lo = 0x80;
        unsigned hi = 0xbf;
        if (c < 0xc2 || c > 0xf4 || n - i < len)
            return i;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
        else if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
        if (s[i + 1] < lo || s[i + 1] > hi)
            return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
        i += len;
    }
    return n;
}

uint32_t tok_utf8_decode(const char *str, size_t *len) {
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80) {
        *len = 1;
        return s[0];
    }
    if (s[0] < 0xe0) {
        *len = 2;
        return ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if (s[0] < 0xf0) {
        *len = 3;
        return ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    *len = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
           ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
}

uint32_t tok_utf8_decode_last(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
        i--;
    size_t len;
    return tok_utf8_decode(s + i, &len);
}

/* ---- Unicode classes ---- */

bool tok_is_space(uint32_t c) {
    if (c <= 0x20)
        return c == 0x20 || (c >= 0x09 && c <= 0x0d);
    if (c < 0x85)
        return false;
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool tok_is_word(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        break;
    }
    /* Join_Control, and the Other_Alphabetic symbols (circled letters). */
    return c == 0x200c || c == 0x200d || (c >= 0x24b6 && c <= 0x24e9) ||
           (c >= 0x1f130 && c <= 0x1f149) || (c >= 0x1f150 && c <= 0x1f169) ||
           (c >= 0x1f170 && c <= 0x1f189);
}

/* ---- NFC ---- */

/* Characters that `tokenizers` 0.23's NFC tables (unicode-normalization-
 * alignments, about Unicode 9) do not know as combining or composing while
 * utf8proc does: upstream treats them as plain starters, so normalisation
 * never reorders or composes across them. Found by probing every code point
 * (alone, after "@" before U+0334, after "@\u0301", and every primary
 * composite's NFD) against both. */
static const uint32_t tok_nfc_opaque[][2] = {
    {0x7fd, 0x7fd},     {0x898, 0x89f},     {0x8ca, 0x8d3},     {0x9fe, 0x9fe},
    {0xc3c, 0xc3c},     {0xd3b, 0xd3c},     {0xeba, 0xeba},     {0x1715, 0x1715},
    {0x1abf, 0x1ace},   {0x1df6, 0x1dfa},   {0xa82c, 0xa82c},   {0x10d24, 0x10d27},
    {0x10eab, 0x10eac}, {0x10efd, 0x10eff}, {0x10f46, 0x10f50}, {0x10f82, 0x10f85},
    {0x11070, 0x11070}, {0x1133b, 0x1133b}, {0x1145e, 0x1145e}, {0x11839, 0x1183a},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193d, 0x1193e},
    {0x11943, 0x11943}, {0x119e0, 0x119e0}, {0x11a34, 0x11a34}, {0x11a47, 0x11a47},
    {0x11a99, 0x11a99}, {0x11d42, 0x11d42}, {0x11d44, 0x11d45}, {0x11d97, 0x11d97},
    {0x11f41, 0x11f42}, {0x16ff0, 0x16ff1}, {0x1e08f, 0x1e08f}, {0x1e130, 0x1e136},
    {0x1e2ae, 0x1e2ae}, {0x1e2ec, 0x1e2ef}, {0x1e4ec, 0x1e4ef},
};

static bool tok_nfc_is_opaque(uint32_t c) {
    size_t lo = 0, hi = sizeof tok_nfc_opaque / sizeof tok_nfc_opaque[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < tok_nfc_opaque[mid][0])
            hi = mid;
        else if (c > tok_nfc_opaque[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* Appends NFC(s) (no opaque characters inside) to out. */
static svc_err_t tok_nfc_append(const char *s, size_t n, svc_buf_t *out) {
    if (n == 0)
        return SVC_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t  m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0)
        return m == UTF8PROC_ERROR_NOMEM ? SVC_ERR_NOMEM : SVC_ERR_INVALID;
    svc_err_t err = svc_buf_add(out, dst, (size_t)m);
    free(dst);
    return err;
}

/* A character that NFC leaves alone whatever surrounds it: a starter with
 * no canonical decomposition that takes part in no composition (Hangul
 * jamo compose by rule, so they are excluded too). */
static bool tok_nfc_inert(uint32_t c) {
    if (c < 0x300)
        return true;
    if (c >= 0x1100 && c <= 0x11ff)
        return false;
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
    bool                       canonical = p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
    return p->combining_class == 0 && p->comb_index == UINT16_MAX && !canonical;
}

svc_err_t tok_nfc(const char *s, size_t n, svc_buf_t *out, const char **res, size_t *res_n) {
    /* Most text is made of inert characters only (everything below U+0300
     * has a lead byte under 0xCC) and never reaches utf8proc. */
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0xcc) {
            i++;
            continue;
        }
        size_t len;
        if (!tok_nfc_inert(tok_utf8_decode(s + i, &len)))
            break;
        i += len;
    }
    if (i == n) {
        *res = s;
        *res_n = n;
        return SVC_OK;
    }
    svc_buf_reset(out);
    svc_err_t err = svc_buf_reserve(out, n);
    size_t    seg = 0;
    for (i = 0; i < n && !err;) {
        size_t   len;
        uint32_t c = tok_utf8_decode(s + i, &len);
        if (c >= 0x7fd && tok_nfc_is_opaque(c)) {
            err = tok_nfc_append(s + seg, i - seg, out);
            if (!err)
                err = svc_buf_add(out, s + i, len);
            seg = i + len;
        }
        i += len;
    }
    if (!err)
        err = tok_nfc_append(s + seg, n - seg, out);
    if (err)
        return err;
    *res = out->data;
    *res_n = out->len;
    return SVC_OK;
}

/* ---- pattern rewriting and compiling ---- */

/* Unicode White_Space as class items, and its complement. */
#define TOK_WS_ITEMS                                                                               \
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"    \
    "\\x{205f}\\x{3000}"
#define TOK_NWS_ITEMS                                                                              \
    "\\x{0}-\\x{8}\\x{e}-\\x{1f}\\x{21}-\\x{84}\\x{86}-\\x{9f}\\x{a1}-\\x{167f}\\x{1681}-\\x{"     \
    "1fff}"                                                                                        \
    "\\x{200b}-\\x{2027}\\x{202a}-\\x{202e}\\x{2030}-\\x{205e}\\x{2060}-\\x{2fff}"                 \
    "\\x{3001}-\\x{10ffff}"
#define TOK_HEX_ITEMS  "0-9A-Fa-f"
#define TOK_NHEX_ITEMS "\\x{0}-/:-@G-`g-\\x{10ffff}"
/* Oniguruma's \w: Alphabetic, Mark, Nd, Pc; outside a class it also takes
 * the Latin-1 digits \u00b2 \u00b3 \u00b9 \u00bc-\u00be (both measured
 * against tokenizers over every code point). */
#define TOK_WORD_ITEMS                                                                             \
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}" TOK_NEW_L_ITEMS TOK_NEW_M_ITEMS TOK_NEW_ND_ITEMS
#define TOK_WORD_LATIN1 "\\x{b2}\\x{b3}\\x{b9}\\x{bc}-\\x{be}"
#define TOK_DIGIT_ITEMS "\\p{Nd}" TOK_NEW_ND_ITEMS

/* Characters Oniguruma 6.9.10 (Unicode 16, what `tokenizers` 0.23 links)
 * puts in \p{L}, \p{N} and \p{M} that PCRE2 10.42 (Unicode 14) leaves
 * unassigned. Generated by testing every code point against both engines;
 * PCRE2's sets were found to be subsets, so adding these makes them equal. */
#define TOK_NEW_L_ITEMS                                                                            \
    "\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cd}\\x{a7da}-\\x{a7dc}\\x{105c0}-\\x{105f3}"               \
    "\\x{10d4a}-\\x{10d65}\\x{10d6f}-\\x{10d85}\\x{10ec2}-\\x{10ec4}\\x{1123f}-\\x{11240}"         \
    "\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}"           \
    "\\x{113d3}\\x{11bc0}-\\x{11be0}\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}"          \
    "\\x{1342f}\\x{13441}-\\x{13446}\\x{13460}-\\x{143fa}\\x{16100}-\\x{1611d}"                    \
    "\\x{16d40}-\\x{16d6c}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"                     \
    "\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}\\x{2b739}"          \
    "\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{323af}"
#define TOK_NEW_N_ITEMS                                                                            \
    "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}\\x{11f50}-\\x{11f59}"         \
    "\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}\\x{1ccf0}-\\x{1ccf9}\\x{1d2c0}-\\x{1d2d3}"         \
    "\\x{1e4f0}-\\x{1e4f9}\\x{1e5f1}-\\x{1e5fa}"
/* The new N characters that are Nd (all but Kaktovik numerals). */
#define TOK_NEW_ND_ITEMS                                                                           \
    "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}\\x{11f50}-\\x{11f59}"         \
    "\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}\\x{1ccf0}-\\x{1ccf9}\\x{1e4f0}-\\x{1e4f9}"         \
    "\\x{1e5f1}-\\x{1e5fa}"
#define TOK_NEW_M_ITEMS                                                                            \
    "\\x{897}\\x{cf3}\\x{ece}\\x{10d69}-\\x{10d6d}\\x{10efc}-\\x{10eff}\\x{11241}"                 \
    "\\x{113b8}-\\x{113c0}\\x{113c2}\\x{113c5}\\x{113c7}-\\x{113ca}\\x{113cc}-\\x{113d0}"          \
    "\\x{113d2}\\x{113e1}-\\x{113e2}\\x{11f00}-\\x{11f01}\\x{11f03}\\x{11f34}-\\x{11f3a}"          \
    "\\x{11f3e}-\\x{11f42}\\x{11f5a}\\x{13440}\\x{13447}-\\x{13455}\\x{1611e}-\\x{1612f}"          \
    "\\x{1e08f}\\x{1e4ec}-\\x{1e4ef}\\x{1e5ee}-\\x{1e5ef}"

/* Rewrites \p{L} \p{N} \p{M} (and \P outside classes) to
 * include the newer characters; returns the index after, or 0 to copy. */
static size_t tok_rewrite_prop(const char *p, size_t n, size_t i, bool in_class, svc_buf_t *o,
                               svc_err_t *err) {
    char   kind = p[i + 1];
    char   name = 0;
    size_t end = 0;
    if (i + 4 < n && p[i + 2] == '{' && p[i + 4] == '}') {
        name = p[i + 3];
        end = i + 5;
    }
    const char *extra = name == 'L'   ? TOK_NEW_L_ITEMS
                        : name == 'N' ? TOK_NEW_N_ITEMS
                        : name == 'M' ? TOK_NEW_M_ITEMS
                                      : NULL;
    if (!extra || (kind == 'P' && in_class))
        return 0; /* kept as written (PCRE2's Unicode 14 tables) */
    if (in_class)
        *err = svc_buf_addf(o, "\\p{%c}%s", name, extra);
    else
        *err = svc_buf_addf(o, "[%s\\p{%c}%s]", kind == 'P' ? "^" : "", name, extra);
    return end;
}

/* Writes the replacement of escape `c`, or returns false to copy it. */
static bool tok_rewrite_escape(char c, bool in_class, svc_buf_t *o, svc_err_t *err) {
    const char *items = NULL;
    bool        neg = false;
    switch (c) {
    case 's':
        items = TOK_WS_ITEMS;
        break;
    case 'S':
        items = in_class ? TOK_NWS_ITEMS : TOK_WS_ITEMS;
        neg = !in_class;
        break;
    case 'h':
        items = TOK_HEX_ITEMS;
        break;
    case 'H':
        items = in_class ? TOK_NHEX_ITEMS : TOK_HEX_ITEMS;
        neg = !in_class;
        break;
    case 'w':
        items = TOK_WORD_ITEMS;
        break;
    case 'W':
        if (in_class)
            return false; /* no compact complement; PCRE2's \W is close */
        items = TOK_WORD_ITEMS;
        neg = true;
        break;
    case 'd':
        items = TOK_DIGIT_ITEMS;
        break;
    case 'D':
        if (in_class)
            return false;
        items = TOK_DIGIT_ITEMS;
        neg = true;
        break;
    default:
        return false;
    }
    if (in_class)
        *err = svc_buf_adds(o, items);
    else
        *err = svc_buf_addf(o, "[%s%s%s]", neg ? "^" : "", items,
                            c == 'w' || c == 'W' ? TOK_WORD_LATIN1 : "");
    return true;
}

static bool tok_is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Copies an escape sequence starting at p[i] == '\\'; returns the index after. */
static size_t tok_copy_escape(const char *p, size_t n, size_t i, bool in_class, svc_buf_t *o,
                              svc_err_t *err) {
    if (i + 1 >= n) {
        *err = svc_buf_addc(o, '\\');
        return i + 1;
    }
    char c = p[i + 1];
    if (tok_rewrite_escape(c, in_class, o, err))
        return i + 2;
    if (c == 'p' || c == 'P') {
        size_t end = tok_rewrite_prop(p, n, i, in_class, o, err);
        if (end)
            return end;
    }
    if (c == 'u' && i + 5 < n && tok_is_hex(p[i + 2]) && tok_is_hex(p[i + 3]) &&
        tok_is_hex(p[i + 4]) && tok_is_hex(p[i + 5])) {
        *err = svc_buf_addf(o, "\\x{%.4s}", p + i + 2);
        return i + 6;
    }
    /* Keep the escape and the whole (possibly multi-byte) character. */
    size_t len = 1;
    if ((unsigned char)c >= 0x80)
        tok_utf8_decode(p + i + 1, &len);
    *err = svc_buf_add(o, p + i, 1 + len);
    return i + 1 + len;
}

static svc_err_t tok_rewrite_pattern(const char *p, size_t n, svc_buf_t *o) {
    svc_err_t err = SVC_OK;
    int       depth = 0; /* character class nesting */
    size_t    i = 0;
    while (i < n && !err) {
        char c = p[i];
        if (c == '\\') {
            i = tok_copy_escape(p, n, i, depth > 0, o, &err);
            continue;
        }
        if (c == '[' && depth > 0 && i + 1 < n && p[i + 1] == ':') {
            const char *end = memmem(p + i, n - i, ":]", 2);
            size_t      len = end ? (size_t)(end - (p + i)) + 2 : 1;
            err = svc_buf_add(o, p + i, len);
            i += len;
            continue;
        }
        if (c == '[') {
            depth++;
            err = svc_buf_addc(o, c);
            i++;
            /* A ']' right after '[' or '[^' is a literal. */
            if (i < n && p[i] == '^' && !err) {
                err = svc_buf_addc(o, '^');
                i++;
            }
            if (i < n && p[i] == ']' && !err) {
                err = svc_buf_adds(o, "\\]");
                i++;
            }
            continue;
        }
        if (c == ']' && depth > 0)
            depth--;
        err = svc_buf_addc(o, c);
        i++;
    }
    return err;
}

static svc_err_t tok_escape_literal(const char *p, size_t n, svc_buf_t *o) {
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < n && !err; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f)
            err = svc_buf_addf(o, "\\x{%x}", c);
        else if (c < 0x80 &&
                 !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            err = svc_buf_add(o, (const char[]){'\\', (char)c}, 2);
        else
            err = svc_buf_addc(o, (char)c);
    }
    return err;
}

svc_err_t tok_regex_compile(const char *pat, size_t n, bool literal, pcre2_code **out, char *errstr,
                            size_t errstr_size) {
    svc_buf_t o;
    svc_buf_init(&o, 1 << 20);
    svc_err_t err = literal ? tok_escape_literal(pat, n, &o) : tok_rewrite_pattern(pat, n, &o);
    if (!err)
        err = svc_buf_reserve(&o, 0);
    if (err) {
        svc_buf_fini(&o);
        svc_errf(errstr, errstr_size, "pattern too large or out of memory");
        return SVC_ERR_NOMEM;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        svc_buf_fini(&o);
        return SVC_ERR_NOMEM;
    }
    /* Ruby syntax: ^ and $ are line anchors, lines end at \n only. */
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int         code = 0;
    PCRE2_SIZE  off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)o.data, o.len,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &code, &off, cc);
    pcre2_compile_context_free(cc);
    svc_buf_fini(&o);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        svc_errf(errstr, errstr_size, "regex does not compile (PCRE2: %s)", (const char *)msg);
        return SVC_ERR_FORMAT;
    }
    /* Without JIT (unsupported CPU) pcre2_match interprets: slower, same. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return SVC_OK;
}

/* ---- Split ---- */

void tok_ranges_fini(tok_ranges_t *r) {
    free(r->v);
    r->v = NULL;
    r->n = r->cap = 0;
}

static svc_err_t tok_ranges_push(tok_ranges_t *r, size_t a, size_t b, bool m) {
    if (r->n == r->cap) {
        size_t       cap = r->cap ? r->cap * 2 : 64;
        tok_range_t *v = realloc(r->v, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (tok_range_t){.a = a, .b = b, .m = m};
    return SVC_OK;
}

/* One search from `from`; 1 with ov set, 0 for no match, <0 on failure. */
static int tok_search(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n,
                      size_t from) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    return rc < 0 ? rc : 1;
}

/* Matches and the gaps between them, as tokenizers' Pattern::find_matches
 * over onig's find_iter (an empty match right after a match is skipped). */
static svc_err_t tok_find_matches(const pcre2_code *re, pcre2_match_data *md, const char *s,
                                  size_t n, tok_ranges_t *r) {
    r->n = 0;
    if (n == 0)
        return tok_ranges_push(r, 0, 0, false);
    size_t    prev = 0, last_end = 0, last_match_end = 0;
    bool      have_last = false;
    svc_err_t err = SVC_OK;
    while (last_end <= n && !err) {
        int rc = tok_search(re, md, s, n, last_end);
        if (rc < 0)
            return SVC_ERR_INTERNAL;
        if (rc == 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t      a = ov[0], b = ov[1];
        if (a == b && have_last && last_match_end == b) {
            size_t len = 1;
            if (last_end < n)
                tok_utf8_decode(s + last_end, &len);
            last_end += len;
            continue;
        }
        last_end = b;
        last_match_end = b;
        have_last = true;
        if (prev != a)
            err = tok_ranges_push(r, prev, a, false);
        if (!err)
            err = tok_ranges_push(r, a, b, true);
        prev = b;
    }
    if (!err && prev != n)
        err = tok_ranges_push(r, prev, n, false);
    return err;
}

/* Contiguous, MergedWithPrevious: a left-to-right fold, in place. */
static void tok_fold_forward(tok_ranges_t *r, bool contiguous) {
    size_t w = 0;
    bool   prev = false;
    for (size_t i = 0; i < r->n; i++) {
        tok_range_t x = r->v[i];
        bool        join = contiguous ? x.m == prev : (x.m && !prev);
        if (join && w > 0)
            r->v[w - 1].b = x.b;
        else
            r->v[w++] = x;
        prev = x.m;
    }
    r->n = w;
}

/* MergedWithNext: the same fold from the right, in place. */
static void tok_fold_backward(tok_ranges_t *r) {
    size_t w = r->n;
    bool   prev = false;
    for (size_t i = r->n; i-- > 0;) {
        tok_range_t x = r->v[i];
        if (x.m && !prev && w < r->n)
            r->v[w].a = x.a;
        else
            r->v[--w] = x;
        prev = x.m;
    }
    memmove(r->v, r->v + w, (r->n - w) * sizeof *r->v);
    r->n -= w;
}

svc_err_t tok_split(const tok_step_t *st, pcre2_match_data *md, const char *s, size_t n,
                    tok_ranges_t *r) {
    svc_err_t err = tok_find_matches(st->re, md, s, n, r);
    if (err)
        return err;
    for (size_t i = 0; st->invert && i < r->n; i++)
        r->v[i].m = !r->v[i].m;
    switch (st->behavior) {
    case TOK_SPLIT_ISOLATED:
        break;
    case TOK_SPLIT_REMOVED: {
        size_t w = 0;
        for (size_t i = 0; i < r->n; i++)
            if (!r->v[i].m)
                r->v[w++] = r->v[i];
        r->n = w;
        break;
    }
    case TOK_SPLIT_CONTIGUOUS:
        tok_fold_forward(r, true);
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        tok_fold_forward(r, false);
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT:
        tok_fold_backward(r);
        break;
    }
    size_t w = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->v[i].b > r->v[i].a)
            r->v[w++] = r->v[i];
    r->n = w;
    return SVC_OK;
}

/* ---- byte-level mapping (GPT-2 bytes_to_unicode) ---- */

static uint16_t tok_byte_cp(unsigned b) {
    if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))
        return (uint16_t)b;
    /* The others take 256, 257, ... in byte order. */
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff)))
            k++;
    return (uint16_t)(256 + k);
}

static char           tok_bl_utf8[256][2];
static pthread_once_t tok_bl_once = PTHREAD_ONCE_INIT;

static void tok_bl_init(void) {
    for (unsigned b = 0; b < 256; b++) {
        uint16_t c = tok_byte_cp(b);
        tok_bl_utf8[b][0] = (char)(0xc0 | (c >> 6));
        tok_bl_utf8[b][1] = (char)(0x80 | (c & 0x3f));
    }
}

svc_err_t tok_byte_level_map(const char *s, size_t n, svc_buf_t *out) {
    pthread_once(&tok_bl_once, tok_bl_init);
    svc_err_t err = svc_buf_reserve(out, 2 * n);
    if (err)
        return err;
    char *d = out->data + out->len;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (b >= '!' && b <= '~') {
            *d++ = (char)b;
        } else {
            *d++ = tok_bl_utf8[b][0];
            *d++ = tok_bl_utf8[b][1];
        }
    }
    out->len = (size_t)(d - out->data);
    out->data[out->len] = '\0';
    return SVC_OK;
}

/* ---- added tokens: trie and matching ---- */

void tok_trie_init(tok_trie_t *t) {
    t->nodes = NULL;
    t->n = t->cap = 0;
    for (size_t i = 0; i < 256; i++)
        t->root[i] = -1;
    t->empty = true;
}

static int32_t tok_trie_new_node(tok_trie_t *t, uint8_t byte) {
    if (t->n == t->cap) {
        size_t           cap = t->cap ? t->cap * 2 : 64;
        tok_trie_node_t *v = realloc(t->nodes, cap * sizeof *v);
        if (!v)
            return -1;
        t->nodes = v;
        t->cap = cap;
    }
    t->nodes[t->n] = (tok_trie_node_t){.child = -1, .sibling = -1, .token = -1, .byte = byte};
    return (int32_t)t->n++;
}

static int32_t tok_trie_child(const tok_trie_t *t, int32_t node, uint8_t byte) {
    for (int32_t c = t->nodes[node].child; c >= 0; c = t->nodes[c].sibling)
        if (t->nodes[c].byte == byte)
            return c;
    return -1;
}

/* Adds pattern s -> token; an existing identical pattern keeps its token
 * (Aho-Corasick reports the first pattern). */
svc_err_t tok_trie_add(tok_trie_t *t, const char *s, size_t n, int32_t token) {
    if (n == 0)
        return SVC_OK;
    uint8_t b = (uint8_t)s[0];
    if (t->root[b] < 0) {
        t->root[b] = tok_trie_new_node(t, b);
        if (t->root[b] < 0)
            return SVC_ERR_NOMEM;
    }
    int32_t node = t->root[b];
    for (size_t i = 1; i < n; i++) {
        int32_t c = tok_trie_child(t, node, (uint8_t)s[i]);
        if (c < 0) {
            c = tok_trie_new_node(t, (uint8_t)s[i]);
            if (c < 0)
                return SVC_ERR_NOMEM;
            t->nodes[c].sibling = t->nodes[node].child;
            t->nodes[node].child = c;
        }
        node = c;
    }
    if (t->nodes[node].token < 0)
        t->nodes[node].token = token;
    t->empty = false;
    return SVC_OK;
}

/* Longest pattern starting at s[i]: its token (or -1) and *end. */
static int32_t tok_trie_longest(const tok_trie_t *t, const char *s, size_t n, size_t i,
                                size_t *end) {
    int32_t node = t->root[(uint8_t)s[i]];
    int32_t best = -1;
    for (size_t j = i + 1; node >= 0; j++) {
        if (t->nodes[node].token >= 0) {
            best = t->nodes[node].token;
            *end = j;
        }
        if (j >= n)
            break;
        node = tok_trie_child(t, node, (uint8_t)s[j]);
    }
    return best;
}

static svc_err_t tok_asplits_push(tok_asplits_t *r, size_t a, size_t b, int32_t id) {
    if (b <= a)
        return SVC_OK; /* empty pieces are dropped upstream too */
    if (r->n == r->cap) {
        size_t        cap = r->cap ? r->cap * 2 : 16;
        tok_asplit_t *v = realloc(r->v, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (tok_asplit_t){.a = a, .b = b, .id = id};
    return SVC_OK;
}

static size_t tok_space_run_end(const char *s, size_t n, size_t i) {
    while (i < n) {
        size_t   len;
        uint32_t c = tok_utf8_decode(s + i, &len);
        if (!tok_is_space(c))
            break;
        i += len;
    }
    return i;
}

static size_t tok_space_run_start(const char *s, size_t i) {
    while (i > 0) {
        size_t k = i - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80)
            k--;
        size_t len;
        if (!tok_is_space(tok_utf8_decode(s + k, &len)))
            break;
        i = k;
    }
    return i;
}

static bool tok_single_word_ok(const char *s, size_t n, size_t a, size_t b) {
    if (a > 0 && tok_is_word(tok_utf8_decode_last(s, a)))
        return false;
    size_t len;
    return b >= n || !tok_is_word(tok_utf8_decode(s + b, &len));
}

/* AddedVocabulary::find_matches: splits s into text and added tokens. */
svc_err_t tok_find_added(const eng_tokenizer_t *tok, const tok_trie_t *t, const char *s, size_t n,
                         tok_asplits_t *out) {
    out->n = 0;
    if (t->empty)
        return tok_asplits_push(out, 0, n, -1);
    size_t    start_offset = 0;
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < n && !err;) {
        if (t->root[(uint8_t)s[i]] < 0) {
            i++;
            continue;
        }
        size_t  b = i;
        int32_t k = tok_trie_longest(t, s, n, i, &b);
        if (k < 0) {
            i++;
            continue;
        }
        const tok_added_t *at = &tok->added[k];
        size_t             a = i;
        i = b; /* the automaton resumes after the match, kept or not */
        if (at->single_word && !tok_single_word_ok(s, n, a, b))
            continue;
        if (at->lstrip) {
            size_t ns = tok_space_run_start(s, a);
            a = ns > start_offset ? ns : start_offset;
        }
        if (at->rstrip)
            b = tok_space_run_end(s, n, b);
        if (start_offset < a)
            err = tok_asplits_push(out, start_offset, a, -1);
        if (!err)
            err = tok_asplits_push(out, a, b, at->id);
        start_offset = b;
    }
    if (!err && start_offset < n)
        err = tok_asplits_push(out, start_offset, n, -1);
    return err;
}
