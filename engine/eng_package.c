/*
 * eng_package.c -- opens a decision3 package directory (SPEC e): the
 * decision config, the tokenizer and the limits. Weights come in issue 3.
 *
 * Messages name the file and the rule, in the upstream words where SPEC e.2
 * gives them, so that an operator can tell a broken package from a bug.
 */
#include "engine.h"

#include "eng_image_int.h"
#include "eng_util_int.h"

#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

struct eng_package {
    char            *dir;
    char            *model_id;
    eng_tokenizer_t *tok;
    char            *codes[ENG_N_CODES];
    int32_t          code_ids[ENG_N_CODES];
    double           temperature;
    bool             noncausal;
    bool             readout_bf16; /* readout_dtype bfloat16 */
    size_t           max_length;
    size_t           img_factor, img_patch, img_merge; /* preprocessor_config.json */
};

typedef struct pkg_err {
    char  *buf;
    size_t size;
} pkg_err_t;

/* Loads a JSON object file with jansson; messages carry file and position. */
static json_t *load_object(const char *dir, const char *name, pkg_err_t *e) {
    char *path = eng_path_join(dir, name);
    if (!path) {
        svc_errf(e->buf, e->size, "out of memory");
        return NULL;
    }
    json_error_t jerr;
    json_t      *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        svc_errf(e->buf, e->size, "%s \"%s\": %s (line %d, column %d)", name, path, jerr.text,
                 jerr.line, jerr.column);
    else if (!json_is_object(root)) {
        svc_errf(e->buf, e->size, "%s \"%s\": the top level is not a JSON object", name, path);
        json_decref(root);
        root = NULL;
    }
    free(path);
    return root;
}

#define DC "decision_config.json"

static svc_err_t dc_fail(pkg_err_t *e, const char *dir, const char *msg) {
    svc_errf(e->buf, e->size, DC " \"%s/" DC "\": %s", dir, msg);
    return SVC_ERR_FORMAT;
}

static bool is_string(const json_t *v, const char *want) {
    return json_is_string(v) && strcmp(json_string_value(v), want) == 0;
}

/* format_version 1, format_id d3-code-readout-v1, prompt d3 (SPEC e.1, e.2). */
static svc_err_t dc_identity(const json_t *dc, const char *dir, pkg_err_t *e) {
    const json_t *ver = json_object_get(dc, "format_version");
    if (!json_is_integer(ver) || json_integer_value(ver) != 1 ||
        !is_string(json_object_get(dc, "format_id"), "d3-code-readout-v1"))
        return dc_fail(e, dir, "unsupported decision_config.json format");
    const json_t *prompt = json_object_get(dc, "prompt");
    if (!is_string(prompt, "d3")) {
        char  msg[256];
        char *text = json_is_string(prompt)
                         ? NULL
                         : json_dumps(prompt ? prompt : json_null(), JSON_ENCODE_ANY);
        if (json_is_string(prompt))
            snprintf(msg, sizeof msg, "unknown prompt family '%s'", json_string_value(prompt));
        else
            snprintf(msg, sizeof msg, "unknown prompt family %s", text ? text : "?");
        free(text);
        return dc_fail(e, dir, msg);
    }
    return SVC_OK;
}

/* 255 distinct non-empty codes and 255 distinct non-negative ids (SPEC e.2). */
static svc_err_t dc_codes(eng_package_t *pkg, const json_t *dc, pkg_err_t *e) {
    const char   *msg = "decision_config.json needs 255 distinct answer codes and token IDs";
    const json_t *codes = json_object_get(dc, "codes");
    const json_t *ids = json_object_get(dc, "token_ids");
    if (!json_is_array(codes) || !json_is_array(ids) || json_array_size(codes) != ENG_N_CODES ||
        json_array_size(ids) != ENG_N_CODES)
        return dc_fail(e, pkg->dir, msg);
    for (size_t i = 0; i < ENG_N_CODES; i++) {
        const json_t *c = json_array_get(codes, i);
        const json_t *id = json_array_get(ids, i);
        if (!json_is_string(c) || json_string_length(c) == 0 || !json_is_integer(id) ||
            json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX)
            return dc_fail(e, pkg->dir, msg);
        for (size_t j = 0; j < i; j++)
            if (strcmp(json_string_value(c), pkg->codes[j]) == 0 ||
                json_integer_value(id) == pkg->code_ids[j])
                return dc_fail(e, pkg->dir, msg);
        pkg->codes[i] = strdup(json_string_value(c));
        if (!pkg->codes[i])
            return SVC_ERR_NOMEM;
        pkg->code_ids[i] = (int32_t)json_integer_value(id);
    }
    return SVC_OK;
}

/* Optional string field with a default and a set of allowed values. */
static const char *dc_choice(const json_t *dc, const char *key, const char *dflt) {
    const json_t *v = json_object_get(dc, key);
    if (!v)
        return dflt;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static svc_err_t dc_modes(eng_package_t *pkg, const json_t *dc, pkg_err_t *e) {
    char        msg[256];
    const char *mode = dc_choice(dc, "attention_mode", "causal");
    if (!mode || (strcmp(mode, "causal") && strcmp(mode, "noncausal_full_attention"))) {
        snprintf(msg, sizeof msg, "unknown attention mode '%s'", mode ? mode : "?");
        return dc_fail(e, pkg->dir, msg);
    }
    pkg->noncausal = strcmp(mode, "noncausal_full_attention") == 0;
    const char *pool = dc_choice(dc, "pooling", "last");
    if (!pool || strcmp(pool, "last")) {
        snprintf(msg, sizeof msg, "unsupported pooling '%s'", pool ? pool : "?");
        return dc_fail(e, pkg->dir, msg);
    }
    const char *dtype = dc_choice(dc, "readout_dtype", "float32");
    if (!dtype || (strcmp(dtype, "float32") && strcmp(dtype, "bfloat16")))
        return dc_fail(e, pkg->dir, "readout_dtype must be float32 or bfloat16");
    pkg->readout_bf16 = strcmp(dtype, "bfloat16") == 0;
    const json_t *t = json_object_get(dc, "temperature");
    pkg->temperature = 1.0;
    if (t) {
        /* jansson keeps booleans apart from numbers, as the upstream check does. */
        if (!json_is_number(t) || !isfinite(json_number_value(t)) || json_number_value(t) <= 0)
            return dc_fail(e, pkg->dir, "temperature must be positive and finite");
        pkg->temperature = json_number_value(t);
    }
    return SVC_OK;
}

/* max_length, else config.json text_config.max_position_embeddings (SPEC c.7). */
static svc_err_t dc_max_length(eng_package_t *pkg, const json_t *dc, pkg_err_t *e) {
    const json_t *ml = json_object_get(dc, "max_length");
    if (ml && !json_is_null(ml)) {
        if (!json_is_integer(ml) || json_integer_value(ml) < 16)
            return dc_fail(e, pkg->dir, "max_length must be null or an integer >= 16");
        pkg->max_length = (size_t)json_integer_value(ml);
        return SVC_OK;
    }
    json_t *cfg = load_object(pkg->dir, "config.json", e);
    if (!cfg)
        return SVC_ERR_FORMAT;
    const json_t *tc = json_object_get(cfg, "text_config");
    const json_t *mpe = json_object_get(tc ? tc : cfg, "max_position_embeddings");
    svc_err_t     err = SVC_OK;
    if (!json_is_integer(mpe) || json_integer_value(mpe) < 16) {
        svc_errf(e->buf, e->size,
                 "config.json \"%s/config.json\": text_config.max_position_embeddings must be an "
                 "integer >= 16 when decision_config.json has no max_length",
                 pkg->dir);
        err = SVC_ERR_FORMAT;
    } else
        pkg->max_length = (size_t)json_integer_value(mpe);
    json_decref(cfg);
    return err;
}

static svc_err_t read_decision_config(eng_package_t *pkg, pkg_err_t *e) {
    json_t *dc = load_object(pkg->dir, DC, e);
    if (!dc)
        return SVC_ERR_FORMAT;
    svc_err_t err = dc_identity(dc, pkg->dir, e);
    if (!err)
        err = dc_codes(pkg, dc, e);
    if (!err)
        err = dc_modes(pkg, dc, e);
    if (!err)
        err = dc_max_length(pkg, dc, e);
    json_decref(dc);
    return err;
}

static svc_err_t load_tokenizer(eng_package_t *pkg, pkg_err_t *e) {
    char     *json_path = eng_path_join(pkg->dir, "tokenizer.json");
    char     *cfg_path = eng_path_join(pkg->dir, "tokenizer_config.json");
    svc_err_t err = SVC_ERR_NOMEM;
    if (json_path && cfg_path)
        err = eng_tokenizer_load(json_path, eng_is_file(cfg_path) ? cfg_path : NULL,
                                 ENG_TOK_UPSTREAM, &pkg->tok, e->buf, e->size);
    free(json_path);
    free(cfg_path);
    return err;
}

/* Every code must encode, alone, to exactly its id (SPEC c.5). */
static svc_err_t check_codes(eng_package_t *pkg, pkg_err_t *e) {
    eng_ids_t ids;
    eng_ids_init(&ids);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < ENG_N_CODES && !err; i++) {
        ids.n = 0;
        err = eng_tokenizer_encode(pkg->tok, pkg->codes[i], strlen(pkg->codes[i]), &ids);
        if (!err && (ids.n != 1 || ids.v[0] != pkg->code_ids[i])) {
            svc_errf(e->buf, e->size,
                     "package \"%s\": checkpoint answer codes differ from its tokenizer (code %zu "
                     "\"%s\" is not token %d alone)",
                     pkg->dir, i, pkg->codes[i], (int)pkg->code_ids[i]);
            err = SVC_ERR_FORMAT;
        }
    }
    eng_ids_fini(&ids);
    return err;
}

/* MODEL_MANIFEST.json model_name, else the directory's last component. */
/* The image geometry prompts count with (SPEC c.7): the package's
 * preprocessor_config.json, else Qwen's. A file that does not pass is left
 * to the model load, which refuses it where the tower is used; a package
 * that reads no images never counts image tokens. */
static void read_image_geometry(eng_package_t *pkg) {
    eng_vis_proc_t p;
    bool           present = false;
    char           why[256];
    eng_vis_proc_default(&p);
    if (eng_vis_proc_load(pkg->dir, &p, &present, why, sizeof why) != SVC_OK)
        eng_vis_proc_default(&p);
    pkg->img_patch = p.patch;
    pkg->img_merge = p.merge;
    pkg->img_factor = p.patch * p.merge;
}

size_t eng_package_image_tokens(const eng_package_t *pkg, uint32_t width, uint32_t height) {
    if (!pkg)
        return eng_image_tokens(width, height);
    if (width == 0 || height == 0)
        return 0;
    uint32_t oh, ow;
    eng_smart_resize_dims(height, width, pkg->img_factor, ENG_IMG_MIN_PIXELS, ENG_IMG_MAX_PIXELS,
                          &oh, &ow);
    return (size_t)(oh / pkg->img_patch) * (ow / pkg->img_patch) /
           (pkg->img_merge * pkg->img_merge);
}

static svc_err_t find_model_id(eng_package_t *pkg) {
    char *path = eng_path_join(pkg->dir, "MODEL_MANIFEST.json");
    if (!path)
        return SVC_ERR_NOMEM;
    json_t *man = eng_is_file(path) ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    const json_t *name = man ? json_object_get(man, "model_name") : NULL;
    if (json_is_string(name) && json_string_length(name) > 0)
        pkg->model_id = strdup(json_string_value(name));
    else {
        char *copy = strdup(pkg->dir);
        if (copy) {
            size_t n = strlen(copy);
            while (n > 1 && copy[n - 1] == '/')
                copy[--n] = '\0';
            pkg->model_id = strdup(basename(copy));
            free(copy);
        }
    }
    json_decref(man);
    return pkg->model_id ? SVC_OK : SVC_ERR_NOMEM;
}

svc_err_t eng_package_open(const char *dir, eng_package_t **out, char *errstr, size_t errstr_size) {
    pkg_err_t      e = {errstr, errstr_size};
    eng_package_t *pkg = calloc(1, sizeof *pkg);
    if (!pkg || !(pkg->dir = strdup(dir))) {
        free(pkg);
        svc_errf(errstr, errstr_size, "out of memory");
        return SVC_ERR_NOMEM;
    }
    struct stat st;
    svc_err_t   err = SVC_OK;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        svc_errf(errstr, errstr_size, "package \"%s\": not a directory", dir);
        err = SVC_ERR_IO;
    }
    if (!err)
        err = read_decision_config(pkg, &e);
    if (!err)
        err = load_tokenizer(pkg, &e);
    if (!err)
        err = check_codes(pkg, &e);
    if (!err)
        err = find_model_id(pkg);
    if (!err)
        read_image_geometry(pkg);
    if (err) {
        if (err == SVC_ERR_NOMEM)
            svc_errf(errstr, errstr_size, "package \"%s\": out of memory", dir);
        eng_package_free(pkg);
        return err;
    }
    *out = pkg;
    return SVC_OK;
}

void eng_package_free(eng_package_t *pkg) {
    if (!pkg)
        return;
    for (size_t i = 0; i < ENG_N_CODES; i++)
        free(pkg->codes[i]);
    eng_tokenizer_free(pkg->tok);
    free(pkg->model_id);
    free(pkg->dir);
    free(pkg);
}

const eng_tokenizer_t *eng_package_tokenizer(const eng_package_t *pkg) {
    return pkg->tok;
}

size_t eng_package_max_length(const eng_package_t *pkg) {
    return pkg->max_length;
}

const char *eng_package_code(const eng_package_t *pkg, size_t i) {
    SVC_ASSERT(i < ENG_N_CODES);
    return pkg->codes[i];
}

int32_t eng_package_code_id(const eng_package_t *pkg, size_t i) {
    SVC_ASSERT(i < ENG_N_CODES);
    return pkg->code_ids[i];
}

double eng_package_temperature(const eng_package_t *pkg) {
    return pkg->temperature;
}

bool eng_package_readout_bf16(const eng_package_t *pkg) {
    return pkg->readout_bf16;
}

bool eng_package_noncausal(const eng_package_t *pkg) {
    return pkg->noncausal;
}

const char *eng_package_model_id(const eng_package_t *pkg) {
    return pkg->model_id;
}
