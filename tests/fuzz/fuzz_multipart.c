/*
 * fuzz_multipart.c -- libFuzzer harness for the SDK's image uploads
 * (ops/ops_http_multipart.c): any body under boundary "XyZ" either gets a
 * 4xx/5xx status with a message, or becomes a JSON object with an `images`
 * list and no `assets`, within the limit.
 *
 *     tests/fuzz/run.sh [SECONDS]    # builds and runs every harness
 */
#include "ops_http_int.h"

#include <jansson.h>

#include "fuzz_util.h"

#define LIMIT 65536

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    svc_buf_t body;
    char      why[400] = "";
    svc_buf_init(&body, LIMIT);
    if (size > LIMIT || svc_buf_add(&body, data, size))
        return 0;
    int st = ops_http_multipart("XyZ", &body, LIMIT, why, sizeof why);
    if (st) {
        FUZZ_CHECK(st == 400 || st == 413 || st == 500);
        FUZZ_CHECK(why[0] != '\0');
    } else {
        FUZZ_CHECK(body.len <= LIMIT);
        json_t *j = json_loadb(body.data, body.len, 0, NULL);
        FUZZ_CHECK(json_is_object(j));
        FUZZ_CHECK(json_is_array(json_object_get(j, "images")));
        FUZZ_CHECK(!json_object_get(j, "assets"));
        json_decref(j);
    }
    svc_buf_fini(&body);
    return 0;
}
