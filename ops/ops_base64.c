/*
 * ops_base64.c -- RFC 4648 base64 for the data URLs ops writes (bench's
 * image bodies, the SDK's uploads rewritten by ops_http_multipart.c); a
 * file of its own so that the multipart fuzz harness links it alone.
 */
#include "ops_int.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* RFC 4648 base64 with padding, as a data URL wants it. */
svc_err_t ops_base64_add(svc_buf_t *b, const unsigned char *p, size_t n) {
    char      q[4];
    svc_err_t err = SVC_OK;
    for (size_t i = 0; !err && i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        q[0] = B64[v >> 18 & 63];
        q[1] = B64[v >> 12 & 63];
        q[2] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? B64[v & 63] : '=';
        err = svc_buf_add(b, q, 4);
    }
    return err;
}
