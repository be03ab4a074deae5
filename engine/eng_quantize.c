/*
 * eng_quantize.c -- `d3stream quantize` (engine.h eng_quantize,
 * docs/quantize.md): an upstream BF16 package to a D3-Nano-NPU2-style q4nx
 * package.
 *
 * The output is what make-package --format q4nx writes, from a real
 * package's values instead of seeded ones, through the same pieces
 * (eng_pkgwrite_*.c): the tensor list of the package's shape (pw_tensors,
 * its own layer kinds), the Q4NX writer with the official Gen-B layout (or
 * Gen-A's), FastFlowLM's flattened config.json (pw_flm_config, from the
 * package's own text_config), vision_weight.q4nx when it has a vision
 * tower (pw_vision_config_flm of its own vision_config), and
 * MANIFEST.sha256 (pw_sha256sum). Every other file of the package (the
 * tokenizer files, readout.safetensors, decision_config.json,
 * chat_template.jinja, the processor configs, licences...) is copied byte
 * for byte; its BF16 weights, MODEL_MANIFEST.json (whose identity covers
 * them), README.md and golden.json (both about the BF16 weights) are not.
 *
 * RTN streams the tensors one at a time; GPTQ runs the calibration
 * prompts through the package's fp32 layers one layer at a time and
 * rounds each layer's projections as soon as its inputs are seen
 * (eng_quant_gptq.c).
 */
#include "eng_manifest_int.h"
#include "eng_q4nx_int.h"
#include "eng_quant_int.h"
#include "eng_st_int.h"
#include "eng_vision_int.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>

void qz_log(const qz_t *q, const char *fmt, ...) {
    if (!q->o->log)
        return;
    char    line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    q->o->log(q->o->log_user, line);
}

double qz_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

svc_err_t qz_fill(const pw_tensor_t *t, float *out, void *user, char *errstr, size_t n) {
    qz_t *q = user;
    bool  vision = strncmp(t->name, PW_VISION_PREFIX, strlen(PW_VISION_PREFIX)) == 0;
    return eng_ref_take(q->src, vision,
                        t->name + strlen(vision ? PW_VISION_PREFIX : PW_TEXT_PREFIX), t->rank,
                        t->dims, out, errstr, n);
}

svc_err_t qz_sublist(const pw_list_t *l, const char *prefix, bool match, pw_list_t *sub) {
    size_t n = strlen(prefix);
    memset(sub, 0, sizeof *sub);
    sub->v = malloc((l->n ? l->n : 1) * sizeof *sub->v);
    if (!sub->v)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < l->n; i++)
        if ((strncmp(l->v[i].name, prefix, n) == 0) == match)
            sub->v[sub->n++] = l->v[i];
    sub->cap = l->n;
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * The source
 * --------------------------------------------------------------------- */

/* pw_shape_t of the loaded config (the fields pw_tensors reads). */
static svc_err_t qz_shape(qz_t *q) {
    const eng_model_cfg_t *c = &q->shell->cfg;
    if (!c->attn_gate) {
        svc_errf(q->errstr, q->errstr_size,
                 "config.json of \"%s\": attn_output_gate false; Q4NX's q_proj regroup "
                 "(Q4NX.md §2.2) needs the gate",
                 q->o->model_dir);
        return SVC_ERR_INVALID;
    }
    q->full = malloc((c->n_layers ? c->n_layers : 1) * sizeof *q->full);
    if (!q->full)
        return SVC_ERR_NOMEM;
    for (size_t i = 0; i < c->n_layers; i++)
        q->full[i] = c->kinds[i] == ENG_LAYER_FULL;
    q->shape = (pw_shape_t){.name = "quantized",
                            .real = q->o->model_dir,
                            .hidden = c->hidden,
                            .n_layers = c->n_layers,
                            .inter = c->inter,
                            .n_heads = c->n_heads,
                            .n_kv = c->n_kv,
                            .head_dim = c->head_dim,
                            .lin_nk = c->lin_nk,
                            .lin_nv = c->lin_nv,
                            .lin_dk = c->lin_dk,
                            .lin_dv = c->lin_dv,
                            .conv_k = c->conv_k,
                            .vocab = c->vocab,
                            .full = q->full};
    return pw_tensors(&q->shape, c->vocab, &q->text);
}

/* The vision tower, when the package has one as eng_model_load would load
 * it (tensors, vision_config, preprocessor_config.json), in the FastFlowLM
 * keys' terms: refused when its config says what those keys cannot. */
static svc_err_t qz_vision(qz_t *q) {
    eng_vis_cfg_t vc;
    bool          present = false;
    if (!eng_ref_prefix(q->src, true) ||
        !eng_dir_has_file(q->o->model_dir, "preprocessor_config.json"))
        return SVC_OK;
    svc_err_t err = eng_vis_cfg_load(q->o->model_dir, q->shell->cfg.hidden, &vc, &present,
                                     q->errstr, q->errstr_size);
    if (err || !present)
        return err;
    if (!vc.act_tanh || vc.theta != 10000.0f || vc.eps != 1e-6f) {
        svc_errf(q->errstr, q->errstr_size,
                 "config.json of \"%s\": a vision tower with gelu (erf), rope theta %g or "
                 "LayerNorm eps %g; FastFlowLM's vision_config keys (Q4NX.md §6) hold only "
                 "gelu_pytorch_tanh, 10000 and 1e-6",
                 q->o->model_dir, (double)vc.theta, (double)vc.eps);
        return SVC_ERR_INVALID;
    }
    q->vis = (pw_vision_t){vc.depth,
                           vc.hidden,
                           vc.heads,
                           vc.inter,
                           vc.patch,
                           vc.temporal,
                           vc.merge,
                           vc.in_ch,
                           vc.out_hidden,
                           vc.n_pos,
                           "gelu_pytorch_tanh",
                           ENG_Q4NX_VISION_MM_N,
                           ENG_Q4NX_VISION_MM_K};
    q->has_vision = true;
    return pw_vision_tensors(&q->vis, &q->vision);
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(((const pw_tensor_t *)a)->name, ((const pw_tensor_t *)b)->name);
}

/* Whether l (sorted) holds prefix + suffix. */
static bool listed(const pw_list_t *l, const char *prefix, const char *suffix) {
    pw_tensor_t key;
    if (snprintf(key.name, sizeof key.name, "%s%s", prefix, suffix) >= (int)sizeof key.name)
        return false;
    return l->n && bsearch(&key, l->v, l->n, sizeof *l->v, name_cmp) != NULL;
}

/* Every tensor of the source goes somewhere: one this writer does not
 * know (a layer past num_hidden_layers, an MTP head...) is refused rather
 * than dropped. Vision tensors are dropped, and said so, when the package
 * has no usable tower (eng_model_load ignores them too). */
static svc_err_t qz_complete(qz_t *q) {
    const eng_st_set_t *set = eng_ref_set(q->src);
    const char         *tp = eng_ref_prefix(q->src, false), *vp = eng_ref_prefix(q->src, true);
    size_t              unused_vision = 0;
    for (size_t i = 0; i < eng_st_set_count(set); i++) {
        const char *name = eng_st_set_at(set, i)->name;
        bool        ok;
        if (vp && strncmp(name, vp, strlen(vp)) == 0) {
            if (!q->has_vision) {
                unused_vision++;
                continue;
            }
            ok = listed(&q->vision, PW_VISION_PREFIX, name + strlen(vp));
        } else
            ok = strncmp(name, tp, strlen(tp)) == 0 &&
                 listed(&q->text, PW_TEXT_PREFIX, name + strlen(tp));
        if (!ok) {
            svc_errf(q->errstr, q->errstr_size,
                     "%s \"%s\": tensor \"%s\" is not one of the Qwen3.5 tower's that model.q4nx "
                     "and vision_weight.q4nx hold",
                     eng_st_set_file(set), eng_st_set_path(set), name);
            return SVC_ERR_INVALID;
        }
    }
    if (unused_vision)
        qz_log(q,
               "%zu vision tensors not written: the package has no vision_config or "
               "preprocessor_config.json",
               unused_vision);
    return SVC_OK;
}

static svc_err_t qz_open(qz_t *q) {
    char     *cpath = eng_path_join(q->o->model_dir, "config.json");
    svc_err_t err = cpath ? SVC_OK : SVC_ERR_NOMEM;
    if (!err)
        err = eng_package_open(q->o->model_dir, &q->pkg, q->errstr, q->errstr_size);
    if (!err)
        err = eng_model_load_shell(q->o->model_dir, &q->shell, q->errstr, q->errstr_size);
    if (!err)
        err = eng_ref_open(q->o->model_dir, NULL, &q->src, q->errstr, q->errstr_size);
    json_error_t jerr;
    if (!err && !(q->cfg = json_load_file(cpath, 0, &jerr))) {
        svc_errf(q->errstr, q->errstr_size, "config.json \"%s\": %s", cpath, jerr.text);
        err = SVC_ERR_FORMAT;
    }
    if (!err && !json_is_object(json_object_get(q->cfg, "text_config"))) {
        svc_errf(q->errstr, q->errstr_size,
                 "config.json \"%s\": no text_config object (an upstream package's layout, "
                 "SPEC e.1)",
                 cpath);
        err = SVC_ERR_FORMAT;
    }
    free(cpath);
    if (!err)
        err = qz_shape(q);
    if (!err)
        err = qz_vision(q);
    return err ? err : qz_complete(q);
}

/* ---------------------------------------------------------------------
 * The files written
 * --------------------------------------------------------------------- */

static svc_err_t qz_writer(const qz_t *q, eng_q4nx_writer_t **w) {
    svc_err_t err = eng_q4nx_writer_new(q->shell->cfg.head_dim, w);
    if (err || !q->o->gen_a)
        return err;
    eng_q4nx_wlayout_t lay = {ENG_Q4NX_Q4_1, ENG_Q4NX_Q8, ENG_Q4NX_RASTER_A, true};
    return eng_q4nx_writer_set_layout(*w, &lay);
}

static svc_err_t qz_model_q4nx(qz_t *q) {
    eng_q4nx_writer_t *w = NULL;
    double             t0 = qz_now();
    svc_err_t          err = qz_writer(q, &w);
    if (!err && q->o->method == ENG_QUANT_GPTQ)
        err = qz_gptq_text(q, w);
    else if (!err) {
        pw_fill_t fill = {qz_fill, q};
        err = pw_q4nx_add_list(&q->pc, w, &q->text, &fill, false);
    }
    if (!err)
        err = pw_q4nx_finish(&q->pc, w, "model.q4nx");
    eng_q4nx_writer_free(w);
    if (!err)
        qz_log(q, "model.q4nx written (%zu tensors of the text tower, %.1f s)", q->text.n,
               qz_now() - t0);
    return err;
}

static svc_err_t qz_vision_q4nx(qz_t *q) {
    eng_q4nx_writer_t *w = NULL;
    svc_err_t          err = eng_q4nx_writer_new(q->shell->cfg.head_dim, &w);
    if (!err)
        err = eng_q4nx_writer_set_vision_tiles(w, q->vis.mm_n, q->vis.mm_k);
    pw_fill_t fill = {qz_fill, q};
    if (!err)
        err = pw_q4nx_add_list(&q->pc, w, &q->vision, &fill, false);
    if (!err)
        err = pw_q4nx_finish(&q->pc, w, "vision_weight.q4nx");
    eng_q4nx_writer_free(w);
    if (!err)
        qz_log(q, "vision_weight.q4nx written (%zu tensors, BF16)", q->vision.n);
    return err;
}

/* FastFlowLM's config.json from the package's own: its text_config
 * flattened, FLM's keys, the special token ids. */
static svc_err_t qz_config(qz_t *q) {
    static const char *const ids[] = {"image_token_id", "video_token_id", "vision_start_token_id",
                                      "vision_end_token_id"};
    json_t *root = pw_flm_config(json_deep_copy(json_object_get(q->cfg, "text_config")),
                                 q->has_vision ? pw_vision_config_flm(&q->vis) : NULL);
    for (size_t i = 0; root && i < sizeof ids / sizeof ids[0]; i++) {
        json_t *v = json_object_get(q->cfg, ids[i]);
        if (v && json_object_set(root, ids[i], v)) {
            json_decref(root);
            root = NULL;
        }
    }
    svc_err_t err =
        root ? pw_write_json(&q->pc, "config.json", root, JSON_SORT_KEYS) : SVC_ERR_NOMEM;
    json_decref(root);
    return err;
}

/* Files of the source not copied: its weights, and what describes them. */
static bool qz_not_copied(const char *name) {
    static const char *const skip[] = {
        "config.json", "README.md",  "MODEL_MANIFEST.json", "MANIFEST.sha256",
        "golden.json", "model.q4nx", "vision_weight.q4nx",  "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (strcmp(name, skip[i]) == 0)
            return true;
    size_t n = strlen(name), s = strlen(".safetensors");
    return n > s && strcmp(name + n - s, ".safetensors") == 0 &&
           strcmp(name, "readout.safetensors") != 0;
}

static svc_err_t qz_copy_file(const qz_t *q, const char *name) {
    char     *src = eng_path_join(q->o->model_dir, name);
    char     *dst = eng_path_join(q->o->out_dir, name);
    FILE     *in = src ? fopen(src, "rb") : NULL;
    FILE     *out = in && dst ? fopen(dst, "wb") : NULL;
    svc_err_t err = src && dst ? SVC_OK : SVC_ERR_NOMEM;
    if (!err && (!in || !out)) {
        svc_errf(q->errstr, q->errstr_size, "open() \"%s\" failed: %s", in ? dst : src,
                 strerror(errno));
        err = SVC_ERR_IO;
    }
    char   buf[1 << 16];
    size_t k;
    while (!err && (k = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, k, out) != k) {
            svc_errf(q->errstr, q->errstr_size, "write() \"%s\" failed: %s", dst, strerror(errno));
            err = SVC_ERR_IO;
        }
    if (!err && ferror(in)) {
        svc_errf(q->errstr, q->errstr_size, "read() \"%s\" failed", src);
        err = SVC_ERR_IO;
    }
    if (in)
        fclose(in);
    if (out && fclose(out) && !err) {
        svc_errf(q->errstr, q->errstr_size, "close() \"%s\" failed: %s", dst, strerror(errno));
        err = SVC_ERR_IO;
    }
    free(src);
    free(dst);
    return err;
}

typedef struct qz_names {
    char **v;
    size_t n, cap;
} qz_names_t;

static svc_err_t names_add(qz_names_t *s, const char *name) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n] = strdup(name);
    if (!s->v[s->n])
        return SVC_ERR_NOMEM;
    s->n++;
    return SVC_OK;
}

static void names_free(qz_names_t *s) {
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Copies the source's other regular files into out_dir; names them in s. */
static svc_err_t qz_copy_files(qz_t *q, qz_names_t *s) {
    DIR *d = opendir(q->o->model_dir);
    if (!d) {
        svc_errf(q->errstr, q->errstr_size, "opendir() \"%s\" failed: %s", q->o->model_dir,
                 strerror(errno));
        return SVC_ERR_IO;
    }
    svc_err_t      err = SVC_OK;
    struct dirent *de;
    while (!err && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || qz_not_copied(de->d_name) ||
            !eng_dir_has_file(q->o->model_dir, de->d_name))
            continue;
        err = qz_copy_file(q, de->d_name);
        if (!err)
            err = names_add(s, de->d_name);
    }
    closedir(d);
    return err;
}

static svc_err_t qz_readme(qz_t *q) {
    const eng_quant_opts_t *o = q->o;
    svc_buf_t               b;
    svc_buf_init(&b, 1 << 16);
    char how[400];
    if (o->method == ENG_QUANT_GPTQ)
        snprintf(how, sizeof how,
                 "GPTQ-calibrated rounding (dampening %g, %s, %s %s grids) on %zu calibration "
                 "prompts of %llu tokens (%s)",
                 o->damp > 0 ? o->damp : ENG_QUANT_DAMP,
                 !o->no_act_order ? "act-order" : "columns in order",
                 !o->no_act_order || o->static_groups ? "static" : "dynamic",
                 o->plain_grids ? "plain" : "importance-fitted", q->calib_prompts,
                 (unsigned long long)q->calib_tokens,
                 o->calib_file ? "a file of requests"
                               : "System One requests generated by d3stream");
    else
        snprintf(how, sizeof how, "rounding to nearest");
    svc_err_t err = svc_buf_addf(
        &b,
        "# %s, quantised by d3stream\n\n"
        "Written by `d3stream quantize` from the upstream package \"%s\".\n\n"
        "- `model.q4nx`: its text tower in FastFlowLM's Q4NX container, %s: every projection\n"
        "  %s with %s; alpha, beta and out_proj Q8; the token embedding Q8 as the tied\n"
        "  lm_head%s; norms, conv1d, A_log and dt_bias unquantised (BF16, F32).\n"
        "%s"
        "- `config.json`: FastFlowLM's layout (the text_config flattened).\n"
        "- Every other file is the upstream package's, byte for byte; its BF16 weights,\n"
        "  MODEL_MANIFEST.json and README.md are not carried over.\n"
        "- `MANIFEST.sha256` (sha256sum format) lists every file.\n",
        eng_package_model_id(q->pkg), o->model_dir,
        o->gen_a ? "Gen-A (Q4_1 era)" : "Gen-B (Q4_K era)", o->gen_a ? "Q4_1" : "Q4_K", how,
        o->gen_a ? ", and the BF16 embedding beside it" : "",
        q->has_vision ? "- `vision_weight.q4nx`: the vision tower, BF16 (Q4NX.md §2.7), its matmul "
                        "weights in\n  FastFlowLM's 64 x 512 blocks.\n"
                      : "");
    if (!err)
        err = pw_write_file(&q->pc, "README.md", b.data, b.len);
    svc_buf_fini(&b);
    return err;
}

/* out_dir made, and not model_dir however spelt. */
static svc_err_t qz_out_dir(qz_t *q) {
    svc_err_t err = pw_mkdirs(q->o->out_dir, q->errstr, q->errstr_size);
    if (err)
        return err;
    struct stat a, b;
    if (stat(q->o->out_dir, &a) != 0 || stat(q->o->model_dir, &b) != 0) {
        svc_errf(q->errstr, q->errstr_size, "stat() of \"%s\" or \"%s\" failed: %s", q->o->out_dir,
                 q->o->model_dir, strerror(errno));
        return SVC_ERR_IO;
    }
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        svc_errf(q->errstr, q->errstr_size, "the output \"%s\" is the package's own directory",
                 q->o->out_dir);
        return SVC_ERR_INVALID;
    }
    return SVC_OK;
}

static svc_err_t qz_write(qz_t *q) {
    qz_names_t s = {0};
    svc_err_t  err = qz_out_dir(q);
    if (!err)
        err = qz_ckpt_open(q);
    if (!err)
        err = qz_model_q4nx(q);
    if (!err && q->has_vision)
        err = qz_vision_q4nx(q);
    if (!err)
        err = qz_config(q);
    if (!err)
        err = qz_readme(q);
    if (!err)
        err = qz_copy_files(q, &s);
    /* ours, the vision file last: only with a tower */
    const char *ours[] = {"model.q4nx", "config.json", "README.md", "vision_weight.q4nx"};
    for (size_t i = 0; !err && i < (q->has_vision ? 4u : 3u); i++)
        err = names_add(&s, ours[i]);
    if (!err) {
        qsort(s.v, s.n, sizeof *s.v, str_cmp);
        err = pw_sha256sum(&q->pc, (const char *const *)s.v, s.n);
    }
    if (!err) /* complete: the checkpoints are not needed any more */
        err = qz_ckpt_finish(q);
    names_free(&s);
    return err;
}

svc_err_t eng_quantize(const eng_quant_opts_t *opts, char *errstr, size_t errstr_size) {
    if (errstr_size)
        errstr[0] = '\0';
    qz_t q = {.o = opts, .errstr = errstr, .errstr_size = errstr_size};
    q.mo = (eng_make_opts_t){.out_dir = opts->out_dir, .format = ENG_MAKE_Q4NX};
    q.pc = (pw_ctx_t){.opts = &q.mo, .errstr = errstr, .errstr_size = errstr_size};
    svc_err_t err = qz_open(&q);
    if (!err)
        q.pc.shape = &q.shape;
    if (!err)
        err = qz_write(&q);
    if (err == SVC_ERR_NOMEM && errstr_size && !errstr[0])
        svc_errf(errstr, errstr_size, "out of memory quantising \"%s\"", opts->model_dir);
    free(q.text.v);
    free(q.vision.v);
    free(q.full);
    qz_ckpt_free(q.ck);
    json_decref(q.cfg);
    eng_ref_close(q.src);
    eng_model_free(q.shell);
    eng_package_free(q.pkg);
    return err;
}
