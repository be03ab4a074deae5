/*
 * ops_serve_job.c -- one consumed record's way through `d3stream serve`:
 * decode (JSON, or Avro through the Confluent framing and the registry),
 * validate, hand the request to the engine's scheduler, and -- once it and
 * every record before it are answered -- produce its result record (and
 * its dead-letter record when the bytes could not be decoded).
 *
 * Records that need no engine (undecodable, invalid, too large) get their
 * error body at once but still wait in the FIFO for the records before
 * them, so a partition's results keep their input order.
 */
#include "ops_serve_int.h"

#include <librdkafka/rdkafka.h>
#include <time.h>

double ops_serve_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------ decoding */

/* The request id: the request's d3-request-id header when it has a usable
 * one (correlation across hops), else a new one. */
static bool request_id(const cons_msg_t *msg, char rid[SERVE_RID_MAX + 1]) {
    for (size_t i = 0; i < cons_msg_header_count(msg); i++) {
        const char *name;
        const void *v;
        size_t      n;
        if (cons_msg_header(msg, i, &name, &v, &n) && strcmp(name, "d3-request-id") == 0 && v &&
            n > 0 && n <= SERVE_RID_MAX && !memchr(v, '\0', n)) {
            memcpy(rid, v, n);
            rid[n] = '\0';
            return true;
        }
    }
    return prod_request_id_new(rid) == SVC_OK;
}

/* Starts a log line about j's record (request_id, topic, partition,
 * offset); false when lv is not logged. */
static bool job_log(ops_log_t *l, ops_log_level_t lv, const char *msg, const job_t *j) {
    if (!ops_log_begin(l, lv, msg))
        return false;
    ops_log_str(l, "request_id", j->rid);
    if (j->msg) { /* NULL: its transaction ended before this report (ops_serve_txn.c) */
        ops_log_str(l, "topic", cons_msg_topic(j->msg));
        ops_log_int(l, "partition", (long long)cons_msg_partition(j->msg));
        ops_log_int(l, "offset", (long long)cons_msg_offset(j->msg));
    }
    return true;
}

/* Avro: framed bytes -> the request's JSON body. Returns SVC_OK, SVC_ERR_FORMAT
 * (undecodable: errstr says why), SVC_ERR_TOO_LARGE (body over the limit),
 * SVC_ERR_IO (the registry could not be asked: worth a retry, not a verdict)
 * or SVC_ERR_NOMEM (ours, not the record's: no verdict either). */
static svc_err_t avro_to_json(serve_t *s, const void *v, size_t len, svc_buf_t *json, char *errstr,
                              size_t errstr_size) {
    uint32_t    id;
    const void *body;
    size_t      blen;
    char        why[512] = "";
    svc_err_t   err = sch_frame_parse(v, len, &id, &body, &blen, why, sizeof why);
    if (err) {
        svc_errf(errstr, errstr_size, "the record is not Confluent-framed Avro: %s", why);
        return SVC_ERR_FORMAT;
    }
    sch_avro_writer_t *w = NULL;
    err = sch_registry_writer(s->reg, id, SCH_AVRO_REQUEST, &w, why, sizeof why);
    if (err == SVC_ERR_INVALID || err == SVC_ERR_FORMAT) {
        svc_errf(errstr, errstr_size, "unknown schema id %u: %s", id, why);
        return SVC_ERR_FORMAT;
    }
    if (err) {
        svc_errf(errstr, errstr_size, "schema id %u: %s", id, why);
        return err == SVC_ERR_IO ? SVC_ERR_IO : SVC_ERR_NOMEM;
    }
    err = sch_avro_request_to_json(w, body, blen, json, why, sizeof why);
    sch_avro_writer_free(w);
    if (err == SVC_ERR_TOO_LARGE)
        return err;
    if (err) {
        svc_errf(errstr, errstr_size, "the Avro body (schema id %u) cannot be decoded: %s", id,
                 why);
        return SVC_ERR_FORMAT;
    }
    return SVC_OK;
}

/* An error body of our own (sch_error_encode) into out; returns its status. */
static int own_error(svc_buf_t *out, int status, const char *code, const char *msg) {
    sch_error_t e;
    sch_error_init(&e);
    sch_error_set(&e, status, code, "%s", msg);
    svc_buf_reset(out);
    if (sch_error_encode(&e, out))
        status = -1;
    sch_error_fini(&e);
    return status;
}

/* An engine failure on one request: the 500 the shim would answer. */
static int internal_error(svc_buf_t *out, const char *why) {
    char m[1100];
    snprintf(m, sizeof m, "RuntimeError: %s",
             why && why[0] ? why : "the request could not be answered");
    return own_error(out, 500, "internal_error", m);
}

/* Decodes j's record: sets j->req (for the engine), or j->out/j->status
 * (an answer without the engine: error bodies), or j->status 0 (registry
 * down: stop) / -1 (internal failure). */
static void decode(serve_t *s, job_t *j) {
    size_t      vlen = 0;
    const char *v = cons_msg_value(j->msg, &vlen);
    svc_buf_t   json;
    /* One byte past the limit, so that the decoder answers 413 itself. */
    svc_buf_init(&json, ops_max_request_bytes() + 2);
    if (s->o->avro) {
        svc_err_t err = avro_to_json(s, v, vlen, &json, j->why, sizeof j->why);
        if (err == SVC_ERR_IO) {
            j->status = 0;
        } else if (err == SVC_ERR_NOMEM) {
            j->status = -1;
        } else if (err == SVC_ERR_FORMAT) {
            j->undecodable = true;
            j->status = own_error(&j->out, 400, "invalid_request", j->why);
        } else if (err == SVC_ERR_TOO_LARGE) {
            char m[96];
            snprintf(m, sizeof m, "the request body exceeds %zu bytes", ops_max_request_bytes());
            j->status = own_error(&j->out, 413, "request_too_large", m);
        }
        if (err) {
            svc_buf_fini(&json);
            return;
        }
        v = json.data;
        vlen = json.len;
    }
    int http = 500;
    int rc = ops_decode_request(s->ask.pkg, s->ask.dir,
                                OPS_DECODE_ENGINE | ops_decode_vision(s->ask.model), v ? v : "",
                                vlen, &j->req, &j->out, &http, j->why, sizeof j->why);
    svc_buf_fini(&json);
    if (rc == OPS_EXIT_VERDICT)
        j->status = http;
    else if (rc != OPS_EXIT_OK)
        j->status = internal_error(&j->out, j->why);
}

/* ------------------------------------------------------------ the engine */

static void set_ready(job_t *j) {
    serve_t *s = j->s;
    pthread_mutex_lock(&s->lock);
    j->ready = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* The scheduler's completion, on a worker thread: encode the body here
 * (the work spreads over the workers), then hand the job back. */
static void engine_done(void *user, eng_answers_t *ans, svc_err_t err, const char *errstr) {
    job_t *j = user;
    if (err) {
        snprintf(j->why, sizeof j->why, "%s", errstr && errstr[0] ? errstr : svc_err_name(err));
        j->status = internal_error(&j->out, j->why);
    } else {
        int http = 200; /* ops_ask_encode sets it only when it writes an error */
        int rc = ops_ask_encode(&j->s->ask, j->req, ans, &j->out, &http, j->why, sizeof j->why);
        j->status = rc == OPS_EXIT_FAILURE ? internal_error(&j->out, j->why) : http;
    }
    eng_answers_free(ans);
    sch_request_free(j->req);
    j->req = NULL;
    set_ready(j);
}

/* Whether the scheduler's queue is as it was when it refused s->blocked
 * (and that was under a second ago): then a new try would only decode and
 * tokenize it again to be refused again. */
static bool queue_as_refused(const serve_t *s, const eng_sched_stats_t *st, double now) {
    const eng_sched_stats_t *was = &s->refused;
    return s->refused_at > 0 && now - s->refused_at < 1.0 && st->requests == was->requests &&
           st->queued_jobs == was->queued_jobs && st->queued_tokens == was->queued_tokens &&
           st->image_slots_freed == was->image_slots_freed;
}

bool ops_serve_job_submit(serve_t *s) {
    job_t *j = s->blocked;
    if (!j)
        return true;
    eng_sched_stats_t st; /* before the try: a change during it is seen next time */
    eng_sched_stats(s->sched, &st);
    double now = ops_serve_now_s();
    if (queue_as_refused(s, &st, now))
        return false;
    sch_error_t reject;
    sch_error_init(&reject);
    svc_err_t err = eng_sched_submit_as(s->sched, j->req, ENG_SCHED_BULK, engine_done, j, &reject);
    if (err == SVC_ERR_RETRIABLE) {
        sch_error_fini(&reject);
        s->refused = st;
        s->refused_at = now;
        return false;
    }
    s->refused_at = 0;
    s->blocked = NULL;
    /* the contract's answer the engine gave (an image refused: 400; a
     * request too large ever to be queued: 429 or 413), committed, never
     * retried */
    if (reject.code) {
        sch_request_free(j->req);
        j->req = NULL;
        svc_buf_reset(&j->out);
        j->status = sch_error_encode(&reject, &j->out)
                        ? internal_error(&j->out, "cannot write the result")
                        : reject.status;
        sch_error_fini(&reject);
        set_ready(j);
        return true;
    }
    sch_error_fini(&reject);
    if (err) {
        snprintf(j->why, sizeof j->why, "the engine refused the request: %s", svc_err_name(err));
        sch_request_free(j->req);
        j->req = NULL;
        j->status = internal_error(&j->out, j->why);
        set_ready(j);
    }
    return true;
}

/* Leaves msg uncommitted: consumed again after a restart or rebalance (at
 * least once: the consumer never stores an offset past it). Exactly once
 * commits offsets through the transactions instead, so the next commit
 * must not pass it either: it aborts and rewinds (ops_serve_txn.c). */
static void abandon_msg(serve_t *s, cons_msg_t *msg) {
    s->n.abandoned++;
    if (s->o->eos)
        s->txn_failed = true;
    cons_msg_done(s->cons, msg, false);
}

void ops_serve_job_start(serve_t *s, cons_msg_t *msg) {
    job_t *j = calloc(1, sizeof *j);
    if (!j || !request_id(msg, j->rid)) {
        ops_logf(OPS_LOG_ERROR, "out of memory or entropy: message abandoned");
        free(j);
        abandon_msg(s, msg);
        return;
    }
    j->s = s;
    j->msg = msg;
    j->ok = true;
    svc_buf_init(&j->out, SIZE_MAX / 2);
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->n_jobs++;
    decode(s, j);
    if (!j->req) {
        j->ready = true; /* no worker knows it: no lock needed */
        return;
    }
    s->blocked = j;
    (void)ops_serve_job_submit(s);
}

void ops_serve_wait(serve_t *s, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&s->lock);
    if (!s->head || !s->head->ready)
        (void)pthread_cond_timedwait(&s->cond, &s->lock, &ts);
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ delivery */

void ops_serve_job_release(job_t *j) {
    j->released = true;
    if (j->pending > 0)
        return;
    svc_buf_fini(&j->out);
    free(j);
}

/* At-least-once: the message is finished by its last report. Exactly-once:
 * reports only say whether the transaction can commit; the commit finishes
 * the message (ops_serve_txn.c). */
void ops_serve_on_delivery(void *opaque, svc_err_t err, const char *errstr, void *user) {
    job_t   *j = opaque;
    serve_t *s = user;
    if (err) {
        j->ok = false;
        s->n.failed++;
        /* Only a report of the open transaction's records can fail it: one
         * released already belongs to a transaction that has ended. */
        if (s->o->eos && !j->released)
            s->txn_failed = true;
        ops_log_t l;
        if (err != SVC_ERR_TXN_ABORT &&
            job_log(&l, OPS_LOG_WARN,
                    "delivery failed (not committed; the message will be consumed again)", j)) {
            ops_log_str(&l, "error", errstr ? errstr : svc_err_name(err));
            ops_log_end(&l);
        }
    }
    if (--j->pending > 0)
        return;
    if (s->o->eos) {
        if (j->released) /* the transaction ended before this report came */
            ops_serve_job_release(j);
        return;
    }
    if (j->ok) {
        s->n.answered++;
        s->n.by_status[j->status / 100 < 6 ? j->status / 100 : 5]++;
    } else {
        s->n.abandoned++;
    }
    cons_msg_done(s->cons, j->msg, j->ok);
    ops_serve_job_release(j);
}

/* ------------------------------------------------------------ publishing */

/* The original record's headers, for its dead-letter record. */
static rd_kafka_headers_t *copy_headers(const cons_msg_t *msg) {
    size_t n = cons_msg_header_count(msg);
    if (!n)
        return NULL;
    rd_kafka_headers_t *h = rd_kafka_headers_new(n);
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const void *v;
        size_t      len;
        if (cons_msg_header(msg, i, &name, &v, &len))
            rd_kafka_header_add(h, name, -1, v, v ? (ssize_t)len : 0);
    }
    return h;
}

/* Queues the dead-letter record of j; false when it could not be queued. */
static bool send_dlq(serve_t *s, job_t *j) {
    const cons_msg_t   *msg = j->msg;
    size_t              klen = 0, vlen = 0;
    const void         *key = cons_msg_key(msg, &klen);
    const void         *val = cons_msg_value(msg, &vlen);
    rd_kafka_headers_t *h = copy_headers(msg);
    prod_dlq_t          d = {.key = key,
                             .key_len = klen,
                             .value = val,
                             .value_len = vlen,
                             .headers = h,
                             .error_code = "invalid_request",
                             .error_message = j->why,
                             .source_topic = cons_msg_topic(msg),
                             .source_partition = cons_msg_partition(msg),
                             .source_offset = cons_msg_offset(msg)};
    char                errstr[512] = "";
    svc_err_t           err = prod_dlq_send(s->prod, &d, j, errstr, sizeof errstr);
    if (h)
        rd_kafka_headers_destroy(h);
    ops_log_t l;
    if (err && job_log(&l, OPS_LOG_ERROR, "dead-letter record failed", j)) {
        ops_log_str(&l, "error", errstr);
        ops_log_end(&l);
    }
    if (!err)
        s->n.dlq++;
    return !err;
}

/* j->out as Avro (s->answer_id) into avro; false with e2 when answer.avsc
 * cannot carry it. */
static bool avro_value(const serve_t *s, const job_t *j, svc_buf_t *avro, char *e2,
                       size_t e2_size) {
    svc_buf_t bin;
    svc_buf_init(&bin, SIZE_MAX / 2);
    svc_buf_reset(avro);
    bool ok = !sch_avro_answer_from_json(j->out.data, j->out.len, &bin, e2, e2_size) &&
              !sch_frame_write(s->answer_id, bin.data, bin.len, avro);
    svc_buf_fini(&bin);
    return ok;
}

/* The record value: the JSON body, or its Avro form (s->answer_id). A
 * body that answer.avsc cannot carry (a NUL in an option name or a
 * question id: avro-c's map keys are C strings) becomes the 500 its
 * request gets instead: the same bytes would be refused on every retry,
 * so abandoning it would stall its partition. false only when even that
 * cannot be written. */
static bool result_value(serve_t *s, job_t *j, svc_buf_t *avro, const void **value, size_t *len) {
    *value = j->out.data;
    *len = j->out.len;
    if (!s->o->avro)
        return true;
    char e2[512] = "";
    bool ok = avro_value(s, j, avro, e2, sizeof e2);
    if (!ok) {
        ops_log_t l;
        if (job_log(&l, OPS_LOG_ERROR, "the answer cannot be written as Avro: a 500 instead", j)) {
            ops_log_str(&l, "error", e2);
            ops_log_end(&l);
        }
        char m[700];
        snprintf(m, sizeof m, "the answer cannot be written as Avro (answer.avsc): %s", e2);
        j->status = internal_error(&j->out, m);
        ok = j->status > 0 && avro_value(s, j, avro, e2, sizeof e2);
    }
    if (!ok)
        snprintf(j->why, sizeof j->why, "Avro answer: %s", e2);
    *value = avro->data;
    *len = avro->len;
    return ok;
}

/* Bytes a result record needs besides its key and value: the d3-*
 * headers (the source topic's name up to 249 bytes) and librdkafka's
 * framing. */
#define RESULT_HEADROOM 4096

/* A result too large for a record of the results topic (message.max.bytes:
 * an error body can be several times its request, an 8 MB body of unknown
 * keys gives a 40 MB message) would be refused by the producer and its
 * record never committed: at least once replayed everything after it on
 * every restart, exactly once aborted until serve exited. It becomes a 500
 * that says so, which fits. False when even that does not (a tiny
 * message.max.bytes). */
static bool fit_result(serve_t *s, job_t *j, size_t key_len, svc_buf_t *avro, const void **value,
                       size_t *len) {
    size_t max = prod_max_record_bytes(s->prod);
    if (*len + key_len + RESULT_HEADROOM <= max)
        return true;
    char m[256];
    snprintf(m, sizeof m,
             "the result is %zu bytes, more than a record of the results topic may hold "
             "(message.max.bytes %zu)",
             *len, max);
    j->status = internal_error(&j->out, m);
    svc_buf_reset(avro);
    if (j->status < 0 || !result_value(s, j, avro, value, len))
        return false;
    if (*len + key_len + RESULT_HEADROOM <= max)
        return true;
    snprintf(j->why, sizeof j->why, "%s", m);
    return false;
}

/* abandon_msg for a job's record. */
static void abandon(serve_t *s, job_t *j) {
    abandon_msg(s, j->msg);
    j->msg = NULL;
    ops_serve_job_release(j);
}

/* Queues j's records (result, and dead letter when undecodable). */
static void publish(serve_t *s, job_t *j) {
    const char *topic = cons_msg_topic(j->msg);
    int         part = (int)cons_msg_partition(j->msg);
    long long   off = (long long)cons_msg_offset(j->msg);
    ops_log_t   l;
    if (j->status == 0) { /* the registry cannot be asked: stop, nothing committed past it */
        if (job_log(&l, OPS_LOG_ERROR, "stopping: the record cannot be decoded now", j)) {
            ops_log_str(&l, "error", j->why);
            ops_log_end(&l);
        }
        s->fatal = true;
        abandon(s, j);
        return;
    }
    svc_buf_t   avro;
    const void *value;
    size_t      value_len;
    svc_buf_init(&avro, SIZE_MAX / 2);
    size_t      klen = 0;
    const void *key = cons_msg_key(j->msg, &klen);
    if (j->status < 0 || !result_value(s, j, &avro, &value, &value_len) ||
        !fit_result(s, j, klen, &avro, &value, &value_len)) {
        if (job_log(&l, OPS_LOG_ERROR, "abandoned (consumed again later)", j)) {
            ops_log_str(&l, "error", j->why[0] ? j->why : "cannot write the result");
            ops_log_end(&l);
        }
        svc_buf_fini(&avro);
        abandon(s, j);
        return;
    }
    if (s->o->eos && !ops_serve_txn_ensure(s)) {
        svc_buf_fini(&avro);
        abandon(s, j);
        return;
    }
    /* Without --dlq an undecodable record gets its 400 result only. */
    bool dead = j->undecodable && s->o->dlq && *s->o->dlq;
    /* One line per record: the access log (and what the tests follow). */
    if (job_log(&l, OPS_LOG_INFO, "result", j)) {
        ops_log_int(&l, "status", j->status);
        if (j->undecodable) {
            ops_log_str(&l, "dlq", dead ? "true" : "false");
            ops_log_str(&l, "error", j->why);
        }
        ops_log_end(&l);
    }
    j->pending = 1;
    if (dead) {
        j->pending = 2;
        if (!send_dlq(s, j)) {
            j->pending = 1;
            j->ok = false; /* the result still goes out; the message comes back */
            s->txn_failed = s->o->eos;
        }
    }
    prod_result_t r = {.key = key,
                       .key_len = klen,
                       .value = value,
                       .value_len = value_len,
                       .status = j->status,
                       .request_id = j->rid,
                       .model_id = eng_package_model_id(s->ask.pkg),
                       .source_topic = topic,
                       .source_partition = part,
                       .source_offset = off};
    char          errstr[512] = "";
    svc_err_t     err = prod_result_send(s->prod, &r, j, errstr, sizeof errstr);
    svc_buf_fini(&avro);
    if (err) {
        if (job_log(&l, OPS_LOG_ERROR, "result record failed", j)) {
            ops_log_str(&l, "error", errstr);
            ops_log_end(&l);
        }
        if (svc_err_is_fatal(err))
            s->fatal = true;
        j->ok = false;
        s->txn_failed = s->o->eos;
        j->pending--; /* the report it would have had */
    }
    if (s->o->eos) {
        ops_serve_txn_add(s, j);
        return;
    }
    if (j->pending == 0) { /* nothing was queued at all */
        j->pending = 1;
        ops_serve_on_delivery(j, SVC_OK, NULL, s);
    }
}

void ops_serve_publish_ready(serve_t *s) {
    for (;;) {
        job_t *j = s->head;
        if (!j)
            return;
        pthread_mutex_lock(&s->lock);
        bool ready = j->ready;
        pthread_mutex_unlock(&s->lock);
        if (!ready)
            return;
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        s->n_jobs--;
        j->next = NULL;
        /* Its partition went to another member meanwhile: that member
         * answers it (publishing here would duplicate it). */
        if (!cons_msg_current(s->cons, j->msg)) {
            s->n.stale++;
            cons_msg_done(s->cons, j->msg, false);
            ops_serve_job_release(j);
            continue;
        }
        publish(s, j);
    }
}
