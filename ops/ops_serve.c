/*
 * ops_serve.c -- `d3stream serve`: a Kafka consumer group member that answers
 * every request record with exactly one result record (SPEC k), at least once.
 *
 * One thread does everything: poll the consumer, decode, answer with the same
 * function `ask` uses (ops_ask_body), produce, serve delivery reports. The
 * scheduler that batches questions of many messages over a worker pool is a
 * later issue; until then one message is answered at a time, so the
 * consumer's in-flight window only ever holds records waiting for delivery.
 *
 * At-least-once: a message is finished (cons_msg_done) from the delivery
 * report of its result record (and of its dead-letter record, when it has
 * one); only a delivered result lets its offset be stored and committed. A
 * failed delivery abandons the message, so that it is consumed again after
 * a restart or rebalance: duplicates on the results topic are possible,
 * losses are not.
 */
#include "ops_int.h"

#include "consumer.h"
#include "eng_manifest_int.h"
#include "producer.h"
#include "schemas.h"

#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static const char SERVE_HELP[] =
    "Usage: d3stream serve --model DIR --brokers HOST:PORT --group G --input T --output T\n"
    "                      [--dlq T] [--format json|avro] [--schema-registry URL]\n"
    "                      [--from-beginning] [--stop-at-end] [--no-verify] [-X k=v]...\n"
    "\n"
    "Answers System One requests read from a Kafka topic as a member of a consumer\n"
    "group: one result record per request record on the output topic, keyed like the\n"
    "request (its key, else the request id), whose value is the body the HTTP shim\n"
    "would send (answers, or {\"error\":{...}}), with the headers d3-request-id,\n"
    "d3-status, d3-source (topic/partition/offset), d3-model and content-type.\n"
    "Delivery is at least once: an offset is committed only after its result was\n"
    "delivered, so a crash or a failed delivery may repeat results, never lose one.\n"
    "\n"
    "  --model DIR         the decision3 package, loaded and checked once, as `ask`\n"
    "  --no-verify         skip the manifest check (a warning is printed)\n"
    "  --brokers H:P       bootstrap servers\n"
    "  --group G           consumer group id\n"
    "  --input T           the requests topic\n"
    "  --output T          the results topic\n"
    "  --dlq T             dead-letter topic for records that cannot be decoded at all\n"
    "                      (Avro: bad framing, unknown schema id, corrupt body). They\n"
    "                      keep their key, value and headers, plus d3-error-code,\n"
    "                      d3-error-message and d3-source, and still get a 400 result.\n"
    "                      In JSON mode every value is a request body the contract has\n"
    "                      an answer for (not UTF-8, not JSON: 400), so none goes here.\n"
    "  --format F          json (default): the value is the request body; avro: the\n"
    "                      Confluent wire format (magic 0, schema id, Avro binary), and\n"
    "                      answers are written as Avro with schema id 2 (answer.avsc)\n"
    "  --schema-registry U resolve schema ids at U; without it only the embedded\n"
    "                      schemas are known (id 1 request.avsc, id 2 answer.avsc)\n"
    "  --from-beginning    a group without committed offsets starts at the earliest\n"
    "                      offset (default: the latest)\n"
    "  --stop-at-end       backfill: exit 0 once every assigned partition reached the\n"
    "                      end offset it had when assigned and every result is\n"
    "                      delivered; progress (messages/s, remaining, ETA) every 2 s\n"
    "                      on stderr\n"
    "  -X k=v              a librdkafka property for the consumer and the producer\n"
    "  --exactly-once      not built yet: refused (exit 2). Transactions come with a\n"
    "                      later issue; at-least-once is what serve does today.\n"
    "\n"
    "SIGTERM or SIGINT: stop fetching, finish the message in hand, flush the results,\n"
    "commit, leave the group, exit 0.\n"
    "\n"
    "Exit status: 0 stopped by a signal or at the end (--stop-at-end), 2 usage,\n"
    "3 the package failed its checks, the broker or registry failed, or results\n"
    "could not be delivered at shutdown (their offsets are not committed).\n";

#define SERVE_POLL_MS     100
#define SERVE_FLUSH_MS    30000
#define SERVE_PROGRESS_MS 2000
#define SERVE_RID_MAX     128

static volatile sig_atomic_t serve_stop;

static void on_signal(int sig) {
    (void)sig;
    serve_stop = 1;
}

typedef struct serve_opts {
    const char  *dir, *brokers, *group, *input, *output, *dlq, *registry_url;
    bool         avro, from_beginning, stop_at_end, no_verify;
    const char **props; /* NULL-terminated -X values */
} serve_opts_t;

typedef struct serve {
    const serve_opts_t *o;
    ops_ask_t           ask;
    cons_t             *cons;
    prod_t             *prod;
    sch_registry_t     *reg;
    uint64_t            answered, failed, abandoned; /* failed: delivery reports */
    bool                fatal;                       /* stop with exit 3 */
} serve_t;

/* One consumed message: finished when every record it produced reported. */
typedef struct job {
    serve_t    *s;
    cons_msg_t *msg;
    int         pending;
    bool        ok;
    char        rid[SERVE_RID_MAX + 1];
} job_t;

/* ------------------------------------------------------------ delivery */

static void on_delivery(void *opaque, svc_err_t err, const char *errstr, void *user) {
    job_t   *j = opaque;
    serve_t *s = user;
    if (err) {
        j->ok = false;
        s->failed++;
        fprintf(stderr,
                "d3stream serve: %s [%d] @%lld request %s: delivery failed: %s (not committed; "
                "the message will be consumed again)\n",
                cons_msg_topic(j->msg), (int)cons_msg_partition(j->msg),
                (long long)cons_msg_offset(j->msg), j->rid, errstr ? errstr : svc_err_name(err));
    }
    if (--j->pending > 0)
        return;
    if (j->ok)
        s->answered++;
    else
        s->abandoned++;
    cons_msg_done(s->cons, j->msg, j->ok);
    free(j);
}

/* A rebalance takes partitions away: their results must be delivered first,
 * so that their offsets are stored and committed by this member. */
static void on_revoke(void *user, const char *topic, int32_t partition) {
    serve_t *s = user;
    (void)topic;
    (void)partition;
    if (s->prod && prod_flush(s->prod, SERVE_FLUSH_MS))
        fprintf(stderr, "d3stream serve: revoke: results still in flight after %d ms\n",
                SERVE_FLUSH_MS);
}

/* ------------------------------------------------------------ decoding */

/* The request id: the request's d3-request-id header when it has a usable
 * one (correlation across hops), else a new one. */
static bool request_id(const cons_msg_t *msg, char rid[SERVE_RID_MAX + 1]) {
    for (size_t i = 0; i < cons_msg_header_count(msg); i++) {
        const char *name;
        const void *v;
        size_t      n;
        if (cons_msg_header(msg, i, &name, &v, &n) && strcmp(name, "d3-request-id") == 0 && v &&
            n > 0 && n <= SERVE_RID_MAX && !memchr(v, '\0', n)) {
            memcpy(rid, v, n);
            rid[n] = '\0';
            return true;
        }
    }
    return prod_request_id_new(rid) == SVC_OK;
}

/* Avro: framed bytes -> the request's JSON body. Returns SVC_OK, SVC_ERR_FORMAT
 * (undecodable: errstr says why), SVC_ERR_TOO_LARGE (body over the limit) or
 * SVC_ERR_IO (the registry could not be asked: worth a retry, not a verdict). */
static svc_err_t avro_to_json(serve_t *s, const void *v, size_t len, svc_buf_t *json, char *errstr,
                              size_t errstr_size) {
    uint32_t    id;
    const void *body;
    size_t      blen;
    char        why[512] = "";
    svc_err_t   err = sch_frame_parse(v, len, &id, &body, &blen, why, sizeof why);
    if (err) {
        svc_errf(errstr, errstr_size, "the record is not Confluent-framed Avro: %s", why);
        return SVC_ERR_FORMAT;
    }
    sch_avro_writer_t *w = NULL;
    err = sch_registry_writer(s->reg, id, SCH_AVRO_REQUEST, &w, why, sizeof why);
    if (err == SVC_ERR_IO) {
        svc_errf(errstr, errstr_size, "schema id %u: %s", id, why);
        return SVC_ERR_IO;
    }
    if (err) {
        svc_errf(errstr, errstr_size, "unknown schema id %u: %s", id, why);
        return SVC_ERR_FORMAT;
    }
    err = sch_avro_request_to_json(w, body, blen, json, why, sizeof why);
    sch_avro_writer_free(w);
    if (err == SVC_ERR_TOO_LARGE)
        return err;
    if (err) {
        svc_errf(errstr, errstr_size, "the Avro body (schema id %u) cannot be decoded: %s", id,
                 why);
        return SVC_ERR_FORMAT;
    }
    return SVC_OK;
}

/* An error body of our own (sch_error_encode) into out; returns its status. */
static int own_error(svc_buf_t *out, int status, const char *code, const char *msg) {
    sch_error_t e;
    sch_error_init(&e);
    sch_error_set(&e, status, code, "%s", msg);
    svc_buf_reset(out);
    if (sch_error_encode(&e, out))
        status = -1;
    sch_error_fini(&e);
    return status;
}

/* The original record's headers, for its dead-letter record. */
static rd_kafka_headers_t *copy_headers(const cons_msg_t *msg) {
    size_t n = cons_msg_header_count(msg);
    if (!n)
        return NULL;
    rd_kafka_headers_t *h = rd_kafka_headers_new(n);
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const void *v;
        size_t      len;
        if (cons_msg_header(msg, i, &name, &v, &len))
            rd_kafka_header_add(h, name, -1, v, v ? (ssize_t)len : 0);
    }
    return h;
}

/* ------------------------------------------------------------ one message */

/* Queues the dead-letter record of j; false when it could not be queued. */
static bool send_dlq(serve_t *s, job_t *j, const char *why) {
    const cons_msg_t   *msg = j->msg;
    size_t              klen = 0, vlen = 0;
    const void         *key = cons_msg_key(msg, &klen);
    const void         *val = cons_msg_value(msg, &vlen);
    rd_kafka_headers_t *h = copy_headers(msg);
    prod_dlq_t          d = {.key = key,
                             .key_len = klen,
                             .value = val,
                             .value_len = vlen,
                             .headers = h,
                             .error_code = "invalid_request",
                             .error_message = why,
                             .source_topic = cons_msg_topic(msg),
                             .source_partition = cons_msg_partition(msg),
                             .source_offset = cons_msg_offset(msg)};
    char                errstr[512] = "";
    svc_err_t           err = prod_dlq_send(s->prod, &d, j, errstr, sizeof errstr);
    if (h)
        rd_kafka_headers_destroy(h);
    if (err)
        fprintf(stderr, "d3stream serve: %s [%d] @%lld request %s: dead-letter record: %s\n",
                d.source_topic, (int)d.source_partition, (long long)d.source_offset, j->rid,
                errstr);
    return !err;
}

/* The response body and status for msg's value (JSON in body_out). Returns
 * the status, 0 when the message must be retried later (registry down), or
 * -1 on an internal failure. *undecodable is set with the reason for the
 * dead-letter topic. */
static int answer(serve_t *s, const cons_msg_t *msg, svc_buf_t *out, char *why, size_t why_size,
                  bool *undecodable) {
    size_t      vlen = 0;
    const char *v = cons_msg_value(msg, &vlen);
    svc_buf_t   json;
    /* One byte past the limit, so that the decoder answers 413 itself. */
    svc_buf_init(&json, (size_t)SCH_DEFAULT_MAX_REQUEST_BYTES + 2);
    *undecodable = false;
    if (s->o->avro) {
        svc_err_t err = avro_to_json(s, v, vlen, &json, why, why_size);
        if (err == SVC_ERR_IO) {
            svc_buf_fini(&json);
            return 0;
        }
        if (err == SVC_ERR_FORMAT) {
            *undecodable = true;
            svc_buf_fini(&json);
            return own_error(out, 400, "invalid_request", why);
        }
        if (err == SVC_ERR_TOO_LARGE) {
            char m[96];
            snprintf(m, sizeof m, "the request body exceeds %u bytes",
                     (unsigned)SCH_DEFAULT_MAX_REQUEST_BYTES);
            svc_buf_fini(&json);
            return own_error(out, 413, "request_too_large", m);
        }
        v = json.data;
        vlen = json.len;
    }
    int status = 500;
    int rc = ops_ask_body(&s->ask, v ? v : "", vlen, out, &status, why, why_size);
    svc_buf_fini(&json);
    if (rc != OPS_EXIT_FAILURE)
        return status;
    /* The engine failed on this request: the shim would answer 500. */
    char m[1100];
    snprintf(m, sizeof m, "RuntimeError: %s", why[0] ? why : "the request could not be answered");
    return own_error(out, 500, "internal_error", m);
}

/* Answers msg and queues its records; on any failure to queue, the message
 * is abandoned (consumed again later). */
static void handle(serve_t *s, cons_msg_t *msg) {
    job_t *j = calloc(1, sizeof *j);
    if (!j || !request_id(msg, j->rid)) {
        fprintf(stderr, "d3stream serve: out of memory or entropy: message abandoned\n");
        s->abandoned++;
        free(j);
        cons_msg_done(s->cons, msg, false);
        return;
    }
    j->s = s;
    j->msg = msg;
    j->ok = true;
    svc_buf_t out, avro;
    svc_buf_init(&out, SIZE_MAX / 2);
    svc_buf_init(&avro, SIZE_MAX / 2);
    char        why[1024] = "";
    bool        undecodable;
    int         status = answer(s, msg, &out, why, sizeof why, &undecodable);
    const char *topic = cons_msg_topic(msg);
    int         part = (int)cons_msg_partition(msg);
    long long   off = (long long)cons_msg_offset(msg);
    if (status == 0) { /* the registry cannot be asked: stop, nothing committed past it */
        fprintf(stderr, "d3stream serve: %s [%d] @%lld request %s: %s\n", topic, part, off, j->rid,
                why);
        s->fatal = true;
        goto abandon;
    }
    const void *value = out.data;
    size_t      value_len = out.len;
    if (status > 0 && s->o->avro) {
        char      e2[512] = "";
        svc_buf_t bin;
        svc_buf_init(&bin, SIZE_MAX / 2);
        if (sch_avro_answer_from_json(out.data, out.len, &bin, e2, sizeof e2) ||
            sch_frame_write(SCH_AVRO_ID_ANSWER, bin.data, bin.len, &avro)) {
            snprintf(why, sizeof why, "Avro answer: %s", e2);
            status = -1;
        }
        svc_buf_fini(&bin);
        value = avro.data;
        value_len = avro.len;
    }
    if (status < 0) {
        fprintf(stderr, "d3stream serve: %s [%d] @%lld request %s: %s\n", topic, part, off, j->rid,
                why[0] ? why : "cannot write the result");
        goto abandon;
    }
    fprintf(stderr, "d3stream serve: %s [%d] @%lld request %s: %d%s%s\n", topic, part, off, j->rid,
            status, undecodable ? " undecodable, dead-lettered: " : "", undecodable ? why : "");
    j->pending = undecodable ? 2 : 1;
    if (undecodable && !send_dlq(s, j, why)) {
        j->pending = 1;
        j->ok = false; /* the result still goes out; the message comes back */
    }
    size_t        klen = 0;
    const void   *key = cons_msg_key(msg, &klen);
    prod_result_t r = {.key = key,
                       .key_len = klen,
                       .value = value,
                       .value_len = value_len,
                       .status = status,
                       .request_id = j->rid,
                       .model_id = eng_package_model_id(s->ask.pkg),
                       .source_topic = topic,
                       .source_partition = part,
                       .source_offset = off};
    char          errstr[512] = "";
    svc_err_t     err = prod_result_send(s->prod, &r, j, errstr, sizeof errstr);
    if (err) {
        fprintf(stderr, "d3stream serve: %s [%d] @%lld request %s: result record: %s\n", topic,
                part, off, j->rid, errstr);
        if (svc_err_is_fatal(err))
            s->fatal = true;
        j->ok = false;
        on_delivery(j, SVC_OK, NULL, s); /* drops the pending count it would have had */
    }
    svc_buf_fini(&out);
    svc_buf_fini(&avro);
    return;
abandon:
    s->abandoned++;
    free(j);
    cons_msg_done(s->cons, msg, false);
    svc_buf_fini(&out);
    svc_buf_fini(&avro);
}

/* ------------------------------------------------------------ progress */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One progress report: rate since the last one, remaining from the
 * consumer's lag statistics (-1 until librdkafka has reported one). */
static void progress(serve_t *s, double t0, double *last_t, uint64_t *last_n, bool final) {
    double t = now_s();
    if (!final && t - *last_t < SERVE_PROGRESS_MS / 1000.0)
        return;
    cons_stats_t cs;
    cons_stats(s->cons, &cs);
    double  dt = t - *last_t > 1e-3 ? t - *last_t : 1e-3;
    double  rate = (double)(s->answered - *last_n) / dt;
    int64_t left = cs.stats_seen ? (cs.lag > 0 ? cs.lag : 0) : -1;
    char    eta[32] = "?";
    if (left == 0)
        snprintf(eta, sizeof eta, "0s");
    else if (left > 0 && rate > 0)
        snprintf(eta, sizeof eta, "%.0fs", (double)left / rate);
    bool tty = isatty(STDERR_FILENO);
    fprintf(stderr,
            "%sd3stream serve: %llu answered, %.1f msg/s, remaining %lld, ETA %s, "
            "%.0fs elapsed%s",
            tty ? "\r" : "", (unsigned long long)s->answered, rate, (long long)left, eta, t - t0,
            tty && !final ? "   " : "\n");
    *last_t = t;
    *last_n = s->answered;
}

/* ------------------------------------------------------------ the loop */

static int serve_loop(serve_t *s) {
    double   t0 = now_s(), last_t = t0;
    uint64_t last_n = 0;
    int      rc = OPS_EXIT_OK;
    while (!serve_stop && !s->fatal) {
        if (s->o->stop_at_end && prod_in_flight(s->prod) == 0 && cons_at_end(s->cons))
            break;
        cons_msg_t *msg = NULL;
        if (cons_poll(s->cons, SERVE_POLL_MS, &msg)) {
            fprintf(stderr, "d3stream serve: consumer: %s\n", cons_strerror(s->cons));
            rc = OPS_EXIT_FAILURE;
            break;
        }
        if (msg)
            handle(s, msg);
        prod_poll(s->prod, 0);
        if (s->o->stop_at_end)
            progress(s, t0, &last_t, &last_n, false);
    }
    if (s->fatal)
        rc = OPS_EXIT_FAILURE;
    /* Shutdown: nothing new is fetched; deliver what is queued so that
     * cons_close commits it. Undelivered results stay uncommitted. */
    if (prod_flush(s->prod, SERVE_FLUSH_MS)) {
        fprintf(stderr, "d3stream serve: %d results undelivered after %d ms; not committed\n",
                prod_in_flight(s->prod), SERVE_FLUSH_MS);
        rc = OPS_EXIT_FAILURE;
    }
    if (cons_close(s->cons)) {
        fprintf(stderr, "d3stream serve: final commit: %s\n", cons_strerror(s->cons));
        rc = OPS_EXIT_FAILURE;
    }
    if (s->o->stop_at_end)
        progress(s, t0, &last_t, &last_n, true);
    /* An abandoned message was not committed and comes back on a restart,
     * but this run did not answer it: a backfill that skipped some must
     * not look finished. */
    if (s->abandoned && rc == OPS_EXIT_OK) {
        fprintf(stderr,
                "d3stream serve: %llu messages not answered (their offsets are not "
                "committed; a restart consumes them again)\n",
                (unsigned long long)s->abandoned);
        rc = OPS_EXIT_FAILURE;
    }
    fprintf(stderr, "d3stream serve: stopped: %llu answered, %llu failed deliveries\n",
            (unsigned long long)s->answered, (unsigned long long)s->failed);
    return rc;
}

static int serve_run(const serve_opts_t *o, const ops_ask_t *ask) {
    serve_t s = {.o = o, .ask = *ask};
    char    errstr[1024] = "";
    int     rc = OPS_EXIT_FAILURE;
    s.reg = sch_registry_new(o->registry_url, 0, errstr, sizeof errstr);
    if (!s.reg) {
        ops_fail("serve", "schema registry: %s", errstr);
        return rc;
    }
    const char *topics[] = {o->input, NULL};
    cons_conf_t cc = {.brokers = o->brokers,
                      .group = o->group,
                      .topics = topics,
                      .from_beginning = o->from_beginning,
                      /* One worker: the window holds only results awaiting delivery. */
                      .max_in_flight = 256,
                      .props = o->props,
                      .stop_at_end = o->stop_at_end,
                      .stats_interval_ms = o->stop_at_end ? 1000 : 0,
                      .on_revoke = on_revoke,
                      .user = &s};
    prod_conf_t pc = {.brokers = o->brokers,
                      .results_topic = o->output,
                      .dlq_topic = o->dlq,
                      .props = o->props,
                      .content_type = o->avro ? PROD_CONTENT_TYPE_AVRO : PROD_CONTENT_TYPE_JSON,
                      .on_delivery = on_delivery,
                      .user = &s};
    s.prod = prod_new(&pc, errstr, sizeof errstr);
    if (!s.prod)
        ops_fail("serve", "producer: %s", errstr);
    else if (!(s.cons = cons_new(&cc, errstr, sizeof errstr)))
        ops_fail("serve", "consumer: %s", errstr);
    else
        rc = serve_loop(&s);
    /* The producer goes first: its last reports finish messages of cons. */
    size_t lost = prod_free(s.prod);
    s.prod = NULL;
    if (lost && rc == OPS_EXIT_OK)
        rc = OPS_EXIT_FAILURE;
    cons_free(s.cons);
    sch_registry_free(s.reg);
    return rc;
}

/* Verify, open, load (as `ask`), then serve. */
static int serve_package(const serve_opts_t *o) {
    char sha[ENG_SHA256_HEX + 1];
    int  rc = ops_ask_verify(o->dir, o->no_verify, sha);
    if (rc != OPS_EXIT_OK)
        return rc;
    ops_chat_template_warn("serve", o->dir);
    char           errstr[1024];
    eng_package_t *pkg = NULL;
    eng_model_t   *model = NULL;
    if (eng_package_open(o->dir, &pkg, errstr, sizeof errstr) ||
        eng_model_load(o->dir, &model, errstr, sizeof errstr) ||
        (!o->no_verify && eng_model_check_parameters(model, o->dir, errstr, sizeof errstr))) {
        ops_fail("serve", "%s", errstr);
        rc = OPS_EXIT_FAILURE;
    } else {
        ops_ask_t        a = {pkg, model, o->dir, sha};
        struct sigaction sa = {.sa_handler = on_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        rc = serve_run(o, &a);
    }
    eng_model_free(model);
    eng_package_free(pkg);
    return rc;
}

/* ------------------------------------------------------------ options */

int ops_cmd_serve(int argc, char **argv) {
    enum {
        O_BROKERS = 256,
        O_GROUP,
        O_INPUT,
        O_OUTPUT,
        O_DLQ,
        O_FORMAT,
        O_REG,
        O_EOS,
        O_BEGIN,
        O_END,
        O_NOVERIFY
    };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"brokers", required_argument, NULL, O_BROKERS},
        {"group", required_argument, NULL, O_GROUP},
        {"input", required_argument, NULL, O_INPUT},
        {"output", required_argument, NULL, O_OUTPUT},
        {"dlq", required_argument, NULL, O_DLQ},
        {"format", required_argument, NULL, O_FORMAT},
        {"schema-registry", required_argument, NULL, O_REG},
        {"exactly-once", no_argument, NULL, O_EOS},
        {"from-beginning", no_argument, NULL, O_BEGIN},
        {"stop-at-end", no_argument, NULL, O_END},
        {"no-verify", no_argument, NULL, O_NOVERIFY},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    serve_opts_t o = {0};
    o.props = calloc((size_t)argc + 1, sizeof *o.props);
    if (!o.props)
        return OPS_EXIT_FAILURE;
    size_t n_props = 0;
    int    c, rc = -1;
    optind = 1;
    while (rc < 0 && (c = getopt_long(argc, argv, "m:X:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            o.dir = optarg;
            break;
        case 'X':
            if (!strchr(optarg, '=')) {
                ops_fail("serve", "-X \"%s\": expected key=value", optarg);
                rc = OPS_EXIT_USAGE;
            } else
                o.props[n_props++] = optarg;
            break;
        case O_BROKERS:
            o.brokers = optarg;
            break;
        case O_GROUP:
            o.group = optarg;
            break;
        case O_INPUT:
            o.input = optarg;
            break;
        case O_OUTPUT:
            o.output = optarg;
            break;
        case O_DLQ:
            o.dlq = optarg;
            break;
        case O_FORMAT:
            if (strcmp(optarg, "json") != 0 && strcmp(optarg, "avro") != 0) {
                ops_fail("serve", "--format \"%s\": expected json or avro", optarg);
                rc = OPS_EXIT_USAGE;
            }
            o.avro = strcmp(optarg, "avro") == 0;
            break;
        case O_REG:
            o.registry_url = optarg;
            break;
        case O_EOS:
            /* Refused rather than faked: transactions are a later issue. */
            ops_fail("serve", "--exactly-once is not built yet; serve delivers at least once "
                              "(drop the flag to accept possible duplicates)");
            rc = OPS_EXIT_USAGE;
            break;
        case O_BEGIN:
            o.from_beginning = true;
            break;
        case O_END:
            o.stop_at_end = true;
            break;
        case O_NOVERIFY:
            o.no_verify = true;
            break;
        case 'h':
            fputs(SERVE_HELP, stdout);
            rc = OPS_EXIT_OK;
            break;
        default:
            fputs(SERVE_HELP, stderr);
            rc = OPS_EXIT_USAGE;
        }
    }
    if (rc < 0 && (!o.dir || !o.brokers || !o.group || !o.input || !o.output || optind != argc)) {
        ops_fail("serve", "--model, --brokers, --group, --input and --output are required "
                          "(and nothing else): see --help");
        rc = OPS_EXIT_USAGE;
    }
    if (rc < 0)
        rc = serve_package(&o);
    free(o.props);
    return rc;
}
