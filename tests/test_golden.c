/*
 * test_golden.c -- the golden check before serving (eng_golden.c; issue
 * 35 item 2): it passes on the fixtures and on packages make-package
 * writes (safetensors and q4nx, with recorded answers), fails on a pack
 * damaged after the load and on recorded answers that are not the
 * package's, and the commands act on its verdict (ask and serve exit 3,
 * http keeps /health at 503 with the reason).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "npu.h"
#include "test_cmd.h"
#include "test_util.h"

#define TINY_UPSTREAM D3_SOURCE_DIR "/tests/fixtures/tiny-upstream"
#define TRAINED_TINY  D3_SOURCE_DIR "/tests/fixtures/trained-tiny"

static eng_golden_t check(const loaded_t *l) {
    eng_golden_t g;
    char         errstr[1024] = "";
    cr_assert_eq(eng_golden_check(l->pkg, l->model, l->dir, NULL, &g, errstr, sizeof errstr),
                 SVC_OK, "%s: %s", l->dir, errstr);
    return g;
}

static void expect_passed(const char *dir, bool recorded) {
    loaded_t l;
    load(dir, &l);
    eng_golden_t g = check(&l);
    cr_expect(g.passed, "%s: %s", dir, g.reason);
    cr_expect(g.layer_err <= ENG_GOLDEN_LAYER_EXACT && g.layer_err > 0, "%s: layer %g", dir,
              g.layer_err);
    cr_expect(g.max_dp <= ENG_GOLDEN_TOL_EXACT, "%s: max dp %g", dir, g.max_dp);
    cr_expect_eq(g.recorded, recorded, "%s: recorded", dir);
    if (recorded)
        cr_expect(g.max_dp_recorded == 0.0, "%s: recorded here, so the same bits: %g", dir,
                  g.max_dp_recorded);
    if (npu_fast_usable())
        cr_expect(g.layer_err_fast <= ENG_GOLDEN_LAYER_FAST && g.layer_err_fast > g.layer_err,
                  "%s: fast layer %g", dir, g.layer_err_fast);
    unload(&l);
}

/* A package make-package writes into a temp dir, golden.json included. */
static char *make(eng_make_format_t format) {
    char  tmpl[] = "/tmp/d3-golden-XXXXXX";
    char *dir = mkdtemp(tmpl);
    cr_assert(dir);
    dir = strdup(dir);
    char            errstr[1024] = "";
    eng_make_opts_t o = {.size = ENG_MAKE_TINY, .format = format, .seed = 5, .out_dir = dir};
    cr_assert_eq(eng_package_make(&o, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    loaded_t l;
    load(dir, &l);
    cr_assert_eq(eng_golden_record(l.pkg, l.model, dir, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    unload(&l);
    return dir;
}

Test(golden, passes_on_the_fixtures) {
    expect_passed(TINY_UPSTREAM, false);
    expect_passed(TRAINED_TINY, false);
}

Test(golden, passes_with_recorded_answers) {
    for (int f = 0; f < 2; f++) {
        char *dir = make(f ? ENG_MAKE_Q4NX : ENG_MAKE_SAFETENSORS);
        expect_passed(dir, true);
        rm_tree(dir);
        free(dir);
    }
}

/* The test hook damages the middle layer's MLP: the per-layer measure
 * names that layer, and nothing else passes. */
Test(golden, refuses_a_damaged_pack) {
    loaded_t l;
    load(TINY_UPSTREAM, &l);
    eng_model_test_corrupt(l.model, false);
    eng_golden_t     g = check(&l);
    eng_model_info_t mi;
    eng_model_get_info(l.model, &mi);
    cr_expect(!g.passed);
    cr_expect_eq(g.layer_at, mi.n_layers / 2, "the damaged layer: %zu", g.layer_at);
    cr_expect(strstr(g.reason, "profile exact: layer ") != NULL, "%s", g.reason);
    cr_expect(g.layer_err > ENG_GOLDEN_LAYER_EXACT, "%g", g.layer_err);
    cr_expect(strstr(g.reason, g.kernels) != NULL, "the reason names the kernels: %s", g.reason);
    unload(&l);
}

/* The vision tower: its blocks are checked too (make-package's tiny has
 * two), and a damaged one is named. */
Test(golden, checks_the_vision_blocks) {
    char    *dir = make(ENG_MAKE_Q4NX);
    loaded_t l;
    load(dir, &l);
    eng_golden_t g = check(&l);
    cr_expect(g.passed && g.vision, "%s", g.reason);
    cr_expect(g.vis_err > 0 && g.vis_err <= ENG_GOLDEN_LAYER_EXACT, "%g", g.vis_err);
    if (npu_fast_usable())
        cr_expect(g.vis_err_fast > g.vis_err && g.vis_err_fast <= ENG_GOLDEN_LAYER_FAST, "%g",
                  g.vis_err_fast);
    eng_model_test_corrupt(l.model, true);
    g = check(&l);
    cr_expect(!g.passed);
    cr_expect(strstr(g.reason, "profile exact: vision block 1 differs") != NULL, "%s", g.reason);
    unload(&l);
    rm_tree(dir);
    free(dir);
}

/* golden.json that is not this package's: the recorded bound refuses it;
 * one for another golden request is a format error. */
Test(golden, holds_the_recorded_answers) {
    char *dir = make(ENG_MAKE_SAFETENSORS);
    char  path[512], errstr[1024] = "";
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char cmd[1100];
    /* every recorded probability moved by 0.05 */
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json,sys; p='%s'; d=json.load(open(p)); "
             "[a.__setitem__(i, a[i]+0.05) for a in d['answers'].values() for i in range(len(a))]; "
             "json.dump(d, open(p,'w'))\"",
             path);
    svc_buf_t out;
    cr_assert_eq(run_shell(cmd, &out), 0);
    svc_buf_fini(&out);
    loaded_t l;
    load(dir, &l);
    eng_golden_t g = check(&l);
    cr_expect(!g.passed);
    cr_expect(strstr(g.reason, "recorded one (golden.json) by 0.05") != NULL, "%s", g.reason);
    /* another request in the file */
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"request\": \"{}\", \"answers\": {}}", f);
    fclose(f);
    cr_expect_eq(eng_golden_check(l.pkg, l.model, dir, NULL, &g, errstr, sizeof errstr),
                 SVC_ERR_FORMAT);
    cr_expect(strstr(errstr, "not this version's golden request") != NULL, "%s", errstr);
    unload(&l);
    rm_tree(dir);
    free(dir);
}

/* The commands: ask and serve exit 3 before answering or joining a group;
 * with --no-golden they go on. */
Test(golden, commands_refuse_a_damaged_pack) {
    char      cmd[2048];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd,
             "D3_TEST_CORRUPT_PACK=1 %s ask --model %s %s/ops/examples/ticket-triage.json "
             "2>&1",
             binary(), TINY_UPSTREAM, D3_SOURCE_DIR);
    cr_expect_eq(run_shell(cmd, &out), 3, "%s", out.data);
    cr_expect(strstr(out.data, "golden check failed: profile exact: layer") != NULL, "%s",
              out.data);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd,
             "D3_TEST_CORRUPT_PACK=1 %s ask --no-golden --model %s "
             "%s/ops/examples/ticket-triage.json 2>/dev/null",
             binary(), TINY_UPSTREAM, D3_SOURCE_DIR);
    cr_expect_eq(run_shell(cmd, &out), 0, "%s", out.data);
    svc_buf_fini(&out);
    /* serve: no broker at port 9, never reached: the check comes first */
    snprintf(cmd, sizeof cmd,
             "D3_TEST_CORRUPT_PACK=1 timeout 60 %s serve --model %s --brokers 127.0.0.1:9 "
             "--group g --input in --output out 2>&1",
             binary(), TINY_UPSTREAM);
    cr_expect_eq(run_shell(cmd, &out), 3, "%s", out.data);
    cr_expect(strstr(out.data, "golden check failed") != NULL, "%s", out.data);
    svc_buf_fini(&out);
}
