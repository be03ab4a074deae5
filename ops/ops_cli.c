/*
 * ops_cli.c -- the model-free commands: tokenize, prompt, validate, version.
 * Their output formats are stable: scripts and external checks read them.
 */
#include "ops_int.h"

#include "npu.h"
#include "schemas.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <sys/stat.h>

#ifndef D3_VERSION
#define D3_VERSION "dev"
#endif

/* Inputs are read up to the request limit + 1 so the decoder, not the
 * reader, answers 413 with the contract's message. */
/* --max-request-bytes (ops_int.h). */
static size_t g_max_request = SCH_DEFAULT_MAX_REQUEST_BYTES;
/* Text given to `tokenize` may be larger than a request. */
#define TEXT_MAX ((size_t)1 << 30)

void ops_fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "d3stream %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

bool ops_emit(const svc_buf_t *b) {
    if (b->len && fwrite(b->data, 1, b->len, stdout) != b->len)
        return false;
    return fputc('\n', stdout) != EOF;
}

svc_err_t ops_add_ids(svc_buf_t *out, const eng_ids_t *ids) {
    svc_err_t err = svc_buf_addc(out, '[');
    for (size_t i = 0; i < ids->n && !err; i++)
        err = svc_buf_addf(out, i ? ",%d" : "%d", (int)ids->v[i]);
    return err ? err : svc_buf_addc(out, ']');
}

/* ---------------------------------------------------------------- tokenize */

static const char TOKENIZE_HELP[] =
    "Usage: d3stream tokenize --tokenizer FILE [--tokenizer-config FILE] [--as-is] [--jsonl]\n"
    "\n"
    "Encodes the text on stdin (all of it, bytes as given) and prints its token ids\n"
    "as a JSON array. No special tokens are added; special-token strings in the\n"
    "text become their ids.\n"
    "\n"
    "  --tokenizer FILE         a Hugging Face tokenizer.json (byte-level BPE)\n"
    "  --tokenizer-config FILE  its tokenizer_config.json (default: the file of\n"
    "                           that name next to --tokenizer, when present)\n"
    "  --as-is                  the file's own pipeline, as tokenizers'\n"
    "                           Tokenizer.from_file runs it. Default: as the\n"
    "                           engine uses it: the Qwen2 pre-tokenizer regex in\n"
    "                           place of the file's, and every added token of\n"
    "                           tokenizer_config.json added as special (SPEC c.7)\n"
    "  --jsonl                  stdin holds one {\"text\": ...} per line; prints one\n"
    "                           {\"ids\": [...]} per line, in order\n"
    "\n"
    "Exit status: 0 ok, 2 usage, 3 unreadable tokenizer or input.\n";

static char *sibling_config(const char *tokenizer_path) {
    const char *slash = strrchr(tokenizer_path, '/');
    size_t      dir = slash ? (size_t)(slash - tokenizer_path) + 1 : 0;
    size_t      n = dir + sizeof "tokenizer_config.json";
    char       *p = malloc(n);
    if (!p)
        return NULL;
    snprintf(p, n, "%.*stokenizer_config.json", (int)dir, tokenizer_path);
    FILE *f = fopen(p, "rb");
    if (!f) {
        free(p);
        return NULL;
    }
    fclose(f);
    return p;
}

static int tokenize_text(const eng_tokenizer_t *tok) {
    char      errstr[512];
    svc_buf_t in, out;
    eng_ids_t ids;
    svc_buf_init(&in, TEXT_MAX);
    svc_buf_init(&out, SIZE_MAX / 2);
    eng_ids_init(&ids);
    int rc = OPS_EXIT_FAILURE;
    if (svc_buf_read_file(&in, NULL, errstr, sizeof errstr))
        ops_fail("tokenize", "%s", errstr);
    else if (eng_tokenizer_encode(tok, in.data, in.len, &ids))
        ops_fail("tokenize", "stdin is not UTF-8 text");
    else if (ops_add_ids(&out, &ids) || !ops_emit(&out))
        ops_fail("tokenize", "cannot write the result");
    else
        rc = OPS_EXIT_OK;
    eng_ids_fini(&ids);
    svc_buf_fini(&out);
    svc_buf_fini(&in);
    return rc;
}

/* One {"text": ...} line -> one {"ids": [...]} line. */
static int tokenize_line(const eng_tokenizer_t *tok, const char *line, size_t len, size_t lineno,
                         svc_buf_t *out) {
    json_error_t jerr;
    json_t      *obj = json_loadb(line, len, JSON_ALLOW_NUL, &jerr);
    json_t      *text = obj ? json_object_get(obj, "text") : NULL;
    int          rc = OPS_EXIT_FAILURE;
    if (!json_is_string(text))
        ops_fail("tokenize", "stdin line %zu: expected {\"text\": \"...\"}%s%s", lineno,
                 obj ? "" : ": ", obj ? "" : jerr.text);
    else {
        eng_ids_t ids;
        eng_ids_init(&ids);
        svc_buf_reset(out);
        if (eng_tokenizer_encode(tok, json_string_value(text), json_string_length(text), &ids))
            ops_fail("tokenize", "stdin line %zu: the text cannot be encoded", lineno);
        else if (svc_buf_adds(out, "{\"ids\":") || ops_add_ids(out, &ids) ||
                 svc_buf_addc(out, '}') || !ops_emit(out))
            ops_fail("tokenize", "cannot write the result");
        else
            rc = OPS_EXIT_OK;
        eng_ids_fini(&ids);
    }
    json_decref(obj);
    return rc;
}

static int tokenize_jsonl(const eng_tokenizer_t *tok) {
    char     *line = NULL;
    size_t    cap = 0;
    ssize_t   n;
    size_t    lineno = 0;
    int       rc = OPS_EXIT_OK;
    svc_buf_t out;
    svc_buf_init(&out, SIZE_MAX / 2);
    while (rc == OPS_EXIT_OK && (n = getline(&line, &cap, stdin)) > 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        if (n == 0)
            continue;
        rc = tokenize_line(tok, line, (size_t)n, lineno, &out);
    }
    free(line);
    svc_buf_fini(&out);
    return rc;
}

int ops_cmd_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"tokenizer-config", required_argument, NULL, 'c'},
        {"as-is", no_argument, NULL, 'a'},
        {"jsonl", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tok_path = NULL, *cfg_path = NULL;
    bool        as_is = false, jsonl = false;
    int         c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            tok_path = optarg;
            break;
        case 'c':
            cfg_path = optarg;
            break;
        case 'a':
            as_is = true;
            break;
        case 'j':
            jsonl = true;
            break;
        default: /* --help or unknown ('m' is not among the options) */
            return ops_opt_common(c, TOKENIZE_HELP, NULL);
        }
    }
    if (!tok_path || optind != argc) {
        fputs(TOKENIZE_HELP, stderr);
        return OPS_EXIT_USAGE;
    }
    if (cfg_path && as_is) { /* --as-is reads no config: it would be ignored */
        ops_fail("tokenize", "--tokenizer-config and --as-is exclude each other");
        return OPS_EXIT_USAGE;
    }
    char            *found = (!cfg_path && !as_is) ? sibling_config(tok_path) : NULL;
    char             errstr[1024];
    eng_tokenizer_t *tok = NULL;
    int              rc = OPS_EXIT_FAILURE;
    if (eng_tokenizer_load(tok_path, as_is ? NULL : (cfg_path ? cfg_path : found),
                           as_is ? ENG_TOK_AS_IS : ENG_TOK_UPSTREAM, &tok, errstr, sizeof errstr))
        ops_fail("tokenize", "%s", errstr);
    else
        rc = jsonl ? tokenize_jsonl(tok) : tokenize_text(tok);
    eng_tokenizer_free(tok);
    free(found);
    return rc;
}

/* ---------------------------------------------------------------- validate */

static const char VALIDATE_HELP[] =
    "Usage: d3stream validate [FILE]\n"
    "\n"
    "Prints the System One contract's verdict on the request in FILE (or stdin),\n"
    "without a model, as one line of JSON:\n"
    "  {\"status\":400,\"error\":{\"code\":...,\"message\":...}}   a whole-request error\n"
    "  {\"status\":200,\"questions\":{\"<id>\":{\"type\":...,\"options\":[...]},\n"
    "                            \"<id>\":{\"type\":...,\"error\":...,\"message\":...}}}\n"
    "options are the answer keys in answer order; a multi-state request adds\n"
    "\"states\":{\"<name>\":{\"questions\":{...}}}. The status is the one the HTTP\n"
    "shim returns when no model-dependent check applies (model names, vision\n"
    "tower, prompt length are not checked here).\n"
    "\n"
    "Exit status: 0 the request is valid (200), 1 it is not, 2 usage, 3 unreadable input.\n";

static eng_profile_t g_profile = ENG_PROFILE_EXACT;

eng_profile_t ops_profile_default(void) {
    return g_profile;
}

size_t ops_max_request_bytes(void) {
    return g_max_request;
}

int ops_max_request_opt(const char *cmd, const char *arg) {
    return ops_count_opt(cmd, "max-request-bytes", arg, OPS_MAX_REQUEST_MAX, &g_max_request)
               ? -1
               : OPS_EXIT_USAGE;
}

int ops_profile_opt(const char *cmd, const char *arg) {
    eng_profile_t p;
    if (!eng_profile_parse(arg, &p)) {
        ops_fail(cmd, "--profile \"%s\": expected exact or fast", arg);
        return OPS_EXIT_USAGE;
    }
    g_profile = p;
    return -1;
}

/* --model-alias: the names besides the package's own that select it
 * (SPEC a.2 4.); the SDK's default first unless --no-default-alias. */
static const char *g_aliases[OPS_ALIAS_MAX] = {OPS_DEFAULT_ALIAS};
static size_t      g_n_aliases = 1;

size_t ops_model_aliases(const char *const **out) {
    *out = g_aliases;
    return g_n_aliases;
}

void ops_no_default_alias(void) {
    for (size_t i = 0; i < g_n_aliases; i++)
        if (strcmp(g_aliases[i], OPS_DEFAULT_ALIAS) == 0) {
            memmove(&g_aliases[i], &g_aliases[i + 1], (g_n_aliases - i - 1) * sizeof *g_aliases);
            g_n_aliases--;
            return;
        }
}

/* One name: 1 to 128 visible ASCII bytes, no comma (the list separator). */
static bool alias_ok(const char *a, size_t n) {
    if (n == 0 || n > 128)
        return false;
    for (size_t i = 0; i < n; i++)
        if (a[i] <= ' ' || a[i] > '~' || a[i] == ',')
            return false;
    return true;
}

int ops_model_alias_opt(const char *cmd, const char *arg) {
    for (const char *p = arg;;) {
        size_t n = strcspn(p, ",");
        if (!alias_ok(p, n)) {
            ops_fail(cmd,
                     "--model-alias \"%s\": each name must be 1 to 128 visible ASCII "
                     "characters, comma-separated",
                     arg);
            return OPS_EXIT_USAGE;
        }
        bool seen = false;
        for (size_t i = 0; i < g_n_aliases; i++)
            seen = seen || (strlen(g_aliases[i]) == n && memcmp(g_aliases[i], p, n) == 0);
        if (!seen && g_n_aliases == OPS_ALIAS_MAX) {
            ops_fail(cmd, "--model-alias: at most %d names", OPS_ALIAS_MAX);
            return OPS_EXIT_USAGE;
        }
        if (!seen && !(g_aliases[g_n_aliases++] = strndup(p, n))) {
            ops_fail(cmd, "out of memory");
            return OPS_EXIT_FAILURE;
        }
        if (!p[n])
            return -1;
        p += n + 1;
    }
}

void ops_model_info(const eng_package_t *pkg, const char *dir, bool has_vision,
                    const char *names[OPS_NAMES_MAX], char last[OPS_NAME_MAX],
                    sch_model_info_t *info) {
    /* The last component as Python's Path(dir).name: trailing '/' dropped. */
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(last, OPS_NAME_MAX, "%.*s", (int)(n - b), dir + b);
    names[0] = eng_package_model_id(pkg);
    names[1] = dir;
    names[2] = last[0] ? last : dir;
    for (size_t i = 0; i < g_n_aliases; i++)
        names[3 + i] = g_aliases[i];
    *info = (sch_model_info_t){
        .names = names,
        .n_names = 3 + g_n_aliases,
        .label = names[0],
        .has_vision = has_vision,
        .reads_videos = false,
        .profiles = eng_profile_names(),
        .n_profiles = ENG_PROFILE_COUNT,
        .default_profile = eng_profile_name(g_profile),
    };
}

bool ops_read_request(const char *cmd, const char *path, svc_buf_t *body) {
    char errstr[512];
    svc_buf_init(body, g_max_request + 1); /* one byte past: the decoder says 413 */
    if (svc_buf_read_file(body, path, errstr, sizeof errstr) == SVC_OK)
        return true;
    /* Past the cap the decoder must still see "too large": keep what was read. */
    if (body->len >= g_max_request)
        return true;
    ops_fail(cmd, "%s", errstr);
    return false;
}

int ops_decode_request(const eng_package_t *pkg, const char *dir, unsigned flags, const char *body,
                       size_t len, sch_request_t **req, svc_buf_t *out, int *status, char *errstr,
                       size_t errstr_size) {
    const char      *names[OPS_NAMES_MAX];
    char             last[OPS_NAME_MAX];
    sch_model_info_t info;
    ops_model_info(pkg, dir, flags & OPS_DECODE_VISION, names, last, &info);
    info.engine_decodes = flags & OPS_DECODE_ENGINE;
    sch_limits_t limits = {g_max_request};
    sch_error_t  e;
    sch_error_init(&e);
    int rc = OPS_EXIT_OK;
    if (sch_request_decode(body, len, &limits, &info, req, &e) != SVC_OK) {
        rc = OPS_EXIT_VERDICT;
        if (status)
            *status = e.status;
        if (sch_error_encode(&e, out)) {
            svc_errf(errstr, errstr_size, "cannot write the result");
            rc = OPS_EXIT_FAILURE;
        }
    }
    sch_error_fini(&e);
    return rc;
}

bool ops_dir_non_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return errno != ENOENT; /* a file, or unreadable: let the writer say why */
    struct dirent *de;
    bool           any = false;
    while (!any && (de = readdir(d)) != NULL)
        any = strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return any;
}

bool ops_is_file(const char *dir, const char *name) {
    char        path[4096];
    struct stat sb;
    int         n = snprintf(path, sizeof path, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

void ops_matmul_desc(char *buf, size_t n) {
    const char *mm = npu_matmul_name(), *q = npu_matmul_quantised_name();
    const char *g = npu_matmul_groups_name();
    if (strcmp(mm, q) == 0 && strcmp(q, g) == 0)
        snprintf(buf, n, "%s", mm);
    else if (strcmp(q, g) == 0)
        snprintf(buf, n, "%s (weights bf16 would round: %s)", mm, q);
    else
        snprintf(buf, n, "%s (weights bf16 would round: %s; q4nx group codes: %s)", mm, q, g);
}

void ops_warn_dnnl(void) {
    const char *why = npu_dnnl_refusal();
    char        mm[128];
    if (!why)
        return;
    ops_matmul_desc(mm, sizeof mm);
    ops_logf(OPS_LOG_WARN, "%s; running kernels %s, matmul %s instead", why, npu_kernels_name(),
             mm);
}

int ops_opt_common(int c, const char *help, const char **dir) {
    if (c == 'm') {
        *dir = optarg;
        return -1;
    }
    fputs(help, c == 'h' ? stdout : stderr);
    return c == 'h' ? OPS_EXIT_OK : OPS_EXIT_USAGE;
}

int ops_opt_end(int argc, const char *help, const char *dir, int max_files) {
    if (dir && argc - optind <= max_files)
        return -1;
    fputs(help, stderr);
    return OPS_EXIT_USAGE;
}

static int simple_opts(const char *cmd, int argc, char **argv, const char *help) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int                        c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(help, stdout);
            return OPS_EXIT_OK;
        }
        fputs(help, stderr);
        return OPS_EXIT_USAGE;
    }
    if (argc - optind > 1) {
        ops_fail(cmd, "at most one FILE");
        return OPS_EXIT_USAGE;
    }
    return -1;
}

int ops_cmd_validate(int argc, char **argv) {
    int rc = simple_opts("validate", argc, argv, VALIDATE_HELP);
    if (rc >= 0)
        return rc;
    svc_buf_t body, out;
    if (!ops_read_request("validate", optind < argc ? argv[optind] : NULL, &body)) {
        svc_buf_fini(&body);
        return OPS_EXIT_FAILURE;
    }
    svc_buf_init(&out, SIZE_MAX / 2);
    sch_limits_t   limits = {g_max_request};
    sch_request_t *req = NULL;
    sch_error_t    err;
    sch_error_init(&err);
    bool ok = sch_request_decode(body.data, body.len, &limits, NULL, &req, &err) == SVC_OK;
    if (sch_verdict_encode(req, ok ? NULL : &err, &out) || !ops_emit(&out)) {
        ops_fail("validate", "cannot write the verdict");
        rc = OPS_EXIT_FAILURE;
    } else
        /* The verdict, not the decoder, decides: a valid request can still be
         * a 500 when an echoed value is not finite. */
        rc = strncmp(out.data, "{\"status\":200,", 14) == 0 ? OPS_EXIT_OK : OPS_EXIT_VERDICT;
    sch_request_free(req);
    sch_error_fini(&err);
    svc_buf_fini(&out);
    svc_buf_fini(&body);
    return rc;
}

/* ----------------------------------------------------------------- version */

static const char VERSION_HELP[] =
    "Usage: d3stream version\n"
    "\n"
    "Prints the version and what a pass runs on here: the online CPUs, the compute\n"
    "features found, the kernels, matmul layout and threads chosen (D3_NPU_KERNELS\n"
    "and D3_NPU_THREADS change them), whether oneDNN's run-time kernels may run\n"
    "(MemoryDenyWriteExecute= forbids them; the references then run instead) and\n"
    "the NPU in one line (`d3stream devices` has every finding).\n"
    "\n"
    "Exit status: 0 printed, 2 usage.\n";

int ops_cmd_version(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int                        c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        fputs(VERSION_HELP, c == 'h' ? stdout : stderr);
        return c == 'h' ? OPS_EXIT_OK : OPS_EXIT_USAGE;
    }
    if (optind < argc) {
        ops_fail("version", "unexpected operand \"%s\": see d3stream version --help", argv[optind]);
        return OPS_EXIT_USAGE;
    }
    const npu_features_t *f = npu_probe();
    svc_buf_t             feats;
    svc_buf_init(&feats, 4096);
    if (npu_features_describe(f, &feats))
        return OPS_EXIT_FAILURE;
    /* What a pass will run on (the dispatch decisions, npu.h), so that an
     * operator sees e.g. that AMX is not in use without reading a profile. */
    char mm[128];
    ops_matmul_desc(mm, sizeof mm);
    const char *dnnl = npu_dnnl_refusal();
    printf("d3stream %s\ncpus: %d\nfeatures: %s\nkernels: %s, matmul %s, threads %zu\n"
           "onednn: %s\nnpu: %s; not used: no XDNA backend in this build\n",
           D3_VERSION, f->n_cpus, feats.data, npu_kernels_name(), mm, npu_threads(),
           dnnl ? dnnl : "usable", npu_devices()->reason);
    svc_buf_fini(&feats);
    return OPS_EXIT_OK;
}

int ops_q4nx_layout_opt(const char *cmd, const char *arg, eng_load_opts_t *lo) {
    char            errstr[512];
    eng_load_opts_t t = {.q4nx_layout = arg};
    if (eng_load_opts_check(&t, errstr, sizeof errstr)) {
        ops_fail(cmd, "%s", errstr);
        return OPS_EXIT_USAGE;
    }
    lo->q4nx_layout = arg;
    return -1;
}

bool ops_count_opt(const char *cmd, const char *name, const char *arg, size_t max, size_t *out) {
    char              *end = NULL;
    unsigned long long v = strtoull(arg, &end, 10);
    /* strtoull alone takes " 5", "+5" and "-5": the file and the
     * environment refuse those, so a flag must too. */
    if (!isdigit((unsigned char)arg[0]) || *end || v == 0 || v > max) {
        ops_fail(cmd, "--%s \"%s\": expected a whole number from 1 to %zu", name, arg, max);
        return false;
    }
    *out = (size_t)v;
    return true;
}
