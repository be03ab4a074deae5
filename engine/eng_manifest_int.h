/*
 * eng_manifest_int.h -- private: package file hashes (SPEC e.3, e.4).
 *
 * Two manifest formats are verified against the files of a package
 * directory:
 *   MANIFEST.sha256      sha256sum(1) output, "<hex>  <name>" or "<hex> *<name>"
 *   MODEL_MANIFEST.json  schema d3-package-manifest/1: files_sha256,
 *                        optional files_bytes, identity.model_sha256
 * Files are hashed in 1 MiB chunks (weights may be gigabytes) with OpenSSL's
 * EVP SHA-256. Names in a manifest are relative to the package directory;
 * absolute names and ".." components are refused so that a manifest can
 * never make us read outside the package.
 *
 * Usage:
 *     eng_mf_verdict_t v;
 *     eng_mf_verdict_init(&v);
 *     svc_err_t err = eng_manifest_verify_model(dir, &v, errstr, sizeof errstr);
 *     ... v.files[i].status per file, errstr names the first bad one ...
 *     eng_mf_verdict_fini(&v);
 */
#ifndef D3STREAM_ENG_MANIFEST_INT_H
#define D3STREAM_ENG_MANIFEST_INT_H

#include "svc.h"

#include <jansson.h>

#define ENG_SHA256_HEX    64 /* digits; buffers are ENG_SHA256_HEX + 1 */
#define ENG_MF_HASH_CHUNK (1u << 20)

/**
 * @brief SHA-256 of a file, streamed; hex is lowercase and NUL-terminated.
 * @param nbytes if not NULL, receives the file size.
 * @returns SVC_OK; SVC_ERR_IO (errno ENOENT stays in errno for callers that
 *   treat a missing file differently); SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_sha256_file(const char *path, char hex[ENG_SHA256_HEX + 1], uint64_t *nbytes,
                                  char *errstr, size_t errstr_size);
SVC_WUR svc_err_t eng_sha256_buf(const void *p, size_t n, char hex[ENG_SHA256_HEX + 1]);

/**
 * @brief Appends j as Python's json.dumps(j, sort_keys=True,
 *   separators=(",", ":"), ensure_ascii=True) would write it (floats as
 *   repr(), non-ASCII as lowercase \uXXXX with surrogate pairs).
 * @returns SVC_OK; SVC_ERR_INVALID for values Python would write as
 *   NaN/Infinity (jansson cannot hold them anyway); svc_buf errors.
 */
SVC_WUR svc_err_t eng_json_canonical(const json_t *j, svc_buf_t *out);

typedef enum eng_mf_status {
    ENG_MF_OK,
    ENG_MF_MISMATCH, /* hash differs: expected vs actual */
    ENG_MF_MISSING,  /* listed but not in the directory */
    ENG_MF_SIZE,     /* files_bytes differs from the file size */
    ENG_MF_UNLISTED, /* the family loads it but the manifest does not list it */
} eng_mf_status_t;

const char *eng_mf_status_name(eng_mf_status_t s);

typedef struct eng_mf_file {
    char           *name; /* owned by the verdict */
    eng_mf_status_t status;
    char            expected[ENG_SHA256_HEX + 1]; /* "" when the manifest gives none */
    char            actual[ENG_SHA256_HEX + 1];   /* "" when not hashed (missing) */
    int64_t         bytes_expected;               /* -1 when not listed */
    uint64_t        bytes;                        /* actual size */
} eng_mf_file_t;

/* Caller-owned; filled by the verify functions, freed by eng_mf_verdict_fini. */
typedef struct eng_mf_verdict {
    eng_mf_file_t *files; /* in manifest order, then unlisted files */
    size_t         n, cap;
    size_t         n_bad;
    char           message[512];                     /* one line; "" when all is well */
    char           model_sha256[ENG_SHA256_HEX + 1]; /* computed identity (JSON manifest) */
} eng_mf_verdict_t;

void eng_mf_verdict_init(eng_mf_verdict_t *v);
void eng_mf_verdict_fini(eng_mf_verdict_t *v);

/**
 * @brief Verifies dir/MANIFEST.sha256: every listed file exists and matches.
 * @returns SVC_OK when all match; SVC_ERR_INVALID when a file is missing or
 *   differs (v lists each file, errstr = v->message names the first bad
 *   one); SVC_ERR_FORMAT for a malformed manifest; SVC_ERR_IO.
 */
SVC_WUR svc_err_t eng_manifest_verify_sha256sum(const char *dir, eng_mf_verdict_t *v, char *errstr,
                                                size_t errstr_size);

/**
 * @brief Verifies dir/MODEL_MANIFEST.json (SPEC e.3) and its identity hash
 *   (e.4): schema, files_sha256 hashes, files_bytes sizes, that the files
 *   the family loads are listed, and identity.model_sha256.
 * @returns as eng_manifest_verify_sha256sum; an identity mismatch is
 *   SVC_ERR_INVALID with the upstream message.
 */
SVC_WUR svc_err_t eng_manifest_verify_model(const char *dir, eng_mf_verdict_t *v, char *errstr,
                                            size_t errstr_size);

/**
 * @brief Computes model_sha256 (SPEC e.4) of the package in dir.
 * @param v if not NULL, hashes already in it are reused instead of reading
 *   the files again.
 */
SVC_WUR svc_err_t eng_manifest_identity(const char *dir, const eng_mf_verdict_t *v,
                                        char hex[ENG_SHA256_HEX + 1], char *errstr,
                                        size_t errstr_size);

#endif /* D3STREAM_ENG_MANIFEST_INT_H */
