/*
 * bench_sched.c -- the scheduler (prefix sharing, worker pool) against
 * eng_answer_request in a loop, on the same requests: first the answers
 * are checked against the reference, then both are timed.
 *
 *   bench_sched <package dir> [requests=500] [workers=2] [max_group=32]
 *
 * Request k has one of 50 states and 1-4 questions (so questions share a
 * state within a request, and requests share a state across the queue).
 * Prints tokens vs tokens computed, the work in token x layer steps
 * (noncausal packages share only the layers before the first
 * full-attention layer), wall and CPU time of both paths and the
 * scheduler's per-request latency p50/p99 (submit -> done).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "bench_model.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* CPU time of the whole process (every thread): fairer than wall time on
 * a shared machine. */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *const QUESTIONS[] = {
    "\"damaged\": {\"type\": \"noul\", \"instructions\": \"Did the parcel arrive damaged?\"}",
    "\"route\": {\"type\": \"choice\", \"criteria\": {\"returns\": \"Refunds and replacements\", "
    "\"billing\": \"Payments\", \"general\": null}}",
    "\"anger\": {\"type\": \"score\", \"instructions\": \"How upset is the customer?\", "
    "\"criteria\": [\"calm\", \"annoyed\", \"angry\", \"furious\"]}",
    "\"refund\": {\"type\": \"noul\", \"instructions\": \"Does the customer ask for a refund?\"}",
};

typedef struct job {
    sch_request_t   *req;
    eng_answers_t   *ref;
    eng_answers_t   *got;
    svc_err_t        err;
    double           t_submit, t_done;
    pthread_mutex_t *mu;
    pthread_cond_t  *cv;
    size_t          *n_done;
} job_t;

static void on_done(void *user, eng_answers_t *ans, svc_err_t err, const char *errstr) {
    job_t *j = user;
    if (err)
        fprintf(stderr, "bench_sched: request failed: %s\n", errstr);
    pthread_mutex_lock(j->mu);
    j->got = ans;
    j->err = err;
    j->t_done = now_ms();
    (*j->n_done)++;
    pthread_cond_signal(j->cv);
    pthread_mutex_unlock(j->mu);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Largest |probability difference| between the two answers of a request. */
static double max_diff(const sch_request_t *req, const eng_answers_t *a, const eng_answers_t *b) {
    double d = 0;
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t i = 0; i < part->n_questions; i++) {
            const sch_result_t *x = &eng_answers_results(a)[p][i],
                               *y = &eng_answers_results(b)[p][i];
            if (!x->probs || !y->probs) {
                if (x->probs != y->probs)
                    return INFINITY;
                continue;
            }
            for (size_t o = 0; o < part->questions[i].n_options; o++)
                d = fmax(d, fabs(x->probs[o] - y->probs[o]));
        }
        if (eng_answers_input_tokens(a)[p] != eng_answers_input_tokens(b)[p])
            return INFINITY;
    }
    return d;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <package dir> [requests] [workers] [max_group]\n", argv[0]);
        return 2;
    }
    size_t         n_req = argc > 2 ? strtoul(argv[2], NULL, 10) : 500;
    size_t         n_workers = argc > 3 ? strtoul(argv[3], NULL, 10) : 2;
    size_t         max_group = argc > 4 ? strtoul(argv[4], NULL, 10) : 32;
    char           errstr[1024];
    eng_package_t *pkg;
    eng_model_t   *m;
    if (bench_open_model("bench_sched", argv[1], &pkg, &m))
        return 1;
    job_t          *jobs = calloc(n_req, sizeof *jobs);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t  cv = PTHREAD_COND_INITIALIZER;
    size_t          n_done = 0;
    sch_limits_t    limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    for (size_t k = 0; k < n_req; k++) {
        char body[2048];
        int  len = snprintf(body, sizeof body,
                            "{\"state\": \"Ticket %zu: the order arrived two days late and the box "
                             "was crushed on one side.\", \"questions\": {",
                            k % 50);
        for (size_t q = 0; q < 1 + k % 4; q++)
            len += snprintf(body + len, sizeof body - (size_t)len, "%s%s", q ? "," : "",
                            QUESTIONS[(k + q) % 4]);
        snprintf(body + len, sizeof body - (size_t)len, "}}");
        sch_error_t e;
        sch_error_init(&e);
        if (sch_request_decode(body, strlen(body), &limits, NULL, &jobs[k].req, &e)) {
            fprintf(stderr, "bench_sched: request %zu: %s\n", k, e.message);
            return 1;
        }
        sch_error_fini(&e);
        jobs[k].mu = &mu;
        jobs[k].cv = &cv;
        jobs[k].n_done = &n_done;
    }
    /* the reference: one request after another, nothing shared */
    double t0 = now_ms(), c0 = cpu_ms();
    size_t tokens = 0, questions = 0;
    for (size_t k = 0; k < n_req; k++) {
        if (eng_answer_request(pkg, m, jobs[k].req, &jobs[k].ref, NULL, errstr, sizeof errstr)) {
            fprintf(stderr, "bench_sched: reference %zu: %s\n", k, errstr);
            return 1;
        }
        for (size_t p = 0; p < sch_request_n_parts(jobs[k].req); p++)
            tokens += eng_answers_input_tokens(jobs[k].ref)[p];
        questions += eng_answers_stats(jobs[k].ref)->n_forward;
    }
    double ref_ms = now_ms() - t0, ref_cpu = cpu_ms() - c0;
    /* the scheduler */
    eng_sched_t     *s = NULL;
    eng_sched_conf_t conf = {.n_workers = n_workers, .max_group = max_group};
    if (eng_sched_new(pkg, m, &conf, &s, errstr, sizeof errstr)) {
        fprintf(stderr, "bench_sched: %s\n", errstr);
        return 1;
    }
    eng_sched_stats_t st0, st;
    eng_sched_stats(s, &st0);
    t0 = now_ms();
    c0 = cpu_ms();
    for (size_t k = 0; k < n_req; k++) {
        jobs[k].t_submit = now_ms();
        svc_err_t err;
        while ((err = eng_sched_submit(s, jobs[k].req, on_done, &jobs[k], NULL)) ==
               SVC_ERR_RETRIABLE) {
            pthread_mutex_lock(&mu); /* wait for a completion */
            size_t seen = n_done;
            while (n_done == seen)
                pthread_cond_wait(&cv, &mu);
            pthread_mutex_unlock(&mu);
            jobs[k].t_submit = now_ms();
        }
        if (err) {
            fprintf(stderr, "bench_sched: submit %zu: %s\n", k, svc_err_name(err));
            return 1;
        }
    }
    pthread_mutex_lock(&mu);
    while (n_done < n_req)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    double sched_ms = now_ms() - t0, sched_cpu = cpu_ms() - c0;
    eng_sched_stats(s, &st);
    eng_sched_free(s);
    double  worst = 0;
    double *lat = calloc(n_req, sizeof *lat);
    for (size_t k = 0; k < n_req; k++) {
        worst =
            fmax(worst, jobs[k].err ? INFINITY : max_diff(jobs[k].req, jobs[k].got, jobs[k].ref));
        lat[k] = jobs[k].t_done - jobs[k].t_submit;
    }
    qsort(lat, n_req, sizeof *lat, cmp_d);
    printf("package %s (%s attention)\n", argv[1],
           eng_package_noncausal(pkg) ? "noncausal" : "causal");
    printf("requests %zu, questions %zu, prompt tokens %zu\n", n_req, questions, tokens);
    printf("validate: max |p_sched - p_ref| = %.3g %s\n", worst, worst <= 1e-5 ? "OK" : "NOT OK");
    printf("reference (eng_answer_request loop, 1 thread): wall %.1f ms (%.0f tokens/s), cpu %.1f "
           "ms\n",
           ref_ms, tokens / ref_ms * 1e3, ref_cpu);
    printf("scheduler (%zu workers, max_group %zu): wall %.1f ms (%.0f tokens/s, %.2fx), cpu %.1f "
           "ms (%.2fx less)\n",
           n_workers, max_group, sched_ms, tokens / sched_ms * 1e3, ref_ms / sched_ms, sched_cpu,
           ref_cpu / sched_cpu);
    printf("scheduler: tokens %llu, computed %llu (+%llu head once) = %.1f%%, groups %llu\n",
           (unsigned long long)st.tokens,
           (unsigned long long)(st.tokens_computed - st0.tokens_computed),
           (unsigned long long)st0.tokens_computed,
           100.0 * (double)(st.tokens_computed - st0.tokens_computed) / (double)st.tokens,
           (unsigned long long)st.groups);
    eng_model_info_t info;
    eng_model_get_info(m, &info);
    printf("scheduler: token x layer steps %llu (+%llu head once) = %.1f%% of tokens x %zu "
           "layers\n",
           (unsigned long long)(st.token_layers - st0.token_layers),
           (unsigned long long)st0.token_layers,
           100.0 * (double)(st.token_layers - st0.token_layers) /
               ((double)st.tokens * (double)info.n_layers),
           info.n_layers);
    printf("scheduler latency submit->done: p50 %.1f ms, p99 %.1f ms\n", lat[n_req / 2],
           lat[(size_t)((double)(n_req - 1) * 0.99)]);
    for (size_t k = 0; k < n_req; k++) {
        eng_answers_free(jobs[k].ref);
        eng_answers_free(jobs[k].got);
        sch_request_free(jobs[k].req);
    }
    free(lat);
    free(jobs);
    eng_model_free(m);
    eng_package_free(pkg);
    return worst <= 1e-5 ? 0 : 1;
}
