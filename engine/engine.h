/*
 * engine.h -- the d3 engine: model package, tokenizer, prompt (and, in later
 * issues, the towers, readout and scheduler).
 *
 * Usage (prompt only, no weights):
 *
 *     char            errstr[512];
 *     eng_package_t  *pkg = NULL;
 *     if (eng_package_open(dir, ENG_PACKAGE_PROMPT_ONLY, &pkg, errstr, sizeof errstr))
 *         die(errstr);
 *     eng_prompt_t pr;
 *     eng_prompt_init(&pr);
 *     eng_prompt_render(pkg, part, q, &pr, errstr, sizeof errstr);  // bytes + ids
 *     ...
 *     eng_prompt_fini(&pr);
 *     eng_package_free(pkg);
 *
 * Thread-safety: a loaded tokenizer or package is immutable; encoding and
 * rendering may run concurrently from any number of threads.
 */
#ifndef D3STREAM_ENGINE_H
#define D3STREAM_ENGINE_H

#include "svc.h"
#include "schemas.h"

/* ======================================================================
 * Token id lists
 * ====================================================================== */

typedef struct eng_ids {
    int32_t *v;
    size_t   n;
    size_t   cap;
} eng_ids_t;

void              eng_ids_init(eng_ids_t *ids);
void              eng_ids_fini(eng_ids_t *ids);
SVC_WUR svc_err_t eng_ids_push(eng_ids_t *ids, int32_t id);

/* ======================================================================
 * Tokenizer: Hugging Face byte-level BPE (tokenizer.json)
 * ====================================================================== */

typedef struct eng_tokenizer eng_tokenizer_t;

typedef enum eng_tok_mode {
    /* As the upstream runtime uses it (SPEC c.7): the pre-tokenizer of
     * tokenizer.json replaced by the Qwen2 regex split + byte-level mapping,
     * every added_tokens_decoder entry of tokenizer_config.json added as a
     * special token with its flags and id. */
    ENG_TOK_UPSTREAM = 0,
    /* The file's own pipeline, as `tokenizers.Tokenizer.from_file` runs it. */
    ENG_TOK_AS_IS = 1,
} eng_tok_mode_t;

/**
 * @brief Loads tokenizer.json (and tokenizer_config.json when given).
 * @param config_path optional (NULL); in ENG_TOK_UPSTREAM mode its
 *        added_tokens_decoder entries are added and its tokenizer_class,
 *        add_prefix_space, add_bos_token and pad_token are checked.
 * @param errstr on failure: the file and the entry at fault, e.g.
 *        `tokenizer.json "x/tokenizer.json": merges[17] names unknown token "ab"`.
 * @returns SVC_OK with *out set; the caller frees it with eng_tokenizer_free.
 */
SVC_WUR svc_err_t eng_tokenizer_load(const char *json_path, const char *config_path,
                                     eng_tok_mode_t mode, eng_tokenizer_t **out, char *errstr,
                                     size_t errstr_size);
void              eng_tokenizer_free(eng_tokenizer_t *tok);

/**
 * @brief Encodes UTF-8 text without adding special tokens (no BOS/EOS);
 *        special-token strings in the text become their ids.
 * @param ids appended to (not cleared).
 * @returns SVC_OK; SVC_ERR_INVALID when text is not UTF-8; SVC_ERR_NOMEM.
 * @remark Safe to call concurrently on one tokenizer.
 */
SVC_WUR svc_err_t eng_tokenizer_encode(const eng_tokenizer_t *tok, const char *text, size_t len,
                                       eng_ids_t *ids);

/* The id of a token given by its content (vocab entry in byte-level form, or
 * an added token), or -1. */
int32_t eng_tokenizer_token_id(const eng_tokenizer_t *tok, const char *content, size_t len);
/* Number of ids (vocab + added tokens; the largest id + 1). */
size_t eng_tokenizer_n_ids(const eng_tokenizer_t *tok);

/* ======================================================================
 * Model package (SPEC e): decision_config.json, tokenizer, limits.
 * This slice opens what the prompt needs; weights arrive with the text
 * tower (issue 3).
 * ====================================================================== */

typedef struct eng_package eng_package_t;

#define ENG_N_CODES 255

/**
 * @brief Opens a package directory for prompting: reads and checks
 *        decision_config.json (SPEC e.2), loads tokenizer.json +
 *        tokenizer_config.json in ENG_TOK_UPSTREAM mode, checks that every
 *        answer code encodes to exactly its token id (SPEC c.5), and takes
 *        the length limit from max_length or config.json (SPEC c.7).
 * @param errstr on failure names the file and the rule, e.g.
 *        `decision_config.json "pkg/decision_config.json": temperature must be positive and
 * finite`.
 * @returns SVC_OK with *out; the caller frees it with eng_package_free.
 */
SVC_WUR svc_err_t eng_package_open(const char *dir, eng_package_t **out, char *errstr,
                                   size_t errstr_size);
void              eng_package_free(eng_package_t *pkg);

const eng_tokenizer_t *eng_package_tokenizer(const eng_package_t *pkg);
/* Largest prompt length answered (SPEC c.7); longer -> max_length_exceeded. */
size_t eng_package_max_length(const eng_package_t *pkg);
/* Answer code i (0..254), NUL-terminated; valid while pkg lives. */
const char *eng_package_code(const eng_package_t *pkg, size_t i);
int32_t     eng_package_code_id(const eng_package_t *pkg, size_t i);
double      eng_package_temperature(const eng_package_t *pkg);
bool        eng_package_noncausal(const eng_package_t *pkg); /* attention_mode */
/* The served id: MODEL_MANIFEST.json model_name, else the directory name. */
const char *eng_package_model_id(const eng_package_t *pkg);

/* ======================================================================
 * Prompt (SPEC c.1-c.4, c.6, c.7)
 * ====================================================================== */

typedef struct eng_prompt {
    svc_buf_t text;     /* the exact prompt bytes */
    eng_ids_t ids;      /* its token ids (one <|image_pad|> per image) */
    size_t    n_tokens; /* length counted against the limit, images expanded */
} eng_prompt_t;

void eng_prompt_init(eng_prompt_t *pr);
void eng_prompt_fini(eng_prompt_t *pr);

/**
 * @brief Renders question q of part into the exact upstream prompt bytes,
 *        tokenizes them and counts the length (images as the tokens their
 *        resized size gives, SPEC c.7).
 * @param q a valid question (error_code NULL) of part.
 * @returns SVC_OK; SVC_ERR_NOMEM; SVC_ERR_INVALID with errstr when the text
 *          cannot be encoded.
 * @remark pr is reset first; it may be reused across calls.
 */
SVC_WUR svc_err_t eng_prompt_render(const eng_package_t *pkg, const sch_part_t *part,
                                    const sch_question_t *q, eng_prompt_t *pr, char *errstr,
                                    size_t errstr_size);

/* Image tokens of a width x height image after the Qwen2-VL smart resize
 * (factor 32, 65,536..1,638,400 pixels): (H/16)*(W/16)/4. 0 if a side is 0. */
size_t eng_image_tokens(uint32_t width, uint32_t height);

/* The fallback question text when a question has no instructions. */
#define ENG_PROMPT_FALLBACK_INSTRUCTIONS "Choose the best matching option."

/* ======================================================================
 * Text tower (issue 3): the Qwen3.5 text tower in fp32 on the reference
 * kernels (npu_*_ref), and the code readout (SPEC d.4-d.7).
 *
 * Usage:
 *
 *     eng_model_t *m = NULL;
 *     if (eng_model_load(dir, &m, errstr, sizeof errstr))
 *         die(errstr);
 *     float *h = malloc(eng_model_hidden_size(m) * sizeof *h);
 *     eng_model_forward(m, ids, T, noncausal, h, NULL, NULL, errstr, sizeof errstr);
 *     eng_readout_probs(m, h, n_options, temperature, probs);
 *     eng_model_free(m);
 *
 * Thread-safety: a loaded model is immutable; forward passes may run
 * concurrently (each allocates its own activations).
 * ====================================================================== */

typedef struct eng_model eng_model_t;

/**
 * @brief Loads the text tower of an upstream package directory:
 *        config.json (text_config), model.safetensors (text tensors under
 *        "model.language_model." or "language_model."; vision tensors are
 *        ignored) and readout.safetensors (`weight` [255, hidden_size]).
 *        Every tensor is checked (presence, dtype BF16/F16/F32, shape) and
 *        converted to fp32 once; no file stays mapped afterwards.
 * @param errstr on failure one line naming the file and the key or tensor,
 *        e.g. `model.safetensors "d/model.safetensors": tensor
 *        "model.language_model.norm.weight": shape [65], expected [64]`.
 * @returns SVC_OK with *out (free with eng_model_free); SVC_ERR_IO,
 *          SVC_ERR_FORMAT, SVC_ERR_UNSUPPORTED, SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_model_load(const char *dir, eng_model_t **out, char *errstr,
                                 size_t errstr_size);
/* Frees everything the model owns. NULL is a no-op. */
void eng_model_free(eng_model_t *m);

size_t eng_model_hidden_size(const eng_model_t *m);

/* Called by eng_model_forward after the embeddings (layer -1) and after each
 * decoder layer 0..L-1 with the residual stream state, (T, hidden), valid
 * only during the call. */
typedef void (*eng_trace_fn)(int layer, const float *state, size_t T, size_t hidden, void *user);

/**
 * @brief One forward pass of the text tower over ids[0..T-1] at positions
 *        0..T-1 (a single unpadded row, SPEC d.2).
 * @param noncausal SPEC d.3 noncausal_full_attention: the full-attention
 *        layers see every token; the linear-attention layers stay causal.
 * @param final_last hidden_size floats: the final-norm output at T-1.
 * @param trace optional (NULL); see eng_trace_fn.
 * @returns SVC_OK; SVC_ERR_INVALID (T == 0, an id outside the vocabulary)
 *          or SVC_ERR_NOMEM, with errstr.
 * @remark Memory O(T * the widest projection); never T x T.
 */
SVC_WUR svc_err_t eng_model_forward(const eng_model_t *m, const int32_t *ids, size_t T,
                                    bool noncausal, float *final_last, eng_trace_fn trace,
                                    void *user, char *errstr, size_t errstr_size);

/* The 255 readout logits, fp32 (SPEC d.5 float32 path): logits[i] =
 * hidden . W_i. hidden is hidden_size floats. */
void eng_readout_logits(const eng_model_t *m, const float *hidden, float logits[ENG_N_CODES]);

/**
 * @brief Option probabilities (SPEC d.5-d.7, b.2): logits, rows >= n_options
 *        set to -inf, divided by temperature, softmax over all 255, the
 *        first n_options kept and renormalised in double.
 * @returns SVC_OK; SVC_ERR_INVALID when n_options is not in 1..255 or the
 *          temperature is not positive and finite.
 */
SVC_WUR svc_err_t eng_readout_probs(const eng_model_t *m, const float *hidden, size_t n_options,
                                    double temperature, double *probs);

#endif /* D3STREAM_ENGINE_H */
