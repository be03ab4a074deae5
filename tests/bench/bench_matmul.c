/*
 * bench_matmul.c -- the projection matmuls at d3-nano's shapes: AMX-BF16
 * (npu_matmul_amx_bf16, the default split npu_matmul_amx, and the int8
 * kernels of quantised weights npu_matmul_amx_i8 and, for CPUs without
 * AMX, npu_matmul_vnni_i8 and the bf16 pack on VDPBF16PS,
 * npu_matmul_bf16_avx512 split) against the fp32 ones where the tiles are not
 * used (npu_matmul_dnnl, oneDNN's sgemm, the default there, and our
 * AVX-512 panels, one thread, D3_NPU_MATMUL=panels), on one thread
 * (D3_NPU_THREADS=1 in the environment) or the whole pool. Built, never
 * run by ctest; bench_onednn.c has oneDNN's own matmuls beside ours.
 *
 *   bench_matmul [T ...]   token counts (default 128 1024 4096)
 *   bench_matmul --json    one JSON object per line
 *
 * Shapes: the MLP (2048 -> 6144, 6144 -> 2048), the DeltaNet in_qkv
 * (2048 -> 6144) and out_proj (2048 -> 2048), and q_proj with its gate
 * (2048 -> 8192). GFLOP/s = 2 T K N / median seconds of 5 runs (the
 * thread's CPU seconds when D3_NPU_THREADS=1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "npu.h"

/* Wall time; on one thread (D3_NPU_THREADS=1) the thread's CPU time, which
 * a loaded machine disturbs less (what shares the core is not counted). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(npu_threads() == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define RUNS 5

/* Median seconds of RUNS calls of fn after one warm-up. */
typedef void (*mm_fn)(const float *x, const void *w, size_t T, size_t K, size_t N, float *out);

static double median_s(mm_fn fn, const float *x, const void *w, size_t T, size_t K, size_t N,
                       float *out) {
    double t[RUNS];
    fn(x, w, T, K, N, out);
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_s();
        fn(x, w, T, K, N, out);
        t[r] = now_s() - t0;
    }
    qsort(t, RUNS, sizeof t[0], bench_cmp_double);
    return t[RUNS / 2];
}

static void amx(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_amx_bf16(x, w, T, K, N, out);
}

static void amx_x2(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_amx(x, w, T, K, N, true, out);
}

static void amx_i8(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_amx_i8(x, w, T, K, N, out);
}

static void vnni_i8(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_vnni_i8(x, w, T, K, N, out);
}

static void vnni_grp(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_vnni_grp(x, w, T, K, N, out);
}

static void vnni_grp8(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_vnni_grp8(x, w, T, K, N, out);
}

/* A 4-bit weight in groups of 32 as Q4_1 stores one (codes 0..15, a scale
 * and a min per group), packed for npu_matmul_vnni_grp. */
static void *grp_pack(size_t N, size_t K) {
    size_t   G = (K + NPU_GRP_K - 1) / NPU_GRP_K;
    uint8_t *u = malloc(N * K);
    float   *d = bench_rand_vec(N * G), *m = bench_rand_vec(N * G);
    void    *pk = aligned_alloc(64, npu_grp_pack_bytes(N, K));
    if (!u || !pk)
        exit(1);
    for (size_t i = 0; i < N * K; i++)
        u[i] = (uint8_t)((i * 2654435761u) >> 28);
    npu_grp_pack(u, d, m, N, K, pk);
    free(u), free(d), free(m);
    return pk;
}

static void bf16_x2(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_bf16_avx512(x, w, T, K, N, true, out);
}

static void panels(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_panels_avx512(x, w, T, K, N, out);
}

static void dnnl(const float *x, const void *w, size_t T, size_t K, size_t N, float *out) {
    npu_matmul_dnnl(x, w, T, K, N, out);
}

static void row(size_t T, size_t K, size_t N, const char *what, bool json, bool have_amx) {
    float *x = bench_rand_vec(T * K), *w = bench_rand_vec(N * K), *out = bench_rand_vec(T * N);
    double flop = 2.0 * (double)T * (double)K * (double)N, s_amx = 0, s_x2 = 0, s_i8 = 0, s_vn = 0,
           s_b2 = 0, s_gr = 0, s_g8 = 0, s_f32, s_dn;
    const npu_features_t *f = npu_probe();
    if (have_amx || f->avx512_bf16) {
        uint16_t *pk = aligned_alloc(64, (npu_amx_pack_elems(N, K) * 2 + 63) / 64 * 64);
        if (!pk)
            exit(1);
        npu_amx_pack_bf16(w, N, K, pk);
        if (have_amx) {
            s_amx = median_s(amx, x, pk, T, K, N, out);
            s_x2 = median_s(amx_x2, x, pk, T, K, N, out);
        }
        if (f->avx512_bf16)
            s_b2 = median_s(bf16_x2, x, pk, T, K, N, out);
        free(pk);
    }
    if ((have_amx && f->amx_int8) || f->avx512_vnni) {
        void *pi = aligned_alloc(64, (npu_amx_i8_pack_bytes(N, K) + 63) / 64 * 64);
        if (!pi)
            exit(1);
        npu_amx_i8_pack(w, N, K, pi);
        if (have_amx && f->amx_int8)
            s_i8 = median_s(amx_i8, x, pi, T, K, N, out);
        if (f->avx512_vnni)
            s_vn = median_s(vnni_i8, x, pi, T, K, N, out);
        free(pi);
    }
    if (f->avx512_vnni) {
        void *pg = grp_pack(N, K);
        s_gr = median_s(vnni_grp, x, pg, T, K, N, out);
        s_g8 = median_s(vnni_grp8, x, pg, T, K, N, out);
        free(pg);
    }
    size_t np = (N + 31) / 32 * 32;
    float *pan = aligned_alloc(64, np * K * sizeof *pan);
    if (!pan)
        exit(1);
    memset(pan, 0, np * K * sizeof *pan);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++)
            pan[(n / 32 * K + k) * 32 + n % 32] = w[n * K + k];
    /* The fp32 panels run on one thread; they are the old path. */
    s_f32 = median_s(panels, x, pan, T, K, N, out);
    s_dn = median_s(dnnl, x, w, T, K, N, out);
    if (json)
        printf("{\"what\":\"%s\",\"T\":%zu,\"K\":%zu,\"N\":%zu,\"threads\":%zu,\"amx_gflops\":%.1f,"
               "\"amx_x2_gflops\":%.1f,\"amx_i8x3_gflops\":%.1f,\"vnni_i8x3_gflops\":%.1f,"
               "\"avx512_grp8x2_gflops\":%.1f,\"avx512_grp8_gflops\":%.1f,\"avx512_bf16x2_gflops\":"
               "%.1f,\"onednn_f32_gflops\":%"
               ".1f,\"f32_1thread_gflops\":%."
               "1f}\n",
               what, T, K, N, npu_threads(), have_amx ? flop / s_amx * 1e-9 : 0.0,
               have_amx ? flop / s_x2 * 1e-9 : 0.0, s_i8 > 0 ? flop / s_i8 * 1e-9 : 0.0,
               s_vn > 0 ? flop / s_vn * 1e-9 : 0.0, s_gr > 0 ? flop / s_gr * 1e-9 : 0.0,
               s_g8 > 0 ? flop / s_g8 * 1e-9 : 0.0, s_b2 > 0 ? flop / s_b2 * 1e-9 : 0.0,
               flop / s_dn * 1e-9, flop / s_f32 * 1e-9);
    else
        printf("%-9s T=%-5zu K=%-5zu N=%-5zu  amx-bf16 %7.1f  amx-bf16x2 %7.1f  amx-int8x3 %7.1f "
               " avx512-int8x3 %7.1f  avx512-grp8x2 %7.1f  avx512-grp8 %7.1f  avx512-bf16x2 %7.1f  "
               "onednn-f32 %6.1f "
               "GFLOP/s (%zu thr)  f32 "
               "panels %6.1f (1 thr)\n",
               what, T, K, N, have_amx ? flop / s_amx * 1e-9 : 0.0,
               have_amx ? flop / s_x2 * 1e-9 : 0.0, s_i8 > 0 ? flop / s_i8 * 1e-9 : 0.0,
               s_vn > 0 ? flop / s_vn * 1e-9 : 0.0, s_gr > 0 ? flop / s_gr * 1e-9 : 0.0,
               s_g8 > 0 ? flop / s_g8 * 1e-9 : 0.0, s_b2 > 0 ? flop / s_b2 * 1e-9 : 0.0,
               flop / s_dn * 1e-9, npu_threads(), flop / s_f32 * 1e-9);
    fflush(stdout);
    free(pan), free(x), free(w), free(out);
}

int main(int argc, char **argv) {
    bool   json = false;
    size_t Ts[16], n_t = 0;
    char  *end = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (n_t < 16 && strtoul(argv[i], &end, 10) > 0 && !*end)
            Ts[n_t++] = (size_t)strtoul(argv[i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_matmul [--json] [T ...]\n");
            return 2;
        }
    }
    if (n_t == 0) {
        Ts[0] = 128, Ts[1] = 1024, Ts[2] = 4096;
        n_t = 3;
    }
    const npu_features_t *f = npu_probe();
    bool                  have = f->amx_bf16 && f->amx_usable && f->avx512_bf16;
    if (!f->avx512f) {
        fprintf(stderr, "bench_matmul: no AVX-512 on this CPU\n");
        return 0;
    }
    if (!have)
        fprintf(stderr, "bench_matmul: no usable AMX-BF16: fp32 panels only\n");
    for (size_t i = 0; i < n_t; i++) {
        row(Ts[i], 2048, 6144, "mlp_up", json, have);
        row(Ts[i], 6144, 2048, "mlp_down", json, have);
        row(Ts[i], 2048, 2048, "out_proj", json, have);
        row(Ts[i], 2048, 8192, "q_proj", json, have);
    }
    return 0;
}
