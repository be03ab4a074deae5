/*
 * cons_group.c -- the consumer handle's life: configuration, subscription,
 * rebalance (cooperative incremental assign/unassign, eager fallback),
 * statistics, close and free (consumer.h).
 *
 * librdkafka calls every callback here from inside rd_kafka_consumer_poll or
 * rd_kafka_consumer_close, i.e. on the poll thread (rd_kafka_poll_set_consumer
 * forwards the main queue to the consumer queue).
 */
#include "cons_int.h"

#include <inttypes.h>
#include <jansson.h>

/* ---------------------------------------------------------------- rebalance */

/* One log line per rebalance step: "assigned t [0 2 5]" (what an operator
 * reads first when a member stalls or duplicates). @locality poll thread */
static void log_parts(const char *what, const rd_kafka_topic_partition_list_t *parts) {
    char   line[1024];
    size_t n = 0;
    for (int i = 0; i < parts->cnt && n < sizeof line - 64; i++) {
        bool same = i > 0 && strcmp(parts->elems[i].topic, parts->elems[i - 1].topic) == 0;
        int  k = same ? snprintf(line + n, sizeof line - n, " %d", (int)parts->elems[i].partition)
                      : snprintf(line + n, sizeof line - n, "%s%s [%d", i ? "] " : "",
                                 parts->elems[i].topic, (int)parts->elems[i].partition);
        n += k > 0 ? (size_t)k : 0;
    }
    fprintf(stderr, "d3stream consumer: %s %s%s\n", what, parts->cnt ? line : "nothing",
            parts->cnt ? "]" : "");
}

/* @locality poll thread (rebalance callback) @locks takes lock */
static void group_assign(cons_t *cons, rd_kafka_topic_partition_list_t *parts, bool coop) {
    atomic_fetch_add(&cons->assigns, 1);
    log_parts("assigned", parts);
    /* Watermarks first, outside the lock: a blocking broker round trip. */
    if (cons->stop_at_end)
        for (int i = 0; i < parts->cnt; i++)
            cons_end_note_assigned(cons, parts->elems[i].topic, parts->elems[i].partition);
    pthread_mutex_lock(&cons->lock);
    svc_err_t err = SVC_OK;
    for (int i = 0; i < parts->cnt && !err; i++) {
        uint64_t gen;
        err = cons_track_assign(cons->ct, parts->elems[i].topic, parts->elems[i].partition, &gen);
    }
    cons->assigned_once = true;
    pthread_mutex_unlock(&cons->lock);
    if (err)
        cons_report(cons, "assign: out of memory while tracking %d partitions", parts->cnt);

    if (coop) {
        rd_kafka_error_t *error = rd_kafka_incremental_assign(cons->rk, parts);
        if (error) {
            cons_report(cons, "incremental assign: %s", rd_kafka_error_string(error));
            rd_kafka_error_destroy(error);
        }
    } else {
        rd_kafka_resp_err_t e = rd_kafka_assign(cons->rk, parts);
        if (e)
            cons_report(cons, "assign: %s", rd_kafka_err2str(e));
    }
    /* A full window stays full across a rebalance: new partitions must not
     * start fetching (KAFKA.md: pause them from the assign callback). */
    if (cons->paused && parts->cnt > 0) {
        rd_kafka_resp_err_t e = rd_kafka_pause_partitions(cons->rk, parts);
        if (e)
            cons_report(cons, "pause newly assigned partitions: %s", rd_kafka_err2str(e));
    }
}

/* The owner finishes or abandons the revoked partitions' work first, while
 * librdkafka still has them assigned, so offsets stored now are committed by
 * the unassign (enable.auto.commit). Whatever finishes later is stale.
 * @locality poll thread (rebalance callback) @locks takes lock */
static void group_revoke(cons_t *cons, rd_kafka_topic_partition_list_t *parts, bool coop) {
    atomic_fetch_add(&cons->revokes, 1);
    log_parts("revoked", parts);
    for (int i = 0; i < parts->cnt; i++) {
        atomic_fetch_add(&cons->revoked_parts, 1);
        if (cons->on_revoke)
            cons->on_revoke(cons->user, parts->elems[i].topic, parts->elems[i].partition);
    }
    pthread_mutex_lock(&cons->lock);
    for (int i = 0; i < parts->cnt; i++) {
        const char *topic = parts->elems[i].topic;
        int32_t     partition = parts->elems[i].partition;
        (void)cons_track_revoke(cons->ct, topic, partition);
        cons_parked_drop(cons, topic, partition);
        for (size_t k = 0; k < cons->n_ends; k++)
            if (cons->ends[k].partition == partition && strcmp(cons->ends[k].topic, topic) == 0)
                cons->ends[k].assigned = false;
    }
    pthread_mutex_unlock(&cons->lock);
    /* librdkafka keeps a partition's pause across unassign: were it revoked
     * while the window is closed and assigned back while it is open, it
     * would never be fetched again (seen as a member stalling after another
     * left). So it leaves resumed. (Resuming a partition that is not paused
     * is what 2.0.2 gets wrong -- it may refetch from an old position --
     * hence only when the window closed it.) */
    if (cons->paused && parts->cnt > 0) {
        rd_kafka_resp_err_t e = rd_kafka_resume_partitions(cons->rk, parts);
        if (e)
            cons_report(cons, "resume revoked partitions: %s", rd_kafka_err2str(e));
    }

    if (coop) {
        rd_kafka_error_t *error = rd_kafka_incremental_unassign(cons->rk, parts);
        if (error) {
            cons_report(cons, "incremental unassign: %s", rd_kafka_error_string(error));
            rd_kafka_error_destroy(error);
        }
    } else {
        rd_kafka_resp_err_t e = rd_kafka_assign(cons->rk, NULL);
        if (e)
            cons_report(cons, "unassign: %s", rd_kafka_err2str(e));
    }
}

/* @locality poll thread */
static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    cons_t     *cons = opaque;
    const char *proto = rd_kafka_rebalance_protocol(rk);
    bool        coop = proto && strcmp(proto, "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        group_assign(cons, parts, coop);
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        group_revoke(cons, parts, coop);
    } else {
        /* Any other error: rdkafka.h asks for rd_kafka_assign(rk, NULL),
         * whatever the protocol, and parts may not say what was held. So
         * everything assigned is revoked (its work finished first), then
         * unassigned. librdkafka 2.0.2 passes no such error that we know of. */
        cons_report(cons, "rebalance: %s; unassigning everything", rd_kafka_err2str(err));
        rd_kafka_topic_partition_list_t *held = NULL;
        if (rd_kafka_assignment(rk, &held) == RD_KAFKA_RESP_ERR_NO_ERROR && held) {
            group_revoke(cons, held, false);
        } else {
            rd_kafka_resp_err_t e = rd_kafka_assign(rk, NULL);
            if (e)
                cons_report(cons, "unassign: %s", rd_kafka_err2str(e));
        }
        if (held)
            rd_kafka_topic_partition_list_destroy(held);
    }
}

/* --------------------------------------------------------------- statistics */

static int64_t json_int(const json_t *obj, const char *key, int64_t dflt) {
    const json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

/* Sums consumer_lag over the partitions this member fetches: librdkafka
 * reports -1 while unknown and lists unassigned partitions too, with
 * fetch_state "none". @locality poll thread */
static int64_t stats_lag(const json_t *topics) {
    int64_t     lag = 0;
    const char *tname;
    json_t     *t;
    json_object_foreach((json_t *)topics, tname, t) {
        const char *pname;
        json_t     *p;
        json_object_foreach(json_object_get(t, "partitions"), pname, p) {
            const char *fs = json_string_value(json_object_get(p, "fetch_state"));
            int64_t     l = json_int(p, "consumer_lag", -1);
            if (json_int(p, "partition", -1) < 0 || l < 0 || !fs || strcmp(fs, "none") == 0 ||
                strcmp(fs, "stopped") == 0)
                continue;
            lag += l;
        }
    }
    return lag;
}

/* @locality poll thread */
static int on_stats(rd_kafka_t *rk, char *json, size_t json_len, void *opaque) {
    (void)rk;
    cons_t      *cons = opaque;
    json_error_t jerr;
    json_t      *root = json_loadb(json, json_len, 0, &jerr);
    if (!root)
        return 0; /* 0: librdkafka frees json */
    const json_t *cgrp = json_object_get(root, "cgrp");
    if (cgrp) {
        atomic_store(&cons->rebalance_cnt, json_int(cgrp, "rebalance_cnt", 0));
        atomic_store(&cons->assignment_size, json_int(cgrp, "assignment_size", 0));
    }
    atomic_store(&cons->lag, stats_lag(json_object_get(root, "topics")));
    atomic_fetch_add(&cons->stats_seen, 1);
    json_decref(root);
    return 0;
}

/* @locality poll thread */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    cons_t *cons = opaque;
    atomic_fetch_add(&cons->errors, 1);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char                fstr[256];
        rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(rk, fstr, sizeof fstr);
        atomic_store(&cons->fatal, true);
        cons_report(cons, "fatal: %s: %s", rd_kafka_err2name(ferr), fstr);
        return;
    }
    cons_report(cons, "%s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

/* ------------------------------------------------------------------ handle */

/* Sets key=value; librdkafka's errstr goes to the caller unchanged. */
static bool conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, char *errstr,
                     size_t errstr_size) {
    return rd_kafka_conf_set(conf, key, value, errstr, errstr_size) == RD_KAFKA_CONF_OK;
}

/* Applies "key=value" strings verbatim (the -X options). */
static bool conf_props(rd_kafka_conf_t *conf, const char *const *props, char *errstr,
                       size_t errstr_size) {
    for (; props && *props; props++) {
        const char *eq = strchr(*props, '=');
        if (!eq || eq == *props) {
            svc_errf(errstr, errstr_size,
                     "consumer property \"%s\": expected key=value (e.g. session.timeout.ms=45000)",
                     *props);
            return false;
        }
        char *key = strndup(*props, (size_t)(eq - *props));
        if (!key) {
            svc_errf(errstr, errstr_size, "consumer property \"%s\": out of memory", *props);
            return false;
        }
        bool ok = conf_set(conf, key, eq + 1, errstr, errstr_size);
        free(key);
        if (!ok)
            return false;
    }
    return true;
}

static rd_kafka_conf_t *conf_build(const cons_conf_t *cc, cons_t *cons, char *errstr,
                                   size_t errstr_size) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char             interval[32];
    snprintf(interval, sizeof interval, "%d",
             cc->stats_interval_ms > 0 ? cc->stats_interval_ms : 5000);
    const char *kv[][2] = {
        {"bootstrap.servers", cc->brokers},
        {"group.id", cc->group},
        {"partition.assignment.strategy", "cooperative-sticky"},
        {"enable.auto.commit", cc->transactional ? "false" : "true"},
        /* Every second instead of librdkafka's 5 s: what a crash or an
         * outage replays is what was delivered since the last commit. */
        {"auto.commit.interval.ms", "1000"},
        {"enable.auto.offset.store", "false"},
        {"auto.offset.reset", cc->from_beginning ? "earliest" : "latest"},
        {"enable.partition.eof", cc->stop_at_end ? "true" : "false"},
        {"statistics.interval.ms", interval},
    };
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof kv / sizeof kv[0]; i++)
        ok = conf_set(conf, kv[i][0], kv[i][1], errstr, errstr_size);
    if (ok && cc->transactional)
        ok = conf_set(conf, "isolation.level", "read_committed", errstr, errstr_size);
    if (ok && cc->group_instance_id && *cc->group_instance_id)
        ok = conf_set(conf, "group.instance.id", cc->group_instance_id, errstr, errstr_size);
    if (ok)
        ok = conf_props(conf, cc->props, errstr, errstr_size);
    char   val[16];
    size_t val_size = sizeof val;
    if (ok &&
        (rd_kafka_conf_get(conf, "enable.auto.offset.store", val, &val_size) != RD_KAFKA_CONF_OK ||
         strcmp(val, "false") != 0)) {
        svc_errf(errstr, errstr_size,
                 "consumer property \"enable.auto.offset.store\" must stay false: offsets are "
                 "stored only once results are delivered");
        ok = false;
    }
    val_size = sizeof val;
    if (ok && cc->transactional &&
        (rd_kafka_conf_get(conf, "enable.auto.commit", val, &val_size) != RD_KAFKA_CONF_OK ||
         strcmp(val, "false") != 0)) {
        svc_errf(errstr, errstr_size,
                 "consumer property \"enable.auto.commit\" must stay false with exactly-once: "
                 "offsets are committed inside the results' transactions");
        ok = false;
    }
    if (!ok) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, cons);
    rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
    rd_kafka_conf_set_stats_cb(conf, on_stats);
    rd_kafka_conf_set_error_cb(conf, on_error);
    return conf;
}

static bool conf_check(const cons_conf_t *cc, char *errstr, size_t errstr_size) {
    if (!cc->brokers || !*cc->brokers || !cc->group || !*cc->group) {
        svc_errf(errstr, errstr_size, "consumer: brokers and group are required");
        return false;
    }
    if (!cc->topics || !cc->topics[0]) {
        svc_errf(errstr, errstr_size, "consumer: at least one topic is required");
        return false;
    }
    if (cc->max_in_flight < 1 || cc->max_in_flight > 10000000) {
        svc_errf(errstr, errstr_size, "consumer: max_in_flight %zu is not in 1..10000000",
                 cc->max_in_flight);
        return false;
    }
    if (cc->low_water > cc->max_in_flight) {
        svc_errf(errstr, errstr_size, "consumer: low_water %zu is above max_in_flight %zu",
                 cc->low_water, cc->max_in_flight);
        return false;
    }
    return true;
}

static svc_err_t subscribe(cons_t *cons, const char *const *topics, char *errstr,
                           size_t errstr_size) {
    size_t n = 0;
    while (topics[n])
        n++;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new((int)n);
    if (!parts) {
        svc_errf(errstr, errstr_size, "consumer: out of memory");
        return SVC_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(parts, topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(cons->rk, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    if (err) {
        svc_errf(errstr, errstr_size, "subscribe to \"%s\"%s: %s", topics[0],
                 n > 1 ? " and others" : "", rd_kafka_err2str(err));
        return SVC_ERR_INVALID;
    }
    return SVC_OK;
}

cons_t *cons_new(const cons_conf_t *cc, char *errstr, size_t errstr_size) {
    if (!conf_check(cc, errstr, errstr_size))
        return NULL;
    cons_t *cons = calloc(1, sizeof *cons);
    if (!cons || !(cons->ct = cons_track_new())) {
        free(cons);
        svc_errf(errstr, errstr_size, "consumer: out of memory");
        return NULL;
    }
    pthread_mutex_init(&cons->lock, NULL);
    cons->max_in_flight = cc->max_in_flight;
    cons->max_bytes = cc->max_bytes;
    cons->low_water = cc->low_water ? cc->low_water : cc->max_in_flight - cc->max_in_flight / 4;
    cons->stop_at_end = cc->stop_at_end;
    cons->transactional = cc->transactional;
    cons->on_revoke = cc->on_revoke;
    cons->user = cc->user;
    rd_kafka_conf_t *conf = conf_build(cc, cons, errstr, errstr_size);
    if (!conf) {
        cons->closed = true;
        cons_free(cons);
        return NULL;
    }
    cons->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, errstr_size);
    if (!cons->rk) {
        rd_kafka_conf_destroy(conf); /* still ours when rd_kafka_new fails */
        cons->closed = true;
        cons_free(cons);
        return NULL;
    }
    rd_kafka_poll_set_consumer(cons->rk);
    if (subscribe(cons, cc->topics, errstr, errstr_size) != SVC_OK) {
        cons_free(cons);
        return NULL;
    }
    return cons;
}

rd_kafka_consumer_group_metadata_t *cons_group_metadata(cons_t *cons) {
    return rd_kafka_consumer_group_metadata(cons->rk);
}

/* The offsets a rewind seeks to: the committed one, else the first offset
 * handed out in this assignment (the position auto.offset.reset chose),
 * else none (-1: nothing was handed out; the position stays). Then new
 * generations for every assigned partition, under the lock: whatever was
 * handed out before is stale from now on. */
static void rewind_regen(cons_t *cons, rd_kafka_topic_partition_list_t *parts) {
    pthread_mutex_lock(&cons->lock);
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *p = &parts->elems[i];
        uint64_t                    gen;
        int64_t                     first = cons_track_first(cons->ct, p->topic, p->partition);
        if (p->offset < 0)
            p->offset = first >= 0 ? first : -1;
        if (p->offset < 0)
            continue;
        (void)cons_track_revoke(cons->ct, p->topic, p->partition);
        cons_parked_drop(cons, p->topic, p->partition);
        cons_end_rewound(cons, p->topic, p->partition, p->offset);
        if (cons_track_assign(cons->ct, p->topic, p->partition, &gen))
            cons_report(cons, "rewind: out of memory while tracking %s [%d]", p->topic,
                        (int)p->partition);
    }
    pthread_mutex_unlock(&cons->lock);
}

/* Seeks every partition with an offset >= 0. */
static svc_err_t rewind_seek(cons_t *cons, const rd_kafka_topic_partition_list_t *parts,
                             int timeout_ms) {
    svc_err_t rc = SVC_OK;
    for (int i = 0; i < parts->cnt && !rc; i++) {
        const rd_kafka_topic_partition_t *p = &parts->elems[i];
        if (p->offset < 0)
            continue;
        rd_kafka_topic_t   *rkt = rd_kafka_topic_new(cons->rk, p->topic, NULL);
        rd_kafka_resp_err_t err =
            rkt ? rd_kafka_seek(rkt, p->partition, p->offset, timeout_ms) : RD_KAFKA_RESP_ERR__FAIL;
        if (rkt)
            rd_kafka_topic_destroy(rkt);
        if (err) {
            cons_report(cons, "rewind: seek %s [%d] to %lld: %s", p->topic, (int)p->partition,
                        (long long)p->offset, rd_kafka_err2str(err));
            rc = SVC_ERR_IO;
        }
    }
    return rc;
}

svc_err_t cons_rewind(cons_t *cons, int timeout_ms) {
    rd_kafka_topic_partition_list_t *parts = NULL;
    rd_kafka_resp_err_t              err = rd_kafka_assignment(cons->rk, &parts);
    if (!err)
        err = rd_kafka_committed(cons->rk, parts, timeout_ms);
    for (int i = 0; !err && i < parts->cnt; i++)
        err = parts->elems[i].err;
    if (err) {
        cons_report(cons, "rewind: committed offsets: %s", rd_kafka_err2str(err));
        if (parts)
            rd_kafka_topic_partition_list_destroy(parts);
        return SVC_ERR_IO;
    }
    rewind_regen(cons, parts);
    svc_err_t rc = rewind_seek(cons, parts, timeout_ms);
    rd_kafka_topic_partition_list_destroy(parts);
    return rc;
}

svc_err_t cons_close(cons_t *cons) {
    if (cons->closed)
        return SVC_OK;
    cons->closed = true;
    svc_err_t rc = SVC_OK;
    pthread_mutex_lock(&cons->lock);
    bool assigned = cons->assigned_once;
    pthread_mutex_unlock(&cons->lock);
    if (assigned && !cons->transactional) {
        /* Synchronous, so what is stored now is committed before we leave;
         * the revoke inside rd_kafka_consumer_close commits what on_revoke
         * finishes after this. NO_OFFSET: nothing new to commit. */
        rd_kafka_resp_err_t err = rd_kafka_commit(cons->rk, NULL, 0);
        if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            cons_report(cons, "commit on close: %s", rd_kafka_err2str(err));
            rc = SVC_ERR_IO;
        }
    }
    rd_kafka_resp_err_t err = rd_kafka_consumer_close(cons->rk);
    if (err) {
        cons_report(cons, "close: %s", rd_kafka_err2str(err));
        rc = SVC_ERR_IO;
    }
    return rc;
}

void cons_free(cons_t *cons) {
    if (!cons)
        return;
    if (cons->rk) {
        if (!cons->closed && cons_close(cons) != SVC_OK)
            fprintf(stderr, "d3stream consumer: close in free: %s\n", cons->err);
        pthread_mutex_lock(&cons->lock);
        for (size_t i = 0; i < cons->n_parked; i++)
            rd_kafka_message_destroy(cons->parked[i]);
        cons->n_parked = 0;
        cons->bytes_parked = 0;
        pthread_mutex_unlock(&cons->lock);
        rd_kafka_destroy(cons->rk);
    }
    for (size_t i = 0; i < cons->n_ends; i++)
        free(cons->ends[i].topic);
    free(cons->ends);
    free(cons->parked);
    cons_track_free(cons->ct);
    pthread_mutex_destroy(&cons->lock);
    free(cons);
}

void cons_stats(const cons_t *cons, cons_stats_t *out) {
    cons_t *c = (cons_t *)cons; /* atomic loads only */
    *out = (cons_stats_t){
        .lag = atomic_load(&c->lag),
        .rebalance_cnt = atomic_load(&c->rebalance_cnt),
        .assignment_size = atomic_load(&c->assignment_size),
        .stats_seen = atomic_load(&c->stats_seen),
        .in_flight = atomic_load(&c->in_flight_now),
        .in_flight_max = atomic_load(&c->in_flight_max),
        .bytes = atomic_load(&c->bytes_now),
        .messages = atomic_load(&c->messages),
        .stored = atomic_load(&c->stored),
        .stale = atomic_load(&c->stale),
        .pauses = atomic_load(&c->pauses),
        .resumes = atomic_load(&c->resumes),
        .assigns = atomic_load(&c->assigns),
        .revokes = atomic_load(&c->revokes),
        .revoked_parts = atomic_load(&c->revoked_parts),
        .errors = atomic_load(&c->errors),
    };
}

const char *cons_strerror(const cons_t *cons) {
    return cons->err;
}
