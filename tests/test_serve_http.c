/*
 * test_serve_http.c -- `d3stream serve --http`: one process, one package
 * load and one engine scheduler for the Kafka path and the HTTP shim,
 * against the real broker that ops/test.sh starts (D3_KAFKA_BOOTSTRAP).
 * Requests are produced to the input topic while the D3-Nano-NPU2 example
 * is posted over HTTP; both paths must answer, /metrics must carry the
 * HTTP, engine and Kafka metrics, the log must have one logfmt line per
 * result and per HTTP request, and SIGTERM must exit 0 with the offsets
 * committed. The HTTP client is a plain socket (one request per
 * connection, Connection: close).
 */
#define TK_NAME_PREFIX "d3test-shttp-"
#include "test_serve_util.h"
#include "test_requests.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define EXAMPLE D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json"

/* One HTTP/1.1 request on a new connection; returns the status (0 when the
 * connection failed) with the whole response (headers and body) in resp. */
static int http_call(int port, const char *method, const char *path, const char *body,
                     svc_buf_t *resp) {
    svc_buf_reset(resp);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return 0;
    }
    char   head[512];
    size_t blen = body ? strlen(body) : 0;
    int    n = snprintf(head, sizeof head,
                        "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                           "Content-Length: %zu\r\n\r\n",
                        method, path, blen);
    cr_assert(send(fd, head, (size_t)n, MSG_NOSIGNAL) == n);
    if (blen)
        cr_assert(send(fd, body, blen, MSG_NOSIGNAL) == (ssize_t)blen);
    char    buf[65536];
    ssize_t got;
    while ((got = recv(fd, buf, sizeof buf, 0)) > 0)
        cr_assert_eq(svc_buf_add(resp, buf, (size_t)got), SVC_OK);
    close(fd);
    cr_assert_eq(svc_buf_add(resp, "", 1), SVC_OK); /* NUL-terminated */
    int status = 0;
    return sscanf(resp->data, "HTTP/1.1 %d", &status) == 1 ? status : 0;
}

/* The port serve --http 127.0.0.1:0 logged; fails when it exits first. */
static int wait_port(pid_t pid, const char *log) {
    static const char needle[] = "listening on http://127.0.0.1:";
    int64_t           deadline = now_ms() + wait_ms();
    while (now_ms() < deadline) {
        FILE *f = fopen(log, "r");
        char  line[2048];
        int   port = 0;
        while (f && fgets(line, sizeof line, f)) {
            const char *p = strstr(line, needle);
            if (p)
                port = (int)strtol(p + strlen(needle), NULL, 10);
        }
        if (f)
            fclose(f);
        if (port > 0)
            return port;
        child_assert_running(pid, log);
        usleep(20 * 1000);
    }
    cr_assert_fail("serve --http did not listen within %d ms: see %s", wait_ms(), log);
    return 0;
}

/* /health: 200 once the model is loaded (serve still running). */
static void wait_healthy(pid_t pid, int port, const char *log, svc_buf_t *resp) {
    int64_t deadline = now_ms() + wait_ms();
    int     st = 0;
    while ((st = http_call(port, "GET", "/health", NULL, resp)) != 200 && now_ms() < deadline) {
        child_assert_running(pid, log);
        usleep(20 * 1000);
    }
    cr_assert_eq(st, 200, "/health: %d: %s", st, resp->data);
}

/* At least n results on topic out (read into recs, the count returned;
 * the caller frees them), while serve keeps running. */
static int await_results(const char *out, rec_t *recs, int n, pid_t pid, const char *log) {
    int     got = 0;
    int64_t deadline = now_ms() + wait_ms() * 2;
    while ((got = read_all(out, recs, MAX_RECS)) < n && now_ms() < deadline) {
        recs_free(recs, got);
        child_assert_running(pid, log);
        usleep(200 * 1000);
    }
    cr_assert_geq(got, n, "%d of %d Kafka results (see %s)", got, n, log);
    return got;
}

/* serve on pkg and t's topics with extra options (--http 127.0.0.1:0
 * among them), logging to log; returns its pid once /health is 200, with
 * the HTTP port in *port. */
static pid_t serve_healthy(const char *pkg, const topics_t *t, const char *extra, const char *log,
                           int *port, svc_buf_t *resp) {
    char base[2048];
    serve_cmd(base, sizeof base, pkg, t->group, t->in, t->out, t->dlq, extra);
    pid_t pid = child_start(base, log);
    *port = wait_port(pid, log);
    wait_healthy(pid, *port, log, resp);
    return pid;
}

/* The example's answer: 200 with three probabilities summing to 1. */
static void assert_example(const svc_buf_t *resp) {
    const char *body = strstr(resp->data, "\r\n\r\n");
    cr_assert_not_null(body, "%s", resp->data);
    json_t *j = json_loads(body + 4, 0, NULL);
    cr_assert_not_null(j, "%s", resp->data);
    json_t *p =
        json_object_get(json_object_get(json_object_get(j, "answers"), "route"), "probabilities");
    cr_assert_eq(json_object_size(p), 3, "%s", resp->data);
    double      sum = 0;
    const char *k;
    json_t     *v;
    json_object_foreach(p, k, v) sum += json_number_value(v);
    cr_assert(fabs(sum - 1.0) < 1e-9, "sum %.17g: %s", sum, resp->data);
    json_decref(j);
}

/* The example's bytes, NUL-terminated (caller frees). */
static char *read_example(void) {
    svc_buf_t b;
    char      errstr[256];
    size_t    len = 0;
    svc_buf_init(&b, (size_t)1 << 24);
    cr_assert(svc_buf_read_file(&b, EXAMPLE, errstr, sizeof errstr) == SVC_OK, "%s", errstr);
    cr_assert_eq(svc_buf_add(&b, "", 1), SVC_OK);
    return svc_buf_steal(&b, &len);
}

Test(serve_http, both_paths_one_engine, .timeout = 600, .fini = children_kill) {
    char dir[64], pkg[128], log[160], metrics[160];
    make_package(dir, pkg, sizeof pkg);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.prom", dir);
    topics_t t;
    topics_new(&t);
    int    n = scaled(400, 50);
    char  *bufs;
    req_t *reqs = simple_requests(n, "shttp", &bufs);
    produce(t.in, reqs, n / 2);

    char extra[512];
    snprintf(extra, sizeof extra, "--http 127.0.0.1:0 --metrics-file '%s' --workers 2", metrics);
    svc_buf_t resp;
    svc_buf_init(&resp, (size_t)1 << 26);
    int     port = 0;
    pid_t   pid = serve_healthy(pkg, &t, extra, log, &port, &resp);
    int64_t deadline;
    int     st = 0;

    /* The second half goes in while the example is posted over HTTP. */
    produce(t.in, reqs + n / 2, n - n / 2);
    char *example = read_example();
    for (int i = 0; i < 10; i++) {
        st = http_call(port, "POST", "/v1/systemone", example, &resp);
        cr_assert_eq(st, 200, "POST %d: %d: %s (see %s)", i, st, resp.data, log);
        cr_assert(strstr(resp.data, "X-Request-Id: ") || strstr(resp.data, "x-request-id: "), "%s",
                  resp.data);
        assert_example(&resp);
    }
    free(example);

    /* Every Kafka request answered. */
    static rec_t recs[MAX_RECS];
    int          got = await_results(t.out, recs, n, pid, log);
    for (int k = 0; k < got; k++)
        cr_assert(strstr(recs[k].value, "\"answers\""), "%s: %.*s", recs[k].key,
                  (int)recs[k].value_len, (char *)recs[k].value);
    recs_free(recs, got);

    /* /metrics: HTTP, engine and Kafka metrics in one text (the Kafka ones
     * are a snapshot of at most a second ago). */
    deadline = now_ms() + wait_ms();
    for (;;) {
        st = http_call(port, "GET", "/metrics", NULL, &resp);
        cr_assert_eq(st, 200, "/metrics: %d", st);
        cr_assert(strstr(resp.data, "d3stream_engine_requests_total "), "%s", resp.data);
        cr_assert(strstr(resp.data, "mode=\"at-least-once\""), "%s", resp.data);
        /* the device once (the HTTP side's; serve's snapshot adds Kafka only) */
        const char *dev = strstr(resp.data, "\nd3stream_device_info{accelerator=\"cpu\"");
        cr_assert(dev && !strstr(dev + 1, "\nd3stream_device_info{"), "%s", resp.data);
        char want[128];
        snprintf(want, sizeof want, "d3stream_results_total{status=\"2xx\"} %d\n", n);
        if (strstr(resp.data, want) &&
            strstr(resp.data, "d3stream_http_requests_total{route=\"/v1/systemone\","
                              "status=\"200\"} 10\n"))
            break;
        cr_assert(now_ms() < deadline, "no %s in %s", want, resp.data);
        usleep(200 * 1000);
    }
    svc_buf_fini(&resp);

    child_term_ok(pid, log);
    assert_committed_at_end(t.group, t.in);
    /* The metrics file keeps its names; the log has one logfmt line per
     * result and one per HTTP request. */
    cr_assert_eq(log_count(metrics, "d3stream_results_total{status=\"2xx\"} "), 1);
    cr_assert_eq(log_count(metrics, "d3stream_device_info{accelerator=\"cpu\",device=\"cpu ("), 1);
    cr_assert_eq(log_count(metrics, "\",accelerator_validated=\"true\",npu_present=\""), 1);
    cr_assert_geq(log_count(log, " request_id=shttp-"), n, "see %s", log);
    cr_assert_geq(log_count(log, "level=info cmd=serve msg=result request_id=shttp-"), n);
    cr_assert_eq(log_count(log, " msg=request request_id="), 10, "see %s", log);
    cr_assert_eq(log_count(log, " method=POST path=/v1/systemone status=200 "), 10, "see %s", log);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}

/* A Kafka backlog larger than the engine's queue (--max-queue 4) keeps the
 * queue full while it drains; the records may fill only 3/4 of it, so the
 * HTTP requests posted meanwhile are admitted (200, never 429) and run
 * before the queued records. */
Test(serve_http, backlog_leaves_room_for_http, .timeout = 600, .fini = children_kill) {
    char dir[64], pkg[128], log[160];
    make_package(dir, pkg, sizeof pkg);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    topics_t t;
    topics_new(&t);
    int    n = scaled(1000, 200);
    char  *bufs;
    req_t *reqs = simple_requests(n, "sback", &bufs);
    produce(t.in, reqs, n);
    svc_buf_t resp;
    svc_buf_init(&resp, (size_t)1 << 26);
    int   port = 0;
    pid_t pid =
        serve_healthy(pkg, &t, "--http 127.0.0.1:0 --workers 1 --max-queue 4", log, &port, &resp);
    int64_t deadline;
    int     st = 0;
    char   *example = read_example();
    /* from the first record's result (the log's line) on, one request
     * after another, while records are left (up to 100 requests) */
    static const char result[] = "level=info cmd=serve msg=result request_id=sback-";
    deadline = now_ms() + wait_ms();
    while (log_count(log, result) == 0 && now_ms() < deadline) {
        child_assert_running(pid, log);
        usleep(5 * 1000);
    }
    int during = 0;
    while (during < 100 && log_count(log, result) < n) {
        st = http_call(port, "POST", "/v1/systemone", example, &resp);
        cr_assert_eq(st, 200, "POST %d during the backlog: %d: %s (see %s)", during, st, resp.data,
                     log);
        assert_example(&resp);
        during++;
    }
    free(example);
    cr_log_info("HTTP requests answered while the backlog drained: %d (of at most 100)", during);
    cr_assert_geq(during, 3, "the backlog drained too fast for the test (%d requests)", during);
    static rec_t recs[MAX_RECS];
    recs_free(recs, await_results(t.out, recs, n, pid, log));
    svc_buf_fini(&resp);
    child_term_ok(pid, log);
    assert_committed_at_end(t.group, t.in);
    cr_assert_eq(log_count(log, " status=429 "), 0, "see %s", log);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}

/* SIGTERM with an HTTP request in the engine: it is answered 200, and
 * serve exits 0 with the Kafka side committed. */
Test(serve_http, sigterm_finishes_http, .timeout = 300, .fini = children_kill) {
    char dir[64], pkg[128], log[160];
    make_package(dir, pkg, sizeof pkg);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    topics_t t;
    topics_new(&t);
    char  *bufs;
    req_t *reqs = simple_requests(20, "sterm", &bufs);
    produce(t.in, reqs, 20);
    svc_buf_t resp;
    svc_buf_init(&resp, (size_t)1 << 26);
    int     port = 0;
    pid_t   pid = serve_healthy(pkg, &t, "--http 127.0.0.1:0 --workers 1", log, &port, &resp);
    int64_t deadline = now_ms() + wait_ms();
    /* The Kafka side answers first (so that its offsets are committed at
     * the stop), then the HTTP request goes in. */
    static rec_t recs[MAX_RECS];
    int          got = 0;
    while ((got = read_all(t.out, recs, MAX_RECS)) < 20 && now_ms() < deadline + wait_ms()) {
        recs_free(recs, got);
        child_assert_running(pid, log);
        usleep(100 * 1000);
    }
    recs_free(recs, got);
    cr_assert_geq(got, 20, "%d of 20 Kafka results (see %s)", got, log);
    char *body = slow_request(6, 200);
    int   fds[2];
    cr_assert(pipe(fds) == 0);
    pid_t c = fork();
    cr_assert(c >= 0);
    if (c == 0) {
        svc_buf_t r;
        svc_buf_init(&r, (size_t)1 << 26);
        int st = http_call(port, "POST", "/v1/systemone", body, &r);
        _exit(write(fds[1], &st, sizeof st) == sizeof st ? 0 : 1);
    }
    close(fds[1]);
    /* Wait until the engine holds it (the in-flight gauge counts it and
     * this /metrics request), then stop. */
    deadline = now_ms() + wait_ms();
    while (now_ms() < deadline) {
        cr_assert_eq(http_call(port, "GET", "/metrics", NULL, &resp), 200);
        if (strstr(resp.data, "d3stream_http_in_flight_requests 2\n"))
            break;
        usleep(5 * 1000);
    }
    child_term_ok(pid, log);
    int st = 0;
    cr_assert_eq(read(fds[0], &st, sizeof st), (ssize_t)sizeof st);
    close(fds[0]);
    waitpid(c, NULL, 0);
    cr_assert_eq(st, 200, "the in-flight HTTP request got %d (see %s)", st, log);
    assert_committed_at_end(t.group, t.in);
    svc_buf_fini(&resp);
    free(body);
    free(reqs);
    free(bufs);
    rm_tree(dir);
}

/* A malformed --http or --log-level is a usage error (2). */
Test(serve_http, usage) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' serve --model x --brokers b --group g --input i --output o --http nope "
             "2>/dev/null",
             binary());
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--http nope: usage");
    snprintf(cmd, sizeof cmd,
             "'%s' serve --model x --brokers b --group g --input i --output o --log-level loud "
             "2>/dev/null",
             binary());
    st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--log-level loud: usage");
}
