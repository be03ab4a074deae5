/*
 * test_shards.c -- sharded upstream weights (SPEC e.1:
 * model.safetensors.index.json + the shards its weight_map names) and the
 * MODEL_MANIFEST.json `parameters` check at load (SPEC e.3).
 *
 * The sharded packages are the tiny upstream fixture with its
 * model.safetensors split into three shards by a minimal writer below, and
 * a manifest rewritten to list the new files with a recomputed identity,
 * so `d3stream ask` verifies them like any package.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eng_manifest_int.h"
#include "eng_st_int.h"
#include "engine.h"

#define PKG      D3_SOURCE_DIR "/tests/fixtures/tiny-upstream"
#define N_SHARDS 3
#define INDEX    "model.safetensors.index.json"

/* Every file of the fixture but model.safetensors. */
static const char *const PKG_FILES[] = {
    "config.json",           "decision_config.json", "readout.safetensors", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja",  "README.md",           "MODEL_MANIFEST.json",
};

static const char ASK_BODY[] =
    "{\"state\": \"The order arrived damaged.\", \"questions\": {\"route\": {\"type\": \"choice\","
    "\"criteria\": {\"returns\": \"Refunds and replacements\", \"billing\": \"Payments\", "
    "\"general\": null}}}}";

/* ------------------------------------------------------------ files */

static void join(char *out, size_t n, const char *dir, const char *name) {
    int k = snprintf(out, n, "%s/%s", dir, name);
    cr_assert(k > 0 && (size_t)k < n, "path too long: %s/%s", dir, name);
}

static void copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    FILE *out = fopen(dst, "wb");
    cr_assert(in && out, "cannot copy %s to %s", src, dst);
    char   buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        cr_assert_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    cr_assert_eq(fclose(out), 0);
}

static void remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Writes tensors t[0..n-1] as a safetensors file: the same dtypes, shapes
 * and bytes, packed in order after a space-padded JSON header. */
static void st_write(const char *path, const eng_st_tensor_t *const *t, size_t n) {
    json_t  *hdr = json_object();
    uint64_t off = 0;
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t[i]->rank; d++)
            json_array_append_new(shape, json_integer((json_int_t)t[i]->shape[d]));
        json_object_set_new(hdr, t[i]->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", eng_dtype_name(t[i]->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t[i]->nbytes)));
        off += t[i]->nbytes;
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    cr_assert(text);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE  *fp = fopen(path, "wb");
    cr_assert(fp, "cannot write %s", path);
    uint8_t le[8];
    for (int b = 0; b < 8; b++)
        le[b] = (uint8_t)((uint64_t)padded >> (8 * b));
    cr_assert_eq(fwrite(le, 1, 8, fp), 8);
    cr_assert_eq(fwrite(text, 1, len, fp), len);
    for (size_t k = len; k < padded; k++)
        cr_assert_neq(fputc(' ', fp), EOF);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(fwrite(t[i]->data, 1, t[i]->nbytes, fp), t[i]->nbytes);
    cr_assert_eq(fclose(fp), 0);
    free(text);
    json_decref(hdr);
}

/* ------------------------------------------------------------ packages */

typedef struct sharded {
    char    dir[64];
    json_t *index; /* as written to dir/INDEX */
} sharded_t;

static void shard_name(char *out, size_t n, size_t k) {
    snprintf(out, n, "model-%05zu-of-%05d.safetensors", k + 1, N_SHARDS);
}

static void index_write(const sharded_t *s) {
    char path[600];
    join(path, sizeof path, s->dir, INDEX);
    cr_assert_eq(json_dump_file(s->index, path, JSON_INDENT(2) | JSON_SORT_KEYS), 0);
}

static json_t *weight_map(const sharded_t *s) {
    return json_object_get(s->index, "weight_map");
}

/* The manifest counts, as deltas to the fixture's. */
typedef struct deltas {
    json_int_t text, vision, readout, loaded;
} deltas_t;

static void bump(json_t *p, const char *key, json_int_t delta) {
    json_int_t v = json_integer_value(json_object_get(p, key));
    cr_assert_eq(json_object_set_new(p, key, json_integer(v + delta)), 0);
}

/* MODEL_MANIFEST.json for the files now in dir: every file hashed, sizes
 * dropped (optional), the identity recomputed, the counts moved by d. */
static void manifest_write(const char *dir, deltas_t d) {
    char path[600];
    join(path, sizeof path, PKG, "MODEL_MANIFEST.json");
    json_error_t jerr;
    json_t      *mf = json_load_file(path, JSON_PRESERVE_ORDER, &jerr);
    cr_assert(mf, "%s", jerr.text);
    json_object_del(mf, "files_bytes");
    json_t *files = json_object();
    char    names[N_SHARDS + 1][64];
    for (size_t k = 0; k < N_SHARDS; k++)
        shard_name(names[k], sizeof names[k], k);
    snprintf(names[N_SHARDS], sizeof names[N_SHARDS], "%s", INDEX);
    char sha[ENG_SHA256_HEX + 1], errstr[512];
    for (size_t i = 0; i < sizeof PKG_FILES / sizeof PKG_FILES[0] + N_SHARDS + 1; i++) {
        const char *name = i < N_SHARDS + 1 ? names[i] : PKG_FILES[i - N_SHARDS - 1];
        if (strcmp(name, "MODEL_MANIFEST.json") == 0)
            continue;
        join(path, sizeof path, dir, name);
        cr_assert_eq(eng_sha256_file(path, sha, NULL, errstr, sizeof errstr), SVC_OK, "%s", errstr);
        json_object_set_new(files, name, json_string(sha));
    }
    json_object_set_new(mf, "files_sha256", files);
    json_t *p = json_object_get(mf, "parameters");
    bump(p, "text", d.text);
    bump(p, "vision", d.vision);
    bump(p, "readout", d.readout);
    bump(p, "loaded", d.loaded);
    cr_assert_eq(eng_manifest_identity(dir, NULL, sha, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    json_object_set_new(json_object_get(mf, "identity"), "model_sha256", json_string(sha));
    join(path, sizeof path, dir, "MODEL_MANIFEST.json");
    cr_assert_eq(json_dump_file(mf, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER), 0);
    json_decref(mf);
}

/* The fixture in a temporary directory with its weights in N_SHARDS
 * shards (contiguous runs of tensors, as transformers splits them), the
 * index naming them, and a manifest that verifies. */
static void sharded_make(sharded_t *s, deltas_t d) {
    snprintf(s->dir, sizeof s->dir, "/tmp/d3shards-XXXXXX");
    cr_assert(mkdtemp(s->dir));
    char src[600], dst[600], errstr[512];
    for (size_t i = 0; i < sizeof PKG_FILES / sizeof PKG_FILES[0]; i++) {
        join(src, sizeof src, PKG, PKG_FILES[i]);
        join(dst, sizeof dst, s->dir, PKG_FILES[i]);
        copy_file(src, dst);
    }
    eng_st_t *st = NULL;
    join(src, sizeof src, PKG, "model.safetensors");
    cr_assert_eq(eng_st_open(src, &st, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    size_t                  n = eng_st_count(st);
    const eng_st_tensor_t **t = calloc(n, sizeof *t);
    json_t                 *map = json_object();
    json_int_t              total = 0;
    cr_assert(t && n >= N_SHARDS);
    for (size_t k = 0, first = 0; k < N_SHARDS; k++) {
        size_t end = n * (k + 1) / N_SHARDS;
        char   name[64];
        shard_name(name, sizeof name, k);
        for (size_t i = first; i < end; i++) {
            t[i] = eng_st_at(st, i);
            json_object_set_new(map, t[i]->name, json_string(name));
            total += (json_int_t)t[i]->nbytes;
        }
        join(dst, sizeof dst, s->dir, name);
        st_write(dst, t + first, end - first);
        first = end;
    }
    s->index = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", total, "weight_map", map);
    index_write(s);
    free(t);
    eng_st_close(st);
    manifest_write(s->dir, d);
}

static void sharded_free(sharded_t *s) {
    json_decref(s->index);
    remove_dir(s->dir);
}

/* The load must fail with a message holding every one of want[]. */
static void expect_load_error(const char *dir, const char *const *want, size_t n_want) {
    eng_model_t *m = NULL;
    char         errstr[1024] = "";
    svc_err_t    err = eng_model_load(dir, &m, errstr, sizeof errstr);
    cr_assert_neq(err, SVC_OK, "loaded a broken package");
    cr_assert_null(m);
    cr_assert_null(strchr(errstr, '\n'), "not one line: %s", errstr);
    for (size_t i = 0; i < n_want; i++)
        cr_assert(strstr(errstr, want[i]), "message lacks \"%s\": %s", want[i], errstr);
}

/* ------------------------------------------------------------ loading */

static float *forward(const eng_model_t *m, bool noncausal) {
    eng_model_info_t mi;
    eng_model_get_info(m, &mi);
    int32_t ids[7];
    for (size_t i = 0; i < 7; i++)
        ids[i] = (int32_t)((i * 37 + 5) % mi.vocab);
    float *h = calloc(mi.hidden, sizeof *h);
    char   errstr[512];
    cr_assert(h);
    cr_assert_eq(eng_model_forward(m, ids, 7, noncausal, h, NULL, NULL, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
    return h;
}

Test(shards, load_is_bit_identical) {
    sharded_t s;
    sharded_make(&s, (deltas_t){0});
    eng_model_t *one = NULL, *many = NULL;
    char         errstr[1024];
    cr_assert_eq(eng_model_load(PKG, &one, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(eng_model_load(s.dir, &many, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_str_eq(eng_model_format(many), "safetensors");
    eng_model_info_t a, b;
    eng_model_get_info(one, &a);
    eng_model_get_info(many, &b);
    cr_assert_eq(a.n_params_text, b.n_params_text);
    for (int noncausal = 0; noncausal <= 1; noncausal++) {
        float *x = forward(one, noncausal), *y = forward(many, noncausal);
        cr_assert_eq(memcmp(x, y, a.hidden * sizeof *x), 0, "forward differs (noncausal %d)",
                     noncausal);
        free(x);
        free(y);
    }
    cr_assert_eq(eng_model_check_parameters(many, s.dir, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    eng_model_free(one);
    eng_model_free(many);
    sharded_free(&s);
}

Test(shards, missing_shard) {
    sharded_t s;
    char      path[600], shard[64];
    sharded_make(&s, (deltas_t){0});
    shard_name(shard, sizeof shard, 1);
    join(path, sizeof path, s.dir, shard);
    cr_assert_eq(unlink(path), 0);
    const char *want[] = {INDEX, shard, "tensor \"model.language_model.", "cannot be read"};
    expect_load_error(s.dir, want, 4);
    sharded_free(&s);
}

Test(shards, tensor_not_in_map) {
    sharded_t s;
    sharded_make(&s, (deltas_t){0});
    cr_assert_eq(json_object_del(weight_map(&s), "model.language_model.norm.weight"), 0);
    index_write(&s);
    const char *want[] = {INDEX, "tensor \"model.language_model.norm.weight\"",
                          "not in the weight_map"};
    expect_load_error(s.dir, want, 3);
    sharded_free(&s);
}

/* The map names a shard that exists but does not hold the tensor. */
Test(shards, tensor_not_in_its_shard) {
    sharded_t s;
    char      shard[64];
    sharded_make(&s, (deltas_t){0});
    shard_name(shard, sizeof shard, 0);
    json_object_set_new(weight_map(&s), "model.language_model.norm.weight", json_string(shard));
    index_write(&s);
    const char *want[] = {INDEX, "tensor \"model.language_model.norm.weight\"", shard,
                          "missing from its shard"};
    expect_load_error(s.dir, want, 4);
    sharded_free(&s);
}

Test(shards, shard_names_stay_in_the_package) {
    static const char *const bad[] = {"../model-00001-of-00003.safetensors",
                                      "/tmp/model.safetensors", "sub/model.safetensors", "..", ""};
    sharded_t                s;
    sharded_make(&s, (deltas_t){0});
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_object_set_new(weight_map(&s), "model.language_model.norm.weight",
                            json_string(bad[i]));
        index_write(&s);
        char quoted[80];
        snprintf(quoted, sizeof quoted, "shard \"%s\"", bad[i]);
        const char *want[] = {INDEX, "tensor \"model.language_model.norm.weight\"", quoted,
                              "must be a file name inside the package"};
        expect_load_error(s.dir, want, 4);
    }
    sharded_free(&s);
}

Test(shards, bad_index) {
    sharded_t s;
    sharded_make(&s, (deltas_t){0});
    json_object_set_new(s.index, "weight_map", json_array());
    index_write(&s);
    const char *want[] = {INDEX, "weight_map"};
    expect_load_error(s.dir, want, 2);
    sharded_free(&s);
}

/* model.safetensors wins over an index next to it (single-file load). */
Test(shards, single_file_wins) {
    sharded_t s;
    char      src[600], dst[600], errstr[1024];
    sharded_make(&s, (deltas_t){0});
    json_object_set_new(s.index, "weight_map", json_array()); /* would fail if read */
    index_write(&s);
    join(src, sizeof src, PKG, "model.safetensors");
    join(dst, sizeof dst, s.dir, "model.safetensors");
    copy_file(src, dst);
    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_load(s.dir, &m, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_model_free(m);
    sharded_free(&s);
}

/* ------------------------------------------------------------ parameters */

typedef struct params_case {
    deltas_t    d;
    const char *want; /* NULL: accepted */
} params_case_t;

Test(parameters, manifest_counts) {
    static const params_case_t cases[] = {
        {{0, 0, 0, 0}, NULL},
        {{0, 5, 0, 5}, NULL}, /* a vision tower that is not loaded */
        {{1, 0, 0, 1}, "parameters.text: expected 509921, the loaded text tower has 509920"},
        {{0, 0, -1, -1}, "parameters.readout: expected 16319, the loaded readout has 16320"},
        {{0, 0, 0, 1}, "parameters.loaded: expected 526241 (vision 0 not loaded), loaded 526240"},
        {{0, 3, 0, 0}, "parameters.loaded: expected 526240 (vision 3 not loaded)"},
    };
    eng_model_t *m = NULL;
    char         errstr[1024];
    cr_assert_eq(eng_model_load(PKG, &m, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(eng_model_check_parameters(m, PKG, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    sharded_t s;
    sharded_make(&s, (deltas_t){0});
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        manifest_write(s.dir, cases[i].d);
        errstr[0] = '\0';
        svc_err_t err = eng_model_check_parameters(m, s.dir, errstr, sizeof errstr);
        if (!cases[i].want) {
            cr_assert_eq(err, SVC_OK, "case %zu: %s", i, errstr);
            continue;
        }
        cr_assert_eq(err, SVC_ERR_FORMAT, "case %zu accepted", i);
        cr_assert(strstr(errstr, "MODEL_MANIFEST.json \""), "case %zu: %s", i, errstr);
        cr_assert(strstr(errstr, cases[i].want), "case %zu: %s", i, errstr);
        cr_assert_null(strchr(errstr, '\n'));
    }
    /* No parameters listed, or no MODEL_MANIFEST.json: nothing to compare. */
    char path[600];
    join(path, sizeof path, s.dir, "MODEL_MANIFEST.json");
    json_t *mf = json_load_file(path, 0, NULL);
    json_object_del(mf, "parameters");
    cr_assert_eq(json_dump_file(mf, path, 0), 0);
    json_decref(mf);
    cr_assert_eq(eng_model_check_parameters(m, s.dir, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(eng_model_check_parameters(m, s.dir, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    eng_model_free(m);
    sharded_free(&s);
}

/* ------------------------------------------------------------ d3stream ask */

typedef struct ran {
    int  rc;
    char out[8192], err[8192];
} ran_t;

static void slurp(const char *path, char *buf, size_t n) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    size_t k = fread(buf, 1, n - 1, fp);
    buf[k] = '\0';
    fclose(fp);
}

/* d3stream ask [extra] --model dir on ASK_BODY; stdout and stderr apart. */
static void run_ask(const char *dir, const char *extra, ran_t *r) {
    const char *bin = getenv("D3STREAM");
    cr_assert(bin && *bin, "D3STREAM (path of the d3stream binary) is not set; run through ctest");
    char tmp[] = "/tmp/d3shards-ask-XXXXXX";
    cr_assert(mkdtemp(tmp));
    char req[600], out[600], err[600], cmd[4096];
    join(req, sizeof req, tmp, "req.json");
    join(out, sizeof out, tmp, "out");
    join(err, sizeof err, tmp, "err");
    FILE *fp = fopen(req, "wb");
    cr_assert(fp);
    fputs(ASK_BODY, fp);
    cr_assert_eq(fclose(fp), 0);
    snprintf(cmd, sizeof cmd, "'%s' ask %s --model '%s' '%s' >'%s' 2>'%s'", bin, extra, dir, req,
             out, err);
    int status = system(cmd);
    cr_assert(status != -1 && WIFEXITED(status), "%s did not run", cmd);
    r->rc = WEXITSTATUS(status);
    slurp(out, r->out, sizeof r->out);
    slurp(err, r->err, sizeof r->err);
    remove_dir(tmp);
}

/* The fixture and its sharded copy both verify, pass the parameter check
 * and answer the same. */
Test(ask, sharded_package_answers_the_same) {
    sharded_t s;
    sharded_make(&s, (deltas_t){0});
    ran_t *a = calloc(2, sizeof *a);
    cr_assert(a);
    run_ask(PKG, "", &a[0]);
    run_ask(s.dir, "", &a[1]);
    cr_assert_eq(a[0].rc, 0, "fixture: exit %d: %s", a[0].rc, a[0].err);
    cr_assert_eq(a[1].rc, 0, "sharded: exit %d: %s", a[1].rc, a[1].err);
    cr_assert(strstr(a[1].out, "\"answers\""), "%s", a[1].out);
    cr_assert_str_eq(a[0].out, a[1].out);
    free(a);
    sharded_free(&s);
}

/* A manifest that verifies but lists another text count: refused (exit 3)
 * with the one line naming the field; --no-verify skips the check. */
Test(ask, parameter_mismatch_is_refused) {
    sharded_t s;
    sharded_make(&s, (deltas_t){1, 0, 0, 1});
    ran_t *r = calloc(1, sizeof *r);
    cr_assert(r);
    run_ask(s.dir, "", r);
    cr_assert_eq(r->rc, 3, "exit %d: %s", r->rc, r->err);
    cr_assert(strstr(r->err, "MODEL_MANIFEST.json \""), "%s", r->err);
    cr_assert(strstr(r->err, "parameters.text: expected 509921, the loaded text tower has 509920"),
              "%s", r->err);
    cr_assert_str_eq(r->out, "");
    run_ask(s.dir, "--no-verify", r);
    cr_assert_eq(r->rc, 0, "exit %d: %s", r->rc, r->err);
    cr_assert(strstr(r->err, "--no-verify"), "%s", r->err);
    free(r);
    sharded_free(&s);
}
