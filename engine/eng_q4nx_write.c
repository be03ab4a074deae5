/*
 * eng_q4nx_write.c -- builds a model.q4nx from f32 tensors in Hugging Face
 * convention (eng_q4nx_int.h): by default as official Gen-B (Q4_K era)
 * files are, or in the other layouts the public converter writes
 * (eng_q4nx_writer_set_layout), so the reader is tested on each.
 *
 * Each add() applies the converter's transforms (Q4NX.md §2.2) and encodes
 * at once, so the writer holds the output bytes, never the caller's f32.
 * finish() lays the tensors out back to back in name order behind a JSON
 * header padded with spaces to a multiple of 8 (§1), the same container
 * eng_st_open reads.
 */
#include "eng_q4nx_int.h"

#include <jansson.h>
#include <math.h>
#include <unistd.h>

#define WR_NAME_MAX 256

typedef struct wr_tensor {
    char       *name;
    eng_dtype_t dtype;
    uint32_t    rank;
    uint64_t    shape[ENG_ST_MAX_RANK];
    uint8_t    *data;
    size_t      nbytes;
} wr_tensor_t;

struct eng_q4nx_writer {
    size_t             head_dim;
    eng_q4nx_wlayout_t lay;
    size_t             vis_mm_n, vis_mm_k; /* vision tiles (§5) */
    eng_q4nx_encode_fn enc;                /* NULL: eng_q4nx_encode_ref */
    void              *enc_user;
    wr_tensor_t       *t;
    size_t             n, cap;
};

/* One add() call: what is written and where messages go. */
typedef struct wr_ctx {
    eng_q4nx_writer_t *w;
    const char        *hf;
    const char        *qname;
    char              *errstr;
    size_t             errstr_size;
} wr_ctx_t;

SVC_FMT(3, 4) static svc_err_t wr_fail(const wr_ctx_t *c, svc_err_t err, const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(c->errstr, c->errstr_size, "q4nx writer: HF \"%s\": %s", c->hf, msg);
    return err;
}

svc_err_t eng_q4nx_writer_new(size_t head_dim, eng_q4nx_writer_t **out) {
    *out = NULL;
    if (!head_dim)
        return SVC_ERR_INVALID;
    eng_q4nx_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return SVC_ERR_NOMEM;
    w->head_dim = head_dim;
    w->lay = (eng_q4nx_wlayout_t){ENG_Q4NX_Q4_K, ENG_Q4NX_Q8, ENG_Q4NX_RASTER_B, false};
    w->vis_mm_n = ENG_Q4NX_VISION_MM_N;
    w->vis_mm_k = ENG_Q4NX_VISION_MM_K;
    *out = w;
    return SVC_OK;
}

svc_err_t eng_q4nx_writer_set_vision_tiles(eng_q4nx_writer_t *w, size_t mm_n, size_t mm_k) {
    if (!eng_q4nx_vision_tiles_valid(mm_n, mm_k))
        return SVC_ERR_INVALID;
    w->vis_mm_n = mm_n;
    w->vis_mm_k = mm_k;
    return SVC_OK;
}

void eng_q4nx_writer_set_encoder(eng_q4nx_writer_t *w, eng_q4nx_encode_fn fn, void *user) {
    w->enc = fn;
    w->enc_user = user;
}

svc_err_t eng_q4nx_writer_set_layout(eng_q4nx_writer_t *w, const eng_q4nx_wlayout_t *l) {
    bool four = l->proj == ENG_Q4NX_Q4_K || l->proj == ENG_Q4NX_Q4_1 || l->proj == ENG_Q4NX_Q4_0;
    if (!four || (l->alpha != ENG_Q4NX_Q8 && l->alpha != l->proj) ||
        (l->raster != ENG_Q4NX_RASTER_A && l->raster != ENG_Q4NX_RASTER_B) || w->n)
        return SVC_ERR_INVALID;
    w->lay = *l;
    return SVC_OK;
}

void eng_q4nx_writer_free(eng_q4nx_writer_t *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
}

static bool wr_has(const eng_q4nx_writer_t *w, const char *name) {
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return true;
    return false;
}

/* Takes ownership of data (freed on failure too). */
static svc_err_t wr_push(const wr_ctx_t *c, const char *name, eng_dtype_t dt, uint32_t rank,
                         const uint64_t *shape, uint8_t *data, size_t nbytes) {
    eng_q4nx_writer_t *w = c->w;
    if (wr_has(w, name)) {
        free(data);
        return wr_fail(c, SVC_ERR_INVALID, "tensor \"%s\" was already added", name);
    }
    if (w->n == w->cap) {
        size_t       cap = w->cap ? 2 * w->cap : 64;
        wr_tensor_t *t = realloc(w->t, cap * sizeof *t);
        if (!t) {
            free(data);
            return wr_fail(c, SVC_ERR_NOMEM, "out of memory");
        }
        w->t = t;
        w->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm) {
        free(data);
        return wr_fail(c, SVC_ERR_NOMEM, "out of memory");
    }
    wr_tensor_t *t = &w->t[w->n++];
    *t = (wr_tensor_t){nm, dt, rank, {0}, data, nbytes};
    memcpy(t->shape, shape, rank * sizeof *shape);
    return SVC_OK;
}

/* Plain BF16 (RNE) or F32 copy of n values, after an optional value map. */
static svc_err_t wr_plain(const wr_ctx_t *c, const char *name, eng_dtype_t dt, uint32_t rank,
                          const uint64_t *shape, const float *x, size_t n, eng_q4nx_xform_t xf) {
    size_t   es = dt == ENG_DT_F32 ? 4 : 2;
    uint8_t *d = malloc(n ? n * es : 1);
    if (!d)
        return wr_fail(c, SVC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (xf == ENG_Q4NX_X_PLUS1)
            v += 1.0f; /* HF's (1 + w) RMSNorm, stored shifted (§2.2) */
        else if (xf == ENG_Q4NX_X_NEG_EXP)
            v = -expf(v); /* ssm_a = -exp(A_log) (§2.2) */
        if (dt == ENG_DT_F32) {
            memcpy(d + 4 * i, &v, 4);
        } else {
            uint16_t h = eng_f32_to_bf16(v);
            d[2 * i] = (uint8_t)h;
            d[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
    return wr_push(c, name, dt, rank, shape, d, n * es);
}

/* A 2-D weight: row transforms, then tiles; alpha/beta also get their copy. */
static svc_err_t wr_matrix(const wr_ctx_t *c, const uint64_t *dims, const float *x,
                           eng_q4nx_xform_t xf, eng_q4nx_kind_t kind) {
    size_t R = dims[0], K = dims[1], hd = c->w->head_dim;
    if (xf == ENG_Q4NX_X_Q_REGROUP && R % (2 * hd))
        return wr_fail(c, SVC_ERR_INVALID,
                       "q_proj has %zu rows, not a multiple of 2 x head_dim %zu (Q4NX.md §2.2)", R,
                       hd);
    /* Alpha/beta are padded to 32 rows by duplication, not zeros (§2.2). */
    size_t Rp = xf == ENG_Q4NX_X_ROW_DUP ? (R + 31) / 32 * 32 : R;
    size_t tc = eng_q4nx_tile_cols(kind), P = (Rp + 31) / 32, Q = (K + tc - 1) / tc;
    /* rows moved or repeated into a copy; else the caller's, as they are
     * (nano's embedding: 2 GB less at the writer's peak) */
    bool     moved = xf == ENG_Q4NX_X_ROW_DUP || xf == ENG_Q4NX_X_Q_REGROUP;
    float   *m = moved ? malloc(Rp * K * sizeof *m) : NULL;
    size_t   nb = eng_q4nx_packed_bytes(kind, Rp, K);
    uint8_t *p = malloc(nb);
    if ((moved && !m) || !p) {
        free(m);
        free(p);
        return wr_fail(c, SVC_ERR_NOMEM, "out of memory for [%zu, %zu]", R, K);
    }
    for (size_t r = 0; moved && r < Rp; r++) {
        size_t src = r % R;
        if (xf == ENG_Q4NX_X_Q_REGROUP) { /* row p*(R/2) + g*hd + h <- g*2hd + p*hd + h */
            size_t half = R / 2, pp = r / half, g = (r % half) / hd, h = r % hd;
            src = g * 2 * hd + pp * hd + h;
        }
        memcpy(m + r * K, x + src * K, K * sizeof *m);
    }
    const float      *rows = moved ? m : x;
    eng_q4nx_raster_t ra = c->w->lay.raster;
    svc_err_t         err = c->w->enc ? c->w->enc(c->w->enc_user, c->hf, kind, ra, rows, Rp, K, p,
                                                  c->errstr, c->errstr_size)
                                      : eng_q4nx_encode_ref(kind, ra, rows, Rp, K, p);
    if (err) {
        free(m);
        free(p);
        return c->w->enc ? err : wr_fail(c, err, "encoding %s failed", eng_q4nx_kind_name(kind));
    }
    if (xf == ENG_Q4NX_X_ROW_DUP) {
        /* The copy holds the dequantized values, as the converter's does, so
         * the §8 alpha probe finds its raster in our files too. */
        char tw[WR_NAME_MAX];
        eng_q4nx_decode_ref(kind, ra, p, P, Q, R, K, m);
        uint64_t shape[2] = {R, K};
        err = eng_q4nx_bf16_name(c->qname, tw, sizeof tw);
        if (!err)
            err = wr_plain(c, tw, ENG_DT_BF16, 2, shape, m, R * K, ENG_Q4NX_X_NONE);
    }
    free(m);
    if (err) {
        free(p);
        return err;
    }
    uint64_t shape[3] = {P, Q, eng_q4nx_tile_bytes(kind)};
    return wr_push(c, c->qname, ENG_DT_I8, 3, shape, p, nb);
}

/* What official Gen-B files hold for a 2-D weight (§2.6): Q8 for alpha,
 * beta, ssm_out (its 2B type is [unconfirmed]; C-37d writes it as 8704-byte
 * Q8 "matching the official") and the tied lm_head; Q4_K elsewhere. The
 * writer's layout may name other kinds for the projections and alpha/beta
 * (a GGUF source's own type, kept by the converter: §2.6). */
static eng_q4nx_kind_t auto_kind(const eng_q4nx_wlayout_t *l, const char *qname,
                                 eng_q4nx_xform_t xf) {
    if (xf == ENG_Q4NX_X_ROW_DUP)
        return l->alpha;
    if (strcmp(qname, "lm_head.weight") == 0)
        return ENG_Q4NX_Q8;
    size_t n = strlen(qname), s = strlen("ssm_out_proj.weight");
    if (n >= s && strcmp(qname + n - s, "ssm_out_proj.weight") == 0)
        return ENG_Q4NX_Q8;
    return l->proj;
}

static svc_err_t wr_check(const wr_ctx_t *c, size_t rank, const uint64_t *dims, const float *x,
                          size_t *numel) {
    uint64_t n = 1;
    size_t   max_rank = eng_q4nx_vision_name(c->hf) ? ENG_ST_MAX_RANK : 3;
    if (rank < 1 || rank > max_rank)
        return wr_fail(c, SVC_ERR_INVALID, "rank %zu, expected 1 to %zu", rank, max_rank);
    for (size_t i = 0; i < rank; i++)
        if (!dims[i] || __builtin_mul_overflow(n, dims[i], &n) || n > SIZE_MAX / 8)
            return wr_fail(c, SVC_ERR_INVALID, "dims[%zu] = %llu is empty or too large", i,
                           (unsigned long long)dims[i]);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return wr_fail(c, SVC_ERR_INVALID, "element %zu is not finite", i);
    *numel = (size_t)n;
    return SVC_OK;
}

/* A vision tensor (§2.7): BF16, the matmul weights tiled (§5). */
static svc_err_t wr_vision(const wr_ctx_t *c, size_t rank, const uint64_t *dims, const float *x,
                           eng_q4nx_xform_t xf, eng_q4nx_kind_t kind) {
    size_t    n = 0;
    svc_err_t err = wr_check(c, rank, dims, x, &n);
    if (err)
        return err;
    if (kind != ENG_Q4NX_AUTO && kind != ENG_Q4NX_BF16)
        return wr_fail(c, SVC_ERR_INVALID, "vision tensors are BF16, not %s (Q4NX.md §2.7)",
                       eng_q4nx_kind_name(kind));
    if (xf != ENG_Q4NX_X_VTILE)
        return wr_plain(c, c->qname, ENG_DT_BF16, (uint32_t)rank, dims, x, n, ENG_Q4NX_X_NONE);
    if (rank != 2)
        return wr_fail(c, SVC_ERR_INVALID, "a tiled vision weight must be 2-D [out, in]");
    uint64_t shape[3];
    eng_q4nx_vision_tiled_shape(dims[0], dims[1], c->w->vis_mm_n, c->w->vis_mm_k, shape);
    uint64_t total = shape[0] * shape[1] * shape[2];
    if (total > SIZE_MAX / 4)
        return wr_fail(c, SVC_ERR_INVALID, "too large");
    uint8_t *d = malloc((size_t)total * 2);
    if (!d)
        return wr_fail(c, SVC_ERR_NOMEM, "out of memory");
    eng_q4nx_vision_tile(x, dims[0], dims[1], c->w->vis_mm_n, c->w->vis_mm_k, shape, d);
    return wr_push(c, c->qname, ENG_DT_BF16, 3, shape, d, (size_t)total * 2);
}

svc_err_t eng_q4nx_writer_add(eng_q4nx_writer_t *w, const char *hf_name, size_t rank,
                              const uint64_t *dims, const float *data, eng_q4nx_kind_t kind,
                              char *errstr, size_t errstr_size) {
    char             qname[WR_NAME_MAX];
    eng_q4nx_xform_t xf;
    wr_ctx_t         c = {w, hf_name, qname, errstr, errstr_size};
    if (eng_q4nx_name_from_hf(hf_name, qname, sizeof qname, &xf))
        return wr_fail(&c, SVC_ERR_INVALID,
                       "not a Qwen3.5 text- or vision-tower name (Q4NX.md §2.3-§2.5, §2.7)");
    if (eng_q4nx_vision_name(hf_name))
        return wr_vision(&c, rank, dims, data, xf, kind);
    bool embed = strcmp(qname, "model.embed_tokens.weight") == 0;
    if (embed) {
        /* Gen-B keeps one tied table: the Q8 lm_head (§0.2, §2.3); Gen-A
         * also the BF16 embedding, added below */
        snprintf(qname, sizeof qname, "lm_head.weight");
        if (wr_has(w, qname))
            return wr_fail(&c, SVC_ERR_INVALID, "the tied lm_head.weight is already written");
    }
    size_t    n = 0;
    svc_err_t err = wr_check(&c, rank, dims, data, &n);
    if (err)
        return err;
    if (embed && w->lay.embed_bf16 && rank == 2) {
        err = wr_plain(&c, "model.embed_tokens.weight", ENG_DT_BF16, 2, dims, data, n,
                       ENG_Q4NX_X_NONE);
        if (err)
            return err;
    }
    if (xf == ENG_Q4NX_X_CONV_T) { /* HF [C, 1, K] -> stored [K, C] BF16 (§2.2) */
        if (!((rank == 3 && dims[1] == 1) || rank == 2))
            return wr_fail(&c, SVC_ERR_INVALID, "conv1d must be [C, 1, K] or [C, K]");
        size_t   C = dims[0], Kt = dims[rank - 1];
        float   *t = malloc(n * sizeof *t);
        uint64_t shape[2] = {Kt, C};
        if (!t)
            return wr_fail(&c, SVC_ERR_NOMEM, "out of memory");
        for (size_t ch = 0; ch < C; ch++)
            for (size_t k = 0; k < Kt; k++)
                t[k * C + ch] = data[ch * Kt + k];
        err = wr_plain(&c, qname, ENG_DT_BF16, 2, shape, t, n, xf);
        free(t);
        return err;
    }
    bool matrix = rank == 2 &&
                  (xf == ENG_Q4NX_X_NONE || xf == ENG_Q4NX_X_ROW_DUP || xf == ENG_Q4NX_X_Q_REGROUP);
    if (kind == ENG_Q4NX_AUTO && matrix)
        kind = auto_kind(&w->lay, qname, xf);
    if (eng_q4nx_kind_packed(kind)) {
        if (!matrix || kind == ENG_Q4NX_Q8_LEGACY)
            return wr_fail(&c, SVC_ERR_INVALID, "cannot be stored as %s", eng_q4nx_kind_name(kind));
        return wr_matrix(&c, dims, data, xf, kind);
    }
    if (xf == ENG_Q4NX_X_Q_REGROUP || xf == ENG_Q4NX_X_ROW_DUP)
        return wr_fail(&c, SVC_ERR_INVALID, "must be a packed 2-D matrix");
    /* ssm_a and ssm_dt.bias are F32 in the file, everything else BF16 (§2.4). */
    bool f32 = xf == ENG_Q4NX_X_NEG_EXP || strstr(qname, "ssm_dt.bias") != NULL;
    if (kind == ENG_Q4NX_F32)
        f32 = true;
    else if (kind == ENG_Q4NX_BF16)
        f32 = false;
    else if (kind != ENG_Q4NX_AUTO)
        return wr_fail(&c, SVC_ERR_INVALID, "kind %s is not written", eng_q4nx_kind_name(kind));
    return wr_plain(&c, qname, f32 ? ENG_DT_F32 : ENG_DT_BF16, (uint32_t)rank, dims, data, n, xf);
}

size_t eng_q4nx_writer_count(const eng_q4nx_writer_t *w) {
    return w->n;
}

void eng_q4nx_writer_tensor(const eng_q4nx_writer_t *w, size_t i, eng_q4nx_wtensor_t *t) {
    SVC_ASSERT(i < w->n);
    const wr_tensor_t *x = &w->t[i];
    *t = (eng_q4nx_wtensor_t){x->name, x->dtype, x->rank, x->shape, x->data, x->nbytes};
}

svc_err_t eng_q4nx_writer_add_encoded(eng_q4nx_writer_t *w, const eng_q4nx_wtensor_t *t,
                                      char *errstr, size_t errstr_size) {
    wr_ctx_t c = {w, t->name, t->name, errstr, errstr_size};
    uint64_t n = t->dtype < ENG_DT_COUNT ? eng_dtype_size(t->dtype) : 0;
    for (uint32_t k = 0; n && k < t->rank && k < ENG_ST_MAX_RANK; k++)
        n = t->shape[k] && n <= UINT64_MAX / t->shape[k] ? n * t->shape[k] : 0;
    if (t->rank > ENG_ST_MAX_RANK || !n || n != t->nbytes)
        return wr_fail(&c, SVC_ERR_INVALID, "%zu bytes for rank %u of %s: not the shape's size",
                       t->nbytes, (unsigned)t->rank,
                       t->dtype < ENG_DT_COUNT ? eng_dtype_name(t->dtype) : "no dtype");
    uint8_t *d = malloc(t->nbytes);
    if (!d)
        return wr_fail(&c, SVC_ERR_NOMEM, "out of memory");
    memcpy(d, t->data, t->nbytes);
    return wr_push(&c, t->name, t->dtype, t->rank, t->shape, d, t->nbytes);
}

/* ---------------------------------------------------------------------
 * finish
 * --------------------------------------------------------------------- */

static int wr_cmp(const void *a, const void *b) {
    return strcmp(((const wr_tensor_t *)a)->name, ((const wr_tensor_t *)b)->name);
}

/* The header object: {name: {dtype, shape, data_offsets}}, keys sorted. */
static char *wr_header(const eng_q4nx_writer_t *w, size_t *len) {
    json_t  *root = json_object();
    uint64_t off = 0;
    for (size_t i = 0; root && i < w->n; i++) {
        const wr_tensor_t *t = &w->t[i];
        json_t            *shape = json_array(), *offs = json_array();
        for (uint32_t k = 0; shape && k < t->rank; k++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
        if (offs) {
            json_array_append_new(offs, json_integer((json_int_t)off));
            json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
        }
        off += t->nbytes;
        json_t *e = json_pack("{s:s, s:o, s:o}", "dtype", eng_dtype_name(t->dtype), "shape", shape,
                              "data_offsets", offs);
        if (!e || json_object_set_new(root, t->name, e)) {
            json_decref(root);
            return NULL;
        }
    }
    char *s = root ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!s)
        return NULL;
    size_t n = strlen(s), padded = (n + 7) / 8 * 8; /* §1: padded with spaces */
    char  *h = realloc(s, padded + 1);
    if (!h) {
        free(s);
        return NULL;
    }
    memset(h + n, ' ', padded - n);
    h[padded] = '\0';
    *len = padded;
    return h;
}

static bool wr_all(FILE *f, const void *p, size_t n) {
    return n == 0 || fwrite(p, 1, n, f) == n;
}

svc_err_t eng_q4nx_writer_finish(eng_q4nx_writer_t *w, const char *path, char *errstr,
                                 size_t errstr_size) {
    qsort(w->t, w->n, sizeof *w->t, wr_cmp);
    size_t hlen = 0;
    char  *h = wr_header(w, &hlen);
    if (!h) {
        svc_errf(errstr, errstr_size, "q4nx writer \"%s\": out of memory for the header", path);
        return SVC_ERR_NOMEM;
    }
    size_t plen = strlen(path) + 5;
    char  *tmp = malloc(plen);
    if (!tmp) {
        free(h);
        return SVC_ERR_NOMEM;
    }
    snprintf(tmp, plen, "%s.tmp", path);
    FILE   *f = fopen(tmp, "wb");
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    bool ok = f && wr_all(f, le, 8) && wr_all(f, h, hlen);
    for (size_t i = 0; ok && i < w->n; i++)
        ok = wr_all(f, w->t[i].data, w->t[i].nbytes);
    int saved = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        svc_errf(errstr, errstr_size, "q4nx writer: writing \"%s\" failed: %s", tmp,
                 strerror(saved));
        unlink(tmp);
    }
    free(tmp);
    free(h);
    return ok ? SVC_OK : SVC_ERR_IO;
}
