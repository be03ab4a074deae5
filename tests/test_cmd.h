/*
 * test_cmd.h -- running the d3stream binary from a test: its path (ctest
 * sets D3STREAM) and a shell command's exit status and stdout.
 */
#ifndef D3_TEST_CMD_H
#define D3_TEST_CMD_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "svc.h"

static inline const char *binary(void) {
    const char *b = getenv("D3STREAM");
    cr_assert(b && *b, "D3STREAM (path of the d3stream binary) is not set; run through ctest");
    return b;
}

/* Runs a shell command, returns its exit status and stdout in out (which
 * it initialises; NUL-terminated, possibly empty). */
static inline int run_shell(const char *cmd, svc_buf_t *out) {
    svc_buf_init(out, (size_t)1 << 30);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen(%s) failed", cmd);
    char   chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0)
        cr_assert(svc_buf_add(out, chunk, n) == SVC_OK);
    if (!out->data)
        cr_assert(svc_buf_add(out, "", 0) == SVC_OK);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
