/*
 * fuzz_request.c -- libFuzzer harness for the whole contract path (ctest
 * replays its saved inputs: fuzz_request): any bytes -> sch_request_decode
 * -> a verdict, an error object or a response body, never a crash, a leak
 * or undefined behaviour.
 *
 *     tests/fuzz/run.sh [SECONDS]    # builds and runs every harness
 *
 * The decode runs without model information, for a text model and for a
 * vision model whose engine decodes (errors held behind images); valid
 * requests are answered with uniform probabilities so the response writer
 * runs too.
 */
#include "schemas.h"

static const char *const NAMES[] = {"d3-nano", "pkg"};
static const char *const PROFILES[] = {"exact"};

static void answer(const sch_request_t *req) {
    size_t        n_parts = sch_request_n_parts(req);
    sch_result_t *rows[64];
    size_t        tokens[64];
    double        probs[255];
    if (n_parts > 64)
        return;
    for (size_t i = 0; i < 255; i++)
        probs[i] = 1.0 / 255;
    for (size_t p = 0; p < n_parts; p++) {
        const sch_part_t *part = sch_request_part(req, p);
        rows[p] = calloc(part->n_questions + 1, sizeof(sch_result_t));
        for (size_t q = 0; q < part->n_questions; q++)
            rows[p][q].probs = probs;
        tokens[p] = p;
    }
    svc_buf_t   out;
    sch_error_t err;
    sch_error_init(&err);
    svc_buf_init(&out, (size_t)64 << 20);
    sch_meta_t meta = {.model_id = "d3-nano", .profile = "exact", .numerics = "exact"};
    if (sch_response_encode(req, "d3-nano", (const sch_result_t *const *)rows, tokens, &meta, &out,
                            &err) != SVC_OK)
        svc_buf_reset(&out);
    svc_buf_fini(&out);
    sch_error_fini(&err);
    for (size_t p = 0; p < n_parts; p++)
        free(rows[p]);
}

static void decode(const uint8_t *data, size_t size, const sch_model_info_t *info) {
    sch_limits_t   lim = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    err;
    sch_error_init(&err);
    svc_buf_t out;
    svc_buf_init(&out, (size_t)64 << 20);
    bool ok = sch_request_decode((const char *)data, size, &lim, info, &req, &err) == SVC_OK;
    if (sch_verdict_encode(req, ok ? NULL : &err, &out) != SVC_OK)
        abort();
    if (!ok && sch_error_encode(&err, &out) != SVC_OK)
        abort();
    if (ok)
        answer(req);
    sch_request_free(req);
    sch_error_fini(&err);
    svc_buf_fini(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sch_model_info_t info = {NAMES, 2, "d3-nano", false, false, PROFILES, 1, false, NULL};
    /* a vision model whose engine decodes: errors held behind the images */
    sch_model_info_t vl = {NAMES, 2, "d3-vl", true, false, PROFILES, 1, true, NULL};
    decode(data, size, NULL);
    decode(data, size, &info);
    decode(data, size, &vl);
    return 0;
}
