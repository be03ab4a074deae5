/*
 * ops_serve_int.h -- what the parts of `d3stream serve` share (private):
 * ops_serve.c (options, set-up, the loop), ops_serve_job.c (one record's
 * way from decode through the scheduler to its result record) and
 * ops_serve_txn.c (exactly-once transactions, revoke).
 *
 * Threads: everything here runs on the serve thread (it owns the consumer,
 * the producer and the job FIFO) except ops_serve_engine_done, which the
 * scheduler calls on a worker thread; it touches only its own job and the
 * `ready` handshake below.
 */
#ifndef D3STREAM_OPS_SERVE_INT_H
#define D3STREAM_OPS_SERVE_INT_H

#include "ops_http_int.h"
#include "ops_int.h"

#include "consumer.h"
#include "producer.h"
#include "schemas.h"

#include <pthread.h>
#include <stdatomic.h>

#define SERVE_RID_MAX 128

typedef struct serve_opts {
    const char     *dir, *brokers, *group, *input, *output, *dlq, *registry_url;
    const char     *instance_id, *txn_id, *metrics_path;
    bool            avro, from_beginning, stop_at_end, no_verify, eos;
    eng_load_opts_t load; /* --q4nx-layout */
    size_t          workers, max_queue, max_queued_tokens, window, window_mib;
    int             commit_ms; /* exactly-once: longest a transaction stays open */
    const char    **props;     /* NULL-terminated -X values */
    bool            http_on;   /* --http HOST:PORT: the HTTP shim in this process */
    http_opts_t     http;
} serve_opts_t;

/* serve's Kafka metrics as text, for the /metrics of --http: the serve
 * thread renders it (ops_serve_metrics_snapshot), MHD threads copy it. */
typedef struct serve_snap {
    pthread_mutex_t lock;
    svc_buf_t       text;
    double          t; /* when rendered (serve thread only) */
} serve_snap_t;

typedef struct job job_t;

/* Counters for logs and metrics (serve thread; read by the metrics writer
 * on the same thread). */
typedef struct serve_counts {
    uint64_t answered;     /* results delivered (committed, in exactly-once) */
    uint64_t by_status[6]; /* results by status class: [2] 2xx, [4] 4xx, [5] 5xx */
    uint64_t dlq;          /* dead-letter records queued */
    uint64_t failed;       /* failed delivery reports */
    uint64_t abandoned;    /* messages left uncommitted (consumed again later) */
    uint64_t stale;        /* results dropped: their partition was revoked */
    uint64_t txn_commits, txn_aborts;
} serve_counts_t;

typedef struct serve {
    const serve_opts_t *o;
    ops_ask_t           ask;
    cons_t             *cons;
    prod_t             *prod;
    sch_registry_t     *reg;
    uint32_t            answer_id; /* the schema id of Avro answers */
    eng_sched_t        *sched;
    http_t             *http; /* --http; NULL without */
    serve_snap_t       *snap; /* --http: the Kafka metrics for its /metrics */
    serve_counts_t      n;
    bool                fatal; /* stop with exit 3 */
    /* The FIFO of consumed messages in arrival order: results leave from
     * its head only, so each partition's results keep their input order. */
    job_t *head, *tail;
    size_t n_jobs;
    job_t *blocked; /* decoded, waiting for room in the scheduler */
    /* The scheduler's queue when it last refused s->blocked: it is asked
     * again only once that changed (a job finished), since each try
     * decodes the images and tokenizes the prompts anew. */
    eng_sched_stats_t refused;
    double            refused_at; /* monotonic s; a try at least every second anyway */
    /* Completions: workers set job->ready under lock and signal. */
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    /* Exactly-once: the open transaction and its jobs (produced, not yet
     * committed). */
    bool   txn_open;
    double txn_t0;
    job_t *txn_head, *txn_tail;
    size_t txn_n;
    /* The next commit must abort instead: a record of the transaction failed
     * delivery, or a record was abandoned (not answered), so committing the
     * offsets of later ones would skip it. Cleared by the abort's rewind. */
    bool txn_failed;
    int  txn_record_aborts; /* such aborts in a row, no commit of results between */
} serve_t;

struct job {
    job_t         *next; /* FIFO, then the transaction's list */
    serve_t       *s;
    cons_msg_t    *msg;
    sch_request_t *req;    /* while the engine has it */
    svc_buf_t      out;    /* the response body (JSON) */
    int            status; /* HTTP status; 0: stop (registry down); -1: internal failure */
    bool           undecodable;
    bool           ready;    /* @locks s->lock (set by a worker or the serve thread) */
    int            pending;  /* delivery reports outstanding */
    bool           ok;       /* every report so far succeeded */
    bool           released; /* the serve thread is done with it (no report may free it before) */
    char           why[1024];
    char           rid[SERVE_RID_MAX + 1];
};

/* ops_serve_job.c */
void ops_serve_job_start(serve_t *s, cons_msg_t *msg);
bool ops_serve_job_submit(serve_t *s); /* retries s->blocked; true when it went in */
void ops_serve_publish_ready(serve_t *s);
void ops_serve_on_delivery(void *opaque, svc_err_t err, const char *errstr, void *user);
void ops_serve_job_release(job_t *j);
/* Waits up to ms for a completion (the scheduler signals). */
void ops_serve_wait(serve_t *s, int ms);

/* ops_serve_txn.c */
/* Commits the open transaction when it is due (or when force). */
void ops_serve_txn_maybe_commit(serve_t *s, bool force);
/* Opens a transaction if none is open; false (s->fatal set) on failure. */
bool ops_serve_txn_ensure(serve_t *s);
void ops_serve_txn_add(serve_t *s, job_t *j);
void ops_serve_on_revoke(void *user, const char *topic, int32_t partition);

double ops_serve_now_s(void);

/* ops_metrics.c: the Prometheus text file of serve (written atomically). */
void ops_serve_metrics_write(serve_t *s, bool final);
/* --http: renders the Kafka metrics into s->snap (at most once a second
 * unless force). @locality the serve thread. */
void ops_serve_metrics_snapshot(serve_t *s, bool force);
/* http_conf_t.more_metrics: appends the snapshot (user: serve_snap_t). */
void ops_serve_metrics_more(void *user, ops_prom_t *p);

#endif
