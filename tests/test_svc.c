/*
 * test_svc.c -- the shared header: the capped buffer and file reading.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "svc.h"

Test(svc, buffer_cap_is_hard) {
    svc_buf_t b;
    svc_buf_init(&b, 8);
    cr_assert_eq(svc_buf_adds(&b, "12345678"), SVC_OK);
    cr_assert_eq(svc_buf_addc(&b, '9'), SVC_ERR_TOO_LARGE, "one byte past the cap");
    cr_assert_eq(b.len, 8, "a refused append leaves the content as it was");
    cr_assert_str_eq(b.data, "12345678");
    svc_buf_reset(&b);
    cr_assert_eq(svc_buf_addf(&b, "%d-%s", 42, "ab"), SVC_OK);
    cr_assert_str_eq(b.data, "42-ab");
    cr_assert_eq(svc_buf_addf(&b, "%s", "toolong"), SVC_ERR_TOO_LARGE);
    size_t len;
    char  *s = svc_buf_steal(&b, &len);
    cr_assert_str_eq(s, "42-ab");
    cr_assert_eq(len, 5);
    cr_assert_null(b.data);
    free(s);
    svc_buf_fini(&b);
}

Test(svc, read_file_empty_and_capped) {
    char path[] = "/tmp/d3stream-svc-XXXXXX";
    int  fd = mkstemp(path);
    cr_assert(fd >= 0);
    svc_buf_t b;
    char      errstr[256];
    svc_buf_init(&b, 4);
    cr_assert_eq(svc_buf_read_file(&b, path, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_not_null(b.data, "an empty file is an empty string, not NULL");
    cr_assert_eq(b.len, 0);
    cr_assert_eq(b.data[0], '\0');
    svc_buf_fini(&b);
    cr_assert_eq(write(fd, "12345", 5), 5);
    close(fd);
    svc_buf_init(&b, 4);
    cr_assert_eq(svc_buf_read_file(&b, path, errstr, sizeof errstr), SVC_ERR_TOO_LARGE);
    cr_assert_eq(b.len, 4, "exactly the cap is kept");
    cr_assert_str_eq(b.data, "1234");
    cr_assert(strstr(errstr, path), "names the file: %s", errstr);
    svc_buf_fini(&b);
    unlink(path);
    svc_buf_init(&b, 4);
    cr_assert_eq(svc_buf_read_file(&b, "/nonexistent/x", errstr, sizeof errstr), SVC_ERR_IO);
    cr_assert(strstr(errstr, "/nonexistent/x"), "%s", errstr);
    svc_buf_fini(&b);
}
