/*
 * bench_util.h -- what the matmul benchmarks share (bench_matmul.c,
 * bench_onednn.c): reproducible inputs in [-0.5, 0.5) and the comparison
 * qsort needs for medians.
 */
#ifndef D3_BENCH_UTIL_H
#define D3_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* n floats from xorshift64* (one stream per process), 64-byte aligned;
 * exits on out of memory (a benchmark has nothing to fall back to). */
static inline float *bench_rand_vec(size_t n) {
    static uint64_t s = 0x9e3779b97f4a7c15ULL;
    size_t          bytes = ((n ? n : 1) * sizeof(float) + 63) / 64 * 64;
    float          *p = aligned_alloc(64, bytes);
    if (!p) {
        fprintf(stderr, "benchmark: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        p[i] = (float)((double)((s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0 - 0.5);
    }
    return p;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
