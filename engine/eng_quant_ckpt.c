/*
 * eng_quant_ckpt.c -- `quantize`'s per-layer checkpoints (eng_quant_int.h,
 * docs/quantize.md "Restarting"): a GPTQ run killed after layer i goes on
 * with --resume from layer i + 1 and writes the files an uninterrupted
 * run would, byte for byte.
 *
 * The work directory OUT/quantize.partial holds
 *     state.json        what the run is (its options, the source's files,
 *                       the calibration prompts' digest) and how far it got:
 *                       per finished layer its tiles file's size and
 *                       sha256, and the stream file's
 *     layer-NNN.tiles   layer NNN's tensors as the q4nx writer holds them
 *                       (eng_q4nx_writer_tensor): "D3QZTIL1", a u64 LE
 *                       header length, a JSON array of {name, dtype,
 *                       shape, bytes}, the bytes back to back
 *     stream-NNN.f32    the calibration tokens' residual stream after layer
 *                       NNN (rows x hidden fp32, this machine's byte order):
 *                       what the reference pass needs to start at NNN + 1
 * Each file is written to a ".tmp" name, fsync'd, renamed into place and
 * the directory fsync'd; state.json last, so that whatever it names is
 * complete. Only the newest stream is kept (the one before it is removed
 * once state.json names the new one). A resume compares every option
 * field, then the calibration's, and refuses naming the first that
 * differs; every file it reads must have state.json's size and sha256.
 * The directory is removed when the whole package has been written.
 */
#include "eng_manifest_int.h"
#include "eng_q4nx_int.h"
#include "eng_quant_int.h"
#include "eng_st_int.h"
#include "eng_util_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_FORMAT       "d3stream quantize checkpoint/1"
#define CK_STATE        "state.json"
#define CK_TILES_MAGIC  "D3QZTIL1"
#define CK_HEADER_LIMIT ((uint64_t)1 << 26)

struct qz_ckpt {
    char   *dir;      /* out_dir/ENG_QUANT_PARTIAL */
    bool    on;       /* GPTQ: checkpoints are written */
    json_t *state;    /* state.json's object, as read or as it will be written */
    size_t  done;     /* layers finished in state */
    size_t  stop;     /* test hook: stop after this many layers (0: never) */
    bool    resumed;  /* state was read and its options match */
    char    prev[64]; /* the stream file state named before the newest */
};

/* ---------------------------------------------------------------------
 * Files
 * --------------------------------------------------------------------- */

/* One checkpoint file being written: its ".tmp", hashed as it goes. */
typedef struct ck_out {
    int         fd;
    EVP_MD_CTX *md;
    uint64_t    bytes;
    char       *path, *tmp;
} ck_out_t;

static void ck_out_drop(ck_out_t *o) {
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp)
        unlink(o->tmp);
    EVP_MD_CTX_free(o->md);
    free(o->path);
    free(o->tmp);
    *o = (ck_out_t){.fd = -1};
}

static svc_err_t ck_out_begin(const qz_ckpt_t *ck, const char *name, ck_out_t *o, char *errstr,
                              size_t n) {
    *o = (ck_out_t){.fd = -1};
    o->path = eng_path_join(ck->dir, name);
    size_t len = o->path ? strlen(o->path) + 5 : 0;
    o->tmp = len ? malloc(len) : NULL;
    o->md = EVP_MD_CTX_new();
    if (!o->tmp || !o->md) {
        ck_out_drop(o);
        return SVC_ERR_NOMEM;
    }
    snprintf(o->tmp, len, "%s.tmp", o->path);
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (o->fd < 0 || EVP_DigestInit_ex(o->md, EVP_sha256(), NULL) != 1) {
        svc_errf(errstr, n, "checkpoint: open() \"%s\" failed: %s", o->tmp, strerror(errno));
        ck_out_drop(o);
        return SVC_ERR_IO;
    }
    return SVC_OK;
}

static svc_err_t ck_out_put(ck_out_t *o, const void *p, size_t len, char *errstr, size_t n) {
    const uint8_t *b = p;
    if (len && EVP_DigestUpdate(o->md, p, len) != 1)
        return SVC_ERR_INTERNAL;
    o->bytes += len;
    while (len) {
        ssize_t w = write(o->fd, b, len < ((size_t)1 << 30) ? len : ((size_t)1 << 30));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            svc_errf(errstr, n, "checkpoint: write() \"%s\" failed: %s", o->tmp,
                     w < 0 ? strerror(errno) : "nothing written");
            return SVC_ERR_IO;
        }
        b += w;
        len -= (size_t)w;
    }
    return SVC_OK;
}

/* fsync, close, rename into place; hex and bytes describe the file. The
 * directory is fsync'd by the caller (once for several files). */
static svc_err_t ck_out_commit(ck_out_t *o, char hex[ENG_SHA256_HEX + 1], uint64_t *bytes,
                               char *errstr, size_t n) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int  md_len = 0;
    svc_err_t     err = EVP_DigestFinal_ex(o->md, md, &md_len) == 1 ? SVC_OK : SVC_ERR_INTERNAL;
    if (!err && (fsync(o->fd) != 0 || close(o->fd) != 0)) {
        svc_errf(errstr, n, "checkpoint: fsync()/close() \"%s\" failed: %s", o->tmp,
                 strerror(errno));
        err = SVC_ERR_IO;
    }
    o->fd = -1;
    if (!err && rename(o->tmp, o->path) != 0) {
        svc_errf(errstr, n, "checkpoint: rename() \"%s\" failed: %s", o->tmp, strerror(errno));
        err = SVC_ERR_IO;
    }
    if (!err) {
        static const char digits[] = "0123456789abcdef";
        for (unsigned i = 0; i < md_len && 2 * i < ENG_SHA256_HEX; i++) {
            hex[2 * i] = digits[md[i] >> 4];
            hex[2 * i + 1] = digits[md[i] & 15];
        }
        hex[ENG_SHA256_HEX] = '\0';
        *bytes = o->bytes;
        free(o->tmp); /* renamed: nothing to unlink */
        o->tmp = NULL;
    }
    ck_out_drop(o);
    return err;
}

static svc_err_t ck_sync_dir(const qz_ckpt_t *ck, char *errstr, size_t n) {
    int fd = open(ck->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        svc_errf(errstr, n, "checkpoint: fsync() of the directory \"%s\" failed: %s", ck->dir,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return SVC_ERR_IO;
    }
    close(fd);
    return SVC_OK;
}

/* {file, bytes, sha256} of a file just committed. */
static json_t *ck_entry(const char *name, uint64_t bytes, const char *hex) {
    return json_pack("{s:s, s:I, s:s}", "file", name, "bytes", (json_int_t)bytes, "sha256", hex);
}

/* The file an entry names, read whole into a malloc'd buffer, refused
 * unless its size and sha256 are the entry's. */
static svc_err_t ck_read(const qz_ckpt_t *ck, const json_t *e, uint8_t **out, size_t *len,
                         char *errstr, size_t n) {
    const char *name = json_string_value(json_object_get(e, "file"));
    const char *want = json_string_value(json_object_get(e, "sha256"));
    json_int_t  bytes = json_integer_value(json_object_get(e, "bytes"));
    *out = NULL;
    if (!name || !want || bytes < 0 || strchr(name, '/') || (uint64_t)bytes > SIZE_MAX) {
        svc_errf(errstr, n, "checkpoint \"%s\": " CK_STATE " names a file without its size or hash",
                 ck->dir);
        return SVC_ERR_FORMAT;
    }
    char     *path = eng_path_join(ck->dir, name);
    uint64_t  size = 0;
    int       fd = path ? eng_open_regular(path, &size) : -1;
    svc_err_t err = path ? SVC_OK : SVC_ERR_NOMEM;
    if (!err && fd < 0) {
        svc_errf(errstr, n, "checkpoint file \"%s\" cannot be read: %s", path, strerror(errno));
        err = SVC_ERR_IO;
    }
    if (!err && size != (uint64_t)bytes) {
        svc_errf(errstr, n, "checkpoint file \"%s\" is damaged: %llu bytes, " CK_STATE " says %lld",
                 path, (unsigned long long)size, (long long)bytes);
        err = SVC_ERR_FORMAT;
    }
    uint8_t *b = err ? NULL : malloc(size ? (size_t)size : 1);
    if (!err && !b)
        err = SVC_ERR_NOMEM;
    for (size_t got = 0; !err && got < size;) {
        ssize_t r = read(fd, b + got, (size_t)size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            svc_errf(errstr, n, "checkpoint file \"%s\": read() failed: %s", path,
                     r < 0 ? strerror(errno) : "short");
            err = SVC_ERR_IO;
        }
        got += r > 0 ? (size_t)r : 0;
    }
    char hex[ENG_SHA256_HEX + 1];
    if (!err && (err = eng_sha256_buf(b, (size_t)size, hex)) == SVC_OK && strcmp(hex, want) != 0) {
        svc_errf(errstr, n,
                 "checkpoint file \"%s\" is damaged: its sha256 is not the one " CK_STATE
                 " recorded; it is not used (run without --resume, with --force, to start over)",
                 path);
        err = SVC_ERR_FORMAT;
    }
    if (fd >= 0)
        close(fd);
    free(path);
    if (err)
        free(b);
    else {
        *out = b;
        *len = (size_t)size;
    }
    return err;
}

/* ---------------------------------------------------------------------
 * The directory
 * --------------------------------------------------------------------- */

/* Removes the regular files of ck->dir that keep(name) does not keep, and
 * the directory itself when keep is NULL. */
static svc_err_t ck_sweep(const qz_ckpt_t *ck, bool (*keep)(const qz_ckpt_t *, const char *),
                          char *errstr, size_t n) {
    DIR *d = opendir(ck->dir);
    if (!d)
        return errno == ENOENT ? SVC_OK : SVC_ERR_IO;
    svc_err_t      err = SVC_OK;
    struct dirent *de;
    while (!err && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            (keep && keep(ck, de->d_name)))
            continue;
        char *p = eng_path_join(ck->dir, de->d_name);
        if (!p)
            err = SVC_ERR_NOMEM;
        else if (unlink(p) != 0) {
            svc_errf(errstr, n, "checkpoint: unlink() \"%s\" failed: %s", p, strerror(errno));
            err = SVC_ERR_IO;
        }
        free(p);
    }
    closedir(d);
    if (!err && !keep && rmdir(ck->dir) != 0) {
        svc_errf(errstr, n, "checkpoint: rmdir() \"%s\" failed: %s", ck->dir, strerror(errno));
        err = SVC_ERR_IO;
    }
    return err;
}

/* What state.json names: itself, the finished layers' tiles, the stream. */
static bool ck_named(const qz_ckpt_t *ck, const char *name) {
    if (strcmp(name, CK_STATE) == 0)
        return true;
    const json_t *tiles = json_object_get(ck->state, "tiles"), *e;
    size_t        i;
    json_array_foreach(tiles, i, e) {
        const char *f = json_string_value(json_object_get(e, "file"));
        if (f && strcmp(f, name) == 0)
            return true;
    }
    const char *s =
        json_string_value(json_object_get(json_object_get(ck->state, "stream"), "file"));
    return s && strcmp(s, name) == 0;
}

static svc_err_t ck_write_state(qz_ckpt_t *ck, char *errstr, size_t n) {
    char    *text = json_dumps(ck->state, JSON_INDENT(1) | JSON_SORT_KEYS);
    ck_out_t o;
    char     hex[ENG_SHA256_HEX + 1];
    uint64_t bytes;
    if (!text)
        return SVC_ERR_NOMEM;
    svc_err_t err = ck_out_begin(ck, CK_STATE, &o, errstr, n);
    if (!err && (err = ck_out_put(&o, text, strlen(text), errstr, n)) != SVC_OK)
        ck_out_drop(&o);
    else if (!err)
        err = ck_out_commit(&o, hex, &bytes, errstr, n);
    free(text);
    return err ? err : ck_sync_dir(ck, errstr, n);
}

/* ---------------------------------------------------------------------
 * Identity
 * --------------------------------------------------------------------- */

static int cstr_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* sha256 over the source directory's regular files, sorted by name: each
 * name, size and modification time. Hashing the weights themselves would
 * cost a read of gigabytes on every start; a copy or an edit of the
 * package changes these. */
static svc_err_t ck_source(const qz_t *q, char hex[ENG_SHA256_HEX + 1]) {
    DIR *d = opendir(q->o->model_dir);
    if (!d) {
        svc_errf(q->errstr, q->errstr_size, "opendir() \"%s\" failed: %s", q->o->model_dir,
                 strerror(errno));
        return SVC_ERR_IO;
    }
    char         **names = NULL;
    size_t         nn = 0, cap = 0;
    svc_err_t      err = SVC_OK;
    struct dirent *de;
    while (!err && (de = readdir(d)) != NULL) {
        if (!eng_dir_has_file(q->o->model_dir, de->d_name))
            continue;
        if (nn == cap) {
            char **v = realloc(names, (cap = cap ? 2 * cap : 32) * sizeof *v);
            if (!v) {
                err = SVC_ERR_NOMEM;
                break;
            }
            names = v;
        }
        if (!(names[nn] = strdup(de->d_name)))
            err = SVC_ERR_NOMEM;
        else
            nn++;
    }
    closedir(d);
    if (nn)
        qsort(names, nn, sizeof *names, cstr_cmp);
    svc_buf_t b;
    svc_buf_init(&b, (size_t)1 << 24);
    for (size_t i = 0; !err && i < nn; i++) {
        struct stat st;
        char       *p = eng_path_join(q->o->model_dir, names[i]);
        if (!p || stat(p, &st) != 0)
            err = p ? SVC_ERR_IO : SVC_ERR_NOMEM;
        else
            err = svc_buf_addf(&b, "%s\t%lld\t%lld.%09ld\n", names[i], (long long)st.st_size,
                               (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
        free(p);
    }
    if (!err)
        err = eng_sha256_buf(b.data ? b.data : "", b.len, hex);
    if (err == SVC_ERR_IO)
        svc_errf(q->errstr, q->errstr_size, "stat() of a file of \"%s\" failed: %s",
                 q->o->model_dir, strerror(errno));
    svc_buf_fini(&b);
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    return err;
}

/* The encoding's version: what GPTQ and the encoders choose for the same
 * inputs and options. Bump it with any change to those choices (the
 * codes, the grids, the tiles), so that a checkpoint of an older build is
 * refused instead of mixed into a newer one's package. */
#define CK_ENCODING "gptq-ldlq+fitted-grids 2026-12-06"

/* Every option that changes model.q4nx, as the run resolves it (defaults
 * filled in), and the source; keys are what a refusal names. */
static svc_err_t ck_options(const qz_t *q, json_t **out) {
    const eng_quant_opts_t *o = q->o;
    char                    src[ENG_SHA256_HEX + 1], cal[ENG_SHA256_HEX + 1] = "";
    svc_err_t               err = ck_source(q, src);
    if (!err && o->calib_file)
        err = eng_sha256_file(o->calib_file, cal, NULL, q->errstr, q->errstr_size);
    if (err)
        return err;
    bool    gptq = o->method == ENG_QUANT_GPTQ;
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I}", "encoding", CK_ENCODING, "source", src,
                          "method", gptq ? "gptq" : "rtn", "generation", o->gen_a ? "a" : "b",
                          "layers", (json_int_t)q->shell->cfg.n_layers);
    if (j && gptq) {
        bool ok =
            !json_object_set_new(j, "damp", json_real(o->damp > 0 ? o->damp : ENG_QUANT_DAMP));
        ok = ok && !json_object_set_new(j, "act_order", json_boolean(!o->no_act_order));
        ok = ok && !json_object_set_new(j, "static_groups",
                                        json_boolean(!o->no_act_order || o->static_groups));
        ok = ok &&
             !json_object_set_new(j, "grids", json_string(o->plain_grids ? "plain" : "fitted"));
        ok = ok &&
             !json_object_set_new(
                 j, "calibration_tokens",
                 json_integer((json_int_t)(o->calib_tokens ? o->calib_tokens : ENG_QUANT_TOKENS)));
        if (o->calib_file)
            ok = ok && !json_object_set_new(j, "calibration_file_sha256", json_string(cal));
        else {
            ok = ok && !json_object_set_new(j, "calibration_seed",
                                            json_integer((json_int_t)o->calib_seed));
            ok = ok && !json_object_set_new(
                           j, "calibration_prompts",
                           json_integer((json_int_t)(o->calib_prompts ? o->calib_prompts
                                                                      : ENG_QUANT_PROMPTS)));
        }
        if (!ok) {
            json_decref(j);
            j = NULL;
        }
    }
    *out = j;
    return j ? SVC_OK : SVC_ERR_NOMEM;
}

/* The fields a refusal names, in the order they are compared (the most
 * telling first), with the option that sets each. */
static const struct {
    const char *key, *what;
} FIELDS[] = {
    {"encoding", "the d3stream build (its GPTQ and encoders changed since)"},
    {"source", "--model (the package's files: names, sizes, modification times)"},
    {"layers", "--model (its number of layers)"},
    {"method", "--method"},
    {"generation", "--generation"},
    {"damp", "--damp"},
    {"act_order", "--no-act-order"},
    {"static_groups", "--static-groups"},
    {"grids", "--plain-grids"},
    {"calibration_file_sha256", "--calibration (the file's contents)"},
    {"calibration_seed", "--calibration-seed"},
    {"calibration_prompts", "--calibration-prompts"},
    {"calibration_tokens", "--calibration-tokens"},
    {"ids_sha256", "calibration (the prompts' token ids)"},
    {"prompts", "calibration (the number of prompts)"},
    {"tokens", "calibration (the number of tokens)"},
};

static bool same(const json_t *a, const json_t *b) {
    return (!a && !b) || json_equal(a, b);
}

/* The first field (FIELDS' order, then any other) where had and now
 * differ, or NULL. */
static const char *ck_differs(const json_t *had, const json_t *now) {
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++)
        if (!same(json_object_get(had, FIELDS[i].key), json_object_get(now, FIELDS[i].key)))
            return FIELDS[i].key;
    const char *k;
    json_t     *v;
    json_object_foreach((json_t *)had, k, v) if (!same(v, json_object_get(now, k))) return k;
    json_object_foreach((json_t *)now, k, v) if (!same(v, json_object_get(had, k))) return k;
    return NULL;
}

/* Refuses, naming the first field where had and now differ. */
static svc_err_t ck_compare(const qz_t *q, const json_t *had, const json_t *now) {
    const char *bad = ck_differs(had, now);
    if (!bad)
        return SVC_OK;
    const char *what = bad;
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++)
        if (strcmp(FIELDS[i].key, bad) == 0)
            what = FIELDS[i].what;
    size_t fl =
        JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(12); /* damp 0.1, not 0.1000...01 */
    char *a = json_dumps(json_object_get(had, bad), fl);
    char *b = json_dumps(json_object_get(now, bad), fl);
    svc_errf(q->errstr, q->errstr_size,
             "--resume: the checkpoint in \"%s\" was made with another %s (field \"%s\": %s "
             "there, %s now); refusing to mix two runs (run without --resume, with --force, to "
             "start over)",
             q->ck->dir, what, bad, a ? a : "none", b ? b : "none");
    free(a);
    free(b);
    return SVC_ERR_INVALID;
}

/* ---------------------------------------------------------------------
 * The run's side (eng_quant_int.h)
 * --------------------------------------------------------------------- */

void qz_ckpt_free(qz_ckpt_t *ck) {
    if (!ck)
        return;
    free(ck->dir);
    json_decref(ck->state);
    free(ck);
}

size_t qz_ckpt_done(const qz_ckpt_t *ck) {
    return ck->resumed ? ck->done : 0;
}

/* The test hook's layer count (tests/test_quantize.c): 0 unless set. */
static size_t ck_stop_hook(void) {
    const char        *s = getenv("D3_TEST_QUANT_STOP_AFTER_LAYER");
    char              *end = NULL;
    unsigned long long v = s && *s ? strtoull(s, &end, 10) : 0;
    return end && !*end ? (size_t)v : 0;
}

/* state.json read into ck->state when the directory has one; refused when
 * it is not a checkpoint of this format. */
static svc_err_t ck_load_state(qz_t *q, qz_ckpt_t *ck, bool *found) {
    char *path = eng_path_join(ck->dir, CK_STATE);
    *found = path && eng_is_file(path);
    json_error_t jerr;
    svc_err_t    err = path ? SVC_OK : SVC_ERR_NOMEM;
    if (!err && *found && !(ck->state = json_load_file(path, 0, &jerr))) {
        svc_errf(q->errstr, q->errstr_size, "checkpoint \"%s\" is damaged: %s", path, jerr.text);
        err = SVC_ERR_FORMAT;
    }
    const char *fmt = json_string_value(json_object_get(ck->state, "format"));
    json_int_t  done = json_integer_value(json_object_get(ck->state, "done"));
    if (!err && *found &&
        (!fmt || strcmp(fmt, CK_FORMAT) != 0 || done < 0 ||
         (size_t)json_array_size(json_object_get(ck->state, "tiles")) != (size_t)done ||
         !json_is_object(json_object_get(ck->state, "options")))) {
        svc_errf(q->errstr, q->errstr_size,
                 "checkpoint \"%s\" is not one this d3stream writes (\"%s\")", path,
                 fmt ? fmt : "no format");
        err = SVC_ERR_FORMAT;
    }
    if (!err && *found)
        ck->done = (size_t)done;
    free(path);
    return err;
}

svc_err_t qz_ckpt_open(qz_t *q) {
    qz_ckpt_t *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = eng_path_join(q->o->out_dir, ENG_QUANT_PARTIAL))) {
        qz_ckpt_free(ck);
        return SVC_ERR_NOMEM;
    }
    q->ck = ck;
    ck->on = q->o->method == ENG_QUANT_GPTQ;
    ck->stop = ck_stop_hook();
    json_t   *opts = NULL;
    bool      found = false;
    svc_err_t err = ck_options(q, &opts);
    if (!err && q->o->resume)
        err = ck_load_state(q, ck, &found);
    if (!err && found)
        err = ck_compare(q, json_object_get(ck->state, "options"), opts);
    if (!err && found) {
        ck->resumed = true;
        json_decref(opts);
        return ck_sweep(ck, ck_named, q->errstr, q->errstr_size); /* a stream not yet removed */
    }
    json_decref(ck->state);
    ck->state = NULL;
    ck->done = 0;
    if (!err && q->o->resume)
        qz_log(q, "--resume: no checkpoint in \"%s\": starting at layer 1", ck->dir);
    if (!err) /* a run not resumed starts clean (ops refuses one without --force) */
        err = ck_sweep(ck, NULL, q->errstr, q->errstr_size);
    if (!err && ck->on) { /* the directory is made with the first layer's files */
        ck->state = json_pack("{s:s, s:O, s:I, s:[]}", "format", CK_FORMAT, "options", opts, "done",
                              (json_int_t)0, "tiles");
        err = ck->state ? SVC_OK : SVC_ERR_NOMEM;
    }
    json_decref(opts);
    return err;
}

/* sha256 of the prompts' ids: a generator or tokenizer that changed
 * gives other prompts under the same options. */
static svc_err_t ck_calib_json(const eng_calib_t *c, json_t **out) {
    EVP_MD_CTX   *md = EVP_MD_CTX_new();
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int  dl = 0;
    bool          ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
    for (size_t i = 0; ok && i < c->n; i++) {
        uint64_t len = c->seqs[i].n;
        ok = EVP_DigestUpdate(md, &len, sizeof len) == 1 &&
             EVP_DigestUpdate(md, c->seqs[i].v, c->seqs[i].n * sizeof *c->seqs[i].v) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(md, d, &dl) == 1;
    EVP_MD_CTX_free(md);
    char              hex[ENG_SHA256_HEX + 1];
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; ok && i < dl && 2 * i < ENG_SHA256_HEX; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[ENG_SHA256_HEX] = '\0';
    *out = ok ? json_pack("{s:I, s:I, s:s}", "prompts", (json_int_t)c->n, "tokens",
                          (json_int_t)c->tokens, "ids_sha256", hex)
              : NULL;
    return *out ? SVC_OK : SVC_ERR_NOMEM;
}

svc_err_t qz_ckpt_calib(qz_t *q, const eng_calib_t *c) {
    qz_ckpt_t *ck = q->ck;
    json_t    *now = NULL;
    svc_err_t  err = ck->on ? ck_calib_json(c, &now) : SVC_OK;
    if (!err && ck->resumed) {
        const json_t *had = json_object_get(ck->state, "calibration");
        err = had ? ck_compare(q, had, now) : SVC_OK; /* none: stopped before layer 1 */
    }
    if (!err && ck->on && json_object_set(ck->state, "calibration", now))
        err = SVC_ERR_NOMEM;
    json_decref(now);
    return err;
}

/* The tensors of a tiles file into w. */
static svc_err_t ck_tiles_in(qz_t *q, const uint8_t *b, size_t len, const char *name,
                             eng_q4nx_writer_t *w) {
    uint64_t hl = 0;
    for (int i = 0; len >= 16 && i < 8; i++)
        hl |= (uint64_t)b[8 + i] << (8 * i);
    json_error_t jerr;
    json_t      *h =
        len >= 16 && memcmp(b, CK_TILES_MAGIC, 8) == 0 && hl <= len - 16 && hl < CK_HEADER_LIMIT
                 ? json_loadb((const char *)b + 16, (size_t)hl, 0, &jerr)
                 : NULL;
    size_t    off = 16 + (size_t)hl, i;
    json_t   *e;
    svc_err_t err = json_is_array(h) ? SVC_OK : SVC_ERR_FORMAT;
    json_array_foreach(h, i, e) {
        const char        *dt = json_string_value(json_object_get(e, "dtype"));
        json_t            *shape = json_object_get(e, "shape");
        json_int_t         nb = json_integer_value(json_object_get(e, "bytes"));
        uint64_t           dims[ENG_ST_MAX_RANK] = {0};
        eng_q4nx_wtensor_t t = {json_string_value(json_object_get(e, "name")),
                                ENG_DT_COUNT,
                                (uint32_t)json_array_size(shape),
                                dims,
                                b + off,
                                (size_t)nb};
        for (int d = 0; dt && d < ENG_DT_COUNT; d++)
            if (strcmp(eng_dtype_name((eng_dtype_t)d), dt) == 0)
                t.dtype = (eng_dtype_t)d;
        for (size_t k = 0; k < t.rank && k < ENG_ST_MAX_RANK; k++)
            dims[k] = (uint64_t)json_integer_value(json_array_get(shape, k));
        if (err || !t.name || nb < 0 || (uint64_t)nb > len - off) {
            err = SVC_ERR_FORMAT;
            break;
        }
        if ((err = eng_q4nx_writer_add_encoded(w, &t, q->errstr, q->errstr_size)) != SVC_OK)
            break;
        off += (size_t)nb;
    }
    if (err == SVC_ERR_FORMAT || (!err && off != len)) {
        svc_errf(q->errstr, q->errstr_size, "checkpoint file \"%s/%s\" is not a tiles file",
                 q->ck->dir, name);
        err = SVC_ERR_FORMAT;
    }
    json_decref(h);
    return err;
}

svc_err_t qz_ckpt_restore(qz_t *q, eng_q4nx_writer_t *w, size_t rows, float **x0) {
    qz_ckpt_t *ck = q->ck;
    size_t     H = q->shell->cfg.hidden, L = q->shell->cfg.n_layers;
    *x0 = NULL;
    if (!ck->resumed || !ck->done)
        return SVC_OK;
    if (ck->done > L) {
        svc_errf(q->errstr, q->errstr_size, "checkpoint \"%s\": %zu layers done of %zu", ck->dir,
                 ck->done, L);
        return SVC_ERR_FORMAT;
    }
    const json_t *tiles = json_object_get(ck->state, "tiles");
    svc_err_t     err = SVC_OK;
    for (size_t i = 0; !err && i < ck->done; i++) {
        uint8_t *b = NULL;
        size_t   len = 0;
        err = ck_read(ck, json_array_get(tiles, i), &b, &len, q->errstr, q->errstr_size);
        if (!err)
            err = ck_tiles_in(
                q, b, len, json_string_value(json_object_get(json_array_get(tiles, i), "file")), w);
        free(b);
    }
    uint8_t *s = NULL;
    size_t   len = 0;
    if (!err)
        err =
            ck_read(ck, json_object_get(ck->state, "stream"), &s, &len, q->errstr, q->errstr_size);
    if (!err && len != rows * H * sizeof(float)) {
        svc_errf(q->errstr, q->errstr_size,
                 "checkpoint \"%s\": the stream holds %zu bytes, not %zu tokens x %zu", ck->dir,
                 len, rows, H);
        err = SVC_ERR_FORMAT;
    }
    if (err) {
        free(s);
        return err;
    }
    *x0 = (float *)(void *)s; /* malloc'd: aligned for floats */
    const char *f =
        json_string_value(json_object_get(json_object_get(ck->state, "stream"), "file"));
    snprintf(ck->prev, sizeof ck->prev, "%s", f ? f : "");
    if (ck->done < L)
        qz_log(q, "resuming at layer %zu of %zu (layer%s %s%zu from \"%s\")", ck->done + 1, L,
               ck->done > 1 ? "s" : "", ck->done > 1 ? "1-" : "", ck->done, ck->dir);
    else
        qz_log(q, "resuming: all %zu layers were checkpointed in \"%s\"", L, ck->dir);
    return SVC_OK;
}

/* Layer li's tensors (w's from mark on) as a tiles file. */
static svc_err_t ck_tiles_out(const qz_ckpt_t *ck, size_t li, const eng_q4nx_writer_t *w,
                              size_t mark, json_t **entry, char *errstr, size_t n) {
    char    name[64];
    json_t *h = json_array();
    snprintf(name, sizeof name, "layer-%03zu.tiles", li);
    for (size_t i = mark; h && i < eng_q4nx_writer_count(w); i++) {
        eng_q4nx_wtensor_t t;
        eng_q4nx_writer_tensor(w, i, &t);
        json_t *shape = json_array();
        for (uint32_t k = 0; shape && k < t.rank; k++)
            json_array_append_new(shape, json_integer((json_int_t)t.shape[k]));
        if (!shape || json_array_append_new(h, json_pack("{s:s, s:s, s:o, s:I}", "name", t.name,
                                                         "dtype", eng_dtype_name(t.dtype), "shape",
                                                         shape, "bytes", (json_int_t)t.nbytes))) {
            json_decref(h);
            h = NULL;
        }
    }
    char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (!text)
        return SVC_ERR_NOMEM;
    uint8_t head[16];
    size_t  hl = strlen(text);
    memcpy(head, CK_TILES_MAGIC, 8);
    for (int i = 0; i < 8; i++)
        head[8 + i] = (uint8_t)((uint64_t)hl >> (8 * i));
    ck_out_t  o;
    svc_err_t err = ck_out_begin(ck, name, &o, errstr, n);
    if (!err)
        err = ck_out_put(&o, head, sizeof head, errstr, n);
    if (!err)
        err = ck_out_put(&o, text, hl, errstr, n);
    for (size_t i = mark; !err && i < eng_q4nx_writer_count(w); i++) {
        eng_q4nx_wtensor_t t;
        eng_q4nx_writer_tensor(w, i, &t);
        err = ck_out_put(&o, t.data, t.nbytes, errstr, n);
    }
    char     hex[ENG_SHA256_HEX + 1];
    uint64_t bytes = 0;
    if (err)
        ck_out_drop(&o);
    else
        err = ck_out_commit(&o, hex, &bytes, errstr, n);
    free(text);
    if (!err && !(*entry = ck_entry(name, bytes, hex)))
        err = SVC_ERR_NOMEM;
    return err;
}

static svc_err_t ck_stream_out(const qz_ckpt_t *ck, size_t li, const float *x, size_t count,
                               json_t **entry, char *errstr, size_t n) {
    char     name[64], hex[ENG_SHA256_HEX + 1];
    uint64_t bytes = 0;
    ck_out_t o;
    snprintf(name, sizeof name, "stream-%03zu.f32", li);
    svc_err_t err = ck_out_begin(ck, name, &o, errstr, n);
    if (!err && (err = ck_out_put(&o, x, count * sizeof *x, errstr, n)) != SVC_OK)
        ck_out_drop(&o);
    else if (!err)
        err = ck_out_commit(&o, hex, &bytes, errstr, n);
    if (!err && !(*entry = ck_entry(name, bytes, hex)))
        err = SVC_ERR_NOMEM;
    return err;
}

svc_err_t qz_ckpt_layer(qz_t *q, size_t li, const eng_q4nx_writer_t *w, size_t mark, const float *x,
                        size_t rows, char *errstr, size_t n) {
    qz_ckpt_t *ck = q->ck;
    json_t    *tiles = NULL, *stream = NULL;
    if (!ck->on)
        return SVC_OK;
    /* made now, not at the start: a run that fails before its first layer
     * leaves no checkpoint for the next one to trip over */
    svc_err_t err = pw_mkdirs(ck->dir, errstr, n);
    if (!err)
        err = ck_tiles_out(ck, li, w, mark, &tiles, errstr, n);
    if (!err)
        err = ck_stream_out(ck, li, x, rows * q->shell->cfg.hidden, &stream, errstr, n);
    if (!err)
        err = ck_sync_dir(ck, errstr, n);
    if (!err) { /* each call takes its value, failing or not */
        int bad = json_array_append_new(json_object_get(ck->state, "tiles"), tiles);
        bad |= json_object_set_new(ck->state, "stream", stream);
        bad |= json_object_set_new(ck->state, "done", json_integer((json_int_t)li + 1));
        err = bad ? SVC_ERR_NOMEM : SVC_OK;
    } else {
        json_decref(tiles);
        json_decref(stream);
    }
    if (!err)
        err = ck_write_state(ck, errstr, n);
    if (!err && ck->prev[0]) { /* state.json names the new stream: the old one can go */
        char *p = eng_path_join(ck->dir, ck->prev);
        if (p)
            unlink(p);
        free(p);
    }
    if (err)
        return err;
    snprintf(ck->prev, sizeof ck->prev, "stream-%03zu.f32", li);
    ck->done = li + 1;
    if (ck->stop && ck->done == ck->stop) {
        /* Test hook (D3_TEST_QUANT_STOP_AFTER_LAYER=N, tests/test_quantize.c):
         * the run fails right after layer N is checkpointed, as a run killed
         * there would stop, so that --resume can be tested without a kill. */
        svc_errf(errstr, n, "stopped after layer %zu (test hook D3_TEST_QUANT_STOP_AFTER_LAYER)",
                 ck->done);
        err = SVC_ERR_INTERNAL;
    }
    return err;
}

svc_err_t qz_ckpt_finish(qz_t *q) {
    char      why[512] = "";
    svc_err_t err = ck_sweep(q->ck, NULL, why, sizeof why);
    if (err) /* the package is complete: say so, but do not fail it */
        qz_log(q, "the checkpoints in \"%s\" were not all removed: %s", q->ck->dir,
               why[0] ? why : svc_err_name(err));
    return SVC_OK;
}
