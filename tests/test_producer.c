/*
 * test_producer.c -- producer/ against a real Apache Kafka broker (KRaft, one
 * node, started by ops/kafka.sh; ops/test.sh starts it for the whole suite):
 * result records with and without keys, every header, dead-letter records,
 * delivery reports, transactions seen through read_committed, librdkafka's
 * configuration errors passed on unchanged, and a full local queue.
 *
 * The broker's address comes from D3_KAFKA_BOOTSTRAP (host:port). Without it
 * every broker test here FAILS, never skips. Each wait is bounded by 30 s,
 * times D3_TEST_TIMEOUT_MULT when that is set (the sanitizer run). Topic and
 * group names carry the pid, the time and a counter, so runs never meet.
 */
#include "producer.h"

#include <criterion/criterion.h>
#include <librdkafka/rdkafka.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TK_NAME_PREFIX  "d3test-prod-"
#define TK_NAME_COUNTER 1
#include "test_kafka_util.h"

#define N_TXN    10
#define N_QUEUE  1000
#define MAX_RECS 64

/* ---------------------------------------------------------------- helpers */

/* Creates a one-partition topic through the admin API and waits for it. */
static void create_topic(const char *topic) {
    rd_kafka_t       *rk = client_new(RD_KAFKA_PRODUCER, NULL);
    tk_admin_t        a;
    rd_kafka_event_t *ev = create_topics_begin(&a, rk, topic, 1, true);
    cr_assert_eq(rd_kafka_event_error(ev), RD_KAFKA_RESP_ERR_NO_ERROR, "CreateTopics \"%s\": %s",
                 topic, rd_kafka_event_error_string(ev));
    size_t                          n;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(rd_kafka_topic_result_error(res[0]), RD_KAFKA_RESP_ERR_NO_ERROR,
                 "CreateTopics \"%s\": %s", topic, rd_kafka_topic_result_error_string(res[0]));
    create_topics_end(&a);
    wait_topic_ready(rk, topic, 1, "has no led partition");
    rd_kafka_destroy(rk);
}

/* One record read back: copies, so that no rd_kafka_message_t outlives
 * its consumer. */
typedef struct rec {
    void               *key; /* NULL for a null key */
    size_t              key_len;
    void               *value;
    size_t              value_len;
    rd_kafka_headers_t *hdrs; /* NULL when none */
} rec_t;

static void *dup_bytes(const void *p, size_t n) {
    if (!p)
        return NULL;
    void *d = malloc(n ? n : 1);
    cr_assert_not_null(d);
    memcpy(d, p, n);
    return d;
}

/* Reads partition 0 of topic from the beginning to its end with the given
 * isolation level into recs; returns the count. */
static int read_all(const char *topic, const char *isolation, rec_t *recs, int max) {
    char group[160];
    unique_name(group, sizeof group, "reader");
    const char *const kv[] = {"group.id",
                              group,
                              "enable.auto.commit",
                              "false",
                              "isolation.level",
                              isolation,
                              "enable.partition.eof",
                              "true",
                              NULL};
    rd_kafka_t       *rk = client_new(RD_KAFKA_CONSUMER, kv);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    cr_assert_eq(rd_kafka_assign(rk, parts), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(parts);

    int     n = 0;
    int64_t deadline = now_ms() + wait_ms();
    for (;;) {
        cr_assert(now_ms() < deadline,
                  "%s reader of \"%s\": no end of partition after %d ms "
                  "(%d read)",
                  isolation, topic, wait_ms(), n);
        bool                eof;
        rd_kafka_message_t *m = reader_poll(rk, isolation, &eof);
        if (eof)
            break;
        if (!m)
            continue;
        cr_assert(n < max, "%s reader: more than %d records", isolation, max);
        rec_t *r = &recs[n++];
        r->key = dup_bytes(m->key, m->key_len);
        r->key_len = m->key_len;
        r->value = dup_bytes(m->payload, m->len);
        r->value_len = m->len;
        rd_kafka_headers_t *hdrs = NULL;
        r->hdrs = rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR
                      ? rd_kafka_headers_copy(hdrs)
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

static int bytes_eq(const void *p, size_t n, const void *want, size_t want_len) {
    return n == want_len && (n == 0 || memcmp(p, want, n) == 0);
}

/* Asserts that header name (its last value) is exactly want. */
static void assert_header(const rec_t *r, const char *name, const void *want, size_t want_len) {
    const void *val;
    size_t      len;
    cr_assert_not_null(r->hdrs, "record has no headers (looking for \"%s\")", name);
    cr_assert_eq(rd_kafka_header_get_last(r->hdrs, name, &val, &len), RD_KAFKA_RESP_ERR_NO_ERROR,
                 "record lacks header \"%s\"", name);
    cr_assert(bytes_eq(val, len, want, want_len), "header \"%s\" is \"%.*s\", want \"%.*s\"", name,
              (int)len, (const char *)val, (int)want_len, (const char *)want);
}

static void assert_header_str(const rec_t *r, const char *name, const char *want) {
    assert_header(r, name, want, strlen(want));
}

/* Delivery reports, one slot per message: the opaque is the slot. */
typedef struct report {
    int       calls;
    svc_err_t err;
} report_t;

typedef struct reports {
    int n_ok;
    int n_failed;
} reports_t;

static void on_delivery(void *opaque, svc_err_t err, const char *errstr, void *user) {
    report_t  *rep = opaque;
    reports_t *all = user;
    rep->calls++;
    rep->err = err;
    if (err) {
        all->n_failed++;
        fprintf(stderr, "test_producer: delivery failed: %s: %s\n", svc_err_name(err),
                errstr ? errstr : "(no errstr)");
    } else {
        cr_assert_null(errstr);
        all->n_ok++;
    }
}

static prod_t *producer_new(prod_conf_t *conf, reports_t *all) {
    char errstr[512];
    conf->brokers = bootstrap();
    conf->on_delivery = on_delivery;
    conf->user = all;
    conf->txn_timeout_ms = wait_ms();
    prod_t *prod = prod_new(conf, errstr, sizeof errstr);
    cr_assert_not_null(prod, "prod_new: %s", errstr);
    return prod;
}

static void flush(prod_t *prod) {
    svc_err_t err = prod_flush(prod, wait_ms());
    cr_assert_eq(err, SVC_OK, "flush: %d messages left after %d ms", prod_in_flight(prod),
                 wait_ms());
}

/* ---------------------------------------------------------------- no broker */

Test(producer, request_id_is_32_random_hex) {
    char a[PROD_REQUEST_ID_LEN + 1], b[PROD_REQUEST_ID_LEN + 1];
    cr_assert_eq(prod_request_id_new(a), SVC_OK);
    cr_assert_eq(prod_request_id_new(b), SVC_OK);
    cr_assert_eq(strlen(a), 32);
    for (int i = 0; i < 32; i++)
        cr_assert(isxdigit((unsigned char)a[i]) && !isupper((unsigned char)a[i]), "%s", a);
    cr_assert_str_neq(a, b);
}

/* librdkafka's own errstr comes back unchanged; our own refusals name the
 * property. None of these reach a broker. */
Test(producer, bad_config_fails_with_librdkafkas_message) {
    char              want[512], errstr[512];
    rd_kafka_conf_t  *kc = rd_kafka_conf_new();
    const char *const bad[][2] = {{"no.such.property", "1"}, {"linger.ms", "abc"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_neq(rd_kafka_conf_set(kc, bad[i][0], bad[i][1], want, sizeof want),
                      RD_KAFKA_CONF_OK);
        char prop[128];
        snprintf(prop, sizeof prop, "%s=%s", bad[i][0], bad[i][1]);
        const char *const props[] = {prop, NULL};
        prod_conf_t       conf = {.brokers = "127.0.0.1:1", .results_topic = "r", .props = props};
        errstr[0] = '\0';
        cr_assert_null(prod_new(&conf, errstr, sizeof errstr));
        cr_assert_str_eq(errstr, want, "%s", prop);
    }
    rd_kafka_conf_destroy(kc);

    const char *const refused[] = {"acks=1", "enable.idempotence=false", "linger.ms", NULL};
    for (int i = 0; refused[i]; i++) {
        const char *const props[] = {refused[i], NULL};
        prod_conf_t       conf = {.brokers = "127.0.0.1:1", .results_topic = "r", .props = props};
        cr_assert_null(prod_new(&conf, errstr, sizeof errstr), "%s accepted", refused[i]);
        cr_assert(strstr(errstr, "property \"") != NULL, "%s: %s", refused[i], errstr);
    }
    prod_conf_t conf = {.brokers = "127.0.0.1:1", .results_topic = "r", .content_type = "text/x"};
    cr_assert_null(prod_new(&conf, errstr, sizeof errstr));
    cr_assert(strstr(errstr, "content_type \"text/x\"") != NULL, "%s", errstr);
    conf = (prod_conf_t){.brokers = "127.0.0.1:1", .results_topic = "r", .transactional = true};
    cr_assert_null(prod_new(&conf, errstr, sizeof errstr));
    cr_assert(strstr(errstr, "transactional_id") != NULL, "%s", errstr);
}

/* A non-transactional producer refuses transaction calls; prod_free of a
 * producer whose broker never answers reports the record as undelivered,
 * through the callback too. */
Test(producer, unreachable_broker_close_reports_undelivered) {
    char        errstr[512];
    reports_t   all = {0};
    report_t    rep = {0};
    const char *props[] = {"message.timeout.ms=600000", NULL};
    prod_conf_t conf = {.brokers = "127.0.0.1:1",
                        .results_topic = "r",
                        .props = props,
                        .on_delivery = on_delivery,
                        .user = &all,
                        .close_timeout_ms = 300};
    prod_t     *prod = prod_new(&conf, errstr, sizeof errstr);
    cr_assert_not_null(prod, "%s", errstr);
    cr_assert_eq(prod_txn_begin(prod, errstr, sizeof errstr), SVC_ERR_INVALID);
    cr_assert(strstr(errstr, "not transactional") != NULL, "%s", errstr);
    prod_result_t r = {.value = "{}", .value_len = 2, .status = 200, .source_topic = "in"};
    cr_assert_eq(prod_result_send(prod, &r, &rep, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(prod_free(prod), 1);
    cr_assert_eq(rep.calls, 1);
    cr_assert_neq(rep.err, SVC_OK);
    cr_assert_eq(all.n_failed, 1);
}

/* ---------------------------------------------------------------- broker */

/*
 * A keyed result and a key-less one (keyed and identified by a generated
 * 32-hex request id), read back with a plain consumer: value bytes, key and
 * every header; one successful delivery report each. An Avro producer's
 * binary value and content type come back byte for byte.
 */
Test(producer, results_keys_values_headers) {
    char topic[160];
    unique_name(topic, sizeof topic, "results");
    create_topic(topic);

    reports_t   all = {0};
    report_t    rep[3] = {0};
    prod_conf_t conf = {.results_topic = topic};
    prod_t     *prod = producer_new(&conf, &all);
    char        errstr[512];

    const char   *ok_body = "{\"answers\":[{\"id\":\"q1\",\"probabilities\":{\"A\":0.75}}]}";
    const char   *err_body = "{\"error\":{\"code\":\"invalid_request\",\"message\":\"bad\"}}";
    prod_result_t keyed = {.key = "req-key-1",
                           .key_len = 9,
                           .value = ok_body,
                           .value_len = strlen(ok_body),
                           .status = 200,
                           .request_id = "rid-1",
                           .model_id = "d3-nano",
                           .source_topic = "d3.requests",
                           .source_partition = 2,
                           .source_offset = 42};
    prod_result_t keyless = {.value = err_body,
                             .value_len = strlen(err_body),
                             .status = 400,
                             .source_topic = "d3.requests",
                             .source_partition = 0,
                             .source_offset = 7};
    cr_assert_eq(prod_result_send(prod, &keyed, &rep[0], errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_assert_eq(prod_result_send(prod, &keyless, &rep[1], errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    flush(prod);
    prod_stats_t st;
    prod_stats(prod, &st);
    cr_assert_eq(st.produced, 2);
    cr_assert_eq(st.failed, 0);
    cr_assert_eq(prod_free(prod), 0);

    /* The same topic through an Avro producer: bytes with NULs in them. */
    const unsigned char avro[] = {0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x04, 'q', '1', 0xff};
    prod_conf_t         aconf = {.results_topic = topic, .content_type = PROD_CONTENT_TYPE_AVRO};
    prod = producer_new(&aconf, &all);
    prod_result_t ar = {.key = "k\0bin",
                        .key_len = 5,
                        .value = avro,
                        .value_len = sizeof avro,
                        .status = 200,
                        .request_id = "rid-avro",
                        .model_id = "d3-nano",
                        .source_topic = "t",
                        .source_partition = 1,
                        .source_offset = 9000000000LL};
    cr_assert_eq(prod_result_send(prod, &ar, &rep[2], errstr, sizeof errstr), SVC_OK, "%s", errstr);
    flush(prod);
    cr_assert_eq(prod_free(prod), 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rep[i].calls, 1, "message %d: %d delivery reports", i, rep[i].calls);
        cr_assert_eq(rep[i].err, SVC_OK);
    }
    cr_assert_eq(all.n_ok, 3);
    cr_assert_eq(all.n_failed, 0);

    rec_t recs[MAX_RECS] = {0};
    int   n = read_all(topic, "read_committed", recs, MAX_RECS);
    cr_assert_eq(n, 3);

    cr_assert(bytes_eq(recs[0].key, recs[0].key_len, "req-key-1", 9));
    cr_assert(bytes_eq(recs[0].value, recs[0].value_len, ok_body, strlen(ok_body)));
    assert_header_str(&recs[0], "d3-request-id", "rid-1");
    assert_header_str(&recs[0], "d3-status", "200");
    assert_header_str(&recs[0], "d3-source", "d3.requests/2/42");
    assert_header_str(&recs[0], "d3-model", "d3-nano");
    assert_header_str(&recs[0], "content-type", "application/json");
    cr_assert_eq(rd_kafka_header_cnt(recs[0].hdrs), 5);

    cr_assert_eq(recs[1].key_len, PROD_REQUEST_ID_LEN, "generated key: %zu bytes", recs[1].key_len);
    for (size_t i = 0; i < recs[1].key_len; i++)
        cr_assert(isxdigit(((unsigned char *)recs[1].key)[i]), "generated key is not hex");
    cr_assert(bytes_eq(recs[1].value, recs[1].value_len, err_body, strlen(err_body)));
    assert_header(&recs[1], "d3-request-id", recs[1].key, recs[1].key_len);
    assert_header_str(&recs[1], "d3-status", "400");
    assert_header_str(&recs[1], "d3-source", "d3.requests/0/7");
    assert_header_str(&recs[1], "d3-model", "");
    assert_header_str(&recs[1], "content-type", "application/json");

    cr_assert(bytes_eq(recs[2].key, recs[2].key_len, "k\0bin", 5));
    cr_assert(bytes_eq(recs[2].value, recs[2].value_len, avro, sizeof avro));
    assert_header_str(&recs[2], "d3-request-id", "rid-avro");
    assert_header_str(&recs[2], "d3-source", "t/1/9000000000");
    assert_header_str(&recs[2], "content-type", PROD_CONTENT_TYPE_AVRO);
    recs_free(recs, n);
}

/*
 * An undecodable message: the dead-letter topic gets its original key,
 * value and headers (in order) plus the error headers, and the results topic
 * still gets the error record. A producer without a dlq_topic refuses.
 */
Test(producer, dead_letter_keeps_original_bytes_and_headers) {
    char results[160], dlq[160], errstr[512];
    unique_name(results, sizeof results, "results");
    unique_name(dlq, sizeof dlq, "dlq");
    create_topic(results);
    create_topic(dlq);

    reports_t   all = {0};
    report_t    rep[2] = {0};
    prod_conf_t conf = {.results_topic = results, .dlq_topic = dlq};
    prod_t     *prod = producer_new(&conf, &all);

    const unsigned char bad_value[] = {0x01, 0x00, 0x00, 0x00, 0x07, 'x', 0x00, 0xfe};
    const unsigned char bin_hdr[] = {0x00, 0x01, 0x02};
    rd_kafka_headers_t *orig = rd_kafka_headers_new(2);
    cr_assert_eq(rd_kafka_header_add(orig, "trace-id", -1, "abc-123", -1), 0);
    cr_assert_eq(rd_kafka_header_add(orig, "bin", -1, bin_hdr, sizeof bin_hdr), 0);
    const char *msg = "value is not a Confluent frame: magic byte 0x01, expected 0x00";
    prod_dlq_t  d = {.key = "orig-key",
                     .key_len = 8,
                     .value = bad_value,
                     .value_len = sizeof bad_value,
                     .headers = orig,
                     .error_code = "invalid_request",
                     .error_message = msg,
                     .source_topic = "d3.requests",
                     .source_partition = 0,
                     .source_offset = 5};
    cr_assert_eq(prod_dlq_send(prod, &d, &rep[0], errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(rd_kafka_header_cnt(orig), 2, "the caller's headers were modified");
    const char   *body = "{\"error\":{\"code\":\"invalid_request\",\"message\":\"...\"}}";
    prod_result_t r = {.key = "orig-key",
                       .key_len = 8,
                       .value = body,
                       .value_len = strlen(body),
                       .status = 400,
                       .source_topic = "d3.requests",
                       .source_partition = 0,
                       .source_offset = 5};
    cr_assert_eq(prod_result_send(prod, &r, &rep[1], errstr, sizeof errstr), SVC_OK, "%s", errstr);
    flush(prod);
    prod_stats_t st;
    prod_stats(prod, &st);
    cr_assert_eq(st.dlq, 1);
    cr_assert_eq(st.produced, 1);
    cr_assert_eq(prod_free(prod), 0);
    cr_assert(rep[0].calls == 1 && rep[0].err == SVC_OK);
    cr_assert(rep[1].calls == 1 && rep[1].err == SVC_OK);

    rec_t recs[MAX_RECS] = {0};
    int   n = read_all(dlq, "read_committed", recs, MAX_RECS);
    cr_assert_eq(n, 1);
    cr_assert(bytes_eq(recs[0].key, recs[0].key_len, "orig-key", 8));
    cr_assert(bytes_eq(recs[0].value, recs[0].value_len, bad_value, sizeof bad_value));
    const char *want_names[] = {"trace-id", "bin", "d3-error-code", "d3-error-message",
                                "d3-source"};
    cr_assert_eq(rd_kafka_header_cnt(recs[0].hdrs), 5);
    for (size_t i = 0; i < 5; i++) {
        const char *name;
        const void *val;
        size_t      len;
        cr_assert_eq(rd_kafka_header_get_all(recs[0].hdrs, i, &name, &val, &len), 0);
        cr_assert_str_eq(name, want_names[i], "header %zu", i);
    }
    assert_header_str(&recs[0], "trace-id", "abc-123");
    assert_header(&recs[0], "bin", bin_hdr, sizeof bin_hdr);
    assert_header_str(&recs[0], "d3-error-code", "invalid_request");
    assert_header_str(&recs[0], "d3-error-message", msg);
    assert_header_str(&recs[0], "d3-source", "d3.requests/0/5");
    recs_free(recs, n);

    n = read_all(results, "read_committed", recs, MAX_RECS);
    cr_assert_eq(n, 1);
    cr_assert(bytes_eq(recs[0].value, recs[0].value_len, body, strlen(body)));
    assert_header_str(&recs[0], "d3-status", "400");
    recs_free(recs, n);

    /* Without a dead-letter topic. */
    prod_conf_t nconf = {.results_topic = results};
    prod = producer_new(&nconf, &all);
    cr_assert_eq(prod_dlq_send(prod, &d, NULL, errstr, sizeof errstr), SVC_ERR_INVALID);
    cr_assert(strstr(errstr, "no dlq_topic") != NULL, "%s", errstr);
    cr_assert_eq(prod_free(prod), 0);
    rd_kafka_headers_destroy(orig);
}

/* Sends N_TXN results "<tag>-<i>" into the open transaction. */
static void send_batch(prod_t *prod, const char *tag, report_t *rep) {
    char errstr[512];
    for (int i = 0; i < N_TXN; i++) {
        char value[64];
        snprintf(value, sizeof value, "%s-%d", tag, i);
        prod_result_t r = {.value = value,
                           .value_len = strlen(value),
                           .status = 200,
                           .model_id = "d3-nano",
                           .source_topic = "in",
                           .source_offset = i};
        cr_assert_eq(prod_result_send(prod, &r, &rep[i], errstr, sizeof errstr), SVC_OK, "%s",
                     errstr);
    }
}

/*
 * A transactional producer: begin, 10 results and the consumer's offsets,
 * commit -> visible to read_committed, offsets committed for the group;
 * begin, 10 results (flushed into the log), abort -> invisible to
 * read_committed, yet in the log (read_uncommitted sees all 20).
 */
Test(producer, transactions_commit_visible_abort_invisible) {
    char topic[160], input[160], group[160], txid[160], errstr[512];
    unique_name(topic, sizeof topic, "txn");
    unique_name(input, sizeof input, "txn-in");
    unique_name(group, sizeof group, "txn-group");
    unique_name(txid, sizeof txid, "txid");
    create_topic(topic);
    create_topic(input);

    reports_t   all = {0};
    report_t    rep[2 * N_TXN] = {0};
    prod_conf_t conf = {.results_topic = topic, .transactional = true, .transactional_id = txid};
    prod_t     *prod = producer_new(&conf, &all);

    prod_result_t outside = {.value = "x", .value_len = 1, .status = 200, .source_topic = "in"};
    cr_assert_eq(prod_result_send(prod, &outside, NULL, errstr, sizeof errstr), SVC_ERR_INVALID);
    cr_assert(strstr(errstr, "outside a transaction") != NULL, "%s", errstr);

    cr_assert_eq(prod_txn_begin(prod, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(prod_txn_begin(prod, errstr, sizeof errstr), SVC_ERR_INVALID, "begin twice: %s",
                 errstr);
    send_batch(prod, "committed", rep);

    /* The consumer's side of exactly-once: its group metadata and the
     * offsets (last processed + 1) go into the same transaction. */
    const char *const                   ckv[] = {"group.id", group, NULL};
    rd_kafka_t                         *cons = client_new(RD_KAFKA_CONSUMER, ckv);
    rd_kafka_consumer_group_metadata_t *cgmd = rd_kafka_consumer_group_metadata(cons);
    rd_kafka_topic_partition_list_t    *offsets = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(offsets, input, 0)->offset = 5;
    svc_err_t err = prod_txn_send_offsets(prod, offsets, cgmd, errstr, sizeof errstr);
    cr_assert_eq(err, SVC_OK, "%s: %s", svc_err_name(err), errstr);
    err = prod_txn_commit(prod, errstr, sizeof errstr);
    cr_assert_eq(err, SVC_OK, "%s: %s", svc_err_name(err), errstr);
    rd_kafka_consumer_group_metadata_destroy(cgmd);
    for (int i = 0; i < N_TXN; i++)
        cr_assert(rep[i].calls == 1 && rep[i].err == SVC_OK, "committed %d: %d reports, %s", i,
                  rep[i].calls, svc_err_name(rep[i].err));

    cr_assert_eq(prod_txn_begin(prod, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    send_batch(prod, "aborted", rep + N_TXN);
    flush(prod); /* in the log, so that the abort marker is what hides them */
    err = prod_txn_abort(prod, errstr, sizeof errstr);
    cr_assert_eq(err, SVC_OK, "%s: %s", svc_err_name(err), errstr);
    for (int i = N_TXN; i < 2 * N_TXN; i++)
        cr_assert_eq(rep[i].calls, 1, "aborted %d: %d reports", i - N_TXN, rep[i].calls);
    prod_stats_t st;
    prod_stats(prod, &st);
    cr_assert_eq(st.produced + st.failed, 2 * N_TXN);
    cr_assert_eq(prod_free(prod), 0);

    rec_t recs[MAX_RECS] = {0};
    int   n = read_all(topic, "read_committed", recs, MAX_RECS);
    cr_assert_eq(n, N_TXN, "read_committed saw %d records, want %d", n, N_TXN);
    for (int i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "committed-%d", i);
        cr_assert(bytes_eq(recs[i].value, recs[i].value_len, want, strlen(want)),
                  "read_committed record %d", i);
        assert_header_str(&recs[i], "d3-model", "d3-nano");
    }
    recs_free(recs, n);
    n = read_all(topic, "read_uncommitted", recs, MAX_RECS);
    cr_assert_eq(n, 2 * N_TXN, "read_uncommitted saw %d records, want %d", n, 2 * N_TXN);
    recs_free(recs, n);

    rd_kafka_topic_partition_list_t *committed = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(committed, input, 0);
    rd_kafka_resp_err_t rerr = rd_kafka_committed(cons, committed, wait_ms());
    cr_assert_eq(rerr, RD_KAFKA_RESP_ERR_NO_ERROR, "committed: %s", rd_kafka_err2str(rerr));
    cr_assert_eq(committed->elems[0].offset, 5, "group offset %" PRId64 ", want 5",
                 committed->elems[0].offset);
    rd_kafka_topic_partition_list_destroy(committed);
    rd_kafka_topic_partition_list_destroy(offsets);
    rd_kafka_destroy(cons);
}

/*
 * queue.buffering.max.messages=10 and 1,000 sends in a row: every send
 * waits for room instead of failing, and all 1,000 arrive with one
 * successful report each.
 */
Test(producer, full_queue_waits_never_drops) {
    char topic[160], errstr[512];
    unique_name(topic, sizeof topic, "queue");
    create_topic(topic);

    static report_t   rep[N_QUEUE];
    reports_t         all = {0};
    const char *const props[] = {"queue.buffering.max.messages=10", "linger.ms=0", NULL};
    prod_conf_t       conf = {.results_topic = topic, .props = props, .queue_wait_ms = wait_ms()};
    prod_t           *prod = producer_new(&conf, &all);
    for (int i = 0; i < N_QUEUE; i++) {
        char value[32];
        snprintf(value, sizeof value, "v-%d", i);
        prod_result_t r = {.value = value,
                           .value_len = strlen(value),
                           .status = 200,
                           .source_topic = "in",
                           .source_offset = i};
        svc_err_t     err = prod_result_send(prod, &r, &rep[i], errstr, sizeof errstr);
        cr_assert_eq(err, SVC_OK, "send %d: %s: %s", i, svc_err_name(err), errstr);
    }
    flush(prod);
    prod_stats_t st;
    prod_stats(prod, &st);
    cr_assert_eq(st.produced, N_QUEUE);
    cr_assert_eq(st.failed, 0);
    cr_assert_gt(st.queue_waits, 0, "the queue never filled: the test tests nothing");
    cr_assert_eq(prod_free(prod), 0);
    cr_assert_eq(all.n_ok, N_QUEUE);
    for (int i = 0; i < N_QUEUE; i++)
        cr_assert(rep[i].calls == 1 && rep[i].err == SVC_OK, "message %d: %d reports", i,
                  rep[i].calls);

    rd_kafka_t         *rk = client_new(RD_KAFKA_PRODUCER, NULL);
    int64_t             lo, hi;
    rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(rk, topic, 0, &lo, &hi, wait_ms());
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "watermarks: %s", rd_kafka_err2str(err));
    cr_assert_eq(hi - lo, N_QUEUE, "the topic holds %" PRId64 " records", hi - lo);
    rd_kafka_destroy(rk);
}
