/*
 * test_config.c -- one configuration for serve and http (ops/ops_config.c):
 * a YAML file, D3STREAM_<OPTION> environment variables and the flags, later
 * ones winning, as `d3stream config` prints it and as serve and http parse
 * it; secrets masked. Runs the binary ($D3STREAM), as a user does; needs no
 * package and no broker.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "svc.h"
#include "test_cmd.h"

extern char **environ;

/* No D3STREAM_<OPTION> of the caller's may leak into a case. */
static void clean_env(void) {
    for (bool again = true; again;) {
        again = false;
        for (char **e = environ; *e; e++) {
            if (strncmp(*e, "D3STREAM_", 9) != 0)
                continue;
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(strcspn(*e, "=")), *e);
            unsetenv(name);
            again = true;
            break;
        }
    }
}

static char dir[] = "/tmp/d3cfg.XXXXXX";

static void setup(void) {
    clean_env();
    cr_assert(mkdtemp(dir) != NULL);
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert(system(cmd) == 0);
}

TestSuite(config, .init = setup, .fini = teardown);

/* Writes text to DIR/name; returns the path (static buffer). */
static const char *write_file(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    cr_assert(fclose(f) == 0);
    return path;
}

/* Runs "PRE; env ENV d3stream ARGS" (stderr too) in a shell; exit status,
 * output in out. */
static int run_sh(const char *pre, const char *env, const char *args, svc_buf_t *out) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s env %s '%s' %s 2>&1", dir, pre, env, binary(), args);
    svc_buf_init(out, (size_t)1 << 24);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen(%s) failed", cmd);
    char   chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0)
        cr_assert(svc_buf_add(out, chunk, n) == SVC_OK);
    cr_assert(svc_buf_add(out, "", 1) == SVC_OK);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs "env ENV d3stream ARGS" (stderr too); exit status, output in out. */
static int run(const char *env, const char *args, svc_buf_t *out) {
    return run_sh("", env, args, out);
}

/* out has the line "want" (a whole line). */
static void has_line(const svc_buf_t *out, const char *want) {
    const char *s = out->data;
    size_t      n = strlen(want);
    for (;;) {
        const char *hit = strstr(s, want);
        cr_assert(hit, "no line \"%s\" in:\n%s", want, out->data);
        if ((hit == out->data || hit[-1] == '\n') && (hit[n] == '\n' || hit[n] == '\0'))
            return;
        s = hit + 1;
    }
}

static void has_text(const svc_buf_t *out, const char *want) {
    cr_assert(strstr(out->data, want), "no \"%s\" in:\n%s", want, out->data);
}

static const char BASE[] = "model: /srv/pkg\n"
                           "brokers: file-host:9092\n"
                           "group: file-group\n"
                           "workers: 2\n";

Test(config, precedence_file_env_flag) {
    write_file("c.yaml", BASE);
    svc_buf_t out;
    cr_assert_eq(run("", "config --config c.yaml serve", &out), 0, "%s", out.data);
    has_line(&out, "group: file-group  # file");
    has_line(&out, "workers: 2  # file");
    has_line(&out, "input: null  # default");
    has_line(&out, "window: 2048  # default");
    svc_buf_fini(&out);

    cr_assert_eq(
        run("D3STREAM_GROUP=env-group D3STREAM_WORKERS=3", "config --config c.yaml serve", &out),
        0);
    has_line(&out, "group: env-group  # env");
    has_line(&out, "workers: 3  # env");
    has_line(&out, "brokers: \"file-host:9092\"  # file");
    svc_buf_fini(&out);

    /* The file from D3STREAM_CONFIG, a flag over the environment; --config
     * may also come after the command name. */
    cr_assert_eq(run("D3STREAM_CONFIG=c.yaml D3STREAM_GROUP=env-group",
                     "config serve --group flag-group --workers 5", &out),
                 0);
    has_line(&out, "group: flag-group  # flag");
    has_line(&out, "workers: 5  # flag");
    has_line(&out, "model: /srv/pkg  # file");
    has_line(&out, "# file: c.yaml (from D3STREAM_CONFIG)");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config serve --config c.yaml", &out), 0);
    has_line(&out, "group: file-group  # file");
    svc_buf_fini(&out);
}

/* The commands themselves: the package path named in their failure shows
 * which source won (no package is there: exit 3 after the options passed). */
Test(config, precedence_in_http) {
    write_file("m.yaml", "model: /nonexistent/file-model\n");
    svc_buf_t out;
    cr_assert_eq(run("", "http --config m.yaml", &out), 3, "%s", out.data);
    has_text(&out, "/nonexistent/file-model");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_MODEL=/nonexistent/env-model", "http --config m.yaml", &out), 3);
    has_text(&out, "/nonexistent/env-model");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_CONFIG=m.yaml D3STREAM_MODEL=/nonexistent/env-model",
                     "http --model /nonexistent/flag-model", &out),
                 3);
    has_text(&out, "/nonexistent/flag-model");
    cr_assert(!strstr(out.data, "env-model"));
    svc_buf_fini(&out);
}

Test(config, booleans) {
    write_file("t.yaml", "exactly-once: true\nfrom-beginning: yes\n");
    write_file("f.yaml", "exactly-once: false\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config t.yaml serve", &out), 0);
    has_line(&out, "exactly-once: true  # file");
    has_line(&out, "from-beginning: true  # file");
    has_line(&out, "stop-at-end: false  # default");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config --config f.yaml serve", &out), 0);
    has_line(&out, "exactly-once: false  # file");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_EXACTLY_ONCE=false", "config --config t.yaml serve", &out), 0);
    has_line(&out, "exactly-once: false  # env");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_EXACTLY_ONCE=TRUE", "config --config f.yaml serve", &out), 0);
    has_line(&out, "exactly-once: true  # env");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_EXACTLY_ONCE=false", "config serve --exactly-once", &out), 0);
    has_line(&out, "exactly-once: true  # flag");
    svc_buf_fini(&out);

    /* In serve itself: --transactional-id needs --exactly-once, so the
     * boolean's effect shows before any package is opened. */
    write_file("s.yaml", "model: /nonexistent/pkg\nbrokers: 127.0.0.1:1\ngroup: g\ninput: i\n"
                         "output: o\ntransactional-id: t\nexactly-once: true\n");
    cr_assert_eq(run("", "serve --config s.yaml", &out), 3, "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_EXACTLY_ONCE=false", "serve --config s.yaml", &out), 2);
    has_text(&out, "--transactional-id needs --exactly-once");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_EXACTLY_ONCE=false", "serve --config s.yaml --exactly-once", &out),
                 3, "%s", out.data);
    svc_buf_fini(&out);
}

Test(config, bad_values) {
    write_file("b.yaml", "model: /srv/pkg\nexactly-once: maybe\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config b.yaml serve", &out), 2);
    has_text(&out, "b.yaml:2: exactly-once: \"maybe\": expected true or false");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "serve --config b.yaml", &out), 2);
    has_text(&out, "b.yaml:2: exactly-once");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_EXACTLY_ONCE=sometimes", "config serve", &out), 2);
    has_text(&out, "D3STREAM_EXACTLY_ONCE: \"sometimes\"");
    svc_buf_fini(&out);
    write_file("n.yaml", "workers: many\n");
    cr_assert_eq(run("", "http --config n.yaml", &out), 2);
    has_text(&out, "n.yaml:1: workers: \"many\": expected a whole number");
    svc_buf_fini(&out);
    write_file("l.yaml", "model: /srv/pkg\n\nworkers:\n  - 1\n");
    cr_assert_eq(run("", "http --config l.yaml", &out), 2);
    has_text(&out, "l.yaml:3: workers: expected a single value");
    svc_buf_fini(&out);
    write_file("y.yaml", "model: [\n");
    cr_assert_eq(run("", "config --config y.yaml http", &out), 2);
    has_text(&out, "y.yaml:2: not YAML");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config --config missing.yaml http", &out), 2);
    has_text(&out, "missing.yaml");
    svc_buf_fini(&out);
}

Test(config, unknown_key) {
    write_file("u.yaml", "model: /srv/pkg\nbrokers: h:1\nbrokerz: h:2\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config u.yaml serve", &out), 2);
    has_text(&out, "u.yaml:3: brokerz: unknown key");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "serve --config u.yaml", &out), 2);
    has_text(&out, "u.yaml:3: brokerz: unknown key");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "http --config u.yaml", &out), 2);
    has_text(&out, "u.yaml:3: brokerz: unknown key");
    svc_buf_fini(&out);
    /* a serve-only option in the http section */
    write_file("h.yaml", "http:\n  listen: 127.0.0.1:1\n  brokers: h:1\n");
    cr_assert_eq(run("", "config --config h.yaml serve", &out), 2);
    has_text(&out, "h.yaml:3: http.brokers: unknown key");
    svc_buf_fini(&out);
}

Test(config, librdkafka_merge) {
    write_file("k.yaml", "librdkafka:\n  linger.ms: 5\n  acks: all\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config k.yaml serve -X linger.ms=9 -X client.id=c", &out), 0,
                 "%s", out.data);
    has_line(&out, "  linger.ms: 9  # flag");
    has_line(&out, "  acks: all  # file");
    has_line(&out, "  client.id: c  # flag");
    cr_assert(!strstr(out.data, "linger.ms: 5"));
    svc_buf_fini(&out);
    /* http has no librdkafka: the top-level mapping is not for it */
    cr_assert_eq(run("", "config --config k.yaml http", &out), 0);
    cr_assert(!strstr(out.data, "librdkafka"));
    svc_buf_fini(&out);
    write_file("kh.yaml", "http:\n  librdkafka:\n    acks: all\n");
    cr_assert_eq(run("", "config --config kh.yaml http", &out), 2);
    has_text(&out, "kh.yaml:2: http.librdkafka");
    svc_buf_fini(&out);
}

Test(config, secrets_masked) {
    write_file("s.yaml", "schema-registry: https://alice:s3cr3t-url@registry:8081\n"
                         "librdkafka:\n"
                         "  sasl.password: s3cr3t-sasl\n"
                         "  ssl.key.password: s3cr3t-key\n"
                         "  ssl.key.pem: s3cr3t-pem\n"
                         "  sasl.oauthbearer.config: principal=s3cr3t-oauth\n"
                         "  sasl.oauthbearer.client.secret: s3cr3t-client\n"
                         "  sasl.username: alice\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config s.yaml serve -X sasl.password=s3cr3t-flag", &out), 0);
    cr_assert(!strstr(out.data, "s3cr3t"), "a secret printed:\n%s", out.data);
    has_line(&out, "schema-registry: \"https://alice:****@registry:8081\"  # file");
    has_line(&out, "  sasl.password: \"****\"  # flag");
    has_line(&out, "  ssl.key.pem: \"****\"  # file");
    has_line(&out, "  sasl.oauthbearer.config: \"****\"  # file");
    has_line(&out, "  sasl.username: alice  # file");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_SCHEMA_REGISTRY=http://u:p4ss@r:1/x", "config serve", &out), 0);
    has_line(&out, "schema-registry: \"http://u:****@r:1/x\"  # env");
    svc_buf_fini(&out);
}

Test(config, sections) {
    write_file("sec.yaml", "workers: 2\n"
                           "http: 127.0.0.1:9000\n"
                           "serve:\n  workers: 4\n  log-level: debug\n"
                           "http:\n  workers: 8\n  listen: 127.0.0.1:9001\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config sec.yaml serve", &out), 0, "%s", out.data);
    has_line(&out, "workers: 4  # file");
    has_line(&out, "log-level: debug  # file");
    has_line(&out, "http: \"127.0.0.1:9000\"  # file");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config --config sec.yaml http", &out), 0, "%s", out.data);
    has_line(&out, "workers: 8  # file");
    has_line(&out, "log-level: info  # default");
    has_line(&out, "listen: \"127.0.0.1:9001\"  # file");
    cr_assert(!strstr(out.data, "brokers"));
    svc_buf_fini(&out);
    /* the environment still wins over a section */
    cr_assert_eq(run("D3STREAM_WORKERS=6", "config --config sec.yaml http", &out), 0);
    has_line(&out, "workers: 6  # env");
    svc_buf_fini(&out);
}

/* Every option of serve's and http's --help has its line in `config`, so
 * the file, the environment and `config` know it. */
Test(config, every_option) {
    static const char *const CMDS[] = {"serve", "http"};
    for (size_t c = 0; c < 2; c++) {
        char      args[64];
        svc_buf_t help, out;
        snprintf(args, sizeof args, "%s --help", CMDS[c]);
        cr_assert_eq(run("", args, &help), 0);
        snprintf(args, sizeof args, "config %s", CMDS[c]);
        cr_assert_eq(run("", args, &out), 0, "%s", out.data);
        int n = 0;
        for (const char *s = help.data; (s = strstr(s, "\n  --")) != NULL; s++) {
            char name[64], line[80];
            if (sscanf(s + 5, "%63[a-z0-9-]", name) != 1 || !strcmp(name, "config"))
                continue;
            snprintf(line, sizeof line, "\n%s: ", name);
            cr_assert(strstr(out.data, line), "%s --%s not in `config %s`", CMDS[c], name, CMDS[c]);
            n++;
        }
        cr_assert_gt(n, 8);
        svc_buf_fini(&help);
        svc_buf_fini(&out);
    }
}

Test(config, help) {
    svc_buf_t out;
    cr_assert_eq(run("", "config --help", &out), 0);
    has_text(&out, "Usage: d3stream config");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config", &out), 2);
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config serve stray", &out), 2);
    svc_buf_fini(&out);
    cr_assert_eq(run("", "serve --help", &out), 0);
    has_text(&out, "--config FILE");
    has_text(&out, "D3STREAM_EXACTLY_ONCE=false");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "http --help", &out), 0);
    has_text(&out, "--config FILE");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "--help", &out), 0);
    has_text(&out, "  config ");
    svc_buf_fini(&out);
}

/* ------------------------------------------------------------ review fixes */

/* A key given twice, at any level, is an error naming both lines: last-wins
 * would hide a stale copy. http: as serve's --http and as the http section
 * are two keys (the sections case). */
Test(config, duplicate_keys) {
    static const struct {
        const char *text, *cmd, *want;
    } CASES[] = {
        {"workers: 2\nmodel: /m\nworkers: 3\n", "http",
         "d.yaml:3: workers: given twice (first at line 1)"},
        {"http:\n  workers: 2\n  workers: 3\n", "http",
         "d.yaml:3: http.workers: given twice (first at line 2)"},
        {"serve:\n  group: a\nserve:\n  group: b\n", "serve",
         "d.yaml:3: serve: given twice (first at line 1)"},
        {"http:\n#  workers: 2\nhttp:\n  workers: 3\n", "http",
         "d.yaml:3: http: given twice (first at line 1)"},
        {"librdkafka:\n  acks: 1\n  acks: all\n", "serve",
         "d.yaml:3: librdkafka.acks: given twice (first at line 2)"},
        {"serve:\n  librdkafka:\n    acks: 1\n    acks: all\n", "serve",
         "d.yaml:4: serve.librdkafka.acks: given twice (first at line 3)"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char      args[64];
        svc_buf_t out;
        write_file("d.yaml", CASES[i].text);
        snprintf(args, sizeof args, "config --config d.yaml %s", CASES[i].cmd);
        cr_assert_eq(run("", args, &out), 2, "case %zu:\n%s", i, out.data);
        has_text(&out, CASES[i].want);
        svc_buf_fini(&out);
    }
}

/* An explicit null is no value (not the string "~"); a NUL byte would cut
 * the value. */
Test(config, null_and_nul_values) {
    static const struct {
        const char *text, *want;
    } CASES[] = {
        {"model: ~\n", "n.yaml:1: model: has no value"},
        {"workers: 2\nmodel: null\n", "n.yaml:2: model: has no value"},
        {"listen:\n", "n.yaml:1: listen: has no value"},
        {"no-verify: ~\n", "n.yaml:1: no-verify: has no value"},
        {"http:\n  listen:\n", "n.yaml:2: http.listen: has no value"},
        {"model: \"a\\0b\"\n", "n.yaml:1: model: the value holds a NUL byte"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        svc_buf_t out;
        write_file("n.yaml", CASES[i].text);
        cr_assert_eq(run("", "config --config n.yaml http", &out), 2, "case %zu:\n%s", i, out.data);
        has_text(&out, CASES[i].want);
        svc_buf_fini(&out);
    }
    svc_buf_t out;
    write_file("p.yaml", "librdkafka:\n  acks: ~\n");
    cr_assert_eq(run("", "config --config p.yaml serve", &out), 2, "%s", out.data);
    has_text(&out, "p.yaml:2: librdkafka.acks: has no value");
    svc_buf_fini(&out);
    /* quoted, they are strings */
    write_file("q.yaml", "model: \"~\"\n");
    cr_assert_eq(run("", "config --config q.yaml http", &out), 0, "%s", out.data);
    has_line(&out, "model: \"~\"  # file");
    svc_buf_fini(&out);
}

/* A section whose lines are all commented out is empty, not the value "". */
Test(config, empty_and_scalar_sections) {
    write_file("e.yaml", "workers: 2\nserve:\n#  workers: 3\nhttp:\n#  workers: 4\n"
                         "librdkafka:\n#  acks: all\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config e.yaml serve", &out), 0, "%s", out.data);
    has_line(&out, "http: null  # default");
    has_line(&out, "workers: 2  # file");
    has_line(&out, "librdkafka: {}");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config --config e.yaml http", &out), 0, "%s", out.data);
    has_line(&out, "workers: 2  # file");
    svc_buf_fini(&out);
    write_file("s.yaml", "serve: 3\n");
    cr_assert_eq(run("", "config --config s.yaml serve", &out), 2, "%s", out.data);
    has_text(&out, "s.yaml:1: serve: must be a mapping");
    cr_assert(!strstr(out.data, "unknown key"), "%s", out.data);
    svc_buf_fini(&out);
}

/* The http section has no librdkafka: its unknown-key message must not
 * suggest it. */
Test(config, unknown_key_in_http_section) {
    write_file("h.yaml", "http:\n  brokerz: h:1\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config h.yaml http", &out), 2, "%s", out.data);
    has_text(&out, "h.yaml:2: http.brokerz: unknown key");
    cr_assert(!strstr(out.data, "librdkafka"), "%s", out.data);
    svc_buf_fini(&out);
}

/* Only one document: what follows the first must not be dropped unread. */
Test(config, one_document) {
    write_file("t.yaml", "workers: 2\n---\nworkers: 3\n");
    svc_buf_t out;
    cr_assert_eq(run("", "config --config t.yaml http", &out), 2, "%s", out.data);
    has_text(&out, "t.yaml:3: a second YAML document");
    svc_buf_fini(&out);
    write_file("b.yaml", "workers: 2\n---\nworkers: [\n");
    cr_assert_eq(run("", "config --config b.yaml http", &out), 2, "%s", out.data);
    has_text(&out, "b.yaml:4: not YAML");
    svc_buf_fini(&out);
    write_file("o.yaml", "---\nworkers: 2\n...\n");
    cr_assert_eq(run("", "config --config o.yaml http", &out), 0, "%s", out.data);
    has_line(&out, "workers: 2  # file");
    svc_buf_fini(&out);
}

/* The file's name in a message says where it was given; a directory is
 * refused as such, not as "not YAML". */
Test(config, file_named_by_its_source) {
    svc_buf_t out;
    cr_assert_eq(run("D3STREAM_CONFIG=/nonexistent/c.yaml", "http --model pkg", &out), 2);
    has_text(&out, "D3STREAM_CONFIG: \"/nonexistent/c.yaml\": No such file or directory");
    cr_assert(!strstr(out.data, "--config"), "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(run("", "http --config /nonexistent/c.yaml --model pkg", &out), 2);
    has_text(&out, "--config \"/nonexistent/c.yaml\": No such file or directory");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config --config /tmp http", &out), 2);
    has_text(&out, "--config \"/tmp\": a directory, not a regular file");
    cr_assert(!strstr(out.data, "not YAML"), "%s", out.data);
    svc_buf_fini(&out);
    /* a pipe is read (--config <(...)) */
    cr_assert_eq(run_sh("printf 'workers: 7\\n' |", "", "config --config /dev/stdin http", &out), 0,
                 "%s", out.data);
    has_line(&out, "workers: 7  # file");
    svc_buf_fini(&out);
}

/* config's --help, like serve's, does not read a broken file. */
Test(config, help_before_file) {
    write_file("bad.yaml", "workers: [\n");
    svc_buf_t out;
    cr_assert_eq(run("D3STREAM_CONFIG=bad.yaml", "config serve --help", &out), 0, "%s", out.data);
    has_text(&out, "Usage: d3stream config");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "config --config bad.yaml http -h", &out), 0, "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_CONFIG=bad.yaml", "serve --help", &out), 0, "%s", out.data);
    svc_buf_fini(&out);
}

/* The userinfo ends at the authority's last '@', the authority at the first
 * '/', '?' or '#'; a value is printed whole, however long. */
Test(config, url_masking) {
    static const struct {
        const char *url, *want;
    } CASES[] = {
        {"https://u:p@ss@h", "\"https://u:****@h\""},
        {"https://u:pa/ss@h", "\"https://u:****@h\""},
        {"https://u:p@h:8081/a@b", "\"https://u:****@h:8081/a@b\""},
        {"https://h:8081/x?q=a@b", "\"https://h:8081/x?q=a@b\""},
        {"https://u@h:8081", "\"https://u@h:8081\""},
        {"https://u:@h", "\"https://u:****@h\""},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char      args[256], want[256];
        svc_buf_t out;
        snprintf(args, sizeof args, "config serve --schema-registry '%s'", CASES[i].url);
        cr_assert_eq(run("", args, &out), 0, "%s", out.data);
        snprintf(want, sizeof want, "schema-registry: %s  # flag", CASES[i].want);
        has_line(&out, want);
        cr_assert(!strstr(out.data, "ss@") && !strstr(out.data, "pa/"), "%s", out.data);
        svc_buf_fini(&out);
    }
    char      path[5001], args[10200], want[5100];
    svc_buf_t out;
    memset(path, 'a', 5000);
    path[5000] = '\0';
    snprintf(args, sizeof args, "config serve --schema-registry https://h/%s -X client.id=%s", path,
             path);
    cr_assert_eq(run("", args, &out), 0, "%s", out.data);
    snprintf(want, sizeof want, "schema-registry: \"https://h/%s\"  # flag", path);
    has_line(&out, want);
    snprintf(want, sizeof want, "  client.id: %s  # flag", path);
    has_line(&out, want);
    svc_buf_fini(&out);
}

/* A count or a port starts with a digit on the command line too (strtoull
 * takes " 5" and "+5"); "+5" from the file was already refused. */
Test(config, numbers_need_a_digit) {
    static const char *const ARGS[] = {
        "http --model /nonexistent --workers +5",
        "http --model /nonexistent --workers ' 5'",
        "http --model /nonexistent --max-queue +1",
        "http --model /nonexistent --listen 127.0.0.1:+80",
        "http --model /nonexistent --listen '127.0.0.1: 80'",
        "serve --model /nonexistent --brokers b --group g --input i --output o --workers +2",
    };
    for (size_t i = 0; i < sizeof ARGS / sizeof ARGS[0]; i++) {
        svc_buf_t out;
        cr_assert_eq(run("", ARGS[i], &out), 2, "%s:\n%s", ARGS[i], out.data);
        svc_buf_fini(&out);
    }
    svc_buf_t out;
    write_file("p.yaml", "workers: +5\n");
    cr_assert_eq(run("", "config --config p.yaml http", &out), 2, "%s", out.data);
    svc_buf_fini(&out);
}

/* The open-file limit only ever lowers --max-connections, and says so only
 * then. (The package is missing: the limit is fitted before it is opened.) */
Test(config, max_connections_never_raised) {
    svc_buf_t out;
    cr_assert_eq(
        run_sh("ulimit -n 70;", "", "http --model /nonexistent --max-connections 10", &out), 3,
        "%s", out.data);
    cr_assert(!strstr(out.data, "lowered"), "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(
        run_sh("ulimit -n 70;", "", "http --model /nonexistent --max-connections 500", &out), 3,
        "%s", out.data);
    has_text(&out, "--max-connections 500 lowered to 64 (open-file limit 70)");
    svc_buf_fini(&out);
}

/* Below one largest body (8 MiB) the budget is refused, not raised. */
Test(config, max_body_memory_minimum) {
    svc_buf_t out;
    cr_assert_eq(run("", "http --model /nonexistent --max-body-memory 7", &out), 2, "%s", out.data);
    has_text(&out, "--max-body-memory \"7\": at least 8");
    svc_buf_fini(&out);
    cr_assert_eq(run("", "http --model /nonexistent --max-body-memory 8", &out), 3, "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(run("", "http --help", &out), 0);
    has_text(&out, "least 8");
    svc_buf_fini(&out);
}

/* A value the file or the environment gives passes the config reader's
 * type check and fails the command's own (a range): the message names the
 * flag, and then where the value is set, since no flag was typed. */
Test(config, range_errors_name_their_origin) {
    write_file("r.yaml", "model: /nonexistent\nmax-queue: 0\n");
    svc_buf_t out;
    cr_assert_eq(run("", "http --config r.yaml", &out), 2, "%s", out.data);
    has_text(&out, "--max-queue \"0\": expected a whole number from 1 to");
    has_text(&out, "that value comes from r.yaml:2: max-queue");
    svc_buf_fini(&out);
    write_file("s.yaml", "model: /nonexistent\nhttp:\n  max-body-memory: 4\n");
    cr_assert_eq(run("", "http --config s.yaml", &out), 2, "%s", out.data);
    has_text(&out, "that value comes from s.yaml:3: http.max-body-memory");
    svc_buf_fini(&out);
    cr_assert_eq(run("D3STREAM_WORKERS=0",
                     "serve --model m --brokers b --group g --input i "
                     "--output o",
                     &out),
                 2, "%s", out.data);
    has_text(&out, "that value comes from environment D3STREAM_WORKERS");
    svc_buf_fini(&out);
    /* a flag typed is its own origin: nothing more is said */
    cr_assert_eq(run("", "http --model /nonexistent --max-queue 0", &out), 2, "%s", out.data);
    cr_assert(!strstr(out.data, "comes from"), "%s", out.data);
    svc_buf_fini(&out);
}

/* The manifest check names the command that ran it, not `ask`. */
Test(config, manifest_failure_names_the_command) {
    static const struct {
        const char *args, *want;
    } CASES[] = {
        {"http --model /nonexistent", "d3stream http: no manifest"},
        {"serve --model /nonexistent --brokers b --group g --input i --output o",
         "d3stream serve: no manifest"},
        {"ask --model /nonexistent /dev/null", "d3stream ask: no manifest"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        svc_buf_t out;
        cr_assert_eq(run("", CASES[i].args, &out), 3, "%s:\n%s", CASES[i].args, out.data);
        has_text(&out, CASES[i].want);
        svc_buf_fini(&out);
    }
}

/* The example configuration the .deb installs as /etc/d3stream/d3stream.yaml
 * (ops/d3stream.yaml) parses, and says what the unit's serve needs. */
Test(config, the_shipped_example) {
    svc_buf_t out;
    cr_assert_eq(run("", "config --config '" D3_SOURCE_DIR "/ops/d3stream.yaml' serve", &out), 0,
                 "%s", out.data);
    has_line(&out, "model: /var/lib/d3stream/models/d3-nano-npu2  # file");
    has_line(&out, "group: d3stream  # file");
    has_line(&out, "  client.id: d3stream  # file");
    svc_buf_fini(&out);
}
