/*
 * test_serve_util.h -- helpers shared by the tests of `d3stream serve`
 * against a real Kafka broker (test_serve.c, test_serve_accept.c,
 * test_serve_crash.c, test_serve_members.c, test_serve_broker.c): topics of
 * N_PARTS partitions, producing requests, serve as a child process (killed
 * with the test when the test dies), a watcher that reads the results topic
 * as they arrive, the request mix of the acceptance run and the checks of
 * one result record.
 *
 * Request counts scale with D3_TEST_SCALE (default 1: the acceptance
 * numbers; ops/test.sh sets less for the ASan pass). Waits are bounded by
 * wait_ms() (30 s times D3_TEST_TIMEOUT_MULT) *without progress*: a run that
 * keeps answering may take as long as it needs, one that stalls fails.
 *
 * Before including, a test defines TK_NAME_PREFIX (test_kafka_util.h).
 */
#ifndef D3_TEST_SERVE_UTIL_H
#define D3_TEST_SERVE_UTIL_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "schemas.h"
#include "test_util.h"

#ifndef TK_NAME_COUNTER
#define TK_NAME_COUNTER 1
#endif
#include "test_kafka_util.h"
#include "test_cmd.h"

#define N_PARTS  3
#define MAX_RECS 1024

/* Session and heartbeat short enough that a killed member leaves the group
 * within seconds (the broker's group.min.session.timeout.ms is 6 s). */
#define FAST_GROUP "-X session.timeout.ms=6000 -X heartbeat.interval.ms=1000"

/* ---------------------------------------------------------------- basics */

/* D3_TEST_SCALE (0.01..100, default 1). */
static inline double test_scale(void) {
    const char *s = getenv("D3_TEST_SCALE");
    if (s && *s) {
        char  *end;
        double v = strtod(s, &end);
        if (*end == '\0' && v >= 0.01 && v <= 100.0)
            return v;
    }
    return 1.0;
}

/* n times test_scale(), at least min. */
static inline int scaled(int n, int min) {
    int v = (int)lround(n * test_scale());
    return v < min ? min : v;
}

/* Creates a topic of parts partitions with the NULL-terminated topic config
 * pairs cfg and waits until each partition has a leader. */
static inline void create_topic_cfg(const char *topic, int parts, const char *const *cfg) {
    rd_kafka_t                     *rk = client_new(RD_KAFKA_PRODUCER, NULL);
    tk_admin_t                      a;
    rd_kafka_event_t               *ev = create_topics_begin_cfg(&a, rk, topic, parts, false, cfg);
    size_t                          n;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    cr_assert(n == 1 && rd_kafka_topic_result_error(res[0]) == RD_KAFKA_RESP_ERR_NO_ERROR,
              "CreateTopics \"%s\": %s", topic,
              n ? rd_kafka_topic_result_error_string(res[0]) : rd_kafka_event_error_string(ev));
    create_topics_end(&a);
    wait_topic_ready(rk, topic, parts, "not ready");
    rd_kafka_destroy(rk);
}

static inline void create_topic(const char *topic) {
    create_topic_cfg(topic, N_PARTS, NULL);
}

/* One request record to produce. */
typedef struct req {
    char        key[32], rid[32];
    const void *value;
    size_t      len;
} req_t;

/* Produces n requests (key, value, d3-request-id header) and flushes. Values
 * up to 16 MiB (the topic must allow them: max.message.bytes). */
static inline void produce(const char *topic, const req_t *reqs, int n) {
    rd_kafka_t *rk =
        client_new(RD_KAFKA_PRODUCER,
                   (const char *const[]){"linger.ms", "5", "message.max.bytes", "16777216", NULL});
    for (int i = 0; i < n; i++) {
        rd_kafka_resp_err_t err;
        for (;;) {
            err = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_KEY(reqs[i].key, strlen(reqs[i].key)),
                RD_KAFKA_V_VALUE((void *)reqs[i].value, reqs[i].len),
                RD_KAFKA_V_HEADER("d3-request-id", reqs[i].rid, -1), RD_KAFKA_V_END);
            if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                break;
            rd_kafka_poll(rk, 100);
        }
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
    int32_t             partition; /* of the topic it was read from */
    int64_t             offset;
} rec_t;

/* A copy of m in r. */
static inline void rec_copy(rec_t *r, const rd_kafka_message_t *m) {
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
    r->partition = m->partition;
    r->offset = m->offset;
    rd_kafka_headers_t *h = NULL;
    r->hdrs = rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR
                  ? rd_kafka_headers_copy(h)
                  : NULL;
}

/* Every record of every partition of topic, from the beginning to the end,
 * as a reader of the given isolation.level sees them. */
static inline int read_all_iso(const char *topic, const char *isolation, rec_t *recs, int max) {
    char group[160];
    unique_name(group, sizeof group, "reader");
    rd_kafka_t *rk =
        client_new(RD_KAFKA_CONSUMER, (const char *const[]){"group.id", group, "enable.auto.commit",
                                                            "false", "enable.partition.eof", "true",
                                                            "isolation.level", isolation, NULL});
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
        rec_copy(&recs[n++], m);
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

/* read_all_iso, read_uncommitted: aborted transactions' records too. */
static inline int read_all(const char *topic, rec_t *recs, int max) {
    return read_all_iso(topic, "read_uncommitted", recs, max);
}

static inline void recs_free(rec_t *recs, int n) {
    for (int i = 0; i < n; i++) {
        free(recs[i].key);
        free(recs[i].value);
        if (recs[i].hdrs)
            rd_kafka_headers_destroy(recs[i].hdrs);
    }
}

/* Header name of r as a NUL-terminated copy in buf; false when absent. */
static inline bool header(const rec_t *r, const char *name, char *buf, size_t size) {
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
static inline void assert_committed_at_end(const char *group, const char *topic) {
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
                  "group %s, partition %d: committed %lld, high watermark %lld", group, p,
                  (long long)c, (long long)hi);
    }
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_destroy(rk);
}

/* Whether the group's committed offsets equal the high watermarks of topic
 * (no assertion: for polling). */
static inline bool committed_at_end(const char *group, const char *topic) {
    rd_kafka_t *rk = client_new(RD_KAFKA_CONSUMER, (const char *const[]){"group.id", group, NULL});
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(N_PARTS);
    for (int p = 0; p < N_PARTS; p++)
        rd_kafka_topic_partition_list_add(parts, topic, p);
    bool ok = rd_kafka_committed(rk, parts, wait_ms()) == RD_KAFKA_RESP_ERR_NO_ERROR;
    for (int p = 0; ok && p < N_PARTS; p++) {
        int64_t lo, hi;
        ok = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, wait_ms()) ==
                 RD_KAFKA_RESP_ERR_NO_ERROR &&
             (parts->elems[p].offset == hi || (hi == 0 && parts->elems[p].offset < 0));
    }
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_destroy(rk);
    return ok;
}

/* Waits (bounded) until the group committed topic up to its end: a running
 * member commits on its auto-commit interval. */
static inline void wait_committed_at_end(const char *group, const char *topic) {
    int64_t deadline = now_ms() + wait_ms();
    while (!committed_at_end(group, topic)) {
        if (now_ms() > deadline) {
            assert_committed_at_end(group, topic); /* fails with the offsets */
            cr_assert_fail("group %s: not committed to the end", group);
        }
        usleep(200 * 1000);
    }
}

/* The sum of the high watermarks of topic's partitions. */
static inline int64_t topic_end_sum(const char *topic) {
    rd_kafka_t *rk = client_new(RD_KAFKA_PRODUCER, NULL);
    int64_t     sum = 0;
    for (int p = 0; p < N_PARTS; p++) {
        int64_t lo, hi;
        cr_assert_eq(rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, wait_ms()),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
        sum += hi;
    }
    rd_kafka_destroy(rk);
    return sum;
}

/* A package from make-package in a new temp dir (dir: 64 bytes). */
static inline void make_package(char *dir, char *pkg, size_t pkg_size) {
    snprintf(dir, 64, "/tmp/d3serve-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(pkg, pkg_size, "%s/pkg", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' make-package --size tiny --out '%s' >/dev/null 2>&1", binary(),
             pkg);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* The serve command line (without redirections) for these topics. */
static inline void serve_cmd(char *cmd, size_t size, const char *pkg, const char *group,
                             const char *in, const char *out, const char *dlq, const char *extra) {
    int n = snprintf(cmd, size,
                     "'%s' serve --model '%s' --brokers '%s' --group '%s' --input '%s' "
                     "--output '%s' %s%s%s --from-beginning %s",
                     binary(), pkg, bootstrap(), group, in, out, dlq ? "--dlq '" : "",
                     dlq ? dlq : "", dlq ? "'" : "", extra);
    cr_assert(n > 0 && (size_t)n < size);
}

/* Runs serve --stop-at-end to completion; returns its exit status. */
static inline int serve_backfill(const char *base, const char *dir, const char *log) {
    char cmd[4096];
    int  n = snprintf(cmd, sizeof cmd, "timeout %d %s --stop-at-end 2>>'%s/%s'",
                      wait_ms() / 1000 * 4, base, dir, log);
    cr_assert(n > 0 && (size_t)n < sizeof cmd);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "serve did not exit");
    return WEXITSTATUS(st);
}

typedef struct topics {
    char in[160], out[160], dlq[160], group[160];
} topics_t;

/* New names for t's topics and group; nothing is created. */
static inline void topics_name(topics_t *t) {
    unique_name(t->in, sizeof t->in, "in");
    unique_name(t->out, sizeof t->out, "out");
    unique_name(t->dlq, sizeof t->dlq, "dlq");
    unique_name(t->group, sizeof t->group, "group");
}

static inline void topics_new(topics_t *t) {
    topics_name(t);
    create_topic(t->in);
    create_topic(t->out);
    create_topic(t->dlq);
}

/* The headers SPEC k lists, with the expected status and request id. */
static inline void assert_result_headers(const rec_t *r, int status, const char *rid,
                                         const char *ctype) {
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

/* ---------------------------------------------------------------- children */

/* Serve processes this test started; the test's .fini kills what is left. */
#define MAX_CHILDREN 16
static pid_t children[MAX_CHILDREN];

/* Starts `exec <cmd> 2>><log>` (sh -c) as a child that dies with the test
 * process (PR_SET_PDEATHSIG); returns its pid (that of d3stream: exec). */
static inline pid_t child_start(const char *cmd, const char *log) {
    char line[8192];
    int  n = snprintf(line, sizeof line, "exec %s 2>>'%s'", cmd, log);
    cr_assert(n > 0 && (size_t)n < sizeof line);
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (!children[i]) {
            children[i] = pid;
            break;
        }
    return pid;
}

static inline void child_forget(pid_t pid) {
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] == pid)
            children[i] = 0;
}

/* Fails when pid has exited (it must still run); log names its stderr. */
static inline void child_assert_running(pid_t pid, const char *log) {
    int   st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
        child_forget(pid);
        cr_assert_fail("serve (pid %d) exited (%s %d) while it should run: see %s", (int)pid,
                       WIFEXITED(st) ? "status" : "signal",
                       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log);
    }
}

/* True once pid catches sig (SigCgt in /proc/PID/status): the exec from
 * sh -c has happened and the program installed its handler. */
static inline bool child_catches(pid_t pid, int sig) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    unsigned long long mask = 0;
    bool               found = false;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "SigCgt: %llx", &mask) == 1;
    fclose(f);
    return found && (mask >> (sig - 1) & 1);
}

/* Sends sig to pid and waits (bounded) for it; returns the wait status.
 * A catchable sig waits (bounded) until the child catches it: a restarted
 * serve may have nothing left to do, and a SIGTERM sent before its handler
 * exists would kill it by default action, which is not what is tested. */
static inline int child_stop(pid_t pid, int sig) {
    for (int64_t until = now_ms() + wait_ms();
         sig != SIGKILL && !child_catches(pid, sig) && now_ms() < until;)
        usleep(10 * 1000);
    cr_assert_eq(kill(pid, sig), 0, "kill %d: %s", (int)pid, strerror(errno));
    int64_t deadline = now_ms() + wait_ms() * 2;
    int     st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            child_forget(pid);
            cr_assert_fail("serve (pid %d) still ran %d ms after signal %d", (int)pid,
                           wait_ms() * 2, sig);
        }
        usleep(20 * 1000);
    }
    child_forget(pid);
    return st;
}

/* SIGTERM: serve must exit 0 (finish, flush, commit, leave). */
static inline void child_term_ok(pid_t pid, const char *log) {
    int st = child_stop(pid, SIGTERM);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "serve after SIGTERM: %s %d (see %s)",
              WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
              log);
}

/* SIGTERM once the group has committed topic to the end, then as
 * child_term_ok. Why wait: after a kill -9 or a broker outage the member
 * replays (at-least-once) what was answered but not committed, and every
 * request can already have its result before that replay has started; a
 * graceful stop finishes what is in flight, not what is still to fetch
 * (seen: committed 2 of 61 on a partition under ASan after a kill -9, 67
 * of 150 in CI after the outage, the member's generation gone). */
static inline void child_term_when_committed(pid_t pid, const char *log, const char *group,
                                             const char *topic) {
    wait_committed_at_end(group, topic);
    child_term_ok(pid, log);
}

/* For a Test's .fini: kills every child still running. */
static inline void children_kill(void) {
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
}

/* Lines of file path that contain needle (0 when it does not exist). */
static inline int log_count(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    int   n = 0;
    char  line[2048];
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

/* An Avro frame (schema id, the request JSON encoded) in f. */
static inline void avro_frame(const char *json, uint32_t id, svc_buf_t *f) {
    char      errstr[256];
    svc_buf_t bin;
    svc_buf_init(&bin, SIZE_MAX / 2);
    svc_buf_init(f, SIZE_MAX / 2);
    cr_assert_eq(sch_avro_request_from_json(json, strlen(json), &bin, errstr, sizeof errstr),
                 SVC_OK, "%s", errstr);
    cr_assert_eq(sch_frame_write(id, bin.data, bin.len, f), SVC_OK);
    svc_buf_fini(&bin);
}

/* ---------------------------------------------------------------- watcher */

/* A reader of the results topic as results arrive: counts result records per
 * request index (d3-request-id "<tag>-<index>"), optionally keeps copies. */
typedef struct watch {
    rd_kafka_t *rk;
    const char *isolation;
    int         n_req;
    int        *count; /* per request index */
    int         distinct, total;
    rec_t      *recs; /* with keep: every record, in read order */
    int         n_recs;
    bool        keep;
} watch_t;

static inline void watch_init(watch_t *w, const char *topic, const char *isolation, int n_req,
                              bool keep) {
    char group[160];
    unique_name(group, sizeof group, "watch");
    memset(w, 0, sizeof *w);
    w->isolation = isolation;
    w->n_req = n_req;
    w->keep = keep;
    w->count = calloc((size_t)n_req, sizeof *w->count);
    cr_assert_not_null(w->count);
    if (keep) {
        w->recs = calloc((size_t)n_req * 4 + 16, sizeof *w->recs);
        cr_assert_not_null(w->recs);
    }
    w->rk = client_new(RD_KAFKA_CONSUMER,
                       (const char *const[]){"group.id", group, "enable.auto.commit", "false",
                                             "isolation.level", isolation, NULL});
    rd_kafka_poll_set_consumer(w->rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(N_PARTS);
    for (int p = 0; p < N_PARTS; p++)
        rd_kafka_topic_partition_list_add(parts, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    cr_assert_eq(rd_kafka_assign(w->rk, parts), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(parts);
}

static inline void watch_fini(watch_t *w) {
    rd_kafka_consumer_close(w->rk);
    rd_kafka_destroy(w->rk);
    if (w->recs)
        recs_free(w->recs, w->n_recs);
    free(w->recs);
    free(w->count);
}

/* The request index in a d3-request-id "<tag>-<index>"; -1 when none. */
static inline int rid_index(const char *rid) {
    const char *dash = strrchr(rid, '-');
    if (!dash || !dash[1])
        return -1;
    char *end;
    long  i = strtol(dash + 1, &end, 10);
    return *end == '\0' && i >= 0 && i < 10000000 ? (int)i : -1;
}

/* Reads what arrived within about ms; returns how many records. */
static inline int watch_poll(watch_t *w, int ms) {
    int     got = 0;
    int64_t end = now_ms() + ms;
    do {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(w->rk, 50);
        if (!m)
            continue;
        if (m->err) { /* informational (e.g. a broker restarting) */
            rd_kafka_message_destroy(m);
            continue;
        }
        rec_t r = {0};
        rec_copy(&r, m);
        rd_kafka_message_destroy(m);
        char rid[64];
        int  i = header(&r, "d3-request-id", rid, sizeof rid) ? rid_index(rid) : -1;
        cr_assert(i >= 0 && i < w->n_req, "%s watcher: a result for an unknown request id (key %s)",
                  w->isolation, r.key);
        w->distinct += w->count[i]++ == 0;
        w->total++;
        got++;
        if (w->keep) {
            cr_assert(w->n_recs < w->n_req * 4 + 16, "too many results");
            w->recs[w->n_recs++] = r;
        } else
            recs_free(&r, 1);
    } while (now_ms() < end);
    return got;
}

/* Reads results until at least target distinct requests have one, while the
 * running serve processes (pids, n_pids; logs for the messages) stay up.
 * Fails when no new result came for wait_ms() (times stall_mult). */
static inline void watch_until(watch_t *w, int target, const pid_t *pids, int n_pids,
                               const char *const *logs, int stall_mult) {
    int64_t stall = (int64_t)wait_ms() * (stall_mult > 0 ? stall_mult : 1);
    int64_t last = now_ms();
    while (w->distinct < target) {
        if (watch_poll(w, 200) > 0)
            last = now_ms();
        for (int k = 0; k < n_pids; k++)
            child_assert_running(pids[k], logs[k]);
        cr_assert(now_ms() - last < stall,
                  "%s watcher: %d of %d requests answered, %d results; nothing new for %lld ms "
                  "(serve log: %s)",
                  w->isolation, w->distinct, target, w->total, (long long)stall,
                  n_pids ? logs[0] : "-");
    }
}

/* Reads for a while longer (late duplicates), until nothing came for ms. */
static inline void watch_drain(watch_t *w, int ms) {
    while (watch_poll(w, ms) > 0)
        ;
}

/* Every request has a result; returns how many extra (duplicate) results. */
static inline int watch_assert_all(const watch_t *w) {
    int dups = 0;
    for (int i = 0; i < w->n_req; i++) {
        cr_assert(w->count[i] > 0, "%s: request %d has no result", w->isolation, i);
        dups += w->count[i] - 1;
    }
    return dups;
}

/* ---------------------------------------------------------------- requests */

/* A simple valid request (one noul question), index i, request id tag-i. */
static inline void simple_request(int i, const char *tag, req_t *r, char *buf, size_t size) {
    snprintf(r->key, sizeof r->key, "k%06d", i);
    snprintf(r->rid, sizeof r->rid, "%s-%06d", tag, i);
    snprintf(buf, size,
             "{\"state\": \"item %d\", \"questions\": {\"n\": {\"type\": \"noul\", "
             "\"instructions\": \"keep?\"}}}",
             i);
    r->value = buf;
    r->len = strlen(buf);
}

/* n simple requests in static-lifetime storage the caller frees with
 * simple_requests_free. */
static inline req_t *simple_requests(int n, const char *tag, char **bufs) {
    req_t *reqs = calloc((size_t)n, sizeof *reqs);
    *bufs = calloc((size_t)n, 160);
    cr_assert(reqs && *bufs);
    for (int i = 0; i < n; i++)
        simple_request(i, tag, &reqs[i], *bufs + (size_t)i * 160, 160);
    return reqs;
}

#endif /* D3_TEST_SERVE_UTIL_H */
