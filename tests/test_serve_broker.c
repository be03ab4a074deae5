/*
 * test_serve_broker.c -- `d3stream serve` while its broker goes away: the
 * test starts a Kafka broker of its own (ops/kafka.sh start, in a temp dir;
 * never the shared one of D3_KAFKA_BOOTSTRAP), stops it for 10 s mid-run
 * and brings it back on the same port with its data (ops/kafka.sh restart):
 * the run completes, every request is answered, the offsets are committed.
 * Without java or the broker's jars (ops/kafka.sh fetch) the test FAILS.
 * The request count scales with D3_TEST_SCALE (test_serve_util.h).
 */
#define TK_NAME_PREFIX "d3test-outage-"
#include "test_serve_util.h"

#define OUTAGE_MS 10000

static char kafka_dir[128];

/* Runs `ops/kafka.sh <verb> <kafka_dir>` and returns its exit status; the
 * first line it prints goes to out (when given). */
static int kafka_sh(const char *verb, char *out, size_t size) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s/ops/kafka.sh' %s '%s' 2>>'%s.log'", D3_SOURCE_DIR, verb,
             kafka_dir, kafka_dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "%s", cmd);
    char line[256] = "";
    if (!fgets(line, sizeof line, p))
        line[0] = '\0';
    while (fgetc(p) != EOF)
        ;
    int st = pclose(p);
    line[strcspn(line, "\n")] = '\0';
    if (out)
        snprintf(out, size, "%s", line);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void fini(void) {
    children_kill();
    if (kafka_dir[0]) {
        kafka_sh("stop --clean", NULL, 0);
        char log[160];
        snprintf(log, sizeof log, "%s.log", kafka_dir);
        unlink(log);
    }
}

Test(outage, broker_stopped_10s, .timeout = 3600, .fini = fini) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    snprintf(kafka_dir, sizeof kafka_dir, "%s-kafka", dir);
    char bs[128];
    cr_assert_eq(kafka_sh("start", bs, sizeof bs), 0, "ops/kafka.sh start %s failed: see %s.log",
                 kafka_dir, kafka_dir);
    cr_assert(strchr(bs, ':'), "ops/kafka.sh start printed \"%s\", not host:port", bs);
    setenv("D3_KAFKA_BOOTSTRAP", bs, 1); /* this test's own broker, for every helper */

    topics_t t;
    topics_new(&t);
    int    n = scaled(500, 60);
    char  *bufs;
    req_t *reqs = simple_requests(n, "outage", &bufs);
    produce(t.in, reqs, n);

    char base[2048], log[128];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "");
    snprintf(log, sizeof log, "%s/serve.log", dir);
    const char *logs[] = {log};
    watch_t     w;
    watch_init(&w, t.out, "read_uncommitted", n, false);
    pid_t pid = child_start(base, log);
    watch_until(&w, n / 4, &pid, 1, logs, 1);

    cr_assert_eq(kafka_sh("stop", NULL, 0), 0, "ops/kafka.sh stop %s", kafka_dir);
    int64_t down = now_ms();
    int     at_stop = w.distinct;
    while (now_ms() - down < OUTAGE_MS) { /* the outage itself, serve must live on */
        child_assert_running(pid, log);
        usleep(200 * 1000);
    }
    char bs2[128];
    cr_assert_eq(kafka_sh("restart", bs2, sizeof bs2), 0, "ops/kafka.sh restart %s: see %s.log",
                 kafka_dir, kafka_dir);
    cr_assert_str_eq(bs2, bs, "the broker came back elsewhere");
    int64_t up = now_ms();

    watch_until(&w, n, &pid, 1, logs, 3);
    child_term_when_committed(pid, log, t.group, t.in);
    watch_drain(&w, 1000);
    int dups = watch_assert_all(&w);
    assert_committed_at_end(t.group, t.in);
    int revokes = log_count(log, "d3stream consumer: revoked");
    cr_log_info("broker_stopped_10s: %d requests, %d answered at the stop, down %lld ms, all "
                "answered %lld ms after the restart, %d duplicated, %d revokes",
                n, at_stop, (long long)(up - down), (long long)(now_ms() - up), dups, revokes);
    fprintf(stderr,
            "broker_stopped_10s: %d requests, %d answered at the stop, %d duplicated, %d "
            "revokes\n",
            n, at_stop, dups, revokes);
    watch_fini(&w);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}
