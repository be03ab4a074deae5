/*
 * eng_bpe.c -- the BPE model of a Hugging Face tokenizer.json: vocabulary and
 * merge maps, the merge loop of `tokenizers` (models/bpe/word.rs: a min-heap
 * on (rank, position) with the same stale-entry test, so ties and overlapping
 * merges resolve exactly as upstream) and a bounded, lock-striped word cache.
 */
#include "eng_tok_int.h"

#include <jansson.h>

/* ---- hashing ---- */

static uint64_t tok_mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t             h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)n * 0x100000001b3ULL);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
    return tok_mix64(h);
}

/* ---- string -> id map ---- */

void tok_smap_init(tok_smap_t *m) {
    m->slots = NULL;
    m->mask = 0;
    m->n = 0;
    svc_buf_init(&m->pool, (size_t)UINT32_MAX);
}

void tok_smap_fini(tok_smap_t *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->n = 0;
    svc_buf_fini(&m->pool);
}

static void tok_smap_place(tok_smap_slot_t *slots, size_t mask, const tok_smap_slot_t *e) {
    size_t i = (size_t)e->h & mask;
    while (slots[i].id >= 0)
        i = (i + 1) & mask;
    slots[i] = *e;
}

static svc_err_t tok_smap_grow(tok_smap_t *m) {
    size_t           cap = m->slots ? (m->mask + 1) * 2 : 64;
    tok_smap_slot_t *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < cap; i++)
        slots[i].id = -1;
    for (size_t i = 0; m->slots && i <= m->mask; i++)
        if (m->slots[i].id >= 0)
            tok_smap_place(slots, cap - 1, &m->slots[i]);
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return SVC_OK;
}

static const tok_smap_slot_t *tok_smap_find(const tok_smap_t *m, const char *s, size_t n,
                                            uint64_t h) {
    if (!m->slots)
        return NULL;
    size_t i = (size_t)h & m->mask;
    while (m->slots[i].id >= 0) {
        const tok_smap_slot_t *e = &m->slots[i];
        if (e->h == h && e->len == n && memcmp(m->pool.data + e->off, s, n) == 0)
            return e;
        i = (i + 1) & m->mask;
    }
    return NULL;
}

svc_err_t tok_smap_put(tok_smap_t *m, const char *s, size_t n, int32_t id, int32_t *old) {
    uint64_t               h = tok_hash(s, n);
    const tok_smap_slot_t *e = tok_smap_find(m, s, n, h);
    *old = e ? e->id : -1;
    if (e)
        return SVC_OK;
    if (!m->slots || (m->n + 1) * 2 > m->mask + 1) {
        svc_err_t err = tok_smap_grow(m);
        if (err)
            return err;
    }
    tok_smap_slot_t slot = {.h = h, .off = (uint32_t)m->pool.len, .len = (uint32_t)n, .id = id};
    /* A NUL after each key lets callers print keys as C strings. */
    svc_err_t err = svc_buf_add(&m->pool, s, n);
    if (!err)
        err = svc_buf_addc(&m->pool, '\0');
    if (err)
        return err == SVC_ERR_TOO_LARGE ? SVC_ERR_NOMEM : err;
    tok_smap_place(m->slots, m->mask, &slot);
    m->n++;
    return SVC_OK;
}

int32_t tok_smap_get(const tok_smap_t *m, const char *s, size_t n) {
    const tok_smap_slot_t *e = tok_smap_find(m, s, n, tok_hash(s, n));
    return e ? e->id : -1;
}

/* ---- word cache: 64 stripes x 1024 direct-mapped slots ---- */

#define TOK_CACHE_STRIPES 64
#define TOK_CACHE_SLOTS   1024
#define TOK_CACHE_MAX_KEY 64

typedef struct tok_cache_ent {
    uint64_t h;
    char    *blob; /* owned: klen key bytes, then nids int32 ids */
    uint32_t klen;
    uint32_t nids;
} tok_cache_ent_t;

typedef struct tok_cache_stripe {
    pthread_mutex_t  mu;
    tok_cache_ent_t *ent;
    char             pad[64];
} tok_cache_stripe_t;

struct tok_cache {
    tok_cache_stripe_t stripes[TOK_CACHE_STRIPES];
};

static void tok_cache_free(tok_cache_t *c) {
    if (!c)
        return;
    for (size_t s = 0; s < TOK_CACHE_STRIPES; s++) {
        for (size_t i = 0; c->stripes[s].ent && i < TOK_CACHE_SLOTS; i++)
            free(c->stripes[s].ent[i].blob);
        free(c->stripes[s].ent);
        pthread_mutex_destroy(&c->stripes[s].mu);
    }
    free(c);
}

svc_err_t tok_bpe_enable_cache(tok_bpe_t *bpe) {
    tok_cache_t *c = calloc(1, sizeof *c);
    if (!c)
        return SVC_ERR_NOMEM;
    for (size_t s = 0; s < TOK_CACHE_STRIPES; s++) {
        pthread_mutex_init(&c->stripes[s].mu, NULL);
        c->stripes[s].ent = calloc(TOK_CACHE_SLOTS, sizeof(tok_cache_ent_t));
        if (!c->stripes[s].ent) {
            for (size_t t = s + 1; t < TOK_CACHE_STRIPES; t++)
                pthread_mutex_init(&c->stripes[t].mu, NULL);
            tok_cache_free(c);
            return SVC_ERR_NOMEM;
        }
    }
    bpe->cache = c;
    return SVC_OK;
}

static svc_err_t tok_ids_append(eng_ids_t *ids, const int32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        svc_err_t err = eng_ids_push(ids, v[i]);
        if (err)
            return err;
    }
    return SVC_OK;
}

/* Appends the cached ids of w; false on a miss. */
static bool tok_cache_get(tok_cache_t *c, uint64_t h, const char *w, size_t n, eng_ids_t *ids,
                          svc_err_t *err) {
    tok_cache_stripe_t *st = &c->stripes[h % TOK_CACHE_STRIPES];
    tok_cache_ent_t    *e = &st->ent[(h / TOK_CACHE_STRIPES) % TOK_CACHE_SLOTS];
    bool                hit = false;
    pthread_mutex_lock(&st->mu);
    if (e->blob && e->h == h && e->klen == n && memcmp(e->blob, w, n) == 0) {
        int32_t tmp[TOK_CACHE_MAX_KEY];
        memcpy(tmp, e->blob + n, e->nids * sizeof(int32_t));
        size_t nids = e->nids;
        pthread_mutex_unlock(&st->mu);
        *err = tok_ids_append(ids, tmp, nids);
        return true;
    }
    pthread_mutex_unlock(&st->mu);
    return hit;
}

static void tok_cache_put(tok_cache_t *c, uint64_t h, const char *w, size_t n, const int32_t *v,
                          size_t nids) {
    char *blob = malloc(n + nids * sizeof(int32_t));
    if (!blob)
        return; /* the cache is an optimisation only */
    memcpy(blob, w, n);
    memcpy(blob + n, v, nids * sizeof(int32_t));
    tok_cache_stripe_t *st = &c->stripes[h % TOK_CACHE_STRIPES];
    tok_cache_ent_t    *e = &st->ent[(h / TOK_CACHE_STRIPES) % TOK_CACHE_SLOTS];
    pthread_mutex_lock(&st->mu);
    char *old = e->blob;
    e->h = h;
    e->blob = blob;
    e->klen = (uint32_t)n;
    e->nids = (uint32_t)nids;
    pthread_mutex_unlock(&st->mu);
    free(old);
}

/* ---- model ---- */

svc_err_t tok_bpe_init(tok_bpe_t *bpe) {
    memset(bpe, 0, sizeof *bpe);
    tok_smap_init(&bpe->vocab);
    for (size_t i = 0; i < 0x180; i++)
        bpe->char_id[i] = -1;
    return SVC_OK;
}

void tok_bpe_fini(tok_bpe_t *bpe) {
    tok_smap_fini(&bpe->vocab);
    free(bpe->merges);
    tok_cache_free(bpe->cache);
    memset(bpe, 0, sizeof *bpe);
}

svc_err_t tok_bpe_add_token(tok_bpe_t *bpe, const char *s, size_t n, int32_t id, int32_t *clash) {
    int32_t   old;
    svc_err_t err = tok_smap_put(&bpe->vocab, s, n, id, &old);
    *clash = old;
    if (err)
        return err;
    if (old >= 0)
        return SVC_ERR_INVALID;
    if ((size_t)id + 1 > bpe->n_ids)
        bpe->n_ids = (size_t)id + 1;
    return SVC_OK;
}

svc_err_t tok_bpe_index(tok_bpe_t *bpe) {
    const tok_smap_t *m = &bpe->vocab;
    for (uint32_t c = 0; c < 0x180; c++) {
        char   u[2];
        size_t len = 1;
        if (c < 0x80) {
            u[0] = (char)c;
        } else {
            u[0] = (char)(0xc0 | (c >> 6));
            u[1] = (char)(0x80 | (c & 0x3f));
            len = 2;
        }
        bpe->char_id[c] = tok_smap_get(m, u, len);
    }
    return SVC_OK;
}

static size_t tok_merge_slot(uint64_t key, size_t mask) {
    return (size_t)tok_mix64(key) & mask;
}

svc_err_t tok_bpe_reserve_merges(tok_bpe_t *bpe, size_t n) {
    size_t cap = 64;
    while (cap < n * 2 + 2)
        cap *= 2;
    bpe->merges = malloc(cap * sizeof *bpe->merges);
    if (!bpe->merges)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < cap; i++)
        bpe->merges[i].key = UINT64_MAX;
    bpe->merge_mask = cap - 1;
    return SVC_OK;
}

static const tok_merge_slot_t *tok_merge_find(const tok_bpe_t *bpe, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t   i = tok_merge_slot(key, bpe->merge_mask);
    while (bpe->merges[i].key != UINT64_MAX) {
        if (bpe->merges[i].key == key)
            return &bpe->merges[i];
        i = (i + 1) & bpe->merge_mask;
    }
    return NULL;
}

svc_err_t tok_bpe_add_merge(tok_bpe_t *bpe, const char *a, size_t an, const char *b, size_t bn,
                            uint32_t rank, int *bad) {
    int32_t ia = tok_smap_get(&bpe->vocab, a, an);
    int32_t ib = tok_smap_get(&bpe->vocab, b, bn);
    *bad = ia < 0 ? 0 : ib < 0 ? 1 : -1;
    if (*bad >= 0)
        return SVC_ERR_INVALID;
    char  stackbuf[256];
    char *ab = an + bn <= sizeof stackbuf ? stackbuf : malloc(an + bn);
    if (!ab)
        return SVC_ERR_NOMEM;
    memcpy(ab, a, an);
    memcpy(ab + an, b, bn);
    int32_t id = tok_smap_get(&bpe->vocab, ab, an + bn);
    if (ab != stackbuf)
        free(ab);
    if (id < 0) {
        *bad = 2;
        return SVC_ERR_INVALID;
    }
    SVC_ASSERT(bpe->merges && bpe->n_merges * 2 + 2 <= bpe->merge_mask + 1);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    size_t   i = tok_merge_slot(key, bpe->merge_mask);
    while (bpe->merges[i].key != UINT64_MAX && bpe->merges[i].key != key)
        i = (i + 1) & bpe->merge_mask;
    /* A repeated pair keeps its last rank, as upstream's HashMap collect. */
    if (bpe->merges[i].key == UINT64_MAX)
        bpe->n_merges++;
    bpe->merges[i] = (tok_merge_slot_t){.key = key, .rank = rank, .id = id};
    return SVC_OK;
}

/* ---- the merge loop ---- */

struct tok_sym {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t alive;
};

struct tok_merge {
    uint32_t rank;
    uint32_t pos;
    int32_t  id;
};

void tok_bpe_scratch_fini(tok_bpe_scratch_t *sc) {
    free(sc->sym);
    free(sc->heap);
    sc->sym = NULL;
    sc->heap = NULL;
    sc->sym_cap = sc->heap_cap = 0;
}

static bool tok_merge_less(const struct tok_merge *x, const struct tok_merge *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void tok_heap_push(struct tok_merge *h, size_t *n, struct tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_merge_less(&m, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct tok_merge tok_heap_pop(struct tok_merge *h, size_t *n) {
    struct tok_merge top = h[0];
    struct tok_merge last = h[--(*n)];
    size_t           i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && tok_merge_less(&h[c + 1], &h[c]))
            c++;
        if (!tok_merge_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Splits w into its characters' ids (unknown characters are dropped, as
 * upstream does without an unk token). Returns the symbol count. */
static size_t tok_word_symbols(const tok_bpe_t *bpe, const char *w, size_t n, struct tok_sym *sym) {
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t   len;
        uint32_t c = tok_utf8_decode(w + i, &len);
        int32_t  id = c < 0x180 ? bpe->char_id[c] : tok_smap_get(&bpe->vocab, w + i, len);
        i += len;
        if (id < 0)
            continue;
        sym[ns] = (struct tok_sym){
            .id = id, .prev = (int32_t)ns - 1, .next = (int32_t)ns + 1, .alive = 1};
        ns++;
    }
    if (ns)
        sym[ns - 1].next = -1;
    return ns;
}

static svc_err_t tok_scratch_reserve(tok_bpe_scratch_t *sc, size_t n) {
    if (n <= sc->sym_cap)
        return SVC_OK;
    size_t cap = sc->sym_cap ? sc->sym_cap : 64;
    while (cap < n)
        cap *= 2;
    struct tok_sym *sym = realloc(sc->sym, cap * sizeof *sym);
    if (!sym)
        return SVC_ERR_NOMEM;
    sc->sym = sym;
    /* Each merge pushes at most two entries: 3n bounds the heap. */
    struct tok_merge *heap = realloc(sc->heap, 3 * cap * sizeof *heap);
    if (!heap)
        return SVC_ERR_NOMEM;
    sc->heap = heap;
    sc->sym_cap = cap;
    sc->heap_cap = 3 * cap;
    return SVC_OK;
}

static void tok_push_pair(const tok_bpe_t *bpe, const struct tok_sym *sym, size_t pos,
                          struct tok_merge *heap, size_t *nh) {
    int32_t next = sym[pos].next;
    if (next < 0)
        return;
    const tok_merge_slot_t *m = tok_merge_find(bpe, sym[pos].id, sym[next].id);
    if (m)
        tok_heap_push(heap, nh,
                      (struct tok_merge){.rank = m->rank, .pos = (uint32_t)pos, .id = m->id});
}

static void tok_merge_all(const tok_bpe_t *bpe, struct tok_sym *sym, size_t ns,
                          struct tok_merge *heap) {
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        tok_push_pair(bpe, sym, i, heap, &nh);
    while (nh > 0) {
        struct tok_merge top = tok_heap_pop(heap, &nh);
        struct tok_sym  *cur = &sym[top.pos];
        if (!cur->alive || cur->next < 0)
            continue;
        struct tok_sym          right = sym[cur->next];
        const tok_merge_slot_t *m = tok_merge_find(bpe, cur->id, right.id);
        if (!m || m->id != top.id)
            continue; /* stale entry (upstream compares only the new id) */
        sym[cur->next].alive = 0;
        cur->id = top.id;
        cur->next = right.next;
        if (right.next >= 0)
            sym[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0)
            tok_push_pair(bpe, sym, (size_t)cur->prev, heap, &nh);
        tok_push_pair(bpe, sym, top.pos, heap, &nh);
    }
}

svc_err_t tok_bpe_encode(const tok_bpe_t *bpe, const char *w, size_t n, eng_ids_t *ids,
                         tok_bpe_scratch_t *sc) {
    if (n == 0)
        return SVC_OK;
    if (bpe->ignore_merges) {
        int32_t id = tok_smap_get(&bpe->vocab, w, n);
        if (id >= 0)
            return eng_ids_push(ids, id);
    }
    uint64_t  h = 0;
    svc_err_t err = SVC_OK;
    bool      cacheable = bpe->cache && n <= TOK_CACHE_MAX_KEY;
    if (cacheable) {
        h = tok_hash(w, n);
        if (tok_cache_get(bpe->cache, h, w, n, ids, &err))
            return err;
    }
    err = tok_scratch_reserve(sc, n);
    if (err)
        return err;
    size_t ns = tok_word_symbols(bpe, w, n, sc->sym);
    if (ns > 1)
        tok_merge_all(bpe, sc->sym, ns, sc->heap);
    int32_t out[TOK_CACHE_MAX_KEY];
    size_t  nout = 0;
    for (size_t i = 0; i < ns; i++) {
        if (!sc->sym[i].alive)
            continue;
        if (nout < TOK_CACHE_MAX_KEY)
            out[nout] = sc->sym[i].id;
        nout++;
        err = eng_ids_push(ids, sc->sym[i].id);
        if (err)
            return err;
    }
    if (cacheable && nout <= TOK_CACHE_MAX_KEY)
        tok_cache_put(bpe->cache, h, w, n, out, nout);
    return SVC_OK;
}

/* ======================================================================
 * Loading model.* of tokenizer.json
 * ====================================================================== */

static svc_err_t tok_check_model_options(const tok_src_t *src, const json_t *m, bool *ignore) {
    const json_t *type = json_object_get(m, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0))
        return tok_fail(src, SVC_ERR_UNSUPPORTED, "model.type %s is not supported (only \"BPE\")",
                        json_is_string(type) ? json_string_value(type) : "(not a string)");
    const json_t *d = json_object_get(m, "dropout");
    if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0.0))
        return tok_fail(src, SVC_ERR_UNSUPPORTED, "model.dropout is set; dropout is not supported");
    const json_t *unk = json_object_get(m, "unk_token");
    if (unk && !json_is_null(unk))
        return tok_fail(src, SVC_ERR_UNSUPPORTED, "model.unk_token is set; only null is supported");
    bool      fallback = false;
    svc_err_t err = tok_get_bool(src, m, "byte_fallback", "model", false, &fallback);
    if (err)
        return err;
    if (fallback)
        return tok_fail(src, SVC_ERR_UNSUPPORTED, "model.byte_fallback is true; not supported");
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *a = json_object_get(m, affix[i]);
        if (a && !json_is_null(a) && !(json_is_string(a) && json_string_length(a) == 0))
            return tok_fail(src, SVC_ERR_UNSUPPORTED, "model.%s is set; only null or \"\"",
                            affix[i]);
    }
    return tok_get_bool(src, m, "ignore_merges", "model", false, ignore);
}

static svc_err_t tok_load_vocab(tok_bpe_t *bpe, const tok_src_t *src, const json_t *vocab) {
    if (!json_is_object(vocab))
        return tok_fail(src, SVC_ERR_FORMAT, "model.vocab is not an object");
    const char **by_id = calloc(TOK_MAX_ID, sizeof *by_id);
    if (!by_id)
        return tok_fail(src, SVC_ERR_NOMEM, "out of memory");
    svc_err_t   err = SVC_OK;
    const char *key;
    json_t     *v;
    json_object_foreach((json_t *)vocab, key, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= TOK_MAX_ID) {
            err = tok_fail(src, SVC_ERR_FORMAT, "model.vocab[\"%s\"] is not an id in [0, %d)", key,
                           TOK_MAX_ID);
            break;
        }
        if (by_id[id]) {
            err = tok_fail(src, SVC_ERR_FORMAT, "model.vocab[\"%s\"]: id %lld is also \"%s\"", key,
                           (long long)id, by_id[id]);
            break;
        }
        by_id[id] = key;
        int32_t clash;
        err = tok_bpe_add_token(bpe, key, strlen(key), (int32_t)id, &clash);
        if (err) {
            err =
                tok_fail(src, err, "model.vocab[\"%s\"]: cannot add (duplicate or no memory)", key);
            break;
        }
    }
    free(by_id);
    if (!err && tok_bpe_index(bpe))
        err = tok_fail(src, SVC_ERR_NOMEM, "out of memory");
    return err;
}

/* One merge as ["a", "b"] or "a b" (exactly one space, as upstream). */
static bool tok_merge_parts(const json_t *e, const char **a, size_t *an, const char **b,
                            size_t *bn) {
    if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
        json_is_string(json_array_get(e, 1))) {
        *a = json_string_value(json_array_get(e, 0));
        *an = json_string_length(json_array_get(e, 0));
        *b = json_string_value(json_array_get(e, 1));
        *bn = json_string_length(json_array_get(e, 1));
        return true;
    }
    if (!json_is_string(e))
        return false;
    const char *s = json_string_value(e);
    size_t      n = json_string_length(e);
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
        return false;
    *a = s;
    *an = (size_t)(sp - s);
    *b = sp + 1;
    *bn = n - *an - 1;
    return true;
}

static svc_err_t tok_load_merges(tok_bpe_t *bpe, const tok_src_t *src, const json_t *ms) {
    if (!json_is_array(ms))
        return tok_fail(src, SVC_ERR_FORMAT, "model.merges is not an array");
    if (tok_bpe_reserve_merges(bpe, json_array_size(ms)))
        return tok_fail(src, SVC_ERR_NOMEM, "out of memory");
    size_t  i;
    json_t *e;
    json_array_foreach(ms, i, e) {
        const char *a, *b;
        size_t      an, bn;
        if (!tok_merge_parts(e, &a, &an, &b, &bn))
            return tok_fail(src, SVC_ERR_FORMAT,
                            "model.merges[%zu] is not \"a b\" or [\"a\", \"b\"]", i);
        int       bad = -1;
        svc_err_t err = tok_bpe_add_merge(bpe, a, an, b, bn, (uint32_t)i, &bad);
        if (err == SVC_ERR_INVALID && bad < 2)
            return tok_fail(src, err, "model.merges[%zu] names unknown token \"%.*s\"", i,
                            (int)(bad == 0 ? an : bn), bad == 0 ? a : b);
        if (err == SVC_ERR_INVALID)
            return tok_fail(src, err, "model.merges[%zu] makes unknown token \"%.*s%.*s\"", i,
                            (int)an, a, (int)bn, b);
        if (err)
            return tok_fail(src, err, "out of memory");
    }
    return SVC_OK;
}

svc_err_t tok_bpe_load(tok_bpe_t *bpe, const tok_src_t *src, const json_t *root) {
    const json_t *m = json_object_get(root, "model");
    if (!json_is_object(m))
        return tok_fail(src, SVC_ERR_FORMAT, "model is missing or not an object");
    svc_err_t err = tok_check_model_options(src, m, &bpe->ignore_merges);
    if (!err)
        err = tok_load_vocab(bpe, src, json_object_get(m, "vocab"));
    if (!err)
        err = tok_load_merges(bpe, src, json_object_get(m, "merges"));
    return err;
}
