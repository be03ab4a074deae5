/*
 * ops_log.c -- structured log lines (logfmt) on stderr, for serve and http:
 *
 *   ts=2026-11-29T23:59:01.123Z level=info cmd=serve msg=result
 *   request_id=r-1 topic=requests partition=0 offset=12 status=200
 *
 * A line is built in a fixed buffer and written with one write(2), so that
 * lines of concurrent threads never interleave. Values with a space, a
 * quote, an equals sign, a backslash or a control character (or empty
 * ones) are quoted, with \" \\ \n \r \t and \u00XX escapes; a value too
 * long for the line is cut and ends with "...".
 */
#include "ops_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const LEVEL_NAME[] = {"debug", "info", "warn", "error"};

/* Set once by ops_log_init before any thread starts; read-only after. */
static ops_log_level_t log_min = OPS_LOG_INFO;
static const char     *log_cmd = "d3stream";

void ops_log_init(const char *cmd, ops_log_level_t min) {
    log_cmd = cmd;
    log_min = min;
}

const char *ops_log_cmd(void) {
    return log_cmd;
}

bool ops_log_level_parse(const char *s, ops_log_level_t *out) {
    for (int i = 0; i <= OPS_LOG_ERROR; i++)
        if (strcmp(s, LEVEL_NAME[i]) == 0) {
            *out = (ops_log_level_t)i;
            return true;
        }
    return false;
}

bool ops_log_level_opt(const char *cmd, const char *arg, ops_log_level_t *out) {
    if (ops_log_level_parse(arg, out))
        return true;
    ops_fail(cmd, "--log-level \"%s\": expected debug, info, warn or error", arg);
    return false;
}

bool ops_log_enabled(ops_log_level_t lv) {
    return lv >= log_min;
}

/* Appends raw bytes; the line is marked cut when they do not fit. */
static void put(ops_log_t *l, const char *s, size_t n) {
    size_t room = sizeof l->buf - 5 - l->len; /* "...\n" and NUL stay free */
    if (n > room) {
        n = room;
        l->cut = true;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static bool needs_quotes(const char *v) {
    if (!*v)
        return true;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f)
            return true;
    return false;
}

void ops_log_str(ops_log_t *l, const char *key, const char *v) {
    if (!l->on)
        return;
    if (!v)
        v = "";
    put(l, " ", 1);
    put(l, key, strlen(key));
    put(l, "=", 1);
    if (!needs_quotes(v)) {
        put(l, v, strlen(v));
        return;
    }
    put(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)v; *p && !l->cut; p++) {
        char esc[8];
        switch (*p) {
        case '"':
            put(l, "\\\"", 2);
            break;
        case '\\':
            put(l, "\\\\", 2);
            break;
        case '\n':
            put(l, "\\n", 2);
            break;
        case '\r':
            put(l, "\\r", 2);
            break;
        case '\t':
            put(l, "\\t", 2);
            break;
        default:
            if (*p < ' ' || *p == 0x7f) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                put(l, esc, 6);
            } else {
                put(l, (const char *)p, 1);
            }
        }
    }
    put(l, "\"", 1);
}

void ops_log_strf(ops_log_t *l, const char *key, const char *fmt, ...) {
    if (!l->on)
        return;
    char    v[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    ops_log_str(l, key, v);
}

void ops_log_int(ops_log_t *l, const char *key, long long v) {
    ops_log_strf(l, key, "%lld", v);
}

bool ops_log_begin(ops_log_t *l, ops_log_level_t lv, const char *msg) {
    l->len = 0;
    l->cut = false;
    l->on = ops_log_enabled(lv);
    if (!l->on)
        return false;
    struct timespec ts;
    struct tm       tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char t[64];
    int  n =
        snprintf(t, sizeof t, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    put(l, t, (size_t)n);
    put(l, " level=", 7);
    put(l, LEVEL_NAME[lv], strlen(LEVEL_NAME[lv]));
    ops_log_str(l, "cmd", log_cmd);
    ops_log_str(l, "msg", msg);
    return true;
}

void ops_log_end(ops_log_t *l) {
    if (!l->on)
        return;
    if (l->cut) {
        memcpy(l->buf + l->len, "...", 3);
        l->len += 3;
    }
    l->buf[l->len++] = '\n';
    const char *p = l->buf;
    size_t      left = l->len;
    while (left > 0) {
        ssize_t w = write(STDERR_FILENO, p, left);
        if (w <= 0)
            break;
        p += w;
        left -= (size_t)w;
    }
    l->on = false;
}

void ops_logf(ops_log_level_t lv, const char *fmt, ...) {
    if (!ops_log_enabled(lv))
        return;
    char    msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ops_log_t l;
    ops_log_begin(&l, lv, msg);
    ops_log_end(&l);
}
