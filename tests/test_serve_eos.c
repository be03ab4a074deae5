/*
 * test_serve_eos.c -- `d3stream serve --exactly-once` when a record's own
 * output fails, and when a live instance is fenced, against the real Kafka
 * broker (D3_KAFKA_BOOTSTRAP; without it these tests FAIL):
 *
 *   refused_by_producer  the result of one request (many questions) is
 *                        larger than the producer's message.max.bytes, so
 *                        librdkafka refuses it before it is part of the
 *                        transaction: its offset must not be committed (it
 *                        was, with the rest of the transaction), and serve
 *                        stops (exit 3) after TXN_RECORD_ABORTS aborts
 *                        instead of spinning.
 *   refused_by_broker    the same result refused by the broker (the results
 *                        topic's max.message.bytes): the transaction fails
 *                        on its own; serve used to abort and rewind forever.
 *   zombie_fenced        a second instance with the same transactional id
 *                        fences the running one, which must stop (exit 3)
 *                        while its results are still in flight; the second
 *                        answers everything, none twice for read_committed.
 */
#define TK_NAME_PREFIX "d3test-eos-"
#include "test_serve_util.h"

static void fini(void) {
    children_kill();
}

/* The group's committed offset of topic [partition]; -1 when none. */
static int64_t committed(const char *group, const char *topic, int32_t partition) {
    rd_kafka_t *rk = client_new(RD_KAFKA_CONSUMER, (const char *const[]){"group.id", group, NULL});
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, partition);
    cr_assert_eq(rd_kafka_committed(rk, parts, wait_ms()), RD_KAFKA_RESP_ERR_NO_ERROR);
    int64_t c = parts->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_destroy(rk);
    return c < 0 ? -1 : c;
}

enum { N_GOOD = 12, N_BIG_QUESTIONS = 40 };

/* N_GOOD simple requests and, among them, one valid request of
 * N_BIG_QUESTIONS questions: its result is larger than 1000 bytes, the
 * others' much smaller. Runs serve (extra flags; the results topic with
 * out_max as its max.message.bytes) to its end and checks that the big
 * one's offset was never committed and that serve said why it stopped. */
static void poison_result(const char *out_max, const char *extra) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_name(&t);
    create_topic(t.in);
    create_topic_cfg(t.out, N_PARTS,
                     out_max ? (const char *const[]){"max.message.bytes", out_max, NULL} : NULL);
    create_topic(t.dlq);

    char  *bufs;
    req_t *reqs = simple_requests(N_GOOD + 1, "eosp", &bufs);
    char   big[8192];
    int    len = snprintf(big, sizeof big, "{\"state\": \"big\", \"questions\": {");
    for (int q = 0; q < N_BIG_QUESTIONS; q++)
        len += snprintf(big + len, sizeof big - (size_t)len,
                        "%s\"question_%02d\": {\"type\": \"noul\", \"instructions\": \"keep?\"}",
                        q ? ", " : "", q);
    len += snprintf(big + len, sizeof big - (size_t)len, "}}");
    cr_assert((size_t)len < sizeof big);
    reqs[N_GOOD / 2].value = big;
    reqs[N_GOOD / 2].len = (size_t)len;
    produce(t.in, reqs, N_GOOD + 1);

    /* Where the big one landed. */
    static rec_t in[N_GOOD + 1];
    int          n_in = read_all(t.in, in, N_GOOD + 1);
    cr_assert_eq(n_in, N_GOOD + 1);
    int32_t p_part = -1;
    int64_t p_off = -1;
    for (int k = 0; k < n_in; k++)
        if (in[k].value_len == (size_t)len) {
            p_part = in[k].partition;
            p_off = in[k].offset;
        }
    recs_free(in, n_in);
    cr_assert(p_part >= 0);

    char base[2048], flags[512];
    snprintf(flags, sizeof flags, "--exactly-once --commit-ms 200 %s %s", FAST_GROUP, extra);
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, flags);
    int  st = serve_backfill(base, dir, "serve.log");
    char log[128];
    snprintf(log, sizeof log, "%s/serve.log", dir);
    cr_assert_eq(st, 3, "serve exited %d, want 3 (stopped on the big result): see %s", st, log);

    int64_t c = committed(t.group, t.in, p_part);
    cr_assert(c <= p_off,
              "partition %d: committed %lld, past the big request at %lld, which has no result "
              "(see %s)",
              p_part, (long long)c, (long long)p_off, log);
    /* Nothing of the transactions that held it is visible. */
    static rec_t out[MAX_RECS];
    int          n_out = read_all_iso(t.out, "read_committed", out, MAX_RECS);
    for (int k = 0; k < n_out; k++) {
        char rid[64];
        cr_assert(
            !(header(&out[k], "d3-request-id", rid, sizeof rid) && rid_index(rid) == N_GOOD / 2),
            "the big request's result was committed");
    }
    cr_assert(log_count(log, "times in a row a record failed") == 1, "no reason given: see %s",
              log);
    cr_log_info("big request at %d@%lld: committed %lld, %d committed results", p_part,
                (long long)p_off, (long long)c, n_out);
    recs_free(out, n_out);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}

Test(eos, refused_by_producer, .timeout = 900, .fini = fini) {
    /* 1000 is librdkafka's smallest message.max.bytes; the results fit. */
    poison_result(NULL, "-X message.max.bytes=1000");
}

Test(eos, refused_by_broker, .timeout = 900, .fini = fini) {
    poison_result("1000", "");
}

Test(eos, zombie_fenced, .timeout = 3600, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    int    n = scaled(600, 120);
    char  *bufs;
    req_t *reqs = simple_requests(n, "eosz", &bufs);
    produce(t.in, reqs, n);

    char base[2048], flags[512], log_a[128], log_b[128];
    snprintf(flags, sizeof flags, "--exactly-once --transactional-id %s-txn --window 32 %s",
             t.group, FAST_GROUP);
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, flags);
    snprintf(log_a, sizeof log_a, "%s/a.log", dir);
    snprintf(log_b, sizeof log_b, "%s/b.log", dir);
    const char *logs[] = {log_a, log_b};
    watch_t     w;
    watch_init(&w, t.out, "read_committed", n, false);

    pid_t a = child_start(base, log_a);
    watch_until(&w, n / 6, &a, 1, logs, 2);
    /* B takes the transactional id: A is a zombie from B's first
     * init_transactions on, and must stop at its next transactional call. */
    pid_t b = child_start(base, log_b);
    int   st = 0;
    for (int64_t until = now_ms() + wait_ms() * 2;;) {
        pid_t r = waitpid(a, &st, WNOHANG);
        if (r == a)
            break;
        child_assert_running(b, log_b);
        cr_assert(now_ms() < until, "the fenced instance still runs after %d ms: see %s",
                  wait_ms() * 2, log_a);
        watch_poll(&w, 100);
    }
    child_forget(a);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 3, "fenced instance: %s %d, want exit 3 (see %s)",
              WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
              log_a);
    int by_a = w.distinct;

    watch_until(&w, n, &b, 1, logs + 1, 2);
    child_term_when_committed(b, log_b, t.group, t.in);
    watch_drain(&w, 1000);
    int dups = watch_assert_all(&w);
    cr_assert_eq(dups, 0, "read_committed: %d results published twice", dups);
    assert_committed_at_end(t.group, t.in);
    cr_log_info("zombie_fenced: %d requests, %d committed before the fence", n, by_a);
    fprintf(stderr, "zombie_fenced: %d requests, %d committed before A was fenced\n", n, by_a);
    watch_fini(&w);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}
