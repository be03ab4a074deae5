/*
 * fuzz_safetensors.c -- libFuzzer harness for the safetensors reader
 * (engine/eng_safetensors.c): any bytes as a package file -> eng_st_open.
 *
 * A refusal must be a format error with a message that names the file.
 * What opens is checked against the header read again here with jansson
 * alone: every tensor of the header and no other, in name order, its
 * dtype and shape as written, its bytes those of data_offsets inside the
 * data region (compared, so a descriptor that points elsewhere in the
 * mapping shows), no two overlapping, the byte count the shape needs, the
 * metadata strings as written, and the float conversions exact.
 *
 *     tests/fuzz/run.sh [SECONDS]    # libFuzzer, with the others
 *     build/tests/fuzz_replay_safetensors tests/fuzz/corpus/safetensors
 */
#include "eng_st_int.h"
#include "fuzz_util.h"

#include <jansson.h>
#include <math.h>

/* Tensors up to this many elements go through eng_st_to_f32 too. */
#define FUZZ_MAX_CONVERT 65536u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The header as written; the reader accepted it, so it must parse. */
typedef struct header {
    json_t        *root;
    const uint8_t *region; /* the data region */
    size_t         region_len;
} header_t;

static void header_read(const uint8_t *data, size_t size, header_t *h) {
    FUZZ_CHECK(size >= 8);
    uint64_t hlen = u64le(data);
    FUZZ_CHECK(hlen <= size - 8);
    h->root = json_loadb((const char *)data + 8, (size_t)hlen, JSON_DECODE_ANY, NULL);
    FUZZ_CHECK(json_is_object(h->root));
    h->region = data + 8 + hlen;
    h->region_len = size - 8 - (size_t)hlen;
}

/* t against its header entry; returns its data_offsets. */
static void check_entry(const eng_st_tensor_t *t, const header_t *h, uint64_t off[2]) {
    const json_t *e = json_object_get(h->root, t->name);
    FUZZ_CHECK(json_is_object(e));
    FUZZ_CHECK(strcmp(json_string_value(json_object_get(e, "dtype")), eng_dtype_name(t->dtype)) ==
               0);
    const json_t *shape = json_object_get(e, "shape");
    FUZZ_CHECK(t->rank <= ENG_ST_MAX_RANK && json_array_size(shape) == t->rank);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < t->rank; i++) {
        FUZZ_CHECK((uint64_t)json_integer_value(json_array_get(shape, i)) == t->shape[i]);
        numel *= t->shape[i];
    }
    FUZZ_CHECK(eng_st_numel(t) == numel);
    FUZZ_CHECK(t->nbytes == numel * eng_dtype_size(t->dtype));
    const json_t *o = json_object_get(e, "data_offsets");
    off[0] = (uint64_t)json_integer_value(json_array_get(o, 0));
    off[1] = (uint64_t)json_integer_value(json_array_get(o, 1));
    FUZZ_CHECK(off[0] <= off[1] && off[1] <= h->region_len && off[1] - off[0] == t->nbytes);
    /* Reads every byte of the descriptor: outside the mapping it faults. */
    FUZZ_CHECK(t->nbytes == 0 || memcmp(t->data, h->region + off[0], t->nbytes) == 0);
}

static int range_cmp(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : 0;
}

/* Nonempty ranges, sorted by start, never overlap. */
static void check_overlaps(uint64_t (*r)[2], size_t n) {
    qsort(r, n, sizeof *r, range_cmp);
    uint64_t end = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i][0] == r[i][1])
            continue;
        FUZZ_CHECK(r[i][0] >= end);
        end = r[i][1];
    }
}

/* IEEE half to float, by arithmetic rather than by bits. */
static float f16_value(uint16_t h) {
    int   exp = (h >> 10) & 0x1f;
    float man = (float)(h & 0x3ff), sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (exp == 0x1f)
        return man != 0 ? NAN : sign * INFINITY;
    if (exp == 0)
        return sign * ldexpf(man, -24);
    return sign * ldexpf(1024.0f + man, exp - 25);
}

static void check_value(eng_dtype_t dt, const uint8_t *p, float got) {
    uint32_t bits;
    memcpy(&bits, &got, sizeof bits);
    if (dt == ENG_DT_F32) {
        FUZZ_CHECK(memcmp(p, &bits, 4) == 0);
        return;
    }
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    if (dt == ENG_DT_BF16) {
        FUZZ_CHECK(bits == (uint32_t)h << 16);
        return;
    }
    float want = f16_value(h);
    FUZZ_CHECK(isnan(want) ? isnan(got) : memcmp(&want, &got, sizeof got) == 0);
}

/* The conversion is exact. (eng_st_to_f32 drops the tensor's pages from
 * the mapping; they read back from the memfd, unchanged.) */
static void check_convert(const eng_st_tensor_t *t) {
    bool   floats = t->dtype == ENG_DT_F32 || t->dtype == ENG_DT_BF16 || t->dtype == ENG_DT_F16;
    size_t n = (size_t)eng_st_numel(t), es = eng_dtype_size(t->dtype);
    float *out = malloc((n ? n : 1) * sizeof *out);
    FUZZ_CHECK(out != NULL);
    svc_err_t err = eng_st_to_f32(t, out);
    FUZZ_CHECK(err == (floats ? SVC_OK : SVC_ERR_UNSUPPORTED));
    for (size_t i = 0; floats && i < n; i++)
        check_value(t->dtype, (const uint8_t *)t->data + i * es, out[i]);
    free(out);
}

static void check_metadata(const eng_st_t *st, const header_t *h) {
    const json_t *meta = json_object_get(h->root, "__metadata__");
    const char   *k;
    const json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        const char *got = eng_st_metadata(st, k);
        FUZZ_CHECK(got != NULL && strcmp(got, json_string_value(v)) == 0);
    }
}

static void check_open(const eng_st_t *st, const header_t *h) {
    size_t n = eng_st_count(st);
    FUZZ_CHECK(n == json_object_size(h->root) - (json_object_get(h->root, "__metadata__") != NULL));
    FUZZ_CHECK(eng_st_at(st, n) == NULL);
    uint64_t(*r)[2] = malloc((n ? n : 1) * sizeof *r);
    FUZZ_CHECK(r != NULL);
    for (size_t i = 0; i < n; i++) {
        const eng_st_tensor_t *t = eng_st_at(st, i);
        FUZZ_CHECK(t != NULL && eng_st_find(st, t->name) == t);
        FUZZ_CHECK(i == 0 || strcmp(eng_st_at(st, i - 1)->name, t->name) < 0);
        check_entry(t, h, r[i]);
    }
    check_overlaps(r, n);
    free(r);
    check_metadata(st, h);
    for (size_t i = 0; i < n; i++)
        if (eng_st_numel(eng_st_at(st, i)) <= FUZZ_MAX_CONVERT)
            check_convert(eng_st_at(st, i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], prefix[96], errstr[1024] = "";
    fuzz_file(data, size, path, sizeof path);
    eng_st_t *st = NULL;
    svc_err_t err = eng_st_open(path, &st, errstr, sizeof errstr);
    if (err != SVC_OK) {
        FUZZ_CHECK(st == NULL);
        FUZZ_CHECK(err == SVC_ERR_FORMAT || err == SVC_ERR_TOO_LARGE ||
                   err == SVC_ERR_UNSUPPORTED || err == SVC_ERR_NOMEM);
        snprintf(prefix, sizeof prefix, "safetensors \"%s\": ", path);
        fuzz_check_message(errstr, prefix);
        return 0;
    }
    FUZZ_CHECK(strcmp(eng_st_path(st), path) == 0);
    header_t h;
    header_read(data, size, &h);
    check_open(st, &h);
    json_decref(h.root);
    eng_st_close(st);
    return 0;
}
