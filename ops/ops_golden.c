/*
 * ops_golden.c -- the golden check (eng_golden.c) as ask, http and serve
 * run it after the load: the tests' hook, the log lines, the verdict that
 * the model card and /health show.
 */
#include "ops_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *ops_golden_name(ops_golden_state_t s) {
    static const char *const names[] = {"pending", "passed", "failed", "skipped"};
    return (size_t)s < sizeof names / sizeof names[0] ? names[s] : "failed";
}

static void golden_log_passed(const eng_golden_t *r) {
    ops_log_t l;
    if (!ops_log_begin(&l, OPS_LOG_INFO, "golden check passed"))
        return;
    ops_log_strf(&l, "seconds", "%.2f", r->seconds);
    ops_log_strf(&l, "answer_seconds", "%.2f", r->seconds_answer);
    ops_log_strf(&l, "reference_seconds", "%.2f", r->seconds_ref);
    ops_log_strf(&l, "exact_max_dp", "%.3g", r->max_dp);
    ops_log_strf(&l, "exact_worst_layer", "%.3g", r->layer_err);
    if (!isnan(r->layer_err_fast)) {
        ops_log_strf(&l, "fast_max_dp", "%.3g", r->max_dp_fast);
        ops_log_strf(&l, "fast_worst_layer", "%.3g", r->layer_err_fast);
    }
    if (r->vision) {
        ops_log_strf(&l, "vision_exact_worst_block", "%.3g", r->vis_err);
        if (!isnan(r->vis_err_fast))
            ops_log_strf(&l, "vision_fast_worst_block", "%.3g", r->vis_err_fast);
    }
    if (r->recorded)
        ops_log_strf(&l, "recorded_max_dp", "%.3g", r->max_dp_recorded);
    else
        ops_log_str(&l, "recorded", "none (no golden.json in the package)");
    ops_log_str(&l, "kernels", r->kernels);
    ops_log_end(&l);
}

bool ops_golden_run(const char *cmd, const ops_ask_t *a, eng_model_t *m, const eng_load_opts_t *lo,
                    bool skip, ops_golden_t *g) {
    const char *hook = getenv("D3_TEST_CORRUPT_PACK");
    memset(g, 0, sizeof *g);
    if (hook && (strcmp(hook, "1") == 0 || strcmp(hook, "vision") == 0)) {
        ops_logf(OPS_LOG_WARN, "D3_TEST_CORRUPT_PACK=%s: a pack of this model is damaged (test)",
                 hook);
        eng_model_test_corrupt(m, strcmp(hook, "vision") == 0);
    }
    if (skip) {
        g->state = OPS_GOLDEN_SKIPPED;
        ops_logf(OPS_LOG_WARN, "--no-golden: the golden check is skipped; nothing has checked "
                               "that this CPU's kernels answer as the package should");
        return true;
    }
    char      errstr[1024] = "";
    svc_err_t err = eng_golden_check(a->pkg, m, a->dir, lo, &g->r, errstr, sizeof errstr);
    if (err) {
        snprintf(g->r.reason, sizeof g->r.reason, "the golden check could not run: %s", errstr);
        g->state = OPS_GOLDEN_FAILED;
    } else
        g->state = g->r.passed ? OPS_GOLDEN_PASSED : OPS_GOLDEN_FAILED;
    if (g->state == OPS_GOLDEN_FAILED) {
        ops_fail(cmd, "golden check failed: %s", g->r.reason);
        return false;
    }
    golden_log_passed(&g->r);
    return true;
}
