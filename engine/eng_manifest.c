/*
 * eng_manifest.c -- verifies package manifests against the package files
 * (eng_manifest_int.h; SPEC e.3, e.4).
 *
 * A manifest is untrusted input like any package file: names are checked
 * before they are joined to the directory, hex digests before they are
 * compared, and the first bad file is named in a one-line message.
 */
#include "eng_manifest_int.h"
#include "eng_util_int.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#define MF_JSON   "MODEL_MANIFEST.json"
#define MF_SUM    "MANIFEST.sha256"
#define MF_SCHEMA "d3-package-manifest/1"
/* A sha256sum manifest lists a few dozen files; this is far above that. */
#define MF_SUM_MAX (4u << 20)

/* ======================================================================
 * SHA-256
 * ====================================================================== */

static void hex_encode(const unsigned char *d, size_t n, char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[2 * n] = '\0';
}

/* Streams fd through ctx; a short read is not an error, only read() < 0 is. */
static svc_err_t sha_stream(int fd, EVP_MD_CTX *ctx, unsigned char *chunk, uint64_t *total) {
    for (;;) {
        ssize_t r = read(fd, chunk, ENG_MF_HASH_CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return SVC_ERR_IO;
        if (r == 0)
            return SVC_OK;
        if (EVP_DigestUpdate(ctx, chunk, (size_t)r) != 1)
            return SVC_ERR_INTERNAL;
        *total += (uint64_t)r;
    }
}

svc_err_t eng_sha256_file(const char *path, char hex[ENG_SHA256_HEX + 1], uint64_t *nbytes,
                          char *errstr, size_t errstr_size) {
    int fd = eng_open_regular(path, NULL);
    if (fd < 0) {
        int e = errno;
        if (e == EINVAL)
            svc_errf(errstr, errstr_size, "\"%s\" is not a regular file", path);
        else
            svc_errf(errstr, errstr_size, "open() \"%s\" failed: %s", path, strerror(e));
        errno = e;
        return SVC_ERR_IO;
    }
    unsigned char *chunk = malloc(ENG_MF_HASH_CHUNK);
    EVP_MD_CTX    *ctx = EVP_MD_CTX_new();
    uint64_t       total = 0;
    svc_err_t      err = SVC_ERR_NOMEM;
    if (chunk && ctx) {
        err = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 ? SVC_OK : SVC_ERR_INTERNAL;
        if (!err)
            err = sha_stream(fd, ctx, chunk, &total);
        if (err == SVC_ERR_IO)
            svc_errf(errstr, errstr_size, "read() \"%s\" failed: %s", path, strerror(errno));
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int  md_len = 0;
    if (!err && EVP_DigestFinal_ex(ctx, md, &md_len) != 1)
        err = SVC_ERR_INTERNAL;
    if (!err) {
        hex_encode(md, md_len, hex);
        if (nbytes)
            *nbytes = total;
    } else if (err != SVC_ERR_IO) {
        svc_errf(errstr, errstr_size, "sha256 \"%s\": %s", path, svc_err_name(err));
    }
    EVP_MD_CTX_free(ctx);
    free(chunk);
    close(fd);
    return err;
}

svc_err_t eng_sha256_buf(const void *p, size_t n, char hex[ENG_SHA256_HEX + 1]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int  md_len = 0;
    if (EVP_Digest(p, n, md, &md_len, EVP_sha256(), NULL) != 1)
        return SVC_ERR_INTERNAL;
    hex_encode(md, md_len, hex);
    return SVC_OK;
}

/* ======================================================================
 * Canonical JSON (Python json.dumps, sort_keys, compact, ensure_ascii)
 * ====================================================================== */

/* Decodes one UTF-8 sequence; jansson only holds valid UTF-8. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *i) {
    unsigned char c = s[*i];
    int           len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    uint32_t      cp = len == 1 ? c : c & (0x3fu >> (len - 1));
    for (int k = 1; k < len && *i + (size_t)k < n; k++)
        cp = (cp << 6) | (s[*i + (size_t)k] & 0x3fu);
    *i += (size_t)len;
    return cp;
}

static svc_err_t dump_string(svc_buf_t *b, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    svc_err_t            err = svc_buf_addc(b, '"');
    for (size_t i = 0; i < n && !err;) {
        uint32_t cp = utf8_next(s, n, &i);
        switch (cp) {
        case '"':
            err = svc_buf_adds(b, "\\\"");
            break;
        case '\\':
            err = svc_buf_adds(b, "\\\\");
            break;
        case '\n':
            err = svc_buf_adds(b, "\\n");
            break;
        case '\r':
            err = svc_buf_adds(b, "\\r");
            break;
        case '\t':
            err = svc_buf_adds(b, "\\t");
            break;
        case '\b':
            err = svc_buf_adds(b, "\\b");
            break;
        case '\f':
            err = svc_buf_adds(b, "\\f");
            break;
        default:
            if (cp >= 0x20 && cp < 0x7f) /* Python escapes all but ' '..'~', DEL too */
                err = svc_buf_addc(b, (char)cp);
            else if (cp < 0x10000)
                err = svc_buf_addf(b, "\\u%04x", (unsigned)cp);
            else /* Python writes astral characters as a surrogate pair */
                err = svc_buf_addf(b, "\\u%04x\\u%04x", 0xd800u + ((cp - 0x10000u) >> 10),
                                   0xdc00u + ((cp - 0x10000u) & 0x3ffu));
        }
    }
    return err ? err : svc_buf_addc(b, '"');
}

/* Python float repr: the shortest digits that round-trip, fixed notation
 * for decimal exponents -4..15 (always with a fraction, "1.0"), else
 * "d[.ddd]e+XX" with at least two exponent digits. */
static svc_err_t dump_real(svc_buf_t *b, double d) {
    if (!isfinite(d))
        return SVC_ERR_INVALID;
    char s[40];
    for (int prec = 0; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*e", prec, d);
        if (strtod(s, NULL) == d)
            break;
    }
    bool        neg = s[0] == '-';
    const char *p = s + neg;
    char        dig[24];
    size_t      nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.' && nd < sizeof dig - 1)
            dig[nd++] = *p;
    dig[nd] = '\0';
    long exp = strtol(p + 1, NULL, 10);
    if (exp < -4 || exp >= 16)
        return svc_buf_addf(b, "%s%c%s%se%c%02ld", neg ? "-" : "", dig[0], nd > 1 ? "." : "",
                            dig + 1, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    svc_err_t err = neg ? svc_buf_addc(b, '-') : SVC_OK;
    if (!err && exp < 0)
        err = svc_buf_addf(b, "0.%.*s%s", (int)(-exp - 1), "0000", dig);
    else if (!err) {
        size_t ipart = (size_t)exp + 1;
        for (size_t i = 0; i < ipart && !err; i++)
            err = svc_buf_addc(b, i < nd ? dig[i] : '0');
        if (!err)
            err = svc_buf_addf(b, ".%s", nd > ipart ? dig + ipart : "0");
    }
    return err;
}

static int key_cmp(const void *a, const void *b) {
    /* UTF-8 byte order is code point order, which is Python's str order */
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static svc_err_t dump_value(const json_t *j, svc_buf_t *b);

static svc_err_t dump_object(const json_t *j, svc_buf_t *b) {
    size_t       n = json_object_size(j), k = 0;
    const char **keys = calloc(n ? n : 1, sizeof *keys);
    if (!keys)
        return SVC_ERR_NOMEM;
    const char *key;
    json_t     *v;
    json_object_foreach((json_t *)j, key, v) keys[k++] = key;
    qsort(keys, n, sizeof *keys, key_cmp);
    svc_err_t err = svc_buf_addc(b, '{');
    for (size_t i = 0; i < n && !err; i++) {
        if (i)
            err = svc_buf_addc(b, ',');
        if (!err)
            err = dump_string(b, keys[i], strlen(keys[i]));
        if (!err)
            err = svc_buf_addc(b, ':');
        if (!err)
            err = dump_value(json_object_get(j, keys[i]), b);
    }
    free(keys);
    return err ? err : svc_buf_addc(b, '}');
}

static svc_err_t dump_value(const json_t *j, svc_buf_t *b) {
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        return dump_object(j, b);
    case JSON_ARRAY: {
        svc_err_t err = svc_buf_addc(b, '[');
        for (size_t i = 0; i < json_array_size(j) && !err; i++) {
            if (i)
                err = svc_buf_addc(b, ',');
            if (!err)
                err = dump_value(json_array_get(j, i), b);
        }
        return err ? err : svc_buf_addc(b, ']');
    }
    case JSON_STRING:
        return dump_string(b, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return svc_buf_addf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
    case JSON_REAL:
        return dump_real(b, json_real_value(j));
    case JSON_TRUE:
        return svc_buf_adds(b, "true");
    case JSON_FALSE:
        return svc_buf_adds(b, "false");
    case JSON_NULL:
        return svc_buf_adds(b, "null");
    }
    return SVC_ERR_INTERNAL;
}

svc_err_t eng_json_canonical(const json_t *j, svc_buf_t *out) {
    return dump_value(j, out);
}

/* ======================================================================
 * Verdicts
 * ====================================================================== */

const char *eng_mf_status_name(eng_mf_status_t s) {
    switch (s) {
    case ENG_MF_OK:
        return "ok";
    case ENG_MF_MISMATCH:
        return "mismatch";
    case ENG_MF_MISSING:
        return "missing";
    case ENG_MF_SIZE:
        return "size";
    case ENG_MF_UNLISTED:
        return "unlisted";
    }
    return "?";
}

void eng_mf_verdict_init(eng_mf_verdict_t *v) {
    memset(v, 0, sizeof *v);
}

void eng_mf_verdict_fini(eng_mf_verdict_t *v) {
    for (size_t i = 0; i < v->n; i++)
        free(v->files[i].name);
    free(v->files);
    eng_mf_verdict_init(v);
}

static eng_mf_file_t *verdict_find(const eng_mf_verdict_t *v, const char *name) {
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->files[i].name, name) == 0)
            return &v->files[i];
    return NULL;
}

static eng_mf_file_t *verdict_add(eng_mf_verdict_t *v, const char *name) {
    if (v->n == v->cap) {
        size_t         cap = v->cap ? v->cap * 2 : 16;
        eng_mf_file_t *f = realloc(v->files, cap * sizeof *f);
        if (!f)
            return NULL;
        v->files = f;
        v->cap = cap;
    }
    eng_mf_file_t *f = &v->files[v->n];
    memset(f, 0, sizeof *f);
    f->bytes_expected = -1;
    if (!(f->name = strdup(name)))
        return NULL;
    v->n++;
    return f;
}

/* ======================================================================
 * Shared checks
 * ====================================================================== */

typedef struct mf_ctx {
    const char *dir;
    const char *what; /* manifest file name, for messages */
    char       *errstr;
    size_t      errstr_size;
} mf_ctx_t;

SVC_FMT(3, 4) static svc_err_t mf_fail(const mf_ctx_t *c, svc_err_t err, const char *fmt, ...) {
    char    msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(c->errstr, c->errstr_size, "%s \"%s/%s\": %s", c->what, c->dir, c->what, msg);
    return err;
}

/* Relative, no ".." component, no empty name: cannot escape the package. */
static bool name_is_safe(const char *name) {
    if (!name[0] || name[0] == '/')
        return false;
    for (const char *p = name; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return false;
        p += len;
        if (*p == '/')
            p++;
    }
    return true;
}

static bool is_hex64(const char *s, bool lower_only) {
    for (int i = 0; i < ENG_SHA256_HEX; i++) {
        char ch = s[i];
        bool ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') ||
                  (!lower_only && ch >= 'A' && ch <= 'F');
        if (!ok)
            return false;
    }
    return s[ENG_SHA256_HEX] == '\0' || !lower_only;
}

/* Hashes one listed file into f: OK, MISMATCH or MISSING. Other I/O errors
 * stop the whole verification (a permission problem is not a verdict). */
static svc_err_t check_file(const mf_ctx_t *c, eng_mf_file_t *f) {
    char *path = eng_path_join(c->dir, f->name);
    if (!path)
        return mf_fail(c, SVC_ERR_NOMEM, "out of memory");
    struct stat sb;
    svc_err_t   err = SVC_OK;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        f->status = ENG_MF_MISSING;
    else
        err = eng_sha256_file(path, f->actual, &f->bytes, c->errstr, c->errstr_size);
    free(path);
    if (err || f->status == ENG_MF_MISSING)
        return err;
    if (f->expected[0] && strcmp(f->expected, f->actual) != 0)
        f->status = ENG_MF_MISMATCH;
    else if (f->bytes_expected >= 0 && (uint64_t)f->bytes_expected != f->bytes)
        f->status = ENG_MF_SIZE;
    return SVC_OK;
}

static void describe_bad(const eng_mf_file_t *f, char *buf, size_t size) {
    switch (f->status) {
    case ENG_MF_MISMATCH:
        snprintf(buf, size, "file \"%s\" has sha256 %s, the manifest lists %s", f->name, f->actual,
                 f->expected);
        break;
    case ENG_MF_MISSING:
        snprintf(buf, size, "file \"%s\" is listed but missing", f->name);
        break;
    case ENG_MF_SIZE:
        snprintf(buf, size, "file \"%s\" is %llu bytes, the manifest lists %lld", f->name,
                 (unsigned long long)f->bytes, (long long)f->bytes_expected);
        break;
    case ENG_MF_UNLISTED:
        snprintf(buf, size, "file \"%s\" is loaded by the package but not listed in files_sha256",
                 f->name);
        break;
    case ENG_MF_OK:
        buf[0] = '\0';
        break;
    }
}

/* Counts bad files; the message names the first one. */
static svc_err_t finish_verdict(const mf_ctx_t *c, eng_mf_verdict_t *v) {
    const eng_mf_file_t *first = NULL;
    v->n_bad = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (v->files[i].status != ENG_MF_OK) {
            v->n_bad++;
            if (!first)
                first = &v->files[i];
        }
    }
    if (!first)
        return SVC_OK;
    char what[300];
    describe_bad(first, what, sizeof what);
    if (v->n_bad > 1)
        snprintf(v->message, sizeof v->message, "%s \"%s/%s\": %s (and %zu more bad files)",
                 c->what, c->dir, c->what, what, v->n_bad - 1);
    else
        snprintf(v->message, sizeof v->message, "%s \"%s/%s\": %s", c->what, c->dir, c->what, what);
    svc_errf(c->errstr, c->errstr_size, "%s", v->message);
    return SVC_ERR_INVALID;
}

static svc_err_t check_all(const mf_ctx_t *c, eng_mf_verdict_t *v) {
    for (size_t i = 0; i < v->n; i++) {
        svc_err_t err = check_file(c, &v->files[i]);
        if (err)
            return err;
    }
    return SVC_OK;
}

/* ======================================================================
 * MANIFEST.sha256
 * ====================================================================== */

/* One "<hex>  <name>" / "<hex> *<name>" line (text or binary mode). */
static svc_err_t sum_line(const mf_ctx_t *c, eng_mf_verdict_t *v, char *line, size_t lineno) {
    size_t len = strlen(line);
    if (len && line[len - 1] == '\r')
        line[--len] = '\0';
    if (len == 0)
        return SVC_OK;
    if (len < ENG_SHA256_HEX + 3 || !is_hex64(line, false) || line[ENG_SHA256_HEX] != ' ' ||
        (line[ENG_SHA256_HEX + 1] != ' ' && line[ENG_SHA256_HEX + 1] != '*'))
        return mf_fail(c, SVC_ERR_FORMAT,
                       "line %zu: expected \"<64 hex digits>  <name>\" or \"<64 hex> *<name>\"",
                       lineno);
    const char *name = line + ENG_SHA256_HEX + 2;
    if (!name_is_safe(name))
        return mf_fail(c, SVC_ERR_FORMAT,
                       "line %zu: name \"%s\" must be relative to the package without \"..\"",
                       lineno, name);
    if (verdict_find(v, name))
        return mf_fail(c, SVC_ERR_FORMAT, "line %zu: \"%s\" is listed twice", lineno, name);
    eng_mf_file_t *f = verdict_add(v, name);
    if (!f)
        return mf_fail(c, SVC_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ENG_SHA256_HEX; i++) /* sha256sum accepts either case */
        f->expected[i] = (char)(line[i] >= 'A' && line[i] <= 'F' ? line[i] + 32 : line[i]);
    f->expected[ENG_SHA256_HEX] = '\0';
    return SVC_OK;
}

static svc_err_t sum_parse(const mf_ctx_t *c, eng_mf_verdict_t *v, char *text, size_t len) {
    if (len == 0) /* an empty svc_buf's data is not NUL-terminated */
        return mf_fail(c, SVC_ERR_FORMAT, "lists no files");
    if (memchr(text, '\0', len))
        return mf_fail(c, SVC_ERR_FORMAT, "contains a NUL byte");
    size_t lineno = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        svc_err_t err = sum_line(c, v, p, ++lineno);
        if (err)
            return err;
        p = nl ? nl + 1 : p + strlen(p);
    }
    if (v->n == 0)
        return mf_fail(c, SVC_ERR_FORMAT, "lists no files");
    return SVC_OK;
}

svc_err_t eng_manifest_verify_sha256sum(const char *dir, eng_mf_verdict_t *v, char *errstr,
                                        size_t errstr_size) {
    mf_ctx_t  c = {dir, MF_SUM, errstr, errstr_size};
    char     *path = eng_path_join(dir, MF_SUM);
    svc_buf_t text;
    svc_buf_init(&text, MF_SUM_MAX);
    if (!path)
        return mf_fail(&c, SVC_ERR_NOMEM, "out of memory");
    svc_err_t err = svc_buf_read_file(&text, path, errstr, errstr_size);
    free(path);
    if (!err)
        err = sum_parse(&c, v, text.data, text.len);
    svc_buf_fini(&text);
    if (!err)
        err = check_all(&c, v);
    return err ? err : finish_verdict(&c, v);
}

/* ======================================================================
 * MODEL_MANIFEST.json
 * ====================================================================== */

static json_t *load_json(const mf_ctx_t *c, const char *name, bool must_exist, svc_err_t *err) {
    char *path = eng_path_join(c->dir, name);
    *err = SVC_OK;
    if (!path) {
        *err = mf_fail(c, SVC_ERR_NOMEM, "out of memory");
        return NULL;
    }
    struct stat sb;
    json_t     *j = NULL;
    if (must_exist || stat(path, &sb) == 0) {
        json_error_t jerr;
        j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        if (!j)
            *err = mf_fail(c, SVC_ERR_FORMAT, "%s: %s (line %d, column %d)", name, jerr.text,
                           jerr.line, jerr.column);
        else if (!json_is_object(j)) {
            json_decref(j);
            j = NULL;
            *err = mf_fail(c, SVC_ERR_FORMAT, "%s: the top level is not a JSON object", name);
        }
    }
    free(path);
    return j;
}

static svc_err_t mf_files_sha256(const mf_ctx_t *c, const json_t *fs, eng_mf_verdict_t *v) {
    if (!json_is_object(fs) || json_object_size(fs) == 0)
        return mf_fail(c, SVC_ERR_FORMAT, "files_sha256 must be a non-empty object");
    const char *name;
    json_t     *h;
    json_object_foreach((json_t *)fs, name, h) {
        if (strcmp(name, MF_JSON) == 0)
            return mf_fail(c, SVC_ERR_FORMAT, "files_sha256 must not list " MF_JSON " itself");
        if (!name_is_safe(name))
            return mf_fail(c, SVC_ERR_FORMAT,
                           "files_sha256 name \"%s\" must be relative to the package without "
                           "\"..\"",
                           name);
        if (!json_is_string(h) || json_string_length(h) != ENG_SHA256_HEX ||
            !is_hex64(json_string_value(h), true))
            return mf_fail(c, SVC_ERR_FORMAT,
                           "files_sha256 \"%s\": expected 64 lowercase hex digits", name);
        eng_mf_file_t *f = verdict_add(v, name);
        if (!f)
            return mf_fail(c, SVC_ERR_NOMEM, "out of memory");
        memcpy(f->expected, json_string_value(h), ENG_SHA256_HEX + 1);
    }
    return SVC_OK;
}

/* Sizes attach to the listed file; a size for an unlisted file is still checked. */
static svc_err_t mf_files_bytes(const mf_ctx_t *c, const json_t *fb, eng_mf_verdict_t *v) {
    if (!fb)
        return SVC_OK;
    if (!json_is_object(fb))
        return mf_fail(c, SVC_ERR_FORMAT, "files_bytes must be an object");
    const char *name;
    json_t     *n;
    json_object_foreach((json_t *)fb, name, n) {
        if (!json_is_integer(n) || json_integer_value(n) < 0)
            return mf_fail(c, SVC_ERR_FORMAT, "files_bytes \"%s\": expected a non-negative integer",
                           name);
        if (!name_is_safe(name) || strcmp(name, MF_JSON) == 0)
            return mf_fail(c, SVC_ERR_FORMAT, "files_bytes name \"%s\" is not a package file",
                           name);
        eng_mf_file_t *f = verdict_find(v, name);
        if (!f && !(f = verdict_add(v, name)))
            return mf_fail(c, SVC_ERR_NOMEM, "out of memory");
        f->bytes_expected = (int64_t)json_integer_value(n);
    }
    return SVC_OK;
}

/* A file the family loads that exists but is not listed becomes UNLISTED. */
static svc_err_t require_listed(const mf_ctx_t *c, eng_mf_verdict_t *v, const char *name) {
    if (!name_is_safe(name) || !eng_dir_has_file(c->dir, name))
        return SVC_OK;
    eng_mf_file_t *f = verdict_find(v, name);
    if (f && f->expected[0])
        return SVC_OK;
    if (!f && !(f = verdict_add(v, name)))
        return mf_fail(c, SVC_ERR_NOMEM, "out of memory");
    f->status = ENG_MF_UNLISTED;
    return SVC_OK;
}

/* SPEC e.3: config, decision config, readout, tokenizer files, chat
 * template, weights incl. the index and its shards, and the processor
 * configs when config.json has a vision_config. */
static svc_err_t mf_required(const mf_ctx_t *c, eng_mf_verdict_t *v) {
    static const char *const always[] = {
        "config.json",       "decision_config.json",         "readout.safetensors",
        "tokenizer.json",    "tokenizer_config.json",        "chat_template.jinja",
        "model.safetensors", "model.safetensors.index.json",
    };
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < sizeof always / sizeof always[0] && !err; i++)
        err = require_listed(c, v, always[i]);
    json_t     *index = err ? NULL : load_json(c, "model.safetensors.index.json", false, &err);
    const char *key;
    json_t     *shard;
    json_object_foreach(json_object_get(index, "weight_map"), key, shard) {
        if (!err && json_is_string(shard))
            err = require_listed(c, v, json_string_value(shard));
    }
    json_decref(index);
    json_t *cfg = err ? NULL : load_json(c, "config.json", false, &err);
    if (!err && json_is_object(json_object_get(cfg, "vision_config"))) {
        err = require_listed(c, v, "preprocessor_config.json");
        if (!err)
            err = require_listed(c, v, "video_preprocessor_config.json");
    }
    json_decref(cfg);
    return err;
}

static svc_err_t mf_identity(const mf_ctx_t *c, const json_t *mf, eng_mf_verdict_t *v) {
    const json_t *id = json_object_get(json_object_get(mf, "identity"), "model_sha256");
    if (!json_is_string(id) || json_string_length(id) != ENG_SHA256_HEX ||
        !is_hex64(json_string_value(id), true))
        return mf_fail(c, SVC_ERR_FORMAT,
                       "identity.model_sha256: expected 64 lowercase hex digits");
    svc_err_t err = eng_manifest_identity(c->dir, v, v->model_sha256, c->errstr, c->errstr_size);
    if (err)
        return err;
    if (strcmp(v->model_sha256, json_string_value(id)) != 0) {
        snprintf(v->message, sizeof v->message,
                 "model identity differs from the scored checkpoint in " MF_JSON
                 " (\"%s\": computed %s, listed %s)",
                 c->dir, v->model_sha256, json_string_value(id));
        svc_errf(c->errstr, c->errstr_size, "%s", v->message);
        return SVC_ERR_INVALID;
    }
    return SVC_OK;
}

static svc_err_t mf_verify(const mf_ctx_t *c, const json_t *mf, eng_mf_verdict_t *v) {
    const json_t *schema = json_object_get(mf, "schema");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), MF_SCHEMA) != 0)
        return mf_fail(c, SVC_ERR_FORMAT, "schema must be \"" MF_SCHEMA "\"");
    svc_err_t err = mf_files_sha256(c, json_object_get(mf, "files_sha256"), v);
    if (!err)
        err = mf_files_bytes(c, json_object_get(mf, "files_bytes"), v);
    if (!err)
        err = mf_required(c, v);
    if (!err)
        err = check_all(c, v);
    if (!err)
        err = finish_verdict(c, v);
    if (!err)
        err = mf_identity(c, mf, v);
    return err;
}

svc_err_t eng_manifest_verify_model(const char *dir, eng_mf_verdict_t *v, char *errstr,
                                    size_t errstr_size) {
    mf_ctx_t  c = {dir, MF_JSON, errstr, errstr_size};
    svc_err_t err;
    json_t   *mf = load_json(&c, MF_JSON, true, &err);
    if (err)
        return err;
    err = mf_verify(&c, mf, v);
    json_decref(mf);
    return err;
}

/* ======================================================================
 * Identity hash (SPEC e.4)
 * ====================================================================== */

static const char *const id_files[] = {"tokenizer.json", "tokenizer_config.json",
                                       "chat_template.jinja"};
static const char *const id_decision[] = {
    "format_version", "format_id",   "prompt",         "base_model", "revision",   "codes",
    "token_ids",      "temperature", "attention_mode", "pooling",    "max_length", "readout_dtype",
};

/* F[name] = sha256, reusing a hash already computed in v. */
static svc_err_t id_add_file(const mf_ctx_t *c, const eng_mf_verdict_t *v, json_t *files,
                             const char *name) {
    const eng_mf_file_t *f = v ? verdict_find(v, name) : NULL;
    char                 hex[ENG_SHA256_HEX + 1];
    if (f && f->actual[0])
        memcpy(hex, f->actual, sizeof hex);
    else {
        char     *path = eng_path_join(c->dir, name);
        svc_err_t err = path ? eng_sha256_file(path, hex, NULL, c->errstr, c->errstr_size)
                             : mf_fail(c, SVC_ERR_NOMEM, "out of memory");
        free(path);
        if (err)
            return err;
    }
    return json_object_set_new(files, name, json_string(hex)) ? SVC_ERR_NOMEM : SVC_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Every *.safetensors in the directory (weights, shards and readout). */
static svc_err_t id_files_json(const mf_ctx_t *c, const eng_mf_verdict_t *v, json_t *files) {
    DIR *d = opendir(c->dir);
    if (!d)
        return mf_fail(c, SVC_ERR_IO, "opendir() failed: %s", strerror(errno));
    svc_err_t      err = SVC_OK;
    struct dirent *de;
    while (!err && (de = readdir(d)) != NULL)
        if (ends_with(de->d_name, ".safetensors") && eng_dir_has_file(c->dir, de->d_name))
            err = id_add_file(c, v, files, de->d_name);
    closedir(d);
    for (size_t i = 0; i < sizeof id_files / sizeof id_files[0] && !err; i++)
        if (eng_dir_has_file(c->dir, id_files[i]))
            err = id_add_file(c, v, files, id_files[i]);
    return err;
}

static svc_err_t id_decision_json(const mf_ctx_t *c, json_t *decision) {
    mf_ctx_t  dc = *c;
    svc_err_t err;
    dc.what = "decision_config.json";
    json_t *cfg = load_json(&dc, "decision_config.json", true, &err);
    for (size_t i = 0; i < sizeof id_decision / sizeof id_decision[0] && !err; i++) {
        json_t *val = json_object_get(cfg, id_decision[i]);
        if (val && json_object_set(decision, id_decision[i], val))
            err = SVC_ERR_NOMEM;
    }
    json_decref(cfg);
    return err;
}

svc_err_t eng_manifest_identity(const char *dir, const eng_mf_verdict_t *v,
                                char hex[ENG_SHA256_HEX + 1], char *errstr, size_t errstr_size) {
    mf_ctx_t  c = {dir, MF_JSON, errstr, errstr_size};
    json_t   *files = json_object(), *decision = json_object();
    json_t   *top = json_object();
    svc_err_t err = files && decision && top ? SVC_OK : SVC_ERR_NOMEM;
    if (!err)
        err = id_files_json(&c, v, files);
    if (!err)
        err = id_decision_json(&c, decision);
    if (!err &&
        (json_object_set(top, "files", files) || json_object_set(top, "decision", decision)))
        err = SVC_ERR_NOMEM;
    svc_buf_t text;
    svc_buf_init(&text, SIZE_MAX / 2);
    if (!err) {
        /* only failures without a message of their own reach here */
        err = eng_json_canonical(top, &text);
        if (!err)
            err = eng_sha256_buf(text.data, text.len, hex);
        if (err)
            mf_fail(&c, err, "identity hash: %s", svc_err_name(err));
    }
    svc_buf_fini(&text);
    json_decref(files);
    json_decref(decision);
    json_decref(top);
    return err;
}
