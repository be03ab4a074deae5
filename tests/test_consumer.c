/*
 * test_consumer.c -- consumer/: the offset tracker without a broker, then
 * the consumer group member against the real Kafka broker that ops/test.sh
 * starts (D3_KAFKA_BOOTSTRAP; without it the broker tests FAIL, never skip).
 * Each wait is bounded by 30 s times D3_TEST_TIMEOUT_MULT.
 */
#include <criterion/criterion.h>
#include <librdkafka/rdkafka.h>
#include <inttypes.h>
#include <time.h>
#include <unistd.h>

#include "consumer.h"
#include "cons_track.h"

#define TK_START_HINT  "Run ops/test.sh (it starts one), or: "
#define TK_NAME_PREFIX "d3test-cons-"
#include "test_kafka_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) { /* xorshift64: reproducible across runs */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ------------------------------------------------------------ tracker unit */

static void expect_adv(cons_track_t *ct, uint64_t gen, int64_t off, int64_t want) {
    int64_t next = -1;
    cr_assert_eq(cons_track_done(ct, "t", 0, gen, off, true, &next), CONS_TRACK_ADVANCED,
                 "done %" PRId64, off);
    cr_assert_eq(next, want, "done %" PRId64 ": next %" PRId64 ", want %" PRId64, off, next, want);
}

static void expect_kept(cons_track_t *ct, uint64_t gen, int64_t off, bool delivered) {
    int64_t next = -1;
    cr_assert_eq(cons_track_done(ct, "t", 0, gen, off, delivered, &next), CONS_TRACK_KEPT,
                 "done %" PRId64, off);
}

static uint64_t add_range(cons_track_t *ct, const int64_t *offs, size_t n) {
    uint64_t gen = 0;
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(cons_track_add(ct, "t", 0, offs[i], &gen), SVC_OK);
    return gen;
}

Test(cons_track, out_of_order) {
    cons_track_t *ct = cons_track_new();
    uint64_t      gen;
    cr_assert_eq(cons_track_assign(ct, "t", 0, &gen), SVC_OK);
    gen = add_range(ct, (int64_t[]){0, 1, 2, 3, 4}, 5);
    expect_kept(ct, gen, 2, true);
    expect_adv(ct, gen, 0, 1);
    expect_adv(ct, gen, 1, 3);
    expect_kept(ct, gen, 4, true);
    cr_assert_eq(cons_track_in_flight(ct), 1);
    expect_adv(ct, gen, 3, 5);
    cr_assert_eq(cons_track_in_flight(ct), 0);
    int64_t next;
    cr_assert_eq(cons_track_done(ct, "t", 0, gen, 3, true, &next), CONS_TRACK_STALE, "twice");
    cr_assert_eq(cons_track_add(ct, "t", 0, 4, &gen), SVC_ERR_INVALID, "not increasing");
    cons_track_free(ct);
}

Test(cons_track, gaps_and_abandoned) {
    cons_track_t *ct = cons_track_new();
    uint64_t      gen;
    cr_assert_eq(cons_track_assign(ct, "t", 0, &gen), SVC_OK);
    gen = add_range(ct, (int64_t[]){10, 11, 15, 20, 21, 22}, 6);
    expect_kept(ct, gen, 15, true);
    expect_adv(ct, gen, 10, 11);
    expect_adv(ct, gen, 11, 16);     /* the gap 12..14 (e.g. txn markers) never blocks */
    expect_kept(ct, gen, 21, false); /* abandoned: the stored offset stops at 21 */
    expect_adv(ct, gen, 20, 21);
    expect_kept(ct, gen, 22, true);
    cr_assert_eq(cons_track_in_flight(ct), 0);
    cons_track_free(ct);
}

Test(cons_track, revoke_drops) {
    cons_track_t *ct = cons_track_new();
    uint64_t      g1, g2;
    int64_t       next;
    cr_assert_eq(cons_track_assign(ct, "t", 0, &g1), SVC_OK);
    g1 = add_range(ct, (int64_t[]){0, 1, 2}, 3);
    expect_adv(ct, g1, 0, 1);
    cr_assert_eq(cons_track_revoke(ct, "t", 0), 2, "two orphaned");
    cr_assert_eq(cons_track_in_flight(ct), 0);
    cr_assert_eq(cons_track_done(ct, "t", 0, g1, 1, true, &next), CONS_TRACK_STALE);
    cr_assert_eq(cons_track_add(ct, "t", 0, 3, &g1), SVC_ERR_INVALID, "not assigned");
    /* Assigned again: same offsets, new generation; old messages stay stale. */
    cr_assert_eq(cons_track_assign(ct, "t", 0, &g2), SVC_OK);
    cr_assert_neq(g1, g2);
    g2 = add_range(ct, (int64_t[]){1, 2}, 2);
    cr_assert_eq(cons_track_done(ct, "t", 0, g1, 1, true, &next), CONS_TRACK_STALE);
    cr_assert_eq(cons_track_in_flight(ct), 2);
    expect_adv(ct, g2, 1, 2);
    cons_track_free(ct);
}

Test(cons_track, many_partitions) {
    cons_track_t *ct = cons_track_new();
    const char   *topics[] = {"a", "b", "c"};
    enum { N_P = 3000, N_M = 8 };
    for (int p = 0; p < N_P; p++) {
        uint64_t gen;
        cr_assert_eq(cons_track_assign(ct, topics[p % 3], p, &gen), SVC_OK);
        for (int64_t o = 0; o < N_M; o++)
            cr_assert_eq(cons_track_add(ct, topics[p % 3], p, o * 2, &gen), SVC_OK);
    }
    cr_assert_eq(cons_track_parts(ct), N_P);
    cr_assert_eq(cons_track_in_flight(ct), (size_t)N_P * N_M);
    for (int p = 0; p < N_P; p++) {
        uint64_t gen;
        cr_assert_eq(cons_track_assign(ct, topics[p % 3], p, &gen), SVC_OK); /* idempotent */
        for (int64_t o = N_M - 1; o >= 0; o--) {
            int64_t          next = -1;
            cons_track_res_t r = cons_track_done(ct, topics[p % 3], p, gen, o * 2, true, &next);
            cr_assert_eq(r, o == 0 ? CONS_TRACK_ADVANCED : CONS_TRACK_KEPT);
            if (o == 0)
                cr_assert_eq(next, (N_M - 1) * 2 + 1);
        }
        cr_assert_eq(cons_track_part_in_flight(ct, topics[p % 3], p), 0);
    }
    for (int p = 0; p < N_P; p++)
        cr_assert_eq(cons_track_revoke(ct, topics[p % 3], p), 0);
    cr_assert_eq(cons_track_parts(ct), 0);
    cons_track_free(ct);
}

/* 100k random completions over 8 partitions against a naive model: per
 * partition the list of added offsets and a cursor past the delivered
 * prefix. 2% of messages are abandoned. */
Test(cons_track, random_vs_naive) {
    enum { N_P = 8, N_MSG = 100000, WINDOW = 700 };
    typedef struct {
        int     p;
        int64_t off;
        size_t  idx;
    } fl_t;
    cons_track_t *ct = cons_track_new();
    int64_t      *offs[N_P];
    char         *state[N_P]; /* 0 in flight, 1 delivered, 2 abandoned */
    size_t        n_added[N_P] = {0}, cursor[N_P] = {0};
    int64_t       last_off[N_P];
    uint64_t      gen[N_P];
    fl_t         *fl = calloc(WINDOW, sizeof *fl);
    size_t        n_fl = 0, added = 0, done = 0, advanced = 0;
    for (int p = 0; p < N_P; p++) {
        offs[p] = calloc(N_MSG, sizeof *offs[p]);
        state[p] = calloc(N_MSG, 1);
        last_off[p] = (int64_t)(rng() % 100);
        cr_assert_eq(cons_track_assign(ct, "t", p, &gen[p]), SVC_OK);
    }
    while (done < N_MSG) {
        bool can_add = added < N_MSG && n_fl < WINDOW;
        if (can_add && (n_fl == 0 || rng() % 2)) {
            int     p = (int)(rng() % N_P);
            int64_t off = last_off[p] + 1 + (rng() % 10 == 0 ? (int64_t)(rng() % 5) : 0);
            cr_assert_eq(cons_track_add(ct, "t", p, off, &gen[p]), SVC_OK);
            last_off[p] = off;
            offs[p][n_added[p]] = off;
            fl[n_fl++] = (fl_t){p, off, n_added[p]++};
            added++;
            continue;
        }
        size_t k = (size_t)(rng() % n_fl);
        fl_t   f = fl[k];
        fl[k] = fl[--n_fl];
        bool delivered = rng() % 50 != 0;
        state[f.p][f.idx] = delivered ? 1 : 2;
        size_t before = cursor[f.p];
        while (cursor[f.p] < n_added[f.p] && state[f.p][cursor[f.p]] == 1)
            cursor[f.p]++;
        int64_t          next = -1;
        cons_track_res_t r = cons_track_done(ct, "t", f.p, gen[f.p], f.off, delivered, &next);
        if (cursor[f.p] > before) {
            cr_assert_eq(r, CONS_TRACK_ADVANCED, "msg %zu", done);
            cr_assert_eq(next, offs[f.p][cursor[f.p] - 1] + 1, "msg %zu", done);
            advanced++;
        } else {
            cr_assert_eq(r, CONS_TRACK_KEPT, "msg %zu", done);
        }
        done++;
        cr_assert_eq(cons_track_in_flight(ct), n_fl);
    }
    cr_assert_gt(advanced, 100);
    for (int p = 0; p < N_P; p++) {
        free(offs[p]);
        free(state[p]);
    }
    free(fl);
    cons_track_free(ct);
}

/* ---------------------------------------------------------- no broker needed */

Test(consumer, conf_errors) {
    char        errstr[512];
    const char *topics[] = {"t", NULL};
    cons_conf_t cc = {
        .brokers = "127.0.0.1:1", .group = "g", .topics = topics, .max_in_flight = 10};
    cc.props = (const char *const[]){"no.such.property=1", NULL};
    cr_assert_null(cons_new(&cc, errstr, sizeof errstr));
    cr_assert(strstr(errstr, "No such configuration property") != NULL, "%s", errstr);
    cc.props = (const char *const[]){"enable.auto.offset.store=true", NULL};
    cr_assert_null(cons_new(&cc, errstr, sizeof errstr));
    cr_assert(strstr(errstr, "must stay false") != NULL, "%s", errstr);
    cc.props = (const char *const[]){"session.timeout.ms", NULL};
    cr_assert_null(cons_new(&cc, errstr, sizeof errstr));
    cr_assert(strstr(errstr, "key=value") != NULL, "%s", errstr);
    cc.props = NULL;
    cc.max_in_flight = 0;
    cr_assert_null(cons_new(&cc, errstr, sizeof errstr));
}
/* ------------------------------------------------------------ real broker */

static rd_kafka_t *producer_new(void) {
    char             errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    cr_assert_eq(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap(), errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK, "%s", errstr);
    cr_assert_eq(rd_kafka_conf_set(conf, "enable.idempotence", "true", errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK, "%s", errstr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    cr_assert_not_null(rk, "%s", errstr);
    return rk;
}

/* Creates topic with parts partitions and writes message i ("i") to
 * partition i % parts, so partition p holds n / parts messages at 0.. */
static void topic_fill(const char *topic, int parts, int n) {
    rd_kafka_t          *rk = producer_new();
    char                 errstr[512];
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, parts, 1, errstr, sizeof errstr);
    cr_assert_not_null(nt, "%s", errstr);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, wait_ms());
    cr_assert_not_null(ev, "CreateTopics \"%s\": no answer", topic);
    size_t                          cnt;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
    cr_assert_eq(cnt, 1);
    cr_assert_eq(rd_kafka_topic_result_error(res[0]), 0, "CreateTopics \"%s\": %s", topic,
                 rd_kafka_topic_result_error_string(res[0]));
    rd_kafka_event_destroy(ev);
    rd_kafka_queue_destroy(q);
    rd_kafka_NewTopic_destroy(nt);
    for (int i = 0; i < n; i++) {
        char v[16];
        int  len = snprintf(v, sizeof v, "%d", i);
        cr_assert_eq(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(i % parts),
                                       RD_KAFKA_V_VALUE(v, (size_t)len),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                       RD_KAFKA_V_HEADER("id", v, len), RD_KAFKA_V_END),
                     0, "produce %d", i);
        rd_kafka_poll(rk, 0);
    }
    cr_assert_eq(rd_kafka_flush(rk, wait_ms()), 0, "flush to \"%s\"", topic);
    rd_kafka_destroy(rk);
}

/* The group's committed offset of topic [partition]. */
static int64_t committed(const char *group, const char *topic, int32_t partition) {
    char             errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    cr_assert_eq(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap(), errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK);
    cr_assert_eq(rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    cr_assert_not_null(rk, "%s", errstr);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition);
    cr_assert_eq(rd_kafka_committed(rk, l, wait_ms()), 0);
    int64_t off = l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return off;
}

/* One member's bookkeeping: held messages with a due time, what it saw. */
enum { MAX_HELD = 4096 };
typedef struct member {
    cons_t     *cons;
    cons_msg_t *held[MAX_HELD];
    int64_t     due[MAX_HELD];
    size_t      n_held, max_held;
    int        *seen; /* per message id, shared by members */
    int         got, revoke_calls;
    bool        finish_on_revoke;
} member_t;

static int msg_id(const cons_msg_t *msg) {
    size_t      len;
    const char *v = cons_msg_value(msg, &len);
    char        buf[16];
    cr_assert(v && len > 0 && len < sizeof buf);
    memcpy(buf, v, len);
    buf[len] = '\0';
    cr_assert_eq(cons_msg_header_count(msg), 1);
    return (int)strtol(buf, NULL, 10);
}

static void finish_at(member_t *m, size_t i, bool delivered) {
    if (delivered)
        m->seen[msg_id(m->held[i])]++;
    cons_msg_done(m->cons, m->held[i], delivered);
    m->held[i] = m->held[--m->n_held];
    m->due[i] = m->due[m->n_held];
}

/* on_revoke: finish (deliver) held work of that partition before unassign. */
static void on_revoke(void *user, const char *topic, int32_t partition) {
    member_t *m = user;
    m->revoke_calls++;
    if (!m->finish_on_revoke)
        return;
    for (size_t i = 0; i < m->n_held;)
        if (cons_msg_partition(m->held[i]) == partition &&
            strcmp(cons_msg_topic(m->held[i]), topic) == 0)
            finish_at(m, i, true);
        else
            i++;
}

/* One poll; a message is held until now + delay_ms (random within range),
 * then finished in random order with the others that are due. */
static void member_step(member_t *m, int delay_lo, int delay_hi) {
    cons_msg_t *msg = NULL;
    cr_assert_eq(cons_poll(m->cons, 5, &msg), SVC_OK, "%s", cons_strerror(m->cons));
    if (msg) {
        cr_assert_lt(m->n_held, MAX_HELD);
        m->held[m->n_held] = msg;
        m->due[m->n_held] =
            now_ms() + delay_lo + (int64_t)(rng() % (uint64_t)(delay_hi - delay_lo + 1));
        m->n_held++;
        m->got++;
        if (m->n_held > m->max_held)
            m->max_held = m->n_held;
    }
    int64_t t = now_ms();
    for (size_t tries = m->n_held; tries > 0 && m->n_held > 0; tries--) {
        size_t i = (size_t)(rng() % m->n_held);
        if (m->due[i] <= t)
            finish_at(m, i, true);
    }
}

static cons_t *member_new(member_t *m, const char *group, const char *topic, size_t window,
                          bool stop_at_end) {
    char        errstr[512];
    const char *topics[] = {topic, NULL};
    cons_conf_t cc = {.brokers = bootstrap(),
                      .group = group,
                      .topics = topics,
                      .from_beginning = true,
                      .max_in_flight = window,
                      .stop_at_end = stop_at_end,
                      .stats_interval_ms = 200,
                      .props = (const char *const[]){"auto.commit.interval.ms=200", NULL},
                      .on_revoke = on_revoke,
                      .user = m};
    m->cons = cons_new(&cc, errstr, sizeof errstr);
    cr_assert_not_null(m->cons, "cons_new: %s", errstr);
    return m->cons;
}

static int distinct(const int *seen, int n) {
    int d = 0;
    for (int i = 0; i < n; i++)
        d += seen[i] > 0;
    return d;
}

Test(consumer, window_out_of_order, .timeout = 240) {
    enum { N = 2000, PARTS = 4, WINDOW = 50 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "win");
    unique_name(group, sizeof group, "win-g");
    topic_fill(topic, PARTS, N);
    static int seen[N];
    member_t  *m = calloc(1, sizeof *m);
    m->seen = seen;
    m->finish_on_revoke = true;
    member_new(m, group, topic, WINDOW, false);
    int64_t deadline = now_ms() + wait_ms();
    while (distinct(seen, N) < N || m->n_held > 0) {
        cr_assert_lt(now_ms(), deadline, "%d of %d messages after the wait", distinct(seen, N), N);
        member_step(m, 0, 9);
        cr_assert_leq(m->n_held, WINDOW, "window exceeded: %zu held", m->n_held);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(seen[i], 1, "message %d seen %d times", i, seen[i]);
    cons_stats_t st;
    deadline = now_ms() + wait_ms();
    do { /* statistics: assignment size and lag settle after the commits */
        member_step(m, 0, 0);
        cons_stats(m->cons, &st);
    } while ((st.assignment_size != PARTS || st.lag != 0) && now_ms() < deadline);
    cr_assert_eq(st.assignment_size, PARTS);
    cr_assert_eq(st.lag, 0, "consumer lag %" PRId64, st.lag);
    cr_assert_geq(st.rebalance_cnt, 1);
    cr_assert_leq(st.in_flight_max, WINDOW);
    cr_assert_gt(st.pauses, 0);
    cr_assert_gt(st.resumes, 0);
    cr_log_info("pauses %" PRId64 " resumes %" PRId64 " stored %" PRId64, st.pauses, st.resumes,
                st.stored);
    cr_assert_eq(cons_close(m->cons), SVC_OK, "%s", cons_strerror(m->cons));
    cons_free(m->cons);
    for (int p = 0; p < PARTS; p++)
        cr_assert_eq(committed(group, topic, p), N / PARTS, "partition %d", p);
    free(m);
}

Test(consumer, stop_at_end, .timeout = 120) {
    enum { N = 300, PARTS = 2 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "end");
    unique_name(group, sizeof group, "end-g");
    topic_fill(topic, PARTS, N);
    static int seen[N];
    member_t  *m = calloc(1, sizeof *m);
    m->seen = seen;
    member_new(m, group, topic, 100, true);
    int64_t deadline = now_ms() + wait_ms();
    while (!cons_at_end(m->cons)) {
        cr_assert_lt(now_ms(), deadline, "not at end after %d ms: %d seen", wait_ms(),
                     distinct(seen, N));
        member_step(m, 0, 0);
    }
    cr_assert_eq(distinct(seen, N), N, "at end with %d of %d", distinct(seen, N), N);
    cr_assert_eq(m->n_held, 0);
    cr_assert_eq(cons_close(m->cons), SVC_OK);
    cons_free(m->cons);
    free(m);
}

/* cons_poll without out serves the consumer but hands nothing out: what it
 * fetches is parked within the window (the assignment pauses), and later
 * polls with out hand every message out, once, in partition order. */
Test(consumer, serve_only_parks, .timeout = 120) {
    enum { N = 400, PARTS = 2, WINDOW = 20 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "serve");
    unique_name(group, sizeof group, "serve-g");
    topic_fill(topic, PARTS, N);
    static int seen[N];
    member_t  *m = calloc(1, sizeof *m);
    m->seen = seen;
    member_new(m, group, topic, WINDOW, true);
    cons_stats_t st;
    int64_t      deadline = now_ms() + wait_ms();
    do { /* until the assignment paused on what was parked */
        cr_assert_lt(now_ms(), deadline, "the window never closed");
        cr_assert_eq(cons_poll(m->cons, 50, NULL), SVC_OK, "%s", cons_strerror(m->cons));
        cons_stats(m->cons, &st);
    } while (st.pauses == 0);
    for (int i = 0; i < 20; i++) /* serving on while paused fetches nothing more */
        cr_assert_eq(cons_poll(m->cons, 20, NULL), SVC_OK);
    cons_stats(m->cons, &st);
    cr_assert_eq(st.messages, 0, "%" PRId64 " handed out by serve-only polls", st.messages);
    cr_assert(!cons_at_end(m->cons), "parked messages are not the end");
    int64_t last[PARTS];
    for (int p = 0; p < PARTS; p++)
        last[p] = -1;
    deadline = now_ms() + wait_ms();
    while (!cons_at_end(m->cons)) {
        cr_assert_lt(now_ms(), deadline, "%d of %d seen", distinct(seen, N), N);
        cons_msg_t *msg = NULL;
        cr_assert_eq(cons_poll(m->cons, 5, &msg), SVC_OK);
        if (!msg)
            continue;
        int32_t p = cons_msg_partition(msg);
        cr_assert_gt(cons_msg_offset(msg), last[p], "partition %d out of order", p);
        last[p] = cons_msg_offset(msg);
        seen[msg_id(msg)]++;
        cons_msg_done(m->cons, msg, true);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(seen[i], 1, "message %d seen %d times", i, seen[i]);
    cons_stats(m->cons, &st);
    cr_assert_leq(st.in_flight_max, WINDOW);
    cr_assert_eq(cons_close(m->cons), SVC_OK);
    cons_free(m->cons);
    free(m);
}

/* The window in bytes (max_bytes): what is held never passes it (but one
 * message, which always goes), whatever the count window allows; fetching
 * pauses on it; every message is still handed out once, in partition
 * order. Values are "0".."299": 1 to 3 bytes, no key. */
Test(consumer, window_bytes, .timeout = 120) {
    enum { N = 300, PARTS = 2, MAX_BYTES = 20 };
    char topic[128], group[128], errstr[512];
    unique_name(topic, sizeof topic, "bytes");
    unique_name(group, sizeof group, "bytes-g");
    topic_fill(topic, PARTS, N);
    const char *topics[] = {topic, NULL};
    cons_conf_t cc = {.brokers = bootstrap(),
                      .group = group,
                      .topics = topics,
                      .from_beginning = true,
                      .max_in_flight = 1000,
                      .max_bytes = MAX_BYTES,
                      .stop_at_end = true,
                      .stats_interval_ms = 200};
    cons_t     *c = cons_new(&cc, errstr, sizeof errstr);
    cr_assert_not_null(c, "cons_new: %s", errstr);
    static int  seen[N];
    cons_msg_t *held[N];
    size_t      n_held = 0, bytes = 0, most = 0;
    int64_t     last[PARTS] = {-1, -1};
    int64_t     deadline = now_ms() + wait_ms();
    while (!cons_at_end(c)) {
        cr_assert_lt(now_ms(), deadline, "%d of %d seen", distinct(seen, N), N);
        cons_msg_t *msg = NULL;
        cr_assert_eq(cons_poll(c, 20, &msg), SVC_OK, "%s", cons_strerror(c));
        if (msg) {
            size_t vlen = 0, klen = 0;
            (void)cons_msg_value(msg, &vlen);
            (void)cons_msg_key(msg, &klen);
            held[n_held++] = msg;
            bytes += vlen + klen;
            cr_assert(bytes <= MAX_BYTES || n_held == 1, "%zu bytes held in %zu messages", bytes,
                      n_held);
            most = n_held > most ? n_held : most;
            int32_t p = cons_msg_partition(msg);
            cr_assert_gt(cons_msg_offset(msg), last[p], "partition %d out of order", p);
            last[p] = cons_msg_offset(msg);
            seen[msg_id(msg)]++;
            continue;
        }
        for (size_t i = 0; i < n_held; i++) /* the window is shut: finish what is held */
            cons_msg_done(c, held[i], true);
        n_held = 0;
        bytes = 0;
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(seen[i], 1, "message %d seen %d times", i, seen[i]);
    cons_stats_t st;
    cons_stats(c, &st);
    cr_assert_gt(st.pauses, 0, "the byte window never paused fetching");
    cr_assert_eq(st.bytes, 0, "%" PRId64 " bytes still counted, none held", st.bytes);
    cr_assert_geq(most, 6, "at most %zu held: the byte window is not what limited it", most);
    cr_assert_eq(cons_close(c), SVC_OK, "%s", cons_strerror(c));
    cons_free(c);
}

Test(consumer, second_member_joins, .timeout = 240) {
    enum { N = 2000, PARTS = 4, WINDOW = 50 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "join");
    unique_name(group, sizeof group, "join-g");
    topic_fill(topic, PARTS, N);
    static int seen[N];
    member_t  *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    a->seen = b->seen = seen;
    a->finish_on_revoke = b->finish_on_revoke = true;
    member_new(a, group, topic, WINDOW, false);
    int64_t deadline = now_ms() + wait_ms();
    while (distinct(seen, N) < N || a->n_held > 0 || b->n_held > 0) {
        cr_assert_lt(now_ms(), deadline, "%d of %d after the wait", distinct(seen, N), N);
        cons_stats_t sb = {0};
        if (b->cons)
            cons_stats(b->cons, &sb);
        /* Slow until b owns partitions, so some are left for it. */
        int lo = sb.assigns > 0 ? 0 : 100, hi = sb.assigns > 0 ? 9 : 200;
        member_step(a, lo, hi);
        cr_assert_leq(a->n_held, WINDOW);
        if (!b->cons && a->got >= 200)
            member_new(b, group, topic, WINDOW, false);
        if (b->cons) {
            member_step(b, 0, 9);
            cr_assert_leq(b->n_held, WINDOW);
        }
    }
    cr_assert_gt(a->revoke_calls, 0, "a gave nothing up");
    cr_assert_gt(b->got, 0, "b received nothing");
    int dup = 0;
    for (int i = 0; i < N; i++)
        dup += seen[i] - 1;
    cr_log_info("a %d, b %d, duplicates %d", a->got, b->got, dup);
    cr_assert_eq(cons_close(b->cons), SVC_OK);
    cr_assert_eq(cons_close(a->cons), SVC_OK);
    cons_free(b->cons);
    cons_free(a->cons);
    free(a);
    free(b);
}

Test(consumer, restart_redelivers_unfinished, .timeout = 180) {
    enum { N = 200, PARTS = 2 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "redo");
    unique_name(group, sizeof group, "redo-g");
    topic_fill(topic, PARTS, N);
    static int seen[N];
    member_t  *m = calloc(1, sizeof *m);
    m->seen = seen;
    member_new(m, group, topic, 1000, false);
    /* Hold p0 @40, p0 @41 and p1 @70; deliver the rest at once. */
    int64_t deadline = now_ms() + wait_ms();
    while (m->got < N) {
        cr_assert_lt(now_ms(), deadline, "%d of %d", m->got, N);
        cons_msg_t *msg = NULL;
        cr_assert_eq(cons_poll(m->cons, 5, &msg), SVC_OK);
        if (!msg)
            continue;
        m->got++;
        int64_t o = cons_msg_offset(msg);
        int32_t p = cons_msg_partition(msg);
        m->held[m->n_held++] = msg;
        if (!((p == 0 && (o == 40 || o == 41)) || (p == 1 && o == 70)))
            finish_at(m, m->n_held - 1, true);
    }
    cr_assert_eq(m->n_held, 3);
    cr_assert_eq(cons_close(m->cons), SVC_OK, "%s", cons_strerror(m->cons));
    /* Finished after the revoke: dropped, not stored. */
    while (m->n_held > 0)
        finish_at(m, 0, true);
    cons_stats_t st;
    cons_stats(m->cons, &st);
    cr_assert_eq(st.stale, 3, "stale %" PRId64 " revokes %" PRId64 " stored %" PRId64, st.stale,
                 st.revokes, st.stored);
    cons_free(m->cons);
    cr_assert_eq(committed(group, topic, 0), 40);
    cr_assert_eq(committed(group, topic, 1), 70);

    member_t  *r = calloc(1, sizeof *r);
    static int again[N];
    r->seen = again;
    member_new(r, group, topic, 1000, true);
    deadline = now_ms() + wait_ms();
    int64_t lo[PARTS] = {INT64_MAX, INT64_MAX};
    while (!cons_at_end(r->cons)) {
        cr_assert_lt(now_ms(), deadline, "restart: not at end");
        cons_msg_t *msg = NULL;
        cr_assert_eq(cons_poll(r->cons, 5, &msg), SVC_OK);
        if (!msg)
            continue;
        int32_t p = cons_msg_partition(msg);
        if (cons_msg_offset(msg) < lo[p])
            lo[p] = cons_msg_offset(msg);
        again[msg_id(msg)]++;
        r->got++;
        cons_msg_done(r->cons, msg, true);
    }
    cr_assert_eq(lo[0], 40, "partition 0 restarts at %" PRId64, lo[0]);
    cr_assert_eq(lo[1], 70, "partition 1 restarts at %" PRId64, lo[1]);
    cr_assert_eq(r->got, (100 - 40) + (100 - 70));
    cr_assert_eq(cons_close(r->cons), SVC_OK);
    cons_free(r->cons);
    free(m);
    free(r);
}

Test(consumer, close_before_assignment, .timeout = 120) {
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "early");
    unique_name(group, sizeof group, "early-g");
    topic_fill(topic, 1, 1);
    member_t *m = calloc(1, sizeof *m);
    member_new(m, group, topic, 10, false);
    int64_t t0 = now_ms();
    cr_assert_eq(cons_close(m->cons), SVC_OK, "%s", cons_strerror(m->cons));
    cr_assert_lt(now_ms() - t0, wait_ms(), "close took %" PRId64 " ms", now_ms() - t0);
    cons_free(m->cons);
    free(m);
}

/* Exactly-once support: group metadata once joined, messages current until
 * a rewind, the rewind replays from the first offset (nothing committed),
 * and closing a transactional consumer commits nothing. */
Test(consumer, transactional_rewind, .timeout = 120) {
    enum { N = 40, PARTS = 2 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "txn");
    unique_name(group, sizeof group, "txn-g");
    topic_fill(topic, PARTS, N);
    const char *topics[] = {topic, NULL};
    cons_conf_t cc = {.brokers = bootstrap(),
                      .group = group,
                      .topics = topics,
                      .from_beginning = true,
                      .max_in_flight = 2 * N,
                      .transactional = true};
    char        errstr[512];
    cons_t     *cons = cons_new(&cc, errstr, sizeof errstr);
    cr_assert_not_null(cons, "%s", errstr);
    cons_msg_t *held[N];
    int         n = 0;
    int64_t     deadline = now_ms() + wait_ms();
    while (n < N) {
        cr_assert_lt(now_ms(), deadline, "%d of %d messages after %d ms", n, N, wait_ms());
        cons_msg_t *m = NULL;
        cr_assert_eq(cons_poll(cons, 100, &m), SVC_OK, "%s", cons_strerror(cons));
        if (m)
            held[n++] = m;
    }
    rd_kafka_consumer_group_metadata_t *md = cons_group_metadata(cons);
    cr_assert_not_null(md, "no group metadata after the assignment");
    rd_kafka_consumer_group_metadata_destroy(md);
    for (int i = 0; i < N; i++)
        cr_assert(cons_msg_current(cons, held[i]), "message %d not current before the rewind", i);
    /* Finish half (as a committed transaction would), then rewind: the
     * consumer committed nothing, so every message comes again. */
    for (int i = 0; i < N / 2; i++)
        cons_msg_done(cons, held[i], true);
    cr_assert_eq(cons_rewind(cons, wait_ms()), SVC_OK, "%s", cons_strerror(cons));
    for (int i = N / 2; i < N; i++) {
        cr_assert_not(cons_msg_current(cons, held[i]), "message %d current after the rewind", i);
        cons_msg_done(cons, held[i], true); /* stale: must not move anything */
    }
    static int seen[N];
    memset(seen, 0, sizeof seen);
    int again = 0;
    deadline = now_ms() + wait_ms();
    while (again < N) {
        cr_assert_lt(now_ms(), deadline, "%d of %d again after the rewind", again, N);
        cons_msg_t *m = NULL;
        cr_assert_eq(cons_poll(cons, 100, &m), SVC_OK, "%s", cons_strerror(cons));
        if (!m)
            continue;
        cr_assert(cons_msg_current(cons, m));
        seen[msg_id(m)]++;
        again++;
        cons_msg_done(cons, m, true);
    }
    cr_assert_eq(distinct(seen, N), N, "the rewind replayed %d distinct of %d", distinct(seen, N),
                 N);
    cr_assert_eq(cons_close(cons), SVC_OK, "%s", cons_strerror(cons));
    cons_free(cons);
    for (int p = 0; p < PARTS; p++)
        cr_assert_lt(committed(group, topic, p), 0,
                     "partition %d: a transactional consumer committed by itself", p);
}

/* A partition revoked while the window had paused the assignment and
 * assigned back once the window is open again must be fetched: librdkafka
 * keeps a partition's pause across unassign, so the consumer resumes what it
 * gives up (a member stalled for good after another left, before that). */
Test(consumer, revoked_while_paused_comes_back, .timeout = 240) {
    enum { N = 400, PARTS = 4, WINDOW = 10 };
    char topic[128], group[128];
    unique_name(topic, sizeof topic, "pausedrev");
    unique_name(group, sizeof group, "pausedrev-g");
    topic_fill(topic, PARTS, N);
    static int seen[N];
    memset(seen, 0, sizeof seen);
    member_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    a->seen = b->seen = seen;
    b->finish_on_revoke = true;
    member_new(a, group, topic, WINDOW, false);
    /* a fills its window and holds it: the assignment is paused. */
    int64_t      deadline = now_ms() + wait_ms();
    cons_stats_t sa;
    do {
        cr_assert_lt(now_ms(), deadline, "a never paused");
        member_step(a, 3600000, 3600000);
        cons_stats(a->cons, &sa);
    } while (sa.pauses == 0);
    /* b joins; a gives partitions up while paused (it keeps its held
     * messages: they become stale). */
    member_new(b, group, topic, 1000, false);
    deadline = now_ms() + wait_ms();
    while (a->revoke_calls == 0) {
        cr_assert_lt(now_ms(), deadline, "a gave nothing up");
        member_step(a, 3600000, 3600000);
        member_step(b, 0, 0);
    }
    /* a finishes what it held (the window reopens), b leaves: its
     * partitions come back to a, which must read them to the end. */
    for (size_t i = 0; a->n_held;)
        finish_at(a, i, true);
    deadline = now_ms() + wait_ms();
    while (b->got == 0) {
        cr_assert_lt(now_ms(), deadline, "b got nothing");
        member_step(a, 0, 0);
        member_step(b, 0, 0);
    }
    for (size_t i = 0; b->n_held;)
        finish_at(b, i, true);
    cr_assert_eq(cons_close(b->cons), SVC_OK, "%s", cons_strerror(b->cons));
    int64_t last = now_ms();
    int     before = distinct(seen, N);
    while (distinct(seen, N) < N) {
        member_step(a, 0, 0);
        if (distinct(seen, N) > before) {
            before = distinct(seen, N);
            last = now_ms();
        }
        cr_assert_lt(now_ms() - last, wait_ms(),
                     "a stalled at %d of %d after b left (a revoked while paused)",
                     distinct(seen, N), N);
    }
    cr_assert_eq(cons_close(a->cons), SVC_OK);
    cons_free(b->cons);
    cons_free(a->cons);
    free(a);
    free(b);
}
