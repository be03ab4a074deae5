/*
 * ops_serve.c -- `d3stream serve`: a Kafka consumer group member that answers
 * every request record with exactly one result record (SPEC k).
 *
 * The serve thread polls the consumer, decodes each record and submits it
 * to the engine's scheduler (eng_sched: worker threads, questions of many
 * records grouped by shared prompt prefix); answers come back to a FIFO in
 * arrival order and leave from its head, so a partition's results keep
 * their input order. Backpressure: a full scheduler stops the intake, and
 * the consumer's in-flight window pauses fetching.
 *
 * At-least-once (default): a message is finished (cons_msg_done) from the
 * delivery report of its result record (and of its dead-letter record,
 * when it has one); only a delivered result lets its offset be stored and
 * committed. A failed delivery abandons the message, so that it is
 * consumed again after a restart or rebalance: duplicates on the results
 * topic are possible, losses are not. Exactly-once: ops_serve_txn.c.
 */
#include "ops_serve_int.h"

#include "eng_manifest_int.h"

#include <getopt.h>
#include <signal.h>
#include <unistd.h>

static const char SERVE_HELP[] =
    "Usage: d3stream serve --model DIR --brokers HOST:PORT --group G --input T --output T\n"
    "                      [--dlq T] [--format json|avro] [--schema-registry URL]\n"
    "                      [--exactly-once [--transactional-id ID]] [--instance-id ID]\n"
    "                      [--from-beginning] [--stop-at-end] [--workers N] [--max-queue N]\n"
    "                      [--max-queued-tokens N] [--window N] [--window-mib N]\n"
    "                      [--metrics-file PATH] [--result-cache-entries N]\n"
    "                      [--result-cache-mib N] [--max-request-bytes N]\n"
    "                      [--http HOST:PORT] [--device auto|cpu|npu]\n"
    "                      [--log-level debug|info|warn|error] [--no-verify] [-X k=v]...\n"
    "\n"
    "Answers System One requests read from a Kafka topic as a member of a consumer\n"
    "group: one result record per request record on the output topic, keyed like the\n"
    "request (its key, else the request id), whose value is the body the HTTP shim\n"
    "would send (answers, or {\"error\":{...}}), with the headers d3-request-id,\n"
    "d3-status, d3-source (topic/partition/offset), d3-model and content-type.\n"
    "Results of one partition are published in input order. Questions of many\n"
    "records run together on the engine's worker threads; questions that share a\n"
    "state (the same prompt prefix) run that prefix once.\n"
    "\n"
    "Delivery is at least once by default: an offset is committed only after its\n"
    "result was delivered, so a crash or a failed delivery may repeat results, never\n"
    "lose one. --exactly-once makes it exactly once for read_committed readers.\n"
    "\n"
    "  --model DIR         the decision3 package, loaded and checked once, as `ask`\n"
    "  --no-verify         skip the manifest check (a warning is printed)\n"
    "  --no-golden         skip the golden check (a warning is printed). By default\n"
    "                      the golden request (SPEC f.1) runs after the load on the\n"
    "                      kernels that serve and on an fp32 reference that reads\n"
    "                      the weights again; a difference past the tests'\n"
    "                      tolerances exits 3 before joining the group\n" OPS_ALIAS_HELP
        OPS_PROFILE_HELP OPS_Q4NX_LAYOUT_HELP OPS_DEVICE_HELP
    "  --brokers H:P       bootstrap servers\n"
    "  --group G           consumer group id\n"
    "  --input T           the requests topic\n"
    "  --output T          the results topic\n"
    "  --dlq T             dead-letter topic for records that cannot be decoded at all\n"
    "                      (Avro: bad framing, unknown schema id, corrupt body). They\n"
    "                      keep their key, value and headers, plus d3-error-code,\n"
    "                      d3-error-message and d3-source, and still get a 400 result\n"
    "                      (without --dlq only that result). In JSON mode every value is a request "
    "body the contract has\n"
    "                      an answer for (not UTF-8, not JSON: 400), so none goes here.\n"
    "  --format F          json (default): the value is the request body; avro: the\n"
    "                      Confluent wire format (magic 0, schema id, Avro binary), and\n"
    "                      answers are written as Avro (answer.avsc), with schema id 2\n"
    "                      unless a registry gives another. An answer answer.avsc\n"
    "                      cannot carry (a NUL in an option name or a question id)\n"
    "                      is written as the 500 internal_error it becomes\n"
    "  --schema-registry U (avro) resolve schema ids at U (http://[user:pass@]host:port;\n"
    "                      the password is masked in every message). At start\n"
    "                      answer.avsc is registered under <output>-value and answers\n"
    "                      carry the id the registry gives it. A record whose id the\n"
    "                      registry has not (404, error 40403) is a dead letter; a\n"
    "                      registry that cannot be asked (no answer or 5xx after 3\n"
    "                      tries, any other status) stops serve, nothing committed\n"
    "                      past the record. Without it only the embedded schemas are\n"
    "                      known (id 1 request.avsc, id 2 answer.avsc)\n"
    "  --exactly-once      results and consumed offsets go out in Kafka transactions\n"
    "                      (one every --commit-ms, at most 1,000 results): a\n"
    "                      read_committed reader sees each result exactly once. Input\n"
    "                      is read read_committed. An aborted transaction is redone\n"
    "                      from the committed offsets; a fenced instance exits 3,\n"
    "                      and so does one whose same record keeps failing (its\n"
    "                      result refused 5 times in a row: not committed).\n"
    "  --transactional-id ID  stable per member, so that a restarted member fences the\n"
    "                      one it replaces (default d3stream-GROUP-HOST-INSTANCE, with\n"
    "                      INSTANCE the --instance-id or 0): members running at the\n"
    "                      same time need different ids\n"
    "  --commit-ms N       exactly-once: longest a transaction stays open (default 100)\n"
    "  --instance-id ID    static membership (group.instance.id): a restart within\n"
    "                      session.timeout.ms keeps the assignment, no rebalance\n"
    "  --from-beginning    a group without committed offsets starts at the earliest\n"
    "                      offset (default: the latest)\n"
    "  --stop-at-end       backfill: exit 0 once every assigned partition reached the\n"
    "                      end offset it had when assigned and every result is\n"
    "                      delivered; progress (messages/s, remaining, ETA) every 2 s\n"
    "                      on stderr\n"
    "  --workers N         engine threads (default: the online CPUs)\n"
    "  --max-queue N       jobs admitted to the engine and not answered (default 256;\n"
    "                      a job is one state of a request, its questions with it);\n"
    "                      a full queue stops the intake until a job is answered\n"
    "  --max-queued-tokens N\n"
    "                      prompt tokens of those jobs (default 4194304); past it the\n"
    "                      intake stops too. An empty queue takes any request but\n"
    "                      one whose own prompts hold more than N tokens: it is\n"
    "                      answered 429 overloaded (committed, never retried)\n"
    "  --window N          records taken from Kafka and not yet finished (default\n"
    "                      2048); a full window pauses fetching\n"
    "  --window-mib N      and their bytes (keys and values, with those fetched and\n"
    "                      not yet taken), in MiB (default 256): past it fetching\n"
    "                      pauses too, so large records bound memory, not only\n"
    "                      their count; one record of any size is always taken\n" OPS_CACHE_HELP
        OPS_MAX_REQUEST_HELP
    "  --metrics-file PATH Prometheus text format, rewritten every 5 s and at exit\n"
    "                      (for node_exporter's textfile collector): results by\n"
    "                      status, dead letters, failed deliveries, consumer lag,\n"
    "                      rebalances, in-flight, engine questions and tokens\n"
    "  --http HOST:PORT    also serve the HTTP shim (the routes of `d3stream http\n"
    "                      --help`) on this address, in this process, on the same\n"
    "                      package and engine scheduler: HTTP requests and Kafka\n"
    "                      records share the worker threads; HTTP requests run first,\n"
    "                      and records fill at most 3/4 of --max-queue and\n"
    "                      --max-queued-tokens, so a backlog leaves room for HTTP\n"
    "                      instead of 429s. Port 0 picks a free one;\n"
    "                      the address is logged (msg=\"listening on http://...\").\n"
    "                      /health is 503 until the model is loaded; /metrics has the\n"
    "                      HTTP and engine metrics and those of --metrics-file\n"
    "  --api-key-file FILE with --http: an API key required on every route but\n"
    "                      /health/live (and /metrics unless --metrics-need-key),\n"
    "                      one a line ('#' comments), read again on SIGHUP\n"
    "                      (`d3stream http --help`)\n"
    "  --metrics-need-key  /metrics needs a key too\n"
    "  --tls-cert FILE     with --http: HTTPS (TLS 1.2 and 1.3) with this PEM\n"
    "  --tls-key FILE      certificate (chain) and key\n"
    "  --log-level L       debug, info (default), warn or error\n"
    "  -X k=v              a librdkafka property for the consumer and the producer\n"
    "  --config FILE       options from a YAML file (default $D3STREAM_CONFIG)\n"
    "\n"
    "Configuration: every option can also come from the --config file (its long name\n"
    "as the key: brokers: h:9092, exactly-once: true; -X properties under\n"
    "librdkafka:; a serve: section applies to serve only) or from the environment\n"
    "(D3STREAM_BROKERS, D3STREAM_EXACTLY_ONCE=true, ...). Flags win over the\n"
    "environment, which wins over the file; -X properties merge, the flag's value\n"
    "winning for the same key. A boolean the file turns on is turned off by its\n"
    "variable set to false (D3STREAM_EXACTLY_ONCE=false). `d3stream config serve\n"
    "[options]` prints the result with each value's origin, secrets masked.\n"
    "\n"
    "Logs: logfmt lines on stderr. Each result record gets one line, ts=...\n"
    "level=info cmd=serve msg=result request_id=R topic=T partition=P offset=O\n"
    "status=S (dlq=true|false error=... when undecodable); each HTTP request one msg=request\n"
    "line (request_id, method, path, status, duration_ms). Progress, consumer and\n"
    "shutdown lines are plain text.\n"
    "\n"
    "SIGTERM or SIGINT: stop fetching (and accepting HTTP connections), finish what\n"
    "was taken, flush the results, commit, leave the group, exit 0.\n"
    "\n"
    "Exit status: 0 stopped by a signal or at the end (--stop-at-end), 2 usage,\n"
    "3 the package failed its checks, the broker or registry failed, the producer\n"
    "was fenced, a record's result kept failing (exactly-once), or results could\n"
    "not be delivered at shutdown (their offsets are not committed).\n";

#define SERVE_POLL_MS      100
#define SERVE_FLUSH_MS     30000
#define SERVE_PROGRESS_MS  2000
#define SERVE_METRICS_MS   5000
#define SERVE_HTTP_DRAIN_S 60.0
/* With --http, Kafka records (the engine's bulk lane) may fill the queue
 * up to all but 1/4 of --max-queue and --max-queued-tokens; HTTP requests
 * have the rest and are run first (eng_sched_class_t). */
#define SERVE_HTTP_SHARE 4

static volatile sig_atomic_t serve_stop, serve_hup;

static void on_signal(int sig) {
    if (sig == SIGHUP)
        serve_hup = 1; /* --api-key-file read again (serve_loop) */
    else
        serve_stop = 1;
}

/* ------------------------------------------------------------ progress */

/* One progress report: rate since the last one, remaining from the
 * consumer's lag statistics (-1 until librdkafka has reported one). */
static void progress(serve_t *s, double t0, double *last_t, uint64_t *last_n, bool final) {
    double t = ops_serve_now_s();
    if (!final && t - *last_t < SERVE_PROGRESS_MS / 1000.0)
        return;
    cons_stats_t cs;
    cons_stats(s->cons, &cs);
    double  dt = t - *last_t > 1e-3 ? t - *last_t : 1e-3;
    double  rate = (double)(s->n.answered - *last_n) / dt;
    int64_t left = cs.stats_seen ? (cs.lag > 0 ? cs.lag : 0) + (int64_t)s->n_jobs : -1;
    char    eta[32] = "?";
    if (left == 0)
        snprintf(eta, sizeof eta, "0s");
    else if (left > 0 && rate > 0)
        snprintf(eta, sizeof eta, "%.0fs", (double)left / rate);
    bool tty = isatty(STDERR_FILENO);
    fprintf(stderr,
            "%sd3stream serve: %llu answered, %.1f msg/s, remaining %lld, ETA %s, "
            "%.0fs elapsed%s",
            tty ? "\r" : "", (unsigned long long)s->n.answered, rate, (long long)left, eta, t - t0,
            tty && !final ? "   " : "\n");
    *last_t = t;
    *last_n = s->n.answered;
}

/* ------------------------------------------------------------ the loop */

/* Nothing consumed is still waiting for its result or its commit. */
static bool idle(serve_t *s) {
    return !s->head && !s->txn_n && prod_in_flight(s->prod) == 0;
}

/* One turn: publish what is answered, take one more record unless the
 * engine is full, serve delivery reports, commit when due. */
static svc_err_t serve_turn(serve_t *s) {
    ops_serve_publish_ready(s);
    if (s->blocked && !ops_serve_job_submit(s)) {
        /* The engine's queue is full: no new record until it drains (the
         * consumer's window then pauses fetching), but the consumer is
         * still served -- a long question must not cost the membership. */
        ops_serve_wait(s, 5);
        if (cons_poll(s->cons, 0, NULL))
            return SVC_ERR_IO;
    } else {
        cons_msg_t *msg = NULL;
        if (cons_poll(s->cons, s->head ? 0 : SERVE_POLL_MS, &msg))
            return SVC_ERR_IO;
        if (msg)
            ops_serve_job_start(s, msg);
        else if (s->head)
            ops_serve_wait(s, 2);
    }
    prod_poll(s->prod, 0);
    if (s->o->eos)
        ops_serve_txn_maybe_commit(s, false);
    return SVC_OK;
}

/* After a fatal error nothing more is published: the records the engine
 * still has are waited for (it owns them) and left uncommitted. */
static void serve_abandon_all(serve_t *s) {
    if (s->blocked) {
        sch_request_free(s->blocked->req);
        s->blocked->req = NULL;
        s->blocked->ready = true;
        s->blocked = NULL;
    }
    while (s->head) {
        job_t *j = s->head;
        pthread_mutex_lock(&s->lock);
        while (!j->ready)
            pthread_cond_wait(&s->cond, &s->lock);
        pthread_mutex_unlock(&s->lock);
        s->head = j->next;
        s->n_jobs--;
        s->n.abandoned++;
        cons_msg_done(s->cons, j->msg, false);
        ops_serve_job_release(j);
    }
    s->tail = NULL;
}

/* Shutdown: nothing new is taken; what was taken is answered, published,
 * committed (exactly-once) or flushed, so that cons_close commits it. The
 * consumer is still served (rebalances, max.poll.interval.ms) and
 * transactions still commit when due: draining a full engine can take
 * longer than a transaction may stay open (transaction.timeout.ms). */
static int serve_drain(serve_t *s) {
    int  rc = OPS_EXIT_OK;
    bool cons_ok = true; /* after a fatal consumer error only the close is left */
    while (!s->fatal && (s->head || s->blocked)) {
        if (s->blocked && !ops_serve_job_submit(s))
            ops_serve_wait(s, 5);
        ops_serve_publish_ready(s);
        if (s->head)
            ops_serve_wait(s, 5);
        if (cons_ok && cons_poll(s->cons, 0, NULL)) {
            fprintf(stderr, "d3stream serve: consumer: %s\n", cons_strerror(s->cons));
            cons_ok = false;
            rc = OPS_EXIT_FAILURE;
        }
        prod_poll(s->prod, 0);
        if (s->o->eos && !s->fatal)
            ops_serve_txn_maybe_commit(s, false);
    }
    if (s->o->eos && !s->fatal)
        ops_serve_txn_maybe_commit(s, true);
    if (s->fatal)
        serve_abandon_all(s);
    if (prod_flush(s->prod, SERVE_FLUSH_MS)) {
        fprintf(stderr, "d3stream serve: %d results undelivered after %d ms; not committed\n",
                prod_in_flight(s->prod), SERVE_FLUSH_MS);
        rc = OPS_EXIT_FAILURE;
    }
    return rc;
}

static int serve_loop(serve_t *s) {
    double   t0 = ops_serve_now_s(), last_t = t0, last_m = t0;
    uint64_t last_n = 0;
    int      rc = OPS_EXIT_OK;
    while (!serve_stop && !s->fatal) {
        if (serve_hup) {
            serve_hup = 0;
            if (s->http)
                ops_http_reload_keys(s->http);
        }
        if (s->o->stop_at_end && idle(s) && cons_at_end(s->cons))
            break;
        if (serve_turn(s)) {
            fprintf(stderr, "d3stream serve: consumer: %s\n", cons_strerror(s->cons));
            rc = OPS_EXIT_FAILURE;
            break;
        }
        if (s->o->stop_at_end)
            progress(s, t0, &last_t, &last_n, false);
        if (s->o->metrics_path && ops_serve_now_s() - last_m >= SERVE_METRICS_MS / 1000.0) {
            ops_serve_metrics_write(s, false);
            last_m = ops_serve_now_s();
        }
        ops_serve_metrics_snapshot(s, false);
    }
    /* The HTTP side stops taking requests with the Kafka side; what it
     * has is finished by serve_run, on the engine that still runs. */
    if (s->http)
        ops_http_quiesce(s->http);
    if (serve_drain(s))
        rc = OPS_EXIT_FAILURE;
    if (s->fatal)
        rc = OPS_EXIT_FAILURE;
    if (cons_close(s->cons)) {
        fprintf(stderr, "d3stream serve: final commit: %s\n", cons_strerror(s->cons));
        rc = OPS_EXIT_FAILURE;
    }
    if (s->o->stop_at_end)
        progress(s, t0, &last_t, &last_n, true);
    /* An abandoned message was not committed and comes back on a restart,
     * but this run did not answer it: a backfill that skipped some must
     * not look finished. (Exactly-once aborts are retried in-process.) */
    if (s->n.abandoned && !s->o->eos && rc == OPS_EXIT_OK) {
        fprintf(stderr,
                "d3stream serve: %llu messages not answered (their offsets are not "
                "committed; a restart consumes them again)\n",
                (unsigned long long)s->n.abandoned);
        rc = OPS_EXIT_FAILURE;
    }
    fprintf(stderr,
            "d3stream serve: stopped: %llu answered, %llu failed deliveries, %llu stale, "
            "%llu transactions committed, %llu aborted\n",
            (unsigned long long)s->n.answered, (unsigned long long)s->n.failed,
            (unsigned long long)s->n.stale, (unsigned long long)s->n.txn_commits,
            (unsigned long long)s->n.txn_aborts);
    return rc;
}

/* The transactional id: given, else one per group and member, so that a
 * restarted member fences its killed predecessor. */
static void txn_id(const serve_opts_t *o, char *buf, size_t size) {
    if (o->txn_id) {
        snprintf(buf, size, "%s", o->txn_id);
        return;
    }
    char host[256] = "localhost";
    (void)gethostname(host, sizeof host - 1);
    snprintf(buf, size, "d3stream-%s-%s-%s", o->group, host, o->instance_id ? o->instance_id : "0");
}

static int serve_clients(serve_t *s) {
    const serve_opts_t *o = s->o;
    char                errstr[1024] = "", tid[512];
    txn_id(o, tid, sizeof tid);
    const char *topics[] = {o->input, NULL};
    cons_conf_t cc = {.brokers = o->brokers,
                      .group = o->group,
                      .topics = topics,
                      .group_instance_id = o->instance_id,
                      .from_beginning = o->from_beginning,
                      .max_in_flight = o->window,
                      .max_bytes = o->window_mib << 20,
                      .props = o->props,
                      .stop_at_end = o->stop_at_end,
                      .transactional = o->eos,
                      .stats_interval_ms = o->stop_at_end || o->metrics_path ? 1000 : 0,
                      .on_revoke = ops_serve_on_revoke,
                      .user = s};
    prod_conf_t pc = {.brokers = o->brokers,
                      .results_topic = o->output,
                      .dlq_topic = o->dlq,
                      .transactional = o->eos,
                      .transactional_id = o->eos ? tid : NULL,
                      .props = o->props,
                      .content_type = o->avro ? PROD_CONTENT_TYPE_AVRO : PROD_CONTENT_TYPE_JSON,
                      .on_delivery = ops_serve_on_delivery,
                      .user = s};
    int         rc = OPS_EXIT_FAILURE;
    s->prod = prod_new(&pc, errstr, sizeof errstr);
    if (!s->prod)
        ops_fail("serve", "producer: %s", errstr);
    else if (!(s->cons = cons_new(&cc, errstr, sizeof errstr)))
        ops_fail("serve", "consumer: %s", errstr);
    else
        rc = serve_loop(s);
    if (o->metrics_path && s->cons)
        ops_serve_metrics_write(s, true);
    if (s->cons)
        ops_serve_metrics_snapshot(s, true);
    /* The producer goes first: its last reports finish messages of cons. */
    size_t lost = prod_free(s->prod);
    s->prod = NULL;
    if (lost && rc == OPS_EXIT_OK)
        rc = OPS_EXIT_FAILURE;
    cons_free(s->cons);
    return rc;
}

/* The schema id answers are framed with: what the registry has answer.avsc
 * under "<output>-value" (Confluent's topic-name strategy; registered if
 * new, as its serializers do by default), else the fixed one. At start, so
 * that a wrong URL or refused credentials stop serve before any record. */
static bool answer_schema_id(serve_t *s, char *errstr, size_t errstr_size) {
    s->answer_id = SCH_AVRO_ID_ANSWER;
    if (!s->o->avro || !s->o->registry_url || !*s->o->registry_url)
        return true;
    char   subject[512];
    size_t len;
    snprintf(subject, sizeof subject, "%s-value", s->o->output);
    const char *text = sch_avro_schema_text(SCH_AVRO_ANSWER, &len);
    if (sch_registry_register(s->reg, subject, text, len, &s->answer_id, errstr, errstr_size))
        return false;
    ops_logf(OPS_LOG_INFO, "answers are framed with schema id %u (answer.avsc under %s)",
             (unsigned)s->answer_id, subject);
    return true;
}

static int serve_run(const serve_opts_t *o, const ops_ask_t *ask, http_t *http,
                     serve_snap_t *snap) {
    serve_t s = {.o = o, .ask = *ask, .http = http, .snap = snap};
    char    errstr[1024] = "";
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.cond, NULL);
    eng_sched_conf_t sc = ops_sched_conf(&o->http, ask->model_sha256);
    int              rc = OPS_EXIT_FAILURE;
    if (http) /* a Kafka backlog leaves a quarter of the queue to HTTP */
        sc.interactive_share = SERVE_HTTP_SHARE;
    s.reg = sch_registry_new(o->registry_url, 0, errstr, sizeof errstr);
    if (!s.reg)
        ops_fail("serve", "--schema-registry: %s", errstr);
    else if (!answer_schema_id(&s, errstr, sizeof errstr))
        ops_fail("serve", "--schema-registry: %s", errstr);
    else if (eng_sched_new(ask->pkg, ask->model, &sc, &s.sched, errstr, sizeof errstr))
        ops_fail("serve", "engine: %s", errstr);
    else {
        if (http) {
            ops_http_ready(http, ask->model, s.sched);
            ops_logf(OPS_LOG_INFO, "ready: the HTTP shim answers on the engine of the Kafka path");
        }
        rc = serve_clients(&s);
    }
    if (http) { /* SIGTERM, or the Kafka side failed: finish the HTTP requests */
        ops_http_quiesce(http);
        if (!ops_http_drain(http, SERVE_HTTP_DRAIN_S))
            ops_logf(OPS_LOG_WARN, "%zu HTTP requests still open after %.0f s",
                     atomic_load(&http->in_flight), SERVE_HTTP_DRAIN_S);
    }
    /* Idle by now for the Kafka side (serve_drain waited for every job);
     * what HTTP requests it still has are finished and resumed, once no
     * HTTP intake thread is inside a submit. */
    if (http)
        ops_http_release_engine(http);
    eng_sched_free(s.sched);
    if (http)
        (void)ops_http_drain(http, 5.0);
    sch_registry_free(s.reg);
    pthread_cond_destroy(&s.cond);
    pthread_mutex_destroy(&s.lock);
    return rc;
}

/* --http: listens before the weights load (/health says loading). */
static http_t *serve_http_start(const serve_opts_t *o, const ops_ask_t *a, serve_snap_t *snap) {
    http_conf_t c = {.cmd = "serve",
                     .mode = o->eos ? "exactly-once" : "at-least-once",
                     .more_metrics = ops_serve_metrics_more,
                     .user = snap};
    signal(SIGPIPE, SIG_IGN);
    return ops_http_start(&o->http, a, &c);
}

/* Verify, open, load (as `ask`), then serve. */
static int serve_package(const serve_opts_t *o) {
    /* Before the checks and the load (seconds for nano): a SIGTERM that
     * arrives meanwhile must still mean "stop cleanly, exit 0" -- serve_loop
     * sees serve_stop at once -- not the default action, death by signal. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    char sha[ENG_SHA256_HEX + 1];
    int  rc = ops_ask_verify(o->dir, o->no_verify, sha);
    if (rc != OPS_EXIT_OK)
        return rc;
    ops_chat_template_warn("serve", o->dir);
    char           errstr[1024];
    eng_package_t *pkg = NULL;
    eng_model_t   *model = NULL;
    http_t        *http = NULL;
    serve_snap_t   snap = {.t = 0};
    pthread_mutex_init(&snap.lock, NULL);
    svc_buf_init(&snap.text, 4u << 20);
    if (eng_package_open(o->dir, &pkg, errstr, sizeof errstr)) {
        ops_fail("serve", "%s", errstr);
        rc = OPS_EXIT_FAILURE;
    } else if (o->http_on &&
               !(http = serve_http_start(o, &(ops_ask_t){pkg, NULL, o->dir, sha}, &snap))) {
        rc = OPS_EXIT_FAILURE;
    } else if (eng_model_load_with(o->dir, &o->load, &model, errstr, sizeof errstr) ||
               eng_model_check_package(model, pkg, errstr, sizeof errstr) ||
               (!o->no_verify &&
                eng_model_check_parameters(model, o->dir, errstr, sizeof errstr))) {
        ops_fail("serve", "%s", errstr);
        rc = OPS_EXIT_FAILURE;
    } else {
        ops_ask_t    a = {pkg, model, o->dir, sha};
        ops_golden_t g;
        ops_warn_dnnl();
        bool ok = ops_golden_run("serve", &a, model, &o->load, o->http.no_golden, &g);
        if (http)
            ops_http_golden(http, &g);
        rc = ok ? serve_run(o, &a, http, &snap) : OPS_EXIT_FAILURE;
    }
    if (http) {
        ops_http_quiesce(http);
        ops_http_free(http);
    }
    eng_model_free(model);
    eng_package_free(pkg);
    svc_buf_fini(&snap.text);
    pthread_mutex_destroy(&snap.lock);
    return rc;
}

/* ------------------------------------------------------------ options */

enum {
    O_BROKERS = 256,
    O_GROUP,
    O_INPUT,
    O_OUTPUT,
    O_DLQ,
    O_FORMAT,
    O_REG,
    O_EOS,
    O_TXNID,
    O_COMMIT,
    O_INSTANCE,
    O_BEGIN,
    O_END,
    O_NOVERIFY,
    O_WORKERS,
    O_QUEUE,
    O_QTOKENS,
    O_WINDOW,
    O_WINDOW_MIB,
    O_METRICS,
    O_HTTP,
    O_LOGLEVEL,
    O_LAYOUT,
    O_PROFILE,
    O_RCACHE,
    O_RCACHE_MIB,
    O_MAXREQ
};

static const struct option SERVE_OPTS[] = {
    {"model", required_argument, NULL, 'm'},
    {"brokers", required_argument, NULL, O_BROKERS},
    {"group", required_argument, NULL, O_GROUP},
    {"input", required_argument, NULL, O_INPUT},
    {"output", required_argument, NULL, O_OUTPUT},
    {"dlq", required_argument, NULL, O_DLQ},
    {"format", required_argument, NULL, O_FORMAT},
    {"schema-registry", required_argument, NULL, O_REG},
    {"exactly-once", no_argument, NULL, O_EOS},
    {"transactional-id", required_argument, NULL, O_TXNID},
    {"commit-ms", required_argument, NULL, O_COMMIT},
    {"instance-id", required_argument, NULL, O_INSTANCE},
    {"from-beginning", no_argument, NULL, O_BEGIN},
    {"stop-at-end", no_argument, NULL, O_END},
    {"no-verify", no_argument, NULL, O_NOVERIFY},
    OPS_EDGE_OPTIONS,
    {"workers", required_argument, NULL, O_WORKERS},
    {"max-queue", required_argument, NULL, O_QUEUE},
    {"max-queued-tokens", required_argument, NULL, O_QTOKENS},
    {"window", required_argument, NULL, O_WINDOW},
    {"window-mib", required_argument, NULL, O_WINDOW_MIB},
    {"metrics-file", required_argument, NULL, O_METRICS},
    {"http", required_argument, NULL, O_HTTP},
    {"log-level", required_argument, NULL, O_LOGLEVEL},
    {"q4nx-layout", required_argument, NULL, O_LAYOUT},
    {"profile", required_argument, NULL, O_PROFILE},
    {"result-cache-entries", required_argument, NULL, O_RCACHE},
    {"result-cache-mib", required_argument, NULL, O_RCACHE_MIB},
    {"max-request-bytes", required_argument, NULL, O_MAXREQ},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The string-valued options; false when c is not one of them. */
static bool string_opt(int c, const char *arg, serve_opts_t *o) {
    const char **slot = NULL;
    switch (c) {
    case 'm':
        slot = &o->dir;
        break;
    case O_BROKERS:
        slot = &o->brokers;
        break;
    case O_GROUP:
        slot = &o->group;
        break;
    case O_INPUT:
        slot = &o->input;
        break;
    case O_OUTPUT:
        slot = &o->output;
        break;
    case O_DLQ:
        slot = &o->dlq;
        break;
    case O_REG:
        slot = &o->registry_url;
        break;
    case O_TXNID:
        slot = &o->txn_id;
        break;
    case O_INSTANCE:
        slot = &o->instance_id;
        break;
    case O_METRICS:
        slot = &o->metrics_path;
        break;
    default:
        return false;
    }
    *slot = arg;
    return true;
}

/* One option; -1 to go on, else the exit status. */
static int serve_opt(int c, const char *arg, serve_opts_t *o, size_t *n_props,
                     ops_log_level_t *lv) {
    size_t v;
    if (string_opt(c, arg, o))
        return -1;
    switch (c) {
    case 'X':
        if (!strchr(arg, '=')) {
            ops_fail("serve", "-X \"%s\": expected key=value", arg);
            return OPS_EXIT_USAGE;
        }
        o->props[(*n_props)++] = arg;
        return -1;
    case O_FORMAT:
        if (strcmp(arg, "json") != 0 && strcmp(arg, "avro") != 0) {
            ops_fail("serve", "--format \"%s\": expected json or avro", arg);
            return OPS_EXIT_USAGE;
        }
        o->avro = strcmp(arg, "avro") == 0;
        return -1;
    case O_EOS:
        o->eos = true;
        return -1;
    case O_HTTP:
        if (!ops_http_parse_listen(arg, &o->http)) {
            ops_fail("serve", "--http \"%s\": expected HOST:PORT (e.g. 127.0.0.1:52625)", arg);
            return OPS_EXIT_USAGE;
        }
        o->http_on = true;
        return -1;
    case O_LOGLEVEL:
        return ops_log_level_opt("serve", arg, lv) ? -1 : OPS_EXIT_USAGE;
    case O_LAYOUT:
        return ops_q4nx_layout_opt("serve", arg, &o->load);
    case O_PROFILE:
        return ops_profile_opt("serve", arg);
    case O_RCACHE:
    case O_RCACHE_MIB:
        return ops_cache_opt("serve", c == O_RCACHE_MIB, arg, &o->http);
    case O_MAXREQ:
        return ops_max_request_opt("serve", arg);
    case O_BEGIN:
        o->from_beginning = true;
        return -1;
    case O_END:
        o->stop_at_end = true;
        return -1;
    case O_NOVERIFY:
        o->no_verify = true;
        return -1;
    case O_COMMIT:
        if (!ops_count_opt("serve", "commit-ms", arg, 600000, &v))
            return OPS_EXIT_USAGE;
        o->commit_ms = (int)v;
        return -1;
    case O_WORKERS:
        return ops_count_opt("serve", "workers", arg, 256, &o->workers) ? -1 : OPS_EXIT_USAGE;
    case O_QUEUE:
        return ops_count_opt("serve", "max-queue", arg, 1u << 20, &o->max_queue) ? -1
                                                                                 : OPS_EXIT_USAGE;
    case O_QTOKENS:
        return ops_count_opt("serve", "max-queued-tokens", arg, (size_t)1 << 40,
                             &o->max_queued_tokens)
                   ? -1
                   : OPS_EXIT_USAGE;
    case O_WINDOW:
        return ops_count_opt("serve", "window", arg, 1u << 20, &o->window) ? -1 : OPS_EXIT_USAGE;
    case O_WINDOW_MIB:
        return ops_count_opt("serve", "window-mib", arg, 1u << 20, &o->window_mib) ? -1
                                                                                   : OPS_EXIT_USAGE;
    case 'h':
        fputs(SERVE_HELP, stdout);
        return OPS_EXIT_OK;
    default: {
        int rc = ops_http_edge_opt(c, "serve", arg, &o->http);
        if (rc != -2)
            return rc;
        fputs(SERVE_HELP, stderr);
        return OPS_EXIT_USAGE;
    }
    }
}

static int serve_main(const ops_config_t *cfg) {
    int             argc = cfg->argc;
    char          **argv = cfg->argv;
    serve_opts_t    o = {.window = 2048, .window_mib = 256, .commit_ms = 100};
    ops_log_level_t lv = OPS_LOG_INFO;
    ops_http_opts_default(&o.http);
    o.props = calloc((size_t)argc + 1, sizeof *o.props);
    if (!o.props)
        return OPS_EXIT_FAILURE;
    size_t n_props = 0;
    int    c, rc = -1;
    optind = 1;
    while (rc < 0 && (c = getopt_long(argc, argv, "m:X:h", SERVE_OPTS, NULL)) != -1)
        rc = serve_opt(c, optarg, &o, &n_props, &lv);
    ops_config_blame(cfg, "serve", rc, optarg);
    if (rc < 0 && (!o.dir || !o.brokers || !o.group || !o.input || !o.output || optind != argc)) {
        ops_fail("serve", "--model, --brokers, --group, --input and --output are required "
                          "(and nothing else): see --help");
        rc = OPS_EXIT_USAGE;
    }
    if (rc < 0 && o.txn_id && !o.eos) {
        ops_fail("serve", "--transactional-id needs --exactly-once");
        rc = OPS_EXIT_USAGE;
    }
    if (rc < 0 && o.registry_url && *o.registry_url && !o.avro) {
        ops_fail("serve", "--schema-registry needs --format avro (JSON records have no schema id)");
        rc = OPS_EXIT_USAGE;
    }
    if (rc < 0) {
        ops_log_init("serve", lv);
        o.http.dir = o.dir;
        o.http.no_verify = o.no_verify;
        o.http.load = o.load;
        o.http.workers = o.workers;
        if (o.max_queue)
            o.http.max_queue = o.max_queue;
        if (o.max_queued_tokens)
            o.http.max_queued_tokens = o.max_queued_tokens;
        bool edge =
            o.http.api_key_file || o.http.metrics_need_key || o.http.tls_cert || o.http.tls_key;
        if (!o.http_on && edge) {
            ops_fail("serve", "--api-key-file, --metrics-need-key, --tls-cert and --tls-key are "
                              "for the HTTP shim: they need --http");
            rc = OPS_EXIT_USAGE;
        } else if (o.http_on && !ops_http_opts_finish(&o.http, "serve"))
            rc = OPS_EXIT_USAGE;
        else if ((rc = ops_device_choose("serve")) < 0)
            rc = serve_package(&o);
    }
    free(o.props);
    return rc;
}

int ops_cmd_serve(int argc, char **argv) {
    ops_config_t cfg;
    int          rc = ops_config_argv("serve", argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    rc = serve_main(&cfg);
    ops_config_fini(&cfg);
    return rc;
}
