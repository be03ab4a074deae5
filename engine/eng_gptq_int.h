/*
 * eng_gptq_int.h -- private: GPTQ rounding onto the Q4NX tile grids
 * (`d3stream quantize --method gptq`, docs/quantize.md).
 *
 * GPTQ (Frantar et al., 2022) rounds a weight matrix W (R, K) -- out x in,
 * a projection y = x W^T -- column by column so that its output error on
 * the calibration inputs X, ||X (W - Q)^T||^2 = tr((W - Q) H (W - Q)^T)
 * with H = X^T X, is small: each column's rounding error is pushed onto
 * the columns not yet rounded, weighted by H's inverse. It is computed
 * here in its LDL form (LDLQ, Chee et al. 2023, shown there equal to
 * GPTQ): with H = V V^T, V upper triangular (the Cholesky factor of H in
 * reversed order), the error e = w - q of a row gives the loss
 * ||e V||^2 = sum_k |V_kk (e_k + sum_{j<k} e_j V_jk / V_kk)|^2, so rounding
 * w~_k = w_k + sum_{j<k} e_j V_jk / V_kk to the grid makes each term small
 * in turn. One Cholesky, no inverse; the sums of earlier blocks of 256
 * columns come in one matrix product per block (npu_sgemm_nt), the rest
 * row by row inside the block.
 *
 * The grid is the tiles' own: each (row, 32 columns) group's levels are
 * fitted from the values as eng_q4nx_encode_ref fits them (Q4_K, Q4_1,
 * Q4_0, Q8), from W itself ("static", and with act-order) or from w~ when
 * its block of 256 columns starts ("dynamic"); GPTQ only chooses the
 * codes, and the tiles are written by eng_q4nx_encode_col and
 * eng_q4nx_code_put, so the layouts stay the encoders'.
 *
 * Thread-safety: a Hessian belongs to one thread; eng_gptq_encode uses the
 * npu pool.
 */
#ifndef D3STREAM_ENG_GPTQ_INT_H
#define D3STREAM_ENG_GPTQ_INT_H

#include "eng_q4nx_int.h"

/* H = sum x^T x over the rows fed, for inputs of width K (fp32; each add
 * is one sgemm, so the rounding is fp32's over a chunk of rows). */
typedef struct eng_gptq_hess eng_gptq_hess_t;

/* A zero Hessian for width K (K x K floats); NULL when out of memory. */
eng_gptq_hess_t *eng_gptq_hess_new(size_t K);
void             eng_gptq_hess_free(eng_gptq_hess_t *h); /* NULL is a no-op */
void             eng_gptq_hess_reset(eng_gptq_hess_t *h);
size_t           eng_gptq_hess_k(const eng_gptq_hess_t *h);
/* Rows added since the last reset. */
uint64_t eng_gptq_hess_rows(const eng_gptq_hess_t *h);
/* Adds x (n, K) row-major. SVC_ERR_NOMEM (h unchanged) when scratch for
 * the transposed rows cannot be had. */
SVC_WUR svc_err_t eng_gptq_hess_add(eng_gptq_hess_t *h, const float *x, size_t n);
/* The (K, K) matrix, row-major and symmetric (adds fill one triangle; this
 * mirrors it); valid until the next add. */
const float *eng_gptq_hess_data(eng_gptq_hess_t *h);

typedef struct eng_gptq_opts {
    double damp;          /* added to H's diagonal: damp x its mean (GPTQ's 1%) */
    bool   act_order;     /* columns in order of decreasing H_kk (implies static) */
    bool   static_groups; /* grids from W, not from w~ at each block's start */
    bool   plain_grids;   /* grids span each group (RTN's); else fitted to H's diagonal
                             (eng_q4nx_encode_col_imp), the tiles' parameters with them */
} eng_gptq_opts_t;

#define ENG_GPTQ_DAMP 0.01

/* What one matrix came to: the proxy losses tr(E H E^T) (H as given,
 * undamped; over every row up to 256 rows, else estimated from 256 evenly
 * spaced ones) of GPTQ's codes and of round-to-nearest on the RTN grids, the
 * dampening used (raised tenfold, up to 3 times, when H + damp is not
 * positive definite) and whether the RTN codes were kept because GPTQ's
 * loss came out higher (the tiles are then exactly eng_q4nx_encode_ref's). */
typedef struct eng_gptq_stats {
    double loss_gptq, loss_rtn;
    double damp;
    bool   kept_rtn;
} eng_gptq_stats_t;

/**
 * @brief Quantizes w (rows, cols) row-major into packed tiles of kind
 *   (eng_q4nx_packed_bytes(kind, rows, cols) bytes), choosing the codes by
 *   GPTQ against h (cols x cols).
 * @param h the Hessian; its upper triangle is filled in (eng_gptq_hess_data).
 * @param st optional: the losses above.
 * @returns SVC_OK; SVC_ERR_INVALID (kind not encoded, h of another width,
 *   a non-finite weight, H not positive definite even at 1000x the
 *   dampening) with errstr; SVC_ERR_NOMEM. Memory: ~4 R K + 2 K^2 floats.
 */
SVC_WUR svc_err_t eng_gptq_encode(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const float *w,
                                  size_t rows, size_t cols, eng_gptq_hess_t *h,
                                  const eng_gptq_opts_t *o, void *packed, eng_gptq_stats_t *st,
                                  char *errstr, size_t errstr_size);

/* For tests: the lower Cholesky factor of a (K, K) symmetric matrix in
 * place (upper triangle left as is), blocked on npu_sgemm_nt; 0 when it
 * is positive definite, else 1 + the first row that is not (SIZE_MAX: out
 * of memory for its scratch). */
size_t eng_gptq_cholesky(float *a, size_t K);

#endif /* D3STREAM_ENG_GPTQ_INT_H */
