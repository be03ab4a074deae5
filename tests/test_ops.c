/*
 * test_ops.c -- the d3stream command itself, run as users and external
 * checks run it: `prompt` against the golden prompts, `validate` against the
 * contract cases, `tokenize --jsonl` against the Hugging Face golden ids.
 * The expected outputs are made by tests/tools/ scripts, never by this code.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops.h"
#include "svc.h"
#include "npu.h"
#include "test_cmd.h"
#include "test_util.h"

#define GOLDEN D3_SOURCE_DIR "/tests/golden"

static char *slurp(const char *path) {
    svc_buf_t b;
    char      errstr[256];
    svc_buf_init(&b, (size_t)1 << 30);
    cr_assert(svc_buf_read_file(&b, path, errstr, sizeof errstr) == SVC_OK, "%s", errstr);
    return svc_buf_steal(&b, NULL);
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* One case through the command itself, as a user runs it. */
static bool prompt_cli_matches(const char *pkg, const char *req, const char *want) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' '%s'", binary(), pkg, req);
    svc_buf_t out;
    run_shell(cmd, &out);
    bool same = strcmp(out.data, want) == 0;
    if (!same)
        cr_log_error("d3stream prompt %s\n  got:  %.600s\n  want: %.600s", req, out.data, want);
    svc_buf_fini(&out);
    return same;
}

/* One case in-process (the same function the command calls): loading a real
 * tokenizer once per case would dominate the sanitizer run. */
static bool prompt_matches(const eng_package_t *pkg, const char *dir, const char *req,
                           const char *want) {
    char     *body = slurp(req);
    svc_buf_t out;
    char      errstr[512] = "";
    svc_buf_init(&out, (size_t)1 << 30);
    int rc = ops_prompt_body(pkg, dir, body, strlen(body), &out, errstr, sizeof errstr);
    cr_assert(rc != OPS_EXIT_FAILURE, "%s: %s", req, errstr);
    cr_assert(svc_buf_addc(&out, '\n') == SVC_OK);
    bool same = strcmp(out.data, want) == 0;
    if (!same)
        cr_log_error("prompt mismatch: %s\n  got:  %.600s\n  want: %.600s", req, out.data, want);
    svc_buf_fini(&out);
    free(body);
    return same;
}

/* Every <case>.request.json of dir, compared byte for byte with its
 * <case>.expected.json; the first few also through the command. */
static int check_prompt_dir(const char *pkg_dir, const char *dir) {
    eng_package_t *pkg = NULL;
    char           errstr[1024];
    cr_assert_eq(eng_package_open(pkg_dir, &pkg, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    DIR *d = opendir(dir);
    cr_assert(d, "no golden prompts in %s (tests/tools/gen_prompt_golden.py)", dir);
    struct dirent *de;
    int            n = 0, bad = 0;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".request.json"))
            continue;
        char req[4096], exp[4096];
        snprintf(req, sizeof req, "%s/%s", dir, de->d_name);
        snprintf(exp, sizeof exp, "%.*s.expected.json", (int)(strlen(req) - 13), req);
        char *want = slurp(exp);
        bad += !prompt_matches(pkg, pkg_dir, req, want);
        if (n < 3)
            bad += !prompt_cli_matches(pkg_dir, req, want);
        free(want);
        n++;
    }
    closedir(d);
    eng_package_free(pkg);
    cr_assert(n >= 40, "only %d golden prompt cases in %s", n, dir);
    return bad;
}

Test(ops, prompt_golden_qwen35mini) {
    int bad =
        check_prompt_dir(D3_SOURCE_DIR "/tests/fixtures/qwen35-mini", GOLDEN "/prompt/qwen35mini");
    cr_assert_eq(bad, 0, "%d golden prompts differ", bad);
}

/* The Qwen3 package: the fixture's decision config beside the fetched tokenizer. */
static void qwen3_package(char *dir, size_t size) {
    const char *tok = getenv("D3_QWEN3_DIR");
    cr_assert(tok && *tok, "D3_QWEN3_DIR unset: run tests/tools/fetch_qwen3_tokenizer.sh");
    snprintf(dir, size, "%s/qwen3-prompt-package-%d", D3_BINARY_DIR, (int)getpid());
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && cp '%s/tokenizer.json' '%s/tokenizer_config.json' "
             "'" D3_SOURCE_DIR "/tests/fixtures/qwen3-prompt/decision_config.json' '%s/'",
             dir, tok, tok, dir);
    cr_assert(system(cmd) == 0,
              "cannot assemble the Qwen3 package from %s (run "
              "tests/tools/fetch_qwen3_tokenizer.sh)",
              tok);
}

Test(ops, prompt_golden_qwen3) {
    char pkg[4096], cmd[8300];
    qwen3_package(pkg, sizeof pkg);
    int bad = check_prompt_dir(pkg, GOLDEN "/prompt/qwen3");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pkg);
    cr_assert(system(cmd) == 0);
    cr_assert_eq(bad, 0, "%d golden prompts differ", bad);
}

/* ------------------------------------------------------------- validate */

static char *write_temp(const char *data, size_t len) {
    char *path = strdup("/tmp/d3stream-case-XXXXXX");
    int   fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert(write(fd, data, len) == (ssize_t)len);
    close(fd);
    return path;
}

static int check_case(json_t *c, size_t lineno) {
    const char   *name = json_string_value(json_object_get(c, "name"));
    const json_t *body = json_object_get(c, "body");
    const json_t *b64 = json_object_get(c, "body_b64");
    char         *path;
    if (body)
        path = write_temp(json_string_value(body), json_string_length(body));
    else {
        /* Bytes that are not UTF-8 travel as base64; base64 -d makes the file. */
        char cmd[65536];
        path = write_temp("", 0);
        snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | base64 -d > '%s'", json_string_value(b64),
                 path);
        cr_assert(system(cmd) == 0, "case %zu: bad body_b64", lineno);
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' validate '%s'", binary(), path);
    svc_buf_t out;
    int       rc = run_shell(cmd, &out);
    unlink(path);
    free(path);
    json_error_t  jerr;
    json_t       *got = json_loads(out.data, JSON_ALLOW_NUL, &jerr);
    const json_t *want = json_object_get(c, "verdict");
    int           bad = 0;
    int           status = (int)json_integer_value(json_object_get(want, "status"));
    if (!got || !json_equal(got, want) || rc != (status == 200 ? 0 : 1)) {
        char *w = json_dumps(want, JSON_COMPACT | JSON_ENSURE_ASCII);
        cr_log_error("contract case %zu (%s): exit %d\n  got:  %.800s\n  want: %.800s", lineno,
                     name ? name : "?", rc, out.data, w);
        free(w);
        bad = 1;
    }
    json_decref(got);
    svc_buf_fini(&out);
    return bad;
}

Test(ops, validate_contract_cases) {
    FILE *f = fopen(D3_SOURCE_DIR "/tests/contract/cases.jsonl", "r");
    cr_assert(f, "tests/contract/cases.jsonl missing");
    char  *line = NULL;
    size_t cap = 0;
    size_t lineno = 0, n = 0;
    int    bad = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t jerr;
        json_t      *c = json_loads(line, JSON_ALLOW_NUL, &jerr);
        if (!c)
            continue; /* blank line */
        bad += check_case(c, lineno);
        json_decref(c);
        n++;
    }
    free(line);
    fclose(f);
    cr_assert(n >= 80, "only %zu contract cases", n);
    cr_assert_eq(bad, 0, "%d of %zu contract cases differ", bad, n);
}

/* ------------------------------------------------------------- tokenize */

/* Runs `tokenize --jsonl` over a golden file; compares each line's ids. */
static void check_tokenize(const char *tokjson, const char *golden, const char *flags) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --jsonl %s < '%s'", binary(), tokjson,
             flags, golden);
    svc_buf_t out;
    int       rc = run_shell(cmd, &out);
    cr_assert_eq(rc, 0, "%s exited %d", cmd, rc);
    FILE *f = fopen(golden, "r");
    cr_assert(f, "missing golden file %s (tests/tools/gen_tokenizer_golden.py)", golden);
    char  *line = NULL, *save = NULL;
    size_t cap = 0, n = 0, bad = 0;
    char  *got = strtok_r(out.data, "\n", &save);
    while (getline(&line, &cap, f) > 0) {
        json_t *g = json_loads(line, JSON_ALLOW_NUL, NULL);
        if (!g)
            continue;
        json_t *o = got ? json_loads(got, 0, NULL) : NULL;
        if (!o || !json_equal(json_object_get(o, "ids"), json_object_get(g, "ids"))) {
            if (bad++ < 5)
                cr_log_error("%s line %zu: got %.300s", golden, n + 1, got ? got : "(nothing)");
        }
        json_decref(o);
        json_decref(g);
        got = strtok_r(NULL, "\n", &save);
        n++;
    }
    free(line);
    fclose(f);
    svc_buf_fini(&out);
    cr_assert(n >= 2000, "%s has only %zu strings", golden, n);
    cr_assert_eq(bad, 0, "%s: %zu of %zu strings differ", golden, bad, n);
}

Test(ops, tokenize_golden_qwen3) {
    const char *tok = getenv("D3_QWEN3_DIR");
    cr_assert(tok && *tok, "D3_QWEN3_DIR unset: run tests/tools/fetch_qwen3_tokenizer.sh");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok);
    check_tokenize(path, GOLDEN "/tokenizer/qwen3.upstream.jsonl", "");
    check_tokenize(path, GOLDEN "/tokenizer/qwen3.as_is.jsonl", "--as-is");
}

Test(ops, tokenize_golden_qwen35mini) {
    const char *tok = D3_SOURCE_DIR "/tests/fixtures/qwen35-mini/tokenizer.json";
    check_tokenize(tok, GOLDEN "/tokenizer/qwen35mini.upstream.jsonl", "");
    check_tokenize(tok, GOLDEN "/tokenizer/qwen35mini.as_is.jsonl", "--as-is");
}

/* ------------------------------------------------------------- the CLI */

Test(ops, help_and_usage) {
    char        cmd[4096];
    svc_buf_t   out;
    const char *subs[] = {"prompt", "validate", "tokenize"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --help", binary(), subs[i]);
        cr_assert_eq(run_shell(cmd, &out), 0, "%s", cmd);
        cr_assert(strstr(out.data, "Usage: d3stream"), "%s: no usage text", cmd);
        svc_buf_fini(&out);
    }
    snprintf(cmd, sizeof cmd, "'%s' no-such-command 2>/dev/null", binary());
    cr_assert_eq(run_shell(cmd, &out), 2);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' prompt 2>/dev/null", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "prompt without --model is a usage error");
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' prompt --model /nonexistent x.json 2>&1", binary());
    cr_assert_eq(run_shell(cmd, &out), 3);
    cr_assert(strstr(out.data, "/nonexistent"), "the message names the package: %s", out.data);
    svc_buf_fini(&out);
}

Test(ops, validate_stdin_and_large_body) {
    char      cmd[4096];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "printf '[1]' | '%s' validate", binary());
    cr_assert_eq(run_shell(cmd, &out), 1);
    cr_assert_str_eq(out.data, "{\"status\":400,\"error\":{\"code\":\"invalid_request\","
                               "\"message\":\"the request body must be a JSON object\"}}\n");
    svc_buf_fini(&out);
    /* One byte over the limit: 413 with the configured number. */
    snprintf(cmd, sizeof cmd, "head -c 8388609 /dev/zero | tr '\\0' ' ' | '%s' validate", binary());
    cr_assert_eq(run_shell(cmd, &out), 1);
    cr_assert_str_eq(out.data, "{\"status\":413,\"error\":{\"code\":\"request_too_large\","
                               "\"message\":\"the request body exceeds 8388608 bytes\"}}\n");
    svc_buf_fini(&out);
}

/* ------------------------------------------------------------- ask, inspect */

#define TINY D3_SOURCE_DIR "/tests/fixtures/tiny-upstream"

/* A copy of tiny-upstream with one byte of tokenizer_config.json altered
 * (a value nothing reads, so the package still loads). */
static void tampered_copy(char *dir, size_t size) {
    snprintf(dir, size, "/tmp/d3ops-XXXXXX");
    cr_assert(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s'/* '%s'/", TINY, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "sed -i 's/\"errors\": \"replace\"/\"errors\": \"replacE\"/' "
             "'%s/tokenizer_config.json'",
             dir);
    cr_assert_eq(system(cmd), 0);
}

static void remove_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(ops, ask_example) {
    char      cmd[4096];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd,
             "'%s' ask --model '%s' '%s/ops/examples/d3-nano-npu2.json' 2>/dev/null", binary(),
             TINY, D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    json_error_t jerr;
    json_t      *r = json_loads(out.data, 0, &jerr);
    cr_assert(r, "not JSON: %s", out.data);
    const json_t *probs =
        json_object_get(json_object_get(json_object_get(r, "answers"), "route"), "probabilities");
    double      sum = 0;
    const char *keys[] = {"returns", "billing", "general"};
    for (size_t i = 0; i < 3; i++) {
        cr_assert(json_is_real(json_object_get(probs, keys[i])), "no probability for %s", keys[i]);
        sum += json_real_value(json_object_get(probs, keys[i]));
    }
    cr_assert(fabs(sum - 1.0) <= 1e-12, "sum %.17g", sum);
    json_decref(r);
    svc_buf_fini(&out);
    /* the same from stdin, with --device cpu */
    snprintf(cmd, sizeof cmd,
             "'%s' ask --device cpu --model '%s' < '%s/ops/examples/d3-nano-npu2.json' 2>/dev/null",
             binary(), TINY, D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &out), 0);
    cr_assert(strstr(out.data, "\"route\":{\"type\":\"choice\""), "%s", out.data);
    svc_buf_fini(&out);
}

Test(ops, ask_usage_and_refusals) {
    char      cmd[4096];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' ask --device gpu --model '%s' /dev/null 2>/dev/null", binary(),
             TINY);
    cr_assert_eq(run_shell(cmd, &out), 2, "--device gpu is a usage error");
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' ask --help", binary());
    cr_assert_eq(run_shell(cmd, &out), 0);
    cr_assert(strstr(out.data, "Usage: d3stream ask"));
    svc_buf_fini(&out);
    /* a whole-request error is printed, exit 1 */
    snprintf(cmd, sizeof cmd, "printf '[1]' | '%s' ask --model '%s' 2>/dev/null", binary(), TINY);
    cr_assert_eq(run_shell(cmd, &out), 1);
    cr_assert(strstr(out.data, "{\"error\":{\"code\":\"invalid_request\""), "%s", out.data);
    svc_buf_fini(&out);
    /* The path's last component names the package with --model DIR/ too
     * (SPEC a.2 4.: Path(dir).name); a link gives it a name of its own. */
    char link[64] = "/tmp/d3ops-XXXXXX";
    cr_assert(mkdtemp(link));
    snprintf(cmd, sizeof cmd,
             "ln -s '%s' '%s/renamed' && printf '{\"model\": \"renamed\", \"state\": \"s\", "
             "\"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"i\"}}}' | "
             "'%s' ask --model '%s/renamed//' 2>/dev/null; st=$?; rm -rf '%s'; exit $st",
             TINY, link, binary(), link, link);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "\"noul\""), "%s", out.data);
    svc_buf_fini(&out);
}

Test(ops, inspect_tiny_upstream) {
    char      cmd[4096];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' inspect --model '%s'", binary(), TINY);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "manifest       MODEL_MANIFEST.json: ok"), "%s", out.data);
    cr_assert(strstr(out.data, "parameters     text 509920, readout 16320"), "%s", out.data);
    cr_assert(strstr(out.data, "noncausal_full_attention"), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' inspect --json --model '%s'", binary(), TINY);
    cr_assert_eq(run_shell(cmd, &out), 0);
    json_t *r = json_loads(out.data, 0, NULL);
    cr_assert(r, "not JSON: %s", out.data);
    cr_assert(json_is_true(json_object_get(r, "ok")));
    cr_assert(json_is_true(json_object_get(json_object_get(r, "manifest"), "ok")));
    cr_assert_eq(json_integer_value(json_object_get(r, "max_length")), 8192);
    json_decref(r);
    svc_buf_fini(&out);
}

Test(ops, tampered_package) {
    char dir[64], cmd[4096];
    tampered_copy(dir, sizeof dir);
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' inspect --model '%s'", binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 1, "%s", out.data);
    cr_assert(strstr(out.data, "MISMATCH  tokenizer_config.json"), "%s", out.data);
    svc_buf_fini(&out);
    /* ask refuses it, naming the file */
    snprintf(cmd, sizeof cmd, "'%s' ask --model '%s' '%s/ops/examples/d3-nano-npu2.json' 2>&1",
             binary(), dir, D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &out), 3, "%s", out.data);
    cr_assert(strstr(out.data, "tokenizer_config.json"), "%s", out.data);
    svc_buf_fini(&out);
    /* --no-verify: a warning, and an answer */
    snprintf(cmd, sizeof cmd,
             "'%s' ask --no-verify --model '%s' '%s/ops/examples/d3-nano-npu2.json' 2>'%s/stderr'",
             binary(), dir, D3_SOURCE_DIR, dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "\"probabilities\":{\"returns\":"), "%s", out.data);
    svc_buf_fini(&out);
    char path[128];
    snprintf(path, sizeof path, "%s/stderr", dir);
    char *err = slurp(path);
    cr_assert(strstr(err, "warning: --no-verify"), "%s", err);
    free(err);
    remove_tree(dir);
}

/* --twin naming --out's directory another way ("q/", "./q", a link) is
 * refused before anything is written: the twin's config.json and README.md
 * would replace the package's and break its MANIFEST.sha256. */
Test(ops, make_package_twin_is_another_directory) {
    char dir[64], cmd[4096];
    snprintf(dir, sizeof dir, "/tmp/d3ops-XXXXXX");
    cr_assert(mkdtemp(dir));
    const char *twins[] = {"q/", "./q", "l"};
    snprintf(cmd, sizeof cmd, "ln -s q '%s/l'", dir);
    cr_assert_eq(system(cmd), 0);
    svc_buf_t out;
    for (size_t i = 0; i < sizeof twins / sizeof twins[0]; i++) {
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && '%s' make-package --size tiny --format q4nx --out q --twin '%s' 2>&1",
                 dir, binary(), twins[i]);
        cr_assert_eq(run_shell(cmd, &out), 2, "%s: %s", twins[i], out.data);
        cr_assert(strstr(out.data, "is the package's own directory"), "%s", out.data);
        svc_buf_fini(&out);
        snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/q')\"", dir);
        cr_assert_eq(system(cmd), 0, "%s: something was written into q", twins[i]);
    }
    remove_tree(dir);
}

/* make-package --format q4nx --twin, then inspect and ask on the q4nx
 * package (MANIFEST.sha256, model.q4nx) through the binary. */
Test(ops, q4nx_package_inspect_and_ask) {
    char dir[64], cmd[4096];
    snprintf(dir, sizeof dir, "/tmp/d3ops-XXXXXX");
    cr_assert(mkdtemp(dir));
    svc_buf_t out;
    snprintf(cmd, sizeof cmd,
             "'%s' make-package --size tiny --format q4nx --seed 4 --out '%s/q' --twin '%s/t' "
             "2>&1",
             binary(), dir, dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' inspect --model '%s/q'", binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "format         q4nx Gen-B (model.q4nx: "), "%s", out.data);
    cr_assert(strstr(out.data, "q4_k "), "%s", out.data);
    cr_assert(strstr(out.data, "manifest       MANIFEST.sha256: ok"), "%s", out.data);
    cr_assert(strstr(out.data, "  ok        model.q4nx"), "%s", out.data);
    cr_assert(strstr(out.data, "verdict        ok"), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' inspect --json --model '%s/q'", binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    json_t *r = json_loads(out.data, 0, NULL);
    cr_assert(r, "not JSON: %s", out.data);
    const json_t *fmt = json_object_get(r, "format");
    cr_expect_str_eq(json_string_value(json_object_get(fmt, "name")), "q4nx");
    cr_expect_str_eq(json_string_value(json_object_get(fmt, "loaded_as")), "q4nx-gen-b");
    cr_expect_str_eq(json_string_value(json_object_get(fmt, "generation")), "B");
    json_decref(r);
    svc_buf_fini(&out);
    /* ask answers on the q4nx package and on its twin alike, bit for bit,
     * when both take the same packs: the twin's F32 weights are the same
     * dequantised values (eng_ld_pack), and D3_NPU_MATMUL=int8x3 keeps the
     * q4nx tiles off their codes' kernel (avx512-grp8x2), where a CPU has
     * it. That kernel is held to the fp32 reference below. */
    char answers[2][4096];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "D3_NPU_MATMUL=int8x3 '%s' ask --model '%s/%s' "
                 "'%s/ops/examples/d3-nano-npu2.json' "
                 "2>/dev/null",
                 binary(), dir, i ? "t" : "q", D3_SOURCE_DIR);
        cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
        const char *a = strstr(out.data, "\"answers\":");
        cr_assert(a && strstr(a, "\"probabilities\":{\"returns\":"), "%s", out.data);
        snprintf(answers[i], sizeof answers[i], "%s", a);
        svc_buf_fini(&out);
    }
    cr_expect_str_eq(answers[0], answers[1]);
    /* the default kernels (the codes' own where the CPU has AVX-512 VNNI
     * and no AMX) against the scalar fp32 reference on the same
     * dequantised weights: measured |dp| 5.8e-5 on a Zen 5 (int8x3:
     * 1.9e-4) */
    double p[2][3];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s '%s' ask --model '%s/q' '%s/ops/examples/d3-nano-npu2.json' 2>/dev/null",
                 i ? "D3_NPU_KERNELS=ref" : "", binary(), dir, D3_SOURCE_DIR);
        cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
        json_t *a = json_loads(out.data, 0, NULL);
        cr_assert(a, "not JSON: %s", out.data);
        const json_t *pr = json_object_get(json_object_get(json_object_get(a, "answers"), "route"),
                                           "probabilities");
        const char   *opt[3] = {"returns", "billing", "general"};
        for (int o = 0; o < 3; o++) {
            cr_assert(json_is_real(json_object_get(pr, opt[o])), "%s", out.data);
            p[i][o] = json_real_value(json_object_get(pr, opt[o]));
        }
        json_decref(a);
        svc_buf_fini(&out);
    }
    for (int o = 0; o < 3; o++)
        cr_expect(fabs(p[0][o] - p[1][o]) <= 2e-4,
                  "option %d: %.6f (default kernels) vs %.6f (fp32 reference)", o, p[0][o],
                  p[1][o]);
    /* a tampered model.q4nx is refused, naming the file */
    snprintf(cmd, sizeof cmd, "printf 'x' >> '%s/q/model.q4nx'", dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' ask --model '%s/q' '%s/ops/examples/d3-nano-npu2.json' 2>&1",
             binary(), dir, D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &out), 3, "%s", out.data);
    cr_assert(strstr(out.data, "model.q4nx"), "%s", out.data);
    svc_buf_fini(&out);
    remove_tree(dir);
}

/* make-package writes the public converter's other layouts; inspect says
 * how each code order was settled; --q4nx-layout is checked at the command
 * line (2) and a setting the file contradicts refuses the package (3). */
Test(ops, q4nx_layouts_through_the_binary) {
    char dir[64], cmd[4096];
    snprintf(dir, sizeof dir, "/tmp/d3ops-XXXXXX");
    cr_assert(mkdtemp(dir));
    svc_buf_t out;
    snprintf(cmd, sizeof cmd,
             "'%s' make-package --size tiny --format q4nx --out '%s/q' --q4nx-tiles q4_0 "
             "--q4nx-raster B --q4nx-embed bf16 --q4nx-alpha tiles 2>&1",
             binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' inspect --model '%s/q'", binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "format         q4nx Gen-A") && strstr(out.data, "q4_0 "), "%s",
              out.data);
    cr_expect(strstr(out.data, "  q4 order    B: model.layers.0.linear_attn.ssm_alpha_proj"), "%s",
              out.data);
    cr_expect(strstr(out.data, "  q8 order    B: lm_head.weight against"), "%s", out.data);
    svc_buf_fini(&out);
    static const struct {
        const char *cmd, *setting, *needle;
        int         rc;
    } cases[] = {
        {"inspect", "q4=C", "--q4nx-layout: \"q4=C\"", 2},
        {"ask", "q4=A,q4=B", "already set", 2},
        {"ask", "q4=A", "--q4nx-layout q4=A contradicts the file", 3},
        {"ask", "q4-codes=unsigned", "contradicts the file", 3},
        {"bench", "q8=A", "q8=A contradicts", 3},
        {"ask", "q4=B,q8=B,q4-codes=signed", "\"probabilities\"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --model '%s/q' --q4nx-layout '%s' %s 2>&1 </dev/null",
                 binary(), cases[i].cmd, dir, cases[i].setting,
                 strcmp(cases[i].cmd, "ask") ? ""
                                             : D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json");
        cr_expect_eq(run_shell(cmd, &out), cases[i].rc, "%s: %s", cmd, out.data);
        cr_expect(strstr(out.data, cases[i].needle), "%s: %s", cmd, out.data);
        svc_buf_fini(&out);
    }
    /* make-package's layout options need --format q4nx */
    snprintf(cmd, sizeof cmd, "'%s' make-package --size tiny --out '%s/s' --q4nx-tiles q4_1 2>&1",
             binary(), dir);
    cr_expect_eq(run_shell(cmd, &out), 2, "%s", out.data);
    cr_expect(strstr(out.data, "need --format q4nx"), "%s", out.data);
    svc_buf_fini(&out);
    remove_tree(dir);
}

/* The example request's probabilities from `ask` on a package of
 * make-package --size tiny --seed 3, as a JSON object's three values. */
static void ask_probs(const char *dir, const char *env, const char *args, const char *request,
                      double p[3], svc_buf_t *raw) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s '%s' ask --model '%s' %s '%s' 2>/dev/null", env, binary(), dir,
             args, request);
    cr_assert_eq(run_shell(cmd, raw), 0, "%s: %s", cmd, raw->data);
    json_t *a = json_loads(raw->data, 0, NULL);
    cr_assert(a, "not JSON: %s", raw->data);
    const json_t *pr =
        json_object_get(json_object_get(json_object_get(a, "answers"), "route"), "probabilities");
    const char *opt[3] = {"returns", "billing", "general"};
    for (int o = 0; o < 3; o++)
        p[o] = json_real_value(json_object_get(pr, opt[o]));
    json_decref(a);
}

/* The exact profile's numerics, pinned: on the scalar reference kernels
 * (the same code on every x86-64), the probabilities the commit before
 * the profiles gave (its binary, run on the same packages, printed these
 * digits). 1e-12 leaves room for libm's last bit on another CPU; any
 * change to the exact path moves them by 1e-9 or more. */
Test(ops, exact_answers_pinned) {
    static const struct {
        const char *format;
        double      p[3];
    } PIN[] = {
        {"safetensors", {0.5565703196126373, 0.1871504991511562, 0.2562791812362066}},
        {"q4nx", {0.7394141296271386, 0.08700286252210905, 0.1735830078507523}},
    };
    char dir[64], cmd[2048];
    snprintf(dir, sizeof dir, "/tmp/d3ops-XXXXXX");
    cr_assert(mkdtemp(dir));
    for (size_t i = 0; i < 2; i++) {
        svc_buf_t out;
        snprintf(cmd, sizeof cmd,
                 "'%s' make-package --size tiny --seed 3 --format %s --out '%s/%s' 2>&1", binary(),
                 PIN[i].format, dir, PIN[i].format);
        cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
        svc_buf_fini(&out);
        char pkg[128];
        snprintf(pkg, sizeof pkg, "%s/%s", dir, PIN[i].format);
        double p[3];
        ask_probs(pkg, "D3_NPU_KERNELS=ref", "", D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json", p,
                  &out);
        for (int o = 0; o < 3; o++)
            cr_expect(fabs(p[o] - PIN[i].p[o]) <= 1e-12, "%s option %d: %.17g, pinned %.17g",
                      PIN[i].format, o, p[o], PIN[i].p[o]);
        svc_buf_fini(&out);
    }
    remove_tree(dir);
}

/* Profiles (SPEC point 6, a.8, b.8): a request picks fast, whose answers
 * say meta.numerics "approximate"; --profile fast makes it the default and
 * a request may still pick exact; an unknown name gets a.8's 400. */
Test(ops, profiles_through_ask) {
    char dir[64], cmd[2048], req[3][160];
    snprintf(dir, sizeof dir, "/tmp/d3ops-XXXXXX");
    cr_assert(mkdtemp(dir));
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' make-package --size tiny --format q4nx --out '%s/q' 2>&1",
             binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    svc_buf_fini(&out);
    static const char *const opts[3] = {
        "{\"profile\": \"fast\", \"return_meta\": true}",
        "{\"profile\": \"exact\", \"return_meta\": true}",
        "{\"profile\": \"turbo\"}",
    };
    for (int i = 0; i < 3; i++) {
        snprintf(req[i], sizeof req[i], "%s/r%d.json", dir, i);
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); "
                 "r[\"options\"]=json.loads(sys.argv[2]); json.dump(r, open(sys.argv[3], \"w\"))' "
                 "'%s/ops/examples/d3-nano-npu2.json' '%s' '%s'",
                 D3_SOURCE_DIR, opts[i], req[i]);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
    }
    char   pkg[128];
    double fast[3], exact[3], dflt[3], pick[3];
    snprintf(pkg, sizeof pkg, "%s/q", dir);
    ask_probs(pkg, "", "", req[0], fast, &out);
    cr_expect(strstr(out.data, "\"profile\":\"fast\""), "%s", out.data);
    cr_expect(strstr(out.data,
                     npu_fast_usable() ? "\"numerics\":\"approximate\"" : "\"numerics\":\"exact\""),
              "%s", out.data);
    svc_buf_fini(&out);
    ask_probs(pkg, "", "", req[1], exact, &out);
    cr_expect(strstr(out.data, "\"profile\":\"exact\",\"numerics\":\"exact\""), "%s", out.data);
    svc_buf_fini(&out);
    ask_probs(pkg, "", "--profile fast", D3_SOURCE_DIR "/ops/examples/d3-nano-npu2.json", dflt,
              &out);
    svc_buf_fini(&out);
    ask_probs(pkg, "", "--profile fast", req[1], pick, &out);
    svc_buf_fini(&out);
    for (int o = 0; o < 3; o++) {
        cr_expect_eq(dflt[o], fast[o], "--profile fast is the default");
        cr_expect_eq(pick[o], exact[o], "a request still picks exact");
    }
    if (npu_fast_usable())
        cr_expect_neq(fast[0], exact[0], "the profiles differ where the fast kernels run");
    snprintf(cmd, sizeof cmd, "'%s' ask --model '%s' '%s' 2>/dev/null", binary(), pkg, req[2]);
    cr_expect_eq(run_shell(cmd, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "options.profile must be one of ['exact', 'fast']"), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' ask --model '%s' --profile turbo '%s' 2>&1", binary(), pkg,
             req[1]);
    cr_expect_eq(run_shell(cmd, &out), 2, "%s", out.data);
    cr_expect(strstr(out.data, "--profile \"turbo\": expected exact or fast"), "%s", out.data);
    svc_buf_fini(&out);
    remove_tree(dir);
}

/* version names the kernels a pass runs on, and follows D3_NPU_KERNELS. */
Test(ops, version_kernels) {
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' version", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "\nkernels: ") && strstr(out.data, ", matmul "), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "D3_NPU_KERNELS=ref D3_NPU_THREADS=1 '%s' version", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "kernels: ref, matmul ref-f32, threads 1"), "%s", out.data);
    svc_buf_fini(&out);
}

/* --as-is reads no tokenizer_config.json: naming one with it is a usage
 * error, not a flag silently ignored. */
Test(ops, tokenize_as_is_takes_no_config) {
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd,
             "'%s' tokenize --tokenizer '%s/tests/fixtures/tiny-upstream/tokenizer.json' --as-is "
             "--tokenizer-config /nonexistent </dev/null 2>&1",
             binary(), D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &out), 2, "%s", out.data);
    cr_assert(strstr(out.data, "exclude each other"), "%s", out.data);
    svc_buf_fini(&out);
}

/* version takes --help and no operands. */
Test(ops, version_usage) {
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' version --help", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "Usage: d3stream version"), "%s", out.data);
    cr_assert(!strstr(out.data, "\nkernels: "), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' version bogus 2>&1", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "%s", out.data);
    cr_assert(strstr(out.data, "unexpected operand \"bogus\""), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' version --bogus 2>/dev/null", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' --version", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "\nkernels: "), "%s", out.data);
    /* the release, as --help says it (not the "dev" of a build without it) */
    cr_assert(!strncmp(out.data, "d3stream " D3_PROJECT_VERSION "\n",
                       strlen("d3stream " D3_PROJECT_VERSION "\n")),
              "%s", out.data);
    svc_buf_fini(&out);
}

/* `d3stream --help` lists every command, one line each, exactly as the
 * README's "Commands" block does and in its order (issue 31): the block is
 * the command list a newcomer reads, the help the one they run. */
Test(ops, help_lists_the_readmes_commands) {
    char      cmd[1024];
    svc_buf_t out, readme;
    snprintf(cmd, sizeof cmd, "'%s' --help", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    snprintf(cmd, sizeof cmd,
             "sed -n '/^## Commands/,/^```$/p' '%s/README.md' | sed -n '4,/^```$/p'",
             D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &readme), 0);
    const char *h = strstr(out.data, "Commands:\n");
    cr_assert(h, "%s", out.data);
    h += strlen("Commands:\n");
    size_t n = 0;
    for (const char *r = readme.data; *r && strncmp(r, "```", 3); n++) {
        const char *re = strchr(r, '\n'), *he = strchr(h, '\n');
        cr_assert(re && he, "README: %s", r);
        cr_assert(!strncmp(h, "  ", 2), "--help has fewer commands than the README (%zu)", n);
        cr_assert_eq((size_t)(re - r), (size_t)(he - h - 2), "README %.*s\n--help %.*s",
                     (int)(re - r), r, (int)(he - h), h);
        cr_assert(!strncmp(r, h + 2, (size_t)(re - r)), "README %.*s\n--help %.*s", (int)(re - r),
                  r, (int)(he - h), h);
        r = re + 1;
        h = he + 1;
    }
    cr_assert_gt(n, 10);
    cr_assert(!strncmp(h, "\n", 1), "--help lists more commands than the README: %s", h);
    svc_buf_fini(&out);
    svc_buf_fini(&readme);
}

/* ------------------------------------------------------------ --max-request-bytes */

#define VL D3_SOURCE_DIR "/tests/fixtures/tiny-vl"

/* A request file of one noul question on "x" with n images: each the n_bytes
 * bytes at imgs[k], as PNG data URLs. Returns the file's path (free it). */
static char *image_request_file(unsigned char *const *imgs, const size_t *n_bytes, size_t n) {
    svc_buf_t b;
    svc_buf_init(&b, (size_t)1 << 30);
    cr_assert_eq(svc_buf_adds(&b, "{\"state\": \"x\", \"images\": ["), SVC_OK);
    for (size_t k = 0; k < n; k++) {
        cr_assert_eq(
            svc_buf_adds(&b, k ? ", \"data:image/png;base64," : "\"data:image/png;base64,"),
            SVC_OK);
        b64_add(&b, imgs[k], n_bytes[k]);
        cr_assert_eq(svc_buf_adds(&b, "\""), SVC_OK);
    }
    cr_assert_eq(svc_buf_adds(&b, "], \"questions\": {\"n\": {\"type\": \"noul\", "
                                  "\"instructions\": \"Is it?\"}}}"),
                 SVC_OK);
    char *path = write_temp(b.data, b.len);
    svc_buf_fini(&b);
    return path;
}

/* A w x h RGB PNG of noise: incompressible, so about 3 w h bytes. */
static unsigned char *noise_png(uint32_t w, uint32_t h, uint32_t seed, size_t *len) {
    unsigned char *px = malloc((size_t)w * h * 3);
    cr_assert(px);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        seed = seed * 1103515245u + 12345u;
        px[i] = (unsigned char)(seed >> 16);
    }
    unsigned char *out = test_png(w, h, PNG_FORMAT_RGB, px, len);
    free(px);
    return out;
}

/* `ask` on file with args: its exit status and stdout into out. */
static int ask_file(const char *args, const char *file, svc_buf_t *out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' ask --model '%s' %s '%s' 2>/dev/null", binary(), VL, args,
             file);
    return run_shell(cmd, out);
}

/* Issue 34: the request size limit is the operator's. Raised, an image of
 * 8,000,001 bytes gets SPEC a.10's per-image 400 (by default its body is
 * a 413 first, so that rule could never be reached) and two images of
 * about 5 MB are answered; lowered, the 413 names the new number. */
Test(ops, max_request_bytes_is_the_operators, .timeout = 240) {
    size_t         big_n = 8000001;
    unsigned char *big = calloc(big_n, 1);
    cr_assert(big);
    memcpy(big, "\x89PNG\r\n\x1a\n", 8);
    char     *one = image_request_file(&big, &big_n, 1);
    svc_buf_t out;
    cr_assert_eq(ask_file("", one, &out), 1, "%s", out.data);
    cr_assert(strstr(out.data, "\"code\":\"request_too_large\"") &&
                  strstr(out.data, "exceeds 8388608 bytes"),
              "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(ask_file("--max-request-bytes 24000000", one, &out), 1, "%s", out.data);
    cr_assert(strstr(out.data, "images[0]: each image must be at most 8,000,000 bytes"), "%s",
              out.data);
    svc_buf_fini(&out);

    unsigned char *imgs[2];
    size_t         lens[2];
    imgs[0] = noise_png(1290, 1290, 1, &lens[0]);
    imgs[1] = noise_png(1290, 1290, 2, &lens[1]);
    cr_assert(lens[0] > 4900000 && lens[0] < 8000000, "%zu bytes", lens[0]);
    char *two = image_request_file(imgs, lens, 2);
    cr_assert_eq(ask_file("--max-request-bytes 16000000", two, &out), 0, "%.400s", out.data);
    cr_assert(strstr(out.data, "\"answers\":{\"n\":{\"type\":\"noul\""), "%.400s", out.data);
    svc_buf_fini(&out);

    char small[256];
    snprintf(small, sizeof small, "%s/ops/examples/d3-nano-npu2.json", D3_SOURCE_DIR);
    cr_assert_eq(ask_file("--max-request-bytes 100", small, &out), 1, "%s", out.data);
    cr_assert(strstr(out.data, "the request body exceeds 100 bytes"), "%s", out.data);
    svc_buf_fini(&out);
    cr_assert_eq(ask_file("--max-request-bytes 0", small, &out), 2, "0 is a usage error");
    svc_buf_fini(&out);
    unlink(one);
    unlink(two);
    free(one);
    free(two);
    free(big);
    free(imgs[0]);
    free(imgs[1]);
}

/* ------------------------------------------------------------ devices, --device */

/* `devices --json` on this machine: the CPU section filled, the NPU section
 * with its reason, and the CPU chosen by auto, saying why not the NPU. */
Test(ops, devices_report) {
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' devices --json", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    json_error_t jerr;
    json_t      *j = json_loads(out.data, 0, &jerr);
    cr_assert(j, "not JSON (%s): %s", jerr.text, out.data);
    json_t *cpu = json_object_get(j, "cpu"), *npu = json_object_get(j, "npu");
    cr_assert_geq(json_integer_value(json_object_get(cpu, "cpus")), 1, "%s", out.data);
    cr_assert_geq(json_integer_value(json_object_get(cpu, "threads")), 1, "%s", out.data);
    cr_assert(json_is_array(json_object_get(cpu, "vector")), "%s", out.data);
    cr_assert(json_is_array(json_object_get(cpu, "matrix")), "%s", out.data);
    json_t *cq = json_object_get(cpu, "cgroup_cpu_quota");
    cr_assert(json_is_null(cq) || json_real_value(cq) > 0, "%s", out.data);
    json_t *prof = json_object_get(cpu, "profiles");
    cr_assert(json_string_value(json_object_get(json_object_get(prof, "exact"), "kernels")));
    cr_assert(json_string_value(json_object_get(json_object_get(prof, "exact"), "matmul")));
    cr_assert(json_string_value(json_object_get(json_object_get(prof, "fast"), "matmul")));
    cr_assert(json_is_boolean(json_object_get(npu, "present")), "%s", out.data);
    cr_assert(json_is_false(json_object_get(npu, "backend")), "%s", out.data);
    const char *reason = json_string_value(json_object_get(npu, "reason"));
    cr_assert(reason && *reason, "%s", out.data);
    cr_assert(json_is_array(json_object_get(npu, "nodes")), "%s", out.data);
    cr_assert(json_string_value(json_object_get(json_object_get(npu, "xrt"), "reason")));
    cr_assert(json_string_value(json_object_get(json_object_get(npu, "memlock"), "reason")));
    json_t *dev = json_object_get(j, "device");
    cr_assert_str_eq(json_string_value(json_object_get(dev, "accelerator")), "cpu");
    cr_assert(
        strstr(json_string_value(json_object_get(dev, "reason")), "no XDNA backend in this build"),
        "%s", out.data);
    json_decref(j);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' devices", binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(!strncmp(out.data, "cpu: ", 5), "%s", out.data);
    cr_assert(strstr(out.data, "\n  profile exact: kernels ") && strstr(out.data, "\nnpu: ") &&
                  strstr(out.data, "\n  xrt: ") && strstr(out.data, "\ndevice: auto -> the CPU"),
              "%s", out.data);
    svc_buf_fini(&out);
    /* usage, and the command list */
    snprintf(cmd, sizeof cmd, "'%s' devices --help", binary());
    cr_assert_eq(run_shell(cmd, &out), 0);
    cr_assert(strstr(out.data, "Usage: d3stream devices [--json]"), "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' devices bogus 2>&1", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' devices --bogus 2>/dev/null", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "%s", out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' --help", binary());
    cr_assert_eq(run_shell(cmd, &out), 0);
    cr_assert(strstr(out.data, "\n  devices   "), "%s", out.data);
    svc_buf_fini(&out);
    /* version keeps its short form: the NPU in one line */
    snprintf(cmd, sizeof cmd, "'%s' version", binary());
    cr_assert_eq(run_shell(cmd, &out), 0);
    const char *npu_line = strstr(out.data, "\nnpu: ");
    cr_assert(npu_line && strstr(npu_line, "; not used: no XDNA backend in this build\n"), "%s",
              out.data);
    svc_buf_fini(&out);
}

/* --device npu: exit 3 before anything loads, after the NPU findings,
 * naming what is missing; for every command that takes it. */
Test(ops, device_npu_is_refused) {
    char        cmd[2048];
    svc_buf_t   out;
    const char *runs[] = {
        "ask --device npu --model '" TINY "' /dev/null",
        "bench --device npu --model '" TINY "'",
        "http --device npu --model '" TINY "' --listen 127.0.0.1:0",
        "serve --device npu --model '" TINY "' --brokers 127.0.0.1:1 --group g --input i "
        "--output o",
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 </dev/null", binary(), runs[i]);
        cr_assert_eq(run_shell(cmd, &out), 3, "%s: %s", runs[i], out.data);
        const char *facts = strstr(out.data, "npu: ");
        const char *why = strstr(out.data, ": --device npu: ");
        cr_assert(facts && why && facts < why, "%s: the findings, then why: %s", runs[i], out.data);
        cr_assert(strstr(why, "no XDNA backend in this build"), "%s", out.data);
        cr_assert(strstr(out.data, "\n  xrt: ") && strstr(out.data, "\n  memlock: "), "%s",
                  out.data);
        cr_assert(!strstr(out.data, "golden"), "nothing loaded: %s", out.data);
        svc_buf_fini(&out);
    }
    /* auto (the default) answers on the CPU and says why not the NPU */
    snprintf(cmd, sizeof cmd,
             "'%s' ask --model '%s' '%s/ops/examples/d3-nano-npu2.json' 2>&1 >/dev/null", binary(),
             TINY, D3_SOURCE_DIR);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "msg=device requested=auto accelerator=cpu why=\"the CPU; not "
                               "the NPU: "),
              "%s", out.data);
    svc_buf_fini(&out);
}

/* The report over a device tree (D3_TEST_DEVROOT, the tests' stand-in for
 * /): an XDNA2 node the binary itself reads -- sysfs names amdxdna and the
 * firmware; the node (a plain file) answers no ioctl -- is present, and
 * --device npu still exits 3, naming the node and the missing backend. */
Test(ops, devices_over_a_device_tree) {
    char root[64] = "/tmp/d3ops-XXXXXX", cmd[4096];
    cr_assert(mkdtemp(root));
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkdir -p dev/accel sys/class/accel/accel0/device "
             "sys/bus/pci/drivers/amdxdna && : > dev/accel/accel0 && "
             "cd sys/class/accel/accel0/device && echo 0x1022 > vendor && echo 0x17f0 > device "
             "&& echo 0x10 > revision && echo 1.1.2.65 > fw_version && "
             "ln -s ../../../../bus/pci/drivers/amdxdna driver",
             root);
    cr_assert_eq(system(cmd), 0);
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "D3_TEST_DEVROOT='%s' '%s' devices --json", root, binary());
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    json_t *j = json_loads(out.data, 0, NULL), *npu = json_object_get(j, "npu");
    json_t *node = json_array_get(json_object_get(npu, "nodes"), 0);
    cr_assert(json_is_true(json_object_get(npu, "present")), "%s", out.data);
    cr_assert_str_eq(json_string_value(json_object_get(node, "path")), "/dev/accel/accel0");
    cr_assert_str_eq(json_string_value(json_object_get(node, "driver")), "amdxdna");
    cr_assert_str_eq(json_string_value(json_object_get(node, "generation")), "XDNA2");
    cr_assert_str_eq(json_string_value(json_object_get(node, "chip")), "Strix (npu4)");
    cr_assert_str_eq(json_string_value(json_object_get(node, "firmware")), "1.1.2.65");
    cr_assert_str_eq(json_string_value(json_object_get(node, "firmware_from")), "sysfs");
    cr_assert(json_is_true(json_object_get(node, "ready")), "%s", out.data);
    json_decref(j);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "D3_TEST_DEVROOT='%s' '%s' ask --device npu --model '%s' 2>&1", root,
             binary(), TINY);
    cr_assert_eq(run_shell(cmd, &out), 3, "%s", out.data);
    cr_assert(strstr(out.data, "--device npu: XDNA NPU /dev/accel/accel0 ") &&
                  strstr(out.data, "no XDNA backend in this build"),
              "%s", out.data);
    svc_buf_fini(&out);
    remove_tree(root);
}
