/*
 * ops_metrics.c -- the Prometheus text exposition format (version 0.0.4):
 * a small writer shared by serve's --metrics-file (written for
 * node_exporter's textfile collector: a temporary file renamed over the old
 * one, so a scraper never reads half a file) and the HTTP shim's
 * GET /metrics (ops_http_metrics.c).
 */
#include "ops_serve_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

/* ------------------------------------------------------------ the writer */

void ops_prom_init(ops_prom_t *p) {
    svc_buf_init(&p->b, 4u << 20);
    p->bad = false;
}

void ops_prom_fini(ops_prom_t *p) {
    svc_buf_fini(&p->b);
}

void ops_prom_addf(ops_prom_t *p, const char *fmt, ...) {
    char    line[1024];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char *text = line;
    if (n >= 0 && (size_t)n >= sizeof line) { /* a long help text or label */
        text = malloc((size_t)n + 1);
        if (text)
            vsnprintf(text, (size_t)n + 1, fmt, again);
    }
    va_end(again);
    if (n < 0 || !text || svc_buf_add(&p->b, text, (size_t)n))
        p->bad = true;
    if (text != line)
        free(text);
}

void ops_prom_metric(ops_prom_t *p, const char *name, const char *type, const char *help,
                     const char *labels, double value) {
    ops_prom_addf(p, "# HELP %s %s\n# TYPE %s %s\n%s%s %.17g\n", name, help, name, type, name,
                  labels, value);
}

void ops_prom_sample(ops_prom_t *p, const char *name, const char *labels, double value) {
    ops_prom_addf(p, "%s%s %.17g\n", name, labels, value);
}

void ops_prom_label_value(ops_prom_t *p, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            ops_prom_addf(p, "\\%c", *v);
        else if (*v == '\n')
            ops_prom_addf(p, "\\n");
        else
            ops_prom_addf(p, "%c", *v);
    }
}

void ops_prom_info(ops_prom_t *p, const char *model_id, const char *mode) {
    ops_prom_addf(p, "# HELP d3stream_info The served model.\n# TYPE d3stream_info gauge\n"
                     "d3stream_info{model=\"");
    ops_prom_label_value(p, model_id);
    ops_prom_addf(p, "\",mode=\"%s\"} 1\n", mode);
}

/* Answer reuse (--result-cache-entries): the result cache and the joins. */
static void ops_prom_engine_reuse(ops_prom_t *p, const eng_sched_stats_t *es) {
    ops_prom_metric(p, "d3stream_result_cache_hits_total", "counter",
                    "Questions answered from the result cache, without a pass.", "",
                    (double)es->cache_hits);
    ops_prom_metric(p, "d3stream_result_cache_misses_total", "counter",
                    "Questions looked up in the result cache and not found.", "",
                    (double)es->cache_misses);
    ops_prom_metric(p, "d3stream_result_cache_evictions_total", "counter",
                    "Answers dropped from the result cache for its bounds (least recently used).",
                    "", (double)es->cache_evictions);
    ops_prom_metric(p, "d3stream_result_cache_entries", "gauge",
                    "Answers in the result cache; bounded by --result-cache-entries.", "",
                    (double)es->cache_entries);
    ops_prom_metric(p, "d3stream_result_cache_bytes", "gauge",
                    "Their memory as malloc allocates it; bounded by --result-cache-mib.", "",
                    (double)es->cache_bytes);
    ops_prom_metric(p, "d3stream_result_cache_index_bytes", "gauge",
                    "The result cache's index beside them (one pointer per bucket).", "",
                    (double)es->cache_index_bytes);
    ops_prom_metric(p, "d3stream_engine_joins_total", "counter",
                    "Questions that waited for an identical one queued or running instead of "
                    "running again.",
                    "", (double)es->joins);
}

void ops_prom_engine(ops_prom_t *p, const eng_sched_t *s) {
    if (!s)
        return;
    eng_sched_stats_t es;
    eng_sched_stats(s, &es);
    ops_prom_metric(p, "d3stream_engine_requests_total", "counter",
                    "Requests the engine completed.", "", (double)es.requests);
    ops_prom_metric(p, "d3stream_engine_questions_total", "counter",
                    "Questions that reached the model.", "", (double)es.questions);
    ops_prom_metric(
        p, "d3stream_engine_groups_total", "counter",
        "Prefix groups run (questions sharing a prompt prefix; a lone question is one).", "",
        (double)es.groups);
    ops_prom_metric(p, "d3stream_engine_input_tokens_total", "counter",
                    "Prompt tokens of the questions that reached the model.", "",
                    (double)es.tokens);
    ops_prom_metric(p, "d3stream_engine_computed_tokens_total", "counter",
                    "Tokens run through the text tower (the rest came from shared prefixes).", "",
                    (double)es.tokens_computed);
    ops_prom_metric(p, "d3stream_engine_queued_questions", "gauge",
                    "Questions admitted, not finished.", "", (double)es.queued);
    ops_prom_metric(p, "d3stream_engine_queued_jobs", "gauge",
                    "Jobs (request states with a question for the model) admitted, not "
                    "finished; bounded by --max-queue.",
                    "", (double)es.queued_jobs);
    ops_prom_metric(p, "d3stream_engine_queued_tokens", "gauge",
                    "Prompt tokens of those jobs; bounded by --max-queued-tokens.", "",
                    (double)es.queued_tokens);
    ops_prom_metric(p, "d3stream_engine_token_layers_total", "counter",
                    "Tokens times layers run through the text tower (the work done).", "",
                    (double)es.token_layers);
    ops_prom_metric(p, "d3stream_engine_passes_total", "counter",
                    "Forward passes run for the questions' own tokens (short questions of any "
                    "requests run together in one batched pass, counted once).",
                    "", (double)es.passes);
    ops_prom_metric(p, "d3stream_engine_images_encoded_total", "counter",
                    "Vision tower runs (one per distinct image in flight: equal images of any "
                    "requests share one).",
                    "", (double)es.images_encoded);
    ops_prom_metric(p, "d3stream_engine_cancelled_total", "counter",
                    "Requests withdrawn while queued or running (their HTTP client went away): "
                    "their questions not yet begun were not run.",
                    "", (double)es.cancelled);
    ops_prom_engine_reuse(p, &es);
    /* Batch sizes: questions a worker took from the queue at once. */
    ops_prom_addf(p, "# HELP d3stream_engine_batch_questions Questions a worker took from the "
                     "queue at once (what it could group).\n"
                     "# TYPE d3stream_engine_batch_questions histogram\n");
    for (size_t i = 0; i < 7; i++) {
        if (ENG_SCHED_BATCH_LE[i])
            ops_prom_addf(p, "d3stream_engine_batch_questions_bucket{le=\"%u\"} %llu\n",
                          ENG_SCHED_BATCH_LE[i], (unsigned long long)es.batches[i]);
        else
            ops_prom_addf(p, "d3stream_engine_batch_questions_bucket{le=\"+Inf\"} %llu\n",
                          (unsigned long long)es.batches[i]);
    }
    ops_prom_addf(p, "d3stream_engine_batch_questions_sum %llu\n",
                  (unsigned long long)es.batch_questions);
    ops_prom_addf(p, "d3stream_engine_batch_questions_count %llu\n",
                  (unsigned long long)es.batches[6]);
}

/* Upper bounds in seconds: 1 ms to 2 minutes (the tiny package answers in
 * milliseconds, the real one in seconds on the CPU). */
static const double HIST_BOUNDS[OPS_HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,    1,     2.5,  5,     10,   30};

void ops_hist_add(ops_hist_t *h, double seconds) {
    for (int i = 0; i < OPS_HIST_N; i++)
        if (seconds <= HIST_BOUNDS[i])
            h->bucket[i]++;
    h->count++;
    h->sum += seconds;
}

void ops_prom_hist(ops_prom_t *p, const char *name, const char *help, const ops_hist_t *h) {
    ops_prom_addf(p, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < OPS_HIST_N; i++)
        ops_prom_addf(p, "%s_bucket{le=\"%g\"} %llu\n", name, HIST_BOUNDS[i],
                      (unsigned long long)h->bucket[i]);
    ops_prom_addf(p, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                  (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

/* ------------------------------------------------------------ serve */

static void kafka_metrics(ops_prom_t *b, serve_t *s) {
    const serve_counts_t *n = &s->n;
    ops_prom_metric(b, "d3stream_results_total", "counter",
                    "Result records delivered (committed, with --exactly-once), by HTTP status "
                    "class.",
                    "{status=\"2xx\"}", (double)n->by_status[2]);
    ops_prom_sample(b, "d3stream_results_total", "{status=\"4xx\"}", (double)n->by_status[4]);
    ops_prom_sample(b, "d3stream_results_total", "{status=\"5xx\"}", (double)n->by_status[5]);
    ops_prom_metric(b, "d3stream_dead_letters_total", "counter",
                    "Dead-letter records queued for undecodable input.", "", (double)n->dlq);
    ops_prom_metric(b, "d3stream_delivery_failures_total", "counter",
                    "Delivery reports with an error (result or dead letter).", "",
                    (double)n->failed);
    ops_prom_metric(b, "d3stream_abandoned_total", "counter",
                    "Records left uncommitted, to be consumed again.", "", (double)n->abandoned);
    ops_prom_metric(b, "d3stream_stale_results_total", "counter",
                    "Results dropped because their partition was revoked meanwhile.", "",
                    (double)n->stale);
    ops_prom_metric(b, "d3stream_transactions_total", "counter", "Kafka transactions by outcome.",
                    "{outcome=\"committed\"}", (double)n->txn_commits);
    ops_prom_sample(b, "d3stream_transactions_total", "{outcome=\"aborted\"}",
                    (double)n->txn_aborts);
    cons_stats_t cs;
    cons_stats(s->cons, &cs);
    ops_prom_metric(b, "d3stream_consumer_lag", "gauge",
                    "Messages behind the end of the assigned partitions (librdkafka statistics; "
                    "-1 before the first).",
                    "", cs.stats_seen ? (double)cs.lag : -1.0);
    ops_prom_metric(b, "d3stream_consumer_rebalances_total", "counter",
                    "Consumer group rebalances.", "", (double)cs.rebalance_cnt);
    ops_prom_metric(b, "d3stream_consumer_assigned_partitions", "gauge", "Partitions assigned.", "",
                    (double)cs.assignment_size);
    ops_prom_metric(b, "d3stream_consumer_messages_total", "counter", "Records taken from Kafka.",
                    "", (double)cs.messages);
    ops_prom_metric(b, "d3stream_consumer_in_flight", "gauge", "Records taken and not finished.",
                    "", (double)cs.in_flight);
    ops_prom_metric(b, "d3stream_consumer_in_flight_bytes", "gauge",
                    "Keys and values of the records taken and not finished, and of those "
                    "fetched and not yet taken (bounded by --window-mib).",
                    "", (double)cs.bytes);
    ops_prom_metric(b, "d3stream_consumer_pauses_total", "counter",
                    "Times the in-flight window paused fetching.", "", (double)cs.pauses);
}

void ops_serve_metrics_write(serve_t *s, bool final) {
    ops_prom_t m;
    ops_prom_init(&m);
    ops_prom_info(&m, eng_package_model_id(s->ask.pkg),
                  s->o->eos ? "exactly-once" : "at-least-once");
    /* serve runs only once the golden check passed or was skipped */
    ops_prom_device(&m, !s->o->http.no_golden);
    kafka_metrics(&m, s);
    ops_prom_engine(&m, s->sched);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", s->o->metrics_path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    bool  ok = !m.bad && f && fwrite(m.b.data, 1, m.b.len, f) == m.b.len;
    if (f && fclose(f))
        ok = false;
    if (ok && rename(tmp, s->o->metrics_path))
        ok = false;
    if (!ok) {
        (void)unlink(tmp);
        fprintf(stderr, "d3stream serve: cannot write the metrics file \"%s\"%s\n",
                s->o->metrics_path, final ? "" : " (will retry)");
    }
    ops_prom_fini(&m);
}

void ops_serve_metrics_snapshot(serve_t *s, bool force) {
    double t = ops_serve_now_s();
    if (!s->snap || (!force && t - s->snap->t < 1.0))
        return;
    s->snap->t = t;
    ops_prom_t m;
    ops_prom_init(&m);
    kafka_metrics(&m, s);
    pthread_mutex_lock(&s->snap->lock);
    svc_buf_reset(&s->snap->text);
    if (!m.bad && svc_buf_add(&s->snap->text, m.b.data, m.b.len))
        svc_buf_reset(&s->snap->text); /* out of memory: no Kafka metrics this time */
    pthread_mutex_unlock(&s->snap->lock);
    ops_prom_fini(&m);
}

void ops_serve_metrics_more(void *user, ops_prom_t *p) {
    serve_snap_t *snap = user;
    pthread_mutex_lock(&snap->lock);
    if (snap->text.len && svc_buf_add(&p->b, snap->text.data, snap->text.len))
        p->bad = true;
    pthread_mutex_unlock(&snap->lock);
}
