/*
 * npu_fast.c -- the fast kernels' entry points (npu.h, "Fast kernels"):
 * one table of function pointers, filled once per process with the
 * AVX-512 kernels (npu_avx512.c) or the references (npu_ref.c,
 * npu_ref_delta.c), and calls through it; and the packed weights of
 * npu_matmul_packed, whose layout follows that choice.
 */
#include "npu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct npu_kernels {
    const char *name;
    void (*matmul)(const float *x, const float *w, size_t T, size_t K, size_t N, float *out);
    svc_err_t (*attention)(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                           size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                           const uint8_t *key_mask, float *out);
    svc_err_t (*delta_rule)(const float *q, const float *k, const float *v, const float *g,
                            const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                            size_t dk, size_t dv, const float *state_in, float *state_out,
                            float *out);
    void (*conv1d_causal_silu)(const float *x, const float *w, size_t T, size_t C, size_t K,
                               const float *state_in, float *state_out, float *out);
    void (*rmsnorm)(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                    bool one_plus_w);
    void (*rmsnorm_gated)(const float *x, const float *z, const float *w, size_t T, size_t D,
                          float eps, float *out);
    void (*l2norm)(const float *x, size_t T, size_t D, float eps, float *out);
    void (*silu_mul)(const float *gate, const float *up, size_t T, size_t F, float *out);
    void (*sigmoid_mul)(const float *gate, float *x, size_t n);
} npu_kernels_t;

static const npu_kernels_t k_ref = {
    .name = "ref",
    .matmul = npu_matmul_ref,
    .attention = npu_attention_ref,
    .delta_rule = npu_delta_rule_chunked_ref,
    .conv1d_causal_silu = npu_conv1d_causal_silu_ref,
    .rmsnorm = npu_rmsnorm_ref,
    .rmsnorm_gated = npu_rmsnorm_gated_ref,
    .l2norm = npu_l2norm_ref,
    .silu_mul = npu_silu_mul_ref,
    .sigmoid_mul = npu_sigmoid_mul_ref,
};

static const npu_kernels_t k_avx512 = {
    .name = "avx512",
    .matmul = npu_matmul_avx512,
    .attention = npu_attention_avx512,
    .delta_rule = npu_delta_rule_avx512,
    .conv1d_causal_silu = npu_conv1d_causal_silu_avx512,
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
    if (env && strcmp(env, "ref") == 0)
        g_kernels = &k_ref;
    else if (f->avx512f && f->avx512bw && f->avx512vl)
        g_kernels = &k_avx512;
    else
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
                                out);
}

svc_err_t npu_delta_rule(const float *q, const float *k, const float *v, const float *g,
                         const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads, size_t dk,
                         size_t dv, const float *state_in, float *state_out, float *out) {
    return kernels()->delta_rule(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state_in,
                                 state_out, out);
}

void npu_conv1d_causal_silu(const float *x, const float *w, size_t T, size_t C, size_t K,
                            const float *state_in, float *state_out, float *out) {
    kernels()->conv1d_causal_silu(x, w, T, C, K, state_in, state_out, out);
}

void npu_rmsnorm(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                 bool one_plus_w) {
    kernels()->rmsnorm(x, w, T, D, eps, out, one_plus_w);
}

void npu_rmsnorm_gated(const float *x, const float *z, const float *w, size_t T, size_t D,
                       float eps, float *out) {
    kernels()->rmsnorm_gated(x, z, w, T, D, eps, out);
}

void npu_l2norm(const float *x, size_t T, size_t D, float eps, float *out) {
    kernels()->l2norm(x, T, D, eps, out);
}

void npu_silu_mul(const float *gate, const float *up, size_t T, size_t F, float *out) {
    kernels()->silu_mul(gate, up, T, F, out);
}

void npu_sigmoid_mul(const float *gate, float *x, size_t n) {
    kernels()->sigmoid_mul(gate, x, n);
}

/* ---- packed weights ------------------------------------------------------- */

struct npu_wpack {
    size_t N, K;
    bool   panels; /* true: AVX-512 panel layout (npu.h); false: w as given */
    float *data;
    size_t bytes;
};

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

svc_err_t npu_wpack_new(float *w, size_t N, size_t K, npu_wpack_t **out) {
    *out = NULL;
    npu_wpack_t *wp = calloc(1, sizeof *wp);
    if (!wp)
        return SVC_ERR_NOMEM;
    wp->N = N;
    wp->K = K;
    wp->panels = kernels() == &k_avx512;
    if (!wp->panels) {
        wp->data = w;
        wp->bytes = N * K * sizeof *w;
        *out = wp;
        return SVC_OK;
    }
    /* A multiple of 64 bytes (32 floats per k), as aligned_alloc wants;
     * at least 64 when N or K is 0. */
    wp->bytes = (N + NPU_WPACK_NR - 1) / NPU_WPACK_NR * NPU_WPACK_NR * K * sizeof *w;
    wp->data = aligned_alloc(64, wp->bytes ? wp->bytes : 64);
    if (!wp->data) {
        free(wp);
        return SVC_ERR_NOMEM;
    }
    wpack_panels(w, N, K, wp->data);
    free(w);
    *out = wp;
    return SVC_OK;
}

void npu_wpack_free(npu_wpack_t *wp) {
    if (!wp)
        return;
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

void npu_matmul_packed(const float *x, const npu_wpack_t *w, size_t T, float *out) {
    if (w->panels)
        npu_matmul_panels_avx512(x, w->data, T, w->K, w->N, out);
    else
        kernels()->matmul(x, w->data, T, w->K, w->N, out);
}
