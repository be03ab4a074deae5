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

/* SVC_ERR_UNSUPPORTED with errstr when a part has images or videos: the
 * text tower has no vision tower (issue 6). */
SVC_WUR svc_err_t eng_answer_refuse_media(const eng_package_t *pkg, const sch_request_t *req,
                                          char *errstr, size_t errstr_size);

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

/* Prefixes errstr (a forward pass's error) with `question "<id>": `. */
void eng_answer_blame(const sch_question_t *q, char *errstr, size_t errstr_size);

#endif
