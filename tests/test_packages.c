/*
 * test_packages.c -- package file readers: safetensors validation and
 * conversion (eng_safetensors.c), manifests and the identity hash
 * (eng_manifest.c).
 *
 * Every file is built byte by byte here, so each validation rule has a
 * file that breaks exactly that rule. Known answers for the identity hash
 * and canonical JSON were computed with python3 json/hashlib (see the
 * comments at each literal).
 */
#include "eng_manifest_int.h"
#include "eng_st_int.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- temp directories and files ---- */

static char tmpdir[64];

static void mk_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/d3pkgXXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tmpdir(void) {
    if (getenv("D3_KEEP_PKG")) {
        fprintf(stderr, "kept %s\n", tmpdir);
        return;
    }
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void put_file(const char *name, const void *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "fopen %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static void put_str(const char *name, const char *s) {
    put_file(name, s, strlen(s));
}

/* ---- safetensors bytes ---- */

/* 8-byte LE length, header, data; hlen_override != UINT64_MAX lies about N. */
static uint8_t *st_build(const char *header, const void *data, size_t dlen, uint64_t hlen_override,
                         size_t *out_len) {
    size_t   hlen = strlen(header);
    uint64_t n = hlen_override != UINT64_MAX ? hlen_override : hlen;
    uint8_t *b = malloc(8 + hlen + dlen + 1);
    cr_assert_not_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(n >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (dlen)
        memcpy(b + 8 + hlen, data, dlen);
    *out_len = 8 + hlen + dlen;
    return b;
}

static void put_st(const char *name, const char *header, const void *data, size_t dlen) {
    size_t   n;
    uint8_t *b = st_build(header, data, dlen, UINT64_MAX, &n);
    put_file(name, b, n);
    free(b);
}

static char errbuf[1024];

/* Opens tmpdir/name and expects err with msg in the message. */
static void st_expect(const char *name, svc_err_t want, const char *msg) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    eng_st_t *st = (eng_st_t *)1;
    errbuf[0] = '\0';
    svc_err_t err = eng_st_open(path, &st, errbuf, sizeof errbuf);
    cr_assert_eq(err, want, "%s: got %s (%s), want %s", name, svc_err_name(err), errbuf,
                 svc_err_name(want));
    cr_assert_null(st);
    cr_assert(strstr(errbuf, msg), "%s: message \"%s\" lacks \"%s\"", name, errbuf, msg);
    cr_assert(strstr(errbuf, path), "message \"%s\" does not name the file", errbuf);
    cr_assert_null(strchr(errbuf, '\n'), "message is one line");
}

static void st_bad(const char *header, size_t dlen, svc_err_t want, const char *msg) {
    uint8_t data[64] = {0};
    cr_assert(dlen <= sizeof data);
    put_st("bad.safetensors", header, data, dlen);
    st_expect("bad.safetensors", want, msg);
}

/* Two tensors and metadata; data: 4 BF16 then 3 F32. */
static const char valid_hdr[] =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"b.f32\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]},"
    "\"a.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
    "\"s\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[20,21]}}  ";

static void valid_data(uint8_t d[21]) {
    static const uint16_t bf[4] = {0x3f80, 0xc000, 0x4049, 0x0000}; /* 1, -2, 3.140625, 0 */
    static const float    f[3] = {0.5f, -1.25f, 1e30f};
    for (int i = 0; i < 4; i++) {
        d[2 * i] = (uint8_t)bf[i];
        d[2 * i + 1] = (uint8_t)(bf[i] >> 8);
    }
    memcpy(d + 8, f, sizeof f);
    d[20] = 0x7f;
}

static eng_st_t *st_open_ok(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    eng_st_t *st = NULL;
    svc_err_t err = eng_st_open(path, &st, errbuf, sizeof errbuf);
    cr_assert_eq(err, SVC_OK, "%s", errbuf);
    return st;
}

TestSuite(packages, .init = mk_tmpdir, .fini = rm_tmpdir);

Test(packages, st_valid_file) {
    uint8_t d[21];
    valid_data(d);
    put_st("ok.safetensors", valid_hdr, d, sizeof d);
    eng_st_t *st = st_open_ok("ok.safetensors");
    cr_assert_eq(eng_st_count(st), 3);
    cr_assert_str_eq(eng_st_at(st, 0)->name, "a.bf16"); /* name order */
    cr_assert_str_eq(eng_st_at(st, 1)->name, "b.f32");
    cr_assert_null(eng_st_at(st, 3));
    cr_assert_str_eq(eng_st_metadata(st, "format"), "pt");
    cr_assert_null(eng_st_metadata(st, "nope"));
    cr_assert_null(eng_st_find(st, "missing"));

    const eng_st_tensor_t *a = eng_st_find(st, "a.bf16");
    cr_assert_not_null(a);
    cr_assert_eq(a->dtype, ENG_DT_BF16);
    cr_assert_eq(a->rank, 2);
    cr_assert_eq(a->shape[0], 2);
    cr_assert_eq(eng_st_numel(a), 4);
    cr_assert_eq(a->nbytes, 8);
    float out[4];
    cr_assert_eq(eng_st_to_f32(a, out), SVC_OK);
    cr_assert_float_eq(out[0], 1.0f, 0);
    cr_assert_float_eq(out[1], -2.0f, 0);
    cr_assert_float_eq(out[2], 3.140625f, 0);
    cr_assert_float_eq(out[3], 0.0f, 0);

    const eng_st_tensor_t *b = eng_st_find(st, "b.f32");
    cr_assert_eq(eng_st_to_f32(b, out), SVC_OK);
    cr_assert_float_eq(out[0], 0.5f, 0);
    cr_assert_float_eq(out[2], 1e30f, 0);

    const eng_st_tensor_t *s = eng_st_find(st, "s");
    cr_assert_eq(s->rank, 0);
    cr_assert_eq(eng_st_numel(s), 1);
    cr_assert_eq(((const uint8_t *)s->data)[0], 0x7f);
    cr_assert_eq(eng_st_to_f32(s, out), SVC_ERR_UNSUPPORTED);
    eng_st_close(st);
    eng_st_close(NULL);
}

Test(packages, st_empty_header_and_empty_tensor) {
    put_st("e.safetensors", "{}", NULL, 0);
    eng_st_t *st = st_open_ok("e.safetensors");
    cr_assert_eq(eng_st_count(st), 0);
    eng_st_close(st);
    /* zero-element tensors may share an offset with anything */
    put_st("z.safetensors",
           "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
           "\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
           "\x01", 1);
    st = st_open_ok("z.safetensors");
    cr_assert_eq(eng_st_find(st, "z")->nbytes, 0);
    eng_st_close(st);
}

Test(packages, st_short_file_and_header_length) {
    put_file("short.safetensors", "\x02\x00\x00", 3);
    st_expect("short.safetensors", SVC_ERR_FORMAT, "file is 3 bytes");
    put_file("empty.safetensors", "", 0);
    st_expect("empty.safetensors", SVC_ERR_FORMAT, "8-byte header length");

    size_t   n;
    uint8_t *b = st_build("{}", NULL, 0, 3, &n); /* N = 3 but 2 bytes follow */
    put_file("past.safetensors", b, n);
    free(b);
    st_expect("past.safetensors", SVC_ERR_FORMAT, "header length 3 runs past the end");

    b = st_build("{}", NULL, 0, 100000000, &n);
    put_file("huge.safetensors", b, n);
    free(b);
    st_expect("huge.safetensors", SVC_ERR_TOO_LARGE, "expected less than 100000000");

    b = st_build("{}", NULL, 0, UINT64_MAX - 1, &n);
    put_file("max.safetensors", b, n);
    free(b);
    st_expect("max.safetensors", SVC_ERR_TOO_LARGE, "header length 18446744073709551614");

    b = st_build("{\"a\":", NULL, 0, UINT64_MAX, &n); /* truncated JSON */
    put_file("trunc.safetensors", b, n);
    free(b);
    st_expect("trunc.safetensors", SVC_ERR_FORMAT, "not valid JSON");
}

Test(packages, st_header_shape) {
    st_bad("[1,2]", 0, SVC_ERR_FORMAT, "header is not a JSON object");
    st_bad("\"x\"", 0, SVC_ERR_FORMAT, "header is not a JSON object");
    st_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           8, SVC_ERR_FORMAT, "duplicate object key");
    st_bad("{\"x\":[1]}", 0, SVC_ERR_FORMAT, "tensor \"x\": entry is not an object");
    st_bad("{\"__metadata__\":{\"k\":1}}", 0, SVC_ERR_FORMAT, "__metadata__ \"k\" is not a string");
    st_bad("{\"__metadata__\":[]}", 0, SVC_ERR_FORMAT, "__metadata__ is not an object");
}

Test(packages, st_dtype) {
    st_bad("{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
           SVC_ERR_UNSUPPORTED, "tensor \"x\": dtype \"F8_E4M3\" is not supported");
    st_bad("{\"x\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SVC_ERR_FORMAT,
           "tensor \"x\": dtype is missing");
    st_bad("{\"x\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SVC_ERR_FORMAT,
           "dtype is missing or not a string");
    cr_assert_str_eq(eng_dtype_name(ENG_DT_BF16), "BF16");
    cr_assert_eq(eng_dtype_size(ENG_DT_F64), 8);
    cr_assert_eq(eng_dtype_size(ENG_DT_COUNT), 0);
}

Test(packages, st_shape_rules) {
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
           SVC_ERR_FORMAT, "tensor \"x\": shape has rank 9, expected at most 8");
    put_st("r8.safetensors",
           "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}", "ab",
           2);
    eng_st_t *st = st_open_ok("r8.safetensors");
    cr_assert_eq(eng_st_find(st, "x")->rank, 8);
    eng_st_close(st);
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, SVC_ERR_FORMAT,
           "shape[0] is not a non-negative integer");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, SVC_ERR_FORMAT,
           "shape[0] is not a non-negative integer");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":7,\"data_offsets\":[0,1]}}", 1, SVC_ERR_FORMAT,
           "shape is missing or not an array");
    st_bad("{\"x\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
           8, SVC_ERR_FORMAT, "overflows");
}

Test(packages, st_offsets) {
    st_bad("{\"x.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 10,
           SVC_ERR_FORMAT,
           "tensor \"x.weight\": data_offsets [0, 10) hold 10 bytes, shape [2, 3] F32 needs 24");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9223372036854775807]}}", 1,
           SVC_ERR_FORMAT, "run past the data region (1 bytes)");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9223372036854775806,"
           "9223372036854775807]}}",
           1, SVC_ERR_FORMAT, "run past the data region");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551615]}}", 1,
           SVC_ERR_FORMAT, "not valid JSON"); /* beyond jansson's integers */
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,1]}}", 2, SVC_ERR_FORMAT,
           "end before they begin");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, SVC_ERR_FORMAT,
           "not a [begin, end] pair");
    st_bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, SVC_ERR_FORMAT,
           "data_offsets[0] is not a non-negative integer");
    st_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
           5, SVC_ERR_FORMAT, "overlap tensor");
    /* containment: b lies inside a, found although a later range starts after b */
    st_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
           "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}",
           9, SVC_ERR_FORMAT, "tensor \"b\": data_offsets [2, 4) overlap tensor \"a\" [0, 8)");
    st_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
           4, SVC_ERR_FORMAT, "overlap");
}

Test(packages, st_missing_file, .timeout = 30) {
    st_expect("nope.safetensors", SVC_ERR_IO, "open() failed");
    char path[128];
    snprintf(path, sizeof path, "%s/dir.safetensors", tmpdir);
    cr_assert_eq(mkdir(path, 0700), 0);
    st_expect("dir.safetensors", SVC_ERR_IO, "not a regular file");
    /* A FIFO (from an archive, say) must fail at once, not block open(). */
    snprintf(path, sizeof path, "%s/fifo.safetensors", tmpdir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    st_expect("fifo.safetensors", SVC_ERR_IO, "not a regular file");
    char hex[ENG_SHA256_HEX + 1];
    cr_assert_eq(eng_sha256_file(path, hex, NULL, errbuf, sizeof errbuf), SVC_ERR_IO);
    cr_assert(strstr(errbuf, "not a regular file"), "%s", errbuf);
}

static volatile unsigned sink;

/* Reads every byte a tensor claims, so ASan sees any out-of-range pointer. */
static unsigned touch_all(const eng_st_t *st) {
    unsigned sum = 0;
    for (size_t i = 0; i < eng_st_count(st); i++) {
        const eng_st_tensor_t *t = eng_st_at(st, i);
        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const uint8_t *)t->data)[k];
    }
    return sum;
}

Test(packages, st_truncate_every_length) {
    uint8_t d[21];
    valid_data(d);
    size_t   n;
    uint8_t *b = st_build(valid_hdr, d, sizeof d, UINT64_MAX, &n);
    char     path[256];
    snprintf(path, sizeof path, "%s/t.safetensors", tmpdir);
    for (size_t len = 0; len <= n; len++) {
        put_file("t.safetensors", b, len);
        eng_st_t *st = NULL;
        svc_err_t err = eng_st_open(path, &st, errbuf, sizeof errbuf);
        if (len < n)
            cr_assert_neq(err, SVC_OK, "truncated at %zu of %zu accepted", len, n);
        else
            cr_assert_eq(err, SVC_OK, "%s", errbuf);
        if (st)
            sink += touch_all(st);
        eng_st_close(st);
    }
    free(b);
}

Test(packages, st_random_corruption) {
    uint8_t d[21];
    valid_data(d);
    size_t   n;
    uint8_t *b = st_build(valid_hdr, d, sizeof d, UINT64_MAX, &n);
    uint8_t *c = malloc(n);
    char     path[256];
    snprintf(path, sizeof path, "%s/c.safetensors", tmpdir);
    uint32_t seed = 12345;
    size_t   accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(c, b, n);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t pos = (seed >> 8) % (8 + strlen(valid_hdr)); /* length field or header */
            seed = seed * 1103515245u + 12345u;
            c[pos] = (uint8_t)(seed >> 16);
        }
        put_file("c.safetensors", c, n);
        eng_st_t *st = NULL;
        errbuf[0] = '\0';
        svc_err_t err = eng_st_open(path, &st, errbuf, sizeof errbuf);
        if (err == SVC_OK) {
            accepted++;
            sink += touch_all(st);
            for (size_t i = 0; i < eng_st_count(st); i++)
                cr_assert_eq(eng_st_find(st, eng_st_at(st, i)->name), eng_st_at(st, i));
        } else {
            cr_assert_null(st);
            cr_assert(strstr(errbuf, path), "message \"%s\" does not name the file", errbuf);
        }
        eng_st_close(st);
    }
    cr_log_info("random corruption: %zu of 3000 still valid", accepted);
    free(c);
    free(b);
}

/* ---- conversions ---- */

Test(packages, bf16_to_f32) {
    cr_assert_float_eq(eng_bf16_to_f32(0x3f80), 1.0f, 0);
    cr_assert_float_eq(eng_bf16_to_f32(0xc000), -2.0f, 0);
    cr_assert_float_eq(eng_bf16_to_f32(0x4049), 3.140625f, 0);
    cr_assert_float_eq(eng_bf16_to_f32(0x3eab), 0.333984375f, 0);
    cr_assert_float_eq(eng_bf16_to_f32(0x0001), 0x1p-133f, 0); /* smallest subnormal */
    cr_assert(isinf(eng_bf16_to_f32(0xff80)) && eng_bf16_to_f32(0xff80) < 0);
    cr_assert(isnan(eng_bf16_to_f32(0x7fc0)));
    cr_assert(signbit(eng_bf16_to_f32(0x8000)));
    /* unaligned row */
    uint8_t raw[5] = {0xee, 0x80, 0x3f, 0x00, 0xc0};
    float   out[2];
    eng_bf16_row_to_f32(raw + 1, out, 2);
    cr_assert_float_eq(out[0], 1.0f, 0);
    cr_assert_float_eq(out[1], -2.0f, 0);
}

Test(packages, f16_to_f32) {
    static const struct {
        uint16_t h;
        float    f;
    } cases[] = {
        {0x3c00, 1.0f},     {0xc000, -2.0f},
        {0x7bff, 65504.0f}, {0x3555, 0.333251953125f},
        {0x0001, 0x1p-24f}, {0x03ff, 1023 * 0x1p-24f},
        {0x0400, 0x1p-14f}, {0x8001, -0x1p-24f},
        {0x0000, 0.0f},     {0x3800, 0.5f},
        {0x5640, 100.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_float_eq(eng_f16_to_f32(cases[i].h), cases[i].f, 0, "0x%04x", cases[i].h);
    cr_assert(signbit(eng_f16_to_f32(0x8000)));
    cr_assert(isinf(eng_f16_to_f32(0x7c00)) && eng_f16_to_f32(0x7c00) > 0);
    cr_assert(isinf(eng_f16_to_f32(0xfc00)) && eng_f16_to_f32(0xfc00) < 0);
    cr_assert(isnan(eng_f16_to_f32(0x7e00)));

    uint8_t d[6] = {0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b};
    put_st("h.safetensors", "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", d,
           6);
    eng_st_t *st = st_open_ok("h.safetensors");
    float     out[3];
    cr_assert_eq(eng_st_to_f32(eng_st_find(st, "h"), out), SVC_OK);
    cr_assert_float_eq(out[0], 1.0f, 0);
    cr_assert_float_eq(out[1], -2.0f, 0);
    cr_assert_float_eq(out[2], 65504.0f, 0);
    eng_st_close(st);
}

/* ---- SHA-256 and canonical JSON ---- */

Test(packages, sha256_known_answers) {
    char hex[ENG_SHA256_HEX + 1];
    cr_assert_eq(eng_sha256_buf("abc", 3, hex), SVC_OK);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    cr_assert_eq(eng_sha256_buf("", 0, hex), SVC_OK);
    cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");

    /* 2.5 MiB crosses chunk boundaries; must equal the one-shot hash */
    size_t   n = 5u << 19;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 31 + (i >> 11));
    put_file("big.bin", big, n);
    char want[ENG_SHA256_HEX + 1], path[256];
    cr_assert_eq(eng_sha256_buf(big, n, want), SVC_OK);
    snprintf(path, sizeof path, "%s/big.bin", tmpdir);
    uint64_t size = 0;
    cr_assert_eq(eng_sha256_file(path, hex, &size, errbuf, sizeof errbuf), SVC_OK, "%s", errbuf);
    cr_assert_str_eq(hex, want);
    cr_assert_eq(size, n);
    free(big);
    snprintf(path, sizeof path, "%s/none", tmpdir);
    cr_assert_eq(eng_sha256_file(path, hex, NULL, errbuf, sizeof errbuf), SVC_ERR_IO);
    cr_assert(strstr(errbuf, "none"));
}

static void canon_expect(const char *in, const char *want) {
    json_error_t jerr;
    json_t      *j = json_loads(in, JSON_DECODE_ANY, &jerr);
    cr_assert_not_null(j, "%s: %s", in, jerr.text);
    svc_buf_t b;
    svc_buf_init(&b, 1 << 20);
    cr_assert_eq(eng_json_canonical(j, &b), SVC_OK);
    cr_assert_str_eq(b.data, want, "input %s", in);
    svc_buf_fini(&b);
    json_decref(j);
}

Test(packages, canonical_json_matches_python) {
    /* want = json.dumps(json.loads(in), sort_keys=True, separators=(",", ":")) in python3 */
    canon_expect(
        "[1.0, 0.5, 1e16, 1e-5, 0.0001, 123456789.123, 1.5e300, -0.0, 100.0, 1e15]",
        "[1.0,0.5,1e+16,1e-05,0.0001,123456789.123,1.5e+300,-0.0,100.0,1000000000000000.0]");
    canon_expect("[0.30000000000000004, 2.5e-7, 1.7976931348623157e308, 5e-324, 0.1, 12345e-3]",
                 "[0.30000000000000004,2.5e-07,1.7976931348623157e+308,5e-324,0.1,12.345]");
    canon_expect("[1e22, 9007199254740993.0, 0.001, 3.14, -2.5e-5, 1E2]",
                 "[1e+22,9007199254740992.0,0.001,3.14,-2.5e-05,100.0]");
    canon_expect("{\"b\": 1, \"a\": [true, false, null], \"A\": -7, \"\\u00e9\": 0}",
                 "{\"A\":-7,\"a\":[true,false,null],\"b\":1,\"\\u00e9\":0}");
    canon_expect("\"q\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\u00e9\\u20ac\\ud83d\\ude00\"",
                 "\"q\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\u00e9\\u20ac\\ud83d\\ude00\"");
    canon_expect("{\"z\": {\"y\": 2, \"x\": 1}, \"\\ud83d\\ude00\": 1, \"\\uffff\": 2}",
                 "{\"z\":{\"x\":1,\"y\":2},\"\\uffff\":2,\"\\ud83d\\ude00\":1}");
}

/* ---- manifests ---- */

static void sha_of(const char *name, char hex[ENG_SHA256_HEX + 1]) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    cr_assert_eq(eng_sha256_file(path, hex, NULL, errbuf, sizeof errbuf), SVC_OK, "%s", errbuf);
}

/* A small package: every file that SPEC e.3/e.4 names, fixed bytes. */
static void put_package(void) {
    uint8_t d[21];
    valid_data(d);
    put_str("config.json", "{\"model_type\": \"qwen3_5\"}\n");
    put_str("decision_config.json",
            "{\"format_version\": 1, \"format_id\": \"d3-code-readout-v1\", \"prompt\": \"d3\", "
            "\"base_model\": \"Qwen/Qwen3.5-2B \\\"q\\\"\", \"revision\": \"main\", "
            "\"codes\": [\"A\", \"\\u00e9\", \"\\ud83d\\ude00\", \"tab\\there\"], "
            "\"token_ids\": [32, 233, 128512, 7], \"temperature\": 1.0, "
            "\"attention_mode\": \"causal\", \"pooling\": \"last\", \"max_length\": null, "
            "\"readout_dtype\": \"float32\", \"extra\": \"not in the identity\"}\n");
    put_str("tokenizer.json", "{\"model\": {}}\n");
    put_str("tokenizer_config.json", "{}\n");
    put_str("chat_template.jinja", "{{ messages }}\n");
    put_st("model.safetensors", valid_hdr, d, sizeof d);
    put_st("readout.safetensors", "{\"r\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
           "\x01\x02", 2);
    put_str("README.md", "not hashed\n");
}

/* model_sha256 of put_package(), from python3:
 *   F = {n: sha256(file) for n in model.safetensors, readout.safetensors,
 *        tokenizer.json, tokenizer_config.json, chat_template.jinja}
 *   D = decision_config.json minus "extra"
 *   sha256(json.dumps({"files": F, "decision": D}, sort_keys=True,
 *          separators=(",", ":")).encode()) */
#define PKG_MODEL_SHA256 "f167911db5ad693a81ef5e4d706bef31ee3a03c387a00c00ab180aa4939985db"

static const char *const pkg_listed[] = {
    "config.json",         "decision_config.json", "tokenizer.json",      "tokenizer_config.json",
    "chat_template.jinja", "model.safetensors",    "readout.safetensors",
};
#define N_LISTED (sizeof pkg_listed / sizeof pkg_listed[0])

/* MODEL_MANIFEST.json over pkg_listed minus skip; extra is spliced in raw. */
static void put_model_manifest(const char *skip, const char *extra, const char *model_sha) {
    svc_buf_t b;
    svc_buf_init(&b, 1 << 20);
    cr_assert_eq(svc_buf_adds(&b, "{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": {"),
                 SVC_OK);
    bool first = true;
    for (size_t i = 0; i < N_LISTED; i++) {
        if (skip && strcmp(skip, pkg_listed[i]) == 0)
            continue;
        char hex[ENG_SHA256_HEX + 1];
        sha_of(pkg_listed[i], hex);
        cr_assert_eq(svc_buf_addf(&b, "%s\"%s\": \"%s\"", first ? "" : ", ", pkg_listed[i], hex),
                     SVC_OK);
        first = false;
    }
    cr_assert_eq(svc_buf_addf(&b, "}, \"identity\": {\"model_sha256\": \"%s\"}%s}\n", model_sha,
                              extra ? extra : ""),
                 SVC_OK);
    put_file("MODEL_MANIFEST.json", b.data, b.len);
    svc_buf_fini(&b);
}

static svc_err_t verify_model(eng_mf_verdict_t *v) {
    eng_mf_verdict_init(v);
    errbuf[0] = '\0';
    return eng_manifest_verify_model(tmpdir, v, errbuf, sizeof errbuf);
}

static const eng_mf_file_t *verdict_file(const eng_mf_verdict_t *v, const char *name) {
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->files[i].name, name) == 0)
            return &v->files[i];
    cr_assert_fail("verdict has no %s", name);
    return NULL;
}

Test(packages, identity_known_answer) {
    put_package();
    char hex[ENG_SHA256_HEX + 1];
    cr_assert_eq(eng_manifest_identity(tmpdir, NULL, hex, errbuf, sizeof errbuf), SVC_OK, "%s",
                 errbuf);
    cr_assert_str_eq(hex, PKG_MODEL_SHA256);
}

Test(packages, model_manifest_good) {
    put_package();
    put_model_manifest(NULL, ", \"files_bytes\": {\"readout.safetensors\": 63}", PKG_MODEL_SHA256);
    eng_mf_verdict_t v;
    svc_err_t        err = verify_model(&v);
    cr_assert_eq(err, SVC_OK, "%s", errbuf);
    cr_assert_eq(v.n, N_LISTED);
    cr_assert_eq(v.n_bad, 0);
    cr_assert_str_eq(v.message, "");
    cr_assert_str_eq(v.model_sha256, PKG_MODEL_SHA256);
    for (size_t i = 0; i < v.n; i++)
        cr_assert_eq(v.files[i].status, ENG_MF_OK, "%s", v.files[i].name);
    cr_assert_eq(verdict_file(&v, "readout.safetensors")->bytes, 63);
    eng_mf_verdict_fini(&v);
}

Test(packages, model_manifest_altered_byte) {
    put_package();
    put_model_manifest(NULL, NULL, PKG_MODEL_SHA256);
    put_str("tokenizer_config.json", "{}\r"); /* one byte changed */
    eng_mf_verdict_t v;
    cr_assert_eq(verify_model(&v), SVC_ERR_INVALID);
    const eng_mf_file_t *f = verdict_file(&v, "tokenizer_config.json");
    cr_assert_eq(f->status, ENG_MF_MISMATCH);
    cr_assert_str_neq(f->expected, f->actual);
    cr_assert_eq(v.n_bad, 1);
    cr_assert(strstr(errbuf, "file \"tokenizer_config.json\" has sha256"), "%s", errbuf);
    cr_assert(strstr(errbuf, f->expected) && strstr(errbuf, f->actual));
    cr_assert_str_eq(errbuf, v.message);
    cr_assert_eq(verdict_file(&v, "tokenizer.json")->status, ENG_MF_OK);
    eng_mf_verdict_fini(&v);
}

Test(packages, model_manifest_missing_and_size) {
    put_package();
    put_model_manifest(NULL, ", \"files_bytes\": {\"readout.safetensors\": 62}", PKG_MODEL_SHA256);
    char path[256];
    snprintf(path, sizeof path, "%s/chat_template.jinja", tmpdir);
    cr_assert_eq(unlink(path), 0);
    eng_mf_verdict_t v;
    cr_assert_eq(verify_model(&v), SVC_ERR_INVALID);
    cr_assert_eq(verdict_file(&v, "chat_template.jinja")->status, ENG_MF_MISSING);
    cr_assert_eq(verdict_file(&v, "readout.safetensors")->status, ENG_MF_SIZE);
    cr_assert_eq(v.n_bad, 2);
    cr_assert(strstr(errbuf, "file \"chat_template.jinja\" is listed but missing (and 1 more"),
              "%s", errbuf);
    eng_mf_verdict_fini(&v);
}

Test(packages, model_manifest_unlisted_and_identity) {
    put_package();
    put_model_manifest("config.json", NULL, PKG_MODEL_SHA256);
    eng_mf_verdict_t v;
    cr_assert_eq(verify_model(&v), SVC_ERR_INVALID);
    cr_assert_eq(verdict_file(&v, "config.json")->status, ENG_MF_UNLISTED);
    cr_assert(strstr(errbuf, "\"config.json\" is loaded by the package but not listed"), "%s",
              errbuf);
    eng_mf_verdict_fini(&v);

    put_model_manifest(NULL, NULL,
                       "0000000000000000000000000000000000000000000000000000000000000000");
    cr_assert_eq(verify_model(&v), SVC_ERR_INVALID);
    cr_assert(strstr(errbuf, "model identity differs from the scored checkpoint in "
                             "MODEL_MANIFEST.json"),
              "%s", errbuf);
    cr_assert_str_eq(v.model_sha256, PKG_MODEL_SHA256);
    eng_mf_verdict_fini(&v);
}

static void model_manifest_bad(const char *text, const char *msg) {
    put_str("MODEL_MANIFEST.json", text);
    eng_mf_verdict_t v;
    svc_err_t        err = verify_model(&v);
    cr_assert_eq(err, SVC_ERR_FORMAT, "%s: %s", text, errbuf);
    cr_assert(strstr(errbuf, msg), "\"%s\" lacks \"%s\"", errbuf, msg);
    cr_assert(strstr(errbuf, "MODEL_MANIFEST.json"));
    eng_mf_verdict_fini(&v);
}

#define HEX_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

Test(packages, model_manifest_format_errors) {
    put_package();
    model_manifest_bad("{\"schema\": \"d3-package-manifest/2\", \"files_sha256\": {}}",
                       "schema must be");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": {}}",
                       "files_sha256 must be a non-empty object");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
                       "{\"MODEL_MANIFEST.json\": \"" HEX_A "\"}}",
                       "must not list MODEL_MANIFEST.json itself");
    model_manifest_bad(
        "{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
        "{\"config.json\": \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
        "AAAAAAA\"}}",
        "files_sha256 \"config.json\": expected 64 lowercase hex digits");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
                       "{\"config.json\": \"abc\"}}",
                       "expected 64 lowercase hex digits");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
                       "{\"../etc/passwd\": \"" HEX_A "\"}}",
                       "must be relative to the package");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
                       "{\"/etc/passwd\": \"" HEX_A "\"}}",
                       "must be relative to the package");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
                       "{\"a\": \"" HEX_A "\", \"a\": \"" HEX_A "\"}}",
                       "duplicate object key");
    model_manifest_bad("{\"schema\": \"d3-package-manifest/1\", \"files_sha256\": "
                       "{\"a\": \"" HEX_A "\"}, \"files_bytes\": {\"a\": -1}}",
                       "files_bytes \"a\": expected a non-negative integer");
    model_manifest_bad("[]", "the top level is not a JSON object");
}

Test(packages, model_manifest_needs_identity) {
    put_package();
    put_model_manifest(NULL, NULL, "not-a-hash");
    eng_mf_verdict_t v;
    cr_assert_eq(verify_model(&v), SVC_ERR_FORMAT);
    cr_assert(strstr(errbuf, "identity.model_sha256"), "%s", errbuf);
    eng_mf_verdict_fini(&v);
}

/* ---- MANIFEST.sha256 ---- */

static svc_err_t verify_sum(eng_mf_verdict_t *v, const char *text) {
    put_str("MANIFEST.sha256", text);
    eng_mf_verdict_init(v);
    errbuf[0] = '\0';
    return eng_manifest_verify_sha256sum(tmpdir, v, errbuf, sizeof errbuf);
}

static void sum_line_for(svc_buf_t *b, const char *name, const char *sep, bool upper) {
    char hex[ENG_SHA256_HEX + 1];
    sha_of(name, hex);
    for (int i = 0; upper && i < ENG_SHA256_HEX; i++)
        hex[i] = (char)(hex[i] >= 'a' ? hex[i] - 32 : hex[i]);
    cr_assert_eq(svc_buf_addf(b, "%s%s%s\n", hex, sep, name), SVC_OK);
}

Test(packages, sha256sum_variants) {
    put_package();
    char sub[128];
    snprintf(sub, sizeof sub, "%s/sub", tmpdir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    put_str("sub/notes.txt", "x\n");
    svc_buf_t b;
    svc_buf_init(&b, 1 << 16);
    sum_line_for(&b, "config.json", "  ", false);       /* text mode */
    sum_line_for(&b, "model.safetensors", " *", false); /* binary mode */
    sum_line_for(&b, "tokenizer.json", "  ", true);     /* upper-case hex */
    sum_line_for(&b, "sub/notes.txt", "  ", false);
    cr_assert_eq(svc_buf_adds(&b, "\n"), SVC_OK); /* blank line */
    sum_line_for(&b, "./readout.safetensors", " *", false);
    b.data[b.len - 1] = '\r'; /* CRLF ending, no final newline */
    cr_assert_eq(svc_buf_adds(&b, "\n"), SVC_OK);
    eng_mf_verdict_t v;
    cr_assert_eq(verify_sum(&v, b.data), SVC_OK, "%s", errbuf);
    cr_assert_eq(v.n, 5);
    cr_assert_eq(v.n_bad, 0);
    char hex[ENG_SHA256_HEX + 1];
    sha_of("tokenizer.json", hex);
    cr_assert_str_eq(verdict_file(&v, "tokenizer.json")->expected, hex);
    eng_mf_verdict_fini(&v);
    svc_buf_fini(&b);
}

Test(packages, sha256sum_mismatch_and_missing) {
    put_package();
    svc_buf_t b;
    svc_buf_init(&b, 1 << 16);
    sum_line_for(&b, "config.json", "  ", false);
    sum_line_for(&b, "model.safetensors", " *", false);
    sum_line_for(&b, "tokenizer.json", "  ", false);
    put_str("model.safetensors", "altered"); /* after hashing */
    eng_mf_verdict_t v;
    cr_assert_eq(verify_sum(&v, b.data), SVC_ERR_INVALID);
    cr_assert_eq(verdict_file(&v, "model.safetensors")->status, ENG_MF_MISMATCH);
    cr_assert_eq(verdict_file(&v, "config.json")->status, ENG_MF_OK);
    cr_assert(strstr(errbuf, "MANIFEST.sha256"), "%s", errbuf);
    cr_assert(strstr(errbuf, "file \"model.safetensors\" has sha256"), "%s", errbuf);
    eng_mf_verdict_fini(&v);

    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(verify_sum(&v, b.data), SVC_ERR_INVALID);
    cr_assert_eq(verdict_file(&v, "tokenizer.json")->status, ENG_MF_MISSING);
    cr_assert_str_eq(verdict_file(&v, "tokenizer.json")->actual, "");
    cr_assert_eq(v.n_bad, 2);
    eng_mf_verdict_fini(&v);
    svc_buf_fini(&b);
}

static void sum_bad(const char *text, const char *msg) {
    eng_mf_verdict_t v;
    svc_err_t        err = verify_sum(&v, text);
    cr_assert_eq(err, SVC_ERR_FORMAT, "%s: %s", text, errbuf);
    cr_assert(strstr(errbuf, msg), "\"%s\" lacks \"%s\"", errbuf, msg);
    eng_mf_verdict_fini(&v);
}

Test(packages, sha256sum_format_errors) {
    put_package();
    sum_bad("", "lists no files");
    sum_bad("\n\n", "lists no files");
    sum_bad("zz" HEX_A "  config.json\n", "line 1: expected");
    sum_bad("aaaa  config.json\n", "line 1: expected");
    sum_bad(HEX_A "  config.json\n" HEX_A "config.json\n", "line 2: expected");
    sum_bad(HEX_A " config.json\n", "line 1: expected");
    sum_bad(HEX_A "  \n", "line 1: expected");
    sum_bad(HEX_A "  ../x\n", "must be relative");
    sum_bad(HEX_A "  a/../../x\n", "must be relative");
    sum_bad(HEX_A " */etc/passwd\n", "must be relative");
    sum_bad(HEX_A "  a\n" HEX_A " *a\n", "line 2: \"a\" is listed twice");
    put_file("MANIFEST.sha256", HEX_A "  a\0b\n", 69);
    eng_mf_verdict_t v;
    eng_mf_verdict_init(&v);
    cr_assert_eq(eng_manifest_verify_sha256sum(tmpdir, &v, errbuf, sizeof errbuf), SVC_ERR_FORMAT);
    cr_assert(strstr(errbuf, "NUL"), "%s", errbuf);
    eng_mf_verdict_fini(&v);
    char path[256];
    snprintf(path, sizeof path, "%s/MANIFEST.sha256", tmpdir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(eng_manifest_verify_sha256sum(tmpdir, &v, errbuf, sizeof errbuf), SVC_ERR_IO);
    eng_mf_verdict_fini(&v);
}
