/*
 * test_q4nx_layout.c -- what a model.q4nx leaves unsaid (engine/
 * eng_q4nx_layout.c): Q4_0-sourced tiles (signed codes, mins 0) are told
 * from Q4_1 by their group parameters and read as what they are; the code
 * order of Q4_1/Q4_0 and Q8 tiles is settled by a BF16 twin, by
 * duplicated alpha rows or by the quantizer's extreme codes, and a file
 * that settles nothing, contradicts itself or contradicts --q4nx-layout is
 * refused with a message that names the setting. Each of these files read
 * as the reader did before (Q4_1 rules, raster by generation) gives wrong
 * numbers with no error: the tests check the values, not just the verdicts.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "eng_q4nx_int.h"
#include "test_q4nx_util.h"

/* ------------------------------------------------------------ helpers */

#define R16 16  /* alpha's real rows (16 key heads in the 2B) */
#define KT  256 /* one tile of columns */

static float *rand_mat(size_t R, size_t K) {
    float *x = malloc(R * K * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < R * K; i++)
        x[i] = frand() * (0.5f + (float)(i % 3));
    return x;
}

/* Encodes x (R x K) as kind in raster ra into a new buffer. */
static uint8_t *encode(eng_q4nx_kind_t kind, eng_q4nx_raster_t ra, const float *x, size_t R,
                       size_t K) {
    uint8_t *p = malloc(eng_q4nx_packed_bytes(kind, R, K));
    cr_assert_eq(eng_q4nx_encode_ref(kind, ra, x, R, K, p), SVC_OK);
    return p;
}

/* A temporary file of the n entries e; its path (test_q4nx_util.h). */
static const char *st_file(const ent_t *e, size_t n) {
    const char *path = tmp_path();
    write_st(path, e, n);
    return path;
}

/* BF16 bytes of n floats. */
static uint8_t *bf16_bytes(const float *x, size_t n) {
    uint8_t *b = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        wr16(b + 2 * i, eng_f32_to_bf16(x[i]));
    return b;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* Opens path with setting spec (NULL: none); the error (or "") in err. */
static svc_err_t open_with(const char *path, const char *spec, eng_q4nx_t **q, char *err,
                           size_t n) {
    eng_q4nx_layout_t lay;
    err[0] = '\0';
    cr_assert_eq(eng_q4nx_layout_parse(spec, &lay, err, n), SVC_OK, "%s", err);
    return eng_q4nx_open_with(path, &lay, q, err, n);
}

/* ------------------------------------------------------------ the setting */

Test(q4nx_layout, parse) {
    eng_q4nx_layout_t l;
    char              err[256];
    cr_assert_eq(eng_q4nx_layout_parse("q4=A,q8=b,q4-codes=signed", &l, err, sizeof err), SVC_OK,
                 "%s", err);
    cr_expect_eq(l.raster[ENG_Q4NX_FAM_Q4], ENG_Q4NX_RASTER_A);
    cr_expect_eq(l.raster[ENG_Q4NX_FAM_Q8], ENG_Q4NX_RASTER_B);
    cr_expect_eq(l.q4_signed, 1);
    cr_assert_eq(eng_q4nx_layout_parse(NULL, &l, err, sizeof err), SVC_OK);
    cr_expect(l.raster[0] < 0 && l.raster[1] < 0 && l.q4_signed < 0);
    cr_assert_eq(eng_q4nx_layout_parse("", &l, err, sizeof err), SVC_OK);
    static const char *bad[] = {"q4=C", "q5=A", "q4", "q4=A,q4=B", "q4-codes=maybe", "q4=A,,x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(eng_q4nx_layout_parse(bad[i], &l, err, sizeof err), SVC_ERR_INVALID, "%s",
                     bad[i]);
        cr_expect(strstr(err, "--q4nx-layout"), "%s: %s", bad[i], err);
        cr_expect(l.raster[0] < 0 && l.q4_signed < 0, "a refused setting settles nothing");
    }
}

/* ------------------------------------------------------------ Q4_0 codes */

/* ggml's Q4_0: the largest magnitude of each group gets code -8, every
 * element decodes to within |d| (|d|/2 but the clipped +v), and the same
 * bytes read with Q4_1 rules (unsigned, min 0) are far off. */
Test(q4nx_layout, q40_codec) {
    size_t R = 40, K = 300, P = 2, Q = 2;
    float *x = rand_mat(R, K), *y = malloc(R * K * sizeof *y), *w = malloc(R * K * sizeof *w);
    for (int ra = 0; ra < 2; ra++) {
        uint8_t *p = encode(ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, x, R, K);
        eng_q4nx_decode_ref(ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, p, P, Q, R, K, y);
        eng_q4nx_decode_ref(ENG_Q4NX_Q4_1, (eng_q4nx_raster_t)ra, p, P, Q, R, K, w);
        double worst_q41 = 0;
        for (size_t r = 0; r < R; r++)
            for (size_t k = 0; k < K; k++) {
                const uint8_t *t = p + ((r / 32) * Q + k / 256) * 5120;
                size_t         rt = r % 32, s = ((k % 256) / 32) * 32 + rt;
                float          d = fabsf(bf(t + 2 * s));
                cr_assert_leq(fabsf(y[r * K + k] - x[r * K + k]), d * 1.0001f, "(%zu, %zu)", r, k);
                worst_q41 = fmax(worst_q41, fabs((double)w[r * K + k] - x[r * K + k]));
            }
        cr_expect_gt(worst_q41, 1.0, "Q4_1 rules on Q4_0 bytes: max error %g", worst_q41);
        for (size_t rt = 0; rt < 32; rt++) /* each group's extreme: code -8 */
            for (size_t g = 0; g < 8; g++) {
                int lo = 8;
                for (size_t j = 0; j < 32; j++) {
                    int c =
                        eng_q4nx_tile_code(p, ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, rt, g * 32 + j);
                    lo = c < lo ? c : lo;
                }
                cr_assert_eq(lo, -8, "row %zu group %zu", rt, g);
            }
        free(p);
    }
    free(x), free(y), free(w);
}

/* A file with Q4_0-sourced projections: listed as q4_0, read as signed
 * codes through both the values and the group codes (what every kernel
 * path is packed from), in either code order. */
Test(q4nx_layout, q40_file_is_read_signed) {
    size_t R = 64, K = 512;
    float *x = rand_mat(R, K), *y = malloc(R * K * sizeof *y), *ref = malloc(R * K * sizeof *ref);
    for (int ra = 0; ra < 2; ra++) {
        uint8_t *p = encode(ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, x, R, K);
        ent_t    e[] = {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {2, 2, 5120}, p, 4 * 5120}};
        const char *path = st_file(e, 1);
        eng_q4nx_t *q = NULL;
        char        err[1024];
        cr_assert_eq(open_with(path, NULL, &q, err, sizeof err), SVC_OK, "%s", err);
        const eng_q4nx_info_t *in = eng_q4nx_find_hf(q, "layers.0.mlp.up_proj.weight");
        cr_expect_eq(in->kind, ENG_Q4NX_Q4_0);
        cr_expect_str_eq(eng_q4nx_kind_name(in->kind), "q4_0");
        const eng_q4nx_decision_t *d = eng_q4nx_decision(q, ENG_Q4NX_FAM_Q4);
        cr_expect(d->present && (int)d->raster == ra, "raster %d: %s", ra, d->how);
        cr_expect(strstr(d->how, "extreme codes"), "%s", d->how);
        uint64_t dims[2] = {R, K};
        cr_assert_eq(
            eng_q4nx_tensor_f32(q, "layers.0.mlp.up_proj.weight", 2, dims, y, err, sizeof err),
            SVC_OK, "%s", err);
        eng_q4nx_decode_ref(ENG_Q4NX_Q4_0, (eng_q4nx_raster_t)ra, p, 2, 2, R, K, ref);
        cr_expect_eq(memcmp(y, ref, R * K * sizeof *y), 0);
        cr_expect_leq(max_abs_diff(y, x, R * K), 2.5 / 8 * 1.01, "within one step");
        uint8_t *u;
        float   *gd, *gm;
        cr_assert_eq(eng_q4nx_tensor_groups(q, "layers.0.mlp.up_proj.weight", dims, &u, &gd, &gm,
                                            err, sizeof err),
                     SVC_OK, "%s", err);
        for (size_t r = 0; r < R; r++)
            for (size_t k = 0; k < K; k++) {
                size_t g = r * (K / 32) + k / 32;
                cr_assert_leq(u[r * K + k], 15);
                cr_assert_eq(gd[g] * (float)u[r * K + k] + gm[g], y[r * K + k], "(%zu, %zu)", r, k);
            }
        free(u), free(gd), free(gm);
        eng_q4nx_close(q);
        unlink(path);
        free(p);
    }
    free(x), free(y), free(ref);
}

/* Nonzero mins and negative scales in one tensor: neither layout. */
Test(q4nx_layout, mixed_parameters_are_refused) {
    float   *x = rand_mat(32, KT);
    uint8_t *p = encode(ENG_Q4NX_Q4_1, ENG_Q4NX_RASTER_A, x, 32, KT);
    p[1] |= 0x80; /* d of group 0, row 0: negative */
    ent_t       e[] = {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 1, 5120}, p, 5120}};
    const char *path = st_file(e, 1);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_expect_eq(open_with(path, NULL, &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "mlp.up_proj") && strstr(err, "neither layout") && strstr(err, path),
              "%s", err);
    cr_expect_null(q);
    unlink(path);
    free(x), free(p);
}

/* Every min 0 and every scale positive (a Q4_0 source whose groups all
 * peak below zero, or a Q4_1 one whose groups all bottom at zero): the
 * bytes decode differently under the two and nothing says which. */
Test(q4nx_layout, unsigned_or_signed_needs_the_setting) {
    float *x = rand_mat(32, KT), *y = malloc(32 * KT * sizeof *y);
    float *ref = malloc(32 * KT * sizeof *ref);
    for (size_t i = 0; i < 32 * KT; i++)
        x[i] = -fabsf(x[i]) - 0.01f; /* v < 0 in every group: d = v / -8 > 0 */
    uint8_t    *p = encode(ENG_Q4NX_Q4_0, ENG_Q4NX_RASTER_B, x, 32, KT);
    ent_t       e[] = {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 1, 5120}, p, 5120}};
    const char *path = st_file(e, 1);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_expect_eq(open_with(path, NULL, &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "mlp.up_proj") && strstr(err, "--q4nx-layout q4-codes=unsigned") &&
                  strstr(err, "q4-codes=signed"),
              "%s", err);
    cr_assert_eq(open_with(path, "q4-codes=signed", &q, err, sizeof err), SVC_OK, "%s", err);
    cr_expect_eq(eng_q4nx_decision(q, ENG_Q4NX_FAM_Q4)->raster, ENG_Q4NX_RASTER_B);
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.mlp.up_proj.weight")->kind, ENG_Q4NX_Q4_0);
    uint64_t dims[2] = {32, KT};
    cr_assert_eq(eng_q4nx_tensor_f32(q, "layers.0.mlp.up_proj.weight", 2, dims, y, err, sizeof err),
                 SVC_OK, "%s", err);
    eng_q4nx_decode_ref(ENG_Q4NX_Q4_0, ENG_Q4NX_RASTER_B, p, 1, 1, 32, KT, ref);
    cr_expect_eq(memcmp(y, ref, sizeof *y * 32 * KT), 0);
    eng_q4nx_close(q);
    /* read as Q4_1, the same bytes hold codes 0 and 15 in most groups under
     * either order (-8..0 as nibbles): the order must be given too */
    cr_expect_eq(open_with(path, "q4-codes=unsigned", &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "--q4nx-layout q4=A"), "%s", err);
    cr_assert_eq(open_with(path, "q4=B,q4-codes=unsigned", &q, err, sizeof err), SVC_OK, "%s", err);
    cr_expect_eq(eng_q4nx_find_hf(q, "layers.0.mlp.up_proj.weight")->kind, ENG_Q4NX_Q4_1);
    eng_q4nx_close(q);
    unlink(path);
    free(x), free(y), free(ref), free(p);
}

/* A setting the file contradicts is refused, not obeyed. */
Test(q4nx_layout, contradicted_codes_setting_is_refused) {
    float      *x = rand_mat(32, KT);
    uint8_t    *p = encode(ENG_Q4NX_Q4_0, ENG_Q4NX_RASTER_A, x, 32, KT);
    ent_t       e[] = {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 1, 5120}, p, 5120}};
    const char *path = st_file(e, 1);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_expect_eq(open_with(path, "q4-codes=unsigned", &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "contradicts") && strstr(err, "Q4_0 codes"), "%s", err);
    unlink(path);
    free(x), free(p);
}

/* ------------------------------------------------------------ code orders */

/* alpha [16, 256] padded to 32 rows by duplication (Q4NX.md §2.2). */
static float *alpha_rows(void) {
    float *a = rand_mat(32, KT);
    memcpy(a + R16 * KT, a, R16 * KT * sizeof *a);
    return a;
}

/* A temporary file as the ROCm-era converter writes a Q4_1 GGUF (§8.1): Q4_1
 * projections and alpha in order ra, alpha's BF16 copy, a BF16 embedding
 * and its tied Q8 lm_head (order ra8), no Q4_K tile. twin_ra: the order
 * the BF16 copy was decoded with (ra for an honest file); with_twin,
 * with_embed: leave those tensors out. */
typedef struct d1d {
    eng_q4nx_raster_t ra, ra8, twin_ra;
    bool              with_twin, with_embed;
} d1d_t;

static const char *d1d_file(const d1d_t *o, float *up_out) {
    const char *path = tmp_path();
    float      *up = rand_mat(64, KT), *a = alpha_rows(), *emb = rand_mat(64, KT);
    float      *adec = malloc(R16 * KT * sizeof *adec);
    uint8_t    *pu = encode(ENG_Q4NX_Q4_1, o->ra, up, 64, KT);
    uint8_t    *pa = encode(ENG_Q4NX_Q4_1, o->ra, a, 32, KT);
    uint8_t    *pl = encode(ENG_Q4NX_Q8, o->ra8, emb, 64, KT);
    eng_q4nx_decode_ref(ENG_Q4NX_Q4_1, o->twin_ra, pa, 1, 1, R16, KT, adec);
    uint8_t *tw = bf16_bytes(adec, R16 * KT), *eb = bf16_bytes(emb, 64 * KT);
    ent_t    all[] = {
           {"lm_head.weight", "I8", 3, {2, 1, 8704}, pl, 2 * 8704},
           {"model.embed_tokens.weight", "BF16", 2, {64, KT}, eb, 64 * KT * 2},
           {"model.layers.0.linear_attn.ssm_alpha_proj.bf16.weight",
            "BF16",
            2,
            {R16, KT},
            tw,
            R16 * KT * 2},
           {"model.layers.0.linear_attn.ssm_alpha_proj.weight", "I8", 3, {1, 1, 5120}, pa, 5120},
           {"model.layers.0.mlp.up_proj.weight", "I8", 3, {2, 1, 5120}, pu, 2 * 5120},
    };
    ent_t  e[5];
    size_t n = 0;
    for (size_t i = 0; i < 5; i++)
        if ((o->with_embed || i != 1) && (o->with_twin || i != 2))
            e[n++] = all[i];
    write_st(path, e, n);
    if (up_out)
        memcpy(up_out, up, 64 * KT * sizeof *up);
    free(up), free(a), free(emb), free(adec), free(pu), free(pa), free(pl), free(tw), free(eb);
    return path;
}

/* The case the generation rule read wrong (cosine 0.025): Q4_1 in order B
 * in a file with a BF16 embedding and no Q4_K tile. Both orders, decided
 * by alpha's BF16 copy; the Q8 lm_head by the embedding it is tied to. */
Test(q4nx_layout, q41_order_by_alpha_twin) {
    float *up = malloc(64 * KT * sizeof *up), *y = malloc(64 * KT * sizeof *y);
    for (int ra = 0; ra < 2; ra++) {
        d1d_t o = {(eng_q4nx_raster_t)ra, (eng_q4nx_raster_t)ra, (eng_q4nx_raster_t)ra, true, true};
        const char *path = d1d_file(&o, up);
        eng_q4nx_t *q = NULL;
        char        err[1024];
        cr_assert_eq(open_with(path, NULL, &q, err, sizeof err), SVC_OK, "%s", err);
        cr_expect_eq(eng_q4nx_generation(q), ENG_Q4NX_GEN_A, "what fooled the old rule");
        const eng_q4nx_decision_t *d4 = eng_q4nx_decision(q, ENG_Q4NX_FAM_Q4);
        const eng_q4nx_decision_t *d8 = eng_q4nx_decision(q, ENG_Q4NX_FAM_Q8);
        cr_expect_eq((int)d4->raster, ra, "%s", d4->how);
        cr_expect(strstr(d4->how, "ssm_alpha_proj.bf16.weight"), "%s", d4->how);
        cr_expect_eq((int)d8->raster, ra, "%s", d8->how);
        cr_expect(strstr(d8->how, "lm_head.weight against model.embed_tokens"), "%s", d8->how);
        uint64_t dims[2] = {64, KT};
        cr_assert_eq(
            eng_q4nx_tensor_f32(q, "layers.0.mlp.up_proj.weight", 2, dims, y, err, sizeof err),
            SVC_OK, "%s", err);
        cr_expect_leq(max_abs_diff(y, up, 64 * KT), 5.0 / 15 / 2 * 1.02, "order %c", "AB"[ra]);
        const eng_st_tensor_t *t = eng_q4nx_find_hf(q, "layers.0.mlp.up_proj.weight")->st;
        eng_q4nx_decode_ref(ENG_Q4NX_Q4_1, (eng_q4nx_raster_t)!ra, t->data, 2, 1, 64, KT, y);
        cr_expect_gt(max_abs_diff(y, up, 64 * KT), 1.0, "the other order is far off");
        eng_q4nx_close(q);
        unlink(path);
    }
    free(up), free(y);
}

/* Without the BF16 copy the duplicated alpha rows settle it (with the
 * codes agreeing); without the embedding nothing settles the Q8 order but
 * its codes. */
Test(q4nx_layout, orders_by_duplicated_rows_and_codes) {
    d1d_t       o = {ENG_Q4NX_RASTER_B, ENG_Q4NX_RASTER_A, ENG_Q4NX_RASTER_B, false, false};
    const char *path = d1d_file(&o, NULL);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_assert_eq(open_with(path, NULL, &q, err, sizeof err), SVC_OK, "%s", err);
    const eng_q4nx_decision_t *d4 = eng_q4nx_decision(q, ENG_Q4NX_FAM_Q4);
    const eng_q4nx_decision_t *d8 = eng_q4nx_decision(q, ENG_Q4NX_FAM_Q8);
    cr_expect_eq(d4->raster, ENG_Q4NX_RASTER_B, "%s", d4->how);
    cr_expect(strstr(d4->how, "repeat rows 0-15 only in order B") && strstr(d4->how, "agreeing"),
              "%s", d4->how);
    cr_expect_eq(d8->raster, ENG_Q4NX_RASTER_A, "%s", d8->how);
    cr_expect(strstr(d8->how, "extreme codes"), "%s", d8->how);
    eng_q4nx_close(q);
    unlink(path);
}

/* A BF16 copy that fits the other order than the codes and the duplicated
 * rows do: the file contradicts itself and is refused. */
Test(q4nx_layout, contradictory_evidence_is_refused) {
    d1d_t       o = {ENG_Q4NX_RASTER_B, ENG_Q4NX_RASTER_B, ENG_Q4NX_RASTER_A, true, true};
    const char *path = d1d_file(&o, NULL);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_expect_eq(open_with(path, NULL, &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "contradictory") && strstr(err, "order A by") &&
                  strstr(err, "order B by"),
              "%s", err);
    unlink(path);
}

/* Evidence against the setting: refused; a setting the file agrees with
 * is taken, and the evidence reported. */
Test(q4nx_layout, setting_against_the_file_is_refused) {
    d1d_t       o = {ENG_Q4NX_RASTER_B, ENG_Q4NX_RASTER_B, ENG_Q4NX_RASTER_B, true, true};
    const char *path = d1d_file(&o, NULL);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_expect_eq(open_with(path, "q4=A", &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "--q4nx-layout q4=A contradicts the file: order B by"), "%s", err);
    cr_expect_eq(open_with(path, "q8=A", &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "q8=A contradicts"), "%s", err);
    cr_assert_eq(open_with(path, "q4=B,q8=B", &q, err, sizeof err), SVC_OK, "%s", err);
    cr_expect(strstr(eng_q4nx_decision(q, ENG_Q4NX_FAM_Q4)->how, "against"));
    eng_q4nx_close(q);
    unlink(path);
}

/* Tiles whose codes are no quantizer's (random bytes, valid Q4_1
 * parameters), with nothing else in the file: no order can be told, so
 * the file is refused naming the setting, which then settles it. */
Test(q4nx_layout, no_evidence_needs_the_setting) {
    uint8_t *p = malloc(2 * 5120);
    for (size_t t = 0; t < 2; t++) {
        uint8_t *b = p + t * 5120;
        for (size_t s = 0; s < 256; s++) {
            wr16(b + 2 * s, eng_f32_to_bf16(0.1f));
            wr16(b + 512 + 2 * s, eng_f32_to_bf16(-0.75f));
        }
        for (size_t i = 1024; i < 5120; i++)
            b[i] = (uint8_t)(frand() * 128.0f + 128.0f);
    }
    ent_t       e[] = {{"model.layers.0.mlp.up_proj.weight", "I8", 3, {1, 2, 5120}, p, 2 * 5120}};
    const char *path = st_file(e, 1);
    eng_q4nx_t *q = NULL;
    char        err[1024];
    cr_expect_eq(open_with(path, NULL, &q, err, sizeof err), SVC_ERR_FORMAT);
    cr_expect(strstr(err, "not settled by the file") && strstr(err, "--q4nx-layout q4=A") &&
                  strstr(err, "q4=B") && strstr(err, path),
              "%s", err);
    cr_assert_eq(open_with(path, "q4=B", &q, err, sizeof err), SVC_OK, "%s", err);
    const eng_q4nx_decision_t *d = eng_q4nx_decision(q, ENG_Q4NX_FAM_Q4);
    cr_expect_eq(d->raster, ENG_Q4NX_RASTER_B);
    cr_expect(strstr(d->how, "--q4nx-layout q4=B"), "%s", d->how);
    cr_expect_not(eng_q4nx_decision(q, ENG_Q4NX_FAM_Q8)->present);
    eng_q4nx_close(q);
    unlink(path);
    free(p);
}
