/*
 * ops_inspect.c -- `d3stream inspect`: what a package is (format,
 * architecture, parameters, readout, limits) and whether its files are the
 * ones its manifest lists.
 *
 * Everything is gathered into one JSON object first; --json prints it and
 * the text form is written from it, so the two never disagree.
 */
#include "ops_int.h"

#include "eng_manifest_int.h"
#include "eng_q4nx_int.h"

#include <getopt.h>
#include <jansson.h>

static const char INSPECT_HELP[] =
    "Usage: d3stream inspect --model DIR [--json] [--q4nx-layout S]\n"
    "\n"
    "Describes the package in DIR and checks it:\n"
    "  format          upstream safetensors (model.safetensors, or\n"
    "                  model.safetensors.index.json and its shards), or q4nx\n"
    "                  (model.q4nx, FastFlowLM's container: its generation, A or B,\n"
    "                  how many tensors of each storage kind it holds -- q4_0 for\n"
    "                  Q4_1 tiles holding a Q4_0 source's signed codes -- and the\n"
    "                  code order, A or B, of its Q4_1/Q4_0 (q4) and Q8 (q8) tiles\n"
    "                  with the evidence in the file that settled it)\n"
    "  architecture    hidden size, layers and their kinds (L = Gated DeltaNet,\n"
    "                  F = full attention), heads, kv heads, head dims, DeltaNet\n"
    "                  heads, intermediate size, vocabulary, rope theta and\n"
    "                  partial rotary factor (from config.json: text_config, or\n"
    "                  FastFlowLM's flattened layout)\n"
    "  parameters      text (elements of the loaded text-tower tensors), readout\n"
    "                  (255 x hidden), compared with MODEL_MANIFEST.json parameters\n"
    "  readout         the answer codes (count and the first few), temperature,\n"
    "                  attention mode, max length\n"
    "  chat template   its sha256 against the pinned ones (SPEC e.5); an unpinned\n"
    "                  template is reported, not a failure: it is never executed\n"
    "  manifest        every file of MODEL_MANIFEST.json (else MANIFEST.sha256):\n"
    "                  ok, MISMATCH (expected vs actual sha256), missing, size,\n"
    "                  unlisted; and the identity hash (SPEC e.3, e.4)\n"
    "\n"
    "  --json              print the same as one JSON object\n" OPS_Q4NX_LAYOUT_HELP "\n"
    "Exit status: 0 everything verifies; 1 a file fails the manifest (it is named),\n"
    "the parameter counts differ from it, or there is no manifest; 2 usage; 3 the\n"
    "package cannot be read (1 instead when the manifest fails too: it names why).\n";

#define N_CODES_SHOWN 8

typedef struct insp {
    const char            *dir;
    const eng_load_opts_t *load; /* --q4nx-layout */
    json_t                *root;
    bool                   manifest_bad; /* a manifest that fails: exit 1, first */
    bool                   no_manifest;  /* exit 1, unless unreadable */
    bool                   params_bad;   /* exit 1 */
    bool                   unreadable;   /* exit 3 */
} insp_t;

/* json_object_set_new that tolerates a NULL value (out of memory): the key
 * is then absent, which the printers treat as unknown. */
static void put(json_t *obj, const char *key, json_t *val) {
    if (val)
        json_object_set_new(obj, key, val);
}

static void put_error(insp_t *in, const char *key, const char *msg) {
    put(in->root, key, json_string(msg));
    in->unreadable = true;
}

/* ---------------------------------------------------------------- gather */

/* model.q4nx: generation and tensors per storage kind (Q4NX.md §0.2, §8). */
static void gather_q4nx(insp_t *in, json_t *f) {
    char        path[4096], errstr[1024];
    eng_q4nx_t *q = NULL;
    if (snprintf(path, sizeof path, "%s/model.q4nx", in->dir) >= (int)sizeof path)
        return;
    eng_q4nx_layout_t lay;
    if (eng_q4nx_layout_parse(in->load->q4nx_layout, &lay, errstr, sizeof errstr) ||
        eng_q4nx_open_with(path, &lay, &q, errstr, sizeof errstr)) {
        put_error(in, "model_error", errstr);
        return;
    }
    size_t counts[ENG_Q4NX_KIND_COUNT] = {0};
    for (size_t i = 0; i < eng_q4nx_count(q); i++)
        counts[eng_q4nx_at(q, i)->kind]++;
    json_t *kinds = json_object();
    for (size_t k = 0; k < ENG_Q4NX_KIND_COUNT; k++)
        if (counts[k])
            put(kinds, eng_q4nx_kind_name((eng_q4nx_kind_t)k), json_integer((json_int_t)counts[k]));
    put(f, "generation", json_string(eng_q4nx_generation(q) == ENG_Q4NX_GEN_A ? "A" : "B"));
    put(f, "q8_raster", json_string(eng_q4nx_q8_raster(q) == ENG_Q4NX_RASTER_A ? "A" : "B"));
    static const char *const fam[ENG_Q4NX_FAM_COUNT] = {"q4", "q8"};
    json_t                  *jlay = json_object();
    for (int i = 0; i < ENG_Q4NX_FAM_COUNT; i++) {
        const eng_q4nx_decision_t *d = eng_q4nx_decision(q, (eng_q4nx_family_t)i);
        json_t                    *o = json_object();
        put(o, "raster",
            d->present ? json_string(d->raster == ENG_Q4NX_RASTER_A ? "A" : "B") : json_null());
        put(o, "evidence", json_string(d->how));
        put(jlay, fam[i], o);
    }
    put(f, "layout", jlay);
    put(f, "tensors", json_integer((json_int_t)eng_q4nx_count(q)));
    put(f, "kinds", kinds);
    eng_q4nx_close(q);
}

/* "safetensors", "q4nx" or "unknown". model.safetensors wins when both are
 * there, as in eng_model_load. */
static const char *gather_format(insp_t *in) {
    const char *fmt = "unknown";
    if (ops_is_file(in->dir, "model.safetensors") ||
        ops_is_file(in->dir, "model.safetensors.index.json"))
        fmt = "safetensors";
    else if (ops_is_file(in->dir, "model.q4nx"))
        fmt = "q4nx";
    json_t *f = json_object();
    put(f, "name", json_string(fmt));
    put(f, "supported", json_boolean(fmt[0] != 'u'));
    if (fmt[0] == 'q')
        gather_q4nx(in, f);
    put(in->root, "format", f);
    if (fmt[0] == 'u')
        put_error(in, "model_error", "no model.safetensors (nor model.q4nx) in the package");
    return fmt;
}

static void gather_package(insp_t *in, const eng_package_t *pkg) {
    json_t *codes = json_object(), *first = json_array();
    for (size_t i = 0; i < N_CODES_SHOWN && first; i++)
        json_array_append_new(first, json_string(eng_package_code(pkg, i)));
    put(codes, "count", json_integer(ENG_N_CODES));
    put(codes, "first", first);
    put(in->root, "model_id", json_string(eng_package_model_id(pkg)));
    put(in->root, "readout_codes", codes);
    put(in->root, "temperature", json_real(eng_package_temperature(pkg)));
    put(in->root, "attention_mode",
        json_string(eng_package_noncausal(pkg) ? "noncausal_full_attention" : "causal"));
    put(in->root, "max_length", json_integer((json_int_t)eng_package_max_length(pkg)));
}

/* "LLLFLF": one letter per decoder layer. */
static json_t *layer_kinds(const eng_model_t *m, size_t n) {
    char *s = malloc(n + 1);
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++)
        s[i] = eng_model_layer_is_full(m, i) ? 'F' : 'L';
    s[n] = '\0';
    json_t *j = json_string(s);
    free(s);
    return j;
}

static void gather_architecture(insp_t *in, const eng_model_t *m, const eng_model_info_t *mi) {
    json_t *a = json_object(), *dn = json_object();
    put(a, "hidden_size", json_integer((json_int_t)mi->hidden));
    put(a, "num_layers", json_integer((json_int_t)mi->n_layers));
    put(a, "linear_attention_layers", json_integer((json_int_t)mi->n_linear));
    put(a, "full_attention_layers", json_integer((json_int_t)mi->n_full));
    put(a, "layer_kinds", layer_kinds(m, mi->n_layers));
    put(a, "attention_heads", json_integer((json_int_t)mi->n_heads));
    put(a, "kv_heads", json_integer((json_int_t)mi->n_kv));
    put(a, "head_dim", json_integer((json_int_t)mi->head_dim));
    put(a, "attn_output_gate", json_boolean(mi->attn_gate));
    put(a, "rope_theta", json_real(mi->rope_theta));
    put(a, "partial_rotary_factor", json_real(mi->partial_rotary));
    put(a, "rotary_dim", json_integer((json_int_t)mi->rot_dim));
    put(dn, "key_heads", json_integer((json_int_t)mi->lin_nk));
    put(dn, "value_heads", json_integer((json_int_t)mi->lin_nv));
    put(dn, "key_head_dim", json_integer((json_int_t)mi->lin_dk));
    put(dn, "value_head_dim", json_integer((json_int_t)mi->lin_dv));
    put(dn, "conv_kernel", json_integer((json_int_t)mi->conv_k));
    put(a, "deltanet", dn);
    put(a, "intermediate_size", json_integer((json_int_t)mi->inter));
    put(a, "vocab_size", json_integer((json_int_t)mi->vocab));
    put(a, "rms_norm_eps", json_real(mi->rms_eps));
    if (mi->vis_depth) {
        json_t *v = json_object();
        put(v, "depth", json_integer((json_int_t)mi->vis_depth));
        put(v, "hidden_size", json_integer((json_int_t)mi->vis_hidden));
        put(v, "heads", json_integer((json_int_t)mi->vis_heads));
        put(v, "intermediate_size", json_integer((json_int_t)mi->vis_inter));
        put(v, "patch_size", json_integer((json_int_t)mi->vis_patch));
        put(v, "merge_size", json_integer((json_int_t)mi->vis_merge));
        put(v, "position_embeddings", json_integer((json_int_t)mi->vis_n_pos));
        put(a, "vision", v);
    }
    put(in->root, "architecture", a);
}

/* MODEL_MANIFEST.json parameters (SPEC e.3), when the manifest has them,
 * judged by the same check `ask` refuses a package on. */
static void gather_params_manifest(insp_t *in, json_t *p, const eng_model_t *m) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/" OPS_MF_JSON, in->dir) >= (int)sizeof path)
        return;
    json_t       *mf = json_load_file(path, 0, NULL);
    const json_t *mp = json_object_get(mf, "parameters");
    if (json_is_object(mp)) {
        char    errstr[512];
        bool    ok = eng_model_check_parameters(m, in->dir, errstr, sizeof errstr) == SVC_OK;
        json_t *copy = json_deep_copy(mp);
        put(copy, "ok", json_boolean(ok));
        put(p, "manifest", copy);
        in->params_bad = !ok;
    }
    json_decref(mf);
}

static void gather_params(insp_t *in, const eng_model_t *m, const eng_model_info_t *mi) {
    json_t *p = json_object();
    put(p, "text", json_integer((json_int_t)mi->n_params_text));
    put(p, "readout", json_integer((json_int_t)mi->n_params_readout));
    put(p, "vision", json_integer((json_int_t)mi->n_params_vision));
    put(p, "loaded",
        json_integer((json_int_t)(mi->n_params_text + mi->n_params_readout + mi->n_params_vision)));
    gather_params_manifest(in, p, m);
    put(in->root, "parameters", p);
}

static void gather_model(insp_t *in) {
    char         errstr[1024];
    eng_model_t *m = NULL;
    if (eng_model_load_with(in->dir, in->load, &m, errstr, sizeof errstr)) {
        put_error(in, "model_error", errstr);
        return;
    }
    eng_model_info_t mi;
    eng_model_get_info(m, &mi);
    put(json_object_get(in->root, "format"), "loaded_as", json_string(eng_model_format(m)));
    gather_architecture(in, m, &mi);
    gather_params(in, m, &mi);
    eng_model_free(m);
}

static void gather_chat_template(insp_t *in) {
    static const char *const names[] = {"pinned", "unpinned", "missing"};
    eng_chat_template_t      verdict;
    char                     sha[ENG_SHA256_HEX + 1], errstr[512];
    json_t                  *ct = json_object();
    if (eng_chat_template_check(in->dir, &verdict, sha, errstr, sizeof errstr)) {
        put(ct, "verdict", json_string("unreadable"));
        put(ct, "error", json_string(errstr));
        in->unreadable = true;
    } else {
        put(ct, "verdict", json_string(names[verdict]));
        put(ct, "sha256", sha[0] ? json_string(sha) : json_null());
    }
    put(in->root, "chat_template", ct);
}

static json_t *verdict_files(const eng_mf_verdict_t *v) {
    json_t *files = json_array();
    for (size_t i = 0; files && i < v->n; i++) {
        const eng_mf_file_t *f = &v->files[i];
        json_t              *o = json_object();
        put(o, "name", json_string(f->name));
        put(o, "status", json_string(eng_mf_status_name(f->status)));
        put(o, "expected", f->expected[0] ? json_string(f->expected) : json_null());
        put(o, "actual", f->actual[0] ? json_string(f->actual) : json_null());
        if (f->status == ENG_MF_SIZE) {
            put(o, "bytes_expected", json_integer((json_int_t)f->bytes_expected));
            put(o, "bytes", json_integer((json_int_t)f->bytes));
        }
        if (o)
            json_array_append_new(files, o);
    }
    return files;
}

static void gather_manifest(insp_t *in) {
    eng_mf_verdict_t v;
    const char      *which;
    char             errstr[1024] = "";
    eng_mf_verdict_init(&v);
    svc_err_t err = ops_manifest_verify(in->dir, &which, &v, errstr, sizeof errstr);
    json_t   *m = json_object();
    put(m, "file", which ? json_string(which) : json_null());
    put(m, "ok", json_boolean(!err));
    put(m, "message", err ? json_string(v.message[0] ? v.message : errstr) : json_null());
    put(m, "files", verdict_files(&v));
    put(m, "model_sha256", v.model_sha256[0] ? json_string(v.model_sha256) : json_null());
    put(in->root, "manifest", m);
    /* A verdict (bad file, bad manifest, none) is exit 1; a failing read is 3. */
    if (err && !which)
        in->no_manifest = true;
    else if (err == SVC_ERR_INVALID || err == SVC_ERR_FORMAT)
        in->manifest_bad = true;
    else if (err)
        in->unreadable = true;
    eng_mf_verdict_fini(&v);
}

static void gather(insp_t *in) {
    put(in->root, "package", json_string(in->dir));
    const char    *fmt = gather_format(in);
    char           errstr[1024];
    eng_package_t *pkg = NULL;
    if (eng_package_open(in->dir, &pkg, errstr, sizeof errstr))
        put_error(in, "package_error", errstr);
    else
        gather_package(in, pkg);
    eng_package_free(pkg);
    if (fmt[0] != 'u' && !json_object_get(in->root, "model_error"))
        gather_model(in);
    gather_chat_template(in);
    gather_manifest(in);
    put(in->root, "ok",
        json_boolean(!in->manifest_bad && !in->no_manifest && !in->params_bad && !in->unreadable));
}

/* ---------------------------------------------------------------- text */

static json_int_t geti(const json_t *o, const char *key) {
    return json_integer_value(json_object_get(o, key));
}

static const char *gets_(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

static void print_architecture(const json_t *a) {
    const json_t *dn = json_object_get(a, "deltanet");
    printf("architecture   Qwen3.5 text tower\n");
    printf("  hidden size        %lld\n", (long long)geti(a, "hidden_size"));
    printf("  layers             %lld: %lld linear_attention (L), %lld full_attention (F): %s\n",
           (long long)geti(a, "num_layers"), (long long)geti(a, "linear_attention_layers"),
           (long long)geti(a, "full_attention_layers"), gets_(a, "layer_kinds"));
    printf("  attention heads    %lld, kv heads %lld, head dim %lld%s\n",
           (long long)geti(a, "attention_heads"), (long long)geti(a, "kv_heads"),
           (long long)geti(a, "head_dim"),
           json_is_true(json_object_get(a, "attn_output_gate")) ? ", output gate" : "");
    printf("  rope               theta %.10g, partial rotary factor %g (rotary dim %lld)\n",
           json_real_value(json_object_get(a, "rope_theta")),
           json_real_value(json_object_get(a, "partial_rotary_factor")),
           (long long)geti(a, "rotary_dim"));
    printf("  DeltaNet heads     %lld key x %lld, %lld value x %lld, conv kernel %lld\n",
           (long long)geti(dn, "key_heads"), (long long)geti(dn, "key_head_dim"),
           (long long)geti(dn, "value_heads"), (long long)geti(dn, "value_head_dim"),
           (long long)geti(dn, "conv_kernel"));
    printf("  intermediate size  %lld\n", (long long)geti(a, "intermediate_size"));
    printf("  vocab size         %lld\n", (long long)geti(a, "vocab_size"));
    const json_t *v = json_object_get(a, "vision");
    if (v)
        printf("vision tower   %lld blocks, width %lld, %lld heads, MLP %lld, patch %lld, merge "
               "%lld, %lld position embeddings\n",
               (long long)geti(v, "depth"), (long long)geti(v, "hidden_size"),
               (long long)geti(v, "heads"), (long long)geti(v, "intermediate_size"),
               (long long)geti(v, "patch_size"), (long long)geti(v, "merge_size"),
               (long long)geti(v, "position_embeddings"));
    else
        printf("vision tower   none (images are refused)\n");
}

static void print_params(const json_t *p) {
    const json_t *m = json_object_get(p, "manifest");
    printf("parameters     text %lld, readout %lld, vision %lld, loaded %lld\n",
           (long long)geti(p, "text"), (long long)geti(p, "readout"), (long long)geti(p, "vision"),
           (long long)geti(p, "loaded"));
    if (m)
        printf("  manifest         text %lld, vision %lld, readout %lld, loaded %lld: %s\n",
               (long long)geti(m, "text"), (long long)geti(m, "vision"),
               (long long)geti(m, "readout"), (long long)geti(m, "loaded"),
               json_is_true(json_object_get(m, "ok")) ? "ok" : "MISMATCH");
    else
        printf("  manifest         (no parameters listed)\n");
}

static void print_readout(const json_t *root) {
    const json_t *codes = json_object_get(root, "readout_codes");
    const json_t *first = json_object_get(codes, "first");
    printf("readout codes  %lld:", (long long)geti(codes, "count"));
    for (size_t i = 0; i < json_array_size(first); i++)
        printf(" %s", json_string_value(json_array_get(first, i)));
    printf(" ...\n");
    printf("temperature    %g\n", json_real_value(json_object_get(root, "temperature")));
    printf("attention      %s\n", gets_(root, "attention_mode"));
    printf("max length     %lld tokens\n", (long long)geti(root, "max_length"));
}

static void print_chat_template(const json_t *ct) {
    const char *v = gets_(ct, "verdict");
    if (strcmp(v, "pinned") == 0)
        printf("chat template  sha256 %.12s: pinned (SPEC e.5)\n", gets_(ct, "sha256"));
    else if (strcmp(v, "unpinned") == 0)
        printf("chat template  sha256 %.12s: not pinned by SPEC e.5 (accepted with a warning: "
               "never executed)\n",
               gets_(ct, "sha256"));
    else if (strcmp(v, "missing") == 0)
        printf("chat template  missing\n");
    else
        printf("chat template  unreadable: %s\n", gets_(ct, "error"));
}

static void print_file(const json_t *f) {
    const char *st = gets_(f, "status");
    const char *name = gets_(f, "name");
    if (strcmp(st, "ok") == 0)
        printf("  ok        %s\n", name);
    else if (strcmp(st, "mismatch") == 0)
        printf("  MISMATCH  %s: expected %s, actual %s\n", name, gets_(f, "expected"),
               gets_(f, "actual"));
    else if (strcmp(st, "size") == 0)
        printf("  SIZE      %s: expected %lld bytes, actual %lld\n", name,
               (long long)geti(f, "bytes_expected"), (long long)geti(f, "bytes"));
    else if (strcmp(st, "unlisted") == 0)
        printf("  UNLISTED  %s (loaded, but not in the manifest)\n", name);
    else
        printf("  missing   %s\n", name);
}

static void print_manifest(const json_t *m) {
    const json_t *files = json_object_get(m, "files");
    const json_t *file = json_object_get(m, "file");
    bool          ok = json_is_true(json_object_get(m, "ok"));
    printf("manifest       %s: %s\n", json_is_string(file) ? json_string_value(file) : "none",
           ok ? "ok" : "FAILED");
    if (!ok)
        printf("  %s\n", gets_(m, "message"));
    for (size_t i = 0; i < json_array_size(files); i++)
        print_file(json_array_get(files, i));
    if (json_is_string(json_object_get(m, "model_sha256")))
        printf("  identity  model_sha256 %s%s\n", gets_(m, "model_sha256"),
               ok ? " (matches the manifest)" : "");
}

/* "q4nx Gen-B (model.q4nx: 70 tensors, Q4_K 30, Q8 14, BF16 20, F32 6)" */
static void print_q4nx(const json_t *fmt) {
    const json_t *kinds = json_object_get(fmt, "kinds");
    const char   *k;
    const json_t *v;
    printf("format         q4nx Gen-%s (model.q4nx: %lld tensors", gets_(fmt, "generation"),
           (long long)geti(fmt, "tensors"));
    json_object_foreach((json_t *)kinds, k, v) {
        printf(", %s %lld", k, (long long)json_integer_value(v));
    }
    printf(")\n");
    json_object_foreach(json_object_get(fmt, "layout"), k, v) {
        if (json_is_string(json_object_get(v, "raster")))
            printf("  %s order    %s: %s\n", k, gets_(v, "raster"), gets_(v, "evidence"));
    }
}

static void print_text(const json_t *root) {
    const json_t *fmt = json_object_get(root, "format");
    const char   *name = gets_(fmt, "name");
    printf("package        %s\n", gets_(root, "package"));
    if (json_object_get(root, "model_id"))
        printf("model id       %s\n", gets_(root, "model_id"));
    if (strcmp(name, "q4nx") == 0)
        print_q4nx(fmt);
    else
        printf("format         %s\n",
               strcmp(name, "safetensors") == 0 ? "upstream safetensors" : "unknown");
    if (json_object_get(root, "package_error"))
        printf("package        cannot be read: %s\n", gets_(root, "package_error"));
    if (json_object_get(root, "model_error"))
        printf("model          cannot be read: %s\n", gets_(root, "model_error"));
    if (json_object_get(root, "architecture"))
        print_architecture(json_object_get(root, "architecture"));
    if (json_object_get(root, "parameters"))
        print_params(json_object_get(root, "parameters"));
    if (json_object_get(root, "readout_codes"))
        print_readout(root);
    print_chat_template(json_object_get(root, "chat_template"));
    print_manifest(json_object_get(root, "manifest"));
    printf("verdict        %s\n", json_is_true(json_object_get(root, "ok")) ? "ok" : "FAILED");
}

/* ---------------------------------------------------------------- command */

static int inspect_run(const char *dir, const eng_load_opts_t *lo, bool as_json) {
    insp_t in = {.dir = dir, .load = lo, .root = json_object()};
    if (!in.root) {
        ops_fail("inspect", "out of memory");
        return OPS_EXIT_FAILURE;
    }
    gather(&in);
    /* A failing manifest names the file at fault, which explains most
     * unreadable packages, so it decides first. */
    int rc = OPS_EXIT_OK;
    if (in.manifest_bad)
        rc = OPS_EXIT_VERDICT;
    else if (in.unreadable)
        rc = OPS_EXIT_FAILURE;
    else if (in.no_manifest || in.params_bad)
        rc = OPS_EXIT_VERDICT;
    if (as_json) {
        char *s = json_dumps(in.root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (!s || puts(s) == EOF)
            rc = OPS_EXIT_FAILURE;
        free(s);
    } else
        print_text(in.root);
    if (fflush(stdout) == EOF)
        rc = OPS_EXIT_FAILURE;
    json_decref(in.root);
    return rc;
}

int ops_cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"json", no_argument, NULL, 'j'},
        {"q4nx-layout", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char     *dir = NULL;
    bool            as_json = false;
    eng_load_opts_t lo = {0};
    int             c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'j')
            as_json = true;
        else if (c == 'L') {
            if ((rc = ops_q4nx_layout_opt("inspect", optarg, &lo)) >= 0)
                return rc;
        } else if ((rc = ops_opt_common(c, INSPECT_HELP, &dir)) >= 0)
            return rc;
    }
    if ((rc = ops_opt_end(argc, INSPECT_HELP, dir, 0)) >= 0)
        return rc;
    return inspect_run(dir, &lo, as_json);
}
