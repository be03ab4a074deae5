/* ops_int.h -- helpers shared by the subcommands of ops/ (private). */
#ifndef D3STREAM_OPS_INT_H
#define D3STREAM_OPS_INT_H

#include "engine.h"
#include "ops.h"

/* Appends ids as a JSON array. */
SVC_WUR svc_err_t ops_add_ids(svc_buf_t *out, const eng_ids_t *ids);

/* Reads a request body from path (stdin when NULL) into body, which it
 * initialises with a cap one byte past the request limit, so that the
 * decoder -- not the reader -- answers 413 with the contract's message.
 * Returns false (after printing why) when the input cannot be read. */
bool ops_read_request(const char *cmd, const char *path, svc_buf_t *body);

/* Writes b to stdout followed by a newline; false when stdout failed. */
bool ops_emit(const svc_buf_t *b);

/* Whether dir exists and holds anything but . and .. (an existing file or
 * an unreadable directory counts as not empty: the writer says why). The
 * --out check of make-package and quantize. */
bool ops_dir_non_empty(const char *dir);
/* A regular file name in dir. */
bool ops_is_file(const char *dir, const char *name);

/* The projection matmul a pass runs, for `version` and `bench`:
 * npu_matmul_name(), then " (weights bf16 would round: <layout>)" when
 * quantised packs take another layout (npu_matmul_quantised_name), and
 * "; q4nx group codes: <layout>" when a q4nx package's 4/8-bit tiles take
 * yet another (npu_matmul_groups_name). */
void ops_matmul_desc(char *buf, size_t n);
/* Logs a warning when oneDNN may not run here (npu_dnnl_refusal), with the
 * kernels that run instead: a pass is then much slower than this CPU
 * allows, and the cause (MemoryDenyWriteExecute=) is the operator's. */
void ops_warn_dnnl(void);

/* dir/golden.json (eng_golden_record) for the package cmd (make-package,
 * quantize) just wrote; a package that does not load as it is (a layout
 * its bytes leave open) is left without one, said on stderr. */
svc_err_t ops_record_golden(const char *cmd, const char *dir, char *errstr, size_t n);

/* ---- the golden check before serving (ops_golden.c, eng_golden.c) ---- */

typedef enum ops_golden_state {
    OPS_GOLDEN_PENDING = 0, /* not run yet (loading) */
    OPS_GOLDEN_PASSED,
    OPS_GOLDEN_FAILED,  /* the answers differ, or the check could not run */
    OPS_GOLDEN_SKIPPED, /* --no-golden */
} ops_golden_state_t;

typedef struct ops_golden {
    ops_golden_state_t state;
    eng_golden_t       r; /* the numbers (r.reason when failed) */
} ops_golden_t;

/* The card's "golden": "pending", "passed", "failed", "skipped". */
const char *ops_golden_name(ops_golden_state_t s);

/* Runs the check on a loaded model for cmd unless skip (--no-golden: a
 * warning); D3_TEST_CORRUPT_PACK=1 (a text layer) or =vision (a vision
 * block) first damages a pack (the tests' hook).
 * Logs the outcome; true when the model may serve, false after saying
 * why (ops_fail), with g filled either way. */
bool ops_golden_run(const char *cmd, const ops_ask_t *a, eng_model_t *m, const eng_load_opts_t *lo,
                    bool skip, ops_golden_t *g);

/* The --model DIR and --help cases (and any unknown option) of a getopt
 * loop over a command's options: -1 to go on (*dir set for 'm'), else the
 * exit status with the help printed (stdout for --help, stderr else). */
int ops_opt_common(int c, const char *help, const char **dir);
/* After the options: -1 when a --model DIR was given with at most max_files
 * FILE operands, else the usage status with the help on stderr. */
int ops_opt_end(int argc, const char *help, const char *dir, int max_files);

/* A whole-number option from 1 to max ("--workers 4"): true with *out set,
 * else false after printing "d3stream <cmd>: --<name> "<arg>": expected a
 * whole number from 1 to <max>". */
bool ops_count_opt(const char *cmd, const char *name, const char *arg, size_t max, size_t *out);

/* --q4nx-layout, which ask, serve, http, bench and inspect take
 * (engine.h eng_load_opts_t): its --help lines, and the option checked into
 * *lo (-1 to go on; OPS_EXIT_USAGE after saying why). */
#define OPS_Q4NX_LAYOUT_HELP                                                                       \
    "  --q4nx-layout S     what a model.q4nx does not say and its own bytes do not\n"              \
    "                      settle, which the load refuses naming this setting:\n"                  \
    "                      q4=A|B and q8=A|B (the code order of its Q4_1/Q4_0 and Q8\n"            \
    "                      tiles), q4-codes=signed|unsigned, comma-separated; a\n"                 \
    "                      setting the file contradicts is refused too (Q4NX.md §8)\n"
int ops_q4nx_layout_opt(const char *cmd, const char *arg, eng_load_opts_t *lo);

/* The served default profile (SPEC point 6: --profile), one per process:
 * what a request without options.profile gets, and what the model card
 * says. ops_profile_opt parses --profile into it (-1 to go on;
 * OPS_EXIT_USAGE after saying why). */
#define OPS_PROFILE_HELP                                                                           \
    "  --profile P         exact (default) or fast: the numerics a request gets\n"                 \
    "                      without options.profile; both are always enabled.\n"                    \
    "                      fast: one integer product per weight and activations of\n"              \
    "                      one byte per value (llama.cpp's precision), answers marked\n"           \
    "                      meta.numerics \"approximate\" (where the CPU has AVX-512\n"             \
    "                      VNNI; elsewhere fast runs the exact kernels)\n"
eng_profile_t ops_profile_default(void);
/* The largest request body this command takes (--max-request-bytes,
 * upstream's worker option; SPEC a.1: 8,388,608 by default): the HTTP
 * shim's 413 (from Content-Length, and while a body arrives), a Kafka
 * record's JSON (after Avro), `ask`'s input and the decoder all follow it.
 * ops_max_request_opt parses the option into it (-1 to go on, else the
 * exit status). */
#define OPS_MAX_REQUEST_MAX ((size_t)1 << 30)
size_t ops_max_request_bytes(void);
int    ops_max_request_opt(const char *cmd, const char *arg);
#define OPS_MAX_REQUEST_HELP                                                                       \
    "  --max-request-bytes N\n"                                                                    \
    "                      the largest request body taken (default 8388608, as\n"                  \
    "                      upstream); past it the answer is 413 request_too_large.\n"              \
    "                      Raise it for requests of several large images (each image\n"            \
    "                      stays at most 8,000,000 bytes, SPEC a.10)\n"
int ops_profile_opt(const char *cmd, const char *arg);

/* Decodes body for the package opened from dir (ops_model_info). Returns
 * OPS_EXIT_OK with *req set, else the exit status: OPS_EXIT_VERDICT with
 * the whole-request error written to out and its HTTP status in *status
 * (optional, may be NULL), or OPS_EXIT_FAILURE (errstr). */
/* The body of a bench image row (ops_bench_img.c): n_img synthetic w x h
 * PNGs and nq noul questions on a short state, into b (reset first). */
SVC_WUR svc_err_t ops_bench_image_body(size_t n_img, uint32_t w, uint32_t h, size_t nq,
                                       svc_buf_t *b);

/* ops_decode_request's flags: the model renders images (has_vision), and
 * the request goes to the engine, which decodes them, so a whole-request
 * error found after images is held for it (sch_model_info_t's
 * engine_decodes); without OPS_DECODE_ENGINE such an error is the verdict. */
enum { OPS_DECODE_VISION = 1u, OPS_DECODE_ENGINE = 2u };
static inline unsigned ops_decode_vision(const eng_model_t *model) {
    return eng_model_has_vision(model) ? OPS_DECODE_VISION : 0;
}

int ops_decode_request(const eng_package_t *pkg, const char *dir, unsigned flags, const char *body,
                       size_t len, sch_request_t **req, svc_buf_t *out, int *status, char *errstr,
                       size_t errstr_size);

/* ---- package checks shared by ask and inspect (ops_ask.c) ---- */

#define OPS_MF_JSON "MODEL_MANIFEST.json"
#define OPS_MF_SUM  "MANIFEST.sha256"

struct eng_mf_verdict; /* eng_manifest_int.h */

/* Verifies dir against MODEL_MANIFEST.json when it exists, else
 * MANIFEST.sha256; *which names the one used (NULL when there is none:
 * then SVC_ERR_INVALID, "no manifest" in errstr). Returns as
 * eng_manifest_verify_model; v is the caller's, initialised. */
SVC_WUR svc_err_t ops_manifest_verify(const char *dir, const char **which, struct eng_mf_verdict *v,
                                      char *errstr, size_t errstr_size);

/* Prints a warning to stderr when dir's chat_template.jinja is missing or
 * not pinned by SPEC e.5 (never a refusal: d3stream does not execute it). */
void ops_chat_template_warn(const char *cmd, const char *dir);

/* Model aliases (issue 30): names that select the served package besides
 * its own (model_name, the directory as given and its last component).
 * The official SDK's default model name is one by default, so that the SDK
 * works with only a base URL; --no-default-alias removes it. Process-wide
 * as --profile: the commands set them while parsing options. */
#define OPS_DEFAULT_ALIAS "jev-latest"
#define OPS_ALIAS_MAX     32
#define OPS_NAMES_MAX     (3 + OPS_ALIAS_MAX)
/* --model-alias NAME[,NAME...] (repeatable): -1 to go on, else the exit
 * status after saying why. */
int  ops_model_alias_opt(const char *cmd, const char *arg);
void ops_no_default_alias(void);
/* The aliases in effect, in the order given. */
size_t ops_model_aliases(const char *const **out);
#define OPS_ALIAS_HELP                                                                             \
    "  --model-alias N     another name that selects the package (repeatable, or\n"                \
    "                      comma-separated): a request naming it is answered by the\n"             \
    "                      package, under the package's own name. jev-latest (the\n"               \
    "                      official SDK's default model) is one unless\n"                          \
    "                      --no-default-alias\n"                                                   \
    "  --model-aliases L   the same as a comma-separated list (the config file's\n"                \
    "                      model-aliases: key)\n"                                                  \
    "  --no-default-alias  jev-latest selects nothing\n"

/* Appends p (n bytes) to b as RFC 4648 base64 with padding (data URLs:
 * bench's image bodies, the SDK's uploads). */
svc_err_t ops_base64_add(svc_buf_t *b, const unsigned char *p, size_t n);

#define OPS_NAME_MAX 4096

/* What the contract must know about the package opened from dir: the names
 * that select it (its id, the path, the path's last component without
 * trailing '/', written to last; SPEC a.2 4.; then the aliases), the "exact" profile and
 * whether images are rendered (has_vision). names and info point into dir
 * and last, which must outlive them. */
void ops_model_info(const eng_package_t *pkg, const char *dir, bool has_vision,
                    const char *names[OPS_NAMES_MAX], char last[OPS_NAME_MAX],
                    sch_model_info_t *info);

/* The manifest check `ask` makes before loading (ops_ask.c), shared with
 * serve and http: sha (ENG_SHA256_HEX + 1 bytes) gets meta.model_sha256 ("" when unknown).
 * Returns OPS_EXIT_OK or the exit status; messages say "d3stream <cmd>:". */
int ops_ask_verify_as(const char *cmd, const char *dir, bool no_verify, char *sha);
/* As ops_ask_verify_as, naming the command ops_log_init set (serve's call). */
int ops_ask_verify(const char *dir, bool no_verify, char *sha);

/* The answers to req -> the 200 body appended to out, *status 200
 * (OPS_EXIT_OK); or the 500 error body the encoder decides on (a
 * non-finite number; OPS_EXIT_VERDICT, *status set); OPS_EXIT_FAILURE with
 * errstr when it cannot be written. Thread-safe. */
int ops_ask_encode(const ops_ask_t *a, const sch_request_t *req, const eng_answers_t *ans,
                   svc_buf_t *out, int *status, char *errstr, size_t errstr_size);

/* ---- Prometheus text format 0.0.4 (ops_metrics.c), shared by serve's
 * --metrics-file and the HTTP shim's GET /metrics ---- */

/* The text being built; bad once an append failed (out of memory): the
 * caller then serves or writes nothing rather than a short text. */
typedef struct ops_prom {
    svc_buf_t b;
    bool      bad;
} ops_prom_t;

void ops_prom_init(ops_prom_t *p); /* capped at 4 MiB */
void ops_prom_fini(ops_prom_t *p);
SVC_FMT(2, 3) void ops_prom_addf(ops_prom_t *p, const char *fmt, ...);
/* One sample with its HELP/TYPE lines (labels "" for none, else "{k=\"v\"}"). */
void ops_prom_metric(ops_prom_t *p, const char *name, const char *type, const char *help,
                     const char *labels, double value);
/* A further sample of the metric just written (other labels). */
void ops_prom_sample(ops_prom_t *p, const char *name, const char *labels, double value);
/* A label value as the format wants it: \\, \" and \n escaped. */
void ops_prom_label_value(ops_prom_t *p, const char *v);
/* d3stream_info{model="...",mode="..."} 1 */
void ops_prom_info(ops_prom_t *p, const char *model_id, const char *mode);
/* d3stream_device_info{accelerator=...,device=...,accelerator_validated=...,
 * npu_present=...,npu_reason=...} 1: the model card's labels (validated:
 * the golden check passed on the kernels that serve) and the NPU's. */
void ops_prom_device(ops_prom_t *p, bool validated);
/* The scheduler's counters (d3stream_engine_*); nothing when s is NULL. */
void ops_prom_engine(ops_prom_t *p, const eng_sched_t *s);

/* A latency histogram in seconds; the caller serialises access. */
#define OPS_HIST_N 14
typedef struct ops_hist {
    uint64_t bucket[OPS_HIST_N]; /* cumulative at write time: bucket i counts <= bound i */
    uint64_t count;
    double   sum;
} ops_hist_t;
void ops_hist_add(ops_hist_t *h, double seconds);
/* name_bucket{le=...}, name_sum, name_count with HELP/TYPE. */
void ops_prom_hist(ops_prom_t *p, const char *name, const char *help, const ops_hist_t *h);

/* ---- structured logs (ops_log.c): logfmt lines on stderr ----
 *
 *   ops_log_t l;
 *   if (ops_log_begin(&l, OPS_LOG_INFO, "result")) {
 *       ops_log_str(&l, "request_id", rid);
 *       ops_log_int(&l, "status", 200);
 *       ops_log_end(&l);
 *   }
 *
 * writes "ts=... level=info cmd=serve msg=result request_id=... status=200"
 * in one write(2) (lines of threads never interleave). Values are quoted
 * and escaped when they must be. @locality any thread. */
typedef enum ops_log_level {
    OPS_LOG_DEBUG = 0,
    OPS_LOG_INFO = 1,
    OPS_LOG_WARN = 2,
    OPS_LOG_ERROR = 3,
} ops_log_level_t;

typedef struct ops_log {
    char   buf[4096];
    size_t len;
    bool   on, cut;
} ops_log_t;

/* The command named on every line and the lowest level written; call once
 * before any thread starts (default: "d3stream", info). */
void ops_log_init(const char *cmd, ops_log_level_t min);
/* The command ops_log_init set ("d3stream" before it). */
const char *ops_log_cmd(void);
/* "debug", "info", "warn" or "error" -> *out; false otherwise. */
bool ops_log_level_parse(const char *s, ops_log_level_t *out);
/* The --log-level option: true with *out set, else false after saying why. */
bool ops_log_level_opt(const char *cmd, const char *arg, ops_log_level_t *out);
bool ops_log_enabled(ops_log_level_t lv);
/* Starts a line (ts, level, cmd, msg); false, and the other calls do
 * nothing, when lv is below the level set. */
bool ops_log_begin(ops_log_t *l, ops_log_level_t lv, const char *msg);
void ops_log_str(ops_log_t *l, const char *key, const char *v);
SVC_FMT(3, 4) void ops_log_strf(ops_log_t *l, const char *key, const char *fmt, ...);
void ops_log_int(ops_log_t *l, const char *key, long long v);
/* Writes the line. */
void ops_log_end(ops_log_t *l);
/* A line with a formatted msg and no other fields. */
SVC_FMT(2, 3) void ops_logf(ops_log_level_t lv, const char *fmt, ...);

/* ---- where the kernels run (ops_devices.c): --device, the model card's
 * accelerator and device, d3stream_device_info ----
 *
 * One choice per process, as --profile: ask, serve, http and bench parse
 * --device into it and call ops_device_choose before loading anything. */
#define OPS_DEVICE_HELP                                                                            \
    "  --device D          auto (default), cpu or npu. This build has no XDNA\n"                   \
    "                      backend: every kernel runs on the CPU. auto logs why not\n"             \
    "                      the NPU; npu prints what was found and exits 3 naming\n"                \
    "                      what is missing (`d3stream devices` has the whole report)\n"
/* --device D: -1 to go on, else OPS_EXIT_USAGE after saying why. */
int ops_device_opt(const char *cmd, const char *arg);
/* The device asked for, on what npu_devices() found: -1 to go on (the CPU;
 * an info line says why not the NPU), else OPS_EXIT_FAILURE after printing
 * the NPU findings and what is missing to stderr (--device npu). */
int ops_device_choose(const char *cmd);
/* The card's and meta's "accelerator": what runs the kernels ("cpu"). */
const char *ops_device_accelerator(void);
/* The card's and meta's "device": "cpu (16 cores, avx2 fma ...; kernels
 * avx512, matmul amx-bf16x2)". Appends to out. */
SVC_WUR svc_err_t ops_device_label(svc_buf_t *out);

/* ---- configuration (ops_config.c): file < environment < flags ----
 *
 * The arguments serve or http parse with getopt: argv[0], then the options
 * of the YAML file (--config FILE, else $D3STREAM_CONFIG) and of the
 * environment (D3STREAM_<OPTION>, the environment winning) as "--name value"
 * pairs (a boolean as a bare "--name" when true, left out when false) and
 * the file's librdkafka: properties as "-X k=v", then the real arguments
 * without --config: getopt keeps the last value, so a flag wins. */
typedef struct ops_config {
    int          argc;
    char       **argv;  /* NULL-terminated; valid until ops_config_fini() */
    char       **owned; /* the strings made here */
    const char **where; /* where[i]: what set owned[i] (a value), or NULL */
    size_t       n_owned;
} ops_config_t;

/* Builds cfg for cmd ("serve" or "http") from argc/argv (argv[0] the
 * command). Returns -1 with cfg set (the caller calls ops_config_fini), else
 * the exit status after printing why: 2 for a bad file, key or value (the
 * message names the file, the line and the key). With --help in argv,
 * neither the file nor the environment is read. */
int  ops_config_argv(const char *cmd, int argc, char **argv, ops_config_t *cfg);
void ops_config_fini(ops_config_t *cfg);
/* What set arg, an element of cfg->argv (optarg after getopt_long, which
 * may permute argv but not the strings), when it came from the file
 * ("FILE:LINE: key") or the environment ("environment D3STREAM_X"): the
 * commands' own checks name the flag, and this names where to fix it.
 * NULL for a real argument. Valid until ops_config_fini(). */
const char *ops_config_origin(const ops_config_t *cfg, const char *arg);
/* After a command's getopt loop: when it stopped on a usage error (rc
 * OPS_EXIT_USAGE) at arg, a value from the file or the environment,
 * prints where that value is set. */
void ops_config_blame(const ops_config_t *cfg, const char *cmd, int rc, const char *arg);

#endif
