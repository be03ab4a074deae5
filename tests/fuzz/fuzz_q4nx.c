/*
 * fuzz_q4nx.c -- libFuzzer harness for the Q4NX reader (engine/eng_q4nx*.c;
 * /work/shared/docs/Q4NX.md, docs/q4nx.md): any bytes as a model.q4nx ->
 * eng_q4nx_open -> every tensor it lists read back as the engine reads it.
 *
 * A refusal must be a format error with a message that names the file.
 * What opens must be consistent:
 *   - each tensor's kind agrees with its dtype and tile geometry, and a
 *     packed one holds exactly its P x Q tiles;
 *   - each HF name maps back to the stored name, and the lookup by HF name
 *     finds that very tensor (the tied embedding finds lm_head);
 *   - the generation and the family decisions agree with the kinds held;
 *   - opening again with the decided layout forced gives the same
 *     decisions and kinds, and forcing the other order of a family the
 *     file settled is refused (Q4NX.md §8: evidence beats a setting);
 *   - every tensor reads at its full stored extent where nothing can be
 *     wrong with it (all but a q_proj, ssm_a, a conv1d not 2-D and a tiled
 *     vision weight read as its matrix), else reads or fails with a
 *     message; one row (one band of tiles) more is always refused;
 *   - a packed read and its group codes agree (w = d u + m), and a read
 *     one row and one column into the last tile is the same matrix cut
 *     (padding is dropped, never mixed in);
 *   - vision tile sizes that break §5's rules are refused, others read or
 *     fail with a message.
 *
 *     tests/fuzz/run.sh [SECONDS]    # libFuzzer, with the others
 *     build/tests/fuzz_replay_q4nx tests/fuzz/corpus/q4nx
 */
#include "eng_q4nx_int.h"
#include "fuzz_util.h"

#include <math.h>

/* Tensors read back up to this many floats: a run spends its time on the
 * header and the layout votes, not on decoding large tensors. */
#define FUZZ_MAX_FLOATS (1u << 18)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The file and what messages about it start with. */
typedef struct fz {
    char path[64];
    char prefix[96];
    char errstr[1024];
} fz_t;

static bool same_float(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static int family_of(eng_q4nx_kind_t k) {
    return k == ENG_Q4NX_Q4_1 || k == ENG_Q4NX_Q4_0 ? ENG_Q4NX_FAM_Q4
           : k == ENG_Q4NX_Q8                       ? ENG_Q4NX_FAM_Q8
                                                    : -1;
}

/* ---- what open() lists ---- */

static void check_kind(const eng_q4nx_info_t *in) {
    const eng_st_tensor_t *t = in->st;
    FUZZ_CHECK(in->name == t->name);
    if (!eng_q4nx_kind_packed(in->kind)) {
        eng_dtype_t want = in->kind == ENG_Q4NX_BF16  ? ENG_DT_BF16
                           : in->kind == ENG_Q4NX_F32 ? ENG_DT_F32
                                                      : ENG_DT_F16;
        FUZZ_CHECK(in->kind <= ENG_Q4NX_F16 && in->kind != ENG_Q4NX_AUTO && t->dtype == want);
        return;
    }
    size_t tb = eng_q4nx_tile_bytes(in->kind);
    FUZZ_CHECK(t->dtype == ENG_DT_I8 && t->rank == 3 && t->shape[2] == tb);
    FUZZ_CHECK(t->shape[0] > 0 && t->shape[1] > 0);
    FUZZ_CHECK(t->nbytes == t->shape[0] * t->shape[1] * tb);
}

static void check_names(const eng_q4nx_t *q, const eng_q4nx_info_t *in) {
    if (!in->hf_name)
        return;
    char             back[512];
    eng_q4nx_xform_t xf;
    FUZZ_CHECK(eng_q4nx_name_from_hf(in->hf_name, back, sizeof back, &xf) == SVC_OK);
    FUZZ_CHECK(strcmp(back, in->name) == 0 && xf == in->xform);
    FUZZ_CHECK(eng_q4nx_find_hf(q, in->hf_name) == in);
}

static bool has_name(const eng_q4nx_t *q, const char *name) {
    for (size_t i = 0; i < eng_q4nx_count(q); i++)
        if (strcmp(eng_q4nx_at(q, i)->name, name) == 0)
            return true;
    return false;
}

static void check_listing(const eng_q4nx_t *q) {
    size_t n = eng_q4nx_count(q), vision = 0;
    bool   q4k = false, fam[ENG_Q4NX_FAM_COUNT] = {false, false};
    FUZZ_CHECK(eng_q4nx_at(q, n) == NULL);
    for (size_t i = 0; i < n; i++) {
        const eng_q4nx_info_t *in = eng_q4nx_at(q, i);
        FUZZ_CHECK(i == 0 || strcmp(eng_q4nx_at(q, i - 1)->name, in->name) < 0);
        check_kind(in);
        check_names(q, in);
        vision += strncmp(in->name, ENG_Q4NX_VISION_PREFIX, strlen(ENG_Q4NX_VISION_PREFIX)) == 0;
        q4k = q4k || in->kind == ENG_Q4NX_Q4_K;
        if (family_of(in->kind) >= 0)
            fam[family_of(in->kind)] = true;
    }
    FUZZ_CHECK(eng_q4nx_vision_count(q) == vision);
    bool gen_b = q4k || !has_name(q, "model.embed_tokens.weight");
    FUZZ_CHECK(eng_q4nx_generation(q) == (gen_b ? ENG_Q4NX_GEN_B : ENG_Q4NX_GEN_A));
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++) {
        const eng_q4nx_decision_t *d = eng_q4nx_decision(q, (eng_q4nx_family_t)f);
        FUZZ_CHECK(d->present == fam[f] && d->how[0] != '\0');
        FUZZ_CHECK(d->raster == ENG_Q4NX_RASTER_A || d->raster == ENG_Q4NX_RASTER_B);
        FUZZ_CHECK(d->present || d->raster == ENG_Q4NX_RASTER_B);
    }
    FUZZ_CHECK(eng_q4nx_q8_raster(q) == eng_q4nx_decision(q, ENG_Q4NX_FAM_Q8)->raster);
}

/* ---- the layout forced ---- */

/* What open() settled, as a --q4nx-layout would say it. */
static void decided(const eng_q4nx_t *q, eng_q4nx_layout_t *l) {
    eng_q4nx_layout_none(l);
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++) {
        const eng_q4nx_decision_t *d = eng_q4nx_decision(q, (eng_q4nx_family_t)f);
        l->raster[f] = d->present ? (int)d->raster : -1;
    }
    int q40 = 0, q41 = 0;
    for (size_t i = 0; i < eng_q4nx_count(q); i++) {
        q40 += eng_q4nx_at(q, i)->kind == ENG_Q4NX_Q4_0;
        q41 += eng_q4nx_at(q, i)->kind == ENG_Q4NX_Q4_1;
    }
    l->q4_signed = q40 && !q41 ? 1 : q41 && !q40 ? 0 : -1;
}

static void check_forced_same(const eng_q4nx_t *q, fz_t *fz, const eng_q4nx_layout_t *l) {
    eng_q4nx_t *again = NULL;
    svc_err_t   err = eng_q4nx_open_with(fz->path, l, &again, fz->errstr, sizeof fz->errstr);
    if (err != SVC_OK)
        fprintf(stderr, "the decided layout, forced, is refused: %s\n", fz->errstr);
    FUZZ_CHECK(err == SVC_OK && eng_q4nx_count(again) == eng_q4nx_count(q));
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++)
        FUZZ_CHECK(eng_q4nx_decision(again, f)->raster == eng_q4nx_decision(q, f)->raster);
    for (size_t i = 0; i < eng_q4nx_count(q); i++)
        FUZZ_CHECK(eng_q4nx_at(again, i)->kind == eng_q4nx_at(q, i)->kind);
    eng_q4nx_close(again);
}

static void check_forced_other(fz_t *fz, const eng_q4nx_layout_t *decided_l, int f) {
    eng_q4nx_layout_t l;
    eng_q4nx_layout_none(&l);
    l.raster[f] = !decided_l->raster[f];
    eng_q4nx_t *q = NULL;
    svc_err_t   err = eng_q4nx_open_with(fz->path, &l, &q, fz->errstr, sizeof fz->errstr);
    FUZZ_CHECK(err == SVC_ERR_FORMAT && q == NULL);
    fuzz_check_message(fz->errstr, fz->prefix);
    FUZZ_CHECK(strstr(fz->errstr, "contradicts the file") != NULL);
}

static void check_forced(const eng_q4nx_t *q, fz_t *fz) {
    eng_q4nx_layout_t l;
    decided(q, &l);
    check_forced_same(q, fz, &l);
    for (int f = 0; f < ENG_Q4NX_FAM_COUNT; f++)
        if (l.raster[f] >= 0)
            check_forced_other(fz, &l, f);
}

/* ---- reading tensors ---- */

/* The shape a reader asks for to get all of a stored tensor; *must: that
 * read cannot fail on a file that opened. */
static size_t full_dims(const eng_q4nx_info_t *in, uint64_t *dims, bool *must) {
    const eng_st_tensor_t *t = in->st;
    *must = true;
    if (eng_q4nx_kind_packed(in->kind)) {
        dims[0] = t->shape[0] * ENG_Q4NX_ROWS;
        dims[1] = t->shape[1] * eng_q4nx_tile_cols(in->kind);
        *must = in->xform != ENG_Q4NX_X_Q_REGROUP; /* rows vs the head size */
        return 2;
    }
    if (in->xform == ENG_Q4NX_X_VTILE && t->rank == 3) {
        dims[0] = t->shape[0] * ENG_Q4NX_VISION_MM_N;
        dims[1] = t->shape[1] * (t->shape[2] / ENG_Q4NX_VISION_MM_N);
        *must = false; /* the tile size and the zero padding are checked */
        return 2;
    }
    if (in->xform == ENG_Q4NX_X_CONV_T && t->rank == 2) {
        dims[0] = t->shape[1];
        dims[1] = t->shape[0];
        return 2;
    }
    memcpy(dims, t->shape, t->rank * sizeof *dims);
    *must = in->xform != ENG_Q4NX_X_NEG_EXP && in->xform != ENG_Q4NX_X_CONV_T;
    return t->rank;
}

static uint64_t numel(size_t rank, const uint64_t *dims) {
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++)
        n = dims[i] && n > FUZZ_MAX_FLOATS / dims[i] ? FUZZ_MAX_FLOATS + 1 : n * dims[i];
    return n;
}

/* eng_q4nx_tensor_f32 into a fresh buffer; NULL when it refused. */
static float *read_f32(const eng_q4nx_t *q, fz_t *fz, const char *hf, size_t rank,
                       const uint64_t *dims, bool must) {
    float *out = malloc(numel(rank, dims) * sizeof *out + 1);
    FUZZ_CHECK(out != NULL);
    svc_err_t err = eng_q4nx_tensor_f32(q, hf, rank, dims, out, fz->errstr, sizeof fz->errstr);
    if (err == SVC_OK)
        return out;
    if (must)
        fprintf(stderr, "\"%s\" does not read: %s\n", hf, fz->errstr);
    FUZZ_CHECK(!must && (err == SVC_ERR_INVALID || err == SVC_ERR_NOMEM));
    fuzz_check_message(fz->errstr, fz->prefix);
    free(out);
    return NULL;
}

/* w = d u + m where the values need no further transform. Equal, not bit
 * for bit: a Q8 or Q4_0 group's d u + m is d (c + 128) - 128 d, which is
 * d c exactly but for the sign of a zero, and it overflows where d c does
 * not once |d| nears FLT_MAX / 256 (no quantizer writes such a scale). */
static bool group_value_ok(float d, unsigned u, float m, float w) {
    if (!isfinite(d) || fabsf(d) > 0x1p100f)
        return true;
    float v = d * (float)u + m;
    return v == w || (isnan(v) && isnan(w));
}

static void check_groups(const eng_q4nx_t *q, fz_t *fz, const eng_q4nx_info_t *in,
                         const uint64_t *dims, const float *w) {
    uint8_t  *u;
    float    *d, *m;
    svc_err_t err =
        eng_q4nx_tensor_groups(q, in->hf_name, dims, &u, &d, &m, fz->errstr, sizeof fz->errstr);
    if (in->xform == ENG_Q4NX_X_PLUS1 || in->xform == ENG_Q4NX_X_NEG_EXP) {
        FUZZ_CHECK(err == SVC_ERR_UNSUPPORTED && !u && !d && !m);
        return;
    }
    FUZZ_CHECK(err == SVC_OK);
    size_t R = (size_t)dims[0], K = (size_t)dims[1], G = (K + ENG_Q4NX_GROUP - 1) / ENG_Q4NX_GROUP;
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < K; k++) {
            size_t g = r * G + k / ENG_Q4NX_GROUP;
            FUZZ_CHECK(group_value_ok(d[g], u[r * K + k], m[g], w[r * K + k]));
        }
    free(u), free(d), free(m);
}

/* The same matrix cut: one row and one column into the last tile of a
 * packed tensor (must read: padding is dropped, never mixed in), one row
 * and one column less of a tiled vision weight (reads only where what it
 * cuts off is zero, as padding must be). */
static void check_cut(const eng_q4nx_t *q, fz_t *fz, const eng_q4nx_info_t *in,
                      const uint64_t *dims, const float *w) {
    bool     packed = eng_q4nx_kind_packed(in->kind);
    uint64_t cut[2] = {dims[0] - (packed ? ENG_Q4NX_ROWS - 1 : 1),
                       dims[1] - (packed ? eng_q4nx_tile_cols(in->kind) - 1 : 1)};
    if (!cut[0] || !cut[1])
        return;
    float *c = read_f32(q, fz, in->hf_name, 2, cut, packed);
    for (size_t r = 0; c && r < cut[0]; r++)
        for (size_t k = 0; k < cut[1]; k++)
            FUZZ_CHECK(same_float(c[r * cut[1] + k], w[r * dims[1] + k]));
    free(c);
}

/* A shape one row (one band of tiles) past what is stored is refused. */
static void check_too_big(const eng_q4nx_t *q, fz_t *fz, const eng_q4nx_info_t *in, size_t rank,
                          const uint64_t *dims) {
    uint64_t big[ENG_ST_MAX_RANK];
    if (rank == 0)
        return;
    memcpy(big, dims, rank * sizeof *big);
    big[0] += eng_q4nx_kind_packed(in->kind) ? ENG_Q4NX_ROWS : 1;
    float *w = read_f32(q, fz, in->hf_name, rank, big, false);
    FUZZ_CHECK(w == NULL);
}

static void check_read(const eng_q4nx_t *q, fz_t *fz, const eng_q4nx_info_t *in) {
    uint64_t dims[ENG_ST_MAX_RANK];
    bool     must;
    size_t   rank = full_dims(in, dims, &must);
    if (!in->hf_name || numel(rank, dims) > FUZZ_MAX_FLOATS)
        return;
    float *w = read_f32(q, fz, in->hf_name, rank, dims, must);
    bool   vtile = in->xform == ENG_Q4NX_X_VTILE && in->st->rank == 3 && rank == 2;
    if (w && eng_q4nx_kind_packed(in->kind))
        check_groups(q, fz, in, dims, w);
    if (w && in->xform != ENG_Q4NX_X_Q_REGROUP && (eng_q4nx_kind_packed(in->kind) || vtile))
        check_cut(q, fz, in, dims, w);
    free(w);
    check_too_big(q, fz, in, rank, dims);
}

/* Tile sizes from config.json (eng_q4nx_set_vision_tiles): sizes that
 * break §5's rules leave q as it was; the transposed tile of a vision
 * weight reads or fails with a message, and §5's fallback comes back. */
static void check_vision_tiles(eng_q4nx_t *q, fz_t *fz, const eng_q4nx_info_t *in) {
    size_t mm_n, mm_k;
    FUZZ_CHECK(eng_q4nx_set_vision_tiles(q, 3, 5, fz->errstr, sizeof fz->errstr) ==
               SVC_ERR_INVALID);
    fuzz_check_message(fz->errstr, fz->prefix);
    eng_q4nx_vision_tiles(q, &mm_n, &mm_k);
    FUZZ_CHECK(mm_n == 0 && mm_k == 0);
    const uint64_t *sh = in->st->shape;
    if (sh[2] % ENG_Q4NX_VISION_MM_N ||
        eng_q4nx_set_vision_tiles(q, sh[2] / ENG_Q4NX_VISION_MM_N, ENG_Q4NX_VISION_MM_N, fz->errstr,
                                  sizeof fz->errstr) != SVC_OK)
        return;
    eng_q4nx_vision_tiles(q, &mm_n, &mm_k);
    uint64_t dims[2] = {sh[0] * mm_n, sh[1] * mm_k};
    if (numel(2, dims) <= FUZZ_MAX_FLOATS)
        free(read_f32(q, fz, in->hf_name, 2, dims, false));
    FUZZ_CHECK(eng_q4nx_set_vision_tiles(q, 0, 0, fz->errstr, sizeof fz->errstr) == SVC_OK);
}

/* Without a BF16 embedding, the embedding is lm_head's values (§8 step 5). */
static void check_tied(const eng_q4nx_t *q, fz_t *fz) {
    const eng_q4nx_info_t *lm = eng_q4nx_find_hf(q, "lm_head.weight");
    if (!lm || has_name(q, "model.embed_tokens.weight"))
        return;
    uint64_t dims[ENG_ST_MAX_RANK];
    bool     must;
    size_t   rank = full_dims(lm, dims, &must);
    size_t   n = (size_t)numel(rank, dims);
    if (n > FUZZ_MAX_FLOATS)
        return;
    float *a = read_f32(q, fz, "lm_head.weight", rank, dims, must);
    float *b = read_f32(q, fz, "model.language_model.embed_tokens.weight", rank, dims, must);
    FUZZ_CHECK(!a == !b);
    for (size_t i = 0; a && i < n; i++)
        FUZZ_CHECK(same_float(a[i], b[i]));
    free(a), free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* Decodes run inline: pool threads would only add noise to a run. */
    setenv("D3_NPU_THREADS", "1", 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_t fz = {.errstr = ""};
    fuzz_file(data, size, fz.path, sizeof fz.path);
    eng_q4nx_t *q = NULL;
    svc_err_t   err = eng_q4nx_open(fz.path, &q, fz.errstr, sizeof fz.errstr);
    if (err != SVC_OK) {
        FUZZ_CHECK(q == NULL);
        FUZZ_CHECK(err == SVC_ERR_FORMAT || err == SVC_ERR_TOO_LARGE ||
                   err == SVC_ERR_UNSUPPORTED || err == SVC_ERR_NOMEM);
        /* the container's own refusals name it as safetensors */
        snprintf(fz.prefix, sizeof fz.prefix,
                 "%s \"%s\": ", strncmp(fz.errstr, "q4nx", 4) == 0 ? "q4nx" : "safetensors",
                 fz.path);
        fuzz_check_message(fz.errstr, fz.prefix);
        return 0;
    }
    snprintf(fz.prefix, sizeof fz.prefix, "q4nx \"%s\": ", fz.path);
    check_listing(q);
    check_forced(q, &fz);
    for (size_t i = 0; i < eng_q4nx_count(q); i++)
        check_read(q, &fz, eng_q4nx_at(q, i));
    check_tied(q, &fz);
    for (size_t i = 0; i < eng_q4nx_count(q); i++) {
        const eng_q4nx_info_t *in = eng_q4nx_at(q, i);
        if (in->xform == ENG_Q4NX_X_VTILE && in->st->rank == 3 && in->hf_name) {
            check_vision_tiles(q, &fz, in);
            break;
        }
    }
    eng_q4nx_close(q);
    return 0;
}
