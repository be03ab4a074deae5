/*
 * prod_send.c -- result and dead-letter records: keys, headers, request
 * ids, and the wait for room when librdkafka's queue is full.
 */
#include "prod_int.h"

#include <inttypes.h>
#include <sys/random.h>

svc_err_t prod_request_id_new(char out[PROD_REQUEST_ID_LEN + 1]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char     raw[PROD_REQUEST_ID_LEN / 2];
    size_t            got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return SVC_ERR_IO;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 0xf];
    }
    out[PROD_REQUEST_ID_LEN] = '\0';
    return SVC_OK;
}

/* A failed rd_kafka_producev's class. */
static svc_err_t produce_err(prod_t *prod, rd_kafka_resp_err_t err, const char *topic, char *errstr,
                             size_t errstr_size) {
    char                fatal[256];
    rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(prod->rk, fatal, sizeof fatal);
    if (err == RD_KAFKA_RESP_ERR__FATAL || ferr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        svc_errf(errstr, errstr_size, "produce to \"%s\": fatal: %s", topic,
                 ferr != RD_KAFKA_RESP_ERR_NO_ERROR ? fatal : rd_kafka_err2str(err));
        return SVC_ERR_FATAL;
    }
    svc_errf(errstr, errstr_size, "produce to \"%s\": %s (%s)", topic, rd_kafka_err2str(err),
             rd_kafka_err2name(err));
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        return SVC_ERR_TOO_LARGE;
    case RD_KAFKA_RESP_ERR__STATE:
        /* A transactional producer refuses messages while its transaction
         * is in an abortable error state. */
        return prod->transactional ? SVC_ERR_TXN_ABORT : SVC_ERR_INVALID;
    default: /* unknown topic or partition, ... */
        return SVC_ERR_IO;
    }
}

/* Queues one message (key and value copied); hdrs is owned by librdkafka
 * on success and still the caller's on failure. While the queue is full it
 * serves delivery reports and retries, for at most queue_wait_ms: a record
 * is never dropped, the caller gets SVC_ERR_RETRIABLE instead. */
static svc_err_t produce(prod_t *prod, rd_kafka_topic_t *rkt, const void *key, size_t key_len,
                         const void *value, size_t value_len, rd_kafka_headers_t *hdrs,
                         void *opaque, char *errstr, size_t errstr_size) {
    const char *topic = rd_kafka_topic_name(rkt);
    if (prod->transactional && !prod->txn_open) {
        svc_errf(errstr, errstr_size,
                 "produce to \"%s\": transactional producer outside a transaction "
                 "(call prod_txn_begin first)",
                 topic);
        return SVC_ERR_INVALID;
    }
    int64_t deadline = 0;
    for (;;) {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            prod->rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(RD_KAFKA_PARTITION_UA),
            RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE((void *)value, value_len),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs),
            RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            return SVC_OK;
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return produce_err(prod, err, topic, errstr, errstr_size);
        if (deadline == 0) {
            deadline = prod_now_ms() + prod->queue_wait_ms;
            atomic_fetch_add_explicit(&prod->n_queue_waits, 1, memory_order_relaxed);
        }
        if (prod_now_ms() >= deadline) {
            svc_errf(errstr, errstr_size,
                     "produce to \"%s\": local queue still full after %d ms (%d in flight; "
                     "queue.buffering.max.messages/kbytes)",
                     topic, prod->queue_wait_ms, rd_kafka_outq_len(prod->rk));
            return SVC_ERR_RETRIABLE;
        }
        /* Delivery reports free room; serving them is what makes it. */
        rd_kafka_poll(prod->rk, 10);
    }
}

/* "topic/partition/offset" into buf; false when it does not fit (a topic
 * name is at most 249 bytes, so only a bad name gets there). */
static bool source_str(char *buf, size_t size, const char *topic, int32_t partition,
                       int64_t offset) {
    int n = snprintf(buf, size, "%s/%" PRId32 "/%" PRId64, topic, partition, offset);
    return n > 0 && (size_t)n < size;
}

static bool header_add(rd_kafka_headers_t *hdrs, const char *name, const void *value, size_t len) {
    return rd_kafka_header_add(hdrs, name, -1, value, (ssize_t)len) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

static bool header_adds(rd_kafka_headers_t *hdrs, const char *name, const char *value) {
    return header_add(hdrs, name, value, strlen(value));
}

svc_err_t prod_result_send(prod_t *prod, const prod_result_t *r, void *opaque, char *errstr,
                           size_t errstr_size) {
    char source[320], status[16], gen_id[PROD_REQUEST_ID_LEN + 1];
    if (!r->source_topic || !source_str(source, sizeof source, r->source_topic, r->source_partition,
                                        r->source_offset)) {
        svc_errf(errstr, errstr_size, "result: missing or overlong source_topic");
        return SVC_ERR_INVALID;
    }
    if (!r->value && r->value_len) {
        svc_errf(errstr, errstr_size, "result from %s: value is NULL", source);
        return SVC_ERR_INVALID;
    }
    const char *request_id = r->request_id;
    if (!request_id || !*request_id) {
        if (prod_request_id_new(gen_id) != SVC_OK) {
            svc_errf(errstr, errstr_size, "result from %s: getrandom() failed: %s", source,
                     strerror(errno));
            return SVC_ERR_IO;
        }
        request_id = gen_id;
    }
    const void *key = r->key;
    size_t      key_len = r->key_len;
    if (!key || !key_len) {
        /* SPEC k: an empty request key keys the result by the request id. */
        key = request_id;
        key_len = strlen(request_id);
    }
    snprintf(status, sizeof status, "%d", r->status);

    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(5);
    if (!header_adds(hdrs, "d3-request-id", request_id) ||
        !header_adds(hdrs, "d3-status", status) || !header_adds(hdrs, "d3-source", source) ||
        !header_adds(hdrs, "d3-model", r->model_id ? r->model_id : "") ||
        !header_adds(hdrs, "content-type", prod->content_type)) {
        rd_kafka_headers_destroy(hdrs);
        svc_errf(errstr, errstr_size, "result from %s: cannot build headers", source);
        return SVC_ERR_INTERNAL;
    }
    svc_err_t err = produce(prod, prod->rkt_results, key, key_len, r->value, r->value_len, hdrs,
                            opaque, errstr, errstr_size);
    if (err)
        rd_kafka_headers_destroy(hdrs);
    return err;
}

svc_err_t prod_dlq_send(prod_t *prod, const prod_dlq_t *d, void *opaque, char *errstr,
                        size_t errstr_size) {
    char source[320];
    if (!d->source_topic || !source_str(source, sizeof source, d->source_topic, d->source_partition,
                                        d->source_offset)) {
        svc_errf(errstr, errstr_size, "dead letter: missing or overlong source_topic");
        return SVC_ERR_INVALID;
    }
    if (!prod->rkt_dlq) {
        svc_errf(errstr, errstr_size, "dead letter from %s: the producer has no dlq_topic", source);
        return SVC_ERR_INVALID;
    }
    if (!d->error_code || !d->error_message || (!d->value && d->value_len)) {
        svc_errf(errstr, errstr_size,
                 "dead letter from %s: error_code, error_message and value are required", source);
        return SVC_ERR_INVALID;
    }
    /* The originals first, untouched; ours last, so that header_get_last
     * finds ours even if the original carried the same names. */
    rd_kafka_headers_t *hdrs =
        d->headers ? rd_kafka_headers_copy(d->headers) : rd_kafka_headers_new(3);
    if (!header_adds(hdrs, "d3-error-code", d->error_code) ||
        !header_adds(hdrs, "d3-error-message", d->error_message) ||
        !header_adds(hdrs, "d3-source", source)) {
        rd_kafka_headers_destroy(hdrs);
        svc_errf(errstr, errstr_size, "dead letter from %s: cannot build headers", source);
        return SVC_ERR_INTERNAL;
    }
    svc_err_t err = produce(prod, prod->rkt_dlq, d->key, d->key ? d->key_len : 0, d->value,
                            d->value_len, hdrs, opaque, errstr, errstr_size);
    if (err)
        rd_kafka_headers_destroy(hdrs);
    return err;
}
