/*
 * prod.c -- the producer's lifecycle: configuration, delivery reports,
 * poll/flush, counters and the bounded close.
 */
#include "prod_int.h"

#include <inttypes.h>
#include <time.h>

int64_t prod_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- reports */

/* A failed delivery's class: what the owner should do with that request. */
static svc_err_t delivery_err(prod_t *prod, rd_kafka_resp_err_t err) {
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        return SVC_ERR_TOO_LARGE;
    case RD_KAFKA_RESP_ERR__FATAL:
        return SVC_ERR_FATAL;
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
        /* A transaction purges only when it aborts: the record belongs in
         * the next one. Otherwise only prod_free() purges. */
        return prod->transactional ? SVC_ERR_TXN_ABORT : SVC_ERR_IO;
    default:
        break;
    }
    if (rd_kafka_fatal_error(prod->rk, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return SVC_ERR_FATAL;
    return SVC_ERR_IO;
}

/* librdkafka's dr_msg_cb: runs inside rd_kafka_poll/flush, which only our
 * own calls make, so on the owner's thread (INTRODUCTION.md, "Threads and
 * callbacks").
 * @locality the prod_t's owner thread
 * @locks none */
static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    prod_t     *prod = opaque;
    const char *topic = rd_kafka_topic_name(rkm->rkt);
    bool        is_dlq = prod->dlq_topic && strcmp(topic, prod->dlq_topic) == 0;
    (void)rk;
    if (rkm->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        atomic_fetch_add_explicit(is_dlq ? &prod->n_dlq : &prod->n_produced, 1,
                                  memory_order_relaxed);
        if (prod->on_delivery)
            prod->on_delivery(rkm->_private, SVC_OK, NULL, prod->user);
        return;
    }
    atomic_fetch_add_explicit(&prod->n_failed, 1, memory_order_relaxed);
    if (!prod->on_delivery)
        return;
    /* Not rd_kafka_message_errstr(): for a delivery report that would be
     * the payload, not NUL-terminated. */
    char errstr[512];
    svc_errf(errstr, sizeof errstr, "delivery to \"%s\" [%" PRId32 "] failed: %s (%s)", topic,
             rkm->partition, rd_kafka_err2str(rkm->err), rd_kafka_err2name(rkm->err));
    prod->on_delivery(rkm->_private, delivery_err(prod, rkm->err), errstr, prod->user);
}

/* Client-level errors (brokers down, fatal idempotence errors): logged; the
 * calls that fail because of them return the classified error. */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)opaque;
    fprintf(stderr, "producer: %s: %s%s: %s\n", rd_kafka_name(rk),
            rd_kafka_err2name((rd_kafka_resp_err_t)err),
            err == RD_KAFKA_RESP_ERR__FATAL ? " (fatal)" : "", reason);
}

void prod_drain(prod_t *prod) {
    while (rd_kafka_poll(prod->rk, 0) > 0)
        ;
}

int prod_poll(prod_t *prod, int timeout_ms) {
    return rd_kafka_poll(prod->rk, timeout_ms);
}

svc_err_t prod_flush(prod_t *prod, int timeout_ms) {
    rd_kafka_resp_err_t err = rd_kafka_flush(prod->rk, timeout_ms);
    prod_drain(prod);
    return err == RD_KAFKA_RESP_ERR_NO_ERROR ? SVC_OK : SVC_ERR_RETRIABLE;
}

int prod_in_flight(prod_t *prod) {
    return rd_kafka_outq_len(prod->rk);
}

size_t prod_max_record_bytes(const prod_t *prod) {
    return prod->max_record_bytes;
}

void prod_stats(const prod_t *prod, prod_stats_t *out) {
    /* The counters are only ever added to; a cast-away const read is a
     * plain atomic load. */
    prod_t *p = (prod_t *)prod;
    out->produced = atomic_load_explicit(&p->n_produced, memory_order_relaxed);
    out->dlq = atomic_load_explicit(&p->n_dlq, memory_order_relaxed);
    out->failed = atomic_load_explicit(&p->n_failed, memory_order_relaxed);
    out->queue_waits = atomic_load_explicit(&p->n_queue_waits, memory_order_relaxed);
}

/* ---------------------------------------------------------------- new/free */

/* Properties that would undo "idempotent always": refused in conf->props. */
static const char *const fixed_props[] = {"enable.idempotence", "acks", "request.required.acks",
                                          "transactional.id", NULL};

/* Sets conf->props ("name=value") on kc; librdkafka's errstr is passed on
 * unchanged. */
static bool set_props(rd_kafka_conf_t *kc, const char *const *props, char *errstr,
                      size_t errstr_size) {
    for (; props && *props; props++) {
        const char *eq = strchr(*props, '=');
        if (!eq || eq == *props) {
            svc_errf(errstr, errstr_size, "property \"%s\": expected name=value", *props);
            return false;
        }
        size_t name_len = (size_t)(eq - *props);
        char  *name = strndup(*props, name_len);
        if (!name) {
            svc_errf(errstr, errstr_size, "property \"%s\": out of memory", *props);
            return false;
        }
        for (const char *const *f = fixed_props; *f; f++) {
            if (strcmp(name, *f) == 0) {
                svc_errf(errstr, errstr_size,
                         "property \"%s\" is set by the producer (idempotent, acks=all; "
                         "transactional.id from the transactional_id field)",
                         name);
                free(name);
                return false;
            }
        }
        rd_kafka_conf_res_t res = rd_kafka_conf_set(kc, name, eq + 1, errstr, errstr_size);
        free(name);
        if (res != RD_KAFKA_CONF_OK)
            return false;
    }
    return true;
}

static bool set(rd_kafka_conf_t *kc, const char *name, const char *value, char *errstr,
                size_t errstr_size) {
    return rd_kafka_conf_set(kc, name, value, errstr, errstr_size) == RD_KAFKA_CONF_OK;
}

/* What prod_new can tell without librdkafka. */
static bool conf_check(const prod_conf_t *conf, char *errstr, size_t errstr_size) {
    if (!conf->brokers || !*conf->brokers) {
        svc_errf(errstr, errstr_size, "producer: brokers is required");
        return false;
    }
    if (!conf->results_topic || !*conf->results_topic) {
        svc_errf(errstr, errstr_size, "producer: results_topic is required");
        return false;
    }
    if (conf->dlq_topic && strcmp(conf->dlq_topic, conf->results_topic) == 0) {
        /* Delivery reports tell the two kinds apart by topic. */
        svc_errf(errstr, errstr_size, "producer: dlq_topic \"%s\" is the results topic",
                 conf->dlq_topic);
        return false;
    }
    if (conf->transactional && (!conf->transactional_id || !*conf->transactional_id)) {
        svc_errf(errstr, errstr_size, "producer: transactional needs a transactional_id");
        return false;
    }
    if (conf->content_type && strcmp(conf->content_type, PROD_CONTENT_TYPE_JSON) != 0 &&
        strcmp(conf->content_type, PROD_CONTENT_TYPE_AVRO) != 0) {
        svc_errf(errstr, errstr_size, "producer: content_type \"%s\": expected \"%s\" or \"%s\"",
                 conf->content_type, PROD_CONTENT_TYPE_JSON, PROD_CONTENT_TYPE_AVRO);
        return false;
    }
    return true;
}

static int or_default(int v, int def) {
    return v > 0 ? v : def;
}

prod_t *prod_new(const prod_conf_t *conf, char *errstr, size_t errstr_size) {
    if (!conf_check(conf, errstr, errstr_size))
        return NULL;
    prod_t *prod = calloc(1, sizeof *prod);
    if (!prod) {
        svc_errf(errstr, errstr_size, "producer: out of memory");
        return NULL;
    }
    prod->content_type =
        conf->content_type && strcmp(conf->content_type, PROD_CONTENT_TYPE_AVRO) == 0
            ? PROD_CONTENT_TYPE_AVRO
            : PROD_CONTENT_TYPE_JSON;
    prod->on_delivery = conf->on_delivery;
    prod->user = conf->user;
    prod->queue_wait_ms = or_default(conf->queue_wait_ms, PROD_QUEUE_WAIT_MS_DEFAULT);
    prod->txn_timeout_ms = or_default(conf->txn_timeout_ms, PROD_TXN_TIMEOUT_MS_DEFAULT);
    prod->close_timeout_ms = or_default(conf->close_timeout_ms, PROD_CLOSE_TIMEOUT_MS_DEFAULT);
    prod->transactional = conf->transactional;
    if (conf->dlq_topic && *conf->dlq_topic) {
        prod->dlq_topic = strdup(conf->dlq_topic);
        if (!prod->dlq_topic) {
            svc_errf(errstr, errstr_size, "producer: out of memory");
            free(prod);
            return NULL;
        }
    }

    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    bool             ok = set(kc, "bootstrap.servers", conf->brokers, errstr, errstr_size) &&
              set(kc, "enable.idempotence", "true", errstr, errstr_size) &&
              set(kc, "acks", "all", errstr, errstr_size) &&
              (!conf->transactional ||
               set(kc, "transactional.id", conf->transactional_id, errstr, errstr_size)) &&
              set_props(kc, conf->props, errstr, errstr_size);
    if (!ok) {
        rd_kafka_conf_destroy(kc);
        free(prod->dlq_topic);
        free(prod);
        return NULL;
    }
    rd_kafka_conf_set_dr_msg_cb(kc, on_dr);
    rd_kafka_conf_set_error_cb(kc, on_error);
    rd_kafka_conf_set_opaque(kc, prod);
    char   mmb[32] = "";
    size_t mmb_len = sizeof mmb;
    prod->max_record_bytes =
        rd_kafka_conf_get(kc, "message.max.bytes", mmb, &mmb_len) == RD_KAFKA_CONF_OK
            ? (size_t)strtoull(mmb, NULL, 10)
            : 1000000;
    prod->rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, errstr, errstr_size);
    if (!prod->rk) {
        rd_kafka_conf_destroy(kc); /* still ours when rd_kafka_new fails */
        free(prod->dlq_topic);
        free(prod);
        return NULL;
    }
    prod->rkt_results = rd_kafka_topic_new(prod->rk, conf->results_topic, NULL);
    if (prod->dlq_topic)
        prod->rkt_dlq = rd_kafka_topic_new(prod->rk, prod->dlq_topic, NULL);
    if (!prod->rkt_results || (prod->dlq_topic && !prod->rkt_dlq)) {
        svc_errf(errstr, errstr_size, "producer: topic \"%s\": %s",
                 prod->rkt_results ? prod->dlq_topic : conf->results_topic,
                 rd_kafka_err2str(rd_kafka_last_error()));
        prod_free(prod);
        return NULL;
    }
    if (prod->transactional) {
        rd_kafka_error_t *error = rd_kafka_init_transactions(prod->rk, prod->txn_timeout_ms);
        if (error) {
            svc_errf(errstr, errstr_size, "init_transactions: %s (%s)",
                     rd_kafka_error_string(error), rd_kafka_error_name(error));
            rd_kafka_error_destroy(error);
            prod_free(prod);
            return NULL;
        }
    }
    return prod;
}

size_t prod_free(prod_t *prod) {
    if (!prod)
        return 0;
    uint64_t failed_before = atomic_load_explicit(&prod->n_failed, memory_order_relaxed);
    if (prod->txn_open) {
        /* Never committed: its records must not become visible; abort
         * reports each undelivered one as failed. */
        char      errstr[512];
        svc_err_t err = prod_txn_abort(prod, errstr, sizeof errstr);
        if (err)
            fprintf(stderr, "producer: closing: %s\n", errstr);
    }
    rd_kafka_flush(prod->rk, prod->close_timeout_ms);
    if (rd_kafka_outq_len(prod->rk) > 0) {
        /* Out of time: purge, so every message left still gets its (failed)
         * delivery report before the handle goes. */
        rd_kafka_purge(prod->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        int64_t deadline = prod_now_ms() + 1000;
        while (rd_kafka_outq_len(prod->rk) > 0 && prod_now_ms() < deadline)
            rd_kafka_poll(prod->rk, 50);
    }
    prod_drain(prod);
    int    left = rd_kafka_outq_len(prod->rk);
    size_t undelivered =
        (size_t)(atomic_load_explicit(&prod->n_failed, memory_order_relaxed) - failed_before) +
        (size_t)(left > 0 ? left : 0);
    if (undelivered)
        fprintf(stderr, "producer: closing: %zu messages not delivered\n", undelivered);
    if (prod->rkt_results)
        rd_kafka_topic_destroy(prod->rkt_results);
    if (prod->rkt_dlq)
        rd_kafka_topic_destroy(prod->rkt_dlq);
    rd_kafka_destroy(prod->rk);
    free(prod->dlq_topic);
    free(prod);
    return undelivered;
}
