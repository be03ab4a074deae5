/*
 * eng_tok_int.h -- private declarations shared by the tokenizer sources:
 * eng_bpe.c (vocabulary, merges, BPE with a result cache), eng_pretok.c
 * (UTF-8, Unicode classes, NFC, regex splits, byte-level mapping) and
 * eng_tokenizer.c (file loading, added tokens, the encode pipeline).
 *
 * The pipeline reproduces Hugging Face `tokenizers` 0.23:
 * added tokens -> normalizer -> pre-tokenizer steps -> BPE, each stage
 * working only on the pieces that are not yet an added token.
 */
#ifndef D3STREAM_ENG_TOK_INT_H
#define D3STREAM_ENG_TOK_INT_H

#include "engine.h"

#include <pthread.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Ids at or above this are refused at load (keeps id tables small). */
#define TOK_MAX_ID (1 << 24)
/* Pre-tokenizer steps after flattening Sequences. */
#define TOK_MAX_STEPS 16

uint64_t tok_hash(const void *p, size_t n);

/* ======================================================================
 * String -> id map (open addressing; keys copied into a pool)
 * ====================================================================== */

typedef struct tok_smap_slot {
    uint64_t h;
    uint32_t off; /* into pool */
    uint32_t len;
    int32_t  id; /* -1: empty slot */
} tok_smap_slot_t;

typedef struct tok_smap {
    tok_smap_slot_t *slots;
    size_t           mask; /* capacity - 1 (a power of two) */
    size_t           n;
    svc_buf_t        pool;
} tok_smap_t;

void tok_smap_init(tok_smap_t *m);
void tok_smap_fini(tok_smap_t *m);
/* Inserts key -> id. *old is set to the id already stored under key
 * (and nothing changes), or -1 when the key was new. */
SVC_WUR svc_err_t tok_smap_put(tok_smap_t *m, const char *s, size_t n, int32_t id, int32_t *old);
int32_t           tok_smap_get(const tok_smap_t *m, const char *s, size_t n);

/* ======================================================================
 * BPE model (eng_bpe.c)
 * ====================================================================== */

typedef struct tok_merge_slot {
    uint64_t key;  /* (a << 32) | b; UINT64_MAX: empty */
    uint32_t rank; /* index in model.merges */
    int32_t  id;   /* id of the merged token */
} tok_merge_slot_t;

typedef struct tok_cache tok_cache_t;

typedef struct tok_bpe {
    tok_smap_t        vocab; /* token (as in the file) -> id */
    size_t            n_ids; /* largest vocab id + 1 */
    tok_merge_slot_t *merges;
    size_t            merge_mask;
    size_t            n_merges;
    int32_t           char_id[0x180]; /* one-character tokens below U+0180; -1: none */
    bool              ignore_merges;
    tok_cache_t      *cache; /* owned; NULL: no cache */
} tok_bpe_t;

/* Per-encode scratch (owned by one call, reused across words). */
typedef struct tok_bpe_scratch {
    struct tok_sym   *sym;
    size_t            sym_cap;
    struct tok_merge *heap;
    size_t            heap_cap;
} tok_bpe_scratch_t;

SVC_WUR svc_err_t tok_bpe_init(tok_bpe_t *bpe);
void              tok_bpe_fini(tok_bpe_t *bpe);
/* Adds a vocabulary entry. SVC_ERR_INVALID: the token is already there,
 * with id *clash. (Duplicate ids are the loader's check.) */
SVC_WUR svc_err_t tok_bpe_add_token(tok_bpe_t *bpe, const char *s, size_t n, int32_t id,
                                    int32_t *clash);
/* Builds char_id once every token is in. */
SVC_WUR svc_err_t tok_bpe_index(tok_bpe_t *bpe);
/* Adds merge `rank`. SVC_ERR_INVALID: *bad names the unknown token
 * (0 = a, 1 = b, 2 = a+b); SVC_ERR_NOMEM. */
SVC_WUR svc_err_t tok_bpe_add_merge(tok_bpe_t *bpe, const char *a, size_t an, const char *b,
                                    size_t bn, uint32_t rank, int *bad);
SVC_WUR svc_err_t tok_bpe_reserve_merges(tok_bpe_t *bpe, size_t n);
/* Enables the bounded, lock-striped word cache. */
SVC_WUR svc_err_t tok_bpe_enable_cache(tok_bpe_t *bpe);
/* Appends the ids of one pre-tokenized word (model-space UTF-8).
 * @locality any thread; @locks the cache stripe of the word, briefly. */
SVC_WUR svc_err_t tok_bpe_encode(const tok_bpe_t *bpe, const char *w, size_t n, eng_ids_t *ids,
                                 tok_bpe_scratch_t *sc);
void              tok_bpe_scratch_fini(tok_bpe_scratch_t *sc);

/* ======================================================================
 * Text helpers and pre-tokenizer steps (eng_pretok.c)
 * ====================================================================== */

/* Length of the valid UTF-8 (Rust str rules) prefix of s; == n when valid. */
size_t tok_utf8_valid_prefix(const char *s, size_t n);
/* Decodes the character at s (valid UTF-8); *len gets its byte length. */
uint32_t tok_utf8_decode(const char *s, size_t *len);
/* Decodes the character that ends at s + n (n > 0, valid UTF-8). */
uint32_t tok_utf8_decode_last(const char *s, size_t n);
/* Unicode White_Space (Rust char::is_whitespace, regex \s). */
bool tok_is_space(uint32_t c);
/* Rust regex \w: Alphabetic, Mark, Nd, Pc, Join_Control. */
bool tok_is_word(uint32_t c);

/* NFC of s: *res is s itself when s is already NFC-stable by a quick scan,
 * else out->data (replaced), valid until out changes. */
SVC_WUR svc_err_t tok_nfc(const char *s, size_t n, svc_buf_t *out, const char **res, size_t *res_n);

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED = 0,
    TOK_SPLIT_ISOLATED = 1,
    TOK_SPLIT_MERGED_WITH_PREVIOUS = 2,
    TOK_SPLIT_MERGED_WITH_NEXT = 3,
    TOK_SPLIT_CONTIGUOUS = 4,
} tok_split_behavior_t;

typedef enum tok_step_kind {
    TOK_STEP_SPLIT = 0,
    TOK_STEP_BYTE_LEVEL = 1,
} tok_step_kind_t;

typedef struct tok_step {
    tok_step_kind_t      kind;
    pcre2_code          *re; /* owned; Split's pattern, ByteLevel's GPT-2 regex or NULL */
    tok_split_behavior_t behavior;
    bool                 invert;
    bool                 add_prefix_space; /* ByteLevel */
} tok_step_t;

/* Compiles an Oniguruma (Ruby syntax) pattern for PCRE2, rewriting the
 * escapes whose meaning differs (\s \S \h \H \w \W \uHHHH). literal: the
 * pattern is a plain string (Split {"String": ...}).
 * @param errstr gets PCRE2's message and the offset. */
SVC_WUR svc_err_t tok_regex_compile(const char *pat, size_t n, bool literal, pcre2_code **out,
                                    char *errstr, size_t errstr_size);
extern const char tok_gpt2_pattern[];
extern const char tok_qwen2_pattern[];

/* One (start, end) range of a piece, relative to the piece. */
typedef struct tok_range {
    size_t a;
    size_t b;
    bool   m; /* a regex match (scratch while splitting) */
} tok_range_t;

typedef struct tok_ranges {
    tok_range_t *v;
    size_t       n;
    size_t       cap;
} tok_ranges_t;

void tok_ranges_fini(tok_ranges_t *r);

/* The pieces a Split step makes of s (behaviour and invert applied, empty
 * pieces dropped), into r (replaced). SVC_ERR_INTERNAL on a regex failure. */
SVC_WUR svc_err_t tok_split(const tok_step_t *st, pcre2_match_data *md, const char *s, size_t n,
                            tok_ranges_t *r);
/* GPT-2 byte-to-unicode mapping of s, appended to out. */
SVC_WUR svc_err_t tok_byte_level_map(const char *s, size_t n, svc_buf_t *out);

/* ======================================================================
 * The tokenizer, added tokens and their tries
 * ====================================================================== */

typedef struct tok_added {
    char   *content; /* owned, NUL-terminated */
    size_t  n;
    int32_t id;
    bool    single_word, lstrip, rstrip, normalized, special;
} tok_added_t;

typedef struct tok_trie_node {
    int32_t child;   /* first child, -1: none */
    int32_t sibling; /* next sibling, -1: none */
    int32_t token;   /* index into tok->added when a pattern ends here, else -1 */
    uint8_t byte;
} tok_trie_node_t;

typedef struct tok_trie {
    tok_trie_node_t *nodes;
    size_t           n;
    size_t           cap;
    int32_t          root[256]; /* first-level node per byte, -1: none */
    bool             empty;
} tok_trie_t;

struct eng_tokenizer {
    tok_bpe_t    bpe;
    tok_added_t *added; /* in insertion order */
    size_t       n_added;
    size_t       cap_added;
    tok_smap_t   added_map; /* content -> index into added */
    int32_t      added_max_id;
    tok_trie_t   trie_raw;  /* non-normalized tokens, on the raw text */
    tok_trie_t   trie_norm; /* normalized tokens (NFC'd), on normalised pieces */
    bool         nfc;
    tok_step_t   steps[TOK_MAX_STEPS];
    size_t       n_steps;
};

/* A piece of text (id -1) or an added token's id, by byte offsets. */
typedef struct tok_asplit {
    size_t  a;
    size_t  b;
    int32_t id;
} tok_asplit_t;

typedef struct tok_asplits {
    tok_asplit_t *v;
    size_t        n;
    size_t        cap;
} tok_asplits_t;

void tok_trie_init(tok_trie_t *t);
/* Adds pattern s -> token (index into tok->added). */
SVC_WUR svc_err_t tok_trie_add(tok_trie_t *t, const char *s, size_t n, int32_t token);
/* AddedVocabulary::find_matches: splits s into text pieces (id -1) and
 * added tokens, into out (replaced); empty pieces are dropped. */
SVC_WUR svc_err_t tok_find_added(const eng_tokenizer_t *tok, const tok_trie_t *t, const char *s,
                                 size_t n, tok_asplits_t *out);

/* ======================================================================
 * Loading helpers (eng_tokenizer.c), model loading (eng_bpe.c)
 * ====================================================================== */

/* json_t without including jansson.h here. */
struct json_t;

/* Which file is being read, for messages: `<kind> "<path>": <what>`. */
typedef struct tok_src {
    const char *kind;
    const char *path;
    char       *errstr;
    size_t      errstr_size;
} tok_src_t;

/* Writes `<kind> "<path>": <message>` into src->errstr; returns err. */
SVC_FMT(3, 4) svc_err_t tok_fail(const tok_src_t *src, svc_err_t err, const char *fmt, ...);
/* An optional boolean of obj: absent or null gives def. */
SVC_WUR svc_err_t tok_get_bool(const tok_src_t *src, const struct json_t *obj, const char *key,
                               const char *where, bool def, bool *out);
/* Reads model.* (type, options, vocab, merges) of tokenizer.json. */
SVC_WUR svc_err_t tok_bpe_load(tok_bpe_t *bpe, const tok_src_t *src, const struct json_t *root);

#endif /* D3STREAM_ENG_TOK_INT_H */
