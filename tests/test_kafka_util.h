/*
 * test_kafka_util.h -- helpers shared by the tests that run against a real
 * Apache Kafka broker (test_kafka, test_producer, test_consumer, test_serve*):
 * the broker's address from D3_KAFKA_BOOTSTRAP (the test FAILS without it),
 * waits bounded by 30 s times D3_TEST_TIMEOUT_MULT, unique topic and group
 * names, plain librdkafka clients and topic creation through the admin API.
 *
 * Each test is its own executable, so everything here is static inline.
 * Before including, a test may define TK_START_HINT (how to start a broker,
 * in the message when D3_KAFKA_BOOTSTRAP is unset), TK_NAME_PREFIX (the start
 * of unique names) and TK_NAME_COUNTER (1: unique names end in a counter).
 */
#ifndef D3_TEST_KAFKA_UTIL_H
#define D3_TEST_KAFKA_UTIL_H

#include <criterion/criterion.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 30000

#ifndef TK_START_HINT
#define TK_START_HINT "Run ops/test.sh (it starts one), or start one yourself: "
#endif
#ifndef TK_NAME_PREFIX
#define TK_NAME_PREFIX "d3test-"
#endif
#ifndef TK_NAME_COUNTER
#define TK_NAME_COUNTER 0
#endif

/* The bound for one wait: 30 s times D3_TEST_TIMEOUT_MULT (>= 1) when set. */
static inline int wait_ms(void) {
    const char *s = getenv("D3_TEST_TIMEOUT_MULT");
    double      mult = 1.0;
    if (s && *s) {
        char  *end;
        double v = strtod(s, &end);
        if (*end == '\0' && v >= 1.0 && v <= 100.0)
            mult = v;
    }
    return (int)(WAIT_MS * mult);
}

static inline int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline const char *bootstrap(void) {
    const char *b = getenv("D3_KAFKA_BOOTSTRAP");
    if (!b || !*b)
        cr_assert_fail(
            "D3_KAFKA_BOOTSTRAP is not set: these tests need a real Kafka broker. " TK_START_HINT
            "ops/kafka.sh start build/_kafka && "
            "export D3_KAFKA_BOOTSTRAP=$(cat build/_kafka/bootstrap)");
    return b;
}

/* A name no other run uses: TK_NAME_PREFIX<what>-<pid>-<unix time>, then
 * -<n> when TK_NAME_COUNTER is set. */
static inline void unique_name(char *buf, size_t size, const char *what) {
#if TK_NAME_COUNTER
    static int n_names;
    int        n = snprintf(buf, size, TK_NAME_PREFIX "%s-%ld-%lld-%d", what, (long)getpid(),
                            (long long)time(NULL), n_names++);
#else
    int n = snprintf(buf, size, TK_NAME_PREFIX "%s-%ld-%lld", what, (long)getpid(),
                     (long long)time(NULL));
#endif
    cr_assert(n > 0 && (size_t)n < size);
}

/* A configuration with bootstrap.servers and the NULL-terminated key, value
 * pairs in kv. */
static inline rd_kafka_conf_t *kv_conf_new(const char *const *kv) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char             errstr[512];
    cr_assert_eq(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap(), errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK, "%s", errstr);
    for (; kv && kv[0]; kv += 2)
        cr_assert_eq(rd_kafka_conf_set(conf, kv[0], kv[1], errstr, sizeof errstr), RD_KAFKA_CONF_OK,
                     "%s=%s: %s", kv[0], kv[1], errstr);
    return conf;
}

/* rd_kafka_new; conf is owned by the handle afterwards. */
static inline rd_kafka_t *client_new_conf(rd_kafka_type_t type, rd_kafka_conf_t *conf) {
    char        errstr[512];
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof errstr);
    cr_assert_not_null(rk, "rd_kafka_new: %s", errstr);
    return rk;
}

/* A plain librdkafka client of type with the NULL-terminated kv pairs. */
static inline rd_kafka_t *client_new(rd_kafka_type_t type, const char *const *kv) {
    return client_new_conf(type, kv_conf_new(kv));
}

/* One CreateTopics request in flight and what it holds. */
typedef struct tk_admin {
    rd_kafka_NewTopic_t     *nt;
    rd_kafka_AdminOptions_t *opts;
    rd_kafka_queue_t        *q;
    rd_kafka_event_t        *ev;
} tk_admin_t;

/* Asks rk's broker to create topic with parts partitions (replication factor
 * 1) and the NULL-terminated topic config key, value pairs in cfg, with the
 * operation timeout (and the request timeout when request_timeout) set to
 * wait_ms(), and waits for the result event, which it returns.
 * create_topics_end frees it all. */
static inline rd_kafka_event_t *create_topics_begin_cfg(tk_admin_t *a, rd_kafka_t *rk,
                                                        const char *topic, int parts,
                                                        bool               request_timeout,
                                                        const char *const *cfg) {
    char errstr[512];
    a->nt = rd_kafka_NewTopic_new(topic, parts, 1, errstr, sizeof errstr);
    cr_assert_not_null(a->nt, "NewTopic \"%s\": %s", topic, errstr);
    for (; cfg && cfg[0]; cfg += 2)
        cr_assert_eq(rd_kafka_NewTopic_set_config(a->nt, cfg[0], cfg[1]),
                     RD_KAFKA_RESP_ERR_NO_ERROR, "topic config %s=%s", cfg[0], cfg[1]);
    a->opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    cr_assert_eq(
        rd_kafka_AdminOptions_set_operation_timeout(a->opts, wait_ms(), errstr, sizeof errstr),
        RD_KAFKA_RESP_ERR_NO_ERROR, "%s", errstr);
    if (request_timeout)
        cr_assert_eq(
            rd_kafka_AdminOptions_set_request_timeout(a->opts, wait_ms(), errstr, sizeof errstr),
            RD_KAFKA_RESP_ERR_NO_ERROR, "%s", errstr);
    a->q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &a->nt, 1, a->opts, a->q);
    a->ev = rd_kafka_queue_poll(a->q, wait_ms() + 5000);
    cr_assert_not_null(a->ev, "CreateTopics \"%s\": no result within %d ms", topic, wait_ms());
    return a->ev;
}

/* create_topics_begin_cfg without topic configuration. */
static inline rd_kafka_event_t *create_topics_begin(tk_admin_t *a, rd_kafka_t *rk,
                                                    const char *topic, int parts,
                                                    bool request_timeout) {
    return create_topics_begin_cfg(a, rk, topic, parts, request_timeout, NULL);
}

static inline void create_topics_end(tk_admin_t *a) {
    rd_kafka_event_destroy(a->ev);
    rd_kafka_queue_destroy(a->q);
    rd_kafka_AdminOptions_destroy(a->opts);
    rd_kafka_NewTopic_destroy(a->nt);
}

/* Whether the metadata shows topic with parts partitions, each led. */
static inline bool topic_ready(rd_kafka_t *rk, const char *topic, int parts) {
    rd_kafka_topic_t               *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t             err = rd_kafka_metadata(rk, 0, rkt, &md, 5000);
    bool ready = err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
                 md->topics[0].err == 0 && md->topics[0].partition_cnt == parts;
    for (int p = 0; ready && p < parts; p++)
        ready = md->topics[0].partitions[p].leader >= 0;
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    return ready;
}

/* Waits until topic_ready; fails with "topic "<topic>" <why> after <n> ms". */
static inline void wait_topic_ready(rd_kafka_t *rk, const char *topic, int parts, const char *why) {
    int64_t deadline = now_ms() + wait_ms();
    while (!topic_ready(rk, topic, parts)) {
        cr_assert(now_ms() < deadline, "topic \"%s\" %s after %d ms", topic, why, wait_ms());
        usleep(100 * 1000);
    }
}

/* One poll of reader rk, a consumer with enable.partition.eof: the next
 * record, or NULL when none came within 100 ms or, with *eof set, at the end
 * of the partition. A record with an error fails "<isolation> reader: ...". */
static inline rd_kafka_message_t *reader_poll(rd_kafka_t *rk, const char *isolation, bool *eof) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    *eof = false;
    if (!m)
        return NULL;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        rd_kafka_message_destroy(m);
        *eof = true;
        return NULL;
    }
    cr_assert_eq(m->err, RD_KAFKA_RESP_ERR_NO_ERROR, "%s reader: %s", isolation,
                 rd_kafka_message_errstr(m));
    return m;
}

#endif /* D3_TEST_KAFKA_UTIL_H */
