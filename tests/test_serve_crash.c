/*
 * test_serve_crash.c -- `d3stream serve` killed with SIGKILL mid-run against
 * the real Kafka broker (D3_KAFKA_BOOTSTRAP; without it these tests FAIL):
 *
 *   kill9_restart      at least once: serve is killed after some results
 *                      are visible and restarted in the same group; every
 *                      request has a result; the duplicates are counted
 *                      and printed.
 *   eos_kill9_cycles   --exactly-once: three kill -9 / restart cycles during
 *                      a 2,000-request run; a read_committed reader sees
 *                      exactly one result per request.
 *
 * The dead member's session (6 s, -X session.timeout.ms) must expire before
 * the group rebalances to the restarted one. Request counts scale with
 * D3_TEST_SCALE (test_serve_util.h).
 */
#define TK_NAME_PREFIX "d3test-crash-"
#include "test_serve_util.h"

static void fini(void) {
    children_kill();
}

Test(crash, kill9_restart, .timeout = 3600, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    int    n = scaled(1000, 100);
    char  *bufs;
    req_t *reqs = simple_requests(n, "kill", &bufs);
    produce(t.in, reqs, n);

    char base[2048], log[128];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, FAST_GROUP);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    const char *logs[] = {log};
    watch_t     w;
    watch_init(&w, t.out, "read_uncommitted", n, false);

    pid_t pid = child_start(base, log);
    watch_until(&w, n / 3, &pid, 1, logs, 1);
    int st = child_stop(pid, SIGKILL);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "serve was not killed");
    watch_drain(&w, 500);
    int before = w.distinct;

    pid = child_start(base, log);
    watch_until(&w, n, &pid, 1, logs, 2);
    child_term_when_committed(pid, log, t.group, t.in);
    watch_drain(&w, 1000);
    int dups = watch_assert_all(&w);
    cr_assert_eq(topic_end_sum(t.out), (int64_t)w.total);
    assert_committed_at_end(t.group, t.in);
    cr_log_info("kill9_restart: %d requests, %d answered before kill -9, %d results, "
                "%d duplicated",
                n, before, w.total, dups);
    fprintf(stderr,
            "kill9_restart: %d requests, %d answered before kill -9, %d results, %d duplicated\n",
            n, before, w.total, dups);
    watch_fini(&w);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}

Test(crash, eos_kill9_cycles, .timeout = 3600, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    int    n = scaled(2000, 150);
    char  *bufs;
    req_t *reqs = simple_requests(n, "eos", &bufs);
    produce(t.in, reqs, n);

    /* Every start uses the same (default) transactional id: the restarted
     * process fences the killed one and aborts its open transaction. */
    char base[2048], log[128];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "--exactly-once " FAST_GROUP);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    const char *logs[] = {log};
    watch_t     w;
    watch_init(&w, t.out, "read_committed", n, false);

    pid_t pid = child_start(base, log);
    for (int cycle = 1; cycle <= 3; cycle++) {
        watch_until(&w, n * cycle / 5, &pid, 1, logs, 2);
        int st = child_stop(pid, SIGKILL);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "serve was not killed");
        cr_log_info("eos_kill9_cycles: kill -9 #%d after %d of %d requests", cycle, w.distinct, n);
        pid = child_start(base, log);
    }
    watch_until(&w, n, &pid, 1, logs, 2);
    child_term_ok(pid, log);
    watch_drain(&w, 1000);
    int dups = watch_assert_all(&w);
    cr_assert_eq(dups, 0, "read_committed: %d results published twice", dups);
    assert_committed_at_end(t.group, t.in);

    /* For the record: what the aborted transactions left on the topic. */
    watch_t all;
    watch_init(&all, t.out, "read_uncommitted", n, false);
    watch_until(&all, n, NULL, 0, NULL, 1);
    watch_drain(&all, 1000);
    cr_log_info("eos_kill9_cycles: %d requests, %d committed results, %d records in aborted "
                "transactions",
                n, w.total, all.total - w.total);
    fprintf(stderr, "eos_kill9_cycles: %d requests, %d committed results, %d aborted records\n", n,
            w.total, all.total - w.total);
    watch_fini(&all);
    watch_fini(&w);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}
