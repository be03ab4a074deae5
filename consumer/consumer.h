/*
 * consumer.h -- d3stream's Kafka consumer group member (issue 4).
 *
 * A cooperative-sticky subscription that hands messages out one at a time
 * and stores offsets at-least-once: enable.auto.offset.store=false, and
 * "offset + 1" is stored (then auto-committed) only across the contiguous
 * prefix of messages the owner finished with delivered=true. Work may finish
 * in any order. A process-wide window bounds the messages in flight: at
 * max_in_flight every assigned partition is paused, and resumed once the
 * count falls below the low-water mark, while polling goes on.
 *
 *   cons_conf_t cc = {.brokers = "127.0.0.1:9092", .group = "d3",
 *                     .topics = (const char *const[]){"requests", NULL},
 *                     .max_in_flight = 64};
 *   char errstr[512];
 *   cons_t *cons = cons_new(&cc, errstr, sizeof errstr);
 *   while (run) {
 *       cons_msg_t *msg;
 *       if (cons_poll(cons, 100, &msg) != SVC_OK) break;  // fatal
 *       if (msg) submit(msg);  // later, from the delivery report:
 *                              // cons_msg_done(cons, msg, true);
 *   }
 *   cons_close(cons);  // finishes through on_revoke, commits, leaves
 *   cons_free(cons);
 *
 * Threads: cons_poll, cons_close and cons_free belong to one thread (the
 * poll thread; librdkafka runs the rebalance and statistics callbacks, and so
 * conf.on_revoke, inside cons_poll and cons_close). cons_msg_done, the
 * message accessors, cons_stats and cons_at_end may be called from any
 * thread.
 *
 * Liveness: cons_poll must be called at least every max.poll.interval.ms
 * (librdkafka default 300000 ms; -X max.poll.interval.ms=...) even while the
 * window is full, or the member is evicted from the group and its partitions
 * are given away. A full window pauses fetching; it never stops polling.
 */
#ifndef D3STREAM_CONSUMER_H
#define D3STREAM_CONSUMER_H

#include "svc.h"

struct rd_kafka_consumer_group_metadata_s;

typedef struct cons     cons_t;
typedef struct cons_msg cons_msg_t;

/**
 * Called for each partition about to be taken away (rebalance, or
 * cons_close), before it is unassigned: the owner finishes its in-flight
 * messages of that partition with cons_msg_done(.., true) so that their
 * offsets are stored and committed, or abandons them with
 * cons_msg_done(.., false) / by finishing them later (then they are consumed
 * again by the next owner: at-least-once). Runs on the poll thread, inside
 * cons_poll or cons_close; it may call cons_msg_done but not cons_poll.
 */
typedef void cons_revoke_cb(void *user, const char *topic, int32_t partition);

typedef struct cons_conf {
    const char        *brokers;           /* bootstrap.servers */
    const char        *group;             /* group.id */
    const char *const *topics;            /* NULL-terminated, at least one */
    const char        *group_instance_id; /* optional: static membership */
    bool               from_beginning;    /* auto.offset.reset=earliest (else latest) */
    size_t             max_in_flight;     /* messages handed out and not done, per process */
    size_t             low_water;         /* resume below this; 0: max_in_flight * 3/4 */
    /* Bytes (key + value) of those messages and of the ones fetched but
     * not yet handed out, per process; 0: no bound. Past it fetching
     * pauses as past max_in_flight (resumed below 3/4 of it), and a
     * message is handed out only while the others leave it room, or when
     * none is out (one message of any size always goes). */
    size_t max_bytes;
    /* Optional, NULL-terminated "key=value" librdkafka properties applied
     * verbatim after the defaults (so they override them), like -X. */
    const char *const *props;
    bool               stop_at_end; /* backfill: see cons_at_end() */
    /* Exactly-once: offsets are committed only through the producer's
     * transactions (cons_group_metadata, prod_txn_send_offsets), never by
     * the consumer: enable.auto.commit=false, no commit on close, and
     * isolation.level=read_committed for the input (an aborted request
     * record is never answered). */
    bool            transactional;
    int             stats_interval_ms; /* statistics.interval.ms; 0: 5000 */
    cons_revoke_cb *on_revoke;         /* optional */
    void           *user;              /* passed to on_revoke */
} cons_conf_t;

/* Counters, read with atomics; lag, rebalance_cnt and assignment_size come
 * from librdkafka's statistics (every stats_interval_ms), the rest are the
 * module's own. */
typedef struct cons_stats {
    int64_t lag;             /* total consumer_lag over assigned partitions */
    int64_t rebalance_cnt;   /* librdkafka's cgrp rebalance_cnt */
    int64_t assignment_size; /* librdkafka's cgrp assignment_size */
    int64_t stats_seen;      /* statistics callbacks parsed */
    int64_t in_flight;       /* handed out, cons_msg_done not yet called */
    int64_t in_flight_max;   /* highest in_flight ever */
    int64_t bytes;           /* keys and values handed out or parked (max_bytes) */
    int64_t messages;        /* handed out by cons_poll */
    int64_t stored;          /* rd_kafka_offsets_store calls that advanced an offset */
    int64_t stale;           /* finished after their partition was revoked: not stored */
    int64_t pauses;          /* window closed: assignment paused */
    int64_t resumes;         /* window reopened: assignment resumed */
    int64_t assigns;         /* assign callbacks */
    int64_t revokes;         /* revoke callbacks */
    int64_t revoked_parts;   /* partitions passed to on_revoke */
    int64_t errors;          /* consumer errors reported by librdkafka */
} cons_stats_t;

/**
 * @brief Creates the consumer and subscribes to conf->topics.
 * @param conf Read during the call only; every string is copied or handed
 *        to librdkafka.
 * @returns The handle, or NULL with the reason in errstr (a librdkafka
 *          property error is reported exactly as librdkafka wrote it).
 * @remark Free with cons_free(). enable.auto.offset.store cannot be set to
 *         true through props: at-least-once depends on it.
 */
cons_t *cons_new(const cons_conf_t *conf, char *errstr, size_t errstr_size);

/**
 * @brief Serves librdkafka (rebalances, statistics, pause/resume of the
 *        window) and returns the next message, if any, within timeout_ms.
 * @param out Set to the message, or NULL on timeout, while the window is
 *        full, or when the event was not a message (partition EOF). NULL:
 *        serve only -- a message fetched is parked (within the window)
 *        and handed out by a later call with out; for an owner that cannot
 *        take one now but must keep its membership (max.poll.interval.ms).
 * @returns SVC_OK; SVC_ERR_IO on a fatal consumer error (cons_strerror()
 *          says which) -- the handle can then only be closed and freed.
 * @remark The message belongs to the caller until cons_msg_done().
 *         Call at least every max.poll.interval.ms; see the file comment.
 */
SVC_WUR svc_err_t cons_poll(cons_t *cons, int timeout_ms, cons_msg_t **out);

/**
 * @brief Finishes msg and frees it. delivered=true: its result was delivered,
 *        so its offset may be stored once every earlier message of the
 *        partition is finished too; false: abandoned, its partition's stored
 *        offset never passes it in this assignment (it is consumed again).
 * @remark Messages of a revoked partition are dropped without storing.
 *         Every message must be finished before cons_free(). NULL is a no-op.
 *         Any thread.
 */
void cons_msg_done(cons_t *cons, cons_msg_t *msg, bool delivered);

/* Accessors; pointers live until cons_msg_done(). Key/value may be NULL. */
const char *cons_msg_topic(const cons_msg_t *msg);
int32_t     cons_msg_partition(const cons_msg_t *msg);
int64_t     cons_msg_offset(const cons_msg_t *msg);
const void *cons_msg_key(const cons_msg_t *msg, size_t *len);
const void *cons_msg_value(const cons_msg_t *msg, size_t *len);
/** @brief Number of headers (0 when none). */
size_t cons_msg_header_count(const cons_msg_t *msg);
/**
 * @brief Header idx: name, value (NULL for a null header) and its length.
 * @returns false when idx is out of range.
 */
bool cons_msg_header(const cons_msg_t *msg, size_t idx, const char **name, const void **value,
                     size_t *len);

/**
 * @brief For stop_at_end: true once a first assignment has happened, every
 *        assigned partition has reached the high watermark it had when first
 *        assigned, and nothing is in flight or waiting in the window.
 */
bool cons_at_end(cons_t *cons);

/** @brief Copies the counters (atomics; any thread). */
void cons_stats(const cons_t *cons, cons_stats_t *out);

/** @brief The last consumer error librdkafka reported ("" when none). */
const char *cons_strerror(const cons_t *cons);

/**
 * @brief The group metadata a transaction's send_offsets needs (KIP-447:
 *        the broker fences a zombie by its generation).
 * @returns a new handle the caller frees with
 *          rd_kafka_consumer_group_metadata_destroy, or NULL before the
 *          consumer has joined (librdkafka then has none).
 * @locality any thread
 */
struct rd_kafka_consumer_group_metadata_s *cons_group_metadata(cons_t *cons);

/**
 * @brief Whether msg's partition is still assigned to this member in the
 *        assignment msg came from (false once it was revoked, even if it
 *        came back since). A result for a message that is no longer current
 *        must not be published in exactly-once mode: the partition's new
 *        owner answers it.
 * @locality any thread @locks takes the consumer's lock
 */
bool cons_msg_current(cons_t *cons, const cons_msg_t *msg);

/**
 * @brief Exactly-once recovery after an aborted transaction: every
 *        assigned partition starts a new generation (messages handed out
 *        before become stale: cons_msg_done drops them), parked messages
 *        are dropped, and fetching restarts at the group's committed offset
 *        (auto.offset.reset when there is none).
 * @returns SVC_OK; SVC_ERR_IO (the committed offsets could not be read or
 *          a seek failed; cons_strerror says which) -- the caller should
 *          then stop: continuing could skip records.
 * @locality poll thread
 */
SVC_WUR svc_err_t cons_rewind(cons_t *cons, int timeout_ms);

/**
 * @brief Revokes everything (on_revoke runs for each partition), commits
 *        the stored offsets and leaves the group. Idempotent.
 * @returns SVC_OK, or SVC_ERR_IO when the final commit or close failed
 *          (cons_strerror()).
 */
SVC_WUR svc_err_t cons_close(cons_t *cons);

/** @brief cons_close() if still open, then frees; NULL is a no-op. */
void cons_free(cons_t *cons);

#endif
