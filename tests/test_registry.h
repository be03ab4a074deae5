/*
 * test_registry.h -- a fake Confluent schema registry for the tests: one
 * thread, one connection at a time, canned answers by path.
 *
 *   GET  /schemas/ids/{1,7,10,11}   200 {"schema": request.avsc}
 *   GET  /schemas/ids/8             200, not JSON
 *   GET  /schemas/ids/9             200 after 1.5 s (past a short timeout)
 *   GET  /schemas/ids/12            200 with a body over 4 MiB
 *   GET  /schemas/ids/13            503 the first time, then as 7
 *   GET  /schemas/ids/14            503 always
 *   GET  /schemas/ids/15            401 without an Authorization header
 *   GET  /schemas/ids/(other)       404 {"error_code": 40403}
 *   POST /subjects/bad/versions     409 (incompatible)
 *   POST /subjects/{s}/versions     200 {"id": 42}; the subject is kept
 *   anything else                   404, an HTML page (not the registry)
 *
 * hits[] counts requests by id (0: the 40403s, 2: POSTs, 3: the HTML
 * 404s, else the id's GETs); `auth` is the last Authorization header seen.
 */
#ifndef D3STREAM_TEST_REGISTRY_H
#define D3STREAM_TEST_REGISTRY_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "schemas.h"

#define REG_ANSWER_ID 42

typedef struct fake_registry {
    int        fd;
    int        port;
    pthread_t  th;
    atomic_int stop;
    atomic_int hits[16]; /* by route, see above */
    char      *schema;   /* request.avsc text, escaped into the 200 answer */
    char       subject[256], auth[256];
} fake_registry_t;

static void reg_send_all(int c, const char *s, size_t n) {
    while (n > 0) {
        ssize_t k = send(c, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        s += k;
        n -= (size_t)k;
    }
}

static void reg_reply(int c, int status, const char *type, const char *body, size_t len) {
    char head[256];
    int  n = snprintf(head, sizeof head,
                      "HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: "
                       "close\r\n\r\n",
                      status, type, len);
    reg_send_all(c, head, (size_t)n);
    reg_send_all(c, body, len);
}

static void reg_json(int c, int status, const char *body) {
    reg_reply(c, status, "application/json", body, strlen(body));
}

static void reg_schema(fake_registry_t *s, int c) {
    json_t *j = json_pack("{s:s}", "schema", s->schema);
    char   *body = json_dumps(j, JSON_COMPACT);
    reg_json(c, 200, body);
    free(body);
    json_decref(j);
}

/* Reads the head and, for a POST, the body that came with it. */
static size_t reg_read(int c, char *req, size_t size) {
    size_t got = 0;
    while (got < size - 1) {
        ssize_t k = recv(c, req + got, size - 1 - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
        req[got] = '\0';
        char *end = strstr(req, "\r\n\r\n");
        if (end && (strncmp(req, "POST", 4) != 0 || strchr(end + 4, '}')))
            break;
    }
    req[got] = '\0';
    return got;
}

static void reg_get(fake_registry_t *s, int c, int id) {
    if (id == 1 || id == 7 || id == 10 || id == 11 || (id == 13 && s->hits[13] > 1)) {
        reg_schema(s, c);
    } else if (id == 8) {
        reg_json(c, 200, "<html>not json");
    } else if (id == 9) {
        usleep(1500 * 1000);
        reg_json(c, 200, "{}");
    } else if (id == 12) {
        size_t n = ((size_t)5 << 20);
        char  *big = malloc(n);
        memset(big, ' ', n);
        big[0] = '{';
        big[n - 1] = '}';
        reg_reply(c, 200, "application/json", big, n);
        free(big);
    } else if (id == 13 || id == 14) {
        reg_json(c, 503, "{\"error_code\":50003,\"message\":\"forwarding failed\"}");
    } else if (id == 15 && !s->auth[0]) {
        reg_json(c, 401, "{\"error_code\":401,\"message\":\"Unauthorized\"}");
    } else if (id == 15) {
        reg_schema(s, c);
    } else {
        s->hits[0]++;
        reg_json(c, 404, "{\"error_code\":40403,\"message\":\"Schema not found\"}");
    }
}

static void reg_serve_one(fake_registry_t *s, int c) {
    static char req[65536];
    reg_read(c, req, sizeof req);
    const char *a = strcasestr(req, "\r\nAuthorization: ");
    if (a)
        sscanf(a + 17, "%255[^\r]", s->auth);
    int  id = -1;
    char subject[256] = "";
    if (sscanf(req, "GET /schemas/ids/%d ", &id) == 1 && id > 0 && id < 16) {
        s->hits[id]++;
        reg_get(s, c, id);
    } else if (sscanf(req, "POST /subjects/%255[^/ ]/versions ", subject) == 1) {
        s->hits[2]++;
        snprintf(s->subject, sizeof s->subject, "%s", subject);
        if (!strcmp(subject, "bad"))
            reg_json(c, 409, "{\"error_code\":409,\"message\":\"incompatible\"}");
        else if (strstr(req, "\"schema\""))
            reg_json(c, 200, "{\"id\":42}");
        else
            reg_json(c, 422, "{\"error_code\":42201}");
    } else if (sscanf(req, "GET /schemas/ids/%d ", &id) == 1) {
        s->hits[0]++;
        reg_json(c, 404, "{\"error_code\":40403,\"message\":\"Schema not found\"}");
    } else {
        s->hits[3]++;
        static const char html[] = "<html><body>404 Not Found</body></html>";
        reg_reply(c, 404, "text/html", html, sizeof html - 1);
    }
    close(c);
}

static void *reg_thread(void *ud) {
    fake_registry_t *s = ud;
    while (!s->stop) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(s->fd, NULL, NULL);
        if (c >= 0)
            reg_serve_one(s, c);
    }
    return NULL;
}

static void fake_registry_start(fake_registry_t *s) {
    memset(s, 0, sizeof *s);
    size_t      len;
    const char *text = sch_avro_schema_text(SCH_AVRO_REQUEST, &len);
    s->schema = strndup(text, len);
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(s->fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    cr_assert_eq(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s->fd, 16), 0);
    cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&s->th, NULL, reg_thread, s), 0);
}

static void fake_registry_stop(fake_registry_t *s) {
    s->stop = 1;
    pthread_join(s->th, NULL);
    close(s->fd);
    free(s->schema);
}

#endif /* D3STREAM_TEST_REGISTRY_H */
