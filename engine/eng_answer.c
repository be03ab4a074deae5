/*
 * eng_answer.c -- a decoded System One request -> the outcome of every
 * question (SPEC b.2, b.5, b.6, c.7, d), on the fp32 text tower.
 *
 * eng_answer_request runs questions one after another, one unpadded
 * forward pass each, in request order, sharing nothing: that is the
 * single-question pass SPEC "d3stream's own choices" 4 makes the numerical
 * contract, and the reference the scheduler (eng_sched.c, prefix sharing
 * across questions) is checked against. Both plan, time out and read out
 * questions through the functions of eng_answer_int.h defined here.
 *
 * The results are plain sch_result_t rows that sch_response_encode writes;
 * this file owns their probabilities and messages until eng_answers_free.
 */
#include "engine.h"
#include "eng_answer_int.h"
#include "eng_fwd_int.h"
#include "eng_manifest_int.h"

#include <time.h>

/* One part's results. results[i].probs points into probs (at offs[i]),
 * and results[i].error_message aliases messages[i] (both owned here). */
typedef struct ans_part {
    sch_result_t *results;  /* (n) */
    char        **messages; /* (n), NULL entries when none */
    double       *probs;    /* (sum of the valid questions' option counts) */
    size_t       *offs;     /* (n): where question i's probabilities start in probs */
    size_t        n;
} ans_part_t;

struct eng_answers {
    size_t               n_parts;
    ans_part_t          *parts;        /* (n_parts) */
    const sch_result_t **views;        /* (n_parts): parts[p].results, for the encoder */
    size_t              *input_tokens; /* (n_parts) */
    eng_answer_stats_t   stats;
};

double eng_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The clock options.deadline_ms is measured with (eng_answer_int.h). */
static eng_answer_clock_fn deadline_clock = eng_now_ms;

eng_answer_clock_fn eng_answer_set_clock(eng_answer_clock_fn fn) {
    eng_answer_clock_fn prev = deadline_clock;
    deadline_clock = fn ? fn : eng_now_ms;
    return prev;
}

void eng_deadline_start(eng_deadline_t *d, const sch_options_t *opt) {
    d->start_ms = deadline_clock();
    d->has = opt->has_deadline;
    d->limit_ms = opt->deadline_ms;
    d->expired = false;
}

bool eng_deadline_passed(eng_deadline_t *d) {
    if (d->has && !d->expired)
        d->expired = deadline_clock() - d->start_ms > d->limit_ms;
    return d->expired;
}

void eng_answers_free(eng_answers_t *ans) {
    if (!ans)
        return;
    for (size_t p = 0; ans->parts && p < ans->n_parts; p++) {
        ans_part_t *ap = &ans->parts[p];
        for (size_t i = 0; ap->messages && i < ap->n; i++)
            free(ap->messages[i]);
        free(ap->messages);
        free(ap->results);
        free(ap->probs);
        free(ap->offs);
    }
    free(ans->parts);
    free(ans->views);
    free(ans->input_tokens);
    free(ans);
}

const sch_result_t *const *eng_answers_results(const eng_answers_t *ans) {
    return ans->views;
}

const size_t *eng_answers_input_tokens(const eng_answers_t *ans) {
    return ans->input_tokens;
}

const eng_answer_stats_t *eng_answers_stats(const eng_answers_t *ans) {
    return &ans->stats;
}

eng_answer_stats_t *eng_answers_stats_mut(eng_answers_t *ans) {
    return &ans->stats;
}

/* Room for one part: a result, a message slot and an offset per question
 * (at least one, so that calloc never sees 0), and every valid question's
 * options. */
static svc_err_t part_alloc(ans_part_t *ap, const sch_part_t *part) {
    ap->n = part->n_questions;
    ap->results = calloc(ap->n ? ap->n : 1, sizeof *ap->results);
    ap->messages = calloc(ap->n ? ap->n : 1, sizeof *ap->messages);
    ap->offs = calloc(ap->n ? ap->n : 1, sizeof *ap->offs);
    if (!ap->offs)
        return SVC_ERR_NOMEM;
    size_t n_probs = 0;
    for (size_t i = 0; i < part->n_questions; i++) {
        ap->offs[i] = n_probs;
        if (!part->questions[i].error_code)
            n_probs += part->questions[i].n_options;
    }
    ap->probs = calloc(n_probs ? n_probs : 1, sizeof *ap->probs);
    return ap->results && ap->messages && ap->probs ? SVC_OK : SVC_ERR_NOMEM;
}

eng_answers_t *eng_answers_new(const sch_request_t *req) {
    eng_answers_t *ans = calloc(1, sizeof *ans);
    if (!ans)
        return NULL;
    ans->n_parts = sch_request_n_parts(req);
    ans->parts = calloc(ans->n_parts, sizeof *ans->parts);
    ans->views = calloc(ans->n_parts, sizeof *ans->views);
    ans->input_tokens = calloc(ans->n_parts, sizeof *ans->input_tokens);
    bool ok = ans->parts && ans->views && ans->input_tokens;
    for (size_t p = 0; ok && p < ans->n_parts; p++) {
        ok = part_alloc(&ans->parts[p], sch_request_part(req, p)) == SVC_OK;
        ans->views[p] = ans->parts[p].results;
    }
    if (!ok) {
        eng_answers_free(ans);
        return NULL;
    }
    return ans;
}

/* max_length_exceeded (SPEC b.6, c.7): the question never reaches the
 * model and is not counted in usage (b.5). */
static svc_err_t too_long(ans_part_t *ap, size_t i, size_t n_tokens, size_t limit) {
    int n = snprintf(NULL, 0, SCH_MSG_MAX_LENGTH, n_tokens, limit);
    if (n < 0)
        return SVC_ERR_INTERNAL;
    ap->messages[i] = malloc((size_t)n + 1);
    if (!ap->messages[i])
        return SVC_ERR_NOMEM;
    snprintf(ap->messages[i], (size_t)n + 1, SCH_MSG_MAX_LENGTH, n_tokens, limit);
    ap->results[i].error_code = "max_length_exceeded";
    ap->results[i].error_message = ap->messages[i];
    return SVC_OK;
}

svc_err_t eng_answer_plan(const eng_package_t *pkg, const sch_request_t *req, size_t p, size_t i,
                          eng_answers_t *ans, eng_prompt_t *pr, bool *run, char *errstr,
                          size_t errstr_size) {
    const sch_part_t *part = sch_request_part(req, p);
    double            t0 = eng_now_ms();
    svc_err_t err = eng_prompt_render(pkg, part, &part->questions[i], pr, errstr, errstr_size);
    ans->stats.tokenize_ms += eng_now_ms() - t0;
    *run = false;
    if (err)
        return err;
    size_t limit = eng_package_max_length(pkg);
    if (pr->n_tokens > limit)
        return too_long(&ans->parts[p], i, pr->n_tokens, limit);
    ans->input_tokens[p] += pr->n_tokens;
    *run = true;
    return SVC_OK;
}

void eng_answers_put_deadline(eng_answers_t *ans, size_t p, size_t i) {
    ans->parts[p].results[i].error_code = "deadline_exceeded"; /* b.6: no message */
}

svc_err_t eng_answers_put_hidden(eng_answers_t *ans, const eng_package_t *pkg,
                                 const eng_model_t *model, const sch_request_t *req, size_t p,
                                 size_t i, const float *hidden, char *errstr, size_t errstr_size) {
    const sch_question_t *q = &sch_request_part(req, p)->questions[i];
    ans_part_t           *ap = &ans->parts[p];
    double               *probs = ap->probs + ap->offs[i];
    svc_err_t             err =
        eng_readout_probs(model, hidden, q->n_options, eng_package_temperature(pkg), probs);
    if (err) { /* option count and temperature were checked by the decoder and the package */
        svc_errf(errstr, errstr_size, "question \"%.*s\": readout refused %zu options",
                 (int)q->id_len, q->id, q->n_options);
        return err;
    }
    ap->results[i].probs = probs;
    return SVC_OK;
}

void eng_answers_put_probs(eng_answers_t *ans, size_t p, size_t i, const double *probs, size_t n) {
    ans_part_t *ap = &ans->parts[p];
    memcpy(ap->probs + ap->offs[i], probs, n * sizeof *probs);
    ap->results[i].probs = ap->probs + ap->offs[i];
}

const double *eng_answers_probs(const eng_answers_t *ans, size_t p, size_t i) {
    return ans->parts[p].results[i].probs;
}

void eng_answer_blame(const sch_question_t *q, char *errstr, size_t errstr_size) {
    char why[384];
    snprintf(why, sizeof why, "%s", errstr_size ? errstr : "");
    svc_errf(errstr, errstr_size, "question \"%.*s\": %s", (int)q->id_len, q->id, why);
}

svc_err_t eng_answer_refuse_media(const eng_package_t *pkg, const eng_model_t *model,
                                  const sch_request_t *req, char *errstr, size_t errstr_size) {
    bool vision = model && eng_model_has_vision(model);
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        if (part->n_videos) {
            svc_errf(errstr, errstr_size, "model %s reads no videos", eng_package_model_id(pkg));
            return SVC_ERR_UNSUPPORTED;
        }
        if (part->n_images && !vision) {
            svc_errf(errstr, errstr_size, "model %s has no vision tower; images are not supported",
                     eng_package_model_id(pkg));
            return SVC_ERR_UNSUPPORTED;
        }
    }
    return SVC_OK;
}

/* Question i of part p, planned and not too long: the deadline, then one
 * forward pass from an empty state and the readout. A question skipped
 * for the deadline was still rendered and tokenized, even though that work
 * itself may come after the deadline, since usage counts its prompt; only
 * its forward is saved. */
static svc_err_t answer_one(const eng_package_t *pkg, const eng_model_t *model,
                            const sch_request_t *req, size_t p, size_t i, eng_answers_t *ans,
                            eng_deadline_t *dl, const eng_ids_t *ids, const eng_media_t *md,
                            float *hidden, char *errstr, size_t errstr_size) {
    if (eng_deadline_passed(dl)) {
        eng_answers_put_deadline(ans, p, i);
        return SVC_OK;
    }
    double    t0 = eng_now_ms();
    svc_err_t err =
        eng_model_forward_media(model, NULL, false, ids->v, ids->n, md, eng_package_noncausal(pkg),
                                hidden, NULL, NULL, errstr, errstr_size);
    if (err) {
        eng_answer_blame(&sch_request_part(req, p)->questions[i], errstr, errstr_size);
        return err;
    }
    err = eng_answers_put_hidden(ans, pkg, model, req, p, i, hidden, errstr, errstr_size);
    ans->stats.forward_ms += eng_now_ms() - t0;
    ans->stats.n_forward++;
    return err;
}

svc_err_t eng_answer_request(const eng_package_t *pkg, const eng_model_t *model,
                             const sch_request_t *req, eng_answers_t **out, sch_error_t *reject,
                             char *errstr, size_t errstr_size) {
    eng_deadline_t dl;
    eng_deadline_start(&dl, sch_request_options(req)); /* options.deadline_ms counts from here */
    *out = NULL;
    svc_err_t err = eng_answer_refuse_media(pkg, model, req, errstr, errstr_size);
    if (err)
        return err;
    eng_req_images_t   ri;
    const eng_model_t *view = eng_model_profile(model, eng_request_profile(req));
    err = eng_req_images_load(pkg, view, req, &ri, reject, errstr, errstr_size);
    if (!err) /* every image decoded: the error schemas/ held behind them */
        err = eng_answer_pending(req, reject, errstr, errstr_size);
    if (err) {
        eng_req_images_fini(&ri);
        return err;
    }
    eng_answers_t *ans = eng_answers_new(req);
    if (!ans) {
        eng_req_images_fini(&ri);
        svc_errf(errstr, errstr_size, "out of memory for the answers");
        return SVC_ERR_NOMEM;
    }
    ans->stats.images_encoded = ri.n_encoded;
    eng_prompt_t pr;
    eng_prompt_init(&pr);
    eng_ids_t ids = {0};
    float    *hidden = malloc(eng_model_hidden_size(model) * sizeof *hidden);
    err = hidden ? SVC_OK : SVC_ERR_NOMEM;
    for (size_t p = 0; !err && p < ans->n_parts; p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t i = 0; !err && i < part->n_questions; i++) {
            bool run = false;
            if (part->questions[i].error_code)
                continue; /* the encoder writes its validation error */
            err = eng_answer_plan(pkg, req, p, i, ans, &pr, &run, errstr, errstr_size);
            if (!err && run && part->n_images)
                err = eng_answer_expand(&pr, eng_model_image_token_id(model),
                                        ri.slots + ri.first[p], ri.tokens + ri.first[p],
                                        part->n_images, &ids, errstr, errstr_size);
            if (!err && run)
                err = answer_one(pkg, view, req, p, i, ans, &dl, part->n_images ? &ids : &pr.ids,
                                 &ri.media, hidden, errstr, errstr_size);
        }
    }
    free(hidden);
    free(ids.v);
    eng_prompt_fini(&pr);
    eng_req_images_fini(&ri);
    if (err) {
        if (err == SVC_ERR_NOMEM && errstr_size && !errstr[0])
            svc_errf(errstr, errstr_size, "out of memory answering the request");
        eng_answers_free(ans);
        return err;
    }
    *out = ans;
    return SVC_OK;
}

/* ---------------------------------------------------------------------
 * Chat template (SPEC e.5)
 * --------------------------------------------------------------------- */

static const char *const PINNED_TEMPLATES[] = {
    "273d8e0e683b885071fb17e08d71e5f2a5ddfb5309756181681de4f5a1822d80", /* d3-nano, d3-lite */
    "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715", /* d3-flash, d3-mini */
    "c3cf9e34abf4f9e36c2d72165aa9c132d3e2a725b6c2586aaa3a8af9d7a81041", /* d3 */
};

svc_err_t eng_chat_template_check(const char *dir, eng_chat_template_t *verdict, char sha256[65],
                                  char *errstr, size_t errstr_size) {
    size_t n = strlen(dir) + sizeof "/chat_template.jinja";
    char  *path = malloc(n);
    sha256[0] = '\0';
    if (!path)
        return SVC_ERR_NOMEM;
    snprintf(path, n, "%s/chat_template.jinja", dir);
    svc_err_t err = eng_sha256_file(path, sha256, NULL, errstr, errstr_size);
    bool      missing = err == SVC_ERR_IO && errno == ENOENT;
    free(path);
    if (missing) {
        sha256[0] = '\0';
        if (errstr_size)
            errstr[0] = '\0';
        *verdict = ENG_CHAT_TEMPLATE_MISSING;
        return SVC_OK;
    }
    if (err)
        return err;
    *verdict = ENG_CHAT_TEMPLATE_UNPINNED;
    for (size_t i = 0; i < sizeof PINNED_TEMPLATES / sizeof PINNED_TEMPLATES[0]; i++)
        if (strcmp(sha256, PINNED_TEMPLATES[i]) == 0)
            *verdict = ENG_CHAT_TEMPLATE_PINNED;
    return SVC_OK;
}
