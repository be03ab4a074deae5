/*
 * cons_int.h -- what cons.c (messages, window, offsets) and cons_group.c
 * (handle, rebalance, statistics, close) share. Internal to consumer/.
 */
#ifndef D3STREAM_CONS_INT_H
#define D3STREAM_CONS_INT_H

#include "consumer.h"
#include "cons_track.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>

#define WATERMARK_TIMEOUT_MS 10000

/* The high watermark a partition had when first assigned (stop_at_end). */
typedef struct end_ent {
    char   *topic;
    int32_t partition;
    int64_t end;
    bool    reached;  /* a message at end - 1 or a partition EOF was seen */
    bool    assigned; /* currently in the assignment */
} end_ent_t;

struct cons_msg {
    rd_kafka_message_t *rkm;
    uint64_t            gen; /* tracker generation; 0: untracked duplicate */
    rd_kafka_headers_t *hdrs;
};

struct cons {
    rd_kafka_t     *rk;
    pthread_mutex_t lock;
    /* @locks lock */
    cons_track_t        *ct;
    size_t               in_flight; /* handed out, not done (includes orphans) */
    rd_kafka_message_t **parked;    /* polled while the window was full */
    size_t               n_parked, cap_parked;
    end_ent_t           *ends;
    size_t               n_ends, cap_ends;
    bool                 assigned_once;
    char                 err[512];
    /* Fixed after cons_new. */
    size_t          max_in_flight, low_water;
    size_t          max_bytes;                     /* 0: no bound */
    size_t          bytes_in_flight, bytes_parked; /* under lock */
    _Atomic int64_t bytes_now;                     /* their sum, for cons_stats */
    bool            stop_at_end;
    bool            transactional;
    cons_revoke_cb *on_revoke;
    void           *user;
    /* @locality poll thread */
    bool paused, closed;
    /* Counters (cons_stats_t). */
    atomic_bool     fatal;
    _Atomic int64_t lag, rebalance_cnt, assignment_size, stats_seen, in_flight_now, in_flight_max,
        messages, stored, stale, pauses, resumes, assigns, revokes, revoked_parts, errors;
};

/* Remembers an error for cons_strerror() and says it on stderr.
 * @locality any thread @locks takes lock (MUST NOT be held) */
SVC_FMT(2, 3) void cons_report(cons_t *cons, const char *fmt, ...);

/* Notes a newly assigned partition's end offset (first assignment only;
 * assigned again, the end must be reached again).
 * @locality poll thread @locks takes lock */
void cons_end_note_assigned(cons_t *cons, const char *topic, int32_t partition);
/* A rewind seeks the partition back to next: its end is reached only if
 * next is at it. @locks lock MUST be held */
void cons_end_rewound(cons_t *cons, const char *topic, int32_t partition, int64_t next);

/* Drops parked messages of a revoked partition. @locks lock MUST be held */
void cons_parked_drop(cons_t *cons, const char *topic, int32_t partition);

/* Pauses/resumes the assignment by the window. @locality poll thread */
void cons_window_update(cons_t *cons);

#endif
