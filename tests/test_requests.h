/*
 * test_requests.h -- request bodies the HTTP tests share (test_http.c,
 * test_serve_http.c).
 */
#ifndef D3_TEST_REQUESTS_H
#define D3_TEST_REQUESTS_H

#include <criterion/criterion.h>
#include <jansson.h>

#include "svc.h"

/* A decision request with n questions about a state of words words: about
 * n x 50 ms on the tiny package. */
static inline char *slow_request(int n, int words) {
    json_t *q = json_object();
    for (int i = 0; i < n; i++) {
        char id[16], ins[32];
        snprintf(id, sizeof id, "q%d", i);
        snprintf(ins, sizeof ins, "Pick %d", i);
        json_object_set_new(q, id,
                            json_pack("{s:s, s:s, s:{s:s, s:n}}", "type", "choice", "instructions",
                                      ins, "criteria", "a", "the first", "b"));
    }
    svc_buf_t st;
    svc_buf_init(&st, (size_t)1 << 24);
    for (int i = 0; i < words; i++)
        cr_assert(svc_buf_addf(&st, "word%d ", i) == SVC_OK);
    json_t *r = json_pack("{s:s, s:o}", "state", st.data, "questions", q);
    char   *s = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    svc_buf_fini(&st);
    return s;
}

#endif
