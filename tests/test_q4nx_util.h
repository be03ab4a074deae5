/*
 * test_q4nx_util.h -- what the Q4NX tests share (test_q4nx*.c): a
 * reproducible uniform generator, bf16 bytes, temporary paths and
 * hand-made safetensors files.
 */
#ifndef D3_TEST_Q4NX_UTIL_H
#define D3_TEST_Q4NX_UTIL_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "eng_q4nx_int.h"

static uint32_t g_rng = 12345u;

static inline float frand(void) { /* uniform [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)(g_rng >> 8) / (float)(1u << 23) - 1.0f;
}

static inline void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline float bf(const uint8_t *p) {
    return eng_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

#define BF_ONE 0x3f80u /* bf16 1.0 */

static char g_tmp[64];

static inline const char *tmp_path(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/d3-q4nx-XXXXXX");
    int fd = mkstemp(g_tmp);
    cr_assert(fd >= 0);
    close(fd);
    return g_tmp;
}

/* A hand-made safetensors file: n entries of (name, dtype, shape, bytes). */
typedef struct {
    const char    *name, *dtype;
    int            rank;
    uint64_t       shape[3];
    const uint8_t *data;
    size_t         nbytes;
} ent_t;

static inline void write_st(const char *path, const ent_t *e, size_t n) {
    char   h[8192];
    size_t used = (size_t)snprintf(h, sizeof h, "{");
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        used +=
            (size_t)snprintf(h + used, sizeof h - used, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                             i ? "," : "", e[i].name, e[i].dtype);
        for (int k = 0; k < e[i].rank; k++)
            used += (size_t)snprintf(h + used, sizeof h - used, "%s%llu", k ? "," : "",
                                     (unsigned long long)e[i].shape[k]);
        used += (size_t)snprintf(h + used, sizeof h - used, "],\"data_offsets\":[%zu,%zu]}", off,
                                 off + e[i].nbytes);
        off += e[i].nbytes;
    }
    used += (size_t)snprintf(h + used, sizeof h - used, "}");
    cr_assert(used < sizeof h);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    uint8_t le[8] = {0};
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)used >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(h, 1, used, f);
    for (size_t i = 0; i < n; i++)
        fwrite(e[i].data, 1, e[i].nbytes, f);
    fclose(f);
}

#endif /* D3_TEST_Q4NX_UTIL_H */
