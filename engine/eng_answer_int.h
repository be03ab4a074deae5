/*
 * eng_answer_int.h -- private: what eng_answer_request and the scheduler
 * (eng_sched.c) share, so that a question is planned, timed out and read
 * out the same way on both paths:
 *  - planning: render + tokenize + the length check (max_length_exceeded)
 *    + usage (SPEC b.5, b.6, c.7), eng_answer_plan;
 *  - the deadline (SPEC a.8, b.6), eng_deadline_t, on a clock tests replace;
 *  - the result assembly: probabilities through eng_readout_probs or
 *    deadline_exceeded, into eng_answers_t.
 *
 * The deadline clock: eng_answer_request reads it exactly once when it
 * starts and, when the request has options.deadline_ms, once before each
 * forward pass (after the question's length check) until the deadline has
 * passed, and nowhere else; the scheduler the same, starting at submit;
 * so a test can make the deadline expire after a chosen number of
 * questions without depending on how fast the machine is.
 */
#ifndef D3STREAM_ENG_ANSWER_INT_H
#define D3STREAM_ENG_ANSWER_INT_H

#include "engine.h"

/* Milliseconds on some monotonic clock. */
typedef double (*eng_answer_clock_fn)(void);

/* Replaces the deadline clock (NULL restores CLOCK_MONOTONIC) and returns
 * the previous one. Not thread-safe: set it before any request starts (the
 * clock itself is then called from worker threads, one at a time under the
 * scheduler's lock). */
eng_answer_clock_fn eng_answer_set_clock(eng_answer_clock_fn fn);

/* CLOCK_MONOTONIC in milliseconds (for timings, never replaced). */
double eng_now_ms(void);

/* options.deadline_ms of one request. Not locked: one thread at a time. */
typedef struct eng_deadline {
    bool   has;      /* options.deadline_ms was given */
    bool   expired;  /* sticky: every later question is skipped too */
    double start_ms; /* the deadline clock when the request started */
    double limit_ms;
} eng_deadline_t;

/* Starts d now: reads the deadline clock once. */
void eng_deadline_start(eng_deadline_t *d, const sch_options_t *opt);
/* SPEC a.8, b.6: true once more than deadline_ms has passed since the
 * start; from then on true without reading the clock again. */
bool eng_deadline_passed(eng_deadline_t *d);

/* SVC_ERR_UNSUPPORTED with errstr when a part has videos (no package
 * reads them), or images and the model has no vision tower (the decoder,
 * told has_vision, answers those with the contract's 400 first). */
SVC_WUR svc_err_t eng_answer_refuse_media(const eng_package_t *pkg, const eng_model_t *model,
                                          const sch_request_t *req, char *errstr,
                                          size_t errstr_size);

/* Answers with room for every result of req; NULL when out of memory. */
eng_answers_t *eng_answers_new(const sch_request_t *req);
/* The stats to fill in (stats are not locked: one thread at a time). */
eng_answer_stats_t *eng_answers_stats_mut(eng_answers_t *ans);

/**
 * @brief Plans valid question i of part p of req: renders and tokenizes
 *        it into pr (time added to tokenize_ms) and checks its length.
 *        Too long: the result gets max_length_exceeded with its message
 *        and *run is false (not counted in usage). Otherwise *run is true
 *        and its length is added to the part's usage at once (b.5 counts
 *        it whether it is answered or skipped for the deadline).
 * @returns SVC_OK; SVC_ERR_NOMEM; the prompt's error, with errstr.
 */
SVC_WUR svc_err_t eng_answer_plan(const eng_package_t *pkg, const sch_request_t *req, size_t p,
                                  size_t i, eng_answers_t *ans, eng_prompt_t *pr, bool *run,
                                  char *errstr, size_t errstr_size);

/* Question i of part p skipped: deadline_exceeded, no message (b.6). */
void eng_answers_put_deadline(eng_answers_t *ans, size_t p, size_t i);

/**
 * @brief Question i of part p answered: its option probabilities from the
 *        final hidden state (eng_readout_probs, the package temperature).
 * @returns SVC_OK; SVC_ERR_INVALID with errstr naming the question.
 */
SVC_WUR svc_err_t eng_answers_put_hidden(eng_answers_t *ans, const eng_package_t *pkg,
                                         const eng_model_t *model, const sch_request_t *req,
                                         size_t p, size_t i, const float *hidden, char *errstr,
                                         size_t errstr_size);

/* Question i of part p answered with the n (its option count)
 * probabilities probs, as another pass of the same prompt computed them
 * (the scheduler's result cache and joins): what eng_answers_put_hidden
 * stores, bit for bit. */
void eng_answers_put_probs(eng_answers_t *ans, size_t p, size_t i, const double *probs, size_t n);
/* Question i of part p's probabilities once answered, else NULL. */
const double *eng_answers_probs(const eng_answers_t *ans, size_t p, size_t i);

/* ---- images (eng_answer_img.c) ---- */

/* errstr = "images[<i>]: <msg>"; with reject, also the request's 400
 * invalid_request with that message (SPEC a.10). */
void eng_answer_reject_image(sch_error_t *reject, size_t i, const char *msg, char *errstr,
                             size_t errstr_size);
/* A request past ENG_REQ_MAX_IMAGE_TOKENS: a bound of ours (bounded
 * memory), so the contract's 413 for a request too large (SPEC b.7), not a
 * 500. Fills reject (when given) and errstr; returns SVC_ERR_INVALID. */
svc_err_t eng_answer_refuse_image_tokens(sch_error_t *reject, char *errstr, size_t errstr_size);
/* The whole-request error sch_request_decode held behind req's images
 * (sch_request_pending), once they all decoded: into reject (when given)
 * and errstr, SVC_ERR_INVALID; SVC_OK when none is held. */
SVC_WUR svc_err_t eng_answer_pending(const sch_request_t *req, sch_error_t *reject, char *errstr,
                                     size_t errstr_size);

/**
 * @brief out = pr's ids with the k-th <|image_pad|> (pad_id) replaced by
 *        tokens[k] ids ENG_IMAGE_ID(slots[k], 0..tokens[k]-1), k < n_images
 *        (the images of the question's part, in order).
 * @returns SVC_OK; SVC_ERR_NOMEM; SVC_ERR_INTERNAL when the prompt does not
 *          hold exactly n_images placeholders (the decoder refuses literal
 *          ones, so this is a broken invariant), with errstr.
 */
SVC_WUR svc_err_t eng_answer_expand(const eng_prompt_t *pr, int32_t pad_id, const size_t *slots,
                                    const size_t *tokens, size_t n_images, eng_ids_t *out,
                                    char *errstr, size_t errstr_size);

/* The images of one request, prepared and encoded once each (equal bytes
 * share one encoding): image k of the request (parts in order) is
 * slots[k] in media, with tokens[k] tokens; part p's are k in
 * [first[p], first[p + 1]). */
typedef struct eng_req_images {
    size_t                  n; /* images of the request */
    size_t                  n_encoded;
    eng_image_emb_t        *embs;  /* (n); only the first of equal images is filled */
    const eng_image_emb_t **ptrs;  /* (n): the slot table of media */
    size_t                 *slots; /* (n) */
    size_t                 *tokens;
    unsigned char (*sha)[32];
    size_t     *first; /* (parts + 1) */
    eng_media_t media;
} eng_req_images_t;

/**
 * @brief Prepares and encodes every image of req (eng_answer_request's own
 *        table; the scheduler keeps a shared one).
 * @returns SVC_OK; SVC_ERR_INVALID for an image the contract refuses
 *          (errstr and, with reject, the 400) or for images past
 *          ENG_REQ_MAX_IMAGE_TOKENS (the 413, counted from each image's
 *          header before it is decoded, as the scheduler counts);
 *          SVC_ERR_NOMEM or the tower's error. ri is to be finied whatever
 *          the outcome.
 */
SVC_WUR svc_err_t eng_req_images_load(const eng_package_t *pkg, const eng_model_t *model,
                                      const sch_request_t *req, eng_req_images_t *ri,
                                      sch_error_t *reject, char *errstr, size_t errstr_size);
void              eng_req_images_fini(eng_req_images_t *ri);

/* ---- the scheduler's image slots (eng_sched_img.c) ---- */

typedef struct eng_imgreg eng_imgreg_t;

/* Slots of the table, the most one request can hold. */
#define ENG_IMGREG_CAP 4096u

/* Requests together hold max_slots distinct images at most (one request
 * alone may hold up to ENG_IMGREG_CAP); NULL when out of memory. */
eng_imgreg_t *eng_imgreg_new(const eng_model_t *m, size_t max_slots);
/* Frees every slot. No other call may be running. NULL is a no-op. */
void eng_imgreg_free(eng_imgreg_t *g);
/**
 * @brief A reference on the slot of prep's image under profile p (by the
 *        SHA-256 of its bytes; each profile encodes an image with its own
 *        kernels, so the same bytes under two profiles are two slots): an
 *        existing one, or a free one that takes prep.
 *        Ownership of prep passes to the registry either way.
 * @param mine distinct slots the calling request holds already.
 * @returns SVC_OK with *slot and its *tokens; SVC_ERR_RETRIABLE when the
 *          slots others hold leave no room (backpressure: retry after a
 *          completion); SVC_ERR_TOO_LARGE when the request alone needs more
 *          than ENG_IMGREG_CAP distinct images.
 */
SVC_WUR svc_err_t eng_imgreg_acquire(eng_imgreg_t *g, eng_image_prep_t *prep, eng_profile_t p,
                                     size_t mine, size_t *slot, size_t *tokens);
/* A reference on the live slot of the image with digest sha under profile
 * p, if there is one (true, *slot and its *tokens): no decode, no new
 * memory. */
bool eng_imgreg_ref(eng_imgreg_t *g, const unsigned char sha[32], eng_profile_t p, size_t *slot,
                    size_t *tokens);
/* true when a request holding no slot would be refused one now (the soft
 * bound is reached): the scheduler then waits before decoding. */
bool eng_imgreg_would_wait(const eng_imgreg_t *g);
/* Drops a reference; the last one frees the slot. */
void eng_imgreg_release(eng_imgreg_t *g, size_t slot);
/**
 * @brief Makes slot's tokens available in eng_imgreg_media: encodes them on
 *        this thread if nobody has (*encoded_here true), or waits for the
 *        thread that does. The caller holds a reference.
 * @returns SVC_OK; the tower's error (every later call says the same).
 */
SVC_WUR svc_err_t eng_imgreg_ready(eng_imgreg_t *g, size_t slot, bool *encoded_here, char *errstr,
                                   size_t errstr_size);
/* The slot table the forward pass reads (stable for the registry's life). */
const eng_media_t *eng_imgreg_media(const eng_imgreg_t *g);
/* Vision tower runs so far. */
uint64_t eng_imgreg_encodings(const eng_imgreg_t *g);
/* Slots freed so far: a submit refused for want of slots may pass once it
 * moved (eng_sched_stats_t.image_slots_freed). */
uint64_t eng_imgreg_cleared(const eng_imgreg_t *g);

/* Prefixes errstr (a forward pass's error) with `question "<id>": `. */
void eng_answer_blame(const sch_question_t *q, char *errstr, size_t errstr_size);

#endif
