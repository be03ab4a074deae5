/*
 * eng_q4nx_vision.c -- the vision tower's tiling in vision_weight.q4nx
 * (eng_q4nx_int.h "Vision tower"; Q4NX.md §2.7, §5, §7).
 *
 * The converter's _multi_modal_mm_weight_rearrange stores a matmul weight
 * W[N, K] as [Np/MM_N, Kp/MM_K, MM_N*MM_K] BF16 after zero-padding N and K.
 * Nothing in the file says MM_N and MM_K; config.json may (VISION_MM_TILE_*
 * or vision_MM_*), else §5 says MM_N = 64 and MM_K = shape[2] / 64. A wrong
 * guess gives the right element count but scrambled blocks, so the reader
 * checks what it can: the tile size, the grid against the logical shape,
 * and that every padding element is zero.
 */
#include "eng_q4nx_int.h"

#include <jansson.h>

#define VIS_PREFIX2 "visual."

static bool has_prefix(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

static bool has_suffix(const char *s, const char *x) {
    size_t n = strlen(s), k = strlen(x);
    return n >= k && strcmp(s + n - k, x) == 0;
}

bool eng_q4nx_vision_name(const char *name) {
    return (has_prefix(name, ENG_Q4NX_VISION_PREFIX) && name[strlen(ENG_Q4NX_VISION_PREFIX)]) ||
           (has_prefix(name, VIS_PREFIX2) && name[strlen(VIS_PREFIX2)]);
}

bool eng_q4nx_vision_tiled_name(const char *name) {
    return eng_q4nx_vision_name(name) &&
           (has_suffix(name, "fc1.weight") || has_suffix(name, "fc2.weight") ||
            has_suffix(name, "attn.proj.weight") || has_suffix(name, "attn.qkv.weight"));
}

static uint64_t round_up(uint64_t a, uint64_t m) {
    return (a + m - 1) / m * m;
}

void eng_q4nx_vision_tiled_shape(uint64_t N, uint64_t K, size_t mm_n, size_t mm_k,
                                 uint64_t shape[3]) {
    uint64_t p = mm_n > mm_k ? mm_n : mm_k;
    shape[0] = round_up(N, p) / mm_n;
    shape[1] = round_up(K, p) / mm_k;
    shape[2] = (uint64_t)mm_n * mm_k;
}

uint64_t eng_q4nx_vision_index(uint64_t n, uint64_t k, uint64_t kb, size_t mm_n, size_t mm_k) {
    return ((n / mm_n) * kb + k / mm_k) * ((uint64_t)mm_n * mm_k) + (n % mm_n) * mm_k + k % mm_k;
}

void eng_q4nx_vision_tile(const float *w, size_t N, size_t K, size_t mm_n, size_t mm_k,
                          const uint64_t shape[3], uint8_t *out) {
    size_t total = (size_t)(shape[0] * shape[1] * shape[2]);
    memset(out, 0, 2 * total);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++) {
            uint64_t i = eng_q4nx_vision_index(n, k, shape[1], mm_n, mm_k);
            uint16_t h = eng_f32_to_bf16(w[n * K + k]);
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
}

/* n elements of dtype dt at byte address p -> dst. */
static void row_to_f32(const uint8_t *p, eng_dtype_t dt, float *dst, size_t n) {
    if (dt == ENG_DT_BF16)
        eng_bf16_row_to_f32(p, dst, n);
    else if (dt == ENG_DT_F16)
        eng_f16_row_to_f32(p, dst, n);
    else
        memcpy(dst, p, n * sizeof *dst); /* F32, little-endian host */
}

void eng_q4nx_vision_untile(const void *stored, eng_dtype_t dt, const uint64_t shape[3],
                            size_t mm_n, size_t mm_k, size_t N, size_t K, float *out) {
    const uint8_t *s = stored;
    size_t         es = eng_dtype_size(dt), kb = (size_t)shape[1];
    /* each block row holds mm_k contiguous K values: copy runs, not elements */
    for (size_t n = 0; n < N; n++)
        for (size_t b = 0; b * mm_k < K; b++) {
            size_t len = K - b * mm_k < mm_k ? K - b * mm_k : mm_k;
            size_t at = (size_t)eng_q4nx_vision_index(n, b * mm_k, kb, mm_n, mm_k);
            row_to_f32(s + at * es, dt, out + n * K + b * mm_k, len);
        }
}

/* ---------------------------------------------------------------------
 * Tile sizes
 * --------------------------------------------------------------------- */

/* vision_config[key] as a size: 0 when absent; -1 when present but bad. */
static long cfg_tile(const json_t *vc, const char *key) {
    const json_t *v = json_object_get(vc, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > ENG_Q4NX_VISION_MM_MAX)
        return -1;
    return (long)json_integer_value(v);
}

svc_err_t eng_q4nx_vision_tiles_from_config(const struct json_t *vision_config, size_t *mm_n,
                                            size_t *mm_k, char *errstr, size_t errstr_size) {
    static const char *const keys[2][2] = {{"VISION_MM_TILE_N", "vision_MM_N"},
                                           {"VISION_MM_TILE_K", "vision_MM_K"}};
    size_t                  *out[2] = {mm_n, mm_k};
    for (size_t i = 0; i < 2; i++) {
        *out[i] = 0;
        for (size_t j = 0; json_is_object(vision_config) && !*out[i] && j < 2; j++) {
            long v = cfg_tile(vision_config, keys[i][j]);
            if (v < 0) {
                svc_errf(errstr, errstr_size,
                         "config.json vision_config.%s must be an integer in 1..%u (Q4NX.md §5)",
                         keys[i][j], ENG_Q4NX_VISION_MM_MAX);
                return SVC_ERR_FORMAT;
            }
            *out[i] = (size_t)v;
        }
    }
    return SVC_OK;
}

/* The rules eng_q4nx_set_vision_tiles and the writer share (both nonzero). */
static bool tiles_ok(size_t mm_n, size_t mm_k) {
    size_t lo = mm_n < mm_k ? mm_n : mm_k, hi = mm_n < mm_k ? mm_k : mm_n;
    return lo >= 1 && hi <= ENG_Q4NX_VISION_MM_MAX && hi % lo == 0;
}

bool eng_q4nx_vision_tiles_valid(size_t mm_n, size_t mm_k) {
    return tiles_ok(mm_n, mm_k);
}

/* ---------------------------------------------------------------------
 * Reading one tiled tensor
 * --------------------------------------------------------------------- */

SVC_FMT(5, 6)
static svc_err_t vr_fail(const char *path, const eng_st_tensor_t *t, char *errstr, size_t n,
                         const char *fmt, ...) {
    char    msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(errstr, n, "q4nx \"%s\": tensor \"%s\": %s", path, t->name, msg);
    return SVC_ERR_INVALID;
}

/* Is the stored padding count p (elements) one the converter or a minimal
 * writer gives for a logical extent x with tile m, p_max = max(MM_N, MM_K)? */
static bool pad_ok(uint64_t stored, uint64_t x, uint64_t m, uint64_t p_max) {
    return stored == round_up(x, m) || stored == round_up(x, p_max);
}

/* First nonzero padding element (sign bit ignored): its (n, k), or false. */
static bool padding_dirty(const eng_st_tensor_t *t, size_t mm_n, size_t mm_k, uint64_t N,
                          uint64_t K, uint64_t *bn, uint64_t *bk) {
    const uint8_t *d = t->data;
    size_t         es = eng_dtype_size(t->dtype);
    uint64_t       Np = t->shape[0] * mm_n, Kp = t->shape[1] * mm_k;
    for (uint64_t n = 0; n < Np; n++)
        for (uint64_t k = n < N ? K : 0; k < Kp; k++) {
            const uint8_t *e = d + eng_q4nx_vision_index(n, k, t->shape[1], mm_n, mm_k) * es;
            bool           zero = true;
            for (size_t b = 0; b < es; b++) /* the top byte holds the sign bit */
                zero = zero && (e[b] & (b + 1 == es ? 0x7f : 0xff)) == 0;
            if (!zero) {
                *bn = n;
                *bk = k;
                return true;
            }
        }
    return false;
}

svc_err_t eng_q4nx_vision_read(const char *path, const eng_st_tensor_t *t, size_t mm_n, size_t mm_k,
                               const uint64_t dims[2], float *out, char *errstr,
                               size_t errstr_size) {
    if (t->dtype != ENG_DT_BF16 && t->dtype != ENG_DT_F16 && t->dtype != ENG_DT_F32)
        return vr_fail(path, t, errstr, errstr_size, "dtype %s, expected BF16 (Q4NX.md §2.7)",
                       eng_dtype_name(t->dtype));
    uint64_t B = t->shape[2];
    bool     guessed = !mm_n || !mm_k;
    if (guessed) { /* §5: MM_N = 64, MM_K = shape[2] / 64 */
        mm_n = ENG_Q4NX_VISION_MM_N;
        mm_k = B % mm_n ? 0 : (size_t)(B / mm_n);
    }
    if (!mm_k || (uint64_t)mm_n * mm_k != B || !tiles_ok(mm_n, mm_k))
        return vr_fail(path, t, errstr, errstr_size,
                       "blocks of %llu elements, expected MM_N x MM_K = %zu x %zu %s(Q4NX.md §5)",
                       (unsigned long long)B, mm_n, mm_k,
                       guessed ? "(no VISION_MM_TILE_N/K in config.json) " : "");
    uint64_t N = dims[0], K = dims[1], p = mm_n > mm_k ? mm_n : mm_k;
    uint64_t Np = t->shape[0] * mm_n, Kp = t->shape[1] * mm_k;
    if (!N || !K || !pad_ok(Np, N, mm_n, p) || !pad_ok(Kp, K, mm_k, p)) {
        uint64_t want[3];
        eng_q4nx_vision_tiled_shape(N, K, mm_n, mm_k, want);
        return vr_fail(path, t, errstr, errstr_size,
                       "stored [%llu, %llu, %llu] cannot hold [%llu, %llu] in %zu x %zu blocks "
                       "(expected [%llu, %llu, %llu], Q4NX.md §5)",
                       (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
                       (unsigned long long)B, (unsigned long long)N, (unsigned long long)K, mm_n,
                       mm_k, (unsigned long long)want[0], (unsigned long long)want[1],
                       (unsigned long long)want[2]);
    }
    uint64_t bn, bk;
    if (padding_dirty(t, mm_n, mm_k, N, K, &bn, &bk))
        return vr_fail(path, t, errstr, errstr_size,
                       "padding element (%llu, %llu) of [%llu, %llu] is not zero: not tiled "
                       "%zu x %zu? (Q4NX.md §5)",
                       (unsigned long long)bn, (unsigned long long)bk, (unsigned long long)N,
                       (unsigned long long)K, mm_n, mm_k);
    eng_q4nx_vision_untile(t->data, t->dtype, t->shape, mm_n, mm_k, (size_t)N, (size_t)K, out);
    return SVC_OK;
}
