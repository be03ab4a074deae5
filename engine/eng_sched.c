/*
 * eng_sched.c -- the scheduler: a bounded FIFO of planned questions and a
 * pool of worker threads that run them with exact prefix sharing.
 *
 * Submit plans every valid question (eng_answer_plan: render, tokenize,
 * length check, usage) on the caller's thread and queues the ones that
 * reach the model. A worker takes up to max_group queued questions (FIFO,
 * across requests), sorts them by token ids and walks the compacted trie
 * their longest common prefixes form: every branch point at least
 * MIN_SHARE tokens past its parent runs its segment once into a state
 * cloned from the parent's (eng_fwd_int.h), and each question runs its
 * remaining tokens read-only from the deepest state on its path. The root
 * is the cached state of the constant head every prompt starts with (SPEC
 * c.1), for the questions whose ids start with exactly its ids, or an
 * empty state. A question shares at most n - 1 tokens: the readout needs
 * the final hidden state of its last token.
 *
 * What each question has left after its prefix does not run at once:
 * short ones (under one chunk of rows) wait in the worker's batch and run
 * together in one batched pass (eng_model_forward_batch), whatever their
 * requests and states, so that the projections read each weight once for
 * all of them. The batch runs before a state it reads is freed, at the
 * end of the take, or when it would pass SCHED_BATCH_ROWS rows; a failed
 * batch reruns its questions one by one, so that a failure is one
 * question's. The bits of every answer are those of its own pass.
 *
 * noncausal_full_attention packages use the same trie with noncausal
 * states (eng_fwd_int.h): a shared segment runs once through the layers
 * before the first full-attention layer (F), and through layer F's
 * attention among its own rows; every question still runs layers [F, L)
 * over its whole prompt, its prefix rows attending in layer F to its new
 * keys only. tokens_computed counts the former, token_layers the work of
 * both in whole layers (layer F counted as unshared).
 *
 * Locking: one mutex (s->mu) guards the queue, the requests' counters,
 * deadlines and stats. Forward passes run unlocked; a question's result
 * slot is written only by the worker that runs it, and done is called
 * after the last question's bookkeeping, outside the lock.
 */
#include "engine.h"
#include "eng_answer_int.h"
#include "eng_fwd_int.h"
#include "eng_rcache_int.h"
#include "npu.h"

#include <pthread.h>

/* Shared segments shorter than this run once per question instead of
 * costing a state copy. */
#define MIN_SHARE 4
/* Prefix states alive on one worker's trie path at most (memory bound). */
#define MAX_DEPTH 4
/* Rows of one batched pass of short questions at most: a few chunks, so
 * that their activations stay small (eng_model_forward_batch). */
#define SCHED_BATCH_ROWS (4 * ENG_FWD_CHUNK)

#define HEAD_TEXT_START "<|im_start|>user\nState:\n"

const unsigned ENG_SCHED_BATCH_LE[7] = {1, 2, 4, 8, 16, 32, 0};

/* One take of n questions into the batch-size histogram. @locks s->mu held */
static void batch_note(eng_sched_stats_t *st, size_t n) {
    for (size_t i = 0; i < 7; i++)
        if (ENG_SCHED_BATCH_LE[i] == 0 || n <= ENG_SCHED_BATCH_LE[i])
            st->batches[i]++;
    st->batch_questions += n;
}

typedef struct sreq sreq_t;

/* One queued question: ids owned, results go to r->ans. */
typedef struct squ {
    sreq_t       *r;
    size_t        p, i;  /* part and question index */
    int32_t      *ids;   /* (n) */
    size_t        n;     /* ids */
    uint64_t      seq;   /* FIFO order, ties in sorting */
    struct squ   *next;  /* queue link */
    size_t        depth; /* tokens its state already holds (while running) */
    eng_profile_t prof;  /* its request's profile: a batch holds one */
    /* answer reuse (s->rc): the answer's key and option count; a leader
     * is in s->fl (chained by hnext) and answers for its followers (fol,
     * chained by fnext, each pointing back with lead) */
    unsigned char key[ENG_RCACHE_KEY];
    size_t        n_opt;
    struct squ   *hnext, *fol, *fnext, *lead;
    bool          leader, follower;
} squ_t;

struct sreq {
    sreq_t              *live_prev, *live_next; /* s->live, while admitted; under s->mu */
    sreq_t              *done_next;             /* on a list of requests to complete */
    const sch_request_t *req;
    eng_sched_done_fn    done;
    void                *user;
    eng_answers_t       *ans;
    eng_deadline_t       dl;        /* under s->mu */
    double               submit_ms; /* eng_now_ms at submit */
    eng_sched_class_t    cls;       /* its lane of the queue (eng_sched_submit_as) */
    bool                 started;   /* a forward ran: queue_ms is set */
    size_t               left;      /* questions not finished, under s->mu */
    squ_t               *qs;        /* (n_qs), in part order */
    size_t               n_qs;
    /* Admission (eng_sched_conf_t.max_jobs): job_left[p], questions of
     * part p not finished, under s->mu; job_tok[p], their prompt tokens,
     * released when the last one finishes. n_jobs: parts with a question. */
    size_t   *job_left;
    uint64_t *job_tok;
    size_t    n_jobs;
    uint64_t  tokens;
    svc_err_t err; /* the first failure; under s->mu */
    char      errstr[512];
    /* images: image k of the request (parts in order) is slot img_slot[k]
     * of reg, with img_tok[k] tokens; part p's are [img_first[p],
     * img_first[p + 1]). The request holds a reference on each. */
    eng_imgreg_t *reg;
    size_t        n_img; /* references taken */
    size_t       *img_slot, *img_tok, *img_first;
    unsigned char (*img_sha)[32]; /* image k's SHA-256 (the cache key's) */
};

struct eng_sched {
    const eng_package_t *pkg;
    const eng_model_t   *model;
    eng_imgreg_t        *reg; /* image slots, or NULL without a vision tower */
    bool                 noncausal;
    size_t               max_jobs, max_tokens, max_group, n_workers;
    size_t               bulk_max_jobs, bulk_max_tokens; /* ENG_SCHED_BULK's bounds */
    pthread_t           *threads;                        /* (n_workers) */
    struct wctx         *ctx;                            /* (n_workers) */
    size_t               n_threads;                      /* started */
    size_t               n_layers;                       /* the model's L */
    size_t               n_shared; /* layers a prefix state keeps per token (F or L) */
    eng_ids_t            head;     /* the constant head's ids */
    /* state after head under each profile, read-only (a state is continued
     * only by the profile's model view that made it): exact's at start,
     * another profile's when a batch of it first runs (head_ensure) */
    eng_fwd_state_t *head_st[ENG_PROFILE_COUNT];
    bool             head_tried[ENG_PROFILE_COUNT]; /* under head_mu */
    pthread_mutex_t  head_mu;

    /* answer reuse (eng_sched_conf_t.cache_entries), or rc NULL: the
     * cache (its own lock), the key's context, and under mu the questions
     * in flight that others may join (fl, fl_nb buckets of leaders by
     * key) and the leaders handed the work of one not answered, to be
     * queued (requeue, linked by next) */
    eng_rcache_t    *rc;
    eng_rcache_ctx_t rc_ctx;
    char            *identity;
    squ_t          **fl;
    size_t           fl_nb, fl_n;
    squ_t           *requeue;
    sreq_t          *cdone; /* completed by eng_sched_cancel, for a worker to call done */

    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    squ_t            *q_head[2], *q_tail[2]; /* FIFO per eng_sched_class_t, interactive first */
    sreq_t           *live; /* admitted requests not completed (eng_sched_cancel) */
    uint64_t          seq;
    bool              stopping;
    eng_sched_stats_t stats;
};

/* ---------------------------------------------------------------------
 * Requests
 * --------------------------------------------------------------------- */

static void sreq_free(sreq_t *r) {
    if (!r)
        return;
    for (size_t k = 0; k < r->n_img; k++)
        eng_imgreg_release(r->reg, r->img_slot[k]);
    free(r->img_slot);
    free(r->img_tok);
    free(r->img_first);
    free(r->img_sha);
    free(r->job_left);
    free(r->job_tok);
    for (size_t k = 0; k < r->n_qs; k++)
        free(r->qs[k].ids);
    free(r->qs);
    eng_answers_free(r->ans);
    free(r);
}

/* Calls done for a finished request and frees it. Unlocked. */
static void sreq_complete(sreq_t *r) {
    if (r->err) {
        r->done(r->user, NULL, r->err, r->errstr);
    } else {
        eng_answers_t *ans = r->ans;
        r->ans = NULL;
        r->done(r->user, ans, SVC_OK, NULL);
    }
    sreq_free(r);
}

/* More distinct images than the table holds (ENG_IMGREG_CAP): a bound of
 * ours, so the contract's 413 for a request too large (SPEC b.7), as for
 * too many image tokens (eng_answer_refuse_image_tokens), not a 500. */
static svc_err_t too_many_images(sch_error_t *reject, char *errstr, size_t errstr_size) {
    svc_errf(errstr, errstr_size,
             "the request shows more than %u distinct images, the most one request may show",
             ENG_IMGREG_CAP);
    if (reject)
        sch_error_set(reject, 413, "request_too_large", "%s", errstr);
    return SVC_ERR_INVALID;
}

/* Image i (of its part) of r's request into r's next slot: the slot held
 * for the same bytes (by this request or another: no decode), else the
 * image prepared (checked: a refused one fills reject) into a new one.
 * *distinct and *tokens count the slots new to this request. */
static svc_err_t sreq_image(eng_sched_t *s, sreq_t *r, const sch_image_t *img, size_t i,
                            size_t *distinct, size_t *tokens, sch_error_t *reject, char *errstr,
                            size_t errstr_size) {
    unsigned char sha[32];
    size_t       *slot = &r->img_slot[r->n_img], *tok = &r->img_tok[r->n_img];
    eng_profile_t p = eng_request_profile(r->req);
    eng_image_digest(img, sha);
    if (!eng_imgreg_ref(s->reg, sha, p, slot, tok)) {
        /* The header's size gives the tokens before any decode. */
        if (*tokens + eng_package_image_tokens(s->pkg, img->width, img->height) >
            ENG_REQ_MAX_IMAGE_TOKENS)
            return eng_answer_refuse_image_tokens(reject, errstr, errstr_size);
        eng_image_prep_t *prep = NULL;
        char              msg[384];
        svc_err_t         err = eng_image_prepare(s->model, img, &prep, msg, sizeof msg);
        if (err == SVC_ERR_INVALID)
            eng_answer_reject_image(reject, i, msg, errstr, errstr_size);
        else if (err)
            svc_errf(errstr, errstr_size, "images[%zu]: %s", i, msg);
        if (!err)
            err = eng_imgreg_acquire(s->reg, prep, p, *distinct, slot, tok);
        if (err == SVC_ERR_TOO_LARGE)
            return too_many_images(reject, errstr, errstr_size);
        if (err)
            return err;
    }
    bool seen = false; /* a slot this request holds already */
    for (size_t o = 0; o < r->n_img && !seen; o++)
        seen = r->img_slot[o] == *slot;
    memcpy(r->img_sha[r->n_img], sha, sizeof sha);
    r->n_img++; /* held from here: sreq_free releases it */
    if (!seen) {
        (*distinct)++;
        *tokens += *tok;
    }
    if (*tokens > ENG_REQ_MAX_IMAGE_TOKENS)
        return eng_answer_refuse_image_tokens(reject, errstr, errstr_size);
    return SVC_OK;
}

/* Every image of r's request held in a slot of s->reg (sreq_image). */
static svc_err_t sreq_images(eng_sched_t *s, sreq_t *r, sch_error_t *reject, char *errstr,
                             size_t errstr_size) {
    const sch_request_t *req = r->req;
    size_t               n = 0, np = sch_request_n_parts(req);
    for (size_t p = 0; p < np; p++)
        n += sch_request_part(req, p)->n_images;
    if (!n)
        return SVC_OK;
    r->reg = s->reg;
    r->img_slot = calloc(n, sizeof *r->img_slot);
    r->img_tok = calloc(n, sizeof *r->img_tok);
    r->img_first = calloc(np + 1, sizeof *r->img_first);
    r->img_sha = calloc(n, sizeof *r->img_sha);
    if (!r->img_slot || !r->img_tok || !r->img_first || !r->img_sha)
        return SVC_ERR_NOMEM;
    size_t    distinct = 0, tokens = 0;
    svc_err_t err = SVC_OK;
    for (size_t p = 0; p < np && !err; p++) {
        const sch_part_t *part = sch_request_part(req, p);
        r->img_first[p] = r->n_img;
        for (size_t i = 0; i < part->n_images && !err; i++)
            err = sreq_image(s, r, &part->images[i], i, &distinct, &tokens, reject, errstr,
                             errstr_size);
    }
    r->img_first[np] = r->n_img;
    return err;
}

/* Question i of part p of r's request (planned to run, prompt ids ids,
 * its images those of the part) keyed into key; true when the cache held
 * its answer, which it then has. */
static bool plan_cached(eng_sched_t *s, sreq_t *r, size_t p, size_t i, const eng_ids_t *ids,
                        unsigned char key[ENG_RCACHE_KEY]) {
    const sch_part_t *part = sch_request_part(r->req, p);
    size_t            n_opt = part->questions[i].n_options, k0 = r->img_first ? r->img_first[p] : 0;
    eng_rcache_ctx_t  ctx = s->rc_ctx;
    double            probs[ENG_N_CODES];
    ctx.profile = eng_request_profile(r->req);
    eng_rcache_key(&ctx, n_opt, ids->v, ids->n, part->n_images ? r->img_sha + k0 : NULL,
                   part->n_images ? r->img_tok + k0 : NULL, part->n_images, key);
    if (n_opt > ENG_N_CODES || !eng_rcache_get(s->rc, key, probs, n_opt))
        return false;
    eng_answers_put_probs(r->ans, p, i, probs, n_opt);
    return true;
}

/* Plans every valid question of req into r (eng_answer_plan); the ones
 * that reach the model become r->qs, their image placeholders expanded to
 * the tokens of r's image slots, except those the result cache answers. */
static svc_err_t sreq_plan(eng_sched_t *s, sreq_t *r, sch_error_t *reject, char *errstr,
                           size_t errstr_size) {
    const sch_request_t *req = r->req;
    size_t               n_valid = 0;
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t i = 0; i < part->n_questions; i++)
            n_valid += !part->questions[i].error_code;
    }
    size_t np = sch_request_n_parts(req);
    r->ans = eng_answers_new(req);
    r->qs = calloc(n_valid ? n_valid : 1, sizeof *r->qs);
    r->job_left = calloc(np ? np : 1, sizeof *r->job_left);
    r->job_tok = calloc(np ? np : 1, sizeof *r->job_tok);
    if (!r->ans || !r->qs || !r->job_left || !r->job_tok)
        return SVC_ERR_NOMEM;
    eng_prompt_t pr;
    eng_prompt_init(&pr);
    eng_ids_t ex = {0};
    svc_err_t err = SVC_OK;
    uint64_t  planned = 0, tokenized = 0; /* prompts that run; all, over-long ones too */
    for (size_t p = 0; !err && p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t i = 0; !err && i < part->n_questions; i++) {
            bool run = false;
            if (part->questions[i].error_code)
                continue;
            err = eng_answer_plan(s->pkg, req, p, i, r->ans, &pr, &run, errstr, errstr_size);
            /* A request that could never be queued stops here: without it
             * 2,000 questions on one long state held their ids (hundreds of
             * MB) and took seconds of tokenizing before any check. Prompts
             * over the length limit are answered, not queued (upstream's
             * max_length_exceeded), but their tokenizing is bounded too. */
            planned += !err && run ? pr.n_tokens : 0;
            tokenized += err ? 0 : pr.n_tokens;
            if (!err && planned > s->max_tokens) { /* SPEC b.7's 429 */
                svc_errf(errstr, errstr_size,
                         "the request's prompts hold more than %llu tokens, more than "
                         "--max-queued-tokens allows queued at once",
                         (unsigned long long)s->max_tokens);
                if (reject)
                    sch_error_set(reject, 429, "overloaded", "%s; it cannot be queued", errstr);
                err = SVC_ERR_TOO_LARGE;
            } else if (!err && tokenized > ENG_REQ_MAX_TOKENIZED) {
                svc_errf(errstr, errstr_size,
                         "the request's prompts hold more than %u tokens in all (those over the "
                         "length limit included), the most one request may have read",
                         ENG_REQ_MAX_TOKENIZED);
                if (reject)
                    sch_error_set(reject, 413, "request_too_large", "%s", errstr);
                err = SVC_ERR_TOO_LARGE;
            }
            if (err || !run)
                continue;
            unsigned char key[ENG_RCACHE_KEY];
            if (s->rc && plan_cached(s, r, p, i, &pr.ids, key))
                continue;
            const eng_ids_t *ids = &pr.ids;
            if (part->n_images) {
                err = eng_answer_expand(&pr, eng_model_image_token_id(s->model),
                                        r->img_slot + r->img_first[p], r->img_tok + r->img_first[p],
                                        part->n_images, &ex, errstr, errstr_size);
                if (err)
                    break;
                ids = &ex;
            }
            squ_t *q = &r->qs[r->n_qs];
            q->ids = malloc(ids->n * sizeof *q->ids);
            if (!q->ids) {
                err = SVC_ERR_NOMEM;
                break;
            }
            memcpy(q->ids, ids->v, ids->n * sizeof *q->ids);
            q->n = ids->n;
            q->r = r;
            q->p = p;
            q->i = i;
            q->prof = eng_request_profile(r->req);
            q->n_opt = part->questions[i].n_options;
            if (s->rc)
                memcpy(q->key, key, sizeof key);
            r->n_qs++;
            r->n_jobs += r->job_left[p]++ == 0;
            r->job_tok[p] += q->n;
            r->tokens += q->n;
        }
    }
    eng_prompt_fini(&pr);
    free(ex.v);
    return err;
}

/* ---------------------------------------------------------------------
 * Running a batch
 * --------------------------------------------------------------------- */

/* A question waiting to run its tokens past depth from st (NULL: from
 * empty), read-only. share_ms: its part of the prefix time; lone: no
 * prefix state was run for it (it counts as a group). */
typedef struct leaf {
    squ_t                 *q;
    const eng_fwd_state_t *st;
    size_t                 depth, rows;
    double                 share_ms;
    bool                   lone, skip;
} leaf_t;

/* Per-worker buffers. */
typedef struct wctx {
    eng_sched_t       *s;
    const eng_model_t *model; /* the batch's profile's view of s->model */
    eng_profile_t      prof;
    float             *hidden; /* (max_group, hidden_size) final hidden states */
    sreq_t            *done;   /* requests finished by this batch, to complete unlocked */
    leaf_t            *pend;   /* (max_group) questions to run in one batched pass */
    eng_fwd_seq_t     *seqs;   /* (max_group) */
    size_t             n_pend, pend_rows;
    char               errstr[512];
} wctx_t;

/* r is no longer found by eng_sched_cancel. @locks s->mu held. */
static void live_unlink_locked(eng_sched_t *s, sreq_t *r) {
    if (r->live_prev)
        r->live_prev->live_next = r->live_next;
    else
        s->live = r->live_next;
    if (r->live_next)
        r->live_next->live_prev = r->live_prev;
    r->live_prev = r->live_next = NULL;
}

/* ---- the questions in flight that others may join (s->fl) ---- */

/* The leader in flight with key, or NULL. @locks s->mu held. */
static squ_t *fl_find_locked(const eng_sched_t *s, const unsigned char *key) {
    squ_t *q = s->fl[eng_rcache_bucket(key, s->fl_nb)];
    while (q && memcmp(q->key, key, ENG_RCACHE_KEY) != 0)
        q = q->hnext;
    return q;
}

/* q leads from here: in s->fl (whose buckets double once the leaders
 * outnumber them; without memory they stay, chains longer). @locks s->mu held. */
static void fl_insert_locked(eng_sched_t *s, squ_t *q) {
    if (s->fl_n >= s->fl_nb) {
        size_t  nb = s->fl_nb * 2;
        squ_t **b = calloc(nb, sizeof *b);
        for (size_t i = 0; b && i < s->fl_nb; i++)
            for (squ_t *e = s->fl[i], *nx; e; e = nx) {
                nx = e->hnext;
                e->hnext = b[eng_rcache_bucket(e->key, nb)];
                b[eng_rcache_bucket(e->key, nb)] = e;
            }
        if (b) {
            free(s->fl);
            s->fl = b;
            s->fl_nb = nb;
        }
    }
    squ_t **head = &s->fl[eng_rcache_bucket(q->key, s->fl_nb)];
    q->hnext = *head;
    *head = q;
    q->leader = true;
    s->fl_n++;
}

static void fl_remove_locked(eng_sched_t *s, squ_t *q) {
    squ_t **link = &s->fl[eng_rcache_bucket(q->key, s->fl_nb)];
    while (*link != q)
        link = &(*link)->hnext;
    *link = q->hnext;
    q->hnext = NULL;
    q->leader = false;
    s->fl_n--;
}

/* f joins leader l's answer (last in line). @locks s->mu held. */
static void join_locked(squ_t *l, squ_t *f) {
    squ_t **link = &l->fol;
    while (*link)
        link = &(*link)->fnext;
    *link = f;
    f->fnext = NULL;
    f->lead = l;
    f->follower = true;
}

/* f leaves its leader's line. @locks s->mu held. */
static void unjoin_locked(squ_t *f) {
    squ_t **link = &f->lead->fol;
    while (*link != f)
        link = &(*link)->fnext;
    *link = f->fnext;
    f->fnext = f->lead = NULL;
    f->follower = false;
}

static void finish_locked(eng_sched_t *s, sreq_t **done, squ_t *q, const double *probs);

/* Leader q finished: answered (probs), its followers get the same
 * probabilities; not answered (probs NULL), the first follower whose
 * request is still live leads the rest and is queued again (through
 * s->requeue: requeue_locked appends it where the queue is whole), the
 * dead ones before it finish. @locks s->mu held. */
static void release_locked(eng_sched_t *s, sreq_t **done, squ_t *q, const double *probs) {
    fl_remove_locked(s, q);
    while (q->fol) {
        squ_t *f = q->fol;
        unjoin_locked(f);
        bool dead = f->r->err || f->r->dl.expired;
        if (!probs && !dead) {
            f->fol = q->fol;
            q->fol = NULL;
            for (squ_t *g = f->fol; g; g = g->fnext)
                g->lead = f;
            fl_insert_locked(s, f);
            f->next = s->requeue;
            s->requeue = f;
            return;
        }
        if (probs && !f->r->err)
            eng_answers_put_probs(f->r->ans, f->p, f->i, probs, f->n_opt);
        else if (!f->r->err)
            eng_answers_put_deadline(f->r->ans, f->p, f->i);
        finish_locked(s, done, f, NULL);
    }
}

/* q at the tail of lane c. @locks s->mu held. */
static void lane_push_to_locked(eng_sched_t *s, squ_t *q, eng_sched_class_t c) {
    q->next = NULL;
    if (s->q_tail[c])
        s->q_tail[c]->next = q;
    else
        s->q_head[c] = q;
    s->q_tail[c] = q;
}

/* q at the tail of its request's lane. @locks s->mu held. */
static void lane_push_locked(eng_sched_t *s, squ_t *q) {
    lane_push_to_locked(s, q, q->r->cls);
}

/* An interactive question joined bulk leader l: l, if still queued in the
 * bulk lane, moves to the interactive lane's tail, so that the question
 * does not wait behind the backlog. @locks s->mu held. */
static void promote_locked(eng_sched_t *s, squ_t *l) {
    squ_t **link = &s->q_head[ENG_SCHED_BULK], *prev = NULL;
    while (*link && *link != l)
        prev = *link, link = &(*link)->next;
    if (!*link) /* running already, or queued interactive */
        return;
    *link = l->next;
    if (s->q_tail[ENG_SCHED_BULK] == l)
        s->q_tail[ENG_SCHED_BULK] = prev;
    lane_push_to_locked(s, l, ENG_SCHED_INTERACTIVE);
}

static bool queue_empty_locked(const eng_sched_t *s) {
    return !s->q_head[ENG_SCHED_INTERACTIVE] && !s->q_head[ENG_SCHED_BULK];
}

/* The leaders handed work (release_locked) at their lanes' tails. Called
 * after finish_locked, before s->mu is let go. @locks s->mu held. */
static void requeue_locked(eng_sched_t *s) {
    if (!s->requeue)
        return;
    while (s->requeue) {
        squ_t *q = s->requeue;
        s->requeue = q->next;
        lane_push_locked(s, q);
    }
    pthread_cond_broadcast(&s->cv);
}

/* Question q finished (answered with probs, or skipped or failed: NULL);
 * a request whose last question it was goes on *done. @locks s->mu held. */
static void finish_locked(eng_sched_t *s, sreq_t **done, squ_t *q, const double *probs) {
    s->stats.queued--;
    if (--q->r->job_left[q->p] == 0) { /* its job is answered */
        s->stats.queued_jobs--;
        s->stats.queued_tokens -= q->r->job_tok[q->p];
    }
    if (q->leader)
        release_locked(s, done, q, probs);
    if (--q->r->left == 0) {
        s->stats.requests++;
        live_unlink_locked(s, q->r);
        q->r->done_next = *done;
        *done = q->r;
    }
}

/* Records the first failure of q's request. @locks s->mu held. */
static bool sreq_fail_locked(sreq_t *r, svc_err_t err, const char *errstr) {
    if (r->err)
        return false;
    r->err = err;
    snprintf(r->errstr, sizeof r->errstr, "%s", errstr);
    return true;
}

static void fail_locked(squ_t *q, svc_err_t err, const char *errstr) {
    (void)sreq_fail_locked(q->r, err, errstr);
}

static void complete_list(sreq_t *done) {
    while (done) {
        sreq_t *r = done;
        done = r->done_next;
        sreq_complete(r);
    }
}

static void complete_unlocked(wctx_t *w) {
    sreq_t *done = w->done;
    w->done = NULL;
    complete_list(done);
}

/* Whether lf's question is still to run: its request has not failed and
 * its deadline has not passed (else it gets deadline_exceeded). Marks the
 * request started. Its followers' deadlines are checked here too (their
 * pass is this one): those passed get deadline_exceeded and leave.
 * @locks takes s->mu */
static bool leaf_live(wctx_t *w, const leaf_t *lf) {
    eng_sched_t *s = w->s;
    sreq_t      *r = lf->q->r;
    pthread_mutex_lock(&s->mu);
    for (squ_t *f = lf->q->fol, *nx; f; f = nx) {
        nx = f->fnext;
        if (!f->r->err && !eng_deadline_passed(&f->r->dl))
            continue;
        unjoin_locked(f);
        if (!f->r->err)
            eng_answers_put_deadline(f->r->ans, f->p, f->i);
        finish_locked(s, &w->done, f, NULL);
    }
    bool live = r->err == SVC_OK;
    if (live && eng_deadline_passed(&r->dl)) {
        eng_answers_put_deadline(r->ans, lf->q->p, lf->q->i);
        live = false;
    }
    if (live && !r->started) {
        r->started = true;
        eng_answers_stats_mut(r->ans)->queue_ms = eng_now_ms() - r->submit_ms;
    }
    pthread_mutex_unlock(&s->mu);
    return live;
}

static const eng_media_t *sched_media(const eng_sched_t *s) {
    return s->reg ? eng_imgreg_media(s->reg) : NULL;
}

/* lf's pass on its own into hidden; w->errstr names the question on error. */
static svc_err_t leaf_forward(wctx_t *w, const leaf_t *lf, float *hidden) {
    eng_sched_t *s = w->s;
    squ_t       *q = lf->q;
    w->errstr[0] = '\0';
    svc_err_t err = eng_model_forward_media(
        w->model, (eng_fwd_state_t *)lf->st, false, q->ids + lf->depth, q->n - lf->depth,
        sched_media(s), s->noncausal, hidden, NULL, NULL, w->errstr, sizeof w->errstr);
    if (err)
        eng_answer_blame(&sch_request_part(q->r->req, q->p)->questions[q->i], w->errstr,
                         sizeof w->errstr);
    return err;
}

/* After lf's pass (err: its failure) or its skip: the readout from hidden
 * and the bookkeeping. dt: its part of the pass's time. */
static void leaf_finish(wctx_t *w, const leaf_t *lf, svc_err_t err, const float *hidden,
                        double dt) {
    eng_sched_t  *s = w->s;
    squ_t        *q = lf->q;
    sreq_t       *r = q->r;
    const double *probs = NULL;
    if (!lf->skip && !err) {
        double t0 = eng_now_ms();
        err = eng_answers_put_hidden(r->ans, s->pkg, s->model, r->req, q->p, q->i, hidden,
                                     w->errstr, sizeof w->errstr);
        dt += eng_now_ms() - t0;
        probs = err ? NULL : eng_answers_probs(r->ans, q->p, q->i);
        if (probs && s->rc) /* before the lock: the cache has its own */
            eng_rcache_put(s->rc, q->key, probs, q->n_opt);
    }
    pthread_mutex_lock(&s->mu);
    if (err) {
        fail_locked(q, err, w->errstr);
    } else if (!lf->skip) {
        eng_answer_stats_t *st_ = eng_answers_stats_mut(r->ans);
        st_->forward_ms += dt + lf->share_ms;
        st_->n_forward++;
        s->stats.questions++;
        s->stats.tokens += q->n;
        s->stats.tokens_computed += q->n - lf->depth;
        s->stats.token_layers +=
            (q->n - lf->depth) * s->n_shared + q->n * (s->n_layers - s->n_shared);
        s->stats.groups += lf->lone;
    }
    finish_locked(s, &w->done, q, probs);
    requeue_locked(s);
    pthread_mutex_unlock(&s->mu);
}

/* Runs the pending questions: those still live in one batched pass
 * (eng_model_forward_batch), each with its own state, so that the
 * projections read each weight once for all of them. If the batch fails
 * (memory), each runs on its own, so that a failure is its question's. */
static void leaf_flush(wctx_t *w) {
    eng_sched_t *s = w->s;
    size_t       H = eng_model_hidden_size(s->model), n = 0, rows = 0;
    for (size_t k = 0; k < w->n_pend; k++) {
        leaf_t *lf = &w->pend[k];
        lf->skip = !leaf_live(w, lf);
        if (lf->skip)
            continue;
        w->seqs[n++] = (eng_fwd_seq_t){lf->st, lf->q->ids + lf->depth, lf->q->n - lf->depth,
                                       w->hidden + k * H};
        rows += lf->rows;
    }
    double    t0 = eng_now_ms();
    svc_err_t err = SVC_ERR_INVALID;
    if (n > 1)
        err = eng_model_forward_batch(w->model, w->seqs, n, sched_media(s), s->noncausal, w->errstr,
                                      sizeof w->errstr);
    double dt = eng_now_ms() - t0;
    pthread_mutex_lock(&s->mu);
    s->stats.passes += err ? n : 1;
    pthread_mutex_unlock(&s->mu);
    for (size_t k = 0; k < w->n_pend; k++) {
        leaf_t   *lf = &w->pend[k];
        svc_err_t e = SVC_OK;
        double    share = rows ? dt * (double)lf->rows / (double)rows : 0;
        if (!lf->skip && err) {
            double t1 = eng_now_ms();
            e = leaf_forward(w, lf, w->hidden + k * H);
            share = eng_now_ms() - t1;
        }
        leaf_finish(w, lf, e, w->hidden + k * H, share);
    }
    w->n_pend = 0;
    w->pend_rows = 0;
    complete_unlocked(w);
}

/* Question q, to run its tokens past depth from st: queued for the next
 * batched pass when it is short, flushing first when the batch would pass
 * SCHED_BATCH_ROWS rows. A question of ENG_FWD_CHUNK rows or more gains
 * nothing from company (its own chunks are full) and runs at once. Rows:
 * what the pass runs, P + T for a noncausal state's layers [F, L). */
static void run_leaf(wctx_t *w, squ_t *q, const eng_fwd_state_t *st, size_t depth, double share_ms,
                     bool lone) {
    eng_sched_t *s = w->s;
    size_t       rows = q->n - (s->noncausal ? 0 : depth);
    if (rows + w->pend_rows > SCHED_BATCH_ROWS || w->n_pend == s->max_group)
        leaf_flush(w);
    w->pend[w->n_pend++] = (leaf_t){q, st, depth, rows, share_ms, lone, false};
    w->pend_rows += rows;
    if (rows >= ENG_FWD_CHUNK)
        leaf_flush(w);
}

/* Tokens a and b share, at most min(n) - 1 (each keeps its last token). */
static size_t lcp(const squ_t *a, const squ_t *b) {
    size_t n = (a->n < b->n ? a->n : b->n) - 1, k = 0;
    while (k < n && a->ids[k] == b->ids[k])
        k++;
    return k;
}

static int cmp_ids(const void *pa, const void *pb) {
    const squ_t *a = *(const squ_t *const *)pa, *b = *(const squ_t *const *)pb;
    size_t       n = a->n < b->n ? a->n : b->n;
    for (size_t k = 0; k < n; k++)
        if (a->ids[k] != b->ids[k])
            return a->ids[k] < b->ids[k] ? -1 : 1;
    if (a->n != b->n)
        return a->n < b->n ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Questions v[0..n-1] (sorted; lc[k] = lcp(v[k], v[k+1])), all sharing
 * st's depth tokens: the trie walk described at the top of the file. */
static void run_range(wctx_t *w, squ_t **v, const size_t *lc, size_t n, const eng_fwd_state_t *st,
                      size_t depth, int levels, double share_ms, bool in_node) {
    eng_sched_t *s = w->s;
    if (n == 1) {
        run_leaf(w, v[0], st, depth, share_ms, !in_node);
        return;
    }
    size_t D = SIZE_MAX;
    for (size_t k = 0; k + 1 < n; k++)
        D = lc[k] < D ? lc[k] : D;
    eng_fwd_state_t *own = NULL;
    if (levels > 0 && D >= depth + MIN_SHARE) {
        /* the segment depth..D once, into a copy of the parent's state */
        double    t0 = eng_now_ms();
        svc_err_t err = SVC_ERR_NOMEM;
        w->errstr[0] = '\0';
        own = st ? eng_fwd_state_clone(st) : eng_fwd_state_new(w->model, s->noncausal);
        if (own) /* no final_last: a noncausal pass stops at layer F */
            err = eng_model_forward_media(w->model, own, true, v[0]->ids + depth, D - depth,
                                          s->reg ? eng_imgreg_media(s->reg) : NULL, s->noncausal,
                                          NULL, NULL, NULL, w->errstr, sizeof w->errstr);
        if (err) {
            if (err == SVC_ERR_NOMEM && !w->errstr[0])
                svc_errf(w->errstr, sizeof w->errstr, "out of memory for a prefix state");
            eng_answer_blame(&sch_request_part(v[0]->r->req, v[0]->p)->questions[v[0]->i],
                             w->errstr, sizeof w->errstr);
            eng_fwd_state_free(own);
            pthread_mutex_lock(&s->mu);
            for (size_t k = 0; k < n; k++) {
                fail_locked(v[k], err, w->errstr);
                finish_locked(s, &w->done, v[k], NULL);
            }
            requeue_locked(s);
            pthread_mutex_unlock(&s->mu);
            complete_unlocked(w);
            return;
        }
        share_ms += (eng_now_ms() - t0) / (double)n;
        pthread_mutex_lock(&s->mu);
        s->stats.groups++;
        s->stats.tokens_computed += D - depth;
        s->stats.token_layers += (D - depth) * s->n_shared;
        pthread_mutex_unlock(&s->mu);
        st = own;
        depth = D;
        levels--;
        in_node = true;
    }
    /* children: maximal runs whose neighbours share more than D */
    for (size_t a = 0; a < n;) {
        size_t b = a + 1;
        while (b < n && lc[b - 1] > D)
            b++;
        run_range(w, v + a, lc + a, b - a, st, depth, levels, share_ms, in_node);
        a = b;
    }
    if (own)
        leaf_flush(w); /* pending questions may read own */
    eng_fwd_state_free(own);
}

/* The head's state under profile p into s->head_st[p] (nothing when the
 * head is empty or no layer keeps a state: F = 0), counted as computed. */
static svc_err_t head_run(eng_sched_t *s, eng_profile_t p, char *errstr, size_t errstr_size) {
    s->head_tried[p] = true;
    if (s->head.n == 0 || s->n_shared == 0)
        return SVC_OK;
    const eng_model_t *m = eng_model_profile(s->model, p);
    eng_fwd_state_t   *st = eng_fwd_state_new(m, s->noncausal);
    svc_err_t err = st ? eng_model_forward_from(m, st, true, s->head.v, s->head.n, s->noncausal,
                                                NULL, NULL, NULL, errstr, errstr_size)
                       : SVC_ERR_NOMEM;
    if (err) {
        eng_fwd_state_free(st);
        return err;
    }
    pthread_mutex_lock(&s->mu);
    s->head_st[p] = st;
    s->stats.tokens_computed += s->head.n;
    s->stats.token_layers += s->head.n * s->n_shared;
    pthread_mutex_unlock(&s->mu);
    return SVC_OK;
}

/* The head's state for a batch of profile p: made by the first batch of a
 * profile other than exact, so that the other costs nothing until asked
 * for. If that fails, the batches run without it (slower, same answers). */
static void head_ensure(wctx_t *w) {
    eng_sched_t *s = w->s;
    pthread_mutex_lock(&s->head_mu);
    if (!s->head_tried[w->prof])
        (void)head_run(s, w->prof, w->errstr, sizeof w->errstr);
    pthread_mutex_unlock(&s->head_mu);
}

static bool starts_with_head(const eng_sched_t *s, const squ_t *q) {
    return s->head_st[q->prof] && q->n > s->head.n &&
           memcmp(q->ids, s->head.v, s->head.n * sizeof *q->ids) == 0;
}

/* A batch of n questions taken from the queue. */
static void run_batch(wctx_t *w, squ_t **v, size_t n, size_t *lc) {
    eng_sched_t *s = w->s;
    head_ensure(w);
    qsort(v, n, sizeof *v, cmp_ids);
    for (size_t k = 0; k + 1 < n; k++)
        lc[k] = lcp(v[k], v[k + 1]);
    /* the questions that start with the head are contiguous in id order */
    for (size_t a = 0; a < n;) {
        bool   head = starts_with_head(s, v[a]);
        size_t b = a + 1;
        while (b < n && starts_with_head(s, v[b]) == head)
            b++;
        run_range(w, v + a, lc + a, b - a, head ? s->head_st[w->prof] : NULL, head ? s->head.n : 0,
                  s->n_shared ? MAX_DEPTH : 0, 0, false);
        a = b;
    }
    leaf_flush(w);
}

/* Encodes (or waits for) the images of the taken questions v[0..n-1];
 * a question whose image failed fails its request and leaves v. Returns
 * the questions left. Unlocked on entry and exit. */
static size_t images_ready(wctx_t *w, squ_t **v, size_t n) {
    eng_sched_t *s = w->s;
    size_t       kept = 0;
    for (size_t k = 0; k < n; k++) {
        sreq_t   *r = v[k]->r;
        svc_err_t err = SVC_OK;
        size_t    here = 0;
        double    t0 = eng_now_ms();
        for (size_t i = 0; !err && i < r->n_img; i++) {
            bool enc = false;
            w->errstr[0] = '\0';
            err = eng_imgreg_ready(s->reg, r->img_slot[i], &enc, w->errstr, sizeof w->errstr);
            here += enc;
        }
        pthread_mutex_lock(&s->mu);
        if (here) {
            eng_answer_stats_t *st = eng_answers_stats_mut(r->ans);
            st->images_encoded += here;
            st->vision_ms += eng_now_ms() - t0;
            s->stats.images_encoded += here;
        }
        if (err) {
            eng_answer_blame(&sch_request_part(r->req, v[k]->p)->questions[v[k]->i], w->errstr,
                             sizeof w->errstr);
            fail_locked(v[k], err, w->errstr);
            finish_locked(s, &w->done, v[k], NULL);
            requeue_locked(s);
        } else
            v[kept++] = v[k];
        pthread_mutex_unlock(&s->mu);
    }
    complete_unlocked(w);
    return kept;
}

/* The walk of take_batch_locked over the queue's lanes: its counts are
 * shared by both lanes. */
typedef struct take {
    size_t n, finished, passed;
    bool   have_prof;
} take_t;

/* take_batch_locked over lane c. @locks s->mu held. */
static void take_lane_locked(wctx_t *w, squ_t **v, eng_sched_class_t c, take_t *t) {
    eng_sched_t *s = w->s;
    squ_t      **link = &s->q_head[c], *kept = NULL; /* kept: the last question left queued */
    /* finish at most max_group, and pass over a bounded number of the
     * other profile's, so that the lock is held briefly */
    while (*link && t->n < s->max_group && t->finished < s->max_group &&
           t->passed < 4 * s->max_group) {
        squ_t *q = *link;
        if (q->r->err || q->r->dl.expired) { /* known without reading the clock */
            *link = q->next;
            if (!q->r->err)
                eng_answers_put_deadline(q->r->ans, q->p, q->i);
            finish_locked(s, &w->done, q, NULL);
            t->finished++;
            continue;
        }
        if (!t->have_prof)
            w->prof = q->prof, t->have_prof = true;
        if (q->prof != w->prof) { /* another pass takes it: profiles never share one */
            kept = q;
            link = &q->next;
            t->passed++;
            continue;
        }
        *link = q->next;
        v[t->n++] = q;
    }
    if (!*link) /* walked to the end: the tail is the last question left */
        s->q_tail[c] = kept;
}

/* Takes up to max_group questions of one profile (the first live one's)
 * off the queue into v, the interactive lane's before the bulk lane's,
 * each in queue order; the others stay queued in order. Questions of
 * failed or expired requests are finished on the way. Returns how many
 * were taken and sets w's model to that profile's. @locks s->mu held. */
static size_t take_batch_locked(wctx_t *w, squ_t **v) {
    eng_sched_t *s = w->s;
    take_t       t = {0};
    take_lane_locked(w, v, ENG_SCHED_INTERACTIVE, &t);
    take_lane_locked(w, v, ENG_SCHED_BULK, &t);
    requeue_locked(s); /* the leaders handed work by the ones finished here */
    w->model = eng_model_profile(s->model, w->prof);
    return t.n;
}

static void *worker_main(void *arg) {
    wctx_t      *w = arg;
    eng_sched_t *s = w->s;
    squ_t      **v = malloc(s->max_group * sizeof *v);
    size_t      *lc = malloc(s->max_group * sizeof *lc);
    SVC_ASSERT(v && lc && w->hidden && w->pend && w->seqs);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (queue_empty_locked(s) && !s->cdone && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        sreq_t *cd = s->cdone;
        s->cdone = NULL;
        if (queue_empty_locked(s) && !cd) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        size_t n = !queue_empty_locked(s) ? take_batch_locked(w, v) : 0;
        if (n)
            batch_note(&s->stats, n);
        pthread_mutex_unlock(&s->mu);
        complete_list(cd);
        complete_unlocked(w);
        if (n && s->reg)
            n = images_ready(w, v, n);
        if (n)
            run_batch(w, v, n, lc);
    }
    free(v);
    free(lc);
    return NULL;
}

/* ---------------------------------------------------------------------
 * Public API
 * --------------------------------------------------------------------- */

/* The ids of every prompt's constant head (SPEC c.1), taken from a
 * rendered probe prompt up to and including "<|im_start|>user\nState:\n",
 * and its state. A head that does not tokenize to a prefix of real
 * prompts' ids is harmless: the exact comparison never matches. */
static svc_err_t head_init(eng_sched_t *s, char *errstr, size_t errstr_size) {
    static const char probe[] =
        "{\"state\": \"x\", \"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"x\"}}}";
    sch_limits_t   limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    e;
    eng_prompt_t   pr;
    sch_error_init(&e);
    eng_prompt_init(&pr);
    svc_err_t err = sch_request_decode(probe, sizeof probe - 1, &limits, NULL, &req, &e);
    if (!err) {
        const sch_part_t *part = sch_request_part(req, 0);
        err = eng_prompt_render(s->pkg, part, &part->questions[0], &pr, errstr, errstr_size);
    }
    const char *at = err ? NULL : strstr(pr.text.data, HEAD_TEXT_START);
    if (at)
        err = eng_tokenizer_encode(eng_package_tokenizer(s->pkg), pr.text.data,
                                   (size_t)(at - pr.text.data) + strlen(HEAD_TEXT_START), &s->head);
    if (!err && at)
        err = head_run(s, ENG_PROFILE_EXACT, errstr, errstr_size);
    if (err && errstr_size && !errstr[0])
        svc_errf(errstr, errstr_size, "scheduler: the prompt head: %s", svc_err_name(err));
    eng_prompt_fini(&pr);
    sch_error_fini(&e);
    sch_request_free(req);
    return err;
}

/* A worker's buffers for batches of up to max_group questions. */
static bool wctx_init(wctx_t *w, eng_sched_t *s) {
    w->s = s;
    w->hidden = malloc(s->max_group * eng_model_hidden_size(s->model) * sizeof *w->hidden);
    w->pend = malloc(s->max_group * sizeof *w->pend);
    w->seqs = malloc(s->max_group * sizeof *w->seqs);
    return w->hidden && w->pend && w->seqs;
}

static void wctx_fini(wctx_t *w) {
    free(w->hidden);
    free(w->pend);
    free(w->seqs);
    w->hidden = NULL;
    w->pend = NULL;
    w->seqs = NULL;
}

/* The result cache and the table of joins (eng_sched_conf_t.cache_entries). */
static bool reuse_init(eng_sched_t *s, const eng_sched_conf_t *conf) {
    const char *id = conf->identity ? conf->identity : eng_package_model_id(s->pkg);
    s->identity = strdup(id ? id : "");
    s->rc = eng_rcache_new(conf->cache_entries,
                           conf->cache_bytes ? conf->cache_bytes : ENG_SCHED_CACHE_BYTES);
    s->fl_nb = 256;
    s->fl = calloc(s->fl_nb, sizeof *s->fl);
    s->rc_ctx = (eng_rcache_ctx_t){.identity = s->identity,
                                   .temperature = eng_package_temperature(s->pkg),
                                   .noncausal = s->noncausal,
                                   .readout_bf16 = eng_package_readout_bf16(s->pkg)};
    if (s->identity && s->rc && s->fl)
        return true;
    eng_rcache_free(s->rc);
    free(s->fl);
    free(s->identity);
    s->rc = NULL;
    s->fl = NULL;
    s->identity = NULL;
    return false;
}

static void sched_stop(eng_sched_t *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (size_t k = 0; k < s->n_threads; k++)
        pthread_join(s->threads[k], NULL);
    s->n_threads = 0;
}

void eng_sched_free(eng_sched_t *s) {
    if (!s)
        return;
    size_t n = s->n_threads;
    sched_stop(s);
    for (size_t k = 0; s->ctx && k < n; k++)
        wctx_fini(&s->ctx[k]);
    free(s->ctx);
    for (size_t p = 0; p < ENG_PROFILE_COUNT; p++)
        eng_fwd_state_free(s->head_st[p]);
    eng_imgreg_free(s->reg);
    eng_rcache_free(s->rc);
    free(s->fl);
    free(s->identity);
    eng_ids_fini(&s->head);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->head_mu);
    free(s->threads);
    free(s);
}

/* A bound for the bulk lane: bound less 1 / share of it (share 0: all of
 * it), never below 1. */
static size_t bulk_bound(size_t bound, size_t share) {
    size_t b = share ? bound - bound / share : bound;
    return b ? b : 1;
}

svc_err_t eng_sched_new(const eng_package_t *pkg, const eng_model_t *model,
                        const eng_sched_conf_t *conf, eng_sched_t **out, char *errstr,
                        size_t errstr_size) {
    *out = NULL;
    eng_sched_t *s = calloc(1, sizeof *s);
    if (!s) {
        svc_errf(errstr, errstr_size, "out of memory for the scheduler");
        return SVC_ERR_NOMEM;
    }
    s->pkg = pkg;
    s->model = model;
    s->noncausal = eng_package_noncausal(pkg);
    s->n_layers = eng_fwd_shared_layers(model, false);
    s->n_shared = eng_fwd_shared_layers(model, s->noncausal);
    s->n_workers = conf->n_workers;
    if (!s->n_workers) {
        int n = npu_probe()->n_cpus;
        s->n_workers = n > 0 ? (size_t)n : 1;
    }
    s->max_jobs = conf->max_jobs ? conf->max_jobs : ENG_SCHED_MAX_JOBS;
    s->max_tokens = conf->max_tokens ? conf->max_tokens : ENG_SCHED_MAX_TOKENS;
    s->bulk_max_jobs = bulk_bound(s->max_jobs, conf->interactive_share);
    s->bulk_max_tokens = bulk_bound(s->max_tokens, conf->interactive_share);
    s->max_group = conf->max_group ? conf->max_group : 32;
    if (eng_model_has_vision(model)) {
        s->reg = eng_imgreg_new(model, conf->max_images ? conf->max_images : 32);
        if (!s->reg) {
            free(s);
            svc_errf(errstr, errstr_size, "out of memory for the scheduler");
            return SVC_ERR_NOMEM;
        }
    }
    if (conf->cache_entries && !reuse_init(s, conf)) {
        eng_imgreg_free(s->reg);
        free(s);
        svc_errf(errstr, errstr_size, "out of memory for the scheduler");
        return SVC_ERR_NOMEM;
    }
    eng_ids_init(&s->head);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->head_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->threads = calloc(s->n_workers, sizeof *s->threads);
    s->ctx = calloc(s->n_workers, sizeof *s->ctx);
    svc_err_t err = s->threads && s->ctx ? SVC_OK : SVC_ERR_NOMEM;
    if (!err)
        err = head_init(s, errstr, errstr_size);
    for (size_t k = 0; !err && k < s->n_workers; k++) {
        wctx_t *w = &s->ctx[k];
        w->s = s;
        if (!wctx_init(w, s)) {
            wctx_fini(w);
            err = SVC_ERR_NOMEM;
            break;
        }
        if (pthread_create(&s->threads[k], NULL, worker_main, w) != 0) {
            wctx_fini(w);
            svc_errf(errstr, errstr_size, "scheduler: pthread_create failed for worker %zu", k);
            err = SVC_ERR_INTERNAL;
            break;
        }
        s->n_threads++;
    }
    if (err) {
        if (err == SVC_ERR_NOMEM)
            svc_errf(errstr, errstr_size, "out of memory for the scheduler");
        eng_sched_free(s);
        return err;
    }
    *out = s;
    return SVC_OK;
}

/* Whether n_jobs more jobs of tokens of class c would pass c's bound
 * while other jobs (of either class) are pending
 * (eng_sched_conf_t.max_jobs, interactive_share). @locks s->mu held */
static bool queue_full_locked(const eng_sched_t *s, size_t n_jobs, uint64_t tokens,
                              eng_sched_class_t c) {
    size_t   mj = c == ENG_SCHED_BULK ? s->bulk_max_jobs : s->max_jobs;
    uint64_t mt = c == ENG_SCHED_BULK ? s->bulk_max_tokens : s->max_tokens;
    return s->stats.queued_jobs > 0 &&
           (s->stats.queued_jobs + n_jobs > mj || s->stats.queued_tokens + tokens > mt);
}

/* A request that the queue (or, with images, the image slots) would turn
 * away is turned away before its images are decoded and its prompts
 * tokenized, since every retry would do both again. The jobs counted are
 * the parts with a valid question (the exact check below counts those that
 * reach the model), so this may wait a little earlier than needed, never
 * forever: an empty queue admits. Tokens are not known before the
 * tokenizing; the exact check counts them. */
static bool would_wait(eng_sched_t *s, const sch_request_t *req, eng_sched_class_t c) {
    size_t n_img = 0, n_jobs = 0;
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        bool              valid = false;
        n_img += part->n_images;
        for (size_t i = 0; i < part->n_questions; i++)
            valid |= !part->questions[i].error_code;
        n_jobs += valid;
    }
    pthread_mutex_lock(&s->mu);
    bool full = queue_full_locked(s, n_jobs, 0, c);
    pthread_mutex_unlock(&s->mu);
    return full || (n_img && s->reg && eng_imgreg_would_wait(s->reg));
}

svc_err_t eng_sched_submit(eng_sched_t *s, const sch_request_t *req, eng_sched_done_fn done,
                           void *user, sch_error_t *reject) {
    return eng_sched_submit_as(s, req, ENG_SCHED_INTERACTIVE, done, user, reject);
}

svc_err_t eng_sched_submit_as(eng_sched_t *s, const sch_request_t *req, eng_sched_class_t cls,
                              eng_sched_done_fn done, void *user, sch_error_t *reject) {
    if (would_wait(s, req, cls))
        return SVC_ERR_RETRIABLE;
    char      errstr[512] = "";
    double    submit_ms = eng_now_ms();
    sreq_t   *r = calloc(1, sizeof *r);
    svc_err_t err = r ? SVC_OK : SVC_ERR_NOMEM;
    if (!err) {
        r->req = req;
        r->done = done;
        r->user = user;
        r->submit_ms = submit_ms;
        r->cls = cls;
        eng_deadline_start(&r->dl, sch_request_options(req)); /* counts from submit */
        err = eng_answer_refuse_media(s->pkg, s->model, req, errstr, sizeof errstr);
    }
    if (!err)
        err = sreq_images(s, r, reject, errstr, sizeof errstr);
    if (!err) /* every image decoded: the error schemas/ held behind them */
        err = eng_answer_pending(req, reject, errstr, sizeof errstr);
    if (!err)
        err = sreq_plan(s, r, reject, errstr, sizeof errstr);
    if (err) {
        sreq_free(r);
        return err;
    }
    if (r->n_qs == 0) { /* nothing reaches the model: complete here */
        pthread_mutex_lock(&s->mu);
        s->stats.requests++;
        pthread_mutex_unlock(&s->mu);
        sreq_complete(r);
        return SVC_OK;
    }
    pthread_mutex_lock(&s->mu);
    SVC_ASSERT(!s->stopping);
    if (queue_full_locked(s, r->n_jobs, r->tokens, cls)) {
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
        return SVC_ERR_RETRIABLE;
    }
    r->left = r->n_qs;
    for (size_t k = 0; k < r->n_qs; k++) {
        squ_t *q = &r->qs[k];
        q->seq = s->seq++;
        q->next = NULL;
        if (s->rc) { /* the same answer queued or running: wait for it */
            squ_t *l = fl_find_locked(s, q->key);
            if (l) {
                join_locked(l, q);
                s->stats.joins++;
                if (cls == ENG_SCHED_INTERACTIVE && l->r->cls == ENG_SCHED_BULK)
                    promote_locked(s, l);
                continue;
            }
            fl_insert_locked(s, q);
        }
        lane_push_locked(s, q);
    }
    s->stats.queued += r->n_qs;
    s->stats.queued_jobs += r->n_jobs;
    s->stats.queued_tokens += r->tokens;
    r->live_next = s->live;
    if (s->live)
        s->live->live_prev = r;
    s->live = r;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return SVC_OK;
}

bool eng_sched_cancel(eng_sched_t *s, eng_sched_done_fn done, const void *user) {
    pthread_mutex_lock(&s->mu);
    sreq_t *r = s->live;
    while (r && (r->done != done || r->user != user))
        r = r->live_next;
    /* Its queued questions are dropped by the worker that takes them, its
     * running ones finish (leaf_live skips the rest of a group), its
     * questions waiting on another's answer leave now; the last completes
     * it with this error, as any failure. done runs on a worker even then
     * (s->cdone): callers cancel under locks that their done takes. */
    if (r && sreq_fail_locked(r, SVC_ERR_CANCELLED, "the request was cancelled")) {
        s->stats.cancelled++;
        sreq_t *fin = NULL;
        for (size_t k = 0; k < r->n_qs; k++)
            if (r->qs[k].follower) {
                unjoin_locked(&r->qs[k]);
                finish_locked(s, &fin, &r->qs[k], NULL);
            }
        if (fin) {
            fin->done_next = s->cdone; /* one request at most: r */
            s->cdone = fin;
            pthread_cond_broadcast(&s->cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return r != NULL;
}

void eng_sched_stats(const eng_sched_t *s, eng_sched_stats_t *out) {
    eng_sched_t *m = (eng_sched_t *)s; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    *out = s->stats;
    pthread_mutex_unlock(&m->mu);
    out->image_slots_freed = s->reg ? eng_imgreg_cleared(s->reg) : 0;
    if (s->rc) {
        eng_rcache_stats_t rs;
        eng_rcache_stats(s->rc, &rs);
        out->cache_hits = rs.hits;
        out->cache_misses = rs.misses;
        out->cache_evictions = rs.evictions;
        out->cache_entries = rs.entries;
        out->cache_bytes = rs.bytes;
        out->cache_index_bytes = rs.index_bytes;
    }
}
