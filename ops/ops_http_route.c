/*
 * ops_http_route.c -- the libmicrohttpd access handler of `d3stream http`:
 * routes and methods (SPEC f.1), the request body under its limit (SPEC
 * a.1: 413 from Content-Length before anything is read, or once a chunked
 * body grows past it), the shared body budget (bounded memory across
 * connections: 429 past it), and sending what ops_http_api.c decided.
 *
 * MHD calls the handler several times per request: first with the headers
 * (*req_cls NULL), then with each piece of the body, then once with none
 * (the body is complete), and again after a suspended connection is
 * resumed. A response may be queued only on the first or the last kind of
 * call.
 */
#include "ops_http_int.h"

#include "producer.h"

#include <stdarg.h>
#include <strings.h>
#include <time.h>

/* Bytes of a body past the limit that are read and dropped before the
 * connection is closed instead of answered (a client streaming forever). */
#define HTTP_DISCARD_MAX ((size_t)64 << 20)

double ops_http_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const struct {
    const char  *path;
    http_route_t route;
    bool         post; /* else GET (and HEAD) */
} ROUTES[] = {
    {"/v1/systemone", HTTP_R_SYSTEMONE, true},
    {"/v1/decisions", HTTP_R_DECISIONS, true},
    {"/v1/classify", HTTP_R_CLASSIFY, true},
    {"/v1/embeddings", HTTP_R_EMBEDDINGS, true},
    {"/v1/rerank", HTTP_R_RERANK, true},
    {"/v1/bundle", HTTP_R_BUNDLE, true},
    {"/v1/models", HTTP_R_MODELS, false},
    {"/v1/systemone/models", HTTP_R_SYSTEMONE_MODELS, false},
    {"/health", HTTP_R_HEALTH, false},
    {"/health/live", HTTP_R_HEALTH_LIVE, false},
    {"/metrics", HTTP_R_METRICS, false},
    {"/openapi.yaml", HTTP_R_OPENAPI, false},
};

/* ------------------------------------------------------------ the body budget */

/* Takes n bytes of the shared body budget for r; false when it is spent. */
static bool reserve(http_req_t *r, size_t n) {
    http_t *h = r->h;
    size_t  cur = atomic_load(&h->body_bytes);
    do {
        if (cur + n > h->o->body_budget || cur + n < cur)
            return false;
    } while (!atomic_compare_exchange_weak(&h->body_bytes, &cur, cur + n));
    r->reserved += n;
    return true;
}

/* Frees r's body and gives its budget back. */
static void drop_body(http_req_t *r) {
    svc_buf_fini(&r->body);
    svc_buf_init(&r->body, ops_max_request_bytes());
    if (r->reserved)
        atomic_fetch_sub(&r->h->body_bytes, r->reserved);
    r->reserved = 0;
}

/* ------------------------------------------------------------ responses */

/* "parse;dur=P, tokenize;dur=T, queue;dur=Q, forward;dur=F, post;dur=O,
 * serialize;dur=S, total;dur=X" (SPEC f.1): milliseconds, 3 decimals. */
static void server_timing(const http_req_t *r, char *buf, size_t size) {
    double total = (ops_http_now_s() - r->t0) * 1000.0;
    snprintf(buf, size,
             "parse;dur=%.3f, tokenize;dur=%.3f, queue;dur=%.3f, forward;dur=%.3f, "
             "post;dur=%.3f, serialize;dur=%.3f, total;dur=%.3f",
             r->parse_ms, r->tokenize_ms, r->queue_ms, r->forward_ms, 0.0, r->serialize_ms, total);
}

/* Queues r->out with r->status; MHD_NO closes the connection. */
static enum MHD_Result respond(http_req_t *r) {
    const char *type = r->type ? r->type : HTTP_JSON;
    drop_body(r);
    size_t      len = 0;
    char       *data = svc_buf_steal(&r->out, &len);
    const char *coding = NULL;
    if (data && len >= HTTP_COMPRESS_MIN) { /* Accept-Encoding: zstd or gzip */
        char  *z = NULL;
        size_t zn = 0;
        coding = ops_http_codec_pick(
            MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING));
        if (coding && ops_http_codec_compress(coding, data, len, &z, &zn) && zn < len) {
            free(data);
            data = z, len = zn;
        } else {
            free(z);
            coding = NULL;
        }
    }
    /* The answer is held until it is sent, by a client reading as slowly as
     * it likes: it counts against the body memory too (always taken, never
     * refused: it is written), so that a burst of large answers (an error
     * can echo its request several times over) holds back new bodies with
     * 429 instead of growing without bound. */
    r->out_held = len;
    atomic_fetch_add(&r->h->body_bytes, len);
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, data ? data : (void *)"", data ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(data);
        return MHD_NO;
    }
    char timing[320];
    (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (r->timed) {
        server_timing(r, timing, sizeof timing);
        (void)MHD_add_response_header(resp, "Server-Timing", timing);
    }
    if (r->status == 405)
        (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                                      r->route <= HTTP_R_BUNDLE ? "POST" : "GET, HEAD");
    if (r->status == 429)
        (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (r->status == 401) /* as SPEC f.2's frontend, with our realm */
        (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                      "Bearer realm=\"d3stream\"");
    (void)MHD_add_response_header(resp, "X-Request-Id", r->rid);
    if (coding)
        (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, coding);
    (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Accept-Encoding");
    if (atomic_load(&r->h->state) == HTTP_STOPPING)
        (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    r->phase = HTTP_P_SENT;
    enum MHD_Result ok = MHD_queue_response(r->con, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result send_json(http_req_t *r) {
    return respond(r);
}

/* Answers on the last call, once the (empty) body is read: a response
 * queued before that closes the connection, and these keep it alive. */
static enum MHD_Result later(http_req_t *r) {
    atomic_store(&r->phase, HTTP_P_DONE);
    return MHD_YES;
}

/* A GET route's body into r->out (sent by later()). */
static enum MHD_Result get(http_req_t *r) {
    switch (r->route) {
    case HTTP_R_MODELS:
    case HTTP_R_SYSTEMONE_MODELS:
        ops_http_models(r, r->route == HTTP_R_SYSTEMONE_MODELS);
        break;
    case HTTP_R_HEALTH:
    case HTTP_R_HEALTH_LIVE:
        ops_http_health(r, r->route == HTTP_R_HEALTH_LIVE);
        break;
    case HTTP_R_METRICS:
        if (!ops_http_metrics_text(r->h, &r->out)) {
            ops_http_error(r, 500, "internal_error", "MemoryError: the metrics text");
            break;
        }
        r->status = 200;
        r->type = "text/plain; version=0.0.4; charset=utf-8";
        break;
    default: /* HTTP_R_OPENAPI */
        svc_buf_reset(&r->out);
        if (svc_buf_add(&r->out, ops_openapi_yaml, ops_openapi_yaml_len)) {
            ops_http_error(r, 500, "internal_error", "MemoryError: the contract");
            break;
        }
        r->status = 200;
        r->type = "application/yaml";
        break;
    }
    return later(r);
}

/* ------------------------------------------------------------ the request */

/* Whether a refusal from the headers (413, 429) is sent before the body of
 * content_length bytes: only to a client that asked first (Expect:
 * 100-continue), or for a body too large even to read and drop. A reply
 * queued before the body is read closes the connection, and a client still
 * writing its body (Python's http.client, urllib) then gets a broken pipe
 * instead of the answer and its Retry-After. */
static bool answer_before_body(http_req_t *r, unsigned long long content_length) {
    const char *expect =
        MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return (expect && strcasecmp(expect, "100-continue") == 0) || content_length > HTTP_DISCARD_MAX;
}

/* --api-key-file: every route needs a key but the liveness probe, and
 * /metrics unless --metrics-need-key; r->key says which matched. */
static bool key_ok(http_req_t *r) {
    http_t *h = r->h;
    if (!h->keys || r->route == HTTP_R_HEALTH_LIVE ||
        (r->route == HTTP_R_METRICS && !h->o->metrics_need_key))
        return true;
    r->key = ops_http_keys_check(h->keys, r->con);
    return r->key > 0;
}

/* The first call: route, method, the limit from Content-Length. */
static enum MHD_Result begin(http_req_t *r, const char *url, const char *method) {
    http_t *h = r->h;
    size_t  i = 0, n = sizeof ROUTES / sizeof ROUTES[0];
    while (i < n && strcmp(url, ROUTES[i].path) != 0)
        i++;
    if (i == n) {
        r->route = HTTP_R_UNMATCHED;
        /* MHD decoded the path's %XX; bytes that are not UTF-8 become
         * U+FFFD, as uvicorn's unquote() makes them, so the body is JSON.
         * (A %00 ends the path here, where upstream keeps it.) */
        svc_buf_t path;
        svc_buf_init(&path, SIZE_MAX / 2);
        bool ok = !sch_py_utf8_replace(&path, url, strlen(url)) && !svc_buf_addc(&path, '\0');
        ops_http_error(r, 404, "invalid_request", "no route %s", ok ? path.data : "(?)");
        svc_buf_fini(&path);
        return later(r);
    }
    r->route = ROUTES[i].route;
    if (!key_ok(r)) {
        ops_http_error(r, 401, "invalid_api_key",
                       "a valid API key is required (Authorization: "
                       "Bearer KEY or Api-Key: KEY)");
        return later(r);
    }
    bool ok = ROUTES[i].post ? strcmp(method, MHD_HTTP_METHOD_POST) == 0
                             : strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                                   strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!ok) {
        ops_http_error(r, 405, "invalid_request", "method not allowed");
        return later(r);
    }
    if (!ROUTES[i].post)
        return get(r);
    r->timed = true;
    if (atomic_load(&h->state) == HTTP_STOPPING) {
        ops_http_error(r, 503, "not_ready", "the runtime is shutting down");
        return send_json(r);
    }
    const char *cl =
        MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    /* The SDK's image uploads: rewritten once the body is whole (finish). */
    if ((r->route == HTTP_R_SYSTEMONE || r->route == HTTP_R_DECISIONS) &&
        !ops_http_multipart_boundary(
            MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE),
            r->boundary, sizeof r->boundary))
        r->boundary[0] = '\0';
    const char *ce =
        MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    int crc = ce ? ops_http_codec_new(ce, ops_max_request_bytes(), &r->codec, r->coding_why,
                                      sizeof r->coding_why)
                 : 0;
    if (crc == -2) {
        ops_http_overloaded(r);
        return send_json(r);
    }
    if (crc == -1) { /* read, dropped, answered at the end (finish) */
        r->coding_status = 415;
        return MHD_YES;
    }
    if (cl) {
        char              *end = NULL;
        unsigned long long v = strtoull(cl, &end, 10);
        bool               now = answer_before_body(r, end != cl ? v : 0);
        if (end != cl && v > ops_max_request_bytes()) {
            if (!now) {
                r->too_large = true; /* read, dropped, answered at the end (finish) */
                return MHD_YES;
            }
            ops_http_error(r, 413, "request_too_large", "the request body exceeds %zu bytes",
                           ops_max_request_bytes());
            return send_json(r);
        }
        if (end != cl && v > 0 && (!reserve(r, (size_t)v) || svc_buf_reserve(&r->body, v))) {
            if (!now) {
                r->over_budget = true;
                drop_body(r);
                return MHD_YES;
            }
            ops_http_overloaded(r);
            return send_json(r);
        }
    }
    return MHD_YES;
}

/* n more bytes of the body (decoded, when it has a Content-Encoding)
 * under the limit and the budget; false once refused (the body dropped). */
static bool body_add(void *user, const char *data, size_t n) {
    http_req_t *r = user;
    if (r->body.len + n > ops_max_request_bytes())
        r->too_large = true;
    else if (r->body.len + n > r->reserved && !reserve(r, r->body.len + n - r->reserved))
        r->over_budget = true;
    else if (svc_buf_add(&r->body, data, n))
        r->over_budget = true;
    if (r->too_large || r->over_budget) {
        r->dropped = r->body.len + n;
        drop_body(r);
    }
    return !r->too_large && !r->over_budget;
}

/* A piece of the body; MHD_NO closes the connection. A compressed one is
 * decoded as it comes, so its limit is the decoded size's, decided while
 * inflating (ops_http_codec.c). */
static enum MHD_Result take(http_req_t *r, const char *data, size_t n) {
    if (r->too_large || r->over_budget || r->coding_status) {
        r->dropped += n;
        return r->dropped > HTTP_DISCARD_MAX ? MHD_NO : MHD_YES;
    }
    if (!r->codec) {
        (void)body_add(r, data, n);
        return MHD_YES;
    }
    if (ops_http_codec_feed(r->codec, data, n, body_add, r, r->coding_why, sizeof r->coding_why) <
        0) {
        r->coding_status = 400;
        r->dropped = n;
        drop_body(r);
    }
    return MHD_YES;
}

/* SPEC a.1 before a.2 1.: a body that is not JSON (or holds an unpaired
 * surrogate) gets its 400 even while the model loads; with or_not_object
 * also one that is not an object (a.2 2., which the other surfaces check
 * before their 422, as upstream reads every body first). True with that
 * error in r->out. */
static bool transport_error(http_req_t *r, bool or_not_object) {
    sch_request_t *req = NULL;
    char           why[256];
    int            http = 0;
    int rc = ops_decode_request(r->h->ask.pkg, r->h->ask.dir, 0, r->body.data ? r->body.data : "",
                                r->body.len, &req, &r->out, &http, why, sizeof why);
    sch_request_free(req);
    bool a1 = rc == OPS_EXIT_VERDICT && http == 400 && r->out.data &&
              (strstr(r->out.data, "\"message\":\"the request body is not JSON") ||
               strstr(r->out.data, "\"message\":\"the request contains an unpaired surrogate\"") ||
               (or_not_object &&
                strstr(r->out.data, "\"message\":\"the request body must be a JSON object\"")));
    if (a1)
        r->status = 400;
    return a1;
}

/* A multipart body rewritten into its JSON (ops_http_multipart.c), the
 * budget taken for what it grew by; false with the answer in r. */
static bool multipart(http_req_t *r) {
    char why[400];
    int  st = ops_http_multipart(r->boundary, &r->body, ops_max_request_bytes(), why, sizeof why);
    if (st) {
        ops_http_error(r, st,
                       st == 413   ? "request_too_large"
                       : st == 400 ? "invalid_request"
                                   : "internal_error",
                       "%s", why);
        return false;
    }
    if (r->body.len > r->reserved && !reserve(r, r->body.len - r->reserved)) {
        ops_http_overloaded(r);
        return false;
    }
    return true;
}

/* The body is complete: answer it now, or hand it to the engine. */
static enum MHD_Result finish(http_req_t *r) {
    http_t *h = r->h;
    if (!r->coding_status && !r->too_large && !r->over_budget && r->codec &&
        ops_http_codec_end(r->codec, r->coding_why, sizeof r->coding_why) < 0)
        r->coding_status = 400;
    if (r->coding_status) {
        ops_http_error(r, r->coding_status,
                       r->coding_status == 415 ? "unsupported_media_type" : "invalid_request", "%s",
                       r->coding_why);
        return send_json(r);
    }
    if (r->too_large) {
        ops_http_error(r, 413, "request_too_large", "the request body exceeds %zu bytes",
                       ops_max_request_bytes());
        return send_json(r);
    }
    if (r->over_budget) {
        ops_http_overloaded(r);
        return send_json(r);
    }
    if (r->boundary[0] && !multipart(r))
        return send_json(r);
    if (r->route != HTTP_R_SYSTEMONE && r->route != HTTP_R_DECISIONS) {
        const char *path = r->route == HTTP_R_CLASSIFY     ? "/v1/classify"
                           : r->route == HTTP_R_EMBEDDINGS ? "/v1/embeddings"
                           : r->route == HTTP_R_RERANK     ? "/v1/rerank"
                                                           : "/v1/bundle";
        if (!transport_error(r, true))
            ops_http_error(r, 422, "unsupported_surface", "model %s does not serve %s", h->label,
                           path);
        return send_json(r);
    }
    int state = atomic_load(&h->state);
    if (state == HTTP_STOPPING) {
        ops_http_error(r, 503, "not_ready", "the runtime is shutting down");
        return send_json(r);
    }
    if (state == HTTP_LOADING) {
        if (!transport_error(r, false))
            ops_http_error(r, 503, "not_ready", "model %s is loading", h->label);
        return send_json(r);
    }
    if (state == HTTP_REFUSED) {
        if (!transport_error(r, false))
            ops_http_error(r, 503, "not_ready",
                           "model %s failed its golden check and is not served (/health says why)",
                           h->label);
        return send_json(r);
    }
    if (!ops_http_intake_push(r)) { /* stopping, or the intake never started */
        ops_http_error(r, 503, "not_ready", "the runtime is shutting down");
        return send_json(r);
    }
    return MHD_YES; /* suspended: resumed with its answer */
}

/* The request id: the client's X-Request-Id when it is usable (1 to 128
 * visible ASCII characters: it goes into a header and the logs), else a
 * new one. */
static void request_id(http_req_t *r) {
    const char *v = MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, "X-Request-Id");
    size_t      n = v ? strlen(v) : 0;
    bool        ok = n > 0 && n < sizeof r->rid;
    for (size_t i = 0; ok && i < n; i++)
        ok = v[i] > ' ' && v[i] < 0x7f;
    if (ok) {
        memcpy(r->rid, v, n + 1);
        return;
    }
    char id[PROD_REQUEST_ID_LEN + 1];
    if (prod_request_id_new(id) == SVC_OK)
        snprintf(r->rid, sizeof r->rid, "%s", id);
    else
        snprintf(r->rid, sizeof r->rid, "-");
}

/* One line per request; the probes (health, metrics) at debug level. */
static void access_log(const http_req_t *r, int status, double total_s) {
    bool      probe = r->route >= HTTP_R_HEALTH && r->route <= HTTP_R_METRICS;
    ops_log_t l;
    if (!ops_log_begin(&l, probe ? OPS_LOG_DEBUG : OPS_LOG_INFO, "request"))
        return;
    ops_log_str(&l, "request_id", r->rid);
    ops_log_str(&l, "method", r->method);
    ops_log_str(&l, "path", r->path);
    ops_log_int(&l, "status", status);
    if (r->key) /* which key, never the key */
        ops_log_int(&l, "api_key", r->key);
    ops_log_strf(&l, "duration_ms", "%.3f", total_s * 1000.0);
    ops_log_end(&l);
}

enum MHD_Result ops_http_handler(void *cls, struct MHD_Connection *con, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **req_cls) {
    (void)version;
    http_t     *h = cls;
    http_req_t *r = *req_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->h = h;
        r->con = con;
        r->t0 = ops_http_now_s();
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        request_id(r);
        svc_buf_init(&r->body, ops_max_request_bytes());
        svc_buf_init(&r->out, SIZE_MAX / 2);
        atomic_fetch_add(&h->in_flight, 1);
        *req_cls = r;
        return begin(r, url, method);
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->phase != HTTP_P_READING) { /* answered already: dropped */
            r->dropped += n;
            return r->dropped > HTTP_DISCARD_MAX ? MHD_NO : MHD_YES;
        }
        return take(r, upload, n);
    }
    if (r->phase == HTTP_P_READING)
        return finish(r);
    if (atomic_load(&r->phase) == HTTP_P_DONE) {
        /* Its client hung up while it waited (the 499 of the log): closed
         * without an answer, which a client that only half-closed would
         * otherwise read as its answer. */
        if (atomic_load(&r->client_gone))
            return MHD_NO;
        return send_json(r);
    }
    return MHD_YES;
}

void ops_http_completed(void *cls, struct MHD_Connection *con, void **req_cls,
                        enum MHD_RequestTerminationCode toe) {
    (void)con;
    (void)toe;
    http_t     *h = cls;
    http_req_t *r = *req_cls;
    if (!r)
        return;
    *req_cls = NULL;
    /* A request that got no answer, or whose client hung up while it was
     * suspended (the watcher): the client went away (upstream records
     * 499), or the server stopped. */
    int    status = r->phase == HTTP_P_SENT && !atomic_load(&r->client_gone) ? r->status : 499;
    double total_s = ops_http_now_s() - r->t0;
    ops_http_count_request(h, r->route, status, total_s);
    access_log(r, status, total_s);
    drop_body(r);
    ops_http_codec_free(r->codec);
    if (r->out_held)
        atomic_fetch_sub(&h->body_bytes, r->out_held);
    svc_buf_fini(&r->body);
    svc_buf_fini(&r->out);
    sch_request_free(r->req);
    free(r);
    atomic_fetch_sub(&h->in_flight, 1);
}
