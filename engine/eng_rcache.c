/*
 * eng_rcache.c -- the result cache (eng_rcache_int.h): a chained hash
 * table of entries by their 32-byte key, and a doubly linked list of the
 * same entries in the order of use (head: the most recent). One mutex.
 *
 * Why SHA-256 keys and no stored prompt: a key holds every input of the
 * answer (eng_rcache_key), and two different inputs meeting on one key
 * would take 2^128 questions; comparing 32 bytes instead of a prompt of
 * up to 32,768 ids keeps an entry at ~100 bytes whatever the prompt's
 * length, so that the byte bound holds many entries.
 */
#include "eng_rcache_int.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct rc_entry {
    struct rc_entry *prev, *next; /* use order */
    struct rc_entry *hnext;       /* bucket chain */
    size_t           n;
    unsigned char    key[ENG_RCACHE_KEY];
    double           probs[];
} rc_entry_t;

struct eng_rcache {
    pthread_mutex_t    mu;
    rc_entry_t       **buckets; /* (n_buckets), a power of two */
    size_t             n_buckets;
    rc_entry_t        *head, *tail;
    size_t             max_entries, max_bytes;
    eng_rcache_stats_t st;
};

#define RC_BUCKETS0 64

/* What an entry of n probabilities costs: its allocation as glibc's
 * malloc makes it (the request plus its 8-byte size word, in 16-byte
 * steps), so that the byte bound is the heap's, not the structs'. */
static size_t rc_cost(size_t n) {
    size_t req = sizeof(rc_entry_t) + n * sizeof(double) + 8;
    return (req + 15) / 16 * 16;
}

static void key_update(EVP_MD_CTX *md, const void *p, size_t n) {
    (void)EVP_DigestUpdate(md, p, n);
}

void eng_rcache_key(const eng_rcache_ctx_t *ctx, size_t n_options, const int32_t *ids, size_t n,
                    const unsigned char (*img_sha)[32], const size_t *img_tokens, size_t n_images,
                    unsigned char key[ENG_RCACHE_KEY]) {
    static const char tag[] = "d3stream result cache 1";
    uint64_t          head[6] = {(uint64_t)ctx->profile, ctx->noncausal, ctx->readout_bf16,
                                 (uint64_t)n_options,    (uint64_t)n,    (uint64_t)n_images};
    const char       *id = ctx->identity ? ctx->identity : "";
    uint64_t          id_len = strlen(id);
    EVP_MD_CTX       *md = EVP_MD_CTX_new();
    unsigned int      len = 0;
    /* the fields one after another, each of fixed size or preceded by its
     * length, so that no two inputs write the same bytes */
    bool ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
    if (ok) {
        key_update(md, tag, sizeof tag);
        key_update(md, &id_len, sizeof id_len);
        key_update(md, id, id_len);
        key_update(md, head, sizeof head);
        key_update(md, &ctx->temperature, sizeof ctx->temperature);
        key_update(md, ids, n * sizeof *ids);
        for (size_t k = 0; k < n_images; k++) {
            uint64_t t = img_tokens[k];
            key_update(md, img_sha[k], 32);
            key_update(md, &t, sizeof t);
        }
        ok = EVP_DigestFinal_ex(md, key, &len) == 1 && len == ENG_RCACHE_KEY;
    }
    EVP_MD_CTX_free(md);
    /* OpenSSL's SHA-256 fails only without memory for its context: then a
     * key of zeros, which eng_rcache_get and _put refuse, so nothing is
     * answered from or kept under it. */
    if (!ok)
        memset(key, 0, ENG_RCACHE_KEY);
}

static bool key_usable(const unsigned char *key) {
    static const unsigned char zero[ENG_RCACHE_KEY];
    return memcmp(key, zero, ENG_RCACHE_KEY) != 0;
}

eng_rcache_t *eng_rcache_new(size_t max_entries, size_t max_bytes) {
    eng_rcache_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n_buckets = RC_BUCKETS0;
    c->buckets = calloc(c->n_buckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    c->max_entries = max_entries ? max_entries : 1;
    c->max_bytes = max_bytes ? max_bytes : 1;
    c->st.index_bytes = c->n_buckets * sizeof *c->buckets;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void eng_rcache_free(eng_rcache_t *c) {
    if (!c)
        return;
    for (rc_entry_t *e = c->head, *nx; e; e = nx) {
        nx = e->next;
        free(e);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- under c->mu ---- */

static rc_entry_t **rc_find(eng_rcache_t *c, const unsigned char *key) {
    rc_entry_t **link = &c->buckets[eng_rcache_bucket(key, c->n_buckets)];
    while (*link && memcmp((*link)->key, key, ENG_RCACHE_KEY) != 0)
        link = &(*link)->hnext;
    return link;
}

static void lru_unlink(eng_rcache_t *c, rc_entry_t *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(eng_rcache_t *c, rc_entry_t *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

/* Unlinks *link's entry from both structures and frees it. */
static void rc_remove(eng_rcache_t *c, rc_entry_t **link) {
    rc_entry_t *e = *link;
    *link = e->hnext;
    lru_unlink(c, e);
    c->st.entries--;
    c->st.bytes -= rc_cost(e->n);
    free(e);
}

/* Doubles the bucket array once entries outnumber buckets (chains stay
 * short); without memory the table keeps its size (longer chains, the
 * same answers). */
static void rc_grow(eng_rcache_t *c) {
    if (c->st.entries <= c->n_buckets)
        return;
    size_t       nb = c->n_buckets * 2;
    rc_entry_t **b = calloc(nb, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (rc_entry_t *e = c->buckets[i], *nx; e; e = nx) {
            nx = e->hnext;
            e->hnext = b[eng_rcache_bucket(e->key, nb)];
            b[eng_rcache_bucket(e->key, nb)] = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = nb;
    c->st.index_bytes = nb * sizeof *b;
}

/* ---- public ---- */

bool eng_rcache_get(eng_rcache_t *c, const unsigned char key[ENG_RCACHE_KEY], double *probs,
                    size_t n) {
    if (!key_usable(key))
        return false;
    pthread_mutex_lock(&c->mu);
    rc_entry_t *e = *rc_find(c, key);
    bool        hit = e && e->n == n;
    if (hit) {
        memcpy(probs, e->probs, n * sizeof *probs);
        lru_unlink(c, e);
        lru_push_front(c, e);
        c->st.hits++;
    } else
        c->st.misses++;
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void eng_rcache_put(eng_rcache_t *c, const unsigned char key[ENG_RCACHE_KEY], const double *probs,
                    size_t n) {
    size_t cost = rc_cost(n);
    if (!key_usable(key) || cost > c->max_bytes)
        return;
    rc_entry_t *e = malloc(sizeof *e + n * sizeof *probs);
    if (!e)
        return;
    memcpy(e->key, key, ENG_RCACHE_KEY);
    memcpy(e->probs, probs, n * sizeof *probs);
    e->n = n;
    pthread_mutex_lock(&c->mu);
    rc_entry_t **old = rc_find(c, key);
    if (*old)
        rc_remove(c, old);
    while (c->tail && (c->st.entries + 1 > c->max_entries || c->st.bytes + cost > c->max_bytes)) {
        rc_remove(c, rc_find(c, c->tail->key));
        c->st.evictions++;
    }
    size_t b = eng_rcache_bucket(key, c->n_buckets);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    lru_push_front(c, e);
    c->st.entries++;
    c->st.bytes += cost;
    c->st.inserts++;
    rc_grow(c);
    pthread_mutex_unlock(&c->mu);
}

void eng_rcache_stats(eng_rcache_t *c, eng_rcache_stats_t *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
