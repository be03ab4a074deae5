/*
 * test_serve_accept.c -- the stream processor's acceptance runs against the
 * real Kafka broker (D3_KAFKA_BOOTSTRAP; without it these tests FAIL):
 *
 *   mixed_run    1,000 mixed requests (choice/noul/score, several questions
 *                per request, states shared, bad JSON, invalid UTF-8,
 *                contract failures, a prompt over the length limit) ->
 *                exactly one result per request id, every answer checked,
 *                results of one source partition in input order, offsets
 *                committed at the end.
 *   poison_json  a running serve (no backfill) gets poison records between
 *                good ones (not JSON, not UTF-8, empty, contract failures,
 *                over the 8 MiB body limit, a prompt over the length limit):
 *                one error result each, nothing dead-lettered, the consumer
 *                moves on and commits, the process keeps running.
 *   poison_avro  the same in --format avro: bad magic byte, unknown schema
 *                id, truncated Avro, too short to be framed, JSON bytes:
 *                a 400 result and a dead-letter record (original bytes and
 *                headers, plus d3-error-code/-message and d3-source) each.
 *
 * Request counts scale with D3_TEST_SCALE (test_serve_util.h).
 */
#define TK_NAME_PREFIX "d3test-accept-"
#include "test_serve_util.h"

static void fini(void) {
    children_kill();
}

/* ---------------------------------------------------------------- expectations */

/* One question of a request and what its answer must be. */
typedef struct qexp {
    const char *id, *type;
    int         n_opt; /* options (choice) or levels (score) */
    const char *err;   /* per-question error code, or NULL */
} qexp_t;

typedef struct expect {
    int         status;
    const char *code, *msg; /* whole-request error: code and message prefix */
    int         n_q;
    qexp_t      q[4];
} expect_t;

/* A whole-request error: status, code and the start of the message. */
static expect_t req_err(int status, const char *code, const char *msg) {
    return (expect_t){.status = status, .code = code, .msg = msg};
}

static const qexp_t Q_CHOICE2 = {"c", "choice", 2, NULL};
static const qexp_t Q_CHOICE3 = {"c3", "choice", 3, NULL};
static const qexp_t Q_NOUL = {"n", "noul", 2, NULL};
static const qexp_t Q_SCORE = {"s", "score", 3, NULL};

static const char *q_text(const qexp_t *q) {
    if (q == &Q_CHOICE2)
        return "\"c\": {\"type\": \"choice\", \"instructions\": \"pick one\", \"criteria\": "
               "{\"a\": \"refund\", \"b\": \"replace\"}}";
    if (q == &Q_CHOICE3)
        return "\"c3\": {\"type\": \"choice\", \"instructions\": \"which team\", \"choices\": "
               "[{\"key\": \"x\"}, {\"key\": \"y\", \"description\": \"sales\"}, {\"key\": "
               "\"z\"}]}";
    if (q == &Q_NOUL)
        return "\"n\": {\"type\": \"noul\", \"instructions\": \"urgent?\"}";
    return "\"s\": {\"type\": \"score\", \"instructions\": \"severity\", \"criteria\": "
           "[\"low\", \"mid\", \"high\"]}";
}

/* Request i of the mixed run: its record and its expected result. The value
 * points into buf, or to the heap (*heap set: the caller frees it). */
static void mixed_request(int i, req_t *r, char *buf, size_t size, expect_t *e, bool *heap) {
    snprintf(r->key, sizeof r->key, "k%06d", i);
    snprintf(r->rid, sizeof r->rid, "mix-%06d", i);
    memset(e, 0, sizeof *e);
    *heap = false;
    e->status = 200;
    int state = i / 4; /* four requests in a row share a state */
    switch (i % 40) {
    case 0:
        snprintf(buf, size, "not json %d", i);
        *e = req_err(400, "invalid_request", "the request body is not JSON");
        break;
    case 1:
        snprintf(buf, size, "{\"state\": \"bad \xff\xfe %d\", \"questions\": {%s}}", i,
                 q_text(&Q_NOUL));
        *e = req_err(400, "invalid_request", "the request body is not JSON");
        break;
    case 2: /* every question invalid */
        snprintf(
            buf, size,
            "{\"state\": \"s%d\", \"questions\": {\"q\": {\"type\": \"score\", "
            "\"criteria\": [\"only\"]}, \"r\": {\"type\": \"noul\", \"instructions\": \" \"}}}",
            i);
        *e = req_err(400, "invalid_request", "no question is valid (q: criteria must list");
        break;
    case 3:
        snprintf(buf, size, "{\"state\": \"s%d\", \"seed\": 1, \"questions\": {%s}}", i,
                 q_text(&Q_NOUL));
        *e = req_err(400, "invalid_request", "unknown request fields: ['seed']");
        break;
    case 4:
        snprintf(buf, size, "{\"questions\": {%s}}", q_text(&Q_SCORE));
        *e = req_err(400, "invalid_request", "state is required");
        break;
    case 5: { /* one question over the package's max_length (8,192 tokens) */
        size_t n = 40000;
        char  *big = malloc(n + 512);
        cr_assert_not_null(big);
        int h = snprintf(big, 512,
                         "{\"state\": \"customer %d\", \"questions\": {\"long\": {\"type\": "
                         "\"noul\", \"instructions\": \"",
                         state);
        for (size_t k = 0; k < n; k += 5)
            memcpy(big + h + k, "word ", 5);
        snprintf(big + h + n, 512, "\"}, %s}}", q_text(&Q_NOUL));
        r->value = big;
        r->len = strlen(big);
        *heap = true;
        e->n_q = 2;
        e->q[0] = (qexp_t){"long", "noul", 2, "max_length_exceeded"};
        e->q[1] = Q_NOUL;
        return;
    }
    case 6: /* one invalid question beside a valid one: 200 */
        snprintf(buf, size,
                 "{\"state\": \"customer %d\", \"questions\": {\"bad\": {\"type\": \"set\"}, "
                 "%s}}",
                 state, q_text(&Q_CHOICE2));
        e->n_q = 2;
        e->q[0] = (qexp_t){"bad", "set", 0, "invalid_question"};
        e->q[1] = Q_CHOICE2;
        break;
    case 7:
        snprintf(buf, size, "{\"model\": \"nope\", \"state\": \"s\", \"questions\": {%s}}",
                 q_text(&Q_NOUL));
        *e = req_err(404, "model_not_found", "this runtime serves ");
        break;
    default: { /* valid: 1 to 3 questions about a shared state */
        static const qexp_t *const all[] = {&Q_CHOICE2, &Q_NOUL, &Q_SCORE, &Q_CHOICE3};
        e->n_q = 1 + (i % 4 == 0) + (i % 12 == 0);
        int h = snprintf(
            buf, size, "{\"state\": \"customer %d: the parcel is late\", \"questions\": {", state);
        for (int k = 0; k < e->n_q; k++) {
            const qexp_t *q = all[(i + k) % 4];
            e->q[k] = *q;
            h += snprintf(buf + h, size - (size_t)h, "%s%s", k ? ", " : "", q_text(q));
        }
        snprintf(buf + h, size - (size_t)h, "}}");
    }
    }
    r->value = buf;
    r->len = strlen(buf);
}

/* A probability map of n entries: each in [0, 1], sum 1 (SPEC b.2: divided
 * by their sum in double precision, never rounded, b.3). Returns the index of
 * the first largest and sets *mean (sum of index x probability). */
static int check_probs(const char *where, json_t *probs, int n, bool score, double *mean) {
    cr_assert(json_is_object(probs), "%s: probabilities", where);
    cr_assert_eq((int)json_object_size(probs), n, "%s: %d probabilities, want %d", where,
                 (int)json_object_size(probs), n);
    double      sum = 0, best = -1;
    int         arg = -1, k = 0;
    const char *key;
    json_t     *p;
    *mean = 0;
    json_object_foreach(probs, key, p) {
        cr_assert(json_is_real(p) || json_is_integer(p), "%s.%s: not a number", where, key);
        double v = json_number_value(p);
        cr_assert(v >= 0 && v <= 1, "%s.%s: %.17g", where, key, v);
        if (score) {
            char want[16];
            snprintf(want, sizeof want, "%d", k);
            cr_assert_str_eq(key, want, "%s: score keys are 0..n-1", where);
        }
        sum += v;
        *mean += k * v;
        if (v > best) {
            best = v;
            arg = k;
        }
        k++;
    }
    cr_assert(fabs(sum - 1) <= 1e-9, "%s: probabilities sum to %.17g", where, sum);
    return arg;
}

static void check_answer(const char *rid, const qexp_t *q, json_t *a) {
    char where[128];
    snprintf(where, sizeof where, "%s.%s", rid, q->id);
    cr_assert(json_is_object(a), "%s: no answer", where);
    cr_assert_str_eq(json_string_value(json_object_get(a, "type")), q->type, "%s: type", where);
    if (q->err) {
        cr_assert_str_eq(json_string_value(json_object_get(a, "error")), q->err, "%s: error",
                         where);
        return;
    }
    cr_assert_null(json_object_get(a, "error"), "%s: unexpected error", where);
    double mean;
    if (!strcmp(q->type, "noul")) {
        double p = json_number_value(json_object_get(a, "noul"));
        cr_assert(json_is_number(json_object_get(a, "noul")) && p >= 0 && p <= 1, "%s: noul %g",
                  where, p);
        return;
    }
    double conf = json_number_value(json_object_get(a, "confidence"));
    cr_assert(json_is_number(json_object_get(a, "confidence")) && conf >= 0 && conf <= 1,
              "%s: confidence %g", where, conf);
    bool score = !strcmp(q->type, "score");
    int  arg = check_probs(where, json_object_get(a, "probabilities"), q->n_opt, score, &mean);
    if (score) {
        double s = json_number_value(json_object_get(a, "score"));
        cr_assert(fabs(s - mean) <= 1e-9 * q->n_opt, "%s: score %.17g, probabilities give %.17g",
                  where, s, mean);
        cr_assert_eq((int)json_object_size(json_object_get(a, "legend")), q->n_opt, "%s: legend",
                     where);
    } else {
        /* choice: the first key with the largest probability */
        const char *key, *chosen = json_string_value(json_object_get(a, "choice"));
        json_t     *p;
        int         k = 0;
        json_object_foreach(json_object_get(a, "probabilities"), key, p) {
            if (k++ == arg)
                cr_assert_str_eq(chosen ? chosen : "(none)", key, "%s: choice", where);
        }
    }
}

/* One JSON result record against its expectation. */
static void check_result(const rec_t *r, const req_t *req, const expect_t *e, const char *ctype) {
    assert_result_headers(r, e->status, req->rid, ctype);
    json_error_t je;
    json_t      *v = json_loadb(r->value, r->value_len, 0, &je);
    cr_assert_not_null(v, "%s: the result does not parse: %s", req->rid, je.text);
    if (e->code) {
        json_t *err = json_object_get(v, "error");
        cr_assert_str_eq(json_string_value(json_object_get(err, "code")), e->code, "%s: %s",
                         req->rid, (char *)r->value);
        const char *msg = json_string_value(json_object_get(err, "message"));
        cr_assert(msg && !strncmp(msg, e->msg, strlen(e->msg)), "%s: message %s, want %s...",
                  req->rid, msg ? msg : "(none)", e->msg);
    } else {
        cr_assert(json_is_string(json_object_get(v, "model")), "%s: model", req->rid);
        cr_assert(json_is_object(json_object_get(v, "usage")), "%s: usage", req->rid);
        json_t *answers = json_object_get(v, "answers");
        cr_assert(json_is_object(answers), "%s: no answers: %s", req->rid, (char *)r->value);
        cr_assert_eq((int)json_object_size(answers), e->n_q, "%s: %d answers, want %d", req->rid,
                     (int)json_object_size(answers), e->n_q);
        for (int k = 0; k < e->n_q; k++)
            check_answer(req->rid, &e->q[k], json_object_get(answers, e->q[k].id));
    }
    json_decref(v);
}

/* The source partition and offset of d3-source "topic/partition/offset". */
static void source_of(const rec_t *r, int *part, int64_t *off) {
    char buf[256];
    cr_assert(header(r, "d3-source", buf, sizeof buf), "%s: no d3-source", r->key);
    char *slash = strrchr(buf, '/');
    cr_assert_not_null(slash, "d3-source %s", buf);
    *off = strtoll(slash + 1, NULL, 10);
    *slash = '\0';
    slash = strrchr(buf, '/');
    cr_assert_not_null(slash, "d3-source %s", buf);
    *part = (int)strtol(slash + 1, NULL, 10);
    cr_assert(*part >= 0 && *part < N_PARTS, "d3-source partition %d", *part);
}

/* Results of one source partition appear in input order on each results
 * partition: their origin offsets increase. */
static void assert_input_order(const rec_t *recs, int n) {
    int64_t last[N_PARTS][N_PARTS];
    for (int a = 0; a < N_PARTS; a++)
        for (int b = 0; b < N_PARTS; b++)
            last[a][b] = -1;
    for (int k = 0; k < n; k++) {
        int     sp;
        int64_t off;
        source_of(&recs[k], &sp, &off);
        int rp = recs[k].partition;
        cr_assert(rp >= 0 && rp < N_PARTS);
        cr_assert_gt(off, last[rp][sp],
                     "results partition %d: source partition %d offset %lld after %lld", rp, sp,
                     (long long)off, (long long)last[rp][sp]);
        last[rp][sp] = off;
    }
}

/* ---------------------------------------------------------------- tests */

Test(accept, mixed_run, .timeout = 3600, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    int       n = scaled(1000, 80);
    req_t    *reqs = calloc((size_t)n, sizeof *reqs);
    expect_t *want = calloc((size_t)n, sizeof *want);
    bool     *heap = calloc((size_t)n, sizeof *heap);
    char     *bufs = calloc((size_t)n, 1024);
    cr_assert(reqs && want && heap && bufs);
    for (int i = 0; i < n; i++)
        mixed_request(i, &reqs[i], bufs + (size_t)i * 1024, 1024, &want[i], &heap[i]);
    produce(t.in, reqs, n);

    char base[2048], cmd[4096], log[128];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "");
    snprintf(cmd, sizeof cmd, "%s --stop-at-end", base);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    int64_t t0 = now_ms();
    pid_t   pid = child_start(cmd, log);

    /* Read results while serve runs; it exits 0 at the end of the input. */
    watch_t w;
    watch_init(&w, t.out, "read_committed", n, true);
    int64_t last = now_ms();
    int     st = -1;
    while (st < 0 || w.distinct < n) {
        if (watch_poll(&w, 200) > 0)
            last = now_ms();
        int s;
        if (st < 0 && waitpid(pid, &s, WNOHANG) == pid) {
            child_forget(pid);
            cr_assert(WIFEXITED(s) && WEXITSTATUS(s) == 0, "serve: %s %d (see %s)",
                      WIFEXITED(s) ? "exit" : "signal", WIFEXITED(s) ? WEXITSTATUS(s) : WTERMSIG(s),
                      log);
            st = 0;
            last = now_ms();
        }
        cr_assert(now_ms() - last < wait_ms(),
                  "%d of %d requests answered; nothing new for %d ms (serve %s; log %s)",
                  w.distinct, n, wait_ms(), st < 0 ? "runs" : "exited", log);
    }
    int64_t ms = now_ms() - t0;
    cr_assert_eq(topic_end_sum(t.out), (int64_t)w.total, "the results topic holds more records");
    cr_assert_eq(w.total, n, "%d results for %d requests", w.total, n);

    for (int k = 0; k < w.n_recs; k++) {
        char rid[64];
        cr_assert(header(&w.recs[k], "d3-request-id", rid, sizeof rid));
        int i = rid_index(rid);
        cr_assert_eq(w.count[i], 1, "%s: %d results", rid, w.count[i]);
        cr_assert_str_eq(w.recs[k].key, reqs[i].key, "%s: the result's key", rid);
        check_result(&w.recs[k], &reqs[i], &want[i], "application/json");
    }
    assert_input_order(w.recs, w.n_recs);
    static rec_t dlq[MAX_RECS];
    cr_assert_eq(read_all(t.dlq, dlq, MAX_RECS), 0, "JSON mode dead-letters nothing");
    assert_committed_at_end(t.group, t.in);
    cr_log_info("mixed_run: %d requests answered in %lld ms (%.1f requests/s)", n, (long long)ms,
                n * 1000.0 / (double)(ms ? ms : 1));
    fprintf(stderr, "mixed_run: %d requests answered in %lld ms\n", n, (long long)ms);
    watch_fini(&w);
    for (int i = 0; i < n; i++)
        if (heap[i])
            free((void *)reqs[i].value);
    free(reqs);
    free(want);
    free(heap);
    free(bufs);
    rm_tree(dir);
}

/* A running serve (no --stop-at-end) answers every record in reqs; returns
 * the watcher (read_committed, records kept). The process must still run. */
static void live_run(const char *dir, const char *pkg, topics_t *t, const char *extra,
                     const req_t *reqs, int n, watch_t *w, pid_t *pid, char *log) {
    char base[2048];
    serve_cmd(base, sizeof base, pkg, t->group, t->in, t->out, t->dlq, extra);
    snprintf(log, 128, "%s/serve.log", dir);
    *pid = child_start(base, log);
    produce(t->in, reqs, n);
    watch_init(w, t->out, "read_committed", n, true);
    const char *logs[] = {log};
    watch_until(w, n, pid, 1, logs, 1);
    watch_drain(w, 500);
    cr_assert_eq(w->total, n, "%d results for %d requests", w->total, n);
    /* It moved on past every poison record and committed, still running. */
    wait_committed_at_end(t->group, t->in);
    child_assert_running(*pid, log);
}

Test(accept, poison_json, .timeout = 900, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_name(&t);
    /* The input topic takes a body one byte over serve's 8 MiB limit. */
    create_topic_cfg(t.in, N_PARTS, (const char *const[]){"max.message.bytes", "16777216", NULL});
    create_topic(t.out);
    create_topic(t.dlq);

    enum { N = 40 };
    static req_t    reqs[N];
    static char     bufs[N][1024];
    static expect_t want[N];
    bool            heap[N] = {0};
    size_t          big_n = (size_t)SCH_DEFAULT_MAX_REQUEST_BYTES + 1;
    char           *big = malloc(big_n + 1);
    cr_assert_not_null(big);
    for (int i = 0; i < N; i++) {
        char *b = bufs[i];
        snprintf(reqs[i].key, sizeof reqs[i].key, "k%06d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "poison-%06d", i);
        want[i] = (expect_t){.status = 200, .n_q = 1, .q = {Q_NOUL}};
        snprintf(b, 1024, "{\"state\": \"item %d\", \"questions\": {%s}}", i, q_text(&Q_NOUL));
        switch (i) {
        case 3:
            snprintf(b, 1024, "not json");
            want[i] = req_err(400, "invalid_request", "the request body is not JSON");
            break;
        case 6:
            snprintf(b, 1024, "\xff\xfe\xfd");
            want[i] = req_err(400, "invalid_request", "the request body is not JSON");
            break;
        case 9:
            b[0] = '\0';
            want[i] = req_err(400, "invalid_request", "the request body is not JSON");
            break;
        case 12:
            snprintf(b, 1024, "[1, 2]");
            want[i] = req_err(400, "invalid_request", "the request body must be a JSON object");
            break;
        case 15:
            snprintf(b, 1024, "{\"state\": null, \"questions\": {%s}}", q_text(&Q_NOUL));
            want[i] = req_err(400, "invalid_request", "state must be text");
            break;
        case 18:
            snprintf(b, 1024, "{\"state\": \"x\", \"questions\": {}}");
            want[i] = req_err(400, "invalid_request", "questions must be a nonempty mapping");
            break;
        case 21: /* one byte over the request body limit */
            memcpy(big, "{\"state\": \"", 11);
            memset(big + 11, 'a', big_n - 13);
            memcpy(big + big_n - 2, "\"}", 3);
            reqs[i].value = big;
            reqs[i].len = big_n;
            want[i] = req_err(413, "request_too_large", "the request body exceeds 8388608 bytes");
            continue;
        case 24: { /* a prompt over the length limit */
            bool     h;
            expect_t e;
            mixed_request(5, &reqs[i], b, 1024, &e, &h);
            snprintf(reqs[i].key, sizeof reqs[i].key, "k%06d", i);
            snprintf(reqs[i].rid, sizeof reqs[i].rid, "poison-%06d", i);
            want[i] = e;
            heap[i] = h;
            continue;
        }
        default:
            break;
        }
        reqs[i].value = b;
        reqs[i].len = strlen(b);
    }
    watch_t w;
    pid_t   pid;
    char    log[128];
    live_run(dir, pkg, &t, "", reqs, N, &w, &pid, log);
    for (int k = 0; k < w.n_recs; k++) {
        char rid[64];
        cr_assert(header(&w.recs[k], "d3-request-id", rid, sizeof rid));
        int i = rid_index(rid);
        cr_assert_eq(w.count[i], 1, "%s: %d results", rid, w.count[i]);
        check_result(&w.recs[k], &reqs[i], &want[i], "application/json");
    }
    static rec_t dlq[MAX_RECS];
    cr_assert_eq(read_all(t.dlq, dlq, MAX_RECS), 0, "JSON mode dead-letters nothing");
    child_term_ok(pid, log);
    assert_committed_at_end(t.group, t.in);
    watch_fini(&w);
    for (int i = 0; i < N; i++)
        if (heap[i])
            free((void *)reqs[i].value);
    free(big);
    rm_tree(dir);
}

Test(accept, poison_avro, .timeout = 900, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    enum { N = 30 };
    static req_t     reqs[N];
    static svc_buf_t frames[N];
    const char      *why[N] = {0}; /* undecodable: a word of the reason */
    char             json[512];
    for (int i = 0; i < N; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, "k%06d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "avro-%06d", i);
        snprintf(json, sizeof json, "{\"state\": \"avro %d\", \"questions\": {%s}}", i,
                 q_text(&Q_CHOICE2));
        avro_frame(json, SCH_AVRO_ID_REQUEST, &frames[i]);
        uint8_t *f = (uint8_t *)frames[i].data;
        switch (i) {
        case 4: /* bad magic byte */
            f[0] = 7;
            why[i] = "magic";
            break;
        case 8: /* unknown schema id */
            f[4] = 99;
            why[i] = "unknown schema id";
            break;
        case 12: /* truncated Avro body */
            frames[i].len = 5 + (frames[i].len - 5) / 2;
            why[i] = "Avro";
            break;
        case 16: /* too short to be framed */
            frames[i].len = 3;
            why[i] = "Confluent";
            break;
        case 20: /* JSON bytes sent to an Avro topic */
            frames[i].len = (size_t)snprintf((char *)f, frames[i].len, "{\"state\": 1}");
            why[i] = "Confluent";
            break;
        default:
            break;
        }
        reqs[i].value = frames[i].data;
        reqs[i].len = frames[i].len;
    }
    watch_t w;
    pid_t   pid;
    char    log[128];
    live_run(dir, pkg, &t, "--format avro", reqs, N, &w, &pid, log);
    int n_bad = 0;
    for (int k = 0; k < w.n_recs; k++) {
        rec_t *r = &w.recs[k];
        char   rid[64], errstr[256];
        cr_assert(header(r, "d3-request-id", rid, sizeof rid));
        int i = rid_index(rid);
        cr_assert_eq(w.count[i], 1, "%s: %d results", rid, w.count[i]);
        assert_result_headers(r, why[i] ? 400 : 200, reqs[i].rid, "application/vnd.d3.answer+avro");
        uint32_t    id;
        const void *body;
        size_t      blen;
        cr_assert_eq(
            sch_frame_parse(r->value, r->value_len, &id, &body, &blen, errstr, sizeof errstr),
            SVC_OK, "%s: %s", rid, errstr);
        cr_assert_eq(id, SCH_AVRO_ID_ANSWER);
        svc_buf_t out;
        svc_buf_init(&out, SIZE_MAX / 2);
        cr_assert_eq(sch_avro_answer_to_json(NULL, body, blen, &out, errstr, sizeof errstr), SVC_OK,
                     "%s: %s", rid, errstr);
        rec_t j = {.key = r->key, .value = out.data, .value_len = out.len, .hdrs = r->hdrs};
        if (why[i]) {
            n_bad++;
            cr_assert(strstr(out.data, "\"invalid_request\"") && strstr(out.data, why[i]),
                      "%s: %s (want %s)", rid, out.data, why[i]);
        } else {
            expect_t e = {.status = 200, .n_q = 1, .q = {Q_CHOICE2}};
            check_result(&j, &reqs[i], &e, "application/vnd.d3.answer+avro");
        }
        svc_buf_fini(&out);
    }
    static rec_t dlq[MAX_RECS];
    int          n = read_all(t.dlq, dlq, MAX_RECS);
    cr_assert_eq(n, n_bad, "%d dead-letter records for %d undecodable", n, n_bad);
    for (int k = 0; k < n; k++) {
        int i = -1;
        cr_assert_eq(sscanf(dlq[k].key, "k%d", &i), 1, "dead-letter key %s", dlq[k].key);
        cr_assert(i >= 0 && i < N && why[i], "dead-letter record for a good request %s",
                  dlq[k].key);
        cr_assert(dlq[k].value_len == reqs[i].len &&
                      !memcmp(dlq[k].value, reqs[i].value, reqs[i].len),
                  "%s: the dead-letter value is not the original bytes", dlq[k].key);
        char buf[512];
        cr_assert(header(&dlq[k], "d3-error-code", buf, sizeof buf) && buf[0]);
        cr_assert(header(&dlq[k], "d3-error-message", buf, sizeof buf) && buf[0]);
        cr_assert(header(&dlq[k], "d3-source", buf, sizeof buf) &&
                      !strncmp(buf, t.in, strlen(t.in)),
                  "%s: d3-source %s", dlq[k].key, buf);
        cr_assert(header(&dlq[k], "d3-request-id", buf, sizeof buf) && !strcmp(buf, reqs[i].rid),
                  "the original headers are kept");
    }
    recs_free(dlq, n);
    child_term_ok(pid, log);
    assert_committed_at_end(t.group, t.in);
    watch_fini(&w);
    for (int i = 0; i < N; i++)
        svc_buf_fini(&frames[i]);
    rm_tree(dir);
}
