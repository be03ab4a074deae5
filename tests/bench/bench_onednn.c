/*
 * bench_onednn.c -- our projection matmuls beside oneDNN's (libdnnl, the
 * Debian build: JIT brgemm on AMX and AVX-512, OpenMP over every core) at
 * d3-nano's shapes, in one process, runs alternating, so that a busy VM
 * slows both alike. Built, never run by ctest.
 *
 *   bench_onednn [T ...]   token counts (default 330 1024 4096)
 *
 * Each pair does the same number of products, and oneDNN gets its best
 * case: activations already converted to bf16 (or int8), weights reordered
 * once into the layout it picks, the conversion never timed.
 *  - amx-bf16     vs oneDNN bf16 x bf16 -> f32 (one product)
 *  - amx-bf16x2   vs two oneDNN bf16 calls (hi, then lo with a sum post-op)
 *  - amx-int8x3   vs three oneDNN s8 x s8 -> s32 products (its time x 3;
 *                 our int8x3 also quantises and rescales, theirs does not)
 *  - onednn-f32   (npu_matmul_dnnl: oneDNN's sgemm, one thread per item of
 *                 our pool) vs oneDNN's f32 matmul primitive on OpenMP
 *  - avx512-f32   (our fp32 panels, D3_NPU_MATMUL=panels) on the same line
 * GFLOP/s = 2 T K N / median of RUNS seconds; "x" = ours / theirs speed.
 * The numbers that chose the default of each layout (npu_dnnl.c, npu.h).
 */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "npu.h"

#define RUNS 7

#define CK(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) {                                                                  \
            fprintf(stderr, "bench_onednn: %s: status %d\n", #call, (int)s_);                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_onednn: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- oneDNN matmuls ------------------------------------------------------ */

static dnnl_engine_t g_eng;
static dnnl_stream_t g_st;

/* A oneDNN matmul (T, K) x (K, N) -> (T, N), src of type st, weights of
 * type st reordered from w (N, K) row-major (in that type) into the
 * layout it picks, dst f32 (s32 for integers); sum: dst += instead of =. */
typedef struct dmm {
    dnnl_primitive_t prim;
    dnnl_memory_t    src, wei, dst;
} dmm_t;

static dmm_t dmm_new(dnnl_data_type_t st, const void *w, void *src, void *dst, size_t T, size_t K,
                     size_t N, bool sum) {
    dmm_t       m;
    dnnl_dims_t sd = {(dnnl_dim_t)T, (dnnl_dim_t)K}, wd = {(dnnl_dim_t)K, (dnnl_dim_t)N},
                dd = {(dnnl_dim_t)T, (dnnl_dim_t)N};
    dnnl_memory_desc_t smd, wany, wplain, dmd;
    CK(dnnl_memory_desc_init_by_tag(&smd, 2, sd, st, dnnl_ab));
    CK(dnnl_memory_desc_init_by_tag(&wany, 2, wd, st, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&wplain, 2, wd, st, dnnl_ba));
    CK(dnnl_memory_desc_init_by_tag(&dmd, 2, dd, st == dnnl_s8 ? dnnl_s32 : dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t    md;
    dnnl_primitive_attr_t at;
    dnnl_post_ops_t       po;
    dnnl_primitive_desc_t pd;
    CK(dnnl_matmul_desc_init(&md, &smd, &wany, NULL, &dmd));
    CK(dnnl_primitive_attr_create(&at));
    CK(dnnl_post_ops_create(&po));
    if (sum)
        CK(dnnl_post_ops_append_sum(po, 1.0f));
    CK(dnnl_primitive_attr_set_post_ops(at, po));
    CK(dnnl_primitive_desc_create(&pd, &md, at, g_eng, NULL));
    const dnnl_memory_desc_t *wq = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_t             wp;
    dnnl_primitive_desc_t     rpd;
    dnnl_primitive_t          rp;
    CK(dnnl_memory_create(&wp, &wplain, g_eng, (void *)w));
    CK(dnnl_memory_create(&m.wei, wq, g_eng, DNNL_MEMORY_ALLOCATE));
    CK(dnnl_reorder_primitive_desc_create(&rpd, &wplain, g_eng, wq, g_eng, NULL));
    CK(dnnl_primitive_create(&rp, rpd));
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, wp}, {DNNL_ARG_TO, m.wei}};
    CK(dnnl_primitive_execute(rp, g_st, 2, ra));
    CK(dnnl_stream_wait(g_st));
    CK(dnnl_primitive_create(&m.prim, pd));
    CK(dnnl_memory_create(&m.src, &smd, g_eng, src));
    CK(dnnl_memory_create(&m.dst, &dmd, g_eng, dst));
    dnnl_primitive_destroy(rp), dnnl_primitive_desc_destroy(rpd), dnnl_memory_destroy(wp);
    dnnl_primitive_desc_destroy(pd), dnnl_post_ops_destroy(po), dnnl_primitive_attr_destroy(at);
    return m;
}

static void dmm_run(const dmm_t *m) {
    dnnl_exec_arg_t a[3] = {
        {DNNL_ARG_SRC, m->src}, {DNNL_ARG_WEIGHTS, m->wei}, {DNNL_ARG_DST, m->dst}};
    CK(dnnl_primitive_execute(m->prim, g_st, 3, a));
    CK(dnnl_stream_wait(g_st));
}

static void dmm_free(dmm_t *m) {
    dnnl_primitive_destroy(m->prim);
    dnnl_memory_destroy(m->src), dnnl_memory_destroy(m->wei), dnnl_memory_destroy(m->dst);
}

/* ---- one shape ----------------------------------------------------------- */

enum { OURS_BF16, OURS_X2, OURS_I8, OURS_DNNL, OURS_PANELS, DN_BF16, DN_X2, DN_S8, DN_F32, N_FN };

typedef struct shape {
    size_t          T, K, N;
    const float    *x, *w;
    float          *out, *dout;
    const uint16_t *pk;
    const void     *pi;
    const float    *pan;
    dmm_t           bf, bf_lo, s8, f32;
    bool            amx;
} shape_t;

static void run_fn(const shape_t *s, int fn) {
    switch (fn) {
    case OURS_BF16:
        npu_matmul_amx(s->x, s->pk, s->T, s->K, s->N, false, s->out);
        break;
    case OURS_X2:
        npu_matmul_amx(s->x, s->pk, s->T, s->K, s->N, true, s->out);
        break;
    case OURS_I8:
        npu_matmul_amx_i8(s->x, s->pi, s->T, s->K, s->N, s->out);
        break;
    case OURS_DNNL:
        npu_matmul_dnnl(s->x, s->w, s->T, s->K, s->N, s->out);
        break;
    case OURS_PANELS:
        npu_matmul_panels_avx512(s->x, s->pan, s->T, s->K, s->N, s->out);
        break;
    case DN_BF16:
        dmm_run(&s->bf);
        break;
    case DN_X2:
        dmm_run(&s->bf);
        dmm_run(&s->bf_lo);
        break;
    case DN_S8:
        dmm_run(&s->s8);
        break;
    case DN_F32:
        dmm_run(&s->f32);
        break;
    }
}

static bool fn_on(const shape_t *s, int fn) {
    bool amx_fn = fn == OURS_BF16 || fn == OURS_X2 || fn == OURS_I8 || fn == DN_BF16 ||
                  fn == DN_X2 || fn == DN_S8;
    return s->amx || !amx_fn;
}

static void bench_shape(size_t T, size_t K, size_t N, const char *what, bool amx) {
    shape_t s = {.T = T, .K = K, .N = N, .amx = amx};
    float  *x = bench_rand_vec(T * K), *w = bench_rand_vec(N * K);
    s.x = x, s.w = w, s.out = xmalloc(T * N * sizeof(float)), s.dout = xmalloc(T * N * 4);
    uint16_t *pk = NULL, *xb = xmalloc(T * K * 2), *xl = xmalloc(T * K * 2);
    uint16_t *wb = xmalloc(N * K * 2);
    int8_t   *x8 = xmalloc(T * K), *w8 = xmalloc(N * K);
    void     *pi = NULL;
    for (size_t i = 0; i < N * K; i++) {
        wb[i] = npu_f32_to_bf16(w[i]);
        w8[i] = (int8_t)(w[i] * 254);
    }
    for (size_t i = 0; i < T * K; i++) {
        xb[i] = npu_f32_to_bf16(x[i]);
        xl[i] = npu_f32_to_bf16(x[i] - npu_bf16_to_f32(xb[i]));
        x8[i] = (int8_t)(x[i] * 254);
    }
    if (amx) {
        pk = xmalloc(npu_amx_pack_elems(N, K) * 2);
        npu_amx_pack_bf16(w, N, K, pk);
        pi = xmalloc(npu_amx_i8_pack_bytes(N, K));
        npu_amx_i8_pack(w, N, K, pi);
        s.bf = dmm_new(dnnl_bf16, wb, xb, s.dout, T, K, N, false);
        s.bf_lo = dmm_new(dnnl_bf16, wb, xl, s.dout, T, K, N, true);
        s.s8 = dmm_new(dnnl_s8, w8, x8, s.dout, T, K, N, false);
    }
    s.f32 = dmm_new(dnnl_f32, w, x, s.dout, T, K, N, false);
    s.pk = pk, s.pi = pi;
    size_t np = (N + 31) / 32 * 32;
    float *pan = xmalloc(np * K * sizeof *pan);
    memset(pan, 0, np * K * sizeof *pan);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++)
            pan[(n / 32 * K + k) * 32 + n % 32] = w[n * K + k];
    s.pan = pan;

    double t[N_FN][RUNS], med[N_FN] = {0};
    for (int fn = 0; fn < N_FN; fn++)
        if (fn_on(&s, fn))
            run_fn(&s, fn); /* warm-up: JIT, pages */
    for (int r = 0; r < RUNS; r++)
        for (int fn = 0; fn < N_FN; fn++)
            if (fn_on(&s, fn)) {
                double t0 = now_s();
                run_fn(&s, fn);
                t[fn][r] = now_s() - t0;
            }
    for (int fn = 0; fn < N_FN; fn++)
        if (fn_on(&s, fn)) {
            qsort(t[fn], RUNS, sizeof t[fn][0], bench_cmp_double);
            med[fn] = t[fn][RUNS / 2];
        }
    double g = 2.0 * (double)T * (double)K * (double)N * 1e-9;
#define GF(fn) (med[fn] > 0 ? g / med[fn] : 0.0)
    printf("%-9s T=%-5zu K=%-5zu N=%-5zu", what, T, K, N);
    if (amx)
        printf("  bf16 %6.1f/%6.1f %4.2fx  bf16x2 %6.1f/%6.1f %4.2fx  int8x3 %6.1f/%6.1f %4.2fx",
               GF(OURS_BF16), GF(DN_BF16), med[DN_BF16] / med[OURS_BF16], GF(OURS_X2), GF(DN_X2),
               med[DN_X2] / med[OURS_X2], GF(OURS_I8), GF(DN_S8) / 3,
               3 * med[DN_S8] / med[OURS_I8]);
    printf("  f32 %6.1f/%6.1f %4.2fx  (panels %6.1f)\n", GF(OURS_DNNL), GF(DN_F32),
           med[DN_F32] / med[OURS_DNNL], GF(OURS_PANELS));
    fflush(stdout);
    if (amx) {
        dmm_free(&s.bf), dmm_free(&s.bf_lo), dmm_free(&s.s8);
        free(pk), free(pi);
    }
    dmm_free(&s.f32);
    free(pan), free(x), free(w), free(s.out), free(s.dout), free(xb), free(xl), free(wb);
    free(x8), free(w8);
}

int main(int argc, char **argv) {
    size_t Ts[16], n_t = 0;
    char  *end = NULL;
    for (int i = 1; i < argc; i++) {
        unsigned long v = strtoul(argv[i], &end, 10);
        if (n_t < 16 && v > 0 && !*end)
            Ts[n_t++] = (size_t)v;
        else {
            fprintf(stderr, "usage: bench_onednn [T ...]\n");
            return 2;
        }
    }
    if (n_t == 0) {
        Ts[0] = 330, Ts[1] = 1024, Ts[2] = 4096;
        n_t = 3;
    }
    const npu_features_t *f = npu_probe();
    if (!f->avx512f) {
        fprintf(stderr, "bench_onednn: no AVX-512 on this CPU (our panels need it)\n");
        return 0;
    }
    bool amx = f->amx_bf16 && f->amx_int8 && f->amx_usable && f->avx512_bf16;
    CK(dnnl_engine_create(&g_eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&g_st, g_eng, dnnl_stream_default_flags));
    printf("ours/oneDNN GFLOP/s (useful: 2 T K N), and ours / theirs speed; %zu threads;%s\n",
           npu_threads(), amx ? "" : " no usable AMX: fp32 only");
    for (size_t i = 0; i < n_t; i++) {
        bench_shape(Ts[i], 2048, 6144, "mlp_up", amx);
        bench_shape(Ts[i], 6144, 2048, "mlp_down", amx);
        bench_shape(Ts[i], 2048, 2048, "out_proj", amx);
        bench_shape(Ts[i], 2048, 8192, "q_proj", amx);
    }
    dnnl_stream_destroy(g_st);
    dnnl_engine_destroy(g_eng);
    return 0;
}
