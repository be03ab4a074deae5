/*
 * eng_gptq.c -- GPTQ rounding onto the Q4NX tile grids (eng_gptq_int.h:
 * the method and its LDL form).
 *
 * Layout of the work for a matrix W (R, K), all row-major fp32:
 *   wp  W with its columns in processing order (act-order permutes them;
 *       a column no calibration input reached -- H_kk = 0 -- is zeroed,
 *       as GPTQ does, and its H_kk set to 1);
 *   at  A^T: at[k][j] = V_jk / V_kk for j < k, from the Cholesky factor;
 *   wc  w~ of the block being rounded (and scratch for the losses);
 *   e   the errors w - q of the columns rounded so far.
 * A block of 256 columns (a Q4_K super-block and 8 Q4_1 groups) starts
 * with wc = wp + e[:, :b0] at[b0:b1, :b0]^T, one sgemm; inside it every
 * row runs on its own (the bands of 32 rows of a tile go over the pool,
 * so no two threads write one tile byte).
 */
#include "eng_gptq_int.h"
#include "npu.h"

#include <math.h>

#define GQ_BLOCK 256 /* columns per block: one tile column */
#define GQ_CHOL  128 /* Cholesky block */

struct eng_gptq_hess {
    size_t   K;
    uint64_t rows;
    float   *h;  /* (K, K); adds fill the lower triangle's blocks, hess_sym the rest */
    float   *xt; /* scratch: the rows transposed */
    size_t   xt_cap;
    bool     sym; /* the upper triangle mirrors the lower */
};

#define GQ_HBLK 256 /* Hessian block columns */

/* The upper triangle from the lower one. */
static void hess_sym(eng_gptq_hess_t *h) {
    if (h->sym)
        return;
    for (size_t i = 0; i < h->K; i++)
        for (size_t j = 0; j < i; j++)
            h->h[j * h->K + i] = h->h[i * h->K + j];
    h->sym = true;
}

eng_gptq_hess_t *eng_gptq_hess_new(size_t K) {
    eng_gptq_hess_t *h = K ? calloc(1, sizeof *h) : NULL;
    if (h) {
        h->K = K;
        h->sym = true;
        h->h = calloc(K * K, sizeof *h->h);
    }
    if (h && !h->h) {
        free(h);
        h = NULL;
    }
    return h;
}

void eng_gptq_hess_free(eng_gptq_hess_t *h) {
    if (!h)
        return;
    free(h->h);
    free(h->xt);
    free(h);
}

void eng_gptq_hess_reset(eng_gptq_hess_t *h) {
    memset(h->h, 0, h->K * h->K * sizeof *h->h);
    h->rows = 0;
    h->sym = true;
}

size_t eng_gptq_hess_k(const eng_gptq_hess_t *h) {
    return h->K;
}

uint64_t eng_gptq_hess_rows(const eng_gptq_hess_t *h) {
    return h->rows;
}

const float *eng_gptq_hess_data(eng_gptq_hess_t *h) {
    hess_sym(h);
    return h->h;
}

svc_err_t eng_gptq_hess_add(eng_gptq_hess_t *h, const float *x, size_t n) {
    size_t K = h->K;
    if (!n)
        return SVC_OK;
    if (h->xt_cap < n * K) {
        float *t = realloc(h->xt, n * K * sizeof *t);
        if (!t)
            return SVC_ERR_NOMEM;
        h->xt = t;
        h->xt_cap = n * K;
    }
    /* H += X^T X as (X^T)(X^T)^T, the sgemm wanting both operands by rows;
     * only the block columns' lower parts (half the products: H is
     * symmetric, hess_sym mirrors it before use) */
    for (size_t t = 0; t < n; t++)
        for (size_t k = 0; k < K; k++)
            h->xt[k * n + t] = x[t * K + k];
    for (size_t j = 0; j < K; j += GQ_HBLK) {
        size_t nj = K - j < GQ_HBLK ? K - j : GQ_HBLK;
        npu_sgemm_nt(K - j, nj, n, 1.0f, h->xt + j * n, n, h->xt + j * n, n, 1.0f, h->h + j * K + j,
                     K);
    }
    h->rows += n;
    h->sym = false;
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * Cholesky (lower, blocked left-looking: each block column takes the
 * products of the ones before it in one sgemm, then is factored with
 * double sums, its rows below in parallel)
 * --------------------------------------------------------------------- */

/* The diagonal block kb x kb at a (row stride K), factored in place with
 * double sums; 0 or 1 + the first row that is not positive definite. */
static size_t chol_diag(float *a, size_t K, size_t kb) {
    for (size_t j = 0; j < kb; j++) {
        float *rj = a + j * K;
        double s = rj[j];
        for (size_t m = 0; m < j; m++)
            s -= (double)rj[m] * (double)rj[m];
        if (!(s > 0.0) || !isfinite(s))
            return j + 1;
        rj[j] = (float)sqrt(s);
        for (size_t i = j + 1; i < kb; i++) {
            float *ri = a + i * K;
            double t = ri[j];
            for (size_t m = 0; m < j; m++)
                t -= (double)ri[m] * (double)rj[m];
            ri[j] = (float)(t / rj[j]);
        }
    }
    return 0;
}

/* inv (kb x kb, row-major) = the inverse of the lower triangle l (row
 * stride K), by forward substitution in double; zero above. */
static void tri_inverse(const float *l, size_t K, size_t kb, float *inv) {
    memset(inv, 0, kb * kb * sizeof *inv);
    for (size_t j = 0; j < kb; j++) /* column j of the inverse */
        for (size_t i = j; i < kb; i++) {
            double t = i == j ? 1.0 : 0.0;
            for (size_t m = j; m < i; m++)
                t -= (double)l[i * K + m] * (double)inv[m * kb + j];
            inv[i * kb + j] = (float)(t / l[i * K + i]);
        }
}

size_t eng_gptq_cholesky(float *a, size_t K) {
    float *inv = malloc(GQ_CHOL * GQ_CHOL * sizeof *inv);
    float *pan = malloc((K ? K : 1) * GQ_CHOL * sizeof *pan);
    size_t bad = inv && pan ? 0 : SIZE_MAX;
    for (size_t k0 = 0; !bad && k0 < K; k0 += GQ_CHOL) {
        size_t kb = K - k0 < GQ_CHOL ? K - k0 : GQ_CHOL, i0 = k0 + kb;
        if (k0) /* the block column minus the products of the columns before it */
            npu_sgemm_nt(K - k0, kb, k0, -1.0f, a + k0 * K, K, a + k0 * K, K, 1.0f, a + k0 * K + k0,
                         K);
        size_t b = chol_diag(a + k0 * K + k0, K, kb);
        if (b) {
            bad = k0 + b;
            break;
        }
        if (i0 == K)
            break;
        /* the rows below: L_ik = A_ik L_kk^-T, one sgemm through a copy */
        tri_inverse(a + k0 * K + k0, K, kb, inv);
        for (size_t i = i0; i < K; i++)
            memcpy(pan + (i - i0) * kb, a + i * K + k0, kb * sizeof *pan);
        npu_sgemm_nt(K - i0, kb, kb, 1.0f, pan, kb, inv, kb, 0.0f, a + i0 * K + k0, K);
    }
    free(inv);
    free(pan);
    return bad;
}

/* ---------------------------------------------------------------------
 * One matrix
 * --------------------------------------------------------------------- */

typedef struct gq {
    eng_q4nx_kind_t   kind;
    eng_q4nx_raster_t raster;
    size_t            R, K, P, Q;
    const float      *w;       /* (R, K) as given */
    const float      *h;       /* (K, K) as given */
    size_t           *perm;    /* (K): processing position -> column */
    float            *wp;      /* (R, K) W in processing order */
    float            *wc;      /* (R, K) w~ of the current block; scratch */
    float            *e;       /* (R, K) errors, processing order */
    float            *at;      /* (K, K) A^T */
    float            *ablk;    /* (256, 256) A of the current block */
    float            *gd, *gm; /* (Q, 32P, 8) grids */
    float            *imp;     /* (K) H's diagonal: the grids' importances; NULL: plain grids */
    uint8_t          *packed;
    size_t            b0, nb; /* the current block */
    char             *errstr;
    size_t            errstr_size;
} gq_t;

static float *gq_grid(const gq_t *g, float *base, size_t r, size_t col) {
    return base + ((col / ENG_Q4NX_COLS) * g->P * ENG_Q4NX_ROWS + r) * 8 +
           (col % ENG_Q4NX_COLS) / ENG_Q4NX_GROUP;
}

static void gq_free(gq_t *g) {
    free(g->perm);
    free(g->wp);
    free(g->wc);
    free(g->e);
    free(g->at);
    free(g->ablk);
    free(g->gd);
    free(g->gm);
    free(g->imp);
}

static svc_err_t gq_alloc(gq_t *g) {
    size_t RK = g->R * g->K, G = g->Q * g->P * ENG_Q4NX_ROWS * 8;
    g->perm = malloc(g->K * sizeof *g->perm);
    g->wp = malloc(RK * sizeof *g->wp);
    g->wc = calloc(RK, sizeof *g->wc);
    g->e = calloc(RK, sizeof *g->e);
    g->at = malloc(g->K * g->K * sizeof *g->at);
    g->ablk = malloc(GQ_BLOCK * GQ_BLOCK * sizeof *g->ablk);
    g->gd = malloc(G * sizeof *g->gd);
    g->gm = malloc(G * sizeof *g->gm);
    return g->perm && g->wp && g->wc && g->e && g->at && g->ablk && g->gd && g->gm ? SVC_OK
                                                                                   : SVC_ERR_NOMEM;
}

typedef struct gq_grids_job {
    gq_t      *g;
    svc_err_t *err; /* (Q) each tile column's */
} gq_grids_job_t;

/* Tile column q's tiles and grids, fitted to g->imp (NULL: spanning each
 * group, RTN's): its tiles and its band of gd, gm are its own, so the
 * columns go over the pool. */
static void gq_grids_col(void *ctx, size_t q) {
    gq_grids_job_t *j = ctx;
    gq_t           *g = j->g;
    size_t          band = g->P * ENG_Q4NX_ROWS * 8;
    j->err[q] = eng_q4nx_encode_col_imp(g->kind, g->raster, g->w, g->R, g->K, q, g->imp, g->packed,
                                        g->gd + q * band, g->gm + q * band);
}

/* Every tile column's tiles, rounded to nearest, and their static grids
 * (eng_q4nx_encode_col_imp with g->imp). */
static svc_err_t gq_grids(gq_t *g) {
    gq_grids_job_t j = {.g = g, .err = calloc(g->Q, sizeof *j.err)};
    if (!j.err)
        return SVC_ERR_NOMEM;
    npu_parallel_for(g->Q, gq_grids_col, &j);
    svc_err_t err = SVC_OK;
    for (size_t q = 0; q < g->Q && !err; q++)
        err = j.err[q];
    free(j.err);
    return err;
}

/* The grids again, fitted to importances (eng_q4nx_encode_col_imp): the
 * tiles' parameters and the static grids. The importance of column k is
 * H_kk plus the mean of H's diagonal: with H_kk alone a column the
 * calibration barely reached weighs nothing, its group's grid clips it
 * freely, and prompts unlike the calibration's then find it wrong
 * (trained-tiny, 100 generated held-out prompts: final-state cosine 0.89
 * against BF16 where RTN keeps 0.93; with the mean added 0.96, the
 * per-layer errors unchanged; docs/quantize.md). */
static svc_err_t gq_refit(gq_t *g) {
    g->imp = malloc(g->K * sizeof *g->imp);
    if (!g->imp)
        return SVC_ERR_NOMEM;
    double mean = 0;
    for (size_t k = 0; k < g->K; k++)
        mean += g->h[k * g->K + k] > 0 ? g->h[k * g->K + k] : 0.0f;
    mean /= (double)g->K;
    for (size_t k = 0; k < g->K; k++)
        g->imp[k] = (g->h[k * g->K + k] > 0 ? g->h[k * g->K + k] : 0.0f) + (float)mean;
    return gq_grids(g);
}

/* act-order: columns by decreasing H_kk, ties by index. */
typedef struct gq_key {
    float  diag;
    size_t col;
} gq_key_t;

static int by_diag(const void *a, const void *b) {
    const gq_key_t *x = a, *y = b;
    return x->diag > y->diag ? -1 : x->diag < y->diag ? 1 : (x->col > y->col) - (x->col < y->col);
}

static svc_err_t gq_order(gq_t *g, bool act_order) {
    for (size_t k = 0; k < g->K; k++)
        g->perm[k] = k;
    if (!act_order)
        return SVC_OK;
    gq_key_t *keys = malloc(g->K * sizeof *keys);
    if (!keys)
        return SVC_ERR_NOMEM;
    for (size_t k = 0; k < g->K; k++)
        keys[k] = (gq_key_t){g->h[k * g->K + k], k};
    qsort(keys, g->K, sizeof *keys, by_diag);
    for (size_t k = 0; k < g->K; k++)
        g->perm[k] = keys[k].col;
    free(keys);
    return SVC_OK;
}

/* at = the reversed, permuted, dampened H (lower Cholesky of it next). */
static void gq_hrev(gq_t *g, double damp) {
    size_t K = g->K;
    double mean = 0;
    for (size_t k = 0; k < K; k++) {
        float hk = g->h[k * K + k];
        mean += hk > 0 ? hk : 1.0;
    }
    mean /= (double)K;
    for (size_t i = 0; i < K; i++) {
        size_t pi = g->perm[K - 1 - i];
        for (size_t j = 0; j <= i; j++)
            g->at[i * K + j] = g->h[pi * K + g->perm[K - 1 - j]];
        if (!(g->at[i * K + i] > 0)) /* no input reached it: GPTQ's H_kk = 1 */
            g->at[i * K + i] = 1.0f;
        g->at[i * K + i] += (float)(damp * mean);
    }
}

/* L (lower, of the reversed matrix) -> at[k][j] = V_jk / V_kk, V upper
 * with H = V V^T: V_jk = L[K-1-j][K-1-k], an anti-transpose of the lower
 * triangle onto itself, then each row over its diagonal. */
static void gq_feedback(gq_t *g) {
    size_t K = g->K;
    float *a = g->at;
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j <= i; j++) {
            size_t i2 = K - 1 - j, j2 = K - 1 - i;
            if (i * K + j < i2 * K + j2) {
                float t = a[i * K + j];
                a[i * K + j] = a[i2 * K + j2];
                a[i2 * K + j2] = t;
            }
        }
    for (size_t k = 0; k < K; k++) {
        float v = a[k * K + k];
        for (size_t j = 0; j < k; j++)
            a[k * K + j] /= v;
    }
}

/* W in processing order, unreached columns zeroed. */
static void gq_permute(gq_t *g) {
    for (size_t r = 0; r < g->R; r++)
        for (size_t k = 0; k < g->K; k++) {
            size_t c = g->perm[k];
            g->wp[r * g->K + k] = g->h[c * g->K + c] > 0 ? g->w[r * g->K + c] : 0.0f;
        }
}

/* Row r of the current block: round, keep the error, push it onto the
 * block's later columns. */
static void gq_row(const gq_t *g, size_t r) {
    size_t K = g->K, b0 = g->b0, nb = g->nb;
    float *wc = g->wc + r * K + b0, *e = g->e + r * K + b0;
    size_t Q = g->Q;
    for (size_t c = 0; c < nb; c++) {
        size_t col = g->perm[b0 + c];
        float  d = *gq_grid(g, g->gd, r, col), m = *gq_grid(g, g->gm, r, col);
        int    code = eng_q4nx_code_near(g->kind, wc[c], d, m);
        float  err = g->wp[r * K + b0 + c] - eng_q4nx_code_value(g->kind, code, d, m);
        eng_q4nx_code_put(g->kind, g->raster, g->packed, Q, r, col, code);
        e[c] = err;
        const float *ac = g->ablk + c * GQ_BLOCK;
        for (size_t c2 = c + 1; c2 < nb; c2++)
            wc[c2] += err * ac[c2];
    }
}

static void gq_band(void *ctx, size_t p) {
    const gq_t *g = ctx;
    size_t      r1 = (p + 1) * ENG_Q4NX_ROWS < g->R ? (p + 1) * ENG_Q4NX_ROWS : g->R;
    for (size_t r = p * ENG_Q4NX_ROWS; r < r1; r++)
        gq_row(g, r);
}

/* Block [b0, b0 + nb): its w~, its grids (dynamic), then the rows. */
static svc_err_t gq_block(gq_t *g, bool dynamic) {
    size_t K = g->K, b0 = g->b0, nb = g->nb;
    if (b0)
        npu_sgemm_nt(g->R, nb, b0, 1.0f, g->e, K, g->at + b0 * K, K, 0.0f, g->wc + b0, K);
    for (size_t r = 0; r < g->R; r++)
        for (size_t c = 0; c < nb; c++)
            g->wc[r * K + b0 + c] = (b0 ? g->wc[r * K + b0 + c] : 0.0f) + g->wp[r * K + b0 + c];
    if (dynamic) {
        size_t    q = b0 / ENG_Q4NX_COLS, band = g->P * ENG_Q4NX_ROWS * 8;
        svc_err_t err = eng_q4nx_encode_col_imp(g->kind, g->raster, g->wc, g->R, K, q, g->imp,
                                                g->packed, g->gd + q * band, g->gm + q * band);
        if (err)
            return err;
    }
    for (size_t c = 0; c < nb; c++)
        for (size_t c2 = c + 1; c2 < nb; c2++)
            g->ablk[c * GQ_BLOCK + c2] = g->at[(b0 + c2) * K + b0 + c];
    npu_parallel_for(g->P, gq_band, g);
    return SVC_OK;
}

#define GQ_LOSS_ROWS 256 /* rows the losses are taken over, at most */

/* tr(E H E^T) for E (R, K) in processing order perm (NULL: as is),
 * estimated from every step-th row (all when R <= 256: a loss is a
 * report and a choice between two codings, and all rows of nano's down
 * projection cost as much as the rounding itself); wc and wp scratch. */
static double gq_loss(gq_t *g, const float *e, const size_t *perm) {
    size_t R = g->R, K = g->K, step = (R + GQ_LOSS_ROWS - 1) / GQ_LOSS_ROWS, ns = 0;
    float *es = g->wc, *out = g->wp;
    for (size_t r = 0; r < R; r += step, ns++)
        for (size_t k = 0; k < K; k++)
            es[ns * K + (perm ? perm[k] : k)] = e[r * K + k];
    npu_sgemm_nt(ns, K, K, 1.0f, es, K, g->h, K, 0.0f, out, K);
    double s = 0;
    for (size_t i = 0; i < ns * K; i++)
        s += (double)es[i] * (double)out[i];
    return s * (double)R / (double)ns;
}

/* The RTN errors into e (columns as is) from the static grids. */
static void gq_rtn_err(gq_t *g) {
    for (size_t r = 0; r < g->R; r++)
        for (size_t k = 0; k < g->K; k++) {
            float d = *gq_grid(g, g->gd, r, k), m = *gq_grid(g, g->gm, r, k);
            float x = g->w[r * g->K + k];
            g->e[r * g->K + k] =
                x - eng_q4nx_code_value(g->kind, eng_q4nx_code_near(g->kind, x, d, m), d, m);
        }
}

/* The Cholesky of the reversed H, dampening raised tenfold while it fails. */
static svc_err_t gq_factor(gq_t *g, double damp, double *used) {
    for (int tries = 0; tries < 4; tries++, damp *= 10) {
        gq_hrev(g, damp);
        size_t bad = eng_gptq_cholesky(g->at, g->K);
        if (bad == SIZE_MAX) {
            svc_errf(g->errstr, g->errstr_size, "GPTQ: out of memory factoring the Hessian");
            return SVC_ERR_NOMEM;
        }
        if (!bad) {
            *used = damp;
            return SVC_OK;
        }
    }
    svc_errf(g->errstr, g->errstr_size,
             "GPTQ: the Hessian (%zu x %zu) is not positive definite even with dampening %g of "
             "its mean diagonal",
             g->K, g->K, damp / 10);
    return SVC_ERR_INVALID;
}

static svc_err_t gq_run(gq_t *g, const eng_gptq_opts_t *o, eng_gptq_stats_t *st) {
    svc_err_t err = gq_grids(g); /* RTN's: g->imp is not set yet */
    if (err) {
        svc_errf(g->errstr, g->errstr_size, "GPTQ: a weight is not finite or too large");
        return err;
    }
    gq_rtn_err(g);
    st->loss_rtn = gq_loss(g, g->e, NULL);
    memset(g->e, 0, g->R * g->K * sizeof *g->e);
    if (!o->plain_grids)
        err = gq_refit(g);
    if (!err)
        err = gq_order(g, o->act_order);
    if (!err)
        err = gq_factor(g, o->damp > 0 ? o->damp : ENG_GPTQ_DAMP, &st->damp);
    if (err)
        return err;
    gq_feedback(g);
    gq_permute(g);
    bool dynamic = !o->act_order && !o->static_groups;
    for (g->b0 = 0; !err && g->b0 < g->K; g->b0 += GQ_BLOCK) {
        g->nb = g->K - g->b0 < GQ_BLOCK ? g->K - g->b0 : GQ_BLOCK;
        err = gq_block(g, dynamic);
    }
    if (err) {
        svc_errf(g->errstr, g->errstr_size, "GPTQ: a fitted grid was refused (non-finite values)");
        return err;
    }
    st->loss_gptq = gq_loss(g, g->e, g->perm);
    return SVC_OK;
}

svc_err_t eng_gptq_encode(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const float *w,
                          size_t rows, size_t cols, eng_gptq_hess_t *h, const eng_gptq_opts_t *o,
                          void *packed, eng_gptq_stats_t *st, char *errstr, size_t errstr_size) {
    eng_gptq_stats_t own = {0};
    st = st ? st : &own;
    *st = (eng_gptq_stats_t){0};
    if (h->K != cols || !rows || !cols) {
        svc_errf(errstr, errstr_size, "GPTQ: a (%zu, %zu) matrix against a Hessian of width %zu",
                 rows, cols, h->K);
        return SVC_ERR_INVALID;
    }
    gq_t      g = {.kind = kind,
                   .raster = raster,
                   .R = rows,
                   .K = cols,
                   .P = (rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS,
                   .Q = (cols + ENG_Q4NX_COLS - 1) / ENG_Q4NX_COLS,
                   .w = w,
                   .h = eng_gptq_hess_data(h),
                   .packed = packed,
                   .errstr = errstr,
                   .errstr_size = errstr_size};
    svc_err_t err = gq_alloc(&g);
    if (!err)
        err = gq_run(&g, o, st);
    else
        svc_errf(errstr, errstr_size, "GPTQ: out of memory for a (%zu, %zu) matrix", rows, cols);
    if (!err && st->loss_gptq > st->loss_rtn) {
        st->kept_rtn = true; /* in-sample, GPTQ should never lose: keep the better */
        err = eng_q4nx_encode_ref(kind, raster, w, rows, cols, packed);
    }
    gq_free(&g);
    return err;
}
