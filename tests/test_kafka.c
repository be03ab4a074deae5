/*
 * test_kafka.c -- librdkafka against a real Apache Kafka broker (KRaft, one
 * node, started by ops/kafka.sh; ops/test.sh starts it for the whole suite):
 * topics created through the admin API, an idempotent producer with keys and
 * headers, a cooperative-sticky consumer group that stores offset + 1 only
 * after processing a message and then commits, and transactions read back
 * with isolation.level=read_committed.
 *
 * The broker's address comes from D3_KAFKA_BOOTSTRAP (host:port). Without it
 * every test here FAILS, never skips. Each wait is bounded by 30 s, times
 * D3_TEST_TIMEOUT_MULT when that is set (the sanitizer run). Topic and group
 * names carry the pid and the time, so runs against one broker never meet.
 */
#include <criterion/criterion.h>
#include <librdkafka/rdkafka.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_kafka_util.h"

#define N_MSGS  1000 /* messages through the consumer group */
#define N_PARTS 3    /* partitions of the group test's topic */
#define N_KEYS  37   /* distinct keys: every partition gets some */
#define N_TXN   10   /* messages per transaction */

/* ---------------------------------------------------------------- helpers */

/* Client errors are printed; a fatal one (idempotence or transactions
 * broken) is kept for the test to fail on. */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)opaque;
    fprintf(stderr, "test_kafka: %s: %s%s: %s\n", rd_kafka_name(rk),
            rd_kafka_err2name((rd_kafka_resp_err_t)err),
            err == RD_KAFKA_RESP_ERR__FATAL ? " (fatal)" : "", reason);
}

/* kv_conf_new with the error callback above. */
static rd_kafka_conf_t *conf_new(const char *const *kv) {
    rd_kafka_conf_t *conf = kv_conf_new(kv);
    rd_kafka_conf_set_error_cb(conf, on_error);
    return conf;
}

/* Fails the test if rd_kafka_fatal_error says the handle is dead. */
static void assert_not_fatal(rd_kafka_t *rk) {
    char                errstr[512];
    rd_kafka_resp_err_t err = rd_kafka_fatal_error(rk, errstr, sizeof errstr);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "%s: fatal error %s: %s", rd_kafka_name(rk),
                 rd_kafka_err2name(err), errstr);
}

/* Creates topic with parts partitions (replication factor 1) through the
 * admin API and waits until every partition has a leader. */
static void create_topic(rd_kafka_t *rk, const char *topic, int parts) {
    tk_admin_t        a;
    rd_kafka_event_t *ev = create_topics_begin(&a, rk, topic, parts, true);
    cr_assert_eq(rd_kafka_event_type(ev), RD_KAFKA_EVENT_CREATETOPICS_RESULT);
    cr_assert_eq(rd_kafka_event_error(ev), RD_KAFKA_RESP_ERR_NO_ERROR, "CreateTopics \"%s\": %s",
                 topic, rd_kafka_event_error_string(ev));
    size_t                          n;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(rd_kafka_topic_result_name(res[0]), topic);
    cr_assert_eq(rd_kafka_topic_result_error(res[0]), RD_KAFKA_RESP_ERR_NO_ERROR,
                 "CreateTopics \"%s\": %s: %s", topic,
                 rd_kafka_err2name(rd_kafka_topic_result_error(res[0])),
                 rd_kafka_topic_result_error_string(res[0]));
    create_topics_end(&a);
    char why[64];
    snprintf(why, sizeof why, "has no %d led partitions", parts);
    wait_topic_ready(rk, topic, parts, why);
}

/* ---------------------------------------------------------------- producer */

/* Where the broker put message i, from its delivery report. */
typedef struct sent {
    int32_t partition;
    int64_t offset;
    int     reports;
} sent_t;

typedef struct producer_state {
    int delivered;
    int failed;
} producer_state_t;

/* Delivery reports: the per-message opaque is the message's sent_t. */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    producer_state_t *ps = opaque;
    sent_t           *s = m->_private;
    if (m->err) {
        ps->failed++;
        fprintf(stderr, "test_kafka: %s: delivery to %s [%" PRId32 "] failed: %s\n",
                rd_kafka_name(rk), rd_kafka_topic_name(m->rkt), m->partition,
                rd_kafka_err2str(m->err));
        return;
    }
    ps->delivered++;
    if (s) {
        s->partition = m->partition;
        s->offset = m->offset;
        s->reports++;
    }
}

static rd_kafka_t *producer_new(producer_state_t *ps, const char *const *kv) {
    rd_kafka_conf_t *conf = conf_new(kv);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_opaque(conf, ps);
    return client_new_conf(RD_KAFKA_PRODUCER, conf);
}

/* Produces one message, waiting (bounded) while the local queue is full. */
static void produce(rd_kafka_t *rk, const char *topic, int32_t partition, const char *key,
                    const char *value, const char *seq, sent_t *sent) {
    int64_t deadline = now_ms() + wait_ms();
    for (;;) {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
            RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE((void *)value, strlen(value)),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADER("seq", seq, -1),
            RD_KAFKA_V_HEADER("origin", "test_kafka", -1), RD_KAFKA_V_OPAQUE(sent), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            break;
        cr_assert_eq(err, RD_KAFKA_RESP_ERR__QUEUE_FULL, "produce to \"%s\": %s", topic,
                     rd_kafka_err2str(err));
        cr_assert(now_ms() < deadline, "producer queue still full after %d ms", wait_ms());
        rd_kafka_poll(rk, 10);
    }
    rd_kafka_poll(rk, 0);
}

static void flush(rd_kafka_t *rk) {
    rd_kafka_resp_err_t err = rd_kafka_flush(rk, wait_ms());
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "flush: %s (%d messages left after %d ms)",
                 rd_kafka_err2name(err), rd_kafka_outq_len(rk), wait_ms());
}

/* ---------------------------------------------------------------- consumer */

typedef struct group_state {
    int assigned;      /* partitions assigned now */
    int assigns;       /* assign events */
    int eager_seen;    /* a rebalance used the EAGER protocol */
    int assign_errors; /* incremental (un)assign failed */
} group_state_t;

/* The cooperative protocol adds and removes partitions incrementally; the
 * eager one replaces the whole assignment (librdkafka's
 * rdkafka_complex_consumer_example.c). Only records: asserts belong to the
 * test body. */
static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    group_state_t    *gs = opaque;
    int               coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    rd_kafka_error_t *error = NULL;
    if (!coop)
        gs->eager_seen = 1;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        gs->assigns++;
        gs->assigned += parts->cnt;
        if (coop)
            error = rd_kafka_incremental_assign(rk, parts);
        else
            rd_kafka_assign(rk, parts);
    } else {
        gs->assigned -= parts->cnt;
        if (coop)
            error = rd_kafka_incremental_unassign(rk, parts);
        else
            rd_kafka_assign(rk, NULL);
    }
    if (error) {
        fprintf(stderr, "test_kafka: incremental (un)assign: %s\n", rd_kafka_error_string(error));
        gs->assign_errors++;
        rd_kafka_error_destroy(error);
    }
}

static rd_kafka_t *group_consumer_new(group_state_t *gs, const char *group, const char *topic,
                                      const char *eof) {
    const char *const kv[] = {"group.id",
                              group,
                              "partition.assignment.strategy",
                              "cooperative-sticky",
                              "auto.offset.reset",
                              "earliest",
                              "enable.auto.offset.store",
                              "false",
                              "enable.auto.commit",
                              "false",
                              "enable.partition.eof",
                              eof,
                              "client.id",
                              "test_kafka-consumer",
                              NULL};
    rd_kafka_conf_t  *conf = conf_new(kv);
    rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
    rd_kafka_conf_set_opaque(conf, gs);
    rd_kafka_t *rk = client_new_conf(RD_KAFKA_CONSUMER, conf);
    rd_kafka_poll_set_consumer(rk);

    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(rk, sub);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "subscribe \"%s\": %s", topic,
                 rd_kafka_err2str(err));
    rd_kafka_topic_partition_list_destroy(sub);
    return rk;
}

/* Copies header name's value into buf as a string; fails if absent. */
static void header_str(const rd_kafka_message_t *m, const char *name, char *buf, size_t size) {
    rd_kafka_headers_t *hdrs = NULL;
    const void         *val;
    size_t              len;
    cr_assert_eq(rd_kafka_message_headers(m, &hdrs), RD_KAFKA_RESP_ERR_NO_ERROR,
                 "message at [%" PRId32 "] @%" PRId64 " has no headers", m->partition, m->offset);
    cr_assert_eq(rd_kafka_header_get_last(hdrs, name, &val, &len), RD_KAFKA_RESP_ERR_NO_ERROR,
                 "message at [%" PRId32 "] @%" PRId64 " lacks header \"%s\"", m->partition,
                 m->offset, name);
    cr_assert(len < size, "header \"%s\" is %zu bytes", name, len);
    memcpy(buf, val, len);
    buf[len] = '\0';
}

static int payload_is(const rd_kafka_message_t *m, const char *want) {
    return m->len == strlen(want) && memcmp(m->payload, want, m->len) == 0;
}

/* ---------------------------------------------------------------- tests */

/*
 * 1,000 keyed messages with headers through an idempotent producer into 3
 * partitions; one cooperative-sticky group member reads each exactly once,
 * in order per partition, stores offset + 1 after each and commits; a second
 * member of the same group, starting fresh, then finds nothing left.
 */
Test(kafka, idempotent_produce_group_consume_commit) {
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "group");
    unique_name(group, sizeof group, "group");

    static sent_t       sent[N_MSGS];
    producer_state_t    ps = {0};
    const char *const   pkv[] = {"enable.idempotence", "true", "linger.ms", "5", NULL};
    rd_kafka_t         *prod = producer_new(&ps, pkv);
    char                val[64];
    size_t              vlen = sizeof val;
    rd_kafka_conf_res_t res =
        rd_kafka_conf_get(rd_kafka_conf(prod), "enable.idempotence", val, &vlen);
    cr_assert_eq(res, RD_KAFKA_CONF_OK);
    cr_assert_str_eq(val, "true");

    create_topic(prod, topic, N_PARTS);
    for (int i = 0; i < N_MSGS; i++) {
        char key[32], value[32], seq[16];
        snprintf(key, sizeof key, "key-%d", i % N_KEYS);
        snprintf(value, sizeof value, "value-%d", i);
        snprintf(seq, sizeof seq, "%d", i);
        produce(prod, topic, RD_KAFKA_PARTITION_UA, key, value, seq, &sent[i]);
    }
    flush(prod);
    assert_not_fatal(prod);
    cr_assert_eq(ps.failed, 0, "%d deliveries failed", ps.failed);
    cr_assert_eq(ps.delivered, N_MSGS);
    int per_part[N_PARTS] = {0};
    for (int i = 0; i < N_MSGS; i++) {
        cr_assert_eq(sent[i].reports, 1, "message %d: %d delivery reports", i, sent[i].reports);
        cr_assert(sent[i].partition >= 0 && sent[i].partition < N_PARTS);
        cr_assert_eq(sent[i].partition, sent[i % N_KEYS].partition,
                     "one key, one partition (message %d)", i);
        per_part[sent[i].partition]++;
    }
    for (int p = 0; p < N_PARTS; p++)
        cr_assert(per_part[p] > 0, "partition %d got no message", p);
    rd_kafka_destroy(prod);

    /* First member: read everything, store offset + 1 after each, commit. */
    group_state_t        gs = {0};
    rd_kafka_t          *cons = group_consumer_new(&gs, group, topic, "true");
    static unsigned char seen[N_MSGS];
    int                  last_seq[N_PARTS] = {-1, -1, -1};
    int                  eof[N_PARTS] = {0};
    int                  got = 0;
    int64_t              deadline = now_ms() + wait_ms();
    while (got < N_MSGS || eof[0] + eof[1] + eof[2] < N_PARTS) {
        cr_assert(now_ms() < deadline, "consumed %d of %d messages (%d partitions at end) in %d ms",
                  got, N_MSGS, eof[0] + eof[1] + eof[2], wait_ms());
        rd_kafka_message_t *m = rd_kafka_consumer_poll(cons, 100);
        if (!m)
            continue;
        cr_assert(m->partition >= 0 && m->partition < N_PARTS);
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eof[m->partition] = 1;
            rd_kafka_message_destroy(m);
            continue;
        }
        cr_assert_eq(m->err, RD_KAFKA_RESP_ERR_NO_ERROR, "consume: %s", rd_kafka_message_errstr(m));

        char  seqs[16], origin[32], want[32];
        char *end;
        header_str(m, "seq", seqs, sizeof seqs);
        header_str(m, "origin", origin, sizeof origin);
        long seq = strtol(seqs, &end, 10);
        cr_assert(*end == '\0' && seq >= 0 && seq < N_MSGS, "bad seq header \"%s\"", seqs);
        cr_assert_str_eq(origin, "test_kafka");
        cr_assert_eq(seen[seq], 0, "message %ld arrived twice ([%" PRId32 "] @%" PRId64 ")", seq,
                     m->partition, m->offset);
        seen[seq] = 1;
        snprintf(want, sizeof want, "key-%ld", seq % N_KEYS);
        cr_assert(m->key_len == strlen(want) && memcmp(m->key, want, m->key_len) == 0,
                  "message %ld: wrong key", seq);
        snprintf(want, sizeof want, "value-%ld", seq);
        cr_assert(payload_is(m, want), "message %ld: wrong value", seq);
        cr_assert_eq(m->partition, sent[seq].partition, "message %ld: partition", seq);
        cr_assert_eq(m->offset, sent[seq].offset, "message %ld: offset", seq);
        cr_assert_gt(seq, last_seq[m->partition], "partition %" PRId32 ": %ld after %d",
                     m->partition, seq, last_seq[m->partition]);
        last_seq[m->partition] = (int)seq;
        got++;

        /* Processed: now, and only now, its offset + 1 may be committed. */
        rd_kafka_topic_partition_list_t *off = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(off, topic, m->partition)->offset = m->offset + 1;
        rd_kafka_resp_err_t err = rd_kafka_offsets_store(cons, off);
        cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "offsets_store: %s", rd_kafka_err2str(err));
        cr_assert_eq(off->elems[0].err, RD_KAFKA_RESP_ERR_NO_ERROR,
                     "offsets_store [%" PRId32 "]: %s", m->partition,
                     rd_kafka_err2str(off->elems[0].err));
        rd_kafka_topic_partition_list_destroy(off);
        rd_kafka_message_destroy(m);
    }
    cr_assert_eq(gs.eager_seen, 0, "the group rebalanced with the EAGER protocol");
    cr_assert_eq(gs.assign_errors, 0);
    cr_assert_eq(gs.assigned, N_PARTS, "the only member holds all %d partitions", N_PARTS);

    rd_kafka_resp_err_t err = rd_kafka_commit(cons, NULL, 0 /* sync */);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "commit: %s", rd_kafka_err2str(err));
    rd_kafka_topic_partition_list_t *committed = rd_kafka_topic_partition_list_new(N_PARTS);
    for (int p = 0; p < N_PARTS; p++)
        rd_kafka_topic_partition_list_add(committed, topic, p);
    err = rd_kafka_committed(cons, committed, wait_ms());
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "committed: %s", rd_kafka_err2str(err));
    int64_t total = 0;
    for (int p = 0; p < N_PARTS; p++) {
        int64_t lo, hi;
        err = rd_kafka_query_watermark_offsets(cons, topic, p, &lo, &hi, wait_ms());
        cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "watermarks: %s", rd_kafka_err2str(err));
        cr_assert_eq(committed->elems[p].offset, hi,
                     "partition %d: committed %" PRId64 ", end %" PRId64, p,
                     committed->elems[p].offset, hi);
        total += hi - lo;
    }
    cr_assert_eq(total, N_MSGS);
    rd_kafka_topic_partition_list_destroy(committed);
    err = rd_kafka_consumer_close(cons);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "consumer_close: %s", rd_kafka_err2str(err));
    assert_not_fatal(cons);
    rd_kafka_destroy(cons);

    /* Second member, same group, fresh process state: the committed offsets
     * put it at the end of every partition. */
    group_state_t gs2 = {0};
    rd_kafka_t   *cons2 = group_consumer_new(&gs2, group, topic, "true");
    int           eof2[N_PARTS] = {0};
    deadline = now_ms() + wait_ms();
    while (eof2[0] + eof2[1] + eof2[2] < N_PARTS) {
        cr_assert(now_ms() < deadline, "second member: %d of %d partitions at end after %d ms",
                  eof2[0] + eof2[1] + eof2[2], N_PARTS, wait_ms());
        rd_kafka_message_t *m = rd_kafka_consumer_poll(cons2, 100);
        if (!m)
            continue;
        cr_assert_eq(m->err, RD_KAFKA_RESP_ERR__PARTITION_EOF,
                     "second member got [%" PRId32 "] @%" PRId64 " (%s): offsets not committed?",
                     m->partition, m->offset, m->err ? rd_kafka_message_errstr(m) : "a message");
        cr_assert(m->partition >= 0 && m->partition < N_PARTS);
        eof2[m->partition] = 1;
        rd_kafka_message_destroy(m);
    }
    cr_assert_eq(gs2.eager_seen, 0);
    err = rd_kafka_consumer_close(cons2);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "consumer_close: %s", rd_kafka_err2str(err));
    rd_kafka_destroy(cons2);
}

/* One transaction: begin, N_TXN messages "<tag>-<i>" (flushed, so they are
 * in the log either way), then commit or abort. */
static void transaction(rd_kafka_t *rk, producer_state_t *ps, const char *topic, const char *tag,
                        int commit) {
    rd_kafka_error_t *error = rd_kafka_begin_transaction(rk);
    cr_assert_null(error, "begin_transaction: %s", rd_kafka_error_string(error));
    int before = ps->delivered;
    for (int i = 0; i < N_TXN; i++) {
        char value[64], seq[16];
        snprintf(value, sizeof value, "%s-%d", tag, i);
        snprintf(seq, sizeof seq, "%d", i);
        produce(rk, topic, 0, tag, value, seq, NULL);
    }
    flush(rk);
    cr_assert_eq(ps->delivered - before, N_TXN, "%s: %d of %d delivered", tag,
                 ps->delivered - before, N_TXN);
    if (commit)
        error = rd_kafka_commit_transaction(rk, wait_ms());
    else
        error = rd_kafka_abort_transaction(rk, wait_ms());
    cr_assert_null(error, "%s_transaction: %s", commit ? "commit" : "abort",
                   rd_kafka_error_string(error));
}

/* Reads partition 0 of topic from the beginning to its end with the given
 * isolation level; values[i] gets a copy of message i's value. Returns the
 * count. */
static int read_all(const char *topic, const char *isolation, char values[][64], int max) {
    char group[128];
    unique_name(group, sizeof group, isolation);
    const char *const kv[] = {"group.id",
                              group,
                              "enable.auto.commit",
                              "false",
                              "isolation.level",
                              isolation,
                              "enable.partition.eof",
                              "true",
                              "client.id",
                              "test_kafka-reader",
                              NULL};
    rd_kafka_t       *rk = client_new_conf(RD_KAFKA_CONSUMER, conf_new(kv));
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_resp_err_t err = rd_kafka_assign(rk, parts);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "assign: %s", rd_kafka_err2str(err));
    rd_kafka_topic_partition_list_destroy(parts);

    int     n = 0;
    int64_t deadline = now_ms() + wait_ms();
    for (;;) {
        cr_assert(now_ms() < deadline, "%s reader: no end of partition after %d ms (%d read)",
                  isolation, wait_ms(), n);
        bool                eof;
        rd_kafka_message_t *m = reader_poll(rk, isolation, &eof);
        if (eof)
            break;
        if (!m)
            continue;
        cr_assert(n < max, "%s reader: more than %d messages", isolation, max);
        cr_assert(m->len < 64);
        memcpy(values[n], m->payload, m->len);
        values[n][m->len] = '\0';
        n++;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

/*
 * A transactional producer commits one transaction, aborts one and commits
 * another; a read_committed reader sees only the committed 20 messages, in
 * order, while a read_uncommitted reader proves the aborted ones were
 * written.
 */
Test(kafka, transactions_read_committed) {
    char topic[128], txid[128];
    unique_name(topic, sizeof topic, "txn");
    unique_name(txid, sizeof txid, "txid");

    producer_state_t  ps = {0};
    const char *const kv[] = {"transactional.id", txid, NULL};
    rd_kafka_t       *prod = producer_new(&ps, kv);
    create_topic(prod, topic, 1);
    rd_kafka_error_t *error = rd_kafka_init_transactions(prod, wait_ms());
    cr_assert_null(error, "init_transactions: %s", rd_kafka_error_string(error));
    transaction(prod, &ps, topic, "committed-a", 1);
    transaction(prod, &ps, topic, "aborted", 0);
    transaction(prod, &ps, topic, "committed-b", 1);
    assert_not_fatal(prod);
    cr_assert_eq(ps.failed, 0);
    rd_kafka_destroy(prod);

    static char values[4 * N_TXN][64];
    int         n = read_all(topic, "read_committed", values, 4 * N_TXN);
    cr_assert_eq(n, 2 * N_TXN, "read_committed saw %d messages, want %d", n, 2 * N_TXN);
    for (int i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "committed-%c-%d", i < N_TXN ? 'a' : 'b', i % N_TXN);
        cr_assert_str_eq(values[i], want, "read_committed message %d", i);
    }

    n = read_all(topic, "read_uncommitted", values, 4 * N_TXN);
    cr_assert_eq(n, 3 * N_TXN, "read_uncommitted saw %d messages, want %d", n, 3 * N_TXN);
    int aborted = 0;
    for (int i = 0; i < n; i++)
        aborted += strncmp(values[i], "aborted-", 8) == 0;
    cr_assert_eq(aborted, N_TXN, "the aborted transaction's messages are in the log");
}
