/*
 * ops_http.c -- `d3stream http`: the synchronous HTTP shim. It serves the
 * upstream worker's routes and bodies (SPEC f.1) and the frontend's
 * GET /v1/systemone/models (f.2) on one engine and one scheduler, with
 * libmicrohttpd (internal polling threads; a request waiting for the
 * engine is suspended and holds no thread).
 *
 * Start-up: the manifest check and the package's config come first (as
 * `ask`); then the server listens, answering /health with 503 and
 * decision requests with 503 not_ready while the weights load; then the
 * scheduler starts and the model is ready. SIGTERM or SIGINT: stop
 * accepting, answer what was received, exit 0.
 */
#include "ops_http_int.h"

#include "eng_manifest_int.h"
#include "npu.h"

#include <ctype.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

static const char HTTP_HELP[] =
    "Usage: d3stream http --model DIR [--listen HOST:PORT] [--workers N] [--max-queue N]\n"
    "                     [--max-queued-tokens N] [--max-connections N] [--timeout S]\n"
    "                     [--max-body-memory MIB] [--result-cache-entries N]\n"
    "                     [--result-cache-mib N] [--max-request-bytes N]\n"
    "                     [--no-verify] [--device auto|cpu|npu]\n"
    "                     [--log-level debug|info|warn|error]\n"
    "\n"
    "Serves the System One API of the upstream decision runtime over HTTP/1.1\n"
    "(keep-alive; chunked request bodies accepted) with the package in DIR, on the\n"
    "same engine and scheduler as `serve`: questions of concurrent requests run\n"
    "together on the worker threads. Bodies and statuses follow SPEC.md (a.1, b.7,\n"
    "f.1).\n"
    "\n"
    "Routes:\n"
    "  POST /v1/systemone      a System One request -> the response body `ask` prints\n"
    "  POST /v1/decisions      the same handler\n"
    "  POST /v1/classify, /v1/embeddings, /v1/rerank, /v1/bundle\n"
    "                          422 unsupported_surface (decision3 serves decisions)\n"
    "  GET  /v1/models         {\"object\":\"list\",\"api_version\",\"data\":[model "
    "card],\"limits\"}\n"
    "  GET  /v1/systemone/models  "
    "{\"object\":\"list\",\"data\":[{\"id\",\"object\",\"api\",\"routing\"}]}\n"
    "  GET  /health            200 ready, 503 loading or stopping:\n"
    "                          {\"api_version\",\"status\",\"reason\",\"model\"}\n"
    "  GET  /health/live       200 {\"api_version\",\"status\":\"alive\"}\n"
    "  GET  /metrics           Prometheus text: requests by route and status, questions by\n"
    "                          outcome, input tokens, latency histograms (queue, forward,\n"
    "                          total), engine queue depth and counters, connections, model,\n"
    "                          device (d3stream_device_info)\n"
    "  GET  /openapi.yaml      the OpenAPI 3.0 contract of these routes\n"
    "  GET routes answer HEAD too.\n"
    "\n"
    "Statuses of the decision routes ({\"error\":{\"code\",\"message\"}} unless 200):\n"
    "  200  answered; a question that failed carries its own error (SPEC b.6)\n"
    "  400  invalid_request: not UTF-8 or not JSON, a request-level rule, every\n"
    "       question invalid\n"
    "  404  model_not_found: \"model\" names another model\n"
    "  413  request_too_large: Content-Length over --max-request-bytes (answered before the\n"
    "       body is read to a client that sent Expect: 100-continue, else after it),\n"
    "       or a chunked body growing past it\n"
    "  422  unsupported_surface: the other surfaces\n"
    "  429  overloaded: the engine's queue is full, or the memory for request\n"
    "       bodies (--max-body-memory) is spent; retry later (Retry-After: 1); or\n"
    "       the request's own prompts hold more than --max-queued-tokens tokens\n"
    "  499  (logs and /metrics only) the client hung up first: a request it left\n"
    "       waiting for the engine is withdrawn, its questions not begun not run\n"
    "  500  internal_error: the engine failed, or the model gave a non-finite number\n"
    "  503  not_ready: the model is loading, or the server is shutting down\n"
    "  Every decision-route response carries Server-Timing: parse, tokenize, queue,\n"
    "  forward, post, serialize, total (milliseconds). An unknown path answers 404 and\n"
    "  a known path with another method 405, both {\"error\":{\"code\":\"invalid_request\"}}.\n"
    "  The Content-Type of a request is not checked (as upstream).\n"
    "\n"
    "  --model DIR           the decision3 package, checked and loaded as `ask` does\n"
    "  --listen HOST:PORT    address to listen on (default 127.0.0.1:52625; port 0\n"
    "                        picks a free one; [::1]:PORT for IPv6). The address is\n"
    "                        printed on stderr once listening\n"
    "  --workers N           engine threads (default: the online CPUs)\n"
    "  --max-queue N         jobs admitted to the engine and not answered (default\n"
    "                        256, as upstream; a job is one state of a request, its\n"
    "                        questions with it); past it requests get 429 overloaded\n"
    "  --max-queued-tokens N prompt tokens of those jobs (default 4194304, as\n"
    "                        upstream); past it requests get 429 too. An empty queue\n"
    "                        takes any request (upstream refuses more states than\n"
    "                        --max-queue even then) but one whose own prompts hold\n"
    "                        more than N tokens: 429 at once, it never fits\n"
    "  --max-connections N   open connections (default 1024, lowered to fit the\n"
    "                        open-file limit); more are accepted and closed at once\n"
    "  --timeout S           idle connection timeout in seconds (default 30): slow or\n"
    "                        silent clients are disconnected\n"
    "  --max-body-memory MIB request bodies and answers held at once, in MiB\n"
    "                        (default 256; at least 8, so that one body of the\n"
    "                        largest size fits); past it new bodies get 429\n" OPS_CACHE_HELP
        OPS_MAX_REQUEST_HELP
    "  --no-verify           skip the manifest check (a warning is printed)\n"
    "  --no-golden           skip the golden check (a warning is printed). By default\n"
    "                        the golden request (SPEC f.1) runs after the load on\n"
    "                        the kernels that serve and on an fp32 reference that\n"
    "                        reads the weights again; a difference past the tests'\n"
    "                        tolerances keeps /health at 503 with the reason (never\n"
    "                        ready; exit 3 on SIGTERM)\n" OPS_ALIAS_HELP OPS_PROFILE_HELP
        OPS_Q4NX_LAYOUT_HELP OPS_DEVICE_HELP
    "  --api-key-file FILE   require an API key on every route but /health/live (and\n"
    "                        /metrics unless --metrics-need-key): the file's keys,\n"
    "                        one a line ('#' comments), read again on SIGHUP; sent\n"
    "                        as Authorization: Bearer KEY or Api-Key: KEY, else 401\n"
    "                        invalid_api_key. Keys are never logged (their position\n"
    "                        in the file is)\n"
    "  --metrics-need-key    /metrics needs a key too\n"
    "  --tls-cert FILE       serve HTTPS (TLS 1.2 and 1.3, GnuTLS through\n"
    "  --tls-key FILE        libmicrohttpd) with this PEM certificate (chain) and key\n"
    "  --log-level L         debug, info (default), warn or error: the lowest level of\n"
    "                        the log lines written\n"
    "  --config FILE         options from a YAML file (default $D3STREAM_CONFIG)\n"
    "\n"
    "Configuration: every option can also come from the --config file (its long name\n"
    "as the key: listen: 127.0.0.1:52625, workers: 2; an http: section applies to\n"
    "http only) or from the environment (D3STREAM_LISTEN, D3STREAM_NO_VERIFY=true,\n"
    "...). Flags win over the environment, which wins over the file; a boolean the\n"
    "file turns on is turned off by its variable set to false. `d3stream config http\n"
    "[options]` prints the result with each value's origin.\n"
    "\n"
    "Logs: logfmt lines on stderr (ts=... level=info cmd=http msg=... key=value ...).\n"
    "Every HTTP request gets one line, msg=request, with method, path, status,\n"
    "request_id (the X-Request-Id header when the client sent a usable one, else a\n"
    "new id; echoed in the response's X-Request-Id) and duration_ms; the probes\n"
    "(/health, /health/live, /metrics) at debug level, the rest at info.\n"
    "\n"
    "SIGTERM or SIGINT: stop accepting connections, answer every request already\n"
    "received (new requests on open connections get 503), exit 0.\n"
    "\n"
    "Exit status: 0 stopped by a signal, 2 usage, 3 the package failed its checks\n"
    "or could not be loaded, or the address could not be listened on.\n";

#define HTTP_DRAIN_S 60.0

/* ------------------------------------------------------------ listening */

bool ops_http_parse_listen(const char *arg, http_opts_t *o) {
    const char *colon = strrchr(arg, ':');
    if (!colon || colon == arg)
        return false;
    const char *h = arg;
    size_t      n = (size_t)(colon - arg);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    char              *end = NULL;
    unsigned long long port = strtoull(colon + 1, &end, 10);
    /* A digit first: strtoull also takes " 5", "+5" and "-5". */
    if (n == 0 || n >= sizeof o->host || !isdigit((unsigned char)colon[1]) || *end || port > 65535)
        return false;
    memcpy(o->host, h, n);
    o->host[n] = '\0';
    o->port = (int)port;
    return true;
}

/* TLS 1.2 and 1.3 only (GnuTLS priorities: its NORMAL set, other versions
 * removed). */
#define HTTP_TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

static struct MHD_Daemon *start_daemon(http_t *h, const struct addrinfo *ai, const char *cert,
                                       const char *key) {
    /* poll(), not MHD_USE_AUTO_INTERNAL_THREAD's epoll: with epoll and its
     * own threads, MHD_quiesce_daemon (the stop) races its pool threads to
     * take the listen socket out of their epoll sets, and the loser's
     * epoll_ctl gets ENOENT, which libmicrohttpd 0.9.75 answers with
     * MHD_PANIC: abort() ("Failed to remove listen FD from epoll set"; an
     * open defect, seen in CI as an http test's server killed by SIGABRT
     * on SIGTERM). With poll() the quiesce only signals the threads. Our
     * connections are bounded by --max-connections, so poll()'s cost per
     * connection is small beside a request's. */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_OptionItem tls[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)(uintptr_t)cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)(uintptr_t)key},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)(uintptr_t)HTTP_TLS_PRIORITIES},
        {MHD_OPTION_END, 0, NULL},
    };
    if (cert)
        flags |= MHD_USE_TLS;
    else
        tls[0].option = MHD_OPTION_END;
    /* The address is MHD_OPTION_SOCK_ADDR's; the port is passed too only
     * because MHD's own bind-failure message names it. */
    uint16_t port = ai->ai_family == AF_INET6
                        ? ntohs(((const struct sockaddr_in6 *)ai->ai_addr)->sin6_port)
                        : ntohs(((const struct sockaddr_in *)ai->ai_addr)->sin_port);
    return MHD_start_daemon(
        flags, port, NULL, NULL, ops_http_handler, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_THREAD_POOL_SIZE, 2u, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)h->o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, h->o->timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, ops_http_completed, h, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
}

/* --tls-cert and --tls-key read (PEM text for MHD); false after saying
 * why. Both NULL without TLS. */
static bool tls_read(const http_t *h, char **cert, char **key) {
    const http_opts_t *o = h->o;
    *cert = *key = NULL;
    if (!o->tls_cert)
        return true;
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        ops_fail(h->c.cmd, "--tls-cert: this libmicrohttpd was built without TLS");
        return false;
    }
    const char *paths[2] = {o->tls_cert, o->tls_key};
    char      **out[2] = {cert, key};
    for (size_t i = 0; i < 2; i++) {
        svc_buf_t b;
        char      why[512];
        svc_buf_init(&b, (size_t)1 << 20);
        if (svc_buf_read_file(&b, paths[i], why, sizeof why) || svc_buf_addc(&b, '\0')) {
            ops_fail(h->c.cmd, "--%s: %s", i ? "tls-key" : "tls-cert", why);
            svc_buf_fini(&b);
            free(*cert);
            *cert = NULL;
            return false;
        }
        size_t n;
        *out[i] = svc_buf_steal(&b, &n);
    }
    return true;
}

/* Listens on o->host:o->port; false (after saying why) when it cannot. */
static bool http_listen(http_t *h) {
    const http_opts_t *o = h->o;
    char              *cert = NULL, *key = NULL;
    if (!tls_read(h, &cert, &key))
        return false;
    struct addrinfo  hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char             port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        ops_fail(h->c.cmd, "--%s %s:%d: %s", strcmp(h->c.cmd, "http") ? "http" : "listen", o->host,
                 o->port, gai_strerror(gai));
        free(cert);
        free(key);
        return false;
    }
    h->mhd = start_daemon(h, ai, cert, key);
    freeaddrinfo(ai);
    if (key) /* MHD keeps its own copy */
        explicit_bzero(key, strlen(key));
    free(cert);
    free(key);
    if (!h->mhd) {
        ops_fail(h->c.cmd,
                 o->tls_cert ? "cannot listen on %s:%d (in use, not an address of this machine, or "
                               "a certificate and key that do not load: see the line above)"
                             : "cannot listen on %s:%d (in use, or not an address of this machine)",
                 o->host, o->port);
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    bool                        v6 = strchr(o->host, ':') != NULL;
    ops_log_t                   l;
    char                        msg[512];
    snprintf(msg, sizeof msg, "listening on http%s://%s%s%s:%u", o->tls_cert ? "s" : "",
             v6 ? "[" : "", o->host, v6 ? "]" : "", di ? (unsigned)di->port : (unsigned)o->port);
    if (ops_log_begin(&l, OPS_LOG_INFO, msg)) {
        ops_log_str(&l, "model", h->label);
        ops_log_end(&l);
    } else {
        /* --help promises the address whatever the log level (--listen
         * HOST:0 picks the port: scripts read it here). */
        fprintf(stderr, "d3stream %s: %s\n", h->c.cmd, msg);
    }
    return true;
}

/* ------------------------------------------------------------ the server */

/* The card's device; cut to the field (the label is ~200 bytes). */
static void device_label(http_t *h) {
    svc_buf_t b;
    svc_buf_init(&b, sizeof h->device - 1);
    if (ops_device_label(&b) == SVC_OK || b.len)
        snprintf(h->device, sizeof h->device, "%s", b.data);
    else
        snprintf(h->device, sizeof h->device, "%s", ops_device_accelerator());
    svc_buf_fini(&b);
}

void ops_http_opts_default(http_opts_t *o) {
    *o = (http_opts_t){.host = "127.0.0.1",
                       .port = 52625,
                       .max_queue = ENG_SCHED_MAX_JOBS,
                       .max_queued_tokens = ENG_SCHED_MAX_TOKENS,
                       .max_connections = 1024,
                       .timeout_s = 30,
                       .body_budget = (size_t)256 << 20,
                       .cache_entries = ENG_SCHED_CACHE_ENTRIES,
                       .cache_mib = ENG_SCHED_CACHE_BYTES >> 20};
}

eng_sched_conf_t ops_sched_conf(const http_opts_t *o, const char *identity) {
    return (eng_sched_conf_t){.n_workers = o->workers,
                              .max_jobs = o->max_queue,
                              .max_tokens = o->max_queued_tokens,
                              .cache_entries = o->cache_entries,
                              .cache_bytes = o->cache_mib << 20,
                              .identity = identity && *identity ? identity : NULL};
}

int ops_cache_opt(const char *cmd, bool mib, const char *arg, http_opts_t *o) {
    if (!mib && strcmp(arg, "0") == 0) {
        o->cache_entries = 0;
        return -1;
    }
    if (mib)
        return ops_count_opt(cmd, "result-cache-mib", arg, 1u << 20, &o->cache_mib)
                   ? -1
                   : OPS_EXIT_USAGE;
    return ops_count_opt(cmd, "result-cache-entries", arg, (size_t)1 << 32, &o->cache_entries)
               ? -1
               : OPS_EXIT_USAGE;
}

/* The connection limit must leave file descriptors for the package and
 * the engine: raise the soft limit to the hard one, then fit under it. It
 * only ever lowers want: with a low limit the floor of 64 is above a small
 * --max-connections, which must stay as given. */
static size_t fit_connections(size_t want, const char *cmd) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return want;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want + 64) {
        size_t fit = rl.rlim_cur > 128 ? (size_t)rl.rlim_cur - 64 : 64;
        if (fit >= want)
            return want;
        fprintf(stderr,
                "d3stream %s: --max-connections %zu lowered to %zu (open-file limit %llu)\n", cmd,
                want, fit, (unsigned long long)rl.rlim_cur);
        return fit;
    }
    return want;
}

/* Whether a --max-body-memory of mib MiB (shown as given) holds one
 * request body of the largest size; says why not. Below that a request
 * could be refused 429 for ever, so it is a usage error rather than
 * silently raised. */
static bool body_memory_fits(const char *cmd, size_t mib, const char *shown) {
    size_t body = ops_max_request_bytes(), min = (body + (1u << 20) - 1) >> 20;
    if (mib >= min)
        return true;
    ops_fail(cmd,
             "--max-body-memory \"%s\": at least %zu (MiB: one request body of the largest "
             "size, %zu bytes (--max-request-bytes), must fit)",
             shown, min, body);
    return false;
}

bool ops_http_opts_finish(http_opts_t *o, const char *cmd) {
    char   shown[32];
    size_t body = ops_max_request_bytes();
    snprintf(shown, sizeof shown, "%zu", o->body_budget >> 20);
    if (o->body_budget_set && !body_memory_fits(cmd, o->body_budget >> 20, shown))
        return false;
    if (o->body_budget < body) /* the default: one body always fits */
        o->body_budget = (body + (1u << 20) - 1) >> 20 << 20;
    if (!o->tls_cert != !o->tls_key) {
        ops_fail(cmd, "--tls-cert and --tls-key go together");
        return false;
    }
    o->max_connections = fit_connections(o->max_connections, cmd);
    return true;
}

http_t *ops_http_start(const http_opts_t *o, const ops_ask_t *ask, const http_conf_t *c) {
    http_t *h = calloc(1, sizeof *h);
    if (!h) {
        ops_fail(c->cmd, "out of memory");
        return NULL;
    }
    h->o = o;
    h->listen_fd = -1;
    h->c = *c;
    h->ask = *ask;
    h->ask.model = NULL;
    h->label = eng_package_model_id(ask->pkg);
    pthread_mutex_init(&h->lock, NULL);
    atomic_init(&h->state, HTTP_LOADING);
    atomic_init(&h->in_flight, 0);
    atomic_init(&h->in_engine, 0);
    atomic_init(&h->in_intake, 0);
    atomic_init(&h->body_bytes, 0);
    device_label(h);
    char why[512];
    if (o->api_key_file && !(h->keys = ops_http_keys_new(o->api_key_file, why, sizeof why))) {
        ops_fail(c->cmd, "%s", why);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    if (h->keys)
        ops_logf(OPS_LOG_INFO, "API keys required: %zu from --api-key-file",
                 ops_http_keys_count(h->keys));
    if (!ops_http_intake_start(h))
        ops_logf(OPS_LOG_ERROR, "cannot start the HTTP intake threads: decision requests get 503");
    if (!http_listen(h)) {
        ops_http_intake_free(h);
        ops_http_keys_free(h->keys);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    return h;
}

void ops_http_reload_keys(http_t *h) {
    char   why[512];
    size_t n = 0;
    if (!h->keys)
        ops_logf(OPS_LOG_INFO, "SIGHUP: no --api-key-file to read again");
    else if (ops_http_keys_reload(h->keys, &n, why, sizeof why))
        ops_logf(OPS_LOG_INFO, "SIGHUP: %zu API keys in force", n);
    else
        ops_logf(OPS_LOG_ERROR, "SIGHUP: %s; the keys in force stay", why);
}

void ops_http_golden(http_t *h, const ops_golden_t *g) {
    pthread_mutex_lock(&h->lock);
    h->golden = *g;
    pthread_mutex_unlock(&h->lock);
    if (g->state == OPS_GOLDEN_FAILED)
        atomic_store(&h->state, HTTP_REFUSED);
}

void ops_http_ready(http_t *h, const eng_model_t *model, eng_sched_t *sched) {
    h->ask.model = model;
    h->sched = sched;
    atomic_store(&h->state, HTTP_READY);
}

void ops_http_quiesce(http_t *h) {
    atomic_store(&h->state, HTTP_STOPPING);
    if (h->quiesced)
        return;
    h->quiesced = true;
    /* Not closed here: MHD's pool threads may still be polling it when
     * the quiesce returns (they see the quiesce on their next wake-up),
     * and libmicrohttpd's manual says to close it only after
     * MHD_stop_daemon. */
    MHD_socket lfd = MHD_quiesce_daemon(h->mhd);
    h->listen_fd = lfd != MHD_INVALID_SOCKET ? lfd : -1;
}

bool ops_http_drain(http_t *h, double s) {
    double end = ops_http_now_s() + s;
    while (atomic_load(&h->in_flight) > 0) {
        if (ops_http_now_s() > end)
            return false;
        usleep(10000);
    }
    return true;
}

void ops_http_free(http_t *h) {
    if (!h)
        return;
    MHD_stop_daemon(h->mhd);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    ops_http_intake_free(h);
    ops_http_keys_free(h->keys);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* ------------------------------------------------------------ running */

/* Loads the weights, checks them (golden) and starts the scheduler;
 * false after saying why (a failed golden check: h refuses to serve). */
static bool http_load(const http_opts_t *o, http_t *h, eng_model_t **model, eng_sched_t **sched) {
    const ops_ask_t *ask = &h->ask;
    char             errstr[1024] = "";
    if (eng_model_load_with(o->dir, &o->load, model, errstr, sizeof errstr) ||
        eng_model_check_package(*model, ask->pkg, errstr, sizeof errstr) ||
        (!o->no_verify && eng_model_check_parameters(*model, o->dir, errstr, sizeof errstr))) {
        ops_fail("http", "%s", errstr);
        return false;
    }
    ops_warn_dnnl();
    ops_ask_t    a = {ask->pkg, *model, o->dir, ask->model_sha256};
    ops_golden_t g;
    bool         ok = ops_golden_run("http", &a, *model, &o->load, o->no_golden, &g);
    ops_http_golden(h, &g);
    if (!ok)
        return false;
    eng_sched_conf_t sc = ops_sched_conf(o, ask->model_sha256);
    if (eng_sched_new(ask->pkg, *model, &sc, sched, errstr, sizeof errstr)) {
        ops_fail("http", "engine: %s", errstr);
        return false;
    }
    return true;
}

/* Listens, loads, serves until a signal; returns the exit status. */
static int http_run(const http_opts_t *o, const ops_ask_t *ask, const sigset_t *sigs) {
    http_conf_t  c = {.cmd = "http", .mode = "http"};
    http_t      *h = ops_http_start(o, ask, &c);
    eng_model_t *model = NULL;
    eng_sched_t *sched = NULL;
    int          rc = OPS_EXIT_FAILURE;
    if (!h)
        return OPS_EXIT_FAILURE;
    double t = ops_http_now_s();
    if (http_load(o, h, &model, &sched)) {
        ops_http_ready(h, model, sched);
        ops_logf(OPS_LOG_INFO, "ready (model loaded in %.1f s)", ops_http_now_s() - t);
        int sig = 0;
        while (sigwait(sigs, &sig) != 0 || (sig != SIGTERM && sig != SIGINT))
            if (sig == SIGHUP)
                ops_http_reload_keys(h);
        ops_logf(OPS_LOG_INFO, "%s: stopping (finishing %zu requests)",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", atomic_load(&h->in_flight));
        rc = OPS_EXIT_OK;
    } else if (atomic_load(&h->state) == HTTP_REFUSED) {
        /* Up, never ready: /health and the card say why until stopped. */
        ops_logf(OPS_LOG_ERROR, "not serving: the golden check failed (/health says why); "
                                "exits 3 on SIGTERM");
        int sig = 0;
        while (sigwait(sigs, &sig) != 0 || (sig != SIGTERM && sig != SIGINT))
            if (sig == SIGHUP)
                ops_http_reload_keys(h);
    }
    ops_http_quiesce(h);
    if (!ops_http_drain(h, HTTP_DRAIN_S))
        ops_logf(OPS_LOG_WARN, "%zu requests still open after %.0f s", atomic_load(&h->in_flight),
                 HTTP_DRAIN_S);
    /* No submit may be running when the scheduler is freed; then it
     * finishes whatever it still holds (done resumes those connections),
     * so that no connection is suspended when MHD stops. */
    ops_http_release_engine(h);
    eng_sched_free(sched);
    (void)ops_http_drain(h, 5.0);
    ops_http_free(h);
    eng_model_free(model);
    ops_logf(OPS_LOG_INFO, "stopped");
    return rc;
}

/* Verify and open (as `ask`), then serve. */
static int http_package(const http_opts_t *o) {
    char sha[ENG_SHA256_HEX + 1];
    int  rc = ops_ask_verify_as("http", o->dir, o->no_verify, sha);
    if (rc != OPS_EXIT_OK)
        return rc;
    ops_chat_template_warn("http", o->dir);
    char           errstr[1024];
    eng_package_t *pkg = NULL;
    if (eng_package_open(o->dir, &pkg, errstr, sizeof errstr)) {
        ops_fail("http", "%s", errstr);
        return OPS_EXIT_FAILURE;
    }
    /* Signals are taken by sigwait on this thread only: every thread
     * started from here on (MHD's, the engine's) inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP); /* --api-key-file read again */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    ops_ask_t ask = {pkg, NULL, o->dir, sha};
    rc = http_run(o, &ask, &sigs);
    eng_package_free(pkg);
    return rc;
}

/* ------------------------------------------------------------ options */

enum {
    O_LISTEN = 256,
    O_WORKERS,
    O_QUEUE,
    O_QTOKENS,
    O_CONNS,
    O_TIMEOUT,
    O_BODYMEM,
    O_NOVERIFY,
    O_LOGLEVEL,
    O_LAYOUT,
    O_PROFILE,
    O_RCACHE,
    O_RCACHE_MIB,
    O_MAXREQ
};

static const struct option HTTP_OPTS[] = {
    {"model", required_argument, NULL, 'm'},
    {"listen", required_argument, NULL, O_LISTEN},
    {"workers", required_argument, NULL, O_WORKERS},
    {"max-queue", required_argument, NULL, O_QUEUE},
    {"max-queued-tokens", required_argument, NULL, O_QTOKENS},
    {"max-connections", required_argument, NULL, O_CONNS},
    {"timeout", required_argument, NULL, O_TIMEOUT},
    {"max-body-memory", required_argument, NULL, O_BODYMEM},
    {"no-verify", no_argument, NULL, O_NOVERIFY},
    OPS_EDGE_OPTIONS,
    {"log-level", required_argument, NULL, O_LOGLEVEL},
    {"q4nx-layout", required_argument, NULL, O_LAYOUT},
    {"profile", required_argument, NULL, O_PROFILE},
    {"result-cache-entries", required_argument, NULL, O_RCACHE},
    {"result-cache-mib", required_argument, NULL, O_RCACHE_MIB},
    {"max-request-bytes", required_argument, NULL, O_MAXREQ},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* --max-body-memory MIB: checked here against the request limit so far,
 * so that a value from the file or the environment is named by its origin
 * (ops_config_blame), and again by ops_http_opts_finish once a later
 * --max-request-bytes is known. */
static int body_memory_opt(const char *arg, http_opts_t *o) {
    size_t v;
    if (!ops_count_opt("http", "max-body-memory", arg, 1u << 20, &v) ||
        !body_memory_fits("http", v, arg))
        return OPS_EXIT_USAGE;
    o->body_budget = v << 20;
    o->body_budget_set = true;
    return -1;
}

/* One option; -1 to go on, else the exit status. */
int ops_http_edge_opt(int c, const char *cmd, const char *arg, http_opts_t *o) {
    switch (c) {
    case OPS_EDGE_NOGOLDEN:
        o->no_golden = true;
        return -1;
    case OPS_EDGE_ALIAS:
        return ops_model_alias_opt(cmd, arg);
    case OPS_EDGE_NODEFALIAS:
        ops_no_default_alias();
        return -1;
    case OPS_EDGE_KEYFILE:
        o->api_key_file = arg;
        return -1;
    case OPS_EDGE_METRICSKEY:
        o->metrics_need_key = true;
        return -1;
    case OPS_EDGE_TLSCERT:
        o->tls_cert = arg;
        return -1;
    case OPS_EDGE_TLSKEY:
        o->tls_key = arg;
        return -1;
    case OPS_EDGE_DEVICE:
        return ops_device_opt(cmd, arg);
    default:
        return -2;
    }
}

static int http_opt(int c, const char *arg, http_opts_t *o, ops_log_level_t *lv) {
    size_t v;
    switch (c) {
    case 'm':
        o->dir = arg;
        return -1;
    case O_LISTEN:
        if (ops_http_parse_listen(arg, o))
            return -1;
        ops_fail("http", "--listen \"%s\": expected HOST:PORT (e.g. 127.0.0.1:52625)", arg);
        return OPS_EXIT_USAGE;
    case O_WORKERS:
        return ops_count_opt("http", "workers", arg, 256, &o->workers) ? -1 : OPS_EXIT_USAGE;
    case O_QUEUE:
        return ops_count_opt("http", "max-queue", arg, 1u << 20, &o->max_queue) ? -1
                                                                                : OPS_EXIT_USAGE;
    case O_QTOKENS:
        return ops_count_opt("http", "max-queued-tokens", arg, (size_t)1 << 40,
                             &o->max_queued_tokens)
                   ? -1
                   : OPS_EXIT_USAGE;
    case O_CONNS:
        return ops_count_opt("http", "max-connections", arg, 1u << 20, &o->max_connections)
                   ? -1
                   : OPS_EXIT_USAGE;
    case O_TIMEOUT:
        if (!ops_count_opt("http", "timeout", arg, 3600, &v))
            return OPS_EXIT_USAGE;
        o->timeout_s = (unsigned)v;
        return -1;
    case O_BODYMEM:
        return body_memory_opt(arg, o);
    case O_NOVERIFY:
        o->no_verify = true;
        return -1;
    case O_LOGLEVEL:
        return ops_log_level_opt("http", arg, lv) ? -1 : OPS_EXIT_USAGE;
    case O_LAYOUT:
        return ops_q4nx_layout_opt("http", arg, &o->load);
    case O_PROFILE:
        return ops_profile_opt("http", arg);
    case O_RCACHE:
    case O_RCACHE_MIB:
        return ops_cache_opt("http", c == O_RCACHE_MIB, arg, o);
    case O_MAXREQ:
        return ops_max_request_opt("http", arg);
    case 'h':
        fputs(HTTP_HELP, stdout);
        return OPS_EXIT_OK;
    default: {
        int rc = ops_http_edge_opt(c, "http", arg, o);
        if (rc != -2)
            return rc;
        fputs(HTTP_HELP, stderr);
        return OPS_EXIT_USAGE;
    }
    }
}

static int http_main(const ops_config_t *cfg) {
    http_opts_t     o;
    ops_log_level_t lv = OPS_LOG_INFO;
    int             c, rc = -1, argc = cfg->argc;
    char          **argv = cfg->argv;
    ops_http_opts_default(&o);
    optind = 1;
    while (rc < 0 && (c = getopt_long(argc, argv, "m:h", HTTP_OPTS, NULL)) != -1)
        rc = http_opt(c, optarg, &o, &lv);
    ops_config_blame(cfg, "http", rc, optarg);
    if (rc < 0 && (!o.dir || optind != argc)) {
        ops_fail("http", "--model DIR is required (and no other operand): see --help");
        rc = OPS_EXIT_USAGE;
    }
    if (rc < 0 && !ops_http_opts_finish(&o, "http"))
        rc = OPS_EXIT_USAGE;
    if (rc >= 0)
        return rc;
    ops_log_init("http", lv);
    if ((rc = ops_device_choose("http")) >= 0)
        return rc;
    return http_package(&o);
}

int ops_cmd_http(int argc, char **argv) {
    ops_config_t cfg;
    int          rc = ops_config_argv("http", argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    rc = http_main(&cfg);
    ops_config_fini(&cfg);
    return rc;
}
