/*
 * prod_int.h -- what producer/'s files share; not for other modules.
 */
#ifndef D3STREAM_PROD_INT_H
#define D3STREAM_PROD_INT_H

#include "producer.h"

#include <librdkafka/rdkafka.h>
#include <stdatomic.h>

struct prod {
    rd_kafka_t         *rk;
    rd_kafka_topic_t   *rkt_results;
    rd_kafka_topic_t   *rkt_dlq; /* NULL without a dead-letter topic */
    char               *dlq_topic;
    const char         *content_type; /* one of the PROD_CONTENT_TYPE_* literals */
    prod_delivery_cb_t *on_delivery;
    void               *user;
    int                 queue_wait_ms;
    int                 txn_timeout_ms;
    int                 close_timeout_ms;
    size_t              max_record_bytes; /* message.max.bytes, as configured */
    bool                transactional;
    bool                txn_open; /* begun, neither committed nor aborted yet */
    /* Written by the owner thread (in delivery reports), read by
     * prod_stats() from any thread: hence atomics, relaxed (counters only). */
    _Atomic uint64_t n_produced;
    _Atomic uint64_t n_dlq;
    _Atomic uint64_t n_failed;
    _Atomic uint64_t n_queue_waits;
};

/* Milliseconds on the monotonic clock. */
int64_t prod_now_ms(void);

/* Serves whatever delivery reports are already queued, without waiting. */
void prod_drain(prod_t *prod);

#endif /* D3STREAM_PROD_INT_H */
