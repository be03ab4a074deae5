/*
 * npu_amx_int.h -- private to npu/: the one AMX tile configuration every
 * tile kernel uses (npu_amx_mm.c, npu_attn_fast.c, npu_delta_fast.c), so
 * that the subtle part is written once.
 *
 * Include it after the file's target pragma (amx-tile): the function below
 * is compiled with the including file's ISA.
 */
#ifndef D3STREAM_NPU_AMX_INT_H
#define D3STREAM_NPU_AMX_INT_H

#include "npu.h"

#include <immintrin.h>
#include <stdint.h>

/* 64-byte tile configuration, palette 1 (Intel SDM, LDTILECFG). */
typedef struct npu_tilecfg {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} npu_tilecfg_t;

/* Tiles 0..7 as 16 rows x 64 bytes: fp32 accumulators and bf16 operands
 * alike. The configuration is per thread, so each work item that may run
 * on a pool thread loads it (cheap next to a block of tile products). */
static inline void npu_tiles_16x64(void) {
    npu_tilecfg_t cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    /* GCC's _tile_loadconfig tells the compiler it reads only 8 bytes of
     * cfg, which lets it drop the stores above (a SIGILL on the next tile
     * instruction): the barrier makes them happen first. */
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* The 2x2 block of tile products: C0..C3 (tiles 0..3) += A0..A1 (4, 5)
 * times B0..B1 (6, 7), in row-major order of C. */
static inline void npu_tdp_2x2(void) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

#endif /* D3STREAM_NPU_AMX_INT_H */
