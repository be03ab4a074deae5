/*
 * ops.h -- the d3stream command: one entry point per subcommand. Each takes
 * the arguments after the subcommand name (argv[0] is the subcommand) and
 * returns the process exit status: 0 success, 1 a negative verdict (an
 * invalid request for `validate`), 2 a usage error, 3 a runtime failure
 * (unreadable file, bad package).
 */
#ifndef D3STREAM_OPS_H
#define D3STREAM_OPS_H

#include "engine.h"
#include "svc.h"

enum {
    OPS_EXIT_OK = 0,
    OPS_EXIT_VERDICT = 1,
    OPS_EXIT_USAGE = 2,
    OPS_EXIT_FAILURE = 3,
};

int ops_cmd_tokenize(int argc, char **argv);
int ops_cmd_prompt(int argc, char **argv);
int ops_cmd_validate(int argc, char **argv);
int ops_cmd_version(int argc, char **argv);
int ops_cmd_devices(int argc, char **argv);
int ops_cmd_make_package(int argc, char **argv);
int ops_cmd_quantize(int argc, char **argv);
int ops_cmd_ask(int argc, char **argv);
int ops_cmd_inspect(int argc, char **argv);
int ops_cmd_serve(int argc, char **argv);
int ops_cmd_http(int argc, char **argv);
int ops_cmd_config(int argc, char **argv);
int ops_cmd_bench(int argc, char **argv);

/**
 * @brief What `d3stream prompt` prints for one request body (without the
 *        final newline), for the package opened from dir.
 * @param out appended to; the caller owns it.
 * @returns OPS_EXIT_OK (prompts written), OPS_EXIT_VERDICT (the whole-request
 *          error object written) or OPS_EXIT_FAILURE (errstr says why).
 */
int ops_prompt_body(const eng_package_t *pkg, const char *dir, const char *body, size_t len,
                    svc_buf_t *out, char *errstr, size_t errstr_size);

/* What `d3stream ask` answers with; all borrowed. */
typedef struct ops_ask {
    const eng_package_t *pkg;
    const eng_model_t   *model;
    const char          *dir;          /* as given: a name that selects the model */
    const char          *model_sha256; /* meta.model_sha256; NULL or "" writes null */
} ops_ask_t;

/**
 * @brief What `d3stream ask` prints for one request body (without the final
 *        newline): the response body the HTTP shim sends.
 * @param out appended to; the caller owns it.
 * @param status optional (may be NULL): the HTTP status of what was written
 *        (200, or the whole-request error's status).
 * @returns OPS_EXIT_OK (200 body written), OPS_EXIT_VERDICT (the
 *          whole-request error object written) or OPS_EXIT_FAILURE (errstr
 *          says why; nothing useful in out).
 */
int ops_ask_body(const ops_ask_t *a, const char *body, size_t len, svc_buf_t *out, int *status,
                 char *errstr, size_t errstr_size);

/* Prints a message to stderr as "d3stream <cmd>: ..." */
SVC_FMT(2, 3) void ops_fail(const char *cmd, const char *fmt, ...);

#endif /* D3STREAM_OPS_H */
