/*
 * bench_kernels.c -- speed of the fast kernels (npu.h, "Fast kernels")
 * against the references, single thread. Built, never run by ctest.
 *
 *   bench_kernels [scale]  time each kernel (scale multiplies the
 *                          iteration counts; default 1) and print
 *                          GFLOP/s or ms per call, fast vs ref
 *   bench_kernels --once   run one tiny-model call set (one layer's worth
 *                          of each kernel at 260 tokens) through the
 *                          dispatched npu_* entry points and exit: for
 *                          valgrind --tool=callgrind, with and without
 *                          D3_NPU_KERNELS=ref
 *   bench_kernels --once setup  the same inputs, no kernel: the baseline
 *                          to subtract from an instruction count
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npu.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;

static float *rand_vec(size_t n, float lo, float hi) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
        double u = (double)((g_rng * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
        p[i] = (float)(lo + (hi - lo) * u);
    }
    return p;
}

typedef void (*matmul_fn)(const float *, const float *, size_t, size_t, size_t, float *);

static double time_matmul(matmul_fn fn, size_t T, size_t K, size_t N, int iters) {
    float *x = rand_vec(T * K, -1, 1), *w = rand_vec(N * K, -1, 1), *o = rand_vec(T * N, 0, 0);
    fn(x, w, T, K, N, o); /* warm up */
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        fn(x, w, T, K, N, o);
    double dt = (now_s() - t0) / iters;
    free(x), free(w), free(o);
    return 2.0 * (double)T * (double)K * (double)N / dt * 1e-9;
}

/* npu_matmul_packed on a pack of a random w (N, K), GFLOP/s. */
static double time_matmul_packed(size_t T, size_t K, size_t N, int iters) {
    float       *x = rand_vec(T * K, -1, 1), *o = rand_vec(T * N, 0, 0);
    npu_wpack_t *wp;
    if (npu_wpack_new(rand_vec(N * K, -1, 1), N, K, &wp) != SVC_OK)
        exit(1);
    npu_matmul_packed(x, wp, T, o); /* warm up */
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        npu_matmul_packed(x, wp, T, o);
    double dt = (now_s() - t0) / iters;
    npu_wpack_free(wp);
    free(x), free(o);
    return 2.0 * (double)T * (double)K * (double)N / dt * 1e-9;
}

static void bench_matmul(size_t T, size_t K, size_t N, size_t T_ref, int iters, int iters_ref) {
    double fast = time_matmul(npu_matmul, T, K, N, iters);
    double packed = time_matmul_packed(T, K, N, iters);
    double ref = time_matmul(npu_matmul_ref, T_ref, K, N, iters_ref);
    printf("matmul T=%-4zu K=%-5zu N=%-5zu  fast %7.2f  packed %7.2f GFLOP/s  ref %6.2f "
           "GFLOP/s%s  packed x%.1f fast\n",
           T, K, N, fast, packed, ref, T_ref != T ? " (T=16)" : "", packed / fast);
}

typedef svc_err_t (*attn_fn)(const float *, const float *, const float *, size_t, size_t, size_t,
                             size_t, size_t, bool, const uint8_t *, float *);

static double time_attention(attn_fn fn, size_t T, size_t H, size_t Hkv, size_t D, bool causal,
                             int iters) {
    float *q = rand_vec(T * H * D, -1, 1), *k = rand_vec(T * Hkv * D, -1, 1);
    float *v = rand_vec(T * Hkv * D, -1, 1), *o = rand_vec(T * H * D, 0, 0);
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        if (fn(q, k, v, T, T, H, Hkv, D, causal, NULL, o) != SVC_OK)
            exit(1);
    double dt = (now_s() - t0) / iters;
    free(q), free(k), free(v), free(o);
    return dt * 1e3;
}

/* The dispatched kernel (the small-head path for D <= 32) vs the reference. */
static void bench_attention(size_t T, size_t H, size_t Hkv, size_t D, bool causal, int iters,
                            int iters_ref) {
    double fast = time_attention(npu_attention, T, H, Hkv, D, causal, iters);
    double ref = time_attention(npu_attention_ref, T, H, Hkv, D, causal, iters_ref);
    /* T (T + 1) / 2 query-key pairs per head causal, T^2 not; 4 D flops each */
    double pairs = causal ? (double)T * (double)(T + 1) / 2.0 : (double)T * (double)T;
    double fl = 4.0 * pairs * (double)H * (double)D;
    printf("attention T=%-4zu H=%zu/%zu D=%-3zu %-9s fast %8.3f ms (%5.1f GFLOP/s)  ref %8.3f "
           "ms  x%.1f\n",
           T, H, Hkv, D, causal ? "causal" : "noncausal", fast, fl / fast * 1e-6, ref, ref / fast);
}

typedef svc_err_t (*delta_fn)(const float *, const float *, const float *, const float *,
                              const float *, size_t, size_t, size_t, size_t, size_t, const float *,
                              float *, float *);

static double time_delta(delta_fn fn, size_t T, size_t Hk, size_t Hv, size_t d, int iters) {
    float *q = rand_vec(T * Hk * d, -1, 1), *k = rand_vec(T * Hk * d, -1, 1);
    npu_l2norm(q, T * Hk, d, 1e-6f, q);
    npu_l2norm(k, T * Hk, d, 1e-6f, k);
    float *v = rand_vec(T * Hv * d, -1, 1), *g = rand_vec(T * Hv, -0.5f, 0);
    float *b = rand_vec(T * Hv, 0.1f, 0.9f), *o = rand_vec(T * Hv * d, 0, 0);
    float *s = rand_vec(Hv * d * d, 0, 0);
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        if (fn(q, k, v, g, b, T, Hk, Hv, d, d, NULL, s, o) != SVC_OK)
            exit(1);
    double dt = (now_s() - t0) / iters;
    free(q), free(k), free(v), free(g), free(b), free(o), free(s);
    return dt * 1e3;
}

static void bench_delta(size_t T, size_t Hk, size_t Hv, size_t d, int iters, int iters_ref) {
    double fast = time_delta(npu_delta_rule, T, Hk, Hv, d, iters);
    double ref = time_delta(npu_delta_rule_chunked_ref, T, Hk, Hv, d, iters_ref);
    printf("delta_rule T=%-4zu H=%zu/%zu d=%-3zu  fast %8.3f ms  ref(chunked) %8.3f ms  x%.1f\n", T,
           Hk, Hv, d, fast, ref, ref / fast);
}

/* One layer's worth of every kernel at the tiny model's shapes (hidden 64,
 * intermediate 128, 4/2 heads of 16, DeltaNet 2/4 heads of 16, conv C 128
 * K 4), 260 tokens, through the dispatched entry points. */
static int run_once(bool kernels) {
    size_t T = 260;
    float *x = rand_vec(T * 256, -1, 1), *w = rand_vec(256 * 128, -0.2f, 0.2f);
    float *y = rand_vec(T * 256, 0, 0), *z = rand_vec(T * 256, -1, 1);
    float *g = rand_vec(T * 4, -0.5f, 0), *b = rand_vec(T * 4, 0.1f, 0.9f);
    float *st = rand_vec(4 * 16 * 16, 0, 0), *cst = rand_vec(3 * 128, 0, 0);
    if (!kernels) { /* the setup alone, to subtract from a count */
        free(x), free(w), free(y), free(z), free(g), free(b), free(st), free(cst);
        return 0;
    }
    npu_matmul(x, w, T, 64, 128, y);
    npu_matmul(x, w, T, 64, 64, y);
    npu_matmul(x, w, T, 64, 256, y);
    npu_matmul(x, w, T, 128, 64, y);
    npu_rmsnorm(x, w, T, 64, 1e-6f, y, true);
    npu_rmsnorm(x, w, T * 4, 16, 1e-6f, y, true);
    npu_l2norm(x, T * 2, 16, 1e-6f, z);
    npu_l2norm(x + T * 32, T * 2, 16, 1e-6f, z + T * 32);
    npu_conv1d_causal_silu(x, w, T, 128, 4, NULL, cst, y);
    svc_err_t err = npu_attention(x, z, x, T, T, 4, 2, 16, true, NULL, y);
    if (err == SVC_OK)
        err = npu_delta_rule(z, z + T * 32, x, g, b, T, 2, 4, 16, 16, NULL, st, y);
    npu_rmsnorm_gated(y, x, w, T * 4, 16, 1e-6f, y);
    npu_silu_mul(x, z, T, 128, y);
    printf("kernels=%s y[0]=%g\n", npu_kernels_name(), (double)y[0]);
    free(x), free(w), free(y), free(z), free(g), free(b), free(st), free(cst);
    return err == SVC_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--once") == 0)
        return run_once(!(argc > 2 && strcmp(argv[2], "setup") == 0));
    int scale = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 1;
    if (scale < 1)
        scale = 1;
    printf("kernels=%s (single thread)\n", npu_kernels_name());
    bench_matmul(260, 64, 128, 260, 200 * scale, 20 * scale);
    bench_matmul(260, 64, 64, 260, 200 * scale, 20 * scale);
    bench_matmul(260, 64, 256, 260, 200 * scale, 20 * scale);
    bench_matmul(512, 2048, 6144, 16, scale, scale);
    bench_matmul(270, 64, 64, 270, 200 * scale, 20 * scale);
    bench_matmul(270, 128, 64, 270, 200 * scale, 20 * scale);
    bench_matmul(270, 64, 4, 270, 200 * scale, 20 * scale);
    bench_attention(260, 4, 2, 16, true, 50 * scale, 5 * scale);
    bench_attention(270, 4, 2, 16, false, 50 * scale, 5 * scale);
    bench_attention(270, 8, 2, 32, false, 50 * scale, 5 * scale);
    bench_attention(512, 16, 2, 256, true, scale, scale);
    bench_delta(260, 2, 4, 16, 100 * scale, 10 * scale);
    bench_delta(1024, 16, 16, 128, scale, scale);
    return 0;
}
