/*
 * ops_ask.c -- `d3stream ask`: one request -> the exact response body the
 * HTTP shim sends for it, computed on this machine's CPU with the package's
 * text tower. Also the package checks that `ask` and `inspect` share.
 */
#include "ops_int.h"

#include "eng_manifest_int.h"
#include "schemas.h"

#include <getopt.h>
#include <jansson.h>

static const char ASK_HELP[] =
    "Usage: d3stream ask --model DIR [--device auto|cpu|npu] [--no-verify] [--no-golden]\n"
    "                    [--profile P] [--q4nx-layout S] [--max-request-bytes N]\n"
    "                    [--model-alias N]... [--no-default-alias] [FILE]\n"
    "\n"
    "Answers the System One request in FILE (or stdin) with the package in DIR and\n"
    "prints, as one line, the exact response body the HTTP shim sends: the 200 body\n"
    "{\"model\":...,\"answers\":{...},\"usage\":{...}} (+ \"meta\" when the request asks\n"
    "for it, + \"states\"), or a whole-request error {\"error\":{\"code\":...,\"message\":...}}.\n"
    "Questions run one by one on the engine's kernels (as serve's, without the\n"
    "scheduler); a question longer than the package's limit is answered\n"
    "max_length_exceeded, never truncated. Each distinct image is encoded once.\n"
    "Images are answered when the package has a vision tower (vision tensors,\n"
    "vision_config and preprocessor_config.json); otherwise they get the\n"
    "contract's 400. Videos are refused (no package here reads them).\n"
    "\n"
    "  --model DIR    a decision3 package: upstream (model.safetensors, or\n"
    "                 model.safetensors.index.json and its shards) or\n"
    "                 D3-Nano-NPU2's (model.q4nx dequantised at load, and\n"
    "                 vision_weight.q4nx when config.json names it)\n" OPS_DEVICE_HELP
    "  --no-verify    skip the manifest check (a warning is printed). By default\n"
    "                 the files are checked against MODEL_MANIFEST.json (SPEC e.3,\n"
    "                 e.4), else MANIFEST.sha256, before anything is loaded, and\n"
    "                 the loaded parameter counts against MODEL_MANIFEST.json\n"
    "                 parameters after; a package with neither is refused\n"
    "  --no-golden    skip the golden check (a warning is printed). By default the\n"
    "                 golden request (SPEC f.1) is answered after the load on the\n"
    "                 kernels that serve and on an fp32 reference that reads the\n"
    "                 weights again; a difference past the tests' tolerances\n"
    "                 refuses the package (docs/operations.md, \"Golden check\")\n"
    "  --model-alias N  another name a request's model may give (repeatable;\n"
    "                 jev-latest, the official SDK's default, is one unless\n"
    "                 --no-default-alias)\n" OPS_PROFILE_HELP OPS_Q4NX_LAYOUT_HELP
        OPS_MAX_REQUEST_HELP "\n"
    "chat_template.jinja: d3stream renders the d3 prompt itself and never executes\n"
    "the template, so a template whose SHA-256 is not one SPEC e.5 pins is used with\n"
    "a warning on stderr, not refused (test packages cannot carry the real bytes).\n"
    "\n"
    "Exit status: 0 answered, 1 a whole-request error printed, 2 usage, 3 the\n"
    "package failed its manifest or golden check or could not be loaded, the\n"
    "input is unreadable, or --device npu (no XDNA backend in this build).\n";

/* ---------------------------------------------------------------- checks */

svc_err_t ops_manifest_verify(const char *dir, const char **which, eng_mf_verdict_t *v,
                              char *errstr, size_t errstr_size) {
    *which = NULL;
    if (ops_is_file(dir, OPS_MF_JSON)) {
        *which = OPS_MF_JSON;
        return eng_manifest_verify_model(dir, v, errstr, errstr_size);
    }
    if (ops_is_file(dir, OPS_MF_SUM)) {
        *which = OPS_MF_SUM;
        return eng_manifest_verify_sha256sum(dir, v, errstr, errstr_size);
    }
    svc_errf(errstr, errstr_size, "no manifest: \"%s\" has neither " OPS_MF_JSON " nor " OPS_MF_SUM,
             dir);
    return SVC_ERR_INVALID;
}

/* identity.model_sha256 as MODEL_MANIFEST.json lists it (unchecked), or "". */
static void listed_identity(const char *dir, char sha[ENG_SHA256_HEX + 1]) {
    char path[4096];
    sha[0] = '\0';
    if (snprintf(path, sizeof path, "%s/" OPS_MF_JSON, dir) >= (int)sizeof path)
        return;
    json_t     *mf = json_load_file(path, 0, NULL);
    const char *s =
        json_string_value(json_object_get(json_object_get(mf, "identity"), "model_sha256"));
    if (s && strlen(s) == ENG_SHA256_HEX)
        memcpy(sha, s, ENG_SHA256_HEX + 1);
    json_decref(mf);
}

/* The manifest check before loading; sha gets the package identity for
 * meta.model_sha256 ("" when unknown). Messages name cmd, the command the
 * user ran. Returns OPS_EXIT_OK or the exit status. */
static int ask_verify(const char *cmd, const char *dir, bool no_verify,
                      char sha[ENG_SHA256_HEX + 1]) {
    sha[0] = '\0';
    if (no_verify) {
        fprintf(stderr,
                "d3stream %s: warning: --no-verify: the files of \"%s\" are not "
                "checked against its manifest\n",
                cmd, dir);
        listed_identity(dir, sha);
        return OPS_EXIT_OK;
    }
    eng_mf_verdict_t v;
    const char      *which;
    char             errstr[1024] = "";
    eng_mf_verdict_init(&v);
    svc_err_t err = ops_manifest_verify(dir, &which, &v, errstr, sizeof errstr);
    if (err)
        ops_fail(cmd, "%s%s", v.message[0] ? v.message : errstr,
                 which ? "" : " (--no-verify to use it anyway)");
    else if (strcmp(which, OPS_MF_JSON) == 0)
        memcpy(sha, v.model_sha256, ENG_SHA256_HEX + 1);
    else if (eng_manifest_identity(dir, &v, sha, errstr, sizeof errstr))
        sha[0] = '\0'; /* meta then says null; the files themselves verified */
    eng_mf_verdict_fini(&v);
    return err ? OPS_EXIT_FAILURE : OPS_EXIT_OK;
}

/* SPEC e.5 makes an unpinned template a refusal upstream. d3stream renders
 * the d3 prompt itself and never executes the template, and synthetic
 * packages (tests, make-package) cannot carry the real template bytes, so
 * here it is a warning: the prompt does not depend on it. */
void ops_chat_template_warn(const char *cmd, const char *dir) {
    eng_chat_template_t verdict;
    char                sha[ENG_SHA256_HEX + 1];
    char                errstr[512];
    if (eng_chat_template_check(dir, &verdict, sha, errstr, sizeof errstr))
        fprintf(stderr, "d3stream %s: warning: %s\n", cmd, errstr);
    else if (verdict == ENG_CHAT_TEMPLATE_UNPINNED)
        fprintf(stderr,
                "d3stream %s: warning: chat_template.jinja (sha256 %.12s) is not a chat template "
                "the decision3 family renders (SPEC e.5); d3stream never executes it and "
                "renders the d3 prompt itself\n",
                cmd, sha);
    else if (verdict == ENG_CHAT_TEMPLATE_MISSING)
        fprintf(stderr, "d3stream %s: warning: the package has no chat_template.jinja\n", cmd);
}

/* ---------------------------------------------------------------- answer */

int ops_ask_encode(const ops_ask_t *a, const sch_request_t *req, const eng_answers_t *ans,
                   svc_buf_t *out, int *status, char *errstr, size_t errstr_size) {
    svc_buf_t device;
    svc_buf_init(&device, 8192);
    const eng_answer_stats_t *st = eng_answers_stats(ans);
    sch_meta_t                meta = {
                       .model_id = eng_package_model_id(a->pkg),
                       .revision = NULL, /* a local directory has no Hub revision */
                       .model_sha256 = a->model_sha256 && a->model_sha256[0] ? a->model_sha256 : NULL,
                       .profile = eng_profile_name(eng_request_profile(req)),
                       .numerics = eng_profile_numerics(eng_request_profile(req)),
                       .engine = "d3stream",
                       .accelerator = ops_device_accelerator(),
                       .queue_ms = st->queue_ms, /* 0 without the scheduler */
                       .compute_ms = st->tokenize_ms + st->forward_ms,
    };
    sch_error_t e;
    sch_error_init(&e);
    int       rc = OPS_EXIT_OK;
    svc_err_t err = ops_device_label(&device);
    meta.device = device.data;
    if (!err)
        err = sch_response_encode(req, eng_package_model_id(a->pkg), eng_answers_results(ans),
                                  eng_answers_input_tokens(ans), &meta, out, &e);
    if (err == SVC_ERR_INVALID && e.code) { /* a non-finite number: 500 */
        rc = OPS_EXIT_VERDICT;
        *status = e.status;
        err = sch_error_encode(&e, out);
    }
    if (err) {
        svc_errf(errstr, errstr_size, "cannot write the response: %s", svc_err_name(err));
        rc = OPS_EXIT_FAILURE;
    }
    sch_error_fini(&e);
    svc_buf_fini(&device);
    return rc;
}

int ops_ask_body(const ops_ask_t *a, const char *body, size_t len, svc_buf_t *out, int *status,
                 char *errstr, size_t errstr_size) {
    sch_request_t *req = NULL;
    eng_answers_t *ans = NULL;
    int            http = 200;
    unsigned       flags = OPS_DECODE_ENGINE | ops_decode_vision(a->model);
    int            rc =
        ops_decode_request(a->pkg, a->dir, flags, body, len, &req, out, &http, errstr, errstr_size);
    sch_error_t reject;
    sch_error_init(&reject);
    if (rc == OPS_EXIT_OK) {
        svc_err_t err =
            eng_answer_request(a->pkg, a->model, req, &ans, &reject, errstr, errstr_size);
        if (err == SVC_ERR_INVALID && reject.code) { /* an image the contract refuses: 400 */
            rc = OPS_EXIT_VERDICT;
            http = reject.status;
            svc_buf_reset(out);
            if (sch_error_encode(&reject, out)) {
                svc_errf(errstr, errstr_size, "cannot write the result");
                rc = OPS_EXIT_FAILURE;
            }
        } else
            rc = err ? OPS_EXIT_FAILURE
                     : ops_ask_encode(a, req, ans, out, &http, errstr, errstr_size);
    }
    sch_error_fini(&reject);
    if (status)
        *status = http;
    eng_answers_free(ans);
    sch_request_free(req);
    return rc;
}

/* ---------------------------------------------------------------- command */

static int ask_run(const ops_ask_t *a, const char *path) {
    svc_buf_t body, out;
    svc_buf_init(&out, SIZE_MAX / 2);
    char errstr[1024] = "";
    int  rc = OPS_EXIT_FAILURE;
    if (ops_read_request("ask", path, &body)) {
        rc = ops_ask_body(a, body.data, body.len, &out, NULL, errstr, sizeof errstr);
        if (rc == OPS_EXIT_FAILURE)
            ops_fail("ask", "%s", errstr[0] ? errstr : "cannot answer the request");
        else if (!ops_emit(&out))
            rc = OPS_EXIT_FAILURE;
    }
    svc_buf_fini(&body);
    svc_buf_fini(&out);
    return rc;
}

/* Verify, open, load, answer. */
static int ask_package(const char *dir, bool no_verify, bool no_golden, const eng_load_opts_t *lo,
                       const char *path) {
    char sha[ENG_SHA256_HEX + 1];
    int  rc = ask_verify("ask", dir, no_verify, sha);
    if (rc != OPS_EXIT_OK)
        return rc;
    ops_chat_template_warn("ask", dir);
    char           errstr[1024];
    eng_package_t *pkg = NULL;
    eng_model_t   *model = NULL;
    /* The parameter counts are part of the manifest check, so --no-verify
     * (which already warned) skips them too. */
    if (eng_package_open(dir, &pkg, errstr, sizeof errstr) ||
        eng_model_load_with(dir, lo, &model, errstr, sizeof errstr) ||
        eng_model_check_package(model, pkg, errstr, sizeof errstr) ||
        (!no_verify && eng_model_check_parameters(model, dir, errstr, sizeof errstr))) {
        ops_fail("ask", "%s", errstr);
        rc = OPS_EXIT_FAILURE;
    } else {
        ops_ask_t    a = {pkg, model, dir, sha};
        ops_golden_t g;
        rc = ops_golden_run("ask", &a, model, lo, no_golden, &g) ? ask_run(&a, path)
                                                                 : OPS_EXIT_FAILURE;
    }
    eng_model_free(model);
    eng_package_free(pkg);
    return rc;
}

/* serve and http load their packages through the same checks (ops_int.h). */
int ops_ask_verify_as(const char *cmd, const char *dir, bool no_verify, char *sha) {
    return ask_verify(cmd, dir, no_verify, sha);
}

int ops_ask_verify(const char *dir, bool no_verify, char *sha) {
    return ask_verify(ops_log_cmd(), dir, no_verify, sha);
}

int ops_cmd_ask(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"device", required_argument, NULL, 'd'},
        {"no-verify", no_argument, NULL, 'n'},
        {"no-golden", no_argument, NULL, 'G'},
        {"model-alias", required_argument, NULL, 'A'},
        {"no-default-alias", no_argument, NULL, 'D'},
        {"q4nx-layout", required_argument, NULL, 'L'},
        {"profile", required_argument, NULL, 'P'},
        {"max-request-bytes", required_argument, NULL, 'B'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char     *dir = NULL;
    bool            no_verify = false, no_golden = false;
    eng_load_opts_t lo = {0};
    int             c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'n')
            no_verify = true;
        else if (c == 'G')
            no_golden = true;
        else if (c == 'D')
            ops_no_default_alias();
        else if (c == 'A') {
            if ((rc = ops_model_alias_opt("ask", optarg)) >= 0)
                return rc;
        } else if (c == 'L') {
            if ((rc = ops_q4nx_layout_opt("ask", optarg, &lo)) >= 0)
                return rc;
        } else if (c == 'P') {
            if ((rc = ops_profile_opt("ask", optarg)) >= 0)
                return rc;
        } else if (c == 'B') {
            if ((rc = ops_max_request_opt("ask", optarg)) >= 0)
                return rc;
        } else if (c == 'd') {
            if ((rc = ops_device_opt("ask", optarg)) >= 0)
                return rc;
        } else if ((rc = ops_opt_common(c, ASK_HELP, &dir)) >= 0)
            return rc;
    }
    if ((rc = ops_opt_end(argc, ASK_HELP, dir, 1)) >= 0 || (rc = ops_device_choose("ask")) >= 0)
        return rc;
    return ask_package(dir, no_verify, no_golden, &lo, optind < argc ? argv[optind] : NULL);
}
