/*
 * ops_serve_txn.c -- `serve --exactly-once`: the results of consecutive
 * records go out in one Kafka transaction together with the consumed
 * offsets (send_offsets_to_transaction), so a read_committed reader sees
 * each result exactly once and the group's committed offsets move with
 * them, atomically.
 *
 * A transaction is committed every commit_ms (or 1,000 results, or at a
 * revoke or shutdown). When it must abort (an abortable broker error, a
 * failed delivery, a record that could not be answered) nothing of it is
 * visible and its offsets are not committed: the consumer rewinds to the
 * committed offsets and the same records are answered again in the next
 * transaction. A record's own failure is likely to come back with it, so
 * after TXN_RECORD_ABORTS such aborts in a row the process stops (exit 3)
 * instead of spinning on it. A fenced producer (another instance took the
 * transactional id) stops the process too: a zombie must not go on.
 */
#include "ops_serve_int.h"

#include <librdkafka/rdkafka.h>

#define TXN_MAX_RESULTS 1000
#define TXN_RETRIES     5
#define TXN_REWIND_MS   30000
#define TXN_FLUSH_MS    30000
/* Aborts in a row, no commit between, for a record's failure. */
#define TXN_RECORD_ABORTS 5

bool ops_serve_txn_ensure(serve_t *s) {
    if (s->txn_open)
        return true;
    char      errstr[512] = "";
    svc_err_t err = prod_txn_begin(s->prod, errstr, sizeof errstr);
    if (err) {
        fprintf(stderr, "d3stream serve: %s\n", errstr);
        s->fatal = true;
        return false;
    }
    /* txn_failed is not cleared here: a record abandoned while no
     * transaction was open must still stop the next one from committing
     * past it. */
    s->txn_open = true;
    s->txn_t0 = ops_serve_now_s();
    return true;
}

void ops_serve_txn_add(serve_t *s, job_t *j) {
    if (s->txn_tail)
        s->txn_tail->next = j;
    else
        s->txn_head = j;
    s->txn_tail = j;
    s->txn_n++;
}

/* offset + 1 of the last result of each partition in the transaction
 * (the list is in input order per partition). */
static rd_kafka_topic_partition_list_t *txn_offsets(const serve_t *s) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(8);
    for (const job_t *j = s->txn_head; l && j; j = j->next) {
        const char                 *topic = cons_msg_topic(j->msg);
        int32_t                     part = cons_msg_partition(j->msg);
        rd_kafka_topic_partition_t *p = rd_kafka_topic_partition_list_find(l, topic, part);
        if (!p)
            p = rd_kafka_topic_partition_list_add(l, topic, part);
        if (cons_msg_offset(j->msg) + 1 > p->offset || p->offset < 0)
            p->offset = cons_msg_offset(j->msg) + 1;
    }
    return l;
}

/* send_offsets + commit, retrying what librdkafka calls retriable. The
 * delivery reports are served first: a record that failed must abort the
 * transaction before its offsets are sent (SVC_ERR_TXN_ABORT, txn_failed
 * set). After that flush nothing of it can fail unseen: librdkafka fails
 * the commit itself on a delivery that fails during it. */
static svc_err_t txn_commit(serve_t *s, char *errstr, size_t errstr_size) {
    if (prod_flush(s->prod, TXN_FLUSH_MS)) {
        /* Still in flight: the commit waits for it, and fails on its own if
         * it then fails. */
    }
    if (s->txn_failed)
        return SVC_ERR_TXN_ABORT;
    rd_kafka_topic_partition_list_t    *offsets = txn_offsets(s);
    rd_kafka_consumer_group_metadata_t *cgmd = cons_group_metadata(s->cons);
    svc_err_t                           err = SVC_ERR_NOMEM;
    if (offsets && cgmd) {
        err = SVC_ERR_RETRIABLE;
        for (int i = 0; i < TXN_RETRIES && err == SVC_ERR_RETRIABLE; i++)
            err = prod_txn_send_offsets(s->prod, offsets, cgmd, errstr, errstr_size);
    } else if (offsets) {
        svc_errf(errstr, errstr_size, "the consumer has no group metadata yet");
        err = SVC_ERR_TXN_ABORT;
    }
    if (offsets)
        rd_kafka_topic_partition_list_destroy(offsets);
    if (cgmd)
        rd_kafka_consumer_group_metadata_destroy(cgmd);
    if (err) /* never commit the results without their offsets */
        return err;
    err = SVC_ERR_RETRIABLE;
    for (int i = 0; i < TXN_RETRIES && err == SVC_ERR_RETRIABLE; i++)
        err = prod_txn_commit(s->prod, errstr, errstr_size);
    return err;
}

/* Finishes the transaction's jobs: committed (answered) or abandoned. */
static void txn_finish(serve_t *s, bool committed) {
    job_t *j = s->txn_head;
    while (j) {
        job_t *next = j->next;
        j->next = NULL;
        if (committed) {
            s->n.answered++;
            s->n.by_status[j->status / 100 < 6 ? j->status / 100 : 5]++;
        } else {
            s->n.abandoned++;
        }
        cons_msg_done(s->cons, j->msg, committed);
        j->msg = NULL; /* a late delivery report may still come (job_log) */
        ops_serve_job_release(j);
        j = next;
    }
    s->txn_head = s->txn_tail = NULL;
    s->txn_n = 0;
    s->txn_open = false;
}

/* Abort: nothing of the transaction (if one is open) is visible; consume
 * again from the committed offsets. Every record in the FIFO becomes stale
 * (new generations), so it is dropped instead of published. */
static void txn_abort(serve_t *s, const char *why) {
    char      errstr[512] = "";
    svc_err_t err = SVC_OK;
    if (s->txn_open) {
        fprintf(stderr,
                "d3stream serve: transaction of %zu results aborted: %s; rewinding to the "
                "committed offsets\n",
                s->txn_n, why);
        /* A retriable abort (a timeout) resumes when called again. */
        err = SVC_ERR_RETRIABLE;
        for (int i = 0; i < TXN_RETRIES && err == SVC_ERR_RETRIABLE; i++)
            err = prod_txn_abort(s->prod, errstr, sizeof errstr);
        s->n.txn_aborts++;
        txn_finish(s, false);
    } else {
        fprintf(stderr, "d3stream serve: %s; rewinding to the committed offsets\n", why);
    }
    s->txn_failed = false; /* what failed is consumed again after the rewind */
    /* Abandoned jobs are not re-counted when they are answered again. */
    if (err) {
        fprintf(stderr, "d3stream serve: %s\n", errstr);
        s->fatal = true;
    } else if (s->txn_record_aborts >= TXN_RECORD_ABORTS) {
        fprintf(stderr,
                "d3stream serve: stopping: %d times in a row a record failed and was rewound "
                "to (see the log lines before); its offset is not committed\n",
                s->txn_record_aborts);
        s->fatal = true;
    } else if (cons_rewind(s->cons, TXN_REWIND_MS)) {
        fprintf(stderr, "d3stream serve: rewind: %s\n", cons_strerror(s->cons));
        s->fatal = true;
    }
}

/* A record failed (delivery) or was abandoned: abort now, so that no
 * offset past it is committed; true when that happened. */
static bool txn_record_failed(serve_t *s) {
    if (!s->txn_failed)
        return false;
    s->txn_record_aborts++;
    txn_abort(s, "a record failed delivery or could not be answered");
    return true;
}

void ops_serve_txn_maybe_commit(serve_t *s, bool force) {
    if (txn_record_failed(s) || !s->txn_open)
        return;
    if (s->txn_n == 0 && !force)
        return;
    if (!force && s->txn_n < TXN_MAX_RESULTS &&
        ops_serve_now_s() - s->txn_t0 < s->o->commit_ms / 1000.0)
        return;
    char      errstr[512] = "";
    svc_err_t err = s->txn_n ? txn_commit(s, errstr, sizeof errstr) : SVC_OK;
    if (err == SVC_ERR_TXN_ABORT && txn_record_failed(s))
        return; /* the flush before the commit served a failed report */
    if (err == SVC_OK && s->txn_n == 0)
        err = prod_txn_commit(s->prod, errstr, sizeof errstr); /* an empty one: close it */
    if (err == SVC_OK) {
        s->n.txn_commits++;
        if (s->txn_n)
            s->txn_record_aborts = 0;
        txn_finish(s, true);
        return;
    }
    if (err == SVC_ERR_FATAL || err == SVC_ERR_NOMEM || err == SVC_ERR_RETRIABLE) {
        /* Retriable still after TXN_RETRIES: the call timed out each time. It
         * cannot be aborted (librdkafka refuses another call while one is
         * resumable) and the commit may have happened; the next instance
         * with this transactional id completes or aborts it at init. */
        fprintf(stderr, "d3stream serve: transaction: %s; stopping (%s)\n", errstr,
                err == SVC_ERR_RETRIABLE
                    ? "timed out on every try: a restart settles it"
                    : "another instance with this transactional id took over, or the producer "
                      "failed");
        s->fatal = true;
        txn_finish(s, false);
        return;
    }
    txn_abort(s, errstr);
}

/* A rebalance takes partitions away. At least once: deliver what is
 * answered, so its offsets are stored and committed by the unassign (what
 * the engine still has becomes stale and is answered by the new owner).
 * Exactly once: publish what is answered and commit the transaction now,
 * while this member still owns the partitions. */
void ops_serve_on_revoke(void *user, const char *topic, int32_t partition) {
    serve_t *s = user;
    (void)topic;
    (void)partition;
    if (!s->prod)
        return;
    ops_serve_publish_ready(s);
    if (s->o->eos) {
        ops_serve_txn_maybe_commit(s, true);
        return;
    }
    if (prod_flush(s->prod, 30000))
        fprintf(stderr, "d3stream serve: revoke: results still in flight after 30 s\n");
}
