/*
 * bench_amx_peak.c -- the machine's peak matrix throughput, and the fraction
 * of it our matmul kernels reach. Built, never run by ctest.
 *
 *   bench_amx_peak [--json] [--seconds S] [--threads N] [--no-matmul]
 *
 * Peaks, each on 1 thread and on N threads (default: the CPUs this process
 * may run on, one pthread pinned to each), from register-resident loops
 * that never touch memory:
 *   amx-int8   TDPBSSD: 4 accumulator tiles (16 x 16 int32) fed by 2 A and
 *              2 B tiles (16 x 64 int8), 16 x 16 x 64 multiply-adds each;
 *   amx-bf16   TDPBF16PS: the same tiles as bf16 pairs, 16 x 16 x 32 each;
 *   avx512-vnni-int8  VPDPBUSD zmm, 12 independent accumulators;
 *   avx512-bf16       VDPBF16PS zmm, 12 independent accumulators (the
 *                     peak of avx512-bf16x2, the bf16 matmul without AMX);
 *   avx512-fp32       VFMADD231PS zmm, 12 independent accumulators;
 *   grp8x2-ceiling    the op mix of avx512-grp8x2's micro-kernel per group
 *                     (192 VPDPBUSD, 12 shifts, 12 converts, 24 FMAs, in
 *                     its useful FLOPs): what that kernel could reach if
 *                     nothing waited on memory.
 *   grp8-ceiling      the same for avx512-grp8, the fast profile's kernel
 *                     (96 VPDPBUSD, 12 converts, 12 multiplies, 24 FMAs).
 * With N > 1 threads, each peak also says how far N threads got beyond
 * one: on separate cores, N times; much less, and the CPUs shared their
 * vector units during the run (SMT siblings, or the host's other guests).
 * An operation is a multiply or an add (a multiply-add counts 2), so int8
 * rows are TOPS and the others TFLOP/s.
 *
 * Then our kernels at prefill shapes of the Qwen3.5-2B tower (T tokens,
 * K = 2048, N = 6144, the FFN's gate/up): npu_matmul_packed (the packed
 * layout npu_matmul_name() reports, AMX-BF16 where usable, split over the
 * npu pool of npu_threads() threads: D3_NPU_THREADS=1 for one; a 4/8-bit
 * weight's int8x3 pack; 4-bit group codes on avx512-grp8x2 against its
 * ceiling where the CPU keeps them, and the same codes under the fast
 * profile, npu_matmul_packed_fast, against grp8-ceiling) and the
 * single-threaded fp32 npu_matmul, each as GFLOP/s and as a fraction of the
 * matching peak (AMX-BF16 or AVX-512 fp32 at the same thread count).
 *
 * The AMX code needs AMX-TILE/INT8/BF16 in CPUID and the kernel's leave to
 * use tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA));
 * without either it says so and skips those rows, and with neither AMX nor
 * AVX-512 it prints a message and exits 0. This file is compiled with the
 * AMX flags only (tests/CMakeLists.txt), which make the compiler emit no
 * code of its own choosing; the AVX-512 loops carry their own target
 * attributes, so nothing here runs an instruction the CPU lacks.
 *
 * A benchmark on a shared machine: compare figures measured in one run.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "npu.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

/* Inner iterations between clock reads: long enough to hide the loop and
 * clock overhead, short enough to stop near the requested time. */
#define AMX_INNER  4096
#define VEC_INNER  65536
#define VEC_ACCUMS 12

typedef struct {
    bool avx512;   /* AVX-512 F + BW, OS-enabled zmm state */
    bool vnni;     /* AVX-512 VNNI */
    bool bf16;     /* AVX512-BF16 */
    bool amx_tile; /* AMX-TILE, INT8 and BF16 in CPUID, tile state in XCR0 */
    bool amx_int8;
    bool amx_bf16;
    bool amx_usable; /* ... and the kernel granted XTILEDATA */
} cpu_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static cpu_t cpu_probe(void) {
    cpu_t    c = {0};
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d) || !(cx & (1u << 27))) /* OSXSAVE */
        return c;
    uint64_t xcr0 = xgetbv0();
    if (__get_cpuid_max(0, NULL) < 7)
        return c;
    __cpuid_count(7, 0, a, b, cx, d);
    bool zmm_os = (xcr0 & 0xe6) == 0xe6; /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
    c.avx512 = zmm_os && (b & (1u << 16)) && (b & (1u << 30));
    c.vnni = c.avx512 && (cx & (1u << 11));
    unsigned a1 = 0, b1, c1, d1;
    if (a >= 1) /* leaf 7's highest subleaf */
        __cpuid_count(7, 1, a1, b1, c1, d1);
    c.bf16 = c.avx512 && (a1 & (1u << 5));
    bool tile_os = (xcr0 & (3ull << 17)) == (3ull << 17); /* XTILECFG, XTILEDATA */
    c.amx_tile = tile_os && (d & (1u << 24));
    c.amx_int8 = c.amx_tile && (d & (1u << 25));
    c.amx_bf16 = c.amx_tile && (d & (1u << 22));
    if (c.amx_tile)
        c.amx_usable = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return c;
}

/* ---- the loops: each runs until `seconds` have passed, returns ops ---- */

/* LDTILECFG's 64-byte operand, palette 1: 8 tiles of 16 rows x 64 bytes. */
typedef struct {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} __attribute__((packed, aligned(64))) tilecfg_t;
_Static_assert(sizeof(tilecfg_t) == 64, "LDTILECFG operand is 64 bytes");

static void amx_config(void) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

/* Small operands so the products stay far from int32 overflow and the fp32
 * accumulators from infinity over any run length. */
static void amx_load_operands(bool bf16) {
    _Alignas(64) uint8_t buf[16 * 64];
    for (int i = 0; i < (int)sizeof buf; i++)
        buf[i] = bf16 ? (i & 1 ? 0x3c : 0x00) : (uint8_t)(i % 3); /* bf16 2^-7 or int8 0..2 */
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

static double amx_int8_loop(double seconds) {
    amx_config();
    amx_load_operands(false);
    double   t_end = now_s() + seconds;
    uint64_t n = 0;
    do {
        for (int i = 0; i < AMX_INNER; i++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
        n += AMX_INNER;
    } while (now_s() < t_end);
    _Alignas(64) int32_t sink[16 * 16];
    _tile_stored(0, sink, 64);
    _tile_release();
    return (double)n * 4.0 * 16 * 16 * 64 * 2;
}

static double amx_bf16_loop(double seconds) {
    amx_config();
    amx_load_operands(true);
    double   t_end = now_s() + seconds;
    uint64_t n = 0;
    do {
        for (int i = 0; i < AMX_INNER; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        n += AMX_INNER;
    } while (now_s() < t_end);
    _Alignas(64) float sink[16 * 16];
    _tile_stored(0, sink, 64);
    _tile_release();
    return (double)n * 4.0 * 16 * 16 * 32 * 2;
}

/* The accumulators are named variables (an array would live on the stack)
 * and asm operands, so the compiler keeps all of them in registers and
 * cannot fold the chains. */
#define KEEP(v)  __asm__ volatile("" : "+v"(v))
#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* The timed part of each vector loop: DECL, STEP and SUM (defined around
 * each use) declare, advance and add up the 12 accumulators; ZERO is the
 * sum's start, REDUCE its horizontal sum, OPS the operations per STEP. */
#define PEAK_BODY(ZERO, REDUCE, SINK_T, OPS)                                                       \
    REP12(DECL)                                                                                    \
    double   t_end = now_s() + seconds;                                                            \
    uint64_t n = 0;                                                                                \
    do {                                                                                           \
        for (int i = 0; i < VEC_INNER; i++) {                                                      \
            REP12(STEP)                                                                            \
        }                                                                                          \
        n += VEC_INNER;                                                                            \
    } while (now_s() < t_end);                                                                     \
    __typeof__(ZERO) s = ZERO;                                                                     \
    REP12(SUM)                                                                                     \
    volatile SINK_T sink = REDUCE(s);                                                              \
    (void)sink;                                                                                    \
    return (double)n * VEC_ACCUMS * (OPS)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni_loop(double seconds) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
#define DECL(j) __m512i acc##j = _mm512_setzero_si512();
#define STEP(j)                                                                                    \
    acc##j = _mm512_dpbusd_epi32(acc##j, a, b);                                                    \
    KEEP(acc##j);
#define SUM(j) s = _mm512_add_epi32(s, acc##j);
    PEAK_BODY(_mm512_setzero_si512(), _mm512_reduce_add_epi32, int32_t, 64 * 2);
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_loop(double seconds) {
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80),
             b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
#define DECL(j) __m512 acc##j = _mm512_set1_ps((float)(j));
#define STEP(j)                                                                                    \
    acc##j = _mm512_dpbf16_ps(acc##j, a, b);                                                       \
    KEEP(acc##j);
#define SUM(j) s = _mm512_add_ps(s, acc##j);
    PEAK_BODY(_mm512_setzero_ps(), _mm512_reduce_add_ps, float, 32 * 2);
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx512f"))) static double fma_loop(double seconds) {
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
#define DECL(j) __m512 acc##j = _mm512_set1_ps((float)(j));
#define STEP(j)                                                                                    \
    acc##j = _mm512_fmadd_ps(acc##j, a, b);                                                        \
    KEEP(acc##j);
#define SUM(j) s = _mm512_add_ps(s, acc##j);
    PEAK_BODY(_mm512_setzero_ps(), _mm512_reduce_add_ps, float, 16 * 2);
#undef DECL
#undef STEP
#undef SUM
}

/* The op mix of avx512-grp8x2 (npu_vnni_grp.c) per group of 32 in its
 * 6 x 32 micro-kernel, register-resident: 12 int32 sums (6 rows x 2
 * column halves), each 8 VPDPBUSD over the high activation bytes, a shift
 * by 8, 8 over the low bytes; then per sum a convert and two FMAs into 12
 * fp32 accumulators (d A + m I) and the sum restarted. What the scheme
 * reaches when nothing waits on memory: its ceiling on this core. Counted
 * in the useful operations (6 x 32 x 32 multiply-adds per group), as the
 * kernel's GFLOP/s are, not the 2 x 64 int8 ones per VPDPBUSD. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double grp_mix_loop(double seconds) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    __m512  d = _mm512_set1_ps(1e-9f), m = _mm512_set1_ps(1e-9f), mi = _mm512_set1_ps(3.0f);
#define DECL(j)                                                                                    \
    __m512i s##j = _mm512_setzero_si512();                                                         \
    __m512  f##j = _mm512_set1_ps((float)(j));
#define DP(j)                                                                                      \
    s##j = _mm512_dpbusd_epi32(s##j, a, b);                                                        \
    KEEP(s##j);
#define SHL(j) s##j = _mm512_slli_epi32(s##j, 8);
#define FMA2(j)                                                                                    \
    f##j = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s##j), f##j);                                     \
    f##j = _mm512_fmadd_ps(m, mi, f##j);                                                           \
    KEEP(f##j);                                                                                    \
    s##j = _mm512_setzero_si512();
#define SUM(j) t = _mm512_add_ps(t, f##j);
    REP12(DECL)
    double   t_end = now_s() + seconds;
    uint64_t n = 0;
    do {
        for (int i = 0; i < VEC_INNER / 16; i++) {
            for (int q = 0; q < 8; q++) {
                REP12(DP)
            }
            REP12(SHL)
            for (int q = 0; q < 8; q++) {
                REP12(DP)
            }
            REP12(FMA2)
        }
        n += VEC_INNER / 16;
    } while (now_s() < t_end);
    __m512 t = _mm512_setzero_ps();
    REP12(SUM)
    volatile float sink = _mm512_reduce_add_ps(t);
    (void)sink;
    return (double)n * VEC_ACCUMS * 16 * 32 * 2;
#undef DECL
#undef DP
#undef SHL
#undef FMA2
#undef SUM
}

/* The op mix of avx512-grp8 (npu_vnni_grp.c, the fast profile) per group
 * of 32 in the same 6 x 32 micro-kernel: each of the 12 int32 sums 8
 * VPDPBUSD (one byte per activation, one pass), then f += s (d A + m I): a
 * convert, a multiply and two FMAs. The convert issues beside VPDPBUSD;
 * the other three take its pipes (Zen 4 and Zen 5: 8 VPDPBUSD + 3 FMAs
 * cost 11 VPDPBUSD slots), so the ceiling is 8 / 11 of the VNNI rate in
 * products, what no tuning of the kernel's memory traffic can pass. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double grp8_mix_loop(double seconds) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    __m512  d = _mm512_set1_ps(1e-9f), m = _mm512_set1_ps(1e-9f), mi = _mm512_set1_ps(3.0f);
    __m512  sc = _mm512_set1_ps(0.5f);
#define DECL(j)                                                                                    \
    __m512i s##j = _mm512_setzero_si512();                                                         \
    __m512  f##j = _mm512_set1_ps((float)(j));
#define DP(j)                                                                                      \
    s##j = _mm512_dpbusd_epi32(s##j, a, b);                                                        \
    KEEP(s##j);
#define FMA3(j)                                                                                    \
    f##j = _mm512_fmadd_ps(sc, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s##j), _mm512_mul_ps(m, mi)), \
                           f##j);                                                                  \
    KEEP(f##j);                                                                                    \
    s##j = _mm512_setzero_si512();
#define SUM(j) t = _mm512_add_ps(t, f##j);
    REP12(DECL)
    double   t_end = now_s() + seconds;
    uint64_t n = 0;
    do {
        for (int i = 0; i < VEC_INNER / 8; i++) {
            for (int q = 0; q < 8; q++) {
                REP12(DP)
            }
            REP12(FMA3)
        }
        n += VEC_INNER / 8;
    } while (now_s() < t_end);
    __m512 t = _mm512_setzero_ps();
    REP12(SUM)
    volatile float sink = _mm512_reduce_add_ps(t);
    (void)sink;
    return (double)n * VEC_ACCUMS * 16 * 32 * 2;
#undef DECL
#undef DP
#undef FMA3
#undef SUM
}

/* ---- threads ------------------------------------------------------------ */

typedef double (*loop_fn)(double seconds);

typedef struct {
    loop_fn            fn;
    double             seconds;
    int                pin; /* pin to this CPU, or -1 */
    pthread_barrier_t *start;
    double             ops;
    double             dt;  /* wall seconds */
    double             cpu; /* this thread's CPU seconds */
} worker_t;

/* A throughput two ways: ops per wall second (what this run got, with
 * whatever else the machine runs), and ops per CPU second of each thread,
 * summed (what the threads reach while they hold a core: the figure that
 * does not depend on the load, on a machine without SMT siblings). */
typedef struct {
    double wall;
    double cpu;
} rate_t;

static double cpu_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    if (w->pin >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(w->pin, &set);
        (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    pthread_barrier_wait(w->start);
    double t0 = now_s(), c0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
    w->ops = w->fn(w->seconds);
    w->dt = now_s() - t0;
    w->cpu = cpu_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    return NULL;
}

/* The allowed CPUs in order, at most max; returns how many. */
static int allowed_cpus(int *cpus, int max) {
    cpu_set_t set;
    int       n = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return n;
}

/* Ops per second of fn on nthreads threads at once: the sum of each
 * thread's ops over the longest thread's wall time, and the sum of each
 * thread's ops per its CPU time. */
static rate_t run_threads(loop_fn fn, int nthreads, double seconds) {
    worker_t         *ws = calloc((size_t)nthreads, sizeof *ws);
    pthread_t        *ts = calloc((size_t)nthreads, sizeof *ts);
    int               cpus[256];
    int               ncpu = allowed_cpus(cpus, 256);
    pthread_barrier_t start;
    if (!ws || !ts) {
        fprintf(stderr, "bench_amx_peak: out of memory\n");
        exit(1);
    }
    pthread_barrier_init(&start, NULL, (unsigned)nthreads);
    for (int i = 0; i < nthreads; i++) {
        ws[i] = (worker_t){
            .fn = fn, .seconds = seconds, .pin = ncpu >= nthreads ? cpus[i] : -1, .start = &start};
        if (pthread_create(&ts[i], NULL, worker_main, &ws[i]) != 0) {
            fprintf(stderr, "bench_amx_peak: pthread_create failed\n");
            exit(1);
        }
    }
    double ops = 0, dt = 0, per_cpu = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(ts[i], NULL);
        ops += ws[i].ops;
        dt = ws[i].dt > dt ? ws[i].dt : dt;
        per_cpu += ws[i].cpu > 0 ? ws[i].ops / ws[i].cpu : 0;
    }
    pthread_barrier_destroy(&start);
    free(ws);
    free(ts);
    return (rate_t){ops / dt, per_cpu};
}

/* Best of 3 (the others lose more to whatever else the machine runs). */
static rate_t peak(loop_fn fn, int nthreads, double seconds) {
    rate_t best = {0, 0};
    for (int r = 0; r < 3; r++) {
        rate_t v = run_threads(fn, nthreads, seconds / 3);
        best.wall = v.wall > best.wall ? v.wall : best.wall;
        best.cpu = v.cpu > best.cpu ? v.cpu : best.cpu;
    }
    return best;
}

/* ---- our kernels -------------------------------------------------------- */

static float *rand_vec(size_t n) {
    static uint64_t s = 0x9e3779b97f4a7c15ULL;
    float          *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_amx_peak: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        p[i] = (float)((double)((s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0 - 0.5);
    }
    return p;
}

/* What time_ours multiplies: fp32 weights on npu_matmul (unpacked), or
 * packed by npu_wpack_new (fp32 values), npu_wpack_new_quantised (a 4/8-bit
 * weight's values) or npu_wpack_new_groups (random 4-bit codes with a
 * scale and a min per group of 32: a q4nx package's Q4_1 tiles). */
typedef enum { OURS_F32, OURS_PACKED, OURS_QUANTISED, OURS_GROUPS, OURS_GROUPS_FAST } ours_kind_t;

static npu_wpack_t *ours_pack(ours_kind_t kind, float *w, size_t N, size_t K) {
    npu_wpack_t *wp = NULL;
    svc_err_t    e = SVC_OK;
    if (kind == OURS_PACKED)
        e = npu_wpack_new(w, N, K, &wp);
    else if (kind == OURS_QUANTISED)
        e = npu_wpack_new_quantised(w, N, K, &wp);
    else {
        size_t   G = (K + NPU_GRP_K - 1) / NPU_GRP_K;
        uint8_t *u = malloc(N * K);
        float   *d = malloc(N * G * sizeof *d), *m = malloc(N * G * sizeof *m);
        if (!u || !d || !m) {
            fprintf(stderr, "bench_amx_peak: out of memory (group codes)\n");
            exit(1);
        }
        for (size_t i = 0; i < N * K; i++)
            u[i] = (uint8_t)((w[i] + 0.5f) * 15.99f);
        for (size_t i = 0; i < N * G; i++) {
            d[i] = 1.0f / 15.0f;
            m[i] = -0.5f;
        }
        free(w);
        e = npu_wpack_new_groups(u, d, m, N, K, &wp);
    }
    if (e != SVC_OK) {
        fprintf(stderr, "bench_amx_peak: packing the weight failed\n");
        exit(1);
    }
    return wp;
}

/* FLOP/s of npu_matmul_packed on a pack of `kind` (or npu_matmul on the
 * fp32 weights), best of runs within about `seconds`: per wall second, and
 * per process CPU second times `threads` (the threads that run it: as if
 * each held a core; time a pool thread spends waiting for work counts
 * against the kernel). */
static rate_t time_ours(ours_kind_t kind, size_t T, size_t K, size_t N, int threads,
                        double seconds) {
    float       *x = rand_vec(T * K), *o = rand_vec(T * N), *w = rand_vec(N * K);
    npu_wpack_t *wp = kind == OURS_F32 ? NULL : ours_pack(kind, w, N, K);
    double       flop = 2.0 * (double)T * (double)K * (double)N;
    rate_t       best = {0, 0};
    double       t_end = now_s() + seconds;
    int          runs = 0;
    do {
        double t0 = now_s(), c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
        if (kind == OURS_GROUPS_FAST)
            npu_matmul_packed_fast(x, wp, T, o);
        else if (wp)
            npu_matmul_packed(x, wp, T, o);
        else
            npu_matmul(x, w, T, K, N, o);
        double dt = now_s() - t0, dc = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        best.wall = flop / dt > best.wall ? flop / dt : best.wall;
        if (dc > 0)
            best.cpu = flop * threads / dc > best.cpu ? flop * threads / dc : best.cpu;
        runs++;
    } while (runs < 3 || now_s() < t_end);
    if (wp)
        npu_wpack_free(wp);
    else
        free(w);
    free(x);
    free(o);
    return best;
}

/* ---- output ------------------------------------------------------------- */

typedef struct {
    const char *name;
    const char *unit;
    int         threads;
    rate_t      r; /* ops/s */
} row_t;

typedef struct {
    const char  *name;
    size_t       T;
    int          threads;
    rate_t       r;    /* FLOP/s */
    const row_t *peak; /* the peak it is measured against, or NULL */
    const char  *peak_name;
} ours_t;

#define MAX_ROWS 16

static void usage(FILE *f) {
    fprintf(f, "Usage: bench_amx_peak [--json] [--seconds S] [--threads N] [--no-matmul]\n"
               "Peak AMX int8 (TDPBSSD) and bf16 (TDPBF16PS), AVX-512 VNNI int8 and fp32 FMA\n"
               "throughput on 1 and N threads (default: every allowed CPU), then our matmul\n"
               "kernels at Qwen3.5-2B prefill shapes as a fraction of the matching peak.\n"
               "Each figure twice: per wall second (this run, under the machine's load) and\n"
               "per CPU second (while the threads hold a core; fractions use these).\n"
               "  --seconds S   time per peak measurement (default 1.5)\n"
               "  --threads N   the all-cores thread count (default: the allowed CPUs)\n"
               "  --no-matmul   peaks only\n"
               "D3_NPU_THREADS=N sets the threads of our packed matmul (default: all).\n");
}

static const row_t *find_row(const row_t *rows, int nrows, const char *name, int threads) {
    for (int i = 0; i < nrows; i++)
        if (strcmp(rows[i].name, name) == 0 && rows[i].threads == threads)
            return &rows[i];
    return NULL;
}

static void print_json(const cpu_t *c, int nthreads, const row_t *rows, int nrows,
                       const ours_t *ours, int nours, const char *layout) {
    printf("{\"amx\":%s,\"avx512\":%s,\"vnni\":%s,\"threads\":%d,\"peaks\":[",
           c->amx_usable ? "true" : "false", c->avx512 ? "true" : "false",
           c->vnni ? "true" : "false", nthreads);
    for (int i = 0; i < nrows; i++)
        printf("%s{\"kernel\":\"%s\",\"threads\":%d,\"unit\":\"%s\",\"wall\":%.4f,"
               "\"cpu\":%.4f}",
               i ? "," : "", rows[i].name, rows[i].threads, rows[i].unit, rows[i].r.wall * 1e-12,
               rows[i].r.cpu * 1e-12);
    printf("],\"matmul_layout\":\"%s\",\"ours\":[", layout);
    for (int i = 0; i < nours; i++) {
        printf("%s{\"kernel\":\"%s\",\"T\":%zu,\"K\":2048,\"N\":6144,\"threads\":%d,"
               "\"gflops_wall\":%.2f,\"gflops_cpu\":%.2f,\"peak\":\"%s\"",
               i ? "," : "", ours[i].name, ours[i].T, ours[i].threads, ours[i].r.wall * 1e-9,
               ours[i].r.cpu * 1e-9, ours[i].peak_name);
        if (ours[i].peak)
            printf(",\"fraction\":%.4f", ours[i].r.cpu / ours[i].peak->r.cpu);
        printf("}");
    }
    printf("]}\n");
}

/* How far N threads got beyond one (per wall second: what the run got).
 * Well below N on a machine whose CPUs are separate cores means they were
 * not: SMT siblings, or a host that gave the cores' vector units to
 * someone else for part of the run; every figure of that run shares it. */
static void print_scaling(const row_t *one, const row_t *all) {
    double x = one->r.wall > 0 ? all->r.wall / one->r.wall : 0;
    printf("  %-17s %d threads reach %.2f x 1 thread%s\n", "", all->threads, x,
           x < 0.75 * all->threads ? ": these CPUs shared their vector units in this run" : "");
}

int main(int argc, char **argv) {
    bool   json = false, matmul = true;
    double seconds = 1.5;
    int    cpus[256];
    int    nthreads = allowed_cpus(cpus, 256);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--no-matmul") == 0) {
            matmul = false;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            seconds = strtod(argv[++i], NULL);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            nthreads = (int)strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (nthreads < 1)
        nthreads = 1;
    if (!(seconds > 0))
        seconds = 1.5;

    cpu_t c = cpu_probe();
    if (!c.avx512 && !c.amx_usable) {
        const char *why = c.amx_tile ? "the kernel refused AMX tile data (arch_prctl)"
                                     : "this CPU has neither AMX nor AVX-512";
        if (json)
            printf("{\"skipped\":true,\"reason\":\"%s\"}\n", why);
        else
            printf("bench_amx_peak: skipped: %s\n", why);
        return 0;
    }
    if (!json) {
        printf("bench_amx_peak: amx %s, avx512 %s, vnni %s; %d threads; "
               "per wall second / per CPU second\n",
               c.amx_usable ? "usable" : (c.amx_tile ? "refused by the kernel" : "absent"),
               c.avx512 ? "yes" : "no", c.vnni ? "yes" : "no", nthreads);
        fflush(stdout);
    }

    row_t rows[MAX_ROWS];
    int   nrows = 0;
    int   counts[2] = {1, nthreads};
    int   ncounts = nthreads > 1 ? 2 : 1;
    struct {
        const char *name;
        const char *unit;
        loop_fn     fn;
        bool        ok;
    } kinds[] = {
        {"amx-int8", "TOPS", amx_int8_loop, c.amx_usable && c.amx_int8},
        {"amx-bf16", "TFLOP/s", amx_bf16_loop, c.amx_usable && c.amx_bf16},
        {"avx512-vnni-int8", "TOPS", vnni_loop, c.vnni},
        {"avx512-bf16", "TFLOP/s", bf16_loop, c.bf16},
        {"avx512-fp32", "TFLOP/s", fma_loop, c.avx512},
        {"grp8x2-ceiling", "TFLOP/s", grp_mix_loop, c.vnni},
        {"grp8-ceiling", "TFLOP/s", grp8_mix_loop, c.vnni},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (!kinds[k].ok) {
            if (!json)
                printf("  %-17s skipped (not on this CPU)\n", kinds[k].name);
            continue;
        }
        for (int t = 0; t < ncounts; t++) {
            rate_t v = peak(kinds[k].fn, counts[t], seconds);
            rows[nrows++] = (row_t){kinds[k].name, kinds[k].unit, counts[t], v};
            if (!json) {
                printf("  %-17s %3d thread%s %7.2f / %7.2f %-7s (%.0f G/s per thread per CPU "
                       "second)\n",
                       kinds[k].name, counts[t], counts[t] == 1 ? " " : "s", v.wall * 1e-12,
                       v.cpu * 1e-12, kinds[k].unit, v.cpu * 1e-9 / counts[t]);
                if (t == 1)
                    print_scaling(&rows[nrows - 2], &rows[nrows - 1]);
                fflush(stdout);
            }
        }
    }

    /* Ours: the FFN's gate/up shape (K 2048 -> N 6144) at two prompt sizes. */
    ours_t ours[9];
    int    nours = 0;
    if (matmul) {
        int         pool = (int)npu_threads();
        bool        amx = strncmp(npu_matmul_name(), "amx-", 4) == 0;
        bool        vbf = strncmp(npu_matmul_name(), "avx512-bf16", 11) == 0;
        bool        i8 = strcmp(npu_matmul_quantised_name(), "amx-int8x3") == 0;
        bool        vi8 = strcmp(npu_matmul_quantised_name(), "avx512-int8x3") == 0;
        const char *pk = amx ? "amx-bf16" : vbf ? "avx512-bf16" : "avx512-fp32";
        const char *qk = i8 ? "amx-int8" : "avx512-vnni-int8";
        size_t      Ts[2] = {330, 1024};
        for (int i = 0; i < 2; i++)
            ours[nours++] = (ours_t){"npu_matmul_packed",
                                     Ts[i],
                                     pool,
                                     time_ours(OURS_PACKED, Ts[i], 2048, 6144, pool, 2.0),
                                     find_row(rows, nrows, pk, pool),
                                     pk};
        for (int i = 0; i < 2 && (i8 || vi8); i++)
            ours[nours++] = (ours_t){"packed, q4/q8",
                                     Ts[i],
                                     pool,
                                     time_ours(OURS_QUANTISED, Ts[i], 2048, 6144, pool, 2.0),
                                     find_row(rows, nrows, qk, pool),
                                     qk};
        /* the group codes where they keep them (avx512-grp8x2), against
         * the ceiling of their op mix */
        bool grp = strcmp(npu_matmul_groups_name(), "avx512-grp8x2") == 0;
        for (int i = 0; i < 2 && grp; i++)
            ours[nours++] = (ours_t){"packed, groups",
                                     Ts[i],
                                     pool,
                                     time_ours(OURS_GROUPS, Ts[i], 2048, 6144, pool, 2.0),
                                     find_row(rows, nrows, "grp8x2-ceiling", pool),
                                     "grp8x2-ceiling"};
        /* the same codes under the fast profile (avx512-grp8), against
         * the ceiling of its op mix */
        bool g8 = strcmp(npu_matmul_fast_name(), "avx512-grp8") == 0;
        for (int i = 0; i < 2 && g8; i++)
            ours[nours++] = (ours_t){"groups, fast",
                                     Ts[i],
                                     pool,
                                     time_ours(OURS_GROUPS_FAST, Ts[i], 2048, 6144, pool, 2.0),
                                     find_row(rows, nrows, "grp8-ceiling", pool),
                                     "grp8-ceiling"};
        ours[nours++] = (ours_t){"npu_matmul",
                                 330,
                                 1,
                                 time_ours(OURS_F32, 330, 2048, 6144, 1, 2.0),
                                 find_row(rows, nrows, "avx512-fp32", 1),
                                 "avx512-fp32"};
        if (!json) {
            printf("  our kernels (T x 2048 -> 6144; packed layout %s, weights bf16 would round "
                   "%s):\n",
                   npu_matmul_name(), npu_matmul_quantised_name());
            for (int i = 0; i < nours; i++) {
                printf("  %-17s T=%-4zu %2d thread%s %7.1f / %7.1f GFLOP/s", ours[i].name,
                       ours[i].T, ours[i].threads, ours[i].threads == 1 ? " " : "s",
                       ours[i].r.wall * 1e-9, ours[i].r.cpu * 1e-9);
                /* the bf16x2 layouts run two products per product and the
                 * int8x3 ones three where one would do (npu.h): the units
                 * are that much busier than the FLOPs say. */
                const char *pn = ours[i].peak_name;
                bool        x2 = strcmp(npu_matmul_name(), "amx-bf16x2") == 0 ||
                          strcmp(npu_matmul_name(), "avx512-bf16x2") == 0;
                double busy =
                    strcmp(pn, "amx-int8") == 0 || strcmp(pn, "avx512-vnni-int8") == 0      ? 3
                    : (strcmp(pn, "amx-bf16") == 0 || strcmp(pn, "avx512-bf16") == 0) && x2 ? 2
                                                                                            : 1;
                if (ours[i].peak && busy > 1)
                    printf("  %5.1f%% of the %s peak (%.1f%% in products)\n",
                           100 * ours[i].r.cpu / ours[i].peak->r.cpu, ours[i].peak_name,
                           100 * busy * ours[i].r.cpu / ours[i].peak->r.cpu);
                else if (ours[i].peak)
                    printf("  %5.1f%% of the %s peak\n", 100 * ours[i].r.cpu / ours[i].peak->r.cpu,
                           ours[i].peak_name);
                else
                    printf("  (no %s peak at %d threads measured)\n", ours[i].peak_name,
                           ours[i].threads);
            }
        }
    }
    if (json)
        print_json(&c, nthreads, rows, nrows, ours, nours, matmul ? npu_matmul_name() : "");
    return 0;
}
