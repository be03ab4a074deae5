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
    if (iters > 1 && fn(q, k, v, T, T, H, Hkv, D, causal, NULL, o) != SVC_OK) /* warm up */
        exit(1);
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        if (fn(q, k, v, T, T, H, Hkv, D, causal, NULL, o) != SVC_OK)
            exit(1);
    double dt = (now_s() - t0) / iters;
    free(q), free(k), free(v), free(o);
    return dt * 1e3;
}

static svc_err_t attn_ref(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                          size_t H, size_t Hkv, size_t D, bool causal, const uint8_t *mask,
                          float *out) {
    return npu_attention_ref(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, out, NULL);
}

/* The dispatched kernel (the small-head path for D <= 32) vs the reference. */
static void bench_attention(size_t T, size_t H, size_t Hkv, size_t D, bool causal, int iters,
                            int iters_ref) {
    double fast = time_attention(npu_attention, T, H, Hkv, D, causal, iters);
    double ref = time_attention(attn_ref, T, H, Hkv, D, causal, iters_ref);
    /* T (T + 1) / 2 query-key pairs per head causal, T^2 not; 4 D flops each */
    double pairs = causal ? (double)T * (double)(T + 1) / 2.0 : (double)T * (double)T;
    double fl = 4.0 * pairs * (double)H * (double)D;
    printf("attention T=%-4zu H=%zu/%zu D=%-3zu %-9s fast %8.3f ms (%5.1f GFLOP/s)  ref %8.3f "
           "ms  x%.1f\n",
           T, H, Hkv, D, causal ? "causal" : "noncausal", fast, fl / fast * 1e-6, ref, ref / fast);
}

static svc_err_t attn_tiled_bf16x3(const float *q, const float *k, const float *v, size_t Tq,
                                   size_t Tk, size_t H, size_t Hkv, size_t D, bool causal,
                                   const uint8_t *mask, float *out) {
    return npu_attention_tiled_mode(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, out, NULL,
                                    NPU_ATTN_BF16X3);
}

static svc_err_t attn_tiled_fp32(const float *q, const float *k, const float *v, size_t Tq,
                                 size_t Tk, size_t H, size_t Hkv, size_t D, bool causal,
                                 const uint8_t *mask, float *out) {
    return npu_attention_tiled_mode(q, k, v, Tq, Tk, H, Hkv, D, causal, mask, out, NULL,
                                    NPU_ATTN_FP32);
}

/* The tiled kernel (npu_attn_fast.c) at d3-nano's full-attention shape,
 * 8/2 heads x 256, non-causal, on all of the pool's threads: BF16 (AMX),
 * BF16X3 (what npu_attention runs), FP32; the old per-query kernel
 * (npu_attention_avx512, single thread) with old_iters > 0 (it is slow);
 * x3_iters or fp32_iters = 0 skips that mode. GFLOP/s counts 4 D flops per query-key pair. */
static void bench_attention_tiled(size_t T, int iters, int x3_iters, int fp32_iters,
                                  int old_iters) {
    const size_t H = 8, Hkv = 2, D = 256;
    double       fl = 4.0 * (double)T * (double)T * (double)H * (double)D * 1e-6; /* MFLOP */
    double       bf = time_attention(npu_attention_tiled, T, H, Hkv, D, false, iters);
    printf("attention tiled T=%-5zu H=8/2 D=256 noncausal  bf16 %9.1f ms (%6.1f GFLOP/s)", T, bf,
           fl / bf);
    double x3 = 0.0;
    if (x3_iters > 0) {
        x3 = time_attention(attn_tiled_bf16x3, T, H, Hkv, D, false, x3_iters);
        printf("  bf16x3 %9.1f ms (%6.1f)", x3, fl / x3);
    }
    if (fp32_iters > 0) {
        double f32 = time_attention(attn_tiled_fp32, T, H, Hkv, D, false, fp32_iters);
        printf("  fp32 %8.1f ms (%5.1f)", f32, fl / f32);
    }
    if (old_iters > 0) {
        double old = time_attention(npu_attention_avx512, T, H, Hkv, D, false, old_iters);
        printf("  old %8.1f ms (%4.1f)  bf16 x%.0f, bf16x3 x%.0f old", old, fl / old, old / bf,
               x3 > 0.0 ? old / x3 : 0.0);
    }
    printf("\n");
}

/* The vision tower's attention (16 heads x 64 over every patch of one
 * image, non-causal; 3,072 patches for 1024 x 768): the exact profile's
 * npu_attention against the fast profile's npu_attention_fast. */
static void bench_attention_vision(size_t T, int iters) {
    const size_t H = 16, D = 64;
    double       fl = 4.0 * (double)T * (double)T * (double)H * (double)D * 1e-6; /* MFLOP */
    double       ex = time_attention(npu_attention, T, H, H, D, false, iters);
    double       fa = time_attention(npu_attention_fast, T, H, H, D, false, iters);
    printf("attention vision T=%-5zu H=16 D=64 noncausal  exact %9.1f ms (%6.1f GFLOP/s)  fast "
           "%9.1f ms (%6.1f)  x%.2f\n",
           T, ex, fl / ex, fa, fl / fa, ex / fa);
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

/* The two AVX-512 delta rules side by side at one shape: the chunked one
 * (npu_delta_fast.c; on npu_threads() threads, AMX products unless
 * D3_NPU_DELTA=f32) against the recurrent one (one thread), against
 * the chunked reference when iters_ref > 0, and the fast profile's bf16
 * products (npu_delta_rule_bf16_avx512) where the CPU has them. */
static void bench_delta_chunked(size_t T, size_t Hk, size_t Hv, size_t d, int iters,
                                int iters_ref) {
    if (!npu_probe()->avx512f)
        return;
    const npu_features_t *f = npu_probe();
    const char           *env = getenv("D3_NPU_DELTA"); /* "f32": no AMX products */
    bool   amx = f->amx_bf16 && f->avx512_bf16 && f->amx_usable && !(env && !strcmp(env, "f32"));
    double chunked = time_delta(npu_delta_rule_chunked_avx512, T, Hk, Hv, d, iters);
    double rec = time_delta(npu_delta_rule_avx512, T, Hk, Hv, d, iters);
    printf("delta_rule T=%-4zu H=%zu/%zu d=%-3zu  chunked %8.3f ms (%zu threads, %s)  recurrent "
           "%8.3f ms  x%.1f",
           T, Hk, Hv, d, chunked, npu_threads(), amx ? "amx" : "f32", rec, rec / chunked);
    if (iters_ref > 0) {
        double ref = time_delta(npu_delta_rule_chunked_ref, T, Hk, Hv, d, iters_ref);
        printf("  ref(chunked) %8.3f ms  x%.1f", ref, ref / chunked);
    }
    if (npu_delta_bf16_usable(T, d, d)) { /* the fast profile's */
        double bf = time_delta(npu_delta_rule_bf16_avx512, T, Hk, Hv, d, iters);
        printf("  bf16 %8.3f ms  x%.2f", bf, chunked / bf);
    }
    printf("\n");
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
    printf("tiled attention: %zu threads, AMX %s\n", npu_threads(),
           npu_attention_amx_usable()    ? "yes"
           : npu_attention_bf16_usable() ? "no (bf16 rows on AVX512_BF16 vectors)"
                                         : "no (bf16 rows run fp32)");
    bench_attention_tiled(512, 5 * scale, 5 * scale, 2 * scale, scale);
    bench_attention_tiled(1024, 3 * scale, 3 * scale, scale, scale);
    bench_attention_tiled(4096, scale, scale, scale, 0);
    bench_attention_vision(3072, scale);
    if (getenv("D3_BENCH_32K")) /* BF16 only: tens of seconds on 2 cores */
        bench_attention_tiled(32768, 1, 0, 0, 0);
    bench_delta(260, 2, 4, 16, 100 * scale, 10 * scale);
    bench_delta(1024, 16, 16, 128, scale, scale);
    bench_delta_chunked(64, 16, 16, 128, 20 * scale, 0);
    bench_delta_chunked(1024, 16, 16, 128, 3 * scale, scale);
    bench_delta_chunked(4096, 16, 16, 128, scale, scale);
    return 0;
}
