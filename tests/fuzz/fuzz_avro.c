/*
 * fuzz_avro.c -- libFuzzer harness for Avro records from Kafka (ctest
 * replays its saved inputs: fuzz_avro): any bytes -> sch_frame_parse ->
 * sch_avro_request_to_json and sch_avro_answer_to_json with the embedded
 * schemas (avro-c underneath); a decoded request is decoded again as a
 * request body. Never a crash, a leak, undefined behaviour or an
 * allocation the body's size does not justify (-rss_limit_mb,
 * -malloc_limit_mb).
 *
 * Built and run by tests/fuzz/run.sh; its seeds (framed Avro made from
 * tests/contract's bodies by this file's FUZZ_AVRO_SEEDS mode) by
 * tests/fuzz/make_corpus.py.
 */
#include "schemas.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    uint32_t    id;
    const void *body = data;
    size_t      blen = size;
    char        errstr[512];
    /* Framed or not: both the framing parser and the bodies get the bytes. */
    if (sch_frame_parse(data, size, &id, &body, &blen, errstr, sizeof errstr) != SVC_OK) {
        body = data;
        blen = size;
    }
    svc_buf_t json;
    svc_buf_init(&json, (size_t)SCH_DEFAULT_MAX_REQUEST_BYTES + 2);
    if (sch_avro_request_to_json(NULL, body, blen, &json, errstr, sizeof errstr) == SVC_OK) {
        sch_limits_t   lim = {SCH_DEFAULT_MAX_REQUEST_BYTES};
        sch_request_t *req = NULL;
        sch_error_t    e;
        sch_error_init(&e);
        svc_err_t err = sch_request_decode(json.data, json.len, &lim, NULL, &req, &e);
        if ((err == SVC_OK) != (req != NULL))
            abort(); /* a request exactly when it decoded */
        sch_request_free(req);
        sch_error_fini(&e);
    }
    svc_buf_fini(&json);
    svc_buf_init(&json, (size_t)SCH_DEFAULT_MAX_REQUEST_BYTES + 2);
    if (sch_avro_answer_to_json(NULL, body, blen, &json, errstr, sizeof errstr) != SVC_OK &&
        json.len != 0)
        abort(); /* a refusal leaves no half-written body */
    svc_buf_fini(&json);
    return 0;
}

#ifdef FUZZ_AVRO_SEEDS
/* Seed mode (tests/fuzz/make_corpus.py builds it without libFuzzer): every JSON
 * body in directory argv[1] that is a request object becomes a framed Avro
 * record (schema id 1) in directory argv[2]. */
#include <dirent.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    DIR *d = opendir(argv[1]);
    if (!d)
        return 1;
    int            n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[4096], body[8192], err[256];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(path, "rb") : NULL;
        if (!f)
            continue;
        size_t len = fread(body, 1, sizeof body, f);
        fclose(f);
        svc_buf_t bin, framed;
        svc_buf_init(&bin, SIZE_MAX / 2);
        svc_buf_init(&framed, SIZE_MAX / 2);
        if (sch_avro_request_from_json(body, len, &bin, err, sizeof err) == SVC_OK &&
            sch_frame_write(SCH_AVRO_ID_REQUEST, bin.data, bin.len, &framed) == SVC_OK) {
            snprintf(path, sizeof path, "%s/%s", argv[2], e->d_name);
            f = fopen(path, "wb");
            if (f) {
                n += fwrite(framed.data, 1, framed.len, f) == framed.len;
                fclose(f);
            }
        }
        svc_buf_fini(&bin);
        svc_buf_fini(&framed);
    }
    closedir(d);
    printf("avro seeds: %d\n", n);
    return n > 0 ? 0 : 1;
}
#endif
