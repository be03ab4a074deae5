/*
 * prod_txn.c -- transactions for --exactly-once: begin, the consumer's
 * offsets, commit or abort, each error classified for the caller's loop
 * (librdkafka examples/transactions.c).
 */
#include "prod_int.h"

/* Classifies and destroys error; errstr gets "<call>: <reason> (<name>)". */
static svc_err_t txn_err(rd_kafka_error_t *error, const char *call, char *errstr,
                         size_t errstr_size) {
    svc_err_t err;
    if (rd_kafka_error_is_fatal(error))
        err = SVC_ERR_FATAL;
    else if (rd_kafka_error_txn_requires_abort(error))
        err = SVC_ERR_TXN_ABORT;
    else if (rd_kafka_error_is_retriable(error))
        err = SVC_ERR_RETRIABLE;
    else if (rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__STATE ||
             rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__INVALID_ARG ||
             rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__CONFLICT)
        err = SVC_ERR_INVALID; /* called out of order: a bug in the caller */
    else
        err = SVC_ERR_IO;
    svc_errf(errstr, errstr_size, "%s: %s (%s)", call, rd_kafka_error_string(error),
             rd_kafka_error_name(error));
    rd_kafka_error_destroy(error);
    return err;
}

static bool check_transactional(prod_t *prod, const char *call, char *errstr, size_t errstr_size) {
    if (prod->transactional)
        return true;
    svc_errf(errstr, errstr_size, "%s: the producer is not transactional", call);
    return false;
}

svc_err_t prod_txn_begin(prod_t *prod, char *errstr, size_t errstr_size) {
    if (!check_transactional(prod, "begin_transaction", errstr, errstr_size))
        return SVC_ERR_INVALID;
    rd_kafka_error_t *error = rd_kafka_begin_transaction(prod->rk);
    if (error)
        return txn_err(error, "begin_transaction", errstr, errstr_size);
    prod->txn_open = true;
    return SVC_OK;
}

svc_err_t prod_txn_send_offsets(prod_t *prod, const struct rd_kafka_topic_partition_list_s *offsets,
                                const struct rd_kafka_consumer_group_metadata_s *cgmd, char *errstr,
                                size_t errstr_size) {
    if (!check_transactional(prod, "send_offsets_to_transaction", errstr, errstr_size))
        return SVC_ERR_INVALID;
    rd_kafka_error_t *error =
        rd_kafka_send_offsets_to_transaction(prod->rk, offsets, cgmd, prod->txn_timeout_ms);
    if (error)
        return txn_err(error, "send_offsets_to_transaction", errstr, errstr_size);
    return SVC_OK;
}

svc_err_t prod_txn_commit(prod_t *prod, char *errstr, size_t errstr_size) {
    if (!check_transactional(prod, "commit_transaction", errstr, errstr_size))
        return SVC_ERR_INVALID;
    /* commit_transaction flushes through rd_kafka_flush, which serves the
     * delivery reports here, on the owner's thread. */
    rd_kafka_error_t *error = rd_kafka_commit_transaction(prod->rk, prod->txn_timeout_ms);
    prod_drain(prod);
    if (error)
        return txn_err(error, "commit_transaction", errstr, errstr_size);
    prod->txn_open = false;
    return SVC_OK;
}

svc_err_t prod_txn_abort(prod_t *prod, char *errstr, size_t errstr_size) {
    if (!check_transactional(prod, "abort_transaction", errstr, errstr_size))
        return SVC_ERR_INVALID;
    rd_kafka_error_t *error = rd_kafka_abort_transaction(prod->rk, prod->txn_timeout_ms);
    /* The purged messages' reports are queued by now: hand them over. */
    prod_drain(prod);
    if (error)
        return txn_err(error, "abort_transaction", errstr, errstr_size);
    prod->txn_open = false;
    return SVC_OK;
}
