/*
 * eng_safetensors.c -- maps a .safetensors file and validates its header
 * completely before any tensor pointer is handed out (eng_st_int.h).
 *
 * Everything in a package file is untrusted input: lengths are checked
 * against the file size with overflow-safe arithmetic, element counts
 * against byte counts, and tensor ranges against each other, so a broken
 * or hostile file is refused with a message instead of read out of bounds.
 */
#include "eng_st_int.h"
#include "eng_util_int.h"
#include "npu.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tensor data is little-endian on disk; conversions below copy it raw. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "eng_safetensors.c assumes a little-endian host"
#endif

struct eng_st {
    char            *path;
    const uint8_t   *map;
    size_t           map_len;
    eng_st_tensor_t *t; /* sorted by name */
    size_t           n;
    json_t          *meta; /* __metadata__ object, or NULL */
};

/* The file being read and where messages go. */
typedef struct st_ctx {
    const char *path;
    char       *errstr;
    size_t      errstr_size;
} st_ctx_t;

static const struct {
    const char *name;
    size_t      size;
} dtypes[ENG_DT_COUNT] = {
    [ENG_DT_BOOL] = {"BOOL", 1}, [ENG_DT_U8] = {"U8", 1},   [ENG_DT_I8] = {"I8", 1},
    [ENG_DT_I16] = {"I16", 2},   [ENG_DT_U16] = {"U16", 2}, [ENG_DT_F16] = {"F16", 2},
    [ENG_DT_BF16] = {"BF16", 2}, [ENG_DT_I32] = {"I32", 4}, [ENG_DT_U32] = {"U32", 4},
    [ENG_DT_F32] = {"F32", 4},   [ENG_DT_I64] = {"I64", 8}, [ENG_DT_U64] = {"U64", 8},
    [ENG_DT_F64] = {"F64", 8},
};

const char *eng_dtype_name(eng_dtype_t dt) {
    return (unsigned)dt < ENG_DT_COUNT ? dtypes[dt].name : "?";
}

size_t eng_dtype_size(eng_dtype_t dt) {
    return (unsigned)dt < ENG_DT_COUNT ? dtypes[dt].size : 0;
}

/* Prefixes every message with the file, so callers never have to. */
SVC_FMT(3, 4) static svc_err_t st_fail(const st_ctx_t *c, svc_err_t err, const char *fmt, ...) {
    char    msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(c->errstr, c->errstr_size, "safetensors \"%s\": %s", c->path, msg);
    return err;
}

/* ---- mapping ---- */

static svc_err_t st_map(const st_ctx_t *c, const uint8_t **map, size_t *len) {
    uint64_t size = 0;
    int      fd = eng_open_regular(c->path, &size);
    if (fd < 0)
        return errno == EINVAL ? st_fail(c, SVC_ERR_IO, "not a regular file")
                               : st_fail(c, SVC_ERR_IO, "open() failed: %s", strerror(errno));
    svc_err_t err = SVC_OK;
    if (size < 8)
        err = st_fail(c, SVC_ERR_FORMAT,
                      "file is %llu bytes, expected at least the 8-byte header length",
                      (unsigned long long)size);
    else if (size > SIZE_MAX)
        err = st_fail(c, SVC_ERR_TOO_LARGE, "file too large to map");
    if (err) {
        close(fd);
        return err;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file referenced */
    if (p == MAP_FAILED)
        return st_fail(c, SVC_ERR_IO, "mmap() failed: %s", strerror(errno));
    *map = p;
    *len = (size_t)size;
    return SVC_OK;
}

/* ---- header ---- */

static uint64_t read_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static svc_err_t st_parse_header(const st_ctx_t *c, const uint8_t *map, size_t len, json_t **root,
                                 size_t *data_start) {
    uint64_t hlen = read_u64le(map);
    if (hlen >= ENG_ST_MAX_HEADER)
        return st_fail(c, SVC_ERR_TOO_LARGE, "header length %llu, expected less than %u",
                       (unsigned long long)hlen, ENG_ST_MAX_HEADER);
    if (hlen > len - 8)
        return st_fail(c, SVC_ERR_FORMAT,
                       "header length %llu runs past the end of the file (%zu bytes after the "
                       "length field)",
                       (unsigned long long)hlen, len - 8);
    /* DECODE_ANY so that a non-object header gets our own message */
    json_error_t jerr;
    json_t      *j = json_loadb((const char *)map + 8, (size_t)hlen,
                                JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!j)
        return st_fail(c, SVC_ERR_FORMAT, "header is not valid JSON: %s (header byte %d)",
                       jerr.text, jerr.position);
    if (!json_is_object(j)) {
        json_decref(j);
        return st_fail(c, SVC_ERR_FORMAT, "header is not a JSON object");
    }
    *root = j;
    *data_start = 8 + (size_t)hlen;
    return SVC_OK;
}

/* __metadata__ is an optional string -> string map. */
static svc_err_t st_check_metadata(const st_ctx_t *c, const json_t *meta) {
    if (!json_is_object(meta))
        return st_fail(c, SVC_ERR_FORMAT, "__metadata__ is not an object of strings");
    const char *k;
    json_t     *v;
    json_object_foreach((json_t *)meta, k, v) {
        if (!json_is_string(v))
            return st_fail(c, SVC_ERR_FORMAT, "__metadata__ \"%s\" is not a string", k);
    }
    return SVC_OK;
}

/* ---- one tensor ---- */

static svc_err_t st_parse_dtype(const st_ctx_t *c, const char *name, const json_t *v,
                                eng_dtype_t *dt) {
    if (!json_is_string(v))
        return st_fail(c, SVC_ERR_FORMAT, "tensor \"%s\": dtype is missing or not a string", name);
    const char *s = json_string_value(v);
    for (int i = 0; i < ENG_DT_COUNT; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *dt = (eng_dtype_t)i;
            return SVC_OK;
        }
    }
    return st_fail(c, SVC_ERR_UNSUPPORTED,
                   "tensor \"%s\": dtype \"%s\" is not supported (expected BF16, F16, F32, F64, "
                   "I8, U8, I16, U16, I32, U32, I64, U64 or BOOL)",
                   name, s);
}

static svc_err_t st_parse_shape(const st_ctx_t *c, const char *name, const json_t *v,
                                eng_st_tensor_t *t) {
    if (!json_is_array(v))
        return st_fail(c, SVC_ERR_FORMAT, "tensor \"%s\": shape is missing or not an array", name);
    size_t rank = json_array_size(v);
    if (rank > ENG_ST_MAX_RANK)
        return st_fail(c, SVC_ERR_FORMAT, "tensor \"%s\": shape has rank %zu, expected at most %d",
                       name, rank, ENG_ST_MAX_RANK);
    for (size_t i = 0; i < rank; i++) {
        const json_t *d = json_array_get(v, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return st_fail(c, SVC_ERR_FORMAT,
                           "tensor \"%s\": shape[%zu] is not a non-negative integer", name, i);
        t->shape[i] = (uint64_t)json_integer_value(d);
    }
    t->rank = (uint32_t)rank;
    return SVC_OK;
}

static svc_err_t st_parse_offsets(const st_ctx_t *c, const char *name, const json_t *v,
                                  uint64_t off[2]) {
    if (!json_is_array(v) || json_array_size(v) != 2)
        return st_fail(c, SVC_ERR_FORMAT,
                       "tensor \"%s\": data_offsets is missing or not a [begin, end] pair", name);
    for (size_t i = 0; i < 2; i++) {
        const json_t *d = json_array_get(v, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return st_fail(c, SVC_ERR_FORMAT,
                           "tensor \"%s\": data_offsets[%zu] is not a non-negative integer", name,
                           i);
        off[i] = (uint64_t)json_integer_value(d);
    }
    return SVC_OK;
}

/* "[2, 3]" -- for messages only; truncation is harmless. */
static void st_shape_str(const eng_st_tensor_t *t, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < t->rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%llu", i ? ", " : "",
                              (unsigned long long)t->shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

/* Element count and byte count, both overflow-checked. */
static bool st_need_bytes(const eng_st_tensor_t *t, uint64_t *need) {
    uint64_t numel = 1;
    for (uint32_t i = 0; i < t->rank; i++)
        if (__builtin_mul_overflow(numel, t->shape[i], &numel))
            return false;
    return !__builtin_mul_overflow(numel, (uint64_t)eng_dtype_size(t->dtype), need);
}

static svc_err_t st_check_range(const st_ctx_t *c, const eng_st_tensor_t *t, const uint64_t off[2],
                                size_t data_len) {
    char shape[160];
    st_shape_str(t, shape, sizeof shape);
    if (off[0] > off[1])
        return st_fail(c, SVC_ERR_FORMAT,
                       "tensor \"%s\": data_offsets [%llu, %llu) end before they begin", t->name,
                       (unsigned long long)off[0], (unsigned long long)off[1]);
    if (off[1] > data_len)
        return st_fail(c, SVC_ERR_FORMAT,
                       "tensor \"%s\": data_offsets [%llu, %llu) run past the data region (%zu "
                       "bytes)",
                       t->name, (unsigned long long)off[0], (unsigned long long)off[1], data_len);
    uint64_t need;
    if (!st_need_bytes(t, &need))
        return st_fail(c, SVC_ERR_FORMAT, "tensor \"%s\": shape %s %s overflows 64-bit byte count",
                       t->name, shape, eng_dtype_name(t->dtype));
    if (off[1] - off[0] != need)
        return st_fail(c, SVC_ERR_FORMAT,
                       "tensor \"%s\": data_offsets [%llu, %llu) hold %llu bytes, shape %s %s "
                       "needs %llu",
                       t->name, (unsigned long long)off[0], (unsigned long long)off[1],
                       (unsigned long long)(off[1] - off[0]), shape, eng_dtype_name(t->dtype),
                       (unsigned long long)need);
    return SVC_OK;
}

static svc_err_t st_parse_tensor(const st_ctx_t *c, const char *name, const json_t *v,
                                 const uint8_t *data, size_t data_len, eng_st_tensor_t *t,
                                 uint64_t off[2]) {
    if (!json_is_object(v))
        return st_fail(c, SVC_ERR_FORMAT, "tensor \"%s\": entry is not an object", name);
    t->name = name; /* replaced by an owned copy once validated */
    svc_err_t err = st_parse_dtype(c, name, json_object_get(v, "dtype"), &t->dtype);
    if (!err)
        err = st_parse_shape(c, name, json_object_get(v, "shape"), t);
    if (!err)
        err = st_parse_offsets(c, name, json_object_get(v, "data_offsets"), off);
    if (!err)
        err = st_check_range(c, t, off, data_len);
    if (err)
        return err;
    t->data = data + off[0];
    t->nbytes = (size_t)(off[1] - off[0]);
    return SVC_OK;
}

/* ---- whole-file checks ---- */

typedef struct st_range {
    uint64_t b, e;
    size_t   i;
} st_range_t;

static int range_cmp(const void *a, const void *b) {
    const st_range_t *x = a, *y = b;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

/* Two views of the same bytes would let a writer through one tensor corrupt
 * another; the reference library refuses it too. Empty tensors never overlap. */
static svc_err_t st_check_overlaps(const st_ctx_t *c, const eng_st_tensor_t *t, st_range_t *r,
                                   size_t n) {
    qsort(r, n, sizeof *r, range_cmp);
    size_t prev = SIZE_MAX;
    for (size_t k = 0; k < n; k++) {
        if (r[k].b == r[k].e)
            continue;
        if (prev != SIZE_MAX && r[k].b < r[prev].e)
            return st_fail(c, SVC_ERR_FORMAT,
                           "tensor \"%s\": data_offsets [%llu, %llu) overlap tensor \"%s\" [%llu, "
                           "%llu)",
                           t[r[k].i].name, (unsigned long long)r[k].b, (unsigned long long)r[k].e,
                           t[r[prev].i].name, (unsigned long long)r[prev].b,
                           (unsigned long long)r[prev].e);
        if (prev == SIZE_MAX || r[k].e > r[prev].e)
            prev = k;
    }
    return SVC_OK;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const eng_st_tensor_t *)a)->name, ((const eng_st_tensor_t *)b)->name);
}

/* Parses every entry of the header object into st->t (names still borrowed
 * from root), then checks overlaps. */
static svc_err_t st_parse_tensors(const st_ctx_t *c, eng_st_t *st, json_t *root,
                                  size_t data_start) {
    size_t n = json_object_size(root) - (json_object_get(root, "__metadata__") ? 1 : 0);
    st->t = calloc(n ? n : 1, sizeof *st->t);
    st_range_t *r = calloc(n ? n : 1, sizeof *r);
    if (!st->t || !r) {
        free(r);
        return st_fail(c, SVC_ERR_NOMEM, "out of memory for %zu tensors", n);
    }
    const uint8_t *data = st->map + data_start;
    size_t         data_len = st->map_len - data_start;
    svc_err_t      err = SVC_OK;
    const char    *k;
    json_t        *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0)
            continue;
        uint64_t off[2] = {0, 0};
        err = st_parse_tensor(c, k, v, data, data_len, &st->t[st->n], off);
        if (err)
            break;
        r[st->n] = (st_range_t){off[0], off[1], st->n};
        st->n++;
    }
    if (!err)
        err = st_check_overlaps(c, st->t, r, st->n);
    free(r);
    return err;
}

/* Names become owned copies so that the JSON tree can be dropped. */
static svc_err_t st_own_names(const st_ctx_t *c, eng_st_t *st) {
    for (size_t i = 0; i < st->n; i++) {
        char *s = strdup(st->t[i].name);
        if (!s) {
            for (size_t j = 0; j < i; j++)
                free((char *)st->t[j].name);
            st->n = 0;
            return st_fail(c, SVC_ERR_NOMEM, "out of memory");
        }
        st->t[i].name = s;
    }
    return SVC_OK;
}

svc_err_t eng_st_open(const char *path, eng_st_t **out, char *errstr, size_t errstr_size) {
    st_ctx_t  c = {path, errstr, errstr_size};
    eng_st_t *st = calloc(1, sizeof *st);
    *out = NULL;
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return st_fail(&c, SVC_ERR_NOMEM, "out of memory");
    }
    json_t   *root = NULL;
    size_t    data_start = 0;
    svc_err_t err = st_map(&c, &st->map, &st->map_len);
    if (!err)
        err = st_parse_header(&c, st->map, st->map_len, &root, &data_start);
    json_t *meta = root ? json_object_get(root, "__metadata__") : NULL;
    if (!err && meta)
        err = st_check_metadata(&c, meta);
    if (!err)
        err = st_parse_tensors(&c, st, root, data_start);
    if (!err)
        err = st_own_names(&c, st);
    else
        st->n = 0; /* names are still borrowed from root: nothing to free */
    if (!err && meta)
        st->meta = json_incref(meta);
    json_decref(root);
    if (err) {
        eng_st_close(st);
        return err;
    }
    qsort(st->t, st->n, sizeof *st->t, tensor_cmp);
    *out = st;
    return SVC_OK;
}

void eng_st_close(eng_st_t *st) {
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++)
        free((char *)st->t[i].name);
    free(st->t);
    if (st->map)
        munmap((void *)st->map, st->map_len);
    json_decref(st->meta);
    free(st->path);
    free(st);
}

const char *eng_st_path(const eng_st_t *st) {
    return st->path;
}

size_t eng_st_count(const eng_st_t *st) {
    return st->n;
}

const eng_st_tensor_t *eng_st_at(const eng_st_t *st, size_t i) {
    return i < st->n ? &st->t[i] : NULL;
}

const eng_st_tensor_t *eng_st_find(const eng_st_t *st, const char *name) {
    eng_st_tensor_t key = {.name = name};
    return bsearch(&key, st->t, st->n, sizeof *st->t, tensor_cmp);
}

const char *eng_st_metadata(const eng_st_t *st, const char *key) {
    return st->meta ? json_string_value(json_object_get(st->meta, key)) : NULL;
}

uint64_t eng_st_numel(const eng_st_tensor_t *t) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->rank; i++)
        n *= t->shape[i]; /* cannot overflow: checked at open */
    return n;
}

/* ---- conversions ---- */

static float f32_from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float eng_bf16_to_f32(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

float eng_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / nan keep their payload */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in float */
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

void eng_bf16_row_to_f32(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = eng_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

void eng_f16_row_to_f32(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = eng_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

/* Drops the file pages under [p, p + n) from this process's resident set
 * (whole pages only): a tensor is converted once at load, and the mapped
 * file would otherwise stay resident beside its converted copy (3.8 GB for
 * nano). Pages read again later fault back in from the file. */
static void st_release(const void *p, size_t n) {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0 || n < (size_t)ps)
        return;
    uintptr_t lo = ((uintptr_t)p + (uintptr_t)ps - 1) / (uintptr_t)ps * (uintptr_t)ps;
    uintptr_t hi = ((uintptr_t)p + n) / (uintptr_t)ps * (uintptr_t)ps;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* The 16-bit conversions in chunks of 1 Mi values over the kernels' pool:
 * a nano BF16 package is 1.9 G of them at load. */
#define ST_CHUNK ((size_t)1 << 20)

typedef struct st_conv {
    const uint8_t *src;
    float         *dst;
    size_t         n;
    bool           f16;
} st_conv_t;

static void st_conv_chunk(void *ctx, size_t i) {
    const st_conv_t *c = ctx;
    size_t           k = i * ST_CHUNK, len = c->n - k < ST_CHUNK ? c->n - k : ST_CHUNK;
    (c->f16 ? eng_f16_row_to_f32 : eng_bf16_row_to_f32)(c->src + 2 * k, c->dst + k, len);
}

svc_err_t eng_st_to_f32(const eng_st_tensor_t *t, float *out) {
    size_t n = (size_t)eng_st_numel(t);
    switch (t->dtype) {
    case ENG_DT_BF16:
    case ENG_DT_F16: {
        st_conv_t c = {t->data, out, n, t->dtype == ENG_DT_F16};
        npu_parallel_for((n + ST_CHUNK - 1) / ST_CHUNK, st_conv_chunk, &c);
        st_release(t->data, n * 2);
        return SVC_OK;
    }
    case ENG_DT_F32:
        if (n)
            memcpy(out, t->data, n * sizeof *out);
        st_release(t->data, n * 4);
        return SVC_OK;
    default:
        return SVC_ERR_UNSUPPORTED;
    }
}
