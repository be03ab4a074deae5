/*
 * eng_q4nx_layout.c -- what a model.q4nx leaves unsaid, decided from the
 * file itself or refused (eng_q4nx_int.h "Layouts the file does not name";
 * Q4NX.md §3.2, §3.3, §4.2, §8, §8.1).
 *
 * Why this exists: FastFlowLM's public converter writes Q4_1 tiles in two
 * code orders depending on its revision, keeps a Q4_0 source's signed
 * codes in the same 5120-byte tiles, and records none of it. A reader that
 * guesses from the generation reads such files as plausible nonsense
 * (cosine 0.025 to the true weights, with `inspect` saying ok). Every
 * decision below rests on bytes of the file; where they settle nothing the
 * file is refused with the setting that would.
 *
 * Cost: the Q4_1/Q4_0 test reads every group's two parameters (a fifth of
 * the 5120-byte tensors); the code vote reads at most CODE_TILES tiles per
 * tensor; the twin votes decode at most TWIN_ROWS rows.
 */
#include "eng_q4nx_int.h"

#include <math.h>

#define TWIN_RATIO 4.0  /* one order at least this much closer to the twin */
#define TWIN_ROWS  256  /* rows of lm_head compared with the embedding */
#define CODE_TILES 16   /* tiles sampled per tensor for the code vote */
#define CODE_MIN   0.95 /* share of groups the right order must reach */
#define CODE_LEAD  0.10 /* and its lead over the other */
#define MAX_VOTES  8    /* kept per family; the count goes on */
#define LNAME      "model.layers."

static const char *const FAM_NAME[ENG_Q4NX_FAM_COUNT] = {"q4", "q8"};
static const char *const FAM_WHAT[ENG_Q4NX_FAM_COUNT] = {"5120-byte Q4_1/Q4_0", "8704-byte Q8"};

void eng_q4nx_layout_none(eng_q4nx_layout_t *l) {
    l->raster[ENG_Q4NX_FAM_Q4] = -1;
    l->raster[ENG_Q4NX_FAM_Q8] = -1;
    l->q4_signed = -1;
}

/* ---------------------------------------------------------------------
 * --q4nx-layout
 * --------------------------------------------------------------------- */

static bool part_is(const char *p, size_t len, const char *key, const char **val) {
    size_t k = strlen(key);
    if (len <= k || strncmp(p, key, k) != 0 || p[k] != '=')
        return false;
    *val = p + k + 1;
    return true;
}

static bool val_is(const char *v, size_t vlen, const char *want) {
    return vlen == strlen(want) && strncasecmp(v, want, vlen) == 0;
}

/* One "key=value" of the setting into *l. */
static svc_err_t parse_part(const char *p, size_t len, eng_q4nx_layout_t *l, char *errstr,
                            size_t n) {
    const char *v = NULL;
    int        *slot = NULL, val = -1;
    if (part_is(p, len, "q4", &v) || part_is(p, len, "q8", &v)) {
        slot = &l->raster[p[1] == '4' ? ENG_Q4NX_FAM_Q4 : ENG_Q4NX_FAM_Q8];
        size_t vl = len - (size_t)(v - p);
        val = val_is(v, vl, "A") ? ENG_Q4NX_RASTER_A : val_is(v, vl, "B") ? ENG_Q4NX_RASTER_B : -1;
    } else if (part_is(p, len, "q4-codes", &v)) {
        slot = &l->q4_signed;
        size_t vl = len - (size_t)(v - p);
        val = val_is(v, vl, "signed") ? 1 : val_is(v, vl, "unsigned") ? 0 : -1;
    }
    if (!slot || val < 0) {
        svc_errf(errstr, n,
                 "--q4nx-layout: \"%.*s\": expected q4=A|B, q8=A|B or q4-codes=signed|unsigned",
                 (int)len, p);
        return SVC_ERR_INVALID;
    }
    if (*slot >= 0) {
        svc_errf(errstr, n, "--q4nx-layout: \"%.*s\" settles a layout already set", (int)len, p);
        return SVC_ERR_INVALID;
    }
    *slot = val;
    return SVC_OK;
}

svc_err_t eng_q4nx_layout_parse(const char *spec, eng_q4nx_layout_t *out, char *errstr,
                                size_t errstr_size) {
    eng_q4nx_layout_none(out);
    for (const char *p = spec; p && *p;) {
        const char *e = strchr(p, ',');
        size_t      len = e ? (size_t)(e - p) : strlen(p);
        svc_err_t   err = parse_part(p, len, out, errstr, errstr_size);
        if (err) {
            eng_q4nx_layout_none(out);
            return err;
        }
        p = e ? e + 1 : p + len;
    }
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * Q4_1 or Q4_0 codes (§3.2, §3.3)
 * --------------------------------------------------------------------- */

static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Group parameters of a 5120-byte tensor: how many groups have a nonzero
 * min, a nonzero scale, a negative one (bf16 sign bits; -0 counts as 0). */
typedef struct q4_pars {
    size_t groups, m_nonzero, d_nonzero, d_neg;
} q4_pars_t;

static q4_pars_t q4_scan(const eng_st_tensor_t *t) {
    q4_pars_t      c = {0};
    const uint8_t *b = t->data;
    for (size_t tile = 0; tile < t->nbytes / ENG_Q4NX_B_Q4_1; tile++, b += ENG_Q4NX_B_Q4_1)
        for (size_t s = 0; s < 256; s++) {
            uint16_t d = rd16(b + 2 * s), m = rd16(b + 512 + 2 * s);
            c.groups++;
            c.m_nonzero += (m & 0x7fffu) != 0;
            c.d_nonzero += (d & 0x7fffu) != 0;
            c.d_neg += (d & 0x7fffu) != 0 && (d & 0x8000u);
        }
    return c;
}

/* Q4_1 (d >= 0, mins below 0) or Q4_0-sourced (mins 0, d of either sign). */
static svc_err_t q4_codes(const eng_st_t *st, eng_q4nx_info_t *in, int forced, char *errstr,
                          size_t n) {
    q4_pars_t c = q4_scan(in->st);
    int       is_signed = c.m_nonzero ? 0 : c.d_neg ? 1 : !c.d_nonzero ? 0 : -1;
    if (c.m_nonzero && c.d_neg)
        return eng_q4nx_failf(
            st, errstr, n,
            "tensor \"%s\": 5120-byte tiles with nonzero mins (Q4_1) and negative "
            "scales (Q4_0 codes) in %zu and %zu of %zu groups: neither layout "
            "(Q4NX.md §3.2, §3.3)",
            in->name, c.m_nonzero, c.d_neg, c.groups);
    if (is_signed < 0 && forced < 0)
        return eng_q4nx_failf(
            st, errstr, n,
            "tensor \"%s\": every min is 0 and every scale positive, so its codes may "
            "be Q4_1's (unsigned) or a Q4_0 source's (signed, Q4NX.md §3.3), which "
            "decode differently, and the file does not say which; pass --q4nx-layout "
            "q4-codes=unsigned or q4-codes=signed",
            in->name);
    if (is_signed >= 0 && forced >= 0 && forced != is_signed)
        return eng_q4nx_failf(st, errstr, n,
                              "tensor \"%s\": --q4nx-layout q4-codes=%s contradicts the file: %s",
                              in->name, forced ? "signed" : "unsigned",
                              is_signed ? "every min is 0 and some scales are negative (Q4_0 codes)"
                                        : "its mins are nonzero (Q4_1 codes)");
    in->kind = (is_signed < 0 ? forced : is_signed) ? ENG_Q4NX_Q4_0 : ENG_Q4NX_Q4_1;
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * Votes
 * --------------------------------------------------------------------- */

typedef struct vote {
    int  raster;
    char how[224];
} vote_t;

typedef struct ballot {
    vote_t v[MAX_VOTES];
    size_t n, n_a, n_b;      /* kept, and counted per order */
    size_t tiles;            /* tiles of the family in the file */
    size_t tensors;          /* tensors of the family */
    size_t hits[2], sampled; /* the code vote's groups */
} ballot_t;

SVC_FMT(3, 4) static void cast(ballot_t *b, int raster, const char *fmt, ...) {
    if (raster < 0)
        return;
    raster == ENG_Q4NX_RASTER_A ? b->n_a++ : b->n_b++;
    if (b->n >= MAX_VOTES)
        return;
    vote_t *v = &b->v[b->n++];
    v->raster = raster;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->how, sizeof v->how, fmt, ap);
    va_end(ap);
}

static int family_of(eng_q4nx_kind_t k) {
    return k == ENG_Q4NX_Q4_1 || k == ENG_Q4NX_Q4_0 ? ENG_Q4NX_FAM_Q4
           : k == ENG_Q4NX_Q8                       ? ENG_Q4NX_FAM_Q8
                                                    : -1;
}

static char rch(int raster) {
    return raster == ENG_Q4NX_RASTER_A ? 'A' : 'B';
}

/* --- twin: a packed tensor against its values stored BF16 --- */

/* Sum of |decoded - twin| over the twin's first `rows` rows, K columns. */
static double twin_err(const eng_q4nx_info_t *a, const uint8_t *twin, size_t rows, size_t K,
                       eng_q4nx_raster_t ra, float *buf) {
    size_t bands = (rows + ENG_Q4NX_ROWS - 1) / ENG_Q4NX_ROWS;
    eng_q4nx_decode_ref(a->kind, ra, a->st->data, bands, a->st->shape[1], rows, K, buf);
    double e = 0;
    for (size_t i = 0; i < rows * K; i++)
        e += fabs((double)buf[i] - (double)eng_bf16_to_f32(rd16(twin + 2 * i)));
    return e;
}

/* The order under which packed a matches BF16 tw (rows x K of it), or -1. */
static int twin_verdict(const eng_q4nx_info_t *a, const eng_st_tensor_t *tw, size_t rows,
                        double *ea, double *eb) {
    size_t K = tw->rank == 2 ? (size_t)tw->shape[1] : 0;
    if (tw->dtype != ENG_DT_BF16 || !K || !rows || rows > a->st->shape[0] * ENG_Q4NX_ROWS ||
        (K + ENG_Q4NX_COLS - 1) / ENG_Q4NX_COLS != a->st->shape[1])
        return -1;
    float *buf = malloc(rows * K * sizeof *buf);
    if (!buf)
        return -1; /* no vote; the decision then says what is missing */
    *ea = twin_err(a, tw->data, rows, K, ENG_Q4NX_RASTER_A, buf);
    *eb = twin_err(a, tw->data, rows, K, ENG_Q4NX_RASTER_B, buf);
    free(buf);
    return *ea * TWIN_RATIO <= *eb && *ea < *eb   ? ENG_Q4NX_RASTER_A
           : *eb * TWIN_RATIO <= *ea && *eb < *ea ? ENG_Q4NX_RASTER_B
                                                  : -1;
}

static void vote_twin(ballot_t *b, const eng_q4nx_info_t *a, const eng_st_tensor_t *tw,
                      size_t rows) {
    double ea = 0, eb = 0;
    int    r = twin_verdict(a, tw, rows, &ea, &eb);
    cast(b, r, "%s against %s, decoded both ways (mean |error| A %.3g, B %.3g)", a->name, tw->name,
         ea / (double)(rows * tw->shape[1]), eb / (double)(rows * tw->shape[1]));
}

/* --- dup: alpha/beta rows 16-31 repeat rows 0-15 (§2.2) --- */

static int dup_verdict(const eng_q4nx_info_t *a) {
    bool   q8 = a->kind == ENG_Q4NX_Q8;
    size_t tb = eng_q4nx_tile_bytes(a->kind), base = q8 ? 512 : 1024, col = q8 ? 32 : 16;
    size_t half = (tb - base) / 2; /* one 16-row plane in order A */
    bool   okA = true, okB = true;
    for (size_t t = 0; t < a->st->nbytes / tb; t++) {
        const uint8_t *c = (const uint8_t *)a->st->data + t * tb + base;
        okA = okA && memcmp(c, c + half, half) == 0;
        for (size_t kt = 0; okB && kt < ENG_Q4NX_COLS; kt++)
            okB = memcmp(c + kt * col, c + kt * col + col / 2, col / 2) == 0;
    }
    return okA == okB ? -1 : okA ? ENG_Q4NX_RASTER_A : ENG_Q4NX_RASTER_B;
}

/* --- codes: the quantizer's extremes in every group --- */

/* Whether group (rt, g) of tile t holds its quantizer's extremes. */
static bool group_extreme(const uint8_t *t, eng_q4nx_kind_t k, eng_q4nx_raster_t ra, size_t rt,
                          size_t g) {
    int lo = 255, hi = -255;
    for (size_t j = 0; j < ENG_Q4NX_GROUP; j++) {
        int c = eng_q4nx_tile_code(t, k, ra, rt, g * ENG_Q4NX_GROUP + j);
        lo = c < lo ? c : lo;
        hi = c > hi ? c : hi;
    }
    if (k == ENG_Q4NX_Q8)
        return lo <= -126 || hi >= 126;
    if (k == ENG_Q4NX_Q4_0)
        return lo == -8;
    return lo == 0 && hi == 15;
}

static void code_sample(ballot_t *b, const eng_q4nx_info_t *a) {
    size_t tb = eng_q4nx_tile_bytes(a->kind), nt = a->st->nbytes / tb;
    size_t step = nt > CODE_TILES ? nt / CODE_TILES : 1;
    for (size_t t = 0; t < nt; t += step) {
        const uint8_t *tile = (const uint8_t *)a->st->data + t * tb;
        for (size_t rt = 0; rt < ENG_Q4NX_ROWS; rt++)
            for (size_t g = 0; g < ENG_Q4NX_COLS / ENG_Q4NX_GROUP; g++) {
                if ((rd16(tile + 2 * (g * ENG_Q4NX_ROWS + rt)) & 0x7fffu) == 0)
                    continue; /* a zero scale: padding or a constant group */
                b->sampled++;
                b->hits[0] += group_extreme(tile, a->kind, ENG_Q4NX_RASTER_A, rt, g);
                b->hits[1] += group_extreme(tile, a->kind, ENG_Q4NX_RASTER_B, rt, g);
            }
    }
}

static void vote_codes(ballot_t *b) {
    if (!b->sampled)
        return;
    double fa = (double)b->hits[0] / (double)b->sampled;
    double fb = (double)b->hits[1] / (double)b->sampled;
    int    r = fa >= CODE_MIN && fa - fb >= CODE_LEAD   ? ENG_Q4NX_RASTER_A
               : fb >= CODE_MIN && fb - fa >= CODE_LEAD ? ENG_Q4NX_RASTER_B
                                                        : -1;
    cast(b, r,
         "the quantizer's extreme codes: in %.1f%% of %zu sampled groups under order %c, %.1f%% "
         "under %c",
         100.0 * (r == ENG_Q4NX_RASTER_A ? fa : fb), b->sampled, rch(r),
         100.0 * (r == ENG_Q4NX_RASTER_A ? fb : fa), rch(!r));
}

/* --- gathering --- */

/* Every vote the file holds, per family. */
static void gather(const eng_st_t *st, const eng_q4nx_info_t *info, size_t n, ballot_t b[2]) {
    for (size_t i = 0; i < n; i++) {
        const eng_q4nx_info_t *a = &info[i];
        int                    f = family_of(a->kind);
        if (f < 0)
            continue;
        b[f].tensors++;
        b[f].tiles += a->st->nbytes / eng_q4nx_tile_bytes(a->kind);
        code_sample(&b[f], a);
        if (a->xform == ENG_Q4NX_X_ROW_DUP) {
            char                   tw[320];
            const eng_q4nx_info_t *t = eng_q4nx_bf16_name(a->name, tw, sizeof tw) == SVC_OK
                                           ? eng_q4nx_info_find(st, info, tw)
                                           : NULL;
            if (t && t->st->rank == 2)
                vote_twin(&b[f], a, t->st, (size_t)t->st->shape[0]);
            int r = dup_verdict(a);
            cast(&b[f], r, "%s: rows 16-31 repeat rows 0-15 only in order %c", a->name, rch(r));
        }
        if (strcmp(a->name, "lm_head.weight") == 0) {
            const eng_q4nx_info_t *e = eng_q4nx_info_find(st, info, "model.embed_tokens.weight");
            if (e && e->st->rank == 2)
                vote_twin(&b[f], a, e->st,
                          e->st->shape[0] < TWIN_ROWS ? (size_t)e->st->shape[0] : TWIN_ROWS);
        }
    }
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++)
        vote_codes(&b[f]);
}

/* ---------------------------------------------------------------------
 * Decision
 * --------------------------------------------------------------------- */

static const vote_t *first_of(const ballot_t *b, int raster) {
    for (size_t i = 0; i < b->n; i++)
        if (b->v[i].raster == raster)
            return &b->v[i];
    return NULL;
}

static svc_err_t settle(const eng_st_t *st, int f, const ballot_t *b, int forced,
                        eng_q4nx_decision_t *d, char *errstr, size_t n) {
    d->present = b->tiles > 0;
    d->raster = ENG_Q4NX_RASTER_B;
    snprintf(d->how, sizeof d->how, "no %s tiles", FAM_WHAT[f]);
    if (!d->present)
        return SVC_OK;
    const vote_t *va = first_of(b, ENG_Q4NX_RASTER_A), *vb = first_of(b, ENG_Q4NX_RASTER_B);
    if (va && vb)
        return eng_q4nx_failf(
            st, errstr, n,
            "the code order of its %s tiles is contradictory: order A by %s; order B "
            "by %s (Q4NX.md §8)",
            FAM_WHAT[f], va->how, vb->how);
    const vote_t *v = va ? va : vb;
    if (forced >= 0 && v && v->raster != forced)
        return eng_q4nx_failf(st, errstr, n,
                              "--q4nx-layout %s=%c contradicts the file: order %c by %s",
                              FAM_NAME[f], rch(forced), rch(v->raster), v->how);
    if (forced < 0 && !v)
        return eng_q4nx_failf(
            st, errstr, n,
            "the code order of its %zu %s tiles (%zu tensors) is not settled by the "
            "file: no tensor of theirs has a BF16 twin or duplicated rows, and their "
            "codes fit both orders (%zu groups sampled: extremes in %.1f%% under A, "
            "%.1f%% under B); pass --q4nx-layout %s=A (two 16-row planes) or %s=B "
            "(plain column major) (Q4NX.md §3.2, §4.2)",
            b->tiles, FAM_WHAT[f], b->tensors, b->sampled,
            b->sampled ? 100.0 * (double)b->hits[0] / (double)b->sampled : 0.0,
            b->sampled ? 100.0 * (double)b->hits[1] / (double)b->sampled : 0.0, FAM_NAME[f],
            FAM_NAME[f]);
    d->raster = (eng_q4nx_raster_t)(v ? v->raster : forced);
    size_t votes = b->n_a + b->n_b;
    if (!v)
        snprintf(d->how, sizeof d->how, "--q4nx-layout %s=%c (the file holds no evidence)",
                 FAM_NAME[f], rch(forced));
    else if (votes > 1)
        snprintf(d->how, sizeof d->how, "%s (and %zu more agreeing)", v->how, votes - 1);
    else
        snprintf(d->how, sizeof d->how, "%s", v->how);
    return SVC_OK;
}

svc_err_t eng_q4nx_layout_decide(const eng_st_t *st, eng_q4nx_info_t *info, size_t n,
                                 const eng_q4nx_layout_t *forced,
                                 eng_q4nx_decision_t dec[ENG_Q4NX_FAM_COUNT], char *errstr,
                                 size_t errstr_size) {
    eng_q4nx_layout_t none;
    eng_q4nx_layout_none(&none);
    if (!forced)
        forced = &none;
    for (size_t i = 0; i < n; i++)
        if (info[i].kind == ENG_Q4NX_Q4_1) {
            svc_err_t err = q4_codes(st, &info[i], forced->q4_signed, errstr, errstr_size);
            if (err)
                return err;
        }
    ballot_t b[ENG_Q4NX_FAM_COUNT] = {0};
    gather(st, info, n, b);
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++) {
        svc_err_t err = settle(st, f, &b[f], forced->raster[f], &dec[f], errstr, errstr_size);
        if (err)
            return err;
    }
    return SVC_OK;
}
