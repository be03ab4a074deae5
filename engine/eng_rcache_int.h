/*
 * eng_rcache_int.h -- private: the result cache (eng_rcache.c), kept by
 * the scheduler (eng_sched.c): an answered question's option
 * probabilities under a 32-byte key (eng_rcache_key: SHA-256 of what the
 * answer depends on), so that a repeat is answered without a forward pass
 * and with the same bits (SPEC's own choice 8, upstream's
 * --result-cache-entries).
 *
 * Bounded by entries and by bytes, least recently used first out. Bytes
 * counted per entry: the entry's allocation (its header and its
 * probabilities, as malloc rounds it); the index beside them, one pointer
 * per bucket, doubled whenever the entries outnumber the buckets (so at
 * most two per entry of the high-water mark), is stated by
 * eng_rcache_stats as index_bytes and not counted against the bound.
 *
 * Thread-safety: every call may come from any thread (one mutex inside).
 */
#ifndef D3STREAM_ENG_RCACHE_INT_H
#define D3STREAM_ENG_RCACHE_INT_H

#include "engine.h"

#include <string.h>

#define ENG_RCACHE_KEY 32

typedef struct eng_rcache eng_rcache_t;

/* Bucket of key among nb (a power of two): its first 8 bytes, a SHA-256
 * being uniform already. The cache's table and the scheduler's table of
 * questions in flight both use it. */
static inline size_t eng_rcache_bucket(const unsigned char *key, size_t nb) {
    uint64_t h;
    memcpy(&h, key, sizeof h);
    return (size_t)h & (nb - 1);
}

/* The key's inputs beside the prompt's ids: the package identity (any
 * string: the manifest's model_sha256 where known, and the served name),
 * the profile and the readout's settings. */
typedef struct eng_rcache_ctx {
    const char   *identity;
    eng_profile_t profile;
    double        temperature;
    bool          noncausal, readout_bf16;
} eng_rcache_ctx_t;

/**
 * @brief key = SHA-256 of ctx, n_options, the prompt's ids (n; each image
 *        is one <|image_pad|> id there) and each image of the question's
 *        part in order (its SHA-256 and its token count): every input of
 *        the answer. The scheduler's grouping is left out: it moves an
 *        answer by the kernels' rounding only (prefix states shift the
 *        delta rule's chunk boundaries), and a hit returns the bits of the
 *        pass that computed it.
 */
void eng_rcache_key(const eng_rcache_ctx_t *ctx, size_t n_options, const int32_t *ids, size_t n,
                    const unsigned char (*img_sha)[32], const size_t *img_tokens, size_t n_images,
                    unsigned char key[ENG_RCACHE_KEY]);

/* A cache of at most max_entries entries and max_bytes bytes (both > 0);
 * NULL when out of memory. */
eng_rcache_t *eng_rcache_new(size_t max_entries, size_t max_bytes);
void          eng_rcache_free(eng_rcache_t *c); /* NULL is a no-op */

/**
 * @brief The probabilities kept under key into probs (n of them), the
 *        entry made the most recently used. Counts a hit or a miss.
 * @returns whether an entry of n probabilities was there.
 */
bool eng_rcache_get(eng_rcache_t *c, const unsigned char key[ENG_RCACHE_KEY], double *probs,
                    size_t n);

/* Keeps probs (n) under key (replacing an entry of the same key), evicting
 * the least recently used entries past either bound. An entry larger than
 * the byte bound, or one that finds no memory, is not kept. */
void eng_rcache_put(eng_rcache_t *c, const unsigned char key[ENG_RCACHE_KEY], const double *probs,
                    size_t n);

typedef struct eng_rcache_stats {
    uint64_t hits, misses, evictions, inserts;
    uint64_t entries, bytes; /* now */
    uint64_t index_bytes;    /* the bucket array, beside bytes */
} eng_rcache_stats_t;

void eng_rcache_stats(eng_rcache_t *c, eng_rcache_stats_t *out);

#endif /* D3STREAM_ENG_RCACHE_INT_H */
