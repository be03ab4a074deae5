/*
 * ops_prompt.c -- `d3stream prompt`: a request -> every question's exact
 * prompt, token ids and length, as the engine will see them.
 */
#include "ops_int.h"

#include "schemas.h"

#include <getopt.h>

static const char PROMPT_HELP[] =
    "Usage: d3stream prompt --model DIR [FILE]\n"
    "\n"
    "Validates the System One request in FILE (or stdin) and prints, as one line\n"
    "of JSON, each question's exact prompt bytes, token ids and length:\n"
    "  {\"questions\":{\"<id>\":{\"prompt\":\"...\",\"ids\":[...],\"n_tokens\":N}}}\n"
    "in request order. n_tokens counts each image as the tokens of its resized\n"
    "size (the ids keep one <|image_pad|> per image). A question longer than the\n"
    "package's limit also gets \"error\":\"max_length_exceeded\" and the contract's\n"
    "message; an invalid question is {\"type\":...,\"error\":...,\"message\":...};\n"
    "a multi-state request adds \"states\":{\"<name>\":{\"questions\":{...}}}; a\n"
    "whole-request error prints {\"error\":{\"code\":...,\"message\":...}}.\n"
    "\n"
    "  --model DIR  a decision3 package; its weights are not read:\n"
    "               decision_config.json, tokenizer.json, tokenizer_config.json,\n"
    "               MODEL_MANIFEST.json (the model's name), preprocessor_config.json\n"
    "               (an image's tokens) and config.json (when decision_config.json\n"
    "               has no max_length). Whether the package has a vision tower is\n"
    "               not checked: images are rendered.\n"
    "\n"
    "Exit status: 0 prompts printed, 1 a whole-request error printed, 2 usage,\n"
    "3 unreadable input or package.\n";

static svc_err_t add_prompt(svc_buf_t *out, const eng_package_t *pkg, const eng_prompt_t *pr) {
    svc_err_t err = svc_buf_adds(out, "{\"prompt\":");
    if (!err)
        err = sch_json_write_string(out, pr->text.data, pr->text.len);
    if (!err)
        err = svc_buf_adds(out, ",\"ids\":");
    if (!err)
        err = ops_add_ids(out, &pr->ids);
    if (!err)
        err = svc_buf_addf(out, ",\"n_tokens\":%zu", pr->n_tokens);
    size_t limit = eng_package_max_length(pkg);
    if (!err && pr->n_tokens > limit)
        err = svc_buf_addf(
            out, ",\"error\":\"max_length_exceeded\",\"message\":\"" SCH_MSG_MAX_LENGTH "\"",
            pr->n_tokens, limit);
    return err ? err : svc_buf_addc(out, '}');
}

/* "questions":{...} of one part. */
static svc_err_t add_part(svc_buf_t *out, const eng_package_t *pkg, const sch_part_t *part,
                          eng_prompt_t *pr, char *errstr, size_t errstr_size) {
    svc_err_t err = svc_buf_adds(out, "\"questions\":{");
    for (size_t i = 0; i < part->n_questions && !err; i++) {
        const sch_question_t *q = &part->questions[i];
        if (i)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = sch_json_write_string(out, q->id, q->id_len);
        if (!err)
            err = svc_buf_addc(out, ':');
        if (err)
            break;
        if (q->error_code)
            err = sch_question_error_encode(q, out);
        else {
            err = eng_prompt_render(pkg, part, q, pr, errstr, errstr_size);
            if (!err)
                err = add_prompt(out, pkg, pr);
        }
    }
    return err ? err : svc_buf_addc(out, '}');
}

static svc_err_t add_request(svc_buf_t *out, const eng_package_t *pkg, const sch_request_t *req,
                             char *errstr, size_t errstr_size) {
    eng_prompt_t pr;
    eng_prompt_init(&pr);
    svc_err_t err = svc_buf_addc(out, '{');
    if (!err)
        err = add_part(out, pkg, sch_request_part(req, 0), &pr, errstr, errstr_size);
    size_t n_parts = sch_request_n_parts(req);
    if (!err && n_parts > 1)
        err = svc_buf_adds(out, ",\"states\":{");
    for (size_t p = 1; p < n_parts && !err; p++) {
        const sch_part_t *part = sch_request_part(req, p);
        if (p > 1)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = sch_json_write_string(out, part->name, part->name_len);
        if (!err)
            err = svc_buf_adds(out, ":{");
        if (!err)
            err = add_part(out, pkg, part, &pr, errstr, errstr_size);
        if (!err)
            err = svc_buf_addc(out, '}');
    }
    if (!err && n_parts > 1)
        err = svc_buf_addc(out, '}');
    eng_prompt_fini(&pr);
    return err ? err : svc_buf_addc(out, '}');
}

int ops_prompt_body(const eng_package_t *pkg, const char *dir, const char *body, size_t len,
                    svc_buf_t *out, char *errstr, size_t errstr_size) {
    sch_request_t *req = NULL;
    int rc = ops_decode_request(pkg, dir, OPS_DECODE_VISION, body, len, &req, out, NULL, errstr,
                                errstr_size);
    if (rc == OPS_EXIT_OK && add_request(out, pkg, req, errstr, errstr_size))
        rc = OPS_EXIT_FAILURE;
    sch_request_free(req);
    return rc;
}

static int prompt_run(const eng_package_t *pkg, const char *dir, const svc_buf_t *body) {
    svc_buf_t out;
    svc_buf_init(&out, SIZE_MAX / 2);
    char errstr[512] = "";
    int  rc = ops_prompt_body(pkg, dir, body->data, body->len, &out, errstr, sizeof errstr);
    if (rc == OPS_EXIT_FAILURE)
        ops_fail("prompt", "%s", errstr[0] ? errstr : "cannot write the result");
    else if (!ops_emit(&out))
        rc = OPS_EXIT_FAILURE;
    svc_buf_fini(&out);
    return rc;
}

int ops_cmd_prompt(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL;
    int         c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1)
        if ((rc = ops_opt_common(c, PROMPT_HELP, &dir)) >= 0)
            return rc;
    if ((rc = ops_opt_end(argc, PROMPT_HELP, dir, 1)) >= 0)
        return rc;
    char           errstr[1024];
    eng_package_t *pkg = NULL;
    if (eng_package_open(dir, &pkg, errstr, sizeof errstr)) {
        ops_fail("prompt", "%s", errstr);
        return OPS_EXIT_FAILURE;
    }
    svc_buf_t body;
    rc = OPS_EXIT_FAILURE;
    if (ops_read_request("prompt", optind < argc ? argv[optind] : NULL, &body))
        rc = prompt_run(pkg, dir, &body);
    svc_buf_fini(&body);
    eng_package_free(pkg);
    return rc;
}
