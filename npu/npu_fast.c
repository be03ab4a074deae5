/*
 * npu_fast.c -- the fast kernels' entry points (npu.h, "Fast kernels"):
 * one table of function pointers, filled once per process with the
 * AVX-512 kernels (npu_avx512.c) or the references (npu_ref.c,
 * npu_ref_delta.c), and calls through it; and the packed weights of
 * npu_matmul_packed, whose layout follows that choice.
 */
#include "npu.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct npu_kernels {
    const char *name;
    void (*matmul)(const float *x, const float *w, size_t T, size_t K, size_t N, float *out);
    svc_err_t (*attention)(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                           size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                           const uint8_t *key_mask, float *out, float *lse);
    svc_err_t (*delta_rule)(const float *q, const float *k, const float *v, const float *g,
                            const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                            size_t dk, size_t dv, const float *state_in, float *state_out,
                            float *out);
    void (*conv1d_causal_silu)(const float *x, const float *w, size_t T, size_t C, size_t K,
                               const float *state_in, float *state_out, const npu_conv_split_t *sp);
    void (*rmsnorm)(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                    bool one_plus_w);
    void (*rmsnorm_gated)(const float *x, const float *z, const float *w, size_t T, size_t D,
                          float eps, float *out);
    void (*l2norm)(const float *x, size_t T, size_t D, float eps, float *out);
    void (*silu_mul)(const float *gate, const float *up, size_t T, size_t F, float *out);
    void (*sigmoid_mul)(const float *gate, float *x, size_t n);
} npu_kernels_t;

/* The reference kernels but attention and the delta rule (the kernel
 * tables below). */
#define REF_KERNELS_REST                                                                           \
    .matmul = npu_matmul_ref, .conv1d_causal_silu = npu_conv1d_causal_silu_split_ref,              \
    .rmsnorm = npu_rmsnorm_ref, .rmsnorm_gated = npu_rmsnorm_gated_ref, .l2norm = npu_l2norm_ref,  \
    .silu_mul = npu_silu_mul_ref, .sigmoid_mul = npu_sigmoid_mul_ref

static const npu_kernels_t k_ref = {
    .name = "ref",
    .attention = npu_attention_ref,
    .delta_rule = npu_delta_rule_chunked_ref,
    REF_KERNELS_REST,
};

/* A CPU without AVX-512 (or D3_NPU_KERNELS=generic): the references,
 * but attention and the delta rule on oneDNN's sgemm (npu_dnnl.c), as the
 * packed matmul. */
static const npu_kernels_t k_generic = {
    .name = "generic",
    .attention = npu_attention_dnnl,
    .delta_rule = npu_delta_rule_dnnl,
    REF_KERNELS_REST,
};

/* head_dim <= 32: the small-head kernel (a few vectors per head, two
 * passes); wider heads: the tiled kernel (npu_attn_fast.c) on AMX when
 * npu_attention_amx_usable(), else in fp32. BF16X3, not BF16: it keeps
 * the fast kernels' 1e-4 contract (npu.h) at about half BF16's speed;
 * BF16 alone is ~6e-3. */
static svc_err_t attention_avx512(const float *q, const float *k, const float *v, size_t Tq,
                                  size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                  bool causal, const uint8_t *key_mask, float *out, float *lse) {
    if (head_dim <= 32)
        return npu_attention_small_avx512(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal,
                                          key_mask, out, lse);
    return npu_attention_tiled_mode(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal,
                                    key_mask, out, lse,
                                    npu_amx_enabled() ? NPU_ATTN_BF16X3 : NPU_ATTN_FP32);
}

static const npu_kernels_t k_avx512 = {
    .name = "avx512",
    .matmul = npu_matmul_avx512,
    .attention = attention_avx512,
    .delta_rule = npu_delta_rule_pick_avx512,
    .conv1d_causal_silu = npu_conv1d_causal_silu_split_avx512,
    .rmsnorm = npu_rmsnorm_avx512,
    .rmsnorm_gated = npu_rmsnorm_gated_avx512,
    .l2norm = npu_l2norm_avx512,
    .silu_mul = npu_silu_mul_avx512,
    .sigmoid_mul = npu_sigmoid_mul_avx512,
};

static const npu_kernels_t *g_kernels;
static pthread_once_t       g_kernels_once = PTHREAD_ONCE_INIT;

/* D3_NPU_KERNELS=ref wins; otherwise AVX-512 F+BW+VL (the target of
 * npu_avx512.c, whose code may use all three) or nothing. */
static void kernels_pick(void) {
    const char           *env = getenv("D3_NPU_KERNELS");
    const npu_features_t *f = npu_probe();
    /* "generic": what a CPU without AVX-512 runs, here too. */
    if (env && strcmp(env, "ref") == 0)
        g_kernels = &k_ref;
    else if (env && strcmp(env, "generic") == 0)
        g_kernels = &k_generic;
    else if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma)
        g_kernels = &k_avx512;
    else
        g_kernels = &k_generic;
    /* Where oneDNN may not run (npu_dnnl_refusal), the generic kernels'
     * attention and delta rule would answer nothing: the references do. */
    if (g_kernels == &k_generic && npu_dnnl_refusal())
        g_kernels = &k_ref;
}

static const npu_kernels_t *kernels(void) {
    pthread_once(&g_kernels_once, kernels_pick);
    return g_kernels;
}

const char *npu_kernels_name(void) {
    return kernels()->name;
}

void npu_matmul(const float *x, const float *w, size_t T, size_t K, size_t N, float *out) {
    kernels()->matmul(x, w, T, K, N, out);
}

svc_err_t npu_attention(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                        size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                        const uint8_t *key_mask, float *out) {
    return kernels()->attention(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal, key_mask,
                                out, NULL);
}

svc_err_t npu_attention_fast(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                             size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                             const uint8_t *key_mask, float *out) {
    /* the AVX-512 kernels only: D3_NPU_KERNELS=ref keeps every profile on
     * the references */
    if (kernels() == &k_avx512 && head_dim > 32 && npu_fast_usable() &&
        (npu_attention_amx_usable() || npu_attention_bf16_usable()))
        return npu_attention_tiled_mode(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal,
                                        key_mask, out, NULL, NPU_ATTN_BF16);
    return npu_attention(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, causal, key_mask, out);
}

svc_err_t npu_attention_lse(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                            size_t n_heads, size_t n_kv_heads, size_t head_dim,
                            const uint8_t *key_mask, float *out, float *lse) {
    if (Tk == 0) { /* no key: every query sees none (the kernels want keys) */
        memset(out, 0, Tq * n_heads * head_dim * sizeof *out);
        for (size_t r = 0; r < Tq * n_heads; r++)
            lse[r] = -INFINITY;
        return SVC_OK;
    }
    return kernels()->attention(q, k, v, Tq, Tk, n_heads, n_kv_heads, head_dim, false, key_mask,
                                out, lse);
}

svc_err_t npu_delta_rule(const float *q, const float *k, const float *v, const float *g,
                         const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads, size_t dk,
                         size_t dv, const float *state_in, float *state_out, float *out) {
    return kernels()->delta_rule(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state_in,
                                 state_out, out);
}

svc_err_t npu_delta_rule_fast(const float *q, const float *k, const float *v, const float *g,
                              const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                              size_t dk, size_t dv, const float *state_in, float *state_out,
                              float *out) {
    /* the AVX-512 kernels only, as npu_attention_fast */
    if (kernels() == &k_avx512 && npu_fast_usable() && npu_delta_bf16_usable(T, dk, dv))
        return npu_delta_rule_bf16_avx512(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv,
                                          state_in, state_out, out);
    return npu_delta_rule(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state_in, state_out,
                          out);
}

void npu_conv1d_causal_silu(const float *x, const float *w, size_t T, size_t C, size_t K,
                            const float *state_in, float *state_out, float *out) {
    npu_conv_split_t sp = npu_conv_whole(C, out);
    kernels()->conv1d_causal_silu(x, w, T, C, K, state_in, state_out, &sp);
}

void npu_conv1d_causal_silu_split(const float *x, const float *w, size_t T, size_t C, size_t K,
                                  const float *state_in, float *state_out,
                                  const npu_conv_split_t *sp) {
    kernels()->conv1d_causal_silu(x, w, T, C, K, state_in, state_out, sp);
}

/* ---- row-wise kernels on the pool ---------------------------------------
 * The norms and the gated products touch each row (or element) alone, so
 * rows split over npu_parallel_for give the same bits as one call. Why:
 * run on the calling thread they were ~5% of a nano pass's CPU time with
 * the pool idle meanwhile, ~10% of its wall time on 2 threads (perf, Zen 5)
 * and a hard limit on 16. */

typedef enum rows_op {
    ROWS_RMS,
    ROWS_RMS_GATED,
    ROWS_L2,
    ROWS_SILU_MUL,
    ROWS_SIGMOID_MUL,
    ROWS_ADD
} rows_op_t;

typedef struct rows_job {
    rows_op_t    op;
    const float *x, *z, *w; /* z: the gate (gated norm, silu_mul's gate) */
    float       *out;
    size_t       T, D, per; /* per: rows per item */
    float        eps;
    bool         one_plus_w;
} rows_job_t;

#define ROWS_ITEM_FLOATS 32768 /* at least this much of a row block per item */

static void add_block(float *restrict x, const float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void rows_item(void *ctx, size_t i) {
    const rows_job_t    *j = ctx;
    const npu_kernels_t *k = kernels();
    size_t               t0 = i * j->per, n = j->T - t0 < j->per ? j->T - t0 : j->per;
    size_t               o = t0 * j->D;
    switch (j->op) {
    case ROWS_RMS:
        k->rmsnorm(j->x + o, j->w, n, j->D, j->eps, j->out + o, j->one_plus_w);
        break;
    case ROWS_RMS_GATED:
        k->rmsnorm_gated(j->x + o, j->z + o, j->w, n, j->D, j->eps, j->out + o);
        break;
    case ROWS_L2:
        k->l2norm(j->x + o, n, j->D, j->eps, j->out + o);
        break;
    case ROWS_SILU_MUL:
        k->silu_mul(j->z + o, j->x + o, n, j->D, j->out + o);
        break;
    case ROWS_SIGMOID_MUL:
        k->sigmoid_mul(j->z + o, j->out + o, n * j->D);
        break;
    case ROWS_ADD:
        add_block(j->out + o, j->x + o, n * j->D);
        break;
    }
}

/* Items of whole rows, ROWS_ITEM_FLOATS or more each; one item (the
 * caller's thread alone) when that is all there is. */
static void rows_run(rows_job_t *j) {
    if (j->T == 0)
        return;
    size_t per = ROWS_ITEM_FLOATS / j->D;
    j->per = per ? per : 1;
    size_t n = (j->T + j->per - 1) / j->per;
    if (n < 2 || npu_threads() < 2) {
        j->per = j->T;
        rows_item(j, 0);
        return;
    }
    npu_parallel_for(n, rows_item, j);
}

void npu_rmsnorm(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                 bool one_plus_w) {
    rows_run(&(rows_job_t){.op = ROWS_RMS,
                           .x = x,
                           .w = w,
                           .out = out,
                           .T = T,
                           .D = D,
                           .eps = eps,
                           .one_plus_w = one_plus_w});
}

void npu_rmsnorm_gated(const float *x, const float *z, const float *w, size_t T, size_t D,
                       float eps, float *out) {
    rows_run(&(rows_job_t){
        .op = ROWS_RMS_GATED, .x = x, .z = z, .w = w, .out = out, .T = T, .D = D, .eps = eps});
}

void npu_l2norm(const float *x, size_t T, size_t D, float eps, float *out) {
    rows_run(&(rows_job_t){.op = ROWS_L2, .x = x, .out = out, .T = T, .D = D, .eps = eps});
}

void npu_silu_mul(const float *gate, const float *up, size_t T, size_t F, float *out) {
    rows_run(&(rows_job_t){.op = ROWS_SILU_MUL, .x = up, .z = gate, .out = out, .T = T, .D = F});
}

/* Blocks of 16 values stand for rows here: every kernel takes 16 at a
 * time from the start, so a split at a multiple of 16 changes nothing. */
void npu_sigmoid_mul(const float *gate, float *x, size_t n) {
    if (n % 16) {
        kernels()->sigmoid_mul(gate, x, n);
        return;
    }
    rows_run(&(rows_job_t){.op = ROWS_SIGMOID_MUL, .z = gate, .out = x, .T = n / 16, .D = 16});
}

/* As npu_sigmoid_mul: blocks of 16 values stand for rows. */
void npu_add(float *x, const float *y, size_t n) {
    if (n % 16) {
        add_block(x, y, n);
        return;
    }
    rows_run(&(rows_job_t){.op = ROWS_ADD, .x = y, .out = x, .T = n / 16, .D = 16});
}

/* ---- packed weights ------------------------------------------------------- */

typedef enum wpack_layout {
    WPACK_PLAIN = 0,    /* w as given, the reference matmul */
    WPACK_PANELS = 1,   /* fp32 K-major panels, npu_matmul_panels_avx512 */
    WPACK_AMX = 2,      /* bf16 tiles, npu_matmul_amx_bf16 */
    WPACK_AMX_I8 = 3,   /* int8 tiles + column scales, npu_matmul_amx_i8 (quantised packs) */
    WPACK_VNNI_I8 = 4,  /* the same bytes, npu_matmul_vnni_i8 (quantised packs, no AMX) */
    WPACK_DNNL = 5,     /* w as given, oneDNN's sgemm over the pool, npu_matmul_dnnl */
    WPACK_BF16 = 6,     /* the bf16 tiles' bytes, npu_matmul_bf16_avx512 (no AMX) */
    WPACK_VNNI_GRP = 7, /* a package's group codes, npu_matmul_vnni_grp (no AMX) */
} wpack_layout_t;

struct npu_wpack {
    size_t         N, K;
    wpack_layout_t layout;
    void          *data;
    size_t         bytes;
    /* the fast profile's companion (npu_matmul_packed_fast): the weight as
     * group codes, or NULL where this pack's own codes serve (a
     * WPACK_VNNI_GRP pack) or the fast kernels are not usable; owned */
    struct npu_wpack *fast;
};

static wpack_layout_t g_layout;
static bool           g_split;  /* AMX: activations as bf16 hi + lo (two products) */
static bool           g_i8;     /* quantised packs on AMX-INT8 (npu_wpack_new_quantised) */
static bool           g_i8_all; /* every pack on AMX-INT8 (D3_NPU_MATMUL=int8x3) */
static bool           g_vnni;   /* quantised packs on AVX-512 VNNI (no AMX) */
static bool           g_grp;    /* group-coded packs on their codes (VNNI, no AMX) */
static bool           g_grp8;   /* ... with one byte per activation (D3_NPU_MATMUL=grp8) */
static pthread_once_t g_layout_once = PTHREAD_ONCE_INIT;

/* AMX-BF16 where the CPU has it and the process may use the tiles, unless
 * D3_NPU_KERNELS asks for the fp32 kernels ("avx512"), the kernels of a
 * CPU without AMX ("avx512-vnni", "avx512-bf16") or the references.
 * D3_NPU_MATMUL=bf16 rounds the activations to one bf16 (one tile product,
 * twice as fast); the default splits them into two (npu.h: why). Without
 * the tiles, the same bf16 pack on VDPBF16PS where the CPU has AVX512-BF16
 * (npu_avx512_bf16.c: why), unless D3_NPU_MATMUL=onednn; else fp32
 * weights on oneDNN's sgemm (npu_dnnl.c: why), on any CPU;
 * D3_NPU_KERNELS=ref keeps the scalar reference and D3_NPU_MATMUL=panels
 * our AVX-512 fp32 panels (the benchmarks' switch). */
static void layout_pick(void) {
    const char           *env = getenv("D3_NPU_KERNELS"), *mm = getenv("D3_NPU_MATMUL");
    const npu_features_t *f = npu_probe();
    bool                  fp32 = env && strcmp(env, "avx512") == 0;
    bool no_amx = env && (strcmp(env, "avx512-vnni") == 0 || strcmp(env, "avx512-bf16") == 0);
    bool bf16_env = mm && strncmp(mm, "bf16", 4) == 0;
    bool panels = mm && strcmp(mm, "panels") == 0;
    bool onednn = mm && strcmp(mm, "onednn") == 0;
    bool int8x3 = mm && strcmp(mm, "int8x3") == 0;
    if (kernels() != &k_avx512)
        g_layout = kernels() == &k_ref ? WPACK_PLAIN : WPACK_DNNL;
    else if (!fp32 && !no_amx && f->amx_bf16 && f->amx_usable && f->avx512_bf16)
        g_layout = WPACK_AMX;
    else if (!fp32 && !panels && !onednn && f->avx512_bf16)
        g_layout = WPACK_BF16;
    else
        g_layout = panels ? WPACK_PANELS : WPACK_DNNL;
    /* oneDNN refused (npu_dnnl_refusal): our fp32 panels where AVX-512 is,
     * rather than its every item falling back to the scalar reference. */
    if (g_layout == WPACK_DNNL && npu_dnnl_refusal())
        g_layout = kernels() == &k_avx512 ? WPACK_PANELS : WPACK_PLAIN;
    g_split = !(mm && strcmp(mm, "bf16") == 0);
    /* D3_NPU_MATMUL=bf16x2 or bf16 keeps quantised packs on the bf16 tiles
     * too (the accuracy comparisons' and the benchmarks' switch). */
    g_i8 = g_layout == WPACK_AMX && f->amx_int8 && !bf16_env;
    /* No AMX: quantised packs on VNNI (half the bytes of fp32: what keeps
     * the nano q4nx package in its memory bound), unless fp32 everywhere
     * was asked for (the accuracy reference) or D3_NPU_MATMUL keeps them
     * off int8. */
    g_vnni = (g_layout == WPACK_PANELS || g_layout == WPACK_DNNL || g_layout == WPACK_BF16) &&
             kernels() == &k_avx512 && !fp32 && f->avx512_vnni && !bf16_env;
    /* D3_NPU_MATMUL=int8x3 puts every weight there, BF16 and F32 ones too
     * (npu.h: what that costs in accuracy). */
    g_i8_all = g_i8 && int8x3;
    /* Weights given as group codes keep them where int8 runs on VNNI
     * (npu_vnni_grp.c: why not on AMX); D3_NPU_MATMUL=int8x3 sends them
     * to int8x3 like any quantised weight (the comparisons' switch). */
    g_grp = g_vnni && !int8x3;
    /* D3_NPU_MATMUL=grp8: the same codes times activations of one byte
     * per value (llama.cpp's Q8 activations; npu.h: what it costs) */
    g_grp8 = g_grp && mm && strcmp(mm, "grp8") == 0;
}

static wpack_layout_t layout(void) {
    pthread_once(&g_layout_once, layout_pick);
    return g_layout;
}

/* The one AMX decision, made once with the layout: every tile kernel
 * follows it, so D3_NPU_KERNELS=avx512 means fp32 everywhere. */
bool npu_amx_enabled(void) {
    return layout() == WPACK_AMX;
}

const char *npu_matmul_name(void) {
    static const char *names[] = {"ref-f32", "avx512-f32", "amx-bf16",   "",
                                  "",        "onednn-f32", "avx512-bf16"};
    if (layout() == WPACK_AMX && g_i8_all)
        return "amx-int8x3";
    if (layout() == WPACK_AMX && g_split)
        return "amx-bf16x2";
    return layout() == WPACK_BF16 && g_split ? "avx512-bf16x2" : names[layout()];
}

const char *npu_matmul_quantised_name(void) {
    /* layout() first: it sets g_vnni, which only a non-AMX layout takes. */
    if (layout() != WPACK_AMX && g_vnni)
        return "avx512-int8x3";
    return layout() == WPACK_AMX && g_i8 ? "amx-int8x3" : npu_matmul_name();
}

const char *npu_matmul_groups_name(void) {
    if (layout() != WPACK_AMX && g_grp)
        return g_grp8 ? "avx512-grp8" : "avx512-grp8x2";
    return npu_matmul_quantised_name();
}

/* panels[p][k][c] = w[p * NR + c][k], 0 past N. */
static void wpack_panels(const float *w, size_t N, size_t K, float *panels) {
    size_t n_pan = (N + NPU_WPACK_NR - 1) / NPU_WPACK_NR;
    for (size_t p = 0; p < n_pan; p++) {
        float *pan = panels + p * K * NPU_WPACK_NR;
        size_t nc = N - p * NPU_WPACK_NR < NPU_WPACK_NR ? N - p * NPU_WPACK_NR : NPU_WPACK_NR;
        if (nc < NPU_WPACK_NR)
            memset(pan, 0, K * NPU_WPACK_NR * sizeof *pan);
        /* Row by row of w: reads stream, writes stride by NR floats. */
        for (size_t c = 0; c < nc; c++) {
            const float *wr = w + (p * NPU_WPACK_NR + c) * K;
            for (size_t k = 0; k < K; k++)
                pan[k * NPU_WPACK_NR + c] = wr[k];
        }
    }
}

/* Bytes of the packed copy in layout l (a multiple of 64, as aligned_alloc
 * wants; at least 64 when N or K is 0). */
static size_t wpack_size(wpack_layout_t l, size_t N, size_t K) {
    size_t b = l == WPACK_AMX_I8 || l == WPACK_VNNI_I8 ? npu_amx_i8_pack_bytes(N, K)
               : l == WPACK_AMX || l == WPACK_BF16
                   ? npu_amx_pack_elems(N, K) * sizeof(uint16_t)
                   : (N + NPU_WPACK_NR - 1) / NPU_WPACK_NR * NPU_WPACK_NR * K * sizeof(float);
    return (b + 63) / 64 * 64 + (b ? 0 : 64);
}

/* ---- the fast profile's companions ---- */

static bool           g_fast;
static pthread_once_t g_fast_once = PTHREAD_ONCE_INIT;

/* The grp8 kernel needs VNNI with BW and VL, and the AVX-512 kernels in
 * use; D3_NPU_KERNELS=avx512 (fp32 everywhere, the accuracy reference)
 * keeps it off too. */
static void fast_pick(void) {
    const char           *env = getenv("D3_NPU_KERNELS");
    const npu_features_t *f = npu_probe();
    g_fast = kernels() == &k_avx512 && f->avx512_vnni && f->avx512bw && f->avx512vl &&
             !(env && strcmp(env, "avx512") == 0);
}

bool npu_fast_usable(void) {
    pthread_once(&g_fast_once, fast_pick);
    return g_fast;
}

const char *npu_matmul_fast_name(void) {
    return npu_fast_usable() ? "avx512-grp8" : npu_matmul_groups_name();
}

/* A WPACK_VNNI_GRP pack of u, d, m (copied). */
static svc_err_t grp_pack_new(const uint8_t *u, const float *d, const float *m, size_t N, size_t K,
                              npu_wpack_t **out) {
    npu_wpack_t *wp = calloc(1, sizeof *wp);
    if (!wp)
        return SVC_ERR_NOMEM;
    wp->N = N;
    wp->K = K;
    wp->layout = WPACK_VNNI_GRP;
    wp->bytes = npu_grp_pack_bytes(N, K);
    wp->data = aligned_alloc(64, wp->bytes);
    if (!wp->data) {
        free(wp);
        return SVC_ERR_NOMEM;
    }
    npu_grp_pack(u, d, m, N, K, wp->data);
    *out = wp;
    return SVC_OK;
}

/* The companion of a weight given as values: codes of one byte per
 * weight with a scale per row and group of 32, llama.cpp's Q8_0 (d = max
 * |w| / 127, c = round(w / d)), as group codes u = c + 128, m = -128 d.
 * The codes are made whole, then packed: while it runs, the load holds
 * them beside the pack (N K bytes and 8 per group). */
static svc_err_t fast_from_values(const float *w, size_t N, size_t K, npu_wpack_t **out) {
    *out = NULL;
    if (!npu_fast_usable() || !N || !K)
        return SVC_OK;
    size_t   G = (K + NPU_GRP_K - 1) / NPU_GRP_K;
    uint8_t *u = malloc(N * K);
    float   *d = malloc(N * G * sizeof *d), *m = malloc(N * G * sizeof *m);
    if (!u || !d || !m) {
        free(u), free(d), free(m);
        return SVC_ERR_NOMEM;
    }
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < G; g++) {
            size_t k0 = g * NPU_GRP_K, k1 = k0 + NPU_GRP_K < K ? k0 + NPU_GRP_K : K;
            float  amax = 0;
            for (size_t k = k0; k < k1; k++)
                amax = fmaxf(amax, fabsf(w[n * K + k]));
            float dd = amax / 127.0f, id = dd > 0 ? 1.0f / dd : 0.0f;
            for (size_t k = k0; k < k1; k++)
                u[n * K + k] = (uint8_t)((int)lrintf(w[n * K + k] * id) + 128);
            d[n * G + g] = dd;
            m[n * G + g] = -128.0f * dd;
        }
    svc_err_t err = grp_pack_new(u, d, m, N, K, out);
    free(u), free(d), free(m);
    return err;
}

/* with_fast: also the fast companion from w (fast_from_values). */
static svc_err_t wpack_make(float *w, size_t N, size_t K, bool quantised, bool with_fast,
                            npu_wpack_t **out) {
    *out = NULL;
    npu_wpack_t *wp = calloc(1, sizeof *wp);
    if (!wp)
        return SVC_ERR_NOMEM;
    if (with_fast && fast_from_values(w, N, K, &wp->fast)) {
        free(wp);
        return SVC_ERR_NOMEM;
    }
    wp->N = N;
    wp->K = K;
    wp->layout = layout();
    if ((quantised || g_i8_all) && wp->layout == WPACK_AMX && g_i8 && K <= NPU_AMX_I8_MAX_K)
        wp->layout = WPACK_AMX_I8;
    else if (quantised && g_vnni && K <= NPU_AMX_I8_MAX_K)
        wp->layout = WPACK_VNNI_I8;
    if (wp->layout == WPACK_PLAIN || wp->layout == WPACK_DNNL) {
        wp->data = w;
        wp->bytes = N * K * sizeof *w;
        *out = wp;
        return SVC_OK;
    }
    wp->bytes = wpack_size(wp->layout, N, K);
    wp->data = aligned_alloc(64, wp->bytes);
    if (!wp->data) {
        npu_wpack_free(wp->fast);
        free(wp);
        return SVC_ERR_NOMEM;
    }
    if (wp->layout == WPACK_AMX_I8 || wp->layout == WPACK_VNNI_I8)
        npu_amx_i8_pack(w, N, K, wp->data);
    else if (wp->layout == WPACK_AMX || wp->layout == WPACK_BF16)
        npu_amx_pack_bf16(w, N, K, wp->data);
    else
        wpack_panels(w, N, K, wp->data);
    free(w);
    *out = wp;
    return SVC_OK;
}

svc_err_t npu_wpack_new(float *w, size_t N, size_t K, npu_wpack_t **out) {
    return wpack_make(w, N, K, false, true, out);
}

svc_err_t npu_wpack_new_quantised(float *w, size_t N, size_t K, npu_wpack_t **out) {
    return wpack_make(w, N, K, true, true, out);
}

void npu_wpack_test_corrupt(npu_wpack_t *wp) {
    for (npu_wpack_t *p = wp; p; p = p->fast)
        for (size_t i = 0; i < p->bytes; i += 4096)
            ((unsigned char *)p->data)[i] ^= 0x40;
}

svc_err_t npu_wpack_new_fp32(float *w, size_t N, size_t K, npu_wpack_t **out) {
    *out = NULL;
    npu_wpack_t *wp = calloc(1, sizeof *wp);
    if (!wp)
        return SVC_ERR_NOMEM;
    wp->N = N;
    wp->K = K;
    wp->layout = !npu_dnnl_refusal()      ? WPACK_DNNL
                 : kernels() == &k_avx512 ? WPACK_PANELS
                                          : WPACK_PLAIN;
    if (wp->layout != WPACK_PANELS) {
        wp->data = w;
        wp->bytes = N * K * sizeof *w;
        *out = wp;
        return SVC_OK;
    }
    wp->bytes = wpack_size(WPACK_PANELS, N, K);
    wp->data = aligned_alloc(64, wp->bytes);
    if (!wp->data) {
        free(wp);
        return SVC_ERR_NOMEM;
    }
    wpack_panels(w, N, K, wp->data);
    free(w);
    *out = wp;
    return SVC_OK;
}

/* w = d u + m, as the q4nx decoder computes it (fp32 product, then sum). */
static float *grp_dequant(const uint8_t *u, const float *d, const float *m, size_t N, size_t K) {
    size_t G = (K + NPU_GRP_K - 1) / NPU_GRP_K;
    float *w = malloc((N && K ? N * K : 1) * sizeof *w);
    if (!w)
        return NULL;
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++)
            w[n * K + k] =
                d[n * G + k / NPU_GRP_K] * (float)u[n * K + k] + m[n * G + k / NPU_GRP_K];
    return w;
}

svc_err_t npu_wpack_new_groups(uint8_t *u, float *d, float *m, size_t N, size_t K,
                               npu_wpack_t **out) {
    *out = NULL;
    if (layout() == WPACK_AMX || !g_grp || N == 0 || K == 0) {
        /* the exact pack from the values; the fast one keeps the codes */
        float       *w = grp_dequant(u, d, m, N, K);
        npu_wpack_t *fast = NULL;
        if (!w || (npu_fast_usable() && N && K && grp_pack_new(u, d, m, N, K, &fast))) {
            free(w);
            return SVC_ERR_NOMEM;
        }
        svc_err_t err = wpack_make(w, N, K, true, false, out);
        if (err) {
            free(w);
            npu_wpack_free(fast);
            return err;
        }
        (*out)->fast = fast;
        free(u), free(d), free(m);
        return SVC_OK;
    }
    /* the codes serve both profiles (npu_matmul_packed_fast) */
    svc_err_t err = grp_pack_new(u, d, m, N, K, out);
    if (!err)
        free(u), free(d), free(m);
    return err;
}

bool npu_wpack_is_int8(const npu_wpack_t *wp) {
    return wp->layout == WPACK_AMX_I8 || wp->layout == WPACK_VNNI_I8 ||
           wp->layout == WPACK_VNNI_GRP;
}

void npu_wpack_free(npu_wpack_t *wp) {
    if (!wp)
        return;
    npu_wpack_free(wp->fast);
    free(wp->data);
    free(wp);
}

size_t npu_wpack_n(const npu_wpack_t *wp) {
    return wp->N;
}

size_t npu_wpack_k(const npu_wpack_t *wp) {
    return wp->K;
}

size_t npu_wpack_bytes(const npu_wpack_t *wp) {
    return wp->bytes;
}

void npu_matmul_packed_fast(const float *x, const npu_wpack_t *w, size_t T, float *out) {
    const npu_wpack_t *f = w->fast ? w->fast : w;
    if (f->layout == WPACK_VNNI_GRP && npu_fast_usable())
        npu_matmul_vnni_grp8(x, f->data, T, f->K, f->N, out);
    else
        npu_matmul_packed(x, w, T, out);
}

void npu_matmul_packed_fast_n(const float *x, size_t T, size_t n, const npu_wpack_t *const *w,
                              float *const *out) {
    SVC_ASSERT(n <= NPU_GRP8_SHARE_MAX);
    const void *pk[NPU_GRP8_SHARE_MAX];
    size_t      N[NPU_GRP8_SHARE_MAX];
    bool        grp = npu_fast_usable() && n > 0;
    for (size_t i = 0; grp && i < n; i++) {
        const npu_wpack_t *f = w[i]->fast ? w[i]->fast : w[i];
        grp = f->layout == WPACK_VNNI_GRP && f->K == w[0]->K;
        pk[i] = f->data;
        N[i] = f->N;
    }
    if (grp) {
        npu_matmul_vnni_grp8_n(x, T, w[0]->K, n, pk, N, out);
        return;
    }
    for (size_t i = 0; i < n; i++)
        npu_matmul_packed_fast(x, w[i], T, out[i]);
}

/* The grp8 pack that npu_matmul_packed_fast would run w on, or NULL. */
static const npu_wpack_t *fast_grp8(const npu_wpack_t *w) {
    const npu_wpack_t *f = w->fast ? w->fast : w;
    return f->layout == WPACK_VNNI_GRP && npu_fast_usable() ? f : NULL;
}

void npu_mlp_fast(const float *x, size_t T, const npu_wpack_t *gate, const npu_wpack_t *up,
                  const npu_wpack_t *down, float *ga, float *ub, float *out) {
    const npu_wpack_t *g = fast_grp8(gate), *u = fast_grp8(up), *d = fast_grp8(down);
    if (g && u && d && u->K == g->K && u->N == g->N && d->K == g->N &&
        npu_mlp_vnni_grp8(x, T, g->K, g->N, d->N, g->data, u->data, d->data, out))
        return;
    npu_matmul_packed_fast_n(x, T, 2, (const npu_wpack_t *const[]){gate, up},
                             (float *const[]){ga, ub});
    npu_silu_mul(ga, ub, T, gate->N, ga);
    npu_matmul_packed_fast(ga, down, T, out);
}

void npu_matmul_packed(const float *x, const npu_wpack_t *w, size_t T, float *out) {
    switch (w->layout) {
    case WPACK_AMX:
        npu_matmul_amx(x, w->data, T, w->K, w->N, g_split, out);
        break;
    case WPACK_BF16:
        npu_matmul_bf16_avx512(x, w->data, T, w->K, w->N, g_split, out);
        break;
    case WPACK_AMX_I8:
        npu_matmul_amx_i8(x, w->data, T, w->K, w->N, out);
        break;
    case WPACK_VNNI_I8:
        npu_matmul_vnni_i8(x, w->data, T, w->K, w->N, out);
        break;
    case WPACK_VNNI_GRP:
        (g_grp8 ? npu_matmul_vnni_grp8 : npu_matmul_vnni_grp)(x, w->data, T, w->K, w->N, out);
        break;
    case WPACK_PANELS:
        npu_matmul_panels_avx512(x, w->data, T, w->K, w->N, out);
        break;
    case WPACK_DNNL:
        npu_matmul_dnnl(x, w->data, T, w->K, w->N, out);
        break;
    case WPACK_PLAIN:
        kernels()->matmul(x, w->data, T, w->K, w->N, out);
        break;
    }
}
