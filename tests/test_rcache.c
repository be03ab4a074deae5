/*
 * test_rcache.c -- the result cache (eng_rcache.c): what a key depends on,
 * the bits kept, least recently used out, and both bounds under many
 * distinct answers. The scheduler's use of it (hits, joins) is in
 * test_sched.c, images in test_vision.c.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "eng_rcache_int.h"

static const int32_t IDS[] = {151644, 872, 198, 1397, 25, 198, 785, 1973};
#define N_IDS (sizeof IDS / sizeof IDS[0])

static eng_rcache_ctx_t ctx0(void) {
    return (eng_rcache_ctx_t){.identity = "sha-of-package",
                              .profile = ENG_PROFILE_EXACT,
                              .temperature = 1.0,
                              .noncausal = true,
                              .readout_bf16 = false};
}

/* The key is a function of every input, and of nothing else. */
Test(rcache, key_depends_on_every_input) {
    eng_rcache_ctx_t c = ctx0();
    unsigned char    k0[32], k1[32];
    unsigned char    sha[2][32];
    size_t           tok[2] = {64, 64};
    memset(sha, 7, sizeof sha);
    eng_rcache_key(&c, 2, IDS, N_IDS, sha, tok, 2, k0);
    eng_rcache_key(&c, 2, IDS, N_IDS, sha, tok, 2, k1);
    cr_assert_eq(memcmp(k0, k1, 32), 0, "the same inputs, the same key");

    eng_rcache_ctx_t d = c;
    d.profile = ENG_PROFILE_FAST;
    eng_rcache_key(&d, 2, IDS, N_IDS, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "profile");
    d = c;
    d.identity = "another-package";
    eng_rcache_key(&d, 2, IDS, N_IDS, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "package identity");
    d = c;
    d.temperature = 0.5;
    eng_rcache_key(&d, 2, IDS, N_IDS, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "temperature");
    eng_rcache_key(&c, 3, IDS, N_IDS, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "option count");
    eng_rcache_key(&c, 2, IDS, N_IDS - 1, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "a shorter prompt");
    int32_t other[N_IDS];
    memcpy(other, IDS, sizeof other);
    other[3]++;
    eng_rcache_key(&c, 2, other, N_IDS, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "one id");
    sha[1][31] ^= 1;
    eng_rcache_key(&c, 2, IDS, N_IDS, sha, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "one bit of an image");
    sha[1][31] ^= 1;
    eng_rcache_key(&c, 2, IDS, N_IDS, sha, tok, 1, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "one image fewer");
    /* image order: two different images swapped */
    memset(sha[1], 9, 32);
    eng_rcache_key(&c, 2, IDS, N_IDS, sha, tok, 2, k0);
    unsigned char swapped[2][32];
    memcpy(swapped[0], sha[1], 32);
    memcpy(swapped[1], sha[0], 32);
    eng_rcache_key(&c, 2, IDS, N_IDS, swapped, tok, 2, k1);
    cr_assert_neq(memcmp(k0, k1, 32), 0, "image order");
}

static void key_n(uint64_t i, unsigned char key[32]) {
    eng_rcache_ctx_t c = ctx0();
    int32_t          ids[2] = {(int32_t)(i & 0x7fffffff), (int32_t)(i >> 31)};
    eng_rcache_key(&c, 2, ids, 2, NULL, NULL, 0, key);
}

/* What is put is what is got, bit for bit; a different option count is a
 * miss; a key of zeros (no SHA-256) is neither kept nor found. */
Test(rcache, bits_kept) {
    eng_rcache_t *c = eng_rcache_new(16, 1 << 20);
    cr_assert(c);
    unsigned char k[32];
    key_n(1, k);
    double in[3] = {0.1 + 1e-17, 0.2, 0.7 - 3e-16}, out[3] = {0};
    cr_assert(!eng_rcache_get(c, k, out, 3));
    eng_rcache_put(c, k, in, 3);
    cr_assert(eng_rcache_get(c, k, out, 3));
    cr_assert_eq(memcmp(in, out, sizeof in), 0);
    cr_assert(!eng_rcache_get(c, k, out, 2), "another option count");
    in[0] = 0.5;
    eng_rcache_put(c, k, in, 3); /* replaces */
    cr_assert(eng_rcache_get(c, k, out, 3));
    cr_assert_eq(out[0], 0.5);
    unsigned char zero[32] = {0};
    eng_rcache_put(c, zero, in, 3);
    cr_assert(!eng_rcache_get(c, zero, out, 3));
    eng_rcache_stats_t st;
    eng_rcache_stats(c, &st);
    cr_assert_eq(st.entries, 1);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.misses, 2, "the first get and the other count (zero keys are not looked up)");
    eng_rcache_free(c);
}

/* Least recently used out: a get refreshes an entry. */
Test(rcache, least_recently_used_out) {
    eng_rcache_t *c = eng_rcache_new(3, 1 << 20);
    unsigned char k[4][32];
    double        p[2] = {0.25, 0.75}, o[2];
    for (int i = 0; i < 4; i++)
        key_n((uint64_t)i + 100, k[i]);
    for (int i = 0; i < 3; i++)
        eng_rcache_put(c, k[i], p, 2);
    cr_assert(eng_rcache_get(c, k[0], o, 2)); /* 0 is now the most recent: 1 goes */
    eng_rcache_put(c, k[3], p, 2);
    cr_assert(eng_rcache_get(c, k[0], o, 2));
    cr_assert(!eng_rcache_get(c, k[1], o, 2));
    cr_assert(eng_rcache_get(c, k[2], o, 2));
    cr_assert(eng_rcache_get(c, k[3], o, 2));
    eng_rcache_stats_t st;
    eng_rcache_stats(c, &st);
    cr_assert_eq(st.entries, 3);
    cr_assert_eq(st.evictions, 1);
    eng_rcache_free(c);
}

/* 1,000,000 distinct answers through a 1 MiB cache (entries unbounded):
 * the bytes never pass the bound, the index stays within two pointers per
 * entry held, and the last answers are all there. */
Test(rcache, byte_bound_holds, .timeout = 120) {
    size_t        bound = 1 << 20;
    eng_rcache_t *c = eng_rcache_new(SIZE_MAX, bound);
    double        p[4] = {0.1, 0.2, 0.3, 0.4}, o[4];
    unsigned char k[32];
    uint64_t      max_bytes = 0, max_entries = 0;
    for (uint64_t i = 0; i < 1000000; i++) {
        key_n(i, k);
        p[0] = (double)i;
        eng_rcache_put(c, k, p, 4);
        if (i % 997 == 0) {
            eng_rcache_stats_t st;
            eng_rcache_stats(c, &st);
            max_bytes = st.bytes > max_bytes ? st.bytes : max_bytes;
            max_entries = st.entries > max_entries ? st.entries : max_entries;
        }
    }
    eng_rcache_stats_t st;
    eng_rcache_stats(c, &st);
    cr_log_info("1 MiB: %llu entries of %llu bytes each, index %llu bytes",
                (unsigned long long)st.entries, (unsigned long long)(st.bytes / st.entries),
                (unsigned long long)st.index_bytes);
    cr_assert_leq(max_bytes, bound);
    cr_assert_leq(st.bytes, bound);
    cr_assert_gt(st.entries, bound / 128, "an entry of 4 answers costs under 128 bytes");
    cr_assert_leq(st.index_bytes, 2 * max_entries * sizeof(void *));
    cr_assert_eq(st.evictions, 1000000 - st.entries);
    key_n(999999, k);
    cr_assert(eng_rcache_get(c, k, o, 4));
    cr_assert_eq(o[0], 999999.0);
    key_n(0, k);
    cr_assert(!eng_rcache_get(c, k, o, 4));
    eng_rcache_free(c);
}

/* An entry larger than the byte bound is not kept (and evicts nothing). */
Test(rcache, larger_than_the_bound_is_not_kept) {
    eng_rcache_t *c = eng_rcache_new(16, 256);
    unsigned char k[32], k2[32];
    double        small[2] = {0.5, 0.5}, big[255] = {0}, o[255];
    key_n(1, k);
    key_n(2, k2);
    eng_rcache_put(c, k, small, 2);
    eng_rcache_put(c, k2, big, 255);
    cr_assert(!eng_rcache_get(c, k2, o, 255));
    cr_assert(eng_rcache_get(c, k, o, 2));
    eng_rcache_free(c);
}
