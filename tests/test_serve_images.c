/*
 * test_serve_images.c -- images on the Kafka path (issue 6), against the
 * real broker (D3_KAFKA_BOOTSTRAP; without it this test FAILS): every image
 * and video case of the contract corpus (tests/contract/cases.jsonl, SPEC
 * a.10 and a.9's image case) produced to a topic, one `serve
 * --stop-at-end` backfill over a make-package package (which has a vision
 * tower), and each result checked against the case's verdict: the same
 * status, the same error object (a video case names the served model), and
 * for a 200 the answers of every question. (That equal images are encoded
 * once is test_vision.c's, on the scheduler itself.)
 */
#define TK_NAME_PREFIX "d3test-images-"
#include "test_serve_util.h"

#define CASES D3_SOURCE_DIR "/tests/contract/cases.jsonl"

static void fini(void) {
    children_kill();
}

typedef struct icase {
    char    name[96];
    json_t *verdict;
    char   *body;
    size_t  len;
} icase_t;

/* The cases about images or videos (their names start with a10_, or they
 * carry an "images"/"videos" key anywhere in the body). */
static int load_cases(icase_t *cs, int max) {
    FILE *f = fopen(CASES, "r");
    cr_assert(f, "tests/contract/cases.jsonl missing");
    char  *line = NULL;
    size_t cap = 0;
    int    n = 0;
    while (getline(&line, &cap, f) > 0 && n < max) {
        json_t *c = json_loads(line, JSON_ALLOW_NUL, NULL);
        if (!c)
            continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *body = json_string_value(json_object_get(c, "body"));
        if (name && body &&
            (strncmp(name, "a10_", 4) == 0 || strstr(body, "\"images\"") ||
             strstr(body, "\"videos\""))) {
            snprintf(cs[n].name, sizeof cs[n].name, "%s", name);
            cs[n].verdict = json_incref(json_object_get(c, "verdict"));
            cs[n].len = json_string_length(json_object_get(c, "body"));
            cs[n].body = malloc(cs[n].len + 1);
            cr_assert(cs[n].body);
            memcpy(cs[n].body, body, cs[n].len + 1);
            n++;
        }
        json_decref(c);
    }
    free(line);
    fclose(f);
    return n;
}

/* The result of case c: its status; an error equal to the verdict's (a
 * video refusal with the served model's id); a 200 with every question. */
static void check_case(const icase_t *c, const rec_t *r) {
    char buf[64];
    cr_assert(header(r, "d3-status", buf, sizeof buf), "%s: no d3-status", c->name);
    int     status = (int)strtol(buf, NULL, 10);
    int     want = (int)json_integer_value(json_object_get(c->verdict, "status"));
    json_t *got = json_loadb(r->value, r->value_len, 0, NULL);
    cr_assert(got, "%s: result is not JSON", c->name);
    cr_expect_eq(status, want, "%s: status %d, want %d: %.300s", c->name, status, want,
                 (const char *)r->value);
    const json_t *err = json_object_get(c->verdict, "error");
    if (status == want && err) {
        const char   *msg = json_string_value(json_object_get(err, "message"));
        const json_t *ge = json_object_get(got, "error");
        if (msg && strstr(msg, "reads no videos"))
            cr_expect(strstr(json_string_value(json_object_get(ge, "message")), "reads no videos"),
                      "%s: %.300s", c->name, (const char *)r->value);
        else
            cr_expect(json_equal(ge, err), "%s: error %.300s", c->name, (const char *)r->value);
    }
    if (status == want && want == 200) {
        const json_t *qs = json_object_get(c->verdict, "questions");
        const json_t *ans = json_object_get(got, "answers");
        const char   *k;
        json_t       *v;
        json_object_foreach((json_t *)qs, k, v) {
            const json_t *a = json_object_get(ans, k);
            bool          failed = json_object_get(v, "error") != NULL;
            cr_expect(a, "%s: no answer for %s: %.300s", c->name, k, (const char *)r->value);
            if (!a)
                continue;
            cr_expect_eq(json_object_get(a, "error") != NULL, failed, "%s: %s: %.300s", c->name, k,
                         (const char *)r->value);
            cr_expect(json_equal(json_object_get(a, "type"), json_object_get(v, "type")) || failed,
                      "%s: %s: type: %.300s", c->name, k, (const char *)r->value);
        }
    }
    json_decref(got);
}

Test(images, contract_cases_on_kafka, .timeout = 1800, .fini = fini) {
    enum { MAX_CASES = 128 };
    static icase_t cs[MAX_CASES];
    int            n = load_cases(cs, MAX_CASES);
    cr_assert(n >= 60, "only %d image/video cases", n);
    char dir[64], pkg[128];
    make_package(dir, pkg, sizeof pkg);
    topics_t t;
    topics_new(&t);
    static req_t reqs[MAX_CASES];
    for (int i = 0; i < n; i++) {
        snprintf(reqs[i].key, sizeof reqs[i].key, "k%04d", i);
        snprintf(reqs[i].rid, sizeof reqs[i].rid, "img-%06d", i);
        reqs[i].value = cs[i].body;
        reqs[i].len = cs[i].len;
    }
    produce(t.in, reqs, n);
    char base[2048];
    serve_cmd(base, sizeof base, pkg, t.group, t.in, t.out, t.dlq, "");
    cr_assert_eq(serve_backfill(base, dir, "serve.log"), 0, "serve failed; see %s/serve.log", dir);
    static rec_t recs[MAX_RECS];
    int          got = read_all(t.out, recs, MAX_RECS);
    cr_assert_eq(got, n, "%d results for %d requests", got, n);
    int seen[MAX_CASES] = {0};
    for (int k = 0; k < got; k++) {
        char rid[64];
        cr_assert(header(&recs[k], "d3-request-id", rid, sizeof rid));
        int i = (int)strtol(rid + 4, NULL, 10);
        cr_assert(i >= 0 && i < n && !seen[i]++, "%s: unexpected or repeated", rid);
        check_case(&cs[i], &recs[k]);
    }
    recs_free(recs, got);
    for (int i = 0; i < n; i++) {
        json_decref(cs[i].verdict);
        free(cs[i].body);
    }
    rm_tree(dir);
}
