/*
 * test_serve.c -- `d3stream serve` end to end against the real Kafka broker
 * that ops/test.sh starts (D3_KAFKA_BOOTSTRAP; without it these tests FAIL,
 * never skip): a package from make-package, requests produced to a
 * 3-partition topic, serve run as a subprocess, the results topic, the
 * dead-letter topic and the group's committed offsets read back.
 * Each wait is bounded by 30 s times D3_TEST_TIMEOUT_MULT.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "schemas.h"
#include "test_util.h"

#define TK_NAME_PREFIX  "d3test-serve-"
#define TK_NAME_COUNTER 1
#include "test_kafka_util.h"

#define N_PARTS  3
#define MAX_RECS 1024

/* ---------------------------------------------------------------- helpers */

static const char *binary(void) {
    const char *b = getenv("D3STREAM");
    cr_assert(b && *b, "D3STREAM (path of the d3stream binary) is not set; run through ctest");
    return b;
}

/* Creates a topic of N_PARTS partitions and waits until each has a leader. */
static void create_topic(const char *topic) {
    rd_kafka_t                     *rk = client_new(RD_KAFKA_PRODUCER, NULL);
    tk_admin_t                      a;
    rd_kafka_event_t               *ev = create_topics_begin(&a, rk, topic, N_PARTS, false);
    size_t                          n;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    cr_assert(n == 1 && rd_kafka_topic_result_error(res[0]) == RD_KAFKA_RESP_ERR_NO_ERROR,
              "CreateTopics \"%s\": %s", topic,
              n ? rd_kafka_topic_result_error_string(res[0]) : rd_kafka_event_error_string(ev));
    create_topics_end(&a);
    wait_topic_ready(rk, topic, N_PARTS, "not ready");
    rd_kafka_destroy(rk);
}

/* One request record to produce. */
typedef struct req {
    char        key[32], rid[32];
    const void *value;
    size_t      len;
} req_t;

static void produce(const char *topic, const req_t *reqs, int n) {
    rd_kafka_t *rk =
        client_new(RD_KAFKA_PRODUCER,
                   (const char *const[]){"linger.ms", "5", "message.max.bytes", "1000000", NULL});
    for (int i = 0; i < n; i++) {
        rd_kafka_resp_err_t err =
            rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_KEY(reqs[i].key, strlen(reqs[i].key)),
                              RD_KAFKA_V_VALUE((void *)reqs[i].value, reqs[i].len),
                              RD_KAFKA_V_HEADER("d3-request-id", reqs[i].rid, -1), RD_KAFKA_V_END);
        cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "produce %d: %s", i, rd_kafka_err2str(err));
        rd_kafka_poll(rk, 0);
    }
    cr_assert_eq(rd_kafka_flush(rk, wait_ms()), RD_KAFKA_RESP_ERR_NO_ERROR, "flush");
    rd_kafka_destroy(rk);
}

typedef struct rec {
    char               *key; /* NUL-terminated copy */
    void               *value;
    size_t              value_len;
    rd_kafka_headers_t *hdrs;
} rec_t;

/* Every record of every partition of topic, from the beginning to the end. */
static int read_all(const char *topic, rec_t *recs, int max) {
    char group[160];
    unique_name(group, sizeof group, "reader");
    rd_kafka_t *rk = client_new(
        RD_KAFKA_CONSUMER, (const char *const[]){"group.id", group, "enable.auto.commit", "false",
                                                 "enable.partition.eof", "true", NULL});
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(N_PARTS);
    for (int p = 0; p < N_PARTS; p++)
        rd_kafka_topic_partition_list_add(parts, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    cr_assert_eq(rd_kafka_assign(rk, parts), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(parts);
    int     n = 0, eofs = 0;
    int64_t deadline = now_ms() + wait_ms();
    while (eofs < N_PARTS) {
        cr_assert(now_ms() < deadline, "reading \"%s\": no end after %d ms", topic, wait_ms());
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eofs++;
            rd_kafka_message_destroy(m);
            continue;
        }
        cr_assert_eq(m->err, RD_KAFKA_RESP_ERR_NO_ERROR, "%s", rd_kafka_message_errstr(m));
        cr_assert(n < max, "more than %d records in \"%s\"", max, topic);
        rec_t *r = &recs[n++];
        r->key = calloc(1, m->key_len + 1);
        cr_assert_not_null(r->key);
        if (m->key)
            memcpy(r->key, m->key, m->key_len);
        r->value = malloc(m->len + 1);
        cr_assert_not_null(r->value);
        if (m->len)
            memcpy(r->value, m->payload, m->len);
        ((char *)r->value)[m->len] = '\0';
        r->value_len = m->len;
        rd_kafka_headers_t *h = NULL;
        r->hdrs = rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR
                      ? rd_kafka_headers_copy(h)
                      : NULL;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

static void recs_free(rec_t *recs, int n) {
    for (int i = 0; i < n; i++) {
        free(recs[i].key);
        free(recs[i].value);
        if (recs[i].hdrs)
            rd_kafka_headers_destroy(recs[i].hdrs);
    }
}

/* Header name of r as a NUL-terminated copy in buf; false when absent. */
static bool header(const rec_t *r, const char *name, char *buf, size_t size) {
    const void *v;
    size_t      n;
    if (!r->hdrs || rd_kafka_header_get_last(r->hdrs, name, &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        n >= size)
        return false;
    memcpy(buf, v, n);
    buf[n] = '\0';
    return true;
}

/* The group's committed offsets equal the high watermarks of topic. */
static void assert_committed_at_end(const char *group, const char *topic) {
    rd_kafka_t *rk = client_new(RD_KAFKA_CONSUMER, (const char *const[]){"group.id", group, NULL});
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(N_PARTS);
    for (int p = 0; p < N_PARTS; p++)
        rd_kafka_topic_partition_list_add(parts, topic, p);
    cr_assert_eq(rd_kafka_committed(rk, parts, wait_ms()), RD_KAFKA_RESP_ERR_NO_ERROR);
    for (int p = 0; p < N_PARTS; p++) {
        int64_t lo, hi;
        cr_assert_eq(rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, wait_ms()),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
        int64_t c = parts->elems[p].offset;
        cr_assert(c == hi || (hi == 0 && c < 0),
                  "partition %d: committed %lld, high watermark %lld", p, (long long)c,
                  (long long)hi);
    }
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_destroy(rk);
}

/* A package from make-package in a new temp dir (dir: 64 bytes). */
static void make_package(char *dir, char *pkg, size_t pkg_size) {
    snprintf(dir, 64, "/tmp/d3serve-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(pkg, pkg_size, "%s/pkg", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' make-package --size tiny --out '%s' >/dev/null 2>&1", binary(),
             pkg);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* The serve command line (without redirections) for these topics. */
static void serve_cmd(char *cmd, size_t size, const char *pkg, const char *group, const char *in,
                      const char *out, const char *dlq, const char *extra) {
    int n = snprintf(cmd, size,
                     "'%s' serve --model '%s' --brokers '%s' --group '%s' --input '%s' "
                     "--output '%s' --dlq '%s' --from-beginning %s",
                     binary(), pkg, bootstrap(), group, in, out, dlq, extra);
    cr_assert(n > 0 && (size_t)n < size);
}

/* Runs serve --stop-at-end to completion; returns its exit status. */
static int serve_backfill(const char *base, const char *dir, const char *log) {
    char cmd[4096];
    int  n = snprintf(cmd, sizeof cmd, "timeout %d %s --stop-at-end 2>>'%s/%s'",
                      wait_ms() / 1000 * 4, base, dir, log);
    cr_assert(n > 0 && (size_t)n < sizeof cmd);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "serve did not exit");
    return WEXITSTATUS(st);
}

/* ---------------------------------------------------------------- requests */

enum { N_REQ = 200 };

/* Request i of the JSON run and the status it must get. Bodies live in
 * static storage (the long one on the heap). */
static int make_request(int i, req_t *r, char *buf, size_t size) {
    snprintf(r->key, sizeof r->key, "k-%04d", i);
    snprintf(r->rid, sizeof r->rid, "rid-%04d", i);
    int status = 200;
    if (i == 0 || i == 1) { /* not JSON: the contract's 400, not the DLQ */
        snprintf(buf, size, i ? "{\"state\": " : "not json %d", i);
        status = 400;
    } else if (i == 2) { /* not UTF-8 */
        snprintf(buf, size, "{\"state\": \"\xff\xfe\"}");
        status = 400;
    } else if (i == 3) { /* a question over the package's max_length: 200 + its error */
        size_t n = 60000;
        char  *big = malloc(n + 200);
        cr_assert_not_null(big);
        int h = snprintf(big, 200, "{\"state\": \"");
        for (size_t k = 0; k < n; k += 5)
            memcpy(big + h + k, "word ", 5);
        snprintf(big + h + n, 200,
                 "\", \"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"x\"}}}");
        r->value = big;
        r->len = strlen(big);
        return 200;
    } else if (i % 9 == 4) { /* every question invalid: 400 */
        snprintf(buf, size,
                 "{\"state\": \"s%d\", \"questions\": {\"q\": {\"type\": \"score\", "
                 "\"criteria\": [\"only\"]}}}",
                 i);
        status = 400;
    } else if (i % 3 == 0) {
        snprintf(buf, size,
                 "{\"state\": \"order %d\", \"questions\": {\"c\": {\"type\": "
                 "\"choice\", \"criteria\": {\"a\": \"A\", \"b\": \"B\", \"c\": null}}}}",
                 i);
    } else if (i % 3 == 1) {
        snprintf(buf, size,
                 "{\"state\": \"ticket %d\", \"questions\": {\"n\": {\"type\": \"noul\", "
                 "\"instructions\": \"urgent?\"}}}",
                 i);
    } else {
        snprintf(buf, size,
                 "{\"state\": \"case %d\", \"questions\": {\"s\": {\"type\": \"score\", "
                 "\"criteria\": [\"low\", \"mid\", \"high\"]}}}",
                 i);
    }
    r->value = buf;
    r->len = strlen(buf);
    return status;
}

/* A 200 body: every answer's probabilities sum to 1 (noul: in [0, 1]). */
static void assert_answers(const rec_t *r) {
    json_error_t je;
    json_t      *v = json_loadb(r->value, r->value_len, 0, &je);
    cr_assert_not_null(v, "%s: value does not parse: %s", r->key, je.text);
    json_t *answers = json_object_get(v, "answers");
    cr_assert(json_is_object(answers), "%s: no answers: %s", r->key, (char *)r->value);
    const char *name;
    json_t     *a;
    json_object_foreach(answers, name, a) {
        if (json_object_get(a, "error"))
            continue; /* a per-question error (max_length_exceeded) */
        json_t *probs = json_object_get(a, "probabilities");
        if (!probs) {
            double p = json_number_value(json_object_get(a, "noul"));
            cr_assert(p >= 0 && p <= 1, "%s.%s: noul %g", r->key, name, p);
            continue;
        }
        double      sum = 0;
        const char *k;
        json_t     *p;
        json_object_foreach(probs, k, p) sum += json_number_value(p);
        cr_assert(sum > 1 - 1e-9 && sum < 1 + 1e-9, "%s.%s: sum %.17g", r->key, name, sum);
    }
    json_decref(v);
}

/* The headers SPEC k lists, with the expected status and request id. */
static void assert_result_headers(const rec_t *r, int status, const char *rid, const char *ctype) {
    char buf[256];
    cr_assert(header(r, "d3-status", buf, sizeof buf), "%s: no d3-status", r->key);
    cr_assert_eq(strtol(buf, NULL, 10), status, "%s: status %s, want %d: %s", r->key, buf, status,
                 (char *)r->value);
    cr_assert(header(r, "d3-request-id", buf, sizeof buf) && !strcmp(buf, rid), "%s: d3-request-id",
              r->key);
    cr_assert(header(r, "d3-source", buf, sizeof buf) && strchr(buf, '/'), "%s: d3-source", r->key);
    cr_assert(header(r, "d3-model", buf, sizeof buf) && buf[0], "%s: d3-model", r->key);
    cr_assert(header(r, "content-type", buf, sizeof buf) && !strcmp(buf, ctype),
              "%s: content-type %s", r->key, buf);
}

/* ---------------------------------------------------------------- tests */

typedef struct topics {
    char in[160], out[160], dlq[160], group[160];
} topics_t;

static void topics_new(topics_t *t) {
    unique_name(t->in, sizeof t->in, "in");
    unique_name(t->out, sizeof t->out, "out");
    unique_name(t->dlq, sizeof t->dlq, "dlq");
    unique_name(t->group, sizeof t->group, "group");
    create_topic(t->in);
    create_topic(t->out);
    create_topic(t->dlq);
}

Test(serve, usage) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' serve --help >/dev/null", binary());
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' serve --exactly-once --model x --brokers b --group g --input i --output o "
             "2>/dev/null",
             binary());
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--exactly-once must be refused with 2");
    snprintf(cmd, sizeof cmd, "'%s' serve --model x 2>/dev/null", binary());
    st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "missing flags: 2");
}

/* 200 JSON requests -> exactly 200 results, one per key, statuses as the
 * contract says; nothing is undecodable in JSON mode, so the DLQ is empty. */
Test(serve, json_backfill, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    static req_t reqs[N_REQ];
    static char  bufs[N_REQ][512];
    int          want[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        want[i] = make_request(i, &reqs[i], bufs[i], sizeof bufs[i]);
    produce(t.in, reqs, N_REQ);
    free((void *)reqs[3].value);

    char base[2048];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "");
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed: see %s/serve.log", dir);

    static rec_t recs[MAX_RECS];
    int          n = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(n, N_REQ, "%d results for %d requests", n, N_REQ);
    bool seen[N_REQ] = {0};
    for (int k = 0; k < n; k++) {
        int i = -1;
        cr_assert_eq(sscanf(recs[k].key, "k-%d", &i), 1, "key %s", recs[k].key);
        cr_assert(i >= 0 && i < N_REQ && !seen[i], "key %s twice or unknown", recs[k].key);
        seen[i] = true;
        assert_result_headers(&recs[k], want[i], reqs[i].rid, "application/json");
        if (want[i] == 200)
            assert_answers(&recs[k]);
        else
            cr_assert(!strncmp(recs[k].value, "{\"error\":{\"code\":\"invalid_request\"", 34),
                      "%s: %s", recs[k].key, (char *)recs[k].value);
        if (i == 3) /* over the package's max_length: that question's error, in a 200 */
            cr_assert(strstr(recs[k].value, "max_length_exceeded"), "%s: %s", recs[k].key,
                      (char *)recs[k].value);
        else
            cr_assert(!strstr(recs[k].value, "max_length_exceeded"), "%s: %s", recs[k].key,
                      (char *)recs[k].value);
    }
    recs_free(recs, n);
    cr_assert_eq(read_all(t.dlq, recs, MAX_RECS), 0, "JSON mode dead-letters nothing");
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}

/* 20 framed Avro requests (schema id 1) + one bad magic byte -> 21 results
 * (20 answers, one 400) and one dead-letter record with the original bytes. */
Test(serve, avro_backfill, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    enum { N_AV = 20 };
    static req_t     reqs[N_AV + 1];
    static svc_buf_t frames[N_AV];
    char             json[512], errstr[256];
    for (int i = 0; i < N_AV; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, "a-%04d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "arid-%04d", i);
        snprintf(json, sizeof json,
                 "{\"state\": \"avro %d\", \"questions\": {\"c\": {\"type\": \"choice\", "
                 "\"criteria\": {\"x\": \"X\", \"y\": \"Y\"}}}}",
                 i);
        svc_buf_t bin;
        svc_buf_init(&bin, SIZE_MAX / 2);
        svc_buf_init(&frames[i], SIZE_MAX / 2);
        cr_assert_eq(sch_avro_request_from_json(json, strlen(json), &bin, errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
        cr_assert_eq(sch_frame_write(SCH_AVRO_ID_REQUEST, bin.data, bin.len, &frames[i]), SVC_OK);
        svc_buf_fini(&bin);
        reqs[i].value = frames[i].data;
        reqs[i].len = frames[i].len;
    }
    static const char bad[] = "\x07\x00\x00\x00\x01garbage";
    snprintf(reqs[N_AV].key, sizeof reqs[N_AV].key, "a-bad");
    snprintf(reqs[N_AV].rid, sizeof reqs[N_AV].rid, "arid-bad");
    reqs[N_AV].value = bad;
    reqs[N_AV].len = sizeof bad - 1;
    produce(t.in, reqs, N_AV + 1);
    for (int i = 0; i < N_AV; i++)
        svc_buf_fini(&frames[i]);

    char base[2048];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "--format avro");
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed: see %s/serve.log", dir);

    static rec_t recs[MAX_RECS];
    int          n = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(n, N_AV + 1, "%d results", n);
    for (int k = 0; k < n; k++) {
        bool is_bad = !strcmp(recs[k].key, "a-bad");
        char rid[32];
        snprintf(rid, sizeof rid, "arid-%s", recs[k].key + 2);
        assert_result_headers(&recs[k], is_bad ? 400 : 200, rid, "application/vnd.d3.answer+avro");
        uint32_t    id;
        const void *body;
        size_t      blen;
        cr_assert_eq(sch_frame_parse(recs[k].value, recs[k].value_len, &id, &body, &blen, errstr,
                                     sizeof errstr),
                     SVC_OK, "%s: %s", recs[k].key, errstr);
        cr_assert_eq(id, SCH_AVRO_ID_ANSWER);
        svc_buf_t out;
        svc_buf_init(&out, SIZE_MAX / 2);
        cr_assert_eq(sch_avro_answer_to_json(NULL, body, blen, &out, errstr, sizeof errstr), SVC_OK,
                     "%s: %s", recs[k].key, errstr);
        if (is_bad)
            cr_assert(strstr(out.data, "invalid_request") && strstr(out.data, "magic"), "%s",
                      out.data);
        else {
            rec_t j = {.key = recs[k].key, .value = out.data, .value_len = out.len};
            assert_answers(&j);
        }
        svc_buf_fini(&out);
    }
    recs_free(recs, n);
    n = read_all(t.dlq, recs, MAX_RECS);
    cr_assert_eq(n, 1, "%d dead-letter records", n);
    cr_assert_str_eq(recs[0].key, "a-bad");
    cr_assert(recs[0].value_len == sizeof bad - 1 && !memcmp(recs[0].value, bad, sizeof bad - 1));
    char buf[512];
    cr_assert(header(&recs[0], "d3-error-code", buf, sizeof buf));
    cr_assert(header(&recs[0], "d3-error-message", buf, sizeof buf));
    cr_assert(header(&recs[0], "d3-source", buf, sizeof buf));
    cr_assert(header(&recs[0], "d3-request-id", buf, sizeof buf) && !strcmp(buf, "arid-bad"),
              "the original headers are kept");
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}

/* SIGTERM mid-run exits 0; a restart with the same group answers the rest:
 * every request at least once (duplicates are allowed and counted). */
Test(serve, sigterm_restart, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    enum { N_SIG = 600 };
    static req_t reqs[N_SIG];
    static char  bufs[N_SIG][256];
    for (int i = 0; i < N_SIG; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, "s-%04d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "srid-%04d", i);
        snprintf(bufs[i], sizeof bufs[i],
                 "{\"state\": \"item %d\", \"questions\": {\"n\": {\"type\": \"noul\", "
                 "\"instructions\": \"keep?\"}}}",
                 i);
        reqs[i].value = bufs[i];
        reqs[i].len = strlen(bufs[i]);
    }
    produce(t.in, reqs, N_SIG);

    char base[2048], cmd[4096];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "");
    snprintf(cmd, sizeof cmd, "exec %s 2>'%s/first.log'", base, dir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* Wait for the first answers (the log names each one), then SIGTERM. */
    char log[128];
    snprintf(log, sizeof log, "%s/first.log", dir);
    int64_t deadline = now_ms() + wait_ms();
    int     lines = 0;
    while (lines < 50 && now_ms() < deadline) {
        usleep(20 * 1000);
        FILE *f = fopen(log, "r");
        lines = 0;
        char line[1024];
        while (f && fgets(line, sizeof line, f))
            lines += strstr(line, " request srid-") != NULL;
        if (f)
            fclose(f);
    }
    cr_assert_geq(lines, 50, "serve answered nothing within %d ms: see %s", wait_ms(), log);
    cr_assert_eq(kill(pid, SIGTERM), 0);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: exit %d (see %s)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, log);
    static rec_t recs[MAX_RECS * 2];
    int          first = read_all(t.out, recs, MAX_RECS * 2);
    recs_free(recs, first);
    cr_log_info("sigterm_restart: %d results before SIGTERM", first);

    cr_assert_eq(serve_backfill(base, dir, "second.log"), 0, "restart failed: see %s", dir);
    int  n = read_all(t.out, recs, MAX_RECS * 2);
    bool seen[N_SIG] = {0};
    int  dups = 0;
    for (int k = 0; k < n; k++) {
        int i = -1;
        cr_assert_eq(sscanf(recs[k].key, "s-%d", &i), 1);
        cr_assert(i >= 0 && i < N_SIG);
        dups += seen[i];
        seen[i] = true;
    }
    for (int i = 0; i < N_SIG; i++)
        cr_assert(seen[i], "request %d never answered", i);
    cr_log_info("sigterm_restart: %d results for %d requests, %d duplicates", n, N_SIG, dups);
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}
