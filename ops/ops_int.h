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

/* ---- package checks shared by ask and inspect (ops_ask.c) ---- */

#define OPS_MF_JSON "MODEL_MANIFEST.json"
#define OPS_MF_SUM  "MANIFEST.sha256"

struct eng_mf_verdict; /* eng_manifest_int.h */

/* Verifies dir against MODEL_MANIFEST.json when it exists, else
 * MANIFEST.sha256; *which names the one used (NULL when there is none:
 * then SVC_ERR_INVALID, "no manifest" in errstr). Returns as
 * eng_manifest_verify_model; v is the caller's, initialised. */
SVC_WUR svc_err_t ops_manifest_verify(const char *dir, const char **which, struct eng_mf_verdict *v,
                                      char *errstr, size_t errstr_size);

/* Prints a warning to stderr when dir's chat_template.jinja is missing or
 * not pinned by SPEC e.5 (never a refusal: d3stream does not execute it). */
void ops_chat_template_warn(const char *cmd, const char *dir);

/* What the contract must know about the package opened from dir: the names
 * that select it (its id, the path, the path's last component; SPEC a.2 4.),
 * the "exact" profile and whether images are rendered (has_vision). */
void ops_model_info(const eng_package_t *pkg, const char *dir, bool has_vision,
                    const char *names[3], sch_model_info_t *info);

#endif
