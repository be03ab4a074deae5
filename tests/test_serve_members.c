/*
 * test_serve_members.c -- a second `d3stream serve` joins the group mid-run,
 * answers some requests and leaves again (SIGTERM), against the real Kafka
 * broker (D3_KAFKA_BOOTSTRAP; without it these tests FAIL):
 *
 *   second_member      at least once: no request lost (duplicates counted)
 *   second_member_eos  --exactly-once, the second member with its own
 *                      --transactional-id: no request lost, and a
 *                      read_committed reader sees no result twice.
 *
 * Both members take at most 32 records at a time (--window), so that the
 * second one finds work when it joins; it proves it answered some through
 * its --metrics-file. The request count scales with D3_TEST_SCALE.
 */
#define TK_NAME_PREFIX "d3test-members-"
#include "test_serve_util.h"

static void fini(void) {
    children_kill();
}

/* The results member counted in its metrics file (2xx), or -1. */
static double metric_results(const char *path) {
    static const char name[] = "d3stream_results_total{status=\"2xx\"} ";
    FILE             *f = fopen(path, "r");
    char              line[512];
    double            v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, name, sizeof name - 1))
            v = strtod(line + sizeof name - 1, NULL);
    if (f)
        fclose(f);
    return v;
}

static void second_member(bool eos) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    int    n = scaled(600, 80);
    char  *bufs;
    req_t *reqs = simple_requests(n, eos ? "eosm" : "alom", &bufs);
    /* Half now, half once B has joined: A alone would answer everything
     * before B is even up (the engine is faster than a group join). */
    int first = n / 2;
    produce(t.in, reqs, first);

    char base_a[2048], base_b[2048], log_a[128], log_b[128], metrics_b[128], extra[512];
    /* Members running at the same time need different transactional ids. */
    char eos_a[256] = "", eos_b[256] = "";
    if (eos) {
        snprintf(eos_a, sizeof eos_a, "--exactly-once --transactional-id %s-a", t.group);
        snprintf(eos_b, sizeof eos_b, "--exactly-once --transactional-id %s-b", t.group);
    }
    snprintf(extra, sizeof extra, "--window 32 %s", eos_a);
    serve_cmd(base_a, sizeof base_a, pkg, t.group, t.in, t.out, t.dlq, extra);
    snprintf(metrics_b, sizeof metrics_b, "%s/b.prom", dir);
    snprintf(extra, sizeof extra, "--window 32 --metrics-file '%s' %s", metrics_b, eos_b);
    serve_cmd(base_b, sizeof base_b, pkg, t.group, t.in, t.out, t.dlq, extra);
    snprintf(log_a, sizeof log_a, "%s/a.log", dir);
    snprintf(log_b, sizeof log_b, "%s/b.log", dir);

    watch_t w;
    watch_init(&w, t.out, eos ? "read_committed" : "read_uncommitted", n, false);
    pid_t       pids[2];
    const char *logs[] = {log_a, log_b};
    pids[0] = child_start(base_a, log_a);
    watch_until(&w, first / 5, pids, 1, logs, 1);

    /* B joins; once it holds partitions the rest arrives, and it must answer
     * some of it (its metrics say so) while A runs. */
    pids[1] = child_start(base_b, log_b);
    int64_t joined = now_ms();
    char    assigned[256];
    snprintf(assigned, sizeof assigned, "d3stream consumer: assigned %s [", t.in);
    while (log_count(log_b, assigned) == 0) {
        for (int k = 0; k < 2; k++)
            child_assert_running(pids[k], logs[k]);
        cr_assert(now_ms() - joined < wait_ms(), "B got no assignment in %d ms (see %s)", wait_ms(),
                  log_b);
        watch_poll(&w, 100);
    }
    produce(t.in, reqs + first, n - first);
    int64_t last = now_ms();
    int     seen = w.distinct;
    /* serve logs one line per result ("msg=result request_id=... topic=..."); its
     * metrics file is rewritten only every 5 s. */
    while (log_count(log_b, " request_id=") == 0) {
        cr_assert(w.distinct < n,
                  "every request was answered before the second member answered "
                  "one (see %s)",
                  log_b);
        if (watch_poll(&w, 200) > 0 || w.distinct != seen) {
            seen = w.distinct;
            last = now_ms();
        }
        for (int k = 0; k < 2; k++)
            child_assert_running(pids[k], logs[k]);
        cr_assert(now_ms() - last < wait_ms(), "no progress for %d ms", wait_ms());
    }
    /* B leaves: its results are delivered and committed, its partitions
     * go back to A. */
    child_term_ok(pids[1], log_b);
    double by_b = metric_results(metrics_b);

    watch_until(&w, n, pids, 1, logs, 2);
    child_term_ok(pids[0], log_a);
    watch_drain(&w, 1000);
    int dups = watch_assert_all(&w);
    if (eos)
        cr_assert_eq(dups, 0, "read_committed: %d results published twice", dups);
    assert_committed_at_end(t.group, t.in);
    cr_log_info("second_member%s: %d requests, %.0f answered by the second member, %d "
                "duplicated",
                eos ? "_eos" : "", n, by_b, dups);
    fprintf(stderr, "second_member%s: %d requests, %.0f by the second member, %d duplicated\n",
            eos ? "_eos" : "", n, by_b, dups);
    watch_fini(&w);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}

Test(members, second_member, .timeout = 3600, .fini = fini) {
    second_member(false);
}

Test(members, second_member_eos, .timeout = 3600, .fini = fini) {
    second_member(true);
}
