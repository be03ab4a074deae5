/*
 * npu_dnnl.c -- the projection matmul on oneDNN's sgemm (npu.h,
 * npu_matmul_dnnl, "onednn-f32"): what fp32 weights run on where the AMX
 * tiles are not used.
 *
 * Why oneDNN here and not our own kernel: measured in one process on this
 * machine (tests/bench/bench_onednn, runs alternating), oneDNN 2.6's JIT
 * sgemm on AVX-512 does 70-73 GFLOP/s per thread at the nano shapes where
 * our fp32 panels (npu_matmul_panels_avx512, D3_NPU_MATMUL=panels) do
 * 43-53, and the panels ran on one thread: 2.2-3.3x on two cores, 1.6-1.7x
 * on a whole nano pass in fp32 (D3_NPU_KERNELS=avx512). With AVX2 only
 * (ONEDNN_MAX_CPU_ISA=AVX2, what a CPU without AVX-512 gets) it still runs
 * them ~70x faster than the scalar reference such a CPU ran before. Where
 * the tiles are there, our AMX kernels beat oneDNN's own AMX matmul at the
 * same number of products (bench_onednn), so they stay.
 *
 * The weight stays as given, fp32 (N, K) row-major (out = x w^T is sgemm
 * with B transposed), so the pack costs what the fp32 copy does and needs
 * no reorder. The product goes over our pool, not oneDNN's OpenMP team:
 * items of DNNL_NB output columns, each one single-threaded sgemm
 * (omp_set_num_threads(1) on the thread that runs it). Why: one pool for
 * every kernel, so two scheduler workers share the cores instead of each
 * starting an OpenMP team that spins after every call.
 *
 * Bits: an output element's value depends on the sgemm kernel oneDNN picks
 * for the call's shape. The column blocks depend on N only; below
 * DNNL_MIN_M rows oneDNN takes another kernel, so such a call runs on
 * DNNL_MIN_M rows (its rows, then zeros) and keeps its own. With the
 * AVX-512 kernels a row's result is then the same whatever T
 * (test_npu_dnnl checks it), as for the other layouts: the batched passes
 * rely on it. oneDNN's AVX2 kernels do not keep that (a row's bits depend
 * on where it falls in the call), so on such CPUs a batched question agrees
 * with its single pass to fp32 rounding, not bit for bit.
 */
#include "npu.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define DNNL_NB    256 /* output columns per item */
#define DNNL_MIN_M 16  /* fewer rows are padded to this many (above: why) */

typedef struct dnnl_job {
    const float *x; /* T rows of K (or the padded copy) */
    const float *w;
    size_t       T, K, N;
    float       *out; /* T rows of N */
    size_t       ldo;
} dnnl_job_t;

/* Columns [i * DNNL_NB, ...) of out. A failed sgemm (only a bad argument
 * can fail it) takes the reference instead: the matmul never fails. */
static void dnnl_item(void *ctx, size_t i) {
    const dnnl_job_t *j = ctx;
    size_t            n0 = i * DNNL_NB, nc = j->N - n0 < DNNL_NB ? j->N - n0 : DNNL_NB;
    omp_set_num_threads(1);
    dnnl_status_t s = dnnl_sgemm('N', 'T', (dnnl_dim_t)j->T, (dnnl_dim_t)nc, (dnnl_dim_t)j->K, 1.0f,
                                 j->x, (dnnl_dim_t)j->K, j->w + n0 * j->K, (dnnl_dim_t)j->K, 0.0f,
                                 j->out + n0, (dnnl_dim_t)j->ldo);
    if (s == dnnl_success)
        return;
    for (size_t t = 0; t < j->T; t++)
        npu_matmul_ref(j->x + t * j->K, j->w + n0 * j->K, 1, j->K, nc, j->out + t * j->ldo + n0);
}

void npu_matmul_dnnl(const float *x, const float *w, size_t T, size_t K, size_t N, float *out) {
    if (T == 0 || N == 0)
        return;
    if (K == 0) {
        memset(out, 0, T * N * sizeof *out);
        return;
    }
    dnnl_job_t j = {.x = x, .w = w, .T = T, .K = K, .N = N, .out = out, .ldo = N};
    float     *pad = NULL;
    if (T < DNNL_MIN_M) {
        /* the rows, then zeros, and their product in the same block */
        pad = npu_scratch(NPU_SCRATCH_MM_A, DNNL_MIN_M * (K + N) * sizeof *pad);
        if (!pad) {
            npu_matmul_ref(x, w, T, K, N, out);
            return;
        }
        memcpy(pad, x, T * K * sizeof *pad);
        memset(pad + T * K, 0, (DNNL_MIN_M - T) * K * sizeof *pad);
        j.x = pad, j.T = DNNL_MIN_M, j.out = pad + DNNL_MIN_M * K;
    }
    /* Below ~2 M multiply-adds the pool's wake-up costs more than it gains. */
    size_t n_items = (N + DNNL_NB - 1) / DNNL_NB;
    if ((double)T * (double)N * (double)K >= 2e6)
        npu_parallel_for(n_items, dnnl_item, &j);
    else
        for (size_t i = 0; i < n_items; i++)
            dnnl_item(&j, i);
    if (pad)
        memcpy(out, j.out, T * N * sizeof *out);
}
