/*
 * ops_bench.c -- `d3stream bench`: D3-Nano-NPU2's text speed table
 * (D3-NANO-NPU2.md, "Speed on the NPU") measured on any package, on this
 * machine: single questions of 128 .. 32,768 tokens, 4 and 16 questions of
 * 330 tokens through the scheduler, and 16 questions sharing a 4,000-token
 * state (prefix sharing).
 *
 * Prompts are real System One requests rendered through the prompt path
 * (eng_prompt_render): the state is ordinary words, lengthened or shortened
 * until the rendered prompt has exactly the wanted number of tokens.
 */
#include "ops_int.h"

#include "npu.h"
#include "schemas.h"

#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char BENCH_HELP[] =
    "Usage: d3stream bench --model DIR [--runs N] [--quick] [--json] [--max-tokens N]\n"
    "                      [--workers N] [--row TEXT] [--profile P] [--q4nx-layout S]\n"
    "                      [--device auto|cpu|npu]\n"
    "\n"
    "Measures the package in DIR on this machine's CPU with the rows of D3-Nano-NPU2's\n"
    "text speed table (D3-NANO-NPU2.md), so the two can be read side by side:\n"
    "\n"
    "  1 x N              one question of N = 128, 330, 1,024, 4,096, 15,854, 31,491\n"
    "                     and 32,768 tokens: one forward pass and the readout\n"
    "  4 x 330, 16 x 330  4 and 16 requests of one 330-token question each, every one\n"
    "                     with its own state, through the scheduler (eng_sched) with\n"
    "                     --workers threads: the time until all are answered\n"
    "  image rows         D3-Nano-NPU2's image rows, each one request through the\n"
    "                     scheduler with synthetic PNGs (gradients and noise): 1\n"
    "                     question + a 1024 x 768 image, + two 1024 x 768 images, + a\n"
    "                     2000 x 1500 image (downscaled to 1.6 MP), and 8 questions +\n"
    "                     one image; decoding, resizing and the vision tower are in\n"
    "                     the time (the NPU's were measured over HTTP); the row\n"
    "                     reports the tower runs (one per distinct image). Skipped\n"
    "                     without a vision tower.\n"
    "  16 x 4,000 shared  one request of 16 different short questions on one state,\n"
    "                     each prompt 4,000 tokens long, through the scheduler: the\n"
    "                     state runs once (prefix sharing); the row also reports the\n"
    "                     tokens the scheduler computed against the prompt tokens\n"
    "                     and the work (tokens x layers run) against none shared\n"
    "                     (non-causal packages share only the layers before the\n"
    "                     first full-attention layer)\n"
    "  cache 1 x 330      a 330-token question asked twice of one scheduler with\n"
    "                     the served default's result cache: the repeat's time from\n"
    "                     submit to answer (the median column; also in ms), and the\n"
    "                     computed one's\n"
    "  repeats 16 x 330   16 requests of one 330-token question, the last 8 repeating\n"
    "                     the first 8, submitted at once: with answer reuse (repeats\n"
    "                     join their question in flight or hit the cache) and\n"
    "                     without; answers/s both ways\n"
    "\n"
    "Prompts: real System One requests rendered by the prompt path (the same bytes\n"
    "and token ids `d3stream prompt` prints), whose state is made of ordinary words,\n"
    "lengthened word by word until the rendered prompt has exactly the wanted number\n"
    "of tokens. When even an empty state renders longer than a single question's\n"
    "size (a package whose tokenizer splits the prompt head finely), that row runs\n"
    "the last N token ids of the shortest rendered prompt instead (marked *, JSON\n"
    "\"prompt\":\"suffix\"); scheduler rows need whole requests and are skipped\n"
    "then. A size over the package's max length (decision_config.json or\n"
    "config.json) or over --max-tokens is reported as skipped, never truncated.\n"
    "\n"
    "Each row: the median of --runs wall times (CLOCK_MONOTONIC), tokens/s = the\n"
    "row's prompt tokens / the median seconds, and the peak RSS after the row\n"
    "(getrusage ru_maxrss: the process's high-water mark so far, loading included,\n"
    "not the row's own use). Progress goes to stderr. The manifest is not checked\n"
    "(`d3stream inspect` does that).\n"
    "\n"
    "  --model DIR       a decision3 package (as `d3stream ask` takes)\n"
    "  --runs N          runs per row, the median is reported (default 3)\n"
    "  --quick           1 run of 1 x 128, 1 x 330, 1 x 1,024, 4 x 330 and 16 x 330\n"
    "                    (an explicit --runs still applies)\n"
    "  --json            one JSON object per line: first the machine\n"
    "                    {\"machine\":...,\"kernels\":...,...}, then one per row\n"
    "                    {\"row\":...,\"questions\":...,\"tokens\":...,\"median_s\":...,\n"
    "                    \"tokens_per_s\":...,\"peak_rss_mib\":...} or\n"
    "                    {\"row\":...,\"skipped\":\"<reason>\"}\n"
    "  --max-tokens N    skip the text rows whose prompts are longer than N tokens\n"
    "                    (image rows always run: --max-tokens 1 runs only those)\n"
    "  --workers N       scheduler threads (default: the online CPUs)\n"
    "  --row TEXT        only the rows whose name contains TEXT (e.g. \"shared\",\n"
    "                    \"x 330\"); the others are not run or printed\n" OPS_PROFILE_HELP
        OPS_Q4NX_LAYOUT_HELP OPS_DEVICE_HELP "\n"
    "Exit status: 0 measured, 2 usage, 3 the package could not be loaded, a\n"
    "forward pass failed, or --device npu (no XDNA backend in this build).\n";

#define BENCH_MAX_Q 16

typedef enum bench_kind {
    BENCH_SINGLE = 0, /* one forward pass + readout */
    BENCH_MANY = 1,   /* n requests of one question, each its own state */
    BENCH_SHARED = 2, /* one request, n questions on one state */
    BENCH_IMAGES = 3, /* one request, n questions, n_img synthetic images */
    BENCH_CACHE = 4,  /* one request of one question, asked again: the repeat timed */
    BENCH_REPEATS = 5 /* n requests of one question, half of them repeats */
} bench_kind_t;

typedef struct bench_row {
    const char  *label;
    bench_kind_t kind;
    size_t       size; /* tokens of each prompt */
    size_t       n;    /* questions */
    bool         quick;
    size_t       n_img; /* BENCH_IMAGES: images of w x h pixels */
    uint32_t     w, h;
} bench_row_t;

static const bench_row_t ROWS[] = {
    {"1 x 128", BENCH_SINGLE, 128, 1, true, 0, 0, 0},
    {"1 x 330", BENCH_SINGLE, 330, 1, true, 0, 0, 0},
    {"1 x 1,024", BENCH_SINGLE, 1024, 1, true, 0, 0, 0},
    {"1 x 4,096", BENCH_SINGLE, 4096, 1, false, 0, 0, 0},
    {"1 x 15,854", BENCH_SINGLE, 15854, 1, false, 0, 0, 0},
    {"1 x 31,491", BENCH_SINGLE, 31491, 1, false, 0, 0, 0},
    {"1 x 32,768", BENCH_SINGLE, 32768, 1, false, 0, 0, 0},
    {"4 x 330", BENCH_MANY, 330, 4, true, 0, 0, 0},
    {"16 x 330", BENCH_MANY, 330, 16, true, 0, 0, 0},
    {"16 x 4,000 shared", BENCH_SHARED, 4000, 16, false, 0, 0, 0},
    {"1 + 1024x768 image", BENCH_IMAGES, 0, 1, false, 1, 1024, 768},
    {"1 + two images", BENCH_IMAGES, 0, 1, false, 2, 1024, 768},
    {"1 + 2000x1500 image", BENCH_IMAGES, 0, 1, false, 1, 2000, 1500},
    {"8 + one image", BENCH_IMAGES, 0, 8, false, 1, 1024, 768},
    {"cache 1 x 330", BENCH_CACHE, 330, 1, false, 0, 0, 0},
    {"repeats 16 x 330", BENCH_REPEATS, 330, 16, false, 0, 0, 0},
};

typedef struct bench_opts {
    const char     *dir;
    const char     *row; /* --row: a substring of the rows to run, or NULL */
    size_t          runs, max_tokens, workers;
    bool            quick, json;
    eng_load_opts_t load; /* --q4nx-layout */
} bench_opts_t;

typedef struct bench {
    const bench_opts_t  *o;
    const eng_package_t *pkg;
    const eng_model_t   *model;
    eng_prompt_t         pr;
    char                 errstr[1024];
} bench_t;

typedef struct bench_result {
    char     skipped[256]; /* "" when measured */
    bool     suffix;       /* the last ids of a longer rendered prompt */
    size_t   tokens;
    double   median_s, tokens_per_s, rss_mib;
    uint64_t sched_tokens, sched_computed; /* scheduler rows: deltas of eng_sched_stats */
    double   sched_work; /* token_layers delta / (tokens x layers): the work against none shared */
    uint64_t images_encoded; /* image rows: vision tower runs per run */
    double   first_s;        /* cache: the computed answer's median seconds */
    double   off_s;          /* repeats: the median seconds with the cache off */
    uint64_t reused;         /* cache, repeats: hits + joins of the last run */
} bench_result_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---------------------------------------------------------------- prompts */

/* Ordinary words: each is one pre-token, so every word adds at least one
 * token and the prompt length grows monotonically with the word count. */
static const char *const WORDS[] = {
    "the",      "order", "arrived", "two",  "days",   "late", "and",      "box",
    "was",      "found", "on",      "one",  "side",   "of",   "our",      "door",
    "customer", "asks",  "for",     "a",    "refund", "or",   "new",      "parcel",
    "before",   "the",   "weekend", "she",  "says",   "that", "it",       "is",
    "not",      "the",   "first",   "time", "this",   "has",  "happened", "here",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

/* Short endings tried one by one to close the last gap of a few tokens. */
static const char *const FILLERS[] = {" a", " I", " it", " ok", ".", ",", " x", " so"};
#define N_FILLERS (sizeof FILLERS / sizeof FILLERS[0])

/* Appends `"q<i>": {...}` question i (short, different per i). The point
 * has two digits for every i below BENCH_MAX_Q: tokenizers split digits,
 * so "point 10" would be a token longer than "point 9" and the questions
 * of one row would not all be the row's size. */
static svc_err_t add_question(svc_buf_t *b, size_t i) {
    return svc_buf_addf(b,
                        "%s\"q%zu\": {\"type\": \"noul\", \"instructions\": \"Is point %02zu of "
                        "this ticket urgent?\"}",
                        i ? ", " : "", i, i + 1);
}

/* The request body: a state of "Ticket <tag>:" + k words + fillers, with
 * nq questions. */
static svc_err_t make_body(svc_buf_t *b, size_t tag, size_t k, const size_t *fill, size_t n_fill,
                           size_t nq) {
    svc_buf_reset(b);
    svc_err_t err = svc_buf_addf(b, "{\"state\": \"Ticket %zu:", tag);
    for (size_t i = 0; !err && i < k; i++)
        err = svc_buf_addf(b, " %s", WORDS[i % N_WORDS]);
    for (size_t i = 0; !err && i < n_fill; i++)
        err = svc_buf_adds(b, FILLERS[fill[i]]);
    if (!err)
        err = svc_buf_adds(b, "\", \"questions\": {");
    for (size_t i = 0; !err && i < nq; i++)
        err = add_question(b, i);
    if (!err)
        err = svc_buf_adds(b, "}}");
    return err;
}

/* Decodes body; renders its first question into bn->pr; *n its tokens.
 * *req receives the request when req is not NULL. */
static svc_err_t render(bench_t *bn, const svc_buf_t *body, size_t *n, sch_request_t **req) {
    sch_request_t *r = NULL;
    svc_buf_t      out;
    svc_buf_init(&out, 1 << 20);
    int       rc = ops_decode_request(bn->pkg, bn->o->dir, ops_decode_vision(bn->model), body->data,
                                      body->len, &r, &out, NULL, bn->errstr, sizeof bn->errstr);
    svc_err_t err = SVC_OK;
    if (rc != OPS_EXIT_OK) {
        if (rc == OPS_EXIT_VERDICT)
            svc_errf(bn->errstr, sizeof bn->errstr, "synthetic request refused: %.*s",
                     (int)(out.len < 512 ? out.len : 512), out.data ? out.data : "");
        err = SVC_ERR_INVALID;
    } else {
        const sch_part_t *part = sch_request_part(r, 0);
        err = eng_prompt_render(bn->pkg, part, &part->questions[0], &bn->pr, bn->errstr,
                                sizeof bn->errstr);
        *n = bn->pr.n_tokens;
    }
    svc_buf_fini(&out);
    if (!err && req)
        *req = r;
    else
        sch_request_free(r);
    return err;
}

/**
 * @brief Builds a request whose first question's prompt is exactly target
 *        tokens: the smallest word count reaching it, then, when a word
 *        overshot, one word fewer and short fillers up to it.
 * @param req receives the request (free with sch_request_free); bn->pr
 *        holds the rendered prompt of its first question.
 * @returns SVC_OK; SVC_ERR_UNSUPPORTED with bn->errstr when even an empty
 *          state renders longer (bn->pr then holds that prompt);
 *          SVC_ERR_INVALID with bn->errstr when no state gives exactly
 *          target tokens.
 */
static svc_err_t synthesise(bench_t *bn, size_t tag, size_t target, size_t nq,
                            sch_request_t **req) {
    svc_buf_t body;
    svc_buf_init(&body, SCH_DEFAULT_MAX_REQUEST_BYTES);
    size_t    fill[64] = {0}, n_fill = 0, n = 0;
    svc_err_t err = make_body(&body, tag, 0, fill, 0, nq);
    if (!err)
        err = render(bn, &body, &n, NULL);
    if (!err && n > target) {
        svc_errf(bn->errstr, sizeof bn->errstr,
                 "the shortest rendered prompt (no state words) is already %zu tokens", n);
        err = SVC_ERR_UNSUPPORTED;
    }
    size_t lo = 0, hi = target, n_lo = n; /* n(lo) <= target <= n(hi): a word adds >= 1 */
    while (!err && hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        err = make_body(&body, tag, mid, fill, 0, nq);
        if (!err)
            err = render(bn, &body, &n, NULL);
        if (!err && n >= target)
            hi = mid;
        else if (!err) {
            lo = mid;
            n_lo = n;
        }
    }
    size_t k = hi;
    if (!err) {
        err = make_body(&body, tag, k, fill, 0, nq);
        if (!err)
            err = render(bn, &body, &n, NULL);
        if (!err && n > target) { /* the last word overshot: fill the gap */
            k = lo;
            n = n_lo;
            for (size_t f = 0; !err && n != target && f < N_FILLERS;) {
                size_t before = n;
                fill[n_fill] = f;
                err = make_body(&body, tag, k, fill, n_fill + 1, nq);
                if (!err)
                    err = render(bn, &body, &n, NULL);
                if (!err && n <= target && n > before && n_fill + 1 < 64)
                    n_fill++;
                else {
                    f++;
                    n = before;
                }
            }
        }
    }
    if (!err) {
        err = make_body(&body, tag, k, fill, n_fill, nq);
        if (!err)
            err = render(bn, &body, &n, req);
        if (!err && n != target) {
            sch_request_free(*req);
            *req = NULL;
            svc_errf(bn->errstr, sizeof bn->errstr,
                     "cannot synthesise a prompt of exactly %zu tokens (closest %zu)", target, n);
            err = SVC_ERR_INVALID;
        }
    }
    svc_buf_fini(&body);
    return err;
}

/* ---------------------------------------------------------------- rows */

static svc_err_t run_single(bench_t *bn, const bench_row_t *row, double *secs,
                            bench_result_t *res) {
    sch_request_t *req = NULL;
    svc_err_t      err = synthesise(bn, 0, row->size, 1, &req);
    sch_request_free(req);
    const int32_t *ids = bn->pr.ids.v;
    size_t         T = bn->pr.ids.n;
    if (err == SVC_ERR_UNSUPPORTED && T > row->size) {
        /* the package's prompt head alone is longer: its last size ids */
        ids += T - row->size;
        T = row->size;
        res->suffix = true;
        err = SVC_OK;
    }
    if (err)
        return err;
    size_t  hidden = eng_model_hidden_size(bn->model);
    float  *h = malloc(hidden * sizeof *h);
    double *probs = malloc(2 * sizeof *probs);
    if (!h || !probs)
        err = SVC_ERR_NOMEM;
    for (size_t r = 0; !err && r < bn->o->runs; r++) {
        double t0 = now_s();
        err = eng_model_forward(bn->model, ids, T, eng_package_noncausal(bn->pkg), h, NULL, NULL,
                                bn->errstr, sizeof bn->errstr);
        if (!err)
            err = eng_readout_probs(bn->model, h, 2, eng_package_temperature(bn->pkg), probs);
        secs[r] = now_s() - t0;
        if (!err)
            fprintf(stderr, "d3stream bench: %s: run %zu/%zu %.3f s\n", row->label, r + 1,
                    bn->o->runs, secs[r]);
    }
    res->tokens = T;
    free(h);
    free(probs);
    return err;
}

typedef struct bench_wait {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    size_t          n_done;
    svc_err_t       err;
    char            errstr[512];
    eng_answers_t  *ans[BENCH_MAX_Q];
} bench_wait_t;

typedef struct bench_job {
    bench_wait_t *w;
    size_t        i;
} bench_job_t;

static void on_done(void *user, eng_answers_t *ans, svc_err_t err, const char *errstr) {
    bench_job_t  *j = user;
    bench_wait_t *w = j->w;
    pthread_mutex_lock(&w->mu);
    w->ans[j->i] = ans;
    if (err && !w->err) {
        w->err = err;
        snprintf(w->errstr, sizeof w->errstr, "%s", errstr ? errstr : svc_err_name(err));
    }
    w->n_done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Every question of req answered: a row whose questions the engine
 * refused (max_length_exceeded, ...) measured less than it says, so it is
 * a failure, never a row. */
static svc_err_t check_answered(bench_t *bn, const sch_request_t *req, const eng_answers_t *ans) {
    const sch_result_t *const *res = eng_answers_results(ans);
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t q = 0; q < part->n_questions; q++) {
            const char *code = part->questions[q].error_code ? part->questions[q].error_code
                                                             : res[p][q].error_code;
            if (!code)
                continue;
            svc_errf(bn->errstr, sizeof bn->errstr,
                     "question %zu of the row was not answered: %s%s%s", q + 1, code,
                     res[p][q].error_message ? ": " : "",
                     res[p][q].error_message ? res[p][q].error_message : "");
            return SVC_ERR_INVALID;
        }
    }
    return SVC_OK;
}

/* One timed run of reqs[0..n_req-1] through s, until all are answered;
 * adds the prompt tokens answered to *tokens, and the scheduler's counts
 * of the run to res. */
static svc_err_t sched_run(bench_t *bn, eng_sched_t *s, sch_request_t *const *reqs, size_t n_req,
                           double *sec, size_t *tokens, bench_result_t *res) {
    svc_err_t         err = SVC_OK;
    bench_wait_t      w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    bench_job_t       jobs[BENCH_MAX_Q];
    size_t            submitted = 0;
    eng_sched_stats_t st0, st1;
    eng_sched_stats(s, &st0);
    double t0 = now_s();
    for (size_t i = 0; !err && i < n_req; i++) {
        jobs[i] = (bench_job_t){&w, i};
        while ((err = eng_sched_submit(s, reqs[i], on_done, &jobs[i], NULL)) == SVC_ERR_RETRIABLE) {
            pthread_mutex_lock(&w.mu); /* the queue is full: wait for a completion */
            size_t seen = w.n_done;
            while (w.n_done == seen && w.n_done < submitted)
                pthread_cond_wait(&w.cv, &w.mu);
            pthread_mutex_unlock(&w.mu);
        }
        if (!err)
            submitted++;
        else
            svc_errf(bn->errstr, sizeof bn->errstr, "submit: %s", svc_err_name(err));
    }
    pthread_mutex_lock(&w.mu);
    while (w.n_done < submitted)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    *sec = now_s() - t0;
    eng_sched_stats(s, &st1);
    if (!err && w.err) {
        err = w.err;
        svc_errf(bn->errstr, sizeof bn->errstr, "%s", w.errstr);
    }
    for (size_t i = 0; i < submitted; i++) {
        if (!err && w.ans[i])
            err = check_answered(bn, reqs[i], w.ans[i]);
        for (size_t p = 0; w.ans[i] && p < sch_request_n_parts(reqs[i]); p++)
            *tokens += eng_answers_input_tokens(w.ans[i])[p];
        eng_answers_free(w.ans[i]);
    }
    res->sched_tokens = st1.tokens - st0.tokens;
    res->sched_computed = st1.tokens_computed - st0.tokens_computed;
    eng_model_info_t mi;
    eng_model_get_info(bn->model, &mi);
    res->sched_work = res->sched_tokens && mi.n_layers
                          ? (double)(st1.token_layers - st0.token_layers) /
                                ((double)res->sched_tokens * (double)mi.n_layers)
                          : 0.0;
    res->images_encoded = st1.images_encoded - st0.images_encoded;
    res->reused = st1.cache_hits + st1.joins - st0.cache_hits - st0.joins;
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return err;
}

/* sched_run through a fresh scheduler (answer reuse on when cache: the
 * served default's bounds). */
static svc_err_t sched_once(bench_t *bn, sch_request_t *const *reqs, size_t n_req, bool cache,
                            double *sec, size_t *tokens, bench_result_t *res) {
    eng_sched_t     *s = NULL;
    eng_sched_conf_t conf = {.n_workers = bn->o->workers,
                             .cache_entries = cache ? ENG_SCHED_CACHE_ENTRIES : 0};
    svc_err_t err = eng_sched_new(bn->pkg, bn->model, &conf, &s, bn->errstr, sizeof bn->errstr);
    if (!err)
        err = sched_run(bn, s, reqs, n_req, sec, tokens, res);
    eng_sched_free(s);
    return err;
}

static svc_err_t run_sched(bench_t *bn, const bench_row_t *row, double *secs, bench_result_t *res) {
    sch_request_t *reqs[BENCH_MAX_Q] = {0};
    size_t         n_req = row->kind == BENCH_MANY ? row->n : 1;
    svc_err_t      err = SVC_OK;
    for (size_t i = 0; !err && i < n_req; i++)
        err = synthesise(bn, i + 1, row->size, row->kind == BENCH_MANY ? 1 : row->n, &reqs[i]);
    for (size_t r = 0; !err && r < bn->o->runs; r++) {
        size_t tokens = 0;
        err = sched_once(bn, reqs, n_req, false, &secs[r], &tokens, res);
        res->tokens = tokens;
        if (!err)
            fprintf(stderr, "d3stream bench: %s: run %zu/%zu %.3f s\n", row->label, r + 1,
                    bn->o->runs, secs[r]);
    }
    for (size_t i = 0; i < n_req; i++)
        sch_request_free(reqs[i]);
    return err;
}

/* An image row: one request (its images decoded, checked and encoded
 * inside the timed scheduler run, as a served request's are). */
static svc_err_t run_images(bench_t *bn, const bench_row_t *row, double *secs,
                            bench_result_t *res) {
    if (!eng_model_has_vision(bn->model)) {
        snprintf(res->skipped, sizeof res->skipped, "the package has no vision tower");
        return SVC_OK;
    }
    svc_buf_t body;
    svc_buf_init(&body, SCH_DEFAULT_MAX_REQUEST_BYTES);
    sch_request_t *req = NULL;
    size_t         n = 0;
    svc_err_t      err = ops_bench_image_body(row->n_img, row->w, row->h, row->n, &body);
    if (!err)
        err = render(bn, &body, &n, &req);
    svc_buf_fini(&body);
    size_t max_len = eng_package_max_length(bn->pkg);
    if (!err && n > max_len) { /* the image tokens count: known only once rendered */
        snprintf(res->skipped, sizeof res->skipped,
                 "%zu tokens is over the package's max length %zu", n, max_len);
        sch_request_free(req);
        return SVC_OK;
    }
    for (size_t r = 0; !err && r < bn->o->runs; r++) {
        size_t tokens = 0;
        err = sched_once(bn, &req, 1, false, &secs[r], &tokens, res);
        res->tokens = tokens;
        if (!err)
            fprintf(stderr, "d3stream bench: %s: run %zu/%zu %.3f s (%llu image encodings)\n",
                    row->label, r + 1, bn->o->runs, secs[r],
                    (unsigned long long)res->images_encoded);
    }
    sch_request_free(req);
    return err;
}

/* The cache row: per run a new question (its own state) asked twice of
 * one scheduler with the served default's answer reuse: the repeat's time
 * from submit to done (secs), the first's in first_s. */
static svc_err_t run_cache(bench_t *bn, const bench_row_t *row, double *secs, bench_result_t *res) {
    eng_sched_t     *s = NULL;
    eng_sched_conf_t conf = {.n_workers = bn->o->workers, .cache_entries = ENG_SCHED_CACHE_ENTRIES};
    svc_err_t err = eng_sched_new(bn->pkg, bn->model, &conf, &s, bn->errstr, sizeof bn->errstr);
    double   *first = calloc(bn->o->runs, sizeof *first);
    if (!err && !first)
        err = SVC_ERR_NOMEM;
    for (size_t r = 0; !err && r < bn->o->runs; r++) {
        sch_request_t *req = NULL;
        size_t         tokens = 0;
        err = synthesise(bn, 100 + r, row->size, 1, &req);
        if (!err)
            err = sched_run(bn, s, &req, 1, &first[r], &tokens, res);
        if (!err)
            err = sched_run(bn, s, &req, 1, &secs[r], &tokens, res);
        res->tokens = row->size;
        if (!err && res->reused != 1) {
            svc_errf(bn->errstr, sizeof bn->errstr, "the repeat was not answered from the cache");
            err = SVC_ERR_INTERNAL;
        }
        if (!err)
            fprintf(stderr, "d3stream bench: %s: run %zu/%zu computed %.3f s, repeat %.3f ms\n",
                    row->label, r + 1, bn->o->runs, first[r], secs[r] * 1e3);
        sch_request_free(req);
    }
    if (!err)
        res->first_s = median(first, bn->o->runs);
    free(first);
    eng_sched_free(s);
    return err;
}

/* The repeats row: n requests of one question, the second half repeating
 * the first's in order, all submitted at once as a backfill's window
 * would; timed with answer reuse (a repeat joins its question in flight,
 * or hits once it is answered) and without. */
static svc_err_t run_repeats(bench_t *bn, const bench_row_t *row, double *secs,
                             bench_result_t *res) {
    sch_request_t *reqs[BENCH_MAX_Q] = {0};
    size_t         half = row->n / 2;
    double        *off = calloc(bn->o->runs, sizeof *off);
    svc_err_t      err = off ? SVC_OK : SVC_ERR_NOMEM;
    for (size_t i = 0; !err && i < half; i++)
        err = synthesise(bn, i + 1, row->size, 1, &reqs[i]);
    for (size_t i = half; i < row->n; i++)
        reqs[i] = reqs[i - half];
    for (size_t r = 0; !err && r < bn->o->runs; r++) {
        size_t         tokens = 0;
        bench_result_t off_res;
        err = sched_once(bn, reqs, row->n, false, &off[r], &tokens, &off_res);
        tokens = 0;
        if (!err)
            err = sched_once(bn, reqs, row->n, true, &secs[r], &tokens, res);
        res->tokens = tokens;
        if (!err)
            fprintf(stderr, "d3stream bench: %s: run %zu/%zu %.3f s, cache off %.3f s\n",
                    row->label, r + 1, bn->o->runs, secs[r], off[r]);
    }
    if (!err)
        res->off_s = median(off, bn->o->runs);
    for (size_t i = 0; i < half; i++)
        sch_request_free(reqs[i]);
    free(off);
    return err;
}

/* Measures one row into res (or says why it is skipped). */
static svc_err_t bench_row(bench_t *bn, const bench_row_t *row, bench_result_t *res) {
    memset(res, 0, sizeof *res);
    size_t max_len = eng_package_max_length(bn->pkg);
    if (row->size > max_len) {
        snprintf(res->skipped, sizeof res->skipped,
                 "%zu tokens is over the package's max length %zu", row->size, max_len);
        return SVC_OK;
    }
    if (bn->o->max_tokens && row->size > bn->o->max_tokens) {
        snprintf(res->skipped, sizeof res->skipped, "%zu tokens is over --max-tokens %zu",
                 row->size, bn->o->max_tokens);
        return SVC_OK;
    }
    fprintf(stderr, "d3stream bench: %s: preparing prompts\n", row->label);
    double *secs = calloc(bn->o->runs, sizeof *secs);
    if (!secs)
        return SVC_ERR_NOMEM;
    svc_err_t err = row->kind == BENCH_SINGLE    ? run_single(bn, row, secs, res)
                    : row->kind == BENCH_IMAGES  ? run_images(bn, row, secs, res)
                    : row->kind == BENCH_CACHE   ? run_cache(bn, row, secs, res)
                    : row->kind == BENCH_REPEATS ? run_repeats(bn, row, secs, res)
                                                 : run_sched(bn, row, secs, res);
    if (err == SVC_ERR_UNSUPPORTED) { /* no real request is that short */
        snprintf(res->skipped, sizeof res->skipped, "%s", bn->errstr);
        err = SVC_OK;
    }
    if (!err && !res->skipped[0]) {
        res->median_s = median(secs, bn->o->runs);
        res->tokens_per_s = res->median_s > 0 ? (double)res->tokens / res->median_s : 0;
    }
    res->rss_mib = peak_rss_mib();
    free(secs);
    return err;
}

/* ---------------------------------------------------------------- output */

static void print_json(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (s) {
        puts(s);
        fflush(stdout);
    }
    free(s);
    json_decref(o);
}

static void print_header(const bench_t *bn, const char *machine, double load_s) {
    const bench_opts_t *o = bn->o;
    char                workers[64];
    if (o->workers)
        snprintf(workers, sizeof workers, "%zu", o->workers);
    else
        snprintf(workers, sizeof workers, "default (%ld online CPUs)",
                 sysconf(_SC_NPROCESSORS_ONLN));
    char mm[128];
    ops_matmul_desc(mm, sizeof mm);
    if (o->json) {
        /* "machine" and "accelerator": what answers carry as meta.device
         * and meta.accelerator */
        print_json(json_pack(
            "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:I, s:s, s:I, s:s, s:f}",
            "machine", machine, "accelerator", ops_device_accelerator(), "profile",
            eng_profile_name(ops_profile_default()), "numerics",
            eng_profile_numerics(ops_profile_default()), "matmul_fast", npu_matmul_fast_name(),
            "kernels", npu_kernels_name(), "matmul", npu_matmul_name(), "matmul_quantised",
            npu_matmul_quantised_name(), "matmul_groups", npu_matmul_groups_name(), "threads",
            (json_int_t)npu_threads(), "model_id", eng_package_model_id(bn->pkg), "format",
            eng_model_format(bn->model), "max_length", (json_int_t)eng_package_max_length(bn->pkg),
            "workers", workers, "runs", (json_int_t)o->runs, "prompts",
            "rendered System One requests", "load_s", load_s));
        return;
    }
    printf("d3stream bench: %s (%s, %s), max length %zu, loaded in %.1f s\n",
           eng_package_model_id(bn->pkg), o->dir, eng_model_format(bn->model),
           eng_package_max_length(bn->pkg), load_s);
    printf("machine: %s\nkernels: %s, matmul %s, %zu threads; scheduler workers: %s; median of "
           "%zu run%s\nprofile: %s (%s numerics%s%s)\n",
           machine, npu_kernels_name(), mm, npu_threads(), workers, o->runs,
           o->runs == 1 ? "" : "s", eng_profile_name(ops_profile_default()),
           eng_profile_numerics(ops_profile_default()),
           ops_profile_default() == ENG_PROFILE_FAST ? ", projections on " : "",
           ops_profile_default() == ENG_PROFILE_FAST ? npu_matmul_fast_name() : "");
    printf("\n%-20s %9s %8s %10s %11s %13s\n", "row", "questions", "tokens", "median s", "tokens/s",
           "peak RSS MiB");
    fflush(stdout);
}

static void print_row(const bench_t *bn, const bench_row_t *row, const bench_result_t *res) {
    bool sched = row->kind != BENCH_SINGLE;
    if (bn->o->json) {
        json_t *o = json_pack("{s:s, s:I, s:I}", "row", row->label, "questions", (json_int_t)row->n,
                              "size", (json_int_t)row->size);
        if (!o)
            return;
        if (res->skipped[0])
            json_object_set_new(o, "skipped", json_string(res->skipped));
        else {
            json_object_set_new(o, "tokens", json_integer((json_int_t)res->tokens));
            json_object_set_new(o, "prompt", json_string(res->suffix ? "suffix" : "rendered"));
            json_object_set_new(o, "runs", json_integer((json_int_t)bn->o->runs));
            json_object_set_new(o, "median_s", json_real(res->median_s));
            json_object_set_new(o, "tokens_per_s", json_real(res->tokens_per_s));
            json_object_set_new(o, "peak_rss_mib", json_real(res->rss_mib));
            if (row->kind == BENCH_IMAGES) {
                json_object_set_new(o, "images", json_integer((json_int_t)row->n_img));
                json_object_set_new(o, "image_encodings",
                                    json_integer((json_int_t)res->images_encoded));
            }
            if (row->kind == BENCH_CACHE) {
                json_object_set_new(o, "repeat_ms", json_real(res->median_s * 1e3));
                json_object_set_new(o, "first_s", json_real(res->first_s));
            }
            if (row->kind == BENCH_REPEATS) {
                json_object_set_new(
                    o, "answers_per_s",
                    json_real(res->median_s > 0 ? (double)row->n / res->median_s : 0));
                json_object_set_new(o, "cache_off_s", json_real(res->off_s));
                json_object_set_new(o, "reused", json_integer((json_int_t)res->reused));
            }
            if (sched) {
                json_object_set_new(o, "sched_tokens", json_integer((json_int_t)res->sched_tokens));
                json_object_set_new(o, "sched_tokens_computed",
                                    json_integer((json_int_t)res->sched_computed));
                json_object_set_new(o, "sched_work", json_real(res->sched_work));
            }
        }
        print_json(o);
        return;
    }
    char suffix_label[64];
    snprintf(suffix_label, sizeof suffix_label, "%s *", row->label);
    if (res->skipped[0])
        printf("%-20s %9zu %8s  skipped: %s\n", row->label, row->n, "-", res->skipped);
    else {
        printf("%-20s %9zu %8zu %10.3f %11.1f %13.1f", res->suffix ? suffix_label : row->label,
               row->n, res->tokens, res->median_s, res->tokens_per_s, res->rss_mib);
        if (row->kind == BENCH_IMAGES)
            printf("  %zu image(s), %llu encoding(s)", row->n_img,
                   (unsigned long long)res->images_encoded);
        if (row->kind == BENCH_CACHE)
            printf("  repeat %.3f ms at the engine, computed %.3f s", res->median_s * 1e3,
                   res->first_s);
        if (row->kind == BENCH_REPEATS && res->median_s > 0 && res->off_s > 0)
            printf("  %.2f answers/s, cache off %.2f (%.2fx), %llu reused",
                   (double)row->n / res->median_s, (double)row->n / res->off_s,
                   res->off_s / res->median_s, (unsigned long long)res->reused);
        if (row->kind == BENCH_SHARED && res->sched_tokens)
            printf("  computed %llu of %llu tokens (%.2f), work %.2f of unshared",
                   (unsigned long long)res->sched_computed, (unsigned long long)res->sched_tokens,
                   (double)res->sched_computed / (double)res->sched_tokens, res->sched_work);
        putchar('\n');
    }
    fflush(stdout);
}

/* ---------------------------------------------------------------- command */

static int bench_run(const bench_opts_t *o) {
    bench_t bn = {.o = o};
    eng_prompt_init(&bn.pr);
    eng_package_t *pkg = NULL;
    eng_model_t   *model = NULL;
    svc_buf_t      machine;
    svc_buf_init(&machine, 8192);
    int    rc = OPS_EXIT_OK;
    bool   any_suffix = false;
    double t0 = now_s();
    fprintf(stderr, "d3stream bench: loading \"%s\"\n", o->dir);
    if (eng_package_open(o->dir, &pkg, bn.errstr, sizeof bn.errstr) ||
        eng_model_load_with(o->dir, &o->load, &model, bn.errstr, sizeof bn.errstr) ||
        eng_model_check_package(model, pkg, bn.errstr, sizeof bn.errstr)) {
        ops_fail("bench", "%s", bn.errstr);
        rc = OPS_EXIT_FAILURE;
    } else if (ops_device_label(&machine)) {
        ops_fail("bench", "out of memory");
        rc = OPS_EXIT_FAILURE;
    }
    if (rc == OPS_EXIT_OK) {
        bn.pkg = pkg;
        /* --profile: the single rows run that view; the scheduler rows'
         * requests get it as the served default (ops_profile_default) */
        bn.model = eng_model_profile(model, ops_profile_default());
        print_header(&bn, machine.data, now_s() - t0);
        for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
            if ((o->quick && !ROWS[i].quick) || (o->row && !strstr(ROWS[i].label, o->row)))
                continue;
            bench_result_t res;
            bn.errstr[0] = '\0';
            svc_err_t err = bench_row(&bn, &ROWS[i], &res);
            if (err) {
                ops_fail("bench", "%s: %s", ROWS[i].label,
                         bn.errstr[0] ? bn.errstr : svc_err_name(err));
                rc = OPS_EXIT_FAILURE;
                break;
            }
            if (res.skipped[0])
                fprintf(stderr, "d3stream bench: %s: skipped: %s\n", ROWS[i].label, res.skipped);
            any_suffix |= res.suffix;
            print_row(&bn, &ROWS[i], &res);
        }
        if (rc == OPS_EXIT_OK && !o->json)
            printf("\ntokens/s = the row's prompt tokens / median seconds; peak RSS is the "
                   "process's high-water mark (ru_maxrss) after the row, loading included.\n%s",
                   any_suffix ? "* the package's shortest rendered prompt is longer: the row "
                                "runs its last token ids.\n"
                              : "");
    }
    svc_buf_fini(&machine);
    eng_prompt_fini(&bn.pr);
    eng_model_free(model);
    eng_package_free(pkg);
    return rc;
}

/* Whether some row's name contains text (--row). */
/* Whether a row of the set run (all, or --quick's) is named by text. */
static bool row_named(const char *text, bool quick) {
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++)
        if (strstr(ROWS[i].label, text) && (!quick || ROWS[i].quick))
            return true;
    return false;
}

int ops_cmd_bench(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"runs", required_argument, NULL, 'r'},
        {"quick", no_argument, NULL, 'q'},
        {"json", no_argument, NULL, 'j'},
        {"max-tokens", required_argument, NULL, 't'},
        {"workers", required_argument, NULL, 'w'},
        {"row", required_argument, NULL, 'o'},
        {"q4nx-layout", required_argument, NULL, 'L'},
        {"profile", required_argument, NULL, 'P'},
        {"device", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bench_opts_t o = {.runs = 3};
    bool         runs_given = false;
    int          c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'q')
            o.quick = true;
        else if (c == 'j')
            o.json = true;
        else if (c == 'r') {
            if (!ops_count_opt("bench", "runs", optarg, 1000, &o.runs))
                return OPS_EXIT_USAGE;
            runs_given = true;
        } else if (c == 't') {
            if (!ops_count_opt("bench", "max-tokens", optarg, (size_t)1 << 30, &o.max_tokens))
                return OPS_EXIT_USAGE;
        } else if (c == 'w') {
            if (!ops_count_opt("bench", "workers", optarg, 1024, &o.workers))
                return OPS_EXIT_USAGE;
        } else if (c == 'o') {
            o.row = optarg;
        } else if (c == 'L') {
            if ((rc = ops_q4nx_layout_opt("bench", optarg, &o.load)) >= 0)
                return rc;
        } else if (c == 'P') {
            if ((rc = ops_profile_opt("bench", optarg)) >= 0)
                return rc;
        } else if (c == 'd') {
            if ((rc = ops_device_opt("bench", optarg)) >= 0)
                return rc;
        } else if ((rc = ops_opt_common(c, BENCH_HELP, &o.dir)) >= 0)
            return rc;
    }
    if ((rc = ops_opt_end(argc, BENCH_HELP, o.dir, 0)) >= 0)
        return rc;
    if (o.row && !row_named(o.row, o.quick)) {
        ops_fail("bench", "--row \"%s\" names no row%s (see --help for the rows)", o.row,
                 o.quick && row_named(o.row, false) ? " of --quick's" : "");
        return OPS_EXIT_USAGE;
    }
    if (o.quick && !runs_given)
        o.runs = 1;
    if ((rc = ops_device_choose("bench")) >= 0)
        return rc;
    return bench_run(&o);
}
