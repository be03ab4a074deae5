/*
 * ops_http_int.h -- what the parts of `d3stream http` share (private):
 * ops_http.c (options, set-up, load, shutdown; the server as a part that
 * `serve --http` starts too: ops_http_start below), ops_http_route.c (the
 * libmicrohttpd access handler: routes, methods, bodies, limits),
 * ops_http_api.c (the POST /v1/systemone way through the scheduler and the
 * GET bodies) and ops_http_metrics.c (counters and GET /metrics).
 *
 * Threads: libmicrohttpd's internal polling thread(s) run the handler and
 * the completion callback; a decision request's connection is suspended
 * and the request decoded and submitted on an intake thread
 * (ops_http_intake.c: why), where a watcher also notices clients that hang
 * up; the scheduler's done callback runs on an engine worker thread and
 * touches only its own request and the counters (under http_t.lock), then
 * resumes the suspended connection.
 */
#ifndef D3STREAM_OPS_HTTP_INT_H
#define D3STREAM_OPS_HTTP_INT_H

#include "ops_int.h"

#include "schemas.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#define HTTP_API_VERSION "2.3.0"
#define HTTP_JSON        "application/json"
/* Threads that decode and submit decision requests (ops_http_intake.c):
 * two, so that one body of large images does not hold up every other. */
#define HTTP_INTAKE_THREADS 2

typedef struct http_opts {
    const char     *dir;
    char            host[256];
    int             port;
    bool            no_verify;
    bool            no_golden; /* --no-golden */
    eng_load_opts_t load;      /* --q4nx-layout */
    size_t          workers, max_queue, max_queued_tokens, max_connections, body_budget;
    unsigned        timeout_s; /* idle connection timeout */
    /* --result-cache-entries (0: no reuse) and --result-cache-mib */
    size_t      cache_entries, cache_mib;
    bool        body_budget_set;    /* --max-body-memory given */
    const char *api_key_file;       /* --api-key-file: keys required; NULL: open */
    bool        metrics_need_key;   /* --metrics-need-key */
    const char *tls_cert, *tls_key; /* --tls-cert, --tls-key (PEM files): HTTPS */
} http_opts_t;

/* ---- the options of the HTTP edge that http and serve share ----
 * Their getopt codes (past both commands' own) and table entries, parsed
 * by ops_http_edge_opt. */
enum {
    OPS_EDGE_NOGOLDEN = 1024,
    OPS_EDGE_ALIAS,
    OPS_EDGE_NODEFALIAS,
    OPS_EDGE_KEYFILE,
    OPS_EDGE_METRICSKEY,
    OPS_EDGE_TLSCERT,
    OPS_EDGE_TLSKEY,
    OPS_EDGE_DEVICE,
};
#define OPS_EDGE_OPTIONS                                                                           \
    {"no-golden", no_argument, NULL, OPS_EDGE_NOGOLDEN},                                           \
        {"model-alias", required_argument, NULL, OPS_EDGE_ALIAS},                                  \
        {"model-aliases", required_argument, NULL, OPS_EDGE_ALIAS},                                \
        {"no-default-alias", no_argument, NULL, OPS_EDGE_NODEFALIAS},                              \
        {"api-key-file", required_argument, NULL, OPS_EDGE_KEYFILE},                               \
        {"metrics-need-key", no_argument, NULL, OPS_EDGE_METRICSKEY},                              \
        {"tls-cert", required_argument, NULL, OPS_EDGE_TLSCERT},                                   \
        {"tls-key", required_argument, NULL, OPS_EDGE_TLSKEY}, {                                   \
        "device", required_argument, NULL, OPS_EDGE_DEVICE                                         \
    }
/* One of those into o: -1 to go on, else the exit status after saying
 * why; -2 when c is not one of them. */
int ops_http_edge_opt(int c, const char *cmd, const char *arg, http_opts_t *o);

/* ---- API keys (ops_http_keys.c) ---- */
typedef struct http_keys http_keys_t;
/* Reads path's keys (one a line; blank lines and '#' comments skipped);
 * NULL with why when unreadable, empty or malformed. */
http_keys_t *ops_http_keys_new(const char *path, char *why, size_t why_size);
/* Reads the file again (SIGHUP): the new keys replace the old at once;
 * false with why keeps the old ones. *n: the keys now in force. */
bool   ops_http_keys_reload(http_keys_t *k, size_t *n, char *why, size_t why_size);
size_t ops_http_keys_count(http_keys_t *k);
/* The 1-based position of the key con presents (Authorization: Bearer, or
 * Api-Key), compared in constant time with every key; 0: none valid. */
int  ops_http_keys_check(http_keys_t *k, struct MHD_Connection *con);
void ops_http_keys_free(http_keys_t *k); /* NULL is a no-op */

/* The routes: index into the counters. */
typedef enum http_route {
    HTTP_R_SYSTEMONE = 0,
    HTTP_R_DECISIONS,
    HTTP_R_CLASSIFY,
    HTTP_R_EMBEDDINGS,
    HTTP_R_RERANK,
    HTTP_R_BUNDLE,
    HTTP_R_MODELS,
    HTTP_R_SYSTEMONE_MODELS,
    HTTP_R_HEALTH,
    HTTP_R_HEALTH_LIVE,
    HTTP_R_METRICS,
    HTTP_R_OPENAPI,
    HTTP_R_UNMATCHED, /* no route: 404 */
    HTTP_R_COUNT
} http_route_t;

/* Model state: what /health and 503 not_ready say. */
typedef enum http_state {
    HTTP_LOADING = 0,
    HTTP_READY = 1,
    HTTP_STOPPING = 2,
    HTTP_REFUSED = 3, /* loaded, but the golden check failed: never serves */
} http_state_t;

#define HTTP_N_STATUS  11 /* 200 400 404 405 413 422 429 499 500 503, other */
#define HTTP_N_OUTCOME 6  /* answered + the per-question error codes + other */

typedef struct http_counts {
    uint64_t   requests[HTTP_R_COUNT][HTTP_N_STATUS];
    uint64_t   questions[HTTP_N_OUTCOME];
    uint64_t   input_tokens;
    uint64_t   overloaded; /* 429s: scheduler full or body budget spent */
    uint64_t   submitted;  /* decision requests the engine took */
    ops_hist_t queue_s, forward_s, total_s;
} http_counts_t;

/* What the command running the server adds to it. */
typedef struct http_conf {
    const char *cmd;  /* "http" or "serve": messages and the logs' cmd */
    const char *mode; /* d3stream_info's mode label ("http", "at-least-once", ...) */
    /* Optional: more /metrics text (serve's Kafka counters), appended after
     * the HTTP ones. @locality an MHD thread. */
    void (*more_metrics)(void *user, ops_prom_t *p);
    void *user;
} http_conf_t;

typedef struct http {
    const http_opts_t *o;
    http_conf_t        c;
    ops_ask_t          ask; /* model NULL until loaded */
    const char        *label;
    eng_sched_t       *sched;
    struct MHD_Daemon *mhd;
    _Atomic int        state;      /* http_state_t */
    bool               quiesced;   /* MHD no longer accepts */
    int                listen_fd;  /* from the quiesce (else -1): closed after MHD_stop_daemon */
    atomic_size_t      in_flight;  /* requests begun, not completed */
    atomic_size_t      in_engine;  /* requests the engine holds: submitted, not done */
    atomic_size_t      in_intake;  /* decision requests queued for or in an intake thread */
    atomic_size_t      body_bytes; /* request bodies and answers held (o->body_budget) */
    pthread_mutex_t    lock;       /* counts */
    http_counts_t      n;
    char               device[512]; /* meta.device, for model cards */
    ops_golden_t       golden;      /* under lock: the card's and /health's verdict */
    http_keys_t       *keys;        /* --api-key-file, or NULL (open) */
    /* ops_http_intake.c: the intake queue and the watch list, under ilock */
    pthread_mutex_t  ilock;
    pthread_cond_t   icv, wcv; /* intake threads; the watcher's stop */
    struct http_req *iq_head, *iq_tail;
    struct http_req *watched; /* suspended requests (intake or engine) */
    uint64_t         wseq;
    bool             istop, intake_on, watcher_on;
    pthread_t        intake[HTTP_INTAKE_THREADS], watcher;
    size_t           n_intake;
} http_t;

/* ---- compressed request bodies (ops_http_codec.c) ---- */
typedef struct http_codec http_codec_t;
/* Takes decoded bytes; false stops the stream (the body's limit). */
typedef bool (*ops_http_sink_fn)(void *user, const char *p, size_t n);
/* The codings of a Content-Encoding value (gzip, x-gzip, deflate, zstd,
 * identity; comma-separated, in the order applied). 0: *out set, or NULL
 * when there is nothing to undo; -1: a coding not taken, why says which
 * (415); -2: out of memory. limit caps zstd's window. */
int ops_http_codec_new(const char *header, size_t limit, http_codec_t **out, char *why,
                       size_t why_size);
/* Undoes n more bytes into sink. 0 go on; 1 the sink stopped; -1 the data
 * is not what the coding says (why: a 400's message). */
int ops_http_codec_feed(http_codec_t *c, const char *data, size_t n, ops_http_sink_fn sink,
                        void *user, char *why, size_t why_size);
/* At the body's end: -1 when a stream was cut short (why). */
int  ops_http_codec_end(const http_codec_t *c, char *why, size_t why_size);
void ops_http_codec_free(http_codec_t *c); /* NULL is a no-op */
/* The coding to answer with for an Accept-Encoding value: "zstd", else
 * "gzip", else NULL (q=0 refuses one). */
const char *ops_http_codec_pick(const char *accept);
/* in (n bytes) in that coding into a new *out (*out_n bytes); false when
 * out of memory. */
bool ops_http_codec_compress(const char *coding, const char *in, size_t n, char **out,
                             size_t *out_n);
/* Answers shorter than this go out as they are: compressing them saves
 * less than it costs. */
#define HTTP_COMPRESS_MIN 1024

/* ---- image uploads (ops_http_multipart.c) ---- */
/* The boundary of a multipart/form-data Content-Type into out; false for
 * any other type (or no usable boundary). */
bool ops_http_multipart_boundary(const char *type, char *out, size_t out_size);
/* Rewrites body (the whole multipart body) into the System One JSON it
 * carries, its assets as `images` data URLs. 0; else the status to answer
 * (400 malformed, 413 the JSON past limit, 500 out of memory) with why. */
int ops_http_multipart(const char *boundary, svc_buf_t *body, size_t limit, char *why,
                       size_t why_size);

/* One request's state, from its headers to its completion. */
typedef enum http_phase {
    HTTP_P_READING = 0, /* receiving the body */
    HTTP_P_ENGINE,      /* suspended: the scheduler has it */
    HTTP_P_DONE,        /* the response is ready (status, out) */
    HTTP_P_SENT,        /* queued to libmicrohttpd */
} http_phase_t;

typedef struct http_req http_req_t;
struct http_req {
    http_t                *h;
    struct MHD_Connection *con;
    http_route_t           route;
    _Atomic int            phase; /* http_phase_t: the done callback sets DONE */
    double                 t0;    /* headers received (monotonic seconds) */
    svc_buf_t              body;
    size_t                 reserved; /* of h->body_bytes */
    size_t                 out_held; /* of h->body_bytes: the answer queued to MHD */
    char                   method[16], path[256];
    char                   rid[129]; /* X-Request-Id, else a new id: the access log's request_id */
    bool                   too_large, over_budget;
    size_t                 dropped;       /* body bytes read and dropped after a refusal */
    char                   boundary[72];  /* multipart/form-data: its boundary, else "" */
    int                    key;           /* the API key's position (access log), 0: none */
    struct http_codec     *codec;         /* Content-Encoding undone as the body arrives, or NULL */
    int                    coding_status; /* 415 or 400 when the coding failed, else 0 */
    char                   coding_why[320];
    sch_request_t         *req; /* while the engine has it */
    int                    status;
    svc_buf_t              out;   /* the response body */
    const char            *type;  /* its Content-Type; NULL: JSON */
    bool                   timed; /* a /v1 surface: Server-Timing */
    double                 parse_ms, tokenize_ms, queue_ms, forward_ms, serialize_ms;
    /* ops_http_intake.c, under h->ilock: */
    http_req_t  *iq_next, *w_prev, *w_next;
    uint64_t     wseq;
    bool         watching;
    bool         submitted;   /* the engine has it (or is being given it) */
    bool         withdrawn;   /* eng_sched_cancel found it */
    int          fd;          /* the connection's socket, watched while suspended */
    _Atomic bool client_gone; /* hung up while suspended: 499, withdrawn */
};

double ops_http_now_s(void);

/* ---- the server as a part (ops_http.c): `d3stream http` and `serve --http` */

/* The defaults of `d3stream http` (127.0.0.1:52625, 1024 connections, ...). */
void ops_http_opts_default(http_opts_t *o);
/* The engine's settings from o (serve's copied into its http part):
 * workers, admission and answer reuse, identity (the manifest's sha, ""
 * when unknown) keying the result cache. */
eng_sched_conf_t ops_sched_conf(const http_opts_t *o, const char *identity);
/* --result-cache-entries N (0: off) or --result-cache-mib N into o: -1 to go
 * on, else the exit status (a usage error said on stderr). */
int ops_cache_opt(const char *cmd, bool mib, const char *arg, http_opts_t *o);
/* Their --help lines. */
#define OPS_CACHE_HELP                                                                             \
    "  --result-cache-entries N\n"                                                                 \
    "                      answers kept for repeats (default 16384, as upstream; 0:\n"             \
    "                      off): a question asked again (the same package, profile,\n"             \
    "                      prompt, images and readout) is answered from memory, bit\n"             \
    "                      for bit, without a pass, and one identical to a question\n"             \
    "                      queued or running waits for that one's answer instead of\n"             \
    "                      running again (0 turns that off too). Errors are never kept\n"          \
    "  --result-cache-mib N\n"                                                                     \
    "                      and their memory in MiB (default 64; ~112 bytes an answer\n"            \
    "                      of 4 options), least recently used out past either bound\n"
/* HOST:PORT (or [V6]:PORT) -> o->host, o->port; false when malformed. */
bool ops_http_parse_listen(const char *arg, http_opts_t *o);
/* After the options: the body budget fits one largest body
 * (--max-request-bytes; a default budget is raised to it, a given one too
 * small is a usage error, said on stderr: false), the connection limit
 * fits the open-file limit (said on stderr when lowered). */
bool ops_http_opts_finish(http_opts_t *o, const char *cmd);
/* Listens on o's address (the address is logged: "listening on
 * http://HOST:PORT") with the package of ask (ask->model NULL: /health says
 * loading and decision requests get 503 until ops_http_ready). o, ask's
 * strings and c's user must outlive the server. Returns NULL after saying
 * why. @locality the caller's thread, before ops_http_ready. */
http_t *ops_http_start(const http_opts_t *o, const ops_ask_t *ask, const http_conf_t *c);
/* The model is loaded and sched runs: requests go to the engine. */
void ops_http_ready(http_t *h, const eng_model_t *model, eng_sched_t *sched);
/* The golden check's verdict for the card and /health; a failed one puts
 * h in HTTP_REFUSED (503 with the reason, never ready). Before
 * ops_http_ready. */
void ops_http_golden(http_t *h, const ops_golden_t *g);
/* SIGHUP: reads --api-key-file again and logs the outcome (a failure keeps
 * the keys in force). */
void ops_http_reload_keys(http_t *h);
/* Stops accepting connections; new requests on open ones get 503. */
void ops_http_quiesce(http_t *h);
/* Waits up to s seconds for every request begun to complete; false when
 * some are still open. */
bool ops_http_drain(http_t *h, double s);
/* Stops the server (call after the engine finished what it had: no
 * connection may still wait for it) and frees h; NULL is a no-op. */
void ops_http_free(http_t *h);

/* ops_http_route.c: the MHD callbacks. */
enum MHD_Result ops_http_handler(void *cls, struct MHD_Connection *con, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **req_cls);
void            ops_http_completed(void *cls, struct MHD_Connection *con, void **req_cls,
                                   enum MHD_RequestTerminationCode toe);

/* ops_http_intake.c */
/* Starts the intake threads and the watcher; false when none could start
 * (decision requests then get 503). @locality ops_http_start. */
bool ops_http_intake_start(http_t *h);
/* POST /v1/systemone with its whole body in r->body: suspends the
 * connection and queues r for an intake thread (ops_http_decisions); the
 * connection is resumed with r->phase DONE. False (nothing done) once the
 * intake stopped or never started: the caller answers 503.
 * @locality an MHD thread, in the handler. */
bool ops_http_intake_push(http_req_t *r);
/* r's answer is in r->out: off the watch list, phase DONE, resumed. */
void ops_http_answer_now(http_req_t *r);
/* r off the watch list (before its connection is resumed). */
void ops_http_unwatch(http_req_t *r);
/* Stops the intake threads (one inside a submit finishes it) and the
 * watcher, and answers what is still queued with 503: after it nothing
 * here calls the scheduler, which may then be freed. Idempotent. */
void ops_http_release_engine(http_t *h);
/* ops_http_release_engine, then frees the intake's locks. */
void ops_http_intake_free(http_t *h);

/* ops_http_api.c */
/* Decodes and submits r (suspended, watched): the engine's done callback,
 * or this call for an answer without the engine, resumes it with
 * r->phase DONE. @locality an intake thread. */
void ops_http_decisions(http_req_t *r);
/* Withdraws r from the engine (its client went away); false when the
 * engine does not hold it (yet: a submit still decoding it).
 * @locks h->ilock held (r is on the watch list, so alive). */
bool ops_http_cancel(http_req_t *r);
/* r->out/r->status for an error of our own (sch_error_encode). */
void ops_http_error(http_req_t *r, int status, const char *code, const char *fmt, ...)
    SVC_FMT(4, 5);
/* The 429 of a full engine queue or a spent body budget, counted. */
void ops_http_overloaded(http_req_t *r);
/* GET bodies: health, models; r->out/r->status set. */
void ops_http_health(http_req_t *r, bool live);
void ops_http_models(http_req_t *r, bool systemone);

/* ops_http_metrics.c */
void ops_http_count_request(http_t *h, http_route_t route, int status, double total_s);
void ops_http_count_answers(http_t *h, const sch_request_t *req, const eng_answers_t *ans);
/* The /metrics text into out (fresh); false when out of memory. */
bool ops_http_metrics_text(http_t *h, svc_buf_t *out);

/* openapi.yaml, compiled in by CMakeLists.txt */
extern const char   ops_openapi_yaml[];
extern const size_t ops_openapi_yaml_len;

#endif
