/*
 * eng_tokenizer.c -- the tokenizer API of engine.h: loading tokenizer.json
 * (+ tokenizer_config.json, SPEC c.7), the added-token tries and the encode
 * pipeline of Hugging Face `tokenizers` 0.23:
 *
 *   1. added tokens that are not `normalized` are split out of the raw text
 *      (leftmost-longest, with single_word/lstrip/rstrip as upstream's
 *      AddedVocabulary::find_matches);
 *   2. each remaining piece is normalised (NFC), then the `normalized` added
 *      tokens are split out of it;
 *   3. pre-tokenizer steps (Split, ByteLevel) cut the pieces further;
 *   4. BPE turns each piece into ids.
 *
 * The JSON is read with jansson; every refusal names the file and the entry
 * (model.* is read in eng_bpe.c, the added-token tries live in eng_pretok.c).
 */
#include "eng_tok_int.h"

#include "eng_util_int.h"

#include <errno.h>
#include <jansson.h>
#include <unistd.h>

/* ======================================================================
 * Token id lists
 * ====================================================================== */

void eng_ids_init(eng_ids_t *ids) {
    ids->v = NULL;
    ids->n = 0;
    ids->cap = 0;
}

void eng_ids_fini(eng_ids_t *ids) {
    free(ids->v);
    eng_ids_init(ids);
}

svc_err_t eng_ids_push(eng_ids_t *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *ids->v)
            return SVC_ERR_NOMEM;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return SVC_OK;
}

/* ======================================================================
 * Added tokens and their tries
 * ====================================================================== */

/* ======================================================================
 * Encoding
 * ====================================================================== */

typedef struct tok_level {
    tok_ranges_t r;
    svc_buf_t    pre; /* ByteLevel: the piece with its prefix space */
    svc_buf_t    map; /* ByteLevel: one mapped sub-piece */
} tok_level_t;

/* Everything one encode call owns; never shared between threads. */
typedef struct tok_run {
    const eng_tokenizer_t *tok;
    eng_ids_t             *ids;
    pcre2_match_data      *md;
    tok_bpe_scratch_t      bpe;
    svc_buf_t              norm;
    tok_asplits_t          raw;
    tok_asplits_t          sub;
    tok_level_t            lvl[TOK_MAX_STEPS];
} tok_run_t;

static svc_err_t tok_run_steps(tok_run_t *run, size_t k, const char *s, size_t n);

static svc_err_t tok_run_ranges(tok_run_t *run, size_t k, const char *s) {
    const tok_ranges_t *r = &run->lvl[k].r;
    for (size_t i = 0; i < r->n; i++) {
        svc_err_t err = tok_run_steps(run, k + 1, s + r->v[i].a, r->v[i].b - r->v[i].a);
        if (err)
            return err;
    }
    return SVC_OK;
}

static svc_err_t tok_run_byte_level(tok_run_t *run, size_t k, const char *s, size_t n) {
    const tok_step_t *st = &run->tok->steps[k];
    tok_level_t      *lv = &run->lvl[k];
    svc_err_t         err = SVC_OK;
    if (st->add_prefix_space && s[0] != ' ') {
        svc_buf_reset(&lv->pre);
        err = svc_buf_addc(&lv->pre, ' ');
        if (!err)
            err = svc_buf_add(&lv->pre, s, n);
        if (err)
            return err;
        s = lv->pre.data;
        n = lv->pre.len;
    }
    if (st->re) {
        tok_step_t iso = {.kind = TOK_STEP_SPLIT, .re = st->re, .behavior = TOK_SPLIT_ISOLATED};
        err = tok_split(&iso, run->md, s, n, &lv->r);
    } else {
        lv->r.n = 0;
        err = SVC_OK;
        if (lv->r.cap == 0) {
            lv->r.v = malloc(sizeof *lv->r.v);
            lv->r.cap = lv->r.v ? 1 : 0;
        }
        if (!lv->r.v)
            return SVC_ERR_NOMEM;
        lv->r.v[lv->r.n++] = (tok_range_t){.a = 0, .b = n};
    }
    for (size_t i = 0; i < lv->r.n && !err; i++) {
        svc_buf_reset(&lv->map);
        err = tok_byte_level_map(s + lv->r.v[i].a, lv->r.v[i].b - lv->r.v[i].a, &lv->map);
        if (!err)
            err = tok_run_steps(run, k + 1, lv->map.data, lv->map.len);
    }
    return err;
}

static svc_err_t tok_run_steps(tok_run_t *run, size_t k, const char *s, size_t n) {
    if (n == 0)
        return SVC_OK;
    if (k == run->tok->n_steps)
        return tok_bpe_encode(&run->tok->bpe, s, n, run->ids, &run->bpe);
    const tok_step_t *st = &run->tok->steps[k];
    if (st->kind == TOK_STEP_BYTE_LEVEL)
        return tok_run_byte_level(run, k, s, n);
    svc_err_t err = tok_split(st, run->md, s, n, &run->lvl[k].r);
    return err ? err : tok_run_ranges(run, k, s);
}

/* Normalises one raw text piece, splits out normalized added tokens, and
 * pre-tokenizes + encodes the rest. */
static svc_err_t tok_run_piece(tok_run_t *run, const char *s, size_t n) {
    const eng_tokenizer_t *tok = run->tok;
    if (tok->nfc) {
        svc_err_t err = tok_nfc(s, n, &run->norm, &s, &n);
        if (err)
            return err;
    }
    svc_err_t err = tok_find_added(tok, &tok->trie_norm, s, n, &run->sub);
    for (size_t i = 0; i < run->sub.n && !err; i++) {
        const tok_asplit_t *sp = &run->sub.v[i];
        if (sp->id >= 0)
            err = eng_ids_push(run->ids, sp->id);
        else
            err = tok_run_steps(run, 0, s + sp->a, sp->b - sp->a);
    }
    return err;
}

static void tok_run_fini(tok_run_t *run) {
    pcre2_match_data_free(run->md);
    tok_bpe_scratch_fini(&run->bpe);
    svc_buf_fini(&run->norm);
    free(run->raw.v);
    free(run->sub.v);
    for (size_t k = 0; k < TOK_MAX_STEPS; k++) {
        tok_ranges_fini(&run->lvl[k].r);
        svc_buf_fini(&run->lvl[k].pre);
        svc_buf_fini(&run->lvl[k].map);
    }
}

svc_err_t eng_tokenizer_encode(const eng_tokenizer_t *tok, const char *text, size_t len,
                               eng_ids_t *ids) {
    if (len && !text)
        return SVC_ERR_INVALID;
    if (tok_utf8_valid_prefix(text, len) != len)
        return SVC_ERR_INVALID;
    tok_run_t run;
    memset(&run, 0, sizeof run);
    run.tok = tok;
    run.ids = ids;
    run.md = pcre2_match_data_create(4, NULL);
    svc_buf_init(&run.norm, SIZE_MAX / 4);
    for (size_t k = 0; k < TOK_MAX_STEPS; k++) {
        svc_buf_init(&run.lvl[k].pre, SIZE_MAX / 4);
        svc_buf_init(&run.lvl[k].map, SIZE_MAX / 4);
    }
    size_t    n0 = ids->n;
    svc_err_t err = run.md ? SVC_OK : SVC_ERR_NOMEM;
    if (!err)
        err = tok_find_added(tok, &tok->trie_raw, text, len, &run.raw);
    for (size_t i = 0; i < run.raw.n && !err; i++) {
        const tok_asplit_t *sp = &run.raw.v[i];
        if (sp->id >= 0)
            err = eng_ids_push(ids, sp->id);
        else
            err = tok_run_piece(&run, text + sp->a, sp->b - sp->a);
    }
    tok_run_fini(&run);
    if (err) {
        ids->n = n0; /* all or nothing */
        if (err == SVC_ERR_TOO_LARGE)
            err = SVC_ERR_NOMEM;
    }
    return err;
}

int32_t eng_tokenizer_token_id(const eng_tokenizer_t *tok, const char *content, size_t len) {
    int32_t k = tok_smap_get(&tok->added_map, content, len);
    if (k >= 0)
        return tok->added[k].id;
    return tok_smap_get(&tok->bpe.vocab, content, len);
}

size_t eng_tokenizer_n_ids(const eng_tokenizer_t *tok) {
    size_t n = tok->bpe.n_ids;
    if (tok->n_added && (size_t)tok->added_max_id + 1 > n)
        n = (size_t)tok->added_max_id + 1;
    return n;
}

void eng_tokenizer_free(eng_tokenizer_t *tok) {
    if (!tok)
        return;
    tok_bpe_fini(&tok->bpe);
    for (size_t i = 0; i < tok->n_added; i++)
        free(tok->added[i].content);
    free(tok->added);
    tok_smap_fini(&tok->added_map);
    free(tok->trie_raw.nodes);
    free(tok->trie_norm.nodes);
    for (size_t k = 0; k < tok->n_steps; k++)
        pcre2_code_free(tok->steps[k].re);
    free(tok);
}

/* ======================================================================
 * Building (called by the loader below)
 * ====================================================================== */

/* The id upstream's AddedVocabulary::add_tokens gives a new token. */
static int32_t tok_next_added_id(const eng_tokenizer_t *tok, const char *s, size_t n) {
    int32_t id = eng_tokenizer_token_id(tok, s, n);
    if (id >= 0)
        return id;
    int32_t vocab_size = (int32_t)tok->bpe.vocab.n;
    if (tok->n_added == 0)
        return vocab_size;
    int32_t max = tok->added_max_id;
    return (max >= vocab_size || vocab_size == 0) ? max + 1 : vocab_size;
}

static svc_err_t tok_add_token(eng_tokenizer_t *tok, const tok_added_t *src, int32_t id) {
    if (tok->n_added == tok->cap_added) {
        size_t       cap = tok->cap_added ? tok->cap_added * 2 : 32;
        tok_added_t *v = realloc(tok->added, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        tok->added = v;
        tok->cap_added = cap;
    }
    tok_added_t *at = &tok->added[tok->n_added];
    *at = *src;
    at->id = id;
    /* n bytes, not strndup: JSON allows "\u0000" inside a token's content
     * (the file is read with JSON_ALLOW_NUL), and the map and tries read
     * all n. */
    at->content = malloc(src->n + 1);
    if (!at->content)
        return SVC_ERR_NOMEM;
    memcpy(at->content, src->content, src->n);
    at->content[src->n] = '\0';
    int32_t   old;
    svc_err_t err = tok_smap_put(&tok->added_map, at->content, at->n, (int32_t)tok->n_added, &old);
    if (err) {
        free(at->content);
        return err;
    }
    if (tok->n_added == 0 || id > tok->added_max_id)
        tok->added_max_id = id;
    tok->n_added++;
    return SVC_OK;
}

/* Specials first, then the others, each in insertion order (upstream's
 * refresh_added_tokens). */
static svc_err_t tok_build_tries(eng_tokenizer_t *tok) {
    tok_trie_init(&tok->trie_raw);
    tok_trie_init(&tok->trie_norm);
    svc_buf_t norm;
    svc_buf_init(&norm, SIZE_MAX / 4);
    svc_err_t err = SVC_OK;
    for (int pass = 0; pass < 2 && !err; pass++) {
        for (size_t i = 0; i < tok->n_added && !err; i++) {
            const tok_added_t *at = &tok->added[i];
            if (at->special != (pass == 0))
                continue;
            if (!at->normalized) {
                err = tok_trie_add(&tok->trie_raw, at->content, at->n, (int32_t)i);
                continue;
            }
            const char *s = at->content;
            size_t      n = at->n;
            if (tok->nfc)
                err = tok_nfc(s, n, &norm, &s, &n);
            if (!err)
                err = tok_trie_add(&tok->trie_norm, s, n, (int32_t)i);
        }
    }
    svc_buf_fini(&norm);
    return err;
}
/* ======================================================================
 * Loading
 * ====================================================================== */

SVC_FMT(3, 4)
svc_err_t tok_fail(const tok_src_t *src, svc_err_t err, const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(src->errstr, src->errstr_size, "%s \"%s\": %s", src->kind, src->path, msg);
    return err;
}

static svc_err_t tok_read_json(const tok_src_t *src, json_t **out) {
    json_error_t je;
    int          fd = eng_open_regular(src->path, NULL);
    FILE        *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return e == EINVAL ? tok_fail(src, SVC_ERR_IO, "not a regular file")
                           : tok_fail(src, SVC_ERR_IO, "open() failed: %s", strerror(e));
    }
    json_t *root = json_loadf(f, JSON_ALLOW_NUL, &je);
    fclose(f);
    if (!root)
        return tok_fail(src, SVC_ERR_FORMAT, "not valid JSON: %s (line %d, column %d)", je.text,
                        je.line, je.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return tok_fail(src, SVC_ERR_FORMAT, "the top level is not an object");
    }
    *out = root;
    return SVC_OK;
}

/* An optional boolean: absent or null gives def; another type fails. */
svc_err_t tok_get_bool(const tok_src_t *src, const json_t *obj, const char *key, const char *where,
                       bool def, bool *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return SVC_OK;
    }
    if (!json_is_boolean(v))
        return tok_fail(src, SVC_ERR_FORMAT, "%s.%s is not a boolean", where, key);
    *out = json_is_true(v);
    return SVC_OK;
}

/* ---- normalizer and pre-tokenizer ---- */

static svc_err_t tok_load_normalizer(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *n,
                                     const char *where) {
    if (!n || json_is_null(n))
        return SVC_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && strcmp(type, "NFC") == 0) {
        tok->nfc = true;
        return SVC_OK;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return tok_fail(src, SVC_ERR_FORMAT, "%s.normalizers is not an array", where);
        size_t  i;
        json_t *e;
        json_array_foreach(list, i, e) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            svc_err_t err = tok_load_normalizer(tok, src, e, sub);
            if (err)
                return err;
        }
        return SVC_OK;
    }
    return tok_fail(src, SVC_ERR_UNSUPPORTED,
                    "%s type \"%s\" is not supported (supported: NFC, Sequence, null)", where,
                    type ? type : "(missing)");
}

static svc_err_t tok_add_step(eng_tokenizer_t *tok, const tok_src_t *src, tok_step_t st,
                              const char *where) {
    if (tok->n_steps == TOK_MAX_STEPS) {
        pcre2_code_free(st.re);
        return tok_fail(src, SVC_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps", where,
                        TOK_MAX_STEPS);
    }
    tok->steps[tok->n_steps++] = st;
    return SVC_OK;
}

static svc_err_t tok_compile(const tok_src_t *src, const char *pat, size_t n, bool literal,
                             const char *where, pcre2_code **re) {
    char      why[256];
    svc_err_t err = tok_regex_compile(pat, n, literal, re, why, sizeof why);
    return err ? tok_fail(src, err, "%s: %s", where, why) : SVC_OK;
}

static svc_err_t tok_load_split(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *p,
                                const char *where) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    const json_t      *pat = json_object_get(p, "pattern");
    const json_t      *rx = json_object_get(pat, "Regex");
    const json_t      *lit = json_object_get(pat, "String");
    const json_t      *s = rx ? rx : lit;
    if (!json_is_string(s))
        return tok_fail(src, SVC_ERR_FORMAT,
                        "%s.pattern is not {\"Regex\": ...} or {\"String\": ...}", where);
    const char *bh = json_string_value(json_object_get(p, "behavior"));
    tok_step_t  st = {.kind = TOK_STEP_SPLIT, .behavior = 99};
    for (int i = 0; bh && i < 5; i++)
        if (strcmp(bh, names[i]) == 0)
            st.behavior = (tok_split_behavior_t)i;
    if ((int)st.behavior == 99)
        return tok_fail(src, SVC_ERR_FORMAT, "%s.behavior \"%s\" is not supported", where,
                        bh ? bh : "(missing)");
    svc_err_t err = tok_get_bool(src, p, "invert", where, false, &st.invert);
    if (!err)
        err =
            tok_compile(src, json_string_value(s), json_string_length(s), s == lit, where, &st.re);
    return err ? err : tok_add_step(tok, src, st, where);
}

static svc_err_t tok_load_byte_level(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *p,
                                     const char *where) {
    tok_step_t st = {.kind = TOK_STEP_BYTE_LEVEL};
    bool       use_regex = true;
    svc_err_t  err = tok_get_bool(src, p, "add_prefix_space", where, true, &st.add_prefix_space);
    if (!err)
        err = tok_get_bool(src, p, "use_regex", where, true, &use_regex);
    if (!err && use_regex)
        err = tok_compile(src, tok_gpt2_pattern, strlen(tok_gpt2_pattern), false, where, &st.re);
    return err ? err : tok_add_step(tok, src, st, where);
}

static svc_err_t tok_load_pretok(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *p,
                                 const char *where) {
    if (!p || json_is_null(p))
        return SVC_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && strcmp(type, "Split") == 0)
        return tok_load_split(tok, src, p, where);
    if (type && strcmp(type, "ByteLevel") == 0)
        return tok_load_byte_level(tok, src, p, where);
    if (!type || strcmp(type, "Sequence") != 0)
        return tok_fail(src, SVC_ERR_UNSUPPORTED,
                        "%s type \"%s\" is not supported (supported: Sequence, Split, ByteLevel)",
                        where, type ? type : "(missing)");
    const json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list))
        return tok_fail(src, SVC_ERR_FORMAT, "%s.pretokenizers is not an array", where);
    size_t  i;
    json_t *e;
    json_array_foreach(list, i, e) {
        char sub[128];
        snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
        svc_err_t err = tok_load_pretok(tok, src, e, sub);
        if (err)
            return err;
    }
    return SVC_OK;
}

/* SPEC c.7: the Qwen2Tokenizer split, then bytes without prefix or regex. */
static svc_err_t tok_set_upstream_pretok(eng_tokenizer_t *tok, const tok_src_t *src) {
    tok_step_t split = {.kind = TOK_STEP_SPLIT, .behavior = TOK_SPLIT_ISOLATED};
    svc_err_t  err = tok_compile(src, tok_qwen2_pattern, strlen(tok_qwen2_pattern), false,
                                 "Qwen2 pre-tokenizer", &split.re);
    if (!err)
        err = tok_add_step(tok, src, split, "pre_tokenizer");
    if (!err)
        err = tok_add_step(tok, src, (tok_step_t){.kind = TOK_STEP_BYTE_LEVEL}, "pre_tokenizer");
    return err;
}

/* ---- added tokens ---- */

/* normalized defaults to !special in tokenizer.json (tokenizers'
 * AddedToken) and to false in a tokenizer_config.json entry (upstream
 * builds those with bool(entry.get("normalized", False))): config_entry. */
static svc_err_t tok_read_flags(const tok_src_t *src, const json_t *e, const char *where,
                                bool special_default, bool config_entry, tok_added_t *at) {
    svc_err_t err = tok_get_bool(src, e, "special", where, special_default, &at->special);
    if (!err)
        err = tok_get_bool(src, e, "single_word", where, false, &at->single_word);
    if (!err)
        err = tok_get_bool(src, e, "lstrip", where, false, &at->lstrip);
    if (!err)
        err = tok_get_bool(src, e, "rstrip", where, false, &at->rstrip);
    if (!err)
        err = tok_get_bool(src, e, "normalized", where, !config_entry && !at->special,
                           &at->normalized);
    return err;
}

/* Adds one token, checking that upstream would give it `want`. */
static svc_err_t tok_add_checked(eng_tokenizer_t *tok, const tok_src_t *src, tok_added_t *at,
                                 json_int_t want, const char *where) {
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == want)
            return tok_fail(src, SVC_ERR_FORMAT, "%s \"%s\": id %lld is already \"%s\"", where,
                            at->content, (long long)want, tok->added[i].content);
    int32_t id = tok_next_added_id(tok, at->content, at->n);
    if (id != want)
        return tok_fail(
            src, SVC_ERR_FORMAT,
            "%s \"%s\" has id %lld but would get id %d (ids must follow the vocabulary)", where,
            at->content, (long long)want, (int)id);
    if (tok_add_token(tok, at, id))
        return tok_fail(src, SVC_ERR_NOMEM, "out of memory");
    return SVC_OK;
}

static svc_err_t tok_load_added(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *list) {
    if (!list || json_is_null(list))
        return SVC_OK;
    if (!json_is_array(list))
        return tok_fail(src, SVC_ERR_FORMAT, "added_tokens is not an array");
    size_t  i;
    json_t *e;
    json_array_foreach(list, i, e) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        const json_t *c = json_object_get(e, "content");
        const json_t *id = json_object_get(e, "id");
        if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0)
            return tok_fail(src, SVC_ERR_FORMAT, "%s needs a string content and an id >= 0", where);
        tok_added_t at = {.content = (char *)json_string_value(c), .n = json_string_length(c)};
        svc_err_t   err = tok_read_flags(src, e, where, false, false, &at);
        if (err)
            return err;
        if (at.n == 0)
            continue; /* upstream ignores empty tokens */
        if (tok_smap_get(&tok->added_map, at.content, at.n) >= 0)
            return tok_fail(src, SVC_ERR_FORMAT, "%s \"%s\" is listed twice", where, at.content);
        err = tok_add_checked(tok, src, &at, json_integer_value(id), where);
        if (err)
            return err;
    }
    return SVC_OK;
}

/* ---- tokenizer_config.json (SPEC c.7) ---- */

static int tok_cmp_id(const void *x, const void *y) {
    long long a = *(const long long *)x, b = *(const long long *)y;
    return (a > b) - (a < b);
}

static svc_err_t tok_config_added(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *dec) {
    if (!dec || json_is_null(dec))
        return SVC_OK;
    if (!json_is_object(dec))
        return tok_fail(src, SVC_ERR_FORMAT, "added_tokens_decoder is not an object");
    size_t     n = json_object_size(dec);
    long long *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return tok_fail(src, SVC_ERR_NOMEM, "out of memory");
    size_t      k = 0;
    const char *key;
    json_t     *v;
    svc_err_t   err = SVC_OK;
    json_object_foreach((json_t *)dec, key, v) {
        char     *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id >= TOK_MAX_ID) {
            err = tok_fail(src, SVC_ERR_FORMAT,
                           "added_tokens_decoder[\"%s\"]: the key is not an id", key);
            break;
        }
        ids[k++] = id;
    }
    if (!err)
        qsort(ids, k, sizeof *ids, tok_cmp_id);
    for (size_t i = 0; i < k && !err; i++) {
        char key2[32], where[64];
        snprintf(key2, sizeof key2, "%lld", ids[i]);
        snprintf(where, sizeof where, "added_tokens_decoder[\"%lld\"]", ids[i]);
        const json_t *e = json_object_get(dec, key2);
        const json_t *c = json_object_get(e, "content");
        if (!json_is_string(c) || json_string_length(c) == 0) {
            err = tok_fail(src, SVC_ERR_FORMAT, "%s has no string content", where);
            break;
        }
        tok_added_t at = {.content = (char *)json_string_value(c), .n = json_string_length(c)};
        if (tok_smap_get(&tok->added_map, at.content, at.n) >= 0)
            continue;
        err = tok_read_flags(src, e, where, true, true, &at);
        at.special = true; /* SPEC c.7: added as special whatever the entry says */
        if (!err)
            err = tok_add_checked(tok, src, &at, ids[i], where);
    }
    free(ids);
    return err;
}

static svc_err_t tok_config_checks(eng_tokenizer_t *tok, const tok_src_t *src, const json_t *cfg) {
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    if (!cls || (strcmp(cls, "Qwen2Tokenizer") != 0 && strcmp(cls, "Qwen2TokenizerFast") != 0))
        return tok_fail(src, SVC_ERR_UNSUPPORTED,
                        "tokenizer_class \"%s\" is not Qwen2Tokenizer or Qwen2TokenizerFast",
                        cls ? cls : "(missing)");
    const char *flags[] = {"add_prefix_space", "add_bos_token"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *f = json_object_get(cfg, flags[i]);
        if (f && !json_is_null(f) && !json_is_false(f))
            return tok_fail(src, SVC_ERR_UNSUPPORTED, "%s must be null or false", flags[i]);
    }
    const json_t *pad = json_object_get(cfg, "pad_token");
    if (json_is_object(pad))
        pad = json_object_get(pad, "content");
    if (!json_is_string(pad))
        return tok_fail(src, SVC_ERR_FORMAT, "pad_token is missing or not a string/{content}");
    if (eng_tokenizer_token_id(tok, json_string_value(pad), json_string_length(pad)) < 0)
        return tok_fail(src, SVC_ERR_FORMAT, "pad_token \"%s\" is not a token",
                        json_string_value(pad));
    return SVC_OK;
}

static svc_err_t tok_load_config(eng_tokenizer_t *tok, const char *path, char *errstr,
                                 size_t errstr_size) {
    tok_src_t src = {"tokenizer_config.json", path, errstr, errstr_size};
    json_t   *cfg = NULL;
    svc_err_t err = tok_read_json(&src, &cfg);
    if (!err)
        err = tok_config_added(tok, &src, json_object_get(cfg, "added_tokens_decoder"));
    if (!err)
        err = tok_config_checks(tok, &src, cfg);
    json_decref(cfg);
    return err;
}

static svc_err_t tok_load_main(eng_tokenizer_t *tok, const tok_src_t *src, eng_tok_mode_t mode,
                               const json_t *root) {
    const char *unused[] = {"truncation", "padding"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, unused[i]);
        if (v && !json_is_null(v))
            return tok_fail(src, SVC_ERR_UNSUPPORTED, "%s is set; only null is supported",
                            unused[i]);
    }
    svc_err_t err = tok_bpe_load(&tok->bpe, src, root);
    if (!err)
        err = tok_load_normalizer(tok, src, json_object_get(root, "normalizer"), "normalizer");
    if (!err && mode == ENG_TOK_AS_IS)
        err = tok_load_pretok(tok, src, json_object_get(root, "pre_tokenizer"), "pre_tokenizer");
    else if (!err)
        err = tok_set_upstream_pretok(tok, src);
    if (!err)
        err = tok_load_added(tok, src, json_object_get(root, "added_tokens"));
    return err;
}

svc_err_t eng_tokenizer_load(const char *json_path, const char *config_path, eng_tok_mode_t mode,
                             eng_tokenizer_t **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    tok_src_t        src = {"tokenizer.json", json_path, errstr, errstr_size};
    eng_tokenizer_t *tok = calloc(1, sizeof *tok);
    if (!tok)
        return tok_fail(&src, SVC_ERR_NOMEM, "out of memory");
    tok_smap_init(&tok->added_map);
    svc_err_t err = tok_bpe_init(&tok->bpe);
    json_t   *root = NULL;
    if (!err)
        err = tok_read_json(&src, &root);
    if (!err)
        err = tok_load_main(tok, &src, mode, root);
    json_decref(root);
    if (!err && mode == ENG_TOK_UPSTREAM && config_path)
        err = tok_load_config(tok, config_path, errstr, errstr_size);
    if (!err && (tok_build_tries(tok) || tok_bpe_enable_cache(&tok->bpe)))
        err = tok_fail(&src, SVC_ERR_NOMEM, "out of memory");
    if (err) {
        eng_tokenizer_free(tok);
        return err;
    }
    *out = tok;
    return SVC_OK;
}
