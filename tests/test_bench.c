/*
 * test_bench.c -- `d3stream bench` run as a user runs it, on a tiny
 * synthetic package: every expected row once, exact token counts, positive
 * speeds and RSS, and oversize rows reported as skipped (never truncated).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "svc.h"
#include "test_cmd.h"

/* A tiny package in a fresh temporary directory (path in dir). */
static void make_tiny(char dir[64]) {
    snprintf(dir, 64, "/tmp/d3bench.XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp failed");
    char      cmd[512];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' make-package --size tiny --seed 1 --out '%s/pkg' --force 2>&1",
             binary(), dir);
    int rc = run_shell(cmd, &out);
    cr_assert_eq(rc, 0, "make-package failed: %s", out.data);
    svc_buf_fini(&out);
}

static void remove_tiny(const char *dir) {
    char      cmd[256];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    run_shell(cmd, &out);
    svc_buf_fini(&out);
}

typedef struct want {
    const char *row;
    size_t      tokens; /* 0: skipped */
    const char *skip_because;
    bool        shared; /* the scheduler computed fewer than tokens */
    size_t      images; /* image rows: the images (tokens: at least); each encoded once */
} want_t;

/* Runs bench with args on a tiny package; checks the rows against want. */
static void check_bench(const char *args, const want_t *want, size_t n_want) {
    char dir[64];
    make_tiny(dir);
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' bench --model '%s/pkg' %s --json", binary(), dir, args);
    int rc = run_shell(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit %d", cmd, rc);
    size_t n_rows = 0;
    bool   machine = false;
    for (char *line = out.data, *end; line && *line; line = end ? end + 1 : NULL) {
        end = strchr(line, '\n');
        if (end)
            *end = '\0';
        json_error_t e;
        json_t      *o = json_loads(line, 0, &e);
        cr_assert(json_is_object(o), "not a JSON object: %s (%s)", line, e.text);
        const char *row = json_string_value(json_object_get(o, "row"));
        if (!row) {
            cr_assert(!machine && n_rows == 0, "the machine line comes first, once: %s", line);
            cr_assert(json_string_value(json_object_get(o, "machine")), "%s", line);
            cr_assert(json_string_value(json_object_get(o, "kernels")), "%s", line);
            cr_assert_eq(json_integer_value(json_object_get(o, "max_length")), 8192, "%s", line);
            machine = true;
            json_decref(o);
            continue;
        }
        cr_assert(n_rows < n_want, "unexpected row: %s", line);
        const want_t *w = &want[n_rows++];
        cr_assert_str_eq(row, w->row);
        const char *skipped = json_string_value(json_object_get(o, "skipped"));
        if (w->tokens == 0) {
            cr_assert(skipped && strstr(skipped, w->skip_because), "%s: want skipped (%s): %s",
                      w->row, w->skip_because, line);
            cr_assert_null(json_object_get(o, "tokens"), "a skipped row has no tokens: %s", line);
        } else {
            cr_assert_null(skipped, "%s", line);
            json_int_t tokens = json_integer_value(json_object_get(o, "tokens"));
            if (w->images) {
                cr_assert_geq(tokens, (json_int_t)w->tokens, "%s", line);
                cr_assert_eq(json_integer_value(json_object_get(o, "images")),
                             (json_int_t)w->images, "%s", line);
                cr_assert_eq(json_integer_value(json_object_get(o, "image_encodings")),
                             (json_int_t)w->images, "one encoding per image: %s", line);
            } else if (w->shared) {
                cr_assert_eq(tokens, (json_int_t)w->tokens, "%s", line);
                cr_assert_eq(json_integer_value(json_object_get(o, "sched_tokens")), tokens, "%s",
                             line);
                cr_assert_lt(json_integer_value(json_object_get(o, "sched_tokens_computed")),
                             tokens / 4, "the state runs once: %s", line);
            } else
                cr_assert_eq(tokens, (json_int_t)w->tokens, "%s", line);
            cr_assert_gt(json_real_value(json_object_get(o, "median_s")), 0, "%s", line);
            cr_assert_gt(json_real_value(json_object_get(o, "tokens_per_s")), 0, "%s", line);
            cr_assert_gt(json_real_value(json_object_get(o, "peak_rss_mib")), 0, "%s", line);
        }
        json_decref(o);
    }
    cr_assert(machine, "no machine line");
    cr_assert_eq(n_rows, n_want, "rows: %zu, want %zu", n_rows, n_want);
    svc_buf_fini(&out);
    remove_tiny(dir);
}

Test(bench, quick_rows_exact_and_max_tokens_skip, .timeout = 60) {
    static const want_t want[] = {
        {"1 x 128", 128, NULL, false, 0},
        {"1 x 330", 330, NULL, false, 0},
        {"1 x 1,024", 0, "over --max-tokens 1000", false, 0},
        {"4 x 330", 4 * 330, NULL, false, 0},
        {"16 x 330", 16 * 330, NULL, false, 0},
    };
    check_bench("--quick --max-tokens 1000", want, sizeof want / sizeof want[0]);
}

/* Every row, one run: the tiny package's max length (8,192, its
 * max_position_embeddings) skips the three longest. */
Test(bench, full_rows_skip_over_max_length, .timeout = 120) {
    static const want_t want[] = {
        {"1 x 128", 128, NULL, false, 0},
        {"1 x 330", 330, NULL, false, 0},
        {"1 x 1,024", 1024, NULL, false, 0},
        {"1 x 4,096", 4096, NULL, false, 0},
        {"1 x 15,854", 0, "over the package's max length 8192", false, 0},
        {"1 x 31,491", 0, "over the package's max length 8192", false, 0},
        {"1 x 32,768", 0, "over the package's max length 8192", false, 0},
        {"4 x 330", 4 * 330, NULL, false, 0},
        {"16 x 330", 16 * 330, NULL, false, 0},
        /* 16 prompts of 4,000 tokens each, "point 10" as long as "point 09" */
        {"16 x 4,000 shared", 16 * 4000, NULL, true, 0},
        /* a 1024 x 768 image is 768 tokens; 2000 x 1500 is resized to
         * 1088 x 1472, 1,564 tokens; the 8 questions share one encoding */
        {"1 + 1024x768 image", 768, NULL, false, 1},
        {"1 + two images", 2 * 768, NULL, false, 2},
        {"1 + 2000x1500 image", 1564, NULL, false, 1},
        {"8 + one image", 8 * 768, NULL, false, 1},
        {"cache 1 x 330", 330, NULL, false, 0},
        /* usage counts the repeats as computed ones */
        {"repeats 16 x 330", 16 * 330, NULL, false, 0},
    };
    check_bench("--runs 1", want, sizeof want / sizeof want[0]);
}

/* --row runs only the rows whose name contains its text. */
Test(bench, row_selects, .timeout = 60) {
    static const want_t want[] = {
        {"1 x 330", 330, NULL, false, 0},
        {"4 x 330", 4 * 330, NULL, false, 0},
        {"16 x 330", 16 * 330, NULL, false, 0},
        {"cache 1 x 330", 330, NULL, false, 0},
        {"repeats 16 x 330", 16 * 330, NULL, false, 0},
    };
    check_bench("--runs 1 --row 'x 330'", want, sizeof want / sizeof want[0]);
}

/* The answer-reuse rows: the repeat answered from the cache, the mix's
 * repeats reused (hits or joins), and both timed. */
Test(bench, reuse_rows, .timeout = 60) {
    char dir[64];
    make_tiny(dir);
    char      cmd[1024];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' bench --model '%s/pkg' --runs 1 --row 'cache' --json", binary(),
             dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    const char *line = strstr(out.data, "{\"row\"");
    cr_assert(line, "%s", out.data);
    json_t *o = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert(o, "%s", line);
    cr_assert_gt(json_real_value(json_object_get(o, "first_s")), 0);
    cr_assert_gt(json_real_value(json_object_get(o, "repeat_ms")), 0);
    json_decref(o);
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' bench --model '%s/pkg' --runs 1 --row 'repeats' --json",
             binary(), dir);
    cr_assert_eq(run_shell(cmd, &out), 0, "%s", out.data);
    line = strstr(out.data, "{\"row\"");
    cr_assert(line, "%s", out.data);
    o = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert(o, "%s", line);
    cr_assert_eq(json_integer_value(json_object_get(o, "reused")), 8, "%s", line);
    cr_assert_gt(json_real_value(json_object_get(o, "cache_off_s")), 0);
    cr_assert_gt(json_real_value(json_object_get(o, "answers_per_s")), 0);
    json_decref(o);
    svc_buf_fini(&out);
    remove_tiny(dir);
}

Test(bench, help_and_usage) {
    char      cmd[512];
    svc_buf_t out;
    snprintf(cmd, sizeof cmd, "'%s' bench --help", binary());
    cr_assert_eq(run_shell(cmd, &out), 0);
    cr_assert(strstr(out.data, "--max-tokens") && strstr(out.data, "--quick") &&
              strstr(out.data, "ru_maxrss"));
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' bench 2>/dev/null", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "no --model: usage");
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' bench --model /nonexistent --runs 0 2>/dev/null", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "--runs 0: usage");
    svc_buf_fini(&out);
    snprintf(cmd, sizeof cmd, "'%s' bench --model /nonexistent --row nothing 2>&1", binary());
    cr_assert_eq(run_shell(cmd, &out), 2, "--row matching no row: usage");
    cr_assert(strstr(out.data, "names no row"), "%s", out.data);
    svc_buf_fini(&out);
}
