/*
 * eng_st_set.c -- the weights of a package as one set of safetensors
 * tensors (SPEC e.1): model.safetensors, or model.safetensors.index.json and
 * the shards its weight_map names (the Hugging Face sharded layout).
 *
 * The loader (eng_model.c) asks the set for a tensor by name and never
 * needs to know which file holds it, so the single-file and the sharded
 * package share every check after the lookup. A sharded set resolves a
 * name through the map only: a tensor that sits in a shard but is not
 * mapped is not found, as transformers would not load it either.
 */
#include "eng_st_int.h"
#include "eng_util_int.h"

#include <jansson.h>

typedef struct st_entry {
    const char *name; /* a weight_map key, owned by set->index */
    size_t      shard;
} st_entry_t;

struct eng_st_set {
    char       *path;  /* the single file or the index */
    const char *file;  /* its name inside the package */
    eng_st_t  **st;    /* (n_st): every shard once, in first-mapped order */
    char      **names; /* (n_st): the shard file names */
    size_t      n_st;
    json_t     *index;   /* NULL for a single file */
    st_entry_t *entries; /* (n_entries), sorted by name */
    size_t      n_entries;
    size_t      count; /* tensors over every shard */
};

static svc_err_t set_new(const char *dir, const char *file, eng_st_set_t **out) {
    eng_st_set_t *s = calloc(1, sizeof *s);
    if (!s || !(s->path = eng_path_join(dir, file))) {
        free(s);
        return SVC_ERR_NOMEM;
    }
    s->file = file;
    *out = s;
    return SVC_OK;
}

/* Adds an opened shard; the set owns st from here on, also on failure. */
static svc_err_t set_push(eng_st_set_t *s, eng_st_t *st, const char *name) {
    eng_st_t **a = realloc(s->st, (s->n_st + 1) * sizeof *a);
    if (a)
        s->st = a;
    char **b = a ? realloc(s->names, (s->n_st + 1) * sizeof *b) : NULL;
    if (b)
        s->names = b;
    char *copy = b ? strdup(name) : NULL;
    if (!copy) {
        eng_st_close(st);
        return SVC_ERR_NOMEM;
    }
    s->st[s->n_st] = st;
    s->names[s->n_st++] = copy;
    s->count += eng_st_count(st);
    return SVC_OK;
}

svc_err_t eng_st_set_open_file(const char *dir, const char *file, eng_st_set_t **out, char *errstr,
                               size_t errstr_size) {
    *out = NULL;
    eng_st_set_t *s = NULL;
    eng_st_t     *st = NULL;
    svc_err_t     err = set_new(dir, file, &s);
    if (!err)
        err = eng_st_open(s->path, &st, errstr, errstr_size);
    if (!err)
        err = set_push(s, st, file);
    if (err) {
        eng_st_set_close(s);
        return err;
    }
    *out = s;
    return SVC_OK;
}

SVC_FMT(4, 5)
static svc_err_t idx_fail(const eng_st_set_t *s, char *errstr, size_t n, const char *fmt, ...) {
    char    msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc_errf(errstr, n, "%s \"%s\": %s", s->file, s->path, msg);
    return SVC_ERR_FORMAT;
}

/* A shard must be a plain file name inside the package: the index is as
 * untrusted as the weights, and "../x" or "/x" would read outside it. */
static bool shard_name_ok(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const st_entry_t *)a)->name, ((const st_entry_t *)b)->name);
}

/* The shard index of name, opening it on first use: each shard once. */
static svc_err_t set_shard(eng_st_set_t *s, const char *dir, const char *tensor, const char *name,
                           size_t *idx, char *errstr, size_t n) {
    for (size_t i = 0; i < s->n_st; i++) {
        if (strcmp(s->names[i], name) == 0) {
            *idx = i;
            return SVC_OK;
        }
    }
    if (!shard_name_ok(name))
        return idx_fail(s, errstr, n,
                        "tensor \"%s\": shard \"%s\" must be a file name inside the package "
                        "(no '/', no '..')",
                        tensor, name);
    char *path = eng_path_join(dir, name);
    if (!path)
        return SVC_ERR_NOMEM;
    char      why[512] = "";
    eng_st_t *st = NULL;
    svc_err_t err = eng_st_open(path, &st, why, sizeof why);
    free(path);
    if (err == SVC_ERR_NOMEM)
        return err;
    if (err) {
        idx_fail(s, errstr, n, "tensor \"%s\": shard \"%s\" cannot be read: %s", tensor, name, why);
        return err == SVC_ERR_IO ? SVC_ERR_IO : SVC_ERR_FORMAT;
    }
    *idx = s->n_st;
    return set_push(s, st, name);
}

static svc_err_t set_load_index(eng_st_set_t *s, const char *dir, char *errstr, size_t n) {
    json_error_t je;
    s->index = json_load_file(s->path, JSON_REJECT_DUPLICATES, &je);
    if (!s->index) {
        svc_errf(errstr, n, "%s \"%s\": %s (line %d)", s->file, s->path, je.text, je.line);
        return SVC_ERR_FORMAT;
    }
    json_t *map = json_object_get(s->index, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0)
        return idx_fail(s, errstr, n, "\"weight_map\" must be a non-empty object");
    s->entries = calloc(json_object_size(map), sizeof *s->entries);
    if (!s->entries)
        return SVC_ERR_NOMEM;
    const char *key;
    json_t     *val;
    json_object_foreach(map, key, val) {
        if (!json_is_string(val))
            return idx_fail(s, errstr, n, "weight_map[\"%s\"] must be a shard file name", key);
        st_entry_t *e = &s->entries[s->n_entries];
        svc_err_t   err = set_shard(s, dir, key, json_string_value(val), &e->shard, errstr, n);
        if (err)
            return err;
        e->name = key;
        s->n_entries++;
    }
    qsort(s->entries, s->n_entries, sizeof *s->entries, entry_cmp);
    return SVC_OK;
}

svc_err_t eng_st_set_open_index(const char *dir, const char *index, eng_st_set_t **out,
                                char *errstr, size_t errstr_size) {
    *out = NULL;
    eng_st_set_t *s = NULL;
    svc_err_t     err = set_new(dir, index, &s);
    if (!err)
        err = set_load_index(s, dir, errstr, errstr_size);
    if (err) {
        eng_st_set_close(s);
        return err;
    }
    *out = s;
    return SVC_OK;
}

void eng_st_set_close(eng_st_set_t *s) {
    if (!s)
        return;
    for (size_t i = 0; i < s->n_st; i++) {
        eng_st_close(s->st[i]);
        free(s->names[i]);
    }
    free(s->st);
    free(s->names);
    free(s->entries);
    json_decref(s->index);
    free(s->path);
    free(s);
}

const char *eng_st_set_file(const eng_st_set_t *s) {
    return s->file;
}

const char *eng_st_set_path(const eng_st_set_t *s) {
    return s->path;
}

size_t eng_st_set_count(const eng_st_set_t *s) {
    return s->count;
}

const eng_st_tensor_t *eng_st_set_at(const eng_st_set_t *s, size_t i) {
    for (size_t k = 0; k < s->n_st; k++) {
        size_t c = eng_st_count(s->st[k]);
        if (i < c)
            return eng_st_at(s->st[k], i);
        i -= c;
    }
    return NULL;
}

svc_err_t eng_st_set_find(const eng_st_set_t *s, const char *name, const eng_st_tensor_t **t,
                          const char **shard, const char **shard_path, char *errstr,
                          size_t errstr_size) {
    size_t k = 0;
    if (s->index) {
        st_entry_t        key = {name, 0};
        const st_entry_t *e = bsearch(&key, s->entries, s->n_entries, sizeof key, entry_cmp);
        if (!e)
            return idx_fail(s, errstr, errstr_size, "tensor \"%s\" is not in the weight_map", name);
        k = e->shard;
    }
    *shard = s->names[k];
    *shard_path = eng_st_path(s->st[k]);
    *t = eng_st_find(s->st[k], name);
    if (*t)
        return SVC_OK;
    if (s->index)
        return idx_fail(s, errstr, errstr_size, "tensor \"%s\" is missing from its shard \"%s\"",
                        name, s->names[k]);
    svc_errf(errstr, errstr_size, "%s \"%s\": tensor \"%s\" is missing", s->file, s->path, name);
    return SVC_ERR_FORMAT;
}
