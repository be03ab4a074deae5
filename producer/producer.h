/*
 * producer.h -- d3stream's Kafka producer: one result record per request
 * record on the results topic, dead-letter records for bytes that could not
 * be decoded, idempotent always, transactional on request (SPEC.md k).
 *
 * A result record is keyed like its request (the request's key, else the
 * request id), its value is the exact body the HTTP shim would send (answers
 * or the error object), and it carries the headers d3-request-id, d3-status,
 * d3-source ("topic/partition/offset"), d3-model and content-type. A
 * dead-letter record carries the original key, value and headers plus
 * d3-error-code, d3-error-message and d3-source.
 *
 * Threads: a prod_t belongs to one thread (the producer thread, STYLE.md 23);
 * every call but prod_stats() must come from it. Delivery reports go to the
 * on_delivery callback given at prod_new(), and only ever run on that thread,
 * inside the calls marked "serves delivery reports" below (librdkafka's
 * dr_msg_cb is served by rd_kafka_poll on the caller's thread, never by a
 * librdkafka thread).
 *
 * Usage (at-least-once; error handling elided):
 *
 *     prod_conf_t conf = {.brokers = "127.0.0.1:9092", .results_topic = "d3.results",
 *                         .dlq_topic = "d3.dlq", .on_delivery = done, .user = ctx};
 *     prod_t *prod = prod_new(&conf, errstr, sizeof errstr);
 *     prod_result_t r = {.key = key, .key_len = key_len, .value = body,
 *                        .value_len = body_len, .status = 200, .model_id = "d3-nano",
 *                        .source_topic = "d3.requests", .source_partition = 3,
 *                        .source_offset = 42};
 *     err = prod_result_send(prod, &r, msg_ctx, errstr, sizeof errstr);
 *     // done(msg_ctx, err, errstr, ctx) comes later, from prod_poll():
 *     prod_poll(prod, 100);                          // in the thread's loop
 *     prod_free(prod);
 *
 * Exactly-once: .transactional = true with a stable .transactional_id, then
 * per batch prod_txn_begin(), the sends, prod_txn_send_offsets() with the
 * consumer's offsets (last processed + 1) and group metadata, and
 * prod_txn_commit(); on SVC_ERR_TXN_ABORT prod_txn_abort() and redo the batch
 * from the committed offsets; on SVC_ERR_FATAL rebuild the producer.
 */
#ifndef D3STREAM_PRODUCER_H
#define D3STREAM_PRODUCER_H

#include "svc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* librdkafka's own types by their struct tags, so that this header does not
 * pull in rdkafka.h: a caller holding an rd_kafka_topic_partition_list_t *,
 * rd_kafka_consumer_group_metadata_t * or rd_kafka_headers_t * passes it as
 * is (those typedefs name these structs). */
struct rd_kafka_topic_partition_list_s;
struct rd_kafka_consumer_group_metadata_s;
struct rd_kafka_headers_s;

#define PROD_CONTENT_TYPE_JSON "application/json"
#define PROD_CONTENT_TYPE_AVRO "application/vnd.d3.answer+avro"

/* The length of a generated request id: 128 random bits as lower-case hex. */
#define PROD_REQUEST_ID_LEN 32

/* Defaults for the bounded waits in prod_conf_t (0 selects them). */
#define PROD_QUEUE_WAIT_MS_DEFAULT    30000
#define PROD_TXN_TIMEOUT_MS_DEFAULT   60000
#define PROD_CLOSE_TIMEOUT_MS_DEFAULT 10000

/**
 * @brief A delivery report: one per message accepted by prod_result_send()
 *        or prod_dlq_send(), exactly once.
 * @param opaque the opaque given to that send.
 * @param err SVC_OK when the broker has the record (acks=all); otherwise
 *        SVC_ERR_TOO_LARGE (record over message.max.bytes), SVC_ERR_TXN_ABORT
 *        (purged by prod_txn_abort() or an abortable error: redo it in the
 *        next transaction), SVC_ERR_FATAL (the producer is dead),
 *        SVC_ERR_IO (anything else: timed out, topic missing, ...).
 * @param errstr NULL on success, else what failed with the topic [partition]
 *        and librdkafka's reason; valid only during the call.
 * @param user prod_conf_t.user.
 * @locality the thread that owns the prod_t, inside a call that serves
 *           delivery reports. The callback must not call prod_free().
 */
typedef void prod_delivery_cb_t(void *opaque, svc_err_t err, const char *errstr, void *user);

typedef struct prod_conf {
    const char *brokers;          /* bootstrap.servers; required */
    const char *results_topic;    /* required */
    const char *dlq_topic;        /* NULL or "": none (prod_dlq_send then refuses) */
    bool        transactional;    /* every send must be inside prod_txn_begin/commit */
    const char *transactional_id; /* required when transactional; stable per instance */
    /* NULL-terminated "name=value" librdkafka properties, set verbatim after
     * ours (so they may override linger.ms etc.; never enable.idempotence or
     * acks: those are refused). NULL for none. */
    const char *const  *props;
    const char         *content_type;   /* PROD_CONTENT_TYPE_JSON (NULL) or _AVRO */
    prod_delivery_cb_t *on_delivery;    /* NULL: reports are only counted */
    void               *user;           /* passed to on_delivery */
    int                 queue_wait_ms;  /* longest wait for room in a full queue (0: default) */
    int                 txn_timeout_ms; /* bound for init/commit/abort/send_offsets (0: default) */
    int                 close_timeout_ms; /* bound for prod_free()'s flush (0: default) */
} prod_conf_t;

typedef struct prod prod_t;

/* One result record. Pointers are read during the call only (copied). */
typedef struct prod_result {
    const void *key; /* the request record's key; NULL or len 0: the request id */
    size_t      key_len;
    const void *value; /* the response body, byte for byte */
    size_t      value_len;
    int         status;       /* the HTTP status the shim would use: d3-status */
    const char *request_id;   /* NULL or "": a generated one (PROD_REQUEST_ID_LEN hex) */
    const char *model_id;     /* d3-model; NULL: sent as an empty value */
    const char *source_topic; /* d3-source = topic/partition/offset; required */
    int32_t     source_partition;
    int64_t     source_offset;
} prod_result_t;

/* One dead-letter record. Pointers are read during the call only (copied). */
typedef struct prod_dlq {
    const void *key; /* the original key; NULL: none */
    size_t      key_len;
    const void *value; /* the original value, undecodable bytes included */
    size_t      value_len;
    /* The original record's headers (an rd_kafka_headers_t *, e.g. from
     * rd_kafka_message_headers()); copied, never modified. NULL: none. */
    const struct rd_kafka_headers_s *headers;
    const char                      *error_code;    /* d3-error-code; required */
    const char                      *error_message; /* d3-error-message; required */
    const char                      *source_topic;  /* d3-source; required */
    int32_t                          source_partition;
    int64_t                          source_offset;
} prod_dlq_t;

/* Counters since prod_new(); each one is an atomic read. */
typedef struct prod_stats {
    uint64_t produced;    /* result records delivered */
    uint64_t dlq;         /* dead-letter records delivered */
    uint64_t failed;      /* delivery reports with an error (either kind) */
    uint64_t queue_waits; /* sends that found the local queue full and waited */
} prod_stats_t;

/**
 * @brief Builds the producer: enable.idempotence=true, acks=all, then
 *        conf->props verbatim; for a transactional producer, also
 *        transactional.id and rd_kafka_init_transactions() (bounded by
 *        txn_timeout_ms).
 * @returns the producer, or NULL with errstr set: a property librdkafka
 *          refuses gives librdkafka's errstr unchanged; anything else says
 *          what is wrong with the configuration or which call failed.
 * @remark conf and everything it points to are copied; the caller keeps them.
 */
SVC_WUR prod_t *prod_new(const prod_conf_t *conf, char *errstr, size_t errstr_size);

/**
 * @brief Hands back the producer: aborts an open transaction, flushes for at
 *        most close_timeout_ms, then purges what is left, so that every
 *        accepted message still gets exactly one delivery report (undelivered
 *        ones with an error) before this returns. Serves delivery reports.
 * @returns how many messages were not delivered (purged, or left after the
 *          purge); 0 for NULL.
 */
size_t prod_free(prod_t *prod);

/**
 * @brief Queues one result record (key, value and headers copied).
 * @param opaque handed to on_delivery with this record's report.
 * @returns SVC_OK: queued, exactly one delivery report will follow;
 *          SVC_ERR_RETRIABLE: the queue stayed full for queue_wait_ms (the
 *          record was not queued; send it again later);
 *          SVC_ERR_TXN_ABORT / SVC_ERR_FATAL: the transaction / producer is
 *          in an error state; SVC_ERR_INVALID: a transactional producer
 *          outside a transaction, or a bad field (errstr says which);
 *          SVC_ERR_IO: the request id could not be generated.
 *          Serves delivery reports while it waits for room.
 */
SVC_WUR svc_err_t prod_result_send(prod_t *prod, const prod_result_t *r, void *opaque, char *errstr,
                                   size_t errstr_size);

/**
 * @brief Queues one dead-letter record; returns as prod_result_send().
 *        SVC_ERR_INVALID when the producer has no dlq_topic.
 */
SVC_WUR svc_err_t prod_dlq_send(prod_t *prod, const prod_dlq_t *d, void *opaque, char *errstr,
                                size_t errstr_size);

/**
 * @brief Serves delivery reports (and client errors) for up to timeout_ms.
 * @returns the number of events served.
 */
int prod_poll(prod_t *prod, int timeout_ms);

/**
 * @brief Waits until every queued message has its delivery report, for at
 *        most timeout_ms. Serves delivery reports.
 * @returns SVC_OK, or SVC_ERR_RETRIABLE when messages are still in flight
 *          (prod_in_flight() says how many).
 */
SVC_WUR svc_err_t prod_flush(prod_t *prod, int timeout_ms);

/* Messages queued or in flight, waiting for their delivery report. */
int prod_in_flight(prod_t *prod);

/* The largest record this producer sends (its message.max.bytes: key,
 * value, headers and librdkafka's framing together); a larger one is
 * refused with SVC_ERR_TOO_LARGE. */
size_t prod_max_record_bytes(const prod_t *prod);

/**
 * @brief Reads the counters.
 * @locality any thread (atomics, no lock).
 */
void prod_stats(const prod_t *prod, prod_stats_t *out);

/**
 * @brief Writes a new request id: 128 bits from getrandom(2) as
 *        PROD_REQUEST_ID_LEN lower-case hex characters plus a NUL.
 * @param out at least PROD_REQUEST_ID_LEN + 1 bytes.
 * @returns SVC_OK, or SVC_ERR_IO when getrandom fails.
 */
SVC_WUR svc_err_t prod_request_id_new(char out[PROD_REQUEST_ID_LEN + 1]);

/*
 * Transactions (a transactional producer only; SVC_ERR_INVALID otherwise).
 * Every call returns SVC_OK or a classified error with errstr set to
 * "<call>: <librdkafka's reason>":
 *   SVC_ERR_RETRIABLE  the same call may be made again (e.g. it timed out);
 *   SVC_ERR_TXN_ABORT  call prod_txn_abort() and redo the batch from the
 *                      last committed offsets;
 *   SVC_ERR_FATAL      the producer is unusable (fenced by a newer instance
 *                      with the same transactional_id): prod_free() it;
 *   SVC_ERR_INVALID    a call out of order (e.g. begin twice).
 * Each call is bounded by txn_timeout_ms.
 */
SVC_WUR svc_err_t prod_txn_begin(prod_t *prod, char *errstr, size_t errstr_size);

/**
 * @brief Adds the consumer's offsets to the open transaction, so they commit
 *        with the results (rd_kafka_send_offsets_to_transaction()).
 * @param offsets an rd_kafka_topic_partition_list_t *: per partition, the
 *        offset of the last processed message + 1. Not modified or kept.
 * @param cgmd an rd_kafka_consumer_group_metadata_t * from
 *        rd_kafka_consumer_group_metadata(consumer). Not kept.
 */
SVC_WUR svc_err_t prod_txn_send_offsets(prod_t                                          *prod,
                                        const struct rd_kafka_topic_partition_list_s    *offsets,
                                        const struct rd_kafka_consumer_group_metadata_s *cgmd,
                                        char *errstr, size_t errstr_size);

/* Flushes the open transaction's messages, then commits it. Serves
 * delivery reports. */
SVC_WUR svc_err_t prod_txn_commit(prod_t *prod, char *errstr, size_t errstr_size);

/* Aborts the open transaction: its messages not yet delivered get
 * SVC_ERR_TXN_ABORT reports, delivered ones stay invisible to
 * read_committed readers. Serves delivery reports. */
SVC_WUR svc_err_t prod_txn_abort(prod_t *prod, char *errstr, size_t errstr_size);

#endif /* D3STREAM_PRODUCER_H */
