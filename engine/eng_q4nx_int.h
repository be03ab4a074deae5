/*
 * eng_q4nx_int.h -- private: the Q4NX weight container of the D3-Nano-NPU2
 * package (FastFlowLM's model.q4nx; /work/shared/docs/Q4NX.md, cited below
 * as "Q4NX.md §n").
 *
 * A model.q4nx is a plain safetensors file (§1). Quantized projections are
 * I8 tensors of shape [R/32, K/256, B]: a C-order stream of fixed-size
 * tiles, each holding 32 rows x 256 columns (§3.1). B names the tile kind:
 *     5120  Q4_1, W = d*n + m            (raster A or B; §3.2)
 *     5120  Q4_0-sourced, W = d*s        (signed nibbles, no min; §3.3)
 *     4736  Q4_K, W = S*s8*n + M*m8      (Gen-B, raster B; §3.4)
 *     8704  Q8,   W = d*c                (raster A or B; §4.2)
 *     5120  legacy Q8, 32 x 128 columns  (shape [R/32, K/128, 5120]; §4.5)
 * Norms, conv1d and the alpha/beta copies are BF16; ssm_a and dt_bias F32.
 *
 * This module has three layers:
 *   1. tile codecs (scalar references, what the tests use as the oracle):
 *      eng_q4nx_decode_ref, eng_q4nx_encode_q4k_ref, eng_q4nx_encode_q8_ref;
 *   2. a reader that maps a file, detects its generation (§8) and hands out
 *      f32 tensors in Hugging Face convention (the transforms of §2.2 undone):
 *          eng_q4nx_t *q = NULL;
 *          if (eng_q4nx_open(path, &q, errstr, sizeof errstr)) ... report ...
 *          uint64_t dims[2] = {6144, 2048};
 *          eng_q4nx_tensor_f32(q, "model.language_model.layers.0.mlp.up_proj.weight",
 *                              2, dims, out, errstr, sizeof errstr);
 *          eng_q4nx_close(q);
 *   3. a writer that builds a Gen-B (Q4_K) file from f32 HF tensors:
 *          eng_q4nx_writer_t *w = NULL;
 *          eng_q4nx_writer_new(256, &w);          // head_dim, for the q_proj regroup
 *          eng_q4nx_writer_add(w, hf_name, rank, dims, data, ENG_Q4NX_AUTO, errstr, n);
 *          eng_q4nx_writer_finish(w, path, errstr, n);
 *          eng_q4nx_writer_free(w);
 *
 * HF names: the text tower's checkpoint names, "model.language_model." +
 * suffix ("layers.3.self_attn.q_proj.weight", "embed_tokens.weight",
 * "norm.weight"); lookups also accept the bare suffix or "language_model.".
 *
 * The vision tower's vision_weight.q4nx is the same container, BF16 only,
 * read and written through the same calls (section "Vision tower" below).
 *
 * Thread-safety: an open eng_q4nx_t is immutable (after the optional
 * eng_q4nx_set_vision_tiles); any number of threads may
 * call eng_q4nx_tensor_f32 at once. A writer belongs to one thread.
 */
#ifndef D3STREAM_ENG_Q4NX_INT_H
#define D3STREAM_ENG_Q4NX_INT_H

#include "eng_st_int.h"

/* ======================================================================
 * Tiles
 * ====================================================================== */

#define ENG_Q4NX_ROWS        32u   /* rows per tile, every kind (§3.1) */
#define ENG_Q4NX_COLS        256u  /* columns per tile, all but legacy Q8 */
#define ENG_Q4NX_COLS_LEGACY 128u  /* legacy Q8 (§4.5) */
#define ENG_Q4NX_GROUP       32u   /* columns per quant group */
#define ENG_Q4NX_B_Q4_1      5120u /* §3.2 */
#define ENG_Q4NX_B_Q4_K      4736u /* §3.4 */
#define ENG_Q4NX_B_Q8        8704u /* §4.2 */
#define ENG_Q4NX_B_Q8_LEGACY 5120u /* §4.5 */

/* How a tensor is stored. Append only. */
typedef enum eng_q4nx_kind {
    ENG_Q4NX_AUTO = 0, /* writer: choose by name as official Gen-B files do */
    ENG_Q4NX_BF16 = 1,
    ENG_Q4NX_F32 = 2,
    ENG_Q4NX_F16 = 3, /* read only; not in official files */
    ENG_Q4NX_Q4_1 = 4,
    ENG_Q4NX_Q4_K = 5,
    ENG_Q4NX_Q8 = 6,
    ENG_Q4NX_Q8_LEGACY = 7,
    /* 5120-byte tiles written from a GGUF Q4_0 source (Q4NX.md §3.3): the
     * Q4_1 byte map, but two's-complement signed nibbles s and every min 0,
     * W = d*s (d may be negative). The file has no flag for it: open()
     * tells it from Q4_1 by its group parameters (eng_q4nx_layout.c). */
    ENG_Q4NX_Q4_0 = 8,
    ENG_Q4NX_KIND_COUNT
} eng_q4nx_kind_t;

/* Order of codes inside a tile (§3.2, §4.2). Q4_K only has raster B. */
typedef enum eng_q4nx_raster {
    ENG_Q4NX_RASTER_A = 0, /* two 16-row planes; Gen-A */
    ENG_Q4NX_RASTER_B = 1, /* plain column-major over 32 rows; Gen-B */
} eng_q4nx_raster_t;

const char *eng_q4nx_kind_name(eng_q4nx_kind_t kind);
/* True for the I8 tile kinds. */
bool eng_q4nx_kind_packed(eng_q4nx_kind_t kind);
/* Bytes per tile (0 for non-packed kinds) and columns per tile. */
size_t eng_q4nx_tile_bytes(eng_q4nx_kind_t kind);
size_t eng_q4nx_tile_cols(eng_q4nx_kind_t kind);

/* bf16 <-> f32. to_bf16 rounds to nearest even (NaN stays NaN); up rounds
 * a finite x >= 0 to the smallest bf16 >= x. */
uint16_t eng_f32_to_bf16(float x);
uint16_t eng_f32_to_bf16_up(float x);

/**
 * @brief Decodes a packed tensor [P, Q, B] into a row-major f32 (rows, cols).
 * @param packed P*Q tiles of eng_q4nx_tile_bytes(kind) bytes, any alignment.
 * @param rows 1..32*P; rows past it (padding or the alpha/beta duplicates)
 *   are not written.
 * @param cols 1..Q*tile_cols; padding columns are dropped.
 * @remark raster is ignored for Q4_K (always B) and legacy Q8 (always A).
 *   Shapes are the caller's to check (eng_q4nx_tensor_f32 does).
 */
void eng_q4nx_decode_ref(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const void *packed,
                         size_t P, size_t Q, size_t rows, size_t cols, float *out);

/**
 * @brief As eng_q4nx_decode_ref, into the tiles' own codes and group
 *   parameters: u (rows, cols) bytes, d and m (rows, G = ceil(cols / 32))
 *   fp32, with w = d * u + m (fp32 product, then sum) the very value
 *   eng_q4nx_decode_ref gives. Q4_1: u the nibble, (d, m) the bf16 pair;
 *   Q4_K: d = S*s8, m = M*m8 (exact in fp32); Q8 and legacy Q8: u = c + 128
 *   and m = -128 d; Q4_0: u = s + 8 and m = -8 d (d*u and -8d are exact,
 *   so their sum is d*s exactly, whatever the sign of d).
 */
void eng_q4nx_decode_groups_ref(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, const void *packed,
                                size_t P, size_t Q, size_t rows, size_t cols, uint8_t *u, float *d,
                                float *m);

/* The code of tile row rt, tile column kt (< the kind's tile columns) in
 * one tile: Q4_1 and Q4_K 0..15, Q4_0 -8..7, Q8 and legacy Q8 -128..127.
 * raster as for eng_q4nx_decode_ref. */
int eng_q4nx_tile_code(const void *tile, eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, size_t rt,
                       size_t kt);

/* Packed bytes for a (rows, cols) matrix: ceil(rows/32) * ceil(cols/tc) tiles. */
size_t eng_q4nx_packed_bytes(eng_q4nx_kind_t kind, size_t rows, size_t cols);

/**
 * @brief Quantizes a row-major f32 (rows, cols) into Q4_K tiles (§3.4),
 *   zero-padding rows to 32 and columns to 256.
 * @param packed room for eng_q4nx_packed_bytes(ENG_Q4NX_Q4_K, rows, cols).
 * @returns SVC_OK; SVC_ERR_INVALID when a value is not finite or |x| > 1e30
 *   (the packed bytes are then unspecified).
 * @remark Every element decodes to within half its group's effective step
 *   S*s8 (plus float rounding): mins and scales are rounded outward so the
 *   16 levels always cover the group's range.
 */
SVC_WUR svc_err_t eng_q4nx_encode_q4k_ref(const float *w, size_t rows, size_t cols, void *packed);

/**
 * @brief Quantizes into 8704-byte Q8 tiles (§4.2), zero-padding as above.
 * @returns as eng_q4nx_encode_q4k_ref. Every element decodes to within d/2
 *   of its value, d the group's bf16 scale.
 */
SVC_WUR svc_err_t eng_q4nx_encode_q8_ref(const float *w, size_t rows, size_t cols,
                                         eng_q4nx_raster_t raster, void *packed);

/* Q4_1 (§3.2, gguf-py's reference Q4_1 rounding per 32 values); used by
 * tests to exercise both rasters, and for writers of Gen-A style files. */
SVC_WUR svc_err_t eng_q4nx_encode_q41_ref(const float *w, size_t rows, size_t cols,
                                          eng_q4nx_raster_t raster, void *packed);

/* The encoder of kind: Q4_1, Q4_K (raster ignored), Q8 as the ones above;
 * Q4_0-sourced tiles (§3.3) as ggml's reference Q4_0 per 32 values (d =
 * v / -8, v the value of largest magnitude, so the group's extreme gets
 * code -8; codes clipped to [-8, 7]) with |d| rounded up to bf16, stored
 * as the public converter writes a Q4_0 GGUF: signed nibbles, mins 0
 * (every element within |d|/2, but an element of -v within |d|: clipped
 * to 7, as in ggml). SVC_ERR_INVALID for any other kind. */
SVC_WUR svc_err_t eng_q4nx_encode_ref(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster,
                                      const float *w, size_t rows, size_t cols, void *packed);

/* ---- encoders that choose the codes themselves (eng_gptq.c) ----
 * The encoders above fit each tile row's group parameters from the
 * values, then round every value to its nearest level. GPTQ keeps the
 * parameters (a group's grid) and picks the codes itself; these expose the
 * two steps, with the byte maps kept here. Codes are the stored ones:
 * Q4_1 and Q4_K 0..15, Q4_0 -8..7, Q8 -127..127. */

/**
 * @brief Encodes tile column q (columns 256q .. 256q + 255, zero past cols)
 *   of a row-major f32 (rows, cols) into its tiles in packed (a matrix of
 *   ceil(cols / 256) tile columns), exactly as eng_q4nx_encode_ref does
 *   those tiles, and gives each (row, group) grid: code c decodes to
 *   d * c + m (eng_q4nx_code_value).
 * @param d, m optional (NULL): room for 32 * ceil(rows / 32) x 8 floats,
 *   row r's 8 groups of this tile column at [r * 8, r * 8 + 8) (padding
 *   rows included).
 * @returns SVC_OK; SVC_ERR_INVALID (a kind not encoded, q out of range, a
 *   value eng_q4nx_encode_ref refuses); SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_q4nx_encode_col(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster,
                                      const float *w, size_t rows, size_t cols, size_t q,
                                      void *packed, float *d, float *m);
/* As eng_q4nx_encode_col, but where imp is given (cols floats: how much
 * each input column weighs in the output error; GPTQ passes its
 * Hessian's diagonal) the Q4_K and Q4_1 grids are fitted to minimise the
 * importance-weighted squared error of rounding to nearest, trimming each
 * group's range by up to 14% at either end (group_clip in
 * eng_q4nx_tiles.c), instead of spanning it; values past a trimmed end
 * round to the end level. Q4_0 and Q8 ignore imp. NULL: exactly
 * eng_q4nx_encode_col. */
SVC_WUR svc_err_t eng_q4nx_encode_col_imp(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster,
                                          const float *w, size_t rows, size_t cols, size_t q,
                                          const float *imp, void *packed, float *d, float *m);
/* The encoders' rounding of x onto the grid (d, m) of kind, clipped to
 * the kind's codes. */
int eng_q4nx_code_near(eng_q4nx_kind_t kind, float x, float d, float m);
/* The value code c decodes to on the grid (d, m) (m unused for Q4_0, Q8). */
float eng_q4nx_code_value(eng_q4nx_kind_t kind, int c, float d, float m);
/* Writes code c of element (r, k) into packed (Q tile columns); the tile's
 * other bytes are kept. raster is ignored for Q4_K. */
void eng_q4nx_code_put(eng_q4nx_kind_t kind, eng_q4nx_raster_t raster, void *packed, size_t Q,
                       size_t r, size_t k, int c);

/* ======================================================================
 * Names and transforms (§2.2-§2.5, §8 step 4)
 * ====================================================================== */

/* What the converter did to a tensor; the reader undoes it. */
typedef enum eng_q4nx_xform {
    ENG_Q4NX_X_NONE = 0,
    ENG_Q4NX_X_PLUS1 = 1,     /* RMSNorm stored as HF + 1 */
    ENG_Q4NX_X_NEG_EXP = 2,   /* ssm_a = -exp(A_log) */
    ENG_Q4NX_X_CONV_T = 3,    /* HF conv1d [C, 1, K] stored as [K, C] */
    ENG_Q4NX_X_Q_REGROUP = 4, /* q_proj rows (g p h) -> (p g h), p = 2 */
    ENG_Q4NX_X_ROW_DUP = 5,   /* alpha/beta: rows padded to 32 by duplication */
    ENG_Q4NX_X_TIED = 6,      /* embed_tokens read from the Q8 lm_head (Gen-B) */
    ENG_Q4NX_X_VTILE = 7,     /* vision matmul weight in MM_N x MM_K blocks (§5) */
} eng_q4nx_xform_t;

/**
 * @brief Maps a Q4NX name to its HF name ("model.language_model.<suffix>",
 *   or "lm_head.weight"). Vision names ("model.visual.<suffix>", §2.7) are
 *   the same on both sides; their xform is ENG_Q4NX_X_VTILE for the tiled
 *   weights, else ENG_Q4NX_X_NONE.
 * @returns SVC_OK; SVC_ERR_INVALID when the name has no HF counterpart
 *   (the .bf16 alpha/beta copies, unknown names) or hf is too small.
 */
SVC_WUR svc_err_t eng_q4nx_name_to_hf(const char *q4nx_name, char *hf, size_t hf_size,
                                      eng_q4nx_xform_t *xform);
/* The inverse; accepts the prefixes listed in the file comment, and
 * "visual." for "model.visual.".
 * "embed_tokens.weight" maps to "model.embed_tokens.weight" (Gen-A). */
SVC_WUR svc_err_t eng_q4nx_name_from_hf(const char *hf_name, char *q4nx, size_t q4nx_size,
                                        eng_q4nx_xform_t *xform);

/* ======================================================================
 * Reader
 * ====================================================================== */

typedef enum eng_q4nx_gen {
    ENG_Q4NX_GEN_A = 1, /* Q4_1 era: BF16 embed table, raster A (§0.2) */
    ENG_Q4NX_GEN_B = 2, /* Q4_K era: tied Q8 lm_head, raster B */
} eng_q4nx_gen_t;

typedef struct eng_q4nx eng_q4nx_t;

/* ----------------------------------------------------------------------
 * Layouts the file does not name (Q4NX.md §3.2, §3.3, §4.2, §8, §8.1)
 *
 * Q4NX has no version or layout field. Two tile families exist in both
 * code orders (rasters): the 5120-byte nibble tiles (Q4_1, and the same
 * bytes holding signed Q4_0 codes) and the 8704-byte Q8 tiles; the public
 * converter's revisions write A (two 16-row planes) or B (plain column
 * major) with or without Q4_K tiles beside them (§8.1), so the generation
 * says nothing. Q4_K (B) and legacy Q8 (A) have one known order each.
 * open() decides each family from evidence in the file, strongest first:
 *   twin   a packed tensor against the same values stored BF16 (alpha or
 *          beta and its .bf16 copy; the Q8 lm_head and the BF16 embedding
 *          it is tied to), decoded both ways: one order must be at least
 *          4x closer than the other;
 *   dup    alpha/beta rows 16-31 duplicate rows 0-15 under one order only;
 *   codes  the quantizer's extremes: under the right order every group of
 *          a reference quantizer holds them (Q4_1: codes 0 and 15; Q4_0:
 *          -8; Q8: |c| >= 126), under the wrong one a group mixes pieces
 *          of several and often misses them. One order must reach 95% of
 *          the sampled groups and lead the other by 10 points.
 * Votes that disagree, or no vote for a family the file holds, refuse the
 * file with a message that names the ambiguity and the --q4nx-layout
 * setting that settles it; a setting the evidence contradicts is refused
 * too. Whether 5120-byte tiles hold Q4_1 or Q4_0 codes is read off their
 * group parameters, which sit at the same bytes in both orders: Q4_1 has
 * d >= 0 and mins below 0, Q4_0 every min 0 and d of either sign.
 * ---------------------------------------------------------------------- */

typedef enum eng_q4nx_family {
    ENG_Q4NX_FAM_Q4 = 0, /* 5120-byte Q4_1 and Q4_0-sourced tiles */
    ENG_Q4NX_FAM_Q8 = 1, /* 8704-byte Q8 tiles */
    ENG_Q4NX_FAM_COUNT
} eng_q4nx_family_t;

/* What the caller settles (--q4nx-layout); -1 leaves a field to the file. */
typedef struct eng_q4nx_layout {
    int raster[ENG_Q4NX_FAM_COUNT]; /* an eng_q4nx_raster_t, or -1 */
    int q4_signed;                  /* 1: Q4_0 codes, 0: Q4_1, -1 */
} eng_q4nx_layout_t;

/* Nothing settled: everything from the file. */
void eng_q4nx_layout_none(eng_q4nx_layout_t *l);

/**
 * @brief Parses a --q4nx-layout setting: comma-separated "q4=A|B",
 *   "q8=A|B" and "q4-codes=signed|unsigned", each at most once (an empty
 *   string settles nothing).
 * @returns SVC_OK; SVC_ERR_INVALID with errstr naming the part at fault.
 */
SVC_WUR svc_err_t eng_q4nx_layout_parse(const char *spec, eng_q4nx_layout_t *out, char *errstr,
                                        size_t errstr_size);

/* How open() settled one family. */
typedef struct eng_q4nx_decision {
    bool              present;  /* the file holds tiles of the family */
    eng_q4nx_raster_t raster;   /* meaningful when present */
    char              how[320]; /* the evidence, one line */
} eng_q4nx_decision_t;

/* One stored tensor, as listed by eng_q4nx_at. Strings live until close. */
typedef struct eng_q4nx_info {
    const char            *name;    /* Q4NX name */
    const char            *hf_name; /* HF name, or NULL (auxiliary copies, unknown names) */
    eng_q4nx_kind_t        kind; /* 5120-byte tiles: Q4_1 or Q4_0, or legacy Q8 by look (§4.5) */
    eng_q4nx_xform_t       xform;
    const eng_st_tensor_t *st; /* stored dtype, shape, bytes */
} eng_q4nx_info_t;

/* ".../x.weight" -> ".../x.bf16.weight", the alpha/beta BF16 copy's name
 * (§2.4); SVC_ERR_INVALID when buf is too small or name has no .weight. */
SVC_WUR svc_err_t eng_q4nx_bf16_name(const char *name, char *buf, size_t n);
/* The entry of info (eng_st order of st) for the stored tensor name, or NULL. */
const eng_q4nx_info_t *eng_q4nx_info_find(const eng_st_t *st, const eng_q4nx_info_t *info,
                                          const char *name);

/* SVC_ERR_FORMAT with `q4nx "<path>": <message>` in errstr (the reader's
 * one way to refuse a file). */
SVC_FMT(4, 5)
svc_err_t eng_q4nx_failf(const eng_st_t *st, char *errstr, size_t n, const char *fmt, ...);

/* eng_q4nx_layout.c, for open(): sorts each 5120-byte Q4_1-looking tensor
 * of info into Q4_1 or Q4_0 (info[i].kind) and settles both families into
 * dec. Refusals are SVC_ERR_FORMAT, one line naming the file, the tensor or
 * family and the setting that settles it. */
SVC_WUR svc_err_t eng_q4nx_layout_decide(const eng_st_t *st, eng_q4nx_info_t *info, size_t n,
                                         const eng_q4nx_layout_t *forced,
                                         eng_q4nx_decision_t dec[ENG_Q4NX_FAM_COUNT], char *errstr,
                                         size_t errstr_size);

/**
 * @brief Maps a model.q4nx, validates every packed tensor's geometry,
 *   detects the generation (§0.2) and settles the layouts the file does not
 *   name (above: the code order of each tile family, Q4_1 or Q4_0 codes).
 * @returns SVC_OK with *out set (free with eng_q4nx_close); otherwise the
 *   eng_st_open codes or SVC_ERR_FORMAT, with one line in errstr naming the
 *   file, the tensor and the expectation.
 */
SVC_WUR svc_err_t eng_q4nx_open(const char *path, eng_q4nx_t **out, char *errstr,
                                size_t errstr_size);
/* As eng_q4nx_open, with what the caller settles (NULL: nothing). */
SVC_WUR svc_err_t eng_q4nx_open_with(const char *path, const eng_q4nx_layout_t *forced,
                                     eng_q4nx_t **out, char *errstr, size_t errstr_size);
void              eng_q4nx_close(eng_q4nx_t *q); /* NULL is a no-op */

eng_q4nx_gen_t eng_q4nx_generation(const eng_q4nx_t *q);
/* Raster used for 8704-byte Q8 tiles (B when the file holds none). */
eng_q4nx_raster_t eng_q4nx_q8_raster(const eng_q4nx_t *q);
/* How the open settled family f (eng_q4nx_layout_decide). */
const eng_q4nx_decision_t *eng_q4nx_decision(const eng_q4nx_t *q, eng_q4nx_family_t f);
size_t                     eng_q4nx_count(const eng_q4nx_t *q);
/* Tensors 0..count-1 in name order; NULL past the end. */
const eng_q4nx_info_t *eng_q4nx_at(const eng_q4nx_t *q, size_t i);
/* The stored tensor behind an HF name, or NULL (follows the tied embed). */
const eng_q4nx_info_t *eng_q4nx_find_hf(const eng_q4nx_t *q, const char *hf_name);

/**
 * @brief Dequantizes one tensor and undoes the converter's transforms into
 *   caller memory, giving exactly what the HF checkpoint holds (up to the
 *   quantization error).
 * @param dims the HF shape the caller expects (rank entries), e.g. (6144,
 *   2048) for in_proj_qkv, (6144, 1, 4) or (6144, 4) for conv1d. A packed
 *   tensor needs it: its rows and columns are padded (§3.2) and 5120-byte
 *   tiles are told apart by the logical K (§4.5).
 * @param out room for the product of dims floats.
 * @returns SVC_OK; SVC_ERR_INVALID (unknown name, shape mismatch, a value
 *   the inverse transform cannot take), SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_q4nx_tensor_f32(const eng_q4nx_t *q, const char *hf_name, size_t rank,
                                      const uint64_t *dims, float *out, char *errstr,
                                      size_t errstr_size);

/**
 * @brief As eng_q4nx_tensor_f32 for a matrix stored as Q4/Q8 tiles, as its
 *   group codes (eng_q4nx_decode_groups_ref) with the q_proj regroup
 *   undone: *u (R, K) bytes, *d and *m (R, ceil(K / 32)) fp32, w = d u + m
 *   bit for bit the values eng_q4nx_tensor_f32 returns, but for two cases
 *   no quantizer writes (found by tests/fuzz/fuzz_q4nx.c): in Q8, legacy
 *   Q8 and Q4_0 tiles a zero scale with a negative code gives +0 where the
 *   decoder gives -0, and scales near FLT_MAX / 256 overflow to inf/NaN.
 * @param dims (R, K), the HF shape.
 * @returns SVC_OK with *u, *d, *m malloc'd and owned by the caller;
 *   SVC_ERR_UNSUPPORTED, with nothing allocated and errstr untouched, when
 *   the tensor is not stored in tiles (read it with eng_q4nx_tensor_f32);
 *   otherwise as eng_q4nx_tensor_f32. The three are NULL on failure.
 */
SVC_WUR svc_err_t eng_q4nx_tensor_groups(const eng_q4nx_t *q, const char *hf_name,
                                         const uint64_t dims[2], uint8_t **u, float **d, float **m,
                                         char *errstr, size_t errstr_size);

/* ======================================================================
 * Writer
 * ====================================================================== */

typedef struct eng_q4nx_writer eng_q4nx_writer_t;

/**
 * @brief A writer for a model.q4nx, laid out as official Gen-B files until
 *   eng_q4nx_writer_set_layout says otherwise.
 * @param head_dim full-attention head size, needed to regroup q_proj (§2.2).
 */
SVC_WUR svc_err_t eng_q4nx_writer_new(size_t head_dim, eng_q4nx_writer_t **out);
void              eng_q4nx_writer_free(eng_q4nx_writer_t *w); /* NULL is a no-op */

/* What a writer holds besides official Gen-B's layout: the files the
 * public converter makes from other GGUF types (Q4NX.md §2.6, §3.3, §8.1). */
typedef struct eng_q4nx_wlayout {
    eng_q4nx_kind_t   proj;       /* the 4-bit projections: Q4_K (default), Q4_1, Q4_0 */
    eng_q4nx_kind_t   alpha;      /* alpha/beta: Q8 (default) or proj */
    eng_q4nx_raster_t raster;     /* the code order of Q4_1, Q4_0 and Q8 tiles (default B) */
    bool              embed_bf16; /* also the BF16 embedding beside the tied Q8 lm_head (Gen-A) */
} eng_q4nx_wlayout_t;

/* Sets the layout before the first add. SVC_ERR_INVALID: a kind above
 * not allowed, or tensors already added. */
SVC_WUR svc_err_t eng_q4nx_writer_set_layout(eng_q4nx_writer_t *w, const eng_q4nx_wlayout_t *l);

/* Encodes a matrix of packed kind into tiles in place of eng_q4nx_encode_ref
 * (same contract: w (rows, cols) row-major after the row transforms of
 * §2.2 -- the q_proj regroup moves rows, alpha/beta rows are duplicated,
 * so each row is one of hf_name's --, packed of eng_q4nx_packed_bytes);
 * on failure errstr says why. */
typedef svc_err_t (*eng_q4nx_encode_fn)(void *user, const char *hf_name, eng_q4nx_kind_t kind,
                                        eng_q4nx_raster_t raster, const float *w, size_t rows,
                                        size_t cols, void *packed, char *errstr,
                                        size_t errstr_size);
/* The encoder of the packed matrices added from now on (NULL: the
 * reference encoders); `quantize --method gptq` rounds with GPTQ. */
void eng_q4nx_writer_set_encoder(eng_q4nx_writer_t *w, eng_q4nx_encode_fn fn, void *user);

/**
 * @brief Encodes one HF tensor (applying the §2.2 transforms) into the writer.
 * @param kind ENG_Q4NX_AUTO picks what official Gen-B files hold (§2.6),
 *   or the writer's layout: Q4_K (layout: proj) for 2-D projections, Q8
 *   (alpha/beta: layout alpha) for alpha/beta/out_proj/embed, BF16 or F32
 *   for the rest; a packed kind forces it for a 2-D weight.
 * @remark data is copied/encoded before returning. embed_tokens.weight is
 *   written as the tied Q8 lm_head.weight (and, with embed_bf16, as the
 *   BF16 model.embed_tokens.weight too), so adding both is refused;
 *   in_proj_a/b also get their ".bf16" copy.
 * @returns SVC_OK; SVC_ERR_INVALID (unknown name, wrong rank, duplicate,
 *   non-finite value), SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_q4nx_writer_add(eng_q4nx_writer_t *w, const char *hf_name, size_t rank,
                                      const uint64_t *dims, const float *data, eng_q4nx_kind_t kind,
                                      char *errstr, size_t errstr_size);

/* One tensor as the writer holds it: its Q4NX name and the bytes finish
 * writes (tiles, BF16, F32), after every transform and encoding. */
typedef struct eng_q4nx_wtensor {
    const char     *name;
    eng_dtype_t     dtype;
    uint32_t        rank;
    const uint64_t *shape; /* (rank) */
    const uint8_t  *data;
    size_t          nbytes;
} eng_q4nx_wtensor_t;

/* Tensors held so far (an add may make two: alpha/beta's ".bf16" copy,
 * Gen-A's embedding); in the order added until finish sorts them. */
size_t eng_q4nx_writer_count(const eng_q4nx_writer_t *w);
/* Tensor i (< count), borrowed: valid until the next add or finish. */
void eng_q4nx_writer_tensor(const eng_q4nx_writer_t *w, size_t i, eng_q4nx_wtensor_t *t);

/**
 * @brief Adds a tensor already in its stored form (a copy of t->data), as
 *   another writer held it (eng_q4nx_writer_tensor): `quantize --resume`
 *   puts back the tiles of the layers a killed run had finished, so that
 *   finish writes the bytes an uninterrupted run would.
 * @returns SVC_OK; SVC_ERR_INVALID (a name already held, rank over
 *   ENG_ST_MAX_RANK, nbytes not the shape's size), SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_q4nx_writer_add_encoded(eng_q4nx_writer_t *w, const eng_q4nx_wtensor_t *t,
                                              char *errstr, size_t errstr_size);

/**
 * @brief Writes the safetensors file to path (through path + ".tmp" and a
 *   rename, so a failed write leaves no partial file under path).
 * @returns SVC_OK, SVC_ERR_IO, SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_q4nx_writer_finish(eng_q4nx_writer_t *w, const char *path, char *errstr,
                                         size_t errstr_size);

/* ======================================================================
 * Vision tower (vision_weight.q4nx; Q4NX.md §2.7, §5)
 *
 * Every tensor is BF16 and named "model.visual.<HF suffix>" (the HF name
 * itself). The four matmul weights of a block and the merger's two
 * (names ending in attn.qkv.weight, attn.proj.weight, fc1.weight,
 * fc2.weight) are tiled: the logical W[N, K] (out, in) is zero-padded to
 * Np x Kp and stored as [Np/MM_N, Kp/MM_K, MM_N*MM_K], each MM_N x MM_K
 * block row-major, blocks N-major then K (§5). The converter pads both
 * sides to multiples of max(MM_N, MM_K); the reader also accepts the
 * minimal padding (multiples of MM_N, resp. MM_K), which §7's second
 * example shows ([128, 1024] -> [2, 2, 32768]). Everything else (biases,
 * norms, pos_embed [npos, hidden], patch_embed [hidden, 3, T, P, P]) is
 * stored as HF holds it.
 *
 * Reading (the tensors come out as the HF fp32 arrays, padding dropped):
 *     eng_q4nx_t *v = NULL;
 *     eng_q4nx_open(dir "/vision_weight.q4nx", &v, errstr, n);
 *     size_t mm_n = 0, mm_k = 0;        // 0: not in config.json
 *     eng_q4nx_vision_tiles_from_config(json_object_get(cfg, "vision_config"),
 *                                       &mm_n, &mm_k, errstr, n);
 *     eng_q4nx_set_vision_tiles(v, mm_n, mm_k, errstr, n);
 *     uint64_t d[2] = {3072, 1024};
 *     eng_q4nx_tensor_f32(v, "model.visual.blocks.0.attn.qkv.weight", 2, d, out, errstr, n);
 * A file opened this way also answers eng_q4nx_generation (GEN_B: it has
 * no embed_tokens) and q8_raster; both are meaningless for a file without
 * text tensors, and nothing about its vision tensors affects them (they
 * are BF16, never tiles of §3/§4).
 * ====================================================================== */

#define ENG_Q4NX_VISION_PREFIX "model.visual."
#define ENG_Q4NX_VISION_MM_N   64u   /* §5 default and every converter config */
#define ENG_Q4NX_VISION_MM_K   512u  /* the 2B's vision_MM_K; the writer's default */
#define ENG_Q4NX_VISION_MM_MAX 4096u /* larger tiles are refused as nonsense */

/* "model.visual." or "visual." followed by something. */
bool eng_q4nx_vision_name(const char *name);
/* A vision name whose weight the converter tiles (§2.7 last paragraph). */
bool eng_q4nx_vision_tiled_name(const char *name);

/* Stored shape of a tiled W[N, K] as the converter writes it: N and K
 * padded to multiples of max(mm_n, mm_k) (§5). */
void eng_q4nx_vision_tiled_shape(uint64_t N, uint64_t K, size_t mm_n, size_t mm_k,
                                 uint64_t shape[3]);
/* Element index of W[n, k] in a stored tensor with kb K-blocks (§5):
 * ((n / mm_n) * kb + k / mm_k) * mm_n * mm_k + (n % mm_n) * mm_k + k % mm_k. */
uint64_t eng_q4nx_vision_index(uint64_t n, uint64_t k, uint64_t kb, size_t mm_n, size_t mm_k);

/**
 * @brief Tiles a row-major f32 W[N, K] into little-endian BF16 (RNE) bytes
 *   of the stored shape (shape[0] * mm_n >= N, shape[1] * mm_k >= K,
 *   shape[2] == mm_n * mm_k); padding is +0.
 * @param out room for 2 * shape[0] * shape[1] * shape[2] bytes.
 */
void eng_q4nx_vision_tile(const float *w, size_t N, size_t K, size_t mm_n, size_t mm_k,
                          const uint64_t shape[3], uint8_t *out);
/**
 * @brief The inverse: W[N, K] out of a stored tiled tensor of dtype dt
 *   (BF16, F16 or F32, little-endian, any alignment), padding dropped.
 *   Shapes as above; the caller checks them (eng_q4nx_tensor_f32 does).
 */
void eng_q4nx_vision_untile(const void *stored, eng_dtype_t dt, const uint64_t shape[3],
                            size_t mm_n, size_t mm_k, size_t N, size_t K, float *out);

struct json_t; /* jansson */

/**
 * @brief The tile sizes a config.json vision_config object names:
 *   VISION_MM_TILE_N / VISION_MM_TILE_K, else vision_MM_N / vision_MM_K
 *   (§5). A missing key (or a NULL / non-object vision_config) gives 0,
 *   which eng_q4nx_set_vision_tiles reads as "use §5's fallback".
 * @returns SVC_OK; SVC_ERR_FORMAT when a key is there but not an integer
 *   in 1..ENG_Q4NX_VISION_MM_MAX.
 */
SVC_WUR svc_err_t eng_q4nx_vision_tiles_from_config(const struct json_t *vision_config,
                                                    size_t *mm_n, size_t *mm_k, char *errstr,
                                                    size_t errstr_size);

/**
 * @brief Sets the tile sizes eng_q4nx_tensor_f32 untiles vision weights
 *   with. Call it right after open, before q is shared between threads.
 * @param mm_n, mm_k 0 (either) keeps §5's fallback, the default: MM_N = 64
 *   and MM_K = shape[2] / 64 per tensor. Otherwise both in
 *   1..ENG_Q4NX_VISION_MM_MAX, and the larger a multiple of the smaller
 *   (the converter pads both sides to the larger one).
 * @returns SVC_OK; SVC_ERR_INVALID (sizes refused, q unchanged).
 */
SVC_WUR svc_err_t eng_q4nx_set_vision_tiles(eng_q4nx_t *q, size_t mm_n, size_t mm_k, char *errstr,
                                            size_t errstr_size);
/* The rules above for two nonzero sizes. */
bool eng_q4nx_vision_tiles_valid(size_t mm_n, size_t mm_k);
/* The sizes set (0, 0 when §5's fallback applies). */
void eng_q4nx_vision_tiles(const eng_q4nx_t *q, size_t *mm_n, size_t *mm_k);
/* How many stored tensors have a vision name. */
size_t eng_q4nx_vision_count(const eng_q4nx_t *q);

/* eng_q4nx_vision.c, for eng_q4nx_tensor_f32: a tiled vision tensor t (of
 * file path) as W[dims[0], dims[1]], with tile sizes mm_n/mm_k (0: §5's
 * fallback). Checks the tile size, the grid against dims and that the
 * padding is zero (a wrong MM_K scrambles blocks and shows there). */
SVC_WUR svc_err_t eng_q4nx_vision_read(const char *path, const eng_st_tensor_t *t, size_t mm_n,
                                       size_t mm_k, const uint64_t dims[2], float *out,
                                       char *errstr, size_t errstr_size);

/**
 * @brief Tile sizes for the vision weights a writer tiles (default
 *   ENG_Q4NX_VISION_MM_N x ENG_Q4NX_VISION_MM_K); same rules as
 *   eng_q4nx_set_vision_tiles, except that 0 is refused. Vision names
 *   given to eng_q4nx_writer_add are written BF16 (any rank up to
 *   ENG_ST_MAX_RANK), the tiled ones (2-D) tiled with these sizes.
 */
SVC_WUR svc_err_t eng_q4nx_writer_set_vision_tiles(eng_q4nx_writer_t *w, size_t mm_n, size_t mm_k);

#endif /* D3STREAM_ENG_Q4NX_INT_H */
