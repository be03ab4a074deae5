/*
 * ops_http_metrics.c -- the counters of `d3stream http` and its GET
 * /metrics text (Prometheus text format 0.0.4, through ops_metrics.c's
 * writer): requests by route and status, questions by outcome, input
 * tokens, latency histograms (queue, forward, total), the engine's
 * counters and queue depth, connections, the model and the device.
 */
#include "ops_http_int.h"

/* 499: the client went away before its answer (nginx's convention). */
static const int STATUSES[HTTP_N_STATUS - 1] = {200, 400, 404, 405, 413, 422, 429, 499, 500, 503};

static const char *const ROUTE_LABEL[HTTP_R_COUNT] = {
    "/v1/systemone", "/v1/decisions", "/v1/classify", "/v1/embeddings",
    "/v1/rerank",    "/v1/bundle",    "/v1/models",   "/v1/systemone/models",
    "/health",       "/health/live",  "/metrics",     "/openapi.yaml",
    "unmatched",
};

/* answered first, then the per-question error codes (SPEC b.6), then other. */
static const char *const OUTCOMES[HTTP_N_OUTCOME - 1] = {
    "answered",          "invalid_question",     "max_length_exceeded",
    "deadline_exceeded", "invalid_model_output",
};

void ops_http_count_request(http_t *h, http_route_t route, int status, double total_s) {
    int i = 0;
    while (i < HTTP_N_STATUS - 1 && STATUSES[i] != status)
        i++;
    pthread_mutex_lock(&h->lock);
    h->n.requests[route][i]++;
    if (route <= HTTP_R_DECISIONS)
        ops_hist_add(&h->n.total_s, total_s);
    pthread_mutex_unlock(&h->lock);
}

static int outcome(const char *code) {
    if (!code)
        return 0;
    for (int i = 1; i < HTTP_N_OUTCOME - 1; i++)
        if (strcmp(code, OUTCOMES[i]) == 0)
            return i;
    return HTTP_N_OUTCOME - 1;
}

void ops_http_count_answers(http_t *h, const sch_request_t *req, const eng_answers_t *ans) {
    uint64_t                   n[HTTP_N_OUTCOME] = {0}, tokens = 0;
    const sch_result_t *const *res = eng_answers_results(ans);
    const size_t              *in = eng_answers_input_tokens(ans);
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t q = 0; q < part->n_questions; q++) {
            const char *code = part->questions[q].error_code;
            n[code ? outcome(code) : outcome(res[p][q].error_code)]++;
        }
        tokens += in[p];
    }
    const eng_answer_stats_t *st = eng_answers_stats(ans);
    pthread_mutex_lock(&h->lock);
    for (int i = 0; i < HTTP_N_OUTCOME; i++)
        h->n.questions[i] += n[i];
    h->n.input_tokens += tokens;
    ops_hist_add(&h->n.queue_s, st->queue_ms / 1000.0);
    ops_hist_add(&h->n.forward_s, st->forward_ms / 1000.0);
    pthread_mutex_unlock(&h->lock);
}

static void requests(ops_prom_t *p, const http_counts_t *n) {
    ops_prom_addf(p, "# HELP d3stream_http_requests_total HTTP requests answered, by route and "
                     "status (499: the client went away first).\n"
                     "# TYPE d3stream_http_requests_total counter\n");
    for (int r = 0; r < HTTP_R_COUNT; r++)
        for (int s = 0; s < HTTP_N_STATUS; s++) {
            if (!n->requests[r][s])
                continue;
            char st[16] = "other";
            if (s < HTTP_N_STATUS - 1)
                snprintf(st, sizeof st, "%d", STATUSES[s]);
            ops_prom_addf(p, "d3stream_http_requests_total{route=\"%s\",status=\"%s\"} %llu\n",
                          ROUTE_LABEL[r], st, (unsigned long long)n->requests[r][s]);
        }
}

bool ops_http_metrics_text(http_t *h, svc_buf_t *out) {
    http_counts_t n;
    pthread_mutex_lock(&h->lock);
    n = h->n;
    bool validated = h->golden.state == OPS_GOLDEN_PASSED; /* the card's accelerator_validated */
    pthread_mutex_unlock(&h->lock);
    int        state = atomic_load(&h->state);
    ops_prom_t m;
    ops_prom_init(&m);
    ops_prom_info(&m, h->label, h->c.mode);
    ops_prom_device(&m, validated);
    ops_prom_metric(&m, "d3stream_model_ready", "gauge",
                    "1 when the model is loaded and answering, else 0.", "",
                    state == HTTP_READY ? 1.0 : 0.0);
    requests(&m, &n);
    ops_prom_addf(&m, "# HELP d3stream_http_questions_total Questions of answered decision "
                      "requests, by outcome (answered or the per-question error code).\n"
                      "# TYPE d3stream_http_questions_total counter\n");
    for (int i = 0; i < HTTP_N_OUTCOME; i++)
        ops_prom_addf(&m, "d3stream_http_questions_total{outcome=\"%s\"} %llu\n",
                      i < HTTP_N_OUTCOME - 1 ? OUTCOMES[i] : "other",
                      (unsigned long long)n.questions[i]);
    ops_prom_metric(&m, "d3stream_http_input_tokens_total", "counter",
                    "Prompt tokens of the answered decision requests (usage.input_tokens).", "",
                    (double)n.input_tokens);
    ops_prom_metric(&m, "d3stream_http_overloaded_total", "counter",
                    "Decision requests refused with 429: the engine's queue was full, or the "
                    "memory for request bodies (--max-body-memory) was spent.",
                    "", (double)n.overloaded);
    ops_prom_metric(&m, "d3stream_http_in_flight_requests", "gauge",
                    "Requests begun and not yet completed.", "",
                    (double)atomic_load(&h->in_flight));
    ops_prom_metric(&m, "d3stream_http_body_bytes", "gauge",
                    "Bytes of the body memory (--max-body-memory) taken by request bodies being "
                    "received or read and by answers being sent.",
                    "", (double)atomic_load(&h->body_bytes));
    ops_prom_metric(&m, "d3stream_http_intake_requests", "gauge",
                    "Decision requests being decoded (images decoded and resized, prompts "
                    "tokenized) or waiting for it, off the server's connection threads.",
                    "", (double)atomic_load(&h->in_intake));
    ops_prom_metric(&m, "d3stream_http_engine_requests", "gauge",
                    "Decision requests the engine holds (submitted, not yet answered).", "",
                    (double)atomic_load(&h->in_engine));
    ops_prom_metric(&m, "d3stream_http_engine_submitted_total", "counter",
                    "Decision requests handed to the engine (a SIGTERM finishes them).", "",
                    (double)n.submitted);
    const union MHD_DaemonInfo *di =
        h->mhd ? MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    ops_prom_metric(&m, "d3stream_http_connections", "gauge", "Open client connections.", "",
                    di ? (double)di->num_connections : 0.0);
    ops_prom_hist(&m, "d3stream_http_queue_seconds",
                  "Time a decision request waited in the engine's queue.", &n.queue_s);
    ops_prom_hist(&m, "d3stream_http_forward_seconds",
                  "Forward-pass time of a decision request (its share of shared prefixes "
                  "included).",
                  &n.forward_s);
    ops_prom_hist(&m, "d3stream_http_request_duration_seconds",
                  "Decision requests from their headers to the last byte of the response.",
                  &n.total_s);
    ops_prom_engine(&m, state == HTTP_READY ? h->sched : NULL);
    if (h->c.more_metrics)
        h->c.more_metrics(h->c.user, &m);
    bool ok = !m.bad;
    svc_buf_reset(out);
    if (ok)
        ok = !svc_buf_add(out, m.b.data, m.b.len);
    ops_prom_fini(&m);
    return ok;
}
