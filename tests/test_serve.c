/*
 * test_serve.c -- `d3stream serve` end to end against the real Kafka broker
 * that ops/test.sh starts (D3_KAFKA_BOOTSTRAP; without it these tests FAIL,
 * never skip): a package from make-package, requests produced to a
 * 3-partition topic, serve run as a subprocess, the results topic, the
 * dead-letter topic and the group's committed offsets read back.
 * Each wait is bounded by 30 s times D3_TEST_TIMEOUT_MULT; sigterm_restart
 * scales with D3_TEST_SCALE (test_serve_util.h). The issue's
 * acceptance runs (1,000 mixed requests, kill -9, exactly-once, a second
 * member, a broker restart, poison messages) are test_serve_accept.c,
 * test_serve_crash.c, test_serve_members.c and test_serve_broker.c.
 */
#define TK_NAME_PREFIX "d3test-serve-"
#include "test_registry.h"
#include "test_serve_util.h"

/* A 200 body: every answer's probabilities sum to 1 (noul: in [0, 1]). */
static void assert_answers(const rec_t *r) {
    json_error_t je;
    json_t      *v = json_loadb(r->value, r->value_len, 0, &je);
    cr_assert_not_null(v, "%s: value does not parse: %s", r->key, je.text);
    json_t *answers = json_object_get(v, "answers");
    cr_assert(json_is_object(answers), "%s: no answers: %s", r->key, (char *)r->value);
    const char *name;
    json_t     *a;
    json_object_foreach(answers, name, a) {
        json_t *probs = json_object_get(a, "probabilities");
        if (!probs) {
            double p = json_number_value(json_object_get(a, "noul"));
            cr_assert(p >= 0 && p <= 1, "%s.%s: noul %g", r->key, name, p);
            continue;
        }
        double      sum = 0;
        const char *k;
        json_t     *p;
        json_object_foreach(probs, k, p) sum += json_number_value(p);
        cr_assert(sum > 1 - 1e-9 && sum < 1 + 1e-9, "%s.%s: sum %.17g", r->key, name, sum);
    }
    json_decref(v);
}

/* A choice request of tag, as Avro framed with schema `id`, into f. */
static void avro_request(const char *tag, uint32_t id, svc_buf_t *f) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"state\": \"avro %s\", \"questions\": {\"c\": {\"type\": \"choice\", "
             "\"criteria\": {\"x\": \"X\", \"y\": \"Y\"}}}}",
             tag);
    avro_frame(json, id, f);
}

/* A framed Avro answer as its JSON body (out: svc_buf_fini it). */
static uint32_t avro_answer(const rec_t *r, svc_buf_t *out) {
    char        errstr[256];
    uint32_t    id;
    const void *body;
    size_t      blen;
    cr_assert_eq(sch_frame_parse(r->value, r->value_len, &id, &body, &blen, errstr, sizeof errstr),
                 SVC_OK, "%s: %s", r->key, errstr);
    svc_buf_init(out, SIZE_MAX / 2);
    cr_assert_eq(sch_avro_answer_to_json(NULL, body, blen, out, errstr, sizeof errstr), SVC_OK,
                 "%s: %s", r->key, errstr);
    cr_assert(svc_buf_addc(out, '\0') == SVC_OK);
    out->len--;
    return id;
}

/* ---------------------------------------------------------------- tests */

Test(serve, usage) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' serve --help >/dev/null", binary());
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' serve --exactly-once --model x 2>/dev/null", binary());
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--exactly-once without the others: 2");
    snprintf(cmd, sizeof cmd, "'%s' serve --model x 2>/dev/null", binary());
    st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "missing flags: 2");
    snprintf(cmd, sizeof cmd,
             "'%s' serve --model x --brokers b --group g --input i --output o "
             "--schema-registry http://h:1 2>/dev/null",
             binary());
    st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--schema-registry without avro: 2");
}

/* 20 framed Avro requests (schema id 1) + one bad magic byte -> 21 results
 * (20 answers, one 400) and one dead-letter record with the original bytes. */
Test(serve, avro_backfill, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    enum { N_AV = 20 };
    static req_t     reqs[N_AV + 1];
    static svc_buf_t frames[N_AV];
    char             tag[16];
    for (int i = 0; i < N_AV; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, "a-%04d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "arid-%04d", i);
        snprintf(tag, sizeof tag, "%d", i);
        avro_request(tag, SCH_AVRO_ID_REQUEST, &frames[i]);
        reqs[i].value = frames[i].data;
        reqs[i].len = frames[i].len;
    }
    static const char bad[] = "\x07\x00\x00\x00\x01garbage";
    snprintf(reqs[N_AV].key, sizeof reqs[N_AV].key, "a-bad");
    snprintf(reqs[N_AV].rid, sizeof reqs[N_AV].rid, "arid-bad");
    reqs[N_AV].value = bad;
    reqs[N_AV].len = sizeof bad - 1;
    produce(t.in, reqs, N_AV + 1);
    for (int i = 0; i < N_AV; i++)
        svc_buf_fini(&frames[i]);

    char base[2048];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "--format avro");
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed: see %s/serve.log", dir);

    static rec_t recs[MAX_RECS];
    int          n = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(n, N_AV + 1, "%d results", n);
    for (int k = 0; k < n; k++) {
        bool is_bad = !strcmp(recs[k].key, "a-bad");
        char rid[32];
        snprintf(rid, sizeof rid, "arid-%s", recs[k].key + 2);
        assert_result_headers(&recs[k], is_bad ? 400 : 200, rid, "application/vnd.d3.answer+avro");
        svc_buf_t out;
        cr_assert_eq(avro_answer(&recs[k], &out), SCH_AVRO_ID_ANSWER);
        if (is_bad)
            cr_assert(strstr(out.data, "invalid_request") && strstr(out.data, "magic"), "%s",
                      out.data);
        else {
            rec_t j = {.key = recs[k].key, .value = out.data, .value_len = out.len};
            assert_answers(&j);
        }
        svc_buf_fini(&out);
    }
    recs_free(recs, n);
    n = read_all(t.dlq, recs, MAX_RECS);
    cr_assert_eq(n, 1, "%d dead-letter records", n);
    cr_assert_str_eq(recs[0].key, "a-bad");
    cr_assert(recs[0].value_len == sizeof bad - 1 && !memcmp(recs[0].value, bad, sizeof bad - 1));
    char buf[512];
    cr_assert(header(&recs[0], "d3-error-code", buf, sizeof buf));
    cr_assert(header(&recs[0], "d3-error-message", buf, sizeof buf));
    cr_assert(header(&recs[0], "d3-source", buf, sizeof buf));
    cr_assert(header(&recs[0], "d3-request-id", buf, sizeof buf) && !strcmp(buf, "arid-bad"),
              "the original headers are kept");
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}

/* With a registry (credentials in its URL): answers carry the id it gives
 * answer.avsc under <output>-value; a record whose schema id it has not
 * (40403) gets a 400 and a dead letter, and no message shows the password. */
Test(serve, avro_registry, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    fake_registry_t reg;
    fake_registry_start(&reg);
    enum { N_AV = 4 };
    static req_t reqs[N_AV + 1];
    svc_buf_t    frames[N_AV + 1];
    for (int i = 0; i <= N_AV; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, i < N_AV ? "r-%d" : "r-unknown", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "rrid-%d", i);
        avro_request(reqs[i].key, i < N_AV ? SCH_AVRO_ID_REQUEST : 5, &frames[i]);
        reqs[i].value = frames[i].data;
        reqs[i].len = frames[i].len;
    }
    produce(t.in, reqs, N_AV + 1);
    for (int i = 0; i <= N_AV; i++)
        svc_buf_fini(&frames[i]);

    char base[2048], extra[256];
    snprintf(extra, sizeof extra,
             "--format avro --schema-registry http://alice:s3cr3t@127.0.0.1:%d", reg.port);
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, extra);
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed: see %s/serve.log", dir);
    char subject[200];
    snprintf(subject, sizeof subject, "%s-value", t.out);
    cr_assert_str_eq(reg.subject, subject, "answer.avsc is registered under <output>-value");
    cr_assert_eq(reg.hits[1], 1, "schema 1 is asked once, then cached");
    cr_assert_eq(reg.hits[0], 1, "schema 5 is asked once");
    fake_registry_stop(&reg);

    static rec_t recs[MAX_RECS];
    int          n = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(n, N_AV + 1, "%d results", n);
    for (int k = 0; k < n; k++) {
        svc_buf_t out;
        cr_assert_eq(avro_answer(&recs[k], &out), REG_ANSWER_ID, "%s", recs[k].key);
        cr_assert(!strstr(out.data, "s3cr3t"), "%s", out.data);
        if (!strcmp(recs[k].key, "r-unknown"))
            cr_assert(strstr(out.data, "invalid_request") &&
                          strstr(out.data, "unknown schema id 5"),
                      "%s", out.data);
        else
            assert_answers(&(rec_t){.key = recs[k].key, .value = out.data, .value_len = out.len});
        svc_buf_fini(&out);
    }
    recs_free(recs, n);
    n = read_all(t.dlq, recs, MAX_RECS);
    cr_assert_eq(n, 1, "%d dead-letter records", n);
    char buf[1024];
    cr_assert(header(&recs[0], "d3-error-message", buf, sizeof buf));
    cr_assert(strstr(buf, "alice:****@") && !strstr(buf, "s3cr3t"), "%s", buf);
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    char log[128];
    snprintf(log, sizeof log, "%s/serve.log", dir);
    cr_assert_eq(log_count(log, "s3cr3t"), 0, "the log shows no password");
    rm_tree(dir);
}

/* Every record gets its one result, and its offset is committed, even
 * when answer.avsc cannot carry the answer (a NUL in a question id: avro-c
 * map keys are C strings), which becomes the 500 it is, and without
 * --dlq, when an undecodable record gets its 400 alone. */
Test(serve, avro_every_record_answered, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    static req_t reqs[3] = {{.key = "v-ok", .rid = "vrid-ok"},
                            {.key = "v-nul", .rid = "vrid-nul"},
                            {.key = "v-bad", .rid = "vrid-bad"}};
    svc_buf_t    f0, f1;
    avro_request("ok", SCH_AVRO_ID_REQUEST, &f0);
    avro_frame("{\"state\": \"x\", \"questions\": {\"a\\u0000b\": {\"type\": \"noul\", "
               "\"instructions\": \"Is it?\"}}}",
               SCH_AVRO_ID_REQUEST, &f1);
    static const char bad[] = "\x07garbage";
    reqs[0].value = f0.data;
    reqs[0].len = f0.len;
    reqs[1].value = f1.data;
    reqs[1].len = f1.len;
    reqs[2].value = bad;
    reqs[2].len = sizeof bad - 1;
    produce(t.in, reqs, 3);
    svc_buf_fini(&f0);
    svc_buf_fini(&f1);
    char base[2048];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, NULL, "--format avro");
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed: see %s/serve.log", dir);
    static rec_t recs[MAX_RECS];
    int          n = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(n, 3, "%d results", n);
    for (int k = 0; k < n; k++) {
        const char *key = recs[k].key;
        int         status = !strcmp(key, "v-ok") ? 200 : !strcmp(key, "v-nul") ? 500 : 400;
        char        rid[32];
        snprintf(rid, sizeof rid, "vrid-%s", key + 2);
        assert_result_headers(&recs[k], status, rid, "application/vnd.d3.answer+avro");
        svc_buf_t out;
        cr_assert_eq(avro_answer(&recs[k], &out), SCH_AVRO_ID_ANSWER);
        if (status == 500)
            cr_assert(strstr(out.data, "internal_error") &&
                          strstr(out.data, "cannot be written as Avro"),
                      "%s", out.data);
        else if (status == 400)
            cr_assert(strstr(out.data, "invalid_request"), "%s", out.data);
        svc_buf_fini(&out);
    }
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}

/* Two records through serve --stop-at-end with extra flags: record k gets
 * status[k], the first's body holds each of needles; all committed. */
static void serve_two(req_t *reqs, const char *extra, const int status[2],
                      const char *const *needles) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    for (int i = 0; i < 2; i++)
        reqs[i].len = strlen(reqs[i].value);
    produce(t.in, reqs, 2);
    char base[2048];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, NULL, extra);
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed: see %s/serve.log", dir);
    static rec_t recs[MAX_RECS];
    int          n = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(n, 2, "%d results", n);
    for (int k = 0; k < n; k++) {
        int i = strcmp(recs[k].key, reqs[0].key) == 0 ? 0 : 1;
        assert_result_headers(&recs[k], status[i], reqs[i].rid, "application/json");
        for (const char *const *w = needles; i == 0 && *w; w++)
            cr_assert(strstr((const char *)recs[k].value, *w), "%s not in %.300s", *w,
                      (const char *)recs[k].value);
    }
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}

/* A request whose own prompts hold more tokens than --max-queued-tokens can
 * never be queued: its result is SPEC b.7's 429 overloaded, committed, and
 * the records after it are answered (it used to be admitted on an empty
 * queue whatever its size, its every question tokenized and held). One
 * question of "big" (~245 prompt tokens) fits 300 tokens, its two do not. */
Test(serve, too_large_to_queue_is_answered_429, .timeout = 600) {
    static req_t reqs[2] = {
        {.key = "big",
         .rid = "rid-big",
         .value = "{\"state\": \"the order arrived two days late and the box was found on one "
                  "side of our door\", \"questions\": {\"a\": {\"type\": \"noul\", "
                  "\"instructions\": \"Late?\"}, \"b\": {\"type\": \"noul\", "
                  "\"instructions\": \"Damaged?\"}}}"},
        {.key = "small", .rid = "rid-small", .value = "{\"state\": \"x\", \"questions\": {}}"},
    };
    static const char *const needles[] = {"\"code\":\"overloaded\"", "cannot be queued", NULL};
    serve_two(reqs, "--max-queued-tokens 300", (const int[2]){429, 400}, needles);
}

/* Issue 34: a Kafka record's body follows --max-request-bytes as HTTP's
 * does: over a lowered limit its result is the 413 naming the number,
 * committed, and the record after it (under the limit) is answered. */
Test(serve, max_request_bytes_is_the_operators, .timeout = 600) {
    static req_t reqs[2] = {
        {.key = "big",
         .rid = "rid-big",
         .value = "{\"state\": \"a state of more than two hundred bytes: the order arrived two "
                  "days late, the box was found on one side of our door, and the customer asks "
                  "for a refund of the shipping\", \"questions\": {\"a\": {\"type\": "
                  "\"noul\", \"instructions\": \"Late?\"}}}"},
        {.key = "small", .rid = "rid-small", .value = "{\"state\": \"x\", \"questions\": {}}"},
    };
    static const char *const needles[] = {"\"code\":\"request_too_large\"", "exceeds 200 bytes",
                                          NULL};
    cr_assert_gt(strlen(reqs[0].value), 200);
    serve_two(reqs, "--max-request-bytes 200", (const int[2]){413, 400}, needles);
}

/* A result larger than a record of the results topic may be (an error body
 * echoes the request: 250,000 DEL characters in an unknown key are a 1.25 MB
 * message) becomes a 500 that says so, committed: it was refused by the
 * producer and never committed, so every restart replayed what followed. */
Test(serve, result_too_large_for_a_record, .timeout = 600) {
    enum { N_DEL = 250000 };
    static char big[N_DEL + 128];
    int         n = snprintf(big, sizeof big, "{\"state\": \"x\", \"");
    memset(big + n, 0x7f, N_DEL);
    snprintf(big + n + N_DEL, sizeof big - (size_t)n - N_DEL, "\": 1}");
    static req_t reqs[2] = {
        {.key = "big", .rid = "rid-big"},
        {.key = "next", .rid = "rid-next", .value = "{\"state\": \"x\", \"questions\": {}}"},
    };
    reqs[0].value = big;
    static const char *const needles[] = {"message.max.bytes 1000000", NULL};
    serve_two(reqs, "", (const int[2]){500, 400}, needles);
}

/* A registry URL that is not the registry (its 404 is not the registry's
 * "not found"): serve stops at start with exit 3, nothing consumed. */
Test(serve, avro_registry_wrong_url, .timeout = 300) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    fake_registry_t reg;
    fake_registry_start(&reg);
    req_t     r = {.key = "w-0", .rid = "wrid-0"};
    svc_buf_t f;
    avro_request("w", SCH_AVRO_ID_REQUEST, &f);
    r.value = f.data;
    r.len = f.len;
    produce(t.in, &r, 1);
    svc_buf_fini(&f);
    char base[2048], extra[256];
    snprintf(extra, sizeof extra, "--format avro --schema-registry http://127.0.0.1:%d/not-here",
             reg.port);
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, extra);
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 3);
    fake_registry_stop(&reg);
    char log[128];
    snprintf(log, sizeof log, "%s/serve.log", dir);
    cr_assert_eq(log_count(log, "base URL"), 1, "see %s", log);
    static rec_t recs[4];
    cr_assert_eq(read_all(t.out, recs, 4), 0);
    cr_assert(!committed_at_end(t.group, t.in));
    rm_tree(dir);
}

/* SIGTERM mid-run exits 0; a restart with the same group answers the rest:
 * every request at least once (duplicates are allowed and counted). */
Test(serve, sigterm_restart, .timeout = 600) {
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    /* At most MAX_RECS: the two reads below hold every result. */
    int          n_sig = scaled(600, 100) < MAX_RECS ? scaled(600, 100) : MAX_RECS;
    static req_t reqs[MAX_RECS];
    static char  bufs[MAX_RECS][256];
    for (int i = 0; i < n_sig; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, "s-%04d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "srid-%04d", i);
        snprintf(bufs[i], sizeof bufs[i],
                 "{\"state\": \"item %d\", \"questions\": {\"n\": {\"type\": \"noul\", "
                 "\"instructions\": \"keep?\"}}}",
                 i);
        reqs[i].value = bufs[i];
        reqs[i].len = strlen(bufs[i]);
    }
    produce(t.in, reqs, n_sig);

    char base[2048], cmd[4096];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "");
    snprintf(cmd, sizeof cmd, "exec %s 2>'%s/first.log'", base, dir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* Wait for the first answers (the log names each one), then SIGTERM. */
    char log[128];
    snprintf(log, sizeof log, "%s/first.log", dir);
    int64_t deadline = now_ms() + wait_ms();
    int     lines = 0;
    while (lines < 50 && now_ms() < deadline) {
        usleep(20 * 1000);
        FILE *f = fopen(log, "r");
        lines = 0;
        char line[1024];
        while (f && fgets(line, sizeof line, f))
            lines += strstr(line, " request_id=srid-") != NULL;
        if (f)
            fclose(f);
    }
    cr_assert_geq(lines, 50, "serve answered nothing within %d ms: see %s", wait_ms(), log);
    cr_assert_eq(kill(pid, SIGTERM), 0);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: exit %d (see %s)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, log);
    static rec_t recs[MAX_RECS * 2];
    int          first = read_all(t.out, recs, MAX_RECS * 2);
    recs_free(recs, first);
    cr_log_info("sigterm_restart: %d results before SIGTERM", first);

    cr_assert_eq(serve_backfill(base, dir, "second.log"), 0, "restart failed: see %s", dir);
    int         n = read_all(t.out, recs, MAX_RECS * 2);
    static bool seen[MAX_RECS];
    int         dups = 0;
    for (int k = 0; k < n; k++) {
        int i = -1;
        cr_assert_eq(sscanf(recs[k].key, "s-%d", &i), 1);
        cr_assert(i >= 0 && i < n_sig);
        dups += seen[i];
        seen[i] = true;
    }
    for (int i = 0; i < n_sig; i++)
        cr_assert(seen[i], "request %d never answered", i);
    cr_log_info("sigterm_restart: %d results for %d requests, %d duplicates", n, n_sig, dups);
    recs_free(recs, n);
    assert_committed_at_end(t.group, t.in);
    rm_tree(dir);
}
