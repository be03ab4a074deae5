/*
 * cons.c -- the consumer group member: librdkafka handle, rebalance and
 * statistics callbacks, the in-flight window, offset storing (consumer.h).
 *
 * Shared state: the tracker, in_flight, the parked messages and the end
 * offsets are read by cons_msg_done() from any thread, so they sit under
 * cons->lock. Everything librdkafka calls back (rebalance, statistics,
 * errors) runs inside rd_kafka_consumer_poll or rd_kafka_consumer_close, on
 * the poll thread; `paused` and `closed` are poll-thread only. The lock is
 * never held across a user callback (on_revoke may call cons_msg_done).
 */
#include "cons_int.h"

#include <inttypes.h>

void cons_report(cons_t *cons, const char *fmt, ...) {
    char    msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&cons->lock);
    snprintf(cons->err, sizeof cons->err, "%s", msg);
    pthread_mutex_unlock(&cons->lock);
    fprintf(stderr, "d3stream consumer: %s\n", msg);
}

/* ------------------------------------------------------------ end offsets */

/* @locks lock MUST be held */
static end_ent_t *end_find(cons_t *cons, const char *topic, int32_t partition) {
    for (size_t i = 0; i < cons->n_ends; i++)
        if (cons->ends[i].partition == partition && strcmp(cons->ends[i].topic, topic) == 0)
            return &cons->ends[i];
    return NULL;
}

/* @locks lock MUST be held */
static svc_err_t end_add(cons_t *cons, const char *topic, int32_t partition, int64_t end,
                         bool reached) {
    if (cons->n_ends == cons->cap_ends) {
        size_t     cap = cons->cap_ends ? cons->cap_ends * 2 : 16;
        end_ent_t *e = realloc(cons->ends, cap * sizeof *e);
        if (!e)
            return SVC_ERR_NOMEM;
        cons->ends = e;
        cons->cap_ends = cap;
    }
    char *t = strdup(topic);
    if (!t)
        return SVC_ERR_NOMEM;
    cons->ends[cons->n_ends++] =
        (end_ent_t){.topic = t, .partition = partition, .end = end, .reached = reached};
    return SVC_OK;
}

/* Records, on first assignment only, where the partition ends now: a backfill
 * stops there even if producers keep writing. Assigned again, the partition
 * resumes from its committed offset, which may lie before what this member
 * had reached (what was stale at the revoke): it must be reached again (a
 * message at the end, or the partition EOF there).
 * @locality poll thread (rebalance callback) @locks takes lock */
void cons_end_note_assigned(cons_t *cons, const char *topic, int32_t partition) {
    pthread_mutex_lock(&cons->lock);
    end_ent_t *e = end_find(cons, topic, partition);
    if (e) {
        e->assigned = true;
        e->reached = e->end <= 0;
    }
    pthread_mutex_unlock(&cons->lock);
    if (e)
        return;
    int64_t             lo = 0, hi = 0;
    rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(cons->rk, topic, partition, &lo, &hi,
                                                               WATERMARK_TIMEOUT_MS);
    if (err) {
        /* A partition EOF still ends it: EOF is at or past the old end. */
        cons_report(cons, "query watermarks of %s [%" PRId32 "]: %s (waiting for EOF instead)",
                    topic, partition, rd_kafka_err2str(err));
        hi = INT64_MAX;
    }
    pthread_mutex_lock(&cons->lock);
    if (end_add(cons, topic, partition, hi, hi <= lo) == SVC_OK)
        cons->ends[cons->n_ends - 1].assigned = true;
    pthread_mutex_unlock(&cons->lock);
}

/* @locks lock MUST be held */
static void end_mark(cons_t *cons, const char *topic, int32_t partition, int64_t next) {
    end_ent_t *e = end_find(cons, topic, partition);
    if (e && next >= e->end)
        e->reached = true;
}

void cons_end_rewound(cons_t *cons, const char *topic, int32_t partition, int64_t next) {
    end_ent_t *e = end_find(cons, topic, partition);
    if (e)
        e->reached = next >= e->end;
}

bool cons_at_end(cons_t *cons) {
    if (!cons->stop_at_end)
        return false;
    pthread_mutex_lock(&cons->lock);
    bool at_end = cons->assigned_once && cons->in_flight == 0 && cons->n_parked == 0;
    for (size_t i = 0; at_end && i < cons->n_ends; i++)
        if (cons->ends[i].assigned && !cons->ends[i].reached)
            at_end = false;
    pthread_mutex_unlock(&cons->lock);
    return at_end;
}

/* ----------------------------------------------------------------- window */

/* Pauses or resumes the whole assignment. Returns false if librdkafka
 * refused (reported), so the window state is left as it was.
 * @locality poll thread @locks none */
static bool assignment_pause(cons_t *cons, bool pause) {
    rd_kafka_topic_partition_list_t *parts = NULL;
    rd_kafka_resp_err_t              err = rd_kafka_assignment(cons->rk, &parts);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && parts->cnt > 0)
        err = pause ? rd_kafka_pause_partitions(cons->rk, parts)
                    : rd_kafka_resume_partitions(cons->rk, parts);
    if (parts)
        rd_kafka_topic_partition_list_destroy(parts);
    if (err) {
        cons_report(cons, "%s the assignment: %s", pause ? "pause" : "resume",
                    rd_kafka_err2str(err));
        return false;
    }
    return true;
}

/* A message's bytes, as the window counts them. */
static size_t msg_bytes(const rd_kafka_message_t *rkm) {
    return rkm->len + rkm->key_len;
}

/* The bytes gauge after a change. @locks lock MUST be held */
static void bytes_note(cons_t *cons) {
    atomic_store(&cons->bytes_now, (int64_t)(cons->bytes_in_flight + cons->bytes_parked));
}

/* Whether a message of n bytes fits beside what is out (none out: any
 * does, or one large record would stall the partition for ever).
 * @locks lock MUST be held */
static bool bytes_fit(const cons_t *cons, size_t n) {
    return !cons->max_bytes || cons->bytes_in_flight == 0 ||
           cons->bytes_in_flight + n <= cons->max_bytes;
}

/* Closes the window at max_in_flight and opens it again below low_water.
 * Fetching stops while closed, polling does not (max.poll.interval.ms).
 * @locality poll thread @locks takes lock */
void cons_window_update(cons_t *cons) {
    pthread_mutex_lock(&cons->lock);
    size_t held = cons->in_flight;
    size_t waiting = cons->n_parked;
    size_t bytes = cons->bytes_in_flight + cons->bytes_parked;
    pthread_mutex_unlock(&cons->lock);
    /* The same with bytes: a window of records, each up to the broker's
     * largest (and more once decompressed), bounds no memory by itself. */
    bool over_bytes = cons->max_bytes && bytes >= cons->max_bytes;
    bool under_bytes = !cons->max_bytes || bytes < cons->max_bytes - cons->max_bytes / 4;
    /* Parked messages count: a poll that only serves (cons_poll without
     * out) parks what it fetches, and that must stay within the window. */
    if (!cons->paused && (held + waiting >= cons->max_in_flight || over_bytes)) {
        if (assignment_pause(cons, true)) {
            cons->paused = true;
            atomic_fetch_add(&cons->pauses, 1);
        }
    } else if (cons->paused && held + waiting < cons->low_water && under_bytes) {
        if (assignment_pause(cons, false)) {
            cons->paused = false;
            atomic_fetch_add(&cons->resumes, 1);
        }
    }
}

/* @locks lock MUST be held */
static svc_err_t park(cons_t *cons, rd_kafka_message_t *rkm) {
    if (cons->n_parked == cons->cap_parked) {
        size_t               cap = cons->cap_parked ? cons->cap_parked * 2 : 16;
        rd_kafka_message_t **p = realloc(cons->parked, cap * sizeof *p);
        if (!p)
            return SVC_ERR_NOMEM;
        cons->parked = p;
        cons->cap_parked = cap;
    }
    cons->parked[cons->n_parked++] = rkm;
    cons->bytes_parked += msg_bytes(rkm);
    bytes_note(cons);
    return SVC_OK;
}

/* Drops parked messages of a revoked partition: never handed out, never
 * stored, so the next owner consumes them.
 * @locks lock MUST be held */
void cons_parked_drop(cons_t *cons, const char *topic, int32_t partition) {
    size_t w = 0;
    for (size_t r = 0; r < cons->n_parked; r++) {
        rd_kafka_message_t *rkm = cons->parked[r];
        if (rkm->partition == partition && strcmp(rd_kafka_topic_name(rkm->rkt), topic) == 0) {
            cons->bytes_parked -= msg_bytes(rkm);
            bytes_note(cons);
            rd_kafka_message_destroy(rkm);
        } else
            cons->parked[w++] = rkm;
    }
    cons->n_parked = w;
}

/* Without memory to track or park a message, it goes back to librdkafka:
 * seeking to its offset fetches it again later, so nothing is skipped.
 * @locality poll thread @locks none */
static svc_err_t requeue(cons_t *cons, rd_kafka_message_t *rkm) {
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    if (parts) {
        rd_kafka_topic_partition_list_add(parts, rd_kafka_topic_name(rkm->rkt), rkm->partition)
            ->offset = rkm->offset;
        rd_kafka_error_t *error = rd_kafka_seek_partitions(cons->rk, parts, 0);
        if (error)
            rd_kafka_error_destroy(error);
        rd_kafka_topic_partition_list_destroy(parts);
    }
    rd_kafka_message_destroy(rkm);
    return SVC_ERR_NOMEM;
}

/* ---------------------------------------------------------------- messages */

/* Tracks rkm and wraps it for the caller, or drops it (revoked partition).
 * @locality poll thread @locks takes lock */
static svc_err_t hand_out(cons_t *cons, rd_kafka_message_t *rkm, cons_msg_t **out) {
    const char *topic = rd_kafka_topic_name(rkm->rkt);
    cons_msg_t *msg = calloc(1, sizeof *msg);
    if (!msg)
        return requeue(cons, rkm);
    pthread_mutex_lock(&cons->lock);
    svc_err_t err = cons_track_add(cons->ct, topic, rkm->partition, rkm->offset, &msg->gen);
    if (err == SVC_ERR_INVALID && !cons_track_has(cons->ct, topic, rkm->partition)) {
        pthread_mutex_unlock(&cons->lock);
        free(msg);
        rd_kafka_message_destroy(rkm);
        return SVC_OK;
    }
    if (err == SVC_ERR_NOMEM) {
        pthread_mutex_unlock(&cons->lock);
        free(msg);
        return requeue(cons, rkm);
    }
    /* SVC_ERR_INVALID here: an offset at or below one already tracked, i.e.
     * fetched again within the assignment. Its first copy holds the stored
     * offset back, so this one goes out untracked (gen 0). */
    cons->in_flight++;
    cons->bytes_in_flight += msg_bytes(rkm);
    bytes_note(cons);
    if (cons->stop_at_end)
        end_mark(cons, topic, rkm->partition, rkm->offset + 1);
    int64_t held = (int64_t)cons->in_flight;
    pthread_mutex_unlock(&cons->lock);
    atomic_store(&cons->in_flight_now, held);
    int64_t max = atomic_load(&cons->in_flight_max);
    while (held > max && !atomic_compare_exchange_weak(&cons->in_flight_max, &max, held))
        ;
    atomic_fetch_add(&cons->messages, 1);
    msg->rkm = rkm;
    *out = msg;
    return SVC_OK;
}

/* An event instead of a message: partition EOF or a consumer error.
 * @locality poll thread */
static svc_err_t poll_event(cons_t *cons, rd_kafka_message_t *rkm) {
    const char *topic = rkm->rkt ? rd_kafka_topic_name(rkm->rkt) : "-";
    if (rkm->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        pthread_mutex_lock(&cons->lock);
        end_mark(cons, topic, rkm->partition, INT64_MAX);
        pthread_mutex_unlock(&cons->lock);
    } else {
        atomic_fetch_add(&cons->errors, 1);
        cons_report(cons, "%s [%" PRId32 "] @%" PRId64 ": %s", topic, rkm->partition, rkm->offset,
                    rd_kafka_message_errstr(rkm));
        if (rkm->err == RD_KAFKA_RESP_ERR__FATAL)
            atomic_store(&cons->fatal, true);
    }
    rd_kafka_message_destroy(rkm);
    return atomic_load(&cons->fatal) ? SVC_ERR_IO : SVC_OK;
}

svc_err_t cons_poll(cons_t *cons, int timeout_ms, cons_msg_t **out) {
    bool serve_only = out == NULL;
    if (out)
        *out = NULL;
    if (cons->closed)
        return SVC_ERR_INVALID;
    if (atomic_load(&cons->fatal))
        return SVC_ERR_IO;
    cons_window_update(cons);
    pthread_mutex_lock(&cons->lock);
    rd_kafka_message_t *rkm = NULL;
    if (!serve_only && cons->n_parked > 0 && cons->in_flight < cons->max_in_flight &&
        bytes_fit(cons, msg_bytes(cons->parked[0]))) {
        rkm = cons->parked[0];
        cons->n_parked--;
        cons->bytes_parked -= msg_bytes(rkm);
        bytes_note(cons);
        memmove(cons->parked, cons->parked + 1, cons->n_parked * sizeof *cons->parked);
    }
    pthread_mutex_unlock(&cons->lock);
    if (!rkm) {
        rkm = rd_kafka_consumer_poll(cons->rk, timeout_ms);
        if (!rkm)
            return atomic_load(&cons->fatal) ? SVC_ERR_IO : SVC_OK;
        if (rkm->err)
            return poll_event(cons, rkm);
        /* Fetched before the pause took effect (or while the caller only
         * serves): hold it back until it can be handed out, so the owner
         * never holds more than the window. */
        pthread_mutex_lock(&cons->lock);
        /* Behind parked ones, in fetch order. */
        bool hold = serve_only || cons->in_flight >= cons->max_in_flight || cons->n_parked > 0 ||
                    !bytes_fit(cons, msg_bytes(rkm));
        svc_err_t err = hold ? park(cons, rkm) : SVC_OK;
        pthread_mutex_unlock(&cons->lock);
        if (err)
            return requeue(cons, rkm);
        if (hold) {
            cons_window_update(cons);
            return SVC_OK;
        }
    }
    svc_err_t err = hand_out(cons, rkm, out);
    cons_window_update(cons);
    return err;
}

void cons_msg_done(cons_t *cons, cons_msg_t *msg, bool delivered) {
    if (!msg)
        return;
    rd_kafka_message_t *rkm = msg->rkm;
    const char         *topic = rd_kafka_topic_name(rkm->rkt);
    char                why[256] = "";
    pthread_mutex_lock(&cons->lock);
    int64_t          next = 0;
    cons_track_res_t res = CONS_TRACK_STALE;
    if (msg->gen != 0)
        res = cons_track_done(cons->ct, topic, rkm->partition, msg->gen, rkm->offset, delivered,
                              &next);
    if (res == CONS_TRACK_ADVANCED) {
        /* Under the lock: two threads storing for one partition must not
         * reorder an older offset after a newer one. */
        rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
        rd_kafka_resp_err_t              err = RD_KAFKA_RESP_ERR__NOENT;
        if (parts) {
            rd_kafka_topic_partition_list_add(parts, topic, rkm->partition)->offset = next;
            err = rd_kafka_offsets_store(cons->rk, parts);
            if (!err)
                err = parts->elems[0].err;
            rd_kafka_topic_partition_list_destroy(parts);
        }
        if (err == RD_KAFKA_RESP_ERR__STATE) {
            /* librdkafka no longer has it assigned (revoke in progress). */
            res = CONS_TRACK_STALE;
        } else if (err) {
            snprintf(why, sizeof why, "store offset %" PRId64 " of %s [%" PRId32 "]: %s", next,
                     topic, rkm->partition, rd_kafka_err2str(err));
        } else {
            atomic_fetch_add(&cons->stored, 1);
        }
    }
    if (res == CONS_TRACK_STALE && msg->gen != 0)
        atomic_fetch_add(&cons->stale, 1);
    SVC_ASSERT(cons->in_flight > 0);
    cons->in_flight--;
    cons->bytes_in_flight -= msg_bytes(rkm);
    bytes_note(cons);
    atomic_store(&cons->in_flight_now, (int64_t)cons->in_flight);
    pthread_mutex_unlock(&cons->lock);
    if (why[0])
        cons_report(cons, "%s", why);
    rd_kafka_message_destroy(rkm);
    free(msg);
}

bool cons_msg_current(cons_t *cons, const cons_msg_t *msg) {
    if (!msg || msg->gen == 0)
        return false;
    pthread_mutex_lock(&cons->lock);
    bool cur = cons_track_gen(cons->ct, rd_kafka_topic_name(msg->rkm->rkt), msg->rkm->partition) ==
               msg->gen;
    pthread_mutex_unlock(&cons->lock);
    return cur;
}

const char *cons_msg_topic(const cons_msg_t *msg) {
    return rd_kafka_topic_name(msg->rkm->rkt);
}

int32_t cons_msg_partition(const cons_msg_t *msg) {
    return msg->rkm->partition;
}

int64_t cons_msg_offset(const cons_msg_t *msg) {
    return msg->rkm->offset;
}

const void *cons_msg_key(const cons_msg_t *msg, size_t *len) {
    *len = msg->rkm->key_len;
    return msg->rkm->key;
}

const void *cons_msg_value(const cons_msg_t *msg, size_t *len) {
    *len = msg->rkm->len;
    return msg->rkm->payload;
}

/* Headers are parsed by librdkafka on first access; cached on the message.
 * The caller owns msg, so no lock. */
static rd_kafka_headers_t *msg_headers(const cons_msg_t *msg) {
    cons_msg_t *m = (cons_msg_t *)msg;
    if (!m->hdrs && rd_kafka_message_headers(m->rkm, &m->hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
        m->hdrs = NULL;
    return m->hdrs;
}

size_t cons_msg_header_count(const cons_msg_t *msg) {
    rd_kafka_headers_t *hdrs = msg_headers(msg);
    return hdrs ? rd_kafka_header_cnt(hdrs) : 0;
}

bool cons_msg_header(const cons_msg_t *msg, size_t idx, const char **name, const void **value,
                     size_t *len) {
    rd_kafka_headers_t *hdrs = msg_headers(msg);
    return hdrs && rd_kafka_header_get_all(hdrs, idx, name, value, len) == 0;
}
