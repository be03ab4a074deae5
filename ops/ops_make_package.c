/*
 * ops_make_package.c -- `d3stream make-package`: a complete package with
 * seeded random weights, so the product runs without downloads.
 */
#include "ops_int.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>

static const char MAKE_HELP[] =
    "Usage: d3stream make-package --size tiny|lite|nano --out DIR [--seed N]\n"
    "                             [--format safetensors|q4nx] [--twin DIR] [--tokenizer DIR]\n"
    "                             [--force] [--q4nx-tiles q4_k|q4_1|q4_0] [--q4nx-raster A|B]\n"
    "                             [--q4nx-embed tied|bf16] [--q4nx-alpha q8|tiles]\n"
    "                             [--no-golden]\n"
    "\n"
    "Writes a complete decision3 package with RANDOM weights: config.json,\n"
    "model.safetensors (BF16, text and vision towers), readout.safetensors,\n"
    "decision_config.json, tokenizer.json, tokenizer_config.json,\n"
    "preprocessor_config.json, chat_template.jinja, README.md and\n"
    "MODEL_MANIFEST.json. It loads, answers and benchmarks like a real package,\n"
    "but ITS ANSWERS ARE MEANINGLESS: use it for speed, memory and demos only.\n"
    "\n"
    "  --size S       tiny  hidden 64, 6 layers (the tiny-upstream test shapes),\n"
    "                       a 2-block vision tower of width 32\n"
    "                 lite  the Qwen3.5-0.8B text and vision towers (~1.7 GB)\n"
    "                 nano  the Qwen3.5-2B text and vision towers (~4.4 GB), as D3-Nano\n"
    "  --seed N       weights depend only on N and the size (default 0)\n"
    "  --out DIR      created if missing; refused if it exists and is not empty\n"
    "  --force        write into a non-empty DIR (files of the same name are replaced,\n"
    "                 others are left alone)\n"
    "  --tokenizer D  copy D/tokenizer.json and D/tokenizer_config.json (a Qwen\n"
    "                 tokenizer); the answer codes are the first 255 of A..Z, AA..ZZ\n"
    "                 that are single tokens. Default: a small byte-level BPE\n"
    "                 tokenizer with the chat special tokens and codes A..Z, AA..IU.\n"
    "  --format F     safetensors (default), or q4nx: the D3-Nano-NPU2 file set,\n"
    "                 model.q4nx (FastFlowLM's Q4NX, Gen-B: Q4_K projections, Q8\n"
    "                 alpha/beta/out_proj and tied embedding) quantised from the same\n"
    "                 BF16 values, vision_weight.q4nx (the vision tower, BF16, matmul\n"
    "                 weights in FastFlowLM's tiles), FastFlowLM's flattened config.json,\n"
    "                 readout, decision config, tokenizer, preprocessor and chat\n"
    "                 template, README.md and MANIFEST.sha256 (instead of\n"
    "                 MODEL_MANIFEST.json)\n"
    "  --twin DIR     with --format q4nx: also write an upstream safetensors package\n"
    "                 into DIR whose model.safetensors holds, as F32, the dequantised\n"
    "                 q4nx weights and the untiled vision tower (read back through\n"
    "                 d3stream's Q4NX reader), with the\n"
    "                 same tokenizer, readout and codes, and its own MODEL_MANIFEST.json:\n"
    "                 both packages load the same numbers. Same rules as --out.\n"
    "\n"
    "With --format q4nx, model.q4nx as FastFlowLM's public converter writes it from\n"
    "other GGUF types (Q4NX.md §2.6, §3.3, §8.1), to test a reader on each; the\n"
    "defaults are the official Gen-B layout:\n"
    "  --q4nx-tiles T   the 4-bit projections: q4_k (default), q4_1, or q4_0 (a Q4_0\n"
    "                   GGUF's signed codes in Q4_1 tiles, mins 0)\n"
    "  --q4nx-raster R  the code order of the Q4_1/Q4_0 and Q8 tiles: A (two 16-row\n"
    "                   planes, the older converter) or B (plain column major,\n"
    "                   default)\n"
    "  --q4nx-embed E   tied (default: the embedding only as the Q8 lm_head) or bf16\n"
    "                   (also a BF16 model.embed_tokens.weight, as Gen-A files)\n"
    "  --q4nx-alpha A   alpha/beta in q8 tiles (default) or in the projections' tiles\n"
    "                   (a GGUF whose alpha/beta share their type)\n"
    "\n"
    "Then the package is loaded and the golden request (SPEC f.1) answered on this\n"
    "machine's exact kernels into golden.json, which ask, http and serve hold their\n"
    "own answers to before serving (docs/operations.md, \"Golden check\"); --no-golden\n"
    "leaves it out (a layout that does not load without --q4nx-layout does too).\n"
    "\n"
    "lite and nano keep the real 248,320-row embedding whatever the tokenizer.\n"
    "Progress goes to stderr for lite and nano.\n"
    "\n"
    "Exit status: 0 written, 2 usage, 3 the package could not be written.\n";

typedef struct make_args {
    eng_make_opts_t opts;
    bool            force;
    bool            have_size;
    bool            no_golden;
} make_args_t;

svc_err_t ops_record_golden(const char *cmd, const char *dir, char *errstr, size_t n) {
    eng_package_t *pkg = NULL;
    eng_model_t   *m = NULL;
    char           why[1024] = "";
    if (eng_package_open(dir, &pkg, why, sizeof why) || eng_model_load(dir, &m, why, sizeof why) ||
        eng_model_check_package(m, pkg, why, sizeof why)) {
        fprintf(stderr,
                "d3stream %s: %s has no golden.json: it does not load without "
                "options (%s)\n",
                cmd, dir, why);
        eng_model_free(m);
        eng_package_free(pkg);
        return SVC_OK;
    }
    svc_err_t err = eng_golden_record(pkg, m, dir, errstr, n);
    eng_model_free(m);
    eng_package_free(pkg);
    return err;
}

static void make_progress(uint64_t done, uint64_t total, void *user) {
    (void)user;
    fprintf(stderr, "d3stream make-package: weights %llu / %llu MB of BF16 (%d%%)\n",
            (unsigned long long)(done >> 20), (unsigned long long)(total >> 20),
            total ? (int)(done * 100 / total) : 100);
}

/* A decimal uint64 with nothing after it. */
static bool parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !end || end == s || *end || !isdigit((unsigned char)s[0]))
        return false;
    *out = (uint64_t)v;
    return true;
}

static int usage(const char *fmt, const char *arg) {
    fputs("d3stream make-package: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n\n", stderr);
    fputs(MAKE_HELP, stderr);
    return OPS_EXIT_USAGE;
}

static int parse_opt(int c, make_args_t *a) {
    switch (c) {
    case 's':
        a->have_size = eng_make_size_parse(optarg, &a->opts.size);
        return a->have_size ? 0 : usage("--size \"%s\": expected tiny, lite or nano", optarg);
    case 'f':
        if (!strcmp(optarg, "safetensors"))
            a->opts.format = ENG_MAKE_SAFETENSORS;
        else if (!strcmp(optarg, "q4nx"))
            a->opts.format = ENG_MAKE_Q4NX;
        else
            return usage("--format \"%s\": expected safetensors or q4nx", optarg);
        return 0;
    case 'n':
        return parse_u64(optarg, &a->opts.seed)
                   ? 0
                   : usage("--seed \"%s\": expected a non-negative integer", optarg);
    case 'o':
        a->opts.out_dir = optarg;
        return 0;
    case 't':
        a->opts.tokenizer_dir = optarg;
        return 0;
    case 'T':
        a->opts.twin_dir = optarg;
        return 0;
    case 'F':
        a->force = true;
        return 0;
    case 'K':
        return eng_make_tiles_parse(optarg, &a->opts.q4nx.tiles)
                   ? 0
                   : usage("--q4nx-tiles \"%s\": expected q4_k, q4_1 or q4_0", optarg);
    case 'R':
        if (strcmp(optarg, "A") && strcmp(optarg, "B"))
            return usage("--q4nx-raster \"%s\": expected A or B", optarg);
        a->opts.q4nx.raster_a = optarg[0] == 'A';
        return 0;
    case 'E':
        if (strcmp(optarg, "tied") && strcmp(optarg, "bf16"))
            return usage("--q4nx-embed \"%s\": expected tied or bf16", optarg);
        a->opts.q4nx.embed_bf16 = optarg[0] == 'b';
        return 0;
    case 'A':
        if (strcmp(optarg, "q8") && strcmp(optarg, "tiles"))
            return usage("--q4nx-alpha \"%s\": expected q8 or tiles", optarg);
        a->opts.q4nx.alpha_tiles = optarg[0] == 't';
        return 0;
    }
    fputs(MAKE_HELP, stderr);
    return OPS_EXIT_USAGE;
}

static int make_run(make_args_t *a) {
    if (a->opts.twin_dir && a->opts.format != ENG_MAKE_Q4NX) {
        ops_fail("make-package", "--twin needs --format q4nx");
        return OPS_EXIT_USAGE;
    }
    const eng_make_q4nx_t *q = &a->opts.q4nx;
    if ((q->tiles || q->raster_a || q->embed_bf16 || q->alpha_tiles) &&
        a->opts.format != ENG_MAKE_Q4NX) {
        ops_fail("make-package", "--q4nx-tiles, --q4nx-raster, --q4nx-embed and --q4nx-alpha "
                                 "need --format q4nx");
        return OPS_EXIT_USAGE;
    }
    if (a->opts.twin_dir && strcmp(a->opts.twin_dir, a->opts.out_dir) == 0) {
        ops_fail("make-package", "--twin must name another directory than --out");
        return OPS_EXIT_USAGE;
    }
    const char *dirs[2][2] = {{"--out", a->opts.out_dir}, {"--twin", a->opts.twin_dir}};
    for (size_t i = 0; i < 2; i++)
        if (dirs[i][1] && !a->force && ops_dir_non_empty(dirs[i][1])) {
            ops_fail("make-package",
                     "%s \"%s\" exists and is not empty (use --force to write "
                     "into it)",
                     dirs[i][0], dirs[i][1]);
            return OPS_EXIT_USAGE;
        }
    if (a->opts.size != ENG_MAKE_TINY)
        a->opts.progress = make_progress;
    char      errstr[1024];
    svc_err_t err = eng_package_make(&a->opts, errstr, sizeof errstr);
    for (size_t i = 0; !err && !a->no_golden && i < 2; i++)
        if (dirs[i][1]) {
            if (a->opts.size != ENG_MAKE_TINY)
                fprintf(stderr, "d3stream make-package: recording the golden answers of %s\n",
                        dirs[i][1]);
            err = ops_record_golden("make-package", dirs[i][1], errstr, sizeof errstr);
        }
    if (err) {
        ops_fail("make-package", "%s", errstr);
        return err == SVC_ERR_INVALID ? OPS_EXIT_USAGE : OPS_EXIT_FAILURE;
    }
    fprintf(stderr,
            "d3stream make-package: wrote %s (synthetic %s, seed %llu): random weights, "
            "meaningless answers\n",
            a->opts.out_dir, eng_make_size_name(a->opts.size), (unsigned long long)a->opts.seed);
    if (a->opts.twin_dir)
        fprintf(stderr, "d3stream make-package: wrote %s, the safetensors twin of %s\n",
                a->opts.twin_dir, a->opts.out_dir);
    return OPS_EXIT_OK;
}

int ops_cmd_make_package(int argc, char **argv) {
    static const struct option opts[] = {
        {"size", required_argument, NULL, 's'},
        {"format", required_argument, NULL, 'f'},
        {"seed", required_argument, NULL, 'n'},
        {"out", required_argument, NULL, 'o'},
        {"tokenizer", required_argument, NULL, 't'},
        {"twin", required_argument, NULL, 'T'},
        {"force", no_argument, NULL, 'F'},
        {"q4nx-tiles", required_argument, NULL, 'K'},
        {"q4nx-raster", required_argument, NULL, 'R'},
        {"q4nx-embed", required_argument, NULL, 'E'},
        {"q4nx-alpha", required_argument, NULL, 'A'},
        {"no-golden", no_argument, NULL, 'G'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    make_args_t a = {0};
    int         c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(MAKE_HELP, stdout);
            return OPS_EXIT_OK;
        }
        if (c == 'G') {
            a.no_golden = true;
            continue;
        }
        int rc = parse_opt(c, &a);
        if (rc)
            return rc;
    }
    if (optind < argc)
        return usage("unexpected argument \"%s\"", argv[optind]);
    if (!a.have_size || !a.opts.out_dir)
        return usage("%s", "--size and --out are required");
    return make_run(&a);
}
