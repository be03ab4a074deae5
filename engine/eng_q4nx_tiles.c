/*
 * eng_q4nx_tiles.c -- scalar reference codecs for the Q4NX tiles
 * (eng_q4nx_int.h; Q4NX.md §3, §4, worked offsets in §7).
 *
 * Notation (§3.1): element (r, k) of the logical (R, K) matrix lives in
 * tile t = p*Q + q with p = r / 32, q = k / 256, at tile row rt = r % 32
 * and tile column kt = k % 256; its quant group is g = kt / 32 and the
 * per-(row, group) parameters sit at index s = g*32 + rt.
 *
 * Every byte offset below is a function of (rt, kt) only; the decoders and
 * encoders share those functions so that a layout fix is made once.
 */
#include "eng_q4nx_int.h"
#include "npu.h"

#include <math.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "eng_q4nx_tiles.c assumes a little-endian host"
#endif

/* Largest |x| the encoders take: keeps (max - min) / 15 and the bf16
 * round-up far from overflow. No trained weight comes near it. */
#define ENC_ABS_MAX 1e30f

/* One tile of f32, row-major 32 x 256 (legacy Q8 uses the first 128 columns). */
typedef float tile_f32_t[ENG_Q4NX_ROWS * ENG_Q4NX_COLS];

static const struct {
    const char *name;
    size_t      bytes;
    size_t      cols;
} kinds[ENG_Q4NX_KIND_COUNT] = {
    [ENG_Q4NX_AUTO] = {"auto", 0, 0},
    [ENG_Q4NX_BF16] = {"bf16", 0, 0},
    [ENG_Q4NX_F32] = {"f32", 0, 0},
    [ENG_Q4NX_F16] = {"f16", 0, 0},
    [ENG_Q4NX_Q4_1] = {"q4_1", ENG_Q4NX_B_Q4_1, ENG_Q4NX_COLS},
    [ENG_Q4NX_Q4_K] = {"q4_k", ENG_Q4NX_B_Q4_K, ENG_Q4NX_COLS},
    [ENG_Q4NX_Q8] = {"q8", ENG_Q4NX_B_Q8, ENG_Q4NX_COLS},
    [ENG_Q4NX_Q8_LEGACY] = {"q8_legacy", ENG_Q4NX_B_Q8_LEGACY, ENG_Q4NX_COLS_LEGACY},
    [ENG_Q4NX_Q4_0] = {"q4_0", ENG_Q4NX_B_Q4_1, ENG_Q4NX_COLS},
};

const char *eng_q4nx_kind_name(eng_q4nx_kind_t kind) {
    return (unsigned)kind < ENG_Q4NX_KIND_COUNT ? kinds[kind].name : "?";
}

bool eng_q4nx_kind_packed(eng_q4nx_kind_t kind) {
    return eng_q4nx_tile_bytes(kind) != 0;
}

size_t eng_q4nx_tile_bytes(eng_q4nx_kind_t kind) {
    return (unsigned)kind < ENG_Q4NX_KIND_COUNT ? kinds[kind].bytes : 0;
}

size_t eng_q4nx_tile_cols(eng_q4nx_kind_t kind) {
    return (unsigned)kind < ENG_Q4NX_KIND_COUNT ? kinds[kind].cols : 0;
}

size_t eng_q4nx_packed_bytes(eng_q4nx_kind_t kind, size_t rows, size_t cols) {
    size_t tc = eng_q4nx_tile_cols(kind);
    if (!tc)
        return 0;
    size_t P = (rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS, Q = (cols + tc - 1) / tc;
    return P * Q * eng_q4nx_tile_bytes(kind);
}

/* ---------------------------------------------------------------------
 * bf16
 * --------------------------------------------------------------------- */

static uint32_t f32_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

uint16_t eng_f32_to_bf16(float x) {
    uint32_t b = f32_bits(x);
    if (isnan(x))
        return (uint16_t)((b >> 16) | 0x40u); /* keep it a quiet NaN */
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

uint16_t eng_f32_to_bf16_up(float x) {
    uint32_t b = f32_bits(x);
    uint16_t h = (uint16_t)(b >> 16);
    if (b & 0xffffu)
        h++; /* positive floats order like their bit patterns */
    return h;
}

static float bf16(uint16_t h) {
    return eng_bf16_to_f32(h);
}

static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* The smallest bf16 P >= 0 with P * n >= v (v >= 0 finite): the step that
 * lets n codes reach v. Rounded up, then nudged past float rounding. */
static uint16_t step_up(float v, float n) {
    uint16_t h = eng_f32_to_bf16_up(v / n);
    while (bf16(h) * n < v)
        h++;
    return h;
}

/* Smallest code c in [0, cmax] with step * c >= v (v >= 0). */
static unsigned code_up(float v, float step, unsigned cmax) {
    if (!(step > 0))
        return 0;
    float    f = ceilf(v / step);
    unsigned c = f >= (float)cmax ? cmax : (unsigned)f;
    while (c < cmax && step * (float)c < v)
        c++;
    return c;
}

/* ---------------------------------------------------------------------
 * Byte maps (§3.2, §3.4, §4.2, §4.5)
 * --------------------------------------------------------------------- */

/* Parameter index shared by every kind: group-major, row-minor (§3.2). */
static size_t par_idx(size_t rt, size_t kt) {
    return (kt / ENG_Q4NX_GROUP) * ENG_Q4NX_ROWS + rt;
}

/* Q4_1 nibble byte; the even row is the low nibble in both rasters (§3.2). */
static size_t q41_nib(eng_q4nx_raster_t ra, size_t rt, size_t kt) {
    if (ra == ENG_Q4NX_RASTER_A)
        return 1024 + (rt / 16) * 2048 + kt * 8 + (rt % 16) / 2;
    return 1024 + kt * 16 + rt / 2;
}

/* Q4_K: one raster only, "plain column major" (§3.4). */
static size_t q4k_nib(size_t rt, size_t kt) {
    return 512 + kt * 16 + rt / 2;
}

static size_t q8_code(eng_q4nx_raster_t ra, size_t rt, size_t kt) {
    if (ra == ENG_Q4NX_RASTER_A)
        return 512 + (rt / 16) * 4096 + kt * 16 + rt % 16;
    return 512 + kt * 32 + rt;
}

/* Legacy Q8: 128 columns, raster A with 16-byte column runs per plane (§4.5). */
static size_t q8l_code(size_t rt, size_t kt) {
    return 512 + (rt / 16) * 2048 + kt * 16 + rt % 16;
}

static unsigned get_nib(const uint8_t *t, size_t byte, size_t rt) {
    return (rt & 1) ? (unsigned)(t[byte] >> 4) : (unsigned)(t[byte] & 15u);
}

/* A Q4_0-sourced nibble as the signed code the converter packed (§3.3). */
static int sext4(unsigned n) {
    return (int)(n ^ 8u) - 8;
}

static void put_nib(uint8_t *t, size_t byte, size_t rt, unsigned n) {
    if (rt & 1)
        t[byte] = (uint8_t)((t[byte] & 0x0fu) | (n << 4));
    else
        t[byte] = (uint8_t)((t[byte] & 0xf0u) | n);
}

int eng_q4nx_tile_code(const void *tile, eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, size_t rt,
                       size_t kt) {
    const uint8_t *t = tile;
    switch (kind) {
    case ENG_Q4NX_Q4_1:
        return (int)get_nib(t, q41_nib(raster, rt, kt), rt);
    case ENG_Q4NX_Q4_0:
        return sext4(get_nib(t, q41_nib(raster, rt, kt), rt));
    case ENG_Q4NX_Q4_K:
        return (int)get_nib(t, q4k_nib(rt, kt), rt);
    case ENG_Q4NX_Q8:
        return (int8_t)t[q8_code(raster, rt, kt)];
    case ENG_Q4NX_Q8_LEGACY:
        return (int8_t)t[q8l_code(rt, kt)];
    default:
        SVC_ASSERT(!"eng_q4nx_tile_code: not a packed kind");
        return 0;
    }
}

/* ---------------------------------------------------------------------
 * Decoders: one tile -> 32 x 256 f32 (row-major, stride 256)
 * --------------------------------------------------------------------- */

static void dec_q41(const uint8_t *t, eng_q4nx_raster_t ra, float *o) {
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++)
        for (size_t kt = 0; kt < ENG_Q4NX_COLS; kt++) {
            size_t s = par_idx(rt, kt);
            float  d = bf16(rd16(t + 2 * s)), m = bf16(rd16(t + 512 + 2 * s));
            o[rt * ENG_Q4NX_COLS + kt] = d * (float)get_nib(t, q41_nib(ra, rt, kt), rt) + m;
        }
}

/* Q4_0-sourced: the Q4_1 byte map, W = d*s, no min (§3.3). */
static void dec_q40(const uint8_t *t, eng_q4nx_raster_t ra, float *o) {
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++)
        for (size_t kt = 0; kt < ENG_Q4NX_COLS; kt++) {
            float d = bf16(rd16(t + 2 * par_idx(rt, kt)));
            o[rt * ENG_Q4NX_COLS + kt] = d * (float)sext4(get_nib(t, q41_nib(ra, rt, kt), rt));
        }
}

/* W = S*s8*n + M*m8, M already negated (§3.4); the products are taken in
 * this order by the encoder too, so its range check matches. */
static void dec_q4k(const uint8_t *t, float *o) {
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++) {
        float S = bf16(rd16(t + 4608 + 2 * rt)), M = bf16(rd16(t + 4672 + 2 * rt));
        for (size_t kt = 0; kt < ENG_Q4NX_COLS; kt++) {
            size_t s = par_idx(rt, kt);
            float  sc = S * (float)t[s], mn = M * (float)t[256 + s];
            o[rt * ENG_Q4NX_COLS + kt] = sc * (float)get_nib(t, q4k_nib(rt, kt), rt) + mn;
        }
    }
}

static void dec_q8(const uint8_t *t, eng_q4nx_raster_t ra, float *o) {
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++)
        for (size_t kt = 0; kt < ENG_Q4NX_COLS; kt++) {
            float d = bf16(rd16(t + 2 * par_idx(rt, kt)));
            o[rt * ENG_Q4NX_COLS + kt] = d * (float)(int8_t)t[q8_code(ra, rt, kt)];
        }
}

/* Bytes [256, 512) repeat the scales and [4608, 5120) are padding (§4.5). */
static void dec_q8l(const uint8_t *t, float *o) {
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++)
        for (size_t kt = 0; kt < ENG_Q4NX_COLS_LEGACY; kt++) {
            float d = bf16(rd16(t + 2 * par_idx(rt, kt)));
            o[rt * ENG_Q4NX_COLS + kt] = d * (float)(int8_t)t[q8l_code(rt, kt)];
        }
}

static void dec_tile(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, const uint8_t *t, float *o) {
    switch (kind) {
    case ENG_Q4NX_Q4_1:
        dec_q41(t, ra, o);
        break;
    case ENG_Q4NX_Q4_0:
        dec_q40(t, ra, o);
        break;
    case ENG_Q4NX_Q4_K:
        dec_q4k(t, o);
        break;
    case ENG_Q4NX_Q8:
        dec_q8(t, ra, o);
        break;
    case ENG_Q4NX_Q8_LEGACY:
        dec_q8l(t, o);
        break;
    default:
        SVC_ASSERT(!"eng_q4nx_decode_ref: not a packed kind");
    }
}

/* Both decoders split a matrix by its row blocks of 32 (tile rows p) over
 * the kernels' pool: at load they are most of the work of a q4nx package
 * (nano: 2.4 s of 11 on one Zen 4 core), and every block writes its own
 * rows of the output. */
typedef struct dec_job {
    eng_q4nx_kind_t   kind;
    eng_q4nx_raster_t raster;
    const uint8_t    *base;
    size_t            Q, rows, cols, tb, tc;
    float            *out;   /* eng_q4nx_decode_ref */
    uint8_t          *u;     /* eng_q4nx_decode_groups_ref: */
    float            *d, *m; /* codes and group parameters */
} dec_job_t;

/* The job of a (rows, cols) decode of P x Q tiles, its outputs unset. */
static dec_job_t dec_job(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const void *packed,
                         size_t P, size_t Q, size_t rows, size_t cols) {
    size_t tb = eng_q4nx_tile_bytes(kind), tc = eng_q4nx_tile_cols(kind);
    SVC_ASSERT(tb && rows <= P * ENG_Q4NX_ROWS && cols <= Q * tc);
    return (dec_job_t){.kind = kind,
                       .raster = raster,
                       .base = packed,
                       .Q = Q,
                       .rows = rows,
                       .cols = cols,
                       .tb = tb,
                       .tc = tc};
}

/* Row block p of an fp32 decode. */
static void dec_block(void *ctx, size_t p) {
    const dec_job_t *j = ctx;
    float           *tile = malloc(sizeof(tile_f32_t));
    SVC_ASSERT(tile); /* 32 KiB */
    for (size_t q = 0; q * j->tc < j->cols; q++) {
        dec_tile(j->kind, j->raster, j->base + (p * j->Q + q) * j->tb, tile);
        size_t nr = j->rows - p * ENG_Q4NX_ROWS, nc = j->cols - q * j->tc;
        nr = nr < ENG_Q4NX_ROWS ? nr : ENG_Q4NX_ROWS;
        nc = nc < j->tc ? nc : j->tc;
        for (size_t rt = 0; rt < nr; rt++)
            memcpy(j->out + (p * ENG_Q4NX_ROWS + rt) * j->cols + q * j->tc,
                   tile + rt * ENG_Q4NX_COLS, nc * sizeof *j->out);
    }
    free(tile);
}

void eng_q4nx_decode_ref(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const void *packed,
                         size_t P, size_t Q, size_t rows, size_t cols, float *out) {
    dec_job_t j = dec_job(kind, raster, packed, P, Q, rows, cols);
    j.out = out;
    npu_parallel_for((rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS, dec_block, &j);
}

/* ---------------------------------------------------------------------
 * Group decoder: one tile -> codes and per-group (d, m), w = d*u + m
 * --------------------------------------------------------------------- */

/* Tile rows [0, nr) and columns [0, nc) into u (row stride ucols, column
 * offset uc0) and groups [0, ceil(nc / 32)) into d, m (row stride G,
 * group offset g0). Q8's signed code c becomes u = c + 128 with m = -128 d:
 * d*u + m is then d*c exactly (both products and the sum fit bf16's 8 bits
 * times 8 bits), as dec_q8 gives it; a Q4_0-sourced code s likewise
 * u = s + 8 with m = -8 d. */
typedef struct grp_out {
    uint8_t *u;
    float   *d, *m;
    size_t   ucols, uc0, G, g0;
} grp_out_t;

static void dgrp_par(const uint8_t *t, eng_q4nx_kind_t kind, size_t rt, size_t gi, float *d,
                     float *m) {
    size_t s = gi * ENG_Q4NX_ROWS + rt;
    if (kind == ENG_Q4NX_Q4_1) {
        *d = bf16(rd16(t + 2 * s));
        *m = bf16(rd16(t + 512 + 2 * s));
    } else if (kind == ENG_Q4NX_Q4_K) {
        *d = bf16(rd16(t + 4608 + 2 * rt)) * (float)t[s];
        *m = bf16(rd16(t + 4672 + 2 * rt)) * (float)t[256 + s];
    } else if (kind == ENG_Q4NX_Q4_0) {
        *d = bf16(rd16(t + 2 * s));
        *m = -8.0f * *d;
    } else { /* Q8, legacy Q8 */
        *d = bf16(rd16(t + 2 * s));
        *m = -128.0f * *d;
    }
}

/* eng_q4nx_tile_code shifted to an unsigned byte, written out: at load it
 * runs once per weight, and the call through the kind switch cost 0.9 s
 * of the nano package's 3.2 s load. */
static uint8_t dgrp_code(const uint8_t *t, eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, size_t rt,
                         size_t kt) {
    switch (kind) {
    case ENG_Q4NX_Q4_1:
        return (uint8_t)get_nib(t, q41_nib(ra, rt, kt), rt);
    case ENG_Q4NX_Q4_0:
        return (uint8_t)(get_nib(t, q41_nib(ra, rt, kt), rt) ^ 8u); /* s + 8 */
    case ENG_Q4NX_Q4_K:
        return (uint8_t)get_nib(t, q4k_nib(rt, kt), rt);
    case ENG_Q4NX_Q8:
        return (uint8_t)(t[q8_code(ra, rt, kt)] ^ 0x80u); /* (int8) c + 128 */
    default:
        return (uint8_t)(t[q8l_code(rt, kt)] ^ 0x80u);
    }
}

static void dgrp_tile(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, const uint8_t *t, size_t r0,
                      size_t nr, size_t nc, const grp_out_t *o) {
    for (size_t rt = 0; rt < nr; rt++) {
        uint8_t *ur = o->u + (r0 + rt) * o->ucols + o->uc0;
        for (size_t kt = 0; kt < nc; kt++)
            ur[kt] = dgrp_code(t, kind, ra, rt, kt);
        for (size_t gi = 0; gi * ENG_Q4NX_GROUP < nc; gi++)
            dgrp_par(t, kind, rt, gi, &o->d[(r0 + rt) * o->G + o->g0 + gi],
                     &o->m[(r0 + rt) * o->G + o->g0 + gi]);
    }
}

/* Row block p of a group decode. */
static void dgrp_block(void *ctx, size_t p) {
    const dec_job_t *j = ctx;
    size_t           G = (j->cols + ENG_Q4NX_GROUP - 1) / ENG_Q4NX_GROUP;
    for (size_t q = 0; q * j->tc < j->cols; q++) {
        size_t    nr = j->rows - p * ENG_Q4NX_ROWS, nc = j->cols - q * j->tc;
        grp_out_t o = {j->u, j->d, j->m, j->cols, q * j->tc, G, q * j->tc / ENG_Q4NX_GROUP};
        dgrp_tile(j->kind, j->raster, j->base + (p * j->Q + q) * j->tb, p * ENG_Q4NX_ROWS,
                  nr < ENG_Q4NX_ROWS ? nr : ENG_Q4NX_ROWS, nc < j->tc ? nc : j->tc, &o);
    }
}

void eng_q4nx_decode_groups_ref(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const void *packed,
                                size_t P, size_t Q, size_t rows, size_t cols, uint8_t *u, float *d,
                                float *m) {
    if (kind == ENG_Q4NX_Q4_K)
        raster = ENG_Q4NX_RASTER_B;
    dec_job_t j = dec_job(kind, raster, packed, P, Q, rows, cols);
    j.u = u, j.d = d, j.m = m;
    npu_parallel_for((rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS, dgrp_block, &j);
}

/* ---------------------------------------------------------------------
 * Encoders: f32 -> one tile, zero padding outside (rows, cols)
 * --------------------------------------------------------------------- */

/* Copies tile (p, q) of w into a zero-padded 32 x 256 block. */
static void gather(const float *w, size_t rows, size_t cols, size_t p, size_t q, float *blk) {
    memset(blk, 0, sizeof(tile_f32_t));
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS && p * ENG_Q4NX_ROWS + rt < rows; rt++) {
        size_t k0 = q * ENG_Q4NX_COLS, nc = cols - k0;
        nc = nc < ENG_Q4NX_COLS ? nc : ENG_Q4NX_COLS;
        memcpy(blk + rt * ENG_Q4NX_COLS, w + (p * ENG_Q4NX_ROWS + rt) * cols + k0,
               nc * sizeof *blk);
    }
}

static bool values_ok(const float *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(w[i]) <= ENC_ABS_MAX)) /* false for NaN too */
            return false;
    return true;
}

static void group_range(const float *x, float *lo, float *hi) {
    *lo = *hi = x[0];
    for (size_t j = 1; j < ENG_Q4NX_GROUP; j++) {
        *lo = fminf(*lo, x[j]);
        *hi = fmaxf(*hi, x[j]);
    }
}

/* Nearest of the 16 levels sc*n + mn (sc > 0), clipped to [0, 15]. */
static unsigned nearest4(float x, float sc, float mn) {
    if (!(sc > 0))
        return 0;
    float f = roundf((x - mn) / sc);
    return f <= 0 ? 0 : f >= 15 ? 15 : (unsigned)f;
}

/* sum imp (x - level)^2 over a group on the 16 levels spanning [lo, hi]
 * (hi > lo, and at least 1/64 of the group's span so that the codes
 * stay far inside int32), each x on its nearest level (as nearest4, up to
 * ties: the search only compares errors). Written for the compiler to
 * vectorise (branch-free clamps): the search below runs it ~25 times per
 * group of every matrix. */
static float clip_err(const float *x, const float *imp, float lo, float hi) {
    float sc = (hi - lo) / 15.0f, inv = 15.0f / (hi - lo), t[ENG_Q4NX_GROUP], e = 0;
    for (size_t j = 0; j < ENG_Q4NX_GROUP; j++) { /* no reduction: vectorised */
        int32_t c = (int32_t)((x[j] - lo) * inv + 0.5f), o;
        c &= ~(c >> 31);                 /* max(c, 0), without a branch */
        o = c - 15, c -= o & ~(o >> 31); /* min(c, 15) */
        float v = (float)c * sc + lo - x[j];
        t[j] = imp[j] * v * v;
    }
    for (size_t j = 0; j < ENG_Q4NX_GROUP; j++)
        e += t[j];
    return e;
}

#define CLIP_STEPS 8     /* trims tried at each end */
#define CLIP_STEP  0.02f /* of the group's range per trim */

/* The best of the trims a = 0 .. CLIP_STEPS - 1 at the low end (high:
 * false) or the high end, the other end's kept, into *lo or *hi. */
static float clip_end(const float *x, const float *imp, bool zero_in, float r0, float lo0,
                      float hi0, bool high, float *lo, float *hi, float best) {
    for (int a = 1; a < CLIP_STEPS; a++) {
        float l = high ? *lo : lo0 + CLIP_STEP * (float)a * r0;
        float h = high ? hi0 - CLIP_STEP * (float)a * r0 : *hi;
        if ((zero_in && l > 0.0f) || !(h > l))
            continue;
        float e = clip_err(x, imp, l, h);
        if (e < best)
            best = e, *lo = l, *hi = h;
    }
    return best;
}

/* The range a group's 16 levels span: [min, max] without importances (the
 * encoders' own, nothing clipped); with them (imp, one per element; GPTQ
 * passes its Hessian's diagonal, the weight of each input in the output
 * error) the range that makes sum imp (x - level)^2 small: each end
 * trimmed by 0 to 14% of the range in steps of 2% (low, high, low again:
 * a coordinate search, within 0.5% of trying all 64 pairs on the
 * fixtures), then the two levels refitted to the codes by weighted least
 * squares, twice. A few clipped outliers buy a finer step for the rest,
 * as in llama.cpp's imatrix quantisation (make_qkx2_quants). zero_in:
 * the range must contain 0 (Q4_K's min is <= 0). */
static void group_clip(const float *x, const float *imp, bool zero_in, float *lo, float *hi) {
    group_range(x, lo, hi);
    if (zero_in)
        *lo = fminf(*lo, 0.0f);
    if (!imp || !(*hi > *lo))
        return;
    float r = *hi - *lo, lo0 = *lo, hi0 = *hi, blo = *lo, bhi = *hi;
    float best = clip_err(x, imp, blo, bhi);
    best = clip_end(x, imp, zero_in, r, lo0, hi0, false, &blo, &bhi, best);
    best = clip_end(x, imp, zero_in, r, lo0, hi0, true, &blo, &bhi, best);
    best = clip_end(x, imp, zero_in, r, lo0, hi0, false, &blo, &bhi, best);
    for (int it = 0; it < 2; it++) { /* the levels refitted to the codes, weighted least squares */
        float  sc = (bhi - blo) / 15.0f;
        double sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
        for (size_t j = 0; j < ENG_Q4NX_GROUP; j++) {
            double L = (double)nearest4(x[j], sc, blo), w = imp[j];
            sw += w, sl += w * L, sll += w * L * L, sx += w * x[j], slx += w * L * x[j];
        }
        double det = sw * sll - sl * sl, d, m;
        if (!(det > 0))
            break;
        d = (sw * slx - sl * sx) / det, m = (sll * sx - sl * slx) / det;
        if (zero_in && m > 0)
            m = 0, d = sll > 0 ? slx / sll : 0;
        if (!(d > 0) || 15.0 * 64.0 * d < r) /* also keeps clip_err's codes within int32 */
            break;
        float e = clip_err(x, imp, (float)m, (float)(m + 15 * d));
        if (!(e < best))
            break;
        best = e, blo = (float)m, bhi = (float)(m + 15 * d);
    }
    *lo = blo, *hi = bhi;
}

/* Each row fit below writes one tile row's parameters and returns its 8
 * groups' levels: code c decodes to d[g] * c + m[g] (m 0 for the signed
 * kinds), the very products the decoders take. The codes are then chosen
 * by code_near (the encoders' rounding) or by the caller
 * (eng_q4nx_encode_col: GPTQ). */

/* One Q4_K row of the tile: the 8 groups' mins u_j = -min(0, min x) and
 * steps are fitted on a bf16 super-scale with 8-bit codes, as in ggml's
 * Q4_K (min clamped to <= 0) and the converter's refit (§3.4 step 3), but
 * rounded outward (mins down, steps up) so no element is ever clipped. */
static void fit_q4k_row(const float *x, const float *imp, size_t rt, uint8_t *t, float *d,
                        float *m) {
    float lo[8], hi[8], umax = 0;
    for (size_t g = 0; g < 8; g++) {
        group_clip(x + g * ENG_Q4NX_GROUP, imp ? imp + g * ENG_Q4NX_GROUP : NULL, true, &lo[g],
                   &hi[g]);
        umax = fmaxf(umax, -lo[g]);
    }
    uint16_t hm = step_up(umax, 255.0f);
    float    P = bf16(hm), M = -P, need[8], smax = 0;
    for (size_t g = 0; g < 8; g++) {
        unsigned m8 = code_up(-lo[g], P, 255);
        t[256 + g * ENG_Q4NX_ROWS + rt] = (uint8_t)m8;
        m[g] = M * (float)m8;
        need[g] = (hi[g] - m[g]) / 15.0f;
        smax = fmaxf(smax, need[g]);
    }
    uint16_t hs = step_up(smax, 255.0f);
    float    S = bf16(hs);
    wr16(t + 4608 + 2 * rt, hs);
    wr16(t + 4672 + 2 * rt, eng_f32_to_bf16(M)); /* exact: M is a bf16 */
    for (size_t g = 0; g < 8; g++) {
        unsigned s8 = code_up(need[g], S, 255);
        t[g * ENG_Q4NX_ROWS + rt] = (uint8_t)s8;
        d[g] = S * (float)s8;
    }
}

/* gguf-py's Q4_1 (m = min, d = (max - min) / 15) with m rounded down and
 * d up to bf16 so that the 16 levels still span [min, max] (§3.3). */
static void fit_q41_row(const float *x, const float *imp, size_t rt, uint8_t *t, float *d,
                        float *m) {
    for (size_t g = 0; g < 8; g++) {
        float lo, hi;
        group_clip(x + g * ENG_Q4NX_GROUP, imp ? imp + g * ENG_Q4NX_GROUP : NULL, false, &lo, &hi);
        uint16_t hm = lo >= 0 ? (uint16_t)(f32_bits(lo) >> 16) : eng_f32_to_bf16_up(-lo) ^ 0x8000u;
        m[g] = bf16(hm);
        uint16_t hd = step_up(hi - m[g], 15.0f);
        d[g] = bf16(hd);
        size_t s = g * ENG_Q4NX_ROWS + rt;
        wr16(t + 2 * s, hd);
        wr16(t + 512 + 2 * s, hm);
    }
}

/* ggml's reference Q4_0: d = v / -8 for v the value of largest magnitude,
 * code round(x / d) clipped to [-8, 7]; |d| rounded up to bf16 so that v
 * still gets -8 and nothing else passes it. Mins stay 0 (§3.3). */
static void fit_q40_row(const float *x, size_t rt, uint8_t *t, float *d, float *m) {
    for (size_t g = 0; g < 8; g++) {
        const float *xg = x + g * ENG_Q4NX_GROUP;
        float        v = 0;
        for (size_t j = 0; j < ENG_Q4NX_GROUP; j++)
            if (fabsf(xg[j]) > fabsf(v))
                v = xg[j];
        uint16_t hd = step_up(fabsf(v), 8.0f);
        if (v > 0)
            hd ^= 0x8000u; /* d = v / -8 */
        d[g] = bf16(hd);
        m[g] = 0;
        wr16(t + 2 * (g * ENG_Q4NX_ROWS + rt), hd);
    }
}

/* gguf-py Q8_0 (d = max|x| / 127, c = round(x / d)) with d rounded up to
 * bf16 first, so |c| <= 127 without clipping (§4.3). */
static void fit_q8_row(const float *x, size_t rt, uint8_t *t, float *d, float *m) {
    for (size_t g = 0; g < 8; g++) {
        const float *xg = x + g * ENG_Q4NX_GROUP;
        float        amax = 0;
        for (size_t j = 0; j < ENG_Q4NX_GROUP; j++)
            amax = fmaxf(amax, fabsf(xg[j]));
        uint16_t hd = step_up(amax, 127.0f);
        d[g] = bf16(hd);
        m[g] = 0;
        wr16(t + 2 * (g * ENG_Q4NX_ROWS + rt), hd);
    }
}

int eng_q4nx_code_near(eng_q4nx_kind_t kind, float x, float d, float m) {
    float c;
    switch (kind) {
    case ENG_Q4NX_Q4_1:
    case ENG_Q4NX_Q4_K:
        return (int)nearest4(x, d, m);
    case ENG_Q4NX_Q4_0:
        c = d != 0 ? roundf(x / d) : 0;
        return (int)(c < -8 ? -8 : c > 7 ? 7 : c);
    case ENG_Q4NX_Q8:
        c = d > 0 ? roundf(x / d) : 0;
        return (int)(c < -127 ? -127 : c > 127 ? 127 : c);
    default:
        SVC_ASSERT(!"eng_q4nx_code_near: not an encoded kind");
        return 0;
    }
}

float eng_q4nx_code_value(eng_q4nx_kind_t kind, int c, float d, float m) {
    if (kind == ENG_Q4NX_Q4_0 || kind == ENG_Q4NX_Q8)
        return d * (float)c;
    return d * (float)c + m;
}

/* Code c of tile row rt, tile column kt into tile t (zeroed codes before). */
static void put_code(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, uint8_t *t, size_t rt, size_t kt,
                     int c) {
    switch (kind) {
    case ENG_Q4NX_Q4_1:
        put_nib(t, q41_nib(ra, rt, kt), rt, (unsigned)c);
        break;
    case ENG_Q4NX_Q4_0:
        put_nib(t, q41_nib(ra, rt, kt), rt, (unsigned)c & 15u);
        break;
    case ENG_Q4NX_Q4_K:
        put_nib(t, q4k_nib(rt, kt), rt, (unsigned)c);
        break;
    default: /* Q8 */
        t[q8_code(ra, rt, kt)] = (uint8_t)(int8_t)c;
    }
}

void eng_q4nx_code_put(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, void *packed, size_t Q,
                       size_t r, size_t k, int c) {
    uint8_t *t = (uint8_t *)packed +
                 ((r / ENG_Q4NX_ROWS) * Q + k / ENG_Q4NX_COLS) * eng_q4nx_tile_bytes(kind);
    if (kind == ENG_Q4NX_Q4_K)
        raster = ENG_Q4NX_RASTER_B;
    put_code(kind, raster, t, r % ENG_Q4NX_ROWS, k % ENG_Q4NX_COLS, c);
}

/* One tile (p, q) of w: parameters of each row fitted, codes rounded to
 * nearest; the levels of its rows' groups into d, m (rows 32p.., stride 8)
 * when given. */
static void encode_tile(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, const float *w, size_t rows,
                        size_t cols, size_t p, size_t q, uint8_t *t, float *blk, const float *imp,
                        float *d, float *m) {
    memset(t, 0, eng_q4nx_tile_bytes(kind));
    gather(w, rows, cols, p, q, blk);
    for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++) {
        const float *x = blk + rt * ENG_Q4NX_COLS;
        float        dr[8], mr[8];
        if (kind == ENG_Q4NX_Q4_K)
            fit_q4k_row(x, imp, rt, t, dr, mr);
        else if (kind == ENG_Q4NX_Q4_1)
            fit_q41_row(x, imp, rt, t, dr, mr);
        else if (kind == ENG_Q4NX_Q4_0)
            fit_q40_row(x, rt, t, dr, mr);
        else
            fit_q8_row(x, rt, t, dr, mr);
        for (size_t kt = 0; kt < ENG_Q4NX_COLS; kt++) {
            size_t g = kt / ENG_Q4NX_GROUP;
            put_code(kind, ra, t, rt, kt, eng_q4nx_code_near(kind, x[kt], dr[g], mr[g]));
        }
        if (d) {
            memcpy(d + (p * ENG_Q4NX_ROWS + rt) * 8, dr, sizeof dr);
            memcpy(m + (p * ENG_Q4NX_ROWS + rt) * 8, mr, sizeof mr);
        }
    }
}

static bool encoded_kind(eng_q4nx_kind_t kind) {
    return kind == ENG_Q4NX_Q4_1 || kind == ENG_Q4NX_Q4_0 || kind == ENG_Q4NX_Q4_K ||
           kind == ENG_Q4NX_Q8;
}

svc_err_t eng_q4nx_encode_col(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const float *w,
                              size_t rows, size_t cols, size_t q, void *packed, float *d,
                              float *m) {
    return eng_q4nx_encode_col_imp(kind, raster, w, rows, cols, q, NULL, packed, d, m);
}

svc_err_t eng_q4nx_encode_col_imp(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const float *w,
                                  size_t rows, size_t cols, size_t q, const float *imp,
                                  void *packed, float *d, float *m) {
    size_t P = (rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS;
    size_t Q = (cols + ENG_Q4NX_COLS - 1) / ENG_Q4NX_COLS;
    if (!encoded_kind(kind) || q >= Q)
        return SVC_ERR_INVALID;
    if (kind == ENG_Q4NX_Q4_K)
        raster = ENG_Q4NX_RASTER_B;
    for (size_t r = 0; r < rows; r++)
        if (!values_ok(w + r * cols + q * ENG_Q4NX_COLS, cols - q * ENG_Q4NX_COLS < ENG_Q4NX_COLS
                                                             ? cols - q * ENG_Q4NX_COLS
                                                             : ENG_Q4NX_COLS))
            return SVC_ERR_INVALID;
    float *blk = malloc(sizeof(tile_f32_t)), ti[ENG_Q4NX_COLS] = {0};
    if (!blk)
        return SVC_ERR_NOMEM;
    if (imp) /* the tile column's, zero past cols */
        memcpy(
            ti, imp + q * ENG_Q4NX_COLS,
            (cols - q * ENG_Q4NX_COLS < ENG_Q4NX_COLS ? cols - q * ENG_Q4NX_COLS : ENG_Q4NX_COLS) *
                sizeof *ti);
    size_t tb = eng_q4nx_tile_bytes(kind);
    for (size_t p = 0; p < P; p++)
        encode_tile(kind, raster, w, rows, cols, p, q, (uint8_t *)packed + (p * Q + q) * tb, blk,
                    imp ? ti : NULL, d, m);
    free(blk);
    return SVC_OK;
}

static svc_err_t encode(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, const float *w, size_t rows,
                        size_t cols, void *packed) {
    if (!values_ok(w, rows * cols))
        return SVC_ERR_INVALID;
    size_t tb = eng_q4nx_tile_bytes(kind);
    size_t P = (rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS;
    size_t Q = (cols + ENG_Q4NX_COLS - 1) / ENG_Q4NX_COLS;
    float *blk = malloc(sizeof(tile_f32_t));
    if (!blk)
        return SVC_ERR_NOMEM;
    uint8_t *base = packed;
    for (size_t p = 0; p < P; p++)
        for (size_t q = 0; q < Q; q++)
            encode_tile(kind, ra, w, rows, cols, p, q, base + (p * Q + q) * tb, blk, NULL, NULL,
                        NULL);
    free(blk);
    return SVC_OK;
}

svc_err_t eng_q4nx_encode_q4k_ref(const float *w, size_t rows, size_t cols, void *packed) {
    return encode(ENG_Q4NX_Q4_K, ENG_Q4NX_RASTER_B, w, rows, cols, packed);
}

svc_err_t eng_q4nx_encode_q8_ref(const float *w, size_t rows, size_t cols, eng_q4nx_raster_t raster,
                                 void *packed) {
    return encode(ENG_Q4NX_Q8, raster, w, rows, cols, packed);
}

svc_err_t eng_q4nx_encode_q41_ref(const float *w, size_t rows, size_t cols,
                                  eng_q4nx_raster_t raster, void *packed) {
    return encode(ENG_Q4NX_Q4_1, raster, w, rows, cols, packed);
}

svc_err_t eng_q4nx_encode_ref(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const float *w,
                              size_t rows, size_t cols, void *packed) {
    if (!encoded_kind(kind))
        return SVC_ERR_INVALID;
    return encode(kind, kind == ENG_Q4NX_Q4_K ? ENG_Q4NX_RASTER_B : raster, w, rows, cols, packed);
}
