/*
 * eng_quant_int.h -- private: `d3stream quantize`'s calibration data
 * (eng_calib.c) and the pieces its driver (eng_quantize.c) shares with the
 * tests.
 *
 * Calibration prompts are System One requests rendered by the package's
 * own prompt code (eng_prompt_render: the exact bytes and ids a served
 * question runs), either generated here -- seeded, deterministic, with
 * varied question types, option counts, instructions, languages and
 * states of 100 to 2,000 tokens, none taken from any benchmark -- or read
 * from a user's JSONL file of requests.
 */
#ifndef D3STREAM_ENG_QUANT_INT_H
#define D3STREAM_ENG_QUANT_INT_H

#include "eng_model_int.h"
#include "eng_pkgwrite_int.h"
#include "engine.h"

/* Token id sequences, one per question's prompt. */
typedef struct eng_calib {
    eng_ids_t *seqs;
    size_t     n, cap;
    uint64_t   tokens;  /* sum of the sequences' lengths */
    size_t     skipped; /* questions left out: images, over the package's limit or the budget */
    bool       full;    /* a prompt passed the token budget: nothing more is taken */
} eng_calib_t;

void eng_calib_init(eng_calib_t *c);
void eng_calib_fini(eng_calib_t *c);

/* The state lengths the generator aims at, in tokens of the package's
 * tokenizer (the prompt adds its frame and the question). */
#define ENG_CALIB_STATE_MIN 100
#define ENG_CALIB_STATE_MAX 2000

/**
 * @brief Request i of the generated set of seed, as JSON text appended to
 *   out (one question; its state grown until it encodes to the target
 *   length in tok's tokens, drawn in [ENG_CALIB_STATE_MIN,
 *   ENG_CALIB_STATE_MAX]). Depends only on (seed, i) and tok.
 */
SVC_WUR svc_err_t eng_calib_request(const eng_tokenizer_t *tok, uint64_t seed, size_t i,
                                    svc_buf_t *out);

/**
 * @brief n_prompts generated requests of seed (eng_calib_request),
 *   rendered through pkg, appended to c until the first prompt that would
 *   take c->tokens past max_tokens (0: no budget; c->full then set, and
 *   the rest not even generated), so that the budget keeps the set's
 *   length distribution. Prompts over the package's limit are skipped.
 * @returns SVC_OK; SVC_ERR_NOMEM, or SVC_ERR_INTERNAL when a generated
 *   request does not decode (a bug), with errstr.
 */
SVC_WUR svc_err_t eng_calib_generate(const eng_package_t *pkg, uint64_t seed, size_t n_prompts,
                                     uint64_t max_tokens, eng_calib_t *c, char *errstr,
                                     size_t errstr_size);

/**
 * @brief Every valid question of every request of a JSONL file (one System
 *   One request per non-blank line), rendered through pkg, appended to c
 *   within max_tokens as above. Questions of parts with images are skipped
 *   (counted): the text tower is calibrated on text.
 * @returns SVC_OK; SVC_ERR_IO; SVC_ERR_INVALID naming the file and line of
 *   a request that does not decode (with its error) or that gives no
 *   prompt at all; SVC_ERR_NOMEM. The budget ends the file as it ends the
 *   generated set.
 */
SVC_WUR svc_err_t eng_calib_file(const eng_package_t *pkg, const char *path, uint64_t max_tokens,
                                 eng_calib_t *c, char *errstr, size_t errstr_size);

/* ---------------------------------------------------------------------
 * The driver (eng_quantize.c) and its GPTQ pass (eng_quant_gptq.c)
 * --------------------------------------------------------------------- */

struct eng_q4nx_writer;
typedef struct qz_ckpt qz_ckpt_t;

/* One quantisation run: the source package opened three ways (prompts,
 * the layerless shell for the pass, the tensors), the tensor lists the
 * output holds, and the writer pieces' context (out_dir, errstr). */
typedef struct qz {
    const eng_quant_opts_t *o;
    char                   *errstr;
    size_t                  errstr_size;
    eng_package_t          *pkg;
    eng_model_t            *shell;
    eng_ref_src_t          *src;
    json_t                 *cfg; /* the source's config.json */
    bool                   *full;
    pw_shape_t              shape;
    pw_list_t               text, vision; /* "model.language_model.", "model.visual." names */
    bool                    has_vision;
    pw_vision_t             vis;
    eng_make_opts_t         mo; /* out_dir only: what pw_ctx_t's helpers read */
    pw_ctx_t                pc;
    uint64_t                calib_tokens; /* GPTQ: what the calibration came to */
    size_t                  calib_prompts;
    qz_ckpt_t              *ck; /* the work directory (qz_ckpt_open), owned */
} qz_t;

/* Progress line through opts->log. */
SVC_FMT(2, 3) void qz_log(const qz_t *q, const char *fmt, ...);
/* Seconds on the monotonic clock. */
double qz_now(void);
/* The values of list tensor t from the source package (a pw_fill_t). */
svc_err_t qz_fill(const pw_tensor_t *t, float *out, void *user, char *errstr, size_t errstr_size);
/* The tensors of l whose names start with prefix, into sub (entries copied). */
SVC_WUR svc_err_t qz_sublist(const pw_list_t *l, const char *prefix, bool match, pw_list_t *sub);

/* eng_quant_gptq.c: every text tensor into w, the layers' projections by
 * GPTQ on the calibration prompts' inputs, layer by layer. */
SVC_WUR svc_err_t qz_gptq_text(qz_t *q, struct eng_q4nx_writer *w);

/* ---------------------------------------------------------------------
 * Per-layer checkpoints (eng_quant_ckpt.c): out_dir/ENG_QUANT_PARTIAL
 * holds state.json, each finished layer's tiles and the residual stream
 * after the last one, so that a killed GPTQ run goes on with --resume and
 * writes the bytes an uninterrupted run would. RTN (seconds) writes none.
 * --------------------------------------------------------------------- */

/**
 * @brief Sets q->ck (freed by qz_ckpt_free). With opts->resume and a
 *   state.json there: its options must be this run's (source files,
 *   method, generation, GPTQ's options, the calibration's), else refused
 *   naming the first field that differs; files state.json does not name
 *   are removed. Otherwise the directory is emptied (a run not resumed
 *   starts over) and, for GPTQ, made.
 * @returns SVC_OK; SVC_ERR_INVALID (another run's checkpoint),
 *   SVC_ERR_FORMAT (a state.json not of this format), SVC_ERR_IO,
 *   SVC_ERR_NOMEM; errstr set.
 */
SVC_WUR svc_err_t qz_ckpt_open(qz_t *q);
void              qz_ckpt_free(qz_ckpt_t *ck); /* NULL is a no-op */
/* Layers finished by the run resumed (0: none, or not resumed). */
size_t qz_ckpt_done(const qz_ckpt_t *ck);
/* The calibration's digest (its prompts' ids): recorded, or refused
 * (SVC_ERR_INVALID, errstr) when a resumed run's differs. */
SVC_WUR svc_err_t qz_ckpt_calib(qz_t *q, const eng_calib_t *c);
/**
 * @brief A resumed run's finished layers' tensors into w, and *x0 (rows x
 *   hidden, malloc'd, the caller frees; NULL when nothing is resumed) the
 *   stream after the last of them. Every file must have the size and
 *   sha256 state.json gives it: a damaged one is refused (SVC_ERR_FORMAT
 *   naming it), never used.
 */
SVC_WUR svc_err_t qz_ckpt_restore(qz_t *q, struct eng_q4nx_writer *w, size_t rows, float **x0);
/**
 * @brief Layer li has been rounded (its tensors are w's from index mark
 *   on) and x (rows x hidden) is its output: both written, then
 *   state.json, then the stream before it removed. Test hook:
 *   D3_TEST_QUANT_STOP_AFTER_LAYER=N fails the run (SVC_ERR_INTERNAL)
 *   right after layer N (1-based) is checkpointed, as a kill there would.
 */
SVC_WUR svc_err_t qz_ckpt_layer(qz_t *q, size_t li, const struct eng_q4nx_writer *w, size_t mark,
                                const float *x, size_t rows, char *errstr, size_t errstr_size);
/* The package is written: the directory is removed (a failure is only
 * said). */
SVC_WUR svc_err_t qz_ckpt_finish(qz_t *q);

#endif /* D3STREAM_ENG_QUANT_INT_H */
