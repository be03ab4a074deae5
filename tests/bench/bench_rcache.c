/*
 * bench_rcache.c -- the result cache (eng_rcache.c) at scale: N distinct
 * answers of 4 options through a cache of MIB MiB (entries unbounded), as
 * a long backfill of distinct questions would push them. Reports the bytes
 * counted against the bound, the index beside them, the process's resident
 * memory before and after (VmRSS: what the bound is for), and the time of
 * a key, a put and a hit. Built, never run by ctest.
 *
 *   bench_rcache [N] [MIB]     default 1,000,000 answers through 64 MiB
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eng_rcache_int.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* VmRSS of this process in KiB, or 0. */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char  line[256];
    long  v = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

/* Answer i's key: a 330-token prompt of ids derived from i. */
static void key_of(uint64_t i, int32_t *ids, unsigned char key[ENG_RCACHE_KEY]) {
    eng_rcache_ctx_t c = {.identity = "bench", .profile = ENG_PROFILE_EXACT, .temperature = 1.0};
    ids[0] = (int32_t)(i & 0x7fffffff);
    ids[1] = (int32_t)(i >> 31);
    eng_rcache_key(&c, 4, ids, 330, NULL, NULL, 0, key);
}

int main(int argc, char **argv) {
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    size_t   mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 64;
    int32_t  ids[330];
    for (int k = 0; k < 330; k++)
        ids[k] = 1000 + k;
    long          rss0 = rss_kib();
    eng_rcache_t *c = eng_rcache_new(SIZE_MAX, mib << 20);
    if (!c) {
        fprintf(stderr, "bench_rcache: out of memory\n");
        return 1;
    }
    double        p[4] = {0.1, 0.2, 0.3, 0.4}, o[4];
    unsigned char key[ENG_RCACHE_KEY];
    double        t_key = 0, t_put = 0, t0;
    for (uint64_t i = 0; i < n; i++) {
        t0 = now_s();
        key_of(i, ids, key);
        t_key += now_s() - t0;
        t0 = now_s();
        eng_rcache_put(c, key, p, 4);
        t_put += now_s() - t0;
    }
    eng_rcache_stats_t st;
    eng_rcache_stats(c, &st);
    long rss1 = rss_kib();
    /* hits: the last 100,000 (or n) answers, which are all still there
     * when the bound holds that many */
    uint64_t m = n < 100000 ? n : 100000, hits = 0;
    t0 = now_s();
    for (uint64_t i = n - m; i < n; i++) {
        key_of(i, ids, key);
        hits += eng_rcache_get(c, key, o, 4);
    }
    double t_get = now_s() - t0;
    printf("bench_rcache: %llu distinct answers (4 options, 330-token keys) through %zu MiB:\n",
           (unsigned long long)n, mib);
    printf("  kept %llu entries, %llu bytes counted (%.1f%% of the bound, %.0f per entry), "
           "index %llu bytes, %llu evictions\n",
           (unsigned long long)st.entries, (unsigned long long)st.bytes,
           100.0 * (double)st.bytes / (double)(mib << 20),
           st.entries ? (double)st.bytes / (double)st.entries : 0.0,
           (unsigned long long)st.index_bytes, (unsigned long long)st.evictions);
    printf("  VmRSS %.1f MiB before, %.1f MiB after: +%.1f MiB (bound %zu MiB + index %.1f MiB)\n",
           rss0 / 1024.0, rss1 / 1024.0, (rss1 - rss0) / 1024.0, mib,
           (double)st.index_bytes / 1048576.0);
    printf("  per answer: key %.2f us (SHA-256 of 330 ids), put %.2f us; hit (key + get) %.2f us, "
           "%llu of %llu found\n",
           t_key / (double)n * 1e6, t_put / (double)n * 1e6, t_get / (double)m * 1e6,
           (unsigned long long)hits, (unsigned long long)m);
    eng_rcache_free(c);
    return 0;
}
