/*
 * eng_pkgwrite_tok.c -- the tokenizer of a synthetic package and its 255
 * answer codes (SPEC c.5, c.7).
 *
 * Either the files of --tokenizer DIR are copied byte for byte, or a small
 * byte-level BPE tokenizer is written (as tests/tools/make_qwen35_mini_tokenizer.py
 * does, without training): the 256 byte symbols in the GPT-2 byte-level
 * alphabet and order (so "A" is id 32 as in Qwen's vocabulary), one merge
 * per two-letter code AA..IU, a few common English merges so that prose
 * is not all single bytes, and the Qwen chat special tokens right after.
 * Either way the files are then loaded in UPSTREAM mode -- as the runtime
 * will load them -- and the codes are the first 255 candidates A..Z,
 * AA..ZZ that are one token alone and right after the assistant prefix.
 */
#include "eng_pkgwrite_int.h"

/* The text right before the answer code (eng_prompt.c). */
#define PW_ASSISTANT_PREFIX "<|im_start|>assistant\n<think>\n\n</think>\n\n"

/* Special tokens (special: true) then the not-special think tags, as the
 * Qwen3.5 tokenizer lists them (a subset). */
static const char *const SPECIAL[] = {
    "<|endoftext|>",  "<|im_start|>",   "<|im_end|>",    "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
};
static const char *const NOT_SPECIAL[] = {"<think>", "</think>"};

/* Common English merges (raw text), in rank order after the code merges;
 * each side must already be a token when its merge is reached. */
static const char *const ENGLISH[][2] = {
    {" ", "t"},  {" ", "a"},     {"h", "e"},  {"i", "n"},  {"r", "e"},  {"o", "n"},   {" t", "he"},
    {"e", "r"},  {" ", "s"},     {"a", "t"},  {" ", "w"},  {" ", "o"},  {"e", "n"},   {" ", "c"},
    {"i", "t"},  {"i", "s"},     {"a", "n"},  {"o", "r"},  {"e", "s"},  {" ", "b"},   {"e", "d"},
    {" ", "f"},  {"in", "g"},    {" ", "p"},  {"o", "u"},  {" a", "n"}, {"a", "l"},   {"a", "r"},
    {" t", "o"}, {" ", "m"},     {" o", "f"}, {" ", "in"}, {" ", "d"},  {" ", "h"},   {" an", "d"},
    {"i", "on"}, {"t", "ion"},   {" ", "is"}, {"l", "e"},  {"i", "c"},  {"\n", "\n"}, {"t", "h"},
    {"o", "p"},  {"op", "tion"}, {" ", "r"},  {" ", "e"},  {"e", "l"},  {"a", "s"},   {"s", "t"},
    {"e", "t"},  {"o", "m"},     {"o", "w"},  {"c", "h"},
};

/* ---- the GPT-2 byte-level alphabet ---- */

/* Code point of byte b: printable Latin-1 bytes map to themselves, the
 * others to 256, 257, ... in byte order. */
static uint32_t byte_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae))
        return b;
    uint32_t n = 0;
    for (uint32_t x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae)))
            n++;
    return 256 + n;
}

/* The 256 bytes in vocabulary order: the printable ones, then the rest. */
static void byte_order(uint8_t order[256]) {
    size_t k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (unsigned b = 0; b < 256; b++)
            if ((byte_cp((uint8_t)b) < 256) == (pass == 0))
                order[k++] = (uint8_t)b;
}

/* n raw bytes -> their byte-level string (UTF-8, NUL-terminated) in out. */
static void to_byte_level(const uint8_t *raw, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 3 < cap; i++) {
        uint32_t cp = byte_cp(raw[i]);
        if (cp < 0x80)
            out[k++] = (char)cp;
        else {
            out[k++] = (char)(0xc0 | (cp >> 6));
            out[k++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    out[k] = '\0';
}

static void str_byte_level(const char *raw, char *out, size_t cap) {
    to_byte_level((const uint8_t *)raw, strlen(raw), out, cap);
}

/* ---- tokenizer.json ---- */

typedef struct pw_vocab {
    json_t *vocab;  /* token -> id */
    json_t *merges; /* [[a, b], ...] */
    size_t  n;
} pw_vocab_t;

static svc_err_t voc_add(pw_vocab_t *v, const char *tok) {
    if (json_object_get(v->vocab, tok))
        return SVC_ERR_INTERNAL; /* a duplicate in our own tables */
    return json_object_set_new(v->vocab, tok, json_integer((json_int_t)v->n++)) ? SVC_ERR_NOMEM
                                                                                : SVC_OK;
}

/* A merge of two raw strings; both sides must be tokens already. */
static svc_err_t voc_merge(pw_vocab_t *v, const char *a_raw, const char *b_raw) {
    char a[32], b[32], ab[64];
    str_byte_level(a_raw, a, sizeof a);
    str_byte_level(b_raw, b, sizeof b);
    snprintf(ab, sizeof ab, "%s%s", a, b);
    if (!json_object_get(v->vocab, a) || !json_object_get(v->vocab, b))
        return SVC_ERR_INTERNAL;
    svc_err_t err = voc_add(v, ab);
    if (!err && json_array_append_new(v->merges, json_pack("[ss]", a, b)))
        err = SVC_ERR_NOMEM;
    return err;
}

static svc_err_t voc_build(pw_vocab_t *v) {
    uint8_t   order[256];
    svc_err_t err = SVC_OK;
    byte_order(order);
    for (size_t i = 0; i < 256 && !err; i++) {
        char bl[4];
        to_byte_level(&order[i], 1, bl, sizeof bl);
        err = voc_add(v, bl);
    }
    /* the two-letter codes AA..IU (26 + 229 = 255 codes) */
    for (size_t i = 26; i < ENG_N_CODES && !err; i++) {
        char a[2] = {(char)('A' + (i - 26) / 26), 0}, b[2] = {(char)('A' + (i - 26) % 26), 0};
        err = voc_merge(v, a, b);
    }
    for (size_t i = 0; i < sizeof ENGLISH / sizeof ENGLISH[0] && !err; i++)
        err = voc_merge(v, ENGLISH[i][0], ENGLISH[i][1]);
    return err;
}

static json_t *added_entry(size_t id, const char *content, bool special) {
    return json_pack("{sIsssbsbsbsbsb}", "id", (json_int_t)id, "content", content, "single_word", 0,
                     "lstrip", 0, "rstrip", 0, "normalized", 0, "special", special);
}

/* added_tokens (tokenizer.json) and added_tokens_decoder (config). */
static svc_err_t added_tokens(size_t first, json_t *list, json_t *decoder) {
    size_t n_sp = sizeof SPECIAL / sizeof SPECIAL[0];
    size_t n = n_sp + sizeof NOT_SPECIAL / sizeof NOT_SPECIAL[0];
    for (size_t i = 0; i < n; i++) {
        const char *content = i < n_sp ? SPECIAL[i] : NOT_SPECIAL[i - n_sp];
        json_t     *e = added_entry(first + i, content, i < n_sp);
        json_t     *d = e ? json_deep_copy(e) : NULL;
        char        key[24];
        snprintf(key, sizeof key, "%zu", first + i);
        if (d)
            json_object_del(d, "id");
        if (!e || !d || json_array_append_new(list, e) || json_object_set_new(decoder, key, d))
            return SVC_ERR_NOMEM;
    }
    return SVC_OK;
}

/* SPEC c.7 pattern (make_qwen35_mini_tokenizer.py QWEN35_PATTERN). */
static const char QWEN35_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *byte_level_json(void) {
    return json_pack("{sssbsbsb}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", 0);
}

static json_t *model_json(pw_vocab_t *v) {
    json_t *m = json_pack("{sssnsnsssssbsbsb}", "type", "BPE", "dropout", "unk_token",
                          "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0,
                          "byte_fallback", 0, "ignore_merges", 0);
    if (m && (json_object_set(m, "vocab", v->vocab) || json_object_set(m, "merges", v->merges))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* The whole tokenizer.json object (key order as the tokenizers library writes). */
static json_t *tok_json(pw_vocab_t *v, json_t *added) {
    json_t *split = json_pack("{sss{ss}sssb}", "type", "Split", "pattern", "Regex", QWEN35_PATTERN,
                              "behavior", "Isolated", "invert", 0);
    json_t *pre =
        json_pack("{sss[oo]}", "type", "Sequence", "pretokenizers", split, byte_level_json());
    json_t *root =
        json_pack("{sssnsnsOs{ss}so}", "version", "1.0", "truncation", "padding", "added_tokens",
                  added, "normalizer", "type", "NFC", "pre_tokenizer", pre);
    if (root && (json_object_set_new(root, "post_processor", byte_level_json()) ||
                 json_object_set_new(root, "decoder", byte_level_json()) ||
                 json_object_set_new(root, "model", model_json(v)))) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static json_t *config_json(json_t *decoder) {
    json_t *extra = json_array();
    for (size_t i = 1; extra && i < sizeof SPECIAL / sizeof SPECIAL[0]; i++)
        json_array_append_new(extra, json_string(SPECIAL[i]));
    return json_pack("{sbsbsOsosnsbsssssisssbsssn}", "add_bos_token", 0, "add_prefix_space", 0,
                     "added_tokens_decoder", decoder, "additional_special_tokens", extra,
                     "bos_token", "clean_up_tokenization_spaces", 0, "eos_token", "<|im_end|>",
                     "errors", "replace", "model_max_length", 262144, "pad_token", "<|endoftext|>",
                     "split_special_tokens", 0, "tokenizer_class", "Qwen2Tokenizer", "unk_token");
}

static svc_err_t own_tokenizer(const pw_ctx_t *c) {
    pw_vocab_t v = {json_object(), json_array(), 0};
    json_t    *added = json_array(), *decoder = json_object();
    json_t    *tj = NULL, *cj = NULL;
    svc_err_t  err = v.vocab && v.merges && added && decoder ? SVC_OK : SVC_ERR_NOMEM;
    if (!err)
        err = voc_build(&v);
    if (!err)
        err = added_tokens(v.n, added, decoder);
    if (!err && (!(tj = tok_json(&v, added)) || !(cj = config_json(decoder))))
        err = SVC_ERR_NOMEM;
    if (!err)
        err = pw_write_json(c, "tokenizer.json", tj, 0);
    if (!err)
        err = pw_write_json(c, "tokenizer_config.json", cj, 0);
    if (err == SVC_ERR_INTERNAL)
        svc_errf(c->errstr, c->errstr_size, "the built-in tokenizer tables are inconsistent");
    json_decref(tj);
    json_decref(cj);
    json_decref(v.vocab);
    json_decref(v.merges);
    json_decref(added);
    json_decref(decoder);
    return err;
}

/* ---- --tokenizer DIR: byte-for-byte copies ---- */

static svc_err_t copy_file(const pw_ctx_t *c, const char *name) {
    char     *src = eng_path_join(c->opts->tokenizer_dir, name);
    FILE     *f = src ? fopen(src, "rb") : NULL;
    svc_buf_t b;
    svc_buf_init(&b, (size_t)1 << 30);
    svc_err_t err = src ? SVC_OK : SVC_ERR_NOMEM;
    if (!err && !f) {
        svc_errf(c->errstr, c->errstr_size, "open() \"%s\" failed: %s", src, strerror(errno));
        err = SVC_ERR_IO;
    }
    char   chunk[65536];
    size_t n;
    while (!err && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        err = svc_buf_add(&b, chunk, n);
    if (!err && ferror(f)) {
        svc_errf(c->errstr, c->errstr_size, "read() \"%s\" failed", src);
        err = SVC_ERR_IO;
    }
    if (f)
        fclose(f);
    if (!err)
        err = pw_write_file(c, name, b.data ? b.data : "", b.len);
    svc_buf_fini(&b);
    free(src);
    return err;
}

/* ---- the codes (SPEC c.5) ---- */

static bool ids_equal(const eng_ids_t *a, const eng_ids_t *b, size_t n) {
    return memcmp(a->v, b->v, n * sizeof *a->v) == 0;
}

/* The id of code when it is one token alone and stays one right after
 * the assistant prefix; -1 otherwise. */
static int32_t code_token(const eng_tokenizer_t *tok, const eng_ids_t *prefix, const char *code) {
    eng_ids_t alone, both;
    char      text[sizeof PW_ASSISTANT_PREFIX + 3];
    int32_t   id = -1;
    eng_ids_init(&alone);
    eng_ids_init(&both);
    snprintf(text, sizeof text, "%s%s", PW_ASSISTANT_PREFIX, code);
    if (!eng_tokenizer_encode(tok, code, strlen(code), &alone) && alone.n == 1 &&
        !eng_tokenizer_encode(tok, text, strlen(text), &both) && both.n == prefix->n + 1 &&
        ids_equal(&both, prefix, prefix->n) && both.v[prefix->n] == alone.v[0])
        id = alone.v[0];
    eng_ids_fini(&alone);
    eng_ids_fini(&both);
    return id;
}

static svc_err_t pick_codes(pw_ctx_t *c) {
    eng_ids_t prefix;
    eng_ids_init(&prefix);
    svc_err_t err =
        eng_tokenizer_encode(c->tok, PW_ASSISTANT_PREFIX, strlen(PW_ASSISTANT_PREFIX), &prefix);
    size_t n = 0;
    for (size_t k = 0; !err && k < 26 + 26 * 26 && n < ENG_N_CODES; k++) {
        char code[3] = {0};
        if (k < 26)
            code[0] = (char)('A' + k);
        else {
            code[0] = (char)('A' + (k - 26) / 26);
            code[1] = (char)('A' + (k - 26) % 26);
        }
        int32_t id = code_token(c->tok, &prefix, code);
        if (id < 0)
            continue;
        memcpy(c->codes[n], code, sizeof code);
        c->code_ids[n++] = id;
    }
    eng_ids_fini(&prefix);
    if (!err && n < ENG_N_CODES) {
        svc_errf(c->errstr, c->errstr_size,
                 "tokenizer \"%s\": only %zu of the candidates A..Z, AA..ZZ are single tokens, "
                 "255 answer codes are needed (SPEC c.5)",
                 c->opts->tokenizer_dir ? c->opts->tokenizer_dir : c->opts->out_dir, n);
        err = SVC_ERR_FORMAT;
    }
    return err;
}

svc_err_t pw_tokenizer(pw_ctx_t *c) {
    svc_err_t err;
    if (c->opts->tokenizer_dir) {
        err = copy_file(c, "tokenizer.json");
        if (!err)
            err = copy_file(c, "tokenizer_config.json");
    } else
        err = own_tokenizer(c);
    char *tj = err ? NULL : eng_path_join(c->opts->out_dir, "tokenizer.json");
    char *cj = err ? NULL : eng_path_join(c->opts->out_dir, "tokenizer_config.json");
    if (!err && (!tj || !cj))
        err = SVC_ERR_NOMEM;
    if (!err)
        err = eng_tokenizer_load(tj, cj, ENG_TOK_UPSTREAM, &c->tok, c->errstr, c->errstr_size);
    free(tj);
    free(cj);
    return err ? err : pick_codes(c);
}
