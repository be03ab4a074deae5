/*
 * fuzz_json.c -- libFuzzer harness for schemas/sch_json.c; ctest replays its
 * saved inputs (fuzz_json, tests/fuzz/replay.c).
 *
 *     tests/fuzz/run.sh [SECONDS]    # builds and runs every harness
 *
 * Every input must parse or fail with a message; a parsed document must dump
 * in both styles, and the dumps must parse back to the same dumps (a value
 * never loses or gains anything on a round trip). Every accessor is walked
 * so that the sanitizers see each byte the reader stored.
 */
#include "schemas.h"

#include "fuzz_util.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touches every value; the depth is bounded by the reader. */
static void walk(const sch_json_t *v) {
    size_t len = 0;
    (void)sch_json_truthy(v);
    switch (sch_json_type(v)) {
    case SCH_JSON_STRING:
        (void)sch_json_string(v, &len);
        break;
    case SCH_JSON_INT:
        FUZZ_CHECK(sch_json_int_text(v, &len) != NULL && len > 0);
        (void)sch_json_number(v);
        break;
    case SCH_JSON_OBJECT:
        for (size_t i = 0; i < sch_json_size(v); i++) {
            const char *key = sch_json_key_at(v, i, &len);
            /* keys are unique: a lookup finds this very member */
            FUZZ_CHECK(sch_json_get(v, key, len) == sch_json_at(v, i));
            walk(sch_json_at(v, i));
        }
        break;
    case SCH_JSON_ARRAY:
        for (size_t i = 0; i < sch_json_size(v); i++)
            walk(sch_json_at(v, i));
        break;
    default:
        break;
    }
}

static void round_trip(const sch_json_t *v, svc_err_t (*dump)(const sch_json_t *, svc_buf_t *)) {
    svc_buf_t once;
    svc_buf_t twice;
    svc_buf_init(&once, 1u << 26);
    svc_buf_init(&twice, 1u << 26);
    FUZZ_CHECK(dump(v, &once) == SVC_OK);
    sch_jfail_t fail = SCH_JFAIL_NONE;
    char        msg[256];
    sch_jdoc_t *doc = sch_json_parse(once.data, once.len, &fail, msg, sizeof msg);
    if (!doc)
        fprintf(stderr, "dump does not parse back (%d): %s\n%s\n", (int)fail, msg, once.data);
    FUZZ_CHECK(doc != NULL);
    FUZZ_CHECK(dump(sch_jdoc_root(doc), &twice) == SVC_OK);
    FUZZ_CHECK(once.len == twice.len && memcmp(once.data, twice.data, once.len) == 0);
    sch_jdoc_free(doc);
    svc_buf_fini(&once);
    svc_buf_fini(&twice);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sch_jfail_t fail = SCH_JFAIL_NONE;
    char        msg[256];
    sch_jdoc_t *doc = sch_json_parse((const char *)data, size, &fail, msg, sizeof msg);
    if (!doc) {
        FUZZ_CHECK(fail != SCH_JFAIL_NONE && msg[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(fail == SCH_JFAIL_NONE);
    const sch_json_t *root = sch_jdoc_root(doc);
    walk(root);
    (void)sch_json_all_finite(root);
    round_trip(root, sch_json_dump_py);
    round_trip(root, sch_json_dump_canonical);
    svc_buf_t text;
    svc_buf_init(&text, 1u << 26);
    FUZZ_CHECK(sch_content_text(root, &text) == SVC_OK);
    svc_buf_fini(&text);
    sch_jdoc_free(doc);
    return 0;
}
