/* ops_int.h -- helpers shared by the subcommands of ops/ (private). */
#ifndef D3STREAM_OPS_INT_H
#define D3STREAM_OPS_INT_H

#include "engine.h"
#include "ops.h"

/* Appends ids as a JSON array. */
SVC_WUR svc_err_t ops_add_ids(svc_buf_t *out, const eng_ids_t *ids);

/* Reads a request body from path (stdin when NULL) into body, which it
 * initialises with a cap one byte past the request limit, so that the
 * decoder -- not the reader -- answers 413 with the contract's message.
 * Returns false (after printing why) when the input cannot be read. */
bool ops_read_request(const char *cmd, const char *path, svc_buf_t *body);

#endif
