/*
 * ops_metrics.c -- serve's counters in the Prometheus text exposition format
 * (version 0.0.4), written to --metrics-file for node_exporter's textfile
 * collector: a temporary file renamed over the old one, so a scraper never
 * reads half a file.
 */
#include "ops_serve_int.h"

#include <stdio.h>
#include <unistd.h>

/* The text being built; bad once an append failed (out of memory): the
 * file is then not written rather than written short. */
typedef struct mbuf {
    svc_buf_t b;
    bool      bad;
} mbuf_t;

#define ADD(m, ...)                                                                                \
    do {                                                                                           \
        if (svc_buf_addf(&(m)->b, __VA_ARGS__))                                                    \
            (m)->bad = true;                                                                       \
    } while (0)

/* One sample with its HELP/TYPE lines (labels "" for none). */
static void metric(mbuf_t *b, const char *name, const char *type, const char *help,
                   const char *labels, double value) {
    ADD(b, "# HELP %s %s\n# TYPE %s %s\n%s%s %.17g\n", name, help, name, type, name, labels, value);
}

/* A further sample of the metric just written (other labels). */
static void sample(mbuf_t *b, const char *name, const char *labels, double value) {
    ADD(b, "%s%s %.17g\n", name, labels, value);
}

static void kafka_metrics(mbuf_t *b, serve_t *s) {
    const serve_counts_t *n = &s->n;
    metric(b, "d3stream_results_total", "counter",
           "Result records delivered (committed, with --exactly-once), by HTTP status class.",
           "{status=\"2xx\"}", (double)n->by_status[2]);
    sample(b, "d3stream_results_total", "{status=\"4xx\"}", (double)n->by_status[4]);
    sample(b, "d3stream_results_total", "{status=\"5xx\"}", (double)n->by_status[5]);
    metric(b, "d3stream_dead_letters_total", "counter",
           "Dead-letter records queued for undecodable input.", "", (double)n->dlq);
    metric(b, "d3stream_delivery_failures_total", "counter",
           "Delivery reports with an error (result or dead letter).", "", (double)n->failed);
    metric(b, "d3stream_abandoned_total", "counter",
           "Records left uncommitted, to be consumed again.", "", (double)n->abandoned);
    metric(b, "d3stream_stale_results_total", "counter",
           "Results dropped because their partition was revoked meanwhile.", "", (double)n->stale);
    metric(b, "d3stream_transactions_total", "counter", "Kafka transactions by outcome.",
           "{outcome=\"committed\"}", (double)n->txn_commits);
    sample(b, "d3stream_transactions_total", "{outcome=\"aborted\"}", (double)n->txn_aborts);
    cons_stats_t cs;
    cons_stats(s->cons, &cs);
    metric(b, "d3stream_consumer_lag", "gauge",
           "Messages behind the end of the assigned partitions (librdkafka statistics; -1 before "
           "the first).",
           "", cs.stats_seen ? (double)cs.lag : -1.0);
    metric(b, "d3stream_consumer_rebalances_total", "counter", "Consumer group rebalances.", "",
           (double)cs.rebalance_cnt);
    metric(b, "d3stream_consumer_assigned_partitions", "gauge", "Partitions assigned.", "",
           (double)cs.assignment_size);
    metric(b, "d3stream_consumer_messages_total", "counter", "Records taken from Kafka.", "",
           (double)cs.messages);
    metric(b, "d3stream_consumer_in_flight", "gauge", "Records taken and not finished.", "",
           (double)cs.in_flight);
    metric(b, "d3stream_consumer_pauses_total", "counter",
           "Times the in-flight window paused fetching.", "", (double)cs.pauses);
}

static void engine_metrics(mbuf_t *b, serve_t *s) {
    eng_sched_stats_t es;
    eng_sched_stats(s->sched, &es);
    metric(b, "d3stream_engine_requests_total", "counter", "Requests the engine completed.", "",
           (double)es.requests);
    metric(b, "d3stream_engine_questions_total", "counter", "Questions that reached the model.", "",
           (double)es.questions);
    metric(b, "d3stream_engine_groups_total", "counter",
           "Prefix groups run (questions sharing a prompt prefix; a lone question is one).", "",
           (double)es.groups);
    metric(b, "d3stream_engine_input_tokens_total", "counter",
           "Prompt tokens of the questions that reached the model.", "", (double)es.tokens);
    metric(b, "d3stream_engine_computed_tokens_total", "counter",
           "Tokens run through the text tower (the rest came from shared prefixes).", "",
           (double)es.tokens_computed);
    metric(b, "d3stream_engine_queued_questions", "gauge", "Questions admitted, not finished.", "",
           (double)es.queued);
}

/* A label value as the format wants it: \\, \" and \n escaped. */
static void label_value(mbuf_t *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            ADD(b, "\\%c", *v);
        else if (*v == '\n')
            ADD(b, "\\n");
        else
            ADD(b, "%c", *v);
    }
}

void ops_serve_metrics_write(serve_t *s, bool final) {
    mbuf_t  m = {.bad = false};
    mbuf_t *b = &m;
    svc_buf_init(&m.b, 1u << 20);
    ADD(b, "# HELP d3stream_info The served model.\n# TYPE d3stream_info gauge\n"
           "d3stream_info{model=\"");
    label_value(b, eng_package_model_id(s->ask.pkg));
    ADD(b, "\",mode=\"%s\"} 1\n", s->o->eos ? "exactly-once" : "at-least-once");
    kafka_metrics(b, s);
    engine_metrics(b, s);
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
    svc_buf_fini(&m.b);
}
