/*
 * eng_pkgwrite_q4nx.c -- `make-package --format q4nx`: the D3-Nano-NPU2
 * file set (/work/shared/docs/D3-NANO-NPU2.md "Files") with synthetic
 * weights, and the `--twin` upstream package that holds the q4nx values.
 *
 * model.q4nx is written by the Gen-B writer (eng_q4nx_write.c) from the
 * very values model.safetensors of the same seed holds (BF16-rounded), so
 * the difference between the two packages is the quantisation alone. One
 * tensor at a time is generated in f32, added (encoded at once) and freed:
 * the writer keeps only the encoded bytes until finish, about 0.3 of the
 * BF16 size, never every f32 weight.
 *
 * The twin reads every tensor back through eng_q4nx_tensor_f32 -- the
 * function eng_model_load uses for model.q4nx -- and stores it as F32,
 * because BF16 cannot hold the dequantised values exactly. Loading either
 * package therefore gives the same fp32 arrays, bit for bit. The vision
 * tower comes back from vision_weight.q4nx the same way, untiled with the
 * tile sizes the package's config.json names (as a loader would read
 * them); its values are BF16 and so equal model.safetensors' of the seed.
 */
#include "eng_manifest_int.h"
#include "eng_pkgwrite_int.h"
#include "eng_q4nx_int.h"

/* Every file of the q4nx package before MANIFEST.sha256, in name order.
 * Not written: LICENSE (D3-NANO-NPU2.md lists it; README.md states the
 * licence). preprocessor_config.json is not in FLM's model list; written
 * for d3stream's image path (SPEC e.7). */
static const char *const Q4NX_FILES[] = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "decision_config.json",
    "model.q4nx",
    "preprocessor_config.json",
    "readout.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vision_weight.q4nx",
};

svc_err_t pw_q4nx_add_list(const pw_ctx_t *c, eng_q4nx_writer_t *w, const pw_list_t *l,
                           const pw_fill_t *fill, bool progress) {
    uint64_t  total = 0, done = 0;
    svc_err_t err = SVC_OK;
    for (size_t i = 0; i < l->n; i++)
        total += pw_numel(&l->v[i]);
    for (size_t i = 0; !err && i < l->n; i++) {
        const pw_tensor_t *t = &l->v[i];
        float             *x = malloc((size_t)pw_numel(t) * sizeof *x);
        if (!x) {
            err = SVC_ERR_NOMEM;
            break;
        }
        if (fill)
            err = fill->fn(t, x, fill->user, c->errstr, c->errstr_size);
        else
            pw_gen_f32(c, t, x);
        if (!err)
            err = eng_q4nx_writer_add(w, t->name, t->rank, t->dims, x, ENG_Q4NX_AUTO, c->errstr,
                                      c->errstr_size);
        free(x);
        /* in BF16 bytes, as the safetensors writer reports, every 5% */
        uint64_t before = done * 20 / (total ? total : 1);
        done += pw_numel(t);
        if (progress && c->opts->progress &&
            (done * 20 / (total ? total : 1) != before || done == total))
            c->opts->progress(2 * done, 2 * total, c->opts->progress_user);
    }
    return err;
}

svc_err_t pw_q4nx_finish(const pw_ctx_t *c, eng_q4nx_writer_t *w, const char *file) {
    char *path = eng_path_join(c->opts->out_dir, file);
    if (!path)
        return SVC_ERR_NOMEM;
    svc_err_t err = eng_q4nx_writer_finish(w, path, c->errstr, c->errstr_size);
    free(path);
    return err;
}

svc_err_t pw_q4nx_write_list(const pw_ctx_t *c, eng_q4nx_writer_t *w, const pw_list_t *l,
                             const char *file, bool progress) {
    svc_err_t err = pw_q4nx_add_list(c, w, l, NULL, progress);
    return err ? err : pw_q4nx_finish(c, w, file);
}

bool eng_make_tiles_parse(const char *s, eng_make_tiles_t *out) {
    static const char *const names[] = {"q4_k", "q4_1", "q4_0"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (eng_make_tiles_t)i;
            return true;
        }
    return false;
}

/* The writer's layout for opts->q4nx. */
static eng_q4nx_wlayout_t q4nx_layout(const eng_make_q4nx_t *o) {
    static const eng_q4nx_kind_t kinds[] = {ENG_Q4NX_Q4_K, ENG_Q4NX_Q4_1, ENG_Q4NX_Q4_0};
    eng_q4nx_kind_t              proj = kinds[o->tiles];
    return (eng_q4nx_wlayout_t){proj, o->alpha_tiles ? proj : ENG_Q4NX_Q8,
                                o->raster_a ? ENG_Q4NX_RASTER_A : ENG_Q4NX_RASTER_B, o->embed_bf16};
}

/* model.q4nx, tensor by tensor. */
static svc_err_t write_q4nx(const pw_ctx_t *c) {
    pw_list_t          l = {0};
    eng_q4nx_writer_t *w = NULL;
    eng_q4nx_wlayout_t lay = q4nx_layout(&c->opts->q4nx);
    svc_err_t          err = pw_tensors(c->shape, c->vocab, &l);
    if (!err)
        err = eng_q4nx_writer_new(c->shape->head_dim, &w);
    if (!err && eng_q4nx_writer_set_layout(w, &lay)) {
        svc_errf(c->errstr, c->errstr_size, "model.q4nx: layout refused by the writer");
        err = SVC_ERR_INVALID;
    }
    if (!err)
        err = pw_q4nx_write_list(c, w, &l, "model.q4nx", true);
    eng_q4nx_writer_free(w);
    free(l.v);
    return err;
}

svc_err_t pw_sha256sum(const pw_ctx_t *c, const char *const *files, size_t n) {
    svc_buf_t b;
    svc_buf_init(&b, 1 << 16);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; !err && i < n; i++) {
        char  hex[ENG_SHA256_HEX + 1];
        char *path = eng_path_join(c->opts->out_dir, files[i]);
        err = path ? eng_sha256_file(path, hex, NULL, c->errstr, c->errstr_size) : SVC_ERR_NOMEM;
        free(path);
        if (!err)
            err = svc_buf_addf(&b, "%s  %s\n", hex, files[i]);
    }
    if (!err)
        err = pw_write_file(c, "MANIFEST.sha256", b.data, b.len);
    svc_buf_fini(&b);
    return err;
}

/* ---- the twin ---- */

/* The two files the twin reads from. */
typedef struct twin_src {
    eng_q4nx_t *text, *vision;
} twin_src_t;

static svc_err_t fill_q4nx(const pw_tensor_t *t, float *out, void *user, char *errstr,
                           size_t errstr_size) {
    const twin_src_t *s = user;
    return eng_q4nx_tensor_f32(eng_q4nx_vision_name(t->name) ? s->vision : s->text, t->name,
                               t->rank, t->dims, out, errstr, errstr_size);
}

/* vision_weight.q4nx of dir, with the tile sizes of dir/config.json. */
static svc_err_t open_vision(const pw_ctx_t *c, const char *dir, eng_q4nx_t **out) {
    char        *vpath = eng_path_join(dir, "vision_weight.q4nx");
    char        *cpath = eng_path_join(dir, "config.json");
    json_error_t jerr;
    json_t      *cfg = cpath ? json_load_file(cpath, 0, &jerr) : NULL;
    size_t       mm_n = 0, mm_k = 0;
    svc_err_t    err = vpath && cpath ? SVC_OK : SVC_ERR_NOMEM;
    if (!err && !cfg) {
        svc_errf(c->errstr, c->errstr_size, "config.json \"%s\": %s", cpath, jerr.text);
        err = SVC_ERR_FORMAT;
    }
    if (!err)
        err = eng_q4nx_vision_tiles_from_config(json_object_get(cfg, "vision_config"), &mm_n, &mm_k,
                                                c->errstr, c->errstr_size);
    if (!err)
        err = eng_q4nx_open(vpath, out, c->errstr, c->errstr_size);
    if (!err)
        err = eng_q4nx_set_vision_tiles(*out, mm_n, mm_k, c->errstr, c->errstr_size);
    json_decref(cfg);
    free(vpath);
    free(cpath);
    return err;
}

/* An upstream package in opts->twin_dir: the same tokenizer (written or
 * copied again, byte for byte), codes, readout and decision config; its
 * model.safetensors from model.q4nx. */
static svc_err_t write_twin(const pw_ctx_t *c) {
    eng_make_opts_t o = *c->opts;
    o.out_dir = c->opts->twin_dir;
    o.twin_dir = NULL;
    o.format = ENG_MAKE_SAFETENSORS;
    o.progress = NULL;
    pw_ctx_t   t = {.opts = &o,
                    .shape = c->shape,
                    .twin_of = c->opts->out_dir,
                    .errstr = c->errstr,
                    .errstr_size = c->errstr_size};
    char      *qpath = eng_path_join(c->opts->out_dir, "model.q4nx");
    twin_src_t src = {NULL, NULL};
    pw_list_t  l = {0};
    svc_err_t  err = qpath ? pw_mkdirs(o.out_dir, c->errstr, c->errstr_size) : SVC_ERR_NOMEM;
    if (!err)
        err = pw_tokenizer(&t);
    t.vocab = c->vocab;
    if (!err && eng_tokenizer_n_ids(t.tok) != eng_tokenizer_n_ids(c->tok)) {
        svc_errf(c->errstr, c->errstr_size, "twin \"%s\": its tokenizer differs from the package's",
                 o.out_dir);
        err = SVC_ERR_INTERNAL;
    }
    if (!err)
        err = eng_q4nx_open(qpath, &src.text, c->errstr, c->errstr_size);
    if (!err)
        err = open_vision(c, c->opts->out_dir, &src.vision);
    if (!err)
        err = pw_tensors(c->shape, c->vocab, &l);
    if (!err)
        err = pw_vision_tensors(pw_vision_get(c->opts->size), &l);
    if (!err) {
        pw_fill_t fill = {fill_q4nx, &src};
        err = pw_st_write(&t, "model.safetensors", l.v, l.n, true, 1.0, &fill);
    }
    if (!err)
        err = pw_readout(&t);
    if (!err)
        err = pw_meta(&t);
    if (!err)
        err = pw_manifest(&t);
    free(l.v);
    eng_q4nx_close(src.text);
    eng_q4nx_close(src.vision);
    eng_tokenizer_free(t.tok);
    free(qpath);
    return err;
}

svc_err_t pw_q4nx_package(pw_ctx_t *c) {
    svc_err_t err = write_q4nx(c);
    if (!err)
        err = pw_vision_q4nx(c);
    if (!err)
        err = pw_readout(c);
    if (!err)
        err = pw_meta(c);
    if (!err)
        err = pw_sha256sum(c, Q4NX_FILES, sizeof Q4NX_FILES / sizeof Q4NX_FILES[0]);
    if (!err && c->opts->twin_dir)
        err = write_twin(c);
    return err;
}
